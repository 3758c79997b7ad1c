/* test_cuda_ops.c - every op of the CUDA device (worker/devices/cuda_device.cu and friends) against the
 * CPU device, which tests/unit/test_cpu_ops.c checks against double-precision references. Random inputs at
 * realistic shapes (GPT-2 and TinyLlama widths, V = 50257, T up to 2048) and awkward ones (odd
 * sizes, partial tiles, n not a multiple of any block size, padded leading dimensions).
 *
 * Without a GPU (device_cuda_count() == 0, or a build without CUDA) it prints
 * "0 tests: no GPU ..." and exits 0; tests/gpu/run.sh counts that as skipped.
 * CEPHALO_GPU_TEST_DEVICE=cpu runs the whole file with a second (1-thread) CPU device in the
 * GPU's place: a self-check of this file's references and bookkeeping on a machine without a GPU
 * (tests of CUDA-only behaviour are skipped there). CEPHALO_TEST_GPU=N picks the GPU (default 0).
 *
 * Tolerances. Unless stated otherwise a comparison is "relative to max-abs":
 *     max_i |gpu_i - cpu_i| <= tol * max_i |cpu_i|
 * which judges entries that cancel to ~0 against the precision of their inputs. Each op states
 * its tol and why next to the check; elementwise ops without reductions must agree exactly or to
 * one rounding. Outputs are pre-filled with nonzero values (7, or the accumulate-into values of
 * device.h's += contract) on both devices, and padding outside the written region must survive
 * bit for bit. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/env.h"
#include "devices/device.h"

#define U_FP32 (1.0 / 16777216.0) /* 2^-24: unit roundoff of fp32 (24-bit significand) */
#define U_TF32 (1.0 / 1024.0)     /* 2^-10: TF32 keeps 10 mantissa bits; tensor cores may truncate */
#define U_BF16 (1.0 / 256.0)      /* 2^-8: bf16 keeps 7 mantissa bits, rounded to nearest even */
#define U_FP16 (1.0 / 2048.0)     /* 2^-11: fp16 keeps 10 mantissa bits, rounded to nearest even */

static device ref_d, gpu_d; /* the reference CPU device and the device under test */
#define REF (&ref_d)
#define GPU (&gpu_d)
static bool self_check;     /* GPU is a second CPU device (CEPHALO_GPU_TEST_DEVICE=cpu) */

/* ---------------------------------------------------------------------------------------------
 * bookkeeping: device and host buffers of a test are freed by the teardown (also after a failed
 * check, which longjmps out of the test) */

#define MAX_LIVE 8192
static void *dev_live[MAX_LIVE], *host_live[MAX_LIVE];
static int n_dev_live, n_host_live;

static void *h_alloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) fail_msg("host malloc of %zu bytes failed", bytes);
    if (n_host_live == MAX_LIVE) fail_msg("too many host buffers in one test");
    host_live[n_host_live++] = p;
    return p;
}

static void *g_alloc(size_t bytes) {
    void *p = dev_alloc(GPU, bytes, "test buffer");
    if (!p) fail_msg("dev_alloc(%zu) on the device under test: %s", bytes, GPU->err.msg);
    if (n_dev_live == MAX_LIVE) fail_msg("too many device buffers in one test");
    dev_live[n_dev_live++] = p;
    return p;
}

static void g_release(void *p) {
    for (int i = n_dev_live - 1; i >= 0; i--)
        if (dev_live[i] == p) {
            dev_free(GPU, p);
            dev_live[i] = dev_live[--n_dev_live];
            return;
        }
    fail_msg("g_release of an untracked pointer");
}

static int release_all(void **state) {
    (void)state;
    for (int i = 0; i < n_dev_live; i++) dev_free(GPU, dev_live[i]);
    for (int i = 0; i < n_host_live; i++) free(host_live[i]);
    n_dev_live = n_host_live = 0;
    GPU->matmul = REF->matmul = DEV_MATMUL_FP32;
    dev_set_context(GPU, "%s", "");
    return 0;
}

static uint64_t rng_state = 88172645463325252ULL;
static void seed(uint64_t s) { rng_state = s * 2685821657736338717ULL + 1442695040888963407ULL; }
static uint64_t rnd64(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
/* uniform in [-1, 1) */
static float frand(void) { return (float)((double)(rnd64() >> 40) / (double)(1ULL << 24) * 2.0 - 1.0); }

static float *hrandom(int64_t n, float scale) {
    float *p = h_alloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) p[i] = scale * frand();
    return p;
}
static float *hfill(int64_t n, float v) {
    float *p = h_alloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) p[i] = v;
    return p;
}
static float *hdup(const float *src, int64_t n) {
    float *p = h_alloc((size_t)n * sizeof(float));
    memcpy(p, src, (size_t)n * sizeof(float));
    return p;
}

/* device copies of host data, and host copies of device data (after the device's queue drains) */
static float *g_up(const float *h, int64_t n) {
    float *p = g_alloc((size_t)n * sizeof(float));
    dev_upload(GPU, p, h, (size_t)n * sizeof(float));
    return p;
}
static int32_t *g_up_i(const int32_t *h, int64_t n) {
    int32_t *p = g_alloc((size_t)n * sizeof(int32_t));
    dev_upload(GPU, p, h, (size_t)n * sizeof(int32_t));
    return p;
}
static float *g_fill(int64_t n, float v) { return g_up(hfill(n, v), n); }
static float *g_down(const float *p, int64_t n) {
    GPU->ops->sync(GPU);
    float *h = h_alloc((size_t)n * sizeof(float));
    dev_download(GPU, h, p, (size_t)n * sizeof(float));
    return h;
}

/* ---------------------------------------------------------------------------------------------
 * comparisons */

static double fmax_abs(const float *x, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(x[i])) m = fmax(m, fabs((double)x[i]));
    return m;
}

/* |got - ref| <= rtol |ref| + atol * max|ref| elementwise (NaN fails); rtol = 0 gives the
 * relative-to-max-abs check. Reports the worst element. */
static void expect_close_scaled(const char *what, const float *got, const float *ref, int64_t n,
                                double rtol, double atol, double m) {
    double worst = -1, worst_bound = 0;
    int64_t wi = -1;
    for (int64_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - (double)ref[i]);
        double bound = rtol * fabs((double)ref[i]) + atol * m;
        if (isnan(got[i]) != isnan(ref[i]) || (isinf(ref[i]) && got[i] != ref[i])) err = INFINITY;
        else if (isnan(ref[i]) || isinf(ref[i])) err = 0;
        if (!(err <= bound) && (wi < 0 || err - bound > worst - worst_bound))
            wi = i, worst = err, worst_bound = bound;
    }
    if (wi >= 0)
        fail_msg("%s[%lld of %lld]: got %.9g, want %.9g (error %.3g > bound %.3g; max|ref| %.3g, "
                 "rtol %.2g, atol %.2g x max)",
                 what, (long long)wi, (long long)n, (double)got[wi], (double)ref[wi], worst,
                 worst_bound, m, rtol, atol);
}

static void expect_close(const char *what, const float *got, const float *ref, int64_t n,
                         double rtol, double atol) {
    double m = fmax_abs(ref, n);
    expect_close_scaled(what, got, ref, n, rtol, atol, m == 0 ? 1 : m);
}

static void expect_rel(const char *what, const float *got, const float *ref, int64_t n, double tol) {
    expect_close(what, got, ref, n, 0.0, tol);
}

static void expect_same(const char *what, const void *got, const void *ref, size_t bytes) {
    const unsigned char *a = got, *b = ref;
    for (size_t i = 0; i < bytes; i++)
        if (a[i] != b[i]) {
            size_t e = i / 4;
            float fa, fb;
            memcpy(&fa, a + e * 4, 4);
            memcpy(&fb, b + e * 4, 4);
            fail_msg("%s: differs at float %zu: %.9g vs %.9g (bit for bit expected)", what, e,
                     (double)fa, (double)fb);
        }
}

static void expect_all(const char *what, const float *x, int64_t n, float v) {
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&x[i], &v, sizeof v))
            fail_msg("%s[%lld] = %.9g, want %.9g (must be left untouched)", what, (long long)i,
                     (double)x[i], (double)v);
}

/* ---------------------------------------------------------------------------------------------
 * fixture */

static int setup_devices(void **state) {
    (void)state;
    err_t err = {{0}};
    const char *g = getenv("CEPHALO_TEST_GPU");
    int gpu = g ? atoi(g) : 0;
    if (device_open(REF, "cpu", 0, 0, 0, 0, &err) < 0) {
        fprintf(stderr, "cpu device: %s\n", err.msg);
        return -1;
    }
    if (device_open(GPU, self_check ? "cpu" : "cuda", 0, self_check ? 1 : 0, gpu, 0, &err) < 0) {
        fprintf(stderr, "device under test: %s\n", err.msg);
        return -1;
    }
    REF->matmul = GPU->matmul = DEV_MATMUL_FP32;
    return 0;
}

static int teardown_devices(void **state) {
    (void)state;
    device_close(GPU);
    device_close(REF);
    return 0;
}

/* Reopens the device under test with the CUDA device's switch `name` (CEPHALO_CUDA_ATTN or
 * CEPHALO_CUDA_GEMM, read at init) set to value, or as the run started (value NULL). */
static void reopen_gpu_with(const char *name, const char *value) {
    static struct {
        const char *name;
        char first[16];
        bool was_set;
    } saved[2] = {{"CEPHALO_CUDA_ATTN", "", false}, {"CEPHALO_CUDA_GEMM", "", false}};
    static bool read;
    if (!read) {
        for (int i = 0; i < 2; i++) {
            const char *v = getenv(saved[i].name);
            saved[i].was_set = v != NULL;
            snprintf(saved[i].first, sizeof saved[i].first, "%s", v ? v : "");
        }
        read = true;
    }
    int i = strcmp(name, saved[0].name) ? 1 : 0;
    err_t err = {{0}};
    device_close(GPU);
    if (value || saved[i].was_set)
        setenv(name, value ? value : saved[i].first, 1);
    else
        unsetenv(name);
    const char *g = getenv("CEPHALO_TEST_GPU");
    if (device_open(GPU, "cuda", 0, 0, g ? atoi(g) : 0, 0, &err) < 0)
        fail_msg("reopening the device under test (%s=%s): %s", name, value ? value : "", err.msg);
    GPU->matmul = DEV_MATMUL_FP32;
}

/* Reopens the device under test with CEPHALO_CUDA_ATTN=attn, or as the run started (NULL). */
static void reopen_gpu(const char *attn) { reopen_gpu_with("CEPHALO_CUDA_ATTN", attn); }

/* ---------------------------------------------------------------------------------------------
 * the device itself */

static void test_device(void **state) {
    (void)state;
    assert_non_null(GPU->ops);
    if (self_check) skip();
    assert_string_equal(GPU->ops->name, "cuda");
    /* capacity 0 at open = the GPU's free memory less a reserve: a real number comes back */
    assert_true(GPU->capacity > ((int64_t)1 << 30));
    assert_int_equal(GPU->cur_bytes, 0);
    void *s[DEV_STREAMS];
    for (int i = 0; i < DEV_STREAMS; i++) {
        s[i] = GPU->ops->native_stream(GPU, (dev_stream)i);
        assert_non_null(s[i]);
        for (int j = 0; j < i; j++) assert_ptr_not_equal(s[i], s[j]);
    }
    err_t err = {{0}};
    device bad;
    assert_int_equal(device_open(&bad, "cuda", 0, 0, 4096, 0, &err), -1); /* no GPU 4096 */
    assert_true(strlen(err.msg) > 0);
}

/* ---------------------------------------------------------------------------------------------
 * elementwise, reductions, copies */

static const int64_t EW_SIZES[] = {1, 13, 4097, 1000003}; /* 1000003: no block size divides it */

static void test_elementwise(void **state) {
    (void)state;
    for (size_t s = 0; s < sizeof EW_SIZES / sizeof EW_SIZES[0]; s++) {
        int64_t n = EW_SIZES[s];
        seed(1 + s);
        float *a = hrandom(n, 2.0f), *b = hrandom(n, 2.0f);
        /* fill: n values, the 16 after them untouched */
        float *gx = g_up(hfill(n + 16, 9.0f), n + 16);
        GPU->ops->fill(GPU, gx, 0.25f, n);
        float *hx = g_down(gx, n + 16);
        expect_all("fill", hx, n, 0.25f);
        expect_all("fill tail", hx + n, 16, 9.0f);

        /* add, scale: one correctly rounded operation per element, so exactly the CPU's */
        float *ga = g_up(a, n), *gb = g_up(b, n), *gout = g_fill(n, 7.0f);
        float *out = hfill(n, 7.0f);
        REF->ops->add(REF, out, a, b, n);
        GPU->ops->add(GPU, gout, ga, gb, n);
        expect_same("add", g_down(gout, n), out, (size_t)n * 4);
        GPU->ops->add(GPU, ga, ga, gb, n); /* out may alias an input */
        expect_same("add (out aliases a)", g_down(ga, n), out, (size_t)n * 4);
        float *y = hdup(out, n);
        REF->ops->scale(REF, y, -3.5f, n);
        GPU->ops->scale(GPU, gout, -3.5f, n);
        expect_same("scale", g_down(gout, n), y, (size_t)n * 4);

        /* axpy: y + alpha*x with or without a fused multiply-add differs by at most one rounding
         * of the product: |err| <= 2^-24 (|y| + |alpha x|) + 2^-24 |result| <= 2^-22 max */
        float *y0 = hrandom(n, 1.0f), *yc = hdup(y0, n);
        float *gy = g_up(y0, n);
        REF->ops->axpy(REF, yc, -0.75f, b, n);
        GPU->ops->axpy(GPU, gy, -0.75f, gb, n);
        expect_close("axpy", g_down(gy, n), yc, n, 4 * U_FP32, 4 * U_FP32);
    }
    /* n = 0 is a no-op (no zero-sized launch) */
    float *gz = g_fill(4, 5.0f);
    GPU->ops->fill(GPU, gz, 1.0f, 0);
    GPU->ops->scale(GPU, gz, 2.0f, 0);
    GPU->ops->axpy(GPU, gz, 2.0f, gz, 0);
    GPU->ops->add(GPU, gz, gz, gz, 0);
    expect_all("n = 0 ops", g_down(gz, 4), 4, 5.0f);
}

/* The device's sum of squares of one tensor (sumsq_multi of a list of one), read back. */
static double g_sumsq1(const float *x, int64_t n) {
    double *out = g_alloc(sizeof(double)), h;
    GPU->ops->sumsq_multi(GPU, out, 1, &x, &n);
    dev_download(GPU, &h, out, sizeof h);
    g_release(out);
    return h;
}

/* A device double set to v (the loss sums start from something to show they add). */
static double *g_double(double v) {
    double *p = g_alloc(sizeof(double));
    dev_upload(GPU, p, &v, sizeof v);
    return p;
}
static double g_read_double(const double *p) {
    double h;
    dev_download(GPU, &h, p, sizeof h);
    return h;
}

