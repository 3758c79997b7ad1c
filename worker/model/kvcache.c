/* kvcache.c - the generation forward of GPT-2 and Llama with a KV cache (sample.h,
 * docs/sample.md).
 *
 * Shapes: n = new tokens of this forward (the prompt at prefill, 1 per decode step), pos0 = tokens
 * already in the cache, D = width, ff = MLP width, qw = width of the fused q|k|v projection,
 * kvw = Hkv*hd = width of one cached key (or value) row. Per layer the caches K and V are
 * [ctx, kvw]; a forward writes its n rows at pos0 and attends over rows 0 .. pos0+n-1, so no
 * earlier token is ever recomputed. The block arithmetic is wmodel.c's forward op for op (the
 * same ops, in the same order, on the same parameter layout), so prefill logits equal the training
 * forward's up to the attention's summation order. */
#include <string.h>

#include "common/log.h"
#include "model/sample.h"
#include "model/wmodel.h"
#include "planner/arch.h"
#include "planner/engine_mem.h"

#define OP(d, name, ...) ((d)->ops->name((d), __VA_ARGS__))

struct sampler {
    device *d;
    model_spec m;
    wm_tensor layout[3][WM_MAX_TENSORS]; /* per unit kind, as wm_unit_tensors lists it */
    int n_layout[3];
    int ctx, rows;   /* cache positions; most new tokens per forward */
    int qw, kvw, hd; /* fused projection width, cached row width, head dim */
    float **params;  /* [units] device, wmodel's flat layout */
    float **k, **v;  /* [n_layer] device [ctx, kvw] */
    /* workspace, device */
    int32_t *ids;                    /* [rows] */
    float *x;                        /* [rows, D] the residual stream */
    float *h, *att, *tmp;            /* [rows, D] norm output, attention output, projection */
    float *qkv;                      /* [rows, qw] */
    float *fc, *up, *act;            /* [rows, ff] */
    float *mean, *rstd;              /* [rows] */
    float *logits;                   /* [V] */
    float *inv_freq;                 /* Llama: [hd/2] host, the RoPE frequencies */
};

/* ---- parameters by name (wm_unit_tensors' layout, looked up once per call) ---- */

static const float *param(const sampler *s, int unit, const char *name) {
    unit_kind k = model_unit_kind(&s->m, unit);
    for (int i = 0; i < s->n_layout[k]; i++)
        if (!strcmp(s->layout[k][i].name, name)) return s->params[unit] + s->layout[k][i].offset;
    CHECK(!"tensor name not in the unit's layout");
    return NULL;
}
#define W(name) param(s, unit, name)

int sampler_new(sampler **out, device *d, const model_spec *m, float *const *host_units, int ctx,
                int rows, err_t *err) {
    CHECK(arch_of(m->arch)->causal);
    CHECK(ctx >= 1 && rows >= 1 && rows <= ctx);
    sampler *s = xcalloc(1, sizeof *s);
    s->d = d, s->m = *m, s->ctx = ctx, s->rows = rows;
    s->hd = m->d_model / m->n_head;
    s->kvw = m->n_kv_head * s->hd;
    s->qw = engine_qkv_width(m);
    if (arch_of(m->arch)->pos == POS_ROPE) {
        s->inv_freq = xmalloc((size_t)(s->hd / 2) * sizeof(float));
        model_rope_inv_freq(m, s->hd, s->inv_freq);
    }
    int unit_of_kind[3] = {[UNIT_EMBEDDING] = 0, [UNIT_BLOCK] = 1, [UNIT_HEAD] = m->n_layer + 1};
    for (int k = 0; k < 3; k++) s->n_layout[k] = wm_unit_tensors(m, unit_of_kind[k], s->layout[k]);
    int units = model_n_units(m), L = m->n_layer;
    s->params = xcalloc((size_t)units, sizeof *s->params);
    s->k = xcalloc((size_t)L, sizeof *s->k);
    s->v = xcalloc((size_t)L, sizeof *s->v);
    int64_t D = m->d_model, ff = m->d_ff;
    bool swiglu = arch_of(m->arch)->mlp == MLP_SWIGLU;
    struct {
        float **dst;
        int64_t n;
        const char *what;
    } bufs[] = {
        {&s->x, rows * D, "residual"},       {&s->h, rows * D, "norm output"},
        {&s->att, rows * D, "attention output"}, {&s->tmp, rows * D, "projection"},
        {&s->qkv, rows * (int64_t)s->qw, "q|k|v"}, {&s->fc, rows * ff, "MLP hidden"},
        {&s->up, swiglu ? rows * ff : 0, "MLP up"}, {&s->act, rows * ff, "MLP activation"},
        {&s->mean, rows, "norm mean"},      {&s->rstd, rows, "norm rstd"},
        {&s->logits, m->vocab, "logits"},
    };
    dev_set_context(d, "%s", "sampling set-up");
    for (int u = 0; u < units; u++) {
        int64_t n = model_unit_params(m, u);
        s->params[u] = dev_alloc_f(d, n, "parameters");
        if (!s->params[u]) goto oom;
        dev_upload(d, s->params[u], host_units[u], (size_t)n * sizeof(float));
    }
    for (int l = 0; l < L; l++) {
        s->k[l] = dev_alloc_f(d, (int64_t)ctx * s->kvw, "key cache");
        s->v[l] = dev_alloc_f(d, (int64_t)ctx * s->kvw, "value cache");
        if (!s->k[l] || !s->v[l]) goto oom;
    }
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        if (bufs[i].n == 0) continue;
        *bufs[i].dst = dev_alloc_f(d, bufs[i].n, bufs[i].what);
        if (!*bufs[i].dst) goto oom;
    }
    s->ids = dev_alloc(d, (size_t)rows * sizeof(int32_t), "token ids");
    if (!s->ids) goto oom;
    *out = s;
    return 0;
