/* cuda_norm.cu - the CUDA device's normalisations (layer norm, RMS norm, the fused residual add
 * and norm) and the column sums their weight gradients and bias_grad share. */
#include <math.h>

#include "devices/cuda_internal.h"

/* Rows per block of the warp-per-row kernels (norms). */
#define ROWS_PER_BLOCK 8

/* ---------------------------------------------------------------------------------------------
 * column sums (bias_grad, the norms' dw/db): the N rows are cut into fixed chunks; thread (c,
 * chunk) sums its chunk's rows in order into partials[chunk, c] (coalesced: neighbouring threads
 * read neighbouring columns), then one thread per column adds the chunks in order. The chunking
 * depends on N and C only, so the sums are reproducible. */

#define COLSUM_THREADS 256
#define COLSUM_MAX_CHUNKS 1024

/* Rows per chunk: enough chunks for ~2^18 threads in all, at least 32 rows a chunk. */
static int colsum_rows_per_chunk(int N, int C) {
    int64_t chunks = ((int64_t)1 << 18) / C;
    int64_t by_rows = ((int64_t)N + 31) / 32;
    if (chunks > by_rows) chunks = by_rows;
    if (chunks > COLSUM_MAX_CHUNKS) chunks = COLSUM_MAX_CHUNKS;
    if (chunks < 1) chunks = 1;
    return (int)((N + chunks - 1) / chunks);
}

/* pb[chunk, c] = sum of g[n, c]; pw[chunk, c] (when x) = sum of g[n, c] * xhat[n, c], xhat =
 * (x - mean) * rstd (mean NULL: rmsnorm, xhat = x * rstd). */
__global__ void colsum_partial_kernel(float *pw, float *pb, const float *g, const float *x,
                                      const float *mean, const float *rstd, int N, int C,
                                      int rows_per_chunk) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    int n0 = blockIdx.y * rows_per_chunk, n1 = min(N, n0 + rows_per_chunk);
    float accw = 0.0f, accb = 0.0f;
    for (int n = n0; n < n1; n++) {
        int64_t i = (int64_t)n * C + c;
        accb += g[i];
        if (x) accw += g[i] * ((x[i] - (mean ? mean[n] : 0.0f)) * rstd[n]);
    }
    int64_t o = (int64_t)blockIdx.y * C + c;
    if (pb) pb[o] = accb;
    if (pw) pw[o] = accw;
}

/* dst[c] += sum over chunks of part[chunk, c], in chunk order. */
__global__ void colsum_final_kernel(float *dst, const float *part, int chunks, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float acc = 0.0f;
    for (int k = 0; k < chunks; k++) acc += part[(int64_t)k * C + c];
    dst[c] += acc;
}

/* db[C] += sum_n g[n, :] (db may be NULL); dw[C] += sum_n g * xhat when x (see above). */
static void column_sums(device *d, float *dw, float *db, const float *g, const float *x,
                        const float *mean, const float *rstd, int N, int C) {
    if (N <= 0 || C <= 0) return;
    int rpc = colsum_rows_per_chunk(N, C);
    int chunks = (N + rpc - 1) / rpc;
    int64_t per = (int64_t)chunks * C;
    float *part = (float *)cuda_scratch(d, (size_t)(2 * per) * sizeof(float));
    float *pw = dw ? part : NULL, *pb = db ? part + per : NULL;
    dim3 grid((unsigned)((C + COLSUM_THREADS - 1) / COLSUM_THREADS), (unsigned)chunks);
    colsum_partial_kernel<<<grid, COLSUM_THREADS, 0, compute(d)>>>(pw, pb, g, x, mean, rstd, N,
                                                                   C, rpc);
    LAUNCH_CHECK();
    unsigned blocks = (unsigned)((C + COLSUM_THREADS - 1) / COLSUM_THREADS);
    if (dw) {
        colsum_final_kernel<<<blocks, COLSUM_THREADS, 0, compute(d)>>>(dw, pw, chunks, C);
        LAUNCH_CHECK();
    }
    if (db) {
        colsum_final_kernel<<<blocks, COLSUM_THREADS, 0, compute(d)>>>(db, pb, chunks, C);
        LAUNCH_CHECK();
    }
}

