/* test_profile.c - the profile file: loading, lookups, and one clear message per kind of bad input;
 * plus the JSON helpers it is built on.
 *
 * JSON in this file is written with single quotes for readability; load() turns them into double
 * quotes. Run from the repository root (the example profile is read by relative path). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json_util.h"
#include "planner/profile.h"
#include "planner/profile_store.h"

#define EXAMPLE "examples/profiles/cluster-a-bert-large.json"

#define HEADER "'format': 'cephalo-profile', 'version': 1, "
/* One valid entry; tests splice their own fields into variants of it. */
#define MB3 "'microbatch': [1, 2, 4], "
#define BLOCK3 "'block': {'fwd_ms': [1, 2, 4], 'bwd_ms': [2, 4, 8]}"
#define L4_HEAD "'device': 'L4', 'model': 'bert-large', 'seq': 512, 'precision': 'fp32', "
#define L4_ENTRY "{" L4_HEAD MB3 BLOCK3 "}"

static const char VALID[] =
    "{" HEADER "'entries': [\n"
    "  " L4_ENTRY ",\n"
    "  {'device': 'L4', 'model': 'bert-large', 'seq': 512, 'precision': 'bf16', " MB3
    "   'block': {'fwd_ms': [0.5, 1, 2], 'bwd_ms': [1, 2, 4]}},\n"
    "  {'device': 'A6000', 'model': 'GPT-1.3B', 'seq': 2048, 'precision': 'fp32',\n"
    "   'microbatch': [1, 8], 'block': {'fwd_ms': [3, 20], 'bwd_ms': [6, 40]},\n"
    "   'embedding': {'fwd_ms': [0.1, 0.5], 'bwd_ms': [0.2, 1]},\n"
    "   'head': {'fwd_ms': [0.3, 2], 'bwd_ms': [0.6, 4]},\n"
    "   'compute_bytes': [1e9, 5.5e9]}\n"
    "], 'comm': [\n"
    "  {'world': 8, 'op': 'allgather', 'bytes': [0, 1e6, 1e9], 'ms': [0.01, 0.6, 150],\n"
    "   'uneven_ms': [0.02, 0.7, 172]},\n"
    "  {'world': 8, 'op': 'reduce_scatter', 'bytes': [1e6, 1e9], 'ms': [0.6, 155]}\n"
    "]}";

/* Loads single-quoted JSON text; returns the rc and leaves the message in *err. */
static int load(const char *squoted, profile *p, err_t *err) {
    size_t len = strlen(squoted);
    char *text = malloc(len + 1);
    assert_non_null(text);
    for (size_t i = 0; i <= len; i++) text[i] = squoted[i] == '\'' ? '"' : squoted[i];
    memset(err, 0, sizeof *err);
    int rc = profile_load_string("bad.json", text, len, p, err);
    free(text);
    return rc;
}

/* The input must be refused with a message containing `needle`, leaving the profile empty. */
static void expect_error(const char *squoted, const char *needle) {
    profile p;
    err_t err;
    int rc = load(squoted, &p, &err);
    if (rc != -1 || !strstr(err.msg, needle))
        fail_msg("rc %d, message \"%s\"; wanted -1 and a message containing \"%s\"", rc, err.msg,
                 needle);
    assert_int_equal(p.n_entries, 0);
    assert_int_equal(p.n_comm, 0);
    assert_null(p.entries);
    assert_null(p.comm);
}

/* ---- valid input -------------------------------------------------------------------------- */

static void test_valid_loads(void **state) {
    (void)state;
    profile p;
    err_t err;
    if (load(VALID, &p, &err) != 0) fail_msg("%s", err.msg);
    assert_int_equal(p.n_entries, 3);
    assert_int_equal(p.n_comm, 2);
    const profile_entry *e = &p.entries[2];
    assert_string_equal(e->device, "A6000");
    assert_int_equal(e->seq, 2048);
    assert_int_equal(e->n_points, 2);
    assert_int_equal(e->microbatch[1], 8);
    assert_true(e->block.present && e->embedding.present && e->head.present);
    assert_true(e->head.bwd_ms[1] == 4.0);
    assert_non_null(e->compute_bytes);
    assert_true(e->compute_bytes[1] == 5.5e9);
    assert_false(p.entries[0].embedding.present);
    assert_null(p.entries[0].embedding.fwd_ms);
    assert_null(p.entries[0].compute_bytes);
    profile_free(&p);
    assert_int_equal(p.n_entries, 0);
    assert_null(p.entries);
}

