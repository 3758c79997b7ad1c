/* watch_loop.c - list+watch with resourceVersion, bookmarks, relist on 410 Gone and reconnects
 * with exponential backoff and jitter (the reflector of client-go, in small). */
#include "operator/client/watch.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/strutil.h"
#include "operator/client/kube.h"

/* List pages: big clusters answer a few pages instead of one huge body. */
#define WATCH_LIST_PAGE 500
/* A watch that ends this quickly without a single event counts as a failure: a proxy that closes
 * every stream at once would otherwise make us reconnect in a tight loop. */
#define WATCH_MIN_HEALTHY_S 1.0
/* Slack on top of timeoutSeconds before our side gives up on a silent stream. */
#define WATCH_CLIENT_SLACK_S 30.0

double watch_backoff(double initial_s, double max_s, int failures, unsigned *seed) {
    if (failures < 1) return 0;
    double d = initial_s;
    for (int i = 1; i < failures && d < max_s; i++) d *= 2;
    if (d > max_s) d = max_s;
    /* rand_r is POSIX and reentrant: each loop has its own sequence */
    double jitter = 0.5 + 0.5 * ((double)rand_r(seed) / RAND_MAX);
    return d * jitter;
}

/* A query string, grown as it is written: a continue token or a selector is never cut (a cut one
 * would ask for another page, or other objects). */
typedef struct query {
    char *s;
    size_t len, cap;
} query;

/* Appends "&key=" (no '&' first) and the value percent-encoded: everything but RFC 3986 unreserved. */
static void add_param(query *q, const char *key, const char *value) {
    static const char hex[] = "0123456789ABCDEF";
    str_appendf(&q->s, &q->len, &q->cap, "%s%s=", q->len ? "&" : "", key);
    for (const unsigned char *p = (const unsigned char *)value; *p; p++) {
        if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
            *p == '-' || *p == '.' || *p == '_' || *p == '~')
            str_append(&q->s, &q->len, &q->cap, p, 1);
        else
            str_appendf(&q->s, &q->len, &q->cap, "%%%c%c", hex[*p >> 4], hex[*p & 15]);
    }
}

static void add_selectors(const watch_opts *o, query *q) {
    if (o->label_selector && *o->label_selector) add_param(q, "labelSelector", o->label_selector);
    if (o->field_selector && *o->field_selector) add_param(q, "fieldSelector", o->field_selector);
}

typedef struct loop {
    kube_client *k;
    const watch_opts *o;
    const watch_handler *h;
    watch_stats *st;
    watch_parser parser;
    char rv[128];
    bool gone; /* an ERROR event with code 410 */
    bool handler_failed; /* on_list/on_event failed: fatal, not a stream problem */
    bool stopped;
    long seen; /* events + bookmarks on this watch */
} loop;

static bool stop_requested(const loop *l) { return l->o->stop && atomic_load(l->o->stop); }

/* A cut resourceVersion would resume from another point: refused (an etcd revision is a 64-bit
 * number, far shorter than the buffer). */
static int set_rv(loop *l, const char *rv, err_t *err) {
    if (!rv || !*rv) return 0;
    if (str_fmt(l->rv, sizeof l->rv, err, "watch: the resourceVersion", "%s", rv) < 0) return -1;
    memcpy(l->st->rv, l->rv, sizeof l->st->rv);
    return 0;
}

/* Lists every page; calls on_list with all items. 0, or -1 with *status (410: the continue token
 * expired - start over) and the error set. */
static int do_list(loop *l, long *status, err_t *err) {
    cJSON *all = cJSON_CreateArray();
    char *cont = NULL, *path = NULL, rv[sizeof l->rv] = "";
    int rc = -1;
    l->st->lists++;
    for (;;) {
        query q = {0};
        str_appendf(&q.s, &q.len, &q.cap, "limit=%d", WATCH_LIST_PAGE);
        add_selectors(l->o, &q);
        if (cont) add_param(&q, "continue", cont);
        free(path);
        path = str_printf("%s?%s", l->o->path, q.s);
        free(q.s);
        cJSON *page;
        if (kube_get(l->k, path, &page, status, err) < 0) goto out;
        const cJSON *items = cJSON_GetObjectItemCaseSensitive(page, "items");
        const cJSON *md = cJSON_GetObjectItemCaseSensitive(page, "metadata");
        const cJSON *prv = cJSON_GetObjectItemCaseSensitive(md, "resourceVersion");
        const cJSON *pc = cJSON_GetObjectItemCaseSensitive(md, "continue");
        if (!cJSON_IsObject(page) || !(cJSON_IsArray(items) || cJSON_IsNull(items) || !items) ||
            !cJSON_IsString(prv) || !*prv->valuestring) {
            cJSON_Delete(page);
            *status = 0;
            err_set(err, "GET %s: not a list (items and metadata.resourceVersion expected)", path);
            goto out;
        }
        if (str_fmt(rv, sizeof rv, err, "watch: the list's resourceVersion", "%s", prv->valuestring) < 0) {
            cJSON_Delete(page);
            *status = 0;
            goto out;
        }
        const cJSON *it;
        cJSON_ArrayForEach(it, items) cJSON_AddItemToArray(all, cJSON_Duplicate(it, true));
        free(cont);
        cont = cJSON_IsString(pc) && *pc->valuestring ? xstrdup(pc->valuestring) : NULL;
        cJSON_Delete(page);
        if (!cont) break;
    }
    if (set_rv(l, rv, err) < 0) goto out;
    if (l->h->on_list && l->h->on_list(all, rv, l->h->arg, err) < 0) {
        l->handler_failed = true;
        goto out;
    }
    rc = 0;
out:
    free(cont);
    free(path);
    cJSON_Delete(all);
    return rc;
}

