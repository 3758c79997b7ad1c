/* cuda_attention_mma.cu - flash attention on tensor cores (mma.sync m16n8k16, bf16 or fp16
 * operands, fp32 accumulation) for bf16/fp16 training on sm_80+, and fp16 on Turing (sm_75,
 * each k16 product as two m16n8k8): CEPHALO_CUDA_ATTN=mma (docs/cuda.md). The fp32 kernels of
 * cuda_attention.cu stay the path of fp32 precision, of GPUs before sm_75 (bf16 before sm_80)
 * and of CEPHALO_CUDA_PORTABLE=1; cuda_attention_fwd/bwd choose.
 *
 * Same algorithm and the same determinism as the fp32 kernels (FlashAttention-2 tiling, the
 * online softmax in log2 units, a deterministic backward without atomics: dK/dV per key tile
 * looping over the group's query heads, dQ per query tile), with every product on tensor cores.
 * A block is 4 warps; each warp owns 16 rows (query rows in the forward and dQ, keys in dK/dV)
 * of the block's tile and keeps its accumulators in mma C fragments; the index arithmetic
 * (fragment ownership, ldmatrix addressing, the swizzle, the causal tiles) is mma_layout.h,
 * tested on the CPU with a warp emulator of the forward (tests/unit/test_mma_layout.c).
 *
 * Rounding points (the only places the result differs from the fp32 kernels):
 *  - q, k, v and dout (fp32 activations today) are rounded to the 16-bit format (round to
 *    nearest even; fp16 overflows to inf above 65504, like the CPU device's to_fp16) when a tile
 *    is staged into shared memory;
 *  - P (forward: the unnormalised exp2(S - m); backward: exp2(S - lse)) is rounded to 16 bits
 *    as the A operand of P V and P^T dO; its row sum l uses the fp32 values;
 *  - dS = P (dP - D) is rounded to 16 bits as the A operand of dS K and dS^T Q.
 * Scores S = Q K^T, dP = dO V^T and the accumulators O, dQ, dK, dV are fp32 (the tensor cores'
 * products of 16-bit values are exact in fp32); lse and D are fp32. Because the inputs are fp32,
 * staging converts in registers, so cp.async (a raw byte copy) cannot be used; with 16-bit
 * activations the staging becomes cp.async of whole 16-byte chunks into the same swizzled
 * layout.
 *
 * Tiles (every configuration within the 48 KB any block may use, so no opt-in):
 *   forward:  64 query rows x 64 keys, smem (64 + 2 x 64) x W x 2 bytes (48 KB at W = 128)
 *   dK/dV:    64 keys x 64 query rows (16 at W = 128), smem (2 x 64 + 2 x BR) x W x 2
 *   dQ:       64 query rows x 64 keys (32 at W = 128), smem (2 x 64 + 2 x BC) x W x 2
 * W = mma_width(hd): 16, 32, 64 or 128; the columns hd .. W - 1 are zeros. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "devices/cuda_internal.h"
#include "devices/mma_layout.h"

namespace {

constexpr int MT = 128; /* threads per block: 4 warps */
constexpr float LOG2E = 1.4426950408889634f;
/* The tensor-core instructions of the compilation target: 80 (mma.sync m16n8k16, bf16 and fp16),
 * 75 (Turing: m16n8k8 with fp16 only, so a k16 product is two k8 products, mma_layout.h "1b"),
 * 0 (before sm_75: the kernels are a trap, never launched: cuda_attention_mma_ok). ldmatrix is
 * sm_75+. CEPHALO_MMA_K8=1 at build time makes an sm_80+ build take the Turing path for fp16 too,
 * so a lent H100/H200 can check it (docs/cuda.md). */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 750
#define CEPHALO_MMA_ARCH 0
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define CEPHALO_MMA_ARCH 75
#else
#define CEPHALO_MMA_ARCH 80
#endif
#define CEPHALO_HAVE_MMA (CEPHALO_MMA_ARCH != 0)
#ifndef CEPHALO_MMA_K8
#define CEPHALO_MMA_K8 0
#endif
#if CEPHALO_HAVE_MMA /* (unused, and so a warning, where the kernels are traps) */
constexpr float LN2 = 0.6931471805599453f;
constexpr unsigned FULL = 0xffffffffu;
#endif

