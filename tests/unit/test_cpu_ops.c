/* test_cpu_ops.c - the CPU device (worker/devices/cpu_device.c, cpu_attention.c) against naive
 * double-precision references written here, on small odd shapes.
 *
 * Tolerances: fp32 kernels against double references pass when, elementwise,
 *   |got - ref| <= rtol * |ref| + atol * max|ref|      (rtol = atol = 1e-5 unless stated)
 * The atol term is scaled by the array's largest magnitude so that entries which cancel to ~0 are
 * judged against the precision of their inputs. The backward references are themselves checked
 * against central finite differences of the double forward (h = 1e-5, agreement 1e-6). Further:
 * determinism (bit-identical reruns, and the same bits for 1 and 2 threads where the kernels
 * promise it), the accumulate-vs-overwrite contract of device.h (outputs pre-filled with nonzero
 * values) and the accounting allocator. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devices/cpu_internal.h"
#include "devices/device.h"

#define RTOL 1e-5
#define ATOL 1e-5
#define FD_H 1e-5
#define FD_TOL 1e-6
#define PI 3.14159265358979323846

/* ---------------------------------------------------------------------------------------------
 * helpers */

static uint64_t rng_state = 88172645463325252ULL;

static void seed(uint64_t s) { rng_state = s * 2685821657736338717ULL + 1442695040888963407ULL; }

/* uniform in [-1, 1) */
static float frand(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 40) / (double)(1ULL << 24) * 2.0 - 1.0);
}

static float *frandom(int64_t n, float scale) {
    float *p = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) p[i] = scale * frand();
    return p;
}

static float *ffill(int64_t n, float v) {
    float *p = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) p[i] = v;
    return p;
}

static float *fdup(const float *src, int64_t n) {
    float *p = malloc((size_t)n * sizeof(float));
    memcpy(p, src, (size_t)n * sizeof(float));
    return p;
}

static double *to_double(const float *src, int64_t n) {
    double *p = malloc((size_t)n * sizeof(double));
    for (int64_t i = 0; i < n; i++) p[i] = src[i];
    return p;
}

static double *dzeros(int64_t n) { return calloc((size_t)n, sizeof(double)); }

static double max_abs(const double *x, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs(x[i]));
    return m;
}

/* |got - ref| <= rtol |ref| + abs_floor for every element (NaN fails). */
static void expect_near(const char *what, const float *got, const double *ref, int64_t n,
                        double rtol, double abs_floor) {
    for (int64_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - ref[i]);
        double bound = rtol * fabs(ref[i]) + abs_floor;
        if (!(err <= bound))
            fail_msg("%s[%lld]: got %.9g, want %.9g (error %.3g > bound %.3g)", what, (long long)i,
                     (double)got[i], ref[i], err, bound);
    }
}

/* |got - ref| <= rtol |ref| + atol max|ref| */
static void expect_close(const char *what, const float *got, const double *ref, int64_t n,
                         double rtol, double atol) {
    double m = max_abs(ref, n);
    expect_near(what, got, ref, n, rtol, atol * (m > 0 ? m : 1.0));
}

static void expect_all(const char *what, const float *x, int64_t n, float v) {
    for (int64_t i = 0; i < n; i++)
        if (x[i] != v)
            fail_msg("%s[%lld] = %.9g, want %.9g (untouched)", what, (long long)i, (double)x[i],
                     (double)v);
}

static void expect_same_bits(const char *what, const void *a, const void *b, size_t bytes) {
    if (memcmp(a, b, bytes)) fail_msg("%s: two runs differ", what);
}

/* A scalar loss L(x) of a double forward, and its central difference in x[i]. */
typedef double (*loss_fn)(void *ctx);

static double central_diff(loss_fn L, void *ctx, double *x, int64_t i) {
    double x0 = x[i];
    x[i] = x0 + FD_H;
    double lp = L(ctx);
    x[i] = x0 - FD_H;
    double lm = L(ctx);
    x[i] = x0;
    return (lp - lm) / (2 * FD_H);
}

/* Checks grad[i] against finite differences of L in every x[i] (or `samples` spread entries). */
static void expect_fd(const char *what, loss_fn L, void *ctx, double *x, const double *grad,
                      int64_t n, int64_t samples) {
    double scale = max_abs(grad, n) > 0 ? max_abs(grad, n) : 1.0;
    int64_t step = samples > 0 && samples < n ? n / samples : 1;
    for (int64_t i = 0; i < n; i += step) {
        double fd = central_diff(L, ctx, x, i);
        if (!(fabs(fd - grad[i]) <= FD_TOL * (fabs(fd) + scale)))
            fail_msg("%s[%lld]: analytic %.12g, finite difference %.12g", what, (long long)i,
                     grad[i], fd);
    }
}

