/* metrics.c - the worker's /metrics and /healthz (metrics.h, docs/metrics.md).
 *
 * The training thread writes the registry after each step and libmicrohttpd's thread reads it
 * when Prometheus scrapes; one mutex covers both, and rendering is a few hundred bytes of text, so
 * neither side waits noticeably. The listening socket is opened here, not by libmicrohttpd, so
 * that a port in use is reported with its errno and port 0 can tell which port it got. */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <microhttpd.h>

#include "cmd/metrics.h"
#include "common/env.h"
#include "common/json_util.h"
#include "common/log.h"
#include "common/strutil.h"
#include "common/version.h"
#include "planner/gpu.h"
#include "planner/model.h"

/* Upper bounds of cephalo_step_seconds's buckets: milliseconds (tiny CPU jobs) to a minute
 * (large models on slow GPUs). */
static const double step_buckets[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
#define N_BUCKETS (sizeof step_buckets / sizeof step_buckets[0])

struct metrics {
    pthread_mutex_t mu;
    metrics_info info;
    char *labels; /* job="..",rank="..",device=".." (escaped) */
    struct MHD_Daemon *daemon;
    /* counters and the last step's gauges; guarded by mu */
    int64_t steps, samples;
    int64_t step, ckpt_step; /* the job's step; the last checkpoint's step (-1: none yet) */
    double compute_s, comm_s, offload_s, step_sum_s;
    int64_t bucket[N_BUCKETS + 1]; /* per bucket, not cumulative; the last is (60, +Inf) */
    double tokens_per_s, samples_per_s, loss, mfu;
    double loss_scale; /* 0: not fp16 */
    int64_t skipped;
    int64_t empty;   /* steps without a target that counts (they have no loss) */
    bool has_loss;   /* a step with a loss was recorded: m->loss is the last one's */
    double val_loss;  /* the last validation loss, at the job's step val_step (-1: none yet) */
    int64_t val_step;
    int64_t mem_current, mem_peak, mem_state, mem_host;
    bool failed;
    char why[512];
};

/* ---- the text format ---- */

/* Label values escape backslash, double quote and newline (text format 0.0.4). */
static void put_label_value(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '\\') fputs("\\\\", f);
        else if (*s == '"') fputs("\\\"", f);
        else if (*s == '\n') fputs("\\n", f);
        else fputc(*s, f);
    }
}

/* Sample values: integers as integers, others as the shortest text that reads back the same;
 * Go's ParseFloat (Prometheus) spells the specials +Inf, -Inf and NaN. */
static const char *num(double v, char *buf) {
    if (isnan(v)) return "NaN";
    if (isinf(v)) return v > 0 ? "+Inf" : "-Inf";
    if (v == floor(v) && fabs(v) < 9007199254740992.0) return snprintf(buf, 32, "%.0f", v), buf;
    for (int digits = 6; digits <= 17; digits++) {
        snprintf(buf, 32, "%.*g", digits, v);
        if (strtod(buf, NULL) == v) break;
    }
    return buf;
}

