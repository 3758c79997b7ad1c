/* test_gpu.c - the GPU catalog: lookup by name and alias, suggestions, peak figures. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>

#include <stdio.h>
#include <string.h>

#include "common/strutil.h"
#include "planner/gpu.h"

static void expect_type(const char *name, const char *canonical) {
    err_t err = {{0}};
    const gpu_spec *g = gpu_find(name, &err);
    if (!g) fail_msg("'%s' not found: %s", name, err.msg);
    assert_string_equal(g->name, canonical);
}

/* The message of a failed lookup; the lookup must have failed. */
static const char *unknown_msg(const char *name, err_t *err) {
    memset(err, 0, sizeof *err);
    assert_null(gpu_find(name, err));
    return err->msg;
}

static void test_canonical_names(void **state) {
    (void)state;
    int n;
    const gpu_spec *cat = gpu_catalog(&n);
    assert_true(n >= 23);
    for (int i = 0; i < n; i++) expect_type(cat[i].name, cat[i].name);
    const char *required[] = {"P40",  "P100",  "P100-16GB", "V100-16GB", "V100-32GB", "T4",
                              "A10G", "A10",   "L4",        "A6000",     "A40",       "A30",
                              "A100-40GB", "A100-80GB", "H100", "H100-PCIE", "H200", "L40S",
                              "RTX-3090", "RTX-4090", "RTX-A5000", "RTX-6000-ADA", GPU_CPU_NAME};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
        expect_type(required[i], required[i]);
}

static void test_gfd_aliases(void **state) {
    (void)state;
    expect_type("Tesla-T4", "T4");
    expect_type("NVIDIA-A10G", "A10G");
    expect_type("NVIDIA-L4", "L4");
    expect_type("NVIDIA-RTX-A6000", "A6000");
    expect_type("Tesla-V100-SXM2-16GB", "V100-16GB");
    expect_type("Tesla-V100-PCIE-16GB", "V100-16GB");
    expect_type("NVIDIA-A100-SXM4-40GB", "A100-40GB");
    expect_type("NVIDIA-A100-PCIE-40GB", "A100-40GB");
    expect_type("NVIDIA-A100-SXM4-80GB", "A100-80GB");
    expect_type("NVIDIA-H100-80GB-HBM3", "H100");
    expect_type("Tesla-P40", "P40");
    expect_type("Tesla-P100-PCIE-12GB", "P100");
    expect_type("Tesla-P100-PCIE-16GB", "P100-16GB");
    expect_type("NVIDIA-GeForce-RTX-3090", "RTX-3090");
    expect_type("NVIDIA-GeForce-RTX-4090", "RTX-4090");
    expect_type("V100", "V100-16GB"); /* the paper's usage */
}

static void test_case_and_separators(void **state) {
    (void)state;
    expect_type("t4", "T4");
    expect_type("a100_80gb", "A100-80GB");
    expect_type("A100 40GB", "A100-40GB");
    expect_type("rtx.4090", "RTX-4090");
    expect_type("tesla t4", "T4");
    expect_type("CPU", GPU_CPU_NAME);
}

static void test_unknown_suggests(void **state) {
    (void)state;
    err_t err;
    const char *m = unknown_msg("A100-40", &err);
    assert_non_null(strstr(m, "unknown GPU type 'A100-40'"));
    assert_non_null(strstr(m, "did you mean 'A100-40GB'"));
    assert_non_null(strstr(m, "known types: "));
    assert_non_null(strstr(m, "RTX-6000-ADA"));

    m = unknown_msg("l5", &err);
    assert_non_null(strstr(m, "did you mean 'L4'"));

    /* A family name is ambiguous: both parts are offered. */
    m = unknown_msg("A100", &err);
    assert_non_null(strstr(m, "'A100-40GB'"));
    assert_non_null(strstr(m, "'A100-80GB'"));

    m = unknown_msg("NVIDIA-H100", &err);
    assert_non_null(strstr(m, "'H100'"));
    assert_non_null(strstr(m, "'H100-PCIE'"));

    /* A vendor prefix names no family: no list of arbitrary GPUs as "suggestions". */
    m = unknown_msg("NVIDIA", &err);
    assert_null(strstr(m, "did you mean"));
}

