/* main.c - cephalo-operator (docs/operator.md, docs/architecture.md): watches CephaloJobs and
 * their worker Pods, and reconciles every job that changed (reconcile.h) from one work queue.
 * This file is the binary's wiring: its flags, the threads started and stopped, leader election,
 * and /healthz, /readyz and /metrics.
 *
 *   cephalo-operator [--kubeconfig FILE] [--namespace NS[,NS...]] [--metrics-addr :8080]
 *                    [--worker-image IMAGE] [--leader-elect=true] ...   (--help lists them)
 *
 * Threads: the watches (informers.h: six kinds, the namespaced ones once per namespace), each
 * keeping a store (cache.h) that the reconcile reads instead of the API server and feeding the
 * queue; --workers threads (controller.h) take jobs from
 * the queue (workqueue.h) and reconcile them, one job never twice at once; with
 * --leader-elect a Lease thread (lease_run) decides whether this replica works at all; the
 * /healthz, /readyz and /metrics endpoints are libmicrohttpd's thread; plans are made by the
 * planning pool's threads (--plan-workers, planning.h), so a slow plan never holds up the queue.
 *
 * Every line on stderr is "TIME LEVEL text" (op_log), also those of the shared modules
 * (log_msg, through log_set_handler). */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <malloc.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/exitcode.h"
#include "common/clock.h"
#include "common/env.h"
#include "common/err.h"
#include "common/log.h"
#include "common/strutil.h"
#include "common/version.h"
#include "operator/controller.h"
#include "operator/informers.h"
#include "operator/inventory.h"
#include "operator/client/kube.h"
#include "operator/client/lease.h"
#include "operator/planning.h"
#include "operator/reconcile.h"
#include "operator/client/workqueue.h"

/* Every known job is reconciled again this often: a safety net for an event missed, not a schedule.
 * A job is reconciled on the events that concern it (informers.h) and at its own next deadline
 * (rec_stats.requeue_s: backoff, growth, progress), as controller-runtime's RequeueAfter. */
#define OP_RESYNC_S 600.0

/* ---- options ------------------------------------------------------------------------------- */

typedef struct op_opts {
    const char *kubeconfig, *context, *namespace, *metrics_addr, *log_level;
    const char *worker_image, *worker_pull_policy, *profile_cm;
    inv_archs worker_archs;
    bool leader_elect;
    const char *le_namespace, *le_id;
    double le_duration_s, le_renew_s, le_retry_s;
    double plan_timeout_s;
    double backoff_first_s, backoff_max_s; /* --restart-backoff, --restart-backoff-max */
    long plan_workers, workers;
} op_opts;

static const char usage[] =
    "usage: cephalo-operator [options]\n"
    "Runs CephaloJobs (cephalo.dev/v1alpha1): plans each job for the cluster's GPUs and starts one\n"
    "worker pod per GPU (docs/operator.md, docs/k8s.md).\n"
    "  --kubeconfig FILE        outside a cluster (default: in-cluster config, else $KUBECONFIG)\n"
    "  --context NAME           kubeconfig context (default: current-context)\n"
    "  --namespace NS[,NS...]   only the CephaloJobs (and their pods, plans, Services) of these\n"
    "                           namespaces (default: all namespaces)\n"
    "  --metrics-addr [HOST]:PORT  /metrics, /healthz, /readyz (default :8080; 0 = off)\n"
    "  --log-level LEVEL        debug, info, warn or error (default info)\n"
    "  --worker-image IMAGE     worker image of jobs without spec.image\n"
    "                           (default ghcr.io/cephalo/cephalo-worker)\n"
    "  --worker-image-pull-policy P  Always, IfNotPresent or Never (default: the cluster's)\n"
    "  --worker-archs \"A B ...\"   the compute capabilities the worker image is built for, as\n"
    "                           sm_XY numbers (default \"" INV_DEFAULT_ARCHS "\"); a GPU\n"
    "                           they do not run is left out of every job's inventory\n"
    "  --profile-configmap NS/NAME   measured profiles (cephalo profile -o) for jobs without\n"
    "                           spec.profileConfigMap (default: none, analytic estimates)\n"
    "  --plan-timeout D         a job whose plan takes longer fails with reason PlanningTimeout\n"
    "                           (a duration like 30s, 2m; default 30s)\n"
    "  --restart-backoff D      the wait before a gang restarted after a worker failed, doubled\n"
    "                           per failure in a row (default 10s)\n"
    "  --restart-backoff-max D  the longest such wait (default 6m); a gang that ran twice as long\n"
    "                           starts the count again\n"
    "  --plan-workers N         jobs planned at the same time, off the reconcile loop (1..64,\n"
    "                           default 2)\n"
    "  --workers N              jobs reconciled at the same time (1..64, default 8); one job is\n"
    "                           never reconciled twice at once, and admissions take turns\n"
    "  --leader-elect[=true|false]   one active replica through a Lease (default false)\n"
    "  --leader-election-namespace NS  the Lease's namespace (default $POD_NAMESPACE, else the\n"
    "                           configuration's namespace)\n"
    "  --leader-election-id NAME       the Lease's name (default cephalo-operator)\n"
    "  --leader-election-lease-duration D, --leader-election-renew-deadline D,\n"
    "  --leader-election-retry-period D   durations like 15s, 500ms, 1m (default 15s, 10s, 2s)\n"
    "  --version [--json]       the release and commit this binary was built from\n"
    "  --help-env               the CEPHALO_* environment variables (docs/environment.md)\n"
    "  --help                   this text\n"
    "Environment: POD_NAME (the leader-election identity), POD_NAMESPACE; the CEPHALO_* variables\n"
    "its planning reads are checked at start (a bad value: exit 2).\n";

