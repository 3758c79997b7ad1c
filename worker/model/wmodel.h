/* wmodel.h - the worker's view of a model: the named tensors inside each unit's flat parameter
 * buffer, their initialisation, and the forward/backward of each unit kind on a device.
 *
 * The layout (docs/worker-model.md) is the contract with checkpoints, the Hugging Face export
 * and the PyTorch oracle in tests/ref: unit u's buffer holds its tensors back to back in the
 * order wm_unit_tensors() lists them, linear weights stored [out, in] like torch.nn.Linear. The
 * sum of a unit's tensor sizes equals the planner's model_unit_params() exactly. */
#ifndef CEPHALO_WMODEL_H
#define CEPHALO_WMODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "common/recompute.h"
#include "devices/device.h"
#include "planner/model.h"

#define WM_MAX_TENSORS 16

typedef enum { INIT_NORMAL, INIT_ONES, INIT_ZEROS } wm_init_kind;

typedef struct wm_tensor {
    char name[48]; /* within the unit: "attn.qkv.weight" */
    int64_t offset, numel; /* in elements, within the unit's flat buffer */
    int ndim;
    int64_t shape[2];
    wm_init_kind init;
    float std; /* INIT_NORMAL */
    bool decay; /* AdamW weight decay applies (matrices; not norms, biases, tokens) */
} wm_tensor;

/* Lists unit u's tensors; returns their count. */
int wm_unit_tensors(const model_spec *m, int unit, wm_tensor *out);

/* The unit's flat-buffer elements [lo, hi) initialised as a pure function of (seed, unit, element
 * index), so any sharding of the buffer produces the same values. */
void wm_init_range(const model_spec *m, int unit, uint64_t seed, int64_t lo, int64_t hi,
                   float *out);

/* Loss scale and sequence conventions of an architecture. */
bool wm_is_causal(const model_spec *m);
float wm_norm_eps(const model_spec *m);

/* ---- per-microbatch inputs ---- */
typedef struct wm_batch {
    int m; /* samples in this microbatch */
    int T; /* tokens per sample (ViT: patches + 1) */
    const int32_t *ids; /* device [m*T] token ids (GPT, Llama, BERT) */
    const int32_t *targets; /* device [m*T] (-1 = none); ViT: [m] class labels */
    const float *images; /* device [m, C, S, S] (ViT) */
    const float *row_scale; /* host [m]: the loss weight of each sample's rows (1/(B*targets)) */
} wm_batch;

/* ---- activation workspace: the intermediates a unit's backward reads (saved sets) and the
 * backward's scratch (planner/engine_mem.h) ---- */
typedef struct wm_acts wm_acts;

/* Allocates the workspace for microbatches of up to m samples (the largest any unit needs).
 * recompute full: one saved set, which every unit's forward overwrites (the backward recomputes
 * the unit first); none: a saved set per (unit, kept microbatch), kept > 0 microbatches. prec:
 * the run's precision; with 16-bit activations (engine_acts16) the units round their GEMM and
 * attention operands and those operands' gradients to its 16-bit format, and recompute none
 * keeps them in 2 bytes. */
wm_acts *wm_acts_new(device *d, const model_spec *m, int max_m, int seq, recompute_mode recompute,
                     int kept, precision prec, err_t *err);
void wm_acts_free(device *d, wm_acts *a);
/* Selects the saved set the next forward of `unit` writes and its backward reads: the j-th kept
 * microbatch's (0 <= j < kept with none; any j with full, which has one set). The head's step
 * has its own set. */
void wm_acts_select(wm_acts *a, const model_spec *m, int unit, int j);

/* The unit's forward: x [m*T, d] -> y [m*T, d] (embedding: from b's ids/images). Intermediates
 * stay in the workspace for wm_unit_backward. `tied` is the embedding unit's parameters, which
 * tied heads (GPT, BERT) use. Not for the head: see wm_head_step. */
void wm_unit_forward(device *d, const model_spec *m, int unit, const float *params,
                     const wm_batch *b, const float *x, float *y, wm_acts *a);
/* Back-propagates dy through the unit whose forward ran last on this workspace: parameter
 * gradients += into dparams, input gradient written (overwritten) to dx (NULL for the
 * embedding). */
void wm_unit_backward(device *d, const model_spec *m, int unit, const float *params,
                      float *dparams, const wm_batch *b, const float *x, const float *dy,
                      float *dx, wm_acts *a);

/* The head, forward and backward fused: x [m*T, d] -> loss; dx written; head gradients += into
 * dparams and, for tied heads, into dtied. Adds the microbatch's scaled loss (sum over rows of
 * row_scale * row loss, in double) to *loss_sum, one double of device memory that the caller
 * reads when it needs the value (once per step): the head never makes the host wait. If
 * logits_out is not NULL the logits ([m*T, V], ViT [m, classes]) are copied there before the
 * loss overwrites them (tests; a host wait per chunk). */
void wm_head_step(device *d, const model_spec *m, const float *params, float *dparams,
                  const float *tied, float *dtied, const wm_batch *b, const float *x, float *dx,
                  wm_acts *a, double *loss_sum, float *logits_out);

#endif
