/* job.c - the job file of `cephalo run` (docs/run.md), read through yaml_tree so that every error
 * names the file, the line and the field ("job.yaml:7: optimizer.lr: expected a number, got 'x'").
 * The local devices are turned into a cluster file text and loaded by the cluster parser, so that
 * a job plans exactly like `cephalo plan --cluster` on the same devices. */
#include "cli/job.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <arpa/inet.h>
#include <sys/socket.h>

#include "common/env.h"
#include "common/hostinfo.h"
#include "common/log.h"
#include "common/strutil.h"
#include "common/yaml_tree.h"
#include "planner/gpu.h"
#include "planner/inputs.h"

#define GIB (1024.0 * 1024.0 * 1024.0)
#define MIN_MEMORY (1 << 20)
#define MAX_MEMORY (4096.0 * GIB) /* the cluster file's limit */
#define MAX_THREADS 1024
#define MAX_STEPS (1L << 40)
#define PATH_LEN 96 /* field paths: "devices[255].memory" */

/* The value of an optional key with its field path for messages ("optimizer.lr"); NULL when the
 * key is absent, which leaves the caller's default in place. */
static const ynode *field(const ynode *map, const char *base, const char *key, char *path) {
    snprintf(path, PATH_LEN, "%s%s%s", base, *base ? "." : "", key);
    return ymap_get(map, key);
}

/* Integer fields are read as long; these keep the call sites to one line each. */
static int get_long(const yctx *y, const ynode *map, const char *base, const char *key, long lo, long hi, long *out) {
    char path[PATH_LEN];
    const ynode *v = field(map, base, key, path);
    return v ? ynode_int(y, v, path, lo, hi, out) : 0;
}

static int get_double(const yctx *y, const ynode *map, const char *base, const char *key, double lo, double hi,
                      double *out) {
    char path[PATH_LEN];
    const ynode *v = field(map, base, key, path);
    return v ? ynode_double(y, v, path, lo, hi, out) : 0;
}

/* A number that must be above 0: the message says so rather than "out of range 0..hi". */
static int get_positive(const yctx *y, const ynode *map, const char *key, double hi, double *out) {
    if (get_double(y, map, "", key, -1e300, 1e300, out) < 0) return -1;
    const ynode *v = ymap_get(map, key);
    if (!v || (*out > 0 && *out <= hi)) return 0;
    return err_set(y->err, "%s:%d: %s: %g is out of range (expected more than 0, at most %g)", y->file, v->line, key, *out,
                   hi);
}

static int get_string(const yctx *y, const ynode *map, const char *base, const char *key, const char **out) {
    char path[PATH_LEN];
    const ynode *v = field(map, base, key, path);
    return v ? ynode_string(y, v, path, out) : 0;
}

/* ---- paths ---- */

/* Input paths are relative to the job file's directory, so a job runs from any directory. */
static char *resolve(const char *dir, const char *p) {
    if (p[0] == '/' || !strcmp(dir, ".")) return xstrdup(p);
    char *out = xmalloc(strlen(dir) + strlen(p) + 2);
    sprintf(out, "%s/%s", dir, p);
    return out;
}

/* A data spec may be a comma list of files, directories and globs: each one is resolved. */
static char *resolve_data(const char *dir, const char *spec) {
    if (!strcmp(spec, "synthetic")) return xstrdup(spec);
    size_t cap = strlen(spec) + 1, len = 0;
    char *out = xmalloc(cap);
    out[0] = '\0';
    const char *p = spec;
    for (;;) {
        size_t n = strcspn(p, ",");
        char *part = xmalloc(n + 1);
        memcpy(part, p, n);
        part[n] = '\0';
        char *r = resolve(dir, part);
        cap += strlen(r) + 2;
        out = xrealloc(out, cap);
        len += (size_t)sprintf(out + len, "%s%s", len ? "," : "", r);
        free(part);
        free(r);
        if (!p[n]) break;
        p += n + 1;
    }
    return out;
}

