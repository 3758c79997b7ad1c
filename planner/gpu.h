/* gpu.h - the GPU catalog: memory, peak dense TFLOP/s per precision and memory bandwidth.
 *
 * Figures are the vendors' dense (no sparsity) peaks; they feed the analytic cost estimates, which
 * a profile replaces. Names match case-insensitively and ignore '-', '_', ' ' and '.', and each
 * entry has aliases for the GPU Feature Discovery product labels ("Tesla-T4", "NVIDIA-A10G"). */
#ifndef CEPHALO_GPU_H
#define CEPHALO_GPU_H

#include <stdbool.h>
#include <stdint.h>

#include "err.h"
#include "precision.h"

typedef struct gpu_spec {
    const char *name; /* canonical catalog name, e.g. "A100-80GB" */
    const char *aliases; /* comma-separated alternative names and GFD product labels */
    const char *arch; /* "Pascal", "Ampere", ... */
    double memory_gib; /* device memory */
    double fp32_tflops; /* plain FP32 (CUDA cores) */
    double tf32_tflops; /* TF32 tensor cores, 0 when the GPU has none */
    double bf16_tflops; /* bf16 (or fp16 where bf16 is missing) with fp32 accumulation; 0 none */
    bool has_bf16; /* bf16 supported natively (sm_80+) */
    double mem_bw_gbs; /* DRAM bandwidth, GB/s */
} gpu_spec;

/* The emulated CPU device (`type: cpu`): per-thread figures, memory comes from the cluster file. */
#define GPU_CPU_NAME "cpu"
#define CPU_GFLOPS_PER_THREAD 40.0
#define CPU_BW_GBS_PER_THREAD 8.0

const gpu_spec *gpu_catalog(int *count);

/* Looks a name up (canonical or alias). On failure the error suggests the nearest known names:
 * "unknown GPU type 'A100-40' (did you mean 'A100-40GB', 'A10'?)". Returns NULL then. */
const gpu_spec *gpu_find(const char *name, err_t *err);

/* Peak TFLOP/s used for `precision` ("fp32" uses TF32 tensor cores where present; "bf16" falls
 * back to the fp32 figure on GPUs without bf16). */
double gpu_peak_tflops(const gpu_spec *g, precision p);

#endif
