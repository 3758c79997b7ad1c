/* report.c - `cephalo report RUN_DIR`: a finished (or running) run as one HTML page.
 *
 *   plan.json -> rep_rank[world] (device, batch, shard, predictions)
 *   rank-R.jsonl -> per rank: (steps done, loss, samples/s, step_ms, val_loss) series, peak bytes
 *   -> HTML: a header, SVG line charts (loss, samples/s), SVG bars (step time, memory), tables
 *
 * Everything is drawn here as inline SVG with fixed colours, so the page opens offline in any
 * browser and a test can read the numbers back from the points (docs/report.md says how). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/report.h"
#include "cli/run.h"
#include "common/args.h"
#include "common/fileio.h"
#include "common/json_util.h"
#include "common/log.h"
#include "common/outputs.h"
#include "common/strutil.h"
#include "common/version.h"

#define REP_MAX_LINE ((size_t)1 << 20) /* a step record is under 1 KiB: a longer line is not one */
#define REP_READ ((size_t)1 << 16)      /* read from a log at a time */
#define REP_MAX_POINTS 4000             /* above this a curve keeps every k-th step (and the last) */
#define REP_CURVE_RANKS 8               /* samples/s curves: the first 8 ranks, one colour each */
#define REP_WORLD_MAX 4096

static const char report_usage[] =
    "usage: cephalo report RUN_DIR [-o FILE]\n"
    "\n"
    "One self-contained HTML page of a run directory (`cephalo run --run-dir`): the train and\n"
    "validation loss curves, samples/s per rank, measured against predicted step time and peak\n"
    "memory per rank, and the plan table. Inline SVG and CSS: it opens offline (docs/report.md).\n"
    "\n"
    "  -o, --output FILE     the page (default RUN_DIR/report.html; '-' for stdout); written\n"
    "                        atomically, never over one of the run's own files\n"
    "  -h, --help            this text\n"
    "\n"
    "exit status: 0 written, 2 bad input (a missing or corrupt plan.json or rank log is named)\n";

/* One curve in fixed memory however long the log: the points of every stride-th record (stride a
 * power of two, doubled when REP_MAX_POINTS are kept, dropping every other point) and the newest
 * one, so that a log of millions of steps draws as at most REP_MAX_POINTS + 1 points. */
typedef struct series {
    double *x, *y; /* REP_MAX_POINTS each, allocated with the first point */
    int n;         /* points kept */
    long seen, stride;
    double last_x, last_y; /* the newest point (kept or not) */
} series;

/* Step times counted by value (open addressing; a count of 0 is an empty slot): the exact median
 * in memory by distinct values, not by steps. The worker logs step_ms to the microsecond, so even
 * a run of millions of steps repeats a few thousand values. */
typedef struct ms_value {
    double v;
    long count;
} ms_value;

typedef struct ms_counts {
    ms_value *slot;
    size_t mask, n; /* slots - 1, distinct values */
} ms_counts;

typedef struct rep_rank {
    const char *node, *device; /* in the plan's cJSON tree */
    long threads;              /* 0: not a CPU device */
    double capacity, batch, micro, micros, state_ratio, state_params;
    double pred_peak, pred_fwd, pred_bwd, pred_opt;
    /* from rank-R.jsonl */
    series loss, val, sps; /* the curves drawn: loss and val of rank 0, samples/s of the first ranks */
    long steps;            /* step records */
    double first, last;    /* steps done at the first and the newest record */
    double med_ms;         /* the median step time (median_ms), -1 before any step */
    double sps_sum;        /* of samples/s, for the mean */
    double peak;           /* the largest peak_bytes logged, -1 before any step */
} rep_rank;

typedef struct report {
    const char *dir;
    cJSON *plan;
    const char *model, *strategy, *costs, *precision;
    double batch, seq, iter_ms, pred_sps;
    int world;
    rep_rank *r;
} report;

static void series_add(series *s, double x, double y) {
    if (!s->x) {
        s->x = xmalloc(REP_MAX_POINTS * sizeof *s->x);
        s->y = xmalloc(REP_MAX_POINTS * sizeof *s->y);
        s->stride = 1;
    }
    if (s->seen % s->stride == 0) {
        if (s->n == REP_MAX_POINTS) { /* keep every other point: the stride doubles */
            for (int k = 0; 2 * k < s->n; k++) s->x[k] = s->x[2 * k], s->y[k] = s->y[2 * k];
            s->n = (s->n + 1) / 2, s->stride *= 2;
        }
        if (s->seen % s->stride == 0) s->x[s->n] = x, s->y[s->n] = y, s->n++;
    }
    s->last_x = x, s->last_y = y, s->seen++;
}

/* The points drawn: those kept, and the newest when it is not one of them. */
static int series_len(const series *s) { return s->n + (s->seen > 0 && (s->seen - 1) % s->stride != 0); }

