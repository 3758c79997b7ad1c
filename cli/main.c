/* cli.c - the `cephalo` command: plan, compare, models, gpus, data, run (run.c does the running).
 * Exit codes (DESIGN 5.1): 0 feasible, 3 infeasible (with the reason), 2 bad input; `run` adds
 * 1 (a worker failed) and 130 (interrupted). */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cluster.h"
#include "fileio.h"
#include "cost.h"
#include "data.h"
#include "gpu.h"
#include "inputs.h"
#include "model.h"
#include "plan.h"
#include "profile_cmd.h"
#include "profile_store.h"
#include "run.h"
#include "strutil.h"

#define EXIT_INFEASIBLE 3
#define EXIT_BAD_INPUT 2

static const char usage_text[] =
    "usage: cephalo COMMAND [options]\n"
    "\n"
    "commands:\n"
    "  plan      plan one strategy for a cluster, model and global batch\n"
    "  compare   predicted iteration time and memory of every strategy side by side\n"
    "  models    list the built-in models; `models MODEL` shows its units, FLOPs, activations\n"
    "  gpus      list the GPU catalog\n"
    "  data      prepare training data: text files -> llm.c token shards (byte-level), or a\n"
    "            synthetic labeled image file (CIMG); `cephalo data --help` shows its options\n"
    "  run       plan a job file on the local devices and train it, one cephalo-worker per\n"
    "            device; `cephalo run --help` shows its options (docs/run.md)\n"
    "  profile   measure the cost model of the local devices for a model into a profile file\n"
    "            and the profile store; `cephalo profile --help` (docs/profile.md)\n"
    "\n"
    "plan / compare options:\n"
    "  --cluster FILE        cluster file (YAML, docs/formats.md)            [required]\n"
    "  --model MODEL         built-in model name or model file               [required]\n"
    "  --batch B             global batch (samples per iteration)            [required]\n"
    "  --seq S               sequence length (default: the model's)\n"
    "  --precision P         fp32 (default; TF32 tensor cores allowed), bf16 (compute\n"
    "                        capability 8.0+) or fp16 (tensor cores from 7.0; Pascal runs\n"
    "                        it at its fp32 rate, with 2-byte parameter gathers)\n"
    "  --strategy S          cephalo (default), fsdp, whale, cb or mb        [plan]\n"
    "  --profile FILE        measured costs (cephalo profile); default: the profile store\n"
    "                        when it has the model, else estimates (docs/profile.md)\n"
    "  --mem-cap F           usable fraction of device memory (default 0.8)\n"
    "  --format F            table (default) or json\n"
    "  -o, --output FILE     also write the plan JSON to FILE                [plan]\n"
    "  --dump-costs FILE     write every candidate (microbatch, count) of every rank (one\n"
    "                        table per device group) with its time and memory, and the\n"
    "                        collective terms, as JSON\n"
    "  -h, --help            this text\n"
    "\n"
    "exit status: 0 feasible, 3 infeasible (the reason is printed), 2 bad input\n";

typedef struct cli_opts {
    const char *cluster, *model, *profile, *output, *dump_costs;
    long batch, seq;
    precision prec;
    bool json;
    double mem_cap;
    strategy strat;
} cli_opts;

static int bad(const char *fmt, const char *arg) {
    fprintf(stderr, "cephalo: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(see 'cephalo --help')\n");
    return EXIT_BAD_INPUT;
}

