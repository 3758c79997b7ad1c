/* main.c - the `cephalo` command: plan, compare, models, gpus, data, run (run.c does the running),
 * profile, report (report.c). Exit codes (docs/cli.md): 0 feasible, 3 infeasible (with the reason), 2 bad input; `run`
 * adds 1 (a worker failed) and 130 (interrupted). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/data_cmd.h"
#include "cli/profile_cmd.h"
#include "cli/report.h"
#include "cli/run.h"
#include "common/args.h"
#include "common/env.h"
#include "common/fileio.h"
#include "common/outputs.h"
#include "common/strutil.h"
#include "common/version.h"
#include "common/worker_cmd.h"
#include "planner/cluster.h"
#include "planner/cost.h"
#include "planner/gpu.h"
#include "planner/inputs.h"
#include "planner/model.h"
#include "planner/plan.h"
#include "planner/profile_store.h"


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
    "  report    one self-contained HTML page of a run directory: loss curves, samples/s\n"
    "            per rank, measured against predicted step time and memory, the plan;\n"
    "            `cephalo report --help` (docs/report.md)\n"
    "  version   the release and commit this binary was built from (also --version; --json)\n"
    "  --help-env  the CEPHALO_* environment variables, their values and defaults\n"
    "            (docs/environment.md)\n"
    "\n"
    "plan / compare options:\n"
    "  --cluster FILE        cluster file (YAML, docs/formats.md)            [required]\n"
    "  --model MODEL         built-in model name, model file (YAML), or a Hugging Face\n"
    "                        config.json or its directory (docs/import.md)   [required]\n"
    "  --batch B             global batch (samples per iteration)            [required]\n"
    "  --seq S               sequence length (default: the model's)\n"
    "  --precision P         fp32 (default; TF32 tensor cores allowed), bf16 (compute\n"
    "                        capability 8.0+) or fp16 (tensor cores from 7.0; Pascal runs\n"
    "                        it at its fp32 rate, with 2-byte parameter gathers)\n"
    "  --strategy S          cephalo (default), fsdp, whale, cb or mb        [plan]\n"
    "  --profile FILE        measured costs (cephalo profile); default: the profile store\n"
    "                        when it has the model, else estimates (docs/profile.md)\n"
    "  --mem-cap F           usable fraction of device memory (default " STR_OF(INPUTS_MEM_CAP) ")\n"
    "  --host-memory SIZE    host memory of each worker (e.g. its pod's memory limit): the\n"
    "                        host offload pool grows with a rank's batch, and at most the\n"
    "                        --mem-cap fraction of SIZE may hold it (512M, 16G; default:\n"
    "                        not bounded)\n"
    "  --recompute R         auto (default: each device keeps its activations where they\n"
    "                        fit and it is faster, else recomputes), none or full for all\n"
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
    double mem_cap, host_bytes;
    strategy strat;
    recompute_policy recompute;
} cli_opts;

static int plan_option(args *p, int ch, cli_opts *o) {
    err_t err;
    const char *v;
    switch (ch) {
    case 'c': o->cluster = p->val; break;
    case 'm': o->model = p->val; break;
    case 'P': o->profile = p->val; break;
    case 'o': o->output = p->val; break;
    case 'D': o->dump_costs = p->val; break;
    case 'b': return args_long(p, 1, COST_MAX_BATCH, &o->batch);
    case 's': return args_long(p, 1, 1 << 20, &o->seq);
    case 'p': return args_choice(p, precision_names, &v) ? ARGS_BAD : (precision_parse(v, &o->prec), 0);
    case 'M':
        if (!str_to_double(p->val, &o->mem_cap) || !(o->mem_cap > 0 && o->mem_cap <= 1))
            return args_bad(p, "--mem-cap: '%s' (expected a fraction in (0, 1])", p->val);
        break;
    case 'H': {
        int64_t bytes;
        if (!str_to_size(p->val, &bytes) || bytes <= 0)
            return args_bad(p, "--host-memory: '%s' (expected a size such as 512M or 16G)", p->val);
        o->host_bytes = (double)bytes;
        break;
    }
    case 'R':
        return args_choice(p, (const char *const[]){"auto", "none", "full", NULL}, &v) ? ARGS_BAD
                                                                                       : (recompute_policy_parse(v, &o->recompute), 0);
    case 'f':
        if (args_choice(p, (const char *const[]){"table", "json", NULL}, &v)) return ARGS_BAD;
        o->json = strcmp(v, "json") == 0;
        break;
    case 'S':
        if (strategy_parse(p->val, &o->strat, &err) < 0) return args_bad(p, "--strategy: %s", err.msg);
        break;
    }
    return 0;
}

static int parse_options(int argc, char **argv, bool compare, cli_opts *o) {
    static const struct option longopts[] = {
        {"cluster", required_argument, 0, 'c'}, {"model", required_argument, 0, 'm'},
        {"batch", required_argument, 0, 'b'},   {"seq", required_argument, 0, 's'},
        {"precision", required_argument, 0, 'p'}, {"strategy", required_argument, 0, 'S'},
        {"profile", required_argument, 0, 'P'}, {"mem-cap", required_argument, 0, 'M'},
        {"format", required_argument, 0, 'f'},  {"output", required_argument, 0, 'o'},
        {"dump-costs", required_argument, 0, 'D'}, {"recompute", required_argument, 0, 'R'},
        {"host-memory", required_argument, 0, 'H'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    *o = (cli_opts){.mem_cap = INPUTS_MEM_CAP, .strat = STRAT_CEPHALO};
    args p = args_begin(argc, argv, "cephalo", longopts, "o:", usage_text);
    int ch = 0, rc = 0;
    while (!rc && (ch = args_next(&p)) > 0) rc = plan_option(&p, ch, o);
    if (rc || ch < 0 || args_no_operands(&p)) return ARGS_BAD;
    if (!o->cluster) return args_bad(&p, "--cluster FILE is required");
    if (!o->model) return args_bad(&p, "--model MODEL is required");
    if (!o->batch) return args_bad(&p, "--batch B is required");
    const args_only only[] = {{'o', !compare, "cephalo plan (compare writes no plan file)", ARGS_LEAVE_OUT},
                              {'S', !compare, "cephalo plan (compare plans every strategy)", ARGS_LEAVE_OUT}};
    return args_check_only(&p, only, 2);
}

/* Loads everything a plan needs; prints the error and returns EXIT_BAD_INPUT on failure. */
static int load_inputs(const cli_opts *o, plan_inputs *in) {
    err_t err = {{0}};
    memset(in, 0, sizeof *in);
    inputs_opts io = {.profile = o->profile, .seq = o->seq, .batch = o->batch, .prec = o->prec, .mem_cap = o->mem_cap,
                      .recompute = o->recompute, .host_bytes = o->host_bytes};
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
    err_t err;
    bool use_store = !o->profile && profile_store_path(store, sizeof store, &err) > 0; /* else planning warns */
    out_set s = out_begin("cephalo plan");
    out_input(&s, "--cluster", o->cluster);
    out_input_path(&s, "--model", o->model, &out_hf_input);
    out_input(&s, "--profile", o->profile);
    out_input(&s, "the profile store", use_store ? store : NULL);
    out_file(&s, "-o", o->output);
    out_file(&s, "--dump-costs", o->dump_costs);
    int rc = out_check(&s, &err);
    out_free(&s);
    if (rc == 0) return 0;
    fprintf(stderr, "cephalo: %s\n", err.msg);
    return EXIT_BAD_INPUT;
}

