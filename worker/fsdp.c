/* fsdp.c - the sharded state of a trainer (DESIGN 7, paper 3.1): each unit's flat buffer is
 * split by the plan's shard_sizes; before a unit computes, its parameters are all-gathered into a
 * slot, and after its backward its full gradient is reduce-scattered back onto the shards.
 *
 * Two parameter slots: the unit computing and the next one arriving (the gather of unit u+1 runs
 * on the communicator's thread while unit u computes). Two gradient slots: the unit
 * back-propagating and the previous one being reduce-scattered. Collectives complete in issue
 * order, so a slot's previous operation is always finished (or failed) before the slot is
 * reused; waiting for it is cheap bookkeeping.
 *
 * With one rank, or a replicated plan, nothing is gathered: the "slot" is the unit's own buffer
 * and gradients accumulate in place (replicated plans all-reduce each unit's gradient once its
 * last contribution is in). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "fsdp.h"
#include "log.h"

#define OP(d, name, ...) ((d)->ops->name((d), __VA_ARGS__))

static const int64_t *counts_of(const trainer *t, int u) {
    return t->cfg.shard_sizes + (int64_t)u * t->cfg.world;
}

/* Waits for a request, timing the wait (exposed communication). */
static int wait_req(trainer *t, comm_req **r, err_t *err) {
    if (!*r) return 0;
    double t0 = clock_now_ms();
    int rc = comm_wait(t->cfg.comm, *r, err);
    *r = NULL;
    t->wait_ms += clock_now_ms() - t0;
    if (rc < 0) t->comm_failed = true;
    return rc;
}

void fsdp_prefetch(trainer *t, int u, int slot) {
    if (!t->sharded) return;
    CHECK(t->pslot_req[slot] == NULL); /* the caller waited for the slot's previous unit */
    int64_t n = t->shard_n[u];
    if (n)
        t->dev.ops->copy(&t->dev, t->pslot[slot] + t->shard_off[u], t->params[u], (size_t)n * 4,
                         COPY_D2D);
    char what[64];
    snprintf(what, sizeof what, "unit %d parameters", u);
    t->pslot_req[slot] = comm_allgatherv(t->cfg.comm, t->pslot[slot], counts_of(t, u), COMM_F32, what);
    t->pslot_unit[slot] = u;
    t->n_gathers++;
}

float *fsdp_await(trainer *t, int u, int slot, err_t *err) {
    if (!t->sharded) return t->params[u];
    CHECK(t->pslot_unit[slot] == u);
    return wait_req(t, &t->pslot_req[slot], err) < 0 ? NULL : t->pslot[slot];
}

/* Adds a finished reduce-scatter's block (this rank's share of the sum) to the unit's shard. */
static int finish_reduce(trainer *t, int g, err_t *err) {
    if (!t->gslot_req[g]) return 0;
    if (wait_req(t, &t->gslot_req[g], err) < 0) return -1;
    int u = t->gslot_unit[g];
    int64_t n = t->shard_n[u];
    if (n) OP(&t->dev, axpy, t->grads[u], 1.0f, t->gslot[g] + t->shard_off[u], n);
    return 0;
}

float *fsdp_grad_begin(trainer *t, int u, int g, err_t *err) {
    if (!t->sharded) return t->grads[u];
    if (finish_reduce(t, g, err) < 0) return NULL;
    t->gslot_unit[g] = u;
    dev_zero(&t->dev, t->gslot[g], t->numel[u]);
    return t->gslot[g];
}

void fsdp_grad_end(trainer *t, int u, int g) {
    char what[64];
    snprintf(what, sizeof what, "unit %d gradients", u);
    if (t->sharded) {
        t->gslot_req[g] = comm_reduce_scatterv(t->cfg.comm, t->gslot[g], counts_of(t, u), COMM_F32, what);
        t->n_reduce_scatters++;
    } else if (t->cfg.comm && t->cfg.replicated) {
        CHECK(t->allreduce_req[u] == NULL);
        t->allreduce_req[u] = comm_allreduce(t->cfg.comm, t->grads[u], t->numel[u], COMM_F32, what);
        t->n_allreduces++;
    }
}