static void test_find(void **state) {
    (void)state;
    profile p;
    err_t err;
    if (load(VALID, &p, &err) != 0) fail_msg("%s", err.msg);
    const profile_entry *fp32 = profile_find(&p, "l4", "BERT-Large", 512, PREC_FP32);
    const profile_entry *bf16 = profile_find(&p, "L-4", "bert-large", 512, PREC_BF16);
    assert_ptr_equal(fp32, &p.entries[0]);
    assert_ptr_equal(bf16, &p.entries[1]); /* precision tells the two L4 entries apart */
    assert_ptr_equal(profile_find(&p, "a_6000", "gpt-1.3b", 2048, PREC_FP32), &p.entries[2]);
    assert_null(profile_find(&p, "L4", "bert-large", 1024, PREC_FP32)); /* other seq */
    assert_null(profile_find(&p, "L40", "bert-large", 512, PREC_FP32)); /* other device */
    assert_null(profile_find(&p, "L4", "bert", 512, PREC_FP32)); /* model matches exactly */
    assert_null(profile_find(&p, "A6000", "gpt-1.3b", 2048, PREC_BF16));
    /* a GPU Feature Discovery label names the same catalog GPU */
    assert_ptr_equal(profile_find(&p, "NVIDIA-L4", "bert-large", 512, PREC_FP32), &p.entries[0]);
    assert_ptr_equal(profile_find(&p, "NVIDIA-RTX-A6000", "gpt-1.3b", 2048, PREC_FP32), &p.entries[2]);

    const profile_comm *ag = profile_find_comm(&p, 8, false);
    const profile_comm *rs = profile_find_comm(&p, 8, true);
    assert_ptr_equal(ag, &p.comm[0]);
    assert_ptr_equal(rs, &p.comm[1]);
    assert_int_equal(ag->n_points, 3);
    assert_non_null(ag->uneven_ms);
    assert_null(rs->uneven_ms);
    assert_null(profile_find_comm(&p, 16, false));
    profile_free(&p);
    assert_null(profile_find(&p, "L4", "bert-large", 512, PREC_FP32)); /* freed profile is empty */
}

/* The optional measurements added within version 1: read when present, 0/NULL when not, refused
 * when out of range or of the wrong length. */
static void test_optional_fields(void **state) {
    (void)state;
    profile p;
    err_t err;
    const char *text = "{" HEADER "'entries': [{" L4_HEAD MB3 BLOCK3 ", 'optimizer_ms_per_mparam': 1.5}],"
                       " 'comm': [{'world': 2, 'op': 'allgather', 'bytes': [1, 2], 'ms': [1, 2],"
                       " 'cpu_ms': [0.5, 1.5], 'host_cores': 16, 'train_overhead_ms': 0.05}]}";
    if (load(text, &p, &err) != 0) fail_msg("%s", err.msg);
    assert_true(p.entries[0].optimizer_ms_per_mparam == 1.5);
    assert_non_null(p.comm[0].cpu_ms);
    assert_true(p.comm[0].cpu_ms[1] == 1.5);
    assert_int_equal(p.comm[0].host_cores, 16);
    assert_true(p.comm[0].train_overhead_ms == 0.05);
    /* and back: the store writes what it read */
    char *json = profile_to_json(&p);
    assert_non_null(strstr(json, "\"train_overhead_ms\""));
    free(json);
    profile_free(&p);
    if (load(VALID, &p, &err) != 0) fail_msg("%s", err.msg);
    assert_true(p.entries[0].optimizer_ms_per_mparam == 0);
    assert_null(p.comm[0].cpu_ms);
    assert_int_equal(p.comm[0].host_cores, 0);
    profile_free(&p);
    expect_error("{" HEADER "'entries': [{" L4_HEAD MB3 BLOCK3 ", 'optimizer_ms_per_mparam': -1}]}",
                 "entries[0].optimizer_ms_per_mparam");
    expect_error("{" HEADER "'entries': [], 'comm': [{'world': 2, 'op': 'allgather', 'bytes': [1, 2],"
                 " 'ms': [1, 2], 'cpu_ms': [1]}]}",
                 "comm[0].cpu_ms has 1 value");
    expect_error("{" HEADER "'entries': [], 'comm': [{'world': 2, 'op': 'allgather', 'bytes': [1, 2],"
                 " 'ms': [1, 2], 'host_cores': 0}]}",
                 "comm[0].host_cores");
    expect_error("{" HEADER "'entries': [], 'comm': [{'world': 2, 'op': 'allgather', 'bytes': [1, 2],"
                 " 'ms': [1, 2], 'train_overhead_ms': -0.1}]}",
                 "comm[0].train_overhead_ms");
}

