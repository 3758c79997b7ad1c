/* model.c - built-in model shapes, unit parameter counts, FLOPs and activation bytes, and a
 * spec's checks. docs/cost-model.md derives every formula here.
 *
 * The loaders (model_file.c, model_hf.c) build on this file's names, built-ins and checks; the
 * choice between a built-in and a loader is model_resolve.c's, above them all, so that nothing
 * here calls a loader. */
#include "planner/model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/attn_limits.h"
#include "common/strutil.h"
#include "planner/arch.h"

#define GPT2_VOCAB 50257
#define LLAMA_VOCAB 32000
#define BERT_VOCAB 30522

/* name, arch, layers, d, heads, kv heads, d_ff, vocab, max_seq, default_seq, type_vocab, tied,
 * image, patch, channels, classes, rope_theta and norm_eps (0: the architecture's), then the
 * imported Llama relatives' fields, none of which a built-in has */
#define PLAIN ROPE_PLAIN, 0, 0, 0, 0, false, 0
static const model_spec builtins[] = {
    /* GPT-2 family (Radford et al. 2019; Hugging Face gpt2*), learned positions, tied head. */
    {"gpt2-124m", ARCH_GPT, 12, 768, 12, 12, 3072, GPT2_VOCAB, 1024, 1024, 0, true, 0, 0, 0, 0, 0, 0, PLAIN},
    {"gpt2-350m", ARCH_GPT, 24, 1024, 16, 16, 4096, GPT2_VOCAB, 1024, 1024, 0, true, 0, 0, 0, 0, 0, 0, PLAIN},
    {"gpt2-774m", ARCH_GPT, 36, 1280, 20, 20, 5120, GPT2_VOCAB, 1024, 1024, 0, true, 0, 0, 0, 0, 0, 0, PLAIN},
    {"gpt2-1.5b", ARCH_GPT, 48, 1600, 25, 25, 6400, GPT2_VOCAB, 1024, 1024, 0, true, 0, 0, 0, 0, 0, 0, PLAIN},
    /* GPT-3 shapes (Brown et al. 2020, table 2.1) on the GPT-2 architecture, as in the paper. */
    {"gpt-1.3b", ARCH_GPT, 24, 2048, 16, 16, 8192, GPT2_VOCAB, 2048, 512, 0, true, 0, 0, 0, 0, 0, 0, PLAIN},
    {"gpt-2.7b", ARCH_GPT, 32, 2560, 80, 80, 10240, GPT2_VOCAB, 2048, 512, 0, true, 0, 0, 0, 0, 0, 0, PLAIN},
    {"gpt-6.7b", ARCH_GPT, 32, 4096, 128, 128, 16384, GPT2_VOCAB, 2048, 512, 0, true, 0, 0, 0, 0, 0, 0, PLAIN},
    /* Llama family: TinyLlama-1.1B (GQA 32/4), OpenLLaMA-3B, Llama-2-7B. */
    {"tinyllama-1.1b", ARCH_LLAMA, 22, 2048, 32, 4, 5632, LLAMA_VOCAB, 2048, 512, 0, false, 0, 0,
     0, 0, 0, 0, PLAIN},
    {"llama-3b", ARCH_LLAMA, 26, 3200, 32, 32, 8640, LLAMA_VOCAB, 2048, 512, 0, false, 0, 0, 0, 0, 0, 0, PLAIN},
    {"llama-7b", ARCH_LLAMA, 32, 4096, 32, 32, 11008, LLAMA_VOCAB, 4096, 512, 0, false, 0, 0, 0,
     0, 0, 0, PLAIN},
    /* BERT (Devlin et al. 2019) with the masked-LM head; BERT-XLarge as in the paper's table. */
    {"bert-large", ARCH_BERT, 24, 1024, 16, 16, 4096, BERT_VOCAB, 512, 512, 2, true, 0, 0, 0, 0, 0, 0, PLAIN},
    {"bert-xlarge", ARCH_BERT, 36, 1536, 24, 24, 6144, BERT_VOCAB, 512, 512, 2, true, 0, 0, 0, 0, 0, 0, PLAIN},
    /* ViT-G/14 (Zhai et al. 2022) and ViT-e/14 (Chen et al. 2022), 224x224 images. */
    {"vit-g", ARCH_VIT, 48, 1664, 16, 16, 8192, 0, 0, 0, 0, false, 224, 14, 3, 1000, 0, 0, PLAIN},
    {"vit-e", ARCH_VIT, 56, 1792, 16, 16, 15360, 0, 0, 0, 0, false, 224, 14, 3, 1000, 0, 0, PLAIN},
    /* Tiny test models: byte-level vocabularies, seconds to train on a CPU. */
    {"tiny-gpt", ARCH_GPT, 2, 64, 4, 4, 256, 256, 128, 64, 0, true, 0, 0, 0, 0, 0, 0, PLAIN},
    {"tiny-llama", ARCH_LLAMA, 2, 64, 4, 2, 176, 256, 128, 64, 0, false, 0, 0, 0, 0, 0, 0, PLAIN},
    {"tiny-bert", ARCH_BERT, 2, 64, 4, 4, 256, 256, 128, 64, 2, true, 0, 0, 0, 0, 0, 0, PLAIN},
    {"tiny-vit", ARCH_VIT, 2, 64, 4, 4, 256, 0, 0, 0, 0, false, 32, 8, 3, 10, 0, 0, PLAIN},
};

