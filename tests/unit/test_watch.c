/* test_watch.c - the watch-stream parser (pieces split anywhere, bookmarks, ERROR 410, bad and
 * overlong lines, truncation) and the list+watch loop against a scripted local HTTP server
 * (relist on 410 as an event and as a status, reconnect with backoff after a truncated stream
 * and a 500, re-watch from the last resourceVersion after a clean end). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_http.h"
#include "operator/client/kube.h"
#include "operator/client/watch.h"

/* ---- the parser ------------------------------------------------------------------------------ */

typedef struct seen {
    int n;
    char log[4096]; /* "TYPE:rv;" per event */
    long last_code;
    char last_msg[256];
    int stop_after; /* >0: the callback fails on that event */
    cJSON *taken; /* take: the objects the callback took, in an array it owns */
    bool take;
} seen;

static int record(watch_event *ev, void *arg, err_t *err) {
    seen *s = arg;
    if (s->take && ev->object) {
        if (!s->taken) s->taken = cJSON_CreateArray();
        cJSON_AddItemToArray(s->taken, ev->object); /* ours now: the parser must not free it */
        ev->object = NULL;
    }
    s->n++;
    size_t n = strlen(s->log);
    snprintf(s->log + n, sizeof s->log - n, "%s:%s;", watch_type_name(ev->type),
             ev->resource_version ? ev->resource_version : "-");
    s->last_code = ev->code;
    snprintf(s->last_msg, sizeof s->last_msg, "%s", ev->message ? ev->message : "");
    if (s->stop_after && s->n == s->stop_after) return err_set(err, "handler says stop");
    return 0;
}

static const char STREAM[] =
    "{\"type\":\"ADDED\",\"object\":{\"kind\":\"Pod\",\"metadata\":{\"name\":\"a\",\"resourceVersion\":\"11\"}}}\n"
    "{\"type\":\"MODIFIED\",\"object\":{\"kind\":\"Pod\",\"metadata\":{\"name\":\"a\",\"resourceVersion\":\"12\"}}}\r\n"
    "\n"
    "{\"type\":\"BOOKMARK\",\"object\":{\"kind\":\"Pod\",\"metadata\":{\"resourceVersion\":\"15\"}}}\n"
    "{\"type\":\"DELETED\",\"object\":{\"kind\":\"Pod\",\"metadata\":{\"name\":\"a\",\"resourceVersion\":\"16\"}}}\n"
    "{\"type\":\"ERROR\",\"object\":{\"kind\":\"Status\",\"code\":410,\"reason\":\"Expired\","
    "\"message\":\"too old resource version: 10 (14)\"}}\n";
static const char STREAM_LOG[] = "ADDED:11;MODIFIED:12;BOOKMARK:15;DELETED:16;ERROR:-;";

/* Feeds text in the given pieces; returns feed/finish's result. */
static int feed_pieces(const char *text, size_t len, const size_t *cuts, int ncuts, size_t max_line,
                       seen *s, err_t *err) {
    watch_parser p;
    watch_parser_init(&p, max_line, record, s);
    size_t off = 0;
    int rc = 0;
    for (int i = 0; i <= ncuts && rc == 0; i++) {
        size_t end = i < ncuts ? cuts[i] : len;
        rc = watch_parser_feed(&p, text + off, end - off, err);
        off = end;
    }
    if (rc == 0) rc = watch_parser_finish(&p, err);
    watch_parser_free(&p);
    return rc;
}

static void test_whole_stream(void **state) {
    (void)state;
    seen s = {0};
    err_t err;
    if (feed_pieces(STREAM, strlen(STREAM), NULL, 0, 0, &s, &err) != 0) fail_msg("%s", err.msg);
    assert_string_equal(s.log, STREAM_LOG);
    assert_int_equal(s.last_code, 410);
    assert_string_equal(s.last_msg, "too old resource version: 10 (14)");
}

/* A callback that takes the event's object (a store keeping it without a copy) owns it: the parser
 * frees only the objects left to it (ASan would see a double free or a leak). */
