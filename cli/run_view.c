/* run_view.c - the progress line and the summary of `cephalo run`, read from the workers'
 * JSON-lines logs (one object per step, docs/worker.md).
 *
 * The logs are read with plain read() from where the last poll stopped. A worker may be caught in
 * the middle of writing a line: the text after the last newline is kept and completed by the next
 * poll, never parsed half. */
#include "cli/run_view.h"
#include "common/clock.h"

#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/ckpt_dir.h"
#include "common/fileio.h"
#include "common/json_util.h"
#include "common/log.h"
#include "common/strutil.h"

#define PATH_LEN 4200
#define SHOW_EVERY_S 1.0
#define MEM_RANKS_LISTED 8 /* beyond this the line names only the fullest rank */
#define CURVE_POINTS 10 /* in the text summary; summary.json has every step */
#define WARMUP_STEPS 2 /* left out of the measured samples/s: first-touch allocation, caches */
#define GIB (1024.0 * 1024.0 * 1024.0)

static const char *log_path(const run_view *v, int rank, char *buf) {
    snprintf(buf, PATH_LEN, "%s/rank-%d.jsonl", v->dir, rank);
    return buf;
}

void view_init(run_view *v, const job *j, const plan *p, const char *dir, const char *ckpt_dir, bool quiet) {
    memset(v, 0, sizeof *v);
    *v = (run_view){.j = j, .p = p, .dir = dir, .ckpt_dir = ckpt_dir, .quiet = quiet, .tty = isatty(2), .world = p->n_ranks, .t_start = clock_now_s()};
    v->r = xcalloc((size_t)v->world, sizeof *v->r);
    char summary[PATH_LEN];
    snprintf(summary, sizeof summary, "%s/summary.json", dir);
    unlink(summary); /* an earlier run's: a failed run must not seem to have one */
    for (int r = 0; r < v->world; r++) {
        char path[PATH_LEN];
        /* a log left by an earlier run in this directory would read as this run's progress */
        file_out o;
        err_t err;
        if (file_out_open(&o, log_path(v, r, path), FILE_OUT_STREAM, &err) == 0) file_out_abort(&o);
        v->r[r].fd = open(path, O_RDONLY | O_CLOEXEC);
    }
}

void view_free(run_view *v) {
    for (int r = 0; r < v->world; r++) {
        if (v->r[r].fd >= 0) close(v->r[r].fd);
        free(v->r[r].part);
    }
    free(v->r);
    free(v->curve);
    memset(v, 0, sizeof *v);
}

/* ---- reading the logs ---- */

static double number(const cJSON *o, const char *key) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(x) ? x->valuedouble : NAN;
}

static void add_point(run_view *v, long long step, double loss, double step_ms, double val_loss) {
    if (v->n_curve == v->cap_curve) {
        v->cap_curve = v->cap_curve ? 2 * v->cap_curve : 256;
        v->curve = xrealloc(v->curve, v->cap_curve * sizeof *v->curve);
        v->last_val = NULL; /* moved: found again below */
        for (size_t i = v->n_curve; i-- > 0 && !v->last_val;)
            if (!isnan(v->curve[i].val_loss)) v->last_val = &v->curve[i];
    }
    v->curve[v->n_curve++] = (view_point){step, loss, step_ms, val_loss};
    if (!isnan(val_loss)) v->last_val = &v->curve[v->n_curve - 1];
}

/* One complete line; anything that is not a step record is counted and skipped. A step record's
 * loss may be null (a step whose batch had no target that counts, or a loss that was not finite):
 * the step counts, its point has no loss (NAN: a gap the printers skip). */
static void take_line(run_view *v, int rank, const char *line, size_t len) {
    err_t ignored; /* a line that is not a step record is counted, not reported */
    cJSON *o = json_parse("log line", line, len, &ignored);
    double step = number(o, "step"), loss = number(o, "loss"), ms = number(o, "step_ms");
    view_rank *r = &v->r[rank];
    if (!o || !(step >= 0) || (isnan(loss) && !cJSON_IsNull(json_get(o, "loss")))) {
        v->bad_lines++;
    } else {
        if ((long long)step + 1 > r->done) r->done = (long long)step + 1;
        r->peak_bytes = fmax(r->peak_bytes, number(o, "peak_bytes"));
        r->rss_peak_bytes = fmax(r->rss_peak_bytes, number(o, "rss_peak_bytes"));
        if (rank == 0) add_point(v, (long long)step, loss, ms, number(o, "val_loss"));
    }
    cJSON_Delete(o);
}

