/* export.h - a checkpoint as a Hugging Face model directory (model.safetensors with transformers'
 * tensor names + config.json) for GPT-2 and Llama: `cephalo-worker export` (worker/cmd/export.c). */
#ifndef CEPHALO_EXPORT_H
#define CEPHALO_EXPORT_H

#include <stdbool.h>

#include "common/err.h"
#include "formats/safetensors.h"
#include "formats/tokenizer.h"
#include "planner/model.h"

/* The model and every unit's parameters (host, wmodel's layout) of what a --checkpoint PATH names:
 * a checkpoint file, a sharded step directory, a checkpoint directory (its `latest`, else its
 * newest complete checkpoint) or a --dump file. *units is an array of model_n_units(m) buffers;
 * the caller frees each and the array. (`cephalo-worker sample` reads its model this way.)
 * Tensors the model does not read are an error (a warning with allow_unused), and so is a value
 * that is not finite (model/weights.h). */
/* *recorded: the tokenizer the checkpoint records (TOKID_UNKNOWN: none), for mtok_for_checkpoint. */
int export_read_checkpoint(const char *checkpoint, model_spec *m, bool allow_unused, float ***units, tok_id *recorded,
                           err_t *err);
typedef struct export_opts {
    bool allow_unused;     /* --allow-unused-weights */
    st_dtype dtype;        /* --dtype: ST_F32 (default), ST_BF16 or ST_F16 */
    const char *tokenizer; /* --tokenizer FILE, else the one kept beside the checkpoint (mtok.h) */
} export_opts;

/* Writes DIR/model.safetensors (in o->dtype) and DIR/config.json from a checkpoint written by
 * trainer_save, and with the model's tokenizer DIR/tokenizer.json, tokenizer_config.json,
 * special_tokens_map.json and generation_config.json (docs/import.md "Export"). Files of an
 * earlier export in DIR that this one does not write (other weight files, an index, tokenizer
 * files) are removed. *no_tokenizer is set when there was no tokenizer to export. */
int export_hf(const char *checkpoint, const char *dir, const export_opts *o, bool *no_tokenizer, err_t *err);

#endif
