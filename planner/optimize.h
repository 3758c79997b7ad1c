/* optimize.h - the exact batch/microbatch optimizer (docs/optimizer.md).
 *
 * Each rank i picks a microbatch m_i, a count l_i (batch b_i = m_i*l_i >= 1) and whether it
 * keeps its activations instead of recomputing them (recompute none: backward k_keep, within
 * keep_lmax microbatches and with keep_room of state room), with
 * sum b_i = B, m_i <= mmax of its group (memory constraint II) and, when need_room > 0,
 * sum_i room_i(m_i) >= need_room (constraint III: the training state fits in what compute leaves).
 * It minimises
 *     max(max_i l_i*f_i(m_i), A) + max(max_i l_i*k_i(m_i, keep_i), C)
 * exactly: a staircase walk over the two thresholds, each a binary search over the finite set of
 * achievable phase times, with a feasibility test built from bitset sumsets (and a max-plus DP
 * when constraint III can bind), both kept to the window of sums a split summing to B can pass
 * through, the DP also pruned by a Lagrangian bound (docs/optimizer.md, "Constraint (III) at
 * large batches"). */
#ifndef CEPHALO_OPTIMIZE_H
#define CEPHALO_OPTIMIZE_H

#include <stdbool.h>
#include <stdint.h>

typedef struct opt_group {
    int count; /* identical ranks */
    int mmax; /* microbatch sizes 1..mmax are allowed */
    const double *f, *k; /* [mmax+1], index m: forward / backward phase ms per microbatch */
    const int64_t *room; /* [mmax+1]: state params one rank can hold at microbatch m; may be NULL
                            when need_room == 0 */
    int max_micros; /* 0: any number of microbatches; 1: no gradient accumulation */
    /* Recompute none: a rank may keep every unit's intermediates instead of recomputing them in
     * the backward. k_keep [mmax+1]: its backward phase per microbatch (NULL: never keep);
     * keep_lmax [mmax+1]: the most microbatches of m whose intermediates fit; keep_room(keep_ctx,
     * m, l): the state room left with l of them kept (when need_room > 0; at most room[m] and
     * non-increasing in l, as kept intermediates only add memory). keep_only: a rank never
     * recomputes (a job forcing none). */
    const double *k_keep;
    const int *keep_lmax;
    int64_t (*keep_room)(const void *keep_ctx, int m, int l);
    const void *keep_ctx;
    bool keep_only;
} opt_group;

typedef struct opt_problem {
    int n_groups;
    const opt_group *groups;
    int batch;
    double fwd_floor, bwd_floor; /* A and C */
    int64_t need_room; /* 0: no aggregate memory constraint */
    int rank_batch_max; /* > 0: no rank's batch above it (the host offload pool); 0: batch - (ranks - 1) */
    double upper_bound; /* > 0: only objectives below it are of interest (a plan from another
                           regime already reaches it); opt_solve reports 1 when none is */
    /* Limits on the search (a caller with a time budget, e.g. the operator): give up once the
     * monotonic clock (clock_now_s) reaches deadline_s (> 0), or once *cancel is non-zero. The
     * feasibility tests and the room DP look at them, so the search stops within
     * milliseconds; opt_solve then reports 2. Zero / NULL: no limit. */
    double deadline_s;
    const volatile int *cancel;
    /* The reference mode (tests; CEPHALO_PLAN_EXHAUSTIVE_DP=1 in the planner): the room DPs and
     * sumsets over every batch sum 0..B, unpruned, and the Lagrangian bound over every batch, as
     * before the slack windows (docs/optimizer.md, "Constraint (III) at large batches"); the same
     * answers, quadratically slower: what the fast path is checked against. */
    bool exhaustive_dp;
} opt_problem;

typedef struct opt_result {
    int n_ranks;
    int *batch, *micro; /* per rank, ranks in group order */
    bool *keep; /* per rank: recompute none */
    double objective; /* max(F, A) + max(K, C) */
    double fwd_ms, bwd_ms; /* F and K of the chosen plan */
    long checks; /* feasibility tests run */
    long room_dps; /* of them, those the exact room DP decided (constraint III) */
} opt_result;

/* 0: optimum found; 1: infeasible (or nothing below upper_bound); 2: gave up (deadline_s or
 * cancel), r holds no assignment. */
int opt_solve(const opt_problem *p, opt_result *r);
void opt_result_free(opt_result *r);

/* The objective of a given assignment (keep: per rank, recompute none; NULL: none keeps), or
 * INFINITY when it breaks a constraint. Used by the exhaustive-search oracle in the tests. */
double opt_objective(const opt_problem *p, const int *batch, const int *micro, const bool *keep);

#endif
