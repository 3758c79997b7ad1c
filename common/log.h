/* log.h - diagnostics to stderr and the check macros of the project.
 *
 * CHECK() is for invariants that only a bug can break (it aborts with file:line); bad input never
 * reaches it - input errors travel up as err_t (see err.h). */
#ifndef CEPHALO_LOG_H
#define CEPHALO_LOG_H

#include <stdio.h>
#include <stdlib.h>

void log_msg(const char *level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Opt-in for a program with a log format of its own (cephalo-operator: a timestamp, a level
 * name and a level filter, docs/operator.md): every log_msg line then goes to h (level as given,
 * e.g. "warning"; the text without a newline) instead of "level: text" on stderr. Set it before
 * starting threads; NULL restores the default, which the other programs keep. */
typedef void (*log_handler)(const char *level, const char *text);
void log_set_handler(log_handler h);

#define log_warn(...) log_msg("warning", __VA_ARGS__)
#define log_error(...) log_msg("error", __VA_ARGS__)

#define CHECK(cond)                                                                       \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            fprintf(stderr, "%s:%d: internal error: check failed: %s\n", __FILE__, __LINE__, \
                    #cond);                                                               \
            abort();                                                                      \
        }                                                                                 \
    } while (0)

/* Allocation that cannot fail silently: out of host memory is not recoverable here. */
void *xmalloc(size_t n);
void *xcalloc(size_t count, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);

#endif
