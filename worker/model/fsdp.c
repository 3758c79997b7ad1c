/* fsdp.c - the sharded state of a trainer (docs/fsdp.md, paper 3.1): each unit's flat buffer is
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
 * last contribution is in).
 *
 * bf16/fp16 mixed precision: each rank rounds its fp32 shard to 16 bits, the 16-bit unit is
 * gathered (half the bytes) and widened into the fp32 slot the unit computes from. One rank rounds
 * its whole unit the same way, so every plan computes with the same 16-bit values. Gradients stay
 * fp32. With adamw half (train.h), the rounding is the optimizer's: its pass leaves each shard's
 * 16-bit copy in p16, which the gather sends (one rank: which is widened directly), the same bits
 * as rounding at the gather.
 *
 * Staged collectives (the cuda device with the socket backend, e.g. several ranks sharing one
 * GPU): the communicator works on host memory, so a slot's data goes through host copies hp/hg:
 * the own shard down before a gather and the gathered unit up after it; the full gradient down
 * before a reduce-scatter and the own block up after it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/log.h"
#include "model/fsdp.h"

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

/* The buffer a unit's parameters are gathered in: the 16-bit copy or the fp32 slot itself. */
static void *gather_buf(trainer *t, int slot) {
    return precision_half(t->cfg.prec) ? (void *)t->pbf[slot] : (void *)t->pslot[slot];
}

static comm_dtype gather_dtype(const trainer *t) {
    return t->cfg.prec == PREC_BF16 ? COMM_BF16 : t->cfg.prec == PREC_FP16 ? COMM_F16 : COMM_F32;
}

static size_t gather_elem(const trainer *t) { return (size_t)precision_gather_bytes(t->cfg.prec); }

/* Puts this rank's shard of unit u (as bf16/fp16 when so) at its place in the gather buffer; with
 * staging, also in the host copy the communicator reads. */
static void place_shard(trainer *t, int u, int slot) {
    device *d = &t->dev;
    int64_t n = t->shard_n[u], off = t->shard_off[u];
    /* the communicator overwrites hp[slot] (all of it, our block or not) once the gather is
     * issued: the device's copy of the previous gather out of it must be done first */
    if (t->staged) d->ops->event_sync(d, t->hp_read[slot]);
    if (!n) return;
    size_t es = gather_elem(t);
    char *buf = (char *)gather_buf(t, slot) + off * (int64_t)es;
    const void *src = t->params[u]; /* what the communicator sends */
    if (t->p16) {
        if (!t->sharded) return; /* fsdp_await widens p16[u] itself */
        src = t->p16[u];
        if (!t->staged) d->ops->copy(d, buf, src, (size_t)n * 2, COPY_D2D);
    } else if (precision_half(t->cfg.prec)) {
        dev_to_half(d, t->cfg.prec, (uint16_t *)buf, t->params[u], n);
        src = buf;
    } else if (!t->staged) {
        d->ops->copy(d, buf, t->params[u], (size_t)n * 4, COPY_D2D);
    }
    if (!t->staged) return;
    d->ops->copy(d, (char *)t->hp[slot] + off * (int64_t)es, src, (size_t)n * es, COPY_D2H);
}

/* adamw half: the 16-bit shard copies from the parameters, when something other than the
 * optimizer wrote them last (the initialisation, a resume); the optimizer keeps them fresh. */
static void refresh_p16(trainer *t) {
    for (int v = 0; v < t->n_units; v++)
        if (t->shard_n[v]) dev_to_half(&t->dev, t->cfg.prec, t->p16[v], t->params[v], t->shard_n[v]);
    t->p16_fresh = true;
}

void fsdp_prefetch(trainer *t, int u, int slot) {
    if (!t->gathered) return;
    if (t->p16 && !t->p16_fresh) refresh_p16(t);
    CHECK(t->pslot_req[slot] == NULL); /* the caller waited for the slot's previous unit */
    t->pslot_unit[slot] = u;
    place_shard(t, u, slot);
    if (!t->sharded) return; /* 16-bit with one rank: the rounded unit is complete */
    char what[64];
    snprintf(what, sizeof what, "unit %d parameters", u);
    void *buf = t->staged ? t->hp[slot] : gather_buf(t, slot);
    t->pslot_req[slot] = comm_allgatherv(t->cfg.comm, buf, counts_of(t, u),
                                         gather_dtype(t), what);
    t->n_gathers++;
}

float *fsdp_await(trainer *t, int u, int slot, err_t *err) {
    if (!t->gathered) return t->params[u];
    CHECK(t->pslot_unit[slot] == u);
    if (wait_req(t, &t->pslot_req[slot], err) < 0) return NULL;
    device *d = &t->dev;
    if (t->staged) { /* the gathered unit up to the device, behind the compute using the slot */
        d->ops->copy_async(d, gather_buf(t, slot), t->hp[slot], (size_t)t->numel[u] * gather_elem(t),
                           COPY_H2D, DEV_STREAM_COMPUTE);
        d->ops->event_record(d, t->hp_read[slot], DEV_STREAM_COMPUTE);
    }
    if (precision_half(t->cfg.prec)) {
        const uint16_t *h = t->p16 && !t->sharded ? t->p16[u] : t->pbf[slot];
        dev_from_half(d, t->cfg.prec, t->pslot[slot], h, t->numel[u]);
    }
    return t->pslot[slot];
}

