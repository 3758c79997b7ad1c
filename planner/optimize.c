/* optimize.c - exact minimisation of max(F, A) + max(K, C); see optimize.h and docs/optimizer.md.
 *
 * Thresholds (tf, tb) are feasible when every rank can pick (m, l) with l*f(m) <= tf and
 * l*k(m) <= tb so that the batches sum to B (and the state fits). Feasibility is monotone in both
 * thresholds, and the optimum is tf + tb over the Pareto staircase of feasible pairs drawn from
 * the finite sets of achievable values. */
#include "planner/optimize.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"

/* ---- bitsets over batch sums 0..B ---- */

typedef uint64_t word;
#define NEG_ROOM (INT64_MIN / 4)

typedef struct bits {
    int nbits, nwords;
    int lo, hi; /* every non-zero word lies in lo..hi (empty: hi < lo): the loops below run over
                   the members' span, not all of 0..B (a rank's set spans its largest batch) */
    word *w;
} bits;

static void bits_init(bits *b, int nbits) {
    b->nbits = nbits;
    b->nwords = (nbits + 63) / 64;
    b->lo = b->nwords, b->hi = -1;
    b->w = xcalloc((size_t)b->nwords, sizeof(word));
}
static void bits_free(bits *b) { free(b->w); }
static void bits_zero(bits *b) {
    if (b->hi >= b->lo) memset(b->w + b->lo, 0, (size_t)(b->hi - b->lo + 1) * sizeof(word));
    b->lo = b->nwords, b->hi = -1;
}
static void bits_copy(bits *dst, const bits *src) {
    if (dst == src) return;
    bits_zero(dst);
    if (src->hi >= src->lo) memcpy(dst->w + src->lo, src->w + src->lo, (size_t)(src->hi - src->lo + 1) * sizeof(word));
    dst->lo = src->lo, dst->hi = src->hi;
}
/* Widens the span to words lo..hi. */
static void bits_span(bits *b, int lo, int hi) {
    if (lo < b->lo) b->lo = lo;
    if (hi > b->hi) b->hi = hi;
}
static void bits_set(bits *b, int i) {
    b->w[i >> 6] |= (word)1 << (i & 63);
    bits_span(b, i >> 6, i >> 6);
}
static bool bits_test(const bits *b, int i) { return (b->w[i >> 6] >> (i & 63)) & 1; }

/* Clears bits past nbits so shifts never carry garbage in. */
static void bits_trim(bits *b) {
    int extra = b->nwords * 64 - b->nbits;
    if (extra) b->w[b->nwords - 1] &= ~(word)0 >> extra;
}

/* dst |= src << s (dst may be src): only the words src's span reaches. */
static void bits_or_shifted(bits *dst, const bits *src, int s) {
    int ws = s >> 6, bs = s & 63;
    if (src->hi < src->lo || src->lo + ws >= dst->nwords) return;
    int lo = src->lo + ws, hi = src->hi + ws + (bs != 0);
    if (hi > dst->nwords - 1) hi = dst->nwords - 1;
    for (int i = hi; i >= lo; i--) {
        word v = i - ws <= src->hi ? src->w[i - ws] << bs : 0;
        if (bs && i - ws - 1 >= src->lo) v |= src->w[i - ws - 1] >> (64 - bs);
        dst->w[i] |= v;
    }
    bits_span(dst, lo, hi);
    bits_trim(dst);
}

/* Clears the members below x. */
static void bits_clear_below(bits *b, int x) {
    int wx = x >> 6;
    for (int i = b->lo; i < wx && i <= b->hi; i++) b->w[i] = 0;
    if (wx > b->lo) b->lo = wx;
    if (wx >= b->lo && wx <= b->hi) b->w[wx] &= ~(word)0 << (x & 63);
}

static bool bits_empty(const bits *b) {
    for (int i = b->lo; i <= b->hi; i++)
        if (b->w[i]) return false;
    return true;
}

/* The largest member, -1 when empty. */
static int bits_max(const bits *b) {
    for (int i = b->hi; i >= b->lo; i--)
        if (b->w[i]) return i * 64 + 63 - __builtin_clzll(b->w[i]);
    return -1;
}

static int bits_runs(const bits *b) {
    int runs = 0;
    word carry = 0;
    for (int i = b->lo; i <= b->hi; i++) {
        word starts = b->w[i] & ~((b->w[i] << 1) | carry);
        runs += __builtin_popcountll(starts);
        carry = b->w[i] >> 63;
    }
    return runs;
}

/* Scratch for sumsets. */
typedef struct sumset_tmp {
    bits smear, out;
} sumset_tmp;

/* smear = OR_{j=0..w} src << j, by doubling the covered width. */
static void bits_smear(bits *smear, const bits *src, int w) {
    bits_copy(smear, src);
    int covered = 1;
    while (covered * 2 <= w + 1) {
        bits_or_shifted(smear, smear, covered);
        covered *= 2;
    }
    if (covered < w + 1) bits_or_shifted(smear, smear, w + 1 - covered);
}

/* dst = a (+) b, the sumset truncated to 0..B. Walks the runs of one operand and adds a smeared
 * copy of the other for each run: cheap once a set has become an interval. The walked one is
 * the one with the fewer runs per word of the other's span (the work of each run). */
static void bits_sumset(bits *dst, const bits *a, const bits *b, sumset_tmp *t) {
    if ((long)bits_runs(a) * (b->hi - b->lo + 1) > (long)bits_runs(b) * (a->hi - a->lo + 1)) {
        const bits *x = a;
        a = b;
        b = x;
    }
    bits_zero(&t->out);
    int n = a->nbits, end = (a->hi + 1) * 64 < n ? (a->hi + 1) * 64 : n;
    for (int i = a->lo * 64; i < end;) {
        if (!a->w[i >> 6]) {
            i = (i | 63) + 1;
            continue;
        }
        if (!bits_test(a, i)) {
            i++;
            continue;
        }
        int j = i;
        while (j + 1 < n && bits_test(a, j + 1)) j++;
        bits_smear(&t->smear, b, j - i);
        bits_or_shifted(&t->out, &t->smear, i);
        i = j + 1;
    }
    bits_copy(dst, &t->out);
}

