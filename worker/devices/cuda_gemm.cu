/* cuda_gemm.cu - the CUDA device's matrix products (cuBLAS, or cuBLASLt with
 * CEPHALO_CUDA_GEMM=lt; in bf16/fp16 mode fed operands rounded into 16-bit copies by our kernel),
 * the bias add, and the linear layer's fused ops (gemm_bias, gemm_bgrad: device.h). */
#include "devices/cuda_internal.h"

extern "C" {
#include "common/log.h"
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

/* ---- cuBLASLt (CEPHALO_CUDA_GEMM=lt) ----
 * Every product goes through cublasLtMatmul with the same operands, types and compute types as
 * the cublasGemmEx calls of the blas path (fp32 or TF32 on fp32 operands; 16-bit copies with
 * CUBLAS_COMPUTE_32F and an fp32 D), so the numerics contract is the same: only the order of the
 * fp32 sums may differ. The row-major to column-major mapping is the one above: Lt's A is our B
 * (transposed when tb), Lt's B is our A (transposed when ta), D = C^T, an N x M column-major
 * matrix with leading dimension ldc.
 *
 * Epilogues. CUBLASLT_EPILOGUE_BIAS adds a vector of D's rows (Lt's m = our N: one value per
 * column of our C) to every column of D (every row of our C): a linear layer's bias, one fp32
 * addition to the fp32 alpha op(A) op(B) + beta C, as gemm then add_bias. The bias gradient of
 * dW = dy^T x (gemm_bgrad: ta, A = dy stored [K, M]) sums dy over the batch dimension, which is
 * the product's k: dy is our A, i.e. Lt's B (transposed: op(B) is k x n, n = our M), so the sum
 * over k of op(B) is CUBLASLT_EPILOGUE_BGRADB ("the number of columns of D", reduction over k);
 * BGRADA would sum Lt's A, our x. The epilogue writes the vector (it does not accumulate and is
 * not scaled by beta), while device.h's db accumulates over microbatches: so it writes into
 * scratch, and one axpy adds that into db (what bias_grad's last step does). It is fused only
 * where its sum is of the values bias_grad sums: fp32 operands (FP32, TF32 modes; whether the
 * TF32 kernels sum the fp32 inputs or their TF32 roundings is for test_cuda_ops on a GPU to show),
 * alpha 1; in the 16-bit modes Lt's B is the rounded copy of dy, whose sum is not bias_grad's,
 * so there gemm_bgrad is the Lt product and bias_grad's kernel, as in blas mode.
 *
 * Plans. A product's descriptors (operation, the three layouts) and its algorithm (the first
 * result of cublasLtMatmulAlgoGetHeuristic) are made once per shape, leading dimensions, types,
 * epilogue and pointer alignments (the heuristic assumes 256-byte operands unless told; we tell
 * it the alignment of the pointers, capped at 256) and kept in a table of LT_PLANS (round-robin
 * replacement past that: a model has a few dozen shapes), so a step after the first searches
 * nothing. Determinism: the preference allows only CUBLASLT_REDUCTION_SCHEME_NONE, and a result
 * whose configuration still says SPLITK_NUM > 1 is not used: no split-K partial sums, so each
 * element of D is one k-long sum in the algorithm's fixed order, and the algorithm is the same
 * for every call of the shape (the heuristic is a function of its inputs; our buffers' alignments
 * depend only on shapes: the caching allocator hands out whole cudaMalloc blocks). No
 * cublasLtMatmul needs atomics for D then (cuBLAS's reproducibility guarantee: same toolkit,
 * GPU model and stream). The workspace is cuBLAS's own (BLAS_WORKSPACE): both libraries run on
 * the compute stream only, so they never use it at once, and it is already inside the reserve.
 * A shape the heuristic has no algorithm for (no such epilogue for these types, say) is
 * remembered as such and runs as in blas mode: cublasGemmEx, then the separate bias kernel. */

#define LT_PLANS 64

/* What a plan is chosen by: our row-major view of one product (or one chunk of a 16-bit one). */
struct lt_key {
    int32_t ta, tb, M, N, K, lda, ldb, ldc;
    int32_t type, compute, epilogue;
    int32_t align; /* log2 of the alignment (<= 8) of A, B, C and the vector, 4 bits each */
};

struct lt_plan {
    lt_key key;
    bool ok; /* the heuristic returned a usable algorithm */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c; /* Lt's A (our B), Lt's B (our A), C = D */
    cublasLtMatmulAlgo_t algo;
};

struct cuda_lt {
    cublasLtHandle_t h;
    lt_plan plans[LT_PLANS];
    int n, next;
};

enum lt_epi { LT_NONE, LT_BIAS, LT_BGRADB };

static uint32_t align_log2(const void *p) { /* NULL: 8 (256 bytes) */
    const uintptr_t a = (uintptr_t)p;
    uint32_t l = 0;
    while (l < 8 && !((a >> l) & 1u)) l++;
    return l;
}

static void lt_plan_clear(lt_plan *p) {
    if (p->op) (void)cublasLtMatmulDescDestroy(p->op);
    if (p->a) (void)cublasLtMatrixLayoutDestroy(p->a);
    if (p->b) (void)cublasLtMatrixLayoutDestroy(p->b);
    if (p->c) (void)cublasLtMatrixLayoutDestroy(p->c);
    memset(p, 0, sizeof *p);
}

extern "C" int cuda_gemm_lt_new(cuda_state *st, err_t *err) {
    st->lt = (cuda_lt *)xcalloc(1, sizeof(cuda_lt));
    cublasStatus_t b = cublasLtCreate(&st->lt->h);
    if (b != CUBLAS_STATUS_SUCCESS) {
        st->lt->h = NULL;
        return err_set(err, "cuda device: GPU %d: cuBLASLt setup failed: %s", st->gpu,
                       cublasGetStatusString(b));
    }
    return 0;
}

extern "C" void cuda_gemm_lt_free(cuda_state *st) {
    if (!st->lt) return;
    for (int i = 0; i < st->lt->n; i++) lt_plan_clear(&st->lt->plans[i]);
    if (st->lt->h) (void)cublasLtDestroy(st->lt->h);
    free(st->lt);
    st->lt = NULL;
}

#define LT_SET(desc_fn, desc, attr, v) CUBLAS_CHECK(desc_fn(desc, attr, &(v), sizeof(v)))

/* Makes p's descriptors for k and asks the heuristic for its algorithm (p->ok when there is
 * one without split-K). vec: the epilogue's vector pointer (its alignment counts). */
static void lt_plan_make(cuda_lt *lt, lt_plan *p, const lt_key &k, const void *vec) {
    p->key = k;
    const cudaDataType_t t = (cudaDataType_t)k.type;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->op, (cublasComputeType_t)k.compute, CUDA_R_32F));
    const cublasOperation_t opa = k.tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = k.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT_SET(cublasLtMatmulDescSetAttribute, p->op, CUBLASLT_MATMUL_DESC_TRANSA, opa);
    LT_SET(cublasLtMatmulDescSetAttribute, p->op, CUBLASLT_MATMUL_DESC_TRANSB, opb);
    if (k.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
        const cublasLtEpilogue_t e = (cublasLtEpilogue_t)k.epilogue;
        LT_SET(cublasLtMatmulDescSetAttribute, p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, e);
        LT_SET(cublasLtMatmulDescSetAttribute, p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, vec);
    }
    /* as stored, column-major: our B is [N, K] (!tb) or [K, N]; our A [K, M] (!ta) or [M, K] */
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, t, k.tb ? k.K : k.N, k.tb ? k.N : k.K, k.ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, t, k.ta ? k.M : k.K, k.ta ? k.K : k.M, k.lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, k.N, k.M, k.ldc));

    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = BLAS_WORKSPACE;
    const uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_NONE;
    const uint32_t al_a = 1u << (k.align & 15), al_b = 1u << ((k.align >> 4) & 15),
                   al_c = 1u << ((k.align >> 8) & 15);
    LT_SET(cublasLtMatmulPreferenceSetAttribute, pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, ws);
    LT_SET(cublasLtMatmulPreferenceSetAttribute, pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, scheme);
    LT_SET(cublasLtMatmulPreferenceSetAttribute, pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, al_b);
    LT_SET(cublasLtMatmulPreferenceSetAttribute, pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, al_a);
    LT_SET(cublasLtMatmulPreferenceSetAttribute, pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, al_c);
    LT_SET(cublasLtMatmulPreferenceSetAttribute, pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, al_c);
    cublasLtMatmulHeuristicResult_t res;
    memset(&res, 0, sizeof res);
    int found = 0;
    const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(lt->h, p->op, p->a, p->b, p->c, p->c,
                                                            pref, 1, &res, &found);
    (void)cublasLtMatmulPreferenceDestroy(pref);
    p->ok = s == CUBLAS_STATUS_SUCCESS && found >= 1 && res.state == CUBLAS_STATUS_SUCCESS &&
            res.workspaceSize <= BLAS_WORKSPACE;
    if (p->ok) {
        int32_t splitk = 1;
        size_t written = 0;
        if (cublasLtMatmulAlgoConfigGetAttribute(&res.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
                                                 sizeof splitk, &written) != CUBLAS_STATUS_SUCCESS ||
            splitk > 1)
            p->ok = false; /* the mask should have excluded it: never trust a split-K sum */
        p->algo = res.algo;
    }
}

