/* train.c - one rank's training step with layered gradient accumulation (docs/architecture.md).
 *
 * Forward: for each unit, all l microbatches run before the next unit starts; each microbatch's
 * unit output is offloaded to the host pool (it is the next unit's input checkpoint). The head's
 * forward and backward are fused (its logits are never kept). Backward: units in reverse; for each
 * microbatch the unit's input comes back from the host, the unit is recomputed (recompute full;
 * with none its forward's intermediates were kept on the device) and back-propagated, and its
 * input gradient goes back to the host. Parameter gradients accumulate over the l
 * microbatches, so one batch of m*l and l microbatches of m give the same update. */
#include <math.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/hostinfo.h"
#include "common/log.h"
#include "common/strutil.h"
#include "common/worker_cmd.h"
#include "model/fsdp.h"
#include "model/import.h"
#include "model/train.h"
#include "planner/arch.h"
#include "planner/engine_mem.h"

#define OP(d, name, ...) ((d)->ops->name((d), __VA_ARGS__))

/* The options' defaults are the one table of common/worker_cmd.c (`cephalo run` and the operator
 * spell them out from it too). */
void train_config_defaults(train_config *c) {
    wcmd_train w;
    wcmd_train_defaults(&w);
    c->world = 1;
    c->steps = w.steps;
    c->lr = w.lr;
    c->min_lr = w.min_lr; /* lr / 10 unless set */
    c->schedule = w.schedule;
    c->beta1 = w.beta1;
    c->beta2 = w.beta2;
    c->eps = w.eps;
    c->weight_decay = w.weight_decay;
    c->clip = w.clip;
    c->loss_scale = wcmd_default_num(WCMD_LOSS_SCALE);
    c->loss_scale_window = wcmd_default_long(WCMD_LOSS_SCALE_WINDOW);
    c->inject_nonfinite_step = -1;
    c->warmup = w.warmup;
    c->seed = w.seed;
    c->data = w.data;
    c->recompute = w.recompute;
    c->prec = w.prec;
}

void train_config_release(train_config *c) {
    free(c->shard_sizes);
    c->shard_sizes = NULL;
}

double train_lr(const train_config *c, int64_t step) {
    return schedule_lr(c->schedule, c->lr, schedule_min_lr(c->lr, c->min_lr), c->warmup, c->steps, step);
}

/* ---- set-up ---- */

/* --epochs: the steps that read every sample of the training data epochs times, the last step
 * filled from the next epoch's order (the sample order of data.h wraps). */
static int epoch_steps(trainer *t, err_t *err) {
    train_config *c = &t->cfg;
    int64_t steps = data_epoch_steps(t->data, c->epochs, c->global_batch);
    if (!steps) return err_set(err, "--epochs needs data of a known size (not synthetic): give --steps");
    c->steps = steps;
    char what[64]; /* "the steps of --epochs N": at most 43 */
    snprintf(what, sizeof what, "the steps of --epochs %ld", c->epochs);
    return wcmd_check_warmup((long)c->warmup, (long)c->steps, "--warmup", what, err);
}

static int open_data(trainer *t, err_t *err) {
    const train_config *c = &t->cfg;
    const model_spec *m = &c->model;
    bool synthetic = !strcmp(c->data, "synthetic");
    if (arch_of(m->arch)->images)
        return synthetic ? data_open_synthetic_images(&t->data, m->channels, m->image,
                                                      m->n_classes, c->seed, err)
                         : data_open_images(&t->data, c->data, m->channels, m->image,
                                            m->n_classes, c->seed, err);
    data_task task = data_task_of(arch_of(m->arch)->task);
    return synthetic ? data_open_synthetic_tokens(&t->data, c->seq, m->vocab, task, c->seed, err)
                     : data_open_tokens(&t->data, c->data, DATA_TRAIN, c->seq, m->vocab, task, c->seed, err);
}

/* Allocates on the device or fails with the allocator's message. */
#define DEV_ALLOC(ptr, n, what)                                                   \
    do {                                                                          \
        if (!((ptr) = dev_alloc(&t->dev, (size_t)(n), what))) {                   \
            *err = t->dev.err;                                                    \
            return -1;                                                            \
        }                                                                         \
    } while (0)

/* This rank's slice of every unit's parameters, from the Hugging Face model --init-from names or
 * from the seeded initialisation, and zero moments. Either way the values depend only on the
 * element's index in its unit, so any sharding gives the same model; an import reads only this
 * rank's slices from the mapped files, one unit at a time, so no rank holds more than its shard
 * plus one unit slice on the host. */
static int init_params(trainer *t, err_t *err) {
    hf_import *imp = NULL;
    if (t->cfg.init_from && hf_import_open(&imp, t->cfg.init_from, &t->cfg.model, t->cfg.allow_unused, err) < 0)
        return err_prefix(err, "--init-from");
    int rc = 0;
    for (int u = 0; u < t->n_units && rc == 0; u++) {
        int64_t n = t->shard_n[u], off = t->shard_off[u];
        if (!n) continue;
        float *host = xmalloc((size_t)n * sizeof(float));
        if (!imp) wm_init_range(&t->cfg.model, u, t->cfg.seed, off, off + n, host);
        else if ((rc = hf_import_range(imp, u, off, off + n, host, err)) < 0) err_prefix(err, "--init-from");
        if (rc == 0) dev_upload(&t->dev, t->params[u], host, (size_t)n * sizeof(float));
        free(host);
        dev_zero(&t->dev, t->adam_m[u], n);
        dev_zero(&t->dev, t->adam_v[u], n);
    }
    hf_import_close(imp);
    return rc;
}

/* This rank's slice of every unit: parameters, their gradient and the AdamW moments. A rank may
 * hold nothing of a unit (a zero shard): its pointers stay NULL. */
