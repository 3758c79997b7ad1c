/* dirlock.c - see dirlock.h. */
#include "common/dirlock.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "common/log.h"
#include "common/strutil.h"

/* "pid 123 host node-a" as the holder wrote it, or a note that it has not yet. */
static void read_holder(int fd, char *out, size_t n) {
    char buf[256];
    ssize_t got = pread(fd, buf, sizeof buf - 1, 0);
    buf[got > 0 ? got : 0] = '\0';
    buf[strcspn(buf, "\n")] = '\0';
    long pid;
    char host[200];
    if (sscanf(buf, "pid %ld host %199s", &pid, host) == 2) snprintf(out, n, "PID %ld on host %s", pid, host);
    else snprintf(out, n, "a process that has not written its PID yet");
}

static void write_holder(int fd) {
    char host[256] = "unknown", line[320];
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "unknown");
    host[sizeof host - 1] = '\0';
    int n = snprintf(line, sizeof line, "pid %ld host %s\n", (long)getpid(), host);
    /* informational only: a failed write leaves the lock held and the message vaguer */
    if (ftruncate(fd, 0) == 0 && pwrite(fd, line, (size_t)n, 0) != n) log_warn("cannot record this process in its lock file");
}

int dir_lock(const char *dir, const char *what, err_t *err) {
    char path[4200];
    if (str_fmt(path, sizeof path, err, "the lock file's path", "%s/%s", dir, DIRLOCK_FILE) < 0) return -1;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return err_set(err, "%s: cannot create the lock file %s: %s", dir, path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
        write_holder(fd);
        return fd;
    }
    int e = errno;
    if (e == EWOULDBLOCK) {
        char holder[256];
        read_holder(fd, holder, sizeof holder);
        close(fd);
        return err_set(err, "%s is in use by %s (%s, lock file %s); wait for it to end, stop it, or use another directory",
                       dir, what, holder, path);
    }
    close(fd);
    if (e == ENOLCK || e == EOPNOTSUPP || e == ENOSYS) {
        log_warn("%s: this filesystem cannot lock files (%s): nothing stops a second run from writing it at the same time",
                 dir, strerror(e));
        return -2;
    }
    return err_set(err, "%s: cannot lock %s: %s", dir, path, strerror(e));
}

void dir_unlock(int fd) {
    if (fd >= 0) close(fd);
}
