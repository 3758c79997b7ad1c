/* model_hf.c - a model spec from a Hugging Face config.json (docs/import.md).
 *
 * These architectures map onto ours exactly: GPT2LMHeadModel (pre-LN, learned positions, tanh
 * GELU, tied head) and LlamaForCausalLM (RMSNorm, rotate-half RoPE, SwiGLU, grouped-query
 * attention, tied or untied head; rope_scaling linear or llama3), with two relatives on Llama's
 * layout: MistralForCausalLM (a sliding window, which changes nothing while the sequence fits
 * in it) and Qwen2ForCausalLM (biases on q, k and v). Anything in the config that would change
 * the computation and that we do not implement (other RoPE scalings, biases elsewhere, another
 * activation) is refused with the field's name rather than trained silently as something else. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/json_util.h"
#include "common/log.h"
#include "common/strutil.h"
#include "planner/model.h"

/* The families, indexes of hf_families[]: Llama's relatives share its layout and reader. */
typedef enum { HF_GPT2, HF_LLAMA, HF_MISTRAL, HF_QWEN2, HF_COUNT } hf_family;

static const hf_family_desc hf_families[HF_COUNT] = {
    [HF_GPT2] = {"GPT2LMHeadModel", "gpt2", "GPT-2", ARCH_GPT},
    [HF_LLAMA] = {"LlamaForCausalLM", "llama", "Llama", ARCH_LLAMA},
    [HF_MISTRAL] = {"MistralForCausalLM", "mistral", "Mistral", ARCH_LLAMA},
    [HF_QWEN2] = {"Qwen2ForCausalLM", "qwen2", "Qwen2", ARCH_LLAMA},
};

/* The spec's fields tell the relative: Qwen2 has q/k/v biases, Mistral a window. */
const hf_family_desc *hf_family_of(const model_spec *m) {
    if (m->arch == ARCH_GPT) return &hf_families[HF_GPT2];
    if (m->arch != ARCH_LLAMA) return NULL;
    return &hf_families[m->qkv_bias ? HF_QWEN2 : m->sliding_window ? HF_MISTRAL : HF_LLAMA];
}

typedef struct hf_ctx {
    json_ctx c;
    const cJSON *root;
    hf_family family;
} hf_ctx;

/* An integer field: the first of `keys` present (aliases), or `def` when none is (def < 0:
 * required). */
static int hf_int(const hf_ctx *h, const char *const *keys, long def, long lo, long hi, int *out) {
    for (int i = 0; keys[i]; i++) {
        const cJSON *v = json_get(h->root, keys[i]);
        if (!v || cJSON_IsNull(v)) continue;
        long x;
        if (json_int(&h->c, v, keys[i], lo, hi, &x) < 0) return -1;
        *out = (int)x;
        return 0;
    }
    if (def < 0) return err_set(h->c.err, "%s: missing field '%s'", h->c.file, keys[0]);
    *out = (int)def;
    return 0;
}

static int hf_real(const hf_ctx *h, const char *key, double def, double *out) {
    const cJSON *v = json_get(h->root, key);
    *out = def;
    if (!v || cJSON_IsNull(v)) return 0;
    return json_number(&h->c, v, key, 0, INFINITY, JSON_OPEN, out);
}

static int hf_bool(const hf_ctx *h, const char *key, bool def, bool *out) {
    const cJSON *v = json_get(h->root, key);
    *out = def;
    if (!v || cJSON_IsNull(v)) return 0;
    return json_bool(&h->c, v, key, out);
}

/* A string field that must be one of `ok` (NULL-terminated) when present. */
static int hf_expect_string(const hf_ctx *h, const char *key, const char *const *ok, const char *what) {
    const cJSON *v = json_get(h->root, key);
    if (!v || cJSON_IsNull(v)) return 0;
    const char *s;
    if (json_string(&h->c, v, key, &s) < 0) return -1;
    for (int i = 0; ok[i]; i++)
        if (!strcmp(s, ok[i])) return 0;
    return err_set(h->c.err, "%s: %s is \"%s\"; Cephalo implements %s", h->c.file, key, s, what);
}

/* A field that, when present and set, means a computation we do not implement. */
static int hf_refuse(const hf_ctx *h, const char *key, const char *why) {
    const cJSON *v = json_get(h->root, key);
    if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v)) return 0;
    return err_set(h->c.err, "%s: %s is set; %s", h->c.file, key, why);
}

