/* train.c - `cephalo-worker train`: one rank of a training job (docs/architecture.md, "Contracts", docs/worker.md).
 *
 * RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and CEPHALO_PLAN come from the environment, as with
 * torchrun-launched programs; the options' defaults are common/worker_cmd.c's table, the one
 * `cephalo run` and the operator build this command line from. Exit codes: worker_cmd.h. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cmd/cmd.h"
#include "cmd/metrics.h"
#include "comm/comm.h"
#include "common/args.h"
#include "common/ckpt_dir.h"
#include "common/ckpt_keep.h"
#include "common/env.h"
#include "common/fileio.h"
#include "common/log.h"
#include "common/outputs.h"
#include "common/strutil.h"
#include "common/worker_cmd.h"
#include "formats/data.h"
#include "model/eval.h"
#include "model/import.h"
#include "model/train.h"
#include "planner/arch.h"
#include "state/ckpt.h"
#include "state/ckpt_resume.h"
#include "state/dump.h"
#include "state/mtok.h"
#include "state/plan_read.h"

_Static_assert(EXIT_STOPPED == 128 + SIGTERM, "the stopped status is the shell's for SIGTERM");

/* SIGTERM or SIGINT while training: finish the step, checkpoint it together with the other ranks
 * (the request rides on the step's loss all-reduce: train.h) and exit EXIT_STOPPED. Before the
 * training loop (set-up, the rendezvous) the signal keeps its default action. */
static volatile sig_atomic_t stop_signal, training;

static void on_stop_signal(int sig) {
    if (!training) {
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    stop_signal = sig;
}

static void catch_stop_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
}

/* The usage; its defaults come from common/worker_cmd.c's table (usage(), in WCMD order). */
#define USAGE_FMT \
    "usage: cephalo-worker train [--plan PLAN.json | --model MODEL --batch B [--microbatch M]]\n" \
    "                            [options]\n" \
    "\n" \
    "train: trains one rank. The plan (--plan, or $CEPHALO_PLAN) gives the model, the global\n" \
    "batch and this rank's batch, microbatches, memory and threads; without a plan, --model and\n" \
    "--batch describe a single-rank job. $RANK and $WORLD_SIZE select the rank (default 0 of 1).\n" \
    "  --model MODEL        built-in model or model file (cephalo models)\n" \
    "  --batch B            global batch (samples per step)\n" \
    "  --microbatch M       samples per microbatch (default B); B/M microbatches per step\n" \
    "  --seq T              sequence length (default: the model's)\n" \
    "  --data SPEC          the training data (required): token shards (file, directory, glob,\n" \
    "                       comma list; a directory's validation shards are left out), a CIMG\n" \
    "                       image file for ViT, or 'synthetic' (random tokens: only by name)\n" \
    "  --init-from DIR      start from a Hugging Face model directory (config.json and\n" \
    "                       model.safetensors or its sharded index; GPT-2 and Llama): each rank\n" \
    "                       reads only its own slices (docs/import.md). Without --plan/--model,\n" \
    "                       the model is DIR's config.json; with them it must be the same model\n" \
    "  --allow-unused-weights  load --init-from's files (or --resume's checkpoint) although they\n" \
    "                       hold tensors the model does not use (a config with fewer layers than\n" \
    "                       the weights): a warning names them; without it they are an error\n" \
    "  --steps N            total steps (default %s); 0: the initial weights saved as checkpoint\n" \
    "                       step 0 (with --ckpt-dir), e.g. to export them\n" \
    "  --epochs N           instead of --steps: every training sample N times, ceil(N x samples\n" \
    "                       / global batch) steps (printed at the start; the schedule's length)\n" \
    "  --lr X               peak learning rate (default %s)\n" \
    "  --schedule S         after the warmup: cosine or linear from lr down to --min-lr, or\n" \
    "                       constant (lr throughout); default %s\n" \
    "  --min-lr X           final learning rate of the cosine or linear decay (default lr/10)\n" \
    "  --warmup N           linear warmup steps (default %s)\n" \
    "  --weight-decay X     AdamW decay on matrices (default %s)\n" \
    "  --beta1 X --beta2 X --eps X   AdamW (default %s, %s, %s)\n" \
    "  --clip X             global gradient-norm clip, 0 = off (default %s)\n" \
    "  --seed N             initialisation and data order (default %s)\n" \
    "  --threads N          CPU threads (default: the plan's, else all cores)\n" \
    "  --memory SIZE        device memory, e.g. 2G (default: the plan's; else none on the CPU,\n" \
    "                       the GPU's free memory on CUDA)\n" \
    "  --device cpu|cuda    the device (default: the plan's device type: cpu, or cuda for GPUs;\n" \
    "                       else cpu); cuda needs cephalo-worker-cuda\n" \
    "  --gpu N              the GPU (default: $LOCAL_RANK, else RANK, modulo the visible GPUs)\n" \
    "  --precision P        fp32 (TF32 matmuls on CUDA sm_80+), or bf16 / fp16 mixed precision:\n" \
    "                       16-bit matmul operands and parameter gathers, fp32 master weights,\n" \
    "                       moments and gradient reductions; fp16 adds dynamic loss scaling\n" \
    "                       (default: the plan's, else %s; the CPU emulates both exactly);\n" \
    "                       with a plan, only the plan's is accepted\n" \
    "  --loss-scale S       fp16: the initial loss scale, a power of two (default %s)\n" \
    "  --loss-scale-window N  fp16: clean steps in a row that double the scale (default %s);\n" \
    "                       a non-finite gradient on any rank skips the step and halves it\n" \
    "  --offload on|off     unit-boundary checkpoints in host memory (on, default) or device\n" \
    "  --accumulate layered|per-micro  gradient accumulation: every unit gathered and reduced\n" \
    "                       once per step (layered, default) or once per microbatch\n" \
    "  --recompute none|full  full: the backward recomputes each unit's forward from its\n" \
    "                       checkpoint; none: the forward keeps every unit's intermediates of\n" \
    "                       the step (or microbatch) on the device (default: the plan's rank's,\n" \
    "                       else %s); with a plan, only its rank's is accepted\n" \
    "  --sync-micro         finish each microbatch's compute before queueing the next\n" \
    "  --ckpt-dir DIR       write checkpoints there (step_NNNNNNNN.safetensors + 'latest'); one\n" \
    "                       training at a time per directory (DIR/.lock)\n" \
    "  --ckpt-every N       checkpoint every N steps (default: only at the end)\n" \
    "  --keep-last N        keep the newest N good checkpoints in DIR, 0 = all (default: what\n" \
    "                       DIR/retention.json keeps, else %s); one written while the loss is\n" \
    "                       above the divergence bound does not count, nor is ever kept over\n" \
    "                       the newest good one\n" \
    "  --keep-every K       also keep every checkpoint whose step is a multiple of K (default:\n" \
    "                       what DIR/retention.json keeps, else %s); both are kept there\n" \
    "  --resume WHAT        continue from a checkpoint: 'auto' (the newest complete one in\n" \
    "                       --ckpt-dir, if any), a checkpoint, a checkpoint directory (its\n" \
    "                       newest), DIR/latest, or 'none' (start afresh); default %s\n" \
    "  --overwrite          allow writing over checkpoints in --ckpt-dir beyond the starting\n" \
    "                       step (another run's): they are deleted at the start\n" \
    "  --diverge-steps N    stop (exit 1) when the loss stays above 2 x ln(vocabulary) for N\n" \
    "                       steps in a row: diverged; 0 = never (default %s)\n" \
    "  --val-data SPEC      validation data (as --data): the validation loss of a fixed set of\n" \
    "                       samples, the same whatever the plan, in the log, progress and metrics\n" \
    "  --val-every N        evaluate every N steps and after the last (default: steps/10, at\n" \
    "                       most 100); 0: after the last step only\n" \
    "  --val-samples N      validation samples (default %s; at most what --val-data holds)\n" \
    "  --log FILE           JSON lines: one object per step\n" \
    "  --dump DIR           oracle dump for tests (docs/worker-model.md)\n" \
    "  --quiet              no progress lines\n" \
    "  --metrics-port N     serve /metrics and /healthz on port N, 0 = off (default:\n" \
    "                       $CEPHALO_METRICS_PORT, else the plan's metrics_port + RANK, else off)\n" \
    "  --metrics-addr ADDR  the address to listen on (default 0.0.0.0; docs/metrics.md)\n"