/* Adds a finished reduce-scatter's block (this rank's share of the sum) to the unit's shard. */
static int finish_reduce(trainer *t, int g, err_t *err) {
    if (!t->gslot_req[g]) return 0;
    if (wait_req(t, &t->gslot_req[g], err) < 0) return -1;
    int u = t->gslot_unit[g];
    int64_t n = t->shard_n[u], off = t->shard_off[u];
    if (!n) return 0;
    if (t->staged) /* our block of the sum, back onto the device (the slot is free by now) */
        t->dev.ops->copy(&t->dev, t->gslot[g] + off, (float *)t->hg[g] + off, (size_t)n * 4, COPY_H2D);
    OP(&t->dev, axpy, t->grads[u], 1.0f, t->gslot[g] + off, n);
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
        void *buf = t->gslot[g];
        if (t->staged) { /* waits for the unit's backward to finish */
            t->dev.ops->copy(&t->dev, t->hg[g], t->gslot[g], (size_t)t->numel[u] * 4, COPY_D2H);
            buf = t->hg[g];
        }
        t->gslot_req[g] = comm_reduce_scatterv(t->cfg.comm, buf, counts_of(t, u), COMM_F32, what);
        t->n_reduce_scatters++;
    } else if (t->cfg.comm && t->cfg.replicated) {
        CHECK(t->allreduce_req[u] == NULL);
        /* staged: the whole gradient goes down now and comes back in fsdp_finish_grads */
        void *buf = t->grads[u];
        if (t->staged) {
            t->dev.ops->copy(&t->dev, t->hg[0], t->grads[u], (size_t)t->numel[u] * 4, COPY_D2H);
            t->allreduce_req[u] = comm_allreduce(t->cfg.comm, t->hg[0], t->numel[u], COMM_F32, what);
            t->n_allreduces++;
            err_t e;
            /* one host buffer: finish now (replicated plans do not overlap when staged) */
            if (wait_req(t, &t->allreduce_req[u], &e) == 0)
                t->dev.ops->copy(&t->dev, t->grads[u], t->hg[0], (size_t)t->numel[u] * 4, COPY_H2D);
            else
                t->staged_err = e;
            return;
        }
        t->allreduce_req[u] = comm_allreduce(t->cfg.comm, buf, t->numel[u], COMM_F32, what);
        t->n_allreduces++;
    }
}

int fsdp_finish_grads(trainer *t, err_t *err) {
    int rc = 0;
    for (int g = 0; g < 2; g++)
        if (finish_reduce(t, g, err) < 0) rc = -1;
    for (int u = 0; t->allreduce_req && u < t->n_units; u++)
        if (wait_req(t, &t->allreduce_req[u], err) < 0) rc = -1;
    if (t->staged_err.msg[0] && rc == 0) {
        *err = t->staged_err;
        rc = -1;
    }
    t->staged_err.msg[0] = 0;
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
    t->gathered = t->sharded || precision_half(t->cfg.prec);
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

/* Device bytes of the slots for a unit of `max` parameters: matches engine_compute_bytes. */
int fsdp_alloc_slots(trainer *t, err_t *err) {
    int64_t max = 0;
    for (int u = 0; u < t->n_units; u++)
        if (t->numel[u] > max) max = t->numel[u];
    device *d = &t->dev;
    dev_set_context(d, "set-up of the gathered-parameter and gradient slots");
    t->pslot_unit[0] = t->pslot_unit[1] = t->gslot_unit[0] = t->gslot_unit[1] = -1;
    const char *what[4] = {"gathered parameters", "gathered parameters (prefetch)",
                           "full gradients", "full gradients (reduce-scatter)"};
    float **slots[4] = {&t->pslot[0], &t->pslot[1], &t->gslot[0], &t->gslot[1]};
    int n_slots = t->sharded ? 4 : t->gathered ? 2 : 0;
    for (int s = 0; s < n_slots; s++)
        if (!(*slots[s] = dev_alloc(d, (size_t)max * 4, what[s]))) return *err = d->err, -1;
    for (int s = 0; s < 2 && precision_half(t->cfg.prec); s++)
        if (!(t->pbf[s] = dev_alloc(d, (size_t)max * 2, "gathered 16-bit parameters")))
            return *err = d->err, -1;
    for (int s = 0; s < 2 && t->staged; s++) {
        t->hp[s] = d->ops->host_alloc(d, (size_t)max * 4);
        t->hg[s] = d->ops->host_alloc(d, (size_t)max * 4);
        t->hp_read[s] = d->ops->event_new(d);
        if (!t->hp[s] || !t->hg[s])
            return err_set(err, "rank %d: cannot allocate the host copies of the slots (4 x %lld "
                           "bytes) for staged collectives", t->cfg.rank, (long long)max * 4);
    }
    return 0;
}

void fsdp_free(trainer *t) {
    if (t->cfg.comm) fsdp_drain(t);
    device *d = &t->dev;
    for (int s = 0; s < 2; s++) {
        dev_free(d, t->pslot[s]), dev_free(d, t->gslot[s]), dev_free(d, t->pbf[s]);
        d->ops->host_free(d, t->hp[s]);
        d->ops->host_free(d, t->hg[s]);
        if (t->hp_read[s]) d->ops->event_free(d, t->hp_read[s]);
    }
    free(t->shard_off), free(t->shard_n), free(t->allreduce_req), free(t->cfg.shard_sizes);
}
