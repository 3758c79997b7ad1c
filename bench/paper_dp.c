/* paper_dp.c - Algorithm 1 of the Cephalo paper, written as published:
 *
 *   D(i, j, k) = min over (m, l) of max(D(i-1, j - l*m, k - m), T(i, l, m))
 *
 * over ranks i, total batch j and total microbatch k (the paper tracks k because compute memory
 * is linear in m, so the aggregate-memory constraint III is a bound on k), where
 * T(i, l, m) = max(l*f(m), AG') + max(l*k(m), AG' + RS') and AG', RS' are the uneven latencies when
 * that rank cannot also hold an even state share. O(N * B^3 * log B) time, O(N * B^2) memory. */
#include "paper_dp.h"

#include <math.h>
#include <stdlib.h>

#include "common/log.h"

typedef struct choice {
    short m, l;
} choice;

double paper_dp_solve(const cost_model *cm, int *batch, int *micro) {
    int N = cm->cl->n_devices, B = cm->batch;
    size_t plane = (size_t)(B + 1) * (B + 1);
    double *D = xmalloc((size_t)(N + 1) * plane * sizeof *D);
    choice *C = xcalloc((size_t)(N + 1) * plane, sizeof *C);
    for (size_t x = 0; x < (size_t)(N + 1) * plane; x++) D[x] = INFINITY;
    D[0] = 0;
    double even_state = (double)cm->even_state_params * cm->state_bpp;
    /* constraint III as a bound on k: sum of fixed parts + the largest per-sample slope * k */
    double budget = -(double)cm->params * cm->state_bpp, slope = 0;
    for (int r = 0; r < N; r++) {
        const cost_group *g = &cm->groups[cost_group_of(cm, r)];
        budget += g->usable_bytes - g->m0;
        if (g->m1 > slope) slope = g->m1;
    }
    for (int i = 1; i <= N; i++) {
        const cost_group *g = &cm->groups[cost_group_of(cm, i - 1)];
        double *prev = D + (size_t)(i - 1) * plane, *cur = D + (size_t)i * plane;
        choice *ch = C + (size_t)i * plane;
        for (int j = 1; j <= B; j++)
            for (int k = 1; k <= j; k++)
                for (int m = 1; m <= k && m <= g->mmax; m++) {
                    bool uneven = (double)cost_compute_bytes(g, m) + even_state > g->usable_bytes;
                    double ag = cost_fwd_floor(cm, uneven), agrs = cost_bwd_floor(cm, uneven);
                    for (int l = 1; l * m <= j; l++) {
                        double before = prev[(size_t)(j - l * m) * (B + 1) + (k - m)];
                        if (!isfinite(before)) continue;
                        double t = fmax(l * g->fwd_ms[m], ag) + fmax(l * g->bwd_ms[m], agrs);
                        double v = fmax(before, t);
                        if (v < cur[(size_t)j * (B + 1) + k]) {
                            cur[(size_t)j * (B + 1) + k] = v;
                            ch[(size_t)j * (B + 1) + k] = (choice){(short)m, (short)l};
                        }
                    }
                }
    }
    double best = INFINITY;
    int bk = -1;
    for (int k = 1; k <= B; k++) {
        double v = D[(size_t)N * plane + (size_t)B * (B + 1) + k];
        if (slope * k <= budget && v < best) best = v, bk = k;
    }
    for (int i = N, j = B, k = bk; bk > 0 && i >= 1; i--) {
        choice c = C[(size_t)i * plane + (size_t)j * (B + 1) + k];
        batch[i - 1] = c.m * c.l;
        micro[i - 1] = c.m;
        j -= c.m * c.l;
        k -= c.m;
    }
    free(D);
    free(C);
    return best;
}