static int parse_options(int argc, char **argv, cli_opts *o) {
    static const struct option longopts[] = {
        {"cluster", required_argument, 0, 'c'}, {"model", required_argument, 0, 'm'},
        {"batch", required_argument, 0, 'b'},   {"seq", required_argument, 0, 's'},
        {"precision", required_argument, 0, 'p'}, {"strategy", required_argument, 0, 'S'},
        {"profile", required_argument, 0, 'P'}, {"mem-cap", required_argument, 0, 'M'},
        {"format", required_argument, 0, 'f'},  {"output", required_argument, 0, 'o'},
        {"dump-costs", required_argument, 0, 'D'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    *o = (cli_opts){.mem_cap = 0.8, .strat = STRAT_CEPHALO};
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":ho:", longopts, NULL)) != -1) {
        err_t err;
        switch (c) {
        case 'c': o->cluster = optarg; break;
        case 'm': o->model = optarg; break;
        case 'P': o->profile = optarg; break;
        case 'o': o->output = optarg; break;
        case 'D': o->dump_costs = optarg; break;
        case 'b':
            if (!str_to_long(optarg, &o->batch) || o->batch < 1 || o->batch > COST_MAX_BATCH)
                return bad("--batch: '%s' is not a positive integer (1..65536)", optarg);
            break;
        case 's':
            if (!str_to_long(optarg, &o->seq) || o->seq < 1 || o->seq > 1 << 20)
                return bad("--seq: '%s' is not a positive integer (1..1048576)", optarg);
            break;
        case 'p':
            if (!precision_parse(optarg, &o->prec)) return bad("--precision: '%s' (expected " PRECISION_CHOICES ")", optarg);
            break;
        case 'M':
            if (!str_to_double(optarg, &o->mem_cap) || !(o->mem_cap > 0 && o->mem_cap <= 1))
                return bad("--mem-cap: '%s' (expected a fraction in (0, 1])", optarg);
            break;
        case 'f':
            if (strcmp(optarg, "table") && strcmp(optarg, "json")) return bad("--format: '%s' (expected table or json)", optarg);
            o->json = strcmp(optarg, "json") == 0;
            break;
        case 'S':
            if (strategy_parse(optarg, &o->strat, &err) < 0) return bad("--strategy: %s", err.msg);
            break;
        case 'h': fputs(usage_text, stdout); exit(0);
        case ':': return bad("option '%s' needs a value", argv[optind - 1]);
        default: return bad("unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) return bad("unexpected argument '%s'", argv[optind]);
    if (!o->cluster) return bad("%s", "--cluster FILE is required");
    if (!o->model) return bad("%s", "--model MODEL is required");
    if (!o->batch) return bad("%s", "--batch B is required");
    return 0;
}

/* Loads everything a plan needs; prints the error and returns EXIT_BAD_INPUT on failure. */
static int load_inputs(const cli_opts *o, plan_inputs *in) {
    err_t err = {{0}};
    memset(in, 0, sizeof *in);
    inputs_opts io = {.profile = o->profile, .seq = o->seq, .batch = o->batch, .prec = o->prec, .mem_cap = o->mem_cap};
    /* the precision is checked against the GPUs first, so that the message names the option */
    if (cluster_load_file(o->cluster, &in->cl, &err) < 0 || cluster_check_precision(&in->cl, o->prec, "--precision", &err) < 0 ||
        model_resolve(o->model, &in->model, &err) < 0 || inputs_build(in, &io, &err) < 0) {
        fprintf(stderr, "cephalo: %s\n", err.msg);
        return EXIT_BAD_INPUT;
    }
    inputs_print_notes(in, "cephalo", stderr);
    return 0;
}

static int write_plan_file(const plan *p, const char *path) {
    err_t err;
    if (inputs_save_plan(p, path, &err) == 0) return 0;
    fprintf(stderr, "cephalo: %s\n", err.msg);
    return EXIT_BAD_INPUT;
}

/* Refuses -o and --dump-costs when they name an input (the cluster, a model file, the profile or
 * the profile store the plan reads) or each other: `-o c.yaml` must not replace the cluster file
 * it was planned from. Checked before anything is loaded or written. */
static int check_plan_outputs(const cli_opts *o) {
    char store[PATH_LEN];
    bool use_store = !o->profile && profile_store_path(store, sizeof store);
    const file_arg ins[] = {{"--cluster", o->cluster}, {"--model", o->model}, {"--profile", o->profile},
                            {"the profile store", use_store ? store : NULL}};
    const file_arg outs[] = {{"-o", o->output}, {"--dump-costs", o->dump_costs}};
    err_t err;
    if (file_check_outputs(outs, 2, ins, 4, &err) == 0) return 0;
    fprintf(stderr, "cephalo: %s\n", err.msg);
    return EXIT_BAD_INPUT;
}

static int cmd_plan(int argc, char **argv, bool compare) {
    cli_opts o;
    int rc = parse_options(argc, argv, &o);
    if (rc || (rc = check_plan_outputs(&o))) return rc;
    plan_inputs in;
    if ((rc = load_inputs(&o, &in))) {
        inputs_free(&in);
        return rc;
    }
    err_t err;
    if (o.dump_costs && plan_dump_costs(&in.cm, o.dump_costs, &err) < 0) {
        fprintf(stderr, "cephalo: %s\n", err.msg);
        inputs_free(&in);
        return EXIT_BAD_INPUT;
    }
    plan plans[STRAT_COUNT];
    int n = compare ? STRAT_COUNT : 1;
    for (int s = 0; s < n; s++) plan_make(&in.cm, compare ? (strategy)s : o.strat, &plans[s], &err);
    if (compare) {
        if (o.json) plan_write_compare_json(plans, n, stdout, &err);
        else plan_print_compare(plans, n, stdout);
        rc = plans[STRAT_CEPHALO].feasible ? 0 : EXIT_INFEASIBLE;
    } else {
        if (o.json) plan_write_json(&plans[0], stdout, &err);
        else plan_print_table(&plans[0], stdout);
        if (!plans[0].feasible) fprintf(stderr, "cephalo: infeasible: %s\n", plans[0].reason);
        rc = plans[0].feasible ? 0 : EXIT_INFEASIBLE;
        if (rc == 0 && o.output) rc = write_plan_file(&plans[0], o.output);
    }
    for (int s = 0; s < n; s++) plan_free(&plans[s]);
    inputs_free(&in);
    return rc;
}

static int cmd_models_list(void) {
    int n;
    const model_spec *b = model_builtins(&n);
    printf("%-16s %-6s %7s %6s %6s %6s %8s %16s\n", "model", "arch", "layers", "d", "heads", "kv", "d_ff", "parameters");
    for (int i = 0; i < n; i++)
        printf("%-16s %-6s %7d %6d %6d %6d %8d %16lld\n", b[i].name, model_arch_name(b[i].arch), b[i].n_layer, b[i].d_model,
               b[i].n_head, b[i].n_kv_head, b[i].d_ff, (long long)model_params(&b[i]));
    return 0;
}

/* One model's units with the figures the planner uses (docs/cost-model.md). */
static int cmd_model_detail(const char *name, long seq_opt, precision prec) {
    model_spec m;
    err_t err;
    int seq;
    if (model_resolve(name, &m, &err) < 0 || model_check_seq(&m, (int)seq_opt, &seq, &err) < 0) {
        fprintf(stderr, "cephalo: %s\n", err.msg);
        return EXIT_BAD_INPUT;
    }
    int elem = precision_gather_bytes(prec), t = model_tokens(&m, seq);
    printf("%s: %s, %d layers, d_model %d, %d heads (%d kv), d_ff %d, %lld parameters\n", m.name, model_arch_name(m.arch),
           m.n_layer, m.d_model, m.n_head, m.n_kv_head, m.d_ff, (long long)model_params(&m));
    printf("per sample at %d tokens, %s activations; FSDP units:\n", t, precision_name(prec));
    printf("%-12s %5s %15s %16s %18s\n", "unit", "count", "parameters", "fwd GFLOP/sample", "activations MiB");
    for (unit_kind k = UNIT_EMBEDDING; k <= UNIT_HEAD; k++)
        printf("%-12s %5d %15lld %16.3f %18.2f\n", unit_kind_name(k), k == UNIT_BLOCK ? m.n_layer : 1,
               (long long)model_kind_params(&m, k), model_kind_fwd_flops(&m, k, seq) / 1e9,
               model_kind_act_bytes(&m, k, seq, elem) / (1024.0 * 1024.0));
    double fwd = model_kind_fwd_flops(&m, UNIT_EMBEDDING, seq) + m.n_layer * model_kind_fwd_flops(&m, UNIT_BLOCK, seq) +
                 model_kind_fwd_flops(&m, UNIT_HEAD, seq);
    printf("training FLOPs per token (fwd + bwd, no recompute): %.4g (6N = %.4g)\n", 3 * fwd / t, 6.0 * model_params(&m));
    printf("unit-boundary checkpoint per sample: %.2f MiB; training state: %.2f GiB (16 B/param)\n",
           model_boundary_bytes(&m, seq, elem) / (1024.0 * 1024.0), model_params(&m) * 16.0 / (1024.0 * 1024.0 * 1024.0));
    return 0;
}

static int cmd_models(int argc, char **argv) {
    long seq = 0;
    precision prec = PREC_FP32;
    const char *name = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            puts("usage: cephalo models [MODEL [--seq S] [--precision fp32|bf16|fp16]]\n"
                 "  without MODEL: the built-in models; with one: its units, FLOPs and activation memory");
            return 0;
        } else if (!strcmp(argv[i], "--seq") && i + 1 < argc) {
            if (!str_to_long(argv[++i], &seq) || seq < 1 || seq > 1 << 20) return bad("--seq: '%s' is not a positive integer", argv[i]);
        } else if (!strcmp(argv[i], "--precision") && i + 1 < argc) {
            const char *p = argv[++i];
            if (!precision_parse(p, &prec)) return bad("--precision: '%s' (expected " PRECISION_CHOICES ")", p);
        } else if (argv[i][0] == '-' || name) {
            return bad("models: unexpected argument '%s'", argv[i]);
        } else {
            name = argv[i];
        }
    }
    return name ? cmd_model_detail(name, seq, prec) : cmd_models_list();
}