/* Version 2: bwd_keep_ms (the backward phase with recompute none, measured) in the block and the
 * embedding, read and written back; absent (NULL) in version 1 files, which still read; checked
 * like the other curves. */
static void test_bwd_keep(void **state) {
    (void)state;
    profile p;
    err_t err;
    const char *v2 = "{'format': 'cephalo-profile', 'version': 2, 'entries': [{" L4_HEAD MB3
                     "'block': {'fwd_ms': [1, 2, 4], 'bwd_ms': [2, 4, 8], 'bwd_keep_ms': [1.5, 3, 6]},"
                     "'embedding': {'fwd_ms': [1, 1, 1], 'bwd_ms': [2, 2, 2], 'bwd_keep_ms': [1, 1, 1.25]}}]}";
    if (load(v2, &p, &err) != 0) fail_msg("%s", err.msg);
    assert_non_null(p.entries[0].block.bwd_keep_ms);
    assert_true(p.entries[0].block.bwd_keep_ms[1] == 3 && p.entries[0].embedding.bwd_keep_ms[2] == 1.25);
    assert_null(p.entries[0].head.bwd_keep_ms);
    char *json = profile_to_json(&p);
    profile_free(&p);
    if (profile_load_string("again.json", json, strlen(json), &p, &err) != 0) fail_msg("%s", err.msg);
    assert_true(p.entries[0].block.bwd_keep_ms[2] == 6);
    free(json);
    profile_free(&p);
    if (load(VALID, &p, &err) != 0) fail_msg("version 1: %s", err.msg);
    assert_null(p.entries[0].block.bwd_keep_ms);
    profile_free(&p);
    expect_error("{" HEADER "'entries': [{" L4_HEAD MB3
                 "'block': {'fwd_ms': [1, 2, 4], 'bwd_ms': [2, 4, 8], 'bwd_keep_ms': [1, 2]}}]}",
                 "entries[0].block.bwd_keep_ms has 2 value");
    expect_error("{" HEADER "'entries': [{" L4_HEAD MB3
                 "'block': {'fwd_ms': [1, 2, 4], 'bwd_ms': [2, 4, 8], 'bwd_keep_ms': [1, -2, 3]}}]}",
                 "entries[0].block.bwd_keep_ms[1]");
}

static void test_empty_entries(void **state) {
    (void)state;
    profile p;
    err_t err;
    if (load("{" HEADER "'entries': []}", &p, &err) != 0) fail_msg("%s", err.msg);
    assert_int_equal(p.n_entries, 0);
    assert_null(profile_find(&p, "L4", "bert-large", 512, PREC_FP32));
    assert_null(profile_find_comm(&p, 8, false));
    profile_free(&p);
}

