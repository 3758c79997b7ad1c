/* run.c - `cephalo run JOB.yaml`: the operator's part, on one machine (docs/architecture.md).
 *
 *   job file -> devices as a cluster -> plan (RUNDIR/plan.json) -> one `cephalo-worker train` per
 *   rank, all in one new process group (the gang) -> progress view over RUNDIR/rank-R.jsonl ->
 *   summary (RUNDIR/summary.json), or: one worker fails -> stop the gang -> exit 1.
 *
 * The launcher never waits blocked: it wakes every 100 ms (or at once on a signal: SIGCHLD,
 * Ctrl-C), reaps what has exited (WNOHANG), reads what the workers appended to their logs, and
 * checks a flag the signal handler sets. So a failure, Ctrl-C and progress are all handled in one
 * plain loop; the signal handlers only set flags. The first worker leads the process group; its exit is observed with WNOWAIT and it is
 * reaped only at the very end, so that its pid (the group's id) cannot be reused by an unrelated
 * process while we may still signal the group. */
#include "cli/run.h"
#include "common/clock.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli/job.h"
#include "cli/run_view.h"
#include "common/ckpt_dir.h"
#include "common/dirlock.h"
#include "common/env.h"
#include "common/fileio.h"
#include "common/log.h"
#include "common/outputs.h"
#include "formats/data.h"
#include "common/strutil.h"
#include "cli/profile_cache.h"
#include "planner/arch.h"
#include "planner/inputs.h"


#define POLL_NS 100000000L /* 100 ms: how long a failure or Ctrl-C may go unnoticed */
#define SETTLE_NS 300000000L /* after a failure, how long to look for the ranks failing with it */
#define STOP_GRACE_S 10.0 /* SIGTERM, then SIGKILL after this */
#define TAIL_LINES 5
#define DIR_LEN 3072 /* the run directory: room left for a file name in PATH_LEN */

static volatile sig_atomic_t run_signals; /* SIGINT, SIGTERM or SIGHUP received (count) */
static volatile sig_atomic_t first_failure; /* pid of the first worker that ended badly */

static void on_signal(int sig) {
    (void)sig;
    if (run_signals < 100) run_signals++;
}

/* When one worker dies, its peers notice within milliseconds and exit too, often before the
 * launcher's next look: the order of the SIGCHLDs hints at which one failed first. (A SIGCHLD
 * that arrives while another is pending is merged into it, and the pending one keeps the first's
 * details.) Only a hint: a peer can be quicker to exit than a large process is to finish dying. */
static void on_child(int sig, siginfo_t *si, void *ctx) {
    (void)sig, (void)ctx;
    if (!first_failure && (si->si_code != CLD_EXITED || si->si_status != 0)) first_failure = si->si_pid;
}

typedef struct worker {
    pid_t pid;
    bool exited;
    int code, sig; /* exit status, or the signal that ended it (0 when it exited) */
} worker;

typedef struct launch {
    const job *j;
    const plan *p;
    char dir[DIR_LEN], worker[PATH_LEN];
    char *ckpt_dir; /* resolved against the run directory, or NULL */
    int world, port;
    int lock_fd; /* the run directory's lock (dirlock.h), held to the end */
    bool overwrite; /* cephalo run --overwrite: the workers' --overwrite */
    pid_t pgid; /* = the first worker's pid */
    worker *w;
    run_view view;
} launch;

static void nap(void) {
    struct timespec ts = {0, POLL_NS};
    nanosleep(&ts, NULL); /* a signal cuts it short: the loop then sees the flag at once */
}

/* RUNDIR/FILE and RUNDIR/rank-R.EXT; the run directory's length is checked once (DIR_LEN), so
 * these paths are never cut short. */
static const char *in_dir(const launch *l, const char *file, char *buf) {
    snprintf(buf, PATH_LEN, "%s/%.64s", l->dir, file);
    return buf;
}

static const char *rank_file(const launch *l, int rank, const char *ext, char *buf) {
    snprintf(buf, PATH_LEN, "%s/rank-%d.%.8s", l->dir, rank, ext);
    return buf;
}

/* ---- set-up ---- */

/* ---- the run directory ---- */

/* plan.json, cluster.yaml, prometheus-targets.json, summary.json, rank-R.log and rank-R.jsonl, the lock and the
 * marker: a run directory's own names, which no input may be and no other file may hold unless
 * cephalo run wrote it (the marker says so; common/outputs.h). */
