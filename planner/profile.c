#include "planner/profile.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/json_util.h"
#include "common/log.h"
#include "common/strutil.h"
#include "planner/gpu.h"

/* Caps that keep a hostile file from making us allocate without bound; real profiles hold a few
 * hundred entries (device types x models x sequence lengths x precisions). */
#define PROFILE_MAX_ENTRIES 65536
#define PROFILE_MAX_COMM 4096
#define PROFILE_MAX_SEQ 1048576
#define PROFILE_MAX_MICROBATCH 1048576
#define PROFILE_MAX_WORLD 65536
/* A per-layer time of 1e9 ms (11 days) can only be a unit mistake. */
#define PROFILE_MAX_MS 1e9

static const char *const TOP_KEYS[] = {"format", "version", "entries", "comm", NULL};
static const char *const ENTRY_KEYS[] = {"device",        "model", "seq",       "precision",
                                         "microbatch",    "block", "embedding", "head",
                                         "compute_bytes", "optimizer_ms_per_mparam", "step_scale", "step_overhead_ms", NULL};
static const char *const CURVE_KEYS[] = {"fwd_ms", "bwd_ms", "bwd_keep_ms", NULL};
static const char *const COMM_KEYS[] = {"world", "op", "bytes", "ms", "uneven_ms", "cpu_ms", "host_cores",
                                        "train_overhead_ms", NULL};
static const char *const PRECISIONS[] = {"fp32", "bf16", "fp16", NULL}; /* precision order */
static const char *const OPS[] = {"allgather", "reduce_scatter", NULL}; /* index 1 = RS */

/* Paths in messages are built as we descend: "entries[2]" -> "entries[2].block.fwd_ms[3]". */
#define PATH_MAX_LEN 192

/* The longest real path ("entries[65535].embedding.fwd_ms[4095]") fits easily; the truncation
 * test is there because the compiler cannot know that, and a cut path would only shorten a
 * message. */
static void path_key(char *out, const char *path, const char *key) {
    if (snprintf(out, PATH_MAX_LEN, "%s%s%s", path, path[0] ? "." : "", key) >= PATH_MAX_LEN)
        out[PATH_MAX_LEN - 1] = '\0';
}

static void path_index(char *out, const char *path, int i) {
    if (snprintf(out, PATH_MAX_LEN, "%s[%d]", path, i) >= PATH_MAX_LEN)
        out[PATH_MAX_LEN - 1] = '\0';
}

/* ---- arrays ------------------------------------------------------------------------------ */

/* The array at `path` must have as many values as the reference field; the message names both
 * because either one may be the wrong one. */
static int check_length(const json_ctx *c, const char *path, int n, const char *ref_path,
                        int ref_n) {
    if (n == ref_n) return 0;
    return err_set(c->err, "%s: %s has %d value%s but %s has %d; they must have the same length",
                   c->file, path, n, n == 1 ? "" : "s", ref_path, ref_n);
}

/* Reads an array of numbers within (lo, hi) or [lo, hi] into a fresh double[n]. With ref_path
 * set, its length must equal n; without, it must hold 1..PROFILE_MAX_POINTS values and n gets
 * its length. */
static int read_numbers(const json_ctx *c, const cJSON *arr, const char *path, double lo, double hi,
                        json_bounds bounds, const char *ref_path, int *n, double **out) {
    int len;
    if (json_expect_array(c, arr, path, &len) < 0) return -1;
    if (ref_path) {
        if (check_length(c, path, len, ref_path, *n) < 0) return -1;
    } else {
        if (len < 1 || len > PROFILE_MAX_POINTS)
            return err_set(c->err, "%s: %s: expected 1 to %d values, got %d", c->file, path,
                           PROFILE_MAX_POINTS, len);
        *n = len;
    }
    double *v = xcalloc((size_t)len, sizeof *v);
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        char p[PATH_MAX_LEN];
        path_index(p, path, i);
        if (json_number(c, it, p, lo, hi, bounds, &v[i]) < 0) {
            free(v);
            return -1;
        }
        i++;
    }
    *out = v;
    return 0;
}

/* Sizes and microbatches are the x axis of interpolation, which needs them strictly
 * increasing. */
static int check_increasing(const json_ctx *c, const char *path, const double *x, int n) {
    for (int i = 1; i < n; i++) {
        if (x[i] > x[i - 1]) continue;
        return err_set(c->err,
                       "%s: %s[%d]: %.15g is not greater than the value before it (%.15g); "
                       "the values must be strictly increasing",
                       c->file, path, i, x[i], x[i - 1]);
    }
    return 0;
}

