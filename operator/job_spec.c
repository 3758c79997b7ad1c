/* job_spec.c - a CephaloJob's spec read once (job_spec.h). */
#include "operator/job_spec.h"

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/ckpt_dir.h"
#include "common/json_util.h"
#include "common/log.h"
#include "common/strutil.h"
#include "operator/pod_template.h"

#define MAX_COUNT 1099511627776.0 /* the CRD's maximum of steps and counts: 2^40 */

/* One parse: the spec, and the first problem found (later ones are not reported). */
typedef struct jp {
    const cJSON *spec;
    err_t *err;
    int rc;
} jp;

/* Records "spec.PATH: ..." unless a problem was recorded already. */
__attribute__((format(printf, 3, 4))) static void bad(jp *p, const char *path, const char *fmt, ...);

static void bad(jp *p, const char *path, const char *fmt, ...) {
    if (p->rc < 0) return;
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    p->rc = err_set(p->err, "spec.%s: %s", path, msg);
}

/* Keeps a message that names its field already (model_source.c's, the planner's). */
static void bad_err(jp *p, const err_t *e) {
    if (p->rc < 0) return;
    *p->err = *e;
    p->rc = -1;
}

/* The member at a dotted path under spec ("optimizer.lr"); NULL when it or a section on the way
 * is absent or null (the API server drops nulls; a test's JSON may have them). */
static const cJSON *at(const cJSON *spec, const char *path) {
    const cJSON *o = spec;
    char key[64];
    while (o && *path) {
        size_t n = strcspn(path, ".");
        snprintf(key, sizeof key, "%.*s", (int)n, path);
        o = json_get(o, key);
        path += n + (path[n] == '.');
    }
    return cJSON_IsNull(o) ? NULL : o;
}

/* A value as a message quotes it after "got". */
static const char *got(const cJSON *v, char *buf, size_t n) {
    if (cJSON_IsString(v)) snprintf(buf, n, "\"%.60s\"", v->valuestring);
    else if (cJSON_IsNumber(v)) snprintf(buf, n, "%.15g", v->valuedouble);
    else snprintf(buf, n, "%s", cJSON_IsBool(v) ? (cJSON_IsTrue(v) ? "true" : "false") : json_type_name(v));
    return buf;
}

/* ---- numbers ---------------------------------------------------------------------------------- */

/* Where a number's default comes from: the worker's table (wcmd_train_defaults put it in
 * job_spec.train already, or the "not given" value the builder understands), the operator's
 * constant in the row, or nowhere: the field is required. */
typedef enum { DEF_WORKER, DEF_OWN, DEF_REQUIRED } js_def;

typedef struct js_num {
    const char *path; /* under spec */
    bool integer;     /* a long in job_spec, else a double */
    size_t off;
    double lo, hi;
    bool open_lo; /* (lo, hi] */
    js_def from;
    double def; /* DEF_OWN */
} js_num;

#define AT(member) offsetof(job_spec, member)

