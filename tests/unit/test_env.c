/* test_env.c - the CEPHALO_* variables (common/env.c, docs/environment.md, issue 38): the table
 * against the docs' table (the same variables, values, defaults and readers, in the same order);
 * every row refuses the values outside its kind (the issue's CEPHALO_VOCAB_PAD=no, false, abc, -1,
 * 2 and CEPHALO_ADAMW=bogus, and per kind the near misses: case, spaces, signs, units, ranges,
 * lengths, control characters) and accepts its documented ones, with one message naming the
 * variable and the accepted values; the typed getters read what the rows say (empty = unset, a
 * path-or-none's none); the memory model's switches read through them (engine_env_check refuses
 * all three, where it checked only $CEPHALO_ACTS). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/env.h"
#include "common/fileio.h"
#include "common/log.h"
#include "model/train.h"
#include "planner/cost.h"
#include "planner/engine_mem.h"
#include "planner/model.h"

#define DOC "docs/environment.md"

#define assert_has(msg, needle)                                                          \
    do {                                                                                 \
        if (!strstr((msg), (needle))) fail_msg("'%s' lacks '%s'", (msg), (needle));      \
    } while (0)

static void unset_all(void) {
    int n;
    const env_var *t = env_vars(&n);
    for (int i = 0; i < n; i++) unsetenv(t[i].name);
}

/* ---- the docs' table ---- */

/* the cell without backticks and surrounding spaces */
static void cell_text(const char *a, const char *b, char *out, size_t n) {
    while (a < b && *a == ' ') a++;
    while (b > a && b[-1] == ' ') b--;
    size_t k = 0;
    for (; a < b && k + 1 < n; a++)
        if (*a != '`') out[k++] = *a;
    out[k] = '\0';
}

/* The rows of the docs' table "| `CEPHALO_...` | values | default | readers | what |", compared
 * with the code's, in order. */
static void test_docs_table(void **state) {
    (void)state;
    size_t len;
    err_t err;
    char *doc = file_read_all(DOC, 1 << 20, &len, &err);
    if (!doc) fail_msg("%s", err.msg);
    int n, row = 0;
    const env_var *t = env_vars(&n);
    for (char *line = strtok(doc, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "| `CEPHALO_", 11) != 0) continue;
        char cells[5][512];
        const char *p = line + 1;
        for (int c = 0; c < 5; c++) {
            const char *bar = strchr(p, '|');
            if (!bar) fail_msg("%s: a row with fewer than 5 cells: %s", DOC, line);
            cell_text(p, bar, cells[c], sizeof cells[c]);
            p = bar + 1;
        }
        if (row >= n) fail_msg("%s lists %s, which common/env.c's table has not", DOC, cells[0]);
        const env_var *v = &t[row++];
        char values[256], readers[128], dflt[256];
        cell_text(v->dflt, v->dflt + strlen(v->dflt), dflt, sizeof dflt);
        if (strcmp(cells[0], v->name))
            fail_msg("%s row %d is %s, common/env.c's is %s (the same variables, in the same order)", DOC, row, cells[0], v->name);
        env_values(v, values, sizeof values);
        if (strcmp(cells[1], values)) fail_msg("%s: %s's values are '%s' there, '%s' in the code", DOC, v->name, cells[1], values);
        if (strcmp(cells[2], dflt)) fail_msg("%s: %s's default is '%s' there, '%s' in the code", DOC, v->name, cells[2], dflt);
        env_readers(v, readers, sizeof readers);
        if (strcmp(cells[3], readers)) fail_msg("%s: %s is read by '%s' there, '%s' in the code", DOC, v->name, cells[3], readers);
        if (!cells[4][0]) fail_msg("%s: %s says nothing about what it does", DOC, v->name);
    }
    if (row < n) fail_msg("%s lacks %s (and %d more of common/env.c's table)", DOC, t[row].name, n - row - 1);
    free(doc);
}

/* ---- the table itself ---- */

