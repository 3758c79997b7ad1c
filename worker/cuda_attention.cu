/* cuda_attention.cu - flash-style attention (FlashAttention-2 tiling) for the CUDA device, fp32.
 *
 * Never a T x T matrix: a block owns a tile of rows, streams the other operand through shared
 * memory in tiles and keeps its running results in registers. All math is fp32 on the CUDA
 * cores (FFMA); scores are kept in log2 units (scale * log2(e) folded into one multiply) so that
 * every exponential is one exp2f; lse is stored in natural-log units like the CPU device.
 *
 * Forward, one block per (query tile of 64 rows, head, sample): Q tile in shared memory; for
 * each key tile (skipping those wholly after the tile's last row when causal): S = Q K^T, the
 * online softmax (running row max m and sum l; the O accumulator is rescaled by exp2(m_old -
 * m_new) whenever the max grows), O += P V. Out = O / l, lse = m + log(l).
 *
 * Backward (three launches, no float atomics, bit-reproducible):
 *  1. D[b,h,t] = dout . out per row, into cuda_scratch (one warp per row, fixed-order sum);
 *  2. dK/dV: one block per (key tile, kv head, sample). It loops over the query heads of the
 *     kv head's group and, per head, over the query tiles that can see its keys, recomputing
 *     P = exp(S - lse) and dS = P * (dP - D) with dP = dO V^T, and accumulating dV += P^T dO,
 *     dK += dS^T Q in registers. The block is the only writer of its dk/dv rows, and the
 *     accumulation order is fixed, so the GQA sum over the group needs no atomics.
 *  3. dQ: one block per (query tile, head, sample) looping over key tiles like the forward,
 *     recomputing P and dS and accumulating dQ += dS K in registers (P is recomputed twice
 *     overall - the price of determinism without atomics).
 *
 * Thread layout (128 threads = 4 warps in every kernel). A "row x key" tile (S, dP) is split
 * as 16 row groups (ty) x 8 key lanes (tx): thread (ty, tx) holds rows ty*RS .. +RS-1 and keys
 * tx, tx+8, tx+16, ... The 8 threads of a row group are 8 consecutive lanes of one warp, so the
 * row reductions of the softmax are 3 xor-shuffles. A "row x hd" accumulator (O, dQ, dK, dV) is
 * split as 16 row groups x 8 column lanes: thread (ty, tx) holds columns 2tx + 16j, 2tx+16j+1
 * (float2 reads of shared memory, hd must be a multiple of 16).
 *
 * Shared memory: row tiles are [rows][hd + 4] floats. The pad makes the row stride 4 (mod 8)
 * words, so the float4 reads of 8 different key rows by the 8 lanes of a quarter warp hit 32
 * distinct banks; the row reads of the other operand are broadcasts. P / dS tiles are
 * [rows][keys + 4] (16-byte aligned rows for float4 reads). Global -> shared copies are
 * cp.async (16-byte chunks when every pointer and leading dimension allows, else 4-byte ones),
 * zero-filling rows past T so that padded rows and keys are finite (they are masked anyway).
 *
 * Per-hd configurations (BR query rows x BC keys; shared bytes; see the launchers):
 *   forward   BR=64, BC=64 (BC=32 for hd=128): hd=64 69.6 KB, hd=96 94 KB, hd=128 76.8 KB
 *   dK/dV     BR=32 query rows per step, BC=64 keys per block (32 for hd=128)
 *   dQ        BR=64 (32 for hd=128), BC=64 for hd<=32, else 32
 * Every configuration stays under the 99 KB a block may have on sm_86/sm_89 (the largest:
 * 94 KB, hd=96 forward and dK/dV); at hd=96/128 two blocks fit on an sm_90 SM (228 KB), at
 * hd<=64 three or more. __launch_bounds__ asks ptxas for the matching occupancy (2 blocks:
 * up to 255 registers; 3 blocks: 168): no spills, except 8 bytes in dQ hd=32 on sm_86/89. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_internal.h"

namespace {

constexpr int NT = 128; /* threads per block, every kernel */
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;
constexpr unsigned FULL = 0xffffffffu;

/* ---- cp.async (sm_80+) ---- */

/* 16-byte copy; src_size 0 zero-fills the destination without reading src. */
__device__ __forceinline__ void cp_async16(float *dst, const float *src, bool valid) {
    unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(n)
                 : "memory");
}

