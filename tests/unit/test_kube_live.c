/* test_kube_live.c - the Kubernetes client against a real kube-apiserver: TLS verified against the
 * cluster CA, list namespaces, a ConfigMap's whole life (create, get, merge patch, conflict-retried
 * update, delete), counted Events, list+watch, and two candidates sharing a Lease; and a client
 * without the CA is refused.
 *
 * Runs only when CEPHALO_TEST_KUBECONFIG names a kubeconfig (tests/cli/test_kube_live.sh starts
 * tests/k8s/apiserver.sh and sets it); otherwise every test is skipped. A dedicated variable, not
 * KUBECONFIG: a developer's own cluster must never receive test objects by accident. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "operator/client/kube.h"
#include "operator/client/lease.h"
#include "operator/client/watch.h"

static kube_client *live_client(void) {
    const char *kc = getenv("CEPHALO_TEST_KUBECONFIG");
    if (!kc || !*kc) return NULL;
    kube_config cfg;
    err_t err;
    if (kube_config_load(kc, NULL, &cfg, &err) < 0) fail_msg("%s", err.msg);
    kube_client *k = kube_client_new(&cfg, &err);
    kube_config_free(&cfg);
    if (!k) fail_msg("%s", err.msg);
    return k;
}

#define NEED_CLIENT(k)            \
    kube_client *k = live_client(); \
    if (!k) {                     \
        skip();                   \
        return;                   \
    }

static void test_list_namespaces(void **state) {
    (void)state;
    NEED_CLIENT(k);
    cJSON *list;
    long status;
    err_t err;
    /* the API server's bootstrap controller creates "default" after it starts serving: on a
     * loaded machine that can take seconds, so the list is asked again for up to 30 s */
    bool found = false;
    for (int tries = 0; !found && tries < 300; tries++) {
        if (tries) nanosleep(&(struct timespec){0, 100 * 1000 * 1000}, NULL);
        if (kube_get(k, "/api/v1/namespaces", &list, &status, &err) < 0) fail_msg("%s", err.msg);
        const cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItem(list, "items")) {
            const char *name = kube_meta_str(it, "name");
            if (name && strcmp(name, "default") == 0) found = true;
        }
        cJSON_Delete(list);
    }
    assert_true(found);
    kube_client_free(k);

    /* without the cluster CA the server's certificate is refused: TLS is really verified */
    kube_config cfg;
    if (kube_config_load(getenv("CEPHALO_TEST_KUBECONFIG"), NULL, &cfg, &err) < 0)
        fail_msg("%s", err.msg);
    free(cfg.ca_file), free(cfg.ca_data);
    cfg.ca_file = cfg.ca_data = NULL;
    cfg.ca_len = 0;
    k = kube_client_new(&cfg, &err);
    kube_config_free(&cfg);
    assert_non_null(k);
    assert_int_equal(kube_get(k, "/api/v1/namespaces", &list, &status, &err), -1);
    assert_int_equal(status, 0);
    if (!strstr(err.msg, "certificate")) fail_msg("%s", err.msg);
    kube_client_free(k);
}

static int set_c(cJSON *obj, void *arg, err_t *err) {
    (void)arg, (void)err;
    cJSON *data = cJSON_GetObjectItem(obj, "data");
    if (cJSON_GetObjectItem(data, "c")) return 0;
    cJSON_AddStringToObject(data, "c", "3");
    return 1;
}

