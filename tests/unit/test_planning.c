/* test_planning.c - plans off the operator's reconcile loop: the planner's time budget and
 * cancellation (plan_make_limited, the optimizer's deadline) on a plan that takes minutes
 * unbounded, and the planning pool (operator/planning.c): one task per key, a slow task not
 * holding up another key, a resubmission cancelling the old task, results kept until forgotten,
 * on_done, and freeing the pool while a task runs. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "operator/planning.h"
#include "planner/cluster.h"
#include "planner/cost.h"
#include "planner/model.h"
#include "planner/plan.h"

/* ---- the planner's budget ------------------------------------------------------------------- */

/* gpt-1.3b at batch 65536 on two L4s and an A10G: the state must be sharded unevenly, and the
 * optimizer's exact room DP (quadratic in the batch) runs for more than 40 s on 2 cores. */
static const char three_gpus[] = "nodes:\n"
                                 "  - {name: gpu-a, network_gbps: 50, gpus: [{type: L4, count: 2}]}\n"
                                 "  - {name: gpu-b, network_gbps: 50, gpus: [{type: A10G, count: 1}]}\n";

typedef struct planner_case {
    cluster cl;
    model_spec m;
    cost_model cm;
} planner_case;

static void case_build(planner_case *c, const char *model, int seq, int batch) {
    err_t err = {{0}};
    memset(c, 0, sizeof *c);
    assert_int_equal(cluster_load_string("three.yaml", three_gpus, strlen(three_gpus), &c->cl, &err), 0);
    assert_int_equal(model_resolve(model, &c->m, &err), 0);
    cost_opts co = {.mem_cap = 0.8};
    assert_int_equal(cost_build(&c->cm, &c->m, &c->cl, seq, batch, &co, &err), 0);
}

static void case_free(planner_case *c) {
    cost_free(&c->cm);
    cluster_free(&c->cl);
}

static void test_budget_exceeded(void **state) {
    (void)state;
    planner_case c;
    case_build(&c, "gpt-1.3b", 1024, 65536);
    plan p;
    err_t err = {{0}};
    /* the optimizer's reference mode (its room DP quadratic in the batch): without the budget this
     * returns 0 after minutes, on any machine (the fast path plans it in about 0.3 s, which a
     * quiet machine made within the budget) */
    setenv("CEPHALO_PLAN_EXHAUSTIVE_DP", "1", 1);
    int rc = plan_make_limited(&c.cm, STRAT_CEPHALO, 0.3, NULL, &p, &err);
    unsetenv("CEPHALO_PLAN_EXHAUSTIVE_DP");
    assert_int_equal(rc, 1);
    assert_non_null(strstr(err.msg, "planning exceeded its time budget of 0.3 s (global batch 65536 on 3 devices)"));
    assert_null(p.ranks); /* no plan, nothing to free */
    case_free(&c);
}

static void test_cancelled(void **state) {
    (void)state;
    planner_case c;
    case_build(&c, "gpt-1.3b", 1024, 65536);
    volatile int cancel = 1;
    plan p;
    err_t err = {{0}};
    assert_int_equal(plan_make_limited(&c.cm, STRAT_MB, 0, &cancel, &p, &err), 1);
    assert_non_null(strstr(err.msg, "planning was cancelled"));
    assert_int_equal(plan_make_limited(&c.cm, STRAT_CB, 0, &cancel, &p, &err), 1);
    case_free(&c);
}

/* A plan well within its budget is the same plan as without one. */
static void test_within_budget(void **state) {
    (void)state;
    planner_case c;
    case_build(&c, "gpt2-124m", 256, 48);
    err_t err = {{0}};
    for (int s = 0; s < STRAT_COUNT; s++) {
        plan a, b;
        assert_int_equal(plan_make(&c.cm, (strategy)s, &a, &err), 0);
        assert_int_equal(plan_make_limited(&c.cm, (strategy)s, 60, NULL, &b, &err), 0);
        assert_true(a.feasible == b.feasible && a.iter_ms == b.iter_ms && !b.expired);
        for (int i = 0; i < a.n_ranks; i++)
            assert_true(a.ranks[i].batch == b.ranks[i].batch && a.ranks[i].micro == b.ranks[i].micro);
        plan_free(&a);
        plan_free(&b);
    }
    case_free(&c);
}

/* ---- the pool ------------------------------------------------------------------------------- */

typedef struct task {
    int id;
    atomic_int release; /* a slow task runs until this is set, or it is cancelled */
    atomic_int ran, saw_cancel; /* set by the pool's thread, read by the test's */
} task;

/* what the workers report: tasks freed (and of those, cancelled ones), keys done */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int n_freed, n_freed_cancelled, n_done;
static char done_keys[16][PLANNING_KEY_MAX];

static int freed(void) {
    pthread_mutex_lock(&mu);
    int n = n_freed;
    pthread_mutex_unlock(&mu);
    return n;
}

