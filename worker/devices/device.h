/* device.h - the device layer of the worker: one op table per device kind and one accounting
 * allocator in front of it.
 *
 * The trainer never touches device memory directly: it allocates through dev_alloc() (which
 * counts current and peak bytes and enforces the device's capacity) and computes through the op
 * table. Two devices implement it: the CPU device (cpu_device.c, cpu_attention.c: OpenBLAS +
 * OpenMP) and the CUDA device (cuda_device.cu and one file per op family, cuda_internal.h:
 * cuBLAS and our kernels, linked into cephalo-worker-cuda only; docs/cuda.md), so model and
 * engine code are shared. Each kind is a row of device.c's table (device_kind below), opened by
 * name; what the kinds share is dev_common.c's.
 *
 * Conventions for every op:
 *  - all float pointers are fp32 device memory, row-major, contiguous unless a leading dimension
 *    (ld*) is given; shapes are in the comments as [rows, cols];
 *  - parameter gradients (dw, db, dtable, ...) ACCUMULATE (+=), so microbatches add up;
 *  - input gradients overwrite (dx =) unless the comment says "+=" (the norms accumulate into dx
 *    because their input is the residual stream, whose gradient has another path);
 *  - ops are deterministic: the same inputs and thread count give bit-identical outputs (fixed
 *    reduction order), which single-rank resume and the multi-rank invariant rely on. */
#ifndef CEPHALO_DEVICE_H
#define CEPHALO_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/precision.h"

typedef struct device device;

typedef enum { COPY_H2D, COPY_D2H, COPY_D2D } copy_kind;

/* The device's queues (CUDA streams). Every compute op runs on DEV_STREAM_COMPUTE in issue
 * order; copies to and from the host offload pool run on their own streams so that they overlap
 * compute (paper appendix B). On the CPU device everything runs at once, in issue order. */
typedef enum { DEV_STREAM_COMPUTE = 0, DEV_STREAM_H2D = 1, DEV_STREAM_D2H = 2 } dev_stream;
#define DEV_STREAMS 3

/* A point in a stream's work (a CUDA event). */
typedef struct dev_event dev_event;

/* AdamW's scalars for step t (1-based), formed in double from the job's settings and rounded to
 * float once each, as torch.optim.AdamW forms them from Python floats: 1 - beta from the double
 * beta (from the float-rounded 0.999 it would be 1.3e-5 off, every update 6.4e-6 too large). */
typedef struct dev_adamw {
    float b1, b2, one_m_b1, one_m_b2;
    float eps;
    float decay;    /* 1 - lr * wd */
    float neg_step; /* -lr / (1 - beta1^t) */
    float bc2_sqrt; /* sqrt(1 - beta2^t) */
    float gscale;   /* the gradients' scale (1 / loss scale, times a clip factor) */
} dev_adamw;

/* A segment of an adamw_multi list. */
typedef struct dev_adamw_seg {
    int64_t off, n;
    int which; /* the step scalars: steps[which] */
} dev_adamw_seg;
/* Segments one adamw_multi launch takes on CUDA (a kernel parameter). */
#define ADAMW_MULTI_MAX 32

/* Tensors one sumsq_multi launch takes (their pointers and sizes travel as kernel parameters
 * on CUDA); longer lists take several launches, still one result. */
#define SUMSQ_MULTI_MAX 64