void cuda_bias_grad(device *d, float *db, const float *dout, int N, int C) {
    column_sums(d, NULL, db, dout, NULL, NULL, NULL, N, C);
}

/* ---------------------------------------------------------------------------------------------
 * normalisations: one warp per row for the row statistics and dx, in float like the CPU
 * device; the weight gradients are column sums. */

/* One warp's row of layer norm (mean != NULL) or RMS norm (mean == NULL): the code of both
 * norm kernels and of the fused add + norm, so that the fused kernel gives their bits. */
__device__ __forceinline__ void norm_row(float *o, float *mean, float *rstd, const float *xr,
                                         const float *w, const float *b, int C, float eps,
                                         int lane) {
    if (!mean) {
        float ss = 0.0f;
        for (int c = lane; c < C; c += 32) ss += xr[c] * xr[c];
        float r = 1.0f / sqrtf(warp_sum(ss) / (float)C + eps);
        for (int c = lane; c < C; c += 32) o[c] = xr[c] * r * w[c];
        if (lane == 0) *rstd = r;
        return;
    }
    float s = 0.0f;
    for (int c = lane; c < C; c += 32) s += xr[c];
    float m = warp_sum(s) / (float)C;
    float v = 0.0f; /* centred second pass: no cancellation as in E[x^2] - mean^2 */
    for (int c = lane; c < C; c += 32) v += (xr[c] - m) * (xr[c] - m);
    float r = 1.0f / sqrtf(warp_sum(v) / (float)C + eps);
    for (int c = lane; c < C; c += 32) o[c] = (xr[c] - m) * r * w[c] + b[c];
    if (lane == 0) *mean = m, *rstd = r;
}

__global__ void layernorm_fwd_kernel(float *out, float *mean, float *rstd, const float *x,
                                     const float *w, const float *b, int N, int C, float eps) {
    int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return; /* whole warps leave: the shuffles below stay full-warp */
    norm_row(out + (int64_t)row * C, mean + row, rstd + row, x + (int64_t)row * C, w, b, C, eps,
             lane);
}

/* sum = a + b, then the norm of sum, then out rounded (HP: 0 none, 1 bf16, 2 fp16). Each lane
 * reads back only the sums it wrote (the same c stride), so the warp needs no barrier for them. */
template <int HP>
__global__ void add_norm_fwd_kernel(float *sum, float *out, float *mean, float *rstd,
                                    const float *a, const float *b, const float *w,
                                    const float *bias, int N, int C, float eps) {
    int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    int64_t r0 = (int64_t)row * C;
    for (int c = lane; c < C; c += 32) sum[r0 + c] = a[r0 + c] + b[r0 + c];
    float *o = out + r0;
    norm_row(o, mean ? mean + row : NULL, rstd + row, sum + r0, w, bias, C, eps, lane);
    if (HP == 1)
        for (int c = lane; c < C; c += 32) o[c] = bf16_value(o[c]);
    if (HP == 2)
        for (int c = lane; c < C; c += 32) o[c] = fp16_value(o[c]);
}

/* dx += rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat)), dnorm = dout * w; mean NULL:
 * rmsnorm (xhat = x * rstd, no mean(dnorm) term). */
