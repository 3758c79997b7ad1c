/* strategy.c - plans for each strategy: cephalo's exact optimum and the baselines of `compare`.
 *
 *   cephalo  optimizer over (b, m, l) per rank, even or water-filled state, whichever is faster
 *   fsdp     b = B/N, no accumulation, even state (PyTorch FSDP's default)
 *   whale    b proportional to speed, no accumulation, replicated state, gradient all-reduce
 *   cb       compute-balanced b (exact min-max, no accumulation), even state
 *   mb       microbatch 1 (l = b), optimal b, memory-balanced state (water-filled when even
 *            shards do not fit, like cephalo) */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "common/clock.h"
#include "common/env.h"
#include "common/log.h"
#include "common/strutil.h"
#include "planner/arch.h"
#include "planner/optimize.h"
#include "planner/plan.h"
#include "planner/state_split.h"

static const char *const strategy_names[STRAT_COUNT] = {"cephalo", "fsdp", "whale", "cb", "mb"};

const char *strategy_name(strategy s) { return strategy_names[s]; }

int strategy_parse(const char *name, strategy *out, err_t *err) {
    for (int s = 0; s < STRAT_COUNT; s++) {
        if (strcasecmp(name, strategy_names[s]) == 0) {
            *out = (strategy)s;
            return 0;
        }
    }
    return err_set(err, "unknown strategy '%s' (expected cephalo, fsdp, whale, cb or mb)", name);
}

static void describe_rank(const cost_model *cm, int r, char *buf, size_t sz) {
    const cluster_device *d = &cm->cl->devices[r];
    snprintf(buf, sz, "rank %d (%s on %s)", r, d->threads ? d->type : d->spec->name,
             cm->cl->nodes[d->node].name);
}

static void plan_alloc(plan *p, const cost_model *cm, strategy s) {
    memset(p, 0, sizeof *p);
    p->strat = s;
    p->cm = cm;
    p->n_ranks = cm->cl->n_devices;
    p->n_units = model_n_units(cm->model);
    p->ranks = xcalloc((size_t)p->n_ranks, sizeof *p->ranks);
    p->shards = xcalloc((size_t)p->n_units * p->n_ranks, sizeof *p->shards);
}

void plan_free(plan *p) {
    free(p->ranks);
    free(p->shards);
    memset(p, 0, sizeof *p);
}

static int infeasible(plan *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int infeasible(plan *p, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->reason, sizeof p->reason, fmt, ap);
    va_end(ap);
    p->feasible = false;
    return 0;
}

/* ---- state ---- */

static void state_even(plan *p) {
    const model_spec *m = p->cm->model;
    for (int u = 0; u < p->n_units; u++)
        for (int i = 0; i < p->n_ranks; i++)
            p->shards[(size_t)u * p->n_ranks + i] = split_balanced(model_unit_params(m, u), p->n_ranks, i);
}

static void state_replicated(plan *p) {
    state_even(p); /* the shard table still describes ownership for checkpoints */
    p->replicated = true;
}

/* A rank's compute memory at its microbatch, count and recompute mode. */
static int64_t rank_compute_bytes(const cost_group *g, const plan_rank *r) {
    return cost_compute_bytes_mode(g, r->micro, r->batch / r->micro, r->recompute);
}

/* Water-fills the state over what compute leaves; returns -1 when it does not fit. */
static int state_waterfill(plan *p) {
    const cost_model *cm = p->cm;
    int n = p->n_ranks;
    double *cap = xmalloc((size_t)n * sizeof *cap);
    int64_t *compute = xmalloc((size_t)n * sizeof *compute), *room = xmalloc((size_t)n * sizeof *room);
    int64_t *params = xmalloc((size_t)n * sizeof *params), *numel = xmalloc((size_t)p->n_units * sizeof *numel);
    for (int i = 0; i < n; i++) {
        const cost_group *g = &cm->groups[cost_group_of(cm, i)];
        cap[i] = g->dev->memory_bytes;
        compute[i] = rank_compute_bytes(g, &p->ranks[i]);
        room[i] = (int64_t)floor((g->usable_bytes - (double)compute[i]) / cm->state_bpp);
    }
    for (int u = 0; u < p->n_units; u++) numel[u] = model_unit_params(cm->model, u);
    int rc = split_waterfill(n, cap, compute, room, cm->state_bpp, cm->params, params);
    if (rc == 0) p->n_uneven_units = split_shards(p->n_units, numel, n, params, p->shards);
    free(cap), free(compute), free(room), free(params), free(numel);
    return rc;
}

