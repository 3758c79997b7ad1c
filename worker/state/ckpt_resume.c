/* ckpt_resume.c - see ckpt_resume.h; the rules are in docs/checkpoints.md.
 *
 * Every decision that changes what a rank does (to resume or not, from which checkpoint, to stop)
 * is agreed by an all-reduce, so the ranks never split: each rank loads only its own slices of a
 * checkpoint, and any rank's damaged slice sends all of them to the next older checkpoint. Only
 * rank 0 changes the directory (lock, temporaries, deletions), and only after the agreement. */
#include "state/ckpt_resume.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"
#include "common/ckpt_dir.h"
#include "common/ckpt_keep.h"
#include "common/dirlock.h"
#include "common/fileio.h"
#include "common/log.h"
#include "common/strutil.h"
#include "state/ckpt.h"

#define PATH_LEN 4200

enum { OK = 0, BROKEN = 1, OTHER_MODEL = 2 }; /* a rank's verdict on one checkpoint */

/* Sums v[0..n) over the ranks (a no-op with one rank). */
static int agree(trainer *t, double *v, int n, const char *what, err_t *err) {
    comm *c = t->cfg.comm;
    return c ? comm_run(c, comm_allreduce(c, v, n, COMM_F64, what), err) : 0;
}

static bool is_rank0(const trainer *t) { return t->cfg.rank == 0; }

/* ---- the lock ---- */

static int take_lock(trainer *t, const ckpt_opts *o, int *lock_fd, err_t *err) {
    double failed = 0;
    err_t mine = {""};
    if (o->dir && is_rank0(t)) {
        int fd = dir_lock(o->dir, "training", &mine);
        if (fd == -1) failed = 1;
        else *lock_fd = fd;
    }
    if (agree(t, &failed, 1, "the checkpoint directory's lock", err) < 0) return -2;
    if (!failed) return 0;
    if (is_rank0(t)) *err = mine;
    else err_set(err, "rank 0 cannot lock the checkpoint directory %s (its log says why)", o->dir);
    return CKPT_REFUSED;
}

/* ---- which checkpoints to try ---- */

typedef struct plan_resume {
    char dir[PATH_LEN]; /* searched: the checkpoint directory (auto, or --resume DIR) */
    bool search;        /* else the one path in `path` */
    char path[PATH_LEN];
    ckpt_entry *e; /* the directory's checkpoints, newest first */
    int n;
} plan_resume;

/* --resume PATH through the resolver of every checkpoint argument (common/ckpt_dir.h): a
 * checkpoint directory is searched (its newest complete checkpoint that loads), DIR/latest is the
 * checkpoint the pointer names (else, said, the newest complete one), anything else is itself. */
static int resolve_path(const char *given, plan_resume *r, err_t *err) {
    ckpt_arg_kind kind;
    if (ckpt_arg_classify(given, r->dir, sizeof r->dir, &kind, err) < 0) return -1;
    r->search = kind == CKPT_ARG_DIR;
    if (kind == CKPT_ARG_POINTER) return ckpt_dir_pick(r->dir, true, r->path, sizeof r->path, err);
    if (kind == CKPT_ARG_ONE) snprintf(r->path, sizeof r->path, "%s", r->dir), r->dir[0] = '\0'; /* the same size: never cut; no directory searched */
    return 0;
}

static bool fresh_start(const ckpt_opts *o) {
    return !o->resume || !strcmp(o->resume, "none") || !strcmp(o->resume, "never");
}

static int plan_candidates(const ckpt_opts *o, plan_resume *r, err_t *err) {
    memset(r, 0, sizeof *r);
    if (fresh_start(o)) return 0;
    if (!strcmp(o->resume, "auto")) {
        if (!o->dir) return err_set(err, "--resume auto needs --ckpt-dir");
        snprintf(r->dir, sizeof r->dir, "%s", o->dir); /* at most CKPT_DIR_MAX: ckpt_start */
        r->search = true;
    } else if (resolve_path(o->resume, r, err) < 0) {
        return -1;
    }
    if (r->search && (r->n = ckpt_dir_list(r->dir, &r->e, err)) < 0) return -1;
    return 0;
}

/* What `latest` says against what was found, when they differ (say so: docs/checkpoints.md). */
static void note_latest(const plan_resume *r, const char *chosen) {
    char name[64];
    err_t e;
    int have = ckpt_dir_latest(r->dir, name, sizeof name, &e);
    if (have == 0) log_warn("%s/latest is missing: resuming from the newest complete checkpoint found there, %s", r->dir, chosen);
    else if (have < 0) log_warn("%s; resuming from the newest complete checkpoint found there, %s", e.msg, chosen);
    else if (strcmp(name, chosen)) log_warn("%s/latest names %s, but %s is the newest complete checkpoint that loads: resuming from it", r->dir, name, chosen);
}

