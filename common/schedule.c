/* schedule.c - the learning-rate schedules (schedule.h). */
#include "common/schedule.h"

#include <math.h>
#include <string.h>

const char *const schedule_names[SCHED_COUNT + 1] = {"cosine", "linear", "constant", NULL};

const char *schedule_name(lr_schedule s) { return (unsigned)s < SCHED_COUNT ? schedule_names[s] : "?"; }

bool schedule_parse(const char *s, lr_schedule *out) {
    for (int i = 0; s && i < SCHED_COUNT; i++)
        if (!strcmp(s, schedule_names[i])) return *out = (lr_schedule)i, true;
    return false;
}

double schedule_lr(lr_schedule s, double lr, double min_lr, int64_t warmup, int64_t steps, int64_t step) {
    if (step < warmup) return lr * (double)(step + 1) / (double)warmup;
    int64_t span = steps - warmup > 1 ? steps - warmup : 1;
    double p = (double)(step - warmup) / (double)span;
    if (p > 1) p = 1;
    switch (s) {
    case SCHED_CONSTANT: return lr;
    case SCHED_LINEAR: return min_lr + (lr - min_lr) * (1 - p);
    default: return min_lr + 0.5 * (lr - min_lr) * (1 + cos(3.14159265358979323846 * p));
    }
}

double schedule_min_lr(double lr, double min_lr) { return min_lr < 0 ? lr / 10 : min_lr; }
