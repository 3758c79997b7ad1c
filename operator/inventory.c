/* inventory.c - Nodes -> planner cluster (inventory.h). */
#include "operator/inventory.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/log.h"
#include "common/str_map.h"
#include "common/strutil.h"
#include "operator/client/kube.h"
#include "operator/phase.h"
#include "planner/gpu.h"


static const char *label(const cJSON *node, const char *key) {
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(node, "metadata"), "labels");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(l, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static void note(inv_result *r, const char *fmt, const char *a, const char *b) {
    size_t n = strlen(r->notes);
    if (n + 4 >= sizeof r->notes) return;
    if (n) n += (size_t)snprintf(r->notes + n, sizeof r->notes - n, "; ");
    if (n < sizeof r->notes) snprintf(r->notes + n, sizeof r->notes - n, fmt, a, b);
}

static bool selector_matches(const cJSON *node, const cJSON *sel) {
    const cJSON *kv;
    cJSON_ArrayForEach(kv, sel) {
        const char *v = label(node, kv->string);
        if (!cJSON_IsString(kv) || !v || strcmp(v, kv->valuestring) != 0) return false;
    }
    return true;
}

/* An allowed entry matches the product label itself or the same catalog entry. */
static bool product_allowed(const char *product, const gpu_spec *spec, const cJSON *allowed) {
    if (!allowed || cJSON_GetArraySize(allowed) == 0) return spec != NULL;
    const cJSON *a;
    cJSON_ArrayForEach(a, allowed) {
        if (!cJSON_IsString(a)) continue;
        if (strcasecmp(a->valuestring, product) == 0) return true;
        err_t e;
        const gpu_spec *as = gpu_find(a->valuestring, &e);
        if (as && spec && as == spec) return true;
    }
    return false;
}

/* The number of GPUs: allocatable nvidia.com/gpu, else the gpu.count label. */
static long gpu_count(const cJSON *node) {
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(node, "status");
    const cJSON *al = cJSON_GetObjectItemCaseSensitive(st, "allocatable");
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(al, INV_RESOURCE_GPU);
    long n;
    if (cJSON_IsString(g) && str_to_long(g->valuestring, &n)) return n;
    if (cJSON_IsNumber(g)) return (long)g->valuedouble;
    const char *c = label(node, INV_LABEL_COUNT);
    if (c && str_to_long(c, &n)) return n;
    return 0;
}

/* The catalog entry nearest in memory, among those of the GPU's compute capability major when it
 * is known (major > 0) and the catalog has one: its rates and bf16 support are the likelier. */
static const gpu_spec *nearest_by_memory(double mib, int major) {
    int n;
    const gpu_spec *cat = gpu_catalog(&n), *best = NULL;
    bool have_major = false;
    for (int i = 0; i < n && major > 0; i++) have_major |= cat[i].cc_major == major;
    for (int i = 0; i < n; i++) {
        if (strcmp(cat[i].name, GPU_CPU_NAME) == 0) continue;
        if (have_major && cat[i].cc_major != major) continue;
        if (!best || fabs(cat[i].memory_gib * 1024 - mib) < fabs(best->memory_gib * 1024 - mib))
            best = &cat[i];
    }
    return best;
}


int inv_archs_parse(const char *s, inv_archs *out, err_t *err) {
    memset(out, 0, sizeof *out);
    const char *p = s ? s : "";
    while (*p) {
        size_t len = strcspn(p, " ,\t");
        if (len == 0) {
            p++;
            continue;
        }
        long v;
        char item[16];
        snprintf(item, sizeof item, "%.*s", (int)(len < 15 ? len : 15), p);
        if (len != 2 || !str_to_long(item, &v) || v < 10)
            return err_set(err, "--worker-archs: '%s' is not an architecture (expected two digits major minor "
                                "like 86 for sm_86, e.g. \"%s\")", item, INV_DEFAULT_ARCHS);
        if (out->n == INV_MAX_ARCHS) return err_set(err, "--worker-archs: more than %d architectures", INV_MAX_ARCHS);
        out->cc[out->n++] = (int)v;
        p += len;
    }
    if (out->n == 0) return err_set(err, "--worker-archs: empty (expected e.g. \"%s\")", INV_DEFAULT_ARCHS);
    return 0;
}

/* Within a major, a cubin for sm_XY runs on every X.Z with Z >= Y (CUDA's binary compatibility);
 * PTX for newer majors is not counted: the image's JIT cache is not something to plan on. */
bool inv_archs_run(const inv_archs *a, int major, int minor) {
    if (!a || a->n == 0) return true;
    for (int i = 0; i < a->n; i++)
        if (a->cc[i] / 10 == major && a->cc[i] % 10 <= minor) return true;
    return false;
}

/* The node's compute capability from GFD's labels; false when they are absent or not numbers. */
static bool label_cc(const cJSON *node, int *major, int *minor) {
    const char *ma = label(node, INV_LABEL_CC_MAJOR), *mi = label(node, INV_LABEL_CC_MINOR);
    long a, b;
    if (!ma || !mi || !str_to_long(ma, &a) || !str_to_long(mi, &b) || a < 1 || a > 99 || b < 0 || b > 99) return false;
    *major = (int)a;
    *minor = (int)b;
    return true;
}

/* The archs as "sm_60 sm_61 ..." for messages. */
static void archs_text(const inv_archs *a, char *out, size_t n) {
    out[0] = '\0';
    for (int i = 0; i < a->n; i++) {
        size_t len = strlen(out);
        snprintf(out + len, n - len, "%ssm_%d", i ? " " : "", a->cc[i]);
    }
}

/* The node's compute capability (the labels say what the GPU is; the catalog what such a product
 * is; unknown: 0.0) and whether the worker image runs it; when not, a note says so. */
static bool image_runs(const inv_node *d, const char *product, const gpu_spec *spec, const inv_archs *archs,
                       int *major, int *minor, inv_result *r) {
    const char *name = d->name;
    *major = d->cc_major > 0 ? d->cc_major : spec ? spec->cc_major : 0;
    *minor = d->cc_major > 0 ? d->cc_minor : spec ? spec->cc_minor : 0;
    if (*major <= 0 || inv_archs_run(archs, *major, *minor)) return true;
    char why[400], list[200];
    archs_text(archs, list, sizeof list);
    snprintf(why, sizeof why, "node %s: %s (compute capability %d.%d) is left out: the worker image is built for %s "
             "(--worker-archs)", name, product, *major, *minor, list);
    note(r, "%s%s", why, "");
    return false;
}

bool inv_node_ready(const cJSON *node) {
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(node, "status"), *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(st, "conditions")) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(c, "type");
        const cJSON *status = cJSON_GetObjectItemCaseSensitive(c, "status");
        if (cJSON_IsString(type) && !strcmp(type->valuestring, "Ready"))
            return cJSON_IsString(status) && !strcmp(status->valuestring, "True");
    }
    const cJSON *t;
    cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(node, "spec"), "taints")) {
        const cJSON *key = cJSON_GetObjectItemCaseSensitive(t, "key");
        /* not node.kubernetes.io/not-ready: the API server puts it on every new Node until the
         * node controller sees the kubelet's Ready (the condition, above, decides then) */
        if (cJSON_IsString(key) && !strcmp(key->valuestring, "node.kubernetes.io/unreachable")) return false;
    }
    return true; /* no Ready condition reported (yet): taken as usable */
}

