/* import.c - initial weights from a Hugging Face model directory (docs/import.md).
 *
 * The inverse of export.c: GPT-2's Conv1D weights [in, out] are transposed to our [out, in];
 * Llama's q_proj, k_proj and v_proj become the row blocks of our fused attn.qkv. Every tensor
 * is converted to fp32 on the way (BF16 and F16 widen exactly), so export then import gives back
 * the same bits.
 *
 * A rank asks for one contiguous range of a unit's flat buffer at a time (its FSDP shard); the
 * range is cut into the pieces of the Hugging Face tensors it covers and only those bytes are
 * read from the mapped files. Nothing here holds more than the caller's range.
 *
 * A sharded directory is read as its index says: each tensor from the shard its weight_map names.
 * The files must hold no weight the model leaves out, and every value read must be finite
 * (model/weights.h, the checks every loader by name makes). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/half.h"
#include "common/json_util.h"
#include "common/log.h"
#include "common/str_map.h"
#include "common/strutil.h"
#include "formats/safetensors.h"
#include "formats/torchbin.h"
#include "model/import.h"
#include "model/weights.h"
#include "model/wmodel.h"
#include "planner/arch.h"
#include "planner/model_json.h"

/* Rows [row0, row0 + rows) of one of our tensors come from Hugging Face tensor `hf`, which is
 * stored [rows, cols] (or [rows] for vectors), or [cols, rows] when `transpose` (Conv1D). */
typedef struct piece {
    char hf[160];
    int64_t row0, rows;
    bool transpose;
} piece;

#define MAX_PIECES 3

/* A weight_map entry: the tensor `name` is read from files[file]. */
typedef struct hf_entry {
    char *name;
    int file;
} hf_entry;

struct hf_import {
    const model_spec *m;
    char *dir; /* the model directory, as given */
    st_file **files;
    int n_files;
    hf_entry *map; /* a sharded directory's weight_map, sorted by name (n_map 0: one file) */
    int n_map;
    char index[PATH_MAX]; /* its path */
    bool allow_unused;
    const char *gpt2_prefix; /* "transformer." or "" (the original gpt2 files have none) */
};

/* ---- the name map: our (unit, tensor) -> Hugging Face tensors ---- */

static int gpt2_pieces(const hf_import *imp, int unit, const wm_tensor *t, piece *p) {
    static const struct {
        const char *ours, *hf;
        bool transpose;
    } block[] = {{"ln_1.weight", "ln_1.weight", false},         {"ln_1.bias", "ln_1.bias", false},
                 {"attn.qkv.weight", "attn.c_attn.weight", true}, {"attn.qkv.bias", "attn.c_attn.bias", false},
                 {"attn.proj.weight", "attn.c_proj.weight", true}, {"attn.proj.bias", "attn.c_proj.bias", false},
                 {"ln_2.weight", "ln_2.weight", false},         {"ln_2.bias", "ln_2.bias", false},
                 {"mlp.fc.weight", "mlp.c_fc.weight", true},     {"mlp.fc.bias", "mlp.c_fc.bias", false},
                 {"mlp.proj.weight", "mlp.c_proj.weight", true}, {"mlp.proj.bias", "mlp.c_proj.bias", false}};
    const char *pre = imp->gpt2_prefix;
    p->row0 = 0, p->rows = t->shape[0], p->transpose = false;
    switch (model_unit_kind(imp->m, unit)) {
    case UNIT_EMBEDDING: /* wte, wpe */
        snprintf(p->hf, sizeof p->hf, "%s%s.weight", pre, t->name);
        return 1;
    case UNIT_HEAD: /* ln_f.weight, ln_f.bias */
        snprintf(p->hf, sizeof p->hf, "%s%s", pre, t->name);
        return 1;
    case UNIT_BLOCK:
        for (size_t i = 0; i < sizeof block / sizeof block[0]; i++)
            if (!strcmp(block[i].ours, t->name)) {
                snprintf(p->hf, sizeof p->hf, "%sh.%d.%s", pre, unit - 1, block[i].hf);
                p->transpose = block[i].transpose;
                return 1;
            }
    }
    CHECK(!"a GPT tensor without a Hugging Face name");
    return 0;
}

