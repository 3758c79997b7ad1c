/* cuda_internal.h - shared pieces of the CUDA device, one file per op family (llm.c's way):
 *   cuda_device.cu       the op table, the timed table (CEPHALO_CUDA_OPTIME) and the device itself
 *                        (init, close, the "cuda" row of the device kinds, device.h)
 *   cuda_mem.cu          memory (caching allocator, scratch), copies, host memory, streams, events
 *   cuda_optime.cu       the per-op-class GPU timer's ring of events
 *   cuda_gemm.cu         matrix products (cuBLAS, cuBLASLt), the bias add, gemm_bias/bgrad
 *   cuda_elementwise.cu  bf16/fp16 conversions, element-wise ops, sumsq, activations, rope
 *   cuda_norm.cu         layer norm, RMS norm, add + norm; column sums (bias_grad, dw, db)
 *   cuda_embed.cu        embeddings, ViT patches, the head's fused softmax cross-entropy
 *   cuda_adamw.cu        AdamW
 *   cuda_attention.cu cuda_attention_mma.cu  attention (fp32 flash, tensor-core bf16/fp16)
 * Uses run one way: cuda_device.cu calls the families and attention, which take their scratch
 * from cuda_mem.cu; nothing calls cuda_device.cu (it registers its row at start-up).
 *
 * Every compute kernel runs on the compute stream in issue order; the h2d and d2h streams carry
 * the offload copies only (ordered against compute by the caller's events). Included from .cu
 * files only (C++): device.h is a C header, so it is wrapped in extern "C". */
#ifndef CEPHALO_CUDA_INTERNAL_H
#define CEPHALO_CUDA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

extern "C" {
#include "devices/device.h"
#include "devices/optime.h"
}

/* Like CHECK in log.h: a failing CUDA call is a bug or a dead GPU, not bad input, so it aborts
 * with file:line (a sticky error would make every later call fail anyway). */
