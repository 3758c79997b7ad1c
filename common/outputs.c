/* realpath() is XSI, beyond the POSIX base the build selects */
#define _XOPEN_SOURCE 700

/* outputs.c - see outputs.h. */
#include "common/outputs.h"

#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <glob.h>
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

static const char *last_name(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* Appends the components of rest to the absolute path out (of capacity n), "." and ".." taken
 * as written: the part of a path that does not exist yet has no links to follow. */
static bool append_lexical(char *out, size_t n, const char *rest) {
    size_t len = strlen(out);
    for (const char *p = rest; *p;) {
        size_t k = strcspn(p, "/");
        if (k == 2 && !strncmp(p, "..", 2)) {
            while (len > 1 && out[len - 1] != '/') len--;
            if (len > 1) len--;
            out[len] = 0;
        } else if (k && !(k == 1 && *p == '.')) {
            if (len + 1 + k >= n) return false;
            if (len > 1) out[len++] = '/';
            memcpy(out + len, p, k), len += k, out[len] = 0;
        }
        p += k + (p[k] == '/');
    }
    return true;
}

/* The absolute path path names: its longest existing leading part resolved (links followed, as
 * file_out_open follows them) and the rest appended; false when it cannot be. */
static bool resolved(const char *path, char *out, size_t n) {
    char head[PATH_MAX], real[PATH_MAX];
    if (snprintf(head, sizeof head, "%s", path) >= (int)sizeof head || n < sizeof real) return false;
    size_t cut = strlen(head);
    for (;;) {
        char keep = head[cut];
        head[cut] = 0;
        bool ok = realpath(cut ? head : ".", real) != NULL;
        head[cut] = keep;
        if (ok) break;
        if (cut == 0) return false;
        while (cut > 0 && head[cut - 1] != '/') cut--; /* one component less */
        while (cut > 1 && head[cut - 1] == '/') cut--;
    }
    snprintf(out, n, "%s", real);
    return append_lexical(out, n, path + cut);
}

/* Whether the resolved path `file` lies in directory dir where kind keeps it, or (deep) below it
 * where kind->sub keeps it, one level down each: its name relative to dir into *rel. */
static bool kind_claims(const char *dir, const out_kind *kind, bool deep, const char *file, const char **rel) {
    char real[PATH_MAX];
    if (!resolved(dir, real, sizeof real)) return false;
    size_t n = strcmp(real, "/") ? strlen(real) : 0;
    if (strncmp(file, real, n) || file[n] != '/') return false;
    *rel = file + n + 1;
    for (const char *p = strchr(*rel, '/'); p && kind; p = strchr(p + 1, '/')) kind = deep ? kind->sub : NULL;
    return kind && kind->owns(last_name(*rel));
}

/* Whether the resolved path `file` (not there yet) is one that pattern would match: its name
 * matches the last component, and its directory is one the directory part matches. */
static bool pattern_claims(const char *pattern, const char *file) {
    char dir[PATH_MAX], real[PATH_MAX], parent[PATH_MAX];
    const char *slash = strrchr(pattern, '/');
    if ((slash && (size_t)(slash - pattern) >= sizeof dir) || fnmatch(last_name(pattern), last_name(file), FNM_PERIOD))
        return false;
    snprintf(dir, sizeof dir, "%.*s", slash ? (slash == pattern ? 1 : (int)(slash - pattern)) : 1, slash ? pattern : ".");
    snprintf(parent, sizeof parent, "%.*s", last_name(file) - file > 1 ? (int)(last_name(file) - file - 1) : 1, file);
    glob_t g;
    if (glob(dir, GLOB_NOSORT, NULL, &g) != 0) return false;
    bool match = false;
    for (size_t i = 0; i < g.gl_pathc && !match; i++) match = realpath(g.gl_pathv[i], real) && !strcmp(real, parent);
    globfree(&g);
    return match;
}

/* ---- what the inputs stand for: every file the command reads, by device and inode ---- */

typedef struct rfile {
    dev_t dev;
    ino_t ino;
    char *path;         /* as the command reads it */
    const out_path *in; /* the input (or the output directory read back) it comes from */
    bool back;          /* from an output directory: its checkpoints, read back to resume */
} rfile;

typedef struct rset {
    rfile *v;
    size_t n, cap;
} rset;

static void rset_add(rset *r, const char *path, const out_path *in) {
    struct stat st;
    if (stat(path, &st) != 0 || S_ISDIR(st.st_mode)) return;
    if (r->n == r->cap) r->v = xrealloc(r->v, (r->cap = r->cap ? 2 * r->cap : 64) * sizeof *r->v);
    r->v[r->n++] = (rfile){st.st_dev, st.st_ino, xstrdup(path), in, false};
}

static void rset_free(rset *r) {
    for (size_t i = 0; i < r->n; i++) free(r->v[i].path);
    free(r->v);
}

static int rfile_cmp(const void *a, const void *b) {
    const rfile *x = a, *y = b;
    if (x->dev != y->dev) return x->dev < y->dev ? -1 : 1;
    return x->ino < y->ino ? -1 : x->ino > y->ino;
}

static const rfile *rset_find(const rset *r, const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) return NULL;
    rfile key = {.dev = st.st_dev, .ino = st.st_ino};
    return r->n ? bsearch(&key, r->v, r->n, sizeof *r->v, rfile_cmp) : NULL;
}

