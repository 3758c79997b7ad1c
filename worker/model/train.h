/* train.h - one rank's training loop: layered gradient accumulation over the units of the model
 * (docs/architecture.md), checkpoints at unit boundaries offloaded to host memory, AdamW with global-norm
 * clipping and a warmup + cosine schedule.
 *
 *   trainer *t = trainer_new(&cfg, &err);       // model, device, data, optimizer state
 *   trainer_resume(t, path, &err);              // optional (state/ckpt.h)
 *   while (t->step < cfg.steps) trainer_step(t, &stats, &err);
 *   trainer_free(t); */
#ifndef CEPHALO_TRAIN_H
#define CEPHALO_TRAIN_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "comm/comm.h"
#include "common/precision.h"
#include "common/recompute.h"
#include "common/schedule.h"
#include "devices/device.h"
#include "formats/data.h"
#include "model/wmodel.h"
#include "planner/engine_mem.h"
#include "planner/model.h"

/* How the optimizer runs ($CEPHALO_ADAMW, docs/gpu.md); every mode gives the same bits:
 *   tensor  one adamw launch per tensor of each unit's shard (the default)
 *   unit    one adamw_multi launch per unit (the multi-tensor update)
 *   half    unit, and a bf16/fp16 run keeps a 16-bit copy of each shard that the update writes
 *           in the same pass; gathers send that copy (one rank: it is widened directly) instead
 *           of rounding the fp32 shard before every gather. It costs 2 bytes per shard parameter
 *           of device memory, which the planner counts when it sees the same variable
 *           (engine_state_bytes_per_param; an experiment to measure). */
/* In the order of the variable's values in common/env.c (env_choice gives the index). */
typedef enum { ADAMW_TENSOR = 0, ADAMW_UNIT = 1, ADAMW_HALF = 2 } adamw_mode;

typedef struct train_config {
    model_spec model;
    int seq; /* resolved sequence length (ViT: ignored) */
    int global_batch; /* B: the loss is the mean over B samples */
    int batch, micro, micros; /* this rank: b = m * l */
    int max_micros; /* the most microbatches of any rank (per-microbatch accumulation) */
    int64_t sample_offset; /* this rank's first position in the global batch */
    int rank, world;
    /* sharding (the plan's shard_sizes): [n_units][world] element counts, rank i's slice of a
     * unit starting at the prefix sum; NULL = the whole state on this rank (world 1). Owned by
     * whoever fills the config (plan_read: free with train_config_release). */
    int64_t *shard_sizes;
    bool replicated; /* every rank holds the whole state; gradients are all-reduced */
    comm *comm; /* the job's communicator; NULL when world is 1 */
    /* optimizer and schedule (docs/worker-model.md) */
    int64_t steps;
    /* --epochs: > 0 sets steps to ceil(epochs x samples per epoch / global_batch) once the data
     * is open (trainer_new); the data must have a size (not synthetic) */
    long epochs;
    double lr, min_lr, beta1, beta2, eps, weight_decay, clip;
    int64_t warmup;
    lr_schedule schedule; /* after the warmup: cosine (default), linear or constant */
    uint64_t seed;
    const char *init_from; /* a Hugging Face model directory to start from (import.h); NULL: the
                            * seeded initialisation */
    bool allow_unused; /* --allow-unused-weights: tensors of --init-from's files or of a checkpoint
                        * that the model does not read are left out with a warning, not refused
                        * (model/weights.h) */
    /* device */
    const char *device; /* "cpu" (default) or "cuda" */
    int gpu;            /* cuda: the GPU's index among the visible ones */
    int threads;
    int64_t memory_bytes; /* device capacity; 0 = unlimited (cpu) / the GPU's free memory (cuda) */
    precision prec;     /* fp32, or bf16/fp16 mixed precision: 16-bit matmul operands,
                         * parameters gathered in 16 bits; fp32 master shards, moments and
                         * gradients (fp16: with dynamic loss scaling) */
    /* fp16 dynamic loss scaling (PyTorch GradScaler's rule): the loss is multiplied by the scale
     * before the backward; a non-finite gradient on any rank skips the step on every rank and
     * halves the scale; loss_scale_window clean steps in a row double it */
    double loss_scale;         /* the initial scale, a power of two (65536) */
    int64_t loss_scale_window; /* 2000 */
    int64_t inject_nonfinite_step; /* tests: rank inject_nonfinite_rank's gradient is made inf */
    int inject_nonfinite_rank;     /* at this step (-1: never) */
    bool no_offload;    /* keep the unit-boundary checkpoints in device memory */
    bool sync_micro;    /* wait for each microbatch's compute before queueing the next */
    recompute_mode recompute; /* full: the backward recomputes each unit's forward from its
                               * checkpoint; none: the forward keeps every unit's intermediates
                               * of the pass's microbatches (common/recompute.h) */
    bool per_micro;     /* accumulate per microbatch (gather and reduce every microbatch) instead
                         * of layered (every unit once per step) */
    adamw_mode adamw;   /* $CEPHALO_ADAMW */
    /* the plan's inputs.engine (plan_read), which the train command checks against this
     * worker's environment (engine_switches_check) */
    bool have_plan_engine;
    engine_switches plan_engine;
    bool stage_host;    /* force host staging of collectives (tests; automatic for cuda with the
                         * socket backend) */
    /* data: a shard file/dir/list, an image file, or "synthetic" */
    const char *data;
} train_config;