#define CUDA_CHECK(call)                                                                     \
    do {                                                                                     \
        cudaError_t cuda_check_e_ = (call);                                                  \
        if (cuda_check_e_ != cudaSuccess) {                                                  \
            fprintf(stderr, "%s:%d: internal error: CUDA call failed: %s: %s\n", __FILE__,   \
                    __LINE__, #call, cudaGetErrorString(cuda_check_e_));                     \
            abort();                                                                         \
        }                                                                                    \
    } while (0)

#define CUBLAS_CHECK(call)                                                                   \
    do {                                                                                     \
        cublasStatus_t cublas_check_s_ = (call);                                             \
        if (cublas_check_s_ != CUBLAS_STATUS_SUCCESS) {                                      \
            fprintf(stderr, "%s:%d: internal error: cuBLAS call failed: %s: %s\n", __FILE__, \
                    __LINE__, #call, cublasGetStatusString(cublas_check_s_));                \
            abort();                                                                         \
        }                                                                                    \
    } while (0)

/* The caching allocator's size classes: requests are rounded up to a multiple of CUDA_SMALL
 * bytes below CUDA_LARGE, and to a multiple of CUDA_LARGE from there on. Each rounded size has
 * its own free list (exact-size reuse: no splitting, so no fragmentation bookkeeping). */
#define CUDA_SMALL ((size_t)512)
#define CUDA_LARGE ((size_t)2 << 20)

/* One free list: the cached blocks of one rounded size. */
typedef struct cuda_freelist {
    size_t bytes;   /* the rounded size */
    void **blocks;  /* cached (free) blocks of that size */
    int n, cap;
} cuda_freelist;

/* Blocks reduced per block in the deterministic reductions (sumsq_multi): a fixed grid, so the
 * summation order depends on n only, never on the GPU. */
#define CUDA_RED_BLOCKS 256
#define CUDA_RED_THREADS 256

typedef struct cuda_state {
    int gpu;
    int cc_major, cc_minor; /* compute capability */
    int code_arch;          /* virtual arch of our loaded kernels (75 = compute_75 PTX/SASS) */
    int smem_optin;         /* bytes of shared memory a block may opt in to (48 KB .. 227 KB) */
    /* CEPHALO_CUDA_PORTABLE=1: the attention kernels use the 48 KB tiles and plain loads (the
     * path of sm_60..sm_75) on any GPU, so that a new GPU can test the old GPUs' code. */
    bool portable;
    /* CEPHALO_CUDA_ATTN=mma: bf16/fp16 attention on tensor cores (cuda_attention_mma.cu) where
     * cuda_attention_mma_ok allows; simt (the default) keeps the fp32 kernels everywhere. */
    bool attn_mma;
    cudaStream_t stream[DEV_STREAMS]; /* indexed by dev_stream; non-blocking streams */
    cublasHandle_t blas;              /* bound to the compute stream */
    void *blas_workspace; /* cuBLAS workspace (cudaMalloc'ed at init, outside the accounting;
                           * BLAS_WORKSPACE bytes), also cuBLASLt's in lt mode */
    /* CEPHALO_CUDA_GEMM=lt: the cuBLASLt handle and the plans of the shapes seen (cuda_gemm.cu);
     * NULL in blas mode (the default), where every product is a cublasGemmEx */
    struct cuda_lt *lt;

    /* Caching allocator. raw_free returns blocks here, never to cudaFree: every kernel runs on
     * the compute stream, so a block freed and handed out again is only touched by work queued
     * after the work that used it (stream order). Copies on the h2d/d2h streams read or write
     * memory the caller keeps alive until their events complete. */
    cuda_freelist *lists;
    int n_lists, cap_lists;
    int64_t reserved_bytes; /* cudaMalloc'ed by the cache: in use + cached */

    /* Reduction scratch, allocated at init with cudaMalloc (outside dev_alloc's accounting,
     * 128 KiB, covered by the capacity's reserve like the CUDA context): sumsq_multi's
     * partials, CUDA_RED_BLOCKS doubles per tensor of one launch (SUMSQ_MULTI_MAX). */
    double *red_partials;

    /* Per-device growable scratch (cuda_scratch): cudaMalloc'ed outside the accounting, like the
     * CPU device's per-thread scratch. Used only by work on the compute stream. */
    void *scratch;
    size_t scratch_bytes;

    /* gemm in BF16/FP16 mode: the operands rounded to 16 bits (or, for bf16 before sm_80,
     * rounded and widened back to fp32), GEMM16_BYTES each, allocated on the first such gemm
     * outside dev_alloc's accounting and covered by the capacity's reserve (CUDA_RESERVE). */
    void *gemm16[2];
    size_t gemm16_bytes; /* of each */

    /* Rotary cos/sin table of the last (T, hd, inv_freq), [T, hd/2] each, cudaMalloc'ed outside
     * the accounting like the CPU device's table; rope_freq: that inv_freq (host, hd/2). */
    float *rope_cos, *rope_sin;
    int rope_T, rope_hd;
    float *rope_freq;

    /* CEPHALO_CUDA_OPTIME=1: the event pairs and the per-class times (cuda_optime.cu); NULL
     * when off, and then no op is wrapped (the plain op table, cuda_device.cu). */
    struct cuda_optime *optime;
} cuda_state;

static inline cuda_state *cuda_of(device *d) { return (cuda_state *)d->impl; }

/* The CUDA stream behind a dev_stream. */
static inline cudaStream_t cuda_stream(device *d, dev_stream s) { return cuda_of(d)->stream[s]; }

/* Memory outside dev_alloc's accounting (cuda_mem.cu) ----------------------------------------
 *
 * A per-device scratch buffer of at least `bytes`, for work on the compute stream. Growing it
 * synchronises the compute stream (the old buffer may still be in use by queued kernels) and
 * invalidates earlier pointers, so take it once per op. Not counted against d->capacity. */
void *cuda_scratch(device *d, size_t bytes);
/* cudaMalloc for the device's own buffers outside the accounting (rope tables, the 16-bit gemm
 * operands): on a failure the cache is released and the call retried once; a second failure
 * aborts, naming `what`. */
void *cuda_must_malloc(device *d, size_t bytes, const char *what);

/* CEPHALO_CUDA_OPTIME: brackets work queued on stream s as class c (optime.h); begin/end pairs
 * nest (a gemm's operand rounding inside the gemm). No-ops when timing is off. */
void cuda_optime_begin(device *d, optime_class c, dev_stream s);
void cuda_optime_end(device *d);
/* The timer's state (cuda_optime.cu): made at init when CEPHALO_CUDA_OPTIME=1; finish waits for
 * every pair, prints the table (rank, GPU) to stderr and frees it; poll adds the pairs that have
 * ended, without waiting (at a sync). */
struct cuda_optime *cuda_optime_new(void);
void cuda_optime_finish(struct cuda_optime *o, int rank, int gpu);
void cuda_optime_poll(device *d);

/* Bytes the caching allocator holds from cudaMalloc (live + cached). */
extern "C" int64_t cuda_reserved_bytes(device *d);

/* ---------------------------------------------------------------------------------------------
 * What the op families share: launch geometry, reductions, the 16-bit rounding. */

/* Threads per block of the elementwise kernels. */
#define EW_THREADS 256
/* The two 16-bit gemm operand workspaces (BF16/FP16 mode), GEMM16_BYTES each. */
#define GEMM16_BYTES ((size_t)32 << 20)
/* cuBLAS's workspace (and cuBLASLt's, the same buffer): what cuBLAS recommends for Hopper */
#define BLAS_WORKSPACE ((size_t)32 << 20)

#define GRID_STRIDE(i, n)                                                                 \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);             \
         i += (int64_t)gridDim.x * blockDim.x)

/* Blocks for a grid-stride loop over n elements (n > 0). */
static inline unsigned ew_blocks(int64_t n) {
    int64_t b = (n + EW_THREADS - 1) / EW_THREADS;
    return (unsigned)(b < 65536 ? b : 65536);
}

/* The launch of a kernel over a [rows, cols] block in which a thread takes `per` consecutive
 * columns of a row: threads along the row (x, a warp at least, 256 at most), the rest of the
 * block's 256 threads and the grid's y over rows (the kernel strides by gridDim.y * blockDim.y).
 * Row and column come from the thread's coordinates, so no kernel divides per element: a
 * 64-bit division or modulo per element (i / cols, i % C on a flat index) costs more than the
 * element's memory traffic. */
struct rows_launch {
    dim3 grid, block;
};
static inline rows_launch rows_grid(int64_t rows, int64_t cols, int per) {
    const int64_t units = (cols + per - 1) / per;
    const unsigned bx = units >= 256 ? 256 : (unsigned)((units + 31) / 32 * 32), by = 256 / bx;
    const int64_t gx = (units + bx - 1) / bx, gy = (rows + by - 1) / by;
    return {dim3((unsigned)gx, (unsigned)(gy < 65535 ? gy : 65535)), dim3(bx, by)};
}
#define ROWS_STRIDE(r, rows)                                                                  \
    for (int64_t r = (int64_t)blockIdx.y * blockDim.y + threadIdx.y; r < (rows);              \
         r += (int64_t)gridDim.y * blockDim.y)

static inline cudaStream_t compute(device *d) { return cuda_stream(d, DEV_STREAM_COMPUTE); }

/* The host waits for stream s; counted (device.h host_syncs). */
static inline void host_wait(device *d, cudaStream_t s) {
    CUDA_CHECK(cudaStreamSynchronize(s));
    d->host_syncs++;
}

#define LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError())

/* ---------------------------------------------------------------------------------------------
 * warp and block reductions. Butterfly sums, then lane 0's value is broadcast, so every lane
 * holds the same bits whatever the operation's commutativity (max of +0 and -0). */

template <typename T> __device__ T warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return __shfl_sync(0xffffffffu, v, 0);
}

