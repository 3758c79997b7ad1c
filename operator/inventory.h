/* inventory.h - the GPUs of a cluster's Nodes, as GPU Feature Discovery labels them, filtered by a
 * CephaloJob's constraints and turned into a planner cluster (planner/cluster.h).
 *
 *   labels nvidia.com/gpu.product (e.g. NVIDIA-L4), nvidia.com/gpu.memory (MiB),
 *   nvidia.com/gpu.count; status.allocatable["nvidia.com/gpu"] (preferred for the count).
 *
 * A product the catalog (planner/gpu.h) does not know is planned as the catalog entry nearest in
 * memory, with the memory of the gpu.memory label, and the result is marked estimated. Nodes are
 * taken in name order, so the same Nodes always give the same ranks.
 *
 * Compute capability: labels nvidia.com/gpu.compute.major and .minor, else the catalog's for the
 * product; a GPU whose capability the worker image was not built for (inv_constraints.archs) is
 * left out with a note naming the node, the GPU and its capability. An unknown product without
 * the labels has no known capability: it is kept. */
#ifndef CEPHALO_INVENTORY_H
#define CEPHALO_INVENTORY_H

#include <stdbool.h>

#include <cjson/cJSON.h>

#include "common/err.h"
#include "planner/cluster.h"

#define INV_LABEL_PRODUCT "nvidia.com/gpu.product"
#define INV_LABEL_MEMORY "nvidia.com/gpu.memory"
#define INV_LABEL_COUNT "nvidia.com/gpu.count"
#define INV_LABEL_CC_MAJOR "nvidia.com/gpu.compute.major"
#define INV_LABEL_CC_MINOR "nvidia.com/gpu.compute.minor"
#define INV_RESOURCE_GPU "nvidia.com/gpu"
#define INV_LABEL_HOSTNAME "kubernetes.io/hostname" /* what a worker pod's node affinity names */

/* The architectures of the worker image (the operator's --worker-archs): sm_60 ... sm_90. */
#define INV_DEFAULT_ARCHS "60 61 70 75 80 86 89 90"
#define INV_MAX_ARCHS 32

typedef struct inv_archs {
    int n; /* 0: no restriction */
    int cc[INV_MAX_ARCHS]; /* major*10 + minor, e.g. 86 */
} inv_archs;

/* Parses "60 61 70 ..." (spaces or commas between two-digit numbers like nvcc's sm_XY, major
 * 1..9 and minor 0..9). 0, or -1 with err set naming the item and what was expected. */
int inv_archs_parse(const char *s, inv_archs *out, err_t *err);
/* Whether an image of these archs runs a GPU of compute capability major.minor: some arch of the
 * same major and a minor at most the GPU's (CUDA's binary compatibility within a major). */
bool inv_archs_run(const inv_archs *a, int major, int minor);

/* A pod that holds GPUs, read once (inv_pod_digest): bound to a node, or pinned by hostname
 * and/or node name (inv_pod_pinned); its controller's uid ("" without one); its GPUs. The strings
 * live in the same allocation: free(3) releases it all. */
typedef struct inv_held {
    const char *bound, *host, *name; /* NULL: unset */
    const char *owner;
    long gpus;
} inv_held;

/* The digest of a pod that holds GPUs (inv_pod_holds, inv_pod_gpus > 0), malloc'd; NULL for a
 * pod that holds none. A cache_digest_fn (cache.h) for the store of pods. */
void *inv_pod_digest(const cJSON *pod);

/* What the inventory reads of a Node, read once when the node is stored: the operator's node store
 * keeps it as the node's digest (cache_set_digest), so that every reconcile walks hundreds of
 * nodes without reading their JSON again. inv_node_digest returns one malloc'd block (free). */
typedef struct inv_node {
    const char *name, *host, *product; /* host: inv_node_hostname; product NULL: no product label */
    long count;                        /* allocatable nvidia.com/gpu, else the gpu.count label */
    double mem_mib;                    /* the gpu.memory label; 0: none, or not a number */
    int cc_major, cc_minor;            /* GFD's compute capability labels; 0.0: none */
    bool ready, unschedulable, tainted; /* tainted: it has taints (the job's tolerations decide) */
} inv_node;
void *inv_node_digest(const cJSON *node);

