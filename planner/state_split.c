/* state_split.c - water-filling and per-unit shard sizes (docs/optimizer.md, "State split"). */
#include "planner/state_split.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

int64_t split_balanced(int64_t numel, int n, int rank) {
    return numel / n + (rank < numel % n ? 1 : 0);
}

int split_is_uneven(const int64_t *sizes, int n) {
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    for (int i = 0; i < n; i++) {
        if (sizes[i] < lo) lo = sizes[i];
        if (sizes[i] > hi) hi = sizes[i];
    }
    return hi - lo > 1;
}

/* Parameters rank i takes at utilisation level u (fractional, capped by room). */
static double take_at(double u, double cap, int64_t compute, int64_t room, int bpp) {
    double t = (u * cap - (double)compute) / bpp;
    if (t < 0) t = 0;
    return t > (double)room ? (double)room : t;
}

int split_waterfill(int n, const double *capacity, const int64_t *compute, const int64_t *room,
                    int bytes_per_param, int64_t total, int64_t *p) {
    int64_t room_sum = 0;
    for (int i = 0; i < n; i++) room_sum += room[i] > 0 ? room[i] : 0;
    if (room_sum < total) return -1;
    /* bisection on the common utilisation level */
    double lo = 0, hi = 1;
    for (int i = 0; i < n; i++) hi = fmax(hi, ((double)compute[i] + (double)room[i] * bytes_per_param) / capacity[i]);
    for (int it = 0; it < 200; it++) {
        double mid = (lo + hi) / 2, sum = 0;
        for (int i = 0; i < n; i++) sum += take_at(mid, capacity[i], compute[i], room[i] > 0 ? room[i] : 0, bytes_per_param);
        if (sum >= (double)total) hi = mid;
        else lo = mid;
    }
    int64_t assigned = 0;
    for (int i = 0; i < n; i++) {
        p[i] = (int64_t)floor(take_at(hi, capacity[i], compute[i], room[i] > 0 ? room[i] : 0, bytes_per_param));
        assigned += p[i];
    }
    /* The level hi over-fills slightly; take the excess back from the fullest ranks, or hand
     * out what is missing to the emptiest ranks with room left. */
    while (assigned != total) {
        int pick = -1;
        double best = 0;
        for (int i = 0; i < n; i++) {
            double util = ((double)compute[i] + (double)p[i] * bytes_per_param) / capacity[i];
            if (assigned > total ? p[i] > 0 && (pick < 0 || util > best)
                                 : p[i] < room[i] && (pick < 0 || util < best))
                pick = i, best = util;
        }
        CHECK(pick >= 0);
        int64_t step = llabs(assigned - total);
        if (assigned > total) {
            if (step > p[pick]) step = p[pick];
            if (step > 1 && n > 1) step = step / 2 + 1;
            p[pick] -= step, assigned -= step;
        } else {
            if (step > room[pick] - p[pick]) step = room[pick] - p[pick];
            if (step > 1 && n > 1) step = step / 2 + 1;
            p[pick] += step, assigned += step;
        }
    }
    return 0;
}

typedef struct unit_ref {
    int64_t numel;
    int index;
} unit_ref;

static int by_size_desc(const void *a, const void *b) {
    const unit_ref *x = a, *y = b;
    if (x->numel != y->numel) return x->numel < y->numel ? 1 : -1;
    return x->index - y->index;
}

/* Whether every rank's target covers its balanced share of the units not in `uneven`. */
static bool even_part_fits(int n_units, const int64_t *numel, int n, const int64_t *p,
                           const bool *uneven) {
    for (int i = 0; i < n; i++) {
        int64_t need = 0;
        for (int u = 0; u < n_units; u++)
            if (!uneven[u]) need += split_balanced(numel[u], n, i);
        if (need > p[i]) return false;
    }
    return true;
}

int split_shards(int n_units, const int64_t *numel, int n, const int64_t *p, int64_t *shards) {
    bool *uneven = xcalloc((size_t)n_units, sizeof *uneven);
    unit_ref *order = xmalloc((size_t)n_units * sizeof *order);
    for (int u = 0; u < n_units; u++) order[u] = (unit_ref){numel[u], u};
    qsort(order, (size_t)n_units, sizeof *order, by_size_desc);
    /* Largest units first: each one moved out of the balanced set frees the most room. */
    for (int k = 0; k < n_units && !even_part_fits(n_units, numel, n, p, uneven); k++)
        uneven[order[k].index] = true;
    int64_t *left = xmalloc((size_t)n * sizeof *left);
    for (int i = 0; i < n; i++) {
        left[i] = p[i];
        for (int u = 0; u < n_units; u++)
            if (!uneven[u]) left[i] -= split_balanced(numel[u], n, i);
        CHECK(left[i] >= 0);
    }
    /* The uneven units, in unit order, poured into the ranks in rank order: every unit's pieces
     * are contiguous ranges and every rank ends exactly at its target. */
    int rank = 0;
    for (int u = 0; u < n_units; u++) {
        int64_t *row = shards + (size_t)u * n;
        if (!uneven[u]) {
            for (int i = 0; i < n; i++) row[i] = split_balanced(numel[u], n, i);
            continue;
        }
        memset(row, 0, (size_t)n * sizeof *row);
        int64_t rest = numel[u];
        while (rest > 0) {
            while (rank < n && left[rank] == 0) rank++;
            CHECK(rank < n);
            int64_t take = rest < left[rank] ? rest : left[rank];
            row[rank] += take;
            left[rank] -= take;
            rest -= take;
        }
    }
    int count = 0;
    for (int u = 0; u < n_units; u++) count += split_is_uneven(shards + (size_t)u * n, n);
    free(left);
    free(order);
    free(uneven);
    return count;
}
