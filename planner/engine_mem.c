/* engine_mem.c - the trainer's device memory, shared by the planner's prediction and the
 * engine's allocations (see engine_mem.h). */
#include "planner/engine_mem.h"

#include "planner/arch.h"
#include "planner/cost.h"

#include "common/env.h"

#include <stdlib.h>
#include <string.h>

int engine_qkv_width(const model_spec *m) {
    int hd = m->d_model / m->n_head;
    return (m->n_head + 2 * m->n_kv_head) * hd;
}

int engine_wide(const model_spec *m) { return m->d_ff > m->d_model ? m->d_ff : m->d_model; }

static int64_t head_logits_bytes = ENGINE_HEAD_LOGITS_BYTES;

void engine_set_head_logits_bytes(int64_t bytes) {
    head_logits_bytes = bytes > 0 ? bytes : ENGINE_HEAD_LOGITS_BYTES;
}

/* The switches the planner and the worker both read from the environment through common/env.c's
 * rows, once each (a test sets them with engine_set_*: 1 on, 0 off, -1 from the environment
 * again). on: the row's value that turns the switch on. */
typedef struct env_switch {
    const char *var, *on;
    int state; /* -1: not read yet */
} env_switch;

static env_switch vocab_pad = {"CEPHALO_VOCAB_PAD", "1", -1}, adamw_half = {"CEPHALO_ADAMW", "half", -1},
                  acts16 = {"CEPHALO_ACTS", "16", -1};

static bool switch_on(env_switch *s) {
    /* NULL: the program's entry has checked the environment (env_entry), and cost_build and the
     * worker check these three again before reading them (engine_env_check) */
    if (s->state < 0) s->state = strcmp(env_word(s->var, NULL), s->on) == 0;
    return s->state == 1;
}

void engine_set_vocab_pad(int on) { vocab_pad.state = on; }
void engine_set_adamw_half(int on) { adamw_half.state = on; }
void engine_set_acts16(int on) { acts16.state = on; }

int engine_state_bytes_per_param(precision prec) {
    return STATE_BYTES_PER_PARAM + (switch_on(&adamw_half) && precision_half(prec) ? 2 : 0);
}

bool engine_acts16(precision prec) { return switch_on(&acts16) && precision_half(prec); }

int engine_env_check(err_t *err) {
    const env_switch *all[] = {&adamw_half, &acts16, &vocab_pad};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (env_check(all[i]->var, err) < 0) return -1;
    return 0;
}

int engine_vocab_ld(const model_spec *m) {
    bool no_bias = arch_of(m->arch)->head == HEAD_LM; /* padded columns would need a padded bias */
    if (!no_bias || !switch_on(&vocab_pad)) return m->vocab;
    return (m->vocab + ENGINE_VOCAB_ALIGN - 1) / ENGINE_VOCAB_ALIGN * ENGINE_VOCAB_ALIGN;
}

engine_switches engine_switches_of(const model_spec *m, precision prec) {
    return (engine_switches){engine_state_bytes_per_param(prec), engine_acts16(prec) ? 16 : 32,
                             engine_vocab_ld(m)};
}

static int switch_differs(err_t *err, const char *field, int plan, int here, const char *var) {
    return err_set(err, "inputs.engine.%s is %d but %d in this worker's environment: the plan was made with "
                        "another $%s, and its predicted memory counts that; give the workers the planner's "
                        "environment, or plan again",
                   field, plan, here, var);
}

int engine_switches_check(const engine_switches *plan, const engine_switches *here, err_t *err) {
    if (plan->state_bytes_per_param != here->state_bytes_per_param)
        return switch_differs(err, "state_bytes_per_param", plan->state_bytes_per_param,
                              here->state_bytes_per_param, "CEPHALO_ADAMW");
    if (plan->activation_bits != here->activation_bits)
        return switch_differs(err, "activation_bits", plan->activation_bits, here->activation_bits, "CEPHALO_ACTS");
    if (plan->logits_row_stride != here->logits_row_stride)
        return switch_differs(err, "logits_row_stride", plan->logits_row_stride, here->logits_row_stride,
                              "CEPHALO_VOCAB_PAD");
    return 0;
}