static char *dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return xstrdup(".");
    if (slash == path) return xstrdup("/");
    char *d = xstrdup(path);
    d[slash - path] = '\0';
    return d;
}

/* ---- fields ---- */

/* A job name becomes a directory name (runs/NAME): letters, digits, '.', '_', '-'. */
static bool name_ok(const char *s) {
    if (!*s || *s == '.' || strlen(s) > JOB_NAME_MAX) return false;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && !strchr("._-", *s)) return false;
    return true;
}

static int parse_name(const yctx *y, const ynode *root, job *j) {
    const char *name = NULL;
    if (get_string(y, root, "", "name", &name) < 0) return -1;
    if (name) {
        if (!name_ok(name))
            return err_set(y->err, "%s:%d: name: '%s' is not a usable run name (letters, digits, '.', '_' and '-', "
                                   "at most %d characters)", y->file, ymap_get(root, "name")->line, name, JOB_NAME_MAX);
        memcpy(j->name, name, strlen(name) + 1); /* name_ok: at most JOB_NAME_MAX */
        return 0;
    }
    /* the file name up to its first '.', as model files name themselves; never cut (two long
     * file names with one start would share a run directory and its checkpoints) */
    const char *base = strrchr(j->path, '/');
    base = base ? base + 1 : j->path;
    size_t len = strcspn(base, ".");
    if (len > JOB_NAME_MAX)
        return err_set(y->err, "%s: the run name '%.*s' taken from the file name is longer than %d characters; give the job a "
                               "shorter name: field", y->file, (int)len, base, JOB_NAME_MAX);
    memcpy(j->name, base, len);
    j->name[len] = '\0';
    if (!j->name[0]) memcpy(j->name, "job", 4);
    /* it names the run directory and goes into the generated cluster file and the metrics' JSON
     * as it is: the same characters as a name: field */
    if (!name_ok(j->name))
        return err_set(y->err, "%s: the run name '%s' taken from the file name is not usable (letters, digits, '.', '_' and "
                               "'-'); give the job a name: field", y->file, j->name);
    return 0;
}

/* A model name is kept as is; a model file path is taken relative to the job file. */
static int parse_model(const yctx *y, const ynode *root, const char *dir, job *j) {
    const ynode *v, *init = ymap_get(root, "init_from");
    const char *name, *from;
    if (init) { /* a Hugging Face model directory to start from (docs/import.md) */
        if (ynode_string(y, init, "init_from", &from) < 0) return -1;
        j->train.init_from = resolve(dir, from);
        if (!ymap_get(root, "model")) { /* the model is the one its config.json describes */
            j->model_arg = xstrdup(j->train.init_from);
            int rc = model_resolve(j->train.init_from, &j->model, y->err);
            return rc < 0 ? err_prefix(y->err, "%s:%d: init_from", y->file, init->line) : 0;
        }
    }
    if (ymap_require(y, root, "document", "model", &v) < 0 || ynode_string(y, v, "model", &name) < 0) return -1;
    bool is_file = strchr(name, '/') || strstr(name, ".yaml") || strstr(name, ".yml") || strstr(name, ".json");
    char *arg = is_file ? resolve(dir, name) : xstrdup(name);
    int rc = model_resolve(arg, &j->model, y->err);
    free(j->model_arg); /* init_from's, when the file names a model too */
    j->model_arg = arg;
    return rc < 0 ? err_prefix(y->err, "%s:%d: model", y->file, v->line) : 0;
}

