/* job_spec.h - a CephaloJob's spec, read once into a typed struct (crds/cephalojobs.cephalo.dev.yaml,
 * docs/operator.md).
 *
 * The reconcile reads the job's spec from here, never from its JSON: every field is checked and
 * every default applied in one place. The defaults of the worker's training options (steps, seed,
 * precision, the optimizer, data, checkpoint retention, resume) are common/worker_cmd.h's table,
 * wcmd_defaults, the same as `cephalo run`'s and the worker's own; the operator's own fields
 * (metricsPort, commTimeout, backoffLimit, ...) have their JOB_SPEC_* constants below, which are
 * the CRD's `default:` values. The API server applies the CRD's defaults and ranges before the
 * operator sees a job; the checks here hold for a job that did not go through them (an older CRD,
 * a test) and name the field as the CRD does: "spec.optimizer.lr: expected a number in [0, 10],
 * got 20".
 *
 *   job_spec s;
 *   if (job_spec_parse(cJSON_GetObjectItem(job, "spec"), &s, &err) < 0) ...   // Failed, InvalidSpec
 *   wcmd_argv a = {0};
 *   job_spec_worker_argv(&s, &a);       // what every worker pod runs: "train" "--steps" ...
 *   wcmd_argv_free(&a);
 *
 * A job_spec borrows strings and objects from the cJSON it was read from, which must outlive it. */
#ifndef CEPHALO_JOB_SPEC_H
#define CEPHALO_JOB_SPEC_H

#include <stdbool.h>

#include <cjson/cJSON.h>

#include "common/env.h"
#include "common/err.h"
#include "common/worker_cmd.h"
#include "operator/model_source.h"
#include "planner/inputs.h"
#include "planner/plan.h"

/* The operator's defaults (the CRD's `default:` values for the fields the worker is not told as
 * options). */
#define JOB_SPEC_MEM_CAP INPUTS_MEM_CAP /* spec.memCap: the planner's usable fraction of each GPU */
#define JOB_SPEC_STRATEGY "cephalo"    /* spec.strategy */
#define JOB_SPEC_PRIORITY 0            /* spec.priority */
#define JOB_SPEC_MIN_REPLAN_S 300      /* spec.elastic.minReplanSeconds */
#define JOB_SPEC_COMM_TIMEOUT_S ENV_COMM_TIMEOUT_S /* spec.commTimeout: the workers' CEPHALO_COMM_TIMEOUT */
#define JOB_SPEC_BACKOFF_LIMIT 3       /* spec.backoffLimit: gang restarts before Failed */
#define JOB_SPEC_GRACE_S 120           /* spec.terminationGracePeriodSeconds */
#define JOB_SPEC_METRICS_PORT 9400     /* spec.metricsPort; 0: off */

/* Where the worker pods mount the job's volumes: the arguments name files under them. */
#define JOB_SPEC_DATA_MOUNT "/data"        /* spec.data.pvc, read-only */
#define JOB_SPEC_CKPT_MOUNT "/checkpoints" /* spec.checkpoint.pvc */
/* the Hugging Face directory of spec.model.initFrom: MSRC_MOUNT (model_source.h) */

typedef enum {
    JOB_MODEL_NONE,      /* none given: an error */
    JOB_MODEL_NAME,      /* spec.model.name: a built-in model */
    JOB_MODEL_INLINE,    /* spec.model.inline: a model file as JSON */
    JOB_MODEL_INIT_FROM, /* spec.model.initFrom: a Hugging Face directory on a volume */
} job_model_kind;

typedef struct job_spec {
    /* the model */
    job_model_kind model;
    const char *model_name;    /* JOB_MODEL_NAME */
    const cJSON *model_inline; /* JOB_MODEL_INLINE */
    msrc init;                 /* JOB_MODEL_INIT_FROM (model_source.h) */
    char model_label[96];      /* what the MODEL column shows (status.model): the built-in name, an
                                * inline model's name, base or shape, or the initFrom directory's */

    /* planning */
    long global_batch;
    long seq_len; /* 0: the model's */
    double mem_cap;
    strategy strat;
    recompute_policy recompute; /* spec.recompute: auto (the planner's choice per rank), none or full */
    const char *profile_cm; /* spec.profileConfigMap, or NULL */

    /* which GPUs (inventory.h's constraints) and the queue */
    const cJSON *allowed_products; /* spec.gpus.allowedProducts (array of strings), or NULL */
    const cJSON *node_selector;    /* spec.gpus.nodeSelector (object of strings), or NULL */
    const cJSON *tolerations;      /* spec.tolerations (array of objects), or NULL */
    const cJSON *pod_template;     /* spec.template (checked: pod_template.h), or NULL */
    long min_gpus, max_gpus;       /* 0: not given */
    long priority;
    long min_replan_s;

    /* the workers' training options. The paths in it (data, val_data, init_from, ckpt_dir) are
     * left NULL: they depend on the volumes, job_spec_worker_argv fills them in */
    wcmd_train train;
    const char *data_path; /* spec.data.path: relative to JOB_SPEC_DATA_MOUNT with data_pvc */
    const char *data_pvc;  /* or NULL */
    const char *val_path;  /* spec.data.validation.path, or NULL */
    bool checkpoint;       /* spec.checkpoint is given */
    const char *ckpt_dir;  /* relative to JOB_SPEC_CKPT_MOUNT with ckpt_pvc */
    const char *ckpt_pvc;  /* or NULL */

    /* the pods */
    const char *image;       /* spec.image, or NULL: the operator's --worker-image */
    const char *pull_policy; /* spec.imagePullPolicy, or NULL: the operator's */
    long metrics_port;
    double comm_timeout_s;
    long backoff_limit;
    long grace_s;
    bool suspend;
} job_spec;

/* Reads spec (a CephaloJob's `spec` object). Every field is set: the value given, else its
 * default, also when another field is wrong (so that spec.suspend and the queue's fields of a job
 * with a mistake still hold). 0, or -1 with err naming the first wrong field. */
int job_spec_parse(const cJSON *spec, job_spec *out, err_t *err);

/* The arguments of every worker pod of the job (the rank is the pod's environment, RANK): the
 * training options through common/worker_cmd.h's builder, with the paths inside the pod (data
 * under JOB_SPEC_DATA_MOUNT with spec.data.pvc, checkpoints under JOB_SPEC_CKPT_MOUNT with
 * spec.checkpoint.pvc, spec.model.initFrom's directory under MSRC_MOUNT). Appended to *out. */
void job_spec_worker_argv(const job_spec *s, recompute_mode rank_recompute, wcmd_argv *out);

#endif
