#include "common/yaml_tree.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "common/fileio.h"
#include "common/log.h"
#include "common/str_map.h"
#include "common/strutil.h"

#define YTREE_MAX_DEPTH 64
#define YTREE_MAX_FILE (64u << 20)

static ynode *node_new(ynode_kind kind, int line) {
    ynode *n = xcalloc(1, sizeof *n);
    n->kind = kind;
    n->line = line;
    return n;
}

void ytree_free(ynode *n) {
    if (!n) return;
    for (size_t i = 0; i < n->n; i++) {
        ytree_free(n->items[i]);
        if (n->keys) free(n->keys[i]);
    }
    free(n->items);
    free(n->keys);
    free(n->key_lines);
    free(n->str);
    free(n);
}

/* Appends a child, the arrays doubled when full (n 0, 1, 2, 4, ...), not grown one by one. */
static void node_push(ynode *parent, char *key, int key_line, ynode *child) {
    size_t n = parent->n, cap = n ? 2 * n : 1;
    bool full = (n & (n - 1)) == 0;
    if (full) parent->items = xrealloc(parent->items, cap * sizeof *parent->items);
    if (parent->kind == YNODE_MAP) {
        if (full) parent->keys = xrealloc(parent->keys, cap * sizeof *parent->keys);
        if (full) parent->key_lines = xrealloc(parent->key_lines, cap * sizeof *parent->key_lines);
        parent->keys[parent->n] = key;
        parent->key_lines[parent->n] = key_line;
    }
    parent->items[parent->n++] = child;
}

typedef struct {
    yaml_parser_t parser;
    const char *name;
    const char *text; /* the input, for the line of a reader error */
    size_t len;
    err_t *err;
} loader;

/* libyaml's reader (bad bytes: a NUL, control characters, broken UTF-8) says where only as a byte
 * offset, its mark left at the start: the line and column are counted here. */
static int reader_error(loader *ld) {
    yaml_parser_t *p = &ld->parser;
    size_t off = p->problem_offset < ld->len ? p->problem_offset : ld->len, line = 1, start = 0;
    for (size_t i = 0; i < off; i++)
        if (ld->text[i] == '\n') line++, start = i + 1;
    if (p->problem_value == 0)
        return err_set(ld->err, "%s:%zu:%zu: a NUL byte, which YAML does not allow", ld->name, line, off - start + 1);
    char byte[24] = "";
    if (p->problem_value > 0) snprintf(byte, sizeof byte, " (byte 0x%02x)", (unsigned)p->problem_value & 0xff);
    return err_set(ld->err, "%s:%zu:%zu: YAML syntax error: %s%s", ld->name, line, off - start + 1,
                   p->problem ? p->problem : "unreadable input", byte);
}

static int parse_error(loader *ld) {
    yaml_parser_t *p = &ld->parser;
    if (p->error == YAML_READER_ERROR) return reader_error(ld);
    return err_set(ld->err, "%s:%zu: YAML syntax error: %s%s%s", ld->name,
                   p->problem_mark.line + 1, p->problem ? p->problem : "unknown problem",
                   p->context ? " " : "", p->context ? p->context : "");
}

static ynode *load_node(loader *ld, yaml_event_t *ev, int depth);

/* Whether a mapping has key already: its first keys are compared, a larger one's are found in
 * `seen` (filled on first use), so that a mapping of many keys is not quadratic to load. */
#define YTREE_SCAN_KEYS 8
static bool key_taken(const ynode *col, const char *key, str_map *seen) {
    if (col->n < YTREE_SCAN_KEYS) {
        for (size_t i = 0; i < col->n; i++)
            if (strcmp(col->keys[i], key) == 0) return true;
        return false;
    }
    for (size_t i = seen->n; i < col->n; i++) str_map_put(seen, col->keys[i], (long)i);
    return str_map_get(seen, key) >= 0;
}

static ynode *load_entries(loader *ld, ynode *col, int depth, str_map *seen);

/* Reads events until the end of the collection started by `open`. */
static ynode *load_collection(loader *ld, ynode *col, int depth) {
    str_map seen = {0};
    ynode *n = load_entries(ld, col, depth, &seen);
    str_map_free(&seen);
    return n;
}

