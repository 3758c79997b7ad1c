/* reconcile.c - one CephaloJob reconciled (reconcile.h). */
#include "operator/reconcile.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/json_util.h"
#include "common/log.h"
#include "common/version.h"
#include "operator/cache.h"
#include "operator/inventory.h"
#include "operator/model_source.h"
#include "operator/progress.h"
#include "planner/inputs.h"
#include "planner/model.h"
#include "planner/plan.h"
#include "planner/profile_store.h"

static const cJSON *get(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }
static const char *get_str(const cJSON *o, const char *k, const char *def) {
    const cJSON *v = get(o, k);
    return cJSON_IsString(v) ? v->valuestring : def;
}
static double get_num(const cJSON *o, const char *k, double def) {
    const cJSON *v = get(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : def;
}

#define REC_PROGRESS_S 5.0 /* seconds between progress reads of a running job */
#define REC_SCRAPE_BUDGET_S 2.0 /* the most one job's progress read may take */
#define EXIT_STOPPED 143   /* a worker stopped on request (SIGTERM), its step checkpointed: worker/main.c */

/* ---- planning ------------------------------------------------------------------------------ */

typedef struct plan_out {
    char *json; /* plan.json text */
    bool estimated;
    char notes[1024];
    char profile[600]; /* where measured costs came from ("ConfigMap ns/name"), or "" */
    int measured_groups, groups; /* device groups with measured costs, of all */
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

/* The job's usable GPUs: the Nodes filtered by spec.gpus (inventory.h), without the maxGPUs cap
 * (job_inv); with pods (PodList items of every namespace) or their digests (held, inv_pod_digest),
 * the free ones only: less those the pods hold, but the pods of the job own_uid. 0, or -1 with
 * the error set (no usable GPU: the error says why). */
static int job_cluster(const rec_config *rc, const cJSON *nodes, const cJSON *spec, const cJSON *pods,
                       const inv_held *const *held, int n_held, const char *own_uid, cluster *cl, inv_result *inv,
                       err_t *err) {
    const cJSON *gpus = get(spec, "gpus");
    inv_constraints c = {.allowed_products = get(gpus, "allowedProducts"),
                         .node_selector = get(gpus, "nodeSelector"), .archs = rc->worker_archs,
                         .pods = pods, .held = held, .n_held = n_held, .own_uid = own_uid,
                         .tolerations = get(spec, "tolerations")};
    return inv_build(get(nodes, "items"), &c, cl, inv, err);
}

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}
#define FNV_OFFSET 0xcbf29ce484222325ULL

/* A job's usable GPUs as inv_build finds them without the maxGPUs cap, built at most once per
 * reconcile from the stores' snapshot: each view a reconcile asks about (capped or not, every GPU
 * or the free ones) comes from one of two, since inv_build's cap keeps the first maxGPUs devices.
 * An admission used to build the 300-node inventory four times under the admission lock. */
typedef struct job_inv {
    bool built;
    int rc; /* job_cluster's: -1 with err set when no GPU is usable */
    cluster cl;
    inv_result r;
    err_t err;
} job_inv;

/* How many devices of j a view with cap `cap` (0: none) holds. */
static int inv_view_devices(const job_inv *j, int cap) {
    return cap > 0 && cap < j->cl.n_devices ? cap : j->cl.n_devices;
}

/* A fingerprint of the job's usable GPUs (node, type and memory of each, in rank order: the first
 * `cap` of j): when it changes, the job is planned again. "none" when no GPU is usable. */
static void inventory_fingerprint(const job_inv *j, int cap, char *out, size_t n) {
    if (j->rc < 0) {
        snprintf(out, n, "none");
        return;
    }
    int nd = inv_view_devices(j, cap);
    uint64_t h = FNV_OFFSET;
    for (int i = 0; i < nd; i++) {
        char line[160];
        int len = snprintf(line, sizeof line, "%s\t%s\t%.0f\n", j->cl.nodes[j->cl.devices[i].node].name,
                           j->cl.devices[i].type, j->cl.devices[i].memory_bytes);
        h = fnv1a(h, line, (size_t)len);
    }
    snprintf(out, n, "%d-%016llx", nd, (unsigned long long)h);
}

/* Profiles from a ConfigMap (docs/operator.md, Profiles): spec.profileConfigMap in the job's
 * namespace, else the operator's --profile-configmap. Every data key ending in ".json" is a
 * profile file as `cephalo profile -o` writes it; they are merged. A missing default ConfigMap,
 * or one without the job's model, means estimates; the job's own must exist and have the model.
 * rv gets the ConfigMap's resourceVersion ("" without one): a changed profile is planned anew.
 * 0 (in->have_prof says whether one was loaded), -1 with err set (the job's problem), or -2 with
 * err set (an API error). */
static int load_profiles(kube_client *k, const rec_config *c, const cJSON *job, plan_inputs *in, char *rv,
                         size_t rvn, err_t *err) {
    const char *own = get_str(get(job, "spec"), "profileConfigMap", NULL);
    char ns[256], name[256], path[KUBE_PATH_MAX];
    if (own) {
        snprintf(ns, sizeof ns, "%s", kube_meta_str(job, "namespace"));
        snprintf(name, sizeof name, "%s", own);
    } else if (c->profile_cm && *c->profile_cm) {
        const char *slash = strchr(c->profile_cm, '/');
        if (!slash) return 0;
        snprintf(ns, sizeof ns, "%.*s", (int)(slash - c->profile_cm), c->profile_cm);
        snprintf(name, sizeof name, "%s", slash + 1);
    } else {
        return 0;
    }
    cJSON *cm = NULL;
    long status = 0;
    if (kube_path(path, sizeof path, "v1", ns, "configmaps", name, err) < 0) return own ? -1 : 0;
    if (kube_get(k, path, &cm, &status, err) < 0) {
        if (status != 404) return -2;
        return own ? err_set(err, "spec.profileConfigMap: ConfigMap %s/%s not found", ns, name) : 0;
    }
    snprintf(rv, rvn, "%s", get_str(get(cm, "metadata"), "resourceVersion", ""));
    int rc = 0, files = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, get(cm, "data")) {
        size_t kl = strlen(item->string);
        if (!cJSON_IsString(item) || kl < 5 || strcmp(item->string + kl - 5, ".json") != 0) continue;
        char src[600];
        snprintf(src, sizeof src, "ConfigMap %s/%s key %s", ns, name, item->string);
        profile p;
        if (profile_load_string(src, item->valuestring, strlen(item->valuestring), &p, err) < 0) {
            rc = -1;
            break;
        }
        if (files++ == 0) {
            in->prof = p;
        } else {
            profile_merge(&in->prof, &p);
            profile_free(&p);
        }
    }
    if (rc == 0 && files) {
        in->have_prof = true;
        snprintf(in->prof_source, sizeof in->prof_source, "ConfigMap %s/%s", ns, name);
        if (!profile_has_model(&in->prof, in->model.name)) {
            char models[512];
            profile_models(&in->prof, models, sizeof models);
            if (own)
                rc = err_set(err, "spec.profileConfigMap: ConfigMap %s/%s has no profile of model %s "
                                  "(it has: %s); run `cephalo profile --model %s` on the GPUs",
                             ns, name, in->model.name, models, in->model.name);
            profile_free(&in->prof);
            in->have_prof = false;
        }
    } else if (rc == 0 && own) {
        rc = err_set(err, "spec.profileConfigMap: ConfigMap %s/%s has no key ending in .json "
                          "(expected profile files written by `cephalo profile -o`)", ns, name);
    } else if (rc < 0 && files) {
        profile_free(&in->prof);
    }
    cJSON_Delete(cm);
    return rc;
}

/* One plan to make: what it is made from, read on the reconcile loop (plan_prepare), and what a
 * planning thread made of it (plan_solve; planning.h). */
typedef struct plan_task {
    plan_inputs in;
    bool have_inputs; /* in holds allocations (plan_solve frees them as soon as it is done) */
    inputs_opts o;
    strategy strat;
    double budget_s; /* --plan-timeout */
    char profile_rv[64]; /* resourceVersion of the profile ConfigMap used, "" for none */
    int rc; /* the result: 0 with out.json, or -1 with out.reason and msg */
    plan_out out;
    char msg[sizeof(err_t)];
} plan_task;

static void plan_task_free(void *task) {
    plan_task *t = task;
    if (!t) return;
    if (t->have_inputs) inputs_free(&t->in);
    free(t->out.json);
    free(t);
}

/* What the plan is made from, read from the job and the API (on the loop: the client is not
 * thread-safe): the model, the usable GPUs, the profiles. 0; -1 with t->out.reason and err set
 * (the job's problem, not the API's); -2 with err set on an API error. */
static int plan_prepare(kube_client *k, const rec_config *c, const cJSON *job, const job_inv *gpus, int cap,
                        plan_task *t, err_t *err) {
    const cJSON *spec = get(job, "spec");
    plan_out *out = &t->out;
    out->reason = "InvalidSpec";
    msrc ms; /* a Hugging Face directory: the model is its config.json (model_source.h) */
    int from = msrc_parse(get(spec, "model"), &ms, err);
    if (from < 0) return -1;
    if (from) {
        int mrc = msrc_model(k, kube_meta_str(job, "namespace"), &ms, &t->in.model, err);
        if (mrc < 0) return mrc;
    } else if (resolve_model(get(spec, "model"), &t->in.model, err) < 0) {
        return err_prefix(err, "model");
    }
    if (strategy_parse(get_str(spec, "strategy", "cephalo"), &t->strat, err) < 0) return -1;
    if (gpus->rc < 0) {
        *err = gpus->err;
        out->reason = "NoGPUs";
        return -1;
    }
    if (cluster_copy(&gpus->cl, cap, &t->in.cl) < 0) return err_set(err, "out of memory");
    t->have_inputs = true;
    out->estimated = gpus->r.estimated;
    snprintf(out->notes, sizeof out->notes, "%s", gpus->r.notes);
    t->o = (inputs_opts){.batch = (long)get_num(spec, "globalBatch", 0), .seq = (long)get_num(spec, "seqLen", 0),
                         .mem_cap = get_num(spec, "memCap", 0.8), .no_store = true};
    const char *prec = get_str(spec, "precision", "fp32");
    if (!precision_parse(prec, &t->o.prec))
        return err_set(err, "spec.precision: '%.40s' (expected " PRECISION_CHOICES ")", prec);
    if (cluster_check_precision(&t->in.cl, t->o.prec, "spec.precision", err) < 0) {
        out->reason = "UnsupportedPrecision";
        return -1;
    }
    if (t->o.batch < t->in.cl.n_devices)
        return err_set(err, "globalBatch %ld is less than the %d usable GPUs (every GPU needs a sample; "
                            "lower gpus.maxGPUs or raise globalBatch)", t->o.batch, t->in.cl.n_devices);
    int prc = load_profiles(k, c, job, &t->in, t->profile_rv, sizeof t->profile_rv, err);
    if (prc < 0) out->reason = "InvalidProfile";
    return prc;
}

/* plan.json as text (the caller frees it), or NULL with err set. */
static char *plan_json_text(const plan *p, err_t *err) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return err_set(err, "out of memory"), NULL;
    int rc = plan_write_json(p, f, err);
    if (fclose(f) != 0 && rc == 0) rc = err_set(err, "out of memory");
    if (rc == 0) return buf;
    free(buf);
    return NULL;
}

/* The optimizer on the task's cost model within its budget: 0 with t->out.json, or -1 with
 * t->out.reason and err set. */
static int plan_answer(plan_task *t, const volatile int *cancel, err_t *err) {
    plan p;
    int rc = plan_make_limited(&t->in.cm, t->strat, t->budget_s, cancel, &p, err);
    if (rc == 1 && cancel && *cancel) { /* dropped (a newer spec, the job gone, a shutdown): nobody reads it */
        t->out.reason = "Cancelled";
        return -1;
    }
    if (rc == 1) {
        t->out.reason = "PlanningTimeout";
        char why[600]; /* the planner names the budget and the size; the advice is the operator's */
        snprintf(why, sizeof why, "%.599s", err->msg);
        return err_set(err, "%s; a smaller spec.globalBatch, fewer GPUs (spec.gpus.maxGPUs) or a coarser plan "
                            "(spec.strategy fsdp or whale, planned at once) fits in it, or raise the operator's "
                            "--plan-timeout (chart value operator.planTimeout)", why);
    }
    t->out.reason = "PlanError";
    if (rc < 0) return -1;
    if (!p.feasible) {
        t->out.reason = "Infeasible";
        err_set(err, "no feasible %s plan on %d GPUs: %s", strategy_name(t->strat), t->in.cl.n_devices, p.reason);
    } else {
        t->out.json = plan_json_text(&p, err);
    }
    plan_free(&p);
    return t->out.json ? 0 : -1;
}

/* Makes the plan of a prepared task: the cost model, the optimizer, plan.json. Runs on a planning
 * thread (planning_run_fn), or inline without a pool. */
