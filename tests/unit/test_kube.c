/* test_kube.c - the Kubernetes client: kubeconfig and in-cluster configuration (and one clear
 * message per kind of bad input), paths and timestamps, then requests against a scripted local
 * HTTP server: error messages, the token re-read after a 401, merge patch and the status
 * subresource, conflict retries, Events with counts, and leader election on a Lease; the inventory's
 * compute capabilities (GFD labels, --worker-archs) and GPU accounting (free GPUs: allocatable less the
 * GPU requests of the bound, non-terminal pods of others). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/fileio.h"
#include "common/log.h"
#include "fake_http.h"
#include "operator/inventory.h"
#include "operator/client/kube.h"
#include "operator/client/lease.h"

/* ---- kubeconfig ------------------------------------------------------------------------------ */

/* base64 of "CA PEM\n", "CERT PEM\n", "KEY PEM\n" */
#define CA64 "Q0EgUEVNCg=="
#define CERT64 "Q0VSVCBQRU0K"
#define KEY64 "S0VZIFBFTQo="

static const char KUBECONFIG[] =
    "apiVersion: v1\n"
    "kind: Config\n"
    "current-context: dev\n"
    "clusters:\n"
    "- name: prod-cluster\n"
    "  cluster:\n"
    "    server: https://prod.example:6443/\n"
    "    certificate-authority: certs/ca.pem\n"
    "- name: dev-cluster\n"
    "  cluster:\n"
    "    server: https://127.0.0.1:6443\n"
    "    certificate-authority-data: " CA64 "\n"
    "contexts:\n"
    "- name: prod\n"
    "  context: {cluster: prod-cluster, user: admin, namespace: training}\n"
    "- name: dev\n"
    "  context:\n"
    "    cluster: dev-cluster\n"
    "    user: dev-user\n"
    "users:\n"
    "- name: dev-user\n"
    "  user:\n"
    "    token: abc.def\n"
    "- name: admin\n"
    "  user:\n"
    "    client-certificate-data: " CERT64 "\n"
    "    client-key-data: " KEY64 "\n"
    "preferences: {}\n";

static void test_kubeconfig_current_context(void **state) {
    (void)state;
    kube_config c;
    err_t err;
    if (kube_config_parse("kc.yaml", "/etc/kube", KUBECONFIG, strlen(KUBECONFIG), NULL, &c, &err))
        fail_msg("%s", err.msg);
    assert_string_equal(c.server, "https://127.0.0.1:6443");
    assert_string_equal(c.namespace, "default");
    assert_string_equal(c.token, "abc.def");
    assert_int_equal(c.ca_len, 7);
    assert_memory_equal(c.ca_data, "CA PEM\n", 7);
    assert_null(c.ca_file);
    assert_null(c.cert_data);
    assert_null(c.token_file);
    kube_config_free(&c);
}

static void test_kubeconfig_named_context_client_cert(void **state) {
    (void)state;
    kube_config c;
    err_t err;
    if (kube_config_parse("kc.yaml", "/etc/kube", KUBECONFIG, strlen(KUBECONFIG), "prod", &c, &err))
        fail_msg("%s", err.msg);
    assert_string_equal(c.server, "https://prod.example:6443"); /* trailing '/' dropped */
    assert_string_equal(c.namespace, "training");
    assert_null(c.token);
    assert_string_equal(c.ca_file, "/etc/kube/certs/ca.pem"); /* relative to the kubeconfig */
    assert_int_equal(c.cert_len, 9);
    assert_memory_equal(c.cert_data, "CERT PEM\n", 9);
    assert_int_equal(c.key_len, 8);
    assert_memory_equal(c.key_data, "KEY PEM\n", 8);
    kube_config_free(&c);
}

static void test_kubeconfig_files(void **state) {
    (void)state;
    char dir[] = "/tmp/cephalo-kc-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/config", dir);
    const char *text = "current-context: x\n"
                       "clusters: [{name: c, cluster: {server: 'http://localhost:8080'}}]\n"
                       "contexts: [{name: x, context: {cluster: c, user: u, namespace: ns1}}]\n"
                       "users: [{name: u, user: {tokenFile: tok, client-certificate: /abs/c.pem,"
                       " client-key: k.pem}}]\n";
    err_t err;
    assert_int_equal(file_write_atomic(path, text, strlen(text), 0, &err), 0);
    kube_config c;
    if (kube_config_load(path, NULL, &c, &err) < 0) fail_msg("%s", err.msg);
    char want[300];
    snprintf(want, sizeof want, "%s/tok", dir);
    assert_string_equal(c.token_file, want);
    assert_string_equal(c.cert_file, "/abs/c.pem");
    snprintf(want, sizeof want, "%s/k.pem", dir);
    assert_string_equal(c.key_file, want);
    assert_string_equal(c.namespace, "ns1");
    assert_string_equal(c.source, path);
    kube_config_free(&c);
    unlink(path);
    rmdir(dir);
}

/* `text` must be refused with a message containing `needle`. */
static void expect_kc_error(const char *text, const char *context, const char *needle) {
    kube_config c;
    err_t err = {{0}};
    int rc = kube_config_parse("kc.yaml", NULL, text, strlen(text), context, &c, &err);
    if (rc != -1 || !strstr(err.msg, needle))
        fail_msg("rc %d, message \"%s\"; wanted \"%s\"", rc, err.msg, needle);
    assert_null(c.server);
}

static void test_kubeconfig_errors(void **state) {
    (void)state;
    expect_kc_error("clusters: []\n", NULL, "kc.yaml:1: kubeconfig: missing field 'current-context'");
    expect_kc_error(KUBECONFIG, "staging", "kc.yaml:14: contexts: no entry named 'staging'");
    expect_kc_error("current-context: a\ncontexts:\n- name: a\n  context: {user: u}\n", NULL,
                    "kc.yaml:4: contexts[0].context: missing field 'cluster'");
    expect_kc_error("current-context: a\ncontexts: [{name: a, context: {cluster: c}}]\n", NULL,
                    "kc.yaml:1: kubeconfig: missing field 'clusters'");
    expect_kc_error("current-context: a\ncontexts: [{name: a, context: {cluster: c}}]\n"
                    "clusters:\n- name: c\n  cluster:\n    certificate-authority-data: " CA64 "\n",
                    NULL, "kc.yaml:6: clusters[0].cluster: missing field 'server'");
    expect_kc_error("current-context: a\ncontexts: [{name: a, context: {cluster: c}}]\n"
                    "clusters: [{name: c, cluster: {server: 'ftp://x'}}]\n",
                    NULL, "kc.yaml:3: clusters[0].cluster.server: server 'ftp://x' is not an http(s) URL");
    /* found by fuzz/fuzz_kubeconfig.c: "https://" was accepted as the server "https:" */
    expect_kc_error("current-context: a\ncontexts: [{name: a, context: {cluster: c}}]\n"
                    "clusters: [{name: c, cluster: {server: 'https://'}}]\n",
                    NULL, "kc.yaml:3: clusters[0].cluster.server: server 'https://' has no host (expected http(s)://HOST[:PORT])");
    expect_kc_error("current-context: a\ncontexts: [{name: a, context: {cluster: c}}]\n"
                    "clusters: [{name: c, cluster: {server: 'http:///api'}}]\n",
                    NULL, "server 'http:///api' has no host");
    expect_kc_error("current-context: a\ncontexts: [{name: a, context: {cluster: c}}]\n"
                    "clusters: [{name: c, cluster: {server: 'https://x',\n"
                    "  certificate-authority-data: 'not base64!'}}]\n",
                    NULL, "kc.yaml:4: clusters[0].cluster.certificate-authority-data: not valid base64");
    expect_kc_error("current-context: a\ncontexts: [{name: a, context: {cluster: c}}]\n"
                    "clusters: [{name: c, cluster: {server: 'https://x',\n"
                    "  insecure-skip-tls-verify: true}}]\n",
                    NULL, "kc.yaml:4: clusters[0].cluster.insecure-skip-tls-verify: refused");
    const char *base = "current-context: a\n"
                       "contexts: [{name: a, context: {cluster: c, user: u}}]\n"
                       "clusters: [{name: c, cluster: {server: 'https://x'}}]\n";
    char text[1024];
    snprintf(text, sizeof text, "%susers:\n- name: u\n  user:\n    exec: {command: aws}\n", base);
    expect_kc_error(text, NULL, "kc.yaml:7: users[0].user.exec: not supported");
    snprintf(text, sizeof text, "%susers:\n- name: u\n  user:\n    client-certificate-data: " CERT64
                                "\n",
             base);
    expect_kc_error(text, NULL, "kc.yaml:7: users[0].user: missing field 'client-key-data'");
    snprintf(text, sizeof text, "%susers: [{name: v, user: {token: t}}]\n", base);
    expect_kc_error(text, NULL, "kc.yaml:4: users: no entry named 'u'");
    expect_kc_error("current-context: [a]\n", NULL, "kc.yaml:1: current-context: expected a scalar");
    expect_kc_error("a: [\n", NULL, "kc.yaml:");
}

