/* test_cluster.c - the cluster file: the examples, overrides, CPU devices, and every kind of bad
 * input giving an error that names the line and the field. Runs from the repository root. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "planner/cluster.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

static int load(const char *yaml, cluster *c, err_t *err) {
    memset(err, 0, sizeof *err);
    return cluster_load_string("test.yaml", yaml, strlen(yaml), c, err);
}

/* Loading must fail with a message containing each of the given pieces (NULL-terminated). */
static void expect_error(const char *yaml, ...) {
    cluster c;
    err_t err;
    if (load(yaml, &c, &err) == 0) fail_msg("accepted:\n%s", yaml);
    assert_int_equal(c.n_devices, 0);
    assert_null(c.devices);
    va_list ap;
    va_start(ap, yaml);
    for (const char *want = va_arg(ap, const char *); want; want = va_arg(ap, const char *))
        if (!strstr(err.msg, want)) fail_msg("message lacks '%s': %s", want, err.msg);
    va_end(ap);
}

static void test_cluster_a(void **state) {
    (void)state;
    cluster c;
    err_t err = {{0}};
    if (cluster_load_file("examples/clusters/cluster-a.yaml", &c, &err) < 0) fail_msg("%s", err.msg);
    assert_int_equal(c.n_nodes, 2);
    assert_string_equal(c.nodes[0].name, "node-a");
    assert_string_equal(c.nodes[1].name, "node-b");
    assert_float_equal(c.nodes[0].network_gbps, 50, 0);
    assert_float_equal(c.nodes[1].intra_gbps, CLUSTER_DEFAULT_INTRA_GBPS, 0);
    assert_int_equal(c.n_devices, 8);
    const char *types[] = {"L4", "L4", "A6000", "P40", "P40", "P40", "P100", "P100"};
    const int nodes[] = {0, 0, 0, 0, 1, 1, 1, 1};
    const double gib[] = {24, 24, 48, 24, 24, 24, 12, 12};
    for (int i = 0; i < 8; i++) {
        assert_string_equal(c.devices[i].type, types[i]);
        assert_string_equal(c.devices[i].spec->name, types[i]);
        assert_int_equal(c.devices[i].node, nodes[i]);
        assert_float_equal(c.devices[i].memory_bytes, gib[i] * GIB, 1);
        assert_float_equal(c.devices[i].tflops_override, 0, 0);
        assert_int_equal(c.devices[i].threads, 0);
    }
    cluster_free(&c);
    assert_int_equal(c.n_devices, 0);
    assert_null(c.nodes);
}

static void test_cluster_b(void **state) {
    (void)state;
    cluster c;
    err_t err = {{0}};
    if (cluster_load_file("examples/clusters/cluster-b.yaml", &c, &err) < 0) fail_msg("%s", err.msg);
    assert_int_equal(c.n_nodes, 8);
    assert_int_equal(c.n_devices, 64);
    assert_string_equal(c.devices[0].type, "A10G");
    assert_string_equal(c.devices[16].type, "V100-16GB");
    assert_string_equal(c.devices[63].type, "T4");
    assert_int_equal(c.devices[63].node, 7);
    assert_float_equal(c.nodes[7].network_gbps, 100, 0);
    cluster_free(&c);
}

static void test_local_cpu(void **state) {
    (void)state;
    cluster c;
    err_t err = {{0}};
    if (cluster_load_file("examples/clusters/local-cpu.yaml", &c, &err) < 0) fail_msg("%s", err.msg);
    assert_int_equal(c.n_nodes, 1);
    assert_float_equal(c.nodes[0].network_gbps, CLUSTER_DEFAULT_NETWORK_GBPS, 0);
    assert_int_equal(c.n_devices, 3);
    assert_string_equal(c.devices[0].spec->name, GPU_CPU_NAME);
    assert_int_equal(c.devices[0].threads, 2);
    assert_float_equal(c.devices[0].memory_bytes, 4 * GIB, 1);
    assert_int_equal(c.devices[1].threads, 1);
    assert_float_equal(c.devices[2].memory_bytes, 1.5 * GIB, 1);
    /* Different CPU shapes must not group together; identical ones must. */
    assert_string_not_equal(c.devices[0].type, c.devices[1].type);
    assert_string_equal(c.devices[1].type, c.devices[2].type);
    assert_string_equal(c.devices[0].type, "cpu-2t-4.00g");
    cluster_free(&c);
}

