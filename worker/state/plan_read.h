/* plan_read.h - reads a plan (cephalo plan -o PLAN.json) into one rank's training config. */
#ifndef CEPHALO_PLAN_READ_H
#define CEPHALO_PLAN_READ_H

#include "model/train.h"

/* Fills cfg's model, seq, global batch, this rank's batch/microbatch/microbatches, sample offset,
 * memory and threads. Errors name the file and the field. */
int plan_read(const char *path, int rank, int world, train_config *cfg, err_t *err);
/* The same from the plan's text (path: its name in messages); what plan_read does once the file
 * is read, and what fuzz/fuzz_plan.c feeds. */
int plan_parse(const char *path, const char *text, size_t len, int rank, int world, train_config *cfg,
               err_t *err);

#endif
