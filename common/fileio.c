/* realpath() is XSI, beyond the POSIX base the build selects */
#define _XOPEN_SOURCE 700

#include "common/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/strutil.h"

int file_open_read(const char *path, bool regular, struct stat *st, err_t *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return err_set(err, "%s: cannot open: %s", path, strerror(errno));
    const char *wrong = NULL;
    if (fstat(fd, st) != 0) wrong = strerror(errno);
    else if (S_ISDIR(st->st_mode)) wrong = "is a directory, expected a file";
    else if (regular && !S_ISREG(st->st_mode)) wrong = "not a regular file (a pipe or a device cannot be read here)";
    if (!wrong) return fd;
    close(fd);
    return err_set(err, "%s: %s", path, wrong);
}

/* What is at a path that should be a directory, in the words of every such message. */
static const char *not_dir(const struct stat *st) {
    return S_ISREG(st->st_mode) ? "is a file, expected a directory" : "is not a directory";
}

int file_expect_dir(const char *path, err_t *err) {
    struct stat st;
    if (stat(path, &st) != 0) return err_set(err, "%s: %s", path, strerror(errno));
    if (!S_ISDIR(st.st_mode)) return err_set(err, "%s: %s", path, not_dir(&st));
    return 0;
}

char *file_read_all(const char *path, size_t max_bytes, size_t *len_out, err_t *err) {
    struct stat st;
    int fd = file_open_read(path, false, &st, err);
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        err_set(err, "%s: cannot open: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    size_t cap = 4096, len = 0, got;
    char *buf = xmalloc(cap + 1);
    while ((got = fread(buf + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len > max_bytes) {
            fclose(f);
            free(buf);
            err_set(err, "%s: file is larger than %zu MiB", path, max_bytes >> 20);
            return NULL;
        }
        if (len == cap) buf = xrealloc(buf, (cap *= 2) + 1);
    }
    int read_errno = ferror(f) ? errno : 0;
    fclose(f);
    if (read_errno) {
        free(buf);
        err_set(err, "%s: read error: %s", path, strerror(read_errno));
        return NULL;
    }
    buf[len] = '\0';
    *len_out = len;
    return buf;
}

int file_write_atomic(const char *path, const void *data, size_t len, err_t *err) {
    char tmp[4200];
    if (str_fmt(tmp, sizeof tmp, err, "the temporary file's path", "%s.tmp.%d", path, (int)getpid()) < 0) return -1;
    FILE *f = fopen(tmp, "wb");
    bool ok = f && fwrite(data, 1, len, f) == len && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int e = errno;
    if (f && fclose(f) != 0 && ok) ok = false, e = errno;
    if (ok && rename(tmp, path) != 0) ok = false, e = errno;
    if (!ok) {
        unlink(tmp);
        return err_set(err, "%s: cannot write: %s", path, strerror(e));
    }
    return 0;
}

bool file_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* One level: exists-as-directory is fine, anything else at the path is an error. */
static int make_one_dir(const char *path, const char *whole, err_t *err) {
    struct stat st;
    if (mkdir(path, 0777) != 0 && errno != EEXIST)
        return err_set(err, "%s: cannot create the directory: %s", whole, strerror(errno));
    if (stat(path, &st) != 0) return err_set(err, "%s: %s", whole, strerror(errno));
    if (!S_ISDIR(st.st_mode)) {
        if (!strcmp(path, whole)) return err_set(err, "%s: %s", whole, not_dir(&st));
        return err_set(err, "%s: %s %s", whole, path, not_dir(&st));
    }
    return 0;
}

int file_make_dir(const char *dir, bool parents, err_t *err) {
    if (!parents) return make_one_dir(dir, dir, err);
    char buf[4096];
    if (str_fmt(buf, sizeof buf, err, "the directory", "%s", dir) < 0) return -1;
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/' || p[-1] == '/') continue;
        *p = 0;
        int rc = make_one_dir(buf, dir, err);
        *p = '/';
        if (rc < 0) return -1;
    }
    return make_one_dir(buf, dir, err);
}

/* The canonical "dir/name" of path: its parent directory resolved (symbolic links, "..", ".")
 * and its last component kept as written; false when the parent cannot be resolved. */
static bool canonical_parent(const char *path, char *out, size_t n) {
    char dir[PATH_MAX], real[PATH_MAX];
    const char *slash = strrchr(path, '/');
    size_t dlen = slash ? (size_t)(slash - path) : 0;
    if (dlen >= sizeof dir) return false;
    if (!slash) strcpy(dir, ".");
    else if (dlen == 0) strcpy(dir, "/");
    else memcpy(dir, path, dlen), dir[dlen] = '\0';
    if (!realpath(dir, real)) return false;
    return snprintf(out, n, "%s/%s", real, slash ? slash + 1 : path) < (int)n;
}

bool file_same(const char *a, const char *b) {
    struct stat sa, sb;
    if (stat(a, &sa) == 0 && stat(b, &sb) == 0) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    char ca[PATH_MAX + 256], cb[PATH_MAX + 256];
    if (canonical_parent(a, ca, sizeof ca) && canonical_parent(b, cb, sizeof cb)) return strcmp(ca, cb) == 0;
    return strcmp(a, b) == 0; /* unresolvable parent: only the same spelling is known to match */
}

bool file_in_dir(const char *path, const char *dir, char *name, size_t n) {
    char real[PATH_MAX];
    if (!realpath(path, real)) return false;
    char *slash = strrchr(real, '/'); /* realpath's result is absolute: there is one */
    snprintf(name, n, "%s", slash + 1);
    if (slash == real) return file_same("/", dir);
    *slash = '\0';
    return file_same(real, dir);
}
