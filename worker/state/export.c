/* export.c - checkpoints to Hugging Face layouts (GPT2LMHeadModel, LlamaForCausalLM).
 *
 * GPT-2 stores its projections as Conv1D weights [in, out], so our [out, in] matrices are
 * transposed; Llama's q/k/v are the row blocks of our fused projection. Our RoPE is the
 * rotate-half form that transformers' Llama uses, so no row permutation is needed. import.c reads
 * these layouts back (export then import is the identity). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/ckpt_dir.h"
#include "common/fileio.h"
#include "common/json_util.h"
#include "common/log.h"
#include "common/strutil.h"
#include "formats/safetensors.h"
#include "model/weights.h"
#include "model/wmodel.h"
#include "planner/model_json.h"
#include "state/ckpt.h"
#include "state/export.h"

typedef struct exporter {
    const model_spec *m;
    bool allow_unused; /* --allow-unused-weights (model/weights.h) */
    float **unit; /* [units]: every unit's parameters, flat (wmodel's layout) */
    st_writer *w;
    float **owned; /* buffers the writer references until the save */
    int n_owned, cap_owned;
} exporter;

static float *own(exporter *x, int64_t n) {
    if (x->n_owned == x->cap_owned) {
        x->cap_owned = x->cap_owned ? 2 * x->cap_owned : 64;
        x->owned = xrealloc(x->owned, (size_t)x->cap_owned * sizeof(float *));
    }
    return x->owned[x->n_owned++] = xmalloc((size_t)(n ? n : 1) * sizeof(float));
}

/* The parameters of tensor `name` in `unit` and its layout entry. */
static const float *src(exporter *x, int unit, const char *name, wm_tensor *info) {
    wm_tensor ts[WM_MAX_TENSORS];
    int n = wm_unit_tensors(x->m, unit, ts);
    for (int i = 0; i < n; i++)
        if (!strcmp(ts[i].name, name)) {
            *info = ts[i];
            return x->unit[unit] + ts[i].offset;
        }
    CHECK(!"tensor not in the layout");
    return NULL;
}

/* Copies rows [r0, r0+rows) of a [*, cols] tensor, transposed if asked, under the HF name. */
static void put(exporter *x, const char *hf, int unit, const char *name, int64_t r0, int64_t rows,
                bool transpose) {
    wm_tensor info;
    const float *s = src(x, unit, name, &info);
    int64_t cols = info.ndim == 2 ? info.shape[1] : 1;
    if (rows < 0) rows = info.shape[0];
    float *d = own(x, rows * cols);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            d[transpose ? c * rows + r : r * cols + c] = s[(r0 + r) * cols + c];
    if (info.ndim == 1) st_writer_add(x->w, hf, ST_F32, 1, (int64_t[]){rows}, d);
    else if (transpose) st_writer_add(x->w, hf, ST_F32, 2, (int64_t[]){cols, rows}, d);
    else st_writer_add(x->w, hf, ST_F32, 2, (int64_t[]){rows, cols}, d);
}

static void gpt2_tensors(exporter *x) {
    const model_spec *m = x->m;
    char hf[128];
    put(x, "transformer.wte.weight", 0, "wte", 0, -1, false);
    put(x, "transformer.wpe.weight", 0, "wpe", 0, -1, false);
    static const struct {
        const char *ours, *hf;
        bool t;
    } map[] = {{"ln_1.weight", "ln_1.weight", false},   {"ln_1.bias", "ln_1.bias", false},
               {"attn.qkv.weight", "attn.c_attn.weight", true},
               {"attn.qkv.bias", "attn.c_attn.bias", false},
               {"attn.proj.weight", "attn.c_proj.weight", true},
               {"attn.proj.bias", "attn.c_proj.bias", false},
               {"ln_2.weight", "ln_2.weight", false},   {"ln_2.bias", "ln_2.bias", false},
               {"mlp.fc.weight", "mlp.c_fc.weight", true}, {"mlp.fc.bias", "mlp.c_fc.bias", false},
               {"mlp.proj.weight", "mlp.c_proj.weight", true},
               {"mlp.proj.bias", "mlp.c_proj.bias", false}};
    for (int l = 0; l < m->n_layer; l++)
        for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
            snprintf(hf, sizeof hf, "transformer.h.%d.%s", l, map[i].hf);
            put(x, hf, l + 1, map[i].ours, 0, -1, map[i].t);
        }
    put(x, "transformer.ln_f.weight", m->n_layer + 1, "ln_f.weight", 0, -1, false);
    put(x, "transformer.ln_f.bias", m->n_layer + 1, "ln_f.bias", 0, -1, false);
}