/* Two floats rounded to the 16-bit format, lo in the low half (the lower column). */
template <bool F16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
    union {
        __half2 h;
        __nv_bfloat162 b;
        uint32_t u;
    } x;
    if constexpr (F16)
        x.h = __floats2half2_rn(lo, hi);
    else
        x.b = __floats2bfloat162_rn(lo, hi);
    return x.u;
}

#if CEPHALO_HAVE_MMA /* (unused, and so a warning, where the kernels are traps) */
/* d += a b for one m16n8k8 fp16 product (sm_75+): A registers a0, a1, B register b. */
__device__ __forceinline__ void mma_k8(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t b) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(b));
}
#endif

/* d += a b (one m16n8k16 product; fragments as mma_layout.h): one instruction on sm_80+, two
 * m16n8k8 on Turing (fp16 only: k 0-7 from A registers 0, 1 and B register 0, k 8-15 from A
 * registers 2, 3 and B register 1; mma_k8_a_reg, mma_k8_b_reg). */
template <bool F16>
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
#if CEPHALO_HAVE_MMA
    constexpr bool k8 = CEPHALO_MMA_ARCH == 75 || CEPHALO_MMA_K8;
    if constexpr (F16 && k8) {
        mma_k8(d, a[0], a[1], b0);
        mma_k8(d, a[2], a[3], b1);
    } else if constexpr (F16) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else if constexpr (CEPHALO_MMA_ARCH == 75) {
        __trap(); /* bf16 needs sm_80: never launched here (cuda_attention_mma_ok) */
    } else {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
#endif
}

/* Four 8x8 matrices of 16-bit values from shared memory (row addresses per lane as
 * mma_layout.h); TRANS delivers them transposed. */
template <bool TRANS>
__device__ __forceinline__ void ldm_x4(uint32_t (&r)[4], const uint16_t *p) {
#if CEPHALO_HAVE_MMA
    const unsigned s = (unsigned)__cvta_generic_to_shared(p);
    if constexpr (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(s));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(s));
#endif
}

/* The lane's ldmatrix source for the three operand shapes (mma_layout.h), at tile row r0 and
 * 16-column step kk of a swizzled [.][W] tile. */
template <int W>
__device__ __forceinline__ const uint16_t *at_a(const uint16_t *s, int r0, int kk, int lane) {
    return s + mma_swz_off(r0 + mma_ldm_a_row(lane), kk * 16 + 8 * mma_ldm_a_chunk(lane), W);
}
template <int W>
__device__ __forceinline__ const uint16_t *at_bn(const uint16_t *s, int r0, int kk, int lane) {
    return s + mma_swz_off(r0 + mma_ldm_bn_row(lane), kk * 16 + 8 * mma_ldm_bn_chunk(lane), W);
}
template <int W>
__device__ __forceinline__ const uint16_t *at_bt(const uint16_t *s, int r0, int kk, int lane) {
    return s + mma_swz_off(r0 + mma_ldm_bt_row(lane), kk * 16 + 8 * mma_ldm_bt_chunk(lane), W);
}

/* s[ROWS][W] (swizzled 16-bit) = rows [row0, row0 + ROWS) of a [T, hd] strided fp32 view g,
 * rounded (the staging rounding point); zeros past T and past hd. One 16-byte chunk (8 values)
 * per thread and step; vec: two float4 reads (rows 16-byte aligned, hd % 4 == 0). */
