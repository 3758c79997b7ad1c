/* profile.c - `cephalo-worker profile` and `cephalo-worker profile-comm`, what `cephalo profile`
 * runs (docs/profile.md): their options; the measurements are model/wprofile.c's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd/cmd.h"
#include "common/args.h"
#include "common/outputs.h"
#include "common/strutil.h"
#include "common/worker_cmd.h"
#include "model/wprofile.h"

static const char profile_usage[] =
    "usage: cephalo-worker profile --model M [--seq T] [--precision P] [--device cpu|cuda] [--threads N]\n"
    "                              [--gpu N] [--memory SIZE] [--max-micro K] [--min-time-ms MS]\n"
    "                              [--name TYPE] [--quiet] -o FILE\n"
    "Times the embedding, one block and the head at microbatch 1..K on this device and measures\n"
    "their compute memory; writes a profile file (docs/profile.md). --name is the device's catalog\n"
    "type (required with --device cuda; default cpu-Nt on the CPU).\n";

static const char comm_usage[] =
    "usage: cephalo-worker profile-comm [--min-bytes N] [--max-bytes N] [--reps N] -o FILE\n"
    "Times allgatherv and reduce-scatterv over the ranks of $WORLD_SIZE (at least 2; $RANK,\n"
    "$MASTER_ADDR, $MASTER_PORT as for train) from --min-bytes to --max-bytes (x4 each step);\n"
    "rank 0 writes the profile file (docs/profile.md).\n";

typedef struct compute_cmd {
    wprof_opts w;
    const char *model;
    long seq;
} compute_cmd;

enum { O_MODEL = 256, O_SEQ, O_PREC, O_DEVICE, O_THREADS, O_MEMORY, O_MAXM, O_NAME, O_MINMS, O_GPU, O_QUIET };

static int compute_option(args *p, int ch, compute_cmd *o) {
    const char *prec;
    switch (ch) {
    case O_MODEL: o->model = p->val; break;
    case O_SEQ: return args_long(p, 1, 1 << 20, &o->seq);
    case O_PREC: return args_choice(p, precision_names, &prec) ? ARGS_BAD : (precision_parse(prec, &o->w.prec), 0);
    case O_DEVICE: return args_choice(p, cmd_devices, &o->w.device);
    case O_THREADS: return args_long(p, 1, 4096, &o->w.threads);
    case O_GPU: return args_long(p, 0, 1023, &o->w.gpu);
    case O_MEMORY: return args_size(p, &o->w.memory);
    case O_MAXM: return args_long(p, 1, 4096, &o->w.max_micro);
    case O_MINMS: return args_double(p, 0, 60000, &o->w.min_ms);
    case O_NAME: o->w.name = p->val; break;
    case O_QUIET: o->w.quiet = true; break;
    case 'o': o->w.out = p->val; break;
    }
    return 0;
}

static int parse_compute(int argc, char **argv, compute_cmd *o, args *p) {
    static const struct option longopts[] = {
        {"model", 1, 0, O_MODEL},      {"seq", 1, 0, O_SEQ},         {"precision", 1, 0, O_PREC},
        {"device", 1, 0, O_DEVICE},    {"threads", 1, 0, O_THREADS}, {"memory", 1, 0, O_MEMORY},
        {"max-micro", 1, 0, O_MAXM},   {"name", 1, 0, O_NAME},       {"min-time-ms", 1, 0, O_MINMS},
        {"gpu", 1, 0, O_GPU},          {"quiet", 0, 0, O_QUIET},     {"output", 1, 0, 'o'},
        {"help", 0, 0, 'h'},           {0, 0, 0, 0}};
    *p = args_begin(argc, argv, WORKER_NAME " profile", longopts, "o:", profile_usage);
    int ch = 0, rc = 0;
    while (!rc && (ch = args_next(p)) > 0) rc = compute_option(p, ch, o);
    if (rc || ch < 0 || args_no_operands(p)) return ARGS_BAD;
    if (!o->model) return args_bad(p, "--model is required");
    if (!o->w.out) return args_bad(p, "-o FILE is required");
    const args_only only[] = {{O_GPU, !strcmp(o->w.device, "cuda"), "--device cuda", ARGS_LEAVE_OUT}};
    return args_check_only(p, only, 1);
}

/* The profile's device name: --name, else cpu-Nt on the CPU; a GPU's must be given. */
static int device_name(const args *p, const compute_cmd *o, char *name, size_t n) {
    bool cuda = !strcmp(o->w.device, "cuda");
    if (o->w.name && strlen(o->w.name) >= n) return args_bad(p, "--name: longer than %zu characters", n - 1);
    if (o->w.name) snprintf(name, n, "%s", o->w.name);
    else if (!cuda) snprintf(name, n, "cpu-%ldt", o->w.threads ? o->w.threads : 1);
    else return args_bad(p, "--name (the GPU's catalog type, e.g. A100-80GB) is required with --device cuda");
    return 0;
}