static int cmd_gpus(void) {
    int n;
    const gpu_spec *g = gpu_catalog(&n);
    /* a 0 tensor figure is printed as "-": the GPU has no such tensor cores */
    printf("%-14s %-8s %4s %8s %8s %8s %8s %8s %9s\n", "type", "arch", "cc", "mem GiB", "fp32 TF", "tf32 TF", "fp16 TF",
           "bf16 TF", "bw GB/s");
    for (int i = 0; i < n; i++) {
        char cc[8], rate[3][16];
        const double r[3] = {g[i].tf32_tflops, g[i].fp16_tflops, g[i].bf16_tflops};
        if (g[i].cc_major) snprintf(cc, sizeof cc, "%d.%d", g[i].cc_major, g[i].cc_minor);
        else snprintf(cc, sizeof cc, "-");
        for (int k = 0; k < 3; k++) {
            if (r[k] > 0) snprintf(rate[k], sizeof rate[k], "%.1f", r[k]);
            else snprintf(rate[k], sizeof rate[k], "-");
        }
        printf("%-14s %-8s %4s %8.1f %8.1f %8s %8s %8s %9.0f\n", g[i].name, g[i].arch, cc, g[i].memory_gib,
               g[i].fp32_tflops, rate[0], rate[1], rate[2], g[i].mem_bw_gbs);
    }
    return 0;
}