static void test_example_file(void **state) {
    (void)state;
    profile p;
    err_t err = {{0}};
    if (profile_load_file(EXAMPLE, &p, &err) != 0) fail_msg("%s", err.msg);
    assert_int_equal(p.n_entries, 4);
    const char *devices[] = {"L4", "A6000", "P40", "P100"};
    for (int i = 0; i < 4; i++) {
        const profile_entry *e = profile_find(&p, devices[i], "bert-large", 512, PREC_FP32);
        if (!e) fail_msg("no entry for %s", devices[i]);
        assert_int_equal(e->n_points, 16);
        assert_non_null(e->compute_bytes);
    }
    /* The paper's A6000 figure: 2.67 ms per layer at microbatch 1, 39.73 at 16. */
    const profile_entry *a = profile_find(&p, "a6000", "bert-large", 512, PREC_FP32);
    assert_true(fabs(a->block.fwd_ms[0] + a->block.bwd_ms[0] - 2.67) < 0.01);
    assert_true(fabs(a->block.fwd_ms[15] + a->block.bwd_ms[15] - 39.73) < 0.01);
    const profile_comm *rs = profile_find_comm(&p, 8, true);
    assert_non_null(rs);
    assert_non_null(rs->uneven_ms);
    assert_true(rs->uneven_ms[3] > rs->ms[3]);
    profile_free(&p);
}

static void test_missing_file(void **state) {
    (void)state;
    profile p;
    err_t err = {{0}};
    assert_int_equal(profile_load_file("no/such/profile.json", &p, &err), -1);
    assert_non_null(strstr(err.msg, "no/such/profile.json: cannot open"));
    assert_int_equal(p.n_entries, 0);
}

/* ---- one message per kind of bad input ---------------------------------------------------- */

static void test_malformed_json(void **state) {
    (void)state;
    expect_error("{" HEADER "\n'entries': [\n  {'device': 'L4',, }\n]}",
                 "bad.json:3:20: JSON syntax error near ' }'"); /* cJSON's position */
    expect_error("{" HEADER "'entries': []} trailing",
                 "bad.json:1:60: JSON syntax error near 'trailing'");
    expect_error("  \n ", "bad.json: the document is empty");
    expect_error("", "bad.json: the document is empty");
}

static void test_wrong_format(void **state) {
    (void)state;
    expect_error("{'format': 'cephalo-plan', 'version': 1, 'entries': []}",
                 "bad.json: format: expected \"cephalo-profile\", got \"cephalo-plan\"");
    expect_error("{'version': 1, 'entries': []}", "bad.json: missing field 'format'");
    expect_error("[1, 2]", "bad.json: expected an object, got an array");
}

static void test_stale_version(void **state) {
    (void)state;
    expect_error("{'format': 'cephalo-profile', 'version': 0, 'entries': []}",
                 "bad.json: version 0 is not supported (this build reads versions 1 to 2); "
                 "re-run `cephalo profile`");
    expect_error("{'format': 'cephalo-profile', 'version': 3, 'entries': []}",
                 "bad.json: version 3 is not supported (this build reads versions 1 to 2)");
    expect_error("{'format': 'cephalo-profile', 'version': '1', 'entries': []}",
                 "version: expected an integer, got \"1\"");
}

static void test_missing_block(void **state) {
    (void)state;
    expect_error("{" HEADER "'entries': [{" L4_HEAD "'microbatch': [1]}]}",
                 "bad.json: entries[0]: missing field 'block'");
    expect_error("{" HEADER "'entries': [{" L4_HEAD MB3 "'block': {'fwd_ms': [1, 2, 3]}}]}",
                 "entries[0].block: missing field 'bwd_ms'");
}

static void test_microbatch_not_increasing(void **state) {
    (void)state;
    expect_error("{" HEADER "'entries': [{" L4_HEAD "'microbatch': [1, 4, 4], " BLOCK3 "}]}",
                 "entries[0].microbatch[2]: 4 is not greater than the value before it (4)");
    expect_error("{" HEADER "'entries': [{" L4_HEAD "'microbatch': [], " BLOCK3 "}]}",
                 "entries[0].microbatch: expected 1 to 4096 microbatch sizes, got 0");
    expect_error("{" HEADER "'entries': [{" L4_HEAD "'microbatch': [1, 2.5, 4], " BLOCK3 "}]}",
                 "entries[0].microbatch[1]: expected an integer, got 2.5");
    expect_error("{" HEADER "'entries': [{" L4_HEAD "'microbatch': [0, 2, 4], " BLOCK3 "}]}",
                 "entries[0].microbatch[0]: expected an integer >= 1, got 0");
}

