/* engine_mem.h - the device memory the trainer allocates (worker/model/train.c, worker/model/wmodel.c),
 * written once here so that the planner predicts what the engine really uses, to the byte, and
 * the engine sizes its buffers from the same formulas (docs/cost-model.md, "Compute memory").
 *
 * A rank's device memory = training state (16 bytes per parameter of its shards) + compute
 * memory, and compute memory is linear in the microbatch size m, for a given number k of
 * microbatches whose intermediates are kept at once (recompute none; k plays no part with full),
 * but for the head's logits, which stop growing at ENGINE_HEAD_LOGITS_BYTES:
 *   engine_compute_bytes(m) - engine_head_bytes(m) = a + b * m exactly. */
#ifndef CEPHALO_ENGINE_MEM_H
#define CEPHALO_ENGINE_MEM_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "common/precision.h"
#include "common/recompute.h"
#include "planner/model.h"

/* The fused head materialises the logits of a whole microbatch at once, unless they would take
 * more than this (fp32); then it runs chunks of as many rows as fit (docs/cost-model.md). */
#define ENGINE_HEAD_LOGITS_BYTES ((int64_t)256 << 20)
/* The step's sums on the device, read once per step: the loss and the squared gradient norm. */
#define ENGINE_STEP_SUMS 2
/* The doubles the step all-reduces over the ranks (the planner prices them): the loss, the squared
 * gradient norm, the stop flag, the non-finite flag and the count of targets that count. */
#define ENGINE_STEP_ALLREDUCED 5

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

/* The forward intermediates of the workspace that a unit's backward reads (the rest of the
 * workspace is backward scratch and the head's logits, shared by every unit and microbatch). */
typedef enum engine_saved {
    ES_LN1, ES_MEAN1, ES_RSTD1, ES_QKV, ES_ATT, ES_LSE, ES_X2, ES_LN2, ES_MEAN2, ES_RSTD2,
    ES_FC, ES_ACT, ES_UP, ES_PATCHES, ES_COUNT
} engine_saved;
/* Floats of one saved buffer of kind s. */
int64_t engine_saved_floats(const engine_workspace *w, engine_saved s);
/* Bit s set: the forward of a unit of kind k writes buffer s and its backward reads it. */
unsigned engine_saved_mask(const model_spec *m, unit_kind k);

/* The sets of saved buffers the workspace holds. full: one, with every buffer any unit uses
 * (each unit's forward runs again right before its backward). none: set 0 for the head (its
 * forward and backward are fused), then one per (unit before the head, kept microbatch), each
 * with its unit kind's buffers. kept: microbatches whose intermediates are kept at once (the
 * step's l; 1 with per-microbatch accumulation). */
int engine_saved_sets(const model_spec *m, recompute_mode r, int kept);
unsigned engine_saved_set_mask(const model_spec *m, recompute_mode r, int kept, int set);
/* The set of unit u's forward for the j-th kept microbatch (0 <= j < kept). */
int engine_saved_set_of(const model_spec *m, recompute_mode r, int kept, int unit, int j);

/* 16-bit activations (issue 28, item 4; docs/cuda.md): in a bf16/fp16 run with $CEPHALO_ACTS=16
 * (read once, by the planner and the worker alike) every buffer that holds an operand of a GEMM
 * or of attention, and those operands' gradients, holds values rounded to the run's 16-bit format
 * when they are produced, as PyTorch autocast's bf16/fp16 tensors; the residual stream and its
 * gradient, the norms' statistics, the attention log-sum-exp and everything of the optimizer stay
 * fp32. With recompute none the kept sets store those buffers in 2 bytes a value; the unit at
 * work computes in one fp32 copy of them. With full nothing is kept, so only the values change. */
bool engine_acts16(precision prec);
/* Tests: 1 as if $CEPHALO_ACTS were 16, 0 as if 32, -1 from the environment again. */
void engine_set_acts16(int on);
/* Fails, naming the variable and its values, when $CEPHALO_ADAMW, $CEPHALO_ACTS or
 * $CEPHALO_VOCAB_PAD has a value common/env.c's table does not accept: the planner (cost_build)
 * and the worker refuse it alike (their entries check it first: env_entry). */
int engine_env_check(err_t *err);
/* The 16-bit buffers the kept sets of a run store in 2 bytes, which the unit at work computes in
 * an fp32 copy of: 0 unless recompute none with 16-bit activations. */
unsigned engine_acts16_work_mask(const model_spec *m, recompute_mode r, precision prec);
/* Bytes of buffer s in saved set `set` (sets after 0 store the work mask's buffers in 2 bytes). */
int64_t engine_saved_bytes(const model_spec *m, const engine_workspace *w, recompute_mode r,
                           precision prec, int set, engine_saved s);
/* Bytes of the whole workspace: scratch plus every saved set (and the fp32 working copy of
 * 16-bit kept sets). */
int64_t engine_workspace_bytes(const model_spec *m, int max_m, int seq, recompute_mode r, int kept,
                               precision prec);
