/* optime.c - the per-op-class timing table (optime.h). */
#include "devices/optime.h"

#include <stdlib.h>

static const char *const names[OT_COUNT] = {
    [OT_GEMM] = "gemm",
    [OT_GEMM_ROUND] = "gemm: 16-bit operand rounding",
    [OT_ATTN_FWD] = "attention fwd",
    [OT_ATTN_BWD] = "attention bwd",
    [OT_ATTN_CACHED] = "attention cached",
    [OT_NORM] = "norms",
    [OT_ACT] = "gelu / swiglu",
    [OT_BIAS] = "bias / bias grad",
    [OT_ROPE] = "rope",
    [OT_EMBED] = "embed / patchify",
    [OT_XENT] = "cross-entropy",
    [OT_ADAMW] = "adamw",
    [OT_ELEMWISE] = "fill / add / axpy / scale / copy2d",
    [OT_SUMSQ] = "sumsq",
    [OT_ROUND] = "to/from bf16, fp16",
    [OT_COPY] = "copy",
    [OT_COPY_H2D] = "offload h2d (own stream)",
    [OT_COPY_D2H] = "offload d2h (own stream)",
    [OT_COPY_OTHER] = "copy_async (compute stream)",
};

const char *optime_name(optime_class c) { return c >= 0 && c < OT_COUNT ? names[c] : "?"; }

int optime_parent(optime_class c) { return c == OT_GEMM_ROUND ? OT_GEMM : -1; }

bool optime_side_stream(optime_class c) { return c == OT_COPY_H2D || c == OT_COPY_D2H; }

void optime_add(optime_acc *a, optime_class c, double ms) {
    if (c < 0 || c >= OT_COUNT) return;
    a->calls[c]++;
    a->ms[c] += ms;
}

double optime_gpu_ms(const optime_acc *a) {
    double t = 0;
    for (int c = 0; c < OT_COUNT; c++)
        if (optime_parent((optime_class)c) < 0 && !optime_side_stream((optime_class)c)) t += a->ms[c];
    return t;
}

static const optime_acc *sort_acc; /* qsort has no context argument */

/* Top-level compute classes by time (descending, then by class), side streams after them. */
static int by_time(const void *pa, const void *pb) {
    int x = *(const int *)pa, y = *(const int *)pb;
    bool sx = optime_side_stream((optime_class)x), sy = optime_side_stream((optime_class)y);
    if (sx != sy) return sx ? 1 : -1;
    double tx = sort_acc->ms[x], ty = sort_acc->ms[y];
    if (tx != ty) return tx > ty ? -1 : 1;
    return x - y;
}

static void row(const optime_acc *a, int c, double gpu, bool nested, FILE *f) {
    char pct[16];
    if (optime_side_stream((optime_class)c) || gpu <= 0)
        snprintf(pct, sizeof pct, "%s", "-");
    else
        snprintf(pct, sizeof pct, "%.1f", 100.0 * a->ms[c] / gpu);
    fprintf(f, "  %s%-*s %9lld %11.2f %7s %11.1f\n", nested ? "  " : "", nested ? 34 : 36,
            names[c], (long long)a->calls[c], a->ms[c], pct,
            1000.0 * a->ms[c] / (double)a->calls[c]);
}

void optime_print(const optime_acc *a, const char *title, FILE *f) {
    const double gpu = optime_gpu_ms(a);
    fprintf(f, "CEPHALO_CUDA_OPTIME %s: GPU time %.2f ms (compute stream, events per op)\n", title,
            gpu);
    fprintf(f, "  %-36s %9s %11s %7s %11s\n", "op class", "calls", "total ms", "% GPU",
            "mean us");
    int order[OT_COUNT], n = 0;
    for (int c = 0; c < OT_COUNT; c++)
        if (a->calls[c] > 0 && optime_parent((optime_class)c) < 0) order[n++] = c;
    sort_acc = a;
    qsort(order, (size_t)n, sizeof order[0], by_time);
    if (n == 0) fprintf(f, "  (no ops timed)\n");
    for (int i = 0; i < n; i++) {
        row(a, order[i], gpu, false, f);
        for (int c = 0; c < OT_COUNT; c++)
            if (optime_parent((optime_class)c) == order[i] && a->calls[c] > 0) row(a, c, gpu, true, f);
    }
}
