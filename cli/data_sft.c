/* data_sft.c - fine-tuning examples (JSONL lines) to token ids and loss masks (data_sft.h,
 * docs/data.md "Fine-tuning data"). */
#include "cli/data_sft.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json_util.h"
#include "common/log.h"

static const char *const role_names[SFT_ROLES + 1] = {"system", "user", "assistant", NULL};

void sft_mask_free(sft_mask *m) {
    free(m->v);
    *m = (sft_mask){0};
}

/* Marks every id from mask->n up to ids->n with bit. */
static void mask_fill(sft_mask *m, const tok_ids *ids, uint8_t bit) {
    if (ids->n > m->cap) {
        m->cap = ids->n * 2 + 64;
        m->v = xrealloc(m->v, m->cap);
    }
    for (; m->n < ids->n; m->n++) m->v[m->n] = bit;
}

static void put(const sft_codec *c, const char *s, size_t n, bool special, uint8_t bit, tok_ids *ids, sft_mask *m) {
    tok_encode(c->t, s, n, special, ids);
    mask_fill(m, ids, bit);
}

static void put_id(int32_t id, uint8_t bit, tok_ids *ids, sft_mask *m) {
    tok_ids_push(ids, id);
    mask_fill(m, ids, bit);
}

/* ---- the chat template file ---- */

void sft_template_free(sft_template *t) {
    for (int r = 0; r < SFT_ROLES; r++) free(t->prefix[r]), free(t->suffix[r]);
    *t = (sft_template){0};
}

/* An optional string member (may be empty), copied; "" when absent. */
static int opt_string(const json_ctx *c, const cJSON *obj, const char *path, const char *key, char **out) {
    const cJSON *v = json_get(obj, key);
    if (v && !cJSON_IsString(v))
        return err_set(c->err, "%s: %s.%s: expected a string, got %s", c->file, path, key, json_type_name(v));
    *out = xstrdup(v ? v->valuestring : "");
    return 0;
}

static int opt_bool(const json_ctx *c, const cJSON *obj, const char *path, const char *key, bool *out) {
    const cJSON *v = json_get(obj, key);
    char p[64];
    snprintf(p, sizeof p, "%s%s%s", path, *path ? "." : "", key);
    return v ? json_bool(c, v, p, out) : 0;
}

static int load_roles(const json_ctx *c, const cJSON *roles, sft_template *t) {
    static const char *const entry_keys[] = {"prefix", "suffix", NULL};
    if (json_expect_object(c, roles, "roles") < 0 || json_check_keys(c, roles, "roles", role_names) < 0) return -1;
    for (int r = 0; r < SFT_ROLES; r++) {
        const cJSON *e = json_get(roles, role_names[r]);
        char path[32];
        snprintf(path, sizeof path, "roles.%s", role_names[r]);
        if (!e) continue; /* messages of this role are refused (sft_encode_line) */
        if (json_expect_object(c, e, path) < 0 || json_check_keys(c, e, path, entry_keys) < 0 ||
            opt_string(c, e, path, "prefix", &t->prefix[r]) < 0 || opt_string(c, e, path, "suffix", &t->suffix[r]) < 0)
            return -1;
    }
    if (!t->prefix[SFT_ASSISTANT])
        return err_set(c->err, "%s: roles: missing field 'assistant' (the role whose messages are learned)", c->file);
    return 0;
}

int sft_template_load(const char *path, sft_template *t, err_t *err) {
    static const char *const keys[] = {"bos", "eos", "roles", NULL};
    *t = (sft_template){.eos = true};
    cJSON *root = json_load_file(path, err);
    if (!root) return -1;
    json_ctx c = {path, err};
    const cJSON *roles;
    int rc = json_expect_object(&c, root, "(top level)") < 0 || json_check_keys(&c, root, "", keys) < 0 ||
                     opt_bool(&c, root, "", "bos", &t->bos) < 0 || opt_bool(&c, root, "", "eos", &t->eos) < 0 ||
                     json_require(&c, root, "(top level)", "roles", &roles) < 0 || load_roles(&c, roles, t) < 0
                 ? -1
                 : 0;
    cJSON_Delete(root);
    if (rc < 0) sft_template_free(t);
    return rc;
}

/* ---- one line ---- */

/* A string member (may be empty): "FILE:LINE: missing field 'key' (expected ...)" when absent. */
static int line_string(const json_ctx *c, const cJSON *obj, const char *path, const char *key, const char *expect,
                       const char **out) {
    const cJSON *v = json_get(obj, key);
    if (!v) return err_set(c->err, "%s: %smissing field '%s' (%s)", c->file, path, key, expect);
    if (!cJSON_IsString(v))
        return err_set(c->err, "%s: %s%s: expected a string, got %s", c->file, path, key, json_type_name(v));
    *out = v->valuestring;
    return 0;
}