static void run_task(void *t_, const volatile int *cancel) {
    task *t = t_;
    t->ran = 1;
    while (!t->release && !*cancel) nanosleep(&(struct timespec){0, 1000000L}, NULL);
    t->saw_cancel = *cancel;
}

static void free_task(void *t_) {
    task *t = t_;
    pthread_mutex_lock(&mu);
    n_freed++;
    n_freed_cancelled += t->saw_cancel;
    pthread_mutex_unlock(&mu);
    free(t);
}

static task *new_task(int id, bool slow) {
    task *t = calloc(1, sizeof *t);
    t->id = id;
    t->release = !slow;
    return t;
}

static void on_done(const char *key, void *arg) {
    (void)arg;
    pthread_mutex_lock(&mu);
    if (n_done < 16) strcpy(done_keys[n_done++], key);
    pthread_mutex_unlock(&mu);
}

static void wait_freed(int n) {
    for (int i = 0; i < 10000 && freed() < n; i++) nanosleep(&(struct timespec){0, 1000000L}, NULL);
}

/* on_done runs after the result is published (planning_wait may return first): wait for it */
static int wait_done(int n) {
    int got = 0;
    for (int i = 0; i < 10000; i++) {
        pthread_mutex_lock(&mu);
        got = n_done;
        pthread_mutex_unlock(&mu);
        if (got >= n) break;
        nanosleep(&(struct timespec){0, 1000000L}, NULL);
    }
    return got;
}

static void test_pool(void **state) {
    (void)state;
    err_t err = {{0}};
    assert_null(planning_new(0, NULL, NULL, &err));
    assert_non_null(strstr(err.msg, "1..64"));
    planning *p = planning_new(2, on_done, NULL, &err);
    assert_non_null(p);
    void *got = NULL;
    assert_int_equal(planning_get(p, "ns/slow", "g1", &got), PLANNING_NONE);

    /* a slow task on one worker; a quick one of another key finishes meanwhile */
    task *slow = new_task(1, true);
    planning_submit(p, "ns/slow", "g1", slow, run_task, free_task);
    assert_false(planning_wait(p, "ns/slow", 0.05));
    assert_int_equal(planning_get(p, "ns/slow", "g1", &got), PLANNING_BUSY);
    assert_int_equal(planning_get(p, "ns/slow", "g2", &got), PLANNING_NONE); /* another id */
    task *quick = new_task(2, false);
    planning_submit(p, "ns/quick", "g1", quick, run_task, free_task);
    assert_true(planning_wait(p, "ns/quick", 10));
    assert_int_equal(planning_get(p, "ns/quick", "g1", &got), PLANNING_DONE);
    assert_ptr_equal(got, quick);
    assert_int_equal(planning_get(p, "ns/slow", "g1", &got), PLANNING_BUSY);
    assert_int_equal(planning_busy(p), 1);

    /* a new id for the slow key cancels the running task; the pool frees it when it returns */
    task *slow2 = new_task(3, true);
    planning_submit(p, "ns/slow", "g2", slow2, run_task, free_task);
    wait_freed(1);
    assert_int_equal(freed(), 1);
    assert_int_equal(n_freed_cancelled, 1);
    assert_int_equal(planning_get(p, "ns/slow", "g2", &got), PLANNING_BUSY);
    slow2->release = 1;
    assert_true(planning_wait(p, "ns/slow", 10));
    assert_int_equal(planning_get(p, "ns/slow", "g2", &got), PLANNING_DONE);
    assert_false(((task *)got)->saw_cancel);

    /* results stay until forgotten; on_done named each finished key */
    assert_int_equal(planning_get(p, "ns/quick", "g1", &got), PLANNING_DONE);
    planning_forget(p, "ns/quick");
    assert_int_equal(freed(), 2);
    assert_int_equal(planning_get(p, "ns/quick", "g1", &got), PLANNING_NONE);
    assert_true(planning_wait(p, "ns/quick", 0)); /* nothing to wait for */
    assert_int_equal(wait_done(2), 2);
    pthread_mutex_lock(&mu);
    assert_int_equal(n_done, 2);
    assert_string_equal(done_keys[0], "ns/quick");
    assert_string_equal(done_keys[1], "ns/slow");
    pthread_mutex_unlock(&mu);

    /* freeing the pool cancels what runs and frees every task */
    task *last = new_task(4, true);
    planning_submit(p, "ns/last", "g1", last, run_task, free_task);
    for (int i = 0; i < 10000 && !last->ran; i++) nanosleep(&(struct timespec){0, 1000000L}, NULL);
    planning_free(p);
    assert_int_equal(freed(), 4);
    assert_int_equal(n_freed_cancelled, 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_budget_exceeded),
        cmocka_unit_test(test_cancelled),
        cmocka_unit_test(test_within_budget),
        cmocka_unit_test(test_pool),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
