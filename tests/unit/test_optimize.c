/* test_optimize.c - the optimizer against exhaustive search.
 *
 * 1. Random abstract problems (up to 4 ranks, B up to 24, arbitrary non-monotone costs, random
 *    memory limits, aggregate-memory constraints and collective floors), with and without the
 *    option of keeping activations (recompute none: its own backward costs, count limits and
 *    room, or forced).
 * 2. Random real clusters (up to 4 GPUs of random catalog types, random models, B up to 24): the
 *    planner's predicted iteration time against the best of every assignment, each priced by an
 *    independent re-implementation of the model's rules (even or uneven state, constraint III),
 *    each rank recomputing or keeping its activations (auto, or forced by the policy).
 * Equal optimum every time, and the returned plan attains it.
 * 3. The windowed, pruned room DPs (the fast path) against the quadratic DP over every batch sum
 *    (opt_problem.exhaustive_dp), on the small problems of 1 and on larger ones (B up to 700, up
 *    to 40 ranks) whose room per batch is far from concave: the same answer, plan and tests. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner/cluster.h"
#include "planner/cost.h"
#include "planner/optimize.h"
#include "planner/plan.h"

#define MAXR 4
#define MAXB 24

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rng(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static int rnd(int lo, int hi) { return lo + (int)(rng() % (uint64_t)(hi - lo + 1)); }
static double rndf(double lo, double hi) { return lo + (hi - lo) * (double)(rng() >> 11) / (double)(1ull << 53); }

/* ---- exhaustive search over an abstract problem ---- */

typedef struct brute {
    const opt_problem *p;
    int n, rank_group[MAXR];
    int batch[MAXR], micro[MAXR];
    bool keep[MAXR];
    double best;
} brute;

/* The objective written out again from the definition, independent of optimize.c. */
static double brute_cost(const brute *b) {
    double F = 0, K = 0;
    int64_t room = 0;
    for (int i = 0; i < b->n; i++) {
        const opt_group *g = &b->p->groups[b->rank_group[i]];
        int m = b->micro[i], l = b->batch[i] / m;
        const double *k = b->keep[i] ? g->k_keep : g->k;
        if (l * g->f[m] > F) F = l * g->f[m];
        if (l * k[m] > K) K = l * k[m];
        if (b->p->need_room > 0) room += b->keep[i] ? g->keep_room(g->keep_ctx, m, l) : g->room[m];
    }
    if (b->p->need_room > 0 && room < b->p->need_room) return INFINITY;
    return (F > b->p->fwd_floor ? F : b->p->fwd_floor) + (K > b->p->bwd_floor ? K : b->p->bwd_floor);
}

static void brute_rec(brute *b, int i, int left) {
    if (i == b->n) {
        if (left == 0) {
            double c = brute_cost(b);
            if (c < b->best) b->best = c;
        }
        return;
    }
    const opt_group *g = &b->p->groups[b->rank_group[i]];
    for (int m = 1; m <= g->mmax && m <= left; m++)
        for (int l = 1; m * l <= left; l++) {
            if (g->max_micros > 0 && l > g->max_micros) break;
            b->batch[i] = m * l;
            b->micro[i] = m;
            for (int keep = 0; keep < 2; keep++) {
                if (keep ? !g->k_keep || l > g->keep_lmax[m] : g->keep_only) continue;
                b->keep[i] = keep;
                brute_rec(b, i + 1, left - m * l);
            }
        }
}

static double brute_solve(const opt_problem *p) {
    brute b = {.p = p, .best = INFINITY};
    for (int gi = 0; gi < p->n_groups; gi++)
        for (int c = 0; c < p->groups[gi].count; c++) b.rank_group[b.n++] = gi;
    brute_rec(&b, 0, p->batch);
    return b.best;
}

/* ---- random abstract problems ---- */

typedef struct rand_problem {
    opt_problem p;
    opt_group g[MAXR];
    double f[MAXR][MAXB + 1], k[MAXR][MAXB + 1], kk[MAXR][MAXB + 1];
    int64_t room[MAXR][MAXB + 1], keep_per[MAXR][MAXB + 1];
    int keep_lmax[MAXR][MAXB + 1];
} rand_problem;

