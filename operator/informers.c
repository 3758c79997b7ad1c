/* informers.c - the operator's watches, their stores and what they queue (informers.h). */
#include "operator/informers.h"

#include <pthread.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "common/log.h"
#include "common/str_map.h"
#include "operator/client/cache.h"
#include "operator/inventory.h"
#include "operator/phase.h"
#include "operator/client/watch.h"

/* One list+watch feeding one store. Kinds that carry the cephalo.dev/job label (the jobs' pods,
 * plans and Services) queue their job on every change; nodes and busy pods, the jobs that may
 * now get GPUs. */
typedef struct informer {
    const informers_ctx *x;
    const char *what;
    const kube_config *cfg;
    watch_opts wo;
    const char *ns; /* the namespace watched (NULL: every one; nodes and busy pods always) */
    char path[KUBE_PATH_MAX];
    char label[96]; /* what, and the namespace: "pods in ml" (messages) */
    enum { INF_JOBS, INF_LABELLED, INF_NODES, INF_BUSY } kind;
    cache *store; /* shared by the watches of one kind, one per namespace */
    atomic_bool listed; /* its first list is in the store */
    pthread_t th;
    bool started;
} informer;

static bool same_item(const cJSON *a, const cJSON *b, const char *key) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(a, key), *y = cJSON_GetObjectItemCaseSensitive(b, key);
    return (!x && !y) || (x && y && cJSON_Compare(x, y, true));
}

/* Whether two versions of a Node differ in what the inventory reads (inventory.h: its labels, any
 * of which a node selector may name; allocatable nvidia.com/gpu; schedulability; taints; readiness). NULL:
 * no version, the node came or went. Status heartbeats change none of these. */
static bool node_differs(const cJSON *a, const cJSON *b) {
    if (!a || !b) return a != b;
    const cJSON *ma = cJSON_GetObjectItemCaseSensitive(a, "metadata"), *mb = cJSON_GetObjectItemCaseSensitive(b, "metadata");
    const cJSON *aa = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(a, "status"), "allocatable");
    const cJSON *ab = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(b, "status"), "allocatable");
    const cJSON *ua = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(a, "spec"), "unschedulable");
    const cJSON *ub = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(b, "spec"), "unschedulable");
    const cJSON *sa = cJSON_GetObjectItemCaseSensitive(a, "spec"), *sb = cJSON_GetObjectItemCaseSensitive(b, "spec");
    return !same_item(ma, mb, "labels") || !same_item(aa, ab, INV_RESOURCE_GPU) ||
           cJSON_IsTrue(ua) != cJSON_IsTrue(ub) || inv_node_ready(a) != inv_node_ready(b) ||
           !same_item(sa, sb, "taints");
}

/* Queues ns/name: due now (a change). */
static void enqueue(const informers_ctx *x, const char *ns, const char *name) {
    if (!ns || !name) return;
    char key[WQ_KEY_MAX]; /* cannot be cut: a namespace is at most 63 characters, a name 253 */
    snprintf(key, sizeof key, "%s/%s", ns, name);
    wq_add(x->queue, key);
}

/* Queues each job of a view of the job store, delay_s from now; releases the view. */
static void enqueue_view(const informers_ctx *x, const cJSON *jobs, cache_view *v, double delay_s) {
    const cJSON *j;
    cJSON_ArrayForEach(j, cJSON_GetObjectItemCaseSensitive(jobs, "items")) {
        char key[WQ_KEY_MAX]; /* as in enqueue */
        snprintf(key, sizeof key, "%s/%s", kube_meta_str(j, "namespace"), kube_meta_str(j, "name"));
        wq_add_after(x->queue, key, delay_s);
    }
    cache_view_release(v);
}

/* Queues every job the job watch knows (its store) that keep keeps, at once, or delay_s later. */
static void enqueue_jobs(const informers_ctx *x, cache_keep_fn keep, double delay_s) {
    cache_view v;
    enqueue_view(x, cache_view_list(x->caches->jobs, keep, NULL, &v), &v, delay_s);
}

