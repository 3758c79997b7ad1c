/* dump.c - oracle dumps (see dump.h). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "common/fileio.h"
#include "common/log.h"
#include "common/strutil.h"
#include "formats/safetensors.h"
#include "planner/arch.h"
#include "planner/model_json.h"
#include "state/ckpt.h"
#include "state/dump.h"

struct dumper {
    char *dir; /* --dump, as given */
    int64_t steps, cap;
    int32_t **inputs, **targets; /* per recorded step */
    float **images;
    float *logits;
};

static int path_in(const dumper *dp, const char *file, char *out, err_t *err) {
    return str_fmt(out, PATH_MAX, err, "--dump: the path", "%s/%s", dp->dir, file);
}

/* Adds every tensor of every unit under its full name, from host copies kept in bufs; gradients
 * (grad_scale > 0) divided by grad_scale. */
static void add_named(st_writer *w, trainer *t, float **bufs, const char *prefix, double grad_scale) {
    const model_spec *m = &t->cfg.model;
    for (int u = 0; u < t->n_units; u++) {
        bufs[u] = xmalloc((size_t)t->numel[u] * sizeof(float));
        if (grad_scale > 0) {
            trainer_get_grads(t, u, bufs[u]);
            for (int64_t i = 0; i < t->numel[u]; i++) bufs[u][i] = (float)(bufs[u][i] / grad_scale);
        } else {
            trainer_get_params(t, u, bufs[u]);
        }
        wm_tensor ts[WM_MAX_TENSORS];
        int n = wm_unit_tensors(m, u, ts);
        char unit[48], name[192];
        model_unit_name(m, u, unit, sizeof unit);
        for (int i = 0; i < n; i++) {
            snprintf(name, sizeof name, "%.16s%.47s.%.47s", prefix, unit, ts[i].name);
            st_writer_add(w, name, ST_F32, ts[i].ndim, ts[i].shape, bufs[u] + ts[i].offset);
        }
    }
}

static void add_meta(st_writer *w, trainer *t) {
    char *model = json_to_string_free(model_to_json(&t->cfg.model));
    cJSON *tc = train_config_json(&t->cfg);
    /* loss-masked data: the loss is the mean over the global batch's targets (train.c) */
    if (t->data && data_has_loss_mask(t->data)) cJSON_AddStringToObject(tc, "loss_mean", "targets");
    char *cfg = json_to_string_free(tc);
    st_writer_meta(w, "cephalo.model", model);
    st_writer_meta(w, "cephalo.train", cfg);
    free(model), free(cfg);
}

static int save_params(trainer *t, const dumper *dp, const char *file, err_t *err) {
    st_writer *w = st_writer_new();
    float **bufs = xcalloc((size_t)t->n_units, sizeof(float *));
    add_named(w, t, bufs, "", 0);
    add_meta(w, t);
    char path[PATH_MAX];
    int rc = path_in(dp, file, path, err) < 0 ? -1 : st_writer_save(w, path, 0, err);
    st_writer_free(w);
    for (int u = 0; u < t->n_units; u++) free(bufs[u]);
    free(bufs);
    return rc;
}

static int64_t logits_floats(const trainer *t) {
    const model_spec *m = &t->cfg.model;
    return arch_of(m->arch)->images ? (int64_t)t->cfg.batch * m->n_classes
                               : (int64_t)t->cfg.batch * t->tokens * m->vocab;
}

static bool dump_owns(const char *name) {
    static const char *const files[] = {"init.safetensors", "step0.safetensors", "batches.safetensors",
                                        "final.safetensors", NULL};
    for (int i = 0; files[i]; i++)
        if (!strcmp(name, files[i])) return true;
    return false;
}

const out_kind dump_dir_kind = {"dump directory", dump_owns, false, NULL, NULL};

dumper *dump_open(trainer *t, const char *dir, err_t *err) {
    if (t->cfg.world != 1) {
        err_set(err, "--dump needs a single rank (WORLD_SIZE=1)");
        return NULL;
    }
    if (file_make_dir(dir, true, err) < 0) {
        err_prefix(err, "--dump");
        return NULL;
    }
    dumper *dp = xcalloc(1, sizeof *dp);
    dp->dir = xstrdup(dir);
    if (save_params(t, dp, "init.safetensors", err) < 0) {
        free(dp->dir);
        free(dp);
        return NULL;
    }
    dp->logits = xcalloc((size_t)logits_floats(t), sizeof(float));
    t->logits_out = dp->logits;
    return dp;
}