/* ---- cephalo data (docs/data.md) ---- */

static const char data_usage[] =
    "usage: cephalo data -o OUTDIR [--shard-tokens N] [--val-fraction F] FILE...\n"
    "       cephalo data --images -o FILE.cimg --synthetic N --classes K --size S [--channels C] [--seed X]\n"
    "\n"
    "Text files ('-' reads stdin) are tokenized byte-level (each byte is a token 0..255) into llm.c\n"
    "token shards OUTDIR/train_000000.bin, train_000001.bin, ... and, with --val-fraction,\n"
    "OUTDIR/val_000000.bin, ... holding the last fraction of the token stream (docs/data.md).\n"
    "\n"
    "  -o, --output PATH     output directory (created if missing); with --images the file\n"
    "  --shard-tokens N      tokens per shard (default 100M; suffixes K, M, G = 1e3, 1e6, 1e9)\n"
    "  --val-fraction F      fraction of the tokens for validation, in [0, 1) (default 0)\n"
    "  --images              write a synthetic labeled image file (CIMG) instead:\n"
    "  --synthetic N         number of images\n"
    "  --classes K           number of classes (1..65536)\n"
    "  --size S              image height and width in pixels\n"
    "  --channels C          channels (default 3)\n"
    "  --seed X              seed of the images (default 1)\n"
    "  -h, --help            this text\n"
    "\n"
    "exit status: 0 written, 2 bad input or a file that cannot be read or written\n";

/* Non-negative integer with an optional K/M/G suffix (powers of 1000). */
static bool parse_count(const char *s, long max, long *out) {
    char buf[32];
    size_t n = strlen(s);
    if (n == 0 || n >= sizeof buf) return false;
    memcpy(buf, s, n + 1);
    long mult = 1;
    switch (buf[n - 1]) {
    case 'k': case 'K': mult = 1000; break;
    case 'm': case 'M': mult = 1000000; break;
    case 'g': case 'G': mult = 1000000000; break;
    default: break;
    }
    if (mult > 1) buf[n - 1] = '\0';
    long v;
    if (buf[0] == '-' || buf[0] == '+' || !str_to_long(buf, &v) || v < 0 || v > max / mult) return false;
    *out = v * mult;
    return true;
}

typedef struct data_input {
    const char *name;
    FILE *f;      /* regular files: streamed */
    char *buf;    /* stdin and other non-regular files: read whole */
    size_t len;   /* bytes (for regular files: the size when opened) */
} data_input;

/* Splits the token stream over train shards and val shards. */
typedef struct shard_sink {
    const char *dir;
    long shard_tokens;
    int64_t n_train, written; /* tokens before the val split; tokens written so far */
    int cur;                  /* split of the open shard: 0 train, 1 val */
    int index[2];             /* shards started per split */
    data_shard_writer *w;
    char path[4096];
} shard_sink;

static int sink_close_shard(shard_sink *k, err_t *err) {
    if (!k->w) return 0;
    int rc = data_shard_writer_close(k->w, err);
    k->w = NULL;
    return rc;
}

