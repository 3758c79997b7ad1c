/* cuda_attention.cu - flash-style attention (FlashAttention-2 tiling) for the CUDA device, fp32.
 * (bf16/fp16 precision on sm_80+, and fp16 on sm_75, with CEPHALO_CUDA_ATTN=mma runs the tensor-core kernels of
 * cuda_attention_mma.cu instead: cuda_attention_fwd/bwd hand over to them.)
 *
 * Never a T x T matrix: a block owns a tile of rows, streams the other operand through shared
 * memory in tiles and keeps its running results in registers. All math is fp32 on the CUDA
 * cores (FFMA); scores are kept in log2 units (scale * log2(e) folded into one multiply) so that
 * every exponential is one exp2f; lse is stored in natural-log units like the CPU device.
 *
 * Forward, one block per (query tile of BR rows, head, sample): Q tile in shared memory; for
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
 * (float2 reads of shared memory: the tile width HD is a multiple of 16). A head dim hd that is
 * not a tile width runs in the next wider one (PAD): the global layouts use hd, the columns
 * hd..HD-1 are zero in shared memory and never stored (attn_limits.h has the rule).
 *
 * Shared memory: row tiles are [rows][hd + 4] floats. The pad makes the row stride 4 (mod 8)
 * words, so the float4 reads of 8 different key rows by the 8 lanes of a quarter warp hit 32
 * distinct banks; the row reads of the other operand are broadcasts. P / dS tiles are
 * [rows][keys + 4] (16-byte aligned rows for float4 reads). Global -> shared copies are
 * cp.async on sm_80+ and plain loads before (16-byte chunks when every pointer and leading
 * dimension allows, else 4-byte ones), zero-filling rows past T so that padded rows and keys are
 * finite (they are masked anyway).
 *
 * Configurations (BR query rows x BC keys; the TILES table below, docs/cuda.md has the bytes):
 * per kernel a "big" one, tuned for sm_80+ (up to 94 KB: hd=96 forward and dK/dV), and a "small"
 * one within the 48 KB every GPU allows; each call takes the big one when the GPU's opt-in limit
 * holds it (sm_70+ mostly), else the small one. On sm_90 two big blocks fit an SM at hd >= 80,
 * three or more below. __launch_bounds__ asks ptxas for the matching occupancy (2 blocks: up to
 * 255 registers; 3 blocks: 168), which every GPU from sm_60 on can hold (64K registers per SM).
 * ptxas: no spills on sm_60/61/75/80/90; 8 bytes in dQ hd=32 on sm_86/89 (as before); with
 * CUDA 11.8, 20/28 and 12/16 bytes in sm_70's big plain-load dK/dV hd=64 and dQ hd=32. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/attn_limits.h"
#include "devices/cuda_internal.h"

namespace {

constexpr int NT = 128; /* threads per block, every kernel */
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;
constexpr unsigned FULL = 0xffffffffu;
/* Shared memory any block may have without opting in, on every GPU (sm_60 .. sm_90). */
constexpr size_t SMEM_STATIC = 48 * 1024;

/* ---- global -> shared copies: cp.async on sm_80+, plain loads otherwise ----
 *
 * Every kernel is instantiated twice over this choice (ASYNC): the cp.async pipeline where the
 * GPU has it (sm_80+), and plain loads for sm_60..sm_75 and for CEPHALO_CUDA_PORTABLE=1. The
 * kernels put a __syncthreads between every write of a shared tile and its readers anyway (the
 * async path needs it after its wait), so with plain loads the commit/wait calls simply become
 * no-ops and the same code is correct. The cp.async helpers themselves are compiled to plain
 * copies for targets below sm_80 (ptxas rejects the instruction there); the run-time choice
 * never launches an ASYNC kernel on such a GPU, so that body is only there to compile. */

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define CEPHALO_HAVE_CP_ASYNC 0
#else
#define CEPHALO_HAVE_CP_ASYNC 1
#endif

/* 16-byte copy; src_size 0 zero-fills the destination without reading src. */
__device__ __forceinline__ void cp_async16(float *dst, const float *src, bool valid) {
#if CEPHALO_HAVE_CP_ASYNC
    unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(n)
                 : "memory");
#else
    *reinterpret_cast<float4 *>(dst) =
        valid ? *reinterpret_cast<const float4 *>(src) : make_float4(0.f, 0.f, 0.f, 0.f);
#endif
}

__device__ __forceinline__ void cp_async4(float *dst, const float *src, bool valid) {
#if CEPHALO_HAVE_CP_ASYNC
    unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    int n = valid ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(src), "r"(n)
                 : "memory");
#else
    *dst = valid ? *src : 0.0f;
#endif
}

