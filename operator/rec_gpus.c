/* rec_gpus.c - the GPUs a job may use (rec_internal.h; docs/operator.md, "GPUs shared between
 * jobs"): its usable GPUs among the nodes, all or only the free ones; whether a plan's ranks fit
 * the free ones; whether the plan's current gang holds its GPUs already (started, or ended and to
 * be seen through). What planning (rec_plan.c) and admission (rec_admit.c) both read, below both. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/str_map.h"
#include "operator/rec_internal.h"

/* ---- the usable GPUs ------------------------------------------------------------------------- */

int rec_job_cluster(const rec_config *rc, const rec_stores_part *st, const job_spec *js, const cJSON *pods,
                    const inv_held *const *held, int n_held, const char *own_uid, cluster *cl, inv_result *inv,
                    err_t *err) {
    const cache_view *nv = &st->nodes_view;
    const inv_node **nodes = NULL; /* the node store's digests, when it makes them (rec_caches_new) */
    if (nv->digested) {
        nodes = xmalloc((size_t)(nv->n + 1) * sizeof *nodes);
        for (int i = 0; i < nv->n; i++) nodes[i] = cache_view_digest(nv, i);
    }
    inv_constraints c = {.allowed_products = js->allowed_products, .node_selector = js->node_selector,
                         .archs = rc->worker_archs, .pods = pods, .held = held, .n_held = n_held,
                         .own_uid = own_uid, .tolerations = js->tolerations, .nodes_digested = nodes};
    int out = inv_build(rec_items(st->nodes), &c, cl, inv, err);
    free(nodes);
    return out;
}

static void build_inv(rec_ctx *x, job_inv *j, bool free_only) {
    const cache_view *bv = &x->stores.busy_view;
    const inv_held **held = NULL; /* the busy store's digests, when it makes them (main.c) */
    if (free_only && bv->digested) {
        held = xmalloc((size_t)(bv->n + 1) * sizeof *held);
        for (int i = 0; i < bv->n; i++) held[i] = cache_view_digest(bv, i);
    }
    const cJSON *pods = free_only && !held ? rec_items(x->stores.busy) : NULL;
    j->rc = rec_job_cluster(x->c, &x->stores, &x->job.js, pods, held, held ? bv->n : 0, x->job.meta.uid,
                            &j->cl, &j->r, &j->err);
    free(held);
    j->built = true;
}

const job_inv *rec_inv(rec_ctx *x, bool free_only) {
    job_inv *j = free_only ? &x->gpus.inv_free : &x->gpus.inv_all;
    if (!j->built) build_inv(x, j, free_only);
    return j;
}

int rec_inv_devices(const job_inv *j, int cap) { return cap > 0 && cap < j->cl.n_devices ? cap : j->cl.n_devices; }

/* ---- the plan's GPUs and its gang ----------------------------------------------------------- */

/* Every rank's node has as many GPUs free to the job (its own pods' count as free; no maxGPUs cap)
 * as the plan puts ranks on it. Both counted per node name in one pass: not a pass over the ranks
 * and the devices for each rank. */
bool rec_plan_fits(rec_ctx *x, const plan_view *pv) {
    const cluster *cl = &rec_inv(x, true)->cl;
    int world = pv->world, k = 0;
    int *room = xcalloc((size_t)world + 1, sizeof *room); /* per node of the plan (its index in at) */
    str_map at = {0};
    for (int r = 0; r < world; r++)
        if (str_map_put(&at, pv->ranks[r].node, k) < 0) k++;
    for (int d = 0; d < cl->n_devices; d++) {
        long i = str_map_get(&at, cl->nodes[cl->devices[d].node].name);
        if (i >= 0) room[i]++;
    }
    bool fits = true;
    for (int r = 0; r < world; r++) fits &= --room[str_map_get(&at, pv->ranks[r].node)] >= 0;
    str_map_free(&at);
    free(room);
    return fits;
}

/* A pod of the plan's current gang that ended (Succeeded or Failed) has GPUs free for others,
 * maybe taken already, but the job must first see it through (finish, or count the failure
 * against backoffLimit and restart) on the plan it ran. */
bool rec_gang_ended(const rec_ctx *x, const char *plan_id) {
    char att[32];
    snprintf(att, sizeof att, "%d", x->job.attempt);
    for (int i = 0; i < x->stores.n_pods; i++) {
        const rec_pod *p = &x->stores.pod[i];
        if (phase_finished(p->phase) && !strcmp(p->plan_id, plan_id) && !strcmp(p->attempt, att) &&
            rec_pod_owned(p, &x->job.meta))
            return true;
    }
    return false;
}

/* How many pods of plan_id's current gang exist, when none ended or is being deleted: the gang was
 * started on this plan (maybe by another leader, which stopped halfway) and holds its GPUs. Its
 * missing ranks are created on the same plan, not planned again. 0 otherwise. */
int rec_gang_started(const rec_ctx *x, const char *plan_id) {
    char att[32];
    snprintf(att, sizeof att, "%d", x->job.attempt);
    int started = 0;
    for (int i = 0; i < x->stores.n_pods; i++) {
        const rec_pod *p = &x->stores.pod[i];
        if (strcmp(p->plan_id, plan_id) || strcmp(p->attempt, att) || !rec_pod_owned(p, &x->job.meta)) continue;
        if (phase_finished(p->phase) || p->deleting) return 0;
        started++;
    }
    return started;
}