static void test_configmap_life(void **state) {
    (void)state;
    NEED_CLIENT(k);
    char name[64], path[KUBE_PATH_MAX], coll[KUBE_PATH_MAX];
    snprintf(name, sizeof name, "cephalo-live-%d", (int)getpid());
    err_t err;
    long status;
    cJSON *out;
    assert_int_equal(kube_path(path, sizeof path, "v1", kube_client_namespace(k), "configmaps",
                               name, &err), 0);
    assert_int_equal(kube_path(coll, sizeof coll, "v1", kube_client_namespace(k), "configmaps",
                               NULL, &err), 0);
    cJSON *cm = cJSON_CreateObject();
    cJSON_AddStringToObject(cm, "apiVersion", "v1");
    cJSON_AddStringToObject(cm, "kind", "ConfigMap");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(cm, "metadata"), "name", name);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(cm, "data"), "a", "1");
    if (kube_create(k, coll, cm, NULL, &status, &err) < 0) fail_msg("%s", err.msg);
    assert_int_equal(status, 201);
    assert_int_equal(kube_create(k, coll, cm, NULL, &status, &err), -1);
    assert_int_equal(status, 409);
    assert_non_null(strstr(err.msg, "already exists"));
    cJSON_Delete(cm);

    cJSON *patch = cJSON_Parse("{\"data\":{\"a\":null,\"b\":\"2\"}}");
    if (kube_merge_patch(k, path, patch, &out, &status, &err) < 0) fail_msg("%s", err.msg);
    cJSON_Delete(patch);
    const cJSON *data = cJSON_GetObjectItem(out, "data");
    assert_null(cJSON_GetObjectItem(data, "a"));
    assert_string_equal(cJSON_GetObjectItem(data, "b")->valuestring, "2");
    cJSON_Delete(out);

    /* a stale resourceVersion conflicts; the retrying update gets it right */
    cJSON *stale = cJSON_Parse("{\"apiVersion\":\"v1\",\"kind\":\"ConfigMap\",\"metadata\":{}}");
    cJSON_AddStringToObject(cJSON_GetObjectItem(stale, "metadata"), "name", name);
    cJSON_AddStringToObject(cJSON_GetObjectItem(stale, "metadata"), "resourceVersion", "1");
    assert_int_equal(kube_replace(k, path, stale, NULL, &status, &err), -1);
    assert_int_equal(status, 409);
    cJSON_Delete(stale);
    if (kube_update_retry(k, path, false, 3, set_c, NULL, &out, &status, &err) < 0)
        fail_msg("%s", err.msg);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(out, "data"), "c")->valuestring, "3");
    cJSON_Delete(out);

    kube_event ev = {.namespace = kube_client_namespace(k), .api_version = "v1",
                     .kind = "ConfigMap", .name = name, .type = "Normal", .reason = "Tested",
                     .message = "twice"};
    if (kube_event_emit(k, &ev, &err) < 0 || kube_event_emit(k, &ev, &err) < 0)
        fail_msg("%s", err.msg);
    char q[KUBE_PATH_MAX + 128];
    snprintf(q, sizeof q, "/api/v1/namespaces/%s/events?fieldSelector=involvedObject.name%%3D%s",
             kube_client_namespace(k), name);
    if (kube_get(k, q, &out, &status, &err) < 0) fail_msg("%s", err.msg);
    const cJSON *items = cJSON_GetObjectItem(out, "items");
    assert_int_equal(cJSON_GetArraySize(items), 1);
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(items, 0), "count")->valueint, 2);
    cJSON_Delete(out);

    if (kube_delete(k, path, &status, &err) < 0) fail_msg("%s", err.msg);
    assert_int_equal(kube_get(k, path, &out, &status, &err), -1);
    assert_int_equal(status, 404);
    kube_client_free(k);
}

typedef struct live_watch {
    kube_client *writer;
    char name[64];
    atomic_int stop;
    int lists;
    bool saw_added;
} live_watch;

/* After the first list, create the object the watch must then report. */
static int lw_list(const cJSON *items, const char *rv, void *arg, err_t *err) {
    (void)items, (void)rv;
    live_watch *w = arg;
    if (w->lists++ > 0) return 0;
    char coll[KUBE_PATH_MAX];
    if (kube_path(coll, sizeof coll, "v1", kube_client_namespace(w->writer), "configmaps", NULL,
                  err) < 0)
        return -1;
    cJSON *cm = cJSON_CreateObject();
    cJSON *md = cJSON_AddObjectToObject(cm, "metadata");
    cJSON_AddStringToObject(md, "name", w->name);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(md, "labels"), "cephalo-live", "watch");
    long status;
    int rc = kube_create(w->writer, coll, cm, NULL, &status, err);
    cJSON_Delete(cm);
    return rc;
}

