/* test_cache.c - the operator's stores of watched objects (operator/client/cache.c): put, get, list with a
 * filter, remove, a relist replacing everything, the newer of two versions kept (a late watch
 * event never undoes a write's answer), copies owned by the reader, and writers racing readers;
 * and the client's request counts by verb (kube_requests) against a scripted server. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_http.h"
#include "operator/client/cache.h"
#include "operator/client/kube.h"

/* {"metadata": {"name", "namespace", "resourceVersion", "labels": {"job": job}}, "spec": {"n": n}} */
static cJSON *obj(const char *ns, const char *name, const char *rv, const char *job, int n) {
    cJSON *o = cJSON_CreateObject(), *m = cJSON_AddObjectToObject(o, "metadata");
    cJSON_AddStringToObject(m, "name", name);
    if (ns) cJSON_AddStringToObject(m, "namespace", ns);
    if (rv) cJSON_AddStringToObject(m, "resourceVersion", rv);
    if (job) cJSON_AddStringToObject(cJSON_AddObjectToObject(m, "labels"), "job", job);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(o, "spec"), "n", n);
    return o;
}

static int n_of(const cJSON *o) {
    return cJSON_GetObjectItem(cJSON_GetObjectItem(o, "spec"), "n")->valueint;
}

static void put(cache *c, cJSON *o) {
    cJSON *prev;
    cache_put(c, o, &prev);
    cJSON_Delete(prev);
    cJSON_Delete(o);
}

static void test_put_get_remove(void **state) {
    (void)state;
    cache *c = cache_new("pods");
    assert_false(cache_synced(c));
    assert_null(cache_get(c, "a", "x"));
    put(c, obj("a", "x", "5", "j1", 1));
    put(c, obj("b", "x", "6", "j2", 2)); /* same name, other namespace */
    put(c, obj(NULL, "node-1", "7", NULL, 3)); /* cluster-scoped */
    assert_int_equal(cache_size(c), 3);
    cJSON *g = cache_get(c, "a", "x");
    assert_non_null(g);
    assert_int_equal(n_of(g), 1);
    cJSON_SetNumberValue(cJSON_GetObjectItem(cJSON_GetObjectItem(g, "spec"), "n"), 99); /* a copy */
    cJSON_Delete(g);
    g = cache_get(c, "a", "x");
    assert_int_equal(n_of(g), 1);
    cJSON_Delete(g);
    g = cache_get(c, NULL, "node-1");
    assert_non_null(g);
    assert_int_equal(n_of(g), 3);
    cJSON_Delete(g);
    assert_null(cache_get(c, "a", "node-1"));
    assert_null(cache_get(c, "", "x")); /* "a/x" is not "/x" */

    cJSON *prev = NULL;
    cJSON *o = obj("a", "x", "8", "j1", 4);
    assert_true(cache_put(c, o, &prev)); /* a newer version: replaced, the old one handed back */
    assert_non_null(prev);
    assert_int_equal(n_of(prev), 1);
    cJSON_Delete(prev);
    cJSON_Delete(o);
    cache_remove(c, "a", "x");
    cache_remove(c, "a", "missing"); /* nothing */
    assert_null(cache_get(c, "a", "x"));
    assert_int_equal(cache_size(c), 2);
    cache_free(c);
}

/* The answer to the operator's own write (rv 20) arrives before the watch's older events (rv 12):
 * those must not undo it; a version that is not a number is never compared. */
