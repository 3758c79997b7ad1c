/* test_pod_template.c - spec.template (operator/pod_template.h): what the operator owns is refused
 * with the field named, and a template merged into a worker pod keeps the operator's command,
 * GPU, placement and restricted defaults while adding the platform's fields. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "operator/pod_template.h"
#include "operator/quantity.h"

static cJSON *parse(const char *text) {
    cJSON *j = cJSON_Parse(text);
    if (!j) fail_msg("bad JSON in the test: %s", text);
    return j;
}

static void test_owned_refused(void **state) {
    (void)state;
    static const struct {
        const char *tmpl, *want;
    } cases[] = {
        {"{\"spec\":{\"containers\":[{\"name\":\"worker\",\"command\":[\"sh\"]}]}}",
         "spec.template.spec.containers[worker].command: owned by the operator"},
        {"{\"spec\":{\"containers\":[{\"name\":\"worker\",\"image\":\"x\"}]}}", "containers[worker].image: owned by the "
                                                                              "operator (use spec.image)"},
        {"{\"spec\":{\"containers\":[{\"name\":\"worker\",\"resources\":{\"limits\":{\"nvidia.com/gpu\":\"2\"}}}]}}",
         "containers[worker].resources.limits.nvidia.com/gpu: owned by the operator"},
        {"{\"spec\":{\"containers\":[{\"name\":\"worker\",\"env\":[{\"name\":\"CEPHALO_PLAN\",\"value\":\"x\"}]}]}}",
         "containers[worker].env.CEPHALO_PLAN: owned by the operator"},
        {"{\"spec\":{\"containers\":[{\"name\":\"worker\",\"env\":[{\"name\":\"MASTER_ADDR\",\"value\":\"x\"}]}]}}",
         "containers[worker].env.MASTER_ADDR: owned by the operator"},
        {"{\"spec\":{\"containers\":[{\"name\":\"worker\",\"volumeMounts\":[{\"name\":\"v\",\"mountPath\":\"/data\"}]}]}}",
         "volumeMounts[0].mountPath: '/data' is where the operator mounts its own volume"},
        {"{\"spec\":{\"volumes\":[{\"name\":\"plan\",\"emptyDir\":{}}]}}",
         "spec.template.spec.volumes[0].name: 'plan' is the operator's own volume"},
        {"{\"spec\":{\"nodeName\":\"n\"}}", "spec.template.spec.nodeName: owned by the operator"},
        {"{\"spec\":{\"nodeSelector\":{\"a\":\"b\"}}}", "spec.template.spec.nodeSelector: owned by the operator (use "
                                                       "spec.gpus.nodeSelector"},
        {"{\"spec\":{\"restartPolicy\":\"Always\"}}", "spec.template.spec.restartPolicy: owned by the operator"},
        {"{\"spec\":{\"hostNetwork\":true}}", "spec.template.spec.hostNetwork: not supported"},
        {"{\"spec\":{\"containers\":[{\"name\":\"log\"}]}}", "spec.template.spec.containers[log]: a sidecar needs an image"},
        {"{\"metadata\":{\"labels\":{\"cephalo.dev/job\":\"x\"}}}",
         "spec.template.metadata.labels.cephalo.dev/job: owned by the operator"},
        {"{\"metadata\":{\"name\":\"x\"}}", "spec.template.metadata.name: not supported"},
        {"{\"kind\":\"Pod\"}", "spec.template.kind: not supported"},
        {"[]", "spec.template: expected an object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        cJSON *t = parse(cases[i].tmpl);
        err_t err = {{0}};
        assert_int_equal(pod_template_check(t, &err), -1);
        if (!strstr(err.msg, cases[i].want)) fail_msg("case %zu: %s\nwanted: %s", i, err.msg, cases[i].want);
        cJSON_Delete(t);
    }
    err_t err;
    assert_int_equal(pod_template_check(NULL, &err), 0);
}

/* The operator's pod, as rec_pods.c builds it (the parts the merge touches). */
#define POD                                                                                                        \
    "{\"metadata\":{\"name\":\"j-0\",\"labels\":{\"cephalo.dev/job\":\"j\"},\"annotations\":{\"cephalo.dev/plan-id\":\"p\"}}," \
    "\"spec\":{\"affinity\":{\"nodeAffinity\":{\"requiredDuringSchedulingIgnoredDuringExecution\":{\"nodeSelectorTerms\":"  \
    "[{\"matchExpressions\":[{\"key\":\"kubernetes.io/hostname\",\"operator\":\"In\",\"values\":[\"h1\"]}]}]}}},"            \
    "\"tolerations\":[{\"key\":\"job\",\"operator\":\"Exists\"}],"                                                       \
    "\"securityContext\":{\"runAsNonRoot\":true,\"runAsUser\":10001},\"volumes\":[{\"name\":\"plan\"}],"                    \
    "\"containers\":[{\"name\":\"worker\",\"args\":[\"train\"],\"env\":[{\"name\":\"RANK\",\"value\":\"0\"}],"             \
    "\"resources\":{\"requests\":{\"nvidia.com/gpu\":\"1\"},\"limits\":{\"nvidia.com/gpu\":\"1\"}},"                       \
    "\"volumeMounts\":[{\"name\":\"plan\",\"mountPath\":\"/etc/cephalo\"}]}]}}"

