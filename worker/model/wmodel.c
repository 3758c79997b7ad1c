/* wmodel.c - forward and backward of each unit kind, written once against the device op table.
 *
 * Shapes: N = m*T rows (tokens of the microbatch), d = width, ff = MLP width, qw = width of the
 * fused q|k|v projection. Every unit's intermediates live in one workspace (wm_acts) sized for
 * the largest microbatch; the backward reads what the (re)computed forward left there. */
#include <math.h>
#include <string.h>

#include "common/log.h"
#include "model/wmodel.h"
#include "planner/arch.h"
#include "planner/engine_mem.h"

#define OP(d, name, ...) ((d)->ops->name((d), __VA_ARGS__))

struct wm_acts {
    int max_m, T;
    /* the tensor layout of each unit kind, listed once (W() looks names up here) */
    wm_tensor layout[3][WM_MAX_TENSORS];
    int n_layout[3];
    /* forward intermediates: the saved set selected last (wm_acts_select), read by the code below */
    float *ln1, *mean1, *rstd1, *qkv, *att, *lse, *x2, *ln2, *mean2, *rstd2, *fc, *act, *up;
    float *patches;
    /* backward scratch, shared by every unit and microbatch */
    float *dqkv, *datt, *dx2, *dln, *dact, *dfc, *dup;
    /* head and embedding extras */
    float *logits, *losses, *rows;
    float *inv_freq; /* Llama: the RoPE frequencies [hd/2], host (model_rope_inv_freq) */
    /* the saved sets (planner/engine_mem.h): [n_sets][ES_COUNT], NULL where a set has no such
     * buffer; one with recompute full, one per (unit, kept microbatch) with none. With 16-bit
     * activations and none, the buffers of work_mask are 2-byte values in the sets after 0 and
     * the unit at work computes in work[] (fp32): its forward ends by storing them there, its
     * backward starts by widening them back (move16). */
    recompute_mode recompute;
    int kept, n_sets, seq;
    void **sets;
    precision act16; /* 16-bit activations (engine_acts16): the run's PREC_BF16/PREC_FP16, which
                      * the units round to; PREC_FP32 when off */
    unsigned work_mask;
    float *work[ES_COUNT];
    int set; /* the set selected last */
};

/* ---- shapes (the sizes live in planner/engine_mem.c, which the planner predicts from) ---- */

static int qkv_width(const model_spec *m) { return engine_qkv_width(m); }
static int vit_patches(const model_spec *m) { return (m->image / m->patch) * (m->image / m->patch); }
static int patch_dim(const model_spec *m) { return m->channels * m->patch * m->patch; }

/* The field a saved buffer of kind s is read through. */
static float **saved_field(wm_acts *a, engine_saved s) {
    float **f[ES_COUNT] = {[ES_LN1] = &a->ln1,   [ES_MEAN1] = &a->mean1, [ES_RSTD1] = &a->rstd1,
                           [ES_QKV] = &a->qkv,   [ES_ATT] = &a->att,     [ES_LSE] = &a->lse,
                           [ES_X2] = &a->x2,     [ES_LN2] = &a->ln2,     [ES_MEAN2] = &a->mean2,
                           [ES_RSTD2] = &a->rstd2, [ES_FC] = &a->fc,     [ES_ACT] = &a->act,
                           [ES_UP] = &a->up,     [ES_PATCHES] = &a->patches};
    return f[s];
}

/* Every saved buffer of every set, as the planner counts them (engine_workspace_bytes). */
static int alloc_sets(device *d, const model_spec *m, const engine_workspace *p, wm_acts *a, err_t *err) {
    static const char *const what[ES_COUNT] = {
        "norm output", "norm mean", "norm rstd", "q|k|v", "attention output", "attention log-sum-exp",
        "residual", "norm output", "norm mean", "norm rstd", "MLP hidden", "MLP activation",
        "MLP up", "image patches"};
    a->n_sets = engine_saved_sets(m, a->recompute, a->kept);
    a->sets = xcalloc((size_t)a->n_sets * ES_COUNT, sizeof *a->sets);
    for (int set = 0; set < a->n_sets; set++) {
        unsigned mask = engine_saved_set_mask(m, a->recompute, a->kept, set);
        for (int s = 0; s < ES_COUNT; s++) {
            int64_t bytes = engine_saved_bytes(m, p, a->recompute, a->act16, set, (engine_saved)s);
            if (!(mask >> s & 1) || bytes == 0) continue;
            void **dst = &a->sets[(size_t)set * ES_COUNT + s];
            if (!(*dst = dev_alloc(d, (size_t)bytes, what[s]))) return *err = d->err, -1;
        }
    }
    for (int s = 0; s < ES_COUNT; s++) {
        int64_t n = engine_saved_floats(p, (engine_saved)s);
        if (!(a->work_mask >> s & 1) || n == 0) continue;
        if (!(a->work[s] = dev_alloc_f(d, n, what[s]))) return *err = d->err, -1;
    }
    return 0;
}