static int parse_sizes(const yctx *y, const ynode *root, job *j) {
    const ynode *v;
    if (ymap_require(y, root, "document", "batch", &v) < 0 || ynode_int(y, v, "batch", 1, COST_MAX_BATCH, &j->batch) < 0)
        return -1;
    j->batch_line = v->line;
    const ynode *ep = ymap_get(root, "epochs");
    if (ep && ymap_get(root, "steps"))
        return err_set(y->err, "%s:%d: epochs: give steps or epochs, not both (epochs sets the steps from the data's size)",
                       y->file, ep->line);
    if (ep) {
        if (ynode_int(y, ep, "epochs", 1, 1L << 20, &j->epochs) < 0) return -1;
    } else if (!ymap_get(root, "steps")) {
        return err_set(y->err, "%s:%d: document: missing field 'steps' (or 'epochs')", y->file, root->line);
    } else if (ymap_require(y, root, "document", "steps", &v) < 0 || ynode_int(y, v, "steps", 1, MAX_STEPS, &j->train.steps) < 0) {
        return -1;
    }
    if (get_long(y, root, "", "seq", 1, 1 << 20, &j->seq) < 0) return -1;
    int seq;
    if (j->seq && model_check_seq(&j->model, (int)j->seq, &seq, y->err) < 0)
        return err_prefix(y->err, "%s:%d: seq", y->file, ymap_get(root, "seq")->line);
    long seed = wcmd_default_long(WCMD_SEED);
    if (get_long(y, root, "", "seed", 0, 1L << 62, &seed) < 0) return -1;
    j->train.seed = (uint64_t)seed;
    return 0;
}

/* Workers of a local run serve /metrics on the loopback address unless the job says otherwise
 * (a pod's serve on every address, for Prometheus). An IP address, as the worker takes it. */
static int parse_metrics_addr(const yctx *y, const ynode *root, job *j) {
    const char *addr = "127.0.0.1";
    unsigned char buf[16];
    if (get_string(y, root, "", "metrics_addr", &addr) < 0) return -1;
    if (strlen(addr) >= sizeof j->metrics_addr || (inet_pton(AF_INET, addr, buf) != 1 && inet_pton(AF_INET6, addr, buf) != 1))
        return err_set(y->err, "%s:%d: metrics_addr: '%.80s' is not an IP address (e.g. 127.0.0.1, 0.0.0.0 or ::)", y->file,
                       ymap_get(root, "metrics_addr")->line, addr);
    snprintf(j->metrics_addr, sizeof j->metrics_addr, "%s", addr);
    return 0;
}

static int parse_inputs(const yctx *y, const ynode *root, const char *dir, job *j) {
    const char *data = NULL, *prof = NULL, *strat = NULL;
    const char *prec = wcmd_defaults[WCMD_PRECISION].value, *rec = wcmd_job_default(WCMD_RECOMPUTE);
    if (get_string(y, root, "", "data", &data) < 0 || get_string(y, root, "", "profile", &prof) < 0 ||
        get_string(y, root, "", "strategy", &strat) < 0 || get_string(y, root, "", "precision", &prec) < 0 ||
        get_string(y, root, "", "recompute", &rec) < 0)
        return -1;
    if (!precision_parse(prec, &j->train.prec))
        return err_set(y->err, "%s:%d: precision: '%s' (expected " PRECISION_CHOICES ")", y->file,
                       ymap_get(root, "precision")->line, prec);
    if (!recompute_policy_parse(rec, &j->recompute))
        return err_set(y->err, "%s:%d: recompute: '%s' (expected " RECOMPUTE_POLICY_CHOICES ")", y->file,
                       ymap_get(root, "recompute")->line, rec);
    if (!data) /* synthetic tokens only when named: a job without data would learn noise */
        return err_set(y->err, "%s: data: missing (required): the training data, token shards from `cephalo data` (a file, "
                               "directory, glob or comma list), a CIMG file for ViT, or `synthetic` for random tokens",
                       y->file);
    j->train.data = resolve_data(dir, data);
    if (prof) j->profile = resolve(dir, prof);
    if (strat && strategy_parse(strat, &j->strat, y->err) < 0)
        return err_prefix(y->err, "%s:%d: strategy", y->file, ymap_get(root, "strategy")->line);
    j->mem_cap = INPUTS_MEM_CAP;
    j->comm_timeout = ENV_COMM_TIMEOUT_S;
    if (get_positive(y, root, "mem_cap", 1, &j->mem_cap) < 0 || get_positive(y, root, "comm_timeout", 86400, &j->comm_timeout) < 0 ||
        get_long(y, root, "", "metrics_port", 0, 65535, &j->metrics_port) < 0)
        return -1;
    return parse_metrics_addr(y, root, j);
}