static int op_level = 1; /* 0 debug, 1 info, 2 warn, 3 error; set by op_parse before any thread starts */

__attribute__((format(printf, 2, 3))) static void op_log(int level, const char *fmt, ...) {
    static const char *const names[] = {"debug", "info", "warn", "error"};
    if (level < op_level) return;
    char ts[64];
    kube_time_now(ts, sizeof ts);
    char line[2048], one[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    str_one_line(line, one, sizeof one); /* one entry, one line, whatever the text brought */
    fprintf(stderr, "%s %s %s\n", ts, names[level], one);
}

/* The shared modules' lines (log_msg: the watch loop, leader election, the reconcile) in the same
 * form and under the same --log-level as the operator's own. */
static void op_log_handler(const char *level, const char *text) {
    int l = !strcmp(level, "debug") ? 0 : !strcmp(level, "info") ? 1 : !strcmp(level, "error") ? 3 : 2;
    op_log(l, "%s", text);
}

static int op_duration(const char *flag, const char *s, double *out, err_t *err) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    double mul = 1;
    if (end == s || errno) goto bad;
    if (!strcmp(end, "ms")) mul = 0.001;
    else if (!strcmp(end, "s") || !*end) mul = 1;
    else if (!strcmp(end, "m")) mul = 60;
    else if (!strcmp(end, "h")) mul = 3600;
    else goto bad;
    if (!(v > 0) || v * mul > 86400) goto bad;
    *out = v * mul;
    return 0;
bad:
    return err_set(err, "%s: '%s' is not a duration (e.g. 15s, 500ms, 1m; more than 0, at most a day)", flag, s);
}

static int op_bool(const char *flag, const char *s, bool *out, err_t *err) {
    if (!strcmp(s, "true") || !strcmp(s, "1")) return *out = true, 0;
    if (!strcmp(s, "false") || !strcmp(s, "0")) return *out = false, 0;
    return err_set(err, "%s: expected true or false, got '%s'", flag, s);
}

/* The flags with a value, one row each: where it goes and how it is read. */
typedef enum { OPT_STR, OPT_STR_OR_NULL /* "" means unset */, OPT_DURATION, OPT_WORKERS, OPT_ARCHS } opt_kind;
typedef struct op_flag {
    const char *name;
    opt_kind kind;
    size_t off; /* in op_opts */
} op_flag;

#define OPT(name, kind, member) {name, kind, offsetof(op_opts, member)}
static const op_flag op_flags[] = {
    OPT("--kubeconfig", OPT_STR, kubeconfig),
    OPT("--context", OPT_STR, context),
    OPT("--namespace", OPT_STR_OR_NULL, namespace),
    OPT("--metrics-addr", OPT_STR, metrics_addr),
    OPT("--log-level", OPT_STR, log_level),
    OPT("--worker-image", OPT_STR, worker_image),
    OPT("--worker-image-pull-policy", OPT_STR_OR_NULL, worker_pull_policy),
    OPT("--leader-election-namespace", OPT_STR_OR_NULL, le_namespace),
    OPT("--leader-election-id", OPT_STR, le_id),
    OPT("--leader-election-lease-duration", OPT_DURATION, le_duration_s),
    OPT("--leader-election-renew-deadline", OPT_DURATION, le_renew_s),
    OPT("--leader-election-retry-period", OPT_DURATION, le_retry_s),
    OPT("--profile-configmap", OPT_STR_OR_NULL, profile_cm),
    OPT("--plan-timeout", OPT_DURATION, plan_timeout_s),
    OPT("--restart-backoff", OPT_DURATION, backoff_first_s),
    OPT("--restart-backoff-max", OPT_DURATION, backoff_max_s),
    OPT("--plan-workers", OPT_WORKERS, plan_workers),
    OPT("--worker-archs", OPT_ARCHS, worker_archs),
    OPT("--workers", OPT_WORKERS, workers),
};

