/* env.h - every CEPHALO_* environment variable the programs read, in one table, read through one
 * parser (docs/environment.md).
 *
 * Each variable is a row of the table in env.c: its name, the kind of value it takes (a choice of
 * words, a 0/1 switch, an integer or a number in a range, a path, a path or none, a short text,
 * a form of its own), its default, the programs that read it and a line about what it does. A
 * value is either one the row accepts or refused, exit 2, with one wording everywhere:
 *
 *   cephalo-worker: $CEPHALO_VOCAB_PAD is 'no', expected 0 or 1
 *
 * Each program's entry (cephalo, cephalo-worker, cephalo-operator) checks every row once at start
 * (env_entry; the operator logs env_check_all's message its own way), before any work, so a bad value is refused up front, whichever program reads it
 * and whichever command runs; the planner and the workers of one job refuse the same values. The
 * code that reads a variable does so through a typed getter, which parses the value by its row:
 *
 *   int pad = env_flag("CEPHALO_VOCAB_PAD", NULL);   // 0 or 1: the row's default when unset
 *   int mode = env_choice("CEPHALO_ADAMW", &err);     // the index in {"tensor", "unit", "half"}
 *   if (env_number("CEPHALO_COMM_TIMEOUT", &t, &err) < 0) return -1;
 *
 * Every getter takes err: NULL where the caller has no error to return (the memory model's
 * switches, the device's modes), which the entry's check makes safe: a bad value then is a
 * program that skipped env_entry, an internal error (CHECK). A getter's name must be a row (else
 * CHECK), so that no variable is read outside the table.
 *
 * An empty value is the same as an unset one (the default), except for a path-or-none variable,
 * where it means none (off), as those always did. Switches are 0 or 1, nothing else: "no",
 * "false" or "2" are refused, not read as on. A set CEPHALO_* name that is no row but within two
 * edits of one is named in a warning (a switch the user believes set that nothing reads). */
#ifndef CEPHALO_ENV_H
#define CEPHALO_ENV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "common/err.h"

/* CEPHALO_COMM_TIMEOUT's default, seconds: the workers' own (worker/comm/comm.c), a job file's
 * comm_timeout and spec.commTimeout. */
#define ENV_COMM_TIMEOUT_S 60

typedef enum env_kind {
    ENV_CHOICE,       /* one of the row's words */
    ENV_FLAG,         /* 0 or 1 (a choice of those two) */
    ENV_INT,          /* an integer in [lo, hi] */
    ENV_NUMBER,       /* a finite number, lo < x <= hi */
    ENV_PATH,         /* a path (non-empty, at most max_len characters) */
    ENV_PATH_OR_NONE, /* a path, or none (or empty): off */
    ENV_TEXT,         /* printable text of at most max_len characters */
    ENV_FORM,         /* a form of its own, checked by the row's function */
} env_kind;

/* The programs that read a variable (env_var.readers). */
enum {
    ENV_CEPHALO = 1,      /* cephalo (the planner, `cephalo run`) */
    ENV_WORKER = 2,       /* cephalo-worker and cephalo-worker-cuda */
    ENV_WORKER_CUDA = 4,  /* cephalo-worker-cuda only */
    ENV_OPERATOR = 8,     /* cephalo-operator (its planning reads the planner's switches) */
};

typedef struct env_var {
    const char *name;
    env_kind kind;
    const char *const *choices; /* ENV_CHOICE: NULL-terminated */
    double lo, hi;              /* ENV_INT: [lo, hi]; ENV_NUMBER: (lo, hi] */
    size_t max_len;             /* ENV_PATH, ENV_PATH_OR_NONE, ENV_TEXT */
    bool (*form)(const char *); /* ENV_FORM */
    const char *values;         /* the accepted values in words; NULL: from the kind (choices, range) */
    const char *dflt;           /* the default in words; for ENV_CHOICE and ENV_FLAG one of the values */
    unsigned readers;           /* ENV_CEPHALO | ENV_WORKER | ... */
    const char *what;           /* one line: what it does */
} env_var;

/* What a getter of a text value found. */
enum { ENV_UNSET = 0, ENV_GIVEN = 1, ENV_OFF = 2 /* path-or-none: none or empty */ };

/* The table, in the order of docs/environment.md. */
const env_var *env_vars(int *n);
/* The row of a name, NULL when it has none. */
const env_var *env_find(const char *name);
/* The accepted values in words ("0 or 1", "tensor, unit or half", "an integer in 0..65535"):
 * the text of the messages, of --help-env and of the docs table. */
const char *env_values(const env_var *v, char *buf, size_t n);
/* The readers as "cephalo, cephalo-worker" (docs table and --help-env). */
const char *env_readers(const env_var *v, char *buf, size_t n);

/* Whether value is one that row v accepts; when not, err (if not NULL) names the variable, the
 * value and what is expected. An empty value is accepted (it means the default, or none). */
int env_check_value(const env_var *v, const char *value, err_t *err);
/* The variable's value in the environment checked by its row: 0, or -1 with err. */
int env_check(const char *name, err_t *err);
/* Every row: 0, or -1 with err for the first bad value. */
int env_check_all(err_t *err);
/* A program's entry: every row checked; 0, or 2 (exit status) after "PROG: message" on stderr. */
int env_entry(const char *prog);
/* The table for --help-env: each variable, its values, its default, its readers, what it does. */
void env_help(FILE *f);
/* `PROG --help-env` (argv[0] is "--help-env"): the table on stdout, 0; any argument after it is
 * refused (2), not ignored. */
int env_help_cmd(const char *prog, int argc, char **argv);

/* Typed getters (err NULL: see above). */
/* ENV_CHOICE: the index of the value in the row's choices (the default's when unset or empty);
 * -1 with err. */
int env_choice(const char *name, err_t *err);
/* ENV_CHOICE, ENV_FLAG: the value as the row's word (the default's when unset or empty); NULL with err. */
const char *env_word(const char *name, err_t *err);
/* ENV_FLAG: 0 or 1 (the default when unset or empty); -1 with err. */
int env_flag(const char *name, err_t *err);
/* ENV_INT: ENV_GIVEN with *out set, ENV_UNSET (out untouched), or -1 with err. */
int env_long(const char *name, long *out, err_t *err);
/* ENV_NUMBER: ENV_GIVEN with *out set, ENV_UNSET, or -1 with err. */
int env_number(const char *name, double *out, err_t *err);
/* ENV_PATH, ENV_PATH_OR_NONE, ENV_TEXT, ENV_FORM: ENV_GIVEN with *out the value, ENV_UNSET or
 * ENV_OFF with *out NULL, or -1 with err. */
int env_text(const char *name, const char **out, err_t *err);

/* $CEPHALO_TEST_NONFINITE's form, STEP or STEP:RANK (non-negative integers): whether s is one,
 * and its numbers (rank 0 when not given). The row's check and the worker read it alike. */
bool env_step_rank(const char *s, long *step, long *rank);

#endif
