/* cpu_device.c - the CPU device: OpenBLAS for the matrix products, OpenMP for everything else.
 *
 * Determinism (device.h): every parallel loop is a static schedule over independent outputs, and
 * every reduction has one order fixed by the source. Row reductions use the fixed-lane helpers of
 * cpu_internal.h; column sums (bias, norm weights, embedding rows) are split into column blocks,
 * each owned by one thread that walks the rows in order; sumsq sums fixed-size chunks and adds
 * the partials in chunk order. Most results are therefore identical for any thread count, not
 * only for the same one.
 *
 * OpenBLAS is the OpenMP build: called inside one of our parallel regions it runs on the calling
 * thread only, called outside it uses d->threads threads. The attention kernels live in
 * cpu_attention.c. */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "common/half.h"
#include "common/log.h"
#include "devices/cpu_internal.h"
#include "devices/device.h"

/* The CPU device's state: the rotary cos/sin table of the last (T, inv_freq), reused across the
 * rope calls of a step (computing it costs T*hd/2 sin/cos pairs). Like every op, rope is called
 * from the one host thread that drives the device, so the cache needs no lock. */
typedef struct cpu_state {
    int rope_T, rope_hd;
    float *rope_freq; /* [hd/2]: the inv_freq the table was made from */
    float *rope_cos, *rope_sin; /* [T, hd/2] */
} cpu_state;

static int imin(int a, int b) { return a < b ? a : b; }

/* ---------------------------------------------------------------------------------------------
 * memory */

static void *cpu_raw_alloc(device *d, size_t bytes) {
    (void)d;
    /* aligned_alloc wants a size that is a multiple of the alignment */
    size_t rounded = (bytes + 63) & ~(size_t)63;
    if (rounded < bytes) return NULL; /* overflow */
    return aligned_alloc(64, rounded);
}

static void cpu_raw_free(device *d, void *p, size_t bytes) {
    (void)d, (void)bytes;
    free(p);
}

/* Host waits are counted where the CUDA device waits (device.h host_syncs): a copy from or to
 * the host, a sync, an event sync. */
static void cpu_copy(device *d, void *dst, const void *src, size_t bytes, copy_kind kind) {
    /* host and device memory are the same memory */
    if (!bytes) return;
    memmove(dst, src, bytes);
    if (kind != COPY_D2D) d->host_syncs++;
}

static void cpu_sync(device *d) { d->host_syncs++; }

/* ---------------------------------------------------------------------------------------------
 * host memory, streams and events: the CPU has one memory and runs every op at once, in issue
 * order, so copies happen when queued and events are always complete. The trainer's offload
 * schedule (train.c) is therefore exercised on the CPU with the same calls as on CUDA. */

struct dev_event {
    int unused;
};

static void *cpu_host_alloc(device *d, size_t bytes) { return cpu_raw_alloc(d, bytes); }

static void cpu_host_free(device *d, void *p) {
    (void)d;
    free(p);
}

static void cpu_copy_async(device *d, void *dst, const void *src, size_t bytes, copy_kind kind,
                           dev_stream s) {
    (void)d, (void)s, (void)kind; /* queued copies never make the host wait on CUDA */
    if (bytes) memmove(dst, src, bytes);
}

static dev_event *cpu_event_new(device *d) {
    (void)d;
    return xcalloc(1, sizeof(dev_event));
}

static void cpu_event_free(device *d, dev_event *e) {
    (void)d;
    free(e);
}

static void cpu_event_record(device *d, dev_event *e, dev_stream s) { (void)d, (void)e, (void)s; }
static void cpu_stream_wait(device *d, dev_stream s, dev_event *e) { (void)d, (void)e, (void)s; }
static void cpu_event_sync(device *d, dev_event *e) {
    (void)e;
    d->host_syncs++;
}

static void *cpu_native_stream(device *d, dev_stream s) {
    (void)d, (void)s;
    return NULL;
}

/* ---------------------------------------------------------------------------------------------
 * bf16 and fp16 (common/half.h: nearest-even rounding, exact widening) */

static void cpu_to_bf16(device *d, uint16_t *out, const float *in, int64_t n) {
#pragma omp parallel for simd schedule(static) num_threads(d->threads) if (n > CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) out[i] = half_bf16_round(in[i]);
}

static void cpu_from_bf16(device *d, float *out, const uint16_t *in, int64_t n) {
#pragma omp parallel for simd schedule(static) num_threads(d->threads) if (n > CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) out[i] = half_bf16_widen(in[i]);
}

static void cpu_to_fp16(device *d, uint16_t *out, const float *in, int64_t n) {
#pragma omp parallel for simd schedule(static) num_threads(d->threads) if (n > CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) out[i] = half_fp16_round(in[i]);
}

static void cpu_from_fp16(device *d, float *out, const uint16_t *in, int64_t n) {
#pragma omp parallel for simd schedule(static) num_threads(d->threads) if (n > CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) out[i] = half_fp16_widen(in[i]);
}