static void write_file(const char *dir, const char *name, const char *text) {
    char p[300];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    err_t err;
    if (file_write_atomic(p, text, strlen(text), 0, &err) < 0) fail_msg("%s", err.msg);
}

static void test_in_cluster(void **state) {
    (void)state;
    char dir[] = "/tmp/cephalo-sa-XXXXXX";
    assert_non_null(mkdtemp(dir));
    err_t err;
    kube_config c;
    assert_int_equal(kube_config_in_cluster_at(dir, NULL, "443", &c, &err), -1);
    assert_non_null(strstr(err.msg, "KUBERNETES_SERVICE_HOST is not set"));
    assert_int_equal(kube_config_in_cluster_at(dir, "10.0.0.1", "443", &c, &err), -1);
    assert_non_null(strstr(err.msg, "in-cluster config: service account token: "));
    assert_non_null(strstr(err.msg, "/token: cannot open"));
    write_file(dir, "token", "tok-1\n");
    assert_int_equal(kube_config_in_cluster_at(dir, "10.0.0.1", "443", &c, &err), -1);
    assert_non_null(strstr(err.msg, "in-cluster config: cluster CA: "));
    write_file(dir, "ca.crt", "CA PEM\n");
    if (kube_config_in_cluster_at(dir, "fd00::1", "443", &c, &err) < 0) fail_msg("%s", err.msg);
    assert_string_equal(c.server, "https://[fd00::1]:443");
    assert_string_equal(c.namespace, "default"); /* no namespace file */
    assert_int_equal(c.ca_len, 7);
    assert_null(c.token); /* read by the client, and again as it rotates */
    assert_non_null(strstr(c.token_file, "/token"));
    kube_config_free(&c);
    write_file(dir, "namespace", "cephalo-system\n");
    assert_int_equal(kube_config_in_cluster_at(dir, "10.0.0.1", "6443", &c, &err), 0);
    assert_string_equal(c.server, "https://10.0.0.1:6443");
    assert_string_equal(c.namespace, "cephalo-system");
    kube_config_free(&c);
    /* kube_config_in_cluster: the service account directory from $CEPHALO_SERVICEACCOUNT_DIR
     * (tests/k8s/kubelet.py's pods), the standard one when it is unset or empty */
    setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1", 1);
    setenv("KUBERNETES_SERVICE_PORT", "6443", 1);
    setenv(KUBE_SA_DIR_ENV, dir, 1);
    if (kube_config_in_cluster(&c, &err) < 0) fail_msg("%s", err.msg);
    assert_string_equal(c.server, "https://127.0.0.1:6443");
    assert_string_equal(c.namespace, "cephalo-system");
    assert_int_equal(strncmp(c.token_file, dir, strlen(dir)), 0);
    kube_config_free(&c);
    setenv(KUBE_SA_DIR_ENV, "", 1);
    if (kube_config_in_cluster(&c, &err) == 0) { /* only where a real pod's directory exists */
        assert_string_equal(c.token_file, KUBE_SA_DIR "/token");
        kube_config_free(&c);
    } else {
        assert_non_null(strstr(err.msg, KUBE_SA_DIR "/token"));
    }
    unsetenv(KUBE_SA_DIR_ENV);
    unsetenv("KUBERNETES_SERVICE_HOST");
    unsetenv("KUBERNETES_SERVICE_PORT");
    const char *names[] = {"token", "ca.crt", "namespace"};
    for (int i = 0; i < 3; i++) {
        char p[300];
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        unlink(p);
    }
    rmdir(dir);
}

static void test_paths_and_times(void **state) {
    (void)state;
    char p[KUBE_PATH_MAX];
    err_t err;
    assert_int_equal(kube_path(p, sizeof p, "v1", "ns", "configmaps", "plan", &err), 0);
    assert_string_equal(p, "/api/v1/namespaces/ns/configmaps/plan");
    assert_int_equal(kube_path(p, sizeof p, "v1", NULL, "nodes", NULL, &err), 0);
    assert_string_equal(p, "/api/v1/nodes");
    assert_int_equal(kube_path(p, sizeof p, "coordination.k8s.io/v1", "kube-system", "leases",
                               "op", &err), 0);
    assert_string_equal(p, "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/op");
    assert_int_equal(kube_path(p, sizeof p, "cephalo.dev/v1alpha1", "", "cephalojobs", NULL, &err), 0);
    assert_string_equal(p, "/apis/cephalo.dev/v1alpha1/cephalojobs");
    assert_int_equal(kube_path(p, sizeof p, "v1", "ns", "pods", "a/../b", &err), -1);
    assert_string_equal(err.msg, "invalid name 'a/../b'");
    assert_int_equal(kube_path(p, sizeof p, "v1", "n s", "pods", NULL, &err), -1);

    double t;
    assert_true(kube_time_parse("1970-01-01T00:00:00Z", &t) && t == 0);
    assert_true(kube_time_parse("2024-03-01T12:30:15Z", &t) && t == 1709296215);
    assert_true(kube_time_parse("2024-03-01T12:30:15.250000Z", &t) && t == 1709296215.25);
    assert_true(kube_time_parse("2024-03-01T14:30:15+02:00", &t) && t == 1709296215);
    assert_false(kube_time_parse("2024-03-01 12:30:15Z", &t));
    assert_false(kube_time_parse("2024-03-01T12:30:15", &t));
    assert_false(kube_time_parse("2024-13-01T12:30:15Z", &t));
    char now[40];
    kube_microtime_now(now, sizeof now);
    assert_int_equal(strlen(now), 27);
    assert_true(kube_time_parse(now, &t) && t > 1.7e9);
    kube_time_now(now, sizeof now);
    assert_int_equal(strlen(now), 20);
}

/* ---- requests against a scripted server -------------------------------------------------------- */

