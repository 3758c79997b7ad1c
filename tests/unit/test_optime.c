/* test_optime.c - the CEPHALO_CUDA_OPTIME table (worker/devices/optime.c): accumulation, the GPU
 * time (compute stream, nested classes not counted twice, side-stream copies not at all), and the
 * printed table read back: its order, and every number recomputed from the inputs. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devices/optime.h"

/* The table printed for a, as a malloc'ed string. */
static char *table(const optime_acc *a) {
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    assert_non_null(f);
    optime_print(a, "rank 0", f);
    fclose(f);
    return buf;
}

/* The table line of class c (its name at the start, after the indent), or NULL. */
static const char *line_of(const char *t, optime_class c) {
    const char *name = optime_name(c);
    for (const char *p = t; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        const char *q = p;
        while (*q == ' ') q++;
        if (strncmp(q, name, strlen(name)) == 0 && q[strlen(name)] == ' ') return p;
    }
    return NULL;
}

/* calls, total ms, % (NAN for "-") and mean us of class c's line */
static void read_line(const char *t, optime_class c, long long *calls, double *ms, double *pct,
                      double *mean) {
    const char *p = line_of(t, c);
    assert_non_null(p);
    p += strspn(p, " ") + strlen(optime_name(c));
    char pc[16];
    assert_int_equal(sscanf(p, "%lld %lf %15s %lf", calls, ms, pc, mean), 4);
    *pct = strcmp(pc, "-") == 0 ? NAN : atof(pc);
}

static void test_accumulate(void **state) {
    (void)state;
    optime_acc a;
    memset(&a, 0, sizeof a);
    optime_add(&a, OT_GEMM, 2.0);
    optime_add(&a, OT_GEMM, 4.0);
    optime_add(&a, OT_GEMM_ROUND, 1.5);
    optime_add(&a, OT_ATTN_FWD, 3.0);
    optime_add(&a, OT_COPY_D2H, 10.0);
    optime_add(&a, OT_COUNT, 99.0); /* out of range: ignored */
    assert_int_equal(a.calls[OT_GEMM], 2);
    assert_float_equal(a.ms[OT_GEMM], 6.0, 0);
    /* 6 + 3: the rounding is inside gemm's 6, the d2h copies overlap compute */
    assert_float_equal(optime_gpu_ms(&a), 9.0, 1e-12);
    assert_int_equal(optime_parent(OT_GEMM_ROUND), OT_GEMM);
    assert_int_equal(optime_parent(OT_GEMM), -1);
    assert_true(optime_side_stream(OT_COPY_H2D));
    assert_false(optime_side_stream(OT_COPY));
    for (int c = 0; c < OT_COUNT; c++) { /* every class has a distinct name */
        assert_non_null(optime_name((optime_class)c));
        for (int d = 0; d < c; d++) assert_string_not_equal(optime_name((optime_class)c), optime_name((optime_class)d));
    }
}

static void test_table(void **state) {
    (void)state;
    optime_acc a;
    memset(&a, 0, sizeof a);
    const double gemm[] = {1.25, 2.5, 0.75}, attn[] = {4.0, 4.5}, xent = 0.5, h2d = 7.0;
    for (int i = 0; i < 3; i++) optime_add(&a, OT_GEMM, gemm[i]);
    optime_add(&a, OT_GEMM_ROUND, 1.0);
    for (int i = 0; i < 2; i++) optime_add(&a, OT_ATTN_FWD, attn[i]);
    optime_add(&a, OT_XENT, xent);
    optime_add(&a, OT_COPY_H2D, h2d);
    char *t = table(&a);
    const double gpu = 1.25 + 2.5 + 0.75 + 4.0 + 4.5 + 0.5;
    assert_non_null(strstr(t, "rank 0"));
    long long calls;
    double ms, pct, mean, pct_sum = 0;
    read_line(t, OT_ATTN_FWD, &calls, &ms, &pct, &mean);
    assert_int_equal(calls, 2);
    assert_float_equal(ms, 8.5, 0.006);
    assert_float_equal(pct, 100 * 8.5 / gpu, 0.06);
    assert_float_equal(mean, 1000 * 8.5 / 2, 0.06);
    pct_sum += pct;
    read_line(t, OT_GEMM, &calls, &ms, &pct, &mean);
    assert_int_equal(calls, 3);
    assert_float_equal(ms, 4.5, 0.006);
    assert_float_equal(mean, 1500.0, 0.06);
    pct_sum += pct;
    read_line(t, OT_XENT, &calls, &ms, &pct, &mean);
    pct_sum += pct;
    assert_float_equal(pct_sum, 100.0, 0.15); /* the top-level compute rows make up the time */
    read_line(t, OT_GEMM_ROUND, &calls, &ms, &pct, &mean);
    assert_float_equal(pct, 100 * 1.0 / gpu, 0.06); /* a share of the same GPU time */
    read_line(t, OT_COPY_H2D, &calls, &ms, &pct, &mean);
    assert_true(isnan(pct)); /* overlaps compute: no share */
    assert_float_equal(ms, h2d, 0.006);
    /* order: attention (8.5) before gemm (4.5), the nested rounding right under gemm, then
     * cross-entropy, the side stream last; classes never called are absent */
    const char *pa = line_of(t, OT_ATTN_FWD), *pg = line_of(t, OT_GEMM), *pr = line_of(t, OT_GEMM_ROUND),
               *px = line_of(t, OT_XENT), *ph = line_of(t, OT_COPY_H2D);
    assert_true(pa < pg && pg < pr && pr < px && px < ph);
    assert_null(line_of(t, OT_ADAMW));
    free(t);

    memset(&a, 0, sizeof a); /* nothing timed */
    t = table(&a);
    assert_non_null(strstr(t, "no ops timed"));
    free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_accumulate), cmocka_unit_test(test_table)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