static void plan_solve(void *task, const volatile int *cancel) {
    plan_task *t = task;
    plan_inputs *in = &t->in;
    plan_out *out = &t->out;
    err_t err = {{0}};
    out->reason = "InvalidSpec";
    t->rc = inputs_build(in, &t->o, &err);
    if (t->rc == 0) {
        int measured = 0;
        for (int g = 0; in->have_prof && g < in->cm.n_groups; g++) measured += in->cm.groups[g].measured;
        out->estimated |= measured < in->cm.n_groups;
        snprintf(out->profile, sizeof out->profile, "%.*s", (int)sizeof out->profile - 1, in->have_prof ? in->prof_source : "");
        out->measured_groups = measured;
        out->groups = in->cm.n_groups;
        t->rc = plan_answer(t, cancel, &err);
    }
    if (t->rc < 0) snprintf(t->msg, sizeof t->msg, "%s", err.msg);
    inputs_free(in); /* the cost tables can be large; the result needs none of it */
    t->have_inputs = false;
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

/* Creates obj in the collection unless it exists (409 AlreadyExists is success). The created
 * object goes into the stores given (NULL-terminated), so that the next reconcile sees it before
 * the watch delivers it. */
static int ensure(kube_client *k, const char *collection, cJSON *obj, bool *created, cache *const *into,
                  err_t *err) {
    long status = 0;
    cJSON *out = NULL;
    if (created) *created = false;
    int rc = kube_create(k, collection, obj, &out, &status, err);
    cJSON_Delete(obj);
    for (int i = 0; rc == 0 && out && into && into[i]; i++) cache_put(into[i], out, NULL);
    cJSON_Delete(out);
    if (rc == 0) {
        if (created) *created = true;
        return 0;
    }
    return status == 409 ? 0 : -1;
}

typedef struct cm_annotations {
    const char *generation, *inventory, *plan_id, *notes;
} cm_annotations;

/* Creates the plan ConfigMap, or merge-patches the one of an older plan (the chart's RBAC grants
 * configmaps patch, not update). */
static int write_configmap(kube_client *k, cache *store, const cJSON *job, const cJSON *old, const char *name,
                           const char *plan_json, const cm_annotations *a, err_t *err) {
    char path[KUBE_PATH_MAX];
    const char *ns = kube_meta_str(job, "namespace");
    cJSON *cm = cJSON_CreateObject();
    cJSON *m = old ? cJSON_AddObjectToObject(cm, "metadata") : meta(job, name, -1);
    cJSON *ann = cJSON_AddObjectToObject(m, "annotations");
    cJSON_AddStringToObject(ann, REC_ANN_GENERATION, a->generation);
    cJSON_AddStringToObject(ann, REC_ANN_INVENTORY, a->inventory);
    cJSON_AddStringToObject(ann, REC_ANN_PLAN_ID, a->plan_id);
    char now[64];
    kube_time_now(now, sizeof now);
    cJSON_AddStringToObject(ann, REC_ANN_PLANNED_AT, now);
    if (a->notes && *a->notes) cJSON_AddStringToObject(ann, REC_ANN_NOTES, a->notes);
    else if (old) cJSON_AddNullToObject(ann, REC_ANN_NOTES);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(cm, "data"), "plan.json", plan_json);
    long status = 0;
    cJSON *out = NULL;
    int rc;
    if (old) {
        if (kube_path(path, sizeof path, "v1", ns, "configmaps", name, err) < 0) return cJSON_Delete(cm), -1;
        rc = kube_merge_patch(k, path, cm, &out, &status, err);
    } else {
        cJSON_AddStringToObject(cm, "apiVersion", "v1");
        cJSON_AddStringToObject(cm, "kind", "ConfigMap");
        cJSON_AddItemToObject(cm, "metadata", m);
        if (kube_path(path, sizeof path, "v1", ns, "configmaps", NULL, err) < 0) return cJSON_Delete(cm), -1;
        rc = kube_create(k, path, cm, &out, &status, err);
    }
    if (rc == 0 && out) cache_put(store, out, NULL);
    cJSON_Delete(out);
    cJSON_Delete(cm);
    return rc;
}

static int ensure_service(kube_client *k, cache *store, const cJSON *job, long metrics_port, err_t *err) {
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
    return ensure(k, path, s, NULL, (cache *[]){store, NULL}, err);
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

/* Required node affinity on the planned node's kubernetes.io/hostname label: the scheduler binds
 * the pod there (or says it cannot: Unschedulable), so its GPU is counted like everyone else's. */
static void pin_to_host(cJSON *ps, const char *host) {
    cJSON *req = cJSON_CreateObject(), *vals = cJSON_CreateArray();
    cJSON_AddStringToObject(req, "key", INV_LABEL_HOSTNAME);
    cJSON_AddStringToObject(req, "operator", "In");
    cJSON_AddItemToArray(vals, cJSON_CreateString(host));
    cJSON_AddItemToObject(req, "values", vals);
    cJSON *term = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(term, "matchExpressions"), req);
    cJSON *na = cJSON_AddObjectToObject(cJSON_AddObjectToObject(ps, "affinity"), "nodeAffinity");
    cJSON *rd = cJSON_AddObjectToObject(na, "requiredDuringSchedulingIgnoredDuringExecution");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(rd, "nodeSelectorTerms"), term);
}

/* host: the planned node's kubernetes.io/hostname label (else its name); init: the model
 * directory to start from (spec.model.initFrom), or NULL. */
/* The "restricted" Pod Security Standard, as the operator's own Deployment runs: non-root (the
 * worker image's user 10001; fsGroup makes volumes such as the checkpoint claim writable to it),
 * RuntimeDefault seccomp; no privilege escalation, every capability dropped. */
static void restricted_pod(cJSON *ps) {
    cJSON *sc = cJSON_AddObjectToObject(ps, "securityContext");
    cJSON_AddBoolToObject(sc, "runAsNonRoot", true);
    cJSON_AddNumberToObject(sc, "runAsUser", REC_WORKER_UID);
    cJSON_AddNumberToObject(sc, "runAsGroup", REC_WORKER_UID);
    cJSON_AddNumberToObject(sc, "fsGroup", REC_WORKER_UID);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(sc, "seccompProfile"), "type", "RuntimeDefault");
}

static void restricted_container(cJSON *ctr) {
    cJSON *sc = cJSON_AddObjectToObject(ctr, "securityContext");
    cJSON_AddBoolToObject(sc, "allowPrivilegeEscalation", false);
    cJSON_AddBoolToObject(sc, "runAsNonRoot", true);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(cJSON_AddObjectToObject(sc, "capabilities"), "drop"),
                         cJSON_CreateString("ALL"));
}

static cJSON *pod_object(const rec_config *c, const cJSON *job, int rank, int world,
                         const char *host, const char *cm_name, const char *plan_id, int attempt,
                         const msrc *init) {
    const cJSON *spec = get(job, "spec");
    const char *ns = kube_meta_str(job, "namespace"), *name = kube_meta_str(job, "name");
    char pod[128], buf[512];
    snprintf(pod, sizeof pod, "%s-%d", name, rank);
    long metrics_port = (long)get_num(spec, "metricsPort", 9400);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "apiVersion", "v1");
    cJSON_AddStringToObject(o, "kind", "Pod");
    cJSON *md = meta(job, pod, rank);
    cJSON *ann = cJSON_AddObjectToObject(md, "annotations");
    cJSON_AddStringToObject(ann, REC_ANN_PLAN_ID, plan_id);
    snprintf(buf, sizeof buf, "%d", attempt);
    cJSON_AddStringToObject(ann, REC_ANN_ATTEMPT, buf);
    cJSON_AddItemToObject(o, "metadata", md);
    cJSON *ps = cJSON_AddObjectToObject(o, "spec");
    pin_to_host(ps, host);
    snprintf(buf, sizeof buf, "%s-%d", name, rank);
    cJSON_AddStringToObject(ps, "hostname", buf);
    cJSON_AddStringToObject(ps, "subdomain", name);
    cJSON_AddStringToObject(ps, "restartPolicy", "Never");
    /* a stopped worker finishes its step and writes a whole checkpoint before it exits */
    cJSON_AddNumberToObject(ps, "terminationGracePeriodSeconds", get_num(spec, "terminationGracePeriodSeconds", 120));
    const cJSON *tol = get(spec, "tolerations");
    if (cJSON_IsArray(tol)) cJSON_AddItemToObject(ps, "tolerations", cJSON_Duplicate(tol, true));
    restricted_pod(ps);
    cJSON *ctr = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(ps, "containers"), ctr);
    cJSON_AddStringToObject(ctr, "name", "worker");
    restricted_container(ctr);
    /* a failed worker's last log lines become its termination message, which the status quotes */
    cJSON_AddStringToObject(ctr, "terminationMessagePolicy", "FallbackToLogsOnError");
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
    cJSON_AddItemToArray(args, cJSON_CreateString("--schedule"));
    cJSON_AddItemToArray(args, cJSON_CreateString(get_str(opt, "schedule", "cosine")));
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
    const cJSON *val = get(data, "validation");
    if (get_str(val, "path", NULL)) { /* held-out data on the same volume as the training data */
        char vpath[4200];
        snprintf(vpath, sizeof vpath, "%s%s", get_str(data, "pvc", NULL) ? "/data/" : "", get_str(val, "path", ""));
        cJSON_AddItemToArray(args, cJSON_CreateString("--val-data"));
        cJSON_AddItemToArray(args, cJSON_CreateString(vpath));
        if (get(val, "every")) arg(args, "--val-every", "%.0f", get_num(val, "every", 0));
        if (get(val, "samples")) arg(args, "--val-samples", "%.0f", get_num(val, "samples", 0));
    }
    if (init) msrc_pod(init, vols, mounts, args);
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
        /* retention, always spelled out (the CRD's defaults are the worker's): the pod says what is kept */
        arg(args, "--keep-last", "%.0f", get_num(ck, "keepLast", 3));
        arg(args, "--keep-every", "%.0f", get_num(ck, "keepEvery", 0));
        cJSON_AddItemToArray(args, cJSON_CreateString("--resume"));
        cJSON_AddItemToArray(args, cJSON_CreateString(get_str(ck, "resume", "auto")));
    }

    cJSON *e = cJSON_AddArrayToObject(ctr, "env");
    env(e, CEPHALO_ENV_OPERATOR_VERSION, cephalo_version()); /* a worker of another release refuses to start */
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
    /* requests too (the API server would default them from limits): what the scheduler counts */
    cJSON_AddStringToObject(cJSON_AddObjectToObject(res, "requests"), INV_RESOURCE_GPU, "1");
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

static void emit(kube_client *k, const cJSON *job, const char *type, const char *reason, const char *msg) {
    kube_event ev = {.namespace = kube_meta_str(job, "namespace"), .api_version = REC_API_VERSION,
                     .kind = "CephaloJob", .name = kube_meta_str(job, "name"),
                     .uid = kube_meta_str(job, "uid"), .type = type, .reason = reason,
                     .message = msg, .component = REC_COMPONENT};
    err_t e;
    (void)kube_event_emit(k, &ev, &e); /* events are best effort */
}

/* ---- the reconcile ------------------------------------------------------------------------- */

void rec_stats_add(rec_stats *d, const rec_stats *s) {
    d->reconciles += s->reconciles, d->errors += s->errors, d->plans += s->plans;
    d->plan_failures += s->plan_failures, d->pods_created += s->pods_created;
    d->pods_deleted += s->pods_deleted, d->jobs_created += s->jobs_created;
    d->jobs_succeeded += s->jobs_succeeded, d->jobs_failed += s->jobs_failed;
    d->gang_restarts += s->gang_restarts, d->replans += s->replans;
    d->plan_timeouts += s->plan_timeouts;
}

/* What one reconcile works on. */
typedef struct rec_ctx {
    kube_client *k;
    const rec_config *c;
    rec_stats *st;
    const char *ns, *name;
    char key[PLANNING_KEY_MAX]; /* namespace/name: the job's task in the planning pool */
    char job_path[KUBE_PATH_MAX];
    cJSON *job;
    const cJSON *spec, *old; /* the job's spec and stored status */
    double gen;
    cJSON *nodes; /* NodeList (a view of the store: read-only) */
    cJSON *cm;    /* the plan ConfigMap, or NULL */
    cJSON *pods;  /* PodList of the job's pods (label cephalo.dev/job; a view: read-only) */
    cJSON *busy;  /* PodList of the pods that may hold GPUs: not terminal, every namespace (a view) */
    cache_view nodes_view, pods_view, busy_view;
    job_inv inv_all, inv_free; /* the job's usable GPUs, no maxGPUs cap: all, and the free ones (job_inv_of) */
    bool on_free; /* what the job is planned on: its free GPUs; false: all of them, while too few are free */
    int cap; /* spec.gpus.maxGPUs; 0: no cap */
    int picked; /* free GPUs the job would take now (at most maxGPUs) */
    int need; /* GPUs it needs to start: spec.gpus.minGPUs, else its whole plan */
    bool have_service; /* the job's Service exists (and is the job's) */
    cJSON *plan_doc; /* plan.json */
    char plan_id[64], cm_name[128], notes[1024], profile[600];
    char why[600]; /* set when this reconcile re-planned: why the gang restarts */
    bool estimated;
    int attempt; /* the gang attempt: status.attempt */
    bool admitting; /* holds rec_admit_mu */
    kube_client *const *helpers; /* more clients, for creating a gang's pods at once */
    int n_helpers;
    /* a new plan decided under the admission lock, written after it (commit_plan): the
     * ConfigMap and the Planned/Replanned Event are API calls other admissions need not wait for */
    struct {
        char *json; /* plan.json; NULL: nothing to write */
        char gen[32], fp[64];
        bool forget; /* the planning pool keeps the task until the ConfigMap has the plan */
        const char *ev_reason; /* NULL: no Event */
        char ev[512];
    } new_plan;
    char (*assumed)[128]; /* pods put into the busy store before their creation (assume_pods) */
    int n_assumed;
    struct { /* side_writes_start */
        pthread_t th;
        bool started, service;
        kube_client *k;
        int rc;
        err_t err;
    } side;
} rec_ctx;