/* ---- the search state ---- */

typedef struct search {
    const opt_problem *p;
    int n_ranks, bmax; /* bmax: largest batch of one rank (others need one sample each) */
    bits *sets; /* per group: achievable batches under the current thresholds */
    int64_t **best_room; /* per group [B+1]: most room for that batch (constraint III) */
    int *maxb; /* per group: its largest achievable batch under the current thresholds */
    long slack; /* sum over ranks of maxb - B: how far below its largest any rank's batch, or any
                  set of ranks' total, can be in a split summing to B (the room DPs' window) */
    bits acc, pow, reach;
    sumset_tmp tmp;
    int64_t *dp, *dp_pow, *dp_acc, *dp_tmp; /* [B+1] max-plus scratch */
    double lambda; /* the Lagrangian price per sample of the last room bound */
    double *phi; /* per group, at lambda: max over a rank's window of room(b) - lambda*b */
    double room_ub; /* the bound at lambda: lambda*B + sum over ranks of phi */
    bool prune; /* lambda, phi and room_ub belong to the current tables: the DPs prune (win_prune) */
    double tables_tf, tables_tb; /* the thresholds the tables were built for */
    long checks, room_dps;
    bool expired; /* the problem's deadline passed or it was cancelled: every loop gives up */
} search;

/* Whether the caller's limits stop the search (opt_problem.deadline_s, .cancel). Once true it
 * stays true, so whatever a cut-short loop left behind is never taken for an answer. */
static bool search_expired(search *s) {
    const opt_problem *p = s->p;
    if (!s->expired && ((p->cancel && *p->cancel) || (p->deadline_s > 0 && clock_now_s() >= p->deadline_s)))
        s->expired = true;
    return s->expired;
}

/* Largest l with l*t <= tau (and l <= cap), computed so that it agrees exactly with the
 * products the value sets hold. */
static int max_count(double t, double tau, int cap) {
    if (t > tau) return 0;
    double q = floor(tau / t);
    int l = q > cap ? cap : (int)q;
    while (l > 0 && (double)l * t > tau) l--;
    while (l < cap && (double)(l + 1) * t <= tau) l++;
    return l;
}

static int min_int(int a, int b) { return a < b ? a : b; }

static int group_count_cap(const opt_group *g, int m, int bmax) {
    int cap = bmax / m;
    if (g->max_micros > 0 && cap > g->max_micros) cap = g->max_micros;
    return cap;
}

/* The state room one rank of a group can offer under the current thresholds: at its least
 * roomy admissible microbatch (every split gets at least this) and at its roomiest (no split
 * gets more). Both 0 without constraint III. */
typedef struct room_bounds {
    int64_t worst, best;
} room_bounds;

/* The counts of microbatches m a rank may run under the thresholds: recomputing (full) and
 * keeping its intermediates (keep); each allowed count is 1..that. */
typedef struct counts {
    int full, keep;
} counts;

static counts group_counts(const opt_group *g, int m, double tf, double tb, int bmax) {
    int cap = group_count_cap(g, m, bmax);
    int lf = max_count(g->f[m], tf, cap);
    counts c = {0, 0};
    if (!g->keep_only) c.full = min_int(lf, max_count(g->k[m], tb, cap));
    if (g->k_keep) c.keep = min_int(lf, max_count(g->k_keep[m], tb, min_int(cap, g->keep_lmax[m])));
    return c;
}

/* The most state room of l microbatches of m under counts c (full leaves more than keep). */
static int64_t count_room(const opt_group *g, int m, int l, counts c) {
    return l <= c.full ? g->room[m] : g->keep_room(g->keep_ctx, m, l);
}

/* Builds the group's achievable-batch set and, with constraint III, the most room per batch. */
static room_bounds build_group_set(search *s, int gi, double tf, double tb) {
    const opt_group *g = &s->p->groups[gi];
    bits *set = &s->sets[gi];
    bits_zero(set);
    int64_t *room = s->best_room ? s->best_room[gi] : NULL;
    if (room)
        for (int b = 0; b <= s->p->batch; b++) room[b] = NEG_ROOM;
    room_bounds rb = {INT64_MAX, 0};
    for (int m = 1; m <= g->mmax && m <= s->bmax; m++) {
        counts c = group_counts(g, m, tf, tb, s->bmax);
        int l = c.full > c.keep ? c.full : c.keep;
        if (l < 1) continue;
        if (room) {
            /* any admissible option may be taken (the fastest, when III is guaranteed): the least
             * room is the least of any option, the kept one's falling with its count */
            int64_t worst = c.keep ? g->keep_room(g->keep_ctx, m, c.keep) : g->room[m], best = count_room(g, m, 1, c);
            if (c.full && g->room[m] < worst) worst = g->room[m];
            if (worst < rb.worst) rb.worst = worst;
            if (best > rb.best) rb.best = best;
        }
        for (int j = 1; j <= l; j++) {
            bits_set(set, m * j);
            if (!room) continue;
            int64_t r = count_room(g, m, j, c);
            if (r > room[m * j]) room[m * j] = r;
        }
    }
    if (rb.worst == INT64_MAX) rb.worst = 0;
    return rb;
}

/* Keeps, of a set of sums over ranks whose largest batches sum to top, the window top - D..top
 * (win below: no split summing to B goes through the others). Not in the tests' reference mode. */
static void bits_window(const search *s, bits *b, long top) {
    if (!s->p->exhaustive_dp && top - s->slack > 0) bits_clear_below(b, (int)(top - s->slack < b->nbits ? top - s->slack : b->nbits));
}

/* Builds every group's set; false when a group can run nothing under the thresholds. The room
 * bounds summed over ranks go to *sum (constraint III's quick tests). */
