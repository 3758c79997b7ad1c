/* wmodel_layout.c - the named tensors of every unit and their initialisation.
 * The table here is the layout contract of docs/worker-model.md. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "model/wmodel.h"
#include "planner/arch.h"

typedef struct layout {
    wm_tensor *t;
    int n;
    int64_t off;
} layout;

static void add(layout *l, const char *name, int64_t rows, int64_t cols, wm_init_kind init,
                float std) {
    CHECK(l->n < WM_MAX_TENSORS);
    wm_tensor *t = &l->t[l->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = cols > 0 ? 2 : 1;
    t->shape[0] = rows;
    t->shape[1] = cols > 0 ? cols : 0;
    t->numel = cols > 0 ? rows * cols : rows;
    t->offset = l->off;
    t->init = init;
    t->std = std;
    t->decay = t->ndim == 2; /* matrices decay; norms, biases and the class token do not */
    l->off += t->numel;
}

/* GPT-2 style initialisation: N(0, 0.02), residual output projections scaled by 1/sqrt(2L). */
#define STD 0.02f
static float resid_std(const model_spec *m) { return STD / sqrtf(2.0f * (float)m->n_layer); }

static void matrix(layout *l, const char *name, int64_t out, int64_t in, float std) {
    add(l, name, out, in, INIT_NORMAL, std);
}
static void vec(layout *l, const char *name, int64_t n, wm_init_kind init) {
    add(l, name, n, 0, init, 0.0f);
}
static void layernorm(layout *l, const char *prefix, int64_t d) {
    char name[48];
    snprintf(name, sizeof name, "%s.weight", prefix);
    vec(l, name, d, INIT_ONES);
    snprintf(name, sizeof name, "%s.bias", prefix);
    vec(l, name, d, INIT_ZEROS);
}
static void linear(layout *l, const char *prefix, int64_t out, int64_t in, float std, bool bias) {
    char name[48];
    snprintf(name, sizeof name, "%s.weight", prefix);
    matrix(l, name, out, in, std);
    if (bias) {
        snprintf(name, sizeof name, "%s.bias", prefix);
        vec(l, name, out, INIT_ZEROS);
    }
}

static int64_t vit_patches(const model_spec *m) {
    int64_t side = m->image / m->patch;
    return side * side;
}

/* GPT-2: wte, wpe | the pre-LN block | ln_f (the head is tied to wte). */
static void gpt_embedding_layout(const model_spec *m, layout *l) {
    matrix(l, "wte", m->vocab, m->d_model, STD);
    matrix(l, "wpe", m->max_seq, m->d_model, STD);
}

static void gpt_head_layout(const model_spec *m, layout *l) { layernorm(l, "ln_f", m->d_model); }

/* Pre-LN block of GPT-2 and ViT; post-LN block of BERT (same tensors, different order of use). */
static void ln_block_layout(const model_spec *m, layout *l) {
    int64_t d = m->d_model, ff = m->d_ff;
    bool post = arch_of(m->arch)->post_ln;
    if (!post) layernorm(l, "ln_1", d);
    linear(l, "attn.qkv", 3 * d, d, STD, true);
    linear(l, "attn.proj", d, d, resid_std(m), true);
    if (post) layernorm(l, "ln_1", d);
    if (!post) layernorm(l, "ln_2", d);
    linear(l, "mlp.fc", ff, d, STD, true);
    linear(l, "mlp.proj", d, ff, resid_std(m), true);
    if (post) layernorm(l, "ln_2", d);
}

/* Llama: tokens | RMSNorm, GQA q|k|v, o, SwiGLU | norm, lm_head unless tied. */
static void llama_embedding_layout(const model_spec *m, layout *l) { matrix(l, "tokens", m->vocab, m->d_model, STD); }

static void llama_block_layout(const model_spec *m, layout *l) {
    int64_t d = m->d_model, ff = m->d_ff, hd = d / m->n_head;
    vec(l, "attn_norm.weight", d, INIT_ONES);
    matrix(l, "attn.qkv.weight", (m->n_head + 2 * (int64_t)m->n_kv_head) * hd, d, STD);
    if (m->qkv_bias) vec(l, "attn.qkv.bias", (m->n_head + 2 * (int64_t)m->n_kv_head) * hd, INIT_ZEROS); /* Qwen2 */
    matrix(l, "attn.o.weight", d, d, resid_std(m));
    vec(l, "mlp_norm.weight", d, INIT_ONES);
    matrix(l, "mlp.gate.weight", ff, d, STD);
    matrix(l, "mlp.up.weight", ff, d, STD);
    matrix(l, "mlp.down.weight", d, ff, resid_std(m));
}

