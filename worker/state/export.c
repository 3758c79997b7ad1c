/* export.c - checkpoints to Hugging Face layouts (GPT2LMHeadModel, LlamaForCausalLM).
 *
 * GPT-2 stores its projections as Conv1D weights [in, out], so our [out, in] matrices are
 * transposed; Llama's q/k/v are the row blocks of our fused projection. Our RoPE is the
 * rotate-half form that transformers' Llama uses, so no row permutation is needed. import.c reads
 * these layouts back (export then import is the identity). */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/ckpt_dir.h"
#include "common/fileio.h"
#include "common/half.h"
#include "common/json_util.h"
#include "common/log.h"
#include "common/outputs.h"
#include "common/strutil.h"
#include "formats/safetensors.h"
#include "formats/tokenizer.h"
#include "model/weights.h"
#include "model/wmodel.h"
#include "planner/arch.h"
#include "planner/model_json.h"
#include "state/ckpt.h"
#include "state/export.h"
#include "state/mtok.h"

typedef struct exporter {
    const model_spec *m;
    bool allow_unused; /* --allow-unused-weights (model/weights.h) */
    st_dtype dtype;    /* of the tensors written: ST_F32, ST_BF16, ST_F16 */
    float **unit; /* [units]: every unit's parameters, flat (wmodel's layout) */
    st_writer *w;
    void **owned; /* buffers the writer references until the save */
    int n_owned, cap_owned;
    tok_id recorded; /* the checkpoint's metadata cephalo.tokenizer */
    char overflow[200]; /* the first value float16 cannot hold, "" when none */
} exporter;

static void *own(exporter *x, int64_t bytes) {
    if (x->n_owned == x->cap_owned) {
        x->cap_owned = x->cap_owned ? 2 * x->cap_owned : 64;
        x->owned = xrealloc(x->owned, (size_t)x->cap_owned * sizeof(void *));
    }
    return x->owned[x->n_owned++] = xmalloc((size_t)(bytes ? bytes : 1));
}

/* Adds tensor hf of n floats d in the export's dtype; a value float16 cannot hold (it would
 * become inf) is remembered for the error. */
