/* cost.h - the cost model of docs/cost-model.md for one (cluster, model, seq, precision).
 *
 * Per device group (identical devices): the forward-phase and backward-phase time of one
 * microbatch of size m, and the compute memory M(m) = m0 + m1*m + head(m) (the head's logits,
 * capped: engine_head_bytes). Per cluster: the collective times of one step. Costs come from a profile where one matches the device, from analytic
 * estimates (catalog TFLOP/s and bandwidth) otherwise; each group says which.
 *
 * Phases (docs/cost-model.md):
 *   forward phase  F(m) = emb_fwd + L*block_fwd + head_fwd + head_bwd   (the head's backward runs
 *                         right after its forward, so it needs no second gather)
 *   backward phase K(m) = L*(block_recompute + block_bwd) + emb_bwd   (recompute full)
 *                  K(m) = L*block_bwd + emb_bwd                      (recompute none: the
 *                         forward kept every unit's intermediates; memory grows with m*l)
 *   iteration      T = AG_first + max(max_i l_i*F_i(m_i), A) + max(max_i l_i*K_i(m_i), C)
 *                      + RS_last + optimizer step
 * where A = gathers overlapped with the forward, C = gathers + reduce-scatters overlapped with the
 * backward, all scaled by the uneven factor (1.15) when any unit is unevenly sharded. */
#ifndef CEPHALO_COST_H
#define CEPHALO_COST_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "common/precision.h"
#include "common/recompute.h"
#include "planner/cluster.h"
#include "planner/model.h"
#include "planner/profile.h"

#define STATE_BYTES_PER_PARAM 16 /* fp32 Adam: 4 param + 4 grad + 8 moments (16-bit: ZeRO's 2+2+12) */
#define UNEVEN_COMM_FACTOR 1.15
#define COST_MAX_BATCH 65536 /* samples per iteration (the exact room DP is quadratic in it) */
#define COST_MAX_TABLE 67108864.0 /* batch x device groups: 1 GiB of time tables */
#define GPU_RESERVED_BYTES (768.0 * 1024 * 1024) /* CUDA context, cuBLAS workspace, allocator slack */

typedef struct cost_opts {
    precision prec; /* fp16 and bf16 cost the same memory (2-byte gathers); compute at each rate */
    double mem_cap; /* usable fraction of each device's memory */
    const profile *prof; /* NULL: analytic estimates only */
    recompute_policy recompute; /* auto: the optimizer chooses per rank; or one forced on all */
    /* Host memory of each rank (a worker pod's memory limit, spec.template) for the host offload
     * pool, of which mem_cap is usable; 0: not bounded (the worker checks the machine's memory) */
    double host_bytes;
} cost_opts;

typedef struct cost_group {
    int first_rank, count; /* ranks first_rank .. first_rank+count-1 (devices are grouped when
                              identical and consecutive in rank order) */
    const cluster_device *dev;
    double usable_bytes; /* capacity * mem_cap */
    double m0, m1; /* compute memory M(m) = m0 + m1*m + the head's logits (engine_head_bytes:
                    * linear in m up to a cap) bytes */
    const model_spec *model; /* for the head's part of M(m) */
    int seq;
    double slot_bytes; /* part of m0 only sharded state needs: gathered-parameter and full-gradient slots */
    int mlimit; /* largest batch one rank can get: B - (N-1) */
    int mmax; /* largest m <= mlimit with M(m) <= usable, 0 if none */
    double *fwd_ms, *bwd_ms; /* [mlimit+1], index m; per microbatch forward/backward phase */
    double *bwd_keep_ms; /* [mlimit+1]: the backward phase with recompute none */
    /* recompute none, l microbatches of m: M(m) + keep_m1*m + keep_ml*m*l bytes */
    double keep_m1, keep_ml;
    double opt_ms_per_param; /* optimizer step time per parameter of the local shard */
    double step_overhead_ms; /* the profile's step check: fixed time per step (cost_comm.overhead_ms has the most of them) */
    bool measured; /* costs from a profile */
    double peak_tflops; /* the peak the estimate used (for MFU and messages) */
} cost_group;

typedef struct cost_comm {
    int world;
    double ag_first_ms, ag_fwd_ms, ag_bwd_ms, rs_ms, rs_last_ms; /* even shards */
    double sums_ms; /* the step's all-reduce of the loss and the squared gradient norm */
    /* CPU time the communicator takes from the cores during the forward and the backward
     * collectives when the CPU devices' threads and one communicator per rank oversubscribe the
     * host (measured cpu_ms of a profile; without one, the loopback collectives' whole time);
     * 0 when the collectives run on cores of their own */
    double cpu_fwd_ms, cpu_bwd_ms;
    /* per collective, times the collectives of a step (exposed): an old profile's step check
     * (train_overhead_ms), or without a profile the wake-up latency of collectives on an
     * oversubscribed host; 0 otherwise */
    double overhead_ms;
    double uneven_factor;
    double bandwidth_gbs, alpha_ms; /* the ring's bottleneck link */
    bool measured;
} cost_comm;

typedef struct cost_model {
    const model_spec *model;
    const cluster *cl;
    int seq, tokens; /* sequence length and tokens per sample */
    int batch; /* global batch B */
    cost_opts opts;
    int n_groups;
    cost_group *groups;
    cost_comm comm;
    int64_t params; /* P */
    int64_t even_state_params; /* sum over units of ceil(numel/N): the largest even share */
    int state_bpp; /* device bytes of state per shard parameter (engine_state_bytes_per_param) */
    /* The host offload pool grows with a rank's batch b: b x host_per_sample bytes (every unit's
     * input checkpoint and the flowing gradient, [tokens, d] fp32 each: docs/cost-model.md).
     * host_bmax: the largest b whose pool fits opts.host_bytes x mem_cap (batch when unbounded). */
    double host_per_sample;
    int host_bmax;
} cost_model;

/* Builds the model for this cluster and global batch. Errors: bad batch, bad options, a precision
 * some GPU lacks (cluster_check_precision). */
int cost_build(cost_model *cm, const model_spec *m, const cluster *cl, int seq, int batch,
               const cost_opts *opts, err_t *err);
void cost_free(cost_model *cm);

/* Bytes of the host offload pool of a rank with batch b (microbatches x microbatch). */
double cost_host_bytes(const cost_model *cm, int b);
/* The host memory one rank may use for its pool: opts.host_bytes x mem_cap (0: not bounded). */
double cost_host_usable(const cost_model *cm);

/* Compute memory M(m) in bytes of a device of group g (integer, rounded up). */
int64_t cost_compute_bytes(const cost_group *g, int m);
/* ... for l microbatches of m with recompute r (none: every unit's intermediates kept). */
int64_t cost_compute_bytes_mode(const cost_group *g, int m, int l, recompute_mode r);
/* The backward phase of one microbatch m with recompute r. */
double cost_bwd_ms(const cost_group *g, int m, recompute_mode r);
/* Rank -> group index. */
int cost_group_of(const cost_model *cm, int rank);
/* Collective floors for the forward and backward phases, and the constant exposed terms. */
double cost_fwd_floor(const cost_model *cm, bool uneven);
double cost_bwd_floor(const cost_model *cm, bool uneven);
/* The collectives a sharded, layered training step issues for model m. */
int cost_step_collectives(const model_spec *m);
double cost_exposed_ms(const cost_model *cm, bool uneven);
/* Model FLOPs of one sample's forward+backward (6N-style with attention), for MFU. */
double cost_flops_per_sample(const cost_model *cm);

#endif
