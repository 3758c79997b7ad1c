/* train.c - one rank's training step with layered gradient accumulation (DESIGN 7).
 *
 * Forward: for each unit, all l microbatches run before the next unit starts; each microbatch's
 * unit output is offloaded to the host pool (it is the next unit's input checkpoint). The head's
 * forward and backward are fused (its logits are never kept). Backward: units in reverse; for each
 * microbatch the unit's input comes back from the host, the unit is recomputed and back-propagated,
 * and its input gradient goes back to the host. Parameter gradients accumulate over the l
 * microbatches, so one batch of m*l and l microbatches of m give the same update. */
#include <math.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "strutil.h"
#include "train.h"

#define OP(d, name, ...) ((d)->ops->name((d), __VA_ARGS__))

void train_config_defaults(train_config *c) {
    c->world = 1;
    c->steps = 20;
    c->lr = 3e-4;
    c->min_lr = -1; /* lr / 10 unless set */
    c->beta1 = 0.9;
    c->beta2 = 0.95;
    c->eps = 1e-8;
    c->weight_decay = 0.1;
    c->clip = 1.0;
    c->warmup = 0;
    c->seed = 1;
    c->data = "synthetic";
}

double train_lr(const train_config *c, int64_t step) {
    double min_lr = c->min_lr < 0 ? c->lr / 10 : c->min_lr;
    if (step < c->warmup) return c->lr * (double)(step + 1) / (double)c->warmup;
    int64_t span = c->steps - c->warmup > 1 ? c->steps - c->warmup : 1;
    double p = (double)(step - c->warmup) / (double)span;
    if (p > 1) p = 1;
    return min_lr + 0.5 * (c->lr - min_lr) * (1 + cos(3.14159265358979323846 * p));
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* ---- set-up ---- */

static int open_data(trainer *t, err_t *err) {
    const train_config *c = &t->cfg;
    const model_spec *m = &c->model;
    bool synthetic = !strcmp(c->data, "synthetic");
    if (m->arch == ARCH_VIT)
        return synthetic ? data_open_synthetic_images(&t->data, m->channels, m->image,
                                                      m->n_classes, c->seed, err)
                         : data_open_images(&t->data, c->data, m->channels, m->image,
                                            m->n_classes, c->seed, err);
    data_task task = m->arch == ARCH_BERT ? DATA_MLM : DATA_CLM;
    return synthetic ? data_open_synthetic_tokens(&t->data, c->seq, m->vocab, task, c->seed, err)
                     : data_open_tokens(&t->data, c->data, c->seq, m->vocab, task, c->seed, err);
}

/* Allocates on the device or fails with the allocator's message. */
#define DEV_ALLOC(ptr, n, what)                                                   \
    do {                                                                          \
        if (!((ptr) = dev_alloc(&t->dev, (size_t)(n), what))) {                   \
            *err = t->dev.err;                                                    \
            return -1;                                                            \
        }                                                                         \
    } while (0)

static int alloc_state(trainer *t, err_t *err) {
    t->numel = xcalloc((size_t)t->n_units, sizeof(int64_t));
    float ***sets[] = {&t->params, &t->grads, &t->adam_m, &t->adam_v};
    const char *what[] = {"parameters", "gradients", "AdamW first moments", "AdamW second moments"};
    for (int s = 0; s < 4; s++) *sets[s] = xcalloc((size_t)t->n_units, sizeof(float *));
    for (int u = 0; u < t->n_units; u++) {
        t->numel[u] = model_unit_params(&t->cfg.model, u);
        dev_set_context(&t->dev, "set-up of unit %d", u);
        for (int s = 0; s < 4; s++) DEV_ALLOC((*sets[s])[u], t->numel[u] * 4, what[s]);
    }
    for (int u = 0; u < t->n_units; u++) {
        float *host = xmalloc((size_t)t->numel[u] * sizeof(float));
        wm_init_range(&t->cfg.model, u, t->cfg.seed, 0, t->numel[u], host);
        dev_upload(&t->dev, t->params[u], host, (size_t)t->numel[u] * sizeof(float));
        free(host);
        dev_zero(&t->dev, t->adam_m[u], t->numel[u]);
        dev_zero(&t->dev, t->adam_v[u], t->numel[u]);
    }
    return 0;
}

/* Bytes of one microbatch's activations at a unit boundary [m*T, d]. */
static size_t act_bytes(const trainer *t) {
    return (size_t)t->cfg.micro * t->tokens * t->cfg.model.d_model * sizeof(float);
}

/* The host pool the unit-boundary checkpoints and the flowing gradients are offloaded to. It
 * grows with the batch, so running out of host memory here is a bad job, not a crash. */
static int alloc_host_pool(trainer *t, err_t *err) {
    int nb = t->n_units - 1, l = t->cfg.micros;
    size_t bytes = act_bytes(t);
    t->boundary = xcalloc((size_t)(nb * l), sizeof(float *));
    t->grad_pool = xcalloc((size_t)l, sizeof(float *));
    t->host_bytes = (int64_t)(nb + 1) * l * (int64_t)bytes;
    /* malloc overcommits: a pool beyond physical memory would "succeed" and be OOM-killed
     * mid-step, so compare with the machine's memory first. */
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    bool ok = pages <= 0 || page <= 0 || (double)t->host_bytes <= 0.9 * (double)pages * page;
    for (int i = 0; i < nb * l && ok; i++) ok = (t->boundary[i] = malloc(bytes)) != NULL;
    for (int j = 0; j < l && ok; j++) ok = (t->grad_pool[j] = malloc(bytes)) != NULL;
    if (ok) return 0;
    char need[32];
    return err_set(err, "rank %d: cannot allocate the %s host offload pool (%d unit inputs and "
                   "1 gradient x %d microbatches of %zu bytes) in this machine's memory; lower the batch",
                   t->cfg.rank, str_bytes((double)t->host_bytes, need, sizeof need), nb, l, bytes);
}

static int alloc_buffers(trainer *t, err_t *err) {
    const model_spec *m = &t->cfg.model;
    int mb = t->cfg.micro, l = t->cfg.micros, T = t->tokens;
    int64_t rows = (int64_t)mb * T, act = rows * m->d_model;
    dev_set_context(&t->dev, "set-up of the activation buffers");
    if (!(t->acts = wm_acts_new(&t->dev, m, mb, t->cfg.seq, err))) return -1;
    DEV_ALLOC(t->x, act * 4, "unit input");
    DEV_ALLOC(t->y, act * 4, "unit output");
    DEV_ALLOC(t->dy, act * 4, "output gradient");
    DEV_ALLOC(t->dx, act * 4, "input gradient");
    DEV_ALLOC(t->ids_dev, rows * 4, "token ids");
    DEV_ALLOC(t->tgt_dev, rows * 4, "targets");
    int64_t img = m->arch == ARCH_VIT ? (int64_t)m->channels * m->image * m->image : 0;
    if (img) DEV_ALLOC(t->img_dev, mb * img * 4, "images");
    t->ids_host = xcalloc((size_t)(l * rows), sizeof(int32_t));
    t->tgt_host = xcalloc((size_t)(l * rows), sizeof(int32_t));
    t->img_host = img ? xcalloc((size_t)(l * mb * img), sizeof(float)) : NULL;
    t->row_scale = xcalloc((size_t)(l * mb), sizeof(float));
    return alloc_host_pool(t, err);
}

trainer *trainer_new(const train_config *cfg, err_t *err) {
    if (cfg->batch != cfg->micro * cfg->micros || cfg->micro < 1) {
        err_set(err, "batch %d is not microbatch %d x %d microbatches", cfg->batch, cfg->micro,
                cfg->micros);
        return NULL;
    }
    trainer *t = xcalloc(1, sizeof *t);
    t->cfg = *cfg;
    t->n_units = model_n_units(&cfg->model);
    t->tokens = model_tokens(&cfg->model, cfg->seq);
    if (cpu_device_init(&t->dev, cfg->rank, cfg->threads, cfg->memory_bytes, err) < 0) {
        free(t);
        return NULL;
    }
    if (open_data(t, err) < 0 || alloc_state(t, err) < 0 || alloc_buffers(t, err) < 0) {
        trainer_free(t);
        return NULL;
    }
    return t;
}

void trainer_free(trainer *t) {
    if (!t) return;
    for (int u = 0; t->numel && u < t->n_units; u++) {
        dev_free(&t->dev, t->params[u]);
        dev_free(&t->dev, t->grads[u]);
        dev_free(&t->dev, t->adam_m[u]);
        dev_free(&t->dev, t->adam_v[u]);
    }
    free(t->params), free(t->grads), free(t->adam_m), free(t->adam_v), free(t->numel);
    if (t->acts) wm_acts_free(&t->dev, t->acts);
    void *devbufs[] = {t->x, t->y, t->dy, t->dx, t->ids_dev, t->tgt_dev, t->img_dev};
    for (size_t i = 0; i < sizeof devbufs / sizeof devbufs[0]; i++) dev_free(&t->dev, devbufs[i]);
    int nb = t->n_units - 1;
    for (int i = 0; t->boundary && i < nb * t->cfg.micros; i++) free(t->boundary[i]);
    for (int j = 0; t->grad_pool && j < t->cfg.micros; j++) free(t->grad_pool[j]);
    free(t->boundary), free(t->grad_pool);
    free(t->ids_host), free(t->tgt_host), free(t->img_host), free(t->row_scale);
    if (t->data) data_close(t->data);
    if (t->dev.ops) cpu_device_close(&t->dev);
    free(t);
}

/* ---- one step ---- */

/* Reads this step's samples into the host arrays and weighs every sample's rows so that the sum
 * over the global batch is the mean over B samples of each sample's mean loss. */
static int load_samples(trainer *t, err_t *err) {
    const train_config *c = &t->cfg;
    const model_spec *m = &c->model;
    int T = t->tokens;
    int64_t img = m->arch == ARCH_VIT ? (int64_t)m->channels * m->image * m->image : 0;
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
        t->row_scale[i] = (float)(1.0 / ((double)c->global_batch * (targets ? targets : 1)));
    }
    return 0;
}