/* -o against the model read (common/outputs.h), before anything is measured: exit 2 when refused. */
static int check_outputs(const char *cmd, const char *model, const char *out) {
    out_set s = out_begin(cmd);
    out_input_path(&s, "--model", model, &out_hf_input);
    out_file(&s, "-o", out);
    err_t err;
    int rc = out_check(&s, &err);
    out_free(&s);
    if (rc < 0) fprintf(stderr, "%s: %s\n", cmd, err.msg);
    return rc;
}

int cmd_profile(int argc, char **argv) {
    compute_cmd o = {.w = {.device = "cpu", .max_micro = 8, .min_ms = 150}};
    o.w.prec = wcmd_default_precision();
    args p;
    int rc = parse_compute(argc, argv, &o, &p);
    if (rc) return rc;
    err_t err;
    model_spec model;
    int seq;
    char name[32];
    if (check_outputs(WORKER_NAME " profile", o.model, o.w.out) < 0) return EXIT_BAD_INPUT;
    if (model_resolve(o.model, &model, &err) < 0) return args_bad(&p, "--model: %s", err.msg);
    if (model_check_seq(&model, (int)o.seq, &seq, &err) < 0) return args_bad(&p, "--seq: %s", err.msg);
    if (device_name(&p, &o, name, sizeof name)) return ARGS_BAD;
    o.w.name = name;
    if (wprof_compute(&o.w, &model, seq, &err) < 0) {
        fprintf(stderr, WORKER_NAME " profile: %s\n", err.msg);
        return EXIT_FAILED;
    }
    return EXIT_OK;
}

/* ---- profile-comm ---- */

enum { O_MIN = 256, O_MAX, O_REPS };

static int comm_option(args *p, int ch, wprof_comm_opts *o) {
    switch (ch) {
    case O_MIN: return args_size(p, &o->min_bytes);
    case O_MAX: return args_size(p, &o->max_bytes);
    case O_REPS: return args_int(p, 1, WPROF_MAX_REPS, &o->reps);
    case 'o': o->out = p->val; break;
    }
    return 0;
}

static int parse_comm(int argc, char **argv, wprof_comm_opts *o, args *p) {
    static const struct option longopts[] = {{"min-bytes", 1, 0, O_MIN}, {"max-bytes", 1, 0, O_MAX},
                                             {"reps", 1, 0, O_REPS},     {"output", 1, 0, 'o'},
                                             {"help", 0, 0, 'h'},        {0, 0, 0, 0}};
    *p = args_begin(argc, argv, WORKER_NAME " profile-comm", longopts, "o:", comm_usage);
    int ch = 0, rc = 0;
    while (!rc && (ch = args_next(p)) > 0) rc = comm_option(p, ch, o);
    if (rc || ch < 0 || args_no_operands(p)) return ARGS_BAD;
    if (!o->out) return args_bad(p, "-o FILE is required");
    if (o->max_bytes < o->min_bytes) return args_bad(p, "--max-bytes is below --min-bytes");
    return 0;
}

/* $RANK and $WORLD_SIZE: collectives need at least two ranks. */
static int comm_ranks(const args *p, long *rank, long *world) {
    const char *s;
    *rank = 0, *world = 1;
    if ((s = getenv("RANK")) && (!str_to_long(s, rank) || *rank < 0)) return args_bad(p, "$RANK is '%s'", s);
    if ((s = getenv("WORLD_SIZE")) && (!str_to_long(s, world) || *world < 2 || *rank >= *world))
        return args_bad(p, "$WORLD_SIZE is '%s' (collectives need at least 2 ranks)", s);
    if (*world < 2) return args_bad(p, "$WORLD_SIZE must be at least 2");
    return 0;
}

int cmd_profile_comm(int argc, char **argv) {
    wprof_comm_opts o = {.min_bytes = 64 << 10, .max_bytes = 4 << 20, .reps = 7};
    args p;
    long rank, world;
    int rc = parse_comm(argc, argv, &o, &p);
    if (rc || (rc = comm_ranks(&p, &rank, &world))) return rc;
    if (check_outputs(WORKER_NAME " profile-comm", NULL, o.out) < 0) return EXIT_BAD_INPUT;
    err_t err;
    comm_config cc;
    if (comm_config_from_env(&cc, (int)rank, (int)world, &err) < 0) return args_bad(&p, "%s", err.msg);
    comm *cm = comm_open(&cc, &err);
    if (!cm) return fprintf(stderr, WORKER_NAME " profile-comm: %s\n", err.msg), EXIT_FAILED;
    rc = wprof_comm(cm, &o, &err);
    if (rc < 0) {
        fprintf(stderr, WORKER_NAME " profile-comm: %s\n", err.msg);
        comm_abort(cm, "profiling failed");
    }
    comm_close(cm);
    return rc < 0 ? EXIT_FAILED : EXIT_OK;
}