static void test_sumsq(void **state) {
    (void)state;
    const int64_t sizes[] = {1, 7, 65536, 65537, 3000017};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        int64_t n = sizes[s];
        seed(5 + s);
        float *x = hrandom(n, 3.0f);
        long double want = 0;
        for (int64_t i = 0; i < n; i++) want += (long double)x[i] * x[i];
        double got = g_sumsq1(g_up(x, n), n);
        /* the squares are exact in double (24+24 bits < 53); n positive terms summed in double in
         * any order err by at most (n-1) 2^-53 relative */
        double bound = (double)n * 1.2e-16 * (double)want + 1e-300;
        if (!(fabs(got - (double)want) <= bound))
            fail_msg("sumsq n=%lld: %.17g, want %.17Lg (bound %.3g)", (long long)n, got, want, bound);
    }
    assert_true(g_sumsq1(NULL, 0) == 0.0);
}

/* sumsq_multi over lists of 0, 5 and 2 * SUMSQ_MULTI_MAX + 9 tensors (three launches), some
 * empty, some large: the long double sum within the bound of any order, the CPU device's result
 * within the same bound, and bit for bit the tensors' own sums added in list order (device.h). */
static void test_sumsq_multi(void **state) {
    (void)state;
    const int counts[] = {0, 5, 2 * SUMSQ_MULTI_MAX + 9};
    for (size_t c = 0; c < sizeof counts / sizeof *counts; c++) {
        int k = counts[c];
        seed(40 + c);
        const float **hx = h_alloc(((size_t)k + 1) * sizeof *hx), **gx = h_alloc(((size_t)k + 1) * sizeof *gx);
        int64_t *n = h_alloc(((size_t)k + 1) * sizeof *n), total = 0;
        long double want = 0;
        double inorder = 0;
        for (int i = 0; i < k; i++) {
            n[i] = i % 5 == 2 ? 0 : i == 3 ? 3000017 : (i * 7919) % 70000 + 1;
            float *h = hrandom(n[i] ? n[i] : 1, 2.0f);
            hx[i] = h, gx[i] = g_up(h, n[i] ? n[i] : 1), total += n[i];
            for (int64_t j = 0; j < n[i]; j++) want += (long double)h[j] * h[j];
            inorder += g_sumsq1(gx[i], n[i]);
        }
        double *out = g_double(12345.0); /* overwritten, not added to */
        GPU->ops->sumsq_multi(GPU, out, k, gx, n);
        double got = g_read_double(out), ref = 0;
        REF->ops->sumsq_multi(REF, &ref, k, hx, n);
        double bound = (double)total * 1.2e-16 * (double)want + 1e-300;
        if (!(fabs(got - (double)want) <= bound) || !(fabs(got - ref) <= 2 * bound))
            fail_msg("sumsq_multi of %d: %.17g, want %.17Lg, cpu %.17g (bound %.3g)", k, got, want, ref, bound);
        if (got != inorder) fail_msg("sumsq_multi of %d: %.17g, the tensors' sums in order %.17g", k, got, inorder);
    }
}

/* Host waits (device.h host_syncs): the ops the step runs between its two downloads (the head's
 * cross-entropy, the norm, AdamW, queued copies, events) never make the host wait; downloads,
 * sync and event_sync each count once. Run twice so that a first use's scratch growth is out of
 * the way. */
static void test_host_syncs(void **state) {
    (void)state;
    const int N = 300, V = 50257;
    seed(41);
    float *lg = g_up(hrandom((int64_t)N * V, 3.0f), (int64_t)N * V), *losses = g_fill(N, 0.0f);
    int32_t *tg = h_alloc(N * sizeof(int32_t));
    for (int i = 0; i < N; i++) tg[i] = (i * 131) % V;
    int32_t *gtg = g_up_i(tg, N);
    double *sums = g_double(0.0);
    float *p = g_fill(4096, 1.0f), *g = g_fill(4096, 0.5f), *m = g_fill(4096, 0.0f), *v = g_fill(4096, 0.0f);
    float *host = GPU->ops->host_alloc(GPU, 4096 * 4);
    assert_non_null(host);
    dev_event *e = GPU->ops->event_new(GPU);
    const dev_adamw step = dev_adamw_step(1e-3, 0.9, 0.95, 1e-8, 0.1, 1, 1.0f);
    const float *list[2] = {g, lg};
    const int64_t sizes[2] = {4096, (int64_t)N * V};
    for (int round = 0; round < 2; round++) {
        GPU->ops->sync(GPU);
        int64_t h0 = GPU->host_syncs;
        for (int rep = 0; rep < 4; rep++)
            GPU->ops->xent_fwd_bwd(GPU, lg, V, losses, gtg, N, V, 0.5f, sums);
        GPU->ops->sumsq_multi(GPU, sums, 2, list, sizes);
        GPU->ops->adamw(GPU, p, g, m, v, 4096, &step);
        GPU->ops->copy_async(GPU, host, p, 4096 * 4, COPY_D2H, DEV_STREAM_COMPUTE);
        GPU->ops->event_record(GPU, e, DEV_STREAM_COMPUTE);
        GPU->ops->stream_wait(GPU, DEV_STREAM_D2H, e);
        if (round == 1 && GPU->host_syncs != h0)
            fail_msg("%lld host waits in ops that queue work only", (long long)(GPU->host_syncs - h0));
        (void)g_read_double(sums);
        GPU->ops->event_sync(GPU, e);
        GPU->ops->sync(GPU);
        if (round == 1 && GPU->host_syncs != h0 + 3)
            fail_msg("a download, an event_sync and a sync: %lld host waits, want 3",
                     (long long)(GPU->host_syncs - h0));
    }
    GPU->ops->event_free(GPU, e);
    GPU->ops->host_free(GPU, host);
}

