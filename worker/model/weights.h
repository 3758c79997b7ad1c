/* weights.h - the checks every loader of weights by name makes (docs/import.md, "Checks on
 * load"): Hugging Face imports (import.c), checkpoints (state/ckpt_set.c) and parameter dumps
 * (state/export.c), for train, eval, sample and export alike.
 *
 * Every tensor of the files must be one the model reads: a config.json with fewer layers than its
 * weights, or checkpoint metadata describing a smaller model than the file holds, is an error
 * naming the tensors that would be left out, not a silently truncated model. With
 * --allow-unused-weights it is a warning that names them. And every value loaded must be finite:
 * a NaN in a file is reported with its tensor and element when it is read, not discovered steps
 * later as a loss of nan.
 *
 *   weights_used used = {0};
 *   weights_use(&used, "model.norm.weight");           // each name the model reads
 *   if (weights_check_unused(&used, dir, names, n, allow, "config.json: 1 layer", &err) < 0) ...
 *   weights_used_free(&used);
 *   ...
 *   int64_t bad = weights_first_nonfinite(v, n);        // after each read
 *   if (bad >= 0) return weights_nonfinite(&err, file, tensor, NULL, shape, ndim, bad, v[bad]); */
#ifndef CEPHALO_WEIGHTS_H
#define CEPHALO_WEIGHTS_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"

/* The names of the tensors a loader reads (a set; {0} is empty). */
typedef struct weights_used {
    char **names;
    int n, cap;
    bool sorted;
} weights_used;

void weights_use(weights_used *u, const char *name);
bool weights_is_used(weights_used *u, const char *name);
void weights_used_free(weights_used *u);

/* Every name of found[0..n) (the files' tensors) must be in u. Otherwise -1 with an error from
 * `where` naming them (the first few and how many) and `model` (what describes the model: "the
 * config.json of a Llama model with 1 layer"); or, with allow (--allow-unused-weights), a
 * warning naming them and 0. */
int weights_check_unused(weights_used *u, const char *where, const char *const *found, int n, bool allow,
                         const char *model, err_t *err);

/* The index of the first value of v[0..n) that is not finite, or -1. */
int64_t weights_first_nonfinite(const float *v, int64_t n);

/* The error for a value that is not finite: "FILE: tensor 'NAME' holds nan at [3, 17]: ...";
 * flat is its row-major index in a tensor of the given shape, or, when `part` is given (a model
 * tensor inside a checkpoint's flat unit buffer), in that part: "... holds nan in
 * attn.qkv.weight at [3, 17]". Returns -1. */
int weights_nonfinite(err_t *err, const char *file, const char *tensor, const char *part, const int64_t *shape,
                      int ndim, int64_t flat, float v);

#endif
