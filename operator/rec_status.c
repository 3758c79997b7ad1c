/* rec_status.c - the parts of a job's status (rec_internal.h; docs/operator.md, "Reconcile" steps
 * 8-9): the phase and its conditions, the plan summary, Events; written only when it differs from
 * the stored one. Which status each phase gets is rec_phase.c's. */
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "operator/rec_internal.h"


/* ---- conditions and Events ------------------------------------------------------------------- */

void rec_condition(const rec_ctx *x, cJSON *conds, const char *type, bool ok, const char *reason, const char *message) {
    const rec_status_view *old = &x->job.old;
    const char *st = ok ? "True" : "False";
    char now[64];
    kube_time_now(now, sizeof now);
    const char *ltt = now; /* kept while the condition stays */
    for (int i = 0; i < old->n_conds; i++) {
        const rec_cond *oc = &old->conds[i];
        if (strcmp(oc->type, type) == 0 && strcmp(oc->status, st) == 0) ltt = oc->ltt ? oc->ltt : now;
    }
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "type", type);
    cJSON_AddStringToObject(c, "status", st);
    cJSON_AddNumberToObject(c, "observedGeneration", x->job.meta.gen);
    cJSON_AddStringToObject(c, "lastTransitionTime", ltt);
    cJSON_AddStringToObject(c, "reason", reason);
    cJSON_AddStringToObject(c, "message", message);
    cJSON_AddItemToArray(conds, c);
}

void rec_emit(kube_client *k, const rec_job_meta *job, const char *type, const char *reason, const char *msg) {
    kube_event ev = {.namespace = job->ns, .api_version = REC_API_VERSION, .kind = "CephaloJob", .name = job->name,
                     .uid = job->uid, .type = type, .reason = reason,
                     .message = msg, .component = REC_COMPONENT};
    err_t e;
    /* events are best effort: the status says the same; a lost one is said, not silent */
    if (kube_event_emit(k, &ev, &e) < 0)
        log_warn("%s/%s: the %s event was not recorded: %s", job->ns, job->name, reason, e.msg);
}

/* ---- writing it ------------------------------------------------------------------------------ */

typedef struct status_arg {
    cJSON *status; /* the wanted status (conditions' lastTransitionTime filled from the old one) */
} status_arg;

static int status_mutate(cJSON *obj, void *argp, err_t *err) {
    (void)err;
    status_arg *a = argp;
    const cJSON *old = rec_job_status(obj);
    if (old && cJSON_Compare(old, a->status, true)) return 0;
    cJSON_DeleteItemFromObjectCaseSensitive(obj, "status");
    cJSON_AddItemToObject(obj, "status", cJSON_Duplicate(a->status, true));
    return 1;
}

/* A status write refused (403) or accepted: the operator's readiness follows (rec_config), and the
 * first refusal of a run is said where a user looks, a Warning Event on the job (when the
 * operator may write events). */
static void status_denied(rec_ctx *x, bool denied, const err_t *err) {
    if (!x->c->status_denied) return;
    int was = atomic_exchange(x->c->status_denied, denied ? 1 : 0);
    if (!denied || was) return;
    char msg[800];
    snprintf(msg, sizeof msg, "the operator may not write this job's status (RBAC: update on cephalojobs/status): %.600s",
             err->msg);
    log_error("%s: %s", x->job.key, msg);
    rec_emit(x->k, &x->job.meta, "Warning", "StatusForbidden", msg);
}

/* Writes the job's status (taking it) unless it is what the store has already: a reconcile that
 * changes nothing sends nothing. The PUT carries the stored resourceVersion; when someone wrote
 * since (409) the job is read again and the status put on that. The answer goes into the store,
 * and the watch event it causes does not reconcile the job again (main.c: only spec changes do). */
int rec_write_status(rec_ctx *x, cJSON *status, err_t *err) {
    const cJSON *old = x->job.old.obj; /* the store's, as read */
    if (old && cJSON_Compare(old, status, true)) return cJSON_Delete(status), 0;
    cJSON *obj = cJSON_Duplicate(x->job.obj, true), *out = NULL;
    cJSON_DeleteItemFromObjectCaseSensitive(obj, "status");
    cJSON_AddItemToObject(obj, "status", status);
    long st = 0;
    int rc = kube_replace_status(x->k, x->job.path, obj, &out, &st, err);
    if (rc < 0 && st == 409) {
        status_arg a = {status}; /* obj holds it */
        rc = kube_update_retry(x->k, x->job.path, true, 5, status_mutate, &a, &out, &st, err);
    }
    cJSON_Delete(obj);
    if (rc == 0 && out) cache_put(x->c->caches->jobs, out, NULL);
    cJSON_Delete(out);
    status_denied(x, rc < 0 && st == 403, err);
    return rc < 0 && st == 404 ? 0 : rc; /* 404: deleted meanwhile */
}

/* ---- its parts ------------------------------------------------------------------------------- */

void rec_status_rate(cJSON *s, double rate) {
    char text[32];
    snprintf(text, sizeof text, "%.1f", rate);
    cJSON_DeleteItemFromObjectCaseSensitive(s, "samplesPerSecond");
    cJSON_DeleteItemFromObjectCaseSensitive(s, "samplesPerSecondText");
    cJSON_AddNumberToObject(s, "samplesPerSecond", rate);
    cJSON_AddStringToObject(s, "samplesPerSecondText", text);
}