static void series_at(const series *s, int k, double *x, double *y) {
    *x = k < s->n ? s->x[k] : s->last_x, *y = k < s->n ? s->y[k] : s->last_y;
}

static void series_free(series *s) { free(s->x), free(s->y); }

static void ms_count(ms_counts *c, double v, long count) {
    if (!c->slot) c->mask = 1023, c->slot = xcalloc(c->mask + 1, sizeof *c->slot);
    if (v == 0) v = 0; /* -0 and 0 are one value */
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    size_t i = (size_t)((bits * 0x9e3779b97f4a7c15ull) >> 20) & c->mask;
    while (c->slot[i].count && c->slot[i].v != v) i = (i + 1) & c->mask;
    if (!c->slot[i].count) c->slot[i].v = v, c->n++;
    c->slot[i].count += count;
    if (2 * c->n <= c->mask + 1) return;
    ms_counts big = {xcalloc(2 * (c->mask + 1), sizeof *big.slot), 2 * (c->mask + 1) - 1, 0};
    for (size_t k = 0; k <= c->mask; k++)
        if (c->slot[k].count) ms_count(&big, c->slot[k].v, c->slot[k].count);
    free(c->slot);
    *c = big;
}

static void ms_clear(ms_counts *c) {
    if (c->slot) memset(c->slot, 0, (c->mask + 1) * sizeof *c->slot);
    c->n = 0;
}

static int cmp_value(const void *a, const void *b) {
    double x = ((const ms_value *)a)->v, y = ((const ms_value *)b)->v;
    return (x > y) - (x < y);
}

/* The k-th smallest (from 0) of the values counted in d[], sorted. */
static double kth(const ms_value *d, long k) {
    for (;; d++) {
        if (k < d->count) return d->v;
        k -= d->count;
    }
}

/* The median of the m values counted (m > 0): the middle one, or the mean of the two middle ones.
 * The distinct values are sorted: O(d log d) for d of them. */
static double ms_median(const ms_counts *c, long m) {
    ms_value *d = xmalloc(c->n * sizeof *d);
    size_t k = 0;
    for (size_t i = 0; i <= c->mask; i++)
        if (c->slot[i].count) d[k++] = c->slot[i];
    qsort(d, k, sizeof *d, cmp_value);
    double med = m % 2 ? kth(d, m / 2) : (kth(d, m / 2 - 1) + kth(d, m / 2)) / 2;
    free(d);
    return med;
}

/* ---- reading the run directory ---- */

static int plan_number(const json_ctx *c, const cJSON *obj, const char *path, const char *key, double *out) {
    const cJSON *v;
    char where[96];
    snprintf(where, sizeof where, "%s%s%s", path, *path ? "." : "", key);
    if (json_require(c, obj, path, key, &v) < 0) return -1;
    return json_number(c, v, where, 0, INFINITY, JSON_CLOSED, out);
}

static int plan_string(const json_ctx *c, const cJSON *obj, const char *path, const char *key, const char **out) {
    const cJSON *v;
    char where[96];
    snprintf(where, sizeof where, "%s%s%s", path, *path ? "." : "", key);
    if (json_require(c, obj, path, key, &v) < 0) return -1;
    return json_string(c, v, where, out);
}

static int read_rank_plan(const json_ctx *c, const cJSON *o, int i, rep_rank *r) {
    char path[32], pp[48];
    snprintf(path, sizeof path, "ranks[%d]", i);
    snprintf(pp, sizeof pp, "%s.predicted", path);
    const cJSON *pred, *th = json_get(o, "threads");
    double threads = 0;
    if (json_expect_object(c, o, path) < 0 || plan_string(c, o, path, "node", &r->node) < 0 ||
        plan_string(c, o, path, "device", &r->device) < 0 || plan_number(c, o, path, "memory_bytes", &r->capacity) < 0 ||
        plan_number(c, o, path, "batch", &r->batch) < 0 || plan_number(c, o, path, "microbatch", &r->micro) < 0 ||
        plan_number(c, o, path, "microbatches", &r->micros) < 0 ||
        plan_number(c, o, path, "state_ratio", &r->state_ratio) < 0 ||
        plan_number(c, o, path, "state_params", &r->state_params) < 0 ||
        (th && plan_number(c, o, path, "threads", &threads) < 0) || json_require(c, o, path, "predicted", &pred) < 0 ||
        plan_number(c, pred, pp, "peak_bytes", &r->pred_peak) < 0 || plan_number(c, pred, pp, "fwd_ms", &r->pred_fwd) < 0 ||
        plan_number(c, pred, pp, "bwd_ms", &r->pred_bwd) < 0 || plan_number(c, pred, pp, "optimizer_ms", &r->pred_opt) < 0)
        return -1;
    r->threads = (long)threads;
    r->peak = -1;
    return 0;
}

