/* eval.c - the validation loss of a training run (--val-data) and of a checkpoint
 * (`cephalo-worker eval`): eval.h has the rule for the samples and their split over the ranks.
 *
 * The forward is the trainer's own (trainer_forward_loss): the same units, gathers and offload
 * pool as a step, on the buffers a step uses, so evaluation needs no memory beyond the
 * validation source. Rows are weighted 1, so the head returns the plain sum of the target losses;
 * padding rows have no target (-1) and add nothing. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/ckpt_dir.h"
#include "common/fileio.h"
#include "common/log.h"
#include "common/strutil.h"
#include "model/eval.h"
#include "model/fsdp.h"
#include "state/ckpt.h"
#include "state/ckpt_resume.h"
#include "state/plan_read.h"

struct evaluator {
    data_source *data;
    char spec[512];
    int64_t n;      /* validation samples, all ranks together */
    long every;     /* steps between evaluations; 0: after the last step only */
    int64_t lo, hi; /* this rank's samples [lo, hi) */
    int rounds;     /* of at most one batch each, the same on every rank */
    double targets; /* of the last evaluation, all ranks together */
};

static int open_source(const trainer *t, const char *spec, data_source **out, err_t *err) {
    const model_spec *m = &t->cfg.model;
    bool synthetic = !strcmp(spec, "synthetic");
    if (m->arch == ARCH_VIT)
        return synthetic ? data_open_synthetic_images(out, m->channels, m->image, m->n_classes, EVAL_SEED, err)
                         : data_open_images(out, spec, m->channels, m->image, m->n_classes, EVAL_SEED, err);
    data_task task = m->arch == ARCH_BERT ? DATA_MLM : DATA_CLM;
    return synthetic ? data_open_synthetic_tokens(out, t->cfg.seq, m->vocab, task, EVAL_SEED, err)
                     : data_open_tokens(out, spec, t->cfg.seq, m->vocab, task, EVAL_SEED, err);
}

/* Validation sample s into row i of the trainer's host arrays (its targets counted), or, for
 * s < 0, a padding row without a target. */
static int put_sample(const evaluator *ev, trainer *t, int64_t s, int i, double *targets, err_t *err) {
    const model_spec *m = &t->cfg.model;
    t->row_scale[i] = 1;
    if (m->arch == ARCH_VIT) {
        int64_t img = (int64_t)m->channels * m->image * m->image;
        if (s < 0) {
            memset(t->img_host + i * img, 0, (size_t)img * sizeof(float));
            t->tgt_host[i] = -1;
            return 0;
        }
        *targets += 1;
        return data_get_image(ev->data, s, t->img_host + i * img, t->tgt_host + i, err);
    }
    int T = t->tokens;
    int32_t *ids = t->ids_host + (int64_t)i * T, *tgt = t->tgt_host + (int64_t)i * T;
    if (s < 0) {
        memset(ids, 0, (size_t)T * sizeof(int32_t));
        for (int k = 0; k < T; k++) tgt[k] = -1;
        return 0;
    }
    if (data_get_tokens(ev->data, s, ids, tgt, err) < 0) return -1;
    for (int k = 0; k < T; k++) *targets += tgt[k] >= 0;
    return 0;
}

/* Round k's samples of this rank into the host arrays; *micros gets the microbatches they fill. */
static int load_round(const evaluator *ev, trainer *t, int k, int *micros, double *targets, err_t *err) {
    int b = t->cfg.batch, m = t->cfg.micro;
    int64_t first = ev->lo + (int64_t)k * b, end = first + b < ev->hi ? first + b : ev->hi;
    int count = end > first ? (int)(end - first) : 0;
    *micros = (count + m - 1) / m;
    for (int i = 0; i < *micros * m; i++)
        if (put_sample(ev, t, i < count ? first + i : -1, i, targets, err) < 0) return -1;
    return 0;
}