static void llama_tensors(exporter *x) {
    const model_spec *m = x->m;
    int64_t hd = m->d_model / m->n_head, q = m->n_head * hd, kv = m->n_kv_head * hd;
    char hf[128];
    put(x, "model.embed_tokens.weight", 0, "tokens", 0, -1, false);
    for (int l = 0; l < m->n_layer; l++) {
        int u = l + 1;
#define LAYER(suffix) (snprintf(hf, sizeof hf, "model.layers.%d.%s", l, suffix), hf)
        put(x, LAYER("input_layernorm.weight"), u, "attn_norm.weight", 0, -1, false);
        put(x, LAYER("self_attn.q_proj.weight"), u, "attn.qkv.weight", 0, q, false);
        put(x, LAYER("self_attn.k_proj.weight"), u, "attn.qkv.weight", q, kv, false);
        put(x, LAYER("self_attn.v_proj.weight"), u, "attn.qkv.weight", q + kv, kv, false);
        put(x, LAYER("self_attn.o_proj.weight"), u, "attn.o.weight", 0, -1, false);
        put(x, LAYER("post_attention_layernorm.weight"), u, "mlp_norm.weight", 0, -1, false);
        put(x, LAYER("mlp.gate_proj.weight"), u, "mlp.gate.weight", 0, -1, false);
        put(x, LAYER("mlp.up_proj.weight"), u, "mlp.up.weight", 0, -1, false);
        put(x, LAYER("mlp.down_proj.weight"), u, "mlp.down.weight", 0, -1, false);
#undef LAYER
    }
    put(x, "model.norm.weight", m->n_layer + 1, "norm.weight", 0, -1, false);
    /* a tied head has no lm_head of its own: transformers ties it to embed_tokens on load */
    if (!m->tied_head) put(x, "lm_head.weight", m->n_layer + 1, "lm_head.weight", 0, -1, false);
}

/* The model's own epsilon when it has one (an imported config's), else the float we compute with
 * in its shortest decimal form. */
static double hf_eps(const model_spec *m) { return m->norm_eps > 0 ? m->norm_eps : json_float_decimal(wm_norm_eps(m)); }

static cJSON *hf_config(const model_spec *m) {
    cJSON *o = cJSON_CreateObject();
    bool gpt = m->arch == ARCH_GPT;
    cJSON *arch = cJSON_AddArrayToObject(o, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString(gpt ? "GPT2LMHeadModel" : "LlamaForCausalLM"));
    cJSON_AddStringToObject(o, "model_type", gpt ? "gpt2" : "llama");
    cJSON_AddNumberToObject(o, "vocab_size", m->vocab);
    cJSON_AddStringToObject(o, "torch_dtype", "float32");
    if (gpt) {
        cJSON_AddNumberToObject(o, "n_embd", m->d_model);
        cJSON_AddNumberToObject(o, "n_head", m->n_head);
        cJSON_AddNumberToObject(o, "n_layer", m->n_layer);
        cJSON_AddNumberToObject(o, "n_positions", m->max_seq);
        cJSON_AddNumberToObject(o, "n_ctx", m->max_seq);
        cJSON_AddNumberToObject(o, "n_inner", m->d_ff);
        cJSON_AddStringToObject(o, "activation_function", "gelu_new");
        cJSON_AddNumberToObject(o, "layer_norm_epsilon", hf_eps(m));
        cJSON_AddBoolToObject(o, "tie_word_embeddings", true);
    } else {
        cJSON_AddNumberToObject(o, "hidden_size", m->d_model);
        cJSON_AddNumberToObject(o, "intermediate_size", m->d_ff);
        cJSON_AddNumberToObject(o, "num_attention_heads", m->n_head);
        cJSON_AddNumberToObject(o, "num_key_value_heads", m->n_kv_head);
        cJSON_AddNumberToObject(o, "num_hidden_layers", m->n_layer);
        cJSON_AddNumberToObject(o, "max_position_embeddings", m->max_seq);
        cJSON_AddNumberToObject(o, "rms_norm_eps", hf_eps(m));
        cJSON_AddNumberToObject(o, "rope_theta", model_rope_theta(m));
        cJSON_AddStringToObject(o, "hidden_act", "silu");
        cJSON_AddBoolToObject(o, "tie_word_embeddings", m->tied_head);
    }
    return o;
}

/* A --dump file (init.safetensors, final.safetensors): every tensor under "UNIT.NAME". */
static bool is_dump(const st_file *f, const model_spec *m) {
    char uname[48], key[160];
    model_unit_name(m, 0, uname, sizeof uname);
    snprintf(key, sizeof key, "param.%s", uname);
    return st_find(f, key) == NULL;
}

