/* controller.c - the reconcile workers and their counters (controller.h). */
#include "operator/controller.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"

const double ctl_buckets[CTL_N_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};

/* What every worker did, for /metrics. */
static pthread_mutex_t ctl_mu = PTHREAD_MUTEX_INITIALIZER;
static rec_stats ctl_totals;
static long ctl_counts[CTL_N_BUCKETS + 1]; /* per bucket, not cumulative */
static double ctl_sum_s;

/* One reconcile thread with its own API clients: k for the reconcile, helpers to create a gang's
 * pods at once (a new job's ConfigMap and Service on the last one, beside them). */
typedef struct ctl_worker {
    const rec_config *rc;
    wq *q;
    const atomic_int *stop;
    kube_client *k;
    kube_client *helpers[CTL_POD_HELPERS];
    int n_helpers;
    pthread_t th;
} ctl_worker;

struct ctl {
    ctl_worker w[CTL_MAX_WORKERS];
    int n;
};

void ctl_stats(rec_stats *s, long *counts, double *sum_s) {
    pthread_mutex_lock(&ctl_mu);
    *s = ctl_totals;
    memcpy(counts, ctl_counts, sizeof ctl_counts);
    *sum_s = ctl_sum_s;
    pthread_mutex_unlock(&ctl_mu);
}

static void observe(const rec_stats *delta, double s) {
    size_t b = 0;
    while (b < CTL_N_BUCKETS && s > ctl_buckets[b]) b++;
    pthread_mutex_lock(&ctl_mu);
    rec_stats_add(&ctl_totals, delta);
    ctl_counts[b]++;
    ctl_sum_s += s;
    pthread_mutex_unlock(&ctl_mu);
}

/* What a reconcile did, at info (creations, failures, restarts) and debug. */
static void log_reconcile(const char *key, const rec_stats *delta, double s) {
    log_msg("debug", "reconciled %s in %.0f ms", key, s * 1e3);
    if (delta->pods_created) log_msg("info", "%s: created %ld worker pods", key, delta->pods_created);
    if (delta->plan_failures) log_msg("info", "%s: cannot be planned (status Failed)", key);
    if (delta->gang_restarts) log_msg("info", "%s: a worker failed: restarting the gang", key);
    if (delta->replans) log_msg("info", "%s: re-planned: restarting the gang on the new plan", key);
}

/* The work queue's sync (workqueue.h): one reconcile of namespace/name, counted. An API error is
 * retried with backoff; a job that asks for it (progress, a restart) is reconciled again after
 * its delay. */
static wq_result sync_job(const char *key, void *arg) {
    ctl_worker *w = arg;
    wq_result r = {0};
    char ns[WQ_KEY_MAX];
    snprintf(ns, sizeof ns, "%s", key);
    char *slash = strchr(ns, '/');
    if (!slash) return r;
    *slash = '\0';
    rec_stats delta = {0};
    double t0 = clock_now_s();
    int rc = rec_job_with(w->k, w->helpers, w->n_helpers, w->rc, ns, slash + 1, &delta, &r.err);
    double s = clock_now_s() - t0;
    observe(&delta, s);
    if (rc < 0 && !kube_may_write(w->k)) {
        /* a write refused by the fence (kube.h): this replica no longer leads, and the reconcile
         * just stops - no error, no retry; the new leader carries on from what exists */
        log_msg("debug", "%s: reconcile stopped: %s", key, r.err.msg);
        return (wq_result){0};
    }
    r.failed = rc < 0;
    if (!r.failed) log_reconcile(key, &delta, s), r.requeue_after_s = delta.requeue_s;
    return r;
}

static void *worker_main(void *arg) {
    ctl_worker *w = arg;
    wq_run(w->q, sync_job, w, w->stop);
    return NULL;
}

static void worker_free(ctl_worker *w, bool own_k) {
    if (own_k && w->k) kube_client_free(w->k);
    for (int h = 0; h < w->n_helpers; h++) kube_client_free(w->helpers[h]);
}

/* Worker i's clients (worker 0 uses k), every one stopping with *stop. false: none for the
 * reconcile (err set). */
static bool worker_clients(ctl_worker *w, int i, kube_client *k, const kube_config *cfg, const atomic_int *stop,
                           err_t *err) {
    w->k = i == 0 ? k : kube_client_new(cfg, err);
    if (!w->k) return false;
    if (i > 0) kube_client_set_stop(w->k, stop);
    for (int h = 0; h < CTL_POD_HELPERS; h++) { /* without one, fewer pods at once */
        kube_client *hk = kube_client_new(cfg, err);
        if (!hk) break;
        kube_client_set_stop(hk, stop);
        w->helpers[w->n_helpers++] = hk;
    }
    return true;
}

/* Worker i with its clients, started; false (said, nothing of it left) when it could not be. */
static bool worker_start(ctl *c, int i, wq *q, const rec_config *rc, kube_client *k, const kube_config *cfg,
                         const atomic_int *stop) {
    ctl_worker *w = &c->w[i];
    err_t err = {{0}};
    *w = (ctl_worker){.rc = rc, .q = q, .stop = stop};
    bool have = worker_clients(w, i, k, cfg, stop, &err);
    if (have && pthread_create(&w->th, NULL, worker_main, w) == 0) return true;
    log_msg("error", "cannot start reconcile worker %d: %s", i + 1, have ? "no thread" : err.msg);
    worker_free(w, i > 0);
    return false;
}

ctl *ctl_start(wq *q, const rec_config *rc, kube_client *k, const kube_config *cfg, int n, atomic_int *stop,
               bool *failed) {
    ctl *c = xcalloc(1, sizeof *c);
    *failed = false;
    for (int i = 0; i < n && i < CTL_MAX_WORKERS && !atomic_load(stop); i++) {
        if (!worker_start(c, i, q, rc, k, cfg, stop)) {
            *failed = true;
            atomic_store(stop, 1);
            break;
        }
        c->n++;
    }
    return c;
}

void ctl_join(ctl *c) {
    if (!c) return;
    for (int i = 0; i < c->n; i++) {
        pthread_join(c->w[i].th, NULL);
        worker_free(&c->w[i], i > 0);
    }
    free(c);
}