static int llama_pieces(const hf_import *imp, int unit, const wm_tensor *t, piece *p) {
    static const struct {
        const char *ours, *hf;
    } block[] = {{"attn_norm.weight", "input_layernorm.weight"}, {"attn.o.weight", "self_attn.o_proj.weight"},
                 {"mlp_norm.weight", "post_attention_layernorm.weight"}, {"mlp.gate.weight", "mlp.gate_proj.weight"},
                 {"mlp.up.weight", "mlp.up_proj.weight"}, {"mlp.down.weight", "mlp.down_proj.weight"}};
    const model_spec *m = imp->m;
    p->row0 = 0, p->rows = t->shape[0], p->transpose = false;
    switch (model_unit_kind(m, unit)) {
    case UNIT_EMBEDDING: snprintf(p->hf, sizeof p->hf, "model.embed_tokens.weight"); return 1;
    case UNIT_HEAD:
        snprintf(p->hf, sizeof p->hf, "%s", !strcmp(t->name, "norm.weight") ? "model.norm.weight" : "lm_head.weight");
        return 1;
    case UNIT_BLOCK:
        bool bias = !strcmp(t->name, "attn.qkv.bias"); /* Qwen2's */
        if (bias || !strcmp(t->name, "attn.qkv.weight")) { /* rows: q heads, k heads, v heads */
            int64_t hd = m->d_model / m->n_head, q = m->n_head * hd, kv = m->n_kv_head * hd;
            static const char *const names[] = {"q_proj", "k_proj", "v_proj"};
            int64_t r0[] = {0, q, q + kv}, rows[] = {q, kv, kv};
            for (int i = 0; i < 3; i++) {
                snprintf(p[i].hf, sizeof p[i].hf, "model.layers.%d.self_attn.%s.%s", unit - 1, names[i],
                         bias ? "bias" : "weight");
                p[i].row0 = r0[i], p[i].rows = rows[i], p[i].transpose = false;
            }
            return 3;
        }
        for (size_t i = 0; i < sizeof block / sizeof block[0]; i++)
            if (!strcmp(block[i].ours, t->name)) {
                snprintf(p->hf, sizeof p->hf, "model.layers.%d.%s", unit - 1, block[i].hf);
                return 1;
            }
    }
    CHECK(!"a Llama tensor without a Hugging Face name");
    return 0;
}

/* The architecture config.json names, as far as the spec tells (messages). */
static const char *hf_family_name(const model_spec *m) { return hf_family_of(m)->display; }

static int pieces_of(const hf_import *imp, int unit, const wm_tensor *t, piece *p) {
    return imp->m->arch == ARCH_GPT ? gpt2_pieces(imp, unit, t, p) : llama_pieces(imp, unit, t, p);
}

/* ---- files ---- */

static int entry_cmp(const void *a, const void *b) {
    return strcmp(((const hf_entry *)a)->name, ((const hf_entry *)b)->name);
}

static const hf_entry *map_entry(const hf_import *imp, const char *name) {
    hf_entry key = {(char *)name, 0};
    return imp->n_map ? bsearch(&key, imp->map, (size_t)imp->n_map, sizeof key, entry_cmp) : NULL;
}

/* The tensor `name` from the file that holds it: the one file, or the shard the index's
 * weight_map names (never another shard's copy), or NULL. *file may be NULL. */
static const st_tensor *find(const hf_import *imp, const char *name, const st_file **file) {
    const hf_entry *e = imp->n_map ? map_entry(imp, name) : NULL;
    if (imp->n_map && !e) return NULL;
    const st_file *f = imp->files[e ? e->file : 0];
    if (file) *file = f;
    return st_find(f, name);
}