typedef struct step_stats {
    int64_t step; /* the step just taken (0-based) */
    double loss, lr, grad_norm;
    double step_ms, tokens_per_s, samples_per_s;
    double loss_scale; /* the scale the step's gradient was computed at (1 unless fp16) */
    bool skipped;      /* fp16: a gradient was not finite; the parameters were left as they were */
    /* the targets of the whole global batch whose loss counts (all-reduced: the same on every
     * rank), and whether there were none: loss-masked data whose mask is 0 on every target of
     * the batch. Such a step has no loss (NAN) and no update: no optimizer step, no weight decay,
     * no AdamW step counted, the fp16 loss scale left alone; the step itself (the data order, the
     * learning-rate schedule) advances, so the next step reads the next batch. */
    double targets;
    bool empty;
    int64_t peak_bytes;
    /* collectives this step (engine counters) and the bytes this rank sent */
    int64_t gathers, reduce_scatters, allreduces, bytes_sent;
    double comm_wait_ms; /* time the step waited for collectives (exposed communication) */
    double offload_ms; /* host wall time in the offload copy calls (ring fetch/store, pool
                        * barrier): the copies themselves on the CPU device, their queueing on
                        * CUDA (the copies overlap compute there) */
    int64_t host_syncs; /* times the host waited for the device (device.h host_syncs): 2 for a
                         * single-rank step (the sums' download, the end of the step) */
    bool has_val;    /* the validation loss was computed after this step (eval.h) */
    double val_loss; /* mean per target over the fixed validation samples */
} step_stats;

/* One kind of unit-boundary buffer (input x, output y, their gradients dy and dx): one buffer on
 * the CPU, two on CUDA so that a microbatch's copy to or from the host overlaps the next
 * microbatch's compute (paper appendix B). Events order the copy streams against compute. */
typedef struct act_ring {
    float *buf[2];
    dev_event *filled[2];   /* the copy into buf[k] has finished */
    dev_event *computed[2]; /* compute has finished with buf[k] (read or written) */
    dev_event *stored[2];   /* the copy out of buf[k] has finished */
} act_ring;