static int read_plan(report *rp, err_t *err) {
    char path[PATH_LEN];
    snprintf(path, sizeof path, "%s/plan.json", rp->dir);
    if (!(rp->plan = json_load_file(path, err))) return -1;
    json_ctx c = {path, err};
    const cJSON *in, *pred, *ranks, *feasible = json_get(rp->plan, "feasible");
    double world;
    if (json_expect_object(&c, rp->plan, "the document") < 0 || json_require(&c, rp->plan, "", "inputs", &in) < 0 ||
        plan_string(&c, in, "inputs", "model", &rp->model) < 0 || plan_string(&c, in, "inputs", "strategy", &rp->strategy) < 0 ||
        plan_string(&c, in, "inputs", "costs", &rp->costs) < 0 || plan_string(&c, in, "inputs", "precision", &rp->precision) < 0 ||
        plan_number(&c, in, "inputs", "batch", &rp->batch) < 0 || plan_number(&c, in, "inputs", "seq", &rp->seq) < 0)
        return -1;
    if (!cJSON_IsTrue(feasible)) return err_set(err, "%s: the plan is not feasible: no run was started from it", path);
    if (plan_number(&c, rp->plan, "", "world_size", &world) < 0 || json_require(&c, rp->plan, "", "predicted", &pred) < 0 ||
        plan_number(&c, pred, "predicted", "iter_ms", &rp->iter_ms) < 0 ||
        plan_number(&c, pred, "predicted", "samples_per_s", &rp->pred_sps) < 0 ||
        json_require(&c, rp->plan, "", "ranks", &ranks) < 0)
        return -1;
    int n;
    if (json_expect_array(&c, ranks, "ranks", &n) < 0) return -1;
    if (world < 1 || world > REP_WORLD_MAX || n != (int)world)
        return err_set(err, "%s: ranks: %d entries for world_size %.0f", path, n, world);
    rp->world = n;
    rp->r = calloc(n, sizeof *rp->r);
    const cJSON *o;
    int i = 0;
    cJSON_ArrayForEach(o, ranks) { /* an array is a linked list: one pass, not an item by index */
        if (read_rank_plan(&c, o, i, &rp->r[i]) < 0) return -1;
        i++;
    }
    return 0;
}

/* What reading a rank's log keeps beyond its rep_rank: its step times (the first two apart: the
 * median leaves them out) and whether its curves are drawn. */
typedef struct rank_read {
    ms_counts ms;
    double head[2];
    bool loss_curves, sps_curve;
} rank_read;

/* One step record (docs/worker.md "Output") of FILE:LINE into r; 1 when it is not a step record
 * (an object without "step", skipped as the progress view skips it). */
static int read_step(const json_ctx *c, const cJSON *o, rep_rank *r, rank_read *rr) {
    const cJSON *v;
    double step, loss = 0, ms, sps, peak;
    if (!json_get(o, "step")) return 1;
    if (json_number(c, json_get(o, "step"), "step", 0, 1e15, JSON_CLOSED, &step) < 0 || json_require(c, o, "", "loss", &v) < 0 ||
        /* null: a loss that was not finite (docs/worker.md), a gap in the curve */
        (!cJSON_IsNull(v) && json_number(c, v, "loss", -INFINITY, INFINITY, JSON_CLOSED, &loss) < 0) ||
        json_require(c, o, "", "step_ms", &v) < 0 || json_number(c, v, "step_ms", 0, INFINITY, JSON_CLOSED, &ms) < 0 ||
        json_require(c, o, "", "samples_per_s", &v) < 0 || json_number(c, v, "samples_per_s", 0, INFINITY, JSON_CLOSED, &sps) < 0 ||
        json_require(c, o, "", "peak_bytes", &v) < 0 || json_number(c, v, "peak_bytes", 0, INFINITY, JSON_CLOSED, &peak) < 0)
        return -1;
    const cJSON *val = json_get(o, "val_loss");
    double vl = 0;
    /* null: an overflowed fp16 evaluation */
    if (val && !cJSON_IsNull(val) && json_number(c, val, "val_loss", -INFINITY, INFINITY, JSON_CLOSED, &vl) < 0) return -1;
    double done = step + 1; /* "step" counts from 0; the curves are over steps done */
    if (rr->loss_curves && !cJSON_IsNull(json_get(o, "loss"))) series_add(&r->loss, done, loss);
    if (rr->loss_curves && val && !cJSON_IsNull(val)) series_add(&r->val, done, vl);
    if (rr->sps_curve) series_add(&r->sps, done, sps);
    if (r->steps < 2) rr->head[r->steps] = ms;
    else ms_count(&rr->ms, ms, 1);
    if (!r->steps) r->first = done;
    r->last = done, r->steps++;
    r->sps_sum += sps;
    r->peak = fmax(r->peak, peak);
    return 0;
}

