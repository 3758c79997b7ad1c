/* test_plan_view.c - plan.json as the operator reads it (operator/plan_view.h): every field it
 * uses, a plan older than per-rank recompute, and a plan edited by hand refused with the field
 * named instead of read as zeros. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "operator/plan_view.h"

#define RANK0 "{\"rank\":0,\"node\":\"gpu-a\",\"device\":\"L4\",\"batch\":8,\"microbatch\":4,\"microbatches\":2," \
              "\"recompute\":\"none\",\"state_ratio\":0.75,\"predicted\":{\"peak_bytes\":1.5e9}}"
#define RANK1 "{\"rank\":1,\"node\":\"gpu-b\",\"device\":\"A10G\",\"batch\":4,\"microbatch\":4,\"microbatches\":1," \
              "\"state_ratio\":0.25,\"predicted\":{\"peak_bytes\":2e9}}"
#define HEAD "\"format\":\"cephalo-plan\",\"inputs\":{\"strategy\":\"cephalo\"},\"feasible\":true," \
             "\"predicted\":{\"iter_ms\":120.5,\"samples_per_s\":99.25}"

static int parse(const char *json, plan_view *v, char *msg) {
    err_t err = {{0}};
    int rc = plan_view_parse("plan.json", json, strlen(json), v, &err);
    snprintf(msg, sizeof err.msg, "%s", err.msg);
    return rc;
}

static void test_reads_every_field(void **state) {
    (void)state;
    plan_view v;
    char msg[sizeof(err_t)];
    assert_int_equal(parse("{" HEAD ",\"ranks\":[" RANK0 "," RANK1 "]}", &v, msg), 0);
    assert_int_equal(v.world, 2);
    assert_string_equal(v.strategy, "cephalo");
    assert_true(v.iter_ms == 120.5 && v.samples_per_s == 99.25);
    assert_string_equal(v.ranks[0].node, "gpu-a");
    assert_string_equal(v.ranks[0].device, "L4");
    assert_true(v.ranks[0].batch == 8 && v.ranks[0].microbatch == 4 && v.ranks[0].microbatches == 2);
    assert_string_equal(v.ranks[0].recompute, "none");
    assert_true(v.ranks[0].state_ratio == 0.75 && v.ranks[0].peak_bytes == 1.5e9);
    assert_null(v.ranks[1].recompute); /* an older plan: the worker's default */
    assert_string_equal(v.ranks[1].device, "A10G");
    plan_view_free(&v);
    plan_view_free(&v); /* a freed view is a zeroed one */
}

/* A plan edited by hand: refused, naming the field; the view is left empty. */
static void refused(const char *json, const char *want) {
    plan_view v;
    char msg[sizeof(err_t)];
    assert_int_equal(parse(json, &v, msg), -1);
    if (!strstr(msg, want)) fail_msg("message '%s' does not name '%s'", msg, want);
    assert_int_equal(v.world, 0);
    assert_null(v.ranks);
    plan_view_free(&v);
}

static void test_refuses_hand_edits(void **state) {
    (void)state;
    refused("{" HEAD ",\"ranks\":[" RANK0 ",{\"node\":\"gpu-b\"}]}", "ranks[1]: missing field 'device'");
    refused("{" HEAD ",\"ranks\":[{\"node\":\"gpu-a\",\"device\":\"L4\",\"batch\":\"8\"}]}", "ranks[0].batch");
    refused("{" HEAD ",\"ranks\":[]}", "ranks has 0 entries");
    refused("{" HEAD "}", "missing field 'ranks'");
    refused("{\"format\":\"cephalo-plan\",\"inputs\":{\"strategy\":\"cephalo\"},\"ranks\":[" RANK0 "]}",
            "missing field 'predicted'");
    refused("{\"format\":\"other\"}", "format is not \"cephalo-plan\"");
    refused("{\"format\":\"cephalo-plan\",\"feasible\":false}", "feasible is not true");
    refused("[1]", "expected an object");
    refused("{" HEAD ",\"ranks\":[" RANK0 "x", "plan.json");
    char bad[1024];
    snprintf(bad, sizeof bad, "{" HEAD ",\"ranks\":[%s]}", RANK0);
    char *at = strstr(bad, "\"none\"");
    memcpy(at, "\"some\"", 6);
    refused(bad, "ranks[0].recompute is \"some\"");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reads_every_field),
        cmocka_unit_test(test_refuses_hand_edits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
