/* rec_status.c - a job's status (rec_internal.h; docs/operator.md, "Reconcile" steps 8-9): the
 * phase and its conditions, the plan summary, the workers' progress, Events; written only when it
 * differs from the stored one. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "operator/progress.h"
#include "operator/rec_internal.h"

#define REC_SCRAPE_BUDGET_S 2.0 /* the most one job's progress read may take */

/* ---- conditions and Events ------------------------------------------------------------------- */

void rec_condition(cJSON *conds, const cJSON *old_status, double gen, const char *type, bool ok, const char *reason,
                   const char *message) {
    const char *st = ok ? "True" : "False";
    char now[64];
    kube_time_now(now, sizeof now);
    const char *ltt = now; /* kept while the condition stays */
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

const cJSON *rec_find_condition(const cJSON *status, const char *type) {
    const cJSON *c;
    cJSON_ArrayForEach(c, get(status, "conditions"))
        if (!strcmp(get_str(c, "type", ""), type)) return c;
    return NULL;
}

void rec_emit(kube_client *k, const cJSON *job, const char *type, const char *reason, const char *msg) {
    kube_event ev = {.namespace = kube_meta_str(job, "namespace"), .api_version = REC_API_VERSION,
                     .kind = "CephaloJob", .name = kube_meta_str(job, "name"),
                     .uid = kube_meta_str(job, "uid"), .type = type, .reason = reason,
                     .message = msg, .component = REC_COMPONENT};
    err_t e;
    /* events are best effort: the status says the same; a lost one is said, not silent */
    if (kube_event_emit(k, &ev, &e) < 0)
        log_warn("%s/%s: the %s event was not recorded: %s", ev.namespace ? ev.namespace : "", ev.name ? ev.name : "",
                 reason, e.msg);
}

/* ---- writing it ------------------------------------------------------------------------------ */

typedef struct status_arg {
    cJSON *status; /* the wanted status (conditions' lastTransitionTime filled from the old one) */
} status_arg;

static int status_mutate(cJSON *obj, void *argp, err_t *err) {
    (void)err;
    status_arg *a = argp;
    cJSON *old = cJSON_GetObjectItemCaseSensitive(obj, "status");
    if (old && cJSON_Compare(old, a->status, true)) return 0;
    cJSON_DeleteItemFromObjectCaseSensitive(obj, "status");
    cJSON_AddItemToObject(obj, "status", cJSON_Duplicate(a->status, true));
    return 1;
}

/* Writes the job's status (taking it) unless it is what the store has already: a reconcile that
 * changes nothing sends nothing. The PUT carries the stored resourceVersion; when someone wrote
 * since (409) the job is read again and the status put on that. The answer goes into the store,
 * and the watch event it causes does not reconcile the job again (main.c: only spec changes do). */
int rec_write_status(rec_ctx *x, cJSON *status, err_t *err) {
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

/* Writes s, counting a job that has just succeeded or failed. */
static int finish_status(rec_ctx *x, cJSON *s, phase ph, err_t *err) {
    if (x->st && x->old_phase != ph) {
        if (ph == PHASE_SUCCEEDED) x->st->jobs_succeeded++;
        if (ph == PHASE_FAILED) x->st->jobs_failed++;
    }
    return rec_write_status(x, s, err);
}

/* ---- its parts ------------------------------------------------------------------------------- */

static void set_num(cJSON *o, const char *k, double v) {
    cJSON_DeleteItemFromObjectCaseSensitive(o, k);
    cJSON_AddNumberToObject(o, k, v);
}

static void set_str(cJSON *o, const char *k, const char *v) {
    cJSON_DeleteItemFromObjectCaseSensitive(o, k);
    cJSON_AddStringToObject(o, k, v);
}

cJSON *rec_status_base(rec_ctx *x, phase ph, const char *msg) {
    cJSON *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "phase", phase_name(ph));
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

/* status.plan.ranks[i]: where rank i runs and what the plan gives it. */
static cJSON *status_rank(const rec_ctx *x, const cJSON *r, int i) {
    cJSON *o = cJSON_CreateObject();
    char pod[160]; /* NAME-RANK: at most REC_NAME_MAX + 5 */
    snprintf(pod, sizeof pod, "%s-%d", x->name, i);
    cJSON_AddNumberToObject(o, "rank", i);
    cJSON_AddStringToObject(o, "node", get_str(r, "node", ""));
    cJSON_AddStringToObject(o, "device", get_str(r, "device", ""));
    cJSON_AddStringToObject(o, "pod", pod);
    cJSON_AddNumberToObject(o, "batch", get_num(r, "batch", 0));
    cJSON_AddNumberToObject(o, "microbatch", get_num(r, "microbatch", 0));
    cJSON_AddNumberToObject(o, "microbatches", get_num(r, "microbatches", 0));
    cJSON_AddStringToObject(o, "recompute", get_str(r, "recompute", "full")); /* an older plan recomputes */
    cJSON_AddNumberToObject(o, "stateRatio", get_num(r, "state_ratio", 0));
    cJSON_AddNumberToObject(o, "predictedPeakBytes", get_num(get(r, "predicted"), "peak_bytes", 0));
    return o;
}

void rec_status_plan(rec_ctx *x, cJSON *s) {
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
    cJSON_ArrayForEach(r, ranks) cJSON_AddItemToArray(arr, status_rank(x, r, i++));
}

/* Conditions for a phase: Created, Planned, then Running / Restarting / Succeeded / Failed. A
 * Restarting condition, once there, stays (False when the gang runs again). */
void rec_status_conditions(rec_ctx *x, cJSON *s, phase ph, const char *reason, const char *msg) {
    cJSON *conds = cJSON_GetObjectItemCaseSensitive(s, "conditions");
    int world = cJSON_GetArraySize(get(x->plan_doc, "ranks"));
    char pmsg[256];
    snprintf(pmsg, sizeof pmsg, "%s plan on %d GPUs in ConfigMap %s: predicted %.1f ms per step, %.2f samples/s",
             get_str(get(x->plan_doc, "inputs"), "strategy", "cephalo"), world, x->cm_name,
             get_num(get(x->plan_doc, "predicted"), "iter_ms", 0),
             get_num(get(x->plan_doc, "predicted"), "samples_per_s", 0));
    rec_condition(conds, x->old, x->gen, "Created", true, "Created", "the job was accepted by the operator");
    rec_condition(conds, x->old, x->gen, "Planned", true, "Planned", pmsg);
    bool queued = ph == PHASE_QUEUED;
    rec_condition(conds, x->old, x->gen, "Admitted", !queued, queued ? reason : "Admitted",
                  queued ? msg : "every GPU of its plan was free");
    bool running = ph == PHASE_RUNNING;
    rec_condition(conds, x->old, x->gen, "Running", running, running ? "PodsRunning" : reason, msg);
    if (ph == PHASE_RESTARTING) rec_condition(conds, x->old, x->gen, "Restarting", true, reason, msg);
    else if (rec_find_condition(x->old, "Restarting"))
        rec_condition(conds, x->old, x->gen, "Restarting", false, "GangStarted", "the gang of this attempt was started");
    if (ph == PHASE_SUCCEEDED) rec_condition(conds, x->old, x->gen, "Succeeded", true, "Succeeded", msg);
    if (ph == PHASE_FAILED) rec_condition(conds, x->old, x->gen, "Failed", true, reason, msg);
}

int rec_status_write(rec_ctx *x, phase ph, const char *reason, const char *msg, err_t *err) {
    cJSON *s = rec_status_base(x, ph, msg);
    rec_status_plan(x, s);
    rec_status_conditions(x, s, ph, reason, msg);
    return rec_write_status(x, s, err);
}

/* ---- phases without a gang ------------------------------------------------------------------- */

bool rec_terminal(const cJSON *status) {
    phase ph = phase_parse(get_str(status, "phase", NULL));
    if (ph == PHASE_SUCCEEDED) return true;
    const cJSON *f = rec_find_condition(status, "Failed");
    return ph == PHASE_FAILED && f && !strcmp(get_str(f, "reason", ""), "BackoffLimitExceeded");
}

static void created_condition(rec_ctx *x, cJSON *s) {
    rec_condition(cJSON_GetObjectItemCaseSensitive(s, "conditions"), x->old, x->gen, "Created", true, "Created",
                  "the job was accepted by the operator");
}

int rec_suspend_job(rec_ctx *x, err_t *err) {
    cache_view v;
    cJSON *pods = rec_job_pods(x, &v);
    int rc = rec_delete_pods(x, pods, false, err);
    cache_view_release(&v);
    if (rc < 0) return -1;
    cJSON *s = rec_status_base(x, PHASE_SUSPENDED, "spec.suspend is true: no worker pods");
    created_condition(x, s);
    rec_condition(cJSON_GetObjectItemCaseSensitive(s, "conditions"), x->old, x->gen, "Suspended", true, "Suspended",
                  "spec.suspend is true");
    return rec_write_status(x, s, err);
}

int rec_wait_foreign(rec_ctx *x, err_t *err) {
    char msg[512];
    snprintf(msg, sizeof msg, "waiting for the objects of an earlier CephaloJob named %s (its plan, "
             "Service or pods) to be deleted", x->name);
    /* the status says so only until they are gone (unbound pods go at once): the Event stays */
    if (strcmp(get_str(x->old, "message", ""), msg) != 0) rec_emit(x->k, x->job, "Normal", "WaitingForOldObjects", msg);
    cJSON *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "phase", phase_name(PHASE_CREATED));
    cJSON_AddStringToObject(s, "message", msg);
    cJSON_AddNumberToObject(s, "observedGeneration", x->gen);
    rec_condition(cJSON_AddArrayToObject(s, "conditions"), x->old, x->gen, "Created", true, "Created", msg);
    if (x->st) x->st->requeue_s = 1;
    return rec_write_status(x, s, err);
}

/* A plan failure is counted (and its Event sent) once per distinct message: a failed job is
 * reconciled again and again. */
static void plan_failure_seen(rec_ctx *x, const char *reason, const char *msg) {
    if (x->old_phase == PHASE_FAILED && !strcmp(get_str(x->old, "message", ""), msg)) return;
    rec_emit(x->k, x->job, "Warning", reason, msg);
    if (x->st) x->st->plan_failures++, x->st->plan_timeouts += !strcmp(reason, "PlanningTimeout");
    if (x->st && x->old_phase != PHASE_FAILED) x->st->jobs_failed++;
}

int rec_plan_failed(rec_ctx *x, const char *reason, const char *why, err_t *err) {
    char msg[1100];
    snprintf(msg, sizeof msg, "%s", why);
    char *hint = strstr(msg, " (or give a model file path)"); /* the planner's hint for the CLI; built-ins only here */
    if (hint) *hint = '\0';
    plan_failure_seen(x, reason, msg);
    if (rec_delete_pods(x, x->pods, false, err) < 0) return -1;
    cJSON *s = rec_status_base(x, PHASE_FAILED, msg);
    cJSON *conds = cJSON_GetObjectItemCaseSensitive(s, "conditions");
    created_condition(x, s);
    rec_condition(conds, x->old, x->gen, "Planned", false, reason, msg);
    rec_condition(conds, x->old, x->gen, "Failed", true, reason, msg);
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
    const char *ip = g->pod[r] ? get_str(get(g->pod[r], "status"), "podIP", NULL) : NULL;
    double per = x->c->scrape_timeout_s > 0 ? x->c->scrape_timeout_s : 1.0;
    char url[256];
    err_t e;
    if (!ip || left < 0.05) return -1;
    snprintf(url, sizeof url, strchr(ip, ':') ? "http://[%s]:%ld/metrics" : "http://%s:%ld/metrics", ip,
             x->js.metrics_port);
    if (progress_scrape(url, fmin(per, left), p, &e) == 0) return 0;
    log_msg("debug", "%s/%s: progress: %s", x->ns, x->name, e.msg);
    return -1;
}

/* Progress from the workers' /metrics: the step, loss and last checkpoint of rank 0, and the
 * samples per second summed over ranks; returns how many ranks answered. Best effort: a rank that does not answer is left out.
 * Logged through log_msg (the operator's "TIME LEVEL text" lines under --log-level): one summary
 * per job at info, a rank that did not answer at debug (every REC_PROGRESS_S per pod is noise). */
static int scrape_progress(rec_ctx *x, const gang *g, cJSON *s) {
    if (x->js.metrics_port <= 0) return 0;
    double rate = 0, t0 = clock_now_s();
    int rated = 0, answered = 0;
    for (int r = 0; r < g->world; r++) {
        worker_progress p = {0};
        /* the reconcile thread serves every job: at most REC_SCRAPE_BUDGET_S for one job's ranks */
        if (scrape_rank(x, g, r, REC_SCRAPE_BUDGET_S - (clock_now_s() - t0), &p) < 0) continue;
        answered++;
        if (p.have_rate) rate += p.samples_per_s, rated++;
        if (r != 0) continue;
        if (p.have_step) set_num(s, "step", p.step);
        if (p.have_loss) set_num(s, "loss", p.loss);
        if (p.have_ckpt) set_num(s, "lastCheckpointStep", p.ckpt_step);
    }
    if (rated == g->world) set_num(s, "samplesPerSecond", rate);
    if (answered)
        log_msg("info", "%s/%s: step %.0f of %ld, loss %.4g, %.2f samples/s (%d of %d ranks answered)", x->ns, x->name,
                get_num(s, "step", 0), x->js.train.steps, get_num(s, "loss", 0), rate, answered, g->world);
    return answered;
}

/* A running job's progress, at most every REC_PROGRESS_S whatever else reconciles the job, while its
 * workers answer; progressTime says when they last did, and moves only then (workers without
 * /metrics cost no write). Workers that do not answer (no /metrics served, or not yet) are asked
 * again after as long as they have been silent (since progressTime, else startTime), at least
 * REC_PROGRESS_S and at most REC_PROGRESS_MAX_S: at rest such a job is reconciled once a minute, not
 * every 5 s. Without a metrics port, progress is no deadline at all. */
static void running_progress(rec_ctx *x, const gang *g, cJSON *s, const char *now) {
    if (x->js.metrics_port <= 0) return;
    double t = kube_time_now_s(), last = t, wait;
    bool answered = kube_time_parse(get_str(x->old, "progressTime", ""), &last);
    if (!answered && !kube_time_parse(get_str(x->old, "startTime", ""), &last)) last = t;
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
        const cJSON *w = rec_waiting_state(g->first_stuck);
        size_t ml = strlen(msg);
        snprintf(msg + ml, n - ml, "; pod %s waits: %s%s%.300s", kube_meta_str(g->first_stuck, "name"),
                 get_str(w, "reason", ""), get_str(w, "message", NULL) ? ": " : "", get_str(w, "message", ""));
    }
    if (*x->notes && strlen(msg) + strlen(x->notes) + 3 < n) strcat(strcat(msg, "; "), x->notes);
}