static int alloc_state(trainer *t, err_t *err) {
    float ***sets[] = {&t->params, &t->grads, &t->adam_m, &t->adam_v};
    const char *what[] = {"parameters", "gradients", "AdamW first moments", "AdamW second moments"};
    for (int s = 0; s < 4; s++) *sets[s] = xcalloc((size_t)t->n_units, sizeof(float *));
    for (int u = 0; u < t->n_units; u++) {
        int64_t n = t->shard_n[u];
        dev_set_context(&t->dev, "set-up of unit %d (a shard of %lld of its %lld parameters)", u,
                        (long long)n, (long long)t->numel[u]);
        for (int s = 0; s < 4 && n; s++) DEV_ALLOC((*sets[s])[u], n * 4, what[s]);
    }
    if (t->cfg.adamw == ADAMW_HALF && precision_half(t->cfg.prec)) {
        t->p16 = xcalloc((size_t)t->n_units, sizeof(uint16_t *));
        for (int u = 0; u < t->n_units; u++)
            if (t->shard_n[u]) DEV_ALLOC(t->p16[u], t->shard_n[u] * 2, "16-bit copy of the parameter shard");
    }
    t->p16_fresh = false;
    return init_params(t, err);
}

/* Bytes of one microbatch's activations at a unit boundary [m*T, d]. */
static size_t act_bytes(const trainer *t) {
    return (size_t)t->cfg.micro * t->tokens * t->cfg.model.d_model * sizeof(float);
}

/* The pool the unit-boundary checkpoints and the flowing gradients are offloaded to: host
 * memory the device copies to asynchronously (page-locked on CUDA), or device memory with
 * no_offload. It grows with the batch, so running out of host memory here is a bad job, not a
 * crash. */
static int alloc_pool(trainer *t, err_t *err) {
    int nb = t->n_units - 1, l = t->cfg.micros;
    size_t bytes = act_bytes(t);
    t->boundary = xcalloc((size_t)(nb * l), sizeof(float *));
    t->grad_pool = xcalloc((size_t)l, sizeof(float *));
    t->host_bytes = (int64_t)(nb + 1) * l * (int64_t)bytes;
    if (t->cfg.no_offload) {
        dev_set_context(&t->dev, "set-up of the checkpoint pool (offload off)");
        for (int i = 0; i < nb * l; i++) DEV_ALLOC(t->boundary[i], bytes, "unit-boundary checkpoint");
        for (int j = 0; j < l; j++) DEV_ALLOC(t->grad_pool[j], bytes, "flowing gradient");
        return 0;
    }
    /* malloc overcommits: a pool beyond physical memory, or a container's memory limit, would
     * "succeed" and be OOM-killed mid-step, so compare with what this process may use first. */
    int64_t mem = host_memory_bytes();
    bool ok = mem <= 0 || (double)t->host_bytes <= 0.9 * (double)mem;
    device *d = &t->dev;
    for (int i = 0; i < nb * l && ok; i++) ok = (t->boundary[i] = d->ops->host_alloc(d, bytes)) != NULL;
    for (int j = 0; j < l && ok; j++) ok = (t->grad_pool[j] = d->ops->host_alloc(d, bytes)) != NULL;
    if (ok) return 0;
    char need[32];
    return err_set(err, "rank %d: cannot allocate the %s host offload pool (%d unit inputs and "
                   "1 gradient x %d microbatches of %zu bytes) in this machine's memory (or its container's limit); lower the batch",
                   t->cfg.rank, str_bytes((double)t->host_bytes, need, sizeof need), nb, l, bytes);
}

static void free_pool_entry(trainer *t, float *p) {
    if (t->cfg.no_offload) dev_free(&t->dev, p);
    else t->dev.ops->host_free(&t->dev, p);
}

static void free_pool(trainer *t) {
    int nb = (t->n_units - 1) * t->cfg.micros;
    for (int i = 0; t->boundary && i < nb; i++) free_pool_entry(t, t->boundary[i]);
    for (int j = 0; t->grad_pool && j < t->cfg.micros; j++) free_pool_entry(t, t->grad_pool[j]);
    free(t->boundary), free(t->grad_pool);
}

static int alloc_ring(trainer *t, act_ring *r, int64_t floats, const char *what, err_t *err) {
    device *d = &t->dev;
    for (int k = 0; k < t->nbuf; k++) {
        DEV_ALLOC(r->buf[k], floats * 4, what);
        r->filled[k] = d->ops->event_new(d);
        r->computed[k] = d->ops->event_new(d);
        r->stored[k] = d->ops->event_new(d);
    }
    return 0;
}

static void free_ring(trainer *t, act_ring *r) {
    device *d = &t->dev;
    for (int k = 0; k < 2; k++) {
        dev_free(d, r->buf[k]);
        dev_event *ev[3] = {r->filled[k], r->computed[k], r->stored[k]};
        for (int e = 0; e < 3; e++)
            if (ev[e]) d->ops->event_free(d, ev[e]);
    }
}

/* Host arrays the device copies from asynchronously (this step's samples); NULL when the
 * system is out of (page-locked) memory. */
static void *host_array(trainer *t, int64_t n, size_t size) {
    void *p = t->dev.ops->host_alloc(&t->dev, (size_t)n * size);
    return p ? memset(p, 0, (size_t)n * size) : NULL;
}

