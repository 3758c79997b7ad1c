/* ckpt_set.c - a checkpoint as a set of pieces (docs/checkpoints.md): one file holding whole
 * units (one rank, or a replicated job), or a sharded step directory whose index.json lists one
 * file per rank with the slice of every unit it holds. Any rank of any later plan reads its own
 * slices from whichever pieces overlap them, so a checkpoint resumes under another plan and
 * world size. Files are opened (mapped and verified) only when a slice is needed. The index is
 * parsed and checked by ckpt_index.c. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fileio.h"
#include "common/json_util.h"
#include "common/log.h"
#include "common/strutil.h"
#include "model/weights.h"
#include "state/ckpt.h"
#include "state/ckpt_index.h"
#include "state/ckpt_meta.h"

typedef struct piece {
    char *path;
    int64_t *off, *n; /* per unit */
    st_file *f;       /* opened on first use */
    bool names_checked; /* its tensors are all the model's (check_names), on the first read */
} piece;

struct ckpt_set {
    char *label; /* the path given */
    model_spec m;
    bool allow_unused;
    int n_units, n_pieces;
    int64_t step;
    int64_t *numel;
    piece *p;
};

static void set_units(ckpt_set *s, const model_spec *m) {
    s->m = *m;
    s->n_units = model_n_units(m);
    s->numel = xcalloc((size_t)s->n_units, sizeof(int64_t));
    for (int u = 0; u < s->n_units; u++) s->numel[u] = model_unit_params(m, u);
}

/* A new piece, zeroed. */
static piece *push_piece(ckpt_set *s) {
    if ((s->n_pieces & (s->n_pieces - 1)) == 0) /* at 0, 1, 2, 4, ...: doubled, not grown by one */
        s->p = xrealloc(s->p, (size_t)(s->n_pieces ? 2 * s->n_pieces : 1) * sizeof(piece));
    piece *p = &s->p[s->n_pieces++];
    *p = (piece){0};
    return p;
}

static piece *add_piece(ckpt_set *s, const char *path) {
    piece *p = push_piece(s);
    p->path = xstrdup(path);
    p->off = xcalloc((size_t)s->n_units, sizeof(int64_t));
    p->n = xcalloc((size_t)s->n_units, sizeof(int64_t));
    return p;
}

/* The index's files become the pieces, which take over their paths and slices. */
static void adopt_index(ckpt_set *s, ckpt_index *ix) {
    for (int i = 0; i < ix->n_files; i++) {
        piece *p = push_piece(s);
        p->path = ix->files[i].path, p->off = ix->files[i].off, p->n = ix->files[i].n;
    }
    free(ix->files);
    *ix = (ckpt_index){0};
}

static int open_index(ckpt_set *s, const char *dir, err_t *err) {
    char path[PATH_MAX];
    if (str_fmt(path, sizeof path, err, "checkpoint path", "%s/index.json", dir) < 0) return -1;
    if (file_state_exists(path, err) < 0) return -1;
    size_t len;
    char *text = file_read_all(path, JSON_MAX_FILE, &len, err);
    if (!text) return -1;
    ckpt_index ix;
    int rc = ckpt_index_parse(path, text, len, dir, s->label, s->numel, s->n_units, &ix, err);
    free(text);
    if (rc < 0) return -1;
    s->step = ix.step;
    adopt_index(s, &ix);
    return 0;
}

static int open_piece(ckpt_set *s, piece *p, err_t *err) {
    if (p->f) return 0;
    if (st_open(&p->f, p->path, err) < 0) return -1;
    const char *shard = st_meta(p->f, "cephalo.shard");
    if (!shard) { /* a whole-model file */
        for (int u = 0; u < s->n_units; u++)
            if (p->off[u] != 0 || p->n[u] != s->numel[u])
                return err_set(err, "%s: holds whole units, but the index gives it a slice of unit %d",
                               p->path, u);
        return 0;
    }
    cJSON *o = json_parse(p->path, shard, strlen(shard), err);
    if (!o) return -1;
    json_ctx c = {p->path, err};
    int64_t *off = xcalloc((size_t)s->n_units, sizeof(int64_t)), *n = xcalloc((size_t)s->n_units, sizeof(int64_t));
    int rc = ckpt_ranges_read(&c, o, "metadata cephalo.shard", s->n_units, off, n);
    for (int u = 0; rc == 0 && u < s->n_units; u++)
        if (off[u] != p->off[u] || n[u] != p->n[u])
            rc = err_set(err, "%s: unit %d: the file holds [%lld, +%lld) but the index says [%lld, +%lld)",
                         p->path, u, (long long)off[u], (long long)n[u], (long long)p->off[u],
                         (long long)p->n[u]);
    free(off), free(n);
    cJSON_Delete(o);
    return rc;
}

