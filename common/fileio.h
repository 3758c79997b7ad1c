/* fileio.h - reading whole input files (cluster, model, profile, plan files) and writing small
 * files atomically. */
#ifndef CEPHALO_FILEIO_H
#define CEPHALO_FILEIO_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/stat.h>

#include "common/err.h"

/* Opens an input file for reading: its descriptor (st gets its fstat), or -1 with the error:
 * "PATH: cannot open: ...", "PATH: is a directory, expected a file", and with `regular` (readers
 * that map the file or need its size) "PATH: not a regular file" for a pipe or a device. Every
 * reader of an input file opens it here, so a wrong kind of path reads the same everywhere. */
int file_open_read(const char *path, bool regular, struct stat *st, err_t *err);

/* 0 when path is a directory; else -1 with "PATH: is a file, expected a directory" or why it
 * cannot be looked at ("No such file or directory"). For inputs that must be directories. */
int file_expect_dir(const char *path, err_t *err);

/* Reads the file into a fresh buffer (caller frees); refuses files above max_bytes, and
 * directories (file_open_read). The buffer has one extra NUL byte after len so text parsers may
 * treat it as a string, but text may hold NULs of its own: use len. */
char *file_read_all(const char *path, size_t max_bytes, size_t *len_out, err_t *err);

/* Writes len bytes to path atomically: a temporary file in the same directory, fsync'ed, then
 * renamed over path; on failure path is left as it was and the temporary file is removed. */
int file_write_atomic(const char *path, const void *data, size_t len, err_t *err);

/* Whether path names a directory (following symbolic links). */
bool file_is_dir(const char *path);

/* Creates dir (with its missing parents when `parents`, as mkdir -p); an existing directory is
 * fine; an error names what is in the way. */
int file_make_dir(const char *dir, bool parents, err_t *err);

/* Whether paths a and b name the same file: the same device and inode when both exist (so
 * "./c.yaml", "c.yaml", "d/../c.yaml", a symbolic link and a hard link are all caught), else the
 * same canonical parent directory and last component (an output not written yet). */
bool file_same(const char *a, const char *b);

/* Whether the file at path (symbolic links resolved) lies directly in the directory dir, compared
 * as file_same does; its name there is copied into name. False when path does not exist. */
bool file_in_dir(const char *path, const char *dir, char *name, size_t n);

#endif