/* The job's usable GPUs for this reconcile, no maxGPUs cap (job_inv); free_only: less those that
 * the pods of x->busy hold for others. */
static const job_inv *job_inv_of(rec_ctx *x, bool free_only) {
    job_inv *j = free_only ? &x->inv_free : &x->inv_all;
    if (!j->built) {
        const cache_view *bv = &x->busy_view;
        const inv_held **held = NULL; /* the busy store's digests, when it makes them (main.c) */
        if (free_only && bv->digested) {
            held = xmalloc((size_t)(bv->n + 1) * sizeof *held);
            for (int i = 0; i < bv->n; i++) held[i] = cache_view_digest(bv, i);
        }
        j->rc = job_cluster(x->c, x->nodes, x->spec, free_only && !held ? get(x->busy, "items") : NULL, held,
                            held ? bv->n : 0, kube_meta_str(x->job, "uid"), &j->cl, &j->r, &j->err);
        free(held);
        j->built = true;
    }
    return j;
}

/* Admissions take turns. main.c's workers reconcile several jobs at once, and a job's decision,
 * from reading the free GPUs to holding them, must see every admission before it, or two jobs
 * would book the same GPU. The lock covers that decision (reads of the stores, planning, the plan
 * ConfigMap) and ends once the pods to create are in the busy store as assumed; the writes that
 * follow (Service, pods, status) run beside other jobs'. */
static pthread_mutex_t rec_admit_mu = PTHREAD_MUTEX_INITIALIZER;
#define REC_ASSUMED_RV "0" /* an assumed pod's resourceVersion: older than any the API gives */
#define REC_BLAME_SETTLE_S 3.0 /* how long a failure's blame waits for the rest of its gang */

static void admit_unlock(rec_ctx *x) {
    if (!x->admitting) return;
    x->admitting = false;
    pthread_mutex_unlock(&rec_admit_mu);
}

static cJSON *status_base(rec_ctx *x, const char *phase, const char *msg);

/* Writes the job's status (taking it) unless it is what the store has already: a reconcile that
 * changes nothing sends nothing. The PUT carries the stored resourceVersion; when someone wrote
 * since (409) the job is read again and the status put on that. The answer goes into the store,
 * and the watch event it causes does not reconcile the job again (main.c: only spec changes do). */
static int write_status(rec_ctx *x, cJSON *status, err_t *err) {
    const cJSON *old = get(x->job, "status");
    if (old && cJSON_Compare(old, status, true)) return cJSON_Delete(status), 0;
    cJSON *obj = cJSON_Duplicate(x->job, true), *out = NULL;
    cJSON_DeleteItemFromObjectCaseSensitive(obj, "status");
    cJSON_AddItemToObject(obj, "status", status);
    long st = 0;
    int rc = kube_replace_status(x->k, x->job_path, obj, &out, &st, err);
    if (rc < 0 && st == 409) {
        status_arg a = {cJSON_GetObjectItemCaseSensitive(obj, "status")};
        rc = kube_update_retry(x->k, x->job_path, true, 5, status_mutate, &a, &out, &st, err);
    }
    cJSON_Delete(obj);
    if (rc == 0 && out) cache_put(x->c->caches->jobs, out, NULL);
    cJSON_Delete(out);
    return rc < 0 && st == 404 ? 0 : rc; /* 404: deleted meanwhile */
}

/* Drops the job's planning, if any (cancelled when it runs): the job is gone, finished, suspended. */
static void forget_plan(const rec_ctx *x) {
    if (x->c->planner) planning_forget(x->c->planner, x->key);
}

static bool is_job_pod(const cJSON *pod, void *arg) {
    const rec_ctx *x = arg;
    return !strcmp(get_str(get(pod, "metadata"), "namespace", ""), x->ns) &&
           !strcmp(get_str(get(get(pod, "metadata"), "labels"), REC_LABEL_JOB, ""), x->name);
}

/* The job's pods (label cephalo.dev/job=NAME, every phase) from the store, as a PodList of the
 * stored objects (read-only; cache_view_release). */
static cJSON *job_pods(rec_ctx *x, cache_view *v) { return cache_view_list(x->c->caches->pods, is_job_pod, x, v); }

static const cJSON *find_node(const cJSON *nodes, const char *name) {
    const cJSON *n;
    cJSON_ArrayForEach(n, get(nodes, "items"))
        if (name && strcmp(get_str(get(n, "metadata"), "name", ""), name) == 0) return n;
    return NULL;
}

static const char *pod_phase(const cJSON *pod) { return get_str(get(pod, "status"), "phase", "Pending"); }
static bool pod_finished(const cJSON *pod) {
    return !strcmp(pod_phase(pod), "Succeeded") || !strcmp(pod_phase(pod), "Failed");
}

/* Deletes a pod: gracefully (the worker gets SIGTERM), once. At once (gracePeriodSeconds=0) when
 * no kubelet can finish that: its Node is gone, or not Ready and the grace period is over. Its
 * name is needed for the next gang. */
static int delete_pod(rec_ctx *x, const cJSON *pod, err_t *err) {
    char path[KUBE_PATH_MAX + 32];
    long status = 0;
    const char *bound = get_str(get(pod, "spec"), "nodeName", NULL);
    const cJSON *node = x->nodes ? find_node(x->nodes, bound) : NULL;
    double due = 0; /* the API sets deletionTimestamp to the request time plus the grace period */
    bool overdue = kube_time_parse(get_str(get(pod, "metadata"), "deletionTimestamp", ""), &due) && kube_time_now_s() >= due;
    /* an unbound pod is no orphan: the API server deletes it at once by itself, and if the
     * scheduler bound it meanwhile, its worker gets the graceful stop */
    bool orphan = x->nodes && bound && (!node || (!inv_node_ready(node) && overdue));
    if (get(get(pod, "metadata"), "deletionTimestamp") && !orphan) return 0; /* on its way */
    if (kube_path(path, KUBE_PATH_MAX, "v1", x->ns, "pods", kube_meta_str(pod, "name"), err) < 0) return -1;
    if (orphan) strcat(path, "?gracePeriodSeconds=0");
    if (kube_delete(x->k, path, &status, err) < 0 && status != 404) return -1;
    if (x->st) x->st->pods_deleted++;
    return 0;
}

/* Deletes the job's pods: all of them, or those still running (keep_finished: their logs and
 * exit codes stay for `kubectl logs`, as a Job's do). */
static int delete_pods(rec_ctx *x, const cJSON *pods, bool keep_finished, err_t *err) {
    const cJSON *pod;
    cJSON_ArrayForEach(pod, get(pods, "items")) {
        if (keep_finished && pod_finished(pod)) continue;
        if (delete_pod(x, pod, err) < 0) return -1;
    }
    return 0;
}

static int suspend_job(rec_ctx *x, err_t *err) {
    cache_view v;
    cJSON *pods = job_pods(x, &v);
    int rc = delete_pods(x, pods, false, err);
    cache_view_release(&v);
    if (rc < 0) return -1;
    cJSON *s = status_base(x, "Suspended", "spec.suspend is true: no worker pods");
    cJSON *conds = cJSON_GetObjectItemCaseSensitive(s, "conditions");
    condition(conds, x->old, x->gen, "Created", true, "Created", "the job was accepted by the operator");
    condition(conds, x->old, x->gen, "Suspended", true, "Suspended", "spec.suspend is true");
    return write_status(x, s, err);
}

static const cJSON *find_condition(const cJSON *status, const char *type) {
    const cJSON *c;
    cJSON_ArrayForEach(c, get(status, "conditions"))
        if (!strcmp(get_str(c, "type", ""), type)) return c;
    return NULL;
}

/* Terminal: Succeeded, or Failed after the backoff limit. Plan failures are not terminal: a
 * change of the job or of the Nodes plans it again. */
static bool terminal(const cJSON *status) {
    const char *ph = get_str(status, "phase", "");
    if (!strcmp(ph, "Succeeded")) return true;
    const cJSON *f = find_condition(status, "Failed");
    return !strcmp(ph, "Failed") && f && !strcmp(get_str(f, "reason", ""), "BackoffLimitExceeded");
}

/* Whether obj's controller is this job (by uid), or it has no owner we know of. */
static bool owned_by_job(const cJSON *obj, const cJSON *job) {
    const char *uid = kube_meta_str(job, "uid");
    const cJSON *o;
    cJSON_ArrayForEach(o, get(get(obj, "metadata"), "ownerReferences"))
        if (cJSON_IsTrue(get(o, "controller")) && !strcmp(get_str(o, "kind", ""), "CephaloJob"))
            return uid && !strcmp(get_str(o, "uid", ""), uid);
    return true;
}

/* Objects of an earlier CephaloJob of the same name (deleted, then applied again before the
 * garbage collector removed them) must not be taken over: the plan ConfigMap, Service and pods
 * owned by another uid are deleted, and the job waits until they are gone. 1 when there were
 * some, 0 when none, -1 on an API error. */
static int clear_foreign(rec_ctx *x, err_t *err) {
    char path[KUBE_PATH_MAX];
    cJSON *svc = NULL;
    long status = 0;
    int found = 0;
    if (x->cm && !owned_by_job(x->cm, x->job)) {
        found = 1;
        if (kube_path(path, sizeof path, "v1", x->ns, "configmaps", x->cm_name, err) < 0 ||
            (kube_delete(x->k, path, &status, err) < 0 && status != 404))
            return -1;
    }
    if (kube_path(path, sizeof path, "v1", x->ns, "services", x->name, err) < 0) return -1;
    if (!(svc = cache_get(x->c->caches->services, x->ns, x->name))) {
        /* none (of ours: the store holds the jobs' labelled Services) */
    } else if (owned_by_job(svc, x->job)) {
        x->have_service = true;
    } else {
        found = 1;
        if (kube_delete(x->k, path, &status, err) < 0 && status != 404) return cJSON_Delete(svc), -1;
    }
    cJSON_Delete(svc);
    const cJSON *pod;
    cJSON_ArrayForEach(pod, get(x->pods, "items")) {
        if (owned_by_job(pod, x->job)) continue;
        found = 1;
        if (delete_pod(x, pod, err) < 0) return -1;
    }
    return found;
}

/* The plan id: the generation it was made for and a hash of plan.json. Pods carry it. */
static void plan_id_of(double gen, const char *plan_json, char *out, size_t n) {
    uint64_t h = fnv1a(FNV_OFFSET, plan_json, strlen(plan_json));
    snprintf(out, n, "g%.0f-%08llx", gen, (unsigned long long)(h & 0xffffffffULL));
}

static bool live_phase(const char *ph) {
    return !strcmp(ph, "Planned") || !strcmp(ph, "Running") || !strcmp(ph, "Restarting");
}

/* The job cannot be planned: phase Failed with the reason (a Warning Event once per message), no
 * pods. Not terminal: a new generation or other GPUs plan it again. 0, or -1 on an API error. */
static int plan_failed(rec_ctx *x, const char *reason, const char *why, err_t *err) {
    char msg[1100];
    snprintf(msg, sizeof msg, "%s", why);
    /* the planner's hint for the CLI; the operator takes built-in names only */
    char *hint = strstr(msg, " (or give a model file path)");
    if (hint) *hint = '\0';
    if (strcmp(get_str(x->old, "phase", ""), "Failed") != 0 || strcmp(get_str(x->old, "message", ""), msg) != 0) {
        /* counted once per distinct failure: a failed job is reconciled again and again */
        emit(x->k, x->job, "Warning", reason, msg);
        if (x->st) x->st->plan_failures++, x->st->plan_timeouts += !strcmp(reason, "PlanningTimeout");
        if (x->st && strcmp(get_str(x->old, "phase", ""), "Failed") != 0) x->st->jobs_failed++;
    }
    if (delete_pods(x, x->pods, false, err) < 0) return -1;
    cJSON *s = status_base(x, "Failed", msg);
    cJSON *conds = cJSON_GetObjectItemCaseSensitive(s, "conditions");
    condition(conds, x->old, x->gen, "Created", true, "Created", "the job was accepted by the operator");
    condition(conds, x->old, x->gen, "Planned", false, reason, msg);
    condition(conds, x->old, x->gen, "Failed", true, reason, msg);
    return write_status(x, s, err);
}