int64_t engine_head_chunk_rows(const model_spec *m, int micro, int T) {
    int64_t rows = (int64_t)micro * T;
    /* from V, not the padded stride: the chunks (and so the order of the head's weight-gradient
     * sums) are the same with and without vocabulary padding */
    int64_t fit = head_logits_bytes / ((int64_t)m->vocab * 4);
    if (fit >= 64) fit -= fit % 64; /* whole tiles for the GEMMs */
    if (fit < 1) fit = 1;
    return rows < fit ? rows : fit;
}

static int vit_patches(const model_spec *m) { return (m->image / m->patch) * (m->image / m->patch); }
static int patch_dim(const model_spec *m) { return m->channels * m->patch * m->patch; }

engine_workspace engine_workspace_floats(const model_spec *m, int max_m, int seq) {
    int T = model_tokens(m, seq);
    int64_t N = (int64_t)max_m * T;
    bool vit = arch_of(m->arch)->head == HEAD_CLASSIFIER; /* one row of logits per sample */
    engine_workspace w = {0};
    w.nd = N * m->d_model;
    w.nq = N * engine_qkv_width(m);
    w.nf = N * engine_wide(m);
    w.nstat = N;
    w.nlse = (int64_t)max_m * m->n_head * T;
    /* the fused head computes the logits of the whole microbatch, or of a chunk of its rows
     * when those would exceed ENGINE_HEAD_LOGITS_BYTES */
    int64_t chunk = vit ? 0 : engine_head_chunk_rows(m, max_m, T);
    w.nlogits = vit ? (int64_t)max_m * m->n_classes : chunk * engine_vocab_ld(m);
    w.nloss = vit ? max_m : chunk;
    w.npatch = vit ? (int64_t)max_m * vit_patches(m) * patch_dim(m) : 0;
    w.nrows = vit ? (int64_t)max_m * m->d_model : 0;
    return w;
}

int64_t engine_saved_floats(const engine_workspace *w, engine_saved s) {
    switch (s) {
    case ES_LN1: case ES_ATT: case ES_X2: case ES_LN2: return w->nd;
    case ES_MEAN1: case ES_RSTD1: case ES_MEAN2: case ES_RSTD2: return w->nstat;
    case ES_QKV: return w->nq;
    case ES_LSE: return w->nlse;
    case ES_FC: case ES_ACT: case ES_UP: return w->nf;
    case ES_PATCHES: return w->npatch;
    case ES_COUNT: break;
    }
    return 0;
}

#define B(s) (1u << (s))

/* Read from the forward and backward code of worker/model/wmodel.c: what each unit kind's
 * forward leaves for its backward (the head's forward and backward run together). */
unsigned engine_saved_mask(const model_spec *m, unit_kind k) {
    const arch_desc *a = arch_of(m->arch);
    bool rms = a->norm == NORM_RMS; /* no mean */
    unsigned norm1 = B(ES_LN1) | B(ES_RSTD1) | (rms ? 0 : B(ES_MEAN1));
    switch (k) {
    case UNIT_EMBEDDING:
        if (a->embed_norm) return B(ES_X2) | B(ES_MEAN1) | B(ES_RSTD1); /* the embedding's LN */
        return a->images ? B(ES_PATCHES) : 0; /* a lookup needs only the ids */
    case UNIT_BLOCK:
        return norm1 | B(ES_QKV) | B(ES_ATT) | B(ES_LSE) | B(ES_X2) | B(ES_LN2) | B(ES_RSTD2) |
               (a->mlp == MLP_SWIGLU ? B(ES_UP) : 0) | (rms ? 0 : B(ES_MEAN2)) | B(ES_FC) | B(ES_ACT);
    case UNIT_HEAD: return norm1 | (a->head == HEAD_MLM ? B(ES_FC) | B(ES_ACT) : 0);
    }
    return 0;
}

/* The saved buffers that hold 16-bit values with 16-bit activations (BERT's ln1 and ln2 hold its
 * residual stream and stay fp32). */
static unsigned saved_half_mask(const model_spec *m) {
    unsigned mask = B(ES_QKV) | B(ES_ATT) | B(ES_FC) | B(ES_ACT) | B(ES_UP) | B(ES_PATCHES);
    /* BERT's post-LN blocks keep the residual stream in ln1 and ln2 */
    return arch_of(m->arch)->post_ln ? mask : mask | B(ES_LN1) | B(ES_LN2);
}

unsigned engine_acts16_work_mask(const model_spec *m, recompute_mode r, precision prec) {
    if (r != RECOMPUTE_NONE || !engine_acts16(prec)) return 0;
    return saved_half_mask(m) &
           (engine_saved_mask(m, UNIT_EMBEDDING) | engine_saved_mask(m, UNIT_BLOCK));
}

