/* cuda_device.cu - the CUDA device: cuBLAS for the matrix products, our kernels for the rest.
 * This file has the op table, the timed table of CEPHALO_CUDA_OPTIME, and the device's init and
 * close, registered at start-up as the "cuda" row of the device kinds (device.c); the ops live
 * one family a file (cuda_internal.h lists them).
 *
 * Every compute op is queued on the compute stream and returns at once; only copies to and from
 * host memory, sync and event_sync make the host wait (each counted in d->host_syncs, as are the
 * rare waits before a scratch buffer grows). Reductions the step needs on the host (the loss,
 * the gradient norm) stay on the device (xent_fwd_bwd, sumsq_multi) until the trainer reads
 * them in one copy per step. The h2d and d2h streams carry copy_async only; the trainer orders
 * them against compute with events.
 *
 * Determinism (device.h): no kernel uses floating-point atomics. Row reductions (norms, softmax)
 * are warp/block trees whose shape depends only on the launch, which depends only on the shapes;
 * column sums (bias, norm weights) sum fixed row chunks into partials and then add the partials
 * in chunk order; embed_bwd sorts the ids (a stable radix sort) and adds each id's rows in token
 * order, which is exactly the CPU device's order; sumsq uses a fixed grid. cuBLAS is bit-wise
 * reproducible for one toolkit version, GPU model and stream (its documented guarantee, with the
 * default atomics mode, which disallows atomics).
 *
 * Threading: like the CPU device, the ops are called from the one host thread that opened the
 * device (cudaSetDevice is done once, in init, for that thread). */
#include <string.h>

#include <type_traits>

#include "devices/cuda_internal.h"

extern "C" {
#include "common/env.h"
#include "common/log.h"
}

/* Bytes kept free for the CUDA context, cuBLAS (and cuBLASLt in lt mode, which shares cuBLAS's
 * workspace), the scratch buffers and the 16-bit gemm workspaces when capacity is 0. (NCCL's
 * buffers come off later, when a communicator opens on the GPU: cuda_device_reserve.) */
#define CUDA_RESERVE (((int64_t)512 << 20) + 2 * (int64_t)GEMM16_BYTES)

/* ---------------------------------------------------------------------------------------------
 * the op table and the device */

static dev_ops make_ops(void) {
    dev_ops o;
    memset(&o, 0, sizeof o);
    o.name = "cuda";
    o.raw_alloc = cuda_raw_alloc;
    o.raw_free = cuda_raw_free;
    o.copy = cuda_copy;
    o.sync = cuda_sync;
    o.host_alloc = cuda_host_alloc;
    o.host_free = cuda_host_free;
    o.copy_async = cuda_copy_async;
    o.event_new = cuda_event_new;
    o.event_free = cuda_event_free;
    o.event_record = cuda_event_record;
    o.stream_wait = cuda_stream_wait;
    o.event_sync = cuda_event_sync;
    o.native_stream = cuda_native_stream;
    o.to_bf16 = cuda_to_bf16;
    o.from_bf16 = cuda_from_bf16;
    o.to_fp16 = cuda_to_fp16;
    o.from_fp16 = cuda_from_fp16;
    o.round_half = cuda_round_half;
    o.add_norm_fwd = cuda_add_norm_fwd;
    o.fill = cuda_fill;
    o.add = cuda_add;
    o.axpy = cuda_axpy;
    o.scale = cuda_scale;
    o.sumsq_multi = cuda_sumsq_multi;
    o.copy2d = cuda_copy2d;
    o.gemm = cuda_gemm;
    o.add_bias = cuda_add_bias;
    o.bias_grad = cuda_bias_grad;
    o.gemm_bias = cuda_gemm_bias;
    o.gemm_bgrad = cuda_gemm_bgrad;
    o.embed_fwd = cuda_embed_fwd;
    o.embed_bwd = cuda_embed_bwd;
    o.layernorm_fwd = cuda_layernorm_fwd;
    o.layernorm_bwd = cuda_layernorm_bwd;
    o.rmsnorm_fwd = cuda_rmsnorm_fwd;
    o.rmsnorm_bwd = cuda_rmsnorm_bwd;
    o.gelu_fwd = cuda_gelu_fwd;
    o.gelu_bwd = cuda_gelu_bwd;
    o.swiglu_fwd = cuda_swiglu_fwd;
    o.swiglu_bwd = cuda_swiglu_bwd;
    o.rope = cuda_rope;
    o.attention_fwd = cuda_attention_fwd;
    o.attention_bwd = cuda_attention_bwd;
    o.rope_at = cuda_rope_at;
    o.attention_cached = cuda_attention_cached;
    o.xent_fwd_bwd = cuda_xent_fwd_bwd;
    o.patchify = cuda_patchify;
    o.adamw = cuda_adamw;
    o.adamw_multi = cuda_adamw_multi;
    return o;
}

