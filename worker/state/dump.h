/* dump.h - oracle dumps for tests (cephalo-worker train --dump DIR; docs/worker-model.md):
 * initial and final parameters, every step's batch, step 0's logits, loss and gradients, with
 * full tensor names, for the PyTorch oracle in tests/ref. Single rank only. */
#ifndef CEPHALO_DUMP_H
#define CEPHALO_DUMP_H

#include "common/outputs.h"
#include "model/train.h"

typedef struct dumper dumper;

/* The files a dump directory holds (init, step0, batches, final), for the outputs check. */
extern const out_kind dump_dir_kind;

/* Writes DIR/init.safetensors and prepares to record steps (creates DIR). */
dumper *dump_open(trainer *t, const char *dir, err_t *err);
/* After trainer_step: records the step's batch; after step 0 also writes DIR/step0.safetensors
 * (t->logits_out must have been set before step 0; dump_open does that) with the gradients
 * divided by the step's loss scale (fp16's; 1 otherwise: a power of two, so exact), so that
 * they are the loss's gradients in every precision. */
int dump_after_step(dumper *dp, trainer *t, double loss, double loss_scale, err_t *err);
/* Writes DIR/batches.safetensors and DIR/final.safetensors and frees the dumper. */
int dump_close(dumper *dp, trainer *t, err_t *err);

#endif
