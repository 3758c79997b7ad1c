/* test_model.c - model zoo shapes and parameter counts against published totals, units, FLOPs,
 * model files and their errors. */
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

#include "planner/model.h"

static model_spec get(const char *name) {
    model_spec m;
    err_t err;
    assert_int_equal(model_resolve(name, &m, &err), 0);
    assert_int_equal(model_validate(&m, &err), 0);
    return m;
}

/* Totals as published by the models' reference implementations (Hugging Face). */
static void test_published_totals(void **state) {
    (void)state;
    model_spec m = get("gpt2-124m");
    assert_int_equal(model_params(&m), 124439808);
    m = get("gpt2-350m");
    assert_int_equal(model_params(&m), 354823168);
    m = get("gpt2-774m");
    assert_int_equal(model_params(&m), 774030080);
    m = get("gpt2-1.5b");
    assert_int_equal(model_params(&m), 1557611200);
    m = get("llama-7b"); /* Llama-2-7B */
    assert_int_equal(model_params(&m), 6738415616);
    m = get("tinyllama-1.1b");
    assert_int_equal(model_params(&m), 1100048384);
    m = get("bert-large"); /* BertForMaskedLM, bert-large-uncased */
    assert_int_equal(model_params(&m), 335174458);
    m = get("vit-g"); /* ViT-G/14: 1843M in Zhai et al. */
    assert_true(fabs(model_params(&m) / 1.843e9 - 1) < 0.002);
}

static void test_units_sum_to_total(void **state) {
    (void)state;
    int n;
    const model_spec *b = model_builtins(&n);
    assert_true(n >= 18);
    for (int i = 0; i < n; i++) {
        err_t err;
        assert_int_equal(model_validate(&b[i], &err), 0);
        int64_t sum = 0;
        for (int u = 0; u < model_n_units(&b[i]); u++) {
            assert_true(model_unit_params(&b[i], u) > 0);
            sum += model_unit_params(&b[i], u);
        }
        assert_int_equal(sum, model_params(&b[i]));
        assert_int_equal(model_unit_kind(&b[i], 0), UNIT_EMBEDDING);
        assert_int_equal(model_unit_kind(&b[i], b[i].n_layer + 1), UNIT_HEAD);
    }
    model_spec m = get("gpt2-124m");
    char name[32];
    model_unit_name(&m, 3, name, sizeof name);
    assert_string_equal(name, "block.2");
    /* GPT-2 block: 12 d^2 + 13 d */
    assert_int_equal(model_unit_params(&m, 1), 12 * 768 * 768 + 13 * 768);
    assert_int_equal(model_unit_params(&m, 13), 2 * 768); /* ln_f; the head is tied */
}

/* Forward FLOPs of a block: 2 x matmul params per token + attention (causal: half). */
static void test_flops(void **state) {
    (void)state;
    model_spec m = get("gpt2-124m");
    double t = 1024, d = 768;
    double expect = 2 * t * (12 * d * d) + 4 * t * t * d / 2;
    assert_true(fabs(model_kind_fwd_flops(&m, UNIT_BLOCK, 1024) / expect - 1) < 1e-12);
    m = get("bert-large"); /* bidirectional: full attention */
    t = 512, d = 1024;
    expect = 2 * t * (12 * d * d) + 4 * t * t * d;
    assert_true(fabs(model_kind_fwd_flops(&m, UNIT_BLOCK, 512) / expect - 1) < 1e-12);
    /* the 6N rule holds to within attention and embeddings for a long-context model */
    m = get("llama-7b");
    double per_token = 3 * (model_kind_fwd_flops(&m, UNIT_BLOCK, 2048) * 32 + model_kind_fwd_flops(&m, UNIT_HEAD, 2048)) / 2048;
    assert_true(per_token > 6 * model_params(&m) * 0.98 && per_token < 6 * model_params(&m) * 1.25);
    /* activation bytes scale with precision */
    assert_true(fabs(model_kind_act_bytes(&m, UNIT_BLOCK, 512, 2) * 2 - model_kind_act_bytes(&m, UNIT_BLOCK, 512, 4)) < 1);
}