/* ---- predictions ---- */

/* Whether the ranks' host offload pools, each within the bound, can hold the batch at all. */
static bool host_pools_fit(const cost_model *cm) {
    return cm->opts.host_bytes <= 0 || (double)cm->host_bmax * cm->cl->n_devices >= cm->batch;
}

/* "1.60 GiB is usable (0.80 x the workers' memory limit 2.00 GiB)" */
static const char *host_limit_text(const cost_model *cm, char *buf, size_t n) {
    char use[32], lim[32];
    snprintf(buf, n, "%s is usable (%.2f x the workers' host memory %s)", str_bytes(cost_host_usable(cm), use, sizeof use),
             cm->opts.mem_cap, str_bytes(cm->opts.host_bytes, lim, sizeof lim));
    return buf;
}

/* Fills per-rank memory and times and the iteration prediction from batches, microbatches and
 * shards. Returns 0, or records the first rank that runs out of memory. */
static int finish(plan *p) {
    const cost_model *cm = p->cm;
    int64_t total = 0;
    p->uneven = false;
    for (int u = 0; u < p->n_units; u++) p->uneven |= split_is_uneven(p->shards + (size_t)u * p->n_ranks, p->n_ranks);
    if (p->replicated) p->uneven = false;
    p->fwd_ms = p->bwd_ms = p->opt_ms = 0;
    for (int i = 0; i < p->n_ranks; i++) {
        plan_rank *r = &p->ranks[i];
        const cost_group *g = &cm->groups[cost_group_of(cm, i)];
        r->micros = r->batch / r->micro;
        r->state_params = 0;
        for (int u = 0; u < p->n_units; u++) r->state_params += p->shards[(size_t)u * p->n_ranks + i];
        if (p->replicated) r->state_params = cm->params;
        total += r->state_params;
        r->state_ratio = (double)r->state_params / (double)cm->params;
        r->compute_bytes = rank_compute_bytes(g, r);
        if (p->replicated) r->compute_bytes -= (int64_t)g->slot_bytes; /* nothing gathered */
        r->state_bytes = r->state_params * cm->state_bpp;
        r->peak_bytes = r->compute_bytes + r->state_bytes;
        r->usable_bytes = g->usable_bytes;
        r->capacity_bytes = g->dev->memory_bytes;
        r->host_bytes = cost_host_bytes(cm, r->batch);
        r->fwd_ms = r->micros * g->fwd_ms[r->micro];
        r->bwd_ms = r->micros * cost_bwd_ms(g, r->micro, r->recompute);
        r->opt_ms = r->state_params * g->opt_ms_per_param;
        p->fwd_ms = fmax(p->fwd_ms, r->fwd_ms);
        p->bwd_ms = fmax(p->bwd_ms, r->bwd_ms);
        p->opt_ms = fmax(p->opt_ms, r->opt_ms);
    }
    if (p->replicated) {
        /* gradients all-reduced (reduce-scatter + all-gather volume in fp32) behind the backward */
        p->fwd_floor_ms = 0;
        p->bwd_floor_ms = 2 * (cm->comm.rs_ms + cm->comm.rs_last_ms);
        p->exposed_ms = 0;
    } else {
        p->fwd_floor_ms = cost_fwd_floor(cm, p->uneven);
        p->bwd_floor_ms = cost_bwd_floor(cm, p->uneven);
        p->exposed_ms = cost_exposed_ms(cm, p->uneven);
    }
    p->iter_ms = p->exposed_ms + fmax(p->fwd_ms, p->fwd_floor_ms) + fmax(p->bwd_ms, p->bwd_floor_ms) + p->opt_ms;
    p->samples_per_s = cm->batch / (p->iter_ms / 1e3);
    double peak_sum = 0;
    for (int gi = 0; gi < cm->n_groups; gi++) peak_sum += cm->groups[gi].peak_tflops * 1e12 * cm->groups[gi].count;
    p->mfu = p->samples_per_s * cost_flops_per_sample(cm) / peak_sum;
    CHECK(p->replicated || total == cm->params);
    for (int i = 0; i < p->n_ranks; i++) {
        plan_rank *r = &p->ranks[i];
        if (cm->opts.host_bytes <= 0 || r->host_bytes <= cost_host_usable(cm)) continue;
        char who[128], need[32], per[32], lim[128];
        describe_rank(cm, i, who, sizeof who);
        return infeasible(p, "out of host memory: %s offloads %s (%d samples x %s) but %s", who,
                          str_bytes(r->host_bytes, need, sizeof need), r->batch,
                          str_bytes(cm->host_per_sample, per, sizeof per), host_limit_text(cm, lim, sizeof lim));
    }
    for (int i = 0; i < p->n_ranks; i++) {
        plan_rank *r = &p->ranks[i];
        if (r->peak_bytes <= r->usable_bytes) continue;
        char who[128], need[32], have[32], cap[32], miss[32];
        describe_rank(cm, i, who, sizeof who);
        return infeasible(p, "out of memory: %s needs %s (compute at microbatch %d + %s state) but %s is usable (%.2f x %s); %s missing",
                          who, str_bytes((double)r->peak_bytes, need, sizeof need), r->micro,
                          p->replicated ? "replicated" : "its", str_bytes(r->usable_bytes, have, sizeof have),
                          cm->opts.mem_cap, str_bytes(r->capacity_bytes, cap, sizeof cap),
                          str_bytes((double)r->peak_bytes - r->usable_bytes, miss, sizeof miss));
    }
    p->feasible = true;
    return 0;
}

