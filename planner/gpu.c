/* gpu.c - the GPU catalog and name lookup.
 *
 * The figures are vendor datasheet and whitepaper peaks without structured sparsity; the table in
 * docs/cost-model.md gives the source of each. They only seed the analytic cost estimates used
 * when no profile exists, so a few percent off does not change a plan's shape; where the Cephalo
 * paper quotes a figure (P40, P100, V100) we use the paper's so that our estimates reproduce its
 * tables. */
#include "planner/gpu.h"

#include <stdio.h>
#include <string.h>

#include "common/strutil.h"

/* Tensor columns are dense rates with fp32 accumulation, which mixed-precision training uses.
 * Professional parts run fp16 and bf16 with fp32 accumulation at the full tensor rate; GeForce
 * parts (and AWS's A10G, a GA102 built like them) at half of it, so theirs is 2x fp32. Pascal has
 * no tensor cores: its fp16 columns are 0 (gpu_peak_tflops uses the fp32 rate). */
static const gpu_spec catalog[] = {
    /* name           aliases
     *                arch       cc      GiB   fp32   tf32   fp16   bf16   GB/s */
    {"P40", "Tesla-P40",
     "Pascal", 6, 1, 24, 11.8, 0, 0, 0, 346},
    {"P100", "P100-12GB,P100-PCIE-12GB,Tesla-P100-PCIE-12GB",
     "Pascal", 6, 0, 12, 9.3, 0, 0, 0, 549},
    {"P100-16GB", "P100-PCIE-16GB,Tesla-P100-PCIE-16GB,Tesla-P100-SXM2-16GB",
     "Pascal", 6, 0, 16, 9.3, 0, 0, 0, 732},
    /* "V100" alone means the 16 GB part, as in the paper's Cluster B. */
    {"V100-16GB", "V100,V100-PCIE-16GB,V100-SXM2-16GB,Tesla-V100-PCIE-16GB,Tesla-V100-SXM2-16GB",
     "Volta", 7, 0, 16, 14.1, 0, 112, 0, 900},
    {"V100-32GB",
     "V100-PCIE-32GB,V100-SXM2-32GB,V100S,Tesla-V100-PCIE-32GB,Tesla-V100-SXM2-32GB,"
     "Tesla-V100S-PCIE-32GB",
     "Volta", 7, 0, 32, 14.1, 0, 112, 0, 900},
    {"T4", "Tesla-T4,NVIDIA-T4",
     "Turing", 7, 5, 15, 8.1, 0, 65, 0, 320},
    /* AWS's A10G: the A10's memory, 80 SMs at GeForce-like tensor rates (no NVIDIA datasheet). */
    {"A10G", "NVIDIA-A10G",
     "Ampere", 8, 6, 24, 35, 35, 70, 70, 600},
    {"A10", "NVIDIA-A10",
     "Ampere", 8, 6, 24, 31.2, 62.5, 125, 125, 600},
    {"L4", "NVIDIA-L4",
     "Ada", 8, 9, 24, 30.3, 60, 121, 121, 300},
    {"A6000", "RTX-A6000,NVIDIA-RTX-A6000",
     "Ampere", 8, 6, 48, 38.7, 77.4, 154.8, 154.8, 768},
    {"A40", "NVIDIA-A40",
     "Ampere", 8, 6, 48, 37.4, 74.8, 149.7, 149.7, 696},
    {"A30", "NVIDIA-A30",
     "Ampere", 8, 0, 24, 10.3, 82, 165, 165, 933},
    {"A100-40GB", "A100-SXM4-40GB,A100-PCIE-40GB,NVIDIA-A100-SXM4-40GB,NVIDIA-A100-PCIE-40GB",
     "Ampere", 8, 0, 40, 19.5, 156, 312, 312, 1555},
    {"A100-80GB",
     "A100-SXM4-80GB,A100-PCIE-80GB,NVIDIA-A100-SXM4-80GB,NVIDIA-A100-80GB-PCIe",
     "Ampere", 8, 0, 80, 19.5, 156, 312, 312, 2039},
    {"H100", "H100-SXM,H100-SXM5-80GB,NVIDIA-H100-80GB-HBM3,NVIDIA-H100-SXM5-80GB",
     "Hopper", 9, 0, 80, 67, 494.7, 989.4, 989.4, 3350},
    {"H100-PCIE", "NVIDIA-H100-PCIe",
     "Hopper", 9, 0, 80, 51, 378, 756, 756, 2000},
    {"H200", "H200-SXM,NVIDIA-H200,NVIDIA-H200-141GB-HBM3e",
     "Hopper", 9, 0, 141, 67, 494.7, 989.4, 989.4, 4800},
    {"L40S", "NVIDIA-L40S",
     "Ada", 8, 9, 48, 91.6, 183, 362, 362, 864},
    /* GeForce parts: fp16/bf16 with fp32 accumulation at half the professional rate. */
    {"RTX-3090", "3090,GeForce-RTX-3090,NVIDIA-GeForce-RTX-3090",
     "Ampere", 8, 6, 24, 35.6, 35.6, 71, 71, 936},
    {"RTX-4090", "4090,GeForce-RTX-4090,NVIDIA-GeForce-RTX-4090",
     "Ada", 8, 9, 24, 82.6, 82.6, 165.2, 165.2, 1008},
    {"RTX-A5000", "A5000,NVIDIA-RTX-A5000",
     "Ampere", 8, 6, 24, 27.8, 55.6, 111.1, 111.1, 768},
    {"RTX-6000-ADA", "RTX-6000-Ada-Generation,NVIDIA-RTX-6000-Ada-Generation",
     "Ada", 8, 9, 48, 91.1, 182.1, 364.2, 364.2, 960},
    /* Emulated CPU device: speed scales with its threads (CPU_GFLOPS_PER_THREAD) and its memory
     * comes from the cluster file, so the catalog figures stay 0. */
    {GPU_CPU_NAME, "",
     "CPU", 0, 0, 0, 0, 0, 0, 0, 0},
};

