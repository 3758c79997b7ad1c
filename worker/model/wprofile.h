/* wprofile.h - the worker's side of `cephalo profile` (docs/profile.md); the command lines are
 * worker/cmd/profile.c:
 *
 *   cephalo-worker profile --model M [--seq T] [--precision fp32|bf16|fp16] [--device cpu|cuda]
 *                          [--threads N] [--memory SIZE] [--max-micro K] --name DEVICE -o FILE
 *   cephalo-worker profile-comm [--min-bytes N] [--max-bytes N] -o FILE   (RANK, WORLD_SIZE, ...)
 *
 * wprof_compute times the engine's own unit code (wm_unit_forward/backward, wm_head_step) for the
 * embedding, one transformer block and the head at microbatch 1..K, exactly as a training step
 * runs them (the unit-boundary copies to and from the offload pool included), and measures the
 * compute memory the engine allocates for each microbatch with the device's own allocator; an
 * out-of-memory at some microbatch ends the sweep. wprof_comm times allgatherv and
 * reduce-scatterv over the job's ranks at message sizes from min to max bytes, with even shards
 * and with rank 0 holding twice the others' share. Both write a profile file (planner/profile.h)
 * that `cephalo profile` merges. */
#ifndef CEPHALO_WORKER_WPROFILE_H
#define CEPHALO_WORKER_WPROFILE_H

#include <stdbool.h>
#include <stdint.h>

#include "comm/comm.h"
#include "common/err.h"
#include "common/precision.h"
#include "planner/model.h"

#define WPROF_MAX_REPS 50

typedef struct wprof_opts {
    const char *out;    /* the profile file */
    const char *name;   /* the device's catalog type: the profile's device name */
    const char *device; /* "cpu" or "cuda" */
    precision prec;
    long max_micro, threads, gpu;
    int64_t memory; /* device memory (0: the device's own) */
    double min_ms;  /* the least time spent on each measurement */
    bool quiet;     /* no progress lines */
} wprof_opts;

/* Profiles model m at sequence length seq on a device opened from o and saves o->out. */
int wprof_compute(const wprof_opts *o, const model_spec *m, int seq, err_t *err);

typedef struct wprof_comm_opts {
    const char *out;
    int64_t min_bytes, max_bytes; /* message sizes, x4 each step */
    int reps;                     /* 1..WPROF_MAX_REPS, the median is kept */
} wprof_comm_opts;

/* Times the collectives over cm's ranks (collective: every rank calls it); rank 0 saves o->out. */
int wprof_comm(comm *cm, const wprof_comm_opts *o, err_t *err);

#endif
