/* informers.h - the operator's watches of six kinds (docs/operator.md, "What the operator
 * watches"): each a list+watch (watch_loop.c) on a thread of its own with its own client, keeping one of the
 * stores the reconcile reads (cache.h) and queueing the jobs an event concerns (workqueue.h), as
 * client-go's informers with their event handlers do:
 *
 *   cephalojobs   a job new, deleted, or its spec, labels or annotations changed (not its status:
 *                 the operator's own writes) -> that job; its phase changed, its spec changed or
 *                 it is gone -> the Queued jobs too, at once (one may wait behind it)
 *   pods, configmaps, services (label cephalo.dev/job) -> their job
 *   nodes         a node came, went, or changed what the inventory reads (labels, GPUs,
 *                 schedulability, taints, readiness; not heartbeats) -> every job
 *   busy pods     (every namespace: the GPU accounting) came or went -> the jobs waiting for GPUs,
 *                 INF_SETTLE_S after the first of a burst
 *
 *   informers_ctx x = {.caches = &caches, .queue = q, .stop = &stop, .synced = &synced};
 *   informers *in = informers_new(cfg, &x);
 *   informers_start(in, "ml,research", &err);  // NULL: every namespace
 *   informers_wait_synced(in);              // nothing is reconciled before every first list
 *   ... informers_requeue_all(in, NULL) ...  // the periodic resync
 *   informers_join(in);                     // after *stop was set: joins and frees */
#ifndef CEPHALO_INFORMERS_H
#define CEPHALO_INFORMERS_H

#include <stdatomic.h>

#include "common/err.h"
#include "operator/client/kube.h"
#include "operator/reconcile.h"
#include "operator/client/workqueue.h"

#define INF_SETTLE_S 1.0 /* GPUs freed: the waiting jobs look this long after the first change */

typedef struct informers_ctx {
    rec_caches *caches; /* the stores they fill */
    wq *queue;          /* the jobs they queue, "namespace/name" */
    atomic_int *stop;   /* read to stop; set when a watch cannot go on */
    atomic_int *synced; /* set once every store has its first list (/readyz) */
} informers_ctx;

typedef struct informers informers;

/* x must outlive the informers. */
informers *informers_new(const kube_config *cfg, const informers_ctx *x);
/* Starts the watches of the namespaces in the comma-separated list (NULL or "": every namespace):
 * the jobs, their pods, plans and Services once per namespace, into one store per kind; nodes and
 * busy pods are always cluster-wide. 0, or an exit status with *stop set: 2 a bad namespace, 1 a
 * thread not started. */
int informers_start(informers *in, const char *namespaces, err_t *err);
/* Waits until every store has its first list (an empty store would look like a cluster without
 * nodes or pods), or *stop. */
void informers_wait_synced(informers *in);
/* Queues every job the job store knows; why (or NULL) is logged. */
void informers_requeue_all(informers *in, const char *why);
/* Joins the watch threads (they end once *stop is set) and frees. */
void informers_join(informers *in);

#endif