#define D(k) wcmd_defaults[k].value
static const char *usage(void) {
    static char text[8192];
    snprintf(text, sizeof text, USAGE_FMT, D(WCMD_STEPS), D(WCMD_LR), D(WCMD_SCHEDULE), D(WCMD_WARMUP),
             D(WCMD_WEIGHT_DECAY), D(WCMD_BETA1), D(WCMD_BETA2), D(WCMD_EPS), D(WCMD_CLIP), D(WCMD_SEED),
             D(WCMD_PRECISION), D(WCMD_LOSS_SCALE), D(WCMD_LOSS_SCALE_WINDOW), D(WCMD_RECOMPUTE), D(WCMD_KEEP_LAST), D(WCMD_KEEP_EVERY), D(WCMD_RESUME),
             D(WCMD_DIVERGE_STEPS), D(WCMD_VAL_SAMPLES));
    return text;
}
#undef D

typedef struct worker_opts {
    const char *plan, *model, *log, *dump, *metrics_addr;
    long batch, micro, seq, ckpt_every, metrics_port; /* metrics_port -1: not given */
    long diverge_steps;
    ckpt_opts ck; /* --ckpt-dir, --resume, --overwrite, --keep-last, --keep-every */
    eval_opts val; /* --val-data, --val-every, --val-samples */
    bool quiet, have_threads, have_memory, have_gpu;
    const char *device;
    precision prec;
    bool have_prec; /* --precision given (else the plan's, else fp32) */
    recompute_mode recompute;
    bool have_recompute; /* --recompute given (else the plan's rank's, else the table's) */
    train_config cfg;
    args cl; /* the command line as parsed: which options were given (check_idle_options) */
} worker_opts;

/* The loss scale multiplies the loss and divides the gradient: a power of two keeps both exact. */
static int power_of_two(const args *p, double *out) {
    int e;
    if (!str_to_double(p->val, out) || !(*out >= 0x1p-24 && *out <= 0x1p64) || frexp(*out, &e) != 0.5)
        return args_bad(p, "%s: '%s' is not a power of two in [2^-24, 2^64] (e.g. 65536)", p->opt, p->val);
    return 0;
}

enum {
    O_PLAN = 256, O_MODEL, O_BATCH, O_MICRO, O_SEQ, O_DATA, O_STEPS, O_LR, O_MINLR, O_WARMUP, O_WD, O_B1, O_B2,
    O_EPS, O_CLIP, O_SEED, O_THREADS, O_MEMORY, O_CKDIR, O_CKEVERY, O_RESUME, O_LOG, O_DUMP, O_QUIET, O_DEVICE,
    O_GPU, O_PRECISION, O_OFFLOAD, O_ACCUM, O_SYNCMICRO, O_MPORT, O_MADDR, O_OVERWRITE, O_KEEPLAST, O_KEEPEVERY,
    O_DIVERGE, O_LSCALE, O_LWINDOW, O_SCHEDULE, O_INITFROM, O_VALDATA, O_VALEVERY, O_VALSAMPLES, O_UNUSED,
    O_RECOMPUTE, O_EPOCHS
};

static const struct option train_longopts[] = {
    {"plan", 1, 0, O_PLAN},       {"model", 1, 0, O_MODEL},     {"batch", 1, 0, O_BATCH},
    {"microbatch", 1, 0, O_MICRO}, {"seq", 1, 0, O_SEQ},        {"data", 1, 0, O_DATA},
    {"schedule", 1, 0, O_SCHEDULE},
    {"steps", 1, 0, O_STEPS},     {"lr", 1, 0, O_LR},           {"min-lr", 1, 0, O_MINLR},
    {"warmup", 1, 0, O_WARMUP},   {"weight-decay", 1, 0, O_WD}, {"beta1", 1, 0, O_B1},
    {"beta2", 1, 0, O_B2},        {"eps", 1, 0, O_EPS},         {"clip", 1, 0, O_CLIP},
    {"seed", 1, 0, O_SEED},       {"threads", 1, 0, O_THREADS}, {"memory", 1, 0, O_MEMORY},
    {"ckpt-dir", 1, 0, O_CKDIR},  {"ckpt-every", 1, 0, O_CKEVERY},
    {"resume", 1, 0, O_RESUME},   {"log", 1, 0, O_LOG},         {"dump", 1, 0, O_DUMP},
    {"quiet", 0, 0, O_QUIET},     {"device", 1, 0, O_DEVICE},   {"gpu", 1, 0, O_GPU},
    {"precision", 1, 0, O_PRECISION}, {"offload", 1, 0, O_OFFLOAD},
    {"accumulate", 1, 0, O_ACCUM}, {"sync-micro", 0, 0, O_SYNCMICRO}, {"recompute", 1, 0, O_RECOMPUTE},
    {"metrics-port", 1, 0, O_MPORT}, {"metrics-addr", 1, 0, O_MADDR},
    {"overwrite", 0, 0, O_OVERWRITE}, {"keep-last", 1, 0, O_KEEPLAST},
    {"keep-every", 1, 0, O_KEEPEVERY}, {"diverge-steps", 1, 0, O_DIVERGE},
    {"loss-scale", 1, 0, O_LSCALE}, {"loss-scale-window", 1, 0, O_LWINDOW},
    {"init-from", 1, 0, O_INITFROM}, {"allow-unused-weights", 0, 0, O_UNUSED}, {"val-data", 1, 0, O_VALDATA},
    {"val-every", 1, 0, O_VALEVERY}, {"val-samples", 1, 0, O_VALSAMPLES}, {"epochs", 1, 0, O_EPOCHS},
    {"help", 0, 0, 'h'},          {0, 0, 0, 0}};

