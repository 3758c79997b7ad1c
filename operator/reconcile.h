/* reconcile.h - one CephaloJob reconciled (docs/operator.md): inventory -> plan -> ConfigMap <job>-plan
 * with plan.json -> headless Service <job> -> one Pod <job>-<rank> per GPU -> status.
 *
 * It reads what exists from the stores of rec_config.caches (cache.h), which the operator's
 * watches keep current, and calls the API server only to change something: a reconcile of a job
 * whose state is as it should be sends no request.
 *
 * Level-based and idempotent: every call looks at what exists and does only what is missing, so
 * it may run any number of times for any change (or none), and a restarted operator carries on.
 *
 * The plan is made for one generation of the job and one set of usable GPUs (the inventory's
 * fingerprint) and kept in the ConfigMap (annotations cephalo.dev/generation, /inventory,
 * /plan-id); later calls read it from there. A new generation or a changed inventory (a node
 * lost or added) re-plans, and the pods of the old plan are stopped and the gang started again
 * on the new one, resuming from the last checkpoint (elastic).
 *
 * GPUs are shared between jobs (docs/operator.md, "GPUs shared between jobs"): a node's free GPUs
 * are its allocatable ones less the requests of the non-terminal pods bound to it in every
 * namespace, or not bound yet and pinned to it by required node affinity, the job's own excepted. A job is planned on its free GPUs when at least its need
 * (spec.gpus.minGPUs, else its whole plan) are free, else on all its usable GPUs; it is admitted
 * (pods created) only when every GPU of its plan is free and no job ahead of it in the queue
 * (spec.priority, then creation) waits for those nodes; otherwise it is Queued (condition Admitted
 * False, reason WaitingForGPUs) and looked at again when GPUs may have freed up (a pod that may
 * hold GPUs came or went, a Node changed: main.c's watches). A live job keeps a
 * plan that still fits and grows onto more free GPUs at most every spec.elastic.minReplanSeconds.
 *
 * Placement (docs/operator.md, "Placement"): a worker pod requests nvidia.com/gpu 1 and requires
 * its planned node by node affinity on the kubernetes.io/hostname label; kube-scheduler binds it.
 * A worker the scheduler refuses (Unschedulable: its GPU was taken after planning, or something
 * the accounting does not see) stops the gang, not counted against backoffLimit; the job is
 * planned again on what is free, and its next gang waits 5 s, doubling per refusal in a row up to
 * 5 min (the plan ConfigMap's annotation REC_ANN_UNSCHEDULABLE).
 *
 * Gang semantics: every pod carries the plan id and the gang attempt (annotations). A failed
 * worker (or a worker pod that vanished) bumps status.attempt and status.restarts first, then
 * stops the whole gang; the next gang resumes from the checkpoint. After spec.backoffLimit
 * restarts the job is Failed (reason BackoffLimitExceeded) and stays so.
 *
 * A job that cannot be planned (unknown model, no matching GPUs, an invalid profile, infeasible,
 * or planning longer than rec_config.plan_timeout_s) gets phase Failed with the reason: that is an
 * answer, not an error, and a change of the job or of the Nodes plans it again. Errors (-1) are
 * API failures: the caller retries later.
 *
 * Plans are made on the threads of rec_config.planner (planning.h), never on the caller's: a plan
 * not ready within a quarter of a second leaves the job saying it is being planned (condition
 * Planned False, reason Planning), and the pool's on_done asks the caller to reconcile it again. */
#ifndef CEPHALO_RECONCILE_H
#define CEPHALO_RECONCILE_H

#include <stdatomic.h>

#include "common/err.h"
#include "operator/client/cache.h"
#include "operator/inventory.h"
#include "operator/client/kube.h"
#include "operator/planning.h"

#define REC_API_VERSION "cephalo.dev/v1alpha1"
#define REC_LABEL_JOB "cephalo.dev/job"
#define REC_LABEL_RANK "cephalo.dev/rank"
#define REC_LABEL_COMPONENT "cephalo.dev/component"
#define REC_ANN_GENERATION "cephalo.dev/generation"
#define REC_ANN_INVENTORY "cephalo.dev/inventory" /* fingerprint of the usable GPUs planned on */
#define REC_ANN_PLAN_ID "cephalo.dev/plan-id"     /* g<generation>-<hash of plan.json> */
#define REC_ANN_ATTEMPT "cephalo.dev/attempt"     /* the gang attempt a pod belongs to */
#define REC_ANN_NOTES "cephalo.dev/plan-notes"    /* inventory notes (estimated products, ...) */
#define REC_ANN_PLANNED_AT "cephalo.dev/planned-at" /* when the plan was made: growth waits minReplanSeconds */
#define REC_ANN_UNSCHEDULABLE "cephalo.dev/unschedulable" /* "N TIME": N refusals in a row, next gang not before TIME */
#define REC_MASTER_PORT 29500
/* The longest CephaloJob name (the CRD's metadata.name maxLength, checked against it by
 * test_job_spec): the headless Service is named after the job, and its pods NAME-RANK (ranks up to
 * 4095) are host names, DNS labels of at most 63 characters. */
