/* recompute.h - whether a rank's backward recomputes each unit's forward (docs/cost-model.md,
 * "Recompute"):
 *
 *   full  the forward keeps only the unit-boundary checkpoints; the backward recomputes each
 *         unit's forward from its checkpoint (one unit's intermediates on the device at a time)
 *   none  the forward keeps every unit's intermediates for every microbatch of the step on the
 *         device; the backward reads them, with no second forward
 *
 * The planner chooses per rank (a plan's ranks[].recompute); a job may force one mode for every
 * rank ("auto" leaves it to the planner). The names are the strings of every command line, job
 * file, CRD and plan. */
#ifndef CEPHALO_RECOMPUTE_H
#define CEPHALO_RECOMPUTE_H

#include <stdbool.h>

typedef enum { RECOMPUTE_FULL = 0, RECOMPUTE_NONE = 1 } recompute_mode;
#define RECOMPUTE_CHOICES "none or full"

/* A job's or the planner's choice: either mode per rank, or one forced on all. */
typedef enum { RECOMPUTE_AUTO = 0, RECOMPUTE_FORCE_FULL = 1, RECOMPUTE_FORCE_NONE = 2 } recompute_policy;
#define RECOMPUTE_POLICY_CHOICES "auto, none or full"

/* "full", "none". */
const char *recompute_name(recompute_mode r);
/* Parses "none" or "full"; false otherwise. */
bool recompute_parse(const char *s, recompute_mode *out);
/* "auto", "full", "none". */
const char *recompute_policy_name(recompute_policy p);
/* Parses "auto", "none" or "full"; false otherwise. */
bool recompute_policy_parse(const char *s, recompute_policy *out);

#endif