/* A sharded checkpoint of another model fails the index's checks (unit counts, slices beyond a
 * unit) before any file is read: when rank 0's file holds another model, that is the reason to
 * give. */
static void diagnose_model(const char *dir, const model_spec *m, bool *other_model, err_t *err) {
    char name[64], path[PATH_MAX];
    ckpt_shard_name(0, name, sizeof name);
    st_file *f;
    err_t why;
    if (str_fmt(path, sizeof path, NULL, "", "%s/%s", dir, name) < 0) return; /* only a better message */
    if (st_open(&f, path, &why) < 0) return;
    if (ckpt_check_model(f, m, &why) == RESUME_OTHER_MODEL) {
        *err = why;
        if (other_model) *other_model = true;
    }
    st_close(f);
}

static int open_step_dir(ckpt_set *s, const char *dir, const model_spec *m, bool *other_model, err_t *err) {
    int rc = open_index(s, dir, err);
    if (rc < 0) diagnose_model(dir, m, other_model, err);
    return rc;
}

ckpt_set *ckpt_set_open(const char *path, const model_spec *m, bool allow_unused, bool *other_model, err_t *err) {
    ckpt_set *s = xcalloc(1, sizeof *s);
    s->label = xstrdup(path);
    s->allow_unused = allow_unused;
    set_units(s, m);
    size_t len = strlen(path);
    int rc;
    if (file_is_dir(path)) {
        rc = open_step_dir(s, path, m, other_model, err);
    } else if (len > 11 && !strcmp(path + len - 11, "/index.json")) {
        char *dir = xstrdup(path);
        dir[len - 11] = 0;
        rc = open_step_dir(s, dir, m, other_model, err);
        free(dir);
    } else {
        piece *p = add_piece(s, path);
        for (int u = 0; u < s->n_units; u++) p->n[u] = s->numel[u];
        rc = st_open(&p->f, path, err);
        if (rc == 0 && st_meta(p->f, "cephalo.shard"))
            rc = err_set(err, "%s: is one rank's file of a sharded checkpoint; give its step "
                         "directory (or index.json) to resume", path);
        const char *v = rc == 0 ? st_meta(p->f, "cephalo.step") : NULL;
        s->step = v ? atoll(v) : 0;
    }
    if (rc < 0) {
        ckpt_set_close(s);
        return NULL;
    }
    return s;
}

const st_file *ckpt_set_first(ckpt_set *s, err_t *err) {
    if (s->n_pieces == 0) return err_set(err, "%s: the index lists no files", s->label), NULL;
    return open_piece(s, &s->p[0], err) < 0 ? NULL : s->p[0].f;
}

int64_t ckpt_set_step(const ckpt_set *s) { return s->step; }

/* Every tensor of the piece is a state of one of the model's units (model/weights.h): metadata
 * describing a smaller model than the file holds leaves nothing out silently. Checked on a
 * piece's first read, after the caller compared the model (another model is its own error). */
static int check_names(ckpt_set *s, piece *p, err_t *err) {
    if (p->names_checked) return 0;
    weights_used used = {0};
    for (size_t k = 0; k < sizeof CKPT_KINDS / sizeof CKPT_KINDS[0]; k++)
        for (int u = 0; u < s->n_units; u++) {
            char unit[48], name[96];
            model_unit_name(&s->m, u, unit, sizeof unit);
            snprintf(name, sizeof name, "%s.%s", CKPT_KINDS[k], unit);
            weights_use(&used, name);
        }
    int n = st_count(p->f);
    const char **found = xcalloc((size_t)n + 1, sizeof *found);
    for (int i = 0; i < n; i++) found[i] = st_tensor_at(p->f, i)->name;
    char model[160];
    snprintf(model, sizeof model, "metadata cephalo.model describes %s with %d layer%s", s->m.name, s->m.n_layer,
             s->m.n_layer == 1 ? "" : "s");
    int rc = weights_check_unused(&used, p->path, found, n, s->allow_unused, model, err);
    free(found);
    weights_used_free(&used);
    p->names_checked = rc == 0;
    return rc;
}