static int add_file(hf_import *imp, const char *name, err_t *err) {
    char path[PATH_MAX];
    /* the name is the index's: a cut path would open another file */
    if (str_fmt(path, sizeof path, err, "the weights' path", "%s/%s", imp->dir, name) < 0) return -1;
    imp->files = xrealloc(imp->files, (size_t)(imp->n_files + 1) * sizeof *imp->files);
    /* torch.save's pickles by their name, as transformers tells them apart (formats/torchbin.h) */
    size_t n = strlen(name);
    bool bin = n > 4 && !strcmp(name + n - 4, ".bin");
    if ((bin ? tb_open : st_open)(&imp->files[imp->n_files], path, err) < 0) return -1;
    imp->n_files++;
    return 0;
}

/* The index of the shard named `file`, opened on first use (each shard once), or -1. The shards
 * opened are found by name in `names`: the weight map names one for each of its tensors. */
static int shard_of(hf_import *imp, const char *file, str_map *names, err_t *err) {
    long i = str_map_get(names, file);
    if (i >= 0) return (int)i;
    str_map_put(names, file, imp->n_files);
    return add_file(imp, file, err) < 0 ? -1 : imp->n_files - 1;
}

/* A model.safetensors.index.json (or pytorch_model.bin.index.json): its weight_map (a tensor named twice is refused, as is any key
 * given twice) and each shard it names, opened once. */
static int open_index(hf_import *imp, err_t *err) {
    const char *index = imp->index;
    cJSON *root = json_load_file(index, err);
    if (!root) return -1;
    json_ctx c = {index, err};
    const cJSON *map = NULL;
    int rc = json_expect_object(&c, root, "index") < 0 ||
                     json_require(&c, root, "", "weight_map", &map) < 0 ||
                     json_expect_object(&c, map, "weight_map") < 0
                 ? -1
                 : 0;
    int n = rc == 0 ? cJSON_GetArraySize(map) : 0;
    str_map names = {0}; /* the shards' file names -> files[] */
    imp->map = xcalloc((size_t)n + 1, sizeof *imp->map);
    for (const cJSON *e = map ? map->child : NULL; rc == 0 && e; e = e->next) {
        char at[200];
        const char *file;
        snprintf(at, sizeof at, "weight_map.%.150s", e->string);
        if (json_string(&c, e, at, &file) < 0) rc = -1;
        else if (strchr(file, '/') || !strcmp(file, ".."))
            rc = err_set(err, "%s: %s: \"%s\" is not a file name in the model directory", index, at, file);
        int k = rc == 0 ? shard_of(imp, file, &names, err) : -1;
        if (k < 0) rc = -1;
        else imp->map[imp->n_map++] = (hf_entry){xstrdup(e->string), k};
    }
    if (rc == 0 && imp->n_map == 0) rc = err_set(err, "%s: weight_map lists no tensors", index);
    if (imp->n_map > 1) qsort(imp->map, (size_t)imp->n_map, sizeof *imp->map, entry_cmp);
    str_map_free(&names);
    cJSON_Delete(root);
    return rc;
}

/* The index and its shards agree: every tensor it lists is in the shard it names, and every
 * tensor of a shard is listed. A copy of a tensor in another shard than the index names is not
 * read, and said so. */
static int check_index(const hf_import *imp, err_t *err) {
    for (int i = 0; i < imp->n_map; i++) {
        const hf_entry *e = &imp->map[i];
        if (!st_find(imp->files[e->file], e->name))
            return err_set(err, "%s: weight_map places tensor '%s' in %s, which does not hold it", imp->index,
                           e->name, st_label(imp->files[e->file]));
    }
    for (int k = 0; k < imp->n_files; k++) {
        const st_file *f = imp->files[k];
        for (int i = 0; i < st_count(f); i++) {
            const char *name = st_tensor_at(f, i)->name;
            const hf_entry *e = map_entry(imp, name);
            if (!e)
                return err_set(err, "%s: tensor '%s' is not in the weight_map of %s (an index that does not "
                               "list every tensor of its shards is refused: which copy is meant is unknown)",
                               st_label(f), name, imp->index);
            if (e->file != k)
                log_warn("%s: tensor '%s' is also in this shard, but the index places it in %s: that copy is "
                         "read, this one is not", st_label(f), name, st_label(imp->files[e->file]));
        }
    }
    return 0;
}