/* The lines of each read are taken as it comes: only the text after the last newline is kept
 * (str_append doubles it), so a backlog of any size takes the memory of one line and each byte is
 * copied at most once (growing the kept text by each read's bytes copied it all every time). */
static void poll_rank(run_view *v, int rank) {
    view_rank *r = &v->r[rank];
    char buf[1 << 16];
    ssize_t n;
    while (r->fd >= 0 && (n = read(r->fd, buf, sizeof buf)) > 0) {
        const char *p = buf, *end = buf + n, *nl;
        for (; (nl = memchr(p, '\n', (size_t)(end - p))); p = nl + 1) {
            if (!r->part_len) {
                take_line(v, rank, p, (size_t)(nl - p));
                continue;
            }
            str_append(&r->part, &r->part_len, &r->part_cap, p, (size_t)(nl - p)); /* a line begun in an earlier read */
            take_line(v, rank, r->part, r->part_len);
            r->part_len = 0;
        }
        if (p < end) str_append(&r->part, &r->part_len, &r->part_cap, p, (size_t)(end - p));
    }
}

void view_poll(run_view *v) {
    for (int r = 0; r < v->world; r++) poll_rank(v, r);
}

/* ---- the progress line ---- */

static void fmt_duration(double s, char *buf, size_t n) {
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else snprintf(buf, n, "%ld:%02ld", t / 60, t % 60);
}

/* "4.1/512M": the peak in the unit of the capacity (G from 10 GiB up, else M). */
static void fmt_mem(double used, double cap, char *buf, size_t n) {
    double unit = cap >= 10 * GIB ? GIB : 1024.0 * 1024.0;
    double u = used / unit, c = cap / unit;
    snprintf(buf, n, u < 10 ? "%.1f/%.*f%c" : "%.0f/%.*f%c", u, c < 10 && c != floor(c) ? 1 : 0, c, unit == GIB ? 'G' : 'M');
}

static void append(char *line, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void append(char *line, size_t n, const char *fmt, ...) {
    size_t len = strlen(line);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + len, n - len, fmt, ap);
    va_end(ap);
}

/* Rank 0's record of a step (the loss and the step time of the line), or NULL. */
static const view_point *point_at(const run_view *v, long long step) {
    for (size_t i = v->n_curve; i-- > 0;)
        if (v->curve[i].step == step) return &v->curve[i];
    return NULL;
}

static void mem_part(const run_view *v, char *line, size_t n) {
    char m[48];
    if (v->world <= MEM_RANKS_LISTED) {
        append(line, n, " | mem");
        for (int r = 0; r < v->world; r++) {
            fmt_mem(v->r[r].peak_bytes, v->p->ranks[r].capacity_bytes, m, sizeof m);
            append(line, n, " r%d %s", r, m);
        }
        return;
    }
    int full = 0;
    for (int r = 1; r < v->world; r++)
        if (v->r[r].peak_bytes / v->p->ranks[r].capacity_bytes > v->r[full].peak_bytes / v->p->ranks[full].capacity_bytes) full = r;
    fmt_mem(v->r[full].peak_bytes, v->p->ranks[full].capacity_bytes, m, sizeof m);
    append(line, n, " | mem fullest r%d %s (%.0f%%)", full, m, 100 * v->r[full].peak_bytes / v->p->ranks[full].capacity_bytes);
}