/* The worker's defaults (common/worker_cmd.c's table) and ranges (docs/worker.md), so the launcher
 * refuses what a worker would. */
static int parse_optimizer(const yctx *y, const ynode *root, job *j) {
    static const char *const keys[] = {"lr", "min_lr", "warmup", "schedule", "weight_decay", "beta1", "beta2", "eps", "clip", NULL};
    wcmd_train *o = &j->train; /* the table's defaults already (load_tree) */
    const char *sched = schedule_name(o->schedule);
    const ynode *m = ymap_get(root, "optimizer");
    if (!m) return 0;
    if (ymap_check_keys(y, m, "optimizer", keys) < 0 || get_double(y, m, "optimizer", "lr", 0, 10, &o->lr) < 0 ||
        get_double(y, m, "optimizer", "min_lr", 0, 10, &o->min_lr) < 0 ||
        get_long(y, m, "optimizer", "warmup", 0, MAX_STEPS, &o->warmup) < 0 ||
        get_double(y, m, "optimizer", "weight_decay", 0, 10, &o->weight_decay) < 0 ||
        get_double(y, m, "optimizer", "beta1", 0, 0.999999, &o->beta1) < 0 ||
        get_double(y, m, "optimizer", "beta2", 0, 0.999999, &o->beta2) < 0 ||
        get_double(y, m, "optimizer", "eps", 1e-30, 1, &o->eps) < 0 || get_double(y, m, "optimizer", "clip", 0, 1e9, &o->clip) < 0 ||
        get_string(y, m, "optimizer", "schedule", &sched) < 0)
        return -1;
    if (!schedule_parse(sched, &o->schedule)) {
        const ynode *s = ymap_get(m, "schedule");
        return err_set(y->err, "%s:%d: optimizer.schedule: '%s' is not " SCHEDULE_CHOICES, y->file, s ? s->line : 0, sched);
    }
    const ynode *min_lr = ymap_get(m, "min_lr");
    if (min_lr && o->schedule == SCHED_CONSTANT) /* as the worker's --min-lr (args_check_only) */
        return err_set(y->err, "%s:%d: optimizer.min_lr needs schedule cosine or linear (constant keeps lr throughout): "
                               "give one, or leave min_lr out (alone it has no effect)", y->file, min_lr->line);
    const ynode *w = ymap_get(m, "warmup");
    j->warmup_line = w ? w->line : 0;
    return 0;
}

static int parse_checkpoint(const yctx *y, const ynode *root, const char *dir, job *j) {
    static const char *const keys[] = {"dir", "every", "resume", "keep_last", "keep_every", NULL};
    const ynode *m = ymap_get(root, "checkpoint"), *d;
    wcmd_train *t = &j->train;
    if (!m) return 0;
    const char *path, *resume = wcmd_job_default(WCMD_RESUME);
    if (ymap_check_keys(y, m, "checkpoint", keys) < 0 || ymap_require(y, m, "checkpoint", "dir", &d) < 0 ||
        ynode_string(y, d, "checkpoint.dir", &path) < 0 || get_long(y, m, "checkpoint", "every", 1, MAX_STEPS, &t->ckpt_every) < 0 ||
        get_string(y, m, "checkpoint", "resume", &resume) < 0 ||
        get_long(y, m, "checkpoint", "keep_last", 0, MAX_STEPS, &t->keep_last) < 0 ||
        get_long(y, m, "checkpoint", "keep_every", 0, MAX_STEPS, &t->keep_every) < 0)
        return -1;
    j->ckpt_dir = xstrdup(path);
    /* auto: continue from DIR/latest when there is one, so that running the job again after an
     * interruption continues it; never: start afresh; anything else names a checkpoint file */
    bool word = !strcmp(resume, "auto") || !strcmp(resume, "never");
    t->resume = word ? xstrdup(resume) : resolve(dir, resume);
    return 0;
}