typedef struct dev_ops {
    const char *name; /* "cpu", "cuda" */

    /* ---- memory (raw; use dev_alloc/dev_free, which account) ---- */
    void *(*raw_alloc)(device *d, size_t bytes); /* NULL when the system is out of memory */
    void (*raw_free)(device *d, void *p, size_t bytes);
    void (*copy)(device *d, void *dst, const void *src, size_t bytes, copy_kind kind);
    void (*sync)(device *d); /* waits for all queued work (no-op on the CPU) */

    /* ---- host memory, streams and events ----
     * host_alloc: host memory the device copies to and from at full speed and asynchronously
     * (page-locked on CUDA); NULL when the system is out of memory. Not device memory: it is
     * not counted against the capacity. */
    void *(*host_alloc)(device *d, size_t bytes);
    void (*host_free)(device *d, void *p); /* NULL is a no-op */
    /* Queues a copy on stream s and returns (CUDA: at once; CPU: after copying). Host memory
     * must come from host_alloc. Ordering against other streams is the caller's, via events. */
    void (*copy_async)(device *d, void *dst, const void *src, size_t bytes, copy_kind kind,
                       dev_stream s);
    dev_event *(*event_new)(device *d); /* never NULL (CHECK-fails when the driver refuses) */
    void (*event_free)(device *d, dev_event *e);
    /* Marks the work queued on stream s so far; later waits are for that work only. */
    void (*event_record)(device *d, dev_event *e, dev_stream s);
    /* Work queued on stream s after this call starts after e's work has finished (the host does
     * not wait). An event never recorded is complete. */
    void (*stream_wait)(device *d, dev_stream s, dev_event *e);
    /* The host waits until e's work has finished. */
    void (*event_sync)(device *d, dev_event *e);
    /* The native handle of a stream (cudaStream_t on CUDA; NULL on the CPU), for the nccl
     * backend, which orders its collectives after the compute queued so far. */
    void *(*native_stream)(device *d, dev_stream s);

    /* ---- bf16 (bfloat16 as uint16_t bit patterns) ----
     * to_bf16 rounds to nearest even (NaN stays NaN); from_bf16 is exact. */
    void (*to_bf16)(device *d, uint16_t *out, const float *in, int64_t n);
    void (*from_bf16)(device *d, float *out, const uint16_t *in, int64_t n);
    /* ---- fp16 (IEEE binary16 as uint16_t bit patterns) ----
     * to_fp16 rounds to nearest even with subnormals, and overflows to +-inf above 65504 (what
     * __float2half_rn does; NaN stays NaN); from_fp16 is exact. */
    void (*to_fp16)(device *d, uint16_t *out, const float *in, int64_t n);
    void (*from_fp16)(device *d, float *out, const uint16_t *in, int64_t n);
    /* x[n] = x rounded to p's 16-bit format (PREC_BF16 or PREC_FP16, to_bf16's or to_fp16's
     * rounding) and widened back, in place: the values a 16-bit tensor holds, in fp32 (16-bit
     * activations, planner/engine_mem.h). */
    void (*round_half)(device *d, float *x, int64_t n, precision p);

    /* ---- elementwise / reductions ---- */
    void (*fill)(device *d, float *x, float v, int64_t n);
    void (*add)(device *d, float *out, const float *a, const float *b, int64_t n); /* out=a+b */
    void (*axpy)(device *d, float *y, float alpha, const float *x, int64_t n); /* y += alpha*x */
    void (*scale)(device *d, float *x, float s, int64_t n);
    /* Sum of squares of several tensors in double, left on the device (the gradient norm of a
     * step, read once with the loss: no host wait). *out (device memory, one double) = sumsq of
     * x[0] + sumsq of x[1] + ..., each tensor's sum in the device's fixed order and the tensors
     * added in list order, so the result depends on the inputs only (and count = 1 is the sum
     * of squares of one tensor). x and n are host arrays of count entries (count >= 0); n[i] may
     * be 0. One launch pair on CUDA whatever the count (up to SUMSQ_MULTI_MAX per launch). */
    void (*sumsq_multi)(device *d, double *out, int count, const float *const *x,
                        const int64_t *n);
    /* out[r, :] = src[r, :] for r < rows, with leading dimensions (copies strided row blocks). */
    void (*copy2d)(device *d, float *out, int ldo, const float *src, int lds, int rows, int cols);

    /* ---- matrix products ---- */
    /* C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C. op(X) = X^T when tX; A is stored
     * [M,K] (or [K,M] when ta) with leading dimension lda; likewise B and C. With
     * d->matmul == DEV_MATMUL_BF16 (DEV_MATMUL_FP16) the operands are rounded to bf16 (fp16,
     * where a value above 65504 becomes inf) and the products accumulate in fp32 (tensor cores on
     * CUDA, fed explicitly rounded 16-bit copies; the CPU rounds copies and calls sgemm, bit for
     * bit the same products, as both formats' products are exact in fp32); DEV_MATMUL_TF32 lets CUDA use TF32 tensor cores (the CPU ignores it). */
    void (*gemm)(device *d, bool ta, bool tb, int M, int N, int K, float alpha, const float *A,
                 int lda, const float *B, int ldb, float beta, float *C, int ldc);
    /* x[N,C] += b[C] broadcast over rows (also used for position tables: C = T*d). */
    void (*add_bias)(device *d, float *x, const float *b, int N, int C);
    /* db[C] += sum over rows of dout[N,C]. */
    void (*bias_grad)(device *d, float *db, const float *dout, int N, int C);
    /* A linear layer's forward with its bias: gemm's C = alpha op(A) op(B) + beta C, then
     * C[m, :N] += bias[:N] for every row m < M (add_bias's one addition). The same values as
     * gemm then add_bias (bit for bit on the CPU; CUDA with CEPHALO_CUDA_GEMM=lt adds the bias
     * in cuBLASLt's epilogue, one fp32 addition to the fp32 result as well). */
    void (*gemm_bias)(device *d, bool ta, bool tb, int M, int N, int K, float alpha, const float *A,
                      int lda, const float *B, int ldb, float beta, float *C, int ldc,
                      const float *bias);
    /* A linear layer's weight gradient with its bias gradient: gemm with ta (A stored [K, M],
     * contiguous: lda == M), then db[M] += the sums over A's K rows, not scaled by alpha (bias_grad
     * of A as [K, M]): dW += dy^T x and db += column sums of dy, from one read of dy where the
     * device can (CUDA with CEPHALO_CUDA_GEMM=lt: cuBLASLt's bias-gradient epilogue). */
    void (*gemm_bgrad)(device *d, bool tb, int M, int N, int K, float alpha, const float *A,
                       int lda, const float *B, int ldb, float beta, float *C, int ldc, float *db);

    /* ---- embeddings (ids are int32 device memory) ---- */
    /* out[N,C] = table[ids[n], :] (overwrites). */
    void (*embed_fwd)(device *d, float *out, const float *table, const int32_t *ids, int N, int C);
    /* dtable[ids[n], :] += dout[n, :]; deterministic (no racing adds). */
    void (*embed_bwd)(device *d, float *dtable, const float *dout, const int32_t *ids, int N,
                      int C);

    /* ---- normalisations (over the last dimension C; biased variance like PyTorch) ---- */
    /* out = (x - mean) * rstd * w + b; saves mean[N], rstd[N]. out may not alias x. */
    void (*layernorm_fwd)(device *d, float *out, float *mean, float *rstd, const float *x,
                          const float *w, const float *b, int N, int C, float eps);
    /* dx[N,C] +=, dw[C] +=, db[C] += from dout and the saved mean/rstd. */
    void (*layernorm_bwd)(device *d, float *dx, float *dw, float *db, const float *dout,
                          const float *x, const float *mean, const float *rstd, const float *w,
                          int N, int C);
    /* out = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps); saves rstd[N]. */
    void (*rmsnorm_fwd)(device *d, float *out, float *rstd, const float *x, const float *w, int N,
                        int C, float eps);
    /* The residual add and the norm after it, fused: sum = a + b (sum may alias a or b), then
     * out = the norm of sum: layernorm_fwd's (mean saved, bias b_n) or, with mean == NULL,
     * rmsnorm_fwd's (bias NULL); then out rounded as round_half rounds to hp (PREC_BF16 or
     * PREC_FP16; PREC_FP32: not rounded). Bit for bit add + the norm + round_half, with one pass
     * over the rows instead of three. out may not alias sum. */
    void (*add_norm_fwd)(device *d, float *sum, float *out, float *mean, float *rstd,
                         const float *a, const float *b, const float *w, const float *bias, int N,
                         int C, float eps, precision hp);
    /* dx[N,C] +=, dw[C] +=. */
    void (*rmsnorm_bwd)(device *d, float *dx, float *dw, const float *dout, const float *x,
                        const float *rstd, const float *w, int N, int C);

    /* ---- activations ---- */
    /* GELU, tanh approximation (GPT-2) when tanh_approx, else exact erf form (BERT, ViT). */
    void (*gelu_fwd)(device *d, float *out, const float *x, int64_t n, bool tanh_approx);
    void (*gelu_bwd)(device *d, float *dx, const float *x, const float *dout, int64_t n,
                     bool tanh_approx); /* dx = dout * gelu'(x) */
    /* SwiGLU: out = silu(g) * u, all [n]. */
    void (*swiglu_fwd)(device *d, float *out, const float *g, const float *u, int64_t n);
    void (*swiglu_bwd)(device *d, float *dg, float *du, const float *dout, const float *g,
                       const float *u, int64_t n);

    /* ---- rotary position embedding (rotate-half convention of Hugging Face Llama) ----
     * x holds rows of n_heads*hd values with leading dimension ldx; row r is the token at
     * position r % T. For i < hd/2: (x_i, x_{i+hd/2}) is rotated by angle t * inv_freq[i] (a
     * host array of hd/2 floats: model_rope_inv_freq, theta^(-2i/hd) with any rope_scaling), in
     * place. inverse rotates by the negative angle (the backward of the forward). */
    void (*rope)(device *d, float *x, int ldx, int rows, int T, int n_heads, int hd,
                 const float *inv_freq, bool inverse);

    /* ---- attention (flash-style: never a T x T matrix per head) ----
     * q: [B*T rows, H*hd] with leading dimension ldq; k, v: [B*T, Hkv*hd] with leading
     * dimensions ldk, ldv (q, k, v usually live side by side in one fused projection output).
     * Head h reads k/v head h / (H/Hkv) (grouped-query attention). Scale 1/sqrt(hd). causal:
     * token t attends to tokens <= t; otherwise to all T tokens of its sample.
     * out: [B*T, H*hd] contiguous; lse: [B, H, T] log-sum-exp of the scaled scores, saved for
     * the backward. */
    void (*attention_fwd)(device *d, float *out, float *lse, const float *q, int ldq,
                          const float *k, int ldk, const float *v, int ldv, int B, int T, int H,
                          int Hkv, int hd, bool causal);
    /* dq, dk, dv are written (overwritten) in the same strided layouts as q, k, v (ldq, ldk,
     * ldv); dout and out are [B*T, H*hd]. Scratch is O(block * T) per thread, not T x T. */
    void (*attention_bwd)(device *d, float *dq, float *dk, float *dv, const float *dout,
                          const float *out, const float *lse, const float *q, int ldq,
                          const float *k, int ldk, const float *v, int ldv, int B, int T, int H,
                          int Hkv, int hd, bool causal);

    /* ---- generation with a KV cache (worker/model/kvcache.c, docs/sample.md) ----
     * rope_at: rope's forward rotation on `rows` rows (leading dimension ldx) of which row r is
     * the token at position pos0 + r: the new tokens of a decode step, after pos0 cached ones.
     * Same angles and rounding as rope, so rope_at(pos0 = 0) equals rope with T >= rows. */
    void (*rope_at)(device *d, float *x, int ldx, int rows, int pos0, int n_heads, int hd,
                    const float *inv_freq);
    /* attention_cached: n new query rows against a K/V cache. q: [n, H*hd] with leading
     * dimension ldq; kc, vc: [>= pos0+n, Hkv*hd] contiguous, rows 0 .. pos0+n-1 filled (the new
     * tokens' keys and values already written at rows pos0 ..). Query row i is the token at
     * position pos0 + i and attends to cache rows 0 .. pos0+i (causal). Grouped-query heads and
     * the 1/sqrt(hd) scale as attention_fwd; no lse (nothing to back-propagate).
     * out: [n, H*hd] contiguous (overwritten). */
    void (*attention_cached)(device *d, float *out, const float *q, int ldq, const float *kc,
                             const float *vc, int n, int pos0, int H, int Hkv, int hd);

    /* ---- fused softmax cross-entropy ----
     * logits [N, V] (row stride ld >= V; columns V.. are not read or written) are overwritten by the gradient of (scale * sum of row losses):
     * dlogits = scale * (softmax - onehot(target)). losses[N] gets each row's unscaled loss.
     * targets[n] < 0 marks a row without a target: loss 0, gradient 0. *loss_sum (device memory,
     * one double) += scale * (the row losses summed in double in row order): the loss stays on
     * the device, and the step reads it once (no host wait here). */
    void (*xent_fwd_bwd)(device *d, float *logits, int ld, float *losses, const int32_t *targets, int N,
                         int V, float scale, double *loss_sum);

    /* ---- images ---- */
    /* ViT patch extraction: img [B, C, S, S] -> out [B * (S/p)^2, C*p*p], patches in row-major
     * order, each patch flattened as (c, py, px) so a [d, C, p, p] conv weight is a matmul. */
    void (*patchify)(device *d, float *out, const float *img, int B, int C, int S, int p);

    /* ---- optimizer ----
     * AdamW on n elements with one step's scalars (dev_adamw_step): g_eff = g * gscale;
     * m = b1*m + (1-b1)*g_eff; v = b2*v + (1-b2)*g_eff^2; p = p*decay + (neg_step*m) /
     * (sqrt(v)/bc2_sqrt + eps), each operation rounded separately (PyTorch's AdamW order: the
     * decay p *= 1 - lr*wd applies to the pre-update p, then the Adam step). */
    void (*adamw)(device *d, float *p, const float *g, float *m, float *v, int64_t n, const dev_adamw *a);
    /* adamw over a list of segments of one unit's buffers in one launch (the multi-tensor
     * update: a unit's tensors differ only in their step scalars, decayed or not): segment i
     * updates elements [seg[i].off, seg[i].off + seg[i].n) of p, g, m, v with steps[seg[i].which]
     * (which is 0 or 1), each element with adamw's operations, so the same bits. half: NULL, or
     * also half[k] = the updated p[k] rounded to hp (PREC_BF16 or PREC_FP16: dev_to_half's
     * rounding), the 16-bit copy the next gather sends, written in the same pass. count >= 0;
     * segments may not overlap. Lists longer than ADAMW_MULTI_MAX take several launches. */
    void (*adamw_multi)(device *d, float *p, const float *g, float *m, float *v, uint16_t *half,
                        precision hp, int count, const dev_adamw_seg *seg,
                        const dev_adamw *steps);
} dev_ops;