/* A value of unit `unit`'s tensor `name` at flat index i is not finite: named with the model's
 * tensor it falls in. */
static int nonfinite(const ckpt_set *s, const piece *p, const char *name, int unit, int64_t i, float v, err_t *err) {
    wm_tensor ts[WM_MAX_TENSORS];
    int n = wm_unit_tensors(&s->m, unit, ts);
    for (int k = 0; k < n; k++)
        if (i >= ts[k].offset && i < ts[k].offset + ts[k].numel)
            return weights_nonfinite(err, p->path, name, ts[k].name, ts[k].shape, ts[k].ndim, i - ts[k].offset, v);
    return weights_nonfinite(err, p->path, name, NULL, &s->numel[unit], 1, i, v);
}

int ckpt_set_read(ckpt_set *s, const char *kind, int unit, const char *unit_name, int64_t lo,
                  int64_t n, float *out, err_t *err) {
    char name[96];
    snprintf(name, sizeof name, "%s.%s", kind, unit_name);
    for (int i = 0; i < s->n_pieces; i++) {
        piece *p = &s->p[i];
        int64_t a = lo > p->off[unit] ? lo : p->off[unit];
        int64_t b = lo + n < p->off[unit] + p->n[unit] ? lo + n : p->off[unit] + p->n[unit];
        if (a >= b) continue;
        const void *data;
        if (open_piece(s, p, err) < 0 || check_names(s, p, err) < 0 ||
            st_expect(p->f, name, ST_F32, 1, &p->n[unit], &data, err) < 0)
            return -1;
        const char *v = st_meta(p->f, "cephalo.step");
        if (!v || atoll(v) != s->step)
            return err_set(err, "%s: metadata cephalo.step is %s, expected %lld (a piece of another "
                           "checkpoint?)", p->path, v ? v : "missing", (long long)s->step);
        float *dst = out + (a - lo);
        memcpy(dst, (const float *)data + (a - p->off[unit]), (size_t)(b - a) * sizeof(float));
        int64_t bad = weights_first_nonfinite(dst, b - a);
        if (bad >= 0) return nonfinite(s, p, name, unit, a + bad, dst[bad], err);
    }
    return 0; /* the tiling check guarantees [lo, lo+n) was covered */
}

void ckpt_set_close(ckpt_set *s) {
    if (!s) return;
    for (int i = 0; i < s->n_pieces; i++) {
        st_close(s->p[i].f);
        free(s->p[i].path), free(s->p[i].off), free(s->p[i].n);
    }
    free(s->p), free(s->numel), free(s->label);
    free(s);
}

int ckpt_write_index(const char *dir, const trainer *t, err_t *err) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "format", CKPT_INDEX_FORMAT);
    cJSON_AddNumberToObject(o, "version", 1);
    cJSON_AddNumberToObject(o, "step", (double)t->step);
    cJSON_AddNumberToObject(o, "world", t->cfg.world);
    cJSON_AddStringToObject(o, "model", t->cfg.model.name);
    cJSON *files = cJSON_AddArrayToObject(o, "files");
    int world = t->cfg.world;
    for (int r = 0; r < world; r++) {
        cJSON *e = cJSON_CreateObject();
        char name[64];
        ckpt_shard_name(r, name, sizeof name);
        cJSON_AddStringToObject(e, "file", name);
        cJSON *off = cJSON_AddArrayToObject(e, "offsets"), *n = cJSON_AddArrayToObject(e, "sizes");
        for (int u = 0; u < t->n_units; u++) {
            const int64_t *c = t->cfg.shard_sizes + (int64_t)u * world;
            int64_t start = 0;
            for (int q = 0; q < r; q++) start += c[q];
            cJSON_AddItemToArray(off, cJSON_CreateNumber((double)start));
            cJSON_AddItemToArray(n, cJSON_CreateNumber((double)c[r]));
        }
        cJSON_AddItemToArray(files, e);
    }
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    char path[PATH_MAX];
    if (str_fmt(path, sizeof path, err, "checkpoint path", "%s/index.json", dir) < 0) {
        free(text);
        return -1;
    }
    int rc = file_write_atomic(path, text, strlen(text), FILE_OUT_OWN, err);
    free(text);
    return rc;
}

void ckpt_shard_name(int rank, char *out, size_t n) {
    snprintf(out, n, "rank-%05d.safetensors", rank);
}
