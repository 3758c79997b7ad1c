/* cluster.h - the cluster file (docs/formats.md): nodes with GPUs (or emulated CPU devices).
 *
 *   nodes:
 *     - name: node-a
 *       network_gbps: 50          # NIC bandwidth between nodes
 *       intra_gbps: 100           # optional: GPU-to-GPU bandwidth inside the node
 *       gpus: [{type: L4, count: 2}, {type: A6000, count: 1, memory_gib: 46}]
 *     - name: local
 *       gpus: [{type: cpu, count: 2, threads: 1, memory_gib: 2}]
 *
 * After loading, the cluster is flattened into devices in rank order (node order, then list
 * order). */
#ifndef CEPHALO_CLUSTER_H
#define CEPHALO_CLUSTER_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "planner/gpu.h"

#define CLUSTER_DEFAULT_NETWORK_GBPS 25.0
#define CLUSTER_DEFAULT_INTRA_GBPS 100.0
#define CLUSTER_MAX_DEVICES 65536

typedef struct cluster_device {
    int node; /* index into cluster.nodes */
    const gpu_spec *spec; /* catalog entry ("cpu" entry for emulated devices) */
    char type[32]; /* canonical type name, used to group identical devices */
    double memory_bytes; /* capacity after overrides */
    double tflops_override; /* > 0: replaces the catalog's peak for every precision */
    int threads; /* CPU devices: OpenMP threads; 0 for GPUs */
    int cc_major, cc_minor; /* compute capability: the catalog's, or the node's GFD labels */
} cluster_device;

typedef struct cluster_node {
    char name[64];
    double network_gbps;
    double intra_gbps;
    int host_cores; /* the cores its CPU devices share (a local run's host); 0: unknown, as many as they need */
} cluster_node;

typedef struct cluster {
    int n_nodes, n_devices;
    cluster_node *nodes;
    cluster_device *devices;
} cluster;

/* Both return 0, or -1 with an error naming the file, line and field. */
int cluster_load_file(const char *path, cluster *out, err_t *err);
int cluster_load_string(const char *name, const char *text, size_t len, cluster *out, err_t *err);
void cluster_free(cluster *c);

/* Builds a cluster in code (benchmarks, tests): one node per call of cluster_add_node. */
void cluster_init(cluster *c);
int cluster_add_node(cluster *c, const char *name, double network_gbps);
int cluster_add_devices(cluster *c, const char *type, int count, err_t *err);
/* cluster_add_devices for a catalog entry already found (no name lookup). */
int cluster_add_gpus(cluster *c, const gpu_spec *spec, int count, err_t *err);
/* cluster_add_node for nodes added in ascending name order (an inventory of hundreds of nodes):
 * a name not after the last node's is refused (-1) instead of searched for among all of them. */
int cluster_add_sorted_node(cluster *c, const char *name, double network_gbps);
/* dst: the first max_devices devices of src (all when max_devices <= 0) with their nodes, in
 * order. 0, or -1 (out of room). */
int cluster_copy(const cluster *src, int max_devices, cluster *dst);

/* Refuses a precision some GPU of the cluster cannot run (bf16 before compute capability 8.0),
 * naming each such GPU type and what to use instead; `field` is how the user chose the precision
 * ("--precision", "spec.precision"). CPU devices run every precision. 0, or -1 with err set. */
int cluster_check_precision(const cluster *c, precision p, const char *field, err_t *err);

#endif