/* Sum over the block (blockDim.x a multiple of 32); every thread gets the result. sh: 32
 * elements of shared memory, reusable across calls (the leading barrier guards it). */
template <typename T> __device__ T block_sum(T v, T *sh) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    return warp_sum(lane < nwarps ? sh[lane] : (T)0);
}

/* ---------------------------------------------------------------------------------------------
 * bf16. The rounding is written out in bits, as on the CPU device: round to nearest even (what
 * __float2bfloat16_rn does for every non-NaN, subnormals included), and a NaN keeps its sign and
 * top payload bits with the quiet bit set (the intrinsic would give the canonical 0x7fff), so
 * both devices produce the same bf16 bits. */

__device__ __forceinline__ uint16_t bf16_round(float x) {
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* ---------------------------------------------------------------------------------------------
 * fp16 (IEEE binary16), in bits like bf16 so that both devices give the same bits: round to
 * nearest even, subnormals kept (the unit of the last place below 2^-14 is 2^-24), overflow to
 * inf from 65520 on (the midpoint between 65504 and 2^16 rounds to the even side, up); that is
 * __float2half_rn for every non-NaN. A NaN keeps its sign and top payload bits with the quiet bit
 * set (the intrinsic would give a canonical NaN). from_fp16 is exact. */

__host__ __device__ inline uint16_t fp16_round(float x) {
#ifdef __CUDA_ARCH__
    uint32_t u = __float_as_uint(x);
#else
    uint32_t u;
    memcpy(&u, &x, sizeof u);
#endif
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);                    /* inf */
    if (a >= 0x38800000u) { /* normal: rebias the exponent by 127 - 15, round 13 bits away */
        uint32_t r = a - 0x38000000u;
        r += 0xfffu + ((r >> 13) & 1u);
        return (uint16_t)(sign | (r >> 13));
    }
    if (a <= 0x33000000u) return sign; /* at most 2^-25, half the smallest subnormal: to 0 */
    /* subnormal: the significand (implicit bit included) in units of 2^-24 is m >> s */
    const uint32_t m = (a & 0x7fffffu) | 0x800000u;
    const int s = 126 - (int)(a >> 23); /* 14 .. 24 */
    uint32_t q = m >> s;
    const uint32_t rem = m & ((1u << s) - 1u), half = 1u << (s - 1);
    q += rem > half || (rem == half && (q & 1u));
    return (uint16_t)(sign | q); /* q = 0x400 is the smallest normal: the right encoding */
}