static bool build_all_sets(search *s, double tf, double tb, room_bounds *sum) {
    *sum = (room_bounds){0, 0};
    bool all = true;
    long total = 0;
    for (int gi = 0; gi < s->p->n_groups; gi++) {
        room_bounds rb = build_group_set(s, gi, tf, tb);
        s->maxb[gi] = bits_max(&s->sets[gi]);
        all &= s->maxb[gi] > 0;
        total += (long)s->maxb[gi] * s->p->groups[gi].count;
        sum->worst += rb.worst * s->p->groups[gi].count;
        sum->best += rb.best * s->p->groups[gi].count;
    }
    /* other thresholds, other tables: the last bound's phi are not theirs */
    if (tf != s->tables_tf || tb != s->tables_tb) s->prune = false;
    s->tables_tf = tf, s->tables_tb = tb;
    /* negative: B is out of reach (the sumsets say so too) */
    s->slack = total < s->p->batch ? 0 : total - s->p->batch;
    for (int gi = 0; gi < s->p->n_groups && all; gi++) bits_window(s, &s->sets[gi], s->maxb[gi]);
    return all;
}

/* Whether the quick lower bound already guarantees constraint III for every split. */
static bool room_guaranteed(const opt_problem *p, const room_bounds *sum) {
    return p->need_room <= 0 || sum->worst >= p->need_room;
}

/* A max-plus table over a window of batch sums: v[x - lo] for x in lo..hi (empty when hi < lo).
 *
 * The window is what makes the exact DPs cheap. With maxb_r rank r's largest batch and
 * D = sum_r maxb_r - B (search.slack), every split summing to B has, for every set R of ranks,
 * sum_{r in R} b_r = B - sum_{r not in R} b_r >= B - sum_{r not in R} maxb_r = sum_{r in R} maxb_r - D.
 * So a table over the ranks R is only ever read in [sum_R maxb - D, sum_R maxb]: width D + 1
 * instead of B + 1, whatever the shape of the room function (it is not concave: a batch's room
 * is that of its smallest admissible divisor). Near the optimum thresholds D is small (tens to
 * thousands where B is 65536), so a convolution costs O(D^2), not O(B^2). */
typedef struct win {
    int64_t *v;
    int lo, hi;
    double phi; /* sum of phi over its ranks (win_prune) */
} win;

static int64_t win_at(const win *w, int x) { return x < w->lo || x > w->hi ? NEG_ROOM : w->v[x - w->lo]; }

/* The window of a table whose ranks' largest batches sum to top: top - D..top, within 0..B (the
 * whole of 0..B in the tests' reference mode, the quadratic DP as it was). */
static void win_range(const search *s, long top, int *lo, int *hi) {
    bool all = s->p->exhaustive_dp;
    *lo = all || top - s->slack < 0 ? 0 : (int)(top - s->slack);
    *hi = all || top > s->p->batch ? s->p->batch : (int)top;
}

/* Drops the entries no split meeting constraint III goes through, and narrows the window to the
 * rest. For any price lambda and any split x summing to B with room(x) >= need, the ranks R of a
 * table satisfy sum_R (room - lambda*b) >= need - lambda*B - sum_{not R} phi = phi_R - gap, with
 * gap = room_ub - need (each rank outside R gets at most its phi). The table's entry at x's
 * partial sum is at least x's partial room, so it survives the test below, and so does every
 * entry it was built from: the DPs still answer "is need reachable" exactly, and the suffix
 * tables still admit exactly the batches some split meeting III continues (their values may
 * fall below the true maximum, never below need's share). With lambda near the bound's minimum
 * the gap is small and few entries survive. */
static void win_prune(const search *s, win *w) {
    if (!s->prune) return;
    double lambda = s->lambda, gap = s->room_ub - (double)s->p->need_room;
    double floor_ = w->phi - gap - (1 + 1e-9 * (fabs(s->room_ub) + fabs(lambda) * s->p->batch)); /* rounding */
    int lo = w->hi + 1, hi = w->lo - 1;
    for (int x = w->lo; x <= w->hi; x++) {
        int64_t *v = &w->v[x - w->lo];
        if (*v == NEG_ROOM) continue;
        if ((double)*v - lambda * x < floor_) {
            *v = NEG_ROOM;
        } else {
            if (lo > x) lo = x;
            hi = x;
        }
    }
    if (hi < lo) {
        w->hi = w->lo - 1;
        return;
    }
    if (lo > w->lo) memmove(w->v, w->v + (lo - w->lo), (size_t)(hi - lo + 1) * sizeof *w->v);
    w->lo = lo;
    w->hi = hi;
}

/* dst = a (max,+) b on the window of top (clamped to what a and b reach); dst may be a or b.
 * Quadratic in the windows, so it looks at the limits every 256 rows; cut short, dst is left as
 * it was and s->expired says so. */
static void win_conv(search *s, win *dst, const win *a, const win *b, long top, int64_t *tmp) {
    int lo, hi;
    win_range(s, top, &lo, &hi);
    if (lo < a->lo + b->lo) lo = a->lo + b->lo;
    if (hi > a->hi + b->hi) hi = a->hi + b->hi;
    for (int x = lo; x <= hi; x++) tmp[x - lo] = NEG_ROOM;
    for (int i = a->lo; i <= a->hi; i++) {
        if (((i - a->lo) & 255) == 0 && search_expired(s)) return;
        int64_t ai = a->v[i - a->lo];
        if (ai == NEG_ROOM) continue;
        int jlo = lo - i > b->lo ? lo - i : b->lo, jhi = hi - i < b->hi ? hi - i : b->hi;
        if (jhi < jlo) continue;
        const int64_t *bv = b->v + (jlo - b->lo);
        int64_t *out = tmp + (i + jlo - lo);
        for (int k = 0; k <= jhi - jlo; k++)
            if (bv[k] != NEG_ROOM && ai + bv[k] > out[k]) out[k] = ai + bv[k];
    }
    if (hi >= lo) memcpy(dst->v, tmp, (size_t)(hi - lo + 1) * sizeof *tmp);
    dst->lo = lo;
    dst->hi = hi;
    dst->phi = a->phi + b->phi;
    win_prune(s, dst);
}