static void test_callback_takes(void **state) {
    (void)state;
    seen s = {.take = true};
    err_t err;
    if (feed_pieces(STREAM, strlen(STREAM), NULL, 0, 0, &s, &err) != 0) fail_msg("%s", err.msg);
    assert_string_equal(s.log, STREAM_LOG);
    assert_int_equal(cJSON_GetArraySize(s.taken), 5);
    const cJSON *first = cJSON_GetArrayItem(s.taken, 0), *last = cJSON_GetArrayItem(s.taken, 4);
    assert_string_equal(kube_meta_str(first, "resourceVersion"), "11");
    assert_string_equal(cJSON_GetObjectItem(last, "kind")->valuestring, "Status");
    cJSON_Delete(s.taken);
}

/* Every split into two pieces, and every split into three pieces around the line ends. */
static void test_every_split(void **state) {
    (void)state;
    size_t len = strlen(STREAM);
    for (size_t cut = 0; cut <= len; cut++) {
        seen s = {0};
        err_t err;
        if (feed_pieces(STREAM, len, &cut, 1, 0, &s, &err) != 0)
            fail_msg("cut %zu: %s", cut, err.msg);
        if (strcmp(s.log, STREAM_LOG) != 0) fail_msg("cut %zu: %s", cut, s.log);
    }
    for (size_t a = 0; a < len; a += 3)
        for (size_t b = a; b <= len; b += 17) {
            size_t cuts[2] = {a, b};
            seen s = {0};
            err_t err;
            if (feed_pieces(STREAM, len, cuts, 2, 0, &s, &err) != 0 ||
                strcmp(s.log, STREAM_LOG) != 0)
                fail_msg("cuts %zu,%zu: %s", a, b, s.log);
        }
}

static void test_byte_by_byte(void **state) {
    (void)state;
    watch_parser p;
    seen s = {0};
    err_t err;
    watch_parser_init(&p, 0, record, &s);
    for (size_t i = 0; STREAM[i]; i++)
        if (watch_parser_feed(&p, STREAM + i, 1, &err) != 0) fail_msg("%s", err.msg);
    assert_int_equal(watch_parser_finish(&p, &err), 0);
    watch_parser_free(&p);
    assert_string_equal(s.log, STREAM_LOG);
}

/* The input must fail with `needle` in the message after `events` good events. */
static void expect_bad(const char *text, size_t max_line, int events, const char *needle) {
    seen s = {0};
    err_t err = {{0}};
    int rc = feed_pieces(text, strlen(text), NULL, 0, max_line, &s, &err);
    if (rc != -1 || !strstr(err.msg, needle) || s.n != events)
        fail_msg("input %.60s: rc %d, %d events, message \"%s\"; wanted \"%s\" after %d", text, rc,
                 s.n, err.msg, needle, events);
}

#define GOOD "{\"type\":\"ADDED\",\"object\":{\"metadata\":{\"resourceVersion\":\"1\"}}}\n"

static void test_malformed_lines(void **state) {
    (void)state;
    expect_bad(GOOD "not json\n", 0, 1, "watch line 2: not JSON");
    expect_bad(GOOD GOOD "{\"type\":\"ADDED\",\"object\":{\"metadata\":{}}\n", 0, 2,
               "watch line 3: not JSON");
    expect_bad("[1,2]\n", 0, 0, "watch line 1: an event must be a JSON object");
    expect_bad("{\"object\":{}}\n", 0, 0, "missing string field 'type'");
    expect_bad("{\"type\":7,\"object\":{}}\n", 0, 0, "missing string field 'type'");
    expect_bad("{\"type\":\"RENAMED\",\"object\":{}}\n", 0, 0, "unknown event type 'RENAMED'");
    expect_bad("{\"type\":\"ADDED\"}\n", 0, 0, "missing object field 'object'");
    expect_bad("{\"type\":\"ADDED\",\"object\":[]}\n", 0, 0, "missing object field 'object'");
    expect_bad("{\"type\":\"MODIFIED\",\"object\":{\"kind\":\"Pod\"}}\n", 0, 0,
               "MODIFIED event without object.metadata");
    expect_bad("{\"type\":\"ADDED\",\"object\":{\"metadata\":{\"resourceVersion\":5}}}\n", 0, 0,
               "resourceVersion is not a string");
    expect_bad("{\"type\":\"BOOKMARK\",\"object\":{\"metadata\":{}}}\n", 0, 0,
               "BOOKMARK event without metadata.resourceVersion");
    expect_bad(GOOD "{\"type\":\"ADDED\",\"object\":{\"metadata\":{}}} {\"x\":1}\n", 0, 1,
               "(content after the end of the document)");
    expect_bad(GOOD "{\"type\":\"ADDED\",\"type\":\"DELETED\",\"object\":{}}\n", 0, 1,
               "watch line 2: not JSON (a truncated or corrupted event): event: field 'type' appears twice");
    /* NUL bytes inside a line are not JSON either */
    const char nul[] = "{\"type\":\"ADDED\",\0\"object\":{}}\n";
    seen s = {0};
    err_t err;
    assert_int_equal(feed_pieces(nul, sizeof nul - 1, NULL, 0, 0, &s, &err), -1);
    if (!strstr(err.msg, "watch line 1: a NUL byte")) fail_msg("%s", err.msg);
}

