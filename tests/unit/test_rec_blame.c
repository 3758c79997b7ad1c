/* test_rec_blame.c - what the operator decides about a failed gang: the wait before the next one
 * (rec_restart_backoff), and which failed worker it blames (rec_blame_earlier): the
 * one that ended first; finishedAt has whole seconds, stamped when the kubelet sees the exit, so
 * stamps a second apart are a tie, and a tie goes to the death by signal (killed, out of memory)
 * rather than to the peer that exited on the broken collective after it. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>

#include "operator/rec_internal.h"

/* rec_blame_earlier on the pods' views (rec_view.c), as the gang reads them. */
static bool earlier(const cJSON *a, const cJSON *b) {
    rec_pod pa, pb;
    rec_pod_read(a, &pa);
    rec_pod_read(b, &pb);
    return rec_blame_earlier(&pa, &pb);
}

/* A failed pod whose container ended at finished_at with exit_code. */
static cJSON *failed_pod(const char *finished_at, int exit_code) {
    char json[512];
    snprintf(json, sizeof json,
             "{\"status\":{\"phase\":\"Failed\",\"containerStatuses\":[{\"name\":\"worker\",\"state\":"
             "{\"terminated\":{\"exitCode\":%d,\"finishedAt\":\"%s\"}}}]}}",
             exit_code, finished_at);
    cJSON *pod = cJSON_Parse(json);
    assert_non_null(pod);
    return pod;
}

static void test_earlier_second_wins(void **state) {
    (void)state;
    cJSON *a = failed_pod("2026-11-28T08:00:01Z", 1), *b = failed_pod("2026-11-28T08:00:05Z", 137);
    assert_true(earlier(a, b));
    assert_false(earlier(b, a));
    cJSON_Delete(a);
    cJSON_Delete(b);
}

static void test_signal_wins_a_tie(void **state) {
    (void)state;
    /* the peer's exit seen a moment before the second turned, the killed worker's just after */
    cJSON *peer = failed_pod("2026-11-28T08:00:01Z", 1), *killed = failed_pod("2026-11-28T08:00:02Z", 137);
    assert_true(earlier(killed, peer));
    assert_false(earlier(peer, killed));
    cJSON *same = failed_pod("2026-11-28T08:00:01Z", 137);
    assert_true(earlier(same, peer));
    assert_false(earlier(peer, same));
    cJSON_Delete(peer);
    cJSON_Delete(killed);
    cJSON_Delete(same);
}

static void test_two_exits_of_a_kind(void **state) {
    (void)state;
    cJSON *a = failed_pod("2026-11-28T08:00:01Z", 1), *b = failed_pod("2026-11-28T08:00:02Z", 1);
    assert_true(earlier(a, b));
    assert_false(earlier(b, a));
    cJSON_Delete(a);
    cJSON_Delete(b);
}

/* 10 s, 20, 40, ... up to 360 s while failures come in a row; back to 10 s once a gang ran twice
 * the longest wait (as long as 12 minutes); the first failure, or none before, waits 10 s. */
static void test_restart_backoff(void **state) {
    (void)state;
    const double first = 10, max = 360;
    double wait = rec_restart_backoff(0, 1e30, first, max), want[] = {10, 20, 40, 80, 160, 320, 360, 360};
    assert_true(wait == 10);
    for (int i = 1; i < 8; i++) {
        wait = rec_restart_backoff(wait, 30, first, max); /* each gang failed after 30 s */
        assert_true(wait == want[i]);
    }
    assert_true(rec_restart_backoff(360, 719, first, max) == 360); /* ran just under 12 min */
    assert_true(rec_restart_backoff(360, 720, first, max) == 10);  /* ran 12 min: the count starts again */
    assert_true(rec_restart_backoff(40, 1e30, first, max) == 10);  /* the gang's start unknown */
    assert_true(rec_restart_backoff(3, 1, 2, 4) == 4);              /* an operator's own first/max */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_restart_backoff),
        cmocka_unit_test(test_earlier_second_wins),
        cmocka_unit_test(test_signal_wins_a_tie),
        cmocka_unit_test(test_two_exits_of_a_kind),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