/* The median of the rank's step times, leaving out the first 2 steps (allocation, caches) as the
 * run's summary does; -1 without steps. */
static double median_ms(const rep_rank *r, const rank_read *rr) {
    if (r->steps > 2) return ms_median(&rr->ms, r->steps - 2);
    return r->steps == 2 ? (rr->head[0] + rr->head[1]) / 2 : r->steps ? rr->head[0] : -1;
}

/* A file's lines through one buffer of REP_MAX_LINE + REP_READ bytes: a log of any length is read
 * in the memory of one line. */
typedef struct line_reader {
    FILE *f;
    char *buf;
    size_t start, end; /* the bytes read and not yet returned: buf[start, end) */
    bool eof;
} line_reader;

/* The next complete line (its '\n' replaced by a NUL): 1 with it in *line and *len; 0 at the end
 * (a last line without its newline is left out); -1 with errno for a read error, or errno 0 for a
 * line longer than REP_MAX_LINE. */
static int lines_next(line_reader *lr, char **line, size_t *len) {
    for (;;) {
        char *p = lr->buf + lr->start, *nl = memchr(p, '\n', lr->end - lr->start);
        if (nl && (size_t)(nl - p) > REP_MAX_LINE) return errno = 0, -1;
        if (nl) {
            *nl = '\0', *line = p, *len = (size_t)(nl - p);
            lr->start += *len + 1;
            return 1;
        }
        if (lr->eof) return 0;
        if (lr->end - lr->start > REP_MAX_LINE) return errno = 0, -1;
        memmove(lr->buf, p, lr->end - lr->start); /* a part of one line: at most REP_MAX_LINE bytes */
        lr->end -= lr->start, lr->start = 0;
        size_t got = fread(lr->buf + lr->end, 1, REP_MAX_LINE + REP_READ - lr->end, lr->f);
        lr->end += got;
        if (got == 0 && ferror(lr->f)) return -1;
        lr->eof = got == 0;
    }
}

/* rank-R.jsonl, streamed: every complete line a JSON object; a last line without its newline is one
 * the worker is still writing (a running run) and is left out. */
static int read_rank_log(report *rp, int rank, char *buf, rank_read *rr, err_t *err) {
    char path[PATH_LEN], where[PATH_LEN + 32];
    snprintf(path, sizeof path, "%s/rank-%d.jsonl", rp->dir, rank);
    struct stat st;
    int fd = file_open_read(path, false, &st, err);
    if (fd < 0) return -1;
    line_reader lr = {fdopen(fd, "rb"), buf, 0, 0, false};
    if (!lr.f) abort();
    rep_rank *r = &rp->r[rank];
    rr->loss_curves = rank == 0, rr->sps_curve = rank < REP_CURVE_RANKS;
    ms_clear(&rr->ms);
    int rc = 0, got;
    long line = 0;
    char *p;
    size_t len;
    while (rc == 0 && (got = lines_next(&lr, &p, &len)) > 0) {
        line++;
        if (len == 0) continue;
        snprintf(where, sizeof where, "%s:%ld", path, line);
        err_t why; /* the project's one JSON rule (json_util.h): a key twice is refused too */
        cJSON *o = json_parse("line", p, len, &why);
        if (!cJSON_IsObject(o)) {
            rc = o ? err_set(err, "%s: not a JSON object (a step record of docs/worker.md \"Output\"): '%.40s%s'", where, p,
                             len > 40 ? "..." : "")
                   : err_set(err, "%s: not a JSON object (a step record of docs/worker.md \"Output\"): %s", where, why.msg);
            for (char *q = err->msg; *q; q++)
                if (*q == '\n') *q = ' ';
        } else {
            json_ctx c = {where, err};
            rc = read_step(&c, o, r, rr) < 0 ? -1 : 0;
        }
        cJSON_Delete(o);
    }
    if (rc == 0 && got < 0 && errno)
        rc = err_set(err, "%s: cannot read: %s", path, strerror(errno));
    else if (rc == 0 && got < 0)
        rc = err_set(err, "%s:%ld: a line longer than %zu MiB: not a step record (docs/worker.md \"Output\")", path, line + 1,
                     REP_MAX_LINE >> 20);
    fclose(lr.f);
    r->med_ms = rc == 0 ? median_ms(r, rr) : -1;
    return rc;
}

/* ---- drawing ---- */

static const char *const palette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"};
#define TRAIN_COLOR "#1f77b4"
#define VAL_COLOR "#d62728"
#define PRED_COLOR "#9e9e9e"
#define CAP_COLOR "#e0e0e0"