/* Fills microbatch j's batch description; uploads its inputs and targets when the unit reads
 * them (the embedding and the head; blocks see only activations). */
static void stage_microbatch(trainer *t, int j, wm_batch *b, bool upload) {
    const model_spec *m = &t->cfg.model;
    int mb = t->cfg.micro, T = t->tokens;
    int64_t rows = (int64_t)mb * T;
    *b = (wm_batch){.m = mb, .T = T, .ids = t->ids_dev, .targets = t->tgt_dev,
                    .images = t->img_dev, .row_scale = t->row_scale + (int64_t)j * mb};
    if (!upload) return;
    if (m->arch == ARCH_VIT) {
        int64_t img = (int64_t)m->channels * m->image * m->image;
        dev_upload(&t->dev, t->img_dev, t->img_host + j * mb * img, (size_t)(mb * img) * 4);
        dev_upload(&t->dev, t->tgt_dev, t->tgt_host + j * mb, (size_t)mb * 4);
        return;
    }
    dev_upload(&t->dev, t->ids_dev, t->ids_host + j * rows, (size_t)rows * 4);
    dev_upload(&t->dev, t->tgt_dev, t->tgt_host + j * rows, (size_t)rows * 4);
}

static void forward_units(trainer *t) {
    device *d = &t->dev;
    int head = t->n_units - 1;
    for (int u = 0; u < head; u++) {
        dev_set_context(d, "unit %d forward", u);
        for (int j = 0; j < t->cfg.micros; j++) {
            wm_batch b;
            stage_microbatch(t, j, &b, u == 0);
            if (u > 0) dev_upload(d, t->x, t->boundary[(u - 1) * t->cfg.micros + j], act_bytes(t));
            wm_unit_forward(d, &t->cfg.model, u, t->params[u], &b, t->x, t->y, t->acts);
            dev_download(d, t->boundary[u * t->cfg.micros + j], t->y, act_bytes(t));
        }
    }
}