/* The files of kind in dir, and (deep) of kind->sub in each of its subdirectories. */
static void expand_dir(rset *r, const char *dir, const out_kind *kind, bool deep, const out_path *in) {
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *de; (de = readdir(d));) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        char *path = str_printf("%s%s%s", dir, str_ends_with(dir, "/") ? "" : "/", de->d_name);
        if (deep && kind->sub && file_is_dir(path)) expand_dir(r, path, kind->sub, true, in);
        else if (kind->owns(de->d_name)) rset_add(r, path, in);
        free(path);
    }
    closedir(d);
}

/* An input: the file itself, the files of kind in a directory, or what a pattern matches now
 * (wildcards anywhere, as glob(3) and the data reader take them). */
static void expand_input(rset *r, const out_path *in) {
    struct stat st;
    if (stat(in->path, &st) == 0) {
        if (!S_ISDIR(st.st_mode)) rset_add(r, in->path, in);
        else if (in->kind) expand_dir(r, in->path, in->kind, true, in);
        return;
    }
    glob_t g;
    if (!strpbrk(in->path, "*?[") || glob(in->path, GLOB_NOSORT, NULL, &g) != 0) return;
    for (size_t i = 0; i < g.gl_pathc; i++) rset_add(r, g.gl_pathv[i], in);
    globfree(&g);
}

/* Every input, and the files of the output directories that the command reads back (the
 * checkpoints --resume auto starts from). */
static void expand_reads(const out_set *s, rset *r) {
    for (int i = 0; i < s->n_in; i++) expand_input(r, &s->in[i]);
    size_t inputs = r->n;
    for (int d = 0; d < s->n_dir; d++)
        if (s->dir[d].kind->reads_back && file_is_dir(s->dir[d].path)) expand_dir(r, s->dir[d].path, s->dir[d].kind, true, &s->dir[d]);
    for (size_t i = inputs; i < r->n; i++) r->v[i].back = true;
    if (r->n) qsort(r->v, r->n, sizeof *r->v, rfile_cmp);
}

/* How messages name a file read: "the input --data d/x.bin" for an input itself, "x.bin, an
 * input of --data d" for one of its files. */
static void describe_read(const rfile *f, char *buf, size_t n) {
    const char *p = f->path, *in = f->in->path;
    size_t k = strlen(in);
    if (!strcmp(p, in)) snprintf(buf, n, "the input %s %s", f->in->opt, in);
    else snprintf(buf, n, "%s, %s %s %s", !strncmp(p, in, k) && p[k] == '/' ? p + k + 1 : last_name(p),
                  f->back ? "read back from" : "an input of", f->in->opt, in);
}