static int cmd_plan(int argc, char **argv, bool compare) {
    cli_opts o;
    int rc = parse_options(argc, argv, compare, &o);
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
    static const struct option opts[] = {{"seq", required_argument, 0, 's'}, {"precision", required_argument, 0, 'p'},
                                         {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    args p = args_begin(argc, argv, "cephalo models", opts, "",
                        "usage: cephalo models [MODEL [--seq S] [--precision fp32|bf16|fp16]]\n"
                        "  without MODEL: the built-in models; with one: its units, FLOPs and activation memory\n");
    long seq = 0;
    precision prec = wcmd_default_precision();
    const char *v;
    int ch, rc = 0;
    while (!rc && (ch = args_next(&p)) > 0) {
        if (ch == 's') rc = args_long(&p, 1, 1 << 20, &seq);
        else rc = args_choice(&p, precision_names, &v) ? ARGS_BAD : (precision_parse(v, &prec), 0);
    }
    if (rc || ch < 0) return ARGS_BAD;
    char **names;
    int n = args_operands(&p, &names);
    if (n > 1) return args_bad(&p, "unexpected argument '%s'", names[1]);
    const char *detail = "a MODEL (the list shows no figures that depend on it)";
    const args_only only[] = {{'s', n == 1, detail, ARGS_LEAVE_OUT}, {'p', n == 1, detail, ARGS_LEAVE_OUT}};
    if (args_check_only(&p, only, 2)) return ARGS_BAD;
    return n ? cmd_model_detail(names[0], seq, prec) : cmd_models_list();
}

static int cmd_gpus(int argc, char **argv) {
    static const struct option opts[] = {{"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    args p = args_begin(argc, argv, "cephalo gpus", opts, "",
                        "usage: cephalo gpus\n  the GPU catalog: memory, peak TFLOPS by precision, memory bandwidth\n");
    /* no options: one given is refused rather than ignored (--json would get a table) */
    if (args_next(&p) != 0 || args_no_operands(&p)) return ARGS_BAD;
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

/* ---- cephalo run (docs/run.md) ---- */

static const char run_usage[] =
    "usage: cephalo run JOB.yaml [--devices LIST] [--run-dir DIR] [--steps N] [--metrics-port BASE]\n"
    "                            [--overwrite] [--dry-run] [--quiet] [--no-profile]\n"
    "\n"
    "Plans the job on the local devices and trains it: one cephalo-worker per device, all stopped\n"
    "together when one fails or on Ctrl-C. The job file is described in docs/run.md. Unless the job\n"
    "names a profile, the devices are profiled for the model first (a few seconds, once: cached by\n"
    "device signature and model in $CEPHALO_PROFILE_CACHE, else ~/.cache/cephalo/profiles).\n"
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
    "  --no-profile          plan from the profile store or the estimates, profiling nothing\n"
    "  -h, --help            this text\n"
    "\n"
    "exit status: 0 done, 1 a worker failed, 2 bad input, 3 infeasible plan, 130 interrupted\n";

enum { O_DEVICES = 256, O_RUNDIR, O_STEPS, O_DRY, O_QUIET, O_MPORT, O_OVERWRITE, O_NOPROF };

static int run_option(args *p, int ch, run_opts *o) {
    switch (ch) {
    case O_DEVICES: o->devices = p->val; break;
    case O_RUNDIR: o->run_dir = p->val; break;
    case O_STEPS: return args_long(p, 1, 1L << 40, &o->steps);
    case O_DRY: o->dry_run = true; break;
    case O_QUIET: o->quiet = true; break;
    case O_OVERWRITE: o->overwrite = true; break;
    case O_NOPROF: o->no_profile = true; break;
    case O_MPORT: return o->have_metrics_port = true, args_long(p, 0, 65535, &o->metrics_port);
    }
    return 0;
}

static int cmd_run(int argc, char **argv) {
    static const struct option longopts[] = {{"devices", required_argument, 0, O_DEVICES}, {"run-dir", required_argument, 0, O_RUNDIR},
                                             {"steps", required_argument, 0, O_STEPS},     {"dry-run", no_argument, 0, O_DRY},
                                             {"quiet", no_argument, 0, O_QUIET},           {"help", no_argument, 0, 'h'},
                                             {"metrics-port", required_argument, 0, O_MPORT},
                                             {"overwrite", no_argument, 0, O_OVERWRITE},
                                             {"no-profile", no_argument, 0, O_NOPROF},
                                             {0, 0, 0, 0}};
    run_opts o = {0};
    args p = args_begin(argc, argv, "cephalo run", longopts, "", run_usage);
    int ch = 0, rc = 0;
    while (!rc && (ch = args_next(&p)) > 0) rc = run_option(&p, ch, &o);
    if (rc || ch < 0) return ARGS_BAD;
    char **rest;
    int n = args_operands(&p, &rest);
    if (n == 0) return args_bad(&p, "no job file (cephalo run JOB.yaml)");
    if (n > 1) return args_bad(&p, "unexpected argument '%s'", rest[1]);
    o.job = rest[0];
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
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) return cephalo_version_cmd("cephalo", argc - 1, argv + 1);
    if (!strcmp(cmd, "--help-env")) return env_help_cmd("cephalo", argc - 1, argv + 1);
    /* every CEPHALO_* variable, before any command reads one or starts a worker with it */
    int rc = env_entry("cephalo");
    if (rc) return rc;
    if (!strcmp(cmd, "plan")) return cmd_plan(argc - 1, argv + 1, false);
    if (!strcmp(cmd, "compare")) return cmd_plan(argc - 1, argv + 1, true);
    if (!strcmp(cmd, "models")) return cmd_models(argc - 1, argv + 1);
    if (!strcmp(cmd, "gpus")) return cmd_gpus(argc - 1, argv + 1);
    if (!strcmp(cmd, "data")) return data_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "run")) return cmd_run(argc - 1, argv + 1);
    if (!strcmp(cmd, "profile")) return profile_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "report")) return report_main(argc - 1, argv + 1);
    return args_bad_cmd("cephalo", "unknown command '%s' (expected plan, compare, models, gpus, data, run, profile, report or version)", cmd);
}