template <int W, int ROWS, bool F16>
__device__ __forceinline__ void stage(uint16_t *s, const float *g, int64_t ldg, int row0, int T,
                                      int hd, bool vec) {
    constexpr int CPR = W / 8;
    for (int c = threadIdx.x; c < ROWS * CPR; c += MT) {
        const int r = c / CPR, col = (c % CPR) * 8, gr = row0 + r;
        float x[8];
        const float *src = g + (int64_t)(gr < T ? gr : 0) * ldg + col;
        if (gr < T && vec && col + 8 <= hd) {
            const float4 a = *reinterpret_cast<const float4 *>(src);
            const float4 b = *reinterpret_cast<const float4 *>(src + 4);
            x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w;
            x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++) x[e] = gr < T && col + e < hd ? src[e] : 0.0f;
        }
        uint4 u;
        u.x = pack2<F16>(x[0], x[1]), u.y = pack2<F16>(x[2], x[3]);
        u.z = pack2<F16>(x[4], x[5]), u.w = pack2<F16>(x[6], x[7]);
        *reinterpret_cast<uint4 *>(s + mma_swz_off(r, col, W)) = u;
    }
}

template <int N>
__device__ __forceinline__ void zero(float (&x)[N][4]) {
#pragma unroll
    for (int j = 0; j < N; j++) x[j][0] = x[j][1] = x[j][2] = x[j][3] = 0.0f;
}

/* A barrier (every warp is done with the previous tiles), tiles x and y of ROWS rows from row0
 * staged, a barrier (every warp sees them). */
template <int W, int ROWS, bool F16>
__device__ __forceinline__ void restage2(uint16_t *xs, const float *xg, int64_t ldx, uint16_t *ys,
                                         const float *yg, int64_t ldy, int row0, int T, int hd,
                                         bool vec) {
    __syncthreads();
    stage<W, ROWS, F16>(xs, xg, ldx, row0, T, hd, vec);
    stage<W, ROWS, F16>(ys, yg, ldy, row0, T, hd, vec);
    __syncthreads();
}

/* acc[16 rows][2 NP x 8] += A (16 x W, rows r0.. of tile As) times B^T (B rows b0.., tile Bs):
 * S = Q K^T, dP = dO V^T and their transposes. */
template <int W, int NP, bool F16>
__device__ __forceinline__ void mma_abt(float (&acc)[2 * NP][4], const uint16_t *As, int r0,
                                        const uint16_t *Bs, int b0, int lane) {
#pragma unroll
    for (int kk = 0; kk < W / 16; kk++) {
        uint32_t a[4];
        ldm_x4<false>(a, at_a<W>(As, r0, kk, lane));
#pragma unroll
        for (int np = 0; np < NP; np++) {
            uint32_t b[4];
            ldm_x4<false>(b, at_bn<W>(Bs, b0 + 16 * np, kk, lane));
            mma<F16>(acc[2 * np], a, b[0], b[1]);
            mma<F16>(acc[2 * np + 1], a, b[2], b[3]);
        }
    }
}

/* The backward's two score tiles from zero: s = A1 B1^T (S or S^T), dp = A2 B2^T (dP or dP^T). */
template <int W, int NJ, bool F16>
__device__ __forceinline__ void scores2(float (&s)[NJ][4], float (&dp)[NJ][4], const uint16_t *A1,
                                        const uint16_t *B1, const uint16_t *A2, const uint16_t *B2,
                                        int r0, int lane) {
    zero(s);
    zero(dp);
    mma_abt<W, NJ / 2, F16>(s, A1, r0, B1, 0, lane);
    mma_abt<W, NJ / 2, F16>(dp, A2, r0, B2, 0, lane);
}

/* acc[16 rows][W] += P (registers: NJ C fragments, 16 x 8 NJ, rounded here) times X (tile Xs
 * rows 0 .. 8 NJ - 1, all W columns): O += P V, dQ += dS K, dV += P^T dO, dK += dS^T Q. */
template <int W, int NJ, bool F16>
__device__ __forceinline__ void mma_px(float (&acc)[W / 8][4], const float (&p)[NJ][4],
                                       const uint16_t *Xs, int lane) {
#pragma unroll
    for (int kk = 0; kk < NJ / 2; kk++) {
        uint32_t a[4];
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const float *c = p[2 * kk + mma_c_to_a_tile(r)] + mma_c_to_a_elem(r);
            a[r] = pack2<F16>(c[0], c[1]); /* the P / dS rounding point */
        }
#pragma unroll
        for (int dp = 0; dp < W / 16; dp++) {
            uint32_t b[4];
            ldm_x4<true>(b, at_bt<W>(Xs, 16 * kk, dp, lane));
            mma<F16>(acc[2 * dp], a, b[0], b[1]);
            mma<F16>(acc[2 * dp + 1], a, b[2], b[3]);
        }
    }
}