template <bool ASYNC>
__device__ __forceinline__ void cp_async_commit() {
#if CEPHALO_HAVE_CP_ASYNC
    if constexpr (ASYNC) asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

/* Waits until at most N of this thread's committed groups are still in flight. */
template <int N, bool ASYNC>
__device__ __forceinline__ void cp_async_wait() {
#if CEPHALO_HAVE_CP_ASYNC
    if constexpr (ASYNC) asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

/* One 16-byte (vec) or 4-byte element copy into shared memory, zero when !ok. */
template <bool ASYNC>
__device__ __forceinline__ void copy16(float *dst, const float *src, bool ok) {
    if constexpr (ASYNC)
        cp_async16(dst, src, ok);
    else
        *reinterpret_cast<float4 *>(dst) =
            ok ? *reinterpret_cast<const float4 *>(src) : make_float4(0.f, 0.f, 0.f, 0.f);
}

template <bool ASYNC>
__device__ __forceinline__ void copy4(float *dst, const float *src, bool ok) {
    if constexpr (ASYNC)
        cp_async4(dst, src, ok);
    else
        *dst = ok ? *src : 0.0f;
}

/* Starts copying rows [row0, row0 + ROWS) of a [T, hd] strided view g (row r at g + r*ldg)
 * into s[ROWS][HD + 4]; rows >= T are zero-filled, and so are columns >= hd when the head dim
 * is padded (PAD: hd < HD, the tile width; zero columns add nothing to any dot product).
 * Consecutive threads take consecutive chunks of a row: coalesced. vec needs hd % 4 == 0. */
template <int HD, int ROWS, bool ASYNC, bool PAD>
__device__ __forceinline__ void load_rows(float *s, const float *g, int64_t ldg, int row0, int T,
                                          int hd, bool vec) {
    constexpr int LD = HD + 4;
    if (vec) {
        constexpr int CPR = HD / 4; /* 16-byte chunks per row */
        for (int c = threadIdx.x; c < ROWS * CPR; c += NT) {
            int r = c / CPR, col = (c % CPR) * 4, gr = row0 + r;
            bool ok = gr < T && (!PAD || col < hd);
            copy16<ASYNC>(s + r * LD + col, ok ? g + gr * ldg + col : g, ok);
        }
    } else {
        for (int c = threadIdx.x; c < ROWS * HD; c += NT) {
            int r = c / HD, col = c % HD, gr = row0 + r;
            bool ok = gr < T && (!PAD || col < hd);
            copy4<ASYNC>(s + r * LD + col, ok ? g + gr * ldg + col : g, ok);
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
 * dV += P^T dO, dK += dS^T Q); KS is 1, 2 or 4 (one float, float2 or float4 read of P per r). */
template <int HD, int KS, int R, int LDP>
__device__ __forceinline__ void acc_pt(float (&acc)[KS][HD / 8], const float *P, int key0,
                                       const float *X, int tx) {
    static_assert(KS == 1 || KS == 2 || KS == 4, "KS");
    constexpr int LD = HD + 4;
    const float *xp = X + 2 * tx, *pp = P + key0;
#pragma unroll 4
    for (int r = 0; r < R; r++) {
        float p[KS];
        if constexpr (KS == 4) {
            float4 t = *reinterpret_cast<const float4 *>(pp + r * LDP);
            p[0] = t.x, p[1] = t.y, p[2] = t.z, p[3] = t.w;
        } else if constexpr (KS == 2) {
            float2 t = *reinterpret_cast<const float2 *>(pp + r * LDP);
            p[0] = t.x, p[1] = t.y;
        } else {
            p[0] = pp[r * LDP];
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

/* Stores the thread's columns of one row (times mul) to row pointer g; with PAD only the
 * columns < hd (the rest are the zero padding). vec needs hd % 4 == 0, so a float2 pair is
 * wholly inside or wholly outside. */
template <int HD, bool PAD>
__device__ __forceinline__ void store_row(float *g, const float *acc, float mul, int tx, bool vec,
                                          int hd) {
#pragma unroll
    for (int j = 0; j < HD / 16; j++) {
        float2 x = make_float2(acc[2 * j] * mul, acc[2 * j + 1] * mul);
        const int col = 2 * tx + 16 * j;
        float *p = g + col;
        if (vec) {
            if (!PAD || col < hd) *reinterpret_cast<float2 *>(p) = x;
        } else {
            if (!PAD || col < hd) p[0] = x.x;
            if (!PAD || col + 1 < hd) p[1] = x.y;
        }
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

/* Whether the GPUs this compilation targets can ever launch a kernel variant (see pick() and
 * make_ctx() on the host): cp.async kernels need sm_80+; on sm_80+ a plain-load kernel runs only
 * in portable mode, so only within 48 KB; so does any kernel of code compiled below sm_70 (no
 * opt-in above 48 KB there). An unreachable variant compiles to a trap, which keeps the build
 * time of the variant set down (ptxas never sees its body). */
template <bool ASYNC, size_t SMEM>
__device__ constexpr bool reachable() {
#if defined(__CUDA_ARCH__)
    return ASYNC ? CEPHALO_HAVE_CP_ASYNC
                 : SMEM <= SMEM_STATIC || (!CEPHALO_HAVE_CP_ASYNC && __CUDA_ARCH__ >= 700);
#else
    return true;
#endif
}

#define RETURN_IF_UNREACHABLE(async, smem)                                                 \
    if (!reachable<async, smem>()) {                                                       \
        __trap();                                                                          \
        return;                                                                            \
    }

/* ---- forward ---- */

template <int HD, int BR, int BC>
__host__ __device__ constexpr size_t fwd_smem() {
    return ((size_t)(BR + 2 * BC) * (HD + 4) + (size_t)BR * (BC + 4)) * sizeof(float);
}

/* HD: the tile width (the head dim, or the padded one when PAD: then hd_arg < HD is the real
 * head dim, the global layouts use hd_arg and the extra columns are zeros in shared memory). */
template <int HD, int BR, int BC, bool ASYNC, bool PAD>
__global__ void __launch_bounds__(NT, HD >= 80 ? 2 : 3)
    attn_fwd_kernel(float *out, float *lse, const float *__restrict__ q, int ldq,
                    const float *__restrict__ k, int ldk, const float *__restrict__ v, int ldv,
                    int T, int H, int group, float scale_log2, bool causal, bool vec, int hd_arg) {
    constexpr int RS = BR / 16, CS = BC / 8, CO = HD / 8, LD = HD + 4, LDP = BC + 4;
    static_assert(HD % 16 == 0 && BC % 16 == 0 && BR % 16 == 0, "tile shape");
    RETURN_IF_UNREACHABLE(ASYNC, (fwd_smem<HD, BR, BC>()));
    const int hd = PAD ? hd_arg : HD;
    extern __shared__ float4 smem_f4[];
    float *Qs = reinterpret_cast<float *>(smem_f4);
    float *Ks = Qs + BR * LD, *Vs = Ks + BC * LD, *Ps = Vs + BC * LD;

    /* causal: the last query tiles see the most keys; launch them first */
    const int qt = causal ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
    const int h = blockIdx.y, b = blockIdx.z, hkv = h / group, q0 = qt * BR;
    const int lane = threadIdx.x & 31, tx = lane & 7;
    const int r0 = ((threadIdx.x >> 5) * 4 + (lane >> 3)) * RS; /* the thread's first row */
    const float *qg = q + (int64_t)b * T * ldq + (int64_t)h * hd;
    const float *kg = k + (int64_t)b * T * ldk + (int64_t)hkv * hd;
    const float *vg = v + (int64_t)b * T * ldv + (int64_t)hkv * hd;
    const int kv_end = causal ? min(q0 + BR, T) : T; /* keys past the tile's last row: masked */
    const int nkt = (kv_end + BC - 1) / BC;

    /* Pipeline: K of the next tile loads during this tile's softmax and P V, V of the next
     * tile during the next S. One commit group per buffer and step (possibly empty), so
     * wait_group 1 always means "the older of the two in flight has landed". */
    load_rows<HD, BR, ASYNC, PAD>(Qs, qg, ldq, q0, T, hd, vec);
    load_rows<HD, BC, ASYNC, PAD>(Ks, kg, ldk, 0, T, hd, vec);
    cp_async_commit<ASYNC>();
    load_rows<HD, BC, ASYNC, PAD>(Vs, vg, ldv, 0, T, hd, vec);
    cp_async_commit<ASYNC>();

    float m[RS], l[RS], o[RS][CO];
#pragma unroll
    for (int i = 0; i < RS; i++) {
        m[i] = -INFINITY, l[i] = 0.0f;
#pragma unroll
        for (int c = 0; c < CO; c++) o[i][c] = 0.0f;
    }

    for (int kt = 0; kt < nkt; kt++) {
        const int k0 = kt * BC;
        cp_async_wait<1, ASYNC>(); /* Q and K of this tile */
        __syncthreads();
        float s[RS][CS];
        dot_tile<HD, RS, CS>(s, Qs, r0, Ks, tx);
        __syncthreads(); /* every warp is done with Ks */
        if (kt + 1 < nkt) load_rows<HD, BC, ASYNC, PAD>(Ks, kg, ldk, k0 + BC, T, hd, vec);
        cp_async_commit<ASYNC>();

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
        cp_async_wait<1, ASYNC>(); /* V of this tile */
        __syncthreads();    /* V and P visible */
        acc_pn<HD, RS, BC, LDP>(o, Ps, r0, Vs, tx);
        __syncthreads(); /* every warp is done with Vs */
        if (kt + 1 < nkt) load_rows<HD, BC, ASYNC, PAD>(Vs, vg, ldv, k0 + BC, T, hd, vec);
        cp_async_commit<ASYNC>();
    }

    const int ldo = H * hd;
#pragma unroll
    for (int i = 0; i < RS; i++) {
        const float L = row_sum8(l[i]); /* > 0: every row sees key 0 */
        const int row = q0 + r0 + i;
        if (row < T) {
            store_row<HD, PAD>(out + ((int64_t)b * T + row) * ldo + (int64_t)h * hd, o[i], 1.0f / L,
                          tx, vec, hd);
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
__host__ __device__ constexpr size_t dkv_smem() {
    return ((size_t)(2 * BC + 2 * BR) * (HD + 4) + (size_t)2 * BR * (BC + 4)) * sizeof(float);
}

template <int HD, int BR, int BC, bool ASYNC, bool PAD>
__global__ void __launch_bounds__(NT, HD >= 80 ? 2 : 3)
    attn_bwd_dkv_kernel(float *dk, float *dv, const float *__restrict__ dout,
                        const float *__restrict__ lse, const float *__restrict__ D,
                        const float *__restrict__ q, int ldq, const float *__restrict__ k,
                        int ldk, const float *__restrict__ v, int ldv, int T, int H, int group,
                        float scale, float scale_log2, bool causal, bool vec, int hd_arg) {
    constexpr int RS = BR / 16, CS = BC / 8, KS = BC / 16, CO = HD / 8, LD = HD + 4,
                  LDP = BC + 4;
    static_assert(HD % 16 == 0 && BC % 16 == 0 && BR % 16 == 0, "tile shape");
    RETURN_IF_UNREACHABLE(ASYNC, (dkv_smem<HD, BR, BC>()));
    const int hd = PAD ? hd_arg : HD;
    extern __shared__ float4 smem_f4[];
    float *Ks = reinterpret_cast<float *>(smem_f4);
    float *Vs = Ks + BC * LD, *Qs = Vs + BC * LD, *dOs = Qs + BR * LD, *Ps = dOs + BR * LD,
          *dSs = Ps + BR * LDP;

    /* causal: key tile 0 is seen by every query, the heaviest; it is launched first already */
    const int kt = blockIdx.x, hkv = blockIdx.y, b = blockIdx.z, k0 = kt * BC;
    const int lane = threadIdx.x & 31, tx = lane & 7, ty = (threadIdx.x >> 5) * 4 + (lane >> 3);
    const int r0 = ty * RS;   /* rows of the S / dP tile */
    const int key0 = ty * KS; /* keys of the dK / dV accumulators */
    const int ldo = H * hd;
    const float *kg = k + (int64_t)b * T * ldk + (int64_t)hkv * hd;
    const float *vg = v + (int64_t)b * T * ldv + (int64_t)hkv * hd;
    load_rows<HD, BC, ASYNC, PAD>(Ks, kg, ldk, k0, T, hd, vec);
    load_rows<HD, BC, ASYNC, PAD>(Vs, vg, ldv, k0, T, hd, vec);
    cp_async_commit<ASYNC>(); /* waited for with the first query tile */

    float dKa[KS][CO], dVa[KS][CO];
#pragma unroll
    for (int i = 0; i < KS; i++)
#pragma unroll
        for (int c = 0; c < CO; c++) dKa[i][c] = 0.0f, dVa[i][c] = 0.0f;

    const int nqt = (T + BR - 1) / BR;
    const int qt0 = causal ? k0 / BR : 0; /* earlier query tiles see none of these keys */
    for (int hh = 0; hh < group; hh++) {
        const int h = hkv * group + hh;
        const float *qg = q + (int64_t)b * T * ldq + (int64_t)h * hd;
        const float *og = dout + (int64_t)b * T * ldo + (int64_t)h * hd;
        const float *lse_h = lse + ((int64_t)b * H + h) * T, *D_h = D + ((int64_t)b * H + h) * T;
        for (int qt = qt0; qt < nqt; qt++) {
            const int q0 = qt * BR;
            load_rows<HD, BR, ASYNC, PAD>(Qs, qg, ldq, q0, T, hd, vec);
            load_rows<HD, BR, ASYNC, PAD>(dOs, og, ldo, q0, T, hd, vec);
            cp_async_commit<ASYNC>();
            cp_async_wait<0, ASYNC>();
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
            store_row<HD, PAD>(dk + r * ldk + (int64_t)hkv * hd, dKa[kk], scale, tx, vec, hd);
            store_row<HD, PAD>(dv + r * ldv + (int64_t)hkv * hd, dVa[kk], 1.0f, tx, vec, hd);
        }
    }
}

template <int HD, int BR, int BC>
__host__ __device__ constexpr size_t dq_smem() {
    return ((size_t)(2 * BR + 2 * BC) * (HD + 4) + (size_t)BR * (BC + 4)) * sizeof(float);
}

template <int HD, int BR, int BC, bool ASYNC, bool PAD>
__global__ void __launch_bounds__(NT, HD >= 96 ? 2 : 3)
    attn_bwd_dq_kernel(float *dq, const float *__restrict__ dout, const float *__restrict__ lse,
                       const float *__restrict__ D, const float *__restrict__ q, int ldq,
                       const float *__restrict__ k, int ldk, const float *__restrict__ v, int ldv,
                       int T, int H, int group, float scale, float scale_log2, bool causal,
                       bool vec, int hd_arg) {
    constexpr int RS = BR / 16, CS = BC / 8, CO = HD / 8, LD = HD + 4, LDP = BC + 4;
    static_assert(HD % 16 == 0 && BC % 16 == 0 && BR % 16 == 0, "tile shape");
    RETURN_IF_UNREACHABLE(ASYNC, (dq_smem<HD, BR, BC>()));
    const int hd = PAD ? hd_arg : HD;
    extern __shared__ float4 smem_f4[];
    float *Qs = reinterpret_cast<float *>(smem_f4);
    float *dOs = Qs + BR * LD, *Ks = dOs + BR * LD, *Vs = Ks + BC * LD, *dSs = Vs + BC * LD;

    const int qt = causal ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
    const int h = blockIdx.y, b = blockIdx.z, hkv = h / group, q0 = qt * BR;
    const int lane = threadIdx.x & 31, tx = lane & 7;
    const int r0 = ((threadIdx.x >> 5) * 4 + (lane >> 3)) * RS;
    const int ldo = H * hd;
    const float *qg = q + (int64_t)b * T * ldq + (int64_t)h * hd;
    const float *og = dout + (int64_t)b * T * ldo + (int64_t)h * hd;
    const float *kg = k + (int64_t)b * T * ldk + (int64_t)hkv * hd;
    const float *vg = v + (int64_t)b * T * ldv + (int64_t)hkv * hd;
    const float *lse_h = lse + ((int64_t)b * H + h) * T, *D_h = D + ((int64_t)b * H + h) * T;
    const int kv_end = causal ? min(q0 + BR, T) : T;
    const int nkt = (kv_end + BC - 1) / BC;

    /* K and V of one tile are both needed for S and dP; V is released after dP (the next V
     * loads during dS and dQ += dS K), K after dQ += dS K. */
    load_rows<HD, BR, ASYNC, PAD>(Qs, qg, ldq, q0, T, hd, vec);
    load_rows<HD, BR, ASYNC, PAD>(dOs, og, ldo, q0, T, hd, vec);
    load_rows<HD, BC, ASYNC, PAD>(Ks, kg, ldk, 0, T, hd, vec);
    load_rows<HD, BC, ASYNC, PAD>(Vs, vg, ldv, 0, T, hd, vec);
    cp_async_commit<ASYNC>();

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
        cp_async_wait<0, ASYNC>();
        __syncthreads();
        float s[RS][CS], dp[RS][CS];
        dot_tile<HD, RS, CS>(s, Qs, r0, Ks, tx);
        dot_tile<HD, RS, CS>(dp, dOs, r0, Vs, tx);
        __syncthreads(); /* every warp is done with Vs */
        if (kt + 1 < nkt) {
            load_rows<HD, BC, ASYNC, PAD>(Vs, vg, ldv, k0 + BC, T, hd, vec);
            cp_async_commit<ASYNC>();
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
            load_rows<HD, BC, ASYNC, PAD>(Ks, kg, ldk, k0 + BC, T, hd, vec);
            cp_async_commit<ASYNC>();
        }
    }

#pragma unroll
    for (int i = 0; i < RS; i++) {
        const int row = q0 + r0 + i;
        if (row < T)
            store_row<HD, PAD>(dq + ((int64_t)b * T + row) * ldq + (int64_t)h * hd, dQa[i], scale,
                          tx, vec, hd);
    }
}

/* ---- host side ---- */

/* Tile configurations per tile width: BR x BC for the forward (F), dK/dV (K) and dQ (Q)
 * kernels, "big" (B: the sm_80+ configurations, up to 94 KB of shared memory) and "small" (S:
 * within the 48 KB every GPU gives a block without opting in). Each kernel takes its big
 * configuration when the GPU's opt-in limit holds it, else its small one; see pick(). */
template <int HD> struct tiles;
#define TILES(hd, fbr, fbc, fsr, fsc, kbr, kbc, ksr, ksc, qbr, qbc, qsr, qsc)              \
    template <> struct tiles<hd> {                                                          \
        static constexpr int FBR = fbr, FBC = fbc, FSR = fsr, FSC = fsc;                    \
        static constexpr int KBR = kbr, KBC = kbc, KSR = ksr, KSC = ksc;                    \
        static constexpr int QBR = qbr, QBC = qbc, QSR = qsr, QSC = qsc;                    \
        static_assert(fwd_smem<hd, fsr, fsc>() <= SMEM_STATIC, "small forward > 48 KB");   \
        static_assert(dkv_smem<hd, ksr, ksc>() <= SMEM_STATIC, "small dK/dV > 48 KB");     \
        static_assert(dq_smem<hd, qsr, qsc>() <= SMEM_STATIC, "small dQ > 48 KB");         \
    };
/*   hd   forward: big, small   dK/dV: big, small   dQ: big, small */
TILES(16,  64, 64, 64, 64,      32, 64, 32, 64,     64, 64, 64, 64)
TILES(32,  64, 64, 64, 64,      32, 64, 32, 64,     64, 64, 64, 32)
TILES(64,  64, 64, 64, 32,      32, 64, 32, 32,     64, 32, 32, 32)
TILES(80,  64, 64, 32, 32,      32, 64, 16, 32,     64, 32, 32, 32)
TILES(96,  64, 64, 32, 32,      32, 64, 16, 32,     64, 32, 32, 16)
TILES(112, 64, 32, 32, 32,      32, 32, 16, 32,     32, 32, 16, 32)
TILES(128, 64, 32, 32, 16,      32, 32, 16, 16,     32, 32, 16, 16)
#undef TILES

/* What the GPU allows (cuda_state, set at init) and the shape of one call. */
struct att_ctx {
    cudaStream_t st;
    size_t smem;  /* shared memory a block may have (48 KB in portable mode) */
    bool async;   /* cp.async: sm_80+ and not portable */
};

struct att_shape {
    int B, T, H, Hkv, ldq, ldk, ldv, hd;
    bool causal, vec;
    float scale, scale_log2;
};

/* Which instantiation a kernel runs: the big tiles with cp.async (sm_80+: the tuned path), the
 * big tiles with plain loads (sm_70, and sm_75 where they fit its 64 KB), else the small tiles
 * with plain loads. Padded head dims on sm_70/75 take the small tiles (one instantiation
 * fewer per kernel; those GPUs are rare and padded head dims rarer). */
enum att_variant { BIG_ASYNC, BIG_SYNC, SMALL_SYNC };

att_variant pick(const att_ctx &c, size_t big_smem, bool pad) {
    if (big_smem > c.smem) return SMALL_SYNC;
    if (c.async) return BIG_ASYNC;
    return pad ? SMALL_SYNC : BIG_SYNC;
}

bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

void check_shape(const char *op, int B, int T, int H, int Hkv, int hd) {
    char why[256];
    if (!attn_head_dim_ok(hd, why, sizeof why)) {
        /* model validation refuses such models at plan time and at set-up: a bug to get here */
        fprintf(stderr, "internal error: cuda %s: %s\n", op, why);
        abort();
    }
    if (B < 1 || T < 1 || H < 1 || Hkv < 1 || H % Hkv != 0 || H > 65535 || B > 65535 ||
        Hkv > 65535) {
        fprintf(stderr, "internal error: cuda %s: bad shape B=%d T=%d H=%d Hkv=%d\n", op, B, T,
                H, Hkv);
        abort();
    }
}

/* Above 48 KB a kernel must opt in (sm_70+); at or below it the attribute is not needed, and
 * sm_60/61 cannot raise it at all. */
template <typename K>
void set_smem(K kernel, size_t bytes) {
    if (bytes <= SMEM_STATIC) return;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)bytes));
}

template <int HD, int BR, int BC, bool ASYNC, bool PAD>
void launch_fwd(const att_ctx &c, const att_shape &a, float *out, float *lse, const float *q,
                const float *k, const float *v) {
    constexpr size_t smem = fwd_smem<HD, BR, BC>();
    auto kernel = attn_fwd_kernel<HD, BR, BC, ASYNC, PAD>;
    set_smem(kernel, smem);
    dim3 grid((unsigned)((a.T + BR - 1) / BR), (unsigned)a.H, (unsigned)a.B);
    kernel<<<grid, NT, smem, c.st>>>(out, lse, q, a.ldq, k, a.ldk, v, a.ldv, a.T, a.H,
                                     a.H / a.Hkv, a.scale_log2, a.causal, a.vec, a.hd);
    CUDA_CHECK(cudaGetLastError());
}

template <int HD, bool PAD>
void fwd_hd(const att_ctx &c, const att_shape &a, float *out, float *lse, const float *q,
            const float *k, const float *v) {
    using t = tiles<HD>;
    switch (pick(c, fwd_smem<HD, t::FBR, t::FBC>(), PAD)) {
    case BIG_ASYNC: launch_fwd<HD, t::FBR, t::FBC, true, PAD>(c, a, out, lse, q, k, v); break;
    case BIG_SYNC: launch_fwd<HD, t::FBR, t::FBC, false, false>(c, a, out, lse, q, k, v); break;
    case SMALL_SYNC: launch_fwd<HD, t::FSR, t::FSC, false, PAD>(c, a, out, lse, q, k, v); break;
    }
}

/* The inputs of both backward kernels. */
struct bwd_args {
    float *dq, *dk, *dv;
    const float *dout, *lse, *D, *q, *k, *v;
};

template <int HD, int BR, int BC, bool ASYNC, bool PAD>
void launch_dkv(const att_ctx &c, const att_shape &a, const bwd_args &g) {
    constexpr size_t smem = dkv_smem<HD, BR, BC>();
    auto kernel = attn_bwd_dkv_kernel<HD, BR, BC, ASYNC, PAD>;
    set_smem(kernel, smem);
    dim3 grid((unsigned)((a.T + BC - 1) / BC), (unsigned)a.Hkv, (unsigned)a.B);
    kernel<<<grid, NT, smem, c.st>>>(g.dk, g.dv, g.dout, g.lse, g.D, g.q, a.ldq, g.k, a.ldk, g.v,
                                     a.ldv, a.T, a.H, a.H / a.Hkv, a.scale, a.scale_log2,
                                     a.causal, a.vec, a.hd);
    CUDA_CHECK(cudaGetLastError());
}

template <int HD, int BR, int BC, bool ASYNC, bool PAD>
void launch_dq(const att_ctx &c, const att_shape &a, const bwd_args &g) {
    constexpr size_t smem = dq_smem<HD, BR, BC>();
    auto kernel = attn_bwd_dq_kernel<HD, BR, BC, ASYNC, PAD>;
    set_smem(kernel, smem);
    dim3 grid((unsigned)((a.T + BR - 1) / BR), (unsigned)a.H, (unsigned)a.B);
    kernel<<<grid, NT, smem, c.st>>>(g.dq, g.dout, g.lse, g.D, g.q, a.ldq, g.k, a.ldk, g.v, a.ldv,
                                     a.T, a.H, a.H / a.Hkv, a.scale, a.scale_log2, a.causal,
                                     a.vec, a.hd);
    CUDA_CHECK(cudaGetLastError());
}

/* dK/dV and dQ pick their configurations independently (they only share D). */
template <int HD, bool PAD>
void bwd_hd(const att_ctx &c, const att_shape &a, const bwd_args &g) {
    using t = tiles<HD>;
    switch (pick(c, dkv_smem<HD, t::KBR, t::KBC>(), PAD)) {
    case BIG_ASYNC: launch_dkv<HD, t::KBR, t::KBC, true, PAD>(c, a, g); break;
    case BIG_SYNC: launch_dkv<HD, t::KBR, t::KBC, false, false>(c, a, g); break;
    case SMALL_SYNC: launch_dkv<HD, t::KSR, t::KSC, false, PAD>(c, a, g); break;
    }
    switch (pick(c, dq_smem<HD, t::QBR, t::QBC>(), PAD)) {
    case BIG_ASYNC: launch_dq<HD, t::QBR, t::QBC, true, PAD>(c, a, g); break;
    case BIG_SYNC: launch_dq<HD, t::QBR, t::QBC, false, false>(c, a, g); break;
    case SMALL_SYNC: launch_dq<HD, t::QSR, t::QSC, false, PAD>(c, a, g); break;
    }
}

att_ctx make_ctx(device *d) {
    const cuda_state *st = cuda_of(d);
    att_ctx c;
    c.st = cuda_stream(d, DEV_STREAM_COMPUTE);
    /* code compiled below compute_70 (a P100 build's PTX JITted on a newer GPU) has only the
     * 48 KB kernels (reachable()) */
    c.smem = st->portable || st->code_arch < 70 ? SMEM_STATIC : (size_t)st->smem_optin;
    /* the GPU has cp.async, and so does the code it runs (not compute_75 PTX JITted on it) */
    c.async = st->cc_major >= 8 && st->code_arch >= 80 && !st->portable;
    return c;
}

att_shape make_shape(int B, int T, int H, int Hkv, int hd, int ldq, int ldk, int ldv,
                     bool causal) {
    att_shape a;
    a.B = B, a.T = T, a.H = H, a.Hkv = Hkv, a.ldq = ldq, a.ldk = ldk, a.ldv = ldv, a.hd = hd;
    a.causal = causal;
    a.scale = 1.0f / sqrtf((float)hd); /* the real head dim, also when the tile is padded */
    a.scale_log2 = a.scale * LOG2E;
    /* 16-byte copies need every row start 16-byte aligned (and, padded, whole chunks) */
    a.vec = ldq % 4 == 0 && ldk % 4 == 0 && ldv % 4 == 0 && hd % 4 == 0;
    return a;
}

/* Calls fn<W, PAD>(args...) for W = hd's tile width (attn_limits.h); PAD when hd < W. */
#define ATT_DISPATCH(fn, hd, ...)                                                          \
    do {                                                                                   \
        const int w_ = attn_tile_width(hd);                                                \
        const bool pad_ = w_ != (hd);                                                      \
        switch (w_) {                                                                      \
        case 16: pad_ ? fn<16, true>(__VA_ARGS__) : fn<16, false>(__VA_ARGS__); break;     \
        case 32: pad_ ? fn<32, true>(__VA_ARGS__) : fn<32, false>(__VA_ARGS__); break;     \
        case 64: pad_ ? fn<64, true>(__VA_ARGS__) : fn<64, false>(__VA_ARGS__); break;     \
        case 80: pad_ ? fn<80, true>(__VA_ARGS__) : fn<80, false>(__VA_ARGS__); break;     \
        case 96: pad_ ? fn<96, true>(__VA_ARGS__) : fn<96, false>(__VA_ARGS__); break;     \
        case 112: pad_ ? fn<112, true>(__VA_ARGS__) : fn<112, false>(__VA_ARGS__); break;  \
        default: pad_ ? fn<128, true>(__VA_ARGS__) : fn<128, false>(__VA_ARGS__); break;   \
        }                                                                                  \
    } while (0)

} /* namespace */

extern "C" void cuda_attention_fwd(device *d, float *out, float *lse, const float *q, int ldq,
                                   const float *k, int ldk, const float *v, int ldv, int B, int T,
                                   int H, int Hkv, int hd, bool causal) {
    check_shape("attention_fwd", B, T, H, Hkv, hd);
    att_shape a = make_shape(B, T, H, Hkv, hd, ldq, ldk, ldv, causal);
    a.vec = a.vec && aligned16(q) && aligned16(k) && aligned16(v) && aligned16(out);
    if (cuda_attention_mma_ok(d, hd)) {
        cuda_attention_mma_fwd(d, out, lse, q, ldq, k, ldk, v, ldv, B, T, H, Hkv, hd, causal);
        return;
    }
    const att_ctx c = make_ctx(d);
    ATT_DISPATCH(fwd_hd, hd, c, a, out, lse, q, k, v);
}

extern "C" void cuda_attention_bwd(device *d, float *dq, float *dk, float *dv, const float *dout,
                                   const float *out, const float *lse, const float *q, int ldq,
                                   const float *k, int ldk, const float *v, int ldv, int B, int T,
                                   int H, int Hkv, int hd, bool causal) {
    check_shape("attention_bwd", B, T, H, Hkv, hd);
    att_shape a = make_shape(B, T, H, Hkv, hd, ldq, ldk, ldv, causal);
    a.vec = a.vec && aligned16(q) && aligned16(k) && aligned16(v) && aligned16(dout) &&
            aligned16(dq) && aligned16(dk) && aligned16(dv);
    const att_ctx c = make_ctx(d);

    /* D = rowsum(dout * out), [B, H, T] */
    const int64_t rows = (int64_t)B * T;
    float *D = (float *)cuda_scratch(d, (size_t)rows * H * sizeof(float));
    const int64_t warps = rows * H;
    attn_bwd_d_kernel<<<(unsigned)((warps + 7) / 8), 256, 0, c.st>>>(D, dout, out, rows, T, H,
                                                                      hd);
    CUDA_CHECK(cudaGetLastError());

    if (cuda_attention_mma_ok(d, hd)) {
        cuda_attention_mma_bwd(d, dq, dk, dv, dout, lse, D, q, ldq, k, ldk, v, ldv, B, T, H, Hkv,
                               hd, causal);
        return;
    }
    const bwd_args g = {dq, dk, dv, dout, lse, D, q, k, v};
    ATT_DISPATCH(bwd_hd, hd, c, a, g);
}

/* ---------------------------------------------------------------------------------------------
 * attention against a KV cache (generation; device.h attention_cached, docs/sample.md).
 *
 * One block per (new query row, head). The keys are taken in tiles of CACHED_THREADS, one key
 * per thread: its score, then the tile's max and sum of exponentials by block reductions, kept
 * as a running max and sum (online softmax, as in FlashAttention), while the output row acc[hd]
 * (shared memory) is rescaled and gains the tile's P V, each thread owning output columns. A
 * decode step is a matrix-vector product per head, bound by reading the cache once; this kernel
 * reads each K and V row once per query head. Fixed reduction order: bit-reproducible. */
namespace {

constexpr int CACHED_THREADS = 128;
constexpr int CACHED_WARPS = CACHED_THREADS / 32;

/* The max (or sum) of v over the block, returned to every thread. red[CACHED_WARPS] is shared
 * scratch; the leading barrier protects it from the previous call's readers. */
__device__ float block_reduce(float v, float *red, bool is_max) {
    for (int off = 16; off > 0; off /= 2) {
        float o = __shfl_xor_sync(0xffffffffu, v, off);
        v = is_max ? fmaxf(v, o) : v + o;
    }
    __syncthreads();
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
    __syncthreads();
    float r = red[0];
    for (int w = 1; w < CACHED_WARPS; w++) r = is_max ? fmaxf(r, red[w]) : r + red[w];
    return r;
}

/* dynamic shared memory: qs[hd] (the query row), acc[hd] (the unnormalised output), p[tile] */
__global__ void __launch_bounds__(CACHED_THREADS)
attention_cached_kernel(float *out, const float *q, int ldq, const float *kc, const float *vc,
                        int pos0, int H, int Hkv, int hd, float scale) {
    extern __shared__ float sm[];
    __shared__ float red[CACHED_WARPS];
    float *qs = sm, *acc = sm + hd, *p = acc + hd;
    const int i = blockIdx.x / H, h = blockIdx.x % H, g = h / (H / Hkv);
    const int nv = pos0 + i + 1; /* keys this row sees */
    const int64_t kvw = (int64_t)Hkv * hd;
    for (int c = threadIdx.x; c < hd; c += blockDim.x) {
        qs[c] = q[(int64_t)i * ldq + (int64_t)h * hd + c];
        acc[c] = 0.0f;
    }
    __syncthreads();
    float run_max = -INFINITY, run_sum = 0.0f; /* the same in every thread */
    for (int j0 = 0; j0 < nv; j0 += CACHED_THREADS) {
        const int j = j0 + threadIdx.x, tile = min(CACHED_THREADS, nv - j0);
        float s = -INFINITY;
        if (j < nv) {
            const float *kr = kc + j * kvw + (int64_t)g * hd;
            float dot = 0.0f;
            for (int c = 0; c < hd; c++) dot = fmaf(qs[c], kr[c], dot);
            s = dot * scale;
        }
        const float new_max = fmaxf(run_max, block_reduce(s, red, true));
        const float e = j < nv ? expf(s - new_max) : 0.0f;
        p[threadIdx.x] = e;
        const float corr = expf(run_max - new_max); /* 0 on the first tile (run_max = -inf) */
        run_sum = run_sum * corr + block_reduce(e, red, false); /* its barriers publish p */
        run_max = new_max;
        for (int c = threadIdx.x; c < hd; c += blockDim.x) {
            float a = acc[c] * corr;
            const float *vcol = vc + (int64_t)j0 * kvw + (int64_t)g * hd + c;
            for (int t = 0; t < tile; t++) a = fmaf(p[t], vcol[t * kvw], a);
            acc[c] = a;
        }
        __syncthreads(); /* p is rewritten by the next tile */
    }
    float *o = out + (int64_t)i * H * hd + (int64_t)h * hd;
    for (int c = threadIdx.x; c < hd; c += blockDim.x) o[c] = acc[c] / run_sum;
}

} /* namespace */

extern "C" void cuda_attention_cached(device *d, float *out, const float *q, int ldq,
                                      const float *kc, const float *vc, int n, int pos0, int H,
                                      int Hkv, int hd) {
    check_shape("attention_cached", 1, pos0 + n, H, Hkv, hd);
    if (n <= 0) return;
    size_t smem = (size_t)(2 * hd + CACHED_THREADS) * sizeof(float);
    attention_cached_kernel<<<(unsigned)((int64_t)n * H), CACHED_THREADS, smem,
                              cuda_stream(d, DEV_STREAM_COMPUTE)>>>(
        out, q, ldq, kc, vc, pos0, H, Hkv, hd, 1.0f / sqrtf((float)hd));
    CUDA_CHECK(cudaGetLastError());
}
