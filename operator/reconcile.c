/* reconcile.c - one CephaloJob reconciled (reconcile.h). */
#include "reconcile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "inputs.h"
#include "inventory.h"
#include "json_util.h"
#include "log.h"
#include "model.h"
#include "plan.h"

static const cJSON *get(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }
static const char *get_str(const cJSON *o, const char *k, const char *def) {
    const cJSON *v = get(o, k);
    return cJSON_IsString(v) ? v->valuestring : def;
}
static double get_num(const cJSON *o, const char *k, double def) {
    const cJSON *v = get(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : def;
}

/* ---- planning ------------------------------------------------------------------------------ */

typedef struct plan_out {
    char *json; /* plan.json text */
    bool estimated;
    char notes[1024];
    const char *reason; /* on failure: the condition reason */
} plan_out;

static int resolve_model(const cJSON *spec_model, model_spec *m, err_t *err) {
    const cJSON *inl = get(spec_model, "inline");
    if (cJSON_IsObject(inl)) {
        char *text = cJSON_PrintUnformatted(inl);
        if (!text) return err_set(err, "out of memory");
        int rc = model_load_string("spec.model.inline", text, strlen(text), m, err);
        free(text);
        return rc;
    }
    const char *name = get_str(spec_model, "name", NULL);
    if (!name) return err_set(err, "spec.model: give name or inline");
    /* built-in names only: a name must never read a file on the operator's filesystem */
    int n;
    const model_spec *b = model_builtins(&n);
    for (int i = 0; i < n; i++)
        if (strcmp(b[i].name, name) == 0) return model_resolve(name, m, err);
    return model_unknown(name, err);
}

/* 0 with out->json, or -1 with out->reason and err set (the job's problem, not the API's);
 * -2 with err set when the Nodes could not be listed. */
static int make_plan(kube_client *k, const cJSON *spec, plan_out *out, err_t *err) {
    plan_inputs in = {0};
    memset(out, 0, sizeof *out);
    out->reason = "InvalidSpec";
    if (resolve_model(get(spec, "model"), &in.model, err) < 0) return err_prefix(err, "model");
    const char *sname = get_str(spec, "strategy", "cephalo");
    strategy strat;
    if (strategy_parse(sname, &strat, err) < 0) return -1;

    cJSON *nodes = NULL;
    long status = 0;
    if (kube_get(k, "/api/v1/nodes", &nodes, &status, err) < 0) return -2;
    const cJSON *gpus = get(spec, "gpus");
    inv_constraints c = {.allowed_products = get(gpus, "allowedProducts"),
                         .max_gpus = (int)get_num(gpus, "maxGPUs", 0),
                         .node_selector = get(gpus, "nodeSelector")};
    inv_result inv;
    int rc = inv_build(get(nodes, "items"), &c, &in.cl, &inv, err);
    cJSON_Delete(nodes);
    if (rc < 0) {
        out->reason = "NoGPUs";
        return -1;
    }
    out->estimated = inv.estimated;
    snprintf(out->notes, sizeof out->notes, "%s", inv.notes);
    inputs_opts o = {.batch = (long)get_num(spec, "globalBatch", 0),
                     .seq = (long)get_num(spec, "seqLen", 0),
                     .bf16 = strcmp(get_str(spec, "precision", "fp32"), "bf16") == 0,
                     .mem_cap = get_num(spec, "memCap", 0.8)};
    if (o.batch < in.cl.n_devices) {
        err_set(err, "globalBatch %ld is less than the %d usable GPUs (every GPU needs a sample; "
                     "lower gpus.maxGPUs or raise globalBatch)", o.batch, in.cl.n_devices);
        inputs_free(&in);
        return -1;
    }
    if (inputs_build(&in, &o, err) < 0) {
        inputs_free(&in);
        return -1;
    }
    plan p;
    if (plan_make(&in.cm, strat, &p, err) < 0) {
        out->reason = "PlanError";
        inputs_free(&in);
        return -1;
    }
    if (!p.feasible) {
        out->reason = "Infeasible";
        err_set(err, "no feasible %s plan on %d GPUs: %s", sname, in.cl.n_devices, p.reason);
        plan_free(&p);
        inputs_free(&in);
        return -1;
    }
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    rc = f ? plan_write_json(&p, f, err) : err_set(err, "out of memory");
    if (f) fclose(f);
    plan_free(&p);
    inputs_free(&in);
    if (rc < 0) {
        free(buf);
        out->reason = "PlanError";
        return -1;
    }
    out->json = buf;
    return 0;
}

/* ---- objects ------------------------------------------------------------------------------- */

static cJSON *owner_refs(const cJSON *job) {
    cJSON *arr = cJSON_CreateArray(), *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "apiVersion", REC_API_VERSION);
    cJSON_AddStringToObject(o, "kind", "CephaloJob");
    cJSON_AddStringToObject(o, "name", kube_meta_str(job, "name"));
    cJSON_AddStringToObject(o, "uid", kube_meta_str(job, "uid") ? kube_meta_str(job, "uid") : "");
    cJSON_AddBoolToObject(o, "controller", true);
    cJSON_AddBoolToObject(o, "blockOwnerDeletion", true);
    cJSON_AddItemToArray(arr, o);
    return arr;
}