wm_acts *wm_acts_new(device *d, const model_spec *m, int max_m, int seq, recompute_mode recompute,
                     int kept, precision prec, err_t *err) {
    engine_workspace p = engine_workspace_floats(m, max_m, seq);
    bool rope = arch_of(m->arch)->pos == POS_ROPE, swiglu = arch_of(m->arch)->mlp == MLP_SWIGLU;
    wm_acts *a = xcalloc(1, sizeof *a);
    a->max_m = max_m;
    a->T = model_tokens(m, seq);
    a->recompute = recompute;
    a->kept = kept > 0 ? kept : 1;
    a->seq = seq;
    a->act16 = engine_acts16(prec) ? prec : PREC_FP32;
    a->work_mask = engine_acts16_work_mask(m, recompute, prec);
    if (rope) {
        a->inv_freq = xmalloc((size_t)(m->d_model / m->n_head / 2) * sizeof(float));
        model_rope_inv_freq(m, m->d_model / m->n_head, a->inv_freq);
    }
    int unit_of_kind[3] = {[UNIT_EMBEDDING] = 0, [UNIT_BLOCK] = 1, [UNIT_HEAD] = m->n_layer + 1};
    for (int k = 0; k < 3; k++) a->n_layout[k] = wm_unit_tensors(m, unit_of_kind[k], a->layout[k]);
    struct {
        float **dst;
        int64_t n;
        const char *what;
    } bufs[] = {
        {&a->dqkv, p.nq, "q|k|v gradient"},
        {&a->datt, p.nd, "attention gradient"}, {&a->dx2, p.nd, "residual gradient"},
        {&a->dln, p.nd, "norm gradient"}, {&a->dact, p.nf, "MLP activation gradient"},
        {&a->dfc, p.nf, "MLP hidden gradient"}, {&a->dup, swiglu ? p.nf : 0, "MLP up gradient"},
        {&a->logits, p.nlogits, "logits"}, {&a->losses, p.nloss, "row losses"},
        {&a->rows, p.nrows, "class-token rows"},
    };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        if (bufs[i].n == 0) continue;
        *bufs[i].dst = dev_alloc_f(d, bufs[i].n, bufs[i].what);
        if (!*bufs[i].dst) {
            *err = d->err;
            wm_acts_free(d, a);
            return NULL;
        }
    }
    if (alloc_sets(d, m, &p, a, err) < 0) {
        wm_acts_free(d, a);
        return NULL;
    }
    wm_acts_select(a, m, 0, 0);
    return a;
}

void wm_acts_select(wm_acts *a, const model_spec *m, int unit, int j) {
    CHECK(j >= 0 && (a->recompute == RECOMPUTE_FULL || j < a->kept));
    int set = engine_saved_set_of(m, a->recompute, a->kept, unit, j);
    a->set = set;
    for (int s = 0; s < ES_COUNT; s++)
        *saved_field(a, (engine_saved)s) =
            set > 0 && (a->work_mask >> s & 1) ? a->work[s] : a->sets[(size_t)set * ES_COUNT + s];
}

/* The selected set's 16-bit buffers from (store16) and to (load16) the fp32 copy the unit
 * computes in, for the m rows of this microbatch: exact both ways, as the values are already
 * rounded (r16). */
static void move16(device *d, const model_spec *m, wm_acts *a, int mb, bool store) {
    if (a->set == 0 || !a->work_mask) return;
    engine_workspace w = engine_workspace_floats(m, mb, a->seq);
    unsigned mask = engine_saved_set_mask(m, a->recompute, a->kept, a->set) & a->work_mask;
    for (int s = 0; s < ES_COUNT; s++) {
        if (!(mask >> s & 1)) continue;
        uint16_t *h = a->sets[(size_t)a->set * ES_COUNT + s];
        int64_t n = engine_saved_floats(&w, (engine_saved)s);
        if (store) dev_to_half(d, a->act16, h, a->work[s], n);
        else dev_from_half(d, a->act16, a->work[s], h, n);
    }
}

void wm_acts_free(device *d, wm_acts *a) {
    if (!a) return;
    float *all[] = {a->dqkv, a->datt, a->dx2, a->dln, a->dact, a->dfc, a->dup, a->logits, a->losses, a->rows};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dev_free(d, all[i]);
    for (size_t i = 0; a->sets && i < (size_t)a->n_sets * ES_COUNT; i++) dev_free(d, a->sets[i]);
    for (int s = 0; s < ES_COUNT; s++) dev_free(d, a->work[s]);
    free(a->sets);
    free(a->inv_freq);
    free(a);
}

/* ---- parameters by name ---- */

static float *tensor(const wm_acts *a, unit_kind k, float *base, const char *name) {
    for (int i = 0; i < a->n_layout[k]; i++)
        if (!strcmp(a->layout[k][i].name, name)) return base + a->layout[k][i].offset;
    CHECK(!"tensor name not in the unit's layout");
    return NULL;
}
#define W(name) tensor(a, model_unit_kind(m, unit), (float *)params, name)
#define DW(name) tensor(a, model_unit_kind(m, unit), dparams, name)

/* ---- building blocks ---- */

/* y[N,out] = x[N,in] W[out,in]^T (+ b) */
static void linear_fwd(device *d, float *y, const float *x, const float *w, const float *b, int N,
                       int in, int out) {
    if (b) OP(d, gemm_bias, false, true, N, out, in, 1.0f, x, in, w, in, 0.0f, y, out, b);
    else OP(d, gemm, false, true, N, out, in, 1.0f, x, in, w, in, 0.0f, y, out);
}

/* dx[N,in] = (or += when acc) dy W; dW += dy^T x; db += column sums of dy. */
static void linear_bwd(device *d, float *dx, bool acc, float *dw, float *db, const float *dy,
                       const float *x, const float *w, int N, int in, int out) {
    if (dx) OP(d, gemm, false, false, N, in, out, 1.0f, dy, out, w, in, acc ? 1.0f : 0.0f, dx, in);
    if (db) OP(d, gemm_bgrad, false, out, in, N, 1.0f, dy, out, x, in, 1.0f, dw, in, db);
    else OP(d, gemm, true, false, out, in, N, 1.0f, dy, out, x, in, 1.0f, dw, in);
}

