#include "common/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A message longer than the buffer (a path near PATH_MAX in it) keeps its start and its end, where
 * the reason is, with "..." between: cut at the end it would lose what went wrong. */
static void set_text(err_t *e, const char *text) {
    size_t n = strlen(text), cap = sizeof e->msg - 1;
    if (n <= cap) {
        memcpy(e->msg, text, n + 1);
        return;
    }
    size_t head = cap / 2, tail = cap - head - 3;
    memcpy(e->msg, text, head);
    memcpy(e->msg + head, "...", 3);
    memcpy(e->msg + head + 3, text + n - tail, tail + 1);
}

/* The formatted text in a fresh string, `suffix` after it (NULL: out of memory). */
static char *format(const char *suffix, const char *fmt, va_list ap) {
    va_list again;
    va_copy(again, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    size_t ls = strlen(suffix);
    char *text = n < 0 ? NULL : malloc((size_t)n + ls + 1);
    if (text) {
        vsnprintf(text, (size_t)n + 1, fmt, again);
        memcpy(text + n, suffix, ls + 1);
    }
    va_end(again);
    return text;
}

int err_set(err_t *e, const char *fmt, ...) {
    if (!e) return -1;
    va_list ap;
    va_start(ap, fmt);
    char *text = format("", fmt, ap);
    va_end(ap);
    set_text(e, text ? text : "out of memory");
    free(text);
    return -1;
}

int err_prefix(err_t *e, const char *fmt, ...) {
    if (!e) return -1;
    va_list ap;
    va_start(ap, fmt);
    char *prefix = format(": ", fmt, ap);
    va_end(ap);
    if (!prefix) return -1; /* out of memory: the message stays as it was */
    size_t lp = strlen(prefix), lo = strlen(e->msg);
    char *text = malloc(lp + lo + 1);
    if (text) {
        memcpy(text, prefix, lp);
        memcpy(text + lp, e->msg, lo + 1);
        set_text(e, text);
        free(text);
    }
    free(prefix);
    return -1;
}
