/* wprofile.c - the measurements behind `cephalo-worker profile` and `profile-comm` (wprofile.h,
 * docs/profile.md); their command lines are worker/cmd/profile.c. */
#include "model/wprofile.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"
#include "common/clock.h"
#include "common/hostinfo.h"
#include "common/log.h"
#include "common/strutil.h"
#include "devices/device.h"
#include "model/wmodel.h"
#include "planner/arch.h"
#include "planner/engine_mem.h"
#include "planner/model.h"
#include "planner/profile_store.h"

#define MAX_REPS WPROF_MAX_REPS

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- compute ---------------------------------------------------------------------------- */

/* *_KEEP: the backward phase of recompute none (no second forward), timed after an untimed
 * forward left its intermediates */
typedef enum {
    OP_EMB_FWD, OP_EMB_BWD, OP_BLK_FWD, OP_BLK_BWD, OP_HEAD, OP_EMB_BWD_KEEP, OP_BLK_BWD_KEEP, N_OPS
} prof_op;

typedef struct prof_ctx {
    device dev;
    const model_spec *m;
    int seq, T, mb, n_units;
    bool cuda, copies;
    precision prec;
    double min_ms; /* least time spent per measurement */
    int min_reps;
    /* device */
    float *pslot[2], *gslot[2], *ax[2], *ay[2], *ady[2], *adx[2], *img;
    uint16_t *pbf[2];
    int32_t *ids, *tgt;
    double *sums; /* the step's loss and squared norm, as the trainer's (engine_compute_bytes) */
    wm_acts *acts;
    /* host */
    float *hx, *hy, *hdy, *hdx, *himg, *row_scale;
    int32_t *hids, *htgt;
    size_t act_bytes;
} prof_ctx;

static void up(prof_ctx *c, void *dst, const void *src, size_t bytes) {
    c->dev.ops->copy_async(&c->dev, dst, src, bytes, COPY_H2D, DEV_STREAM_COMPUTE);
}

static void down(prof_ctx *c, void *dst, const void *src, size_t bytes) {
    c->dev.ops->copy_async(&c->dev, dst, src, bytes, COPY_D2H, DEV_STREAM_COMPUTE);
}

static void upload_inputs(prof_ctx *c, bool targets) {
    int64_t rows = (int64_t)c->mb * c->T;
    if (arch_of(c->m->arch)->images) {
        int64_t img = (int64_t)c->m->channels * c->m->image * c->m->image;
        up(c, c->img, c->himg, (size_t)(c->mb * img) * 4);
        if (targets) up(c, c->tgt, c->htgt, (size_t)c->mb * 4);
        return;
    }
    up(c, c->ids, c->hids, (size_t)rows * 4);
    if (targets) up(c, c->tgt, c->htgt, (size_t)rows * 4);
}

/* One microbatch of one unit as the engine's step runs it (worker/model/train.c): the forward phase
 * (inputs in, forward, output out to the offload pool), the backward phase (checkpoint and output
 * gradient in, recompute, backward, input gradient out) and the fused head. */