static void test_overrides(void **state) {
    (void)state;
    cluster c;
    err_t err;
    const char *yaml = "nodes:\n"
                       "  - name: n0\n"
                       "    network_gbps: 10.5\n"
                       "    intra_gbps: 400\n"
                       "    gpus:\n"
                       "      - {type: a6000, memory_gib: 46, tflops: 50}\n"
                       "      - {type: Tesla-T4, count: 3}\n";
    if (load(yaml, &c, &err) < 0) fail_msg("%s", err.msg);
    assert_float_equal(c.nodes[0].network_gbps, 10.5, 0);
    assert_float_equal(c.nodes[0].intra_gbps, 400, 0);
    assert_int_equal(c.n_devices, 4);
    assert_string_equal(c.devices[0].type, "A6000");
    assert_float_equal(c.devices[0].memory_bytes, 46 * GIB, 1);
    assert_float_equal(c.devices[0].tflops_override, 50, 0);
    assert_string_equal(c.devices[3].type, "T4");
    assert_float_equal(c.devices[3].memory_bytes, 15 * GIB, 1);
    cluster_free(&c);
}

static void test_cpu_needs_memory(void **state) {
    (void)state;
    expect_error("nodes:\n"
                 "  - name: local\n"
                 "    gpus:\n"
                 "      - {type: cpu, threads: 2}\n",
                 "test.yaml:4:", "nodes[0].gpus[0]", "memory_gib", NULL);
    expect_error("nodes:\n"
                 "  - name: local\n"
                 "    gpus:\n"
                 "      - {type: cpu, threads: 0, memory_gib: 1}\n",
                 "test.yaml:4:", "nodes[0].gpus[0].threads", "out of range", NULL);
}

static void test_bad_yaml(void **state) {
    (void)state;
    expect_error("nodes:\n  - name: [x\n", "test.yaml:", "YAML", NULL);
    expect_error("", "test.yaml", "empty", NULL);
    expect_error("42\n", "test.yaml:1:", "expected a mapping", NULL);
    expect_error("- a\n- b\n", "test.yaml:1:", "expected a mapping", NULL);
    expect_error("nodes: *x\n", "test.yaml:1:", NULL);
}

static void test_unknown_field(void **state) {
    (void)state;
    expect_error("nodes:\n"
                 "  - name: n0\n"
                 "    network_gpbs: 50\n"
                 "    gpus: [{type: T4}]\n",
                 "test.yaml:3:", "nodes[0]", "unknown field 'network_gpbs'",
                 "did you mean 'network_gbps'", NULL);
    expect_error("nodes:\n"
                 "  - name: n0\n"
                 "    gpus:\n"
                 "      - {type: T4, cuont: 2}\n",
                 "test.yaml:4:", "nodes[0].gpus[0]", "'cuont'", "'count'", NULL);
    expect_error("nodes: [{name: n0, gpus: [{type: T4}]}]\nnode: 1\n", "test.yaml:2:", "'node'",
                 "'nodes'", NULL);
}

static void test_missing_nodes(void **state) {
    (void)state;
    expect_error("{}\n", "test.yaml:1:", "missing field 'nodes'", NULL);
    expect_error("nodes: []\n", "test.yaml:1:", "nodes", "at least one node", NULL);
    expect_error("nodes:\n", "test.yaml:1:", "nodes", "expected a list", NULL);
    expect_error("nodes:\n  - just-a-name\n", "test.yaml:2:", "nodes[0]", "expected a mapping",
                 NULL);
    expect_error("nodes:\n  - gpus: [{type: T4}]\n", "test.yaml:2:", "nodes[0]",
                 "missing field 'name'", NULL);
}