static void test_vit_tokens_and_seq(void **state) {
    (void)state;
    model_spec m = get("vit-g");
    assert_int_equal(model_tokens(&m, 0), 16 * 16 + 1);
    int seq;
    err_t err;
    assert_int_equal(model_check_seq(&m, 0, &seq, &err), 0);
    assert_int_equal(model_check_seq(&m, 512, &seq, &err), -1);
    assert_non_null(strstr(err.msg, "--seq does not apply"));
    m = get("gpt2-124m");
    assert_int_equal(model_check_seq(&m, 0, &seq, &err), 0);
    assert_int_equal(seq, 1024);
    assert_int_equal(model_check_seq(&m, 2048, &seq, &err), -1);
    assert_non_null(strstr(err.msg, "1024 learned positions"));
    /* Llama too: RoPE has no table, but the model knows max_seq positions (docs/run.md) */
    m = get("tinyllama-1.1b");
    assert_int_equal(model_check_seq(&m, 2048, &seq, &err), 0);
    assert_int_equal(seq, 2048);
    assert_int_equal(model_check_seq(&m, 2049, &seq, &err), -1);
    assert_non_null(strstr(err.msg, "sequence length 2049 exceeds model tinyllama-1.1b's context of 2048 positions"));
}

static void test_unknown_model_suggests(void **state) {
    (void)state;
    model_spec m;
    err_t err;
    assert_int_equal(model_resolve("gpt2-125m", &m, &err), -1);
    assert_non_null(strstr(err.msg, "'gpt2-124m'"));
    assert_int_equal(model_resolve("lama-7b", &m, &err), -1);
    assert_non_null(strstr(err.msg, "'llama-7b'"));
}

static int load(const char *text, model_spec *m, err_t *err) {
    return model_load_string("m.yaml", text, strlen(text), m, err);
}

static void test_model_files(void **state) {
    (void)state;
    model_spec m;
    err_t err;
    /* BERT-base with the MLM head: 109,514,298 (Hugging Face bert-base-uncased) */
    assert_int_equal(load("arch: bert\nn_layer: 12\nd_model: 768\nn_head: 12\nvocab: 30522\nmax_seq: 512\n", &m, &err), 0);
    assert_int_equal(model_params(&m), 109514298);
    assert_string_equal(m.name, "m");
    /* ViT-B/16: 86,567,656 (timm vit_base_patch16_224) */
    assert_int_equal(load("name: vit-b16\narch: vit\npatch: 16\nn_layer: 12\nd_model: 768\nn_head: 12\n", &m, &err), 0);
    assert_int_equal(model_params(&m), 86567656);
    assert_string_equal(m.name, "vit-b16");
    /* base + overrides */
    assert_int_equal(load("base: gpt2-124m\nn_layer: 6\nseq: 256\n", &m, &err), 0);
    assert_int_equal(m.n_layer, 6);
    assert_int_equal(m.default_seq, 256);
    assert_int_equal(m.d_model, 768);
    /* overrides carry the fields that follow them: heads, MLP width, default sequence */
    assert_int_equal(load("base: gpt2-124m\nd_model: 512\nn_head: 8\nmax_seq: 256\n", &m, &err), 0);
    assert_int_equal(m.n_kv_head, 8);
    assert_int_equal(m.d_ff, 2048);
    assert_int_equal(m.default_seq, 256);
    assert_int_equal(load("base: tinyllama-1.1b\nn_layer: 2\n", &m, &err), 0);
    assert_int_equal(m.n_kv_head, 4); /* GQA kept */
    /* llama with GQA */
    assert_int_equal(load("arch: llama\nn_layer: 2\nd_model: 64\nn_head: 4\nn_kv_head: 2\nd_ff: 176\nvocab: 256\nmax_seq: 128\n", &m, &err), 0);
    assert_int_equal(model_unit_params(&m, 1), 64 * 64 * 2 + 2 * 64 * 32 + 3 * 64 * 176 + 2 * 64);
    /* a tied Llama head is its norm alone; rope_theta and norm_eps are model fields */
    assert_int_equal(load("base: tiny-llama\ntied_head: true\nrope_theta: 500000\nnorm_eps: 1e-6\n", &m, &err), 0);
    assert_int_equal(model_unit_params(&m, m.n_layer + 1), 64);
    assert_true(model_rope_theta(&m) == 500000 && model_norm_eps(&m) == 1e-6);
    m = get("tiny-llama");
    assert_true(model_rope_theta(&m) == 10000 && model_norm_eps(&m) == 1e-5 && m.rope_theta == 0);
}

static void expect_error(const char *text, const char *needle) {
    model_spec m;
    err_t err = {{0}};
    assert_int_equal(load(text, &m, &err), -1);
    if (!strstr(err.msg, needle)) fail_msg("error '%s' lacks '%s'", err.msg, needle);
}

