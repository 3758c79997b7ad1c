/* rec_phase.c - each phase's status (rec_internal.h; docs/operator.md, "Reconcile" steps 8-9): a
 * job without a gang (suspended, waiting for an earlier job's objects, failed to plan, pods not
 * created) and a gang's (Planned, Running with the workers' progress, Restarting, Succeeded),
 * built from rec_status.c's parts. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "operator/progress.h"
#include "operator/rec_internal.h"

#define REC_SCRAPE_BUDGET_S 2.0 /* the most one job's progress read may take */

static void set_num(cJSON *o, const char *k, double v) {
    cJSON_DeleteItemFromObjectCaseSensitive(o, k);
    cJSON_AddNumberToObject(o, k, v);
}

static void set_str(cJSON *o, const char *k, const char *v) {
    cJSON_DeleteItemFromObjectCaseSensitive(o, k);
    cJSON_AddStringToObject(o, k, v);
}

/* Writes s, counting a job that has just succeeded or failed. */
static int finish_status(rec_ctx *x, cJSON *s, phase ph, err_t *err) {
    if (x->st && x->job.old.phase != ph) {
        if (ph == PHASE_SUCCEEDED) x->st->jobs_succeeded++;
        if (ph == PHASE_FAILED) x->st->jobs_failed++;
    }
    return rec_write_status(x, s, err);
}

/* ---- phases without a gang ------------------------------------------------------------------- */

static void created_condition(rec_ctx *x, cJSON *conds) {
    rec_condition(x, conds, "Created", true, "Created",
                  "the job was accepted by the operator");
}

int rec_suspend_job(rec_ctx *x, err_t *err) {
    cache_view v;
    int n;
    rec_pod *pods = rec_pods_read(rec_job_pods(x, &v), &n);
    int rc = rec_delete_pods(x, pods, n, false, err);
    free(pods);
    cache_view_release(&v);
    if (rc < 0) return -1;
    cJSON *conds, *s = rec_status_base(x, PHASE_SUSPENDED, "spec.suspend is true: no worker pods", &conds);
    created_condition(x, conds);
    rec_condition(x, conds, "Suspended", true, "Suspended",
                  "spec.suspend is true");
    return rec_write_status(x, s, err);
}

int rec_wait_foreign(rec_ctx *x, err_t *err) {
    char msg[512];
    snprintf(msg, sizeof msg, "waiting for the objects of an earlier CephaloJob named %s (its plan, "
             "Service or pods) to be deleted", x->job.name);
    /* the status says so only until they are gone (unbound pods go at once): the Event stays */
    if (strcmp(x->job.old.message, msg) != 0) rec_emit(x->k, &x->job.meta, "Normal", "WaitingForOldObjects", msg);
    cJSON *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "phase", phase_name(PHASE_CREATED));
    cJSON_AddStringToObject(s, "message", msg);
    cJSON_AddNumberToObject(s, "observedGeneration", x->job.meta.gen);
    rec_condition(x, cJSON_AddArrayToObject(s, "conditions"), "Created", true, "Created", msg);
    if (x->st) x->st->requeue_s = 1;
    return rec_write_status(x, s, err);
}

/* A plan failure is counted (and its Event sent) once per distinct message: a failed job is
 * reconciled again and again. */
static void plan_failure_seen(rec_ctx *x, const char *reason, const char *msg) {
    if (x->job.old.phase == PHASE_FAILED && !strcmp(x->job.old.message, msg)) return;
    rec_emit(x->k, &x->job.meta, "Warning", reason, msg);
    if (x->st) x->st->plan_failures++, x->st->plan_timeouts += !strcmp(reason, "PlanningTimeout");
    if (x->st && x->job.old.phase != PHASE_FAILED) x->st->jobs_failed++;
}

