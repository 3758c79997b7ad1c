/* profile_store.c - profile files out (JSON), merging, and the store (see profile_store.h). */
#include "planner/profile_store.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/fileio.h"
#include "common/env.h"
#include "common/log.h"
#include "common/str_map.h"
#include "common/strutil.h"

/* ---- JSON out ---- */

static cJSON *numbers(const double *v, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
    return a;
}

static void add_curve(cJSON *o, const char *key, const profile_curve *c, int n) {
    if (!c->present) return;
    cJSON *cv = cJSON_AddObjectToObject(o, key);
    cJSON_AddItemToObject(cv, "fwd_ms", numbers(c->fwd_ms, n));
    cJSON_AddItemToObject(cv, "bwd_ms", numbers(c->bwd_ms, n));
    if (c->bwd_keep_ms) cJSON_AddItemToObject(cv, "bwd_keep_ms", numbers(c->bwd_keep_ms, n));
}

char *profile_to_json(const profile *p) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "format", PROFILE_FORMAT);
    cJSON_AddNumberToObject(root, "version", PROFILE_VERSION);
    cJSON *entries = cJSON_AddArrayToObject(root, "entries");
    for (int i = 0; i < p->n_entries; i++) {
        const profile_entry *e = &p->entries[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "device", e->device);
        cJSON_AddStringToObject(o, "model", e->model);
        cJSON_AddNumberToObject(o, "seq", e->seq);
        cJSON_AddStringToObject(o, "precision", precision_name(e->prec));
        cJSON *mb = cJSON_AddArrayToObject(o, "microbatch");
        for (int k = 0; k < e->n_points; k++) cJSON_AddItemToArray(mb, cJSON_CreateNumber(e->microbatch[k]));
        add_curve(o, "block", &e->block, e->n_points);
        add_curve(o, "embedding", &e->embedding, e->n_points);
        add_curve(o, "head", &e->head, e->n_points);
        if (e->compute_bytes) cJSON_AddItemToObject(o, "compute_bytes", numbers(e->compute_bytes, e->n_points));
        if (e->optimizer_ms_per_mparam > 0)
            cJSON_AddNumberToObject(o, "optimizer_ms_per_mparam", e->optimizer_ms_per_mparam);
        if (e->step_scale > 0) cJSON_AddNumberToObject(o, "step_scale", e->step_scale);
        if (e->step_scale > 0) cJSON_AddNumberToObject(o, "step_overhead_ms", e->step_overhead_ms);
        cJSON_AddItemToArray(entries, o);
    }
    if (p->n_comm) {
        cJSON *comm = cJSON_AddArrayToObject(root, "comm");
        for (int i = 0; i < p->n_comm; i++) {
            const profile_comm *c = &p->comm[i];
            cJSON *o = cJSON_CreateObject();
            cJSON_AddNumberToObject(o, "world", c->world);
            cJSON_AddStringToObject(o, "op", c->reduce_scatter ? "reduce_scatter" : "allgather");
            cJSON_AddItemToObject(o, "bytes", numbers(c->bytes, c->n_points));
            cJSON_AddItemToObject(o, "ms", numbers(c->ms, c->n_points));
            if (c->uneven_ms) cJSON_AddItemToObject(o, "uneven_ms", numbers(c->uneven_ms, c->n_points));
            if (c->cpu_ms) cJSON_AddItemToObject(o, "cpu_ms", numbers(c->cpu_ms, c->n_points));
            if (c->host_cores > 0) cJSON_AddNumberToObject(o, "host_cores", c->host_cores);
            if (c->train_overhead_ms > 0) cJSON_AddNumberToObject(o, "train_overhead_ms", c->train_overhead_ms);
            cJSON_AddItemToArray(comm, o);
        }
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    CHECK(text != NULL);
    size_t len = strlen(text);
    text = xrealloc(text, len + 2);
    text[len] = '\n', text[len + 1] = '\0';
    return text;
}

int profile_save(const profile *p, const char *path, err_t *err) {
    char *dir = xstrdup(path), *slash = strrchr(dir, '/');
    int rc = 0;
    if (slash && slash != dir) {
        *slash = '\0';
        rc = file_make_dir(dir, true, err);
    }
    free(dir);
    if (rc < 0) return err_prefix(err, "%s", path);
    char *text = profile_to_json(p);
    rc = file_write_atomic(path, text, strlen(text), 0, err);
    free(text);
    return rc;
}

/* ---- merging ---- */

static double *dup_doubles(const double *v, int n) {
    return v ? memcpy(xmalloc((size_t)n * sizeof *v), v, (size_t)n * sizeof *v) : NULL;
}

static profile_curve dup_curve(const profile_curve *c, int n) {
    return (profile_curve){c->present, dup_doubles(c->fwd_ms, n), dup_doubles(c->bwd_ms, n),
                           dup_doubles(c->bwd_keep_ms, n)};
}