/* A planning thread works on the job: the status says so (condition Planned False, reason
 * Planning). A live job keeps its phase, conditions and plan summary: its gang runs on the old
 * plan until the new one is ready. Others are Created. */
static int plan_pending(rec_ctx *x, const char *msg, err_t *err) {
    const char *ph = get_str(x->old, "phase", "");
    bool live = live_phase(ph) || !strcmp(ph, "Queued"); /* a queued job stays in the queue meanwhile */
    cJSON *s = status_base(x, live ? ph : "Created", msg);
    cJSON *conds = cJSON_GetObjectItemCaseSensitive(s, "conditions");
    const cJSON *oc, *old_conds = live ? get(x->old, "conditions") : NULL;
    bool planned = false;
    if (!live) condition(conds, x->old, x->gen, "Created", true, "Created", "the job was accepted by the operator");
    cJSON_ArrayForEach(oc, old_conds) {
        if (strcmp(get_str(oc, "type", ""), "Planned") != 0) {
            cJSON_AddItemToArray(conds, cJSON_Duplicate(oc, true));
            continue;
        }
        condition(conds, x->old, x->gen, "Planned", false, "Planning", msg); /* in its place */
        planned = true;
    }
    if (!planned) condition(conds, x->old, x->gen, "Planned", false, "Planning", msg);
    if (live && get(x->old, "plan")) cJSON_AddItemToObject(s, "plan", cJSON_Duplicate(get(x->old, "plan"), true));
    return write_status(x, s, err);
}

#define REC_PLAN_WAIT_S 0.25 /* how long the loop waits for a new plan before it moves on */

/* The job planned for generation gen_s on GPUs fp, off the loop (planning.h). 1 with *tp, the
 * finished task (its rc < 0: the job cannot be planned), owned by the pool unless *own; 0 while a
 * planning thread works on it (the status says so; the pool queues the job again when it is
 * done); -1 on an API error. Most plans take milliseconds and are waited for here. */
static int obtain_plan(rec_ctx *x, const char *gen_s, const char *fp, plan_task **tp, bool *own, err_t *err) {
    planning *pool = x->c->planner;
    plan_task *t = xcalloc(1, sizeof *t);
    t->budget_s = x->c->plan_timeout_s;
    *tp = NULL, *own = false;
    int prc = plan_prepare(x->k, x->c, x->job, job_inv_of(x, x->on_free), x->cap, t, err);
    if (prc == -2) {
        plan_task_free(t);
        return -1;
    }
    if (prc < 0 || !pool) { /* the job's problem is known at once (or there is no pool) */
        if (x->st) x->st->plans++;
        if (prc < 0) t->rc = -1, snprintf(t->msg, sizeof t->msg, "%s", err->msg);
        else plan_solve(t, NULL);
        if (pool) planning_forget(pool, x->key); /* a planning for an older spec is of no use */
        *tp = t, *own = true;
        return 1;
    }
    char id[PLANNING_ID_MAX], msg[512];
    snprintf(id, sizeof id, "%s|%s|%s", gen_s, fp, t->profile_rv);
    snprintf(msg, sizeof msg, "%splanning globalBatch %ld on %d GPUs (strategy %s, at most %g s)",
             live_phase(get_str(x->old, "phase", "")) ? "re-" : "", t->o.batch, t->in.cl.n_devices,
             strategy_name(t->strat), t->budget_s);
    void *done = NULL;
    planning_state st = planning_get(pool, x->key, id, &done);
    if (st == PLANNING_NONE) {
        if (x->st) x->st->plans++;
        planning_submit(pool, x->key, id, t, plan_solve, plan_task_free);
        planning_wait(pool, x->key, REC_PLAN_WAIT_S);
        st = planning_get(pool, x->key, id, &done);
    } else {
        plan_task_free(t); /* the pool has this one already, planned or being planned */
    }
    if (st != PLANNING_DONE) return plan_pending(x, msg, err) < 0 ? -1 : 0;
    *tp = done;
    return 1;
}

/* ---- GPU accounting and admission ---------------------------------------------------------- */

/* How many GPUs of node are free to the job (its own pods' count as free), no maxGPUs cap. */
static int free_on(rec_ctx *x, const char *node) {
    const cluster *cl = &job_inv_of(x, true)->cl;
    int n = 0;
    for (int d = 0; d < cl->n_devices; d++) n += !strcmp(cl->nodes[cl->devices[d].node].name, node);
    return n;
}

/* Whether every rank of the plan has a free GPU on its node. */
static bool plan_fits(rec_ctx *x, const cJSON *plan_doc) {
    const cJSON *r, *q;
    cJSON_ArrayForEach(r, get(plan_doc, "ranks")) {
        const char *node = get_str(r, "node", "");
        int on = 0;
        cJSON_ArrayForEach(q, get(plan_doc, "ranks")) on += !strcmp(get_str(q, "node", ""), node);
        if (on > free_on(x, node)) return false;
    }
    return true;
}

/* Whether a pod of the plan's current gang has ended (Succeeded or Failed): its GPUs are free
 * for others, maybe taken already, but the job must first see it through (finish, or count the
 * failure against backoffLimit and restart) on the plan it ran. */
static bool gang_ended(const rec_ctx *x, const char *plan_id) {
    char att[32];
    snprintf(att, sizeof att, "%d", x->attempt);
    const cJSON *pod;
    cJSON_ArrayForEach(pod, get(x->pods, "items")) {
        const cJSON *ann = get(get(pod, "metadata"), "annotations");
        if (pod_finished(pod) && !strcmp(get_str(ann, REC_ANN_PLAN_ID, ""), plan_id) &&
            !strcmp(get_str(ann, REC_ANN_ATTEMPT, ""), att) && owned_by_job(pod, x->job))
            return true;
    }
    return false;
}

/* A plan that still fits is kept when other GPUs free up or get busy (re-planning restarts the
 * gang); the job grows onto more free GPUs at most once per spec.elastic.minReplanSeconds since it
 * was planned, so that churn does not thrash it. */
static bool keep_plan(rec_ctx *x, const cJSON *ann, const cJSON *plan_doc) {
    if (!plan_fits(x, plan_doc)) return false;
    if (x->picked <= cJSON_GetArraySize(get(plan_doc, "ranks"))) return true;
    double at = 0, min_s = get_num(get(x->spec, "elastic"), "minReplanSeconds", REC_MIN_REPLAN_S);
    if (!kube_time_parse(get_str(ann, REC_ANN_PLANNED_AT, ""), &at)) at = 0; /* older plans: long ago */
    double wait = min_s - (kube_time_now_s() - at);
    if (wait <= 0) return false;
    if (x->st && (x->st->requeue_s <= 0 || wait < x->st->requeue_s)) x->st->requeue_s = wait;
    return true;
}

/* Which GPUs the job is planned on (x->on_free) and how many it needs (x->need): its free GPUs when
 * at least `need` are free (it plans around busy ones), else all its usable GPUs, busy or not (the
 * plan it waits for). 1; 0 when it can never start (Failed, written); -1 on an API error. */
static int choose_view(rec_ctx *x, err_t *err) {
    const cJSON *gpus = get(x->spec, "gpus");
    int min = (int)get_num(gpus, "minGPUs", 0), max = (int)get_num(gpus, "maxGPUs", 0);
    char msg[700];
    if (min > 0 && max > 0 && min > max) {
        snprintf(msg, sizeof msg, "spec.gpus.minGPUs %d is more than spec.gpus.maxGPUs %d (expected minGPUs <= maxGPUs)",
                 min, max);
        return plan_failed(x, "InvalidSpec", msg, err) < 0 ? -1 : 0;
    }
    x->cap = max > 0 ? max : 0;
    x->on_free = true;
    /* the free GPUs' inventory counts every usable one too (inv_result.usable): the whole one is
     * built only when the job must be planned on it, or for a message */
    const job_inv *mine = job_inv_of(x, true);
    if (mine->rc < 0) return 1; /* no usable GPU: planning says why */
    int usable = mine->r.usable;
    x->need = min > 0 ? min : x->cap > 0 && x->cap < usable ? x->cap : usable;
    if (x->need > usable) {
        char types[256];
        inv_describe(&job_inv_of(x, false)->cl, types, sizeof types);
        snprintf(msg, sizeof msg, "spec.gpus.minGPUs %d is more than the %d GPUs the job may use in the cluster (%s): it "
                 "can never start (lower minGPUs, or widen spec.gpus)", min, usable, types);
        return plan_failed(x, "InsufficientGPUs", msg, err) < 0 ? -1 : 0;
    }
    x->picked = inv_view_devices(mine, x->cap);
    if (x->picked < x->need) x->on_free = false;
    return 1;
}

/* "2 L4, 1 A10G": the plan's GPUs by type, for messages. */
static void plan_types(const cJSON *plan_doc, char *out, size_t n) {
    const cJSON *ranks = get(plan_doc, "ranks"), *r, *q;
    int i = 0;
    out[0] = '\0';
    cJSON_ArrayForEach(r, ranks) {
        const char *dev = get_str(r, "device", "?");
        int count = 0, j = 0;
        bool seen = false;
        cJSON_ArrayForEach(q, ranks) {
            bool same = !strcmp(get_str(q, "device", "?"), dev);
            if (same && j < i) seen = true;
            count += same;
            j++;
        }
        i++;
        size_t len = strlen(out);
        if (!seen) snprintf(out + len, n - len, "%s%d %s", len ? ", " : "", count, dev);
    }
}

static bool job_before(const cJSON *a, const cJSON *b) {
    double pa = get_num(get(a, "spec"), "priority", 0), pb = get_num(get(b, "spec"), "priority", 0);
    if (pa != pb) return pa > pb;
    const cJSON *ma = get(a, "metadata"), *mb = get(b, "metadata");
    int c = strcmp(get_str(ma, "creationTimestamp", ""), get_str(mb, "creationTimestamp", ""));
    if (!c) c = strcmp(get_str(ma, "namespace", ""), get_str(mb, "namespace", ""));
    if (!c) c = strcmp(get_str(ma, "name", ""), get_str(mb, "name", ""));
    return c < 0;
}

/* Whether another job may use (by its spec.gpus) a node of this job's plan. */
static bool shares_nodes(rec_ctx *x, const cJSON *other) {
    cluster cl;
    inv_result r;
    err_t e;
    if (job_cluster(x->c, x->nodes, get(other, "spec"), NULL, NULL, 0, NULL, &cl, &r, &e) < 0) return false;
    bool shared = false;
    const cJSON *rank;
    cJSON_ArrayForEach(rank, get(x->plan_doc, "ranks"))
        for (int i = 0; i < cl.n_nodes && !shared; i++) shared = !strcmp(cl.nodes[i].name, get_str(rank, "node", ""));
    cluster_free(&cl);
    return shared;
}

/* A job with an earlier claim on GPUs of this job's plan: one ahead of it in the queue (Queued,
 * higher spec.priority, else created earlier) that may use the same nodes, so that a later job
 * does not take GPUs an earlier one waits for; or an admitted one restarting its gang there
 * (between its old pods' end and its new pods' creation its GPUs look free). Whether there is
 * one, with `who` set. Among the jobs the operator watches: an operator of one namespace (chart
 * value watchNamespace) queues that namespace's. */
static bool queue_blocker(rec_ctx *x, char *who, size_t n) {
    cache_view v;
    const cJSON *jobs = cache_view_list(x->c->caches->jobs, NULL, NULL, &v);
    const char *uid = kube_meta_str(x->job, "uid");
    const cJSON *j;
    bool found = false;
    cJSON_ArrayForEach(j, get(jobs, "items")) {
        const cJSON *st = get(j, "status"), *ad = find_condition(st, "Admitted");
        const char *ph = get_str(st, "phase", "");
        if ((uid && !strcmp(get_str(get(j, "metadata"), "uid", ""), uid)) || get(get(j, "metadata"), "deletionTimestamp") ||
            cJSON_IsTrue(get(get(j, "spec"), "suspend")))
            continue;
        bool ahead = !strcmp(ph, "Queued") && job_before(j, x->job);
        bool restarting = !strcmp(ph, "Restarting") && ad && !strcmp(get_str(ad, "status", ""), "True");
        if ((!ahead && !restarting) || !shares_nodes(x, j)) continue;
        if (ahead)
            snprintf(who, n, "queued behind CephaloJob %s/%s (priority %.0f, created %s), which waits for GPUs "
                     "this job would take", kube_meta_str(j, "namespace"), kube_meta_str(j, "name"),
                     get_num(get(j, "spec"), "priority", 0), get_str(get(j, "metadata"), "creationTimestamp", "?"));
        else
            snprintf(who, n, "waiting for CephaloJob %s/%s to restart its gang on GPUs this job would take",
                     kube_meta_str(j, "namespace"), kube_meta_str(j, "name"));
        found = true;
        break;
    }
    cache_view_release(&v);
    return found;
}