/* ---- the optimizer problems ---- */

typedef struct regime_problem {
    opt_problem prob;
    opt_group *groups;
    int64_t **room;
    int **keep_lmax;
    struct keep_ctx *keep; /* per group */
} regime_problem;

/* What the optimizer's keep_room reads: the group and whether the state is even. */
typedef struct keep_ctx {
    const cost_group *g;
    int state_bpp; /* cost_model.state_bpp */
} keep_ctx;

/* Parameters of state that fit beside `compute` bytes, at bpp bytes each. */
static int64_t room_of(const cost_group *g, int64_t compute, int bpp) {
    return (int64_t)floor((g->usable_bytes - (double)compute) / bpp);
}

static int64_t keep_room(const void *ctx, int m, int l) {
    const keep_ctx *k = ctx;
    return room_of(k->g, cost_compute_bytes_mode(k->g, m, l, RECOMPUTE_NONE), k->state_bpp);
}

/* The most microbatches of m a rank of g can keep with `state` bytes of state beside them (its
 * memory is linear in l); 0 when not one fits. */
static int keep_count(const cost_group *g, int m, int cap, double state) {
    double per = g->keep_ml * m, left = g->usable_bytes - state - (double)cost_compute_bytes_mode(g, m, 0, RECOMPUTE_NONE);
    int l = per > 0 ? (int)fmin(cap, fmax(0, floor(left / per))) : cap;
    while (l > 0 && (double)cost_compute_bytes_mode(g, m, l, RECOMPUTE_NONE) + state > g->usable_bytes) l--;
    while (l < cap && (double)cost_compute_bytes_mode(g, m, l + 1, RECOMPUTE_NONE) + state <= g->usable_bytes) l++;
    return l;
}

/* Recompute none as an option of group gi (the job's policy permitting): its backward times,
 * and how many microbatches fit per m. */