void view_show(run_view *v, bool force) {
    long long done = v->r[0].done;
    for (int r = 1; r < v->world; r++) done = v->r[r].done < done ? v->r[r].done : done;
    double now = clock_now_s();
    if (done > 0 && v->t_first == 0) v->t_first = now, v->done_first = done;
    if (done > v->done_seen) v->done_seen = done, v->t_seen = now;
    if (v->quiet || done == v->done_shown || (!force && now - v->t_shown < SHOW_EVERY_S)) return;
    char line[1024] = "", eta[32] = "-";
    append(line, sizeof line, "step %lld/%ld", done, v->j->train.steps);
    const view_point *pt = point_at(v, done - 1);
    /* samples/s over the whole steps since the last line, from the moment the poll saw one step
     * done to the moment it saw the other (what the gang really did, logging and all; timing
     * from line to line instead counted one step in one second and three in the next), or from
     * rank 0's step time when there is no such span (the first line) */
    bool wall = v->done_shown > 0 && v->t_seen > v->t_seen_shown;
    double sps = wall ? (double)(done - v->done_shown) * v->j->batch / (v->t_seen - v->t_seen_shown)
                      : pt ? v->j->batch * 1e3 / pt->step_ms : 0;
    if (pt && !isnan(pt->loss)) append(line, sizeof line, " | loss %.4f", pt->loss);
    else if (pt) append(line, sizeof line, " | loss -");
    if (pt && v->last_val) append(line, sizeof line, " | val %.4f", v->last_val->val_loss);
    if (pt) append(line, sizeof line, " | %.0f samples/s", sps);
    /* the wall clock since every rank finished a step, else rank 0's last step time */
    double per_step = done > v->done_first ? (now - v->t_first) / (double)(done - v->done_first) : pt ? pt->step_ms / 1e3 : -1;
    if (per_step >= 0) fmt_duration((double)(v->j->train.steps - done) * per_step, eta, sizeof eta);
    append(line, sizeof line, " | ETA %s", done >= v->j->train.steps ? "0:00" : eta);
    mem_part(v, line, sizeof line);
    if (v->tty) fprintf(stderr, "\r%s\033[K", line);
    else fprintf(stderr, "%s\n", line);
    v->line_open = v->tty;
    v->t_shown = now, v->done_shown = done, v->t_seen_shown = v->t_seen;
}

void view_end_line(run_view *v) {
    if (v->line_open) fputc('\n', stderr);
    v->line_open = false;
}

/* ---- the summary ---- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Global batch over rank 0's median step time, after the warm-up steps: the ranks synchronise at
 * every step, so one rank's step time is the gang's. Sets *from to the first step counted. */
static double measured_sps(const run_view *v, size_t *from) {
    *from = v->n_curve > WARMUP_STEPS ? WARMUP_STEPS : 0;
    size_t n = v->n_curve - *from;
    if (!n) return 0;
    double *ms = xmalloc(n * sizeof *ms);
    for (size_t i = 0; i < n; i++) ms[i] = v->curve[*from + i].step_ms;
    qsort(ms, n, sizeof *ms, cmp_double);
    double med = n % 2 ? ms[n / 2] : (ms[n / 2 - 1] + ms[n / 2]) / 2;
    free(ms);
    return med > 0 ? v->j->batch * 1e3 / med : 0;
}

/* The last point with a loss (NULL: none). */
static const view_point *last_loss(const run_view *v) {
    for (size_t i = v->n_curve; i-- > 0;)
        if (!isnan(v->curve[i].loss)) return &v->curve[i];
    return NULL;
}

static void print_curve(const run_view *v) {
    size_t n = v->n_curve, k = n < CURVE_POINTS ? n : CURVE_POINTS;
    printf("loss curve (rank 0)\n  step");
    for (size_t i = 0; i < k; i++) printf(" %8lld", v->curve[k > 1 ? i * (n - 1) / (k - 1) : 0].step + 1);
    printf("\n  loss");
    for (size_t i = 0; i < k; i++) {
        double l = v->curve[k > 1 ? i * (n - 1) / (k - 1) : 0].loss;
        if (isnan(l)) printf(" %8s", "-"); /* no loss at that step */
        else printf(" %8.4f", l);
    }
    printf("\n");
}

