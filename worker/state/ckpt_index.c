/* ckpt_index.c - a sharded step directory's index.json read and checked (ckpt_index.h). */
#include "state/ckpt_index.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/strutil.h"


int ckpt_ranges_read(const json_ctx *c, const cJSON *o, const char *path, int n_units, int64_t *off, int64_t *n) {
    const char *keys[2] = {"offsets", "sizes"};
    int64_t *out[2] = {off, n};
    for (int k = 0; k < 2; k++) {
        const cJSON *a;
        int len;
        char at[128];
        snprintf(at, sizeof at, "%s.%s", path, keys[k]);
        if (json_require(c, o, path, keys[k], &a) < 0 || json_expect_array(c, a, at, &len) < 0)
            return -1;
        if (len != n_units)
            return err_set(c->err, "%s: %s has %d entries, expected one per unit (%d)", c->file,
                           at, len, n_units);
        int u = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, a) { /* one pass: cJSON_GetArrayItem walks the list from its start */
            long v;
            char el[160];
            snprintf(el, sizeof el, "%s[%d]", at, u);
            if (json_int(c, e, el, 0, 1L << 50, &v) < 0) return -1;
            out[k][u++] = v;
        }
    }
    return 0;
}

void ckpt_index_free(ckpt_index *ix) {
    for (int i = 0; i < ix->n_files; i++)
        free(ix->files[i].path), free(ix->files[i].off), free(ix->files[i].n);
    free(ix->files);
    *ix = (ckpt_index){0};
}

static ckpt_slices *add_file(ckpt_index *ix, const char *path, int n_units) {
    if ((ix->n_files & (ix->n_files - 1)) == 0) /* at 0, 1, 2, 4, ...: doubled, not grown by one */
        ix->files = xrealloc(ix->files, (size_t)(ix->n_files ? 2 * ix->n_files : 1) * sizeof *ix->files);
    ckpt_slices *f = &ix->files[ix->n_files++];
    *f = (ckpt_slices){.path = xstrdup(path)};
    f->off = xcalloc((size_t)n_units, sizeof(int64_t));
    f->n = xcalloc((size_t)n_units, sizeof(int64_t));
    return f;
}

/* Files by their slice of one unit: by offset, then by index. */
typedef struct slice_ref {
    int64_t off;
    int i;
} slice_ref;

static int slice_cmp(const void *a, const void *b) {
    const slice_ref *x = a, *y = b;
    if (x->off != y->off) return x->off < y->off ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

/* Every unit must be tiled exactly by the files: no gap, no overlap. The non-empty slices of a
 * unit are sorted by offset, so that an overlap is one of neighbours: a file per rank, thousands
 * of them, are not compared pairwise. */
static int check_tiling(const ckpt_index *ix, const char *label, const int64_t *numel, int n_units, err_t *err) {
    slice_ref *ref = xmalloc((size_t)ix->n_files * sizeof *ref + 1);
    int rc = 0;
    for (int u = 0; u < n_units && rc == 0; u++) {
        int64_t covered = 0;
        int n = 0;
        for (int i = 0; i < ix->n_files && rc == 0; i++) {
            const ckpt_slices *a = &ix->files[i];
            if (a->off[u] + a->n[u] > numel[u])
                rc = err_set(err, "%s: %s: unit %d slice [%lld, %lld) is beyond its %lld parameters",
                             label, a->path, u, (long long)a->off[u],
                             (long long)(a->off[u] + a->n[u]), (long long)numel[u]);
            if (a->n[u]) ref[n++] = (slice_ref){a->off[u], i};
            covered += a->n[u];
        }
        if (rc == 0 && n > 1) qsort(ref, (size_t)n, sizeof *ref, slice_cmp);
        for (int k = 1; k < n && rc == 0; k++) {
            const slice_ref *b = &ref[k - 1], *a = &ref[k];
            if (a->off < b->off + ix->files[b->i].n[u]) /* named in the index's order */
                rc = err_set(err, "%s: unit %d: the slices of %s and %s overlap", label, u,
                             ix->files[b->i < a->i ? b->i : a->i].path, ix->files[b->i < a->i ? a->i : b->i].path);
        }
        if (rc == 0 && covered != numel[u])
            rc = err_set(err, "%s: unit %d: the pieces hold %lld of its %lld parameters (a rank's "
                         "file is missing from the index?)", label, u, (long long)covered,
                         (long long)numel[u]);
    }
    free(ref);
    return rc;
}

/* files[i]: {"file": NAME, "offsets": [...], "sizes": [...]}, NAME in the step directory. */
static int read_file_entry(const json_ctx *c, const cJSON *e, int i, const char *dir, int n_units, ckpt_index *ix) {
    const cJSON *name;
    const char *fname;
    char at[32], full[PATH_MAX]; /* at: "files[" and an int */
    snprintf(at, sizeof at, "files[%d]", i);
    if (json_expect_object(c, e, at) < 0 || json_require(c, e, at, "file", &name) < 0 ||
        json_string(c, name, at, &fname) < 0)
        return -1;
    if (strchr(fname, '/'))
        return err_set(c->err, "%s: %s.file '%s' must be a file name in the same directory", c->file, at, fname);
    /* the name is the index's: a cut one would name another file */
    if (str_fmt(full, sizeof full, c->err, "checkpoint path", "%s/%s", dir, fname) < 0)
        return err_prefix(c->err, "%s: %s.file", c->file, at);
    ckpt_slices *f = add_file(ix, full, n_units);
    return ckpt_ranges_read(c, e, at, n_units, f->off, f->n);
}

static int read_index(const json_ctx *c, const cJSON *root, const char *dir, int n_units, ckpt_index *ix) {
    const cJSON *fmt = json_get(root, "format"), *step, *files, *e;
    int n = 0, i = 0;
    long v;
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, CKPT_INDEX_FORMAT))
        return err_set(c->err, "%s: format is not \"%s\"", c->file, CKPT_INDEX_FORMAT);
    if (json_require(c, root, "", "step", &step) < 0 || json_int(c, step, "step", 0, 1L << 50, &v) < 0 ||
        json_require(c, root, "", "files", &files) < 0 || json_expect_array(c, files, "files", &n) < 0)
        return -1;
    ix->step = v;
    cJSON_ArrayForEach(e, files) /* one pass, as in ckpt_ranges_read */
        if (read_file_entry(c, e, i++, dir, n_units, ix) < 0) return -1;
    return 0;
}

int ckpt_index_parse(const char *name, const char *text, size_t len, const char *dir, const char *label,
                     const int64_t *numel, int n_units, ckpt_index *ix, err_t *err) {
    *ix = (ckpt_index){0};
    cJSON *root = json_parse(name, text, len, err);
    if (!root) return -1;
    json_ctx c = {name, err};
    int rc = read_index(&c, root, dir, n_units, ix);
    if (rc == 0) rc = check_tiling(ix, label, numel, n_units, err);
    cJSON_Delete(root);
    if (rc < 0) ckpt_index_free(ix);
    return rc;
}