static const char *item_str(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : "";
}

bool inv_tolerates(const cJSON *tol, const cJSON *taint) {
    const char *teff = item_str(tol, "effect"), *key = item_str(tol, "key"), *op = item_str(tol, "operator");
    if (*teff && strcmp(teff, item_str(taint, "effect")) != 0) return false;
    if (!strcmp(op, "Exists")) return !*key || !strcmp(key, item_str(taint, "key"));
    return !strcmp(key, item_str(taint, "key")) && !strcmp(item_str(tol, "value"), item_str(taint, "value"));
}

/* Taints the inventory leaves to its other checks: readiness (inv_node_ready, which the node
 * lifecycle controller's not-ready taint lags behind), and cordoning (spec.unschedulable). */
static bool taint_handled_elsewhere(const char *key) {
    return !strcmp(key, "node.kubernetes.io/not-ready") || !strcmp(key, "node.kubernetes.io/unreachable") ||
           !strcmp(key, "node.kubernetes.io/unschedulable");
}

const cJSON *inv_untolerated_taint(const cJSON *node, const cJSON *tolerations) {
    const cJSON *taint, *tol;
    cJSON_ArrayForEach(taint, cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(node, "spec"), "taints")) {
        const char *effect = item_str(taint, "effect");
        if (strcmp(effect, "NoSchedule") != 0 && strcmp(effect, "NoExecute") != 0) continue;
        if (taint_handled_elsewhere(item_str(taint, "key"))) continue;
        bool tolerated = false;
        cJSON_ArrayForEach(tol, tolerations) tolerated = tolerated || inv_tolerates(tol, taint);
        if (!tolerated) return taint;
    }
    return NULL;
}