/* C = alpha op(A) op(B) + beta C (+ the epilogue with vector vec) through cuBLASLt on operands
 * of type t; false (nothing queued) when the shape has no plan. */
static bool lt_matmul(device *d, bool ta, bool tb, int M, int N, int K, float alpha, const void *A,
                      int lda, const void *B, int ldb, float beta, float *C, int ldc, cudaDataType_t t,
                      cublasComputeType_t ct, lt_epi e, void *vec) {
    cuda_state *st = cuda_of(d);
    cuda_lt *lt = st->lt;
    lt_key k;
    memset(&k, 0, sizeof k); /* no padding left undefined: keys compare with memcmp */
    k.ta = ta, k.tb = tb, k.M = M, k.N = N, k.K = K, k.lda = lda, k.ldb = ldb, k.ldc = ldc;
    k.type = (int32_t)t, k.compute = (int32_t)ct;
    k.epilogue = e == LT_BIAS ? CUBLASLT_EPILOGUE_BIAS : e == LT_BGRADB ? CUBLASLT_EPILOGUE_BGRADB
                                                                        : CUBLASLT_EPILOGUE_DEFAULT;
    k.align = (int32_t)(align_log2(A) | align_log2(B) << 4 | align_log2(C) << 8 |
                        (e == LT_NONE ? 8u : align_log2(vec)) << 12);
    lt_plan *p = NULL;
    for (int i = 0; i < lt->n && !p; i++)
        if (!memcmp(&lt->plans[i].key, &k, sizeof k)) p = &lt->plans[i];
    if (!p) {
        if (lt->n < LT_PLANS) {
            p = &lt->plans[lt->n++];
        } else { /* cuBLASLt reads the descriptors when a call is queued, not when it runs
                  * (PyTorch destroys its own right after each call): replacing one is safe */
            p = &lt->plans[lt->next];
            lt->next = (lt->next + 1) % LT_PLANS;
            lt_plan_clear(p);
        }
        lt_plan_make(lt, p, k, vec);
    }
    if (!p->ok) return false;
    if (e != LT_NONE)
        LT_SET(cublasLtMatmulDescSetAttribute, p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, vec);
    CUBLAS_CHECK(cublasLtMatmul(lt->h, p->op, &alpha, B, p->a, A, p->b, &beta, C, p->c, C, p->c,
                                &p->algo, st->blas_workspace, BLAS_WORKSPACE, compute(d)));
    return true;
}