static int sink_add(shard_sink *k, const uint16_t *tok, int64_t n, err_t *err) {
    while (n > 0) {
        int si = k->written < k->n_train ? 0 : 1;
        if (k->w && (k->cur != si || data_shard_writer_count(k->w) == k->shard_tokens) &&
            sink_close_shard(k, err) < 0)
            return -1;
        if (!k->w) {
            snprintf(k->path, sizeof k->path, "%s/%s_%06d.bin", k->dir, si ? "val" : "train", k->index[si]++);
            if (!(k->w = data_shard_writer_open(k->path, err))) return -1;
            k->cur = si;
        }
        int64_t room = k->shard_tokens - data_shard_writer_count(k->w);
        if (!si && k->n_train - k->written < room) room = k->n_train - k->written;
        int64_t m = n < room ? n : room;
        if (data_shard_writer_add(k->w, tok, m, err) < 0) return -1;
        tok += m;
        n -= m;
        k->written += m;
    }
    return 0;
}

static int sink_bytes(shard_sink *k, const unsigned char *p, size_t n, err_t *err) {
    uint16_t tok[4096];
    while (n > 0) {
        size_t m = n < 4096 ? n : 4096;
        for (size_t i = 0; i < m; i++) tok[i] = p[i];
        if (sink_add(k, tok, (int64_t)m, err) < 0) return -1;
        p += m;
        n -= m;
    }
    return 0;
}

static int data_fail(const char *msg) {
    fprintf(stderr, "cephalo data: %s\n", msg);
    return EXIT_BAD_INPUT;
}

static int open_inputs(char **names, int n, data_input *in, err_t *err) {
    for (int i = 0; i < n; i++) {
        in[i].name = names[i];
        bool is_stdin = !strcmp(names[i], "-");
        FILE *f = is_stdin ? stdin : fopen(names[i], "rb");
        if (!f) return err_set(err, "%s: cannot open: %s", names[i], strerror(errno));
        struct stat st;
        if (fstat(fileno(f), &st) != 0) {
            if (!is_stdin) fclose(f);
            return err_set(err, "%s: cannot stat: %s", names[i], strerror(errno));
        }
        if (S_ISDIR(st.st_mode)) {
            if (!is_stdin) fclose(f);
            return err_set(err, "%s: is a directory (expected a text file)", names[i]);
        }
        if (S_ISREG(st.st_mode) && !is_stdin) {
            in[i].f = f;
            in[i].len = (size_t)st.st_size;
            continue;
        }
        size_t cap = 1 << 16, len = 0, got;
        char *buf = malloc(cap);
        while (buf && (got = fread(buf + len, 1, cap - len, f)) > 0)
            if ((len += got) == cap) {
                char *nb = realloc(buf, cap *= 2);
                if (!nb) free(buf);
                buf = nb;
            }
        bool bad_read = !buf || ferror(f);
        if (!is_stdin) fclose(f);
        if (bad_read) {
            free(buf);
            return err_set(err, "%s: read error%s", names[i], buf ? "" : " (out of memory)");
        }
        in[i].buf = buf;
        in[i].len = len;
    }
    return 0;
}

static int write_input(shard_sink *k, data_input *in, err_t *err) {
    if (in->buf) return sink_bytes(k, (const unsigned char *)in->buf, in->len, err);
    unsigned char chunk[1 << 16];
    size_t total = 0, got;
    while ((got = fread(chunk, 1, sizeof chunk, in->f)) > 0) {
        if (total + got > in->len) got = in->len - total; /* grew while reading: the size counted */
        if (sink_bytes(k, chunk, got, err) < 0) return -1;
        total += got;
        if (total == in->len) break;
    }
    if (ferror(in->f)) return err_set(err, "%s: read error: %s", in->name, strerror(errno));
    if (total != in->len)
        return err_set(err, "%s: the file shrank while being read (%zu of %zu bytes)", in->name, total, in->len);
    return 0;
}


/* train_000000.bin, val_000012.bin, ...: the names data_text gives its shards (six digits or
 * more). */
static bool is_shard_name(const char *s) {
    const char *p = !strncmp(s, "train_", 6) ? s + 6 : !strncmp(s, "val_", 4) ? s + 4 : NULL;
    if (!p) return false;
    size_t digits = strspn(p, "0123456789");
    return digits >= 6 && !strcmp(p + digits, ".bin");
}

/* An input that is one of OUTDIR's shards would be replaced by this run's shards, or trained on
 * with them: refused, symbolic links into OUTDIR included. */
