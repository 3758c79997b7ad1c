/* outputs.c - see outputs.h. */
#include "common/outputs.h"

#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/fileio.h"
#include "common/log.h"
#include "common/strutil.h"

out_set out_begin(const char *cmd) { return (out_set){.cmd = cmd}; }

static void free_paths(out_path *p, int n) {
    for (int i = 0; i < n; i++) free(p[i].path);
    free(p);
}

void out_free(out_set *s) {
    free_paths(s->in, s->n_in);
    free_paths(s->file, s->n_file);
    free_paths(s->dir, s->n_dir);
    *s = (out_set){.cmd = s->cmd};
}

static bool is_path(const char *p) { return p && p[0] && strcmp(p, "-") != 0; }

static void add(out_path **v, int *n, const char *opt, const char *path, const out_kind *kind) {
    if (!is_path(path)) return;
    *v = xrealloc(*v, (size_t)(*n + 1) * sizeof **v);
    (*v)[(*n)++] = (out_path){opt, xstrdup(path), kind};
}

void out_input(out_set *s, const char *opt, const char *path) { add(&s->in, &s->n_in, opt, path, NULL); }
void out_input_dir(out_set *s, const char *opt, const char *dir, const out_kind *kind) {
    add(&s->in, &s->n_in, opt, dir, kind);
}
void out_input_path(out_set *s, const char *opt, const char *path, const out_kind *dir_kind) {
    add(&s->in, &s->n_in, opt, path, path && file_is_dir(path) ? dir_kind : NULL);
}
void out_file(out_set *s, const char *opt, const char *path) { add(&s->file, &s->n_file, opt, path, NULL); }
void out_dir(out_set *s, const char *opt, const char *dir, const out_kind *kind) {
    add(&s->dir, &s->n_dir, opt, dir, kind);
}

/* ---- where a path lies ---- */

static bool exists(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0;
}

/* path's parent directory (as written) into buf; false when it cannot be a directory. */
static bool parent_of(const char *path, char *buf, size_t n) {
    const char *slash = strrchr(path, '/');
    if (!slash) return snprintf(buf, n, ".") > 0;
    if (slash == path) return snprintf(buf, n, "/") > 0;
    if ((size_t)(slash - path) >= n) return false; /* longer than any directory can be */
    snprintf(buf, n, "%.*s", (int)(slash - path), path);
    return true;
}