static void free_entry(profile_entry *e) {
    free(e->microbatch);
    free(e->block.fwd_ms), free(e->block.bwd_ms), free(e->block.bwd_keep_ms);
    free(e->embedding.fwd_ms), free(e->embedding.bwd_ms), free(e->embedding.bwd_keep_ms);
    free(e->head.fwd_ms), free(e->head.bwd_ms), free(e->head.bwd_keep_ms);
    free(e->compute_bytes);
}

static profile_entry dup_entry(const profile_entry *s) {
    profile_entry e = *s;
    int n = s->n_points;
    e.microbatch = memcpy(xmalloc((size_t)n * sizeof(int)), s->microbatch, (size_t)n * sizeof(int));
    e.block = dup_curve(&s->block, n);
    e.embedding = dup_curve(&s->embedding, n);
    e.head = dup_curve(&s->head, n);
    e.compute_bytes = dup_doubles(s->compute_bytes, n);
    return e;
}

/* A model name as compared (case aside) into out[64]. */
static void model_key(const char *model, char *out) {
    size_t i = 0;
    for (; model[i] && i < 63; i++) out[i] = (char)tolower((unsigned char)model[i]);
    out[i] = '\0';
}

/* What makes two entries one (the normalized device, the model case aside, seq, precision), as a
 * string for a str_map. */
static void entry_key(const profile_entry *e, char *out, size_t n) {
    char dev[64], model[64];
    str_normalize(e->device, dev, sizeof dev);
    model_key(e->model, model);
    snprintf(out, n, "%s\x1f%s\x1f%d\x1f%d", dev, model, e->seq, (int)e->prec); /* fits: 2 x 64 and 2 ints */
}

int profile_merge(profile *dst, const profile *src) {
    int replaced = 0;
    str_map at = {0}; /* dst's entries by entry_key: a store of many is not searched per entry */
    char key[192];
    for (int k = 0; k < dst->n_entries; k++) entry_key(&dst->entries[k], key, sizeof key), str_map_put(&at, key, k);
    /* room for every new entry at once, not one realloc per entry */
    dst->entries = xrealloc(dst->entries, (size_t)(dst->n_entries + src->n_entries + 1) * sizeof *dst->entries);
    for (int i = 0; i < src->n_entries; i++) {
        profile_entry e = dup_entry(&src->entries[i]);
        entry_key(&e, key, sizeof key);
        long k = str_map_put(&at, key, dst->n_entries);
        if (k >= 0) {
            free_entry(&dst->entries[k]);
            replaced++;
        } else {
            k = dst->n_entries++;
        }
        dst->entries[k] = e;
    }
    str_map_free(&at);
    for (int i = 0; i < src->n_comm; i++) {
        const profile_comm *s = &src->comm[i];
        profile_comm c = {s->world, s->reduce_scatter, s->n_points, dup_doubles(s->bytes, s->n_points),
                          dup_doubles(s->ms, s->n_points), dup_doubles(s->uneven_ms, s->n_points),
                          dup_doubles(s->cpu_ms, s->n_points), s->host_cores, s->train_overhead_ms};
        int k = 0;
        while (k < dst->n_comm && !(dst->comm[k].world == c.world && dst->comm[k].reduce_scatter == c.reduce_scatter)) k++;
        if (k < dst->n_comm) {
            free(dst->comm[k].bytes), free(dst->comm[k].ms), free(dst->comm[k].uneven_ms), free(dst->comm[k].cpu_ms);
            replaced++;
        } else {
            dst->comm = xrealloc(dst->comm, (size_t)(dst->n_comm + 1) * sizeof *dst->comm);
            dst->n_comm++;
        }
        dst->comm[k] = c;
    }
    return replaced;
}

/* ---- the store ---- */

int profile_store_path(char *buf, size_t n, err_t *err) {
    const char *env;
    int given = env_text("CEPHALO_PROFILE_STORE", &env, err);
    if (given < 0) return -1;
    if (given == ENV_OFF) return 0;
    if (given == ENV_GIVEN) return str_fmt(buf, n, err, "$CEPHALO_PROFILE_STORE", "%s", env) < 0 ? -1 : 1;
    const char *home = getenv("HOME");
    if (!home || !*home) return 0;
    return str_fmt(buf, n, err, "the profile store ($HOME/.cache/cephalo/profiles.json)", "%s/.cache/cephalo/profiles.json", home) < 0
               ? -1 : 1;
}

bool profile_has_model(const profile *p, const char *model) {
    for (int i = 0; i < p->n_entries; i++)
        if (!strcasecmp(p->entries[i].model, model)) return true;
    return false;
}

void profile_models(const profile *p, char *buf, size_t n) {
    size_t used = 0;
    buf[0] = '\0';
    str_map seen = {0}; /* the models named, case aside: a map, not a scan of the entries before */
    for (int i = 0; i < p->n_entries; i++) {
        char key[64];
        model_key(p->entries[i].model, key);
        if (str_map_put(&seen, key, i) >= 0) continue;
        int w = snprintf(buf + used, n - used, "%s%s", used ? ", " : "", p->entries[i].model);
        if (w < 0 || (size_t)w >= n - used) break;
        used += (size_t)w;
    }
    str_map_free(&seen);
    if (!used) snprintf(buf, n, "none");
}
