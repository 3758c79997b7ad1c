/* cuda_adamw.cu - the CUDA device's optimizer: AdamW, one tensor or a unit's segments in one
 * launch (with the 16-bit copy of the updated parameters written in the same pass). */
#include <string.h>

#include "devices/cuda_internal.h"

extern "C" {
#include "common/log.h"
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

void cuda_adamw(device *d, float *p, const float *g, float *m, float *v, int64_t n, const dev_adamw *a) {
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

void cuda_adamw_multi(device *d, float *p, const float *g, float *m, float *v, uint16_t *half,
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