oom:
    *err = d->err;
    sampler_free(s);
    return -1;
}

void sampler_free(sampler *s) {
    if (!s) return;
    device *d = s->d;
    for (int u = 0; u < model_n_units(&s->m); u++) dev_free(d, s->params[u]);
    for (int l = 0; l < s->m.n_layer; l++) dev_free(d, s->k[l]), dev_free(d, s->v[l]);
    float *all[] = {s->x, s->h, s->att, s->tmp, s->qkv, s->fc, s->up, s->act, s->mean, s->rstd,
                    s->logits};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dev_free(d, all[i]);
    dev_free(d, s->ids);
    free(s->params), free(s->k), free(s->v);
    free(s->inv_freq);
    free(s);
}

/* y[n,out] = x[n,in] W[out,in]^T (+ b), as wmodel.c's linear_fwd */
static void linear(device *d, float *y, const float *x, const float *w, const float *b, int n,
                   int in, int out) {
    if (b) OP(d, gemm_bias, false, true, n, out, in, 1.0f, x, in, w, in, 0.0f, y, out, b);
    else OP(d, gemm, false, true, n, out, in, 1.0f, x, in, w, in, 0.0f, y, out);
}

/* Appends the new rows' keys and values (columns [qk0, qk0+kvw) and [qk0+kvw, qk0+2kvw) of the
 * fused projection) to layer l's caches at row pos0, then attends over the cache. */
static void attend_cached(sampler *s, int l, int n, int pos0) {
    device *d = s->d;
    const model_spec *m = &s->m;
    const float *k_new = s->qkv + (int64_t)m->n_head * s->hd, *v_new = k_new + s->kvw;
    OP(d, copy2d, s->k[l] + (int64_t)pos0 * s->kvw, s->kvw, k_new, s->qw, n, s->kvw);
    OP(d, copy2d, s->v[l] + (int64_t)pos0 * s->kvw, s->kvw, v_new, s->qw, n, s->kvw);
    OP(d, attention_cached, s->att, s->qkv, s->qw, s->k[l], s->v[l], n, pos0, m->n_head,
       m->n_kv_head, s->hd);
}

/* GPT-2 pre-LN block on the n new rows of x, in place. */
static void gpt_block(sampler *s, int unit, int n, int pos0) {
    device *d = s->d;
    int D = s->m.d_model, ff = s->m.d_ff;
    int64_t nd = (int64_t)n * D;
    float eps = wm_norm_eps(&s->m);
    OP(d, layernorm_fwd, s->h, s->mean, s->rstd, s->x, W("ln_1.weight"), W("ln_1.bias"), n, D, eps);
    linear(d, s->qkv, s->h, W("attn.qkv.weight"), W("attn.qkv.bias"), n, D, s->qw);
    attend_cached(s, unit - 1, n, pos0);
    linear(d, s->tmp, s->att, W("attn.proj.weight"), W("attn.proj.bias"), n, D, D);
    OP(d, axpy, s->x, 1.0f, s->tmp, nd);
    OP(d, layernorm_fwd, s->h, s->mean, s->rstd, s->x, W("ln_2.weight"), W("ln_2.bias"), n, D, eps);
    linear(d, s->fc, s->h, W("mlp.fc.weight"), W("mlp.fc.bias"), n, D, ff);
    OP(d, gelu_fwd, s->act, s->fc, (int64_t)n * ff, true);
    linear(d, s->tmp, s->act, W("mlp.proj.weight"), W("mlp.proj.bias"), n, ff, D);
    OP(d, axpy, s->x, 1.0f, s->tmp, nd);
}