static void test_table(void **state) {
    (void)state;
    int n;
    const env_var *t = env_vars(&n);
    assert_true(n >= 20);
    for (int i = 0; i < n; i++) {
        const env_var *v = &t[i];
        char buf[256];
        assert_int_equal(strncmp(v->name, "CEPHALO_", 8), 0);
        assert_ptr_equal(env_find(v->name), v); /* unique */
        assert_non_null(v->dflt), assert_non_null(v->what), assert_true(v->readers != 0);
        assert_true(env_values(v, buf, sizeof buf)[0] != '\0');
        if (v->kind == ENV_CHOICE || v->kind == ENV_FLAG) {
            /* the default is a value, which the getters return when unset */
            if (env_check_value(v, v->dflt, NULL) < 0) fail_msg("%s: default '%s' is not one of its values", v->name, v->dflt);
            setenv(v->name, v->dflt, 1);
            int set = env_choice(v->name, NULL);
            unsetenv(v->name);
            assert_int_equal(env_choice(v->name, NULL), set);
        }
        if (v->kind == ENV_PATH || v->kind == ENV_PATH_OR_NONE || v->kind == ENV_TEXT) assert_true(v->max_len > 0);
    }
    assert_null(env_find("CEPHALO_NO_SUCH"));
    /* the worker's adamw_mode is the index of its word */
    setenv("CEPHALO_ADAMW", "tensor", 1), assert_int_equal(env_choice("CEPHALO_ADAMW", NULL), ADAMW_TENSOR);
    setenv("CEPHALO_ADAMW", "unit", 1), assert_int_equal(env_choice("CEPHALO_ADAMW", NULL), ADAMW_UNIT);
    setenv("CEPHALO_ADAMW", "half", 1), assert_int_equal(env_choice("CEPHALO_ADAMW", NULL), ADAMW_HALF);
    unsetenv("CEPHALO_ADAMW");
}

/* ---- values: refused and accepted ---- */

typedef struct probe {
    const char *name, *value;
} probe;

/* refused, each by every program's start; the first ones the issue's */
static const probe bad[] = {
    {"CEPHALO_VOCAB_PAD", "no"}, {"CEPHALO_VOCAB_PAD", "false"}, {"CEPHALO_VOCAB_PAD", "abc"},
    {"CEPHALO_VOCAB_PAD", "-1"}, {"CEPHALO_VOCAB_PAD", "2"},     {"CEPHALO_ADAMW", "bogus"},
    /* switches: 0 or 1 only */
    {"CEPHALO_VOCAB_PAD", "yes"}, {"CEPHALO_VOCAB_PAD", "true"}, {"CEPHALO_VOCAB_PAD", "on"},
    {"CEPHALO_VOCAB_PAD", "off"}, {"CEPHALO_VOCAB_PAD", "01"},   {"CEPHALO_VOCAB_PAD", " 1"},
    {"CEPHALO_VOCAB_PAD", "1 "},  {"CEPHALO_VOCAB_PAD", "0x1"},  {"CEPHALO_STAGE_HOST", "yes"},
    {"CEPHALO_STAGE_HOST", "true"}, {"CEPHALO_PLAN_EXHAUSTIVE_DP", "2"}, {"CEPHALO_PLAN_EXHAUSTIVE_DP", "yes"},
    {"CEPHALO_CUDA_TF32", "false"}, {"CEPHALO_CUDA_TF32", "off"}, {"CEPHALO_CUDA_PORTABLE", "no"},
    {"CEPHALO_CUDA_OPTIME", "false"}, {"CEPHALO_CUDA_OPTIME", "-1"},
    /* choices: the words as written */
    {"CEPHALO_ADAMW", "HALF"}, {"CEPHALO_ADAMW", " half"}, {"CEPHALO_ADAMW", "fused"}, {"CEPHALO_ADAMW", "1"},
    {"CEPHALO_ACTS", "8"}, {"CEPHALO_ACTS", "16.0"}, {"CEPHALO_ACTS", "bf16"}, {"CEPHALO_ACTS", "0"},
    {"CEPHALO_COMM_BACKEND", "mpi"}, {"CEPHALO_COMM_BACKEND", "NCCL"}, {"CEPHALO_NCCL_UNEVEN", "padded"},
    {"CEPHALO_CUDA_ATTN", "tensor"}, {"CEPHALO_CUDA_ATTN", "1"}, {"CEPHALO_CUDA_GEMM", "cublas"},
    {"CEPHALO_CUDA_GEMM", "LT"},
    /* numbers */
    {"CEPHALO_METRICS_PORT", "x"}, {"CEPHALO_METRICS_PORT", "-1"}, {"CEPHALO_METRICS_PORT", "65536"},
    {"CEPHALO_METRICS_PORT", "80x"}, {"CEPHALO_METRICS_PORT", " 80"}, {"CEPHALO_METRICS_PORT", "8.5"},
    {"CEPHALO_COMM_TIMEOUT", "0"}, {"CEPHALO_COMM_TIMEOUT", "-1"}, {"CEPHALO_COMM_TIMEOUT", "60s"},
    {"CEPHALO_COMM_TIMEOUT", "inf"}, {"CEPHALO_COMM_TIMEOUT", "nan"}, {"CEPHALO_COMM_TIMEOUT", "1e7"},
    {"CEPHALO_COMM_TIMEOUT", " 5"},
    /* forms */
    {"CEPHALO_TEST_NONFINITE", "soon"}, {"CEPHALO_TEST_NONFINITE", "-1"}, {"CEPHALO_TEST_NONFINITE", "3:"},
    {"CEPHALO_TEST_NONFINITE", ":1"}, {"CEPHALO_TEST_NONFINITE", "3:1:2"}, {"CEPHALO_TEST_NONFINITE", "+3"},
    {"CEPHALO_OPERATOR_VERSION", "abc"}, {"CEPHALO_OPERATOR_VERSION", "1.2"}, {"CEPHALO_OPERATOR_VERSION", "v1.2.3"},
    {"CEPHALO_OPERATOR_VERSION", "1.2.3+"}, {"CEPHALO_OPERATOR_VERSION", "1.2.3 "},
    /* texts: no control characters */
    {"CEPHALO_JOB", "a\nb"}, {"CEPHALO_JOB_ID", "a\tb"},
};

