/* reconcile.c - one CephaloJob reconciled (reconcile.h): the flow of rec_job, from the stores to
 * the status. Its steps live in the rec_*.c files (rec_internal.h says which does what). */
#include "operator/reconcile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json_util.h"
#include "common/log.h"
#include "operator/rec_internal.h"

void rec_stats_add(rec_stats *d, const rec_stats *s) {
    d->reconciles += s->reconciles, d->errors += s->errors, d->plans += s->plans;
    d->plan_failures += s->plan_failures, d->pods_created += s->pods_created;
    d->pods_deleted += s->pods_deleted, d->jobs_created += s->jobs_created;
    d->jobs_succeeded += s->jobs_succeeded, d->jobs_failed += s->jobs_failed;
    d->gang_restarts += s->gang_restarts, d->replans += s->replans;
    d->plan_timeouts += s->plan_timeouts;
}

int rec_job(kube_client *k, const rec_config *c, const char *ns, const char *name, rec_stats *st,
            err_t *err) {
    return rec_job_with(k, NULL, 0, c, ns, name, st, err);
}

/* The job from the store, its spec read once. 1; 0 when it is gone, being deleted (the garbage
 * collector deletes its objects) or terminal (a finished job keeps its pods' logs): nothing to do;
 * -1 with err set. Reads only. */
static int read_job(rec_ctx *x, err_t *err) {
    rec_job_part *j = &x->job;
    if (kube_path(j->path, sizeof j->path, REC_API_VERSION, j->ns, "cephalojobs", j->name, err) < 0) return -1;
    if (!(j->obj = cache_get(x->c->caches->jobs, j->ns, j->name))) return 0;
    j->js_rc = rec_job_read(j->obj, &j->meta, &j->old, &j->js, &j->js_err); /* a mistake fails it when planned */
    j->attempt = j->old.attempt;
    /* the CRD refuses longer names; without it the names derived from this one (pods, Service,
     * ConfigMap) must fail the job, not be cut into other objects' names */
    if (j->js_rc == 0 && strlen(j->name) > REC_NAME_MAX)
        j->js_rc = err_set(&j->js_err, "metadata.name: '%s' is %zu characters, at most %d (the job's Service and its "
                                       "pods' host names NAME-RANK are DNS labels of at most 63)", j->name,
                           strlen(j->name), REC_NAME_MAX);
    /* a cut name could be another job's ConfigMap (rec_clear_foreign deletes one it does not own):
     * a job with a name too long has none */
    if (strlen(j->name) <= REC_NAME_MAX) snprintf(j->cm_name, sizeof j->cm_name, "%s-plan", j->name);
    return !j->meta.deleting && !rec_terminal(&j->old);
}

/* The job (read_job); one that is nothing to do has its planning dropped, a suspended one its pods
 * deleted. 1 to go on, else the reconcile's result. */
static int open_job(rec_ctx *x, err_t *err) {
    int rc = read_job(x, err);
    if (rc == 0) rec_forget_plan(x);
    if (rc <= 0 || !x->job.js.suspend) return rc;
    rec_forget_plan(x);
    return rec_suspend_job(x, err);
}

/* What exists, read once from the watches' stores: the Nodes, the plan ConfigMap, the job's pods,
 * the pods that may hold GPUs. */
static void read_stores(rec_ctx *x) {
    const rec_caches *c = x->c->caches;
    rec_stores_part *s = &x->stores;
    s->nodes = cache_view_list(c->nodes, NULL, NULL, &s->nodes_view);
    s->cm = cache_get(c->configmaps, x->job.ns, x->job.cm_name);
    rec_cm_read(s->cm, &s->cmv);
    s->pods = rec_job_pods(x, &s->pods_view);
    s->pod = rec_pods_read(s->pods, &s->n_pods);
    s->busy = cache_view_list(c->busy, NULL, NULL, &s->busy_view);
}

/* From reading the stores to holding the GPUs, one job at a time: objects of an earlier job of
 * the same name, the GPUs to plan on, the plan, the admission (its pods assumed). A new plan is
 * written after the lock (rec_commit_plan; with the pods, for a new job: rec_side_writes_start).
 * 1 admitted, else the reconcile's result. */
static int plan_and_admit(rec_ctx *x, err_t *err) {
    rec_admit_lock(x);
    read_stores(x);
    int rc = rec_clear_foreign(x, err);
    if (rc > 0) rc = rec_wait_foreign(x, err);
    else if (rc == 0) rc = rec_choose_view(x, err);
    if (rc > 0) rc = rec_current_plan(x, err);
    if (rc > 0 && !phase_live(x->job.old.phase)) rc = rec_claims_ready(x, PHASE_QUEUED, err);
    if (rc > 0) rc = rec_admit(x, err);
    if (rc > 0) rec_assume_pods(x);
    rec_admit_unlock(x);
    if (rc == 0 && rec_commit_plan(x, x->k, err) < 0) rc = -1;
    return rc;
}

