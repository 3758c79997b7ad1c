/* ckpt.c - training checkpoints in safetensors (docs/checkpoints.md).
 *
 * One file per checkpoint holding, per unit, the flat parameter buffer ("param.UNIT") and the
 * AdamW moments ("adam_m.UNIT", "adam_v.UNIT"), plus metadata: the format, the next step, the
 * model spec, the training configuration and the optimizer's progress ("cephalo.optimizer":
 * AdamW's update count and, in fp16, the loss scale). Per-unit flat buffers (not per tensor) are what a
 * rank's shard is a slice of, so sharded checkpoints use the same names. Written atomically by
 * st_writer_save; on load every tensor's dtype and shape and the model spec are checked, and the
 * CRC-32 of the data. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fileio.h"
#include "common/json_util.h"
#include "common/log.h"
#include "common/strutil.h"
#include "common/version.h"
#include "formats/safetensors.h"
#include "planner/model_json.h"
#include "state/ckpt.h"

cJSON *train_config_json(const train_config *c) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "batch", c->global_batch);
    cJSON_AddNumberToObject(o, "seq", c->seq);
    cJSON_AddNumberToObject(o, "steps", (double)c->steps);
    cJSON_AddNumberToObject(o, "lr", c->lr);
    cJSON_AddNumberToObject(o, "min_lr", schedule_min_lr(c->lr, c->min_lr));
    cJSON_AddNumberToObject(o, "warmup", (double)c->warmup);
    cJSON_AddStringToObject(o, "schedule", schedule_name(c->schedule));
    cJSON_AddNumberToObject(o, "weight_decay", c->weight_decay);
    cJSON_AddNumberToObject(o, "beta1", c->beta1);
    cJSON_AddNumberToObject(o, "beta2", c->beta2);
    cJSON_AddNumberToObject(o, "eps", c->eps);
    cJSON_AddNumberToObject(o, "clip", c->clip);
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)c->seed);
    cJSON_AddStringToObject(o, "seed", seed);
    cJSON_AddStringToObject(o, "data", c->data);
    cJSON_AddStringToObject(o, "precision", precision_name(c->prec));
    return o;
}

/* {"adam_steps": N, "skipped_steps": N} and, in fp16, "loss_scale" and "clean_steps". */
static cJSON *optimizer_json(const trainer *t) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "adam_steps", (double)t->adam_steps);
    cJSON_AddNumberToObject(o, "skipped_steps", (double)t->skipped_steps);
    if (t->cfg.prec == PREC_FP16) {
        cJSON_AddNumberToObject(o, "loss_scale", t->loss_scale);
        cJSON_AddNumberToObject(o, "clean_steps", (double)t->clean_steps);
    }
    return o;
}

/* Reads "cephalo.optimizer" (absent in checkpoints before it existed: every step was an update).
 * Its loss scale is used only by an fp16 run resuming an fp16 checkpoint. */
static int read_optimizer(const st_file *f, trainer *t, int64_t step, err_t *err) {
    t->adam_steps = step, t->skipped_steps = 0, t->clean_steps = 0;
    const char *text = st_meta(f, "cephalo.optimizer");
    if (!text) return 0;
    cJSON *o = json_parse(st_label(f), text, strlen(text), err);
    if (!o) return -1;
    json_ctx c = {st_label(f), err};
    const char *P = "metadata cephalo.optimizer";
    long adam = 0, skipped = 0, clean = 0;
    double scale = 0;
    const cJSON *v;
    int rc = -1;
    if (json_expect_object(&c, o, P) < 0 ||
        json_require(&c, o, P, "adam_steps", &v) < 0 || json_int(&c, v, "cephalo.optimizer.adam_steps", 0, (long)step, &adam) < 0 ||
        json_require(&c, o, P, "skipped_steps", &v) < 0 || json_int(&c, v, "cephalo.optimizer.skipped_steps", 0, (long)step, &skipped) < 0)
        goto out;
    const cJSON *s = json_get(o, "loss_scale"), *g = json_get(o, "clean_steps");
    if (s && json_number(&c, s, "cephalo.optimizer.loss_scale", 0x1p-24, 0x1p100, JSON_CLOSED, &scale) < 0) goto out;
    if (g && json_int(&c, g, "cephalo.optimizer.clean_steps", 0, (long)step, &clean) < 0) goto out;
    t->adam_steps = adam, t->skipped_steps = skipped;
    if (t->cfg.prec == PREC_FP16 && s) t->loss_scale = scale, t->clean_steps = clean;
    rc = 0;
out:
    cJSON_Delete(o);
    return rc;
}