static int check_data_inputs(const char *outdir, char **files, int n_files, err_t *err) {
    for (int i = 0; i < n_files; i++) {
        char name[256];
        if (strcmp(files[i], "-") && file_in_dir(files[i], outdir, name, sizeof name) && is_shard_name(name))
            return err_set(err, "%s: this input is a shard of the output directory %s (%s), which this run "
                                "writes; read it from elsewhere or give another -o",
                           files[i], outdir, name);
    }
    return 0;
}

static int data_text(const char *outdir, long shard_tokens, double val_fraction, char **files, int n_files) {
    err_t err = {{0}};
    data_input *in = calloc((size_t)n_files, sizeof *in);
    shard_sink k = {.dir = outdir, .shard_tokens = shard_tokens};
    int rc = 0;
    if (!in) return data_fail("out of memory");
    if (check_data_inputs(outdir, files, n_files, &err) < 0 || open_inputs(files, n_files, in, &err) < 0) {
        rc = data_fail(err.msg);
        goto done;
    }
    int64_t total = 0;
    for (int i = 0; i < n_files; i++) total += (int64_t)in[i].len;
    int64_t n_val = 0;
    if (total == 0) {
        rc = data_fail("the input is empty: no tokens to write");
        goto done;
    }
    if (val_fraction > 0) {
        if (total < 2) {
            rc = data_fail("--val-fraction: the input has 1 token, too few to split");
            goto done;
        }
        n_val = (int64_t)((double)total * val_fraction + 0.5);
        if (n_val < 1) n_val = 1;
        if (n_val > total - 1) n_val = total - 1;
    }
    if (file_make_dir(outdir, false, &err) < 0) {
        rc = data_fail(err.msg);
        goto done;
    }
    k.n_train = total - n_val;
    for (int i = 0; i < n_files && !rc; i++)
        if (write_input(&k, &in[i], &err) < 0) rc = -1;
    if (!rc && sink_close_shard(&k, &err) < 0) rc = -1;
    if (rc) {
        if (k.w) data_shard_writer_abort(k.w);
        rc = data_fail(err.msg);
        goto done;
    }
    printf("cephalo data: %d file%s, %lld bytes -> %lld tokens (byte-level: tokens 0..255; any vocab >= 256, "
           ">= 257 for MLM)\n",
           n_files, n_files == 1 ? "" : "s", (long long)total, (long long)total);
    for (int si = 0; si < 2; si++) {
        const char *name = si ? "val" : "train";
        if (!k.index[si]) continue;
        printf("  %-6s %lld tokens in %d shard%s: %s/%s_000000.bin", si ? "val:" : "train:", (long long)(si ? n_val : k.n_train),
               k.index[si], k.index[si] == 1 ? "" : "s", outdir, name);
        if (k.index[si] > 1) printf(" .. %s_%06d.bin", name, k.index[si] - 1);
        putchar('\n');
    }
    if (n_val) printf("  train on '%s/train_*.bin' (the directory alone would include the val shards)\n", outdir);
    /* shards of an earlier, larger run would be picked up by a directory or glob spec */
    for (int si = 0; si < 2; si++) {
        char p[4096];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s_%06d.bin", outdir, si ? "val" : "train", k.index[si]);
        if (stat(p, &st) == 0)
            fprintf(stderr, "cephalo data: warning: %s and maybe more %s shards are left from an earlier run; "
                    "remove them before training on the directory\n", p, si ? "val" : "train");
    }
done:
    for (int i = 0; i < n_files; i++) {
        if (in[i].f) fclose(in[i].f);
        free(in[i].buf);
    }
    free(in);
    return rc;
}

static int data_images(const char *out, long count, long classes, long size, long channels, long seed) {
    err_t err = {{0}};
    data_image_info info = {.channels = (uint32_t)channels, .height = (uint32_t)size, .width = (uint32_t)size,
                            .n_classes = (uint32_t)classes};
    data_image_writer *w = data_image_writer_open(out, &info, &err);
    if (!w) return data_fail(err.msg);
    size_t px = (size_t)channels * (size_t)size * (size_t)size;
    uint8_t *pix = malloc(px);
    if (!pix) {
        data_image_writer_abort(w);
        return data_fail("out of memory");
    }
    int32_t label;
    for (long i = 0; i < count; i++) {
        data_synthetic_image((uint64_t)seed, i, (int)channels, (int)size, (int)classes, pix, &label);
        if (data_image_writer_add(w, (uint16_t)label, pix, &err) < 0) {
            free(pix);
            data_image_writer_abort(w);
            return data_fail(err.msg);
        }
    }
    free(pix);
    if (data_image_writer_close(w, &err) < 0) return data_fail(err.msg);
    printf("cephalo data: wrote %s: %ld synthetic images of %ldx%ldx%ld, %ld classes, seed %ld (%lld bytes)\n", out,
           count, channels, size, size, classes, seed, (long long)(DATA_CIMG_HEADER_BYTES + (long long)count * (2 + (long long)px)));
    return 0;
}