__device__ __forceinline__ void cp_async4(float *dst, const float *src, bool valid) {
    unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    int n = valid ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(src), "r"(n)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

/* Waits until at most N of this thread's committed groups are still in flight. */
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* Starts copying rows [row0, row0 + ROWS) of a [T, HD] strided view g (row r at g + r*ldg)
 * into s[ROWS][HD + 4]; rows >= T are zero-filled. Consecutive threads take consecutive
 * chunks of a row: coalesced. */
template <int HD, int ROWS>
__device__ __forceinline__ void load_rows(float *s, const float *g, int64_t ldg, int row0, int T,
                                          bool vec) {
    constexpr int LD = HD + 4;
    if (vec) {
        constexpr int CPR = HD / 4; /* 16-byte chunks per row */
        for (int c = threadIdx.x; c < ROWS * CPR; c += NT) {
            int r = c / CPR, col = (c % CPR) * 4, gr = row0 + r;
            bool ok = gr < T;
            cp_async16(s + r * LD + col, ok ? g + gr * ldg + col : g, ok);
        }
    } else {
        for (int c = threadIdx.x; c < ROWS * HD; c += NT) {
            int r = c / HD, col = c % HD, gr = row0 + r;
            bool ok = gr < T;
            cp_async4(s + r * LD + col, ok ? g + gr * ldg + col : g, ok);
        }
    }
}

__device__ __forceinline__ float f4at(const float4 &a, int u) {
    return u == 0 ? a.x : u == 1 ? a.y : u == 2 ? a.z : a.w; /* u is unrolled: a register */
}

/* s[i][j] = A[a0 + i] . B[tx + 8j] over HD, A and B row tiles [.][HD + 4] in shared memory.
 * Per 4 columns of hd: RS + CS float4 reads for 4 * RS * CS FMAs. */
template <int HD, int RS, int CS>
__device__ __forceinline__ void dot_tile(float (&s)[RS][CS], const float *A, int a0,
                                         const float *B, int tx) {
    constexpr int LD = HD + 4;
#pragma unroll
    for (int i = 0; i < RS; i++)
#pragma unroll
        for (int j = 0; j < CS; j++) s[i][j] = 0.0f;
    const float *ap = A + a0 * LD, *bp = B + tx * LD;
#pragma unroll 2
    for (int d = 0; d < HD; d += 4) {
        float4 a[RS], b[CS];
#pragma unroll
        for (int i = 0; i < RS; i++) a[i] = *reinterpret_cast<const float4 *>(ap + i * LD + d);
#pragma unroll
        for (int j = 0; j < CS; j++)
            b[j] = *reinterpret_cast<const float4 *>(bp + 8 * j * LD + d);
#pragma unroll
        for (int i = 0; i < RS; i++)
#pragma unroll
            for (int j = 0; j < CS; j++) {
                float t = s[i][j];
                t = fmaf(a[i].x, b[j].x, t);
                t = fmaf(a[i].y, b[j].y, t);
                t = fmaf(a[i].z, b[j].z, t);
                t = fmaf(a[i].w, b[j].w, t);
                s[i][j] = t;
            }
    }
}

/* acc[i][cols] += sum_c P[m0 + i][c] * X[c][cols] over c < K; P [.][LDP], X [K][HD + 4];
 * the thread's columns are 2tx + 16j, 2tx + 16j + 1 (acc[i][2j], acc[i][2j + 1]). */
template <int HD, int M, int K, int LDP>
__device__ __forceinline__ void acc_pn(float (&acc)[M][HD / 8], const float *P, int m0,
                                       const float *X, int tx) {
    constexpr int LD = HD + 4;
    const float *xp = X + 2 * tx;
#pragma unroll 2
    for (int c = 0; c < K; c += 4) {
        float4 p[M];
#pragma unroll
        for (int i = 0; i < M; i++)
            p[i] = *reinterpret_cast<const float4 *>(P + (m0 + i) * LDP + c);
#pragma unroll
        for (int u = 0; u < 4; u++) {
#pragma unroll
            for (int j = 0; j < HD / 16; j++) {
                float2 x = *reinterpret_cast<const float2 *>(xp + (c + u) * LD + 16 * j);
#pragma unroll
                for (int i = 0; i < M; i++) {
                    float pv = f4at(p[i], u);
                    acc[i][2 * j] = fmaf(pv, x.x, acc[i][2 * j]);
                    acc[i][2 * j + 1] = fmaf(pv, x.y, acc[i][2 * j + 1]);
                }
            }
        }
    }
}

/* acc[kk][cols] += sum_r P[r][key0 + kk] * X[r][cols] over r < R (the transposed product:
 * dV += P^T dO, dK += dS^T Q); KS is 2 or 4 (one float2 / float4 read of P per r). */
template <int HD, int KS, int R, int LDP>
__device__ __forceinline__ void acc_pt(float (&acc)[KS][HD / 8], const float *P, int key0,
                                       const float *X, int tx) {
    static_assert(KS == 2 || KS == 4, "KS");
    constexpr int LD = HD + 4;
    const float *xp = X + 2 * tx, *pp = P + key0;
#pragma unroll 4
    for (int r = 0; r < R; r++) {
        float p[KS];
        if constexpr (KS == 4) {
            float4 t = *reinterpret_cast<const float4 *>(pp + r * LDP);
            p[0] = t.x, p[1] = t.y, p[2] = t.z, p[3] = t.w;
        } else {
            float2 t = *reinterpret_cast<const float2 *>(pp + r * LDP);
            p[0] = t.x, p[1] = t.y;
        }
#pragma unroll
        for (int j = 0; j < HD / 16; j++) {
            float2 x = *reinterpret_cast<const float2 *>(xp + r * LD + 16 * j);
#pragma unroll
            for (int kk = 0; kk < KS; kk++) {
                acc[kk][2 * j] = fmaf(p[kk], x.x, acc[kk][2 * j]);
                acc[kk][2 * j + 1] = fmaf(p[kk], x.y, acc[kk][2 * j + 1]);
            }
        }
    }
}

/* Stores the thread's columns of one row (times mul) to row pointer g. */
template <int HD>
__device__ __forceinline__ void store_row(float *g, const float *acc, float mul, int tx,
                                          bool vec) {
#pragma unroll
    for (int j = 0; j < HD / 16; j++) {
        float2 x = make_float2(acc[2 * j] * mul, acc[2 * j + 1] * mul);
        float *p = g + 2 * tx + 16 * j;
        if (vec)
            *reinterpret_cast<float2 *>(p) = x;
        else
            p[0] = x.x, p[1] = x.y;
    }
}

__device__ __forceinline__ float row_max8(float x) { /* over the 8 lanes of a row group */
    x = fmaxf(x, __shfl_xor_sync(FULL, x, 1));
    x = fmaxf(x, __shfl_xor_sync(FULL, x, 2));
    return fmaxf(x, __shfl_xor_sync(FULL, x, 4));
}

__device__ __forceinline__ float row_sum8(float x) {
    x += __shfl_xor_sync(FULL, x, 1);
    x += __shfl_xor_sync(FULL, x, 2);
    return x + __shfl_xor_sync(FULL, x, 4);
}

/* ---- forward ---- */

template <int HD, int BC>
constexpr size_t fwd_smem() {
    return ((size_t)(64 + 2 * BC) * (HD + 4) + (size_t)64 * (BC + 4)) * sizeof(float);
}

template <int HD, int BC>
__global__ void __launch_bounds__(NT, HD >= 80 ? 2 : 3)
    attn_fwd_kernel(float *out, float *lse, const float *__restrict__ q, int ldq,
                    const float *__restrict__ k, int ldk, const float *__restrict__ v, int ldv,
                    int T, int H, int group, float scale_log2, bool causal, bool vec) {
    constexpr int BR = 64, RS = BR / 16, CS = BC / 8, CO = HD / 8, LD = HD + 4, LDP = BC + 4;
    static_assert(HD % 16 == 0 && BC % 32 == 0, "tile shape");
    extern __shared__ float4 smem_f4[];
    float *Qs = reinterpret_cast<float *>(smem_f4);
    float *Ks = Qs + BR * LD, *Vs = Ks + BC * LD, *Ps = Vs + BC * LD;

    /* causal: the last query tiles see the most keys; launch them first */
    const int qt = causal ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
    const int h = blockIdx.y, b = blockIdx.z, hkv = h / group, q0 = qt * BR;
    const int lane = threadIdx.x & 31, tx = lane & 7;
    const int r0 = ((threadIdx.x >> 5) * 4 + (lane >> 3)) * RS; /* the thread's first row */
    const float *qg = q + (int64_t)b * T * ldq + (int64_t)h * HD;
    const float *kg = k + (int64_t)b * T * ldk + (int64_t)hkv * HD;
    const float *vg = v + (int64_t)b * T * ldv + (int64_t)hkv * HD;
    const int kv_end = causal ? min(q0 + BR, T) : T; /* keys past the tile's last row: masked */
    const int nkt = (kv_end + BC - 1) / BC;

    /* Pipeline: K of the next tile loads during this tile's softmax and P V, V of the next
     * tile during the next S. One commit group per buffer and step (possibly empty), so
     * wait_group 1 always means "the older of the two in flight has landed". */
    load_rows<HD, BR>(Qs, qg, ldq, q0, T, vec);
    load_rows<HD, BC>(Ks, kg, ldk, 0, T, vec);
    cp_async_commit();
    load_rows<HD, BC>(Vs, vg, ldv, 0, T, vec);
    cp_async_commit();

    float m[RS], l[RS], o[RS][CO];
#pragma unroll
    for (int i = 0; i < RS; i++) {
        m[i] = -INFINITY, l[i] = 0.0f;
#pragma unroll
        for (int c = 0; c < CO; c++) o[i][c] = 0.0f;
    }

    for (int kt = 0; kt < nkt; kt++) {
        const int k0 = kt * BC;
        cp_async_wait<1>(); /* Q and K of this tile */
        __syncthreads();
        float s[RS][CS];
        dot_tile<HD, RS, CS>(s, Qs, r0, Ks, tx);
        __syncthreads(); /* every warp is done with Ks */
        if (kt + 1 < nkt) load_rows<HD, BC>(Ks, kg, ldk, k0 + BC, T, vec);
        cp_async_commit();

        /* masking is needed only on the tile holding T and on tiles crossing the diagonal */
        const bool edge = k0 + BC > T || (causal && k0 + BC - 1 > q0);
#pragma unroll
        for (int i = 0; i < RS; i++) {
            const int row = q0 + r0 + i;
            float mt = -INFINITY;
#pragma unroll
            for (int j = 0; j < CS; j++) {
                float x = s[i][j] * scale_log2;
                if (edge) {
                    int key = k0 + tx + 8 * j;
                    if (key >= T || (causal && key > row)) x = -INFINITY;
                }
                s[i][j] = x;
                mt = fmaxf(mt, x);
            }
            const float mn = fmaxf(m[i], row_max8(mt));
            /* a row with nothing visible yet keeps m = -inf: subtract 0, not -inf (NaN) */
            const float ms = mn == -INFINITY ? 0.0f : mn;
            const float alpha = exp2f(m[i] - ms);
            m[i] = mn;
            float ps = 0.0f;
#pragma unroll
            for (int j = 0; j < CS; j++) {
                float p = exp2f(s[i][j] - ms);
                ps += p;
                Ps[(r0 + i) * LDP + tx + 8 * j] = p;
            }
            l[i] = l[i] * alpha + ps; /* this lane's part of the row sum; reduced at the end */
#pragma unroll
            for (int c = 0; c < CO; c++) o[i][c] *= alpha;
        }
        cp_async_wait<1>(); /* V of this tile */
        __syncthreads();    /* V and P visible */
        acc_pn<HD, RS, BC, LDP>(o, Ps, r0, Vs, tx);
        __syncthreads(); /* every warp is done with Vs */
        if (kt + 1 < nkt) load_rows<HD, BC>(Vs, vg, ldv, k0 + BC, T, vec);
        cp_async_commit();
    }

    const int ldo = H * HD;
#pragma unroll
    for (int i = 0; i < RS; i++) {
        const float L = row_sum8(l[i]); /* > 0: every row sees key 0 */
        const int row = q0 + r0 + i;
        if (row < T) {
            store_row<HD>(out + ((int64_t)b * T + row) * ldo + (int64_t)h * HD, o[i], 1.0f / L,
                          tx, vec);
            if (tx == 0) lse[((int64_t)b * H + h) * T + row] = (m[i] + log2f(L)) * LN2;
        }
    }
}

/* ---- backward ---- */

/* D[b, h, t] = dout . out over the row's hd values; one warp per (token, head). */
__global__ void __launch_bounds__(256)
    attn_bwd_d_kernel(float *D, const float *__restrict__ dout, const float *__restrict__ out,
                      int64_t rows, int T, int H, int hd) {
    const int64_t w = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (w >= rows * H) return; /* whole warps */
    const int64_t r = w / H;
    const int h = (int)(w % H);
    const float *a = dout + r * H * hd + (int64_t)h * hd, *o = out + r * H * hd + (int64_t)h * hd;
    float acc = 0.0f;
    for (int c = lane; c < hd; c += 32) acc = fmaf(a[c], o[c], acc);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(FULL, acc, off);
    if (lane == 0) {
        const int64_t b = r / T, t = r % T;
        D[(b * H + h) * T + t] = acc;
    }
}

/* P and dS of one (row, key) pair from the raw scores; 0 on masked pairs and padding. */
struct row_stats {
    float lse2, D; /* lse in log2 units, rowsum(dO * O) */
    bool valid;    /* row < T */
};

__device__ __forceinline__ row_stats load_row_stats(const float *lse_h, const float *D_h,
                                                    int row, int T) {
    row_stats s;
    s.valid = row < T;
    s.lse2 = s.valid ? lse_h[row] * LOG2E : 0.0f;
    s.D = s.valid ? D_h[row] : 0.0f;
    return s;
}

template <int HD, int BR, int BC>
constexpr size_t dkv_smem() {
    return ((size_t)(2 * BC + 2 * BR) * (HD + 4) + (size_t)2 * BR * (BC + 4)) * sizeof(float);
}

template <int HD, int BR, int BC>
__global__ void __launch_bounds__(NT, HD >= 80 ? 2 : 3)
    attn_bwd_dkv_kernel(float *dk, float *dv, const float *__restrict__ dout,
                        const float *__restrict__ lse, const float *__restrict__ D,
                        const float *__restrict__ q, int ldq, const float *__restrict__ k,
                        int ldk, const float *__restrict__ v, int ldv, int T, int H, int group,
                        float scale, float scale_log2, bool causal, bool vec) {
    constexpr int RS = BR / 16, CS = BC / 8, KS = BC / 16, CO = HD / 8, LD = HD + 4,
                  LDP = BC + 4;
    static_assert(HD % 16 == 0 && BC % 32 == 0 && BR % 32 == 0, "tile shape");
    extern __shared__ float4 smem_f4[];
    float *Ks = reinterpret_cast<float *>(smem_f4);
    float *Vs = Ks + BC * LD, *Qs = Vs + BC * LD, *dOs = Qs + BR * LD, *Ps = dOs + BR * LD,
          *dSs = Ps + BR * LDP;

    /* causal: key tile 0 is seen by every query, the heaviest; it is launched first already */
    const int kt = blockIdx.x, hkv = blockIdx.y, b = blockIdx.z, k0 = kt * BC;
    const int lane = threadIdx.x & 31, tx = lane & 7, ty = (threadIdx.x >> 5) * 4 + (lane >> 3);
    const int r0 = ty * RS;   /* rows of the S / dP tile */
    const int key0 = ty * KS; /* keys of the dK / dV accumulators */
    const int ldo = H * HD;
    const float *kg = k + (int64_t)b * T * ldk + (int64_t)hkv * HD;
    const float *vg = v + (int64_t)b * T * ldv + (int64_t)hkv * HD;
    load_rows<HD, BC>(Ks, kg, ldk, k0, T, vec);
    load_rows<HD, BC>(Vs, vg, ldv, k0, T, vec);
    cp_async_commit(); /* waited for with the first query tile */

    float dKa[KS][CO], dVa[KS][CO];
#pragma unroll
    for (int i = 0; i < KS; i++)
#pragma unroll
        for (int c = 0; c < CO; c++) dKa[i][c] = 0.0f, dVa[i][c] = 0.0f;

    const int nqt = (T + BR - 1) / BR;
    const int qt0 = causal ? k0 / BR : 0; /* earlier query tiles see none of these keys */
    for (int hh = 0; hh < group; hh++) {
        const int h = hkv * group + hh;
        const float *qg = q + (int64_t)b * T * ldq + (int64_t)h * HD;
        const float *og = dout + (int64_t)b * T * ldo + (int64_t)h * HD;
        const float *lse_h = lse + ((int64_t)b * H + h) * T, *D_h = D + ((int64_t)b * H + h) * T;
        for (int qt = qt0; qt < nqt; qt++) {
            const int q0 = qt * BR;
            load_rows<HD, BR>(Qs, qg, ldq, q0, T, vec);
            load_rows<HD, BR>(dOs, og, ldo, q0, T, vec);
            cp_async_commit();
            cp_async_wait<0>();
            __syncthreads();
            float s[RS][CS], dp[RS][CS];
            dot_tile<HD, RS, CS>(s, Qs, r0, Ks, tx);
            dot_tile<HD, RS, CS>(dp, dOs, r0, Vs, tx);
#pragma unroll
            for (int i = 0; i < RS; i++) {
                const int row = q0 + r0 + i;
                const row_stats st = load_row_stats(lse_h, D_h, row, T);
#pragma unroll
                for (int j = 0; j < CS; j++) {
                    const int key = k0 + tx + 8 * j;
                    const bool ok = st.valid && key < T && (!causal || key <= row);
                    const float p = ok ? exp2f(fmaf(s[i][j], scale_log2, -st.lse2)) : 0.0f;
                    Ps[(r0 + i) * LDP + tx + 8 * j] = p;
                    dSs[(r0 + i) * LDP + tx + 8 * j] = p * (dp[i][j] - st.D);
                }
            }
            __syncthreads(); /* P, dS complete: the next products read them transposed */
            acc_pt<HD, KS, BR, LDP>(dVa, Ps, key0, dOs, tx);
            acc_pt<HD, KS, BR, LDP>(dKa, dSs, key0, Qs, tx);
            __syncthreads(); /* before the next tile overwrites Qs, dOs, Ps, dSs */
        }
    }

#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
        const int key = k0 + key0 + kk;
        if (key < T) {
            const int64_t r = (int64_t)b * T + key;
            store_row<HD>(dk + r * ldk + (int64_t)hkv * HD, dKa[kk], scale, tx, vec);
            store_row<HD>(dv + r * ldv + (int64_t)hkv * HD, dVa[kk], 1.0f, tx, vec);
        }
    }
}