const model_spec *model_builtins(int *count) {
    *count = (int)(sizeof builtins / sizeof builtins[0]);
    return builtins;
}

const char *model_arch_name(model_arch a) { return arch_of(a)->name; }

const char *unit_kind_name(unit_kind k) {
    static const char *names[] = {"embedding", "block", "head"};
    return names[k];
}

unit_kind model_unit_kind(const model_spec *m, int unit) {
    if (unit == 0) return UNIT_EMBEDDING;
    return unit <= m->n_layer ? UNIT_BLOCK : UNIT_HEAD;
}

void model_unit_name(const model_spec *m, int unit, char *buf, size_t bufsz) {
    unit_kind k = model_unit_kind(m, unit);
    if (k == UNIT_BLOCK)
        snprintf(buf, bufsz, "block.%d", unit - 1);
    else
        snprintf(buf, bufsz, "%s", unit_kind_name(k));
}

static int64_t vit_patches(const model_spec *m) {
    int64_t side = m->image / m->patch;
    return side * side;
}

int model_tokens(const model_spec *m, int seq) {
    return arch_of(m->arch)->images ? (int)vit_patches(m) + 1 : seq;
}

/* Parameters of one norm: a LayerNorm's weight and bias, an RMSNorm's weight. */
static int64_t norm_params(const model_spec *m) {
    return arch_of(m->arch)->norm == NORM_RMS ? m->d_model : 2 * (int64_t)m->d_model;
}

/* Parameters of one transformer block: q, k, v, o (GQA: k and v are n_kv_head wide), the MLP
 * (SwiGLU: gate, up, down; else fc, proj), two norms, and the biases: on every linear layer
 * (GPT-2, BERT, ViT), or on q, k and v only (Qwen2's qkv_bias). */
static int64_t block_params(const model_spec *m) {
    const arch_desc *a = arch_of(m->arch);
    int64_t d = m->d_model, ff = m->d_ff;
    int64_t kv = a->gqa ? (int64_t)m->n_kv_head * (d / m->n_head) : d;
    int64_t attn = d * d + 2 * d * kv + d * d, mlp = (a->mlp == MLP_SWIGLU ? 3 : 2) * d * ff;
    int64_t bias = a->linear_bias ? d + 2 * kv + d + ff + d : m->qkv_bias ? d + 2 * kv : 0;
    return attn + mlp + bias + 2 * norm_params(m);
}

static int64_t embedding_params(const model_spec *m) {
    const arch_desc *a = arch_of(m->arch);
    int64_t d = m->d_model;
    if (a->images) /* patch projection (conv as matmul) + bias, class token, positions */
        return (int64_t)m->channels * m->patch * m->patch * d + d + d + (vit_patches(m) + 1) * d;
    /* tokens, learned positions (GPT-2's wpe), token types and a LayerNorm (BERT's) */
    int64_t rows = (int64_t)m->vocab + (a->pos == POS_LEARNED ? m->max_seq : 0) + (a->type_vocab ? m->type_vocab : 0);
    return rows * d + (a->embed_norm ? norm_params(m) : 0);
}

static int64_t head_params(const model_spec *m) {
    const arch_desc *a = arch_of(m->arch);
    int64_t d = m->d_model;
    int64_t norm = a->post_ln ? 0 : norm_params(m); /* the final norm of a pre-LN stack */
    switch (a->head) {
    case HEAD_LM: return norm + (m->tied_head ? 0 : (int64_t)m->vocab * d); /* lm_head, unless tied */
    case HEAD_MLM: /* transform (dense + LayerNorm) and the decoder bias; the decoder is tied */
        return norm + d * d + d + 2 * d + m->vocab;
    case HEAD_CLASSIFIER: return norm + d * m->n_classes + m->n_classes;
    }
    return 0;
}