static void keep_option(const cost_model *cm, regime_problem *rp, int gi, double state) {
    const cost_group *g = &cm->groups[gi];
    opt_group *og = &rp->groups[gi];
    if (cm->opts.recompute == RECOMPUTE_FORCE_FULL) return;
    rp->keep_lmax[gi] = xcalloc((size_t)og->mmax + 1, sizeof(int));
    for (int m = 1; m <= og->mmax; m++) rp->keep_lmax[gi][m] = keep_count(g, m, cm->batch / m, state);
    rp->keep[gi].g = g;
    rp->keep[gi].state_bpp = cm->state_bpp;
    og->k_keep = g->bwd_keep_ms;
    og->keep_lmax = rp->keep_lmax[gi];
    og->keep_room = keep_room;
    og->keep_ctx = &rp->keep[gi];
    og->keep_only = cm->opts.recompute == RECOMPUTE_FORCE_NONE;
}

/* mcap: largest microbatch allowed (mb: 1); max_micros: 1 forbids accumulation; memory: honour
 * the per-rank limits (and offer recompute none where it fits); uneven: the water-filled regime
 * with constraint III. */
/* CEPHALO_PLAN_EXHAUSTIVE_DP=1: the optimizer's reference mode (opt_problem.exhaustive_dp): the
 * same plans, its room DP quadratic in the batch again. For checking the fast path on real
 * instances and for tests that need a plan taking minutes (the operator's planning budget). */
static bool plan_exhaustive_dp(void) { return env_flag("CEPHALO_PLAN_EXHAUSTIVE_DP", NULL) == 1; }

static void build_problem(const cost_model *cm, regime_problem *rp, int mcap, int max_micros,
                          bool memory, bool uneven) {
    memset(rp, 0, sizeof *rp);
    rp->groups = xcalloc((size_t)cm->n_groups, sizeof *rp->groups);
    rp->room = xcalloc((size_t)cm->n_groups, sizeof *rp->room);
    rp->keep_lmax = xcalloc((size_t)cm->n_groups, sizeof *rp->keep_lmax);
    rp->keep = xcalloc((size_t)cm->n_groups, sizeof *rp->keep);
    double even_state = (double)cm->even_state_params * cm->state_bpp;
    for (int gi = 0; gi < cm->n_groups; gi++) {
        const cost_group *g = &cm->groups[gi];
        opt_group *og = &rp->groups[gi];
        og->count = g->count;
        og->f = g->fwd_ms;
        og->k = g->bwd_ms;
        og->max_micros = max_micros;
        og->mmax = memory ? g->mmax : g->mlimit;
        if (memory && !uneven)
            while (og->mmax > 0 && (double)cost_compute_bytes(g, og->mmax) + even_state > g->usable_bytes) og->mmax--;
        if (og->mmax > mcap) og->mmax = mcap;
        if (uneven) {
            rp->room[gi] = xmalloc(((size_t)og->mmax + 1) * sizeof(int64_t));
            rp->room[gi][0] = 0;
            for (int m = 1; m <= og->mmax; m++) rp->room[gi][m] = room_of(g, cost_compute_bytes(g, m), cm->state_bpp);
            og->room = rp->room[gi];
        }
        if (memory) keep_option(cm, rp, gi, uneven ? 0 : even_state);
    }
    rp->prob = (opt_problem){.n_groups = cm->n_groups, .groups = rp->groups, .batch = cm->batch,
                             .fwd_floor = cost_fwd_floor(cm, uneven), .bwd_floor = cost_bwd_floor(cm, uneven),
                             .need_room = uneven ? cm->params : 0,
                             .rank_batch_max = cm->opts.host_bytes > 0 ? cm->host_bmax : 0,
                             .exhaustive_dp = plan_exhaustive_dp()};
}

static void free_problem(regime_problem *rp) {
    for (int gi = 0; gi < rp->prob.n_groups; gi++) free(rp->room[gi]), free(rp->keep_lmax[gi]);
    free(rp->room);
    free(rp->keep_lmax);
    free(rp->keep);
    free(rp->groups);
}

static bool any_empty_group(const regime_problem *rp) {
    for (int gi = 0; gi < rp->prob.n_groups; gi++)
        if (rp->groups[gi].mmax < 1) return true;
    return false;
}