static void test_length_mismatch(void **state) {
    (void)state;
    expect_error("{" HEADER "'entries': [{" L4_HEAD MB3
                 "'block': {'fwd_ms': [1, 2, 4], 'bwd_ms': [2, 4]}}]}",
                 "entries[0].block.bwd_ms has 2 values but entries[0].microbatch has 3");
    expect_error("{" HEADER "'entries': [{" L4_HEAD MB3 BLOCK3 ", 'compute_bytes': [1]}]}",
                 "entries[0].compute_bytes has 1 value but entries[0].microbatch has 3");
    expect_error("{" HEADER "'entries': [], 'comm': [{'world': 8, 'op': 'allgather', "
                 "'bytes': [1, 2], 'ms': [1, 2], 'uneven_ms': [1, 2, 3]}]}",
                 "comm[0].uneven_ms has 3 values but comm[0].bytes has 2");
}

static void test_bad_numbers(void **state) {
    (void)state;
    expect_error("{" HEADER "'entries': [{" L4_HEAD MB3
                 "'block': {'fwd_ms': [1, -1, 4], 'bwd_ms': [2, 4, 8]}}]}",
                 "bad.json: entries[0].block.fwd_ms[1]: expected a number > 0, got -1");
    expect_error("{" HEADER "'entries': [{" L4_HEAD MB3
                 "'block': {'fwd_ms': [1, 2, 4], 'bwd_ms': [2, 'x', 8]}}]}",
                 "entries[0].block.bwd_ms[1]: expected a number > 0 and < 1e+09, got \"x\"");
    expect_error("{" HEADER "'entries': [{" L4_HEAD MB3
                 "'block': {'fwd_ms': [1, 2, 1e999], 'bwd_ms': [2, 4, 8]}}]}",
                 "entries[0].block.fwd_ms[2]: expected a number > 0 and < 1e+09, got inf");
    expect_error("{" HEADER "'entries': [{" L4_HEAD MB3
                 "'block': {'fwd_ms': [1, 2, 4], 'bwd_ms': [2, 4, 8]}, "
                 "'compute_bytes': [1, -0.5, 3]}]}",
                 "entries[0].compute_bytes[1]: expected a number >= 0, got -0.5");
    expect_error("{" HEADER "'entries': [{'device': 'L4', 'model': 'bert-large', 'seq': 0, "
                 "'precision': 'fp32', " MB3 BLOCK3 "}]}",
                 "entries[0].seq: expected an integer >= 1, got 0");
    expect_error("{" HEADER "'entries': [{'device': 'L4', 'model': 'bert-large', 'seq': 512, "
                 "'precision': 'fp8', " MB3 BLOCK3 "}]}",
                 "entries[0].precision: expected \"fp32\", \"bf16\" or \"fp16\", got \"fp8\"");
    expect_error("{" HEADER "'entries': [], 'comm': [{'world': 8, 'op': 'allgather', "
                 "'bytes': [1, 1], 'ms': [1, 2]}]}",
                 "comm[0].bytes[1]: 1 is not greater than the value before it (1)");
}

static void test_bad_names(void **state) {
    (void)state;
    expect_error("{" HEADER "'entries': [{'device': '', 'model': 'bert-large', 'seq': 512, "
                 "'precision': 'fp32', " MB3 BLOCK3 "}]}",
                 "entries[0].device: expected a non-empty string");
    expect_error("{" HEADER "'entries': [{'device': 'ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789', "
                 "'model': 'bert-large', 'seq': 512, 'precision': 'fp32', " MB3 BLOCK3 "}]}",
                 "entries[0].device: the name is longer than 31 characters");
    expect_error("{" HEADER "'entries': [{'device': 7, 'model': 'bert-large', 'seq': 512, "
                 "'precision': 'fp32', " MB3 BLOCK3 "}]}",
                 "entries[0].device: expected a string, got 7");
}