/* 16-bit activations (planner/engine_mem.h): x [n], just produced, now holds what a bf16/fp16
 * tensor would. Called on every buffer that is an operand of a GEMM or of attention, and on
 * those operands' gradients; a GEMM whose output is added into the residual stream (or its
 * gradient) adds there in fp32 and rounds nothing, as a fused residual epilogue would. */
static void r16(device *d, const wm_acts *a, float *x, int64_t n) {
    if (a->act16 != PREC_FP32) OP(d, round_half, x, n, a->act16);
}

static void copy_f(device *d, float *dst, const float *src, int64_t n) {
    OP(d, copy, dst, src, (size_t)n * sizeof(float), COPY_D2D);
}

/* ---- blocks ---- */

/* Attention over the fused projection a->qkv, output in a->att. */
static void attend(device *d, const model_spec *m, int mb, int T, wm_acts *a) {
    int hd = m->d_model / m->n_head, qw = qkv_width(m);
    const float *q = a->qkv, *k = q + m->n_head * hd, *v = k + m->n_kv_head * hd;
    OP(d, attention_fwd, a->att, a->lse, q, qw, k, qw, v, qw, mb, T, m->n_head, m->n_kv_head, hd,
       wm_is_causal(m));
    r16(d, a, a->att, (int64_t)mb * T * m->d_model);
}

static void attend_bwd(device *d, const model_spec *m, int mb, int T, wm_acts *a) {
    int hd = m->d_model / m->n_head, qw = qkv_width(m);
    const float *q = a->qkv, *k = q + m->n_head * hd, *v = k + m->n_kv_head * hd;
    float *dq = a->dqkv, *dk = dq + m->n_head * hd, *dv = dk + m->n_kv_head * hd;
    OP(d, attention_bwd, dq, dk, dv, a->datt, a->att, a->lse, q, qw, k, qw, v, qw, mb, T,
       m->n_head, m->n_kv_head, hd, wm_is_causal(m));
    r16(d, a, a->dqkv, (int64_t)mb * T * qw);
}

/* GPT-2 / ViT pre-LN block: x2 = x + proj(attn(LN1 x)); y = x2 + proj(gelu(fc(LN2 x2))). */
static void preln_fwd(device *d, const model_spec *m, int unit, const float *params, int mb,
                      int T, const float *x, float *y, wm_acts *a) {
    int N = mb * T, D = m->d_model, ff = m->d_ff;
    float eps = wm_norm_eps(m);
    bool tanh_gelu = arch_of(m->arch)->mlp == MLP_GELU_TANH;
    int64_t nd = (int64_t)N * D, nf = (int64_t)N * ff;
    OP(d, layernorm_fwd, a->ln1, a->mean1, a->rstd1, x, W("ln_1.weight"), W("ln_1.bias"), N, D,
       eps);
    r16(d, a, a->ln1, nd);
    linear_fwd(d, a->qkv, a->ln1, W("attn.qkv.weight"), W("attn.qkv.bias"), N, D, 3 * D);
    r16(d, a, a->qkv, 3 * nd);
    attend(d, m, mb, T, a);
    linear_fwd(d, a->x2, a->att, W("attn.proj.weight"), W("attn.proj.bias"), N, D, D);
    OP(d, add_norm_fwd, a->x2, a->ln2, a->mean2, a->rstd2, a->x2, x, W("ln_2.weight"),
       W("ln_2.bias"), N, D, eps, a->act16); /* x2 += x; ln2 = LN2 x2 */
    linear_fwd(d, a->fc, a->ln2, W("mlp.fc.weight"), W("mlp.fc.bias"), N, D, ff);
    r16(d, a, a->fc, nf);
    OP(d, gelu_fwd, a->act, a->fc, nf, tanh_gelu);
    r16(d, a, a->act, nf);
    linear_fwd(d, y, a->act, W("mlp.proj.weight"), W("mlp.proj.bias"), N, ff, D);
    OP(d, axpy, y, 1.0f, a->x2, (int64_t)N * D);
}

static void preln_bwd(device *d, const model_spec *m, int unit, const float *params,
                      float *dparams, int mb, int T, const float *x, const float *dy, float *dx,
                      wm_acts *a) {
    int N = mb * T, D = m->d_model, ff = m->d_ff;
    bool tanh_gelu = arch_of(m->arch)->mlp == MLP_GELU_TANH;
    int64_t nd = (int64_t)N * D, nf = (int64_t)N * ff;
    linear_bwd(d, a->dact, false, DW("mlp.proj.weight"), DW("mlp.proj.bias"), dy, a->act,
               W("mlp.proj.weight"), N, ff, D);
    r16(d, a, a->dact, nf);
    OP(d, gelu_bwd, a->dfc, a->fc, a->dact, nf, tanh_gelu);
    r16(d, a, a->dfc, nf);
    copy_f(d, a->dx2, dy, nd);
    linear_bwd(d, a->dln, false, DW("mlp.fc.weight"), DW("mlp.fc.bias"), a->dfc, a->ln2,
               W("mlp.fc.weight"), N, D, ff);
    r16(d, a, a->dln, nd);
    OP(d, layernorm_bwd, a->dx2, DW("ln_2.weight"), DW("ln_2.bias"), a->dln, a->x2, a->mean2,
       a->rstd2, W("ln_2.weight"), N, D);
    linear_bwd(d, a->datt, false, DW("attn.proj.weight"), DW("attn.proj.bias"), a->dx2, a->att,
               W("attn.proj.weight"), N, D, D);
    r16(d, a, a->datt, nd);
    attend_bwd(d, m, mb, T, a);
    linear_bwd(d, a->dln, false, DW("attn.qkv.weight"), DW("attn.qkv.bias"), a->dqkv, a->ln1,
               W("attn.qkv.weight"), N, D, 3 * D);
    r16(d, a, a->dln, nd);
    copy_f(d, dx, a->dx2, nd);
    OP(d, layernorm_bwd, dx, DW("ln_1.weight"), DW("ln_1.bias"), a->dln, x, a->mean1, a->rstd1,
       W("ln_1.weight"), N, D);
}