template <int HD, int BR, int BC>
constexpr size_t dq_smem() {
    return ((size_t)(2 * BR + 2 * BC) * (HD + 4) + (size_t)BR * (BC + 4)) * sizeof(float);
}

template <int HD, int BR, int BC>
__global__ void __launch_bounds__(NT, HD >= 96 ? 2 : 3)
    attn_bwd_dq_kernel(float *dq, const float *__restrict__ dout, const float *__restrict__ lse,
                       const float *__restrict__ D, const float *__restrict__ q, int ldq,
                       const float *__restrict__ k, int ldk, const float *__restrict__ v, int ldv,
                       int T, int H, int group, float scale, float scale_log2, bool causal,
                       bool vec) {
    constexpr int RS = BR / 16, CS = BC / 8, CO = HD / 8, LD = HD + 4, LDP = BC + 4;
    static_assert(HD % 16 == 0 && BC % 32 == 0 && BR % 32 == 0, "tile shape");
    extern __shared__ float4 smem_f4[];
    float *Qs = reinterpret_cast<float *>(smem_f4);
    float *dOs = Qs + BR * LD, *Ks = dOs + BR * LD, *Vs = Ks + BC * LD, *dSs = Vs + BC * LD;

    const int qt = causal ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
    const int h = blockIdx.y, b = blockIdx.z, hkv = h / group, q0 = qt * BR;
    const int lane = threadIdx.x & 31, tx = lane & 7;
    const int r0 = ((threadIdx.x >> 5) * 4 + (lane >> 3)) * RS;
    const int ldo = H * HD;
    const float *qg = q + (int64_t)b * T * ldq + (int64_t)h * HD;
    const float *og = dout + (int64_t)b * T * ldo + (int64_t)h * HD;
    const float *kg = k + (int64_t)b * T * ldk + (int64_t)hkv * HD;
    const float *vg = v + (int64_t)b * T * ldv + (int64_t)hkv * HD;
    const float *lse_h = lse + ((int64_t)b * H + h) * T, *D_h = D + ((int64_t)b * H + h) * T;
    const int kv_end = causal ? min(q0 + BR, T) : T;
    const int nkt = (kv_end + BC - 1) / BC;

    /* K and V of one tile are both needed for S and dP; V is released after dP (the next V
     * loads during dS and dQ += dS K), K after dQ += dS K. */
    load_rows<HD, BR>(Qs, qg, ldq, q0, T, vec);
    load_rows<HD, BR>(dOs, og, ldo, q0, T, vec);
    load_rows<HD, BC>(Ks, kg, ldk, 0, T, vec);
    load_rows<HD, BC>(Vs, vg, ldv, 0, T, vec);
    cp_async_commit();

    row_stats st[RS];
#pragma unroll
    for (int i = 0; i < RS; i++) st[i] = load_row_stats(lse_h, D_h, q0 + r0 + i, T);
    float dQa[RS][CO];
#pragma unroll
    for (int i = 0; i < RS; i++)
#pragma unroll
        for (int c = 0; c < CO; c++) dQa[i][c] = 0.0f;

    for (int kt = 0; kt < nkt; kt++) {
        const int k0 = kt * BC;
        cp_async_wait<0>();
        __syncthreads();
        float s[RS][CS], dp[RS][CS];
        dot_tile<HD, RS, CS>(s, Qs, r0, Ks, tx);
        dot_tile<HD, RS, CS>(dp, dOs, r0, Vs, tx);
        __syncthreads(); /* every warp is done with Vs */
        if (kt + 1 < nkt) {
            load_rows<HD, BC>(Vs, vg, ldv, k0 + BC, T, vec);
            cp_async_commit();
        }
#pragma unroll
        for (int i = 0; i < RS; i++) {
            const int row = q0 + r0 + i;
#pragma unroll
            for (int j = 0; j < CS; j++) {
                const int key = k0 + tx + 8 * j;
                const bool ok = st[i].valid && key < T && (!causal || key <= row);
                const float p = ok ? exp2f(fmaf(s[i][j], scale_log2, -st[i].lse2)) : 0.0f;
                dSs[(r0 + i) * LDP + tx + 8 * j] = p * (dp[i][j] - st[i].D);
            }
        }
        __syncwarp(); /* dS rows r0.. are written and read by this warp only */
        acc_pn<HD, RS, BC, LDP>(dQa, dSs, r0, Ks, tx);
        __syncthreads(); /* every warp is done with Ks */
        if (kt + 1 < nkt) {
            load_rows<HD, BC>(Ks, kg, ldk, k0 + BC, T, vec);
            cp_async_commit();
        }
    }

#pragma unroll
    for (int i = 0; i < RS; i++) {
        const int row = q0 + r0 + i;
        if (row < T)
            store_row<HD>(dq + ((int64_t)b * T + row) * ldq + (int64_t)h * HD, dQa[i], scale,
                          tx, vec);
    }
}

