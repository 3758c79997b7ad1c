/* cuda_elementwise.cu - the CUDA device's element-wise ops: bf16 and fp16 conversions (the
 * rounding itself is cuda_internal.h's, shared with the norms, gemm and AdamW), fill, add, axpy,
 * scale, the sum of squares (sumsq_multi), copy2d, the activations (GELU, SwiGLU) and the rotary
 * embedding. */
#include <math.h>
#include <string.h>

#include "devices/cuda_internal.h"

extern "C" {
#include "common/log.h"
}

/* ---------------------------------------------------------------------------------------------
 * bf16 and fp16 conversions: the rounding in bits (bf16_round, fp16_round, fp16_widen) is
 * cuda_internal.h's, so that the norms, gemm and AdamW round with the same code. */

__global__ void to_bf16_kernel(uint16_t *out, const float *in, int64_t n) {
    GRID_STRIDE(i, n) out[i] = bf16_round(in[i]);
}

__global__ void from_bf16_kernel(float *out, const uint16_t *in, int64_t n) {
    GRID_STRIDE(i, n) out[i] = __uint_as_float((uint32_t)in[i] << 16);
}

void cuda_to_bf16(device *d, uint16_t *out, const float *in, int64_t n) {
    if (n <= 0) return;
    to_bf16_kernel<<<ew_blocks(n), EW_THREADS, 0, compute(d)>>>(out, in, n);
    LAUNCH_CHECK();
}

void cuda_from_bf16(device *d, float *out, const uint16_t *in, int64_t n) {
    if (n <= 0) return;
    from_bf16_kernel<<<ew_blocks(n), EW_THREADS, 0, compute(d)>>>(out, in, n);
    LAUNCH_CHECK();
}

__global__ void to_fp16_kernel(uint16_t *out, const float *in, int64_t n) {
    GRID_STRIDE(i, n) out[i] = fp16_round(in[i]);
}

__global__ void from_fp16_kernel(float *out, const uint16_t *in, int64_t n) {
    GRID_STRIDE(i, n) out[i] = fp16_widen(in[i]);
}

void cuda_to_fp16(device *d, uint16_t *out, const float *in, int64_t n) {
    if (n <= 0) return;
    to_fp16_kernel<<<ew_blocks(n), EW_THREADS, 0, compute(d)>>>(out, in, n);
    LAUNCH_CHECK();
}

void cuda_from_fp16(device *d, float *out, const uint16_t *in, int64_t n) {
    if (n <= 0) return;
    from_fp16_kernel<<<ew_blocks(n), EW_THREADS, 0, compute(d)>>>(out, in, n);
    LAUNCH_CHECK();
}

/* 16-bit activations: x in place as a bf16/fp16 tensor holds it. */
template <bool BF16> __global__ void round_half_kernel(float *x, int64_t n) {
    GRID_STRIDE(i, n) x[i] = BF16 ? bf16_value(x[i]) : fp16_value(x[i]);
}

void cuda_round_half(device *d, float *x, int64_t n, precision p) {
    if (n <= 0) return;
    if (p == PREC_BF16)
        round_half_kernel<true><<<ew_blocks(n), EW_THREADS, 0, compute(d)>>>(x, n);
    else
        round_half_kernel<false><<<ew_blocks(n), EW_THREADS, 0, compute(d)>>>(x, n);
    LAUNCH_CHECK();
}

/* ---------------------------------------------------------------------------------------------
 * elementwise and reductions. Outputs may alias inputs index for index. axpy is written with
 * the _rn intrinsics so that nvcc does not fuse it into an FMA: y + alpha*x rounds twice, as on
 * the CPU, and gradient accumulation gives the same bits on both devices. */

__global__ void fill_kernel(float *x, float v, int64_t n) { GRID_STRIDE(i, n) x[i] = v; }

__global__ void add_kernel(float *out, const float *a, const float *b, int64_t n) {
    GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}

__global__ void axpy_kernel(float *y, float alpha, const float *x, int64_t n) {
    GRID_STRIDE(i, n) y[i] = __fadd_rn(y[i], __fmul_rn(alpha, x[i]));
}

__global__ void scale_kernel(float *x, float s, int64_t n) { GRID_STRIDE(i, n) x[i] *= s; }

void cuda_fill(device *d, float *x, float v, int64_t n) {
    if (n <= 0) return;
    fill_kernel<<<ew_blocks(n), EW_THREADS, 0, compute(d)>>>(x, v, n);
    LAUNCH_CHECK();
}

void cuda_add(device *d, float *out, const float *a, const float *b, int64_t n) {
    if (n <= 0) return;
    add_kernel<<<ew_blocks(n), EW_THREADS, 0, compute(d)>>>(out, a, b, n);
    LAUNCH_CHECK();
}