static int queue_job(rec_ctx *x, const char *msg, err_t *err);

/* The plan was made; may its gang run? A job that holds its GPUs (a live one whose plan still fits,
 * or whose gang has ended and must be seen through) goes on; another is admitted when every GPU of
 * its plan is free (all or nothing: a partial gang never starts) and no job has an earlier claim
 * on them. 1 admitted; 0 queued (status written); -1 on an API error. */
static int admit(rec_ctx *x, err_t *err) {
    bool live = live_phase(get_str(x->old, "phase", ""));
    int world = cJSON_GetArraySize(get(x->plan_doc, "ranks"));
    char msg[1200], types[256] = "";
    if (live && gang_ended(x, x->plan_id)) return 1;
    if (plan_fits(x, x->plan_doc)) {
        if (live) return 1;
        return queue_blocker(x, msg, sizeof msg) ? queue_job(x, msg, err) : 1;
    }
    plan_types(x->plan_doc, types, sizeof types);
    int nfree = job_inv_of(x, true)->cl.n_devices;
    if (x->need < world)
        snprintf(msg, sizeof msg, "needs %d GPUs (%s) of its plan, or at least %d (spec.gpus.minGPUs) of them free; %d free",
                 world, types, x->need, nfree);
    else
        snprintf(msg, sizeof msg, "needs %d GPUs (%s) of its plan; %d free", world, types, nfree);
    return queue_job(x, msg, err);
}

/* Writes the plan current_plan made (x->new_plan) into the plan ConfigMap and records its Event,
 * after the admission lock: 0, or -1 on an API error (the pool keeps the plan for the retry). */
static int commit_plan(rec_ctx *x, kube_client *k, err_t *err) {
    if (!x->new_plan.json) return 0;
    if (write_configmap(k, x->c->caches->configmaps, x->job, x->cm, x->cm_name, x->new_plan.json,
                        &(cm_annotations){x->new_plan.gen, x->new_plan.fp, x->plan_id, x->notes}, err) < 0)
        return -1;
    if (x->new_plan.forget) planning_forget(x->c->planner, x->key); /* the ConfigMap has it now */
    if (x->new_plan.ev_reason) emit(k, x->job, "Normal", x->new_plan.ev_reason, x->new_plan.ev);
    free(x->new_plan.json);
    x->new_plan.json = NULL;
    return 0;
}

/* commit_plan, then the Service unless it exists. */
static int commit_objects(rec_ctx *x, kube_client *k, bool service, err_t *err) {
    if (commit_plan(x, k, err) < 0) return -1;
    if (!service) return 0;
    return ensure_service(k, x->c->caches->services, x->job, (long)get_num(x->spec, "metricsPort", 9400), err);
}

/* A new job's plan ConfigMap (with its Event) and Service, written by a thread of their own on the
 * last helper client while the reconcile creates the pods: its objects cost one round trip, not
 * four in a row. Only when no plan ConfigMap exists yet: a kubelet then waits for it before it
 * starts a pod, whereas pods of a re-plan created before the ConfigMap's update could read the
 * old plan (those wait for commit_plan). */
static void *side_writes_main(void *arg) {
    rec_ctx *x = arg;
    x->side.rc = commit_objects(x, x->side.k, x->side.service, &x->side.err);
    return NULL;
}

/* Writes the plan ConfigMap, its Event and the Service (those missing): beside the pods for a new
 * job with a helper client to spare (side_writes_main), else here. 0, or -1 on an API error. */
static int side_writes_start(rec_ctx *x, err_t *err) {
    bool service = !x->have_service;
    if (!x->cm && x->new_plan.json && x->n_helpers > 1) {
        x->side.k = x->helpers[--x->n_helpers]; /* create_pods uses the others */
        x->side.service = service;
        if (pthread_create(&x->side.th, NULL, side_writes_main, x) == 0) {
            x->side.started = true;
            return 0;
        }
        x->n_helpers++;
    }
    return commit_objects(x, x->k, service, err);
}

/* Waits for side_writes_main, if it runs: rc, or -1 with err set when rc was fine and it failed. */
static int side_writes_join(rec_ctx *x, int rc, err_t *err) {
    if (!x->side.started) return rc;
    pthread_join(x->side.th, NULL);
    x->side.started = false;
    x->n_helpers++;
    if (x->side.rc < 0 && rc >= 0) {
        *err = x->side.err;
        return -1;
    }
    return rc;
}

/* The plan to run: the ConfigMap's when it was made for this generation and these GPUs, else a
 * new one (obtain_plan), written there by commit_plan once the admission lock is released. 1 with
 * x->plan_doc set; 0 when the job cannot be planned (its status is written Failed, its pods
 * deleted) or is being planned; -1 on an API error. */
static int current_plan(rec_ctx *x, err_t *err) {
    char gen_s[32], fp[64];
    const cJSON *cm = x->cm;
    snprintf(gen_s, sizeof gen_s, "%.0f", x->gen);
    inventory_fingerprint(job_inv_of(x, x->on_free), x->cap, fp, sizeof fp);
    const cJSON *ann = get(get(cm, "metadata"), "annotations");
    const char *cm_plan = get_str(get(cm, "data"), "plan.json", NULL);
    const char *cm_gen = get_str(ann, REC_ANN_GENERATION, ""), *cm_fp = get_str(ann, REC_ANN_INVENTORY, "");
    if (cm_plan && !strcmp(cm_gen, gen_s)) {
        x->plan_doc = json_parse(x->cm_name, cm_plan, strlen(cm_plan), err);
        if (x->plan_doc && (!strcmp(cm_fp, fp) || gang_ended(x, get_str(ann, REC_ANN_PLAN_ID, "")) ||
                            keep_plan(x, ann, x->plan_doc))) {
            snprintf(x->plan_id, sizeof x->plan_id, "%s", get_str(ann, REC_ANN_PLAN_ID, ""));
            snprintf(x->notes, sizeof x->notes, "%s", get_str(ann, REC_ANN_NOTES, ""));
            snprintf(x->profile, sizeof x->profile, "%s", get_str(get(x->old, "plan"), "profile", ""));
            x->estimated = cJSON_IsTrue(get(get(x->old, "plan"), "estimated"));
            return 1;
        }
        if (!x->plan_doc) log_warn("%s/%s: %s; planning again", x->ns, x->name, err->msg);
        cJSON_Delete(x->plan_doc);
        x->plan_doc = NULL;
    }

    plan_task *t;
    bool own;
    int rc = obtain_plan(x, gen_s, fp, &t, &own, err);
    if (rc <= 0) return rc;
    if (t->rc < 0) {
        rc = plan_failed(x, t->out.reason, t->msg, err) < 0 ? -1 : 0;
        goto out; /* the pool keeps the failure: nothing is planned again until the inputs change */
    }
    const plan_out *po = &t->out;
    rc = -1;
    /* a job with a gang (or one being started) restarts on the new plan; a suspended or failed
     * one is just planned */
    bool replan = cm_plan && live_phase(get_str(x->old, "phase", ""));
    plan_id_of(x->gen, po->json, x->plan_id, sizeof x->plan_id);
    x->estimated = po->estimated;
    snprintf(x->notes, sizeof x->notes, "%s", po->notes);
    snprintf(x->profile, sizeof x->profile, "%s", po->profile);
    const char *old_id = get_str(ann, REC_ANN_PLAN_ID, "");
    x->plan_doc = json_parse(x->cm_name, po->json, strlen(po->json), err);
    if (!x->plan_doc) goto out;
    x->new_plan.json = xstrdup(po->json);
    snprintf(x->new_plan.gen, sizeof x->new_plan.gen, "%s", gen_s);
    snprintf(x->new_plan.fp, sizeof x->new_plan.fp, "%s", fp);
    x->new_plan.forget = !own;
    if (!cm && x->st) x->st->jobs_created++;
    int world = cJSON_GetArraySize(get(x->plan_doc, "ranks"));
    double sps = get_num(get(x->plan_doc, "predicted"), "samples_per_s", 0);
    if (replan && strcmp(old_id, x->plan_id) != 0) {
        if (x->st) x->st->replans++;
        snprintf(x->new_plan.ev, sizeof x->new_plan.ev, "re-planned on %d GPUs (%s), predicted %.2f samples/s; the "
                 "gang restarts from the last checkpoint", world, strcmp(cm_gen, gen_s) ? "the spec changed"
                 : "the usable GPUs changed", sps);
        x->new_plan.ev_reason = "Replanned";
        snprintf(x->why, sizeof x->why, "%s", x->new_plan.ev);
    } else if (strcmp(old_id, x->plan_id) != 0) {
        snprintf(x->new_plan.ev, sizeof x->new_plan.ev, "planned %d GPUs, predicted %.2f samples/s (%.300s)", world,
                 sps, *x->profile ? x->profile : "analytic estimates");
        x->new_plan.ev_reason = "Planned";
    }
    rc = 1;
out:
    if (own) plan_task_free(t);
    return rc;
}

/* The pods of the job sorted out against the current plan and gang attempt. */
typedef struct gang {
    const cJSON *list; /* PodList (the context's) */
    int world;
    const cJSON **pod; /* [world]: the current gang's pod of each rank, or NULL */
    int stale; /* pods of an older plan or attempt */
    int pending, running, succeeded, failed, missing;
    const cJSON *first_failed;
    const cJSON *first_stuck; /* a pending pod whose container waits for a reason (ImagePullBackOff...) */
    const cJSON *disrupted; /* a pod of the gang being deleted by someone else (eviction, drain, by hand) */
    const cJSON *unschedulable; /* a pod of the gang the scheduler cannot place (its GPU was taken) */
    int failed_hard; /* failed pods that were not stopped on request (exit code 143: worker/main.c) */
} gang;

static void gang_free(gang *g) { free(g->pod); }

static const cJSON *terminated_state(const cJSON *pod) {
    const cJSON *cs = cJSON_GetArrayItem(get(get(pod, "status"), "containerStatuses"), 0);
    return get(get(cs, "state"), "terminated");
}

/* The container's waiting state when it has a reason worth reporting (not plain creation). */
static const cJSON *waiting_state(const cJSON *pod) {
    const cJSON *cs = cJSON_GetArrayItem(get(get(pod, "status"), "containerStatuses"), 0);
    const cJSON *w = get(get(cs, "state"), "waiting");
    const char *reason = get_str(w, "reason", NULL);
    return reason && strcmp(reason, "ContainerCreating") != 0 ? w : NULL;
}

/* Which failure to blame when several workers failed: the one that ended first (its peers
 * then fail on the broken collective), and on a tie a death by signal (exit code > 128: killed,
 * out of memory) before an exit the worker chose. */
static bool failed_earlier(const cJSON *a, const cJSON *b) {
    const cJSON *ta = terminated_state(a), *tb = terminated_state(b);
    double fa = 1e300, fb = 1e300;
    if (ta) kube_time_parse(get_str(ta, "finishedAt", ""), &fa);
    if (tb) kube_time_parse(get_str(tb, "finishedAt", ""), &fb);
    if (fa != fb) return fa < fb;
    return get_num(ta, "exitCode", 0) > 128 && get_num(tb, "exitCode", 0) <= 128;
}

/* Not bound, and the scheduler said why: PodScheduled False, reason Unschedulable. */
static bool pod_unschedulable(const cJSON *pod) {
    const cJSON *c = find_condition(get(pod, "status"), "PodScheduled");
    return !get_str(get(pod, "spec"), "nodeName", NULL) && c && !strcmp(get_str(c, "status", ""), "False") &&
           !strcmp(get_str(c, "reason", ""), "Unschedulable");
}

static int gang_read(rec_ctx *x, gang *g, err_t *err) {
    memset(g, 0, sizeof *g);
    g->world = cJSON_GetArraySize(get(x->plan_doc, "ranks"));
    g->pod = calloc((size_t)g->world + 1, sizeof *g->pod);
    if (!g->pod) return err_set(err, "out of memory");
    g->list = x->pods;
    char att[32];
    snprintf(att, sizeof att, "%d", x->attempt);
    const cJSON *pod;
    cJSON_ArrayForEach(pod, get(g->list, "items")) {
        const cJSON *ann = get(get(pod, "metadata"), "annotations");
        const char *rank_s = get_str(get(get(pod, "metadata"), "labels"), REC_LABEL_RANK, "");
        char *end;
        long rank = strtol(rank_s, &end, 10);
        bool current = owned_by_job(pod, x->job) && !strcmp(get_str(ann, REC_ANN_PLAN_ID, ""), x->plan_id) &&
                       !strcmp(get_str(ann, REC_ANN_ATTEMPT, ""), att) && *rank_s && !*end &&
                       rank >= 0 && rank < g->world;
        if (!current) {
            g->stale++;
            continue;
        }
        if (get(get(pod, "metadata"), "deletionTimestamp") && !pod_finished(pod)) {
            if (!g->disrupted) g->disrupted = pod;
            continue;
        }
        g->pod[rank] = pod;
        const char *ph = pod_phase(pod);
        if (!strcmp(ph, "Running")) g->running++;
        else if (!strcmp(ph, "Succeeded")) g->succeeded++;
        else if (!strcmp(ph, "Failed")) {
            g->failed++;
            const cJSON *term = terminated_state(pod);
            if (!term || get_num(term, "exitCode", 0) != EXIT_STOPPED) g->failed_hard++;
            if (!g->first_failed || failed_earlier(pod, g->first_failed)) g->first_failed = pod;
        } else {
            g->pending++;
            if (!g->first_stuck && waiting_state(pod)) g->first_stuck = pod;
            if (!g->unschedulable && pod_unschedulable(pod)) g->unschedulable = pod;
        }
    }
    for (int r = 0; r < g->world; r++) g->missing += !g->pod[r];
    return 0;
}

