/* rec_gang.c - a job's gang (rec_internal.h; docs/operator.md, "Reconcile" step 6): its pods
 * sorted out against the plan and the attempt, and what they call for: stopping a stale gang, a
 * restart after a failure (counted against spec.backoffLimit) or a disruption (not counted), the
 * scheduler's refusals and their backoff. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "common/worker_cmd.h"
#include "operator/rec_internal.h"

/* ---- the pods -------------------------------------------------------------------------------- */

/* Which failure to blame when several workers failed: the one that ended first (its peers
 * then fail on the broken collective), and on a tie a death by signal (exit code > 128: killed,
 * out of memory) before an exit the worker chose. finishedAt has whole seconds, and a kubelet
 * stamps it when it sees the exit: a peer that exits a millisecond after the killed worker may
 * carry the earlier second, so stamps less than REC_BLAME_TIE_S apart are a tie. */
bool rec_blame_earlier(const rec_pod *a, const rec_pod *b) {
    double fa = 1e300, fb = 1e300;
    if (a->terminated) kube_time_parse(a->finished_at, &fa);
    if (b->terminated) kube_time_parse(b->finished_at, &fb);
    bool sig_a = a->exit_code > 128, sig_b = b->exit_code > 128;
    if (fabs(fa - fb) <= REC_BLAME_TIE_S && sig_a != sig_b) return sig_a;
    return fa < fb;
}

/* The rank of a pod of the current plan and attempt, or -1 when it is stale. */
static int current_rank(const rec_ctx *x, const rec_pod *p, int world) {
    char att[32], *end;
    snprintf(att, sizeof att, "%d", x->job.attempt);
    const char *rank_s = p->rank ? p->rank : "";
    long rank = strtol(rank_s, &end, 10);
    bool current = rec_pod_owned(p, &x->job.meta) && !strcmp(p->plan_id, x->plan.id) && !strcmp(p->attempt, att) &&
                   *rank_s && !*end && rank >= 0 && rank < world;
    return current ? (int)rank : -1;
}

/* Counts a pod of the gang by its phase. */
static void gang_count(gang *g, const rec_pod *p) {
    switch (p->phase) {
    case PHASE_RUNNING: g->running++; break;
    case PHASE_SUCCEEDED: g->succeeded++; break;
    case PHASE_FAILED:
        g->failed++;
        if (!p->terminated || p->exit_code != EXIT_STOPPED) g->failed_hard++;
        if (!g->first_failed || rec_blame_earlier(p, g->first_failed)) g->first_failed = p;
        break;
    default:
        g->pending++;
        if (!g->first_stuck && p->wait_reason) g->first_stuck = p;
        if (!g->unschedulable && p->unschedulable) g->unschedulable = p;
    }
}

int rec_gang_read(rec_ctx *x, gang *g, err_t *err) {
    memset(g, 0, sizeof *g);
    g->world = x->plan.view.world;
    g->pod = calloc((size_t)g->world + 1, sizeof *g->pod);
    if (!g->pod) return err_set(err, "out of memory");
    for (int i = 0; i < x->stores.n_pods; i++) {
        const rec_pod *p = &x->stores.pod[i];
        int rank = current_rank(x, p, g->world);
        if (rank < 0) {
            g->stale++;
        } else if (p->deleting && !phase_finished(p->phase)) {
            if (!g->disrupted) g->disrupted = p;
        } else {
            g->pod[rank] = p;
            gang_count(g, p);
        }
    }
    for (int r = 0; r < g->world; r++) g->missing += !g->pod[r];
    return 0;
}

void rec_gang_free(gang *g) { free(g->pod); }

/* The node of a pod for messages: bound, its node; not yet, the node its affinity names (by its
 * hostname label: the Node's name when it is among x->stores.nodes); else "?". */
static const char *pod_node(const rec_ctx *x, const rec_pod *p) {
    const cJSON *n;
    if (p->node) return p->node;
    cJSON_ArrayForEach(n, rec_items(x->stores.nodes))
        if (inv_pod_on_node(p->obj, n)) return kube_meta_str(n, "name");
    return inv_pod_node(p->obj) ? inv_pod_node(p->obj) : "?";
}

static const char *pod_rank(const rec_pod *p) { return p->rank ? p->rank : "?"; }