static kube_client *client_for(const fake_server *srv, const char *token, const char *token_file) {
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", srv->port);
    kube_config cfg = {.server = url, .namespace = (char *)"ns", .token = (char *)token,
                       .token_file = (char *)token_file};
    err_t err;
    kube_client *k = kube_client_new(&cfg, &err);
    if (!k) fail_msg("%s", err.msg);
    return k;
}

static void finish(fake_server *srv, int want_served) {
    int served = fake_join(srv);
    if (srv->mismatch[0]) fail_msg("%s", srv->mismatch);
    assert_int_equal(served, want_served);
}

#define CM_PATH "/api/v1/namespaces/ns/configmaps/plan"

static void test_errors_and_verbs(void **state) {
    (void)state;
    static const fake_step script[] = {
        {"GET", CM_PATH, 404,
         "{\"kind\":\"Status\",\"status\":\"Failure\",\"message\":\"configmaps \\\"plan\\\" not "
         "found\",\"reason\":\"NotFound\",\"code\":404}", 0, false},
        {"POST", "/api/v1/namespaces/ns/configmaps", 201, "{\"metadata\":{\"name\":\"plan\"}}", 0,
         false},
        {"PATCH", CM_PATH, 200, "{\"metadata\":{\"name\":\"plan\"},\"data\":{\"b\":\"2\"}}", 0,
         false},
        {"PATCH", "/apis/cephalo.dev/v1alpha1/namespaces/ns/cephalojobs/j/status", 200, "{}", 0,
         false},
        {"PUT", "/apis/cephalo.dev/v1alpha1/namespaces/ns/cephalojobs/j/status", 200, "{}", 0,
         false},
        {"DELETE", CM_PATH "?propagationPolicy=Background", 200, "{}", 0, false},
        {"GET", CM_PATH, 502, "<html>bad gateway</html>", 0, false},
        {"GET", CM_PATH, 200, "{not json", 0, false},
    };
    fake_server srv;
    assert_int_equal(fake_start(&srv, script, 8), 0);
    kube_client *k = client_for(&srv, "sekrit", NULL);
    err_t err;
    long status;
    cJSON *out;
    char url[128];
    snprintf(url, sizeof url, "GET http://127.0.0.1:%d" CM_PATH, srv.port);

    assert_int_equal(kube_get(k, CM_PATH, &out, &status, &err), -1);
    assert_int_equal(status, 404);
    assert_null(out);
    char want[512];
    snprintf(want, sizeof want, "%s: HTTP 404 (NotFound): configmaps \"plan\" not found", url);
    assert_string_equal(err.msg, want);

    cJSON *cm = cJSON_Parse("{\"apiVersion\":\"v1\",\"kind\":\"ConfigMap\","
                            "\"metadata\":{\"name\":\"plan\"},\"data\":{\"a\":\"1\"}}");
    assert_int_equal(kube_create(k, "/api/v1/namespaces/ns/configmaps", cm, &out, &status, &err), 0);
    assert_int_equal(status, 201);
    assert_string_equal(kube_meta_str(out, "name"), "plan");
    cJSON_Delete(out);
    cJSON_Delete(cm);

    cJSON *patch = cJSON_Parse("{\"data\":{\"a\":null,\"b\":\"2\"}}");
    assert_int_equal(kube_merge_patch(k, CM_PATH, patch, NULL, &status, &err), 0);
    assert_int_equal(kube_merge_patch_status(k, "/apis/cephalo.dev/v1alpha1/namespaces/ns/cephalojobs/j",
                                             patch, NULL, &status, &err), 0);
    assert_int_equal(kube_replace_status(k, "/apis/cephalo.dev/v1alpha1/namespaces/ns/cephalojobs/j",
                                         patch, NULL, &status, &err), 0);
    cJSON_Delete(patch);
    assert_int_equal(kube_delete(k, CM_PATH, &status, &err), 0);

    assert_int_equal(kube_get(k, CM_PATH, &out, &status, &err), -1);
    assert_int_equal(status, 502);
    snprintf(want, sizeof want, "%s: HTTP 502: <html>bad gateway</html>", url);
    assert_string_equal(err.msg, want);
    assert_int_equal(kube_get(k, CM_PATH, &out, &status, &err), -1);
    assert_int_equal(status, 200);
    assert_non_null(strstr(err.msg, "HTTP 200 but the body is not JSON"));
    kube_client_free(k);
    finish(&srv, 8);

    assert_non_null(strstr(srv.head[0], "Authorization: Bearer sekrit"));
    assert_non_null(strstr(srv.head[0], "Accept: application/json"));
    assert_non_null(strstr(srv.head[1], "Content-Type: application/json"));
    assert_non_null(strstr(srv.body[1], "\"kind\":\"ConfigMap\""));
    assert_non_null(strstr(srv.head[2], "Content-Type: application/merge-patch+json"));
    assert_string_equal(srv.body[2], "{\"data\":{\"a\":null,\"b\":\"2\"}}");
    assert_non_null(strstr(srv.head[3], "Content-Type: application/merge-patch+json"));

    /* nobody listening: status 0 and the URL in the message */
    kube_client *dead = client_for(&srv, NULL, NULL);
    assert_int_equal(kube_get(dead, CM_PATH, &out, &status, &err), -1);
    assert_int_equal(status, 0);
    assert_non_null(strstr(err.msg, url));
    kube_client_free(dead);
}

static void test_token_reread_after_401(void **state) {
    (void)state;
    char dir[] = "/tmp/cephalo-tok-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char tok[300];
    snprintf(tok, sizeof tok, "%s/token", dir);
    write_file(dir, "token", "old-token\n");
    static const fake_step script[] = {
        {"GET", CM_PATH, 401, "{\"kind\":\"Status\",\"message\":\"Unauthorized\"}", 0, false},
        {"GET", CM_PATH, 200, "{}", 0, false},
        {"GET", CM_PATH, 401, "{\"kind\":\"Status\",\"message\":\"Unauthorized\"}", 0, false},
        {"GET", CM_PATH, 401, "{\"kind\":\"Status\",\"message\":\"Unauthorized\"}", 0, false},
    };
    fake_server srv;
    assert_int_equal(fake_start(&srv, script, 4), 0);
    kube_client *k = client_for(&srv, NULL, tok);
    write_file(dir, "token", "new-token\n"); /* the kubelet rotated it */
    err_t err;
    long status;
    cJSON *out = NULL;
    if (kube_get(k, CM_PATH, &out, &status, &err) < 0) fail_msg("%s", err.msg);
    cJSON_Delete(out);
    /* a 401 with the fresh token is an answer, not a reason to loop */
    assert_int_equal(kube_get(k, CM_PATH, &out, &status, &err), -1);
    assert_int_equal(status, 401);
    assert_non_null(strstr(err.msg, "HTTP 401: Unauthorized"));
    kube_client_free(k);
    finish(&srv, 4);
    assert_non_null(strstr(srv.head[0], "Authorization: Bearer old-token"));
    assert_non_null(strstr(srv.head[1], "Authorization: Bearer new-token"));
    unlink(tok);
    rmdir(dir);
}

static int bump_replicas(cJSON *obj, void *arg, err_t *err) {
    int *calls = arg;
    (*calls)++;
    cJSON *data = cJSON_GetObjectItem(obj, "data");
    if (!data) return err_set(err, "no data");
    cJSON_DeleteItemFromObject(data, "n");
    cJSON_AddStringToObject(data, "n", "2");
    return 1;
}