static bool run_owns(const char *name) {
    static const char *const files[] = {"plan.json", "cluster.yaml", "prometheus-targets.json", "summary.json", ".lock",
                                        ".cephalo-run", NULL};
    for (int i = 0; files[i]; i++)
        if (!strcmp(name, files[i])) return true;
    int end = 0;
    sscanf(name, "rank-%*u.log%n", &end);
    if (end && !name[end]) return true;
    end = 0;
    sscanf(name, "rank-%*u.jsonl%n", &end);
    return end && !name[end];
}

/* Its subdirectories are checkpoint directories (`checkpoint: {dir: ckpt}`): `cephalo report RUN
 * -o RUN/ckpt/latest` must not turn the run's checkpoint into a page. */
const out_kind run_dir_kind = {"run directory", run_owns, false, ".cephalo-run", &ckpt_dir_kind};

/* checkpoint.dir names the run directory itself ("." or "./", or its own path): the launcher
 * locks the run directory and the training its checkpoint directory, each for itself, so one
 * directory cannot be both (the training would find its own launcher holding the lock). */
static int check_ckpt_dir(const launch *l, const run_opts *o, err_t *err) {
    if (!l->ckpt_dir) return 0;
    char *c = str_path_clean(l->ckpt_dir), *d = str_path_clean(l->dir);
    bool same = file_same(c, d);
    free(c);
    free(d);
    if (!same) return 0;
    return err_set(err, "%s: checkpoint.dir '%s' is the run directory %s itself, which the launcher keeps (and locks) "
                   "for its plan and logs; give the checkpoints a directory of their own, such as checkpoint.dir: ckpt",
                   o->job, l->j->ckpt_dir, l->dir);
}

/* The job's files (the job file, its profile, data, weights and the checkpoint it resumes) are
 * never the run directory's nor the checkpoint directory's files. */
static int check_outputs(const launch *l, const run_opts *o, err_t *err) {
    const wcmd_train *t = &l->j->train;
    if (check_ckpt_dir(l, o, err) < 0) return -1;
    out_set s = out_begin("cephalo run");
    out_input(&s, "the job file", o->job);
    out_input(&s, "profile", l->j->profile);
    out_input_path(&s, "model", l->j->model_arg, &out_hf_input);
    data_spec_inputs(&s, "data", t->data);
    data_spec_inputs(&s, "validation.data", t->val_data);
    out_input_path(&s, "init_from", t->init_from, &out_hf_input);
    if (t->resume && strcmp(t->resume, "auto") && strcmp(t->resume, "never"))
        out_input_path(&s, "checkpoint.resume", t->resume, &ckpt_dir_kind);
    out_dir(&s, "--run-dir", l->dir, &run_dir_kind);
    out_dir(&s, "checkpoint.dir", l->ckpt_dir, &ckpt_dir_kind);
    int rc = out_check(&s, err);
    out_free(&s);
    return rc;
}

/* The run directory's outputs, said as in use when another run holds it (out_check reads the
 * directory's names before it looks for the marker, so another run taking the directory
 * meanwhile is not mistaken for someone else's files: lock_run_dir then names it). */
static int check_run_dir(const launch *l, const run_opts *o, err_t *err) {
    if (dir_lock_held(l->dir, "cephalo run", err)) return -1;
    return check_outputs(l, o, err);
}

/* One run at a time per run directory (the second would write over the first's plan, logs and
 * checkpoints); then what killed runs left half-written goes. The marker goes first: a run
 * directory whose lock can be seen is then always marked as this command's, so a second run
 * checking its outputs at that moment goes on to find the lock taken (and says by whom) instead
 * of taking the first one's .lock for someone else's file. */
static int lock_run_dir(launch *l, err_t *err) {
    if (file_make_dir(l->dir, true, err) < 0) return -1;
    if (out_mark(l->dir, &run_dir_kind, err) < 0) return -1;
    if ((l->lock_fd = dir_lock(l->dir, "cephalo run", err)) == -1) return -1;
    int n = dir_clean_temps(l->dir);
    if (n) fprintf(stderr, "cephalo run: %s: removed %d temporary file%s left by a killed run\n", l->dir, n, n == 1 ? "" : "s");
    return 0;
}

/* The run directory holds the plan and the devices as a cluster file (to reproduce the plan with
 * `cephalo plan --cluster RUNDIR/cluster.yaml`). */