static void run_op(prof_ctx *c, prof_op op) {
    device *d = &c->dev;
    const model_spec *m = c->m;
    wm_batch b = {.m = c->mb, .T = c->T, .ids = c->ids, .targets = c->tgt, .images = c->img,
                  .row_scale = c->row_scale};
    switch (op) {
    case OP_EMB_FWD:
        upload_inputs(c, false);
        wm_unit_forward(d, m, 0, c->pslot[0], &b, c->ax[0], c->ay[0], c->acts);
        if (c->copies) down(c, c->hy, c->ay[0], c->act_bytes);
        break;
    case OP_EMB_BWD:
        upload_inputs(c, false);
        if (c->copies) up(c, c->ady[0], c->hdy, c->act_bytes);
        wm_unit_forward(d, m, 0, c->pslot[0], &b, c->ax[0], c->ay[0], c->acts);
        wm_unit_backward(d, m, 0, c->pslot[0], c->gslot[0], &b, c->ax[0], c->ady[0], NULL, c->acts);
        break;
    case OP_BLK_FWD:
        if (c->copies) up(c, c->ax[0], c->hx, c->act_bytes);
        wm_unit_forward(d, m, 1, c->pslot[0], &b, c->ax[0], c->ay[0], c->acts);
        if (c->copies) down(c, c->hy, c->ay[0], c->act_bytes);
        break;
    case OP_BLK_BWD:
        if (c->copies) up(c, c->ax[0], c->hx, c->act_bytes), up(c, c->ady[0], c->hdy, c->act_bytes);
        wm_unit_forward(d, m, 1, c->pslot[0], &b, c->ax[0], c->ay[0], c->acts);
        wm_unit_backward(d, m, 1, c->pslot[0], c->gslot[0], &b, c->ax[0], c->ady[0], c->adx[0], c->acts);
        if (c->copies) down(c, c->hdx, c->adx[0], c->act_bytes);
        break;
    case OP_EMB_BWD_KEEP: /* train.c's backward_units with recompute none */
        upload_inputs(c, false);
        if (c->copies) up(c, c->ady[0], c->hdy, c->act_bytes);
        wm_unit_backward(d, m, 0, c->pslot[0], c->gslot[0], &b, c->ax[0], c->ady[0], NULL, c->acts);
        break;
    case OP_BLK_BWD_KEEP:
        if (c->copies) up(c, c->ax[0], c->hx, c->act_bytes), up(c, c->ady[0], c->hdy, c->act_bytes);
        wm_unit_backward(d, m, 1, c->pslot[0], c->gslot[0], &b, c->ax[0], c->ady[0], c->adx[0], c->acts);
        if (c->copies) down(c, c->hdx, c->adx[0], c->act_bytes);
        break;
    case OP_HEAD:
        upload_inputs(c, true);
        if (c->copies) up(c, c->ax[0], c->hx, c->act_bytes);
        wm_head_step(d, m, c->pslot[0], c->gslot[0], m->tied_head ? c->pslot[1] : NULL,
                     m->tied_head ? c->gslot[1] : NULL, &b, c->ax[0], c->adx[0], c->acts, &c->sums[0],
                     NULL);
        if (c->copies) down(c, c->hdx, c->adx[0], c->act_bytes);
        break;
    default: break;
    }
}

/* The time a repetition stands for. A GPU is the measurement's alone: the median, deaf to the
 * odd slow repetition. CPU devices are profiled several at once on shared cores (cephalo
 * profile), as they train: a repetition either ran through or was preempted for a scheduler
 * slice, and the median picks whichever happened more often (at 3 devices on 2 cores, a 7 ms op
 * measured 6.7 at one microbatch and 14 at the next). The mean is the share of the cores a step
 * gets. */
static double typical(const prof_ctx *c, double *v, int n) {
    if (c->cuda) return median(v, n);
    double s = 0;
    for (int i = 0; i < n; i++) s += v[i];
    return s / n;
}

/* The typical time of repetitions after a warm-up: at least min_reps of them and min_ms in all. */
static double time_op(prof_ctx *c, prof_op op) {
    double t[MAX_REPS];
    run_op(c, op);
    c->dev.ops->sync(&c->dev);
    double spent = 0;
    int n = 0;
    while (n < MAX_REPS && (n < c->min_reps || spent < c->min_ms)) {
        double t0 = clock_now_ms();
        run_op(c, op);
        c->dev.ops->sync(&c->dev);
        t[n] = clock_now_ms() - t0;
        spent += t[n++];
    }
    return typical(c, t, n);
}

/* As time_op for a *_KEEP op: each repetition first runs the forward op `fwd` untimed (it leaves
 * the intermediates the backward reads, as recompute none's forward does), then times `op`. */
static double time_keep(prof_ctx *c, prof_op fwd, prof_op op) {
    double t[MAX_REPS];
    run_op(c, fwd), run_op(c, op); /* warm-up */
    double spent = 0;
    int n = 0;
    while (n < MAX_REPS && (n < c->min_reps || spent < c->min_ms)) {
        run_op(c, fwd);
        c->dev.ops->sync(&c->dev);
        double t0 = clock_now_ms();
        run_op(c, op);
        c->dev.ops->sync(&c->dev);
        t[n] = clock_now_ms() - t0;
        spent += t[n++];
    }
    return typical(c, t, n);
}

static void *dalloc(prof_ctx *c, int64_t bytes, const char *what, bool *ok);

