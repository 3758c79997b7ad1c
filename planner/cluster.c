/* cluster.c - loading the cluster file (docs/formats.md) and building clusters in code.
 *
 * The file is read into a yaml_tree first, so every error can name the file, the line and the
 * field path ("cluster.yaml:5: nodes[0].gpus[1].type: ..."). The result is flattened into one
 * device per rank: nodes in file order, then each gpus item `count` times. */
#include "planner/cluster.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/str_map.h"
#include "common/yaml_tree.h"

#define GIB (1024.0 * 1024.0 * 1024.0)
#define MAX_COUNT 4096 /* devices per gpus item */
#define MAX_MEMORY_GIB 4096.0
#define MAX_TFLOPS 1e6
#define MAX_THREADS 1024
#define MAX_NETWORK_GBPS 100000.0
#define MAX_INTRA_GBPS 1e6

/* Field paths in messages ("nodes[3].gpus[1].count"). Each level's buffer is larger than the one
 * it extends, so the paths can never be cut short. */
#define NODE_PATH 32 /* nodes[N] */
#define LIST_PATH 48 /* nodes[N].gpus */
#define ITEM_PATH 80 /* nodes[N].gpus[M] */
#define FIELD_PATH 112 /* nodes[N].gpus[M].key */

void cluster_init(cluster *c) {
    memset(c, 0, sizeof *c);
}

void cluster_free(cluster *c) {
    if (!c) return;
    free(c->nodes);
    free(c->devices);
    memset(c, 0, sizeof *c);
}

/* Arrays grow by doubling; the capacity is implied by the count (next power of two), which keeps
 * the struct exactly as the header defines it. */
static size_t grown_capacity(size_t n) {
    size_t cap = 8;
    while (cap < n) cap *= 2;
    return cap;
}

static void push_node(cluster *c, const char *name, double network_gbps, double intra_gbps) {
    size_t n = (size_t)c->n_nodes;
    if (n == 0 || grown_capacity(n + 1) != grown_capacity(n))
        c->nodes = xrealloc(c->nodes, grown_capacity(n + 1) * sizeof *c->nodes);
    cluster_node *node = &c->nodes[n];
    memset(node, 0, sizeof *node);
    snprintf(node->name, sizeof node->name, "%s", name);
    node->network_gbps = network_gbps;
    node->intra_gbps = intra_gbps;
    c->n_nodes++;
}

/* The device template is copied `count` times onto the last node. Returns -1 (without a message,
 * callers know the context) when the cluster would exceed CLUSTER_MAX_DEVICES. */
static int push_devices(cluster *c, const cluster_device *tmpl, long count) {
    if (count < 1 || count > CLUSTER_MAX_DEVICES - c->n_devices) return -1;
    size_t n = (size_t)c->n_devices, want = n + (size_t)count;
    if (n == 0 || grown_capacity(want) != grown_capacity(n))
        c->devices = xrealloc(c->devices, grown_capacity(want) * sizeof *c->devices);
    for (size_t i = n; i < want; i++) {
        c->devices[i] = *tmpl;
        c->devices[i].node = c->n_nodes - 1;
    }
    c->n_devices = (int)want;
    return 0;
}

static bool node_name_taken(const cluster *c, const char *name) {
    for (int i = 0; i < c->n_nodes; i++)
        if (strcmp(c->nodes[i].name, name) == 0) return true;
    return false;
}

/* A GPU groups by its catalog name; an emulated CPU device by its shape too, since two CPU devices
 * with different threads or memory behave like different GPU types. */
static void device_type_name(cluster_device *d) {
    if (d->threads > 0)
        snprintf(d->type, sizeof d->type, "%s-%dt-%.2fg", GPU_CPU_NAME, d->threads,
                 d->memory_bytes / GIB);
    else
        snprintf(d->type, sizeof d->type, "%s", d->spec->name);
}

/* ---- building in code ---- */

/* A name that fits a node and a positive bandwidth: what both ways of adding a node check. */
static bool node_fits(const cluster *c, const char *name, double network_gbps) {
    return name && name[0] && strlen(name) < sizeof c->nodes[0].name && network_gbps > 0;
}

int cluster_add_node(cluster *c, const char *name, double network_gbps) {
    if (!node_fits(c, name, network_gbps) || node_name_taken(c, name)) return -1;
    push_node(c, name, network_gbps, CLUSTER_DEFAULT_INTRA_GBPS);
    return 0;
}

