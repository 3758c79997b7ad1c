/* worker_cmd.c - `cephalo-worker train`'s command line and its defaults (worker_cmd.h). */
#include "common/worker_cmd.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

/* The one table. A change here changes the worker, `cephalo run`, the operator and (by test) the
 * CRD together; docs/worker.md and docs/run.md quote these values. */
const wcmd_default wcmd_defaults[WCMD_N] = {
    [WCMD_STEPS] = {"--steps", "20", NULL, NULL, "steps", "steps"}, /* required in job files and the CRD */
    [WCMD_SEED] = {"--seed", "1", NULL, NULL, "seed", "seed"},
    [WCMD_PRECISION] = {"--precision", "fp32", NULL, NULL, "precision", "precision"},
    [WCMD_LR] = {"--lr", "0.0003", NULL, NULL, "optimizer.lr", "optimizer.lr"},
    [WCMD_MIN_LR] = {"--min-lr", NULL, "lr / 10", NULL, "optimizer.min_lr", "optimizer.minLr"},
    [WCMD_SCHEDULE] = {"--schedule", "cosine", NULL, NULL, "optimizer.schedule", "optimizer.schedule"},
    [WCMD_WARMUP] = {"--warmup", "0", NULL, NULL, "optimizer.warmup", "optimizer.warmup"},
    [WCMD_WEIGHT_DECAY] = {"--weight-decay", "0.1", NULL, NULL, "optimizer.weight_decay", "optimizer.weightDecay"},
    [WCMD_BETA1] = {"--beta1", "0.9", NULL, NULL, "optimizer.beta1", "optimizer.beta1"},
    [WCMD_BETA2] = {"--beta2", "0.95", NULL, NULL, "optimizer.beta2", "optimizer.beta2"},
    [WCMD_EPS] = {"--eps", "1e-08", NULL, NULL, "optimizer.eps", "optimizer.eps"},
    [WCMD_CLIP] = {"--clip", "1", NULL, NULL, "optimizer.clip", "optimizer.clip"},
    /* required: synthetic tokens only when asked for by name (`--data synthetic`) */
    [WCMD_DATA] = {"--data", NULL, "none: required", NULL, "data", "data.path"},
    [WCMD_VAL_EVERY] = {"--val-every", NULL, "steps / 10, at most 100", NULL, "validation.every", "data.validation.every"},
    [WCMD_VAL_SAMPLES] = {"--val-samples", "64", NULL, NULL, "validation.samples", "data.validation.samples"},
    [WCMD_CKPT_EVERY] = {"--ckpt-every", NULL, "only at the end", NULL, "checkpoint.every", "checkpoint.every"},
    [WCMD_KEEP_LAST] = {"--keep-last", "3", NULL, NULL, /* unless DIR/retention.json keeps another */ "checkpoint.keep_last", "checkpoint.keepLast"},
    [WCMD_KEEP_EVERY] = {"--keep-every", "0", NULL, NULL, "checkpoint.keep_every", "checkpoint.keepEvery"},
    [WCMD_RESUME] = {"--resume", "none", NULL, "auto", "checkpoint.resume", "checkpoint.resume"}, /* a job resumes, a bare worker does not */
    [WCMD_DIVERGE_STEPS] = {"--diverge-steps", "20", NULL, NULL, NULL, NULL},
    [WCMD_LOSS_SCALE] = {"--loss-scale", "65536", NULL, NULL, NULL, NULL},
    [WCMD_LOSS_SCALE_WINDOW] = {"--loss-scale-window", "2000", NULL, NULL, NULL, NULL},
    /* per rank, from the plan; a job's `recompute` (auto, none, full) steers the planner */
    [WCMD_RECOMPUTE] = {"--recompute", "full", NULL, "auto", "recompute", "recompute"},
};

const char *wcmd_job_default(wcmd_key k) {
    return wcmd_defaults[k].job_value ? wcmd_defaults[k].job_value : wcmd_defaults[k].value;
}

double wcmd_default_num(wcmd_key k) {
    const char *v = wcmd_defaults[k].value;
    return v ? strtod(v, NULL) : 0;
}

long wcmd_default_long(wcmd_key k) { return (long)wcmd_default_num(k); }

