/* dirlock.h - one writer per directory: an exclusive flock on DIR/.lock.
 *
 * Two runs writing one run directory or one checkpoint directory corrupt each other (one
 * resumes from the other's checkpoint mid-run, logs interleave). The lock is an flock(2) held
 * for the life of the process: the kernel releases it when the process ends, however it ends
 * (kill -9 included), so a lock is never stale. The file holds "pid PID host HOST (WHAT)" of the
 * holder, for the message of whoever finds it taken; the line is in the file from the moment the
 * lock can be seen taken (dirlock.c), so that message always names the holder. */
#ifndef CEPHALO_DIRLOCK_H
#define CEPHALO_DIRLOCK_H

#include "common/err.h"

#define DIRLOCK_FILE ".lock"

/* Takes DIR/.lock without waiting. `self` says what this process is ("cephalo run",
 * "training"): it goes into the file. Returns the lock's descriptor (close-on-exec; keep it open
 * while writing the directory), or -1 with a message that names the directory and the holder as
 * it described itself: "another cephalo run (PID 4711 on host node-a, ...)", "a cephalo run" when
 * a training finds a run's directory, "the cephalo run that started this training" when the
 * holder is this process's parent, "this process" when it is this one. A filesystem that cannot
 * lock (some network mounts) is not an error: a warning, and -2. */
int dir_lock(const char *dir, const char *self, err_t *err);

/* Whether someone holds DIR/.lock now: 1 with dir_lock's refusal in err, else 0 (no lock file,
 * or nobody holds it). Creates nothing: for a command that checks a directory before it writes
 * anything, so that a directory in use is named as such rather than as holding a foreign file. */
int dir_lock_held(const char *dir, const char *self, err_t *err);

/* Releases a lock taken by dir_lock (fd >= 0; anything else is ignored). */
void dir_unlock(int fd);

#endif