dev_adamw dev_adamw_step(double lr, double beta1, double beta2, double eps, double wd, long t, float gscale);

/* How gemm treats its fp32 operands. */
typedef enum {
    DEV_MATMUL_FP32 = 0, /* exact fp32 products (the CPU device; CUDA without tensor cores) */
    DEV_MATMUL_TF32 = 1, /* CUDA: TF32 tensor cores, fp32 accumulation (fp32 training on GPU) */
    DEV_MATMUL_BF16 = 2, /* operands rounded to bf16, fp32 accumulation (bf16 mixed precision) */
    DEV_MATMUL_FP16 = 3  /* operands rounded to fp16, fp32 accumulation (fp16 mixed precision) */
} dev_matmul;

/* The gemm mode a training precision runs in: 16-bit operands for bf16/fp16; fp32 on TF32 tensor
 * cores on CUDA, exact on the CPU. */
dev_matmul dev_matmul_for(precision p, bool cuda);
/* The 16-bit copies of bf16/fp16 training (parameter gathers): out = in rounded to p's format
 * (p must be bf16 or fp16), and back (exact). */
void dev_to_half(device *d, precision p, uint16_t *out, const float *in, int64_t n);
void dev_from_half(device *d, precision p, float *out, const uint16_t *in, int64_t n);