static int write_run_dir(const launch *l, err_t *err) {
    char path[PATH_LEN];
    if (inputs_save_plan(l->p, in_dir(l, "plan.json", path), err) < 0) return -1;
    char *yaml = job_cluster_yaml(l->j);
    int rc = file_write_atomic(in_dir(l, "cluster.yaml", path), yaml, strlen(yaml), 0, err);
    free(yaml);
    /* the workers' /metrics as Prometheus file_sd targets (docs/metrics.md); none: an earlier
     * run's file goes */
    in_dir(l, "prometheus-targets.json", path);
    if (rc || !l->j->metrics_port) return rc ? rc : (unlink(path), 0);
    char *text = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&text, &n);
    if (!f) return err_set(err, "out of memory");
    fputs("[{\"targets\": [", f);
    for (int r = 0; r < l->world; r++) fprintf(f, "%s\"127.0.0.1:%ld\"", r ? ", " : "", l->j->metrics_port + r);
    fprintf(f, "], \"labels\": {\"cephalo_run\": \"%s\"}}]\n", l->j->name); /* names are [A-Za-z0-9._-] */
    fclose(f);
    rc = file_write_atomic(path, text, n, 0, err);
    free(text);
    return rc;
}

/* ---- the workers' command lines and environment ---- */

/* The worker's command line from common/worker_cmd.c, the operator's builder too: every optimizer
 * setting spelled out, defaults included, so each rank's command line in the dry run says
 * everything the worker will use; then what only this launcher decides (paths, metrics). */
void run_worker_argv(const job *j, const char *ckpt_dir, bool overwrite, recompute_mode rec, wcmd_argv *out) {
    wcmd_train t = j->train;
    t.ckpt_dir = ckpt_dir, t.overwrite = overwrite, t.recompute = rec;
    wcmd_train_argv(&t, out);
}

static wcmd_argv worker_args(const launch *l, int rank) {
    const job *j = l->j;
    char path[PATH_LEN];
    wcmd_argv s = {0};
    wcmd_argv_add(&s, "%s", l->worker);
    run_worker_argv(j, l->ckpt_dir, l->overwrite, l->p->ranks[rank].recompute, &s); /* the plan's rank's */
    wcmd_argv_add(&s, "--log"), wcmd_argv_add(&s, "%s", rank_file(l, rank, "jsonl", path));
    if (j->metrics_port) {
        wcmd_argv_add(&s, "--metrics-port"), wcmd_argv_add(&s, "%ld", j->metrics_port + rank);
        wcmd_argv_add(&s, "--metrics-addr"), wcmd_argv_add(&s, "%s", j->metrics_addr);
    }
    return s;
}

/* docs/architecture.md, "The worker's environment": the variables a pod gets, by the one builder
 * (common/worker_cmd.h); with inherit, after this process's others (cli/launch.h). */
static wcmd_argv worker_env(const launch *l, int rank, bool inherit) {
    char path[PATH_LEN];
    wcmd_env e;
    wcmd_env_init(&e, rank, l->world, "127.0.0.1", l->port);
    e.plan = in_dir(l, "plan.json", path);
    e.comm_timeout = l->j->comm_timeout;
    e.local_rank = rank; /* every rank runs here: the GPU is LOCAL_RANK % GPUs */
    e.job = l->j->name;  /* the metrics' job label */
    wcmd_argv s = {0};
    if (inherit) launch_env(&e, NULL, &s);
    else wcmd_env_entries(&e, &s);
    return s;
}

/* Single quotes where the shell would otherwise split or expand. */
static void put_quoted(const char *s, FILE *f) {
    if (*s && strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_./:=,@%+-") == strlen(s)) {
        fputs(s, f);
        return;
    }
    fputc('\'', f);
    for (; *s; s++) *s == '\'' ? fputs("'\\''", f) : fputc(*s, f);
    fputc('\'', f);
}

static void print_command(const launch *l, int rank, FILE *f) {
    wcmd_argv env = worker_env(l, rank, false), args = worker_args(l, rank);
    char path[PATH_LEN];
    fputs(" ", f);
    for (int i = 0; i < env.n; i++) fputc(' ', f), put_quoted(env.v[i], f);
    for (int i = 0; i < args.n; i++) fputc(' ', f), put_quoted(args.v[i], f);
    fputs(" >", f);
    put_quoted(rank_file(l, rank, "log", path), f);
    fputs(" 2>&1\n", f);
    wcmd_argv_free(&env);
    wcmd_argv_free(&args);
}