/* The node of a pod for messages: bound, its node; not yet, the node its affinity names (by its
 * hostname label: the Node's name when it is among x->nodes); else "?". */
static const char *pod_node(const rec_ctx *x, const cJSON *pod) {
    const cJSON *n;
    if (get_str(get(pod, "spec"), "nodeName", NULL)) return get_str(get(pod, "spec"), "nodeName", "?");
    cJSON_ArrayForEach(n, get(x->nodes, "items"))
        if (inv_pod_on_node(pod, n)) return kube_meta_str(n, "name");
    return inv_pod_node(pod) ? inv_pod_node(pod) : "?";
}

/* "pod tiny-1 (rank 1 on gpu-a) failed: exit code 137 (Error)" */
static void describe_failure(const cJSON *pod, const char *node, char *out, size_t n) {
    const cJSON *st = get(pod, "status"), *term = terminated_state(pod);
    int len = snprintf(out, n, "pod %s (rank %s on %s) failed", kube_meta_str(pod, "name"),
                       get_str(get(get(pod, "metadata"), "labels"), REC_LABEL_RANK, "?"),
                       node);
    if (len < 0 || (size_t)len >= n) return;
    if (term) {
        /* the container's last log line (terminationMessagePolicy FallbackToLogsOnError): the
         * worker's own error, e.g. a release other than the operator's; not for a signal (exit
         * code 128+N), where the last line is whatever the worker printed before it was killed */
        double code = get_num(term, "exitCode", -1);
        const char *m = code > 0 && code < 128 ? get_str(term, "message", "") : "";
        size_t ml = strlen(m);
        while (ml && (m[ml - 1] == '\n' || m[ml - 1] == ' ')) ml--;
        const char *last = m + ml;
        while (last > m && last[-1] != '\n') last--;
        snprintf(out + len, n - (size_t)len, ": exit code %.0f (%s)%s%.*s", get_num(term, "exitCode", -1),
                 get_str(term, "reason", "Error"), ml ? ": " : "", (int)(m + ml - last > 300 ? 300 : m + ml - last), last);
    }
    else if (get_str(st, "reason", NULL))
        snprintf(out + len, n - (size_t)len, ": %s%s%s", get_str(st, "reason", ""),
                 get_str(st, "message", NULL) ? ": " : "", get_str(st, "message", ""));
}

/* ---- status -------------------------------------------------------------------------------- */

/* The status fields every phase carries: counters, the plan summary, progress, times. */
static cJSON *status_base(rec_ctx *x, const char *phase, const char *msg) {
    cJSON *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "phase", phase);
    cJSON_AddStringToObject(s, "message", msg);
    cJSON_AddNumberToObject(s, "observedGeneration", x->gen);
    cJSON_AddArrayToObject(s, "conditions");
    cJSON_AddNumberToObject(s, "restarts", get_num(x->old, "restarts", 0));
    cJSON_AddNumberToObject(s, "replans", get_num(x->old, "replans", 0) + (*x->why ? 1 : 0));
    cJSON_AddNumberToObject(s, "attempt", x->attempt);
    static const char *kept[] = {"step", "lastCheckpointStep", "samplesPerSecond", "loss"};
    for (size_t i = 0; i < sizeof kept / sizeof *kept; i++)
        if (get(x->old, kept[i])) cJSON_AddNumberToObject(s, kept[i], get_num(x->old, kept[i], 0));
    static const char *times[] = {"startTime", "completionTime", "progressTime"};
    for (size_t i = 0; i < 3; i++)
        if (get_str(x->old, times[i], NULL)) cJSON_AddStringToObject(s, times[i], get_str(x->old, times[i], ""));
    return s;
}

static void set_num(cJSON *o, const char *k, double v) {
    cJSON_DeleteItemFromObjectCaseSensitive(o, k);
    cJSON_AddNumberToObject(o, k, v);
}

static void set_str(cJSON *o, const char *k, const char *v) {
    cJSON_DeleteItemFromObjectCaseSensitive(o, k);
    cJSON_AddStringToObject(o, k, v);
}

static void status_plan(rec_ctx *x, cJSON *s) {
    const cJSON *ranks = get(x->plan_doc, "ranks"), *r;
    cJSON *pl = cJSON_AddObjectToObject(s, "plan");
    cJSON_AddStringToObject(pl, "configMap", x->cm_name);
    cJSON_AddStringToObject(pl, "id", x->plan_id);
    cJSON_AddStringToObject(pl, "strategy", get_str(get(x->plan_doc, "inputs"), "strategy", "cephalo"));
    cJSON_AddNumberToObject(pl, "worldSize", cJSON_GetArraySize(ranks));
    cJSON_AddNumberToObject(pl, "predictedIterMs", get_num(get(x->plan_doc, "predicted"), "iter_ms", 0));
    cJSON_AddNumberToObject(pl, "predictedSamplesPerSecond", get_num(get(x->plan_doc, "predicted"), "samples_per_s", 0));
    cJSON_AddBoolToObject(pl, "estimated", x->estimated);
    if (*x->profile) cJSON_AddStringToObject(pl, "profile", x->profile);
    cJSON *arr = cJSON_AddArrayToObject(pl, "ranks");
    int i = 0;
    cJSON_ArrayForEach(r, ranks) {
        cJSON *o = cJSON_CreateObject();
        char pod[160];
        snprintf(pod, sizeof pod, "%s-%d", x->name, i);
        cJSON_AddNumberToObject(o, "rank", i);
        cJSON_AddStringToObject(o, "node", get_str(r, "node", ""));
        cJSON_AddStringToObject(o, "device", get_str(r, "device", ""));
        cJSON_AddStringToObject(o, "pod", pod);
        cJSON_AddNumberToObject(o, "batch", get_num(r, "batch", 0));
        cJSON_AddNumberToObject(o, "microbatch", get_num(r, "microbatch", 0));
        cJSON_AddNumberToObject(o, "microbatches", get_num(r, "microbatches", 0));
        cJSON_AddNumberToObject(o, "stateRatio", get_num(r, "state_ratio", 0));
        cJSON_AddNumberToObject(o, "predictedPeakBytes", get_num(get(r, "predicted"), "peak_bytes", 0));
        cJSON_AddItemToArray(arr, o);
        i++;
    }
}

/* Conditions for a phase: Created, Planned, then Running / Restarting / Succeeded / Failed. A
 * Restarting condition, once there, stays (False when the gang runs again). */
static void status_conditions(rec_ctx *x, cJSON *s, const char *phase, const char *reason, const char *msg) {
    cJSON *conds = cJSON_GetObjectItemCaseSensitive(s, "conditions");
    int world = cJSON_GetArraySize(get(x->plan_doc, "ranks"));
    char pmsg[256];
    snprintf(pmsg, sizeof pmsg, "%s plan on %d GPUs in ConfigMap %s: predicted %.1f ms per step, %.2f samples/s",
             get_str(get(x->plan_doc, "inputs"), "strategy", "cephalo"), world, x->cm_name,
             get_num(get(x->plan_doc, "predicted"), "iter_ms", 0),
             get_num(get(x->plan_doc, "predicted"), "samples_per_s", 0));
    condition(conds, x->old, x->gen, "Created", true, "Created", "the job was accepted by the operator");
    condition(conds, x->old, x->gen, "Planned", true, "Planned", pmsg);
    bool queued = !strcmp(phase, "Queued");
    condition(conds, x->old, x->gen, "Admitted", !queued, queued ? reason : "Admitted",
              queued ? msg : "every GPU of its plan was free");
    bool running = !strcmp(phase, "Running"), restarting = !strcmp(phase, "Restarting");
    condition(conds, x->old, x->gen, "Running", running, running ? "PodsRunning" : reason, msg);
    if (restarting) condition(conds, x->old, x->gen, "Restarting", true, reason, msg);
    else if (find_condition(x->old, "Restarting"))
        condition(conds, x->old, x->gen, "Restarting", false, "GangStarted", "the gang of this attempt was started");
    if (!strcmp(phase, "Succeeded")) condition(conds, x->old, x->gen, "Succeeded", true, "Succeeded", msg);
    if (!strcmp(phase, "Failed")) condition(conds, x->old, x->gen, "Failed", true, reason, msg);
}

static int finish_status(rec_ctx *x, cJSON *s, const char *phase, err_t *err) {
    if (x->st && strcmp(get_str(x->old, "phase", ""), phase) != 0) {
        if (!strcmp(phase, "Succeeded")) x->st->jobs_succeeded++;
        if (!strcmp(phase, "Failed")) x->st->jobs_failed++;
    }
    return write_status(x, s, err);
}

/* Progress from the workers' /metrics: the step, loss and last checkpoint of rank 0, and the
 * samples per second summed over ranks; returns how many ranks answered. Best effort: a rank that does not answer is left out.
 * Logged through log_msg (the operator's "TIME LEVEL text" lines under --log-level): one summary
 * per job at info, a rank that did not answer at debug (every REC_PROGRESS_S per pod is noise). */
static int scrape_progress(rec_ctx *x, const gang *g, cJSON *s) {
    long port = (long)get_num(x->spec, "metricsPort", 9400);
    if (port <= 0) return 0;
    double rate = 0, t0 = clock_now_s(), per = x->c->scrape_timeout_s > 0 ? x->c->scrape_timeout_s : 1.0;
    int rated = 0, answered = 0;
    for (int r = 0; r < g->world; r++) {
        const char *ip = g->pod[r] ? get_str(get(g->pod[r], "status"), "podIP", NULL) : NULL;
        /* the reconcile thread serves every job: at most REC_SCRAPE_BUDGET_S for one job's ranks */
        double left = REC_SCRAPE_BUDGET_S - (clock_now_s() - t0);
        if (!ip || left < 0.05) continue;
        char url[256];
        snprintf(url, sizeof url, strchr(ip, ':') ? "http://[%s]:%ld/metrics" : "http://%s:%ld/metrics", ip, port);
        worker_progress p = {0};
        err_t e;
        if (progress_scrape(url, fmin(per, left), &p, &e) < 0) {
            log_msg("debug", "%s/%s: progress: %s", x->ns, x->name, e.msg);
            continue;
        }
        answered++;
        if (p.have_rate) rate += p.samples_per_s, rated++;
        if (r != 0) continue;
        if (p.have_step) set_num(s, "step", p.step);
        if (p.have_loss) set_num(s, "loss", p.loss);
        if (p.have_ckpt) set_num(s, "lastCheckpointStep", p.ckpt_step);
    }
    if (rated == g->world) set_num(s, "samplesPerSecond", rate);
    if (answered)
        log_msg("info", "%s/%s: step %.0f of %.0f, loss %.4g, %.2f samples/s (%d of %d ranks answered)", x->ns, x->name,
                get_num(s, "step", 0), get_num(x->spec, "steps", 1), get_num(s, "loss", 0), rate, answered, g->world);
    return answered;
}

/* A worker failed (or its pod vanished): restart the gang, or give up after backoffLimit. The
 * status is written first (attempt + 1), then the pods deleted, so a crash in between still
 * finds them stale. */
static int gang_failed(rec_ctx *x, gang *g, const char *what, err_t *err) {
    double restarts = get_num(x->old, "restarts", 0), limit = get_num(x->spec, "backoffLimit", 3);
    char msg[1400];
    if (restarts >= limit) {
        snprintf(msg, sizeof msg, "%s; backoffLimit %.0f reached after %.0f gang restarts", what, limit, restarts);
        cJSON *s = status_base(x, "Failed", msg);
        status_plan(x, s);
        status_conditions(x, s, "Failed", "BackoffLimitExceeded", msg);
        char now[64];
        kube_time_now(now, sizeof now);
        set_str(s, "completionTime", now);
        /* the pods first: once the status says Failed nothing else looks at this job */
        if (delete_pods(x, g->list, true, err) < 0) return cJSON_Delete(s), -1;
        emit(x->k, x->job, "Warning", "BackoffLimitExceeded", msg);
        return finish_status(x, s, "Failed", err);
    }
    x->attempt++;
    /* lastCheckpointStep is as fresh as the last progress read: the workers may have a newer one */
    double ck = get_num(x->old, "lastCheckpointStep", -1);
    char from[80] = "the last checkpoint, if any";
    if (ck >= 0) snprintf(from, sizeof from, "the last checkpoint (step %.0f or later)", ck);
    snprintf(msg, sizeof msg, "%s; restarting the gang from %s (restart %.0f of %.0f)", what, from, restarts + 1, limit);
    cJSON *s = status_base(x, "Restarting", msg);
    set_num(s, "restarts", restarts + 1);
    status_plan(x, s);
    status_conditions(x, s, "Restarting", "WorkerFailed", msg);
    emit(x->k, x->job, "Warning", "WorkerFailed", msg);
    if (write_status(x, s, err) < 0) return -1;
    if (x->st) x->st->gang_restarts++, x->st->requeue_s = 1;
    return delete_pods(x, g->list, false, err);
}