#define CATALOG_LEN ((int)(sizeof catalog / sizeof catalog[0]))

/* Normalized names are short; anything longer than this cannot match an entry. */
#define NAME_MAX_NORM 64

const gpu_spec *gpu_catalog(int *count) {
    if (count) *count = CATALOG_LEN;
    return catalog;
}

/* Calls fn on the normalized canonical name and each normalized alias until it returns true. */
static bool each_name(const gpu_spec *g, bool (*fn)(const char *norm, const void *arg),
                      const void *arg) {
    char norm[NAME_MAX_NORM];
    str_normalize(g->name, norm, sizeof norm);
    if (fn(norm, arg)) return true;
    const char *p = g->aliases;
    while (*p) {
        size_t len = strcspn(p, ",");
        char alias[NAME_MAX_NORM];
        if (len < sizeof alias) {
            memcpy(alias, p, len);
            alias[len] = '\0';
            str_normalize(alias, norm, sizeof norm);
            if (norm[0] && fn(norm, arg)) return true;
        }
        p += len;
        if (*p == ',') p++;
    }
    return false;
}

static bool name_equals(const char *norm, const void *key) {
    return strcmp(norm, key) == 0;
}

/* "a100" is a prefix of "a10040gb": the user named a family, not a part. */
static bool name_extends(const char *norm, const void *key) {
    const char *k = key;
    return strlen(norm) > strlen(k) && strncmp(norm, k, strlen(k)) == 0;
}

/* Suggestions for an unknown name: the parts of a family when the name is a prefix of a few
 * ("A100" -> both A100s, which edit distance would rank below "A10"), else the nearest names.
 * A prefix of many entries ("NVIDIA") names no family, so it gets the nearest names too. */
#define FAMILY_MAX 4

static void suggest(const char *name, const char *norm, char *out, size_t outsz) {
    const char *names[CATALOG_LEN];
    int found = 0;
    for (int i = 0; i < CATALOG_LEN && strlen(norm) >= 2; i++)
        if (each_name(&catalog[i], name_extends, norm)) names[found++] = catalog[i].name;
    out[0] = '\0';
    if (found > 0 && found <= FAMILY_MAX) {
        for (int i = 0; i < found; i++) {
            size_t len = strlen(out);
            snprintf(out + len, outsz - len, "%s'%s'", i ? ", " : "", names[i]);
        }
        return;
    }
    for (int i = 0; i < CATALOG_LEN; i++) names[i] = catalog[i].name;
    str_suggest(name, names, CATALOG_LEN, 3, out, outsz);
}

static void known_names(char *out, size_t outsz) {
    out[0] = '\0';
    for (int i = 0; i < CATALOG_LEN; i++) {
        size_t len = strlen(out);
        snprintf(out + len, outsz - len, "%s%s", i ? ", " : "", catalog[i].name);
    }
}

const gpu_spec *gpu_find(const char *name, err_t *err) {
    if (!name) name = "";
    char norm[NAME_MAX_NORM + 2];
    str_normalize(name, norm, sizeof norm);
    /* A truncated normalization could falsely equal a short entry; such names are unknown. */
    bool too_long = strlen(norm) > NAME_MAX_NORM;
    for (int i = 0; i < CATALOG_LEN && !too_long && norm[0]; i++)
        if (each_name(&catalog[i], name_equals, norm)) return &catalog[i];

    char sugg[256], known[512];
    suggest(name, norm, sugg, sizeof sugg);
    known_names(known, sizeof known);
    err_set(err, "unknown GPU type '%.100s'%s%s%s; known types: %s", name,
            sugg[0] ? " (did you mean " : "", sugg, sugg[0] ? "?)" : "", known);
    return NULL;
}

bool gpu_cc_supports(int cc_major, precision p) {
    return p != PREC_BF16 || cc_major >= GPU_BF16_MIN_MAJOR;
}

double gpu_peak_tflops(const gpu_spec *g, precision p) {
    if (!g) return 0;
    /* fp32 training may use TF32 tensor cores (as PyTorch does with allow_tf32). */
    double fp32 = g->fp32_tflops > g->tf32_tflops ? g->fp32_tflops : g->tf32_tflops;
    if (p == PREC_BF16 && g->bf16_tflops > 0) return g->bf16_tflops;
    /* without tensor cores fp16 with fp32 accumulation runs on the CUDA cores at the fp32 rate */
    if (p == PREC_FP16 && g->fp16_tflops > 0) return g->fp16_tflops;
    return fp32;
}