static const probe good[] = {
    {"CEPHALO_VOCAB_PAD", "0"}, {"CEPHALO_VOCAB_PAD", "1"}, {"CEPHALO_VOCAB_PAD", ""},
    {"CEPHALO_ADAMW", "tensor"}, {"CEPHALO_ADAMW", "unit"}, {"CEPHALO_ADAMW", "half"},
    {"CEPHALO_ACTS", "16"}, {"CEPHALO_ACTS", "32"}, {"CEPHALO_STAGE_HOST", "1"}, {"CEPHALO_CUDA_TF32", "0"},
    {"CEPHALO_PLAN_EXHAUSTIVE_DP", "1"}, {"CEPHALO_COMM_BACKEND", "nccl"}, {"CEPHALO_NCCL_UNEVEN", "grouped"},
    {"CEPHALO_CUDA_ATTN", "mma"}, {"CEPHALO_CUDA_PORTABLE", "1"}, {"CEPHALO_CUDA_OPTIME", "0"},
    {"CEPHALO_CUDA_GEMM", "lt"}, {"CEPHALO_CUDA_GEMM", "blas"},
    {"CEPHALO_METRICS_PORT", "0"}, {"CEPHALO_METRICS_PORT", "65535"}, {"CEPHALO_COMM_TIMEOUT", "0.5"},
    {"CEPHALO_COMM_TIMEOUT", "1e6"}, {"CEPHALO_TEST_NONFINITE", "3"}, {"CEPHALO_TEST_NONFINITE", "0:2"},
    {"CEPHALO_OPERATOR_VERSION", "0.1.0"}, {"CEPHALO_OPERATOR_VERSION", "0.1.0+0123456789ab-dirty"},
    {"CEPHALO_OPERATOR_VERSION", "1.0.0-rc.1"}, {"CEPHALO_PROFILE_STORE", "none"}, {"CEPHALO_PROFILE_CACHE", "/tmp/c"},
    {"CEPHALO_PLAN", "plan.json"}, {"CEPHALO_WORKER", "/opt/cephalo-worker"}, {"CEPHALO_JOB", "gpt-ft.2"},
    {"CEPHALO_JOB_ID", "job-7"}, {"CEPHALO_SERVICEACCOUNT_DIR", "/tmp/sa"},
};