static void add_tensor(exporter *x, const char *hf, int ndim, const int64_t *shape, float *d, int64_t n) {
    if (x->dtype == ST_F32) {
        st_writer_add(x->w, hf, ST_F32, ndim, shape, d);
        return;
    }
    uint16_t *h = own(x, n * 2);
    for (int64_t i = 0; i < n; i++) {
        h[i] = x->dtype == ST_BF16 ? half_bf16_round(d[i]) : half_fp16_round(d[i]); /* as transformers' .to() */
        if (x->dtype == ST_F16 && (h[i] & 0x7c00u) == 0x7c00u && !x->overflow[0])
            snprintf(x->overflow, sizeof x->overflow, "%s[%lld] = %g", hf, (long long)i, (double)d[i]);
    }
    st_writer_add(x->w, hf, x->dtype, ndim, shape, h);
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
    float *d = own(x, rows * cols * (int64_t)sizeof(float));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            d[transpose ? c * rows + r : r * cols + c] = s[(r0 + r) * cols + c];
    if (info.ndim == 1) add_tensor(x, hf, 1, (int64_t[]){rows}, d, rows);
    else if (transpose) add_tensor(x, hf, 2, (int64_t[]){cols, rows}, d, rows * cols);
    else add_tensor(x, hf, 2, (int64_t[]){rows, cols}, d, rows * cols);
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
        if (m->qkv_bias) { /* Qwen2 */
            put(x, LAYER("self_attn.q_proj.bias"), u, "attn.qkv.bias", 0, q, false);
            put(x, LAYER("self_attn.k_proj.bias"), u, "attn.qkv.bias", q, kv, false);
            put(x, LAYER("self_attn.v_proj.bias"), u, "attn.qkv.bias", q + kv, kv, false);
        }
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

static const char *torch_dtype(st_dtype d) { return d == ST_BF16 ? "bfloat16" : d == ST_F16 ? "float16" : "float32"; }

static cJSON *hf_config(const model_spec *m, st_dtype dtype, int32_t bos, int32_t eos) {
    cJSON *o = cJSON_CreateObject();
    bool gpt = m->arch == ARCH_GPT;
    const hf_family_desc *fam = hf_family_of(m); /* the Llama relative the spec's fields make it */
    cJSON *arch = cJSON_AddArrayToObject(o, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString(fam->hf_class));
    cJSON_AddStringToObject(o, "model_type", fam->model_type);
    cJSON_AddNumberToObject(o, "vocab_size", m->vocab);
    cJSON_AddStringToObject(o, "torch_dtype", torch_dtype(dtype));
    /* the tokenizer's special tokens; null without a tokenizer, since the config classes'
     * defaults (GPT-2's 50256, Llama's 1 and 2) would be wrong for another vocabulary */
    if (bos >= 0) cJSON_AddNumberToObject(o, "bos_token_id", bos);
    else cJSON_AddNullToObject(o, "bos_token_id");
    if (eos >= 0) cJSON_AddNumberToObject(o, "eos_token_id", eos);
    else cJSON_AddNullToObject(o, "eos_token_id");
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
        if (m->sliding_window) cJSON_AddNumberToObject(o, "sliding_window", m->sliding_window);
        if (m->qkv_bias) cJSON_AddBoolToObject(o, "use_sliding_window", false);
        if (m->rope_scaling == ROPE_PLAIN) cJSON_AddNullToObject(o, "rope_scaling");
        else { /* config.json's form: the spec's JSON (model_json.c) writes the same keys */
            cJSON *spec = model_to_json(m);
            cJSON_AddItemToObject(o, "rope_scaling", cJSON_DetachItemFromObject(spec, "rope_scaling"));
            cJSON_Delete(spec);
        }
    }
    return o;
}

/* A --dump file (init.safetensors, final.safetensors): every tensor under "UNIT.NAME". Told
 * from a checkpoint shard by the shard's format metadata, not by a tensor: a rank the plan gives
 * no share of a unit writes none of that unit's tensors (make demo's 64 MiB device, holding 0%). */