static void test_copy2d(void **state) {
    (void)state;
    const int cases[][4] = {{7, 13, 20, 17}, {1000, 771, 800, 1024}, {1, 1, 1, 1}, {300, 64, 192, 64}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int rows = cases[c][0], cols = cases[c][1], lds = cases[c][2], ldo = cases[c][3];
        seed(9 + c);
        float *src = hrandom((int64_t)rows * lds, 1.0f);
        float *gdst = g_fill((int64_t)rows * ldo, 5.0f);
        GPU->ops->copy2d(GPU, gdst, ldo, g_up(src, (int64_t)rows * lds), lds, rows, cols);
        float *dst = g_down(gdst, (int64_t)rows * ldo);
        for (int r = 0; r < rows; r++) {
            expect_same("copy2d", dst + (int64_t)r * ldo, src + (int64_t)r * lds, (size_t)cols * 4);
            expect_all("copy2d padding", dst + (int64_t)r * ldo + cols, ldo - cols, 5.0f);
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * gemm */

static uint16_t bf16_rne(float f); /* host references, below */
static uint16_t fp16_rne(float f);
static float fp16_value(uint16_t h);

static float bf16_round(float f) {
    uint32_t u = (uint32_t)bf16_rne(f) << 16;
    float r;
    memcpy(&r, &u, 4);
    return r;
}

static float fp16_round(float f) { return fp16_value(fp16_rne(f)); }

static const char *mode_name(dev_matmul m) {
    return m == DEV_MATMUL_FP32   ? "fp32"
           : m == DEV_MATMUL_TF32 ? "tf32"
           : m == DEV_MATMUL_BF16 ? "bf16"
                                  : "fp16";
}

typedef struct gemm_case {
    int M, N, K, pad; /* pad: extra columns in lda/ldb/ldc (odd pads: unaligned leading dims) */
    float alpha, beta;
} gemm_case;

/* What a check_gemm runs: gemm, gemm_bias (a bias of N values) or gemm_bgrad (ta only, A
 * contiguous: db of M values accumulates A's column sums). */
typedef enum { EPI_NONE, EPI_BIAS, EPI_BGRAD } gemm_epi;

static const char *epi_name(gemm_epi e) {
    return e == EPI_NONE ? "gemm" : e == EPI_BIAS ? "gemm_bias" : "gemm_bgrad";
}

static void call_gemm(device *dv, gemm_epi e, bool ta, bool tb, int M, int N, int K, float alpha,
                      const float *A, int lda, const float *B, int ldb, float beta, float *C,
                      int ldc, const float *bias, float *db) {
    if (e == EPI_NONE) dv->ops->gemm(dv, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    else if (e == EPI_BIAS)
        dv->ops->gemm_bias(dv, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias);
    else
        dv->ops->gemm_bgrad(dv, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, db);
}

/* gemm, gemm_bias or gemm_bgrad of the case in the given mode against the CPU device. The bias
 * add is one fp32 addition on both devices and the bias gradient a sum of K fp32 values (the
 * unrounded A in every mode: device.h), so the gemm's bounds below hold for C as they are, and
 * db is held to bias_grad's bound of test_bias (sqrt(K) 1e-6 of max|db|). */
static void check_gemm_epi(const gemm_case *gc, bool ta, bool tb, dev_matmul mode, gemm_epi e) {
    int M = gc->M, N = gc->N, K = gc->K;
    int lda = (ta ? M : K) + gc->pad, ldb = (tb ? K : N) + gc->pad, ldc = N + gc->pad + 1;
    if (e == EPI_BGRAD) lda = M; /* device.h: A is [K, M] contiguous */
    int64_t na = (int64_t)(ta ? K : M) * lda, nb = (int64_t)(tb ? N : K) * ldb, nc = (int64_t)M * ldc;
    float *A = hrandom(na, 1.0f), *B = hrandom(nb, 1.0f);
    float *bias = e == EPI_BIAS ? hrandom(N, 1.0f) : NULL, *gbias = bias ? g_up(bias, N) : NULL;
    float *db = e == EPI_BGRAD ? hfill(M, 0.5f) : NULL, *gdb = db ? g_fill(M, 0.5f) : NULL;
    float *db_scratch = e == EPI_BGRAD ? hfill(M, 0.5f) : NULL;
    /* beta = 0: C must not be read (BLAS semantics), so NaN there must not come through */
    float *C0 = gc->beta == 0 ? hfill(nc, NAN) : hrandom(nc, 1.0f);
    for (int i = 0; i < M; i++) /* the padding columns hold a marker that must survive */
        for (int j = N; j < ldc; j++) C0[(int64_t)i * ldc + j] = 5.0f;
    float *Cref = hdup(C0, nc);
    if (gc->beta == 0)
        for (int64_t i = 0; i < nc; i++)
            if (isnan(Cref[i])) Cref[i] = 0.0f; /* OpenBLAS does not read C either; belt and braces */
    REF->matmul = DEV_MATMUL_FP32;
    call_gemm(REF, e, ta, tb, M, N, K, gc->alpha, A, lda, B, ldb, gc->beta, Cref, ldc, bias, db);

    GPU->matmul = mode;
    float *gC = g_up(C0, nc);
    call_gemm(GPU, e, ta, tb, M, N, K, gc->alpha, g_up(A, na), lda, g_up(B, nb), ldb, gc->beta, gC,
              ldc, gbias, gdb);
    GPU->matmul = DEV_MATMUL_FP32;
    float *got = g_down(gC, nc);
    char what[200];
    snprintf(what, sizeof what, "%s %s ta=%d tb=%d M=%d N=%d K=%d lda=%d ldb=%d ldc=%d beta=%g",
             epi_name(e), mode_name(mode), ta, tb, M, N, K, lda, ldb, ldc, (double)gc->beta);
    for (int i = 0; i < M; i++) expect_all(what, got + (int64_t)i * ldc + N, ldc - N, 5.0f);
    if (db) {
        char wdb[240];
        snprintf(wdb, sizeof wdb, "%s: db", what);
        expect_rel(wdb, g_down(gdb, M), db, M, 1e-6 * sqrt((double)K) + 4 * U_FP32);
    }
    for (int i = 0; i < M; i++) /* pad columns are equal now; compare whole rows */
        for (int j = N; j < ldc; j++) Cref[(int64_t)i * ldc + j] = 5.0f;

    if (mode == DEV_MATMUL_FP32) {
        /* the same products, summed in another order (cuBLAS splits K): with random signs the
         * accumulated rounding is ~ sqrt(K) 2^-24 of max|C|; 8x margin */
        expect_rel(what, got, Cref, nc, 8 * sqrt((double)K + 1) * U_FP32);
    } else if (mode == DEV_MATMUL_TF32) {
        /* each product a_k b_k carries relative error <= 2 u_tf32 (both operands truncated or
         * rounded to 10 mantissa bits); with random signs the error of C_ij ~ u sqrt(K) sigma_a
         * sigma_b while max|C| ~ 4 sqrt(K) sigma_a sigma_b, so the ratio does not grow with K:
         * 4 u_tf32 = 3.9e-3 is a comfortable bound */
        expect_rel(what, got, Cref, nc, 4 * U_TF32);
    } else {
        /* against exact fp32: the same argument with 8-bit (bf16) or 11-bit (fp16)
         * significands: 4 u_bf16 = 1.6e-2, 4 u_fp16 = 2e-3 (|A|, |B| <= 1: no fp16 overflow) */
        const bool fp16 = mode == DEV_MATMUL_FP16;
        expect_rel(what, got, Cref, nc, 4 * (fp16 ? U_FP16 : U_BF16));
        /* against the CPU on rounded copies of A and B (what device.h says the mode is): bf16
         * x bf16 (fp16 x fp16) products are exact in fp32, so only the order of the fp32
         * accumulation differs; tensor cores may align addends with truncation, so allow
         * K 2^-23 of max|C| (the worst-case bound of K additions) with a floor of 2e-5 */
        float *Ar = hdup(A, na), *Br = hdup(B, nb);
        for (int64_t i = 0; i < na; i++) Ar[i] = fp16 ? fp16_round(Ar[i]) : bf16_round(Ar[i]);
        for (int64_t i = 0; i < nb; i++) Br[i] = fp16 ? fp16_round(Br[i]) : bf16_round(Br[i]);
        float *Cr = hdup(C0, nc);
        if (gc->beta == 0)
            for (int64_t i = 0; i < nc; i++)
                if (isnan(Cr[i])) Cr[i] = 0.0f;
        call_gemm(REF, e, ta, tb, M, N, K, gc->alpha, Ar, lda, Br, ldb, gc->beta, Cr, ldc, bias,
                  db_scratch);
        for (int i = 0; i < M; i++)
            for (int j = N; j < ldc; j++) Cr[(int64_t)i * ldc + j] = 5.0f;
        char w2[260];
        snprintf(w2, sizeof w2, "%s vs %s-rounded operands", what, mode_name(mode));
        expect_rel(w2, got, Cr, nc, fmax(2e-5, (double)K * 2 * U_FP32));
    }
}

static void check_gemm(const gemm_case *gc, bool ta, bool tb, dev_matmul mode) {
    check_gemm_epi(gc, ta, tb, mode, EPI_NONE);
}

/* The gemm cases in every mode, in the device under test's CEPHALO_CUDA_GEMM mode */
static void gemm_cases(void) {
    const gemm_case cases[] = {
        {7, 13, 37, 3, 0.7f, 0.3f},       /* tiny, odd, unaligned leading dimensions */
        {64, 64, 64, 0, 1.0f, 0.0f},      /* exactly one tile, beta 0 over NaN */
        {129, 65, 300, 2, 0.5f, 1.0f},    /* partial tiles on every side, accumulate */
        {1, 257, 768, 0, 1.0f, 0.0f},     /* one row (a single token) */
        {300, 1, 129, 1, 1.0f, 0.25f},    /* one column */
        {1024, 2304, 768, 0, 1.0f, 0.0f}, /* GPT-2 124M qkv projection of 1024 tokens */
        {512, 768, 3072, 0, 1.0f, 1.0f},  /* mlp down projection, accumulating (weight grads) */
        /* the 16-bit modes round operands into 32 MiB workspaces: an operand of 20M elements
         * (the logits gradient of 400 tokens) goes in chunks of rows of C, then of columns */
        {400, 64, 50257, 0, 1.0f, 0.5f},
        {64, 400, 50257, 1, 1.0f, 0.0f},
    };
    const dev_matmul modes[] = {DEV_MATMUL_FP32, DEV_MATMUL_TF32, DEV_MATMUL_BF16, DEV_MATMUL_FP16};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int t = 0; t < 4; t++)
            for (int m = 0; m < 4; m++) {
                if (self_check && modes[m] != DEV_MATMUL_FP32 && cases[c].M * cases[c].N > 100000)
                    continue; /* the CPU's bf16 rounding copies: slow and tested once is enough */
                if (self_check && modes[m] == DEV_MATMUL_FP16 && !GPU->ops->to_fp16)
                    continue; /* a CPU device without fp16 yet */
                if (cases[c].K > 10000 && (modes[m] == DEV_MATMUL_FP32 || modes[m] == DEV_MATMUL_TF32))
                    continue; /* the chunking cases are for the 16-bit modes */
                seed(100 + c * 16 + t * 4 + m);
                check_gemm(&cases[c], t & 1, t & 2, modes[m]);
                release_all(NULL); /* keep device memory flat across the loop */
            }
    /* M = 0 or N = 0: nothing to do, nothing touched */
    float *gC = g_fill(8, 3.0f), *gA = g_fill(8, 1.0f);
    GPU->ops->gemm(GPU, false, false, 0, 2, 4, 1.0f, gA, 4, gA, 2, 0.0f, gC, 2);
    GPU->ops->gemm(GPU, false, false, 2, 0, 4, 1.0f, gA, 4, gA, 1, 0.0f, gC, 1);
    expect_all("gemm M=0 / N=0", g_down(gC, 8), 8, 3.0f);
    release_all(NULL);
}

/* gemm_bias and gemm_bgrad against the CPU device in every mode (CEPHALO_CUDA_GEMM=lt fuses
 * them into cuBLASLt's epilogues; blas runs gemm then add_bias / bias_grad), at a linear
 * layer's shapes (forward: !ta, tb; weight gradient: ta, !tb) and awkward ones, then
 * determinism: each twice, bit for bit. */
static void epilogue_cases(void) {
    const gemm_case cases[] = {
        {7, 13, 37, 3, 0.7f, 0.3f},       /* tiny, odd, unaligned leading dimensions */
        {64, 64, 64, 0, 1.0f, 0.0f},      /* one tile, beta 0 over NaN */
        {129, 65, 300, 2, 1.0f, 1.0f},    /* partial tiles, accumulate (alpha 1: fusable bgrad) */
        {1, 257, 768, 0, 1.0f, 0.0f},     /* one row (a single token) */
        {1024, 2304, 768, 0, 1.0f, 0.0f}, /* GPT-2 124M qkv projection of 1024 tokens */
        {768, 3072, 1024, 0, 1.0f, 1.0f}, /* an MLP weight's gradient over 1024 tokens */
        {64, 400, 50257, 1, 1.0f, 0.0f},  /* a chunked 16-bit product: the separate kernels */
    };
    const dev_matmul modes[] = {DEV_MATMUL_FP32, DEV_MATMUL_TF32, DEV_MATMUL_BF16, DEV_MATMUL_FP16};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int t = 0; t < 4; t++)
            for (int m = 0; m < 4; m++)
                for (int e = EPI_BIAS; e <= EPI_BGRAD; e++) {
                    const bool ta = t & 1, tb = t & 2;
                    if (e == EPI_BGRAD && !ta) continue; /* the op's A is transposed */
                    if ((int64_t)cases[c].M * cases[c].N > 100000 &&
                        (e == EPI_BIAS ? ta || !tb : tb))
                        continue; /* big shapes in the linear layer's layouts only (time) */
                    if (self_check && modes[m] != DEV_MATMUL_FP32 && cases[c].M * cases[c].N > 100000)
                        continue;
                    if (cases[c].K > 10000 && (modes[m] == DEV_MATMUL_FP32 || modes[m] == DEV_MATMUL_TF32))
                        continue;
                    seed(2100 + c * 64 + t * 16 + m * 4 + e);
                    check_gemm_epi(&cases[c], ta, tb, modes[m], (gemm_epi)e);
                    release_all(NULL);
                }
    /* the same inputs twice: the same bits (no split-K, one algorithm per shape) */
    const int M = 768, N = 1024, K = 512;
    for (int m = 0; m < 4; m++) {
        seed(2190 + m);
        float *A = g_up(hrandom((int64_t)K * M, 1.0f), (int64_t)K * M);
        float *B = g_up(hrandom((int64_t)K * N, 1.0f), (int64_t)K * N), *bias = g_up(hrandom(N, 1.0f), N);
        float *C[2], *db[2], *Y[2];
        GPU->matmul = modes[m];
        for (int r = 0; r < 2; r++) {
            C[r] = g_fill((int64_t)M * N, 0.5f), db[r] = g_fill(M, 0.5f), Y[r] = g_fill((int64_t)K * N, 7.0f);
            GPU->ops->gemm_bgrad(GPU, false, M, N, K, 1.0f, A, M, B, N, 1.0f, C[r], N, db[r]);
            GPU->ops->gemm_bias(GPU, false, false, K, N, M, 1.0f, A, M, C[r], N, 0.0f, Y[r], N, bias);
        }
        GPU->matmul = DEV_MATMUL_FP32;
        expect_same("gemm_bgrad twice: dW", g_down(C[0], (int64_t)M * N), g_down(C[1], (int64_t)M * N),
                    (size_t)M * N * 4);
        expect_same("gemm_bgrad twice: db", g_down(db[0], M), g_down(db[1], M), (size_t)M * 4);
        expect_same("gemm_bias twice", g_down(Y[0], (int64_t)K * N), g_down(Y[1], (int64_t)K * N),
                    (size_t)K * N * 4);
        release_all(NULL);
    }
}

static void test_gemm(void **state) {
    (void)state;
    gemm_cases();
}

static void test_gemm_epilogues(void **state) {
    (void)state;
    epilogue_cases();
}

/* The other CEPHALO_CUDA_GEMM mode than the run's (lt, unless the run is lt: then blas): the
 * device under test is reopened in it for the gemm and epilogue cases, and reopened as the run
 * started by the teardown (also after a failed check), so one run checks both paths. */
static bool started_lt(void) {
    const char *v = getenv("CEPHALO_CUDA_GEMM");
    return v && !strcmp(v, "lt");
}

static void test_gemm_other_mode(void **state) {
    (void)state;
    if (self_check) skip(); /* the CPU stand-in has one gemm */
    const char *other = started_lt() ? "blas" : "lt";
    printf("# gemm and epilogue cases again with CEPHALO_CUDA_GEMM=%s\n", other);
    reopen_gpu_with("CEPHALO_CUDA_GEMM", other);
    gemm_cases();
    epilogue_cases();
}

static int reopen_as_started(void **state) {
    release_all(state);
    if (!self_check) reopen_gpu_with("CEPHALO_CUDA_GEMM", NULL);
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * bias */

static void test_bias(void **state) {
    (void)state;
    const int cases[][2] = {{300, 45}, {4097, 771}, {1, 50257}, {1024, 768}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int N = cases[c][0], Cc = cases[c][1];
        int64_t nc = (int64_t)N * Cc;
        seed(200 + c);
        float *x = hrandom(nc, 1.0f), *b = hrandom(Cc, 1.0f);
        float *gx = g_up(x, nc), *gb = g_up(b, Cc);
        REF->ops->add_bias(REF, x, b, N, Cc);
        GPU->ops->add_bias(GPU, gx, gb, N, Cc);
        expect_same("add_bias", g_down(gx, nc), x, (size_t)nc * 4); /* one addition: exact */

        float *db = hfill(Cc, 0.5f), *gdb = g_fill(Cc, 0.5f); /* accumulates into 0.5 */
        REF->ops->bias_grad(REF, db, x, N, Cc);
        GPU->ops->bias_grad(GPU, gdb, gx, N, Cc);
        /* N fp32 values summed in different orders: the rounding of the partial sums grows like
         * sqrt(N) 2^-24 of the sum's scale; 1e-6 sqrt(N) is ~16x that */
        expect_rel("bias_grad", g_down(gdb, Cc), db, Cc, 1e-6 * sqrt((double)N) + 4 * U_FP32);
    }
    float *gx = g_fill(8, 2.0f), *gb = g_fill(8, 1.0f);
    GPU->ops->add_bias(GPU, gx, gb, 0, 8);
    GPU->ops->bias_grad(GPU, gb, gx, 0, 8);
    expect_all("add_bias N=0", g_down(gx, 8), 8, 2.0f);
    expect_all("bias_grad N=0", g_down(gb, 8), 8, 1.0f);
}

/* ---------------------------------------------------------------------------------------------
 * embeddings */

static void check_embed(int V, int Cc, int N, int32_t *ids, int max_repeat) {
    float *table = hrandom((int64_t)V * Cc, 1.0f);
    float *gout = g_fill((int64_t)N * Cc, 7.0f);
    int32_t *gids = g_up_i(ids, N);
    GPU->ops->embed_fwd(GPU, gout, g_up(table, (int64_t)V * Cc), gids, N, Cc);
    float *out = g_down(gout, (int64_t)N * Cc);
    for (int n = 0; n < N; n++)
        expect_same("embed_fwd", out + (int64_t)n * Cc, table + (int64_t)ids[n] * Cc, (size_t)Cc * 4);

    float *dout = hrandom((int64_t)N * Cc, 1.0f);
    float *dt = hfill((int64_t)V * Cc, -1.0f), *gdt = g_fill((int64_t)V * Cc, -1.0f);
    REF->ops->embed_bwd(REF, dt, dout, ids, N, Cc);
    GPU->ops->embed_bwd(GPU, gdt, g_up(dout, (int64_t)N * Cc), gids, N, Cc);
    /* a row sums up to max_repeat rows of dout (plus -1): as bias_grad, with the repeat count */
    char what[96];
    snprintf(what, sizeof what, "embed_bwd V=%d C=%d N=%d (an id repeats up to %d times)", V, Cc, N,
             max_repeat);
    expect_rel(what, g_down(gdt, (int64_t)V * Cc), dt, (int64_t)V * Cc,
               1e-6 * sqrt((double)max_repeat) + 4 * U_FP32);
}

static void test_embed(void **state) {
    (void)state;
    seed(300);
    int32_t *ids = h_alloc(4096 * sizeof(int32_t));
    for (int n = 0; n < 1024; n++) ids[n] = (int32_t)(rnd64() % 50257);
    ids[0] = 0, ids[1] = 50256, ids[2] = ids[3] = ids[4] = 777;
    check_embed(50257, 768, 1024, ids, 1024); /* GPT-2 table; the bound is loose for few repeats */
    for (int n = 0; n < 1000; n++) ids[n] = (n * 7 + n / 3) % 11;
    check_embed(11, 771, 1000, ids, 1000); /* every id ~90 times, odd width */
    for (int n = 0; n < 4096; n++) ids[n] = 3;
    check_embed(5, 64, 4096, ids, 4096); /* one hot row: all tokens the same id */
}

/* ---------------------------------------------------------------------------------------------
 * normalisations */

static void check_norm(bool rms, int N, int Cc) {
    int64_t nc = (int64_t)N * Cc;
    const float eps = 1e-5f;
    float *x = hrandom(nc, 2.0f), *w = hrandom(Cc, 1.0f), *b = hrandom(Cc, 1.0f), *G = hrandom(nc, 1.0f);
    for (int64_t i = 0; i < nc; i++) x[i] += 0.5f; /* a nonzero mean */
    float *out = hfill(nc, 7.0f), *mean = hfill(N, 7.0f), *rstd = hfill(N, 7.0f);
    float *gx = g_up(x, nc), *gw = g_up(w, Cc), *gb = g_up(b, Cc), *gG = g_up(G, nc);
    float *gout = g_fill(nc, 7.0f), *gmean = g_fill(N, 7.0f), *grstd = g_fill(N, 7.0f);
    if (rms) {
        REF->ops->rmsnorm_fwd(REF, out, rstd, x, w, N, Cc, eps);
        GPU->ops->rmsnorm_fwd(GPU, gout, grstd, gx, gw, N, Cc, eps);
    } else {
        REF->ops->layernorm_fwd(REF, out, mean, rstd, x, w, b, N, Cc, eps);
        GPU->ops->layernorm_fwd(GPU, gout, gmean, grstd, gx, gw, gb, N, Cc, eps);
    }
    char what[96];
    snprintf(what, sizeof what, "%s N=%d C=%d", rms ? "rmsnorm" : "layernorm", N, Cc);
    /* forward: row reductions in another order and possibly rsqrtf (2 ulp): elementwise 1e-5
     * relative with a 1e-5 x max floor, as the CPU test allows against double */
    expect_close(what, g_down(gout, nc), out, nc, 1e-5, 1e-5);
    expect_close("norm rstd", g_down(grstd, N), rstd, N, 1e-5, 0);
    if (!rms) expect_close("layernorm mean", g_down(gmean, N), mean, N, 1e-5, 1e-5);

    /* backward: dx, dw, db accumulate into nonzero values; each device uses its own mean/rstd */
    float *dx = hfill(nc, 0.5f), *dw = hfill(Cc, -0.25f), *db = hfill(Cc, 2.0f);
    float *gdx = g_fill(nc, 0.5f), *gdw = g_fill(Cc, -0.25f), *gdb = g_fill(Cc, 2.0f);
    if (rms) {
        REF->ops->rmsnorm_bwd(REF, dx, dw, G, x, rstd, w, N, Cc);
        GPU->ops->rmsnorm_bwd(GPU, gdx, gdw, gG, gx, grstd, gw, N, Cc);
    } else {
        REF->ops->layernorm_bwd(REF, dx, dw, db, G, x, mean, rstd, w, N, Cc);
        GPU->ops->layernorm_bwd(GPU, gdx, gdw, gdb, gG, gx, gmean, grstd, gw, N, Cc);
    }
    /* dx: two row reductions of C terms feed every element: 2e-5 of max */
    expect_rel("norm dx", g_down(gdx, nc), dx, nc, 2e-5);
    /* dw, db: column sums over N rows, as bias_grad */
    double col_tol = 1e-6 * sqrt((double)N) + 1e-5;
    expect_rel("norm dw", g_down(gdw, Cc), dw, Cc, col_tol);
    if (!rms) expect_rel("layernorm db", g_down(gdb, Cc), db, Cc, col_tol);
    else expect_all("rmsnorm leaves db alone", g_down(gdb, Cc), Cc, 2.0f);
}

static void test_norms(void **state) {
    (void)state;
    const int cases[][2] = {{7, 45}, {1024, 768}, {33, 2048}, {300, 1023}, {3, 5120}, {1, 1}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int rms = 0; rms < 2; rms++) {
            seed(400 + c * 2 + rms);
            check_norm(rms, cases[c][0], cases[c][1]);
            release_all(NULL);
        }
}

/* add_norm_fwd (the residual add fused into the norm): on the GPU bit for bit its own add + norm +
 * round_half, in place (sum = a, as the blocks call it); the sum exactly the CPU's. */
static void test_add_norm(void **state) {
    (void)state;
    const int cases[][2] = {{7, 45}, {1024, 768}, {300, 1023}, {1, 1}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int kind = 0; kind < 2; kind++)
            for (int q = 0; q < 3; q++) {
                precision hp = (precision[]){PREC_FP32, PREC_BF16, PREC_FP16}[q];
                int N = cases[c][0], C = cases[c][1];
                int64_t n = (int64_t)N * C;
                bool ln = kind == 0;
                seed(700 + c * 6 + kind * 3 + q);
                float *a = hrandom(n, 3.0f), *b = hrandom(n, 3.0f), *w = hrandom(C, 1.0f), *bias = hrandom(C, 1.0f);
                float *gb = g_up(b, n), *gw = g_up(w, C), *gbias = g_up(bias, C);
                /* unfused */
                float *gs1 = g_up(a, n), *go1 = g_fill(n, 7.0f), *gm1 = g_fill(N, 7.0f), *gr1 = g_fill(N, 7.0f);
                GPU->ops->axpy(GPU, gs1, 1.0f, gb, n);
                if (ln) GPU->ops->layernorm_fwd(GPU, go1, gm1, gr1, gs1, gw, gbias, N, C, 1e-5f);
                else GPU->ops->rmsnorm_fwd(GPU, go1, gr1, gs1, gw, N, C, 1e-5f);
                if (hp != PREC_FP32) GPU->ops->round_half(GPU, go1, n, hp);
                /* fused, in place */
                float *gs2 = g_up(a, n), *go2 = g_fill(n, 7.0f), *gm2 = g_fill(N, 7.0f), *gr2 = g_fill(N, 7.0f);
                GPU->ops->add_norm_fwd(GPU, gs2, go2, ln ? gm2 : NULL, gr2, gs2, gb, gw, ln ? gbias : NULL, N, C,
                                       1e-5f, hp);
                char what[96];
                snprintf(what, sizeof what, "add_norm %s %s N=%d C=%d", ln ? "layer" : "rms", precision_name(hp), N, C);
                float *s2 = g_down(gs2, n);
                expect_same(what, s2, g_down(gs1, n), (size_t)n * 4);
                expect_same(what, g_down(go2, n), g_down(go1, n), (size_t)n * 4);
                expect_same(what, g_down(gr2, N), g_down(gr1, N), (size_t)N * 4);
                if (ln) expect_same(what, g_down(gm2, N), g_down(gm1, N), (size_t)N * 4);
                float *s = hdup(a, n);
                REF->ops->add(REF, s, a, b, n);
                expect_same("add_norm sum against the CPU", s2, s, (size_t)n * 4);
                release_all(NULL);
            }
}

/* ---------------------------------------------------------------------------------------------
 * activations */

static void check_act(int kind, int64_t n) {
    float *x = hrandom(n, 7.0f), *u = hrandom(n, 2.0f), *G = hrandom(n, 1.0f);
    x[0] = 0.0f;
    if (n > 3) x[1] = -20.0f, x[2] = 20.0f; /* saturation */
    float *out = hfill(n, 7.0f), *dx = hfill(n, 7.0f), *du = hfill(n, 7.0f);
    float *gx = g_up(x, n), *gu = g_up(u, n), *gG = g_up(G, n);
    float *gout = g_fill(n, 7.0f), *gdx = g_fill(n, 7.0f), *gdu = g_fill(n, 7.0f);
    const char *name = kind == 0 ? "gelu tanh" : kind == 1 ? "gelu erf" : "swiglu";
    if (kind == 2) {
        REF->ops->swiglu_fwd(REF, out, x, u, n);
        REF->ops->swiglu_bwd(REF, dx, du, G, x, u, n);
        GPU->ops->swiglu_fwd(GPU, gout, gx, gu, n);
        GPU->ops->swiglu_bwd(GPU, gdx, gdu, gG, gx, gu, n);
    } else {
        REF->ops->gelu_fwd(REF, out, x, n, kind == 0);
        REF->ops->gelu_bwd(REF, dx, x, G, n, kind == 0);
        GPU->ops->gelu_fwd(GPU, gout, gx, n, kind == 0);
        GPU->ops->gelu_bwd(GPU, gdx, gx, gG, n, kind == 0);
    }
    /* exp/tanh/erf differ between libm, the CPU's exp_fast (3 ulp) and CUDA's (fast) intrinsics by
     * a few ulp; 1e-5 relative + 1e-5 of max is what the CPU test allows against double */
    char what[64];
    snprintf(what, sizeof what, "%s n=%lld out", name, (long long)n);
    expect_close(what, g_down(gout, n), out, n, 1e-5, 1e-5);
    snprintf(what, sizeof what, "%s n=%lld dx", name, (long long)n);
    expect_close(what, g_down(gdx, n), dx, n, 1e-5, 1e-5);
    if (kind == 2) {
        expect_close("swiglu du", g_down(gdu, n), du, n, 1e-5, 1e-5);
        /* dg may alias g (the trainer reuses the gate buffer): the same bits */
        float *gg2 = g_up(x, n), *gdu2 = g_fill(n, 7.0f);
        GPU->ops->swiglu_bwd(GPU, gg2, gdu2, gG, gg2, gu, n);
        expect_same("swiglu_bwd with dg aliasing g", g_down(gg2, n), g_down(gdx, n), (size_t)n * 4);
    }
}

static void test_activations(void **state) {
    (void)state;
    for (int kind = 0; kind < 3; kind++) {
        seed(500 + kind);
        check_act(kind, 1);
        check_act(kind, 1000003);
        release_all(NULL);
    }
}

/* ---------------------------------------------------------------------------------------------
 * rope */

/* The frequencies of plain RoPE as model_rope_inv_freq makes them (PyTorch's fp32 order);
 * rope_scaling only changes the table's values, which the ops take as given. */
static float *plain_inv_freq(int hd, float theta) {
    float *inv_freq = malloc((size_t)(hd / 2) * sizeof(float));
    assert_non_null(inv_freq);
    for (int i = 0; i < hd / 2; i++)
        inv_freq[i] = 1.0f / (float)pow((double)theta, (double)((float)(2 * i) / (float)hd));
    return inv_freq;
}

static void check_rope(int B, int T, int H, int Hkv, int hd, float theta) {
    int ld = (H + 2 * Hkv) * hd + 3; /* fused qkv rows, padded */
    int rows = B * T;
    int64_t n = (int64_t)rows * ld;
    float *x = hrandom(n, 1.0f), *xr = hdup(x, n);
    float *gxv = g_up(x, n);
    float *inv_freq = plain_inv_freq(hd, theta);
    REF->ops->rope(REF, xr, ld, rows, T, H, hd, inv_freq, false);
    REF->ops->rope(REF, xr + H * hd, ld, rows, T, Hkv, hd, inv_freq, false);
    GPU->ops->rope(GPU, gxv, ld, rows, T, H, hd, inv_freq, false);
    GPU->ops->rope(GPU, gxv + H * hd, ld, rows, T, Hkv, hd, inv_freq, false);
    float *got = g_down(gxv, n);
    char what[112];
    snprintf(what, sizeof what, "rope B=%d T=%d H=%d Hkv=%d hd=%d theta=%g", B, T, H, Hkv, hd, (double)theta);
    /* The angle must be formed as PyTorch forms it, float(t) * inv_freq rounded to fp32 (see
     * cpu_device.c); sin/cos then need a full range reduction (angles reach 2047 rad at T = 2048).
     * Done so, the tables agree to ~1 ulp and the outputs to ~2e-7 of max; an angle formed in
     * double differs by up to half an ulp of 2047 (6e-5 rad), and fast __sinf is worse: 1e-5
     * separates the two. */
    expect_rel(what, got, xr, n, 1e-5);
    for (int r = 0; r < rows; r++) {
        int64_t o = (int64_t)r * ld + (int64_t)(H + Hkv) * hd;
        expect_same("rope leaves v and the padding alone", got + o, x + o, (size_t)(Hkv * hd + 3) * 4);
    }
    /* inverse(fwd(x)) = x: the rotation and its transpose with the same cos/sin, so ~2 ulp */
    GPU->ops->rope(GPU, gxv, ld, rows, T, H, hd, inv_freq, true);
    GPU->ops->rope(GPU, gxv + H * hd, ld, rows, T, Hkv, hd, inv_freq, true);
    snprintf(what, sizeof what, "rope inverse(fwd(x)) = x, T=%d hd=%d", T, hd);
    expect_rel(what, g_down(gxv, n), x, n, 1e-6);
    /* the inverse against the CPU's inverse on the same input */
    float *gy = g_up(x, n), *y = hdup(x, n);
    REF->ops->rope(REF, y, ld, rows, T, H, hd, inv_freq, true);
    GPU->ops->rope(GPU, gy, ld, rows, T, H, hd, inv_freq, true);
    expect_rel("rope inverse", g_down(gy, n), y, n, 1e-5);
    free(inv_freq);
}

static void test_rope(void **state) {
    (void)state;
    seed(600);
    check_rope(2, 17, 3, 1, 64, 10000.0f);
    check_rope(1, 2048, 4, 2, 128, 10000.0f);
    check_rope(2, 300, 8, 2, 64, 500000.0f);
    check_rope(3, 1, 2, 2, 64, 10000.0f);
    check_rope(1, 1024, 32, 4, 64, 10000.0f); /* TinyLlama's heads */
}

/* ---------------------------------------------------------------------------------------------
 * attention */

typedef struct att_case {
    int B, T, H, Hkv, hd;
    bool causal;
    int pad; /* extra floats per fused qkv row */
} att_case;

/* softmax_scale max|dP| max|K| (dP = G V^T over the head dim): the size of the terms whose
 * cancellation makes dq and dk; enough for the T = 1 cases, where it is one dot per row */
static double attention_term_size(const att_case *c, const float *qkv, int ld, const float *G) {
    int koff = c->H * c->hd, voff = (c->H + c->Hkv) * c->hd, ldo = c->H * c->hd;
    double dp = 0, kmax = 0;
    for (int64_t r = 0; r < (int64_t)c->B * c->T; r++)
        for (int h = 0; h < c->H; h++) {
            const float *g = G + r * ldo + h * c->hd, *v = qkv + r * ld + voff + (h / (c->H / c->Hkv)) * c->hd;
            double s = 0;
            for (int i = 0; i < c->hd; i++) s += (double)g[i] * v[i];
            dp = fmax(dp, fabs(s));
        }
    for (int64_t r = 0; r < (int64_t)c->B * c->T; r++)
        kmax = fmax(kmax, fmax_abs(qkv + r * ld + koff, (int64_t)c->Hkv * c->hd));
    return dp * kmax / sqrt((double)c->hd);
}

static void check_attention(const att_case *c, dev_matmul mode, double tol_fwd, double tol_bwd) {
    int ld = (c->H + 2 * c->Hkv) * c->hd + c->pad, ldo = c->H * c->hd;
    int koff = c->H * c->hd, voff = (c->H + c->Hkv) * c->hd, heads_w = (c->H + 2 * c->Hkv) * c->hd;
    int64_t rows = (int64_t)c->B * c->T, nqkv = rows * ld, nout = rows * ldo;
    int64_t nlse = (int64_t)c->B * c->H * c->T;
    float *qkv = hrandom(nqkv, 1.5f), *G = hrandom(nout, 1.0f);
    float *out = hfill(nout, 7.0f), *lse = hfill(nlse, 7.0f), *dqkv = hfill(nqkv, 7.0f);
    REF->ops->attention_fwd(REF, out, lse, qkv, ld, qkv + koff, ld, qkv + voff, ld, c->B, c->T, c->H,
                            c->Hkv, c->hd, c->causal);
    REF->ops->attention_bwd(REF, dqkv, dqkv + koff, dqkv + voff, G, out, lse, qkv, ld, qkv + koff, ld,
                            qkv + voff, ld, c->B, c->T, c->H, c->Hkv, c->hd, c->causal);

    GPU->matmul = mode;
    float *gq = g_up(qkv, nqkv), *gG = g_up(G, nout);
    float *gout = g_fill(nout, 7.0f), *glse = g_fill(nlse, 7.0f), *gd = g_fill(nqkv, 7.0f);
    GPU->ops->attention_fwd(GPU, gout, glse, gq, ld, gq + koff, ld, gq + voff, ld, c->B, c->T, c->H,
                            c->Hkv, c->hd, c->causal);
    GPU->ops->attention_bwd(GPU, gd, gd + koff, gd + voff, gG, gout, glse, gq, ld, gq + koff, ld,
                            gq + voff, ld, c->B, c->T, c->H, c->Hkv, c->hd, c->causal);
    GPU->matmul = DEV_MATMUL_FP32;
    char what[160];
    snprintf(what, sizeof what, "attention B=%d T=%d H=%d Hkv=%d hd=%d %s ld=%d mode=%d", c->B, c->T,
             c->H, c->Hkv, c->hd, c->causal ? "causal" : "full", ld, (int)mode);
    float *got = g_down(gout, nout), *glse_h = g_down(glse, nlse), *gdq = g_down(gd, nqkv);
    char w[200];
    snprintf(w, sizeof w, "%s: out", what);
    expect_rel(w, got, out, nout, tol_fwd);
    snprintf(w, sizeof w, "%s: lse", what);
    expect_close(w, glse_h, lse, nlse, tol_fwd, tol_fwd);
    /* dq, dk, dv separately (their scales differ), written in the head columns only */
    float *rq = h_alloc((size_t)rows * heads_w * 4), *gqh = h_alloc((size_t)rows * heads_w * 4);
    for (int part = 0; part < 3; part++) {
        int off = part == 0 ? 0 : part == 1 ? koff : voff, w_ = part == 0 ? koff : c->Hkv * c->hd;
        for (int64_t r = 0; r < rows; r++) {
            memcpy(rq + r * w_, dqkv + r * ld + off, (size_t)w_ * 4);
            memcpy(gqh + r * w_, gdq + r * ld + off, (size_t)w_ * 4);
        }
        snprintf(w, sizeof w, "%s: d%c", what, "qkv"[part]);
        /* With one key per query (T = 1) softmax is constant: dq and dk vanish in exact
         * arithmetic and both devices return rounding noise of the cancelling terms
         * P (dP - D), so the scale is those terms' size, not max|ref| (~1e-7, seen on an H200) */
        double m = fmax_abs(rq, rows * w_);
        if (c->T == 1 && part < 2) m = fmax(m, attention_term_size(c, qkv, ld, G));
        expect_close_scaled(w, gqh, rq, rows * w_, 0.0, tol_bwd, m == 0 ? 1 : m);
    }
    for (int64_t r = 0; r < rows; r++) expect_all("attention dqkv padding", gdq + r * ld + heads_w, c->pad, 7.0f);
}

static void test_attention(void **state) {
    (void)state;
    const int Ts[] = {1, 17, 128, 300}, hds[] = {64, 128};
    int k = 0;
    for (int h = 0; h < 2; h++)
        for (int t = 0; t < 4; t++)
            for (int causal = 1; causal >= 0; causal--) {
                int T = Ts[t];
                att_case c = {T <= 128 ? 2 : 1, T, 8, 2, hds[h], causal, T == 17 ? 4 : 0};
                seed(700 + k++);
                /* fp32 flash attention against the CPU's (itself within 1e-5 of double): online
                 * softmax rescaling and another summation order; 2e-5 of max forward, 5e-5 for
                 * the gradients, which sum T terms of products of the forward's outputs */
                check_attention(&c, DEV_MATMUL_FP32, 2e-5, 5e-5);
                release_all(NULL);
            }
    att_case mha = {2, 200, 4, 4, 64, true, 0}; /* multi-head, crosses a 64-row tile */
    seed(750);
    check_attention(&mha, DEV_MATMUL_FP32, 2e-5, 5e-5);
    release_all(NULL);
    /* The trainer runs attention under the TF32 and BF16 matmul modes too. device.h gives
     * attention no reduced-precision contract, so it should still be fp32; should a kernel use
     * tensor cores in those modes, its error must stay within the gemm bounds of that mode
     * (scores and P.V each one matmul: 2x the gemm bound forward, 4x backward). */
    att_case c1 = {2, 300, 8, 2, 64, true, 0};
    seed(760);
    check_attention(&c1, DEV_MATMUL_TF32, 8 * U_TF32, 16 * U_TF32);
    release_all(NULL);
    seed(761);
    check_attention(&c1, DEV_MATMUL_BF16, 8 * U_BF16, 16 * U_BF16);
    release_all(NULL);
    seed(762);
    check_attention(&c1, DEV_MATMUL_FP16, 8 * U_FP16, 16 * U_FP16);
}

/* Every head dim the model validation admits (common/attn_limits.h: 1..128) is one of the
 * kernels' tile widths or runs padded in the next one: each width, and padded ones (the
 * catalog's 100 and 104, and 8, 48, 120, plus 6 and 50, which are not multiples of 4 and take
 * the 4-byte copies). T = 17 and 300: partial tiles; causal and not; GQA 4 heads on 2; a padded
 * fused row. Run it also with CEPHALO_CUDA_PORTABLE=1 (tests/gpu/run.sh does), where every width
 * takes its 48 KB tiles and plain loads. Tolerances as in test_attention. */
static void test_attention_head_dims(void **state) {
    (void)state;
    const int hds[] = {16, 32, 64, 80, 96, 112, 128, 8, 48, 100, 104, 120, 6, 50};
    const int Ts[] = {17, 300};
    int k = 0;
    for (size_t h = 0; h < sizeof hds / sizeof hds[0]; h++)
        for (int t = 0; t < 2; t++)
            for (int causal = 1; causal >= 0; causal--) {
                if (self_check && Ts[t] > 100 && !causal) continue; /* the CPU stand-in is slow */
                att_case c = {2, Ts[t], 4, 2, hds[h], causal, 3};
                seed(800 + k++);
                check_attention(&c, DEV_MATMUL_FP32, 2e-5, 5e-5);
                release_all(NULL);
            }
}

/* ---- the tensor-core path (CEPHALO_CUDA_ATTN=mma, worker/devices/cuda_attention_mma.cu) ----
 * The device under test is reopened with CEPHALO_CUDA_ATTN=mma for these cases and reopened
 * as before at the end, so one run compares both paths against the CPU. */

/* cuda_attention_mma.cu: whether a call takes the mma path (linked from the CUDA device) */
bool cuda_attention_mma_ok(device *d, int hd);


/* Tolerances: q, k, v, dout are rounded to 16 bits when staged, P and dS before their products
 * (docs/cuda.md lists the points), each a relative error of u = 2^-9 (bf16) or 2^-12 (fp16),
 * on sums over the head dim and the keys that largely average out: 8u of max|ref| forward and
 * 16u backward, as for attention under the gemm modes above (test_attention), for bf16; fp16's
 * share of the same bound is tighter than its 8 bits less rounding suggests (the sums' fp32
 * accumulation and D, computed from fp32 dout and out, weigh more), so 16u and 32u. On the CPU
 * warp emulator (tests/unit/test_mma_layout.c) the same algorithm stays within 1e-2 (bf16) and
 * 2e-3 (fp16) of max|ref| against the CPU device on pre-rounded inputs. */
static void check_attention_mma(const att_case *c, dev_matmul mode) {
    bool fp16 = mode == DEV_MATMUL_FP16;
    double u = fp16 ? U_FP16 : U_BF16;
    check_attention(c, mode, (fp16 ? 16 : 8) * u, (fp16 ? 32 : 16) * u);
}

static void test_attention_mma(void **state) {
    (void)state;
    if (self_check) skip(); /* the CPU stand-in has no mma path */
    reopen_gpu("mma");
    GPU->matmul = DEV_MATMUL_BF16;
    if (!cuda_attention_mma_ok(GPU, 64)) {
        printf("# CEPHALO_CUDA_ATTN=mma: not taken on this GPU (before sm_80, or portable mode): "
               "the mma cases are skipped\n");
        reopen_gpu(NULL);
        skip();
    }
    /* fp32 precision never takes the mma path (the fp32 kernels, as before) */
    GPU->matmul = DEV_MATMUL_FP32;
    assert_false(cuda_attention_mma_ok(GPU, 64));
    GPU->matmul = DEV_MATMUL_TF32;
    assert_false(cuda_attention_mma_ok(GPU, 64));
    GPU->matmul = DEV_MATMUL_FP32;

    /* every head size 1..128 through the four widths (16, 32, 64, 128; the rest padded),
     * partial tiles (T = 17, 300), one tile (T = 64), causal and not, GQA 4 on 2, padded rows */
    const int hds[] = {64, 128, 16, 32, 1, 5, 8, 24, 48, 50, 80, 96, 100, 112, 120};
    const int Ts[] = {17, 300, 64};
    int k = 0;
    for (size_t h = 0; h < sizeof hds / sizeof hds[0]; h++)
        for (int t = 0; t < 3; t++)
            for (int causal = 1; causal >= 0; causal--)
                for (int f = 0; f < 2; f++) {
                    if (Ts[t] == 64 && h >= 4) continue; /* the full tile: the four widths */
                    att_case c = {2, Ts[t], 4, 2, hds[h], causal, 3};
                    seed(1900 + k++);
                    check_attention_mma(&c, f ? DEV_MATMUL_FP16 : DEV_MATMUL_BF16);
                    release_all(NULL);
                }
    att_case mha = {1, 1030, 12, 12, 64, true, 0}; /* GPT-2's heads, many tiles, T % 64 != 0 */
    seed(1990);
    check_attention_mma(&mha, DEV_MATMUL_BF16);
    release_all(NULL);
    att_case gqa = {1, 200, 32, 4, 64, true, 0}; /* TinyLlama's grouping (8 heads a kv head) */
    seed(1991);
    check_attention_mma(&gqa, DEV_MATMUL_BF16);
    release_all(NULL);

    /* the path is the mma one (its 16-bit rounding shows against the fp32 CPU: > 1e-5 of max
     * where the fp32 kernels agree to 2e-5 x max, typically 1e-6), and deterministic */
    att_case d = {1, 300, 4, 2, 64, true, 0};
    int ld = (d.H + 2 * d.Hkv) * d.hd, nout = d.T * d.H * d.hd;
    seed(1995);
    float *qkv = hrandom((int64_t)d.T * ld, 1.5f), *out = hfill(nout, 0), *lse = hfill(d.H * d.T, 0);
    REF->ops->attention_fwd(REF, out, lse, qkv, ld, qkv + d.H * d.hd, ld, qkv + (d.H + d.Hkv) * d.hd, ld, 1, d.T,
                            d.H, d.Hkv, d.hd, true);
    GPU->matmul = DEV_MATMUL_BF16;
    float *gq = g_up(qkv, (int64_t)d.T * ld), *o1 = g_fill(nout, 7), *o2 = g_fill(nout, 7);
    float *l1 = g_fill(d.H * d.T, 7), *l2 = g_fill(d.H * d.T, 7);
    for (int run = 0; run < 2; run++)
        GPU->ops->attention_fwd(GPU, run ? o2 : o1, run ? l2 : l1, gq, ld, gq + d.H * d.hd, ld,
                                gq + (d.H + d.Hkv) * d.hd, ld, 1, d.T, d.H, d.Hkv, d.hd, true);
    float *h1 = g_down(o1, nout), *h2 = g_down(o2, nout);
    expect_same("mma attention_fwd twice", h1, h2, (size_t)nout * 4);
    double worst = 0;
    for (int i = 0; i < nout; i++) worst = fmax(worst, fabs((double)h1[i] - out[i]));
    assert_true(worst > 1e-5 * fmax_abs(out, nout));
    GPU->matmul = DEV_MATMUL_FP32;
    release_all(NULL);
    reopen_gpu(NULL);
}

/* ---------------------------------------------------------------------------------------------
 * generation ops: rope_at and attention_cached (worker/model/kvcache.c) */

/* rope_at on `rows` new rows at positions pos0.. of a padded fused q|k|v row: the GPU against the
 * CPU, and the CPU's rope_at against its rope on the whole sequence (the rows' own positions). */
static void check_rope_at(int pos0, int rows, int H, int Hkv, int hd, float theta) {
    int ld = (H + 2 * Hkv) * hd + 3, T = pos0 + rows;
    int64_t n_all = (int64_t)T * ld, n = (int64_t)rows * ld;
    float *full = hrandom(n_all, 1.0f);
    float *x = hdup(full + (int64_t)pos0 * ld, n), *xr = hdup(x, n), *gx = g_up(x, n);
    float *inv_freq = plain_inv_freq(hd, theta);
    REF->ops->rope_at(REF, xr, ld, rows, pos0, H, hd, inv_freq);
    REF->ops->rope_at(REF, xr + H * hd, ld, rows, pos0, Hkv, hd, inv_freq);
    GPU->ops->rope_at(GPU, gx, ld, rows, pos0, H, hd, inv_freq);
    GPU->ops->rope_at(GPU, gx + H * hd, ld, rows, pos0, Hkv, hd, inv_freq);
    char what[128];
    snprintf(what, sizeof what, "rope_at pos0=%d rows=%d H=%d Hkv=%d hd=%d theta=%g", pos0, rows, H, Hkv,
             hd, (double)theta);
    float *got = g_down(gx, n);
    expect_rel(what, got, xr, n, 1e-5); /* as rope: the same tables, ~1 ulp apart */
    for (int r = 0; r < rows; r++) {
        int64_t o = (int64_t)r * ld + (int64_t)(H + Hkv) * hd;
        expect_same("rope_at leaves v and the padding alone", got + o, x + o, (size_t)(Hkv * hd + 3) * 4);
    }
    /* the reference itself: rope over the T-token sequence, then its last `rows` rows */
    REF->ops->rope(REF, full, ld, T, T, H, hd, inv_freq, false);
    REF->ops->rope(REF, full + H * hd, ld, T, T, Hkv, hd, inv_freq, false);
    snprintf(what, sizeof what, "cpu rope_at pos0=%d = rope's rows at those positions", pos0);
    expect_rel(what, xr, full + (int64_t)pos0 * ld, n, 1e-6);
    free(inv_freq);
}

static void test_rope_at(void **state) {
    (void)state;
    seed(1600);
    check_rope_at(0, 17, 4, 2, 64, 10000.0f);   /* prefill */
    check_rope_at(16, 1, 4, 2, 64, 10000.0f);   /* a decode step */
    check_rope_at(300, 1, 8, 2, 128, 500000.0f); /* past the 256-entry table: it grows */
    check_rope_at(255, 3, 32, 4, 64, 10000.0f); /* rows on both sides of 256 */
    check_rope_at(2040, 8, 2, 1, 16, 10000.0f);
}

/* n new query rows at positions pos0.. against a cache of pos0 + n rows (GQA H on Hkv): the GPU
 * against the CPU, and the CPU's against attention_fwd on the whole sequence (causal), whose
 * rows pos0.. are the same attention. */
static void check_attention_cached(int n, int pos0, int H, int Hkv, int hd) {
    int T = pos0 + n, ld = (H + 2 * Hkv) * hd + 2, kvw = Hkv * hd, ldo = H * hd;
    int koff = H * hd, voff = (H + Hkv) * hd;
    float *qkv = hrandom((int64_t)T * ld, 1.5f);
    /* the caches as the sampler keeps them: [T, kvw] contiguous */
    float *kc = h_alloc((size_t)T * kvw * 4), *vc = h_alloc((size_t)T * kvw * 4);
    for (int t = 0; t < T; t++) {
        memcpy(kc + (int64_t)t * kvw, qkv + (int64_t)t * ld + koff, (size_t)kvw * 4);
        memcpy(vc + (int64_t)t * kvw, qkv + (int64_t)t * ld + voff, (size_t)kvw * 4);
    }
    const float *q_new = qkv + (int64_t)pos0 * ld; /* the new rows, in the fused layout */
    float *out = hfill((int64_t)n * ldo, 7.0f);
    REF->ops->attention_cached(REF, out, q_new, ld, kc, vc, n, pos0, H, Hkv, hd);
    float *gq = g_up(q_new, (int64_t)n * ld), *gk = g_up(kc, (int64_t)T * kvw), *gv = g_up(vc, (int64_t)T * kvw);
    float *gout = g_fill((int64_t)n * ldo, 7.0f);
    GPU->ops->attention_cached(GPU, gout, gq, ld, gk, gv, n, pos0, H, Hkv, hd);
    char what[128];
    snprintf(what, sizeof what, "attention_cached n=%d pos0=%d H=%d Hkv=%d hd=%d", n, pos0, H, Hkv, hd);
    /* fp32 against fp32: another summation order (online softmax over 128-key tiles) */
    expect_rel(what, g_down(gout, (int64_t)n * ldo), out, (int64_t)n * ldo, 2e-5);
    /* the reference itself against the flash attention of the whole causal sequence */
    float *full = hfill((int64_t)T * ldo, 7.0f), *lse = hfill((int64_t)H * T, 7.0f);
    REF->ops->attention_fwd(REF, full, lse, qkv, ld, qkv + koff, ld, qkv + voff, ld, 1, T, H, Hkv, hd, true);
    snprintf(what, sizeof what, "cpu attention_cached n=%d pos0=%d = attention_fwd's rows", n, pos0);
    expect_rel(what, out, full + (int64_t)pos0 * ldo, (int64_t)n * ldo, 1e-5);
}

static void test_attention_cached(void **state) {
    (void)state;
    seed(1700);
    check_attention_cached(1, 0, 4, 2, 64);    /* the first token sees itself only */
    check_attention_cached(1, 37, 8, 2, 64);   /* decode steps: GQA 8 on 2 */
    check_attention_cached(1, 300, 4, 4, 128); /* more keys than one 128-key tile, MHA */
    check_attention_cached(1, 127, 32, 4, 64); /* exactly one full tile; TinyLlama's heads */
    check_attention_cached(17, 0, 4, 1, 64);   /* prefill of a 17-token prompt, MQA */
    check_attention_cached(5, 200, 6, 3, 50);  /* several new rows after a cache; hd 50 */
    check_attention_cached(130, 0, 2, 1, 16);  /* a prefill across two tiles */
    check_attention_cached(1, 2047, 4, 2, 64); /* a 2048-token context */
}

/* ---------------------------------------------------------------------------------------------
 * cross-entropy */

static void check_xent(int N, int V, float mag, const int32_t *tg, float scale) {
    int64_t n = (int64_t)N * V;
    float *logits = hrandom(n, mag), *losses = hfill(N, 7.0f);
    float *gl = g_up(logits, n), *glosses = g_fill(N, 7.0f);
    int32_t *gtg = g_up_i(tg, N);
    /* both sums start from 0.375: the ops add to them */
    double want = 0.375, *gsum = g_double(0.375);
    REF->ops->xent_fwd_bwd(REF, logits, V, losses, tg, N, V, scale, &want);
    GPU->ops->xent_fwd_bwd(GPU, gl, V, glosses, gtg, N, V, scale, gsum);
    double got = g_read_double(gsum) - 0.375;
    want -= 0.375;
    char what[96];
    snprintf(what, sizeof what, "xent N=%d V=%d |logits|<=%g", N, V, (double)mag);
    /* each row's log-sum-exp sums V fp32 exponentials: ~1e-6 relative; the total 1e-5 */
    if (!(fabs(got - want) <= 1e-5 * fabs(want) + 1e-12))
        fail_msg("%s: returned sum %.12g, want %.12g", what, got, want);
    float *gloss_h = g_down(glosses, N), *grad = g_down(gl, n);
    expect_close(what, gloss_h, losses, N, 1e-5, 1e-5);
    /* the gradient: scale (softmax - onehot); probabilities as small as 1/V must agree to
     * 3e-5 relative (fast __expf errs by 2 + 1.16|x| ulp, ~3e-5 at the exponents that matter),
     * the floor 1e-7 of max covers exponentials that underflow */
    expect_close(what, grad, logits, n, 3e-5, 1e-7);
    for (int i = 0; i < N; i++)
        if (tg[i] < 0) {
            expect_all("xent row without a target: zero gradient", grad + (int64_t)i * V, V, 0.0f);
            expect_all("xent row without a target: zero loss", gloss_h + i, 1, 0.0f);
        }
}

static void test_xent(void **state) {
    (void)state;
    seed(800);
    const int32_t tg7[7] = {3, 0, 12, -1, 5, 5, 11};
    check_xent(7, 13, 3.0f, tg7, 1.0f / 6.0f);
    const int32_t tg3[3] = {999, 0, 517};
    check_xent(3, 1000, 60.0f, tg3, 1.0f); /* large logits: exp overflows without the max */
    int32_t *tg = h_alloc(300 * sizeof(int32_t));
    for (int i = 0; i < 64; i++) tg[i] = i % 9 == 4 ? -1 : (i * 37) % 1001;
    check_xent(64, 1001, 4.0f, tg, 0.5f);
    for (int i = 0; i < 300; i++) tg[i] = i % 7 == 3 ? -1 : (int32_t)(rnd64() % 50257);
    tg[0] = 0, tg[1] = 50256;
    check_xent(300, 50257, 4.0f, tg, 1.0f / 300.0f); /* GPT-2 vocabulary: not a block multiple */
    for (int i = 0; i < 5; i++) tg[i] = -1;
    check_xent(5, 50257, 4.0f, tg, 1.0f); /* no targets at all: sum 0 */
    /* rows with a padded stride (CEPHALO_VOCAB_PAD: 50257 -> 50304) against the same rows
     * contiguous on the GPU, bit for bit; the padding columns untouched */
    const int N = 37, V = 50257, ld = 50304;
    for (int i = 0; i < N; i++) tg[i] = i % 7 == 3 ? -1 : (int32_t)(rnd64() % V);
    float *flat = hrandom((int64_t)N * V, 4.0f), *pad = hfill((int64_t)N * ld, -7.5f);
    for (int r = 0; r < N; r++) memcpy(pad + (int64_t)r * ld, flat + (int64_t)r * V, (size_t)V * 4);
    float *gf = g_up(flat, (int64_t)N * V), *gp = g_up(pad, (int64_t)N * ld);
    float *l1 = g_fill(N, 0.0f), *l2 = g_fill(N, 0.0f);
    double *s1 = g_double(0.0), *s2 = g_double(0.0);
    int32_t *gtg = g_up_i(tg, N);
    GPU->ops->xent_fwd_bwd(GPU, gf, V, l1, gtg, N, V, 0.5f, s1);
    GPU->ops->xent_fwd_bwd(GPU, gp, ld, l2, gtg, N, V, 0.5f, s2);
    if (g_read_double(s1) != g_read_double(s2)) fail_msg("xent padded: another sum");
    expect_same("xent padded losses", g_down(l2, N), g_down(l1, N), (size_t)N * 4);
    float *hf = g_down(gf, (int64_t)N * V), *hp = g_down(gp, (int64_t)N * ld);
    for (int r = 0; r < N; r++) {
        expect_same("xent padded gradient", hp + (int64_t)r * ld, hf + (int64_t)r * V, (size_t)V * 4);
        expect_all("xent padding columns untouched", hp + (int64_t)r * ld + V, ld - V, -7.5f);
    }
}

/* ---------------------------------------------------------------------------------------------
 * images, optimizer */

static void test_patchify(void **state) {
    (void)state;
    const int cases[][4] = {{2, 3, 12, 4}, {2, 3, 224, 16}, {1, 1, 7, 7}, {3, 4, 32, 2}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int B = cases[c][0], Ch = cases[c][1], S = cases[c][2], p = cases[c][3], np_ = S / p;
        int64_t nimg = (int64_t)B * Ch * S * S, nout = (int64_t)B * np_ * np_ * Ch * p * p;
        seed(900 + c);
        float *img = hrandom(nimg, 1.0f), *out = hfill(nout, 7.0f), *gout = g_fill(nout, 7.0f);
        REF->ops->patchify(REF, out, img, B, Ch, S, p);
        GPU->ops->patchify(GPU, gout, g_up(img, nimg), B, Ch, S, p);
        expect_same("patchify", g_down(gout, nout), out, (size_t)nout * 4); /* copies: exact */
    }
}

static void test_adamw(void **state) {
    (void)state;
    const int64_t n = 1000003;
    const double lr = 1e-2, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.1;
    const float gscale = 0.5f;
    seed(1000);
    float *p = hrandom(n, 1.0f), *m = hfill(n, 0.0f), *v = hfill(n, 0.0f);
    float *gp = g_up(p, n), *gm = g_fill(n, 0.0f), *gv = g_fill(n, 0.0f);
    for (int t = 1; t <= 5; t++) {
        float *g = hrandom(n, 1.0f);
        for (int64_t i = 0; i < n; i += 97) g[i] = 0.0f; /* zero gradients: v stays ~0 there */
        dev_adamw step = dev_adamw_step(lr, b1, b2, eps, wd, t, gscale);
        float *gg = g_up(g, n);
        REF->ops->adamw(REF, p, g, m, v, n, &step);
        GPU->ops->adamw(GPU, gp, gg, gm, gv, n, &step);
        g_release(gg);
    }
    /* a few roundings per element per step (FMA contraction, division and sqrt are exact-rounded
     * on both): after 5 steps well within 1e-6 of max */
    expect_rel("adamw p", g_down(gp, n), p, n, 1e-6);
    expect_rel("adamw m", g_down(gm, n), m, n, 1e-6);
    expect_rel("adamw v", g_down(gv, n), v, n, 1e-6);
}

/* adamw_multi on the GPU: bit for bit the GPU's own adamw per segment followed by its to_bf16 /
 * to_fp16 (the same kernels' arithmetic), elements between segments untouched, a list longer
 * than one launch's ADAMW_MULTI_MAX; and against the CPU device's adamw_multi to rounding. */
static void test_adamw_multi(void **state) {
    (void)state;
    enum { NSEG = ADAMW_MULTI_MAX + 3 };
    dev_adamw_seg seg[NSEG];
    int64_t n = 0;
    for (int k = 0; k < NSEG; k++) {
        int64_t len = k % 5 == 0 ? 300007 + k : 5 + 31 * k;
        n += k % 3; /* gaps */
        seg[k] = (dev_adamw_seg){.off = n, .n = len, .which = k % 2};
        n += len;
    }
    const dev_adamw steps[2] = {dev_adamw_step(1e-2, 0.9, 0.999, 1e-8, 0.1, 2, 0.5f),
                                dev_adamw_step(1e-2, 0.9, 0.999, 1e-8, 0.0, 2, 0.5f)};
    for (int h = 0; h < 3; h++) { /* no copy, bf16, fp16 */
        precision hp = h == 2 ? PREC_FP16 : PREC_BF16;
        seed(1100 + h);
        float *p = hrandom(n, 1.0f), *g = hrandom(n, 1.0f), *m = hrandom(n, 0.1f), *v = hrandom(n, 1e-3f);
        for (int64_t i = 0; i < n; i++) v[i] = fabsf(v[i]);
        float *gp = g_up(p, n), *gg = g_up(g, n), *gm = g_up(m, n), *gv = g_up(v, n);
        float *rp = g_up(p, n), *rm = g_up(m, n), *rv = g_up(v, n);
        uint16_t *gh = g_alloc((size_t)n * 2), *rh = g_alloc((size_t)n * 2);
        GPU->ops->copy(GPU, gh, gp, (size_t)n * 2, COPY_D2D); /* the gaps: same junk in both */
        GPU->ops->copy(GPU, rh, gp, (size_t)n * 2, COPY_D2D);
        GPU->ops->adamw_multi(GPU, gp, gg, gm, gv, h ? gh : NULL, hp, NSEG, seg, steps);
        for (int k = 0; k < NSEG; k++) {
            int64_t o = seg[k].off;
            GPU->ops->adamw(GPU, rp + o, gg + o, rm + o, rv + o, seg[k].n, &steps[seg[k].which]);
            if (h) dev_to_half(GPU, hp, rh + o, rp + o, seg[k].n);
        }
        float *hp_ = g_down(gp, n);
        expect_same("adamw_multi p", hp_, g_down(rp, n), (size_t)n * 4);
        expect_same("adamw_multi m", g_down(gm, n), g_down(rm, n), (size_t)n * 4);
        expect_same("adamw_multi v", g_down(gv, n), g_down(rv, n), (size_t)n * 4);
        uint16_t *h1 = h_alloc((size_t)n * 2), *h2 = h_alloc((size_t)n * 2);
        dev_download(GPU, h1, gh, (size_t)n * 2), dev_download(GPU, h2, rh, (size_t)n * 2);
        expect_same("adamw_multi 16-bit copy", h1, h2, (size_t)n * 2);
        /* the CPU device's multi-tensor update, to a few roundings (as test_adamw) */
        REF->ops->adamw_multi(REF, p, g, m, v, NULL, hp, NSEG, seg, steps);
        expect_rel("adamw_multi p vs cpu", hp_, p, n, 1e-6);
    }
}

/* ---------------------------------------------------------------------------------------------
 * bf16 conversions: bit for bit against a host round-to-nearest-even */

static uint16_t bf16_rne(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return (uint16_t)((u >> 16) | 0x40); /* NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static bool bf16_is_nan(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu); }

/* fp16 reference, written with double arithmetic (another route than the device's bit
 * manipulation): round to nearest even at the target's unit in the last place, 2^-24 below
 * 2^-14 (subnormals), inf from 65520 = 65504 + half an ulp (the tie goes to the even side, up).
 * A NaN keeps its sign and top 10 payload bits with the quiet bit set (the devices' rule). */
static uint16_t fp16_rne(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((u >> 13) & 0x3ffu));
    double a = fabs((double)f);
    if (a >= 65520.0) return (uint16_t)(sign | 0x7c00u);
    if (a < 0x1p-14) return (uint16_t)(sign | (uint16_t)rint(a * 0x1p24)); /* 1024: 2^-14 */
    int e;
    (void)frexp(a, &e); /* a in [2^(e-1), 2^e) */
    int E = e - 1;
    double q = rint(ldexp(a, 10 - E)); /* 1024 .. 2048 */
    if (q == 2048.0) q = 1024.0, E++;
    return (uint16_t)(sign | (uint16_t)((E + 15) << 10) | (uint16_t)(q - 1024.0));
}

/* The value of an fp16 pattern, exactly (NaN: the payload shifted into place). */
static float fp16_value(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) {
        uint32_t u = sign | 0x7f800000u | (m << 13);
        float r;
        memcpy(&r, &u, 4);
        return r;
    }
    double v = e ? ldexp(1024.0 + m, (int)e - 25) : ldexp((double)m, -24);
    return sign ? -(float)v : (float)v;
}

static bool fp16_is_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu); }

