/* plan_read.c - the worker's reading of a plan JSON (docs/formats.md): the model, the global batch,
 * and this rank's batch, microbatches, memory and threads. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/fileio.h"
#include "common/json_util.h"
#include "common/log.h"
#include "common/worker_cmd.h"
#include "planner/arch.h"
#include "planner/model_json.h"
#include "state/plan_read.h"

static int read_int(const json_ctx *c, const cJSON *o, const char *path, const char *key,
                    long lo, long hi, long *out) {
    const cJSON *item;
    char at[128];
    snprintf(at, sizeof at, "%s.%s", path, key);
    return json_require(c, o, path, key, &item) < 0 ? -1 : json_int(c, item, at, lo, hi, out);
}

static int read_model(const json_ctx *c, const cJSON *in, model_spec *m) {
    const cJSON *spec = json_get(in, "model_spec"), *name;
    if (spec) return model_from_json(c, spec, "inputs.model_spec", m);
    const char *s;
    if (json_require(c, in, "inputs", "model", &name) < 0 ||
        json_string(c, name, "inputs.model", &s) < 0)
        return -1;
    return model_resolve(s, m, c->err) < 0 ? err_prefix(c->err, "%s: inputs.model", c->file) : 0;
}

/* inputs.engine (engine_switches): absent in plans from before it (then nothing is checked). */
static int read_engine(const json_ctx *c, const cJSON *in, train_config *cfg) {
    const cJSON *eng = json_get(in, "engine");
    cfg->have_plan_engine = eng != NULL;
    if (!eng) return 0;
    long bpp, bits, ld;
    if (json_expect_object(c, eng, "inputs.engine") < 0 ||
        read_int(c, eng, "inputs.engine", "state_bytes_per_param", 1, 64, &bpp) < 0 ||
        read_int(c, eng, "inputs.engine", "activation_bits", 16, 32, &bits) < 0 ||
        read_int(c, eng, "inputs.engine", "logits_row_stride", 0, 1L << 30, &ld) < 0) /* ViT: 0 */
        return -1;
    if (bits != 16 && bits != 32)
        return err_set(c->err, "%s: inputs.engine.activation_bits is %ld, expected 16 or 32", c->file, bits);
    cfg->plan_engine = (engine_switches){(int)bpp, (int)bits, (int)ld};
    return 0;
}

static int read_inputs(const json_ctx *c, const cJSON *root, train_config *cfg) {
    const cJSON *in, *prec;
    const char *p;
    long batch, seq;
    if (json_require(c, root, "", "inputs", &in) < 0 || json_expect_object(c, in, "inputs") < 0 ||
        read_model(c, in, &cfg->model) < 0 ||
        read_int(c, in, "inputs", "batch", 1, 1 << 20, &batch) < 0 ||
        read_int(c, in, "inputs", "seq", 1, 1 << 20, &seq) < 0 ||
        json_require(c, in, "inputs", "precision", &prec) < 0 ||
        json_string(c, prec, "inputs.precision", &p) < 0)
        return -1;
    if (!precision_parse(p, &cfg->prec))
        return err_set(c->err, "%s: inputs.precision is \"%s\" (expected " PRECISION_CHOICES ")",
                       c->file, p);
    cfg->global_batch = (int)batch;
    int checked;
    if (arch_of(cfg->model.arch)->images) seq = 0; /* a ViT plan's seq is its tokens */
    if (model_check_seq(&cfg->model, (int)seq, &checked, c->err) < 0) return err_prefix(c->err, "%s: inputs.seq", c->file);
    cfg->seq = arch_of(cfg->model.arch)->images ? 0 : checked;
    return read_engine(c, in, cfg);
}

/* ranks[r].recompute: "none" or "full"; a plan without it (older versions) recomputes. */
static int read_recompute(const json_ctx *c, const cJSON *o, const char *path, train_config *cfg) {
    const cJSON *rc = json_get(o, "recompute");
    const char *v;
    char at[48];
    snprintf(at, sizeof at, "%s.recompute", path);
    cfg->recompute = wcmd_default_recompute();
    if (!rc) return 0;
    if (json_string(c, rc, at, &v) < 0) return -1;
    if (!recompute_parse(v, &cfg->recompute))
        return err_set(c->err, "%s: %s is \"%s\" (expected " RECOMPUTE_CHOICES ")", c->file, at, v);
    return 0;
}