/* Stores the warp's 16 x W accumulator (rows row0 + c_row, < T) times mul into g (row r at
 * g + r * ldg), columns < hd. */
template <int W>
__device__ __forceinline__ void store_acc(float *g, int64_t ldg, const float (&acc)[W / 8][4],
                                          float mul, int row0, int T, int hd, bool vec, int lane) {
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        const int row = row0 + mma_c_row(lane, 2 * hh);
        if (row >= T) continue;
        float *gr = g + (int64_t)row * ldg;
#pragma unroll
        for (int j = 0; j < W / 8; j++) {
            const int col = 8 * j + mma_c_col(lane, 0);
            const float x0 = acc[j][2 * hh] * mul, x1 = acc[j][2 * hh + 1] * mul;
            if (vec) { /* hd % 4 == 0: the pair is wholly inside or outside */
                if (col < hd) *reinterpret_cast<float2 *>(gr + col) = make_float2(x0, x1);
            } else {
                if (col < hd) gr[col] = x0;
                if (col + 1 < hd) gr[col + 1] = x1;
            }
        }
    }
}

/* ---- forward: one block per (64-row query tile, head, sample) ---- */
template <int W, bool F16>
__global__ void __launch_bounds__(MT)
    attn_mma_fwd_kernel(float *out, float *lse, const float *__restrict__ q, int ldq,
                        const float *__restrict__ k, int ldk, const float *__restrict__ v, int ldv,
                        int T, int H, int group, float scale_log2, bool causal, bool vec, int hd) {
#if !CEPHALO_HAVE_MMA
    __trap();
#else
    constexpr int BR = 64, BC = 64, NJ = BC / 8, ND = W / 8;
    extern __shared__ uint4 smem_u4[];
    uint16_t *Qs = reinterpret_cast<uint16_t *>(smem_u4), *Ks = Qs + BR * W, *Vs = Ks + BC * W;
    const int qt = causal ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
    const int h = blockIdx.y, b = blockIdx.z, hkv = h / group, q0 = qt * BR;
    const int lane = threadIdx.x & 31, wr = (threadIdx.x >> 5) * 16; /* the warp's rows */
    const float *qg = q + (int64_t)b * T * ldq + (int64_t)h * hd;
    const float *kg = k + (int64_t)b * T * ldk + (int64_t)hkv * hd;
    const float *vg = v + (int64_t)b * T * ldv + (int64_t)hkv * hd;
    stage<W, BR, F16>(Qs, qg, ldq, q0, T, hd, vec);

    float o[ND][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    zero(o);
    const int nkt = mma_kv_tiles(q0, BR, BC, T, causal);
    for (int kt = 0; kt < nkt; kt++) {
        const int k0 = kt * BC;
        restage2<W, BC, F16>(Ks, kg, ldk, Vs, vg, ldv, k0, T, hd, vec);
        float s[NJ][4];
        zero(s);
        mma_abt<W, NJ / 2, F16>(s, Qs, wr, Ks, 0, lane);

        const bool full = mma_tile_full(q0 + wr, k0, BC, T, causal);
#pragma unroll
        for (int hh = 0; hh < 2; hh++) { /* the lane's rows g (c0, c1) and g + 8 (c2, c3) */
            const int row = q0 + wr + mma_c_row(lane, 2 * hh);
            float mt = -INFINITY;
#pragma unroll
            for (int j = 0; j < NJ; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    float x = s[j][2 * hh + e] * scale_log2;
                    if (!full && !mma_visible(row, k0 + 8 * j + mma_c_col(lane, e), T, causal))
                        x = -INFINITY;
                    s[j][2 * hh + e] = x;
                    mt = fmaxf(mt, x);
                }
            mt = fmaxf(mt, __shfl_xor_sync(FULL, mt, 1)); /* the 4 lanes of the row */
            mt = fmaxf(mt, __shfl_xor_sync(FULL, mt, 2));
            const float mn = fmaxf(m[hh], mt);
            const float ms = mn == -INFINITY ? 0.0f : mn; /* nothing visible yet: no NaN */
            const float alpha = exp2f(m[hh] - ms);
            m[hh] = mn;
            float ps = 0.0f;
#pragma unroll
            for (int j = 0; j < NJ; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float p = exp2f(s[j][2 * hh + e] - ms);
                    s[j][2 * hh + e] = p;
                    ps += p;
                }
            l[hh] = l[hh] * alpha + ps; /* the lane's part of the row sum */
#pragma unroll
            for (int j = 0; j < ND; j++) o[j][2 * hh] *= alpha, o[j][2 * hh + 1] *= alpha;
        }
        mma_px<W, NJ, F16>(o, s, Vs, lane);
    }

    const int ldo = H * hd;
    float inv[2];
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        float L = l[hh];
        L += __shfl_xor_sync(FULL, L, 1);
        L += __shfl_xor_sync(FULL, L, 2); /* > 0: every row sees key 0 */
        inv[hh] = 1.0f / L;
        const int row = q0 + wr + mma_c_row(lane, 2 * hh);
        if (row < T && (lane & 3) == 0)
            lse[((int64_t)b * H + h) * T + row] = (m[hh] + log2f(L)) * LN2;
    }
#pragma unroll
    for (int j = 0; j < ND; j++) o[j][0] *= inv[0], o[j][1] *= inv[0], o[j][2] *= inv[1],
                                 o[j][3] *= inv[1];
    store_acc<W>(out + (int64_t)b * T * ldo + (int64_t)h * hd, ldo, o, 1.0f, q0 + wr, T, hd, vec,
                 lane);
#endif
}

