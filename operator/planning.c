/* planning.c - the planning pool (planning.h): worker threads, one task per key. */
#include "operator/planning.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"

typedef enum { TASK_QUEUED, TASK_RUNNING, TASK_DONE } task_state;

typedef struct entry {
    char key[PLANNING_KEY_MAX], id[PLANNING_ID_MAX];
    void *task;
    planning_run_fn run;
    planning_free_fn free_fn;
    task_state st;
    /* set under mu, read by the running plan without it. volatile, not atomic_int: the planner
     * takes its cancel flag as `const volatile int *` (planner/plan.h, opt_problem.cancel); it
     * only ever goes from 0 to 1, and the planner looks at it between steps */
    volatile int cancel;
    bool orphan; /* dropped while it ran: off the list, the worker frees it when the run returns */
    struct entry *next;
} entry;

struct planning {
    pthread_mutex_t mu;
    pthread_cond_t work; /* a task was queued, or stop */
    pthread_cond_t done; /* a task finished (CLOCK_MONOTONIC, for planning_wait) */
    entry *head; /* queued, running and done tasks in submission order: the oldest runs first */
    bool stop;
    int n_threads;
    pthread_t *threads;
    planning_done_fn on_done;
    void *arg;
};

static void entry_free(entry *e) {
    if (e->free_fn) e->free_fn(e->task);
    free(e);
}

static entry *find_locked(planning *p, const char *key, entry ***link) {
    entry **l = &p->head;
    while (*l && strcmp((*l)->key, key)) l = &(*l)->next;
    if (link) *link = l;
    return *l;
}

/* Takes key's task off the list: freed at once, or, while a worker runs it, cancelled and left
 * for that worker to free. */
static void drop_locked(planning *p, const char *key) {
    entry **link, *e = find_locked(p, key, &link);
    if (!e) return;
    *link = e->next;
    if (e->st == TASK_RUNNING) {
        e->cancel = 1;
        e->orphan = true;
    } else {
        entry_free(e);
    }
}

static entry *next_queued_locked(planning *p) {
    for (entry *e = p->head; e; e = e->next)
        if (e->st == TASK_QUEUED) return e;
    return NULL;
}

static void *worker_main(void *arg) {
    planning *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        entry *e = NULL;
        while (!p->stop && !(e = next_queued_locked(p))) pthread_cond_wait(&p->work, &p->mu);
        if (p->stop) break;
        e->st = TASK_RUNNING;
        pthread_mutex_unlock(&p->mu);
        e->run(e->task, &e->cancel);
        pthread_mutex_lock(&p->mu);
        if (e->orphan) {
            entry_free(e);
            continue;
        }
        e->st = TASK_DONE;
        pthread_cond_broadcast(&p->done);
        char key[PLANNING_KEY_MAX];
        snprintf(key, sizeof key, "%s", e->key);
        bool tell = p->on_done && !p->stop;
        pthread_mutex_unlock(&p->mu);
        if (tell) p->on_done(key, p->arg); /* without the lock: it may take the caller's own */
        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

planning *planning_new(int workers, planning_done_fn on_done, void *arg, err_t *err) {
    if (workers < 1 || workers > 64) return err_set(err, "planning workers: expected 1..64, got %d", workers), NULL;
    planning *p = xcalloc(1, sizeof *p);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* waits measured like every other duration */
    pthread_cond_init(&p->done, &ca);
    pthread_condattr_destroy(&ca);
    p->on_done = on_done;
    p->arg = arg;
    p->threads = xcalloc((size_t)workers, sizeof *p->threads);
    for (int i = 0; i < workers; i++) {
        if (pthread_create(&p->threads[i], NULL, worker_main, p) != 0) {
            err_set(err, "cannot start planning thread %d of %d", i + 1, workers);
            planning_free(p);
            return NULL;
        }
        p->n_threads++;
    }
    return p;
}

void planning_free(planning *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    for (entry *e = p->head; e; e = e->next) e->cancel = 1;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    while (p->head) { /* no worker left: running tasks have returned, orphans are freed */
        entry *e = p->head;
        p->head = e->next;
        entry_free(e);
    }
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->mu);
    free(p->threads);
    free(p);
}

planning_state planning_get(planning *p, const char *key, const char *id, void **task) {
    pthread_mutex_lock(&p->mu);
    entry *e = find_locked(p, key, NULL);
    planning_state st = !e || strcmp(e->id, id) ? PLANNING_NONE : e->st == TASK_DONE ? PLANNING_DONE : PLANNING_BUSY;
    if (st == PLANNING_DONE && task) *task = e->task;
    pthread_mutex_unlock(&p->mu);
    return st;
}

void planning_submit(planning *p, const char *key, const char *id, void *task, planning_run_fn run,
                     planning_free_fn free_fn) {
    entry *e = xcalloc(1, sizeof *e);
    snprintf(e->key, sizeof e->key, "%s", key);
    snprintf(e->id, sizeof e->id, "%s", id);
    e->task = task;
    e->run = run;
    e->free_fn = free_fn;
    e->st = TASK_QUEUED;
    pthread_mutex_lock(&p->mu);
    drop_locked(p, key);
    entry **l = &p->head;
    while (*l) l = &(*l)->next;
    *l = e;
    pthread_cond_signal(&p->work);
    pthread_mutex_unlock(&p->mu);
}

bool planning_wait(planning *p, const char *key, double timeout_s) {
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    long ns = (long)(timeout_s * 1e9);
    until.tv_sec += ns / 1000000000L;
    until.tv_nsec += ns % 1000000000L;
    if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&p->mu);
    entry *e;
    int rc = 0;
    while ((e = find_locked(p, key, NULL)) && e->st != TASK_DONE && rc == 0)
        rc = pthread_cond_timedwait(&p->done, &p->mu, &until);
    bool done = !e || e->st == TASK_DONE;
    pthread_mutex_unlock(&p->mu);
    return done;
}

void planning_forget(planning *p, const char *key) {
    pthread_mutex_lock(&p->mu);
    drop_locked(p, key);
    pthread_mutex_unlock(&p->mu);
}

int planning_busy(planning *p) {
    int n = 0;
    pthread_mutex_lock(&p->mu);
    for (entry *e = p->head; e; e = e->next) n += e->st != TASK_DONE;
    pthread_mutex_unlock(&p->mu);
    return n;
}