/* ": exit code 1 (Error): <the container's last log line>". The last line comes from
 * terminationMessagePolicy FallbackToLogsOnError: the worker's own error, e.g. a release other
 * than the operator's; not for a signal (exit code 128+N), where the last line is whatever the
 * worker printed before it was killed. */
static void describe_exit(const rec_pod *p, char *out, size_t n) {
    double code = p->exit_code;
    const char *m = code > 0 && code < 128 && p->term_message ? p->term_message : "";
    size_t ml = strlen(m);
    while (ml && (m[ml - 1] == '\n' || m[ml - 1] == ' ')) ml--;
    const char *last = m + ml;
    while (last > m && last[-1] != '\n') last--;
    snprintf(out, n, ": exit code %.0f (%s)%s%.*s", code, p->term_reason ? p->term_reason : "Error", ml ? ": " : "",
             (int)(m + ml - last > 300 ? 300 : m + ml - last), last);
}

/* "pod tiny-1 (rank 1 on gpu-a) failed: exit code 137 (Error)" */
static void describe_failure(const rec_pod *p, const char *node, char *out, size_t n) {
    int len = snprintf(out, n, "pod %s (rank %s on %s) failed", p->name, pod_rank(p), node);
    if (len < 0 || (size_t)len >= n) return;
    if (p->terminated)
        describe_exit(p, out + len, n - (size_t)len);
    else if (p->reason)
        snprintf(out + len, n - (size_t)len, ": %s%s%s", p->reason, p->message ? ": " : "", p->message ? p->message : "");
}

/* ---- restarts -------------------------------------------------------------------------------- */

/* The backoff limit is reached: Failed (BackoffLimitExceeded), its running pods deleted first
 * (once the status says Failed nothing else looks at this job), finished ones kept for their logs. */
static int gang_gives_up(rec_ctx *x, const char *what, double restarts, err_t *err) {
    char msg[1400], now[64];
    snprintf(msg, sizeof msg, "%s; backoffLimit %ld reached after %.0f gang restarts", what, x->job.js.backoff_limit,
             restarts);
    cJSON *conds, *s = rec_status_base(x, PHASE_FAILED, msg, &conds);
    rec_status_plan(x, s);
    rec_status_conditions(x, conds, PHASE_FAILED, "BackoffLimitExceeded", msg);
    kube_time_now(now, sizeof now);
    cJSON_AddStringToObject(s, "completionTime", now);
    if (rec_delete_pods(x, x->stores.pod, x->stores.n_pods, true, err) < 0) return cJSON_Delete(s), -1;
    rec_emit(x->k, &x->job.meta, "Warning", "BackoffLimitExceeded", msg);
    if (x->job.old.phase != PHASE_FAILED) { /* once, not on each reconcile of the failed job */
        log_warn("%s/%s: failed: %s", x->job.ns, x->job.name, msg);
        if (x->st) x->st->jobs_failed++;
    }
    return rec_write_status(x, s, err);
}

double rec_restart_backoff(double prev_s, double ran_s, double first_s, double max_s) {
    if (!(prev_s > 0) || !(ran_s < 2 * max_s)) return first_s;
    return fmin(2 * prev_s, max_s);
}

static void put(cJSON *s, const char *key, cJSON *v) {
    cJSON_DeleteItemFromObjectCaseSensitive(s, key);
    cJSON_AddItemToObject(s, key, v);
}

/* The wait before the gang that follows a failure (rec_restart_backoff: the previous failure's
 * wait, and how long the gang since ran): into s (restartBackoffSeconds, lastRestartTime,
 * nextRestartTime), and returned. */
static double restart_backoff(const rec_ctx *x, cJSON *s) {
    const rec_status_view *o = &x->job.old;
    double first = x->c->backoff_first_s > 0 ? x->c->backoff_first_s : REC_BACKOFF_FIRST_S;
    double max = x->c->backoff_max_s > 0 ? x->c->backoff_max_s : REC_BACKOFF_MAX_S;
    double now = kube_time_now_s(), began = 0; /* the failed gang's start: the last wait's end */
    bool known = o->next_restart_time && kube_time_parse(o->next_restart_time, &began);
    double wait = rec_restart_backoff(o->backoff_s.have ? o->backoff_s.v : 0, known ? now - began : INFINITY, first,
                                      fmax(max, first));
    char t[64];
    put(s, "restartBackoffSeconds", cJSON_CreateNumber(wait));
    kube_time_now(t, sizeof t);
    put(s, "lastRestartTime", cJSON_CreateString(t));
    kube_time_at(now + wait, t, sizeof t);
    put(s, "nextRestartTime", cJSON_CreateString(t));
    return wait;
}