static const char *str_at(const cJSON *o, const char *path) {
    char key[64];
    while (o && *path) {
        size_t n = strcspn(path, ".");
        snprintf(key, sizeof key, "%.*s", (int)n, path);
        o = (key[0] >= '0' && key[0] <= '9') ? cJSON_GetArrayItem(o, key[0] - '0') : cJSON_GetObjectItemCaseSensitive(o, key);
        path += n + (path[n] == '.');
    }
    return cJSON_IsString(o) ? o->valuestring : cJSON_IsTrue(o) ? "true" : cJSON_IsFalse(o) ? "false" : NULL;
}

static void test_merge(void **state) {
    (void)state;
    cJSON *pod = parse(POD), *t = parse(
        "{\"metadata\":{\"labels\":{\"team\":\"vision\"},\"annotations\":{\"note\":\"n\"}},"
        "\"spec\":{\"priorityClassName\":\"high\",\"imagePullSecrets\":[{\"name\":\"creds\"}],"
        "\"tolerations\":[{\"key\":\"gpu\",\"operator\":\"Exists\"}],"
        "\"affinity\":{\"nodeAffinity\":{\"requiredDuringSchedulingIgnoredDuringExecution\":{\"nodeSelectorTerms\":["
        "{\"matchExpressions\":[{\"key\":\"zone\",\"operator\":\"In\",\"values\":[\"a\"]}]},"
        "{\"matchExpressions\":[{\"key\":\"zone\",\"operator\":\"In\",\"values\":[\"b\"]}]}]}},"
        "\"podAntiAffinity\":{\"x\":1}},"
        "\"securityContext\":{\"fsGroup\":2000},\"volumes\":[{\"name\":\"shm\",\"emptyDir\":{}}],"
        "\"containers\":[{\"name\":\"worker\",\"resources\":{\"requests\":{\"cpu\":\"4\"},\"limits\":{\"memory\":\"32Gi\"}},"
        "\"env\":[{\"name\":\"NCCL_DEBUG\",\"value\":\"WARN\"}],\"volumeMounts\":[{\"name\":\"shm\",\"mountPath\":\"/dev/shm\"}]},"
        "{\"name\":\"log\",\"image\":\"fluent\"}]}}");
    err_t err;
    assert_int_equal(pod_template_check(t, &err), 0);
    pod_template_apply(t, pod);
    static const struct {
        const char *path, *want;
    } want[] = {
        {"metadata.labels.team", "vision"},
        {"metadata.annotations.note", "n"},           {"spec.priorityClassName", "high"},
        {"spec.imagePullSecrets.0.name", "creds"},    {"spec.automountServiceAccountToken", "false"},
        {"spec.tolerations.0.key", "job"},            {"spec.tolerations.1.key", "gpu"},
        {"spec.volumes.0.name", "plan"},
        {"spec.volumes.1.name", "shm"},               {"spec.containers.0.args.0", "train"},
        {"spec.containers.0.env.0.name", "RANK"},     {"spec.containers.0.env.1.name", "NCCL_DEBUG"},
        {"spec.containers.0.resources.requests.cpu", "4"}, {"spec.containers.0.resources.limits.memory", "32Gi"},
        {"spec.containers.0.volumeMounts.1.mountPath", "/dev/shm"}, {"spec.containers.1.name", "log"},
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        const char *got = str_at(pod, want[i].path);
        if (!got || strcmp(got, want[i].want))
            fail_msg("%s: %s, wanted %s", want[i].path, got ? got : "(none)", want[i].want);
    }
    const cJSON *sc = cJSON_GetObjectItem(cJSON_GetObjectItem(pod, "spec"), "securityContext");
    assert_int_equal(cJSON_GetObjectItem(sc, "fsGroup")->valueint, 2000); /* the template's, over the defaults */
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(sc, "runAsNonRoot")));   /* what it does not name stays */
    const cJSON *res = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(pod, "spec"), "containers"), 0), "resources");
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(res, "limits"), "nvidia.com/gpu")->valuestring, "1");
    assert_non_null(cJSON_GetObjectItem(cJSON_GetObjectItem(pod, "metadata"), "labels"));
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(pod, "metadata"), "labels"), "cephalo.dev/job")->valuestring, "j");
    /* the required node affinity: each template term ANDed with the planned host */
    const cJSON *terms = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(
        cJSON_GetObjectItem(pod, "spec"), "affinity"), "nodeAffinity"), "requiredDuringSchedulingIgnoredDuringExecution"),
        "nodeSelectorTerms");
    assert_int_equal(cJSON_GetArraySize(terms), 2);
    const char *zones[] = {"a", "b"};
    for (int i = 0; i < 2; i++) {
        const cJSON *ex = cJSON_GetObjectItem(cJSON_GetArrayItem(terms, i), "matchExpressions");
        assert_int_equal(cJSON_GetArraySize(ex), 2);
        assert_string_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(ex, 0), "values"), 0)->valuestring, zones[i]);
        assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(ex, 1), "key")->valuestring, "kubernetes.io/hostname");
    }
    assert_non_null(cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(pod, "spec"), "affinity"), "podAntiAffinity"));
    cJSON_Delete(t);
    cJSON_Delete(pod);
}