/* opt_solve under the plan's limits (plan_make_limited); notes in the plan when they stopped it. */
static int solve_limited(plan *p, opt_problem *prob, opt_result *res) {
    prob->deadline_s = p->deadline_s;
    prob->cancel = p->cancel;
    int rc = opt_solve(prob, res);
    if (rc == 2) p->expired = true;
    return rc;
}

/* Solves one regime; returns its total (objective + exposed collectives) or INFINITY, also
 * when it cannot beat `beat` (the other regime's total). */
static double solve_regime(plan *p, int mcap, int max_micros, bool uneven, double beat, opt_result *res,
                           long *checks) {
    const cost_model *cm = p->cm;
    regime_problem rp;
    build_problem(cm, &rp, mcap, max_micros, true, uneven);
    if (isfinite(beat)) rp.prob.upper_bound = fmax(beat - cost_exposed_ms(cm, uneven), 1e-300);
    double total = INFINITY;
    if (!any_empty_group(&rp) && solve_limited(p, &rp.prob, res) == 0) total = res->objective + cost_exposed_ms(cm, uneven);
    *checks += res->checks;
    free_problem(&rp);
    return total;
}

/* The 16-bit precision to suggest for an fp32 plan: bf16 when every GPU has it (sm_80+), else
 * fp16, which every GPU runs (it halves the gathers and activations also on Pascal). */
static const char *half_hint(const cost_model *cm) {
    for (int r = 0; r < cm->cl->n_devices; r++) {
        const cluster_device *d = &cm->cl->devices[r];
        if (d->threads == 0 && d->cc_major > 0 && !gpu_cc_supports(d->cc_major, PREC_BF16)) return "--precision fp16";
    }
    return "--precision bf16";
}

/* What could make one sample fit on a device, for this model and precision only: a ViT has no
 * --seq (its tokens come from the image and patch size, which a model file sets), a sequence of 1
 * cannot shrink, and a bf16 or fp16 plan is 16-bit already. "A, B, or C" / "A or B". */
static const char *fit_hint(const cost_model *cm, char *buf, size_t n) {
    char shrink[64];
    const char *items[3];
    int k = 0;
    if (arch_of(cm->model->arch)->images)
        snprintf(shrink, sizeof shrink, "a model file with image: below %d", cm->model->image), items[k++] = shrink;
    else if (cm->seq > 1)
        items[k++] = "shorter --seq";
    if (!precision_half(cm->opts.prec)) items[k++] = half_hint(cm);
    items[k++] = "leave this device out";
    if (k == 1) snprintf(buf, n, "%s", items[0]);
    else if (k == 2) snprintf(buf, n, "%s or %s", items[0], items[1]);
    else snprintf(buf, n, "%s, %s, or %s", items[0], items[1], items[2]);
    return buf;
}