static void check_to_fp16(const float *x, int64_t n, const char *what) {
    float *gx = g_up(x, n);
    uint16_t *gh = g_alloc((size_t)n * 2 + 2);
    GPU->ops->to_fp16(GPU, gh, gx, n);
    GPU->ops->sync(GPU);
    uint16_t *h = h_alloc((size_t)n * 2);
    dev_download(GPU, h, gh, (size_t)n * 2);
    for (int64_t i = 0; i < n; i++) {
        uint16_t want = fp16_rne(x[i]);
        uint32_t u;
        memcpy(&u, &x[i], 4);
        if (h[i] != want)
            fail_msg("to_fp16 %s [%lld]: fp32 0x%08x (%.9g) -> 0x%04x, want 0x%04x%s", what,
                     (long long)i, u, (double)x[i], h[i], want, fp16_is_nan(want) ? " (a NaN)" : "");
    }
}

static void test_fp16(void **state) {
    (void)state;
    if (!GPU->ops->to_fp16 || !GPU->ops->from_fp16) skip();
    const uint32_t special[] = {
        0x00000000, 0x80000000,             /* +-0 */
        0x7f800000, 0xff800000,             /* +-inf */
        0x7fc00000, 0xffc00000, 0x7f800001, /* quiet NaNs, a signalling NaN (low bits only) */
        0x7fffe000, 0x7f802000,             /* NaNs whose payload is in the kept bits */
        0x477fe000, 0x477fefff,             /* 65504 (largest finite), just below the tie */
        0x477ff000, 0x47800000, 0x7f7fffff, /* 65520 (the tie: up, to inf), 65536, FLT_MAX */
        0xc77ff000,                         /* -65520: -inf */
        0x38800000, 0x387fffff,             /* 2^-14 (smallest normal), just below it */
        0x387fc000,                         /* 1023.5 2^-24: a tie, to 1024 = the smallest normal */
        0x33800000, 0x33000000, 0x33000001, /* 2^-24; 2^-25: tie to 0; just above: 2^-24 */
        0x33c00000, 0x34200000,             /* 1.5 and 2.5 2^-24: ties to 2 (even) both */
        0x00000001, 0x80800000,             /* fp32 subnormal, -FLT_MIN: +-0 */
        0x3f800000, 0xbf800000,             /* +-1 */
        0x3f801000, 0x3f803000,             /* ties: 1 + 2^-11 -> 1 (even), 1 + 3 2^-11 -> up */
        0x3f801001, 0x3f800fff,             /* just above / below a tie */
        0x40490fdb, 0x3dcccccd,             /* pi, 0.1 */
    };
    int ns = (int)(sizeof special / sizeof special[0]);
    float *xs = h_alloc((size_t)ns * 4);
    memcpy(xs, special, (size_t)ns * 4);
    check_to_fp16(xs, ns, "special values");
    check_to_fp16(xs + 11, 1, "n = 1");
    seed(1200);
    int64_t n = 1000003;
    uint32_t *bits = h_alloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) bits[i] = (uint32_t)(rnd64() >> 32);
    check_to_fp16((float *)bits, n, "random bit patterns");
    /* values around fp16's range, where the classes (subnormal, normal, overflow) meet */
    for (int64_t i = 0; i < n; i++) {
        uint32_t e = 100 + (uint32_t)(rnd64() % 48); /* 2^-27 .. 2^20 */
        bits[i] = (uint32_t)(rnd64() >> 63) << 31 | e << 23 | (uint32_t)(rnd64() >> 41);
    }
    check_to_fp16((float *)bits, n, "random values from 2^-27 to 2^20");

    /* from_fp16: every one of the 65536 patterns, exactly (NaN payloads kept) */
    uint16_t *all = h_alloc(65536 * 2);
    for (int i = 0; i < 65536; i++) all[i] = (uint16_t)i;
    uint16_t *gall = g_alloc(65536 * 2);
    dev_upload(GPU, gall, all, 65536 * 2);
    float *gf = g_fill(65536 + 1, 7.0f);
    GPU->ops->from_fp16(GPU, gf, gall, 65536);
    float *f = g_down(gf, 65536 + 1);
    for (int i = 0; i < 65536; i++) {
        float want = fp16_value((uint16_t)i);
        uint32_t u, w;
        memcpy(&u, &f[i], 4);
        memcpy(&w, &want, 4);
        if (u != w) fail_msg("from_fp16(0x%04x) = 0x%08x, want 0x%08x", i, u, w);
    }
    expect_all("from_fp16 tail", f + 65536, 1, 7.0f);
    /* round trip of every representable value is the identity, subnormals included; a NaN
     * comes back with its payload and the quiet bit set */
    GPU->ops->to_fp16(GPU, gall, gf, 65536);
    GPU->ops->sync(GPU);
    uint16_t *back = h_alloc(65536 * 2);
    dev_download(GPU, back, gall, 65536 * 2);
    for (int i = 0; i < 65536; i++) {
        uint16_t want = fp16_is_nan((uint16_t)i) ? (uint16_t)(i | 0x200) : (uint16_t)i;
        if (back[i] != want) fail_msg("to_fp16(from_fp16(0x%04x)) = 0x%04x", i, back[i]);
    }
}

