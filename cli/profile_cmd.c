/* profile_cmd.c - `cephalo profile` (see profile_cmd.h and docs/profile.md). */
#include "cli/profile_cmd.h"
#include "cli/launch.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/job.h"
#include "common/args.h"
#include "common/clock.h"
#include "common/fileio.h"
#include "common/outputs.h"
#include "common/log.h"
#include "common/strutil.h"
#include "common/worker_cmd.h"
#include "planner/inputs.h"
#include "planner/model.h"
#include "planner/profile.h"
#include "planner/profile_store.h"


static const char usage[] =
    "usage: cephalo profile --devices LIST --model MODEL [--seq S] [--precision fp32|bf16|fp16]\n"
    "                       [-o PROFILE.json] [--store FILE|none] [--max-micro K] [--quick]\n"
    "                       [--check-batch B]\n"
    "\n"
    "Measures the cost model of the local devices for MODEL (docs/profile.md): per-layer forward\n"
    "and backward time and compute memory at microbatch 1..K (until the device's memory is full)\n"
    "on each distinct device type, and AllGather/ReduceScatter latency against message size, even\n"
    "and uneven, over all the devices; then a step check: short training runs on the devices at\n"
    "two batches (one sample per device, and --check-batch), each twice (the faster counts),\n"
    "planned from the new profile; the line through the measured step times against the\n"
    "predicted ones (a scale and a per-step overhead) is recorded on every entry.\n"
    "Writes PROFILE.json (with -o) and merges it into the\n"
    "profile store ($CEPHALO_PROFILE_STORE, else ~/.cache/cephalo/profiles.json), which\n"
    "`cephalo plan/compare/run` use when no --profile is given.\n"
    "  --devices LIST     CPU devices as in `cephalo run`: cpu:THREADSt:MEMORY[xCOUNT],...\n"
    "  --max-micro K      largest microbatch measured (default 8); beyond it costs are linear\n"
    "  --quick            fewer repetitions (tests)\n"
    "  --check-batch B    the step check's larger global batch (default 4 per device): the batch\n"
    "                     you will train, to calibrate where the plan runs\n"
    "  --comm-max-bytes N largest collective measured (default 4M)\n";