static int gpt2_spec(const hf_ctx *h, model_spec *m) {
    static const char *const embd[] = {"n_embd", "hidden_size", NULL}, *const head[] = {"n_head", NULL},
                             *const layer[] = {"n_layer", NULL}, *const pos[] = {"n_positions", "n_ctx", NULL},
                             *const vocab[] = {"vocab_size", NULL}, *const inner[] = {"n_inner", NULL};
    static const char *const acts[] = {"gelu_new", "gelu_pytorch_tanh", NULL};
    m->tied_head = true;
    bool tied;
    if (hf_int(h, embd, -1, 1, 1 << 17, &m->d_model) < 0 || hf_int(h, head, -1, 1, 1 << 14, &m->n_head) < 0 ||
        hf_int(h, layer, -1, 1, 4096, &m->n_layer) < 0 || hf_int(h, pos, 1024, 1, 1 << 20, &m->max_seq) < 0 ||
        hf_int(h, vocab, -1, 2, 1 << 24, &m->vocab) < 0 ||
        hf_int(h, inner, 4L * m->d_model, 1, 1 << 20, &m->d_ff) < 0 ||
        hf_real(h, "layer_norm_epsilon", 1e-5, &m->norm_eps) < 0 ||
        hf_expect_string(h, "activation_function", acts, "GPT-2's tanh GELU (gelu_new)") < 0 ||
        hf_bool(h, "tie_word_embeddings", true, &tied) < 0)
        return -1;
    if (!tied)
        return err_set(h->c.err, "%s: tie_word_embeddings is false; GPT-2 models tie the head to wte",
                       h->c.file);
    if (hf_refuse(h, "scale_attn_by_inverse_layer_idx", "Cephalo scales attention by 1/sqrt(head size) only") < 0 ||
        hf_refuse(h, "reorder_and_upcast_attn", "not implemented") < 0)
        return -1;
    m->n_kv_head = m->n_head;
    return 0;
}

/* rope_scaling: null, or {"rope_type" (or the older "type"): "linear" | "llama3" | "default", ...}.
 * The numbers are the ones transformers reads for that type; anything else is refused. */
static int rope_scaling(const hf_ctx *h, model_spec *m) {
    const cJSON *r = json_get(h->root, "rope_scaling");
    if (!r || cJSON_IsNull(r)) return 0;
    if (json_expect_object(&h->c, r, "rope_scaling") < 0) return -1;
    const cJSON *t = json_get(r, "rope_type");
    const char *key = "rope_scaling.rope_type", *type;
    if (!t) t = json_get(r, "type"), key = "rope_scaling.type";
    if (!t) return err_set(h->c.err, "%s: rope_scaling has no rope_type; Cephalo implements rope_type linear and llama3",
                           h->c.file);
    if (json_string(&h->c, t, key, &type) < 0) return -1;
    if (!strcmp(type, "default")) return 0; /* transformers' name for plain RoPE */
    if (strcmp(type, "linear") && strcmp(type, "llama3"))
        return err_set(h->c.err, "%s: %s is \"%s\"; Cephalo implements rope_scaling linear and llama3 "
                       "(or none): dynamic, yarn, longrope and the others are not implemented", h->c.file, key, type);
    static const char *const keys[] = {"factor", "low_freq_factor", "high_freq_factor",
                                       "original_max_position_embeddings"};
    bool llama3 = type[1] == 'l';
    double v[4] = {0};
    for (int i = 0; i < (llama3 ? 4 : 1); i++) {
        char at[64];
        const cJSON *x = json_get(r, keys[i]);
        snprintf(at, sizeof at, "rope_scaling.%s", keys[i]);
        if (!x) return err_set(h->c.err, "%s: rope_scaling of type %s needs %s", h->c.file, type, at);
        if (json_number(&h->c, x, at, 0, 1e12, JSON_OPEN, &v[i]) < 0) return -1;
    }
    if (llama3 && v[3] != (int)v[3])
        return err_set(h->c.err, "%s: rope_scaling.original_max_position_embeddings %g is not an integer", h->c.file, v[3]);
    m->rope_scaling = llama3 ? ROPE_LLAMA3 : ROPE_LINEAR;
    m->rope_factor = v[0], m->rope_low_freq = v[1], m->rope_high_freq = v[2], m->rope_orig_max = (int)v[3];
    return 0;
}

