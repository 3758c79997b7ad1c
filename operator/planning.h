/* planning.h - plans made off the reconcile loop (docs/operator.md, "Planning").
 *
 * Planning one job can take from milliseconds to minutes (a large globalBatch on many GPUs: the
 * optimizer's exact room DP is quadratic in the batch), and the reconcile loop serves every job:
 * it must never wait for one plan. This pool runs tasks on worker threads of its own, at most one
 * task per key (a job's namespace/name) at a time, each made for an id (what it is planned from:
 * the generation, the usable GPUs, the profile). The loop asks for the key's task with the id it
 * wants: busy, done (with its result), or none (it submits one; a task of another id for the key
 * is cancelled and dropped). A finished task stays until it is replaced or forgotten, so a job
 * whose planning failed or ran out of time is not planned again and again while nothing it is
 * planned from changed.
 *
 * Threads: one thread (the reconcile loop) submits, looks up, waits and forgets; a task found
 * done stays valid until that thread replaces or forgets it. The workers only run tasks, and call
 * on_done (no lock held) when one finished, so that the loop reconciles its job again. */
#ifndef CEPHALO_PLANNING_H
#define CEPHALO_PLANNING_H

#include <stdbool.h>

#include "common/err.h"

#define PLANNING_KEY_MAX 320 /* "namespace/name": 63 + 1 + 253 (the API's limits) fit */
#define PLANNING_ID_MAX 256

typedef struct planning planning;

/* Runs a task; gives up soon once *cancel is non-zero (replaced, forgotten, or the pool freed). */
typedef void (*planning_run_fn)(void *task, const volatile int *cancel);
typedef void (*planning_free_fn)(void *task);
typedef void (*planning_done_fn)(const char *key, void *arg);

typedef enum { PLANNING_NONE, PLANNING_BUSY, PLANNING_DONE } planning_state;

/* Starts `workers` threads (1..64). NULL with err set when a thread cannot be started. */
planning *planning_new(int workers, planning_done_fn on_done, void *arg, err_t *err);
/* Cancels every task, waits for the workers (a cancelled plan stops within milliseconds) and frees
 * every task. NULL is fine. */
void planning_free(planning *p);

/* The state of key's task made for id: NONE when there is none or it is for another id; DONE sets
 * *task to it. */
planning_state planning_get(planning *p, const char *key, const char *id, void **task);
/* Hands task to the pool (it frees it with free_fn) to be run for key and id by the next free
 * worker; key's previous task, if any, is cancelled and dropped. */
void planning_submit(planning *p, const char *key, const char *id, void *task, planning_run_fn run,
                     planning_free_fn free_fn);
/* Waits at most timeout_s for key's task to finish: true when it is done (or there is none). */
bool planning_wait(planning *p, const char *key, double timeout_s);
/* Drops key's task (cancelling it when it runs). */
void planning_forget(planning *p, const char *key);
/* Tasks waiting or running (the operator's gauge). */
int planning_busy(planning *p);

#endif
