/* cuda_device.cu - the CUDA device: cuBLAS for the matrix products, our kernels for the rest.
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
#include <assert.h>
#include <math.h>
#include <string.h>

#include <type_traits>

#include <cub/device/device_radix_sort.cuh>

#include "devices/cuda_internal.h"

extern "C" {
#include "common/env.h"
#include "common/log.h"
}

struct dev_event {
    cudaEvent_t ev;
};

/* Threads per block of the elementwise kernels. */
#define EW_THREADS 256
/* Rows per block of the warp-per-row kernels (norms). */
#define ROWS_PER_BLOCK 8
/* Threads per block of the block-per-row kernels (cross-entropy). */
#define XENT_THREADS 1024
/* The two 16-bit gemm operand workspaces (BF16/FP16 mode), GEMM16_BYTES each. */
#define GEMM16_BYTES ((size_t)32 << 20)
/* Bytes kept free for the CUDA context, cuBLAS, the scratch buffers and the 16-bit gemm
 * workspaces when capacity is 0. (NCCL's buffers come off later, when a communicator opens on
 * the GPU: cuda_device_reserve.) */
#define CUDA_RESERVE (((int64_t)512 << 20) + 2 * (int64_t)GEMM16_BYTES)
#define BLAS_WORKSPACE ((size_t)32 << 20) /* what cuBLAS recommends for Hopper */

#define GRID_STRIDE(i, n)                                                                 \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);             \
         i += (int64_t)gridDim.x * blockDim.x)

/* Blocks for a grid-stride loop over n elements (n > 0). */
static unsigned ew_blocks(int64_t n) {
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
static rows_launch rows_grid(int64_t rows, int64_t cols, int per) {
    const int64_t units = (cols + per - 1) / per;
    const unsigned bx = units >= 256 ? 256 : (unsigned)((units + 31) / 32 * 32), by = 256 / bx;
    const int64_t gx = (units + bx - 1) / bx, gy = (rows + by - 1) / by;
    return {dim3((unsigned)gx, (unsigned)(gy < 65535 ? gy : 65535)), dim3(bx, by)};
}
#define ROWS_STRIDE(r, rows)                                                                  \
    for (int64_t r = (int64_t)blockIdx.y * blockDim.y + threadIdx.y; r < (rows);              \
         r += (int64_t)gridDim.y * blockDim.y)

static cudaStream_t compute(device *d) { return cuda_stream(d, DEV_STREAM_COMPUTE); }

/* The host waits for stream s; counted (device.h host_syncs). */
static void host_wait(device *d, cudaStream_t s) {
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

/* max that propagates NaN (a diverged row stays visible, as on the CPU) */
__device__ float max_nan(float a, float b) { return (b > a || b != b) ? b : a; }

__device__ float warp_max_nan(float v) {
    for (int o = 16; o > 0; o >>= 1) v = max_nan(v, __shfl_xor_sync(0xffffffffu, v, o));
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

__device__ float block_max_nan(float v, float *sh) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_max_nan(v);
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    return warp_max_nan(lane < nwarps ? sh[lane] : sh[0]);
}

/* ---------------------------------------------------------------------------------------------
 * memory: a caching allocator. Sizes are rounded to a class (cuda_internal.h) and freed blocks
 * wait on the free list of their class; cudaMalloc only on a miss. dev_alloc (device.c) does
 * the accounting against d->capacity; this layer only supplies raw memory. */

static size_t round_class(size_t bytes) {
    size_t unit = bytes < CUDA_LARGE ? CUDA_SMALL : CUDA_LARGE;
    if (bytes > SIZE_MAX - unit) return 0; /* overflow: no class */
    return (bytes + unit - 1) / unit * unit;
}

/* The free list of a rounded size; created when create. */
static cuda_freelist *freelist(cuda_state *st, size_t bytes, bool create) {
    for (int i = 0; i < st->n_lists; i++)
        if (st->lists[i].bytes == bytes) return &st->lists[i];
    if (!create) return NULL;
    if (st->n_lists == st->cap_lists) {
        st->cap_lists = st->cap_lists ? 2 * st->cap_lists : 64;
        st->lists = (cuda_freelist *)xrealloc(st->lists, (size_t)st->cap_lists * sizeof *st->lists);
    }
    cuda_freelist *l = &st->lists[st->n_lists++];
    memset(l, 0, sizeof *l);
    l->bytes = bytes;
    return l;
}

/* cudaFree's every cached block (after the queued work: a cached block is free, but the
 * kernels that last used it may still be running). */
static void release_cached(device *d) {
    cuda_state *st = cuda_of(d);
    for (int s = 0; s < DEV_STREAMS; s++) host_wait(d, st->stream[s]);
    for (int i = 0; i < st->n_lists; i++) {
        cuda_freelist *l = &st->lists[i];
        for (int j = 0; j < l->n; j++) CUDA_CHECK(cudaFree(l->blocks[j]));
        st->reserved_bytes -= (int64_t)l->bytes * l->n;
        l->n = 0;
    }
}

/* cudaMalloc that clears the (non-sticky) error it leaves behind on failure, so the next
 * launch check does not report it. */
static void *try_malloc(size_t bytes) {
    void *p = NULL;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

static void *cuda_raw_alloc(device *d, size_t bytes) {
    cuda_state *st = cuda_of(d);
    size_t rounded = round_class(bytes);
    if (!rounded) return NULL;
    cuda_freelist *l = freelist(st, rounded, false);
    if (l && l->n > 0) return l->blocks[--l->n];
    void *p = try_malloc(rounded);
    if (!p) { /* the cache may hold the memory in blocks of other sizes */
        release_cached(d);
        p = try_malloc(rounded);
        if (!p) return NULL;
    }
    st->reserved_bytes += (int64_t)rounded;
    return p; /* cudaMalloc memory is 256-byte aligned (dev_alloc promises 64) */
}

/* Back to the cache, not to cudaFree. Safe with work still queued because every kernel runs on
 * the compute stream: whoever gets the block next uses it in work queued after the work that
 * used it before. (The trainer keeps memory that h2d/d2h copies touch alive until their events
 * have completed.) */
static void cuda_raw_free(device *d, void *p, size_t bytes) {
    cuda_freelist *l = freelist(cuda_of(d), round_class(bytes), true);
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 16;
        l->blocks = (void **)xrealloc(l->blocks, (size_t)l->cap * sizeof *l->blocks);
    }
    l->blocks[l->n++] = p;
}

extern "C" int64_t cuda_reserved_bytes(device *d) { return cuda_of(d)->reserved_bytes; }

/* cudaMalloc for the device's own buffers outside the accounting (scratch, rope tables): on a
 * failure the cache is released and the call retried once; a second failure aborts, naming
 * what was wanted (these are small, covered by the capacity's reserve). */
static void *must_malloc(device *d, size_t bytes, const char *what) {
    void *p = try_malloc(bytes);
    if (!p) {
        release_cached(d);
        p = try_malloc(bytes);
    }
    if (!p) {
        fprintf(stderr, "%s:%d: rank %d: out of GPU memory for %zu bytes of %s during %s\n",
                __FILE__, __LINE__, d->rank, bytes, what, d->context[0] ? d->context : "setup");
        abort();
    }
    return p;
}

void *cuda_scratch(device *d, size_t bytes) {
    cuda_state *st = cuda_of(d);
    if (bytes <= st->scratch_bytes) return st->scratch;
    host_wait(d, compute(d)); /* queued kernels may use the old buffer */
    if (st->scratch) CUDA_CHECK(cudaFree(st->scratch));
    st->scratch = NULL, st->scratch_bytes = 0;
    size_t want = round_class(bytes);
    st->scratch = must_malloc(d, want, "kernel scratch");
    st->scratch_bytes = want;
    return st->scratch;
}

static cudaMemcpyKind memcpy_kind(copy_kind kind) {
    switch (kind) {
    case COPY_H2D: return cudaMemcpyHostToDevice;
    case COPY_D2H: return cudaMemcpyDeviceToHost;
    default: return cudaMemcpyDeviceToDevice;
    }
}

/* In compute order; a copy from or to the host waits, since host memory may be pageable and
 * the caller reads or reuses it right after. */
static void cuda_copy(device *d, void *dst, const void *src, size_t bytes, copy_kind kind) {
    if (!bytes) return;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, memcpy_kind(kind), compute(d)));
    if (kind != COPY_D2D) host_wait(d, compute(d));
}