static void test_update_retry_on_conflict(void **state) {
    (void)state;
    static const char CONFLICT[] =
        "{\"kind\":\"Status\",\"reason\":\"Conflict\",\"code\":409,\"message\":\"Operation cannot be "
        "fulfilled on configmaps \\\"plan\\\": the object has been modified\"}";
    static const fake_step script[] = {
        {"GET", CM_PATH, 200, "{\"metadata\":{\"name\":\"plan\",\"resourceVersion\":\"1\"},\"data\":{\"n\":\"1\"}}", 0, false},
        {"PUT", CM_PATH, 409, CONFLICT, 0, false},
        {"GET", CM_PATH, 200, "{\"metadata\":{\"name\":\"plan\",\"resourceVersion\":\"2\"},\"data\":{\"n\":\"1\"}}", 0, false},
        {"PUT", CM_PATH, 200, "{\"metadata\":{\"name\":\"plan\",\"resourceVersion\":\"3\"},\"data\":{\"n\":\"2\"}}", 0, false},
    };
    fake_server srv;
    assert_int_equal(fake_start(&srv, script, 4), 0);
    kube_client *k = client_for(&srv, NULL, NULL);
    int calls = 0;
    cJSON *out;
    long status;
    err_t err;
    if (kube_update_retry(k, CM_PATH, false, 3, bump_replicas, &calls, &out, &status, &err) < 0)
        fail_msg("%s", err.msg);
    assert_int_equal(calls, 2);
    assert_string_equal(kube_meta_str(out, "resourceVersion"), "3");
    cJSON_Delete(out);
    kube_client_free(k);
    finish(&srv, 4);
    assert_non_null(strstr(srv.body[1], "\"resourceVersion\":\"1\""));
    assert_non_null(strstr(srv.body[3], "\"resourceVersion\":\"2\""));
    assert_non_null(strstr(srv.body[3], "\"n\":\"2\""));

    /* an update that keeps conflicting gives up after its attempts */
    static const fake_step busy[] = {
        {"GET", CM_PATH, 200, "{\"metadata\":{\"resourceVersion\":\"1\"},\"data\":{}}", 0, false},
        {"PUT", CM_PATH "/status", 409, CONFLICT, 0, false},
        {"GET", CM_PATH, 200, "{\"metadata\":{\"resourceVersion\":\"2\"},\"data\":{}}", 0, false},
        {"PUT", CM_PATH "/status", 409, CONFLICT, 0, false},
        {"GET", CM_PATH, 403, "{\"kind\":\"Status\",\"message\":\"forbidden\"}", 0, false},
    };
    assert_int_equal(fake_start(&srv, busy, 5), 0);
    k = client_for(&srv, NULL, NULL);
    calls = 0;
    assert_int_equal(kube_update_retry(k, CM_PATH, true, 2, bump_replicas, &calls, NULL, &status, &err), -1);
    assert_int_equal(status, 409);
    assert_non_null(strstr(err.msg, "gave up after 2 conflicting updates"));
    assert_non_null(strstr(err.msg, "the object has been modified"));
    /* other errors are not retried */
    assert_int_equal(kube_update_retry(k, CM_PATH, true, 5, bump_replicas, &calls, NULL, &status, &err), -1);
    assert_int_equal(status, 403);
    assert_int_equal(calls, 2);
    kube_client_free(k);
    finish(&srv, 5);
}

static void test_events_counted(void **state) {
    (void)state;
    static const fake_step script[] = {
        {"POST", "/api/v1/namespaces/ns/events", 201, "{}", 0, false},
        {"PATCH", NULL, 200, "{}", 0, false}, /* path checked below: it carries the name */
        {"POST", "/api/v1/namespaces/ns/events", 201, "{}", 0, false},
        {"PATCH", NULL, 404, "{\"kind\":\"Status\",\"message\":\"gone\"}", 0, false},
        {"POST", "/api/v1/namespaces/ns/events", 201, "{}", 0, false},
    };
    fake_server srv;
    assert_int_equal(fake_start(&srv, script, 5), 0);
    kube_client *k = client_for(&srv, NULL, NULL);
    kube_event ev = {.namespace = "ns", .api_version = "cephalo.dev/v1alpha1", .kind = "CephaloJob",
                     .name = "j1", .uid = "u-1", .type = "Normal", .reason = "Planned",
                     .message = "8 ranks, 412 ms/iteration"};
    err_t err;
    assert_int_equal(kube_event_emit(k, &ev, &err), 0);
    assert_int_equal(kube_event_emit(k, &ev, &err), 0); /* the same again: count 2 */
    kube_event other = ev;
    other.type = "Warning";
    other.reason = "WorkerFailed";
    other.message = "rank 3 exited with 1";
    assert_int_equal(kube_event_emit(k, &other, &err), 0);
    assert_int_equal(kube_event_emit(k, &other, &err), 0); /* Event gone: made anew */
    other.type = "Loud";
    assert_int_equal(kube_event_emit(k, &other, &err), -1);
    assert_non_null(strstr(err.msg, "type must be Normal or Warning"));
    kube_client_free(k);
    finish(&srv, 5);
    cJSON *e = cJSON_Parse(srv.body[0]);
    assert_non_null(e);
    const cJSON *inv = cJSON_GetObjectItem(e, "involvedObject");
    assert_string_equal(cJSON_GetObjectItem(inv, "kind")->valuestring, "CephaloJob");
    assert_string_equal(cJSON_GetObjectItem(inv, "uid")->valuestring, "u-1");
    assert_string_equal(cJSON_GetObjectItem(inv, "namespace")->valuestring, "ns");
    assert_string_equal(cJSON_GetObjectItem(e, "reason")->valuestring, "Planned");
    assert_string_equal(cJSON_GetObjectItem(e, "type")->valuestring, "Normal");
    assert_int_equal(cJSON_GetObjectItem(e, "count")->valueint, 1);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(e, "source"), "component")->valuestring,
                        "cephalo-operator");
    char want[300];
    snprintf(want, sizeof want, "PATCH /api/v1/namespaces/ns/events/%s HTTP/1.1", kube_meta_str(e, "name"));
    assert_non_null(strstr(srv.head[1], want));
    assert_non_null(strstr(srv.head[1], "application/merge-patch+json"));
    assert_non_null(strstr(srv.body[1], "\"count\":2"));
    assert_non_null(strstr(srv.body[1], "\"lastTimestamp\""));
    cJSON_Delete(e);
    assert_non_null(strstr(srv.body[4], "\"reason\":\"WorkerFailed\""));
    assert_non_null(strstr(srv.body[4], "\"count\":1"));
}

/* ---- leader election ------------------------------------------------------------------------- */

#define LEASES "/apis/coordination.k8s.io/v1/namespaces/ns/leases"
#define LEASE LEASES "/cephalo-operator"
#define LEASE_OBJ(rv, holder, renew, transitions)                                                \
    "{\"apiVersion\":\"coordination.k8s.io/v1\",\"kind\":\"Lease\",\"metadata\":{\"name\":"      \
    "\"cephalo-operator\",\"resourceVersion\":\"" rv "\"},\"spec\":{\"holderIdentity\":\"" holder \
    "\",\"leaseDurationSeconds\":15,\"renewTime\":\"" renew "\",\"leaseTransitions\":" transitions "}}"

