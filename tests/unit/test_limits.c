/* test_limits.c - names and paths at their documented limits and one beyond (issue 27, "fixed
 * buffers that truncate"): at the limit everything works, beyond it the message names the
 * name, path or field and the limit; nothing is ever cut into another name or path. The
 * checked formatting itself (common/strutil.h), the job file's run names and generated cluster
 * YAML, model names taken from file and directory names, the checkpoint directory's limit, the
 * operator's spec paths, job names (the CRD's), request URLs, list continue tokens and the Lease
 * record. tests/cli/test_limits.sh drives the binaries the same way. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/job.h"
#include "common/ckpt_dir.h"
#include "common/log.h"
#include "common/strutil.h"
#include "common/yaml_tree.h"
#include "fake_http.h"
#include "operator/job_spec.h"
#include "operator/client/kube.h"
#include "operator/client/lease.h"
#include "operator/reconcile.h"
#include "operator/client/watch.h"
#include "planner/model.h"
#include "planner/profile_store.h"

/* n copies of c, in a fresh string */
static char *repeat(char c, size_t n) {
    char *s = xmalloc(n + 1);
    memset(s, c, n);
    s[n] = '\0';
    return s;
}

static void assert_contains(const char *text, const char *needle) {
    if (!strstr(text, needle)) fail_msg("'%s' lacks '%s'", text, needle);
}

/* ---- common/strutil.h ---- */

static void test_str_fmt(void **state) {
    (void)state;
    char buf[8];
    err_t err = {{0}};
    assert_int_equal(str_fmt(buf, sizeof buf, &err, "the name", "%s", "1234567"), 0); /* 7: the limit */
    assert_string_equal(buf, "1234567");
    assert_int_equal(str_fmt(buf, sizeof buf, &err, "the name", "%s-%d", "1234567", 8), -1);
    assert_contains(err.msg, "the name '1234567' is too long (at most 7 characters)");
    assert_int_equal(str_fmt(buf, sizeof buf, NULL, "", "%s", "12345678"), -1); /* no message wanted */
    /* a long one is shown by its start */
    char big[100];
    char *s = repeat('x', 500);
    assert_int_equal(str_fmt(big, sizeof big, &err, "--ckpt-dir", "%s/latest", s), -1);
    assert_contains(err.msg, "...' is too long (at most 99 characters)");
    free(s);
}

static void test_str_grow(void **state) {
    (void)state;
    char *text = NULL;
    size_t len = 0, cap = 0;
    for (int i = 0; i < 20000; i++) str_appendf(&text, &len, &cap, "%d,", i % 10);
    assert_int_equal(len, 40000);
    assert_int_equal(strlen(text), 40000);
    assert_memory_equal(text + 39996, "8,9,", 5);
    free(text);
    char *s = repeat('y', 10000);
    char *p = str_printf("%s/%s", s, "end");
    assert_int_equal(strlen(p), 10004);
    assert_string_equal(p + 10000, "/end");
    free(p), free(s);
}

/* ---- the job file of cephalo run ---- */

/* A job named `name` (NULL: none), loaded as file `file`, with n_items device items. */
static int load_job(const char *file, const char *name, int n_items, job *j, err_t *err) {
    char *text = NULL;
    size_t len = 0, cap = 0;
    if (name) str_appendf(&text, &len, &cap, "name: %s\n", name);
    str_appendf(&text, &len, &cap, "model: tiny-gpt\nbatch: %d\nsteps: 2\ndata: synthetic\ndevices:\n", n_items * 4);
    /* 511M: memory_gib 0.4990234375, the longest numbers %.17g prints */
    for (int i = 0; i < n_items; i++) str_appendf(&text, &len, &cap, "  - {type: cpu, threads: 1, memory: 511M, count: 4}\n");
    int rc = job_load_string(file, text, len, j, err);
    free(text);
    return rc;
}

