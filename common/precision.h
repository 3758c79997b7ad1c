/* precision.h - the training precisions the planner plans and the worker runs.
 *
 *   fp32  fp32 everywhere (TF32 tensor-core matmuls on CUDA sm_80+)
 *   bf16  bf16 matmul operands and parameter gathers; fp32 master weights, moments, gradients
 *   fp16  fp16 matmul operands and parameter gathers; fp32 master weights, moments, gradients;
 *         dynamic loss scaling (the worker's loss_scale, docs/worker-model.md)
 *
 * The names are the strings of every command line, job file, CRD, plan and profile. */
#ifndef CEPHALO_PRECISION_H
#define CEPHALO_PRECISION_H

#include <stdbool.h>

typedef enum { PREC_FP32 = 0, PREC_BF16 = 1, PREC_FP16 = 2 } precision;
#define PREC_COUNT 3

/* For messages: "fp32, bf16 or fp16". */
#define PRECISION_CHOICES "fp32, bf16 or fp16"

/* The names in order, NULL-terminated (common/args.h's args_choice). */
extern const char *const precision_names[PREC_COUNT + 1];
/* "fp32", "bf16", "fp16". */
const char *precision_name(precision p);
/* Parses a name (exact, lower case); false when s is none of them. */
bool precision_parse(const char *s, precision *out);
/* Bytes per element of the matmul operands and parameter gathers (4, 2, 2). */
int precision_gather_bytes(precision p);
/* Whether matmul operands and gathers are 16-bit (bf16 or fp16). */
static inline bool precision_half(precision p) { return p != PREC_FP32; }

#endif