static void test_values(void **state) {
    (void)state;
    unset_all();
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const env_var *v = env_find(bad[i].name);
        assert_non_null(v);
        err_t err = {{0}};
        char want[512], values[256];
        if (env_check_value(v, bad[i].value, &err) == 0) fail_msg("$%s='%s' accepted", bad[i].name, bad[i].value);
        char shown[64];
        snprintf(shown, sizeof shown, "%s", bad[i].value);
        for (char *c = shown; *c; c++)
            if (*c < 0x20) *c = '?'; /* control characters: quoted as '?' */
        snprintf(want, sizeof want, "$%s is '%s', expected %s", v->name, shown, env_values(v, values, sizeof values));
        assert_string_equal(err.msg, want);
        /* the same through the environment, one variable or all of them */
        setenv(bad[i].name, bad[i].value, 1);
        assert_int_equal(env_check(bad[i].name, &err), -1);
        assert_string_equal(err.msg, want);
        assert_int_equal(env_check_all(&err), -1);
        assert_string_equal(err.msg, want);
        unsetenv(bad[i].name);
    }
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        err_t err = {{0}};
        setenv(good[i].name, good[i].value, 1);
        if (env_check(good[i].name, &err) < 0) fail_msg("$%s='%s' refused: %s", good[i].name, good[i].value, err.msg);
        unsetenv(good[i].name);
    }
    err_t err = {{0}};
    assert_int_equal(env_check_all(&err), 0);
}

/* The issue's examples, and the message's words, as the programs print them */
static void test_issue_examples(void **state) {
    (void)state;
    err_t err = {{0}};
    unset_all();
    setenv("CEPHALO_VOCAB_PAD", "no", 1);
    assert_int_equal(env_check_all(&err), -1);
    assert_string_equal(err.msg, "$CEPHALO_VOCAB_PAD is 'no', expected 0 or 1");
    setenv("CEPHALO_VOCAB_PAD", "1", 1);
    setenv("CEPHALO_ADAMW", "bogus", 1);
    assert_int_equal(env_check_all(&err), -1);
    assert_string_equal(err.msg, "$CEPHALO_ADAMW is 'bogus', expected tensor, unit or half");
    unset_all();
}

static void test_lengths(void **state) {
    (void)state;
    err_t err = {{0}};
    char path[4097], id[65];
    memset(path, 'p', sizeof path - 1), path[sizeof path - 1] = '\0';
    memset(id, 'j', sizeof id - 1), id[sizeof id - 1] = '\0';
    assert_int_equal(env_check_value(env_find("CEPHALO_PLAN"), path, &err), -1);
    assert_has(err.msg, "$CEPHALO_PLAN is 4096 characters long ('pppp");
    assert_has(err.msg, "at most 4095 characters");
    path[4095] = '\0';
    assert_int_equal(env_check_value(env_find("CEPHALO_PLAN"), path, &err), 0);
    assert_int_equal(env_check_value(env_find("CEPHALO_JOB_ID"), id, &err), -1);
    assert_has(err.msg, "$CEPHALO_JOB_ID is 64 characters long");
    id[63] = '\0';
    assert_int_equal(env_check_value(env_find("CEPHALO_JOB_ID"), id, &err), 0);
}

/* ---- the getters ---- */

