/* main.c - cephalo-worker: dispatches to a subcommand (cmd.h), one file each in worker/cmd/.
 *
 *   cephalo-worker train [--plan PLAN.json | --model M --batch B [--microbatch m]] [options]
 *   cephalo-worker export --checkpoint PATH -o DIR
 *   cephalo-worker eval (--checkpoint PATH | --init-from DIR) --data SPEC
 *   cephalo-worker sample (--checkpoint PATH | --init-from DIR) --prompt TEXT
 *   cephalo-worker profile ..., profile-comm ..., --version, --help-env */
#include <stdio.h>
#include <string.h>

#include "cmd/cmd.h"
#include "common/args.h"
#include "common/env.h"
#include "common/version.h"

const char *const cmd_devices[] = {"cpu", "cuda", NULL};

static const char usage_text[] =
    "usage: cephalo-worker train [--plan PLAN.json | --model MODEL --batch B [--microbatch M]]\n"
    "                            [options]\n"
    "       cephalo-worker export --checkpoint PATH -o DIR\n"
    "       cephalo-worker eval (--checkpoint PATH | --init-from DIR) --data SPEC [--samples N] [--json]\n"
    "       cephalo-worker sample (--checkpoint PATH | --init-from DIR) [--prompt TEXT] [--tokenizer FILE]\n"
    "                             [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S]\n"
    "       cephalo-worker profile --model M [--seq T] [--precision P] [--device cpu|cuda] [--threads N]\n"
    "                              [--memory SIZE] [--max-micro K] [--name TYPE] -o FILE\n"
    "       cephalo-worker profile-comm [--min-bytes N] [--max-bytes N] [--reps N] -o FILE\n"
    "       cephalo-worker --version [--json]\n"
    "       cephalo-worker --help-env    (the CEPHALO_* environment variables: docs/environment.md)\n"
    "\n"
    "train: trains one rank of a job (see 'cephalo-worker train --help').\n"
    "export: writes a checkpoint as Hugging Face model.safetensors + config.json (GPT-2, Llama).\n"
    "eval: the validation loss of a checkpoint (see 'cephalo-worker eval --help').\n"
    "sample: text from a checkpoint or a Hugging Face model (see 'cephalo-worker sample --help').\n"
    "profile, profile-comm: what `cephalo profile` runs (docs/profile.md).\n";

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
} commands[] = {
    {"train", cmd_train},     {"export", cmd_export},   {"sample", cmd_sample},
    {"eval", cmd_eval},       {"profile", cmd_profile}, {"profile-comm", cmd_profile_comm},
};

int main(int argc, char **argv) {
    if (argc < 2) {
        fputs(usage_text, stderr);
        return ARGS_BAD;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        fputs(usage_text, stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) return cephalo_version_cmd(WORKER_NAME, argc - 1, argv + 1);
    if (!strcmp(argv[1], "--help-env")) return env_help_cmd(WORKER_NAME, argc - 1, argv + 1);
    /* started by an operator of another release, it would misread the plan and flags it is given
     * (and perhaps the environment: this first) */
    char why[600];
    if (cephalo_check_operator_version(WORKER_NAME, why, sizeof why) < 0) {
        fprintf(stderr, WORKER_NAME ": %s\n", why);
        return ARGS_BAD;
    }
    /* every CEPHALO_* variable, before a subcommand reads one: the planner refuses the same values */
    int rc = env_entry(WORKER_NAME);
    if (rc) return rc;
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    return args_bad_cmd(WORKER_NAME, "unknown command '%s' (commands: train, export, eval, sample, profile, profile-comm)",
                        argv[1]);
}