static cJSON *meta(const cJSON *job, const char *name, int rank) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "name", name);
    cJSON_AddStringToObject(m, "namespace", kube_meta_str(job, "namespace"));
    cJSON *l = cJSON_AddObjectToObject(m, "labels");
    cJSON_AddStringToObject(l, "app.kubernetes.io/name", "cephalo");
    cJSON_AddStringToObject(l, "app.kubernetes.io/managed-by", REC_COMPONENT);
    cJSON_AddStringToObject(l, REC_LABEL_JOB, kube_meta_str(job, "name"));
    if (rank >= 0) {
        char r[16];
        snprintf(r, sizeof r, "%d", rank);
        cJSON_AddStringToObject(l, REC_LABEL_RANK, r);
        cJSON_AddStringToObject(l, REC_LABEL_COMPONENT, "worker");
    }
    cJSON_AddItemToObject(m, "ownerReferences", owner_refs(job));
    return m;
}

/* Creates obj in the collection unless it exists (409 AlreadyExists is success). */
static int ensure(kube_client *k, const char *collection, cJSON *obj, bool *created, err_t *err) {
    long status = 0;
    if (created) *created = false;
    int rc = kube_create(k, collection, obj, NULL, &status, err);
    cJSON_Delete(obj);
    if (rc == 0) {
        if (created) *created = true;
        return 0;
    }
    return status == 409 ? 0 : -1;
}

/* Creates the plan ConfigMap, or merge-patches the one of an older generation (the chart's RBAC
 * grants configmaps patch, not update). */
static int write_configmap(kube_client *k, const cJSON *job, const cJSON *old, const char *name,
                           const char *plan_json, const char *notes, err_t *err) {
    char path[KUBE_PATH_MAX], gen[32];
    const char *ns = kube_meta_str(job, "namespace");
    snprintf(gen, sizeof gen, "%.0f", get_num(get(job, "metadata"), "generation", 0));
    cJSON *cm = cJSON_CreateObject();
    cJSON *m = old ? cJSON_AddObjectToObject(cm, "metadata") : meta(job, name, -1);
    cJSON *ann = cJSON_AddObjectToObject(m, "annotations");
    cJSON_AddStringToObject(ann, REC_ANN_GENERATION, gen);
    if (notes && *notes) cJSON_AddStringToObject(ann, REC_ANN_NOTES, notes);
    else if (old) cJSON_AddNullToObject(ann, REC_ANN_NOTES);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(cm, "data"), "plan.json", plan_json);
    long status = 0;
    int rc;
    if (old) {
        if (kube_path(path, sizeof path, "v1", ns, "configmaps", name, err) < 0) return cJSON_Delete(cm), -1;
        rc = kube_merge_patch(k, path, cm, NULL, &status, err);
    } else {
        cJSON_AddStringToObject(cm, "apiVersion", "v1");
        cJSON_AddStringToObject(cm, "kind", "ConfigMap");
        cJSON_AddItemToObject(cm, "metadata", m);
        if (kube_path(path, sizeof path, "v1", ns, "configmaps", NULL, err) < 0) return cJSON_Delete(cm), -1;
        rc = kube_create(k, path, cm, NULL, &status, err);
    }
    cJSON_Delete(cm);
    return rc;
}