/* validation: {data: PATH, every: N, samples: N} -> the workers' --val-data, --val-every,
 * --val-samples (docs/worker.md, "Validation"), with the worker's ranges. */
static int parse_validation(const yctx *y, const ynode *root, const char *dir, job *j) {
    static const char *const keys[] = {"data", "every", "samples", NULL};
    const ynode *m = ymap_get(root, "validation"), *d;
    const char *path;
    if (!m) return 0;
    if (ymap_check_keys(y, m, "validation", keys) < 0 || ymap_require(y, m, "validation", "data", &d) < 0 ||
        ynode_string(y, d, "validation.data", &path) < 0 ||
        get_long(y, m, "validation", "every", 0, MAX_STEPS, &j->train.val_every) < 0 ||
        get_long(y, m, "validation", "samples", 1, 1L << 30, &j->train.val_samples) < 0)
        return -1;
    j->train.val_data = resolve_data(dir, path);
    return 0;
}

/* ---- devices ---- */

static int add_device(job *j, const job_device *d, err_t *err, const char *where) {
    if (d->count > JOB_MAX_DEVICES - j->n_devices)
        return err_set(err, "%s: more than %d local devices (one worker process each)", where, JOB_MAX_DEVICES);
    j->items = xrealloc(j->items, (size_t)(j->n_items + 1) * sizeof *j->items);
    j->items[j->n_items++] = *d;
    j->n_devices += d->count;
    return 0;
}

/* Only the CPU device exists in the worker so far: a GPU type is understood, and refused. */
static int check_type(const char *type, err_t *err) {
    if (!strcasecmp(type, GPU_CPU_NAME)) return 0;
    err_t ignored;
    if (gpu_find(type, &ignored))
        return err_set(err, "'%s' cannot run locally yet: the worker has only the cpu device so far (type: cpu)", type);
    return err_set(err, "unknown device type '%s' (expected cpu)", type);
}

static int check_memory(const char *s, int64_t *out, err_t *err) {
    if (!str_to_size(s, out)) return err_set(err, "'%s' is not a size (e.g. 512M, 1.5G)", s);
    if (*out < MIN_MEMORY || (double)*out > MAX_MEMORY)
        return err_set(err, "%s is out of range (expected 1M..4096G%s)", s,
                       isdigit((unsigned char)s[strlen(s) - 1]) ? "; a number without a unit is bytes" : "");
    return 0;
}

static int parse_device(const yctx *y, const ynode *item, const char *base, job *j) {
    static const char *const keys[] = {"type", "threads", "memory", "count", NULL};
    const ynode *t, *mem;
    const char *type, *size;
    char path[PATH_LEN];
    long threads = 1, count = 1;
    snprintf(path, sizeof path, "%s.type", base);
    if (ymap_check_keys(y, item, base, keys) < 0 || ymap_require(y, item, base, "type", &t) < 0 ||
        ynode_string(y, t, path, &type) < 0)
        return -1;
    if (check_type(type, y->err) < 0) return err_prefix(y->err, "%s:%d: %s", y->file, t->line, path);
    if (get_long(y, item, base, "threads", 1, MAX_THREADS, &threads) < 0 ||
        get_long(y, item, base, "count", 1, JOB_MAX_DEVICES, &count) < 0)
        return -1;
    if (!(mem = ymap_get(item, "memory")))
        return err_set(y->err, "%s:%d: %s: missing field 'memory' (the memory the emulated device may use, e.g. 512M)", y->file,
                       item->line, base);
    snprintf(path, sizeof path, "%s.memory", base);
    job_device d = {.threads = (int)threads, .count = (int)count};
    if (ynode_string(y, mem, path, &size) < 0) return -1;
    if (check_memory(size, &d.memory_bytes, y->err) < 0) return err_prefix(y->err, "%s:%d: %s", y->file, mem->line, path);
    /* the file's name has no bound: it goes into the message, not into a buffer */
    return add_device(j, &d, y->err, base) < 0 ? err_prefix(y->err, "%s:%d", y->file, item->line) : 0;
}