/* Text into HTML (element content and attribute values alike). */
static void html_puts(FILE *f, const char *s) {
    for (; *s; s++) switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&#39;", f); break;
        default: fputc(*s, f);
        }
}

/* A tick step of 1, 2 or 5 times a power of ten giving about n ticks over [lo, hi]. */
static double nice_step(double lo, double hi, int n) {
    double raw = (hi - lo) / n, p = pow(10, floor(log10(raw))), m = raw / p;
    return p * (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10);
}

static void widen(double *lo, double *hi) {
    if (*hi > *lo) return;
    double d = fabs(*lo) * 0.1 + (*lo == 0 ? 1 : 0);
    *lo -= d, *hi += d;
}

/* A curve of a line chart: class and data-rank say what it is to a reader of the page's SVG. */
typedef struct chart_line {
    const char *cls, *label, *color;
    const series *s;
    int rank; /* -1: none */
    bool dots;
} chart_line;

enum { CW = 760, CH = 300, ML = 70, MR = 20, MT = 34, MB = 42 };

/* x of step k, y of value v in the plot box */
#define PX(x) (ML + ((x) - x0) / (x1 - x0) * (CW - ML - MR))
#define PY(y) (CH - MB - ((y) - y0) / (y1 - y0) * (CH - MT - MB))

static void axes(FILE *f, double x0, double x1, double y0, double y1, const char *xlabel, const char *ylabel) {
    double ys = nice_step(y0, y1, 5), xs = nice_step(x0, x1, 8);
    for (double y = ceil(y0 / ys) * ys; y <= y1 + ys * 1e-9; y += ys)
        fprintf(f, "<line class=\"grid\" x1=\"%d\" x2=\"%d\" y1=\"%.2f\" y2=\"%.2f\"/><text class=\"tick\" x=\"%d\" y=\"%.2f\" text-anchor=\"end\">%.4g</text>\n",
                ML, CW - MR, PY(y), PY(y), ML - 6, PY(y) + 4, fabs(y) < ys * 1e-9 ? 0 : y);
    for (double x = ceil(x0 / xs) * xs; x <= x1 + xs * 1e-9; x += xs)
        fprintf(f, "<text class=\"tick\" x=\"%.2f\" y=\"%d\" text-anchor=\"middle\">%.6g</text>\n", PX(x), CH - MB + 16, x);
    fprintf(f, "<rect class=\"frame\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\"/>\n", ML, MT, CW - ML - MR, CH - MT - MB);
    fprintf(f, "<text class=\"axis\" x=\"%d\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", (ML + CW - MR) / 2, CH - 6, xlabel);
    fprintf(f, "<text class=\"axis\" transform=\"translate(16 %d) rotate(-90)\" text-anchor=\"middle\">%s</text>\n", (MT + CH - MB) / 2, ylabel);
}

/* A line chart of n curves over steps done. The plot group carries its mapping (data-box: left,
 * top, width, height in pixels; data-x, data-y: the value ranges) so that the points can be read
 * back as values; a curve of more than REP_MAX_POINTS steps keeps every k-th one and the last
 * (series_add). */
static void line_chart(FILE *f, const char *id, const char *title, const char *ylabel, const chart_line *lines, int n) {
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY, x, y;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < series_len(lines[i].s); k++) {
            series_at(lines[i].s, k, &x, &y);
            x0 = fmin(x0, x), x1 = fmax(x1, x), y0 = fmin(y0, y), y1 = fmax(y1, y);
        }
    if (!isfinite(x0)) x0 = 0, x1 = 1, y0 = 0, y1 = 1;
    widen(&x0, &x1), widen(&y0, &y1);
    double pad = (y1 - y0) * 0.05;
    y0 -= pad, y1 += pad;
    fprintf(f, "<figure><svg id=\"%s\" class=\"chart\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\">\n",
            id, CW, CH, CW, CH);
    fprintf(f, "<text class=\"title\" x=\"%d\" y=\"20\">%s</text>\n", ML, title);
    fprintf(f, "<g class=\"plot\" data-box=\"%d %d %d %d\" data-x=\"%.17g %.17g\" data-y=\"%.17g %.17g\">\n", ML, MT, CW - ML - MR,
            CH - MT - MB, x0, x1, y0, y1);
    axes(f, x0, x1, y0, y1, "step", ylabel);
    int lx = CW - MR - 8;
    for (int i = n - 1; i >= 0; i--) { /* the legend, right-aligned at the top */
        int tw = 6 * (int)strlen(lines[i].label); /* about 6 px a character at 12 px */
        fprintf(f, "<line x1=\"%d\" x2=\"%d\" y1=\"18\" y2=\"18\" stroke=\"%s\" stroke-width=\"3\"/>", lx - tw - 22, lx - tw - 6, lines[i].color);
        fprintf(f, "<text class=\"legend\" x=\"%d\" y=\"22\" text-anchor=\"end\">", lx);
        html_puts(f, lines[i].label);
        fputs("</text>\n", f);
        lx -= 34 + tw;
    }
    for (int i = 0; i < n; i++) {
        const series *s = lines[i].s;
        int shown = series_len(s);
        fprintf(f, "<polyline class=\"%s\" data-n=\"%d\"", lines[i].cls, shown);
        if (lines[i].rank >= 0) fprintf(f, " data-rank=\"%d\"", lines[i].rank);
        fprintf(f, " fill=\"none\" stroke=\"%s\" stroke-width=\"2.5\" stroke-linejoin=\"round\" points=\"", lines[i].color);
        for (int k = 0; k < shown; k++) {
            series_at(s, k, &x, &y);
            fprintf(f, "%s%.2f,%.2f", k ? " " : "", PX(x), PY(y));
        }
        fputs("\"/>\n", f);
        for (int k = 0; lines[i].dots && k < shown; k++) {
            series_at(s, k, &x, &y);
            fprintf(f, "<circle class=\"%s-point\" cx=\"%.2f\" cy=\"%.2f\" r=\"3.5\" fill=\"%s\"/>\n", lines[i].cls, PX(x), PY(y),
                    lines[i].color);
        }
    }
    fputs("</g></svg></figure>\n", f);
}

