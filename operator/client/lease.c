/* lease.c - leader election on a coordination.k8s.io/v1 Lease (see lease.h for the rules). */
#include "operator/client/lease.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/strutil.h"

int lease_init(lease_elector *e, kube_client *k, const lease_opts *o, err_t *err) {
    memset(e, 0, sizeof *e);
    if (!o->name || !*o->name || !o->identity || !*o->identity)
        return err_set(err, "leader election: a lease name and an identity are required");
    e->k = k;
    e->namespace = xstrdup(o->namespace && *o->namespace ? o->namespace : kube_client_namespace(k));
    e->name = xstrdup(o->name);
    e->identity = xstrdup(o->identity);
    e->duration_s = o->lease_duration_s > 0 ? o->lease_duration_s : 15;
    e->renew_deadline_s = o->renew_deadline_s > 0 ? o->renew_deadline_s : 10;
    e->retry_s = o->retry_period_s > 0 ? o->retry_period_s : 2;
    e->clock = o->clock ? o->clock : clock_now_s;
    atomic_store(&e->valid_until, 0.0);
    if (e->renew_deadline_s >= e->duration_s)
        e->renew_deadline_s = e->duration_s * 2.0 / 3.0; /* stop leading before others may start */
    return 0;
}

void lease_free(lease_elector *e) {
    free(e->namespace);
    free(e->name);
    free(e->identity);
    free(e->observed);
    memset(e, 0, sizeof *e);
}

bool lease_is_leader(const lease_elector *e) {
    double until = atomic_load(&e->valid_until);
    return until > 0 && e->clock() < until;
}

bool lease_gate(void *elector) { return lease_is_leader(elector); }

static const char *spec_str(const cJSON *spec, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(spec, key);
    return cJSON_IsString(v) ? v->valuestring : "";
}

static long spec_long(const cJSON *spec, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(spec, key);
    return cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble < 1e15 ? (long)v->valuedouble
                                                                           : 0;
}

static void set_str(cJSON *obj, const char *key, const char *val) {
    cJSON_DeleteItemFromObjectCaseSensitive(obj, key);
    cJSON_AddStringToObject(obj, key, val);
}

static void set_num(cJSON *obj, const char *key, double val) {
    cJSON_DeleteItemFromObjectCaseSensitive(obj, key);
    cJSON_AddNumberToObject(obj, key, val);
}

/* The spec we write when taking or renewing: holder is us, renewTime now. */
static void fill_spec(const lease_elector *e, cJSON *spec, bool renewing, long transitions) {
    char now[40];
    kube_microtime_now(now, sizeof now);
    set_str(spec, "holderIdentity", e->identity);
    set_num(spec, "leaseDurationSeconds", e->duration_s);
    set_str(spec, "renewTime", now);
    if (!renewing) {
        set_str(spec, "acquireTime", now);
        set_num(spec, "leaseTransitions", (double)transitions);
    }
}

/* Our write that was sent at `sent` (our clock, taken before the request) succeeded: we lead
 * until sent + renew deadline. Not from the answer's arrival: the API server may have applied
 * the write, and standbys seen it, any time after it was sent. */
static int won(lease_elector *e, double sent) {
    e->leader = true;
    e->renewed_at = sent;
    atomic_store(&e->valid_until, sent + e->renew_deadline_s);
    /* our own write is a change of the record: the expiry clock restarts */
    free(e->observed);
    e->observed = xstrdup(e->identity);
    e->observed_at = sent;
    return 1;
}

static int lost(lease_elector *e) {
    atomic_store(&e->valid_until, 0.0);
    e->leader = false;
    return 0;
}

/* The record as the expiry clock compares it; a Lease that is missing is one too. */
#define LEASE_MISSING "\x01missing"

/* Restarts the expiry clock when the record differs from the one seen last. */
static void observe(lease_elector *e, char *record, double now) {
    if (e->observed && strcmp(record, e->observed) == 0) {
        free(record);
        return;
    }
    free(e->observed);
    e->observed = record;
    e->observed_at = now;
}

static int create_lease(lease_elector *e, const char *coll, err_t *err) {
    double sent;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "apiVersion", "coordination.k8s.io/v1");
    cJSON_AddStringToObject(o, "kind", "Lease");
    cJSON *md = cJSON_AddObjectToObject(o, "metadata");
    cJSON_AddStringToObject(md, "name", e->name);
    cJSON_AddStringToObject(md, "namespace", e->namespace);
    fill_spec(e, cJSON_AddObjectToObject(o, "spec"), false, 0);
    long status;
    sent = e->clock();
    int rc = kube_create(e->k, coll, o, NULL, &status, err);
    cJSON_Delete(o);
    if (rc == 0) {
        e->transitions = 0;
        return won(e, sent);
    }
    if (status == 409) return lost(e); /* another candidate created it first */
    return -1;
}

/* No Lease (404): whoever held it last may not know yet (deleted by hand while it leads), so it
 * is created only once it has been missing for a lease duration - at once by a candidate that
 * never saw one (the first start). Our own leadership ends here. */
static int lease_missing(lease_elector *e, const char *coll, err_t *err) {
    bool seen = e->observed != NULL;
    if (e->leader) log_warn("leader election: Lease %s/%s is gone: no longer leading", e->namespace, e->name);
    lost(e);
    double now = e->clock();
    observe(e, xstrdup(LEASE_MISSING), now);
    if (seen && now - e->observed_at < (double)e->duration_s) return 0;
    return create_lease(e, coll, err);
}