/* Stores flag f's value into o: 0, or -1 with err naming the flag. */
static int op_set(const op_flag *f, const char *val, op_opts *o, err_t *err) {
    void *field = (char *)o + f->off;
    switch (f->kind) {
    case OPT_STR: *(const char **)field = val; return 0;
    case OPT_STR_OR_NULL: *(const char **)field = *val ? val : NULL; return 0;
    case OPT_DURATION: return op_duration(f->name, val, field, err);
    case OPT_ARCHS: return inv_archs_parse(val, field, err);
    case OPT_WORKERS:
        if (!str_to_long(val, field) || *(long *)field < 1 || *(long *)field > 64)
            return err_set(err, "%s: expected an integer 1..64, got '%s'", f->name, val);
        return 0;
    }
    return 0;
}

/* --namespace's list: namespace names (DNS-1123 labels), comma-separated, each once. */
static int ns_list_check(const char *list, err_t *err) {
    const char *p = list;
    for (int k = 1;; k++) {
        size_t n = strcspn(p, ",");
        bool ok = n >= 1 && n <= 63 && isalnum((unsigned char)p[0]) && isalnum((unsigned char)p[n - 1]);
        for (size_t i = 0; i < n; i++) ok &= islower((unsigned char)p[i]) || isdigit((unsigned char)p[i]) || p[i] == '-';
        if (!ok)
            return err_set(err, "--namespace: entry %d '%.*s' is not a namespace name (lower-case letters, digits and '-', "
                                "at most 63, starting and ending with a letter or digit)", k, (int)n, p);
        for (const char *q = list; q < p; q += strcspn(q, ",") + 1)
            if (strcspn(q, ",") == n && !strncmp(q, p, n))
                return err_set(err, "--namespace: '%.*s' is listed twice", (int)n, p);
        if (!p[n]) return 0;
        p += n + 1;
    }
}

/* What the flags cannot say one by one. */
static int op_check(op_opts *o, err_t *err) {
    static const char *const levels[] = {"debug", "info", "warn", "error"};
    op_level = -1;
    for (int l = 0; l < 4; l++)
        if (!strcmp(o->log_level, levels[l])) op_level = l;
    if (!strcmp(o->log_level, "warning")) op_level = 2;
    if (op_level < 0) return err_set(err, "--log-level: expected debug, info, warn or error, got '%s'", o->log_level);
    if (o->worker_pull_policy && strcmp(o->worker_pull_policy, "Always") &&
        strcmp(o->worker_pull_policy, "IfNotPresent") && strcmp(o->worker_pull_policy, "Never"))
        return err_set(err, "--worker-image-pull-policy: expected Always, IfNotPresent or Never, got '%s'",
                       o->worker_pull_policy);
    if (!*o->worker_image) return err_set(err, "--worker-image: empty");
    if (o->namespace && ns_list_check(o->namespace, err) < 0) return -1;
    const char *slash = o->profile_cm ? strchr(o->profile_cm, '/') : NULL;
    if (o->profile_cm && (!slash || slash == o->profile_cm || !slash[1] || strchr(slash + 1, '/')))
        return err_set(err, "--profile-configmap: expected NAMESPACE/NAME, got '%s'", o->profile_cm);
    if (o->backoff_max_s < o->backoff_first_s)
        return err_set(err, "--restart-backoff-max (%gs) must not be shorter than --restart-backoff (%gs)",
                       o->backoff_max_s, o->backoff_first_s);
    if (o->le_renew_s >= o->le_duration_s)
        return err_set(err, "--leader-election-renew-deadline (%gs) must be shorter than the lease "
                            "duration (%gs)", o->le_renew_s, o->le_duration_s);
    if (o->le_retry_s >= o->le_renew_s)
        return err_set(err, "--leader-election-retry-period (%gs) must be shorter than the renew "
                            "deadline (%gs)", o->le_retry_s, o->le_renew_s);
    return 0;
}

/* One argument at *i (and its value, next, when not given with '='): 0, 1 --help, 2 --version,
 * -1 bad (err set). */
static int op_arg(int argc, char **argv, int *i, op_opts *o, err_t *err) {
    const char *a = argv[*i], *eq = strchr(a, '='), *val = eq ? eq + 1 : NULL;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) return 1;
    if (!strcmp(a, "--version")) return 2;
    if (strncmp(a, "--", 2) != 0) return err_set(err, "unexpected argument '%s'", a);
    char flag[64];
    size_t n = eq ? (size_t)(eq - a) : strlen(a);
    if (n >= sizeof flag) return err_set(err, "unknown option '%s'", a);
    snprintf(flag, sizeof flag, "%.*s", (int)n, a);
    if (!strcmp(flag, "--leader-elect")) /* a flag of its own: the value is optional */
        return val ? op_bool(flag, val, &o->leader_elect, err) : (o->leader_elect = true, 0);
    size_t k = 0, nf = sizeof op_flags / sizeof *op_flags;
    while (k < nf && strcmp(op_flags[k].name, flag)) k++;
    if (k == nf) return err_set(err, "unknown option '%s' (see --help)", flag);
    if (!val && *i + 1 >= argc) return err_set(err, "%s needs a value", flag);
    return op_set(&op_flags[k], val ? val : argv[++*i], o, err);
}

