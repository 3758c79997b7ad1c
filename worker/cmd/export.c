/* export.c - `cephalo-worker export`: a checkpoint as a Hugging Face model directory
 * (state/export.c does the work; docs/import.md). */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "cmd/cmd.h"
#include "common/args.h"
#include "common/ckpt_dir.h"
#include "common/outputs.h"
#include "common/worker_cmd.h"
#include "state/export.h"

static const char usage[] =
    "usage: cephalo-worker export --checkpoint PATH -o DIR [--dtype float32|bfloat16|float16]\n"
    "                             [--tokenizer tokenizer.json] [--allow-unused-weights]\n"
    "Writes a directory transformers loads as it is (docs/import.md): DIR/model.safetensors\n"
    "(Hugging Face tensor names), config.json and generation_config.json for GPT-2\n"
    "(GPT2LMHeadModel) and Llama (LlamaForCausalLM) checkpoints, and with the model's\n"
    "tokenizer tokenizer.json, tokenizer_config.json and special_tokens_map.json.\n"
    "PATH: a checkpoint file (step_N.safetensors), a sharded step directory (step_N/),\n"
    "a checkpoint directory (--ckpt-dir: the one its `latest` names, else its newest\n"
    "complete one), or a --dump file (init.safetensors: the weights before step 0).\n"
    "  --dtype D            the tensors' type: float32 (default; exact), bfloat16 or float16\n"
    "  --tokenizer FILE     the tokenizer.json to export (default: the one kept beside the\n"
    "                       checkpoint; one that is not the checkpoint's own is refused)\n"
    "  --allow-unused-weights  export although the checkpoint holds tensors its model does not\n"
    "                       use (a warning names them; without it they are an error)\n";

static int parse_dtype(args *p, st_dtype *d) {
    if (!strcmp(p->val, "float32")) *d = ST_F32;
    else if (!strcmp(p->val, "bfloat16")) *d = ST_BF16;
    else if (!strcmp(p->val, "float16")) *d = ST_F16;
    else return args_bad(p, "--dtype %s: expected float32, bfloat16 or float16", p->val);
    return 0;
}

int cmd_export(int argc, char **argv) {
    static const struct option longopts[] = {{"checkpoint", 1, 0, 'c'}, {"output", 1, 0, 'o'},
                                             {"dtype", 1, 0, 'd'},      {"tokenizer", 1, 0, 't'},
                                             {"allow-unused-weights", 0, 0, 'u'}, {"help", 0, 0, 'h'},
                                             {0, 0, 0, 0}};
    const char *ckpt = NULL, *out = NULL;
    export_opts o = {.dtype = ST_F32};
    args p = args_begin(argc, argv, WORKER_NAME " export", longopts, "o:", usage);
    int ch, rc = 0;
    while (!rc && (ch = args_next(&p)) > 0)
        if (ch == 'u') o.allow_unused = true;
        else if (ch == 'd') rc = parse_dtype(&p, &o.dtype);
        else if (ch == 't') o.tokenizer = p.val;
        else *(ch == 'c' ? &ckpt : &out) = p.val;
    if (rc || ch < 0 || args_no_operands(&p)) return ARGS_BAD;
    if (!ckpt || !out) return args_bad(&p, "needs --checkpoint PATH and -o DIR");
    err_t err;
    out_set s = out_begin(WORKER_NAME " export");
    out_input_path(&s, "--checkpoint", ckpt, &ckpt_dir_kind);
    out_input(&s, "--tokenizer", o.tokenizer);
    out_dir(&s, "-o", out, &out_hf_export);
    rc = out_check(&s, &err);
    out_free(&s);
    bool no_tok = true;
    if (rc < 0 || export_hf(ckpt, out, &o, &no_tok, &err) < 0) {
        fprintf(stderr, WORKER_NAME " export: %s\n", err.msg);
        return EXIT_BAD_INPUT;
    }
    printf("wrote %s: model.safetensors (%s), config.json, generation_config.json%s\n", out,
           o.dtype == ST_BF16 ? "bfloat16" : o.dtype == ST_F16 ? "float16" : "float32",
           no_tok ? "" : ", tokenizer.json, tokenizer_config.json, special_tokens_map.json");
    if (no_tok)
        fprintf(stderr, WORKER_NAME " export: no tokenizer.json beside the checkpoint (nor --tokenizer): the export "
                        "has no tokenizer and no special-token ids\n");
    return EXIT_OK;
}
