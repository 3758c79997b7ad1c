/* ckpt_keep.c - see ckpt_keep.h. */
#include "common/ckpt_keep.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/ckpt_dir.h"
#include "common/fileio.h"
#include "common/json_util.h"
#include "common/log.h"
#include "common/worker_cmd.h"

#define MAX_SETTING (1L << 40)

/* DIR/retention.json as read: settings CKPT_KEEP_UNSET when absent, the diverged steps, sorted and
 * each once, so that a step is looked up by binary search: a directory of many checkpoints asks
 * once for each of them (retention, the newest good one). */
typedef struct keep_file {
    ckpt_keep keep;
    long long *diverged;
    int n_diverged;
} keep_file;

static int cmp_step(const void *a, const void *b) {
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

/* The file's path; the caller frees it. */
static char *keep_path(const char *dir) {
    size_t n = strlen(dir) + sizeof "/" CKPT_KEEP_FILE;
    char *p = xmalloc(n);
    snprintf(p, n, "%s/%s", dir, CKPT_KEEP_FILE); /* sized for both: cannot be cut */
    return p;
}

static int read_setting(const json_ctx *c, const cJSON *root, const char *key, long *out) {
    const cJSON *v = json_get(root, key);
    *out = CKPT_KEEP_UNSET;
    return v ? json_int(c, v, key, 0, MAX_SETTING, out) : 0;
}

/* The steps, in one pass over the array (cJSON's arrays are linked lists: an item by its index is
 * a walk from the first), then sorted with the duplicates dropped. */
static int read_diverged(const json_ctx *c, const cJSON *root, keep_file *f) {
    const cJSON *arr = json_get(root, "diverged"), *e;
    int n = 0, k = 0;
    if (!arr) return 0;
    if (json_expect_array(c, arr, "diverged", &n) < 0) return -1;
    f->diverged = n ? xcalloc((size_t)n, sizeof *f->diverged) : NULL;
    cJSON_ArrayForEach(e, arr) {
        char path[32];
        long step;
        snprintf(path, sizeof path, "diverged[%d]", f->n_diverged); /* 9 + at most 11 digits: fits */
        if (json_int(c, e, path, 0, 999999999999999999L, &step) < 0) return -1;
        f->diverged[f->n_diverged++] = step;
    }
    if (f->n_diverged > 1) qsort(f->diverged, (size_t)f->n_diverged, sizeof *f->diverged, cmp_step);
    for (int i = 0; i < f->n_diverged; i++)
        if (!k || f->diverged[i] != f->diverged[k - 1]) f->diverged[k++] = f->diverged[i];
    f->n_diverged = k;
    return 0;
}

/* 0 with *f filled (all unset when there is no file), or -1 naming the file and field. */
static int file_read(const char *dir, keep_file *f, err_t *err) {
    static const char *const keys[] = {"keep_last", "keep_every", "diverged", NULL};
    *f = (keep_file){{CKPT_KEEP_UNSET, CKPT_KEEP_UNSET}, NULL, 0};
    char *path = keep_path(dir);
    int rc = file_state_exists(path, err);
    if (rc <= 0) {
        free(path);
        return rc;
    }
    cJSON *root = json_load_file(path, err);
    json_ctx c = {path, err};
    if (!root || json_expect_object(&c, root, "the top level") < 0 || json_check_keys(&c, root, "", keys) < 0 ||
        read_setting(&c, root, "keep_last", &f->keep.keep_last) < 0 ||
        read_setting(&c, root, "keep_every", &f->keep.keep_every) < 0 || read_diverged(&c, root, f) < 0)
        rc = -1;
    cJSON_Delete(root);
    free(path);
    return rc < 0 ? -1 : 0;
}

static void file_free(keep_file *f) { free(f->diverged), f->diverged = NULL, f->n_diverged = 0; }

static int file_write(const char *dir, const keep_file *f, err_t *err) {
    cJSON *root = cJSON_CreateObject();
    if (f->keep.keep_last != CKPT_KEEP_UNSET) cJSON_AddNumberToObject(root, "keep_last", (double)f->keep.keep_last);
    if (f->keep.keep_every != CKPT_KEEP_UNSET) cJSON_AddNumberToObject(root, "keep_every", (double)f->keep.keep_every);
    cJSON *arr = cJSON_AddArrayToObject(root, "diverged");
    for (int i = 0; i < f->n_diverged; i++) cJSON_AddItemToArray(arr, cJSON_CreateNumber((double)f->diverged[i]));
    char *text = cJSON_PrintUnformatted(root), *path = keep_path(dir);
    cJSON_Delete(root);
    CHECK(text != NULL);
    size_t len = strlen(text);
    text[len] = '\n'; /* cJSON's buffer holds the NUL that this newline replaces */
    int rc = file_write_atomic(path, text, len + 1, FILE_OUT_OWN, err);
    free(text);
    free(path);
    return rc;
}

/* ---- the settings ---- */

static long pick(long given, long kept, wcmd_key k) {
    return given != CKPT_KEEP_UNSET ? given : kept != CKPT_KEEP_UNSET ? kept : wcmd_default_long(k);
}

/* What the run was told against what the directory keeps, said for each setting that matters:
 * one given over another kept, or one kept (not the default) applied without being given. */
static void describe(const char *dir, const ckpt_keep *given, const ckpt_keep *kept) {
    static const char *const flag[2] = {"keep-last", "keep-every"};
    static const wcmd_key key[2] = {WCMD_KEEP_LAST, WCMD_KEEP_EVERY};
    long g[2] = {given->keep_last, given->keep_every}, k[2] = {kept->keep_last, kept->keep_every};
    for (int i = 0; i < 2; i++) {
        if (k[i] == CKPT_KEEP_UNSET) continue;
        if (g[i] != CKPT_KEEP_UNSET && g[i] != k[i])
            log_msg("note", "checkpoint retention: --%s %ld overrides the %s %ld kept in %s/%s, from now on", flag[i],
                    g[i], flag[i], k[i], dir, CKPT_KEEP_FILE);
        else if (g[i] == CKPT_KEEP_UNSET && k[i] != wcmd_default_long(key[i]))
            log_msg("note", "checkpoint retention: %s %ld, as %s/%s keeps (the setting this directory was made "
                    "with; --%s changes it)", flag[i], k[i], dir, CKPT_KEEP_FILE, flag[i]);
    }
}

int ckpt_keep_settle(const char *dir, ckpt_keep *keep, err_t *err) {
    keep_file f;
    if (file_read(dir, &f, err) < 0) return file_free(&f), -1;
    ckpt_keep given = *keep, kept = f.keep;
    keep->keep_last = pick(given.keep_last, kept.keep_last, WCMD_KEEP_LAST);
    keep->keep_every = pick(given.keep_every, kept.keep_every, WCMD_KEEP_EVERY);
    describe(dir, &given, &kept);
    int rc = 0;
    if (kept.keep_last != keep->keep_last || kept.keep_every != keep->keep_every) {
        f.keep = *keep;
        rc = file_write(dir, &f, err);
    }
    file_free(&f);
    return rc;
}

/* ---- the divergence marks ---- */

/* The index of step in the sorted marks, or of the first mark above it when it has none. */
static int mark_at(const keep_file *f, long long step) {
    int lo = 0, hi = f->n_diverged;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (f->diverged[mid] < step) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static bool is_marked(const keep_file *f, long long step) {
    int i = mark_at(f, step);
    return i < f->n_diverged && f->diverged[i] == step;
}

/* Drops the marks of checkpoints no longer in the directory (deleted, set aside): the marks
 * (ascending) and e[0..n) (newest first) are walked together, once. */
static void drop_stale(keep_file *f, const ckpt_entry *e, int n) {
    int kept = 0, j = n - 1;
    for (int i = 0; i < f->n_diverged; i++) {
        while (j >= 0 && e[j].step < f->diverged[i]) j--;
        if (j >= 0 && e[j].step == f->diverged[i]) f->diverged[kept++] = f->diverged[i];
    }
    f->n_diverged = kept;
}

int ckpt_keep_mark(const char *dir, long long step, bool diverged, err_t *err) {
    keep_file f;
    ckpt_entry *e = NULL;
    int n = 0, rc = -1;
    if (file_read(dir, &f, err) < 0 || (n = ckpt_dir_list(dir, &e, err)) < 0) goto out;
    bool was = is_marked(&f, step);
    int before = f.n_diverged;
    drop_stale(&f, e, n);
    int at = mark_at(&f, step); /* where the step is, or goes (drop_stale keeps the order) */
    if (was && !diverged && at < f.n_diverged && f.diverged[at] == step) { /* written again, good this time */
        memmove(f.diverged + at, f.diverged + at + 1, (size_t)(f.n_diverged - at - 1) * sizeof *f.diverged);
        f.n_diverged--;
    } else if (diverged && !was) {
        f.diverged = xrealloc(f.diverged, (size_t)(f.n_diverged + 1) * sizeof *f.diverged);
        memmove(f.diverged + at + 1, f.diverged + at, (size_t)(f.n_diverged - at) * sizeof *f.diverged);
        f.diverged[at] = step;
        f.n_diverged++;
    }
    rc = f.n_diverged != before || was != diverged ? file_write(dir, &f, err) : 0;
out:
    free(e);
    file_free(&f);
    return rc;
}

/* The newest complete checkpoint of e[0..n) (newest first) not marked; -1 when none. */
static int newest_good(const ckpt_entry *e, int n, const keep_file *f) {
    for (int i = 0; i < n; i++)
        if (e[i].complete && !is_marked(f, e[i].step)) return i;
    return -1;
}

int ckpt_keep_last_good(const char *dir, char *name, size_t n, err_t *err) {
    keep_file f;
    ckpt_entry *e = NULL;
    int k = 0, rc = -1;
    if (file_read(dir, &f, err) == 0 && (k = ckpt_dir_list(dir, &e, err)) >= 0) {
        int i = newest_good(e, k, &f);
        rc = i >= 0;
        if (i >= 0) snprintf(name, n, "%s", e[i].name); /* ckpt_entry names are < 48 bytes; callers give more */
    }
    free(e);
    file_free(&f);
    return rc;
}

/* ---- pruning ---- */

typedef struct prune_ctx {
    const ckpt_keep *keep;
    const keep_file *f;
    const char *latest;          /* the name `latest` holds, or "" */
    long long newest, good_step; /* the newest complete step, the newest good one (-1: none) */
    int good_seen, diverged_seen; /* complete checkpoints of each kind met so far, newest first */
} prune_ctx;

/* Whether retention keeps e; when not, *rule says why (for the log). */
static bool kept(prune_ctx *p, const ckpt_entry *e, char *rule, size_t n) {
    bool named = !strcmp(e->name, p->latest);
    if (!e->complete) {
        snprintf(rule, n, "a write cut short, older than the newest complete checkpoint");
        return named || e->step >= p->newest; /* maybe being written */
    }
    bool diverged = is_marked(p->f, e->step);
    int place = diverged ? p->diverged_seen++ : p->good_seen++;
    long last = p->keep->keep_last, every = p->keep->keep_every;
    if (named || e->step == p->newest || e->step == p->good_step || last == 0) return true;
    if (every > 0 && e->step % every == 0) return true;
    /* the rules are fixed text and one number: they fit in any rule buffer of 160 bytes */
    if (diverged && e->step < p->good_step)
        snprintf(rule, n, "written while the loss was above the divergence bound, and a newer good checkpoint exists");
    else if (diverged && place >= last)
        snprintf(rule, n, "written while the loss was above the divergence bound; keep-last %ld of those", last);
    else if (!diverged && place >= last)
        snprintf(rule, n, "keep-last %ld: older than the %ld newest good checkpoints", last, last);
    else
        return true;
    return false;
}

int ckpt_keep_prune(const char *dir, const ckpt_keep *keep, err_t *err) {
    keep_file f;
    ckpt_entry *e = NULL;
    int n = 0;
    if (file_read(dir, &f, err) < 0) return file_free(&f), -1;
    if ((n = ckpt_dir_list(dir, &e, err)) <= 0) return file_free(&f), n;
    char latest[64] = "", rule[160];
    err_t ignored;
    if (ckpt_dir_latest(dir, latest, sizeof latest, &ignored) < 0) latest[0] = '\0';
    prune_ctx p = {keep, &f, latest, -1, -1, 0, 0};
    for (int i = 0; i < n && p.newest < 0; i++)
        if (e[i].complete) p.newest = e[i].step;
    int g = newest_good(e, n, &f);
    p.good_step = g >= 0 ? e[g].step : -1;
    int removed = 0, rc = 0;
    for (int i = 0; i < n && rc == 0 && p.newest >= 0; i++) {
        if (kept(&p, &e[i], rule, sizeof rule)) continue;
        if ((rc = ckpt_dir_remove(dir, &e[i], err)) == 0) {
            removed++;
            log_msg("note", "checkpoint retention: deleted %s/%s (%s)", dir, e[i].name, rule);
        }
    }
    free(e);
    file_free(&f);
    return rc < 0 ? -1 : removed;
}