/* One container's nvidia.com/gpu: requests, else limits (the API server defaults an extended
 * resource's request to its limit, but a pod read from elsewhere may lack the default). */
static long container_gpus(const cJSON *ctr) {
    const cJSON *res = cJSON_GetObjectItemCaseSensitive(ctr, "resources");
    static const char *const keys[] = {"requests", "limits"};
    for (int i = 0; i < 2; i++) {
        const cJSON *g = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(res, keys[i]), INV_RESOURCE_GPU);
        long n;
        if (cJSON_IsString(g) && str_to_long(g->valuestring, &n)) return n > 0 ? n : 0;
        if (cJSON_IsNumber(g)) return g->valuedouble > 0 ? (long)g->valuedouble : 0;
    }
    return 0;
}

long inv_pod_gpus(const cJSON *pod) {
    const cJSON *spec = cJSON_GetObjectItemCaseSensitive(pod, "spec"), *c;
    long sum = 0, sidecars = 0, init_max = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(spec, "initContainers")) {
        const cJSON *rp = cJSON_GetObjectItemCaseSensitive(c, "restartPolicy");
        long g = container_gpus(c);
        if (cJSON_IsString(rp) && !strcmp(rp->valuestring, "Always")) { /* a sidecar runs on beside the rest */
            sidecars += g;
            if (sidecars > init_max) init_max = sidecars;
        } else if (g + sidecars > init_max) {
            init_max = g + sidecars;
        }
    }
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(spec, "containers")) sum += container_gpus(c);
    return sum + sidecars > init_max ? sum + sidecars : init_max;
}

static const cJSON *item(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }
static const char *str_item(const cJSON *o, const char *k) {
    const cJSON *v = item(o, k);
    return cJSON_IsString(v) && *v->valuestring ? v->valuestring : NULL;
}
static bool same(const char *a, const char *b) { return a == b || (a && b && !strcmp(a, b)); }

const char *inv_node_hostname(const cJSON *node) {
    const char *h = label(node, INV_LABEL_HOSTNAME);
    return h && *h ? h : kube_meta_str(node, "name");
}

/* v when the requirement is `key In [v]`, one value; NULL otherwise (another key, several values,
 * another operator: it allows more than one node). */
