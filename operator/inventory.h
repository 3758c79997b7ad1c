/* inventory.h - the GPUs of a cluster's Nodes, as GPU Feature Discovery labels them, filtered by a
 * CephaloJob's constraints and turned into a planner cluster (planner/cluster.h).
 *
 *   labels nvidia.com/gpu.product (e.g. NVIDIA-L4), nvidia.com/gpu.memory (MiB),
 *   nvidia.com/gpu.count; status.allocatable["nvidia.com/gpu"] (preferred for the count).
 *
 * A product the catalog (planner/gpu.h) does not know is planned as the catalog entry nearest in
 * memory, with the memory of the gpu.memory label, and the result is marked estimated. Nodes are
 * taken in name order, so the same Nodes always give the same ranks. */
#ifndef CEPHALO_INVENTORY_H
#define CEPHALO_INVENTORY_H

#include <stdbool.h>

#include <cjson/cJSON.h>

#include "cluster.h"
#include "err.h"

#define INV_LABEL_PRODUCT "nvidia.com/gpu.product"
#define INV_LABEL_MEMORY "nvidia.com/gpu.memory"
#define INV_LABEL_COUNT "nvidia.com/gpu.count"
#define INV_RESOURCE_GPU "nvidia.com/gpu"

typedef struct inv_constraints {
    const cJSON *allowed_products; /* array of strings, or NULL: any product the catalog knows */
    int max_gpus; /* 0: no limit */
    const cJSON *node_selector; /* object label -> value, or NULL */
} inv_constraints;

typedef struct inv_result {
    int gpus; /* devices in the cluster */
    bool estimated; /* some product was unknown to the catalog */
    char notes[1024]; /* why nodes were skipped or estimated, for messages */
} inv_result;

/* False when the Node's Ready condition is False or Unknown, or (without one) it carries the
 * unreachable taint; a node that reports no Ready condition otherwise counts as ready. */
bool inv_node_ready(const cJSON *node);
/* Builds `cl` (initialised here) from a NodeList's items. 0, or -1 with the error set when no
 * usable GPU is left (the error says why, e.g. what the nodes have versus what was allowed). */
int inv_build(const cJSON *nodes, const inv_constraints *c, cluster *cl, inv_result *r, err_t *err);

#endif