/* What Mistral and Qwen2 add to Llama's layout. Mistral's sliding_window is kept: a sequence
 * longer than it is refused where sequence meets model (model_check_seq). Qwen2's window is off
 * unless use_sliding_window, which is refused. */
static int family_fields(const hf_ctx *h, model_spec *m) {
    static const char *const window[] = {"sliding_window", NULL};
    if (h->family == HF_MISTRAL) { /* absent: MistralConfig's default; null: no window */
        const cJSON *w = json_get(h->root, "sliding_window");
        return hf_int(h, window, w ? 0 : 4096, 1, 1 << 30, &m->sliding_window);
    }
    if (h->family != HF_QWEN2) return hf_refuse(h, "sliding_window", "only Mistral's sliding window is read "
                                                "(model_type mistral)");
    m->qkv_bias = true;
    return hf_refuse(h, "use_sliding_window", "Qwen2's sliding-window attention is not implemented");
}

static int llama_spec(const hf_ctx *h, model_spec *m) {
    static const char *const hidden[] = {"hidden_size", NULL}, *const ff[] = {"intermediate_size", NULL},
                             *const heads[] = {"num_attention_heads", NULL},
                             *const kv[] = {"num_key_value_heads", NULL}, *const layers[] = {"num_hidden_layers", NULL},
                             *const pos[] = {"max_position_embeddings", NULL}, *const vocab[] = {"vocab_size", NULL},
                             *const hdim[] = {"head_dim", NULL};
    static const char *const acts[] = {"silu", NULL};
    if (hf_int(h, hidden, -1, 1, 1 << 17, &m->d_model) < 0 || hf_int(h, ff, -1, 1, 1 << 20, &m->d_ff) < 0 ||
        hf_int(h, heads, -1, 1, 1 << 14, &m->n_head) < 0 ||
        hf_int(h, kv, m->n_head, 1, 1 << 14, &m->n_kv_head) < 0 ||
        hf_int(h, layers, -1, 1, 4096, &m->n_layer) < 0 || hf_int(h, pos, 2048, 1, 1 << 20, &m->max_seq) < 0 ||
        hf_int(h, vocab, -1, 2, 1 << 24, &m->vocab) < 0 ||
        hf_real(h, "rms_norm_eps", 1e-6, &m->norm_eps) < 0 || /* LlamaConfig's default */
        hf_real(h, "rope_theta", 10000, &m->rope_theta) < 0 ||
        hf_bool(h, "tie_word_embeddings", false, &m->tied_head) < 0 ||
        hf_expect_string(h, "hidden_act", acts, "SwiGLU with silu") < 0 || rope_scaling(h, m) < 0 ||
        hf_refuse(h, "attention_bias", h->family == HF_QWEN2
                                           ? "Qwen2 has biases on q, k and v by design; a bias on o_proj too is not implemented"
                                           : "biases on all four attention projections (q, k, v and o) are not implemented "
                                             "(Qwen2's q/k/v biases are: model_type qwen2)") < 0 ||
        hf_refuse(h, "mlp_bias", "MLPs with biases are not implemented") < 0 || family_fields(h, m) < 0)
        return -1;
    int hd = 0;
    if (m->n_head > 0 && hf_int(h, hdim, m->d_model / m->n_head, 1, 1 << 17, &hd) < 0) return -1;
    if (m->n_head > 0 && (hd != m->d_model / m->n_head || m->d_model % m->n_head))
        return err_set(h->c.err, "%s: head_dim %d differs from hidden_size / num_attention_heads (%d / %d); "
                       "Cephalo needs head_dim x heads = hidden_size", h->c.file, hd, m->d_model, m->n_head);
    return 0;
}

typedef int (*hf_spec_fn)(const hf_ctx *h, model_spec *m);

/* Which architecture: the first of "architectures", else "model_type"; and the reader of its
 * fields. The rows are the Hugging Face names each importable architecture (planner/arch.h's
 * hf) answers to. */