static double dot_d(const double *a, const double *b, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static int dev_setup(void **state) {
    device *d = calloc(1, sizeof *d);
    err_t err;
    if (cpu_device_init(d, 0, 2, 0, &err) < 0) return -1;
    *state = d;
    return 0;
}

static int dev_teardown(void **state) {
    device *d = *state;
    cpu_device_close(d);
    free(d);
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * device, allocator */

static void test_init_and_allocator(void **state) {
    (void)state;
    device d;
    err_t err = {{0}};
    assert_int_equal(cpu_device_init(&d, 3, -1, 0, &err), -1);
    assert_non_null(strstr(err.msg, "threads"));
    assert_int_equal(cpu_device_init(&d, 3, 0, 0, &err), 0);
    assert_int_equal(d.threads, omp_get_num_procs());
    assert_string_equal(d.ops->name, "cpu");
    cpu_device_close(&d);

    assert_int_equal(cpu_device_init(&d, 3, 2, 4096, &err), 0);
    assert_int_equal(d.threads, 2);
    dev_set_context(&d, "block.%d forward", 3);
    char *a = dev_alloc(&d, 1000, "activations");
    assert_non_null(a);
    assert_int_equal((uintptr_t)a % 64, 0);
    memset(a, 1, 1000); /* all of it is usable (ASan watches) */
    assert_int_equal(d.cur_bytes, 1000);
    assert_int_equal(d.peak_bytes, 1000);
    assert_int_equal(d.n_allocs, 1);
    float *b = dev_alloc_f(&d, 750, "weights"); /* 3000 bytes: 4000 of 4096 */
    assert_non_null(b);
    assert_int_equal((uintptr_t)b % 64, 0);
    assert_int_equal(d.cur_bytes, 4000);

    assert_null(dev_alloc(&d, 200, "scratch")); /* 4200 > 4096 */
    const char *m = d.err.msg;
    assert_non_null(strstr(m, "rank 3"));
    assert_non_null(strstr(m, "cpu"));
    assert_non_null(strstr(m, "block.3 forward"));
    assert_non_null(strstr(m, "scratch"));
    assert_non_null(strstr(m, "200 B"));
    assert_non_null(strstr(m, "4000 B"));
    assert_non_null(strstr(m, "4096 B"));
    assert_int_equal(d.cur_bytes, 4000);
    assert_int_equal(d.n_allocs, 2);

    dev_free(&d, b);
    assert_int_equal(d.cur_bytes, 1000);
    assert_int_equal(d.peak_bytes, 4000);
    assert_int_equal(d.n_allocs, 1);
    assert_non_null(b = dev_alloc_f(&d, 750, "weights")); /* the room is back */
    dev_free(&d, b);
    dev_free(&d, a);
    dev_free(&d, NULL);
    assert_int_equal(d.cur_bytes, 0);
    assert_int_equal(d.n_allocs, 0);
    assert_int_equal(d.peak_bytes, 4000);

    /* upload / download / copy through the op table */
    float host[37], back[37];
    for (int i = 0; i < 37; i++) host[i] = (float)i * 0.5f;
    float *x = dev_alloc_f(&d, 37, "x"), *y = dev_alloc_f(&d, 37, "y");
    dev_upload(&d, x, host, sizeof host);
    d.ops->copy(&d, y, x, sizeof host, COPY_D2D);
    d.ops->sync(&d);
    dev_download(&d, back, y, sizeof back);
    assert_memory_equal(host, back, sizeof host);
    dev_zero(&d, y, 37);
    dev_download(&d, back, y, sizeof back);
    for (int i = 0; i < 37; i++) assert_true(back[i] == 0.0f);
    dev_free(&d, x);
    dev_free(&d, y);
    cpu_device_close(&d);
    assert_null(d.alloc_table);
}

/* The exp behind softmax, sigmoid and GELU: within 3 ulp of exp() over the whole range. */
/* Issue 15: OOM messages were cut mid-word (a 64-byte context). The longest context the trainer
 * sets (worker/model/train.c, a unit's set-up, with the largest counts) must reach the message whole. */
static void test_oom_names_the_whole_context(void **state) {
    (void)state;
    device d;
    err_t err = {{0}};
    assert_int_equal(cpu_device_init(&d, 7, 1, 1024, &err), 0);
    dev_set_context(&d, "set-up of unit %d (a shard of %lld of its %lld parameters)", 2147483647,
                    (long long)INT64_MAX, (long long)INT64_MAX);
    assert_null(dev_alloc(&d, 4096, "AdamW second moments"));
    assert_non_null(strstr(d.err.msg, "during set-up of unit 2147483647 (a shard of 9223372036854775807 of its "
                                      "9223372036854775807 parameters): allocating 4096 B for AdamW second moments, "
                                      "0 B of 1024 B already in use"));
    cpu_device_close(&d);
}

/* A context longer than the buffer ends after its last whole word, with "...", also when the cut
 * would fall inside a word or a multi-byte character. */
static void test_context_cut_at_a_word(void **state) {
    (void)state;
    device d;
    err_t err = {{0}};
    assert_int_equal(cpu_device_init(&d, 0, 1, 0, &err), 0);
    char words[400] = "";
    for (int i = 0; i < 40; i++) strcat(words, "forward ");
    dev_set_context(&d, "%s", words);
    size_t n = strlen(d.context);
    assert_true(n < sizeof d.context && n > sizeof d.context - 12);
    assert_string_equal(d.context + n - 10, "forward...");
    char one[400] = "x";
    for (int i = 0; i < 100; i++) strcat(one, "\xc3\xa9"); /* one long word of 2-byte characters */
    dev_set_context(&d, "%s", one);
    n = strlen(d.context);
    assert_string_equal(d.context + n - 3, "...");
    assert_true((n - 3) % 2 == 1); /* "x" and whole characters only */
    cpu_device_close(&d);
}

static void test_exp_fast(void **state) {
    (void)state;
    double worst = 0;
    for (double x = -87.0; x <= 88.0; x += 0.0007) {
        float xf = (float)x;
        double want = exp((double)xf);
        double rel = fabs(exp_fast(xf) - want) / want;
        worst = fmax(worst, rel);
    }
    if (worst > 3 * 5.97e-8) fail_msg("exp_fast: worst relative error %.3g", worst);
    assert_true(exp_fast(0.0f) == 1.0f);
    assert_true(exp_fast(-100.0f) == 0.0f);
    assert_true(exp_fast(-INFINITY) == 0.0f);
    assert_true(isnan(exp_fast(NAN)));
    assert_true(exp_fast(1000.0f) > 1e38f);
}

/* ---------------------------------------------------------------------------------------------
 * elementwise, reductions, copies */

/* The sum of squares of one tensor through sumsq_multi (the CPU device's memory is the host's). */
static double sumsq1(device *d, const float *x, int64_t n) {
    double out = -1;
    d->ops->sumsq_multi(d, &out, 1, &x, &n);
    return out;
}

/* sumsq_multi over lists of 0, 1, 5 and more than SUMSQ_MULTI_MAX tensors (some empty): the
 * float64 sum within 1e-12, and bit for bit the tensors' own sums added in list order. */
static void test_sumsq_multi(void **state) {
    device *d = *state;
    seed(7);
    const int counts[] = {0, 1, 5, SUMSQ_MULTI_MAX + 7};
    for (size_t c = 0; c < sizeof counts / sizeof *counts; c++) {
        int k = counts[c];
        const float **x = calloc((size_t)k + 1, sizeof *x);
        int64_t *n = calloc((size_t)k + 1, sizeof *n);
        double want = 0, inorder = 0;
        for (int i = 0; i < k; i++) {
            n[i] = i % 4 == 3 ? 0 : (i * 7919) % 150000 + 1; /* up to a few SUMSQ chunks */
            float *t = frandom(n[i] ? n[i] : 1, 1.5f);
            x[i] = t;
            for (int64_t j = 0; j < n[i]; j++) want += (double)t[j] * t[j];
            inorder += sumsq1(d, t, n[i]);
        }
        double got = 12345; /* overwritten, not added to */
        d->ops->sumsq_multi(d, &got, k, x, n);
        if (!(fabs(got - want) <= 1e-12 * want)) fail_msg("sumsq_multi of %d: %.17g, want %.17g", k, got, want);
        if (got != inorder) fail_msg("sumsq_multi of %d: %.17g, the tensors' sums in order %.17g", k, got, inorder);
        for (int i = 0; i < k; i++) free((void *)x[i]);
        free(x), free(n);
    }
}

/* The CPU device counts a host wait where the CUDA device waits: copies from and to the host,
 * sync and event_sync, never a queued copy or a compute op. */
static void test_host_syncs(void **state) {
    device *d = *state;
    float a[4] = {1, 2, 3, 4}, *x = dev_alloc_f(d, 4, "x");
    int64_t h0 = d->host_syncs;
    d->ops->copy_async(d, x, a, sizeof a, COPY_H2D, DEV_STREAM_H2D);
    d->ops->copy(d, x, x, sizeof a, COPY_D2D);
    d->ops->scale(d, x, 2.0f, 4);
    double sq = 0;
    int64_t four = 4;
    const float *xs = x;
    d->ops->sumsq_multi(d, &sq, 1, &xs, &four);
    assert_int_equal(d->host_syncs, h0); /* nothing so far waits */
    dev_download(d, a, x, sizeof a);
    assert_int_equal(d->host_syncs, h0 + 1);
    d->ops->sync(d);
    dev_event *e = d->ops->event_new(d);
    d->ops->event_record(d, e, DEV_STREAM_COMPUTE);
    d->ops->event_sync(d, e);
    d->ops->event_free(d, e);
    assert_int_equal(d->host_syncs, h0 + 3);
    assert_true(a[3] == 8.0f && sq == 4 * (1 + 4 + 9 + 16));
    dev_free(d, x);
}

static void test_elementwise(void **state) {
    device *d = *state;
    const int64_t sizes[] = {13, 100003}; /* one thread, and the parallel path */
    for (int s = 0; s < 2; s++) {
        int64_t n = sizes[s];
        seed(1 + s);
        float *a = frandom(n, 2.0f), *b = frandom(n, 2.0f), *out = ffill(n, 9.0f);
        d->ops->fill(d, out, 0.25f, n);
        expect_all("fill", out, n, 0.25f);
        d->ops->add(d, out, a, b, n);
        for (int64_t i = 0; i < n; i++) assert_true(out[i] == a[i] + b[i]);
        float *y = fdup(a, n);
        d->ops->axpy(d, y, -0.75f, b, n);
        for (int64_t i = 0; i < n; i++) assert_true(y[i] == a[i] + -0.75f * b[i]);
        d->ops->scale(d, y, 3.0f, n);
        for (int64_t i = 0; i < n; i++) assert_true(y[i] == (a[i] + -0.75f * b[i]) * 3.0f);
        d->ops->add(d, a, a, b, n); /* out may alias an input */
        for (int64_t i = 0; i < n; i++) assert_true(a[i] == out[i]);

        double want = 0;
        for (int64_t i = 0; i < n; i++) want += (double)b[i] * b[i];
        double got = sumsq1(d, b, n);
        if (!(fabs(got - want) <= 1e-12 * want)) fail_msg("sumsq %.17g, want %.17g", got, want);
        free(a), free(b), free(out), free(y);
    }
    assert_true(sumsq1(d, NULL, 0) == 0.0);

    /* copy2d: rows of a strided block; the padding of the destination stays */
    int rows = 7, cols = 13, lds = 20, ldo = 17;
    float *src = frandom((int64_t)rows * lds, 1.0f), *dst = ffill((int64_t)rows * ldo, 5.0f);
    d->ops->copy2d(d, dst, ldo, src, lds, rows, cols);
    for (int r = 0; r < rows; r++) {
        assert_memory_equal(dst + r * ldo, src + r * lds, cols * sizeof(float));
        expect_all("copy2d padding", dst + r * ldo + cols, ldo - cols, 5.0f);
    }
    free(src), free(dst);
}

/* ---------------------------------------------------------------------------------------------
 * matrix products, bias */

static void test_gemm(void **state) {
    device *d = *state;
    const int M = 7, N = 13, K = 37;
    for (int t = 0; t < 4; t++) {
        bool ta = t & 1, tb = t & 2;
        int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 2, ldc = N + 5;
        seed(10 + t);
        float *A = frandom((int64_t)(ta ? K : M) * lda, 1.0f);
        float *B = frandom((int64_t)(tb ? N : K) * ldb, 1.0f);
        float *C = frandom((int64_t)M * ldc, 1.0f);
        double *want = to_double(C, (int64_t)M * ldc);
        const float alpha = 0.7f, beta = 0.3f;
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double s = 0;
                for (int k = 0; k < K; k++) {
                    double av = ta ? A[k * lda + i] : A[i * lda + k];
                    double bv = tb ? B[j * ldb + k] : B[k * ldb + j];
                    s += av * bv;
                }
                want[i * ldc + j] = alpha * s + beta * want[i * ldc + j];
            }
        d->ops->gemm(d, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        expect_close("gemm", C, want, (int64_t)M * ldc, RTOL, ATOL); /* padding included */
        free(A), free(B), free(C), free(want);
    }
}

/* ---------------------------------------------------------------------------------------------
 * 16-bit formats. The fp16 oracle is the compiler's _Float16 (correctly rounded IEEE binary16
 * conversions, independent of cpu_device.c); bf16 is checked against a round-to-nearest-even
 * written here on doubles. */

static uint32_t bits_of(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static float float_of(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

static uint16_t oracle_fp16(float x) {
    _Float16 h = (_Float16)x;
    uint16_t b;
    memcpy(&b, &h, 2);
    return b;
}

static float oracle_fp16_widen(uint16_t b) {
    _Float16 h;
    memcpy(&h, &b, 2);
    return (float)h;
}

/* Nearest bf16 by distance (ties to the even pattern), from the two candidates around x. */
static uint16_t oracle_bf16(float x) {
    uint32_t lo = bits_of(x) & 0xffff0000u, hi = lo + 0x10000u;
    /* above the largest bf16 the next step is 2^128 (inf, as IEEE overflow rounds) */
    double vhi = (hi & 0x7fffffffu) == 0x7f800000u ? copysign(0x1p128, x) : (double)float_of(hi);
    double dl = fabs((double)x - (double)float_of(lo)), dh = fabs(vhi - (double)x);
    if ((lo & 0x7f800000u) == 0x7f800000u) return (uint16_t)(lo >> 16); /* inf stays */
    return (uint16_t)((dl < dh || (dl == dh && !(lo & 0x10000u)) ? lo : hi) >> 16);
}

/* Inputs that find rounding mistakes: every half and the midpoints between neighbours (ties),
 * one ulp of fp32 either side of them, and random values over the whole fp16 range and beyond. */
static int64_t half_inputs(float *x) {
    int64_t n = 0;
    for (uint32_t h = 0; h < 0x7c00u; h++) {
        float a = oracle_fp16_widen((uint16_t)h), b = oracle_fp16_widen((uint16_t)(h + 1));
        float mid = (float)(((double)a + (double)b) / 2); /* exact in fp32 */
        float v[] = {a, mid, nextafterf(mid, 0), nextafterf(mid, INFINITY)};
        for (int i = 0; i < 4; i++) x[n++] = v[i], x[n++] = -v[i];
    }
    seed(77);
    for (int i = 0; i < 100000; i++) x[n++] = ldexpf(frand(), (int)(frand() * 40)); /* 2^-40..2^40 */
    x[n++] = INFINITY, x[n++] = -INFINITY, x[n++] = 65504.0f, x[n++] = 65519.99f, x[n++] = 65520.0f;
    return n;
}

static void test_fp16_bf16(void **state) {
    device *d = *state;
    float *x = malloc((8 * 0x7c00 + 100010) * sizeof(float));
    int64_t n = half_inputs(x);
    uint16_t *h = malloc((size_t)n * 2);
    d->ops->to_fp16(d, h, x, n);
    for (int64_t i = 0; i < n; i++)
        if (h[i] != oracle_fp16(x[i]))
            fail_msg("to_fp16(%a) = 0x%04x, IEEE says 0x%04x", (double)x[i], h[i], oracle_fp16(x[i]));
    d->ops->to_bf16(d, h, x, n);
    for (int64_t i = 0; i < n; i++)
        if (h[i] != oracle_bf16(x[i]))
            fail_msg("to_bf16(%a) = 0x%04x, expected 0x%04x", (double)x[i], h[i], oracle_bf16(x[i]));
    /* widening is exact for every pattern; NaN stays NaN (both ways) */
    uint16_t all[65536];
    float *w = malloc(65536 * sizeof(float));
    for (int i = 0; i < 65536; i++) all[i] = (uint16_t)i;
    d->ops->from_fp16(d, w, all, 65536);
    for (int i = 0; i < 65536; i++) {
        float want = oracle_fp16_widen((uint16_t)i);
        if (isnan(want) ? !isnan(w[i]) : bits_of(w[i]) != bits_of(want))
            fail_msg("from_fp16(0x%04x) = %a, expected %a", i, (double)w[i], (double)want);
    }
    d->ops->from_bf16(d, w, all, 65536);
    for (int i = 0; i < 65536; i++) assert_true(bits_of(w[i]) == (uint32_t)i << 16);
    float nan = NAN;
    d->ops->to_fp16(d, h, &nan, 1);
    assert_true((h[0] & 0x7c00u) == 0x7c00u && (h[0] & 0x3ffu));
    free(x), free(h), free(w);
}

/* round_half (16-bit activations) is to_bf16 / to_fp16 and the widening, in place: the same
 * bits as the oracles' rounding then the exact widening, over the same inputs. */
static void test_round_half(void **state) {
    device *d = *state;
    float *x = malloc((8 * 0x7c00 + 100010) * sizeof(float));
    int64_t n = half_inputs(x);
    float *r = malloc((size_t)n * sizeof(float));
    for (int fmt = 0; fmt < 2; fmt++) {
        precision p = fmt ? PREC_FP16 : PREC_BF16;
        memcpy(r, x, (size_t)n * sizeof(float));
        d->ops->round_half(d, r, n, p);
        for (int64_t i = 0; i < n; i++) {
            float want;
            if (fmt) want = oracle_fp16_widen(oracle_fp16(x[i]));
            else {
                uint32_t u = (uint32_t)oracle_bf16(x[i]) << 16;
                memcpy(&want, &u, sizeof want);
            }
            if (bits_of(r[i]) != bits_of(want))
                fail_msg("round_half(%a, %s) = %a, expected %a", (double)x[i], fmt ? "fp16" : "bf16",
                         (double)r[i], (double)want);
        }
    }
    float big = 70000.0f, nan = NAN;
    d->ops->round_half(d, &big, 1, PREC_FP16);
    d->ops->round_half(d, &nan, 1, PREC_BF16);
    assert_true(isinf(big) && isnan(nan)); /* fp16 overflows to inf, the scaler's signal */
    free(x), free(r);
}

/* add_norm_fwd is add, then layernorm_fwd or rmsnorm_fwd, then round_half, bit for bit: with sum
 * aliasing a (the residual add in place, as the blocks call it) or apart, for widths around the
 * vector lanes, in fp32, bf16 and fp16. */
static void test_add_norm(void **state) {
    device *d = *state;
    static const int widths[] = {1, 7, 8, 64, 67};
    for (size_t k = 0; k < sizeof widths / sizeof *widths; k++)
        for (int kind = 0; kind < 2; kind++)
            for (int q = 0; q < 3; q++) {
                precision hp = (precision[]){PREC_FP32, PREC_BF16, PREC_FP16}[q];
                int N = 13, C = widths[k];
                int64_t n = (int64_t)N * C;
                seed(900 + k);
                float *a = frandom(n, 3.0f), *b = frandom(n, 3.0f), *w = frandom(C, 1.0f),
                      *bias = frandom(C, 1.0f);
                float *s1 = malloc((size_t)n * 4), *o1 = malloc((size_t)n * 4), *o2 = malloc((size_t)n * 4), *s2 = malloc((size_t)n * 4);
                float m1[13], r1[13], m2[13], r2[13];
                bool ln = kind == 0;
                /* unfused */
                memcpy(s1, a, (size_t)n * 4);
                d->ops->axpy(d, s1, 1.0f, b, n);
                if (ln) d->ops->layernorm_fwd(d, o1, m1, r1, s1, w, bias, N, C, 1e-5f);
                else d->ops->rmsnorm_fwd(d, o1, r1, s1, w, N, C, 1e-5f);
                if (hp != PREC_FP32) d->ops->round_half(d, o1, n, hp);
                /* fused, in place (sum = a) and apart */
                for (int apart = 0; apart < 2; apart++) {
                    float *sum = apart ? s2 : memcpy(s2, a, (size_t)n * 4);
                    d->ops->add_norm_fwd(d, sum, o2, ln ? m2 : NULL, r2, apart ? a : sum, b, w, ln ? bias : NULL,
                                         N, C, 1e-5f, hp);
                    assert_memory_equal(s2, s1, (size_t)n * 4);
                    assert_memory_equal(o2, o1, (size_t)n * 4);
                    assert_memory_equal(r2, r1, (size_t)N * 4);
                    if (ln) assert_memory_equal(m2, m1, (size_t)N * 4);
                }
                free(a), free(b), free(w), free(bias), free(s1), free(o1), free(o2), free(s2);
            }
}

/* The 16-bit gemm modes: sgemm on operands rounded here by the oracles, bit for bit; fp16
 * operands above 65504 become inf (what an fp16 tensor core sees: the loss scaler's signal). */
static void test_gemm_half(void **state) {
    device *d = *state;
    const int M = 9, N = 11, K = 300;
    for (int mode = 0; mode < 2; mode++) {
        bool fp16 = mode == 1;
        seed(40 + mode);
        float *A = frandom((int64_t)M * K, 3.0f), *B = frandom((int64_t)K * N, 3.0f);
        float *Ar = malloc((size_t)M * K * 4), *Br = malloc((size_t)K * N * 4);
        for (int64_t i = 0; i < (int64_t)M * K; i++)
            Ar[i] = fp16 ? oracle_fp16_widen(oracle_fp16(A[i])) : float_of((uint32_t)oracle_bf16(A[i]) << 16);
        for (int64_t i = 0; i < (int64_t)K * N; i++)
            Br[i] = fp16 ? oracle_fp16_widen(oracle_fp16(B[i])) : float_of((uint32_t)oracle_bf16(B[i]) << 16);
        float *C = ffill((int64_t)M * N, 0.25f), *want = ffill((int64_t)M * N, 0.25f);
        d->matmul = DEV_MATMUL_FP32;
        d->ops->gemm(d, false, false, M, N, K, 0.5f, Ar, K, Br, N, 1.0f, want, N);
        d->matmul = fp16 ? DEV_MATMUL_FP16 : DEV_MATMUL_BF16;
        d->ops->gemm(d, false, false, M, N, K, 0.5f, A, K, B, N, 1.0f, C, N);
        expect_same_bits(fp16 ? "gemm fp16 vs rounded operands" : "gemm bf16 vs rounded operands",
                         C, want, (size_t)M * N * sizeof(float));
        bool differs = memcmp(Ar, A, (size_t)M * K * 4) != 0; /* the rounding did something */
        assert_true(differs);
        A[0] = 70000.0f; /* row 0 of C sees an fp16 inf; bf16 holds 70000 */
        d->ops->gemm(d, false, false, M, N, K, 1.0f, A, K, B, N, 0.0f, C, N);
        assert_true(fp16 ? !isfinite(C[0]) : isfinite(C[0]));
        assert_true(isfinite(C[N])); /* other rows untouched */
        d->matmul = DEV_MATMUL_FP32;
        free(A), free(B), free(Ar), free(Br), free(C), free(want);
    }
}

static void test_bias(void **state) {
    device *d = *state;
    const int N = 300, C = 45; /* C crosses a column block */
    seed(20);
    float *x = frandom((int64_t)N * C, 1.0f), *b = frandom(C, 1.0f);
    float *x0 = fdup(x, (int64_t)N * C);
    d->ops->add_bias(d, x, b, N, C);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) assert_true(x[n * C + c] == x0[n * C + c] + b[c]);

    float *db = ffill(C, 0.5f); /* accumulates */
    double want[45];
    for (int c = 0; c < C; c++) {
        want[c] = 0.5;
        for (int n = 0; n < N; n++) want[c] += x0[n * C + c];
    }
    d->ops->bias_grad(d, db, x0, N, C);
    expect_close("bias_grad", db, want, C, RTOL, ATOL);
    free(x), free(b), free(x0), free(db);
}

/* gemm_bias and gemm_bgrad (a linear layer's forward and weight gradient with its bias): against
 * the double references, and bit for bit what gemm then add_bias / bias_grad give (the model's
 * calls before the ops existed), in fp32 and bf16 mode (where the bias gradient still sums the
 * fp32 values of A, not their rounded copies). */
static void test_gemm_epilogues(void **state) {
    device *d = *state;
    const int M = 7, N = 13, K = 37;
    for (int t = 0; t < 4; t++) {
        bool ta = t & 1, tb = t & 2;
        int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 2, ldc = t == 3 ? N : N + 5;
        seed(60 + t);
        float *A = frandom((int64_t)(ta ? K : M) * lda, 1.0f);
        float *B = frandom((int64_t)(tb ? N : K) * ldb, 1.0f);
        float *bias = frandom(N, 1.0f);
        float *C = frandom((int64_t)M * ldc, 1.0f), *C2 = fdup(C, (int64_t)M * ldc);
        double *want = to_double(C, (int64_t)M * ldc);
        const float alpha = 0.7f, beta = 0.3f;
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double s = 0;
                for (int k = 0; k < K; k++)
                    s += (double)(ta ? A[k * lda + i] : A[i * lda + k]) *
                         (tb ? B[j * ldb + k] : B[k * ldb + j]);
                want[i * ldc + j] = alpha * s + beta * want[i * ldc + j] + bias[j];
            }
        d->ops->gemm_bias(d, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias);
        expect_close("gemm_bias", C, want, (int64_t)M * ldc, RTOL, ATOL); /* padding included */
        d->ops->gemm(d, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C2, ldc);
        for (int i = 0; i < M; i++) d->ops->add_bias(d, C2 + (int64_t)i * ldc, bias, 1, N);
        expect_same_bits("gemm_bias vs gemm + add_bias", C, C2, (size_t)M * ldc * sizeof(float));
        free(A), free(B), free(bias), free(C), free(C2), free(want);
    }
    for (int mode = 0; mode < 2; mode++)
        for (int tb = 0; tb < 2; tb++) {
            /* dW[M, N] += alpha dy^T x: A = dy [K, M], B = x [K, N] (or [N, K] when tb); db
             * takes the sums unscaled (alpha 0.5 with tb) */
            const int ldb = (tb ? K : N) + 1, ldc = N + 2;
            const float alpha = tb ? 0.5f : 1.0f;
            seed(70 + 2 * mode + tb);
            float *A = frandom((int64_t)K * M, 1.0f), *B = frandom((int64_t)(tb ? N : K) * ldb, 1.0f);
            float *C = frandom((int64_t)M * ldc, 1.0f), *C2 = fdup(C, (int64_t)M * ldc);
            float *db = ffill(M, 0.5f), *db2 = ffill(M, 0.5f); /* both accumulate */
            double *want = to_double(C, (int64_t)M * ldc), wdb[7];
            for (int i = 0; i < M; i++) {
                wdb[i] = 0.5;
                for (int k = 0; k < K; k++) wdb[i] += A[k * M + i];
                for (int j = 0; j < N; j++) {
                    double s = 0;
                    for (int k = 0; k < K; k++) s += (double)A[k * M + i] * (tb ? B[j * ldb + k] : B[k * ldb + j]);
                    want[i * ldc + j] += alpha * s;
                }
            }
            d->matmul = mode ? DEV_MATMUL_BF16 : DEV_MATMUL_FP32;
            d->ops->gemm_bgrad(d, tb, M, N, K, alpha, A, M, B, ldb, 1.0f, C, ldc, db);
            if (!mode) expect_close("gemm_bgrad dW", C, want, (int64_t)M * ldc, RTOL, ATOL);
            expect_close("gemm_bgrad db", db, wdb, M, RTOL, ATOL); /* fp32 sums in both modes */
            d->ops->gemm(d, true, tb, M, N, K, alpha, A, M, B, ldb, 1.0f, C2, ldc);
            d->ops->bias_grad(d, db2, A, K, M);
            d->matmul = DEV_MATMUL_FP32;
            expect_same_bits("gemm_bgrad dW vs gemm", C, C2, (size_t)M * ldc * sizeof(float));
            expect_same_bits("gemm_bgrad db vs bias_grad", db, db2, (size_t)M * sizeof(float));
            free(A), free(B), free(C), free(C2), free(db), free(db2), free(want);
        }
}

/* ---------------------------------------------------------------------------------------------
 * embeddings */

static void test_embed(void **state) {
    device *d = *state;
    const int V = 11, C = 45, N = 50;
    seed(30);
    float *table = frandom((int64_t)V * C, 1.0f), *out = ffill((int64_t)N * C, 3.0f);
    int32_t ids[50];
    for (int n = 0; n < N; n++) ids[n] = (n * 7 + n / 3) % V; /* repeats */
    d->ops->embed_fwd(d, out, table, ids, N, C);
    for (int n = 0; n < N; n++) assert_memory_equal(out + n * C, table + ids[n] * C, C * sizeof(float));

    float *dout = frandom((int64_t)N * C, 1.0f), *dtable = ffill((int64_t)V * C, -1.0f);
    double *want = dzeros((int64_t)V * C);
    for (int i = 0; i < V * C; i++) want[i] = -1.0;
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) want[ids[n] * C + c] += dout[n * C + c];
    d->ops->embed_bwd(d, dtable, dout, ids, N, C);
    expect_close("embed_bwd", dtable, want, (int64_t)V * C, RTOL, ATOL);
    free(table), free(out), free(dout), free(dtable), free(want);
}

/* ---------------------------------------------------------------------------------------------
 * normalisations: double references; L = sum(out * G) for the finite differences */

typedef struct norm_ctx {
    bool rms;
    int N, C;
    double eps;
    double *x, *w, *b, *G; /* b unused by rmsnorm */
} norm_ctx;

static void ref_norm_fwd(const norm_ctx *k, double *out, double *mean, double *rstd) {
    for (int n = 0; n < k->N; n++) {
        const double *x = k->x + (int64_t)n * k->C;
        double m = 0, v = 0;
        if (!k->rms) {
            for (int c = 0; c < k->C; c++) m += x[c];
            m /= k->C;
        }
        for (int c = 0; c < k->C; c++) v += (x[c] - m) * (x[c] - m);
        double s = 1.0 / sqrt(v / k->C + k->eps);
        for (int c = 0; c < k->C; c++)
            out[(int64_t)n * k->C + c] = (x[c] - m) * s * k->w[c] + (k->rms ? 0.0 : k->b[c]);
        if (mean) mean[n] = m;
        rstd[n] = s;
    }
}

static double norm_loss(void *ctx) {
    norm_ctx *k = ctx;
    int64_t n = (int64_t)k->N * k->C;
    double *out = malloc(n * sizeof(double)), *rstd = malloc(k->N * sizeof(double));
    ref_norm_fwd(k, out, NULL, rstd);
    double L = dot_d(out, k->G, n);
    free(out), free(rstd);
    return L;
}

/* dx, dw, db (overwritten here) of L = sum(out * G). */
static void ref_norm_bwd(const norm_ctx *k, double *dx, double *dw, double *db) {
    int C = k->C;
    double *out = malloc((size_t)k->N * C * sizeof(double));
    double *mean = malloc(k->N * sizeof(double)), *rstd = malloc(k->N * sizeof(double));
    ref_norm_fwd(k, out, mean, rstd);
    memset(dw, 0, C * sizeof(double));
    if (db) memset(db, 0, C * sizeof(double));
    for (int n = 0; n < k->N; n++) {
        const double *x = k->x + (int64_t)n * C, *g = k->G + (int64_t)n * C;
        double m = k->rms ? 0.0 : mean[n], s = rstd[n], dn_mean = 0, dnx_mean = 0;
        for (int c = 0; c < C; c++) {
            double xhat = (x[c] - m) * s;
            dn_mean += g[c] * k->w[c] / C;
            dnx_mean += g[c] * k->w[c] * xhat / C;
            dw[c] += g[c] * xhat;
            if (db) db[c] += g[c];
        }
        for (int c = 0; c < C; c++) {
            double xhat = (x[c] - m) * s;
            dx[(int64_t)n * C + c] = (g[c] * k->w[c] - (k->rms ? 0.0 : dn_mean) - xhat * dnx_mean) * s;
        }
    }
    free(out), free(mean), free(rstd);
}

static void check_norm(device *d, bool rms) {
    const int N = 7, C = 45;
    const int64_t NC = (int64_t)N * C;
    const float eps = 1e-5f;
    seed(rms ? 41 : 40);
    float *x = frandom(NC, 2.0f), *w = frandom(C, 1.0f), *b = frandom(C, 1.0f);
    for (int i = 0; i < NC; i++) x[i] += 0.5f; /* a nonzero mean */
    float *G = frandom(NC, 1.0f);
    norm_ctx k = {rms, N, C, eps, to_double(x, NC), to_double(w, C), to_double(b, C), to_double(G, NC)};

    /* forward */
    double *out_ref = dzeros(NC), *mean_ref = dzeros(N), *rstd_ref = dzeros(N);
    ref_norm_fwd(&k, out_ref, mean_ref, rstd_ref);
    float *out = ffill(NC, 7.0f), *mean = ffill(N, 7.0f), *rstd = ffill(N, 7.0f);
    if (rms) d->ops->rmsnorm_fwd(d, out, rstd, x, w, N, C, eps);
    else d->ops->layernorm_fwd(d, out, mean, rstd, x, w, b, N, C, eps);
    expect_close("norm out", out, out_ref, NC, RTOL, ATOL);
    expect_close("norm rstd", rstd, rstd_ref, N, RTOL, 0);
    if (!rms) expect_close("norm mean", mean, mean_ref, N, RTOL, ATOL);

    /* backward: the reference against finite differences, then the device against it */
    double *dx_ref = dzeros(NC), *dw_ref = dzeros(C), *db_ref = dzeros(C);
    ref_norm_bwd(&k, dx_ref, dw_ref, rms ? NULL : db_ref);
    expect_fd("norm ref dx", norm_loss, &k, k.x, dx_ref, NC, 0);
    expect_fd("norm ref dw", norm_loss, &k, k.w, dw_ref, C, 0);
    if (!rms) expect_fd("norm ref db", norm_loss, &k, k.b, db_ref, C, 0);

    /* dx, dw, db accumulate: pre-filled, the reference gets the same offsets */
    float *dx = ffill(NC, 0.5f), *dw = ffill(C, -0.25f), *db = ffill(C, 2.0f);
    for (int64_t i = 0; i < NC; i++) dx_ref[i] += 0.5;
    for (int c = 0; c < C; c++) dw_ref[c] += -0.25, db_ref[c] += 2.0;
    if (rms) d->ops->rmsnorm_bwd(d, dx, dw, G, x, rstd, w, N, C);
    else d->ops->layernorm_bwd(d, dx, dw, db, G, x, mean, rstd, w, N, C);
    expect_close("norm dx", dx, dx_ref, NC, RTOL, ATOL);
    expect_close("norm dw", dw, dw_ref, C, RTOL, ATOL);
    if (!rms) expect_close("norm db", db, db_ref, C, RTOL, ATOL);
    else expect_all("rmsnorm db untouched", db, C, 2.0f);

    free(x), free(w), free(b), free(G), free(k.x), free(k.w), free(k.b), free(k.G);
    free(out_ref), free(mean_ref), free(rstd_ref), free(out), free(mean), free(rstd);
    free(dx_ref), free(dw_ref), free(db_ref), free(dx), free(dw), free(db);
}

static void test_layernorm(void **state) { check_norm(*state, false); }
static void test_rmsnorm(void **state) { check_norm(*state, true); }

/* ---------------------------------------------------------------------------------------------
 * activations */

typedef struct act_ctx {
    int kind; /* 0 gelu tanh, 1 gelu erf, 2 swiglu */
    int64_t n;
    double *x, *u, *G; /* u: swiglu's up projection */
} act_ctx;

static double ref_act(int kind, double x, double u) {
    if (kind == 0) return 0.5 * x * (1 + tanh(sqrt(2 / PI) * (x + 0.044715 * x * x * x)));
    if (kind == 1) return 0.5 * x * (1 + erf(x / sqrt(2.0)));
    return x / (1 + exp(-x)) * u;
}

/* d out / d x (and d out / d u for swiglu) */
static double ref_act_grad(int kind, double x, double u, double *du) {
    if (kind == 0) {
        double k = sqrt(2 / PI), t = tanh(k * (x + 0.044715 * x * x * x));
        return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
    }
    if (kind == 1) return 0.5 * (1 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) / sqrt(2 * PI);
    double sig = 1 / (1 + exp(-x));
    *du = x * sig;
    return u * sig * (1 + x * (1 - sig));
}

static double act_loss(void *ctx) {
    act_ctx *k = ctx;
    double L = 0;
    for (int64_t i = 0; i < k->n; i++) L += ref_act(k->kind, k->x[i], k->u[i]) * k->G[i];
    return L;
}

static void check_activation(device *d, int kind) {
    const int64_t sizes[] = {1001, 70001}; /* one thread; the parallel path */
    for (int s = 0; s < 2; s++) {
        int64_t n = sizes[s];
        seed(50 + kind * 2 + s);
        float *x = frandom(n, 7.0f), *u = frandom(n, 2.0f), *G = frandom(n, 1.0f);
        act_ctx k = {kind, n, to_double(x, n), to_double(u, n), to_double(G, n)};
        double *out_ref = dzeros(n), *dx_ref = dzeros(n), *du_ref = dzeros(n);
        for (int64_t i = 0; i < n; i++) {
            double du = 0;
            out_ref[i] = ref_act(kind, k.x[i], k.u[i]);
            dx_ref[i] = k.G[i] * ref_act_grad(kind, k.x[i], k.u[i], &du);
            du_ref[i] = k.G[i] * du;
        }
        if (s == 0) {
            expect_fd("act ref dx", act_loss, &k, k.x, dx_ref, n, 0);
            if (kind == 2) expect_fd("act ref du", act_loss, &k, k.u, du_ref, n, 0);
        }
        float *out = ffill(n, 7.0f), *dx = ffill(n, 7.0f), *du = ffill(n, 7.0f);
        if (kind == 2) {
            d->ops->swiglu_fwd(d, out, x, u, n);
            d->ops->swiglu_bwd(d, dx, du, G, x, u, n);
            expect_close("swiglu du", du, du_ref, n, RTOL, ATOL);
        } else {
            d->ops->gelu_fwd(d, out, x, n, kind == 0);
            d->ops->gelu_bwd(d, dx, x, G, n, kind == 0);
        }
        expect_close("activation out", out, out_ref, n, RTOL, ATOL);
        expect_close("activation dx", dx, dx_ref, n, RTOL, ATOL);
        free(x), free(u), free(G), free(k.x), free(k.u), free(k.G);
        free(out_ref), free(dx_ref), free(du_ref), free(out), free(dx), free(du);
    }
}

static void test_gelu_tanh(void **state) { check_activation(*state, 0); }
static void test_gelu_erf(void **state) { check_activation(*state, 1); }
static void test_swiglu(void **state) { check_activation(*state, 2); }

/* ---------------------------------------------------------------------------------------------
 * rope */

/* inv_freq as PyTorch / Hugging Face compute it in fp32, then divided by `scale` (a linear
 * rope_scaling; model_rope_inv_freq makes the models' tables, test_model checks it). */
static void torch_inv_freq(int hd, float theta, float scale, float *inv_freq) {
    for (int i = 0; i < hd / 2; i++)
        inv_freq[i] = 1.0f / (float)pow((double)theta, (double)((float)(2 * i) / (float)hd)) / scale;
}

/* exact: t * theta^(-2i/hd) / scale in double; else the fp32 angle float(t) * inv_freq[i] */
static void ref_rope(double *x, int ldx, int rows, int T, int H, int hd, const float *inv_freq,
                     float theta, float scale, bool exact) {
    int half = hd / 2;
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < half; i++) {
                int t = r % T;
                double a = exact ? t * pow((double)theta, -2.0 * i / hd) / scale : (double)((float)t * inv_freq[i]);
                double *x1 = x + (int64_t)r * ldx + h * hd + i, *x2 = x1 + half;
                double p = *x1, q = *x2;
                *x1 = p * cos(a) - q * sin(a);
                *x2 = q * cos(a) + p * sin(a);
            }
}