static int encode_pair(const sft_codec *c, const json_ctx *jc, const cJSON *o, tok_ids *ids, sft_mask *m) {
    const char *prompt, *response;
    if (line_string(jc, o, "", "prompt", "a line is {\"prompt\": ..., \"response\": ...} or {\"messages\": [...]}",
                    &prompt) < 0 ||
        line_string(jc, o, "", "response", "the text learned after the prompt", &response) < 0)
        return -1;
    if (c->pair_bos) put_id(c->bos, 0, ids, m);
    put(c, prompt, strlen(prompt), c->special, 0, ids, m);
    put(c, response, strlen(response), c->special, 1, ids, m);
    put_id(c->eos, 1, ids, m);
    return 0;
}

static int encode_messages(const sft_codec *c, const json_ctx *jc, const cJSON *msgs, tok_ids *ids, sft_mask *m) {
    const sft_template *t = c->tmpl;
    int n;
    if (!t)
        return err_set(jc->err, "%s: a \"messages\" line needs --chat-template FILE (how roles become text)", jc->file);
    if (json_expect_array(jc, msgs, "messages", &n) < 0) return -1;
    if (n == 0) return err_set(jc->err, "%s: messages: empty (expected at least one assistant message)", jc->file);
    if (t->bos) put_id(c->bos, 0, ids, m);
    int last = -1, learned = 0, i = -1;
    const cJSON *e;
    cJSON_ArrayForEach(e, msgs) { /* one pass: cJSON_GetArrayItem walks the list from its start */
        char path[40];
        i++;
        snprintf(path, sizeof path, "messages[%d].", i);
        if (!cJSON_IsObject(e))
            return err_set(jc->err, "%s: messages[%d]: expected an object {\"role\": ..., \"content\": ...}, got %s",
                           jc->file, i, json_type_name(e));
        const char *role, *content;
        if (line_string(jc, e, path, "role", "system, user or assistant", &role) < 0 ||
            line_string(jc, e, path, "content", "the message's text", &content) < 0)
            return -1;
        int r = 0;
        while (r < SFT_ROLES && strcmp(role, role_names[r])) r++;
        if (r == SFT_ROLES)
            return err_set(jc->err, "%s: %srole: \"%s\" (expected system, user or assistant)", jc->file, path, role);
        if (!t->prefix[r])
            return err_set(jc->err, "%s: %srole: \"%s\" is not in the chat template's roles", jc->file, path, role);
        uint8_t bit = r == SFT_ASSISTANT;
        put(c, t->prefix[r], strlen(t->prefix[r]), true, 0, ids, m);
        put(c, content, strlen(content), c->special, bit, ids, m);
        put(c, t->suffix[r], strlen(t->suffix[r]), true, bit, ids, m);
        last = r;
        learned += bit;
    }
    if (!learned)
        return err_set(jc->err, "%s: messages: no assistant message (nothing to learn from the example)", jc->file);
    if (t->eos) put_id(c->eos, last == SFT_ASSISTANT, ids, m);
    return 0;
}

/* The first token of an example is never a target: in the packed stream the loss there would
 * predict it from the previous example's last token, across the boundary (docs/data.md
 * "Packing"). A prompt is what usually starts an example; an empty prompt without --bos (or a
 * first message whose template prefix is empty) would start it with a token of the response, so
 * the mask of the first token is cleared whatever it is. An example left with no token to learn
 * is refused: it would only add tokens that weigh nothing. */
static int first_not_learned(const char *name, bool chat, sft_mask *m, err_t *err) {
    if (m->n) m->v[0] = 0;
    for (size_t i = 0; i < m->n; i++)
        if (m->v[i]) return 0;
    if (chat)
        return err_set(err, "%s: messages: no token to learn (the assistant messages and their template suffixes encode to "
                            "no token but the example's first, which is never learned: it would be predicted from the "
                            "previous example)", name);
    return err_set(err, "%s: the prompt and the response are both empty: no token to learn (the example's only token, "
                        "its EOS, would be predicted from the previous example; give a prompt, a response or --bos)", name);
}

int sft_encode_line(const sft_codec *c, const char *file, long lineno, const char *line, size_t len, tok_ids *ids,
                    sft_mask *mask, err_t *err) {
    char name[4200];
    snprintf(name, sizeof name, "%s:%ld", file, lineno);
    ids->n = 0;
    mask->n = 0;
    cJSON *o = json_parse(name, line, len, err); /* a key twice is refused (json_util.h) */
    if (!o) return -1;
    json_ctx jc = {name, err};
    int rc;
    bool chat = json_get(o, "messages") != NULL;
    if (!cJSON_IsObject(o))
        rc = err_set(err, "%s: expected an object {\"prompt\": ..., \"response\": ...} or {\"messages\": [...]}, got %s",
                     name, json_type_name(o));
    else if (chat)
        rc = encode_messages(c, &jc, json_get(o, "messages"), ids, mask);
    else
        rc = encode_pair(c, &jc, o, ids, mask);
    cJSON_Delete(o);
    return rc < 0 ? -1 : first_not_learned(name, chat, mask, err);
}