int rec_plan_failed(rec_ctx *x, const char *reason, const char *why, err_t *err) {
    char msg[1100];
    snprintf(msg, sizeof msg, "%s", why);
    char *hint = strstr(msg, " (or give a model file path)"); /* the planner's hint for the CLI; built-ins only here */
    if (hint) *hint = '\0';
    plan_failure_seen(x, reason, msg);
    if (rec_delete_pods(x, x->stores.pod, x->stores.n_pods, false, err) < 0) return -1;
    cJSON *conds, *s = rec_status_base(x, PHASE_FAILED, msg, &conds);
    created_condition(x, conds);
    rec_condition(x, conds, "Planned", false, reason, msg);
    rec_condition(x, conds, "Failed", true, reason, msg);
    return rec_write_status(x, s, err);
}

void rec_pods_not_created(rec_ctx *x, const err_t *why) {
    char msg[1400];
    err_t e2;
    /* a quota, an admission webhook, a bad spec field: say so in the status, retry later */
    snprintf(msg, sizeof msg, "cannot create the worker pods: %.1200s", why->msg);
    (void)rec_status_write(x, PHASE_PLANNED, "PodsNotCreated", msg, &e2);
}

/* ---- progress -------------------------------------------------------------------------------- */

/* The progress of rank r's worker (its pod's IP) into *p, within `left` seconds: 0, or -1. */
static int scrape_rank(const rec_ctx *x, const gang *g, int r, double left, worker_progress *p) {
    const char *ip = g->pod[r] ? g->pod[r]->ip : NULL;
    double per = x->c->scrape_timeout_s > 0 ? x->c->scrape_timeout_s : 1.0;
    char url[256];
    err_t e;
    if (!ip || left < 0.05) return -1;
    snprintf(url, sizeof url, strchr(ip, ':') ? "http://[%s]:%ld/metrics" : "http://%s:%ld/metrics", ip,
             x->job.js.metrics_port);
    if (progress_scrape(url, fmin(per, left), p, &e) == 0) return 0;
    log_msg("debug", "%s/%s: progress: %s", x->job.ns, x->job.name, e.msg);
    return -1;
}

/* Progress from the workers' /metrics: the step, loss and last checkpoint of rank 0, and the
 * samples per second summed over ranks; returns how many ranks answered. Best effort: a rank that does not answer is left out.
 * Logged through log_msg (the operator's "TIME LEVEL text" lines under --log-level): one summary
 * per job at info, a rank that did not answer at debug (every REC_PROGRESS_S per pod is noise). */
static int scrape_progress(rec_ctx *x, const gang *g, cJSON *s) {
    if (x->job.js.metrics_port <= 0) return 0;
    double rate = 0, step = x->job.old.step.v, loss = x->job.old.loss.v, t0 = clock_now_s(); /* s keeps the old ones */
    int rated = 0, answered = 0;
    for (int r = 0; r < g->world; r++) {
        worker_progress p = {0};
        /* the reconcile thread serves every job: at most REC_SCRAPE_BUDGET_S for one job's ranks */
        if (scrape_rank(x, g, r, REC_SCRAPE_BUDGET_S - (clock_now_s() - t0), &p) < 0) continue;
        answered++;
        if (p.have_rate) rate += p.samples_per_s, rated++;
        if (r != 0) continue;
        if (p.have_step) set_num(s, "step", step = p.step);
        if (p.have_loss) set_num(s, "loss", loss = p.loss);
        if (p.have_ckpt) set_num(s, "lastCheckpointStep", p.ckpt_step);
    }
    if (rated == g->world) rec_status_rate(s, rate);
    if (answered)
        log_msg("info", "%s/%s: step %.0f of %ld, loss %.4g, %.2f samples/s (%d of %d ranks answered)", x->job.ns,
                x->job.name, step, x->job.js.train.steps, loss, rate, answered, g->world);
    return answered;
}

/* A running job's progress, at most every REC_PROGRESS_S whatever else reconciles the job, while its
 * workers answer; progressTime says when they last did, and moves only then (workers without
 * /metrics cost no write). Workers that do not answer (no /metrics served, or not yet) are asked
 * again after as long as they have been silent (since progressTime, else startTime), at least
 * REC_PROGRESS_S and at most REC_PROGRESS_MAX_S: at rest such a job is reconciled once a minute, not
 * every 5 s. Without a metrics port, progress is no deadline at all. */