/* What the job is: its model and batch (or its plan), data, device and precision. */
static int job_option(args *p, int ch, worker_opts *o) {
    train_config *c = &o->cfg;
    const char *v;
    switch (ch) {
    case O_PLAN: o->plan = p->val; break;
    case O_MODEL: o->model = p->val; break;
    case O_BATCH: return args_long(p, 1, 1 << 20, &o->batch);
    case O_MICRO: return args_long(p, 1, 1 << 20, &o->micro);
    case O_SEQ: return args_long(p, 1, 1 << 20, &o->seq);
    case O_DATA: c->data = p->val; break;
    case O_INITFROM: return args_dir(p, &c->init_from);
    case O_UNUSED: c->allow_unused = true; break;
    case O_VALDATA: o->val.data = p->val; break;
    case O_VALEVERY: return args_long(p, 0, 1L << 40, &o->val.every);
    case O_VALSAMPLES: return args_long(p, 1, 1L << 30, &o->val.samples);
    case O_SEED: {
        int64_t seed = 0;
        int rc = args_int64(p, 0, INT64_C(1) << 62, &seed);
        c->seed = (uint64_t)seed;
        return rc;
    }
    case O_THREADS: return o->have_threads = true, args_int(p, 1, 4096, &c->threads);
    case O_MEMORY: return o->have_memory = true, args_size(p, &c->memory_bytes);
    case O_DEVICE: return args_choice(p, cmd_devices, &o->device);
    case O_GPU: return o->have_gpu = true, args_int(p, 0, 1023, &c->gpu);
    case O_PRECISION:
        o->have_prec = true;
        return args_choice(p, precision_names, &v) ? ARGS_BAD : (precision_parse(v, &o->prec), 0);
    default: return -1; /* not this group's */
    }
    return 0;
}

/* How it trains: the optimizer, its schedule and the engine's modes. */
static int optimizer_option(args *p, int ch, worker_opts *o) {
    train_config *c = &o->cfg;
    const char *v;
    switch (ch) {
    case O_STEPS: return args_int64(p, 0, INT64_C(1) << 40, &c->steps);
    case O_EPOCHS: return args_long(p, 1, 1L << 20, &c->epochs);
    case O_LR: return args_double(p, 0, 10, &c->lr);
    case O_MINLR: return args_double(p, 0, 10, &c->min_lr);
    case O_SCHEDULE:
        return args_choice(p, schedule_names, &v) ? ARGS_BAD : (schedule_parse(v, &c->schedule), 0);
    case O_WARMUP: return args_int64(p, 0, INT64_C(1) << 40, &c->warmup);
    case O_WD: return args_double(p, 0, 10, &c->weight_decay);
    case O_B1: return args_double(p, 0, 0.999999, &c->beta1);
    case O_B2: return args_double(p, 0, 0.999999, &c->beta2);
    case O_EPS: return args_double(p, 1e-30, 1, &c->eps);
    case O_CLIP: return args_double(p, 0, 1e9, &c->clip);
    case O_LSCALE: return power_of_two(p, &c->loss_scale);
    case O_LWINDOW: return args_int64(p, 1, INT64_C(1) << 40, &c->loss_scale_window);
    case O_OFFLOAD:
        return args_choice(p, (const char *const[]){"on", "off", NULL}, &v) ? ARGS_BAD : (c->no_offload = !strcmp(v, "off"), 0);
    case O_ACCUM:
        return args_choice(p, (const char *const[]){"layered", "per-micro", NULL}, &v)
                   ? ARGS_BAD : (c->per_micro = !strcmp(v, "per-micro"), 0);
    case O_SYNCMICRO: c->sync_micro = true; break;
    case O_RECOMPUTE:
        o->have_recompute = true;
        return args_choice(p, (const char *const[]){"none", "full", NULL}, &v) ? ARGS_BAD : (recompute_parse(v, &o->recompute), 0);
    case O_DIVERGE: return args_long(p, 0, 1L << 40, &o->diverge_steps);
    default: return -1;
    }
    return 0;
}

/* What it writes: checkpoints, logs, dumps, metrics. */
static int output_option(args *p, int ch, worker_opts *o) {
    switch (ch) {
    case O_CKDIR: {
        err_t e; /* refused here, before the directory is made and the ranks meet */
        if (ckpt_dir_check_len(p->val, "--ckpt-dir", &e) < 0) return args_bad(p, "%s", e.msg);
        o->ck.dir = p->val;
        break;
    }
    case O_CKEVERY: return args_long(p, 1, 1L << 40, &o->ckpt_every);
    case O_RESUME: o->ck.resume = p->val; break;
    case O_OVERWRITE: o->ck.overwrite = true; break;
    case O_KEEPLAST: return args_long(p, 0, 1L << 40, &o->ck.keep.keep_last);
    case O_KEEPEVERY: return args_long(p, 0, 1L << 40, &o->ck.keep.keep_every);
    case O_LOG: o->log = p->val; break;
    case O_DUMP: o->dump = p->val; break;
    case O_QUIET: o->quiet = true; break;
    case O_MPORT: return args_long(p, 0, 65535, &o->metrics_port);
    case O_MADDR: o->metrics_addr = p->val; break;
    }
    return 0;
}

static int parse_train(int argc, char **argv, worker_opts *o) {
    args p = args_begin(argc, argv, WORKER_NAME " train", train_longopts, "", usage());
    int ch = 0, rc = 0;
    while (!rc && (ch = args_next(&p)) > 0)
        if ((rc = job_option(&p, ch, o)) < 0 && (rc = optimizer_option(&p, ch, o)) < 0) rc = output_option(&p, ch, o);
    if (rc || ch < 0 || args_no_operands(&p)) return ARGS_BAD;
    o->cl = p;
    return 0;
}

/* Options that act only in some modes, refused where they would do nothing (args_check_only):
 * checked once the plan has said the precision and the device. */
static int check_idle_options(const worker_opts *o) {
    const train_config *c = &o->cfg;
    char fp16[128], cuda[96];
    snprintf(fp16, sizeof fp16, "--precision fp16 (the precision here is %s%s)", precision_name(c->prec),
             o->have_prec ? "" : o->plan ? ", the plan's" : ", the default");
    snprintf(cuda, sizeof cuda, "--device cuda (the device here is %s)", c->device);
    err_t ignored; /* a bad port or plan is said where the metrics start */
    bool serving = metrics_worker_port(o->metrics_port, o->plan, c->rank, &ignored) != 0;
    bool ckpt = o->ck.dir != NULL, val = o->val.data != NULL;
    const args_only rows[] = {
        {O_LSCALE, c->prec == PREC_FP16, fp16, ARGS_LEAVE_OUT},
        {O_LWINDOW, c->prec == PREC_FP16, fp16, ARGS_LEAVE_OUT},
        {O_MINLR, c->schedule != SCHED_CONSTANT, "--schedule cosine or linear (constant keeps --lr throughout)",
         ARGS_GIVE_OR_LEAVE},
        {O_CKEVERY, ckpt, "--ckpt-dir", ARGS_GIVE_OR_LEAVE},
        {O_KEEPLAST, ckpt, "--ckpt-dir", ARGS_GIVE_OR_LEAVE},
        {O_KEEPEVERY, ckpt, "--ckpt-dir", ARGS_GIVE_OR_LEAVE},
        {O_OVERWRITE, ckpt, "--ckpt-dir (it is about the checkpoints there)", ARGS_LEAVE_OUT},
        {O_VALEVERY, val, "--val-data (the validation data)", ARGS_GIVE_OR_LEAVE},
        {O_VALSAMPLES, val, "--val-data (the validation data)", ARGS_GIVE_OR_LEAVE},
        {O_GPU, !strcmp(c->device, "cuda"), cuda, ARGS_LEAVE_OUT},
        {O_MADDR, serving, "a metrics port (--metrics-port, $CEPHALO_METRICS_PORT or the plan's metrics_port)",
         ARGS_GIVE_OR_LEAVE},
    };
    return args_check_only(&o->cl, rows, sizeof rows / sizeof rows[0]);
}