static double head_units(trainer *t) {
    device *d = &t->dev;
    int head = t->n_units - 1, l = t->cfg.micros;
    const model_spec *m = &t->cfg.model;
    int64_t per_mb = m->arch == ARCH_VIT ? (int64_t)t->cfg.micro * m->n_classes
                                         : (int64_t)t->cfg.micro * t->tokens * m->vocab;
    double loss = 0;
    dev_set_context(d, "head forward and backward");
    for (int j = 0; j < l; j++) {
        wm_batch b;
        stage_microbatch(t, j, &b, true);
        dev_upload(d, t->x, t->boundary[(head - 1) * l + j], act_bytes(t));
        float *lo = t->logits_out && t->step == 0 ? t->logits_out + j * per_mb : NULL;
        loss += wm_head_step(d, m, t->params[head], t->grads[head], t->params[0], t->grads[0], &b,
                             t->x, t->dx, t->acts, lo);
        dev_download(d, t->grad_pool[j], t->dx, act_bytes(t));
    }
    return loss;
}

static void backward_units(trainer *t) {
    device *d = &t->dev;
    int head = t->n_units - 1, l = t->cfg.micros;
    for (int u = head - 1; u >= 0; u--) {
        dev_set_context(d, "unit %d backward", u);
        for (int j = 0; j < l; j++) {
            wm_batch b;
            stage_microbatch(t, j, &b, u == 0);
            if (u > 0) dev_upload(d, t->x, t->boundary[(u - 1) * l + j], act_bytes(t));
            dev_upload(d, t->dy, t->grad_pool[j], act_bytes(t));
            wm_unit_forward(d, &t->cfg.model, u, t->params[u], &b, t->x, t->y, t->acts);
            wm_unit_backward(d, &t->cfg.model, u, t->params[u], t->grads[u], &b, t->x, t->dy,
                             u > 0 ? t->dx : NULL, t->acts);
            if (u > 0) dev_download(d, t->grad_pool[j], t->dx, act_bytes(t));
        }
    }
}

