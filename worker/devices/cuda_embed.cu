/* cuda_embed.cu - the CUDA device's ends of the model: token embeddings (forward, and the
 * deterministic backward through a stable radix sort), ViT patches, and the head's fused softmax
 * cross-entropy over the logits. */
#include <assert.h>
#include <math.h>

#include <cub/device/device_radix_sort.cuh>

#include "devices/cuda_internal.h"

extern "C" {
#include "common/log.h"
}

/* ---------------------------------------------------------------------------------------------
 * embeddings */

/* out[N,C] = table[ids[n], :] (rows_grid's launch: a column a thread) */
__global__ void embed_fwd_kernel(float *out, const float *table, const int32_t *ids, int N,
                                 int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    ROWS_STRIDE(n, N) out[n * C + c] = table[(int64_t)ids[n] * C + c];
}

void cuda_embed_fwd(device *d, float *out, const float *table, const int32_t *ids, int N,
                    int C) {
    if (N <= 0 || C <= 0) return;
    const rows_launch l = rows_grid(N, C, 1);
    embed_fwd_kernel<<<l.grid, l.block, 0, compute(d)>>>(out, table, ids, N, C);
    LAUNCH_CHECK();
}

__global__ void iota_kernel(int32_t *x, int n) {
    GRID_STRIDE(i, n) x[i] = (int32_t)i;
}

/* After a stable sort of (id, token) by id: the block at the start of each run of equal ids
 * owns that table row and adds the run's tokens in token order, from the row's current value.
 * That is the CPU device's order (dtable row += each token's row, tokens in order), so the
 * result has the same bits, with no two threads writing one element. */
__global__ void embed_bwd_kernel(float *dtable, const float *dout, const int32_t *sorted_ids,
                                 const int32_t *tokens, int N, int C) {
    int i = blockIdx.x;
    if (i > 0 && sorted_ids[i] == sorted_ids[i - 1]) return; /* not a run start */
    int32_t id = sorted_ids[i];
    float *row = dtable + (int64_t)id * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = row[c];
        for (int j = i; j < N && sorted_ids[j] == id; j++) acc += dout[(int64_t)tokens[j] * C + c];
        row[c] = acc;
    }
}

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

void cuda_embed_bwd(device *d, float *dtable, const float *dout, const int32_t *ids, int N,
                    int C) {
    if (N <= 0 || C <= 0) return;
    size_t sort_bytes = 0; /* cub's temporary storage */
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(NULL, sort_bytes, (const int32_t *)NULL,
                                               (int32_t *)NULL, (const int32_t *)NULL,
                                               (int32_t *)NULL, N, 0, 32, compute(d)));
    size_t ids_bytes = align_up((size_t)N * sizeof(int32_t), 256);
    char *s = (char *)cuda_scratch(d, 3 * ids_bytes + sort_bytes);
    int32_t *sorted_ids = (int32_t *)s, *tokens_in = (int32_t *)(s + ids_bytes),
            *tokens = (int32_t *)(s + 2 * ids_bytes);
    void *sort_tmp = s + 3 * ids_bytes;
    iota_kernel<<<ew_blocks(N), EW_THREADS, 0, compute(d)>>>(tokens_in, N);
    LAUNCH_CHECK();
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(sort_tmp, sort_bytes, ids, sorted_ids, tokens_in,
                                               tokens, N, 0, 32, compute(d)));
    embed_bwd_kernel<<<(unsigned)N, 128, 0, compute(d)>>>(dtable, dout, sorted_ids, tokens, N, C);
    LAUNCH_CHECK();
}

/* ---------------------------------------------------------------------------------------------
 * images */

/* img [B, C, S, S] -> out [B * (S/p)^2, C*p*p]; one thread per output element. */
__global__ void patchify_kernel(float *out, const float *img, int64_t total, int C, int S,
                                int p) {
    int np = S / p, cols = C * p * p;
    GRID_STRIDE(i, total) {
        int64_t r = i / cols;
        int col = (int)(i % cols);
        int c = col / (p * p), y = (col / p) % p, xx = col % p;
        int64_t b = r / ((int64_t)np * np);
        int py = (int)((r / np) % np), px = (int)(r % np);
        out[i] = img[(((b * C + c) * S + (int64_t)py * p + y) * S) + (int64_t)px * p + xx];
    }
}