static const char *last_name(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* Whether path (existing or not) lies directly in dir; its last component goes into name. A
 * path that exists is resolved (a symbolic link into dir counts); one that does not is compared
 * by its parent directory. */
static bool lies_in(const char *path, const char *dir, char *name, size_t n) {
    if (exists(path)) return file_in_dir(path, dir, name, n);
    char parent[PATH_MAX];
    if (!parent_of(path, parent, sizeof parent)) return false;
    snprintf(name, n, "%s", last_name(path)); /* a name longer than n cannot be a file's: it only fails to match */
    return file_same(parent, dir);
}

/* Whether an output would land on input `in`: the same file; one of the files a pattern
 * matches; one of the files of kind in an input directory (*what says which). */
static bool lands_on(const char *out, const out_path *in, char *name, size_t n) {
    char parent[PATH_MAX];
    if (!in->kind && strpbrk(in->path, "*?[") && !exists(in->path))
        return parent_of(in->path, parent, sizeof parent) && lies_in(out, parent, name, n) &&
               fnmatch(last_name(in->path), name, FNM_PERIOD) == 0;
    if (!exists(in->path)) return false;
    snprintf(name, n, "%s", last_name(in->path));
    if (file_same(out, in->path)) return true;
    return in->kind && file_is_dir(in->path) && lies_in(out, in->path, name, n) && in->kind->owns(name);
}

/* ---- the rules ---- */

static int file_vs_inputs(const out_set *s, const out_path *o, err_t *err) {
    char name[256];
    for (int i = 0; i < s->n_in; i++) {
        const out_path *in = &s->in[i];
        if (!lands_on(o->path, in, name, sizeof name)) continue;
        if (file_same(o->path, in->path))
            return err_set(err, "%s %s: this is the input %s %s; writing there would destroy it (give the output "
                           "another path)", o->opt, o->path, in->opt, in->path);
        return err_set(err, "%s %s: this is %s, an input of %s %s; writing there would destroy it (give the output "
                       "another path)", o->opt, o->path, name, in->opt, in->path);
    }
    return 0;
}

static int file_vs_dirs(const out_set *s, const out_path *o, err_t *err) {
    char name[256];
    for (int d = 0; d < s->n_dir; d++) {
        const out_path *a = &s->dir[d];
        if (file_same(o->path, a->path))
            return err_set(err, "%s %s: this is the %s %s %s (give the output another path)", o->opt, o->path,
                           a->kind->what, a->opt, a->path);
        if (lies_in(o->path, a->path, name, sizeof name) && a->kind->owns(name))
            return err_set(err, "%s %s: %s is a file this command keeps in its %s %s %s; writing there would destroy "
                           "it (give the output another path)", o->opt, o->path, name, a->kind->what, a->opt, a->path);
    }
    return 0;
}

/* An output directory against the inputs: the directory itself, or one of its files. */
static int dir_vs_inputs(const out_set *s, const out_path *a, err_t *err) {
    char name[256];
    for (int i = 0; i < s->n_in && !a->kind->reads_back; i++) {
        const out_path *in = &s->in[i];
        if (!exists(in->path)) continue;
        if (file_same(in->path, a->path))
            return err_set(err, "%s %s: this is the input %s %s, which this command would write into (give the "
                           "output another directory)", a->opt, a->path, in->opt, in->path);
        if (lies_in(in->path, a->path, name, sizeof name) && a->kind->owns(name))
            return err_set(err, "%s %s: this input is %s, a file of the %s %s %s, which this command writes; read it "
                           "from elsewhere or give another %s", in->opt, in->path, name, a->kind->what, a->opt,
                           a->path, a->opt);
    }
    return 0;
}

/* A directory of generic names holds one of them, but not the command's marker: someone else's. */
static int dir_vs_foreign(const out_set *s, const out_path *a, err_t *err) {
    char path[PATH_MAX];
    if (!a->kind->marker || !file_is_dir(a->path)) return 0;
    if (snprintf(path, sizeof path, "%s/%s", a->path, a->kind->marker) >= (int)sizeof path)
        return err_set(err, "%s %s: the path is longer than %d bytes", a->opt, a->path, PATH_MAX - 1);
    if (exists(path)) return 0;
    DIR *d = opendir(a->path);
    if (!d) return err_set(err, "%s %s: cannot read the directory: %s", a->opt, a->path, strerror(errno));
    int rc = 0;
    for (struct dirent *de; rc == 0 && (de = readdir(d));)
        if (a->kind->owns(de->d_name))
            rc = err_set(err, "%s %s: it holds %s, which %s did not write (no %s there), and writing would replace "
                         "it: give a new or empty directory, or move the file", a->opt, a->path, de->d_name, s->cmd,
                         a->kind->marker);
    closedir(d);
    return rc;
}

int out_check(const out_set *s, err_t *err) {
    for (int o = 0; o < s->n_file; o++) {
        if (file_vs_inputs(s, &s->file[o], err) < 0 || file_vs_dirs(s, &s->file[o], err) < 0) return -1;
        for (int e = 0; e < o; e++)
            if (file_same(s->file[o].path, s->file[e].path))
                return err_set(err, "%s %s: this is also the output %s %s (give each output its own path)",
                               s->file[o].opt, s->file[o].path, s->file[e].opt, s->file[e].path);
    }
    for (int d = 0; d < s->n_dir; d++)
        if (dir_vs_inputs(s, &s->dir[d], err) < 0 || dir_vs_foreign(s, &s->dir[d], err) < 0) return -1;
    return 0;
}

int out_mark(const char *dir, const out_kind *kind, err_t *err) {
    char path[PATH_MAX];
    if (!kind->marker) return 0;
    if (snprintf(path, sizeof path, "%s/%s", dir, kind->marker) >= (int)sizeof path)
        return err_set(err, "%s: the path is longer than %d bytes", dir, PATH_MAX - 1);
    if (exists(path)) return 0;
    static const char text[] = "This directory is written by cephalo; its files may be replaced on the next run.\n";
    return file_write_atomic(path, text, sizeof text - 1, err);
}

/* ---- Hugging Face model directories ---- */

static bool hf_owns(const char *name) {
    static const char *const exact[] = {"config.json", "generation_config.json", "special_tokens_map.json",
                                        "vocab.json", "merges.txt", ".cephalo-export", NULL};
    for (int i = 0; exact[i]; i++)
        if (!strcmp(name, exact[i])) return true;
    return str_ends_with(name, ".safetensors") || str_ends_with(name, ".safetensors.index.json") ||
           !strncmp(name, "tokenizer", 9) || (!strncmp(name, "pytorch_model", 13) && (str_ends_with(name, ".bin") ||
                                                                                       str_ends_with(name, ".index.json")));
}

const out_kind out_hf_input = {"model directory", hf_owns, true, NULL};
const out_kind out_hf_export = {"export directory", hf_owns, false, ".cephalo-export"};