/* Width of the fused q|k|v projection and of the MLP buffers. */
int engine_qkv_width(const model_spec *m);
int engine_wide(const model_spec *m);
/* Vocabulary padding (issue 28, item 3; docs/cost-model.md): the head's logits rows are
 * ENGINE_VOCAB_ALIGN-aligned, a row stride of V rounded up, so that the GPU's GEMMs and the
 * cross-entropy see aligned rows; the GEMMs still compute V columns (the table is the embedding's
 * parameters and keeps V rows: checkpoints, exports and sampling never see the padding) and the
 * cross-entropy reads V values a row, so the results are those of the unpadded head. On with
 * $CEPHALO_VOCAB_PAD=1 (read once, by the planner and the worker alike, so the memory model
 * counts what the worker allocates), for heads without a bias (GPT, Llama). */
#define ENGINE_VOCAB_ALIGN 64
/* The logits' row stride: V, or V padded when vocabulary padding is on and the head has no bias
 * (BERT's decoder bias and ViT's classes keep V). */
int engine_vocab_ld(const model_spec *m);
/* Tests: 1 on, 0 off, -1 from $CEPHALO_VOCAB_PAD again. */
void engine_set_vocab_pad(int on);
/* Device bytes of training state per parameter of a rank's shards: STATE_BYTES_PER_PARAM (fp32
 * parameter, gradient and two AdamW moments), plus the 16-bit copy of the shard that
 * $CEPHALO_ADAMW=half keeps in a bf16/fp16 run (worker/model/train.h; read once, by the planner
 * and the worker alike, so the memory model counts what the worker allocates). */
int engine_state_bytes_per_param(precision prec);
/* Tests: 1 as if $CEPHALO_ADAMW were half, 0 any other mode, -1 from the environment again. */
void engine_set_adamw_half(int on);
/* What the switches that the planner and the workers both read ($CEPHALO_ADAMW, $CEPHALO_ACTS,
 * $CEPHALO_VOCAB_PAD) make of a run's memory. A plan records them (inputs.engine) and a worker
 * refuses a plan made under other values (worker/state/plan_read.c), since the plan's predicted
 * peak counts them. */
typedef struct engine_switches {
    int state_bytes_per_param; /* engine_state_bytes_per_param: 16, or 18 with ADAMW=half */
    int activation_bits;       /* 16 with engine_acts16, else 32 */
    int logits_row_stride;     /* engine_vocab_ld: V, or V padded */
} engine_switches;
engine_switches engine_switches_of(const model_spec *m, precision prec);
/* 0 when a and b agree; else fills err with what differs, naming the variable to set ("the plan"
 * is a, "this worker" b) and returns -1. */
int engine_switches_check(const engine_switches *plan, const engine_switches *here, err_t *err);

/* Rows of logits the head materialises at once for microbatches of `micro` samples of T
 * tokens: all micro*T rows, or, when their logits would exceed ENGINE_HEAD_LOGITS_BYTES, as
 * many as fit, rounded down to a multiple of 64 (at least one row). */
int64_t engine_head_chunk_rows(const model_spec *m, int micro, int T);
/* Tests: replaces the cap ENGINE_HEAD_LOGITS_BYTES for this process (planner and engine alike),
 * so that a small model runs the chunked head; 0 restores it. */
void engine_set_head_logits_bytes(int64_t bytes);
/* Bytes of the head's logits and row losses for microbatch `micro`: the part of the workspace
 * that is not linear in micro (the planner adds it to its linear compute memory, cost.c). */
int64_t engine_head_bytes(const model_spec *m, int seq, int micro);
/* The largest unit's parameter count: the size of a gathered-parameter or full-gradient slot. */
int64_t engine_max_unit_params(const model_spec *m);
/* What changes the engine's buffers besides the model and the microbatch. */
typedef struct engine_opts {
    bool sharded;       /* state sharded over several ranks: parameter and gradient slots */
    precision prec;     /* bf16 or fp16 mixed precision: parameters pass through fp32 slots and
                         * 16-bit gather buffers, also with one rank */
    bool double_buffer; /* the cuda device: two of each unit-boundary buffer, so that copies to
                         * and from the host overlap compute */
    recompute_mode recompute; /* full (zero) or none: every unit's intermediates kept */
    int kept;                 /* none: microbatches kept at once (l, or 1 per microbatch); 0 = 1 */
} engine_opts;

/* Device bytes of everything but the training state for microbatch m: the workspace (with
 * recompute none, o.kept microbatches' intermediates of every unit), a unit's
 * input and output and their gradients (twice with double_buffer), the token ids and targets
 * (and images), the step's sums (ENGINE_STEP_SUMS doubles); when the state is sharded, two
 * gathered-parameter slots (the unit computing and the next one arriving) and two full-gradient
 * slots (the unit back-propagating and the previous one being reduce-scattered); with bf16 or
 * fp16, two parameter slots and two 16-bit gather buffers. */
int64_t engine_compute_bytes(const model_spec *m, int seq, int micro, engine_opts o);

#endif
