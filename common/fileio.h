/* fileio.h - reading whole input files (cluster, model, profile, plan files). */
#ifndef CEPHALO_FILEIO_H
#define CEPHALO_FILEIO_H

#include <stddef.h>

#include "err.h"

/* Reads the file into a fresh buffer (caller frees); refuses files above max_bytes. The buffer
 * has one extra NUL byte after len so text parsers may treat it as a string. */
char *file_read_all(const char *path, size_t max_bytes, size_t *len_out, err_t *err);

#endif