static void test_newer_version_kept(void **state) {
    (void)state;
    cache *c = cache_new("cephalojobs");
    put(c, obj("ns", "job", "20", NULL, 2));
    cJSON *late = obj("ns", "job", "12", NULL, 1), *prev = (cJSON *)1;
    assert_false(cache_put(c, late, &prev));
    assert_null(prev);
    cJSON_Delete(late);
    cJSON *g = cache_get(c, "ns", "job");
    assert_int_equal(n_of(g), 2);
    cJSON_Delete(g);
    cJSON *echo = obj("ns", "job", "20", NULL, 2); /* the watch echoing a write the store has: nothing new */
    assert_false(cache_put(c, echo, NULL));
    cJSON_Delete(echo);
    put(c, obj("ns", "job", "100", NULL, 3)); /* numerically newer ("100" < "20" as text) */
    g = cache_get(c, "ns", "job");
    assert_int_equal(n_of(g), 3);
    cJSON_Delete(g);
    put(c, obj("ns", "job", "opaque", NULL, 4)); /* not a number: taken as it comes */
    g = cache_get(c, "ns", "job");
    assert_int_equal(n_of(g), 4);
    cJSON_Delete(g);
    cJSON *nameless = cJSON_Parse("{\"metadata\": {}}");
    assert_false(cache_put(c, nameless, NULL));
    cJSON_Delete(nameless);
    cache_free(c);
}

static bool of_job(const cJSON *o, void *arg) {
    const cJSON *l = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "metadata"), "labels");
    const cJSON *j = cJSON_GetObjectItem(l, "job");
    return cJSON_IsString(j) && !strcmp(j->valuestring, arg);
}

static void test_list_and_replace(void **state) {
    (void)state;
    cache *c = cache_new("pods");
    for (int i = 0; i < 10; i++) {
        char name[16];
        snprintf(name, sizeof name, "p%d", i);
        put(c, obj("ns", name, "1", i % 3 == 0 ? "a" : "b", i));
    }
    cJSON *l = cache_list(c, of_job, "a");
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(l, "items")), 4); /* p0 p3 p6 p9 */
    cJSON_Delete(l);
    l = cache_list(c, NULL, NULL);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(l, "items")), 10);
    cJSON_Delete(l);

    /* a relist is the whole truth: what it lacks is gone, and the store is synced */
    cJSON *items = cJSON_CreateArray();
    cJSON_AddItemToArray(items, obj("ns", "p3", "2", "a", 33));
    cJSON_AddItemToArray(items, obj("ns", "q", "2", "c", 7));
    cache_replace(c, items);
    cJSON_Delete(items);
    assert_true(cache_synced(c));
    assert_int_equal(cache_size(c), 2);
    assert_null(cache_get(c, "ns", "p0"));
    cJSON *g = cache_get(c, "ns", "p3");
    assert_int_equal(n_of(g), 33);
    cJSON_Delete(g);
    l = cache_list(c, of_job, "b");
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(l, "items")), 0);
    cJSON_Delete(l);
    cache_free(c);
    cache_free(NULL);
}

/* A watch thread writing while the reconcile thread reads: every read is a whole object. */
typedef struct racer {
    cache *c;
    int rounds;
} racer;

static void *writer(void *arg) {
    racer *r = arg;
    for (int i = 0; i < r->rounds; i++) {
        char rv[16], name[16];
        snprintf(rv, sizeof rv, "%d", i + 1);
        snprintf(name, sizeof name, "p%d", i % 50);
        put(r->c, obj("ns", name, rv, "a", i));
        if (i % 7 == 0) cache_remove(r->c, "ns", name);
    }
    return NULL;
}

/* One watch per namespace feeding one store: a namespace's relist replaces that namespace's objects
 * and leaves the others' (the operator watching a list of namespaces); a namespace that is a
 * prefix of another ("ml" of "ml2") takes nothing of it. */