/* $RANK, $WORLD_SIZE, $LOCAL_RANK: torchrun's, not CEPHALO_* switches (common/env.h) */
static int rank_var(const char *name, int dflt, int lo, int hi, int *out) {
    const char *s = getenv(name);
    long v = dflt;
    if (s && *s && (!str_to_long(s, &v) || v < lo || v > hi))
        return args_bad_cmd(WORKER_NAME, "$%s is '%s', expected an integer in [%d, %d]", name, s, lo, hi);
    *out = (int)v;
    return 0;
}

/* tests: $CEPHALO_TEST_NONFINITE=STEP[:RANK] makes rank RANK's (default 0) gradient inf at STEP,
 * the overflow an fp16 run meets (docs/worker.md). */
static int inject_from_env(train_config *c) {
    const char *s;
    err_t err;
    long st, rk;
    if (env_text("CEPHALO_TEST_NONFINITE", &s, &err) < 0) return args_bad_cmd(WORKER_NAME, "%s", err.msg);
    if (!s) return 0;
    CHECK(env_step_rank(s, &st, &rk)); /* the row's form, which env_text checked */
    if (rk > INT_MAX) return args_bad_cmd(WORKER_NAME, "$CEPHALO_TEST_NONFINITE is '%s': rank %ld does not exist", s, rk);
    c->inject_nonfinite_step = st, c->inject_nonfinite_rank = (int)rk;
    return 0;
}

/* $CEPHALO_PLAN: NULL when unset or empty */
static const char *plan_from_env(void) {
    const char *p;
    env_text("CEPHALO_PLAN", &p, NULL); /* checked at start (env_entry) */
    return p;
}

/* ---- outputs never land on inputs (common/outputs.h) ---- */

static bool resumes_from_path(const char *r) { return r && strcmp(r, "auto") && strcmp(r, "none") && strcmp(r, "never"); }

/* Every input (plan, model file, each data file, the weights and the checkpoint started from)
 * against every output (the log, the dump, the checkpoint directory's files): refused, exit 2. */
static int check_outputs(const worker_opts *o) {
    out_set s = out_begin(WORKER_NAME " train");
    out_input(&s, o->plan ? "--plan" : "$CEPHALO_PLAN", o->plan ? o->plan : plan_from_env());
    out_input_path(&s, "--model", o->model, &out_hf_input);
    data_spec_inputs(&s, "--data", o->cfg.data);
    data_spec_inputs(&s, "--val-data", o->val.data);
    out_input_path(&s, "--init-from", o->cfg.init_from, &out_hf_input);
    if (resumes_from_path(o->ck.resume)) out_input_path(&s, "--resume", o->ck.resume, &ckpt_dir_kind);
    out_file(&s, "--log", o->log);
    out_dir(&s, "--dump", o->dump, &dump_dir_kind);
    out_dir(&s, "--ckpt-dir", o->ck.dir, &ckpt_dir_kind);
    err_t err;
    int rc = out_check(&s, &err);
    out_free(&s);
    return rc < 0 ? (fprintf(stderr, WORKER_NAME ": %s\n", err.msg), EXIT_BAD_INPUT) : 0;
}

/* Fills the config from the plan or from --model/--batch. */
/* --precision and --recompute beside a plan: the plan's memory (and its engine switches, checked
 * next) were counted at its precision and this rank's recompute mode, so an option that says
 * otherwise would train another job than the one planned. The same value is accepted (the front
 * ends pass them on), another is refused naming both. */
static int agrees_with_plan(const worker_opts *o, int rank) {
    const train_config *c = &o->cfg;
    if (o->have_prec && o->prec != c->prec)
        return args_bad_cmd(WORKER_NAME, "--precision %s: the plan %s was made for %s (give %s, or plan again with --precision %s)",
                            precision_name(o->prec), o->plan, precision_name(c->prec), precision_name(c->prec), precision_name(o->prec));
    if (o->have_recompute && o->recompute != c->recompute)
        return args_bad_cmd(WORKER_NAME, "--recompute %s: the plan %s has rank %d recompute %s (give %s, or plan again with --recompute %s)",
                            recompute_name(o->recompute), o->plan, rank, recompute_name(c->recompute),
                            recompute_name(c->recompute), recompute_name(o->recompute));
    return 0;
}