static void test_job_names(void **state) {
    (void)state;
    job j;
    err_t err = {{0}};
    cluster cl;
    /* 26 characters cut the generated cluster file into a bogus YAML error; 63 is the limit, with
     * 64 device items (256 devices: JOB_MAX_DEVICES) */
    const char *names[] = {"abcdefghijklmnopqrstuvwxyz", NULL};
    char *longest = repeat('n', JOB_NAME_MAX);
    names[1] = longest;
    for (int k = 0; k < 2; k++) {
        for (int items = 1; items <= 64; items += 63) {
            if (load_job("job.yaml", names[k], items, &j, &err) < 0) fail_msg("%s", err.msg);
            assert_string_equal(j.name, names[k]);
            if (job_cluster(&j, &cl, &err) < 0) fail_msg("%zu characters, %d items: %s", strlen(names[k]), items, err.msg);
            assert_int_equal(cl.n_devices, items * 4);
            char *yaml = job_cluster_yaml(&j);
            assert_non_null(strstr(yaml, names[k]));
            free(yaml);
            cluster_free(&cl);
            job_free(&j);
        }
    }
    /* one beyond: the field and the limit */
    char *beyond = repeat('n', JOB_NAME_MAX + 1);
    assert_int_equal(load_job("job.yaml", beyond, 1, &j, &err), -1);
    job_free(&j);
    assert_contains(err.msg, "job.yaml:1: name:");
    assert_contains(err.msg, "at most 63 characters");
    /* from the file name: the same limit, never cut */
    char file[200];
    snprintf(file, sizeof file, "jobs/%s.yaml", longest);
    if (load_job(file, NULL, 1, &j, &err) < 0) fail_msg("%s", err.msg);
    assert_string_equal(j.name, longest);
    if (job_cluster(&j, &cl, &err) < 0) fail_msg("%s", err.msg);
    cluster_free(&cl);
    job_free(&j);
    snprintf(file, sizeof file, "jobs/%s.yaml", beyond);
    assert_int_equal(load_job(file, NULL, 1, &j, &err), -1);
    job_free(&j);
    assert_contains(err.msg, "taken from the file name is longer than 63 characters");
    assert_null(strstr(err.msg, "YAML"));
    free(longest), free(beyond);
}

/* ---- model names from file and directory names ---- */

static void test_model_names(void **state) {
    (void)state;
    static const char text[] = "base: tiny-gpt\n";
    model_spec m;
    err_t err = {{0}};
    char *name63 = repeat('m', 63), *name64 = repeat('m', 64), file[200];
    snprintf(file, sizeof file, "models/%s.yaml", name63);
    if (model_load_string(file, text, strlen(text), &m, &err) < 0) fail_msg("%s", err.msg);
    assert_string_equal(m.name, name63);
    snprintf(file, sizeof file, "models/%s.yaml", name64);
    assert_int_equal(model_load_string(file, text, strlen(text), &m, &err), -1);
    assert_contains(err.msg, "taken from the file name is longer than 63 characters");
    /* a name: field makes the file name's length irrelevant */
    static const char named[] = "name: short\nbase: tiny-gpt\n";
    if (model_load_string(file, named, strlen(named), &m, &err) < 0) fail_msg("%s", err.msg);
    assert_string_equal(m.name, "short");

    /* a Hugging Face directory deep enough that its config.json's path was cut (1100 bytes) */
    char dir[2048];
    snprintf(dir, sizeof dir, "/tmp/cephalo-test-limits-XXXXXX");
    assert_non_null(mkdtemp(dir));
    char *top = xstrdup(dir);
    for (int i = 0; i < 9; i++) {
        size_t len = strlen(dir);
        snprintf(dir + len, sizeof dir - len, "/%s", name63 + (i % 2));
        assert_int_equal(mkdir(dir, 0700), 0);
    }
    size_t len = strlen(dir);
    snprintf(dir + len, sizeof dir - len, "/%s", name63);
    assert_int_equal(mkdir(dir, 0700), 0);
    assert_true(strlen(dir) > 600);
    char *cfg = str_printf("%s/config.json", dir);
    FILE *f = fopen(cfg, "w");
    assert_non_null(f);
    fputs("{\"architectures\": [\"GPT2LMHeadModel\"], \"n_embd\": 64, \"n_head\": 4, \"n_layer\": 2, "
          "\"n_positions\": 128, \"vocab_size\": 256}", f);
    fclose(f);
    if (model_load_hf_config(dir, &m, &err) < 0) fail_msg("%s", err.msg);
    assert_string_equal(m.name, name63);
    /* its directory's name is the model's: 64 characters are refused, not cut */
    char *dir64 = str_printf("%s/%s", dir, name64);
    assert_int_equal(mkdir(dir64, 0700), 0);
    char *cfg64 = str_printf("%s/config.json", dir64);
    assert_int_equal(rename(cfg, cfg64), 0);
    assert_int_equal(model_load_hf_config(dir64, &m, &err), -1);
    assert_contains(err.msg, "the model name taken from the directory's name");
    assert_contains(err.msg, "at most 63 characters");
    char *rm = str_printf("rm -rf '%s'", top);
    assert_int_equal(system(rm), 0);
    free(rm), free(cfg), free(cfg64), free(dir64), free(top), free(name63), free(name64);
}