static const char *single_value(const cJSON *req, const char *key) {
    const cJSON *vals = item(req, "values");
    if (!same(str_item(req, "key"), key) || !same(str_item(req, "operator"), "In") || cJSON_GetArraySize(vals) != 1)
        return NULL;
    const cJSON *v = cJSON_GetArrayItem(vals, 0);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* The node one nodeSelectorTerm pins to (its requirements are ANDed: one single-valued hostname or
 * metadata.name requirement is enough, whatever else it asks). */
static bool term_pins(const cJSON *term, const char **host, const char **name) {
    const cJSON *r;
    *host = *name = NULL;
    cJSON_ArrayForEach(r, item(term, "matchExpressions")) if (!*host) *host = single_value(r, INV_LABEL_HOSTNAME);
    cJSON_ArrayForEach(r, item(term, "matchFields")) if (!*name) *name = single_value(r, "metadata.name");
    return *host || *name;
}

bool inv_pod_pinned(const cJSON *pod, const char **host, const char **name) {
    const cJSON *spec = item(pod, "spec"), *t;
    const cJSON *req = item(item(item(spec, "affinity"), "nodeAffinity"), "requiredDuringSchedulingIgnoredDuringExecution");
    const char *h = NULL, *n = NULL;
    int terms = 0;
    /* the terms are ORed: every one must pin, and to the same node */
    cJSON_ArrayForEach(t, item(req, "nodeSelectorTerms")) {
        const char *th, *tn;
        bool pins = term_pins(t, &th, &tn);
        if (!pins || (terms && (!same(h, th) || !same(n, tn)))) {
            h = n = NULL;
            break;
        }
        h = th, n = tn, terms++;
    }
    if (!h) h = str_item(item(spec, "nodeSelector"), INV_LABEL_HOSTNAME);
    if (host) *host = h;
    if (name) *name = n;
    return h || n;
}

bool inv_pod_on_node(const cJSON *pod, const cJSON *node) {
    const char *bound = str_item(item(pod, "spec"), "nodeName"), *name = kube_meta_str(node, "name"), *h, *n;
    if (!name) return false;
    if (bound) return !strcmp(bound, name);
    if (!inv_pod_pinned(pod, &h, &n)) return false;
    return (!h || !strcmp(h, inv_node_hostname(node)) || !strcmp(h, name)) && (!n || !strcmp(n, name));
}

const char *inv_pod_node(const cJSON *pod) {
    const char *bound = str_item(item(pod, "spec"), "nodeName"), *h, *n;
    if (bound) return bound;
    return inv_pod_pinned(pod, &h, &n) ? (h ? h : n) : NULL;
}

bool inv_pod_holds(const cJSON *pod) {
    if (phase_finished(phase_parse(str_item(item(pod, "status"), "phase")))) return false;
    return str_item(item(pod, "spec"), "nodeName") || inv_pod_pinned(pod, NULL, NULL);
}

/* gpu_find normalizes every catalog name it compares: a cluster has a handful of products on
 * hundreds of nodes, so each is looked up once per inventory. */
#define INV_PRODUCT_MEMO 32
typedef struct product_memo {
    const char *product;
    const gpu_spec *spec;
} product_memo;

static const gpu_spec *find_product(product_memo *memo, int *n, const char *product) {
    for (int i = 0; i < *n; i++)
        if (!strcmp(memo[i].product, product)) return memo[i].spec;
    err_t e;
    const gpu_spec *spec = gpu_find(product, &e);
    if (*n < INV_PRODUCT_MEMO) memo[(*n)++] = (product_memo){product, spec};
    return spec;
}

/* Where a held pod is and how many GPUs it takes, for one inventory: from a pod or its digest. */
typedef struct held_pod {
    const char *bound, *host, *name;
    long gpus;
} held_pod;

/* The uid of the pod's controller (ownerReferences, controller true), or NULL. */
static const char *controller_uid(const cJSON *pod) {
    const cJSON *o;
    cJSON_ArrayForEach(o, item(item(pod, "metadata"), "ownerReferences"))
        if (cJSON_IsTrue(item(o, "controller")) && str_item(o, "uid")) return str_item(o, "uid");
    return NULL;
}

/* Whether a pod holds GPUs (inv_pod_holds, inv_pod_gpus > 0), with e its place and GPUs. */
static bool pod_held(const cJSON *pod, held_pod *e) {
    if (!inv_pod_holds(pod)) return false;
    *e = (held_pod){.bound = str_item(item(pod, "spec"), "nodeName"), .gpus = inv_pod_gpus(pod)};
    if (e->gpus <= 0) return false;
    if (!e->bound) inv_pod_pinned(pod, &e->host, &e->name);
    return true;
}

/* A digest as one block (freed with free): a zeroed struct of head bytes, then room for the n
 * strings s (NULL ones take none). */
static void *digest_new(size_t head, const char *const *s, int n) {
    size_t len = head;
    for (int i = 0; i < n; i++) len += s[i] ? strlen(s[i]) + 1 : 0;
    return xcalloc(1, len);
}

/* Copies the strings s into room (digest_new's), each *out[i] pointing at its copy, or
 * NULL for a NULL string. */
static void digest_strings(void *room, const char *const *s, const char **const *out, int n) {
    char *p = room;
    for (int i = 0; i < n; i++) {
        *out[i] = NULL;
        if (!s[i]) continue;
        size_t len = strlen(s[i]) + 1;
        memcpy(p, s[i], len);
        *out[i] = p;
        p += len;
    }
}

void *inv_pod_digest(const cJSON *pod) {
    held_pod e;
    if (!pod_held(pod, &e)) return NULL;
    const char *s[4] = {e.bound, e.host, e.name, controller_uid(pod)};
    inv_held *h = digest_new(sizeof *h, s, 4);
    const char **out[4] = {&h->bound, &h->host, &h->name, &h->owner};
    digest_strings(h + 1, s, out, 4);
    if (!h->owner) h->owner = "";
    h->gpus = e.gpus;
    return h;
}

/* A held pod's place: the node it is bound to, else the hostname it is pinned to, else the node
 * name. Only pods keyed by a node's name or hostname can be on it (held_is_on). */
static const char *held_key(const held_pod *h) {
    return h->bound ? h->bound : h->host ? h->host : h->name;
}

static int by_key(const void *a, const void *b) {
    return strcmp(held_key(a), held_key(b));
}

/* The held pods of c (pods, or their digests) but those of the controller c->own_uid, sorted by
 * place: a node's are found by binary search, not by a pass over every pod (300 nodes, 300 pods). */
static held_pod *held_pods(const inv_constraints *c, int *n) {
    const char *own = c->own_uid && *c->own_uid ? c->own_uid : NULL;
    held_pod *h = xmalloc((size_t)(c->held ? c->n_held : cJSON_GetArraySize(c->pods)) * sizeof *h + sizeof *h);
    *n = 0;
    for (int i = 0; c->held && i < c->n_held; i++) {
        const inv_held *d = c->held[i];
        if (d && !(own && !strcmp(d->owner, own))) h[(*n)++] = (held_pod){d->bound, d->host, d->name, d->gpus};
    }
    const cJSON *p, *pods = c->held ? NULL : c->pods;
    cJSON_ArrayForEach(p, pods) {
        const char *owner = controller_uid(p);
        if (!(own && owner && !strcmp(owner, own)) && pod_held(p, &h[*n])) (*n)++;
    }
    qsort(h, (size_t)*n, sizeof *h, by_key);
    return h;
}

/* Whether a held pod is on the node (name, hostname: its label, else its name): as
 * inv_pod_on_node decides. */
static bool held_is_on(const held_pod *h, const char *name, const char *hostname) {
    if (h->bound) return !strcmp(h->bound, name);
    return (!h->host || !strcmp(h->host, hostname) || !strcmp(h->host, name)) && (!h->name || !strcmp(h->name, name));
}

/* The GPUs of the held pods placed at key that are on the node. */
static long held_at(const held_pod *h, int n, const char *key, const char *name, const char *hostname) {
    int lo = 0, hi = n;
    while (lo < hi) { /* the first pod whose place is not before key */
        int mid = lo + (hi - lo) / 2;
        if (strcmp(held_key(&h[mid]), key) < 0) lo = mid + 1;
        else hi = mid;
    }
    long used = 0;
    for (int i = lo; i < n && !strcmp(held_key(&h[i]), key); i++)
        if (held_is_on(&h[i], name, hostname)) used += h[i].gpus;
    return used;
}

/* The GPUs the held pods (sorted by held_pods) take on the node. */
static long held_on(const held_pod *h, int n, const char *name, const char *hostname) {
    long used = held_at(h, n, name, name, hostname);
    if (strcmp(hostname, name) != 0) used += held_at(h, n, hostname, name, hostname);
    return used;
}

long inv_node_used(const cJSON *pods, const cJSON *node, const char *own_uid) {
    const char *name = kube_meta_str(node, "name");
    if (!name) return 0;
    int n;
    held_pod *h = held_pods(&(inv_constraints){.pods = pods, .own_uid = own_uid}, &n);
    long used = held_on(h, n, name, inv_node_hostname(node));
    free(h);
    return used;
}

void inv_describe(const cluster *cl, char *out, size_t n) {
    int *count = xcalloc((size_t)cl->n_devices + 1, sizeof *count), *first = xcalloc((size_t)cl->n_devices + 1, sizeof *first);
    int k = 0;
    str_map at = {0}; /* type -> its index: counted in one pass, not a pass over the devices for each */
    for (int d = 0; d < cl->n_devices; d++) {
        long i = str_map_put(&at, cl->devices[d].type, k);
        if (i < 0) first[i = k++] = d;
        count[i]++;
    }
    out[0] = '\0';
    for (int i = 0, len = 0; i < k && (size_t)len < n; i++)
        len += snprintf(out + len, n - (size_t)len, "%s%d %s", len ? ", " : "", count[i], cl->devices[first[i]].type);
    str_map_free(&at);
    free(count), free(first);
}

/* ---- nodes as the walk reads them ------------------------------------------------------------ */

void *inv_node_digest(const cJSON *node) {
    const char *s[3] = {kube_meta_str(node, "name"), inv_node_hostname(node), label(node, INV_LABEL_PRODUCT)};
    inv_node *d = digest_new(sizeof *d, s, 3);
    const char **out[3] = {&d->name, &d->host, &d->product};
    digest_strings(d + 1, s, out, 3);
    const cJSON *spec = cJSON_GetObjectItemCaseSensitive(node, "spec");
    d->count = gpu_count(node);
    const char *m = label(node, INV_LABEL_MEMORY);
    if (!m || !str_to_double(m, &d->mem_mib)) d->mem_mib = 0;
    label_cc(node, &d->cc_major, &d->cc_minor);
    d->ready = inv_node_ready(node);
    d->unschedulable = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(spec, "unschedulable"));
    d->tainted = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(spec, "taints")) > 0;
    return d;
}