/* Filled member by member (C++17 has no designated initialisers), once, at load time. */
static const dev_ops cuda_ops = make_ops();

/* A timed op: F bracketed as class C on the compute stream. */
template <optime_class C, auto F>
struct timed;
template <optime_class C, typename R, typename... A, R (*F)(device *, A...)>
struct timed<C, F> {
    static R call(device *d, A... a) {
        cuda_optime_begin(d, C, DEV_STREAM_COMPUTE);
        if constexpr (std::is_void_v<R>) {
            F(d, a...);
            cuda_optime_end(d);
        } else {
            R r = F(d, a...);
            cuda_optime_end(d);
            return r;
        }
    }
};

static void timed_copy_async(device *d, void *dst, const void *src, size_t bytes,
                             copy_kind kind, dev_stream s) {
    cuda_optime_begin(d, s == DEV_STREAM_H2D   ? OT_COPY_H2D
                         : s == DEV_STREAM_D2H ? OT_COPY_D2H
                                               : OT_COPY_OTHER,
                      s);
    cuda_copy_async(d, dst, src, bytes, kind, s);
    cuda_optime_end(d);
}

#define TIMED(cls, op) o.op = timed<cls, cuda_##op>::call
static dev_ops make_timed_ops(void) {
    dev_ops o = make_ops();
    TIMED(OT_COPY, copy);
    o.copy_async = timed_copy_async;
    TIMED(OT_ROUND, to_bf16);
    TIMED(OT_ROUND, from_bf16);
    TIMED(OT_ROUND, to_fp16);
    TIMED(OT_ROUND, from_fp16);
    TIMED(OT_ROUND, round_half);
    TIMED(OT_ELEMWISE, fill);
    TIMED(OT_ELEMWISE, add);
    TIMED(OT_ELEMWISE, axpy);
    TIMED(OT_ELEMWISE, scale);
    TIMED(OT_SUMSQ, sumsq_multi);
    TIMED(OT_ELEMWISE, copy2d);
    TIMED(OT_GEMM, gemm);
    TIMED(OT_BIAS, add_bias);
    TIMED(OT_BIAS, bias_grad);
    /* gemm_bias, gemm_bgrad time their parts themselves (cuda_gemm.cu): gemm, and bias */
    TIMED(OT_EMBED, embed_fwd);
    TIMED(OT_EMBED, embed_bwd);
    TIMED(OT_NORM, layernorm_fwd);
    TIMED(OT_NORM, layernorm_bwd);
    TIMED(OT_NORM, rmsnorm_fwd);
    TIMED(OT_NORM, rmsnorm_bwd);
    TIMED(OT_NORM, add_norm_fwd);
    TIMED(OT_ACT, gelu_fwd);
    TIMED(OT_ACT, gelu_bwd);
    TIMED(OT_ACT, swiglu_fwd);
    TIMED(OT_ACT, swiglu_bwd);
    TIMED(OT_ROPE, rope);
    TIMED(OT_ATTN_FWD, attention_fwd);
    TIMED(OT_ATTN_BWD, attention_bwd);
    TIMED(OT_ROPE, rope_at);
    TIMED(OT_ATTN_CACHED, attention_cached);
    TIMED(OT_XENT, xent_fwd_bwd);
    TIMED(OT_EMBED, patchify);
    TIMED(OT_ADAMW, adamw);
    TIMED(OT_ADAMW, adamw_multi);
    return o;
}
#undef TIMED

static const dev_ops cuda_ops_timed = make_timed_ops();

/* CEPHALO_CUDA_OPTIME=1 (common/env.c: 0 or 1; NULL: the program's entry checked it) */
static bool optime_mode(void) { return env_flag("CEPHALO_CUDA_OPTIME", NULL) == 1; }

static int cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

/* Frees whatever init created (NULL members are skipped), after the queued work. */
static void destroy_state(cuda_state *st) {
    for (int s = 0; s < DEV_STREAMS; s++)
        if (st->stream[s]) (void)cudaStreamSynchronize(st->stream[s]);
    if (st->blas) (void)cublasDestroy(st->blas);
    cuda_gemm_lt_free(st);
    for (int i = 0; i < st->n_lists; i++) {
        for (int j = 0; j < st->lists[i].n; j++) (void)cudaFree(st->lists[i].blocks[j]);
        free(st->lists[i].blocks);
    }
    free(st->lists);
    void *dev_ptrs[] = {st->blas_workspace, st->red_partials, st->scratch,  st->rope_cos,
                        st->rope_sin,       st->gemm16[0],    st->gemm16[1]};
    for (size_t i = 0; i < sizeof dev_ptrs / sizeof *dev_ptrs; i++)
        if (dev_ptrs[i]) (void)cudaFree(dev_ptrs[i]);
    for (int s = 0; s < DEV_STREAMS; s++)
        if (st->stream[s]) (void)cudaStreamDestroy(st->stream[s]);
    free(st->rope_freq);
    free(st);
}