static void test_lease_election(void **state) {
    (void)state;
    static const fake_step script[] = {
        /* absent: create it */
        {"GET", LEASE, 404, "{\"kind\":\"Status\",\"code\":404}", 0, false},
        {"POST", LEASES, 201, "{}", 0, false},
        /* renew our own */
        {"GET", LEASE, 200, LEASE_OBJ("5", "pod-a", "2024-01-01T00:00:00.000000Z", "0"), 0, false},
        {"PUT", LEASE, 200, "{}", 0, false},
        /* someone else holds it, freshly observed: keep out */
        {"GET", LEASE, 200, LEASE_OBJ("9", "pod-b", "2024-01-01T00:01:00.000000Z", "1"), 0, false},
        /* unchanged for a lease duration (the test moves our observation back): take it, but
         * pod-c wins the race (409); the next try reads pod-c's fresh record and keeps out */
        {"GET", LEASE, 200, LEASE_OBJ("9", "pod-b", "2024-01-01T00:01:00.000000Z", "1"), 0, false},
        {"PUT", LEASE, 409, "{\"kind\":\"Status\",\"code\":409,\"message\":\"conflict\"}", 0, false},
        {"GET", LEASE, 200, LEASE_OBJ("10", "pod-c", "2024-01-01T00:02:00.000000Z", "2"), 0, false},
        /* released by its holder (no holder): take it at once */
        {"GET", LEASE, 200, LEASE_OBJ("11", "", "2024-01-01T00:03:00.000000Z", "2"), 0, false},
        {"PUT", LEASE, 200, "{}", 0, false},
        /* release on shutdown */
        {"GET", LEASE, 200, LEASE_OBJ("12", "pod-a", "2024-01-01T00:03:00.000000Z", "3"), 0, false},
        {"PUT", LEASE, 200, "{}", 0, false},
    };
    int n = (int)(sizeof script / sizeof *script);
    fake_server srv;
    assert_int_equal(fake_start(&srv, script, n), 0);
    kube_client *k = client_for(&srv, NULL, NULL);
    lease_elector e;
    err_t err;
    lease_opts o = {.name = "cephalo-operator", .identity = "pod-a"};
    assert_int_equal(lease_init(&e, k, &o, &err), 0);
    assert_false(lease_is_leader(&e));
    assert_int_equal(lease_try(&e, &err), 1);
    assert_true(lease_is_leader(&e));
    assert_int_equal(lease_try(&e, &err), 1);
    assert_int_equal(lease_try(&e, &err), 0);
    assert_false(lease_is_leader(&e));
    e.observed_at -= 16; /* 16 s pass with the record unchanged */
    assert_int_equal(lease_try(&e, &err), 0);
    assert_int_equal(lease_try(&e, &err), 0);
    assert_int_equal(lease_try(&e, &err), 1);
    assert_int_equal(e.transitions, 3);
    assert_int_equal(lease_release(&e, &err), 0);
    assert_false(lease_is_leader(&e));
    assert_int_equal(lease_release(&e, &err), 0); /* not leading: nothing to do */
    lease_free(&e);
    kube_client_free(k);
    finish(&srv, n);

    cJSON *created = cJSON_Parse(srv.body[1]);
    const cJSON *spec = cJSON_GetObjectItem(created, "spec");
    assert_string_equal(cJSON_GetObjectItem(spec, "holderIdentity")->valuestring, "pod-a");
    assert_int_equal(cJSON_GetObjectItem(spec, "leaseDurationSeconds")->valueint, 15);
    assert_int_equal(cJSON_GetObjectItem(spec, "leaseTransitions")->valueint, 0);
    double t;
    assert_true(kube_time_parse(cJSON_GetObjectItem(spec, "acquireTime")->valuestring, &t));
    assert_true(kube_time_parse(cJSON_GetObjectItem(spec, "renewTime")->valuestring, &t));
    cJSON_Delete(created);
    /* a renew keeps acquireTime's absence and the transitions, and carries the resourceVersion */
    assert_non_null(strstr(srv.body[3], "\"resourceVersion\":\"5\""));
    assert_non_null(strstr(srv.body[3], "\"leaseTransitions\":0"));
    assert_null(strstr(srv.body[3], "acquireTime"));
    /* a takeover bumps the transitions and sets acquireTime */
    assert_non_null(strstr(srv.body[6], "\"resourceVersion\":\"9\""));
    assert_non_null(strstr(srv.body[6], "\"holderIdentity\":\"pod-a\""));
    assert_non_null(strstr(srv.body[6], "\"leaseTransitions\":2"));
    assert_non_null(strstr(srv.body[6], "acquireTime"));
    assert_non_null(strstr(srv.body[9], "\"leaseTransitions\":3"));
    /* release: no holder, kept transitions */
    assert_non_null(strstr(srv.body[11], "\"holderIdentity\":\"\""));
    assert_non_null(strstr(srv.body[11], "\"leaseDurationSeconds\":1"));
    assert_non_null(strstr(srv.body[11], "\"leaseTransitions\":3"));
}

/* The fence (lease.h): the gate is open from the moment a successful acquire or renewal was SENT
 * until the renew deadline after it, by the clock alone; a failed attempt changes nothing, a Lease
 * held by another or missing closes it at once, and a gated client sends no write while it is
 * closed (reads go on). The clock is the monotonic one plus an offset the test moves forward. */
static double fence_offset;
static double fence_clock(void) { return clock_now_s() + fence_offset; }
static bool always_open(void *arg) { return arg != NULL; }