static void llama_head_layout(const model_spec *m, layout *l) {
    vec(l, "norm.weight", m->d_model, INIT_ONES);
    if (!m->tied_head) matrix(l, "lm_head.weight", m->vocab, m->d_model, STD); /* else: tokens */
}

/* BERT: word, position, token_type, ln | the post-LN block | the MLM transform, ln, decoder
 * bias (the decoder is tied to word). */
static void bert_embedding_layout(const model_spec *m, layout *l) {
    int64_t d = m->d_model;
    matrix(l, "word", m->vocab, d, STD);
    matrix(l, "position", m->max_seq, d, STD);
    matrix(l, "token_type", m->type_vocab, d, STD);
    layernorm(l, "ln", d);
}

static void bert_head_layout(const model_spec *m, layout *l) {
    linear(l, "transform", m->d_model, m->d_model, STD, true);
    layernorm(l, "ln", m->d_model);
    vec(l, "decoder.bias", m->vocab, INIT_ZEROS);
}

/* ViT: the patch projection, cls, pos | the pre-LN block | ln, classifier. */
static void vit_embedding_layout(const model_spec *m, layout *l) {
    int64_t d = m->d_model;
    linear(l, "patch", d, (int64_t)m->channels * m->patch * m->patch, STD, true);
    add(l, "cls", d, 0, INIT_NORMAL, STD);
    matrix(l, "pos", vit_patches(m) + 1, d, STD);
}

static void vit_head_layout(const model_spec *m, layout *l) {
    layernorm(l, "ln", m->d_model);
    linear(l, "classifier", m->n_classes, m->d_model, STD, true);
}

/* Each architecture's tensors, unit kind by unit kind (indexed by unit_kind); with wmodel.c's
 * code and planner/arch.c's row, what an architecture is. */
typedef void (*layout_fn)(const model_spec *m, layout *l);
static const layout_fn layouts[ARCH_COUNT][3] = {
    [ARCH_GPT] = {gpt_embedding_layout, ln_block_layout, gpt_head_layout},
    [ARCH_LLAMA] = {llama_embedding_layout, llama_block_layout, llama_head_layout},
    [ARCH_BERT] = {bert_embedding_layout, ln_block_layout, bert_head_layout},
    [ARCH_VIT] = {vit_embedding_layout, ln_block_layout, vit_head_layout},
};

int wm_unit_tensors(const model_spec *m, int unit, wm_tensor *out) {
    layout l = {out, 0, 0};
    CHECK((unsigned)m->arch < ARCH_COUNT && layouts[m->arch][UNIT_HEAD]);
    layouts[m->arch][model_unit_kind(m, unit)](m, &l);
    CHECK(l.off == model_unit_params(m, unit)); /* the planner and the worker agree */
    return l.n;
}

/* ---- initialisation: a counter-based generator, so values do not depend on sharding ---- */

static uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* A standard normal from (seed, unit, index): Box-Muller on two 53-bit uniforms in (0, 1]. */
static double normal_at(uint64_t seed, int unit, int64_t index) {
    uint64_t h = mix64(mix64(seed ^ 0x63657068616c6fULL) + (uint64_t)unit);
    uint64_t a = mix64(h + 2 * (uint64_t)index), b = mix64(h + 2 * (uint64_t)index + 1);
    double u1 = ((double)(a >> 11) + 1.0) / 9007199254740992.0;
    double u2 = (double)(b >> 11) / 9007199254740992.0;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void wm_init_range(const model_spec *m, int unit, uint64_t seed, int64_t lo, int64_t hi,
                   float *out) {
    wm_tensor t[WM_MAX_TENSORS];
    int n = wm_unit_tensors(m, unit, t);
    for (int i = 0; i < n; i++) {
        int64_t a = t[i].offset > lo ? t[i].offset : lo;
        int64_t b = t[i].offset + t[i].numel < hi ? t[i].offset + t[i].numel : hi;
        for (int64_t k = a; k < b; k++) {
            float v = t[i].init == INIT_ONES ? 1.0f : 0.0f;
            if (t[i].init == INIT_NORMAL) v = (float)(t[i].std * normal_at(seed, unit, k));
            out[k - lo] = v;
        }
    }
}

bool wm_is_causal(const model_spec *m) { return arch_of(m->arch)->causal; }

float wm_norm_eps(const model_spec *m) { return (float)model_norm_eps(m); }