static void test_unknown_key(void **state) {
    (void)state;
    expect_error("{" HEADER "'entries': [{" L4_HEAD MB3
                 "'blok': {'fwd_ms': [1, 2, 4], 'bwd_ms': [2, 4, 8]}}]}",
                 "bad.json: entries[0]: unknown field 'blok' (did you mean 'block'?)");
    expect_error("{" HEADER "'entries': [], 'comms': []}",
                 "bad.json: unknown field 'comms' (did you mean 'comm'?)");
    expect_error("{" HEADER "'entries': [{" L4_HEAD MB3
                 "'block': {'fwd_ms': [1, 2, 4], 'bwd_ms': [2, 4, 8], 'fwd': [1]}}]}",
                 "entries[0].block: unknown field 'fwd'");
    expect_error("{" HEADER "'entries': [{" L4_HEAD MB3 BLOCK3 ", 'seq': 1024}]}",
                 "entries[0]: field 'seq' appears twice");
}

static void test_duplicate_entry(void **state) {
    (void)state;
    expect_error("{" HEADER "'entries': [" L4_ENTRY ",\n"
                 "{'device': 'A6000', 'model': 'bert-large', 'seq': 512, 'precision': 'fp32', " MB3
                 BLOCK3 "},\n"
                 "{'device': 'l-4', 'model': 'BERT-large', 'seq': 512, 'precision': 'fp32', " MB3
                 BLOCK3 "}]}",
                 "bad.json: entries[2]: duplicate of entries[0]");
    expect_error("{" HEADER "'entries': [], 'comm': ["
                 "{'world': 8, 'op': 'allgather', 'bytes': [1], 'ms': [1]},"
                 "{'world': 8, 'op': 'allgather', 'bytes': [2], 'ms': [2]}]}",
                 "comm[1]: duplicate of comm[0]");
}

static void test_wrong_op(void **state) {
    (void)state;
    expect_error("{" HEADER "'entries': [], 'comm': ["
                 "{'world': 8, 'op': 'all_gather', 'bytes': [1], 'ms': [1]}]}",
                 "bad.json: comm[0].op: expected \"allgather\" or \"reduce_scatter\", got "
                 "\"all_gather\"");
    expect_error("{" HEADER "'entries': [], 'comm': [{'world': 0, 'op': 'allgather', "
                 "'bytes': [1], 'ms': [1]}]}",
                 "comm[0].world: expected an integer >= 1, got 0");
}

/* Inputs a fuzzer would try: none may crash, all must fail cleanly. */
static void test_odd_inputs(void **state) {
    (void)state;
    const char *odd[] = {
        "null",
        "0",
        "\"x\"",
        "[]",
        "{}",
        "{'format': null}",
        "{'format': 'cephalo-profile'}",
        "{'format': 'cephalo-profile', 'version': 1e300}",
        "{'format': 'cephalo-profile', 'version': -1e300}",
        "{" HEADER "'entries': {}}",
        "{" HEADER "'entries': [1]}",
        "{" HEADER "'entries': [[]]}",
        "{" HEADER "'entries': [{}]}",
        "{" HEADER "'entries': [], 'comm': {}}",
        "{" HEADER "'entries': [], 'comm': [null]}",
        "{" HEADER "'entries': [], 'entries': []}",
        "{" HEADER "'entries': [{" L4_HEAD "'microbatch': [1e300], " BLOCK3 "}]}",
        "{" HEADER "'entries': [{" L4_HEAD "'microbatch': [1, 2, 4], 'block': []}]}",
        "{\"format\\u0000x\": 1}", /* a NUL inside a key */
        "{\"a\": \"\\ud800\"}",    /* a lone surrogate */
        "\xef\xbb\xbf{",           /* a byte-order mark, then nothing */
        "-",
        "1e",
    };
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
        profile p;
        err_t err;
        if (load(odd[i], &p, &err) != -1) fail_msg("accepted: %s", odd[i]);
        if (!err.msg[0]) fail_msg("no message for: %s", odd[i]);
        assert_null(p.entries);
    }
}