/* No template: the pod is the operator's, with no ServiceAccount token. */
/* Resource quantities as the API writes them, and the worker's memory limit the planner bounds
 * each rank's host offload pool by; a value that is no quantity is refused naming the field. */
static void test_quantities(void **state) {
    (void)state;
    static const struct {
        const char *text;
        double want;
    } good[] = {{"16Gi", 17179869184.0}, {"500M", 5e8}, {"2", 2}, {"250m", 0.25}, {"1.5Gi", 1610612736.0},
                {"1e9", 1e9}, {"128974848", 128974848}, {"129E-3", 0.129}, {"+3Ki", 3072}, {"0.5", 0.5}};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        double v = -1;
        err_t err;
        if (quantity_parse(good[i].text, &v, &err) < 0) fail_msg("%s: %s", good[i].text, err.msg);
        if (fabs(v - good[i].want) > 1e-12 * good[i].want) fail_msg("%s: %.17g, want %.17g", good[i].text, v, good[i].want);
    }
    static const char *const bad[] = {"", "Gi", "-1Gi", "16 Gi", "16gi", "16GB", "1.2.3", "1e", "1e99999", "0x10", "16Gi "};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        double v;
        err_t err;
        if (quantity_parse(bad[i], &v, &err) == 0) fail_msg("'%s' parsed as %g", bad[i], v);
        assert_non_null(strstr(err.msg, "expected a quantity"));
    }
    cJSON *t = parse("{\"spec\":{\"containers\":[{\"name\":\"side\",\"image\":\"s\",\"resources\":{\"limits\":"
                     "{\"memory\":\"1Gi\"}}},{\"name\":\"worker\",\"resources\":{\"requests\":{\"cpu\":\"4\","
                     "\"memory\":\"8Gi\"},\"limits\":{\"memory\":\"12Gi\"}}}]}}");
    err_t err;
    assert_int_equal(pod_template_check(t, &err), 0);
    assert_true(pod_template_memory_limit(t) == 12.0 * 1073741824); /* the worker's, not the sidecar's */
    cJSON_Delete(t);
    t = parse("{\"spec\":{\"containers\":[{\"name\":\"worker\",\"resources\":{\"requests\":{\"memory\":\"8Gi\"}}}]}}");
    assert_true(pod_template_memory_limit(t) == 0); /* a request is no limit */
    cJSON_Delete(t);
    assert_true(pod_template_memory_limit(NULL) == 0);
    t = parse("{\"spec\":{\"containers\":[{\"name\":\"worker\",\"resources\":{\"limits\":{\"memory\":\"12 GB\"}}}]}}");
    assert_int_equal(pod_template_check(t, &err), -1);
    assert_non_null(strstr(err.msg, "spec.template.spec.containers[worker].resources.limits.memory: '12 GB': expected a quantity"));
    cJSON_Delete(t);
    t = parse("{\"spec\":{\"containers\":[{\"name\":\"worker\",\"resources\":{\"requests\":[1]}}]}}");
    assert_int_equal(pod_template_check(t, &err), -1);
    assert_non_null(strstr(err.msg, "containers[worker].resources.requests: expected a map of quantities"));
    cJSON_Delete(t);
}

static void test_no_template(void **state) {
    (void)state;
    cJSON *pod = parse(POD), *before = cJSON_Duplicate(pod, true);
    pod_template_apply(NULL, pod);
    assert_string_equal(str_at(pod, "spec.automountServiceAccountToken"), "false");
    cJSON_DeleteItemFromObject(cJSON_GetObjectItem(pod, "spec"), "automountServiceAccountToken");
    assert_true(cJSON_Compare(pod, before, true));
    cJSON_Delete(before);
    cJSON_Delete(pod);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_owned_refused),
        cmocka_unit_test(test_merge),
        cmocka_unit_test(test_quantities),
        cmocka_unit_test(test_no_template),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
