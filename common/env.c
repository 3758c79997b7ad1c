/* env.c - the CEPHALO_* environment variables: one table, one parser (env.h, docs/environment.md). */
#include "common/env.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/exitcode.h"
#include "common/strutil.h"

#define PATH_MAX_LEN 4095 /* the programs' path buffers hold 4096 bytes */

static bool version_form(const char *s);
static bool step_rank_form(const char *s);

static const char *const adamw_modes[] = {"tensor", "unit", "half", NULL}; /* worker/model/train.h's order */
static const char *const acts_bits[] = {"16", "32", NULL};
static const char *const comm_backends[] = {"socket", "nccl", NULL};
static const char *const uneven_modes[] = {"auto", "grouped", "pad", NULL};
static const char *const attn_modes[] = {"simt", "mma", NULL};
static const char *const gemm_paths[] = {"blas", "lt", NULL};

#define PLANNERS (ENV_CEPHALO | ENV_WORKER | ENV_OPERATOR) /* the memory model's switches */

/* Every variable, in the order of docs/environment.md's table (tests/unit/test_env.c compares
 * them). A row's values and default are what the docs say, the messages quote and --help-env
 * prints; a new variable is a row here, a row there, and a getter where it is read. */
static const env_var table[] = {
    /* the planner's memory model: the planner and the workers must read the same values */
    {.name = "CEPHALO_ADAMW", .kind = ENV_CHOICE, .choices = adamw_modes, .dflt = "tensor", .readers = PLANNERS,
     .what = "the optimizer's launches: one per tensor, one per unit, or per unit with a 16-bit copy of the "
             "shards (2 bytes a parameter more, which the planner counts)"},
    {.name = "CEPHALO_ACTS", .kind = ENV_CHOICE, .choices = acts_bits, .dflt = "32", .readers = PLANNERS,
     .what = "16: 16-bit activations in a bf16/fp16 run (the planner counts their memory)"},
    {.name = "CEPHALO_VOCAB_PAD", .kind = ENV_FLAG, .dflt = "0", .readers = PLANNERS,
     .what = "1: the head's logits rows padded to 64 values (GPT, Llama; the planner counts them)"},
    /* the planner */
    {.name = "CEPHALO_PLAN_EXHAUSTIVE_DP", .kind = ENV_FLAG, .dflt = "0", .readers = ENV_CEPHALO | ENV_OPERATOR,
     .what = "1: the optimizer's reference DP (the same plans, quadratic in the batch; for checks)"},
    {.name = "CEPHALO_PROFILE_STORE", .kind = ENV_PATH_OR_NONE, .max_len = PATH_MAX_LEN,
     .dflt = "~/.cache/cephalo/profiles.json", .readers = ENV_CEPHALO,
     .what = "the profile store that plans read and `cephalo profile` merges into"},
    {.name = "CEPHALO_PROFILE_CACHE", .kind = ENV_PATH_OR_NONE, .max_len = PATH_MAX_LEN,
     .dflt = "$XDG_CACHE_HOME/cephalo/profiles, else ~/.cache/cephalo/profiles", .readers = ENV_CEPHALO,
     .what = "the directory of `cephalo run`'s device profiles (none: no profiling before planning)"},
    {.name = "CEPHALO_WORKER", .kind = ENV_PATH, .max_len = PATH_MAX_LEN,
     .dflt = "cephalo-worker (or -cuda) beside cephalo", .readers = ENV_CEPHALO,
     .what = "the worker binary that `cephalo run` and `cephalo profile` start"},
    /* the worker */
    {.name = "CEPHALO_PLAN", .kind = ENV_PATH, .max_len = PATH_MAX_LEN, .dflt = "none (--plan, else --model and --batch)",
     .readers = ENV_WORKER, .what = "the plan a rank trains or evaluates (train and eval's --plan)"},
    {.name = "CEPHALO_METRICS_PORT", .kind = ENV_INT, .lo = 0, .hi = 65535, .values = "a port, 0..65535 (0: off)",
     .dflt = "the plan's metrics_port + RANK, else 0", .readers = ENV_WORKER,
     .what = "the port of the worker's /metrics and /healthz (when --metrics-port is not given)"},
    {.name = "CEPHALO_JOB", .kind = ENV_TEXT, .max_len = 253, .dflt = "cephalo", .readers = ENV_WORKER,
     .what = "the job label of the worker's metrics"},
    {.name = "CEPHALO_JOB_ID", .kind = ENV_TEXT, .max_len = 63, .dflt = "empty (not checked)", .readers = ENV_WORKER,
     .what = "the rendezvous store refuses ranks that present another job id"},
    {.name = "CEPHALO_COMM_TIMEOUT", .kind = ENV_NUMBER, .lo = 0, .hi = 1e6,
     .values = "seconds > 0, at most 1e6 (e.g. 60 or 0.5)", .dflt = STR_OF(ENV_COMM_TIMEOUT_S), .readers = ENV_WORKER,
     .what = "the no-progress bound of every wait for a peer"},
    {.name = "CEPHALO_COMM_BACKEND", .kind = ENV_CHOICE, .choices = comm_backends, .dflt = "socket",
     .readers = ENV_WORKER, .what = "the collectives' backend (nccl: cephalo-worker-cuda only)"},
    {.name = "CEPHALO_NCCL_UNEVEN", .kind = ENV_CHOICE, .choices = uneven_modes, .dflt = "auto", .readers = ENV_WORKER,
     .what = "how the nccl backend's allgatherv and reduce-scatterv handle unequal counts"},
    {.name = "CEPHALO_STAGE_HOST", .kind = ENV_FLAG, .dflt = "0", .readers = ENV_WORKER,
     .what = "1: the staged collectives (the cuda device's, through host copies) on CPU devices too (tests)"},
    {.name = "CEPHALO_TEST_NONFINITE", .kind = ENV_FORM, .form = step_rank_form, .values = "STEP or STEP:RANK",
     .dflt = "unset (none)", .readers = ENV_WORKER,
     .what = "tests: rank RANK's (default 0) gradient is made inf at step STEP"},
    {.name = "CEPHALO_OPERATOR_VERSION", .kind = ENV_FORM, .form = version_form,
     .values = "a version, MAJOR.MINOR.PATCH[+BUILD]", .dflt = "unset (not checked)", .readers = ENV_WORKER,
     .what = "set by the operator in its worker pods: a worker of another release refuses to start"},
    /* the CUDA device */
    {.name = "CEPHALO_CUDA_TF32", .kind = ENV_FLAG, .dflt = "1", .readers = ENV_WORKER_CUDA,
     .what = "0: --precision fp32 matmuls exact on the GPU (no TF32 tensor cores)"},
    {.name = "CEPHALO_CUDA_ATTN", .kind = ENV_CHOICE, .choices = attn_modes, .dflt = "simt", .readers = ENV_WORKER_CUDA,
     .what = "mma: bf16/fp16 attention on tensor cores where the GPU has them"},
    {.name = "CEPHALO_CUDA_GEMM", .kind = ENV_CHOICE, .choices = gemm_paths, .dflt = "blas", .readers = ENV_WORKER_CUDA,
     .what = "lt: every matrix product through cuBLASLt, a linear layer's bias (and its gradient) in its epilogue"},
    {.name = "CEPHALO_CUDA_PORTABLE", .kind = ENV_FLAG, .dflt = "0", .readers = ENV_WORKER_CUDA,
     .what = "1: the pre-Ampere kernel paths (48 KB attention tiles, plain loads) on any GPU"},
    {.name = "CEPHALO_CUDA_OPTIME", .kind = ENV_FLAG, .dflt = "0", .readers = ENV_WORKER_CUDA,
     .what = "1: every op timed on the GPU, a table of the times by class at the end"},
    /* the operator */
    {.name = "CEPHALO_SERVICEACCOUNT_DIR", .kind = ENV_PATH, .max_len = PATH_MAX_LEN,
     .dflt = "/var/run/secrets/kubernetes.io/serviceaccount", .readers = ENV_OPERATOR,
     .what = "the in-cluster service account's files (ca.crt, token, namespace)"},
};

