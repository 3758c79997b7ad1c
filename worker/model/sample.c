/* sample.c - choosing the next token (sample.h): greedy, temperature, top-k, top-p, on the host,
 * with a seeded splitmix64 stream, so the same seed gives the same text. The command that reads
 * a model and generates with the KV cache (kvcache.c) is worker/cmd/sample.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "model/sample.h"


/* ---------------------------------------------------------------------------------------------
 * choosing a token */

double sample_uniform(uint64_t *rng) {
    uint64_t z = (*rng += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0); /* 53 bits */
}

typedef struct cand {
    float logit;
    int32_t id;
} cand;

/* Falling logit, then rising id: a total order, so the sort (and the choice) is deterministic. */
static int by_logit(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static int32_t argmax(const float *logits, int V) {
    int32_t best = 0;
    for (int32_t i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

/* Whether candidate a comes before b in by_logit's order. */
static bool cand_before(cand a, cand b) {
    return a.logit != b.logit ? a.logit > b.logit : a.id < b.id;
}

static void heap_sift(cand *h, int n, int i) { /* h[0] is the last of the kept (a min-heap) */
    for (;;) {
        int w = i, l = 2 * i + 1, r = l + 1;
        if (l < n && cand_before(h[w], h[l])) w = l;
        if (r < n && cand_before(h[w], h[r])) w = r;
        if (w == i) return;
        cand t = h[i];
        h[i] = h[w], h[w] = t, i = w;
    }
}

/* Moves the k first candidates of by_logit's order to c[0..k), sorted: a heap of k over the V,
 * O(V log k), where sorting all V is O(V log V) (top-k 40 of 50,257: about 5x fewer steps). The
 * rest of c stays a permutation of the other candidates. */
static void select_top(cand *c, int V, int k) {
    if (k >= V) {
        qsort(c, (size_t)V, sizeof *c, by_logit);
        return;
    }
    for (int i = k / 2 - 1; i >= 0; i--) heap_sift(c, k, i);
    for (int i = k; i < V; i++)
        if (cand_before(c[i], c[0])) {
            cand t = c[0];
            c[0] = c[i], c[i] = t;
            heap_sift(c, k, 0);
        }
    qsort(c, (size_t)k, sizeof *c, by_logit);
}

/* The nucleus: the smallest prefix of c[0..keep) in by_logit's order whose mass reaches top_p of
 * `total` (at least one token). Only the prefix is ever sorted: the first 256 candidates, then 4x
 * as many while the mass falls short. Returns its length; *mass is its probability mass. */
static int nucleus(cand *c, double *p, int V, int keep, bool sorted, double top, const sample_opts *o,
                   double total, double *mass) {
    for (int span = keep < 256 ? keep : 256;; span = span > keep / 4 ? keep : span * 4) {
        if (!sorted) select_top(c, V, span);
        *mass = 0;
        int n = 0;
        while (n < span && (n == 0 || *mass < o->top_p * total)) {
            p[n] = exp(((double)c[n].logit - top) / o->temperature);
            *mass += p[n++];
        }
        if (n < span || *mass >= o->top_p * total || span == keep) return n;
    }
}

int32_t sample_pick(const float *logits, int V, const sample_opts *o, uint64_t *rng,
                    sample_scratch *sc) {
    if (o->temperature <= 0) return argmax(logits, V);
    if (sc->cap < V) {
        free(sc->cand);
        sc->cand = xmalloc((size_t)V * (sizeof(cand) + sizeof(double)));
        sc->cap = V;
    }
    cand *c = sc->cand;
    double *p = (double *)(c + V); /* [keep] unnormalised probabilities, in c's order */
    for (int32_t i = 0; i < V; i++) c[i] = (cand){logits[i], i};
    bool top_k = o->top_k > 0 && o->top_k < V;
    int keep = top_k ? o->top_k : V;
    /* only truncation needs the order, and only of the candidates it may keep; plain temperature
     * sampling walks the ids as they are */
    if (top_k) select_top(c, V, keep);
    double top = logits[argmax(logits, V)], total = 0;
    for (int i = 0; i < keep; i++) total += p[i] = exp(((double)c[i].logit - top) / o->temperature);
    if (o->top_p < 1.0) keep = nucleus(c, p, V, keep, top_k, top, o, total, &total);
    double u = sample_uniform(rng) * total, acc = 0;
    int pick = keep - 1; /* rounding can leave u just above the last partial sum */
    for (int i = 0; i < keep; i++)
        if ((acc += p[i]) > u) {
            pick = i;
            break;
        }
    return c[pick].id;
}

void sample_scratch_free(sample_scratch *sc) {
    free(sc->cand);
    sc->cand = NULL, sc->cap = 0;
}