/* The step's per-parameter work outside the units (worker/model/train.c: zeroing the gradient shard,
 * its squared norm for the clipping norm, AdamW), in ms per million parameters, on a state of the
 * model's size (at most 8M parameters; halved while the device cannot hold it). 0 when even 64K
 * parameters do not fit. */
static double time_optimizer(prof_ctx *c) {
    device *d = &c->dev;
    int64_t n = model_params(c->m);
    if (n > (8 << 20)) n = 8 << 20;
    for (; n >= (64 << 10); n /= 2) {
        float *s[4] = {0};
        bool ok = true;
        for (int k = 0; k < 4; k++) s[k] = dalloc(c, n * 4, "optimizer state", &ok);
        double *sum = dalloc(c, sizeof(double), "squared norm", &ok);
        if (ok) {
            for (int k = 0; k < 4; k++) dev_zero(d, s[k], n);
            double t[MAX_REPS], spent = 0;
            int reps = 0;
            const dev_adamw step = dev_adamw_step(1e-4, 0.9, 0.95, 1e-8, 0.1, 1, 1.0f);
            for (int i = -1; i < MAX_REPS && (i < c->min_reps || spent < c->min_ms); i++) {
                double t0 = clock_now_ms();
                dev_zero(d, s[1], n);
                const float *g = s[1];
                d->ops->sumsq_multi(d, sum, 1, &g, &n);
                d->ops->adamw(d, s[0], s[1], s[2], s[3], n, &step);
                d->ops->sync(d);
                double ms = clock_now_ms() - t0;
                if (i >= 0) t[reps++] = ms, spent += ms;
            }
            for (int k = 0; k < 4; k++) dev_free(d, s[k]);
            dev_free(d, sum);
            return typical(c, t, reps) / ((double)n / 1e6);
        }
        for (int k = 0; k < 4; k++)
            if (s[k]) dev_free(d, s[k]);
        if (sum) dev_free(d, sum);
        d->err.msg[0] = 0;
    }
    return 0;
}

/* The unit's parameters into slot s (the embedding's into slot 1 for tied heads). */
static void load_unit(prof_ctx *c, int unit, int s) {
    int64_t n = model_unit_params(c->m, unit);
    float *h = xmalloc((size_t)n * sizeof(float));
    wm_init_range(c->m, unit, 1, 0, n, h);
    dev_upload(&c->dev, c->pslot[s], h, (size_t)n * sizeof(float));
    free(h);
}

static void *dalloc(prof_ctx *c, int64_t bytes, const char *what, bool *ok) {
    if (!*ok) return NULL;
    void *p = dev_alloc(&c->dev, (size_t)bytes, what);
    if (!p) *ok = false;
    return p;
}

/* host_alloc memory (page-locked on CUDA); NULL and *ok false when the system refuses. */
static void *halloc(prof_ctx *c, size_t bytes, bool *ok) {
    if (!*ok) return NULL;
    void *p = c->dev.ops->host_alloc(&c->dev, bytes);
    if (!p) *ok = false;
    return p;
}

static void free_buffers(prof_ctx *c) {
    device *d = &c->dev;
    if (c->acts) wm_acts_free(d, c->acts);
    c->acts = NULL;
    float **fs[] = {c->pslot, c->gslot, c->ax, c->ay, c->ady, c->adx};
    for (int k = 0; k < 6; k++)
        for (int s = 0; s < 2; s++)
            if (fs[k][s]) dev_free(d, fs[k][s]), fs[k][s] = NULL;
    for (int s = 0; s < 2; s++)
        if (c->pbf[s]) dev_free(d, c->pbf[s]), c->pbf[s] = NULL;
    if (c->ids) dev_free(d, c->ids), c->ids = NULL;
    if (c->tgt) dev_free(d, c->tgt), c->tgt = NULL;
    if (c->sums) dev_free(d, c->sums), c->sums = NULL;
    if (c->img) dev_free(d, c->img), c->img = NULL;
    void **hs[] = {(void **)&c->hx, (void **)&c->hy, (void **)&c->hdy, (void **)&c->hdx,
                   (void **)&c->himg, (void **)&c->hids, (void **)&c->htgt};
    for (int k = 0; k < 7; k++) d->ops->host_free(d, *hs[k]), *hs[k] = NULL;
    free(c->row_scale), c->row_scale = NULL;
}

