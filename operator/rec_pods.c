/* rec_pods.c - the objects a job owns (rec_internal.h): the plan ConfigMap, the headless Service,
 * the worker pods (docs/operator.md, "Reconcile" steps 4-7), their creation and deletion, and
 * the objects of an earlier job of the same name. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/version.h"
#include "operator/model_source.h"
#include "operator/pod_template.h"
#include "operator/rec_internal.h"

/* ---- metadata -------------------------------------------------------------------------------- */

static cJSON *owner_refs(const rec_job_meta *job) {
    cJSON *arr = cJSON_CreateArray(), *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "apiVersion", REC_API_VERSION);
    cJSON_AddStringToObject(o, "kind", "CephaloJob");
    cJSON_AddStringToObject(o, "name", job->name);
    cJSON_AddStringToObject(o, "uid", job->uid ? job->uid : "");
    cJSON_AddBoolToObject(o, "controller", true);
    cJSON_AddBoolToObject(o, "blockOwnerDeletion", true);
    cJSON_AddItemToArray(arr, o);
    return arr;
}

/* An object's metadata: its name, the job's labels (a worker's rank and component with rank >= 0)
 * and the job as its controller. */
static cJSON *meta(const rec_job_meta *job, const char *name, int rank, const char *component) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "name", name);
    cJSON_AddStringToObject(m, "namespace", job->ns);
    cJSON *l = cJSON_AddObjectToObject(m, "labels");
    cJSON_AddStringToObject(l, "app.kubernetes.io/name", "cephalo");
    cJSON_AddStringToObject(l, "app.kubernetes.io/managed-by", REC_COMPONENT);
    cJSON_AddStringToObject(l, REC_LABEL_JOB, job->name);
    if (rank >= 0) {
        char r[16];
        snprintf(r, sizeof r, "%d", rank);
        cJSON_AddStringToObject(l, REC_LABEL_RANK, r);
    }
    if (component) cJSON_AddStringToObject(l, REC_LABEL_COMPONENT, component);
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

/* ---- the plan ConfigMap ---------------------------------------------------------------------- */

typedef struct cm_annotations {
    const char *generation, *inventory, *plan_id, *notes;
} cm_annotations;

static void cm_annotate(cJSON *m, const cm_annotations *a, bool patch) {
    cJSON *ann = cJSON_AddObjectToObject(m, "annotations");
    cJSON_AddStringToObject(ann, REC_ANN_GENERATION, a->generation);
    cJSON_AddStringToObject(ann, REC_ANN_INVENTORY, a->inventory);
    cJSON_AddStringToObject(ann, REC_ANN_PLAN_ID, a->plan_id);
    char now[64];
    kube_time_now(now, sizeof now);
    cJSON_AddStringToObject(ann, REC_ANN_PLANNED_AT, now);
    if (a->notes && *a->notes) cJSON_AddStringToObject(ann, REC_ANN_NOTES, a->notes);
    else if (patch) cJSON_AddNullToObject(ann, REC_ANN_NOTES);
}

/* Creates the plan ConfigMap, or merge-patches the one of an older plan (old; the chart's RBAC
 * grants configmaps patch, not update). */
static int write_configmap(kube_client *k, const rec_ctx *x, const char *plan_json, const cm_annotations *a,
                           err_t *err) {
    char path[KUBE_PATH_MAX];
    const cJSON *old = x->stores.cm;
    cJSON *cm = cJSON_CreateObject(), *out = NULL;
    if (!old) {
        cJSON_AddStringToObject(cm, "apiVersion", "v1");
        cJSON_AddStringToObject(cm, "kind", "ConfigMap");
    }
    cJSON *m = old ? cJSON_AddObjectToObject(cm, "metadata") : meta(&x->job.meta, x->job.cm_name, -1, NULL);
    if (!old) cJSON_AddItemToObject(cm, "metadata", m);
    cm_annotate(m, a, old != NULL);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(cm, "data"), "plan.json", plan_json);
    long status = 0;
    int rc = kube_path(path, sizeof path, "v1", x->job.ns, "configmaps", old ? x->job.cm_name : NULL, err);
    if (rc == 0) rc = old ? kube_merge_patch(k, path, cm, &out, &status, err) : kube_create(k, path, cm, &out, &status, err);
    if (rc == 0 && out) cache_put(x->c->caches->configmaps, out, NULL);
    cJSON_Delete(out);
    cJSON_Delete(cm);
    return rc;
}