static void family(FILE *f, const char *name, const char *type, const char *help) {
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* name{labels[,extra]} value */
static void sample(FILE *f, const metrics *m, const char *name, const char *extra, double v) {
    char b[32];
    fprintf(f, "%s{%s%s%s} %s\n", name, m->labels, extra ? "," : "", extra ? extra : "", num(v, b));
}

static void render(FILE *f, const metrics *m) {
    const metrics_info *in = &m->info;
    char le[64], b[32];
    family(f, "cephalo_train_steps_total", "counter", "Training steps this rank finished.");
    sample(f, m, "cephalo_train_steps_total", NULL, (double)m->steps);
    family(f, "cephalo_train_samples_total", "counter", "Samples this rank trained on (its batch per step).");
    sample(f, m, "cephalo_train_samples_total", NULL, (double)m->samples);
    family(f, "cephalo_train_tokens_per_second", "gauge",
           "This rank's tokens per second in the last step (the job's throughput is the sum over ranks).");
    if (m->steps) sample(f, m, "cephalo_train_tokens_per_second", NULL, m->tokens_per_s);
    family(f, "cephalo_train_samples_per_second", "gauge",
           "This rank's samples per second in the last step (the job's throughput is the sum over ranks).");
    if (m->steps) sample(f, m, "cephalo_train_samples_per_second", NULL, m->samples_per_s);
    family(f, "cephalo_train_step", "gauge", "The job's training step (steps before a resume count).");
    if (m->steps) sample(f, m, "cephalo_train_step", NULL, (double)m->step);
    family(f, "cephalo_checkpoint_step", "gauge", "The step of the last checkpoint written or resumed from.");
    if (m->ckpt_step >= 0) sample(f, m, "cephalo_checkpoint_step", NULL, (double)m->ckpt_step);
    family(f, "cephalo_train_loss", "gauge",
           "The job's mean training loss of the last step that had one (a step without a target has none).");
    if (m->has_loss) sample(f, m, "cephalo_train_loss", NULL, m->loss);
    if (m->empty) { /* from the first such step */
        family(f, "cephalo_train_empty_steps_total", "counter",
               "Steps whose global batch had no target that counts (every loss-mask byte 0): no loss, no update.");
        sample(f, m, "cephalo_train_empty_steps_total", NULL, (double)m->empty);
    }
    if (m->loss_scale > 0) { /* fp16 runs only */
        family(f, "cephalo_train_loss_scale", "gauge", "fp16: the dynamic loss scale for the next step.");
        sample(f, m, "cephalo_train_loss_scale", NULL, m->loss_scale);
        family(f, "cephalo_train_skipped_steps_total", "counter",
               "fp16: steps skipped because a gradient was not finite (the scale halved).");
        sample(f, m, "cephalo_train_skipped_steps_total", NULL, (double)m->skipped);
    }
    if (m->val_step >= 0) { /* runs with --val-data, from the first evaluation */
        family(f, "cephalo_train_val_loss", "gauge",
               "The job's validation loss (mean per target over the fixed validation samples) at cephalo_train_val_step.");
        sample(f, m, "cephalo_train_val_loss", NULL, m->val_loss);
        family(f, "cephalo_train_val_step", "gauge", "The job's step the last validation loss was computed after.");
        sample(f, m, "cephalo_train_val_step", NULL, (double)m->val_step);
    }
    family(f, "cephalo_step_seconds", "histogram", "Wall time of a training step.");
    int64_t cum = 0;
    for (size_t i = 0; i < N_BUCKETS; i++) {
        cum += m->bucket[i];
        snprintf(le, sizeof le, "le=\"%s\"", num(step_buckets[i], b));
        sample(f, m, "cephalo_step_seconds_bucket", le, (double)cum);
    }
    sample(f, m, "cephalo_step_seconds_bucket", "le=\"+Inf\"", (double)m->steps);
    sample(f, m, "cephalo_step_seconds_sum", NULL, m->step_sum_s);
    sample(f, m, "cephalo_step_seconds_count", NULL, (double)m->steps);
    family(f, "cephalo_compute_seconds_total", "counter",
           "Step time not spent waiting for collectives or in offload copies.");
    sample(f, m, "cephalo_compute_seconds_total", NULL, m->compute_s);
    family(f, "cephalo_comm_wait_seconds_total", "counter",
           "Time steps waited for collectives (communication not hidden behind compute).");
    sample(f, m, "cephalo_comm_wait_seconds_total", NULL, m->comm_s);
    family(f, "cephalo_offload_seconds_total", "counter",
           "Host wall time in the activation offload copy calls.");
    sample(f, m, "cephalo_offload_seconds_total", NULL, m->offload_s);
    family(f, "cephalo_memory_bytes", "gauge",
           "Device memory: current and peak allocated, training state (parameters, gradients, AdamW "
           "moments), and the host offload pool (kind=\"host\").");
    sample(f, m, "cephalo_memory_bytes", "kind=\"current\"", (double)m->mem_current);
    sample(f, m, "cephalo_memory_bytes", "kind=\"peak\"", (double)m->mem_peak);
    sample(f, m, "cephalo_memory_bytes", "kind=\"state\"", (double)m->mem_state);
    sample(f, m, "cephalo_memory_bytes", "kind=\"host\"", (double)m->mem_host);
    family(f, "cephalo_memory_capacity_bytes", "gauge", "The device's memory capacity.");
    if (in->capacity_bytes > 0) sample(f, m, "cephalo_memory_capacity_bytes", NULL, (double)in->capacity_bytes);
    family(f, "cephalo_model_flops_utilization", "gauge",
           "Model FLOPs per second of the last step over the device's peak (0..1).");
    if (m->steps && in->peak_flops > 0) sample(f, m, "cephalo_model_flops_utilization", NULL, m->mfu);
    family(f, "cephalo_plan_batch", "gauge", "This rank's samples per step (plan).");
    sample(f, m, "cephalo_plan_batch", NULL, in->batch);
    family(f, "cephalo_plan_microbatch", "gauge", "This rank's samples per microbatch (plan).");
    sample(f, m, "cephalo_plan_microbatch", NULL, in->microbatch);
    family(f, "cephalo_plan_microbatches", "gauge", "This rank's microbatches per step (plan).");
    sample(f, m, "cephalo_plan_microbatches", NULL, in->microbatches);
    family(f, "cephalo_plan_state_ratio", "gauge", "This rank's share of the training state (plan).");
    sample(f, m, "cephalo_plan_state_ratio", NULL, in->state_ratio);
    family(f, "cephalo_build_info", "gauge", CEPHALO_BUILD_INFO_HELP);
    char build[256];
    snprintf(build, sizeof build, "component=\"worker\",version=\"%s\",commit=\"%s\"", cephalo_version(), cephalo_commit());
    sample(f, m, "cephalo_build_info", build, 1);
}

char *metrics_render(metrics *m, size_t *len) {
    char *text = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&text, &n);
    if (!f) return NULL;
    pthread_mutex_lock(&m->mu);
    render(f, m);
    pthread_mutex_unlock(&m->mu);
    if (fclose(f) != 0) return free(text), NULL;
    if (len) *len = n;
    return text;
}