/* ---- the gang ---- */

/* Rank R into the gang's process group, its output to rank-R.log. */
static int spawn(launch *l, int rank, err_t *err) {
    char path[PATH_LEN];
    file_out log;
    if (file_out_open(&log, rank_file(l, rank, "log", path), FILE_OUT_STREAM, err) < 0) return -1;
    wcmd_argv args = worker_args(l, rank), env = worker_env(l, rank, true);
    pid_t pid = launch_spawn(args.v, env.v, log.fd, l->pgid, err);
    file_out_abort(&log); /* closed here; the worker writes it */
    wcmd_argv_free(&args);
    wcmd_argv_free(&env);
    if (pid < 0) return err_prefix(err, "rank %d", rank);
    if (!l->pgid) l->pgid = pid;
    l->w[rank].pid = pid;
    return 0;
}

/* Of two failed ranks (or -1), the likelier cause of the failure. A worker that loses a peer
 * exits with a status, so one killed by a signal comes first; then the first by SIGCHLD order;
 * then the lower rank. */
static int cause(const launch *l, int a, int b) {
    if (a < 0 || b < 0) return a < 0 ? b : a;
    if (!l->w[a].sig != !l->w[b].sig) return l->w[a].sig ? a : b;
    if (l->w[a].pid == first_failure || l->w[b].pid == first_failure) return l->w[a].pid == first_failure ? a : b;
    return a < b ? a : b;
}

/* Looks at every worker still running; returns the rank that failed first in this pass, or -1.
 * The group leader is only observed (WNOWAIT), see the top of the file. */
static int reap(launch *l) {
    int failed = -1;
    for (int r = 0; r < l->world; r++) {
        worker *w = &l->w[r];
        if (w->exited || !w->pid) continue;
        if (w->pid == l->pgid) {
            siginfo_t si;
            memset(&si, 0, sizeof si);
            if (waitid(P_PID, (id_t)w->pid, &si, WEXITED | WNOHANG | WNOWAIT) != 0 || si.si_pid == 0) continue;
            w->code = si.si_code == CLD_EXITED ? si.si_status : 0;
            w->sig = si.si_code == CLD_EXITED ? 0 : si.si_status;
        } else {
            int st;
            if (waitpid(w->pid, &st, WNOHANG) <= 0) continue;
            w->code = WIFEXITED(st) ? WEXITSTATUS(st) : 0;
            w->sig = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
        }
        w->exited = true;
        if (w->code || w->sig) failed = cause(l, failed, r);
    }
    return failed;
}

static int running(const launch *l) {
    int n = 0;
    for (int r = 0; r < l->world; r++) n += l->w[r].pid && !l->w[r].exited;
    return n;
}

/* Whether a worker that has not exited is stopped: /proc/PID/stat says 'T' (SIGSTOP, SIGTSTP) or
 * 't' (a debugger). Such a process acts on no signal but SIGKILL until it is continued. */
static bool stopped(const worker *w) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)w->pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    buf[n > 0 ? n : 0] = '\0';
    const char *p = strrchr(buf, ')'); /* "PID (COMMAND) STATE ...": the command may hold anything */
    return p && p[1] == ' ' && (p[2] == 'T' || p[2] == 't');
}

/* The rank that rank r's communicator blamed for stalling, from the last machine-readable line
 * it wrote to rank-R.log: "cephalo-comm-failure rank=R origin=P cause=stalled" (docs/comm.md);
 * -1 when it blamed none. */
static int blamed_for_stall(const launch *l, int r) {
    char path[PATH_LEN], line[256], cause[16];
    FILE *f = fopen(rank_file(l, r, "log", path), "r");
    if (!f) return -1;
    off_t size = fseeko(f, 0, SEEK_END) == 0 ? ftello(f) : 0;
    fseeko(f, size > 16384 ? size - 16384 : 0, SEEK_SET); /* its last lines */
    int blamed = -1, rank, origin;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "cephalo-comm-failure rank=%d origin=%d cause=%15s", &rank, &origin, cause) == 3 && rank == r)
            blamed = !strcmp(cause, "stalled") && origin >= 0 && origin < l->world ? origin : -1;
    fclose(f);
    return blamed;
}