static void test_truncated(void **state) {
    (void)state;
    expect_bad(GOOD "{\"type\":\"ADDED\",\"obj", 0, 1,
               "watch line 2: stream ended inside an event (20 bytes without a newline");
    /* trailing blanks without a newline are not an event */
    seen s = {0};
    err_t err;
    assert_int_equal(feed_pieces(GOOD " \r", strlen(GOOD) + 2, NULL, 0, 0, &s, &err), 0);
    assert_int_equal(s.n, 1);
}

static void test_overlong_line(void **state) {
    (void)state;
    char line[200];
    int n = snprintf(line, sizeof line,
                     "{\"type\":\"ADDED\",\"object\":{\"metadata\":{\"resourceVersion\":\"%040d\"}}}",
                     7);
    /* exactly at the limit passes (the newline does not count) */
    char text[512];
    snprintf(text, sizeof text, "%s\n", line);
    seen s = {0};
    err_t err;
    if (feed_pieces(text, strlen(text), NULL, 0, (size_t)n, &s, &err) != 0) fail_msg("%s", err.msg);
    assert_int_equal(s.n, 1);
    /* one byte over fails, also when the line arrives in pieces */
    char msg[128];
    snprintf(msg, sizeof msg, "watch line 1: event longer than the limit of %d bytes", n - 1);
    expect_bad(text, (size_t)n - 1, 0, msg);
    size_t cuts[3] = {5, 30, 60};
    memset(&s, 0, sizeof s);
    assert_int_equal(feed_pieces(text, strlen(text), cuts, 3, (size_t)n - 1, &s, &err), -1);
    assert_non_null(strstr(err.msg, "longer than the limit"));
    /* a runaway line without newlines fails before the buffer grows past the limit */
    watch_parser p;
    watch_parser_init(&p, 1000, record, &s);
    char junk[300];
    memset(junk, 'x', sizeof junk);
    int rc = 0, i;
    for (i = 0; i < 10 && rc == 0; i++) rc = watch_parser_feed(&p, junk, sizeof junk, &err);
    assert_int_equal(rc, -1);
    assert_int_equal(i, 4);
    assert_true(p.cap <= 4096);
    /* and the stream stays failed */
    assert_int_equal(watch_parser_feed(&p, GOOD, strlen(GOOD), &err), -1);
    assert_non_null(strstr(err.msg, "stream already failed"));
    watch_parser_free(&p);
}

static void test_handler_stops(void **state) {
    (void)state;
    seen s = {.stop_after = 2};
    err_t err;
    assert_int_equal(feed_pieces(STREAM, strlen(STREAM), NULL, 0, 0, &s, &err), -1);
    assert_string_equal(err.msg, "handler says stop");
    assert_int_equal(s.n, 2);
}

static void test_backoff(void **state) {
    (void)state;
    unsigned seed = 42;
    assert_true(watch_backoff(0.5, 30, 0, &seed) == 0);
    for (int f = 1; f <= 12; f++) {
        double cap = 0.5;
        for (int i = 1; i < f; i++) cap *= 2;
        if (cap > 30) cap = 30;
        for (int k = 0; k < 50; k++) {
            double d = watch_backoff(0.5, 30, f, &seed);
            if (d < cap * 0.5 - 1e-9 || d > cap + 1e-9)
                fail_msg("failure %d: %g outside [%g, %g]", f, d, cap * 0.5, cap);
        }
    }
}

/* ---- the list+watch loop against a scripted server ----------------------------------------- */

