/* engine_mem.h - the device memory the trainer allocates (worker/model/train.c, worker/model/wmodel.c),
 * written once here so that the planner predicts what the engine really uses, to the byte, and
 * the engine sizes its buffers from the same formulas (docs/cost-model.md, "Compute memory").
 *
 * A rank's device memory = training state (16 bytes per parameter of its shards) + compute
 * memory, and compute memory is exactly linear in the microbatch size m:
 *   engine_compute_bytes(m) = engine_compute_bytes(0) + m * (engine_compute_bytes(1) - ...(0)). */
#ifndef CEPHALO_ENGINE_MEM_H
#define CEPHALO_ENGINE_MEM_H

#include <stdbool.h>
#include <stdint.h>

#include "common/precision.h"
#include "planner/model.h"

#define ENGINE_HEAD_CHUNK_ROWS 256 /* logits rows the fused head materialises at once */

/* Float counts of the activation workspace's buffer kinds for microbatches up to max_m. */
typedef struct engine_workspace {
    int64_t nd;      /* [N, d] activations, N = m*T rows */
    int64_t nq;      /* [N, q|k|v width] */
    int64_t nf;      /* [N, max(d_ff, d)] */
    int64_t nstat;   /* [N] norm statistics */
    int64_t nlse;    /* [m, heads, T] attention log-sum-exp */
    int64_t nlogits; /* one chunk of logits rows (ViT: [m, classes]) */
    int64_t nloss;   /* row losses of one chunk */
    int64_t npatch;  /* ViT: [m, patches, patch dim] */
    int64_t nrows;   /* ViT: [m, d] class-token rows */
} engine_workspace;

engine_workspace engine_workspace_floats(const model_spec *m, int max_m, int seq);
/* Bytes of the whole workspace (every buffer kind with its multiplicity). */
int64_t engine_workspace_bytes(const model_spec *m, int max_m, int seq);
/* Width of the fused q|k|v projection and of the MLP buffers. */
int engine_qkv_width(const model_spec *m);
int engine_wide(const model_spec *m);
/* Rows of logits the head materialises at once for T tokens per sample. */
int64_t engine_head_chunk_rows(int T);
/* The largest unit's parameter count: the size of a gathered-parameter or full-gradient slot. */
int64_t engine_max_unit_params(const model_spec *m);
/* What changes the engine's buffers besides the model and the microbatch. */
typedef struct engine_opts {
    bool sharded;       /* state sharded over several ranks: parameter and gradient slots */
    precision prec;     /* bf16 or fp16 mixed precision: parameters pass through fp32 slots and
                         * 16-bit gather buffers, also with one rank */
    bool double_buffer; /* the cuda device: two of each unit-boundary buffer, so that copies to
                         * and from the host overlap compute */
} engine_opts;

/* Device bytes of everything but the training state for microbatch m: the workspace, a unit's
 * input and output and their gradients (twice with double_buffer), the token ids and targets
 * (and images); when the state is sharded, two gathered-parameter slots (the unit computing and
 * the next one arriving) and two full-gradient slots (the unit back-propagating and the previous
 * one being reduce-scattered); with bf16 or fp16, two parameter slots and two 16-bit gather buffers. */
int64_t engine_compute_bytes(const model_spec *m, int seq, int micro, engine_opts o);

#endif