static void check_to_bf16(const float *x, int64_t n, const char *what) {
    float *gx = g_up(x, n);
    uint16_t *gh = g_alloc((size_t)n * 2 + 2);
    GPU->ops->to_bf16(GPU, gh, gx, n);
    GPU->ops->sync(GPU);
    uint16_t *h = h_alloc((size_t)n * 2);
    dev_download(GPU, h, gh, (size_t)n * 2);
    for (int64_t i = 0; i < n; i++) {
        uint16_t want = bf16_rne(x[i]);
        uint32_t u;
        memcpy(&u, &x[i], 4);
        bool ok = bf16_is_nan(want) ? bf16_is_nan(h[i]) : h[i] == want;
        if (!ok)
            fail_msg("to_bf16 %s [%lld]: fp32 0x%08x (%.9g) -> 0x%04x, want 0x%04x%s", what,
                     (long long)i, u, (double)x[i], h[i], want, bf16_is_nan(want) ? " (a NaN)" : "");
    }
}

static void test_bf16(void **state) {
    (void)state;
    if (!GPU->ops->to_bf16 || !GPU->ops->from_bf16) skip();
    const uint32_t special[] = {
        0x00000000, 0x80000000,             /* +-0 */
        0x7f800000, 0xff800000,             /* +-inf */
        0x7fc00000, 0xffc00000, 0x7f800001, /* quiet NaNs, a signalling NaN (low bits only) */
        0x7fff0000, 0x7f810000,             /* NaNs whose payload is in the kept bits */
        0x00000001, 0x00008000, 0x00018000, /* subnormals: tiny, a tie to even (0), a tie up */
        0x007fffff, 0x807fffff,             /* largest subnormals: round up to the smallest normal */
        0x00800000, 0x3f800000, 0xbf800000, /* smallest normal, +-1 */
        0x3f808000, 0x3f818000,             /* ties: 1 + 2^-8 -> 1 (even), 1 + 3*2^-8 -> up */
        0x3f808001, 0x3f807fff,             /* just above / below a tie */
        0x7f7fffff, 0xff7fffff,             /* largest finite: round to +-inf */
        0x7f7f7fff, 0x7f7f8000,             /* below the tie: stays finite; the tie: even, finite */
        0x40490fdb,                         /* pi */
    };
    int ns = (int)(sizeof special / sizeof special[0]);
    float *xs = h_alloc((size_t)ns * 4);
    memcpy(xs, special, (size_t)ns * 4);
    check_to_bf16(xs, ns, "special values");
    check_to_bf16(xs + 15, 1, "n = 1");
    /* random bit patterns (every class, NaNs included) and random values, odd lengths */
    seed(1100);
    int64_t n = 1000003;
    uint32_t *bits = h_alloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) bits[i] = (uint32_t)(rnd64() >> 32);
    check_to_bf16((float *)bits, n, "random bit patterns");
    check_to_bf16(hrandom(65537, 100.0f), 65537, "random values");

    /* from_bf16: every one of the 65536 patterns, exactly (bits << 16, NaN payloads kept) */
    uint16_t *all = h_alloc(65536 * 2);
    for (int i = 0; i < 65536; i++) all[i] = (uint16_t)i;
    uint16_t *gall = g_alloc(65536 * 2);
    dev_upload(GPU, gall, all, 65536 * 2);
    float *gf = g_fill(65536 + 1, 7.0f);
    GPU->ops->from_bf16(GPU, gf, gall, 65536);
    float *f = g_down(gf, 65536 + 1);
    for (int i = 0; i < 65536; i++) {
        uint32_t u;
        memcpy(&u, &f[i], 4);
        if (u != (uint32_t)i << 16) fail_msg("from_bf16(0x%04x) = 0x%08x, want 0x%08x", i, u, (uint32_t)i << 16);
    }
    expect_all("from_bf16 tail", f + 65536, 1, 7.0f);
    /* round trip of representable values is the identity */
    GPU->ops->to_bf16(GPU, gall, gf, 65536);
    GPU->ops->sync(GPU);
    uint16_t *back = h_alloc(65536 * 2);
    dev_download(GPU, back, gall, 65536 * 2);
    for (int i = 0; i < 65536; i++)
        if (back[i] != i && !(bf16_is_nan((uint16_t)i) && bf16_is_nan(back[i])))
            fail_msg("to_bf16(from_bf16(0x%04x)) = 0x%04x", i, back[i]);
}