#define N_VARS ((int)(sizeof table / sizeof table[0]))

const env_var *env_vars(int *n) {
    *n = N_VARS;
    return table;
}

const env_var *env_find(const char *name) {
    for (int i = 0; i < N_VARS; i++)
        if (!strcmp(table[i].name, name)) return &table[i];
    return NULL;
}

/* ---- the forms of their own ---- */

/* a non-negative integer of digits only: no sign, no space ("+1", " 1" are not STEP) */
static bool digits_long(const char *s, size_t n, long *out) {
    char buf[24];
    if (n == 0 || n >= sizeof buf) return false;
    for (size_t i = 0; i < n; i++)
        if (!isdigit((unsigned char)s[i])) return false;
    memcpy(buf, s, n);
    buf[n] = '\0';
    return str_to_long(buf, out);
}

bool env_step_rank(const char *s, long *step, long *rank) {
    const char *colon = strchr(s, ':');
    *rank = 0;
    if (!colon) return digits_long(s, strlen(s), step);
    return digits_long(s, (size_t)(colon - s), step) && digits_long(colon + 1, strlen(colon + 1), rank);
}

static bool step_rank_form(const char *s) {
    long step, rank;
    return env_step_rank(s, &step, &rank);
}

/* MAJOR.MINOR.PATCH, then nothing or '+'/'-' and a build or pre-release tag (common/version.h:
 * the release is the part before them) */