/* Everything a sharded rank's engine allocates besides the training state, for microbatch mb
 * (engine_compute_bytes): false when the device cannot hold it. */
static bool alloc_buffers(prof_ctx *c, int mb, err_t *err) {
    const model_spec *m = c->m;
    c->mb = mb;
    int64_t rows = (int64_t)mb * c->T, act = rows * m->d_model;
    c->act_bytes = (size_t)act * 4;
    int64_t slot = engine_max_unit_params(m);
    bool ok = true;
    dev_set_context(&c->dev, "microbatch %d", mb);
    for (int s = 0; s < 2; s++) {
        c->pslot[s] = dalloc(c, slot * 4, "gathered parameters", &ok);
        c->gslot[s] = dalloc(c, slot * 4, "full gradients", &ok);
        if (precision_half(c->prec)) c->pbf[s] = dalloc(c, slot * 2, "16-bit gather buffer", &ok);
    }
    if (ok && (c->acts = wm_acts_new(&c->dev, m, mb, c->seq, RECOMPUTE_FULL, 1, c->prec, err)) == NULL) ok = false;
    int nbuf = c->cuda ? 2 : 1;
    for (int s = 0; s < nbuf; s++) {
        c->ax[s] = dalloc(c, act * 4, "unit input", &ok);
        c->ay[s] = dalloc(c, act * 4, "unit output", &ok);
        c->ady[s] = dalloc(c, act * 4, "output gradient", &ok);
        c->adx[s] = dalloc(c, act * 4, "input gradient", &ok);
    }
    c->ids = dalloc(c, rows * 4, "token ids", &ok);
    c->tgt = dalloc(c, rows * 4, "targets", &ok);
    c->sums = dalloc(c, ENGINE_STEP_SUMS * sizeof(double), "the step's sums", &ok);
    if (arch_of(m->arch)->images)
        c->img = dalloc(c, mb * (int64_t)m->channels * m->image * m->image * 4, "images", &ok);
    if (!ok) {
        if (!c->acts || c->dev.err.msg[0]) *err = c->dev.err;
        return false;
    }
    /* host side: the offload pool's entries and the step's samples, from host_alloc like the
     * trainer's (page-locked on CUDA), so that the copies measured are the asynchronous ones
     * training does (copy_async needs such memory: device.h) */
    int64_t img = arch_of(m->arch)->images ? (int64_t)m->channels * m->image * m->image : 0;
    c->hx = halloc(c, c->act_bytes, &ok), c->hy = halloc(c, c->act_bytes, &ok);
    c->hdy = halloc(c, c->act_bytes, &ok), c->hdx = halloc(c, c->act_bytes, &ok);
    c->hids = halloc(c, (size_t)rows * 4, &ok), c->htgt = halloc(c, (size_t)rows * 4, &ok);
    if (img) c->himg = halloc(c, (size_t)(mb * img) * 4, &ok);
    if (!ok) {
        err_set(err, "cannot allocate %zu bytes of page-locked host memory for the profile's "
                "copies", c->act_bytes * 4);
        return false;
    }
    c->row_scale = xmalloc((size_t)mb * sizeof(float));
    uint64_t r = 88172645463325252ull;
    for (int64_t i = 0; i < act; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        c->hx[i] = (float)((double)(r >> 11) / 9007199254740992.0 - 0.5);
        c->hdy[i] = c->hx[i] * 1e-3f;
    }
    int classes = arch_of(m->arch)->images ? m->n_classes : m->vocab;
    for (int64_t i = 0; i < rows; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        c->hids[i] = (int32_t)(r % (uint64_t)(m->vocab > 0 ? m->vocab : 1));
        c->htgt[i] = (int32_t)(r % (uint64_t)(classes > 0 ? classes : 1));
    }
    if (img) {
        for (int64_t i = 0; i < mb * img; i++) c->himg[i] = (float)((i * 7919) % 255) / 255.0f;
    }
    for (int i = 0; i < mb; i++) c->row_scale[i] = (float)(1.0 / ((double)mb * c->T));
    dev_upload(&c->dev, c->ax[0], c->hx, c->act_bytes);
    dev_upload(&c->dev, c->ady[0], c->hdy, c->act_bytes);
    dev_zero(&c->dev, c->gslot[0], slot);
    dev_zero(&c->dev, c->gslot[1], slot);
    return true;
}