/* Creates the streams, the cuBLAS handle (and cuBLASLt's in lt mode) and the scratch; a message
 * in err on failure. */
static int create_state(cuda_state *st, bool lt, err_t *err) {
    cudaError_t e = cudaSuccess;
    for (int s = 0; s < DEV_STREAMS && e == cudaSuccess; s++)
        e = cudaStreamCreateWithFlags(&st->stream[s], cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaMalloc(&st->blas_workspace, BLAS_WORKSPACE);
    if (e == cudaSuccess)
        e = cudaMalloc(&st->red_partials, (size_t)CUDA_RED_BLOCKS * SUMSQ_MULTI_MAX * sizeof(double));
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return err_set(err, "cuda device: GPU %d: setting up streams and scratch failed: %s",
                       st->gpu, cudaGetErrorString(e));
    }
    cublasStatus_t b = cublasCreate(&st->blas);
    /* the workspace after the stream: cublasSetStream resets it to the default pool */
    if (b == CUBLAS_STATUS_SUCCESS) b = cublasSetStream(st->blas, st->stream[DEV_STREAM_COMPUTE]);
    if (b == CUBLAS_STATUS_SUCCESS)
        b = cublasSetWorkspace(st->blas, st->blas_workspace, BLAS_WORKSPACE);
    if (b == CUBLAS_STATUS_SUCCESS) b = cublasSetMathMode(st->blas, CUBLAS_DEFAULT_MATH);
    if (b != CUBLAS_STATUS_SUCCESS)
        return err_set(err, "cuda device: GPU %d: cuBLAS setup failed: %s", st->gpu,
                       cublasGetStatusString(b));
    return lt ? cuda_gemm_lt_new(st, err) : 0;
}

#ifndef CEPHALO_CUDA_ARCHS
#define CEPHALO_CUDA_ARCHS "unknown" /* the Makefile passes the CUDA_ARCHS it built */
#endif

/* Fails unless the binary has code this GPU can run: a kernel's attributes are only available
 * when the fatbinary holds SASS for the GPU or PTX it can JIT (a newer GPU). Asking the runtime
 * is more robust than comparing against CEPHALO_CUDA_ARCHS (PTX, -gencode variants). *code_arch
 * gets the virtual architecture the loaded code was compiled for (__CUDA_ARCH__ / 10): the
 * cp.async kernels exist in it only from 80 on (an sm_80 GPU JITting compute_75 PTX has none). */
static int check_arch(const cudaDeviceProp &p, int gpu, int *code_arch, err_t *err) {
    cudaFuncAttributes fa;
    cudaError_t e = cuda_kernel_attributes(&fa);
    if (e == cudaSuccess && p.major >= 6) {
        *code_arch = fa.ptxVersion;
        return 0;
    }
    (void)cudaGetLastError();
    const char *why = e == cudaSuccess ? "is older than the oldest this worker supports (6.0)"
                      : e == cudaErrorNoKernelImageForDevice || e == cudaErrorInvalidDeviceFunction
                          ? "has no code in this build"
                          : cudaGetErrorString(e);
    return err_set(err,
                   "cuda device: GPU %d (%s, compute capability %d.%d) %s: this "
                   "cephalo-worker-cuda was built for compute capabilities %s (as sm_XY; plus PTX "
                   "of the newest for later GPUs); rebuild with make CUDA_ARCHS=\"%d%d\" and a CUDA "
                   "toolkit that targets it (CUDA 12.x for 6.x and 7.0; CUDA 13 starts at 7.5)",
                   gpu, p.name, p.major, p.minor, why, CEPHALO_CUDA_ARCHS, p.major, p.minor);
}

/* CEPHALO_CUDA_PORTABLE (0 or 1), CEPHALO_CUDA_ATTN (simt or mma) and CEPHALO_CUDA_GEMM (blas
 * or lt), through common/env.c's rows: anything else is refused, as at the program's start. */
static int device_modes(bool *portable, bool *mma, bool *lt, err_t *err) {
    int p = env_flag("CEPHALO_CUDA_PORTABLE", err);
    const char *attn = p < 0 ? NULL : env_word("CEPHALO_CUDA_ATTN", err);
    const char *gemm = attn ? env_word("CEPHALO_CUDA_GEMM", err) : NULL;
    if (!gemm) return err_prefix(err, "cuda device");
    *portable = p == 1, *mma = !strcmp(attn, "mma"), *lt = !strcmp(gemm, "lt");
    return 0;
}