/* Explains why no plan exists: a device that cannot run one sample, or a state too large. */
static int explain_infeasible(plan *p, int mcap) {
    const cost_model *cm = p->cm;
    char who[128], a[32], b[32], c[32], d[32], hint[160];
    if (!host_pools_fit(cm)) {
        char lim[128];
        return infeasible(p, "the host offload pools do not fit: a sample takes %s of a rank's pool (%d units x %d tokens x "
                          "%d x 4 B) and %s, so each of the %d ranks holds at most %d samples, %d in all, fewer than the "
                          "batch %d; give the workers more host memory or lower the batch",
                          str_bytes(cm->host_per_sample, a, sizeof a), model_n_units(cm->model), cm->tokens,
                          cm->model->d_model, host_limit_text(cm, lim, sizeof lim), p->n_ranks, cm->host_bmax,
                          p->n_ranks * cm->host_bmax, cm->batch);
    }
    double room_sum = 0, room_max = 0;
    int roomiest = 0;
    for (int i = 0; i < p->n_ranks; i++) {
        const cost_group *g = &cm->groups[cost_group_of(cm, i)];
        double need = (double)cost_compute_bytes(g, 1);
        if (need > g->usable_bytes) {
            describe_rank(cm, i, who, sizeof who);
            return infeasible(p, "%s: compute memory at microbatch 1 is %s but only %s is usable (%.2f x %s); %s missing (%s)",
                              who, str_bytes(need, a, sizeof a), str_bytes(g->usable_bytes, b, sizeof b), cm->opts.mem_cap,
                              str_bytes(g->dev->memory_bytes, c, sizeof c), str_bytes(need - g->usable_bytes, d, sizeof d),
                              fit_hint(cm, hint, sizeof hint));
        }
        room_sum += g->usable_bytes - need;
        if (g->usable_bytes - need > room_max) room_max = g->usable_bytes - need, roomiest = i;
    }
    double state = (double)cm->params * cm->state_bpp;
    if (state > room_sum) {
        /* what would make it fit: more GPUs like the one with the most room, each bringing that room */
        const cluster_device *dev = &cm->cl->devices[roomiest];
        double more = room_max > 0 ? ceil((state - room_sum) / room_max) : 0;
        char add[200] = "add devices or memory";
        if (more > 0 && more < 1e6)
            snprintf(add, sizeof add, "it needs %.0f more GPU%s like the %s (%s usable after compute each), or GPUs with "
                     "more memory", more, more == 1 ? "" : "s", dev->threads ? dev->type : dev->spec->name,
                     str_bytes(room_max, d, sizeof d));
        return infeasible(p, "the training state (%s = %d B x %.4g params) does not fit: the devices have %s usable after compute at microbatch 1; %s missing in all (%s)",
                          str_bytes(state, a, sizeof a), cm->state_bpp, (double)cm->params,
                          str_bytes(room_sum, b, sizeof b), str_bytes(state - room_sum, c, sizeof c), add);
    }
    /* the job may have forced every rank to keep its activations */
    const char *rec = cm->opts.recompute == RECOMPUTE_FORCE_NONE
                          ? " with recompute none (every unit's activations kept on the device; recompute auto or full "
                            "lets devices recompute them)"
                          : "";
    if (mcap == 1) return infeasible(p, "no split of batch %d fits with microbatch 1%s", cm->batch, rec);
    return infeasible(p, "no split of batch %d satisfies the memory constraints%s", cm->batch, rec);
}

static int make_optimized(plan *p, int mcap) {
    opt_result even = {0}, uneven = {0};
    if (!host_pools_fit(p->cm)) return explain_infeasible(p, mcap);
    /* even first: the uneven regime then only searches below it (ties go to even shards) */
    double t_even = solve_regime(p, mcap, 0, false, INFINITY, &even, &p->checks);
    double t_uneven = solve_regime(p, mcap, 0, true, t_even, &uneven, &p->checks);
    int rc = 0;
    if (!isfinite(t_even) && !isfinite(t_uneven)) {
        rc = explain_infeasible(p, mcap);
    } else {
        opt_result *best = t_even <= t_uneven ? &even : &uneven;
        for (int i = 0; i < p->n_ranks; i++) {
            p->ranks[i].batch = best->batch[i];
            p->ranks[i].micro = best->micro[i];
            p->ranks[i].recompute = best->keep[i] ? RECOMPUTE_NONE : RECOMPUTE_FULL;
        }
        if (best == &even) state_even(p);
        else CHECK(state_waterfill(p) == 0);
        rc = finish(p);
        CHECK(p->feasible);
    }
    opt_result_free(&even);
    opt_result_free(&uneven);
    return rc;
}

static int make_fsdp(plan *p) {
    const cost_model *cm = p->cm;
    if (cm->batch % p->n_ranks)
        return infeasible(p, "global batch %d is not divisible by %d devices (FSDP gives every device B/N samples)", cm->batch, p->n_ranks);
    for (int i = 0; i < p->n_ranks; i++) p->ranks[i].batch = p->ranks[i].micro = cm->batch / p->n_ranks;
    state_even(p);
    return finish(p);
}