/* Room with l microbatches kept: the full room less a random amount per microbatch (kept
 * intermediates take memory from the state), as the planner's never above the full room. */
typedef struct rand_keep {
    const int64_t *room, *per;
} rand_keep;
static rand_keep keep_ctx[MAXR];
static int64_t rand_keep_room(const void *ctx, int m, int l) {
    const rand_keep *k = ctx;
    return k->room[m] - k->per[m] * l;
}

static void make_random(rand_problem *rp) {
    memset(rp, 0, sizeof *rp);
    int n = rnd(1, MAXR), B = rnd(n, MAXB), ng = 0;
    int64_t room_total = 0;
    for (int left = n; left > 0;) {
        opt_group *g = &rp->g[ng];
        g->count = rnd(1, left);
        left -= g->count;
        g->mmax = rnd(1, B);
        g->max_micros = rnd(0, 5) == 0 ? 1 : 0;
        double base = rndf(0.5, 5), slope = rndf(0.1, 3), ratio = rndf(1.2, 3.5);
        bool small_ints = rnd(0, 2) == 0; /* small integer costs provoke ties */
        int64_t r0 = rnd(0, 100);
        for (int m = 1; m <= g->mmax; m++) {
            double t = base + slope * m * rndf(0.6, 1.4);
            rp->f[ng][m] = small_ints ? rnd(1, 6) : t;
            rp->k[ng][m] = small_ints ? rnd(1, 9) : t * ratio * rndf(0.8, 1.2);
            rp->room[ng][m] = r0 - rnd(0, 8) * m;
        }
        g->f = rp->f[ng];
        g->k = rp->k[ng];
        g->room = rp->room[ng];
        if (rnd(0, 3)) { /* keeping is an option: faster backward, fewer microbatches, less room */
            for (int m = 1; m <= g->mmax; m++) {
                rp->kk[ng][m] = small_ints ? rnd(1, (int)rp->k[ng][m]) : rp->k[ng][m] * rndf(0.5, 1.0);
                rp->keep_lmax[ng][m] = rnd(0, 6);
                rp->keep_per[ng][m] = rnd(0, 6);
            }
            keep_ctx[ng] = (rand_keep){rp->room[ng], rp->keep_per[ng]};
            g->k_keep = rp->kk[ng];
            g->keep_lmax = rp->keep_lmax[ng];
            g->keep_room = rand_keep_room;
            g->keep_ctx = &keep_ctx[ng];
            g->keep_only = rnd(0, 4) == 0;
        }
        room_total += rp->room[ng][1] * g->count;
        ng++;
    }
    rp->p.n_groups = ng;
    rp->p.groups = rp->g;
    rp->p.batch = B;
    rp->p.fwd_floor = rnd(0, 2) ? 0 : rndf(0, 20);
    rp->p.bwd_floor = rnd(0, 2) ? 0 : rndf(0, 40);
    rp->p.need_room = rnd(0, 1) ? 0 : (room_total > 0 ? rnd(1, (int)room_total + 20) : 1);
}

static void test_random_problems_match_exhaustive(void **state) {
    (void)state;
    int feasible = 0, kept = 0;
    for (int it = 0; it < 1500; it++) {
        rand_problem rp;
        make_random(&rp);
        double expect = brute_solve(&rp.p);
        opt_result r;
        int rc = opt_solve(&rp.p, &r);
        if (!isfinite(expect)) {
            if (rc != 1) fprintf(stderr, "instance %d: exhaustive says infeasible, optimizer found %g\n", it, r.objective);
            assert_int_equal(rc, 1);
            continue;
        }
        feasible++;
        if (rc != 0) fprintf(stderr, "instance %d: optimizer says infeasible, exhaustive found %g\n", it, expect);
        assert_int_equal(rc, 0);
        if (fabs(r.objective - expect) > 1e-9 * expect)
            fprintf(stderr, "instance %d: optimizer %.12g vs exhaustive %.12g\n", it, r.objective, expect);
        assert_true(fabs(r.objective - expect) <= 1e-9 * expect);
        /* the assignment returned is valid and attains the optimum */
        int sum = 0;
        for (int i = 0; i < r.n_ranks; i++) {
            assert_true(r.micro[i] >= 1);
            assert_int_equal(r.batch[i] % r.micro[i], 0);
            sum += r.batch[i];
        }
        assert_int_equal(sum, rp.p.batch);
        assert_true(fabs(opt_objective(&rp.p, r.batch, r.micro, r.keep) - expect) <= 1e-9 * expect);
        for (int i = 0; i < r.n_ranks; i++) kept += r.keep[i];
        opt_result_free(&r);
    }
    assert_true(feasible > 300); /* the sample must exercise feasible instances */
    assert_true(kept > 100);     /* ... and plans that keep activations */
}