/* A worker failed (or its pod vanished): restart the gang after the backoff, or give up after
 * backoffLimit. The status is written first (attempt + 1), then the pods deleted, so a crash in
 * between still finds them stale. */
static int gang_failed(rec_ctx *x, const char *what, err_t *err) {
    double restarts = x->job.old.restarts;
    if (restarts >= (double)x->job.js.backoff_limit) return gang_gives_up(x, what, restarts, err);
    x->job.attempt++;
    /* lastCheckpointStep is as fresh as the last progress read: the workers may have a newer one */
    double ck = x->job.old.ckpt_step.have ? x->job.old.ckpt_step.v : -1;
    char from[80] = "the last checkpoint, if any", msg[1400];
    if (ck >= 0) snprintf(from, sizeof from, "the last checkpoint (step %.0f or later)", ck);
    cJSON *conds, *s = rec_status_base(x, PHASE_RESTARTING, "", &conds);
    double wait = restart_backoff(x, s);
    snprintf(msg, sizeof msg, "%s; restarting the gang from %s in %.0f s (restart %.0f of %ld; the wait doubles "
             "per failure in a row)", what, from, wait, restarts + 1, x->job.js.backoff_limit);
    put(s, "message", cJSON_CreateString(msg));
    put(s, "restarts", cJSON_CreateNumber(restarts + 1));
    rec_status_plan(x, s);
    rec_status_conditions(x, conds, PHASE_RESTARTING, "WorkerFailed", msg);
    rec_emit(x->k, &x->job.meta, "Warning", "WorkerFailed", msg);
    log_warn("%s/%s: %s", x->job.ns, x->job.name, msg);
    if (rec_write_status(x, s, err) < 0) return -1;
    if (x->st) x->st->gang_restarts++, x->st->requeue_s = 1;
    return rec_delete_pods(x, x->stores.pod, x->stores.n_pods, false, err);
}

/* Restarting: status.message msg, the Restarting condition reason and why. */
static int restarting_status(rec_ctx *x, const char *reason, const char *why, const char *msg, err_t *err) {
    cJSON *conds, *s = rec_status_base(x, PHASE_RESTARTING, msg, &conds);
    rec_status_plan(x, s);
    rec_status_conditions(x, conds, PHASE_RESTARTING, reason, why);
    return rec_write_status(x, s, err);
}

/* Pods of an older plan or attempt are still there: stop them; the new gang waits for their
 * names. The Restarting condition keeps why the gang restarts. */
static int gang_stopping(rec_ctx *x, gang *g, err_t *err) {
    if (rec_delete_pods(x, x->stores.pod, x->stores.n_pods, false, err) < 0) return -1;
    const rec_cond *rc = rec_cond_find(&x->job.old, "Restarting");
    bool was = rec_cond_true(rc);
    const char *why = *x->plan.why ? x->plan.why : was ? (rc->message ? rc->message : "") : "the plan changed";
    const char *reason = !*x->plan.why && was && rc->reason ? rc->reason : "Replanned";
    char msg[1600];
    snprintf(msg, sizeof msg, "%s; waiting for %d worker pod%s of the previous gang to stop", why, g->stale,
             g->stale == 1 ? "" : "s");
    if (x->st) x->st->requeue_s = 1;
    return restarting_status(x, reason, why, msg, err);
}

/* After a worker failed, the next gang waits until status.nextRestartTime (restart_backoff): 1 go
 * on; 0 waiting (the status says until when); -1 on an API error. */
static int restart_wait(rec_ctx *x, const gang *g, err_t *err) {
    const rec_status_view *o = &x->job.old;
    const rec_cond *rc = rec_cond_find(o, "Restarting");
    double at, left;
    if (g->missing < g->world || o->phase != PHASE_RESTARTING || !rec_cond_true(rc) || !rc->reason ||
        strcmp(rc->reason, "WorkerFailed") || !o->next_restart_time || !kube_time_parse(o->next_restart_time, &at) ||
        (left = at - kube_time_now_s()) <= 0)
        return 1;
    const char *why = rc->message ? rc->message : "";
    char msg[1600];
    snprintf(msg, sizeof msg, "%s; the next gang at %s (restart backoff %.0f s)", why, o->next_restart_time,
             o->backoff_s.v);
    if (x->st) x->st->requeue_s = left;
    return restarting_status(x, rc->reason, why, msg, err) < 0 ? -1 : 0;
}