/* Llama block: x2 = x + o(attn(rope(qkv(rms x)))); y = x2 + down(silu(gate h) * up h), h = rms x2.
 * qkv has a bias in Qwen2 (qkv_bias); RoPE rotates by the model's inv_freq (rope_scaling). */
static void llama_fwd(device *d, const model_spec *m, int unit, const float *params, int mb,
                      int T, const float *x, float *y, wm_acts *a) {
    int N = mb * T, D = m->d_model, ff = m->d_ff, qw = qkv_width(m), hd = D / m->n_head;
    float eps = wm_norm_eps(m);
    int64_t nd = (int64_t)N * D, nf = (int64_t)N * ff;
    OP(d, rmsnorm_fwd, a->ln1, a->rstd1, x, W("attn_norm.weight"), N, D, eps);
    r16(d, a, a->ln1, nd);
    linear_fwd(d, a->qkv, a->ln1, W("attn.qkv.weight"), m->qkv_bias ? W("attn.qkv.bias") : NULL, N, D, qw);
    r16(d, a, a->qkv, (int64_t)N * qw);
    OP(d, rope, a->qkv, qw, N, T, m->n_head, hd, a->inv_freq, false);
    OP(d, rope, a->qkv + m->n_head * hd, qw, N, T, m->n_kv_head, hd, a->inv_freq, false);
    r16(d, a, a->qkv, (int64_t)N * qw);
    attend(d, m, mb, T, a);
    linear_fwd(d, a->x2, a->att, W("attn.o.weight"), NULL, N, D, D);
    OP(d, add_norm_fwd, a->x2, a->ln2, NULL, a->rstd2, a->x2, x, W("mlp_norm.weight"), NULL, N,
       D, eps, a->act16); /* x2 += x; ln2 = rms x2 */
    linear_fwd(d, a->fc, a->ln2, W("mlp.gate.weight"), NULL, N, D, ff);
    r16(d, a, a->fc, nf);
    linear_fwd(d, a->up, a->ln2, W("mlp.up.weight"), NULL, N, D, ff);
    r16(d, a, a->up, nf);
    OP(d, swiglu_fwd, a->act, a->fc, a->up, nf);
    r16(d, a, a->act, nf);
    linear_fwd(d, y, a->act, W("mlp.down.weight"), NULL, N, ff, D);
    OP(d, axpy, y, 1.0f, a->x2, (int64_t)N * D);
}

static void llama_bwd(device *d, const model_spec *m, int unit, const float *params,
                      float *dparams, int mb, int T, const float *x, const float *dy, float *dx,
                      wm_acts *a) {
    int N = mb * T, D = m->d_model, ff = m->d_ff, qw = qkv_width(m), hd = D / m->n_head;
    int64_t nd = (int64_t)N * D, nf = (int64_t)N * ff;
    linear_bwd(d, a->dact, false, DW("mlp.down.weight"), NULL, dy, a->act, W("mlp.down.weight"),
               N, ff, D);
    r16(d, a, a->dact, nf);
    OP(d, swiglu_bwd, a->dfc, a->dup, a->dact, a->fc, a->up, nf);
    r16(d, a, a->dfc, nf);
    r16(d, a, a->dup, nf);
    copy_f(d, a->dx2, dy, nd);
    linear_bwd(d, a->dln, false, DW("mlp.gate.weight"), NULL, a->dfc, a->ln2,
               W("mlp.gate.weight"), N, D, ff);
    /* the norm output's gradient is one 16-bit tensor: the two GEMMs add in fp32, rounded once */
    linear_bwd(d, a->dln, true, DW("mlp.up.weight"), NULL, a->dup, a->ln2, W("mlp.up.weight"), N,
               D, ff);
    r16(d, a, a->dln, nd);
    OP(d, rmsnorm_bwd, a->dx2, DW("mlp_norm.weight"), a->dln, a->x2, a->rstd2,
       W("mlp_norm.weight"), N, D);
    linear_bwd(d, a->datt, false, DW("attn.o.weight"), NULL, a->dx2, a->att, W("attn.o.weight"),
               N, D, D);
    r16(d, a, a->datt, nd);
    attend_bwd(d, m, mb, T, a);
    OP(d, rope, a->dqkv, qw, N, T, m->n_head, hd, a->inv_freq, true);
    OP(d, rope, a->dqkv + m->n_head * hd, qw, N, T, m->n_kv_head, hd, a->inv_freq, true);
    r16(d, a, a->dqkv, (int64_t)N * qw);
    linear_bwd(d, a->dln, false, DW("attn.qkv.weight"), m->qkv_bias ? DW("attn.qkv.bias") : NULL, a->dqkv,
               a->ln1, W("attn.qkv.weight"), N, D, qw);
    r16(d, a, a->dln, nd);
    copy_f(d, dx, a->dx2, nd);
    OP(d, rmsnorm_bwd, dx, DW("attn_norm.weight"), a->dln, x, a->rstd1, W("attn_norm.weight"), N,
       D);
}