evaluator *eval_open(trainer *t, const eval_opts *o, err_t *err) {
    err->msg[0] = '\0';
    if (!o->data) {
        if (o->every >= 0 || o->samples > 0) err_set(err, "%s needs --val-data (the validation shards)", o->every >= 0 ? "--val-every" : "--val-samples");
        return NULL;
    }
    evaluator *ev = xcalloc(1, sizeof *ev);
    snprintf(ev->spec, sizeof ev->spec, "%s", o->data);
    const char *flag = o->flag ? o->flag : "--val-data";
    if (open_source(t, o->data, &ev->data, err) < 0) {
        err_prefix(err, "%s", flag);
        free(ev);
        return NULL;
    }
    const train_config *c = &t->cfg;
    int64_t want = o->samples > 0 ? o->samples : EVAL_DEFAULT_SAMPLES, have = data_num_samples(ev->data);
    ev->n = want < have ? want : have; /* every sample once */
    long dflt = (long)(c->steps / 10 < 100 ? c->steps / 10 : 100);
    ev->every = o->every >= 0 ? o->every : dflt > 0 ? dflt : 1;
    int64_t B = c->global_batch;
    ev->lo = ev->n * c->sample_offset / B;
    ev->hi = ev->n * (c->sample_offset + c->batch) / B;
    /* this rank's share is at most ceil(n * b / B) <= b * ceil(n / B) samples */
    ev->rounds = (int)((ev->n + B - 1) / B);
    /* read this rank's samples once now: a bad token fails the start, not step 10000 */
    double targets = 0;
    for (int k = 0; k < ev->rounds; k++) {
        int micros;
        if (load_round(ev, t, k, &micros, &targets, err) < 0) {
            err_prefix(err, "%s", flag);
            eval_close(ev);
            return NULL;
        }
    }
    return ev;
}

void eval_close(evaluator *ev) {
    if (!ev) return;
    data_close(ev->data);
    free(ev);
}

bool eval_due(const evaluator *ev, const trainer *t) {
    if (!ev || t->step <= 0) return false;
    return t->step == t->cfg.steps || (ev->every > 0 && t->step % ev->every == 0);
}

int eval_loss(evaluator *ev, trainer *t, double *loss, err_t *err) {
    double v[2] = {0, 0}; /* the sum of the target losses, the targets */
    for (int k = 0; k < ev->rounds; k++) {
        int micros;
        if (load_round(ev, t, k, &micros, &v[1], err) < 0 || trainer_forward_loss(t, micros, &v[0], err) < 0)
            return err_prefix(err, "validation after step %lld", (long long)t->step);
    }
    if (fsdp_allreduce_sums(t, v, 2, err) < 0) return err_prefix(err, "validation after step %lld", (long long)t->step);
    ev->targets = v[1];
    *loss = v[1] > 0 ? v[0] / v[1] : NAN;
    return 0;
}

void eval_describe(const evaluator *ev, char *buf, size_t n) {
    char desc[400];
    data_describe(ev->data, desc, sizeof desc);
    char every[48];
    if (ev->every) snprintf(every, sizeof every, "every %ld steps and after the last", ev->every);
    else snprintf(every, sizeof every, "after the last step");
    snprintf(buf, n, "%lld samples (this rank: %lld), %s; %s", (long long)ev->n, (long long)(ev->hi - ev->lo), every, desc);
}

/* ---- cephalo-worker eval ---- */