/* ---- loading, agreed ---- */

/* Every rank loads its slices of `path`; the verdict is the worst over the ranks. */
static int try_one(trainer *t, const char *path, int *worst, err_t *why, err_t *err) {
    int rc = trainer_resume(t, path, why);
    double v[2] = {rc == -1, rc == RESUME_OTHER_MODEL};
    if (agree(t, v, 2, "the checkpoint to resume from", err) < 0) return -2;
    *worst = v[1] > 0 ? OTHER_MODEL : v[0] > 0 ? BROKEN : OK;
    if (*worst != OK && rc == 0) err_set(why, "%s: another rank cannot load its part of it (that rank's log says why)", path);
    return 0;
}

/* The checkpoint the ranks resume from: the given one, or in a directory the newest complete
 * one that every rank loads. `chosen` gets its path; empty when starting afresh. */
static int load_agreed(trainer *t, const ckpt_opts *o, plan_resume *r, char *chosen, size_t n, err_t *err) {
    int worst;
    *chosen = '\0';
    if (!r->search && !r->path[0]) return 0;
    if (!r->search) {
        if (try_one(t, r->path, &worst, err, err) < 0) return -2;
        snprintf(chosen, n, "%s", r->path); /* both PATH_LEN */
        return worst == OK ? 0 : (err_prefix(err, "--resume"), CKPT_REFUSED);
    }
    char tried[768] = "";
    int complete = 0;
    for (int i = 0; i < r->n; i++) {
        if (!r->e[i].complete) continue;
        complete++;
        char path[PATH_LEN];
        err_t why = {""};
        if (str_fmt(path, sizeof path, err, "checkpoint path", "%s/%s", r->dir, r->e[i].name) < 0) return CKPT_REFUSED;
        if (try_one(t, path, &worst, &why, err) < 0) return -2;
        if (worst == OK) {
            snprintf(chosen, n, "%s", path); /* both PATH_LEN */
            note_latest(r, r->e[i].name);
            return 0;
        }
        if (worst == OTHER_MODEL) return *err = why, CKPT_REFUSED;
        log_warn("cannot resume from %s: %s; trying the next older checkpoint", path, why.msg);
        size_t l = strlen(tried);
        snprintf(tried + l, sizeof tried - l, "%s%s", l ? ", " : "", r->e[i].name);
    }
    if (complete) return err_set(err, "no checkpoint in %s can be resumed (tried %s; the warnings above say why): move the damaged ones away, or start afresh with --resume none --overwrite",
                                 r->dir, tried), CKPT_REFUSED;
    if (strcmp(o->resume, "auto")) /* --resume DIR: asked for a checkpoint there */
        return err_set(err, "--resume %s: the directory holds no complete checkpoint (step_N.safetensors, or step_N/ with index.json)", o->resume), CKPT_REFUSED;
    return 0; /* nothing there yet: a fresh start */
}

/* ---- what the run may do to the directory ---- */

/* A damaged checkpoint newer than the one resumed from is kept for inspection, out of the way. */
static void set_aside(const char *dir, const ckpt_entry *e) {
    char from[PATH_LEN], to[PATH_LEN]; /* cannot be cut: dir is at most CKPT_DIR_MAX (ckpt_start) */
    snprintf(from, sizeof from, "%s/%s", dir, e->name);
    snprintf(to, sizeof to, "%s/%s.broken-%ld", dir, e->name, (long)time(NULL));
    if (rename(from, to) == 0) log_warn("%s cannot be resumed; kept as %s, and training continues from an older checkpoint", from, to);
    else log_warn("%s cannot be resumed, and renaming it failed: %s", from, strerror(errno));
}

/* Checkpoints newer than the step started from. In a searched directory they are this run's own
 * history that did not load or was cut short; otherwise they belong to another run's history,
 * written over only with --overwrite. Every rank decides the same from the same listing. */
typedef struct beyond {
    ckpt_entry *e;
    int n;
    bool own_history;
} beyond;