static void test_rope(void **state) {
    device *d = *state;
    /* the device caches its cos/sin table: each call must notice a new T, hd or inv_freq (theta,
     * or a scaling of the same theta) */
    const struct { int T, hd; float theta, scale; } calls[] = {{5, 8, 10000.0f, 1}, {37, 8, 10000.0f, 1},
                                                               {37, 12, 10000.0f, 1}, {37, 12, 500000.0f, 1},
                                                               {37, 12, 500000.0f, 4}};
    for (int s = 0; s < 5; s++) {
        int B = 2, T = calls[s].T, H = 3, hd = calls[s].hd, ldx = H * hd + 5, rows = B * T;
        int64_t n = (int64_t)rows * ldx;
        float theta = calls[s].theta, scale = calls[s].scale, inv_freq[6];
        torch_inv_freq(hd, theta, scale, inv_freq);
        seed(60 + s);
        float *x = frandom(n, 1.0f);
        for (int r = 0; r < rows; r++)
            for (int c = H * hd; c < ldx; c++) x[r * ldx + c] = 9.0f; /* not part of the heads */
        double *want = to_double(x, n), *want_exact = to_double(x, n);
        ref_rope(want, ldx, rows, T, H, hd, inv_freq, theta, scale, false);
        ref_rope(want_exact, ldx, rows, T, H, hd, inv_freq, theta, scale, true);
        float *y = fdup(x, n);
        d->ops->rope(d, y, ldx, rows, T, H, hd, inv_freq, false);
        expect_close("rope", y, want, n, 1e-6, 1e-6);
        /* the fp32 angle is the header's t * inv_freq up to its rounding (<= 2e-6 here) */
        expect_close("rope vs exact angles", y, want_exact, n, 0, 4e-6);
        for (int r = 0; r < rows; r++)
            expect_all("rope padding", y + r * ldx + H * hd, ldx - H * hd, 9.0f);
        d->ops->rope(d, y, ldx, rows, T, H, hd, inv_freq, true); /* the inverse undoes it */
        double *xd = to_double(x, n);
        expect_close("rope inverse", y, xd, n, 1e-6, 1e-6);
        free(x), free(y), free(want), free(want_exact), free(xd);
    }
}