static void test_empty_gpus(void **state) {
    (void)state;
    expect_error("nodes:\n"
                 "  - name: n0\n"
                 "    gpus: []\n",
                 "test.yaml:3:", "nodes[0].gpus", "at least one", NULL);
    expect_error("nodes:\n"
                 "  - name: n0\n",
                 "test.yaml:2:", "nodes[0]", "missing field 'gpus'", NULL);
    expect_error("nodes:\n"
                 "  - name: n0\n"
                 "    gpus: {type: T4}\n",
                 "test.yaml:3:", "nodes[0].gpus", "expected a list", NULL);
}

static void test_bad_count(void **state) {
    (void)state;
    expect_error("nodes:\n"
                 "  - name: n0\n"
                 "    gpus:\n"
                 "      - {type: T4}\n"
                 "      - {type: L4, count: 0}\n",
                 "test.yaml:5:", "nodes[0].gpus[1].count", "out of range", NULL);
    expect_error("nodes:\n"
                 "  - name: n0\n"
                 "    gpus:\n"
                 "      - type: T4\n"
                 "        count: two\n",
                 "test.yaml:5:", "nodes[0].gpus[0].count", "expected an integer", NULL);
    expect_error("nodes:\n"
                 "  - name: n0\n"
                 "    gpus: [{type: T4, count: 99999999999999999999999}]\n",
                 "test.yaml:3:", "nodes[0].gpus[0].count", NULL);
    expect_error("nodes:\n"
                 "  - name: n0\n"
                 "    gpus: [{type: T4, count: 2.5}]\n",
                 "test.yaml:3:", "nodes[0].gpus[0].count", NULL);
}

static void test_bad_bandwidth(void **state) {
    (void)state;
    expect_error("nodes:\n"
                 "  - name: n0\n"
                 "    network_gbps: -5\n"
                 "    gpus: [{type: T4}]\n",
                 "test.yaml:3:", "nodes[0].network_gbps", NULL);
    expect_error("nodes:\n"
                 "  - name: n0\n"
                 "    network_gbps: 0\n"
                 "    gpus: [{type: T4}]\n",
                 "test.yaml:3:", "nodes[0].network_gbps", "expected more than 0", NULL);
    expect_error("nodes:\n"
                 "  - name: n0\n"
                 "    intra_gbps: nan\n"
                 "    gpus: [{type: T4}]\n",
                 "test.yaml:3:", "nodes[0].intra_gbps", NULL);
    expect_error("nodes:\n"
                 "  - name: n0\n"
                 "    gpus: [{type: T4, memory_gib: 0}]\n",
                 "test.yaml:3:", "nodes[0].gpus[0].memory_gib", NULL);
}

static void test_duplicate_names(void **state) {
    (void)state;
    expect_error("nodes:\n"
                 "  - name: n0\n"
                 "    gpus: [{type: T4}]\n"
                 "  - name: n0\n"
                 "    gpus: [{type: L4}]\n",
                 "test.yaml:4:", "nodes[1].name", "duplicate node name 'n0'", NULL);
    char yaml[256];
    snprintf(yaml, sizeof yaml, "nodes:\n  - name: %0100d\n    gpus: [{type: T4}]\n", 7);
    expect_error(yaml, "test.yaml:2:", "nodes[0].name", "longer than 63", NULL);
}

static void test_threads_on_gpu(void **state) {
    (void)state;
    expect_error("nodes:\n"
                 "  - name: n0\n"
                 "    gpus:\n"
                 "      - type: T4\n"
                 "        threads: 4\n",
                 "test.yaml:5:", "nodes[0].gpus[0].threads", "only type cpu", NULL);
}