static void running_progress(rec_ctx *x, const gang *g, cJSON *s, const char *now) {
    if (x->job.js.metrics_port <= 0) return;
    double t = kube_time_now_s(), last = t, wait;
    bool answered = kube_time_parse(x->job.old.progress_time, &last);
    if (!answered && !kube_time_parse(x->job.old.start_time, &last)) last = t;
    double silent = t - last;
    if (answered && (wait = fmin(REC_PROGRESS_S - silent, REC_PROGRESS_S)) > 0.5) { /* clocks of replicas may differ */
        if (x->st) x->st->requeue_s = wait;
        return;
    }
    if (scrape_progress(x, g, s) > 0) {
        set_str(s, "progressTime", now);
        wait = REC_PROGRESS_S;
    } else {
        wait = fmin(fmax(silent, REC_PROGRESS_S), REC_PROGRESS_MAX_S);
    }
    if (x->st) x->st->requeue_s = wait;
}

/* ---- the gang's status ----------------------------------------------------------------------- */

/* "2 of 3 worker pods running; pod tiny-1 waits: ImagePullBackOff: ...; <plan notes>" */
static void gang_message(const rec_ctx *x, const gang *g, phase ph, bool restarting, char *msg, size_t n) {
    if (ph == PHASE_SUCCEEDED)
        snprintf(msg, n, "all %d worker pods finished", g->world);
    else
        snprintf(msg, n, "%d of %d worker pods running%s", g->running, g->world,
                 restarting ? " (the gang is starting again)" : "");
    if (g->first_stuck) { /* why a pod does not start: an image that cannot be pulled, a bad mount */
        const rec_pod *p = g->first_stuck;
        size_t ml = strlen(msg);
        snprintf(msg + ml, n - ml, "; pod %s waits: %s%s%.300s", p->name, p->wait_reason, p->wait_message ? ": " : "",
                 p->wait_message ? p->wait_message : "");
    }
    if (*x->plan.notes && strlen(msg) + strlen(x->plan.notes) + 3 < n) strcat(strcat(msg, "; "), x->plan.notes);
}

int rec_gang_status(rec_ctx *x, const gang *g, err_t *err) {
    phase ph = g->succeeded == g->world ? PHASE_SUCCEEDED
             : g->running + g->succeeded == g->world ? PHASE_RUNNING : PHASE_PLANNED;
    const rec_cond *rcond = rec_cond_find(&x->job.old, "Restarting");
    bool restarting = ph == PHASE_PLANNED && rec_cond_true(rcond);
    char msg[1400], now[64];
    gang_message(x, g, ph, restarting, msg, sizeof msg);
    if (restarting) ph = PHASE_RESTARTING;
    if (ph == PHASE_RUNNING) rec_unsched_clear(x); /* placed at last: the next refusal waits 5 s */
    cJSON *conds, *s = rec_status_base(x, ph, msg, &conds);
    rec_status_plan(x, s);
    rec_status_conditions(x, conds, ph, ph == PHASE_SUCCEEDED ? "Completed"
                                    : restarting ? (rcond->reason ? rcond->reason : "Replanned") : "PodsNotRunning",
                          restarting && rcond->message ? rcond->message : msg);
    kube_time_now(now, sizeof now);
    if (!x->job.old.start_time && ph != PHASE_PLANNED) set_str(s, "startTime", now);
    if (ph == PHASE_RUNNING) {
        running_progress(x, g, s, now);
    } else if (ph == PHASE_SUCCEEDED) {
        /* every worker exited 0: it trained to the last step and checkpointed there */
        set_num(s, "step", (double)x->job.js.train.steps);
        if (x->job.js.checkpoint) set_num(s, "lastCheckpointStep", (double)x->job.js.train.steps);
        set_str(s, "completionTime", now);
    }
    return finish_status(x, s, ph, err);
}
