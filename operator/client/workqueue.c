/* workqueue.c - keys to sync, each at most once, one worker per key at a time (workqueue.h). */
#include "operator/client/workqueue.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/str_map.h"

typedef struct wq_item {
    char key[WQ_KEY_MAX];
    double not_before; /* monotonic; 0: now */
    int failures;      /* in a row, before this one was added */
} wq_item;

struct wq {
    const char *what;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    wq_item *items; /* pending, unique keys */
    int n, cap;
    str_map at; /* key -> its index in items: a requeue of every job is not a scan per job */
    char (*busy)[WQ_KEY_MAX]; /* keys a worker syncs now: not handed out until wq's done */
    int n_busy, cap_busy;
};

wq *wq_new(const char *what) {
    wq *q = xcalloc(1, sizeof *q);
    q->what = what;
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    return q;
}

void wq_free(wq *q) {
    if (!q) return;
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
    free(q->items);
    free(q->busy);
    str_map_free(&q->at);
    free(q);
}

double wq_backoff_s(int failures) {
    double wait = WQ_RETRY_FIRST_S;
    for (int f = 1; f < failures && wait < WQ_RETRY_MAX_S; f++) wait *= 2;
    return wait < WQ_RETRY_MAX_S ? wait : WQ_RETRY_MAX_S;
}

/* ---- adding ---------------------------------------------------------------------------------- */

static void add_locked(wq *q, const char *key, double delay_s, int failures) {
    long i = str_map_get(&q->at, key);
    if (i >= 0) { /* the earlier time counts: a change beats a backoff, never the reverse */
        double due = delay_s > 0 ? clock_now_s() + delay_s : 0;
        if (due < q->items[i].not_before) q->items[i].not_before = due;
        return;
    }
    if (q->n == q->cap) {
        q->cap = q->cap ? 2 * q->cap : 16;
        q->items = xrealloc(q->items, (size_t)q->cap * sizeof *q->items);
    }
    wq_item *it = &q->items[q->n++];
    snprintf(it->key, sizeof it->key, "%s", key);
    str_map_put(&q->at, it->key, q->n - 1); /* as stored (a key fits in WQ_KEY_MAX) */
    it->not_before = delay_s > 0 ? clock_now_s() + delay_s : 0;
    it->failures = failures;
    pthread_cond_signal(&q->cv);
}

static void add(wq *q, const char *key, double delay_s, int failures) {
    pthread_mutex_lock(&q->mu);
    add_locked(q, key, delay_s, failures);
    pthread_mutex_unlock(&q->mu);
}

void wq_add(wq *q, const char *key) { add(q, key, 0, 0); }

void wq_add_after(wq *q, const char *key, double delay_s) { add(q, key, delay_s, 0); }

int wq_len(wq *q) {
    pthread_mutex_lock(&q->mu);
    int n = q->n;
    pthread_mutex_unlock(&q->mu);
    return n;
}

void wq_wake(wq *q) {
    pthread_mutex_lock(&q->mu);
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

/* ---- taking ---------------------------------------------------------------------------------- */

static bool busy_locked(const wq *q, const char *key) {
    for (int i = 0; i < q->n_busy; i++)
        if (!strcmp(q->busy[i], key)) return true;
    return false;
}

/* Takes item i: off the pending list, onto the busy one. */
static void take_locked(wq *q, int i, wq_item *out) {
    *out = q->items[i];
    str_map_del(&q->at, q->items[i].key);
    q->items[i] = q->items[--q->n];
    if (i < q->n) str_map_set(&q->at, q->items[i].key, i);
    if (q->n_busy == q->cap_busy) {
        q->cap_busy = q->cap_busy ? 2 * q->cap_busy : 16;
        q->busy = xrealloc(q->busy, (size_t)q->cap_busy * sizeof *q->busy);
    }
    memcpy(q->busy[q->n_busy++], out->key, WQ_KEY_MAX);
}

/* The first due key no worker syncs, taken: its index, or -1 with *next the earliest time one
 * may be due. */
static int due_locked(wq *q, double now, double *next) {
    for (int i = 0; i < q->n; i++) {
        if (busy_locked(q, q->items[i].key)) continue;
        if (q->items[i].not_before <= now) return i;
        if (q->items[i].not_before < *next) *next = q->items[i].not_before;
    }
    return -1;
}

/* Waits on the condition until `until` (monotonic) at the latest. */
static void wait_locked(wq *q, double now, double until) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double wait = until - now;
    ts.tv_sec += (time_t)wait;
    ts.tv_nsec += (long)((wait - (double)(time_t)wait) * 1e9);
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&q->cv, &q->mu, &ts);
}

/* Takes the next due key that no worker syncs, and marks it so (done ends that); waits at most
 * until `deadline` (monotonic). false: nothing due. */
static bool get(wq *q, double deadline, const atomic_int *stop, wq_item *out) {
    bool got = false;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        double now = clock_now_s(), next = deadline;
        int i = due_locked(q, now, &next);
        if (i >= 0) {
            take_locked(q, i, out);
            got = true;
            break;
        }
        if (now >= deadline || atomic_load(stop)) break;
        wait_locked(q, now, next > now + 1 ? now + 1 : next); /* the stop flag every second */
    }
    pthread_mutex_unlock(&q->mu);
    return got;
}

/* The worker is done with key: it may be handed out again. */
static void done(wq *q, const char *key) {
    pthread_mutex_lock(&q->mu);
    for (int i = 0; i < q->n_busy; i++)
        if (!strcmp(q->busy[i], key)) {
            memcpy(q->busy[i], q->busy[--q->n_busy], WQ_KEY_MAX);
            break;
        }
    pthread_cond_broadcast(&q->cv); /* a change that came meanwhile may be due */
    pthread_mutex_unlock(&q->mu);
}

/* ---- a worker -------------------------------------------------------------------------------- */

/* Adds the key again as its sync's result says: a failure after a backoff (unless stopping, when
 * the error is the stop's), a requeue after its delay. A success forgets the failures. */
static void requeue(wq *q, const wq_item *it, const wq_result *r, const atomic_int *stop) {
    if (r->failed) {
        if (atomic_load(stop)) return;
        double wait = wq_backoff_s(it->failures + 1);
        log_msg("warn", "%s %s failed (retry in %.1fs): %s", q->what, it->key, wait, r->err.msg);
        add(q, it->key, wait, it->failures + 1);
    } else if (r->requeue_after_s > 0) {
        add(q, it->key, r->requeue_after_s, 0);
    }
}

bool wq_process_next(wq *q, wq_sync_fn sync, void *arg, const atomic_int *stop) {
    wq_item it;
    if (atomic_load(stop)) return false;
    if (!get(q, clock_now_s() + 1, stop, &it)) return !atomic_load(stop);
    wq_result r = sync(it.key, arg);
    requeue(q, &it, &r, stop);
    done(q, it.key);
    return true;
}

void wq_run(wq *q, wq_sync_fn sync, void *arg, const atomic_int *stop) {
    while (wq_process_next(q, sync, arg, stop)) {
    }
}