/* ---- one entry --------------------------------------------------------------------------- */

/* A required string member copied into dst (which holds dstsz - 1 characters). */
static int read_name(const json_ctx *c, const cJSON *obj, const char *path, const char *key,
                     char *dst, size_t dstsz) {
    char p[PATH_MAX_LEN];
    path_key(p, path, key);
    const cJSON *v;
    const char *s;
    if (json_require(c, obj, path, key, &v) < 0 || json_string(c, v, p, &s) < 0) return -1;
    if (strlen(s) >= dstsz)
        return err_set(c->err, "%s: %s: the name is longer than %zu characters", c->file, p,
                       dstsz - 1);
    snprintf(dst, dstsz, "%s", s);
    return 0;
}

static int read_microbatch(const json_ctx *c, const cJSON *obj, const char *path,
                           profile_entry *e) {
    char p[PATH_MAX_LEN];
    path_key(p, path, "microbatch");
    const cJSON *arr;
    int n;
    if (json_require(c, obj, path, "microbatch", &arr) < 0 || json_expect_array(c, arr, p, &n) < 0)
        return -1;
    if (n < 1 || n > PROFILE_MAX_POINTS)
        return err_set(c->err, "%s: %s: expected 1 to %d microbatch sizes, got %d", c->file, p,
                       PROFILE_MAX_POINTS, n);
    e->microbatch = xcalloc((size_t)n, sizeof *e->microbatch);
    e->n_points = n;
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        char pi[PATH_MAX_LEN];
        path_index(pi, p, i);
        long m;
        if (json_int(c, it, pi, 1, PROFILE_MAX_MICROBATCH, &m) < 0) return -1;
        if (i > 0 && m <= e->microbatch[i - 1])
            return err_set(c->err,
                           "%s: %s: %ld is not greater than the value before it (%d); "
                           "microbatch sizes must be strictly increasing",
                           c->file, pi, m, e->microbatch[i - 1]);
        e->microbatch[i++] = (int)m;
    }
    return 0;
}

/* block, embedding or head: {"fwd_ms": [...], "bwd_ms": [...]}, one time per microbatch size. */
static int read_curve(const json_ctx *c, const cJSON *obj, const char *path, const char *key,
                      bool required, const profile_entry *e, profile_curve *curve) {
    char p[PATH_MAX_LEN], mb[PATH_MAX_LEN], pf[PATH_MAX_LEN], pb[PATH_MAX_LEN];
    const cJSON *cv = json_get(obj, key);
    if (!cv) return required ? json_require(c, obj, path, key, &cv) : 0;
    path_key(p, path, key);
    path_key(mb, path, "microbatch");
    path_key(pf, p, "fwd_ms");
    path_key(pb, p, "bwd_ms");
    const cJSON *fwd, *bwd;
    int n = e->n_points;
    if (json_check_keys(c, cv, p, CURVE_KEYS) < 0 || json_require(c, cv, p, "fwd_ms", &fwd) < 0 ||
        json_require(c, cv, p, "bwd_ms", &bwd) < 0)
        return -1;
    curve->present = true;
    if (read_numbers(c, fwd, pf, 0, PROFILE_MAX_MS, JSON_OPEN, mb, &n, &curve->fwd_ms) < 0 ||
        read_numbers(c, bwd, pb, 0, PROFILE_MAX_MS, JSON_OPEN, mb, &n, &curve->bwd_ms) < 0)
        return -1;
    const cJSON *keep = json_get(cv, "bwd_keep_ms");
    if (!keep) return 0;
    path_key(pb, p, "bwd_keep_ms");
    return read_numbers(c, keep, pb, 0, PROFILE_MAX_MS, JSON_OPEN, mb, &n, &curve->bwd_keep_ms);
}