/* The table of one rank of group gi: its room per batch, in its window. */
static win rank_win(search *s, int gi, int64_t *buf) {
    int lo, hi;
    win_range(s, s->maxb[gi], &lo, &hi);
    memcpy(buf, s->best_room[gi] + lo, (size_t)(hi - lo + 1) * sizeof *buf);
    win w = {buf, lo, hi, s->prune ? s->phi[gi] : 0};
    win_prune(s, &w);
    return w;
}

/* Most state room any feasible split offers (constraint III, exact): groups one after another,
 * each group's count-fold table by doubling, every table in its window (win above). */
static int64_t dp_max_room(search *s) {
    win dp = {s->dp, 0, 0, 0};
    dp.v[0] = 0;
    long total = 0; /* sum of maxb over the groups so far */
    for (int gi = 0; gi < s->p->n_groups && !s->expired; gi++) {
        long hi = s->maxb[gi];
        win pow = rank_win(s, gi, s->dp_pow), acc = {s->dp_acc, 0, 0, 0};
        acc.v[0] = 0;
        long n_pow = 1, n_acc = 0; /* ranks in pow and acc */
        for (int c = s->p->groups[gi].count; c; c >>= 1) {
            if (c & 1) n_acc += n_pow, win_conv(s, &acc, &acc, &pow, n_acc * hi, s->dp_tmp);
            if (c > 1) n_pow *= 2, win_conv(s, &pow, &pow, &pow, n_pow * hi, s->dp_tmp);
        }
        total += n_acc * hi;
        win_conv(s, &dp, &dp, &acc, total, s->dp_tmp);
    }
    return win_at(&dp, s->p->batch);
}

/* reach = reach (+) set^(count) */
/* reach = reach (+) set^(count); *top: the sum of maxb over the ranks in reach. Every set kept to
 * its window (bits_window), so the sumsets cost O(D) words, not O(B). */
static void add_group(search *s, int gi, long *top) {
    long n_pow = 1, n_acc = 0, maxb = s->maxb[gi];
    bits_copy(&s->pow, &s->sets[gi]);
    bits_zero(&s->acc);
    bits_set(&s->acc, 0);
    for (int c = s->p->groups[gi].count; c; c >>= 1) {
        if (c & 1) {
            bits_sumset(&s->acc, &s->acc, &s->pow, &s->tmp);
            bits_window(s, &s->acc, (n_acc += n_pow) * maxb);
        }
        if (c > 1) {
            bits_sumset(&s->pow, &s->pow, &s->pow, &s->tmp);
            bits_window(s, &s->pow, (n_pow *= 2) * maxb);
        }
    }
    bits_sumset(&s->reach, &s->reach, &s->acc, &s->tmp);
    bits_window(s, &s->reach, *top += n_acc * maxb);
}

static int64_t witness_room(search *s, double tf, double tb);

/* The batches of group gi that can maximise room(b) - lambda*b for some lambda, ascending, into
 * pts; returns their number. Those of its window (win) on the upper concave hull of room: the
 * maximum of a linear function over points is attained at a hull vertex, the leftmost maximiser
 * too (collinear points between vertices are dropped). The tests' reference mode keeps every
 * batch of 0..B, the bound as it was. */
static int room_candidates(const search *s, int gi, int *pts) {
    const int64_t *h = s->best_room[gi];
    int lo, hi, n = 0;
    win_range(s, s->maxb[gi], &lo, &hi);
    for (int b = lo > 1 ? lo : 1; b <= hi; b++) {
        if (h[b] == NEG_ROOM) continue;
        /* pop the last point while it lies on or below the segment from the one before to b */
        while (!s->p->exhaustive_dp && n >= 2) {
            int b1 = pts[n - 2], b2 = pts[n - 1];
            __int128 cross = (__int128)(b2 - b1) * (h[b] - h[b1]) - (__int128)(h[b2] - h[b1]) * (b - b1);
            if (cross < 0) break;
            n--;
        }
        pts[n++] = b;
    }
    return n;
}

/* An upper bound of the most room any split leaves: for every price lambda per sample,
 * lambda*B + sum_i max_b (room_i(b) - lambda*b) bounds it (the exact-sum constraint relaxed, b
 * over each rank's window, which holds its batch in every split); the bound is convex in lambda
 * and minimised by bisection on its slope. pts + start[gi]: group gi's candidates. */
static double lagrange_at(const search *s, const int *pts, const int *start, double lambda, long *slope) {
    double total = lambda * s->p->batch;
    *slope = s->p->batch;
    for (int gi = 0; gi < s->p->n_groups; gi++) {
        const int64_t *h = s->best_room[gi];
        double best = -INFINITY;
        int arg = 0;
        for (int k = start[gi]; k < start[gi + 1]; k++) {
            int b = pts[k];
            if ((double)h[b] - lambda * b > best) best = (double)h[b] - lambda * b, arg = b;
        }
        total += s->p->groups[gi].count * best;
        *slope -= (long)s->p->groups[gi].count * arg;
    }
    return total;
}

