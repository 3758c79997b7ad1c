/* rec_admit.c - GPU accounting and admission (rec_internal.h; docs/operator.md, "GPUs shared
 * between jobs"): which GPUs a job is planned on, whether its plan's GPUs are free, the queue. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "operator/rec_internal.h"

/* Admissions take turns. main.c's workers reconcile several jobs at once, and a job's decision,
 * from reading the free GPUs to holding them, must see every admission before it, or two jobs
 * would book the same GPU. The lock covers that decision (reads of the stores, planning, the plan
 * ConfigMap) and ends once the pods to create are in the busy store as assumed; the writes that
 * follow (Service, pods, status) run beside other jobs'. */
static pthread_mutex_t rec_admit_mu = PTHREAD_MUTEX_INITIALIZER;

void rec_admit_lock(rec_ctx *x) {
    pthread_mutex_lock(&rec_admit_mu);
    x->gpus.admitting = true;
}

void rec_admit_unlock(rec_ctx *x) {
    if (!x->gpus.admitting) return;
    x->gpus.admitting = false;
    pthread_mutex_unlock(&rec_admit_mu);
}

/* ---- the free GPUs --------------------------------------------------------------------------- */

/* spec.gpus.minGPUs above the GPUs the job may use anywhere: it can never start. */
static int never_fits(rec_ctx *x, int usable, err_t *err) {
    char types[256], msg[700];
    inv_describe(&rec_inv(x, false)->cl, types, sizeof types);
    snprintf(msg, sizeof msg, "spec.gpus.minGPUs %ld is more than the %d GPUs the job may use in the cluster (%s): it "
             "can never start (lower minGPUs, or widen spec.gpus)", x->job.js.min_gpus, usable, types);
    return rec_plan_failed(x, "InsufficientGPUs", msg, err) < 0 ? -1 : 0;
}

/* Which GPUs the job is planned on (x->gpus.on_free) and how many it needs (x->gpus.need): its free GPUs when
 * at least `need` are free (it plans around busy ones), else all its usable GPUs, busy or not (the
 * plan it waits for). A spec that does not read is refused here, before anything is planned. */
int rec_choose_view(rec_ctx *x, err_t *err) {
    if (x->job.js_rc < 0) {
        rec_forget_plan(x);
        return rec_plan_failed(x, "InvalidSpec", x->job.js_err.msg, err) < 0 ? -1 : 0;
    }
    x->gpus.cap = (int)x->job.js.max_gpus;
    x->gpus.on_free = true;
    /* the free GPUs' inventory counts every usable one too (inv_result.usable): the whole one is
     * built only when the job must be planned on it, or for a message */
    const job_inv *mine = rec_inv(x, true);
    if (mine->rc < 0) return 1; /* no usable GPU: planning says why */
    int usable = mine->r.usable, min = (int)x->job.js.min_gpus;
    x->gpus.need = min > 0 ? min : x->gpus.cap > 0 && x->gpus.cap < usable ? x->gpus.cap : usable;
    if (x->gpus.need > usable) return never_fits(x, usable, err);
    x->gpus.picked = rec_inv_devices(mine, x->gpus.cap);
    if (x->gpus.picked < x->gpus.need) x->gpus.on_free = false;
    return 1;
}

/* ---- the queue ------------------------------------------------------------------------------- */

/* "2 L4, 1 A10G": the plan's GPUs by type (in the order they first appear), for messages. */
static void plan_types(const plan_view *pv, char *out, size_t n) {
    int world = pv->world, k = 0;
    int *count = xcalloc((size_t)world + 1, sizeof *count);
    const char **name = xcalloc((size_t)world + 1, sizeof *name);
    str_map at = {0}; /* type -> its index: counted in one pass, not a pass over the ranks for each */
    for (int r = 0; r < world; r++) {
        const char *dev = pv->ranks[r].device;
        long i = str_map_put(&at, dev, k);
        if (i < 0) name[i = k++] = dev;
        count[i]++;
    }
    out[0] = '\0';
    for (int i = 0, len = 0; i < k && (size_t)len < n; i++)
        len += snprintf(out + len, n - (size_t)len, "%s%d %s", len ? ", " : "", count[i], name[i]);
    str_map_free(&at);
    free(count), free(name);
}