/* ---- the registry ---- */

metrics *metrics_new(const metrics_info *info) {
    metrics *m = xcalloc(1, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    m->info = *info;
    m->ckpt_step = -1;
    m->val_step = -1;
    m->info.job = xstrdup(info->job ? info->job : "");
    m->info.device = xstrdup(info->device ? info->device : "");
    char *text = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&text, &n);
    CHECK(f); /* only out of memory fails here */
    fputs("job=\"", f), put_label_value(f, m->info.job);
    fprintf(f, "\",rank=\"%d\",device=\"", info->rank), put_label_value(f, m->info.device);
    fputc('"', f);
    CHECK(fclose(f) == 0);
    m->labels = text;
    return m;
}

void metrics_free(metrics *m) {
    if (!m) return;
    if (m->daemon) MHD_stop_daemon(m->daemon); /* joins its thread, closes the socket */
    pthread_mutex_destroy(&m->mu);
    free((char *)m->info.job);
    free((char *)m->info.device);
    free(m->labels);
    free(m);
}

void metrics_record(metrics *m, const metrics_step *s) {
    double compute = s->step_s - s->comm_wait_s - s->offload_s;
    size_t b = 0;
    while (b < N_BUCKETS && s->step_s > step_buckets[b]) b++;
    pthread_mutex_lock(&m->mu);
    m->steps++;
    m->samples += s->samples;
    m->step_sum_s += s->step_s;
    m->bucket[b]++;
    m->compute_s += compute > 0 ? compute : 0; /* the timers overlap by a hair at worst */
    m->comm_s += s->comm_wait_s;
    m->offload_s += s->offload_s;
    if (!s->empty) m->loss = s->loss, m->has_loss = true;
    m->empty += s->empty;
    m->step = s->step;
    m->loss_scale = s->loss_scale;
    m->skipped += s->skipped;
    if (s->has_val) m->val_loss = s->val_loss, m->val_step = s->step;
    m->samples_per_s = s->step_s > 0 ? (double)s->samples / s->step_s : 0;
    m->tokens_per_s = s->step_s > 0 ? (double)s->samples * m->info.tokens_per_sample / s->step_s : 0;
    m->mfu = s->step_s > 0 && m->info.peak_flops > 0
                 ? (double)s->samples * m->info.flops_per_sample / s->step_s / m->info.peak_flops
                 : 0;
    m->mem_current = s->mem_current, m->mem_peak = s->mem_peak;
    m->mem_state = s->mem_state, m->mem_host = s->mem_host;
    pthread_mutex_unlock(&m->mu);
}

void metrics_checkpoint(metrics *m, int64_t step) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->ckpt_step = step;
    pthread_mutex_unlock(&m->mu);
}

void metrics_fail(metrics *m, const char *why) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->failed = true;
    snprintf(m->why, sizeof m->why, "%s", why);
    pthread_mutex_unlock(&m->mu);
}