/* Every tensor "UNIT.NAME" of the model, checked finite; and nothing else in the file. */
static int read_dump(exporter *x, const st_file *f, err_t *err) {
    const model_spec *m = x->m;
    weights_used used = {0};
    int rc = 0;
    for (int u = 0; rc == 0 && u < model_n_units(m); u++) {
        wm_tensor ts[WM_MAX_TENSORS];
        int n = wm_unit_tensors(m, u, ts);
        char uname[48], key[192];
        model_unit_name(m, u, uname, sizeof uname);
        for (int i = 0; rc == 0 && i < n; i++) {
            const void *data;
            snprintf(key, sizeof key, "%.47s.%.47s", uname, ts[i].name);
            weights_use(&used, key);
            if ((rc = st_expect(f, key, ST_F32, ts[i].ndim, ts[i].shape, &data, err)) < 0) break;
            float *dst = x->unit[u] + ts[i].offset;
            memcpy(dst, data, (size_t)ts[i].numel * sizeof(float));
            int64_t bad = weights_first_nonfinite(dst, ts[i].numel);
            if (bad >= 0) rc = weights_nonfinite(err, st_label(f), key, NULL, ts[i].shape, ts[i].ndim, bad, dst[bad]);
        }
    }
    int n = st_count(f);
    const char **found = xcalloc((size_t)n + 1, sizeof *found);
    for (int i = 0; i < n; i++) found[i] = st_tensor_at(f, i)->name;
    char model[160];
    snprintf(model, sizeof model, "metadata cephalo.model describes %s with %d layer%s", m->name, m->n_layer,
             m->n_layer == 1 ? "" : "s");
    if (rc == 0) rc = weights_check_unused(&used, st_label(f), found, n, x->allow_unused, model, err);
    free(found);
    weights_used_free(&used);
    return rc;
}

/* Reads the model and every unit's parameters from a checkpoint (one file, or the per-rank files
 * of a step directory, assembled by ckpt_set) or a --dump file. */
static int load(exporter *x, model_spec *m, const char *path, err_t *err) {
    char file[PATH_MAX], name[48];
    struct stat st;
    bool dir = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
    if (dir) ckpt_shard_name(0, name, sizeof name);
    if (str_fmt(file, sizeof file, err, "checkpoint path", dir ? "%s/%s" : "%s", path, name) < 0) return -1;
    st_file *f;
    if (st_open(&f, file, err) < 0) return -1;
    int rc = ckpt_read_model(f, m, err);
    if (rc == 0) {
        x->unit = xcalloc((size_t)model_n_units(m), sizeof *x->unit);
        for (int u = 0; u < model_n_units(m); u++) x->unit[u] = xmalloc((size_t)model_unit_params(m, u) * sizeof(float));
    }
    if (rc == 0 && is_dump(f, m)) {
        rc = read_dump(x, f, err);
        st_close(f);
        return rc;
    }
    st_close(f);
    if (rc < 0) return -1;
    ckpt_set *set = ckpt_set_open(path, m, x->allow_unused, NULL, err);
    if (!set) return -1;
    for (int u = 0; rc == 0 && u < model_n_units(m); u++) {
        char uname[48];
        model_unit_name(m, u, uname, sizeof uname);
        rc = ckpt_set_read(set, "param", u, uname, 0, model_unit_params(m, u), x->unit[u], err);
    }
    ckpt_set_close(set);
    return rc;
}

int export_read_checkpoint(const char *checkpoint, model_spec *m, bool allow_unused, float ***units, err_t *err) {
    exporter x = {.m = m, .allow_unused = allow_unused};
    char path[PATH_MAX];
    int rc = ckpt_dir_resolve(checkpoint, path, sizeof path, err);
    if (rc == 0) rc = load(&x, m, path, err);
    if (rc < 0) {
        for (int u = 0; x.unit && u < model_n_units(m); u++) free(x.unit[u]);
        free(x.unit);
        return -1;
    }
    *units = x.unit;
    return 0;
}

int export_hf(const char *checkpoint, const char *dir, bool allow_unused, err_t *err) {
    model_spec m;
    exporter x = {.m = &m, .allow_unused = allow_unused};
    char path[PATH_MAX];
    int rc = ckpt_dir_resolve(checkpoint, path, sizeof path, err);
    if (rc == 0) rc = load(&x, &m, path, err);
    if (rc == 0 && m.arch != ARCH_GPT && m.arch != ARCH_LLAMA)
        rc = err_set(err, "%s: export writes GPT-2 and Llama layouts; this checkpoint is a %s",
                     checkpoint, model_arch_name(m.arch));
    if (rc == 0) rc = file_make_dir(dir, true, err);
    if (rc == 0) rc = out_mark(dir, &out_hf_export, err); /* export may write here again (common/outputs.h) */
    if (rc == 0) {
        x.w = st_writer_new();
        if (m.arch == ARCH_GPT) gpt2_tensors(&x);
        else llama_tensors(&x);
        st_writer_meta(x.w, "format", "pt");
        rc = str_fmt(path, sizeof path, err, "-o: the path", "%s/model.safetensors", dir);
        if (rc == 0) rc = st_writer_save(x.w, path, err);
        if (rc == 0) rc = str_fmt(path, sizeof path, err, "-o: the path", "%s/config.json", dir);
        if (rc == 0) {
            cJSON *config = hf_config(&m);
            char *cfg = cJSON_Print(config);
            cJSON_Delete(config);
            rc = file_write_atomic(path, cfg, strlen(cfg), err);
            free(cfg);
        }
        st_writer_free(x.w);
    }
    for (int i = 0; i < x.n_owned; i++) free(x.owned[i]);
    free(x.owned);
    for (int u = 0; x.unit && u < model_n_units(&m); u++) free(x.unit[u]);
    free(x.unit);
    return rc;
}
