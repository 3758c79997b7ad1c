/* ckpt.h - checkpoint metadata helpers shared by checkpoints, dumps and exports. */
#ifndef CEPHALO_CKPT_H
#define CEPHALO_CKPT_H

#include <cjson/cJSON.h>

#include "train.h"

#define CKPT_FORMAT "cephalo-checkpoint"

/* The training settings as JSON (checkpoint and dump metadata "cephalo.train"). */
cJSON *train_config_json(const train_config *c);
/* Renders compactly and frees the object. */
char *json_to_string_free(cJSON *o);

#endif