static int resolve_job(worker_opts *o) {
    train_config *c = &o->cfg;
    err_t err;
    int rank, world;
    if (rank_var("RANK", 0, 0, 1 << 20, &rank) || rank_var("WORLD_SIZE", 1, 1, 1 << 20, &world))
        return EXIT_BAD_INPUT;
    /* the switches the memory model reads ($CEPHALO_ACTS), checked as the planner checks them */
    if (engine_env_check(&err) < 0) return args_bad_cmd(WORKER_NAME, "%s", err.msg);
    if (!o->plan) o->plan = plan_from_env();
    if (o->plan && *o->plan) {
        if (o->model || o->batch || o->micro || o->seq)
            return args_bad_cmd(WORKER_NAME, "%s", "--model/--batch/--microbatch/--seq come from the plan; give one or the other");
        int threads = c->threads;
        int64_t mem = c->memory_bytes;
        if (plan_read(o->plan, rank, world, c, &err) < 0) return args_bad_cmd(WORKER_NAME, "%s", err.msg);
        int rc = agrees_with_plan(o, rank);
        if (rc) return rc;
        if (c->have_plan_engine) { /* the plan's memory counts its planner's switches (at the
                                    * plan's precision): this worker's must agree */
            engine_switches here = engine_switches_of(&c->model, c->prec);
            if (engine_switches_check(&c->plan_engine, &here, &err) < 0)
                return args_bad_cmd(WORKER_NAME, "%s: %s", o->plan, err.msg);
        }
        if (o->have_threads) c->threads = threads;
        if (o->have_memory) c->memory_bytes = mem;
    } else {
        if (!o->model) o->model = c->init_from; /* the model its config.json describes */
        /* name what is missing: with --init-from the model is known, only the batch is not */
        if (!o->model) return args_bad_cmd(WORKER_NAME, "%s", "give --plan PLAN.json (or $CEPHALO_PLAN), --model and --batch, or --init-from DIR and --batch");
        if (!o->batch)
            return args_bad_cmd(WORKER_NAME, "give --batch B (samples per step) for %s %s, or --plan PLAN.json",
                                o->model == c->init_from ? "--init-from's model" : "--model", o->model);
        if (world != 1) return args_bad_cmd(WORKER_NAME, "WORLD_SIZE is %d: a multi-rank job needs a plan", world);
        bool from_hf = o->model == c->init_from;
        if ((from_hf ? model_load_hf_config(o->model, &c->model, &err) : model_resolve(o->model, &c->model, &err)) < 0)
            return args_bad_cmd(WORKER_NAME, "%s: %s", from_hf ? "--init-from" : "--model", err.msg);
        int seq;
        if (model_check_seq(&c->model, (int)o->seq, &seq, &err) < 0) return args_bad_cmd(WORKER_NAME, "--seq: %s", err.msg);
        c->seq = arch_of(c->model.arch)->images ? 0 : seq;
        long m = o->micro ? o->micro : o->batch;
        if (o->batch % m) return args_bad_cmd(WORKER_NAME, "--batch %ld is not a multiple of --microbatch %ld", o->batch, m);
        c->global_batch = c->batch = (int)o->batch;
        c->micro = (int)m, c->micros = (int)(o->batch / m);
    }
    if (c->init_from && hf_import_check_model(c->init_from, &c->model, &err) < 0)
        return args_bad_cmd(WORKER_NAME, "--init-from: %s", err.msg);
    if (o->device) c->device = o->device;
    if (o->have_prec) c->prec = o->prec;
    if (o->have_recompute) c->recompute = o->recompute;
    if (!c->device) c->device = "cpu";
    /* tests: run the staged-collective path (the cuda device's with the socket backend) on CPU */
    int stage = env_flag("CEPHALO_STAGE_HOST", &err);
    /* the optimizer's launches ($CEPHALO_ADAMW, model/train.h), to compare on a GPU */
    int adamw = stage < 0 ? -1 : env_choice("CEPHALO_ADAMW", &err);
    if (adamw < 0) return args_bad_cmd(WORKER_NAME, "%s", err.msg);
    c->stage_host = stage == 1;
    c->adamw = (adamw_mode)adamw; /* the row's choices are in the enum's order */
    int rc = inject_from_env(c);
    if (rc) return rc;
    if (!strcmp(c->device, "cuda") && !o->have_gpu) {
        int local, n = device_cuda_count();
        if (rank_var("LOCAL_RANK", rank, 0, 1 << 20, &local)) return EXIT_BAD_INPUT;
        c->gpu = n > 0 ? local % n : 0;
    }
    if (!c->data) /* never a silent synthetic run: a fine-tune without --data would learn noise */
        return args_bad_cmd(WORKER_NAME, "give --data SPEC, the training data: token shards (cephalo data), a "
                                         "CIMG image file for ViT, or 'synthetic' for random tokens%s",
                            c->init_from ? " (nothing else fine-tunes --init-from's model)" : "");
    if (args_given(&o->cl, O_STEPS) && args_given(&o->cl, O_EPOCHS))
        return args_bad_cmd(WORKER_NAME, "--steps and --epochs: give one (--epochs sets the steps from the data's size)");
    if (!c->epochs && wcmd_check_warmup((long)c->warmup, (long)c->steps, "--warmup", "--steps", &err) < 0)
        return args_bad_cmd(WORKER_NAME, "%s", err.msg); /* --epochs: checked once its steps are known (model/train.c) */
    return check_idle_options(o);
}

/* ---- progress and logs ---- */

static void fmt_duration(double s, char *buf, size_t n) {
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else snprintf(buf, n, "%ld:%02ld", t / 60, t % 60);
}

static void progress(const trainer *t, const step_stats *st, double avg_ms) {
    char eta[32], peak[32], scale[96] = "", val[48] = "", loss[64];
    fmt_duration(avg_ms / 1e3 * (double)(t->cfg.steps - st->step - 1), eta, sizeof eta);
    str_bytes((double)st->peak_bytes, peak, sizeof peak);
    if (t->cfg.prec == PREC_FP16)
        snprintf(scale, sizeof scale, " | scale %g%s", st->loss_scale,
                 st->skipped ? " (gradient not finite: step skipped)" : "");
    if (st->has_val) snprintf(val, sizeof val, " | val %.4f", st->val_loss);
    if (st->empty) snprintf(loss, sizeof loss, "- (no target: update skipped)");
    else snprintf(loss, sizeof loss, "%.4f", st->loss);
    fprintf(stderr,
            "step %lld/%lld | loss %s%s | lr %.2e | norm %.3f%s | %.0f tok/s | %.1f samples/s | "
            "%.0f ms | peak %s | ETA %s\n",
            (long long)st->step + 1, (long long)t->cfg.steps, loss, val, st->lr, st->grad_norm,
            scale, st->tokens_per_s, st->samples_per_s, st->step_ms, peak, eta);
}

static long long peak_rss_bytes(void) {
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? (long long)ru.ru_maxrss * 1024 : -1;
}

/* A JSON number, or null for inf and NaN (an fp16 step's overflowed gradient norm). */
static const char *json_num(double v, char *buf, size_t n) {
    if (!isfinite(v)) return "null";
    snprintf(buf, n, "%.9g", v);
    return buf;
}

/* ,"val_loss":X,"val_ppl":Y on the steps the validation loss was computed after (eval.h) */
static const char *val_fields(const step_stats *st, char *buf, size_t n) {
    char loss[32], ppl[32];
    if (!st->has_val) return "";
    snprintf(buf, n, ",\"val_loss\":%s,\"val_ppl\":%s", json_num(st->val_loss, loss, sizeof loss),
             json_num(exp(st->val_loss), ppl, sizeof ppl));
    return buf;
}

static void log_step(FILE *f, const trainer *t, const step_stats *st) {
    char loss[32], norm[32], val[96];
    fprintf(f,
            "{\"step\":%lld,\"loss\":%s,\"lr\":%.9g,\"grad_norm\":%s,\"step_ms\":%.3f,"
            "\"tokens_per_s\":%.1f,\"samples_per_s\":%.3f,\"peak_bytes\":%lld,\"rss_peak_bytes\":%lld,"
            "\"rank\":%d,\"world\":%d,\"gathers\":%lld,\"reduce_scatters\":%lld,\"allreduces\":%lld,"
            "\"bytes_sent\":%lld,\"comm_wait_ms\":%.3f,\"host_syncs\":%lld,\"loss_scale\":%.9g,"
            "\"skipped\":%s,\"targets\":%.0f%s}\n",
            (long long)st->step, json_num(st->loss, loss, sizeof loss), st->lr, json_num(st->grad_norm, norm, sizeof norm), st->step_ms, st->tokens_per_s,
            st->samples_per_s, (long long)st->peak_bytes, peak_rss_bytes(), t->cfg.rank,
            t->cfg.world, (long long)st->gathers, (long long)st->reduce_scatters,
            (long long)st->allreduces, (long long)st->bytes_sent, st->comm_wait_ms,
            (long long)st->host_syncs, st->loss_scale,
            st->skipped || st->empty ? "true" : "false", st->targets, val_fields(st, val, sizeof val));
    fflush(f);
}