static void requeue_all(const informers_ctx *x, const char *why) {
    int n = cache_size(x->caches->jobs);
    if (why && n) log_msg("info", "%s: checking the %d jobs again", why, n);
    enqueue_jobs(x, NULL, 0);
}

static phase job_phase(const cJSON *job) {
    const cJSON *ph = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(job, "status"), "phase");
    return phase_parse(cJSON_IsString(ph) ? ph->valuestring : NULL);
}

static bool is_queued(const cJSON *job, void *arg) {
    (void)arg;
    return job_phase(job) == PHASE_QUEUED;
}

/* Jobs that free GPUs may let start or grow: Queued ones, and live ones with spec.gpus.minGPUs.
 * The job store's index (cache_set_index), made once per stored version of a job: what a burst of
 * busy-pod changes asks of every job would otherwise parse every live job's spec each time. */
#define INF_WAITS_KEY "waits-for-gpus"
static char *job_index(const cJSON *job) {
    phase p = job_phase(job);
    if (p == PHASE_QUEUED) return xstrdup(INF_WAITS_KEY);
    if (!phase_live(p)) return NULL;
    /* spec.gpus.minGPUs (job_spec.h's min_gpus, not given: 0), read alone: the index is made for
     * every stored version of a job, status writes included, and a whole spec parse each time
     * would cost more than the queries it saves */
    const cJSON *gpus = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(job, "spec"), "gpus");
    const cJSON *min = cJSON_GetObjectItemCaseSensitive(gpus, "minGPUs");
    return cJSON_IsNumber(min) && min->valuedouble >= 1 ? xstrdup(INF_WAITS_KEY) : NULL;
}

/* Queues the jobs waiting for GPUs INF_SETTLE_S after the first of a burst of busy-pod changes: the
 * pods of a gang end within moments of each other, and a job that looked at the first one's GPU
 * alone would start small (minGPUs) and re-plan moments later. */
static void enqueue_waiting(const informers_ctx *x) {
    cache_view v;
    enqueue_view(x, cache_view_index(x->caches->jobs, INF_WAITS_KEY, &v), &v, INF_SETTLE_S);
}

/* Whether a job's event is one to reconcile: new, its spec (generation), labels or annotations
 * changed, or being deleted. Status writes (the operator's own, progress among them) are not. */
static bool job_changed(const cJSON *prev, const cJSON *job) {
    if (!prev) return true;
    const cJSON *pm = cJSON_GetObjectItemCaseSensitive(prev, "metadata"), *m = cJSON_GetObjectItemCaseSensitive(job, "metadata");
    return !same_item(pm, m, "generation") || !same_item(pm, m, "deletionTimestamp") ||
           !same_item(pm, m, "labels") || !same_item(pm, m, "annotations");
}

/* Whether a job's event may end a claim a Queued job waits behind (rec_admit.c, queue_blocker): the
 * job left a phase (Queued ahead of others, Restarting its gang), its spec changed (priority,
 * suspend, GPUs) or it is gone. Its own status writes otherwise (progress) are not. */
static bool claim_may_end(const cJSON *prev, const cJSON *job, watch_type t) {
    if (t == WATCH_DELETED || !prev) return t == WATCH_DELETED;
    const cJSON *pm = cJSON_GetObjectItemCaseSensitive(prev, "metadata"), *m = cJSON_GetObjectItemCaseSensitive(job, "metadata");
    return job_phase(prev) != job_phase(job) || !same_item(pm, m, "generation") || !same_item(pm, m, "deletionTimestamp");
}

/* "namespace/job" of an object with the job label, in key; false without one. */
static bool job_key_of(const cJSON *o, char key[WQ_KEY_MAX]) {
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(o, "metadata"), "labels");
    const cJSON *job = cJSON_GetObjectItemCaseSensitive(l, REC_LABEL_JOB);
    const char *ns = kube_meta_str(o, "namespace");
    if (!ns || !cJSON_IsString(job)) return false;
    snprintf(key, WQ_KEY_MAX, "%s/%s", ns, job->valuestring); /* cannot be cut, as in enqueue */
    return true;
}

