/* plan_read.h - reads a plan (cephalo plan -o PLAN.json) into one rank's training config. */
#ifndef CEPHALO_PLAN_READ_H
#define CEPHALO_PLAN_READ_H

#include "model/train.h"

/* Fills cfg's model, seq, global batch, this rank's batch/microbatch/microbatches, sample offset,
 * memory and threads. Errors name the file and the field. */
int plan_read(const char *path, int rank, int world, train_config *cfg, err_t *err);

#endif
