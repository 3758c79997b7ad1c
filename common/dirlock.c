/* dirlock.c - see dirlock.h.
 *
 * Whoever finds the lock taken reads the holder's line, so the line must be there whenever the
 * lock can be seen taken. A new lock file is therefore written and locked under a temporary name
 * first, then linked to DIR/.lock (link(2) fails when the name exists: of two processes racing
 * for a new directory one links, the other finds a complete file). A lock file left by a process
 * that has ended (nobody holds its flock) is taken over and its line rewritten in one write; a
 * reader that catches the old line, a PID of this host that is no longer running, reads again. */
#include "common/dirlock.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/strutil.h"

/* dir_lock's internal outcomes besides a descriptor (>= 0), -1 (err set) and -2 (no locking) */
enum { TAKEN = -3, EXISTS = -4, NO_LINK = -5, GONE = -6 };

/* A reader that catches a line not yet (re)written tries again for about this long: the holder
 * writes it right after taking the lock, so the wait ends as soon as it has. */
#define REREAD_TRIES 1000
#define REREAD_NS 1000000L

typedef struct holder {
    bool known; /* a complete line was read */
    long pid;
    char host[200];
    char what[64]; /* "cephalo run", "training"; empty in a file of an older release */
} holder;

static void host_name(char *host, size_t n) {
    if (gethostname(host, n) != 0) snprintf(host, n, "unknown");
    host[n - 1] = '\0';
}

/* "pid 123 host node-a (cephalo run)\n" */
static int holder_line(const char *self, char *line, size_t n) {
    char host[200];
    host_name(host, sizeof host);
    return snprintf(line, n, "pid %ld host %s (%s)\n", (long)getpid(), host, self); /* self: a short constant */
}

static void read_holder(int fd, holder *h) {
    char buf[512];
    ssize_t got = pread(fd, buf, sizeof buf - 1, 0);
    buf[got > 0 ? got : 0] = '\0';
    *h = (holder){0};
    if (!strchr(buf, '\n')) return; /* not written yet (or not whole) */
    buf[strcspn(buf, "\n")] = '\0';
    int end = 0;
    h->known = sscanf(buf, "pid %ld host %199s%n", &h->pid, h->host, &end) == 2;
    if (h->known) sscanf(buf + end, " (%63[^)])", h->what);
}

/* Whether the line can be the holder's: complete, and not that of a process of this host that
 * has ended (a file being taken over, its new holder about to write its own line). */
static bool holder_current(const holder *h) {
    if (!h->known) return false;
    char host[200];
    host_name(host, sizeof host);
    if (strcmp(host, h->host) != 0) return true; /* another machine's process: cannot be looked at */
    return !(kill((pid_t)h->pid, 0) != 0 && errno == ESRCH);
}

static bool same_file(int fd, const char *path) {
    struct stat a, b;
    return fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

static bool cannot_lock(int e) { return e == ENOLCK || e == EOPNOTSUPP || e == ENOSYS; }

/* A new DIR/.lock, holding our line from its first moment: a descriptor, EXISTS, NO_LINK (the
 * filesystem has no hard links), -2 (no locks) or -1. */
static int take_new(const char *dir, const char *path, const char *line, err_t *err) {
    char tmp[4200];
    if (str_fmt(tmp, sizeof tmp, err, "the lock file's path", "%s.tmp.%d", path, (int)getpid()) < 0) return -1;
    unlink(tmp); /* one left by an earlier process of this PID */
    int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return err_set(err, "%s: cannot create the lock file %s: %s", dir, tmp, strerror(errno));
    size_t n = strlen(line);
    int rc = pwrite(fd, line, n, 0) == (ssize_t)n
                 ? 0
                 : err_set(err, "%s: cannot write the lock file %s: %s", dir, tmp, strerror(errno));
    if (rc == 0 && flock(fd, LOCK_EX | LOCK_NB) != 0)
        rc = cannot_lock(errno) ? -2 : err_set(err, "%s: cannot lock %s: %s", dir, tmp, strerror(errno));
    if (rc == 0 && link(tmp, path) != 0) {
        int e = errno;
        rc = e == EEXIST ? EXISTS
             : e == EPERM || e == EOPNOTSUPP || e == ENOSYS || e == EMLINK
                 ? NO_LINK
                 : err_set(err, "%s: cannot create the lock file %s: %s", dir, path, strerror(e));
    }
    unlink(tmp);
    if (rc == 0) return fd;
    close(fd);
    return rc;
}

/* DIR/.lock as it is (created, where the filesystem cannot link): a descriptor when nobody holds
 * it (our line written over the ended holder's), TAKEN with the holder's line in *h, GONE when
 * the file went away meanwhile, -2 (no locks) or -1. */
static int take_existing(const char *dir, const char *path, const char *line, bool create, holder *h, err_t *err) {
    /* never through a link nor into a device or a FIFO: the holder's line is written over it */
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | (create ? O_CREAT : 0), 0644);
    struct stat st;
    if (fd < 0 && errno == ELOOP) return err_set(err, "%s: the lock file %s is a symbolic link; move it away", dir, path);
    if (fd < 0)
        return errno == ENOENT ? GONE : err_set(err, "%s: cannot open the lock file %s: %s", dir, path, strerror(errno));
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        return close(fd), err_set(err, "%s: the lock file %s is not a regular file; move it away", dir, path);
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
        if (!same_file(fd, path)) return close(fd), GONE; /* removed by hand meanwhile */
        size_t n = strlen(line);
        /* one write, then the old line's tail cut: never an empty file; informational only, so a
         * failed write leaves the lock held and the message vaguer */
        if (pwrite(fd, line, n, 0) != (ssize_t)n || ftruncate(fd, (off_t)n) != 0)
            log_warn("cannot record this process in its lock file %s", path);
        return fd;
    }
    int e = errno;
    if (e == EWOULDBLOCK) read_holder(fd, h);
    close(fd);
    if (e == EWOULDBLOCK) return TAKEN;
    return cannot_lock(e) ? -2 : err_set(err, "%s: cannot lock %s: %s", dir, path, strerror(e));
}

