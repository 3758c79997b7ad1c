/* workqueue.h - the operator's work queue (docs/operator.md, "The binary"): keys ("namespace/name")
 * to sync, each at most once, handed to worker threads, in the shape of client-go's workqueue as
 * Kubernetes' sample-controller drives it:
 *
 *   worker thread: while (wq_process_next(q, sync, arg, &stop)) {}
 *   wq_process_next: key = get (waits for one that is due); result = sync(key);
 *                    failed: add it again with backoff; requeue_after_s: add it again then; done(key)
 *
 * A key is pending at most once: adding it again while it waits only makes it due now (a change
 * beats a backoff), never later. A key being synced is not handed out again until done: a change
 * meanwhile waits in the queue, so one key is never synced by two workers at once. Failures back
 * off 0.5 s doubling per failure in a row up to 30 s (client-go's per-item exponential limiter); a
 * success forgets them.
 *
 * Thread-safe: any thread (a watch, the planning pool, a worker) may add. */
#ifndef CEPHALO_WORKQUEUE_H
#define CEPHALO_WORKQUEUE_H

#include <stdatomic.h>
#include <stdbool.h>

#include "common/err.h"

#define WQ_KEY_MAX 320           /* "namespace/name": 63 + 1 + 253 (the API's limits) fit */
#define WQ_RETRY_FIRST_S 0.5     /* the first failure's backoff, doubled per failure in a row */
#define WQ_RETRY_MAX_S 30.0

typedef struct wq wq;

/* What one sync of a key asks of the queue (controller-runtime's reconcile.Result, with the
 * error). */
typedef struct wq_result {
    bool failed;            /* sync it again after a backoff (err says why; logged) */
    double requeue_after_s; /* not failed: sync it again after this long; 0: on the next change only */
    err_t err;
} wq_result;

typedef wq_result (*wq_sync_fn)(const char *key, void *arg);

/* `what` names a sync in the log line of a failure ("reconcile ns/name failed (retry in 0.5s): ...");
 * not copied. */
wq *wq_new(const char *what);
void wq_free(wq *q);

/* key is due now (a change). */
void wq_add(wq *q, const char *key);
/* key is due after delay_s (a requeue, a resync later); a pending key that is due earlier keeps
 * its time, one due later is due then instead. */
void wq_add_after(wq *q, const char *key, double delay_s);
/* Keys waiting (not those being synced): the operator's queue-depth gauge. */
int wq_len(wq *q);
/* Wakes every waiting worker (to see a stop flag at once). */
void wq_wake(wq *q);

/* One item, as sample-controller's processNextWorkItem: waits up to a second for a due key, syncs
 * it, adds it again as the result says (a failure while *stop is set is not retried), and marks
 * it done. false once *stop is set. */
bool wq_process_next(wq *q, wq_sync_fn sync, void *arg, const atomic_int *stop);
/* A worker's loop: wq_process_next until *stop. */
void wq_run(wq *q, wq_sync_fn sync, void *arg, const atomic_int *stop);

/* The backoff after `failures` failures in a row (1: WQ_RETRY_FIRST_S). */
double wq_backoff_s(int failures);

#endif
