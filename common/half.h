/* half.h - fp32 <-> bfloat16 and IEEE binary16 (fp16) bit patterns, one definition for every part
 * that converts: the CPU device's to_bf16/to_fp16 ops, the Hugging Face import (widening) and the
 * export (rounding). Rounding is to nearest even, as __float2bfloat16_rn, __float2half_rn and
 * PyTorch's .to() do; widening is exact (every bf16 and fp16 value is a float). */
#ifndef CEPHALO_HALF_H
#define CEPHALO_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t half_f2u(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static inline float half_u2f(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* bf16: the upper half of an fp32, rounded to nearest even; NaN stays a quiet NaN. */
static inline uint16_t half_bf16_round(float x) {
    uint32_t u = half_f2u(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float half_bf16_widen(uint16_t h) { return half_u2f((uint32_t)h << 16); }

/* fp16 from the fp32 bits: subnormal halves for |x| < 2^-14, +-inf from 65520 up (the first value
 * that rounds past 65504), NaN stays a quiet NaN with its sign. */
static inline uint16_t half_fp16_round(float x) {
    uint32_t u = half_f2u(x), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | (a >> 13 & 0x1ffu)); /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 (or inf): inf */
    if (a >= 0x38800000u) { /* normal half: rebias the exponent, round 13 bits away */
        uint32_t h = (a - 0x38000000u) >> 13, rest = a & 0x1fffu;
        h += rest > 0x1000u || (rest == 0x1000u && (h & 1u));
        return (uint16_t)(sign | h);
    }
    if (a < 0x33000000u) return (uint16_t)sign; /* below half the smallest subnormal: +-0 */
    /* subnormal half: the significand (with its implicit 1) shifted to units of 2^-24 */
    uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, shift = 126 - e; /* 14..24 */
    uint32_t h = m >> shift, rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
    h += rest > half || (rest == half && (h & 1u));
    return (uint16_t)(sign | h);
}

static inline float half_fp16_widen(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = h >> 10 & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1fu) return half_u2f(sign | 0x7f800000u | m << 13); /* inf, NaN */
    if (e) return half_u2f(sign | (e + 112u) << 23 | m << 13);
    return sign ? -(float)m * 0x1p-24f : (float)m * 0x1p-24f; /* zero, subnormal: exact */
}

/* x rounded to bf16 (fp16) and widened back: the value a 16-bit tensor holds, in fp32 (exact). */
static inline float half_bf16_value(float x) { return half_bf16_widen(half_bf16_round(x)); }
static inline float half_fp16_value(float x) { return half_fp16_widen(half_fp16_round(x)); }

#endif
