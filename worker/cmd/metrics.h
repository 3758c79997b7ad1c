/* metrics.h - the worker's Prometheus endpoint (docs/metrics.md).
 *
 * A registry the training loop updates after each step, served over HTTP by libmicrohttpd on its
 * own thread: GET /metrics (Prometheus text format 0.0.4) and GET /healthz (200 "ok" while the
 * rank trains, 503 after it failed).
 *
 *   metrics *m = metrics_new(&info);           // labels and the per-rank constants
 *   metrics_serve(m, "0.0.0.0", 9400, &err);   // returns the port bound (port 0: any free one)
 *   metrics_record(m, &step);                  // after every step
 *   metrics_fail(m, "step 12: ...");           // /healthz answers 503 from now on
 *   metrics_free(m);                           // stops the server */
#ifndef CEPHALO_METRICS_H
#define CEPHALO_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "model/train.h"

/* What does not change during a run. */
typedef struct metrics_info {
    const char *job;    /* label job: the job's name */
    int rank;           /* label rank */
    const char *device; /* label device: the plan's device type ("L4", "cpu-2t-0.50g") */
    int batch, microbatch, microbatches; /* this rank's share of the plan */
    double state_ratio;       /* this rank's share of the training state (plan) */
    int64_t capacity_bytes;   /* device memory; 0 = unlimited or unknown: no sample */
    double flops_per_sample;  /* model FLOPs of one sample's forward and backward */
    double peak_flops;        /* the device's peak FLOP/s at the precision used; 0 = no MFU */
    int tokens_per_sample;
} metrics_info;

/* One step of this rank. */
typedef struct metrics_step {
    double step_s, comm_wait_s, offload_s; /* compute = step - comm wait - offload */
    double loss;
    int64_t step;    /* the job's training step after this one (counting steps before a resume) */
    int64_t samples; /* this rank's samples in the step (its batch) */
    int64_t mem_current, mem_peak, mem_state, mem_host; /* bytes: cephalo_memory_bytes{kind} */
    double loss_scale; /* fp16: the scale after this step; 0 = no loss scaling (no samples) */
    bool skipped;      /* fp16: the step was skipped (a gradient was not finite) */
    bool empty;        /* no target of the global batch counted: no loss, no update (train.h) */
    bool has_val;      /* the validation loss was computed after this step (eval.h) */
    double val_loss;
} metrics_step;

typedef struct metrics metrics;

metrics *metrics_new(const metrics_info *info);
/* Stops the server (if any) and frees. NULL is fine. */
void metrics_free(metrics *m);
/* Serves /metrics and /healthz on addr:port (addr: a numeric IPv4/IPv6 address, NULL =
 * 0.0.0.0). Returns the port bound, or -1 with an error naming the address and port. */
int metrics_serve(metrics *m, const char *addr, int port, err_t *err);
void metrics_record(metrics *m, const metrics_step *s);
/* A checkpoint of `step` was written (or resumed from): cephalo_checkpoint_step. */
void metrics_checkpoint(metrics *m, int64_t step);
/* The rank failed: /healthz answers 503 with `why`. */
void metrics_fail(metrics *m, const char *why);
/* The exposition text (what GET /metrics returns); the caller frees it. */
char *metrics_render(metrics *m, size_t *len);

/* ---- the worker's side (train.c) ---- */

/* The port to serve on: `flag` (--metrics-port, -1 = not given), else $CEPHALO_METRICS_PORT, else
 * the plan's top-level "metrics_port" + rank; 0 = off. -1 on a bad value (the error names it). */
int metrics_worker_port(long flag, const char *plan_path, int rank, err_t *err);
/* The registry for a trainer: labels from $CEPHALO_JOB and the plan's device type, MFU from the
 * model's FLOPs and the device's peak (the planner's catalog; CPU_GFLOPS_PER_THREAD per thread
 * for the emulated CPU device). */
metrics *metrics_for_trainer(const trainer *t, const char *plan_path, err_t *err);
/* After trainer_step: converts the step's stats. */
void metrics_record_step(metrics *m, const trainer *t, const step_stats *st);

#endif