/* ---- host side ---- */

bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

[[noreturn]] void unsupported_hd(const char *op, int hd) {
    fprintf(stderr,
            "internal error: cuda %s: head dim %d is not supported by the CUDA attention "
            "kernels (supported: 32, 64, 80, 96, 128)\n",
            op, hd);
    abort();
}

void check_shape(const char *op, int B, int T, int H, int Hkv) {
    if (B < 1 || T < 1 || H < 1 || Hkv < 1 || H % Hkv != 0 || H > 65535 || B > 65535 ||
        Hkv > 65535) {
        fprintf(stderr, "internal error: cuda %s: bad shape B=%d T=%d H=%d Hkv=%d\n", op, B, T,
                H, Hkv);
        abort();
    }
}

template <typename K>
void set_smem(K kernel, size_t bytes) {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)bytes));
}

struct att_shape {
    int B, T, H, Hkv, ldq, ldk, ldv;
    bool causal, vec;
    float scale, scale_log2;
};

template <int HD, int BC>
void launch_fwd(cudaStream_t st, const att_shape &a, float *out, float *lse, const float *q,
                const float *k, const float *v) {
    constexpr size_t smem = fwd_smem<HD, BC>();
    set_smem(attn_fwd_kernel<HD, BC>, smem);
    dim3 grid((unsigned)((a.T + 63) / 64), (unsigned)a.H, (unsigned)a.B);
    attn_fwd_kernel<HD, BC><<<grid, NT, smem, st>>>(out, lse, q, a.ldq, k, a.ldk, v, a.ldv, a.T,
                                                    a.H, a.H / a.Hkv, a.scale_log2, a.causal,
                                                    a.vec);
    CUDA_CHECK(cudaGetLastError());
}