/* When ranks failed while another is still running, the one that stopped answering, or -1: a
 * stopped worker first, else the running rank the failed ranks' communicators blamed most. A rank
 * that was only waiting for it fails and exits; the one that stopped (or hangs) does not. */
static int stopped_answering(const launch *l) {
    for (int r = 0; r < l->world; r++)
        if (l->w[r].pid && !l->w[r].exited && stopped(&l->w[r])) return r;
    int *votes = xcalloc((size_t)l->world, sizeof *votes), best = -1;
    for (int r = 0; r < l->world; r++) {
        int b = l->w[r].exited && (l->w[r].code || l->w[r].sig) ? blamed_for_stall(l, r) : -1;
        if (b >= 0 && l->w[b].pid && !l->w[b].exited) votes[b]++;
    }
    for (int r = 0; r < l->world; r++)
        if (votes[r] && (best < 0 || votes[r] > votes[best])) best = r;
    free(votes);
    return best;
}

/* SIGTERM to the gang; SIGKILL after the grace period or at a further signal to the launcher, and
 * at once to a stopped worker (it would not act on SIGTERM before it is continued). Returns when
 * every worker has exited. */
static void stop_gang(launch *l) {
    if (!l->pgid) return;
    int signals = run_signals;
    kill(-l->pgid, SIGTERM);
    double deadline = clock_now_s() + STOP_GRACE_S;
    bool killed = false;
    for (reap(l); running(l); reap(l)) {
        if (!killed && (clock_now_s() > deadline || run_signals != signals)) {
            kill(-l->pgid, SIGKILL);
            killed = true;
        }
        for (int r = 0; r < l->world && !killed; r++) /* not reaped: the pid is still the worker's */
            if (l->w[r].pid && !l->w[r].exited && stopped(&l->w[r])) kill(l->w[r].pid, SIGKILL);
        nap();
    }
}

/* The end of every run: whatever the workers left in their group goes, then the leader is reaped. */
static void finish_gang(launch *l) {
    if (!l->pgid) return;
    kill(-l->pgid, SIGKILL);
    waitpid(l->pgid, NULL, 0);
    l->pgid = 0;
}

/* ---- messages ---- */

static int fail(int status, const err_t *err) {
    fprintf(stderr, "cephalo run: %s\n", err->msg);
    return status;
}

static void print_tail(const launch *l, int rank) {
    char path[PATH_LEN], buf[4096];
    int fd = open(rank_file(l, rank, "log", path), O_RDONLY);
    if (fd < 0) return;
    off_t end = lseek(fd, 0, SEEK_END), from = end > (off_t)sizeof buf - 1 ? end - (off_t)sizeof buf + 1 : 0;
    ssize_t n = pread(fd, buf, sizeof buf - 1, from);
    close(fd);
    if (n <= 0) return;
    buf[n] = '\0';
    while (n > 0 && buf[n - 1] == '\n') buf[--n] = '\0';
    char *start = buf; /* after the TAIL_LINES-th newline from the end */
    int lines = 0;
    for (char *p = buf + n; p > buf; p--)
        if (p[-1] == '\n' && ++lines == TAIL_LINES) {
            start = p;
            break;
        }
    if (start == buf && from > 0 && strchr(buf, '\n')) start = strchr(buf, '\n') + 1; /* not a cut line */
    fprintf(stderr, "cephalo run: the end of %s:\n", path);
    for (char *line = strtok(start, "\n"); line; line = strtok(NULL, "\n")) fprintf(stderr, "  | %s\n", line);
}

static void describe_exit(const worker *w, char *buf, size_t n) {
    if (w->sig) snprintf(buf, n, "killed by signal %d, %s", w->sig, strsignal(w->sig));
    else snprintf(buf, n, "exit %d", w->code);
}