/* ---- paths ---- */

static void test_path_limits(void **state) {
    (void)state;
    err_t err = {{0}};
    char *at = repeat('c', CKPT_DIR_MAX), *beyond = repeat('c', CKPT_DIR_MAX + 1);
    assert_int_equal(ckpt_dir_check_len(at, "--ckpt-dir", &err), 0);
    assert_int_equal(ckpt_dir_check_len(beyond, "--ckpt-dir", &err), -1);
    assert_contains(err.msg, "--ckpt-dir: the checkpoint directory");
    assert_contains(err.msg, "at most 3968");
    free(at), free(beyond);
    /* the profile store's path from the environment: refused, not cut into another file */
    char buf[4096];
    char *store = repeat('s', 5000);
    setenv("CEPHALO_PROFILE_STORE", store, 1);
    assert_int_equal(profile_store_path(buf, sizeof buf, &err), -1);
    assert_contains(err.msg, "$CEPHALO_PROFILE_STORE");
    setenv("CEPHALO_PROFILE_STORE", "/tmp/p.json", 1);
    assert_int_equal(profile_store_path(buf, sizeof buf, &err), 1);
    assert_string_equal(buf, "/tmp/p.json");
    unsetenv("CEPHALO_PROFILE_STORE");
    free(store);
}

/* ---- the operator ---- */

/* The CRD holds job names to REC_NAME_MAX, lower-case DNS labels: the names derived from them fit. */
static void test_crd_name_limit(void **state) {
    (void)state;
    err_t err;
    ynode *crd = ytree_load_file("crds/cephalojobs.cephalo.dev.yaml", &err);
    if (!crd) fail_msg("%s", err.msg);
    const ynode *v = ymap_get(crd, "spec");
    v = ymap_get(v, "versions");
    assert_true(v && v->n > 0);
    for (size_t i = 0; i < v->n; i++) {
        const ynode *name = ymap_get(ymap_get(ymap_get(ymap_get(ymap_get(ymap_get(v->items[i], "schema"), "openAPIV3Schema"),
                                                                  "properties"), "metadata"), "properties"), "name");
        assert_non_null(name);
        const ynode *max = ymap_get(name, "maxLength");
        assert_non_null(max);
        assert_int_equal(atoi(max->str), REC_NAME_MAX);
        assert_non_null(ymap_get(name, "pattern"));
    }
    /* NAME-RANK with the highest rank is a DNS label */
    assert_true(REC_NAME_MAX + 1 + 4 <= 63);
    ytree_free(crd);
}

static int parse_spec(const char *json, cJSON **doc, job_spec *s, err_t *err) {
    *doc = cJSON_Parse(json);
    assert_non_null(*doc);
    return job_spec_parse(*doc, s, err);
}

