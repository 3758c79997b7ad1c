/* progress.h - a training job's progress, read from its workers' /metrics (worker/metrics.c).
 *
 * The operator copies it into the CephaloJob's status (step, samplesPerSecond, loss,
 * lastCheckpointStep). Scraping is best effort: a worker that does not answer within the timeout
 * leaves the status as it was.
 *
 *   worker_progress p = {0};
 *   if (progress_scrape("http://10.1.2.3:9400/metrics", 1.0, &p, &err) == 0 && p.have_step) ...
 */
#ifndef CEPHALO_PROGRESS_H
#define CEPHALO_PROGRESS_H

#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"

typedef struct worker_progress {
    bool have_step, have_ckpt, have_loss, have_rate;
    double step;          /* cephalo_train_step: the job's step */
    double ckpt_step;     /* cephalo_checkpoint_step */
    double loss;          /* cephalo_train_loss */
    double samples_per_s; /* cephalo_train_samples_per_second: this rank's share */
} worker_progress;

/* Reads the samples above from Prometheus text; other lines (and malformed ones) are skipped.
 * Returns how many of the four were found. */
int progress_parse(const char *text, size_t len, worker_progress *p);
/* GET url (plain HTTP) within timeout_s and parse it. 0, or -1 with the error naming the URL. */
int progress_scrape(const char *url, double timeout_s, worker_progress *p, err_t *err);

#endif