precision wcmd_default_precision(void) {
    precision prec;
    CHECK(precision_parse(wcmd_defaults[WCMD_PRECISION].value, &prec));
    return prec;
}

recompute_mode wcmd_default_recompute(void) {
    recompute_mode rec;
    CHECK(recompute_parse(wcmd_defaults[WCMD_RECOMPUTE].value, &rec));
    return rec;
}

void wcmd_train_defaults(wcmd_train *t) {
    precision prec = wcmd_default_precision();
    recompute_mode rec = wcmd_default_recompute();
    lr_schedule sched;
    CHECK(schedule_parse(wcmd_defaults[WCMD_SCHEDULE].value, &sched));
    *t = (wcmd_train){
        .steps = wcmd_default_long(WCMD_STEPS),
        .seed = (uint64_t)wcmd_default_long(WCMD_SEED),
        .prec = prec,
        .lr = wcmd_default_num(WCMD_LR),
        .min_lr = -1,
        .schedule = sched,
        .warmup = wcmd_default_long(WCMD_WARMUP),
        .weight_decay = wcmd_default_num(WCMD_WEIGHT_DECAY),
        .beta1 = wcmd_default_num(WCMD_BETA1),
        .beta2 = wcmd_default_num(WCMD_BETA2),
        .eps = wcmd_default_num(WCMD_EPS),
        .clip = wcmd_default_num(WCMD_CLIP),
        .data = wcmd_defaults[WCMD_DATA].value,
        .val_every = -1,
        .val_samples = 0,
        .ckpt_every = 0,
        .keep_last = -1, /* the checkpoint directory's setting, else the table's */
        .keep_every = -1,
        .resume = wcmd_job_default(WCMD_RESUME),
        .recompute = rec,
    };
}

int wcmd_check_warmup(long warmup, long steps, const char *warmup_field, const char *steps_field, err_t *err) {
    if (warmup <= 0 || warmup < steps) return 0;
    return err_set(err, "%s: %ld must be below %s (%ld): the warmup must end before the last step", warmup_field,
                   warmup, steps_field, steps);
}

void wcmd_argv_add(wcmd_argv *a, const char *fmt, ...) {
    va_list ap, again;
    va_start(ap, fmt);
    va_copy(again, ap);
    int len = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *s = xmalloc((size_t)(len > 0 ? len : 0) + 1);
    vsnprintf(s, (size_t)(len > 0 ? len : 0) + 1, fmt, again);
    va_end(again);
    a->v = xrealloc(a->v, (size_t)(a->n + 2) * sizeof *a->v);
    a->v[a->n++] = s;
    a->v[a->n] = NULL;
}

void wcmd_argv_free(wcmd_argv *a) {
    for (int i = 0; i < a->n; i++) free(a->v[i]);
    free(a->v);
    *a = (wcmd_argv){0};
}

const char *wcmd_num(double v, char *buf) {
    for (int digits = 6; digits <= 17; digits++) { /* %g's 6 digits unless more are needed */
        snprintf(buf, 32, "%.*g", digits, v);
        if (strtod(buf, NULL) == v) break;
    }
    return buf;
}

void wcmd_env_init(wcmd_env *e, int rank, int world, const char *master_addr, int master_port) {
    *e = (wcmd_env){.rank = rank, .world = world, .master_addr = master_addr, .master_port = master_port,
                    .local_rank = -1, .metrics_port = -1};
}

void wcmd_env_entries(const wcmd_env *e, wcmd_argv *out) {
    char t[32];
    wcmd_argv_add(out, "RANK=%d", e->rank);
    wcmd_argv_add(out, "WORLD_SIZE=%d", e->world);
    if (e->master_addr) wcmd_argv_add(out, "MASTER_ADDR=%s", e->master_addr);
    if (e->master_port > 0) wcmd_argv_add(out, "MASTER_PORT=%d", e->master_port);
    if (e->plan) wcmd_argv_add(out, "CEPHALO_PLAN=%s", e->plan);
    if (e->comm_timeout > 0) wcmd_argv_add(out, "CEPHALO_COMM_TIMEOUT=%s", wcmd_num(e->comm_timeout, t));
    if (e->local_rank >= 0) wcmd_argv_add(out, "LOCAL_RANK=%d", e->local_rank);
    if (e->job) wcmd_argv_add(out, "CEPHALO_JOB=%s", e->job);
    if (e->job_id) wcmd_argv_add(out, "CEPHALO_JOB_ID=%s", e->job_id);
    if (e->metrics_port >= 0) wcmd_argv_add(out, "CEPHALO_METRICS_PORT=%ld", e->metrics_port);
}