static void test_model_file_errors(void **state) {
    (void)state;
    expect_error("arch: gpt\nn_layer: 2\nd_model: 66\nn_head: 4\nvocab: 256\nmax_seq: 128\n", "n_head 4 must divide d_model 66");
    expect_error("arch: gpt\nn_layer: 2\nd_model: 64\nn_head: 4\nvocab: 256\n", "missing field 'max_seq'");
    expect_error("arch: gtp\nn_layer: 2\n", "m.yaml:1: arch: unknown architecture 'gtp'");
    expect_error("arch: gpt\nn_layers: 2\n", "m.yaml:2: model: unknown field 'n_layers' (did you mean 'n_layer'?)");
    expect_error("arch: gpt\nn_layer: -2\nd_model: 64\nn_head: 4\nvocab: 256\nmax_seq: 128\n", "m.yaml:2: n_layer: -2 is out of range");
    expect_error("arch: gpt\nn_layer: two\nd_model: 64\nn_head: 4\nvocab: 256\nmax_seq: 128\n", "m.yaml:2: n_layer: expected an integer, got 'two'");
    expect_error("arch: llama\nn_layer: 2\nd_model: 64\nn_head: 4\nvocab: 256\nmax_seq: 128\n", "missing field 'd_ff'");
    expect_error("arch: llama\nn_layer: 2\nd_model: 64\nn_head: 4\nn_kv_head: 3\nd_ff: 8\nvocab: 256\nmax_seq: 128\n", "n_kv_head 3 must divide n_head 4");
    expect_error("base: gpt3\n", "base: unknown model 'gpt3'");
    /* a base that names a file is not loaded (a file naming itself recursed forever; fuzzing) */
    expect_error("base: m.yaml\n", "m.yaml:1: base: unknown model 'm.yaml'");
    expect_error("arch: vit\nn_layer: 2\nd_model: 64\nn_head: 4\npatch: 15\n", "patch 15 must divide image 224");
    /* attention supports head sizes 1..128 (common/attn_limits.h): 2048 / 8 = 256 is refused */
    expect_error("arch: gpt\nn_layer: 2\nd_model: 2048\nn_head: 8\nvocab: 256\nmax_seq: 128\n",
                 "head size 256 is not supported: attention supports head sizes 1..128");
    expect_error("base: tiny-bert\ntied_head: false\n", "tied_head false: only Llama models choose; bert models always tie");
    expect_error("base: tiny-llama\nrope_theta: 0\n", "rope_theta");
    expect_error("arch: [gpt\n", "YAML syntax error");
    expect_error("- 1\n- 2\n", "expected a mapping");
}

/* ---- Hugging Face config.json (planner/model_hf.c) ---- */

#define M_PI_ 3.14159265358979323846

static char hf_dir[64];

