/* ckpt.h - a trainer's checkpoints (ckpt.c, ckpt_set.c): saving and resuming, and the metadata
 * helpers shared by checkpoints, dumps and exports (with ckpt_meta.h's, which it includes). */
#ifndef CEPHALO_CKPT_H
#define CEPHALO_CKPT_H

#include <cjson/cJSON.h>

#include "formats/safetensors.h"
#include "formats/tokenizer.h"
#include "model/train.h"
#include "state/ckpt_meta.h"

#define CKPT_FORMAT "cephalo-checkpoint"

/* Checkpoints: safetensors with each unit's parameters and AdamW moments, the step and the
 * configuration; written atomically, validated on load, bit-exact resume. */
int trainer_save(trainer *t, const char *path, err_t *err);
/* -1: the checkpoint cannot be read or is damaged; RESUME_OTHER_MODEL (ckpt_meta.h): it is sound
 * but of another model (the message names both). */
int trainer_resume(trainer *t, const char *path, err_t *err);

/* The training settings as JSON (checkpoint and dump metadata "cephalo.train"). */
cJSON *train_config_json(const train_config *c);
/* The model's tokenizer, for the metadata "cephalo.tokenizer" of the checkpoints written from now
 * on (TOKID_UNKNOWN: none). */
void ckpt_set_tokenizer(tok_id id);
/* A checkpoint's (or dump's) recorded tokenizer; TOKID_UNKNOWN when it has none. */
int ckpt_read_tokenizer(const st_file *f, tok_id *id, err_t *err);
/* Renders compactly and frees the object. */
char *json_to_string_free(cJSON *o);

/* ---- a checkpoint as pieces (ckpt_set.c) ---- */
typedef struct ckpt_set ckpt_set;
/* path: a checkpoint file (whole units, or one rank's slices), a sharded step directory, or its
 * index.json. The pieces must tile every unit of model m exactly. A checkpoint of another model
 * is named as such (*other_model set, when given), not as a tiling error. Every tensor of a piece
 * must be one of m's (KIND.UNIT), checked on its first read, unless allow_unused
 * (--allow-unused-weights: a warning names the others). */
ckpt_set *ckpt_set_open(const char *path, const model_spec *m, bool allow_unused, bool *other_model, err_t *err);
/* The first piece (opened): its metadata describes the checkpoint. */
const st_file *ckpt_set_first(ckpt_set *s, err_t *err);
int64_t ckpt_set_step(const ckpt_set *s);
/* Elements [lo, lo+n) of tensor "KIND.UNIT_NAME" of unit `unit`, assembled from the pieces; a
 * value that is not finite is an error naming the piece, the tensor and the element. */
int ckpt_set_read(ckpt_set *s, const char *kind, int unit, const char *unit_name, int64_t lo,
                  int64_t n, float *out, err_t *err);
void ckpt_set_close(ckpt_set *s);
/* The name of rank r's file in a sharded step directory, and the directory's index (rank 0
 * writes it after every rank's file is complete). */
void ckpt_shard_name(int rank, char *out, size_t n);
int ckpt_write_index(const char *dir, const trainer *t, err_t *err);
/* Writes checkpoint DIR/step_NNNNNNNN (a file with one rank or a replicated job, else a
 * directory of per-rank files and an index) and points DIR/latest at it; collective. */
int ckpt_save_step(trainer *t, const char *dir, err_t *err);

#endif
