/* model_file.c - model files: custom shapes in YAML (docs/formats.md).
 *
 *   name: gpt-small-384        # optional, defaults to the file name
 *   base: gpt2-124m            # optional: start from a built-in and override fields
 *   arch: gpt                  # gpt | llama | bert | vit (required without base)
 *   n_layer: 6
 *   d_model: 384
 *   n_head: 6
 *   d_ff: 1536                 # default 4*d_model (llama: required)
 *   vocab: 50257
 *   max_seq: 1024
 *   seq: 256                   # default sequence length for plans
 */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "common/yaml_tree.h"
#include "planner/arch.h"
#include "planner/model.h"

static const char *const model_keys[] = {
    "name", "base", "arch", "n_layer", "d_model", "n_head", "n_kv_head", "d_ff", "vocab",
    "max_seq", "seq", "type_vocab", "tied_head", "image", "patch", "channels", "n_classes",
    "rope_theta", "norm_eps", NULL};

static int parse_arch(const yctx *c, const ynode *n, model_arch *out) {
    const char *s;
    if (ynode_string(c, n, "arch", &s) < 0) return -1;
    if (arch_parse(s, out) == 0) return 0;
    char names[128];
    arch_names_list(names, sizeof names);
    return err_set(c->err, "%s:%d: arch: unknown architecture '%s' (expected %s)", c->file, n->line, s, names);
}

/* Reads an optional integer field into *dst, leaving it unchanged when absent. */
static int opt_int(const yctx *c, const ynode *map, const char *key, long lo, long hi, int *dst) {
    const ynode *n = ymap_get(map, key);
    if (!n) return 0;
    long v;
    if (ynode_int(c, n, key, lo, hi, &v) < 0) return -1;
    *dst = (int)v;
    return 0;
}

/* Defaults for an architecture when the file does not start from a base model. */
static void arch_defaults(model_spec *m, model_arch arch) {
    memset(m, 0, sizeof *m);
    m->arch = arch;
    m->tied_head = arch_of(arch)->tied;
    m->type_vocab = arch_of(arch)->type_vocab;
    if (arch_of(arch)->images) {
        m->image = 224;
        m->patch = 14;
        m->channels = 3;
        m->n_classes = 1000;
    }
}

