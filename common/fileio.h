/* fileio.h - reading whole input files (cluster, model, profile, plan files) and writing small
 * files atomically. */
#ifndef CEPHALO_FILEIO_H
#define CEPHALO_FILEIO_H

#include <stdbool.h>
#include <stddef.h>

#include "err.h"

/* Reads the file into a fresh buffer (caller frees); refuses files above max_bytes. The buffer
 * has one extra NUL byte after len so text parsers may treat it as a string. */
char *file_read_all(const char *path, size_t max_bytes, size_t *len_out, err_t *err);

/* Writes len bytes to path atomically: a temporary file in the same directory, fsync'ed, then
 * renamed over path; on failure path is left as it was and the temporary file is removed. */
int file_write_atomic(const char *path, const void *data, size_t len, err_t *err);

/* Creates dir (with its missing parents when `parents`, as mkdir -p); an existing directory is
 * fine; an error names what is in the way. */
int file_make_dir(const char *dir, bool parents, err_t *err);

#endif