char *json_to_string_free(cJSON *o) {
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    CHECK(s != NULL);
    return s;
}

/* This rank's slice of each unit as JSON ({"rank","world","offsets","sizes"}). */
static cJSON *shard_json(const trainer *t) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "rank", t->cfg.rank);
    cJSON_AddNumberToObject(o, "world", t->cfg.world);
    cJSON *off = cJSON_AddArrayToObject(o, "offsets"), *n = cJSON_AddArrayToObject(o, "sizes");
    for (int u = 0; u < t->n_units; u++) {
        cJSON_AddItemToArray(off, cJSON_CreateNumber((double)t->shard_off[u]));
        cJSON_AddItemToArray(n, cJSON_CreateNumber((double)t->shard_n[u]));
    }
    return o;
}

/* The model's tokenizer (tok_id_name), recorded in every checkpoint this process writes: one
 * process trains one model, and the trainer itself knows nothing of text. */
static char ckpt_tokenizer[TOK_ID_NAME_MAX];

void ckpt_set_tokenizer(tok_id id) {
    if (id.kind) tok_id_name(id, ckpt_tokenizer);
    else ckpt_tokenizer[0] = '\0';
}

int ckpt_read_tokenizer(const st_file *f, tok_id *id, err_t *err) {
    const char *s = st_meta(f, "cephalo.tokenizer");
    *id = (tok_id){0};
    if (!s) return 0;
    if (tok_id_parse(s, id) < 0)
        return err_set(err, "%s: metadata cephalo.tokenizer is \"%.60s\", expected a tokenizer identity such as "
                            "bpe-50257-0123456789abcdef",
                       st_label(f), s);
    return 0;
}

int trainer_save(trainer *t, const char *path, err_t *err) {
    st_writer *w = st_writer_new();
    float **host = xcalloc((size_t)t->n_units * 3, sizeof(float *));
    float **state[3] = {t->params, t->adam_m, t->adam_v};
    for (int k = 0; k < 3; k++) {
        for (int u = 0; u < t->n_units; u++) {
            int64_t n = t->shard_n[u];
            if (!n) continue; /* this rank holds none of the unit */
            char name[96], unit[48];
            float *h = host[k * t->n_units + u] = xmalloc((size_t)n * sizeof(float));
            dev_download(&t->dev, h, state[k][u], (size_t)n * sizeof(float));
            model_unit_name(&t->cfg.model, u, unit, sizeof unit);
            snprintf(name, sizeof name, "%s.%s", CKPT_KINDS[k], unit);
            st_writer_add(w, name, ST_F32, 1, &n, h);
        }
    }
    char step[32];
    snprintf(step, sizeof step, "%lld", (long long)t->step);
    st_writer_meta(w, "cephalo.format", CKPT_FORMAT);
    st_writer_meta(w, "cephalo.version", "1");
    st_writer_meta(w, "cephalo.release", cephalo_version()); /* the writer's release: a record, not checked */
    st_writer_meta(w, "cephalo.step", step);
    char *model = json_to_string_free(model_to_json(&t->cfg.model));
    char *cfg = json_to_string_free(train_config_json(&t->cfg));
    char *shard = t->sharded ? json_to_string_free(shard_json(t)) : NULL;
    char *opt = json_to_string_free(optimizer_json(t));
    st_writer_meta(w, "cephalo.model", model);
    st_writer_meta(w, "cephalo.train", cfg);
    st_writer_meta(w, "cephalo.optimizer", opt);
    if (shard) st_writer_meta(w, "cephalo.shard", shard);
    if (ckpt_tokenizer[0]) st_writer_meta(w, "cephalo.tokenizer", ckpt_tokenizer);
    int rc = st_writer_save(w, path, FILE_OUT_OWN, err);
    st_writer_free(w);
    free(model), free(cfg), free(shard), free(opt);
    for (int i = 0; i < t->n_units * 3; i++) free(host[i]);
    free(host);
    return rc;
}

