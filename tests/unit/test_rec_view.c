/* test_rec_view.c - the API's objects as one reconcile reads them (operator/rec_view.c): a worker
 * pod's fields (its plan and attempt, owner, phase, waiting and terminated states, the
 * scheduler's refusal), what is absent read as absent, and a stored status with its conditions. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "operator/rec_internal.h"

static cJSON *parse(const char *json) {
    cJSON *o = cJSON_Parse(json);
    assert_non_null(o);
    return o;
}

static void test_pod(void **state) {
    (void)state;
    cJSON *pod = parse("{\"metadata\":{\"name\":\"tiny-1\",\"namespace\":\"ml\",\"deletionTimestamp\":\"2026-11-28T08:00:09Z\","
                       "\"labels\":{\"cephalo.dev/job\":\"tiny\",\"cephalo.dev/rank\":\"1\"},"
                       "\"annotations\":{\"cephalo.dev/plan-id\":\"g1-abc\",\"cephalo.dev/attempt\":\"2\"},"
                       "\"ownerReferences\":[{\"kind\":\"ReplicaSet\",\"controller\":true,\"uid\":\"rs\"},"
                       "{\"kind\":\"CephaloJob\",\"controller\":true,\"uid\":\"u1\"}]},"
                       "\"spec\":{\"nodeName\":\"gpu-a\"},\"status\":{\"phase\":\"Failed\",\"podIP\":\"10.0.0.7\","
                       "\"containerStatuses\":[{\"state\":{\"terminated\":{\"exitCode\":137,\"reason\":\"OOMKilled\","
                       "\"finishedAt\":\"2026-11-28T08:00:01Z\"}}}]}}");
    rec_pod p;
    rec_pod_read(pod, &p);
    assert_string_equal(p.name, "tiny-1");
    assert_string_equal(p.ns, "ml");
    assert_string_equal(p.job, "tiny");
    assert_string_equal(p.rank, "1");
    assert_string_equal(p.plan_id, "g1-abc");
    assert_string_equal(p.attempt, "2");
    assert_string_equal(p.owner_uid, "u1"); /* the CephaloJob controller, not the first controller */
    assert_int_equal(p.phase, PHASE_FAILED);
    assert_string_equal(p.node, "gpu-a");
    assert_string_equal(p.ip, "10.0.0.7");
    assert_true(p.deleting);
    assert_string_equal(p.deletion, "2026-11-28T08:00:09Z");
    assert_true(p.terminated && p.exit_code == 137);
    assert_string_equal(p.term_reason, "OOMKilled");
    assert_string_equal(p.finished_at, "2026-11-28T08:00:01Z");
    assert_null(p.wait_reason);
    assert_false(p.unschedulable);
    rec_job_meta mine = {.uid = "u1"}, other = {.uid = "u2"};
    assert_true(rec_pod_owned(&p, &mine));
    assert_false(rec_pod_owned(&p, &other));
    cJSON_Delete(pod);
}

static void test_pending_pod(void **state) {
    (void)state;
    /* no phase yet: Pending; creating its container is no reason worth reporting */
    cJSON *pod = parse("{\"metadata\":{\"name\":\"tiny-0\"},\"status\":{\"containerStatuses\":[{\"state\":"
                       "{\"waiting\":{\"reason\":\"ContainerCreating\"}}}],\"conditions\":[{\"type\":\"PodScheduled\","
                       "\"status\":\"False\",\"reason\":\"Unschedulable\",\"message\":\"0/3 nodes are available.\"}]}}");
    rec_pod p;
    rec_pod_read(pod, &p);
    assert_int_equal(p.phase, PHASE_PENDING);
    assert_null(p.wait_reason);
    assert_null(p.node);
    assert_null(p.rank);
    assert_string_equal(p.plan_id, "");
    assert_null(p.owner_uid); /* no owner: anyone's (an object made by hand) */
    assert_false(p.deleting || p.terminated);
    assert_true(p.exit_code == -1);
    assert_true(p.unschedulable);
    assert_string_equal(p.sched_message, "0/3 nodes are available.");
    rec_job_meta job = {.uid = "u1"};
    assert_true(rec_pod_owned(&p, &job));
    cJSON_Delete(pod);
    pod = parse("{\"status\":{\"containerStatuses\":[{\"state\":{\"waiting\":{\"reason\":\"ImagePullBackOff\","
                "\"message\":\"no such image\"}}}]}}");
    rec_pod_read(pod, &p);
    assert_string_equal(p.wait_reason, "ImagePullBackOff");
    assert_string_equal(p.wait_message, "no such image");
    cJSON_Delete(pod);
}

static void test_status(void **state) {
    (void)state;
    cJSON *st = parse("{\"phase\":\"Failed\",\"message\":\"m\",\"attempt\":3,\"restarts\":2,\"step\":40,"
                      "\"startTime\":\"2026-11-28T08:00:00Z\",\"plan\":{\"id\":\"g1-abc\",\"estimated\":true},"
                      "\"conditions\":[{\"type\":\"Created\",\"status\":\"True\"},{\"type\":\"Failed\",\"status\":\"True\","
                      "\"reason\":\"BackoffLimitExceeded\",\"lastTransitionTime\":\"2026-11-28T08:01:00Z\"}]}");
    rec_status_view v;
    rec_status_read(st, &v);
    assert_int_equal(v.phase, PHASE_FAILED);
    assert_string_equal(v.message, "m");
    assert_int_equal(v.attempt, 3);
    assert_true(v.restarts == 2 && v.replans == 0);
    assert_true(v.step.have && v.step.v == 40);
    assert_false(v.ckpt_step.have || v.loss.have);
    assert_string_equal(v.start_time, "2026-11-28T08:00:00Z");
    assert_null(v.progress_time);
    assert_string_equal(v.plan_id, "g1-abc");
    assert_string_equal(v.plan_profile, "");
    assert_true(v.plan_estimated);
    assert_int_equal(v.n_conds, 2);
    const rec_cond *f = rec_cond_find(&v, "Failed");
    assert_non_null(f);
    assert_true(rec_cond_true(f));
    assert_string_equal(f->ltt, "2026-11-28T08:01:00Z");
    assert_null(rec_cond_find(&v, "Running"));
    assert_true(rec_terminal(&v));
    rec_status_view_free(&v);
    rec_status_read(NULL, &v); /* a new job: no status */
    assert_int_equal(v.phase, PHASE_NONE);
    assert_false(rec_terminal(&v));
    assert_int_equal(v.n_conds, 0);
    rec_status_view_free(&v);
    cJSON_Delete(st);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pod),
        cmocka_unit_test(test_pending_pod),
        cmocka_unit_test(test_status),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