/* Llama block on the n new rows of x, in place; RoPE at their absolute positions. */
static void llama_block(sampler *s, int unit, int n, int pos0) {
    device *d = s->d;
    const model_spec *m = &s->m;
    int D = m->d_model, ff = m->d_ff;
    int64_t nd = (int64_t)n * D;
    float eps = wm_norm_eps(m);
    OP(d, rmsnorm_fwd, s->h, s->rstd, s->x, W("attn_norm.weight"), n, D, eps);
    linear(d, s->qkv, s->h, W("attn.qkv.weight"), m->qkv_bias ? W("attn.qkv.bias") : NULL, n, D, s->qw);
    OP(d, rope_at, s->qkv, s->qw, n, pos0, m->n_head, s->hd, s->inv_freq);
    OP(d, rope_at, s->qkv + (int64_t)m->n_head * s->hd, s->qw, n, pos0, m->n_kv_head, s->hd, s->inv_freq);
    attend_cached(s, unit - 1, n, pos0);
    linear(d, s->tmp, s->att, W("attn.o.weight"), NULL, n, D, D);
    OP(d, axpy, s->x, 1.0f, s->tmp, nd);
    OP(d, rmsnorm_fwd, s->h, s->rstd, s->x, W("mlp_norm.weight"), n, D, eps);
    linear(d, s->fc, s->h, W("mlp.gate.weight"), NULL, n, D, ff);
    linear(d, s->up, s->h, W("mlp.up.weight"), NULL, n, D, ff);
    OP(d, swiglu_fwd, s->act, s->fc, s->up, (int64_t)n * ff);
    linear(d, s->tmp, s->act, W("mlp.down.weight"), NULL, n, ff, D);
    OP(d, axpy, s->x, 1.0f, s->tmp, nd);
}

/* x[n, D] = the new tokens' embeddings: GPT-2's plus their positions' rows of wpe, Llama's
 * alone. */
static void gpt_embed(sampler *s, int n, int pos0) {
    const int unit = 0;
    device *d = s->d;
    int D = s->m.d_model;
    OP(d, embed_fwd, s->x, W("wte"), s->ids, n, D);
    OP(d, add_bias, s->x, W("wpe") + (int64_t)pos0 * D, 1, n * D);
}

static void llama_embed(sampler *s, int n, int pos0) {
    const int unit = 0;
    (void)pos0; /* RoPE rotates in the blocks */
    OP(s->d, embed_fwd, s->x, W("tokens"), s->ids, n, s->m.d_model);
}

/* h = the final norm of the last row; returns the vocabulary projection's weight (tied or not). */
static const float *gpt_head_norm(sampler *s, const float *last) {
    const int unit = s->m.n_layer + 1;
    OP(s->d, layernorm_fwd, s->h, s->mean, s->rstd, last, W("ln_f.weight"), W("ln_f.bias"), 1,
       s->m.d_model, wm_norm_eps(&s->m));
    return param(s, 0, "wte");
}

static const float *llama_head_norm(sampler *s, const float *last) {
    const int unit = s->m.n_layer + 1;
    OP(s->d, rmsnorm_fwd, s->h, s->rstd, last, W("norm.weight"), 1, s->m.d_model, wm_norm_eps(&s->m));
    return s->m.tied_head ? param(s, 0, "tokens") : W("lm_head.weight");
}

/* The generating architectures' code (planner/arch.h's causal ones), indexed by model_arch. */
static const struct {
    void (*embed)(sampler *s, int n, int pos0);
    void (*block)(sampler *s, int unit, int n, int pos0);
    const float *(*head_norm)(sampler *s, const float *last);
} gen_ops[ARCH_COUNT] = {
    [ARCH_GPT] = {gpt_embed, gpt_block, gpt_head_norm},
    [ARCH_LLAMA] = {llama_embed, llama_block, llama_head_norm},
};

/* logits[V] of the last new row: final norm, then the vocabulary projection. */
static void head_last(sampler *s, int n, float *logits) {
    int D = s->m.d_model, V = s->m.vocab;
    const float *w = gen_ops[s->m.arch].head_norm(s, s->x + (int64_t)(n - 1) * D);
    linear(s->d, s->logits, s->h, w, NULL, 1, D, V);
    dev_download(s->d, logits, s->logits, (size_t)V * sizeof(float));
}

void sampler_forward(sampler *s, const int32_t *ids, int n, int pos0, float *logits) {
    CHECK(n >= 1 && n <= s->rows && pos0 >= 0 && pos0 + n <= s->ctx);
    dev_set_context(s->d, "sampling at position %d", pos0);
    dev_upload(s->d, s->ids, ids, (size_t)n * sizeof(int32_t));
    gen_ops[s->m.arch].embed(s, n, pos0);
    for (int l = 0; l < s->m.n_layer; l++) gen_ops[s->m.arch].block(s, l + 1, n, pos0);
    head_last(s, n, logits);
}