static void test_lease_fence(void **state) {
    (void)state;
    static const fake_step script[] = {
        {"GET", LEASE, 404, "{\"kind\":\"Status\",\"code\":404}", 0, false}, /* never saw one: create */
        {"POST", LEASES, 201, "{}", 0, false},
        {"POST", "/api/v1/namespaces/ns/configmaps", 201, "{}", 0, false}, /* through the open gate */
        /* a renewal whose answer takes 0.5 s: the deadline counts from the send */
        {"GET", LEASE, 200, LEASE_OBJ("5", "pod-a", "2024-01-01T00:00:00.000000Z", "0"), 0, false},
        {"PUT", LEASE, 200, LEASE_OBJ("6", "pod-a", "2024-01-01T00:00:01.000000Z", "0"), 1, false},
        {"GET", CM_PATH, 200, "{}", 0, false}, /* a read through the closed gate */
        {"GET", LEASE, 500, "{\"kind\":\"Status\",\"code\":500}", 0, false}, /* a failed attempt */
        {"GET", LEASE, 200, LEASE_OBJ("7", "pod-b", "2024-01-01T00:01:00.000000Z", "1"), 0, false},
        /* deleted by hand: a candidate that saw it waits a lease duration before creating it */
        {"GET", LEASE, 404, "{\"kind\":\"Status\",\"code\":404}", 0, false},
        {"GET", LEASE, 404, "{\"kind\":\"Status\",\"code\":404}", 0, false},
        {"GET", LEASE, 404, "{\"kind\":\"Status\",\"code\":404}", 0, false},
        {"POST", LEASES, 201, "{}", 0, false},
        /* deleted while we lead: no longer leading, and not created again at once */
        {"GET", LEASE, 404, "{\"kind\":\"Status\",\"code\":404}", 0, false},
    };
    int n = (int)(sizeof script / sizeof *script);
    fake_server srv;
    assert_int_equal(fake_start(&srv, script, n), 0);
    kube_client *k = client_for(&srv, NULL, NULL), *w = client_for(&srv, NULL, NULL);
    lease_elector e;
    err_t err;
    long status;
    fence_offset = 1000;
    lease_opts o = {.name = "cephalo-operator", .identity = "pod-a", .clock = fence_clock};
    assert_int_equal(lease_init(&e, k, &o, &err), 0);
    kube_gate gate = {lease_gate, &e};
    kube_client_set_write_gate(w, &gate);
    cJSON *cm = cJSON_Parse("{\"metadata\":{\"name\":\"x\"}}");
    assert_false(lease_gate(&e) || kube_may_write(w)); /* closed before the first acquire */

    double t0 = fence_clock();
    assert_int_equal(lease_try(&e, &err), 1);
    assert_true(e.renewed_at >= t0 && e.renewed_at <= fence_clock());
    fence_offset += e.renewed_at + 9.9 - fence_clock(); /* 9.9 s after the acquire was sent */
    assert_true(lease_gate(&e));
    assert_int_equal(kube_create(w, "/api/v1/namespaces/ns/configmaps", cm, NULL, &status, &err), 0);
    fence_offset += 0.2; /* past the renew deadline (10 s) with no attempt at all */
    assert_false(lease_gate(&e));
    assert_int_equal(kube_create(w, "/api/v1/namespaces/ns/configmaps", cm, NULL, &status, &err), -1);
    assert_int_equal(status, KUBE_FENCED);
    assert_non_null(strstr(err.msg, "not sent: this replica does not hold the leader Lease"));
    assert_int_equal(kube_delete(w, CM_PATH, &status, &err), -1); /* every write verb */
    assert_int_equal(status, KUBE_FENCED);

    t0 = fence_clock();
    assert_int_equal(lease_try(&e, &err), 1); /* renewed (still ours): open again */
    double t1 = fence_clock();
    assert_true(e.renewed_at >= t0 && e.renewed_at < t1 - 0.3); /* before the slow answer */
    assert_true(atomic_load(&e.valid_until) == e.renewed_at + 10);
    assert_true(lease_gate(&e));
    cJSON *got = NULL;
    kube_client_set_write_gate(w, &(kube_gate){always_open, NULL}); /* closed: reads still go */
    assert_false(kube_may_write(w));
    assert_int_equal(kube_get(w, CM_PATH, &got, &status, &err), 0);
    cJSON_Delete(got);

    fence_offset += 5;
    assert_int_equal(lease_try(&e, &err), -1); /* the API failed: nothing changes */
    assert_true(lease_gate(&e));
    assert_int_equal(lease_try(&e, &err), 0); /* pod-b holds it: closed at once, deadline or not */
    assert_false(lease_gate(&e) || lease_is_leader(&e));

    assert_int_equal(lease_try(&e, &err), 0); /* gone: wait */
    fence_offset += 14;
    assert_int_equal(lease_try(&e, &err), 0);
    fence_offset += 1.5;
    assert_int_equal(lease_try(&e, &err), 1); /* missing for a lease duration: created */
    assert_true(lease_gate(&e));
    assert_int_equal(lease_try(&e, &err), 0); /* deleted while leading */
    assert_false(lease_gate(&e));
    cJSON_Delete(cm);
    lease_free(&e);
    kube_client_free(w);
    kube_client_free(k);
    finish(&srv, n);
}

/* A write that passed the gate but is answered after it closed (the process stopped between the
 * gate's last word and the send, or a slow answer): the write went out, so it is reported, with
 * the wall time it passed the fence, which must precede the close. */
static double late_gate_until;
static bool late_gate(void *arg) { return (void)arg, clock_now_s() < late_gate_until; }
static char late_log[1024];
static void late_log_handler(const char *level, const char *text) {
    snprintf(late_log, sizeof late_log, "%s: %s", level, text);
}

#define PAD50 ".................................................."
#define SLOW_BODY "{\"metadata\":{\"name\":\"x\"},\"data\":{\"pad\":\"" PAD50 PAD50 PAD50 PAD50 PAD50 "\"}}"

static void test_late_write(void **state) {
    (void)state;
    static const fake_step script[] = {
        {"POST", "/api/v1/namespaces/ns/configmaps", 201, SLOW_BODY, 1, false}, /* over 0.5 s */
        {"POST", "/api/v1/namespaces/ns/configmaps", 201, "{}", 0, false},
    };
    fake_server srv;
    assert_int_equal(fake_start(&srv, script, 2), 0);
    kube_client *w = client_for(&srv, NULL, NULL);
    kube_client_set_write_gate(w, &(kube_gate){late_gate, NULL});
    cJSON *cm = cJSON_Parse("{\"metadata\":{\"name\":\"x\"}}");
    err_t err;
    long status;
    late_log[0] = '\0';
    log_set_handler(late_log_handler);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double before = (double)ts.tv_sec + ts.tv_nsec * 1e-9;
    late_gate_until = clock_now_s() + 0.25; /* closes while the answer is on its way */
    assert_int_equal(kube_create(w, "/api/v1/namespaces/ns/configmaps", cm, NULL, &status, &err), 0);
    assert_int_equal(status, 201);
    assert_non_null(strstr(late_log, "warning: POST "));
    assert_non_null(strstr(late_log, "/api/v1/namespaces/ns/configmaps: in flight when the leader Lease ran "
                                     "out: it passed the fence at "));
    assert_non_null(strstr(late_log, "answered: HTTP 201"));
    double passed = atof(strstr(late_log, "fence at ") + 9);
    assert_true(passed >= before && passed < before + 0.25); /* before the gate closed */
    /* a write through an open gate, answered while it is open: nothing said */
    late_log[0] = '\0';
    late_gate_until = clock_now_s() + 30;
    assert_int_equal(kube_create(w, "/api/v1/namespaces/ns/configmaps", cm, NULL, &status, &err), 0);
    assert_string_equal(late_log, "");
    log_set_handler(NULL);
    cJSON_Delete(cm);
    kube_client_free(w);
    finish(&srv, 2);
}

/* ---- inventory: compute capability ---------------------------------------------------------- */

static cJSON *nodes_json(const char *text) {
    cJSON *n = cJSON_Parse(text);
    assert_non_null(n);
    return n;
}

#define NODE(name, product, count, labels)                                                      \
    "{\"metadata\":{\"name\":\"" name "\",\"labels\":{\"nvidia.com/gpu.product\":\"" product       \
    "\",\"nvidia.com/gpu.memory\":\"16384\"" labels "}},\"status\":{\"allocatable\":{\"nvidia.com/gpu\":\"" \
    count "\"}}}"
#define CC(major, minor) ",\"nvidia.com/gpu.compute.major\":\"" major "\",\"nvidia.com/gpu.compute.minor\":\"" minor "\""

static void test_worker_archs(void **state) {
    (void)state;
    inv_archs a;
    err_t err;
    assert_int_equal(inv_archs_parse(INV_DEFAULT_ARCHS, &a, &err), 0);
    assert_int_equal(a.n, 8);
    assert_true(inv_archs_run(&a, 6, 1) && inv_archs_run(&a, 7, 5) && inv_archs_run(&a, 8, 9) && inv_archs_run(&a, 9, 0));
    assert_false(inv_archs_run(&a, 5, 2)); /* Maxwell */
    assert_false(inv_archs_run(&a, 10, 0)); /* a newer major: PTX JIT is not planned on */
    assert_true(inv_archs_run(&a, 8, 7)); /* Orin: sm_86 code runs on 8.7 */
    assert_int_equal(inv_archs_parse("80,86", &a, &err), 0);
    assert_false(inv_archs_run(&a, 7, 5));
    assert_true(inv_archs_run(&a, 8, 9));
    assert_true(inv_archs_run(NULL, 3, 0)); /* no restriction */
    assert_int_equal(inv_archs_parse("70 sm_80", &a, &err), -1);
    assert_non_null(strstr(err.msg, "--worker-archs: 'sm_80' is not an architecture"));
    assert_int_equal(inv_archs_parse("  ", &a, &err), -1);
    assert_non_null(strstr(err.msg, "empty"));
    assert_int_equal(inv_archs_parse("705", &a, &err), -1);
}