/* The refusal, in the holder's own words where it wrote them. */
static int refuse(const char *dir, const char *self, const char *path, const holder *h, err_t *err) {
    if (!h->known)
        return err_set(err, "%s is in use by another process, which has not written who it is in the lock file %s; "
                       "wait for it to end, stop it, or use another directory", dir, path);
    char host[200];
    host_name(host, sizeof host);
    bool here = strcmp(host, h->host) == 0;
    const char *what = h->what[0] ? h->what : "process";
    if (here && h->pid == (long)getpid())
        return err_set(err, "%s is locked already by this %s (lock file %s): one directory given for two uses", dir,
                       self, path);
    if (here && h->pid == (long)getppid())
        return err_set(err, "%s is in use by the %s that started this %s (PID %ld, lock file %s): it keeps that "
                       "directory for itself; give this %s another directory", dir, what, self, h->pid, path, self);
    return err_set(err, "%s is in use by %s %s (PID %ld on host %s, lock file %s); wait for it to end, stop it, or "
                   "use another directory", dir, !h->what[0] || !strcmp(h->what, self) ? "another" : "a", what,
                   h->pid, h->host, path);
}

int dir_lock(const char *dir, const char *self, err_t *err) {
    char path[4200], line[320];
    if (str_fmt(path, sizeof path, err, "the lock file's path", "%s/%s", dir, DIRLOCK_FILE) < 0) return -1;
    holder_line(self, line, sizeof line);
    holder h = {0};
    bool can_link = true;
    for (int tries = 0;; tries++) {
        int fd = can_link ? take_new(dir, path, line, err) : EXISTS;
        if (fd == NO_LINK) can_link = false, fd = EXISTS;
        if (fd == EXISTS) fd = take_existing(dir, path, line, !can_link, &h, err);
        if (fd >= 0 || fd == -1) return fd;
        if (fd == -2) {
            log_warn("%s: this filesystem cannot lock files: nothing stops a second run from writing it at the same "
                     "time", dir);
            return -2;
        }
        if ((fd == TAKEN && holder_current(&h)) || tries >= REREAD_TRIES) break;
        if (fd == TAKEN) nanosleep(&(struct timespec){0, REREAD_NS}, NULL); /* GONE: at once */
    }
    return refuse(dir, self, path, &h, err);
}

int dir_lock_held(const char *dir, const char *self, err_t *err) {
    char path[4200];
    if (str_fmt(path, sizeof path, NULL, "", "%s/%s", dir, DIRLOCK_FILE) < 0) return 0; /* dir_lock will say */
    holder h = {0};
    for (int tries = 0;; tries++) {
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) return 0; /* none (or unreadable: dir_lock will say) */
        /* shared: probes never stop each other; a taker that meets it rereads (holder_current) */
        bool held = flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
        if (held) read_holder(fd, &h);
        close(fd);
        if (!held) return 0;
        if (holder_current(&h) || tries >= REREAD_TRIES) break;
        nanosleep(&(struct timespec){0, REREAD_NS}, NULL);
    }
    refuse(dir, self, path, &h, err);
    return 1;
}

void dir_unlock(int fd) {
    if (fd >= 0) close(fd);
}