static int alloc_buffers(trainer *t, err_t *err) {
    const model_spec *m = &t->cfg.model;
    int mb = t->cfg.micro, l = t->cfg.micros, T = t->tokens;
    int64_t rows = (int64_t)mb * T, act = rows * m->d_model;
    dev_set_context(&t->dev, "set-up of the activation buffers");
    /* recompute none keeps every unit's intermediates of the microbatches of one pass */
    int kept = t->cfg.per_micro ? 1 : l;
    if (!(t->acts = wm_acts_new(&t->dev, m, mb, t->cfg.seq, t->cfg.recompute, kept, t->cfg.prec, err))) return -1;
    if (alloc_ring(t, &t->ax, act, "unit input", err) < 0 ||
        alloc_ring(t, &t->ay, act, "unit output", err) < 0 ||
        alloc_ring(t, &t->ady, act, "output gradient", err) < 0 ||
        alloc_ring(t, &t->adx, act, "input gradient", err) < 0)
        return -1;
    t->pool_mark = t->dev.ops->event_new(&t->dev);
    DEV_ALLOC(t->ids_dev, rows * 4, "token ids");
    DEV_ALLOC(t->tgt_dev, rows * 4, "targets");
    int64_t img = arch_of(m->arch)->images ? (int64_t)m->channels * m->image * m->image : 0;
    if (img) DEV_ALLOC(t->img_dev, mb * img * 4, "images");
    DEV_ALLOC(t->sums, ENGINE_STEP_SUMS * sizeof(double), "the step's loss and gradient norm");
    t->ids_host = host_array(t, l * rows, sizeof(int32_t));
    t->tgt_host = host_array(t, l * rows, sizeof(int32_t));
    t->img_host = img ? host_array(t, l * mb * img, sizeof(float)) : NULL;
    if (!t->ids_host || !t->tgt_host || (img && !t->img_host))
        return err_set(err, "rank %d: cannot allocate the host copies of a step's samples "
                       "(%lld token rows)", t->cfg.rank, (long long)(l * rows));
    t->row_scale = xcalloc((size_t)(l * mb), sizeof(float));
    return alloc_pool(t, err);
}

static int open_device(trainer *t, err_t *err) {
    const train_config *c = &t->cfg;
    const char *kind = c->device ? c->device : "cpu";
    if (device_open(&t->dev, kind, c->rank, c->threads, c->gpu, c->memory_bytes, err) < 0)
        return -1;
    bool cuda = !strcmp(kind, "cuda");
    t->nbuf = cuda ? 2 : 1;
    t->dev.matmul = dev_matmul_for(c->prec, cuda);
    if (!c->comm) return 0;
    if (comm_device_buffers(c->comm) && !cuda)
        return err_set(err, "rank %d: the nccl backend needs the cuda device (CPU devices use "
                       "CEPHALO_COMM_BACKEND=socket)", c->rank);
    if (comm_device_buffers(c->comm))
        return comm_set_device_stream(c->comm, t->dev.ops->native_stream(&t->dev, DEV_STREAM_COMPUTE),
                                      c->gpu, err);
    t->staged = cuda || c->stage_host;
    return 0;
}

trainer *trainer_new(const train_config *cfg, err_t *err) {
    if (cfg->batch != cfg->micro * cfg->micros || cfg->micro < 1) {
        err_set(err, "batch %d is not microbatch %d x %d microbatches", cfg->batch, cfg->micro,
                cfg->micros);
        return NULL;
    }
    trainer *t = xcalloc(1, sizeof *t);
    t->cfg = *cfg;
    t->loss_scale = cfg->prec == PREC_FP16 ? cfg->loss_scale : 1;
    t->n_units = model_n_units(&cfg->model);
    t->tokens = model_tokens(&cfg->model, cfg->seq);
    if (cfg->per_micro && cfg->replicated && cfg->world > 1) {
        err_set(err, "per-microbatch accumulation needs a sharded plan (a replicated plan "
                "all-reduces each unit's gradient once per step)");
        free(t);
        return NULL;
    }
    if (open_device(t, err) < 0) {
        if (t->dev.ops) device_close(&t->dev);
        free(t);
        return NULL;
    }
    t->numel = xcalloc((size_t)t->n_units, sizeof(int64_t));
    for (int u = 0; u < t->n_units; u++) t->numel[u] = model_unit_params(&cfg->model, u);
    if (cfg->shard_sizes) { /* the caller's array: keep a copy */
        size_t bytes = (size_t)t->n_units * (size_t)cfg->world * sizeof(int64_t);
        t->cfg.shard_sizes = memcpy(xmalloc(bytes), cfg->shard_sizes, bytes);
    }
    fsdp_setup(t);
    if (open_data(t, err) < 0 || (t->cfg.epochs > 0 && epoch_steps(t, err) < 0) || alloc_state(t, err) < 0 ||
        fsdp_alloc_slots(t, err) < 0 || alloc_buffers(t, err) < 0) {
        trainer_free(t);
        return NULL;
    }
    return t;
}

void trainer_free(trainer *t) {
    if (!t) return;
    if (t->dev.ops) t->dev.ops->sync(&t->dev); /* copies in flight read the buffers freed below */
    for (int u = 0; t->params && u < t->n_units; u++) {
        dev_free(&t->dev, t->params[u]);
        dev_free(&t->dev, t->grads[u]);
        dev_free(&t->dev, t->adam_m[u]);
        dev_free(&t->dev, t->adam_v[u]);
        if (t->p16) dev_free(&t->dev, t->p16[u]);
    }
    free(t->p16);
    fsdp_free(t);
    free(t->params), free(t->grads), free(t->adam_m), free(t->adam_v), free(t->numel);
    if (t->acts) wm_acts_free(&t->dev, t->acts);
    device *d = &t->dev;
    act_ring *rings[] = {&t->ax, &t->ay, &t->ady, &t->adx};
    for (int i = 0; i < 4 && d->ops; i++) free_ring(t, rings[i]);
    if (t->pool_mark) d->ops->event_free(d, t->pool_mark);
    void *devbufs[] = {t->ids_dev, t->tgt_dev, t->img_dev, t->sums};
    for (size_t i = 0; i < sizeof devbufs / sizeof devbufs[0]; i++) dev_free(d, devbufs[i]);
    if (d->ops) free_pool(t);
    if (d->ops) {
        d->ops->host_free(d, t->ids_host);
        d->ops->host_free(d, t->tgt_host);
        d->ops->host_free(d, t->img_host);
    }
    free(t->row_scale);
    if (t->data) data_close(t->data);
    if (d->ops) device_close(d);
    free(t);
}

/* ---- one step ---- */