static void print_ranks(const run_view *v) {
    const plan *p = v->p;
    printf("rank  device        batch micro    x  state%%  peak measured   predicted    capacity\n");
    for (int r = 0; r < v->world; r++) {
        const plan_rank *pr = &p->ranks[r];
        char a[32], b[32], c[32];
        printf("%4d  %-12.12s %6d %5d %4d %6.2f%%  %13s %11s %11s\n", r, p->cm->cl->devices[r].type, pr->batch, pr->micro,
               pr->micros, 100 * pr->state_ratio, str_bytes(v->r[r].peak_bytes, a, sizeof a),
               str_bytes((double)pr->peak_bytes, b, sizeof b), str_bytes(pr->capacity_bytes, c, sizeof c));
    }
}

/* With no step run, the workers resumed from the newest complete checkpoint and wrote none: its
 * step (and name), or the job's steps when there is none to read. */
static long long resumed_step(const run_view *v, char *name, size_t n) {
    ckpt_entry *e;
    err_t err;
    int k = v->ckpt_dir ? ckpt_dir_list(v->ckpt_dir, &e, &err) : 0;
    long long step = v->j->train.steps;
    snprintf(name, n, "?");
    for (int i = 0; i < k; i++)
        if (e[i].complete) {
            step = e[i].step;
            snprintf(name, n, "%s/%s", v->ckpt_dir, e[i].name);
            break;
        }
    if (k > 0) free(e);
    return step;
}

static void print_summary(const run_view *v, double sps, size_t from, double wall_s) {
    double pred = v->p->samples_per_s;
    if (!v->n_curve) {
        char name[PATH_LEN];
        long long step = resumed_step(v, name, sizeof name);
        printf("cephalo run: done: no step to run: the checkpoint resumed from (%s) is at step %lld, and the job has %ld steps "
               "(raise --steps to train further, or start afresh with cephalo run --overwrite and checkpoint.resume: never)\n",
               name, step, v->j->train.steps);
        return;
    }
    const view_point *last = &v->curve[v->n_curve - 1], *with_loss = last_loss(v);
    printf("cephalo run: done: steps %lld..%lld of %ld in %.1f s; ", v->curve[0].step + 1, last->step + 1, v->j->train.steps,
           wall_s);
    if (with_loss && with_loss != last) printf("final loss %.4f (after step %lld: the steps after it had none)", with_loss->loss, with_loss->step + 1);
    else if (with_loss) printf("final loss %.4f", with_loss->loss);
    else printf("no loss (no step had a target that counts)");
    if (v->last_val) printf("; validation loss %.4f (after step %lld)", v->last_val->val_loss, v->last_val->step + 1);
    printf("\n");
    print_curve(v);
    printf("samples/s: %.1f measured (median over steps %lld..%lld), %.1f predicted (measured/predicted %.2f)\n", sps,
           v->curve[from].step + 1, last->step + 1, pred, pred > 0 ? sps / pred : 0);
    print_ranks(v);
    if (v->bad_lines) printf("note: %lld log lines were not step records and were skipped\n", v->bad_lines);
}

static cJSON *ranks_json(const run_view *v) {
    cJSON *arr = cJSON_CreateArray();
    for (int r = 0; r < v->world; r++) {
        const plan_rank *pr = &v->p->ranks[r];
        const cluster_device *d = &v->p->cm->cl->devices[r];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "rank", r);
        cJSON_AddStringToObject(o, "device", d->type);
        cJSON_AddNumberToObject(o, "threads", d->threads);
        cJSON_AddNumberToObject(o, "batch", pr->batch);
        cJSON_AddNumberToObject(o, "microbatch", pr->micro);
        cJSON_AddNumberToObject(o, "microbatches", pr->micros);
        cJSON_AddNumberToObject(o, "state_ratio", pr->state_ratio);
        cJSON *m = cJSON_AddObjectToObject(o, "peak_bytes");
        cJSON_AddNumberToObject(m, "measured", v->r[r].peak_bytes);
        cJSON_AddNumberToObject(m, "predicted", (double)pr->peak_bytes);
        cJSON_AddNumberToObject(m, "capacity", pr->capacity_bytes);
        cJSON_AddNumberToObject(o, "rss_peak_bytes", v->r[r].rss_peak_bytes);
        cJSON_AddItemToArray(arr, o);
    }
    return arr;
}