cJSON *rec_status_base(rec_ctx *x, phase ph, const char *msg, cJSON **conds) {
    cJSON *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "phase", phase_name(ph));
    cJSON_AddStringToObject(s, "message", msg);
    cJSON_AddNumberToObject(s, "observedGeneration", x->job.meta.gen);
    if (*x->job.js.model_label) cJSON_AddStringToObject(s, "model", x->job.js.model_label);
    cJSON *c = cJSON_AddArrayToObject(s, "conditions");
    if (conds) *conds = c;
    cJSON_AddNumberToObject(s, "restarts", x->job.old.restarts);
    cJSON_AddNumberToObject(s, "replans", x->job.old.replans + (*x->plan.why ? 1 : 0));
    cJSON_AddNumberToObject(s, "attempt", x->job.attempt);
    const rec_status_view *o = &x->job.old;
    const struct { const char *key; rec_kept v; } kept[] = {
        {"step", o->step}, {"lastCheckpointStep", o->ckpt_step}, {"loss", o->loss}, {"restartBackoffSeconds", o->backoff_s}};
    for (size_t i = 0; i < sizeof kept / sizeof *kept; i++)
        if (kept[i].v.have) cJSON_AddNumberToObject(s, kept[i].key, kept[i].v.v);
    if (o->samples_per_s.have) rec_status_rate(s, o->samples_per_s.v);
    const struct { const char *key, *v; } times[] = {
        {"startTime", o->start_time}, {"completionTime", o->completion_time}, {"progressTime", o->progress_time},
        {"lastRestartTime", o->last_restart_time}, {"nextRestartTime", o->next_restart_time}};
    for (size_t i = 0; i < sizeof times / sizeof *times; i++)
        if (times[i].v) cJSON_AddStringToObject(s, times[i].key, times[i].v);
    return s;
}

/* status.plan.ranks[i]: where rank i runs and what the plan gives it. */
static cJSON *status_rank(const rec_ctx *x, const plan_view_rank *r, int i) {
    cJSON *o = cJSON_CreateObject();
    char pod[160]; /* NAME-RANK: at most REC_NAME_MAX + 5 */
    snprintf(pod, sizeof pod, "%s-%d", x->job.name, i);
    cJSON_AddNumberToObject(o, "rank", i);
    cJSON_AddStringToObject(o, "node", r->node);
    cJSON_AddStringToObject(o, "device", r->device);
    cJSON_AddStringToObject(o, "pod", pod);
    cJSON_AddNumberToObject(o, "batch", (double)r->batch);
    cJSON_AddNumberToObject(o, "microbatch", (double)r->microbatch);
    cJSON_AddNumberToObject(o, "microbatches", (double)r->microbatches);
    cJSON_AddStringToObject(o, "recompute", r->recompute ? r->recompute : "full"); /* an older plan recomputes */
    cJSON_AddNumberToObject(o, "stateRatio", r->state_ratio);
    cJSON_AddNumberToObject(o, "predictedPeakBytes", r->peak_bytes);
    return o;
}

void rec_status_plan(rec_ctx *x, cJSON *s) {
    const plan_view *p = &x->plan.view;
    cJSON *pl = cJSON_AddObjectToObject(s, "plan");
    cJSON_AddStringToObject(pl, "configMap", x->job.cm_name);
    cJSON_AddStringToObject(pl, "id", x->plan.id);
    cJSON_AddStringToObject(pl, "strategy", p->strategy);
    cJSON_AddNumberToObject(pl, "worldSize", p->world);
    cJSON_AddNumberToObject(pl, "predictedIterMs", p->iter_ms);
    cJSON_AddNumberToObject(pl, "predictedSamplesPerSecond", p->samples_per_s);
    cJSON_AddBoolToObject(pl, "estimated", x->plan.estimated);
    if (*x->plan.profile) cJSON_AddStringToObject(pl, "profile", x->plan.profile);
    cJSON *arr = cJSON_AddArrayToObject(pl, "ranks");
    for (int i = 0; i < p->world; i++) cJSON_AddItemToArray(arr, status_rank(x, &p->ranks[i], i));
}

/* Conditions for a phase: Created, Planned, then Running / Restarting / Succeeded / Failed. A
 * Restarting condition, once there, stays (False when the gang runs again). */
void rec_status_conditions(rec_ctx *x, cJSON *conds, phase ph, const char *reason, const char *msg) {
    char pmsg[256];
    snprintf(pmsg, sizeof pmsg, "%s plan on %d GPUs in ConfigMap %s: predicted %.1f ms per step, %.2f samples/s",
             x->plan.view.strategy, x->plan.view.world, x->job.cm_name, x->plan.view.iter_ms, x->plan.view.samples_per_s);
    rec_condition(x, conds, "Created", true, "Created", "the job was accepted by the operator");
    rec_condition(x, conds, "Planned", true, "Planned", pmsg);
    bool queued = ph == PHASE_QUEUED;
    rec_condition(x, conds, "Admitted", !queued, queued ? reason : "Admitted",
                  queued ? msg : "every GPU of its plan was free");
    bool running = ph == PHASE_RUNNING;
    rec_condition(x, conds, "Running", running, running ? "PodsRunning" : reason, msg);
    if (ph == PHASE_RESTARTING) rec_condition(x, conds, "Restarting", true, reason, msg);
    else if (rec_cond_find(&x->job.old, "Restarting"))
        rec_condition(x, conds, "Restarting", false, "GangStarted", "the gang of this attempt was started");
    if (ph == PHASE_SUCCEEDED) rec_condition(x, conds, "Succeeded", true, "Succeeded", msg);
    if (ph == PHASE_FAILED) rec_condition(x, conds, "Failed", true, reason, msg);
}

int rec_status_write(rec_ctx *x, phase ph, const char *reason, const char *msg, err_t *err) {
    cJSON *conds, *s = rec_status_base(x, ph, msg, &conds);
    rec_status_plan(x, s);
    rec_status_conditions(x, conds, ph, reason, msg);
    return rec_write_status(x, s, err);
}
