/* plan_view.c - plan.json read into a plan_view (plan_view.h). Only what the operator uses is
 * read, but all of that is checked: the planner writes every field, so one missing is a plan
 * edited by hand, and the job is planned again (rec_plan.c) rather than run on zeros. */
#include "operator/plan_view.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json_util.h"
#include "common/log.h"
#include "common/recompute.h"

#define PV_MAX_RANKS (1 << 20)

/* "path.key" ("key" at the top) into at[96]: the field's name in messages. */
static const char *pv_at(char *at, const char *path, const char *key) {
    snprintf(at, 96, "%s%s%s", path, *path ? "." : "", key);
    return at;
}

/* obj.key (at path) as a number in [lo, hi]. */
static int pv_num(const json_ctx *c, const cJSON *obj, const char *path, const char *key, double lo, double hi,
                  double *out) {
    const cJSON *item;
    char at[96];
    pv_at(at, path, key);
    return json_require(c, obj, path, key, &item) < 0 ? -1 : json_number(c, item, at, lo, hi, JSON_CLOSED, out);
}

static int pv_int(const json_ctx *c, const cJSON *obj, const char *path, const char *key, long lo, long *out) {
    const cJSON *item;
    char at[96];
    pv_at(at, path, key);
    return json_require(c, obj, path, key, &item) < 0 ? -1 : json_int(c, item, at, lo, 1L << 40, out);
}

/* obj.key as a non-empty string, copied into *out. */
static int pv_str(const json_ctx *c, const cJSON *obj, const char *path, const char *key, char **out) {
    const cJSON *item;
    const char *s;
    char at[96];
    pv_at(at, path, key);
    if (json_require(c, obj, path, key, &item) < 0 || json_string(c, item, at, &s) < 0) return -1;
    *out = xstrdup(s);
    return 0;
}

/* ranks[i].recompute: absent in plans older than per-rank recompute (the worker's default then). */
static int pv_recompute(const json_ctx *c, const cJSON *o, const char *path, char **out) {
    const cJSON *item = json_get(o, "recompute");
    recompute_mode m;
    if (!item) return 0;
    if (pv_str(c, o, path, "recompute", out) < 0) return -1;
    if (!recompute_parse(*out, &m))
        return err_set(c->err, "%s: %s.recompute is \"%s\" (expected " RECOMPUTE_CHOICES ")", c->file, path, *out);
    return 0;
}

static int pv_rank(const json_ctx *c, const cJSON *o, int i, plan_view_rank *r) {
    char path[32], pred[48];
    const cJSON *p;
    snprintf(path, sizeof path, "ranks[%d]", i);
    snprintf(pred, sizeof pred, "%s.predicted", path);
    if (json_expect_object(c, o, path) < 0 || pv_str(c, o, path, "node", &r->node) < 0 ||
        pv_str(c, o, path, "device", &r->device) < 0 || pv_int(c, o, path, "batch", 0, &r->batch) < 0 ||
        pv_int(c, o, path, "microbatch", 1, &r->microbatch) < 0 ||
        pv_int(c, o, path, "microbatches", 0, &r->microbatches) < 0 || pv_recompute(c, o, path, &r->recompute) < 0 ||
        pv_num(c, o, path, "state_ratio", 0, 1e18, &r->state_ratio) < 0 ||
        json_require(c, o, path, "predicted", &p) < 0 || json_expect_object(c, p, pred) < 0 ||
        pv_num(c, p, pred, "peak_bytes", 0, 1e30, &r->peak_bytes) < 0)
        return -1;
    return 0;
}

/* format, feasible, inputs.strategy and predicted: what the plan is, before its ranks. */
static int pv_head(const json_ctx *c, const cJSON *root, plan_view *v) {
    const cJSON *fmt, *in, *pred, *feasible = json_get(root, "feasible");
    if (json_expect_object(c, root, "the plan") < 0 || json_require(c, root, "", "format", &fmt) < 0) return -1;
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "cephalo-plan") != 0)
        return err_set(c->err, "%s: format is not \"cephalo-plan\"", c->file);
    if (feasible && !cJSON_IsTrue(feasible)) return err_set(c->err, "%s: feasible is not true", c->file);
    if (json_require(c, root, "", "inputs", &in) < 0 || json_expect_object(c, in, "inputs") < 0 ||
        pv_str(c, in, "inputs", "strategy", &v->strategy) < 0 || json_require(c, root, "", "predicted", &pred) < 0 ||
        json_expect_object(c, pred, "predicted") < 0 ||
        pv_num(c, pred, "predicted", "iter_ms", 0, 1e30, &v->iter_ms) < 0 ||
        pv_num(c, pred, "predicted", "samples_per_s", 0, 1e30, &v->samples_per_s) < 0)
        return -1;
    return 0;
}

static int pv_read(const json_ctx *c, const cJSON *root, plan_view *v) {
    const cJSON *ranks, *o;
    int n = 0, i = 0;
    if (pv_head(c, root, v) < 0 || json_require(c, root, "", "ranks", &ranks) < 0 ||
        json_expect_array(c, ranks, "ranks", &n) < 0)
        return -1;
    if (n < 1 || n > PV_MAX_RANKS) return err_set(c->err, "%s: ranks has %d entries (expected 1 to %d)", c->file, n, PV_MAX_RANKS);
    v->ranks = xcalloc((size_t)n, sizeof *v->ranks);
    v->world = n;
    cJSON_ArrayForEach(o, ranks) { /* one pass: cJSON_GetArrayItem walks the list from its start */
        if (pv_rank(c, o, i, &v->ranks[i]) < 0) return -1;
        i++;
    }
    return 0;
}

int plan_view_parse(const char *name, const char *text, size_t len, plan_view *v, err_t *err) {
    memset(v, 0, sizeof *v);
    cJSON *root = json_parse(name, text, len, err);
    if (!root) return -1;
    json_ctx c = {name, err};
    int rc = pv_read(&c, root, v);
    cJSON_Delete(root);
    if (rc < 0) plan_view_free(v);
    return rc;
}

void plan_view_free(plan_view *v) {
    for (int i = 0; v->ranks && i < v->world; i++) {
        free(v->ranks[i].node), free(v->ranks[i].device), free(v->ranks[i].recompute);
    }
    free(v->ranks);
    free(v->strategy);
    memset(v, 0, sizeof *v);
}