static int parse_devices(const yctx *y, const ynode *root, job *j) {
    const ynode *list = ymap_get(root, "devices");
    if (!list) return 0; /* --devices may give them; job_check insists on one or the other */
    if (ynode_expect(y, list, YNODE_SEQ, "devices") < 0) return -1;
    if (list->n == 0) return err_set(y->err, "%s:%d: devices: expected at least one device", y->file, list->line);
    for (size_t i = 0; i < list->n; i++) {
        char base[32];
        snprintf(base, sizeof base, "devices[%zu]", i);
        if (parse_device(y, list->items[i], base, j) < 0) return -1;
    }
    return 0;
}

/* --devices: items "TYPE[:Nt][:SIZE][xCOUNT]" separated by commas. */
static int parse_device_item(const char *item, job_device *d, err_t *err) {
    char buf[128];
    if (snprintf(buf, sizeof buf, "%s", item) >= (int)sizeof buf) return err_set(err, "'%s' is too long", item);
    *d = (job_device){.threads = 1, .count = 1};
    char *x = strrchr(buf, 'x');
    long v;
    if (x) {
        if (!str_to_long(x + 1, &v) || v < 1 || v > JOB_MAX_DEVICES)
            return err_set(err, "'%s': the count after 'x' must be 1..%d", item, JOB_MAX_DEVICES);
        d->count = (int)v;
        *x = '\0';
    }
    char *save, *type = strtok_r(buf, ":", &save);
    if (!type || check_type(type, err) < 0) return type ? err_prefix(err, "'%s'", item) : err_set(err, "empty item");
    for (char *p; (p = strtok_r(NULL, ":", &save));) {
        size_t n = strlen(p);
        if (p[n - 1] == 't') {
            p[n - 1] = '\0';
            if (!str_to_long(p, &v) || v < 1 || v > MAX_THREADS)
                return err_set(err, "'%s': threads must be 1..%d ('2t')", item, MAX_THREADS);
            d->threads = (int)v;
        } else if (check_memory(p, &d->memory_bytes, err) < 0) {
            return err_prefix(err, "'%s': memory", item);
        }
    }
    if (!d->memory_bytes) return err_set(err, "'%s' has no memory size (e.g. cpu:1t:512M)", item);
    return 0;
}

int job_set_devices(job *j, const char *spec, err_t *err) {
    free(j->items);
    j->items = NULL;
    j->n_items = j->n_devices = 0;
    char *copy = xstrdup(spec), *save;
    int rc = 0;
    for (char *item = strtok_r(copy, ",", &save); item && !rc; item = strtok_r(NULL, ",", &save)) {
        job_device d;
        rc = parse_device_item(item, &d, err);
        if (!rc) rc = add_device(j, &d, err, "--devices");
    }
    free(copy);
    if (!rc && !j->n_items) rc = err_set(err, "no devices (e.g. --devices cpu:1t:512M,cpu:1t:256Mx2)");
    return rc < 0 ? err_prefix(err, "--devices") : 0;
}

/* ---- the file ---- */

static int parse_root(const yctx *y, const ynode *root, const char *dir, job *j) {
    static const char *const keys[] = {"name", "model", "data", "batch", "seq", "steps", "epochs", "strategy", "seed", "mem_cap",
                                       "precision", "recompute", "profile", "optimizer", "checkpoint", "comm_timeout", "metrics_port", "metrics_addr", "devices",
                                       "init_from", "validation", NULL};
    if (ymap_check_keys(y, root, "document", keys) < 0) return -1;
    j->root_line = root->line;
    if (parse_name(y, root, j) < 0 || parse_model(y, root, dir, j) < 0 || parse_sizes(y, root, j) < 0 ||
        parse_inputs(y, root, dir, j) < 0 || parse_optimizer(y, root, j) < 0 || parse_checkpoint(y, root, dir, j) < 0 ||
        parse_validation(y, root, dir, j) < 0 || parse_devices(y, root, j) < 0)
        return -1;
    return 0;
}