static void test_job_spec_paths(void **state) {
    (void)state;
    cJSON *doc;
    job_spec s;
    err_t err = {{0}};
    /* in the pod the checkpoint directory is /checkpoints/DIR: at most CKPT_DIR_MAX */
    size_t room = CKPT_DIR_MAX - strlen(JOB_SPEC_CKPT_MOUNT "/");
    char *dir = repeat('d', room), *data = repeat('p', 4500);
    char *json = str_printf("{\"model\": {\"name\": \"tiny-gpt\"}, \"globalBatch\": 8, \"steps\": 2, "
                            "\"data\": {\"path\": \"%s\", \"pvc\": \"shards\"}, "
                            "\"checkpoint\": {\"dir\": \"%s\", \"pvc\": \"ckpt\"}}", data, dir);
    if (parse_spec(json, &doc, &s, &err) < 0) fail_msg("%s", err.msg);
    /* the worker gets both whole (a 4500-character data path was cut at 4199) */
    wcmd_argv a = {0};
    job_spec_worker_argv(&s, RECOMPUTE_FULL, &a);
    bool saw_data = false, saw_ckpt = false;
    for (int i = 0; i < a.n; i++) {
        saw_data |= strlen(a.v[i]) == 4506 && !strncmp(a.v[i], "/data/", 6);
        saw_ckpt |= strlen(a.v[i]) == CKPT_DIR_MAX && !strncmp(a.v[i], JOB_SPEC_CKPT_MOUNT "/", 13);
    }
    assert_true(saw_data);
    assert_true(saw_ckpt);
    wcmd_argv_free(&a);
    cJSON_Delete(doc);
    free(json), free(dir);
    /* one beyond: the field and the limit */
    dir = repeat('d', room + 1);
    json = str_printf("{\"model\": {\"name\": \"tiny-gpt\"}, \"globalBatch\": 8, \"steps\": 2, \"data\": {\"path\": \"synthetic\"}, "
                      "\"checkpoint\": {\"dir\": \"%s\", \"pvc\": \"ckpt\"}}", dir);
    assert_int_equal(parse_spec(json, &doc, &s, &err), -1);
    assert_contains(err.msg, "spec.checkpoint.dir:");
    assert_contains(err.msg, "at most 3968");
    cJSON_Delete(doc);
    free(json), free(dir), free(data);
}

static kube_client *client_at(const char *server) {
    kube_config cfg = {.server = (char *)server, .namespace = (char *)"ns", .token = (char *)"tok"};
    err_t err;
    kube_client *k = kube_client_new(&cfg, &err);
    if (!k) fail_msg("%s", err.msg);
    return k;
}

/* A kubeconfig's server joins every request's URL: one too long is refused when read; a path too
 * long for the URL is refused before anything is sent. */
static void test_kube_urls(void **state) {
    (void)state;
    err_t err = {{0}};
    kube_config cfg;
    char *host = repeat('h', KUBE_SERVER_MAX - strlen("https://")), *host1 = repeat('h', KUBE_SERVER_MAX + 1 - strlen("https://"));
    const char *fmt = "apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts:\n- name: c\n  context: {cluster: k, user: u}\n"
                      "clusters:\n- name: k\n  cluster: {server: \"https://%s\", certificate-authority-data: Zm9v}\n"
                      "users:\n- name: u\n  user: {token: t}\n";
    char *text = str_printf(fmt, host);
    if (kube_config_parse("kubeconfig", "", text, strlen(text), NULL, &cfg, &err) < 0) fail_msg("%s", err.msg);
    assert_int_equal(strlen(cfg.server), KUBE_SERVER_MAX);
    kube_config_free(&cfg);
    free(text);
    text = str_printf(fmt, host1);
    assert_int_equal(kube_config_parse("kubeconfig", "", text, strlen(text), NULL, &cfg, &err), -1);
    assert_contains(err.msg, "is too long (at most 511 characters)");
    free(text), free(host), free(host1);

    fake_server srv;
    assert_int_equal(fake_start(&srv, NULL, 0), 0);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", srv.port);
    kube_client *k = client_at(url);
    char *name = repeat('x', KUBE_URL_MAX);
    char *path = str_printf("/api/v1/namespaces/ns/configmaps/%s", name);
    cJSON *out = NULL;
    long status = 0;
    assert_int_equal(kube_get(k, path, &out, &status, &err), -1);
    assert_contains(err.msg, "the request URL");
    assert_contains(err.msg, "is too long (at most 8191 characters)");
    assert_int_equal(fake_join(&srv), 0); /* nothing was sent */
    kube_client_free(k);
    free(path), free(name);
}

static int stop_on_list(const cJSON *items, const char *rv, void *arg, err_t *err) {
    (void)err, (void)rv;
    *(int *)arg = cJSON_GetArraySize(items);
    return err_set(err, "listed"); /* ends watch_run: a handler error */
}