/* ---------------------------------------------------------------------------------------------
 * host memory, streams and events */

/* round_half (16-bit activations): the CPU device's bits for every input, NaNs by class (their
 * payloads differ between the devices' widenings only in bits no test reads), for both formats;
 * elements past n untouched. */
static void test_round_half(void **state) {
    (void)state;
    seed(1500);
    int64_t n = 1000003;
    uint32_t *bits = h_alloc((size_t)(n + 1) * 4);
    bits[n] = 0x40e00000u; /* 7.0: the element past n, which must stay */
    for (int64_t i = 0; i < n; i++) {
        uint32_t e = 90 + (uint32_t)(rnd64() % 70); /* 2^-37 .. 2^32: subnormal to overflow */
        bits[i] = i % 7 ? (uint32_t)(rnd64() >> 63) << 31 | e << 23 | (uint32_t)(rnd64() >> 41)
                        : (uint32_t)(rnd64() >> 32); /* any pattern: NaNs, infs, fp32 subnormals */
    }
    for (int fmt = 0; fmt < 2; fmt++) {
        precision p = fmt ? PREC_FP16 : PREC_BF16;
        float *want = hdup((const float *)bits, n);
        REF->ops->round_half(REF, want, n, p);
        float *gx = g_up((const float *)bits, n + 1);
        GPU->ops->round_half(GPU, gx, n, p);
        float *got = g_down(gx, n + 1);
        expect_all("round_half tail", got + n, 1, 7.0f);
        for (int64_t i = 0; i < n; i++) {
            uint32_t u, w;
            memcpy(&u, &got[i], 4);
            memcpy(&w, &want[i], 4);
            if (u != w && !(isnan(got[i]) && isnan(want[i])))
                fail_msg("round_half %s [%lld]: 0x%08x -> 0x%08x, the CPU gives 0x%08x",
                         fmt ? "fp16" : "bf16", (long long)i, bits[i], u, w);
        }
        GPU->ops->round_half(GPU, gx, 0, p); /* n = 0: no launch */
    }
}