static void test_unknown_type(void **state) {
    (void)state;
    expect_error("nodes:\n"
                 "  - name: node-a\n"
                 "    gpus:\n"
                 "      - {type: L4}\n"
                 "      - {type: L5}\n",
                 "test.yaml:5: nodes[0].gpus[1].type: unknown GPU type 'L5' (did you mean 'L4'",
                 NULL);
    expect_error("nodes:\n"
                 "  - name: node-a\n"
                 "    gpus: [{count: 2}]\n",
                 "test.yaml:3:", "nodes[0].gpus[0]", "missing field 'type'", NULL);
    expect_error("nodes:\n"
                 "  - name: node-a\n"
                 "    gpus: [{type: [T4]}]\n",
                 "test.yaml:3:", "nodes[0].gpus[0].type", "expected a scalar", NULL);
}

static void test_too_many_devices(void **state) {
    (void)state;
    /* 17 items of 4096 exceed CLUSTER_MAX_DEVICES (65536) by one item. */
    char yaml[2048] = "nodes:\n  - name: big\n    gpus:\n";
    for (int i = 0; i < 17; i++) strcat(yaml, "      - {type: T4, count: 4096}\n");
    expect_error(yaml, "test.yaml:20:", "nodes[0].gpus[16].count", "65536", NULL);
}

/* Issue 15: libyaml passes "\0" and "\u0000" through with an explicit length; read as C strings
 * they silently cut the value short ("a\0b" became node "a"). Every value is refused, naming
 * the line and the field; a key, the line. */
static void test_nul_refused(void **state) {
    (void)state;
    expect_error("nodes:\n"
                 "  - name: \"a\\0b\"\n"
                 "    gpus: [{type: T4}]\n",
                 "test.yaml:2:", "nodes[0].name", "NUL", NULL);
    expect_error("nodes:\n"
                 "  - name: a\n"
                 "    gpus: [{type: \"T4\\u0000x\"}]\n",
                 "test.yaml:3:", "nodes[0].gpus[0].type", "NUL", NULL);
    expect_error("nodes:\n"
                 "  - name: a\n"
                 "    gpus: [{type: T4, count: \"2\\0\"}]\n",
                 "test.yaml:3:", "nodes[0].gpus[0].count", "NUL", NULL);
    expect_error("nodes:\n"
                 "  - name: a\n"
                 "    \"gpus\\0x\": [{type: T4}]\n",
                 "test.yaml:3:", "key", "NUL", NULL);
}

/* A name of multi-byte characters is limited by its bytes, and the message says so. */
static void test_name_bytes(void **state) {
    (void)state;
    char yaml[512] = "nodes:\n  - name: \"";
    for (int i = 0; i < 22; i++) strcat(yaml, "\xe6\x97\xa5"); /* 22 characters, 66 bytes */
    strcat(yaml, "\"\n    gpus: [{type: T4}]\n");
    expect_error(yaml, "test.yaml:2:", "nodes[0].name", "66 bytes", "longer than 63", NULL);
}