/* The admitted job's gang: its objects written, its pods sorted out; a failure, disruption or
 * refusal handled, else the missing pods created and the status written. */
static int run_gang(rec_ctx *x, gang *g, err_t *err) {
    int rc;
    if (rec_side_writes_start(x, err) < 0 || rec_gang_read(x, g, err) < 0) return -1;
    if (!rec_gang_decide(x, g, &rc, err)) return rc;
    /* a live job's new gang (a new job's claims were looked at before its admission) */
    if (g->missing > 0 && phase_live(x->job.old.phase) && (rc = rec_claims_ready(x, PHASE_RESTARTING, err)) <= 0)
        return rc;
    if (rec_create_pods(x, g, err) < 0) {
        rec_pods_not_created(x, err);
        return -1;
    }
    return rec_gang_status(x, g, err);
}

static void ctx_free(rec_ctx *x) {
    rec_admit_unlock(x);
    rec_forget_assumed(x);
    free(x->plan.fresh.json);
    plan_view_free(&x->plan.view);
    free(x->stores.pod);
    cache_view_release(&x->stores.pods_view);
    cache_view_release(&x->stores.busy_view);
    cluster_free(&x->gpus.inv_all.cl);
    cluster_free(&x->gpus.inv_free.cl);
    cJSON_Delete(x->stores.cm);
    cache_view_release(&x->stores.nodes_view);
    str_map_free(&x->stores.node_at);
    free(x->stores.node_by);
    rec_status_view_free(&x->job.old);
    cJSON_Delete(x->job.obj);
}

int rec_job_with(kube_client *k, kube_client *const *helpers, int n_helpers, const rec_config *c, const char *ns,
                 const char *name, rec_stats *st, err_t *err) {
    rec_ctx *x = xcalloc(1, sizeof *x); /* with its job_spec, some 20 KB */
    x->k = k, x->c = c, x->st = st, x->job.ns = ns, x->job.name = name, x->writes.helpers = helpers;
    x->writes.n_helpers = n_helpers < REC_MAX_HELPERS ? n_helpers : REC_MAX_HELPERS;
    gang g = {0};
    if (st) st->reconciles++, st->requeue_s = 0;
    snprintf(x->job.key, sizeof x->job.key, "%s/%s", ns, name);
    int rc = open_job(x, err);
    if (rc > 0) rc = plan_and_admit(x, err);
    if (rc > 0) rc = run_gang(x, &g, err);
    rc = rec_side_writes_join(x, rc, err);
    if (rc < 0 && st && kube_may_write(k)) st->errors++; /* a fenced write is no error (controller.c) */
    if (rc >= 0) rec_release_held(x); /* decided: its own assumptions (if admitted) took over */
    rec_gang_free(&g);
    ctx_free(x);
    free(x);
    return rc;
}

/* A gang another leader left half created (rec_hold_partial_gangs): pods of its plan's current
 * gang exist, none ended, some ranks missing. Their pods are assumed and held. 1 when so. */
static int hold_partial(const rec_config *c, const char *ns, const char *name) {
    rec_ctx *x = xcalloc(1, sizeof *x);
    x->c = c, x->job.ns = ns, x->job.name = name;
    snprintf(x->job.key, sizeof x->job.key, "%s/%s", ns, name);
    err_t err;
    int found = 0;
    if (read_job(x, &err) > 0 && !x->job.js.suspend) {
        read_stores(x);
        const char *plan_json = x->stores.cmv.plan_json;
        rec_plan_part *p = &x->plan;
        if (plan_json && snprintf(p->id, sizeof p->id, "%s", x->stores.cmv.plan_id) < (int)sizeof p->id &&
            rec_gang_started(x, p->id) > 0 && rec_plan_read(x, plan_json, &err) == 0) {
            rec_assume_pods(x); /* the ranks it lacks */
            found = x->writes.n_assumed > 0;
            if (found) log_msg("info", "%s: %d of its %d worker pods exist (plan %s): the missing ones are created on that "
                               "plan, their GPUs held meanwhile", x->job.key, p->view.world - x->writes.n_assumed,
                               p->view.world, p->id);
            rec_hold_assumed(x);
        }
    }
    ctx_free(x);
    free(x);
    return found;
}

void rec_hold_partial_gangs(const rec_config *c) {
    cache_view v;
    const cJSON *j, *jobs = cache_view_list(c->caches->jobs, NULL, NULL, &v);
    cJSON_ArrayForEach(j, rec_items(jobs)) {
        const char *ns = kube_meta_str(j, "namespace"), *name = kube_meta_str(j, "name");
        if (ns && name) hold_partial(c, ns, name);
    }
    cache_view_release(&v);
}