template <int HD, int BR_KV, int BC_KV, int BR_Q, int BC_Q>
void launch_bwd(cudaStream_t st, const att_shape &a, float *dq, float *dk, float *dv,
                const float *dout, const float *lse, const float *D, const float *q,
                const float *k, const float *v) {
    const int group = a.H / a.Hkv;
    constexpr size_t smem_kv = dkv_smem<HD, BR_KV, BC_KV>();
    set_smem(attn_bwd_dkv_kernel<HD, BR_KV, BC_KV>, smem_kv);
    dim3 gkv((unsigned)((a.T + BC_KV - 1) / BC_KV), (unsigned)a.Hkv, (unsigned)a.B);
    attn_bwd_dkv_kernel<HD, BR_KV, BC_KV><<<gkv, NT, smem_kv, st>>>(
        dk, dv, dout, lse, D, q, a.ldq, k, a.ldk, v, a.ldv, a.T, a.H, group, a.scale,
        a.scale_log2, a.causal, a.vec);
    CUDA_CHECK(cudaGetLastError());

    constexpr size_t smem_q = dq_smem<HD, BR_Q, BC_Q>();
    set_smem(attn_bwd_dq_kernel<HD, BR_Q, BC_Q>, smem_q);
    dim3 gq((unsigned)((a.T + BR_Q - 1) / BR_Q), (unsigned)a.H, (unsigned)a.B);
    attn_bwd_dq_kernel<HD, BR_Q, BC_Q><<<gq, NT, smem_q, st>>>(dq, dout, lse, D, q, a.ldq, k, a.ldk, v,
                                                         a.ldv, a.T, a.H, group, a.scale,
                                                         a.scale_log2, a.causal, a.vec);
    CUDA_CHECK(cudaGetLastError());
}