/* ---- the rules ---- */

static int refuse_read(const out_path *o, const rfile *f, err_t *err) {
    char what[PATH_MAX + 256];
    describe_read(f, what, sizeof what);
    return err_set(err, "%s %s: this is %s; writing there would destroy it (give the output another path)", o->opt,
                   o->path, what);
}

/* An output file against the inputs: one of the files they stand for (by device and inode), or
 * a new file one of their directories or patterns would read. */
static int file_vs_inputs(const out_set *s, const rset *r, const out_path *o, const char *res, err_t *err) {
    const rfile *f = rset_find(r, o->path);
    if (f) return refuse_read(o, f, err);
    if (exists(o->path)) return 0;
    for (int i = 0; i < s->n_in; i++) {
        const out_path *in = &s->in[i];
        const char *rel = NULL;
        bool claimed = in->kind ? file_is_dir(in->path) && kind_claims(in->path, in->kind, true, res, &rel)
                                : strpbrk(in->path, "*?[") && !exists(in->path) && pattern_claims(in->path, res);
        if (claimed)
            return err_set(err, "%s %s: this is %s, an input of %s %s; writing there would destroy it (give the output "
                           "another path)", o->opt, o->path, rel ? rel : last_name(res), in->opt, in->path);
    }
    return 0;
}

static int file_vs_dirs(const out_set *s, const out_path *o, const char *res, err_t *err) {
    for (int d = 0; d < s->n_dir; d++) {
        const out_path *a = &s->dir[d];
        const char *rel;
        if (file_same(o->path, a->path))
            return err_set(err, "%s %s: this is the %s %s %s (give the output another path)", o->opt, o->path,
                           a->kind->what, a->opt, a->path);
        if (kind_claims(a->path, a->kind, true, res, &rel))
            return err_set(err, "%s %s: %s is a file this command keeps in its %s %s %s; writing there would destroy "
                           "it (give the output another path)", o->opt, o->path, rel, a->kind->what, a->opt, a->path);
    }
    return 0;
}

/* An output directory against the inputs: the directory itself, a file read that lies there
 * under a name the command writes, or a file there that is one of the files read (a hard link). */
static int dir_vs_inputs(const out_set *s, const rset *r, const out_path *a, err_t *err) {
    if (a->kind->reads_back) return 0;
    for (int i = 0; i < s->n_in; i++)
        if (exists(s->in[i].path) && file_same(s->in[i].path, a->path))
            return err_set(err, "%s %s: this is the input %s %s, which this command would write into (give the "
                           "output another directory)", a->opt, a->path, s->in[i].opt, s->in[i].path);
    char res[PATH_MAX + 256];
    const char *rel;
    for (size_t i = 0; i < r->n; i++)
        if (resolved(r->v[i].path, res, sizeof res) && kind_claims(a->path, a->kind, false, res, &rel))
            return err_set(err, "%s %s: this input is %s, a file of the %s %s %s, which this command writes; read it "
                           "from elsewhere or give another %s", r->v[i].in->opt, r->v[i].path, rel, a->kind->what,
                           a->opt, a->path, a->opt);
    rset mine = {0};
    expand_dir(&mine, a->path, a->kind, false, a); /* its subdirectories are outputs of their own */
    int rc = 0;
    for (size_t i = 0; i < mine.n && rc == 0; i++) {
        const rfile *f = rset_find(r, mine.v[i].path);
        char what[PATH_MAX + 256];
        if (!f) continue;
        describe_read(f, what, sizeof what);
        rc = err_set(err, "%s %s: its %s is %s (the same file), which this command would write over; remove the link "
                     "or give another %s", a->opt, a->path, last_name(mine.v[i].path), what, a->opt);
    }
    rset_free(&mine);
    return rc;
}