/* Horizontal bars per rank, k bars a rank (measured, predicted, ...): rect data-rank, data-kind,
 * data-value for a reader of the page. */
static void bar_chart(FILE *f, const char *id, const char *title, const char *unit, double scale, const report *rp,
                      const char *const *kinds, const char *const *colors, int k, double (*value)(const rep_rank *, int)) {
    int bh = 12, gap = 10, top = 44, h = top + rp->world * (k * bh + gap) + 30, left = 70, w = CW - left - 150;
    double vmax = 0;
    for (int r = 0; r < rp->world; r++)
        for (int j = 0; j < k; j++) vmax = fmax(vmax, value(&rp->r[r], j));
    if (vmax <= 0) vmax = 1;
    fprintf(f, "<figure><svg id=\"%s\" class=\"chart\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\">\n",
            id, CW, h, CW, h);
    fprintf(f, "<text class=\"title\" x=\"%d\" y=\"20\">%s</text>\n", left, title);
    for (int j = 0, lx = left; j < k; j++, lx += 130)
        fprintf(f, "<rect x=\"%d\" y=\"28\" width=\"10\" height=\"10\" fill=\"%s\"/><text class=\"legend\" x=\"%d\" y=\"37\">%s</text>\n", lx,
                colors[j], lx + 14, kinds[j]);
    for (int r = 0; r < rp->world; r++) {
        int y = top + r * (k * bh + gap);
        fprintf(f, "<text class=\"tick\" x=\"%d\" y=\"%d\" text-anchor=\"end\">rank %d</text>\n", left - 8, y + k * bh / 2 + 4, r);
        for (int j = 0; j < k; j++) {
            double v = value(&rp->r[r], j);
            if (v < 0) continue; /* not measured (no step logged) */
            fprintf(f, "<rect class=\"bar\" data-rank=\"%d\" data-kind=\"%s\" data-value=\"%.17g\" x=\"%d\" y=\"%d\" width=\"%.2f\" height=\"%d\" fill=\"%s\"/>",
                    r, kinds[j], v, left, y + j * bh, v / vmax * w, bh - 2, colors[j]);
            fprintf(f, "<text class=\"tick\" x=\"%.2f\" y=\"%d\">%.4g %s</text>\n", left + v / vmax * w + 4, y + j * bh + 9, v / scale, unit);
        }
    }
    fputs("</svg></figure>\n", f);
}

static const report *bar_report; /* the report bar values are read from (one page at a time) */

static double step_value(const rep_rank *r, int kind) {
    return kind == 0 ? r->med_ms : kind == 1 ? bar_report->iter_ms : r->pred_fwd + r->pred_bwd + r->pred_opt;
}

static double mem_value(const rep_rank *r, int kind) { return kind == 0 ? r->peak : kind == 1 ? r->pred_peak : r->capacity; }

