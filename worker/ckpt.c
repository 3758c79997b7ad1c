/* ckpt.c - training checkpoints in safetensors (docs/checkpoints.md).
 *
 * One file per checkpoint holding, per unit, the flat parameter buffer ("param.UNIT") and the
 * AdamW moments ("adam_m.UNIT", "adam_v.UNIT"), plus metadata: the format, the next step, the
 * model spec and the training configuration. Per-unit flat buffers (not per tensor) are what a
 * rank's shard is a slice of, so sharded checkpoints use the same names. Written atomically by
 * st_writer_save; on load every tensor's dtype and shape and the model spec are checked, and the
 * CRC-32 of the data. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "json_util.h"
#include "log.h"
#include "model_json.h"
#include "safetensors.h"

static const char *const STATE_PREFIX[] = {"param", "adam_m", "adam_v"};

cJSON *train_config_json(const train_config *c) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "batch", c->global_batch);
    cJSON_AddNumberToObject(o, "seq", c->seq);
    cJSON_AddNumberToObject(o, "steps", (double)c->steps);
    cJSON_AddNumberToObject(o, "lr", c->lr);
    cJSON_AddNumberToObject(o, "min_lr", c->min_lr < 0 ? c->lr / 10 : c->min_lr);
    cJSON_AddNumberToObject(o, "warmup", (double)c->warmup);
    cJSON_AddNumberToObject(o, "weight_decay", c->weight_decay);
    cJSON_AddNumberToObject(o, "beta1", c->beta1);
    cJSON_AddNumberToObject(o, "beta2", c->beta2);
    cJSON_AddNumberToObject(o, "eps", c->eps);
    cJSON_AddNumberToObject(o, "clip", c->clip);
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)c->seed);
    cJSON_AddStringToObject(o, "seed", seed);
    cJSON_AddStringToObject(o, "data", c->data);
    return o;
}

char *json_to_string_free(cJSON *o) {
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    CHECK(s != NULL);
    return s;
}

int trainer_save(trainer *t, const char *path, err_t *err) {
    st_writer *w = st_writer_new();
    float **host = xcalloc((size_t)t->n_units * 3, sizeof(float *));
    float **state[3] = {t->params, t->adam_m, t->adam_v};
    for (int k = 0; k < 3; k++) {
        for (int u = 0; u < t->n_units; u++) {
            char name[96], unit[48];
            float *h = host[k * t->n_units + u] = xmalloc((size_t)t->numel[u] * sizeof(float));
            dev_download(&t->dev, h, state[k][u], (size_t)t->numel[u] * sizeof(float));
            model_unit_name(&t->cfg.model, u, unit, sizeof unit);
            snprintf(name, sizeof name, "%s.%s", STATE_PREFIX[k], unit);
            st_writer_add(w, name, ST_F32, 1, &t->numel[u], h);
        }
    }
    char step[32];
    snprintf(step, sizeof step, "%lld", (long long)t->step);
    st_writer_meta(w, "cephalo.format", CKPT_FORMAT);
    st_writer_meta(w, "cephalo.version", "1");
    st_writer_meta(w, "cephalo.step", step);
    char *model = json_to_string_free(model_to_json(&t->cfg.model));
    char *cfg = json_to_string_free(train_config_json(&t->cfg));
    st_writer_meta(w, "cephalo.model", model);
    st_writer_meta(w, "cephalo.train", cfg);
    int rc = st_writer_save(w, path, err);
    st_writer_free(w);
    free(model), free(cfg);
    for (int i = 0; i < t->n_units * 3; i++) free(host[i]);
    free(host);
    return rc;
}

int ckpt_read_model(const st_file *f, model_spec *m, err_t *err) {
    const char *text = st_meta(f, "cephalo.model");
    if (!text) return err_set(err, "%s: no 'cephalo.model' metadata (not a Cephalo checkpoint?)",
                              st_label(f));
    cJSON *o = json_parse(st_label(f), text, strlen(text), err);
    if (!o) return -1;
    json_ctx c = {st_label(f), err};
    int rc = model_from_json(&c, o, "metadata cephalo.model", m);
    cJSON_Delete(o);
    return rc;
}

/* The checkpoint's model must be the one being trained, field by field. */
static int check_model(const st_file *f, const model_spec *want, err_t *err) {
    model_spec got;
    if (ckpt_read_model(f, &got, err) < 0) return -1;
    cJSON *a = model_to_json(&got), *b = model_to_json(want);
    cJSON_DeleteItemFromObject(a, "name"), cJSON_DeleteItemFromObject(b, "name");
    bool same = cJSON_Compare(a, b, true);
    if (!same) {
        char *sa = cJSON_PrintUnformatted(a), *sb = cJSON_PrintUnformatted(b);
        err_set(err, "%s: the checkpoint is of model %s %s, not the %s being trained %s",
                st_label(f), got.name, sa, want->name, sb);
        free(sa), free(sb);
    }
    cJSON_Delete(a), cJSON_Delete(b);
    return same ? 0 : -1;
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

/* The data order is a function of the seed and the global batch (docs/data.md): resuming with
 * either changed is allowed, but the run no longer continues the interrupted one. */
static void warn_changed_order(const st_file *f, const train_config *now) {
    const char *text = st_meta(f, "cephalo.train");
    cJSON *o = text ? cJSON_Parse(text) : NULL;
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

int trainer_resume(trainer *t, const char *path, err_t *err) {
    st_file *f;
    if (st_open(&f, path, err) < 0) return -1;
    int64_t step = 0;
    if (read_step(f, &step, err) < 0 || check_model(f, &t->cfg.model, err) < 0) goto fail;
    warn_changed_order(f, &t->cfg);
    float **state[3] = {t->params, t->adam_m, t->adam_v};
    for (int k = 0; k < 3; k++) {
        for (int u = 0; u < t->n_units; u++) {
            char name[96], unit[48];
            const void *data;
            model_unit_name(&t->cfg.model, u, unit, sizeof unit);
            snprintf(name, sizeof name, "%s.%s", STATE_PREFIX[k], unit);
            if (st_expect(f, name, ST_F32, 1, &t->numel[u], &data, err) < 0) goto fail;
            dev_upload(&t->dev, state[k][u], data, (size_t)t->numel[u] * sizeof(float));
        }
    }
    t->step = step;
    t->samples_seen = step * t->cfg.global_batch;
    st_close(f);
    return 0;
fail:
    st_close(f);
    return -1;
}