static int read_entry(const json_ctx *c, const cJSON *obj, const char *path, profile_entry *e) {
    if (json_check_keys(c, obj, path, ENTRY_KEYS) < 0) return -1;
    if (read_name(c, obj, path, "device", e->device, sizeof e->device) < 0 ||
        read_name(c, obj, path, "model", e->model, sizeof e->model) < 0)
        return -1;
    char norm[sizeof e->device];
    str_normalize(e->device, norm, sizeof norm);
    if (!norm[0])
        return err_set(c->err, "%s: %s.device: '%s' is not a device type name", c->file, path,
                       e->device);

    char p[PATH_MAX_LEN];
    const cJSON *v;
    long seq;
    int prec;
    path_key(p, path, "seq");
    if (json_require(c, obj, path, "seq", &v) < 0 ||
        json_int(c, v, p, 1, PROFILE_MAX_SEQ, &seq) < 0)
        return -1;
    e->seq = (int)seq;
    path_key(p, path, "precision");
    if (json_require(c, obj, path, "precision", &v) < 0 ||
        json_enum(c, v, p, PRECISIONS, &prec) < 0)
        return -1;
    e->prec = (precision)prec;

    if (read_microbatch(c, obj, path, e) < 0 ||
        read_curve(c, obj, path, "block", true, e, &e->block) < 0 ||
        read_curve(c, obj, path, "embedding", false, e, &e->embedding) < 0 ||
        read_curve(c, obj, path, "head", false, e, &e->head) < 0)
        return -1;

    if ((v = json_get(obj, "optimizer_ms_per_mparam"))) {
        path_key(p, path, "optimizer_ms_per_mparam");
        if (json_number(c, v, p, 0, PROFILE_MAX_MS, JSON_CLOSED, &e->optimizer_ms_per_mparam) < 0) return -1;
    }
    if ((v = json_get(obj, "step_scale"))) {
        path_key(p, path, "step_scale");
        if (json_number(c, v, p, PROFILE_MIN_STEP_SCALE, PROFILE_MAX_STEP_SCALE, JSON_CLOSED, &e->step_scale) < 0)
            return -1;
    }
    if ((v = json_get(obj, "step_overhead_ms"))) {
        path_key(p, path, "step_overhead_ms");
        if (json_number(c, v, p, 0, PROFILE_MAX_MS, JSON_CLOSED, &e->step_overhead_ms) < 0) return -1;
    }
    v = json_get(obj, "compute_bytes");
    if (!v) return 0;
    char mb[PATH_MAX_LEN];
    int n = e->n_points;
    path_key(p, path, "compute_bytes");
    path_key(mb, path, "microbatch");
    return read_numbers(c, v, p, 0, INFINITY, JSON_CLOSED, mb, &n, &e->compute_bytes);
}

/* ---- one collective ---------------------------------------------------------------------- */

static int read_comm(const json_ctx *c, const cJSON *obj, const char *path, profile_comm *m) {
    if (json_check_keys(c, obj, path, COMM_KEYS) < 0) return -1;
    char p[PATH_MAX_LEN], pb[PATH_MAX_LEN];
    const cJSON *v;
    long world;
    int op;
    path_key(p, path, "world");
    if (json_require(c, obj, path, "world", &v) < 0 ||
        json_int(c, v, p, 1, PROFILE_MAX_WORLD, &world) < 0)
        return -1;
    m->world = (int)world;
    path_key(p, path, "op");
    if (json_require(c, obj, path, "op", &v) < 0 || json_enum(c, v, p, OPS, &op) < 0) return -1;
    m->reduce_scatter = op == 1;

    path_key(pb, path, "bytes");
    if (json_require(c, obj, path, "bytes", &v) < 0 ||
        read_numbers(c, v, pb, 0, INFINITY, JSON_CLOSED, NULL, &m->n_points, &m->bytes) < 0 ||
        check_increasing(c, pb, m->bytes, m->n_points) < 0)
        return -1;
    int n = m->n_points;
    path_key(p, path, "ms");
    if (json_require(c, obj, path, "ms", &v) < 0 ||
        read_numbers(c, v, p, 0, INFINITY, JSON_CLOSED, pb, &n, &m->ms) < 0)
        return -1;
    if ((v = json_get(obj, "host_cores"))) {
        long cores;
        path_key(p, path, "host_cores");
        if (json_int(c, v, p, 1, 1 << 20, &cores) < 0) return -1;
        m->host_cores = (int)cores;
    }
    if ((v = json_get(obj, "train_overhead_ms"))) {
        path_key(p, path, "train_overhead_ms");
        if (json_number(c, v, p, 0, PROFILE_MAX_MS, JSON_CLOSED, &m->train_overhead_ms) < 0) return -1;
    }
    if ((v = json_get(obj, "cpu_ms"))) {
        path_key(p, path, "cpu_ms");
        if (read_numbers(c, v, p, 0, INFINITY, JSON_CLOSED, pb, &n, &m->cpu_ms) < 0) return -1;
    }
    v = json_get(obj, "uneven_ms");
    if (!v) return 0;
    path_key(p, path, "uneven_ms");
    return read_numbers(c, v, p, 0, INFINITY, JSON_CLOSED, pb, &n, &m->uneven_ms);
}