/* A busy pod's event: one that came or went took or freed GPUs (a status change frees none; an
 * ended pod leaves the busy watch's selection, a DELETED), so the jobs waiting for GPUs look. */
static void busy_event(const informer *w, watch_type t) {
    if (t != WATCH_MODIFIED) enqueue_waiting(w->x);
}

/* prev: the version the store had (nodes only; NULL when it had none). */
static void enqueue_object(const informer *w, const cJSON *o, watch_type t, const cJSON *prev) {
    const char *ns = kube_meta_str(o, "namespace");
    if (w->kind == INF_BUSY) {
        busy_event(w, t);
        return;
    }
    if (w->kind == INF_NODES) {
        if (node_differs(prev, t == WATCH_DELETED ? NULL : o)) {
            char why[300];
            snprintf(why, sizeof why, "node %s %s", kube_meta_str(o, "name"),
                     t == WATCH_DELETED ? "is gone" : t == WATCH_ADDED ? "appeared" : "changed its GPUs or labels");
            requeue_all(w->x, why);
        }
        return;
    }
    if (w->kind == INF_JOBS) {
        const char *name = kube_meta_str(o, "name");
        enqueue(w->x, ns, name); /* deleted too: its reconcile drops its planning, if any */
        return;
    }
    char key[WQ_KEY_MAX];
    if (job_key_of(o, key)) wq_add(w->x->queue, key);
}

static const char *name_of(const cJSON *o) {
    const char *name = kube_meta_str(o, "name");
    return name ? name : "";
}

/* Whether a relist of the nodes (items) differs from the store's (old): a node added, gone, or
 * changed. The old ones are found by name in a map: thousands of nodes are not compared pairwise. */
static bool nodes_changed(const cJSON *old, const cJSON *items) {
    int n = cJSON_GetArraySize(old), k = 0;
    if (cJSON_GetArraySize(items) != n) return true;
    const cJSON **by_index = xmalloc((size_t)n * sizeof *by_index + 1), *o;
    str_map index = {0};
    cJSON_ArrayForEach(o, old) {
        str_map_put(&index, name_of(o), k); /* the first of a name, as a scan would find */
        by_index[k++] = o;
    }
    bool changed = false;
    cJSON_ArrayForEach(o, items) {
        long i = str_map_get(&index, name_of(o));
        if ((changed = node_differs(i >= 0 ? by_index[i] : NULL, o))) break;
    }
    str_map_free(&index);
    free(by_index);
    return changed;
}

static int on_list(const cJSON *items, const char *rv, void *arg, err_t *err) {
    (void)err;
    informer *w = arg;
    log_msg("debug", "%s: listed %d (resourceVersion %s)", w->label, cJSON_GetArraySize(items), rv ? rv : "?");
    bool relist = atomic_load(&w->listed);
    cJSON *old = relist && w->kind == INF_NODES ? cache_list(w->store, NULL, NULL) : NULL;
    cache_replace_ns(w->store, w->ns, items);
    atomic_store(&w->listed, true);
    const cJSON *o;
    if (w->kind == INF_BUSY) {
        if (relist) enqueue_waiting(w->x); /* events may have been missed */
        return 0;
    }
    if (w->kind == INF_NODES) {
        /* a relist: compare it with what the store had (the first list only fills it) */
        bool changed = relist && nodes_changed(cJSON_GetObjectItemCaseSensitive(old, "items"), items);
        cJSON_Delete(old);
        if (changed) requeue_all(w->x, "nodes relisted with changes");
        return 0;
    }
    cJSON_ArrayForEach(o, items) enqueue_object(w, o, WATCH_ADDED, NULL);
    return 0;
}

/* An event of a job's object (pod, plan, Service) or of a busy pod: most of the events there are,
 * so the store takes the object (no copy), and what the queue needs of it is read first. */
