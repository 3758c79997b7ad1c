/* paper_dp.h - the Cephalo paper's dynamic program (its Algorithm 1), the peer `make bench`
 * times our optimizer against. Benchmark code only; the planner never uses it. */
#ifndef CEPHALO_PAPER_DP_H
#define CEPHALO_PAPER_DP_H

#include "planner/cost.h"

/* Fills batch/micro per rank (arrays of cm->cl->n_devices); returns its objective (ms) or
 * INFINITY when it finds no plan. */
double paper_dp_solve(const cost_model *cm, int *batch, int *micro);

#endif