/* "final_val_loss" (null without validation) and "val_loss": [{"step": steps done, "loss": L}] */
static void add_val_json(const run_view *v, cJSON *o) {
    if (v->last_val) cJSON_AddNumberToObject(o, "final_val_loss", v->last_val->val_loss);
    else cJSON_AddNullToObject(o, "final_val_loss");
    cJSON *arr = cJSON_AddArrayToObject(o, "val_loss");
    for (size_t i = 0; i < v->n_curve; i++) {
        if (isnan(v->curve[i].val_loss)) continue;
        cJSON *p = cJSON_CreateObject();
        cJSON_AddNumberToObject(p, "step", (double)(v->curve[i].step + 1));
        cJSON_AddNumberToObject(p, "loss", v->curve[i].val_loss);
        cJSON_AddItemToArray(arr, p);
    }
}

static cJSON *summary_json(const run_view *v, double sps, size_t from, double wall_s) {
    const plan *p = v->p;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "format", "cephalo-run-summary");
    cJSON_AddNumberToObject(o, "version", 1);
    cJSON_AddStringToObject(o, "job", v->j->name);
    cJSON_AddStringToObject(o, "model", p->cm->model->name);
    cJSON_AddStringToObject(o, "strategy", strategy_name(p->strat));
    cJSON_AddNumberToObject(o, "world_size", v->world);
    cJSON_AddNumberToObject(o, "batch", p->cm->batch);
    cJSON_AddNumberToObject(o, "seq", p->cm->seq);
    cJSON_AddNumberToObject(o, "steps", (double)v->j->train.steps);
    char name[PATH_LEN];
    cJSON_AddNumberToObject(o, "first_step", v->n_curve ? (double)v->curve[0].step : (double)resumed_step(v, name, sizeof name));
    cJSON_AddNumberToObject(o, "steps_run", (double)v->n_curve);
    cJSON_AddNumberToObject(o, "wall_s", wall_s);
    const view_point *with_loss = last_loss(v);
    if (with_loss) cJSON_AddNumberToObject(o, "final_loss", with_loss->loss);
    else cJSON_AddNullToObject(o, "final_loss");
    cJSON *loss = cJSON_AddArrayToObject(o, "loss"); /* null at a step without a loss */
    for (size_t i = 0; i < v->n_curve; i++)
        cJSON_AddItemToArray(loss, isnan(v->curve[i].loss) ? cJSON_CreateNull() : cJSON_CreateNumber(v->curve[i].loss));
    add_val_json(v, o);
    cJSON *s = cJSON_AddObjectToObject(o, "samples_per_s");
    cJSON_AddNumberToObject(s, "measured", sps);
    cJSON_AddNumberToObject(s, "predicted", p->samples_per_s);
    cJSON_AddNumberToObject(s, "steps_measured", (double)(v->n_curve - from));
    cJSON_AddItemToObject(o, "ranks", ranks_json(v));
    if (v->j->metrics_port) { /* the workers' endpoints (docs/metrics.md) */
        cJSON *mt = cJSON_AddArrayToObject(o, "metrics");
        char url[64];
        for (int r = 0; r < v->world; r++) {
            snprintf(url, sizeof url, "http://127.0.0.1:%ld/metrics", v->j->metrics_port + r);
            cJSON_AddItemToArray(mt, cJSON_CreateString(url));
        }
    }
    return o;
}

int view_summary(run_view *v, err_t *err) {
    double wall_s = clock_now_s() - v->t_start;
    size_t from;
    double sps = measured_sps(v, &from);
    print_summary(v, sps, from, wall_s);
    cJSON *o = summary_json(v, sps, from, wall_s);
    char *text = cJSON_Print(o), path[PATH_LEN];
    cJSON_Delete(o);
    if (!text) return err_set(err, "cannot render the summary (out of memory)");
    snprintf(path, sizeof path, "%s/summary.json", v->dir);
    size_t len = strlen(text);
    text = xrealloc(text, len + 2);
    text[len++] = '\n';
    int rc = file_write_atomic(path, text, len, 0, err);
    free(text);
    if (!rc) printf("summary: %s\n", path);
    fflush(stdout);
    return rc;
}