/* ---------------------------------------------------------------------------------------------
 * attention: q, k, v side by side in one fused buffer [B*T, ld], ld = (H + 2 Hkv) hd + 3 */

typedef struct att_case {
    int B, T, H, Hkv, hd;
    bool causal;
} att_case;

typedef struct att_ctx {
    const att_case *c;
    int ld;
    double *qkv, *G; /* G = dout, for L = sum(out * G) */
} att_ctx;

static int att_ld(const att_case *c) { return (c->H + 2 * c->Hkv) * c->hd + 3; }

/* out [B*T, H*hd], lse [B, H, T]; with dout, dqkv (same layout as qkv) gets the gradients. */
static void ref_attention(const att_case *c, const double *qkv, int ld, const double *dout,
                          double *out, double *lse, double *dqkv) {
    int T = c->T, hd = c->hd, g = c->H / c->Hkv, ldo = c->H * hd;
    double scale = 1 / sqrt((double)hd);
    double *P = malloc((size_t)T * T * sizeof(double)), *dP = malloc((size_t)T * T * sizeof(double));
    if (dqkv) memset(dqkv, 0, (size_t)c->B * T * ld * sizeof(double));
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < c->H; h++) {
            int qo = h * hd, ko = c->H * hd + (h / g) * hd, vo = (c->H + c->Hkv) * hd + (h / g) * hd;
            const double *base = qkv + (int64_t)b * T * ld;
            for (int i = 0; i < T; i++) {
                int nv = c->causal ? i + 1 : T;
                double m = -INFINITY, sum = 0;
                for (int j = 0; j < nv; j++) {
                    double s = 0;
                    for (int e = 0; e < hd; e++) s += base[i * ld + qo + e] * base[j * ld + ko + e];
                    P[i * T + j] = s * scale;
                    m = fmax(m, P[i * T + j]);
                }
                for (int j = 0; j < nv; j++) sum += exp(P[i * T + j] - m);
                for (int j = 0; j < T; j++) P[i * T + j] = j < nv ? exp(P[i * T + j] - m) / sum : 0;
                if (lse) lse[((int64_t)b * c->H + h) * T + i] = m + log(sum);
                for (int e = 0; e < hd; e++) {
                    double o = 0;
                    for (int j = 0; j < nv; j++) o += P[i * T + j] * base[j * ld + vo + e];
                    out[((int64_t)b * T + i) * ldo + qo + e] = o;
                }
            }
            if (!dout) continue;
            const double *dO = dout + (int64_t)b * T * ldo;
            double *dbase = dqkv + (int64_t)b * T * ld;
            for (int i = 0; i < T; i++) {
                double Di = 0;
                for (int j = 0; j < T; j++) {
                    double s = 0;
                    for (int e = 0; e < hd; e++) s += dO[i * ldo + qo + e] * base[j * ld + vo + e];
                    dP[i * T + j] = s;
                    Di += P[i * T + j] * s;
                }
                for (int j = 0; j < T; j++) {
                    double ds = P[i * T + j] * (dP[i * T + j] - Di);
                    for (int e = 0; e < hd; e++) {
                        dbase[i * ld + qo + e] += scale * ds * base[j * ld + ko + e];
                        dbase[j * ld + ko + e] += scale * ds * base[i * ld + qo + e];
                        dbase[j * ld + vo + e] += P[i * T + j] * dO[i * ldo + qo + e];
                    }
                }
            }
        }
    free(P), free(dP);
}

