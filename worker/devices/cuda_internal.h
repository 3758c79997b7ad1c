/* cuda_internal.h - shared pieces of the CUDA device (cuda_device.cu, cuda_attention.cu).
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
    void *blas_workspace; /* cuBLAS workspace (cudaMalloc'ed at init, outside the accounting) */

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

    /* CEPHALO_CUDA_OPTIME=1: the event pairs and the per-class times (cuda_device.cu); NULL
     * when off, and then no op is wrapped (the plain op table). */
    struct cuda_optime *optime;
} cuda_state;

static inline cuda_state *cuda_of(device *d) { return (cuda_state *)d->impl; }

/* The CUDA stream behind a dev_stream. */
static inline cudaStream_t cuda_stream(device *d, dev_stream s) { return cuda_of(d)->stream[s]; }

/* A per-device scratch buffer of at least `bytes`, for work on the compute stream. Growing it
 * synchronises the compute stream (the old buffer may still be in use by queued kernels) and
 * invalidates earlier pointers, so take it once per op. Not counted against d->capacity. */
void *cuda_scratch(device *d, size_t bytes);

/* CEPHALO_CUDA_OPTIME: brackets work queued on stream s as class c (optime.h); begin/end pairs
 * nest (a gemm's operand rounding inside the gemm). No-ops when timing is off. */
void cuda_optime_begin(device *d, optime_class c, dev_stream s);
void cuda_optime_end(device *d);

/* Bytes the caching allocator holds from cudaMalloc (live + cached). */
extern "C" int64_t cuda_reserved_bytes(device *d);

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