static int lw_event(watch_type t, cJSON *obj, void *arg, err_t *err) {
    (void)err;
    live_watch *w = arg;
    if (t == WATCH_ADDED && strcmp(kube_meta_str(obj, "name"), w->name) == 0) {
        w->saw_added = true;
        atomic_store(&w->stop, 1);
    }
    cJSON_Delete(obj);
    return 0;
}

static void test_list_watch(void **state) {
    (void)state;
    NEED_CLIENT(k);
    live_watch w = {.writer = live_client()};
    snprintf(w.name, sizeof w.name, "cephalo-watch-%d", (int)getpid());
    char coll[KUBE_PATH_MAX], path[KUBE_PATH_MAX];
    err_t err;
    assert_int_equal(kube_path(coll, sizeof coll, "v1", kube_client_namespace(k), "configmaps",
                               NULL, &err), 0);
    watch_opts o = {.path = coll, .label_selector = "cephalo-live=watch", .timeout_seconds = 20,
                    .max_failures = 3, .stop = &w.stop};
    watch_handler h = {lw_list, lw_event, &w};
    watch_stats st;
    if (watch_run(k, &o, &h, &st, &err) < 0) fail_msg("%s", err.msg);
    assert_true(w.saw_added);
    assert_int_equal(st.lists, 1);
    assert_true(st.rv[0] != '\0');
    long status;
    assert_int_equal(kube_path(path, sizeof path, "v1", kube_client_namespace(k), "configmaps",
                               w.name, &err), 0);
    if (kube_delete(k, path, &status, &err) < 0) fail_msg("%s", err.msg);
    kube_client_free(w.writer);
    kube_client_free(k);
}

static void test_lease_two_candidates(void **state) {
    (void)state;
    NEED_CLIENT(ka);
    kube_client *kb = live_client();
    char name[64];
    snprintf(name, sizeof name, "cephalo-lease-%d", (int)getpid());
    lease_opts oa = {.name = name, .identity = "cand-a", .lease_duration_s = 15};
    lease_opts ob = oa;
    ob.identity = "cand-b";
    lease_elector a, b;
    err_t err;
    assert_int_equal(lease_init(&a, ka, &oa, &err), 0);
    assert_int_equal(lease_init(&b, kb, &ob, &err), 0);
    if (lease_try(&a, &err) != 1) fail_msg("a: %s", err.msg);
    assert_int_equal(lease_try(&b, &err), 0);
    assert_int_equal(lease_try(&a, &err), 1); /* renew */
    assert_int_equal(lease_try(&b, &err), 0);
    assert_true(lease_is_leader(&a));
    assert_false(lease_is_leader(&b));
    assert_int_equal(lease_release(&a, &err), 0);
    if (lease_try(&b, &err) != 1) fail_msg("b: %s", err.msg); /* released: b takes it at once */
    assert_int_equal(b.transitions, 1);
    assert_int_equal(lease_try(&a, &err), 0);
    assert_int_equal(lease_release(&b, &err), 0);
    char path[KUBE_PATH_MAX];
    long status;
    assert_int_equal(kube_path(path, sizeof path, "coordination.k8s.io/v1",
                               kube_client_namespace(ka), "leases", name, &err), 0);
    if (kube_delete(ka, path, &status, &err) < 0) fail_msg("%s", err.msg);
    lease_free(&a);
    lease_free(&b);
    kube_client_free(kb);
    kube_client_free(ka);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_list_namespaces),
        cmocka_unit_test(test_configmap_life),
        cmocka_unit_test(test_list_watch),
        cmocka_unit_test(test_lease_two_candidates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