static double lagrange_room_bound(search *s) {
    int G = s->p->n_groups, *start = xmalloc((size_t)(G + 1) * sizeof *start);
    int *pts = xmalloc((size_t)G * (s->p->batch + 1) * sizeof *pts);
    start[0] = 0;
    for (int gi = 0; gi < G; gi++) start[gi + 1] = start[gi] + room_candidates(s, gi, pts + start[gi]);
    double lo = -1e15, hi = 1e15, best = INFINITY;
    for (int it = 0; it < 120; it++) {
        double mid = (lo + hi) / 2;
        long slope;
        double v = lagrange_at(s, pts, start, mid, &slope);
        if (v < best) best = v, s->lambda = mid;
        if (slope > 0) hi = mid; /* bound grows with lambda: go lower */
        else if (slope < 0) lo = mid;
        else break;
    }
    /* each group's phi at the chosen price, for the DPs' pruning */
    s->room_ub = s->lambda * s->p->batch;
    for (int gi = 0; gi < G; gi++) {
        const int64_t *h = s->best_room[gi];
        s->phi[gi] = -INFINITY;
        for (int k = start[gi]; k < start[gi + 1]; k++)
            s->phi[gi] = fmax(s->phi[gi], (double)h[pts[k]] - s->lambda * pts[k]);
        s->room_ub += s->p->groups[gi].count * s->phi[gi];
    }
    s->prune = !s->p->exhaustive_dp && isfinite(s->room_ub);
    free(start);
    free(pts);
    return best;
}

static bool feasible(search *s, double tf, double tb) {
    const opt_problem *p = s->p;
    if (search_expired(s)) return false;
    s->checks++;
    room_bounds room;
    if (!build_all_sets(s, tf, tb, &room)) return false;
    if (p->need_room > 0 && room.best < p->need_room) return false; /* III fails for every split */
    bits_zero(&s->reach);
    bits_set(&s->reach, 0);
    long top = 0;
    for (int gi = 0; gi < p->n_groups; gi++) {
        add_group(s, gi, &top);
        if (bits_empty(&s->reach)) return false;
    }
    if (!bits_test(&s->reach, p->batch)) return false;
    if (room_guaranteed(p, &room)) return true;
    /* The Lagrangian bound disproves III; a split priced by its multiplier proves it. Only
     * between the two does the exact (quadratic in B) dynamic program decide. */
    if (lagrange_room_bound(s) < (double)p->need_room - 1) return false;
    if (witness_room(s, tf, tb) >= p->need_room) return true;
    s->room_dps++;
    int64_t most = dp_max_room(s);
    return !s->expired && most >= p->need_room;
}

/* ---- value sets ---- */

typedef struct values {
    double *v;
    int n;
} values;

/* Sorts n doubles (no NaN) ascending in linear time: a least-significant-digit radix sort of
 * their bit patterns, mapped so that unsigned order is numeric order. A comparison sort of the
 * million values of B = 65536 was a fifth of the planning time. */
static void sort_doubles(double *v, size_t n) {
    enum { DIGIT = 11, NBUCKET = 1 << DIGIT };
    uint64_t *key = xmalloc(n * sizeof *key), *tmp = xmalloc(n * sizeof *tmp);
    size_t *count = xmalloc(NBUCKET * sizeof *count);
    for (size_t i = 0; i < n; i++) {
        uint64_t u;
        memcpy(&u, &v[i], sizeof u);
        key[i] = u >> 63 ? ~u : u | (uint64_t)1 << 63;
    }
    for (int shift = 0; shift < 64; shift += DIGIT) { /* 6 passes: the counts stay in L1 */
        memset(count, 0, NBUCKET * sizeof *count);
        for (size_t i = 0; i < n; i++) count[(key[i] >> shift) & (NBUCKET - 1)]++;
        if (n && count[(key[0] >> shift) & (NBUCKET - 1)] == n) continue; /* one digit: already in order */
        for (size_t d = 0, sum = 0; d < NBUCKET; d++) {
            size_t c = count[d];
            count[d] = sum;
            sum += c;
        }
        for (size_t i = 0; i < n; i++) tmp[count[(key[i] >> shift) & (NBUCKET - 1)]++] = key[i];
        uint64_t *x = key;
        key = tmp;
        tmp = x;
    }
    for (size_t i = 0; i < n; i++) {
        uint64_t u = key[i] >> 63 ? key[i] & ~((uint64_t)1 << 63) : ~key[i];
        memcpy(&v[i], &u, sizeof u);
    }
    free(key);
    free(tmp);
    free(count);
}

/* Adds l*t[m] for l = 1..n where above the floor and at most top. */
static size_t add_values(double *v, size_t n, const double *t, int m, int count, double floor_ms, double top) {
    for (int l = 1; l <= count; l++) {
        double x = (double)l * t[m];
        if (x > top && t[m] > 0) break; /* and every later one */
        if (x > floor_ms && x <= top) v[n++] = x;
    }
    return n;
}

/* Every achievable phase time >= floor, plus the floor itself, sorted and unique (the backward's
 * with and without recompute). */
static values collect_values(const search *s, bool fwd, double floor_ms, double top) {
    size_t cap = 1, n = 0;
    for (int gi = 0; gi < s->p->n_groups; gi++) {
        const opt_group *g = &s->p->groups[gi];
        for (int m = 1; m <= g->mmax && m <= s->bmax; m++) cap += 2 * (size_t)group_count_cap(g, m, s->bmax);
    }
    double *v = xmalloc(cap * sizeof *v);
    v[n++] = floor_ms;
    for (int gi = 0; gi < s->p->n_groups; gi++) {
        const opt_group *g = &s->p->groups[gi];
        for (int m = 1; m <= g->mmax && m <= s->bmax; m++) {
            int count = group_count_cap(g, m, s->bmax);
            if (fwd || !g->keep_only) n = add_values(v, n, fwd ? g->f : g->k, m, count, floor_ms, top);
            if (!fwd && g->k_keep) n = add_values(v, n, g->k_keep, m, min_int(count, g->keep_lmax[m]), floor_ms, top);
        }
    }
    sort_doubles(v, n);
    size_t u = 0;
    for (size_t i = 0; i < n; i++)
        if (u == 0 || v[i] != v[u - 1]) v[u++] = v[i];
    return (values){v, (int)u};
}