/* Pods of an older plan or attempt are still there: stop them; the new gang waits for their
 * names. The Restarting condition keeps why the gang restarts. */
static int gang_stopping(rec_ctx *x, gang *g, err_t *err) {
    if (delete_pods(x, g->list, false, err) < 0) return -1;
    const cJSON *rc = find_condition(x->old, "Restarting");
    bool was = rc && !strcmp(get_str(rc, "status", ""), "True");
    const char *why = *x->why ? x->why : was ? get_str(rc, "message", "") : "the plan changed";
    const char *reason = *x->why ? "Replanned" : was ? get_str(rc, "reason", "Replanned") : "Replanned";
    char msg[1600];
    snprintf(msg, sizeof msg, "%s; waiting for %d worker pod%s of the previous gang to stop", why, g->stale,
             g->stale == 1 ? "" : "s");
    cJSON *s = status_base(x, "Restarting", msg);
    status_plan(x, s);
    status_conditions(x, s, "Restarting", reason, why);
    if (x->st) x->st->requeue_s = 1;
    return write_status(x, s, err);
}

/* The gang was disrupted, not failed: one of its pods is being deleted by someone else (an
 * eviction, a drain, kubectl delete), or its workers stopped on request (exit 143 after a
 * checkpoint). It restarts from the last checkpoint like after a failure, but not counted
 * against backoffLimit: the job did nothing wrong. */
static int gang_disrupted(rec_ctx *x, gang *g, const char *what, err_t *err) {
    x->attempt++;
    char msg[1400];
    snprintf(msg, sizeof msg, "%s; restarting the gang from the last checkpoint (a disruption, not counted "
                              "against backoffLimit)", what);
    cJSON *s = status_base(x, "Restarting", msg);
    status_plan(x, s);
    status_conditions(x, s, "Restarting", "GangDisrupted", msg);
    emit(x->k, x->job, "Warning", "GangDisrupted", msg);
    if (write_status(x, s, err) < 0) return -1;
    if (x->st) x->st->requeue_s = 1;
    return delete_pods(x, g->list, false, err);
}

/* ---- the scheduler's refusals ---------------------------------------------------------------- */

#define REC_UNSCHED_FIRST_S 5.0  /* the first refusal's wait before the next gang; doubled per refusal */
#define REC_UNSCHED_MAX_S 300.0

/* The refusals in a row and when the next gang may start, from the plan ConfigMap's annotation
 * REC_ANN_UNSCHEDULABLE ("N TIME"); false without one. */
static bool unsched_read(const rec_ctx *x, int *n, double *until) {
    const char *a = get_str(get(get(x->cm, "metadata"), "annotations"), REC_ANN_UNSCHEDULABLE, NULL);
    char t[64];
    return a && sscanf(a, "%d %63s", n, t) == 2 && *n > 0 && kube_time_parse(t, until);
}

/* Writes the annotation (n > 0), or removes it (n 0). Kept on the ConfigMap, which re-plans patch
 * and never replace: the count survives them and a restarted operator. */
static int unsched_write(rec_ctx *x, int n, double until, err_t *err) {
    char path[KUBE_PATH_MAX], v[96], t[64];
    time_t tt = (time_t)ceil(until);
    struct tm tm;
    strftime(t, sizeof t, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&tt, &tm));
    snprintf(v, sizeof v, "%d %s", n, t);
    cJSON *p = cJSON_CreateObject();
    cJSON *ann = cJSON_AddObjectToObject(cJSON_AddObjectToObject(p, "metadata"), "annotations");
    if (n > 0) cJSON_AddStringToObject(ann, REC_ANN_UNSCHEDULABLE, v);
    else cJSON_AddNullToObject(ann, REC_ANN_UNSCHEDULABLE);
    long status = 0;
    cJSON *out = NULL;
    int rc = kube_path(path, sizeof path, "v1", x->ns, "configmaps", x->cm_name, err);
    if (rc == 0) rc = kube_merge_patch(x->k, path, p, &out, &status, err);
    if (rc == 0 && out) cache_put(x->c->caches->configmaps, out, NULL); /* the next reconcile waits */
    cJSON_Delete(out);
    cJSON_Delete(p);
    return rc;
}

/* A pod of the gang cannot be scheduled (PodScheduled False, Unschedulable): its GPU was taken
 * between planning and binding (a pod pinned by nodeName, another scheduler's), or the scheduler
 * refuses the node for something the accounting does not count (a taint, CPU, memory). The gang
 * is deleted, not counted against backoffLimit, and the next reconcile plans on what is free then
 * (the pod that took the GPU is busy to it: it re-plans around it, or queues). The next gang
 * waits REC_UNSCHED_FIRST_S, doubling per refusal in a row up to REC_UNSCHED_MAX_S, so that a
 * scheduler refusing what the accounting thinks is free is not hammered with gangs. */
static int gang_unschedulable(rec_ctx *x, gang *g, err_t *err) {
    const cJSON *pod = g->unschedulable, *c = find_condition(get(pod, "status"), "PodScheduled");
    int n = 0;
    double until = 0;
    if (!unsched_read(x, &n, &until)) n = 0;
    n++;
    double wait = fmin(REC_UNSCHED_FIRST_S * pow(2, n - 1), REC_UNSCHED_MAX_S);
    char why[720], msg[1600];
    snprintf(why, sizeof why, "%s", get_str(c, "message", "Unschedulable"));
    for (size_t len = strlen(why); len && (why[len - 1] == '.' || why[len - 1] == ' '); len--)
        why[len - 1] = '\0'; /* the scheduler ends its sentence; ours goes on */
    snprintf(msg, sizeof msg, "worker pod %s (rank %s, planned on node %s) cannot be scheduled: %s; the gang is "
             "stopped and planned again on the GPUs free now (its GPU may have been taken after planning; not "
             "counted against backoffLimit), the next gang in %.0f s at the earliest (refusal %d in a row; %.0f s "
             "doubling to %.0f s)",
             kube_meta_str(pod, "name"), get_str(get(get(pod, "metadata"), "labels"), REC_LABEL_RANK, "?"),
             pod_node(x, pod), why, wait, n,
             REC_UNSCHED_FIRST_S, REC_UNSCHED_MAX_S);
    if (unsched_write(x, n, kube_time_now_s() + wait, err) < 0) return -1; /* first: the wait must hold */
    x->attempt++;
    cJSON *s = status_base(x, "Restarting", msg);
    status_plan(x, s);
    status_conditions(x, s, "Restarting", "Unschedulable", msg);
    emit(x->k, x->job, "Warning", "Unschedulable", msg);
    log_warn("%s/%s: %s", x->ns, x->name, msg);
    if (write_status(x, s, err) < 0) return -1;
    if (x->st) x->st->requeue_s = 1;
    return delete_pods(x, g->list, false, err);
}

/* A new gang is due while a refusal's wait runs: it waits (phase Restarting, the status says
 * until when). 1 go on; 0 waiting (status written); -1 on an API error. */
static int unsched_wait(rec_ctx *x, const gang *g, err_t *err) {
    int n;
    double until, left;
    if (g->missing < g->world || !unsched_read(x, &n, &until) || (left = until - kube_time_now_s()) <= 0) return 1;
    char msg[600];
    snprintf(msg, sizeof msg, "the scheduler refused a worker pod of the last gang (refusal %d in a row): the next "
             "gang is created in %.0f s (%.0f s doubling to %.0f s while the scheduler keeps refusing)", n, ceil(left),
             REC_UNSCHED_FIRST_S, REC_UNSCHED_MAX_S);
    cJSON *s = status_base(x, "Restarting", msg);
    status_plan(x, s);
    status_conditions(x, s, "Restarting", "Unschedulable", msg);
    if (x->st) x->st->requeue_s = left;
    return write_status(x, s, err) < 0 ? -1 : 0;
}

/* Not admitted: phase Queued with the plan it waits for (condition Admitted False, reason
 * WaitingForGPUs); a gang it had is stopped (a later one starts as a new attempt). Looked at again
 * when a pod that may hold GPUs comes or goes anywhere, or a Node changes (main.c). */
static int queue_job(rec_ctx *x, const char *msg, err_t *err) {
    const cJSON *pod;
    bool running = false;
    cJSON_ArrayForEach(pod, get(x->pods, "items")) running |= !pod_finished(pod);
    if (running) x->attempt++;
    if (delete_pods(x, x->pods, true, err) < 0) return -1;
    if (strcmp(get_str(x->old, "phase", ""), "Queued") != 0) {
        emit(x->k, x->job, "Normal", "Queued", msg);
        log_msg("info", "%s/%s: queued: %s", x->ns, x->name, msg);
    }
    cJSON *s = status_base(x, "Queued", msg);
    status_plan(x, s);
    status_conditions(x, s, "Queued", "WaitingForGPUs", msg);
    return write_status(x, s, err);
}

/* The worker pod of plan rank r (index i), pinned to its node's hostname label. */
static cJSON *rank_pod(const rec_ctx *x, const cJSON *r, int i, int world, const msrc *init) {
    const char *node = get_str(r, "node", "");
    const cJSON *n = find_node(x->nodes, node);
    return pod_object(x->c, x->job, i, world, n ? inv_node_hostname(n) : node, x->cm_name, x->plan_id, x->attempt,
                      init);
}

static bool job_has_pod(const rec_ctx *x, const char *pod) {
    const cJSON *p;
    cJSON_ArrayForEach(p, get(x->pods, "items")) if (!strcmp(get_str(get(p, "metadata"), "name", ""), pod)) return true;
    return false;
}

/* Puts the pods the admitted job is about to create into the busy store, as the API would
 * return them but with version REC_ASSUMED_RV, so that the next admission counts their GPUs before
 * the API has answered (kube-scheduler's assumed pods). The API's answer or the watch replaces
 * them; forget_assumed removes those nothing replaced (a failed or skipped creation). */
static void assume_pods(rec_ctx *x) {
    const cJSON *r, *ranks = get(x->plan_doc, "ranks");
    int i = 0, world = cJSON_GetArraySize(ranks);
    cJSON_ArrayForEach(r, ranks) {
        char pod[128];
        snprintf(pod, sizeof pod, "%s-%d", x->name, i);
        if (!job_has_pod(x, pod)) {
            cJSON *o = rank_pod(x, r, i, world, NULL);
            cJSON_AddStringToObject(cJSON_GetObjectItemCaseSensitive(o, "metadata"), "resourceVersion", REC_ASSUMED_RV);
            if (cache_put(x->c->caches->busy, o, NULL)) {
                x->assumed = xrealloc(x->assumed, (size_t)(x->n_assumed + 1) * sizeof *x->assumed);
                snprintf(x->assumed[x->n_assumed++], sizeof *x->assumed, "%s", pod);
            }
            cJSON_Delete(o);
        }
        i++;
    }
}

static void forget_assumed(rec_ctx *x) {
    for (int i = 0; i < x->n_assumed; i++) cache_remove_version(x->c->caches->busy, x->ns, x->assumed[i], REC_ASSUMED_RV);
    free(x->assumed);
    x->assumed = NULL;
    x->n_assumed = 0;
}

/* One thread's share of a gang's pods: every `stride`-th of the missing ones from `first`, over
 * its own client (a client is not thread-safe). */
typedef struct pod_batch {
    kube_client *k;
    const char *coll;
    cJSON **pods; /* [n]: taken by ensure */
    int n, first, stride;
    cache *const *stores;
    long created;
    int rc;
    err_t err;
} pod_batch;

static void *create_pod_batch(void *arg) {
    pod_batch *b = arg;
    for (int i = b->first; i < b->n; i += b->stride) {
        bool created = false;
        cJSON *pod = b->pods[i];
        b->pods[i] = NULL;
        if (b->rc == 0 && ensure(b->k, b->coll, pod, &created, b->stores, &b->err) < 0) b->rc = -1;
        else if (b->rc != 0) cJSON_Delete(pod);
        b->created += created;
    }
    return NULL;
}

/* Creates the gang's missing pods, at once over the reconcile's client and its helpers
 * (rec_job_with): a gang of 8 costs one round trip instead of 8. */