/* ---- backward, dK/dV: one block per (64-key tile, kv head, sample), warps own 16 keys ----
 * S^T = K Q^T and dP^T = V dO^T per query tile; P^T = exp2(S^T scale_log2 - lse2[query]),
 * dS^T = P^T (dP^T - D[query]); dV += P^T dO, dK += dS^T Q. */

template <int W, bool F16>
__global__ void __launch_bounds__(MT)
    attn_mma_dkv_kernel(float *dk, float *dv, const float *__restrict__ dout,
                        const float *__restrict__ lse, const float *__restrict__ D,
                        const float *__restrict__ q, int ldq, const float *__restrict__ k, int ldk,
                        const float *__restrict__ v, int ldv, int T, int H, int group, float scale,
                        float scale_log2, bool causal, bool vec, int hd) {
#if !CEPHALO_HAVE_MMA
    __trap();
#else
    constexpr int BC = 64, BR = mma_dkv_rows(W), NJ = BR / 8, ND = W / 8;
    extern __shared__ uint4 smem_u4[];
    uint16_t *Ks = reinterpret_cast<uint16_t *>(smem_u4), *Vs = Ks + BC * W, *Qs = Vs + BC * W,
             *dOs = Qs + BR * W;
    const int kt = blockIdx.x, hkv = blockIdx.y, b = blockIdx.z, k0 = kt * BC;
    const int lane = threadIdx.x & 31, wk = (threadIdx.x >> 5) * 16; /* the warp's keys */
    const int ldo = H * hd;
    const float *kg = k + (int64_t)b * T * ldk + (int64_t)hkv * hd;
    const float *vg = v + (int64_t)b * T * ldv + (int64_t)hkv * hd;
    stage<W, BC, F16>(Ks, kg, ldk, k0, T, hd, vec);
    stage<W, BC, F16>(Vs, vg, ldv, k0, T, hd, vec);

    float dka[ND][4], dva[ND][4];
    zero(dka);
    zero(dva);
    const int nqt = (T + BR - 1) / BR;
    for (int hh = 0; hh < group; hh++) {
        const int h = hkv * group + hh;
        const float *qg = q + (int64_t)b * T * ldq + (int64_t)h * hd;
        const float *og = dout + (int64_t)b * T * ldo + (int64_t)h * hd;
        const float *lse_h = lse + ((int64_t)b * H + h) * T, *D_h = D + ((int64_t)b * H + h) * T;
        for (int qt = mma_first_qtile(k0, BR, causal); qt < nqt; qt++) {
            const int q0 = qt * BR;
            restage2<W, BR, F16>(Qs, qg, ldq, dOs, og, ldo, q0, T, hd, vec);
            float s[NJ][4], dp[NJ][4];
            scores2<W, NJ, F16>(s, dp, Ks, Qs, Vs, dOs, wk, lane);
            /* padded query rows (>= T) have no lse: they are masked too */
            const bool full = q0 + BR <= T && mma_tile_full(q0, k0 + wk, 16, T, causal);
#pragma unroll
            for (int j = 0; j < NJ; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int query = q0 + 8 * j + mma_c_col(lane, e);
                    const bool qok = query < T;
                    const float lse2 = qok ? lse_h[query] * LOG2E : 0.0f;
                    const float Dq = qok ? D_h[query] : 0.0f;
#pragma unroll
                    for (int r = 0; r < 2; r++) {
                        const int i = 2 * r + e, key = k0 + wk + mma_c_row(lane, i);
                        const bool ok = full || (qok && mma_visible(query, key, T, causal));
                        const float p = ok ? exp2f(fmaf(s[j][i], scale_log2, -lse2)) : 0.0f;
                        s[j][i] = p;
                        dp[j][i] = p * (dp[j][i] - Dq);
                    }
                }
            mma_px<W, NJ, F16>(dva, s, dOs, lane);
            mma_px<W, NJ, F16>(dka, dp, Qs, lane);
        }
    }
    store_acc<W>(dk + (int64_t)b * T * ldk + (int64_t)hkv * hd, ldk, dka, scale, k0 + wk, T, hd,
                 vec, lane);
    store_acc<W>(dv + (int64_t)b * T * ldv + (int64_t)hkv * hd, ldv, dva, 1.0f, k0 + wk, T, hd,
                 vec, lane);
#endif
}