#define DEV_CONTEXT_LEN 128

struct device {
    const dev_ops *ops;
    int rank;
    int threads;
    dev_matmul matmul;
    int64_t capacity; /* bytes; 0 = unlimited */
    int64_t cur_bytes, peak_bytes;
    int64_t n_allocs; /* live allocations */
    /* what is being computed ("block.3 forward"); names OOM errors. Room for the longest context
     * the trainer sets, "set-up of unit N (a shard of N of its N parameters)" with 64-bit counts
     * (under 100 bytes); dev_set_context ends a longer one at a whole word. */
    char context[DEV_CONTEXT_LEN];
    err_t err; /* the last allocation error */
    /* Times the host waited for the device (a stream or event synchronisation, a copy to or
     * from the host, growing a scratch buffer): the step's launch-bound cost that no kernel
     * timer shows. The CPU device counts the same points (its copies and syncs), so the
     * trainer's count per step is testable without a GPU (step_stats.host_syncs). */
    int64_t host_syncs;
    void *impl; /* the device kind's state */
    void *alloc_table; /* dev_alloc's pointer -> size table (dev_common.c) */
};

/* A device kind: one row of device.c's table, chosen by name (device_open), in the shape of the
 * comm layer's backends (comm_internal.h). The CPU row is every binary's; the CUDA row
 * (cuda_device.cu) registers itself at start-up in cephalo-worker-cuda only.
 *   init   creates the device: `threads` OpenMP threads (CPU; 0 = all cores) or GPU `gpu` (an
 *          index among the visible GPUs: its streams, cuBLAS handle and caching allocator);
 *          capacity in bytes, 0 = unlimited on the CPU, on a GPU its free memory at start less
 *          a reserve for the CUDA context and libraries (a smaller capacity emulates a smaller
 *          GPU). Each kind ignores the argument of the other.
 *   close  frees what init made (d->ops->name is the row's name: device_close finds it so).
 *   count  devices of the kind visible (CPU: 1, the host; CUDA: 0 with no driver or no GPU). */