int rec_patch_cm_annotation(rec_ctx *x, const char *key, const char *value, err_t *err) {
    char path[KUBE_PATH_MAX];
    cJSON *p = cJSON_CreateObject(), *out = NULL;
    cJSON *ann = cJSON_AddObjectToObject(cJSON_AddObjectToObject(p, "metadata"), "annotations");
    if (value) cJSON_AddStringToObject(ann, key, value);
    else cJSON_AddNullToObject(ann, key);
    long status = 0;
    int rc = kube_path(path, sizeof path, "v1", x->job.ns, "configmaps", x->job.cm_name, err);
    if (rc == 0) rc = kube_merge_patch(x->k, path, p, &out, &status, err);
    if (rc == 0 && out) cache_put(x->c->caches->configmaps, out, NULL); /* the next reconcile sees it */
    cJSON_Delete(out);
    cJSON_Delete(p);
    return rc;
}

/* The new plan's ConfigMap; its Event stays due (plan_event). */
static int plan_configmap(rec_ctx *x, kube_client *k, err_t *err) {
    if (!x->plan.fresh.json) return 0;
    cm_annotations a = {x->plan.fresh.gen, x->plan.fresh.fp, x->plan.id, x->plan.notes};
    if (write_configmap(k, x, x->plan.fresh.json, &a, err) < 0) return -1; /* the pool keeps the plan for the retry */
    if (x->plan.fresh.forget) planning_forget(x->c->planner, x->job.key); /* the ConfigMap has it now */
    free(x->plan.fresh.json);
    x->plan.fresh.json = NULL;
    return 0;
}

static void plan_event(rec_ctx *x, kube_client *k) {
    if (x->plan.fresh.ev_reason) rec_emit(k, &x->job.meta, "Normal", x->plan.fresh.ev_reason, x->plan.fresh.ev);
    x->plan.fresh.ev_reason = NULL;
}

int rec_commit_plan(rec_ctx *x, kube_client *k, err_t *err) {
    if (plan_configmap(x, k, err) < 0) return -1;
    plan_event(x, k);
    return 0;
}

/* ---- the Service ----------------------------------------------------------------------------- */

static void add_port(cJSON *ports, const char *name, const char *key, long port) {
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "name", name);
    cJSON_AddNumberToObject(p, key, (double)port);
    cJSON_AddItemToArray(ports, p);
}

/* The headless Service that gives the workers their DNS names (<job>-<rank>.<job>.<ns>.svc). */
static int ensure_service(kube_client *k, const rec_ctx *x, err_t *err) {
    cJSON *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "apiVersion", "v1");
    cJSON_AddStringToObject(s, "kind", "Service");
    cJSON *m = meta(&x->job.meta, x->job.name, -1, "worker");
    cJSON_AddItemToObject(s, "metadata", m);
    cJSON *sp = cJSON_AddObjectToObject(s, "spec");
    cJSON_AddStringToObject(sp, "clusterIP", "None");
    cJSON_AddBoolToObject(sp, "publishNotReadyAddresses", true);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(sp, "selector"), REC_LABEL_JOB, x->job.name);
    cJSON *ports = cJSON_AddArrayToObject(sp, "ports");
    add_port(ports, "rendezvous", "port", REC_MASTER_PORT);
    if (x->job.js.metrics_port > 0) add_port(ports, "metrics", "port", x->job.js.metrics_port);
    char path[KUBE_PATH_MAX];
    if (kube_path(path, sizeof path, "v1", x->job.ns, "services", NULL, err) < 0) return cJSON_Delete(s), -1;
    return ensure(k, path, s, NULL, (cache *[]){x->c->caches->services, NULL}, err);
}

