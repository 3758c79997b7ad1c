/* mtok.h - the tokenizer that goes with a model (docs/tokenizer.md "Identity"): found beside the
 * model (an --init-from directory, a checkpoint directory, an export, a `cephalo data` output),
 * checked against the data before the first step, kept beside checkpoints and in exports. */
#ifndef CEPHALO_MTOK_H
#define CEPHALO_MTOK_H

#include <limits.h>
#include <stdbool.h>

#include "common/err.h"
#include "formats/tokenizer.h"

#define MTOK_FILE "tokenizer.json"

typedef struct mtok {
    tok_id id;           /* TOKID_UNKNOWN: no tokenizer known */
    char path[PATH_MAX]; /* its tokenizer.json, "" when only the identity is known (or bytes) */
} mtok;

/* DIR/tokenizer.json when it exists (loaded: a bad file is an error naming it); else *t unknown. */
int mtok_from_dir(const char *dir, mtok *t, err_t *err);
/* The tokenizer of a checkpoint: the one its metadata records (`recorded`: ckpt_read_tokenizer's
 * answer; every command that loads a checkpoint has read it), with the tokenizer.json kept beside
 * it: in the step directory `resolved` (ckpt_dir_resolve's answer) or the directory of the
 * checkpoint file, else in the checkpoint directory above a step directory. The record is the
 * identity: a kept file of another tokenizer (replaced after the checkpoint was written, by a
 * later run in the same directory or by hand) is refused, naming both, since reading or writing
 * text with it would be silently wrong. Recorded with no file kept: *t has the identity and no
 * path. Nothing recorded (older checkpoints): the kept file, else *t unknown. */
int mtok_for_checkpoint(const char *resolved, tok_id recorded, mtok *t, err_t *err);
/* The directory of the first shard of a data spec (a directory: itself; a file or a pattern: the
 * directory it is in), where `cephalo data` keeps the shards' tokenizer.json. */
void mtok_data_dir(const char *spec, char *out, size_t n);

/* 0 when the data's tokenizer (from its shard headers; `shard` names one) can be the model's:
 * either is unknown, or they are the same. Else -1 with both names and where they come from. */
int mtok_check_data(const mtok *model, const char *model_from, tok_id data, const char *shard, err_t *err);
/* The model tokenizer for `eval`/`sample`-like commands: --init-from DIR's, else the checkpoint's
 * (mtok_for_checkpoint: resolved is ckpt_dir_resolve's answer, recorded its metadata's). */
int mtok_for_model(const char *init_from, const char *resolved, tok_id recorded, mtok *t, err_t *err);
/* 0 when the tokenizer's vocabulary fits the model's (vocab); else -1 naming the file. */
int mtok_check_vocab(const mtok *t, int vocab, const char *what, err_t *err);

/* Copies t->path to DIR/tokenizer.json atomically, unless that file is already there with the
 * same identity (it then stays as it is). When t has an identity but no file, a DIR/tokenizer.json
 * of another tokenizer (an earlier run's) is refused: the checkpoints written there would record
 * t's identity beside another tokenizer's file. A no-op when t is unknown. */
int mtok_keep(const mtok *t, const char *dir, err_t *err);

#endif