static const js_num js_nums[] = {
    {"gpus.minGPUs", true, AT(min_gpus), 1, 4096, false, DEF_OWN, 0},
    {"gpus.maxGPUs", true, AT(max_gpus), 1, 4096, false, DEF_OWN, 0},
    {"globalBatch", true, AT(global_batch), 1, 65536, false, DEF_REQUIRED, 0},
    {"seqLen", true, AT(seq_len), 1, 1048576, false, DEF_OWN, 0}, /* 0: the model's */
    {"memCap", false, AT(mem_cap), 0, 1, true, DEF_OWN, JOB_SPEC_MEM_CAP},
    {"steps", true, AT(train.steps), 1, MAX_COUNT, false, DEF_REQUIRED, 0},
    {"optimizer.lr", false, AT(train.lr), 0, 10, false, DEF_WORKER, 0},
    {"optimizer.minLr", false, AT(train.min_lr), 0, 10, false, DEF_WORKER, 0},
    {"optimizer.warmup", true, AT(train.warmup), 0, MAX_COUNT, false, DEF_WORKER, 0},
    {"optimizer.weightDecay", false, AT(train.weight_decay), 0, 10, false, DEF_WORKER, 0},
    {"optimizer.beta1", false, AT(train.beta1), 0, 0.999999, false, DEF_WORKER, 0},
    {"optimizer.beta2", false, AT(train.beta2), 0, 0.999999, false, DEF_WORKER, 0},
    {"optimizer.eps", false, AT(train.eps), 1e-30, 1, false, DEF_WORKER, 0},
    {"optimizer.clip", false, AT(train.clip), 0, 1e9, false, DEF_WORKER, 0},
    {"data.validation.every", true, AT(train.val_every), 1, MAX_COUNT, false, DEF_WORKER, 0},
    {"data.validation.samples", true, AT(train.val_samples), 1, MAX_COUNT, false, DEF_WORKER, 0},
    {"checkpoint.every", true, AT(train.ckpt_every), 1, MAX_COUNT, false, DEF_WORKER, 0},
    {"checkpoint.keepLast", true, AT(train.keep_last), 0, MAX_COUNT, false, DEF_WORKER, 0},
    {"checkpoint.keepEvery", true, AT(train.keep_every), 0, MAX_COUNT, false, DEF_WORKER, 0},
    {"priority", true, AT(priority), -1000000, 1000000, false, DEF_OWN, JOB_SPEC_PRIORITY},
    {"elastic.minReplanSeconds", true, AT(min_replan_s), 0, 604800, false, DEF_OWN, JOB_SPEC_MIN_REPLAN_S},
    {"commTimeout", false, AT(comm_timeout_s), 0, 86400, true, DEF_OWN, JOB_SPEC_COMM_TIMEOUT_S},
    {"backoffLimit", true, AT(backoff_limit), 0, 1000, false, DEF_OWN, JOB_SPEC_BACKOFF_LIMIT},
    {"terminationGracePeriodSeconds", true, AT(grace_s), 1, 86400, false, DEF_OWN, JOB_SPEC_GRACE_S},
    {"metricsPort", true, AT(metrics_port), 0, 65535, false, DEF_OWN, JOB_SPEC_METRICS_PORT},
};

static void store(job_spec *s, const js_num *f, double v) {
    char *field = (char *)s + f->off;
    if (f->integer) *(long *)(void *)field = (long)v;
    else *(double *)(void *)field = v;
}

/* The value of row f, when given and in range; else the error. false when it was not usable. */
static bool num_value(jp *p, const js_num *f, const cJSON *v, double *out) {
    char g[80];
    double x = v->valuedouble;
    bool ok = cJSON_IsNumber(v) && isfinite(x) && (!f->integer || x == floor(x)) &&
              (f->open_lo ? x > f->lo : x >= f->lo) && x <= f->hi;
    if (!ok)
        bad(p, f->path, "expected %s in %s%.15g, %.15g], got %s", f->integer ? "an integer" : "a number",
            f->open_lo ? "(" : "[", f->lo, f->hi, got(v, g, sizeof g));
    *out = x;
    return ok;
}

static void parse_nums(jp *p, job_spec *s) {
    for (size_t i = 0; i < sizeof js_nums / sizeof *js_nums; i++) {
        const js_num *f = &js_nums[i];
        const cJSON *v = at(p->spec, f->path);
        double x;
        if (f->from == DEF_OWN) store(s, f, f->def);
        if (!v && f->from == DEF_REQUIRED) bad(p, f->path, "missing (required)");
        else if (v && num_value(p, f, v, &x)) store(s, f, x);
    }
}