int cluster_add_sorted_node(cluster *c, const char *name, double network_gbps) {
    if (!node_fits(c, name, network_gbps)) return -1;
    if (c->n_nodes > 0 && strcmp(c->nodes[c->n_nodes - 1].name, name) >= 0) return -1;
    push_node(c, name, network_gbps, CLUSTER_DEFAULT_INTRA_GBPS);
    return 0;
}

int cluster_add_devices(cluster *c, const char *type, int count, err_t *err) {
    const gpu_spec *spec = gpu_find(type, err);
    return spec ? cluster_add_gpus(c, spec, count, err) : -1;
}

int cluster_add_gpus(cluster *c, const gpu_spec *spec, int count, err_t *err) {
    if (c->n_nodes == 0) return err_set(err, "cluster: add a node before its devices");
    /* A CPU device needs threads and a memory size, which only the cluster file can give. */
    if (strcmp(spec->name, GPU_CPU_NAME) == 0)
        return err_set(err, "cluster: cpu devices need threads and memory_gib; describe them in "
                            "a cluster file");
    cluster_device d = {.spec = spec, .memory_bytes = spec->memory_gib * GIB,
                        .cc_major = spec->cc_major, .cc_minor = spec->cc_minor};
    device_type_name(&d);
    if (count < 1) return err_set(err, "cluster: device count must be at least 1, got %d", count);
    if (push_devices(c, &d, count) < 0)
        return err_set(err, "cluster: more than %d devices", CLUSTER_MAX_DEVICES);
    return 0;
}

int cluster_copy(const cluster *src, int max_devices, cluster *dst) {
    cluster_init(dst);
    int n = max_devices > 0 && max_devices < src->n_devices ? max_devices : src->n_devices;
    for (int d = 0; d < n; d++) {
        const cluster_node *node = &src->nodes[src->devices[d].node];
        if (d == 0 || src->devices[d].node != src->devices[d - 1].node)
        {
            push_node(dst, node->name, node->network_gbps, node->intra_gbps);
            dst->nodes[dst->n_nodes - 1].host_cores = node->host_cores;
        }
        if (push_devices(dst, &src->devices[d], 1) < 0) {
            cluster_free(dst);
            return -1;
        }
    }
    return 0;
}

/* ---- the cluster file ---- */

/* A number in (0, hi]. The range is checked here rather than by ynode_double so that the message
 * says 0 itself is refused: no bandwidth, memory or speed can be 0. */
static int get_positive(const yctx *y, const ynode *n, const char *path, double hi, double *out) {
    if (ynode_double(y, n, path, -HUGE_VAL, HUGE_VAL, out) < 0) return -1;
    if (*out > 0 && *out <= hi) return 0;
    return err_set(y->err, "%s:%d: %s: %g is out of range (expected more than 0, at most %g)",
                   y->file, n->line, path, *out, hi);
}

/* An optional positive number: `*out` keeps its default when the key is absent. */
static int opt_positive(const yctx *y, const ynode *map, const char *base, const char *key,
                        double hi, double *out) {
    const ynode *v = ymap_get(map, key);
    if (!v) return 0;
    char path[FIELD_PATH];
    snprintf(path, sizeof path, "%s.%s", base, key);
    return get_positive(y, v, path, hi, out);
}

static int opt_int(const yctx *y, const ynode *map, const char *base, const char *key, long lo,
                   long hi, long *out) {
    const ynode *v = ymap_get(map, key);
    if (!v) return 0;
    char path[FIELD_PATH];
    snprintf(path, sizeof path, "%s.%s", base, key);
    return ynode_int(y, v, path, lo, hi, out);
}

/* The catalog entry for `type`, with the catalog's error placed at the field. */
static const gpu_spec *parse_type(const yctx *y, const ynode *item, const char *base) {
    const ynode *v;
    const char *name;
    char path[FIELD_PATH];
    snprintf(path, sizeof path, "%s.type", base);
    if (ymap_require(y, item, base, "type", &v) < 0 || ynode_string(y, v, path, &name) < 0)
        return NULL;
    const gpu_spec *spec = gpu_find(name, y->err);
    if (!spec) err_prefix(y->err, "%s:%d: %s", y->file, v->line, path);
    return spec;
}

/* CPU-only fields: threads (default 1) and a required memory size. */
static int parse_cpu_fields(const yctx *y, const ynode *item, const char *base,
                            cluster_device *d) {
    long threads = 1;
    if (opt_int(y, item, base, "threads", 1, MAX_THREADS, &threads) < 0) return -1;
    if (!ymap_get(item, "memory_gib"))
        return err_set(y->err, "%s:%d: %s: missing field 'memory_gib' (required for type %s: "
                               "the memory the emulated device may use)",
                       y->file, item->line, base, GPU_CPU_NAME);
    d->threads = (int)threads;
    return 0;
}