/* ---- backward, dQ: one block per (64-row query tile, head, sample) ----
 * S = Q K^T, dP = dO V^T per key tile; P = exp2(S scale_log2 - lse2), dS = P (dP - D);
 * dQ += dS K. */

template <int W, bool F16>
__global__ void __launch_bounds__(MT)
    attn_mma_dq_kernel(float *dq, const float *__restrict__ dout, const float *__restrict__ lse,
                       const float *__restrict__ D, const float *__restrict__ q, int ldq,
                       const float *__restrict__ k, int ldk, const float *__restrict__ v, int ldv,
                       int T, int H, int group, float scale, float scale_log2, bool causal,
                       bool vec, int hd) {
#if !CEPHALO_HAVE_MMA
    __trap();
#else
    constexpr int BR = 64, BC = mma_dq_keys(W), NJ = BC / 8, ND = W / 8;
    extern __shared__ uint4 smem_u4[];
    uint16_t *Qs = reinterpret_cast<uint16_t *>(smem_u4), *dOs = Qs + BR * W, *Ks = dOs + BR * W,
             *Vs = Ks + BC * W;
    const int qt = causal ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
    const int h = blockIdx.y, b = blockIdx.z, hkv = h / group, q0 = qt * BR;
    const int lane = threadIdx.x & 31, wr = (threadIdx.x >> 5) * 16;
    const int ldo = H * hd;
    const float *qg = q + (int64_t)b * T * ldq + (int64_t)h * hd;
    const float *og = dout + (int64_t)b * T * ldo + (int64_t)h * hd;
    const float *kg = k + (int64_t)b * T * ldk + (int64_t)hkv * hd;
    const float *vg = v + (int64_t)b * T * ldv + (int64_t)hkv * hd;
    const float *lse_h = lse + ((int64_t)b * H + h) * T, *D_h = D + ((int64_t)b * H + h) * T;
    stage<W, BR, F16>(Qs, qg, ldq, q0, T, hd, vec);
    stage<W, BR, F16>(dOs, og, ldo, q0, T, hd, vec);
    float lse2[2], Dr[2];
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        const int row = q0 + wr + mma_c_row(lane, 2 * hh);
        lse2[hh] = row < T ? lse_h[row] * LOG2E : 0.0f;
        Dr[hh] = row < T ? D_h[row] : 0.0f;
    }
    float dqa[ND][4];
    zero(dqa);
    const int nkt = mma_kv_tiles(q0, BR, BC, T, causal);
    for (int kt = 0; kt < nkt; kt++) {
        const int k0 = kt * BC;
        restage2<W, BC, F16>(Ks, kg, ldk, Vs, vg, ldv, k0, T, hd, vec);
        float s[NJ][4], dp[NJ][4];
        scores2<W, NJ, F16>(s, dp, Qs, Ks, dOs, Vs, wr, lane);
        const bool full = mma_tile_full(q0 + wr, k0, BC, T, causal);
#pragma unroll
        for (int j = 0; j < NJ; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int hh = i >> 1, row = q0 + wr + mma_c_row(lane, i);
                const bool ok =
                    full || mma_visible(row, k0 + 8 * j + mma_c_col(lane, i), T, causal);
                const float p = ok ? exp2f(fmaf(s[j][i], scale_log2, -lse2[hh])) : 0.0f;
                dp[j][i] = p * (dp[j][i] - Dr[hh]);
            }
        mma_px<W, NJ, F16>(dqa, dp, Ks, lane);
    }
    store_acc<W>(dq + (int64_t)b * T * ldq + (int64_t)h * hd, ldq, dqa, scale, q0 + wr, T, hd,
                 vec, lane);
