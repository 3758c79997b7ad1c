/* eval.c - `cephalo-worker eval`: the validation loss of a checkpoint or a Hugging Face model,
 * in one process or over every rank of a plan. The evaluation itself is model/eval.c's, the one
 * training runs with --val-data; this file finds the model, its plan and its weights. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cmd/cmd.h"
#include "common/args.h"
#include "common/ckpt_dir.h"
#include "common/env.h"
#include "common/fileio.h"
#include "common/json_util.h"
#include "common/log.h"
#include "common/strutil.h"
#include "common/worker_cmd.h"
#include "model/eval.h"
#include "planner/arch.h"
#include "state/ckpt.h"
#include "state/ckpt_resume.h"
#include "state/mtok.h"
#include "state/plan_read.h"

typedef struct eval_cmd {
    const char *checkpoint, *init_from, *device, *plan;
    char resolved[4400]; /* the checkpoint --checkpoint names (ckpt_dir_resolve): read once, by all */
    tok_id recorded;     /* the tokenizer the checkpoint records (its metadata cephalo.tokenizer) */
    long samples, seq, micro, threads, gpu;
    bool json, have_prec, allow_unused;
    precision prec;
    eval_opts val;
} eval_cmd;

static const char eval_usage[] =
    "usage: cephalo-worker eval (--checkpoint PATH | --init-from DIR) --data SPEC [options]\n"
    "The validation loss (mean cross-entropy per target) and perplexity of a model on the fixed\n"
    "validation samples that training's --val-data uses (docs/worker.md, \"Validation\"). One\n"
    "process, or every rank of a plan (--plan or $CEPHALO_PLAN, with $RANK and $WORLD_SIZE as for\n"
    "train: the ranks share the samples; rank 0 prints).\n"
    "  --checkpoint PATH    a checkpoint file, a sharded step directory, a checkpoint directory\n"
    "                       (its newest complete checkpoint) or DIR/latest\n"
    "  --init-from DIR      instead: a Hugging Face model directory (docs/import.md)\n"
    "  --allow-unused-weights  load files that hold tensors the model does not use (a warning\n"
    "                       names them; without it they are an error)\n"
    "  --data SPEC          validation token shards (file, directory, glob, comma list), a CIMG\n"
    "                       file for ViT, or 'synthetic'\n"
    "  --samples N          validation samples (default 64; at most the windows SPEC holds)\n"
    "  --plan PLAN.json     the ranks' shares, microbatches and shards (default: $CEPHALO_PLAN)\n"
    "  --seq T              sequence length (default: the plan's, else the checkpoint's training seq,\n"
    "                       else the model's)\n"
    "  --microbatch M       samples per forward (default 8; with a plan, the plan's)\n"
    "  --precision P        " PRECISION_CHOICES " (default: the checkpoint's, else fp32)\n"
    "  --device cpu|cuda    the device (default cpu); --gpu N, --threads N\n"
    "  --json               one JSON object on stdout instead of the text line\n";

enum { O_CKPT = 256, O_INIT, O_DATA, O_SAMPLES, O_SEQ, O_MICRO, O_PREC, O_DEVICE, O_GPU, O_THREADS, O_JSON, O_PLAN, O_UNUSED };

static int eval_option(args *p, int ch, eval_cmd *o) {
    const char *prec;
    switch (ch) {
    case O_CKPT: o->checkpoint = p->val; break;
    case O_INIT: return args_dir(p, &o->init_from);
    case O_DATA: o->val.data = p->val; break;
    case O_SAMPLES: return args_long(p, 1, 1L << 30, &o->samples);
    case O_SEQ: return args_long(p, 1, 1 << 20, &o->seq);
    case O_MICRO: return args_long(p, 1, 1 << 20, &o->micro);
    case O_THREADS: return args_long(p, 1, 4096, &o->threads);
    case O_GPU: return args_long(p, 0, 1023, &o->gpu);
    case O_PREC:
        o->have_prec = true;
        return args_choice(p, precision_names, &prec) ? ARGS_BAD : (precision_parse(prec, &o->prec), 0);
    case O_DEVICE: return args_choice(p, cmd_devices, &o->device);
    case O_JSON: o->json = true; break;
    case O_PLAN: o->plan = p->val; break;
    case O_UNUSED: o->allow_unused = true; break;
    }
    return 0;
}