/* Queue order: spec.priority (higher first), then creation, then namespace/name. */
static bool job_before(const rec_job_meta *a, long pa, const rec_job_meta *b, long pb) {
    if (pa != pb) return pa > pb;
    int c = strcmp(a->created ? a->created : "", b->created ? b->created : "");
    if (!c) c = strcmp(a->ns, b->ns);
    if (!c) c = strcmp(a->name, b->name);
    return c < 0;
}

/* Whether another job may use (by its spec.gpus) a node of this job's plan. */
static bool shares_nodes(rec_ctx *x, const job_spec *other) {
    cluster cl;
    inv_result r;
    err_t e;
    if (rec_job_cluster(x->c, &x->stores, other, NULL, NULL, 0, NULL, &cl, &r, &e) < 0) return false;
    bool shared = false;
    str_map names = {0}; /* the other job's nodes: a lookup per rank, not a scan of them */
    for (int i = 0; i < cl.n_nodes; i++) str_map_put(&names, cl.nodes[i].name, i);
    for (int k = 0; k < x->plan.view.world; k++) shared |= str_map_get(&names, x->plan.view.ranks[k].node) >= 0;
    str_map_free(&names);
    cluster_free(&cl);
    return shared;
}

/* Another job, read as far as the queue needs it. */
typedef struct other_job {
    rec_job_meta meta;
    rec_status_view st;
    job_spec spec;
} other_job;

/* A pod of job j's current gang (its status's plan id and attempt), not ending. */
static bool current_pod_of(const cJSON *pod, void *job) {
    const other_job *j = job;
    rec_pod p;
    char att[32];
    rec_pod_read(pod, &p);
    snprintf(att, sizeof att, "%d", j->st.attempt);
    return !strcmp(p.ns, j->meta.ns) && !strcmp(p.job, j->meta.name) &&
           !strcmp(p.plan_id, j->st.plan_id ? j->st.plan_id : "?") && !strcmp(p.attempt, att) && !p.deleting &&
           !phase_finished(p.phase);
}

/* Whether restarting job j's new gang exists (created, or being created: its pods then count as
 * busy, the ones still to come as assumed): its claim ends there, not once its pods run. */
static bool gang_recreated(rec_ctx *x, const other_job *j) {
    cache_view v;
    cache_view_list(x->c->caches->pods, current_pod_of, (void *)j, &v);
    bool some = v.n > 0;
    cache_view_release(&v);
    return some;
}

/* Whether job j (another one) has an earlier claim on GPUs of this job's plan, with `who` saying
 * so: Queued ahead of it, or admitted and restarting its gang there (until the new gang exists). */
static bool claims(rec_ctx *x, const other_job *j, char *who, size_t n) {
    phase ph = j->st.phase;
    if (j->meta.deleting || j->spec.suspend) return false;
    bool ahead = ph == PHASE_QUEUED && !rec_waits_for_claim(&j->st) &&
                 job_before(&j->meta, j->spec.priority, &x->job.meta, x->job.js.priority);
    bool restarting = ph == PHASE_RESTARTING && rec_cond_true(rec_cond_find(&j->st, "Admitted"));
    if ((!ahead && !restarting) || !shares_nodes(x, &j->spec) || (restarting && gang_recreated(x, j))) return false;
    if (ahead)
        snprintf(who, n, "queued behind CephaloJob %s/%s (priority %ld, created %s), which waits for GPUs "
                 "this job would take", j->meta.ns, j->meta.name, j->spec.priority,
                 j->meta.created ? j->meta.created : "?");
    else
        snprintf(who, n, "waiting for CephaloJob %s/%s to restart its gang on GPUs this job would take", j->meta.ns,
                 j->meta.name);
    return true;
}