static int read_step(const st_file *f, int64_t *step, err_t *err) {
    const char *fmt = st_meta(f, "cephalo.format"), *s = st_meta(f, "cephalo.step");
    if (!fmt || strcmp(fmt, CKPT_FORMAT))
        return err_set(err, "%s: metadata cephalo.format is %s%s%s, expected \"%s\"", st_label(f),
                       fmt ? "\"" : "", fmt ? fmt : "missing", fmt ? "\"" : "", CKPT_FORMAT);
    char *end;
    long long v = s ? strtoll(s, &end, 10) : -1;
    if (!s || *end || v < 0)
        return err_set(err, "%s: metadata cephalo.step is %s, expected a step number",
                       st_label(f), s ? s : "missing");
    *step = v;
    return 0;
}

/* The metadata cephalo.train (the settings of the run that wrote the checkpoint), for the warnings
 * below; NULL when absent, or when it does not read as JSON (said: the warnings are then left
 * out, the checkpoint itself is fine). */
static cJSON *train_meta(const st_file *f) {
    const char *text = st_meta(f, "cephalo.train");
    err_t err;
    cJSON *o = text ? json_parse(st_label(f), text, strlen(text), &err) : NULL;
    if (text && !o) log_warn("metadata cephalo.train: %s (the resumed run's settings are not compared)", err.msg);
    return o;
}

/* The data order is a function of the seed and the global batch (docs/data.md): resuming with
 * either changed is allowed, but the run no longer continues the interrupted one. */
static void warn_changed_order(const st_file *f, const train_config *now) {
    cJSON *o = train_meta(f);
    cJSON *cur = train_config_json(now);
    const char *keys[] = {"seed", "batch", "seq"};
    for (size_t i = 0; o && i < sizeof keys / sizeof keys[0]; i++) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, keys[i]);
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(cur, keys[i]);
        if (a && !cJSON_Compare(a, b, true)) {
            char *sa = cJSON_PrintUnformatted(a), *sb = cJSON_PrintUnformatted(b);
            log_warn("%s: written with %s %s, resuming with %s: the sample order differs from "
                     "the interrupted run's", st_label(f), keys[i], sa, sb);
            free(sa), free(sb);
        }
    }
    cJSON_Delete(o), cJSON_Delete(cur);
}

/* The learning rate of `step` under the schedule recorded in a checkpoint's cephalo.train; NAN
 * when a field is missing (an older checkpoint). */
static double recorded_lr(const cJSON *o, int64_t step) {
    const cJSON *steps = json_get(o, "steps"), *lr = json_get(o, "lr"), *min_lr = json_get(o, "min_lr");
    const cJSON *warmup = json_get(o, "warmup"), *sched = json_get(o, "schedule");
    lr_schedule s;
    if (!cJSON_IsNumber(steps) || !cJSON_IsNumber(lr) || !cJSON_IsNumber(min_lr) || !cJSON_IsNumber(warmup) ||
        !cJSON_IsString(sched) || !schedule_parse(sched->valuestring, &s))
        return NAN;
    return schedule_lr(s, lr->valuedouble, min_lr->valuedouble, (int64_t)warmup->valuedouble,
                       (int64_t)steps->valuedouble, step);
}

/* A resume with another --steps (or lr, min-lr, warmup, schedule) follows the new schedule from
 * the resumed step on: a longer --steps re-stretches the cosine. Allowed (it is how a run is
 * extended), but said, with the rate it changes and how to keep the interrupted run's. */
static void warn_changed_schedule(const st_file *f, const train_config *now, int64_t step) {
    if (now->steps <= step) return; /* no step left to take (eval, sample, a finished run) */
    cJSON *o = train_meta(f);
    cJSON *cur = train_config_json(now);
    const char *keys[] = {"steps", "lr", "min_lr", "warmup", "schedule"};
    char *changed = NULL;
    size_t len = 0, cap = 0;
    for (size_t i = 0; o && i < sizeof keys / sizeof keys[0]; i++) {
        const cJSON *a = json_get(o, keys[i]), *b = json_get(cur, keys[i]);
        if (!a || cJSON_Compare(a, b, true)) continue;
        char *sa = cJSON_PrintUnformatted(a), *sb = cJSON_PrintUnformatted(b);
        str_appendf(&changed, &len, &cap, "%s%s %s -> %s", len ? ", " : "", keys[i], sa, sb);
        free(sa), free(sb);
    }
    if (changed)
        log_warn("%s: the learning-rate schedule differs from the interrupted run's (%s): from step %lld "
                 "on it follows the new one, lr %.4g where the interrupted run had %.4g; resume with the "
                 "run's own settings to keep its schedule", st_label(f), changed, (long long)step,
                 train_lr(now, step), recorded_lr(o, step));
    free(changed);
    cJSON_Delete(o), cJSON_Delete(cur);
}

