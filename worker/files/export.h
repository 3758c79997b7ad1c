/* export.h - `cephalo-worker export`: a checkpoint as a Hugging Face model directory
 * (model.safetensors with transformers' tensor names + config.json) for GPT-2 and Llama. */
#ifndef CEPHALO_EXPORT_H
#define CEPHALO_EXPORT_H

#include "err.h"

/* Writes DIR/model.safetensors and DIR/config.json from a checkpoint written by trainer_save. */
int export_hf(const char *checkpoint, const char *dir, err_t *err);
/* The command line: export --checkpoint FILE -o DIR. Returns the exit code. */
int cmd_export(int argc, char **argv);

#endif