/* One product C = alpha op(A) op(B) + beta C on operands of type t: cuBLASLt with epilogue e
 * where the device is in lt mode and a plan exists, else cublasGemmEx. Returns whether the
 * epilogue ran (true for LT_NONE). */
static bool product(device *d, bool ta, bool tb, int M, int N, int K, float alpha, const void *A,
                    int lda, const void *B, int ldb, float beta, float *C, int ldc,
                    cudaDataType_t t, cublasComputeType_t ct, lt_epi e, void *vec) {
    cuda_state *st = cuda_of(d);
    if (st->lt) {
        if (e != LT_NONE && lt_matmul(d, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, t,
                                      ct, e, vec))
            return true;
        if (lt_matmul(d, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, t, ct, LT_NONE, NULL))
            return e == LT_NONE;
    }
    CUBLAS_CHECK(cublasGemmEx(st->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                              ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, t, ldb, A, t,
                              lda, &beta, C, CUDA_R_32F, ldc, ct, CUBLAS_GEMM_DEFAULT));
    return e == LT_NONE;
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

/* Returns whether epilogue e ran (true for LT_NONE): never when the product is taken in chunks
 * (the logits of a big vocabulary: the caller adds the bias with its separate kernel). */
static bool gemm16(device *d, bool ta, bool tb, int M, int N, int K, float alpha, const float *A,
                   int lda, const float *B, int ldb, float beta, float *C, int ldc, lt_epi e,
                   void *vec) {
    const gemm16_op g = gemm16_op_of(d);
    gemm16_workspace(d, g.esize, K);
    cuda_state *st = cuda_of(d);
    const int64_t elems = (int64_t)(st->gemm16_bytes / g.esize);
    const int mc = gemm16_chunk(elems, K, M), nc = gemm16_chunk(elems, K, N);
    const bool chunked = mc < M || nc < N;
    bool ran = false;
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
            /* the copies keep the operands' layouts: op(A) is still A^T when ta */
            ran = product(d, ta, tb, mm, nn, K, alpha, st->gemm16[0], lda16, st->gemm16[1], ldb16,
                          beta, C + (int64_t)m0 * ldc + n0, ldc, g.type, CUBLAS_COMPUTE_32F,
                          chunked ? LT_NONE : e, chunked ? NULL : vec);
        }
    }
    return e == LT_NONE || (!chunked && ran);
}