typedef struct device_kind {
    const char *name; /* "cpu", "cuda": device_open's kind, and the op table's name */
    int (*init)(device *d, int rank, int threads, int gpu, int64_t capacity, err_t *err);
    void (*close)(device *d);
    int (*count)(void);
} device_kind;

/* The CPU device's row (cpu_device.c). */
extern const device_kind cpu_device_kind;
/* Makes a kind known by its name: cuda_device.cu registers itself at start-up in the binaries it
 * is linked into (a constructor; at most 4 kinds). */
void device_kind_register(const device_kind *k);

/* The CPU device's init and close (its row's), also called directly by the CPU tests. */
int cpu_device_init(device *d, int rank, int threads, int64_t capacity, err_t *err);
void cpu_device_close(device *d);
/* Takes `bytes` off the capacity of the device opened on GPU `gpu` with an automatic capacity
 * (none with an explicit one, which the plan has budgeted): memory a library takes outside our
 * allocator, NCCL's buffers (common/nccl_budget.h). Fails when that would leave nothing. Only in
 * cephalo-worker-cuda. */
int cuda_device_reserve(int gpu, int64_t bytes, const char *what, err_t *err);
/* Number of visible GPUs: the cuda row's count, 0 in a build without CUDA (no such row). */
int device_cuda_count(void);