/* spec.seed: the worker's uint64, within the CRD's range (2^62). */
static void parse_seed(jp *p, job_spec *s) {
    const cJSON *v = at(p->spec, "seed");
    char g[80];
    if (!v) return;
    double x = v->valuedouble;
    if (cJSON_IsNumber(v) && isfinite(x) && x == floor(x) && x >= 0 && x <= 4611686018427387904.0)
        s->train.seed = (uint64_t)x;
    else
        bad(p, "seed", "expected an integer in [0, 4611686018427387904], got %s", got(v, g, sizeof g));
}

/* ---- strings and sections ------------------------------------------------------------------- */

/* A non-empty string at path: *out, left as it is when absent. */
static void str_at(jp *p, const char *path, const char **out) {
    const cJSON *v = at(p->spec, path);
    char g[80];
    if (!v) return;
    if (cJSON_IsString(v) && *v->valuestring) *out = v->valuestring;
    else bad(p, path, "expected a non-empty string, got %s", got(v, g, sizeof g));
}

/* The sections that must be objects when given. */
static void parse_sections(jp *p) {
    static const char *const objects[] = {"model", "optimizer", "data", "data.validation", "checkpoint", "gpus",
                                          "elastic", "gpus.nodeSelector", NULL};
    static const char *const arrays[] = {"gpus.allowedProducts", "tolerations", NULL};
    char g[80];
    for (int i = 0; objects[i]; i++) {
        const cJSON *v = at(p->spec, objects[i]);
        if (v && !cJSON_IsObject(v)) bad(p, objects[i], "expected an object, got %s", got(v, g, sizeof g));
    }
    for (int i = 0; arrays[i]; i++) {
        const cJSON *v = at(p->spec, arrays[i]);
        if (v && !cJSON_IsArray(v)) bad(p, arrays[i], "expected a list, got %s", got(v, g, sizeof g));
    }
}

/* spec.model.name or .inline, when there is no initFrom. */
static void parse_model_own(jp *p, job_spec *s) {
    const cJSON *inl = at(p->spec, "model.inline");
    if (inl && at(p->spec, "model.name")) {
        bad(p, "model", "give one of name, inline and initFrom");
    } else if (inl && !cJSON_IsObject(inl)) {
        bad(p, "model.inline", "expected an object (a model file)");
    } else if (inl) {
        s->model = JOB_MODEL_INLINE, s->model_inline = inl;
    } else {
        str_at(p, "model.name", &s->model_name);
        if (s->model_name) s->model = JOB_MODEL_NAME;
        else if (!at(p->spec, "model.name")) bad(p, "model", "give name, inline or initFrom");
    }
}

static const char *str_or_null(const cJSON *spec, const char *path) {
    const cJSON *v = at(spec, path);
    return cJSON_IsString(v) && *v->valuestring ? v->valuestring : NULL;
}

/* status.model: "gpt2-124m"; inline "my-gpt (inline)", "gpt2-124m+ (inline)" (a base with
 * overrides) or "llama 32x4096 (inline)"; "Llama-2-7b-hf (initFrom)". */
static void model_label(const jp *p, job_spec *s) {
    char *l = s->model_label;
    size_t n = sizeof s->model_label;
    if (s->model == JOB_MODEL_NAME) {
        snprintf(l, n, "%s", s->model_name);
    } else if (s->model == JOB_MODEL_INIT_FROM) {
        snprintf(l, n, "%s (initFrom)", s->init.name);
    } else if (s->model == JOB_MODEL_INLINE) {
        /* the model file's own checks come later (planning): a field of the wrong type shows nothing here */
        const cJSON *ln = at(p->spec, "model.inline.n_layer"), *d = at(p->spec, "model.inline.d_model");
        const char *name = str_or_null(p->spec, "model.inline.name"), *base = str_or_null(p->spec, "model.inline.base"),
                   *arch = str_or_null(p->spec, "model.inline.arch");
        if (name) snprintf(l, n, "%s (inline)", name);
        else if (base) snprintf(l, n, "%s+ (inline)", base);
        else if (arch && cJSON_IsNumber(ln) && cJSON_IsNumber(d))
            snprintf(l, n, "%s %.0fx%.0f (inline)", arch, ln->valuedouble, d->valuedouble);
        else snprintf(l, n, "inline");
    }
}