static int ensure_service(kube_client *k, const cJSON *job, long metrics_port, err_t *err) {
    const char *ns = kube_meta_str(job, "namespace"), *name = kube_meta_str(job, "name");
    cJSON *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "apiVersion", "v1");
    cJSON_AddStringToObject(s, "kind", "Service");
    cJSON *m = meta(job, name, -1);
    cJSON_AddStringToObject(cJSON_GetObjectItem(m, "labels"), REC_LABEL_COMPONENT, "worker");
    cJSON_AddItemToObject(s, "metadata", m);
    cJSON *sp = cJSON_AddObjectToObject(s, "spec");
    cJSON_AddStringToObject(sp, "clusterIP", "None");
    cJSON_AddBoolToObject(sp, "publishNotReadyAddresses", true);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(sp, "selector"), REC_LABEL_JOB, name);
    cJSON *ports = cJSON_AddArrayToObject(sp, "ports");
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "name", "rendezvous");
    cJSON_AddNumberToObject(p, "port", REC_MASTER_PORT);
    cJSON_AddItemToArray(ports, p);
    if (metrics_port > 0) {
        p = cJSON_CreateObject();
        cJSON_AddStringToObject(p, "name", "metrics");
        cJSON_AddNumberToObject(p, "port", (double)metrics_port);
        cJSON_AddItemToArray(ports, p);
    }
    char path[KUBE_PATH_MAX];
    if (kube_path(path, sizeof path, "v1", ns, "services", NULL, err) < 0) return cJSON_Delete(s), -1;
    return ensure(k, path, s, NULL, err);
}

static void env(cJSON *arr, const char *name, const char *value) {
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "name", name);
    cJSON_AddStringToObject(e, "value", value);
    cJSON_AddItemToArray(arr, e);
}

/* A flag and its number: integers as such, others in the fewest digits that read back exactly. */
static void arg(cJSON *args, const char *flag, const char *fmt, double v) {
    char b[64];
    snprintf(b, sizeof b, fmt, v);
    if (strcmp(fmt, "%.0f") != 0)
        for (int prec = 6; prec <= 17; prec++) {
            snprintf(b, sizeof b, "%.*g", prec, v);
            if (strtod(b, NULL) == v) break;
        }
    cJSON_AddItemToArray(args, cJSON_CreateString(flag));
    cJSON_AddItemToArray(args, cJSON_CreateString(b));
}

static void volume(cJSON *vols, cJSON *mounts, const char *name, const char *mount, bool ro,
                   cJSON *source_key_val, const char *source_key) {
    cJSON *v = cJSON_CreateObject();
    cJSON_AddStringToObject(v, "name", name);
    cJSON_AddItemToObject(v, source_key, source_key_val);
    cJSON_AddItemToArray(vols, v);
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "name", name);
    cJSON_AddStringToObject(m, "mountPath", mount);
    cJSON_AddBoolToObject(m, "readOnly", ro);
    cJSON_AddItemToArray(mounts, m);
}