static void test_unknown_odd_inputs(void **state) {
    (void)state;
    err_t err;
    unknown_msg("", &err);
    unknown_msg("---", &err);
    unknown_msg(",", &err); /* alias separator is not a name */
    char big[600];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    unknown_msg(big, &err);
    /* A long name whose first characters spell a known one must not match it. */
    memcpy(big, "T4", 2);
    unknown_msg(big, &err);
    assert_null(gpu_find(NULL, &err));
    assert_null(gpu_find("nope", NULL)); /* no error sink: still no crash */
}

static void test_peak_tflops(void **state) {
    (void)state;
    const gpu_spec *p40 = gpu_find("P40", NULL);
    const gpu_spec *p100 = gpu_find("P100", NULL);
    const gpu_spec *a100 = gpu_find("A100-80GB", NULL);
    const gpu_spec *v100 = gpu_find("V100-16GB", NULL);
    const gpu_spec *t4 = gpu_find("T4", NULL);
    const gpu_spec *rtx3090 = gpu_find("RTX-3090", NULL);
    const gpu_spec *a10g = gpu_find("A10G", NULL);
    assert_non_null(p40), assert_non_null(p100), assert_non_null(a100), assert_non_null(v100);
    assert_non_null(t4), assert_non_null(rtx3090), assert_non_null(a10g);
    /* Pascal: no tensor cores; fp16 with fp32 accumulation runs at the fp32 rate */
    assert_float_equal(gpu_peak_tflops(p40, PREC_FP32), 11.8, 1e-9);
    assert_float_equal(gpu_peak_tflops(p40, PREC_FP16), 11.8, 1e-9);
    assert_float_equal(gpu_peak_tflops(p100, PREC_FP16), 9.3, 1e-9);
    /* Ampere: fp32 training runs on TF32 tensor cores, bf16 and fp16 on the 16-bit ones */
    assert_float_equal(gpu_peak_tflops(a100, PREC_FP32), 156.0, 1e-9);
    assert_float_equal(gpu_peak_tflops(a100, PREC_BF16), 312.0, 1e-9);
    assert_float_equal(gpu_peak_tflops(a100, PREC_FP16), 312.0, 1e-9);
    /* Volta and Turing: fp16 tensor cores at full rate with fp32 accumulation, no TF32, no bf16 */
    assert_float_equal(gpu_peak_tflops(v100, PREC_FP16), 112.0, 1e-9);
    assert_float_equal(gpu_peak_tflops(v100, PREC_FP32), 14.1, 1e-9);
    assert_float_equal(gpu_peak_tflops(t4, PREC_FP16), 65.0, 1e-9);
    assert_float_equal(gpu_peak_tflops(t4, PREC_FP32), 8.1, 1e-9);
    assert_float_equal(v100->bf16_tflops, 0, 0);
    /* GeForce (and the A10G): fp32-accumulated tensor math at 2x fp32, TF32 at 1x */
    assert_float_equal(gpu_peak_tflops(rtx3090, PREC_FP16), 71.0, 1e-9);
    assert_float_equal(gpu_peak_tflops(rtx3090, PREC_FP32), 35.6, 1e-9);
    assert_float_equal(gpu_peak_tflops(a10g, PREC_FP16), 70.0, 1e-9);
    assert_float_equal(gpu_peak_tflops(NULL, PREC_FP16), 0.0, 0);
}

/* Compute capabilities (CUDA's table) and what they allow. */
static void test_compute_capability(void **state) {
    (void)state;
    static const struct {
        const char *name;
        int major, minor;
    } want[] = {{"P40", 6, 1},  {"P100", 6, 0},  {"V100", 7, 0},      {"T4", 7, 5},    {"A10G", 8, 6},
                {"A10", 8, 6},  {"L4", 8, 9},    {"A6000", 8, 6},     {"A30", 8, 0},   {"A100-80GB", 8, 0},
                {"H100", 9, 0}, {"L40S", 8, 9},  {"RTX-3090", 8, 6},  {"RTX-4090", 8, 9}};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        const gpu_spec *g = gpu_find(want[i].name, NULL);
        assert_non_null(g);
        if (g->cc_major != want[i].major || g->cc_minor != want[i].minor)
            fail_msg("%s: compute capability %d.%d, expected %d.%d", want[i].name, g->cc_major, g->cc_minor,
                     want[i].major, want[i].minor);
    }
    assert_false(gpu_cc_supports(7, PREC_BF16));
    assert_false(gpu_cc_supports(6, PREC_BF16));
    assert_true(gpu_cc_supports(8, PREC_BF16));
    assert_true(gpu_cc_supports(6, PREC_FP16));
    assert_true(gpu_cc_supports(6, PREC_FP32));
}