/* Opens a device by kind name ("cpu" or "cuda", the rows of the table): an unknown name, or
 * "cuda" in a worker built without CUDA, is an error naming what to use. Closes whichever kind
 * d is. */
int device_open(device *d, const char *kind, int rank, int threads, int gpu, int64_t capacity,
                err_t *err);
void device_close(device *d);

/* Accounting allocator. Returns NULL and fills d->err when the allocation would exceed the
 * capacity (the message names the rank, d->context, `what`, the size, and the bytes in use) or
 * the system is out of memory. Memory is 64-byte aligned and NOT zeroed. */
void *dev_alloc(device *d, size_t bytes, const char *what);
void dev_free(device *d, void *p);
/* Releases the allocator's table; device close functions call it. */
void dev_free_table(device *d);
/* The RoPE cos/sin tables [T, hd/2] of positions 0..T-1 for inv_freq[hd/2] (dev_common.c): what
 * every device's rope rotates by. */
void dev_rope_table(const float *inv_freq, int T, int hd, float *cos_t, float *sin_t);
/* Sets the context that out-of-memory errors name (printf-style). One longer than
 * DEV_CONTEXT_LEN - 1 bytes is cut after its last whole word (never inside a word or a UTF-8
 * character) and ends with "...". */
void dev_set_context(device *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Shorthands. */
static inline float *dev_alloc_f(device *d, int64_t n, const char *what) {
    return (float *)dev_alloc(d, (size_t)n * sizeof(float), what);
}
void dev_zero(device *d, float *x, int64_t n);
void dev_upload(device *d, void *dst, const void *src, size_t bytes);
void dev_download(device *d, void *dst, const void *src, size_t bytes);

#endif
