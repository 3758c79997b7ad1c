/* watch.c - the watch-stream parser: newline-delimited JSON events fed in arbitrary pieces.
 * No network here (fuzz/fuzz_watch.c links this file alone with common/). */
#include "operator/client/watch.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json_util.h"
#include "common/log.h"
#include "common/strutil.h"

static const char *const type_names[] = {"ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"};

const char *watch_type_name(watch_type t) {
    return (unsigned)t < sizeof type_names / sizeof *type_names ? type_names[t] : "?";
}

void watch_parser_init(watch_parser *p, size_t max_line, watch_event_fn fn, void *arg) {
    memset(p, 0, sizeof *p);
    p->max_line = max_line ? max_line : WATCH_MAX_LINE_DEFAULT;
    p->fn = fn;
    p->arg = arg;
}

void watch_parser_free(watch_parser *p) {
    free(p->line);
    p->line = NULL;
    p->len = p->cap = 0;
}

static int fail(watch_parser *p, err_t *err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Marks the stream failed and sets "watch line N: ..." */
static int fail(watch_parser *p, err_t *err, const char *fmt, ...) {
    p->failed = true;
    char detail[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    return err_set(err, "watch line %ld: %s", p->line_no, detail);
}

/* One complete line (without its '\n'). */
static int handle_line(watch_parser *p, const char *s, size_t len, err_t *err) {
    p->line_no++;
    while (len > 0 && (s[len - 1] == '\r' || s[len - 1] == ' ' || s[len - 1] == '\t')) len--;
    size_t i = 0;
    while (i < len && (s[i] == ' ' || s[i] == '\t')) i++;
    if (i == len) return 0; /* blank lines carry nothing (some proxies add them) */
    /* cJSON would skip a NUL as if it were a blank; no valid event contains one */
    if (memchr(s + i, '\0', len - i)) return fail(p, err, "a NUL byte inside the event (corrupted)");
    err_t why; /* the project's one JSON rule (json_util.h): one document a line, no key twice */
    cJSON *doc = json_parse("event", s + i, len - i, &why);
    if (!doc) return fail(p, err, "not JSON (a truncated or corrupted event): %s", why.msg);
    int rc = -1;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(doc, "type");
    const cJSON *obj = cJSON_GetObjectItemCaseSensitive(doc, "object");
    watch_event ev = {0};
    if (!cJSON_IsObject(doc)) {
        fail(p, err, "an event must be a JSON object");
        goto out;
    }
    if (!cJSON_IsString(type)) {
        fail(p, err, "missing string field 'type'");
        goto out;
    }
    int t = -1;
    for (int k = 0; k < (int)(sizeof type_names / sizeof *type_names); k++)
        if (strcmp(type->valuestring, type_names[k]) == 0) t = k;
    if (t < 0) {
        fail(p, err, "unknown event type '%.64s'", type->valuestring);
        goto out;
    }
    if (!cJSON_IsObject(obj)) {
        fail(p, err, "missing object field 'object'");
        goto out;
    }
    ev.type = (watch_type)t;
    ev.object = cJSON_DetachItemViaPointer(doc, (cJSON *)obj); /* the callback's to take */
    if (ev.type == WATCH_ERROR) {
        const cJSON *code = cJSON_GetObjectItemCaseSensitive(obj, "code");
        const cJSON *msg = cJSON_GetObjectItemCaseSensitive(obj, "message");
        if (cJSON_IsNumber(code) && code->valuedouble >= 0 && code->valuedouble < 1000)
            ev.code = (long)code->valuedouble;
        ev.message = cJSON_IsString(msg) ? msg->valuestring : NULL;
    } else {
        const cJSON *md = cJSON_GetObjectItemCaseSensitive(obj, "metadata");
        const cJSON *rv = cJSON_GetObjectItemCaseSensitive(md, "resourceVersion");
        if (!cJSON_IsObject(md)) {
            fail(p, err, "%s event without object.metadata", type->valuestring);
            goto out;
        }
        if (rv && !cJSON_IsString(rv)) {
            fail(p, err, "%s event: metadata.resourceVersion is not a string", type->valuestring);
            goto out;
        }
        ev.resource_version = rv ? rv->valuestring : NULL;
        /* a bookmark exists only to carry a resourceVersion */
        if (ev.type == WATCH_BOOKMARK && (!ev.resource_version || !*ev.resource_version)) {
            fail(p, err, "BOOKMARK event without metadata.resourceVersion");
            goto out;
        }
    }
    p->events++;
    if (p->fn && p->fn(&ev, p->arg, err) < 0) {
        p->failed = true;
        goto out;
    }
    rc = 0;
out:
    cJSON_Delete(ev.object);
    cJSON_Delete(doc);
    return rc;
}

int watch_parser_feed(watch_parser *p, const char *data, size_t len, err_t *err) {
    if (p->failed) return err_set(err, "watch line %ld: stream already failed", p->line_no);
    while (len > 0) {
        const char *nl = memchr(data, '\n', len);
        size_t take = nl ? (size_t)(nl - data) : len;
        if (p->len + take > p->max_line) {
            p->line_no++;
            return fail(p, err, "event longer than the limit of %zu bytes (a runaway stream?)",
                        p->max_line);
        }
        if (nl && p->len == 0) {
            /* the common case: a whole line inside this piece, no copy */
            if (handle_line(p, data, take, err) < 0) return -1;
        } else {
            str_append(&p->line, &p->len, &p->cap, data, take);
            if (nl) {
                size_t n = p->len;
                p->len = 0; /* consumed whether or not it parses */
                if (handle_line(p, p->line, n, err) < 0) return -1;
            }
        }
        if (!nl) break;
        data = nl + 1;
        len -= take + 1;
    }
    return 0;
}

int watch_parser_finish(watch_parser *p, err_t *err) {
    if (p->failed) return err_set(err, "watch line %ld: stream already failed", p->line_no);
    size_t n = p->len;
    p->len = 0;
    for (size_t i = 0; i < n; i++)
        if (p->line[i] != ' ' && p->line[i] != '\t' && p->line[i] != '\r') {
            p->line_no++;
            p->failed = true;
            return err_set(err, "watch line %ld: stream ended inside an event (%zu bytes "
                                "without a newline: truncated)",
                           p->line_no, n);
        }
    return 0;
}