static void test_build_in_code(void **state) {
    (void)state;
    cluster c;
    err_t err = {{0}};
    cluster_init(&c);
    assert_int_equal(cluster_add_devices(&c, "T4", 1, &err), -1); /* no node yet */
    assert_int_equal(cluster_add_node(&c, "n0", 100), 0);
    assert_int_equal(cluster_add_node(&c, "n0", 100), -1);
    assert_int_equal(cluster_add_node(&c, "n1", 0), -1);
    assert_int_equal(cluster_add_devices(&c, "V100", 8, &err), 0);
    assert_int_equal(cluster_add_node(&c, "n1", 25), 0);
    assert_int_equal(cluster_add_devices(&c, "NVIDIA-A10G", 4, &err), 0);
    assert_int_equal(cluster_add_devices(&c, "Z9", 1, &err), -1);
    assert_non_null(strstr(err.msg, "unknown GPU type 'Z9'"));
    assert_int_equal(cluster_add_devices(&c, "cpu", 1, &err), -1);
    assert_int_equal(cluster_add_devices(&c, "T4", 0, &err), -1);
    assert_int_equal(c.n_nodes, 2);
    assert_int_equal(c.n_devices, 12);
    assert_string_equal(c.devices[7].type, "V100-16GB");
    assert_int_equal(c.devices[7].node, 0);
    assert_string_equal(c.devices[8].type, "A10G");
    assert_int_equal(c.devices[11].node, 1);
    assert_float_equal(c.devices[11].memory_bytes, 24 * GIB, 1);
    assert_float_equal(c.nodes[1].intra_gbps, CLUSTER_DEFAULT_INTRA_GBPS, 0);
    /* Grow past the initial capacities. */
    for (int i = 0; i < 40; i++) {
        char name[16];
        snprintf(name, sizeof name, "x%d", i);
        assert_int_equal(cluster_add_node(&c, name, 10), 0);
        assert_int_equal(cluster_add_devices(&c, "L4", 3, &err), 0);
    }
    assert_int_equal(c.n_devices, 12 + 120);
    assert_int_equal(c.devices[12 + 119].node, 41);
    assert_int_equal(cluster_add_devices(&c, "L4", CLUSTER_MAX_DEVICES, &err), -1);
    cluster_free(&c);
    assert_int_equal(c.n_nodes, 0);
}

static void test_missing_file(void **state) {
    (void)state;
    cluster c;
    err_t err = {{0}};
    assert_int_equal(cluster_load_file("examples/clusters/no-such.yaml", &c, &err), -1);
    assert_non_null(strstr(err.msg, "no-such.yaml"));
    assert_int_equal(c.n_devices, 0);
}

/* Every device carries its compute capability (the catalog's), which the precision check reads;
 * the message names each lacking type once, with its capability, and what to use instead. */
static void test_compute_capability_and_precision(void **state) {
    (void)state;
    cluster c;
    err_t err;
    assert_int_equal(load("nodes:\n  - name: a\n    gpus: [{type: T4, count: 2}, {type: A10G}, {type: cpu, threads: 1, memory_gib: 1}]\n"
                          "  - name: b\n    gpus: [{type: Tesla-T4}, {type: P40}]\n", &c, &err), 0);
    assert_int_equal(c.devices[0].cc_major, 7);
    assert_int_equal(c.devices[0].cc_minor, 5);
    assert_int_equal(c.devices[2].cc_major, 8);
    assert_int_equal(c.devices[2].cc_minor, 6);
    assert_int_equal(cluster_check_precision(&c, PREC_FP16, "--precision", &err), 0);
    assert_int_equal(cluster_check_precision(&c, PREC_FP32, "--precision", &err), 0);
    assert_int_equal(cluster_check_precision(&c, PREC_BF16, "--precision", &err), -1);
    assert_string_equal(err.msg, "--precision bf16: T4 (compute capability 7.5) and P40 (compute capability 6.1) have no bf16 "
                                 "(it needs compute capability 8.0 or later); use --precision fp16 (2-byte parameter gathers; "
                                 "Pascal has no tensor cores and runs it at its fp32 rate) or fp32");
    cluster_free(&c);
    cluster_init(&c);
    assert_int_equal(cluster_add_node(&c, "n", 10), 0);
    assert_int_equal(cluster_add_devices(&c, "V100", 1, &err), 0);
    assert_int_equal(c.devices[0].cc_major, 7);
    assert_int_equal(cluster_check_precision(&c, PREC_BF16, "spec.precision", &err), -1);
    assert_string_equal(err.msg, "spec.precision bf16: V100-16GB (compute capability 7.0) has no bf16 (it needs compute "
                                 "capability 8.0 or later); use spec.precision fp16 (tensor cores) or fp32");
    cluster_free(&c);
}