static int fill_fields(const yctx *c, const ynode *root, model_spec *m) {
    static const struct {
        const char *key;
        size_t off;
        long lo, hi;
    } ints[] = {
        {"n_layer", offsetof(model_spec, n_layer), 1, 4096},
        {"d_model", offsetof(model_spec, d_model), 1, 1 << 17},
        {"n_head", offsetof(model_spec, n_head), 1, 1 << 14},
        {"n_kv_head", offsetof(model_spec, n_kv_head), 1, 1 << 14},
        {"d_ff", offsetof(model_spec, d_ff), 1, 1 << 20},
        {"vocab", offsetof(model_spec, vocab), 2, 1 << 24},
        {"max_seq", offsetof(model_spec, max_seq), 1, 1 << 20},
        {"seq", offsetof(model_spec, default_seq), 1, 1 << 20},
        {"type_vocab", offsetof(model_spec, type_vocab), 0, 1 << 16},
        {"image", offsetof(model_spec, image), 1, 8192},
        {"patch", offsetof(model_spec, patch), 1, 8192},
        {"channels", offsetof(model_spec, channels), 1, 64},
        {"n_classes", offsetof(model_spec, n_classes), 1, 1 << 20},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if (opt_int(c, root, ints[i].key, ints[i].lo, ints[i].hi,
                    (int *)((char *)m + ints[i].off)) < 0)
            return -1;
    const ynode *n = ymap_get(root, "tied_head");
    if (n && ynode_bool(c, n, "tied_head", &m->tied_head) < 0) return -1;
    /* what an imported config.json sets (docs/import.md); absent: the architecture's default */
    if ((n = ymap_get(root, "rope_theta")) && ynode_double(c, n, "rope_theta", 1, 1e12, &m->rope_theta) < 0) return -1;
    if ((n = ymap_get(root, "norm_eps")) && ynode_double(c, n, "norm_eps", 1e-30, 0.1, &m->norm_eps) < 0) return -1;
    return 0;
}

/* Fields that depend on others get their defaults once everything explicit is known. With a
 * base, a derived field follows an overridden one when the base used the default relation
 * (n_kv_head = n_head, d_ff = 4 d_model, seq <= max_seq); an explicit value always wins. */
static int derive_defaults(const yctx *c, const ynode *root, model_spec *m, const model_spec *base) {
    const arch_desc *a = arch_of(m->arch);
    bool given_kv = ymap_get(root, "n_kv_head"), given_ff = ymap_get(root, "d_ff");
    if (!given_kv && (!base || base->n_kv_head == base->n_head)) m->n_kv_head = m->n_head;
    if (!given_ff && base && a->mlp != MLP_SWIGLU && base->d_ff == 4 * base->d_model) m->d_ff = 4 * m->d_model;
    if (!m->d_ff) {
        if (a->mlp == MLP_SWIGLU)
            return err_set(c->err, "%s:%d: missing field 'd_ff' (%s models need the SwiGLU width)",
                           c->file, root->line, a->name);
        m->d_ff = 4 * m->d_model;
    }
    if (!a->images && !ymap_get(root, "seq") && (!m->default_seq || m->default_seq > m->max_seq))
        m->default_seq = m->max_seq < 1024 ? m->max_seq : 1024;
    return 0;
}

static int require_shape(const yctx *c, const ynode *root) {
    static const char *const always[] = {"n_layer", "d_model", "n_head", NULL};
    static const char *const text[] = {"vocab", "max_seq", NULL};
    const ynode *n;
    for (int i = 0; always[i]; i++)
        if (ymap_require(c, root, "model", always[i], &n) < 0) return -1;
    const ynode *a = ymap_get(root, "arch");
    if (a && a->kind == YNODE_SCALAR && strcmp(a->str, "vit") == 0) return 0;
    for (int i = 0; text[i]; i++)
        if (ymap_require(c, root, "model", text[i], &n) < 0) return -1;
    return 0;
}

/* The file name up to its first '.': refused when longer than a name, not cut (two long file
 * names with one start would be one model to the profiles). */
static int default_name(const yctx *c, const ynode *root, model_spec *m) {
    const char *base = strrchr(c->file, '/');
    base = base ? base + 1 : c->file;
    int len = (int)strcspn(base, ".");
    if ((size_t)len >= sizeof m->name)
        return err_set(c->err, "%s:%d: the model name '%.*s' taken from the file name is longer than %zu characters; give the "
                               "model a shorter name: field", c->file, root->line, len, base, sizeof m->name - 1);
    if (len == 0) /* ".yaml", ".hidden.yaml": no name before the first '.' */
        return err_set(c->err, "%s:%d: the file name '%s' gives the model no name (the name is the file name up to its "
                               "first '.'); give the model a name: field", c->file, root->line, base);
    snprintf(m->name, sizeof m->name, "%.*s", len, base);
    return 0;
}

static int model_from_tree(const yctx *c, const ynode *root, model_spec *m) {
    if (ymap_check_keys(c, root, "model", model_keys) < 0) return -1;
    const ynode *base = ymap_get(root, "base");
    const ynode *arch = ymap_get(root, "arch");
    if (base) {
        const char *bname;
        if (ynode_string(c, base, "base", &bname) < 0) return -1;
        int nb;
        const model_spec *b = model_builtins(&nb);
        int found = -1;
        for (int i = 0; i < nb; i++)
            if (strcmp(b[i].name, bname) == 0) found = i;
        if (found < 0) {
            /* Built-in names only: a base that looks like a path must not be loaded as a file
             * (a file naming itself as its base would recurse forever). */
            err_t e2;
            model_unknown(bname, &e2);
            return err_set(c->err, "%s:%d: base: %s", c->file, base->line, e2.msg);
        }
        *m = b[found];
        if (arch) {
            model_arch a;
            if (parse_arch(c, arch, &a) < 0) return -1;
            if (a != m->arch)
                return err_set(c->err, "%s:%d: arch: '%s' differs from base %s's arch '%s'",
                               c->file, arch->line, arch->str, m->name, model_arch_name(m->arch));
        }
    } else {
        char names[128];
        arch_names_list(names, sizeof names);
        if (!arch)
            return err_set(c->err, "%s:%d: missing field 'arch' (%s) or 'base'", c->file, root->line, names);
        model_arch a;
        if (parse_arch(c, arch, &a) < 0) return -1;
        arch_defaults(m, a);
        if (require_shape(c, root) < 0) return -1;
    }
    const ynode *name = ymap_get(root, "name");
    if (!name && default_name(c, root, m) < 0) return -1;
    if (name) {
        const char *s;
        if (ynode_string(c, name, "name", &s) < 0) return -1;
        if (strlen(s) >= sizeof m->name)
            return err_set(c->err, "%s:%d: name: longer than %zu characters", c->file, name->line,
                           sizeof m->name - 1);
        snprintf(m->name, sizeof m->name, "%s", s); /* measured above */
    }
    model_spec before = *m;
    if (fill_fields(c, root, m) < 0) return -1;
    return derive_defaults(c, root, m, base ? &before : NULL);
}

int model_load_string(const char *name, const char *text, size_t len, model_spec *out, err_t *err) {
    ynode *root = ytree_load_string(name, text, len, err);
    if (!root) return -1;
    yctx c = {name, err};
    int rc = model_from_tree(&c, root, out);
    ytree_free(root);
    if (rc == 0 && model_validate(out, err) < 0) return err_prefix(err, "%s", name);
    return rc;
}

int model_load_file(const char *path, model_spec *out, err_t *err) {
    ynode *root = ytree_load_file(path, err);
    if (!root) return -1;
    yctx c = {path, err};
    int rc = model_from_tree(&c, root, out);
    ytree_free(root);
    if (rc == 0 && model_validate(out, err) < 0) return err_prefix(err, "%s", path);
    return rc;
}