/* Job j (a CephaloJob of the store) read, then claims. */
static bool blocks(rec_ctx *x, const cJSON *job, char *who, size_t n) {
    other_job *j = xcalloc(1, sizeof *j); /* a job_spec is some 20 KB */
    err_t e;
    (void)rec_job_read(job, &j->meta, &j->st, &j->spec, &e); /* its defaults stand in for a mistake */
    bool b = claims(x, j, who, n);
    rec_status_view_free(&j->st);
    free(j);
    return b;
}

/* A job with an earlier claim on GPUs of this job's plan: one ahead of it in the queue (Queued,
 * higher spec.priority, else created earlier) that may use the same nodes, so that a later job
 * does not take GPUs an earlier one waits for; or an admitted one restarting its gang there
 * (between its old pods' end and its new pods' creation its GPUs look free). Whether there is
 * one, with `who` set. Among the jobs the operator watches: an operator of some namespaces (chart
 * value watchNamespaces) queues those namespaces' jobs together. */
static bool queue_blocker(rec_ctx *x, char *who, size_t n) {
    cache_view v;
    const cJSON *jobs = cache_view_list(x->c->caches->jobs, NULL, NULL, &v);
    const char *uid = x->job.meta.uid;
    const cJSON *j;
    bool found = false;
    cJSON_ArrayForEach(j, rec_items(jobs)) {
        const char *juid = kube_meta_str(j, "uid");
        if (uid && !strcmp(juid ? juid : "", uid)) continue;
        if ((found = blocks(x, j, who, n))) break;
    }
    cache_view_release(&v);
    return found;
}

/* Not admitted: phase Queued with the plan it waits for (condition Admitted False, reason
 * WaitingForGPUs); a gang it had is stopped (a later one starts as a new attempt). Looked at again
 * when a pod that may hold GPUs comes or goes anywhere, or a Node changes (main.c). */
static int queue_job(rec_ctx *x, const char *msg, err_t *err) {
    bool running = false;
    for (int i = 0; i < x->stores.n_pods; i++) running |= !phase_finished(x->stores.pod[i].phase);
    if (running) x->job.attempt++;
    if (rec_delete_pods(x, x->stores.pod, x->stores.n_pods, true, err) < 0) return -1;
    if (x->job.old.phase != PHASE_QUEUED) {
        rec_emit(x->k, &x->job.meta, "Normal", "Queued", msg);
        log_msg("info", "%s/%s: queued: %s", x->job.ns, x->job.name, msg);
    }
    return rec_status_write(x, PHASE_QUEUED, "WaitingForGPUs", msg, err);
}

/* The plan was made; may its gang run? A job that holds its GPUs (a live one whose plan still fits,
 * one whose gang was started on this plan, or whose gang has ended and must be seen through) goes
 * on; another is admitted when every GPU of its plan is free (all or nothing: a partial gang never
 * starts) and no job has an earlier claim on them. */
int rec_admit(rec_ctx *x, err_t *err) {
    bool live = phase_live(x->job.old.phase) || rec_gang_started(x, x->plan.id) > 0;
    int world = x->plan.view.world;
    char msg[1200], types[256] = "";
    if (live && rec_gang_ended(x, x->plan.id)) return 1;
    if (rec_plan_fits(x, &x->plan.view)) {
        if (live) return 1;
        return queue_blocker(x, msg, sizeof msg) ? queue_job(x, msg, err) : 1;
    }
    plan_types(&x->plan.view, types, sizeof types);
    int nfree = rec_inv(x, true)->cl.n_devices;
    if (x->gpus.need < world)
        snprintf(msg, sizeof msg, "needs %d GPUs (%s) of its plan, or at least %d (spec.gpus.minGPUs) of them free; %d free",
                 world, types, x->gpus.need, nfree);
    else
        snprintf(msg, sizeof msg, "needs %d GPUs (%s) of its plan; %d free", world, types, nfree);
    return queue_job(x, msg, err);
}