/* 0 parsed, 1 --help, 2 --version, -1 bad (err set). Accepts --flag=value and --flag value. */
static int op_parse(int argc, char **argv, op_opts *o, err_t *err) {
    *o = (op_opts){.metrics_addr = ":8080", .log_level = "info",
                   .worker_image = "ghcr.io/cephalo/cephalo-worker", .le_id = "cephalo-operator",
                   .le_duration_s = 15, .le_renew_s = 10, .le_retry_s = 2, .plan_timeout_s = 30,
                   .backoff_first_s = REC_BACKOFF_FIRST_S, .backoff_max_s = REC_BACKOFF_MAX_S,
                   .plan_workers = 2, .workers = 8};
    err_t ignored;
    inv_archs_parse(INV_DEFAULT_ARCHS, &o->worker_archs, &ignored);
    for (int i = 1; i < argc; i++) {
        int rc = op_arg(argc, argv, &i, o, err);
        if (rc != 0) return rc;
    }
    return op_check(o, err);
}

/* ---- state shared with the HTTP thread ----------------------------------------------------- */

/* Flags every thread reads (the workers, the watches, leader election, the HTTP thread; requests
 * see op_stop through kube_client_set_stop): atomics. The signal handler sets op_stop too, which
 * C11 allows for a lock-free atomic. */
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "op_stop is set by a signal handler: it must be lock-free");
static atomic_int op_stop;
static atomic_int op_leading; /* 1 while this replica works */
static atomic_int op_lost; /* leadership was lost: exit so that a fresh process campaigns */
static atomic_int op_jobs_listed; /* every watch's store has its first list */
static atomic_int op_elect; /* --leader-elect: /readyz of a standby */
static atomic_int op_status_denied; /* the API server refuses the jobs' status writes (403) */
/* made before the HTTP thread starts, freed after it stopped */
static rec_caches op_caches; /* the watches' stores (cache.h): what the reconcile reads */
static planning *op_pool;
static wq *op_queue; /* the jobs to reconcile, "namespace/name" (workqueue.h) */

static void op_on_signal(int sig) {
    (void)sig;
    atomic_store(&op_stop, 1);
}