/* The least and the largest per-microbatch phase time of any option (fwd: f; else k and k_keep). */
static void phase_range(const search *s, bool fwd, double *least, double *most) {
    *least = INFINITY, *most = 0;
    for (int gi = 0; gi < s->p->n_groups; gi++) {
        const opt_group *g = &s->p->groups[gi];
        for (int m = 1; m <= g->mmax && m <= s->bmax; m++) {
            double t[2] = {fwd ? g->f[m] : g->keep_only ? NAN : g->k[m], !fwd && g->k_keep ? g->k_keep[m] : NAN};
            for (int i = 0; i < 2; i++)
                if (!isnan(t[i])) *least = fmin(*least, t[i]), *most = fmax(*most, t[i] * group_count_cap(g, m, s->bmax));
        }
    }
}

/* An objective some assignment reaches: the thresholds doubled together from their least values
 * until feasible (a few tests). The optimal thresholds sum to at most it, so no value above it
 * less the other phase's floor is ever needed: the value sets stop there (at B = 65536 they
 * would otherwise hold millions of products, most far beyond any plan). INFINITY when none is
 * feasible up to the largest values (the staircase then says infeasible) or the search expired. */
static double feasible_objective(search *s) {
    const opt_problem *p = s->p;
    double f_lo, f_hi, k_lo, k_hi;
    phase_range(s, true, &f_lo, &f_hi);
    phase_range(s, false, &k_lo, &k_hi);
    if (!(f_lo > 0) || !(k_lo > 0)) return INFINITY; /* no option, or doubling would not grow */
    double tf = fmax(f_lo, p->fwd_floor), tb = fmax(k_lo, p->bwd_floor);
    for (;;) {
        if (feasible(s, tf, tb)) return tf + tb;
        if (s->expired || (tf > f_hi && tb > k_hi)) return INFINITY;
        tf *= 2, tb *= 2;
    }
}

/* Smallest index i in [lo, hi] with feasible(tf or tb = vals[i]); -1 if none. */
static int first_feasible(search *s, const values *vals, int lo, int hi, bool vary_fwd, double fixed) {
    int ans = -1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        bool ok = vary_fwd ? feasible(s, vals->v[mid], fixed) : feasible(s, fixed, vals->v[mid]);
        if (ok) {
            ans = mid;
            hi = mid - 1;
        } else {
            lo = mid + 1;
        }
    }
    return ans;
}

/* ---- reconstruction ---- */

/* Picks each rank's batch, walking ranks in order: a batch the remaining ranks can complete
 * (suffix sumsets, and the suffix max-room DP when constraint III binds), closest to the rank's
 * fair share of what is left. */
typedef enum { PICK_BALANCED, PICK_ROOMY, PICK_EXACT_ROOM } pick_mode;

/* PICK_BALANCED: closest to the fair share. PICK_ROOMY: the most state room net of the
 * Lagrangian price lambda per sample (a witness for constraint III). PICK_EXACT_ROOM: balanced
 * among the batches with which the remaining ranks can still meet III (suffix max-plus tables).
 * false (batch unset) when the search's limits cut the suffix tables short. */
static bool choose_batches(search *s, double tf, double tb, pick_mode mode, int *batch) {
    const opt_problem *p = s->p;
    int N = s->n_ranks, B = p->batch;
    room_bounds room;
    CHECK(build_all_sets(s, tf, tb, &room));
    int *group_of = xmalloc((size_t)N * sizeof *group_of);
    const int *maxb = s->maxb;
    for (int gi = 0, r = 0; gi < p->n_groups; gi++)
        for (int c = 0; c < p->groups[gi].count; c++) group_of[r++] = gi;
    bool use_dp = mode == PICK_EXACT_ROOM && !room_guaranteed(p, &room);
    bool roomy = mode == PICK_ROOMY && s->best_room;
    if (use_dp) lagrange_room_bound(s); /* the price the suffix tables prune with */
    /* suffix tables: sumsets, and the room DP over ranks i.. in its window (win), rows of D + 1 */
    bits *suf = xcalloc((size_t)N + 1, sizeof *suf);
    long *suf_max = xmalloc((size_t)(N + 1) * sizeof *suf_max); /* sum of maxb over ranks i.. */
    size_t width = (size_t)(p->exhaustive_dp || s->slack > B ? B : s->slack) + 1; /* of a window */
    win *rows = use_dp ? xcalloc((size_t)N + 1, sizeof *rows) : NULL;
    int64_t *dps = use_dp ? xmalloc((size_t)(N + 2) * width * sizeof *dps) : NULL;
    for (int i = N; i >= 0; i--) {
        bits_init(&suf[i], B + 1);
        if (i == N) {
            bits_set(&suf[i], 0);
            suf_max[i] = 0;
        } else {
            bits_sumset(&suf[i], &suf[i + 1], &s->sets[group_of[i]], &s->tmp);
            suf_max[i] = suf_max[i + 1] + maxb[group_of[i]];
            bits_window(s, &suf[i], suf_max[i]);
        }
        if (!use_dp) continue;
        rows[i].v = dps + (size_t)i * width;
        if (i == N) {
            rows[i].v[0] = 0; /* lo = hi = 0 */
        } else {
            win one = rank_win(s, group_of[i], dps + (size_t)(N + 1) * width);
            win_conv(s, &rows[i], &rows[i + 1], &one, suf_max[i], s->dp_tmp);
        }
    }
    bool done = !(use_dp && s->expired);
    int rem = done ? B : 0;
    int64_t room_so_far = 0;
    double cap_left = (double)suf_max[0];
    for (int i = 0; done && i < N; i++) {
        int gi = group_of[i];
        double target = (double)rem * maxb[gi] / cap_left; /* 65536 x 34496 overflows an int */
        int pick = -1;
        double pick_dist = INFINITY;
        /* the batches the others can complete: rem - b <= their largest total; the reference
         * mode of the tests looks at every one */
        int b_lo = p->exhaustive_dp || rem - suf_max[i + 1] < 1 ? 1 : (int)(rem - suf_max[i + 1]);
        int b_hi = p->exhaustive_dp || rem < maxb[gi] ? rem : maxb[gi];
        for (int b = b_lo; b <= b_hi; b++) {
            if (!bits_test(&s->sets[gi], b) || !bits_test(&suf[i + 1], rem - b)) continue;
            if (use_dp) {
                int64_t rest = win_at(&rows[i + 1], rem - b);
                if (rest == NEG_ROOM || room_so_far + s->best_room[gi][b] + rest < p->need_room) continue;
            }
            double dist = fabs(b - target);
            if (roomy && pick > 0) {
                /* room net of the multiplier's price of the samples taken */
                double gain = (double)s->best_room[gi][b] - s->lambda * b;
                double best_gain = (double)s->best_room[gi][pick] - s->lambda * pick;
                if (gain != best_gain) {
                    if (gain > best_gain) pick = b, pick_dist = dist;
                    continue;
                }
            }
            if (dist <= pick_dist) pick = b, pick_dist = dist;
        }
        CHECK(pick > 0);
        batch[i] = pick;
        rem -= pick;
        cap_left -= maxb[gi];
        if (use_dp) room_so_far += s->best_room[gi][pick];
    }
    CHECK(rem == 0);
    for (int i = 0; i <= N; i++) bits_free(&suf[i]);
    free(suf);
    free(suf_max);
    free(rows);
    free(dps);
    free(group_of);
    return done;
}

