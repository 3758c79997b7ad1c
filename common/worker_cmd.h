/* worker_cmd.h - `cephalo-worker train`'s command line, built in one place (docs/architecture.md,
 * "Contracts"). A job says what to train in a job file (cli/job.c, for `cephalo run`) or in a
 * CephaloJob's spec (operator/job_spec.c); each front end fills a wcmd_train from it, and
 * wcmd_train_argv turns that into the worker's arguments, so the same job gives the same argv
 * whichever way it was started (tests/unit/test_worker_cmd.c runs one job through both).
 *
 * Every default of those options is in one table, wcmd_defaults: the worker's own defaults
 * (worker/model/train.c, worker/cmd/train.c), the job file's (cli/job.c), the operator's
 * (operator/job_spec.c) and the CRD's `default:` values (checked against it by the same test).
 *
 *   wcmd_train t;
 *   wcmd_train_defaults(&t);               // the table's values
 *   t.steps = 100, t.data = "/data/train";  // what the job says
 *   wcmd_argv a = {0};
 *   wcmd_train_argv(&t, &a);               // "train" "--steps" "100" "--seed" "1" ...
 *   ...a.v[0..a.n-1]...
 *   wcmd_argv_free(&a);
 *
 * Numbers are written as the shortest text that reads back as the same double ("0.0003",
 * "1e-08"), so the worker trains with exactly the value the job gave. */
#ifndef CEPHALO_WORKER_CMD_H
#define CEPHALO_WORKER_CMD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/exitcode.h" /* the worker's statuses, which `cephalo run` and the operator read */
#include "common/precision.h"
#include "common/recompute.h"
#include "common/schedule.h"

/* The options with a default, one row each of wcmd_defaults. */
typedef enum {
    WCMD_STEPS,
    WCMD_SEED,
    WCMD_PRECISION,
    WCMD_LR,
    WCMD_MIN_LR,
    WCMD_SCHEDULE,
    WCMD_WARMUP,
    WCMD_WEIGHT_DECAY,
    WCMD_BETA1,
    WCMD_BETA2,
    WCMD_EPS,
    WCMD_CLIP,
    WCMD_DATA,
    WCMD_VAL_EVERY,
    WCMD_VAL_SAMPLES,
    WCMD_CKPT_EVERY,
    WCMD_KEEP_LAST,
    WCMD_KEEP_EVERY,
    WCMD_RESUME,
    WCMD_DIVERGE_STEPS,
    WCMD_LOSS_SCALE,
    WCMD_LOSS_SCALE_WINDOW,
    WCMD_RECOMPUTE,
    WCMD_N
} wcmd_key;

typedef struct wcmd_default {
    const char *flag;     /* the worker's option: "--lr" */
    const char *value;    /* the default as the worker reads it ("0.0003", "cosine"); NULL: none of
                             its own (derived from other options: `derived` says how) */
    const char *derived;  /* for value NULL: what the worker does instead, for docs and --help */
    const char *job_value; /* a job's default (job files, the CRD) where it differs from the
                              worker's own; NULL: the same */
    const char *job_key;  /* the job file's field (docs/run.md), NULL: not in job files */
    const char *crd_path; /* the CephaloJob's field under spec (crds/), NULL: not in the CRD */
} wcmd_default;

extern const wcmd_default wcmd_defaults[WCMD_N];

/* A job's default of k: job_value, else value (NULL: none). */
const char *wcmd_job_default(wcmd_key k);
/* The default of k as a number (value read with strtod; 0 when it has none). */
double wcmd_default_num(wcmd_key k);
/* ... as a long (steps, counts). */
long wcmd_default_long(wcmd_key k);
/* The worker's --precision and --recompute defaults from the table, as values: what a worker, a
 * plan rank without "recompute" (older plans) and the profilers use when nothing says otherwise. */
precision wcmd_default_precision(void);
recompute_mode wcmd_default_recompute(void);

/* What `cephalo-worker train` is told about a job, whoever read it. Paths are as the worker sees
 * them (inside the pod for the operator, resolved against the job file for `cephalo run`). */