/* What the kernels choose their paths by: compute capability and shared-memory limit. */
static int read_limits(cuda_state *st, const cudaDeviceProp &p, bool *lt, err_t *err) {
    int optin = 0;
    cudaError_t e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, st->gpu);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return err_set(err, "cuda device: GPU %d: cannot read its shared-memory limit: %s",
                       st->gpu, cudaGetErrorString(e));
    }
    st->cc_major = p.major, st->cc_minor = p.minor;
    st->smem_optin = optin > 48 * 1024 ? optin : 48 * 1024; /* sm_60/61 have no opt-in */
    return device_modes(&st->portable, &st->attn_mma, lt, err);
}

/* The devices opened with an automatic capacity, by GPU, so that NCCL's buffers can come off
 * it when a communicator opens there (cuda_device_reserve). One per GPU and process. */
#define MAX_GPUS 64
static device *auto_capacity[MAX_GPUS];

extern "C" int cuda_device_reserve(int gpu, int64_t bytes, const char *what, err_t *err) {
    device *d = gpu >= 0 && gpu < MAX_GPUS ? auto_capacity[gpu] : NULL;
    if (!d || bytes <= 0) return 0; /* an explicit capacity: the plan has budgeted it */
    if (d->capacity - bytes <= d->cur_bytes)
        return err_set(err,
                       "rank %d: GPU %d: %s need about %lld MiB, more than the %lld MiB left of "
                       "the device's capacity",
                       d->rank, gpu, what, (long long)(bytes >> 20),
                       (long long)((d->capacity - d->cur_bytes) >> 20));
    d->capacity -= bytes;
    return 0;
}

static int cuda_device_init(device *d, int rank, int gpu, int64_t capacity, err_t *err) {
    if (capacity < 0)
        return err_set(err, "cuda device: capacity must be >= 0 bytes (got %lld)",
                       (long long)capacity);
    int count = cuda_device_count();
    if (count == 0)
        return err_set(err, "cuda device: no GPU is visible (no driver, or no device)");
    if (gpu < 0 || gpu >= count)
        return err_set(err, "cuda device: GPU %d does not exist (%d visible)", gpu, count);
    cudaError_t e = cudaSetDevice(gpu);
    cudaDeviceProp prop;
    if (e == cudaSuccess) e = cudaGetDeviceProperties(&prop, gpu);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return err_set(err, "cuda device: cannot use GPU %d: %s", gpu, cudaGetErrorString(e));
    }
    int code_arch = 0;
    if (check_arch(prop, gpu, &code_arch, err) < 0) return -1;
    cuda_state *st = (cuda_state *)xcalloc(1, sizeof(cuda_state));
    st->gpu = gpu;
    st->code_arch = code_arch;
    bool lt = false;
    if (read_limits(st, prop, &lt, err) < 0 || create_state(st, lt, err) != 0) {
        destroy_state(st);
        return -1;
    }
    const bool automatic = capacity == 0;
    if (automatic) { /* what is free now, less a reserve for the context and libraries */
        size_t free_b = 0, total_b = 0;
        CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
        capacity = (int64_t)free_b - CUDA_RESERVE;
        if (capacity <= 0) {
            destroy_state(st);
            return err_set(err, "cuda device: GPU %d has only %lld MiB free", gpu,
                           (long long)(free_b >> 20));
        }
    }
    if (optime_mode()) st->optime = cuda_optime_new();
    memset(d, 0, sizeof *d);
    d->ops = st->optime ? &cuda_ops_timed : &cuda_ops;
    d->rank = rank;
    d->threads = 1;
    d->matmul = DEV_MATMUL_FP32;
    d->capacity = capacity;
    d->impl = st;
    if (automatic && gpu < MAX_GPUS) auto_capacity[gpu] = d;
    return 0;
}

static void cuda_device_close(device *d) {
    cuda_state *st = cuda_of(d);
    if (st && st->gpu < MAX_GPUS && auto_capacity[st->gpu] == d) auto_capacity[st->gpu] = NULL;
    if (st && st->optime) cuda_optime_finish(st->optime, d->rank, st->gpu);
    if (st) destroy_state(st);
    d->impl = NULL;
    dev_free_table(d);
}

/* The "cuda" row of the device kinds (device.h): cephalo-worker-cuda links this file, and it
 * registers the row before main, as comm_nccl.c registers the nccl backend; the CPU binaries
 * never see the name. */
static int cuda_kind_init(device *d, int rank, int threads, int gpu, int64_t capacity, err_t *err) {
    (void)threads;
    return cuda_device_init(d, rank, gpu, capacity, err);
}

static const device_kind cuda_device_kind = {"cuda", cuda_kind_init, cuda_device_close, cuda_device_count};

__attribute__((constructor)) static void cuda_kind_register(void) { device_kind_register(&cuda_device_kind); }