/* Loss-masked data (fine-tuning): the targets of the whole global batch, every rank counting all
 * of them from the masks (no communication), so that each rank weighs its rows by the same
 * 1/count and the step's loss is the mean over the global batch's targets on any split. */
static int global_targets(trainer *t, int64_t *count, err_t *err) {
    const train_config *c = &t->cfg;
    *count = 0;
    for (int64_t j = 0; j < c->global_batch; j++) {
        int64_t n;
        if (data_sample_targets(t->data, t->step * c->global_batch + j, &n, err) < 0) return -1;
        *count += n;
    }
    return 0;
}

/* Reads this step's samples into the host arrays and weighs every sample's rows so that the sum
 * over the global batch is the mean over B samples of each sample's mean loss; with loss masks,
 * the mean over the global batch's targets instead (docs/data.md "Fine-tuning data": windows
 * hold different numbers of response tokens, and every response token weighs the same). */
static int load_samples(trainer *t, err_t *err) {
    const train_config *c = &t->cfg;
    const model_spec *m = &c->model;
    int T = t->tokens;
    int64_t img = arch_of(m->arch)->images ? (int64_t)m->channels * m->image * m->image : 0;
    int64_t masked_targets = 0;
    bool masked = !img && data_has_loss_mask(t->data);
    if (masked && global_targets(t, &masked_targets, err) < 0) return -1;
    t->rank_targets = 0;
    for (int i = 0; i < c->batch; i++) {
        int64_t s = t->step * c->global_batch + c->sample_offset + i;
        int targets = 1;
        if (img) {
            if (data_get_image(t->data, s, t->img_host + i * img, t->tgt_host + i, err) < 0)
                return -1;
        } else {
            int32_t *ids = t->ids_host + (int64_t)i * T, *tgt = t->tgt_host + (int64_t)i * T;
            if (data_get_tokens(t->data, s, ids, tgt, err) < 0) return -1;
            targets = 0;
            for (int k = 0; k < T; k++) targets += tgt[k] >= 0;
        }
        t->rank_targets += targets;
        /* the loss scale (a power of two) multiplies exactly */
        if (masked) t->row_scale[i] = (float)(t->loss_scale / (double)(masked_targets ? masked_targets : 1));
        else t->row_scale[i] = (float)(t->loss_scale / ((double)c->global_batch * (targets ? targets : 1)));
    }
    return 0;
}

/* Fills microbatch j's batch description; queues the upload of its inputs and targets when the
 * unit reads them (the embedding and the head; blocks see only activations). The uploads run on
 * the compute stream, so they wait for the previous microbatch's compute to finish with the
 * buffers; the host arrays stay untouched until the step's end. */
static void stage_microbatch(trainer *t, int j, wm_batch *b, bool upload) {
    const model_spec *m = &t->cfg.model;
    device *d = &t->dev;
    int mb = t->cfg.micro, T = t->tokens;
    int64_t rows = (int64_t)mb * T;
    *b = (wm_batch){.m = mb, .T = T, .ids = t->ids_dev, .targets = t->tgt_dev,
                    .images = t->img_dev, .row_scale = t->row_scale + (int64_t)j * mb};
    if (!upload) return;
    if (arch_of(m->arch)->images) {
        int64_t img = (int64_t)m->channels * m->image * m->image;
        d->ops->copy_async(d, t->img_dev, t->img_host + j * mb * img, (size_t)(mb * img) * 4,
                           COPY_H2D, DEV_STREAM_COMPUTE);
        d->ops->copy_async(d, t->tgt_dev, t->tgt_host + j * mb, (size_t)mb * 4, COPY_H2D,
                           DEV_STREAM_COMPUTE);
        return;
    }
    d->ops->copy_async(d, t->ids_dev, t->ids_host + j * rows, (size_t)rows * 4, COPY_H2D,
                       DEV_STREAM_COMPUTE);
    d->ops->copy_async(d, t->tgt_dev, t->tgt_host + j * rows, (size_t)rows * 4, COPY_H2D,
                       DEV_STREAM_COMPUTE);
}

/* ---- the offload schedule (paper appendix B) ----
 * Microbatch j uses buffer j % nbuf of each ring. Its input checkpoint (and, backward, its output
 * gradient) is fetched on the H2D stream while the previous microbatch computes; its output (or
 * input gradient) is stored on the D2H stream while the next one computes. Events keep each
 * buffer's copies and compute apart; the CPU device runs all of it at once, in order. */

static copy_kind pool_kind(const trainer *t, copy_kind host_kind) {
    return t->cfg.no_offload ? COPY_D2D : host_kind;
}

/* Queues the copy of pool entry `src` into buffer k, once compute is done with the buffer. */
static void ring_fetch(trainer *t, act_ring *r, int k, const float *src) {
    device *d = &t->dev;
    double t0 = clock_now_ms();
    d->ops->stream_wait(d, DEV_STREAM_H2D, r->computed[k]);
    d->ops->copy_async(d, r->buf[k], src, act_bytes(t), pool_kind(t, COPY_H2D), DEV_STREAM_H2D);
    d->ops->event_record(d, r->filled[k], DEV_STREAM_H2D);
    t->offload_ms += clock_now_ms() - t0;
}

/* Compute about to use buffer k: its copy in has arrived and its copy out has left. */
static float *ring_use(trainer *t, act_ring *r, int k) {
    device *d = &t->dev;
    d->ops->stream_wait(d, DEV_STREAM_COMPUTE, r->filled[k]);
    d->ops->stream_wait(d, DEV_STREAM_COMPUTE, r->stored[k]);
    return r->buf[k];
}

static void ring_done(trainer *t, act_ring *r, int k) {
    t->dev.ops->event_record(&t->dev, r->computed[k], DEV_STREAM_COMPUTE);
}