__global__ void norm_bwd_dx_kernel(float *dx, const float *dout, const float *x,
                                   const float *mean, const float *rstd, const float *w, int N,
                                   int C) {
    int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const float *g = dout + (int64_t)row * C, *xr = x + (int64_t)row * C;
    float *dxr = dx + (int64_t)row * C;
    float m = mean ? mean[row] : 0.0f, s = rstd[row];
    float acc_g = 0.0f, acc_gx = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float dn = g[c] * w[c];
        acc_g += dn;
        acc_gx += dn * ((xr[c] - m) * s);
    }
    float dn_mean = mean ? warp_sum(acc_g) / (float)C : 0.0f;
    float dnx_mean = warp_sum(acc_gx) / (float)C;
    for (int c = lane; c < C; c += 32) {
        float xhat = (xr[c] - m) * s;
        dxr[c] += (g[c] * w[c] - dn_mean - xhat * dnx_mean) * s;
    }
}

__global__ void rmsnorm_fwd_kernel(float *out, float *rstd, const float *x, const float *w, int N,
                                   int C, float eps) {
    int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    norm_row(out + (int64_t)row * C, NULL, rstd + row, x + (int64_t)row * C, w, NULL, C, eps, lane);
}

static unsigned row_blocks(int N) { return (unsigned)((N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK); }

void cuda_layernorm_fwd(device *d, float *out, float *mean, float *rstd, const float *x,
                        const float *w, const float *b, int N, int C, float eps) {
    if (N <= 0 || C <= 0) return;
    layernorm_fwd_kernel<<<row_blocks(N), ROWS_PER_BLOCK * 32, 0, compute(d)>>>(
        out, mean, rstd, x, w, b, N, C, eps);
    LAUNCH_CHECK();
}

void cuda_add_norm_fwd(device *d, float *sum, float *out, float *mean, float *rstd,
                       const float *a, const float *b, const float *w, const float *bias,
                       int N, int C, float eps, precision hp) {
    if (N <= 0 || C <= 0) return;
    dim3 grid(row_blocks(N)), block(ROWS_PER_BLOCK * 32);
    if (hp == PREC_BF16)
        add_norm_fwd_kernel<1><<<grid, block, 0, compute(d)>>>(sum, out, mean, rstd, a, b, w, bias, N, C, eps);
    else if (hp == PREC_FP16)
        add_norm_fwd_kernel<2><<<grid, block, 0, compute(d)>>>(sum, out, mean, rstd, a, b, w, bias, N, C, eps);
    else
        add_norm_fwd_kernel<0><<<grid, block, 0, compute(d)>>>(sum, out, mean, rstd, a, b, w, bias, N, C, eps);
    LAUNCH_CHECK();
}

void cuda_layernorm_bwd(device *d, float *dx, float *dw, float *db, const float *dout,
                        const float *x, const float *mean, const float *rstd,
                        const float *w, int N, int C) {
    if (N <= 0 || C <= 0) return;
    norm_bwd_dx_kernel<<<row_blocks(N), ROWS_PER_BLOCK * 32, 0, compute(d)>>>(dx, dout, x, mean,
                                                                              rstd, w, N, C);
    LAUNCH_CHECK();
    column_sums(d, dw, db, dout, x, mean, rstd, N, C);
}

void cuda_rmsnorm_fwd(device *d, float *out, float *rstd, const float *x, const float *w,
                      int N, int C, float eps) {
    if (N <= 0 || C <= 0) return;
    rmsnorm_fwd_kernel<<<row_blocks(N), ROWS_PER_BLOCK * 32, 0, compute(d)>>>(out, rstd, x, w, N,
                                                                              C, eps);
    LAUNCH_CHECK();
}

void cuda_rmsnorm_bwd(device *d, float *dx, float *dw, const float *dout, const float *x,
                      const float *rstd, const float *w, int N, int C) {
    if (N <= 0 || C <= 0) return;
    norm_bwd_dx_kernel<<<row_blocks(N), ROWS_PER_BLOCK * 32, 0, compute(d)>>>(dx, dout, x, NULL,
                                                                              rstd, w, N, C);
    LAUNCH_CHECK();
    column_sums(d, dw, NULL, dout, x, NULL, rstd, N, C);
}