static void test_replace_one_namespace(void **state) {
    (void)state;
    cache *c = cache_new("pods");
    const char *ns[] = {"ml", "ml2", "ml", "ml2", "m"};
    for (int i = 0; i < 5; i++) {
        char name[16];
        snprintf(name, sizeof name, "p%d", i);
        cJSON *o = obj(ns[i], name, "1", "a", i);
        cache_put(c, o, NULL);
        cJSON_Delete(o);
    }
    cJSON *items = cJSON_CreateArray();
    cJSON_AddItemToArray(items, obj("ml", "q", "2", "a", 9));
    cache_replace_ns(c, "ml", items);
    cJSON_Delete(items);
    assert_int_equal(cache_size(c), 4); /* ml2's p1 p3, m's p4, ml's q */
    const char *gone[][2] = {{"ml", "p0"}, {"ml", "p2"}};
    for (int i = 0; i < 2; i++) assert_null(cache_get(c, gone[i][0], gone[i][1]));
    const char *kept[][2] = {{"ml2", "p1"}, {"ml2", "p3"}, {"m", "p4"}, {"ml", "q"}};
    for (int i = 0; i < 4; i++) {
        cJSON *g = cache_get(c, kept[i][0], kept[i][1]);
        assert_non_null(g);
        cJSON_Delete(g);
    }
    items = cJSON_CreateArray();
    cache_replace_ns(c, "ml2", items); /* an empty namespace now */
    cJSON_Delete(items);
    assert_int_equal(cache_size(c), 2);
    assert_true(cache_synced(c));
    cache_free(c);
}

static void test_concurrent_readers(void **state) {
    (void)state;
    racer r = {cache_new("pods"), 20000};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, writer, &r), 0);
    long seen = 0;
    for (int i = 0; i < 2000; i++) {
        cJSON *l = cache_list(r.c, of_job, "a");
        const cJSON *o;
        cJSON_ArrayForEach(o, cJSON_GetObjectItem(l, "items")) {
            assert_non_null(kube_meta_str(o, "name"));
            assert_true(n_of(o) >= 0);
            seen++;
        }
        cJSON_Delete(l);
        cJSON *g = cache_get(r.c, "ns", "p1");
        if (g) assert_string_equal(kube_meta_str(g, "name"), "p1");
        cJSON_Delete(g);
    }
    pthread_join(th, NULL);
    assert_true(seen >= 0);
    assert_true(cache_size(r.c) <= 50);
    cache_free(r.c);
}

/* kube_requests: each request counted once by its verb; a GET of a collection is a list. */
static void test_request_counts(void **state) {
    (void)state;
    static const fake_step script[] = {
        {"GET", "/api/v1/nodes", 200, "{\"items\":[]}", 0, false},
        {"GET", "/api/v1/namespaces/ns/pods?labelSelector=a", 200, "{\"items\":[]}", 0, false},
        {"GET", "/apis/cephalo.dev/v1alpha1/cephalojobs", 200, "{\"items\":[]}", 0, false},
        {"GET", "/apis/cephalo.dev/v1alpha1/namespaces/ns/cephalojobs", 200, "{\"items\":[]}", 0, false},
        {"GET", "/api/v1/namespaces/ns/pods/p", 200, "{}", 0, false},
        {"GET", "/api/v1/namespaces/ns", 200, "{}", 0, false},
        {"GET", "/api/v1/nodes/n1", 200, "{}", 0, false},
        {"GET", "/apis/cephalo.dev/v1alpha1/namespaces/ns/cephalojobs/j", 200, "{}", 0, false},
        {"POST", "/api/v1/namespaces/ns/pods", 201, "{}", 0, false},
        {"PUT", "/apis/cephalo.dev/v1alpha1/namespaces/ns/cephalojobs/j/status", 200, "{}", 0, false},
        {"PATCH", "/api/v1/namespaces/ns/configmaps/c", 200, "{}", 0, false},
        {"DELETE", "/api/v1/namespaces/ns/pods/p?propagationPolicy=Background", 200, "{}", 0, false},
    };
    long before[KUBE_VERB_COUNT];
    for (int v = 0; v < KUBE_VERB_COUNT; v++) before[v] = kube_requests((kube_verb)v);
    fake_server srv;
    assert_int_equal(fake_start(&srv, script, 12), 0);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", srv.port);
    kube_config cfg = {.server = url, .namespace = (char *)"ns"};
    err_t err;
    kube_client *k = kube_client_new(&cfg, &err);
    assert_non_null(k);
    long st;
    cJSON *out;
    for (int i = 0; i < 8; i++) {
        assert_int_equal(kube_get(k, script[i].path, &out, &st, &err), 0);
        cJSON_Delete(out);
    }
    cJSON *body = cJSON_Parse("{}");
    assert_int_equal(kube_create(k, "/api/v1/namespaces/ns/pods", body, NULL, &st, &err), 0);
    assert_int_equal(kube_replace(k, script[9].path, body, NULL, &st, &err), 0);
    assert_int_equal(kube_merge_patch(k, script[10].path, body, NULL, &st, &err), 0);
    assert_int_equal(kube_delete(k, "/api/v1/namespaces/ns/pods/p", &st, &err), 0);
    cJSON_Delete(body);
    kube_client_free(k);
    assert_int_equal(fake_join(&srv), 12);
    if (srv.mismatch[0]) fail_msg("%s", srv.mismatch);
    static const long want[KUBE_VERB_COUNT] = {[KUBE_VERB_LIST] = 4, [KUBE_VERB_GET] = 4, [KUBE_VERB_CREATE] = 1,
                                               [KUBE_VERB_UPDATE] = 1, [KUBE_VERB_PATCH] = 1, [KUBE_VERB_DELETE] = 1};
    for (int v = 0; v < KUBE_VERB_COUNT; v++)
        if (kube_requests((kube_verb)v) - before[v] != want[v])
            fail_msg("%s: %ld requests counted, want %ld", kube_verb_name((kube_verb)v),
                     kube_requests((kube_verb)v) - before[v], want[v]);
}