/* ---- duplicates -------------------------------------------------------------------------- */

/* Two entries for the same key would make profile_find() silently pick one; we refuse them.
 * Sorting by key (then position) finds them in O(n log n), which matters for large inputs. */
typedef struct entry_key {
    char device[32]; /* normalized */
    const profile_entry *e;
    int index;
} entry_key;

static int key_cmp(const entry_key *a, const entry_key *b) {
    int d = strcmp(a->device, b->device);
    if (!d) d = strcasecmp(a->e->model, b->e->model);
    if (!d) d = (a->e->seq > b->e->seq) - (a->e->seq < b->e->seq);
    if (!d) d = (int)a->e->prec - (int)b->e->prec;
    return d;
}

static int key_sort_cmp(const void *pa, const void *pb) {
    const entry_key *a = pa, *b = pb;
    int d = key_cmp(a, b);
    return d ? d : (a->index > b->index) - (a->index < b->index);
}

static int check_duplicate_entries(const json_ctx *c, const profile *p) {
    if (p->n_entries < 2) return 0;
    entry_key *keys = xcalloc((size_t)p->n_entries, sizeof *keys);
    for (int i = 0; i < p->n_entries; i++) {
        str_normalize(p->entries[i].device, keys[i].device, sizeof keys[i].device);
        keys[i].e = &p->entries[i];
        keys[i].index = i;
    }
    qsort(keys, (size_t)p->n_entries, sizeof *keys, key_sort_cmp);
    /* Report the earliest repeat in file order, which is what a reader scanning the file finds. */
    int first = -1, second = INT_MAX;
    for (int i = 1; i < p->n_entries; i++) {
        if (key_cmp(&keys[i - 1], &keys[i]) == 0 && keys[i].index < second) {
            first = keys[i - 1].index;
            second = keys[i].index;
        }
    }
    free(keys);
    if (first < 0) return 0;
    const profile_entry *e = &p->entries[second];
    return err_set(c->err,
                   "%s: entries[%d]: duplicate of entries[%d] (same device, model, seq and "
                   "precision: %s, %s, %d, %s)",
                   c->file, second, first, e->device, e->model, e->seq, precision_name(e->prec));
}

/* Collectives are few (PROFILE_MAX_COMM), so the plain pairwise check is fine. */
static int check_duplicate_comm(const json_ctx *c, const profile *p) {
    for (int i = 1; i < p->n_comm; i++) {
        for (int j = 0; j < i; j++) {
            const profile_comm *a = &p->comm[j], *b = &p->comm[i];
            if (a->world != b->world || a->reduce_scatter != b->reduce_scatter) continue;
            return err_set(c->err, "%s: comm[%d]: duplicate of comm[%d] (same world %d and op %s)",
                           c->file, i, j, b->world, OPS[b->reduce_scatter]);
        }
    }
    return 0;
}

/* ---- the document ------------------------------------------------------------------------ */

static int read_header(const json_ctx *c, const cJSON *root) {
    const cJSON *v;
    const char *format;
    long version;
    if (json_expect_object(c, root, "") < 0 || json_require(c, root, "", "format", &v) < 0 ||
        json_string(c, v, "format", &format) < 0)
        return -1;
    if (strcmp(format, PROFILE_FORMAT) != 0)
        return err_set(c->err, "%s: format: expected \"%s\", got \"%.64s\" (not a profile file?)",
                       c->file, PROFILE_FORMAT, format);
    if (json_require(c, root, "", "version", &v) < 0 ||
        json_int(c, v, "version", LONG_MIN, LONG_MAX, &version) < 0)
        return -1;
    if (version < PROFILE_VERSION_MIN || version > PROFILE_VERSION)
        return err_set(c->err,
                       "%s: version %ld is not supported (this build reads versions %d to %d); "
                       "re-run `cephalo profile`",
                       c->file, version, PROFILE_VERSION_MIN, PROFILE_VERSION);
    return json_check_keys(c, root, "", TOP_KEYS);
}

