/* fsdp.h - sharded training state: gathers before a unit computes, reduce-scatters after its
 * backward (fsdp.c has the slot scheme). Used by train.c's step. */
#ifndef CEPHALO_FSDP_H
#define CEPHALO_FSDP_H

#include "model/train.h"

/* Shard offsets and sizes from the config (already validated: plan_read); called before the
 * state is allocated. */
void fsdp_setup(trainer *t);
/* The two parameter and two gradient slots (sharded jobs only). */
int fsdp_alloc_slots(trainer *t, err_t *err);
void fsdp_free(trainer *t);

/* Starts gathering unit u's parameters into parameter slot `slot` (0 or 1). */
void fsdp_prefetch(trainer *t, int u, int slot);
/* Unit u's whole parameters, once gathered (NULL on a communication failure). */
float *fsdp_await(trainer *t, int u, int slot, err_t *err);
/* The buffer unit u's gradients accumulate into (gradient slot g, zeroed), first folding the
 * slot's previous reduce-scatter into its shard. */
float *fsdp_grad_begin(trainer *t, int u, int g, err_t *err);
/* Unit u's gradients are complete in slot g: start reducing them onto the shards. */
void fsdp_grad_end(trainer *t, int u, int g);
/* Waits for every gradient reduction of the step. */
int fsdp_finish_grads(trainer *t, err_t *err);
/* Sums n doubles over the ranks (identical result on every rank). */
int fsdp_allreduce_sums(trainer *t, double *v, int n, err_t *err);
/* After a failure: forgets the requests in flight. */
void fsdp_drain(trainer *t);

#endif