static int worker_failed(launch *l, int rank) {
    char how[96];
    describe_exit(&l->w[rank], how, sizeof how);
    int others = running(l), stalled = others ? stopped_answering(l) : -1;
    view_end_line(&l->view);
    if (stalled >= 0) { /* the ranks failed waiting for it: it is the cause (docs/run.md) */
        fprintf(stderr, "cephalo run: rank %d (%s) stopped answering (SIGSTOP'd or hung); the other ranks failed waiting for it "
                        "(rank %d first: %s); stopping it", stalled, l->p->cm->cl->devices[stalled].type, rank, how);
        if (others > 1) fprintf(stderr, " and %d other rank%s", others - 1, others == 2 ? "" : "s");
    } else {
        fprintf(stderr, "cephalo run: rank %d (%s) failed (%s); ", rank, l->p->cm->cl->devices[rank].type, how);
        if (others) fprintf(stderr, "stopping the other %d rank%s", others, others == 1 ? "" : "s");
        else fprintf(stderr, "no other rank is running");
    }
    /* ranks that failed in the same moment, often of the same cause */
    char also[128] = "";
    int more = 0;
    for (int r = 0; r < l->world; r++)
        if (r != rank && (l->w[r].code || l->w[r].sig) && strlen(also) < sizeof also - 16)
            sprintf(also + strlen(also), "%s%d", more++ ? ", " : "", r);
    if (more) fprintf(stderr, " (rank%s %s failed too)", more > 1 ? "s" : "", also);
    fputc('\n', stderr);
    print_tail(l, rank);
    stop_gang(l);
    return EXIT_FAILED;
}

/* The checkpoint a rerun would continue from (DIR/latest, through the checkpoint resolver), if any. */
static void print_checkpoint(const launch *l) {
    if (!l->ckpt_dir) return;
    char path[PATH_LEN + 64];
    err_t err;
    if (ckpt_dir_pick(l->ckpt_dir, false, path, sizeof path, &err) < 0) fprintf(stderr, "cephalo run: no checkpoint was written yet\n");
    else if (l->j->train.resume && !strcmp(l->j->train.resume, "auto"))
        fprintf(stderr, "cephalo run: last checkpoint %s; run the job again to continue from it\n", path);
    else fprintf(stderr, "cephalo run: last checkpoint %s\n", path);
}

static int interrupted(launch *l) {
    int n = running(l);
    view_end_line(&l->view);
    fprintf(stderr, "cephalo run: interrupted; stopping %d worker%s (Ctrl-C again to kill at once)\n", n, n == 1 ? "" : "s");
    stop_gang(l);
    fprintf(stderr, "cephalo run: interrupted; stopped %d worker%s\n", n, n == 1 ? "" : "s");
    print_checkpoint(l);
    return EXIT_INTERRUPTED;
}

/* ---- the run ---- */

static void install_handlers(struct sigaction *old) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART; /* nanosleep is never restarted: the nap ends at once */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old[0]);
    sigaction(SIGTERM, &sa, &old[1]);
    sigaction(SIGHUP, &sa, &old[2]);
    sa.sa_handler = NULL;
    sa.sa_sigaction = on_child;
    sa.sa_flags = SA_RESTART | SA_SIGINFO | SA_NOCLDSTOP;
    sigaction(SIGCHLD, &sa, &old[3]);
}

static void restore_handlers(const struct sigaction *old) {
    sigaction(SIGINT, &old[0], NULL);
    sigaction(SIGTERM, &old[1], NULL);
    sigaction(SIGHUP, &old[2], NULL);
    sigaction(SIGCHLD, &old[3], NULL);
}

/* Starts every rank with the stop signals held back, so that a Ctrl-C during the start is seen
 * only once the whole gang exists and can be stopped as one. */
static int start_gang(launch *l, err_t *err) {
    sigset_t stop, old;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGHUP);
    fflush(stdout);
    fflush(stderr);
    sigprocmask(SIG_BLOCK, &stop, &old);
    int rc = 0;
    for (int r = 0; r < l->world && !rc; r++) rc = spawn(l, r, err);
    sigprocmask(SIG_SETMASK, &old, NULL);
    return rc;
}

/* After a first failure, the other failures of the same moment: the cause may be among them. */
static int settle(launch *l, int failed) {
    struct timespec ts = {0, SETTLE_NS / 10};
    for (int i = 0; i < 10 && running(l); i++) {
        nanosleep(&ts, NULL);
        failed = cause(l, failed, reap(l));
    }
    return failed;
}

static int supervise(launch *l) {
    for (;;) {
        int failed = reap(l);
        view_poll(&l->view);
        if (run_signals) return interrupted(l);
        if (failed >= 0) return worker_failed(l, settle(l, failed));
        if (!running(l)) return 0;
        view_show(&l->view, false);
        nap();
    }
}

