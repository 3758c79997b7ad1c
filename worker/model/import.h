/* import.h - initial weights from a Hugging Face model directory (docs/import.md): config.json and
 * model.safetensors, or model.safetensors.index.json and its shards, in GPT2LMHeadModel or
 * LlamaForCausalLM layouts - what export.c writes, and what the Hub serves.
 *
 *   hf_import *imp;
 *   if (hf_import_open(&imp, "TinyLlama-1.1B", &model, false, &err) < 0) ...   // maps, checks every tensor
 *   hf_import_range(imp, unit, lo, hi, host, &err);   // unit's flat elements [lo, hi) as fp32
 *   hf_import_close(imp);
 *
 * The files are mapped, never read whole: a rank touches only the bytes of its own slices, so a
 * model too large for any one rank loads across ranks. */
#ifndef CEPHALO_IMPORT_H
#define CEPHALO_IMPORT_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "planner/model.h"

typedef struct hf_import hf_import;

/* Maps DIR's safetensors files and checks that every tensor `m` needs is there, with the shape
 * `m` implies and a dtype we convert (F32, BF16, F16, F64), each from the shard the index's
 * weight_map names; and that every tensor of the files is one `m` reads (model/weights.h), unless
 * allow_unused (--allow-unused-weights: a warning names those left out). Errors name the file,
 * the tensor and both shapes. */
int hf_import_open(hf_import **out, const char *dir, const model_spec *m, bool allow_unused, err_t *err);
/* Unit `unit`'s flat parameters [lo, hi) (wmodel's layout) into out[0 .. hi-lo), as fp32. A
 * value that is not finite is an error naming the file, the tensor and the element. */
int hf_import_range(hf_import *imp, int unit, int64_t lo, int64_t hi, float *out, err_t *err);
void hf_import_close(hf_import *imp);

/* The model DIR's config.json describes must be `m` (the plan's or --model's): every shape
 * field, rope_theta, norm_eps and the head's tying. The message shows both. */
int hf_import_check_model(const char *dir, const model_spec *m, err_t *err);

#endif