att_shape make_shape(int B, int T, int H, int Hkv, int hd, int ldq, int ldk, int ldv,
                     bool causal) {
    att_shape a;
    a.B = B, a.T = T, a.H = H, a.Hkv = Hkv, a.ldq = ldq, a.ldk = ldk, a.ldv = ldv;
    a.causal = causal;
    a.scale = 1.0f / sqrtf((float)hd);
    a.scale_log2 = a.scale * LOG2E;
    a.vec = ldq % 4 == 0 && ldk % 4 == 0 && ldv % 4 == 0;
    return a;
}

} /* namespace */

extern "C" void cuda_attention_fwd(device *d, float *out, float *lse, const float *q, int ldq,
                                   const float *k, int ldk, const float *v, int ldv, int B, int T,
                                   int H, int Hkv, int hd, bool causal) {
    check_shape("attention_fwd", B, T, H, Hkv);
    att_shape a = make_shape(B, T, H, Hkv, hd, ldq, ldk, ldv, causal);
    a.vec = a.vec && aligned16(q) && aligned16(k) && aligned16(v) && aligned16(out);
    cudaStream_t st = cuda_stream(d, DEV_STREAM_COMPUTE);
    switch (hd) {
    case 32: launch_fwd<32, 64>(st, a, out, lse, q, k, v); break;
    case 64: launch_fwd<64, 64>(st, a, out, lse, q, k, v); break;
    case 80: launch_fwd<80, 64>(st, a, out, lse, q, k, v); break;
    case 96: launch_fwd<96, 64>(st, a, out, lse, q, k, v); break;
    case 128: launch_fwd<128, 32>(st, a, out, lse, q, k, v); break;
    default: unsupported_hd("attention_fwd", hd);
    }
}

