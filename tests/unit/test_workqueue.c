/* test_workqueue.c - the operator's work queue (operator/client/workqueue.h): a key pending once, a change
 * beating a backoff, the sync's result (retry with backoff, requeue after a delay, done), one
 * worker per key at a time, the stop flag. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "operator/client/workqueue.h"

/* A sync that records its calls and answers as told. */
typedef struct rec {
    atomic_int calls, running, overlapped;
    double at[8]; /* when each call began */
    bool fail;
    double requeue_s;
    double hold_s; /* how long a call takes */
} rec;

static wq_result rec_sync(const char *key, void *arg) {
    rec *r = arg;
    wq_result out = {0};
    int n = atomic_fetch_add(&r->calls, 1);
    if (n < 8) r->at[n] = clock_now_s();
    if (atomic_fetch_add(&r->running, 1) > 0) atomic_store(&r->overlapped, 1);
    if (r->hold_s > 0) nanosleep(&(struct timespec){0, (long)(r->hold_s * 1e9)}, NULL);
    atomic_fetch_sub(&r->running, 1);
    assert_string_equal(key, "ns/job");
    out.failed = r->fail;
    out.requeue_after_s = r->requeue_s;
    if (r->fail) err_set(&out.err, "the API is down");
    return out;
}

static void test_pending_once(void **state) {
    (void)state;
    wq *q = wq_new("sync");
    wq_add(q, "ns/job");
    wq_add(q, "ns/job");
    wq_add_after(q, "ns/other", 60);
    assert_int_equal(wq_len(q), 2);
    /* a change makes a later key due now */
    wq_add(q, "ns/other");
    atomic_int stop = 0;
    rec r = {0};
    double t0 = clock_now_s();
    assert_true(wq_process_next(q, rec_sync, &r, &stop)); /* ns/job, the first due */
    assert_int_equal(wq_len(q), 1);
    assert_true(clock_now_s() - t0 < 0.5);
    wq_free(q);
}

/* Adding a pending key again with a delay: the earlier time counts (a change let settle for a
 * moment is not held back by a resync due in a minute, nor pushed back by one). */
static void test_earlier_counts(void **state) {
    (void)state;
    wq *q = wq_new("sync");
    atomic_int stop = 0;
    rec r = {0};
    wq_add_after(q, "ns/job", 60);
    wq_add_after(q, "ns/job", 0.05); /* earlier: due then */
    assert_int_equal(wq_len(q), 1);
    assert_true(wq_process_next(q, rec_sync, &r, &stop)); /* waits up to 1 s for a due key */
    assert_int_equal(atomic_load(&r.calls), 1);
    wq_add_after(q, "ns/job", 0.05);
    wq_add_after(q, "ns/job", 60); /* later: keeps 0.05 */
    assert_true(wq_process_next(q, rec_sync, &r, &stop));
    assert_int_equal(atomic_load(&r.calls), 2);
    assert_int_equal(wq_len(q), 0);
    wq_free(q);
}

static void test_retry_backoff(void **state) {
    (void)state;
    assert_true(wq_backoff_s(1) == WQ_RETRY_FIRST_S);
    assert_true(wq_backoff_s(2) == 2 * WQ_RETRY_FIRST_S);
    assert_true(wq_backoff_s(7) == WQ_RETRY_MAX_S);
    assert_true(wq_backoff_s(100) == WQ_RETRY_MAX_S);
    wq *q = wq_new("sync");
    atomic_int stop = 0;
    rec r = {.fail = true};
    wq_add(q, "ns/job");
    assert_true(wq_process_next(q, rec_sync, &r, &stop));
    assert_int_equal(wq_len(q), 1); /* back, after its backoff */
    assert_true(wq_process_next(q, rec_sync, &r, &stop));
    assert_int_equal(atomic_load(&r.calls), 2);
    assert_true(r.at[1] - r.at[0] >= WQ_RETRY_FIRST_S - 0.05);
    /* a success forgets the failures, and done means done */
    r.fail = false;
    assert_true(wq_process_next(q, rec_sync, &r, &stop)); /* the second backoff: 1 s */
    assert_true(r.at[2] - r.at[1] >= 2 * WQ_RETRY_FIRST_S - 0.05);
    assert_int_equal(wq_len(q), 0);
    /* a failure while stopping is not retried */
    r.fail = true;
    wq_add(q, "ns/job");
    atomic_store(&stop, 1);
    assert_false(wq_process_next(q, rec_sync, &r, &stop));
    wq_free(q);
}

static void test_requeue_after(void **state) {
    (void)state;
    wq *q = wq_new("sync");
    atomic_int stop = 0;
    rec r = {.requeue_s = 0.2};
    wq_add(q, "ns/job");
    assert_true(wq_process_next(q, rec_sync, &r, &stop));
    assert_int_equal(wq_len(q), 1);
    r.requeue_s = 0;
    assert_true(wq_process_next(q, rec_sync, &r, &stop));
    assert_true(r.at[1] - r.at[0] >= 0.15);
    assert_int_equal(wq_len(q), 0);
    wq_free(q);
}

typedef struct worker_arg {
    wq *q;
    rec *r;
    atomic_int *stop;
} worker_arg;

static void *worker(void *arg) {
    worker_arg *a = arg;
    wq_run(a->q, rec_sync, a->r, a->stop);
    return NULL;
}

/* Two workers: a key changed while it is synced is synced again after, never twice at once. */
static void test_one_worker_per_key(void **state) {
    (void)state;
    wq *q = wq_new("sync");
    atomic_int stop = 0;
    rec r = {.hold_s = 0.2};
    worker_arg a = {q, &r, &stop};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&th[i], NULL, worker, &a), 0);
    wq_add(q, "ns/job");
    while (atomic_load(&r.calls) == 0) nanosleep(&(struct timespec){0, 1000000L}, NULL);
    wq_add(q, "ns/job"); /* a change while it is synced */
    double t0 = clock_now_s();
    while (atomic_load(&r.calls) < 2 && clock_now_s() - t0 < 3) nanosleep(&(struct timespec){0, 1000000L}, NULL);
    while (atomic_load(&r.running)) nanosleep(&(struct timespec){0, 1000000L}, NULL);
    atomic_store(&stop, 1);
    wq_wake(q);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    assert_int_equal(atomic_load(&r.calls), 2);
    assert_int_equal(atomic_load(&r.overlapped), 0);
    assert_true(r.at[1] - r.at[0] >= 0.19);
    wq_free(q);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pending_once),
        cmocka_unit_test(test_earlier_counts),
        cmocka_unit_test(test_retry_backoff),
        cmocka_unit_test(test_requeue_after),
        cmocka_unit_test(test_one_worker_per_key),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