static enum MHD_Result op_reply(struct MHD_Connection *c, unsigned status, const char *type, const char *body) {
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    enum MHD_Result rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

static void op_family(FILE *f, const char *name, const char *type, const char *help, double v) {
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

/* The reconcile counters (rec_stats), in the order /metrics lists them. */
typedef struct op_counter {
    const char *name, *help;
    size_t off; /* a long in rec_stats */
} op_counter;

#define COUNTER(name, help, member) {"cephalo_operator_" name, help, offsetof(rec_stats, member)}
static const op_counter op_counters[] = {
    COUNTER("reconciles_total", "Reconciles of CephaloJobs.", reconciles),
    COUNTER("reconcile_errors_total", "Reconciles that failed on an API error (retried).", errors),
    COUNTER("plans_total", "Plans made.", plans),
    COUNTER("plan_failures_total", "Jobs that could not be planned.", plan_failures),
    COUNTER("plan_timeouts_total", "Jobs whose planning took longer than --plan-timeout.", plan_timeouts),
    COUNTER("jobs_created_total", "CephaloJobs planned for the first time.", jobs_created),
    COUNTER("jobs_succeeded_total", "CephaloJobs that succeeded.", jobs_succeeded),
    COUNTER("jobs_failed_total", "CephaloJobs that failed (could not be planned, or the backoff limit was reached).",
            jobs_failed),
    COUNTER("jobs_restarted_total", "Gang restarts after a worker failed.", gang_restarts),
    COUNTER("replans_total", "Running jobs planned again (the spec or the usable GPUs changed).", replans),
    COUNTER("pods_created_total", "Worker pods created.", pods_created),
    COUNTER("pods_deleted_total", "Worker pods deleted.", pods_deleted),
};

/* cephalo_operator_reconcile_seconds from a copy of the buckets (controller.h). */
static void op_histogram(FILE *f, const long *counts, double sum) {
    long cum = 0;
    fputs("# HELP cephalo_operator_reconcile_seconds Wall time of a reconcile.\n"
          "# TYPE cephalo_operator_reconcile_seconds histogram\n", f);
    for (size_t b = 0; b <= CTL_N_BUCKETS; b++) {
        cum += counts[b];
        if (b < CTL_N_BUCKETS) fprintf(f, "cephalo_operator_reconcile_seconds_bucket{le=\"%g\"} %ld\n", ctl_buckets[b], cum);
        else fprintf(f, "cephalo_operator_reconcile_seconds_bucket{le=\"+Inf\"} %ld\n", cum);
    }
    fprintf(f, "cephalo_operator_reconcile_seconds_sum %.9g\ncephalo_operator_reconcile_seconds_count %ld\n", sum, cum);
}

/* The gauges and the API requests by verb. */
static void op_gauges(FILE *f) {
    op_family(f, "cephalo_operator_plans_in_progress", "gauge", "Plans waiting for or running on a planning thread.",
              op_pool ? planning_busy(op_pool) : 0);
    op_family(f, "cephalo_operator_queue_depth", "gauge", "Jobs waiting to be reconciled.", wq_len(op_queue));
    fputs("# HELP cephalo_operator_api_requests_total Requests sent to the Kubernetes API server, by verb "
          "(a watch when its stream opens).\n# TYPE cephalo_operator_api_requests_total counter\n", f);
    for (int v = 0; v < KUBE_VERB_COUNT; v++)
        fprintf(f, "cephalo_operator_api_requests_total{verb=\"%s\"} %ld\n", kube_verb_name((kube_verb)v),
                kube_requests((kube_verb)v));
    op_family(f, "cephalo_operator_jobs", "gauge", "CephaloJobs known.", cache_size(op_caches.jobs));
    op_family(f, "cephalo_operator_leader", "gauge", "1 while this replica leads (or runs without election).",
              atomic_load(&op_leading) ? 1 : 0);
}

/* The exposition text of /metrics (the caller frees it), or NULL. */
static char *op_metrics_text(void) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return NULL;
    rec_stats s;
    long counts[CTL_N_BUCKETS + 1];
    double sum;
    ctl_stats(&s, counts, &sum);
    for (size_t i = 0; i < sizeof op_counters / sizeof *op_counters; i++)
        op_family(f, op_counters[i].name, "counter", op_counters[i].help,
                  (double)*(const long *)(const void *)((const char *)&s + op_counters[i].off));
    op_histogram(f, counts, sum);
    op_gauges(f);
    cephalo_build_info_metric(f, "operator");
    return fclose(f) == 0 ? text : (free(text), NULL);
}

static enum MHD_Result op_http(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                               const char *version, const char *upload, size_t *upload_size, void **ctx) {
    (void)cls, (void)version, (void)upload, (void)upload_size, (void)ctx;
    if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD))
        return op_reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain", "only GET\n");
    if (!strcmp(url, "/healthz")) return op_reply(c, MHD_HTTP_OK, "text/plain", "ok\n");
    if (!strcmp(url, "/readyz")) {
        /* a standby is ready (it waits for the Lease); a leader once its job list arrived */
        bool ready = !atomic_load(&op_stop) && (atomic_load(&op_elect) && !atomic_load(&op_leading)
                                                     ? true : atomic_load(&op_jobs_listed));
        if (ready && atomic_load(&op_status_denied))
            return op_reply(c, MHD_HTTP_SERVICE_UNAVAILABLE, "text/plain",
                            "not ready: the API server refuses this operator's CephaloJob status writes (403): its "
                            "RBAC lacks update on cephalojobs/status (docs/k8s.md, RBAC)\n");
        return ready ? op_reply(c, MHD_HTTP_OK, "text/plain", "ok\n")
                     : op_reply(c, MHD_HTTP_SERVICE_UNAVAILABLE, "text/plain", "not ready: not everything listed yet\n");
    }
    if (!strcmp(url, "/metrics")) {
        char *body = op_metrics_text();
        if (!body) return op_reply(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "text/plain", "out of memory\n");
        enum MHD_Result rc = op_reply(c, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", body);
        free(body);
        return rc;
    }
    return op_reply(c, MHD_HTTP_NOT_FOUND, "text/plain", "not found (try /metrics, /healthz or /readyz)\n");
}