/* Room of a split chosen rank by rank by room net of the Lagrangian price, each rank at its
 * roomiest microbatch for its batch: a lower bound of the best room, cheap to compute. */
static int64_t witness_room(search *s, double tf, double tb) {
    int *batch = xmalloc((size_t)s->n_ranks * sizeof *batch);
    CHECK(choose_batches(s, tf, tb, PICK_ROOMY, batch)); /* no room tables: never cut short */
    int64_t room = 0;
    for (int gi = 0, i = 0; gi < s->p->n_groups; gi++)
        for (int c = 0; c < s->p->groups[gi].count; c++, i++) room += s->best_room[gi][batch[i]];
    free(batch);
    return room;
}

/* For a chosen batch, the microbatch (and whether to keep the intermediates) within the
 * thresholds: the most state room when constraint III needs it, otherwise the fastest (keeping
 * wherever it fits and is faster: it never costs more time). */
static int choose_micro(const opt_group *g, int b, double tf, double tb, bool most_room, int bmax, bool *keep) {
    int best = 0;
    double best_t = INFINITY;
    int64_t best_room = 0;
    for (int m = 1; m <= g->mmax && m <= b; m++) {
        if (b % m) continue;
        int l = b / m;
        if (l > group_count_cap(g, m, bmax)) continue;
        if ((double)l * g->f[m] > tf) continue;
        for (int k = 0; k < 2; k++) {
            const double *kt = k ? g->k_keep : g->k;
            if (k ? !g->k_keep || l > g->keep_lmax[m] : g->keep_only) continue;
            if ((double)l * kt[m] > tb) continue;
            double t = (double)l * (g->f[m] + kt[m]);
            int64_t room = most_room ? (k ? g->keep_room(g->keep_ctx, m, l) : g->room[m]) : 0;
            bool better = most_room ? (!best || room > best_room || (room == best_room && t < best_t)) : t < best_t;
            if (better) best = m, best_t = t, best_room = room, *keep = k;
        }
    }
    return best;
}

static void search_init(search *s, const opt_problem *p) {
    memset(s, 0, sizeof *s);
    s->p = p;
    for (int gi = 0; gi < p->n_groups; gi++) s->n_ranks += p->groups[gi].count;
    s->bmax = p->batch - (s->n_ranks - 1);
    if (p->rank_batch_max > 0 && p->rank_batch_max < s->bmax) s->bmax = p->rank_batch_max;
    int nb = p->batch + 1;
    s->sets = xcalloc((size_t)p->n_groups, sizeof *s->sets);
    for (int gi = 0; gi < p->n_groups; gi++) bits_init(&s->sets[gi], nb);
    bits_init(&s->acc, nb);
    bits_init(&s->pow, nb);
    bits_init(&s->reach, nb);
    bits_init(&s->tmp.smear, nb);
    bits_init(&s->tmp.out, nb);
    s->dp_tmp = xmalloc((size_t)nb * sizeof(int64_t));
    s->maxb = xcalloc((size_t)p->n_groups, sizeof *s->maxb);
    if (p->need_room > 0) {
        s->best_room = xcalloc((size_t)p->n_groups, sizeof *s->best_room);
        for (int gi = 0; gi < p->n_groups; gi++) s->best_room[gi] = xmalloc((size_t)nb * sizeof(int64_t));
        s->dp = xmalloc((size_t)nb * sizeof(int64_t));
        s->dp_pow = xmalloc((size_t)nb * sizeof(int64_t));
        s->dp_acc = xmalloc((size_t)nb * sizeof(int64_t));
        s->phi = xmalloc((size_t)p->n_groups * sizeof *s->phi);
    }
}

static void search_free(search *s) {
    for (int gi = 0; gi < s->p->n_groups; gi++) {
        bits_free(&s->sets[gi]);
        if (s->best_room) free(s->best_room[gi]);
    }
    free(s->sets);
    free(s->best_room);
    bits_free(&s->acc);
    bits_free(&s->pow);
    bits_free(&s->reach);
    bits_free(&s->tmp.smear);
    bits_free(&s->tmp.out);
    free(s->dp);
    free(s->dp_pow);
    free(s->dp_acc);
    free(s->dp_tmp);
    free(s->maxb);
    free(s->phi);
}

/* The Pareto staircase: for each forward threshold where the least feasible backward threshold
 * drops, evaluate tf + tb; stop once no later step can beat the best. */