/* Queues the copy of buffer k (just computed) to pool entry `dst`. */
static void ring_store(trainer *t, act_ring *r, int k, float *dst) {
    device *d = &t->dev;
    double t0 = clock_now_ms();
    d->ops->stream_wait(d, DEV_STREAM_D2H, r->computed[k]);
    d->ops->copy_async(d, dst, r->buf[k], act_bytes(t), pool_kind(t, COPY_D2H), DEV_STREAM_D2H);
    d->ops->event_record(d, r->stored[k], DEV_STREAM_D2H);
    t->offload_ms += clock_now_ms() - t0;
}

/* A unit starts reading pool entries the previous unit wrote: fetches wait for those stores. */
static void pool_barrier(trainer *t) {
    device *d = &t->dev;
    double t0 = clock_now_ms();
    d->ops->event_record(d, t->pool_mark, DEV_STREAM_D2H);
    d->ops->stream_wait(d, DEV_STREAM_H2D, t->pool_mark);
    t->offload_ms += clock_now_ms() - t0;
}

/* After each microbatch: optionally let its compute finish before queueing the next (so the
 * allocator and the GPU never hold two microbatches' transient memory at once). */
static void micro_done(trainer *t) {
    if (t->cfg.sync_micro) t->dev.ops->sync(&t->dev);
}

static float *boundary_of(trainer *t, int u, int j) { return t->boundary[u * t->cfg.micros + j]; }

/* Microbatches [j0, j1) of a step: all of them (layered accumulation) or one (per-microbatch). */
typedef struct mb_range {
    int j0, j1;
} mb_range;

/* Forward: unit u computes from parameter slot s while unit u+1 is gathered into the other.
 * keep: the backward follows, so with recompute none each microbatch's intermediates go to a
 * set of their own (evaluation's forward overwrites one set per unit). Returns the slot the
 * head's parameters arrive in, or -1 on a communication failure. */
static int forward_units(trainer *t, mb_range r, bool keep, err_t *err) {
    device *d = &t->dev;
    int head = t->n_units - 1, s = 0, nb = t->nbuf;
    fsdp_prefetch(t, 0, s);
    for (int u = 0; u < head; u++, s ^= 1) {
        const float *p = fsdp_await(t, u, s, err);
        if (!p) return -1;
        fsdp_prefetch(t, u + 1, s ^ 1);
        dev_set_context(d, "unit %d forward", u);
        pool_barrier(t);
        if (u > 0 && r.j0 < r.j1) ring_fetch(t, &t->ax, r.j0 % nb, boundary_of(t, u - 1, r.j0));
        for (int j = r.j0; j < r.j1; j++) {
            int k = j % nb;
            wm_batch b;
            stage_microbatch(t, j, &b, u == 0);
            const float *x = ring_use(t, &t->ax, k);
            float *y = ring_use(t, &t->ay, k);
            wm_acts_select(t->acts, &t->cfg.model, u, keep ? j - r.j0 : 0);
            wm_unit_forward(d, &t->cfg.model, u, p, &b, x, y, t->acts);
            ring_done(t, &t->ax, k), ring_done(t, &t->ay, k);
            ring_store(t, &t->ay, k, boundary_of(t, u, j));
            if (u > 0 && j + 1 < r.j1) ring_fetch(t, &t->ax, (j + 1) % nb, boundary_of(t, u - 1, j + 1));
            micro_done(t);
        }
    }
    return s;
}

/* The fused head over microbatches r: each one's loss added to the device's t->sums[0];
 * training (train) keeps step 0's logits for tests and stores each input gradient in the pool
 * for the backward. */
static void head_microbatches(trainer *t, mb_range r, const float *p, float *g, const float *emb,
                              float *gemb, bool train) {
    const model_spec *m = &t->cfg.model;
    int head = t->n_units - 1, nb = t->nbuf;
    int64_t per_mb = arch_of(m->arch)->images ? (int64_t)t->cfg.micro * m->n_classes
                                         : (int64_t)t->cfg.micro * t->tokens * m->vocab;
    pool_barrier(t);
    if (r.j0 < r.j1) ring_fetch(t, &t->ax, r.j0 % nb, boundary_of(t, head - 1, r.j0));
    for (int j = r.j0; j < r.j1; j++) {
        int k = j % nb;
        wm_batch b;
        stage_microbatch(t, j, &b, true);
        const float *x = ring_use(t, &t->ax, k);
        float *dx = ring_use(t, &t->adx, k);
        float *lo = train && t->logits_out && t->step == 0 ? t->logits_out + j * per_mb : NULL;
        wm_acts_select(t->acts, m, head, 0);
        wm_head_step(&t->dev, m, p, g, emb, gemb, &b, x, dx, t->acts, &t->sums[0], lo);
        ring_done(t, &t->ax, k), ring_done(t, &t->adx, k);
        if (train) ring_store(t, &t->adx, k, t->grad_pool[j]);
        if (j + 1 < r.j1) ring_fetch(t, &t->ax, (j + 1) % nb, boundary_of(t, head - 1, j + 1));
        micro_done(t);
    }
}

/* The head, forward and backward fused, from parameter slot s. A tied head also needs the
 * embedding's parameters (gathered into the other slot, free since the last block finished) and
 * adds to the embedding's gradient, which is reduce-scattered at once so that only one full
 * embedding gradient ever exists. Returns the slot the last block's parameters arrive in. */
static int head_units(trainer *t, mb_range r, int s, err_t *err) {
    device *d = &t->dev;
    const model_spec *m = &t->cfg.model;
    int head = t->n_units - 1;
    bool tied = m->tied_head;
    const float *p = fsdp_await(t, head, s, err), *emb = NULL;
    if (!p) return -1;
    if (tied) {
        fsdp_prefetch(t, 0, s ^ 1);
        if (!(emb = fsdp_await(t, 0, s ^ 1, err))) return -1;
    } else {
        fsdp_prefetch(t, head - 1, s ^ 1); /* behind the head's compute */
    }
    float *g = fsdp_grad_begin(t, head, 0, err), *gemb = NULL;
    if (!g || (tied && !(gemb = fsdp_grad_begin(t, 0, 1, err)))) return -1;
    dev_set_context(d, "head forward and backward");
    head_microbatches(t, r, p, g, emb, gemb, true);
    fsdp_grad_end(t, head, 0);
    /* replicated plans reduce the embedding once, after its own backward */
    if (tied && t->sharded) fsdp_grad_end(t, 0, 1);
    if (!tied) return s ^ 1;
    fsdp_prefetch(t, head - 1, s);
    return s;
}

