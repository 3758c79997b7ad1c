/* cuda_gemm.cu - the CUDA device's matrix products (cuBLAS; in bf16/fp16 mode fed operands
 * rounded into 16-bit copies by our kernel) and the bias add. */
#include "devices/cuda_internal.h"

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
    for (int i = 0; i < 2; i++) st->gemm16[i] = cuda_must_malloc(d, need, "16-bit gemm operands");
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

void cuda_gemm(device *d, bool ta, bool tb, int M, int N, int K, float alpha,
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

void cuda_add_bias(device *d, float *x, const float *b, int N, int C) {
    if (N <= 0 || C <= 0) return;
    const rows_launch l = rows_grid(N, C, 1);
    add_bias_kernel<<<l.grid, l.block, 0, compute(d)>>>(x, b, N, C);
    LAUNCH_CHECK();
}