static bool version_form(const char *s) {
    for (int part = 0; part < 3; part++) {
        if (!isdigit((unsigned char)*s)) return false;
        while (isdigit((unsigned char)*s)) s++;
        if (part < 2 && *s++ != '.') return false;
    }
    if (!*s) return true;
    if ((*s != '+' && *s != '-') || !s[1] || strlen(s) > 100) return false;
    for (s++; *s; s++)
        if (!isalnum((unsigned char)*s) && !strchr(".-+_", *s)) return false;
    return true;
}

/* ---- values ---- */

static const char *const flag_values[] = {"0", "1", NULL};

static const char *const *row_choices(const env_var *v) { return v->kind == ENV_FLAG ? flag_values : v->choices; }

/* "a", "a or b", "a, b or c" */
static void join_choices(const char *const *c, char *buf, size_t n) {
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; c[i]; i++) {
        const char *sep = i == 0 ? "" : c[i + 1] ? ", " : " or ";
        int w = snprintf(buf + len, n - len, "%s%s", sep, c[i]);
        if (w < 0 || (size_t)w >= n - len) return; /* the table's words fit the callers' buffers */
        len += (size_t)w;
    }
}

const char *env_values(const env_var *v, char *buf, size_t n) {
    if (v->values) snprintf(buf, n, "%s", v->values);
    else if (v->kind == ENV_CHOICE || v->kind == ENV_FLAG) join_choices(row_choices(v), buf, n);
    else if (v->kind == ENV_INT) snprintf(buf, n, "an integer in %.0f..%.0f", v->lo, v->hi);
    else if (v->kind == ENV_PATH) snprintf(buf, n, "a path");
    else if (v->kind == ENV_PATH_OR_NONE) snprintf(buf, n, "a path, none or empty (off)");
    else if (v->kind == ENV_TEXT) snprintf(buf, n, "text, at most %zu characters", v->max_len);
    else CHECK(!"a row of kind ENV_NUMBER or ENV_FORM says its values");
    return buf;
}

const char *env_readers(const env_var *v, char *buf, size_t n) {
    static const struct {
        unsigned bit;
        const char *name;
    } progs[] = {{ENV_CEPHALO, "cephalo"},
                 {ENV_WORKER, "cephalo-worker"},
                 {ENV_WORKER_CUDA, "cephalo-worker-cuda"},
                 {ENV_OPERATOR, "cephalo-operator"}};
    size_t len = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof progs / sizeof progs[0]; i++) {
        if (!(v->readers & progs[i].bit)) continue;
        int w = snprintf(buf + len, n - len, "%s%s", len ? ", " : "", progs[i].name);
        if (w < 0 || (size_t)w >= n - len) break;
        len += (size_t)w;
    }
    return buf;
}