/* Evaluation's head: the loss of microbatches r from parameter slot s, as head_units computes it
 * but with no reduction. The fused head writes gradients anyway: into the gradient buffers the
 * next step zeroes (fsdp_grad_begin), never reduced or applied. */
static int eval_head(trainer *t, mb_range r, int s, err_t *err) {
    device *d = &t->dev;
    const model_spec *m = &t->cfg.model;
    int head = t->n_units - 1;
    const float *p = fsdp_await(t, head, s, err), *emb = NULL;
    if (!p) return -1;
    if (m->tied_head) {
        fsdp_prefetch(t, 0, s ^ 1);
        if (!(emb = fsdp_await(t, 0, s ^ 1, err))) return -1;
    }
    float *g = fsdp_grad_begin(t, head, 0, err), *gemb = NULL;
    if (!g || (m->tied_head && !(gemb = fsdp_grad_begin(t, 0, 1, err)))) return -1;
    dev_set_context(d, "evaluation: head forward");
    head_microbatches(t, r, p, g, emb, gemb, false);
    return 0;
}

int trainer_forward_loss(trainer *t, int n, double *loss, err_t *err) {
    CHECK(n >= 0 && n <= t->cfg.micros);
    mb_range r = {0, n};
    dev_zero(&t->dev, (float *)t->sums, 2); /* the loss: +0.0 is all-zero bits */
    int s = forward_units(t, r, false, err);
    if (s < 0 || eval_head(t, r, s, err) < 0) {
        if (t->cfg.comm) fsdp_drain(t);
        return -1;
    }
    double sum;
    dev_download(&t->dev, &sum, &t->sums[0], sizeof sum);
    *loss += sum;
    t->dev.ops->sync(&t->dev); /* the caller refills the host arrays next */
    return 0;
}

/* Fetches microbatch j's inputs of unit u's backward: its checkpoint and its output gradient. */
static void fetch_backward(trainer *t, int u, int j) {
    int k = j % t->nbuf;
    if (u > 0) ring_fetch(t, &t->ax, k, boundary_of(t, u - 1, j));
    ring_fetch(t, &t->ady, k, t->grad_pool[j]);
}

/* Backward: units in reverse, each gathered once for the microbatches (recompute full: recompute
 * from the offloaded checkpoint, then back-propagate; none: back-propagate from the forward's
 * kept intermediates, the checkpoint still the input x), gradients accumulated over the microbatches in a
 * gradient slot and reduce-scattered once. The input gradient of microbatch j replaces its
 * output gradient in the pool only after that was fetched (the store waits for the compute,
 * which waited for the fetch). */
static int backward_units(trainer *t, mb_range r, int s, err_t *err) {
    device *d = &t->dev;
    int head = t->n_units - 1, nb = t->nbuf;
    int gi = t->cfg.model.tied_head ? 0 : 1; /* the gradient slot the head left free */
    for (int u = head - 1; u >= 0; u--, s ^= 1, gi ^= 1) {
        const float *p = fsdp_await(t, u, s, err);
        if (!p) return -1;
        if (u > 0) fsdp_prefetch(t, u - 1, s ^ 1);
        float *g = fsdp_grad_begin(t, u, gi, err);
        if (!g) return -1;
        dev_set_context(d, "unit %d backward", u);
        pool_barrier(t);
        if (r.j0 < r.j1) fetch_backward(t, u, r.j0);
        for (int j = r.j0; j < r.j1; j++) {
            int k = j % nb;
            wm_batch b;
            stage_microbatch(t, j, &b, u == 0);
            const float *x = ring_use(t, &t->ax, k), *dy = ring_use(t, &t->ady, k);
            float *y = ring_use(t, &t->ay, k), *dx = u > 0 ? ring_use(t, &t->adx, k) : NULL;
            wm_acts_select(t->acts, &t->cfg.model, u, j - r.j0);
            if (t->cfg.recompute == RECOMPUTE_FULL) wm_unit_forward(d, &t->cfg.model, u, p, &b, x, y, t->acts);
            wm_unit_backward(d, &t->cfg.model, u, p, g, &b, x, dy, dx, t->acts);
            act_ring *used[] = {&t->ax, &t->ady, &t->ay, &t->adx};
            for (int i = 0; i < (u > 0 ? 4 : 3); i++) ring_done(t, used[i], k);
            if (u > 0) ring_store(t, &t->adx, k, t->grad_pool[j]);
            if (j + 1 < r.j1) fetch_backward(t, u, j + 1);
            micro_done(t);
        }
        fsdp_grad_end(t, u, gi);
    }
    return fsdp_finish_grads(t, err);
}

/* The segments of unit u's shard for AdamW: each tensor's slice in this rank's shard, with step
 * scalars 0 (decayed) or 1 (not); with `merge`, neighbours of the same kind are one segment
 * (tensors tile the unit). Returns the count; seg has room for WM_MAX_TENSORS. */
static int adamw_segments(const trainer *t, int u, bool merge, dev_adamw_seg *seg) {
    wm_tensor ts[WM_MAX_TENSORS];
    int n = wm_unit_tensors(&t->cfg.model, u, ts), k = 0;
    int64_t lo = t->shard_off[u], hi = lo + t->shard_n[u];
    for (int i = 0; i < n; i++) {
        int64_t a = ts[i].offset > lo ? ts[i].offset : lo;
        int64_t b = ts[i].offset + ts[i].numel < hi ? ts[i].offset + ts[i].numel : hi;
        if (a >= b) continue;
        int which = ts[i].decay ? 0 : 1;
        if (merge && k > 0 && seg[k - 1].which == which && seg[k - 1].off + seg[k - 1].n == a - lo)
            seg[k - 1].n += b - a;
        else
            seg[k++] = (dev_adamw_seg){.off = a - lo, .n = b - a, .which = which};
    }
    return k;
}