static void test_deep_and_unterminated(void **state) {
    (void)state;
    enum { DEPTH = 100000 };
    char *deep = malloc(2 * DEPTH + 1);
    assert_non_null(deep);
    memset(deep, '[', DEPTH);
    memset(deep + DEPTH, ']', DEPTH);
    deep[2 * DEPTH] = '\0';
    profile p;
    err_t err = {{0}};
    assert_int_equal(profile_load_string("deep.json", deep, 2 * DEPTH, &p, &err), -1);
    assert_non_null(strstr(err.msg, "deep.json:1:"));
    /* An exact-length buffer with no terminator: the parser must stop at len. */
    char raw[] = {'{', '"', 'a', '"', ':', ' ', '1', '2', '3'};
    assert_int_equal(profile_load_string("raw.json", raw, sizeof raw, &p, &err), -1);
    assert_int_equal(profile_load_string("nul.json", "{}\0{}", 5, &p, &err), -1);
    free(deep);
}

/* ---- the JSON helpers on their own ------------------------------------------------------- */

static void test_json_getters(void **state) {
    (void)state;
    err_t err = {{0}};
    const char text[] = "{\"i\": 3.0, \"f\": 3.5, \"s\": \"abc\", \"b\": true, \"big\": 1e20}";
    cJSON *root = json_parse("t.json", text, strlen(text), &err);
    assert_non_null(root);
    json_ctx c = {"t.json", &err};
    long i;
    double d;
    const char *s;
    bool b;
    const cJSON *v;
    assert_int_equal(json_int(&c, json_get(root, "i"), "i", 0, 10, &i), 0);
    assert_int_equal(i, 3);
    assert_int_equal(json_int(&c, json_get(root, "f"), "f", 0, 10, &i), -1);
    assert_string_equal(err.msg, "t.json: f: expected an integer, got 3.5");
    assert_int_equal(json_int(&c, json_get(root, "big"), "big", 0, 10, &i), -1);
    assert_string_equal(err.msg, "t.json: big: expected an integer <= 10, got 1e+20");
    assert_int_equal(json_int(&c, json_get(root, "big"), "big", LONG_MIN, LONG_MAX, &i), -1);
    assert_int_equal(json_number(&c, json_get(root, "f"), "f", 0, 3.5, JSON_CLOSED, &d), 0);
    assert_int_equal(json_number(&c, json_get(root, "f"), "f", 0, 3.5, JSON_OPEN, &d), -1);
    assert_string_equal(err.msg, "t.json: f: expected a number < 3.5, got 3.5");
    assert_int_equal(json_string(&c, json_get(root, "s"), "s", &s), 0);
    assert_string_equal(s, "abc");
    assert_int_equal(json_bool(&c, json_get(root, "b"), "b", &b), 0);
    assert_true(b);
    assert_int_equal(json_bool(&c, json_get(root, "s"), "s", &b), -1);
    assert_string_equal(err.msg, "t.json: s: expected true or false, got \"abc\"");
    assert_int_equal(json_require(&c, root, "top", "nope", &v), -1);
    assert_string_equal(err.msg, "t.json: top: missing field 'nope'");
    assert_null(json_get(root, "nope"));
    assert_null(json_get(NULL, "i"));
    assert_int_equal(json_string(&c, NULL, "x", &s), -1); /* NULL items fail, never crash */
    assert_string_equal(err.msg, "t.json: x: expected a string, got nothing");
    const char *allowed[] = {"i", "f", "s", "b", NULL};
    assert_int_equal(json_check_keys(&c, root, "", allowed), -1);
    assert_non_null(strstr(err.msg, "t.json: unknown field 'big'"));
    cJSON_Delete(root);
}

