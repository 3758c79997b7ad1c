/* cli.c - the `cephalo` command: plan, compare, models, gpus.
 * Exit codes (DESIGN 5.1): 0 feasible, 3 infeasible (with the reason), 2 bad input. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster.h"
#include "cost.h"
#include "gpu.h"
#include "model.h"
#include "plan.h"
#include "profile.h"
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
    "\n"
    "plan / compare options:\n"
    "  --cluster FILE        cluster file (YAML, docs/formats.md)            [required]\n"
    "  --model MODEL         built-in model name or model file               [required]\n"
    "  --batch B             global batch (samples per iteration)            [required]\n"
    "  --seq S               sequence length (default: the model's)\n"
    "  --precision P         fp32 (default; TF32 tensor cores allowed) or bf16\n"
    "  --strategy S          cephalo (default), fsdp, whale, cb or mb        [plan]\n"
    "  --profile FILE        measured costs (cephalo profile); estimates otherwise\n"
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
    bool bf16, json;
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
            if (strcmp(optarg, "fp32") && strcmp(optarg, "bf16")) return bad("--precision: '%s' (expected fp32 or bf16)", optarg);
            o->bf16 = strcmp(optarg, "bf16") == 0;
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
typedef struct inputs {
    cluster cl;
    model_spec model;
    profile prof;
    bool have_prof;
    cost_model cm;
} inputs;

static int load_inputs(const cli_opts *o, inputs *in) {
    err_t err = {{0}};
    memset(in, 0, sizeof *in);
    if (cluster_load_file(o->cluster, &in->cl, &err) < 0 || model_resolve(o->model, &in->model, &err) < 0) {
        fprintf(stderr, "cephalo: %s\n", err.msg);
        return EXIT_BAD_INPUT;
    }
    if (o->profile) {
        if (profile_load_file(o->profile, &in->prof, &err) < 0) {
            fprintf(stderr, "cephalo: %s\n", err.msg);
            return EXIT_BAD_INPUT;
        }
        in->have_prof = true;
    }
    cost_opts co = {.bf16 = o->bf16, .mem_cap = o->mem_cap, .prof = in->have_prof ? &in->prof : NULL};
    if (cost_build(&in->cm, &in->model, &in->cl, (int)o->seq, (int)o->batch, &co, &err) < 0) {
        fprintf(stderr, "cephalo: %s\n", err.msg);
        return EXIT_BAD_INPUT;
    }
    if (in->have_prof)
        for (int g = 0; g < in->cm.n_groups; g++)
            if (!in->cm.groups[g].measured)
                fprintf(stderr, "cephalo: note: the profile has no entry for %s with %s, seq %d, %s; using estimates for it\n",
                        in->cm.groups[g].dev->type, in->model.name, in->cm.seq, o->bf16 ? "bf16" : "fp32");
    return 0;
}

static void free_inputs(inputs *in) {
    cost_free(&in->cm);
    cluster_free(&in->cl);
    if (in->have_prof) profile_free(&in->prof);
}

static int write_plan_file(const plan *p, const char *path) {
    err_t err;
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "cephalo: %s: cannot write\n", path);
        return EXIT_BAD_INPUT;
    }
    int rc = plan_write_json(p, f, &err);
    if (fclose(f) != 0 || rc < 0) {
        fprintf(stderr, "cephalo: %s: write error\n", path);
        return EXIT_BAD_INPUT;
    }
    return 0;
}

static int cmd_plan(int argc, char **argv, bool compare) {
    cli_opts o;
    int rc = parse_options(argc, argv, &o);
    if (rc) return rc;
    inputs in;
    if ((rc = load_inputs(&o, &in))) {
        free_inputs(&in);
        return rc;
    }
    err_t err;
    if (o.dump_costs && plan_dump_costs(&in.cm, o.dump_costs, &err) < 0) {
        fprintf(stderr, "cephalo: %s\n", err.msg);
        free_inputs(&in);
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
    free_inputs(&in);
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
static int cmd_model_detail(const char *name, long seq_opt, bool bf16) {
    model_spec m;
    err_t err;
    int seq;
    if (model_resolve(name, &m, &err) < 0 || model_check_seq(&m, (int)seq_opt, &seq, &err) < 0) {
        fprintf(stderr, "cephalo: %s\n", err.msg);
        return EXIT_BAD_INPUT;
    }
    int elem = bf16 ? 2 : 4, t = model_tokens(&m, seq);
    printf("%s: %s, %d layers, d_model %d, %d heads (%d kv), d_ff %d, %lld parameters\n", m.name, model_arch_name(m.arch),
           m.n_layer, m.d_model, m.n_head, m.n_kv_head, m.d_ff, (long long)model_params(&m));
    printf("per sample at %d tokens, %s activations; FSDP units:\n", t, bf16 ? "bf16" : "fp32");
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
    bool bf16 = false;
    const char *name = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            puts("usage: cephalo models [MODEL [--seq S] [--precision fp32|bf16]]\n"
                 "  without MODEL: the built-in models; with one: its units, FLOPs and activation memory");
            return 0;
        } else if (!strcmp(argv[i], "--seq") && i + 1 < argc) {
            if (!str_to_long(argv[++i], &seq) || seq < 1 || seq > 1 << 20) return bad("--seq: '%s' is not a positive integer", argv[i]);
        } else if (!strcmp(argv[i], "--precision") && i + 1 < argc) {
            const char *p = argv[++i];
            if (strcmp(p, "fp32") && strcmp(p, "bf16")) return bad("--precision: '%s' (expected fp32 or bf16)", p);
            bf16 = !strcmp(p, "bf16");
        } else if (argv[i][0] == '-' || name) {
            return bad("models: unexpected argument '%s'", argv[i]);
        } else {
            name = argv[i];
        }
    }
    return name ? cmd_model_detail(name, seq, bf16) : cmd_models_list();
}

static int cmd_gpus(void) {
    int n;
    const gpu_spec *g = gpu_catalog(&n);
    printf("%-14s %-10s %8s %8s %8s %8s %9s\n", "type", "arch", "mem GiB", "fp32 TF", "tf32 TF", "bf16 TF", "bw GB/s");
    for (int i = 0; i < n; i++)
        printf("%-14s %-10s %8.1f %8.1f %8.1f %8.1f %9.0f\n", g[i].name, g[i].arch, g[i].memory_gib, g[i].fp32_tflops,
               g[i].tf32_tflops, g[i].bf16_tflops, g[i].mem_bw_gbs);
    return 0;
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
    fprintf(stderr, "cephalo: unknown command '%s' (expected plan, compare, models or gpus; see 'cephalo --help')\n", cmd);
    return EXIT_BAD_INPUT;
}