extern "C" void cuda_attention_bwd(device *d, float *dq, float *dk, float *dv, const float *dout,
                                   const float *out, const float *lse, const float *q, int ldq,
                                   const float *k, int ldk, const float *v, int ldv, int B, int T,
                                   int H, int Hkv, int hd, bool causal) {
    check_shape("attention_bwd", B, T, H, Hkv);
    if (hd != 32 && hd != 64 && hd != 80 && hd != 96 && hd != 128)
        unsupported_hd("attention_bwd", hd);
    att_shape a = make_shape(B, T, H, Hkv, hd, ldq, ldk, ldv, causal);
    a.vec = a.vec && aligned16(q) && aligned16(k) && aligned16(v) && aligned16(dout) &&
            aligned16(dq) && aligned16(dk) && aligned16(dv);
    cudaStream_t st = cuda_stream(d, DEV_STREAM_COMPUTE);

    /* D = rowsum(dout * out), [B, H, T] */
    const int64_t rows = (int64_t)B * T;
    float *D = (float *)cuda_scratch(d, (size_t)rows * H * sizeof(float));
    const int64_t warps = rows * H;
    attn_bwd_d_kernel<<<(unsigned)((warps + 7) / 8), 256, 0, st>>>(D, dout, out, rows, T, H, hd);
    CUDA_CHECK(cudaGetLastError());

    switch (hd) {
    case 32: launch_bwd<32, 32, 64, 64, 64>(st, a, dq, dk, dv, dout, lse, D, q, k, v); break;
    case 64: launch_bwd<64, 32, 64, 64, 32>(st, a, dq, dk, dv, dout, lse, D, q, k, v); break;
    case 80: launch_bwd<80, 32, 64, 64, 32>(st, a, dq, dk, dv, dout, lse, D, q, k, v); break;
    case 96: launch_bwd<96, 32, 64, 64, 32>(st, a, dq, dk, dv, dout, lse, D, q, k, v); break;
    case 128: launch_bwd<128, 32, 32, 32, 32>(st, a, dq, dk, dv, dout, lse, D, q, k, v); break;
    default: unsupported_hd("attention_bwd", hd);
    }
}