/* BERT post-LN block: s1 = x + proj(attn x) (in x2); y1 = LN1 s1 (in ln1);
 * s2 = y1 + proj(gelu(fc y1)) (in ln2); y = LN2 s2. */
static void postln_fwd(device *d, const model_spec *m, int unit, const float *params, int mb,
                       int T, const float *x, float *y, wm_acts *a) {
    int N = mb * T, D = m->d_model, ff = m->d_ff;
    float eps = wm_norm_eps(m);
    int64_t nd = (int64_t)N * D, nf = (int64_t)N * ff;
    linear_fwd(d, a->qkv, x, W("attn.qkv.weight"), W("attn.qkv.bias"), N, D, 3 * D);
    r16(d, a, a->qkv, 3 * nd);
    attend(d, m, mb, T, a);
    linear_fwd(d, a->x2, a->att, W("attn.proj.weight"), W("attn.proj.bias"), N, D, D);
    OP(d, add_norm_fwd, a->x2, a->ln1, a->mean1, a->rstd1, a->x2, x, W("ln_1.weight"),
       W("ln_1.bias"), N, D, eps, PREC_FP32); /* s1 = x2 + x; y1 = LN1 s1 (the residual stream) */
    linear_fwd(d, a->fc, a->ln1, W("mlp.fc.weight"), W("mlp.fc.bias"), N, D, ff);
    r16(d, a, a->fc, nf);
    OP(d, gelu_fwd, a->act, a->fc, nf, false);
    r16(d, a, a->act, nf);
    linear_fwd(d, a->ln2, a->act, W("mlp.proj.weight"), W("mlp.proj.bias"), N, ff, D);
    OP(d, add_norm_fwd, a->ln2, y, a->mean2, a->rstd2, a->ln2, a->ln1, W("ln_2.weight"),
       W("ln_2.bias"), N, D, eps, PREC_FP32); /* s2 = ln2 + y1; y = LN2 s2 */
}

static void postln_bwd(device *d, const model_spec *m, int unit, const float *params,
                       float *dparams, int mb, int T, const float *x, const float *dy, float *dx,
                       wm_acts *a) {
    int N = mb * T, D = m->d_model, ff = m->d_ff;
    int64_t nd = (int64_t)N * D;
    float *ds2 = a->dln, *dy1 = a->dx2, *ds1 = a->dln;
    dev_zero(d, ds2, nd);
    OP(d, layernorm_bwd, ds2, DW("ln_2.weight"), DW("ln_2.bias"), dy, a->ln2, a->mean2, a->rstd2,
       W("ln_2.weight"), N, D);
    copy_f(d, dy1, ds2, nd);
    int64_t nf = (int64_t)N * ff;
    linear_bwd(d, a->dact, false, DW("mlp.proj.weight"), DW("mlp.proj.bias"), ds2, a->act,
               W("mlp.proj.weight"), N, ff, D);
    r16(d, a, a->dact, nf);
    OP(d, gelu_bwd, a->dfc, a->fc, a->dact, nf, false);
    r16(d, a, a->dfc, nf);
    linear_bwd(d, dy1, true, DW("mlp.fc.weight"), DW("mlp.fc.bias"), a->dfc, a->ln1,
               W("mlp.fc.weight"), N, D, ff);
    dev_zero(d, ds1, nd);
    OP(d, layernorm_bwd, ds1, DW("ln_1.weight"), DW("ln_1.bias"), dy1, a->x2, a->mean1, a->rstd1,
       W("ln_1.weight"), N, D);
    linear_bwd(d, a->datt, false, DW("attn.proj.weight"), DW("attn.proj.bias"), ds1, a->att,
               W("attn.proj.weight"), N, D, D);
    r16(d, a, a->datt, nd);
    attend_bwd(d, m, mb, T, a);
    copy_f(d, dx, ds1, nd);
    linear_bwd(d, dx, true, DW("attn.qkv.weight"), DW("attn.qkv.bias"), a->dqkv, x,
               W("attn.qkv.weight"), N, D, 3 * D);
}

/* ---- embeddings ---- */

/* ViT: [cls, patch(img)] + pos, per sample (P+1) rows. */
static void vit_embed_fwd(device *d, const model_spec *m, int unit, const float *params,
                          const wm_batch *b, float *y, wm_acts *a) {
    int D = m->d_model, P = vit_patches(m), K = patch_dim(m), T = P + 1;
    OP(d, patchify, a->patches, b->images, b->m, m->channels, m->image, m->patch);
    r16(d, a, a->patches, (int64_t)b->m * P * K);
    for (int s = 0; s < b->m; s++) {
        float *rows = y + (int64_t)s * T * D;
        copy_f(d, rows, W("cls"), D);
        linear_fwd(d, rows + D, a->patches + (int64_t)s * P * K, W("patch.weight"),
                   W("patch.bias"), P, K, D);
    }
    OP(d, add_bias, y, W("pos"), b->m, T * D);
}

static void vit_embed_bwd(device *d, const model_spec *m, int unit, const float *params, float *dparams,
                          const wm_batch *b, const float *dy, wm_acts *a) {
    (void)params;
    int D = m->d_model, P = vit_patches(m), K = patch_dim(m), T = P + 1;
    float *dpe = a->dln; /* [m*P, D] gathered patch-row gradients */
    for (int s = 0; s < b->m; s++)
        copy_f(d, dpe + (int64_t)s * P * D, dy + ((int64_t)s * T + 1) * D, (int64_t)P * D);
    OP(d, gemm_bgrad, false, D, K, b->m * P, 1.0f, dpe, D, a->patches, K, 1.0f,
       DW("patch.weight"), K, DW("patch.bias"));
    OP(d, copy2d, a->rows, D, dy, T * D, b->m, D);
    OP(d, bias_grad, DW("cls"), a->rows, b->m, D);
    OP(d, bias_grad, DW("pos"), dy, b->m, T * D);
}

