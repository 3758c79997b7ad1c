/* plan.h - plans: the per-rank batch, microbatches and training-state shards of one strategy,
 * with their predicted times and memory; JSON (docs/formats.md) and table output. */
#ifndef CEPHALO_PLAN_H
#define CEPHALO_PLAN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/err.h"
#include "planner/cost.h"

#define PLAN_FORMAT "cephalo-plan"
#define PLAN_VERSION 1

typedef enum { STRAT_CEPHALO, STRAT_FSDP, STRAT_WHALE, STRAT_CB, STRAT_MB, STRAT_COUNT } strategy;

const char *strategy_name(strategy s);
int strategy_parse(const char *name, strategy *out, err_t *err);

typedef struct plan_rank {
    int batch, micro, micros; /* b = m * l */
    recompute_mode recompute; /* none: the rank keeps every unit's intermediates (no recompute) */
    int64_t state_params; /* sum of this rank's shards (the whole model when replicated) */
    double state_ratio;
    int64_t compute_bytes, state_bytes, peak_bytes;
    double usable_bytes, capacity_bytes;
    double host_bytes; /* the host offload pool (cost_host_bytes) */
    double fwd_ms, bwd_ms; /* l * F(m), l * K(m) */
    double opt_ms;
} plan_rank;

typedef struct plan {
    strategy strat;
    const cost_model *cm;
    bool feasible;
    char reason[768]; /* why not, when infeasible */
    int n_ranks, n_units;
    plan_rank *ranks;
    int64_t *shards; /* [n_units][n_ranks] shard sizes (elements) */
    bool replicated; /* whale: every rank holds the whole state */
    bool uneven; /* some unit is unevenly sharded: collectives pay the uneven factor */
    int n_uneven_units;
    double fwd_ms, bwd_ms; /* slowest rank per phase */
    double fwd_floor_ms, bwd_floor_ms, exposed_ms, opt_ms;
    double iter_ms, samples_per_s, mfu;
    long checks; /* optimizer feasibility tests */
    double solve_ms; /* wall time of planning */
    /* plan_make_limited's limits, handed to the optimizer, and whether they stopped it */
    double deadline_s; /* monotonic clock_now_s(); 0: none */
    const volatile int *cancel;
    bool expired;
} plan;

/* Builds the plan of a strategy. Returns 0 with plan->feasible set either way (an infeasible plan
 * carries the reason); -1 only for internal errors. */
int plan_make(const cost_model *cm, strategy s, plan *out, err_t *err);
/* plan_make within a time budget, for callers that cannot wait for ever (the operator): gives up
 * after budget_s seconds (> 0; 0: no budget) or as soon as *cancel (may be NULL) is non-zero.
 * Returns 1 when it gave up, with the error naming the budget (or saying it was cancelled) and
 * no plan in *out (nothing to free); otherwise as plan_make. Large batches on many GPUs are what
 * takes long (the optimizer's exact room DP is quadratic in the batch). */
int plan_make_limited(const cost_model *cm, strategy s, double budget_s, const volatile int *cancel,
                      plan *out, err_t *err);
void plan_free(plan *p);

/* Prices a given assignment (batch and microbatch per rank) like the planner prices its own:
 * even state when every rank can hold an even share, water-filled otherwise. */
int plan_evaluate(const cost_model *cm, const int *batch, const int *micro, plan *out, err_t *err);

/* Outputs. */
void plan_print_table(const plan *p, FILE *f);
int plan_write_json(const plan *p, FILE *f, err_t *err);
void plan_print_compare(const plan *plans, int n, FILE *f);
int plan_write_compare_json(const plan *plans, int n, FILE *f, err_t *err);
/* Every candidate (m, l) per rank with its time and memory, and the collective terms. */
int plan_dump_costs(const cost_model *cm, const char *path, err_t *err);

#endif