static int choice_index(const env_var *v, const char *s) {
    const char *const *c = row_choices(v);
    for (int i = 0; c[i]; i++)
        if (!strcmp(s, c[i])) return i;
    return -1;
}

static bool printable(const char *s) {
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f) return false;
    return true;
}

/* Whether s (not empty) is a value of v. */
static bool value_ok(const env_var *v, const char *s) {
    long l;
    double d;
    switch (v->kind) {
    case ENV_CHOICE:
    case ENV_FLAG: return choice_index(v, s) >= 0;
    /* strtol and strtod skip leading space: refuse it (" 1" is not what the docs show) */
    case ENV_INT: return !isspace((unsigned char)*s) && str_to_long(s, &l) && l >= v->lo && l <= v->hi;
    case ENV_NUMBER: return !isspace((unsigned char)*s) && str_to_double(s, &d) && d > v->lo && d <= v->hi;
    case ENV_PATH:
    case ENV_PATH_OR_NONE: return strlen(s) <= v->max_len;
    case ENV_TEXT: return strlen(s) <= v->max_len && printable(s);
    case ENV_FORM: return v->form(s);
    }
    return false;
}

/* The value as a message quotes it: its first `keep` bytes, control characters as '?' (a newline
 * in a value must not break the message's line). */
static void quoted(const char *value, size_t keep, char *out, size_t n) {
    size_t k = 0;
    for (; value[k] && k < keep && k + 1 < n; k++)
        out[k] = (unsigned char)value[k] < 0x20 || value[k] == 0x7f ? '?' : value[k];
    out[k] = '\0';
}

int env_check_value(const env_var *v, const char *value, err_t *err) {
    if (!value || !*value || value_ok(v, value)) return 0;
    if (!err) return -1;
    char values[256], q[84];
    env_values(v, values, sizeof values);
    size_t len = strlen(value);
    /* a long value (a path) keeps its start: the message says why, not the whole value */
    if (v->max_len && len > v->max_len)
        return err_set(err, "$%s is %zu characters long ('%s...'), expected %s, at most %zu characters", v->name, len,
                       (quoted(value, 40, q, sizeof q), q), values, v->max_len);
    quoted(value, 80, q, sizeof q);
    return err_set(err, "$%s is '%s%s', expected %s", v->name, q, len > 80 ? "..." : "", values);
}

static const env_var *row_of(const char *name) {
    const env_var *v = env_find(name);
    if (!v) fprintf(stderr, "internal error: $%s is not in common/env.c's table\n", name);
    CHECK(v != NULL);
    return v;
}

int env_check(const char *name, err_t *err) { return env_check_value(row_of(name), getenv(name), err); }

extern char **environ;

/* A set CEPHALO_* name that is not a row but within two edits of one (CEPHALO_VOCABPAD,
 * CEPHALO_ADAM) is a switch the user believes set and no program reads: a warning names the row.
 * Other names pass in silence: the scripts have variables of their own (docs/environment.md). */
static void warn_near_misses(void) {
    for (char **e = environ; e && *e; e++) {
        const char *eq = strchr(*e, '=');
        size_t len = eq ? (size_t)(eq - *e) : 0;
        char name[64], key[64], row[64];
        if (len <= 8 || len >= sizeof name || strncmp(*e, "CEPHALO_", 8)) continue;
        memcpy(name, *e, len), name[len] = '\0';
        if (env_find(name)) continue;
        str_normalize(name + 8, key, sizeof key);
        for (int i = 0; i < N_VARS; i++) {
            str_normalize(table[i].name + 8, row, sizeof row);
            if (strlen(key) < 3 || str_edit_distance(key, row) > 2) continue;
            log_warn("$%s is set, but no cephalo program reads it: did you mean $%s? (docs/environment.md)", name,
                     table[i].name);
            break;
        }
    }
}

int env_check_all(err_t *err) {
    for (int i = 0; i < N_VARS; i++)
        if (env_check_value(&table[i], getenv(table[i].name), err) < 0) return -1;
    warn_near_misses();
    return 0;
}