void cuda_axpy(device *d, float *y, float alpha, const float *x, int64_t n) {
    if (n <= 0) return;
    axpy_kernel<<<ew_blocks(n), EW_THREADS, 0, compute(d)>>>(y, alpha, x, n);
    LAUNCH_CHECK();
}

void cuda_scale(device *d, float *x, float s, int64_t n) {
    if (n <= 0) return;
    scale_kernel<<<ew_blocks(n), EW_THREADS, 0, compute(d)>>>(x, s, n);
    LAUNCH_CHECK();
}

/* sumsq_multi, stage 1: for each tensor of the list (blockIdx.y), a fixed grid of
 * CUDA_RED_BLOCKS x CUDA_RED_THREADS threads; thread g sums x[g], x[g + G], ... in order (G =
 * the grid size), then each block adds its threads in a fixed tree. The order depends on n only.
 * The list travels as a kernel parameter (1 KiB), so no host copy precedes the launch. */
typedef struct sumsq_list {
    const float *x[SUMSQ_MULTI_MAX];
    int64_t n[SUMSQ_MULTI_MAX];
} sumsq_list;

__global__ void sumsq_partial_kernel(double *partials, sumsq_list l) {
    __shared__ double sh[32];
    const float *x = l.x[blockIdx.y];
    int64_t n = l.n[blockIdx.y];
    double acc = 0;
    GRID_STRIDE(i, n) acc += (double)x[i] * (double)x[i];
    acc = block_sum(acc, sh);
    if (threadIdx.x == 0) partials[(int64_t)blockIdx.y * gridDim.x + blockIdx.x] = acc;
}

/* Stage 2, one block of CUDA_RED_BLOCKS threads: each tensor's CUDA_RED_BLOCKS partials in a
 * fixed tree, then the tensors added in list order onto *out (0 first when `first`): the same
 * bits as adding the tensors' sums one by one on the host. */
__global__ void sumsq_finish_kernel(double *out, const double *partials, int count, bool first) {
    __shared__ double sh[32];
    double total = 0; /* thread 0's is the result; *out is read by it alone */
    if (threadIdx.x == 0 && !first) total = *out;
    for (int i = 0; i < count; i++) {
        double acc = 0;
        for (int j = threadIdx.x; j < CUDA_RED_BLOCKS; j += blockDim.x)
            acc += partials[(int64_t)i * CUDA_RED_BLOCKS + j];
        total += block_sum(acc, sh);
    }
    if (threadIdx.x == 0) *out = total;
}

void cuda_sumsq_multi(device *d, double *out, int count, const float *const *x,
                      const int64_t *n) {
    cuda_state *st = cuda_of(d);
    CHECK(count >= 0);
    int done = 0;
    do { /* count 0 still writes *out = 0 */
        int k = count - done < SUMSQ_MULTI_MAX ? count - done : SUMSQ_MULTI_MAX;
        sumsq_list l;
        memset(&l, 0, sizeof l);
        for (int i = 0; i < k; i++) l.x[i] = x[done + i], l.n[i] = n[done + i] > 0 ? n[done + i] : 0;
        if (k > 0) {
            sumsq_partial_kernel<<<dim3(CUDA_RED_BLOCKS, (unsigned)k), CUDA_RED_THREADS, 0,
                                   compute(d)>>>(st->red_partials, l);
            LAUNCH_CHECK();
        }
        sumsq_finish_kernel<<<1, CUDA_RED_BLOCKS, 0, compute(d)>>>(out, st->red_partials, k,
                                                                   done == 0);
        LAUNCH_CHECK();
        done += k;
    } while (done < count);
}

void cuda_copy2d(device *d, float *out, int ldo, const float *src, int lds, int rows,
                 int cols) {
    if (rows <= 0 || cols <= 0) return;
    CUDA_CHECK(cudaMemcpy2DAsync(out, (size_t)ldo * sizeof(float), src,
                                 (size_t)lds * sizeof(float), (size_t)cols * sizeof(float),
                                 (size_t)rows, cudaMemcpyDeviceToDevice, compute(d)));
}

/* ---------------------------------------------------------------------------------------------
 * activations: the CPU device's formulas, with the accurate expf/erff */

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f
#define INV_SQRT2 0.7071067811865476f
#define INV_SQRT_2PI 0.3989422804014327f

/* tanh form as x * sigmoid(2y), y = sqrt(2/pi) (x + 0.044715 x^3): no cancellation for x < 0 */
__global__ void gelu_fwd_kernel(float *out, const float *x, int64_t n, bool tanh_approx) {
    GRID_STRIDE(i, n) {
        float xi = x[i];
        if (tanh_approx) {
            float y = GELU_K * (xi + GELU_A * xi * xi * xi);
            out[i] = xi / (1.0f + expf(-2.0f * y));
        } else {
            out[i] = 0.5f * xi * (1.0f + erff(xi * INV_SQRT2));
        }
    }
}