static cJSON *pod_object(const rec_config *c, const cJSON *job, int rank, int world,
                         const char *node, const char *cm_name) {
    const cJSON *spec = get(job, "spec");
    const char *ns = kube_meta_str(job, "namespace"), *name = kube_meta_str(job, "name");
    char pod[128], buf[512];
    snprintf(pod, sizeof pod, "%s-%d", name, rank);
    long metrics_port = (long)get_num(spec, "metricsPort", 9400);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "apiVersion", "v1");
    cJSON_AddStringToObject(o, "kind", "Pod");
    cJSON_AddItemToObject(o, "metadata", meta(job, pod, rank));
    cJSON *ps = cJSON_AddObjectToObject(o, "spec");
    cJSON_AddStringToObject(ps, "nodeName", node);
    snprintf(buf, sizeof buf, "%s-%d", name, rank);
    cJSON_AddStringToObject(ps, "hostname", buf);
    cJSON_AddStringToObject(ps, "subdomain", name);
    cJSON_AddStringToObject(ps, "restartPolicy", "Never");
    const cJSON *tol = get(spec, "tolerations");
    if (cJSON_IsArray(tol)) cJSON_AddItemToObject(ps, "tolerations", cJSON_Duplicate(tol, true));
    cJSON *ctr = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(ps, "containers"), ctr);
    cJSON_AddStringToObject(ctr, "name", "worker");
    cJSON_AddStringToObject(ctr, "image", get_str(spec, "image", c->worker_image));
    const char *pull = get_str(spec, "imagePullPolicy", c->worker_pull_policy);
    if (pull && *pull) cJSON_AddStringToObject(ctr, "imagePullPolicy", pull);

    /* the training options travel as arguments (cephalo-worker train --help) */
    cJSON *args = cJSON_AddArrayToObject(ctr, "args");
    cJSON_AddItemToArray(args, cJSON_CreateString("train"));
    arg(args, "--steps", "%.0f", get_num(spec, "steps", 1));
    arg(args, "--seed", "%.0f", get_num(spec, "seed", 1));
    cJSON_AddItemToArray(args, cJSON_CreateString("--precision"));
    cJSON_AddItemToArray(args, cJSON_CreateString(get_str(spec, "precision", "fp32")));
    const cJSON *opt = get(spec, "optimizer");
    arg(args, "--lr", "%g", get_num(opt, "lr", 3e-4));
    if (get(opt, "minLr")) arg(args, "--min-lr", "%g", get_num(opt, "minLr", 0));
    arg(args, "--warmup", "%.0f", get_num(opt, "warmup", 0));
    arg(args, "--weight-decay", "%g", get_num(opt, "weightDecay", 0.1));
    arg(args, "--beta1", "%g", get_num(opt, "beta1", 0.9));
    arg(args, "--beta2", "%g", get_num(opt, "beta2", 0.95));
    arg(args, "--eps", "%g", get_num(opt, "eps", 1e-8));
    arg(args, "--clip", "%g", get_num(opt, "clip", 1.0));

    cJSON *vols = cJSON_AddArrayToObject(ps, "volumes");
    cJSON *mounts = cJSON_AddArrayToObject(ctr, "volumeMounts");
    cJSON *cmsrc = cJSON_CreateObject();
    cJSON_AddStringToObject(cmsrc, "name", cm_name);
    volume(vols, mounts, "plan", "/etc/cephalo", true, cmsrc, "configMap");
    const cJSON *data = get(spec, "data");
    const char *dpath = get_str(data, "path", "synthetic");
    if (get_str(data, "pvc", NULL)) {
        cJSON *src = cJSON_CreateObject();
        cJSON_AddStringToObject(src, "claimName", get_str(data, "pvc", ""));
        cJSON_AddBoolToObject(src, "readOnly", true);
        volume(vols, mounts, "data", "/data", true, src, "persistentVolumeClaim");
        snprintf(buf, sizeof buf, "/data/%s", dpath);
        dpath = buf;
    }
    cJSON_AddItemToArray(args, cJSON_CreateString("--data"));
    cJSON_AddItemToArray(args, cJSON_CreateString(dpath));
    const cJSON *ck = get(spec, "checkpoint");
    if (cJSON_IsObject(ck)) {
        const char *dir = get_str(ck, "dir", "checkpoints");
        char cdir[4200];
        if (get_str(ck, "pvc", NULL)) {
            cJSON *src = cJSON_CreateObject();
            cJSON_AddStringToObject(src, "claimName", get_str(ck, "pvc", ""));
            volume(vols, mounts, "checkpoints", "/checkpoints", false, src, "persistentVolumeClaim");
            snprintf(cdir, sizeof cdir, "/checkpoints/%s", dir);
        } else {
            snprintf(cdir, sizeof cdir, "%s", dir);
        }
        cJSON_AddItemToArray(args, cJSON_CreateString("--ckpt-dir"));
        cJSON_AddItemToArray(args, cJSON_CreateString(cdir));
        if (get(ck, "every")) arg(args, "--ckpt-every", "%.0f", get_num(ck, "every", 0));
        cJSON_AddItemToArray(args, cJSON_CreateString("--resume"));
        cJSON_AddItemToArray(args, cJSON_CreateString(get_str(ck, "resume", "auto")));
    }

    cJSON *e = cJSON_AddArrayToObject(ctr, "env");
    snprintf(buf, sizeof buf, "%d", rank);
    env(e, "RANK", buf);
    snprintf(buf, sizeof buf, "%d", world);
    env(e, "WORLD_SIZE", buf);
    snprintf(buf, sizeof buf, "%s-0.%s.%s.svc", name, name, ns);
    env(e, "MASTER_ADDR", buf);
    snprintf(buf, sizeof buf, "%d", REC_MASTER_PORT);
    env(e, "MASTER_PORT", buf);
    env(e, "CEPHALO_PLAN", "/etc/cephalo/plan.json");
    env(e, "CEPHALO_JOB", name);
    snprintf(buf, sizeof buf, "%s/%s", ns, name);
    env(e, "CEPHALO_JOB_ID", kube_meta_str(job, "uid") ? kube_meta_str(job, "uid") : buf);
    snprintf(buf, sizeof buf, "%g", get_num(spec, "commTimeout", 60));
    env(e, "CEPHALO_COMM_TIMEOUT", buf);
    snprintf(buf, sizeof buf, "%ld", metrics_port);
    env(e, "CEPHALO_METRICS_PORT", buf);

    cJSON *res = cJSON_AddObjectToObject(ctr, "resources");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(res, "limits"), INV_RESOURCE_GPU, "1");
    if (metrics_port > 0) {
        cJSON *port = cJSON_CreateObject();
        cJSON_AddStringToObject(port, "name", "metrics");
        cJSON_AddNumberToObject(port, "containerPort", (double)metrics_port);
        cJSON_AddItemToArray(cJSON_AddArrayToObject(ctr, "ports"), port);
    }
    return o;
}

