/* reconcile.h - one CephaloJob reconciled (DESIGN 8): inventory -> plan -> ConfigMap <job>-plan
 * with plan.json -> headless Service <job> -> one Pod <job>-<rank> per GPU -> status.
 *
 * Level-based and idempotent: every call looks at what exists and creates only what is missing,
 * so it may run any number of times for any change (or none). The plan is made once per
 * generation of the job and kept in the ConfigMap (annotation cephalo.dev/generation); later
 * calls read it from there, so a restarted operator never re-plans under running pods. A job
 * that cannot be planned (unknown model, no matching GPUs, infeasible) gets phase Failed and the
 * conditions Planned=False and Failed=True with the reason: that is an answer, not an error.
 * Errors (-1) are API failures: the caller retries later. */
#ifndef CEPHALO_RECONCILE_H
#define CEPHALO_RECONCILE_H

#include "err.h"
#include "kube.h"

#define REC_API_VERSION "cephalo.dev/v1alpha1"
#define REC_LABEL_JOB "cephalo.dev/job"
#define REC_LABEL_RANK "cephalo.dev/rank"
#define REC_LABEL_COMPONENT "cephalo.dev/component"
#define REC_ANN_GENERATION "cephalo.dev/generation"
#define REC_ANN_NOTES "cephalo.dev/plan-notes" /* inventory notes (estimated products, ...) */
#define REC_MASTER_PORT 29500
#define REC_COMPONENT "cephalo-operator"

typedef struct rec_config {
    const char *worker_image; /* --worker-image: used when spec.image is absent */
    const char *worker_pull_policy; /* --worker-image-pull-policy, or NULL */
} rec_config;

typedef struct rec_stats {
    long reconciles, errors, plans, plan_failures, pods_created;
} rec_stats;

/* Reconciles namespace/name (a job that is gone is nothing to do). 0, or -1 with the error. */
int rec_job(kube_client *k, const rec_config *c, const char *ns, const char *name, rec_stats *st,
            err_t *err);

#endif