static int kept_of(int kept) { return kept > 0 ? kept : 1; }

int engine_saved_sets(const model_spec *m, recompute_mode r, int kept) {
    return r == RECOMPUTE_FULL ? 1 : 1 + (model_n_units(m) - 1) * kept_of(kept);
}

unsigned engine_saved_set_mask(const model_spec *m, recompute_mode r, int kept, int set) {
    if (r == RECOMPUTE_FULL)
        return engine_saved_mask(m, UNIT_EMBEDDING) | engine_saved_mask(m, UNIT_BLOCK) |
               engine_saved_mask(m, UNIT_HEAD);
    if (set == 0) return engine_saved_mask(m, UNIT_HEAD);
    return engine_saved_mask(m, model_unit_kind(m, (set - 1) / kept_of(kept)));
}

int engine_saved_set_of(const model_spec *m, recompute_mode r, int kept, int unit, int j) {
    if (r == RECOMPUTE_FULL || unit == model_n_units(m) - 1) return 0;
    return 1 + unit * kept_of(kept) + j;
}

int64_t engine_saved_bytes(const model_spec *m, const engine_workspace *w, recompute_mode r,
                           precision prec, int set, engine_saved s) {
    bool half = set > 0 && (engine_acts16_work_mask(m, r, prec) >> s & 1);
    return engine_saved_floats(w, s) * (half ? 2 : 4);
}

int64_t engine_workspace_bytes(const model_spec *m, int max_m, int seq, recompute_mode r, int kept,
                               precision prec) {
    engine_workspace w = engine_workspace_floats(m, max_m, seq);
    bool llama = arch_of(m->arch)->mlp == MLP_SWIGLU;
    /* scratch: the gradients of the attention output, residual and norm (nd), of q|k|v (nq), of
     * the MLP hidden and activation (Llama: and of the up projection), one chunk of logits and
     * its row losses, the ViT class-token rows */
    int64_t bytes = 4 * (3 * w.nd + w.nq + (llama ? 3 : 2) * w.nf + w.nlogits + w.nloss + w.nrows);
    for (int set = 0; set < engine_saved_sets(m, r, kept); set++) {
        unsigned mask = engine_saved_set_mask(m, r, kept, set);
        for (int b = 0; b < ES_COUNT; b++)
            if (mask & B(b)) bytes += engine_saved_bytes(m, &w, r, prec, set, (engine_saved)b);
    }
    /* 16-bit kept sets: the fp32 copy the unit at work computes in */
    unsigned work = engine_acts16_work_mask(m, r, prec);
    for (int b = 0; b < ES_COUNT; b++)
        if (work & B(b)) bytes += 4 * engine_saved_floats(&w, (engine_saved)b);
    return bytes;
}

int64_t engine_head_bytes(const model_spec *m, int seq, int micro) {
    engine_workspace w = engine_workspace_floats(m, micro, seq);
    return (w.nlogits + w.nloss) * 4;
}

int64_t engine_max_unit_params(const model_spec *m) {
    int64_t max = 0;
    for (int u = 0; u < model_n_units(m); u++)
        if (model_unit_params(m, u) > max) max = model_unit_params(m, u);
    return max;
}

int64_t engine_compute_bytes(const model_spec *m, int seq, int micro, engine_opts o) {
    int64_t rows = (int64_t)micro * model_tokens(m, seq);
    int64_t bytes = engine_workspace_bytes(m, micro, seq, o.recompute, o.kept, o.prec);
    /* unit input, output, output and input gradients */
    bytes += (o.double_buffer ? 8 : 4) * rows * m->d_model * 4;
    bytes += 2 * rows * 4; /* token ids and targets (int32) */
    bytes += ENGINE_STEP_SUMS * (int64_t)sizeof(double);
    if (arch_of(m->arch)->images) bytes += (int64_t)micro * m->channels * m->image * m->image * 4;
    int64_t slot = engine_max_unit_params(m);
    bool half = precision_half(o.prec);
    if (o.sharded || half) bytes += 2 * slot * 4; /* gathered parameters */
    if (o.sharded) bytes += 2 * slot * 4;         /* full gradients */
    if (half) bytes += 2 * slot * 2;              /* bf16/fp16 gather buffers */
    return bytes;
}