static int parse_eval(int argc, char **argv, eval_cmd *o) {
    static const struct option longopts[] = {
        {"checkpoint", 1, 0, O_CKPT}, {"init-from", 1, 0, O_INIT}, {"data", 1, 0, O_DATA},
        {"samples", 1, 0, O_SAMPLES}, {"seq", 1, 0, O_SEQ},        {"microbatch", 1, 0, O_MICRO},
        {"precision", 1, 0, O_PREC},  {"device", 1, 0, O_DEVICE},  {"gpu", 1, 0, O_GPU},
        {"threads", 1, 0, O_THREADS}, {"json", 0, 0, O_JSON},      {"plan", 1, 0, O_PLAN},
        {"allow-unused-weights", 0, 0, O_UNUSED}, {"help", 0, 0, 'h'},
        {0, 0, 0, 0}};
    args p = args_begin(argc, argv, WORKER_NAME " eval", longopts, "", eval_usage);
    int ch = 0, rc = 0;
    while (!rc && (ch = args_next(&p)) > 0) rc = eval_option(&p, ch, o);
    if (rc || ch < 0 || args_no_operands(&p)) return ARGS_BAD;
    if (!o->checkpoint == !o->init_from) return args_bad(&p, "give --checkpoint PATH or --init-from DIR (one of them)");
    if (!o->val.data) return args_bad(&p, "--data: give the validation data (token shards, a CIMG file or 'synthetic')");
    if (!o->plan) env_text("CEPHALO_PLAN", &o->plan, NULL); /* NULL when unset or empty; checked at start */
    if (o->plan && (o->seq || o->micro)) return args_bad(&p, "--seq and --microbatch come from the plan; give one or the other");
    const args_only only[] = {{O_GPU, o->device && !strcmp(o->device, "cuda"), "--device cuda", ARGS_LEAVE_OUT}};
    return args_check_only(&p, only, 1);
}

/* Validation shards of another tokenizer than the model's (state/mtok.h) are refused. */
static int check_tokenizer(const eval_cmd *o, const evaluator *ev, err_t *err) {
    mtok model;
    const char *shard = NULL;
    if (mtok_for_model(o->init_from, o->resolved, o->recorded, &model, err) < 0) return -1;
    tok_id data = data_tokenizer(eval_source(ev), &shard);
    return mtok_check_data(&model, o->init_from ? "--init-from" : "the checkpoint's", data, shard, err);
}

/* The file whose metadata describes the checkpoint at PATH (resolved): the file, or a step
 * directory's rank 0 file. */
static int first_piece(const char *path, char *out, size_t n, err_t *err) {
    char name[64] = "";
    if (file_is_dir(path)) ckpt_shard_name(0, name, sizeof name);
    return str_fmt(out, n, err, "checkpoint path", "%s%s%s", path, *name ? "/" : "", name);
}

/* The checkpoint's model, its tokenizer, and its training seq and precision (metadata
 * "cephalo.train"). */
static int checkpoint_model(const char *path, model_spec *m, tok_id *tk, int *seq, precision *prec, err_t *err) {
    char file[PATH_MAX];
    st_file *f;
    if (first_piece(path, file, sizeof file, err) < 0 || st_open(&f, file, err) < 0) return -1;
    int rc = ckpt_read_model(f, m, err);
    if (rc == 0) rc = ckpt_read_tokenizer(f, tk, err);
    const char *train = st_meta(f, "cephalo.train");
    cJSON *o = rc == 0 && train ? json_parse(st_label(f), train, strlen(train), err) : NULL;
    if (train && !o) rc = -1;
    const cJSON *s = json_get(o, "seq"), *p = json_get(o, "precision");
    if (cJSON_IsNumber(s)) *seq = s->valueint;
    if (cJSON_IsString(p)) precision_parse(p->valuestring, prec);
    cJSON_Delete(o);
    st_close(f);
    return rc;
}