/* rec_commit_plan, then the Service unless it exists. */
static int commit_objects(rec_ctx *x, kube_client *k, bool service, err_t *err) {
    if (rec_commit_plan(x, k, err) < 0) return -1;
    return service ? ensure_service(k, x, err) : 0;
}

/* A new job's plan Event and Service, written by a thread of their own on the last helper client
 * while the reconcile creates the pods: its objects cost two round trips, not four in a row. The
 * plan ConfigMap is written first, before any pod: a pod names its plan (REC_ANN_PLAN_ID), and a
 * leader that takes over a gang half created must find that plan to complete the gang on it
 * (rec_hold_partial_gangs) instead of planning again and recreating it. Pods of a re-plan are
 * created after rec_commit_plan too, so that none reads the old plan. */
static void *side_writes_main(void *arg) {
    rec_ctx *x = arg;
    x->writes.side.rc = commit_objects(x, x->writes.side.k, x->writes.side.service, &x->writes.side.err);
    return NULL;
}

int rec_side_writes_start(rec_ctx *x, err_t *err) {
    bool service = !x->stores.have_service;
    if (!x->stores.cm && x->plan.fresh.json && x->writes.n_helpers > 1) {
        if (plan_configmap(x, x->k, err) < 0) return -1;
        x->writes.side.k = x->writes.helpers[--x->writes.n_helpers]; /* rec_create_pods uses the others */
        x->writes.side.service = service;
        if (pthread_create(&x->writes.side.th, NULL, side_writes_main, x) == 0) {
            x->writes.side.started = true;
            return 0;
        }
        x->writes.n_helpers++;
    }
    return commit_objects(x, x->k, service, err);
}

int rec_side_writes_join(rec_ctx *x, int rc, err_t *err) {
    if (!x->writes.side.started) return rc;
    pthread_join(x->writes.side.th, NULL);
    x->writes.side.started = false;
    x->writes.n_helpers++;
    if (x->writes.side.rc < 0 && rc >= 0) {
        *err = x->writes.side.err;
        return -1;
    }
    return rc;
}

/* ---- a worker pod ---------------------------------------------------------------------------- */

static void env(cJSON *arr, const char *name, const char *value) {
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "name", name);
    cJSON_AddStringToObject(e, "value", value);
    cJSON_AddItemToArray(arr, e);
}

