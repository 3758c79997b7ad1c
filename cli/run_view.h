/* run_view.h - what `cephalo run` shows of its workers: it reads each rank's JSON-lines log
 * (RUNDIR/rank-R.jsonl, docs/worker.md) as the worker appends to it, prints one progress line for
 * the whole gang, and at the end a summary (stdout and RUNDIR/summary.json). */
#ifndef CEPHALO_RUN_VIEW_H
#define CEPHALO_RUN_VIEW_H

#include <stdbool.h>
#include <stddef.h>

#include "cli/job.h"
#include "common/err.h"
#include "planner/plan.h"

/* One rank, as far as its log has been read. */
typedef struct view_rank {
    int fd; /* rank-R.jsonl, -1 until it can be opened */
    char *part; /* text after the last newline: a line the worker has not finished writing */
    size_t part_len, part_cap;
    long long done; /* steps finished: the last line's step + 1 */
    double peak_bytes, rss_peak_bytes; /* the largest seen */
} view_rank;

/* Rank 0's steps: the loss curve and the step times behind the measured samples/s. */
typedef struct view_point {
    long long step;
    double loss, step_ms;
    double val_loss; /* the validation loss computed after the step, NaN when none was */
} view_point;

typedef struct run_view {
    const job *j;
    const plan *p;
    const char *dir;
    const char *ckpt_dir; /* the workers' checkpoint directory, or NULL */
    bool quiet, tty, line_open;
    int world;
    view_rank *r;
    view_point *curve;
    size_t n_curve, cap_curve;
    const view_point *last_val; /* rank 0's newest step with a validation loss, or NULL */
    long long bad_lines; /* complete lines that were not a step record */
    double t_start; /* when the workers started */
    double t_first; /* when every rank had finished a step for the first time (ETA base) */
    long long done_first;
    double t_shown; /* the last progress line */
    long long done_shown;
    double t_seen; /* when the poll first saw `done_seen` steps finished by every rank */
    long long done_seen;
    double t_seen_shown; /* t_seen as of the last progress line */
} run_view;

/* Empties the ranks' logs (a rerun's view starts afresh) and opens them for reading. */
void view_init(run_view *v, const job *j, const plan *p, const char *dir, const char *ckpt_dir, bool quiet);
/* Reads what the workers appended since the last call. */
void view_poll(run_view *v);
/* The progress line on stderr: at most once a second and only when a step was finished (force:
 * now, if anything new). In place on a terminal, one line per update otherwise. */
void view_show(run_view *v, bool force);
/* Ends a progress line written in place, before any other message. */
void view_end_line(run_view *v);
/* After a successful run: the summary on stdout and in RUNDIR/summary.json. */
int view_summary(run_view *v, err_t *err);
void view_free(run_view *v);

#endif