/* ---- checkpoints ---- */

/* The loss above which training has diverged: twice that of guessing uniformly among the
 * model's outputs, where a fresh model starts (docs/worker.md). */
static double divergence_bound(const model_spec *m) {
    int outputs = arch_of(m->arch)->images ? m->n_classes : m->vocab;
    return 2 * log(outputs > 1 ? outputs : 2);
}

/* After a divergence: the checkpoint to go back to, the newest written before the loss rose
 * (retention never deletes it), and how. */
static void say_last_good(const char *dir) {
    char name[64];
    err_t err;
    int have = dir ? ckpt_keep_last_good(dir, name, sizeof name, &err) : 0;
    if (have < 0) fprintf(stderr, "cephalo-worker: %s\n", err.msg);
    else if (have == 0)
        fprintf(stderr, "cephalo-worker: no checkpoint from before the divergence to go back to%s\n",
                dir ? " in the checkpoint directory" : " (no --ckpt-dir)");
    else
        fprintf(stderr, "cephalo-worker: the last checkpoint before the divergence is %s/%s; go back to it with "
                "--resume %s/%s --overwrite (which deletes the checkpoints written after it) and a lower --lr; "
                "in a job file: checkpoint.resume and `cephalo run --overwrite`\n", dir, name, dir, name);
}

/* ---- a loss that is not finite, a loss too high from the start ---- */

/* Where the weights this run started from came from, for a message. */
static void weights_source(const trainer *t, const worker_opts *o, int64_t first, char *buf, size_t n) {
    if (first > 0) snprintf(buf, n, "the checkpoint of step %lld it resumed from", (long long)first);
    else if (o->cfg.init_from) snprintf(buf, n, "--init-from %s", o->cfg.init_from); /* a message: may be cut */
    else snprintf(buf, n, "a fresh initialization (--seed %llu)", (unsigned long long)t->cfg.seed);
}

static const char *loss_word(double loss) { return isnan(loss) ? "nan" : loss > 0 ? "inf" : "-inf"; }

/* What can be known. Before the first update of this run (trainer.updates_run 0: the first step,
 * or fp16 steps skipped since) the learning rate cannot be the cause: the forward pass overflowed
 * on the weights it started from and the data; the likely causes follow, most likely first. After
 * updates, the weights say whether one of them made the weights non-finite. Every rank says it
 * (the loss and the weights' figures are the job's, all-reduced). */
static void say_nonfinite_loss(trainer *t, const worker_opts *o, const step_stats *st, int64_t first) {
    weight_stats ws;
    err_t err;
    char from[512], weights[sizeof err.msg + 64];
    weights_source(t, o, first, from, sizeof from);
    if (trainer_weight_stats(t, &ws, &err) < 0) snprintf(weights, sizeof weights, "they could not be read (%s)", err.msg);
    else if (ws.nonfinite) snprintf(weights, sizeof weights, "%lld of them are not finite", (long long)ws.nonfinite);
    else snprintf(weights, sizeof weights, "all finite, the largest magnitude %.3g", ws.max_abs);
    bool fp16 = t->cfg.prec == PREC_FP16;
    if (t->updates_run > 0) {
        fprintf(stderr, "cephalo-worker: step %lld: the loss is %s; stopping. The weights after %lld update%s of this run: "
                "%s%s (lower --lr?%s)\n", (long long)st->step, loss_word(st->loss), (long long)t->updates_run,
                t->updates_run == 1 ? "" : "s", weights, ws.nonfinite ? ": an update made them so" : "",
                fp16 ? " or train in bf16, which has fp32's range" : "");
        return;
    }
    char causes[900];
    int k = 0, len = 0;
    if (ws.nonfinite)
        len += snprintf(causes + len, sizeof causes - (size_t)len, " %d. the weights themselves;", ++k);
    if (fp16)
        len += snprintf(causes + len, sizeof causes - (size_t)len, " %d. fp16's range (65504) in the forward pass: train "
                        "in bf16 (--precision bf16), which has fp32's range;", ++k);
    if (!ws.nonfinite)
        len += snprintf(causes + len, sizeof causes - (size_t)len, " %d. weights too large for the forward pass (the "
                        "largest is %.3g): are they this model's, at its scale?;", ++k, ws.max_abs);
    snprintf(causes + len, sizeof causes - (size_t)len, " %d. the data of the first batch (--data %s)", ++k,
             o->cfg.data ? o->cfg.data : "synthetic"); /* a message: may be cut */
    fprintf(stderr, "cephalo-worker: step %lld: the loss is %s before any update of this run, so the learning rate is "
            "not the cause: the forward pass gave it on the weights this run started from (%s: %s) and the data. "
            "The likely causes, in order:%s\n", (long long)st->step, loss_word(st->loss), from, weights, causes);
}

/* ---- train ---- */

/* Every rank agreed to stop after this step: its checkpoint (unless just written), then out. */
static int stop_now(trainer *t, const worker_opts *o, metrics *m, bool saved, bool diverged) {
    err_t err;
    const char *why = stop_signal == SIGINT ? "SIGINT" : stop_signal ? "SIGTERM" : "a peer's SIGTERM";
    if (o->ck.dir && !saved) {
        if (ckpt_checkpoint(t, &o->ck, diverged, &err) < 0) return fprintf(stderr, "cephalo-worker: %s\n", err.msg), EXIT_FAILED;
        metrics_checkpoint(m, t->step);
    }
    metrics_fail(m, "stopped on request");
    fprintf(stderr, "cephalo-worker: rank %d: stopped after step %lld on %s%s\n", t->cfg.rank, (long long)t->step,
            why, o->ck.dir ? ", with a checkpoint of that step" : " (no --ckpt-dir: nothing saved)");
    return EXIT_STOPPED;
}