/* tanh: sig + 2 x sig (1 - sig) y'(x); erf: Phi(x) + x phi(x) */
__global__ void gelu_bwd_kernel(float *dx, const float *x, const float *dout, int64_t n,
                                bool tanh_approx) {
    GRID_STRIDE(i, n) {
        float xi = x[i], go = dout[i];
        if (tanh_approx) {
            float y = GELU_K * (xi + GELU_A * xi * xi * xi);
            float dy = GELU_K * (1.0f + 3.0f * GELU_A * xi * xi);
            float sig = 1.0f / (1.0f + expf(-2.0f * y));
            dx[i] = go * (sig + 2.0f * xi * sig * (1.0f - sig) * dy);
        } else {
            float cdf = 0.5f * (1.0f + erff(xi * INV_SQRT2));
            float pdf = INV_SQRT_2PI * expf(-0.5f * xi * xi);
            dx[i] = go * (cdf + xi * pdf);
        }
    }
}

__global__ void swiglu_fwd_kernel(float *out, const float *g, const float *u, int64_t n) {
    GRID_STRIDE(i, n) {
        float gi = g[i];
        out[i] = gi / (1.0f + expf(-gi)) * u[i];
    }
}

/* dg = dout * u * sig * (1 + g (1 - sig)), du = dout * silu(g); all inputs read before the
 * writes (dg may alias g). */
__global__ void swiglu_bwd_kernel(float *dg, float *du, const float *dout, const float *g,
                                  const float *u, int64_t n) {
    GRID_STRIDE(i, n) {
        float gi = g[i], ui = u[i], go = dout[i];
        float sig = 1.0f / (1.0f + expf(-gi));
        dg[i] = go * ui * sig * (1.0f + gi * (1.0f - sig));
        du[i] = go * gi * sig;
    }
}

void cuda_gelu_fwd(device *d, float *out, const float *x, int64_t n, bool tanh_approx) {
    if (n <= 0) return;
    gelu_fwd_kernel<<<ew_blocks(n), EW_THREADS, 0, compute(d)>>>(out, x, n, tanh_approx);
    LAUNCH_CHECK();
}

void cuda_gelu_bwd(device *d, float *dx, const float *x, const float *dout, int64_t n,
                   bool tanh_approx) {
    if (n <= 0) return;
    gelu_bwd_kernel<<<ew_blocks(n), EW_THREADS, 0, compute(d)>>>(dx, x, dout, n, tanh_approx);
    LAUNCH_CHECK();
}

void cuda_swiglu_fwd(device *d, float *out, const float *g, const float *u, int64_t n) {
    if (n <= 0) return;
    swiglu_fwd_kernel<<<ew_blocks(n), EW_THREADS, 0, compute(d)>>>(out, g, u, n);
    LAUNCH_CHECK();
}

void cuda_swiglu_bwd(device *d, float *dg, float *du, const float *dout, const float *g,
                     const float *u, int64_t n) {
    if (n <= 0) return;
    swiglu_bwd_kernel<<<ew_blocks(n), EW_THREADS, 0, compute(d)>>>(dg, du, dout, g, u, n);
    LAUNCH_CHECK();
}

/* ---------------------------------------------------------------------------------------------
 * rotary embedding. The cos/sin table is the CPU device's (dev_rope_table: PyTorch's fp32
 * angles, made on the host and copied once), so the two devices rotate by the same bits. Cached
 * per (T, hd, inv_freq) like the CPU's. */

/* Whether the table holds inv_freq's angles for hd (at any T). */
static bool rope_same(const cuda_state *st, int hd, const float *inv_freq) {
    return st->rope_cos && st->rope_hd == hd && !memcmp(st->rope_freq, inv_freq, (size_t)(hd / 2) * sizeof(float));
}