static int gang(launch *l) {
    err_t err;
    struct sigaction old[4];
    run_signals = 0;
    first_failure = 0;
    install_handlers(old);
    int rc = start_gang(l, &err);
    if (rc) {
        rc = fail(EXIT_FAILED, &err);
        stop_gang(l);
    } else {
        if (!l->view.quiet) {
            fprintf(stderr, "cephalo run: started %d worker%s (process group %d); logs in %s/rank-R.log", l->world,
                    l->world == 1 ? "" : "s", (int)l->pgid, l->dir);
            long mp = l->j->metrics_port;
            if (mp && l->world > 1) fprintf(stderr, "; metrics on http://127.0.0.1:%ld..%ld/metrics", mp, mp + l->world - 1);
            else if (mp) fprintf(stderr, "; metrics on http://127.0.0.1:%ld/metrics", mp);
            fputc('\n', stderr);
        }
        rc = supervise(l);
    }
    finish_gang(l);
    restore_handlers(old);
    if (rc == 0) {
        view_poll(&l->view);
        view_show(&l->view, true);
        view_end_line(&l->view);
        if (view_summary(&l->view, &err) < 0) rc = fail(EXIT_FAILED, &err);
    }
    return rc;
}

/* `epochs: N`: the steps that read the training data N times, ceil(N x samples / batch), from the
 * data as the workers will open it (docs/run.md); the workers are told --steps. */
static int resolve_epochs(job *j, bool quiet, err_t *err) {
    if (!j->epochs) return 0;
    const model_spec *m = &j->model;
    const char *spec = j->train.data;
    if (!spec || !strcmp(spec, "synthetic"))
        return err_set(err, "%s: epochs needs data of a known size (not synthetic): give steps", j->path);
    data_source *ds = NULL;
    int seq = 0;
    int rc = arch_of(m->arch)->images ? data_open_images(&ds, spec, m->channels, m->image, m->n_classes, 1, err)
             : model_check_seq(m, (int)j->seq, &seq, err) < 0
                 ? -1
                 : data_open_tokens(&ds, spec, DATA_TRAIN, seq, m->vocab, data_task_of(arch_of(m->arch)->task), 1,
                                    err);
    if (rc < 0) return err_prefix(err, "%s: epochs", j->path);
    int64_t w = data_num_samples(ds);
    j->train.steps = (long)data_epoch_steps(ds, j->epochs, j->batch);
    data_close(ds);
    if (!quiet)
        fprintf(stderr, "cephalo run: epochs %ld: %ld steps (%lld samples an epoch, %ld a step)\n", j->epochs,
                j->train.steps, (long long)w, j->batch);
    return 0;
}

/* Job file, overrides, checks: 0 or EXIT_BAD_INPUT with the message printed. */
static int load_job(const run_opts *o, job *j) {
    err_t err;
    if (job_load_file(o->job, j, &err) < 0 || (o->devices && job_set_devices(j, o->devices, &err) < 0))
        return fail(EXIT_BAD_INPUT, &err);
    if (o->steps) j->train.steps = o->steps, j->epochs = 0; /* --steps N overrides the job's steps or epochs */
    else if (resolve_epochs(j, o->quiet, &err) < 0) return fail(EXIT_BAD_INPUT, &err);
    if (o->have_metrics_port) j->metrics_port = o->metrics_port;
    return job_check(j, &err) < 0 ? fail(EXIT_BAD_INPUT, &err) : 0;
}

/* Plans exactly as `cephalo plan` does, on the devices as a cluster. */
static int make_plan(const job *j, const run_opts *o, plan_inputs *in, plan *p) {
    err_t err;
    inputs_opts io = {.profile = j->profile, .seq = j->seq, .batch = j->batch, .mem_cap = j->mem_cap,
                      .prec = j->train.prec, .recompute = j->recompute};
    /* the job's own profile, else the devices' own numbers (measured once, then cached) */
    pcache_opts po = {.may_profile = !o->dry_run, .quiet = o->quiet};
    if (!j->profile && !o->no_profile)
        in->have_prof = pcache_profile(j, &po, &in->prof, in->prof_source, sizeof in->prof_source) == 1;
    in->model = j->model;
    if (job_cluster(j, &in->cl, &err) < 0 || inputs_build(in, &io, &err) < 0) {
        err_prefix(&err, "%s", j->path); /* e.g. a profile that cannot be read */
        return fail(EXIT_BAD_INPUT, &err);
    }
    bool quiet = o->quiet;
    inputs_print_notes(in, "cephalo run", stderr);
    if (plan_make(&in->cm, j->strat, p, &err) < 0) return fail(EXIT_FAILED, &err);
    if (!p->feasible) {
        fprintf(stderr, "cephalo run: infeasible: %s\n", p->reason);
        return EXIT_INFEASIBLE;
    }
    if (!quiet) plan_print_table(p, stdout);
    return 0;
}

