/* ckpt_keep.h - checkpoint retention (docs/checkpoints.md, "Retention"): which checkpoints of a
 * directory stay after each new one. Two things decide it, and both are kept in the directory,
 * DIR/retention.json, so that a resumed run applies them without being told again:
 *
 *   {"keep_last": 3, "keep_every": 0, "diverged": [25, 30]}
 *
 * the settings the directory was made with (--keep-last, --keep-every) and the steps whose
 * checkpoints were written while the loss was above the divergence bound. Those never count
 * toward keep_last, so a divergence cannot push the last good weights out, and the newest good
 * checkpoint is never deleted. Rank 0 applies retention, holding the directory's lock. */
#ifndef CEPHALO_CKPT_KEEP_H
#define CEPHALO_CKPT_KEEP_H

#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"

#define CKPT_KEEP_FILE "retention.json"
#define CKPT_KEEP_UNSET (-1L) /* a setting not given on the command line */

typedef struct ckpt_keep {
    long keep_last;  /* the newest N good checkpoints; 0: all of them; CKPT_KEEP_UNSET: not given */
    long keep_every; /* also every one whose step is a multiple of K (milestones); 0: none */
} ckpt_keep;

/* Settles a run's retention: each setting given (not CKPT_KEEP_UNSET) wins over the one kept in
 * dir, which wins over the default (common/worker_cmd.h's table). The result goes into *keep and,
 * when it differs from what dir kept, into DIR/retention.json. A setting taken from the directory,
 * or one given that overrides it, is logged. 0, or -1 when the file cannot be read or written
 * (the message names it and the field). */
int ckpt_keep_settle(const char *dir, ckpt_keep *keep, err_t *err);

/* Records, before the checkpoint of `step` is written, whether it is written while the loss is
 * above the divergence bound (a step written again after --overwrite loses an old mark). */
int ckpt_keep_mark(const char *dir, long long step, bool diverged, err_t *err);

/* The newest complete checkpoint not written while diverging: 1 with its name, 0 when there is
 * none, -1 on an error. */
int ckpt_keep_last_good(const char *dir, char *name, size_t n, err_t *err);

/* Retention, after a checkpoint was written: deletes the complete checkpoints that `keep` does
 * not keep, and incomplete ones older than the newest complete one (writes cut short). Never the
 * newest complete checkpoint, the newest good one, the one `latest` names, nor an incomplete one
 * newer than the newest complete (it may be being written). Each deletion is logged with its
 * name and the rule. Returns the number deleted, or -1. */
int ckpt_keep_prune(const char *dir, const ckpt_keep *keep, err_t *err);

#endif
