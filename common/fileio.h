/* fileio.h - reading whole input files (cluster, model, profile, plan files) and writing small
 * files atomically. */
#ifndef CEPHALO_FILEIO_H
#define CEPHALO_FILEIO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
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

/* For a file the command keeps itself (a checkpoint directory's latest, retention.json): 1 when
 * it is a regular file, 0 when there is none, -1 when something else is there ("PATH: is a FIFO,
 * not a regular file ..."): read as an input, a FIFO would block or read as empty. */
int file_state_exists(const char *path, err_t *err);

/* Reads the file into a fresh buffer (caller frees); refuses files above max_bytes, and
 * directories (file_open_read). The buffer has one extra NUL byte after len so text parsers may
 * treat it as a string, but text may hold NULs of its own: use len. */
char *file_read_all(const char *path, size_t max_bytes, size_t *len_out, err_t *err);

/* ---- outputs: every file a command writes is opened here (docs/development.md, "Outputs") ----
 *
 * What the output's path is decides how it is written, the same for every output:
 *   a regular file, or nothing yet   written as flags say: atomically (a temporary in the same
 *                                    directory, fsync'ed, renamed over it) or as a stream (a log);
 *   a symbolic link                  followed: its target is written as above, the link stays; a
 *                                    link to nothing is refused (create the target, or give a path);
 *   a character device, a FIFO       written in place as a stream, never replaced (`-o /dev/null`
 *                                    discards; a FIFO without a reader is refused, not waited on);
 *   a block device, a socket, a dir  refused: never replaced, never written.
 * And an output is never a file the command reads (file_guard_add): checked by device and inode
 * when it is opened, after out_check checked the same before anything was written. */
enum {
    FILE_OUT_ATOMIC = 0, /* replaced as a whole by file_out_close; the old file stays until then */
    FILE_OUT_STREAM = 1, /* written in place from its start (a log) */
    FILE_OUT_APPEND = 2, /* written in place after what it holds (a resumed log) */
    FILE_OUT_OWN = 4,    /* the command's own state, read back and replaced (a checkpoint directory's
                          * `latest`): not checked against the files the command reads */
};

typedef struct file_out {
    int fd;              /* where to write */
    FILE *f;             /* or through this, after file_out_file */
    char path[4096];     /* what is written: the output's path (a symbolic link's target) */
    char tmp[4128];      /* the temporary renamed over path at close; "" when written in place */
    bool device;         /* a device or a FIFO: nothing to sync */
} file_out;

/* What file_out_open would refuse about an existing path itself (a directory, a block device, a
 * socket, a link to nothing), checked before any work: 0, or -1 with "PATH: why". */
int file_out_check(const char *path, err_t *err);
/* Opens path for writing as flags say; -1 with "PATH: why" and nothing changed on disk. */
int file_out_open(file_out *o, const char *path, int flags, err_t *err);
/* The output as a stdio stream (opened once; closed by file_out_close/abort); NULL when out of
 * memory. Write through either fd or the stream, not both. */
FILE *file_out_file(file_out *o);
/* Finishes the output: synced and renamed over path (atomic), else closed. On failure the
 * temporary is removed and path is as it was. */
int file_out_close(file_out *o, err_t *err);
/* Gives the output up: the temporary is removed, path is as it was. */
void file_out_abort(file_out *o);

/* write() until all len bytes are written (interrupted calls retried); -1 with errno set. */
int file_write_all(int fd, const void *data, size_t len);

/* Writes len bytes to path through file_out (FILE_OUT_ATOMIC, or'ed with FILE_OUT_OWN for the
 * command's own state): all of them or, on failure, none. */
int file_write_atomic(const char *path, const void *data, size_t len, int flags, err_t *err);

/* The files this command reads, which no output may be: recorded by out_check (common/outputs.h)
 * with a label for messages ("train_000000.bin, an input of --data d"), checked by file_out_open. An entry
 * counts while its path still names the same file (an inode freed and reused is not the input). */
void file_guard_add(const char *path, const struct stat *st, const char *label);
/* The label of the input that st is, or NULL. */
const char *file_guard_find(const struct stat *st);
/* Forgets every entry (tests). */
void file_guard_clear(void);

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