/* ---- the fast room DPs against the quadratic reference ---- */

/* Solves p twice, fast and as the reference, and asserts the same outcome: status, objective,
 * the whole assignment and the feasibility tests run (each test's answer is exact either way,
 * so the searches take the same path). Returns the room DPs the fast run decided. */
static long check_fast_matches_reference(opt_problem *p, int it) {
    opt_result fast, ref;
    p->exhaustive_dp = false;
    int rc = opt_solve(p, &fast);
    p->exhaustive_dp = true;
    int rc_ref = opt_solve(p, &ref);
    p->exhaustive_dp = false;
    if (rc != rc_ref || (rc == 0 && fast.objective != ref.objective))
        fprintf(stderr, "instance %d: fast %d %.12g, reference %d %.12g\n", it, rc, fast.objective, rc_ref, ref.objective);
    assert_int_equal(rc, rc_ref);
    assert_int_equal(fast.checks, ref.checks);
    if (rc == 0) {
        assert_true(fast.objective == ref.objective);
        for (int i = 0; i < fast.n_ranks; i++) {
            assert_int_equal(fast.batch[i], ref.batch[i]);
            assert_int_equal(fast.micro[i], ref.micro[i]);
            assert_int_equal(fast.keep[i], ref.keep[i]);
        }
    }
    long dps = fast.room_dps;
    opt_result_free(&fast);
    opt_result_free(&ref);
    return dps;
}

#define BIG_B 700
#define BIG_M 48
#define BIG_G 3

typedef struct big_problem {
    opt_problem p;
    opt_group g[BIG_G];
    double f[BIG_G][BIG_M + 1], k[BIG_G][BIG_M + 1], kk[BIG_G][BIG_M + 1];
    int64_t room[BIG_G][BIG_M + 1], keep_per[BIG_G][BIG_M + 1];
    int keep_lmax[BIG_G][BIG_M + 1];
} big_problem;
static rand_keep big_keep_ctx[BIG_G];

/* Whether a group's room per batch, max over the microbatches that divide it (all counts
 * allowed), is concave over the batches that have one: the windows must not rely on it. */
static bool room_concave(const opt_group *g, int B) {
    int64_t h[BIG_B + 1];
    int prev = 0, prev2 = 0;
    for (int b = 1; b <= B; b++) {
        h[b] = INT64_MIN;
        for (int m = 1; m <= g->mmax && m <= b; m++)
            if (b % m == 0 && g->room[m] > h[b]) h[b] = g->room[m];
        if (h[b] == INT64_MIN) continue;
        /* the middle point on or above the chord of its neighbours, for every triple */
        if (prev2 && (h[prev] - h[prev2]) * (b - prev) < (h[b] - h[prev]) * (prev - prev2)) return false;
        prev2 = prev, prev = b;
    }
    return true;
}

/* Up to 40 ranks in up to 3 groups, B up to 700, random non-monotone costs and room per
 * microbatch, keeping allowed in some groups, and constraint III between the least and the most
 * room the ranks could offer, where it binds and the DPs decide. */
