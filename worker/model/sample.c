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
    int keep = V;
    /* only truncation needs the order; plain temperature sampling walks the ids as they are */
    bool truncate = (o->top_k > 0 && o->top_k < V) || o->top_p < 1.0;
    if (truncate) qsort(c, (size_t)V, sizeof *c, by_logit);
    if (o->top_k > 0 && o->top_k < keep) keep = o->top_k;
    double top = logits[argmax(logits, V)], total = 0;
    for (int i = 0; i < keep; i++) total += p[i] = exp(((double)c[i].logit - top) / o->temperature);
    if (o->top_p < 1.0) { /* the smallest prefix whose mass reaches top_p (at least one token) */
        double mass = 0;
        int n = 0;
        while (n < keep && (n == 0 || mass < o->top_p * total)) mass += p[n++];
        keep = n, total = mass;
    }
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
