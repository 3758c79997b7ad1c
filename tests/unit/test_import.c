/* test_import.c - worker/model/import.c: any slice of a unit reads the same values as the whole
 * unit (FSDP shards of every size), the name and layout mapping on chosen elements, exact F16 and
 * BF16 widening (subnormals, signed zero), and the errors naming the tensor and shapes, the
 * element that is not finite, and the tensors the model does not use. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "formats/safetensors.h"
#include "model/import.h"
#include "model/wmodel.h"

static char dir[64];

/* A value that differs for every (tensor, element): mistakes cannot cancel. */
static float value_of(int tensor, int64_t i) { return (float)tensor + (float)i * 1e-4f; }

/* Writes dir/model.safetensors with every tensor `names` lists, shapes as given, F32. */
typedef struct hf_t {
    char name[96];
    int ndim;
    int64_t shape[2];
} hf_t;

static int n_hf;
static hf_t hf[64];

static void add(const char *name, int64_t a, int64_t b) {
    hf_t *t = &hf[n_hf++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = b ? 2 : 1;
    t->shape[0] = a, t->shape[1] = b;
}

/* Writes the tensors, each F32 with value_of's values, except up to two given by name with their
 * dtype and data (NULL names: none). */
typedef struct replaced {
    const char *name;
    st_dtype dtype;
    const void *data;
} replaced;

static void write_model_with(const replaced *r, int n_r) {
    st_writer *w = st_writer_new();
    float *bufs[64];
    for (int k = 0; k < n_hf; k++) {
        int64_t n = hf[k].shape[0] * (hf[k].ndim == 2 ? hf[k].shape[1] : 1);
        bufs[k] = xmalloc((size_t)n * sizeof(float));
        for (int64_t i = 0; i < n; i++) bufs[k][i] = value_of(k, i);
        int j = 0;
        while (j < n_r && strcmp(r[j].name, hf[k].name)) j++;
        if (j < n_r) st_writer_add(w, hf[k].name, r[j].dtype, hf[k].ndim, hf[k].shape, r[j].data);
        else st_writer_add(w, hf[k].name, ST_F32, hf[k].ndim, hf[k].shape, bufs[k]);
    }
    char path[128];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    err_t err;
    assert_int_equal(st_writer_save(w, path, 0, &err), 0);
    st_writer_free(w);
    for (int k = 0; k < n_hf; k++) free(bufs[k]);
}

static void write_model(void) { write_model_with(NULL, 0); }

static int hf_index(const char *name) {
    for (int k = 0; k < n_hf; k++)
        if (!strcmp(hf[k].name, name)) return k;
    fail_msg("no tensor %s", name);
    return -1;
}

static void gpt2_files(const model_spec *m) {
    int64_t d = m->d_model, ff = m->d_ff;
    char s[96];
    n_hf = 0;
    add("transformer.wte.weight", m->vocab, d);
    add("transformer.wpe.weight", m->max_seq, d);
    for (int l = 0; l < m->n_layer; l++) {
#define T(x) (snprintf(s, sizeof s, "transformer.h.%d.%s", l, x), s)
        add(T("ln_1.weight"), d, 0), add(T("ln_1.bias"), d, 0);
        add(T("attn.c_attn.weight"), d, 3 * d), add(T("attn.c_attn.bias"), 3 * d, 0);
        add(T("attn.c_proj.weight"), d, d), add(T("attn.c_proj.bias"), d, 0);
        add(T("ln_2.weight"), d, 0), add(T("ln_2.bias"), d, 0);
        add(T("mlp.c_fc.weight"), d, ff), add(T("mlp.c_fc.bias"), ff, 0);
        add(T("mlp.c_proj.weight"), ff, d), add(T("mlp.c_proj.bias"), d, 0);
#undef T
    }
    add("transformer.ln_f.weight", d, 0), add("transformer.ln_f.bias", d, 0);
    write_model();
}

static void llama_files(const model_spec *m) {
    int64_t d = m->d_model, ff = m->d_ff, hd = d / m->n_head, kv = m->n_kv_head * hd;
    char s[96];
    n_hf = 0;
    add("model.embed_tokens.weight", m->vocab, d);
    for (int l = 0; l < m->n_layer; l++) {
#define T(x) (snprintf(s, sizeof s, "model.layers.%d.%s", l, x), s)
        add(T("input_layernorm.weight"), d, 0);
        add(T("self_attn.q_proj.weight"), d, d), add(T("self_attn.k_proj.weight"), kv, d);
        add(T("self_attn.v_proj.weight"), kv, d), add(T("self_attn.o_proj.weight"), d, d);
        add(T("post_attention_layernorm.weight"), d, 0);
        add(T("mlp.gate_proj.weight"), ff, d), add(T("mlp.up_proj.weight"), ff, d);
        add(T("mlp.down_proj.weight"), d, ff);
#undef T
    }
    add("model.norm.weight", d, 0);
    if (!m->tied_head) add("lm_head.weight", m->vocab, d);
    write_model();
}

static int setup(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/cephalo-test-import-XXXXXX");
    assert_non_null(mkdtemp(dir));
    return 0;
}

static int teardown(void **state) {
    (void)state;
    char path[128];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    remove(path);
    rmdir(dir);
    return 0;
}

static model_spec builtin(const char *name) {
    model_spec m;
    err_t err;
    assert_int_equal(model_resolve(name, &m, &err), 0);
    return m;
}

/* Every unit read whole, then in slices of several sizes (the shards of uneven plans): equal. */
static void check_slices(const model_spec *m) {
    hf_import *imp;
    err_t err;
    assert_int_equal(hf_import_open(&imp, dir, m, false, &err), 0);
    for (int u = 0; u < model_n_units(m); u++) {
        int64_t n = model_unit_params(m, u);
        float *whole = xmalloc((size_t)n * sizeof(float)), *part = xmalloc((size_t)n * sizeof(float));
        assert_int_equal(hf_import_range(imp, u, 0, n, whole, &err), 0);
        static const int64_t steps[] = {1, 7, 100, 4093};
        for (size_t s = 0; s < sizeof steps / sizeof steps[0]; s++)
            for (int64_t lo = 0; lo < n; lo += steps[s] * 13 + 1) {
                int64_t hi = lo + steps[s] < n ? lo + steps[s] : n;
                assert_int_equal(hf_import_range(imp, u, lo, hi, part, &err), 0);
                assert_memory_equal(part, whole + lo, (size_t)(hi - lo) * sizeof(float));
            }
        free(whole), free(part);
    }
    hf_import_close(imp);
}

/* The element at (row, col) of our tensor `name` in `unit`. */
static float ours(hf_import *imp, const model_spec *m, int unit, const char *name, int64_t row, int64_t col) {
    wm_tensor ts[WM_MAX_TENSORS];
    int n = wm_unit_tensors(m, unit, ts);
    for (int i = 0; i < n; i++)
        if (!strcmp(ts[i].name, name)) {
            int64_t at = ts[i].offset + row * (ts[i].ndim == 2 ? ts[i].shape[1] : 1) + col;
            float v;
            err_t err;
            assert_int_equal(hf_import_range(imp, unit, at, at + 1, &v, &err), 0);
            return v;
        }
    fail_msg("no tensor %s", name);
    return 0;
}

static void test_gpt2(void **state) {
    (void)state;
    model_spec m = builtin("tiny-gpt");
    gpt2_files(&m);
    check_slices(&m);
    hf_import *imp;
    err_t err;
    assert_int_equal(hf_import_open(&imp, dir, &m, false, &err), 0);
    int64_t d = m.d_model;
    /* Conv1D [in, out]: our qkv (r, c) is c_attn (c, r) */
    int k = hf_index("transformer.h.1.attn.c_attn.weight");
    assert_true(ours(imp, &m, 2, "attn.qkv.weight", 5, 3) == value_of(k, 3 * (3 * d) + 5));
    k = hf_index("transformer.h.0.mlp.c_proj.weight"); /* [ff, d] -> ours [d, ff] */
    assert_true(ours(imp, &m, 1, "mlp.proj.weight", 2, 9) == value_of(k, 9 * d + 2));
    k = hf_index("transformer.wpe.weight");
    assert_true(ours(imp, &m, 0, "wpe", 3, 4) == value_of(k, 3 * d + 4));
    k = hf_index("transformer.ln_f.bias");
    assert_true(ours(imp, &m, 3, "ln_f.bias", 7, 0) == value_of(k, 7));
    hf_import_close(imp);
}

static void test_llama(void **state) {
    (void)state;
    model_spec m = builtin("tiny-llama"); /* GQA 4/2 */
    llama_files(&m);
    check_slices(&m);
    hf_import *imp;
    err_t err;
    assert_int_equal(hf_import_open(&imp, dir, &m, false, &err), 0);
    int64_t d = m.d_model, q = d, kv = m.n_kv_head * (d / m.n_head);
    /* the fused qkv rows: q heads, then k heads, then v heads */
    int k = hf_index("model.layers.1.self_attn.k_proj.weight");
    assert_true(ours(imp, &m, 2, "attn.qkv.weight", q + 3, 5) == value_of(k, 3 * d + 5));
    k = hf_index("model.layers.1.self_attn.v_proj.weight");
    assert_true(ours(imp, &m, 2, "attn.qkv.weight", q + kv + kv - 1, d - 1) == value_of(k, (kv - 1) * d + d - 1));
    k = hf_index("lm_head.weight");
    assert_true(ours(imp, &m, 3, "lm_head.weight", 200, 1) == value_of(k, 200 * d + 1));
    hf_import_close(imp);

    /* a tied head: no lm_head in the files, the head unit is its norm alone */
    m.tied_head = true;
    llama_files(&m);
    check_slices(&m);
}

static void test_errors(void **state) {
    (void)state;
    model_spec m = builtin("tiny-llama");
    llama_files(&m);
    hf_import *imp;
    err_t err;
    model_spec wide = m;
    wide.n_kv_head = 4; /* the files have 2 kv heads */
    assert_int_equal(hf_import_open(&imp, dir, &wide, false, &err), -1);
    assert_null(imp);
    assert_non_null(strstr(err.msg, "model.safetensors: tensor 'model.layers.0.self_attn.k_proj.weight': "
                                    "expected shape [64, 64] (from config.json), found [32, 64]"));
    model_spec deep = m;
    deep.n_layer = 3;
    assert_int_equal(hf_import_open(&imp, dir, &deep, false, &err), -1);
    assert_non_null(strstr(err.msg, "tensor 'model.layers.2.input_layernorm.weight' not found"));
    model_spec bert = builtin("tiny-bert");
    assert_int_equal(hf_import_open(&imp, dir, &bert, false, &err), -1);
    assert_non_null(strstr(err.msg, "import reads GPT-2 and Llama models; this is a bert model"));
    assert_int_equal(hf_import_open(&imp, "/nonexistent-dir", &m, false, &err), -1);
    assert_non_null(strstr(err.msg, "no model.safetensors, model.safetensors.index.json, pytorch_model.bin or pytorch_model.bin.index.json"));
}

/* F16 and BF16 widen exactly: the smallest and largest finite halves, subnormals and signed zero
 * (infinities and NaNs are refused on load: test_nonfinite). */
static void test_dtypes(void **state) {
    (void)state;
    model_spec m = builtin("tiny-gpt");
    gpt2_files(&m);
    /* rewrite wte (vocab x d = 256 x 64 = 16384 elements) as F16 holding halves 0..8191 and the
     * largest ones below inf, and ln_f.weight as BF16 */
    uint16_t *h = xmalloc(256 * 64 * sizeof(uint16_t)), bf[64];
    for (int i = 0; i < 256 * 64; i++) h[i] = (uint16_t)(i < 8192 ? i : 0x7bff - (i - 8192));
    h[16383] = 0x8001; /* the smallest negative subnormal */
    h[16382] = 0xfbff; /* the most negative finite half, -65504 */
    h[16381] = 0x8000; /* -0 */
    for (int i = 0; i < 64; i++) bf[i] = (uint16_t)(0x3f80 + i * 3); /* 1.0 and up */
    bf[63] = 0xff7f; /* the most negative finite bf16 */
    write_model_with((replaced[]){{"transformer.wte.weight", ST_F16, h}, {"transformer.ln_f.weight", ST_BF16, bf}}, 2);
    hf_import *imp;
    err_t err;
    assert_int_equal(hf_import_open(&imp, dir, &m, false, &err), 0);
    float *wte = xmalloc(256 * 64 * sizeof(float)), lnf[64];
    assert_int_equal(hf_import_range(imp, 0, 0, 256 * 64, wte, &err), 0);
    assert_int_equal(hf_import_range(imp, 3, 0, 64, lnf, &err), 0);
    for (int i = 0; i < 256 * 64; i++) { /* the reference: ldexp on the fields */
        int e = (h[i] >> 10) & 0x1f, man = h[i] & 0x3ff;
        double v = e ? ldexp(1024 + man, e - 25) : ldexp(man, -24);
        if (h[i] & 0x8000) v = -v;
        if ((float)v != wte[i] || !signbit(v) != !signbit(wte[i])) fail_msg("half %04x: %g, expected %g", h[i], wte[i], v);
    }
    assert_true(wte[0] == 0.0f && !signbit(wte[0]) && wte[1] == ldexpf(1, -24));
    assert_true(wte[16383] == -ldexpf(1, -24) && wte[16382] == -65504.0f && wte[16381] == 0 && signbit(wte[16381]));
    assert_true(wte[8192] == 65504.0f);
    for (int i = 0; i < 64; i++) {
        uint32_t u = (uint32_t)bf[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        assert_true(lnf[i] == f);
    }
    hf_import_close(imp);
    free(wte), free(h);
}

/* Reads unit `unit` whole and expects the error `want` (a value that is not finite). */
static void expect_range_error(const model_spec *m, int unit, const char *want) {
    hf_import *imp;
    err_t err;
    assert_int_equal(hf_import_open(&imp, dir, m, false, &err), 0); /* the headers are sound */
    int64_t n = model_unit_params(m, unit);
    float *out = xmalloc((size_t)n * sizeof(float));
    assert_int_equal(hf_import_range(imp, unit, 0, n, out, &err), -1);
    if (!strstr(err.msg, want)) fail_msg("got '%s', expected '%s'", err.msg, want);
    free(out);
    hf_import_close(imp);
}

/* Infinities and NaNs in the files (F16, BF16, F32 and an F64 beyond fp32's range) are errors
 * naming the file, the tensor and the element in the file's own indices, transposed or fused. */
static void test_nonfinite(void **state) {
    (void)state;
    model_spec m = builtin("tiny-gpt");
    gpt2_files(&m);
    uint16_t *h = xcalloc(256 * 64, sizeof(uint16_t));
    static const struct {
        uint16_t half;
        const char *name;
    } specials[] = {{0x7c00, "inf"}, {0xfc00, "-inf"}, {0x7e00, "nan"}, {0xfd01, "nan"}};
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++) {
        memset(h, 0, 256 * 64 * sizeof(uint16_t));
        h[15 * 64 + 40] = specials[i].half;
        write_model_with((replaced[]){{"transformer.wte.weight", ST_F16, h}}, 1);
        char want[160];
        snprintf(want, sizeof want, "model.safetensors: tensor 'transformer.wte.weight' holds %s at [15, 40]",
                 specials[i].name);
        expect_range_error(&m, 0, want);
    }
    free(h);
    uint16_t bf[64] = {0};
    bf[9] = 0xff80; /* -inf */
    write_model_with((replaced[]){{"transformer.ln_f.weight", ST_BF16, bf}}, 1);
    expect_range_error(&m, 3, "tensor 'transformer.ln_f.weight' holds -inf at [9]");
    /* a Conv1D weight, stored [in, out] = [64, 192] and transposed on load: named as stored */
    int64_t d = m.d_model, n = d * 3 * d;
    float *c = xcalloc((size_t)n, sizeof(float));
    c[2 * 3 * d + 130] = NAN;
    write_model_with((replaced[]){{"transformer.h.1.attn.c_attn.weight", ST_F32, c}}, 1);
    expect_range_error(&m, 2, "tensor 'transformer.h.1.attn.c_attn.weight' holds nan at [2, 130]");
    free(c);
    double *big = xcalloc(64, sizeof(double));
    big[5] = 1e300; /* finite, but not in fp32 */
    write_model_with((replaced[]){{"transformer.h.0.ln_2.bias", ST_F64, big}}, 1);
    expect_range_error(&m, 1, "tensor 'transformer.h.0.ln_2.bias' holds inf at [5]");
    free(big);
    /* Llama's k_proj, a row block of our fused qkv */
    model_spec l = builtin("tiny-llama");
    llama_files(&l);
    int64_t kv = l.n_kv_head * (l.d_model / l.n_head);
    float *k = xcalloc((size_t)(kv * l.d_model), sizeof(float));
    k[3 * l.d_model + 7] = -INFINITY;
    write_model_with((replaced[]){{"model.layers.0.self_attn.k_proj.weight", ST_F32, k}}, 1);
    expect_range_error(&l, 1, "tensor 'model.layers.0.self_attn.k_proj.weight' holds -inf at [3, 7]");
    free(k);
}

/* Tensors of the files the model does not read are an error naming them (a config.json with
 * fewer layers than the weights), a warning with allow_unused; known buffers (GPT-2's attention
 * masks, a tied model's lm_head) are no weights and pass. */
static void test_unused(void **state) {
    (void)state;
    model_spec m = builtin("tiny-llama"), one = m;
    llama_files(&m); /* two layers */
    one.n_layer = 1;
    hf_import *imp;
    err_t err;
    assert_int_equal(hf_import_open(&imp, dir, &one, false, &err), -1);
    assert_null(imp);
    assert_non_null(strstr(err.msg, "model.safetensors: 9 tensors the model does not use: "
                                    "'model.layers.1.input_layernorm.weight', "));
    assert_non_null(strstr(err.msg, " and 3 more (config.json describes a Llama model with 1 layer;"));
    assert_non_null(strstr(err.msg, "--allow-unused-weights"));
    assert_int_equal(hf_import_open(&imp, dir, &one, true, &err), 0); /* said, and loaded */
    float v;
    assert_int_equal(hf_import_range(imp, 1, 0, 1, &v, &err), 0);
    assert_true(v == value_of(hf_index("model.layers.0.input_layernorm.weight"), 0));
    hf_import_close(imp);

    /* an untied head's lm_head in a tied model's files is a weight left out */
    model_spec tied = m;
    tied.tied_head = true;
    assert_int_equal(hf_import_open(&imp, dir, &tied, false, &err), -1);
    assert_non_null(strstr(err.msg, "1 tensor the model does not use: 'lm_head.weight'"));
    /* ... but one that copies the embedding is what transformers ties */
    int64_t vd = m.vocab * m.d_model;
    float *emb = xmalloc((size_t)vd * sizeof(float));
    for (int64_t i = 0; i < vd; i++) emb[i] = value_of(hf_index("model.embed_tokens.weight"), i);
    write_model_with((replaced[]){{"lm_head.weight", ST_F32, emb}}, 1);
    free(emb);
    assert_int_equal(hf_import_open(&imp, dir, &tied, false, &err), 0);
    hf_import_close(imp);

    /* GPT-2's mask buffers, and the RoPE frequencies of older Llama files, are no weights */
    model_spec g = builtin("tiny-gpt");
    n_hf = 0;
    gpt2_files(&g);
    add("transformer.h.0.attn.bias", 1, 0), add("transformer.h.1.attn.masked_bias", 1, 0);
    write_model();
    assert_int_equal(hf_import_open(&imp, dir, &g, false, &err), 0);
    hf_import_close(imp);
    add("transformer.h.1.mlp.extra.weight", 4, 0);
    write_model();
    assert_int_equal(hf_import_open(&imp, dir, &g, false, &err), -1);
    assert_non_null(strstr(err.msg, "1 tensor the model does not use: 'transformer.h.1.mlp.extra.weight'"));
    llama_files(&m);
    add("model.layers.0.self_attn.rotary_emb.inv_freq", 8, 0);
    write_model();
    assert_int_equal(hf_import_open(&imp, dir, &m, false, &err), 0);
    hf_import_close(imp);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2),
        cmocka_unit_test(test_llama),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_dtypes),
        cmocka_unit_test(test_nonfinite),
        cmocka_unit_test(test_unused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
