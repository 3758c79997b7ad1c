/* ckpt_dir.c - see ckpt_dir.h. */
#include "common/ckpt_dir.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/ckpt_keep.h"
#include "common/fileio.h"
#include "common/log.h"
#include "common/strutil.h"

#define PATH_MAX_LEN 4400 /* a directory of up to 4096 bytes and a name */
#define SUFFIX ".safetensors"

int ckpt_dir_check_len(const char *dir, const char *what, err_t *err) {
    size_t n = strlen(dir);
    if (n <= CKPT_DIR_MAX) return 0;
    return err_set(err, "%s: the checkpoint directory '%.60s...' is %zu characters long, at most %d (room for the names of the "
                        "checkpoint files in the system's path limit)", what, dir, n, CKPT_DIR_MAX);
}

/* "step_" and 1 to 18 digits, then nothing (a directory) or ".safetensors" (a file). */
static bool parse_name(const char *name, long long *step, bool *file) {
    if (strncmp(name, "step_", 5)) return false;
    const char *p = name + 5;
    size_t digits = strspn(p, "0123456789");
    if (digits == 0 || digits > 18) return false;
    *step = strtoll(p, NULL, 10);
    *file = !strcmp(p + digits, SUFFIX);
    return *file || p[digits] == '\0';
}

static bool ckpt_owns(const char *name) {
    long long step;
    bool file;
    size_t n = strlen(name);
    return parse_name(name, &step, &file) || !strcmp(name, "latest") || !strcmp(name, CKPT_KEEP_FILE) ||
           !strcmp(name, "index.json") || !strcmp(name, ".lock") || (n > 12 && !strcmp(name + n - 12, SUFFIX));
}

const out_kind ckpt_dir_kind = {"checkpoint directory", ckpt_owns, true, NULL};

static bool exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* Newest first; of two with one step (a file and a directory), the complete one first. */
static int cmp_entry(const void *a, const void *b) {
    const ckpt_entry *x = a, *y = b;
    if (x->step != y->step) return x->step < y->step ? 1 : -1;
    if (x->complete != y->complete) return x->complete ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* One directory entry as a checkpoint, or false when it is not one. */
static bool read_entry(const char *dir, const char *name, ckpt_entry *e) {
    bool file;
    char path[PATH_MAX_LEN]; /* cannot be cut: dir was opened (under PATH_MAX), name is short */
    if (strlen(name) >= sizeof e->name || !parse_name(name, &e->step, &file)) return false;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (file == file_is_dir(path)) return false; /* step_N.safetensors/ or a plain file step_N */
    snprintf(e->name, sizeof e->name, "%s", name);
    e->sharded = !file;
    snprintf(path, sizeof path, "%s/%s/index.json", dir, name);
    e->complete = file || exists(path);
    return true;
}

int ckpt_dir_list(const char *dir, ckpt_entry **out, err_t *err) {
    *out = NULL;
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? 0 : err_set(err, "%s: cannot read the checkpoint directory: %s", dir, strerror(errno));
    int n = 0, cap = 0;
    for (struct dirent *de; (de = readdir(d));) {
        ckpt_entry e;
        if (!read_entry(dir, de->d_name, &e)) continue;
        if (n == cap) *out = xrealloc(*out, (size_t)(cap = cap ? 2 * cap : 16) * sizeof **out);
        (*out)[n++] = e;
    }
    closedir(d);
    if (n) qsort(*out, (size_t)n, sizeof **out, cmp_entry);
    return n;
}

int ckpt_dir_latest(const char *dir, char *name, size_t n, err_t *err) {
    char path[PATH_MAX_LEN], line[256] = "";
    if (str_fmt(path, sizeof path, err, "checkpoint path", "%s/latest", dir) < 0) return -1;
    FILE *f = fopen(path, "r");
    if (!f) return errno == ENOENT ? 0 : err_set(err, "%s: cannot read: %s", path, strerror(errno));
    bool got = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    line[strcspn(line, "\n")] = '\0';
    long long step;
    bool file;
    if (!got || !parse_name(line, &step, &file))
        return err_set(err, "%s: holds '%.60s', not a checkpoint name (step_N or step_N.safetensors)", path, line);
    return str_fmt(name, n, err, "checkpoint name", "%s", line) < 0 ? -1 : 1; /* parse_name: at most 35 */
}

/* A step directory: index.json first, then the rest, then the directory. */
static int remove_step_dir(const char *path, err_t *err) {
    char f[PATH_MAX_LEN];
    if (str_fmt(f, sizeof f, err, "checkpoint path", "%s/index.json", path) < 0) return -1;
    if (unlink(f) != 0 && errno != ENOENT) return err_set(err, "%s: cannot delete: %s", f, strerror(errno));
    DIR *d = opendir(path);
    if (!d) return err_set(err, "%s: cannot read: %s", path, strerror(errno));
    int rc = 0;
    for (struct dirent *de; rc == 0 && (de = readdir(d));) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        /* cannot be cut: path was opened (under PATH_MAX), a name is at most 255 bytes */
        snprintf(f, sizeof f, "%.4096s/%.255s", path, de->d_name); /* the precisions: for the compiler */
        if (unlink(f) != 0 && errno != ENOENT) rc = err_set(err, "%s: cannot delete: %s", f, strerror(errno));
    }
    closedir(d);
    if (rc == 0 && rmdir(path) != 0) rc = err_set(err, "%s: cannot delete the directory: %s", path, strerror(errno));
    return rc;
}