static void shape_str(const int64_t *shape, int ndim, char *buf, size_t n) {
    size_t len = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && len < n; i++)
        len += (size_t)snprintf(buf + len, n - len, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (len < n) snprintf(buf + len, n - len, "]");
}

/* Piece p of a tensor of `cols` columns must be there with the shape it implies. */
static int check_piece(const hf_import *imp, const piece *p, int64_t cols, int ndim, err_t *err) {
    const st_file *f = NULL;
    const st_tensor *t = find(imp, p->hf, &f);
    if (!t)
        return err_set(err, "%s: tensor '%s' not found in %s (config.json says this is a %s model with "
                       "%d layers)", imp->dir, p->hf, imp->n_map ? "the weight_map of its index" : "its weights file",
                       hf_family_name(imp->m), imp->m->n_layer);
    int64_t want[2] = {p->rows, cols};
    if (p->transpose) want[0] = cols, want[1] = p->rows;
    bool same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == want[i];
    char a[64], b[64];
    if (!same) {
        shape_str(want, ndim, a, sizeof a);
        shape_str(t->shape, t->ndim, b, sizeof b);
        return err_set(err, "%s: tensor '%s': expected shape %s (from config.json), found %s",
                       st_label(f), p->hf, a, b);
    }
    if (t->dtype != ST_F32 && t->dtype != ST_BF16 && t->dtype != ST_F16 && t->dtype != ST_F64)
        return err_set(err, "%s: tensor '%s' is %s; import converts F32, BF16, F16 and F64", st_label(f), p->hf,
                       st_dtype_name(t->dtype));
    return 0;
}

/* ---- conversion ---- */

/* n elements of t starting at element `at`, `stride` apart, into dst as fp32. Files of other
 * writers need not align tensors to their element size, hence memcpy per element. */
static void convert(const st_tensor *t, int64_t at, int64_t n, int64_t stride, float *dst) {
    const unsigned char *base = t->data;
    size_t es = st_dtype_size(t->dtype);
    for (int64_t i = 0; i < n; i++) {
        const unsigned char *s = base + (size_t)(at + i * stride) * es;
        switch (t->dtype) {
        case ST_F32: memcpy(&dst[i], s, 4); break;
        case ST_F64: {
            double v;
            memcpy(&v, s, 8);
            dst[i] = (float)v;
            break;
        }
        default: {
            uint16_t h;
            memcpy(&h, s, 2);
            dst[i] = t->dtype == ST_BF16 ? half_bf16_widen(h) : half_fp16_widen(h);
        }
        }
    }
}

/* Elements [a, b) of our tensor (row-major [rows_total, cols]) that piece p covers, into dst
 * (dst[0] is element a); a value that is not finite is an error naming the tensor and element. */
static int read_piece(const hf_import *imp, const piece *p, int64_t cols, int64_t a, int64_t b, float *dst, err_t *err) {
    const st_file *f;
    const st_tensor *t = find(imp, p->hf, &f);
    int64_t lo = p->row0 * cols, hi = (p->row0 + p->rows) * cols;
    if (lo < a) lo = a;
    if (hi > b) hi = b;
    for (int64_t k = lo; k < hi;) {
        int64_t r = k / cols - p->row0, c = k % cols;
        int64_t run = cols - c < hi - k ? cols - c : hi - k; /* to the end of this row or range */
        float *out = dst + (k - a);
        /* the run's first element in the file's tensor, and the distance between its elements */
        int64_t at = p->transpose ? c * p->rows + r : r * cols + c, stride = p->transpose ? p->rows : 1;
        convert(t, at, run, stride, out); /* transposed: a column of [cols, rows] */
        int64_t bad = weights_first_nonfinite(out, run);
        if (bad >= 0) return weights_nonfinite(err, st_label(f), p->hf, NULL, t->shape, t->ndim, at + bad * stride, out[bad]);
        k += run;
    }
    return 0;
}

/* ---- the interface ---- */