static double att_loss(void *ctx) {
    att_ctx *k = ctx;
    int64_t n = (int64_t)k->c->B * k->c->T * k->c->H * k->c->hd;
    double *out = malloc(n * sizeof(double));
    ref_attention(k->c, k->qkv, k->ld, NULL, out, NULL, NULL);
    double L = dot_d(out, k->G, n);
    free(out);
    return L;
}

static void check_attention(device *d, const att_case *c, bool fd) {
    int ld = att_ld(c), ldo = c->H * c->hd;
    int64_t rows = (int64_t)c->B * c->T, nqkv = rows * ld, nout = rows * ldo;
    int64_t nlse = (int64_t)c->B * c->H * c->T;
    float *qkv = frandom(nqkv, 1.5f), *G = frandom(nout, 1.0f);
    const float *q = qkv, *k = qkv + c->H * c->hd, *v = qkv + (c->H + c->Hkv) * c->hd;
    att_ctx ctx = {c, ld, to_double(qkv, nqkv), to_double(G, nout)};

    double *out_ref = dzeros(nout), *lse_ref = dzeros(nlse), *dqkv_ref = dzeros(nqkv);
    ref_attention(c, ctx.qkv, ld, ctx.G, out_ref, lse_ref, dqkv_ref);
    if (fd) expect_fd("attention ref dqkv", att_loss, &ctx, ctx.qkv, dqkv_ref, nqkv, 300);

    float *out = ffill(nout, 7.0f), *lse = ffill(nlse, 7.0f);
    d->ops->attention_fwd(d, out, lse, q, ld, k, ld, v, ld, c->B, c->T, c->H, c->Hkv, c->hd, c->causal);
    expect_close("attention out", out, out_ref, nout, RTOL, ATOL);
    expect_close("attention lse", lse, lse_ref, nlse, RTOL, ATOL);

    /* dq, dk, dv are overwritten in the head columns of the fused layout, nothing else */
    float *dqkv = ffill(nqkv, 7.0f);
    float *dq = dqkv, *dk = dqkv + c->H * c->hd, *dv = dqkv + (c->H + c->Hkv) * c->hd;
    d->ops->attention_bwd(d, dq, dk, dv, G, out, lse, q, ld, k, ld, v, ld, c->B, c->T, c->H, c->Hkv,
                          c->hd, c->causal);
    int heads_w = (c->H + 2 * c->Hkv) * c->hd;
    double floor_abs = ATOL * max_abs(dqkv_ref, nqkv);
    for (int64_t r = 0; r < rows; r++) {
        expect_near("dqkv", dqkv + r * ld, dqkv_ref + r * ld, heads_w, RTOL, floor_abs);
        expect_all("dqkv padding", dqkv + r * ld + heads_w, ld - heads_w, 7.0f);
    }
    free(qkv), free(G), free(ctx.qkv), free(ctx.G), free(out_ref), free(lse_ref), free(dqkv_ref);
    free(out), free(lse), free(dqkv);
}