static int save_step0(dumper *dp, trainer *t, double loss, double loss_scale, err_t *err) {
    const model_spec *m = &t->cfg.model;
    st_writer *w = st_writer_new();
    float **bufs = xcalloc((size_t)t->n_units, sizeof(float *));
    float loss32 = (float)loss;
    if (arch_of(m->arch)->images)
        st_writer_add(w, "logits", ST_F32, 2, (int64_t[]){t->cfg.batch, m->n_classes}, dp->logits);
    else
        st_writer_add(w, "logits", ST_F32, 3, (int64_t[]){t->cfg.batch, t->tokens, m->vocab},
                      dp->logits);
    st_writer_add(w, "loss", ST_F32, 1, (int64_t[]){1}, &loss32);
    add_named(w, t, bufs, "grad.", loss_scale);
    add_meta(w, t);
    char path[PATH_MAX];
    int rc = path_in(dp, "step0.safetensors", path, err) < 0 ? -1 : st_writer_save(w, path, 0, err);
    st_writer_free(w);
    for (int u = 0; u < t->n_units; u++) free(bufs[u]);
    free(bufs);
    return rc;
}

int dump_after_step(dumper *dp, trainer *t, double loss, double loss_scale, err_t *err) {
    const model_spec *m = &t->cfg.model;
    if (dp->steps == dp->cap) {
        dp->cap = dp->cap ? 2 * dp->cap : 8;
        dp->inputs = xrealloc(dp->inputs, (size_t)dp->cap * sizeof(void *));
        dp->targets = xrealloc(dp->targets, (size_t)dp->cap * sizeof(void *));
        dp->images = xrealloc(dp->images, (size_t)dp->cap * sizeof(void *));
    }
    int64_t B = t->cfg.batch, k = dp->steps++;
    dp->inputs[k] = NULL, dp->images[k] = NULL;
    if (arch_of(m->arch)->images) {
        int64_t img = B * m->channels * m->image * m->image;
        dp->images[k] = xmalloc((size_t)img * sizeof(float));
        memcpy(dp->images[k], t->img_host, (size_t)img * sizeof(float));
        dp->targets[k] = xmalloc((size_t)B * sizeof(int32_t));
        memcpy(dp->targets[k], t->tgt_host, (size_t)B * sizeof(int32_t));
    } else {
        size_t bytes = (size_t)(B * t->tokens) * sizeof(int32_t);
        dp->inputs[k] = xmalloc(bytes), dp->targets[k] = xmalloc(bytes);
        memcpy(dp->inputs[k], t->ids_host, bytes);
        memcpy(dp->targets[k], t->tgt_host, bytes);
    }
    if (k == 0) {
        t->logits_out = NULL;
        return save_step0(dp, t, loss, loss_scale, err);
    }
    return 0;
}

static int save_batches(dumper *dp, trainer *t, err_t *err) {
    const model_spec *m = &t->cfg.model;
    int64_t B = t->cfg.batch, T = t->tokens;
    st_writer *w = st_writer_new();
    for (int64_t k = 0; k < dp->steps; k++) {
        char a[64], b[64];
        if (arch_of(m->arch)->images) {
            snprintf(a, sizeof a, "step%lld.images", (long long)k);
            snprintf(b, sizeof b, "step%lld.labels", (long long)k);
            st_writer_add(w, a, ST_F32, 4,
                          (int64_t[]){B, m->channels, m->image, m->image}, dp->images[k]);
            st_writer_add(w, b, ST_I32, 1, (int64_t[]){B}, dp->targets[k]);
        } else {
            snprintf(a, sizeof a, "step%lld.inputs", (long long)k);
            snprintf(b, sizeof b, "step%lld.targets", (long long)k);
            st_writer_add(w, a, ST_I32, 2, (int64_t[]){B, T}, dp->inputs[k]);
            st_writer_add(w, b, ST_I32, 2, (int64_t[]){B, T}, dp->targets[k]);
        }
    }
    add_meta(w, t);
    char path[PATH_MAX];
    int rc = path_in(dp, "batches.safetensors", path, err) < 0 ? -1 : st_writer_save(w, path, 0, err);
    st_writer_free(w);
    return rc;
}

int dump_close(dumper *dp, trainer *t, err_t *err) {
    int rc = save_batches(dp, t, err);
    if (rc == 0) rc = save_params(t, dp, "final.safetensors", err);
    for (int64_t k = 0; k < dp->steps; k++) free(dp->inputs[k]), free(dp->targets[k]), free(dp->images[k]);
    free(dp->inputs), free(dp->targets), free(dp->images), free(dp->logits);
    t->logits_out = NULL;
    free(dp->dir);
    free(dp);
    return rc;
}