#endif
}

/* ---- host side ---- */

struct mma_call {
    cudaStream_t st;
    int B, T, H, Hkv, ldq, ldk, ldv, hd;
    bool causal, vec;
    float scale, scale_log2;
};

template <int W, bool F16>
void fwd_w(const mma_call &c, float *out, float *lse, const float *q, const float *k,
           const float *v) {
    constexpr size_t smem = (size_t)(64 + 2 * 64) * W * 2;
    dim3 grid((unsigned)((c.T + 63) / 64), (unsigned)c.H, (unsigned)c.B);
    attn_mma_fwd_kernel<W, F16><<<grid, MT, smem, c.st>>>(out, lse, q, c.ldq, k, c.ldk, v, c.ldv,
                                                          c.T, c.H, c.H / c.Hkv, c.scale_log2,
                                                          c.causal, c.vec, c.hd);
    CUDA_CHECK(cudaGetLastError());
}

struct mma_bwd_args {
    float *dq, *dk, *dv;
    const float *dout, *lse, *D, *q, *k, *v;
};

template <int W, bool F16>
void bwd_w(const mma_call &c, const mma_bwd_args &g) {
    constexpr int KBR = mma_dkv_rows(W), QBC = mma_dq_keys(W);
    constexpr size_t kv_smem = (size_t)(2 * 64 + 2 * KBR) * W * 2;
    constexpr size_t q_smem = (size_t)(2 * 64 + 2 * QBC) * W * 2;
    dim3 gk((unsigned)((c.T + 63) / 64), (unsigned)c.Hkv, (unsigned)c.B);
    attn_mma_dkv_kernel<W, F16><<<gk, MT, kv_smem, c.st>>>(
        g.dk, g.dv, g.dout, g.lse, g.D, g.q, c.ldq, g.k, c.ldk, g.v, c.ldv, c.T, c.H,
        c.H / c.Hkv, c.scale, c.scale_log2, c.causal, c.vec, c.hd);
    CUDA_CHECK(cudaGetLastError());
    dim3 gq((unsigned)((c.T + 63) / 64), (unsigned)c.H, (unsigned)c.B);
    attn_mma_dq_kernel<W, F16><<<gq, MT, q_smem, c.st>>>(
        g.dq, g.dout, g.lse, g.D, g.q, c.ldq, g.k, c.ldk, g.v, c.ldv, c.T, c.H, c.H / c.Hkv,
        c.scale, c.scale_log2, c.causal, c.vec, c.hd);
    CUDA_CHECK(cudaGetLastError());
}