/* $RANK and $WORLD_SIZE (default 0 of 1), as train reads them. */
static int rank_var(const char *name, long dflt, long lo, long *out, err_t *err) {
    const char *s = getenv(name);
    *out = dflt;
    if (s && *s && (!str_to_long(s, out) || *out < lo || *out > (1 << 20)))
        return err_set(err, "$%s is '%s', expected an integer in [%ld, %d]", name, s, lo, 1 << 20);
    return 0;
}

/* Every rank's share of the samples and its microbatches from the plan (the model must be the
 * checkpoint's: loading says so otherwise); else one process. */
static int eval_config(eval_cmd *o, train_config *c, err_t *err) {
    int seq = 0;
    precision prec = wcmd_default_precision();
    long rank, world;
    train_config_defaults(c);
    if (o->checkpoint && ckpt_dir_resolve(o->checkpoint, o->resolved, sizeof o->resolved, err) < 0)
        return err_prefix(err, "--checkpoint");
    if (rank_var("RANK", 0, 0, &rank, err) < 0 || rank_var("WORLD_SIZE", 1, 1, &world, err) < 0) return -1;
    if (o->checkpoint ? checkpoint_model(o->resolved, &c->model, &o->recorded, &seq, &prec, err) < 0
                      : model_load_hf_config(o->init_from, &c->model, err) < 0)
        return err_prefix(err, o->checkpoint ? "--checkpoint" : "--init-from");
    if (o->plan) {
        if (plan_read(o->plan, (int)rank, (int)world, c, err) < 0) return -1;
        prec = c->prec;
    } else {
        if (world != 1) return err_set(err, "WORLD_SIZE is %ld: evaluating across ranks needs a plan (--plan)", world);
        if (o->seq) seq = (int)o->seq;
        if (model_check_seq(&c->model, seq, &c->seq, err) < 0)
            return err_prefix(err, o->seq || !seq ? "--seq" : "the checkpoint's training seq (give --seq)");
        if (arch_of(c->model.arch)->images) c->seq = 0;
        c->global_batch = c->batch = c->micro = (int)(o->micro ? o->micro : 8);
        c->micros = 1;
    }
    c->prec = o->have_prec ? o->prec : prec;
    c->steps = 0;
    /* the trainer's own training source, never read here (the evaluator opens --data itself);
     * train --data has no default any more, so name one rather than leave it NULL */
    c->data = "synthetic";
    c->init_from = o->init_from;
    c->allow_unused = o->allow_unused;
    if (o->device) c->device = o->device;
    if (!c->device) c->device = "cpu";
    if (o->threads) c->threads = (int)o->threads;
    c->gpu = (int)o->gpu;
    return 0;
}

/* The communicator of a multi-rank evaluation (NULL with one rank). */
static int open_comm(train_config *c, comm **out, err_t *err) {
    comm_config cc;
    *out = NULL;
    if (c->world == 1) return 0;
    if (comm_config_from_env(&cc, c->rank, c->world, err) < 0 || !(*out = comm_open(&cc, err))) return -1;
    c->comm = *out;
    return 0;
}

