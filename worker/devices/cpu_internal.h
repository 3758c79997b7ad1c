/* cpu_internal.h - shared pieces of the CPU device (cpu_device.c, cpu_attention.c).
 *
 * The helpers here are written so that their results are fixed by the source, not by what the
 * compiler vectorises: reductions use 8 explicit lanes combined in a fixed order (never a
 * compiler-chosen reassociation, which could change with alignment peeling), so every kernel that
 * uses them is bit-reproducible for the same inputs and thread count. */
#ifndef CEPHALO_CPU_INTERNAL_H
#define CEPHALO_CPU_INTERNAL_H

#include <stdint.h>
#include <string.h>

#include "common/half.h"
#include "devices/device.h"

/* Lanes of the fixed-order reductions: two SSE vectors or one AVX vector. */
#define CPU_LANES 8

/* Elementwise loops shorter than this run on one thread: forking costs more than it saves. */
#define CPU_PAR_MIN 32768

/* Elementwise work is split in chunks of this many elements, each handled by one call of a
 * CPU_HOT span function. */
#define CPU_CHUNK 16384

/* The build targets baseline x86-64 (SSE2). The loops that are compute-bound on our own code
 * (exp in softmax, cross-entropy, GELU, SwiGLU) also get an AVX2 clone, picked at load time
 * when the CPU has AVX2 (about twice as fast). Both clones give the same bits: every operation
 * is an elementwise IEEE operation in source order (no FMA contraction under -std=c17) and the
 * reductions use fixed lanes, so vector width does not change results. OpenMP outlines the
 * bodies of parallel loops into functions that would not be cloned, so CPU_HOT goes on
 * functions called from inside the loops. -DCPU_NO_CLONES builds the baseline code only. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(CPU_NO_CLONES)
#define CPU_HOT __attribute__((target_clones("avx2", "default")))
#else
#define CPU_HOT
#endif

/* Combines the lanes in a fixed pairwise order. */
static inline float lanes_total(const float acc[CPU_LANES]) {
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* sum(x[0..n)) */
static inline float vsum(const float *restrict x, int64_t n) {
    float acc[CPU_LANES] = {0};
    int64_t i = 0;
    for (; i + CPU_LANES <= n; i += CPU_LANES)
        for (int l = 0; l < CPU_LANES; l++) acc[l] += x[i + l];
    for (int l = 0; i < n; i++, l++) acc[l] += x[i];
    return lanes_total(acc);
}

/* sum(a[i] * b[i]) */
static inline float vdot(const float *restrict a, const float *restrict b, int64_t n) {
    float acc[CPU_LANES] = {0};
    int64_t i = 0;
    for (; i + CPU_LANES <= n; i += CPU_LANES)
        for (int l = 0; l < CPU_LANES; l++) acc[l] += a[i + l] * b[i + l];
    for (int l = 0; i < n; i++, l++) acc[l] += a[i] * b[i];
    return lanes_total(acc);
}

/* max(x[0..n)), n >= 1. A NaN anywhere makes the result NaN (so a diverged row stays visible). */
static inline float vmax(const float *restrict x, int64_t n) {
    float acc[CPU_LANES];
    for (int l = 0; l < CPU_LANES; l++) acc[l] = x[0];
    float nan_seen = 0.0f; /* stays 0 unless some x is NaN (comparisons alone would drop it) */
    int64_t i = 0;
    for (; i + CPU_LANES <= n; i += CPU_LANES)
        for (int l = 0; l < CPU_LANES; l++) {
            float v = x[i + l];
            acc[l] = v > acc[l] ? v : acc[l];
            nan_seen += v != v ? v : 0.0f;
        }
    for (int l = 0; i < n; i++, l++) {
        float v = x[i];
        acc[l] = v > acc[l] ? v : acc[l];
        nan_seen += v != v ? v : 0.0f;
    }
    float m = acc[0];
    for (int l = 1; l < CPU_LANES; l++) m = acc[l] > m ? acc[l] : m;
    return m + nan_seen;
}

/* c ? a : b as a bit blend. A plain ?: on floats defeats vectorisation here: GCC's PRE pass
 * specialises the code after it for the constant arm and leaves the arithmetic conditional,
 * which may not be if-converted while FP operations count as trapping (-ftrapping-math). */
static inline float fsel(int c, float a, float b) {
    uint32_t m = 0u - (uint32_t)c;
    return half_u2f((half_f2u(a) & m) | (half_f2u(b) & ~m));
}

/* exp(x) without a libm call, so loops around it vectorise: Cody-Waite reduction by ln 2 and
 * Cephes' degree-6 polynomial for expf (relative error within ~2 ulp of the true exp over
 * [-87, 88]). Returns 0 below -87.33 (where expf goes subnormal; -inf included), saturates at
 * e^88.37 above (2^n must stay a normal number), and propagates NaN. Softmax, sigmoid and GELU
 * use it. */
static inline float exp_fast(float x) {
    float xc = fsel(x > -87.33f, x, -87.33f); /* NaN lands on -87.33; restored at the end */
    xc = fsel(xc < 88.37f, xc, 88.37f);
    /* n = round(x / ln 2): adding 1.5 * 2^23 rounds to an integer and leaves n in the low
     * mantissa bits of nm, so neither a rounding call nor a float->int conversion is needed */
    float nm = xc * 1.44269504088896341f + 12582912.0f;
    float n = nm - 12582912.0f;
    float r = xc - n * 0.693359375f; /* ln 2 split in two so that r is exact */
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = p * r * r + r + 1.0f;
    float pow2n = half_u2f((half_f2u(nm) - 0x4B400000u + 127u) << 23); /* 2^n, n in [-126, 127] */
    float e = fsel(x > -87.33f, y * pow2n, 0.0f);
    return fsel(x != x, x, e);
}

/* The attention kernels (cpu_attention.c); the op table's signatures. */
void cpu_attention_fwd(device *d, float *out, float *lse, const float *q, int ldq, const float *k,
                       int ldk, const float *v, int ldv, int B, int T, int H, int Hkv, int hd,
                       bool causal);
void cpu_attention_bwd(device *d, float *dq, float *dk, float *dv, const float *dout,
                       const float *out, const float *lse, const float *q, int ldq,
                       const float *k, int ldk, const float *v, int ldv, int B, int T, int H,
                       int Hkv, int hd, bool causal);

/* Attention of new query rows against a KV cache (cpu_attention.c; device.h attention_cached). */
void cpu_attention_cached(device *d, float *out, const float *q, int ldq, const float *kc,
                          const float *vc, int n, int pos0, int H, int Hkv, int hd);

#endif