/* Copies this rank's slice of every unit from the checkpoint's pieces. */
static int load_state(trainer *t, ckpt_set *set, err_t *err) {
    float **state[3] = {t->params, t->adam_m, t->adam_v};
    for (int k = 0; k < 3; k++) {
        for (int u = 0; u < t->n_units; u++) {
            int64_t n = t->shard_n[u];
            if (!n) continue;
            float *h = xmalloc((size_t)n * sizeof(float));
            char unit[48];
            model_unit_name(&t->cfg.model, u, unit, sizeof unit);
            int rc = ckpt_set_read(set, CKPT_KINDS[k], u, unit, t->shard_off[u], n, h, err);
            if (rc == 0) dev_upload(&t->dev, state[k][u], h, (size_t)n * sizeof(float));
            free(h);
            if (rc < 0) return -1;
        }
    }
    t->p16_fresh = false; /* adamw half: the 16-bit copies are made again from these */
    return 0;
}

int trainer_resume(trainer *t, const char *path, err_t *err) {
    bool other_model = false;
    ckpt_set *set = ckpt_set_open(path, &t->cfg.model, t->cfg.allow_unused, &other_model, err);
    if (!set) return other_model ? RESUME_OTHER_MODEL : -1;
    const st_file *f = ckpt_set_first(set, err);
    int64_t step = 0;
    int rc = -1;
    if (!f || read_step(f, &step, err) < 0) goto out;
    if ((rc = ckpt_check_model(f, &t->cfg.model, err)) < 0) goto out;
    rc = -1;
    if (step != ckpt_set_step(set)) {
        err_set(err, "%s: step %lld, but the checkpoint's index says %lld", st_label(f),
                (long long)step, (long long)ckpt_set_step(set));
        goto out;
    }
    warn_changed_order(f, &t->cfg);
    warn_changed_schedule(f, &t->cfg, step);
    if (ckpt_read_tokenizer(f, &t->resumed_tok, err) < 0 || read_optimizer(f, t, step, err) < 0 ||
        load_state(t, set, err) < 0)
        goto out;
    t->step = step;
    t->samples_seen = step * t->cfg.global_batch;
    rc = 0;
out:
    ckpt_set_close(set);
    return rc;
}

static int barrier(trainer *t, const char *what, err_t *err) {
    return t->cfg.comm ? comm_run(t->cfg.comm, comm_barrier(t->cfg.comm, what), err) : 0;
}

int ckpt_save_step(trainer *t, const char *dir, err_t *err) {
    /* names: "step_" and at most 19 digits; the paths are checked, although the worker refuses a
     * checkpoint directory without room for them at its start (CKPT_DIR_MAX) */
    char name[64], path[PATH_MAX], sub[PATH_MAX];
    int rank = t->cfg.rank;
    if (!t->sharded) {
        /* one rank, or replicated (every rank holds the same state): rank 0 writes it whole */
        snprintf(name, sizeof name, "step_%08lld.safetensors", (long long)t->step);
        if (str_fmt(path, sizeof path, err, "checkpoint path", "%s/%s", dir, name) < 0) return -1;
        if (rank == 0 && trainer_save(t, path, err) < 0) return -1;
    } else {
        snprintf(name, sizeof name, "step_%08lld", (long long)t->step);
        char file[64];
        ckpt_shard_name(rank, file, sizeof file);
        if (str_fmt(sub, sizeof sub, err, "checkpoint path", "%s/%s", dir, name) < 0 ||
            str_fmt(path, sizeof path, err, "checkpoint path", "%s/%s", sub, file) < 0)
            return -1;
        if (file_make_dir(sub, false, err) < 0 || trainer_save(t, path, err) < 0) return -1;
    }
    /* the index and 'latest' name only files that are complete on every rank */
    if (barrier(t, "checkpoint files", err) < 0) return -1;
    if (rank == 0) {
        if (t->sharded && ckpt_write_index(sub, t, err) < 0) return -1;
        char latest[PATH_MAX], line[80];
        if (str_fmt(latest, sizeof latest, err, "checkpoint path", "%s/latest", dir) < 0) return -1;
        int n = snprintf(line, sizeof line, "%s\n", name); /* name: 64 bytes at most */
        if (file_write_atomic(latest, line, (size_t)n, FILE_OUT_OWN, err) < 0) return -1;
    }
    return barrier(t, "checkpoint index", err);
}