static void fmt_eta(double s, char *buf, size_t n) {
    long t = (long)(s + 0.5);
    snprintf(buf, n, "%ld:%02ld", t / 60, t % 60);
}

/* The profile's one entry, with room for K points of each curve. */
static profile_entry *new_entry(profile *p, const wprof_opts *o, const model_spec *m, int seq, int K) {
    p->n_entries = 1;
    p->entries = xcalloc(1, sizeof *p->entries);
    profile_entry *e = &p->entries[0];
    snprintf(e->device, sizeof e->device, "%s", o->name);
    snprintf(e->model, sizeof e->model, "%s", m->name);
    e->seq = seq;
    e->prec = o->prec;
    e->microbatch = xcalloc((size_t)K, sizeof(int));
    profile_curve *curves[] = {&e->embedding, &e->block, &e->head};
    for (int k = 0; k < 3; k++) {
        curves[k]->present = true;
        curves[k]->fwd_ms = xcalloc((size_t)K, sizeof(double));
        curves[k]->bwd_ms = xcalloc((size_t)K, sizeof(double));
        /* the head's forward and backward are one fused op: no recompute to leave out */
        if (k < 2) curves[k]->bwd_keep_ms = xcalloc((size_t)K, sizeof(double));
    }
    e->compute_bytes = xcalloc((size_t)K, sizeof(double));
    return e;
}

/* Times every op at the microbatch the buffers were allocated for, t[N_OPS]. */
static void time_ops(prof_ctx *c, double *t) {
    load_unit(c, 0, 0);
    t[OP_EMB_FWD] = time_op(c, OP_EMB_FWD);
    t[OP_EMB_BWD] = time_op(c, OP_EMB_BWD);
    t[OP_EMB_BWD_KEEP] = time_keep(c, OP_EMB_FWD, OP_EMB_BWD_KEEP);
    load_unit(c, 1, 0);
    t[OP_BLK_FWD] = time_op(c, OP_BLK_FWD);
    t[OP_BLK_BWD] = time_op(c, OP_BLK_BWD);
    t[OP_BLK_BWD_KEEP] = time_keep(c, OP_BLK_FWD, OP_BLK_BWD_KEEP);
    load_unit(c, c->n_units - 1, 0);
    if (c->m->tied_head) load_unit(c, 0, 1);
    t[OP_HEAD] = time_op(c, OP_HEAD);
}

/* Point n of the curves from the ops' times, as the cost model's terms (planner/cost.c): the
 * forward phase adds emb fwd, L x block fwd and head fwd + bwd; the backward phase L x (block fwd +
 * block bwd) + emb bwd, so the block's bwd is its backward phase minus its forward, and the
 * embedding's bwd is its whole backward phase (its recompute included). bwd_keep (recompute none)
 * is the backward phase measured without the forward, for both. The head runs fused: 1/3 fwd,
 * 2/3 bwd. */
static void record_point(profile_entry *e, int n, int mb, const double *t, double bytes) {
    e->microbatch[n] = mb;
    e->embedding.fwd_ms[n] = t[OP_EMB_FWD];
    e->embedding.bwd_ms[n] = t[OP_EMB_BWD];
    e->block.fwd_ms[n] = t[OP_BLK_FWD];
    e->block.bwd_ms[n] = fmax(t[OP_BLK_BWD] - t[OP_BLK_FWD], 1e-6);
    e->embedding.bwd_keep_ms[n] = fmax(t[OP_EMB_BWD_KEEP], 1e-6);
    e->block.bwd_keep_ms[n] = fmax(t[OP_BLK_BWD_KEEP], 1e-6);
    e->head.fwd_ms[n] = t[OP_HEAD] / 3;
    e->head.bwd_ms[n] = t[OP_HEAD] * 2 / 3;
    e->compute_bytes[n] = bytes;
}