static int cmd_data(int argc, char **argv) {
    static const struct option longopts[] = {
        {"output", required_argument, 0, 'o'},    {"shard-tokens", required_argument, 0, 'T'},
        {"val-fraction", required_argument, 0, 'V'}, {"images", no_argument, 0, 'I'},
        {"synthetic", required_argument, 0, 'N'}, {"classes", required_argument, 0, 'K'},
        {"size", required_argument, 0, 'Z'},      {"channels", required_argument, 0, 'C'},
        {"seed", required_argument, 0, 'X'},      {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    const char *out = NULL;
    long shard_tokens = 100000000, count = -1, classes = -1, size = -1, channels = 3, seed = 1;
    double val = 0;
    bool images = false, text_opt = false, image_opt = false;
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":ho:", longopts, NULL)) != -1) {
        switch (c) {
        case 'o': out = optarg; break;
        case 'T':
            if (!parse_count(optarg, DATA_SHARD_MAX_TOKENS, &shard_tokens) || shard_tokens < 1)
                return bad("data: --shard-tokens: '%s' is not a token count in 1..2147483647 (K, M, G suffixes allowed)", optarg);
            text_opt = true;
            break;
        case 'V':
            if (!str_to_double(optarg, &val) || !(val >= 0 && val < 1))
                return bad("data: --val-fraction: '%s' (expected a fraction in [0, 1))", optarg);
            text_opt = true;
            break;
        case 'I': images = true; break;
        case 'N':
            if (!parse_count(optarg, UINT32_MAX, &count) || count < 1)
                return bad("data: --synthetic: '%s' is not an image count in 1..4294967295", optarg);
            image_opt = true;
            break;
        case 'K':
            if (!str_to_long(optarg, &classes) || classes < 1 || classes > DATA_CIMG_MAX_CLASSES)
                return bad("data: --classes: '%s' (expected 1..65536)", optarg);
            image_opt = true;
            break;
        case 'Z':
            if (!str_to_long(optarg, &size) || size < 1 || size > DATA_CIMG_MAX_SIDE)
                return bad("data: --size: '%s' (expected 1..65535 pixels)", optarg);
            image_opt = true;
            break;
        case 'C':
            if (!str_to_long(optarg, &channels) || channels < 1 || channels > DATA_CIMG_MAX_CHANNELS)
                return bad("data: --channels: '%s' (expected 1..16)", optarg);
            image_opt = true;
            break;
        case 'X':
            if (!str_to_long(optarg, &seed) || seed < 0) return bad("data: --seed: '%s' (expected an integer >= 0)", optarg);
            image_opt = true;
            break;
        case 'h': fputs(data_usage, stdout); return 0;
        case ':': return bad("data: option '%s' needs a value", argv[optind - 1]);
        default: return bad("data: unknown option '%s'", argv[optind - 1]);
        }
    }
    if (!out) return bad("%s", "data: -o OUTPUT is required");
    if (images) {
        if (text_opt) return bad("%s", "data: --shard-tokens and --val-fraction are for text, not --images");
        if (optind < argc) return bad("data: unexpected argument '%s' (--images writes synthetic images only)", argv[optind]);
        if (count < 0) return bad("%s", "data: --images needs --synthetic N (converting image files is not supported)");
        if (classes < 0) return bad("%s", "data: --images needs --classes K");
        if (size < 0) return bad("%s", "data: --images needs --size S");
        if ((uint64_t)channels * (uint64_t)size * (uint64_t)size > DATA_CIMG_MAX_PIXELS)
            return bad("%s", "data: --channels x --size x --size is too large for one image (at most 2^28 values)");
        return data_images(out, count, classes, size, channels, seed);
    }
    if (image_opt) return bad("%s", "data: --synthetic, --classes, --size, --channels and --seed need --images");
    if (optind >= argc) return bad("%s", "data: no input FILE (give text files, or '-' for stdin)");
    return data_text(out, shard_tokens, val, argv + optind, argc - optind);
}