/* gemm with epilogue e (LT_NONE: plain gemm); returns whether e ran. */
static bool gemm_epi(device *d, bool ta, bool tb, int M, int N, int K, float alpha, const float *A,
                     int lda, const float *B, int ldb, float beta, float *C, int ldc, lt_epi e,
                     void *vec) {
    if (M == 0 || N == 0) return false;
    if (K == 0) { /* an empty sum: C = beta * C (not left to cuBLAS's quick-return rules) */
        if (beta == 1.0f) return false;
        scale_rows_kernel<<<ew_blocks((int64_t)M * N), EW_THREADS, 0, compute(d)>>>(C, ldc, M, N,
                                                                                     beta);
        LAUNCH_CHECK();
        return false;
    }
    if (d->matmul == DEV_MATMUL_BF16 || d->matmul == DEV_MATMUL_FP16)
        return gemm16(d, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, e, vec);
    return product(d, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, CUDA_R_32F,
                   compute_type(d->matmul), e, vec);
}

void cuda_gemm(device *d, bool ta, bool tb, int M, int N, int K, float alpha,
               const float *A, int lda, const float *B, int ldb, float beta, float *C,
               int ldc) {
    (void)gemm_epi(d, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, LT_NONE, NULL);
}

/* x[r, c] (leading dimension ldx) += b[c] (rows_grid's launch: a column a thread) */
__global__ void add_bias_kernel(float *x, int64_t ldx, const float *b, int N, int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const float bc = b[c];
    ROWS_STRIDE(r, N) x[r * ldx + c] += bc;
}

static void add_bias_ld(device *d, float *x, int ldx, const float *b, int N, int C) {
    if (N <= 0 || C <= 0) return;
    const rows_launch l = rows_grid(N, C, 1);
    add_bias_kernel<<<l.grid, l.block, 0, compute(d)>>>(x, ldx, b, N, C);
    LAUNCH_CHECK();
}

void cuda_add_bias(device *d, float *x, const float *b, int N, int C) { add_bias_ld(d, x, C, b, N, C); }

/* gemm then add_bias, or both in cuBLASLt's BIAS epilogue (lt mode). The two fused ops time
 * their parts themselves (CEPHALO_CUDA_OPTIME; no-ops when off): the product as gemm, a separate
 * bias kernel as bias, so the table's rows mean what they meant before the ops existed, and a
 * fused epilogue shows as bias time gone into gemm. */
void cuda_gemm_bias(device *d, bool ta, bool tb, int M, int N, int K, float alpha, const float *A,
                    int lda, const float *B, int ldb, float beta, float *C, int ldc,
                    const float *bias) {
    cuda_optime_begin(d, OT_GEMM, DEV_STREAM_COMPUTE);
    const bool fused =
        gemm_epi(d, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, LT_BIAS, (void *)bias);
    cuda_optime_end(d);
    if (fused) return;
    cuda_optime_begin(d, OT_BIAS, DEV_STREAM_COMPUTE);
    add_bias_ld(d, C, ldc, bias, M, N);
    cuda_optime_end(d);
}

/* gemm then bias_grad, or (lt mode, fp32 operands, alpha 1) the BGRADB epilogue into scratch
 * and one axpy into db: see "cuBLASLt" above for why only there */
void cuda_gemm_bgrad(device *d, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                     const float *B, int ldb, float beta, float *C, int ldc, float *db) {
    CHECK(lda == M); /* device.h: A is [K, M] contiguous */
    const bool fuse = cuda_of(d)->lt && alpha == 1.0f && M > 0 && N > 0 && K > 0 &&
                      (d->matmul == DEV_MATMUL_FP32 || d->matmul == DEV_MATMUL_TF32);
    float *sums = fuse ? (float *)cuda_scratch(d, (size_t)M * sizeof(float)) : NULL;
    cuda_optime_begin(d, OT_GEMM, DEV_STREAM_COMPUTE);
    const bool fused = gemm_epi(d, true, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc,
                                fuse ? LT_BGRADB : LT_NONE, sums) && fuse;
    cuda_optime_end(d);
    cuda_optime_begin(d, OT_BIAS, DEV_STREAM_COMPUTE);
    if (fused) cuda_axpy(d, db, 1.0f, sums, M);
    else cuda_bias_grad(d, db, A, K, M);
    cuda_optime_end(d);
}