#define LIST(rv, items) \
    "{\"kind\":\"PodList\",\"metadata\":{\"resourceVersion\":\"" rv "\"},\"items\":[" items "]}"
#define POD(name, rv) "{\"metadata\":{\"name\":\"" name "\",\"resourceVersion\":\"" rv "\"}}"
#define EV(type, name, rv) "{\"type\":\"" type "\",\"object\":" POD(name, rv) "}\n"
#define SEL "&labelSelector=app%3Dcephalo"
#define LPATH "/api/v1/namespaces/ns/pods?limit=500" SEL
#define WPATH(rv)                                                                               \
    "/api/v1/namespaces/ns/pods?watch=1&allowWatchBookmarks=true&resourceVersion=" rv          \
    "&timeoutSeconds=5" SEL

typedef struct informer {
    atomic_int stop;
    int good_lists;
    char log[4096];
} informer;

static int inf_list(const cJSON *items, const char *rv, void *arg, err_t *err) {
    (void)err;
    informer *in = arg;
    size_t n = strlen(in->log);
    n += (size_t)snprintf(in->log + n, sizeof in->log - n, "LIST@%s[", rv);
    const cJSON *it;
    cJSON_ArrayForEach(it, items) {
        n += (size_t)snprintf(in->log + n, sizeof in->log - n, "%s,", kube_meta_str(it, "name"));
    }
    snprintf(in->log + n, sizeof in->log - n, "];");
    if (++in->good_lists == 3) atomic_store(&in->stop, 1);
    return 0;
}

static int inf_event(watch_type t, cJSON *obj, void *arg, err_t *err) {
    (void)err;
    informer *in = arg;
    size_t n = strlen(in->log);
    snprintf(in->log + n, sizeof in->log - n, "%s %s@%s;", watch_type_name(t),
             kube_meta_str(obj, "name"), kube_meta_str(obj, "resourceVersion"));
    cJSON_Delete(obj); /* the handler's */
    return 0;
}

static kube_client *local_client(const fake_server *srv) {
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", srv->port);
    kube_config cfg = {.server = url, .namespace = (char *)"ns", .token = (char *)"tok"};
    err_t err;
    kube_client *k = kube_client_new(&cfg, &err);
    if (!k) fail_msg("%s", err.msg);
    return k;
}

static void test_list_watch_relist_backoff(void **state) {
    (void)state;
    static const fake_step script[] = {
        {"GET", LPATH, 200, LIST("10", POD("a", "5")), 0, false},
        /* events in 7-byte pieces, a bookmark, then 410 as an ERROR event */
        {"GET", WPATH("10"), 200,
         EV("ADDED", "b", "11") EV("MODIFIED", "a", "12")
             "{\"type\":\"BOOKMARK\",\"object\":{\"metadata\":{\"resourceVersion\":\"15\"}}}\n"
             "{\"type\":\"ERROR\",\"object\":{\"kind\":\"Status\",\"code\":410,"
             "\"reason\":\"Expired\",\"message\":\"too old resource version\"}}\n",
         7, true},
        {"GET", LPATH, 200, LIST("20", POD("a", "12") "," POD("b", "11")), 0, false},
        /* a watch that ends cleanly: watch again from its last event, no backoff */
        {"GET", WPATH("20"), 200, EV("ADDED", "c", "21"), 0, true},
        /* a stream cut inside an event: back off, resume from the last whole event */
        {"GET", WPATH("21"), 200, EV("DELETED", "b", "22") "{\"type\":\"ADDED\",\"obj", 5, true},
        /* 410 as the HTTP status of the watch itself */
        {"GET", WPATH("22"), 410,
         "{\"kind\":\"Status\",\"code\":410,\"reason\":\"Expired\",\"message\":\"gone\"}", 0,
         false},
        {"GET", LPATH, 500, "{\"kind\":\"Status\",\"code\":500,\"message\":\"etcd is sad\"}", 0,
         false},
        {"GET", LPATH, 200, LIST("30", POD("a", "12") "," POD("c", "21")), 0, false},
    };
    int n = (int)(sizeof script / sizeof *script);
    fake_server srv;
    assert_int_equal(fake_start(&srv, script, n), 0);
    kube_client *k = local_client(&srv);
    informer in = {0};
    watch_opts o = {.path = "/api/v1/namespaces/ns/pods", .label_selector = "app=cephalo",
                    .timeout_seconds = 5, .backoff_initial_s = 0.01, .backoff_max_s = 0.05,
                    .stop = &in.stop, .seed = 7};
    watch_handler h = {inf_list, inf_event, &in};
    watch_stats st;
    err_t err;
    int rc = watch_run(k, &o, &h, &st, &err);
    int served = fake_join(&srv);
    kube_client_free(k);
    if (srv.mismatch[0]) fail_msg("%s", srv.mismatch);
    if (rc != 0) fail_msg("%s", err.msg);
    assert_int_equal(served, n);
    assert_string_equal(in.log, "LIST@10[a,];ADDED b@11;MODIFIED a@12;"
                                "LIST@20[a,b,];ADDED c@21;DELETED b@22;"
                                "LIST@30[a,c,];");
    assert_int_equal(st.lists, 4);
    assert_int_equal(st.watches, 4);
    assert_int_equal(st.events, 4);
    assert_int_equal(st.bookmarks, 1);
    assert_int_equal(st.gone, 2);
    assert_int_equal(st.failures, 2);
    assert_string_equal(st.rv, "30");
    assert_true(st.slept_s > 0 && st.slept_s < 0.2);
    /* the bearer token went with every request */
    for (int i = 0; i < n; i++) assert_non_null(strstr(srv.head[i], "Authorization: Bearer tok"));
}