typedef struct trainer {
    train_config cfg;
    device dev;
    data_source *data;
    int n_units, tokens; /* tokens per sample */
    int64_t *numel; /* per unit: the whole unit */
    /* this rank's slice of each unit: [shard_off, shard_off + shard_n) */
    int64_t *shard_off, *shard_n;
    bool sharded; /* world > 1 and not replicated: parameters are gathered before use */
    float **params, **grads, **adam_m, **adam_v; /* device, per unit: this rank's slice */
    /* sharded: gathered parameters of the unit computing and the next one arriving, and the full
     * gradients of the unit back-propagating and the previous one being reduce-scattered */
    float *pslot[2], *gslot[2];
    uint16_t *pbf[2]; /* bf16/fp16: the gathered (or, with one rank, rounded) 16-bit parameters */
    /* adamw half with bf16/fp16 (else NULL): per unit, this rank's shard rounded to 16 bits,
     * written by the optimizer's pass; p16_fresh is false until it is first made from the
     * parameters (after the initialisation or a resume wrote them) */
    uint16_t **p16;
    bool p16_fresh;
    int pslot_unit[2], gslot_unit[2];
    bool gathered;   /* parameters pass through the slots (sharded, or 16-bit) */
    bool staged;     /* collectives run on host copies (cuda device with the socket backend) */
    void *hp[2], *hg[2]; /* staged: host copies of the parameter and gradient slots */
    dev_event *hp_read[2]; /* staged: the copy out of hp[s] into the device has finished */
    err_t staged_err; /* staged replicated plans: an all-reduce's failure, reported at the end */
    comm_req *pslot_req[2], *gslot_req[2];
    comm_req **allreduce_req; /* replicated: per unit, the gradient all-reduce in flight */
    int64_t n_gathers, n_reduce_scatters, n_allreduces; /* running engine counters */
    double wait_ms;
    double offload_ms; /* this step's time in the offload copy calls (step_stats.offload_ms) */
    bool comm_failed; /* a step failed in a collective (a peer died or stalled) */
    /* Stopping together: a rank asked to stop (SIGTERM: a pod deleted) sets *stop_request; the
     * step's loss all-reduce carries it, so every rank sees stop_agreed after the same step and
     * they can checkpoint that step together. */
    const volatile sig_atomic_t *stop_request; /* NULL: never */
    bool stop_agreed;
    wm_acts *acts;
    int nbuf; /* buffers per act_ring: 1 (cpu) or 2 (cuda) */
    act_ring ax, ay, ady, adx; /* device [m*T, d] each */
    dev_event *pool_mark; /* orders a unit's reads of the pool after the last unit's writes */
    int32_t *ids_dev, *tgt_dev;
    float *img_dev;
    /* device [ENGINE_STEP_SUMS]: the loss and the squared gradient norm, summed on the device and
     * read by one copy per step (the head and the norm never make the host wait) */
    double *sums;
    /* host: this step's samples and the offloaded unit-boundary checkpoints */
    int32_t *ids_host, *tgt_host; /* [l][m*T] (ViT targets: [l][m]) */
    float *img_host; /* [l][m*C*S*S] */
    float *row_scale; /* [l][m]: each sample's loss weight, 1/(B * its targets) */
    int64_t rank_targets; /* this step's targets on this rank's rows (load_samples) */
    float **boundary; /* [n_units - 1][l] host, each [m*T*d]; boundary[u][j] = input of unit u+1 */
    float **grad_pool; /* [l] host [m*T*d]: the gradient flowing back, per microbatch */
    int64_t host_bytes; /* the offload pool (device bytes when cfg.no_offload) */
    int64_t step; /* the next step to run */
    /* the optimizer's own progress: AdamW's bias correction counts the updates taken, not the
     * steps skipped for a non-finite fp16 gradient (as PyTorch's optimizer.step() skipped by
     * GradScaler does); checkpoints carry all four (metadata "cephalo.optimizer") */
    int64_t adam_steps;
    int64_t updates_run;   /* updates applied by this process: 0 while the weights are those it started from */
    double loss_scale;     /* the current scale; 1 unless fp16 */
    int64_t clean_steps;   /* steps since the scale last changed */
    int64_t skipped_steps; /* of the whole run */
    int64_t samples_seen;
    /* the tokenizer the checkpoint resumed from records (state/ckpt.c; TOKID_UNKNOWN: none or not
     * resumed): carried for the command's tokenizer checks, never used here (no text in a step) */
    tok_id resumed_tok;
    /* tests: when set, step 0's logits go here (host, [B*T*V] or [B*classes]) */
    float *logits_out;
} trainer;

/* Applies defaults (docs/cli.md) to a zeroed config. */
void train_config_defaults(train_config *c);
void train_config_release(train_config *c);
/* Learning rate of a 0-based step (warmup, then the schedule to min_lr: schedule.h). */
double train_lr(const train_config *c, int64_t step);

trainer *trainer_new(const train_config *cfg, err_t *err);
void trainer_free(trainer *t);
int trainer_step(trainer *t, step_stats *st, err_t *err);
/* Forward only, for evaluation (eval.c), between steps: the first n microbatches of the samples
 * the caller put in the host arrays (ids_host/tgt_host or img_host, row_scale), through every unit
 * as a step's forward does (gathers included: collective, every rank with its own n, maybe 0).
 * *loss += the row_scale-weighted sum of the target losses. The fused head's gradients go to
 * buffers the next step zeroes, so training continues bit for bit as without the call. */
int trainer_forward_loss(trainer *t, int n, double *loss, err_t *err);

/* The weights as a whole, for the diagnosis of a loss that is not finite (collective: every rank
 * calls it): how many values are not finite, and the largest magnitude of the finite ones. */
typedef struct weight_stats {
    int64_t nonfinite;
    double max_abs;
} weight_stats;
int trainer_weight_stats(trainer *t, weight_stats *out, err_t *err);

/* Host copies of this rank's slice of unit u's parameters / gradients (shard_n[u] floats; the
 * whole unit with one rank). */
void trainer_get_params(trainer *t, int unit, float *out);
void trainer_get_grads(trainer *t, int unit, float *out);

#endif
