/* optime.h - per-op-class GPU time of a run (CEPHALO_CUDA_OPTIME=1, docs/cuda.md): the
 * accumulation and the table, in plain C so that the unit tests check them without a GPU.
 *
 * The CUDA device (cuda_device.cu) brackets every op of its table with a pair of CUDA events on
 * the op's stream, resolves the elapsed times lazily (when its pool of pairs runs low, at sync,
 * at close) and adds them here; at close it prints optime_print's table to stderr. Classes on the
 * compute stream make up "GPU time" (the % column); a nested class (the rounding of 16-bit gemm
 * operands, inside gemm) is part of its parent's time and shown indented under it; the offload
 * copies run on their own streams, overlapping compute, and get no %. */
#ifndef CEPHALO_OPTIME_H
#define CEPHALO_OPTIME_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef enum {
    OT_GEMM,        /* gemm (cuBLAS, with the 16-bit rounding below) */
    OT_GEMM_ROUND,  /* nested in OT_GEMM: rounding gemm operands to 16 bits */
    OT_ATTN_FWD,    /* attention_fwd */
    OT_ATTN_BWD,    /* attention_bwd (D, dK/dV, dQ) */
    OT_ATTN_CACHED, /* attention_cached (generation) */
    OT_NORM,        /* layernorm / rmsnorm, forward and backward */
    OT_ACT,         /* gelu / swiglu, forward and backward */
    OT_BIAS,        /* add_bias, bias_grad */
    OT_ROPE,        /* rope, rope_at */
    OT_EMBED,       /* embed_fwd, embed_bwd, patchify */
    OT_XENT,        /* xent_fwd_bwd */
    OT_ADAMW,       /* adamw, adamw_multi */
    OT_ELEMWISE,    /* fill, add, axpy, scale, copy2d */
    OT_SUMSQ,       /* sumsq (with its read-back) */
    OT_ROUND,       /* to/from bf16 and fp16 (parameter gathers) */
    OT_COPY,        /* copy (in compute order) */
    OT_COPY_H2D,    /* copy_async on the h2d stream (offload prefetch) */
    OT_COPY_D2H,    /* copy_async on the d2h stream (offload) */
    OT_COPY_OTHER,  /* copy_async on the compute stream */
    OT_COUNT
} optime_class;

typedef struct optime_acc {
    int64_t calls[OT_COUNT];
    double ms[OT_COUNT];
} optime_acc;

/* "gemm", "attention fwd", ... */
const char *optime_name(optime_class c);
/* The class a nested class's time is part of, or -1. */
int optime_parent(optime_class c);
/* Whether c runs beside the compute stream (its time is not part of the GPU time). */
bool optime_side_stream(optime_class c);
void optime_add(optime_acc *a, optime_class c, double ms);
/* The GPU time: the compute stream's classes that are not nested. */
double optime_gpu_ms(const optime_acc *a);
/* The table, classes by total time (descending; nested ones right under their parent, side
 * streams last), one line each: name, calls, total ms, % of GPU time, mean us; classes never
 * called are left out. title heads it ("rank 0, GPU 0"). */
void optime_print(const optime_acc *a, const char *title, FILE *f);

#endif
