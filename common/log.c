#include "common/log.h"

#include <stdarg.h>
#include <string.h>

static log_handler handler;

void log_set_handler(log_handler h) { handler = h; }

void log_msg(const char *level, const char *fmt, ...) {
    va_list ap;
    if (handler) {
        char text[4096];
        va_start(ap, fmt);
        vsnprintf(text, sizeof text, fmt, ap);
        va_end(ap);
        handler(level, text);
        return;
    }
    fprintf(stderr, "%s: ", level);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

static void *oom(size_t n) {
    fprintf(stderr, "fatal: out of host memory allocating %zu bytes\n", n);
    abort();
}

void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    return p ? p : oom(n);
}

void *xcalloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    return p ? p : oom(count * size);
}

void *xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    return q ? q : oom(n);
}

char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    return memcpy(xmalloc(n), s, n);
}