static int on_watch_event(watch_event *ev, void *arg, err_t *err) {
    loop *l = arg;
    l->seen++;
    switch (ev->type) {
    case WATCH_ERROR:
        if (ev->code == 410) {
            l->gone = true;
            return err_set(err, "watch: 410 Gone (%s)", ev->message ? ev->message : "expired");
        }
        return err_set(err, "watch: ERROR event %ld: %s", ev->code,
                       ev->message ? ev->message : "(no message)");
    case WATCH_BOOKMARK:
        l->st->bookmarks++;
        return set_rv(l, ev->resource_version, err);
    default:
        l->st->events++;
        if (!l->h->on_event) return set_rv(l, ev->resource_version, err);
        char rv[sizeof l->rv]; /* the handler takes the object it is in */
        if (str_fmt(rv, sizeof rv, err, "watch: the resourceVersion", "%s", ev->resource_version ? ev->resource_version : "") < 0)
            return -1;
        cJSON *obj = ev->object;
        ev->object = NULL;
        if (l->h->on_event(ev->type, obj, l->h->arg, err) < 0) {
            l->handler_failed = true;
            return -1;
        }
        /* only after the handler saw it: a reconnect resumes after the last handled event */
        return set_rv(l, rv, err);
    }
}

static int on_data(const char *data, size_t len, void *arg, err_t *err) {
    loop *l = arg;
    if (watch_parser_feed(&l->parser, data, len, err) < 0) return -1;
    if (stop_requested(l)) {
        l->stopped = true;
        return err_set(err, "watch stopped");
    }
    return 0;
}

/* One watch from l->rv. 0 when it ended cleanly, -1 otherwise (*status, l->gone,
 * l->handler_failed, l->stopped tell why). */
static int do_watch(loop *l, long *status, err_t *err) {
    int timeout = l->o->timeout_seconds > 0 ? l->o->timeout_seconds : 300;
    query q = {0};
    str_appendf(&q.s, &q.len, &q.cap, "watch=1&allowWatchBookmarks=true");
    add_param(&q, "resourceVersion", l->rv);
    str_appendf(&q.s, &q.len, &q.cap, "&timeoutSeconds=%d", timeout);
    add_selectors(l->o, &q);
    char *path = str_printf("%s?%s", l->o->path, q.s);
    free(q.s);
    l->st->watches++;
    l->gone = false;
    l->seen = 0;
    watch_parser_init(&l->parser, l->o->max_line, on_watch_event, l);
    double t0 = clock_now_s();
    int rc = kube_stream(l->k, path, timeout + WATCH_CLIENT_SLACK_S, on_data, l, status, err);
    if (rc == 0) rc = watch_parser_finish(&l->parser, err);
    if (rc == 0 && l->seen == 0 && clock_now_s() - t0 < WATCH_MIN_HEALTHY_S)
        rc = err_set(err, "GET %s: the watch ended at once without an event", path);
    watch_parser_free(&l->parser);
    free(path);
    if (*status == 410) l->gone = true;
    return rc;
}

/* Sleeps in short slices so that a stop request is noticed quickly. */
static void backoff_sleep(loop *l, double s) {
    l->st->slept_s += s;
    double end = clock_now_s() + s;
    while (!stop_requested(l)) {
        double left = end - clock_now_s();
        if (left <= 0) break;
        if (left > 0.05) left = 0.05;
        struct timespec ts = {0, (long)(left * 1e9)};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
    }
}

int watch_run(kube_client *k, const watch_opts *o, const watch_handler *h, watch_stats *stats,
              err_t *err) {
    watch_stats local;
    err_t err_local;
    if (!stats) stats = &local;
    if (!err) err = &err_local;
    memset(stats, 0, sizeof *stats);
    loop l = {.k = k, .o = o, .h = h, .st = stats};
    double b0 = o->backoff_initial_s > 0 ? o->backoff_initial_s : 0.5;
    double bmax = o->backoff_max_s > 0 ? o->backoff_max_s : 30.0;
    unsigned seed = o->seed ? o->seed : (unsigned)(clock_now_ms() * 1000.0);
    bool need_list = true;
    int failures = 0;
    while (!stop_requested(&l)) {
        long status = 0;
        int rc;
        if (need_list) {
            rc = do_list(&l, &status, err);
            if (rc == 0) need_list = false;
        } else {
            rc = do_watch(&l, &status, err);
            if (rc < 0 && l.gone) {
                /* the history we would resume from is compacted away: start from a fresh list,
                 * at once (this is the normal life of a long watch, not a failure) */
                stats->gone++;
                need_list = true;
                continue;
            }
        }
        if (l.handler_failed) return -1;
        if (l.stopped || stop_requested(&l)) break;
        if (rc == 0) {
            failures = 0;
            continue;
        }
        stats->failures++;
        failures++;
        if (o->max_failures > 0 && failures >= o->max_failures)
            return err_prefix(err, "watch %s: giving up after %d failures in a row", o->path,
                              failures);
        double wait = watch_backoff(b0, bmax, failures, &seed);
        log_warn("watch %s: %s; retrying in %.2fs", o->path, err->msg, wait);
        backoff_sleep(&l, wait);
    }
    return 0;
}
