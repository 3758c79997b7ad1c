/* bench_tok.c - tokenizer throughput: encodes a text file with a tokenizer.json and prints MB/s
 * (one core: the encoder is single-threaded) of wall time and of the thread's CPU time, which
 * varies less on a busy machine. bench/bench_tok.sh runs it for each kind.
 *
 *   bench_tok TOKENIZER.json TEXT [SECONDS]    encodes TEXT repeatedly for at least SECONDS (1) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "formats/tokenizer.h"

static double clock_s(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double now_s(void) { return clock_s(CLOCK_MONOTONIC); }

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: bench_tok TOKENIZER.json TEXT [SECONDS]\n");
        return 2;
    }
    double want = argc > 3 ? atof(argv[3]) : 1.0;
    err_t err;
    tok *t;
    double t0 = now_s();
    if (tok_load(&t, argv[1], &err) < 0) {
        fprintf(stderr, "bench_tok: %s\n", err.msg);
        return 2;
    }
    double load = now_s() - t0;
    FILE *f = fopen(argv[2], "rb");
    if (!f) {
        fprintf(stderr, "bench_tok: cannot open %s\n", argv[2]);
        return 2;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)n + 1);
    if (fread(text, 1, (size_t)n, f) != (size_t)n) return 2;
    fclose(f);
    tok_ids ids = {0};
    /* a cold pass first: the word cache starts empty in a real run too */
    double c0 = now_s();
    tok_encode(t, text, (size_t)n, false, &ids);
    double cold = now_s() - c0;
    size_t tokens = ids.n;
    int reps = 0;
    double start = now_s(), cpu0 = clock_s(CLOCK_THREAD_CPUTIME_ID), el;
    do {
        ids.n = 0;
        tok_encode(t, text, (size_t)n, false, &ids);
        reps++;
    } while ((el = now_s() - start) < want);
    double cpu = clock_s(CLOCK_THREAD_CPUTIME_ID) - cpu0;
    printf("%-44s %6.1f MB/s, %6.1f MB/s of CPU time (first pass %5.1f MB/s; %.1f MB, %zu tokens,"
           " %.2f bytes/token; load %.2f s)\n",
           tok_describe(t), (double)n * reps / el / 1e6, (double)n * reps / cpu / 1e6, (double)n / cold / 1e6,
           (double)n / 1e6, tokens, (double)n / (double)tokens, load);
    tok_ids_free(&ids);
    free(text);
    tok_free(t);
    return 0;
}
