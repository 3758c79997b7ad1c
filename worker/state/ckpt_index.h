/* ckpt_index.h - a sharded step directory's index.json (docs/checkpoints.md), read and checked:
 * the files it lists and the slice of every unit each holds, which must tile every unit exactly.
 * Parsing only, from text: ckpt_set.c reads the file and opens the pieces, and
 * fuzz/fuzz_ckpt_index.c feeds it arbitrary bytes.
 *
 *   ckpt_index ix;
 *   if (ckpt_index_parse("D/index.json", text, len, "D", "D", numel, n_units, &ix, &err) < 0) ...
 *   ...ix.files[i].path, .off[u], .n[u]...
 *   ckpt_index_free(&ix); */
#ifndef CEPHALO_CKPT_INDEX_H
#define CEPHALO_CKPT_INDEX_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/json_util.h"

/* The index's "format" (ckpt_write_index, ckpt_set.c, writes it). */
#define CKPT_INDEX_FORMAT "cephalo-checkpoint-index"

/* One file of the step directory: its path (the directory and the index's name) and the slice
 * [off[u], off[u] + n[u]) of every unit u it holds. */
typedef struct ckpt_slices {
    char *path;
    int64_t *off, *n;
} ckpt_slices;

typedef struct ckpt_index {
    int64_t step;
    int n_files;
    ckpt_slices *files;
} ckpt_index;

/* Parses index.json's text: name is the file for messages, dir the step directory the files are
 * in, label the checkpoint as the user named it (for the tiling errors), numel the sizes of the
 * model's n_units units. 0 with *ix filled (ckpt_index_free), or -1 with err naming the file and
 * the field and *ix empty. */
int ckpt_index_parse(const char *name, const char *text, size_t len, const char *dir, const char *label,
                     const int64_t *numel, int n_units, ckpt_index *ix, err_t *err);
void ckpt_index_free(ckpt_index *ix);

/* Reads {"offsets": [...], "sizes": [...]} (an index entry, or a file's metadata cephalo.shard)
 * into off and n, n_units entries each; path names o in messages. */
int ckpt_ranges_read(const json_ctx *c, const cJSON *o, const char *path, int n_units, int64_t *off, int64_t *n);

#endif