static struct MHD_Daemon *op_serve(const char *addr, err_t *err) {
    if (!strcmp(addr, "0") || !*addr) return NULL;
    const char *colon = strrchr(addr, ':');
    if (!colon) return err_set(err, "--metrics-addr: expected [HOST]:PORT, got '%s'", addr), NULL;
    long port;
    if (!str_to_long(colon + 1, &port) || port < 1 || port > 65535)
        return err_set(err, "--metrics-addr: bad port in '%s' (1..65535)", addr), NULL;
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    char host[256];
    size_t hl = (size_t)(colon - addr);
    if (hl >= sizeof host) return err_set(err, "--metrics-addr: host too long"), NULL;
    memcpy(host, addr, hl);
    host[hl] = '\0';
    if (!*host || !strcmp(host, "0.0.0.0")) sin.sin_addr.s_addr = htonl(INADDR_ANY);
    else if (!strcmp(host, "localhost")) sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    else if (inet_pton(AF_INET, host, &sin.sin_addr) != 1)
        return err_set(err, "--metrics-addr: '%s' is not an IPv4 address", host), NULL;
    struct MHD_Daemon *d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD, (uint16_t)port, NULL, NULL,
                                            op_http, NULL, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sin,
                                            MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_END);
    if (!d) { /* libmicrohttpd does not say why: bind the address once to learn it (it was guessed "in use") */
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1, e = errno;
        if (fd >= 0) {
            setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one); /* as libmicrohttpd binds */
            e = bind(fd, (struct sockaddr *)&sin, sizeof sin) == 0 ? 0 : errno;
            close(fd);
        }
        err_set(err, "--metrics-addr: cannot listen on %s: %s%s", addr, e ? strerror(e) : "libmicrohttpd could not start",
                e == EADDRINUSE ? " (another program has the port; give another --metrics-addr, or 0 for none)" : "");
    }
    return d;
}

/* ---- leader election ----------------------------------------------------------------------- */

typedef struct op_lease {
    lease_elector e;
    pthread_t th;
    bool started;
} op_lease;

/* The elector, and the fence every API client of the workers gets through the configuration
 * (kube_config.write_gate): no write is sent unless lease_gate says this replica leads now. Before
 * lease_init its valid_until is 0: closed. */
static op_lease op_le;
static const kube_gate op_gate = {lease_gate, &op_le.e};

/* Stops leading (once, from whichever thread sees it first): the work stops and the process exits
 * so that a fresh one campaigns again, unless it is stopping anyway. */
static void op_demote(const char *why) {
    if (!atomic_exchange(&op_leading, 0)) return;
    bool stopping = atomic_load(&op_stop);
    if (stopping) op_log(1, "stopped leading");
    else op_log(3, "%s: no longer leading; exiting so that a fresh process campaigns again", why);
    if (!stopping) atomic_store(&op_lost, 1);
    atomic_store(&op_stop, 1);
}

static void op_on_leading(bool leading, void *arg) {
    (void)arg;
    if (leading) {
        op_log(1, "leading: this replica reconciles now");
        atomic_store(&op_leading, 1);
    } else {
        op_demote("lost the Lease");
    }
}

/* The renew deadline by the clock, whatever the election thread does (a renewal stuck in a slow
 * request, a process that was stopped): the gate already refuses every write; this says so and
 * ends the process's work. */
static void op_check_fence(void) {
    if (!atomic_load(&op_elect) || !atomic_load(&op_leading) || lease_is_leader(&op_le.e)) return;
    char why[160];
    snprintf(why, sizeof why, "the Lease was not renewed within the renew deadline (%.0f s; last renewal sent %.1f s ago)",
             op_le.e.renew_deadline_s, clock_now_s() - op_le.e.renewed_at);
    op_demote(why);
}

static void *op_lease_main(void *arg) {
    op_lease *l = arg;
    err_t err = {{0}};
    if (lease_run(&l->e, &op_stop, op_on_leading, NULL, &err) < 0) {
        op_log(3, "leader election: %s", err.msg);
        atomic_store(&op_stop, 1);
    }
    return NULL;
}

/* The Lease's identity: $POD_NAME, else HOST_PID. Never cut: two replicas whose identities
 * were cut alike would each take the other's Lease for its own. */
static int op_identity(char *ident, size_t n, err_t *err) {
    char host[128] = "unknown";
    const char *pod = getenv("POD_NAME");
    gethostname(host, sizeof host - 1);
    if (pod && *pod) return str_fmt(ident, n, err, "leader election: $POD_NAME", "%s", pod);
    snprintf(ident, n, "%s_%ld", host, (long)getpid()); /* 127 + 21 < n */
    return 0;
}

/* With --leader-elect, campaigns on a thread of its own (lease_run) and waits until this replica
 * leads or stops; without, leads at once. 0, or an exit status. */