/* AdamW on this rank's slice of every tensor; decay only where the layout says so. Per tensor
 * (adamw), or per unit (adamw_multi, writing the 16-bit shard copy with adamw half). */
static void optimizer_step(trainer *t, double lr, float gscale) {
    const train_config *c = &t->cfg;
    const dev_adamw steps[2] = {
        dev_adamw_step(lr, c->beta1, c->beta2, c->eps, c->weight_decay, t->adam_steps + 1, gscale),
        dev_adamw_step(lr, c->beta1, c->beta2, c->eps, 0.0, t->adam_steps + 1, gscale)};
    device *d = &t->dev;
    for (int u = 0; u < t->n_units; u++) {
        dev_adamw_seg seg[WM_MAX_TENSORS];
        int n = adamw_segments(t, u, c->adamw != ADAMW_TENSOR, seg);
        if (!n) continue;
        float *p = t->params[u], *g = t->grads[u], *m = t->adam_m[u], *v = t->adam_v[u];
        if (c->adamw == ADAMW_TENSOR) {
            for (int i = 0; i < n; i++) {
                int64_t o = seg[i].off;
                OP(d, adamw, p + o, g + o, m + o, v + o, seg[i].n, &steps[seg[i].which]);
            }
            continue;
        }
        /* the copy stays fresh: it is written from the values the update stores */
        uint16_t *half = t->p16 && t->p16_fresh ? t->p16[u] : NULL;
        OP(d, adamw_multi, p, g, m, v, half, c->prec, n, seg, steps);
    }
}

/* What a step's one all-reduce brings back: the same on every rank. */
typedef struct step_sums {
    double loss, norm; /* unscaled */
    bool finite;       /* no rank's gradient has an inf or NaN */
    double targets;    /* the global batch's targets that count (every rank's rows) */
} step_sums;

/* Loss, gradient norm and target count over the whole job, the first two unscaled: each rank's
 * loss is its share of the global mean; the squared norm is summed over the shards (a replicated
 * rank already has all of it). The target count is summed over the ranks, so that whether the
 * step has anything to learn from is decided alike everywhere (a rank's rows may have no target
 * while another's have some). The squared norm of every unit's shard is one device op (units in
 * order), next to the loss the head summed there; both come to the host in the step's one
 * download. */
static int global_loss_and_norm(trainer *t, step_sums *out, err_t *err) {
    const float **x = xcalloc((size_t)t->n_units, sizeof *x);
    for (int u = 0; u < t->n_units; u++) x[u] = t->grads[u];
    OP(&t->dev, sumsq_multi, &t->sums[1], t->n_units, x, t->shard_n);
    free(x);
    double sums[ENGINE_STEP_SUMS];
    dev_download(&t->dev, sums, t->sums, sizeof sums);
    double loss = sums[0], sumsq = sums[1];
    double v[ENGINE_STEP_ALLREDUCED] = {loss / t->loss_scale, t->sharded ? sumsq : 0,
                                        t->stop_request && *t->stop_request ? 1 : 0, isfinite(sumsq) ? 0 : 1,
                                        (double)t->rank_targets};
    if (fsdp_allreduce_sums(t, v, ENGINE_STEP_ALLREDUCED, err) < 0) return -1;
    t->stop_agreed = v[2] > 0;
    *out = (step_sums){.loss = v[0], .finite = v[3] == 0, .norm = sqrt(t->sharded ? v[1] : sumsq) / t->loss_scale,
                       .targets = v[4]}; /* integers below 2^53: exact in any order */
    return 0;
}

/* tests (CEPHALO_TEST_NONFINITE): an overflow in this rank's gradient at the configured step. */
static void inject_nonfinite(trainer *t) {
    const train_config *c = &t->cfg;
    if (t->step != c->inject_nonfinite_step || c->rank != c->inject_nonfinite_rank) return;
    for (int u = 0; u < t->n_units; u++)
        if (t->shard_n[u]) {
            float inf = INFINITY;
            dev_upload(&t->dev, t->grads[u], &inf, sizeof inf);
            return;
        }
}

/* One pass over the model for microbatches r; the loss adds up on the device. */
static int pass(trainer *t, mb_range r, err_t *err) {
    int s = forward_units(t, r, true, err);
    if (s < 0 || (s = head_units(t, r, s, err)) < 0) return -1;
    return backward_units(t, r, s, err);
}

static int run_step(trainer *t, step_sums *out, err_t *err) {
    for (int u = 0; u < t->n_units; u++)
        if (t->shard_n[u]) dev_zero(&t->dev, t->grads[u], t->shard_n[u]);
    dev_zero(&t->dev, (float *)t->sums, 2 * ENGINE_STEP_SUMS); /* +0.0 is all-zero bits */
    int rc = 0, l = t->cfg.micros;
    /* per microbatch, every rank makes as many passes as the rank with the most microbatches
     * (the collectives must match); a rank out of microbatches passes with none */
    int passes = t->cfg.max_micros > l ? t->cfg.max_micros : l;
    if (t->cfg.per_micro)
        for (int j = 0; j < passes && rc == 0; j++)
            rc = pass(t, (mb_range){j < l ? j : l, j < l ? j + 1 : l}, err);
    else
        rc = pass(t, (mb_range){0, l}, err);
    if (rc == 0) inject_nonfinite(t);
    if (rc < 0 || global_loss_and_norm(t, out, err) < 0) {
        if (t->cfg.comm) fsdp_drain(t);
        return -1;
    }
    return 0;
}

/* fp16: halve the scale after a skipped step, double it after loss_scale_window clean ones. A
 * scale below 2^-24 means every gradient overflows however small the scale: the model diverged. */
