/* args.c - the front ends' command lines (args.h). */
#include "common/args.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fileio.h"
#include "common/strutil.h"

static void vsay(const char *cmd, const char *fmt, va_list ap) {
    fprintf(stderr, "%s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(see '%s --help')\n", cmd);
}

int args_bad(const args *a, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsay(a->cmd, fmt, ap);
    va_end(ap);
    return ARGS_BAD;
}

int args_bad_cmd(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsay(cmd, fmt, ap);
    va_end(ap);
    return ARGS_BAD;
}

args args_begin(int argc, char **argv, const char *cmd, const struct option *opts, const char *shortopts,
                const char *usage) {
    args a = {.cmd = cmd, .usage = usage, .argc = argc, .argv = argv, .opts = opts};
    snprintf(a.shortopts, sizeof a.shortopts, ":h%s", shortopts ? shortopts : "");
    optind = 1; /* every front end parses from its argv[1]: the subcommand's name is argv[0] */
    opterr = 0;
    return a;
}

int args_next(args *a) {
    int index = -1;
    int ch = getopt_long(a->argc, a->argv, a->shortopts, a->opts, &index);
    a->val = optarg;
    if (ch == -1) return 0;
    if (ch > 0 && ch < ARGS_MAX_CODE) a->given[ch / 64] |= UINT64_C(1) << (ch % 64);
    /* the option as the user wrote it: getopt_long gives the long option's index, else a letter */
    const char *written = a->argv[optind - 1];
    if (index >= 0)
        snprintf(a->opt, sizeof a->opt, "--%s", a->opts[index].name);
    else if (ch != '?' && ch != ':')
        snprintf(a->opt, sizeof a->opt, "-%c", ch);
    else
        snprintf(a->opt, sizeof a->opt, "%s", written ? written : "?");
    switch (ch) {
    case 'h':
        fputs(a->usage, stdout);
        exit(0);
    case ':': return args_bad(a, "option '%s' needs a value", written), -1;
    case '?': return args_bad(a, "unknown option '%s'", written), -1;
    default: return ch;
    }
}

bool args_given(const args *a, int code) {
    return code > 0 && code < ARGS_MAX_CODE && (a->given[code / 64] >> (code % 64) & 1);
}

/* The option of this code as the usage names it: "--loss-scale", or "-o" without a long name. */
static void option_name(const args *a, int code, char *out, size_t n) {
    for (const struct option *o = a->opts; o && o->name; o++)
        if (o->val == code && !o->flag) {
            snprintf(out, n, "--%s", o->name);
            return;
        }
    snprintf(out, n, "-%c", code);
}

int args_check_only(const args *a, const args_only *rows, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (rows[i].acts || !args_given(a, rows[i].code)) continue;
        char name[64];
        option_name(a, rows[i].code, name, sizeof name);
        switch (rows[i].fix) {
        case ARGS_GIVE: return args_bad(a, "%s needs %s", name, rows[i].needs);
        case ARGS_GIVE_OR_LEAVE:
            return args_bad(a, "%s needs %s: give that too, or leave %s out (alone it has no effect)", name,
                            rows[i].needs, name);
        case ARGS_LEAVE_OUT: break;
        }
        return args_bad(a, "%s needs %s; otherwise it has no effect: leave it out", name, rows[i].needs);
    }
    return 0;
}

int args_operands(const args *a, char ***first) {
    *first = a->argv + optind;
    return a->argc - optind;
}

int args_no_operands(const args *a) {
    if (optind < a->argc) return args_bad(a, "unexpected argument '%s'", a->argv[optind]);
    return 0;
}

int args_long(const args *a, long lo, long hi, long *out) {
    long v;
    if (!str_to_long(a->val, &v) || v < lo || v > hi)
        return args_bad(a, "%s: '%s' is not an integer in [%ld, %ld]", a->opt, a->val, lo, hi);
    *out = v;
    return 0;
}

int args_int(const args *a, int lo, int hi, int *out) {
    long v = 0;
    if (args_long(a, lo, hi, &v)) return ARGS_BAD;
    *out = (int)v;
    return 0;
}

int args_int64(const args *a, int64_t lo, int64_t hi, int64_t *out) {
    long v = 0;
    if (args_long(a, (long)lo, (long)hi, &v)) return ARGS_BAD;
    *out = v;
    return 0;
}

int args_double(const args *a, double lo, double hi, double *out) {
    double v;
    if (!str_to_double(a->val, &v) || !(v >= lo && v <= hi))
        return args_bad(a, "%s: '%s' is not a number in [%g, %g]", a->opt, a->val, lo, hi);
    *out = v;
    return 0;
}

int args_size(const args *a, int64_t *out) {
    if (!str_to_size(a->val, out)) return args_bad(a, "%s: '%s' is not a size (e.g. 512M, 2G)", a->opt, a->val);
    return 0;
}

int args_dir(const args *a, const char **out) {
    err_t err;
    if (file_expect_dir(a->val, &err) < 0) return args_bad(a, "%s: %s", a->opt, err.msg);
    *out = a->val;
    return 0;
}

int args_choice(const args *a, const char *const *choices, const char **out) {
    char list[256] = "";
    size_t len = 0;
    int n = 0;
    for (; choices[n]; n++)
        if (!strcmp(a->val, choices[n])) return *out = choices[n], 0;
    for (int i = 0; i < n && len < sizeof list; i++)
        len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", i == 0 ? "" : i == n - 1 ? " or " : ", ", choices[i]);
    return args_bad(a, "%s: '%s' is not %s", a->opt, a->val, list);
}