/* "--flag VALUE" for the option of key k. */
static void opt(wcmd_argv *a, wcmd_key k, const char *value) {
    wcmd_argv_add(a, "%s", wcmd_defaults[k].flag);
    wcmd_argv_add(a, "%s", value);
}

static void opt_num(wcmd_argv *a, wcmd_key k, double v) {
    char buf[32];
    opt(a, k, wcmd_num(v, buf));
}

static void opt_long(wcmd_argv *a, wcmd_key k, long v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%ld", v);
    opt(a, k, buf);
}

static void optimizer_args(const wcmd_train *t, wcmd_argv *a) {
    opt_num(a, WCMD_LR, t->lr);
    /* the constant schedule has no final lr: the worker refuses one it would ignore (given in
     * the job, it still goes, to be refused there) */
    if (t->schedule != SCHED_CONSTANT || t->min_lr >= 0) opt_num(a, WCMD_MIN_LR, schedule_min_lr(t->lr, t->min_lr));
    opt(a, WCMD_SCHEDULE, schedule_name(t->schedule));
    opt_long(a, WCMD_WARMUP, t->warmup);
    opt_num(a, WCMD_WEIGHT_DECAY, t->weight_decay);
    opt_num(a, WCMD_BETA1, t->beta1);
    opt_num(a, WCMD_BETA2, t->beta2);
    opt_num(a, WCMD_EPS, t->eps);
    opt_num(a, WCMD_CLIP, t->clip);
}

static void data_args(const wcmd_train *t, wcmd_argv *a) {
    if (t->data) opt(a, WCMD_DATA, t->data); /* none: the worker refuses to start, saying so */
    if (t->init_from) wcmd_argv_add(a, "--init-from"), wcmd_argv_add(a, "%s", t->init_from);
    if (!t->val_data) return;
    wcmd_argv_add(a, "--val-data"), wcmd_argv_add(a, "%s", t->val_data);
    if (t->val_every >= 0) opt_long(a, WCMD_VAL_EVERY, t->val_every);
    if (t->val_samples > 0) opt_long(a, WCMD_VAL_SAMPLES, t->val_samples);
}

/* Resume is always spelled out. Retention only when the job gives it: otherwise the worker keeps
 * what the checkpoint directory was made with (DIR/retention.json), else the table's default, so
 * that a job resumed without repeating its settings does not undo them. */
static void checkpoint_args(const wcmd_train *t, wcmd_argv *a) {
    if (!t->ckpt_dir) return;
    wcmd_argv_add(a, "--ckpt-dir"), wcmd_argv_add(a, "%s", t->ckpt_dir);
    if (t->ckpt_every > 0) opt_long(a, WCMD_CKPT_EVERY, t->ckpt_every);
    if (t->keep_last >= 0) opt_long(a, WCMD_KEEP_LAST, t->keep_last);
    if (t->keep_every >= 0) opt_long(a, WCMD_KEEP_EVERY, t->keep_every);
    opt(a, WCMD_RESUME, t->resume ? t->resume : wcmd_job_default(WCMD_RESUME));
    if (t->overwrite) wcmd_argv_add(a, "--overwrite");
}

void wcmd_train_argv(const wcmd_train *t, wcmd_argv *a) {
    wcmd_argv_add(a, "train");
    opt_long(a, WCMD_STEPS, t->steps);
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)t->seed);
    opt(a, WCMD_SEED, seed);
    opt(a, WCMD_PRECISION, precision_name(t->prec));
    opt(a, WCMD_RECOMPUTE, recompute_name(t->recompute));
    optimizer_args(t, a);
    data_args(t, a);
    checkpoint_args(t, a);
}