static bool staircase(search *s, const values *vf, const values *vb, double *best_tf, double *best_tb) {
    int lastf = vf->n - 1, lastb = vb->n - 1;
    if (!feasible(s, vf->v[lastf], vb->v[lastb])) return false;
    int gmin = first_feasible(s, vb, 0, lastb, false, vf->v[lastf]);
    int fi = first_feasible(s, vf, 0, lastf, true, vb->v[lastb]);
    double best = INFINITY;
    int bi_hi = lastb;
    while (fi >= 0 && !s->expired) {
        int bi = first_feasible(s, vb, 0, bi_hi, false, vf->v[fi]);
        if (s->expired) break; /* the searches' answers are no longer exact */
        CHECK(bi >= 0);
        if (vf->v[fi] + vb->v[bi] < best) {
            best = vf->v[fi] + vb->v[bi];
            *best_tf = vf->v[fi];
            *best_tb = vb->v[bi];
        }
        if (bi == 0 || bi <= gmin) break;
        bi_hi = bi - 1;
        int next = first_feasible(s, vf, fi + 1, lastf, true, vb->v[bi_hi]);
        if (next < 0 || vf->v[next] + vb->v[gmin] >= best) break;
        fi = next;
    }
    return !s->expired;
}

static bool assignment_phases(const opt_problem *p, const int *batch, const int *micro, const bool *keep,
                              double *F, double *K);

int opt_solve(const opt_problem *p, opt_result *r) {
    memset(r, 0, sizeof *r);
    search s;
    search_init(&s, p);
    r->n_ranks = s.n_ranks;
    if (s.bmax < 1) {
        search_free(&s);
        return 1;
    }
    /* the optimum's tf <= U - C and tb <= U - A; the margin keeps rounding from cutting it */
    double U = feasible_objective(&s), margin = 1e-9 * U;
    values vf = collect_values(&s, true, p->fwd_floor, U - p->bwd_floor + margin);
    values vb = collect_values(&s, false, p->bwd_floor, U - p->fwd_floor + margin);
    if (p->upper_bound > 0) {
        /* tf + tb < bound with tb >= C and tf >= A: larger thresholds are of no interest, and
         * the binary searches never probe them (the expensive, memory-tight ones among them) */
        while (vf.n > 0 && vf.v[vf.n - 1] >= p->upper_bound - p->bwd_floor) vf.n--;
        while (vb.n > 0 && vb.v[vb.n - 1] >= p->upper_bound - p->fwd_floor) vb.n--;
    }
    double tf = 0, tb = 0;
    bool ok = vf.n > 0 && vb.n > 0 && staircase(&s, &vf, &vb, &tf, &tb) && tf + tb < (p->upper_bound > 0 ? p->upper_bound : INFINITY);
    if (ok) {
        r->batch = xcalloc((size_t)s.n_ranks, sizeof(int));
        r->micro = xcalloc((size_t)s.n_ranks, sizeof(int));
        r->keep = xcalloc((size_t)s.n_ranks, sizeof(bool));
        ok = choose_batches(&s, tf, tb, PICK_EXACT_ROOM, r->batch);
    }
    if (ok) {
        /* room-first microbatches only when the quick sufficient test of III fails */
        room_bounds room;
        CHECK(build_all_sets(&s, tf, tb, &room));
        bool most_room = !room_guaranteed(p, &room);
        for (int gi = 0, i = 0; gi < p->n_groups; gi++)
            for (int c = 0; c < p->groups[gi].count; c++, i++) {
                r->micro[i] = choose_micro(&p->groups[gi], r->batch[i], tf, tb, most_room, s.bmax, &r->keep[i]);
                CHECK(r->micro[i] > 0);
            }
        CHECK(assignment_phases(p, r->batch, r->micro, r->keep, &r->fwd_ms, &r->bwd_ms));
        r->objective = fmax(r->fwd_ms, p->fwd_floor) + fmax(r->bwd_ms, p->bwd_floor);
    }
    r->checks = s.checks;
    r->room_dps = s.room_dps;
    bool expired = s.expired;
    free(vf.v);
    free(vb.v);
    search_free(&s);
    if (!ok) { /* cut short after the staircase: no assignment (the counts stay for the caller) */
        free(r->batch), free(r->micro), free(r->keep);
        r->batch = r->micro = NULL;
        r->keep = NULL;
    }
    return ok ? 0 : expired ? 2 : 1;
}

void opt_result_free(opt_result *r) {
    free(r->batch);
    free(r->micro);
    free(r->keep);
    memset(r, 0, sizeof *r);
}

/* The slowest rank's forward and backward phase of an assignment; false when it breaks a
 * constraint (microbatch range, divisibility, the batch sum, what keeping allows, constraint III). */
static bool assignment_phases(const opt_problem *p, const int *batch, const int *micro, const bool *keep,
                              double *F, double *K) {
    int64_t room = 0;
    long total = 0;
    *F = *K = 0;
    for (int gi = 0, i = 0; gi < p->n_groups; gi++) {
        const opt_group *g = &p->groups[gi];
        for (int c = 0; c < g->count; c++, i++) {
            int m = micro[i], b = batch[i];
            bool k = keep && keep[i];
            if (m < 1 || m > g->mmax || b < m || b % m) return false;
            int l = b / m;
            if (g->max_micros > 0 && l > g->max_micros) return false;
            if (k ? !g->k_keep || l > g->keep_lmax[m] : g->keep_only) return false;
            *F = fmax(*F, (double)l * g->f[m]);
            *K = fmax(*K, (double)l * (k ? g->k_keep : g->k)[m]);
            if (p->need_room > 0) room += k ? g->keep_room(g->keep_ctx, m, l) : g->room[m];
            total += b;
        }
    }
    return total == p->batch && (p->need_room <= 0 || room >= p->need_room);
}

double opt_objective(const opt_problem *p, const int *batch, const int *micro, const bool *keep) {
    double F, K;
    if (!assignment_phases(p, batch, micro, keep, &F, &K)) return INFINITY;
    return fmax(F, p->fwd_floor) + fmax(K, p->bwd_floor);
}