typedef struct wcmd_train {
    long steps;
    uint64_t seed;
    precision prec;
    double lr, min_lr; /* min_lr < 0: lr / 10, written out as that number */
    lr_schedule schedule;
    long warmup;
    double weight_decay, beta1, beta2, eps, clip;
    const char *data;      /* a data spec, or "synthetic" */
    const char *init_from; /* a Hugging Face model directory, or NULL */
    const char *val_data;  /* validation data, or NULL (then val_every and val_samples are unused) */
    long val_every;        /* -1: the worker's default */
    long val_samples;      /* 0: the worker's default */
    const char *ckpt_dir;  /* NULL: no checkpoints (the rest of this group is unused) */
    long ckpt_every;       /* 0: only at the end */
    long keep_last, keep_every; /* -1: not given (the directory's setting, else the table's) */
    const char *resume; /* "auto", "never" or a checkpoint path */
    bool overwrite;     /* --overwrite: `cephalo run --overwrite` */
    recompute_mode recompute; /* this rank's: the plan's ranks[].recompute (the job's `recompute`
                               * field decides how the planner chooses it) */
} wcmd_train;

/* Every field from wcmd_defaults (no validation data, no checkpoints, no init_from). */
void wcmd_train_defaults(wcmd_train *t);

/* The one rule that relates warmup to steps, for every front end: the worker (--warmup against
 * --steps, or against the steps --epochs resolved to), job files (cli/job.c) and CephaloJobs
 * (operator/job_spec.c, so a bad spec is InvalidSpec instead of pods that fail and restart). A
 * warmup must end before the last step: one as long as the run never leaves it (the schedule
 * never decays). 0 when warmup is 0 or below steps; else -1 with "WARMUP_FIELD: N must be below
 * STEPS_FIELD (M): ..." in err, the fields named as the caller's input spells them ("--warmup",
 * "spec.optimizer.warmup"). Call it once steps is known. */
int wcmd_check_warmup(long warmup, long steps, const char *warmup_field, const char *steps_field, err_t *err);

/* A growable NULL-terminated argument vector; every string is owned by it. */
typedef struct wcmd_argv {
    char **v;
    int n;
} wcmd_argv;

/* Appends one argument (printf-style). */
void wcmd_argv_add(wcmd_argv *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void wcmd_argv_free(wcmd_argv *a);
/* The shortest text that reads back as v, at least %g's 6 digits: "60", "0.0003", "1e-08" (buf: 32 bytes). */
const char *wcmd_num(double v, char *buf);

/* A rank's environment (docs/architecture.md, "The worker's environment"), the one builder of
 * every launcher: `cephalo run`'s ranks, `cephalo profile`'s measuring runs and the operator's
 * pods. wcmd_env_init leaves every optional variable out; a launcher sets what it has. */
typedef struct wcmd_env {
    int rank, world;          /* RANK, WORLD_SIZE */
    const char *master_addr;  /* MASTER_ADDR: rank 0's host */
    int master_port;          /* MASTER_PORT: its rendezvous store; 0: none (one rank) */
    const char *plan;         /* CEPHALO_PLAN; NULL: none */
    double comm_timeout;      /* CEPHALO_COMM_TIMEOUT, seconds; 0: none (the worker's default) */
    int local_rank;           /* LOCAL_RANK (the GPU is LOCAL_RANK % GPUs); < 0: none */
    const char *job;          /* CEPHALO_JOB: the metrics' job label; NULL: none */
    const char *job_id;       /* CEPHALO_JOB_ID: the rendezvous admits only its ranks; NULL: none */
    long metrics_port;        /* CEPHALO_METRICS_PORT; < 0: none */
} wcmd_env;

void wcmd_env_init(wcmd_env *e, int rank, int world, const char *master_addr, int master_port);
/* "NAME=VALUE" for each variable e sets, in a fixed order, appended to *out. */
void wcmd_env_entries(const wcmd_env *e, wcmd_argv *out);

/* Appends "train" and the job's options, defaults included, in a fixed order: every setting
 * the worker will use is spelled out, so the command line alone says how a rank trains. The
 * launcher adds its own (--log, --metrics-port, ...) after them. */
void wcmd_train_argv(const wcmd_train *t, wcmd_argv *out);

#endif