/* Why a GPU node was left out, counted for the message when no GPU is usable. */
typedef enum { LEFT_CORDONED, LEFT_NOT_READY, LEFT_SELECTOR, LEFT_TAINT, LEFT_PRODUCT, LEFT_UNKNOWN, LEFT_ARCHS,
               LEFT_OTHER, LEFT_N } left_why;
static const char *const left_text[LEFT_N] = {
    "cordoned", "not Ready", "not matching spec.gpus.nodeSelector", "tainted against the job",
    "with a product spec.gpus.allowedProducts leaves out", "with a product the catalog does not know",
    "with GPUs the worker image does not run", "left out for other reasons (above)"};

/* One inv_build: the constraints, what it found so far, and what it needs to say why nothing was. */
typedef struct inv_walk {
    const inv_constraints *c;
    inv_result *r;
    product_memo memo[INV_PRODUCT_MEMO];
    int n_memo;
    held_pod *held; /* the GPUs others' pods hold; NULL: every allocatable GPU is free */
    int n_held;
    int with_gpus, archs_left; /* nodes with GPUs; of them, those the image runs on no GPU of */
    int left[LEFT_N];          /* GPU nodes left out, by why */
    char seen[256]; /* their products, for the message when none is usable */
} inv_walk;

/* One node's GPUs as they would join the cluster. */
typedef struct node_gpus {
    const char *name, *product;
    long count;
    const gpu_spec *spec;
    bool estimated; /* an unknown product planned from its gpu.memory label (mem_mib) */
    double mem_mib;
    int major, minor;
} node_gpus;