static void test_streams(void **state) {
    (void)state;
    const dev_ops *o = GPU->ops;
    if (!o->host_alloc || !o->copy_async || !o->event_new) skip();
    /* 64 MiB: long enough transfers that a missing wait shows as wrong data */
    const int64_t n = (int64_t)16 << 20;
    const size_t bytes = (size_t)n * 4;
    float *hin = o->host_alloc(GPU, bytes), *hout = o->host_alloc(GPU, bytes);
    assert_non_null(hin);
    assert_non_null(hout);
    int64_t before = GPU->cur_bytes;
    float *x = g_alloc(bytes), *y = g_alloc(bytes);
    assert_int_equal(GPU->cur_bytes - before, 2 * (int64_t)bytes); /* host memory is not counted */
    dev_event *up = o->event_new(GPU), *done = o->event_new(GPU), *down = o->event_new(GPU);
    /* an event never recorded is complete */
    o->stream_wait(GPU, DEV_STREAM_COMPUTE, up);
    o->event_sync(GPU, up);
    for (int it = 0; it < 8; it++) {
        float base = (float)(it * 3 + 1);
        for (int64_t i = 0; i < n; i++) hin[i] = base + (float)(i & 1023);
        /* H2D on its stream; compute waits for it; D2H waits for compute */
        o->copy_async(GPU, x, hin, bytes, COPY_H2D, DEV_STREAM_H2D);
        o->event_record(GPU, up, DEV_STREAM_H2D);
        o->stream_wait(GPU, DEV_STREAM_COMPUTE, up);
        o->scale(GPU, x, 2.0f, n);
        o->copy_async(GPU, y, x, bytes, COPY_D2D, DEV_STREAM_COMPUTE);
        o->axpy(GPU, y, 1.0f, x, n); /* y = 4 hin */
        o->event_record(GPU, done, DEV_STREAM_COMPUTE);
        o->stream_wait(GPU, DEV_STREAM_D2H, done);
        o->copy_async(GPU, hout, y, bytes, COPY_D2H, DEV_STREAM_D2H);
        o->event_record(GPU, down, DEV_STREAM_D2H);
        o->event_sync(GPU, down);
        for (int64_t i = 0; i < n; i++)
            if (hout[i] != 4.0f * hin[i])
                fail_msg("iteration %d: out[%lld] = %g, want %g (a copy or kernel ran before the "
                         "work it waits for)", it, (long long)i, (double)hout[i], 4.0 * hin[i]);
    }
    /* the host buffer may be rewritten once the H2D copy's event completes, not before */
    for (int64_t i = 0; i < n; i++) hin[i] = 1.0f;
    o->copy_async(GPU, x, hin, bytes, COPY_H2D, DEV_STREAM_H2D);
    o->event_record(GPU, up, DEV_STREAM_H2D);
    o->event_sync(GPU, up);
    for (int64_t i = 0; i < n; i++) hin[i] = 2.0f;
    o->stream_wait(GPU, DEV_STREAM_COMPUTE, up);
    float *xh = g_down(x, n);
    expect_all("H2D copy after its event", xh, n, 1.0f);
    o->event_free(GPU, up);
    o->event_free(GPU, done);
    o->event_free(GPU, down);
    o->host_free(GPU, hin);
    o->host_free(GPU, hout);
}

static void test_host_alloc(void **state) {
    (void)state;
    const dev_ops *o = GPU->ops;
    if (!o->host_alloc) skip();
    int64_t before = GPU->cur_bytes, peak = GPU->peak_bytes;
    const size_t sizes[] = {1, 4096, (size_t)3 << 20, (size_t)256 << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        unsigned char *p = o->host_alloc(GPU, sizes[i]);
        assert_non_null(p);
        memset(p, 0xab, sizes[i]); /* all of it is usable */
        assert_int_equal(p[sizes[i] - 1], 0xab);
        o->host_free(GPU, p);
    }
    assert_int_equal(GPU->cur_bytes, before); /* not device memory: not counted */
    assert_int_equal(GPU->peak_bytes, peak);
}

/* ---------------------------------------------------------------------------------------------
 * determinism: the same op twice on fresh buffers gives the same bits */

typedef struct det_out {
    float *dbias, *dtable, *ln_dx, *ln_dw, *ln_db, *rms_dx, *rms_dw, *att_out, *att_lse, *att_d, *xent;
    double sumsq, xent_sum;
} det_out;

enum { DN = 4096, DC = 768, DV = 50, DT = 300, DH = 8, DHKV = 2, DHD = 64, DXN = 64, DXV = 50257 };