void cuda_patchify(device *d, float *out, const float *img, int B, int C, int S, int p) {
    CHECK(p > 0 && S % p == 0);
    int np = S / p;
    int64_t total = (int64_t)B * np * np * C * p * p;
    if (total <= 0) return;
    patchify_kernel<<<ew_blocks(total), EW_THREADS, 0, compute(d)>>>(out, img, total, C, S, p);
    LAUNCH_CHECK();
}

/* ---------------------------------------------------------------------------------------------
 * fused softmax cross-entropy: one block per row. */

/* max that propagates NaN (a diverged row stays visible, as on the CPU) */
__device__ float max_nan(float a, float b) { return (b > a || b != b) ? b : a; }

__device__ float warp_max_nan(float v) {
    for (int o = 16; o > 0; o >>= 1) v = max_nan(v, __shfl_xor_sync(0xffffffffu, v, o));
    return __shfl_sync(0xffffffffu, v, 0);
}

__device__ float block_max_nan(float v, float *sh) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_max_nan(v);
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    return warp_max_nan(lane < nwarps ? sh[lane] : sh[0]);
}

/* One block: *acc += scale * (the sum of v[0..n)), thread t summing t, t + blockDim, ... then a
 * fixed tree. */
__global__ void add_scaled_sum_kernel(double *acc, const double *v, int n, double scale) {
    __shared__ double sh[32];
    double s = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += v[i];
    s = block_sum(s, sh);
    if (threadIdx.x == 0) *acc += scale * s;
}

/* Threads per block of the block-per-row kernels (cross-entropy). */
#define XENT_THREADS 1024

__global__ void xent_kernel(float *logits, int ld, float *losses, double *row_loss,
                            const int32_t *targets, int V, float scale) {
    __shared__ float sh[32];
    int n = blockIdx.x;
    float *x = logits + (int64_t)n * ld;
    int t = targets[n];
    assert(t < V); /* the data loader checks token ids against the vocabulary */
    if (t < 0) { /* no target: loss 0, gradient 0 */
        for (int j = threadIdx.x; j < V; j += blockDim.x) x[j] = 0.0f;
        if (threadIdx.x == 0) losses[n] = 0.0f, row_loss[n] = 0.0;
        return;
    }
    float xt = x[t]; /* read by every thread before the first barrier, so before any write */
    float m = x[0];
    for (int j = threadIdx.x; j < V; j += blockDim.x) m = max_nan(m, x[j]);
    m = block_max_nan(m, sh);
    float sum = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float e = expf(x[j] - m);
        x[j] = e;
        sum += e;
    }
    sum = block_sum(sum, sh);
    float s = scale / sum;
    /* each thread rescales the elements it wrote above; the target's gradient is rounded
     * twice (x * s, then - scale) as on the CPU */
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float y = __fmul_rn(x[j], s);
        x[j] = j == t ? __fsub_rn(y, scale) : y;
    }
    if (threadIdx.x == 0) {
        double loss = log((double)sum) + (double)m - (double)xt;
        losses[n] = (float)loss;
        row_loss[n] = loss;
    }
}

void cuda_xent_fwd_bwd(device *d, float *logits, int ld, float *losses,
                       const int32_t *targets, int N, int V, float scale, double *loss_sum) {
    if (N <= 0) return;
    CHECK(ld >= V);
    double *row_loss = (double *)cuda_scratch(d, (size_t)N * sizeof(double));
    xent_kernel<<<(unsigned)N, XENT_THREADS, 0, compute(d)>>>(logits, ld, losses, row_loss,
                                                              targets, V, scale);
    LAUNCH_CHECK();
    /* rows in a fixed order (a fixed tree over 1024 strided row sums), onto the device's sum */
    add_scaled_sum_kernel<<<1, XENT_THREADS, 0, compute(d)>>>(loss_sum, row_loss, N,
                                                              (double)scale);
    LAUNCH_CHECK();
}