static int read_rank(const json_ctx *c, const cJSON *ranks, int rank, train_config *cfg) {
    char path[32];
    long b, mine = 0, m = 0, l = 0, mem = 0, threads = 0;
    int64_t offset = 0;
    int r = -1;
    const cJSON *o;
    cJSON_ArrayForEach(o, ranks) { /* one pass: cJSON_GetArrayItem walks the list from its start */
        snprintf(path, sizeof path, "ranks[%d]", ++r);
        if (json_expect_object(c, o, path) < 0 ||
            read_int(c, o, path, "batch", 0, 1 << 20, &b) < 0)
            return -1;
        if (r < rank) offset += b;
        const cJSON *ml = json_get(o, "microbatches");
        if (cJSON_IsNumber(ml) && ml->valuedouble > cfg->max_micros && ml->valuedouble <= (1 << 20))
            cfg->max_micros = (int)ml->valuedouble; /* validated below for this rank */
        if (r == rank) {
            mine = b;
            if (read_int(c, o, path, "microbatch", 1, 1 << 20, &m) < 0 ||
                read_int(c, o, path, "microbatches", b ? 1 : 0, 1 << 20, &l) < 0 ||
                read_int(c, o, path, "memory_bytes", 0, 1L << 50, &mem) < 0)
                return -1;
            if (json_get(o, "threads") && read_int(c, o, path, "threads", 1, 4096, &threads) < 0)
                return -1;
            if (read_recompute(c, o, path, cfg) < 0) return -1;
            const cJSON *dev = json_get(o, "device");
            const char *type = "cpu";
            char at[48];
            snprintf(at, sizeof at, "%s.device", path);
            if (dev && json_string(c, dev, at, &type) < 0) return -1;
            /* emulated CPU devices are "cpu" or "cpu-Nt-SIZE"; every GPU type runs on cuda */
            cfg->device = !strncasecmp(type, "cpu", 3) && (!type[3] || type[3] == '-') ? "cpu" : "cuda";
            if (b != m * l)
                return err_set(c->err, "%s: %s: batch %ld is not microbatch %ld x %ld", c->file,
                               path, b, m, l);
        }
    }
    cfg->batch = (int)mine, cfg->micro = (int)m, cfg->micros = (int)l;
    cfg->sample_offset = offset;
    cfg->memory_bytes = mem;
    cfg->threads = (int)threads;
    return 0;
}

/* units[u].shard_sizes for every unit of the model, each summing to the unit's size. */
static int read_shards(const json_ctx *c, const cJSON *root, int world, train_config *cfg) {
    const cJSON *units, *rep;
    int n_units = model_n_units(&cfg->model), n;
    if (json_require(c, root, "", "units", &units) < 0 || json_expect_array(c, units, "units", &n) < 0)
        return -1;
    if (n != n_units)
        return err_set(c->err, "%s: units has %d entries, but model %s has %d units", c->file, n,
                       cfg->model.name, n_units);
    bool replicated = false;
    if ((rep = json_get(root, "replicated")) && json_bool(c, rep, "replicated", &replicated) < 0)
        return -1;
    int64_t *sizes = xcalloc((size_t)n_units * (size_t)world, sizeof(int64_t));
    const cJSON *unit = units->child, *e;
    /* one pass over each array (cJSON_GetArrayItem walks a list from its start: units x ranks^2) */
    for (int u = 0; u < n_units; u++, unit = unit->next) {
        char path[64], at[96];
        const cJSON *sz;
        int m;
        int64_t sum = 0, numel = model_unit_params(&cfg->model, u);
        snprintf(path, sizeof path, "units[%d]", u);
        if (json_require(c, unit, path, "shard_sizes", &sz) < 0 || json_expect_array(c, sz, path, &m) < 0)
            goto fail;
        snprintf(at, sizeof at, "%s.shard_sizes", path);
        if (m != world) {
            err_set(c->err, "%s: %s has %d entries, expected one per rank (%d)", c->file, at, m, world);
            goto fail;
        }
        int r = 0;
        cJSON_ArrayForEach(e, sz) {
            long v;
            char el[128];
            snprintf(el, sizeof el, "%s[%d]", at, r);
            if (json_int(c, e, el, 0, (long)numel, &v) < 0) goto fail;
            sizes[(int64_t)u * world + r++] = v;
            sum += v;
        }
        if (sum != numel) {
            err_set(c->err, "%s: %s add up to %lld, but unit %d has %lld parameters", c->file, at,
                    (long long)sum, u, (long long)numel);
            goto fail;
        }
    }
    cfg->shard_sizes = sizes;
    cfg->replicated = replicated;
    return 0;
fail:
    free(sizes);
    return -1;
}

int plan_parse(const char *path, const char *text, size_t len, int rank, int world, train_config *cfg,
               err_t *err) {
    cJSON *root = json_parse(path, text, len, err);
    if (!root) return -1;
    json_ctx c = {path, err};
    const cJSON *ranks, *fmt, *feasible;
    int n = 0;
    int rc = -1;
    if (json_require(&c, root, "", "format", &fmt) < 0) goto out;
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "cephalo-plan")) {
        err_set(err, "%s: format is not \"cephalo-plan\" (is this a plan from 'cephalo plan -o'?)",
                path);
        goto out;
    }
    feasible = json_get(root, "feasible");
    if (feasible && cJSON_IsFalse(feasible)) {
        err_set(err, "%s: the plan is infeasible; re-plan before training", path);
        goto out;
    }
    if (read_inputs(&c, root, cfg) < 0 || json_require(&c, root, "", "ranks", &ranks) < 0 ||
        json_expect_array(&c, ranks, "ranks", &n) < 0)
        goto out;
    if (n != world) {
        err_set(err, "%s: the plan has %d ranks but WORLD_SIZE is %d", path, n, world);
        goto out;
    }
    if (rank < 0 || rank >= n) {
        err_set(err, "%s: RANK %d is outside the plan's %d ranks", path, rank, n);
        goto out;
    }
    rc = read_rank(&c, ranks, rank, cfg);
    if (rc == 0 && world > 1) rc = read_shards(&c, root, world, cfg);
    cfg->rank = rank, cfg->world = world;
out:
    cJSON_Delete(root);
    return rc;
}

int plan_read(const char *path, int rank, int world, train_config *cfg, err_t *err) {
    size_t len;
    char *text = file_read_all(path, JSON_MAX_FILE, &len, err);
    if (!text) return -1;
    int rc = plan_parse(path, text, len, rank, world, cfg, err);
    free(text);
    return rc;
}