/* spec.model: exactly one of name, inline and initFrom (model_source.c reads initFrom). */
static void parse_model(jp *p, job_spec *s) {
    err_t e;
    int from = msrc_parse(at(p->spec, "model"), &s->init, &e);
    if (from < 0) bad_err(p, &e);
    else if (from) s->model = JOB_MODEL_INIT_FROM;
    else parse_model_own(p, s);
    model_label(p, s);
}

/* The names with a fixed set of values, each with its own parser and wording. */
static void parse_choices(jp *p, job_spec *s) {
    const char *strat = JOB_SPEC_STRATEGY, *prec = NULL, *sched = NULL, *pull = NULL;
    err_t e;
    str_at(p, "strategy", &strat);
    if (strategy_parse(strat, &s->strat, &e) < 0) {
        err_prefix(&e, "spec.strategy");
        bad_err(p, &e);
    }
    str_at(p, "precision", &prec);
    if (prec && !precision_parse(prec, &s->train.prec))
        bad(p, "precision", "'%.40s' (expected " PRECISION_CHOICES ")", prec);
    const char *rec = NULL;
    str_at(p, "recompute", &rec);
    if (rec && !recompute_policy_parse(rec, &s->recompute))
        bad(p, "recompute", "'%.40s' (expected " RECOMPUTE_POLICY_CHOICES ")", rec);
    str_at(p, "optimizer.schedule", &sched);
    if (sched && !schedule_parse(sched, &s->train.schedule))
        bad(p, "optimizer.schedule", "'%.40s' (expected " SCHEDULE_CHOICES ")", sched);
    else if (s->train.schedule == SCHED_CONSTANT && at(p->spec, "optimizer.minLr")) /* as the worker's --min-lr */
        bad(p, "optimizer.minLr", "needs schedule cosine or linear (constant keeps lr throughout): give one, or leave "
                                  "minLr out (alone it has no effect)");
    str_at(p, "imagePullPolicy", &pull);
    if (pull && strcmp(pull, "Always") && strcmp(pull, "IfNotPresent") && strcmp(pull, "Never"))
        bad(p, "imagePullPolicy", "'%.40s' (expected Always, IfNotPresent or Never)", pull);
    else s->pull_policy = pull;
}

/* spec.data and spec.checkpoint: where the workers read and write. */
static void parse_storage(jp *p, job_spec *s) {
    str_at(p, "data.path", &s->data_path);
    if (!s->data_path) /* the CRD requires it too; an older CRD may not */
        bad(p, "data.path", "missing (required): token shards, or `synthetic` for random tokens");
    str_at(p, "data.pvc", &s->data_pvc);
    if (at(p->spec, "data.validation")) {
        str_at(p, "data.validation.path", &s->val_path);
        if (!at(p->spec, "data.validation.path")) bad(p, "data.validation.path", "missing (required)");
    }
    s->checkpoint = cJSON_IsObject(at(p->spec, "checkpoint"));
    if (!s->checkpoint) return;
    str_at(p, "checkpoint.dir", &s->ckpt_dir);
    if (!at(p->spec, "checkpoint.dir")) bad(p, "checkpoint.dir", "missing (required)");
    str_at(p, "checkpoint.pvc", &s->ckpt_pvc);
    str_at(p, "checkpoint.resume", &s->train.resume);
    /* the worker would refuse it in every pod (ckpt_dir.h): the job fails here, with the field */
    size_t in_pod = s->ckpt_dir ? strlen(s->ckpt_dir) + (s->ckpt_pvc ? strlen(JOB_SPEC_CKPT_MOUNT) + 1 : 0) : 0;
    if (in_pod > CKPT_DIR_MAX)
        bad(p, "checkpoint.dir", "'%.60s...' is too long: %zu characters in the pod, at most %d", s->ckpt_dir, in_pod, CKPT_DIR_MAX);
}