/* The labels give the capability (else the catalog); a GPU the image cannot run is left out with
 * a note naming the node, the product and the capability. */
static void test_inventory_compute_capability(void **state) {
    (void)state;
    cJSON *nodes = nodes_json("[" NODE("n-a", "Tesla-V100-SXM2-16GB", "2", CC("7", "0")) ","
                              NODE("n-b", "Tesla-T4", "1", "") ","
                              NODE("n-c", "Tesla-M60", "2", CC("5", "2")) ","
                              NODE("n-d", "NVIDIA-Future-GPU", "1", "") "]");
    inv_archs archs;
    err_t err;
    assert_int_equal(inv_archs_parse(INV_DEFAULT_ARCHS, &archs, &err), 0);
    cJSON *allowed = nodes_json("[\"Tesla-V100-SXM2-16GB\", \"Tesla-T4\", \"Tesla-M60\", \"NVIDIA-Future-GPU\"]");
    inv_constraints c = {.allowed_products = allowed, .archs = &archs};
    cluster cl;
    inv_result r;
    assert_int_equal(inv_build(nodes, &c, &cl, &r, &err), 0);
    assert_int_equal(r.gpus, 4); /* 2 V100 + 1 T4 + the unknown product, not the M60s */
    assert_int_equal(cl.devices[0].cc_major, 7);
    assert_int_equal(cl.devices[0].cc_minor, 0);
    assert_int_equal(cl.devices[2].cc_major, 7); /* T4 without labels: the catalog's 7.5 */
    assert_int_equal(cl.devices[2].cc_minor, 5);
    assert_int_equal(cl.devices[3].cc_major, 0); /* unknown product, no labels: kept, unknown */
    assert_non_null(strstr(r.notes, "node n-c: Tesla-M60 (compute capability 5.2) is left out: the worker image is "
                                    "built for sm_60 sm_61 sm_70 sm_75 sm_80 sm_86 sm_89 sm_90 (--worker-archs)"));
    /* the planner refuses bf16 on them, naming the GPUs */
    assert_int_equal(cluster_check_precision(&cl, PREC_BF16, "spec.precision", &err), -1);
    assert_non_null(strstr(err.msg, "spec.precision bf16: V100-16GB (compute capability 7.0) and T4 (compute capability 7.5)"));
    cluster_free(&cl);

    /* labels override the catalog: an image built for sm_80+ only leaves the V100s out */
    assert_int_equal(inv_archs_parse("80 86 89 90", &archs, &err), 0);
    assert_int_equal(inv_build(nodes, &c, &cl, &r, &err), 0);
    assert_int_equal(r.gpus, 1); /* the unknown product (no capability known) */
    assert_non_null(strstr(r.notes, "node n-a: Tesla-V100-SXM2-16GB (compute capability 7.0) is left out"));
    assert_non_null(strstr(r.notes, "node n-b: Tesla-T4 (compute capability 7.5) is left out"));
    cluster_free(&cl);

    /* nothing left: the error says the image runs none of them, and why */
    cJSON *only = nodes_json("[\"Tesla-M60\"]");
    c.allowed_products = only;
    assert_int_equal(inv_build(nodes, &c, &cl, &r, &err), -1);
    assert_non_null(strstr(err.msg, "no usable GPU: the worker image runs none of the GPUs the job may use: node n-c: "
                                    "Tesla-M60 (compute capability 5.2) is left out"));
    /* without --worker-archs every capability is taken */
    c.archs = NULL;
    assert_int_equal(inv_build(nodes, &c, &cl, &r, &err), 0);
    assert_int_equal(r.gpus, 2);
    assert_int_equal(cl.devices[0].cc_major, 5);
    cluster_free(&cl);
    cJSON_Delete(only);
    cJSON_Delete(allowed);
    cJSON_Delete(nodes);
}

/* A pod as the API server stores it: bound to node, a phase, its controller's uid, a container
 * asking for GPUs (RES: a resources object) and optional init containers. */
#define POD(node, phase, uid, res, init)                                                             \
    "{\"metadata\":{\"ownerReferences\":[{\"controller\":true,\"uid\":\"" uid "\"}]},"                \
    "\"spec\":{\"nodeName\":\"" node "\",\"containers\":[{\"name\":\"c\",\"resources\":" res "}]" init "},"  \
    "\"status\":{\"phase\":\"" phase "\"}}"
#define GPUS_REQ(n) "{\"requests\":{\"nvidia.com/gpu\":\"" n "\"},\"limits\":{\"nvidia.com/gpu\":\"" n "\"}}"
#define GPUS_LIM(n) "{\"limits\":{\"nvidia.com/gpu\":\"" n "\"}}"

/* Free GPUs: allocatable less the requests of the non-terminal pods bound to the node, except the
 * job's own; requests, else limits; init containers by Kubernetes' rule. */
static void test_inventory_gpu_accounting(void **state) {
    (void)state;
    cJSON *nodes = nodes_json("[" NODE("n-a", "NVIDIA-L4", "2", "") "," NODE("n-b", "NVIDIA-A10G", "1", "") "]");
    cJSON *pods = nodes_json("[" POD("n-a", "Running", "other", GPUS_LIM("1"), "") ","
                             POD("n-a", "Succeeded", "other", GPUS_REQ("1"), "") ","
                             POD("n-a", "Failed", "other", GPUS_REQ("1"), "") ","
                             POD("n-b", "Pending", "me", GPUS_REQ("1"), "") "]");
    inv_constraints c = {.pods = pods, .own_uid = "me"};
    cluster cl;
    inv_result r;
    err_t err;
    /* a foreign pod asking 1 of n-a's 2 leaves 1; finished pods hold nothing; the job's own pod on
     * n-b is its own: the job may plan on that GPU */
    assert_int_equal(inv_build(nodes, &c, &cl, &r, &err), 0);
    assert_int_equal(r.gpus, 2);
    assert_int_equal(r.usable, 3);
    assert_int_equal(r.free, 2);
    assert_string_equal(cl.nodes[cl.devices[0].node].name, "n-a");
    assert_string_equal(cl.nodes[cl.devices[1].node].name, "n-b");
    char text[64];
    inv_describe(&cl, text, sizeof text);
    assert_string_equal(text, "1 L4, 1 A10G");
    cluster_free(&cl);
    /* for another job the pod on n-b is foreign: n-b is busy */
    c.own_uid = "someone-else";
    assert_int_equal(inv_build(nodes, &c, &cl, &r, &err), 0);
    assert_int_equal(r.gpus, 1);
    assert_int_equal(r.free, 1);
    cluster_free(&cl);
    /* maxGPUs caps what is picked, not what is free */
    c.max_gpus = 1, c.own_uid = "me";
    assert_int_equal(inv_build(nodes, &c, &cl, &r, &err), 0);
    assert_int_equal(r.gpus, 1);
    assert_int_equal(r.free, 2);
    cluster_free(&cl);
    /* everything busy is no error: an empty cluster (the job waits) */
    cJSON *full = nodes_json("[" POD("n-a", "Running", "x", GPUS_REQ("2"), "") "," POD("n-b", "Pending", "x", GPUS_LIM("1"), "") "]");
    inv_constraints c2 = {.pods = full};
    assert_int_equal(inv_build(nodes, &c2, &cl, &r, &err), 0);
    assert_int_equal(r.gpus, 0);
    assert_int_equal(r.usable, 3);
    cluster_free(&cl);
    assert_int_equal(inv_node_used(full, cJSON_GetArrayItem(nodes, 0), NULL), 2);
    assert_int_equal(inv_node_used(full, cJSON_GetArrayItem(nodes, 0), "x"), 0);
    cJSON_Delete(full);
    cJSON_Delete(pods);
    cJSON_Delete(nodes);
}

