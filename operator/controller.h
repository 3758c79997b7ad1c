/* controller.h - the operator's reconcile workers (docs/operator.md, "The binary"): --workers
 * threads, each with API clients of its own (a client is not thread-safe), taking job keys
 * ("namespace/name") from the work queue (workqueue.h) and reconciling them (rec_job_with); and
 * what they did, for /metrics: the reconcile counters and the reconcile-duration histogram.
 *
 *   ctl *c = ctl_start(queue, &rec_cfg, k, &cfg, 8, &stop, &err);   // after the stores synced
 *   ...                                                             // until stop is set
 *   ctl_join(c);
 *
 * The counters are the process's (as kube_requests() are): /metrics reads them whether or not
 * workers run yet. */
#ifndef CEPHALO_CONTROLLER_H
#define CEPHALO_CONTROLLER_H

#include <stdatomic.h>

#include "common/err.h"
#include "operator/client/kube.h"
#include "operator/reconcile.h"
#include "operator/client/workqueue.h"

#define CTL_MAX_WORKERS 64
#define CTL_POD_HELPERS 4 /* clients per worker for creating a gang's pods at once */
#define CTL_N_BUCKETS 11  /* the histogram's bounds, the last bucket +Inf beyond them */

extern const double ctl_buckets[CTL_N_BUCKETS]; /* seconds: 0.005 ... 10 */

typedef struct ctl ctl;

/* Starts n workers (1..CTL_MAX_WORKERS) on q; worker 0 uses k, the others clients of their own
 * from cfg, each with CTL_POD_HELPERS more (fewer when one cannot be made). Every client gives
 * up its requests once *stop is set. A worker that cannot start sets *stop, after saying why
 * (log_msg): *failed is then true. The workers run until *stop. */
ctl *ctl_start(wq *q, const rec_config *rc, kube_client *k, const kube_config *cfg, int n, atomic_int *stop,
               bool *failed);
/* Waits for the workers (after *stop was set) and frees their clients (not k). NULL is fine. */
void ctl_join(ctl *c);

/* A copy of the counters, of the histogram's buckets (per bucket, not cumulative; counts:
 * CTL_N_BUCKETS + 1) and of the sum of the reconciles' seconds. */
void ctl_stats(rec_stats *s, long *counts, double *sum_s);

#endif