static cJSON *claim(const char *name, bool ro) {
    cJSON *src = cJSON_CreateObject();
    cJSON_AddStringToObject(src, "claimName", name);
    if (ro) cJSON_AddBoolToObject(src, "readOnly", true);
    return src;
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

/* The training options as arguments (cephalo-worker train --help), built by the one builder
 * (job_spec_worker_argv, common/worker_cmd.h): the same job gives the same argv as `cephalo run`;
 * the rank's recompute mode is its plan rank's (a plan without it recomputes). */
static void worker_args(const job_spec *js, const plan_view_rank *planned, cJSON *ctr) {
    wcmd_argv a = {0};
    recompute_mode rec = wcmd_default_recompute();
    if (planned->recompute) recompute_parse(planned->recompute, &rec); /* plan_view checked it */
    job_spec_worker_argv(js, rec, &a);
    cJSON *args = cJSON_AddArrayToObject(ctr, "args");
    for (int i = 0; i < a.n; i++) cJSON_AddItemToArray(args, cJSON_CreateString(a.v[i]));
    wcmd_argv_free(&a);
}

/* The plan (the ConfigMap), the data and checkpoint claims and the initFrom volume, where
 * job_spec_worker_argv's paths expect them. */
static void worker_volumes(const rec_ctx *x, cJSON *ps, cJSON *ctr) {
    const job_spec *js = &x->job.js;
    cJSON *vols = cJSON_AddArrayToObject(ps, "volumes");
    cJSON *mounts = cJSON_AddArrayToObject(ctr, "volumeMounts");
    cJSON *cmsrc = cJSON_CreateObject();
    cJSON_AddStringToObject(cmsrc, "name", x->job.cm_name);
    kube_pod_volume(vols, mounts, "plan", "/etc/cephalo", true, "configMap", cmsrc);
    if (js->data_pvc)
        kube_pod_volume(vols, mounts, "data", JOB_SPEC_DATA_MOUNT, true, "persistentVolumeClaim",
                        claim(js->data_pvc, true));
    if (js->model == JOB_MODEL_INIT_FROM) msrc_pod(&js->init, vols, mounts);
    if (js->checkpoint && js->ckpt_pvc)
        kube_pod_volume(vols, mounts, "checkpoints", JOB_SPEC_CKPT_MOUNT, false, "persistentVolumeClaim",
                        claim(js->ckpt_pvc, false));
}

static void worker_env(const rec_ctx *x, cJSON *ctr, int rank, int world) {
    char addr[512], id[512];
    cJSON *e = cJSON_AddArrayToObject(ctr, "env");
    env(e, CEPHALO_ENV_OPERATOR_VERSION, cephalo_version()); /* a worker of another release refuses to start */
    snprintf(addr, sizeof addr, "%s-0.%s.%s.svc", x->job.name, x->job.name, x->job.ns);
    snprintf(id, sizeof id, "%s/%s", x->job.ns, x->job.name);
    wcmd_env we; /* the variables every launcher sets, by the one builder (common/worker_cmd.h) */
    wcmd_env_init(&we, rank, world, addr, REC_MASTER_PORT);
    we.plan = "/etc/cephalo/plan.json";
    we.job = x->job.name;
    we.job_id = x->job.meta.uid ? x->job.meta.uid : id;
    we.comm_timeout = x->job.js.comm_timeout_s;
    we.metrics_port = x->job.js.metrics_port;
    wcmd_argv vars = {0};
    wcmd_env_entries(&we, &vars);
    for (int i = 0; i < vars.n; i++) {
        char *eq = strchr(vars.v[i], '=');
        *eq = '\0';
        env(e, vars.v[i], eq + 1);
    }
    wcmd_argv_free(&vars);
}

/* One GPU, as request and limit (the API server would default the request from the limit, but
 * the request is what the scheduler and the accounting count), and the metrics port. */
static void worker_resources(const job_spec *js, cJSON *ctr) {
    cJSON *res = cJSON_AddObjectToObject(ctr, "resources");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(res, "requests"), INV_RESOURCE_GPU, "1");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(res, "limits"), INV_RESOURCE_GPU, "1");
    if (js->metrics_port > 0) add_port(cJSON_AddArrayToObject(ctr, "ports"), "metrics", "containerPort", js->metrics_port);
}

static void worker_container(const rec_ctx *x, cJSON *ps, const plan_view_rank *planned, int rank, int world) {
    cJSON *ctr = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(ps, "containers"), ctr);
    cJSON_AddStringToObject(ctr, "name", "worker");
    restricted_container(ctr);
    /* a failed worker's last log lines become its termination message, which the status quotes */
    cJSON_AddStringToObject(ctr, "terminationMessagePolicy", "FallbackToLogsOnError");
    cJSON_AddStringToObject(ctr, "image", x->job.js.image ? x->job.js.image : x->c->worker_image);
    const char *pull = x->job.js.pull_policy ? x->job.js.pull_policy : x->c->worker_pull_policy;
    if (pull && *pull) cJSON_AddStringToObject(ctr, "imagePullPolicy", pull);
    worker_args(&x->job.js, planned, ctr);
    worker_volumes(x, ps, ctr);
    worker_env(x, ctr, rank, world);
    worker_resources(&x->job.js, ctr);
}

static cJSON *pod_meta(const rec_ctx *x, const char *pod, int rank, const char *rv) {
    char att[32];
    cJSON *md = meta(&x->job.meta, pod, rank, "worker");
    if (rv) cJSON_AddStringToObject(md, "resourceVersion", rv);
    cJSON *ann = cJSON_AddObjectToObject(md, "annotations");
    cJSON_AddStringToObject(ann, REC_ANN_PLAN_ID, x->plan.id);
    snprintf(att, sizeof att, "%d", x->job.attempt);
    cJSON_AddStringToObject(ann, REC_ANN_ATTEMPT, att);
    return md;
}

