/* inputs.h - everything a plan is made from: the cluster, the model, an optional profile and the
 * cost model built from them. `cephalo plan`/`compare` load the cluster from a file, `cephalo run`
 * builds it from the job's local devices; both then plan through these same calls.
 *
 *   plan_inputs in = {0};
 *   cluster_load_file(path, &in.cl, &err);  model_resolve(name, &in.model, &err);
 *   inputs_build(&in, &(inputs_opts){.batch = 64, .mem_cap = INPUTS_MEM_CAP}, &err);
 *   plan_make(&in.cm, STRAT_CEPHALO, &p, &err);  inputs_save_plan(&p, "plan.json", &err);
 *   plan_free(&p);  inputs_free(&in); */
#ifndef CEPHALO_INPUTS_H
#define CEPHALO_INPUTS_H

#include <stdbool.h>
#include <stdio.h>

#include "common/err.h"
#include "planner/cluster.h"
#include "planner/cost.h"
#include "planner/model.h"
#include "planner/plan.h"
#include "planner/profile.h"

/* The usable fraction of each device's memory unless the user says otherwise: the one default of
 * `--mem-cap` (plan, compare, profile's step check), a job file's mem_cap and spec.memCap. The
 * rest is left to what the memory model does not see (allocator slack, the CUDA context). */
#define INPUTS_MEM_CAP 0.8

typedef struct plan_inputs {
    cluster cl; /* filled by the caller */
    model_spec model; /* filled by the caller */
    profile prof;
    bool have_prof;
    char prof_source[4200]; /* "--profile FILE" or "the profile store FILE"; empty: none */
    cost_model cm; /* refers to cl, model and prof: keep the struct in place while it is used */
} plan_inputs;

typedef struct inputs_opts {
    const char *profile; /* profile file, or NULL: the store, else analytic estimates only */
    bool no_store;       /* never read the profile store (the operator: not its files) */
    long seq; /* 0: the model's */
    long batch;
    precision prec;
    double mem_cap;
    recompute_policy recompute; /* auto (zero): the optimizer's choice per rank */
    double host_bytes; /* each rank's host memory for its offload pool (cost_opts.host_bytes); 0: not bounded */
} inputs_opts;

/* Loads the profile (--profile, else the profile store when it has the model: profile_store.h)
 * unless the caller set in->prof, have_prof and prof_source itself, and builds the cost model.
 * A --profile without any entry for the model is an error naming the models it has. 0, or -1
 * with the error set. */
int inputs_build(plan_inputs *in, const inputs_opts *o, err_t *err);
/* Which profile the costs come from (or that they are estimates), then one "note" line per
 * device group the profile does not cover (they use estimates). */
void inputs_print_notes(const plan_inputs *in, const char *prog, FILE *f);
/* Frees what inputs_build and the caller's cluster loading allocated. */
void inputs_free(plan_inputs *in);

/* Writes the plan JSON to path atomically (a reader never sees half a plan). */
int inputs_save_plan(const plan *p, const char *path, err_t *err);

#endif