static int update_loss_scale(trainer *t, bool skipped, err_t *err) {
    if (t->cfg.prec != PREC_FP16) return 0;
    if (skipped) {
        t->skipped_steps++, t->clean_steps = 0, t->loss_scale /= 2;
        if (t->loss_scale >= 0x1p-24) return 0;
        if (t->updates_run == 0) /* every step of this run skipped: the weights are those it started from */
            return err_set(err, "step %lld: the gradient is not finite even at loss scale %g, and no step of this "
                           "run has updated the weights yet (%lld skipped), so the learning rate is not the cause: "
                           "the backward pass overflows fp16's range (65504) on the weights it started from and "
                           "this data; train in bf16 (--precision bf16), which has fp32's range",
                           (long long)t->step, t->loss_scale * 2, (long long)t->skipped_steps);
        return err_set(err, "step %lld: the gradient is not finite even at loss scale %g (%lld "
                       "steps skipped in all): the model diverged (lower --lr?)",
                       (long long)t->step, t->loss_scale * 2, (long long)t->skipped_steps);
    }
    if (++t->clean_steps >= t->cfg.loss_scale_window) t->loss_scale *= 2, t->clean_steps = 0;
    return 0;
}

int trainer_step(trainer *t, step_stats *st, err_t *err) {
    double t0 = clock_now_ms();
    comm_stats c0 = {0}, c1 = {0};
    if (t->cfg.comm) comm_get_stats(t->cfg.comm, &c0);
    int64_t g0 = t->n_gathers, r0 = t->n_reduce_scatters, a0 = t->n_allreduces;
    int64_t h0 = t->dev.host_syncs;
    t->wait_ms = 0;
    t->offload_ms = 0;
    if (load_samples(t, err) < 0) return err_prefix(err, "step %lld", (long long)t->step);
    double scale = t->loss_scale;
    step_sums s;
    if (run_step(t, &s, err) < 0) return err_prefix(err, "step %lld", (long long)t->step);
    double lr = train_lr(&t->cfg, t->step);
    /* a global batch without a target that counts has nothing to learn from: its gradient is zero,
     * but AdamW would still decay the weights and move them by its moments (step_stats.empty) */
    bool empty = s.targets == 0;
    bool skip = !s.finite && t->cfg.prec == PREC_FP16;
    /* a step whose loss is not finite is not applied either: training stops there, and the weights
     * stay those the loss was computed on, for the diagnosis (trainer_weight_stats) */
    if (!skip && !empty && isfinite(s.loss)) {
        double coef = t->cfg.clip > 0 ? t->cfg.clip / (s.norm + 1e-6) : 1.0;
        /* unscaling by a power of two is exact */
        optimizer_step(t, lr, (float)((coef < 1.0 ? coef : 1.0) / scale));
        t->adam_steps++;
        t->updates_run++;
    }
    /* an empty step says nothing of the scale: nothing was at risk of overflowing */
    if (!empty && update_loss_scale(t, skip, err) < 0) return -1;
    t->dev.ops->sync(&t->dev);
    double ms = clock_now_ms() - t0;
    if (t->cfg.comm) comm_get_stats(t->cfg.comm, &c1);
    *st = (step_stats){.step = t->step, .loss = empty ? NAN : s.loss, .lr = lr, .grad_norm = s.norm, .step_ms = ms,
                       .loss_scale = scale, .skipped = skip, .targets = s.targets, .empty = empty,
                       .peak_bytes = t->dev.peak_bytes, .gathers = t->n_gathers - g0,
                       .reduce_scatters = t->n_reduce_scatters - r0,
                       .allreduces = t->n_allreduces - a0,
                       .bytes_sent = c1.bytes_sent - c0.bytes_sent, .comm_wait_ms = t->wait_ms,
                       .offload_ms = t->offload_ms, .host_syncs = t->dev.host_syncs - h0};
    /* the job's throughput: every rank finishes the step together */
    st->samples_per_s = t->cfg.global_batch / (ms / 1e3);
    st->tokens_per_s = st->samples_per_s * t->tokens;
    t->step++;
    t->samples_seen += t->cfg.global_batch;
    return 0;
}

int trainer_weight_stats(trainer *t, weight_stats *out, err_t *err) {
    int world = t->cfg.world > 1 ? t->cfg.world : 1, rank = t->cfg.rank;
    int64_t bad = 0;
    float max = 0;
    for (int u = 0; u < t->n_units; u++) {
        if (!t->shard_n[u]) continue;
        float *w = xmalloc((size_t)t->shard_n[u] * sizeof *w);
        trainer_get_params(t, u, w);
        for (int64_t i = 0; i < t->shard_n[u]; i++) {
            if (!isfinite(w[i])) bad++;
            else if (fabsf(w[i]) > max) max = fabsf(w[i]);
        }
        free(w);
    }
    /* summed over the ranks: each rank's count where the weights are sharded (rank 0's where every
     * rank holds them all), and each rank's maximum in its own slot */
    double *v = xcalloc((size_t)world + 1, sizeof *v);
    v[0] = t->sharded || rank == 0 ? (double)bad : 0;
    v[1 + rank] = max;
    int rc = fsdp_allreduce_sums(t, v, world + 1, err);
    *out = (weight_stats){.nonfinite = (int64_t)v[0]};
    for (int r = 0; r < world; r++)
        if (v[1 + r] > out->max_abs) out->max_abs = v[1 + r];
    free(v);
    return rc;
}

void trainer_get_params(trainer *t, int unit, float *out) {
    if (t->shard_n[unit])
        dev_download(&t->dev, out, t->params[unit], (size_t)t->shard_n[unit] * sizeof(float));
}

void trainer_get_grads(trainer *t, int unit, float *out) {
    if (t->shard_n[unit])
        dev_download(&t->dev, out, t->grads[unit], (size_t)t->shard_n[unit] * sizeof(float));
}