static bool optime_resolve_one(cuda_optime *o, bool wait);

static void cuda_sync(device *d) {
    for (int s = 0; s < DEV_STREAMS; s++)
        CUDA_CHECK(cudaStreamSynchronize(cuda_stream(d, (dev_stream)s)));
    d->host_syncs++; /* one wait for the caller, however many streams */
    if (cuda_optime *o = cuda_of(d)->optime) /* everything has ended: no wait */
        while (optime_resolve_one(o, false)) {
        }
}

/* ---------------------------------------------------------------------------------------------
 * host memory, streams and events */

static void *cuda_host_alloc(device *d, size_t bytes) {
    (void)d;
    void *p = NULL;
    if (cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

static void cuda_host_free(device *d, void *p) {
    (void)d;
    if (p) CUDA_CHECK(cudaFreeHost(p));
}

static void cuda_copy_async(device *d, void *dst, const void *src, size_t bytes, copy_kind kind,
                            dev_stream s) {
    if (!bytes) return;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, memcpy_kind(kind), cuda_stream(d, s)));
}

static dev_event *cuda_event_new(device *d) {
    (void)d;
    dev_event *e = (dev_event *)xmalloc(sizeof *e);
    CUDA_CHECK(cudaEventCreateWithFlags(&e->ev, cudaEventDisableTiming));
    return e;
}

static void cuda_event_free(device *d, dev_event *e) {
    (void)d;
    if (!e) return;
    CUDA_CHECK(cudaEventDestroy(e->ev));
    free(e);
}

static void cuda_event_record(device *d, dev_event *e, dev_stream s) {
    CUDA_CHECK(cudaEventRecord(e->ev, cuda_stream(d, s)));
}

/* A never-recorded event counts as complete for cudaStreamWaitEvent, as device.h wants. */
static void cuda_stream_wait(device *d, dev_stream s, dev_event *e) {
    CUDA_CHECK(cudaStreamWaitEvent(cuda_stream(d, s), e->ev, 0));
}

static void cuda_event_sync(device *d, dev_event *e) {
    CUDA_CHECK(cudaEventSynchronize(e->ev));
    d->host_syncs++;
}

static void *cuda_native_stream(device *d, dev_stream s) { return (void *)cuda_stream(d, s); }

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