static void report_point(const profile_entry *e, int n, int K, const double *t, double start_ms) {
    char eta[48], mem[32];
    int mb = e->microbatch[n];
    double el = (clock_now_ms() - start_ms) / 1e3;
    /* time grows about linearly with the microbatch */
    double done = (double)mb * (mb + 1) / 2, all = (double)K * (K + 1) / 2;
    fmt_eta(el / done * (all - done), eta, sizeof eta);
    str_bytes(e->compute_bytes[n], mem, sizeof mem);
    fprintf(stderr, "profile: [%d/%d] microbatch %d: block fwd %.3f ms bwd %.3f ms (kept intermediates "
                    "%.3f ms), embedding %.3f/%.3f ms, head %.3f ms, compute memory %s | ETA %s\n",
            mb, K, mb, e->block.fwd_ms[n], e->block.bwd_ms[n], t[OP_BLK_BWD_KEEP], t[OP_EMB_FWD],
            t[OP_EMB_BWD], t[OP_HEAD], mem, eta);
}

/* Microbatch 1..K until one does not fit the device: e's points. */
static int sweep(prof_ctx *c, const wprof_opts *o, profile_entry *e, int K, err_t *err) {
    double start = clock_now_ms();
    int n = 0;
    for (int mb = 1; mb <= K; mb++, n++) {
        int64_t base = c->dev.cur_bytes;
        c->dev.peak_bytes = base;
        err_t aerr = {0};
        if (!alloc_buffers(c, mb, &aerr)) {
            free_buffers(c);
            if (mb == 1)
                return err_set(err, "the device cannot hold the compute memory of microbatch 1: %s",
                               aerr.msg[0] ? aerr.msg : c->dev.err.msg);
            if (!o->quiet) fprintf(stderr, "profile: microbatch %d does not fit the device's memory; the sweep ends at %d\n", mb, mb - 1);
            break;
        }
        double t[N_OPS], bytes = (double)(c->dev.peak_bytes - base);
        time_ops(c, t);
        free_buffers(c);
        record_point(e, n, mb, t, bytes);
        if (!o->quiet) report_point(e, n, K, t, start);
    }
    e->n_points = n;
    return 0;
}

int wprof_compute(const wprof_opts *o, const model_spec *mspec, int seq, err_t *err) {
    model_spec model = *mspec;
    bool cuda = !strcmp(o->device, "cuda");
    prof_ctx c = {.m = &model, .seq = arch_of(model.arch)->images ? 0 : seq, .cuda = cuda, .copies = !cuda,
                  .min_ms = o->min_ms, .min_reps = 3, .n_units = model_n_units(&model)};
    c.T = model_tokens(&model, c.seq);
    if (device_open(&c.dev, o->device, 0, (int)o->threads, (int)o->gpu, o->memory, err) < 0) return -1;
    c.prec = o->prec;
    c.dev.matmul = dev_matmul_for(o->prec, cuda);
    int K = (int)o->max_micro;
    profile p = {0};
    profile_entry *e = new_entry(&p, o, &model, seq, K);
    if (!o->quiet)
        fprintf(stderr, "profile: %s on %s (%s%s%ld thread%s): per-unit times and compute memory at microbatch 1..%d\n",
                model.name, o->name, o->device, cuda ? "" : ", ", cuda ? 0L : o->threads, o->threads == 1 ? "" : "s", K);
    int rc = sweep(&c, o, e, K, err);
    if (!rc) {
        e->optimizer_ms_per_mparam = time_optimizer(&c);
        if (!o->quiet && e->optimizer_ms_per_mparam > 0)
            fprintf(stderr, "profile: optimizer step (zero + norm + AdamW) %.3f ms per million parameters\n",
                    e->optimizer_ms_per_mparam);
        rc = profile_save(&p, o->out, err);
    }
    profile_free(&p);
    device_close(&c.dev);
    return rc < 0 ? -1 : 0;
}

/* ---- collectives ------------------------------------------------------------------------- */

/* Rank r's count for `total` elements, even, or with rank 0 holding twice the others' share. */
static void shard_counts(int64_t total, int world, bool uneven, int64_t *counts) {
    int64_t share = total / (world + (uneven ? 1 : 0)), used = 0;
    for (int r = 0; r < world; r++) {
        counts[r] = (uneven && r == 0) ? 2 * share : share;
        used += counts[r];
    }
    counts[world - 1] += total - used;
}