/* A digest for the tests: the object's spec.n, counted as made. */
static int digests_made;
static void *n_digest(const cJSON *o) {
    if (n_of(o) < 0) return NULL; /* objects without one */
    int *d = malloc(sizeof *d);
    assert_non_null(d);
    *d = n_of(o);
    digests_made++;
    return d;
}

/* Digests are made once per stored version (not per view), stay with the view's objects, and a
 * stored object leaves out metadata.managedFields. */
static void test_digests_and_stripped_fields(void **state) {
    (void)state;
    cache *c = cache_new("busy pods");
    cache_set_digest(c, n_digest);
    digests_made = 0;
    cJSON *o = obj("ns", "a", "1", NULL, 7);
    cJSON_AddArrayToObject(cJSON_GetObjectItem(o, "metadata"), "managedFields");
    put(c, o);
    put(c, obj("ns", "b", "1", NULL, -1));
    assert_int_equal(digests_made, 1);
    cJSON *got = cache_get(c, "ns", "a");
    assert_null(cJSON_GetObjectItem(cJSON_GetObjectItem(got, "metadata"), "managedFields"));
    assert_string_equal(kube_meta_str(got, "resourceVersion"), "1"); /* the rest is kept */
    cJSON_Delete(got);
    cache_view v1, v2;
    const cJSON *items = cJSON_GetObjectItem(cache_view_list(c, NULL, NULL, &v1), "items");
    cache_view_list(c, NULL, NULL, &v2);
    assert_int_equal(digests_made, 1); /* views share the stored digests */
    assert_true(v1.digested);
    for (int i = 0; i < v1.n; i++) {
        const int *d = cache_view_digest(&v1, i);
        const char *name = kube_meta_str(cJSON_GetArrayItem(items, i), "name");
        if (!strcmp(name, "a")) assert_int_equal(*d, 7);
        else assert_null(d);
    }
    assert_null(cache_view_digest(&v1, v1.n)); /* out of range */
    /* a newer version gets its own digest; the view still has the old one */
    put(c, obj("ns", "a", "2", NULL, 8));
    assert_int_equal(digests_made, 2);
    for (int i = 0; i < v1.n; i++)
        if (cache_view_digest(&v1, i)) assert_int_equal(*(const int *)cache_view_digest(&v1, i), 7);
    cache_view_release(&v1);
    cache_view_release(&v2);
    cache_free(c);
    /* a store without a digest function says so */
    c = cache_new("pods");
    put(c, obj("ns", "a", "1", NULL, 1));
    cache_view_list(c, NULL, NULL, &v1);
    assert_false(v1.digested);
    assert_null(cache_view_digest(&v1, 0));
    cache_view_release(&v1);
    cache_free(c);
}