int64_t model_kind_params(const model_spec *m, unit_kind k) {
    return k == UNIT_EMBEDDING ? embedding_params(m)
           : k == UNIT_BLOCK   ? block_params(m)
                               : head_params(m);
}

int64_t model_unit_params(const model_spec *m, int unit) {
    return model_kind_params(m, model_unit_kind(m, unit));
}

int64_t model_params(const model_spec *m) {
    return embedding_params(m) + (int64_t)m->n_layer * block_params(m) + head_params(m);
}

int model_context(const model_spec *m) {
    return m->sliding_window > 0 && m->sliding_window < m->max_seq ? m->sliding_window : m->max_seq;
}

int model_check_seq(const model_spec *m, int seq, int *out, err_t *err) {
    const arch_desc *a = arch_of(m->arch);
    if (a->images) {
        if (seq > 0)
            return err_set(err, "model %s takes %dx%d images, --seq does not apply", m->name,
                           m->image, m->image);
        *out = model_tokens(m, 0);
        return 0;
    }
    if (seq < 0) return err_set(err, "sequence length %d must be positive", seq);
    if (seq == 0) seq = m->default_seq;
    /* GPT and BERT have no position beyond their table; Llama's RoPE has no table, but it was
     * trained to max_seq and transformers' own scaling is refused (docs/import.md) */
    if (seq > m->max_seq && a->pos == POS_ROPE)
        return err_set(err, "sequence length %d exceeds model %s's context of %d positions (max_seq; "
                       "max_position_embeddings in a Hugging Face config)", seq, m->name, m->max_seq);
    if (seq > m->max_seq)
        return err_set(err, "sequence length %d exceeds model %s's %d learned positions", seq,
                       m->name, m->max_seq);
    /* a token attends to the previous sliding_window - 1 at most: with the whole sequence inside
     * the window, the window changes nothing; beyond it, it would, and it is not implemented */
    if (m->sliding_window > 0 && seq > m->sliding_window)
        return err_set(err, "sequence length %d exceeds model %s's sliding_window of %d (config.json): "
                       "attention over a sliding window is not implemented, so the sequence must fit "
                       "in the window (--seq %d or less)", seq, m->name, m->sliding_window, m->sliding_window);
    *out = seq;
    return 0;
}

/* ---- FLOPs (per sample, forward) ---- */

static double attention_flops(const model_spec *m, int t) {
    /* QK^T and AV: 2 matmuls of t x t x d, 2 FLOPs per multiply-add. A causal mask lets the
     * flash-style kernel skip the upper triangle, so half the work remains. */
    double full = 4.0 * t * (double)t * m->d_model;
    return arch_of(m->arch)->causal ? full / 2 : full;
}

double model_kind_fwd_flops(const model_spec *m, unit_kind k, int seq) {
    const arch_desc *a = arch_of(m->arch);
    int t = model_tokens(m, seq);
    double d = m->d_model;
    switch (k) {
    case UNIT_BLOCK: {
        double matmul_params = (double)block_params(m) - 4 * d; /* norms are not matmuls */
        if (a->linear_bias) matmul_params -= 4 * d + m->d_ff + d; /* biases */
        return 2.0 * t * matmul_params + attention_flops(m, t);
    }
    case UNIT_EMBEDDING:
        if (a->images)
            return 2.0 * (t - 1) * (double)m->channels * m->patch * m->patch * d;
        return (double)t * d; /* table lookups and the position add */
    case UNIT_HEAD:
        switch (a->head) {
        case HEAD_LM: /* logits matmul + softmax cross-entropy (~5 FLOPs per logit) */
            return 2.0 * t * d * m->vocab + 5.0 * t * (double)m->vocab;
        case HEAD_MLM:
            return 2.0 * t * d * d + 2.0 * t * d * m->vocab + 5.0 * t * (double)m->vocab;
        case HEAD_CLASSIFIER: return 2.0 * d * m->n_classes + 5.0 * t * d;
        }
    }
    return 0;
}

/* ---- activation memory ---- */

/* Activation elements per token that one block keeps for its own backward when it is recomputed
 * at a unit boundary, plus the transient gradient buffers of the backward. */
static double block_elems_per_token(const model_spec *m) {
    double d = m->d_model, ff = m->d_ff, h = m->n_head;
    double kv = (double)m->n_kv_head * (m->d_model / m->n_head);
    double saved, transient;
    if (arch_of(m->arch)->mlp == MLP_SWIGLU) {
        /* x, norm1 out, q, k, v, rotated q and k, attention out (+ logsumexp), x2, norm2 out,
         * gate, up, silu(gate)*up */
        saved = d + d + d + 2 * kv + d + kv + d + h + d + d + 3 * ff;
        transient = 2 * d + 2 * ff; /* dx, d(att), d(gate), d(up) */
    } else {
        /* x, norm1 out, qkv, attention out (+ logsumexp), x2, norm2 out, fc out, gelu out;
         * BERT's post-LN stores the same count in another order */
        saved = d + d + 3 * d + d + h + d + d + 2 * ff;
        transient = 2 * d + ff + 3 * d;
    }
    return saved + transient;
}