/* AdamW on every tensor of every unit; decay only where the layout says so. */
static void optimizer_step(trainer *t, double lr, float gscale) {
    const train_config *c = &t->cfg;
    double bc1 = 1 - pow(c->beta1, (double)(t->step + 1));
    double bc2 = 1 - pow(c->beta2, (double)(t->step + 1));
    for (int u = 0; u < t->n_units; u++) {
        wm_tensor ts[WM_MAX_TENSORS];
        int n = wm_unit_tensors(&c->model, u, ts);
        for (int i = 0; i < n; i++) {
            int64_t o = ts[i].offset;
            OP(&t->dev, adamw, t->params[u] + o, t->grads[u] + o, t->adam_m[u] + o,
               t->adam_v[u] + o, ts[i].numel, (float)lr, (float)c->beta1, (float)c->beta2,
               (float)c->eps, ts[i].decay ? (float)c->weight_decay : 0.0f, (float)bc1,
               (float)bc2, gscale);
        }
    }
}

int trainer_step(trainer *t, step_stats *st, err_t *err) {
    double t0 = now_ms();
    if (load_samples(t, err) < 0) return err_prefix(err, "step %lld", (long long)t->step);
    for (int u = 0; u < t->n_units; u++) dev_zero(&t->dev, t->grads[u], t->numel[u]);
    forward_units(t);
    double loss = head_units(t);
    backward_units(t);
    double sumsq = 0;
    for (int u = 0; u < t->n_units; u++) sumsq += OP(&t->dev, sumsq, t->grads[u], t->numel[u]);
    double norm = sqrt(sumsq), lr = train_lr(&t->cfg, t->step);
    double coef = t->cfg.clip > 0 ? t->cfg.clip / (norm + 1e-6) : 1.0;
    optimizer_step(t, lr, coef < 1.0 ? (float)coef : 1.0f);
    t->dev.ops->sync(&t->dev);
    double ms = now_ms() - t0;
    *st = (step_stats){.step = t->step, .loss = loss, .lr = lr, .grad_norm = norm, .step_ms = ms,
                       .peak_bytes = t->dev.peak_bytes};
    st->samples_per_s = t->cfg.batch / (ms / 1e3);
    st->tokens_per_s = st->samples_per_s * t->tokens;
    t->step++;
    t->samples_seen += t->cfg.global_batch;
    return 0;
}

void trainer_get_params(trainer *t, int unit, float *out) {
    dev_download(&t->dev, out, t->params[unit], (size_t)t->numel[unit] * sizeof(float));
}

void trainer_get_grads(trainer *t, int unit, float *out) {
    dev_download(&t->dev, out, t->grads[unit], (size_t)t->numel[unit] * sizeof(float));
}