static int op_lead(const op_opts *o, const kube_config *cfg, op_lease *lease, err_t *err) {
    char ident[256]; /* a pod name: at most 253 */
    if (!o->leader_elect) return atomic_store(&op_leading, 1), 0;
    if (op_identity(ident, sizeof ident, err) < 0) return op_log(3, "%s", err->msg), EXIT_BAD_INPUT;
    const char *lns = o->le_namespace ? o->le_namespace : getenv("POD_NAMESPACE");
    lease_opts lo = {.namespace = lns && *lns ? lns : NULL, .name = o->le_id, .identity = ident,
                     .lease_duration_s = (int)(o->le_duration_s + 0.5),
                     .renew_deadline_s = (int)(o->le_renew_s + 0.5), .retry_period_s = o->le_retry_s};
    kube_client *lk = kube_client_new(cfg, err);
    if (lk) kube_client_set_write_gate(lk, NULL); /* its Lease writes are what keeps the gate open */
    if (!lk || lease_init(&lease->e, lk, &lo, err) < 0) {
        op_log(3, "leader election: %s", err->msg);
        if (lk) kube_client_free(lk);
        return EXIT_BAD_INPUT;
    }
    kube_client_set_stop(lk, &op_stop);
    /* a stalled renewal must end well within the renew deadline, so that this replica notices
     * it no longer leads before a standby may take the Lease */
    long lto = (long)(o->le_renew_s / 2);
    kube_client_set_timeout(lk, lto < 1 ? 1 : lto);
    op_log(1, "leader election: Lease %s/%s as %s", lease->e.namespace, lease->e.name, ident);
    if (pthread_create(&lease->th, NULL, op_lease_main, lease) != 0) {
        op_log(3, "cannot start the leader-election thread");
        lease_free(&lease->e);
        kube_client_free(lk);
        return EXIT_FAILED;
    }
    lease->started = true;
    while (!atomic_load(&op_leading) && !atomic_load(&op_stop)) nanosleep(&(struct timespec){0, 100000000L}, NULL);
    return 0;
}

/* Releases the Lease (lease_run does on its way out) and frees the elector. */
static void op_lease_end(op_lease *lease) {
    if (!lease->started) return;
    pthread_join(lease->th, NULL);
    kube_client *lk = lease->e.k;
    lease_free(&lease->e);
    kube_client_free(lk);
}

/* ---- main ---------------------------------------------------------------------------------- */

static int op_load_config(const op_opts *o, kube_config *cfg, err_t *err) {
    if (o->kubeconfig) return kube_config_load(o->kubeconfig, o->context, cfg, err);
    if (getenv("KUBERNETES_SERVICE_HOST")) return kube_config_in_cluster(cfg, err);
    const char *env = getenv("KUBECONFIG");
    if (env && *env) {
        char *first = xstrdup(env);
        char *colon = strchr(first, ':'); /* a list: the first file, as kubectl merges from the first */
        if (colon) *colon = '\0';
        int rc = kube_config_load(first, o->context, cfg, err);
        free(first);
        return rc;
    }
    return err_set(err, "no cluster configuration: not running in a pod (KUBERNETES_SERVICE_HOST is "
                        "unset) and neither --kubeconfig nor $KUBECONFIG is given");
}

static void op_on_planned(const char *key, void *arg) {
    (void)arg;
    wq_add(op_queue, key); /* the job's plan is ready (or failed): reconcile it now */
}

/* The options, or an exit status: 0 after --help or --version, 2 for bad ones. -1: go on. */
static int op_options(int argc, char **argv, op_opts *o) {
    err_t err = {{0}};
    /* as the other binaries: `--version [--json]` first, its arguments checked, none ignored */
    if (argc >= 2 && !strcmp(argv[1], "--version")) return cephalo_version_cmd("cephalo-operator", argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "--help-env")) return env_help_cmd("cephalo-operator", argc - 1, argv + 1);
    int pr = op_parse(argc, argv, o, &err);
    if (pr == 1) {
        fputs(usage, stdout);
        return 0;
    }
    if (pr == 2) {
        char line[256];
        cephalo_version_line("cephalo-operator", line, sizeof line);
        fputs(line, stdout);
        return 0;
    }
    /* every CEPHALO_* variable, before anything plans with one (the planner's memory switches) */
    if (pr < 0 || env_check_all(&err) < 0) {
        op_log(3, "%s", err.msg);
        return EXIT_BAD_INPUT;
    }
    return -1;
}

/* The API client of the first worker, from the cluster configuration: NULL after saying why. With
 * --leader-elect every client made from cfg writes only through the fence (op_gate). Every request
 * names this replica in its User-Agent, which the API server's audit log records. */
static kube_client *op_client(const op_opts *o, kube_config *cfg) {
    err_t err = {{0}};
    char ident[256];
    if (op_load_config(o, cfg, &err) < 0) {
        op_log(3, "%s", err.msg);
        return NULL;
    }
    if (op_identity(ident, sizeof ident, &err) < 0) snprintf(ident, sizeof ident, "?");
    cfg->user_agent = str_printf("cephalo-operator/%s (%s)", cephalo_version(), ident);
    cfg->write_gate = o->leader_elect ? &op_gate : NULL;
    kube_client *k = kube_client_new(cfg, &err);
    if (!k) {
        op_log(3, "%s: %s", cfg->source ? cfg->source : "config", err.msg);
        kube_config_free(cfg);
    }
    return k;
}