static void on_owned_event(informer *w, watch_type t, cJSON *o) {
    char key[WQ_KEY_MAX];
    bool labelled = w->kind == INF_LABELLED && job_key_of(o, key);
    if (t == WATCH_DELETED) {
        cache_remove(w->store, kube_meta_str(o, "namespace"), kube_meta_str(o, "name"));
        cJSON_Delete(o);
    } else if (!cache_put_owned(w->store, o, NULL)) {
        return; /* older than what the store has */
    }
    if (labelled) wq_add(w->x->queue, key);
    else if (w->kind == INF_BUSY) busy_event(w, t);
}

static int on_event(watch_type t, cJSON *o, void *arg, err_t *err) {
    (void)err;
    informer *w = arg;
    log_msg("debug", "%s: %s %s/%s", w->label, watch_type_name(t), kube_meta_str(o, "namespace"), kube_meta_str(o, "name"));
    if (w->kind == INF_LABELLED || w->kind == INF_BUSY) {
        on_owned_event(w, t, o);
        return 0;
    }
    const char *ns = kube_meta_str(o, "namespace"), *name = kube_meta_str(o, "name");
    cJSON *prev = NULL;
    if (t == WATCH_DELETED) {
        if (w->kind == INF_NODES) prev = cache_get(w->store, ns, name);
        cache_remove(w->store, ns, name);
    } else if (!cache_put(w->store, o, w->kind == INF_JOBS || w->kind == INF_NODES ? &prev : NULL)) {
        cJSON_Delete(o);
        return 0; /* older than what the store has */
    }
    if (w->kind != INF_JOBS || t != WATCH_MODIFIED || job_changed(prev, o)) enqueue_object(w, o, t, prev);
    /* the Queued jobs look again at once: what they wait behind may have moved */
    if (w->kind == INF_JOBS && claim_may_end(prev, o, t)) enqueue_jobs(w->x, is_queued, 0);
    cJSON_Delete(prev);
    cJSON_Delete(o);
    return 0;
}

/* A watch that cannot go on stops the operator (its store would go stale). */
static void *watch_main(void *arg) {
    informer *w = arg;
    err_t err = {{0}};
    kube_client *k = kube_client_new(w->cfg, &err);
    if (!k) {
        log_error("%s watch: %s", w->label, err.msg);
        atomic_store(w->x->stop, 1);
        return NULL;
    }
    kube_client_set_stop(k, w->x->stop);
    watch_handler h = {on_list, on_event, w};
    if (watch_run(k, &w->wo, &h, NULL, &err) < 0) {
        log_error("%s watch: %s", w->label, err.msg);
        atomic_store(w->x->stop, 1);
    }
    kube_client_free(k);
    return NULL;
}

static int watch_start(informer *w, err_t *err) {
    w->wo.path = w->path;
    w->wo.stop = w->x->stop;
    if (pthread_create(&w->th, NULL, watch_main, w) != 0) return err_set(err, "cannot start the %s watch thread", w->label);
    w->started = true;
    return 0;
}


/* The kinds watched: per namespace (the jobs, their pods, plans and Services) or cluster-wide (the
 * Nodes, and every namespace's pods that may hold GPUs: the accounting needs them whatever the
 * operator's namespaces are). */
enum { INF_KINDS = 6 };

struct informers {
    informers_ctx x;
    const kube_config *cfg;
    informer *w;
    int n;
    char *namespaces; /* the list's copy, cut into names */
};

informers *informers_new(const kube_config *cfg, const informers_ctx *x) {
    informers *in = xcalloc(1, sizeof *in);
    in->x = *x;
    in->cfg = cfg;
    cache_set_index(x->caches->jobs, job_index); /* before the first list is stored */
    return in;
}

static const struct inf_kind {
    const char *what, *version, *resource;
    int kind;
    bool namespaced;
    size_t store; /* offsetof its store in rec_caches */
} inf_kinds[INF_KINDS] = {
    {"cephalojobs", REC_API_VERSION, "cephalojobs", INF_JOBS, true, offsetof(rec_caches, jobs)},
    {"pods", "v1", "pods", INF_LABELLED, true, offsetof(rec_caches, pods)},
    {"nodes", "v1", "nodes", INF_NODES, false, offsetof(rec_caches, nodes)},
    {"busy pods", "v1", "pods", INF_BUSY, false, offsetof(rec_caches, busy)},
    {"configmaps", "v1", "configmaps", INF_LABELLED, true, offsetof(rec_caches, configmaps)},
    {"services", "v1", "services", INF_LABELLED, true, offsetof(rec_caches, services)},
};

