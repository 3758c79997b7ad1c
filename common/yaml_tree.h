/* yaml_tree.h - a YAML document loaded (with libyaml) into a small tree that keeps line numbers,
 * plus typed getters whose errors name the file, the line and the field path.
 *
 *   ynode *root = ytree_load_file("cluster.yaml", &err);   // or ytree_load_string()
 *   const ynode *nodes = ymap_get(root, "nodes");
 *   long count; if (ynode_int(n, ctx, "nodes[0].gpus[1].count", 1, 4096, &count) < 0) ...
 *
 * Anchors are allowed, aliases are refused (they make line numbers ambiguous). */
#ifndef CEPHALO_YAML_TREE_H
#define CEPHALO_YAML_TREE_H

#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"

typedef enum { YNODE_SCALAR, YNODE_SEQ, YNODE_MAP } ynode_kind;

typedef struct ynode {
    ynode_kind kind;
    int line; /* 1-based */
    char *str; /* scalar text */
    size_t len; /* bytes of str: more than strlen(str) when the scalar holds a NUL ("\0", "\u0000"),
                 * which every getter refuses: C strings would silently end there */
    bool quoted; /* scalar was quoted ("3" is a string, 3 a number) */
    size_t n; /* items in a sequence or pairs in a map */
    struct ynode **items; /* sequence items, or map values */
    char **keys; /* map keys (NULL for sequences) */
    int *key_lines; /* each key's line: a value that is a block mapping or list starts below it */
} ynode;

/* What the getters need to write an error: the file name used in messages. */
typedef struct yctx {
    const char *file;
    err_t *err;
} yctx;

ynode *ytree_load_file(const char *path, err_t *err);
ynode *ytree_load_string(const char *name, const char *text, size_t len, err_t *err);
void ytree_free(ynode *n);

const ynode *ymap_get(const ynode *map, const char *key);
const char *ynode_kind_name(ynode_kind k);

/* Each getter checks the node's kind and range and fills an error naming file:line and path; a
 * scalar holding a NUL character is refused by all of them. */
int ynode_expect(const yctx *c, const ynode *n, ynode_kind kind, const char *path);
int ynode_string(const yctx *c, const ynode *n, const char *path, const char **out);
int ynode_int(const yctx *c, const ynode *n, const char *path, long lo, long hi, long *out);
int ynode_double(const yctx *c, const ynode *n, const char *path, double lo, double hi,
                 double *out);
int ynode_bool(const yctx *c, const ynode *n, const char *path, bool *out);

/* Refuses keys not in `allowed` (NULL-terminated), suggesting the nearest allowed key. */
int ymap_check_keys(const yctx *c, const ynode *map, const char *path, const char *const *allowed);

/* A required key: error "file:line: path: missing field 'key'" when absent. */
int ymap_require(const yctx *c, const ynode *map, const char *path, const char *key,
                 const ynode **out);

#endif