/* Batches proportional to each device's speed at microbatch 1, rounded by largest remainder. */
static int make_whale(plan *p) {
    const cost_model *cm = p->cm;
    int n = p->n_ranks;
    double *speed = xmalloc((size_t)n * sizeof *speed), sum = 0;
    for (int i = 0; i < n; i++) {
        const cost_group *g = &cm->groups[cost_group_of(cm, i)];
        speed[i] = 1.0 / (g->fwd_ms[1] + g->bwd_ms[1]);
        sum += speed[i];
    }
    int left = cm->batch - n; /* one sample each, the rest by speed */
    int given = 0;
    for (int i = 0; i < n; i++) {
        p->ranks[i].batch = 1 + (int)floor(left * speed[i] / sum);
        given += p->ranks[i].batch;
    }
    while (given < cm->batch) {
        int pick = 0;
        double best = -1;
        for (int i = 0; i < n; i++) {
            double frac = left * speed[i] / sum - (p->ranks[i].batch - 1);
            if (frac > best) best = frac, pick = i;
        }
        p->ranks[pick].batch++;
        given++;
    }
    for (int i = 0; i < n; i++) p->ranks[i].micro = p->ranks[i].batch;
    free(speed);
    state_replicated(p);
    return finish(p);
}

/* Exact min-max batch split without accumulation, memory ignored, then checked. */
static int make_cb(plan *p) {
    const cost_model *cm = p->cm;
    regime_problem rp;
    build_problem(cm, &rp, cm->batch, 1, false, false);
    opt_result res = {0};
    int rc = 0;
    if (solve_limited(p, &rp.prob, &res) != 0) {
        rc = infeasible(p, "no split of batch %d without accumulation", cm->batch);
    } else {
        for (int i = 0; i < p->n_ranks; i++) p->ranks[i].batch = p->ranks[i].micro = res.batch[i];
        state_even(p);
        rc = finish(p);
    }
    p->checks += res.checks;
    opt_result_free(&res);
    free_problem(&rp);
    return rc;
}

int plan_evaluate(const cost_model *cm, const int *batch, const int *micro, plan *out, err_t *err) {
    plan_alloc(out, cm, STRAT_CEPHALO);
    bool even = true;
    double even_state = (double)cm->even_state_params * cm->state_bpp;
    for (int i = 0; i < out->n_ranks; i++) {
        const cost_group *g = &cm->groups[cost_group_of(cm, i)];
        if (micro[i] < 1 || batch[i] < micro[i] || batch[i] % micro[i] || micro[i] > g->mlimit)
            return err_set(err, "rank %d: batch %d is not a multiple of microbatch %d within 1..%d", i, batch[i], micro[i], g->mlimit);
        out->ranks[i].batch = batch[i];
        out->ranks[i].micro = micro[i];
        even &= (double)cost_compute_bytes(g, micro[i]) + even_state <= g->usable_bytes;
    }
    if (even) state_even(out);
    else if (state_waterfill(out) < 0) return explain_infeasible(out, INT32_MAX);
    return finish(out);
}

int plan_make(const cost_model *cm, strategy s, plan *out, err_t *err) {
    return plan_make_limited(cm, s, 0, NULL, out, err);
}

int plan_make_limited(const cost_model *cm, strategy s, double budget_s, const volatile int *cancel,
                      plan *out, err_t *err) {
    double t0 = clock_now_ms();
    plan_alloc(out, cm, s);
    out->deadline_s = budget_s > 0 ? t0 / 1e3 + budget_s : 0;
    out->cancel = cancel;
    int rc = 0;
    switch (s) {
    case STRAT_CEPHALO: rc = make_optimized(out, INT32_MAX); break;
    case STRAT_MB: rc = make_optimized(out, 1); break;
    case STRAT_FSDP: rc = make_fsdp(out); break;
    case STRAT_WHALE: rc = make_whale(out); break;
    case STRAT_CB: rc = make_cb(out); break;
    default: CHECK(!"unknown strategy");
    }
    out->solve_ms = clock_now_ms() - t0;
    if (!out->expired) return rc;
    /* a plan found before the limit stopped another regime's search need not be the optimum */
    double took_s = out->solve_ms / 1e3;
    plan_free(out);
    if (cancel && *cancel)
        err_set(err, "planning was cancelled after %.1f s", took_s);
    else
        err_set(err, "planning exceeded its time budget of %g s (global batch %d on %d devices)", budget_s,
                cm->batch, cm->cl->n_devices);
    return 1;
}
