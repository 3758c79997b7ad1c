/* export.c - `cephalo-worker export`: a checkpoint as a Hugging Face model directory
 * (state/export.c does the work; docs/import.md). */
#include <stdbool.h>
#include <stdio.h>

#include "cmd/cmd.h"
#include "common/args.h"
#include "common/ckpt_dir.h"
#include "common/outputs.h"
#include "common/worker_cmd.h"
#include "state/export.h"

static const char usage[] =
    "usage: cephalo-worker export --checkpoint PATH -o DIR [--allow-unused-weights]\n"
    "Writes DIR/model.safetensors (Hugging Face tensor names) and DIR/config.json\n"
    "for GPT-2 (GPT2LMHeadModel) and Llama (LlamaForCausalLM) checkpoints.\n"
    "PATH: a checkpoint file (step_N.safetensors), a sharded step directory (step_N/),\n"
    "a checkpoint directory (--ckpt-dir: the one its `latest` names, else its newest\n"
    "complete one), or a --dump file (init.safetensors: the weights before step 0).\n"
    "  --allow-unused-weights  export although the checkpoint holds tensors its model does not\n"
    "                       use (a warning names them; without it they are an error)\n";

int cmd_export(int argc, char **argv) {
    static const struct option longopts[] = {{"checkpoint", 1, 0, 'c'}, {"output", 1, 0, 'o'},
                                             {"allow-unused-weights", 0, 0, 'u'}, {"help", 0, 0, 'h'},
                                             {0, 0, 0, 0}};
    const char *ckpt = NULL, *out = NULL;
    bool allow_unused = false;
    args p = args_begin(argc, argv, WORKER_NAME " export", longopts, "o:", usage);
    int ch;
    while ((ch = args_next(&p)) > 0)
        if (ch == 'u') allow_unused = true;
        else *(ch == 'c' ? &ckpt : &out) = p.val;
    if (ch < 0 || args_no_operands(&p)) return ARGS_BAD;
    if (!ckpt || !out) return args_bad(&p, "needs --checkpoint PATH and -o DIR");
    err_t err;
    out_set s = out_begin(WORKER_NAME " export");
    out_input_path(&s, "--checkpoint", ckpt, &ckpt_dir_kind);
    out_dir(&s, "-o", out, &out_hf_export);
    int rc = out_check(&s, &err);
    out_free(&s);
    if (rc < 0 || export_hf(ckpt, out, allow_unused, &err) < 0) {
        fprintf(stderr, WORKER_NAME " export: %s\n", err.msg);
        return WCMD_EXIT_BAD_INPUT;
    }
    printf("wrote %s/model.safetensors and %s/config.json\n", out, out);
    return WCMD_EXIT_OK;
}
