/* rec_view.c - the API's objects as one reconcile reads them (rec_internal.h): the job's metadata
 * and stored status, its pods, the plan ConfigMap, each read once into a typed view. The reads of
 * JSON live here; the other rec_*.c files read fields. The views borrow the objects' strings: an
 * object outlives its view (the context's store views and copies, released by ctx_free). What the
 * reconcile writes (pods, patches, the status) is still built as JSON. */
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/strutil.h"
#include "operator/rec_internal.h"

static const char *get_str(const cJSON *o, const char *k, const char *def) {
    const cJSON *v = get(o, k);
    return cJSON_IsString(v) ? v->valuestring : def;
}

static double get_num(const cJSON *o, const char *k, double def) {
    const cJSON *v = get(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : def;
}

/* ---- the job ---------------------------------------------------------------------------------- */

void rec_job_meta_read(const cJSON *job, rec_job_meta *m) {
    const cJSON *md = get(job, "metadata");
    *m = (rec_job_meta){.ns = get_str(md, "namespace", ""), .name = get_str(md, "name", ""),
                        .uid = get_str(md, "uid", NULL), .created = get_str(md, "creationTimestamp", NULL),
                        .gen = get_num(md, "generation", 0), .deleting = get(md, "deletionTimestamp") != NULL};
}

/* The controller ownerReference of kind CephaloJob: its uid ("" without one), or NULL for none. */
static const char *owner_uid(const cJSON *obj) {
    const cJSON *o;
    cJSON_ArrayForEach(o, get(get(obj, "metadata"), "ownerReferences"))
        if (cJSON_IsTrue(get(o, "controller")) && !strcmp(get_str(o, "kind", ""), "CephaloJob"))
            return get_str(o, "uid", "");
    return NULL;
}

static bool owned(const char *owner, const char *job_uid) {
    return !owner || (job_uid && !strcmp(owner, job_uid));
}

bool rec_owned_by_job(const cJSON *obj, const rec_job_meta *job) { return owned(owner_uid(obj), job->uid); }

/* ---- the stored status ------------------------------------------------------------------------ */

static void read_cond(const cJSON *c, rec_cond *out) {
    *out = (rec_cond){.obj = c, .type = get_str(c, "type", ""), .status = get_str(c, "status", ""),
                      .reason = get_str(c, "reason", NULL), .message = get_str(c, "message", NULL),
                      .ltt = get_str(c, "lastTransitionTime", NULL)};
}

/* A counter the status keeps from one write to the next. */
static rec_kept kept(const cJSON *s, const char *k) {
    const cJSON *v = get(s, k);
    return (rec_kept){cJSON_IsNumber(v), cJSON_IsNumber(v) ? v->valuedouble : 0};
}

void rec_status_read(const cJSON *status, rec_status_view *v) {
    const cJSON *pl = get(status, "plan"), *conds = get(status, "conditions"), *c;
    *v = (rec_status_view){.obj = status, .phase = phase_parse(get_str(status, "phase", NULL)),
                           .message = get_str(status, "message", ""), .restarts = get_num(status, "restarts", 0),
                           .replans = get_num(status, "replans", 0), .attempt = (int)get_num(status, "attempt", 0),
                           .step = kept(status, "step"), .ckpt_step = kept(status, "lastCheckpointStep"),
                           .samples_per_s = kept(status, "samplesPerSecond"), .loss = kept(status, "loss"),
                           .start_time = get_str(status, "startTime", NULL),
                           .completion_time = get_str(status, "completionTime", NULL),
                           .progress_time = get_str(status, "progressTime", NULL), .plan = pl,
                           .backoff_s = kept(status, "restartBackoffSeconds"),
                           .last_restart_time = get_str(status, "lastRestartTime", NULL),
                           .next_restart_time = get_str(status, "nextRestartTime", NULL),
                           .plan_id = get_str(pl, "id", NULL), .plan_profile = get_str(pl, "profile", ""),
                           .plan_estimated = cJSON_IsTrue(get(pl, "estimated"))};
    int n = cJSON_IsArray(conds) ? cJSON_GetArraySize(conds) : 0;
    v->conds = n ? xcalloc((size_t)n, sizeof *v->conds) : NULL;
    cJSON_ArrayForEach(c, conds) read_cond(c, &v->conds[v->n_conds++]);
}

int rec_job_read(const cJSON *job, rec_job_meta *m, rec_status_view *st, job_spec *js, err_t *err) {
    rec_job_meta_read(job, m);
    rec_status_read(get(job, "status"), st);
    return job_spec_parse(get(job, "spec"), js, err);
}

const cJSON *rec_items(const cJSON *list) { return get(list, "items"); }

const cJSON *rec_cm_data(const cJSON *cm) { return get(cm, "data"); }

const cJSON *rec_job_status(const cJSON *job) { return get(job, "status"); }

const char *rec_claim_phase(const cJSON *pvc) { return get_str(get(pvc, "status"), "phase", ""); }

void rec_status_view_free(rec_status_view *v) {
    free(v->conds);
    v->conds = NULL, v->n_conds = 0;
}

const rec_cond *rec_cond_find(const rec_status_view *v, const char *type) {
    for (int i = 0; i < v->n_conds; i++)
        if (!strcmp(v->conds[i].type, type)) return &v->conds[i];
    return NULL;
}

bool rec_cond_true(const rec_cond *c) { return c && !strcmp(c->status, "True"); }

bool rec_terminal(const rec_status_view *v) {
    if (v->phase == PHASE_SUCCEEDED) return true;
    const rec_cond *f = rec_cond_find(v, "Failed");
    return v->phase == PHASE_FAILED && f && f->reason && !strcmp(f->reason, "BackoffLimitExceeded");
}

/* ---- pods ------------------------------------------------------------------------------------- */

/* The first container's state (a worker pod has one). */
static const cJSON *container_state(const cJSON *pod, const char *which) {
    const cJSON *cs = cJSON_GetArrayItem(get(get(pod, "status"), "containerStatuses"), 0);
    return get(get(cs, "state"), which);
}

/* Its waiting state, when the reason is worth reporting (not plain creation). */
static void read_waiting(const cJSON *pod, rec_pod *p) {
    const cJSON *w = container_state(pod, "waiting");
    const char *reason = get_str(w, "reason", NULL);
    if (!reason || !strcmp(reason, "ContainerCreating")) return;
    p->wait_reason = reason;
    p->wait_message = get_str(w, "message", NULL);
}

static void read_terminated(const cJSON *pod, rec_pod *p) {
    const cJSON *t = container_state(pod, "terminated");
    p->terminated = t != NULL;
    p->exit_code = get_num(t, "exitCode", -1);
    p->finished_at = get_str(t, "finishedAt", NULL);
    p->term_reason = get_str(t, "reason", NULL);
    p->term_message = get_str(t, "message", NULL);
}

/* Not bound, and the scheduler said why: PodScheduled False, reason Unschedulable. */
static void read_scheduled(const cJSON *pod, rec_pod *p) {
    const cJSON *c, *sc = NULL;
    cJSON_ArrayForEach(c, get(get(pod, "status"), "conditions")) {
        if (!strcmp(get_str(c, "type", ""), "PodScheduled")) {
            sc = c;
            break;
        }
    }
    p->unschedulable = !p->node && sc && !strcmp(get_str(sc, "status", ""), "False") &&
                       !strcmp(get_str(sc, "reason", ""), "Unschedulable");
    p->sched_message = get_str(sc, "message", NULL);
}

void rec_pod_read(const cJSON *pod, rec_pod *p) {
    const cJSON *md = get(pod, "metadata"), *ann = get(md, "annotations"), *labels = get(md, "labels");
    const cJSON *st = get(pod, "status");
    phase ph = phase_parse(get_str(st, "phase", NULL));
    *p = (rec_pod){.obj = pod, .name = get_str(md, "name", ""), .ns = get_str(md, "namespace", ""),
                   .job = get_str(labels, REC_LABEL_JOB, ""), .rank = get_str(labels, REC_LABEL_RANK, NULL),
                   .plan_id = get_str(ann, REC_ANN_PLAN_ID, ""), .attempt = get_str(ann, REC_ANN_ATTEMPT, ""),
                   .owner_uid = owner_uid(pod), .phase = ph == PHASE_NONE ? PHASE_PENDING : ph,
                   .node = get_str(get(pod, "spec"), "nodeName", NULL), .ip = get_str(st, "podIP", NULL),
                   .deletion = get_str(md, "deletionTimestamp", NULL), .deleting = get(md, "deletionTimestamp") != NULL,
                   .reason = get_str(st, "reason", NULL), .message = get_str(st, "message", NULL)};
    read_waiting(pod, p);
    read_terminated(pod, p);
    read_scheduled(pod, p);
}

rec_pod *rec_pods_read(const cJSON *list, int *n) {
    const cJSON *items = get(list, "items"), *pod;
    int k = 0;
    rec_pod *v = xcalloc((size_t)cJSON_GetArraySize(items) + 1, sizeof *v);
    cJSON_ArrayForEach(pod, items) rec_pod_read(pod, &v[k++]);
    *n = k;
    return v;
}

bool rec_pod_owned(const rec_pod *p, const rec_job_meta *job) { return owned(p->owner_uid, job->uid); }

/* ---- the plan ConfigMap ----------------------------------------------------------------------- */

void rec_cm_read(const cJSON *cm, rec_cm_view *v) {
    const cJSON *ann = get(get(cm, "metadata"), "annotations");
    *v = (rec_cm_view){.obj = cm, .plan_json = get_str(get(cm, "data"), "plan.json", NULL),
                       .generation = get_str(ann, REC_ANN_GENERATION, ""),
                       .inventory = get_str(ann, REC_ANN_INVENTORY, ""), .plan_id = get_str(ann, REC_ANN_PLAN_ID, ""),
                       .notes = get_str(ann, REC_ANN_NOTES, ""), .planned_at = get_str(ann, REC_ANN_PLANNED_AT, NULL),
                       .unschedulable = get_str(ann, REC_ANN_UNSCHEDULABLE, NULL)};
}

/* ---- the stores ------------------------------------------------------------------------------- */

static char *pod_index(const cJSON *pod) {
    const cJSON *md = get(pod, "metadata");
    const char *ns = get_str(md, "namespace", NULL), *job = get_str(get(md, "labels"), REC_LABEL_JOB, NULL);
    return ns && job ? str_printf("%s/%s", ns, job) : NULL;
}

cJSON *rec_job_pods(rec_ctx *x, cache_view *v) { return cache_view_index(x->c->caches->pods, x->job.key, v); }

rec_caches rec_caches_new(void) {
    rec_caches c = {cache_new("cephalojobs"), cache_new("pods"), cache_new("busy pods"), cache_new("nodes"),
                    cache_new("configmaps"), cache_new("services")};
    cache_set_digest(c.busy, inv_pod_digest); /* every admission reads every busy pod */
    cache_set_digest(c.nodes, inv_node_digest); /* ... and every node */
    cache_set_index(c.pods, pod_index);       /* every reconcile reads its job's pods */
    return c;
}

void rec_caches_free(rec_caches *c) {
    cache_free(c->jobs), cache_free(c->pods), cache_free(c->busy);
    cache_free(c->nodes), cache_free(c->configmaps), cache_free(c->services);
    memset(c, 0, sizeof *c);
}

const cJSON *rec_find_node(rec_ctx *x, const char *name) {
    if (!x->stores.nodes || !name) return NULL;
    if (!x->stores.node_by) {
        const cJSON *n, *items = get(x->stores.nodes, "items");
        int k = 0;
        x->stores.node_by = xmalloc((size_t)cJSON_GetArraySize(items) * sizeof *x->stores.node_by + 1);
        cJSON_ArrayForEach(n, items) {
            str_map_put(&x->stores.node_at, get_str(get(n, "metadata"), "name", ""), k); /* the first of a name */
            x->stores.node_by[k++] = n;
        }
    }
    long i = str_map_get(&x->stores.node_at, name);
    return i >= 0 ? x->stores.node_by[i] : NULL;
}

