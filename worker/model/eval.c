/* eval.c - the validation loss of a training run (--val-data) and of a checkpoint
 * (`cephalo-worker eval`, worker/cmd/eval.c): eval.h has the rule for the samples and their split
 * over the ranks.
 *
 * The forward is the trainer's own (trainer_forward_loss): the same units, gathers and offload
 * pool as a step, on the buffers a step uses, so evaluation needs no memory beyond the
 * validation source. Rows are weighted 1, so the head returns the plain sum of the target losses;
 * padding rows have no target (-1) and add nothing. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/worker_cmd.h"
#include "model/eval.h"
#include "model/fsdp.h"
#include "planner/arch.h"

struct evaluator {
    data_source *data;
    char *spec; /* --val-data as given: the summary names it whole */
    int64_t n;      /* validation samples, all ranks together */
    long every;     /* steps between evaluations; 0: after the last step only */
    int64_t lo, hi; /* this rank's samples [lo, hi) */
    int rounds;     /* of at most one batch each, the same on every rank */
    double targets; /* of the last evaluation, all ranks together */
};

const data_source *eval_source(const evaluator *ev) { return ev->data; }

static int open_source(const trainer *t, const char *spec, data_source **out, err_t *err) {
    const model_spec *m = &t->cfg.model;
    bool synthetic = !strcmp(spec, "synthetic");
    if (arch_of(m->arch)->images)
        return synthetic ? data_open_synthetic_images(out, m->channels, m->image, m->n_classes, EVAL_SEED, err)
                         : data_open_images(out, spec, m->channels, m->image, m->n_classes, EVAL_SEED, err);
    data_task task = data_task_of(arch_of(m->arch)->task);
    return synthetic ? data_open_synthetic_tokens(out, t->cfg.seq, m->vocab, task, EVAL_SEED, err)
                     : data_open_tokens(out, spec, DATA_VALIDATION, t->cfg.seq, m->vocab, task, EVAL_SEED, err);
}

/* Validation sample s into row i of the trainer's host arrays (its targets counted), or, for
 * s < 0, a padding row without a target. */
static int put_sample(const evaluator *ev, trainer *t, int64_t s, int i, double *targets, err_t *err) {
    const model_spec *m = &t->cfg.model;
    t->row_scale[i] = 1;
    if (arch_of(m->arch)->images) {
        int64_t img = (int64_t)m->channels * m->image * m->image;
        if (s < 0) {
            memset(t->img_host + i * img, 0, (size_t)img * sizeof(float));
            t->tgt_host[i] = -1;
            return 0;
        }
        *targets += 1;
        return data_get_image(ev->data, s, t->img_host + i * img, t->tgt_host + i, err);
    }
    int T = t->tokens;
    int32_t *ids = t->ids_host + (int64_t)i * T, *tgt = t->tgt_host + (int64_t)i * T;
    if (s < 0) {
        memset(ids, 0, (size_t)T * sizeof(int32_t));
        for (int k = 0; k < T; k++) tgt[k] = -1;
        return 0;
    }
    if (data_get_tokens(ev->data, s, ids, tgt, err) < 0) return -1;
    for (int k = 0; k < T; k++) *targets += tgt[k] >= 0;
    return 0;
}

/* Round k's samples of this rank into the host arrays; *micros gets the microbatches they fill. */
static int load_round(const evaluator *ev, trainer *t, int k, int *micros, double *targets, err_t *err) {
    int b = t->cfg.batch, m = t->cfg.micro;
    int64_t first = ev->lo + (int64_t)k * b, end = first + b < ev->hi ? first + b : ev->hi;
    int count = end > first ? (int)(end - first) : 0;
    *micros = (count + m - 1) / m;
    for (int i = 0; i < *micros * m; i++)
        if (put_sample(ev, t, i < count ? first + i : -1, i, targets, err) < 0) return -1;
    return 0;
}

/* A validation set has a loss only if it has a target that counts: loss-masked shards whose mask
 * is 0 on every target of the N samples have nothing to score, and are refused at the start (exit
 * 2) rather than giving a loss of 0/0. Every rank counts all N samples from the masks (no
 * communication, the same answer everywhere); unmasked sources always have targets (CLM every next
 * token, MLM at least one a sample, ViT the labels). */