/* The worker pod of rank (plan entry `planned`) on host, the planned node's kubernetes.io/hostname
 * label (else its name); rv, when not NULL, its metadata.resourceVersion. */
static cJSON *pod_object(const rec_ctx *x, const plan_view_rank *planned, int rank, int world, const char *host,
                         const char *rv) {
    char pod[128]; /* NAME-RANK: the name is at most REC_NAME_MAX once planned (open_job) */
    snprintf(pod, sizeof pod, "%s-%d", x->job.name, rank);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "apiVersion", "v1");
    cJSON_AddStringToObject(o, "kind", "Pod");
    cJSON_AddItemToObject(o, "metadata", pod_meta(x, pod, rank, rv));
    cJSON *ps = cJSON_AddObjectToObject(o, "spec");
    pin_to_host(ps, host);
    cJSON_AddStringToObject(ps, "hostname", pod);
    cJSON_AddStringToObject(ps, "subdomain", x->job.name);
    cJSON_AddStringToObject(ps, "restartPolicy", "Never");
    /* a stopped worker finishes its step and writes a whole checkpoint before it exits */
    cJSON_AddNumberToObject(ps, "terminationGracePeriodSeconds", (double)x->job.js.grace_s);
    if (cJSON_IsArray(x->job.js.tolerations))
        cJSON_AddItemToObject(ps, "tolerations", cJSON_Duplicate(x->job.js.tolerations, true));
    restricted_pod(ps);
    worker_container(x, ps, planned, rank, world);
    pod_template_apply(x->job.js.pod_template, o); /* spec.template, checked with the spec */
    return o;
}

/* The worker pod of plan rank r (index i), pinned to its node's hostname label. */
static cJSON *rank_pod(rec_ctx *x, int i, const char *rv) {
    const plan_view_rank *r = &x->plan.view.ranks[i];
    const cJSON *n = rec_find_node(x, r->node);
    return pod_object(x, r, i, x->plan.view.world, n ? inv_node_hostname(n) : r->node, rv);
}

/* ---- creating the gang ----------------------------------------------------------------------- */

/* x->writes.assumed has room for the whole gang (rec_assume_pods). */
static void assume_pod(rec_ctx *x, int i, const char *pod) {
    cJSON *o = rank_pod(x, i, REC_ASSUMED_RV);
    rec_writes_part *w = &x->writes;
    if (cache_put_owned(x->c->caches->busy, o, NULL)) snprintf(w->assumed[w->n_assumed++], sizeof *w->assumed, "%s", pod);
}

/* Puts the pods the admitted job is about to create into the busy store, as the API would
 * return them but with version REC_ASSUMED_RV, so that the next admission counts their GPUs before
 * the API has answered (kube-scheduler's assumed pods). The API's answer or the watch replaces
 * them; rec_forget_assumed removes those nothing replaced (a failed or skipped creation). */
void rec_assume_pods(rec_ctx *x) {
    int world = x->plan.view.world;
    str_map have = {0}; /* the job's pods by name: not a scan of them for each rank */
    for (int i = 0; i < x->stores.n_pods; i++) str_map_put(&have, x->stores.pod[i].name, 0);
    x->writes.assumed = xrealloc(x->writes.assumed, (size_t)(x->writes.n_assumed + world + 1) * sizeof *x->writes.assumed);
    for (int i = 0; i < world; i++) {
        char pod[128]; /* as in pod_object */
        snprintf(pod, sizeof pod, "%s-%d", x->job.name, i);
        if (str_map_get(&have, pod) < 0) assume_pod(x, i, pod);
    }
    str_map_free(&have);
}

