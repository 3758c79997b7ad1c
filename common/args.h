/* args.h - the command lines of every front end (`cephalo`'s subcommands and `cephalo-worker`'s):
 * long options through getopt_long, one wording for what is wrong with an argument, and one exit
 * status for bad input, so that each front end keeps only its options and its checks.
 *
 *   args a = args_begin(argc, argv, "cephalo-worker eval", longopts, "", eval_usage);
 *   int ch, rc = 0;
 *   while (!rc && (ch = args_next(&a)) > 0) {
 *       switch (ch) {
 *       case O_SAMPLES: rc = args_long(&a, 1, 1L << 30, &o->samples); break;
 *       case O_DEVICE: rc = args_choice(&a, (const char *[]){"cpu", "cuda", NULL}, &o->device); break;
 *       }
 *   }
 *   if (rc || ch < 0 || args_no_operands(&a)) return ARGS_BAD;
 *
 * Every message goes to stderr as "CMD: what is wrong" followed by "(see 'CMD --help')", and names
 * the option as written ("--samples: 'x' is not an integer in [1, 1073741824]"). -h and --help
 * print the usage on stdout and exit 0. */
#ifndef CEPHALO_ARGS_H
#define CEPHALO_ARGS_H

#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/exitcode.h"

#define ARGS_BAD EXIT_BAD_INPUT /* what the parsers return for bad input: the exit status */
#define ARGS_MAX_CODE 512 /* option codes (getopt_long's val) are below this */

typedef struct args {
    const char *cmd;   /* "cephalo-worker eval": the start of every message */
    const char *usage; /* printed by -h / --help */
    int argc;
    char **argv;
    const struct option *opts; /* as getopt_long's, with {"help", no_argument, 0, 'h'} among them */
    char shortopts[32];        /* ":h" plus the caller's short options */
    const char *val;           /* the current option's value (optarg), NULL when it takes none */
    char opt[64];              /* the current option as written: "--samples", "-o" */
    uint64_t given[ARGS_MAX_CODE / 64]; /* the options seen, by code (args_given) */
} args;

/* shortopts: the short options beyond -h, getopt's syntax ("o:"), or "". Resets getopt (optind). */
args args_begin(int argc, char **argv, const char *cmd, const struct option *opts, const char *shortopts,
                const char *usage);
/* The next option's code (> 0); 0 when the options end; -1 after saying what is wrong (an unknown
 * option, a missing value). -h / --help: the usage on stdout, then exit(0). */
int args_next(args *a);
/* The operands after the options (optind..argc): their count and the first one. */
int args_operands(const args *a, char ***first);
/* ARGS_BAD, after "unexpected argument 'x'", when operands are left; else 0. */
int args_no_operands(const args *a);

/* The current option's value read as a number in [lo, hi]: 0, or ARGS_BAD after the message. */
int args_long(const args *a, long lo, long hi, long *out);
int args_int(const args *a, int lo, int hi, int *out);
int args_int64(const args *a, int64_t lo, int64_t hi, int64_t *out);
int args_double(const args *a, double lo, double hi, double *out);
/* A size: "512M", "2G", "1048576" (str_to_size). */
int args_size(const args *a, int64_t *out);
/* One of choices (NULL-terminated): *out points at the value; the message lists the choices
 * ("--device: 'tpu' is not cpu or cuda"). */
int args_choice(const args *a, const char *const *choices, const char **out);

/* An input directory (--init-from DIR): *out points at the value; a file, or a path that does not
 * exist, is refused here ("--init-from: f: is a file, expected a directory"), before anything reads
 * it as something else. */
int args_dir(const args *a, const char **out);

/* Whether the option of this code was given. */
bool args_given(const args *a, int code);

/* What to do about an option given where it does not act: the message's advice. */
typedef enum args_fix {
    ARGS_LEAVE_OUT, /* it needs a mode this run is not in: "otherwise it has no effect: leave it out" */
    ARGS_GIVE_OR_LEAVE, /* it needs another option, which its user may have meant to give: "give that
                         * too, or leave --eos out (alone it has no effect)" */
    ARGS_GIVE, /* it chooses what the command does (--sft) and cannot without what it needs: leaving it
                * out would do something else than asked, so the message asks for the other */
} args_fix;

/* An option that acts only in some modes: its code, whether it acts in the mode chosen, what it
 * needs, in words ("--precision fp16 (the precision here is bf16)"), and the advice. */
typedef struct args_only {
    int code;
    bool acts;
    const char *needs;
    args_fix fix;
} args_only;

/* The one rule of every front end for options that would do nothing in the mode chosen: each
 * front end lists its conditional options as rows, once the mode is known (after a plan is read,
 * say), and an option given where its row does not act is refused, not silently ignored:
 * ARGS_BAD after "--loss-scale needs --precision fp16 (...); otherwise it has no effect: leave it
 * out", "--ckpt-every needs --ckpt-dir: give that too, or leave --ckpt-every out (alone it has no
 * effect)", "--sft needs --tokenizer FILE (...)". 0 when every option given acts. */
int args_check_only(const args *a, const args_only *rows, size_t n);

/* Says "CMD: <message>" and "(see 'CMD --help')" on stderr; returns ARGS_BAD. */
int args_bad(const args *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The same for a command before its args exist (an unknown subcommand). */
int args_bad_cmd(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