/* One `gpus` item: appends its `count` devices to the last node. */
static int parse_gpus_item(const yctx *y, const ynode *item, const char *base, cluster *c) {
    static const char *const keys[] = {"type", "count", "memory_gib", "tflops", "threads", NULL};
    if (ymap_check_keys(y, item, base, keys) < 0) return -1;
    cluster_device d = {.node = c->n_nodes - 1};
    if (!(d.spec = parse_type(y, item, base))) return -1;
    d.cc_major = d.spec->cc_major;
    d.cc_minor = d.spec->cc_minor;

    bool is_cpu = strcmp(d.spec->name, GPU_CPU_NAME) == 0;
    const ynode *threads = ymap_get(item, "threads");
    if (is_cpu && parse_cpu_fields(y, item, base, &d) < 0) return -1;
    if (!is_cpu && threads)
        return err_set(y->err, "%s:%d: %s.threads: only type %s takes 'threads' (a GPU's speed "
                               "comes from the catalog or 'tflops')",
                       y->file, threads->line, base, GPU_CPU_NAME);

    long count = 1;
    double mem_gib = d.spec->memory_gib;
    if (opt_int(y, item, base, "count", 1, MAX_COUNT, &count) < 0 ||
        opt_positive(y, item, base, "memory_gib", MAX_MEMORY_GIB, &mem_gib) < 0 ||
        opt_positive(y, item, base, "tflops", MAX_TFLOPS, &d.tflops_override) < 0)
        return -1;
    d.memory_bytes = floor(mem_gib * GIB); /* whole bytes: the worker reads an integer */
    device_type_name(&d);

    if (push_devices(c, &d, count) < 0) {
        const ynode *at = ymap_get(item, "count");
        return err_set(y->err, "%s:%d: %s.count: the cluster would have more than %d devices",
                       y->file, at ? at->line : item->line, base, CLUSTER_MAX_DEVICES);
    }
    return 0;
}

static int parse_gpus(const yctx *y, const ynode *node, const char *base, cluster *c) {
    const ynode *gpus;
    char path[LIST_PATH];
    snprintf(path, sizeof path, "%s.gpus", base);
    if (ymap_require(y, node, base, "gpus", &gpus) < 0 ||
        ynode_expect(y, gpus, YNODE_SEQ, path) < 0)
        return -1;
    if (gpus->n == 0)
        return err_set(y->err, "%s:%d: %s: expected at least one device", y->file, gpus->line,
                       path);
    for (size_t i = 0; i < gpus->n; i++) {
        char item[ITEM_PATH];
        snprintf(item, sizeof item, "%s[%zu]", path, i);
        if (parse_gpus_item(y, gpus->items[i], item, c) < 0) return -1;
    }
    return 0;
}

/* Node name: required, short enough for cluster_node.name, unique (the names so far in `names`:
 * a file of thousands of nodes is not checked name against name). */
static int parse_node_name(const yctx *y, const ynode *node, const char *base, const cluster *c, str_map *names,
                           const char **out) {
    const ynode *v;
    char path[FIELD_PATH];
    snprintf(path, sizeof path, "%s.name", base);
    if (ymap_require(y, node, base, "name", &v) < 0 || ynode_string(y, v, path, out) < 0)
        return -1;
    /* bytes, not characters: a UTF-8 character takes 1 to 4 */
    if (strlen(*out) >= sizeof c->nodes[0].name)
        return err_set(y->err, "%s:%d: %s: node name is %zu bytes, longer than %zu (UTF-8 characters "
                               "take 1 to 4 bytes each)",
                       y->file, v->line, path, strlen(*out), sizeof c->nodes[0].name - 1);
    if (str_map_put(names, *out, c->n_nodes) >= 0)
        return err_set(y->err, "%s:%d: %s: duplicate node name '%s'", y->file, v->line, path,
                       *out);
    return 0;
}

static int parse_node(const yctx *y, const ynode *node, size_t idx, cluster *c, str_map *names) {
    static const char *const keys[] = {"name", "network_gbps", "intra_gbps", "gpus", NULL};
    char base[NODE_PATH];
    snprintf(base, sizeof base, "nodes[%zu]", idx);
    if (ymap_check_keys(y, node, base, keys) < 0) return -1;
    const char *name;
    double network = CLUSTER_DEFAULT_NETWORK_GBPS, intra = CLUSTER_DEFAULT_INTRA_GBPS;
    if (parse_node_name(y, node, base, c, names, &name) < 0 ||
        opt_positive(y, node, base, "network_gbps", MAX_NETWORK_GBPS, &network) < 0 ||
        opt_positive(y, node, base, "intra_gbps", MAX_INTRA_GBPS, &intra) < 0)
        return -1;
    /* The node goes in first so that its devices can refer to it by index. */
    push_node(c, name, network, intra);
    return parse_gpus(y, node, base, c);
}