int env_entry(const char *prog) {
    err_t err;
    if (env_check_all(&err) == 0) return 0;
    fprintf(stderr, "%s: %s\n", prog, err.msg);
    return EXIT_BAD_INPUT;
}

void env_help(FILE *f) {
    fputs("The environment variables the cephalo programs read (docs/environment.md). Every program\n"
          "checks them all when it starts: a value outside the accepted ones is refused (exit 2).\n"
          "Empty is unset (the default), except where empty is listed as off.\n\n",
          f);
    for (int i = 0; i < N_VARS; i++) {
        char values[256], readers[128];
        const env_var *v = &table[i];
        fprintf(f, "%s\n    values: %s\n    default: %s\n    read by: %s\n    %s\n", v->name,
                env_values(v, values, sizeof values), v->dflt, env_readers(v, readers, sizeof readers), v->what);
    }
}

int env_help_cmd(const char *prog, int argc, char **argv) {
    if (argc > 1) {
        fprintf(stderr, "%s: --help-env takes no arguments (got '%s')\n", prog, argv[1]);
        return EXIT_BAD_INPUT;
    }
    env_help(stdout);
    return 0;
}

/* ---- getters ---- */

/* The value of the row's variable, NULL when unset or empty; a bad value: -1 with err, or, with
 * err NULL (the caller relies on its program's env_entry), an internal error. */
static int read_checked(const env_var *v, const char **out, err_t *err) {
    const char *s = getenv(v->name);
    *out = s && *s ? s : NULL;
    err_t mine;
    if (env_check_value(v, s, err ? err : &mine) == 0) return 0;
    if (err) return -1;
    fprintf(stderr, "internal error: %s (read before the program checked its environment: env_entry)\n", mine.msg);
    CHECK(!"a bad environment value reached a getter without an error to return");
    return -1;
}

static const env_var *row_of_kind(const char *name, env_kind k1, env_kind k2) {
    const env_var *v = row_of(name);
    CHECK(v->kind == k1 || v->kind == k2);
    return v;
}

int env_choice(const char *name, err_t *err) {
    const env_var *v = row_of_kind(name, ENV_CHOICE, ENV_FLAG);
    const char *s;
    if (read_checked(v, &s, err) < 0) return -1;
    int i = choice_index(v, s ? s : v->dflt);
    CHECK(i >= 0); /* a choice row's default is one of its values (test_env.c) */
    return i;
}

const char *env_word(const char *name, err_t *err) {
    int i = env_choice(name, err);
    return i < 0 ? NULL : row_choices(row_of(name))[i];
}

int env_flag(const char *name, err_t *err) {
    row_of_kind(name, ENV_FLAG, ENV_FLAG);
    return env_choice(name, err); /* "0", "1": the index is the value */
}

int env_long(const char *name, long *out, err_t *err) {
    const env_var *v = row_of_kind(name, ENV_INT, ENV_INT);
    const char *s;
    if (read_checked(v, &s, err) < 0) return -1;
    if (!s) return ENV_UNSET;
    CHECK(str_to_long(s, out));
    return ENV_GIVEN;
}

int env_number(const char *name, double *out, err_t *err) {
    const env_var *v = row_of_kind(name, ENV_NUMBER, ENV_NUMBER);
    const char *s;
    if (read_checked(v, &s, err) < 0) return -1;
    if (!s) return ENV_UNSET;
    CHECK(str_to_double(s, out));
    return ENV_GIVEN;
}

int env_text(const char *name, const char **out, err_t *err) {
    const env_var *v = row_of(name);
    CHECK(v->kind == ENV_PATH || v->kind == ENV_PATH_OR_NONE || v->kind == ENV_TEXT || v->kind == ENV_FORM);
    const char *s;
    *out = NULL;
    if (read_checked(v, &s, err) < 0) return -1;
    if (v->kind == ENV_PATH_OR_NONE && (getenv(name) && (!s || !strcmp(s, "none")))) return ENV_OFF;
    if (!s) return ENV_UNSET;
    *out = s;
    return ENV_GIVEN;
}