/* Parses a loaded document; relative paths in it resolve against dir. */
static int load_tree(const char *name, ynode *root, const char *dir, job *out, err_t *err) {
    if (!root) return -1;
    yctx y = {.file = name, .err = err};
    wcmd_train_defaults(&out->train);
    out->train.data = out->train.resume = NULL; /* the job's own copies, set by the parse */
    int rc = parse_root(&y, root, dir, out);
    ytree_free(root);
    return rc;
}

int job_load_file(const char *path, job *out, err_t *err) {
    memset(out, 0, sizeof *out);
    out->path = xstrdup(path);
    char *dir = dir_of(path);
    int rc = load_tree(path, ytree_load_file(path, err), dir, out, err);
    free(dir);
    return rc;
}

int job_load_string(const char *name, const char *text, size_t len, job *out, err_t *err) {
    memset(out, 0, sizeof *out);
    out->path = xstrdup(name);
    return load_tree(name, ytree_load_string(name, text, len, err), ".", out, err);
}

int job_check(const job *j, err_t *err) {
    if (!j->n_devices)
        return err_set(err, "%s:%d: document: missing field 'devices' (or give --devices)", j->path, j->root_line);
    if (j->batch < j->n_devices)
        return err_set(err, "%s:%d: batch: %ld cannot be split over %d devices: every device needs at least one sample", j->path,
                       j->batch_line, j->batch, j->n_devices);
    if (j->epochs && !j->train.steps) return 0; /* epochs: checked once resolved (cli/run.c) */
    char what[64]; /* "the steps of epochs N": at most 41 */
    if (j->epochs) snprintf(what, sizeof what, "the steps of epochs %ld", j->epochs);
    else snprintf(what, sizeof what, "steps");
    if (wcmd_check_warmup(j->train.warmup, j->train.steps, "optimizer.warmup", what, err) < 0)
        return err_prefix(err, "%s:%d", j->path, j->warmup_line);
    return 0;
}

void job_free(job *j) {
    free(j->path);
    /* the worker's strings are the job's own copies */
    free((char *)j->train.data);
    free((char *)j->train.resume);
    free((char *)j->train.val_data);
    free((char *)j->train.init_from);
    free(j->profile);
    free(j->model_arg);
    free(j->ckpt_dir);
    free(j->items);
    memset(j, 0, sizeof *j);
}

/* ---- the devices as a cluster ---- */

char *job_cluster_yaml(const job *j) {
    char *text = NULL;
    size_t len = 0, cap = 0;
    str_appendf(&text, &len, &cap, "# the local devices of job %s (cephalo run)\nnodes:\n  - name: local\n    gpus:\n", j->name);
    for (int i = 0; i < j->n_items; i++) {
        const job_device *d = &j->items[i];
        /* bytes / 2^30 is exact in a double and %.17g prints it back exactly: the planner sees the
         * same capacity the worker will enforce */
        str_appendf(&text, &len, &cap, "      - {type: cpu, count: %d, threads: %d, memory_gib: %.17g}\n", d->count, d->threads,
                    (double)d->memory_bytes / GIB);
    }
    return text;
}

int job_cluster(const job *j, cluster *out, err_t *err) {
    char *text = job_cluster_yaml(j);
    int rc = cluster_load_string("<devices>", text, strlen(text), out, err);
    free(text);
    /* the devices are this host's: the planner knows how many cores they share */
    for (int i = 0; rc == 0 && i < out->n_nodes; i++) out->nodes[i].host_cores = host_cores();
    return rc;
}