int hf_import_range(hf_import *imp, int unit, int64_t lo, int64_t hi, float *out, err_t *err) {
    wm_tensor ts[WM_MAX_TENSORS];
    int n = wm_unit_tensors(imp->m, unit, ts);
    for (int i = 0; i < n; i++) {
        int64_t a = ts[i].offset > lo ? ts[i].offset : lo;
        int64_t b = ts[i].offset + ts[i].numel < hi ? ts[i].offset + ts[i].numel : hi;
        if (a >= b) continue;
        piece p[MAX_PIECES];
        int np = pieces_of(imp, unit, &ts[i], p);
        int64_t cols = ts[i].ndim == 2 ? ts[i].shape[1] : 1;
        for (int k = 0; k < np; k++)
            if (read_piece(imp, &p[k], cols, a - ts[i].offset, b - ts[i].offset, out + (a - lo), err) < 0) return -1;
    }
    return 0;
}

/* A tied model's lm_head that is a copy of its embedding, bit for bit: what transformers ties. */
static bool head_copies_embedding(const hf_import *imp) {
    char emb[64];
    if (imp->m->arch == ARCH_GPT) snprintf(emb, sizeof emb, "%swte.weight", imp->gpt2_prefix);
    else snprintf(emb, sizeof emb, "model.embed_tokens.weight");
    const st_tensor *h = find(imp, "lm_head.weight", NULL), *e = find(imp, emb, NULL);
    return h && e && h->dtype == e->dtype && h->ndim == e->ndim && h->nbytes == e->nbytes &&
           !memcmp(h->shape, e->shape, sizeof h->shape) && !memcmp(h->data, e->data, h->nbytes);
}

/* Tensors Hugging Face files carry that are no weights: GPT-2's causal-mask buffers, the RoPE
 * frequencies of older Llama files, and a tied model's lm_head when it duplicates the embedding
 * (one that differs is a head the tied model would lose: reported as unused). */
static bool not_a_weight(const hf_import *imp, const char *name) {
    size_t n = strlen(name);
    const char *const gpt2[] = {".attn.bias", ".attn.masked_bias", NULL}, *const llama[] = {".rotary_emb.inv_freq", NULL};
    const char *const *buffers = imp->m->arch == ARCH_GPT ? gpt2 : llama;
    for (int i = 0; buffers[i]; i++)
        if (n > strlen(buffers[i]) && !strcmp(name + n - strlen(buffers[i]), buffers[i])) return true;
    return imp->m->tied_head && !strcmp(name, "lm_head.weight") && head_copies_embedding(imp);
}

/* Every tensor the model needs is there with its shape and a dtype we convert; every tensor of
 * the files is one of them (weights.h). */
static int check_all(hf_import *imp, err_t *err) {
    const model_spec *m = imp->m;
    weights_used used = {0};
    int rc = 0;
    for (int u = 0; rc == 0 && u < model_n_units(m); u++) {
        wm_tensor ts[WM_MAX_TENSORS];
        int n = wm_unit_tensors(m, u, ts);
        for (int i = 0; rc == 0 && i < n; i++) {
            piece p[MAX_PIECES];
            int np = pieces_of(imp, u, &ts[i], p);
            for (int k = 0; rc == 0 && k < np; k++) {
                rc = check_piece(imp, &p[k], ts[i].ndim == 2 ? ts[i].shape[1] : 1, ts[i].ndim, err);
                weights_use(&used, p[k].hf);
            }
        }
    }
    /* the directory's tensors: the index's, or the one file's */
    int n = imp->n_map ? imp->n_map : st_count(imp->files[0]);
    const char **found = xcalloc((size_t)n + 1, sizeof *found);
    for (int i = 0; i < n; i++) {
        found[i] = imp->n_map ? imp->map[i].name : st_tensor_at(imp->files[0], i)->name;
        if (not_a_weight(imp, found[i])) weights_use(&used, found[i]);
    }
    char model[160];
    snprintf(model, sizeof model, "config.json describes a %s model with %d layer%s", hf_family_name(m),
             m->n_layer, m->n_layer == 1 ? "" : "s");
    if (rc == 0) rc = weights_check_unused(&used, imp->n_map ? imp->index : st_label(imp->files[0]), found, n,
                                           imp->allow_unused, model, err);
    free(found);
    weights_used_free(&used);
    return rc;
}