/* Taints: Kubernetes' toleration rule, and nodes whose NoSchedule/NoExecute taints the job does
 * not tolerate left out with a note (kube-scheduler would refuse them) */
static void test_inventory_taints(void **state) {
    (void)state;
    cJSON *taint = nodes_json("{\"key\":\"gpu\",\"value\":\"a100\",\"effect\":\"NoSchedule\"}");
    static const struct { const char *tol; bool ok; } rule[] = {
        {"{\"key\":\"gpu\",\"value\":\"a100\",\"effect\":\"NoSchedule\"}", true},
        {"{\"key\":\"gpu\",\"operator\":\"Equal\",\"value\":\"a100\"}", true},  /* any effect */
        {"{\"key\":\"gpu\",\"value\":\"v100\"}", false},                        /* another value */
        {"{\"key\":\"gpu\",\"operator\":\"Exists\"}", true},
        {"{\"operator\":\"Exists\"}", true},                                    /* everything */
        {"{\"operator\":\"Exists\",\"effect\":\"NoExecute\"}", false},          /* another effect */
        {"{\"key\":\"other\",\"operator\":\"Exists\"}", false},
        {"{\"key\":\"gpu\"}", false}, /* Equal with no value: the taint has one */
    };
    for (size_t i = 0; i < sizeof rule / sizeof rule[0]; i++) {
        cJSON *t = nodes_json(rule[i].tol);
        if (inv_tolerates(t, taint) != rule[i].ok) fail_msg("toleration %s: expected %d", rule[i].tol, rule[i].ok);
        cJSON_Delete(t);
    }
    cJSON_Delete(taint);

#define TAINTED(name, taints) \
    "{\"metadata\":{\"name\":\"" name "\",\"labels\":{\"nvidia.com/gpu.product\":\"NVIDIA-L4\",\"nvidia.com/gpu.memory\":" \
    "\"23034\"}},\"spec\":{\"taints\":" taints "},\"status\":{\"allocatable\":{\"nvidia.com/gpu\":\"1\"}}}"
    cJSON *nodes = nodes_json("[" TAINTED("n-a", "[{\"key\":\"team\",\"value\":\"ml\",\"effect\":\"NoSchedule\"}]") ","
                              TAINTED("n-b", "[{\"key\":\"spot\",\"effect\":\"PreferNoSchedule\"},"
                                             "{\"key\":\"node.kubernetes.io/not-ready\",\"effect\":\"NoSchedule\"}]") ","
                              TAINTED("n-c", "[{\"key\":\"maint\",\"effect\":\"NoExecute\"}]") "]");
    inv_constraints c = {0};
    cluster cl;
    inv_result r;
    err_t err;
    /* no tolerations: only n-b (a preference, and the readiness taint left to the Ready condition) */
    assert_int_equal(inv_build(nodes, &c, &cl, &r, &err), 0);
    assert_int_equal(r.gpus, 1);
    assert_string_equal(cl.nodes[0].name, "n-b");
    assert_non_null(strstr(r.notes, "node n-a has the taint team=ml:NoSchedule, which spec.tolerations does not tolerate"));
    assert_non_null(strstr(r.notes, "node n-c has the taint maint:NoExecute"));
    cluster_free(&cl);
    /* tolerating team=ml adds n-a; Exists on maint adds n-c */
    cJSON *tols = nodes_json("[{\"key\":\"team\",\"value\":\"ml\",\"effect\":\"NoSchedule\"},{\"key\":\"maint\",\"operator\":\"Exists\"}]");
    c.tolerations = tols;
    assert_int_equal(inv_build(nodes, &c, &cl, &r, &err), 0);
    assert_int_equal(r.gpus, 3);
    assert_string_equal(r.notes, "");
    cluster_free(&cl);
    /* every GPU node tainted against the job: no usable GPU, and the error says why */
    cJSON *only_a = nodes_json("[" TAINTED("n-a", "[{\"key\":\"team\",\"value\":\"ml\",\"effect\":\"NoSchedule\"}]") "]");
    c.tolerations = NULL;
    assert_int_equal(inv_build(only_a, &c, &cl, &r, &err), -1);
    assert_non_null(strstr(err.msg, "node n-a has the taint team=ml:NoSchedule"));
#undef TAINTED
    cJSON_Delete(only_a);
    cJSON_Delete(tols);
    cJSON_Delete(nodes);
}

/* A pod's GPUs: requests over limits; the larger of the containers' sum (with sidecars) and the
 * largest init container (with the sidecars before it); unbound pods hold nothing. */
static void test_pod_gpu_requests(void **state) {
    (void)state;
    cJSON *p = nodes_json(POD("n", "Running", "u", "{\"requests\":{\"nvidia.com/gpu\":\"2\"},\"limits\":{\"nvidia.com/gpu\":\"3\"}}", ""));
    assert_int_equal(inv_pod_gpus(p), 2);
    cJSON_Delete(p);
    p = nodes_json(POD("n", "Running", "u", GPUS_LIM("1"), ",\"initContainers\":[{\"resources\":" GPUS_REQ("4") "}]"));
    assert_int_equal(inv_pod_gpus(p), 4); /* an init container asking more than the containers */
    cJSON_Delete(p);
    p = nodes_json(POD("n", "Running", "u", GPUS_LIM("1"), ",\"initContainers\":[{\"restartPolicy\":\"Always\",\"resources\":"
                       GPUS_REQ("1") "},{\"resources\":" GPUS_REQ("1") "}]"));
    assert_int_equal(inv_pod_gpus(p), 2); /* the sidecar runs beside the container: 1 + 1 */
    assert_true(inv_pod_holds(p));
    cJSON_Delete(p);
    p = nodes_json(POD("", "Pending", "u", GPUS_LIM("1"), "")); /* not bound yet: no node's GPU */
    assert_false(inv_pod_holds(p));
    cJSON_Delete(p);
    p = nodes_json(POD("n", "Running", "u", "{}", ""));
    assert_int_equal(inv_pod_gpus(p), 0);
    cJSON_Delete(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kubeconfig_current_context),
        cmocka_unit_test(test_kubeconfig_named_context_client_cert),
        cmocka_unit_test(test_kubeconfig_files),
        cmocka_unit_test(test_kubeconfig_errors),
        cmocka_unit_test(test_in_cluster),
        cmocka_unit_test(test_paths_and_times),
        cmocka_unit_test(test_errors_and_verbs),
        cmocka_unit_test(test_token_reread_after_401),
        cmocka_unit_test(test_update_retry_on_conflict),
        cmocka_unit_test(test_events_counted),
        cmocka_unit_test(test_lease_election),
        cmocka_unit_test(test_lease_fence),
        cmocka_unit_test(test_late_write),
        cmocka_unit_test(test_worker_archs),
        cmocka_unit_test(test_inventory_compute_capability),
        cmocka_unit_test(test_inventory_gpu_accounting),
        cmocka_unit_test(test_inventory_taints),
        cmocka_unit_test(test_pod_gpu_requests),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
