/* mtok.c - the tokenizer that goes with a model (mtok.h, docs/tokenizer.md "Identity"). */
#include "state/mtok.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/fileio.h"
#include "common/json_util.h"
#include "common/strutil.h"

static bool is_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

int mtok_from_dir(const char *dir, mtok *t, err_t *err) {
    *t = (mtok){0};
    char p[PATH_MAX];
    if (str_fmt(p, sizeof p, err, "the tokenizer path", "%s/%s", dir, MTOK_FILE) < 0) return -1;
    if (!is_file(p)) return 0;
    if (tok_file_identity(p, &t->id, err) < 0) return -1;
    snprintf(t->path, sizeof t->path, "%s", p);
    return 0;
}

/* path without its last component ("." when it has none). */
static void parent(const char *path, char *out, size_t n) {
    snprintf(out, n, "%s", path);
    size_t k = strlen(out);
    while (k > 1 && out[k - 1] == '/') out[--k] = '\0';
    char *slash = strrchr(out, '/');
    if (!slash) snprintf(out, n, ".");
    else if (slash == out) out[1] = '\0';
    else *slash = '\0';
}

/* The tokenizer.json kept beside a checkpoint (mtok.h), whatever it is; *t unknown when none. */
static int kept_for_checkpoint(const char *resolved, mtok *t, err_t *err) {
    char dir[PATH_MAX], up[PATH_MAX];
    if (file_is_dir(resolved)) { /* a step directory: its own files first */
        if (mtok_from_dir(resolved, t, err) < 0 || t->id.kind) return t->id.kind ? 0 : -1;
    }
    parent(resolved, dir, sizeof dir);
    if (mtok_from_dir(dir, t, err) < 0) return -1;
    if (t->id.kind || file_is_dir(resolved)) return 0;
    /* one rank's file of a step directory (CKPT/step_N/rank-R.safetensors): CKPT's; never the
     * directory above any other file, where an unrelated tokenizer.json may lie */
    const char *base = strrchr(dir, '/');
    if (strncmp(base ? base + 1 : dir, "step_", 5)) return 0;
    parent(dir, up, sizeof up);
    return strcmp(up, dir) ? mtok_from_dir(up, t, err) : 0;
}

int mtok_for_checkpoint(const char *resolved, tok_id recorded, mtok *t, err_t *err) {
    if (kept_for_checkpoint(resolved, t, err) < 0) return -1;
    if (!recorded.kind || tok_id_equal(recorded, t->id)) return 0;
    if (!t->id.kind) { /* recorded, no file kept: the identity alone (text needs the file) */
        *t = (mtok){.id = recorded};
        return 0;
    }
    char a[TOK_ID_NAME_MAX], b[TOK_ID_NAME_MAX];
    tok_id_name(t->id, a);
    tok_id_name(recorded, b);
    return err_set(err, "%s is tokenizer %s, but the checkpoint %s was trained with %s (its metadata cephalo.tokenizer): "
                        "not this model's tokenizer (the file was replaced after the checkpoint was written?); put the "
                        "model's own tokenizer.json there, or give it with --tokenizer where the command takes one",
                   t->path, a, resolved, b);
}

void mtok_data_dir(const char *spec, char *out, size_t n) {
    char first[PATH_MAX];
    size_t k = strcspn(spec, ",");
    snprintf(first, sizeof first, "%.*s", (int)k, spec);
    if (file_is_dir(first)) snprintf(out, n, "%s", first);
    else parent(first, out, n);
}

int mtok_for_model(const char *init_from, const char *resolved, tok_id recorded, mtok *t, err_t *err) {
    return init_from ? mtok_from_dir(init_from, t, err) : mtok_for_checkpoint(resolved, recorded, t, err);
}

int mtok_check_data(const mtok *model, const char *model_from, tok_id data, const char *shard, err_t *err) {
    if (!model->id.kind || !data.kind || tok_id_equal(model->id, data)) return 0;
    char a[TOK_ID_NAME_MAX], b[TOK_ID_NAME_MAX];
    tok_id_name(data, a);
    tok_id_name(model->id, b);
    if (model->path[0])
        return err_set(err, "%s: written with tokenizer %s, but the model's tokenizer is %s (%s, %s): tokenize the text "
                            "with it (cephalo data --tokenizer %s)",
                       shard, a, b, model->path, model_from, model->path);
    return err_set(err, "%s: written with tokenizer %s, but the model's tokenizer is %s (%s): not this model's data", shard,
                   a, b, model_from);
}

int mtok_check_vocab(const mtok *t, int vocab, const char *what, err_t *err) {
    if (!t->id.kind || t->id.vocab <= vocab) return 0;
    char a[TOK_ID_NAME_MAX];
    tok_id_name(t->id, a);
    return err_set(err, "%s: the tokenizer %s has %d tokens but %s's vocabulary only %d: not this model's tokenizer",
                   t->path[0] ? t->path : a, a, (int)t->id.vocab, what, vocab);
}

int mtok_keep(const mtok *t, const char *dir, err_t *err) {
    char dst[PATH_MAX];
    if (!t->id.kind) return 0;
    if (str_fmt(dst, sizeof dst, err, "the tokenizer path", "%s/%s", dir, MTOK_FILE) < 0) return -1;
    if (!t->path[0]) {
        tok_id have;
        if (!is_file(dst)) return 0;
        if (tok_file_identity(dst, &have, err) < 0) return -1;
        if (tok_id_equal(have, t->id)) return 0;
        char a[TOK_ID_NAME_MAX], b[TOK_ID_NAME_MAX];
        tok_id_name(have, a);
        tok_id_name(t->id, b);
        return err_set(err, "%s is tokenizer %s, but the model trained here is %s, whose tokenizer.json this run does not "
                            "have: the checkpoints would record %s beside another tokenizer's file; move it away (or give "
                            "the model's tokenizer: --init-from DIR with its tokenizer.json, or data with theirs beside them)",
                       dst, a, b, b);
    }
    if (file_same(t->path, dst)) return 0;
    if (is_file(dst)) {
        tok_id have;
        err_t ignored;
        if (tok_file_identity(dst, &have, &ignored) == 0 && tok_id_equal(have, t->id)) return 0;
    }
    size_t len;
    char *text = file_read_all(t->path, JSON_MAX_FILE, &len, err);
    if (!text) return -1;
    int rc = file_write_atomic(dst, text, len, FILE_OUT_OWN, err);
    free(text);
    return rc;
}
