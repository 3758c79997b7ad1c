/* outputs.h - the one rule of every command that writes (docs/development.md, "Outputs"): an
 * output never lands on an input, on another output, or on a file that the command keeps in one
 * of its directories (a checkpoint, a shard, a run's plan); and a directory of generic names (a
 * run directory, an export) is written only when it holds none of those names yet or is marked as
 * written by the same command, so that `--run-dir .` cannot replace a cluster.yaml of the user's.
 * Files are written to a temporary and renamed (file_write_atomic, st_writer_save); logs are the
 * one exception, streams appended as they go.
 *
 *   out_set s = out_begin("cephalo-worker train");
 *   out_input(&s, "--data", shard);                     // each file the data spec names
 *   out_input_dir(&s, "--init-from", dir, &out_hf_input);
 *   out_file(&s, "--log", o.log);
 *   out_dir(&s, "--ckpt-dir", o.ckpt_dir, &ckpt_dir_kind);
 *   int rc = out_check(&s, &err);                       // -1: refused, exit 2; names both paths
 *   out_free(&s);
 *   ... file_make_dir(dir) ...; out_mark(dir, &kind, &err);  // directories with a marker
 *
 * Paths compare as file_same does: the same file (device and inode) when both exist, else the
 * same resolved parent directory and name, so "./x", "d/../x", symbolic and hard links are all
 * caught. NULL, "" and "-" (stdin, stdout) are never files here, nor are inputs that do not
 * exist (a built-in model name, "synthetic"). */
#ifndef CEPHALO_OUTPUTS_H
#define CEPHALO_OUTPUTS_H

#include <stdbool.h>

#include "common/err.h"
#include "common/fileio.h"

/* What a command keeps in a directory it writes, or reads from one it reads. */
typedef struct out_kind {
    const char *what;               /* "checkpoint directory", in messages */
    bool (*owns)(const char *name); /* the names the command writes, deletes or reads there */
    bool reads_back;                /* inputs in it are fine: read before anything is written (resume) */
    const char *marker;             /* NULL, or the file that marks the directory as the command's */
    const struct out_kind *sub;     /* NULL, or the kind of each of its subdirectories (a run
                                     * directory's checkpoint directory, a checkpoint's step directory) */
} out_kind;

/* A path given to the command: opt, path (owned), and the kind of a directory (else NULL). */
typedef struct out_path {
    const char *opt;
    char *path;
    const out_kind *kind;
} out_path;

typedef struct out_set {
    const char *cmd; /* "cephalo-worker train": who refuses, in messages */
    out_path *in, *file, *dir;
    int n_in, n_file, n_dir;
} out_set;

out_set out_begin(const char *cmd);
void out_free(out_set *s);

/* An input file (a path with glob characters stands for the files it matches, as a data spec). */
void out_input(out_set *s, const char *opt, const char *path);
/* An input directory, whose files of `kind` are inputs (a checkpoint directory, a model's). */
void out_input_dir(out_set *s, const char *opt, const char *dir, const out_kind *kind);
/* An input that is a directory of kind or a file, whichever it is now (--init-from, --resume). */
void out_input_path(out_set *s, const char *opt, const char *path, const out_kind *dir_kind);
/* An output file. */
void out_file(out_set *s, const char *opt, const char *path);
/* An output directory and what the command keeps there. */
void out_dir(out_set *s, const char *opt, const char *dir, const out_kind *kind);

/* 0 when every output is clear of the inputs, of each other and of the files the command keeps;
 * else -1 with "OPT PATH: ..." naming both sides and what to do. Nothing is written. */
int out_check(const out_set *s, err_t *err);

/* Marks dir (existing) as written by kind's command; a no-op for kinds without a marker. */
int out_mark(const char *dir, const out_kind *kind, err_t *err);

/* The files of Hugging Face model directories: config and generation config, weights
 * (safetensors, their index, pytorch_model*.bin), tokenizer files. --init-from reads them; export
 * writes some of them and marks its directory with .cephalo-export. */
extern const out_kind out_hf_input, out_hf_export;

#endif