static ynode *load_entries(loader *ld, ynode *col, int depth, str_map *seen) {
    for (;;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&ld->parser, &ev)) {
            parse_error(ld);
            ytree_free(col);
            return NULL;
        }
        if (ev.type == YAML_SEQUENCE_END_EVENT || ev.type == YAML_MAPPING_END_EVENT) {
            yaml_event_delete(&ev);
            return col;
        }
        char *key = NULL;
        int key_line = (int)ev.start_mark.line + 1;
        if (col->kind == YNODE_MAP) {
            if (ev.type != YAML_SCALAR_EVENT) {
                err_set(ld->err, "%s:%zu: a mapping key must be a plain scalar", ld->name,
                        ev.start_mark.line + 1);
                yaml_event_delete(&ev);
                ytree_free(col);
                return NULL;
            }
            if (strlen((const char *)ev.data.scalar.value) != ev.data.scalar.length) {
                err_set(ld->err, "%s:%zu: a mapping key contains a NUL character (\\0 or \\u0000)",
                        ld->name, ev.start_mark.line + 1);
                yaml_event_delete(&ev);
                ytree_free(col);
                return NULL;
            }
            key = xstrdup((const char *)ev.data.scalar.value);
            if (key_taken(col, key, seen)) {
                err_set(ld->err, "%s:%zu: duplicate key '%s'", ld->name, ev.start_mark.line + 1, key);
                free(key);
                yaml_event_delete(&ev);
                ytree_free(col);
                return NULL;
            }
            yaml_event_delete(&ev);
            if (!yaml_parser_parse(&ld->parser, &ev)) {
                parse_error(ld);
                free(key);
                ytree_free(col);
                return NULL;
            }
        }
        ynode *child = load_node(ld, &ev, depth + 1);
        if (!child) {
            free(key);
            ytree_free(col);
            return NULL;
        }
        node_push(col, key, key_line, child);
    }
}

/* Builds the node that starts with event `ev` (consumes it). */
static ynode *load_node(loader *ld, yaml_event_t *ev, int depth) {
    int line = (int)ev->start_mark.line + 1;
    if (depth > YTREE_MAX_DEPTH) {
        err_set(ld->err, "%s:%d: document nested deeper than %d levels", ld->name, line,
                YTREE_MAX_DEPTH);
        yaml_event_delete(ev);
        return NULL;
    }
    ynode *n = NULL;
    switch (ev->type) {
    case YAML_SCALAR_EVENT:
        n = node_new(YNODE_SCALAR, line);
        n->len = ev->data.scalar.length;
        n->str = xmalloc(n->len + 1);
        memcpy(n->str, ev->data.scalar.value, n->len + 1);
        n->quoted = ev->data.scalar.style == YAML_SINGLE_QUOTED_SCALAR_STYLE ||
                    ev->data.scalar.style == YAML_DOUBLE_QUOTED_SCALAR_STYLE;
        yaml_event_delete(ev);
        return n;
    case YAML_SEQUENCE_START_EVENT:
        yaml_event_delete(ev);
        return load_collection(ld, node_new(YNODE_SEQ, line), depth);
    case YAML_MAPPING_START_EVENT:
        yaml_event_delete(ev);
        return load_collection(ld, node_new(YNODE_MAP, line), depth);
    case YAML_ALIAS_EVENT:
        err_set(ld->err, "%s:%d: YAML aliases (*name) are not supported; write the value out",
                ld->name, line);
        break;
    default:
        err_set(ld->err, "%s:%d: unexpected YAML event", ld->name, line);
        break;
    }
    yaml_event_delete(ev);
    return NULL;
}

ynode *ytree_load_string(const char *name, const char *text, size_t len, err_t *err) {
    loader ld = {.name = name, .text = text, .len = len, .err = err};
    if (!yaml_parser_initialize(&ld.parser)) {
        err_set(err, "%s: cannot initialise the YAML parser", name);
        return NULL;
    }
    yaml_parser_set_input_string(&ld.parser, (const unsigned char *)text, len);
    ynode *root = NULL;
    bool done = false;
    while (!done) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&ld.parser, &ev)) {
            parse_error(&ld);
            ytree_free(root);
            root = NULL;
            break;
        }
        switch (ev.type) {
        case YAML_STREAM_END_EVENT:
            done = true;
            yaml_event_delete(&ev);
            break;
        case YAML_STREAM_START_EVENT:
        case YAML_DOCUMENT_START_EVENT:
        case YAML_DOCUMENT_END_EVENT:
            yaml_event_delete(&ev);
            break;
        default:
            if (root) {
                err_set(err, "%s:%zu: only one YAML document is expected", name,
                        ev.start_mark.line + 1);
                yaml_event_delete(&ev);
                ytree_free(root);
                root = NULL;
                done = true;
                break;
            }
            root = load_node(&ld, &ev, 0);
            if (!root) done = true;
            break;
        }
    }
    yaml_parser_delete(&ld.parser);
    if (!root && err && !err->msg[0]) err_set(err, "%s: the document is empty", name);
    return root;
}