/* The gang was disrupted, not failed: one of its pods is being deleted by someone else (an
 * eviction, a drain, kubectl delete), or its workers stopped on request (EXIT_STOPPED after
 * a checkpoint). It restarts from the last checkpoint like after a failure, but not counted
 * against backoffLimit: the job did nothing wrong. */
static int gang_disrupted(rec_ctx *x, const char *what, err_t *err) {
    x->job.attempt++;
    char msg[1400];
    snprintf(msg, sizeof msg, "%s; restarting the gang from the last checkpoint (a disruption, not counted "
                              "against backoffLimit)", what);
    rec_emit(x->k, &x->job.meta, "Warning", "GangDisrupted", msg);
    if (rec_status_write(x, PHASE_RESTARTING, "GangDisrupted", msg, err) < 0) return -1;
    if (x->st) x->st->requeue_s = 1;
    return rec_delete_pods(x, x->stores.pod, x->stores.n_pods, false, err);
}

/* ---- the scheduler's refusals ---------------------------------------------------------------- */

/* The refusals in a row and when the next gang may start, from the plan ConfigMap's annotation
 * REC_ANN_UNSCHEDULABLE ("N TIME"); false without one. */
static bool unsched_read(const rec_ctx *x, int *n, double *until) {
    const char *a = x->stores.cmv.unschedulable;
    char t[64];
    return a && sscanf(a, "%d %63s", n, t) == 2 && *n > 0 && kube_time_parse(t, until);
}

/* Writes the annotation: kept on the ConfigMap, which re-plans patch and never replace, so the
 * count survives them and a restarted operator. */
static int unsched_write(rec_ctx *x, int n, double until, err_t *err) {
    char v[96], t[64];
    kube_time_at(until, t, sizeof t);
    snprintf(v, sizeof v, "%d %s", n, t);
    return rec_patch_cm_annotation(x, REC_ANN_UNSCHEDULABLE, v, err);
}

void rec_unsched_clear(rec_ctx *x) {
    int n;
    double until;
    err_t e;
    if (unsched_read(x, &n, &until) && rec_patch_cm_annotation(x, REC_ANN_UNSCHEDULABLE, NULL, &e) < 0)
        log_warn("%s/%s: %s", x->job.ns, x->job.name, e.msg);
}

/* The scheduler's message about a pod, without its final full stop: ours goes on. */
static void sched_message(const rec_pod *p, char *why, size_t n) {
    snprintf(why, n, "%s", p->sched_message ? p->sched_message : "Unschedulable");
    for (size_t len = strlen(why); len && (why[len - 1] == '.' || why[len - 1] == ' '); len--) why[len - 1] = '\0';
}

/* A pod of the gang cannot be scheduled (PodScheduled False, Unschedulable): its GPU was taken
 * between planning and binding (a pod pinned by nodeName, another scheduler's), or the scheduler
 * refuses the node for something the accounting does not count (a taint, CPU, memory). The gang
 * is deleted, not counted against backoffLimit, and the next reconcile plans on what is free then
 * (the pod that took the GPU is busy to it: it re-plans around it, or queues). The next gang
 * waits REC_UNSCHED_FIRST_S, doubling per refusal in a row up to REC_UNSCHED_MAX_S, so that a
 * scheduler refusing what the accounting thinks is free is not hammered with gangs. */
static int gang_unschedulable(rec_ctx *x, gang *g, err_t *err) {
    const rec_pod *pod = g->unschedulable;
    int n = 0;
    double until = 0;
    if (!unsched_read(x, &n, &until)) n = 0;
    n++;
    double wait = fmin(REC_UNSCHED_FIRST_S * pow(2, n - 1), REC_UNSCHED_MAX_S);
    char why[720], msg[1600];
    sched_message(pod, why, sizeof why);
    snprintf(msg, sizeof msg, "worker pod %s (rank %s, planned on node %s) cannot be scheduled: %s; the gang is "
             "stopped and planned again on the GPUs free now (its GPU may have been taken after planning; not "
             "counted against backoffLimit), the next gang in %.0f s at the earliest (refusal %d in a row; %.0f s "
             "doubling to %.0f s)",
             pod->name, pod_rank(pod), pod_node(x, pod), why, wait, n, REC_UNSCHED_FIRST_S,
             REC_UNSCHED_MAX_S);
    if (unsched_write(x, n, kube_time_now_s() + wait, err) < 0) return -1; /* first: the wait must hold */
    x->job.attempt++;
    rec_emit(x->k, &x->job.meta, "Warning", "Unschedulable", msg);
    log_warn("%s/%s: %s", x->job.ns, x->job.name, msg);
    if (rec_status_write(x, PHASE_RESTARTING, "Unschedulable", msg, err) < 0) return -1;
    if (x->st) x->st->requeue_s = 1;
    return rec_delete_pods(x, x->stores.pod, x->stores.n_pods, false, err);
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
    if (x->st) x->st->requeue_s = left;
    return rec_status_write(x, PHASE_RESTARTING, "Unschedulable", msg, err) < 0 ? -1 : 0;
}