/* ---- cephalo run (docs/run.md) ---- */

static const char run_usage[] =
    "usage: cephalo run JOB.yaml [--devices LIST] [--run-dir DIR] [--steps N] [--metrics-port BASE]\n"
    "                            [--overwrite] [--dry-run] [--quiet]\n"
    "\n"
    "Plans the job on the local devices and trains it: one cephalo-worker per device, all stopped\n"
    "together when one fails or on Ctrl-C. The job file is described in docs/run.md.\n"
    "\n"
    "  --devices LIST        replace the job's devices: TYPE[:Nt][:MEMORY][xCOUNT],... e.g.\n"
    "                        cpu:2t:512M,cpu:1t:256Mx2 (2 threads and 512 MiB, then two of 1 and 256)\n"
    "  --run-dir DIR         plan.json, rank-R.log, rank-R.jsonl, summary.json (default runs/NAME)\n"
    "  --steps N             total steps, instead of the job's\n"
    "  --metrics-port BASE   rank R serves /metrics on port BASE+R, 0 = off (the job's metrics_port)\n"
    "  --overwrite           start although the checkpoint directory holds checkpoints beyond the\n"
    "                        starting step (another run's): they are deleted (docs/checkpoints.md)\n"
    "  --dry-run             plan and print each worker's command line, start nothing\n"
    "  --quiet               no plan table and no progress lines\n"
    "  -h, --help            this text\n"
    "\n"
    "exit status: 0 done, 1 a worker failed, 2 bad input, 3 infeasible plan, 130 interrupted\n";

static int cmd_run(int argc, char **argv) {
    enum { O_DEVICES = 256, O_RUNDIR, O_STEPS, O_DRY, O_QUIET, O_MPORT, O_OVERWRITE };
    static const struct option longopts[] = {{"devices", required_argument, 0, O_DEVICES}, {"run-dir", required_argument, 0, O_RUNDIR},
                                             {"steps", required_argument, 0, O_STEPS},     {"dry-run", no_argument, 0, O_DRY},
                                             {"quiet", no_argument, 0, O_QUIET},           {"help", no_argument, 0, 'h'},
                                             {"metrics-port", required_argument, 0, O_MPORT},
                                             {"overwrite", no_argument, 0, O_OVERWRITE},
                                             {0, 0, 0, 0}};
    run_opts o = {0};
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        switch (c) {
        case O_DEVICES: o.devices = optarg; break;
        case O_RUNDIR: o.run_dir = optarg; break;
        case O_STEPS:
            if (!str_to_long(optarg, &o.steps) || o.steps < 1 || o.steps > 1L << 40)
                return bad("run: --steps: '%s' is not a positive integer", optarg);
            break;
        case O_DRY: o.dry_run = true; break;
        case O_QUIET: o.quiet = true; break;
        case O_OVERWRITE: o.overwrite = true; break;
        case O_MPORT:
            if (!str_to_long(optarg, &o.metrics_port) || o.metrics_port < 0 || o.metrics_port > 65535)
                return bad("run: --metrics-port: '%s' is not a port in 0..65535 (0 = off)", optarg);
            o.have_metrics_port = true;
            break;
        case 'h': fputs(run_usage, stdout); return 0;
        case ':': return bad("run: option '%s' needs a value", argv[optind - 1]);
        default: return bad("run: unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind >= argc) return bad("%s", "run: no job file (cephalo run JOB.yaml)");
    if (optind + 1 < argc) return bad("run: unexpected argument '%s'", argv[optind + 1]);
    o.job = argv[optind];
    return run_job(&o);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fputs(usage_text, stderr);
        return EXIT_BAD_INPUT;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        fputs(usage_text, stdout);
        return 0;
    }
    if (!strcmp(cmd, "plan")) return cmd_plan(argc - 1, argv + 1, false);
    if (!strcmp(cmd, "compare")) return cmd_plan(argc - 1, argv + 1, true);
    if (!strcmp(cmd, "models")) return cmd_models(argc - 1, argv + 1);
    if (!strcmp(cmd, "gpus")) return cmd_gpus();
    if (!strcmp(cmd, "data")) return cmd_data(argc - 1, argv + 1);
    if (!strcmp(cmd, "run")) return cmd_run(argc - 1, argv + 1);
    if (!strcmp(cmd, "profile")) return profile_main(argc - 1, argv + 1);
    fprintf(stderr, "cephalo: unknown command '%s' (expected plan, compare, models, gpus, data, run or profile; see 'cephalo --help')\n", cmd);
    return EXIT_BAD_INPUT;
}
