/* job.h - the job file of `cephalo run` (docs/run.md): what to train, with which optimizer and
 * checkpoints, on which local devices.
 *
 *   model: tiny-gpt
 *   batch: 16
 *   steps: 100
 *   optimizer: {lr: 1e-3, warmup: 10}
 *   devices:
 *     - {type: cpu, threads: 2, memory: 512M}
 *     - {type: cpu, threads: 1, memory: 256M, count: 2}
 *
 * Input paths in the file (model, data, profile, checkpoint.resume, validation.data) are taken relative to the job
 * file's directory; the checkpoint directory is an output and the launcher places it in the run
 * directory. The devices become a one-node cluster of `cpu` pseudo-devices for the planner. */
#ifndef CEPHALO_JOB_H
#define CEPHALO_JOB_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "common/precision.h"
#include "common/schedule.h"
#include "common/worker_cmd.h"
#include "planner/cluster.h"
#include "planner/model.h"
#include "planner/plan.h"

#define JOB_MAX_DEVICES 256 /* one worker process each, on this machine */
#define JOB_NAME_MAX 63

/* One `devices` item (or one --devices item): `count` identical CPU devices. */
typedef struct job_device {
    int threads;
    int64_t memory_bytes;
    int count;
} job_device;

typedef struct job {
    char *path; /* the job file, for messages */
    char name[JOB_NAME_MAX + 1]; /* `name`, or the file name up to its first '.' */
    model_spec model;
    char *model_arg; /* the model as `cephalo profile --model` takes it: a built-in name or a resolved path */
    /* What the workers are told (common/worker_cmd.h), defaults from its table: steps, seed,
     * precision, the optimizer, data (resolved, or "synthetic"), init_from (a Hugging Face
     * directory, resolved, or NULL), validation (val_data resolved, or NULL), retention and resume
     * ("auto", "never" or a resolved checkpoint; NULL without a checkpoint section). The strings
     * it points to are the job's (job_free frees them); ckpt_dir and overwrite are the launcher's. */
    wcmd_train train;
    char *profile; /* resolved path, or NULL */
    long batch, seq; /* seq 0: the model's */
    /* `epochs` instead of `steps`: train.steps is 0 until the launcher opens the data and sets it
     * (cli/run.c: ceil(epochs x samples / batch)); 0 when the file gives steps */
    long epochs;
    strategy strat;
    recompute_policy recompute; /* `recompute`: auto (the planner's choice per rank), none or full */
    double mem_cap;
    double comm_timeout; /* seconds */
    long metrics_port; /* rank r serves /metrics on metrics_port + r; 0: off (docs/metrics.md) */
    char metrics_addr[64]; /* the address the workers listen on: 127.0.0.1 unless the file says */
    char *ckpt_dir; /* as written (the run directory resolves it), or NULL: no checkpoints */
    int n_items, n_devices; /* device items, and devices after each item's count */
    job_device *items;
    /* lines of fields checked again after command-line overrides (0: absent) */
    int root_line, batch_line, warmup_line;
} job;

/* Parses the job file. Errors read "FILE:LINE: FIELD: what was expected". */
int job_load_file(const char *path, job *out, err_t *err);
/* The same from text in memory (fuzzing, tests); relative paths resolve against ".". On error
 * *out is still to be freed with job_free. */
int job_load_string(const char *name, const char *text, size_t len, job *out, err_t *err);
/* Replaces the devices with a --devices list: "cpu:2t:512M,cpu:1t:256Mx2" (docs/run.md). */
int job_set_devices(job *j, const char *spec, err_t *err);
/* Checks what depends on more than one field, after the command line's overrides: devices
 * present, the batch covers them, warmup below steps. */
int job_check(const job *j, err_t *err);
void job_free(job *j);


/* The devices as a cluster file (one node "local"); the caller frees the text. */
char *job_cluster_yaml(const job *j);
/* ... and loaded as the planner's cluster. */
int job_cluster(const job *j, cluster *out, err_t *err);

#endif