static int read_entries(const json_ctx *c, const cJSON *root, profile *p) {
    const cJSON *arr, *it;
    int n;
    if (json_require(c, root, "", "entries", &arr) < 0 ||
        json_expect_array(c, arr, "entries", &n) < 0)
        return -1;
    if (n > PROFILE_MAX_ENTRIES)
        return err_set(c->err, "%s: entries: %d entries, at most %d are supported", c->file, n,
                       PROFILE_MAX_ENTRIES);
    /* Allocated zeroed up front so that profile_free() can clean up a half-read profile. */
    p->entries = n ? xcalloc((size_t)n, sizeof *p->entries) : NULL;
    p->n_entries = n;
    int i = 0;
    cJSON_ArrayForEach(it, arr) {
        char path[PATH_MAX_LEN];
        path_index(path, "entries", i);
        if (read_entry(c, it, path, &p->entries[i++]) < 0) return -1;
    }
    return check_duplicate_entries(c, p);
}

static int read_comms(const json_ctx *c, const cJSON *root, profile *p) {
    const cJSON *arr = json_get(root, "comm"), *it;
    int n;
    if (!arr) return 0;
    if (json_expect_array(c, arr, "comm", &n) < 0) return -1;
    if (n > PROFILE_MAX_COMM)
        return err_set(c->err, "%s: comm: %d entries, at most %d are supported", c->file, n,
                       PROFILE_MAX_COMM);
    p->comm = n ? xcalloc((size_t)n, sizeof *p->comm) : NULL;
    p->n_comm = n;
    int i = 0;
    cJSON_ArrayForEach(it, arr) {
        char path[PATH_MAX_LEN];
        path_index(path, "comm", i);
        if (read_comm(c, it, path, &p->comm[i++]) < 0) return -1;
    }
    return check_duplicate_comm(c, p);
}

/* Takes ownership of `root`; on failure `out` is freed and zeroed. */
static int load_tree(const char *name, cJSON *root, profile *out, err_t *err) {
    if (!root) return -1;
    json_ctx c = {name, err};
    int rc = read_header(&c, root);
    if (rc == 0) rc = read_entries(&c, root, out);
    if (rc == 0) rc = read_comms(&c, root, out);
    cJSON_Delete(root);
    if (rc < 0) profile_free(out);
    return rc;
}

int profile_load_string(const char *name, const char *text, size_t len, profile *out, err_t *err) {
    memset(out, 0, sizeof *out);
    return load_tree(name, json_parse(name, text, len, err), out, err);
}

int profile_load_file(const char *path, profile *out, err_t *err) {
    memset(out, 0, sizeof *out);
    return load_tree(path, json_load_file(path, err), out, err);
}

static void curve_free(profile_curve *c) {
    free(c->fwd_ms);
    free(c->bwd_ms);
    free(c->bwd_keep_ms);
}

void profile_free(profile *p) {
    if (!p) return;
    for (int i = 0; i < p->n_entries; i++) {
        profile_entry *e = &p->entries[i];
        free(e->microbatch);
        curve_free(&e->block);
        curve_free(&e->embedding);
        curve_free(&e->head);
        free(e->compute_bytes);
    }
    for (int i = 0; i < p->n_comm; i++) {
        free(p->comm[i].bytes);
        free(p->comm[i].ms);
        free(p->comm[i].uneven_ms);
        free(p->comm[i].cpu_ms);
    }
    free(p->entries);
    free(p->comm);
    memset(p, 0, sizeof *p);
}

/* ---- lookups ----------------------------------------------------------------------------- */

const profile_entry *profile_find(const profile *p, const char *device, const char *model, int seq,
                                  precision prec) {
    if (!p || !device || !model) return NULL;
    char want[64], have[sizeof p->entries[0].device];
    str_normalize(device, want, sizeof want);
    err_t ignored;
    const gpu_spec *want_gpu = gpu_find(device, &ignored);
    for (int i = 0; i < p->n_entries; i++) {
        const profile_entry *e = &p->entries[i];
        if (e->seq != seq || e->prec != prec || strcasecmp(e->model, model) != 0) continue;
        str_normalize(e->device, have, sizeof have);
        if (strcmp(have, want) == 0) return e;
        /* aliases name the same catalog GPU: "Tesla-T4" in a profile serves a "T4" device */
        if (want_gpu && gpu_find(e->device, &ignored) == want_gpu) return e;
    }
    return NULL;
}

const profile_comm *profile_find_comm(const profile *p, int world, bool reduce_scatter) {
    if (!p) return NULL;
    for (int i = 0; i < p->n_comm; i++)
        if (p->comm[i].world == world && p->comm[i].reduce_scatter == reduce_scatter)
            return &p->comm[i];
    return NULL;
}