/* GPT-2: token rows + learned positions. */
static void gpt_embed_fwd(device *d, const model_spec *m, int unit, const float *params,
                          const wm_batch *b, float *y, wm_acts *a) {
    int D = m->d_model, T = b->T, N = b->m * T;
    OP(d, embed_fwd, y, W("wte"), b->ids, N, D);
    OP(d, add_bias, y, W("wpe"), b->m, T * D);
}

static void gpt_embed_bwd(device *d, const model_spec *m, int unit, const float *params,
                          float *dparams, const wm_batch *b, const float *dy, wm_acts *a) {
    int D = m->d_model, T = b->T, N = b->m * T;
    (void)params;
    OP(d, embed_bwd, DW("wte"), dy, b->ids, N, D);
    OP(d, bias_grad, DW("wpe"), dy, b->m, T * D);
}

/* Llama: token rows only (RoPE rotates q and k in the blocks). */
static void llama_embed_fwd(device *d, const model_spec *m, int unit, const float *params,
                            const wm_batch *b, float *y, wm_acts *a) {
    OP(d, embed_fwd, y, W("tokens"), b->ids, b->m * b->T, m->d_model);
}

static void llama_embed_bwd(device *d, const model_spec *m, int unit, const float *params,
                            float *dparams, const wm_batch *b, const float *dy, wm_acts *a) {
    (void)params;
    OP(d, embed_bwd, DW("tokens"), dy, b->ids, b->m * b->T, m->d_model);
}

/* BERT: e = word + position + token_type[0] (kept in x2), y = LN(e). */
static void bert_embed_fwd(device *d, const model_spec *m, int unit, const float *params,
                           const wm_batch *b, float *y, wm_acts *a) {
    int D = m->d_model, T = b->T, N = b->m * T;
    OP(d, embed_fwd, a->x2, W("word"), b->ids, N, D);
    OP(d, add_bias, a->x2, W("position"), b->m, T * D);
    OP(d, add_bias, a->x2, W("token_type"), N, D);
    OP(d, layernorm_fwd, y, a->mean1, a->rstd1, a->x2, W("ln.weight"), W("ln.bias"), N, D,
       wm_norm_eps(m));
}

static void bert_embed_bwd(device *d, const model_spec *m, int unit, const float *params,
                           float *dparams, const wm_batch *b, const float *dy, wm_acts *a) {
    int D = m->d_model, T = b->T, N = b->m * T;
    float *de = a->dln;
    dev_zero(d, de, (int64_t)N * D);
    OP(d, layernorm_bwd, de, DW("ln.weight"), DW("ln.bias"), dy, a->x2, a->mean1, a->rstd1,
       W("ln.weight"), N, D);
    OP(d, embed_bwd, DW("word"), de, b->ids, N, D);
    OP(d, bias_grad, DW("position"), de, b->m, T * D);
    OP(d, bias_grad, DW("token_type"), de, N, D);
}

/* ---- the head ---- */

/* Logits of h [N, D] against the vocabulary table w [V, D] (+ bias), the fused cross-entropy,
 * and the gradients: dh [N, D] written, dw (+ dbias) +=. The rows go in chunks of
 * engine_head_chunk_rows (the whole microbatch unless its logits exceed the cap), so that the
 * table is read by few large GEMMs; within a chunk one cross-entropy per sample, each with its
 * sample's loss weight, all adding to the device's *loss_sum. The logits' rows have stride
 * engine_vocab_ld (V, or V padded: the padding columns are never computed nor read). */
static void vocab_loss(device *d, const model_spec *m, const float *h, const float *w,
                       const float *bias, float *dh, float *dw, float *dbias, const wm_batch *b,
                       wm_acts *a, double *loss_sum, float *logits_out) {
    int D = m->d_model, V = m->vocab, T = b->T, ld = engine_vocab_ld(m);
    CHECK(ld == V || (!bias && !dbias)); /* padded heads have no bias (engine_vocab_ld) */
    int64_t N = (int64_t)b->m * T, chunk = engine_head_chunk_rows(m, b->m, T);
    for (int64_t r0 = 0; r0 < N; r0 += chunk) {
        int rows = (int)(N - r0 < chunk ? N - r0 : chunk);
        const float *x = h + r0 * D;
        if (bias) OP(d, gemm_bias, false, true, rows, V, D, 1.0f, x, D, w, D, 0.0f, a->logits, ld, bias);
        else OP(d, gemm, false, true, rows, V, D, 1.0f, x, D, w, D, 0.0f, a->logits, ld);
        r16(d, a, a->logits, (int64_t)rows * ld); /* padding columns too: nothing reads them */
        for (int r = 0; logits_out && r < rows; r += ld == V ? rows : 1) /* tests: rows of V */
            OP(d, copy, logits_out + (r0 + r) * V, a->logits + (int64_t)r * ld,
               (size_t)(ld == V ? rows : 1) * V * sizeof(float), COPY_D2H);
        for (int64_t q = r0; q < r0 + rows;) { /* the chunk's part of each sample */
            int64_t s = q / T, end = (s + 1) * T < r0 + rows ? (s + 1) * T : r0 + rows;
            OP(d, xent_fwd_bwd, a->logits + (q - r0) * ld, ld, a->losses + (q - r0), b->targets + q,
               (int)(end - q), V, b->row_scale[s], loss_sum);
            q = end;
        }
        r16(d, a, a->logits, (int64_t)rows * ld);
        /* linear_bwd with the logits' stride: dh = dlogits W; dW += dlogits^T h; db */
        OP(d, gemm, false, false, rows, D, V, 1.0f, a->logits, ld, w, D, 0.0f, dh + r0 * D, D);
        r16(d, a, dh + r0 * D, (int64_t)rows * D);
        if (dbias) OP(d, gemm_bgrad, false, V, D, rows, 1.0f, a->logits, ld, x, D, 1.0f, dw, D, dbias);
        else OP(d, gemm, true, false, V, D, rows, 1.0f, a->logits, ld, x, D, 1.0f, dw, D);
    }
}

