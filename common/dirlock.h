/* dirlock.h - one writer per directory: an exclusive flock on DIR/.lock.
 *
 * Two runs writing one run directory or one checkpoint directory corrupt each other (one
 * resumes from the other's checkpoint mid-run, logs interleave). The lock is an flock(2) held
 * for the life of the process: the kernel releases it when the process ends, however it ends
 * (kill -9 included), so a lock is never stale. The file holds "pid PID host HOST" of the holder,
 * for the message of whoever finds it taken. */
#ifndef CEPHALO_DIRLOCK_H
#define CEPHALO_DIRLOCK_H

#include "common/err.h"

#define DIRLOCK_FILE ".lock"

/* Takes DIR/.lock without waiting. Returns the lock's descriptor (close-on-exec; keep it open
 * while writing the directory), or -1 with a message that names the directory, `what` holds it
 * ("a cephalo run", "a training"), and the holder's PID and host. A filesystem that cannot lock
 * (some network mounts) is not an error: a warning, and -2. */
int dir_lock(const char *dir, const char *what, err_t *err);

/* Releases a lock taken by dir_lock (fd >= 0; anything else is ignored). */
void dir_unlock(int fd);

#endif
