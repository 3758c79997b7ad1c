/* model_source.h - a CephaloJob that fine-tunes a Hugging Face model directory
 * (spec.model.initFrom; docs/operator.md, "Fine-tuning a Hugging Face model").
 *
 * The directory (config.json + safetensors) lives on a volume that only the worker pods mount:
 * the operator never reads it. So the job names two things: where the directory is (one volume
 * source and a path inside it), which every worker pod mounts read-only at MSRC_MOUNT and gets as
 * `--init-from` (dir); and the directory's config.json for planning (inline, or a ConfigMap the
 * operator reads once per plan), parsed by the planner's Hugging Face reader (model_hf.c). The
 * worker checks that the directory's own config.json describes the planned model.
 *
 *   msrc s;
 *   int have = msrc_parse(spec_model, &s, &err);     1: initFrom, 0: none, -1: err names the field
 *   msrc_model(k, ns, &s, &model, &err);             when planning
 *   msrc_pod(&s, volumes, volumeMounts);             in every worker pod (its `--init-from s.dir`:
 *                                                    job_spec_worker_argv, job_spec.h) */
#ifndef CEPHALO_MODEL_SOURCE_H
#define CEPHALO_MODEL_SOURCE_H

#include <cjson/cJSON.h>

#include "common/err.h"
#include "operator/client/kube.h"
#include "planner/model.h"

#define MSRC_MOUNT "/cephalo/init" /* where the worker pods mount the volume */
#define MSRC_VOLUME "init-from"    /* the pod volume's name */
#define MSRC_CONFIG_KEY "config.json" /* the ConfigMap key read when configMap.key is not given */

typedef struct msrc {
    const char *kind;      /* the volume source's key: persistentVolumeClaim, hostPath or nfs */
    const cJSON *source;   /* its object, as the job gives it (borrowed from the job) */
    const char *claim;     /* persistentVolumeClaim's claimName, else NULL (borrowed) */
    char dir[4200];        /* the worker's --init-from: MSRC_MOUNT or MSRC_MOUNT/path */
    char name[64];         /* the model's name: the path's last component, else "hf-model" */
    const cJSON *config;   /* config.json inline, or NULL */
    const char *cm_name;   /* else the ConfigMap holding it (in the job's namespace) */
    const char *cm_key;    /* and its key */
} msrc;

/* Reads and checks spec.model.initFrom (spec_model: the job's spec.model). 1 with *out filled
 * (borrowing from spec_model), 0 when there is no initFrom, -1 with err naming the field. Reads
 * nothing but the job. */
int msrc_parse(const cJSON *spec_model, msrc *out, err_t *err);

/* The model to plan: config.json parsed from config, or read from the ConfigMap in namespace ns
 * (one GET). 0; -1 with err naming the field (the job's problem: a missing ConfigMap or key, a
 * config.json Cephalo cannot train); -2 with err set on an API error. */
int msrc_model(kube_client *k, const char *ns, const msrc *s, model_spec *m, err_t *err);

/* Adds to a worker pod the volume (PVC and NFS sources forced read-only) and its read-only mount
 * at MSRC_MOUNT; the worker's `--init-from` is s->dir (job_spec_worker_argv). */
void msrc_pod(const msrc *s, cJSON *volumes, cJSON *mounts);

#endif