/* The fields read as they are: objects the pods and the inventory take over, a flag, names. */
static void parse_rest(jp *p, job_spec *s) {
    const cJSON *suspend = at(p->spec, "suspend");
    char g[80];
    s->allowed_products = at(p->spec, "gpus.allowedProducts");
    s->node_selector = at(p->spec, "gpus.nodeSelector");
    s->tolerations = at(p->spec, "tolerations");
    s->pod_template = at(p->spec, "template");
    err_t e;
    if (pod_template_check(s->pod_template, &e) < 0) bad_err(p, &e);
    if (suspend && !cJSON_IsBool(suspend)) bad(p, "suspend", "expected true or false, got %s", got(suspend, g, sizeof g));
    s->suspend = cJSON_IsTrue(suspend);
    str_at(p, "image", &s->image);
    str_at(p, "profileConfigMap", &s->profile_cm);
}

/* What no single field can say. */
static void check_across(jp *p, const job_spec *s) {
    if (p->rc == 0 && s->min_gpus > 0 && s->max_gpus > 0 && s->min_gpus > s->max_gpus)
        p->rc = err_set(p->err, "spec.gpus.minGPUs %ld is more than spec.gpus.maxGPUs %ld (expected minGPUs <= maxGPUs)",
                        s->min_gpus, s->max_gpus);
    /* the worker's own rule: refused here, the job is InvalidSpec; left to the workers, every pod
     * would exit 2 and the gang would restart until backoffLimit */
    if (p->rc == 0)
        p->rc = wcmd_check_warmup(s->train.warmup, s->train.steps, "spec.optimizer.warmup", "spec.steps", p->err);
}

static void defaults(job_spec *s) {
    *s = (job_spec){.model = JOB_MODEL_NONE, .strat = STRAT_CEPHALO};
    wcmd_train_defaults(&s->train);
    s->train.data = NULL; /* the paths are the pod's (job_spec_worker_argv); spec.data.path is required */
}

int job_spec_parse(const cJSON *spec, job_spec *out, err_t *err) {
    jp p = {spec, err, 0};
    defaults(out);
    if (!cJSON_IsObject(spec)) return err_set(err, "spec: expected an object, got %s", json_type_name(spec));
    parse_sections(&p);
    parse_nums(&p, out);
    check_across(&p, out);
    parse_model(&p, out);
    parse_choices(&p, out);
    parse_seed(&p, out);
    parse_storage(&p, out);
    parse_rest(&p, out);
    return p.rc;
}

/* ---- the workers' arguments ----------------------------------------------------------------- */

/* path inside the pod: under mount when the volume is mounted, else as the job gave it; a fresh
 * string (a path has no bound here: the CRD's, 4096, is not the operator's to rely on). */
static char *in_pod(const char *mount, const char *path) {
    if (!path) path = ""; /* a required field missing: the parse said so */
    return mount ? str_printf("%s/%s", mount, path) : xstrdup(path);
}

void job_spec_worker_argv(const job_spec *s, recompute_mode rank_recompute, wcmd_argv *out) {
    const char *data_mount = s->data_pvc ? JOB_SPEC_DATA_MOUNT : NULL;
    char *data = in_pod(data_mount, s->data_path), *val = s->val_path ? in_pod(data_mount, s->val_path) : NULL;
    char *ckpt = s->checkpoint ? in_pod(s->ckpt_pvc ? JOB_SPEC_CKPT_MOUNT : NULL, s->ckpt_dir) : NULL;
    wcmd_train t = s->train;
    t.data = data, t.val_data = val, t.ckpt_dir = ckpt;
    t.init_from = s->model == JOB_MODEL_INIT_FROM ? s->init.dir : NULL;
    t.recompute = rank_recompute;
    wcmd_train_argv(&t, out);
    free(data), free(val), free(ckpt);
}