__host__ __device__ inline float fp16_widen(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    uint32_t u;
    if (e == 0x1f) {
        u = sign | 0x7f800000u | (m << 13); /* inf, NaN with its payload */
    } else if (e == 0) { /* zero or subnormal: m 2^-24 is exact in fp32 (and normal there) */
        float f = (float)m * 5.9604644775390625e-8f;
#ifdef __CUDA_ARCH__
        u = sign | __float_as_uint(f);
#else
        memcpy(&u, &f, sizeof u);
        u |= sign;
#endif
    } else {
        u = sign | ((e + 112u) << 23) | (m << 13);
    }
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

/* x rounded to bf16 (fp16) and widened back: the value a 16-bit tensor holds, in fp32 (the
 * same bits as to_bf16/to_fp16 then from_bf16/from_fp16). */
__device__ __forceinline__ float bf16_value(float x) { return __uint_as_float((uint32_t)bf16_round(x) << 16); }
__device__ __forceinline__ float fp16_value(float x) { return fp16_widen(fp16_round(x)); }

/* ---------------------------------------------------------------------------------------------
 * The ops of the table (device.h's signatures and semantics), by the file that has them; every
 * kernel runs on cuda_stream(d, DEV_STREAM_COMPUTE). */
extern "C" {
/* cuda_mem.cu */
void *cuda_raw_alloc(device *d, size_t bytes);
void cuda_raw_free(device *d, void *p, size_t bytes);
void cuda_copy(device *d, void *dst, const void *src, size_t bytes, copy_kind kind);
void cuda_sync(device *d);
void *cuda_host_alloc(device *d, size_t bytes);
void cuda_host_free(device *d, void *p);
void cuda_copy_async(device *d, void *dst, const void *src, size_t bytes, copy_kind kind,
                     dev_stream s);
dev_event *cuda_event_new(device *d);
void cuda_event_free(device *d, dev_event *e);
void cuda_event_record(device *d, dev_event *e, dev_stream s);
void cuda_stream_wait(device *d, dev_stream s, dev_event *e);
void cuda_event_sync(device *d, dev_event *e);
void *cuda_native_stream(device *d, dev_stream s);

/* cuda_elementwise.cu */
void cuda_to_bf16(device *d, uint16_t *out, const float *in, int64_t n);
void cuda_from_bf16(device *d, float *out, const uint16_t *in, int64_t n);
void cuda_to_fp16(device *d, uint16_t *out, const float *in, int64_t n);
void cuda_from_fp16(device *d, float *out, const uint16_t *in, int64_t n);
void cuda_round_half(device *d, float *x, int64_t n, precision p);
void cuda_fill(device *d, float *x, float v, int64_t n);
void cuda_add(device *d, float *out, const float *a, const float *b, int64_t n);
void cuda_axpy(device *d, float *y, float alpha, const float *x, int64_t n);
void cuda_scale(device *d, float *x, float s, int64_t n);
void cuda_sumsq_multi(device *d, double *out, int count, const float *const *x,
                      const int64_t *n);
void cuda_copy2d(device *d, float *out, int ldo, const float *src, int lds, int rows,
                 int cols);
void cuda_gelu_fwd(device *d, float *out, const float *x, int64_t n, bool tanh_approx);
void cuda_gelu_bwd(device *d, float *dx, const float *x, const float *dout, int64_t n,
                   bool tanh_approx);
void cuda_swiglu_fwd(device *d, float *out, const float *g, const float *u, int64_t n);
void cuda_swiglu_bwd(device *d, float *dg, float *du, const float *dout, const float *g,
                     const float *u, int64_t n);
void cuda_rope(device *d, float *x, int ldx, int rows, int T, int n_heads, int hd,
               const float *inv_freq, bool inverse);
void cuda_rope_at(device *d, float *x, int ldx, int rows, int pos0, int n_heads, int hd,
                  const float *inv_freq);

/* cuda_gemm.cu */
void cuda_gemm(device *d, bool ta, bool tb, int M, int N, int K, float alpha,
               const float *A, int lda, const float *B, int ldb, float beta, float *C,
               int ldc);
void cuda_add_bias(device *d, float *x, const float *b, int N, int C);
void cuda_gemm_bias(device *d, bool ta, bool tb, int M, int N, int K, float alpha, const float *A,
                    int lda, const float *B, int ldb, float beta, float *C, int ldc,
                    const float *bias);
void cuda_gemm_bgrad(device *d, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                     const float *B, int ldb, float beta, float *C, int ldc, float *db);
/* lt mode's state (CEPHALO_CUDA_GEMM=lt): the cuBLASLt handle, made at init (an error in err),
 * and freed with its plans at close (st->lt NULL: nothing) */
int cuda_gemm_lt_new(cuda_state *st, err_t *err);
void cuda_gemm_lt_free(cuda_state *st);

/* cuda_norm.cu */
void cuda_bias_grad(device *d, float *db, const float *dout, int N, int C);
void cuda_layernorm_fwd(device *d, float *out, float *mean, float *rstd, const float *x,
                        const float *w, const float *b, int N, int C, float eps);
void cuda_add_norm_fwd(device *d, float *sum, float *out, float *mean, float *rstd,
                       const float *a, const float *b, const float *w, const float *bias,
                       int N, int C, float eps, precision hp);
void cuda_layernorm_bwd(device *d, float *dx, float *dw, float *db, const float *dout,
                        const float *x, const float *mean, const float *rstd,
                        const float *w, int N, int C);
void cuda_rmsnorm_fwd(device *d, float *out, float *rstd, const float *x, const float *w,
                      int N, int C, float eps);
void cuda_rmsnorm_bwd(device *d, float *dx, float *dw, const float *dout, const float *x,
                      const float *rstd, const float *w, int N, int C);

/* cuda_embed.cu */
void cuda_embed_fwd(device *d, float *out, const float *table, const int32_t *ids, int N,
                    int C);
void cuda_embed_bwd(device *d, float *dtable, const float *dout, const int32_t *ids, int N,
                    int C);
void cuda_patchify(device *d, float *out, const float *img, int B, int C, int S, int p);
void cuda_xent_fwd_bwd(device *d, float *logits, int ld, float *losses,
                       const int32_t *targets, int N, int V, float scale, double *loss_sum);

/* cuda_adamw.cu */
void cuda_adamw(device *d, float *p, const float *g, float *m, float *v, int64_t n, const dev_adamw *a);
void cuda_adamw_multi(device *d, float *p, const float *g, float *m, float *v, uint16_t *half,
                      precision hp, int count, const dev_adamw_seg *seg, const dev_adamw *steps);
}

/* The attributes of one of the build's kernels (cuda_elementwise.cu): cudaSuccess when the binary
 * has code this GPU can run. */
cudaError_t cuda_kernel_attributes(cudaFuncAttributes *fa);

/* Attention (cuda_attention.cu): the op table's signatures and semantics (device.h); run on
 * cuda_stream(d, DEV_STREAM_COMPUTE). */
extern "C" void cuda_attention_fwd(device *d, float *out, float *lse, const float *q, int ldq,
                                   const float *k, int ldk, const float *v, int ldv, int B, int T,
                                   int H, int Hkv, int hd, bool causal);
extern "C" void cuda_attention_bwd(device *d, float *dq, float *dk, float *dv, const float *dout,
                                   const float *out, const float *lse, const float *q, int ldq,
                                   const float *k, int ldk, const float *v, int ldv, int B, int T,
                                   int H, int Hkv, int hd, bool causal);

/* Tensor-core attention (cuda_attention_mma.cu): whether it runs this call (CEPHALO_CUDA_ATTN=mma,
 * bf16/fp16 gemm mode, sm_80+ code on an sm_80+ GPU, not portable mode), and the kernels, called
 * by cuda_attention_fwd/bwd; D [B, H, T] = rowsum(dout * out), computed by the caller. */
extern "C" bool cuda_attention_mma_ok(device *d, int hd);
extern "C" void cuda_attention_mma_fwd(device *d, float *out, float *lse, const float *q, int ldq,
                                       const float *k, int ldk, const float *v, int ldv, int B,
                                       int T, int H, int Hkv, int hd, bool causal);
extern "C" void cuda_attention_mma_bwd(device *d, float *dq, float *dk, float *dv,
                                       const float *dout, const float *lse, const float *D,
                                       const float *q, int ldq, const float *k, int ldk,
                                       const float *v, int ldv, int B, int T, int H, int Hkv,
                                       int hd, bool causal);

/* Attention of new query rows against a KV cache (cuda_attention.cu; device.h attention_cached). */
extern "C" void cuda_attention_cached(device *d, float *out, const float *q, int ldq,
                                      const float *kc, const float *vc, int n, int pos0, int H,
                                      int Hkv, int hd);

#endif