/* CPU time of this process (the waiting main thread uses next to none: it is the communicator's). */
static double process_cpu_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Median over repetitions of the slowest rank's time of one collective; with cpu_out, also the
 * median of the ranks' mean CPU time (the work the communicator takes from the cores, which
 * competes with compute where the devices' threads fill the host). */
static int time_collective(comm *cm, int world, bool rs, float *buf, const int64_t *counts, int reps,
                           double *out, double *cpu_out, err_t *err) {
    double t[MAX_REPS], cpu[MAX_REPS];
    double *all = xcalloc((size_t)(2 * world), sizeof(double));
    int rank = comm_rank(cm), rc = 0;
    for (int i = -1; i < reps && !rc; i++) {
        rc = comm_run(cm, comm_barrier(cm, "profile"), err);
        double t0 = clock_now_ms(), c0 = process_cpu_ms();
        if (!rc)
            rc = comm_run(cm, rs ? comm_reduce_scatterv(cm, buf, counts, COMM_F32, "profile")
                                 : comm_allgatherv(cm, buf, counts, COMM_F32, "profile"),
                          err);
        double ms = clock_now_ms() - t0, cms = process_cpu_ms() - c0;
        memset(all, 0, (size_t)(2 * world) * sizeof(double));
        all[rank] = ms;
        all[world + rank] = cms;
        if (!rc) rc = comm_run(cm, comm_allreduce(cm, all, 2 * world, COMM_F64, "profile times"), err);
        double worst = 0, csum = 0;
        for (int r = 0; r < world; r++) worst = fmax(worst, all[r]), csum += all[world + r];
        if (i >= 0) t[i] = worst, cpu[i] = csum / world;
    }
    free(all);
    if (rc) return -1;
    *out = median(t, reps);
    if (cpu_out) *cpu_out = median(cpu, reps);
    return 0;
}

int wprof_comm(comm *cm, const wprof_comm_opts *o, err_t *err) {
    int64_t lo = o->min_bytes, hi = o->max_bytes;
    int world = comm_world(cm), rank = comm_rank(cm), reps = o->reps;
    int n = 0;
    for (int64_t b = lo; b <= hi; b *= 4) n++;
    profile p = {0};
    p.n_comm = 2;
    p.comm = xcalloc(2, sizeof *p.comm);
    for (int k = 0; k < 2; k++) {
        p.comm[k] = (profile_comm){.world = (int)world, .reduce_scatter = k == 1, .n_points = n,
                                   .bytes = xcalloc((size_t)n, sizeof(double)), .ms = xcalloc((size_t)n, sizeof(double)),
                                   .uneven_ms = xcalloc((size_t)n, sizeof(double)),
                                   .cpu_ms = xcalloc((size_t)n, sizeof(double)), .host_cores = host_cores()};
    }
    int64_t *counts = xcalloc((size_t)world, sizeof(int64_t));
    float *buf = xcalloc((size_t)(hi / 4 + 1), sizeof(float));
    int rc = 0, i = 0;
    for (int64_t b = lo; b <= hi && !rc; b *= 4, i++) {
        for (int k = 0; k < 2 && !rc; k++) {
            profile_comm *pc = &p.comm[k];
            pc->bytes[i] = (double)b;
            shard_counts(b / 4, (int)world, false, counts);
            rc = time_collective(cm, world, k == 1, buf, counts, reps, &pc->ms[i], &pc->cpu_ms[i], err);
            shard_counts(b / 4, world, true, counts);
            if (!rc) rc = time_collective(cm, world, k == 1, buf, counts, reps, &pc->uneven_ms[i], NULL, err);
        }
        if (!rc && rank == 0)
            fprintf(stderr, "profile: collectives over %d ranks, %lld KiB: allgather %.3f ms (uneven %.3f), "
                            "reduce-scatter %.3f ms (uneven %.3f)\n",
                    world, (long long)(b >> 10), p.comm[0].ms[i], p.comm[0].uneven_ms[i], p.comm[1].ms[i],
                    p.comm[1].uneven_ms[i]);
    }
    if (!rc && rank == 0) rc = profile_save(&p, o->out, err);
    free(counts), free(buf);
    profile_free(&p);
    return rc < 0 ? -1 : 0;
}