/* The inventory's builders: nodes in ascending name order (a repeat or a step back refused without
 * a search), devices from a catalog entry, and a copy of the first devices (the maxGPUs cap). */
static void test_sorted_nodes_and_copy(void **state) {
    (void)state;
    cluster c, d;
    err_t err = {{0}};
    cluster_init(&c);
    const gpu_spec *l4 = gpu_find("L4", &err), *a100 = gpu_find("A100-80GB", &err);
    assert_non_null(l4);
    assert_non_null(a100);
    assert_int_equal(cluster_add_gpus(&c, l4, 1, &err), -1); /* no node yet */
    assert_int_equal(cluster_add_sorted_node(&c, "n-b", 25), 0);
    assert_int_equal(cluster_add_sorted_node(&c, "n-b", 25), -1); /* a repeat */
    assert_int_equal(cluster_add_sorted_node(&c, "n-a", 25), -1); /* out of order */
    assert_int_equal(cluster_add_gpus(&c, l4, 2, &err), 0);
    assert_int_equal(cluster_add_sorted_node(&c, "n-c", 50), 0);
    assert_int_equal(cluster_add_gpus(&c, a100, 3, &err), 0);
    assert_int_equal(cluster_add_gpus(&c, a100, 0, &err), -1);
    assert_int_equal(c.n_nodes, 2);
    assert_int_equal(c.n_devices, 5);
    assert_string_equal(c.devices[1].type, "L4");
    assert_int_equal(c.devices[4].node, 1);
    /* the first 3 devices: both of n-b's and one of n-c's, with the nodes' settings */
    assert_int_equal(cluster_copy(&c, 3, &d), 0);
    assert_int_equal(d.n_nodes, 2);
    assert_int_equal(d.n_devices, 3);
    assert_string_equal(d.nodes[1].name, "n-c");
    assert_float_equal(d.nodes[1].network_gbps, 50, 0);
    assert_int_equal(d.devices[2].node, 1);
    assert_string_equal(d.devices[2].type, c.devices[2].type);
    assert_float_equal(d.devices[2].memory_bytes, c.devices[2].memory_bytes, 0);
    cluster_free(&d);
    /* 2 devices: n-c is left out; 0 (no cap) or more than there are: all */
    assert_int_equal(cluster_copy(&c, 2, &d), 0);
    assert_int_equal(d.n_nodes, 1);
    cluster_free(&d);
    assert_int_equal(cluster_copy(&c, 0, &d), 0);
    assert_int_equal(d.n_devices, 5);
    cluster_free(&d);
    assert_int_equal(cluster_copy(&c, 99, &d), 0);
    assert_int_equal(d.n_devices, 5);
    assert_int_equal(d.n_nodes, 2);
    cluster_free(&d);
    cluster_free(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cluster_a),       cmocka_unit_test(test_cluster_b),
        cmocka_unit_test(test_local_cpu),       cmocka_unit_test(test_overrides),
        cmocka_unit_test(test_cpu_needs_memory), cmocka_unit_test(test_bad_yaml),
        cmocka_unit_test(test_unknown_field),   cmocka_unit_test(test_missing_nodes),
        cmocka_unit_test(test_empty_gpus),      cmocka_unit_test(test_bad_count),
        cmocka_unit_test(test_bad_bandwidth),   cmocka_unit_test(test_duplicate_names),
        cmocka_unit_test(test_threads_on_gpu),  cmocka_unit_test(test_unknown_type),
        cmocka_unit_test(test_too_many_devices), cmocka_unit_test(test_build_in_code),
        cmocka_unit_test(test_missing_file),    cmocka_unit_test(test_nul_refused),
        cmocka_unit_test(test_name_bytes),
        cmocka_unit_test(test_sorted_nodes_and_copy),
        cmocka_unit_test(test_compute_capability_and_precision),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
