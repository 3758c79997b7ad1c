/* profile.h - the profile file (docs/formats.md): measured costs per device type and model.
 *
 * {
 *   "format": "cephalo-profile", "version": 2,
 *   "entries": [
 *     {"device": "L4", "model": "bert-large", "seq": 512, "precision": "fp32",
 *      "microbatch":    [1, 2, 4, 8],
 *      "block":     {"fwd_ms": [...], "bwd_ms": [...],       per transformer block, bwd without recompute
 *                    "bwd_keep_ms": [...]},                  optional (version 2): the backward phase
 *                                                            measured on its own, from the kept
 *                                                            intermediates (recompute none)
 *      "embedding": {"fwd_ms": [...], "bwd_ms": [...]},      optional; bwd_keep_ms too
 *      "head":      {"fwd_ms": [...], "bwd_ms": [...]},      optional
 *      "compute_bytes": [...],                               compute memory M(m) at each microbatch
 *      "optimizer_ms_per_mparam": 1.2}                       optional: the step's per-parameter work
 *                                                            outside the units (zeroing the gradient
 *                                                            shard, its squared norm, AdamW), ms per
 *                                                            million parameters of the local shard
 *      "step_scale": 0.8, "step_overhead_ms": 3.1}          optional: the step check's line, measured =
 *                                                            overhead + scale x predicted step time: the
 *                                                            planner scales this entry's times and adds
 *                                                            the overhead to each step
 *   ],
 *   "comm": [                                                optional, measured collectives
 *     {"world": 8, "op": "allgather", "bytes": [...], "ms": [...], "uneven_ms": [...],
 *      "cpu_ms": [...], "host_cores": 16},                   optional: the CPU time one rank's
 *                                                            communicator spends per collective, and
 *                                                            the cores of the host it was measured on;
 *      "train_overhead_ms": 0.03}                            all-gather entries, optional: the step
 *                                                            check's time per collective beyond the model
 *     {"world": 8, "op": "reduce_scatter", "bytes": [...], "ms": [...]}
 *   ]
 * }
 * Arrays in one entry have the same length as "microbatch", which is strictly increasing. The
 * optional fields were added within version 1, but for bwd_keep_ms (version 2, which `cephalo
 * profile` writes): files without them read as before, and version 1 files still read. */
#ifndef CEPHALO_PROFILE_H
#define CEPHALO_PROFILE_H

#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"
#include "common/precision.h"

#define PROFILE_FORMAT "cephalo-profile"
#define PROFILE_VERSION 2     /* written */
#define PROFILE_VERSION_MIN 1 /* the oldest read */
#define PROFILE_MAX_POINTS 4096
/* The step check's scale: a run 10x off its profile's prediction is a broken profile, not a correction. */
#define PROFILE_MIN_STEP_SCALE 0.1
#define PROFILE_MAX_STEP_SCALE 10.0

typedef struct profile_curve {
    bool present;
    double *fwd_ms, *bwd_ms; /* [n_points] */
    double *bwd_keep_ms;     /* [n_points] or NULL: measured backward without the recompute */
} profile_curve;

typedef struct profile_entry {
    char device[32]; /* catalog type name as written */
    char model[64];
    int seq;
    precision prec;
    int n_points;
    int *microbatch; /* [n_points], strictly increasing, >= 1 */
    profile_curve block, embedding, head;
    double *compute_bytes; /* [n_points] or NULL */
    double optimizer_ms_per_mparam; /* 0: not measured */
    /* the step check's line: a step measured = step_overhead_ms + step_scale x predicted */
    double step_scale; /* 0: no step check */
    double step_overhead_ms;
} profile_entry;

typedef struct profile_comm {
    int world;
    bool reduce_scatter; /* false: allgather */
    int n_points;
    double *bytes, *ms, *uneven_ms; /* uneven_ms may be NULL */
    double *cpu_ms; /* [n_points] or NULL: one rank's communicator CPU time per collective */
    int host_cores; /* 0: not recorded */
    /* all-gather entries: per collective of a training step, the time a short training run on
     * these devices took beyond the model of the collectives (the step check); 0: not measured */
    double train_overhead_ms;
} profile_comm;

typedef struct profile {
    int n_entries, n_comm;
    profile_entry *entries;
    profile_comm *comm;
} profile;

/* Both return 0, or -1 with an error naming the file and the JSON path ("entries[2].block.fwd_ms[3]"). */
int profile_load_file(const char *path, profile *out, err_t *err);
int profile_load_string(const char *name, const char *text, size_t len, profile *out, err_t *err);
void profile_free(profile *p);

/* The entry for this device type (case-insensitive, normalized), model, seq and precision. */
const profile_entry *profile_find(const profile *p, const char *device, const char *model, int seq,
                                  precision prec);
/* The measured collective for `world` ranks, or NULL. */
const profile_comm *profile_find_comm(const profile *p, int world, bool reduce_scatter);

#endif
