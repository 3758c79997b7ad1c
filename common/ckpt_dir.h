/* ckpt_dir.h - a checkpoint directory as files (docs/checkpoints.md): which checkpoints it
 * holds, which are complete, what `latest` says, retention, and the temporaries that killed
 * writers left behind. Names and directories only: loading and verifying a checkpoint is the
 * worker's (worker/state/ckpt_resume.c).
 *
 *   DIR/step_NNNNNNNN.safetensors   one file (one rank, or a replicated job): complete when present
 *   DIR/step_NNNNNNNN/              one file per rank + index.json: complete once index.json is
 *                                   there (rank 0 writes it after every rank's file)
 *   DIR/latest                      the name of the newest checkpoint, written after it
 *   *.tmp.PID                       a file being written by process PID (renamed when done) */
#ifndef CEPHALO_CKPT_DIR_H
#define CEPHALO_CKPT_DIR_H

#include <stdbool.h>

#include "common/err.h"
#include "common/outputs.h"

/* The longest checkpoint directory: the longest path written inside it,
 * DIR/step_N/rank-R.safetensors.tmp.PID (or DIR/step_N.safetensors.broken-TIME), fits in the
 * system's PATH_MAX (4096 bytes with its NUL) with room to spare. The worker, `cephalo run` and
 * the operator refuse a longer one before training, not at its first checkpoint. */
#define CKPT_DIR_MAX 3968
/* 0, or -1 naming WHAT ("--ckpt-dir") and the limit. */
int ckpt_dir_check_len(const char *dir, const char *what, err_t *err);

typedef struct ckpt_entry {
    long long step;
    bool sharded;  /* a step directory (else a single file) */
    bool complete; /* a file, or a directory with its index.json */
    char name[48]; /* step_NNNNNNNN[.safetensors] */
} ckpt_entry;

/* The checkpoints in dir, newest step first (on equal steps the complete one first). Returns
 * their number and a fresh array (caller frees; NULL when none), or -1 when dir cannot be read.
 * A missing directory holds none. Entries whose names are not step_N... are ignored. */
int ckpt_dir_list(const char *dir, ckpt_entry **out, err_t *err);

/* The names a checkpoint directory holds (checkpoints, their files, latest, retention.json, the
 * lock): what no other output may be written over (common/outputs.h). */
extern const out_kind ckpt_dir_kind;

/* DIR/latest: 1 with the name it holds, 0 when there is no such file, -1 when it cannot be read
 * or does not hold a checkpoint name (the message says which). */
int ckpt_dir_latest(const char *dir, char *name, size_t n, err_t *err);

/* What a checkpoint argument (train --resume, eval/sample/export --checkpoint) names. */
typedef enum {
    CKPT_ARG_ONE,     /* a checkpoint file or a sharded step directory (with its index.json) */
    CKPT_ARG_DIR,     /* a checkpoint directory */
    CKPT_ARG_POINTER, /* DIR/latest, whether or not the file is there */
} ckpt_arg_kind;

/* The kind of PATH, and in `dir` the directory for DIR and DIR/latest, else the checkpoint itself
 * (PATH, or the step directory of a STEP/index.json); -1 with "PATH: cannot open: ..." when it
 * does not exist. */
int ckpt_arg_classify(const char *path, char *dir, size_t n, ckpt_arg_kind *kind, err_t *err);

/* The checkpoint to read in a checkpoint directory: the one its `latest` names, when that is a
 * complete checkpoint there; else the newest complete one, with a warning that names the pointer
 * and what is wrong with it (missing - said only when `pointer`, i.e. DIR/latest was given -,
 * unreadable, not a checkpoint name, naming a checkpoint that is gone or incomplete). -1 when
 * there is none, the message naming the pointer's problem too. */
int ckpt_dir_pick(const char *dir, bool pointer, char *out, size_t n, err_t *err);

/* What a checkpoint argument names, as the file or step directory to read: the one resolver of
 * every command that takes one. A checkpoint file or step directory is itself; a checkpoint
 * directory and DIR/latest go through ckpt_dir_pick. 0 with out set, or -1 with the error naming
 * PATH and what was expected. */
int ckpt_dir_resolve(const char *path, char *out, size_t n, err_t *err);

/* Deletes one checkpoint; a step directory's index.json goes first, so a deletion cut short
 * leaves an incomplete checkpoint, never one that looks complete. */
int ckpt_dir_remove(const char *dir, const ckpt_entry *e, err_t *err);

/* Removes NAME.tmp.PID files in dir (and in its step directories) left by writers that are gone:
 * PID runs no more on this machine, or (PIDs of another machine or container) the file has not
 * changed for STALE_TMP_S. Call it holding the directory's lock. Returns the number removed. */
#define STALE_TMP_S 600
int ckpt_dir_clean_temps(const char *dir);

/* The same for one directory only (a run directory's plan.json.tmp.PID and the like). */
int dir_clean_temps(const char *dir);

#endif