static void test_attention(void **state) {
    device *d = *state;
    const att_case cases[] = {
        {2, 37, 4, 2, 8, true},    /* grouped-query, one tile */
        {2, 37, 4, 2, 8, false},
        {1, 130, 2, 1, 16, true},  /* three query tiles, the last one partial */
        {1, 130, 2, 1, 16, false},
        {2, 70, 3, 3, 8, true},    /* multi-head (H = Hkv), crosses a tile boundary */
        {1, 64, 4, 1, 4, true},    /* exactly one full tile, four heads on one kv head */
        {3, 1, 2, 2, 8, false},    /* one token */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        seed(70 + i);
        check_attention(d, &cases[i], i < 2 || i == 3);
    }
}

/* ---------------------------------------------------------------------------------------------
 * cross-entropy */

typedef struct xent_ctx {
    int N, V;
    double scale;
    double *logits;
    const int32_t *tg;
} xent_ctx;

/* scale * sum of losses; per-row losses and the gradient when asked */
static double ref_xent(const xent_ctx *k, double *losses, double *grad) {
    double total = 0;
    for (int n = 0; n < k->N; n++) {
        const double *x = k->logits + (int64_t)n * k->V;
        if (k->tg[n] < 0) {
            if (losses) losses[n] = 0;
            if (grad) memset(grad + (int64_t)n * k->V, 0, k->V * sizeof(double));
            continue;
        }
        double m = -INFINITY, sum = 0;
        for (int j = 0; j < k->V; j++) m = fmax(m, x[j]);
        for (int j = 0; j < k->V; j++) sum += exp(x[j] - m);
        double loss = m + log(sum) - x[k->tg[n]];
        if (losses) losses[n] = loss;
        total += loss;
        if (grad)
            for (int j = 0; j < k->V; j++)
                grad[(int64_t)n * k->V + j] = k->scale * (exp(x[j] - m) / sum - (j == k->tg[n]));
    }
    return k->scale * total;
}