/* ---- HTTP ---- */

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, const char *type, char *body, size_t len) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) return free(body), MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    enum MHD_Result rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result reply_text(struct MHD_Connection *c, unsigned status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static enum MHD_Result reply_text(struct MHD_Connection *c, unsigned status, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return reply(c, status, "text/plain; charset=utf-8", xstrdup(buf), strlen(buf));
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_size, void **state) {
    (void)version, (void)upload, (void)upload_size, (void)state;
    metrics *m = cls;
    if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD))
        return reply_text(c, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET\n");
    if (!strcmp(url, "/metrics")) {
        size_t len;
        char *text = metrics_render(m, &len);
        if (!text) return reply_text(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
        return reply(c, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", text, len);
    }
    if (!strcmp(url, "/healthz")) {
        pthread_mutex_lock(&m->mu);
        bool failed = m->failed;
        char why[sizeof m->why];
        memcpy(why, m->why, sizeof why);
        pthread_mutex_unlock(&m->mu);
        if (failed) return reply_text(c, MHD_HTTP_SERVICE_UNAVAILABLE, "failed: %s\n", why);
        return reply_text(c, MHD_HTTP_OK, "ok\n");
    }
    return reply_text(c, MHD_HTTP_NOT_FOUND, "not found (try /metrics or /healthz)\n");
}

/* libmicrohttpd's URL decoding, except that a URL holding "%00" stays as it came: decoded, the
 * NUL would end the C string the handler compares, and "/metrics%00x" would answer as
 * "/metrics". Left escaped, it matches no path and answers 404. */
static size_t unescape_no_nul(void *cls, struct MHD_Connection *c, char *s) {
    (void)cls, (void)c;
    if (strstr(s, "%00")) return strlen(s);
    return MHD_http_unescape(s);
}

/* A listening socket on addr:port, or -1 with the reason. */
static int listen_on(const char *addr, int port, int *bound, err_t *err) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICHOST | AI_NUMERICSERV}, *res;
    char serv[16];
    snprintf(serv, sizeof serv, "%d", port);
    int rc = getaddrinfo(addr, serv, &hints, &res);
    if (rc) return err_set(err, "metrics: address '%s': %s (expected a numeric address, e.g. 0.0.0.0)", addr, gai_strerror(rc));
    int fd = socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC, res->ai_protocol), one = 1, e = errno;
    /* SO_REUSEADDR: a restarted worker binds again while the old connections sit in TIME_WAIT */
    bool ok = fd >= 0 && setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0 &&
              bind(fd, res->ai_addr, res->ai_addrlen) == 0 && listen(fd, 64) == 0;
    if (fd >= 0) e = errno;
    struct sockaddr_storage sa;
    socklen_t len = sizeof sa;
    if (ok && getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
        *bound = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                                : ((struct sockaddr_in *)&sa)->sin_port);
    freeaddrinfo(res);
    if (!ok) {
        if (fd >= 0) close(fd);
        return err_set(err, "metrics: cannot listen on %s port %d: %s%s", addr, port, strerror(e),
                       e == EADDRINUSE ? " (another program, or another rank on this machine, has it; "
                                         "give each rank its own --metrics-port)" : "");
    }
    return fd;
}

int metrics_serve(metrics *m, const char *addr, int port, err_t *err) {
    if (!addr || !*addr) addr = "0.0.0.0";
    if (port < 0 || port > 65535) return err_set(err, "metrics: port %d is not in 0..65535", port);
    int bound = port;
    int fd = listen_on(addr, port, &bound, err);
    if (fd < 0) return -1;
    /* one internal thread polls every connection; a stuck client times out instead of holding it */
    m->daemon = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL, NULL, handle, m,
                                 MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_CONNECTION_TIMEOUT, 10u,
                                 MHD_OPTION_UNESCAPE_CALLBACK, unescape_no_nul, NULL, MHD_OPTION_END);
    if (!m->daemon) {
        close(fd);
        return err_set(err, "metrics: libmicrohttpd could not start on %s port %d", addr, bound);
    }
    return bound;
}

/* ---- the worker's side ---- */

/* Top-level "metrics_port" and this rank's device type and state_ratio, if the plan has them. */
typedef struct plan_extras {
    long metrics_port; /* -1: absent */
    char device[64];
    double state_ratio; /* -1: absent */
} plan_extras;