int fsdp_finish_grads(trainer *t, err_t *err) {
    int rc = 0;
    for (int g = 0; g < 2; g++)
        if (finish_reduce(t, g, err) < 0) rc = -1;
    for (int u = 0; t->allreduce_req && u < t->n_units; u++)
        if (wait_req(t, &t->allreduce_req[u], err) < 0) rc = -1;
    return rc;
}

int fsdp_allreduce_sums(trainer *t, double *v, int n, err_t *err) {
    if (!t->cfg.comm) return 0;
    t->n_allreduces++;
    comm_req *r = comm_allreduce(t->cfg.comm, v, n, COMM_F64, "the loss and gradient norm");
    return wait_req(t, &r, err);
}

/* Drops requests in flight after a failure (the communicator is broken by then, so every
 * request completes at once with the error). */
void fsdp_drain(trainer *t) {
    err_t ignored;
    for (int s = 0; s < 2; s++) {
        if (t->pslot_req[s]) comm_wait(t->cfg.comm, t->pslot_req[s], &ignored);
        if (t->gslot_req[s]) comm_wait(t->cfg.comm, t->gslot_req[s], &ignored);
        t->pslot_req[s] = t->gslot_req[s] = NULL;
    }
    for (int u = 0; t->allreduce_req && u < t->n_units; u++) {
        if (t->allreduce_req[u]) comm_wait(t->cfg.comm, t->allreduce_req[u], &ignored);
        t->allreduce_req[u] = NULL;
    }
}

/* ---- set-up ---- */

/* plan_read validated the shard sizes against the file (with its name in the message); a config
 * built in code that gets them wrong is a bug. */
static void check_shards(const trainer *t) {
    for (int u = 0; u < t->n_units; u++) {
        int64_t sum = 0;
        for (int r = 0; r < t->cfg.world; r++) {
            CHECK(counts_of(t, u)[r] >= 0);
            sum += counts_of(t, u)[r];
        }
        CHECK(sum == t->numel[u]);
    }
}

void fsdp_setup(trainer *t) {
    int n = t->n_units, world = t->cfg.world, rank = t->cfg.rank;
    t->shard_off = xcalloc((size_t)n, sizeof(int64_t));
    t->shard_n = xcalloc((size_t)n, sizeof(int64_t));
    t->sharded = world > 1 && !t->cfg.replicated;
    CHECK(world == 1 || t->cfg.comm != NULL);
    CHECK(!t->sharded || t->cfg.shard_sizes != NULL);
    if (t->sharded) check_shards(t);
    for (int u = 0; u < n; u++) {
        if (!t->sharded) {
            t->shard_n[u] = t->numel[u];
            continue;
        }
        const int64_t *c = counts_of(t, u);
        for (int r = 0; r < rank; r++) t->shard_off[u] += c[r];
        t->shard_n[u] = c[rank];
    }
    if (t->cfg.replicated && t->cfg.comm) t->allreduce_req = xcalloc((size_t)n, sizeof(comm_req *));
}

int fsdp_alloc_slots(trainer *t, err_t *err) {
    if (!t->sharded) return 0;
    int64_t max = 0;
    for (int u = 0; u < t->n_units; u++)
        if (t->numel[u] > max) max = t->numel[u];
    dev_set_context(&t->dev, "set-up of the gathered-parameter and gradient slots");
    const char *what[4] = {"gathered parameters", "gathered parameters (prefetch)",
                           "full gradients", "full gradients (reduce-scatter)"};
    float **slots[4] = {&t->pslot[0], &t->pslot[1], &t->gslot[0], &t->gslot[1]};
    for (int s = 0; s < 4; s++)
        if (!(*slots[s] = dev_alloc(&t->dev, (size_t)max * 4, what[s]))) return *err = t->dev.err, -1;
    t->pslot_unit[0] = t->pslot_unit[1] = t->gslot_unit[0] = t->gslot_unit[1] = -1;
    return 0;
}

void fsdp_free(trainer *t) {
    if (t->cfg.comm) fsdp_drain(t);
    for (int s = 0; s < 2; s++) dev_free(&t->dev, t->pslot[s]), dev_free(&t->dev, t->gslot[s]);
    free(t->shard_off), free(t->shard_n), free(t->allreduce_req), free(t->cfg.shard_sizes);
}