static int hf_arch(hf_ctx *h, model_arch *out, hf_spec_fn *spec) {
    const cJSON *a = json_get(h->root, "architectures"), *t = json_get(h->root, "model_type");
    const char *name = NULL;
    if (cJSON_IsArray(a) && cJSON_GetArraySize(a) > 0 && cJSON_IsString(cJSON_GetArrayItem(a, 0)))
        name = cJSON_GetArrayItem(a, 0)->valuestring;
    else if (cJSON_IsString(t))
        name = t->valuestring;
    if (!name)
        return err_set(h->c.err, "%s: neither 'architectures' nor 'model_type' says which model this is",
                       h->c.file);
    static const hf_spec_fn reader[HF_COUNT] = {gpt2_spec, llama_spec, llama_spec, llama_spec};
    char supported[256] = "";
    for (int f = 0; f < HF_COUNT; f++) {
        if (!strcmp(name, hf_families[f].hf_class) || !strcmp(name, hf_families[f].model_type)) {
            *out = hf_families[f].arch, h->family = (hf_family)f, *spec = reader[f];
            return 0;
        }
        size_t used = strlen(supported);
        snprintf(supported + used, sizeof supported - used, "%s%s", f ? ", " : "", hf_families[f].hf_class);
    }
    return err_set(h->c.err, "%s: architecture '%s' cannot be imported (supported: %s)", h->c.file, name, supported);
}

/* The model's name: its directory's (".../TinyLlama-1.1B/config.json" -> "TinyLlama-1.1B"), as the
 * path spells it or, where the spelling has no name ("./config.json", "../config.json"), as it
 * resolves; "hf-model" for the root. A longer one than a model name holds is refused, not cut
 * (profiles match models by name). */
static int hf_name(const char *path, model_spec *m, err_t *err) {
    char *dir = NULL;
    const char *slash = strrchr(path, '/'), *file = slash ? slash + 1 : path;
    if (strcmp(file, "config.json") == 0) dir = slash ? str_printf("%.*s", (int)(slash - path), path) : xstrdup(".");
    char *name = str_path_name(dir ? (*dir ? dir : "/") : path); /* "/config.json": the root's */
    int rc = str_fmt(m->name, sizeof m->name, err, "the model name taken from the directory's name", "%s",
                     *name ? name : "hf-model");
    free(name);
    free(dir);
    return rc < 0 ? err_prefix(err, "%s", path) : 0;
}

/* The spec from a parsed config.json: src names it in errors. */
static int hf_spec(const char *src, const cJSON *root, model_spec *m, err_t *err) {
    hf_ctx h = {{src, err}, root, HF_LLAMA};
    memset(m, 0, sizeof *m);
    hf_spec_fn spec = NULL;
    int rc = json_expect_object(&h.c, root, "config") < 0 || hf_arch(&h, &m->arch, &spec) < 0 ? -1 : 0;
    if (rc == 0) rc = spec(&h, m);
    if (rc < 0) return -1;
    m->default_seq = m->max_seq < 1024 ? m->max_seq : 1024;
    if (m->sliding_window > 0 && m->default_seq > m->sliding_window) m->default_seq = m->sliding_window; /* fits */
    if (model_validate(m, err) < 0) return err_prefix(err, "%s", src);
    return 0;
}

int model_load_hf_config(const char *path, model_spec *out, err_t *err) {
    char file[PATH_MAX];
    struct stat st;
    bool dir = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
    if (str_fmt(file, sizeof file, err, "the model path", dir ? "%s/config.json" : "%s", path) < 0) return -1;
    cJSON *root = json_load_file(file, err);
    if (!root) return -1;
    model_spec m;
    int rc = hf_spec(file, root, &m, err);
    cJSON_Delete(root);
    if (rc < 0 || hf_name(file, &m, err) < 0) return -1;
    *out = m;
    return 0;
}

int model_load_hf_string(const char *src, const char *text, size_t len, const char *name, model_spec *out,
                         err_t *err) {
    cJSON *root = json_parse(src, text, len, err);
    if (!root) return -1;
    model_spec m;
    int rc = hf_spec(src, root, &m, err);
    cJSON_Delete(root);
    if (rc < 0) return -1;
    snprintf(m.name, sizeof m.name, "%.63s", name && *name ? name : "hf-model"); /* the operator's, checked there */
    *out = m;
    return 0;
}