static void vit_head(device *d, const model_spec *m, const float *params, float *dparams,
                     const float *tied, float *dtied, const wm_batch *b, const float *x, float *dx,
                     wm_acts *a, double *loss_sum, float *logits_out) {
    (void)tied, (void)dtied; /* a classifier has no token embedding to tie */
    const int unit = m->n_layer + 1;
    int D = m->d_model, T = b->T, K = m->n_classes, mb = b->m;
    float *c = a->rows, *y = a->ln1, *dy = a->dln, *dc = a->dx2;
    OP(d, copy2d, c, D, x, T * D, mb, D); /* the class-token rows */
    OP(d, layernorm_fwd, y, a->mean1, a->rstd1, c, W("ln.weight"), W("ln.bias"), mb, D,
       wm_norm_eps(m));
    r16(d, a, y, (int64_t)mb * D);
    linear_fwd(d, a->logits, y, W("classifier.weight"), W("classifier.bias"), mb, D, K);
    r16(d, a, a->logits, (int64_t)mb * K);
    if (logits_out)
        OP(d, copy, logits_out, a->logits, (size_t)mb * K * sizeof(float), COPY_D2H);
    OP(d, xent_fwd_bwd, a->logits, K, a->losses, b->targets, mb, K, b->row_scale[0], loss_sum);
    r16(d, a, a->logits, (int64_t)mb * K);
    linear_bwd(d, dy, false, DW("classifier.weight"), DW("classifier.bias"), a->logits, y,
               W("classifier.weight"), mb, D, K);
    r16(d, a, dy, (int64_t)mb * D);
    dev_zero(d, dc, (int64_t)mb * D);
    OP(d, layernorm_bwd, dc, DW("ln.weight"), DW("ln.bias"), dy, c, a->mean1, a->rstd1,
       W("ln.weight"), mb, D);
    dev_zero(d, dx, (int64_t)mb * T * D);
    OP(d, copy2d, dx, T * D, dc, D, mb, D);
}

/* GPT-2: ln_f, then the logits against the tied token embedding wte. */
static void gpt_head(device *d, const model_spec *m, const float *params, float *dparams,
                     const float *tied, float *dtied, const wm_batch *b, const float *x, float *dx,
                     wm_acts *a, double *loss_sum, float *logits_out) {
    const int unit = m->n_layer + 1;
    int D = m->d_model, N = b->m * b->T;
    int64_t nd = (int64_t)N * D;
    float eps = wm_norm_eps(m);
    const float *wte = tensor(a, UNIT_EMBEDDING, (float *)tied, "wte");
    float *dwte = tensor(a, UNIT_EMBEDDING, dtied, "wte");
    OP(d, layernorm_fwd, a->ln1, a->mean1, a->rstd1, x, W("ln_f.weight"), W("ln_f.bias"), N,
       D, eps);
    r16(d, a, a->ln1, nd);
    vocab_loss(d, m, a->ln1, wte, NULL, a->dln, dwte, NULL, b, a, loss_sum, logits_out);
    dev_zero(d, dx, nd);
    OP(d, layernorm_bwd, dx, DW("ln_f.weight"), DW("ln_f.bias"), a->dln, x, a->mean1,
       a->rstd1, W("ln_f.weight"), N, D);
}

/* Llama: RMSNorm, then lm_head; a tied head (Llama-3.2 style) multiplies by the token embedding. */
static void llama_head(device *d, const model_spec *m, const float *params, float *dparams,
                       const float *tied, float *dtied, const wm_batch *b, const float *x, float *dx,
                       wm_acts *a, double *loss_sum, float *logits_out) {
    const int unit = m->n_layer + 1;
    int D = m->d_model, N = b->m * b->T;
    int64_t nd = (int64_t)N * D;
    float eps = wm_norm_eps(m);
    const float *wo = m->tied_head ? tensor(a, UNIT_EMBEDDING, (float *)tied, "tokens") : W("lm_head.weight");
    float *dwo = m->tied_head ? tensor(a, UNIT_EMBEDDING, dtied, "tokens") : DW("lm_head.weight");
    OP(d, rmsnorm_fwd, a->ln1, a->rstd1, x, W("norm.weight"), N, D, eps);
    r16(d, a, a->ln1, nd);
    vocab_loss(d, m, a->ln1, wo, NULL, a->dln, dwo, NULL, b, a, loss_sum, logits_out);
    dev_zero(d, dx, nd);
    OP(d, rmsnorm_bwd, dx, DW("norm.weight"), a->dln, x, a->rstd1, W("norm.weight"), N, D);
}

/* BERT's MLM head: t = transform x (fc), g = gelu t (act), h = LN g (ln1), then the logits
 * against the tied word embedding, with the decoder's bias. */