typedef struct eval_cmd {
    const char *checkpoint, *init_from, *device, *plan;
    long samples, seq, micro, threads, gpu;
    bool json, have_prec;
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

static int eval_bad(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int eval_bad(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cephalo-worker eval: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(see 'cephalo-worker eval --help')\n");
    va_end(ap);
    return 2;
}

static int eval_int(const char *opt, const char *arg, long lo, long hi, long *out) {
    if (!str_to_long(arg, out) || *out < lo || *out > hi)
        return eval_bad("%s: '%s' is not an integer in [%ld, %ld]", opt, arg, lo, hi);
    return 0;
}

static int parse_eval(int argc, char **argv, eval_cmd *o) {
    enum { O_CKPT = 256, O_INIT, O_DATA, O_SAMPLES, O_SEQ, O_MICRO, O_PREC, O_DEVICE, O_GPU, O_THREADS, O_JSON, O_PLAN };
    static const struct option longopts[] = {
        {"checkpoint", 1, 0, O_CKPT}, {"init-from", 1, 0, O_INIT}, {"data", 1, 0, O_DATA},
        {"samples", 1, 0, O_SAMPLES}, {"seq", 1, 0, O_SEQ},        {"microbatch", 1, 0, O_MICRO},
        {"precision", 1, 0, O_PREC},  {"device", 1, 0, O_DEVICE},  {"gpu", 1, 0, O_GPU},
        {"threads", 1, 0, O_THREADS}, {"json", 0, 0, O_JSON},      {"plan", 1, 0, O_PLAN},
        {"help", 0, 0, 'h'},
        {0, 0, 0, 0}};
    optind = 1;
    opterr = 0;
    int ch;
    while ((ch = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        int rc = 0;
        switch (ch) {
        case O_CKPT: o->checkpoint = optarg; break;
        case O_INIT: o->init_from = optarg; break;
        case O_DATA: o->val.data = optarg; break;
        case O_SAMPLES: rc = eval_int("--samples", optarg, 1, 1L << 30, &o->samples); break;
        case O_SEQ: rc = eval_int("--seq", optarg, 1, 1 << 20, &o->seq); break;
        case O_MICRO: rc = eval_int("--microbatch", optarg, 1, 1 << 20, &o->micro); break;
        case O_THREADS: rc = eval_int("--threads", optarg, 1, 4096, &o->threads); break;
        case O_GPU: rc = eval_int("--gpu", optarg, 0, 1023, &o->gpu); break;
        case O_PREC:
            if (!precision_parse(optarg, &o->prec)) rc = eval_bad("--precision: '%s' is not " PRECISION_CHOICES, optarg);
            o->have_prec = true;
            break;
        case O_DEVICE:
            if (strcmp(optarg, "cpu") && strcmp(optarg, "cuda")) rc = eval_bad("--device: '%s' is not 'cpu' or 'cuda'", optarg);
            o->device = optarg;
            break;
        case O_JSON: o->json = true; break;
        case O_PLAN: o->plan = optarg; break;
        case 'h': fputs(eval_usage, stdout); exit(0);
        case ':': return eval_bad("option '%s' needs a value", argv[optind - 1]);
        default: return eval_bad("unknown option '%s'", argv[optind - 1]);
        }
        if (rc) return rc;
    }
    if (optind < argc) return eval_bad("unexpected argument '%s'", argv[optind]);
    if (!o->checkpoint == !o->init_from) return eval_bad("%s", "give --checkpoint PATH or --init-from DIR (one of them)");
    if (!o->val.data) return eval_bad("%s", "--data: give the validation data (token shards, a CIMG file or 'synthetic')");
    if (!o->plan) o->plan = getenv("CEPHALO_PLAN");
    if (o->plan && !*o->plan) o->plan = NULL;
    if (o->plan && (o->seq || o->micro)) return eval_bad("%s", "--seq and --microbatch come from the plan; give one or the other");
    return 0;
}

/* The file whose metadata describes the checkpoint PATH names (ckpt_dir_resolve): the file, or a
 * step directory's rank 0 file. */
static int first_piece(const char *path, char *out, size_t n, err_t *err) {
    if (ckpt_dir_resolve(path, out, n, err) < 0) return -1;
    if (file_is_dir(out)) {
        char name[64];
        ckpt_shard_name(0, name, sizeof name);
        size_t len = strlen(out);
        snprintf(out + len, n - len, "/%s", name);
    }
    return 0;
}

/* The checkpoint's model, and its training seq and precision (metadata "cephalo.train"). */
static int checkpoint_model(const char *path, model_spec *m, int *seq, precision *prec, err_t *err) {
    char file[1400];
    st_file *f;
    if (first_piece(path, file, sizeof file, err) < 0 || st_open(&f, file, err) < 0) return -1;
    int rc = ckpt_read_model(f, m, err);
    const char *train = st_meta(f, "cephalo.train");
    cJSON *o = train ? cJSON_Parse(train) : NULL;
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(o, "seq"), *p = cJSON_GetObjectItemCaseSensitive(o, "precision");
    if (cJSON_IsNumber(s)) *seq = s->valueint;
    if (cJSON_IsString(p)) precision_parse(p->valuestring, prec);
    cJSON_Delete(o);
    st_close(f);
    return rc;
}

/* $RANK and $WORLD_SIZE (default 0 of 1), as train reads them. */
static int env_rank(const char *name, long dflt, long lo, long *out, err_t *err) {
    const char *s = getenv(name);
    *out = dflt;
    if (s && *s && (!str_to_long(s, out) || *out < lo || *out > (1 << 20)))
        return err_set(err, "$%s is '%s', expected an integer in [%ld, %d]", name, s, lo, 1 << 20);
    return 0;
}

/* Every rank's share of the samples and its microbatches from the plan (the model must be the
 * checkpoint's: loading says so otherwise); else one process. */
static int eval_config(const eval_cmd *o, train_config *c, err_t *err) {
    int seq = 0;
    precision prec = PREC_FP32;
    long rank, world;
    train_config_defaults(c);
    if (env_rank("RANK", 0, 0, &rank, err) < 0 || env_rank("WORLD_SIZE", 1, 1, &world, err) < 0) return -1;
    if (o->checkpoint ? checkpoint_model(o->checkpoint, &c->model, &seq, &prec, err) < 0
                      : model_load_hf_config(o->init_from, &c->model, err) < 0)
        return err_prefix(err, o->checkpoint ? "--checkpoint" : "--init-from");
    if (o->plan) {
        if (plan_read(o->plan, (int)rank, (int)world, c, err) < 0) return -1;
        prec = c->prec;
    } else {
        if (world != 1) return err_set(err, "WORLD_SIZE is %ld: evaluating across ranks needs a plan (--plan)", world);
        if (o->seq) seq = (int)o->seq;
        if (model_check_seq(&c->model, seq, &c->seq, err) < 0) return err_prefix(err, "--seq");
        if (c->model.arch == ARCH_VIT) c->seq = 0;
        c->global_batch = c->batch = c->micro = (int)(o->micro ? o->micro : 8);
        c->micros = 1;
    }
    c->prec = o->have_prec ? o->prec : prec;
    c->steps = 0;
    c->init_from = o->init_from;
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
    if (!o->json) {
        printf("val loss %.6f | ppl %.4g | %lld samples, %.0f targets, seq %d | %s%s at step %lld\n", loss, exp(loss),
               (long long)ev->n, ev->targets, t->cfg.seq, o->checkpoint ? "checkpoint " : "model ", what, (long long)t->step);
        return;
    }
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, o->checkpoint ? "checkpoint" : "init_from", what);
    cJSON_AddStringToObject(j, "model", t->cfg.model.name);
    cJSON_AddNumberToObject(j, "step", (double)t->step);
    cJSON_AddStringToObject(j, "data", ev->spec);
    cJSON_AddNumberToObject(j, "samples", (double)ev->n);
    cJSON_AddNumberToObject(j, "targets", ev->targets);
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
    if (eval_config(&o, &c, &err) < 0) return train_config_release(&c), eval_bad("%s", err.msg);
    if (open_comm(&c, &cm, &err) < 0) return train_config_release(&c), fprintf(stderr, "cephalo-worker eval: %s\n", err.msg), 1;
    trainer *t = trainer_new(&c, &err);
    if (!t) {
        if (cm) comm_abort(cm, "the rank failed"), comm_close(cm);
        train_config_release(&c);
        return fprintf(stderr, "cephalo-worker eval: %s\n", err.msg), 2;
    }
    int lock = -1;
    ckpt_opts ck = {.resume = o.checkpoint};
    log_set_handler(drop_order_warnings);
    if (o.checkpoint && ckpt_start(t, &ck, true, &lock, &err) < 0) {
        fprintf(stderr, "cephalo-worker eval: --checkpoint: %s\n", err.msg);
        rc = 2;
    }
    log_set_handler(NULL);
    evaluator *ev = rc ? NULL : eval_open(t, &o.val, &err);
    double loss = NAN;
    if (!rc && !ev) rc = (fprintf(stderr, "cephalo-worker eval: %s\n", err.msg), 2);
    if (!rc && eval_loss(ev, t, &loss, &err) < 0) rc = (fprintf(stderr, "cephalo-worker eval: %s\n", err.msg), 1);
    if (!rc && c.rank == 0) print_result(&o, t, ev, loss);
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
