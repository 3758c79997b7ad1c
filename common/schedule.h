/* schedule.h - the learning-rate schedules: a linear warmup over `warmup` steps to the peak lr,
 * then
 *
 *   cosine    min_lr + (lr - min_lr) (1 + cos(pi p)) / 2   (the default)
 *   linear    min_lr + (lr - min_lr) (1 - p)
 *   constant  lr (min_lr unused)
 *
 * with p = (step - warmup) / max(1, steps - warmup), at most 1. The names are those of the
 * worker's --schedule, job files' optimizer.schedule and the CRD's spec.optimizer.schedule. */
#ifndef CEPHALO_SCHEDULE_H
#define CEPHALO_SCHEDULE_H

#include <stdbool.h>
#include <stdint.h>

typedef enum { SCHED_COSINE = 0, SCHED_LINEAR = 1, SCHED_CONSTANT = 2 } lr_schedule;
#define SCHED_COUNT 3
#define SCHEDULE_CHOICES "cosine, linear or constant"

/* The names in order, NULL-terminated (common/args.h's args_choice). */
extern const char *const schedule_names[SCHED_COUNT + 1];
const char *schedule_name(lr_schedule s);
/* Parses a name (exact, lower case); false when s is none of them. */
bool schedule_parse(const char *s, lr_schedule *out);
/* The floor a schedule decays to: min_lr as given, or lr / 10 when it was not (min_lr < 0), the
 * one rule of the worker, its checkpoints and the command lines the front ends build. */
double schedule_min_lr(double lr, double min_lr);
/* The learning rate of 0-based step `step` of `steps`. */
double schedule_lr(lr_schedule s, double lr, double min_lr, int64_t warmup, int64_t steps, int64_t step);

#endif