void rec_forget_assumed(rec_ctx *x) {
    for (int i = 0; i < x->writes.n_assumed; i++)
        cache_remove_version(x->c->caches->busy, x->job.ns, x->writes.assumed[i], REC_ASSUMED_RV);
    free(x->writes.assumed);
    x->writes.assumed = NULL;
    x->writes.n_assumed = 0;
}

/* Assumed pods kept past their reconcile, by job (rec_hold_assumed): few, and only at a leader's
 * start, so a list. */
typedef struct held_pods {
    char key[PLANNING_KEY_MAX]; /* namespace/name */
    char (*names)[128];
    int n;
} held_pods;
static pthread_mutex_t held_mu = PTHREAD_MUTEX_INITIALIZER;
static held_pods *held;
static int n_held;

void rec_hold_assumed(rec_ctx *x) {
    if (!x->writes.n_assumed) return;
    pthread_mutex_lock(&held_mu);
    held = xrealloc(held, (size_t)(n_held + 1) * sizeof *held);
    held_pods *h = &held[n_held++];
    snprintf(h->key, sizeof h->key, "%s", x->job.key);
    h->names = x->writes.assumed, h->n = x->writes.n_assumed;
    pthread_mutex_unlock(&held_mu);
    x->writes.assumed = NULL, x->writes.n_assumed = 0;
}

/* Those the job did not create meanwhile (the API's pod replaced an assumed one) leave the store:
 * the reconcile that just ended either created them (admitted: its own assumptions took over) or
 * decided otherwise (queued, planned again, finished, gone). */
