/* eval.h - validation loss: the mean loss per target of a fixed set of validation samples, the same
 * number whatever the plan (docs/worker.md, "Validation").
 *
 * The samples: sample i (0 <= i < N) is global sample i of the validation source opened with the
 * fixed seed EVAL_SEED (data.h: window perm_0(i) of the token windows, or image perm_0(i); for MLM
 * the masks follow from (EVAL_SEED, i)). N is --val-samples, at most the source's samples, so no
 * window counts twice. It depends on neither the training seed nor the plan nor the ranks.
 *
 * The split: rank r evaluates samples [N*o/B, N*(o+b)/B), o its first position in the global batch
 * and b its batch, in rounds of at most b samples (microbatches of its microbatch size; the last
 * one padded with rows without targets). Every rank makes ceil(N/B) rounds, as the collectives
 * require. The sums of the target losses (double) and the target counts are all-reduced: every
 * rank gets the same loss. Evaluation runs between steps on the trainer's buffers and leaves the
 * training bit for bit as it was.
 *
 *   evaluator *ev = eval_open(t, "val/", 64, &err);
 *   if (eval_due(ev, t)) eval_loss(ev, t, &loss, &err);   // collective: every rank calls it
 *   eval_close(ev); */
#ifndef CEPHALO_EVAL_H
#define CEPHALO_EVAL_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "model/train.h"

#define EVAL_SEED 0x76616cULL /* "val": the validation samples' order and masks */

/* --val-data, --val-every, --val-samples as given (every -1, samples 0: not given). */
typedef struct eval_opts {
    const char *data;
    long every, samples;
    const char *flag; /* the data's option in messages; NULL: "--val-data" */
} eval_opts;

typedef struct evaluator evaluator;

/* Checks the options (the flag named in the message), opens the validation source for t's model
 * and reads this rank's samples once (into t's host arrays, which the next step refills), so that
 * a bad file fails now. NULL with *err empty when there is nothing to evaluate (no --val-data). */
evaluator *eval_open(trainer *t, const eval_opts *o, err_t *err);
void eval_close(evaluator *ev);
/* The validation source (its shards' tokenizer: data_tokenizer). */
const data_source *eval_source(const evaluator *ev);
/* After a step (t->step steps done): every `every` steps and after the last one. */
bool eval_due(const evaluator *ev, const trainer *t);
/* The validation loss (mean per target) of t's current parameters; collective. */
int eval_loss(evaluator *ev, trainer *t, double *loss, err_t *err);
/* One line for the start-up summary. */
void eval_describe(const evaluator *ev, char *buf, size_t n);

/* What the last evaluation covered, for reports: samples and targets over all ranks, the data. */
typedef struct eval_summary {
    int64_t samples;
    double targets;
    const char *data;
} eval_summary;
eval_summary eval_summary_of(const evaluator *ev);

#endif
