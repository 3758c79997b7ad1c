/* ckpt_resume.h - where a training starts and what it may do to its checkpoint directory
 * (docs/checkpoints.md): the directory's lock, stale temporaries, the checkpoint every rank
 * resumes from (agreed across ranks), the refusal to write over another run's checkpoints, and
 * retention after each checkpoint. */
#ifndef CEPHALO_CKPT_RESUME_H
#define CEPHALO_CKPT_RESUME_H

#include <stdbool.h>

#include "common/ckpt_dir.h"
#include "common/ckpt_keep.h"
#include "model/train.h"

typedef struct ckpt_opts {
    const char *dir;    /* --ckpt-dir, or NULL */
    const char *resume; /* --resume: NULL, "none" or "never" (start afresh), "auto", or a path */
    bool overwrite;     /* --overwrite: checkpoints beyond the starting step may be deleted */
    ckpt_keep keep;     /* --keep-last, --keep-every (CKPT_KEEP_UNSET: not given); ckpt_start settles them */
} ckpt_opts;

/* Outcomes of ckpt_start besides 0: bad input or a directory held by another run (exit 2). */
#define CKPT_REFUSED (-1)

/* Before the first step, on every rank (collective when the trainer has a communicator):
 * rank 0 locks the checkpoint directory (kept in *lock_fd until ckpt_finish) and removes the
 * temporaries of dead writers; the ranks agree on the checkpoint to resume from and load it;
 * checkpoints that the run would write over are refused unless o->overwrite. Progress notes go
 * to stderr unless quiet. 0, or CKPT_REFUSED with the message in err. */
int ckpt_start(trainer *t, ckpt_opts *o, bool quiet, int *lock_fd, err_t *err);

/* Writes the checkpoint of the current step (collective), then rank 0 applies retention
 * (common/ckpt_keep.h). `diverged`: the loss of this step is above the divergence bound, so this
 * checkpoint does not count toward --keep-last. */
int ckpt_checkpoint(trainer *t, const ckpt_opts *o, bool diverged, err_t *err);

/* Releases the directory's lock. */
void ckpt_finish(int lock_fd);

#endif