/* Calls fn<W, F16>(args...) for W = mma_width(hd). */
#define MMA_DISPATCH(fn, hd, f16, ...)                                                       \
    do {                                                                                     \
        switch (mma_width(hd)) {                                                             \
        case 16: f16 ? fn<16, true>(__VA_ARGS__) : fn<16, false>(__VA_ARGS__); break;        \
        case 32: f16 ? fn<32, true>(__VA_ARGS__) : fn<32, false>(__VA_ARGS__); break;        \
        case 64: f16 ? fn<64, true>(__VA_ARGS__) : fn<64, false>(__VA_ARGS__); break;        \
        default: f16 ? fn<128, true>(__VA_ARGS__) : fn<128, false>(__VA_ARGS__); break;      \
        }                                                                                    \
    } while (0)

mma_call make_call(device *d, int B, int T, int H, int Hkv, int hd, int ldq, int ldk, int ldv,
                   bool causal, bool aligned) {
    mma_call c;
    c.st = cuda_stream(d, DEV_STREAM_COMPUTE);
    c.B = B, c.T = T, c.H = H, c.Hkv = Hkv, c.ldq = ldq, c.ldk = ldk, c.ldv = ldv, c.hd = hd;
    c.causal = causal;
    c.scale = 1.0f / sqrtf((float)hd);
    c.scale_log2 = c.scale * LOG2E;
    c.vec = aligned && ldq % 4 == 0 && ldk % 4 == 0 && ldv % 4 == 0 && hd % 4 == 0;
    return c;
}

bool al16(const void *p) { return ((uintptr_t)p & 15) == 0; }

} /* namespace */

extern "C" bool cuda_attention_mma_ok(device *d, int hd) {
    const cuda_state *st = cuda_of(d);
    /* bf16 and fp16 on sm_80+ code; fp16 also on Turing (sm_75 code: m16n8k8) */
    const bool k16 = st->cc_major >= 8 && st->code_arch >= 80;
    const bool k8 = d->matmul == DEV_MATMUL_FP16 && st->cc_major * 10 + st->cc_minor >= 75 && st->code_arch >= 75;
    return st->attn_mma && (d->matmul == DEV_MATMUL_BF16 || d->matmul == DEV_MATMUL_FP16) && (k16 || k8) &&
           !st->portable && mma_width(hd) != 0;
}

extern "C" void cuda_attention_mma_fwd(device *d, float *out, float *lse, const float *q, int ldq,
                                       const float *k, int ldk, const float *v, int ldv, int B,
                                       int T, int H, int Hkv, int hd, bool causal) {
    const mma_call c = make_call(d, B, T, H, Hkv, hd, ldq, ldk, ldv, causal,
                                 al16(q) && al16(k) && al16(v) && al16(out));
    MMA_DISPATCH(fwd_w, hd, d->matmul == DEV_MATMUL_FP16, c, out, lse, q, k, v);
}

extern "C" void cuda_attention_mma_bwd(device *d, float *dq, float *dk, float *dv,
                                       const float *dout, const float *lse, const float *D,
                                       const float *q, int ldq, const float *k, int ldk,
                                       const float *v, int ldv, int B, int T, int H, int Hkv,
                                       int hd, bool causal) {
    const mma_call c = make_call(d, B, T, H, Hkv, hd, ldq, ldk, ldv, causal,
                                 al16(q) && al16(k) && al16(v) && al16(dout) && al16(dq) &&
                                     al16(dk) && al16(dv));
    const mma_bwd_args g = {dq, dk, dv, dout, lse, D, q, k, v};
    MMA_DISPATCH(bwd_w, hd, d->matmul == DEV_MATMUL_FP16, c, g);
}