static int fail_on_event(watch_type t, cJSON *obj, void *arg, err_t *err) {
    (void)t, (void)arg;
    cJSON_Delete(obj);
    return err_set(err, "reconcile failed");
}

/* A handler error ends the loop (it is a bug or a fatal condition, not a stream problem);
 * max_failures bounds the retries when the server keeps failing. */
static void test_handler_error_and_give_up(void **state) {
    (void)state;
    static const fake_step script[] = {
        {"GET", LPATH, 200, LIST("10", ""), 0, false},
        {"GET", WPATH("10"), 200, EV("ADDED", "b", "11"), 0, true},
    };
    fake_server srv;
    assert_int_equal(fake_start(&srv, script, 2), 0);
    kube_client *k = local_client(&srv);
    informer in = {0};
    watch_opts o = {.path = "/api/v1/namespaces/ns/pods", .label_selector = "app=cephalo",
                    .timeout_seconds = 5, .backoff_initial_s = 0.01, .stop = &in.stop};
    watch_handler h = {inf_list, fail_on_event, &in};
    err_t err;
    assert_int_equal(watch_run(k, &o, &h, NULL, &err), -1);
    assert_string_equal(err.msg, "reconcile failed");
    fake_join(&srv);
    kube_client_free(k);
    if (srv.mismatch[0]) fail_msg("%s", srv.mismatch);

    static const fake_step down[] = {
        {"GET", LPATH, 503, "{\"kind\":\"Status\",\"message\":\"starting\"}", 0, false},
        {"GET", LPATH, 0, NULL, 0, false}, /* the connection drops without an answer */
        {"GET", LPATH, 403, "{\"kind\":\"Status\",\"message\":\"pods is forbidden\"}", 0, false},
    };
    assert_int_equal(fake_start(&srv, down, 3), 0);
    k = local_client(&srv);
    o.max_failures = 3;
    watch_stats st;
    assert_int_equal(watch_run(k, &o, &h, &st, &err), -1);
    fake_join(&srv);
    kube_client_free(k);
    if (srv.mismatch[0]) fail_msg("%s", srv.mismatch);
    assert_non_null(strstr(err.msg, "giving up after 3 failures in a row"));
    assert_non_null(strstr(err.msg, "HTTP 403: pods is forbidden"));
    assert_int_equal(st.failures, 3);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_whole_stream),
        cmocka_unit_test(test_callback_takes),
        cmocka_unit_test(test_every_split),
        cmocka_unit_test(test_byte_by_byte),
        cmocka_unit_test(test_malformed_lines),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_overlong_line),
        cmocka_unit_test(test_handler_stops),
        cmocka_unit_test(test_backoff),
        cmocka_unit_test(test_list_watch_relist_backoff),
        cmocka_unit_test(test_handler_error_and_give_up),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