static bool is_dump(const st_file *f) {
    const char *fmt = st_meta(f, "cephalo.format");
    return !fmt || strcmp(fmt, CKPT_FORMAT) != 0;
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
    if (rc == 0) rc = ckpt_read_tokenizer(f, &x->recorded, err);
    if (rc == 0) {
        x->unit = xcalloc((size_t)model_n_units(m), sizeof *x->unit);
        for (int u = 0; u < model_n_units(m); u++) x->unit[u] = xmalloc((size_t)model_unit_params(m, u) * sizeof(float));
    }
    if (rc == 0 && is_dump(f)) {
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

int export_read_checkpoint(const char *checkpoint, model_spec *m, bool allow_unused, float ***units, tok_id *recorded,
                           err_t *err) {
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
    *recorded = x.recorded;
    return 0;
}

/* The tokenizer to export: --tokenizer, else the one kept beside the checkpoint (mtok.h); it must
 * be the one the checkpoint records, when it records one, and fit the model's vocabulary. *t
 * stays NULL when there is none. */
static int export_tokenizer(const exporter *x, const char *resolved, const export_opts *o, tok **t, char *file,
                            size_t n, err_t *err) {
    mtok kept = {0};
    *t = NULL;
    if (o->tokenizer) snprintf(file, n, "%s", o->tokenizer);
    else if (mtok_for_checkpoint(resolved, x->recorded, &kept, err) < 0) return -1;
    else snprintf(file, n, "%s", kept.path);
    if (!file[0]) return 0;
    if (tok_load(t, file, err) < 0) return -1;
    tok_id id = tok_identity(*t);
    char a[TOK_ID_NAME_MAX], b[TOK_ID_NAME_MAX];
    tok_id_name(id, a);
    tok_id_name(x->recorded, b);
    if (x->recorded.kind && !tok_id_equal(id, x->recorded))
        return err_set(err, "%s is tokenizer %s, but the checkpoint %s was trained with %s: not this model's tokenizer",
                       file, a, resolved, b);
    if (tok_vocab_size(*t) > x->m->vocab)
        return err_set(err, "%s: the tokenizer has %d tokens but the model's vocabulary only %d: not this model's "
                            "tokenizer",
                       file, (int)tok_vocab_size(*t), x->m->vocab);
    return 0;
}

static int write_json(const char *dir, const char *name, cJSON *o, err_t *err) {
    char path[PATH_MAX];
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    int rc = str_fmt(path, sizeof path, err, "-o: the path", "%s/%s", dir, name);
    if (rc == 0) rc = file_write_atomic(path, text, strlen(text), 0, err);
    free(text);
    return rc;
}

static void add_token(cJSON *o, const char *key, const tok *t, int32_t id) {
    const char *s = id >= 0 ? tok_string(t, id) : NULL;
    if (s) cJSON_AddStringToObject(o, key, s);
}

/* The special-token ids transformers reads from config.json and generation_config.json: BOS
 * (else EOS, as GPT-2 has one token for both) and EOS; -1 without a tokenizer. */
static void special_ids(const tok *t, int32_t *bos, int32_t *eos) {
    *eos = t ? tok_eos(t) : -1;
    *bos = t ? tok_bos(t) : -1;
    if (*bos < 0) *bos = *eos;
}

/* tokenizer.json (a copy), tokenizer_config.json and special_tokens_map.json. The class is
 * PreTrainedTokenizerFast, which takes tokenizer.json as it is (its pre-tokenizer, decoder and
 * post-processor): GPT2Tokenizer and LlamaTokenizer would want vocab.json/merges.txt or
 * tokenizer.model for their slow forms and rebuild the post-processor in their fast ones. */
static int write_tokenizer(const char *dir, const tok *t, const char *file, const model_spec *m, err_t *err) {
    mtok src = {.id = tok_identity(t)};
    snprintf(src.path, sizeof src.path, "%s", file);
    int32_t bos, eos;
    special_ids(t, &bos, &eos);
    if (mtok_keep(&src, dir, err) < 0) return -1;
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "tokenizer_class", "PreTrainedTokenizerFast");
    add_token(c, "bos_token", t, bos);
    add_token(c, "eos_token", t, eos);
    add_token(c, "unk_token", t, tok_unk(t));
    cJSON_AddNumberToObject(c, "model_max_length", m->max_seq);
    cJSON_AddBoolToObject(c, "clean_up_tokenization_spaces", false); /* decode the text as it was */
    if (write_json(dir, "tokenizer_config.json", c, err) < 0) return -1;
    cJSON *sp = cJSON_CreateObject();
    add_token(sp, "bos_token", t, bos);
    add_token(sp, "eos_token", t, eos);
    add_token(sp, "unk_token", t, tok_unk(t));
    return write_json(dir, "special_tokens_map.json", sp, err);
}

static int write_generation_config(const char *dir, int32_t bos, int32_t eos, err_t *err) {
    cJSON *g = cJSON_CreateObject();
    if (bos >= 0) cJSON_AddNumberToObject(g, "bos_token_id", bos);
    else cJSON_AddNullToObject(g, "bos_token_id");
    if (eos >= 0) cJSON_AddNumberToObject(g, "eos_token_id", eos); /* generate() stops there */
    else cJSON_AddNullToObject(g, "eos_token_id");
    return write_json(dir, "generation_config.json", g, err);
}

/* Removes what an earlier export (or a model directory copied in before the marker) left that
 * this one did not write: other weight files, a shard index, tokenizer files of another
 * tokenizer. Only names an export owns (common/outputs.h): the directory is this command's, as
 * out_check made sure. */
static int remove_stale(const char *dir, const char *const *written, err_t *err) {
    DIR *d = opendir(dir);
    if (!d) return err_set(err, "%s: cannot list: %s", dir, strerror(errno));
    int rc = 0;
    for (struct dirent *e; rc == 0 && (e = readdir(d));) {
        bool keep = !out_hf_export.owns(e->d_name) || !strcmp(e->d_name, out_hf_export.marker);
        for (int i = 0; !keep && written[i]; i++) keep = !strcmp(e->d_name, written[i]);
        if (keep) continue;
        char path[PATH_MAX];
        if ((rc = str_fmt(path, sizeof path, err, "-o: the path", "%s/%s", dir, e->d_name)) < 0) break;
        if (unlink(path) != 0) rc = err_set(err, "%s: cannot remove the earlier export's file: %s", path, strerror(errno));
        else fprintf(stderr, "export: removed %s (an earlier export's; this one does not write it)\n", path);
    }
    closedir(d);
    return rc;
}

static int write_export(exporter *x, const char *dir, const tok *t, const char *tok_file, err_t *err) {
    const model_spec *m = x->m;
    char path[PATH_MAX];
    int32_t bos, eos;
    special_ids(t, &bos, &eos);
    x->w = st_writer_new();
    if (m->arch == ARCH_GPT) gpt2_tensors(x);
    else llama_tensors(x);
    st_writer_meta(x->w, "format", "pt");
    int rc = 0;
    if (x->overflow[0])
        rc = err_set(err, "--dtype float16: %s is beyond float16's range (65504); export as bfloat16 or float32",
                     x->overflow);
    if (rc == 0) rc = str_fmt(path, sizeof path, err, "-o: the path", "%s/model.safetensors", dir);
    if (rc == 0) rc = st_writer_save(x->w, path, 0, err);
    st_writer_free(x->w);
    if (rc == 0) rc = write_json(dir, "config.json", hf_config(m, x->dtype, bos, eos), err);
    if (rc == 0) rc = write_generation_config(dir, bos, eos, err);
    if (rc == 0 && t) rc = write_tokenizer(dir, t, tok_file, m, err);
    static const char *const with_tok[] = {"model.safetensors", "config.json", "generation_config.json",
                                           "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", NULL};
    static const char *const without[] = {"model.safetensors", "config.json", "generation_config.json", NULL};
    if (rc == 0) rc = remove_stale(dir, t ? with_tok : without, err);
    return rc;
}

int export_hf(const char *checkpoint, const char *dir, const export_opts *o, bool *no_tokenizer, err_t *err) {
    model_spec m;
    exporter x = {.m = &m, .allow_unused = o->allow_unused, .dtype = o->dtype};
    char path[PATH_MAX], tok_file[PATH_MAX] = "";
    tok *t = NULL;
    int rc = ckpt_dir_resolve(checkpoint, path, sizeof path, err);
    if (rc == 0) rc = load(&x, &m, path, err);
    if (rc == 0 && !arch_of(m.arch)->hf)
        rc = err_set(err, "%s: export writes GPT-2 and Llama layouts; this checkpoint is a %s",
                     checkpoint, model_arch_name(m.arch));
    if (rc == 0) rc = export_tokenizer(&x, path, o, &t, tok_file, sizeof tok_file, err);
    if (rc == 0) rc = file_make_dir(dir, true, err);
    if (rc == 0) rc = out_mark(dir, &out_hf_export, err); /* export may write here again (common/outputs.h) */
    if (rc == 0) rc = write_export(&x, dir, t, tok_file, err);
    *no_tokenizer = t == NULL;
    tok_free(t);
    for (int i = 0; i < x.n_owned; i++) free(x.owned[i]);
    free(x.owned);
    for (int u = 0; x.unit && u < model_n_units(&m); u++) free(x.unit[u]);
    free(x.unit);
    return rc;
}