#define REC_NAME_MAX 52
#define REC_WORKER_UID 10001 /* the worker image's user (docker/Dockerfile.worker) */

#define REC_COMPONENT "cephalo-operator"

/* The watches' stores the reconcile reads (cache.h). */
typedef struct rec_caches {
    cache *jobs; /* CephaloJobs (the operator's namespace, or every one) */
    cache *pods; /* the jobs' pods: label cephalo.dev/job, every phase */
    cache *busy; /* pods that may hold GPUs, every namespace: not Succeeded or Failed */
    cache *nodes;
    cache *configmaps; /* label cephalo.dev/job: the plans */
    cache *services; /* label cephalo.dev/job: the workers' headless Services */
} rec_caches;
/* The stores, with what every reconcile reads of them made once per stored object (client-go's
 * transforms and indexers): the busy pods' digests (inv_pod_digest: node, owner, GPUs) and the
 * jobs' pods indexed by their job, "namespace/name" (rec_job_pods). */
rec_caches rec_caches_new(void);
void rec_caches_free(rec_caches *c);

/* A gang restarted after a worker failed waits as a Kubernetes Job's pods do: 10 s, doubling per
 * failure in a row up to 6 minutes; a gang that ran twice the longest wait starts the count again
 * (the defaults of --restart-backoff and --restart-backoff-max). */
#define REC_BACKOFF_FIRST_S 10.0
#define REC_BACKOFF_MAX_S 360.0

typedef struct rec_config {
    const rec_caches *caches; /* what exists (required) */
    const char *worker_image; /* --worker-image: used when spec.image is absent */
    const char *worker_pull_policy; /* --worker-image-pull-policy, or NULL */
    const char *profile_cm; /* --profile-configmap NAMESPACE/NAME: profiles for every job, or NULL */
    double scrape_timeout_s; /* per worker /metrics request (progress in the status); 0: 1 s */
    planning *planner; /* plans are made on its threads (planning.h); NULL: on the caller's */
    double plan_timeout_s; /* --plan-timeout: a plan that takes longer fails (PlanningTimeout); 0: none */
    const inv_archs *worker_archs; /* --worker-archs: GPUs the worker image runs; NULL: any */
    /* --restart-backoff, --restart-backoff-max: the wait before a gang restarted after a worker
     * failed, doubling per failure in a row up to the max (0, 0: REC_BACKOFF_FIRST_S, _MAX_S) */
    double backoff_first_s, backoff_max_s;
    /* Set to 1 while the API server refuses the operator's status writes (403: RBAC lacks
     * cephalojobs/status), back to 0 by the next accepted one: /readyz fails meanwhile, as the
     * jobs' phases would otherwise stay blank with nothing but a log line saying why. NULL: not kept. */
    atomic_int *status_denied;
} rec_config;

typedef struct rec_stats {
    long reconciles, errors, plans, plan_failures, pods_created, pods_deleted;
    long jobs_created, jobs_succeeded, jobs_failed, gang_restarts, replans, plan_timeouts;
    double requeue_s; /* out: reconcile again after this many seconds (progress, a restart); 0: on events only */
} rec_stats;

/* Adds src's counters to dst (requeue_s is not a counter: left alone). */
void rec_stats_add(rec_stats *dst, const rec_stats *src);

/* Reconciles namespace/name (a job that is gone is nothing to do). 0, or -1 with the error. */
int rec_job(kube_client *k, const rec_config *c, const char *ns, const char *name, rec_stats *st,
            err_t *err);
/* The same, creating a gang's pods at once over k and up to REC_MAX_HELPERS more clients (each
 * used by one thread; none of them used by anyone else meanwhile). */
#define REC_MAX_HELPERS 7
int rec_job_with(kube_client *k, kube_client *const *helpers, int n_helpers, const rec_config *c, const char *ns,
                 const char *name, rec_stats *st, err_t *err);

/* A leader's first look, once its stores are synced and before any reconcile: the gangs another
 * leader left half created (pods of the plan ConfigMap's current gang exist, none ended, ranks
 * missing) hold the GPUs of their missing ranks (assumed in the busy store), so that no job admitted
 * before them takes those; each is completed on its plan by its own reconcile. Reads only. */
void rec_hold_partial_gangs(const rec_config *c);

#endif