static void bert_head(device *d, const model_spec *m, const float *params, float *dparams,
                      const float *tied, float *dtied, const wm_batch *b, const float *x, float *dx,
                      wm_acts *a, double *loss_sum, float *logits_out) {
    const int unit = m->n_layer + 1;
    int D = m->d_model, N = b->m * b->T;
    int64_t nd = (int64_t)N * D;
    float eps = wm_norm_eps(m);
    const float *word = tensor(a, UNIT_EMBEDDING, (float *)tied, "word");
    float *dword = tensor(a, UNIT_EMBEDDING, dtied, "word");
    linear_fwd(d, a->fc, x, W("transform.weight"), W("transform.bias"), N, D, D);
    r16(d, a, a->fc, nd);
    OP(d, gelu_fwd, a->act, a->fc, nd, false);
    r16(d, a, a->act, nd);
    OP(d, layernorm_fwd, a->ln1, a->mean1, a->rstd1, a->act, W("ln.weight"), W("ln.bias"), N,
       D, eps);
    r16(d, a, a->ln1, nd);
    vocab_loss(d, m, a->ln1, word, W("decoder.bias"), a->dln, dword, DW("decoder.bias"), b,
               a, loss_sum, logits_out);
    dev_zero(d, a->dact, nd);
    OP(d, layernorm_bwd, a->dact, DW("ln.weight"), DW("ln.bias"), a->dln, a->act, a->mean1,
       a->rstd1, W("ln.weight"), N, D);
    r16(d, a, a->dact, nd);
    OP(d, gelu_bwd, a->dfc, a->fc, a->dact, nd, false);
    r16(d, a, a->dfc, nd);
    linear_bwd(d, dx, false, DW("transform.weight"), DW("transform.bias"), a->dfc, x,
               W("transform.weight"), N, D, D);
}

/* ---- the architectures' code: one row each, indexed by model_arch ---- */

/* What differs per architecture in the forward and backward; the rest (attention, the vocabulary
 * loss, the 16-bit copies) is shared. A new architecture is a row here, its layout in
 * wmodel_layout.c and its row in planner/arch.c (docs/development.md). */
typedef struct wm_arch_ops {
    void (*embed_fwd)(device *d, const model_spec *m, int unit, const float *params, const wm_batch *b,
                      float *y, wm_acts *a);
    void (*embed_bwd)(device *d, const model_spec *m, int unit, const float *params, float *dparams,
                      const wm_batch *b, const float *dy, wm_acts *a);
    void (*block_fwd)(device *d, const model_spec *m, int unit, const float *params, int mb, int T,
                      const float *x, float *y, wm_acts *a);
    void (*block_bwd)(device *d, const model_spec *m, int unit, const float *params, float *dparams,
                      int mb, int T, const float *x, const float *dy, float *dx, wm_acts *a);
    void (*head)(device *d, const model_spec *m, const float *params, float *dparams, const float *tied,
                 float *dtied, const wm_batch *b, const float *x, float *dx, wm_acts *a, double *loss_sum,
                 float *logits_out);
} wm_arch_ops;

static const wm_arch_ops arch_ops[ARCH_COUNT] = {
    [ARCH_GPT] = {gpt_embed_fwd, gpt_embed_bwd, preln_fwd, preln_bwd, gpt_head},
    [ARCH_LLAMA] = {llama_embed_fwd, llama_embed_bwd, llama_fwd, llama_bwd, llama_head},
    [ARCH_BERT] = {bert_embed_fwd, bert_embed_bwd, postln_fwd, postln_bwd, bert_head},
    [ARCH_VIT] = {vit_embed_fwd, vit_embed_bwd, preln_fwd, preln_bwd, vit_head},
};

static const wm_arch_ops *ops_of(const model_spec *m) {
    CHECK((unsigned)m->arch < ARCH_COUNT && arch_ops[m->arch].head); /* every architecture has a row */
    return &arch_ops[m->arch];
}

void wm_head_step(device *d, const model_spec *m, const float *params, float *dparams,
                  const float *tied, float *dtied, const wm_batch *b, const float *x, float *dx,
                  wm_acts *a, double *loss_sum, float *logits_out) {
    ops_of(m)->head(d, m, params, dparams, tied, dtied, b, x, dx, a, loss_sum, logits_out);
}

/* ---- public: units ---- */

void wm_unit_forward(device *d, const model_spec *m, int unit, const float *params,
                     const wm_batch *b, const float *x, float *y, wm_acts *a) {
    CHECK(b->m <= a->max_m && b->T == a->T);
    switch (model_unit_kind(m, unit)) {
    case UNIT_EMBEDDING: ops_of(m)->embed_fwd(d, m, unit, params, b, y, a); break;
    case UNIT_BLOCK: ops_of(m)->block_fwd(d, m, unit, params, b->m, b->T, x, y, a); break;
    case UNIT_HEAD: CHECK(!"the head runs through wm_head_step"); break;
    }
    move16(d, m, a, b->m, true);
}

void wm_unit_backward(device *d, const model_spec *m, int unit, const float *params,
                      float *dparams, const wm_batch *b, const float *x, const float *dy,
                      float *dx, wm_acts *a) {
    move16(d, m, a, b->m, false);
    switch (model_unit_kind(m, unit)) {
    case UNIT_EMBEDDING: ops_of(m)->embed_bwd(d, m, unit, params, dparams, b, dy, a); break;
    case UNIT_BLOCK: ops_of(m)->block_bwd(d, m, unit, params, dparams, b->m, b->T, x, dy, dx, a); break;
    case UNIT_HEAD: CHECK(!"the head runs through wm_head_step"); break;
    }
}
