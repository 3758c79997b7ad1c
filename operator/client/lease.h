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
 * lease duration before taking over from a crashed holder - unless the holder released it. A
 * Lease that vanished (deleted by hand) counts the same: a candidate that saw one before creates
 * it only after it has been missing for a lease duration, since its last holder may not know yet.
 *
 * The fence (client-go's rule, kept by time rather than by attempts): we lead until
 *
 *   valid_until = (our clock when the last successful acquire or renew was SENT) + renew deadline
 *
 * and not a moment longer, whatever the election thread is doing (a renewal stuck in a slow
 * request, a process stopped by SIGSTOP). A standby waits a whole lease duration (more than the
 * renew deadline) from the moment it saw our last write, which came after we sent it, so our
 * fence closes before anyone may take over. Reading a Lease held by another identity, or none at
 * all, closes it at once. lease_gate is that rule as the API client's write gate (kube.h): no
 * write of the replica is sent outside it. */
#ifndef CEPHALO_LEASE_H
#define CEPHALO_LEASE_H

#include <stdatomic.h>
#include <stdbool.h>

#include "common/err.h"
#include "operator/client/kube.h"

typedef struct lease_opts {
    const char *namespace; /* NULL: the client's namespace */
    const char *name; /* e.g. "cephalo-operator" */
    const char *identity; /* unique per candidate, e.g. the pod name */
    int lease_duration_s; /* 0: 15 */
    int renew_deadline_s; /* 0: 10; a leader that cannot renew for this long stops leading */
    double retry_period_s; /* 0: 2 */
    double (*clock)(void); /* monotonic seconds; NULL: clock_now_s (tests pass a fake one) */
} lease_opts;

typedef struct lease_elector {
    kube_client *k;
    char *namespace, *name, *identity;
    int duration_s;
    double renew_deadline_s, retry_s;
    bool leader; /* the last attempt won (the election thread's own view) */
    double (*clock)(void);
    double renewed_at; /* our clock when the last successful acquire or renew was sent */
    /* renewed_at + renew_deadline_s while we lead, 0 once we do not: read by every thread that
     * writes (lease_gate), written by the election thread */
    _Atomic double valid_until;
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

/* Whether we lead now: the last attempt won and the renew deadline since the last successful
 * renewal was sent has not passed (by the clock, whether or not an attempt is under way). */
bool lease_is_leader(const lease_elector *e);
/* The same as a kube_gate_fn (arg: the elector), for kube_config.write_gate: safe from any
 * thread while the elector lives. */
bool lease_gate(void *elector);

/* Gives the Lease up (holder cleared) so that another candidate takes over at once. Nothing to do
 * when we are not the holder. */
int lease_release(lease_elector *e, err_t *err);

/* Campaigns and renews every retry period until *stop; `on_change(true)` when we start leading
 * and `on_change(false)` when we stop (lost the Lease, or stopping). Releases the Lease on the
 * way out. Returns 0 when stopped. */
int lease_run(lease_elector *e, const atomic_int *stop, void (*on_change)(bool leading, void *arg),
              void *arg, err_t *err);

#endif