/* ---- what the gang calls for ----------------------------------------------------------------- */

/* A failure is judged on a settled view, REC_BLAME_SETTLE_S after the first worker ended: a
 * worker that exited by itself may be the echo of a peer's death that the store does not show
 * yet (kubelets report independently), and a worker killed with its node is a node lost (a
 * re-plan, not counted against backoffLimit) once the node's deletion reaches the node store,
 * which the pod's status may beat. The seconds left, or 0. */
static double blame_wait(const gang *g) {
    double fin = kube_time_now_s();
    if (g->first_failed->terminated) kube_time_parse(g->first_failed->finished_at, &fin);
    double wait = fin + REC_BLAME_SETTLE_S - kube_time_now_s();
    return wait > 0 ? wait : 0;
}

/* Workers of the gang ended with a failure: stopped on request (a disruption), or one failed
 * (after the blame settled). */
static int gang_ended_failed(rec_ctx *x, gang *g, err_t *err) {
    char what[1024];
    if (!g->failed_hard) {
        snprintf(what, sizeof what, "%d worker pod%s stopped on request (exit code %d, checkpointed)", g->failed,
                 g->failed == 1 ? "" : "s", EXIT_STOPPED);
        return gang_disrupted(x, what, err);
    }
    double wait = blame_wait(g);
    if (wait > 0) {
        if (x->st) x->st->requeue_s = wait;
        return 0;
    }
    describe_failure(g->first_failed, pod_node(x, g->first_failed), what, sizeof what);
    size_t wl = strlen(what);
    if (g->failed > 1) snprintf(what + wl, sizeof what - wl, " (%d worker pods failed, this one first)", g->failed);
    return gang_failed(x, what, err);
}

/* A pod of a gang that was complete and running is gone (deleted at once, by hand or by the pod
 * garbage collector): the others cannot go on without it. Its rank, or -1. */
static int vanished_rank(const rec_ctx *x, const gang *g) {
    const rec_status_view *old = &x->job.old;
    bool was_running = old->phase == PHASE_RUNNING && !strcmp(old->plan_id ? old->plan_id : "", x->plan.id) &&
                       old->attempt == x->job.attempt;
    if (!g->missing || g->missing >= g->world || !was_running) return -1;
    int r = 0;
    while (g->pod[r]) r++;
    return r;
}

/* A pod of the gang being deleted by someone else. */
static int pod_deleted(rec_ctx *x, gang *g, err_t *err) {
    char what[1024];
    snprintf(what, sizeof what, "worker pod %s (rank %s on %s) is being deleted", g->disrupted->name,
             pod_rank(g->disrupted), pod_node(x, g->disrupted));
    return gang_disrupted(x, what, err);
}

int rec_gang_decide(rec_ctx *x, gang *g, int *rc, err_t *err) {
    char what[1024];
    int r;
    if (g->stale) *rc = gang_stopping(x, g, err);
    else if (g->disrupted) *rc = pod_deleted(x, g, err);
    else if (g->unschedulable) *rc = gang_unschedulable(x, g, err);
    else if ((*rc = unsched_wait(x, g, err)) <= 0) return 0;
    else if ((*rc = restart_wait(x, g, err)) <= 0) return 0;
    else if (g->first_failed) *rc = gang_ended_failed(x, g, err);
    else if ((r = vanished_rank(x, g)) >= 0) {
        snprintf(what, sizeof what, "worker pod %s-%d vanished while its gang ran", x->job.name, r);
        *rc = gang_disrupted(x, what, err);
    } else {
        return 1;
    }
    return 0;
}