static void rope_table(device *d, int T, int hd, const float *inv_freq) {
    cuda_state *st = cuda_of(d);
    if (st->rope_T == T && rope_same(st, hd, inv_freq)) return;
    if (st->rope_cos) { /* queued rope kernels may still read the old table */
        host_wait(d, compute(d));
        CUDA_CHECK(cudaFree(st->rope_cos));
        CUDA_CHECK(cudaFree(st->rope_sin));
        st->rope_cos = st->rope_sin = NULL;
    }
    int half = hd / 2;
    size_t bytes = (size_t)T * half * sizeof(float);
    float *host = (float *)xmalloc(2 * bytes);
    dev_rope_table(inv_freq, T, hd, host, host + (size_t)T * half);
    st->rope_cos = (float *)cuda_must_malloc(d, bytes, "rotary cos table");
    st->rope_sin = (float *)cuda_must_malloc(d, bytes, "rotary sin table");
    /* on the compute stream, so the rope kernels queued after it read the whole table; waited
     * for before the host copy is freed (a rebuild is rare: a new T, head size or model) */
    CUDA_CHECK(cudaMemcpyAsync(st->rope_cos, host, bytes, cudaMemcpyHostToDevice, compute(d)));
    CUDA_CHECK(cudaMemcpyAsync(st->rope_sin, host + (size_t)T * half, bytes, cudaMemcpyHostToDevice, compute(d)));
    host_wait(d, compute(d));
    free(host);
    st->rope_freq = (float *)xrealloc(st->rope_freq, (size_t)half * sizeof(float));
    memcpy(st->rope_freq, inv_freq, (size_t)half * sizeof(float));
    st->rope_T = T, st->rope_hd = hd;
}

/* One thread per (row, head, i < hd/2): (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin); inverse
 * uses -sin. The _rn intrinsics keep nvcc from fusing into FMAs, as on the CPU. rows_grid's
 * launch over [rows, n_heads * hd/2]: a thread's (head, i) is fixed, only the row moves. */
__global__ void rope_kernel(float *x, const float *cos_t, const float *sin_t, int ldx,
                            int rows, int T, int n_heads, int hd, float sign) {
    const int half = hd / 2, k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n_heads * half) return;
    const int h = k / half, i = k - h * half;
    ROWS_STRIDE(r, rows) {
        float *x1 = x + r * ldx + (int64_t)h * hd + i, *x2 = x1 + half;
        int64_t tab = (int64_t)((int)r % T) * half + i;
        float a = *x1, b = *x2, c = cos_t[tab], s = sign * sin_t[tab];
        *x1 = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
        *x2 = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
    }
}

void cuda_rope(device *d, float *x, int ldx, int rows, int T, int n_heads, int hd,
               const float *inv_freq, bool inverse) {
    CHECK(hd % 2 == 0 && T > 0);
    if (rows <= 0 || n_heads <= 0 || hd <= 0) return;
    rope_table(d, T, hd, inv_freq);
    cuda_state *st = cuda_of(d);
    const rows_launch l = rows_grid(rows, (int64_t)n_heads * (hd / 2), 1);
    rope_kernel<<<l.grid, l.block, 0, compute(d)>>>(x, st->rope_cos, st->rope_sin, ldx, rows, T,
                                                    n_heads, hd, inverse ? -1.0f : 1.0f);
    LAUNCH_CHECK();
}

/* rope for rows at positions pos0 + r (generation, docs/sample.md): rope_kernel's arithmetic
 * with the table row pos0 + r. The table is kept at a power of two >= the positions needed, so
 * decode steps do not rebuild it; entry t depends on t alone. */
__global__ void rope_at_kernel(float *x, const float *cos_t, const float *sin_t, int ldx,
                               int64_t total, int pos0, int n_heads, int hd) {
    int half = hd / 2;
    GRID_STRIDE(k, total) {
        int i = (int)(k % half);
        int64_t rh = k / half;
        int h = (int)(rh % n_heads);
        int64_t r = rh / n_heads;
        float *x1 = x + r * ldx + (int64_t)h * hd + i, *x2 = x1 + half;
        int64_t tab = (pos0 + r) * half + i;
        float a = *x1, b = *x2, c = cos_t[tab], s = sin_t[tab];
        *x1 = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
        *x2 = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
    }
}

void cuda_rope_at(device *d, float *x, int ldx, int rows, int pos0, int n_heads, int hd,
                  const float *inv_freq) {
    CHECK(hd % 2 == 0 && pos0 >= 0 && rows >= 0);
    int64_t total = (int64_t)rows * n_heads * (hd / 2);
    if (total <= 0) return;
    cuda_state *st = cuda_of(d);
    int need = pos0 + rows;
    if (!rope_same(st, hd, inv_freq) || st->rope_T < need) {
        int T = 256;
        while (T < need) T *= 2;
        rope_table(d, T, hd, inv_freq);
    }
    rope_at_kernel<<<ew_blocks(total), EW_THREADS, 0, compute(d)>>>(x, st->rope_cos, st->rope_sin,
                                                                    ldx, total, pos0, n_heads, hd);
    LAUNCH_CHECK();
}

/* The attributes of one of this build's kernels (cuda_device.cu's check_arch: whether the binary
 * has code the GPU can run). */
cudaError_t cuda_kernel_attributes(cudaFuncAttributes *fa) {
    return cudaFuncGetAttributes(fa, fill_kernel);
}
