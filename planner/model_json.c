/* model_json.c - a model spec as JSON, so plans and checkpoints carry the exact shapes (a model
 * file need not travel with them). */
#include <stdio.h>
#include <string.h>

#include "common/strutil.h"
#include "planner/arch.h"
#include "planner/model_json.h"

#define SPEC_INTS(m)                                                                          \
    {"n_layer", &(m)->n_layer}, {"d_model", &(m)->d_model}, {"n_head", &(m)->n_head},        \
        {"n_kv_head", &(m)->n_kv_head}, {"d_ff", &(m)->d_ff}, {"vocab", &(m)->vocab},        \
        {"max_seq", &(m)->max_seq}, {"default_seq", &(m)->default_seq},                      \
        {"type_vocab", &(m)->type_vocab}, {"image", &(m)->image}, {"patch", &(m)->patch},    \
        {"channels", &(m)->channels}, {                                                      \
        "n_classes", &(m)->n_classes                                                         \
    }

/* "arch": one of the table's names (planner/arch.h), in its order. */
static int json_arch(const json_ctx *c, const cJSON *item, const char *path, model_arch *out) {
    const char *names[ARCH_COUNT + 1];
    for (int i = 0; i < ARCH_COUNT; i++) names[i] = arch_of((model_arch)i)->name;
    names[ARCH_COUNT] = NULL;
    int i;
    if (json_enum(c, item, path, names, &i) < 0) return -1;
    *out = (model_arch)i;
    return 0;
}

typedef struct spec_int {
    const char *key;
    int *v;
} spec_int;

cJSON *model_to_json(const model_spec *m) {
    model_spec copy = *m;
    spec_int ints[] = {SPEC_INTS(&copy)};
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", m->name);
    cJSON_AddStringToObject(o, "arch", arch_of(m->arch)->name);
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        cJSON_AddNumberToObject(o, ints[i].key, *ints[i].v);
    cJSON_AddBoolToObject(o, "tied_head", m->tied_head);
    /* only when set, so the JSON of built-ins (plans, checkpoints) stays as it was */
    if (m->rope_theta > 0) cJSON_AddNumberToObject(o, "rope_theta", m->rope_theta);
    if (m->norm_eps > 0) cJSON_AddNumberToObject(o, "norm_eps", m->norm_eps);
    if (m->qkv_bias) cJSON_AddBoolToObject(o, "qkv_bias", true);
    if (m->sliding_window > 0) cJSON_AddNumberToObject(o, "sliding_window", m->sliding_window);
    if (m->rope_scaling != ROPE_PLAIN) { /* config.json's own keys */
        cJSON *r = cJSON_AddObjectToObject(o, "rope_scaling");
        cJSON_AddStringToObject(r, "rope_type", model_rope_scaling_name(m->rope_scaling));
        cJSON_AddNumberToObject(r, "factor", m->rope_factor);
        if (m->rope_scaling == ROPE_LLAMA3) {
            cJSON_AddNumberToObject(r, "low_freq_factor", m->rope_low_freq);
            cJSON_AddNumberToObject(r, "high_freq_factor", m->rope_high_freq);
            cJSON_AddNumberToObject(r, "original_max_position_embeddings", m->rope_orig_max);
        }
    }
    return o;
}

/* The Llama-family fields model_to_json writes only when set. */
static int family_from_json(const json_ctx *c, const cJSON *o, const char *path, model_spec *m) {
    static const char *const kinds[] = {"none", "linear", "llama3", NULL};
    char at[240];
    const cJSON *item;
    long v;
    snprintf(at, sizeof at, "%s.qkv_bias", path);
    if ((item = json_get(o, "qkv_bias")) && json_bool(c, item, at, &m->qkv_bias) < 0) return -1;
    snprintf(at, sizeof at, "%s.sliding_window", path);
    if ((item = json_get(o, "sliding_window")) && json_int(c, item, at, 1, 1L << 30, &v) < 0) return -1;
    if (item) m->sliding_window = (int)v;
    const cJSON *r = json_get(o, "rope_scaling");
    if (!r) return 0;
    int kind;
    char rs[220];
    snprintf(rs, sizeof rs, "%s.rope_scaling", path);
    snprintf(at, sizeof at, "%s.rope_type", rs);
    if (json_expect_object(c, r, rs) < 0 || json_require(c, r, rs, "rope_type", &item) < 0 ||
        json_enum(c, item, at, kinds, &kind) < 0)
        return -1;
    m->rope_scaling = (rope_scaling_kind)kind;
    const char *keys[] = {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"};
    double vals[4] = {0};
    for (int i = 0; i < (kind == ROPE_LLAMA3 ? 4 : kind == ROPE_LINEAR ? 1 : 0); i++) {
        snprintf(at, sizeof at, "%s.%s", rs, keys[i]);
        if (json_require(c, r, rs, keys[i], &item) < 0 || json_number(c, item, at, 0, 1e12, JSON_OPEN, &vals[i]) < 0)
            return -1;
    }
    m->rope_factor = vals[0], m->rope_low_freq = vals[1], m->rope_high_freq = vals[2];
    m->rope_orig_max = (int)vals[3];
    return 0;
}

int model_from_json(const json_ctx *c, const cJSON *o, const char *path, model_spec *m) {
    memset(m, 0, sizeof *m);
    const cJSON *item;
    const char *name;
    char at[160];
    if (json_expect_object(c, o, path) < 0 || json_require(c, o, path, "name", &item) < 0 ||
        json_string(c, item, path, &name) < 0 || json_require(c, o, path, "arch", &item) < 0 ||
        json_arch(c, item, path, &m->arch) < 0)
        return -1;
    if (str_fmt(m->name, sizeof m->name, c->err, "the model name", "%s", name) < 0) return err_prefix(c->err, "%s: %s: name", c->file, path);
    spec_int ints[] = {SPEC_INTS(m)};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        long v;
        snprintf(at, sizeof at, "%s.%s", path, ints[i].key);
        if (json_require(c, o, path, ints[i].key, &item) < 0 ||
            json_int(c, item, at, 0, 1L << 30, &v) < 0)
            return -1;
        *ints[i].v = (int)v;
    }
    snprintf(at, sizeof at, "%s.tied_head", path);
    if (json_require(c, o, path, "tied_head", &item) < 0 || json_bool(c, item, at, &m->tied_head) < 0)
        return -1;
    double *reals[] = {&m->rope_theta, &m->norm_eps};
    const char *real_keys[] = {"rope_theta", "norm_eps"};
    for (int i = 0; i < 2; i++) {
        item = json_get(o, real_keys[i]);
        if (!item) continue; /* older plans and checkpoints: the architecture's default */
        snprintf(at, sizeof at, "%s.%s", path, real_keys[i]);
        if (!cJSON_IsNumber(item) || !(item->valuedouble > 0))
            return err_set(c->err, "%s: %s: expected a positive number", c->file, at);
        *reals[i] = item->valuedouble;
    }
    if (family_from_json(c, o, path, m) < 0) return -1;
    if (model_validate(m, c->err) < 0) return err_prefix(c->err, "%s: %s", c->file, path);
    return 0;
}