/* The run directory, the worker binary and a port: 0, or the exit status with the message printed. */
static int prepare(launch *l, const run_opts *o) {
    const job *j = l->j;
    err_t err;
    if (o->run_dir && strlen(o->run_dir) >= sizeof l->dir) {
        err_set(&err, "--run-dir: the path is longer than %zu bytes", sizeof l->dir - 1);
        return fail(EXIT_BAD_INPUT, &err);
    }
    /* neither can be cut: --run-dir was measured, a name is at most JOB_NAME_MAX */
    if (o->run_dir) snprintf(l->dir, sizeof l->dir, "%s", o->run_dir);
    else snprintf(l->dir, sizeof l->dir, "runs/%s", j->name);
    if (j->ckpt_dir) {
        /* an output: relative to the run directory, so each run keeps its own checkpoints */
        l->ckpt_dir = j->ckpt_dir[0] == '/' ? xstrdup(j->ckpt_dir) : str_printf("%s/%s", l->dir, j->ckpt_dir);
        /* the workers would refuse it only after the plan and the run directory were written */
        if (ckpt_dir_check_len(l->ckpt_dir, "checkpoint.dir", &err) < 0) return fail(EXIT_BAD_INPUT, &err);
    }
    l->world = l->p->n_ranks;
    if (j->metrics_port && j->metrics_port + l->world - 1 > 65535) {
        err_set(&err, "metrics_port %ld: ranks 0..%d would need ports up to %ld (at most 65535)", j->metrics_port,
                l->world - 1, j->metrics_port + l->world - 1);
        return fail(EXIT_BAD_INPUT, &err);
    }
    l->w = xcalloc((size_t)l->world, sizeof *l->w);
    if ((l->port = launch_free_port(&err)) < 0) return fail(EXIT_FAILED, &err);
    /* a dry run prints the commands even without a worker binary */
    bool gpu = false;
    for (int i = 0; i < l->p->cm->cl->n_devices; i++) gpu |= l->p->cm->cl->devices[i].threads == 0;
    if (launch_find_worker(l->worker, gpu, &err) < 0 && !o->dry_run) return fail(EXIT_FAILED, &err);
    /* a directory in use is said to be, before its files are judged (its .lock is no foreign file) */
    if (check_run_dir(l, o, &err) < 0 || lock_run_dir(l, &err) < 0) return fail(EXIT_BAD_INPUT, &err);
    /* again, the run directory made: a checkpoint.dir that reaches it through a symbolic link */
    if (check_ckpt_dir(l, o, &err) < 0) return fail(EXIT_BAD_INPUT, &err);
    return write_run_dir(l, &err) < 0 ? fail(EXIT_BAD_INPUT, &err) : 0;
}

static void print_dry_run(const launch *l) {
    printf("cephalo run: dry run: %d worker%s would start, one process group, logs in %s\n", l->world, l->world == 1 ? "" : "s",
           l->dir);
    for (int r = 0; r < l->world; r++) print_command(l, r, stdout);
    printf("(the plan is in %s/plan.json; MASTER_PORT is picked afresh at each start)\n", l->dir);
}

int run_job(const run_opts *o) {
    job j;
    plan_inputs in;
    plan p;
    memset(&in, 0, sizeof in);
    memset(&p, 0, sizeof p);
    launch l = {.j = &j, .p = &p, .lock_fd = -1, .overwrite = o->overwrite};
    int rc = load_job(o, &j);
    if (!rc) rc = make_plan(&j, o, &in, &p);
    if (!rc) rc = prepare(&l, o);
    if (!rc && o->dry_run) print_dry_run(&l);
    else if (!rc) {
        view_init(&l.view, &j, &p, l.dir, l.ckpt_dir, o->quiet);
        rc = gang(&l);
        view_free(&l.view);
    }
    dir_unlock(l.lock_fd);
    free(l.w);
    free(l.ckpt_dir);
    plan_free(&p);
    inputs_free(&in);
    job_free(&j);
    return rc;
}
