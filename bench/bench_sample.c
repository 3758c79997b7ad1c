/* bench_sample.c - the host's token choice (worker/model/sample.c) at GPT-2's vocabulary: greedy,
 * top-k, top-p and both, against sorting every candidate (what top-k/top-p did before they
 * selected only the candidates they may keep). Prints ms per token, of wall time and of the
 * thread's CPU time (which varies less on a busy machine); `make bench` runs it. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "model/sample.h"

enum { V = 50257, DRAWS = 200 };

static double clock_ms(clockid_t clock) {
    struct timespec t;
    clock_gettime(clock, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

typedef struct stopwatch {
    double wall, cpu;
} stopwatch;

static stopwatch start(void) {
    return (stopwatch){clock_ms(CLOCK_MONOTONIC), clock_ms(CLOCK_THREAD_CPUTIME_ID)};
}

static void report(const char *what, stopwatch s) {
    double wall = clock_ms(CLOCK_MONOTONIC) - s.wall;
    double cpu = clock_ms(CLOCK_THREAD_CPUTIME_ID) - s.cpu;
    printf("  %-24s %7.3f ms/token, %7.3f ms of CPU time\n", what, wall / DRAWS, cpu / DRAWS);
}

typedef struct cand {
    float logit;
    int id;
} cand;

static int by_logit(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return x->id - y->id;
}

int main(void) {
    float *l = malloc(V * sizeof *l);
    cand *c = malloc(V * sizeof *c);
    uint64_t gen = 1, rng = 5;
    /* logits uniform in [0, 4), every 97th raised by 6: a few likely tokens over a long tail */
    for (int i = 0; i < V; i++) l[i] = (float)(sample_uniform(&gen) * 4 + (i % 97 == 0 ? 6 : 0));
    const struct {
        const char *what;
        sample_opts o;
    } rows[] = {{"greedy", {0, 0, 1}}, {"top-k 40", {1, 40, 1}}, {"top-p 0.9", {0.8, 0, 0.9}},
                {"top-k 50, top-p 0.95", {1, 50, 0.95}}};
    sample_scratch sc = {0};
    long sink = 0;
    printf("token choice at vocabulary %d (%d draws each)\n", V, DRAWS);
    for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++) {
        stopwatch sw = start();
        for (int i = 0; i < DRAWS; i++) sink += sample_pick(l, V, &rows[k].o, &rng, &sc);
        report(rows[k].what, sw);
    }
    stopwatch sw = start();
    for (int i = 0; i < DRAWS; i++) {
        for (int j = 0; j < V; j++) c[j] = (cand){l[j], j};
        qsort(c, V, sizeof *c, by_logit);
        sink += c[0].id;
    }
    report("sorting every candidate", sw);
    sample_scratch_free(&sc);
    free(l), free(c);
    return sink < 0;
}
