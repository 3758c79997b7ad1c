#include "common/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int err_set(err_t *e, const char *fmt, ...) {
    if (!e) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

int err_prefix(err_t *e, const char *fmt, ...) {
    if (!e) return -1;
    char prefix[512], old[sizeof e->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, e->msg, sizeof old);
    /* explicit lengths: truncation of an over-long message is acceptable, not a bug */
    size_t lp = strnlen(prefix, sizeof e->msg - 3);
    memcpy(e->msg, prefix, lp);
    memcpy(e->msg + lp, ": ", 2);
    size_t lo = strnlen(old, sizeof e->msg - lp - 3);
    memcpy(e->msg + lp + 2, old, lo);
    e->msg[lp + 2 + lo] = '\0';
    return -1;
}
