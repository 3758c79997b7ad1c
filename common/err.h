/* err.h - error values passed up the call chain.
 *
 * Functions that can fail on bad input return -1 and fill an err_t with a message that already
 * names the file, line and field; the CLI prints it to stderr. No function below main() exits. */
#ifndef CEPHALO_ERR_H
#define CEPHALO_ERR_H

#include <stddef.h>

typedef struct err {
    char msg[1024];
} err_t;

/* Sets the message (printf-style) and returns -1, so callers can `return err_set(...)`. A message
 * longer than msg keeps its start and its end (the reason) with "..." between. */
int err_set(err_t *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prepends "prefix: " to an existing message (e.g. the file name) and returns -1. */
int err_prefix(err_t *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
