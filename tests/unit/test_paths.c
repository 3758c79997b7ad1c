/* test_paths.c - names taken from paths (issue 38): a path's clean form (common/strutil.h), the
 * name it gives, and the model names that follow from them: a Hugging Face directory however it
 * is spelled ("hf/", "hf/.", ".", "..", "hf/config.json"), and a model file whose name has nothing
 * before its first '.'. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/strutil.h"
#include "planner/model.h"

static void test_clean(void **state) {
    (void)state;
    static const char *const cases[][2] = {
        {"", "."},          {".", "."},           {"./", "."},         {"hf/", "hf"},
        {"hf/.", "hf"},     {"./hf//", "hf"},     {"a/b/..", "a"},     {"a/..", "."},
        {"..", ".."},       {"../..", "../.."},   {"../x/..", ".."},   {"../../a", "../../a"},
        {"/", "/"},         {"//", "/"},          {"/..", "/"},        {"/a/../..", "/"},
        {"/a/./b/", "/a/b"}, {"runs/x/.", "runs/x"}, {"a/../../b", "../b"}, {"..a/b", "..a/b"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *c = str_path_clean(cases[i][0]);
        if (strcmp(c, cases[i][1])) fail_msg("'%s' -> '%s', expected '%s'", cases[i][0], c, cases[i][1]);
        free(c);
    }
}

static char root[64];

/* In root/gpt2/sub: "." is sub, ".." is gpt2, "../.." is root's own name; "/" has none. */
static void test_name(void **state) {
    (void)state;
    snprintf(root, sizeof root, "/tmp/cephalo-test-paths-XXXXXX");
    assert_non_null(mkdtemp(root));
    char sub[128], cwd[4096];
    snprintf(sub, sizeof sub, "%s/gpt2/sub", root);
    assert_non_null(getcwd(cwd, sizeof cwd));
    snprintf(sub, sizeof sub, "%s/gpt2", root);
    assert_int_equal(mkdir(sub, 0755), 0);
    snprintf(sub, sizeof sub, "%s/gpt2/sub", root);
    assert_int_equal(mkdir(sub, 0755), 0);
    assert_int_equal(chdir(sub), 0);
    const char *rootname = strrchr(root, '/') + 1;
    const char *const cases[][2] = {
        {"hf/", "hf"}, {"hf/.", "hf"}, {"a/b/..", "a"}, {".", "sub"}, {"./", "sub"}, {"..", "gpt2"},
        {"../", "gpt2"}, {"../..", rootname}, {"/", ""}, {"x/../../..", rootname}, {"/no/such/..", "no"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *n = str_path_name(cases[i][0]);
        if (strcmp(n, cases[i][1])) fail_msg("'%s' -> '%s', expected '%s'", cases[i][0], n, cases[i][1]);
        free(n);
    }
    assert_int_equal(chdir(cwd), 0);
}

#define GPT "{\"architectures\": [\"GPT2LMHeadModel\"], \"n_embd\": 64, \"n_head\": 4, \"n_layer\": 2, " \
            "\"n_positions\": 128, \"vocab_size\": 256}"

/* A model directory's name, as `--model` and `--init-from` spell it: the directory's, never the
 * "hf-model" of a trailing slash or a "." (and never ".." or "config.json"). */
static void test_hf_names(void **state) {
    (void)state;
    char hf[128], path[160], cwd[4096];
    snprintf(hf, sizeof hf, "%s/hf", root);
    assert_int_equal(mkdir(hf, 0755), 0);
    snprintf(path, sizeof path, "%s/config.json", hf);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(GPT, f);
    fclose(f);
    assert_non_null(getcwd(cwd, sizeof cwd));
    assert_int_equal(chdir(root), 0);
    static const char *const spellings[] = {"hf",   "hf/",          "hf/.",      "./hf//", "hf/config.json",
                                            "hf/../hf/", "./hf/./config.json", NULL};
    for (int i = 0; spellings[i]; i++) {
        model_spec m;
        err_t err = {{0}};
        if (model_resolve(spellings[i], &m, &err) < 0) fail_msg("%s: %s", spellings[i], err.msg);
        if (strcmp(m.name, "hf")) fail_msg("--model %s is named '%s', expected 'hf'", spellings[i], m.name);
    }
    assert_int_equal(chdir(hf), 0);
    static const char *const here[] = {".", "./", "config.json", "./config.json", "../hf", NULL};
    for (int i = 0; here[i]; i++) {
        model_spec m;
        err_t err = {{0}};
        if (model_resolve(here[i], &m, &err) < 0) fail_msg("%s: %s", here[i], err.msg);
        if (strcmp(m.name, "hf")) fail_msg("--model %s (in hf/) is named '%s', expected 'hf'", here[i], m.name);
    }
    snprintf(path, sizeof path, "%s/hf/sub", root);
    assert_int_equal(mkdir(path, 0755), 0);
    assert_int_equal(chdir(path), 0);
    model_spec m;
    err_t err = {{0}};
    assert_int_equal(model_resolve("..", &m, &err), 0);
    assert_string_equal(m.name, "hf");
    assert_int_equal(chdir(cwd), 0);
}

/* A model file named ".yaml" has no name before its first '.': refused, not named "". */
static void test_model_file_name(void **state) {
    (void)state;
    char path[160];
    snprintf(path, sizeof path, "%s/.yaml", root);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("base: tiny-gpt\nn_layer: 1\n", f);
    fclose(f);
    model_spec m;
    err_t err = {{0}};
    assert_int_equal(model_resolve(path, &m, &err), -1);
    if (!strstr(err.msg, "gives the model no name")) fail_msg("%s", err.msg);
    snprintf(path, sizeof path, "%s/mini.v2.yaml", root);
    f = fopen(path, "w");
    assert_non_null(f);
    fputs("base: tiny-gpt\nn_layer: 1\n", f);
    fclose(f);
    assert_int_equal(model_resolve(path, &m, &err), 0);
    assert_string_equal(m.name, "mini");
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    assert_int_equal(system(cmd), 0);
}

/* A log line stays one line whatever the text brings: breaks and control bytes escaped, the rest
 * (tabs, UTF-8) kept, cut to fit without splitting an escape. */
static void test_one_line(void **state) {
    (void)state;
    char out[64];
    str_one_line("exit 1: Traceback\n  line 2\r\x01" "end\tok \xc3\xa9", out, sizeof out);
    assert_string_equal(out, "exit 1: Traceback\\n  line 2\\r\\x01end\tok \xc3\xa9");
    char small[8];
    str_one_line("abcde\nf", small, sizeof small); /* "abcde\\n" is 7 bytes: fits with its NUL */
    assert_string_equal(small, "abcde\\n");
    str_one_line("abcdef\ng", small, sizeof small); /* the escape would not fit whole: cut before it */
    assert_string_equal(small, "abcdef");
    str_one_line("", small, sizeof small);
    assert_string_equal(small, "");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_clean),
        cmocka_unit_test(test_one_line),
        cmocka_unit_test(test_name),
        cmocka_unit_test(test_hf_names),
        cmocka_unit_test(test_model_file_name),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