/* A list's continue token is passed on whole, however long (it was cut at 2 KiB). */
static void test_list_continue_token(void **state) {
    (void)state;
    char *token = repeat('t', 2600), *page1, *path2;
    token[100] = '='; /* escaped: %3D */
    page1 = str_printf("{\"kind\":\"PodList\",\"metadata\":{\"resourceVersion\":\"7\",\"continue\":\"%s\"},"
                       "\"items\":[{\"metadata\":{\"name\":\"a\"}}]}", token);
    token[100] = '\0';
    path2 = str_printf("/api/v1/namespaces/ns/pods?limit=500&continue=%s%%3D%s", token, token + 101);
    fake_step script[] = {
        {"GET", "/api/v1/namespaces/ns/pods?limit=500", 200, page1, 0, false},
        {"GET", path2, 200, "{\"kind\":\"PodList\",\"metadata\":{\"resourceVersion\":\"8\"},\"items\":[{\"metadata\":{\"name\":\"b\"}}]}",
         0, false},
    };
    fake_server srv;
    assert_int_equal(fake_start(&srv, script, 2), 0);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", srv.port);
    kube_client *k = client_at(url);
    int listed = 0;
    watch_opts o = {.path = "/api/v1/namespaces/ns/pods", .timeout_seconds = 5, .backoff_initial_s = 0.01,
                    .backoff_max_s = 0.05, .max_failures = 1};
    watch_handler h = {stop_on_list, NULL, &listed};
    err_t err;
    watch_run(k, &o, &h, NULL, &err);
    int served = fake_join(&srv);
    kube_client_free(k);
    if (srv.mismatch[0]) fail_msg("%.300s", srv.mismatch);
    assert_int_equal(served, 2);
    assert_int_equal(listed, 2);
    free(token), free(page1), free(path2);
}

/* A holder's long identity is compared whole: its renewals are seen (a cut record hid them, and
 * this replica took the Lease from a live leader). */
static void test_lease_long_holder(void **state) {
    (void)state;
    char *holder = repeat('h', 600);
    const char *fmt = "{\"apiVersion\":\"coordination.k8s.io/v1\",\"kind\":\"Lease\",\"metadata\":{\"name\":\"cephalo-operator\","
                      "\"resourceVersion\":\"%d\"},\"spec\":{\"holderIdentity\":\"%s\",\"leaseDurationSeconds\":15,"
                      "\"renewTime\":\"%s\",\"leaseTransitions\":1}}";
    char *first = str_printf(fmt, 5, holder, "2024-01-01T00:01:00.000000Z");
    char *renewed = str_printf(fmt, 6, holder, "2024-01-01T00:01:10.000000Z");
    const char *lease = "/apis/coordination.k8s.io/v1/namespaces/ns/leases/cephalo-operator";
    fake_step script[] = {{"GET", lease, 200, first, 0, false}, {"GET", lease, 200, renewed, 0, false}};
    fake_server srv;
    assert_int_equal(fake_start(&srv, script, 2), 0);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", srv.port);
    kube_client *k = client_at(url);
    lease_elector e;
    err_t err;
    lease_opts o = {.name = "cephalo-operator", .identity = "pod-a"};
    assert_int_equal(lease_init(&e, k, &o, &err), 0);
    assert_int_equal(lease_try(&e, &err), 0);
    e.observed_at -= 16; /* a lease duration passes; the holder renewed meanwhile */
    assert_int_equal(lease_try(&e, &err), 0);
    assert_false(lease_is_leader(&e));
    lease_free(&e);
    kube_client_free(k);
    assert_int_equal(fake_join(&srv), 2);
    if (srv.mismatch[0]) fail_msg("%.300s", srv.mismatch);
    free(holder), free(first), free(renewed);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_str_fmt),
        cmocka_unit_test(test_str_grow),
        cmocka_unit_test(test_job_names),
        cmocka_unit_test(test_model_names),
        cmocka_unit_test(test_path_limits),
        cmocka_unit_test(test_crd_name_limit),
        cmocka_unit_test(test_job_spec_paths),
        cmocka_unit_test(test_kube_urls),
        cmocka_unit_test(test_list_continue_token),
        cmocka_unit_test(test_lease_long_holder),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