/* Index keys: made once per stored version, a view by key holds exactly the objects with that key
 * (a relabelled object moves, a removed one leaves, objects without a key are in no view), and an
 * old view keeps what it had. */
static int indexes_made;
static char *job_index(const cJSON *o) {
    const cJSON *job = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "metadata"), "labels"), "job");
    indexes_made++;
    if (!cJSON_IsString(job)) return NULL;
    char *k = malloc(strlen(job->valuestring) + 1);
    assert_non_null(k);
    return strcpy(k, job->valuestring);
}

static const char *job_index_of(const cJSON *o) {
    return cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "metadata"), "labels"), "job")->valuestring;
}

static int view_count(cache *c, const char *key, int want_n) {
    cache_view v;
    const cJSON *items = cJSON_GetObjectItem(cache_view_index(c, key, &v), "items");
    int n = cJSON_GetArraySize(items);
    assert_int_equal(n, v.n);
    assert_int_equal(n, want_n);
    const cJSON *it;
    cJSON_ArrayForEach(it, items) assert_string_equal(job_index_of(it), key);
    cache_view_release(&v);
    return n;
}

static void test_index(void **state) {
    (void)state;
    cache *c = cache_new("pods");
    cache_set_index(c, job_index);
    indexes_made = 0;
    put(c, obj("ns", "a", "1", "j1", 1));
    put(c, obj("ns", "b", "1", "j1", 2));
    put(c, obj("ns", "c", "1", "j2", 3));
    put(c, obj("ns", "d", "1", NULL, 4));
    assert_int_equal(indexes_made, 4);
    cache_view old;
    cache_view_index(c, "j1", &old);
    view_count(c, "j1", 2);
    view_count(c, "j2", 1);
    view_count(c, "nobody", 0);
    assert_int_equal(indexes_made, 4); /* views read the keys made when stored */
    put(c, obj("ns", "b", "2", "j2", 5)); /* relabelled: moves from j1 to j2 */
    view_count(c, "j1", 1);
    view_count(c, "j2", 2);
    cache_remove(c, "ns", "c");
    view_count(c, "j2", 1);
    assert_int_equal(old.n, 2); /* the old view keeps its objects */
    cache_view_release(&old);
    cache_free(c);
}

/* A put that hands the object over: stored as given but for managedFields (no copy: a later
 * change to it would show, which is why only a watch's freshly parsed objects are handed over),
 * or freed when the store keeps a newer version (ASan would see the leak or a double free). */
static void test_put_owned(void **state) {
    (void)state;
    cache *c = cache_new("pods");
    cJSON *o = obj("ns", "a", "5", "j1", 1);
    cJSON_AddArrayToObject(cJSON_GetObjectItem(o, "metadata"), "managedFields");
    assert_true(cache_put_owned(c, o, NULL));
    assert_null(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "metadata"), "managedFields")); /* stripped in place */
    cJSON *prev;
    assert_false(cache_put_owned(c, obj("ns", "a", "4", "j1", 2), &prev)); /* older: freed */
    assert_null(prev);
    assert_true(cache_put_owned(c, obj("ns", "a", "6", "j1", 3), &prev));
    assert_int_equal(n_of(prev), 1);
    cJSON_Delete(prev);
    assert_false(cache_put_owned(c, obj("ns", NULL, "7", "j1", 4), NULL)); /* nameless: freed */
    cJSON *g = cache_get(c, "ns", "a");
    assert_int_equal(n_of(g), 3);
    cJSON_Delete(g);
    cache_free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_put_get_remove),
        cmocka_unit_test(test_newer_version_kept),
        cmocka_unit_test(test_list_and_replace),
        cmocka_unit_test(test_replace_one_namespace),
        cmocka_unit_test(test_concurrent_readers),
        cmocka_unit_test(test_request_counts),
        cmocka_unit_test(test_digests_and_stripped_fields),
        cmocka_unit_test(test_index),
        cmocka_unit_test(test_put_owned),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