/* x[n] = its value in p's 16-bit format (round_half, one thread's part). */
static void round_span(float *x, int64_t n, precision p) {
    CHECK(p == PREC_BF16 || p == PREC_FP16);
    if (p == PREC_BF16)
        for (int64_t i = 0; i < n; i++) x[i] = half_bf16_value(x[i]);
    else
        for (int64_t i = 0; i < n; i++) x[i] = half_fp16_value(x[i]);
}

static void cpu_round_half(device *d, float *x, int64_t n, precision p) {
    const int64_t span = 1 << 14, spans = (n + span - 1) / span;
#pragma omp parallel for schedule(static) num_threads(d->threads) if (n > CPU_PAR_MIN)
    for (int64_t s = 0; s < spans; s++) round_span(x + s * span, n - s * span < span ? n - s * span : span, p);
}

/* ---------------------------------------------------------------------------------------------
 * elementwise and reductions. Outputs may alias inputs index for index (out == a in a residual
 * add), so no restrict here; the loops are still vectorised. */

static void cpu_fill(device *d, float *x, float v, int64_t n) {
#pragma omp parallel for simd schedule(static) num_threads(d->threads) if (n > CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) x[i] = v;
}

static void cpu_add(device *d, float *out, const float *a, const float *b, int64_t n) {
#pragma omp parallel for simd schedule(static) num_threads(d->threads) if (n > CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

static void cpu_axpy(device *d, float *y, float alpha, const float *x, int64_t n) {
#pragma omp parallel for simd schedule(static) num_threads(d->threads) if (n > CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) y[i] += alpha * x[i];
}

static void cpu_scale(device *d, float *x, float s, int64_t n) {
#pragma omp parallel for simd schedule(static) num_threads(d->threads) if (n > CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}

/* Fixed chunks (not one per thread) so the sum is the same for every thread count. */
#define SUMSQ_CHUNK 65536

static double cpu_sumsq(device *d, const float *x, int64_t n) {
    int64_t nchunks = (n + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK;
    double *part = xmalloc((size_t)(nchunks ? nchunks : 1) * sizeof(double));
#pragma omp parallel for schedule(static) num_threads(d->threads) if (nchunks > 1)
    for (int64_t c = 0; c < nchunks; c++) {
        int64_t lo = c * SUMSQ_CHUNK, hi = lo + SUMSQ_CHUNK < n ? lo + SUMSQ_CHUNK : n;
        double acc[CPU_LANES] = {0};
        int64_t i = lo;
        for (; i + CPU_LANES <= hi; i += CPU_LANES)
            for (int l = 0; l < CPU_LANES; l++) acc[l] += (double)x[i + l] * x[i + l];
        for (int l = 0; i < hi; i++, l++) acc[l] += (double)x[i] * x[i];
        double s = 0;
        for (int l = 0; l < CPU_LANES; l++) s += acc[l];
        part[c] = s;
    }
    double total = 0;
    for (int64_t c = 0; c < nchunks; c++) total += part[c];
    free(part);
    return total;
}

static void cpu_sumsq_multi(device *d, double *out, int count, const float *const *x,
                            const int64_t *n) {
    double total = 0; /* tensors in list order */
    for (int i = 0; i < count; i++) total += n[i] > 0 ? cpu_sumsq(d, x[i], n[i]) : 0.0;
    *out = total;
}

static void cpu_copy2d(device *d, float *out, int ldo, const float *src, int lds, int rows,
                       int cols) {
#pragma omp parallel for schedule(static) num_threads(d->threads) \
    if ((int64_t)rows * cols > CPU_PAR_MIN)
    for (int r = 0; r < rows; r++)
        memmove(out + (int64_t)r * ldo, src + (int64_t)r * lds, (size_t)cols * sizeof(float));
}

/* ---------------------------------------------------------------------------------------------
 * matrix products */

/* A copy of a [rows, cols] block (leading dimension ld) with every value rounded to bf16 (fp16)
 * and widened back: the operand a 16-bit tensor-core product sees. Host scratch, outside the
 * device capacity (like the attention kernels' per-thread scratch). */
static float *half_operand(device *d, const float *x, int rows, int cols, int ld, bool fp16) {
    float *out = xmalloc((size_t)rows * (size_t)cols * sizeof(float));
#pragma omp parallel for schedule(static) num_threads(d->threads) \
    if ((int64_t)rows * cols > CPU_PAR_MIN)
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            float v = x[(int64_t)r * ld + c];
            out[(int64_t)r * cols + c] = fp16 ? half_fp16_value(v) : half_bf16_value(v);
        }
    return out;
}

static void cpu_gemm(device *d, bool ta, bool tb, int M, int N, int K, float alpha, const float *A,
                     int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    /* OpenBLAS was given d->threads at init */
    if (M == 0 || N == 0) return;
    if ((d->matmul == DEV_MATMUL_BF16 || d->matmul == DEV_MATMUL_FP16) && K > 0) {
        /* bf16 (fp16) products are exact in fp32 (8 + 8, 11 + 11 significant bits), so sgemm on
         * the rounded operands computes what 16-bit tensor cores do, up to the order of the fp32
         * sums */
        bool fp16 = d->matmul == DEV_MATMUL_FP16;
        int ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
        float *a16 = half_operand(d, A, ar, ac, lda, fp16), *b16 = half_operand(d, B, br, bc, ldb, fp16);
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                    M, N, K, alpha, a16, ac, b16, bc, beta, C, ldc);
        free(a16), free(b16);
        return;
    }
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M,
                N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* x[N,C] += b[C] */
static void cpu_add_bias(device *d, float *x, const float *b, int N, int C) {
#pragma omp parallel for schedule(static) num_threads(d->threads) \
    if ((int64_t)N * C > CPU_PAR_MIN)
    for (int n = 0; n < N; n++) {
        float *restrict row = x + (int64_t)n * C;
        const float *restrict bb = b;
#pragma omp simd
        for (int c = 0; c < C; c++) row[c] += bb[c];
    }
}

/* Column sums are split in blocks of COL_BLOCK columns; one thread owns a block and walks the
 * rows in order, so each sum has a fixed order and the inner loop is a contiguous vector add. */
#define COL_BLOCK 32

/* db[C] += sum over rows of dout[N,C] */
static void cpu_bias_grad(device *d, float *db, const float *dout, int N, int C) {
    int nblk = (C + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for schedule(static) num_threads(d->threads) \
    if ((int64_t)N * C > CPU_PAR_MIN)
    for (int blk = 0; blk < nblk; blk++) {
        int c0 = blk * COL_BLOCK, w = imin(COL_BLOCK, C - c0);
        float acc[COL_BLOCK] = {0};
        for (int n = 0; n < N; n++) {
            const float *restrict row = dout + (int64_t)n * C + c0;
#pragma omp simd
            for (int c = 0; c < w; c++) acc[c] += row[c];
        }
        for (int c = 0; c < w; c++) db[c0 + c] += acc[c];
    }
}

/* gemm, then add_bias on each row of C (one call when C is contiguous): what the model did
 * before the op existed, bit for bit */
static void cpu_gemm_bias(device *d, bool ta, bool tb, int M, int N, int K, float alpha,
                          const float *A, int lda, const float *B, int ldb, float beta, float *C,
                          int ldc, const float *bias) {
    cpu_gemm(d, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    if (M <= 0 || N <= 0) return;
    if (ldc == N) cpu_add_bias(d, C, bias, M, N);
    else
        for (int m = 0; m < M; m++) cpu_add_bias(d, C + (int64_t)m * ldc, bias, 1, N);
}

/* gemm (A transposed), then bias_grad over A's K rows of M */
static void cpu_gemm_bgrad(device *d, bool tb, int M, int N, int K, float alpha, const float *A,
                           int lda, const float *B, int ldb, float beta, float *C, int ldc,
                           float *db) {
    CHECK(lda == M); /* device.h: A is [K, M] contiguous */
    cpu_gemm(d, true, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    cpu_bias_grad(d, db, A, K, M);
}

/* ---------------------------------------------------------------------------------------------
 * embeddings */

/* out[N,C] = table[ids[n], :] */
static void cpu_embed_fwd(device *d, float *out, const float *table, const int32_t *ids, int N,
                          int C) {
#pragma omp parallel for schedule(static) num_threads(d->threads) \
    if ((int64_t)N * C > CPU_PAR_MIN)
    for (int n = 0; n < N; n++)
        memcpy(out + (int64_t)n * C, table + (int64_t)ids[n] * C, (size_t)C * sizeof(float));
}

/* dtable[ids[n], :] += dout[n, :]. Repeated ids would race if rows were split across threads;
 * columns are split instead, and each thread adds the tokens in order. */
static void cpu_embed_bwd(device *d, float *dtable, const float *dout, const int32_t *ids, int N,
                          int C) {
    int nblk = (C + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for schedule(static) num_threads(d->threads) \
    if ((int64_t)N * C > CPU_PAR_MIN)
    for (int blk = 0; blk < nblk; blk++) {
        int c0 = blk * COL_BLOCK, w = imin(COL_BLOCK, C - c0);
        for (int n = 0; n < N; n++) {
            float *restrict dst = dtable + (int64_t)ids[n] * C + c0;
            const float *restrict src = dout + (int64_t)n * C + c0;
#pragma omp simd
            for (int c = 0; c < w; c++) dst[c] += src[c];
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * normalisations */

/* One row of layer norm (mean != NULL) or RMS norm (mean == NULL, b unused): the row code of
 * layernorm_fwd, rmsnorm_fwd and add_norm_fwd alike, so that the fused op gives their bits.
 * Layer norm: out = (x - mean) * rstd * w + b, two passes over the row (mean, then the centred
 * variance: no cancellation as in E[x^2] - mean^2). RMS norm: out = x * rstd * w. */
static inline void norm_row(float *restrict o, float *mean, float *rstd, const float *restrict xr,
                            const float *w, const float *b, int C, float eps) {
    if (!mean) {
        float s = 1.0f / sqrtf(vdot(xr, xr, C) / (float)C + eps);
#pragma omp simd
        for (int i = 0; i < C; i++) o[i] = xr[i] * s * w[i];
        *rstd = s;
        return;
    }
    float m = vsum(xr, C) / (float)C;
    float acc[CPU_LANES] = {0};
    int c = 0;
    for (; c + CPU_LANES <= C; c += CPU_LANES)
        for (int l = 0; l < CPU_LANES; l++) acc[l] += (xr[c + l] - m) * (xr[c + l] - m);
    for (int l = 0; c < C; c++, l++) acc[l] += (xr[c] - m) * (xr[c] - m);
    float s = 1.0f / sqrtf(lanes_total(acc) / (float)C + eps);
#pragma omp simd
    for (int i = 0; i < C; i++) o[i] = (xr[i] - m) * s * w[i] + b[i];
    *mean = m;
    *rstd = s;
}

static void cpu_layernorm_fwd(device *d, float *out, float *mean, float *rstd, const float *x,
                              const float *w, const float *b, int N, int C, float eps) {
#pragma omp parallel for schedule(static) num_threads(d->threads) \
    if ((int64_t)N * C > CPU_PAR_MIN)
    for (int n = 0; n < N; n++)
        norm_row(out + (int64_t)n * C, mean + n, rstd + n, x + (int64_t)n * C, w, b, C, eps);
}

/* sum = a + b, then its norm, a row at a time (the row is still in cache for the statistics);
 * out rounded to hp's 16-bit format unless hp is PREC_FP32. */
static void cpu_add_norm_fwd(device *d, float *sum, float *out, float *mean, float *rstd,
                             const float *a, const float *b, const float *w, const float *bias,
                             int N, int C, float eps, precision hp) {
#pragma omp parallel for schedule(static) num_threads(d->threads) \
    if ((int64_t)N * C > CPU_PAR_MIN)
    for (int n = 0; n < N; n++) {
        int64_t r = (int64_t)n * C;
        float *sr = sum + r, *o = out + r; /* sum may alias a or b, element for element */
#pragma omp simd
        for (int i = 0; i < C; i++) sr[i] = a[r + i] + b[r + i];
        norm_row(o, mean ? mean + n : NULL, rstd + n, sr, w, bias, C, eps);
        if (hp != PREC_FP32) round_span(o, C, hp);
    }
}

/* Weight gradients of the norms: dw[c] += sum_n dout[n,c] * xhat[n,c] (and db[c] += sum_n
 * dout[n,c] when db), xhat = (x - mean) * rstd (mean NULL: rmsnorm, xhat = x * rstd).
 * Column blocks as in bias_grad. */
static void norm_weight_grads(device *d, float *dw, float *db, const float *dout, const float *x,
                              const float *mean, const float *rstd, int N, int C) {
    int nblk = (C + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for schedule(static) num_threads(d->threads) \
    if ((int64_t)N * C > CPU_PAR_MIN)
    for (int blk = 0; blk < nblk; blk++) {
        int c0 = blk * COL_BLOCK, w = imin(COL_BLOCK, C - c0);
        float accw[COL_BLOCK] = {0}, accb[COL_BLOCK] = {0};
        for (int n = 0; n < N; n++) {
            const float *restrict g = dout + (int64_t)n * C + c0;
            const float *restrict xr = x + (int64_t)n * C + c0;
            float m = mean ? mean[n] : 0.0f, s = rstd[n];
#pragma omp simd
            for (int c = 0; c < w; c++) {
                accw[c] += g[c] * ((xr[c] - m) * s);
                accb[c] += g[c];
            }
        }
        for (int c = 0; c < w; c++) dw[c0 + c] += accw[c];
        if (db)
            for (int c = 0; c < w; c++) db[c0 + c] += accb[c];
    }
}

/* dx += rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat)), dnorm = dout * w. */
static void cpu_layernorm_bwd(device *d, float *dx, float *dw, float *db, const float *dout,
                              const float *x, const float *mean, const float *rstd,
                              const float *w, int N, int C) {
#pragma omp parallel for schedule(static) num_threads(d->threads) \
    if ((int64_t)N * C > CPU_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const float *restrict g = dout + (int64_t)n * C;
        const float *restrict xr = x + (int64_t)n * C;
        float *restrict dxr = dx + (int64_t)n * C;
        float m = mean[n], s = rstd[n];
        float acc_g[CPU_LANES] = {0}, acc_gx[CPU_LANES] = {0};
        int c = 0;
        for (; c + CPU_LANES <= C; c += CPU_LANES)
            for (int l = 0; l < CPU_LANES; l++) {
                float dn = g[c + l] * w[c + l];
                acc_g[l] += dn;
                acc_gx[l] += dn * ((xr[c + l] - m) * s);
            }
        for (int l = 0; c < C; c++, l++) {
            float dn = g[c] * w[c];
            acc_g[l] += dn;
            acc_gx[l] += dn * ((xr[c] - m) * s);
        }
        float dn_mean = lanes_total(acc_g) / (float)C;
        float dnx_mean = lanes_total(acc_gx) / (float)C;
#pragma omp simd
        for (int i = 0; i < C; i++) {
            float xhat = (xr[i] - m) * s;
            dxr[i] += (g[i] * w[i] - dn_mean - xhat * dnx_mean) * s;
        }
    }
    norm_weight_grads(d, dw, db, dout, x, mean, rstd, N, C);
}

/* out = x * rstd * w (Llama's order: normalise, then scale). */
static void cpu_rmsnorm_fwd(device *d, float *out, float *rstd, const float *x, const float *w,
                            int N, int C, float eps) {
#pragma omp parallel for schedule(static) num_threads(d->threads) \
    if ((int64_t)N * C > CPU_PAR_MIN)
    for (int n = 0; n < N; n++)
        norm_row(out + (int64_t)n * C, NULL, rstd + n, x + (int64_t)n * C, w, NULL, C, eps);
}

/* dx += rstd * (dnorm - xhat * mean(dnorm * xhat)), dnorm = dout * w, xhat = x * rstd. */
static void cpu_rmsnorm_bwd(device *d, float *dx, float *dw, const float *dout, const float *x,
                            const float *rstd, const float *w, int N, int C) {
#pragma omp parallel for schedule(static) num_threads(d->threads) \
    if ((int64_t)N * C > CPU_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const float *restrict g = dout + (int64_t)n * C;
        const float *restrict xr = x + (int64_t)n * C;
        float *restrict dxr = dx + (int64_t)n * C;
        float s = rstd[n];
        float acc[CPU_LANES] = {0};
        int c = 0;
        for (; c + CPU_LANES <= C; c += CPU_LANES)
            for (int l = 0; l < CPU_LANES; l++) acc[l] += g[c + l] * w[c + l] * (xr[c + l] * s);
        for (int l = 0; c < C; c++, l++) acc[l] += g[c] * w[c] * (xr[c] * s);
        float dnx_mean = lanes_total(acc) / (float)C;
#pragma omp simd
        for (int i = 0; i < C; i++) dxr[i] += (g[i] * w[i] - (xr[i] * s) * dnx_mean) * s;
    }
    norm_weight_grads(d, dw, NULL, dout, x, NULL, rstd, N, C);
}

/* ---------------------------------------------------------------------------------------------
 * activations */

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f
#define INV_SQRT2 0.7071067811865476f
#define INV_SQRT_2PI 0.3989422804014327f

/* The span functions compute one chunk; the ops below spread the chunks over the threads. */

/* tanh form: 0.5 x (1 + tanh(y)) = x * sigmoid(2y), y = sqrt(2/pi) (x + 0.044715 x^3). The
 * sigmoid form has no cancellation for negative x (1 + tanh(y) would lose digits there) and needs
 * one exp. */
static CPU_HOT void gelu_tanh_fwd_span(float *out, const float *x, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        float xi = x[i];
        float y = GELU_K * (xi + GELU_A * xi * xi * xi);
        out[i] = xi / (1.0f + exp_fast(-2.0f * y));
    }
}

static void gelu_erf_fwd_span(float *out, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = 0.5f * x[i] * (1.0f + erff(x[i] * INV_SQRT2));
}

/* d/dx [x * sig(2y)] = sig + 2 x sig (1 - sig) y'(x), y' = sqrt(2/pi) (1 + 3a x^2). */
static CPU_HOT void gelu_tanh_bwd_span(float *dx, const float *x, const float *dout, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        float xi = x[i];
        float y = GELU_K * (xi + GELU_A * xi * xi * xi);
        float dy = GELU_K * (1.0f + 3.0f * GELU_A * xi * xi);
        float sig = 1.0f / (1.0f + exp_fast(-2.0f * y));
        dx[i] = dout[i] * (sig + 2.0f * xi * sig * (1.0f - sig) * dy);
    }
}

/* d/dx [x Phi(x)] = Phi(x) + x phi(x) */
static void gelu_erf_bwd_span(float *dx, const float *x, const float *dout, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float xi = x[i];
        float cdf = 0.5f * (1.0f + erff(xi * INV_SQRT2));
        float pdf = INV_SQRT_2PI * exp_fast(-0.5f * xi * xi);
        dx[i] = dout[i] * (cdf + xi * pdf);
    }
}

/* out = silu(g) * u = g * sigmoid(g) * u */
static CPU_HOT void swiglu_fwd_span(float *out, const float *g, const float *u, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        float sig = 1.0f / (1.0f + exp_fast(-g[i]));
        out[i] = g[i] * sig * u[i];
    }
}

/* dg = dout * u * sig * (1 + g (1 - sig)), du = dout * silu(g) */
static CPU_HOT void swiglu_bwd_span(float *dg, float *du, const float *dout, const float *g,
                                    const float *u, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i], ui = u[i], go = dout[i]; /* read all before writing: dg may alias g */
        float sig = 1.0f / (1.0f + exp_fast(-gi));
        dg[i] = go * ui * sig * (1.0f + gi * (1.0f - sig));
        du[i] = go * gi * sig;
    }
}

static int64_t n_chunks(int64_t n) { return (n + CPU_CHUNK - 1) / CPU_CHUNK; }
static int64_t chunk_len(int64_t c, int64_t n) {
    return n - c * CPU_CHUNK < CPU_CHUNK ? n - c * CPU_CHUNK : CPU_CHUNK;
}

static void cpu_gelu_fwd(device *d, float *out, const float *x, int64_t n, bool tanh_approx) {
    int64_t nc = n_chunks(n);
#pragma omp parallel for schedule(static) num_threads(d->threads) if (n > CPU_PAR_MIN)
    for (int64_t c = 0; c < nc; c++) {
        int64_t lo = c * CPU_CHUNK, len = chunk_len(c, n);
        if (tanh_approx) gelu_tanh_fwd_span(out + lo, x + lo, len);
        else gelu_erf_fwd_span(out + lo, x + lo, len);
    }
}

static void cpu_gelu_bwd(device *d, float *dx, const float *x, const float *dout, int64_t n,
                         bool tanh_approx) {
    int64_t nc = n_chunks(n);
#pragma omp parallel for schedule(static) num_threads(d->threads) if (n > CPU_PAR_MIN)
    for (int64_t c = 0; c < nc; c++) {
        int64_t lo = c * CPU_CHUNK, len = chunk_len(c, n);
        if (tanh_approx) gelu_tanh_bwd_span(dx + lo, x + lo, dout + lo, len);
        else gelu_erf_bwd_span(dx + lo, x + lo, dout + lo, len);
    }
}

static void cpu_swiglu_fwd(device *d, float *out, const float *g, const float *u, int64_t n) {
    int64_t nc = n_chunks(n);
#pragma omp parallel for schedule(static) num_threads(d->threads) if (n > CPU_PAR_MIN)
    for (int64_t c = 0; c < nc; c++) {
        int64_t lo = c * CPU_CHUNK;
        swiglu_fwd_span(out + lo, g + lo, u + lo, chunk_len(c, n));
    }
}

static void cpu_swiglu_bwd(device *d, float *dg, float *du, const float *dout, const float *g,
                           const float *u, int64_t n) {
    int64_t nc = n_chunks(n);
#pragma omp parallel for schedule(static) num_threads(d->threads) if (n > CPU_PAR_MIN)
    for (int64_t c = 0; c < nc; c++) {
        int64_t lo = c * CPU_CHUNK;
        swiglu_bwd_span(dg + lo, du + lo, dout + lo, g + lo, u + lo, chunk_len(c, n));
    }
}

/* ---------------------------------------------------------------------------------------------
 * rotary embedding: the table of dev_rope_table (PyTorch's fp32 angles), cached per (T, hd,
 * inv_freq). */

/* Whether the table holds inv_freq's angles for hd (at any T). */
static bool rope_same(const cpu_state *st, int hd, const float *inv_freq) {
    return st->rope_cos && st->rope_hd == hd && !memcmp(st->rope_freq, inv_freq, (size_t)(hd / 2) * sizeof(float));
}

static void rope_table(device *d, int T, int hd, const float *inv_freq) {
    cpu_state *st = d->impl;
    if (st->rope_T == T && rope_same(st, hd, inv_freq)) return;
    free(st->rope_cos), free(st->rope_sin), free(st->rope_freq);
    int half = hd / 2;
    st->rope_cos = xmalloc((size_t)T * half * sizeof(float));
    st->rope_sin = xmalloc((size_t)T * half * sizeof(float));
    st->rope_freq = xmalloc((size_t)half * sizeof(float));
    memcpy(st->rope_freq, inv_freq, (size_t)half * sizeof(float));
    st->rope_T = T, st->rope_hd = hd;
    dev_rope_table(inv_freq, T, hd, st->rope_cos, st->rope_sin);
}

/* Rotate-half: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin) per head, in place; inverse uses
 * -sin, which is also the backward (the rotation's transpose). */
static void cpu_rope(device *d, float *x, int ldx, int rows, int T, int n_heads, int hd,
                     const float *inv_freq, bool inverse) {
    CHECK(hd % 2 == 0 && T > 0);
    rope_table(d, T, hd, inv_freq);
    const cpu_state *st = d->impl;
    int half = hd / 2;
    float sign = inverse ? -1.0f : 1.0f;
#pragma omp parallel for schedule(static) num_threads(d->threads) \
    if ((int64_t)rows * n_heads * hd > CPU_PAR_MIN)
    for (int r = 0; r < rows; r++) {
        const float *restrict cs = st->rope_cos + (int64_t)(r % T) * half;
        const float *restrict sn = st->rope_sin + (int64_t)(r % T) * half;
        for (int h = 0; h < n_heads; h++) {
            float *restrict x1 = x + (int64_t)r * ldx + (int64_t)h * hd;
            float *restrict x2 = x1 + half; /* disjoint halves of the head */
#pragma omp simd
            for (int i = 0; i < half; i++) {
                float a = x1[i], b = x2[i], c = cs[i], s = sign * sn[i];
                x1[i] = a * c - b * s;
                x2[i] = b * c + a * s;
            }
        }
    }
}

/* rope for rows at positions pos0 + r (generation, docs/sample.md). The table is kept at a
 * power of two >= the positions needed, so a decode step that needs one position more does not
 * rebuild it; entry t depends on t alone, so any table at least that long gives the same bits. */
static void cpu_rope_at(device *d, float *x, int ldx, int rows, int pos0, int n_heads, int hd,
                        const float *inv_freq) {
    CHECK(hd % 2 == 0 && pos0 >= 0 && rows >= 0);
    if (rows == 0) return;
    const cpu_state *st = d->impl;
    int need = pos0 + rows;
    if (!rope_same(st, hd, inv_freq) || st->rope_T < need) {
        int T = 256;
        while (T < need) T *= 2;
        rope_table(d, T, hd, inv_freq);
    }
    int half = hd / 2;
#pragma omp parallel for schedule(static) num_threads(d->threads) \
    if ((int64_t)rows * n_heads * hd > CPU_PAR_MIN)
    for (int r = 0; r < rows; r++) {
        const float *restrict cs = st->rope_cos + (int64_t)(pos0 + r) * half;
        const float *restrict sn = st->rope_sin + (int64_t)(pos0 + r) * half;
        for (int h = 0; h < n_heads; h++) {
            float *restrict x1 = x + (int64_t)r * ldx + (int64_t)h * hd;
            float *restrict x2 = x1 + half;
#pragma omp simd
            for (int i = 0; i < half; i++) {
                float a = x1[i], b = x2[i], c = cs[i], s = sn[i];
                x1[i] = a * c - b * s;
                x2[i] = b * c + a * s;
            }
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * fused softmax cross-entropy */

/* One row: loss = logsumexp(x) - x[target]; x becomes scale * (softmax(x) - onehot(target)).
 * Returns the loss in double. */
static CPU_HOT double xent_row(float *restrict x, int target, int V, float scale) {
    float xt = x[target];
    float m = vmax(x, V);
#pragma omp simd
    for (int j = 0; j < V; j++) x[j] = exp_fast(x[j] - m);
    float sum = vsum(x, V);
    float s = scale / sum;
#pragma omp simd
    for (int j = 0; j < V; j++) x[j] *= s;
    x[target] -= scale;
    return log((double)sum) + (double)m - (double)xt;
}

static void cpu_xent_fwd_bwd(device *d, float *logits, int ld, float *losses,
                             const int32_t *targets, int N, int V, float scale, double *loss_sum) {
    CHECK(ld >= V);
    double *row_loss = xmalloc((size_t)(N > 0 ? N : 1) * sizeof(double));
#pragma omp parallel for schedule(static) num_threads(d->threads) \
    if ((int64_t)N * V > CPU_PAR_MIN)
    for (int n = 0; n < N; n++) {
        float *x = logits + (int64_t)n * ld;
        int t = targets[n];
        CHECK(t < V); /* the data loader checks token ids against the vocabulary */
        if (t < 0) {
            memset(x, 0, (size_t)V * sizeof(float));
            row_loss[n] = 0;
        } else {
            row_loss[n] = xent_row(x, t, V, scale);
        }
        losses[n] = (float)row_loss[n];
    }
    double total = 0; /* rows in order: the same sum for any thread count */
    for (int n = 0; n < N; n++) total += row_loss[n];
    free(row_loss);
    *loss_sum += (double)scale * total;
}

/* ---------------------------------------------------------------------------------------------
 * images */

/* img [B, C, S, S] -> out [B * (S/p)^2, C*p*p]; patch (py, px) of image b is row
 * b*(S/p)^2 + py*(S/p) + px, flattened (c, y, x). */
static void cpu_patchify(device *d, float *out, const float *img, int B, int C, int S, int p) {
    CHECK(p > 0 && S % p == 0);
    int np = S / p, rows = B * np * np, cols = C * p * p;
#pragma omp parallel for schedule(static) num_threads(d->threads) \
    if ((int64_t)rows * cols > CPU_PAR_MIN)
    for (int r = 0; r < rows; r++) {
        int b = r / (np * np), py = (r / np) % np, px = r % np;
        float *o = out + (int64_t)r * cols;
        for (int c = 0; c < C; c++)
            for (int y = 0; y < p; y++) {
                const float *src =
                    img + (((int64_t)b * C + c) * S + (int64_t)py * p + y) * S + (int64_t)px * p;
                memcpy(o + ((int64_t)c * p + y) * p, src, (size_t)p * sizeof(float));
            }
    }
}

/* ---------------------------------------------------------------------------------------------
 * optimizer */

/* AdamW in the order of operations of torch.optim.AdamW (single-tensor path), so a run agrees
 * with PyTorch to rounding: p *= 1 - lr*wd; m = m*b1 + (1-b1)*g; v = v*b2 + ((1-b2)*g)*g;
 * denom = sqrt(v) / sqrt(bc2) + eps; p += (-(lr/bc1) * m) / denom. The scalars are formed in
 * double and rounded to float once, as PyTorch does with its Python-float hyperparameters. */
static inline float adamw_elem(float *p, float g, float *m, float *v, const dev_adamw *a) {
    float gi = g * a->gscale;
    float mi = *m * a->b1 + a->one_m_b1 * gi;
    float vi = *v * a->b2 + (a->one_m_b2 * gi) * gi;
    float denom = sqrtf(vi) / a->bc2_sqrt + a->eps;
    float pi = *p * a->decay + (a->neg_step * mi) / denom;
    *p = pi, *m = mi, *v = vi;
    return pi;
}

static void cpu_adamw(device *d, float *p, const float *g, float *m, float *v, int64_t n, const dev_adamw *a) {
    const dev_adamw s = *a;
#pragma omp parallel for simd schedule(static) num_threads(d->threads) if (n > CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) adamw_elem(p + i, g[i], m + i, v + i, &s);
}

/* The same element update as cpu_adamw (adamw_elem), segment by segment; the 16-bit copy is
 * rounded from the value just stored, as to_bf16/to_fp16 would round it afterwards. */
static void cpu_adamw_multi(device *d, float *p, const float *g, float *m, float *v, uint16_t *half,
                            precision hp, int count, const dev_adamw_seg *seg, const dev_adamw *steps) {
    CHECK(count >= 0 && (!half || precision_half(hp)));
    const bool fp16 = hp == PREC_FP16;
    for (int k = 0; k < count; k++) {
        CHECK(seg[k].which == 0 || seg[k].which == 1);
        const dev_adamw s = steps[seg[k].which];
        const int64_t o = seg[k].off, n = seg[k].n;
        if (!half) {
#pragma omp parallel for simd schedule(static) num_threads(d->threads) if (n > CPU_PAR_MIN)
            for (int64_t i = o; i < o + n; i++) adamw_elem(p + i, g[i], m + i, v + i, &s);
            continue;
        }
#pragma omp parallel for schedule(static) num_threads(d->threads) if (n > CPU_PAR_MIN)
        for (int64_t i = o; i < o + n; i++) {
            float pi = adamw_elem(p + i, g[i], m + i, v + i, &s);
            half[i] = fp16 ? half_fp16_round(pi) : half_bf16_round(pi);
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * the op table and the device */

static const dev_ops cpu_ops = {
    .name = "cpu",
    .raw_alloc = cpu_raw_alloc,
    .raw_free = cpu_raw_free,
    .copy = cpu_copy,
    .sync = cpu_sync,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_host_free,
    .copy_async = cpu_copy_async,
    .event_new = cpu_event_new,
    .event_free = cpu_event_free,
    .event_record = cpu_event_record,
    .stream_wait = cpu_stream_wait,
    .event_sync = cpu_event_sync,
    .native_stream = cpu_native_stream,
    .to_bf16 = cpu_to_bf16,
    .from_bf16 = cpu_from_bf16,
    .to_fp16 = cpu_to_fp16,
    .round_half = cpu_round_half,
    .add_norm_fwd = cpu_add_norm_fwd,
    .from_fp16 = cpu_from_fp16,
    .fill = cpu_fill,
    .add = cpu_add,
    .axpy = cpu_axpy,
    .scale = cpu_scale,
    .sumsq_multi = cpu_sumsq_multi,
    .copy2d = cpu_copy2d,
    .gemm = cpu_gemm,
    .add_bias = cpu_add_bias,
    .bias_grad = cpu_bias_grad,
    .gemm_bias = cpu_gemm_bias,
    .gemm_bgrad = cpu_gemm_bgrad,
    .embed_fwd = cpu_embed_fwd,
    .embed_bwd = cpu_embed_bwd,
    .layernorm_fwd = cpu_layernorm_fwd,
    .layernorm_bwd = cpu_layernorm_bwd,
    .rmsnorm_fwd = cpu_rmsnorm_fwd,
    .rmsnorm_bwd = cpu_rmsnorm_bwd,
    .gelu_fwd = cpu_gelu_fwd,
    .gelu_bwd = cpu_gelu_bwd,
    .swiglu_fwd = cpu_swiglu_fwd,
    .swiglu_bwd = cpu_swiglu_bwd,
    .rope = cpu_rope,
    .attention_fwd = cpu_attention_fwd,
    .attention_bwd = cpu_attention_bwd,
    .rope_at = cpu_rope_at,
    .attention_cached = cpu_attention_cached,
    .xent_fwd_bwd = cpu_xent_fwd_bwd,
    .patchify = cpu_patchify,
    .adamw = cpu_adamw,
    .adamw_multi = cpu_adamw_multi,
};

int cpu_device_init(device *d, int rank, int threads, int64_t capacity, err_t *err) {
    if (threads < 0) return err_set(err, "cpu device: threads must be >= 0 (got %d)", threads);
    if (capacity < 0)
        return err_set(err, "cpu device: capacity must be >= 0 bytes (got %lld)",
                       (long long)capacity);
    memset(d, 0, sizeof *d);
    if (threads == 0) threads = omp_get_num_procs();
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);
    d->ops = &cpu_ops;
    d->rank = rank;
    d->threads = threads;
    d->capacity = capacity;
    d->impl = xcalloc(1, sizeof(cpu_state));
    return 0;
}

void cpu_device_close(device *d) {
    cpu_state *st = d->impl;
    if (st) {
        free(st->rope_cos);
        free(st->rope_sin);
        free(st->rope_freq);
        free(st);
    }
    d->impl = NULL;
    dev_free_table(d);
}

/* The "cpu" row of the device kinds (device.h), in every binary. */
static int cpu_kind_init(device *d, int rank, int threads, int gpu, int64_t capacity, err_t *err) {
    (void)gpu;
    return cpu_device_init(d, rank, threads, capacity, err);
}

static int cpu_kind_count(void) { return 1; } /* the host */

const device_kind cpu_device_kind = {
    .name = "cpu", .init = cpu_kind_init, .close = cpu_device_close, .count = cpu_kind_count};