static void test_catalog_sane(void **state) {
    (void)state;
    int n;
    const gpu_spec *cat = gpu_catalog(&n);
    for (int i = 0; i < n; i++) {
        const gpu_spec *g = &cat[i];
        assert_non_null(g->aliases);
        assert_non_null(g->arch);
        if (strcmp(g->name, GPU_CPU_NAME) == 0) continue;
        if (!(g->memory_gib > 0 && g->fp32_tflops > 0 && g->mem_bw_gbs > 0))
            fail_msg("%s: memory, fp32 and bandwidth must be positive", g->name);
        /* the columns follow the architecture: tensor cores from 7.0, TF32 and bf16 from 8.0 */
        if ((g->fp16_tflops > 0) != (g->cc_major >= 7)) fail_msg("%s: fp16 tensor figure vs cc %d.%d", g->name, g->cc_major, g->cc_minor);
        if ((g->bf16_tflops > 0) != (g->cc_major >= 8)) fail_msg("%s: bf16 figure vs cc %d.%d", g->name, g->cc_major, g->cc_minor);
        if ((g->tf32_tflops > 0) != (g->cc_major >= 8)) fail_msg("%s: tf32 figure vs cc %d.%d", g->name, g->cc_major, g->cc_minor);
        /* fp32-accumulated fp16 and bf16 run at one rate, TF32 at half of it, and never below the
         * CUDA cores' fp32 (GeForce-class parts: exactly 2x and 1x) */
        if (g->cc_major >= 8) {
            assert_float_equal(g->fp16_tflops, g->bf16_tflops, 1e-9);
            assert_true(fabs(g->tf32_tflops * 2 - g->bf16_tflops) <= 0.02 * g->bf16_tflops); /* L40S: 183 vs 362 */
            assert_true(g->bf16_tflops >= 2 * g->fp32_tflops * 0.99);
        } else if (g->cc_major == 7) {
            assert_true(g->fp16_tflops >= 7 * g->fp32_tflops);
        }
        const char *arch = g->cc_major == 6 ? "Pascal" : g->cc_major == 9 ? "Hopper"
                         : g->cc_major == 7 ? (g->cc_minor == 5 ? "Turing" : "Volta")
                         : g->cc_minor == 9 ? "Ada" : "Ampere";
        if (strcmp(g->arch, arch)) fail_msg("%s: arch %s, but cc %d.%d is %s", g->name, g->arch, g->cc_major, g->cc_minor, arch);
        assert_true(strlen(g->name) < 32); /* fits cluster_device.type */
    }
}

/* Each alias is one entry's: a name that resolved to two entries would make lookups order-bound. */
static void test_aliases_unique(void **state) {
    (void)state;
    int n;
    const gpu_spec *cat = gpu_catalog(&n);
    for (int i = 0; i < n; i++) {
        char list[512];
        snprintf(list, sizeof list, "%s,%s", cat[i].name, cat[i].aliases);
        for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
            const gpu_spec *g = gpu_find(tok, NULL);
            if (g != &cat[i]) fail_msg("'%s' of %s resolves to %s", tok, cat[i].name,
                                       g ? g->name : "nothing");
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_canonical_names),   cmocka_unit_test(test_gfd_aliases),
        cmocka_unit_test(test_case_and_separators), cmocka_unit_test(test_unknown_suggests),
        cmocka_unit_test(test_unknown_odd_inputs), cmocka_unit_test(test_peak_tflops),
        cmocka_unit_test(test_catalog_sane),       cmocka_unit_test(test_aliases_unique),
        cmocka_unit_test(test_compute_capability),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