static void make_big(big_problem *bp) {
    memset(bp, 0, sizeof *bp);
    int ng = rnd(1, BIG_G), n = 0;
    int64_t lo_room = 0, hi_room = 0;
    for (int gi = 0; gi < ng; gi++) {
        opt_group *g = &bp->g[gi];
        g->count = rnd(1, gi == 0 ? 24 : 8);
        n += g->count;
        g->mmax = rnd(1, BIG_M);
        double base = rndf(0.5, 5), slope = rndf(0.1, 3);
        int64_t r0 = rnd(200, 2000), rmin = INT64_MAX, rmax = INT64_MIN;
        for (int m = 1; m <= g->mmax; m++) {
            bp->f[gi][m] = base + slope * m * rndf(0.7, 1.3);
            bp->k[gi][m] = bp->f[gi][m] * rndf(1.5, 3);
            bp->room[gi][m] = r0 - rnd(0, 40) * m + rnd(-50, 50); /* jagged: far from concave */
            if (bp->room[gi][m] < rmin) rmin = bp->room[gi][m];
            if (bp->room[gi][m] > rmax) rmax = bp->room[gi][m];
        }
        g->f = bp->f[gi];
        g->k = bp->k[gi];
        g->room = bp->room[gi];
        if (rnd(0, 2) == 0) {
            for (int m = 1; m <= g->mmax; m++) {
                bp->kk[gi][m] = bp->k[gi][m] * rndf(0.5, 1.0);
                bp->keep_lmax[gi][m] = rnd(0, 40);
                bp->keep_per[gi][m] = rnd(0, 30);
            }
            big_keep_ctx[gi] = (rand_keep){bp->room[gi], bp->keep_per[gi]};
            g->k_keep = bp->kk[gi];
            g->keep_lmax = bp->keep_lmax[gi];
            g->keep_room = rand_keep_room;
            g->keep_ctx = &big_keep_ctx[gi];
            rmin -= 30 * 40;
        }
        lo_room += rmin * g->count;
        hi_room += rmax * g->count;
    }
    bp->p.n_groups = ng;
    bp->p.groups = bp->g;
    bp->p.batch = rnd(n, BIG_B);
    bp->p.need_room = lo_room + (int64_t)((double)(hi_room - lo_room) * rndf(0.3, 1.0));
    if (bp->p.need_room < 1) bp->p.need_room = 1;
}

static void test_fast_dp_matches_reference(void **state) {
    (void)state;
    long dps = 0;
    for (int it = 0; it < 1500; it++) {
        rand_problem rp;
        make_random(&rp);
        dps += check_fast_matches_reference(&rp.p, it);
    }
    assert_true(dps > 50); /* the small problems reach the exact DP too */
    long big_dps = 0;
    int feasible = 0, nonconcave = 0;
    for (int it = 0; it < 150; it++) {
        big_problem bp;
        make_big(&bp);
        for (int gi = 0; gi < bp.p.n_groups; gi++) nonconcave += !room_concave(&bp.g[gi], bp.p.batch);
        opt_result r;
        feasible += opt_solve(&bp.p, &r) == 0;
        opt_result_free(&r);
        big_dps += check_fast_matches_reference(&bp.p, 10000 + it);
    }
    fprintf(stderr, "fast vs reference: %ld small and %ld large room DPs, %d large feasible, %d non-concave groups\n",
            dps, big_dps, feasible, nonconcave);
    assert_true(big_dps > 30);    /* the large ones exercise the windows and the pruning */
    assert_true(feasible > 30);   /* ... on instances with a plan to compare */
    assert_true(nonconcave > 50); /* ... whose room per batch is not concave */
}

/* ---- random real clusters ---- */

static const char *const gpu_types[] = {"P40", "P100", "V100-16GB", "T4", "A10G", "L4", "A6000", "A100-40GB", "RTX-3090"};
static const char *const model_names[] = {"gpt2-124m", "gpt2-774m", "gpt2-1.5b", "bert-large", "tinyllama-1.1b", "llama-3b", "vit-g"};