int rec_gang_status(rec_ctx *x, const gang *g, err_t *err) {
    phase ph = g->succeeded == g->world ? PHASE_SUCCEEDED
             : g->running + g->succeeded == g->world ? PHASE_RUNNING : PHASE_PLANNED;
    const cJSON *rcond = rec_find_condition(x->old, "Restarting");
    bool restarting = ph == PHASE_PLANNED && rcond && !strcmp(get_str(rcond, "status", ""), "True");
    char msg[1400], now[64];
    gang_message(x, g, ph, restarting, msg, sizeof msg);
    if (restarting) ph = PHASE_RESTARTING;
    if (ph == PHASE_RUNNING) rec_unsched_clear(x); /* placed at last: the next refusal waits 5 s */
    cJSON *s = rec_status_base(x, ph, msg);
    rec_status_plan(x, s);
    rec_status_conditions(x, s, ph, ph == PHASE_SUCCEEDED ? "Completed"
                                    : restarting ? get_str(rcond, "reason", "Replanned") : "PodsNotRunning",
                          restarting ? get_str(rcond, "message", msg) : msg);
    kube_time_now(now, sizeof now);
    if (!get_str(x->old, "startTime", NULL) && ph != PHASE_PLANNED) set_str(s, "startTime", now);
    if (ph == PHASE_RUNNING) {
        running_progress(x, g, s, now);
    } else if (ph == PHASE_SUCCEEDED) {
        /* every worker exited 0: it trained to the last step and checkpointed there */
        set_num(s, "step", (double)x->js.train.steps);
        if (x->js.checkpoint) set_num(s, "lastCheckpointStep", (double)x->js.train.steps);
        set_str(s, "completionTime", now);
    }
    return finish_status(x, s, ph, err);
}