static void page_head(FILE *f, const report *rp) {
    fputs("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>cephalo report: ", f);
    html_puts(f, rp->dir);
    fputs("</title>\n<style>\n"
          "body{font-family:sans-serif;margin:24px;color:#222;background:#fff;max-width:1000px}\n"
          "h1{font-size:20px}h2{font-size:16px;margin-top:28px}figure{margin:8px 0}\n"
          "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}\n"
          "th{background:#f3f3f3}td.l,th.l{text-align:left}\n"
          "svg text{font:12px sans-serif;fill:#333}svg .title{font-size:14px;font-weight:bold}\n"
          "svg .grid{stroke:#eee}svg .frame{fill:none;stroke:#999}\n"
          "</style></head><body>\n<h1>cephalo report: ",
          f);
    html_puts(f, rp->dir);
    fputs("</h1>\n<p>model <b>", f);
    html_puts(f, rp->model);
    fputs("</b>, strategy ", f);
    html_puts(f, rp->strategy);
    fprintf(f, ", %d rank%s, global batch %.0f, seq %.0f, ", rp->world, rp->world == 1 ? "" : "s", rp->batch, rp->seq);
    html_puts(f, rp->precision);
    fputs("; costs: ", f);
    html_puts(f, rp->costs);
    const rep_rank *r0 = &rp->r[0];
    double med = r0->med_ms;
    fprintf(f, ".<br>steps logged: %ld (%.0f..%.0f)", r0->steps, r0->first, r0->last);
    if (r0->loss.seen) fprintf(f, "; final loss %.4f", r0->loss.last_y);
    if (r0->val.seen) fprintf(f, "; validation loss %.4f after step %.0f", r0->val.last_y, r0->val.last_x);
    if (med > 0)
        fprintf(f, ".<br>samples/s: <span id=\"sps-measured\">%.1f</span> measured (global batch over rank 0's median step time), "
                   "<span id=\"sps-predicted\">%.1f</span> predicted (measured/predicted %.2f)",
                rp->batch * 1e3 / med, rp->pred_sps, rp->batch * 1e3 / med / rp->pred_sps);
    fputs(".</p>\n", f);
}

static void plan_table(FILE *f, const report *rp) {
    char a[32], b[32];
    fputs("<h2>Plan</h2>\n<table id=\"plan\"><tr><th>rank</th><th class=\"l\">node</th><th class=\"l\">device</th><th>threads</th>"
          "<th>batch</th><th>microbatch</th><th>microbatches</th><th>shard (state)</th><th>shard params</th>"
          "<th>predicted fwd ms</th><th>bwd ms</th><th>optimizer ms</th><th>predicted peak</th><th>capacity</th></tr>\n",
          f);
    for (int i = 0; i < rp->world; i++) {
        const rep_rank *r = &rp->r[i];
        char th[24] = "";
        if (r->threads) snprintf(th, sizeof th, "%ld", r->threads);
        fprintf(f, "<tr><td>%d</td><td class=\"l\">", i);
        html_puts(f, r->node);
        fputs("</td><td class=\"l\">", f);
        html_puts(f, r->device);
        fprintf(f, "</td><td>%s</td><td>%.0f</td><td>%.0f</td><td>%.0f</td><td>%.2f%%</td><td>%.0f</td><td>%.2f</td><td>%.2f</td><td>%.2f</td><td>%s</td><td>%s</td></tr>\n",
                th, r->batch, r->micro, r->micros, 100 * r->state_ratio, r->state_params, r->pred_fwd,
                r->pred_bwd, r->pred_opt, str_bytes(r->pred_peak, a, sizeof a), str_bytes(r->capacity, b, sizeof b));
    }
    fputs("</table>\n", f);
}

static void measured_table(FILE *f, const report *rp) {
    char a[32], b[32], c[32];
    fputs("<h2>Measured against predicted</h2>\n<table id=\"measured\"><tr><th>rank</th><th>steps</th><th>step ms measured (median)</th>"
          "<th>step ms predicted</th><th>measured/predicted</th><th>samples/s (mean)</th><th>peak measured</th>"
          "<th>peak predicted</th><th>capacity</th></tr>\n",
          f);
    for (int i = 0; i < rp->world; i++) {
        const rep_rank *r = &rp->r[i];
        double med = r->med_ms, sps = r->steps ? r->sps_sum / r->steps : 0;
        fprintf(f, "<tr><td>%d</td><td>%ld</td>", i, r->steps);
        if (med >= 0) fprintf(f, "<td>%.2f</td><td>%.2f</td><td>%.2f</td><td>%.1f</td><td>%s</td>", med, rp->iter_ms, med / rp->iter_ms, sps, str_bytes(r->peak, a, sizeof a));
        else fprintf(f, "<td>-</td><td>%.2f</td><td>-</td><td>-</td><td>-</td>", rp->iter_ms);
        fprintf(f, "<td>%s</td><td>%s</td></tr>\n", str_bytes(r->pred_peak, b, sizeof b), str_bytes(r->capacity, c, sizeof c));
    }
    fputs("</table>\n", f);
}

