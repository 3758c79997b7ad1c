/* realpath() is XSI, beyond the POSIX base the build selects */
#define _XOPEN_SOURCE 700

#include "common/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/strutil.h"

int file_open_read(const char *path, bool regular, struct stat *st, err_t *err) {
    /* never waits at the open: a FIFO no process writes reads as empty instead of blocking */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return err_set(err, "%s: cannot open: %s", path, strerror(errno));
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
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

/* ---- the files the command reads (file_guard_*) ---- */

typedef struct guard_entry {
    dev_t dev;
    ino_t ino;
    char *path, *label; /* path NULL: a free slot */
} guard_entry;

static struct {
    pthread_mutex_t lock;
    guard_entry *v;
    size_t cap, n; /* open addressing, cap a power of two, at most half full */
} guard = {.lock = PTHREAD_MUTEX_INITIALIZER};

static size_t guard_slot(guard_entry *v, size_t cap, dev_t dev, ino_t ino) {
    uint64_t h = ((uint64_t)dev * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)ino * 0xc2b2ae3d27d4eb4full);
    size_t i = (size_t)(h ^ (h >> 29)) & (cap - 1);
    while (v[i].path && (v[i].dev != dev || v[i].ino != ino)) i = (i + 1) & (cap - 1);
    return i;
}

static void guard_grow(void) {
    size_t cap = guard.cap ? guard.cap * 2 : 64;
    guard_entry *v = xcalloc(cap, sizeof *v);
    for (size_t i = 0; i < guard.cap; i++)
        if (guard.v[i].path) v[guard_slot(v, cap, guard.v[i].dev, guard.v[i].ino)] = guard.v[i];
    free(guard.v);
    guard.v = v, guard.cap = cap;
}

void file_guard_add(const char *path, const struct stat *st, const char *label) {
    pthread_mutex_lock(&guard.lock);
    if (2 * (guard.n + 1) > guard.cap) guard_grow();
    guard_entry *e = &guard.v[guard_slot(guard.v, guard.cap, st->st_dev, st->st_ino)];
    if (!e->path) { /* the first name a file is read by is the one messages give */
        *e = (guard_entry){st->st_dev, st->st_ino, xstrdup(path), xstrdup(label)};
        guard.n++;
    }
    pthread_mutex_unlock(&guard.lock);
}

const char *file_guard_find(const struct stat *st) {
    const char *label = NULL;
    pthread_mutex_lock(&guard.lock);
    if (guard.cap) {
        guard_entry *e = &guard.v[guard_slot(guard.v, guard.cap, st->st_dev, st->st_ino)];
        struct stat now; /* still the input: not an inode the input freed and a new file reused */
        if (e->path && stat(e->path, &now) == 0 && now.st_dev == st->st_dev && now.st_ino == st->st_ino)
            label = e->label;
    }
    pthread_mutex_unlock(&guard.lock);
    return label;
}

void file_guard_clear(void) {
    pthread_mutex_lock(&guard.lock);
    for (size_t i = 0; i < guard.cap; i++) free(guard.v[i].path), free(guard.v[i].label);
    free(guard.v);
    guard.v = NULL, guard.cap = guard.n = 0;
    pthread_mutex_unlock(&guard.lock);
}

/* ---- outputs (file_out_*) ---- */

static const char *kind_name(mode_t m) {
    return S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) ? "a character device" :
           S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket" : S_ISLNK(m) ? "a symbolic link" : "not a file";
}

int file_state_exists(const char *path, err_t *err) {
    struct stat st;
    if (stat(path, &st) != 0) return errno == ENOENT ? 0 : err_set(err, "%s: %s", path, strerror(errno));
    if (S_ISREG(st.st_mode)) return 1;
    return err_set(err, "%s: is %s, not a regular file; the command keeps its own state there as a file (move it "
                   "away)", path, kind_name(st.st_mode));
}

/* What an existing output is, when it is something file_out_open refuses: NULL for a regular
 * file, a character device or a FIFO. */
static const char *refused_kind(mode_t m) {
    if (S_ISDIR(m)) return "is a directory, expected a file";
    if (S_ISBLK(m)) return "is a block device: writing would overwrite what the device holds (give a file)";
    if (S_ISSOCK(m)) return "is a socket, which cannot be written as a file (give a file)";
    return NULL;
}

