/* gpu.h - the GPU catalog: compute capability, memory, dense peak TFLOP/s per precision and memory
 * bandwidth.
 *
 * Figures are the vendors' dense (no sparsity) peaks, each with its source in docs/cost-model.md;
 * they feed the analytic cost estimates, which a profile replaces. Names match case-insensitively
 * and ignore '-', '_', ' ' and '.', and each entry has aliases for the GPU Feature Discovery
 * product labels ("Tesla-T4", "NVIDIA-A10G"). */
#ifndef CEPHALO_GPU_H
#define CEPHALO_GPU_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "common/precision.h"

typedef struct gpu_spec {
    const char *name; /* canonical catalog name, e.g. "A100-80GB" */
    const char *aliases; /* comma-separated alternative names and GFD product labels */
    const char *arch; /* "Pascal", "Ampere", ... */
    int cc_major, cc_minor; /* CUDA compute capability (0.0 for the CPU entry) */
    double memory_gib; /* device memory */
    double fp32_tflops; /* plain FP32 (CUDA cores) */
    double tf32_tflops; /* TF32 tensor cores; 0: none */
    double fp16_tflops; /* fp16 tensor cores with fp32 accumulation; 0: no tensor cores */
    double bf16_tflops; /* bf16 tensor cores with fp32 accumulation; 0: no bf16 (before sm_80) */
    double mem_bw_gbs; /* DRAM bandwidth, GB/s */
} gpu_spec;

/* bf16 needs compute capability 8.0 (Ampere) or later. */
#define GPU_BF16_MIN_MAJOR 8

/* The emulated CPU device (`type: cpu`): per-thread figures, memory comes from the cluster file. */
#define GPU_CPU_NAME "cpu"
#define CPU_GFLOPS_PER_THREAD 40.0
#define CPU_BW_GBS_PER_THREAD 8.0

const gpu_spec *gpu_catalog(int *count);

/* Looks a name up (canonical or alias). On failure the error suggests the nearest known names:
 * "unknown GPU type 'A100-40' (did you mean 'A100-40GB', 'A10'?)". Returns NULL then. */
const gpu_spec *gpu_find(const char *name, err_t *err);

/* Whether a GPU of compute capability major.minor runs precision p: bf16 needs sm_80+, fp32 and
 * fp16 run everywhere (fp16 without tensor cores on Pascal, at the fp32 rate). */
bool gpu_cc_supports(int cc_major, precision p);

/* Peak TFLOP/s the planner uses for `precision`:
 *   fp32  TF32 tensor cores where present (as PyTorch's allow_tf32), else the CUDA cores;
 *   fp16  the fp16 tensor-core rate with fp32 accumulation; without tensor cores (Pascal) the fp32
 *         rate: cuBLAS runs fp16 inputs with fp32 accumulation at about the fp32 rate there;
 *   bf16  the bf16 tensor-core rate; a GPU without bf16 gets the fp32 figure (the planner refuses
 *         such plans before they are costed: cluster_check_precision). */
double gpu_peak_tflops(const gpu_spec *g, precision p);

#endif
