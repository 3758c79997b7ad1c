/* run.h - `cephalo run JOB.yaml` (docs/run.md): plans a job on the local devices, starts one
 * `cephalo-worker train` per device with the environment a pod would get (docs/architecture.md,
 * "Contracts"), shows one progress view over all ranks, and stops the whole gang when one worker
 * fails or on Ctrl-C. */
#ifndef CEPHALO_RUN_H
#define CEPHALO_RUN_H

#include <stdbool.h>

#include "cli/job.h"
#include "cli/launch.h"
#include "common/err.h"
#include "common/exitcode.h"
#include "common/outputs.h"
#include "common/worker_cmd.h"

typedef struct run_opts {
    const char *job; /* the job file */
    const char *devices; /* --devices: replaces the job's devices; NULL: the job's */
    const char *run_dir; /* --run-dir; NULL: runs/NAME */
    long steps; /* --steps; 0: the job's */
    bool dry_run; /* plan and print the worker command lines, start nothing */
    bool quiet; /* no plan table, no progress lines */
    bool no_profile; /* --no-profile: no profiling before planning (cli/profile_cache.h) */
    bool overwrite; /* --overwrite: the workers may delete another run's checkpoints (docs/run.md) */
    bool have_metrics_port; /* --metrics-port BASE given: replaces the job's metrics_port */
    long metrics_port;
} run_opts;

/* A run directory's own files (plan.json, rank-R.jsonl, ...): what `cephalo report` reads and
 * must not write over. */
extern const out_kind run_dir_kind;

/* Runs the job to its end. Returns the exit status: 0 done, 1 a worker failed, 2 bad input,
 * 3 infeasible plan, 130 interrupted (SIGINT, SIGTERM or SIGHUP). Messages go to stderr, the
 * plan and the summary to stdout. */
int run_job(const run_opts *o);

/* The arguments every rank's `cephalo-worker train` gets from job j (common/worker_cmd.h's
 * builder; the operator's pods get theirs from the same one), with the run's checkpoint directory
 * (NULL: none), --overwrite and the rank's recompute mode (its plan rank's); appended to *out. The
 * launcher adds --log and the metrics flags. */
void run_worker_argv(const job *j, const char *ckpt_dir, bool overwrite, recompute_mode rec, wcmd_argv *out);

#endif