typedef struct inv_constraints {
    const cJSON *allowed_products; /* array of strings, or NULL: any product the catalog knows */
    int max_gpus; /* 0: no limit */
    const cJSON *node_selector; /* object label -> value, or NULL */
    const inv_archs *archs; /* what the worker image runs, or NULL: any compute capability */
    /* GPU accounting: the items of a PodList (every namespace), or NULL: every allocatable GPU is
     * free. A node's free GPUs are its allocatable ones less the requests of the non-terminal
     * pods bound or pinned to it (inv_pod_holds), except pods whose controller is own_uid (a job
     * re-planning counts its own GPUs as its own). */
    const cJSON *pods;
    /* Or the same pods as digests (inv_pod_digest; NULL ones are pods that hold nothing): what
     * the operator's busy-pod store keeps, so that a reconcile does not read every pod again. */
    const inv_held *const *held;
    int n_held;
    const char *own_uid;
    /* The job's spec.tolerations (array, or NULL: none). A node with a NoSchedule or NoExecute
     * taint that none of them tolerates is left out with a note, as kube-scheduler would refuse
     * it; PreferNoSchedule taints are only a preference and do not count. The not-ready,
     * unreachable and unschedulable taints are left to readiness and cordoning above. */
    const cJSON *tolerations;
    /* The nodes' digests (inv_node_digest) in the order of the list inv_build gets, or NULL:
     * inv_build makes them itself. */
    const inv_node *const *nodes_digested;
} inv_constraints;

typedef struct inv_result {
    int gpus; /* devices in the cluster (free ones, at most max_gpus) */
    int usable; /* allocatable GPUs of the usable nodes, busy or not, no max_gpus cap */
    int free; /* of those, the free ones (no max_gpus cap) */
    bool estimated; /* some product was unknown to the catalog */
    char notes[1024]; /* why nodes were skipped or estimated, for messages */
} inv_result;

/* False when the Node's Ready condition is False or Unknown, or (without one) it carries the
 * unreachable taint; a node that reports no Ready condition otherwise counts as ready. */
bool inv_node_ready(const cJSON *node);
/* Kubernetes' rule for one toleration and one taint: the effects match (an empty effect in the
 * toleration matches every effect), and operator Exists with an empty key tolerates every taint,
 * Exists with a key the taint of that key, Equal (the default) the taint of that key and value. */
bool inv_tolerates(const cJSON *toleration, const cJSON *taint);
/* The first NoSchedule or NoExecute taint of the node that no toleration tolerates (the
 * readiness, reachability and cordon taints aside), or NULL. */
const cJSON *inv_untolerated_taint(const cJSON *node, const cJSON *tolerations);
/* Builds `cl` (initialised here) from a NodeList's items. 0, or -1 with the error set when no
 * usable GPU is left (the error says why, e.g. what the nodes have versus what was allowed). With
 * c->pods, usable GPUs that are all busy are no error: 0 with an empty cluster (r->gpus 0). */
int inv_build(const cJSON *nodes, const inv_constraints *c, cluster *cl, inv_result *r, err_t *err);

/* The nvidia.com/gpu a pod requests, by Kubernetes' rule: per container requests, else limits
 * (an extended resource's request defaults to its limit); the pod's is the larger of the sum over
 * containers (plus sidecars: init containers with restartPolicy Always) and the largest init
 * container's (plus the sidecars started before it). */
long inv_pod_gpus(const cJSON *pod);
/* The node's kubernetes.io/hostname label, else its name (in real clusters they may differ). */
const char *inv_node_hostname(const cJSON *node);
/* The one node a pod not yet bound is meant for, by its required node affinity (the way the
 * operator places its workers): the value of kubernetes.io/hostname In [v] and/or of matchFields
 * metadata.name In [name], each with a single value, the same in every nodeSelectorTerm (or a
 * spec.nodeSelector on the hostname). False when it names no node or several: such a pod may land
 * anywhere of them, and no single node's GPUs are charged. host and name may be NULL (unset). */
bool inv_pod_pinned(const cJSON *pod, const char **host, const char **name);
/* Whether a pod charges node: bound to it (spec.nodeName), or, not bound yet, pinned to it
 * (inv_pod_pinned; the hostname value matching the node's hostname label or its name). */
bool inv_pod_on_node(const cJSON *pod, const cJSON *node);
/* For messages: the node a pod is bound to, else the hostname (or name) its affinity pins it to,
 * else NULL. */
const char *inv_pod_node(const cJSON *pod);
/* Whether a pod holds GPUs: not terminal (phase not Succeeded or Failed) and bound, or not yet
 * bound but pinned to one node (an admitted worker the scheduler has not bound yet: charging it
 * keeps a second job off its GPU). */
bool inv_pod_holds(const cJSON *pod);
/* The GPUs held on node (a Node object) by the pods (PodList items), less those of own_uid's pods
 * (NULL: none). */
long inv_node_used(const cJSON *pods, const cJSON *node, const char *own_uid);
/* "2 L4, 1 A10G": the cluster's devices by type, in order of first appearance. */
void inv_describe(const cluster *cl, char *out, size_t n);

#endif