static int run_training(trainer *t, const worker_opts *o, FILE *log, dumper *dp, metrics *m, evaluator *ev) {
    err_t err;
    double total_ms = 0;
    int64_t first = t->step, last_print = -1;
    time_t last_time = 0;
    long above = 0; /* steps in a row above the bound */
    double first_loss = 0; /* this run's first step's: no update had touched its weights */
    double bound = divergence_bound(&t->cfg.model);
    t->stop_request = &stop_signal;
    training = 1;
    while (t->step < t->cfg.steps) {
        step_stats st;
        /* a step fails on bad data (a token beyond the vocabulary, a label out of range) or
         * when a collective fails (a peer died or stalled) */
        if (trainer_step(t, &st, &err) < 0) {
            metrics_fail(m, err.msg);
            fprintf(stderr, "cephalo-worker: %s\n", err.msg);
            return t->comm_failed ? EXIT_FAILED : EXIT_BAD_INPUT;
        }
        if (st.empty) { /* said even when quiet: the data has a batch with nothing to learn */
            if (t->cfg.rank == 0)
                fprintf(stderr, "cephalo-worker: step %lld: no target of the global batch (%d samples of %s) counts (every "
                                "loss-mask byte of its targets is 0): no loss, and the update is skipped (no optimizer step, "
                                "no weight decay); the step and the learning-rate schedule advance\n",
                        (long long)st.step, t->cfg.global_batch, o->cfg.data);
        } else if (!isfinite(st.loss)) {
            metrics_fail(m, "the loss is not finite");
            say_nonfinite_loss(t, o, &st, first);
            return EXIT_FAILED;
        }
        if (st.step == first) first_loss = st.loss;
        if (!st.empty) above = st.loss > bound ? above + 1 : 0; /* an empty step leaves the count as it was */
        if (o->diverge_steps && above >= o->diverge_steps && above == st.step - first + 1) {
            /* above the bound since this run's first step, whose loss no update had touched */
            char from[512];
            weights_source(t, o, first, from, sizeof from);
            metrics_fail(m, "the loss was too high from the start");
            fprintf(stderr, "cephalo-worker: step %lld: the loss has been above %.2f (twice the loss of a uniform guess) "
                    "since the first step of this run (%.4g there, before any update), so the learning rate is not the "
                    "cause: the weights it started from (%s) do not fit this data (another model's weights? data of "
                    "another kind?); stopping (--diverge-steps 0 turns this check off)\n",
                    (long long)st.step, bound, first_loss, from);
            return EXIT_FAILED;
        }
        if (o->diverge_steps && above >= o->diverge_steps) {
            metrics_fail(m, "the loss diverged");
            fprintf(stderr, "cephalo-worker: step %lld: the loss diverged: %.4g, above %.2f (twice the loss of a uniform guess) "
                    "for %ld steps in a row; stopping (lower --lr, keep --clip on; --diverge-steps 0 turns this check off)\n",
                    (long long)st.step, st.loss, bound, above);
            if (t->cfg.rank == 0) say_last_good(o->ck.dir);
            return EXIT_FAILED;
        }
        total_ms += st.step_ms;
        /* the dump first: evaluation overwrites the gradients it records */
        if (dp && dump_after_step(dp, t, st.loss, st.loss_scale, &err) < 0) return fprintf(stderr, "cephalo-worker: %s\n", err.msg), EXIT_FAILED;
        if ((st.has_val = eval_due(ev, t)) && eval_loss(ev, t, &st.val_loss, &err) < 0) {
            metrics_fail(m, err.msg);
            fprintf(stderr, "cephalo-worker: %s\n", err.msg);
            return t->comm_failed ? EXIT_FAILED : EXIT_BAD_INPUT;
        }
        /* the log says null; say why (a set with nothing to score was refused at the start) */
        if (st.has_val && !isfinite(st.val_loss) && t->cfg.rank == 0)
            fprintf(stderr, "cephalo-worker: validation after step %lld: the loss is %g, not a finite number: the forward "
                            "overflowed at --precision %s\n", (long long)st.step, st.val_loss, precision_name(t->cfg.prec));
        metrics_record_step(m, t, &st);
        if (log) log_step(log, t, &st);
        time_t now = time(NULL);
        /* at most a line a second, but never without a validation loss: it is rare and worth seeing */
        if (!o->quiet && (now != last_time || t->step == t->cfg.steps || last_print < 0 || st.has_val)) {
            progress(t, &st, total_ms / (double)(t->step - first));
            last_time = now, last_print = st.step;
        }
        bool ckpt = o->ck.dir && ((o->ckpt_every && t->step % o->ckpt_every == 0) || t->step == t->cfg.steps);
        if (ckpt && ckpt_checkpoint(t, &o->ck, above > 0, &err) < 0) return fprintf(stderr, "cephalo-worker: %s\n", err.msg), EXIT_FAILED;
        if (ckpt) metrics_checkpoint(m, t->step);
        if (t->stop_agreed && t->step < t->cfg.steps) return stop_now(t, o, m, ckpt, above > 0); /* the last step: done anyway */
    }
    return 0;
}

/* The model's tokenizer (state/mtok.h): --init-from's tokenizer.json, else the checkpoint resumed
 * from's (the one it records, with the file kept beside it), else the shards' own (with `cephalo
 * data`'s tokenizer.json beside them). Resuming with --init-from, the two must agree. Data written
 * with another tokenizer is refused here, before the first step; the one found is recorded in
 * every checkpoint and kept in the checkpoint directory. */
static int setup_tokenizer(const trainer *t, const worker_opts *o, mtok *out, const char **out_from, err_t *err) {
    mtok model = {0}, resumed = {0};
    const char *from = "--init-from";
    if (o->cfg.init_from && mtok_from_dir(o->cfg.init_from, &model, err) < 0) return -1;
    if (t->step > 0) {
        char path[PATH_MAX];
        const char *ck = resumes_from_path(o->ck.resume) ? o->ck.resume : o->ck.dir;
        if (ck && ckpt_dir_resolve(ck, path, sizeof path, err) == 0 &&
            mtok_for_checkpoint(path, t->resumed_tok, &resumed, err) < 0)
            return -1;
        if (model.id.kind && resumed.id.kind && !tok_id_equal(model.id, resumed.id)) {
            char a[TOK_ID_NAME_MAX], b[TOK_ID_NAME_MAX];
            tok_id_name(model.id, a);
            tok_id_name(resumed.id, b);
            return err_set(err, "--init-from %s has tokenizer %s (%s), but the checkpoint resumed from was trained with "
                                "%s: not the same model's text", o->cfg.init_from, a, model.path, b);
        }
        if (!model.id.kind) model = resumed, from = "the checkpoint resumed from";
    }
    if (mtok_check_vocab(&model, t->cfg.model.vocab, "the model", err) < 0) return -1;
    const char *shard = NULL;
    tok_id data = t->data ? data_tokenizer(t->data, &shard) : (tok_id){0};
    if (mtok_check_data(&model, from, data, shard, err) < 0) return -1;
    if (!model.id.kind && data.kind) {
        char dir[PATH_MAX];
        mtok beside;
        mtok_data_dir(o->cfg.data, dir, sizeof dir);
        if (mtok_from_dir(dir, &beside, err) < 0) return -1;
        model = tok_id_equal(beside.id, data) ? beside : (mtok){.id = data};
        from = "the training shards'";
    }
    *out = model;
    *out_from = from;
    ckpt_set_tokenizer(model.id);
    return o->ck.dir && t->cfg.rank == 0 ? mtok_keep(&model, o->ck.dir, err) : 0;
}

