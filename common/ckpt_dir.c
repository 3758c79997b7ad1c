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
           !strcmp(name, "index.json") || !strcmp(name, ".lock") || !strcmp(name, "tokenizer.json") || (n > 12 && !strcmp(name + n - 12, SUFFIX));
}

/* A step directory (CKPT/step_N/: rank-R.safetensors, index.json) is the checkpoint's alone. */
static bool step_owns(const char *name) { return name[0] != 0; }
static const out_kind step_dir_kind = {"checkpoint step directory", step_owns, true, NULL, NULL};

const out_kind ckpt_dir_kind = {"checkpoint directory", ckpt_owns, true, NULL, &step_dir_kind};

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
    char path[PATH_MAX_LEN];
    if (str_fmt(path, sizeof path, err, "checkpoint path", "%s/latest", dir) < 0) return -1;
    int there = file_state_exists(path, err);
    if (there <= 0) return there;
    size_t len;
    char *text = file_read_all(path, (size_t)1 << 20, &len, err);
    if (!text) return -1;
    if (len && text[len - 1] == '\n') text[--len] = '\0';
    long long step;
    bool file;
    /* the whole content is the name: a NUL would end a C string early and leave a name that is not
     * what the file says */
    bool ok = strlen(text) == len && len < n && parse_name(text, &step, &file);
    if (ok) snprintf(name, n, "%s", text);
    else err_set(err, "%s: holds '%.60s%s', not a checkpoint name (step_N or step_N.safetensors)", path, text,
                 strlen(text) != len ? "\\0..." : "");
    free(text);
    return ok ? 1 : -1;
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

int ckpt_arg_classify(const char *path, char *dir, size_t n, ckpt_arg_kind *kind, err_t *err) {
    struct stat st;
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    bool pointer = !strcmp(base, "latest");
    if (str_fmt(dir, n, err, "checkpoint path", "%s", path) < 0) return -1;
    if (pointer || !strcmp(base, "index.json")) snprintf(dir, n, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
    /* DIR/latest needs no file: it stands for what the pointer would name, and its checks say what
     * is wrong with the pointer (missing included) */
    if (pointer && file_is_dir(dir) && !file_is_dir(path)) return *kind = CKPT_ARG_POINTER, 0;
    if (stat(path, &st) != 0) return err_set(err, "%s: cannot open: %s", path, strerror(errno));
    *kind = CKPT_ARG_ONE;
    if (!strcmp(base, "index.json") && S_ISREG(st.st_mode)) return 0; /* a step directory's index: the directory */
    snprintf(dir, n, "%s", path); /* fitted above */
    char probe[PATH_MAX_LEN];
    snprintf(probe, sizeof probe, "%s/index.json", path); /* stat took path: under PATH_MAX, and 4400 holds both */
    if (S_ISDIR(st.st_mode) && !exists(probe)) *kind = CKPT_ARG_DIR;
    return 0;
}

/* DIR/latest when it names a complete checkpoint there: 1 with its name; else 0 with what is wrong
 * in `why` (empty when there is no latest file). */
static int pointer_target(const char *dir, char *name, size_t n, char *why, size_t whysz) {
    err_t e;
    *why = '\0';
    int have = ckpt_dir_latest(dir, name, n, &e);
    if (have < 0) return snprintf(why, whysz, "%s", e.msg), 0;
    if (have == 0) return 0;
    ckpt_entry entry;
    char path[PATH_MAX_LEN];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (!exists(path)) return snprintf(why, whysz, "%s/latest names %s, which does not exist", dir, name), 0;
    if (!read_entry(dir, name, &entry) || !entry.complete)
        return snprintf(why, whysz, "%s/latest names %s, which is not a complete checkpoint (a step directory "
                        "without its index.json)", dir, name), 0;
    return 1;
}

int ckpt_dir_pick(const char *dir, bool pointer, char *out, size_t n, err_t *err) {
    char name[64], why[1200];
    if (pointer_target(dir, name, sizeof name, why, sizeof why)) return snprintf(out, n, "%s/%s", dir, name), 0;
    if (pointer && !*why) snprintf(why, sizeof why, "%s/latest is missing", dir);
    ckpt_entry *e = NULL;
    int k = ckpt_dir_list(dir, &e, err), i = 0;
    if (k < 0) return -1;
    while (i < k && !e[i].complete) i++;
    if (i < k) snprintf(name, sizeof name, "%s", e[i].name);
    free(e);
    if (i >= k && *why) return err_set(err, "%s, and %s holds no complete checkpoint to use instead", why, dir);
    if (i >= k)
        return err_set(err, "%s: no checkpoint in this directory (expected step_N.safetensors, a step_N/ "
                            "directory with its index.json, or a latest file; or give a checkpoint file)", dir);
    /* the pointer is stale (a copy that left files behind, a retention or a write cut short): the
     * newest complete checkpoint is what --resume auto would take; say which, and why */
    if (*why) log_warn("%s: using the newest complete checkpoint there, %s", why, name);
    snprintf(out, n, "%s/%s", dir, name);
    return 0;
}

int ckpt_dir_resolve(const char *path, char *out, size_t n, err_t *err) {
    char dir[PATH_MAX_LEN];
    ckpt_arg_kind kind;
    if (ckpt_arg_classify(path, dir, sizeof dir, &kind, err) < 0) return -1;
    if (kind == CKPT_ARG_ONE) return snprintf(out, n, "%s", dir), 0;
    return ckpt_dir_pick(dir, kind == CKPT_ARG_POINTER, out, n, err);
}