/* Cost of one full assignment under the rules of docs/optimizer.md, written out from cost_model data. */
static double model_cost(const cost_model *cm, const int *batch, const int *micro, const bool *keep) {
    int n = cm->cl->n_devices;
    double F = 0, K = 0;
    bool even_ok = true;
    int64_t room = 0;
    for (int i = 0; i < n; i++) {
        const cost_group *g = &cm->groups[cost_group_of(cm, i)];
        int m = micro[i], l = batch[i] / micro[i];
        /* recompute none keeps l microbatches' intermediates: M(m) + keep_m1*m + keep_ml*m*l */
        double mem = (double)cost_compute_bytes_mode(g, m, l, keep[i] ? RECOMPUTE_NONE : RECOMPUTE_FULL);
        if (mem > g->usable_bytes) return INFINITY; /* constraint II */
        if (mem + (double)cm->even_state_params * cm->state_bpp > g->usable_bytes) even_ok = false;
        room += (int64_t)floor((g->usable_bytes - mem) / cm->state_bpp);
        F = fmax(F, l * g->fwd_ms[m]);
        K = fmax(K, l * (keep[i] ? g->bwd_keep_ms : g->bwd_ms)[m]);
    }
    if (!even_ok && room < cm->params) return INFINITY; /* constraint III */
    bool uneven = !even_ok;
    return cost_exposed_ms(cm, uneven) + fmax(F, cost_fwd_floor(cm, uneven)) + fmax(K, cost_bwd_floor(cm, uneven));
}

static double cluster_brute(const cost_model *cm, int i, int left, int *batch, int *micro, bool *keep) {
    int n = cm->cl->n_devices;
    if (i == n) return left == 0 ? model_cost(cm, batch, micro, keep) : INFINITY;
    double best = INFINITY;
    int rest = n - i - 1;
    for (int b = 1; b <= left - rest; b++)
        for (int m = 1; m <= b; m++) {
            if (b % m) continue;
            batch[i] = b;
            micro[i] = m;
            for (int k = 0; k < 2; k++) {
                if (k ? cm->opts.recompute == RECOMPUTE_FORCE_FULL : cm->opts.recompute == RECOMPUTE_FORCE_NONE) continue;
                keep[i] = k;
                best = fmin(best, cluster_brute(cm, i + 1, left - b, batch, micro, keep));
            }
        }
    return best;
}