double model_kind_act_bytes(const model_spec *m, unit_kind k, int seq, int elem) {
    int t = model_tokens(m, seq);
    double d = m->d_model;
    switch (k) {
    case UNIT_BLOCK: return (double)t * block_elems_per_token(m) * elem;
    case UNIT_EMBEDDING: return (double)t * 2 * d * elem; /* output and its gradient */
    case UNIT_HEAD:
        if (arch_of(m->arch)->head == HEAD_CLASSIFIER) return (double)t * 2 * d * elem + 2.0 * m->n_classes * 4;
        /* normed input, its gradient, and the logits with their gradient computed in place,
         * kept in fp32 for the loss whatever the precision */
        return (double)t * ((arch_of(m->arch)->head == HEAD_MLM ? 4 : 2) * d * elem + 4.0 * m->vocab);
    }
    return 0;
}

double model_kind_traffic_bytes(const model_spec *m, unit_kind k, int seq, int elem) {
    /* Elementwise kernels read and write each saved activation about twice in the forward. */
    int t = model_tokens(m, seq);
    if (k == UNIT_BLOCK) return 2.0 * t * block_elems_per_token(m) * elem;
    if (k == UNIT_HEAD && arch_of(m->arch)->head != HEAD_CLASSIFIER) return 3.0 * t * 4.0 * m->vocab;
    return 4.0 * t * m->d_model * elem;
}

double model_boundary_bytes(const model_spec *m, int seq, int elem) {
    return (double)model_tokens(m, seq) * m->d_model * elem;
}

/* ---- checks and names (the loaders use them; model_resolve.c picks a loader) ---- */

int model_validate(const model_spec *m, err_t *err) {
    const arch_desc *a = arch_of(m->arch);
    const char *n = m->name;
    if (m->n_layer < 1 || m->n_layer > 4096)
        return err_set(err, "model %s: n_layer %d must be in 1..4096", n, m->n_layer);
    if (m->d_model < 1 || m->d_model > 1 << 17)
        return err_set(err, "model %s: d_model %d must be in 1..131072", n, m->d_model);
    if (m->n_head < 1 || m->d_model % m->n_head)
        return err_set(err, "model %s: n_head %d must divide d_model %d", n, m->n_head,
                       m->d_model);
    if (m->n_kv_head < 1 || m->n_head % m->n_kv_head)
        return err_set(err, "model %s: n_kv_head %d must divide n_head %d", n, m->n_kv_head,
                       m->n_head);
    char why[256];
    if (!attn_head_dim_ok(m->d_model / m->n_head, why, sizeof why))
        return err_set(err, "model %s: %s", n, why);
    if (a->pos == POS_ROPE && (m->d_model / m->n_head) % 2)
        return err_set(err, "model %s: head size %d must be even for rotary embeddings", n,
                       m->d_model / m->n_head);
    if (m->d_ff < 1 || m->d_ff > 1 << 20)
        return err_set(err, "model %s: d_ff %d must be in 1..1048576", n, m->d_ff);
    if (a->images) {
        if (m->patch < 1 || m->image < m->patch || m->image % m->patch)
            return err_set(err, "model %s: patch %d must divide image %d", n, m->patch, m->image);
        if (m->channels < 1 || m->channels > 64 || m->n_classes < 1 || m->n_classes > 1 << 20)
            return err_set(err, "model %s: channels must be 1..64 and n_classes 1..1048576", n);
        if (m->image > 8192)
            return err_set(err, "model %s: image %d exceeds 8192 pixels", n, m->image);
    } else {
        if (m->vocab < 2 || m->vocab > 1 << 24)
            return err_set(err, "model %s: vocab %d must be in 2..16777216", n, m->vocab);
        if (m->max_seq < 1 || m->max_seq > 1 << 20)
            return err_set(err, "model %s: max_seq %d must be in 1..1048576", n, m->max_seq);
        if (m->default_seq < 1 || m->default_seq > m->max_seq)
            return err_set(err, "model %s: seq %d must be in 1..max_seq (%d)", n, m->default_seq,
                           m->max_seq);
    }
    if (m->rope_theta < 0 || m->norm_eps < 0 || m->norm_eps >= 1)
        return err_set(err, "model %s: rope_theta %g must be positive and norm_eps %g in (0, 1)", n,
                       m->rope_theta, m->norm_eps);
    /* the Llama relatives' fields (docs/import.md) belong to rotary models */
    if (a->pos != POS_ROPE && (m->rope_scaling != ROPE_PLAIN || m->qkv_bias || m->sliding_window))
        return err_set(err, "model %s: rope_scaling, qkv_bias and sliding_window are Llama-family fields; "
                       "this is a %s model", n, a->name);
    if (m->sliding_window < 0) return err_set(err, "model %s: sliding_window %d must be >= 0", n, m->sliding_window);
    if (m->rope_scaling != ROPE_PLAIN && !(m->rope_factor >= 1))
        return err_set(err, "model %s: rope_scaling factor %g must be >= 1", n, m->rope_factor);
    if (m->rope_scaling == ROPE_LLAMA3 &&
        !(m->rope_low_freq > 0 && m->rope_high_freq > m->rope_low_freq && m->rope_orig_max > 0))
        return err_set(err, "model %s: llama3 rope_scaling needs 0 < low_freq_factor (%g) < high_freq_factor "
                       "(%g) and original_max_position_embeddings (%d) > 0", n, m->rope_low_freq,
                       m->rope_high_freq, m->rope_orig_max);
    if (m->tied_head != a->tied && !a->tie_choice) /* the architecture's, unless it lets a model choose */
        return err_set(err, "model %s: tied_head %s: only Llama models choose; %s models %s", n,
                       m->tied_head ? "true" : "false", a->name,
                       a->tied ? "always tie" : "have no token embedding to tie");
    if (model_params(m) > (int64_t)1 << 42)
        return err_set(err, "model %s: %.3g parameters is beyond what the planner handles", n,
                       (double)model_params(m));
    return 0;
}