static void print_result(const eval_cmd *o, const trainer *t, const evaluator *ev, double loss) {
    const char *what = o->checkpoint ? o->checkpoint : o->init_from;
    eval_summary sum = eval_summary_of(ev);
    if (!o->json) {
        printf("val loss %.6f | ppl %.4g | %lld samples, %.0f targets, seq %d | %s%s at step %lld\n", loss, exp(loss),
               (long long)sum.samples, sum.targets, t->cfg.seq, o->checkpoint ? "checkpoint " : "model ", what, (long long)t->step);
        return;
    }
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, o->checkpoint ? "checkpoint" : "init_from", what);
    cJSON_AddStringToObject(j, "model", t->cfg.model.name);
    cJSON_AddNumberToObject(j, "step", (double)t->step);
    cJSON_AddStringToObject(j, "data", sum.data);
    cJSON_AddNumberToObject(j, "samples", (double)sum.samples);
    cJSON_AddNumberToObject(j, "targets", sum.targets);
    cJSON_AddNumberToObject(j, "seq", t->cfg.seq);
    cJSON_AddStringToObject(j, "precision", precision_name(t->cfg.prec));
    char v[32];
    snprintf(v, sizeof v, isfinite(loss) ? "%.9g" : "null", loss); /* as the training log prints it */
    cJSON_AddRawToObject(j, "val_loss", v);
    cJSON_AddNumberToObject(j, "val_ppl", exp(loss));
    char *text = cJSON_PrintUnformatted(j);
    printf("%s\n", text);
    free(text);
    cJSON_Delete(j);
}

/* Loading the checkpoint warns when the batch or seq differ from the training's, about the sample
 * order of a resumed training: evaluation reads no training samples, so those go unsaid. */
static void drop_order_warnings(const char *level, const char *text) {
    if (!strstr(text, "the sample order differs")) fprintf(stderr, "%s: %s\n", level, text);
}

int cmd_eval(int argc, char **argv) {
    eval_cmd o = {.val.every = 0, .val.flag = "--data"};
    int rc = parse_eval(argc, argv, &o);
    if (rc) return rc;
    o.val.samples = o.samples;
    train_config c;
    memset(&c, 0, sizeof c);
    err_t err;
    comm *cm = NULL;
    if (eval_config(&o, &c, &err) < 0) return train_config_release(&c), args_bad_cmd(WORKER_NAME " eval", "%s", err.msg);
    if (open_comm(&c, &cm, &err) < 0) return train_config_release(&c), fprintf(stderr, WORKER_NAME " eval: %s\n", err.msg), EXIT_FAILED;
    trainer *t = trainer_new(&c, &err);
    if (!t) {
        if (cm) comm_abort(cm, "the rank failed"), comm_close(cm);
        train_config_release(&c);
        return fprintf(stderr, WORKER_NAME " eval: %s\n", err.msg), EXIT_BAD_INPUT;
    }
    int lock = -1;
    ckpt_opts ck = {.resume = o.resolved};
    log_set_handler(drop_order_warnings);
    if (o.checkpoint && ckpt_start(t, &ck, true, &lock, &err) < 0) {
        fprintf(stderr, WORKER_NAME " eval: --checkpoint: %s\n", err.msg);
        rc = EXIT_BAD_INPUT;
    }
    log_set_handler(NULL);
    evaluator *ev = rc ? NULL : eval_open(t, &o.val, &err);
    double loss = NAN;
    if (!rc && !ev) rc = (fprintf(stderr, WORKER_NAME " eval: %s\n", err.msg), EXIT_BAD_INPUT);
    if (!rc && check_tokenizer(&o, ev, &err) < 0) rc = (fprintf(stderr, WORKER_NAME " eval: %s\n", err.msg), EXIT_BAD_INPUT);
    if (!rc && eval_loss(ev, t, &loss, &err) < 0) rc = (fprintf(stderr, WORKER_NAME " eval: %s\n", err.msg), EXIT_FAILED);
    if (!rc && c.rank == 0) print_result(&o, t, ev, loss);
    /* a loss that is not a number is no result: said, and not exit 0 (eval_open refused a set with
     * nothing to score, so this is an overflow of the forward) */
    if (!rc && !isfinite(loss))
        rc = (fprintf(stderr, WORKER_NAME " eval: the validation loss is %g, not a finite number: the forward overflowed at "
                              "--precision %s (try fp32)\n", loss, precision_name(c.prec)), EXIT_FAILED);
    eval_close(ev);
    ckpt_finish(lock);
    trainer_free(t);
    if (cm) {
        if (rc) comm_abort(cm, "the rank failed"); /* peers fail at once instead of at the timeout */
        comm_close(cm);
    }
    train_config_release(&c);
    return rc;
}