void rec_release_held(const rec_ctx *x) {
    pthread_mutex_lock(&held_mu);
    for (int i = 0; i < n_held; i++) {
        if (strcmp(held[i].key, x->job.key) != 0) continue;
        for (int p = 0; p < held[i].n; p++)
            cache_remove_version(x->c->caches->busy, x->job.ns, held[i].names[p], REC_ASSUMED_RV);
        free(held[i].names);
        held[i--] = held[--n_held];
    }
    if (!n_held) free(held), held = NULL;
    pthread_mutex_unlock(&held_mu);
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

/* The pods of the ranks the gang lacks; their count in *n. */
static cJSON **missing_pods(rec_ctx *x, const gang *g, int *n) {
    cJSON **pods = xcalloc((size_t)g->world + 1, sizeof *pods);
    *n = 0;
    for (int i = 0; i < g->world; i++)
        if (!g->pod[i]) pods[(*n)++] = rank_pod(x, i, NULL);
    return pods;
}

/* Runs the batches: the first on this thread, the others on threads of their own (or here after
 * it when a thread cannot start). rc: the first error. */
static int run_batches(rec_ctx *x, pod_batch *b, int threads, err_t *err) {
    pthread_t th[REC_MAX_HELPERS + 1];
    bool started[REC_MAX_HELPERS + 1] = {false};
    int rc = 0;
    for (int t = 1; t < threads; t++) started[t] = pthread_create(&th[t], NULL, create_pod_batch, &b[t]) == 0;
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
    return rc;
}

/* Creates the gang's missing pods, at once over the reconcile's client and its helpers
 * (rec_job_with): a gang of 8 costs one round trip instead of 8. */
int rec_create_pods(rec_ctx *x, gang *g, err_t *err) {
    char coll[KUBE_PATH_MAX];
    if (kube_path(coll, sizeof coll, "v1", x->job.ns, "pods", NULL, err) < 0) return -1;
    int n;
    cJSON **pods = missing_pods(x, g, &n);
    if (n == 0) return free(pods), 0;
    int threads = 1 + x->writes.n_helpers < n ? 1 + x->writes.n_helpers : n;
    pod_batch b[REC_MAX_HELPERS + 1];
    cache *stores[] = {x->c->caches->pods, x->c->caches->busy, NULL};
    for (int t = 0; t < threads; t++)
        b[t] = (pod_batch){.k = t ? x->writes.helpers[t - 1] : x->k, .coll = coll, .pods = pods, .n = n, .first = t,
                           .stride = threads, .stores = stores};
    int rc = run_batches(x, b, threads, err);
    for (int k = 0; k < n; k++) cJSON_Delete(pods[k]); /* only those never sent */
    free(pods);
    return rc;
}

/* ---- deleting -------------------------------------------------------------------------------- */

/* Whether no kubelet can finish a pod's graceful deletion: its Node is gone, or not Ready and the
 * grace period is over. An unbound pod is no orphan: the API server deletes it at once by itself,
 * and if the scheduler bound it meanwhile, its worker gets the graceful stop. */
static bool orphan_pod(rec_ctx *x, const rec_pod *p) {
    const char *bound = p->node;
    const cJSON *node = rec_find_node(x, bound);
    double due = 0; /* the API sets deletionTimestamp to the request time plus the grace period */
    bool overdue = kube_time_parse(p->deletion, &due) && kube_time_now_s() >= due;
    return x->stores.nodes && bound && (!node || (!inv_node_ready(node) && overdue));
}

/* Deletes a pod: gracefully (the worker gets SIGTERM), once; at once (gracePeriodSeconds=0) when
 * it is an orphan. Its name is needed for the next gang. */
static int delete_pod(rec_ctx *x, const rec_pod *p, err_t *err) {
    char path[KUBE_PATH_MAX + 32];
    long status = 0;
    bool orphan = orphan_pod(x, p);
    if (p->deleting && !orphan) return 0; /* on its way */
    if (kube_path(path, KUBE_PATH_MAX, "v1", x->job.ns, "pods", p->name, err) < 0) return -1;
    if (orphan) strcat(path, "?gracePeriodSeconds=0");
    if (kube_delete(x->k, path, &status, err) < 0 && status != 404) return -1;
    if (x->st) x->st->pods_deleted++;
    return 0;
}

int rec_delete_pods(rec_ctx *x, const rec_pod *pods, int n, bool keep_finished, err_t *err) {
    for (int i = 0; i < n; i++) {
        if (keep_finished && phase_finished(pods[i].phase)) continue;
        if (delete_pod(x, &pods[i], err) < 0) return -1;
    }
    return 0;
}

/* The job's Service, unless another job owns it: 1 deleted, 0 none (or the job's), -1 (API). */
static int clear_foreign_service(rec_ctx *x, err_t *err) {
    char path[KUBE_PATH_MAX];
    long status = 0;
    int found = 0;
    if (kube_path(path, sizeof path, "v1", x->job.ns, "services", x->job.name, err) < 0) return -1;
    cJSON *svc = cache_get(x->c->caches->services, x->job.ns, x->job.name); /* the jobs' labelled Services */
    if (svc && rec_owned_by_job(svc, &x->job.meta)) {
        x->stores.have_service = true;
    } else if (svc) {
        found = 1;
        if (kube_delete(x->k, path, &status, err) < 0 && status != 404) found = -1;
    }
    cJSON_Delete(svc);
    return found;
}

/* Objects of an earlier CephaloJob of the same name (deleted, then applied again before the
 * garbage collector removed them) must not be taken over: the plan ConfigMap, Service and pods
 * owned by another uid are deleted, and the job waits until they are gone. */
int rec_clear_foreign(rec_ctx *x, err_t *err) {
    char path[KUBE_PATH_MAX];
    long status = 0;
    int found = 0;
    if (x->stores.cm && !rec_owned_by_job(x->stores.cm, &x->job.meta)) { /* before the plan: the ConfigMap's owner only */
        found = 1;
        if (kube_path(path, sizeof path, "v1", x->job.ns, "configmaps", x->job.cm_name, err) < 0 ||
            (kube_delete(x->k, path, &status, err) < 0 && status != 404))
            return -1;
    }
    int svc = clear_foreign_service(x, err);
    if (svc < 0) return -1;
    found |= svc;
    for (int i = 0; i < x->stores.n_pods; i++) {
        if (rec_pod_owned(&x->stores.pod[i], &x->job.meta)) continue;
        found = 1;
        if (delete_pod(x, &x->stores.pod[i], err) < 0) return -1;
    }
    return found;
}