static int failed(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int failed(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cephalo profile: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return EXIT_FAILED;
}

static void fmt_duration(double s, char *buf, size_t n) {
    long t = (long)(s + 0.5);
    snprintf(buf, n, "%ld:%02ld", t / 60, t % 60);
}

typedef struct popts {
    const char *devices, *model, *out, *store, *precision; /* precision: as given, for the workers */
    precision prec;
    long seq, max_micro, check_batch;
    char comm_max[32];
    bool quick;
    args cl; /* the command line as parsed: which options were given */
} popts;

enum { O_DEVICES = 256, O_MODEL, O_SEQ, O_PREC, O_STORE, O_MAXM, O_QUICK, O_COMMMAX, O_CHECKB };

static int profile_option(args *p, int ch, popts *o) {
    switch (ch) {
    case O_DEVICES: o->devices = p->val; break;
    case O_MODEL: o->model = p->val; break;
    case O_SEQ: return args_long(p, 1, 1 << 20, &o->seq);
    case O_PREC: return args_choice(p, precision_names, &o->precision) ? ARGS_BAD : (precision_parse(o->precision, &o->prec), 0);
    case O_STORE: o->store = p->val; break;
    case O_MAXM: return args_long(p, 1, 4096, &o->max_micro);
    case O_CHECKB: return args_long(p, 1, 1L << 30, &o->check_batch);
    case O_QUICK: o->quick = true; break;
    case O_COMMMAX: /* the worker reads it: a cut one would be another size */
        if (str_fmt(o->comm_max, sizeof o->comm_max, NULL, "", "%s", p->val) < 0)
            return args_bad(p, "%s: '%.40s' is not a size (e.g. 4M)", p->opt, p->val);
        break;
    case 'o': o->out = p->val; break;
    }
    return 0;
}

static int parse(int argc, char **argv, popts *o) {
    static const struct option longopts[] = {
        {"devices", 1, 0, O_DEVICES}, {"model", 1, 0, O_MODEL},   {"seq", 1, 0, O_SEQ},
        {"precision", 1, 0, O_PREC},  {"store", 1, 0, O_STORE},   {"max-micro", 1, 0, O_MAXM},
        {"quick", 0, 0, O_QUICK},     {"comm-max-bytes", 1, 0, O_COMMMAX}, {"check-batch", 1, 0, O_CHECKB},
        {"output", 1, 0, 'o'},        {"help", 0, 0, 'h'},        {0, 0, 0, 0}};
    args p = args_begin(argc, argv, "cephalo profile", longopts, "o:", usage);
    int ch = 0, rc = 0;
    while (!rc && (ch = args_next(&p)) > 0) rc = profile_option(&p, ch, o);
    if (rc || ch < 0 || args_no_operands(&p)) return ARGS_BAD;
    if (!o->devices) return args_bad(&p, "--devices is required (e.g. --devices cpu:1t:512M,cpu:1t:512M)");
    if (!o->model) return args_bad(&p, "--model is required");
    o->cl = p;
    return 0;
}

static int cmp_ms(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Element-wise mean of the curves of `one` into `sum` (same microbatches: the shorter wins). */
static void accumulate(profile_entry *sum, const profile_entry *one, int k) {
    if (one->n_points < sum->n_points) sum->n_points = one->n_points;
    profile_curve *cs[] = {&sum->block, &sum->embedding, &sum->head};
    const profile_curve *co[] = {&one->block, &one->embedding, &one->head};
    for (int c = 0; c < 3; c++)
        for (int i = 0; i < sum->n_points; i++) {
            cs[c]->fwd_ms[i] = (cs[c]->fwd_ms[i] * k + co[c]->fwd_ms[i]) / (k + 1);
            cs[c]->bwd_ms[i] = (cs[c]->bwd_ms[i] * k + co[c]->bwd_ms[i]) / (k + 1);
        }
}

/* What one device of a profile_type run is told (launch_ranks' cmd). */
typedef struct type_run {
    const popts *o;
    const char *worker, *name;
    const job_device *d;
    char (*out)[PATH_LEN + 16];
} type_run;

static void type_cmd(void *ctx, int i, wcmd_argv *a, wcmd_argv *env) {
    const type_run *t = ctx;
    const popts *o = t->o;
    wcmd_argv_add(a, "%s", t->worker);
    wcmd_argv_add(a, "profile");
    wcmd_argv_add(a, "--model"), wcmd_argv_add(a, "%s", o->model);
    if (o->seq) wcmd_argv_add(a, "--seq"), wcmd_argv_add(a, "%ld", o->seq);
    wcmd_argv_add(a, "--precision"), wcmd_argv_add(a, "%s", o->precision);
    wcmd_argv_add(a, "--device"), wcmd_argv_add(a, "cpu");
    wcmd_argv_add(a, "--threads"), wcmd_argv_add(a, "%d", t->d->threads);
    wcmd_argv_add(a, "--memory"), wcmd_argv_add(a, "%lld", (long long)t->d->memory_bytes);
    wcmd_argv_add(a, "--max-micro"), wcmd_argv_add(a, "%ld", o->max_micro);
    wcmd_argv_add(a, "--name"), wcmd_argv_add(a, "%s", t->name);
    if (o->quick) wcmd_argv_add(a, "--min-time-ms"), wcmd_argv_add(a, "20");
    if (i > 0) wcmd_argv_add(a, "--quiet"); /* one device's progress lines are enough */
    wcmd_argv_add(a, "-o"), wcmd_argv_add(a, "%s", t->out[i]);
    wcmd_env e; /* alone: no rendezvous */
    wcmd_env_init(&e, 0, 1, NULL, 0);
    launch_env(&e, NULL, env);
}

/* The compute profile of one device type, measured on `count` devices at once (so that the
 * devices share the machine's cores, caches and memory bandwidth as they do in training), the
 * mean of their medians; merged into p. */
static int profile_type(const popts *o, const char *worker, const job_device *d, int count, const char *tmp, int step,
                        int steps, profile *p) {
    char name[40], human[32];
    snprintf(name, sizeof name, "cpu-%dt", d->threads);
    str_bytes((double)d->memory_bytes, human, sizeof human);
    fprintf(stderr, "cephalo profile: [%d/%d] compute: %s on %s (%d thread%s, %s memory), microbatch 1..%ld, %d device%s at once\n",
            step, steps, o->model, name, d->threads, d->threads == 1 ? "" : "s", human, o->max_micro, count,
            count == 1 ? "" : "s");
    type_run t = {o, worker, name, d, xcalloc((size_t)count, sizeof *t.out)};
    for (int i = 0; i < count; i++) snprintf(t.out[i], sizeof t.out[i], "%s.%d", tmp, i);
    err_t err;
    int bad, st, rc = launch_ranks(count, type_cmd, &t, &bad, &st, &err);
    if (rc < 0) rc = failed("%s", err.msg);
    else if (rc) rc = failed("profiling %s on %s failed (exit %d)", o->model, name, st);
    profile sum = {0};
    for (int i = 0; i < count && !rc; i++) {
        profile one;
        if (profile_load_file(t.out[i], &one, &err) < 0) {
            rc = failed("%s", err.msg);
            break;
        }
        if (i == 0) sum = one;
        else accumulate(&sum.entries[0], &one.entries[0], i), profile_free(&one);
    }
    for (int i = 0; i < count; i++) unlink(t.out[i]);
    if (!rc) profile_merge(p, &sum);
    profile_free(&sum);
    free(t.out);
    return rc;
}

/* What one rank of the collectives' profile is told (launch_ranks' cmd). */
typedef struct comm_run {
    const popts *o;
    const char *worker, *tmp;
    int world, port;
} comm_run;

static void comm_cmd(void *ctx, int r, wcmd_argv *a, wcmd_argv *env) {
    const comm_run *c = ctx;
    wcmd_argv_add(a, "%s", c->worker);
    wcmd_argv_add(a, "profile-comm");
    wcmd_argv_add(a, "--max-bytes"), wcmd_argv_add(a, "%s", c->o->comm_max[0] ? c->o->comm_max : "4M");
    wcmd_argv_add(a, "--reps"), wcmd_argv_add(a, "%s", c->o->quick ? "3" : "9");
    wcmd_argv_add(a, "-o"), wcmd_argv_add(a, "%s", c->tmp);
    wcmd_env e;
    wcmd_env_init(&e, r, c->world, "127.0.0.1", c->port);
    launch_env(&e, (char *const[]){"OMP_NUM_THREADS=1", NULL}, env);
}

/* The collectives over `world` ranks into tmp; merged into p. */
static int run_comm_profile(const popts *o, const char *worker, int world, const char *tmp, int step, int steps,
                            profile *p) {
    err_t err;
    comm_run c = {o, worker, tmp, world, launch_free_port(&err)};
    if (c.port < 0) return failed("%s", err.msg);
    fprintf(stderr, "cephalo profile: [%d/%d] collectives: allgather and reduce-scatter over %d ranks, even and uneven shards\n",
            step, steps, world);
    int bad, st, rc = launch_ranks(world, comm_cmd, &c, &bad, &st, &err);
    if (rc < 0) return failed("%s", err.msg);
    if (rc) return failed("profiling the collectives failed (rank %d: exit %d)", bad, st);
    profile one;
    if (profile_load_file(tmp, &one, &err) < 0) return failed("%s", err.msg);
    profile_merge(p, &one);
    profile_free(&one);
    unlink(tmp);
    return 0;
}

/* The median over the steps after the warm-up of the slowest rank's step time (ms), or -1 when
 * some rank logged none. The rank logs are removed either way. */
static double measured_step_ms(const char *tmp, int world, int warmup) {
    double worst = 0;
    bool all = true;
    for (int r = 0; r < world; r++) {
        char path[PATH_LEN + 32];
        snprintf(path, sizeof path, "%s.rank%d.jsonl", tmp, r);
        FILE *f = fopen(path, "r");
        double t[512];
        int n = 0, line = 0;
        char buf[4096];
        while (f && fgets(buf, sizeof buf, f) && n < 512) {
            const char *k = strstr(buf, "\"step_ms\":");
            if (k && line++ >= warmup) t[n++] = strtod(k + 10, NULL);
        }
        if (f) fclose(f);
        unlink(path);
        if (n == 0) {
            all = false;
            continue;
        }
        qsort(t, (size_t)n, sizeof *t, cmp_ms);
        worst = fmax(worst, n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2);
    }
    return all ? worst : -1;
}

/* The plan a step check runs: the devices, the profile just measured, a small batch. */
static int step_check_plan(const popts *o, const job *j, profile *p, long batch, const char *path, double *pred_ms,
                           recompute_mode *rec, err_t *err) {
    plan_inputs in = {0};
    if (model_resolve(o->model, &in.model, err) < 0 || job_cluster(j, &in.cl, err) < 0) return -1;
    in.prof = *p; /* borrowed: have_prof is cleared before inputs_free */
    in.have_prof = true;
    snprintf(in.prof_source, sizeof in.prof_source, "the profile being measured");
    inputs_opts io = {.batch = batch, .seq = o->seq, .prec = o->prec, .mem_cap = INPUTS_MEM_CAP,
                      .no_store = true};
    plan pl;
    int rc = inputs_build(&in, &io, err);
    bool made = rc == 0 && plan_make(&in.cm, STRAT_CEPHALO, &pl, err) == 0;
    if (rc == 0 && !made) rc = -1;
    if (made && !pl.feasible) rc = err_set(err, "no feasible plan for batch %ld: %s", io.batch, pl.reason);
    if (made && rc == 0 && pl.n_ranks != j->n_devices) /* rec has one entry per device */
        rc = err_set(err, "the plan for batch %ld has %d ranks for %d devices", io.batch, pl.n_ranks, j->n_devices);
    if (made && rc == 0) {
        *pred_ms = pl.iter_ms;
        for (int r = 0; r < pl.n_ranks; r++) rec[r] = pl.ranks[r].recompute; /* the worker takes only its plan's */
        rc = inputs_save_plan(&pl, path, err);
    }
    if (made) plan_free(&pl);
    in.have_prof = false;
    inputs_free(&in);
    return rc;
}

/* Steps of one step check run (each batch runs twice). */
static int check_steps(const popts *o) { return o->quick ? 8 : 24; }

/* What one rank of a step check run is told (launch_ranks' cmd): `cephalo-worker train` from the
 * one builder (common/worker_cmd.h), as a job would start it, on synthetic tokens. */
typedef struct check_run {
    const popts *o;
    const char *worker, *tmp, *plan;
    int world, port, steps;
    recompute_mode *rec;
} check_run;

static void check_cmd(void *ctx, int r, wcmd_argv *a, wcmd_argv *env) {
    const check_run *c = ctx;
    wcmd_train t;
    wcmd_train_defaults(&t);
    t.steps = c->steps, t.data = "synthetic", t.prec = c->o->prec, t.recompute = c->rec[r];
    wcmd_argv_add(a, "%s", c->worker);
    wcmd_train_argv(&t, a);
    wcmd_argv_add(a, "--quiet");
    wcmd_argv_add(a, "--log"), wcmd_argv_add(a, "%s.rank%d.jsonl", c->tmp, r);
    wcmd_env e;
    wcmd_env_init(&e, r, c->world, "127.0.0.1", c->port);
    e.plan = c->plan;
    launch_env(&e, NULL, env);
}

/* One step check run: `cephalo-worker train` on the devices at this global batch, planned from
 * the profile being measured: the plan's predicted and the run's measured step time (ms). */
static int step_check_run(const popts *o, const char *worker, const job *j, profile *p, long batch, const char *tmp,
                          double *pred, double *meas) {
    err_t err;
    int world = j->n_devices;
    char plan_path[PATH_LEN + 16];
    snprintf(plan_path, sizeof plan_path, "%s.plan.json", tmp);
    recompute_mode *rec = xcalloc((size_t)world, sizeof *rec);
    /* --quick (`cephalo run`'s profile): 6 steps measured after the 2 a run's summary leaves out
     * too, in each of two runs (run_step_check); the median of 4 in one run (as before) moved its
     * scale by tens of percent on a loaded host */
    check_run c = {o, worker, tmp, plan_path, world, 0, check_steps(o), rec};
    int bad, st, rc = 0;
    if (step_check_plan(o, j, p, batch, plan_path, pred, rec, &err) < 0) rc = failed("step check: %s", err.msg);
    else if ((c.port = launch_free_port(&err)) < 0) rc = failed("%s", err.msg);
    else if ((rc = launch_ranks(world, check_cmd, &c, &bad, &st, &err)) < 0) rc = failed("%s", err.msg);
    else if (rc) rc = failed("the step check failed (rank %d: exit %d)", bad, st);
    free(rec);
    unlink(plan_path);
    *meas = measured_step_ms(tmp, world, o->quick ? 2 : 4);
    if (rc) return rc;
    return *meas < 0 ? failed("the step check wrote no step times") : 0;
}

/* The step check: short training runs on these devices at two batches (one sample per device,
 * and --check-batch: by default four per device; `cephalo run` gives the job's own, so that the
 * line is fitted where the plan will run), planned from the profile just measured, against the
 * plans' predictions. A line
 * through both, measured = step_overhead_ms + step_scale x predicted, is recorded in every entry:
 * the planner scales their times and adds the overhead to each step (docs/profile.md). What it
 * corrects is what per-unit timing leaves out: the host's other load and the devices contending
 * for its cores (a scale), a step's fixed bookkeeping (an overhead). */
static int run_step_check(const popts *o, const char *worker, const job *j, int step, int steps, const char *tmp,
                          profile *p) {
    int world = j->n_devices;
    long b[2] = {world, o->check_batch ? o->check_batch : 4L * world}; /* parse: > world */
    double pred[2], meas[2], runs[2][2];
    fprintf(stderr, "cephalo profile: [%d/%d] step check: %d training steps at batch %ld and %ld on the %d devices, "
                    "twice each\n", step, steps, check_steps(o), b[0], b[1], world);
    /* Each batch runs twice, interleaved, and the faster run counts: a host whose other load
     * comes and goes for seconds slowed a single check by 30% (622 ms a step, where the run that
     * followed took 491), and a slowdown rarely covers both runs, seconds apart. */
    for (int round = 0; round < 2; round++)
        for (int k = 1; k >= 0; k--) {
            int rc = step_check_run(o, worker, j, p, b[k], tmp, &pred[k], &runs[k][round]);
            if (rc) return rc;
        }
    for (int k = 0; k < 2; k++) meas[k] = fmin(runs[k][0], runs[k][1]);
    double scale = pred[1] > pred[0] ? (meas[1] - meas[0]) / (pred[1] - pred[0]) : 0, over;
    /* clamped as the profile file bounds them: then the overhead fits the larger batch */
    if (!(scale >= PROFILE_MIN_STEP_SCALE)) scale = fmax(meas[1] / pred[1], PROFILE_MIN_STEP_SCALE);
    scale = fmin(scale, PROFILE_MAX_STEP_SCALE);
    over = meas[1] - scale * pred[1];
    if (over < 0) over = 0, scale = fmin(fmax(meas[1] / pred[1], PROFILE_MIN_STEP_SCALE), PROFILE_MAX_STEP_SCALE);
    for (int i = 0; i < p->n_entries; i++) p->entries[i].step_scale = scale, p->entries[i].step_overhead_ms = over;
    fprintf(stderr, "cephalo profile: step check: measured %.2f and %.2f ms per step (runs: %.2f, %.2f and %.2f, %.2f) "
                    "against %.2f and %.2f predicted: times scaled by %.3f, %.2f ms added per step\n", meas[0], meas[1],
            runs[0][0], runs[0][1], runs[1][0], runs[1][1], pred[0], pred[1], scale, over);
    return 0;
}

/* Merges p into the store (created when missing). */
static int merge_store(const char *path, const profile *p) {
    profile st = {0};
    err_t err;
    if (access(path, F_OK) == 0 && profile_load_file(path, &st, &err) < 0)
        return failed("the profile store cannot be read: %s (move it away, or --store another file)", err.msg);
    int before = st.n_entries + st.n_comm;
    int replaced = profile_merge(&st, p);
    int rc = profile_save(&st, path, &err);
    if (rc == 0)
        fprintf(stderr, "cephalo profile: merged into the profile store %s (%d new, %d replaced; %d entries, %d collectives)\n",
                path, st.n_entries + st.n_comm - before, replaced, st.n_entries, st.n_comm);
    profile_free(&st);
    return rc < 0 ? failed("%s", err.msg) : 0;
}

/* The outputs checked against the inputs: 0, or the exit status of the refusal, said. */
static int check_outputs(const popts *o, const char *store) {
    err_t err;
    /* -o and the store (read, then rewritten) must not replace the model file or each other */
    out_set outs = out_begin("cephalo profile");
    out_input_path(&outs, "--model", o->model, &out_hf_input);
    out_file(&outs, o->store ? "--store" : "the profile store", store);
    out_file(&outs, "-o", o->out);
    int rc = out_check(&outs, &err);
    out_free(&outs);
    return rc < 0 ? args_bad_cmd("cephalo profile", "%s", err.msg) : 0;
}

/* The inputs checked before any worker starts: the model and --seq, the devices, the options that
 * need two of them, --check-batch, the store (its path into store) and the outputs. 0, or the
 * exit status of the refusal, said. */
static int check_inputs(const popts *o, job *j, char store[PATH_LEN], bool *use_store) {
    err_t err;
    model_spec model;
    int seq;
    if (model_resolve(o->model, &model, &err) < 0) return args_bad_cmd("cephalo profile", "--model: %s", err.msg);
    if (model_check_seq(&model, (int)o->seq, &seq, &err) < 0) return args_bad_cmd("cephalo profile", "--seq: %s", err.msg);
    if (job_set_devices(j, o->devices, &err) < 0) return args_bad_cmd("cephalo profile", "%s", err.msg);
    const args_only only[] = {{O_COMMMAX, j->n_devices > 1, "two or more --devices (one device has no collectives to time)",
                               ARGS_LEAVE_OUT}};
    if (args_check_only(&o->cl, only, 1)) return ARGS_BAD;
    if (o->check_batch && o->check_batch <= j->n_devices)
        return args_bad_cmd("cephalo profile", "--check-batch %ld: expected more than the %d devices (the step check's "
                            "smaller batch is one sample per device)", o->check_batch, j->n_devices);
    int found = o->store ? 0 : profile_store_path(store, PATH_LEN, &err);
    if (found < 0) return args_bad_cmd("cephalo profile", "%s", err.msg);
    *use_store = o->store ? strcmp(o->store, "none") != 0 : found > 0;
    if (o->store && *use_store && str_fmt(store, PATH_LEN, &err, "--store", "%s", o->store) < 0)
        return args_bad_cmd("cephalo profile", "%s", err.msg);
    if (!o->out && !*use_store) return args_bad_cmd("cephalo profile", "%s", "nothing to write: give -o FILE, or a profile store");
    return check_outputs(o, *use_store ? store : NULL);
}

/* One compute profile per distinct thread count (the device type the planner looks up), with the
 * most memory any device of that type has. */
static job_device *device_types(const job *j, int *n_types) {
    job_device *types = xcalloc((size_t)j->n_items, sizeof *types);
    int n = 0;
    for (int i = 0; i < j->n_items; i++) {
        int k = 0;
        while (k < n && types[k].threads != j->items[i].threads) k++;
        if (k == n) types[n] = j->items[i], types[n++].count = 0;
        else if (j->items[i].memory_bytes > types[k].memory_bytes) types[k].memory_bytes = j->items[i].memory_bytes;
        types[k].count += j->items[i].count;
    }
    *n_types = n;
    return types;
}

/* The measurements in order, with progress: each device type, the collectives, the step check. */
static int measure(const popts *o, const char *worker, const job *j, double t0, profile *p) {
    int n_types, rc = 0;
    job_device *types = device_types(j, &n_types);
    int world = j->n_devices, steps = n_types + (world > 1) + 1;
    /* the workers' files are TMP.N, TMP.rankR.jsonl and TMP.plan.json: their buffers hold those */
    char tmp[PATH_LEN];
    err_t err;
    if (str_fmt(tmp, sizeof tmp, &err, "$TMPDIR: the path", "%s/cephalo-profile-%d.json",
                getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid()) < 0) {
        free(types);
        return failed("%s", err.msg);
    }
    for (int k = 0; k < n_types && !rc; k++) {
        rc = profile_type(o, worker, &types[k], types[k].count, tmp, k + 1, steps, p);
        if (!rc) {
            char el[48], eta[48];
            double s = clock_now_s() - t0;
            fmt_duration(s, el, sizeof el);
            fmt_duration(s / (k + 1) * (steps - k - 1), eta, sizeof eta);
            fprintf(stderr, "cephalo profile: [%d/%d] done in %s | ETA %s\n", k + 1, steps, el, eta);
        }
    }
    if (!rc && world > 1) rc = run_comm_profile(o, worker, world, tmp, steps - 1, steps, p);
    /* the measurements so far stand on their own: a failed step check only leaves its term out */
    if (!rc && run_step_check(o, worker, j, steps, steps, tmp, p) != 0)
        fprintf(stderr, "cephalo profile: warning: the step check failed (above); the profile is written "
                        "without step_scale and step_overhead_ms\n");
    unlink(tmp);
    free(types);
    return rc;
}

int profile_main(int argc, char **argv) {
    popts o = {.precision = wcmd_defaults[WCMD_PRECISION].value, .prec = wcmd_default_precision(), .max_micro = 8};
    int rc = parse(argc, argv, &o);
    if (rc) return rc;
    job j;
    memset(&j, 0, sizeof j);
    char store[PATH_LEN], worker[PATH_LEN];
    bool use_store = false;
    err_t err;
    profile p = {0};
    rc = check_inputs(&o, &j, store, &use_store);
    if (!rc && launch_find_worker(worker, false, &err) < 0) rc = failed("%s", err.msg);
    double t0 = clock_now_s();
    if (!rc) rc = measure(&o, worker, &j, t0, &p);
    if (!rc && o.out && profile_save(&p, o.out, &err) < 0) rc = failed("%s", err.msg);
    if (!rc && o.out)
        fprintf(stderr, "cephalo profile: wrote %s (%d entr%s, %d collectives) in %.1f s\n", o.out, p.n_entries,
                p.n_entries == 1 ? "y" : "ies", p.n_comm, clock_now_s() - t0);
    if (!rc && use_store) rc = merge_store(store, &p);
    profile_free(&p);
    job_free(&j);
    return rc;
}
