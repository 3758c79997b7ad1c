/* ckpt.h - checkpoint metadata helpers shared by checkpoints, dumps and exports. */
#ifndef CEPHALO_CKPT_H
#define CEPHALO_CKPT_H

#include <cjson/cJSON.h>

#include "safetensors.h"
#include "train.h"

#define CKPT_FORMAT "cephalo-checkpoint"

/* The training settings as JSON (checkpoint and dump metadata "cephalo.train"). */
cJSON *train_config_json(const train_config *c);
/* The model spec a checkpoint (or dump) carries in its "cephalo.model" metadata, validated. */
int ckpt_read_model(const st_file *f, model_spec *m, err_t *err);
/* Renders compactly and frees the object. */
char *json_to_string_free(cJSON *o);

#endif