int hf_import_open(hf_import **out, const char *dir, const model_spec *m, bool allow_unused, err_t *err) {
    *out = NULL;
    if (!arch_of(m->arch)->hf)
        return err_set(err, "%s: import reads GPT-2 and Llama models; this is a %s model", dir, model_arch_name(m->arch));
    hf_import *imp = xcalloc(1, sizeof *imp);
    imp->m = m;
    imp->allow_unused = allow_unused;
    imp->dir = xstrdup(dir);
    /* as transformers looks for them: safetensors first, then torch.save's pickles */
    static const char *const singles[] = {"model.safetensors", "pytorch_model.bin"},
                             *const indexes[] = {"model.safetensors.index.json", "pytorch_model.bin.index.json"};
    int rc = 1;
    for (int k = 0; k < 2 && rc == 1; k++) {
        char single[PATH_MAX];
        struct stat st;
        if (str_fmt(imp->index, sizeof imp->index, err, "--init-from: the path", "%s/%s", dir, indexes[k]) < 0 ||
            str_fmt(single, sizeof single, err, "--init-from: the path", "%s/%s", dir, singles[k]) < 0)
            rc = -1;
        else if (stat(single, &st) == 0) rc = add_file(imp, singles[k], err);
        else if (stat(imp->index, &st) == 0) rc = open_index(imp, err) < 0 ? -1 : check_index(imp, err);
    }
    if (rc == 1)
        rc = err_set(err, "%s: no model.safetensors, model.safetensors.index.json, pytorch_model.bin or "
                     "pytorch_model.bin.index.json (expected a Hugging Face model directory)", dir);
    /* GPT-2's own files name its tensors without the "transformer." of GPT2LMHeadModel */
    imp->gpt2_prefix = rc == 0 && !find(imp, "transformer.wte.weight", NULL) && find(imp, "wte.weight", NULL)
                           ? ""
                           : "transformer.";
    if (rc == 0) rc = check_all(imp, err);
    if (rc < 0) {
        hf_import_close(imp);
        return -1;
    }
    *out = imp;
    return 0;
}

void hf_import_close(hf_import *imp) {
    if (!imp) return;
    for (int i = 0; i < imp->n_files; i++) st_close(imp->files[i]);
    for (int i = 0; i < imp->n_map; i++) free(imp->map[i].name);
    free(imp->map);
    free(imp->files);
    free(imp->dir);
    free(imp);
}

int hf_import_check_model(const char *dir, const model_spec *m, err_t *err) {
    model_spec cfg;
    if (model_load_hf_config(dir, &cfg, err) < 0) return -1;
    model_spec want = *m;
    /* the name is the directory's or the plan's, and defaults compare as their values; everything
     * else must agree */
    memcpy(cfg.name, m->name, sizeof cfg.name); /* one size */
    cfg.default_seq = want.default_seq;
    model_spec *both[] = {&cfg, &want};
    for (int i = 0; i < 2; i++) {
        both[i]->rope_theta = arch_of(both[i]->arch)->pos == POS_ROPE ? model_rope_theta(both[i]) : 0;
        both[i]->norm_eps = model_norm_eps(both[i]);
    }
    cJSON *a = model_to_json(&cfg), *b = model_to_json(&want);
    char diff[1024] = "";
    size_t len = 0;
    for (const cJSON *x = a->child; x && len < sizeof diff; x = x->next) {
        const cJSON *y = cJSON_GetObjectItemCaseSensitive(b, x->string);
        char *sx = cJSON_PrintUnformatted(x), *sy = y ? cJSON_PrintUnformatted(y) : NULL;
        if (!sy || strcmp(sx, sy))
            len += (size_t)snprintf(diff + len, sizeof diff - len, "%s%s %s vs %s", len ? ", " : "",
                                    x->string, sx, sy ? sy : "none");
        free(sx), free(sy);
    }
    cJSON_Delete(a), cJSON_Delete(b);
    if (!*diff) return 0;
    return err_set(err, "%s/config.json describes another model than the %s being trained (the plan's or "
                   "--model's): %s (config.json vs trained)", dir, m->name, diff);
}