static int check_scored(const evaluator *ev, const char *flag, err_t *err) {
    if (!data_has_loss_mask(ev->data)) return 0;
    for (int64_t s = 0; s < ev->n; s++) {
        int64_t n;
        if (data_sample_targets(ev->data, s, &n, err) < 0) return -1;
        if (n > 0) return 0;
    }
    return err_set(err, "%s %s: the %lld validation sample%s %s no target that counts (every loss-mask byte of %s "
                        "targets is 0): nothing to score; give shards with response tokens%s",
                   flag, ev->spec, (long long)ev->n, ev->n == 1 ? "" : "s", ev->n == 1 ? "has" : "have",
                   ev->n == 1 ? "its" : "their", ev->n < data_num_samples(ev->data) ? ", or more samples" : "");
}

evaluator *eval_open(trainer *t, const eval_opts *o, err_t *err) {
    err->msg[0] = '\0';
    if (!o->data) {
        if (o->every >= 0 || o->samples > 0) err_set(err, "%s needs --val-data (the validation shards)", o->every >= 0 ? "--val-every" : "--val-samples");
        return NULL;
    }
    evaluator *ev = xcalloc(1, sizeof *ev);
    ev->spec = xstrdup(o->data);
    const char *flag = o->flag ? o->flag : "--val-data";
    if (open_source(t, o->data, &ev->data, err) < 0) {
        err_prefix(err, "%s", flag);
        free(ev->spec);
        free(ev);
        return NULL;
    }
    const train_config *c = &t->cfg;
    int64_t want = o->samples > 0 ? o->samples : wcmd_default_long(WCMD_VAL_SAMPLES), have = data_num_samples(ev->data);
    ev->n = want < have ? want : have; /* every sample once */
    long dflt = (long)(c->steps / 10 < 100 ? c->steps / 10 : 100);
    ev->every = o->every >= 0 ? o->every : dflt > 0 ? dflt : 1;
    int64_t B = c->global_batch;
    ev->lo = ev->n * c->sample_offset / B;
    ev->hi = ev->n * (c->sample_offset + c->batch) / B;
    /* this rank's share is at most ceil(n * b / B) <= b * ceil(n / B) samples */
    ev->rounds = (int)((ev->n + B - 1) / B);
    /* read this rank's samples once now: a bad token fails the start, not step 10000 */
    double targets = 0;
    for (int k = 0; k < ev->rounds; k++) {
        int micros;
        if (load_round(ev, t, k, &micros, &targets, err) < 0) {
            err_prefix(err, "%s", flag);
            eval_close(ev);
            return NULL;
        }
    }
    if (check_scored(ev, flag, err) < 0) {
        eval_close(ev);
        return NULL;
    }
    return ev;
}

void eval_close(evaluator *ev) {
    if (!ev) return;
    data_close(ev->data);
    free(ev->spec);
    free(ev);
}

bool eval_due(const evaluator *ev, const trainer *t) {
    if (!ev || t->step <= 0) return false;
    return t->step == t->cfg.steps || (ev->every > 0 && t->step % ev->every == 0);
}

int eval_loss(evaluator *ev, trainer *t, double *loss, err_t *err) {
    double v[2] = {0, 0}; /* the sum of the target losses, the targets */
    for (int k = 0; k < ev->rounds; k++) {
        int micros;
        if (load_round(ev, t, k, &micros, &v[1], err) < 0 || trainer_forward_loss(t, micros, &v[0], err) < 0)
            return err_prefix(err, "validation after step %lld", (long long)t->step);
    }
    if (fsdp_allreduce_sums(t, v, 2, err) < 0) return err_prefix(err, "validation after step %lld", (long long)t->step);
    ev->targets = v[1];
    if (v[1] == 0) /* eval_open refused such a set; a mean over no target is no loss */
        return err_set(err, "validation after step %lld: no target counted", (long long)t->step);
    *loss = v[0] / v[1];
    return 0;
}

void eval_describe(const evaluator *ev, char *buf, size_t n) {
    char desc[400];
    data_describe(ev->data, desc, sizeof desc);
    char every[48];
    if (ev->every) snprintf(every, sizeof every, "every %ld steps and after the last", ev->every);
    else snprintf(every, sizeof every, "after the last step");
    snprintf(buf, n, "%lld samples (this rank: %lld), %s; %s", (long long)ev->n, (long long)(ev->hi - ev->lo), every, desc);
}

/* ---- cephalo-worker eval ---- */

eval_summary eval_summary_of(const evaluator *ev) {
    return (eval_summary){.samples = ev->n, .targets = ev->targets, .data = ev->spec};
}