/* ---- status -------------------------------------------------------------------------------- */

typedef struct status_arg {
    cJSON *status; /* the wanted status (conditions' lastTransitionTime filled from the old one) */
} status_arg;

static void condition(cJSON *conds, const cJSON *old_status, double gen, const char *type,
                      bool ok, const char *reason, const char *message) {
    const char *st = ok ? "True" : "False";
    char now[64];
    kube_time_now(now, sizeof now);
    const char *ltt = now;
    const cJSON *oc;
    cJSON_ArrayForEach(oc, get(old_status, "conditions")) {
        if (strcmp(get_str(oc, "type", ""), type) == 0 && strcmp(get_str(oc, "status", ""), st) == 0)
            ltt = get_str(oc, "lastTransitionTime", now);
    }
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "type", type);
    cJSON_AddStringToObject(c, "status", st);
    cJSON_AddNumberToObject(c, "observedGeneration", gen);
    cJSON_AddStringToObject(c, "lastTransitionTime", ltt);
    cJSON_AddStringToObject(c, "reason", reason);
    cJSON_AddStringToObject(c, "message", message);
    cJSON_AddItemToArray(conds, c);
}

static int status_mutate(cJSON *obj, void *argp, err_t *err) {
    (void)err;
    status_arg *a = argp;
    cJSON *old = cJSON_GetObjectItemCaseSensitive(obj, "status");
    if (old && cJSON_Compare(old, a->status, true)) return 0;
    cJSON_DeleteItemFromObjectCaseSensitive(obj, "status");
    cJSON_AddItemToObject(obj, "status", cJSON_Duplicate(a->status, true));
    return 1;
}

static int write_status(kube_client *k, const char *job_path, cJSON *status, err_t *err) {
    status_arg a = {status};
    long st = 0;
    int rc = kube_update_retry(k, job_path, true, 5, status_mutate, &a, NULL, &st, err);
    cJSON_Delete(status);
    if (rc < 0 && st == 404) return 0; /* deleted meanwhile */
    return rc;
}

/* The status of a job that cannot run. */
static cJSON *failed_status(const cJSON *job, const char *reason, const char *msg) {
    const cJSON *old = get(job, "status");
    double gen = get_num(get(job, "metadata"), "generation", 0);
    cJSON *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "phase", "Failed");
    cJSON_AddStringToObject(s, "message", msg);
    cJSON_AddNumberToObject(s, "observedGeneration", gen);
    cJSON *conds = cJSON_AddArrayToObject(s, "conditions");
    condition(conds, old, gen, "Created", true, "Created", "the job was accepted by the operator");
    condition(conds, old, gen, "Planned", false, reason, msg);
    condition(conds, old, gen, "Failed", true, reason, msg);
    cJSON_AddNumberToObject(s, "restarts", get_num(old, "restarts", 0));
    return s;
}