static void test_random_clusters_match_exhaustive(void **state) {
    (void)state;
    int feasible = 0, uneven = 0, kept = 0, mixed = 0;
    for (int it = 0; it < 250; it++) {
        cluster cl;
        cluster_init(&cl);
        err_t err;
        int n = rnd(1, MAXR), nodes = rnd(1, 2);
        for (int k = 0; k < nodes; k++) {
            char name[32];
            snprintf(name, sizeof name, "node-%d", k);
            assert_int_equal(cluster_add_node(&cl, name, rndf(10, 100)), 0);
            int here = k == nodes - 1 ? n - cl.n_devices : rnd(0, n - cl.n_devices);
            for (int d = 0; d < here; d++)
                assert_int_equal(cluster_add_devices(&cl, gpu_types[rnd(0, 8)], 1, &err), 0);
        }
        if (cl.n_devices == 0) assert_int_equal(cluster_add_devices(&cl, "L4", 1, &err), 0);
        model_spec m;
        assert_int_equal(model_resolve(model_names[rnd(0, 6)], &m, &err), 0);
        int B = rnd(cl.n_devices, MAXB);
        cost_opts co = {.prec = (precision)rnd(0, PREC_COUNT - 1), .mem_cap = rndf(0.3, 0.9),
                        .recompute = rnd(0, 3) ? RECOMPUTE_AUTO : (recompute_policy)rnd(1, 2)};
        cost_model cm;
        int seq = m.arch == ARCH_VIT ? 0 : 128 * rnd(1, m.max_seq / 128 < 8 ? m.max_seq / 128 : 8);
        /* bf16 on a cluster with a pre-Ampere GPU is refused, not planned */
        err_t perr;
        if (cluster_check_precision(&cl, co.prec, "precision", &perr) < 0) {
            assert_int_equal(co.prec, PREC_BF16);
            assert_int_equal(cost_build(&cm, &m, &cl, seq, B, &co, &err), -1);
            cluster_free(&cl);
            continue;
        }
        assert_int_equal(cost_build(&cm, &m, &cl, seq, B, &co, &err), 0);
        int batch[MAXR], micro[MAXR];
        bool keep[MAXR];
        double expect = cluster_brute(&cm, 0, B, batch, micro, keep);
        plan p;
        assert_int_equal(plan_make(&cm, STRAT_CEPHALO, &p, &err), 0);
        if (!isfinite(expect)) {
            assert_false(p.feasible);
        } else {
            feasible++;
            uneven += p.uneven;
            if (!p.feasible) fprintf(stderr, "cluster %d: planner infeasible (%s), exhaustive %g\n", it, p.reason, expect);
            assert_true(p.feasible);
            double got = p.iter_ms - p.opt_ms;
            if (fabs(got - expect) > 1e-9 * expect)
                fprintf(stderr, "cluster %d (%s, B=%d): planner %.12g vs exhaustive %.12g\n", it, m.name, B, got, expect);
            assert_true(fabs(got - expect) <= 1e-9 * expect);
            int nk = 0;
            for (int i = 0; i < p.n_ranks; i++) {
                nk += p.ranks[i].recompute == RECOMPUTE_NONE;
                /* a forced policy is honoured; its memory within the device's */
                if (co.recompute == RECOMPUTE_FORCE_FULL) assert_int_equal(p.ranks[i].recompute, RECOMPUTE_FULL);
                if (co.recompute == RECOMPUTE_FORCE_NONE) assert_int_equal(p.ranks[i].recompute, RECOMPUTE_NONE);
                assert_true((double)p.ranks[i].peak_bytes <= p.ranks[i].usable_bytes);
            }
            kept += nk > 0;
            mixed += nk > 0 && nk < p.n_ranks;
        }
        plan_free(&p);
        cost_free(&cm);
        cluster_free(&cl);
    }
    assert_true(feasible > 50);
    assert_true(uneven > 5); /* memory-bound instances where uneven state wins are covered */
    assert_true(kept > 20);  /* ... plans that keep activations ... */
    assert_true(mixed > 3);  /* ... and some ranks keeping while others recompute */
}

/* A hand-checkable instance: a fast and a slow rank, B = 6. */
static void test_small_known_optimum(void **state) {
    (void)state;
    double f_fast[7] = {0, 1, 2, 3, 4, 5, 6}, k_fast[7] = {0, 2, 4, 6, 8, 10, 12};
    double f_slow[7] = {0, 2, 4, 6, 8, 10, 12}, k_slow[7] = {0, 4, 8, 12, 16, 20, 24};
    opt_group g[2] = {{.count = 1, .mmax = 6, .f = f_fast, .k = k_fast},
                      {.count = 1, .mmax = 6, .f = f_slow, .k = k_slow}};
    opt_problem p = {.n_groups = 2, .groups = g, .batch = 6};
    opt_result r;
    assert_int_equal(opt_solve(&p, &r), 0);
    /* fast rank 4 samples (4 + 8), slow rank 2 (4 + 8): 12 ms */
    assert_true(fabs(r.objective - 12.0) < 1e-12);
    assert_int_equal(r.batch[0], 4);
    assert_int_equal(r.batch[1], 2);
    opt_result_free(&r);
    /* a memory limit of microbatch 1 on the fast rank keeps the optimum (linear costs) */
    g[0].mmax = 1;
    assert_int_equal(opt_solve(&p, &r), 0);
    assert_true(fabs(r.objective - 12.0) < 1e-12);
    opt_result_free(&r);
    /* a collective floor above the compute dominates */
    p.fwd_floor = 20;
    p.bwd_floor = 30;
    assert_int_equal(opt_solve(&p, &r), 0);
    assert_true(fabs(r.objective - 50.0) < 1e-12);
    opt_result_free(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_small_known_optimum),
        cmocka_unit_test(test_random_problems_match_exhaustive),
        cmocka_unit_test(test_random_clusters_match_exhaustive),
        cmocka_unit_test(test_fast_dp_matches_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