static double xent_loss(void *ctx) { return ref_xent(ctx, NULL, NULL); }

static void check_xent(device *d, int N, int V, float mag, const int32_t *tg, float scale, bool fd) {
    int64_t n = (int64_t)N * V;
    float *logits = frandom(n, mag), *losses = ffill(N, 7.0f);
    xent_ctx k = {N, V, scale, to_double(logits, n), tg};
    double *loss_ref = dzeros(N), *grad_ref = dzeros(n);
    double total_ref = ref_xent(&k, loss_ref, grad_ref);
    if (fd) expect_fd("xent ref grad", xent_loss, &k, k.logits, grad_ref, n, 0);
    /* the loss adds to what the sum held */
    double acc = 0.375, total_alone = 0;
    float *again = fdup(logits, n), *l2 = ffill(N, 0);
    d->ops->xent_fwd_bwd(d, logits, V, losses, tg, N, V, scale, &acc);
    double total = acc - 0.375;
    if (!(fabs(total - total_ref) <= 1e-6 * fabs(total_ref)))
        fail_msg("xent sum %.12g, want %.12g", total, total_ref);
    /* the same rows again from 0 give scale * their sum exactly once */
    d->ops->xent_fwd_bwd(d, again, V, l2, tg, N, V, scale, &total_alone);
    if (0.375 + total_alone != acc) fail_msg("xent: += gives %.17g, 0.375 + alone %.17g", acc, 0.375 + total_alone);
    free(again), free(l2);
    expect_close("xent losses", losses, loss_ref, N, RTOL, ATOL);
    expect_close("xent grad", logits, grad_ref, n, RTOL, ATOL);
    for (int i = 0; i < N; i++)
        if (tg[i] < 0) expect_all("xent untargeted row", logits + (int64_t)i * V, V, 0.0f);
    free(logits), free(losses), free(k.logits), free(loss_ref), free(grad_ref);
}

/* Rows with a stride ld > V (a padded vocabulary, planner/engine_mem.h) give the contiguous
 * rows' gradients, losses and sum bit for bit, and the padding columns are left as they were. */
static void check_xent_padded(device *d, int N, int V, int ld, const int32_t *tg) {
    float *flat = frandom((int64_t)N * V, 4.0f), *pad = ffill((int64_t)N * ld, -7.5f);
    for (int r = 0; r < N; r++) memcpy(pad + (int64_t)r * ld, flat + (int64_t)r * V, (size_t)V * 4);
    float *l1 = ffill(N, 0), *l2 = ffill(N, 0);
    double s1 = 0, s2 = 0;
    d->ops->xent_fwd_bwd(d, flat, V, l1, tg, N, V, 0.5f, &s1);
    d->ops->xent_fwd_bwd(d, pad, ld, l2, tg, N, V, 0.5f, &s2);
    assert_true(s1 == s2 && s1 != 0);
    assert_memory_equal(l1, l2, (size_t)N * 4);
    for (int r = 0; r < N; r++) {
        assert_memory_equal(pad + (int64_t)r * ld, flat + (int64_t)r * V, (size_t)V * 4);
        expect_all("xent padding columns untouched", pad + (int64_t)r * ld + V, ld - V, -7.5f);
    }
    free(flat), free(pad), free(l1), free(l2);
}

static void test_xent(void **state) {
    device *d = *state;
    seed(80);
    const int32_t tg7[7] = {3, 0, 12, -1, 5, 5, 11};
    check_xent(d, 7, 13, 3.0f, tg7, 1.0f / 6.0f, true);
    /* large logits (stability: exp would overflow without the max) and a long row */
    const int32_t tg3[3] = {999, 0, 517};
    check_xent(d, 3, 1000, 60.0f, tg3, 1.0f, false);
    /* enough rows for the parallel path */
    int32_t tg64[64];
    for (int i = 0; i < 64; i++) tg64[i] = i % 9 == 4 ? -1 : (i * 37) % 1001;
    check_xent(d, 64, 1001, 4.0f, tg64, 0.5f, false);
    check_xent_padded(d, 64, 1001, 1024, tg64);
}

/* ---------------------------------------------------------------------------------------------
 * images */

static void test_patchify(void **state) {
    device *d = *state;
    const int B = 2, C = 3, S = 12, p = 4, np = S / p, cols = C * p * p;
    seed(90);
    float *img = frandom((int64_t)B * C * S * S, 1.0f), *out = ffill((int64_t)B * np * np * cols, 7.0f);
    d->ops->patchify(d, out, img, B, C, S, p);
    for (int b = 0; b < B; b++)
        for (int py = 0; py < np; py++)
            for (int px = 0; px < np; px++)
                for (int c = 0; c < C; c++)
                    for (int y = 0; y < p; y++)
                        for (int x = 0; x < p; x++) {
                            int row = b * np * np + py * np + px, col = (c * p + y) * p + x;
                            float want = img[((b * C + c) * S + py * p + y) * S + px * p + x];
                            assert_true(out[row * cols + col] == want);
                        }
    free(img), free(out);
}

/* ---------------------------------------------------------------------------------------------
 * optimizer: five steps against the header's formula in double */

static void test_adamw(void **state) {
    device *d = *state;
    const int64_t n = 1001;
    /* the settings in double, as a job gives them: beta2 0.999 is not a float, and 1 - beta2 from
     * the float-rounded one would be 1.3e-5 off (the reference takes 1 - beta in double) */
    const double lr = 1e-2, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.1;
    const float gscale = 0.5f;
    seed(100);
    float *p = frandom(n, 1.0f), *m = ffill(n, 0.0f), *v = ffill(n, 0.0f);
    double *pr = to_double(p, n), *mr = dzeros(n), *vr = dzeros(n);
    for (int t = 1; t <= 5; t++) {
        float *g = frandom(n, 1.0f);
        double bc1 = 1 - pow(b1, t), bc2 = 1 - pow(b2, t);
        dev_adamw step = dev_adamw_step(lr, b1, b2, eps, wd, t, gscale);
        d->ops->adamw(d, p, g, m, v, n, &step);
        for (int64_t i = 0; i < n; i++) {
            double ge = (double)g[i] * gscale;
            mr[i] = (double)(float)b1 * mr[i] + (1 - b1) * ge;
            vr[i] = (double)(float)b2 * vr[i] + (1 - b2) * ge * ge;
            pr[i] *= 1 - lr * wd;
            pr[i] -= lr * ((mr[i] / bc1) / (sqrt(vr[i] / bc2) + eps));
        }
        free(g);
    }
    expect_close("adamw p", p, pr, n, 1e-6, 1e-6);
    expect_close("adamw m", m, mr, n, 1e-6, 1e-6);
    expect_close("adamw v", v, vr, n, 1e-6, 1e-6);
    free(p), free(m), free(v), free(pr), free(mr), free(vr);
}

/* adamw_multi is adamw segment by segment, bit for bit, and its 16-bit copy is the updated
 * parameters rounded by to_bf16 / to_fp16: segments with both step scalars, elements between
 * segments untouched, a list longer than one CUDA launch's, big segments on the threaded path. */