/* One rank's training once the job is resolved (and, across ranks, the communicator open). */
static int train_rank(worker_opts o) {
    int rc = 0;
    err_t err;
    if (o.ck.dir && file_make_dir(o.ck.dir, true, &err) < 0) return args_bad_cmd(WORKER_NAME, "--ckpt-dir: %s", err.msg);
    trainer *t = trainer_new(&o.cfg, &err);
    if (!t) return fprintf(stderr, "cephalo-worker: %s\n", err.msg), EXIT_BAD_INPUT;
    int lock = -1;
    if ((rc = ckpt_start(t, &o.ck, o.quiet, &lock, &err)) < 0) {
        trainer_free(t);
        ckpt_finish(lock);
        fprintf(stderr, "cephalo-worker: %s%s\n", rc == CKPT_REFUSED ? "" : "resume: ", err.msg);
        return rc == CKPT_REFUSED ? EXIT_BAD_INPUT : EXIT_FAILED;
    }
    mtok model_tok;
    const char *tok_from = NULL;
    if (setup_tokenizer(t, &o, &model_tok, &tok_from, &err) < 0) {
        trainer_free(t);
        ckpt_finish(lock);
        fprintf(stderr, "cephalo-worker: %s\n", err.msg);
        return EXIT_BAD_INPUT;
    }
    if (t->cfg.steps == 0 && t->step == 0) { /* the initial weights as checkpoint step 0 (to export them) */
        if (o.ck.dir && ckpt_checkpoint(t, &o.ck, false, &err) < 0) rc = (fprintf(stderr, "cephalo-worker: %s\n", err.msg), EXIT_FAILED);
        else if (!o.quiet || !o.ck.dir)
            fprintf(stderr, "cephalo-worker: --steps 0: nothing trained; %s%s\n",
                    o.ck.dir ? "the initial weights are checkpoint step_00000000 in " : "give --ckpt-dir to keep the "
                    "initial weights", o.ck.dir ? o.ck.dir : "");
    } else if (t->step >= t->cfg.steps) { /* said even when quiet: the run does nothing */
        fprintf(stderr, "cephalo-worker: nothing to train: the checkpoint resumed from is at step %lld, and --steps is %lld "
                "(raise --steps to train further)\n", (long long)t->step, (long long)t->cfg.steps);
    }
    file_out log_out = {.fd = -1};
    FILE *log = NULL;
    if (o.log && (file_out_open(&log_out, o.log, t->step > 0 ? FILE_OUT_APPEND : FILE_OUT_STREAM, &err) < 0 ||
                  !(log = file_out_file(&log_out)))) {
        file_out_abort(&log_out);
        trainer_free(t);
        ckpt_finish(lock);
        return args_bad_cmd(WORKER_NAME, "--log %s", err.msg);
    }
    dumper *dp = o.dump ? dump_open(t, o.dump, &err) : NULL;
    if (o.dump && !dp) rc = (fprintf(stderr, "cephalo-worker: %s\n", err.msg), EXIT_FAILED);
    metrics *m = NULL;
    int mport = rc ? 0 : metrics_worker_port(o.metrics_port, o.plan, t->cfg.rank, &err);
    if (mport < 0) rc = (fprintf(stderr, "cephalo-worker: %s\n", err.msg), EXIT_BAD_INPUT);
    else if (mport > 0 && !(m = metrics_for_trainer(t, o.plan, &err)))
        rc = (fprintf(stderr, "cephalo-worker: %s\n", err.msg), EXIT_BAD_INPUT);
    else if (m && (mport = metrics_serve(m, o.metrics_addr, mport, &err)) < 0)
        rc = (fprintf(stderr, "cephalo-worker: %s\n", err.msg), EXIT_FAILED);
    else if (m && !o.quiet)
        fprintf(stderr, "cephalo-worker: metrics on http://%s:%d/metrics\n",
                o.metrics_addr ? o.metrics_addr : "0.0.0.0", mport);
    if (m && t->step > 0) metrics_checkpoint(m, t->step); /* resumed from it */
    evaluator *ev = rc ? NULL : eval_open(t, &o.val, &err);
    if (!rc && !ev && err.msg[0]) rc = (fprintf(stderr, "cephalo-worker: %s\n", err.msg), EXIT_BAD_INPUT);
    if (!rc && ev) { /* --val-data of another tokenizer: refused like --data */
        const char *shard = NULL;
        tok_id vt = data_tokenizer(eval_source(ev), &shard);
        if (mtok_check_data(&model_tok, tok_from, vt, shard, &err) < 0)
            rc = (fprintf(stderr, "cephalo-worker: --val-data %s\n", err.msg), EXIT_BAD_INPUT);
    }
    if (!rc && !o.quiet) {
        char desc[512], peak[32], host[32];
        data_describe(t->data, desc, sizeof desc);
        fprintf(stderr, "cephalo-worker: rank %d/%d, model %s (%lld parameters), batch %d = %d x %d, "
                        "%d threads\n  data: %s\n  device memory after set-up %s, host offload pool %s\n",
                t->cfg.rank, t->cfg.world, t->cfg.model.name, (long long)model_params(&t->cfg.model),
                t->cfg.batch, t->cfg.micro, t->cfg.micros, t->dev.threads, desc,
                str_bytes((double)t->dev.cur_bytes, peak, sizeof peak),
                str_bytes((double)t->host_bytes, host, sizeof host));
        if (t->cfg.epochs)
            fprintf(stderr, "  --epochs %ld: %lld steps (%lld samples an epoch, %d a step)\n", t->cfg.epochs,
                    (long long)t->cfg.steps, (long long)data_num_samples(t->data), t->cfg.global_batch);
        if (ev) eval_describe(ev, desc, sizeof desc), fprintf(stderr, "  validation: %s\n", desc);
    }
    if (!rc && t->cfg.steps > 0) rc = run_training(t, &o, log, dp, m, ev);
    else metrics_fail(m, "set-up failed");
    if (dp && dump_close(dp, t, &err) < 0 && !rc) rc = (fprintf(stderr, "cephalo-worker: %s\n", err.msg), EXIT_FAILED);
    if (log && file_out_close(&log_out, &err) < 0 && !rc) rc = (fprintf(stderr, WORKER_NAME ": --log %s\n", err.msg), EXIT_FAILED);
    eval_close(ev);
    metrics_free(m);
    trainer_free(t);
    ckpt_finish(lock);
    return rc;
}

int cmd_train(int argc, char **argv) {
    worker_opts o = {.metrics_port = -1, .val.every = -1};
    train_config_defaults(&o.cfg);
    o.diverge_steps = wcmd_default_long(WCMD_DIVERGE_STEPS);
    o.ck.keep = (ckpt_keep){CKPT_KEEP_UNSET, CKPT_KEEP_UNSET}; /* the directory's, else the table's */
    o.ck.resume = wcmd_defaults[WCMD_RESUME].value;
    int rc = parse_train(argc, argv, &o);
    if (rc || (rc = check_outputs(&o)) || (rc = resolve_job(&o))) return train_config_release(&o.cfg), rc;
    catch_stop_signals();
    err_t err;
    comm *c = NULL;
    if (o.cfg.world > 1) {
        comm_config cc;
        if (comm_config_from_env(&cc, o.cfg.rank, o.cfg.world, &err) < 0) {
            train_config_release(&o.cfg);
            return args_bad_cmd(WORKER_NAME, "%s", err.msg);
        }
        if (!(c = comm_open(&cc, &err))) {
            train_config_release(&o.cfg);
            return fprintf(stderr, "cephalo-worker: %s\n", err.msg), EXIT_FAILED;
        }
        o.cfg.comm = c;
    }
    rc = train_rank(o);
    if (c) {
        /* peers then fail at once instead of waiting for the timeout */
        if (rc && rc != EXIT_STOPPED) comm_abort(c, "the rank failed");
        comm_close(c);
    }
    train_config_release(&o.cfg);
    return rc;
}