static void test_getters(void **state) {
    (void)state;
    err_t err = {{0}};
    long l = -7;
    double d = -7;
    const char *s = "x";
    unset_all();
    /* unset and empty: the default */
    assert_int_equal(env_flag("CEPHALO_VOCAB_PAD", &err), 0);
    assert_int_equal(env_flag("CEPHALO_CUDA_TF32", &err), 1);
    setenv("CEPHALO_CUDA_TF32", "", 1);
    assert_int_equal(env_flag("CEPHALO_CUDA_TF32", &err), 1);
    setenv("CEPHALO_CUDA_TF32", "0", 1);
    assert_int_equal(env_flag("CEPHALO_CUDA_TF32", NULL), 0);
    assert_string_equal(env_word("CEPHALO_COMM_BACKEND", &err), "socket");
    setenv("CEPHALO_COMM_BACKEND", "nccl", 1);
    assert_string_equal(env_word("CEPHALO_COMM_BACKEND", &err), "nccl");
    setenv("CEPHALO_COMM_BACKEND", "mpi", 1);
    assert_null(env_word("CEPHALO_COMM_BACKEND", &err));
    assert_string_equal(err.msg, "$CEPHALO_COMM_BACKEND is 'mpi', expected socket or nccl");
    assert_int_equal(env_long("CEPHALO_METRICS_PORT", &l, &err), ENV_UNSET);
    assert_int_equal(l, -7);
    setenv("CEPHALO_METRICS_PORT", "9100", 1);
    assert_int_equal(env_long("CEPHALO_METRICS_PORT", &l, &err), ENV_GIVEN);
    assert_int_equal(l, 9100);
    setenv("CEPHALO_METRICS_PORT", "x", 1);
    assert_int_equal(env_long("CEPHALO_METRICS_PORT", &l, &err), -1);
    assert_int_equal(env_number("CEPHALO_COMM_TIMEOUT", &d, &err), ENV_UNSET);
    setenv("CEPHALO_COMM_TIMEOUT", "2.5", 1);
    assert_int_equal(env_number("CEPHALO_COMM_TIMEOUT", &d, &err), ENV_GIVEN);
    assert_true(d == 2.5);
    /* texts: empty is unset; a path-or-none's none and empty are off */
    assert_int_equal(env_text("CEPHALO_PLAN", &s, &err), ENV_UNSET);
    assert_null(s);
    setenv("CEPHALO_PLAN", "", 1);
    assert_int_equal(env_text("CEPHALO_PLAN", &s, &err), ENV_UNSET);
    setenv("CEPHALO_PLAN", "p.json", 1);
    assert_int_equal(env_text("CEPHALO_PLAN", &s, &err), ENV_GIVEN);
    assert_string_equal(s, "p.json");
    assert_int_equal(env_text("CEPHALO_PROFILE_STORE", &s, &err), ENV_UNSET);
    setenv("CEPHALO_PROFILE_STORE", "none", 1);
    assert_int_equal(env_text("CEPHALO_PROFILE_STORE", &s, &err), ENV_OFF);
    assert_null(s);
    setenv("CEPHALO_PROFILE_STORE", "", 1);
    assert_int_equal(env_text("CEPHALO_PROFILE_STORE", &s, &err), ENV_OFF);
    setenv("CEPHALO_PROFILE_STORE", "/tmp/s.json", 1);
    assert_int_equal(env_text("CEPHALO_PROFILE_STORE", &s, &err), ENV_GIVEN);
    assert_string_equal(s, "/tmp/s.json");
    long step, rank;
    assert_true(env_step_rank("12:3", &step, &rank) && step == 12 && rank == 3);
    assert_true(env_step_rank("5", &step, &rank) && step == 5 && rank == 0);
    unset_all();
}

/* The memory model's switches read through the table: engine_env_check refuses a bad value of
 * each of the three (it checked $CEPHALO_ACTS alone: CEPHALO_VOCAB_PAD=no turned padding on), and
 * the switches follow their documented values. */
static void test_engine_switches(void **state) {
    (void)state;
    err_t err = {{0}};
    model_spec m;
    assert_int_equal(model_resolve("gpt2-124m", &m, &err), 0); /* V = 50257 */
    unset_all();
    const probe cases[] = {{"CEPHALO_VOCAB_PAD", "no"}, {"CEPHALO_VOCAB_PAD", "false"}, {"CEPHALO_VOCAB_PAD", "2"},
                           {"CEPHALO_ADAMW", "bogus"}, {"CEPHALO_ACTS", "8"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        setenv(cases[i].name, cases[i].value, 1);
        if (engine_env_check(&err) == 0) fail_msg("engine_env_check took $%s='%s'", cases[i].name, cases[i].value);
        assert_has(err.msg, cases[i].name);
        unsetenv(cases[i].name);
    }
    assert_int_equal(engine_env_check(&err), 0);
    const struct {
        const char *v;
        int ld;
    } pad[] = {{"", 50257}, {"0", 50257}, {"1", 50304}};
    for (size_t i = 0; i < 3; i++) {
        setenv("CEPHALO_VOCAB_PAD", pad[i].v, 1);
        engine_set_vocab_pad(-1); /* read again */
        assert_int_equal(engine_vocab_ld(&m), pad[i].ld);
    }
    setenv("CEPHALO_ADAMW", "half", 1);
    engine_set_adamw_half(-1);
    assert_int_equal(engine_state_bytes_per_param(PREC_BF16), STATE_BYTES_PER_PARAM + 2);
    setenv("CEPHALO_ADAMW", "unit", 1);
    engine_set_adamw_half(-1);
    assert_int_equal(engine_state_bytes_per_param(PREC_BF16), STATE_BYTES_PER_PARAM);
    setenv("CEPHALO_ACTS", "16", 1);
    engine_set_acts16(-1);
    assert_true(engine_acts16(PREC_BF16));
    unset_all();
    engine_set_vocab_pad(-1), engine_set_adamw_half(-1), engine_set_acts16(-1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_docs_table), cmocka_unit_test(test_table),   cmocka_unit_test(test_values),
        cmocka_unit_test(test_issue_examples), cmocka_unit_test(test_lengths), cmocka_unit_test(test_getters),
        cmocka_unit_test(test_engine_switches),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