static void write_page(FILE *f, report *rp) {
    page_head(f, rp);
    fputs("<h2>Loss</h2>\n", f);
    chart_line loss[2] = {{"train-loss", "train loss (rank 0)", TRAIN_COLOR, &rp->r[0].loss, -1, false},
                          {"val-loss", "validation loss", VAL_COLOR, &rp->r[0].val, -1, true}};
    line_chart(f, "loss", "Loss over steps", "loss", loss, rp->r[0].val.seen ? 2 : 1);
    fputs("<h2>Throughput</h2>\n", f);
    chart_line *sps = calloc(rp->world, sizeof *sps);
    char(*labels)[24] = calloc(rp->world, sizeof *labels);
    int n = rp->world > REP_CURVE_RANKS ? REP_CURVE_RANKS : rp->world; /* more ranks than colours: the first 8 */
    for (int i = 0; i < n; i++) {
        snprintf(labels[i], sizeof labels[i], "rank %d", i);
        sps[i] = (chart_line){"samples-per-s", labels[i], palette[i % 8], &rp->r[i].sps, i, false};
    }
    line_chart(f, "samples", "Samples/s per rank (the rank's batch over its step time)", "samples/s", sps, n);
    free(sps), free(labels);
    fputs("<h2>Step time and memory</h2>\n", f);
    bar_report = rp;
    bar_chart(f, "step-time", "Step time per rank: measured (median) against predicted", "ms", 1, rp,
              (const char *const[]){"measured", "predicted iteration", "predicted compute"},
              (const char *const[]){TRAIN_COLOR, PRED_COLOR, CAP_COLOR}, 3, step_value);
    bar_chart(f, "memory", "Peak device memory per rank: measured against predicted and capacity", "MiB", 1 << 20, rp,
              (const char *const[]){"measured", "predicted", "capacity"}, (const char *const[]){"#2ca02c", PRED_COLOR, CAP_COLOR},
              3, mem_value);
    measured_table(f, rp);
    plan_table(f, rp);
    fprintf(f, "<p style=\"color:#777;font-size:12px\">written by cephalo report (%s) from plan.json and rank-R.jsonl</p>\n</body></html>\n",
            cephalo_version());
}

static void report_free(report *rp) {
    for (int i = 0; rp->r && i < rp->world; i++) {
        rep_rank *r = &rp->r[i];
        series_free(&r->loss), series_free(&r->sps), series_free(&r->val);
    }
    free(rp->r);
    cJSON_Delete(rp->plan);
}

static int build_report(const char *dir, const char *out, err_t *err) {
    report rp = {.dir = dir};
    char *html = NULL;
    size_t len = 0;
    int rc = file_expect_dir(dir, err) < 0 || read_plan(&rp, err) < 0 ? -1 : 0;
    /* one line buffer and one count of step times for all the logs, read one after the other */
    char *buf = xmalloc(REP_MAX_LINE + REP_READ);
    rank_read rr = {0};
    for (int i = 0; rc == 0 && i < rp.world; i++) rc = read_rank_log(&rp, i, buf, &rr, err);
    free(buf), free(rr.ms.slot);
    if (rc == 0 && rp.r[0].steps == 0)
        rc = err_set(err, "%s/rank-0.jsonl: no step record yet (the run has not finished a step)", dir);
    if (rc == 0) {
        FILE *f = open_memstream(&html, &len);
        if (!f) abort();
        write_page(f, &rp);
        fclose(f);
        if (!strcmp(out, "-")) rc = fwrite(html, 1, len, stdout) == len && fflush(stdout) == 0 ? 0 : err_set(err, "stdout: %s", strerror(errno));
        else rc = file_write_atomic(out, html, len, 0, err);
    }
    free(html);
    report_free(&rp);
    return rc;
}

int report_main(int argc, char **argv) {
    static const struct option opts[] = {{"output", required_argument, 0, 'o'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    args a = args_begin(argc, argv, "cephalo report", opts, "o:", report_usage);
    const char *out = NULL;
    int ch, rc = 0;
    while ((ch = args_next(&a)) > 0)
        if (ch == 'o') out = a.val;
    char **rest;
    int n = args_operands(&a, &rest);
    if (ch < 0) return ARGS_BAD;
    if (n != 1) return args_bad(&a, n ? "one run directory expected, got %d operands" : "missing RUN_DIR (a `cephalo run --run-dir` directory)", n);
    const char *dir = rest[0];
    char def[PATH_LEN];
    if (!out) snprintf(def, sizeof def, "%s/report.html", dir), out = def;
    err_t err;
    out_set s = out_begin("cephalo report");
    out_input_dir(&s, "RUN_DIR", dir, &run_dir_kind);
    out_file(&s, "-o", out);
    rc = out_check(&s, &err);
    out_free(&s);
    if (rc == 0) rc = build_report(dir, out, &err);
    if (rc < 0) {
        fprintf(stderr, "cephalo report: %s\n", err.msg);
        return ARGS_BAD;
    }
    if (strcmp(out, "-")) printf("report: %s\n", out);
    return 0;
}