/* Whether the job's own constraints leave node g out (not selected by spec.gpus.nodeSelector, a
 * product spec.gpus.allowedProducts does not name, or one the catalog lacks without it): said
 * before the node's state, which does not matter to a job that would not use the node. */
static bool node_not_wanted(inv_walk *w, const cJSON *node, node_gpus *g) {
    if (w->c->node_selector && !selector_matches(node, w->c->node_selector)) return w->left[LEFT_SELECTOR]++, true;
    g->spec = find_product(w->memo, &w->n_memo, g->product);
    if (product_allowed(g->product, g->spec, w->c->allowed_products)) return false;
    bool listed = w->c->allowed_products && cJSON_GetArraySize(w->c->allowed_products) > 0;
    if (!listed) /* an unknown product is planned only where the job names it */
        note(w->r, "node %s: GPU product %s is not in the catalog (cephalo gpus): left out unless "
             "spec.gpus.allowedProducts names it, then planned from its gpu.memory label", g->name, g->product);
    w->left[listed ? LEFT_PRODUCT : LEFT_UNKNOWN]++;
    return true;
}

/* A node its state leaves out (cordoned, not Ready, a taint not tolerated): true, with a note. */
static bool node_left_out(inv_walk *w, const cJSON *node, const inv_node *d) {
    const char *name = d->name;
    if (d->unschedulable) {
        note(w->r, "node %s%s is cordoned", name, "");
        return w->left[LEFT_CORDONED]++, true;
    }
    if (!d->ready) {
        note(w->r, "node %s%s is not Ready", name, "");
        return w->left[LEFT_NOT_READY]++, true;
    }
    const cJSON *taint = d->tainted ? inv_untolerated_taint(node, w->c->tolerations) : NULL;
    if (!taint) return false;
    w->left[LEFT_TAINT]++;
    char t[160];
    snprintf(t, sizeof t, "%.60s%s%.60s:%s", item_str(taint, "key"), *item_str(taint, "value") ? "=" : "",
             item_str(taint, "value"), item_str(taint, "effect"));
    note(w->r, "node %s has the taint %s, which spec.tolerations does not tolerate", name, t);
    return true;
}