double model_rope_theta(const model_spec *m) { return m->rope_theta > 0 ? m->rope_theta : 10000.0; }

const char *model_rope_scaling_name(rope_scaling_kind k) {
    return k == ROPE_LINEAR ? "linear" : k == ROPE_LLAMA3 ? "llama3" : "none";
}

/* transformers' _compute_default_rope_parameters, then _compute_linear_scaling_rope_parameters
 * (inv_freq / factor: the same as positions / factor) or _compute_llama3_parameters, all in fp32
 * as PyTorch computes them there: wavelengths shorter than original / high_freq_factor keep
 * their frequency, longer than original / low_freq_factor are divided by factor, and those
 * between are blended by how many wavelengths fit in the original context. */
void model_rope_inv_freq(const model_spec *m, int hd, float *inv_freq) {
    float theta = (float)model_rope_theta(m), factor = (float)m->rope_factor;
    for (int i = 0; i < hd / 2; i++) {
        float expo = (float)(2 * i) / (float)hd;
        float f = 1.0f / (float)pow((double)theta, (double)expo);
        if (m->rope_scaling == ROPE_LINEAR) f /= factor;
        if (m->rope_scaling == ROPE_LLAMA3) {
            float orig = (float)m->rope_orig_max, lo = (float)m->rope_low_freq, hi = (float)m->rope_high_freq;
            float wavelen = (float)6.283185307179586 / f; /* 2 pi */
            if (wavelen > orig / lo) f /= factor;
            else if (!(wavelen < orig / hi)) {
                float smooth = (orig / wavelen - lo) / (hi - lo);
                f = (1 - smooth) * f / factor + smooth * f;
            }
        }
        inv_freq[i] = f;
    }
}

double model_norm_eps(const model_spec *m) {
    return m->norm_eps > 0 ? m->norm_eps : arch_of(m->arch)->norm_eps;
}

int model_unknown(const char *name, err_t *err) {
    int n;
    const model_spec *b = model_builtins(&n);
    const char *names[64];
    char all[1024] = "", sugg[256];
    size_t len = 0;
    for (int i = 0; i < n && i < 64; i++) {
        names[i] = b[i].name;
        int w = snprintf(all + len, sizeof all - len, "%s%s", i ? ", " : "", names[i]);
        if (w < 0 || (size_t)w >= sizeof all - len) break; /* the list is a hint; cut it */
        len += (size_t)w;
    }
    int ns = str_suggest(name, names, (size_t)(n < 64 ? n : 64), 3, sugg, sizeof sugg);
    return err_set(err, "unknown model '%s'%s%s%s; built-in models: %s (or give a model file path)",
                   name, ns ? " (did you mean " : "", ns ? sugg : "", ns ? "?)" : "", all);
}
