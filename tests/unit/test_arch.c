/* test_arch.c - the architectures' table (planner/arch.h): a row for every model_arch, names that
 * round-trip through the parsers, and properties that must agree with one another. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "common/json_util.h"
#include "planner/arch.h"
#include "planner/model.h"
#include "planner/model_json.h"

static void test_every_arch_has_a_row(void **state) {
    (void)state;
    for (int i = 0; i < ARCH_COUNT; i++) {
        const arch_desc *a = arch_of((model_arch)i);
        assert_int_equal(a->arch, i);
        assert_non_null(a->name);
        assert_non_null(a->display);
        assert_true(a->norm_eps > 0 && a->norm_eps < 1);
        assert_string_equal(model_arch_name((model_arch)i), a->name);
    }
}

static void test_names_unique_and_parse(void **state) {
    (void)state;
    for (int i = 0; i < ARCH_COUNT; i++) {
        model_arch back;
        assert_int_equal(arch_parse(arch_of((model_arch)i)->name, &back), 0);
        assert_int_equal(back, i);
        for (int j = 0; j < i; j++) {
            assert_string_not_equal(arch_of((model_arch)i)->name, arch_of((model_arch)j)->name);
            assert_string_not_equal(arch_of((model_arch)i)->display, arch_of((model_arch)j)->display);
        }
    }
    model_arch none;
    assert_int_equal(arch_parse("gpt3", &none), -1);
    char list[128];
    arch_names_list(list, sizeof list);
    assert_string_equal(list, "gpt, llama, bert or vit"); /* what the messages have always said */
}

/* Each built-in model through JSON and back keeps its architecture: the table's names are the
 * plans' and checkpoints' spelling. */
static void test_names_round_trip_json(void **state) {
    (void)state;
    int n;
    const model_spec *b = model_builtins(&n);
    bool seen[ARCH_COUNT] = {0};
    for (int i = 0; i < n; i++) {
        cJSON *o = model_to_json(&b[i]);
        model_spec back;
        err_t err;
        json_ctx c = {"test", &err};
        assert_int_equal(model_from_json(&c, o, "model", &back), 0);
        assert_int_equal(back.arch, b[i].arch);
        assert_string_equal(cJSON_GetObjectItem(o, "arch")->valuestring, arch_of(b[i].arch)->name);
        cJSON_Delete(o);
        seen[b[i].arch] = true;
    }
    for (int i = 0; i < ARCH_COUNT; i++) assert_true(seen[i]); /* a built-in of every architecture */
}

/* The properties that describe one thing from two sides agree. */
static void test_properties_agree(void **state) {
    (void)state;
    for (int i = 0; i < ARCH_COUNT; i++) {
        const arch_desc *a = arch_of((model_arch)i);
        /* causal attention <=> a causal LM task <=> an LM head (and only those generate) */
        assert_int_equal(a->causal, a->task == TASK_CLM);
        assert_int_equal(a->causal, a->head == HEAD_LM);
        assert_int_equal(a->task == TASK_MLM, a->head == HEAD_MLM);
        /* images <=> classification <=> a classifier head, which has no embedding to tie */
        assert_int_equal(a->images, a->task == TASK_CLASSIFY);
        assert_int_equal(a->images, a->head == HEAD_CLASSIFIER);
        if (a->images) assert_false(a->tied || a->tie_choice || a->type_vocab || a->hf);
        /* rotary positions carry no table; SwiGLU goes with RMSNorm and unbiased layers here */
        assert_int_equal(a->mlp == MLP_SWIGLU, a->norm == NORM_RMS);
        assert_int_equal(a->mlp == MLP_SWIGLU, !a->linear_bias);
        assert_int_equal(a->gqa, a->pos == POS_ROPE);
        /* a post-LN stack has no final norm: its embedding ends with one */
        assert_int_equal(a->post_ln, a->embed_norm);
        /* Hugging Face import and export are of causal LMs (docs/import.md) */
        if (a->hf) assert_true(a->causal);
    }
}

/* A model's tied_head default is valid for its architecture; the other value only where the
 * architecture lets a model choose. */
static void test_tied_default_validates(void **state) {
    (void)state;
    int n;
    const model_spec *b = model_builtins(&n);
    for (int i = 0; i < n; i++) {
        const arch_desc *a = arch_of(b[i].arch);
        model_spec m = b[i];
        err_t err;
        m.tied_head = a->tied;
        assert_int_equal(model_validate(&m, &err), 0);
        m.tied_head = !a->tied;
        assert_int_equal(model_validate(&m, &err), a->tie_choice ? 0 : -1);
    }
}

/* Every architecture Hugging Face reads has a family of its own architecture, the others none;
 * Llama's relatives are told by the spec's fields, as export writes them and import reads them. */
static void test_hf_families(void **state) {
    (void)state;
    int n;
    const model_spec *b = model_builtins(&n);
    for (int i = 0; i < n; i++) {
        const hf_family_desc *f = hf_family_of(&b[i]);
        assert_true(arch_of(b[i].arch)->hf ? f && f->arch == b[i].arch : f == NULL);
        if (b[i].arch != ARCH_LLAMA) continue;
        model_spec m = b[i];
        m.qkv_bias = false, m.sliding_window = 0;
        assert_string_equal(hf_family_of(&m)->hf_class, "LlamaForCausalLM");
        m.sliding_window = 4096;
        assert_string_equal(hf_family_of(&m)->model_type, "mistral");
        m.qkv_bias = true, m.sliding_window = 0;
        assert_string_equal(hf_family_of(&m)->display, "Qwen2");
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_arch_has_a_row),
        cmocka_unit_test(test_names_unique_and_parse),
        cmocka_unit_test(test_names_round_trip_json),
        cmocka_unit_test(test_properties_agree),
        cmocka_unit_test(test_tied_default_validates),
        cmocka_unit_test(test_hf_families),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