/* The GPU type of node g (its product wanted: node_not_wanted set g->spec; the image runs on it):
 * true with g->spec (a catalog GPU, or the nearest by memory for an unknown product with a
 * gpu.memory label). */
static bool node_gpu_type(inv_walk *w, const inv_node *d, node_gpus *g) {
    g->mem_mib = d->mem_mib;
    if (!image_runs(d, g->product, g->spec, w->c->archs, &g->major, &g->minor, w->r)) {
        w->archs_left++;
        return w->left[LEFT_ARCHS]++, false;
    }
    if (!g->spec) {
        if (g->mem_mib <= 0) {
            note(w->r, "node %s: GPU product %s is unknown and has no gpu.memory label", g->name, g->product);
            return w->left[LEFT_OTHER]++, false;
        }
        /* it becomes the device type: a cut one would group other products with it */
        if (strlen(g->product) >= sizeof(((cluster_device *)0)->type)) {
            note(w->r, "node %s: unknown GPU product %s: the name is too long for the planner's device type", g->name,
                 g->product);
            return w->left[LEFT_OTHER]++, false;
        }
        g->spec = nearest_by_memory(g->mem_mib, g->major);
        g->estimated = w->r->estimated = true;
        note(w->r, "node %s: unknown GPU product %s planned from its gpu.memory label", g->name, g->product);
    }
    if (strlen(g->name) >= sizeof(((cluster_node *)0)->name)) {
        note(w->r, "node %s%s: name too long for the planner", g->name, "");
        return w->left[LEFT_OTHER]++, false;
    }
    return true;
}

/* Node g's free GPUs (at most what max_gpus leaves) added to cl; usable and free count them all. */
static int add_node_gpus(inv_walk *w, const inv_node *node, node_gpus *g, cluster *cl, err_t *err) {
    inv_result *r = w->r;
    long count = g->count;
    r->usable += (int)count;
    if (w->held) {
        long used = held_on(w->held, w->n_held, g->name, node->host);
        count = used >= count ? 0 : count - used;
    }
    r->free += (int)count;
    if (w->c->max_gpus > 0 && r->gpus + count > w->c->max_gpus) count = w->c->max_gpus - r->gpus;
    if (count <= 0) return 0; /* busy, or max_gpus reached */
    if (cluster_add_sorted_node(cl, g->name, CLUSTER_DEFAULT_NETWORK_GBPS) < 0)
        return err_set(err, "node %s: cannot add it to the cluster", g->name);
    if (cluster_add_gpus(cl, g->spec, (int)count, err) < 0) return err_prefix(err, "node %s", g->name);
    for (int d = cl->n_devices - (int)count; d < cl->n_devices; d++) {
        if (g->estimated) { /* the product's own name and measured memory, not its stand-in's */
            cl->devices[d].memory_bytes = g->mem_mib * 1024.0 * 1024.0;
            snprintf(cl->devices[d].type, sizeof cl->devices[d].type, "%s", g->product); /* length checked */
        }
        cl->devices[d].cc_major = g->major;
        cl->devices[d].cc_minor = g->minor;
    }
    r->gpus += (int)count;
    return 0;
}