static void test_adamw_multi(void **state) {
    device *d = *state;
    enum { NSEG = ADAMW_MULTI_MAX + 5 };
    dev_adamw_seg seg[NSEG];
    int64_t n = 0;
    for (int k = 0; k < NSEG; k++) { /* a gap of k % 3 elements before each segment */
        int64_t len = k % 4 == 0 ? 70001 + k : 3 + 17 * k;
        n += k % 3;
        seg[k] = (dev_adamw_seg){.off = n, .n = len, .which = k % 2};
        n += len;
    }
    const dev_adamw steps[2] = {dev_adamw_step(1e-2, 0.9, 0.999, 1e-8, 0.1, 3, 0.5f),
                                dev_adamw_step(1e-2, 0.9, 0.999, 1e-8, 0.0, 3, 0.5f)};
    assert_true(memcmp(&steps[0], &steps[1], sizeof steps[0]) != 0);
    for (int h = 0; h < 3; h++) { /* no copy, bf16, fp16 */
        precision hp = h == 2 ? PREC_FP16 : PREC_BF16;
        seed(200 + h);
        float *p = frandom(n, 1.0f), *g = frandom(n, 1.0f), *m = frandom(n, 0.1f), *v = frandom(n, 1e-3f);
        for (int64_t i = 0; i < n; i++) v[i] = fabsf(v[i]);
        float *pr = fdup(p, n), *mr = fdup(m, n), *vr = fdup(v, n), *p0 = fdup(p, n);
        uint16_t *half = malloc((size_t)n * 2), *hr = malloc((size_t)n * 2);
        memset(half, 0xab, (size_t)n * 2), memset(hr, 0xab, (size_t)n * 2);
        d->ops->adamw_multi(d, p, g, m, v, h ? half : NULL, hp, NSEG, seg, steps);
        for (int k = 0; k < NSEG; k++) {
            int64_t o = seg[k].off;
            d->ops->adamw(d, pr + o, g + o, mr + o, vr + o, seg[k].n, &steps[seg[k].which]);
            if (h) dev_to_half(d, hp, hr + o, pr + o, seg[k].n);
        }
        assert_memory_equal(p, pr, (size_t)n * 4);
        assert_memory_equal(m, mr, (size_t)n * 4);
        assert_memory_equal(v, vr, (size_t)n * 4);
        assert_memory_equal(half, hr, (size_t)n * 2); /* gaps keep 0xabab on both */
        /* the copy is of the updated values, not the old ones (lr 1e-2 moves most of them by more
         * than a 16-bit ulp) */
        uint16_t *old = malloc((size_t)n * 2);
        if (h) dev_to_half(d, hp, old, p0, n);
        int64_t moved = 0;
        for (int k = 0; h && k < NSEG; k++)
            for (int64_t i = seg[k].off; i < seg[k].off + seg[k].n; i++) moved += half[i] != old[i];
        if (h && moved < n / 4) fail_msg("%lld of %lld 16-bit values moved", (long long)moved, (long long)n);
        free(old), free(p0);
        free(p), free(g), free(m), free(v), free(pr), free(mr), free(vr), free(half), free(hr);
    }
}

/* ---------------------------------------------------------------------------------------------
 * determinism */

typedef struct det_out {
    float *out, *lse, *dqkv, *xent, *dx, *dw, *db, *dtable, *dbias;
    size_t out_bytes, lse_bytes, dqkv_bytes;
    double sumsq, xent_sum;
} det_out;

/* Runs the ops with reductions on larger shapes; every output is fresh. */
static det_out det_run(device *d) {
    det_out r;
    seed(110);
    att_case c = {2, 200, 4, 2, 32, true};
    int ld = att_ld(&c);
    int64_t rows = (int64_t)c.B * c.T, ldo = c.H * c.hd;
    float *qkv = frandom(rows * ld, 1.0f), *G = frandom(rows * ldo, 1.0f);
    const float *q = qkv, *k = qkv + c.H * c.hd, *v = qkv + (c.H + c.Hkv) * c.hd;
    r.out = ffill(rows * ldo, 0), r.lse = ffill((int64_t)c.B * c.H * c.T, 0);
    r.dqkv = ffill(rows * ld, 0);
    r.out_bytes = rows * ldo * sizeof(float), r.lse_bytes = (size_t)c.B * c.H * c.T * sizeof(float);
    r.dqkv_bytes = rows * ld * sizeof(float);
    d->ops->attention_fwd(d, r.out, r.lse, q, ld, k, ld, v, ld, c.B, c.T, c.H, c.Hkv, c.hd, c.causal);
    d->ops->attention_bwd(d, r.dqkv, r.dqkv + c.H * c.hd, r.dqkv + (c.H + c.Hkv) * c.hd, G, r.out,
                          r.lse, q, ld, k, ld, v, ld, c.B, c.T, c.H, c.Hkv, c.hd, c.causal);
    free(qkv), free(G);

    const int N = 512, C = 384, V = 5000, NX = 48;
    float *x = frandom((int64_t)N * C, 1.0f), *w = frandom(C, 1.0f), *b = frandom(C, 1.0f);
    float *dout = frandom((int64_t)N * C, 1.0f), *mean = ffill(N, 0), *rstd = ffill(N, 0);
    float *y = ffill((int64_t)N * C, 0);
    r.dx = ffill((int64_t)N * C, 0), r.dw = ffill(C, 0), r.db = ffill(C, 0);
    d->ops->layernorm_fwd(d, y, mean, rstd, x, w, b, N, C, 1e-5f);
    d->ops->layernorm_bwd(d, r.dx, r.dw, r.db, dout, x, mean, rstd, w, N, C);
    int32_t *ids = malloc(N * sizeof(int32_t)), *tg = malloc(NX * sizeof(int32_t));
    for (int i = 0; i < N; i++) ids[i] = (i * 13) % 50;
    r.dtable = ffill(50 * C, 0), r.dbias = ffill(C, 0);
    d->ops->embed_bwd(d, r.dtable, dout, ids, N, C);
    d->ops->bias_grad(d, r.dbias, dout, N, C);
    r.sumsq = sumsq1(d, dout, (int64_t)N * C);
    r.xent = frandom((int64_t)NX * V, 5.0f);
    for (int i = 0; i < NX; i++) tg[i] = (i * 101) % V;
    float *losses = ffill(NX, 0);
    r.xent_sum = 0;
    d->ops->xent_fwd_bwd(d, r.xent, V, losses, tg, NX, V, 0.25f, &r.xent_sum);
    free(x), free(w), free(b), free(dout), free(mean), free(rstd), free(y);
    free(ids), free(tg), free(losses);
    return r;
}

static void det_free(det_out *r) {
    free(r->out), free(r->lse), free(r->dqkv), free(r->xent), free(r->dx), free(r->dw), free(r->db);
    free(r->dtable), free(r->dbias);
}

static void test_determinism(void **state) {
    device *d = *state;
    det_out a = det_run(d), b = det_run(d);
    expect_same_bits("attention out", a.out, b.out, a.out_bytes);
    expect_same_bits("attention lse", a.lse, b.lse, a.lse_bytes);
    expect_same_bits("attention dqkv", a.dqkv, b.dqkv, a.dqkv_bytes);
    expect_same_bits("layernorm dx", a.dx, b.dx, 512 * 384 * sizeof(float));
    expect_same_bits("layernorm dw", a.dw, b.dw, 384 * sizeof(float));
    expect_same_bits("layernorm db", a.db, b.db, 384 * sizeof(float));
    expect_same_bits("embed_bwd", a.dtable, b.dtable, 50 * 384 * sizeof(float));
    expect_same_bits("bias_grad", a.dbias, b.dbias, 384 * sizeof(float));
    expect_same_bits("xent grad", a.xent, b.xent, 48 * 5000 * sizeof(float));
    assert_true(a.sumsq == b.sumsq);
    assert_true(a.xent_sum == b.xent_sum);

    /* The tiled attention, the column-block and fixed-chunk reductions and the row-parallel
     * kernels do not depend on the thread count at all. */
    device one;
    err_t err;
    assert_int_equal(cpu_device_init(&one, 0, 1, 0, &err), 0);
    det_out s = det_run(&one);
    cpu_device_close(&one);
    expect_same_bits("attention out, 1 vs 2 threads", a.out, s.out, a.out_bytes);
    expect_same_bits("attention dqkv, 1 vs 2 threads", a.dqkv, s.dqkv, a.dqkv_bytes);
    expect_same_bits("layernorm dw, 1 vs 2 threads", a.dw, s.dw, 384 * sizeof(float));
    expect_same_bits("layernorm dx, 1 vs 2 threads", a.dx, s.dx, 512 * 384 * sizeof(float));
    expect_same_bits("embed_bwd, 1 vs 2 threads", a.dtable, s.dtable, 50 * 384 * sizeof(float));
    expect_same_bits("bias_grad, 1 vs 2 threads", a.dbias, s.dbias, 384 * sizeof(float));
    expect_same_bits("xent, 1 vs 2 threads", a.xent, s.xent, 48 * 5000 * sizeof(float));
    assert_true(a.sumsq == s.sumsq);
    assert_true(a.xent_sum == s.xent_sum);
    det_free(&a), det_free(&b), det_free(&s);
    /* the fixture device keeps its 2 threads for OpenBLAS (the last init set them globally) */
    assert_int_equal(cpu_device_init(&one, 0, d->threads, 0, &err), 0);
    cpu_device_close(&one);
}

int main(void) {
#define T(f) cmocka_unit_test_setup_teardown(f, dev_setup, dev_teardown)
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_init_and_allocator),
        cmocka_unit_test(test_oom_names_the_whole_context),
        cmocka_unit_test(test_context_cut_at_a_word),
        cmocka_unit_test(test_exp_fast),
        T(test_elementwise),
        T(test_sumsq_multi),
        T(test_host_syncs),
        T(test_gemm),
        T(test_fp16_bf16),
        T(test_round_half),
        T(test_add_norm),
        T(test_gemm_half),
        T(test_bias),
        T(test_gemm_epilogues),
        T(test_embed),
        T(test_layernorm),
        T(test_rmsnorm),
        T(test_gelu_tanh),
        T(test_gelu_erf),
        T(test_swiglu),
        T(test_rope),
        T(test_attention),
        T(test_xent),
        T(test_patchify),
        T(test_adamw),
        T(test_adamw_multi),
        T(test_determinism),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