int ckpt_dir_remove(const char *dir, const ckpt_entry *e, err_t *err) {
    char path[PATH_MAX_LEN];
    if (str_fmt(path, sizeof path, err, "checkpoint path", "%s/%s", dir, e->name) < 0) return -1;
    if (e->sharded) return remove_step_dir(path, err);
    if (unlink(path) != 0 && errno != ENOENT) return err_set(err, "%s: cannot delete: %s", path, strerror(errno));
    return 0;
}

/* NAME.tmp.PID: the PID, or 0 when the name is not a temporary's. */
static long tmp_pid(const char *name) {
    const char *t = strstr(name, ".tmp."), *last = NULL;
    for (; t; t = strstr(t + 1, ".tmp.")) last = t;
    if (!last || last == name) return 0;
    const char *p = last + 5;
    if (!*p || strspn(p, "0123456789") != strlen(p) || strlen(p) > 9) return 0;
    return strtol(p, NULL, 10);
}

static bool writer_gone(const char *path, long pid) {
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) return false;
    if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) return true;
    return difftime(time(NULL), st.st_mtime) > STALE_TMP_S; /* a PID of another machine or container */
}

/* One directory's stale temporaries; step directories too when `into_steps`. */
static int clean_dir(const char *dir, bool into_steps) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int removed = 0;
    char path[PATH_MAX_LEN];
    for (struct dirent *de; (de = readdir(d));) {
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name); /* as in remove_step_dir: cannot be cut */
        long pid = tmp_pid(de->d_name);
        bool file;
        long long s;
        if (pid > 0 && writer_gone(path, pid)) {
            if (unlink(path) == 0) removed++;
            else log_warn("%s: cannot delete a stale temporary file: %s", path, strerror(errno));
        } else if (into_steps && parse_name(de->d_name, &s, &file) && !file && file_is_dir(path)) {
            removed += clean_dir(path, false);
        }
    }
    closedir(d);
    return removed;
}

int ckpt_dir_clean_temps(const char *dir) { return clean_dir(dir, true); }

int dir_clean_temps(const char *dir) { return clean_dir(dir, false); }

int ckpt_dir_resolve(const char *path, char *out, size_t n, err_t *err) {
    struct stat st;
    if (stat(path, &st) < 0) return err_set(err, "%s: %s", path, strerror(errno));
    /* stat took path: it is under PATH_MAX, and so is its directory; what is added is checked */
    char dir[PATH_MAX_LEN], probe[PATH_MAX_LEN], name[64];
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    if (str_fmt(out, n, err, "checkpoint path", "%s", path) < 0) return -1;
    if (!S_ISDIR(st.st_mode)) {
        if (strcmp(base, "latest") != 0) return 0; /* a checkpoint file */
        snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
        int have = ckpt_dir_latest(dir, name, sizeof name, err);
        if (have <= 0) return have < 0 ? -1 : err_set(err, "%s: cannot open: no such file", path); /* gone meanwhile */
        return str_fmt(out, n, err, "checkpoint path", "%s/%s", dir, name);
    }
    snprintf(probe, sizeof probe, "%s/index.json", path);
    if (access(probe, F_OK) == 0) return 0; /* a sharded step directory */
    int rc = ckpt_dir_latest(path, name, sizeof name, err);
    if (rc < 0) return -1;
    if (rc == 0) {
        ckpt_entry *e = NULL;
        int k = ckpt_dir_list(path, &e, err), i = 0;
        if (k < 0) return -1;
        while (i < k && !e[i].complete) i++;
        if (i < k) memcpy(name, e[i].name, sizeof e[i].name); /* 48 bytes, into 64 */
        free(e);
        if (i >= k)
            return err_set(err, "%s: no checkpoint in this directory (expected step_N.safetensors, a step_N/ "
                                "directory with its index.json, or a latest file; or give a checkpoint file)", path);
    }
    return str_fmt(out, n, err, "checkpoint path", "%s/%s", path, name);
}