static int create_pods(rec_ctx *x, gang *g, err_t *err) {
    char coll[KUBE_PATH_MAX];
    if (kube_path(coll, sizeof coll, "v1", x->ns, "pods", NULL, err) < 0) return -1;
    /* planning refused a bad initFrom of this generation before any pod: no status to write here */
    msrc init;
    int from = msrc_parse(get(x->spec, "model"), &init, err);
    if (from < 0) return -1;
    cJSON **pods = xcalloc((size_t)g->world, sizeof *pods);
    const cJSON *r;
    int i = 0, n = 0;
    cJSON_ArrayForEach(r, get(x->plan_doc, "ranks")) {
        if (i < g->world && !g->pod[i]) {
            pods[n++] = rank_pod(x, r, i, g->world, from ? &init : NULL);
        }
        i++;
    }
    if (n == 0) return free(pods), 0;
    int threads = 1 + x->n_helpers < n ? 1 + x->n_helpers : n;
    pod_batch b[REC_MAX_HELPERS + 1];
    pthread_t th[REC_MAX_HELPERS + 1];
    cache *stores[] = {x->c->caches->pods, x->c->caches->busy, NULL};
    bool started[REC_MAX_HELPERS + 1] = {false};
    int rc = 0;
    for (int t = 0; t < threads; t++) {
        b[t] = (pod_batch){.k = t ? x->helpers[t - 1] : x->k, .coll = coll, .pods = pods, .n = n, .first = t,
                           .stride = threads, .stores = stores};
        if (t) started[t] = pthread_create(&th[t], NULL, create_pod_batch, &b[t]) == 0;
    }
    create_pod_batch(&b[0]);
    for (int t = 1; t < threads; t++) {
        if (started[t]) {
            pthread_join(th[t], NULL);
        } else { /* no thread: this one's share on the reconcile's own client, after its own */
            b[t].k = x->k;
            create_pod_batch(&b[t]);
        }
    }
    for (int t = 0; t < threads; t++) {
        if (x->st) x->st->pods_created += b[t].created;
        if (b[t].rc < 0 && rc == 0) *err = b[t].err, rc = -1;
    }
    for (int k = 0; k < n; k++) cJSON_Delete(pods[k]); /* only those never sent */
    free(pods);
    return rc;
}

int rec_job(kube_client *k, const rec_config *c, const char *ns, const char *name, rec_stats *st,
            err_t *err) {
    return rec_job_with(k, NULL, 0, c, ns, name, st, err);
}

int rec_job_with(kube_client *k, kube_client *const *helpers, int n_helpers, const rec_config *c, const char *ns,
                 const char *name, rec_stats *st, err_t *err) {
    rec_ctx x = {.k = k, .c = c, .st = st, .ns = ns, .name = name, .helpers = helpers,
                 .n_helpers = n_helpers < REC_MAX_HELPERS ? n_helpers : REC_MAX_HELPERS};
    gang g = {0};
    int rc = -1;
    if (st) st->reconciles++, st->requeue_s = 0;
    snprintf(x.key, sizeof x.key, "%s/%s", ns, name);
    if (kube_path(x.job_path, sizeof x.job_path, REC_API_VERSION, ns, "cephalojobs", name, err) < 0) goto out;
    if (!(x.job = cache_get(c->caches->jobs, ns, name))) { /* gone */
        forget_plan(&x);
        rc = 0;
        goto out;
    }
    x.spec = get(x.job, "spec"), x.old = get(x.job, "status");
    x.gen = get_num(get(x.job, "metadata"), "generation", 0);
    x.attempt = (int)get_num(x.old, "attempt", 0);
    snprintf(x.cm_name, sizeof x.cm_name, "%s-plan", name);
    if (get(get(x.job, "metadata"), "deletionTimestamp") || terminal(x.old)) {
        forget_plan(&x);
        rc = 0; /* the garbage collector deletes the pods; a finished job keeps its pods' logs */
        goto out;
    }
    if (cJSON_IsTrue(get(x.spec, "suspend"))) {
        forget_plan(&x);
        rc = suspend_job(&x, err);
        goto out;
    }
    /* what exists, read once from the watches' stores: the Nodes, the plan ConfigMap, the job's
     * pods, the pods that may hold GPUs; from here to admission one job at a time */
    pthread_mutex_lock(&rec_admit_mu);
    x.admitting = true;
    x.nodes = cache_view_list(c->caches->nodes, NULL, NULL, &x.nodes_view);
    x.cm = cache_get(c->caches->configmaps, ns, x.cm_name);
    x.pods = job_pods(&x, &x.pods_view);
    x.busy = cache_view_list(c->caches->busy, NULL, NULL, &x.busy_view);
    int frc = clear_foreign(&x, err);
    if (frc != 0) {
        if (frc > 0) {
            char msg[512];
            snprintf(msg, sizeof msg, "waiting for the objects of an earlier CephaloJob named %s (its plan, "
                     "Service or pods) to be deleted", name);
            /* the status says so only until they are gone (unbound pods go at once): the Event stays */
            if (strcmp(get_str(x.old, "message", ""), msg) != 0) emit(k, x.job, "Normal", "WaitingForOldObjects", msg);
            cJSON *s = cJSON_CreateObject();
            cJSON_AddStringToObject(s, "phase", "Created");
            cJSON_AddStringToObject(s, "message", msg);
            cJSON_AddNumberToObject(s, "observedGeneration", x.gen);
            condition(cJSON_AddArrayToObject(s, "conditions"), x.old, x.gen, "Created", true, "Created", msg);
            if (st) st->requeue_s = 1;
            rc = write_status(&x, s, err);
        }
        goto out;
    }
    int prc = choose_view(&x, err);
    if (prc > 0) prc = current_plan(&x, err);
    if (prc > 0) prc = admit(&x, err);
    if (prc > 0) assume_pods(&x);
    admit_unlock(&x);
    if (prc == 0 && commit_plan(&x, k, err) < 0) prc = -1;
    if (prc <= 0) {
        rc = prc;
        goto out;
    }
    if (side_writes_start(&x, err) < 0) goto out;
    if (gang_read(&x, &g, err) < 0) goto out;

    if (g.stale) {
        rc = gang_stopping(&x, &g, err);
        goto out;
    }
    char what[1024];
    if (g.disrupted) {
        snprintf(what, sizeof what, "worker pod %s (rank %s on %s) is being deleted", kube_meta_str(g.disrupted, "name"),
                 get_str(get(get(g.disrupted, "metadata"), "labels"), REC_LABEL_RANK, "?"),
                 pod_node(&x, g.disrupted));
        rc = gang_disrupted(&x, &g, what, err);
        goto out;
    }
    if (g.unschedulable) {
        rc = gang_unschedulable(&x, &g, err);
        goto out;
    }
    if ((rc = unsched_wait(&x, &g, err)) <= 0) goto out;
    rc = -1;
    if (g.first_failed && !g.failed_hard) {
        snprintf(what, sizeof what, "%d worker pod%s stopped on request (exit code %d, checkpointed)", g.failed,
                 g.failed == 1 ? "" : "s", EXIT_STOPPED);
        rc = gang_disrupted(&x, &g, what, err);
        goto out;
    }
    if (g.first_failed && g.running > 0 && get_num(terminated_state(g.first_failed), "exitCode", 0) <= 128) {
        /* a worker that exited by itself while its peers still run may be the echo of a peer's
         * death that the store does not show yet (kubelets report independently): the blame
         * waits for the gang to settle, at most REC_BLAME_SETTLE_S after that worker ended */
        double fin = kube_time_now_s();
        kube_time_parse(get_str(terminated_state(g.first_failed), "finishedAt", ""), &fin);
        double wait = fin + REC_BLAME_SETTLE_S - kube_time_now_s();
        if (wait > 0) {
            if (st) st->requeue_s = wait;
            rc = 0;
            goto out;
        }
    }
    if (g.first_failed) {
        describe_failure(g.first_failed, pod_node(&x, g.first_failed), what, sizeof what);
        size_t wl = strlen(what);
        if (g.failed > 1)
            snprintf(what + wl, sizeof what - wl, " (%d worker pods failed, this one first)", g.failed);
        rc = gang_failed(&x, &g, what, err);
        goto out;
    }
    /* a pod of a gang that was complete and running is gone (deleted at once, by hand or by the
     * pod garbage collector): the others cannot go on without it */
    bool was_running = !strcmp(get_str(x.old, "phase", ""), "Running") &&
                       !strcmp(get_str(get(x.old, "plan"), "id", ""), x.plan_id) &&
                       (int)get_num(x.old, "attempt", 0) == x.attempt;
    if (g.missing && g.missing < g.world && was_running) {
        int r = 0;
        while (g.pod[r]) r++;
        snprintf(what, sizeof what, "worker pod %s-%d vanished while its gang ran", name, r);
        rc = gang_disrupted(&x, &g, what, err);
        goto out;
    }
    if (create_pods(&x, &g, err) < 0) {
        /* a quota, an admission webhook, a bad spec field: say so in the status, retry later */
        char msg[1400];
        snprintf(msg, sizeof msg, "cannot create the worker pods: %.1200s", err->msg);
        cJSON *s = status_base(&x, "Planned", msg);
        status_plan(&x, s);
        status_conditions(&x, s, "Planned", "PodsNotCreated", msg);
        err_t e2;
        (void)write_status(&x, s, &e2);
        goto out;
    }

    const char *phase = g.succeeded == g.world ? "Succeeded"
                      : g.running + g.succeeded == g.world ? "Running" : "Planned";
    const cJSON *rcond = find_condition(x.old, "Restarting");
    bool restarting = !strcmp(phase, "Planned") && rcond && !strcmp(get_str(rcond, "status", ""), "True");
    char msg[1400];
    if (!strcmp(phase, "Succeeded"))
        snprintf(msg, sizeof msg, "all %d worker pods finished", g.world);
    else
        snprintf(msg, sizeof msg, "%d of %d worker pods running%s", g.running, g.world,
                 restarting ? " (the gang is starting again)" : "");
    if (g.first_stuck) { /* why a pod does not start: an image that cannot be pulled, a bad mount */
        const cJSON *w = waiting_state(g.first_stuck);
        size_t ml = strlen(msg);
        snprintf(msg + ml, sizeof msg - ml, "; pod %s waits: %s%s%.300s", kube_meta_str(g.first_stuck, "name"),
                 get_str(w, "reason", ""), get_str(w, "message", NULL) ? ": " : "", get_str(w, "message", ""));
    }
    if (*x.notes && strlen(msg) + strlen(x.notes) + 3 < sizeof msg) strcat(strcat(msg, "; "), x.notes);
    if (restarting) phase = "Restarting";
    int refusals;
    double until;
    if (!strcmp(phase, "Running") && unsched_read(&x, &refusals, &until)) { /* placed at last: the next refusal waits 5 s */
        err_t e2;
        if (unsched_write(&x, 0, 0, &e2) < 0) log_warn("%s/%s: %s", ns, name, e2.msg);
    }
    cJSON *s = status_base(&x, phase, msg);
    status_plan(&x, s);
    status_conditions(&x, s, phase, !strcmp(phase, "Succeeded") ? "Completed"
                                    : restarting ? get_str(rcond, "reason", "Replanned") : "PodsNotRunning",
                      restarting ? get_str(rcond, "message", msg) : msg);
    char now[64];
    kube_time_now(now, sizeof now);
    if (!get_str(x.old, "startTime", NULL) && strcmp(phase, "Planned")) set_str(s, "startTime", now);
    if (!strcmp(phase, "Running")) {
        /* at most every REC_PROGRESS_S, whatever else reconciles the job; progressTime says when the
         * workers last answered, and moves only then: workers without /metrics cost no write */
        double last = 0, wait = 0;
        if (kube_time_parse(get_str(x.old, "progressTime", ""), &last))
            wait = fmin(REC_PROGRESS_S - (kube_time_now_s() - last), REC_PROGRESS_S); /* clocks of replicas may differ */
        if (wait <= 0.5) {
            if (scrape_progress(&x, &g, s) > 0) set_str(s, "progressTime", now);
            wait = REC_PROGRESS_S;
        }
        if (st) st->requeue_s = wait;
    } else if (!strcmp(phase, "Succeeded")) {
        /* every worker exited 0: it trained to the last step and checkpointed there */
        set_num(s, "step", get_num(x.spec, "steps", 1));
        if (cJSON_IsObject(get(x.spec, "checkpoint"))) set_num(s, "lastCheckpointStep", get_num(x.spec, "steps", 1));
        set_str(s, "completionTime", now);
    }
    rc = finish_status(&x, s, phase, err);
out:
    rc = side_writes_join(&x, rc, err);
    admit_unlock(&x);
    forget_assumed(&x);
    free(x.new_plan.json);
    if (rc < 0 && st) st->errors++;
    gang_free(&g);
    cJSON_Delete(x.plan_doc);
    cache_view_release(&x.pods_view);
    cache_view_release(&x.busy_view);
    cluster_free(&x.inv_all.cl);
    cluster_free(&x.inv_free.cl);
    cJSON_Delete(x.cm);
    cache_view_release(&x.nodes_view);
    cJSON_Delete(x.job);
    return rc;
}