__global__ void to_bf16_kernel(uint16_t *out, const float *in, int64_t n) {
    GRID_STRIDE(i, n) out[i] = bf16_round(in[i]);
}

__global__ void from_bf16_kernel(float *out, const uint16_t *in, int64_t n) {
    GRID_STRIDE(i, n) out[i] = __uint_as_float((uint32_t)in[i] << 16);
}

static void cuda_to_bf16(device *d, uint16_t *out, const float *in, int64_t n) {
    if (n <= 0) return;
    to_bf16_kernel<<<ew_blocks(n), EW_THREADS, 0, compute(d)>>>(out, in, n);
    LAUNCH_CHECK();
}

static void cuda_from_bf16(device *d, float *out, const uint16_t *in, int64_t n) {
    if (n <= 0) return;
    from_bf16_kernel<<<ew_blocks(n), EW_THREADS, 0, compute(d)>>>(out, in, n);
    LAUNCH_CHECK();
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

__global__ void to_fp16_kernel(uint16_t *out, const float *in, int64_t n) {
    GRID_STRIDE(i, n) out[i] = fp16_round(in[i]);
}

__global__ void from_fp16_kernel(float *out, const uint16_t *in, int64_t n) {
    GRID_STRIDE(i, n) out[i] = fp16_widen(in[i]);
}

static void cuda_to_fp16(device *d, uint16_t *out, const float *in, int64_t n) {
    if (n <= 0) return;
    to_fp16_kernel<<<ew_blocks(n), EW_THREADS, 0, compute(d)>>>(out, in, n);
    LAUNCH_CHECK();
}

static void cuda_from_fp16(device *d, float *out, const uint16_t *in, int64_t n) {
    if (n <= 0) return;
    from_fp16_kernel<<<ew_blocks(n), EW_THREADS, 0, compute(d)>>>(out, in, n);
    LAUNCH_CHECK();
}

/* x rounded to bf16 (fp16) and widened back: the value a 16-bit tensor holds, in fp32 (the
 * same bits as to_bf16/to_fp16 then from_bf16/from_fp16). */
__device__ __forceinline__ float bf16_value(float x) { return __uint_as_float((uint32_t)bf16_round(x) << 16); }
__device__ __forceinline__ float fp16_value(float x) { return fp16_widen(fp16_round(x)); }

/* 16-bit activations: x in place as a bf16/fp16 tensor holds it. */
template <bool BF16> __global__ void round_half_kernel(float *x, int64_t n) {
    GRID_STRIDE(i, n) x[i] = BF16 ? bf16_value(x[i]) : fp16_value(x[i]);
}

static void cuda_round_half(device *d, float *x, int64_t n, precision p) {
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

static void cuda_fill(device *d, float *x, float v, int64_t n) {
    if (n <= 0) return;
    fill_kernel<<<ew_blocks(n), EW_THREADS, 0, compute(d)>>>(x, v, n);
    LAUNCH_CHECK();
}

static void cuda_add(device *d, float *out, const float *a, const float *b, int64_t n) {
    if (n <= 0) return;
    add_kernel<<<ew_blocks(n), EW_THREADS, 0, compute(d)>>>(out, a, b, n);
    LAUNCH_CHECK();
}

static void cuda_axpy(device *d, float *y, float alpha, const float *x, int64_t n) {
    if (n <= 0) return;
    axpy_kernel<<<ew_blocks(n), EW_THREADS, 0, compute(d)>>>(y, alpha, x, n);
    LAUNCH_CHECK();
}

static void cuda_scale(device *d, float *x, float s, int64_t n) {
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

static void cuda_sumsq_multi(device *d, double *out, int count, const float *const *x,
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

/* One block: *acc += scale * (the sum of v[0..n)), thread t summing t, t + blockDim, ... then a
 * fixed tree. */
__global__ void add_scaled_sum_kernel(double *acc, const double *v, int n, double scale) {
    __shared__ double sh[32];
    double s = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += v[i];
    s = block_sum(s, sh);
    if (threadIdx.x == 0) *acc += scale * s;
}

static void cuda_copy2d(device *d, float *out, int ldo, const float *src, int lds, int rows,
                        int cols) {
    if (rows <= 0 || cols <= 0) return;
    CUDA_CHECK(cudaMemcpy2DAsync(out, (size_t)ldo * sizeof(float), src,
                                 (size_t)lds * sizeof(float), (size_t)cols * sizeof(float),
                                 (size_t)rows, cudaMemcpyDeviceToDevice, compute(d)));
}

/* ---------------------------------------------------------------------------------------------
 * matrix products. cuBLAS is column-major: the row-major C[M,N] (ldc) is the column-major
 * C^T[N,M] (ldc), and C^T = op(B)^T op(A)^T, so cuBLAS computes an N x M product with B as its
 * first operand and A as its second, each transposed exactly when the row-major op transposes
 * it (a row-major [K,N] B is the column-major B^T, which is op(B)^T when !tb). */

/* C[M,N] (ldc) *= beta, or = 0 when beta == 0 (BLAS: C is not read then). */
__global__ void scale_rows_kernel(float *C, int ldc, int M, int N, float beta) {
    int64_t total = (int64_t)M * N;
    GRID_STRIDE(i, total) {
        float *c = C + (i / N) * ldc + i % N;
        *c = beta == 0.0f ? 0.0f : *c * beta;
    }
}

static cublasComputeType_t compute_type(dev_matmul mm) {
    switch (mm) {
    case DEV_MATMUL_TF32: return CUBLAS_COMPUTE_32F_FAST_TF32;
    /* plain fp32: with the handle's math mode CUBLAS_DEFAULT_MATH (set at init) cuBLAS uses
     * no TF32 and no emulation for it. (CUBLAS_COMPUTE_32F_PEDANTIC would also ignore the
     * environment overrides, but cuBLAS documents pedantic math as possibly slower.) */
    default: return CUBLAS_COMPUTE_32F;
    }
}

/* ---- gemm in BF16 / FP16 mode ----
 * The operands are rounded explicitly into 16-bit copies (exactly what the CPU device rounds),
 * then multiplied by cublasGemmEx with 16-bit inputs, fp32 output and CUBLAS_COMPUTE_32F:
 * products of two bf16 (fp16) values are exact in fp32 and are accumulated in fp32, so the only
 * difference from the CPU device is the order of the fp32 sums. (CUBLAS_COMPUTE_32F_FAST_16BF
 * on fp32 inputs would let cuBLAS round as it likes, or not at all on its GEMV paths.) bf16
 * before sm_80 (no bf16 tensor cores, and cuBLAS's 16BF support is not guaranteed there) rounds
 * to bf16 and widens back to fp32 for an fp32 product: the same values, the same products
 * (CEPHALO_CUDA_PORTABLE=1 takes this path on any GPU, to test it). fp16 inputs with fp32
 * compute run on every GPU (tensor cores from sm_70, CUDA cores on sm_60/61).
 *
 * The copies live in two workspaces of GEMM16_BYTES (cuda_state.gemm16, inside the capacity's
 * reserve). An operand larger than that (the logits gradient [tokens, vocab], a big weight) is
 * taken in chunks of rows of C (A's rows) or columns of C (B's columns): every element of C is
 * still one K-long sum, and the chunking depends on the shapes only (deterministic). */

enum gemm16_mode { G16_BF16, G16_FP16, G16_BF16_WIDE };

/* One operand element, rounded: the 16-bit pattern, or (G16_BF16_WIDE) its fp32 value. */
template <int MODE> struct g16_elem { typedef uint16_t type; };
template <> struct g16_elem<G16_BF16_WIDE> { typedef float type; };

template <int MODE> __device__ __forceinline__ typename g16_elem<MODE>::type g16_round(float x) {
    if constexpr (MODE == G16_BF16) return bf16_round(x);
    else if constexpr (MODE == G16_FP16) return fp16_round(x);
    else return bf16_value(x);
}

/* out[r, c] (leading dimension ldo) = in[r, c] (ld) rounded, for r < rows, c < cols. A thread
 * takes four columns of a row: threads along a row (x), rows over y and the grid's y with a
 * stride. vec: in's rows start 16-byte aligned (the base and ld allow it), so the four are one
 * 16-byte load and one 8-byte (16 for WIDE) store; ldo is a multiple of 8 (round8), so out's rows
 * are aligned. No per-element 64-bit division: the flat-index form spent most of its time
 * there (docs/gpu.md: this kernel was 29% of a bf16 step). */
template <int MODE>
__global__ void round_operand_kernel(void *out, int64_t ldo, const float *in, int64_t ld,
                                     int rows, int cols, bool vec) {
    typedef typename g16_elem<MODE>::type T;
    const int c = 4 * (blockIdx.x * blockDim.x + threadIdx.x);
    if (c >= cols) return;
    ROWS_STRIDE(r, rows) {
        const float *src = in + (int64_t)r * ld + c;
        T *dst = (T *)out + (int64_t)r * ldo + c;
        if (vec && c + 4 <= cols) {
            const float4 v = *(const float4 *)src;
            const T o0 = g16_round<MODE>(v.x), o1 = g16_round<MODE>(v.y), o2 = g16_round<MODE>(v.z),
                    o3 = g16_round<MODE>(v.w);
            if constexpr (MODE == G16_BF16_WIDE)
                *(float4 *)dst = make_float4(o0, o1, o2, o3);
            else /* little-endian: element c in the low half */
                *(uint2 *)dst = make_uint2((uint32_t)o0 | (uint32_t)o1 << 16, (uint32_t)o2 | (uint32_t)o3 << 16);
        } else {
            for (int k = 0; k < 4 && c + k < cols; k++) dst[k] = g16_round<MODE>(src[k]);
        }
    }
}

struct gemm16_op {
    gemm16_mode mode;
    size_t esize;         /* bytes per element of the copies */
    cudaDataType_t type;  /* their cuBLAS type */
};

static gemm16_op gemm16_op_of(device *d) {
    const bool fp16 = d->matmul == DEV_MATMUL_FP16;
    if (fp16) return {G16_FP16, 2, CUDA_R_16F};
    const cuda_state *st = cuda_of(d);
    if (st->cc_major >= 8 && !st->portable) return {G16_BF16, 2, CUDA_R_16BF}; /* cuBLAS's code */
    return {G16_BF16_WIDE, 4, CUDA_R_32F}; /* pre-sm_80, and portable mode, which tests it */
}

static int round8(int x) { return (x + 7) / 8 * 8; } /* 16-byte rows of 16-bit values */

/* Rounds the [rows, cols] block at src (ld) into the workspace w, leading dimension round8(cols),
 * which it returns. */
static int round_operand(device *d, const gemm16_op &g, void *w, const float *src, int ld,
                         int rows, int cols) {
    const int ldo = round8(cols);
    if (rows <= 0 || cols <= 0) return ldo;
    const rows_launch l = rows_grid(rows, cols, 4);
    const dim3 grid = l.grid, block = l.block;
    const bool vec = (uintptr_t)src % 16 == 0 && ld % 4 == 0;
    cuda_optime_begin(d, OT_GEMM_ROUND, DEV_STREAM_COMPUTE);
    switch (g.mode) {
    case G16_BF16:
        round_operand_kernel<G16_BF16><<<grid, block, 0, compute(d)>>>(w, ldo, src, ld, rows, cols, vec);
        break;
    case G16_FP16:
        round_operand_kernel<G16_FP16><<<grid, block, 0, compute(d)>>>(w, ldo, src, ld, rows, cols, vec);
        break;
    case G16_BF16_WIDE:
        round_operand_kernel<G16_BF16_WIDE><<<grid, block, 0, compute(d)>>>(w, ldo, src, ld, rows, cols, vec);
        break;
    }
    LAUNCH_CHECK();
    cuda_optime_end(d);
    return ldo;
}

/* Rows (of C) per chunk so that a chunk of an operand with K columns fits `elems` elements,
 * whichever way it is stored (K + 8 per row covers the padding of either layout). */
static int gemm16_chunk(int64_t elems, int K, int total) {
    int64_t n = elems / ((int64_t)K + 8) / 8 * 8;
    if (n < 8) n = 8;
    return n < total ? (int)n : total;
}

/* The two workspaces, grown (outside the accounting, like the scratch) only for a K so long
 * that 8 rows do not fit GEMM16_BYTES (a vocabulary of millions). */
static void gemm16_workspace(device *d, size_t esize, int K) {
    cuda_state *st = cuda_of(d);
    size_t need = (size_t)8 * ((size_t)K + 8) * esize;
    if (need < GEMM16_BYTES) need = GEMM16_BYTES;
    if (st->gemm16[0] && st->gemm16_bytes >= need) return;
    host_wait(d, compute(d)); /* queued gemms may use the old ones */
    for (int i = 0; i < 2; i++) {
        if (st->gemm16[i]) CUDA_CHECK(cudaFree(st->gemm16[i]));
        st->gemm16[i] = NULL;
    }
    for (int i = 0; i < 2; i++) st->gemm16[i] = must_malloc(d, need, "16-bit gemm operands");
    st->gemm16_bytes = need;
}

static void gemm16(device *d, bool ta, bool tb, int M, int N, int K, float alpha, const float *A,
                   int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    const gemm16_op g = gemm16_op_of(d);
    gemm16_workspace(d, g.esize, K);
    cuda_state *st = cuda_of(d);
    const int64_t elems = (int64_t)(st->gemm16_bytes / g.esize);
    const int mc = gemm16_chunk(elems, K, M), nc = gemm16_chunk(elems, K, N);
    int lda16 = 0, ldb16 = 0;
    for (int n0 = 0; n0 < N; n0 += nc) {
        const int nn = N - n0 < nc ? N - n0 : nc;
        /* columns n0.. of op(B): stored [K, N] (!tb) or [N, K] (tb) */
        ldb16 = tb ? round_operand(d, g, st->gemm16[1], B + (int64_t)n0 * ldb, ldb, nn, K)
                   : round_operand(d, g, st->gemm16[1], B + n0, ldb, K, nn);
        for (int m0 = 0; m0 < M; m0 += mc) {
            const int mm = M - m0 < mc ? M - m0 : mc;
            if (n0 == 0 || mc < M) /* rows m0.. of op(A): stored [M, K] (!ta) or [K, M] (ta) */
                lda16 = ta ? round_operand(d, g, st->gemm16[0], A + m0, lda, K, mm)
                           : round_operand(d, g, st->gemm16[0], A + (int64_t)m0 * lda, lda, mm, K);
            CUBLAS_CHECK(cublasGemmEx(st->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                      ta ? CUBLAS_OP_T : CUBLAS_OP_N, nn, mm, K, &alpha,
                                      st->gemm16[1], g.type, ldb16, st->gemm16[0], g.type, lda16,
                                      &beta, C + (int64_t)m0 * ldc + n0, CUDA_R_32F, ldc,
                                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        }
    }
}

static void cuda_gemm(device *d, bool ta, bool tb, int M, int N, int K, float alpha,
                      const float *A, int lda, const float *B, int ldb, float beta, float *C,
                      int ldc) {
    if (M == 0 || N == 0) return;
    if (K == 0) { /* an empty sum: C = beta * C (not left to cuBLAS's quick-return rules) */
        if (beta == 1.0f) return;
        scale_rows_kernel<<<ew_blocks((int64_t)M * N), EW_THREADS, 0, compute(d)>>>(C, ldc, M, N,
                                                                                     beta);
        LAUNCH_CHECK();
        return;
    }
    if (d->matmul == DEV_MATMUL_BF16 || d->matmul == DEV_MATMUL_FP16) {
        gemm16(d, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    CUBLAS_CHECK(cublasGemmEx(cuda_of(d)->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                              ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, CUDA_R_32F, ldb,
                              A, CUDA_R_32F, lda, &beta, C, CUDA_R_32F, ldc,
                              compute_type(d->matmul), CUBLAS_GEMM_DEFAULT));
}

/* x[N,C] += b[C] (rows_grid's launch: a column a thread) */
__global__ void add_bias_kernel(float *x, const float *b, int N, int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const float bc = b[c];
    ROWS_STRIDE(r, N) x[r * C + c] += bc;
}

static void cuda_add_bias(device *d, float *x, const float *b, int N, int C) {
    if (N <= 0 || C <= 0) return;
    const rows_launch l = rows_grid(N, C, 1);
    add_bias_kernel<<<l.grid, l.block, 0, compute(d)>>>(x, b, N, C);
    LAUNCH_CHECK();
}

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

static void cuda_bias_grad(device *d, float *db, const float *dout, int N, int C) {
    column_sums(d, NULL, db, dout, NULL, NULL, NULL, N, C);
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

static void cuda_embed_fwd(device *d, float *out, const float *table, const int32_t *ids, int N,
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

static void cuda_embed_bwd(device *d, float *dtable, const float *dout, const int32_t *ids, int N,
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

static void cuda_layernorm_fwd(device *d, float *out, float *mean, float *rstd, const float *x,
                               const float *w, const float *b, int N, int C, float eps) {
    if (N <= 0 || C <= 0) return;
    layernorm_fwd_kernel<<<row_blocks(N), ROWS_PER_BLOCK * 32, 0, compute(d)>>>(
        out, mean, rstd, x, w, b, N, C, eps);
    LAUNCH_CHECK();
}

static void cuda_add_norm_fwd(device *d, float *sum, float *out, float *mean, float *rstd,
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

static void cuda_layernorm_bwd(device *d, float *dx, float *dw, float *db, const float *dout,
                               const float *x, const float *mean, const float *rstd,
                               const float *w, int N, int C) {
    if (N <= 0 || C <= 0) return;
    norm_bwd_dx_kernel<<<row_blocks(N), ROWS_PER_BLOCK * 32, 0, compute(d)>>>(dx, dout, x, mean,
                                                                              rstd, w, N, C);
    LAUNCH_CHECK();
    column_sums(d, dw, db, dout, x, mean, rstd, N, C);
}

static void cuda_rmsnorm_fwd(device *d, float *out, float *rstd, const float *x, const float *w,
                             int N, int C, float eps) {
    if (N <= 0 || C <= 0) return;
    rmsnorm_fwd_kernel<<<row_blocks(N), ROWS_PER_BLOCK * 32, 0, compute(d)>>>(out, rstd, x, w, N,
                                                                              C, eps);
    LAUNCH_CHECK();
}

static void cuda_rmsnorm_bwd(device *d, float *dx, float *dw, const float *dout, const float *x,
                             const float *rstd, const float *w, int N, int C) {
    if (N <= 0 || C <= 0) return;
    norm_bwd_dx_kernel<<<row_blocks(N), ROWS_PER_BLOCK * 32, 0, compute(d)>>>(dx, dout, x, NULL,
                                                                              rstd, w, N, C);
    LAUNCH_CHECK();
    column_sums(d, dw, NULL, dout, x, NULL, rstd, N, C);
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

static void cuda_gelu_fwd(device *d, float *out, const float *x, int64_t n, bool tanh_approx) {
    if (n <= 0) return;
    gelu_fwd_kernel<<<ew_blocks(n), EW_THREADS, 0, compute(d)>>>(out, x, n, tanh_approx);
    LAUNCH_CHECK();
}

static void cuda_gelu_bwd(device *d, float *dx, const float *x, const float *dout, int64_t n,
                          bool tanh_approx) {
    if (n <= 0) return;
    gelu_bwd_kernel<<<ew_blocks(n), EW_THREADS, 0, compute(d)>>>(dx, x, dout, n, tanh_approx);
    LAUNCH_CHECK();
}

static void cuda_swiglu_fwd(device *d, float *out, const float *g, const float *u, int64_t n) {
    if (n <= 0) return;
    swiglu_fwd_kernel<<<ew_blocks(n), EW_THREADS, 0, compute(d)>>>(out, g, u, n);
    LAUNCH_CHECK();
}

static void cuda_swiglu_bwd(device *d, float *dg, float *du, const float *dout, const float *g,
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
    st->rope_cos = (float *)must_malloc(d, bytes, "rotary cos table");
    st->rope_sin = (float *)must_malloc(d, bytes, "rotary sin table");
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

static void cuda_rope(device *d, float *x, int ldx, int rows, int T, int n_heads, int hd,
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

static void cuda_rope_at(device *d, float *x, int ldx, int rows, int pos0, int n_heads, int hd,
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

/* ---------------------------------------------------------------------------------------------
 * fused softmax cross-entropy: one block per row. */

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

static void cuda_xent_fwd_bwd(device *d, float *logits, int ld, float *losses,
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

static void cuda_patchify(device *d, float *out, const float *img, int B, int C, int S, int p) {
    CHECK(p > 0 && S % p == 0);
    int np = S / p;
    int64_t total = (int64_t)B * np * np * C * p * p;
    if (total <= 0) return;
    patchify_kernel<<<ew_blocks(total), EW_THREADS, 0, compute(d)>>>(out, img, total, C, S, p);
    LAUNCH_CHECK();
}

/* ---------------------------------------------------------------------------------------------
 * optimizer: torch.optim.AdamW's order of operations, as on the CPU device (see cpu_adamw), with
 * the scalars formed in double on the host and every operation rounded separately (_rn
 * intrinsics: no FMA fusion), so the update has the CPU device's bits. */

/* One element's update; returns the new p. */
__device__ __forceinline__ float adamw_elem(float *p, float g, float *m, float *v, float b1, float b2,
                                            float eps, float decay, float one_m_b1, float one_m_b2,
                                            float neg_step, float bc2_sqrt, float gscale) {
    float gi = __fmul_rn(g, gscale);
    float mi = __fadd_rn(__fmul_rn(*m, b1), __fmul_rn(one_m_b1, gi));
    float vi = __fadd_rn(__fmul_rn(*v, b2), __fmul_rn(__fmul_rn(one_m_b2, gi), gi));
    float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), bc2_sqrt), eps);
    float pi = __fadd_rn(__fmul_rn(*p, decay), __fdiv_rn(__fmul_rn(neg_step, mi), denom));
    *p = pi, *m = mi, *v = vi;
    return pi;
}

__global__ void adamw_kernel(float *p, const float *g, float *m, float *v, int64_t n, float b1,
                             float b2, float eps, float decay, float one_m_b1, float one_m_b2,
                             float neg_step, float bc2_sqrt, float gscale) {
    GRID_STRIDE(i, n) adamw_elem(p + i, g[i], m + i, v + i, b1, b2, eps, decay, one_m_b1, one_m_b2,
                                 neg_step, bc2_sqrt, gscale);
}

static void cuda_adamw(device *d, float *p, const float *g, float *m, float *v, int64_t n, const dev_adamw *a) {
    if (n <= 0) return;
    adamw_kernel<<<ew_blocks(n), EW_THREADS, 0, compute(d)>>>(p, g, m, v, n, a->b1, a->b2, a->eps, a->decay,
                                                              a->one_m_b1, a->one_m_b2, a->neg_step,
                                                              a->bc2_sqrt, a->gscale);
    LAUNCH_CHECK();
}

/* adamw_multi: blockIdx.y is the segment, a grid-stride loop over its elements; the list and
 * both steps' scalars travel as kernel parameters (about 0.9 KiB), so one launch updates a unit.
 * H: 0 no 16-bit copy, 1 bf16, 2 fp16. */
typedef struct adamw_list {
    int64_t off[ADAMW_MULTI_MAX], n[ADAMW_MULTI_MAX];
    int which[ADAMW_MULTI_MAX];
    dev_adamw steps[2];
} adamw_list;

template <int H>
__global__ void adamw_multi_kernel(float *p, const float *g, float *m, float *v, uint16_t *half,
                                   adamw_list l) {
    const int k = blockIdx.y;
    const dev_adamw a = l.steps[l.which[k]];
    const int64_t o = l.off[k];
    GRID_STRIDE(j, l.n[k]) {
        const int64_t i = o + j;
        float pi = adamw_elem(p + i, g[i], m + i, v + i, a.b1, a.b2, a.eps, a.decay, a.one_m_b1,
                              a.one_m_b2, a.neg_step, a.bc2_sqrt, a.gscale);
        if (H == 1) half[i] = bf16_round(pi);
        if (H == 2) half[i] = fp16_round(pi);
    }
}

static void cuda_adamw_multi(device *d, float *p, const float *g, float *m, float *v, uint16_t *half,
                             precision hp, int count, const dev_adamw_seg *seg, const dev_adamw *steps) {
    CHECK(count >= 0 && (!half || precision_half(hp)));
    for (int done = 0; done < count;) {
        int k = count - done < ADAMW_MULTI_MAX ? count - done : ADAMW_MULTI_MAX;
        adamw_list l;
        memset(&l, 0, sizeof l);
        l.steps[0] = steps[0], l.steps[1] = steps[1];
        int64_t most = 0;
        for (int i = 0; i < k; i++) {
            const dev_adamw_seg *s = &seg[done + i];
            CHECK(s->which == 0 || s->which == 1);
            l.off[i] = s->off, l.n[i] = s->n > 0 ? s->n : 0, l.which[i] = s->which;
            if (l.n[i] > most) most = l.n[i];
        }
        done += k;
        if (most == 0) continue;
        dim3 grid(ew_blocks(most), (unsigned)k);
        if (!half)
            adamw_multi_kernel<0><<<grid, EW_THREADS, 0, compute(d)>>>(p, g, m, v, half, l);
        else if (hp == PREC_BF16)
            adamw_multi_kernel<1><<<grid, EW_THREADS, 0, compute(d)>>>(p, g, m, v, half, l);
        else
            adamw_multi_kernel<2><<<grid, EW_THREADS, 0, compute(d)>>>(p, g, m, v, half, l);
        LAUNCH_CHECK();
    }
}

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

/* ---------------------------------------------------------------------------------------------
 * CEPHALO_CUDA_OPTIME=1: GPU time per op class (optime.h, docs/cuda.md)
 *
 * Each op of the timed table records a start and a stop event (timing enabled) on its stream
 * around the plain op; nothing waits for them. The pairs live in a ring of OT_PAIRS, resolved
 * oldest first by cudaEventElapsedTime once their stop event has completed: polled
 * (cudaEventQuery, no wait) when the ring is three quarters full and at every sync, and waited
 * for only when the ring is full (once per OT_PAIRS ops, never in practice inside a step of a
 * small model) and at close, where the table goes to stderr. Off: the plain table, no cost. */

#define OT_PAIRS 4096
#define OT_DEPTH 4 /* nesting: gemm > operand rounding */

struct cuda_optime {
    cudaEvent_t start[OT_PAIRS], stop[OT_PAIRS];
    unsigned char cls[OT_PAIRS];
    bool closed[OT_PAIRS];
    dev_stream stream[OT_PAIRS];
    int head, used;          /* slots [head, head + used) are taken, in begin order */
    int open[OT_DEPTH], depth; /* begun, not yet ended */
    optime_acc acc;
};

/* Adds the oldest pair's time if it has ended (wait: also if its work is still queued). */
static bool optime_resolve_one(cuda_optime *o, bool wait) {
    if (o->used == 0 || !o->closed[o->head]) return false;
    const int i = o->head;
    if (wait) {
        CUDA_CHECK(cudaEventSynchronize(o->stop[i]));
    } else {
        cudaError_t q = cudaEventQuery(o->stop[i]);
        if (q == cudaErrorNotReady) return false;
        CUDA_CHECK(q);
    }
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, o->start[i], o->stop[i]));
    optime_add(&o->acc, (optime_class)o->cls[i], ms);
    o->closed[i] = false;
    o->head = (o->head + 1) % OT_PAIRS, o->used--;
    return true;
}

void cuda_optime_begin(device *d, optime_class c, dev_stream s) {
    cuda_optime *o = cuda_of(d)->optime;
    if (!o) return;
    CHECK(o->depth < OT_DEPTH);
    if (o->used >= OT_PAIRS * 3 / 4)
        while (optime_resolve_one(o, false)) {
        }
    while (o->used >= OT_PAIRS - OT_DEPTH) CHECK(optime_resolve_one(o, true));
    const int i = (o->head + o->used) % OT_PAIRS;
    o->used++;
    o->cls[i] = (unsigned char)c, o->stream[i] = s, o->closed[i] = false;
    o->open[o->depth++] = i;
    CUDA_CHECK(cudaEventRecord(o->start[i], cuda_stream(d, s)));
}

void cuda_optime_end(device *d) {
    cuda_optime *o = cuda_of(d)->optime;
    if (!o) return;
    CHECK(o->depth > 0);
    const int i = o->open[--o->depth];
    CUDA_CHECK(cudaEventRecord(o->stop[i], cuda_stream(d, o->stream[i])));
    o->closed[i] = true;
}

static cuda_optime *optime_new(void) {
    cuda_optime *o = (cuda_optime *)xcalloc(1, sizeof *o);
    for (int i = 0; i < OT_PAIRS; i++) {
        CUDA_CHECK(cudaEventCreate(&o->start[i]));
        CUDA_CHECK(cudaEventCreate(&o->stop[i]));
    }
    return o;
}

/* Waits for every pair, prints the table (rank, GPU) to stderr, frees o. */
static void optime_finish(cuda_optime *o, int rank, int gpu) {
    while (optime_resolve_one(o, true)) {
    }
    char title[64];
    snprintf(title, sizeof title, "rank %d, GPU %d", rank, gpu);
    optime_print(&o->acc, title, stderr);
    for (int i = 0; i < OT_PAIRS; i++) {
        (void)cudaEventDestroy(o->start[i]);
        (void)cudaEventDestroy(o->stop[i]);
    }
    free(o);
}

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

extern "C" int cuda_device_count(void) {
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

/* Creates the streams, the cuBLAS handle and the scratch; a message in err on failure. */
static int create_state(cuda_state *st, err_t *err) {
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
    return 0;
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
    cudaError_t e = cudaFuncGetAttributes(&fa, fill_kernel);
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

/* CEPHALO_CUDA_PORTABLE (0 or 1) and CEPHALO_CUDA_ATTN (simt or mma), through common/env.c's
 * rows: anything else is refused, as at the program's start. */
static int device_modes(bool *portable, bool *mma, err_t *err) {
    int p = env_flag("CEPHALO_CUDA_PORTABLE", err);
    const char *attn = p < 0 ? NULL : env_word("CEPHALO_CUDA_ATTN", err);
    if (!attn) return err_prefix(err, "cuda device");
    *portable = p == 1, *mma = !strcmp(attn, "mma");
    return 0;
}

/* What the kernels choose their paths by: compute capability and shared-memory limit. */
static int read_limits(cuda_state *st, const cudaDeviceProp &p, err_t *err) {
    int optin = 0;
    cudaError_t e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, st->gpu);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return err_set(err, "cuda device: GPU %d: cannot read its shared-memory limit: %s",
                       st->gpu, cudaGetErrorString(e));
    }
    st->cc_major = p.major, st->cc_minor = p.minor;
    st->smem_optin = optin > 48 * 1024 ? optin : 48 * 1024; /* sm_60/61 have no opt-in */
    return device_modes(&st->portable, &st->attn_mma, err);
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

extern "C" int cuda_device_init(device *d, int rank, int gpu, int64_t capacity, err_t *err) {
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
    if (read_limits(st, prop, err) < 0 || create_state(st, err) != 0) {
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
    if (optime_mode()) st->optime = optime_new();
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

extern "C" void cuda_device_close(device *d) {
    cuda_state *st = cuda_of(d);
    if (st && st->gpu < MAX_GPUS && auto_capacity[st->gpu] == d) auto_capacity[st->gpu] = NULL;
    if (st && st->optime) optime_finish(st->optime, d->rank, st->gpu);
    if (st) destroy_state(st);
    d->impl = NULL;
    dev_free_table(d);
}