static void emit(kube_client *k, const cJSON *job, const char *type, const char *reason, const char *msg) {
    kube_event ev = {.namespace = kube_meta_str(job, "namespace"), .api_version = REC_API_VERSION,
                     .kind = "CephaloJob", .name = kube_meta_str(job, "name"),
                     .uid = kube_meta_str(job, "uid"), .type = type, .reason = reason,
                     .message = msg, .component = REC_COMPONENT};
    err_t e;
    (void)kube_event_emit(k, &ev, &e); /* events are best effort */
}

/* ---- the reconcile ------------------------------------------------------------------------- */

/* The job's pods (label cephalo.dev/job=NAME) as a PodList, or NULL with the error set. */
static cJSON *list_pods(kube_client *k, const char *ns, const char *name, err_t *err) {
    char path[KUBE_PATH_MAX + 256];
    if (kube_path(path, KUBE_PATH_MAX, "v1", ns, "pods", NULL, err) < 0) return NULL;
    size_t n = strlen(path);
    snprintf(path + n, sizeof path - n, "?labelSelector=%s%%3D%s", "cephalo.dev%2Fjob", name);
    cJSON *list = NULL;
    long st = 0;
    if (kube_get(k, path, &list, &st, err) < 0) return NULL;
    return list;
}

static int suspend_job(kube_client *k, const cJSON *job, const char *job_path, err_t *err) {
    const char *ns = kube_meta_str(job, "namespace"), *name = kube_meta_str(job, "name");
    long st = 0;
    cJSON *list = list_pods(k, ns, name, err);
    if (!list) return -1;
    const cJSON *pod;
    cJSON_ArrayForEach(pod, get(list, "items")) {
        char pp[KUBE_PATH_MAX];
        if (kube_path(pp, sizeof pp, "v1", ns, "pods", kube_meta_str(pod, "name"), err) < 0 ||
            (kube_delete(k, pp, &st, err) < 0 && st != 404)) {
            cJSON_Delete(list);
            return -1;
        }
    }
    cJSON_Delete(list);
    const cJSON *old = get(job, "status");
    double gen = get_num(get(job, "metadata"), "generation", 0);
    cJSON *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "phase", "Suspended");
    cJSON_AddStringToObject(s, "message", "spec.suspend is true: no worker pods");
    cJSON_AddNumberToObject(s, "observedGeneration", gen);
    cJSON *conds = cJSON_AddArrayToObject(s, "conditions");
    condition(conds, old, gen, "Created", true, "Created", "the job was accepted by the operator");
    condition(conds, old, gen, "Suspended", true, "Suspended", "spec.suspend is true");
    cJSON_AddNumberToObject(s, "restarts", get_num(old, "restarts", 0));
    return write_status(k, job_path, s, err);
}

