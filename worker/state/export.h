/* export.h - a checkpoint as a Hugging Face model directory (model.safetensors with transformers'
 * tensor names + config.json) for GPT-2 and Llama: `cephalo-worker export` (worker/cmd/export.c). */
#ifndef CEPHALO_EXPORT_H
#define CEPHALO_EXPORT_H

#include <stdbool.h>

#include "common/err.h"
#include "planner/model.h"

/* The model and every unit's parameters (host, wmodel's layout) of what a --checkpoint PATH names:
 * a checkpoint file, a sharded step directory, a checkpoint directory (its `latest`, else its
 * newest complete checkpoint) or a --dump file. *units is an array of model_n_units(m) buffers;
 * the caller frees each and the array. (`cephalo-worker sample` reads its model this way.)
 * Tensors the model does not read are an error (a warning with allow_unused), and so is a value
 * that is not finite (model/weights.h). */
int export_read_checkpoint(const char *checkpoint, model_spec *m, bool allow_unused, float ***units, err_t *err);
/* Writes DIR/model.safetensors and DIR/config.json from a checkpoint written by trainer_save. */
int export_hf(const char *checkpoint, const char *dir, bool allow_unused, err_t *err);

#endif