/* One node of the list, in name order: its GPUs added when the job may use them. */
static int walk_node(inv_walk *w, const cJSON *node, const inv_node *d, cluster *cl, err_t *err) {
    node_gpus g = {.name = d->name, .product = d->product, .count = d->count};
    if (!g.name || !g.product || g.count <= 0) return 0;
    w->with_gpus++;
    if (strlen(w->seen) + strlen(g.product) + 3 < sizeof w->seen && !strstr(w->seen, g.product)) {
        if (*w->seen) strcat(w->seen, ", ");
        strcat(w->seen, g.product);
    }
    if (node_not_wanted(w, node, &g) || node_left_out(w, node, d) || !node_gpu_type(w, d, &g)) return 0;
    return add_node_gpus(w, d, &g, cl, err);
}

/* "2 not matching spec.gpus.nodeSelector, 1 cordoned": the GPU nodes left out, by why. */
static void left_counts(const inv_walk *w, char *out, size_t n) {
    size_t len = 0;
    out[0] = '\0';
    for (int i = 0; i < LEFT_N && len < n; i++)
        if (w->left[i]) len += (size_t)snprintf(out + len, n - len, "%s%d %s", len ? ", " : "", w->left[i], left_text[i]);
}

/* Why no GPU is usable: no node has any, the image runs on none, or the constraints match none;
 * when one constraint left out every GPU node, that constraint named (a typo in allowedProducts
 * reads differently from a nodeSelector that matches nothing). */
static int no_usable_gpu(const inv_walk *w, err_t *err) {
    if (w->with_gpus == 0)
        return err_set(err, "no node has GPUs (GPU Feature Discovery label %s and allocatable %s)", INV_LABEL_PRODUCT,
                       INV_RESOURCE_GPU);
    if (w->archs_left > 0)
        return err_set(err, "no usable GPU: the worker image runs none of the GPUs the job may use: %s", w->r->notes);
    char counts[400];
    left_counts(w, counts, sizeof counts);
    const char *sep = *w->r->notes ? "; " : "";
    if (w->left[LEFT_PRODUCT] == w->with_gpus)
        return err_set(err, "no usable GPU: spec.gpus.allowedProducts names none of the products of the %d GPU nodes "
                       "(they have: %s)%s%s", w->with_gpus, w->seen, sep, w->r->notes);
    if (w->left[LEFT_SELECTOR] == w->with_gpus)
        return err_set(err, "no usable GPU: spec.gpus.nodeSelector matches none of the %d GPU nodes (products: %s)%s%s",
                       w->with_gpus, w->seen, sep, w->r->notes);
    return err_set(err, "no usable GPU: of the %d GPU nodes (products: %s), %s%s%s", w->with_gpus, w->seen, counts, sep,
                   w->r->notes);
}

/* A node of the list with its digest: the walk goes in name order. */
typedef struct walk_item {
    const cJSON *node;
    const inv_node *d;
} walk_item;

static int by_name(const void *a, const void *b) {
    const char *x = ((const walk_item *)a)->d->name, *y = ((const walk_item *)b)->d->name;
    return strcmp(x ? x : "", y ? y : "");
}

int inv_build(const cJSON *nodes, const inv_constraints *c, cluster *cl, inv_result *r, err_t *err) {
    memset(r, 0, sizeof *r);
    cluster_init(cl);
    int n = cJSON_GetArraySize(nodes), k = 0, rc = 0;
    walk_item *items = calloc((size_t)(n ? n : 1), sizeof *items);
    if (!items) return err_set(err, "out of memory");
    const cJSON *node;
    cJSON_ArrayForEach(node, nodes) { /* the store's digests, else made here */
        items[k].node = node;
        items[k].d = c->nodes_digested ? c->nodes_digested[k] : inv_node_digest(node);
        k++;
    }
    qsort(items, (size_t)k, sizeof *items, by_name);
    inv_walk w = {.c = c, .r = r};
    if (c->pods || c->held) w.held = held_pods(c, &w.n_held); /* else every allocatable GPU is free */
    for (int i = 0; i < k && rc == 0; i++) rc = walk_node(&w, items[i].node, items[i].d, cl, err);
    bool accounting = c->pods || c->held;
    if (!c->nodes_digested)
        for (int i = 0; i < k; i++) free((void *)items[i].d);
    free(items), free(w.held);
    if (rc == 0 && r->gpus == 0 && !(r->usable > 0 && accounting)) rc = no_usable_gpu(&w, err);
    if (rc < 0) cluster_free(cl);
    return rc; /* all busy (gpus 0, usable > 0): 0, and the caller queues the job */
}