int lease_try(lease_elector *e, err_t *err) {
    char path[KUBE_PATH_MAX], coll[KUBE_PATH_MAX];
    if (kube_path(path, sizeof path, "coordination.k8s.io/v1", e->namespace, "leases", e->name,
                  err) < 0 ||
        kube_path(coll, sizeof coll, "coordination.k8s.io/v1", e->namespace, "leases", NULL,
                  err) < 0)
        return -1;
    cJSON *lease;
    long status;
    if (kube_get(e->k, path, &lease, &status, err) < 0)
        return status == 404 ? lease_missing(e, coll, err) : -1;
    cJSON *spec = cJSON_GetObjectItemCaseSensitive(lease, "spec");
    if (!cJSON_IsObject(spec)) {
        cJSON_DeleteItemFromObjectCaseSensitive(lease, "spec");
        spec = cJSON_AddObjectToObject(lease, "spec");
    }
    if (!spec || !kube_meta_str(lease, "resourceVersion")) {
        cJSON_Delete(lease);
        return err_set(err, "GET %s: not a Lease (no spec or resourceVersion)", path);
    }
    const char *holder = spec_str(spec, "holderIdentity");
    long transitions = spec_long(spec, "leaseTransitions");
    long duration = spec_long(spec, "leaseDurationSeconds");
    if (duration <= 0) duration = e->duration_s;
    double now = e->clock();
    bool mine = strcmp(holder, e->identity) == 0;
    if (!mine) {
        if (e->leader)
            log_warn("leader election: Lease %s/%s is held by %s: no longer leading", e->namespace,
                    e->name, *holder ? holder : "nobody");
        lost(e); /* whatever we decide below, the Lease is not ours now */
        observe(e, str_printf("%s|%s|%ld", holder, spec_str(spec, "renewTime"), duration), now);
    }
    e->transitions = transitions;
    if (*holder && !mine && now - e->observed_at < (double)duration) {
        cJSON_Delete(lease);
        return 0; /* held, and renewed within its duration as far as we can tell */
    }
    /* ours to renew, or free to take: write it with the resourceVersion we read */
    fill_spec(e, spec, mine, transitions + (mine ? 0 : 1));
    double sent = e->clock();
    int rc = kube_replace(e->k, path, lease, NULL, &status, err);
    cJSON_Delete(lease);
    if (rc == 0) {
        if (!mine) e->transitions = transitions + 1;
        return won(e, sent);
    }
    if (status == 409) return lost(e); /* someone wrote first; the next try reads again */
    return -1;
}

int lease_release(lease_elector *e, err_t *err) {
    if (!e->leader) return 0;
    lost(e); /* nothing of ours is written from here on */
    char path[KUBE_PATH_MAX];
    if (kube_path(path, sizeof path, "coordination.k8s.io/v1", e->namespace, "leases", e->name,
                  err) < 0)
        return -1;
    cJSON *lease;
    long status;
    if (kube_get(e->k, path, &lease, &status, err) < 0) return status == 404 ? 0 : -1;
    cJSON *spec = cJSON_GetObjectItemCaseSensitive(lease, "spec");
    if (!cJSON_IsObject(spec) || strcmp(spec_str(spec, "holderIdentity"), e->identity) != 0) {
        cJSON_Delete(lease);
        return 0; /* someone else holds it already */
    }
    /* as client-go: no holder, a 1 s duration, transitions kept */
    char now[40];
    kube_microtime_now(now, sizeof now);
    set_str(spec, "holderIdentity", "");
    set_num(spec, "leaseDurationSeconds", 1);
    set_str(spec, "renewTime", now);
    int rc = kube_replace(e->k, path, lease, NULL, &status, err);
    cJSON_Delete(lease);
    return rc == 0 || status == 409 ? 0 : -1;
}

static void sleep_until(double t, const atomic_int *stop) {
    while (!(stop && atomic_load(stop))) {
        double left = t - clock_now_s();
        if (left <= 0) return;
        if (left > 0.05) left = 0.05;
        struct timespec ts = {0, (long)(left * 1e9)};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
    }
}

int lease_run(lease_elector *e, const atomic_int *stop, void (*on_change)(bool leading, void *arg),
              void *arg, err_t *err) {
    bool leading = false;
    err_t tmp;
    if (!err) err = &tmp;
    while (!(stop && atomic_load(stop))) {
        double next = clock_now_s() + e->retry_s;
        if (lease_try(e, err) < 0) log_warn("leader election: %s", err->msg);
        bool now_leading = lease_is_leader(e);
        if (now_leading != leading) {
            leading = now_leading;
            if (on_change) on_change(leading, arg);
        }
        sleep_until(next, stop);
    }
    if (leading && on_change) on_change(false, arg);
    /* the stop flag that ended the loop would end the release's requests at once: release
     * without it, briefly (a standby takes over now instead of after the lease duration) */
    kube_client_set_stop(e->k, NULL);
    kube_client_set_timeout(e->k, 3);
    if (lease_release(e, err) < 0) {
        log_warn("leader election: release: %s", err->msg);
        return 0; /* the Lease expires on its own */
    }
    return 0;
}