ynode *ytree_load_file(const char *path, err_t *err) {
    err->msg[0] = '\0';
    size_t len = 0;
    char *buf = file_read_all(path, YTREE_MAX_FILE, &len, err);
    if (!buf) return NULL;
    ynode *root = ytree_load_string(path, buf, len, err);
    free(buf);
    return root;
}

const ynode *ymap_get(const ynode *map, const char *key) {
    if (!map || map->kind != YNODE_MAP) return NULL;
    for (size_t i = 0; i < map->n; i++)
        if (strcmp(map->keys[i], key) == 0) return map->items[i];
    return NULL;
}

const char *ynode_kind_name(ynode_kind k) {
    return k == YNODE_SCALAR ? "a scalar" : k == YNODE_SEQ ? "a list" : "a mapping";
}

int ynode_expect(const yctx *c, const ynode *n, ynode_kind kind, const char *path) {
    if (n->kind != kind)
        return err_set(c->err, "%s:%d: %s: expected %s, got %s", c->file, n->line, path,
                       ynode_kind_name(kind), ynode_kind_name(n->kind));
    /* every getter comes here first: a NUL would cut the value short without a word */
    if (kind == YNODE_SCALAR && strlen(n->str) != n->len)
        return err_set(c->err, "%s:%d: %s: contains a NUL character (\\0 or \\u0000), which is "
                               "not allowed",
                       c->file, n->line, path);
    return 0;
}

int ynode_string(const yctx *c, const ynode *n, const char *path, const char **out) {
    if (ynode_expect(c, n, YNODE_SCALAR, path) < 0) return -1;
    if (!n->str[0])
        return err_set(c->err, "%s:%d: %s: expected a non-empty value", c->file, n->line, path);
    *out = n->str;
    return 0;
}

int ynode_int(const yctx *c, const ynode *n, const char *path, long lo, long hi, long *out) {
    if (ynode_expect(c, n, YNODE_SCALAR, path) < 0) return -1;
    long v;
    if (n->quoted || !str_to_long(n->str, &v))
        return err_set(c->err, "%s:%d: %s: expected an integer, got '%s'", c->file, n->line,
                       path, n->str);
    if (v < lo || v > hi)
        return err_set(c->err, "%s:%d: %s: %ld is out of range (expected %ld..%ld)", c->file,
                       n->line, path, v, lo, hi);
    *out = v;
    return 0;
}

int ynode_double(const yctx *c, const ynode *n, const char *path, double lo, double hi,
                 double *out) {
    if (ynode_expect(c, n, YNODE_SCALAR, path) < 0) return -1;
    double v;
    if (n->quoted || !str_to_double(n->str, &v))
        return err_set(c->err, "%s:%d: %s: expected a number, got '%s'", c->file, n->line, path,
                       n->str);
    if (v < lo || v > hi)
        return err_set(c->err, "%s:%d: %s: %g is out of range (expected %g..%g)", c->file,
                       n->line, path, v, lo, hi);
    *out = v;
    return 0;
}

int ynode_bool(const yctx *c, const ynode *n, const char *path, bool *out) {
    if (ynode_expect(c, n, YNODE_SCALAR, path) < 0) return -1;
    if (!n->quoted && (!strcmp(n->str, "true") || !strcmp(n->str, "yes"))) {
        *out = true;
        return 0;
    }
    if (!n->quoted && (!strcmp(n->str, "false") || !strcmp(n->str, "no"))) {
        *out = false;
        return 0;
    }
    return err_set(c->err, "%s:%d: %s: expected true or false, got '%s'", c->file, n->line, path,
                   n->str);
}

int ymap_check_keys(const yctx *c, const ynode *map, const char *path,
                    const char *const *allowed) {
    if (ynode_expect(c, map, YNODE_MAP, path) < 0) return -1;
    size_t nallowed = 0;
    while (allowed[nallowed]) nallowed++;
    for (size_t i = 0; i < map->n; i++) {
        bool ok = false;
        for (size_t j = 0; j < nallowed && !ok; j++) ok = strcmp(map->keys[i], allowed[j]) == 0;
        if (ok) continue;
        char sugg[256];
        int ns = str_suggest(map->keys[i], allowed, nallowed, 1, sugg, sizeof sugg);
        return err_set(c->err, "%s:%d: %s: unknown field '%s'%s%s%s", c->file,
                       map->key_lines[i], path, map->keys[i], ns ? " (did you mean " : "",
                       ns ? sugg : "", ns ? "?)" : "");
    }
    return 0;
}

int ymap_require(const yctx *c, const ynode *map, const char *path, const char *key,
                 const ynode **out) {
    *out = ymap_get(map, key);
    if (*out) return 0;
    return err_set(c->err, "%s:%d: %s: missing field '%s'", c->file, map->line, path, key);
}