/* What the HTTP thread reads, made before it starts: the stores, the planning pool, the queue. */
static int op_shared_new(const op_opts *o, err_t *err) {
    op_caches = rec_caches_new();
    op_queue = wq_new("reconcile");
    atomic_store(&op_elect, o->leader_elect);
    return (op_pool = planning_new((int)o->plan_workers, op_on_planned, NULL, err)) ? 0 : -1;
}

static void op_shared_free(void) {
    planning_free(op_pool); /* plans under way are cancelled: they stop within milliseconds */
    op_pool = NULL;
    wq_free(op_queue);
    rec_caches_free(&op_caches);
}

/* Watches, workers and the resync (OP_RESYNC_S) until stopped; then the workers and watches joined. */
static int op_run(const op_opts *o, const kube_config *cfg, kube_client *k, err_t *err) {
    informers_ctx ix = {.caches = &op_caches, .queue = op_queue, .stop = &op_stop, .synced = &op_jobs_listed};
    informers *watches = informers_new(cfg, &ix);
    int rc = 0;
    bool failed = false;
    if (!atomic_load(&op_stop)) rc = informers_start(watches, o->namespace, err);
    rec_config rc_cfg = {.caches = &op_caches, .worker_image = o->worker_image, .worker_pull_policy = o->worker_pull_policy,
                         .profile_cm = o->profile_cm, .planner = op_pool, .plan_timeout_s = o->plan_timeout_s,
                         .backoff_first_s = o->backoff_first_s, .backoff_max_s = o->backoff_max_s,
                         .status_denied = &op_status_denied,
                         .worker_archs = &o->worker_archs};
    informers_wait_synced(watches);
    rec_hold_partial_gangs(&rc_cfg); /* before any admission */
    ctl *workers = ctl_start(op_queue, &rc_cfg, k, cfg, (int)o->workers, &op_stop, &failed);
    if (failed) rc = 1;
    double next_resync = clock_now_s() + OP_RESYNC_S;
    while (!atomic_load(&op_stop)) {
        nanosleep(&(struct timespec){0, 100000000L}, NULL);
        op_check_fence();
        if (clock_now_s() >= next_resync) {
            informers_requeue_all(watches, NULL);
            next_resync = clock_now_s() + OP_RESYNC_S;
        }
    }
    wq_wake(op_queue);
    ctl_join(workers);
    op_log(1, "stopping");
    informers_join(watches);
    return rc;
}

int main(int argc, char **argv) {
    op_opts o;
    err_t err = {{0}};
    kube_config cfg;
    /* No fast bins: every TLS record read allocates (and releases) a 16 KiB+ buffer, and glibc
     * merges every freed fast-bin chunk before any allocation that large. A watch thread frees
     * thousands of small JSON nodes per event, so that merging was 10-13% of the operator's CPU
     * under `perf` during a bring-up (docs/operator.md, "Scale"); without fast bins small chunks
     * are merged as they are freed instead. */
    mallopt(M_MXFAST, 0);
    log_set_handler(op_log_handler);
    int rc = op_options(argc, argv, &o);
    if (rc >= 0) return rc;
    kube_client *k = op_client(&o, &cfg);
    if (!k) return EXIT_BAD_INPUT;
    struct sigaction sa = {.sa_handler = op_on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    kube_client_set_stop(k, &op_stop);
    rc = 0;
    struct MHD_Daemon *http = NULL;
    if (op_shared_new(&o, &err) < 0) {
        op_log(3, "%s", err.msg);
        rc = 1;
    } else if (!(http = op_serve(o.metrics_addr, &err)) && strcmp(o.metrics_addr, "0") && *o.metrics_addr) {
        op_log(3, "%s", err.msg);
        rc = 2;
    }
    op_lease *lease = &op_le;
    if (rc == 0) {
        op_log(1, "cephalo-operator %s (commit %s): API server %s (%s), %s, metrics %s, worker image %s",
               cephalo_version(), cephalo_commit(), cfg.server, cfg.source ? cfg.source : "",
               o.namespace ? o.namespace : "all namespaces", o.metrics_addr, o.worker_image);
        rc = op_lead(&o, &cfg, lease, &err); /* nothing is watched or written before the Lease is held */
    }
    if (rc == 0) rc = op_run(&o, &cfg, k, &err);
    atomic_store(&op_stop, 1);
    op_lease_end(lease);
    if (http) MHD_stop_daemon(http); /* before the shared state goes: /metrics reads it */
    op_shared_free();
    kube_client_free(k);
    kube_config_free(&cfg);
    return atomic_load(&op_lost) ? EXIT_FAILED : rc;
}
