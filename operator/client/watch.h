/* watch.h - Kubernetes watches: the parser of the watch stream and the list+watch loop.
 *
 * A watch response is newline-delimited JSON, one event per line:
 *   {"type": "ADDED", "object": {...}}            also MODIFIED, DELETED
 *   {"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": "12345"}}}
 *   {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired", ...}}
 * The parser (watch.c) takes the body in whatever pieces the network delivers, keeps a partial
 * line across pieces, and hands each complete event to a callback. It needs no network and is
 * fuzzed (fuzz/fuzz_watch.c). Bad input never crashes it: an overlong line, a line that is not
 * JSON, or an event of the wrong shape is an error naming the line; the stream cannot be trusted
 * after that and the loop reconnects from the last good resourceVersion.
 *
 * The loop (watch_loop.c) is client-go's reflector: list (remember the list's resourceVersion),
 * then watch from it with allowWatchBookmarks; follow the resourceVersion through events and
 * bookmarks; when the server ends the watch, watch again from there; on 410 Gone (an HTTP status
 * or an ERROR event) the history is compacted away, so list again; on a broken connection or any
 * other error wait with exponential backoff and jitter, then watch (or list) again. */
#ifndef CEPHALO_WATCH_H
#define CEPHALO_WATCH_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "common/err.h"

/* Longest event line accepted by default: objects are limited to ~1.5 MiB by etcd; 16 MiB
 * leaves room for large objects JSON-escaped and still bounds memory on a runaway stream. */
#define WATCH_MAX_LINE_DEFAULT ((size_t)16 << 20)

typedef enum { WATCH_ADDED, WATCH_MODIFIED, WATCH_DELETED, WATCH_BOOKMARK, WATCH_ERROR } watch_type;

const char *watch_type_name(watch_type t);

typedef struct watch_event {
    watch_type type;
    cJSON *object; /* the callback may take it (then it sets this NULL); else freed when it returns */
    const char *resource_version; /* object.metadata.resourceVersion (NULL for ERROR): in object */
    long code; /* ERROR: the Status code (410: Gone), else 0 */
    const char *message; /* ERROR: the Status message, or NULL */
} watch_event;

/* Return 0 to go on, -1 with the error set to stop the stream. */
typedef int (*watch_event_fn)(watch_event *ev, void *arg, err_t *err);

typedef struct watch_parser {
    char *line; /* the partial line carried between pieces */
    size_t len, cap, max_line;
    long line_no; /* lines completed so far, for messages */
    long events;
    bool failed; /* after an error every feed fails: the stream is out of sync */
    watch_event_fn fn;
    void *arg;
} watch_parser;

/* max_line 0 takes WATCH_MAX_LINE_DEFAULT. */
void watch_parser_init(watch_parser *p, size_t max_line, watch_event_fn fn, void *arg);
/* Feeds a piece of the body; calls fn for each complete line. 0, or -1 with the error set
 * ("watch line N: ...") on a bad line or when fn stopped. */
int watch_parser_feed(watch_parser *p, const char *data, size_t len, err_t *err);
/* The stream ended: a partial line left over is a truncated event (-1); else 0. */
int watch_parser_finish(watch_parser *p, err_t *err);
void watch_parser_free(watch_parser *p);

/* ---- the list+watch loop (needs the client) ------------------------------------------------ */

struct kube_client;

typedef struct watch_handler {
    /* After every (re)list: the complete current state. Items not in it are gone (a relist may
     * follow missed DELETED events). `items` is the list's array, rv its resourceVersion. */
    int (*on_list)(const cJSON *items, const char *rv, void *arg, err_t *err);
    /* Each ADDED, MODIFIED or DELETED event (bookmarks and errors are handled by the loop). The
     * object is the handler's, to keep (a store takes it: no copy) or to free. */
    int (*on_event)(watch_type type, cJSON *object, void *arg, err_t *err);
    void *arg;
} watch_handler;

typedef struct watch_opts {
    const char *path; /* collection path, e.g. /api/v1/pods (kube_path with name NULL) */
    const char *label_selector; /* NULL or e.g. "app=cephalo" (URL-safe characters only) */
    const char *field_selector;
    int timeout_seconds; /* the server ends each watch after this (0: 300) */
    double backoff_initial_s; /* first wait after a failure (0: 0.5 s) */
    double backoff_max_s; /* the doubling stops here (0: 30 s) */
    int max_failures; /* consecutive failures before watch_run gives up (0: never) */
    size_t max_line; /* 0: WATCH_MAX_LINE_DEFAULT */
    const atomic_int *stop; /* watch_run returns 0 soon after *stop becomes nonzero */
    unsigned seed; /* jitter seed (0: from the clock) */
} watch_opts;

typedef struct watch_stats {
    long lists, watches, events, bookmarks;
    long gone; /* 410s seen (each followed by a relist) */
    long failures; /* failed lists or watches (each followed by a backoff) */
    double slept_s; /* total backoff */
    char rv[128]; /* the last resourceVersion seen */
} watch_stats;

/* Runs until *stop (returns 0), a handler error, or max_failures consecutive failures (-1 with
 * the last error). `stats` may be NULL. */
int watch_run(struct kube_client *k, const watch_opts *o, const watch_handler *h,
              watch_stats *stats, err_t *err);

/* The wait before retry number `failures` (1, 2, ...): initial * 2^(failures-1) capped at max,
 * then scaled by a random factor in [0.5, 1.0] so that many watchers do not reconnect in step. */
double watch_backoff(double initial_s, double max_s, int failures, unsigned *seed);

#endif
