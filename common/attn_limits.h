/* attn_limits.h - which attention head dimensions the workers support, one rule for the
 * planner (model validation: a model is refused at plan time) and the CUDA device (set-up).
 *
 * The CUDA kernels (worker/devices/cuda_attention.cu) are compiled for tile widths 16, 32, 64, 80, 96,
 * 112 and 128. Any other head dim up to 128 runs in the next wider tile with the extra columns
 * zero in shared memory (no copies, no extra device memory; the padded columns add exact zeros
 * to every dot product, so the result is that of the real head dim). Above 128 the per-thread
 * accumulators of the flash kernels would no longer fit the register file at their tile sizes,
 * so such models are refused. The CPU device has no limit of its own, but a plan must run on
 * either device, so the rule is the same for both. Header-only: C and CUDA C++ include it. */
#ifndef CEPHALO_ATTN_LIMITS_H
#define CEPHALO_ATTN_LIMITS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#define ATTN_MAX_HEAD_DIM 128

/* The tile width a head dim runs in: the smallest of the widths the CUDA attention kernels are
 * instantiated for (16, 32, 64, 80, 96, 112, 128) that holds it; 0 if unsupported. */
static inline int attn_tile_width(int hd) {
    static const int widths[] = {16, 32, 64, 80, 96, 112, 128};
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++)
        if (hd >= 1 && hd <= widths[i]) return widths[i];
    return 0;
}

/* true when attention with head dim hd is supported; otherwise false with the reason in why
 * (n bytes; why may be NULL). */
static inline bool attn_head_dim_ok(int hd, char *why, size_t n) {
    if (hd >= 1 && hd <= ATTN_MAX_HEAD_DIM) return true;
    if (why && n)
        snprintf(why, n,
                 "head size %d is not supported: attention supports head sizes 1..%d "
                 "(16, 32, 64, 80, 96, 112 and 128 natively, others padded to the next of these)",
                 hd, ATTN_MAX_HEAD_DIM);
    return false;
}

#endif