/* Writes hf_dir/config.json and loads it (by the directory, as --init-from gives it). */
static int load_hf(const char *json, model_spec *m, err_t *err) {
    char path[128];
    snprintf(path, sizeof path, "%s/config.json", hf_dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(json, f);
    fclose(f);
    return model_resolve(hf_dir, m, err);
}

static void test_hf_configs(void **state) {
    (void)state;
    model_spec m;
    err_t err = {{0}};
    snprintf(hf_dir, sizeof hf_dir, "/tmp/cephalo-test-model-XXXXXX");
    assert_non_null(mkdtemp(hf_dir));
    /* openai-community/gpt2: 124,439,808 parameters, as the built-in */
    assert_int_equal(load_hf("{\"architectures\": [\"GPT2LMHeadModel\"], \"activation_function\": \"gelu_new\", "
                             "\"n_ctx\": 1024, \"n_embd\": 768, \"n_head\": 12, \"n_inner\": null, \"n_layer\": 12, "
                             "\"n_positions\": 1024, \"layer_norm_epsilon\": 1e-05, \"vocab_size\": 50257, "
                             "\"model_type\": \"gpt2\"}", &m, &err), 0);
    assert_int_equal(model_params(&m), 124439808);
    assert_true(m.arch == ARCH_GPT && m.tied_head && m.d_ff == 3072);
    /* TinyLlama-1.1B: GQA 32/4, as the built-in */
    assert_int_equal(load_hf("{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 2048, \"intermediate_size\": 5632, "
                             "\"num_attention_heads\": 32, \"num_key_value_heads\": 4, \"num_hidden_layers\": 22, "
                             "\"max_position_embeddings\": 2048, \"vocab_size\": 32000, \"rms_norm_eps\": 1e-05, "
                             "\"rope_theta\": 10000.0, \"tie_word_embeddings\": false, \"hidden_act\": \"silu\", "
                             "\"rope_scaling\": null}", &m, &err), 0);
    assert_int_equal(model_params(&m), 1100048384);
    /* Meta-Llama-3-8B: 8,030,261,248; rope_theta 500000 */
    assert_int_equal(load_hf("{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 4096, \"intermediate_size\": 14336, "
                             "\"num_attention_heads\": 32, \"num_key_value_heads\": 8, \"num_hidden_layers\": 32, "
                             "\"max_position_embeddings\": 8192, \"vocab_size\": 128256, \"rms_norm_eps\": 1e-05, "
                             "\"rope_theta\": 500000.0, \"tie_word_embeddings\": false}", &m, &err), 0);
    assert_int_equal(model_params(&m), 8030261248LL);
    assert_true(model_rope_theta(&m) == 500000.0 && model_norm_eps(&m) == 1e-5);
    /* Llama-3.2-1B's shape (tied head) without its rope_scaling: 1,235,814,400 */
    const char *l32 = "{\"model_type\": \"llama\", \"hidden_size\": 2048, \"intermediate_size\": 8192, "
                      "\"num_attention_heads\": 32, \"num_key_value_heads\": 8, \"num_hidden_layers\": 16, "
                      "\"vocab_size\": 128256, \"rope_theta\": 500000.0, \"tie_word_embeddings\": true%s}";
    char text[2048];
    snprintf(text, sizeof text, l32, "");
    assert_int_equal(load_hf(text, &m, &err), 0);
    assert_int_equal(model_params(&m), 1235814400);
    assert_int_equal(model_unit_params(&m, m.n_layer + 1), 2048); /* the head is its norm alone */
    assert_true(m.tied_head && model_norm_eps(&m) == 1e-6); /* LlamaConfig's default eps */
    /* Llama-3.2-1B as published: its llama3 rope_scaling is read, and the frequencies follow
     * transformers' _compute_llama3_parameters (here in double, by the wavelength bands) */
    snprintf(text, sizeof text, l32, ", \"rope_scaling\": {\"factor\": 32.0, \"high_freq_factor\": 4.0, "
             "\"low_freq_factor\": 1.0, \"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"}");
    assert_int_equal(load_hf(text, &m, &err), 0);
    assert_int_equal(model_params(&m), 1235814400);
    assert_true(m.rope_scaling == ROPE_LLAMA3 && m.rope_factor == 32 && m.rope_orig_max == 8192);
    float inv[32];
    model_rope_inv_freq(&m, 64, inv);
    int bands[3] = {0};
    for (int i = 0; i < 32; i++) {
        double f = pow(500000.0, -2.0 * i / 64), wl = 2 * M_PI_ / f, want = f;
        if (wl > 8192) want = f / 32, bands[2]++;
        else if (wl >= 8192 / 4.0) {
            double sm = (8192 / wl - 1) / (4 - 1);
            want = (1 - sm) * f / 32 + sm * f, bands[1]++;
        } else bands[0]++;
        assert_true(fabs(inv[i] - want) <= 2e-6 * want);
    }
    assert_true(bands[0] > 0 && bands[1] > 0 && bands[2] > 0); /* all three rules were checked */
    /* linear: every frequency / factor */
    snprintf(text, sizeof text, l32, ", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 4}");
    assert_int_equal(load_hf(text, &m, &err), 0);
    model_rope_inv_freq(&m, 64, inv);
    for (int i = 0; i < 32; i++) assert_true(fabs(inv[i] - pow(500000.0, -2.0 * i / 64) / 4) <= 2e-6 * inv[i]);
    /* Mistral-7B-v0.1: 7,241,732,096, its window kept for the sequence check */
    const char *mistral = "{\"architectures\": [\"MistralForCausalLM\"], \"hidden_size\": 4096, "
                          "\"intermediate_size\": 14336, \"num_attention_heads\": 32, \"num_key_value_heads\": 8, "
                          "\"num_hidden_layers\": 32, \"max_position_embeddings\": 32768, \"vocab_size\": 32000, "
                          "\"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0, \"sliding_window\": %s, "
                          "\"tie_word_embeddings\": false, \"hidden_act\": \"silu\", \"model_type\": \"mistral\"}";
    snprintf(text, sizeof text, mistral, "4096");
    assert_int_equal(load_hf(text, &m, &err), 0);
    assert_int_equal(model_params(&m), 7241732096LL);
    int seq;
    assert_true(m.sliding_window == 4096 && model_check_seq(&m, 4096, &seq, &err) == 0 && seq == 4096);
    assert_int_equal(model_check_seq(&m, 4097, &seq, &err), -1);
    assert_non_null(strstr(err.msg, "sequence length 4097 exceeds model cephalo-test-model-"));
    assert_non_null(strstr(err.msg, "sliding_window of 4096 (config.json)"));
    snprintf(text, sizeof text, mistral, "null"); /* Mistral-7B-v0.2 on: no window */
    assert_int_equal(load_hf(text, &m, &err), 0);
    assert_true(m.sliding_window == 0 && model_check_seq(&m, 32768, &seq, &err) == 0);
    /* Qwen2.5-0.5B: 494,032,768 with its q/k/v biases and tied head */
    const char *qwen = "{\"architectures\": [\"Qwen2ForCausalLM\"], \"hidden_size\": 896, \"intermediate_size\": 4864, "
                       "\"num_attention_heads\": 14, \"num_key_value_heads\": 2, \"num_hidden_layers\": 24, "
                       "\"max_position_embeddings\": 32768, \"vocab_size\": 151936, \"rms_norm_eps\": 1e-06, "
                       "\"rope_theta\": 1000000.0, \"sliding_window\": 32768, \"max_window_layers\": 21, "
                       "\"use_sliding_window\": %s, \"tie_word_embeddings\": true, \"hidden_act\": \"silu\", "
                       "\"model_type\": \"qwen2\"}";
    snprintf(text, sizeof text, qwen, "false");
    assert_int_equal(load_hf(text, &m, &err), 0);
    assert_int_equal(model_params(&m), 494032768);
    assert_true(m.qkv_bias && m.tied_head && m.sliding_window == 0);
    /* refusals name the field */
    snprintf(text, sizeof text, qwen, "true");
    assert_int_equal(load_hf(text, &m, &err), -1);
    assert_non_null(strstr(err.msg, "config.json: use_sliding_window is set; Qwen2's sliding-window attention"));
    snprintf(text, sizeof text, l32, ", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}");
    assert_int_equal(load_hf(text, &m, &err), -1);
    assert_non_null(strstr(err.msg, "config.json: rope_scaling.rope_type is \"yarn\"; Cephalo implements rope_scaling "
                                    "linear and llama3"));
    snprintf(text, sizeof text, l32, ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 32.0}");
    assert_int_equal(load_hf(text, &m, &err), -1);
    assert_non_null(strstr(err.msg, "rope_scaling of type llama3 needs rope_scaling.low_freq_factor"));
    snprintf(text, sizeof text, l32, ", \"attention_bias\": true");
    assert_int_equal(load_hf(text, &m, &err), -1);
    assert_non_null(strstr(err.msg, "config.json: attention_bias is set; biases on all four"));
    assert_int_equal(load_hf("{\"architectures\": [\"GemmaForCausalLM\"]}", &m, &err), -1);
    assert_non_null(strstr(err.msg, "architecture 'GemmaForCausalLM' cannot be imported"));
    assert_int_equal(load_hf("{\"model_type\": \"gpt2\", \"n_embd\": 64, \"n_head\": 4, \"n_layer\": 2, \"vocab_size\": 256, "
                             "\"activation_function\": \"relu\"}", &m, &err), -1);
    assert_non_null(strstr(err.msg, "activation_function is \"relu\""));
    assert_int_equal(load_hf("{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_attention_heads\": 4, "
                             "\"num_hidden_layers\": 2, \"vocab_size\": 256}", &m, &err), -1);
    assert_non_null(strstr(err.msg, "missing field 'intermediate_size'"));
    assert_int_equal(load_hf("{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 8, "
                             "\"num_attention_heads\": 4, \"num_key_value_heads\": 3, \"num_hidden_layers\": 2, \"vocab_size\": 256}",
                             &m, &err), -1);
    assert_non_null(strstr(err.msg, "n_kv_head 3 must divide n_head 4"));
    assert_int_equal(load_hf("[1, 2]", &m, &err), -1);
    assert_non_null(strstr(err.msg, "expected an object"));
    char path[128];
    snprintf(path, sizeof path, "%s/config.json", hf_dir);
    remove(path);
    rmdir(hf_dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_published_totals), cmocka_unit_test(test_units_sum_to_total),
        cmocka_unit_test(test_flops),            cmocka_unit_test(test_vit_tokens_and_seq),
        cmocka_unit_test(test_unknown_model_suggests), cmocka_unit_test(test_model_files),
        cmocka_unit_test(test_model_file_errors), cmocka_unit_test(test_hf_configs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