static int parse_root(const yctx *y, const ynode *root, cluster *c) {
    static const char *const keys[] = {"nodes", NULL};
    const ynode *nodes;
    if (ymap_check_keys(y, root, "document", keys) < 0 ||
        ymap_require(y, root, "document", "nodes", &nodes) < 0 ||
        ynode_expect(y, nodes, YNODE_SEQ, "nodes") < 0)
        return -1;
    if (nodes->n == 0)
        return err_set(y->err, "%s:%d: nodes: expected at least one node", y->file, nodes->line);
    str_map names = {0};
    int rc = 0;
    for (size_t i = 0; i < nodes->n && rc == 0; i++) rc = parse_node(y, nodes->items[i], i, c, &names);
    str_map_free(&names);
    return rc;
}

/* Parses the tree into a fresh cluster; `out` is only written on success. */
static int load_tree(const char *name, ynode *root, cluster *out, err_t *err) {
    if (!root) return -1;
    yctx y = {.file = name, .err = err};
    cluster c;
    cluster_init(&c);
    int rc = parse_root(&y, root, &c);
    ytree_free(root);
    if (rc < 0) {
        cluster_free(&c);
        return -1;
    }
    *out = c;
    return 0;
}

int cluster_load_string(const char *name, const char *text, size_t len, cluster *out,
                        err_t *err) {
    err_t local;
    if (!err) err = &local;
    /* The YAML loader reports an empty document only when no message is set yet. */
    err->msg[0] = '\0';
    cluster_init(out);
    if (!name) name = "<cluster>";
    if (!text) len = 0;
    return load_tree(name, ytree_load_string(name, text ? text : "", len, err), out, err);
}

int cluster_load_file(const char *path, cluster *out, err_t *err) {
    err_t local;
    if (!err) err = &local;
    err->msg[0] = '\0';
    cluster_init(out);
    if (!path) return err_set(err, "cluster: no file name given");
    return load_tree(path, ytree_load_file(path, err), out, err);
}

/* ---- precision ---- */

/* Appends "T4 (compute capability 7.5)" for each GPU type lacking p, once per type; returns how
 * many types were listed and whether all of them have tensor cores (sm_70+). */
static int list_lacking(const cluster *c, precision p, char *out, size_t n, bool *all_tensor) {
    int listed = 0;
    *all_tensor = true;
    out[0] = '\0';
    str_map seen = {0}; /* "type/major" of the types listed */
    for (int i = 0; i < c->n_devices; i++) {
        const cluster_device *d = &c->devices[i];
        /* a GPU of unknown compute capability (an unknown product without labels) is planned as asked */
        if (d->threads > 0 || d->cc_major <= 0 || gpu_cc_supports(d->cc_major, p)) continue;
        char key[sizeof d->type + 16];
        snprintf(key, sizeof key, "%s/%d", d->type, d->cc_major); /* fits: a type and an int */
        if (str_map_put(&seen, key, i) >= 0) continue; /* listed: a map, not a scan of the devices before */
        size_t len = strlen(out);
        snprintf(out + len, n - len, "%s%s (compute capability %d.%d)", listed ? " and " : "", d->type,
                 d->cc_major, d->cc_minor);
        *all_tensor &= d->cc_major >= 7;
        listed++;
    }
    str_map_free(&seen);
    return listed;
}

int cluster_check_precision(const cluster *c, precision p, const char *field, err_t *err) {
    char who[512];
    bool all_tensor;
    int n = list_lacking(c, p, who, sizeof who, &all_tensor);
    if (n == 0) return 0;
    /* fp16 is the 16-bit precision every GPU runs: with tensor cores from sm_70, and on Pascal
     * at least with 2-byte parameter gathers (half the collective bytes and gather buffers) */
    return err_set(err, "%s %s: %s %s no %s (it needs compute capability %d.0 or later); use %s fp16 (%s) or fp32",
                   field, precision_name(p), who, n == 1 ? "has" : "have", precision_name(p), GPU_BF16_MIN_MAJOR,
                   field, all_tensor ? "tensor cores" : "2-byte parameter gathers; Pascal has no "
                   "tensor cores and runs it at its fp32 rate");
}