/* A directory of generic names holds one of them, but not the command's marker: someone else's.
 * The names are read first and the marker looked for after: the command marks a directory before
 * it writes a name there, so another run of it taking the directory meanwhile is never mistaken
 * for someone else. */
static int dir_vs_foreign(const out_set *s, const out_path *a, err_t *err) {
    char path[PATH_MAX], owned[256] = "";
    if (!a->kind->marker || !file_is_dir(a->path)) return 0;
    if (snprintf(path, sizeof path, "%s/%s", a->path, a->kind->marker) >= (int)sizeof path)
        return err_set(err, "%s %s: the path is longer than %d bytes", a->opt, a->path, PATH_MAX - 1);
    DIR *d = opendir(a->path);
    if (!d) return err_set(err, "%s %s: cannot read the directory: %s", a->opt, a->path, strerror(errno));
    for (struct dirent *de; !owned[0] && (de = readdir(d));)
        if (a->kind->owns(de->d_name) && strcmp(de->d_name, a->kind->marker)) snprintf(owned, sizeof owned, "%s", de->d_name);
    closedir(d);
    if (!owned[0] || exists(path)) return 0;
    return err_set(err, "%s %s: it holds %s, which %s did not write (no %s there), and writing would replace it: give a "
                   "new or empty directory, or move the file", a->opt, a->path, owned, s->cmd, a->kind->marker);
}

static int check_files(const out_set *s, const rset *r, err_t *err) {
    for (int o = 0; o < s->n_file; o++) {
        const out_path *f = &s->file[o];
        char res[PATH_MAX + 256];
        err_t why;
        if (file_out_check(f->path, &why) < 0) return err_set(err, "%s %s", f->opt, why.msg);
        if (!resolved(f->path, res, sizeof res)) continue; /* cannot be resolved: opening it says why */
        if (file_vs_dirs(s, f, res, err) < 0 || file_vs_inputs(s, r, f, res, err) < 0) return -1;
        for (int e = 0; e < o; e++)
            if (file_same(f->path, s->file[e].path))
                return err_set(err, "%s %s: this is also the output %s %s (give each output its own path)", f->opt,
                               f->path, s->file[e].opt, s->file[e].path);
    }
    for (int d = 0; d < s->n_dir; d++) {
        const out_path *a = &s->dir[d];
        err_t why;
        struct stat st; /* a directory not made yet (or a link to one) is made by the command */
        if (stat(a->path, &st) == 0 && file_expect_dir(a->path, &why) < 0) return err_set(err, "%s %s", a->opt, why.msg);
        if (dir_vs_inputs(s, r, a, err) < 0 || dir_vs_foreign(s, a, err) < 0) return -1;
    }
    return 0;
}

int out_check(const out_set *s, err_t *err) {
    rset r = {0};
    expand_reads(s, &r);
    int rc = check_files(s, &r, err);
    for (size_t i = 0; rc == 0 && i < r.n; i++) { /* file_out_open checks every output again */
        char label[PATH_MAX + 256];
        struct stat st;
        describe_read(&r.v[i], label, sizeof label);
        if (stat(r.v[i].path, &st) == 0) file_guard_add(r.v[i].path, &st, label);
    }
    rset_free(&r);
    return rc;
}

int out_mark(const char *dir, const out_kind *kind, err_t *err) {
    char path[PATH_MAX];
    if (!kind->marker) return 0;
    if (snprintf(path, sizeof path, "%s/%s", dir, kind->marker) >= (int)sizeof path)
        return err_set(err, "%s: the path is longer than %d bytes", dir, PATH_MAX - 1);
    if (exists(path)) return 0;
    static const char text[] = "This directory is written by cephalo; its files may be replaced on the next run.\n";
    return file_write_atomic(path, text, sizeof text - 1, 0, err);
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

const out_kind out_hf_input = {"model directory", hf_owns, true, NULL, NULL};
const out_kind out_hf_export = {"export directory", hf_owns, false, ".cephalo-export", NULL};