static void test_json_syntax_position(void **state) {
    (void)state;
    err_t err = {{0}};
    const char text[] = "{\n  \"a\": 1,\n  \"b\": tru\n}";
    assert_null(json_parse("s.json", text, strlen(text), &err));
    assert_non_null(strstr(err.msg, "s.json:3:"));
    assert_non_null(strstr(err.msg, "JSON syntax error near"));
    assert_null(json_load_file("/nonexistent/x.json", &err));
    assert_non_null(strstr(err.msg, "/nonexistent/x.json: cannot open"));
}

/* json_parse refuses a key twice in any object, at any depth, naming where: cJSON keeps both and
 * json_get() would take the first where Python's json takes the last. */
static void test_json_duplicate_keys(void **state) {
    (void)state;
    err_t err = {{0}};
    const char *top = "{\"a\": 1, \"b\": 2, \"a\": 3}";
    assert_null(json_parse("t.json", top, strlen(top), &err));
    assert_string_equal(err.msg, "t.json: field 'a' appears twice (readers differ on which one counts)");
    const char *deep = "{\"x\": {\"list\": [1, {\"k\": 1}, {\"k\": 1, \"m\": 2, \"k\": 3}]}}";
    assert_null(json_parse("t.json", deep, strlen(deep), &err));
    assert_string_equal(err.msg, "t.json: x.list[2]: field 'k' appears twice (readers differ on which one counts)");
    /* a large object (sorted, not compared in pairs) */
    char big[4096] = "{";
    for (int i = 0; i < 100; i++) snprintf(big + strlen(big), sizeof big - strlen(big), "\"k%d\": %d, ", i, i);
    snprintf(big + strlen(big), sizeof big - strlen(big), "\"k57\": 0}");
    assert_null(json_parse("big.json", big, strlen(big), &err));
    assert_non_null(strstr(err.msg, "big.json: field 'k57' appears twice"));
    /* the same key in two objects, or as a value, is fine */
    const char *ok = "{\"a\": {\"k\": 1}, \"b\": {\"k\": 2}, \"c\": [\"a\", \"a\"]}";
    cJSON *root = json_parse("t.json", ok, strlen(ok), &err);
    assert_non_null(root);
    cJSON_Delete(root);
}

/* json_float_decimal: the shortest decimal that reads back as the float */
static void test_float_decimal(void **state) {
    (void)state;
    assert_true(json_float_decimal(1e-5f) == 1e-5);
    assert_true(json_float_decimal(1e-6f) == 1e-6);
    assert_true(json_float_decimal(0.1f) == 0.1);
    assert_true(json_float_decimal(3.0f) == 3.0);
    assert_true(json_float_decimal(-2.5e-8f) == -2.5e-8);
    float odd = 1.0f / 3.0f; /* needs all 9 digits */
    assert_true((float)json_float_decimal(odd) == odd);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "eps", json_float_decimal(1e-5f));
    char *text = cJSON_PrintUnformatted(o);
    assert_string_equal(text, "{\"eps\":1e-05}");
    free(text);
    cJSON_Delete(o);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_float_decimal),
        cmocka_unit_test(test_valid_loads),
        cmocka_unit_test(test_find),
        cmocka_unit_test(test_optional_fields),
        cmocka_unit_test(test_bwd_keep),
        cmocka_unit_test(test_empty_entries),
        cmocka_unit_test(test_example_file),
        cmocka_unit_test(test_missing_file),
        cmocka_unit_test(test_malformed_json),
        cmocka_unit_test(test_wrong_format),
        cmocka_unit_test(test_stale_version),
        cmocka_unit_test(test_missing_block),
        cmocka_unit_test(test_microbatch_not_increasing),
        cmocka_unit_test(test_length_mismatch),
        cmocka_unit_test(test_bad_numbers),
        cmocka_unit_test(test_bad_names),
        cmocka_unit_test(test_unknown_key),
        cmocka_unit_test(test_duplicate_entry), cmocka_unit_test(test_json_duplicate_keys),
        cmocka_unit_test(test_wrong_op),
        cmocka_unit_test(test_odd_inputs),
        cmocka_unit_test(test_deep_and_unterminated),
        cmocka_unit_test(test_json_getters),
        cmocka_unit_test(test_json_syntax_position),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
