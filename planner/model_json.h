/* model_json.h - a model spec as JSON (plans and checkpoints carry the exact shapes). */
#ifndef CEPHALO_MODEL_JSON_H
#define CEPHALO_MODEL_JSON_H

#include "common/json_util.h"
#include "planner/model.h"

cJSON *model_to_json(const model_spec *m);
/* Reads the object written by model_to_json and validates the shapes; errors name the file
 * (c->file) and `path`.field. */
int model_from_json(const json_ctx *c, const cJSON *o, const char *path, model_spec *m);

#endif