static int read_extras(const char *path, int rank, plan_extras *x, err_t *err) {
    *x = (plan_extras){.metrics_port = -1, .state_ratio = -1};
    if (!path || !*path) return 0;
    cJSON *root = json_load_file(path, err);
    if (!root) return -1;
    json_ctx c = {path, err};
    int rc = 0;
    const cJSON *port = json_get(root, "metrics_port"), *ranks = json_get(root, "ranks");
    if (port && !cJSON_IsNull(port)) rc = json_int(&c, port, "metrics_port", 0, 65535, &x->metrics_port);
    const cJSON *r = cJSON_IsArray(ranks) ? cJSON_GetArrayItem(ranks, rank) : NULL;
    const cJSON *dev = r ? json_get(r, "device") : NULL, *ratio = r ? json_get(r, "state_ratio") : NULL;
    if (cJSON_IsString(dev)) snprintf(x->device, sizeof x->device, "%s", dev->valuestring);
    if (cJSON_IsNumber(ratio)) x->state_ratio = ratio->valuedouble;
    cJSON_Delete(root);
    return rc;
}

int metrics_worker_port(long flag, const char *plan_path, int rank, err_t *err) {
    if (flag >= 0) return (int)flag;
    long v;
    int given = env_long("CEPHALO_METRICS_PORT", &v, err);
    if (given < 0) return -1;
    if (given == ENV_GIVEN) return (int)v;
    plan_extras x;
    if (read_extras(plan_path, rank, &x, err) < 0) return -1;
    if (x.metrics_port <= 0) return 0;
    if (x.metrics_port + rank > 65535)
        return err_set(err, "%s: metrics_port %ld + rank %d is beyond 65535", plan_path, x.metrics_port, rank);
    return (int)(x.metrics_port + rank);
}

metrics *metrics_for_trainer(const trainer *t, const char *plan_path, err_t *err) {
    const train_config *c = &t->cfg;
    plan_extras x;
    if (read_extras(plan_path, c->rank, &x, err) < 0) return NULL;
    const char *job;
    if (env_text("CEPHALO_JOB", &job, err) < 0) return NULL;
    bool cpu = !strcmp(c->device, "cpu");
    if (!x.device[0]) snprintf(x.device, sizeof x.device, "%s", c->device);
    /* Model FLOPs (no recompute): forward, and backward = 2x forward (planner/model.h). */
    double fwd = 0;
    for (int u = 0; u < model_n_units(&c->model); u++)
        fwd += model_kind_fwd_flops(&c->model, model_unit_kind(&c->model, u), c->seq);
    /* The peak the planner's analytic estimates use: the catalog's per precision, or per thread
     * for the emulated CPU device. A GPU type outside the catalog (a plan written with tflops
     * overrides, or no plan) gets no MFU rather than a wrong one. */
    double peak = 0;
    if (cpu) peak = t->dev.threads * CPU_GFLOPS_PER_THREAD * 1e9;
    else {
        err_t ignored;
        const gpu_spec *g = gpu_find(x.device, &ignored);
        if (g) peak = gpu_peak_tflops(g, c->prec) * 1e12;
    }
    metrics_info info = {.job = job ? job : "cephalo", .rank = c->rank, .device = x.device,
                         .batch = c->batch, .microbatch = c->micro, .microbatches = c->micros,
                         .state_ratio = x.state_ratio >= 0 ? x.state_ratio : (c->world > 1 ? 0 : 1),
                         .capacity_bytes = t->dev.capacity, .flops_per_sample = 3 * fwd, .peak_flops = peak,
                         .tokens_per_sample = t->tokens};
    if (x.state_ratio < 0 && c->world > 1 && t->n_units > 0) {
        /* no plan ratio: this rank's share of the parameters */
        int64_t mine = 0, all = 0;
        for (int u = 0; u < t->n_units; u++) mine += t->shard_n[u], all += t->numel[u];
        info.state_ratio = all ? (double)mine / (double)all : 0;
    }
    return metrics_new(&info);
}

void metrics_record_step(metrics *m, const trainer *t, const step_stats *st) {
    if (!m) return;
    int64_t state = 0;
    for (int u = 0; u < t->n_units; u++) state += t->shard_n[u];
    metrics_step s = {.step_s = st->step_ms / 1e3, .comm_wait_s = st->comm_wait_ms / 1e3,
                      .offload_s = st->offload_ms / 1e3, .loss = st->loss, .step = t->step, .samples = t->cfg.batch,
                      .mem_current = t->dev.cur_bytes, .mem_peak = t->dev.peak_bytes,
                      /* parameters, gradients and the two AdamW moments: fp32 each */
                      .mem_state = state * 4 * (int64_t)sizeof(float), .mem_host = t->host_bytes,
                      .loss_scale = t->cfg.prec == PREC_FP16 ? t->loss_scale : 0, .skipped = st->skipped,
                      .empty = st->empty, .has_val = st->has_val, .val_loss = st->val_loss};
    metrics_record(m, &s);
}