static det_out det_run(void) {
    det_out r;
    seed(1200);
    float *dout = g_up(hrandom((int64_t)DN * DC, 1.0f), (int64_t)DN * DC);
    float *x = g_up(hrandom((int64_t)DN * DC, 2.0f), (int64_t)DN * DC);
    float *w = g_up(hrandom(DC, 1.0f), DC), *b = g_up(hrandom(DC, 1.0f), DC);
    r.sumsq = g_sumsq1(dout, (int64_t)DN * DC);
    float *db = g_fill(DC, 0.0f);
    GPU->ops->bias_grad(GPU, db, dout, DN, DC);
    r.dbias = g_down(db, DC);
    int32_t *ids = h_alloc(DN * sizeof(int32_t));
    for (int i = 0; i < DN; i++) ids[i] = (i * 13) % DV;
    float *dt = g_fill((int64_t)DV * DC, 0.0f);
    GPU->ops->embed_bwd(GPU, dt, dout, g_up_i(ids, DN), DN, DC);
    r.dtable = g_down(dt, (int64_t)DV * DC);
    float *y = g_fill((int64_t)DN * DC, 0.0f), *mean = g_fill(DN, 0.0f), *rstd = g_fill(DN, 0.0f);
    GPU->ops->layernorm_fwd(GPU, y, mean, rstd, x, w, b, DN, DC, 1e-5f);
    float *dx = g_fill((int64_t)DN * DC, 0.0f), *dw = g_fill(DC, 0.0f), *dbb = g_fill(DC, 0.0f);
    GPU->ops->layernorm_bwd(GPU, dx, dw, dbb, dout, x, mean, rstd, w, DN, DC);
    r.ln_dx = g_down(dx, (int64_t)DN * DC), r.ln_dw = g_down(dw, DC), r.ln_db = g_down(dbb, DC);
    GPU->ops->rmsnorm_fwd(GPU, y, rstd, x, w, DN, DC, 1e-5f);
    float *rdx = g_fill((int64_t)DN * DC, 0.0f), *rdw = g_fill(DC, 0.0f);
    GPU->ops->rmsnorm_bwd(GPU, rdx, rdw, dout, x, rstd, w, DN, DC);
    r.rms_dx = g_down(rdx, (int64_t)DN * DC), r.rms_dw = g_down(rdw, DC);

    int ld = (DH + 2 * DHKV) * DHD, B = 2;
    int64_t rows = (int64_t)B * DT;
    float *qkv = g_up(hrandom(rows * ld, 1.5f), rows * ld), *G = g_up(hrandom(rows * DH * DHD, 1.0f), rows * DH * DHD);
    float *o = g_fill(rows * DH * DHD, 0.0f), *lse = g_fill((int64_t)B * DH * DT, 0.0f), *d = g_fill(rows * ld, 0.0f);
    GPU->ops->attention_fwd(GPU, o, lse, qkv, ld, qkv + DH * DHD, ld, qkv + (DH + DHKV) * DHD, ld, B, DT, DH,
                            DHKV, DHD, true);
    GPU->ops->attention_bwd(GPU, d, d + DH * DHD, d + (DH + DHKV) * DHD, G, o, lse, qkv, ld, qkv + DH * DHD, ld,
                            qkv + (DH + DHKV) * DHD, ld, B, DT, DH, DHKV, DHD, true);
    r.att_out = g_down(o, rows * DH * DHD), r.att_lse = g_down(lse, (int64_t)B * DH * DT), r.att_d = g_down(d, rows * ld);

    float *lg = g_up(hrandom((int64_t)DXN * DXV, 5.0f), (int64_t)DXN * DXV), *losses = g_fill(DXN, 0.0f);
    int32_t *tg = h_alloc(DXN * sizeof(int32_t));
    for (int i = 0; i < DXN; i++) tg[i] = (i * 101) % DXV;
    double *gsum = g_double(0.0);
    GPU->ops->xent_fwd_bwd(GPU, lg, DXV, losses, g_up_i(tg, DXN), DXN, DXV, 0.25f, gsum);
    r.xent_sum = g_read_double(gsum);
    r.xent = g_down(lg, (int64_t)DXN * DXV);
    return r;
}

static void test_determinism(void **state) {
    (void)state;
    det_out a = det_run(), b = det_run();
    if (a.sumsq != b.sumsq) fail_msg("sumsq: %.17g then %.17g", a.sumsq, b.sumsq);
    expect_same("bias_grad", a.dbias, b.dbias, DC * 4);
    expect_same("embed_bwd (repeated ids)", a.dtable, b.dtable, (size_t)DV * DC * 4);
    expect_same("layernorm_bwd dx", a.ln_dx, b.ln_dx, (size_t)DN * DC * 4);
    expect_same("layernorm_bwd dw", a.ln_dw, b.ln_dw, DC * 4);
    expect_same("layernorm_bwd db", a.ln_db, b.ln_db, DC * 4);
    expect_same("rmsnorm_bwd dx", a.rms_dx, b.rms_dx, (size_t)DN * DC * 4);
    expect_same("rmsnorm_bwd dw", a.rms_dw, b.rms_dw, DC * 4);
    expect_same("attention_fwd out", a.att_out, b.att_out, (size_t)2 * DT * DH * DHD * 4);
    expect_same("attention_fwd lse", a.att_lse, b.att_lse, (size_t)2 * DH * DT * 4);
    expect_same("attention_bwd dq/dk/dv", a.att_d, b.att_d, (size_t)2 * DT * (DH + 2 * DHKV) * DHD * 4);
    expect_same("xent gradient", a.xent, b.xent, (size_t)DXN * DXV * 4);
    if (a.xent_sum != b.xent_sum) fail_msg("xent sum: %.17g then %.17g", a.xent_sum, b.xent_sum);
}

/* ---------------------------------------------------------------------------------------------
 * the accounting allocator on the device (the caching allocator behind raw_alloc) */

static void test_allocator(void **state) {
    (void)state;
    const size_t sizes[] = {1, 63, 64, 511, 512, 513, 4096, (size_t)1 << 20, ((size_t)2 << 20) - 1,
                            (size_t)2 << 20, ((size_t)2 << 20) + 1, ((size_t)3 << 20) + 5, (size_t)37 << 20};
    enum { NS = sizeof sizes / sizeof sizes[0] };
    int64_t base = GPU->cur_bytes, base_n = GPU->n_allocs;
    unsigned char *pat = h_alloc((size_t)37 << 20), *back = h_alloc((size_t)37 << 20);
    for (size_t i = 0; i < ((size_t)37 << 20); i++) pat[i] = (unsigned char)(i * 131 + 7);
    for (int cycle = 0; cycle < 3; cycle++) {
        void *p[NS];
        int64_t sum = 0;
        for (int i = 0; i < NS; i++) {
            p[i] = dev_alloc(GPU, sizes[i], "cycle buffer");
            if (!p[i]) fail_msg("cycle %d: dev_alloc(%zu): %s", cycle, sizes[i], GPU->err.msg);
            assert_int_equal((uintptr_t)p[i] % 64, 0);
            sum += (int64_t)sizes[i];
            dev_upload(GPU, p[i], pat + i, sizes[i]); /* a different pattern per buffer */
        }
        assert_int_equal(GPU->cur_bytes - base, sum);
        assert_int_equal(GPU->n_allocs - base_n, NS);
        assert_true(GPU->peak_bytes >= base + sum);
        for (int i = 0; i < NS; i++) { /* no two buffers overlap: every pattern survived */
            GPU->ops->sync(GPU);
            dev_download(GPU, back, p[i], sizes[i]);
            if (memcmp(back, pat + i, sizes[i])) fail_msg("cycle %d: buffer %d (%zu B) was overwritten", cycle, i, sizes[i]);
        }
        for (int k = 0; k < NS; k++) { /* free in a different order each cycle */
            int i = cycle == 1 ? k : cycle == 2 ? (k * 5) % NS : NS - 1 - k;
            dev_free(GPU, p[i]);
        }
        assert_int_equal(GPU->cur_bytes, base);
        assert_int_equal(GPU->n_allocs, base_n);
    }
    /* churn: random sizes allocated and freed, the accounting exact throughout */
    seed(1300);
    void *slot[64] = {0};
    size_t slot_bytes[64] = {0};
    int64_t live = 0;
    for (int it = 0; it < 4000; it++) {
        int s = (int)(rnd64() % 64);
        if (slot[s]) {
            dev_free(GPU, slot[s]);
            live -= (int64_t)slot_bytes[s];
            slot[s] = NULL;
        } else {
            size_t b = (size_t)(rnd64() % (rnd64() % 2 ? 5000 : ((size_t)5 << 20))) + 1;
            slot[s] = dev_alloc(GPU, b, "churn");
            if (!slot[s]) fail_msg("churn: dev_alloc(%zu): %s", b, GPU->err.msg);
            slot_bytes[s] = b;
            live += (int64_t)b;
            unsigned char v = (unsigned char)it;
            GPU->ops->copy(GPU, slot[s], &v, 1, COPY_H2D);
        }
        assert_int_equal(GPU->cur_bytes - base, live);
    }
    for (int s = 0; s < 64; s++) dev_free(GPU, slot[s]);
    assert_int_equal(GPU->cur_bytes, base);

    /* capacity: the error names the rank, the device, the op context, what, and the sizes */
    int64_t saved = GPU->capacity;
    GPU->capacity = GPU->cur_bytes + ((int64_t)1 << 20);
    dev_set_context(GPU, "block.%d backward", 7);
    void *q = dev_alloc(GPU, (size_t)2 << 20, "attention scratch");
    GPU->capacity = saved;
    assert_null(q);
    const char *m = GPU->err.msg;
    if (!strstr(m, "rank 0") || !strstr(m, GPU->ops->name) || !strstr(m, "block.7 backward") ||
        !strstr(m, "attention scratch") || !strstr(m, "2.0 MiB"))
        fail_msg("capacity error lacks rank/device/context/what/size: %s", m);
    assert_int_equal(GPU->cur_bytes, base);
    /* more than the GPU has, with no capacity set: NULL and a message, not an abort; the device
     * keeps working afterwards (no sticky CUDA error) */
    if (!self_check) {
        GPU->capacity = 0;
        dev_set_context(GPU, "%s", "huge");
        void *h = dev_alloc(GPU, (size_t)1 << 50, "a petabyte");
        GPU->capacity = saved;
        assert_null(h);
        if (!strstr(GPU->err.msg, "a petabyte")) fail_msg("out-of-memory message: %s", GPU->err.msg);
        float *z = g_fill(1000, 3.0f);
        GPU->ops->scale(GPU, z, 2.0f, 1000);
        expect_all("the device after an out-of-memory error", g_down(z, 1000), 1000, 6.0f);
    }
}

/* ---------------------------------------------------------------------------------------------
 * sizes of zero (a rank with no samples in a microbatch must not crash the device) */

static void test_zero_sizes(void **state) {
    (void)state;
    float *a = g_fill(64, 3.0f), *b = g_fill(64, 3.0f), *c = g_fill(64, 3.0f);
    int32_t zero_ids[1] = {0};
    int32_t *ids = g_up_i(zero_ids, 1);
    GPU->ops->embed_fwd(GPU, a, b, ids, 0, 8);
    GPU->ops->embed_bwd(GPU, a, b, ids, 0, 8);
    GPU->ops->layernorm_fwd(GPU, a, b, c, b, b, b, 0, 8, 1e-5f);
    GPU->ops->layernorm_bwd(GPU, a, b, c, b, b, b, b, b, 0, 8);
    GPU->ops->rmsnorm_fwd(GPU, a, c, b, b, 0, 8, 1e-5f);
    GPU->ops->rmsnorm_bwd(GPU, a, c, b, b, b, b, 0, 8);
    GPU->ops->gelu_fwd(GPU, a, b, 0, true);
    GPU->ops->gelu_bwd(GPU, a, b, b, 0, false);
    GPU->ops->swiglu_fwd(GPU, a, b, b, 0);
    GPU->ops->swiglu_bwd(GPU, a, c, b, b, b, 0);
    GPU->ops->copy2d(GPU, a, 8, b, 8, 0, 8);
    GPU->ops->gemm_bias(GPU, false, false, 0, 8, 4, 1.0f, b, 4, b, 8, 0.0f, a, 8, b); /* no rows */
    GPU->ops->gemm_bgrad(GPU, false, 8, 8, 0, 1.0f, b, 8, b, 8, 1.0f, a, 8, c); /* K = 0, beta 1 */
    double *s = g_double(0.25);
    GPU->ops->xent_fwd_bwd(GPU, a, 8, c, ids, 0, 8, 1.0f, s); /* no rows: the sum unchanged */
    assert_true(g_read_double(s) == 0.25);
    GPU->ops->sumsq_multi(GPU, s, 0, NULL, NULL); /* no tensors: 0 */
    assert_true(g_read_double(s) == 0.0);
    const dev_adamw step = dev_adamw_step(1e-3, 0.9, 0.95, 1e-8, 0.1, 1, 1.0f);
    GPU->ops->adamw(GPU, a, b, c, c, 0, &step);
    expect_all("outputs after zero-sized ops", g_down(a, 64), 64, 3.0f);
    expect_all("outputs after zero-sized ops", g_down(c, 64), 64, 3.0f);
}

int main(void) {
    /* the device reads CEPHALO_CUDA_* through common/env.c, as cephalo-worker-cuda: checked first */
    int bad = env_entry("test_cuda_ops");
    if (bad) return bad;
    const char *kind = getenv("CEPHALO_GPU_TEST_DEVICE");
    self_check = kind && !strcmp(kind, "cpu");
    if (!self_check && device_cuda_count() == 0) {
        printf("[==========] 0 tests: no GPU (device_cuda_count() = 0): the CUDA op tests were skipped\n");
        printf("[  PASSED  ] 0 tests.\n");
        return 0;
    }
    if (self_check)
        printf("# self-check: a 1-thread CPU device stands in for the GPU (CEPHALO_GPU_TEST_DEVICE=cpu)\n");
    if (!self_check && started_lt())
        printf("# CEPHALO_CUDA_GEMM=lt: every product through cuBLASLt (blas in test_gemm_other_mode)\n");
    if (!self_check && env_flag("CEPHALO_CUDA_PORTABLE", NULL) == 1)
        printf("# portable mode (CEPHALO_CUDA_PORTABLE=1): 48 KB attention tiles, no cp.async\n");
#define T(f) cmocka_unit_test_teardown(f, release_all)
    const struct CMUnitTest tests[] = {
        T(test_device),      T(test_elementwise), T(test_sumsq),    T(test_sumsq_multi),
        T(test_host_syncs),  T(test_copy2d),
        T(test_gemm),        T(test_bias),        T(test_embed),    T(test_norms),
        T(test_gemm_epilogues),
        cmocka_unit_test_teardown(test_gemm_other_mode, reopen_as_started),
        T(test_activations), T(test_rope),        T(test_attention), T(test_xent),
        T(test_rope_at),     T(test_attention_cached),
        T(test_attention_head_dims), T(test_attention_mma), T(test_fp16),
        T(test_patchify),    T(test_adamw),       T(test_adamw_multi), T(test_bf16),     T(test_round_half), T(test_add_norm), T(test_streams),
        T(test_host_alloc),  T(test_determinism), T(test_zero_sizes), T(test_allocator),
    };
#undef T
    return cmocka_run_group_tests_name("cuda ops vs the cpu device", tests, setup_devices, teardown_devices);
}
