/* lease.h - leader election with a coordination.k8s.io/v1 Lease, as client-go's leaderelection:
 *
 *   spec: holderIdentity, leaseDurationSeconds, acquireTime, renewTime, leaseTransitions
 *
 * A candidate takes the Lease when it is absent, released (no holder), or expired; the holder
 * renews it every retry period. Every write is a PUT carrying the resourceVersion just read, so
 * two candidates cannot both win: the loser gets 409 Conflict and reads again.
 *
 * "Expired" is judged on our own monotonic clock, never by comparing the Lease's renewTime with
 * our wall clock (clocks of different nodes disagree): a record that has not changed for
 * leaseDurationSeconds since we first saw it is expired. A fresh candidate therefore waits one
 * lease duration before taking over from a crashed holder - unless the holder released it. */
#ifndef CEPHALO_LEASE_H
#define CEPHALO_LEASE_H

#include <stdatomic.h>
#include <stdbool.h>

#include "common/err.h"
#include "operator/kube.h"

typedef struct lease_opts {
    const char *namespace; /* NULL: the client's namespace */
    const char *name; /* e.g. "cephalo-operator" */
    const char *identity; /* unique per candidate, e.g. the pod name */
    int lease_duration_s; /* 0: 15 */
    int renew_deadline_s; /* 0: 10; a leader that cannot renew for this long stops leading */
    double retry_period_s; /* 0: 2 */
} lease_opts;

typedef struct lease_elector {
    kube_client *k;
    char *namespace, *name, *identity;
    int duration_s;
    double renew_deadline_s, retry_s;
    bool leader;
    double renewed_at; /* monotonic time of our last successful acquire or renew */
    /* the last record seen and when it last changed (monotonic) */
    char *observed; /* whole: a cut record would hide a renewal by a long-named holder */
    double observed_at;
    long transitions; /* leaseTransitions of the last record seen */
} lease_elector;

int lease_init(lease_elector *e, kube_client *k, const lease_opts *o, err_t *err);
void lease_free(lease_elector *e);

/* One acquire-or-renew attempt: 1 when we hold the Lease now, 0 when another candidate does (or
 * won a race), -1 with the error set when the API could not be asked (the caller retries; a
 * leader keeps leading until renew_deadline_s has passed without a successful renew). */
int lease_try(lease_elector *e, err_t *err);

/* Whether we lead: the last attempt won and the last successful renew is recent enough. */
bool lease_is_leader(const lease_elector *e);

/* Gives the Lease up (holder cleared) so that another candidate takes over at once. Nothing to do
 * when we are not the holder. */
int lease_release(lease_elector *e, err_t *err);

/* Campaigns and renews every retry period until *stop; `on_change(true)` when we start leading
 * and `on_change(false)` when we stop (lost the Lease, or stopping). Releases the Lease on the
 * way out. Returns 0 when stopped. */
int lease_run(lease_elector *e, const atomic_int *stop, void (*on_change)(bool leading, void *arg),
              void *arg, err_t *err);

#endif
