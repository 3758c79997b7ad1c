/* plan_view.h - plan.json as the operator reads it (docs/formats.md): where each rank runs and what
 * the plan gives it, the strategy and the predicted speed. Read once from the plan ConfigMap's text
 * (the text itself stays as it is: the ConfigMap and the workers' --plan file carry it verbatim),
 * so that the reconcile works on fields, not on JSON. A plan.json edited by hand that lacks a field
 * or holds the wrong type is refused with the field named: never read as zeros.
 *
 *   plan_view v;
 *   if (plan_view_parse("ConfigMap ns/job-plan plan.json", text, len, &v, &err) < 0) ...
 *   for (int r = 0; r < v.world; r++) ... v.ranks[r].node ...
 *   plan_view_free(&v); */
#ifndef CEPHALO_PLAN_VIEW_H
#define CEPHALO_PLAN_VIEW_H

#include <stddef.h>

#include "common/err.h"

typedef struct plan_view_rank {
    char *node, *device;              /* the Node's name, the GPU type */
    long batch, microbatch, microbatches;
    char *recompute;                  /* "none"/"full"; NULL: the plan is older than the field */
    double state_ratio, peak_bytes;   /* state_ratio, predicted.peak_bytes */
} plan_view_rank;

typedef struct plan_view {
    int world;                        /* ranks' length, at least 1 */
    plan_view_rank *ranks;            /* [world] */
    char *strategy;                   /* inputs.strategy */
    double iter_ms, samples_per_s;    /* predicted */
} plan_view;

/* text (len bytes) as a plan: 0, or -1 with err naming `name` and the field. v is zeroed either
 * way; plan_view_free frees it (also a zeroed one). */
int plan_view_parse(const char *name, const char *text, size_t len, plan_view *v, err_t *err);
void plan_view_free(plan_view *v);

#endif