int rec_job(kube_client *k, const rec_config *c, const char *ns, const char *name, rec_stats *st,
            err_t *err) {
    char job_path[KUBE_PATH_MAX], path[KUBE_PATH_MAX], cm_name[128];
    long status = 0;
    cJSON *job = NULL, *cm = NULL, *plan_doc = NULL;
    int rc = -1;
    if (st) st->reconciles++;
    if (kube_path(job_path, sizeof job_path, REC_API_VERSION, ns, "cephalojobs", name, err) < 0) goto out;
    if (kube_get(k, job_path, &job, &status, err) < 0) {
        rc = status == 404 ? 0 : -1;
        goto out;
    }
    const cJSON *md = get(job, "metadata"), *spec = get(job, "spec");
    if (get(md, "deletionTimestamp")) {
        rc = 0;
        goto out;
    }
    if (cJSON_IsTrue(get(spec, "suspend"))) {
        rc = suspend_job(k, job, job_path, err);
        goto out;
    }
    double gen = get_num(md, "generation", 0);
    char gen_s[32];
    snprintf(gen_s, sizeof gen_s, "%.0f", gen);
    snprintf(cm_name, sizeof cm_name, "%s-plan", name);

    /* the plan of this generation, if it was made already */
    if (kube_path(path, sizeof path, "v1", ns, "configmaps", cm_name, err) < 0) goto out;
    if (kube_get(k, path, &cm, &status, err) < 0) {
        if (status != 404) goto out;
        cm = NULL;
    }
    const char *cm_gen = get_str(get(get(cm, "metadata"), "annotations"), REC_ANN_GENERATION, "");
    const char *cm_plan = get_str(get(cm, "data"), "plan.json", NULL);
    bool estimated = cJSON_IsTrue(get(get(get(job, "status"), "plan"), "estimated"));
    char notes[1024] = "";
    bool stale = false; /* an older generation's plan kept under existing pods */
    if (cm && cm_plan && strcmp(cm_gen, gen_s) != 0) {
        /* the spec changed: re-plan only when no worker pod exists (re-planning under running
         * pods needs the gang restart from a checkpoint, which is not implemented yet) */
        cJSON *pods = list_pods(k, ns, name, err);
        if (!pods) goto out;
        stale = cJSON_GetArraySize(get(pods, "items")) > 0;
        cJSON_Delete(pods);
    }
    if (cm && cm_plan && (stale || strcmp(cm_gen, gen_s) == 0)) {
        plan_doc = json_parse(cm_name, cm_plan, strlen(cm_plan), err);
        snprintf(notes, sizeof notes, "%s", get_str(get(get(cm, "metadata"), "annotations"), REC_ANN_NOTES, ""));
        if (!plan_doc) log_msg("warning", "%s/%s: %s; planning again", ns, name, err->msg);
    }
    if (!plan_doc) {
        plan_out po;
        if (st) st->plans++;
        int prc = make_plan(k, spec, &po, err);
        if (prc == -2) goto out;
        if (prc < 0) {
            if (st) st->plan_failures++;
            char msg[1100];
            snprintf(msg, sizeof msg, "%s", err->msg);
            /* the planner's hint for the CLI; the operator takes built-in names only */
            char *hint = strstr(msg, " (or give a model file path)");
            if (hint) *hint = '\0';
            const cJSON *ost = get(job, "status");
            if (strcmp(get_str(ost, "phase", ""), "Failed") != 0 || strcmp(get_str(ost, "message", ""), msg) != 0)
                emit(k, job, "Warning", po.reason, msg);
            rc = write_status(k, job_path, failed_status(job, po.reason, msg), err);
            goto out;
        }
        estimated = true; /* no profile in the operator yet: analytic estimates */
        snprintf(notes, sizeof notes, "%s", po.notes);
        if (write_configmap(k, job, cm, cm_name, po.json, po.notes, err) < 0) {
            free(po.json);
            goto out;
        }
        plan_doc = json_parse(cm_name, po.json, strlen(po.json), err);
        free(po.json);
        if (!plan_doc) goto out;
        char ev[256];
        snprintf(ev, sizeof ev, "planned %d GPUs, predicted %.2f samples/s",
                 cJSON_GetArraySize(get(plan_doc, "ranks")),
                 get_num(get(plan_doc, "predicted"), "samples_per_s", 0));
        emit(k, job, "Normal", "Planned", ev);
    }

    long metrics_port = (long)get_num(spec, "metricsPort", 9400);
    if (ensure_service(k, job, metrics_port, err) < 0) goto out;

    const cJSON *ranks = get(plan_doc, "ranks");
    int world = cJSON_GetArraySize(ranks), running = 0, succeeded = 0, failed = 0;
    cJSON *st_ranks = cJSON_CreateArray();
    const cJSON *r;
    int i = 0;
    cJSON_ArrayForEach(r, ranks) {
        char pod_name[128];
        snprintf(pod_name, sizeof pod_name, "%s-%d", name, i);
        const char *node = get_str(r, "node", "");
        cJSON *pod = NULL;
        if (kube_path(path, sizeof path, "v1", ns, "pods", pod_name, err) < 0) {
            cJSON_Delete(st_ranks);
            goto out;
        }
        if (kube_get(k, path, &pod, &status, err) < 0) {
            if (status != 404) {
                cJSON_Delete(st_ranks);
                goto out;
            }
            char coll[KUBE_PATH_MAX];
            bool created = false;
            if (kube_path(coll, sizeof coll, "v1", ns, "pods", NULL, err) < 0 ||
                ensure(k, coll, pod_object(c, job, i, world, node, cm_name), &created, err) < 0) {
                cJSON_Delete(st_ranks);
                goto out;
            }
            if (created && st) st->pods_created++;
        } else {
            const char *ph = get_str(get(pod, "status"), "phase", "Pending");
            running += strcmp(ph, "Running") == 0;
            succeeded += strcmp(ph, "Succeeded") == 0;
            failed += strcmp(ph, "Failed") == 0;
            cJSON_Delete(pod);
        }
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "rank", i);
        cJSON_AddStringToObject(o, "node", node);
        cJSON_AddStringToObject(o, "device", get_str(r, "device", ""));
        cJSON_AddStringToObject(o, "pod", pod_name);
        cJSON_AddNumberToObject(o, "batch", get_num(r, "batch", 0));
        cJSON_AddNumberToObject(o, "microbatch", get_num(r, "microbatch", 0));
        cJSON_AddNumberToObject(o, "microbatches", get_num(r, "microbatches", 0));
        cJSON_AddNumberToObject(o, "stateRatio", get_num(r, "state_ratio", 0));
        cJSON_AddNumberToObject(o, "predictedPeakBytes", get_num(get(r, "predicted"), "peak_bytes", 0));
        cJSON_AddItemToArray(st_ranks, o);
        i++;
    }

    /* status */
    const cJSON *old = get(job, "status");
    cJSON *s = cJSON_CreateObject();
    const char *phase = succeeded == world && world > 0 ? "Succeeded"
                      : running + succeeded == world && world > 0 ? "Running" : "Planned";
    char msg[1400];
    if (failed)
        snprintf(msg, sizeof msg, "%d of %d worker pods failed (gang restart is not implemented yet)", failed, world);
    else
        snprintf(msg, sizeof msg, "%d of %d worker pods running%s%s%s", running, world,
                 stale ? "; the spec changed but the plan of generation " : "", stale ? cm_gen : "",
                 stale ? " is kept while its pods exist (suspend the job to re-plan)" : "");
    if (*notes && strlen(msg) + strlen(notes) + 3 < sizeof msg) {
        strcat(msg, "; ");
        strcat(msg, notes);
    }
    cJSON_AddStringToObject(s, "phase", phase);
    cJSON_AddStringToObject(s, "message", msg);
    cJSON_AddNumberToObject(s, "observedGeneration", gen);
    cJSON *conds = cJSON_AddArrayToObject(s, "conditions");
    condition(conds, old, gen, "Created", true, "Created", "the job was accepted by the operator");
    char pmsg[256];
    snprintf(pmsg, sizeof pmsg, "%s plan on %d GPUs in ConfigMap %s: predicted %.1f ms per step, %.2f samples/s",
             get_str(get(plan_doc, "inputs"), "strategy", "cephalo"), world, cm_name,
             get_num(get(plan_doc, "predicted"), "iter_ms", 0),
             get_num(get(plan_doc, "predicted"), "samples_per_s", 0));
    condition(conds, old, gen, "Planned", true, "Planned", pmsg);
    condition(conds, old, gen, "Running", strcmp(phase, "Running") == 0,
              strcmp(phase, "Running") == 0 ? "PodsRunning" : "PodsNotRunning", msg);
    if (succeeded == world && world > 0) condition(conds, old, gen, "Succeeded", true, "Succeeded", msg);
    cJSON *pl = cJSON_AddObjectToObject(s, "plan");
    cJSON_AddStringToObject(pl, "configMap", cm_name);
    cJSON_AddStringToObject(pl, "strategy", get_str(get(plan_doc, "inputs"), "strategy", "cephalo"));
    cJSON_AddNumberToObject(pl, "worldSize", world);
    cJSON_AddNumberToObject(pl, "predictedIterMs", get_num(get(plan_doc, "predicted"), "iter_ms", 0));
    cJSON_AddNumberToObject(pl, "predictedSamplesPerSecond", get_num(get(plan_doc, "predicted"), "samples_per_s", 0));
    cJSON_AddBoolToObject(pl, "estimated", estimated);
    cJSON_AddItemToObject(pl, "ranks", st_ranks);
    cJSON_AddNumberToObject(s, "restarts", get_num(old, "restarts", 0));
    const char *start = get_str(old, "startTime", NULL);
    char now[64];
    kube_time_now(now, sizeof now);
    if (start || strcmp(phase, "Running") == 0) cJSON_AddStringToObject(s, "startTime", start ? start : now);
    rc = write_status(k, job_path, s, err);
out:
    if (rc < 0 && st) st->errors++;
    cJSON_Delete(plan_doc);
    cJSON_Delete(cm);
    cJSON_Delete(job);
    return rc;
}