/* The file an output path names: o->path, and st when it exists (*exists). A symbolic link is
 * followed to its target, which must exist; any other path is kept as given (resolving it could
 * make it longer than the system's limit). */
static int out_target(file_out *o, const char *path, struct stat *st, bool *exists, err_t *err) {
    struct stat lst;
    *exists = lstat(path, &lst) == 0;
    if (!*exists && errno != ENOENT) return err_set(err, "%s: cannot write: %s", path, strerror(errno));
    if (*exists && S_ISLNK(lst.st_mode)) {
        if (stat(path, st) != 0)
            return err_set(err, "%s: a symbolic link to a file that does not exist; an output link is followed to "
                           "its target, which must exist (create it, or give the path itself)", path);
        if (!realpath(path, o->path)) return err_set(err, "%s: cannot write: %s", path, strerror(errno));
        return 0;
    }
    if (*exists) *st = lst;
    return str_fmt(o->path, sizeof o->path, err, "the output path", "%s", path);
}

/* Opens an existing device or FIFO in place; a FIFO nobody reads is refused, not waited on. */
static int open_in_place_device(file_out *o, const char *path, err_t *err) {
    o->fd = open(o->path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (o->fd < 0 && errno == ENXIO)
        return err_set(err, "%s: a FIFO that no process reads; start its reader first (or give a file)", path);
    if (o->fd < 0) return err_set(err, "%s: cannot write: %s", path, strerror(errno));
    fcntl(o->fd, F_SETFL, fcntl(o->fd, F_GETFL) & ~O_NONBLOCK);
    o->device = true;
    return 0;
}

/* A temporary beside the target, created afresh (a leftover of a killed run with our PID goes);
 * a replaced file keeps its permissions. */
static int open_temporary(file_out *o, const char *path, const struct stat *old, err_t *err) {
    static _Atomic int serial;
    int pid = (int)getpid();
    const char *slash = strrchr(o->path, '/');
    int dir_len = slash ? (int)(slash - o->path) + 1 : 0;
    /* NAME.tmp.PID (a killed run's is removed by dir_clean_temps); a name too long for the suffix
     * gets a short one in the same directory */
    if (snprintf(o->tmp, sizeof o->tmp, "%s.tmp.%d", o->path, pid) >= PATH_MAX &&
        snprintf(o->tmp, sizeof o->tmp, "%.*s.cephalo-%d.tmp.%d", dir_len, o->path, serial++, pid) >= PATH_MAX)
        return err_set(err, "%s: the path leaves no room for a temporary file beside it (%d characters at most)", path,
                       PATH_MAX - 1);
    for (int tries = 0; tries < 2; tries++) {
        o->fd = open(o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (o->fd >= 0 || errno != EEXIST) break;
        unlink(o->tmp);
    }
    if (o->fd < 0) {
        int e = errno;
        o->tmp[0] = 0;
        return err_set(err, "%s: cannot write: %s", path, strerror(e));
    }
    if (old) fchmod(o->fd, old->st_mode & 07777);
    return 0;
}

int file_out_check(const char *path, err_t *err) {
    struct stat lst, st;
    if (lstat(path, &lst) != 0) return 0; /* nothing there yet */
    file_out o;
    bool exists;
    if (out_target(&o, path, &st, &exists, err) < 0) return -1;
    const char *why = refused_kind(st.st_mode);
    return why ? err_set(err, "%s: %s", path, why) : 0;
}

int file_out_open(file_out *o, const char *path, int flags, err_t *err) {
    *o = (file_out){.fd = -1};
    struct stat st;
    bool exists;
    if (out_target(o, path, &st, &exists, err) < 0) return -1;
    if (exists) {
        const char *why = refused_kind(st.st_mode), *input = NULL;
        if (why) return err_set(err, "%s: %s", path, why);
        if ((flags & FILE_OUT_OWN) && !S_ISREG(st.st_mode))
            return err_set(err, "%s: is %s, not a regular file; the command keeps its own state there as a file and "
                           "never writes it into a device or a FIFO (move it away)", path, kind_name(st.st_mode));
        if (!(flags & FILE_OUT_OWN) && (input = file_guard_find(&st)))
            return err_set(err, "%s: this is %s; writing there would destroy it (give the output another path)", path,
                           input);
        if (!S_ISREG(st.st_mode)) return open_in_place_device(o, path, err);
    }
    if (!(flags & (FILE_OUT_STREAM | FILE_OUT_APPEND))) return open_temporary(o, path, exists ? &st : NULL, err);
    o->fd = open(o->path, O_WRONLY | O_CREAT | O_CLOEXEC | (flags & FILE_OUT_APPEND ? O_APPEND : O_TRUNC), 0666);
    return o->fd < 0 ? err_set(err, "%s: cannot write: %s", path, strerror(errno)) : 0;
}

/* The rename is durable once the directory entry is: sync the directory. File systems that
 * cannot sync a directory say EINVAL (or ENOTSUP); nothing more can be done there. */
static int sync_parent(const char *path, err_t *err) {
    char dir[4096];
    const char *slash = strrchr(path, '/');
    snprintf(dir, sizeof dir, "%.*s", !slash ? 1 : slash == path ? 1 : (int)(slash - path), slash ? path : ".");
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int rc = dfd >= 0 && (fsync(dfd) == 0 || errno == EINVAL || errno == ENOTSUP) ? 0 : -1;
    if (rc < 0) err_set(err, "%s: written, but syncing its directory %s failed: %s", path, dir, strerror(errno));
    if (dfd >= 0) close(dfd);
    return rc;
}

FILE *file_out_file(file_out *o) {
    if (!o->f) o->f = fdopen(o->fd, "wb");
    return o->f;
}

/* Flushes, syncs (a file) and closes the descriptor; false with errno set on failure. */
static bool out_finish(file_out *o) {
    bool ok = !o->f || fflush(o->f) == 0;
    if (ok && !o->device && fsync(o->fd) != 0) ok = false;
    int e = errno;
    if ((o->f ? fclose(o->f) : close(o->fd)) != 0 && ok) ok = false, e = errno;
    o->f = NULL, o->fd = -1;
    errno = e;
    return ok;
}

int file_out_close(file_out *o, err_t *err) {
    bool ok = out_finish(o);
    int e = errno;
    if (!o->tmp[0]) return ok ? 0 : err_set(err, "%s: cannot write: %s", o->path, strerror(e));
    struct stat st; /* never renamed over what became something else than a file meanwhile */
    if (ok && lstat(o->path, &st) == 0 && !S_ISREG(st.st_mode)) {
        file_out_abort(o);
        return err_set(err, "%s: is no longer a regular file; it is left as it is and nothing was written", o->path);
    }
    if (ok && rename(o->tmp, o->path) != 0) ok = false, e = errno;
    if (!ok) {
        file_out_abort(o);
        return err_set(err, "%s: cannot write: %s", o->path, strerror(e));
    }
    o->tmp[0] = 0;
    return sync_parent(o->path, err);
}

void file_out_abort(file_out *o) {
    if (o->f) fclose(o->f);
    else if (o->fd >= 0) close(o->fd);
    o->f = NULL, o->fd = -1;
    if (o->tmp[0]) unlink(o->tmp);
    o->tmp[0] = 0;
}

int file_write_all(int fd, const void *data, size_t len) {
    const size_t chunk = (size_t)64 << 20; /* one write() moves at most about 2 GiB on Linux */
    for (const char *p = data; len;) {
        ssize_t n = write(fd, p, len < chunk ? len : chunk);
        if (n < 0 && errno == EINTR) continue;
        if (n == 0) errno = EIO;
        if (n <= 0) return -1;
        p += n, len -= (size_t)n;
    }
    return 0;
}

int file_write_atomic(const char *path, const void *data, size_t len, int flags, err_t *err) {
    file_out o;
    if (file_out_open(&o, path, flags & FILE_OUT_OWN, err) < 0) return -1;
    if (file_write_all(o.fd, data, len) < 0) {
        int e = errno;
        file_out_abort(&o);
        return err_set(err, "%s: cannot write: %s", path, strerror(e));
    }
    return file_out_close(&o, err);
}