/* Adds kind k's watch of namespace ns (NULL: every namespace) to in->w. */
static int add_watch(informers *in, const struct inf_kind *k, const char *ns, err_t *err) {
    informer *w = &in->w[in->n];
    *w = (informer){.x = &in->x, .cfg = in->cfg, .what = k->what, .kind = k->kind, .ns = ns,
                    .store = *(cache **)((char *)in->x.caches + k->store)};
    if (kube_path(w->path, KUBE_PATH_MAX, k->version, ns, k->resource, NULL, err) < 0) return -1;
    snprintf(w->label, sizeof w->label, "%s%s%s", w->what, ns ? " in " : "", ns ? ns : "");
    if (w->kind == INF_LABELLED) w->wo.label_selector = REC_LABEL_JOB;
    if (w->kind == INF_BUSY) w->wo.field_selector = "status.phase!=Succeeded,status.phase!=Failed";
    in->n++;
    return 0;
}

/* The watches: one of each cluster-wide kind, and of each namespaced kind one per namespace of the
 * list (comma-separated, checked by the caller; NULL or "": one for every namespace). The names
 * point into in->namespaces, kept until informers_join. */
static int add_watches(informers *in, const char *list, err_t *err) {
    int n_ns = 1;
    for (const char *p = list; p && *p; p++) n_ns += *p == ',';
    in->w = xcalloc((size_t)(INF_KINDS * n_ns), sizeof *in->w);
    in->namespaces = list && *list ? xstrdup(list) : NULL;
    const char **ns = xcalloc((size_t)n_ns, sizeof *ns);
    char *save = NULL;
    int k = 0;
    for (char *p = in->namespaces ? strtok_r(in->namespaces, ",", &save) : NULL; p; p = strtok_r(NULL, ",", &save))
        ns[k++] = p;
    int rc = 0;
    for (int i = 0; i < INF_KINDS && rc == 0; i++) {
        const struct inf_kind *kind = &inf_kinds[i];
        if (!kind->namespaced || k == 0) rc = add_watch(in, kind, NULL, err);
        for (int j = 0; kind->namespaced && j < k && rc == 0; j++) rc = add_watch(in, kind, ns[j], err);
    }
    free(ns);
    return rc;
}

int informers_start(informers *in, const char *namespaces, err_t *err) {
    if (add_watches(in, namespaces, err) < 0) {
        log_error("%s", err->msg);
        atomic_store(in->x.stop, 1);
        return 2;
    }
    for (int i = 0; i < in->n && !atomic_load(in->x.stop); i++)
        if (watch_start(&in->w[i], err) < 0) {
            log_error("%s", err->msg);
            atomic_store(in->x.stop, 1);
            return 1;
        }
    return 0;
}

void informers_wait_synced(informers *in) {
    const informers_ctx *x = &in->x;
    while (!atomic_load(x->stop) && !atomic_load(x->synced)) {
        bool synced = true;
        for (int i = 0; i < in->n; i++) synced &= atomic_load(&in->w[i].listed);
        if (synced) {
            atomic_store(x->synced, 1);
            log_msg("info", "watching: %d jobs, %d nodes, %d pods that may hold GPUs", cache_size(x->caches->jobs),
                    cache_size(x->caches->nodes), cache_size(x->caches->busy));
        } else {
            nanosleep(&(struct timespec){0, 20000000L}, NULL);
        }
    }
}

void informers_requeue_all(informers *in, const char *why) { requeue_all(&in->x, why); }

void informers_join(informers *in) {
    if (!in) return;
    for (int i = 0; i < in->n; i++)
        if (in->w[i].started) pthread_join(in->w[i].th, NULL);
    free(in->w);
    free(in->namespaces);
    free(in);
}