static int find_beyond(trainer *t, const ckpt_opts *o, const plan_resume *r, bool resumed, beyond *b, err_t *err) {
    memset(b, 0, sizeof *b);
    if (!o->dir) return 0;
    if ((b->n = ckpt_dir_list(o->dir, &b->e, err)) < 0) return -1;
    b->own_history = r->search && !strcmp(r->dir, o->dir) && resumed;
    int conflicts = 0;
    char names[256] = "";
    for (int i = 0; i < b->n && !b->own_history; i++) {
        if (b->e[i].step <= t->step || !b->e[i].complete) continue;
        size_t l = strlen(names);
        if (conflicts++ < 3) snprintf(names + l, sizeof names - l, "%s%s", l ? ", " : "", b->e[i].name);
    }
    if (!conflicts || o->overwrite) return 0;
    return err_set(err, "%s holds %d checkpoint%s beyond step %lld (%s%s), of a run this one would write over: "
                   "continue that run with --resume auto, or start at step %lld anyway with --overwrite (cephalo run --overwrite), "
                   "which deletes them", o->dir, conflicts, conflicts == 1 ? "" : "s", (long long)t->step, names,
                   conflicts > 3 ? ", ..." : "", (long long)t->step);
}

/* Rank 0, once the ranks agreed: the damaged ones of this run's history are set aside, writes cut
 * short and (--overwrite) another run's checkpoints are deleted. */
static int clear_beyond(trainer *t, const ckpt_opts *o, const beyond *b, err_t *err) {
    for (int i = 0; is_rank0(t) && i < b->n; i++) {
        const ckpt_entry *e = &b->e[i];
        if (e->step <= t->step) continue;
        if (b->own_history && e->complete) set_aside(o->dir, e);
        else if (ckpt_dir_remove(o->dir, e, err) < 0) return -1;
        else if (e->complete) log_warn("--overwrite: deleted %s/%s", o->dir, e->name);
    }
    return 0;
}

/* Agrees on a step each rank may have refused (mine < 0, its message in err): 0, CKPT_REFUSED
 * with this rank's message (or a pointer to the rank that refused), or -2 when the agreement
 * fails. */
static int agreed(trainer *t, int mine, const char *what, err_t *err) {
    err_t msg = *err;
    double refused = mine < 0;
    if (agree(t, &refused, 1, what, err) < 0) return -2;
    if (!refused) return 0;
    if (mine < 0) *err = msg;
    else err_set(err, "another rank refused %s (its log says why)", what);
    return CKPT_REFUSED;
}

/* Rank 0, holding the lock: the temporaries of dead writers go, and the retention settles (the
 * directory's settings unless given). */
static int tidy_dir(trainer *t, ckpt_opts *o, err_t *err) {
    if (!o->dir || !is_rank0(t)) return 0;
    int n = ckpt_dir_clean_temps(o->dir);
    if (n) log_warn("%s: removed %d temporary file%s left by writers that were killed", o->dir, n, n == 1 ? "" : "s");
    return ckpt_keep_settle(o->dir, &o->keep, err);
}

int ckpt_start(trainer *t, ckpt_opts *o, bool quiet, int *lock_fd, err_t *err) {
    *lock_fd = -1;
    /* every rank has the same --ckpt-dir: they refuse together, before any agreement */
    if (o->dir && ckpt_dir_check_len(o->dir, "--ckpt-dir", err) < 0) return CKPT_REFUSED;
    int rc = take_lock(t, o, lock_fd, err);
    if (rc) return rc;
    if ((rc = agreed(t, tidy_dir(t, o, err), "the checkpoint retention", err))) return rc;
    plan_resume r;
    beyond b = {0};
    char chosen[PATH_LEN];
    rc = agreed(t, plan_candidates(o, &r, err), "the resume options", err);
    if (!rc) rc = load_agreed(t, o, &r, chosen, sizeof chosen, err);
    if (!rc) rc = agreed(t, find_beyond(t, o, &r, *chosen != '\0', &b, err), "to write over the checkpoints there", err);
    if (!rc) rc = agreed(t, clear_beyond(t, o, &b, err), "to clear the checkpoints there", err);
    if (!rc && *chosen && !quiet) fprintf(stderr, "resumed from %s at step %lld\n", chosen, (long long)t->step);
    free(r.e);
    free(b.e);
    return rc;
}

int ckpt_checkpoint(trainer *t, const ckpt_opts *o, bool diverged, err_t *err) {
    err_t e;
    /* the mark first: a crash between the two leaves a mark without its checkpoint (harmless),
     * never a diverged checkpoint that counts as good; without the mark nothing is deleted */
    bool marked = !is_rank0(t) || ckpt_keep_mark(o->dir, t->step, diverged, &e) == 0;
    if (!marked) log_warn("checkpoint retention: %s; nothing is deleted this time", e.msg);
    if (ckpt_save_step(t, o->dir, err) < 0) return -1;
    if (!is_rank0(t) || !marked) return 0;
    if (ckpt_keep_prune(o->dir, &o->keep, &e) < 0) log_warn("checkpoint retention: %s", e.msg); /* space, not correctness */
    return 0;
}

void ckpt_finish(int lock_fd) { dir_unlock(lock_fd); }
