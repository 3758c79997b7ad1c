/* cache.c - stores of watched objects (cache.h). A flat array (lists walk it in order) indexed by
 * key in a str_map: a store holds the operator's jobs, their pods and plans, and the cluster's
 * nodes and busy pods, thousands of objects in a large cluster, looked up once per event or per
 * reconcile: a scan of the array for each would make a list's worth of events quadratic. */
#include "operator/client/cache.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/str_map.h"
#include "operator/client/kube.h"

/* A stored object, never changed once stored (a newer version replaces it): the store holds one
 * reference, each view another, and the last one frees it. */
struct cache_obj {
    cJSON *json;
    void *digest; /* the store's digest function's, made with the object; NULL: none */
    char *index; /* the store's index key of the object, made with it; NULL: none */
    atomic_int refs;
};

typedef struct cache_entry {
    char *key; /* namespace/name */
    cache_obj *obj;
} cache_entry;

/* Drops metadata.managedFields from obj, in place: the server's field-ownership bookkeeping, about
 * as large as the rest of a pod, which the operator never reads. Stored objects are copied and
 * written back (a status write) without it: an update that leaves it out keeps the server's. */
static cJSON *strip_stored(cJSON *obj) {
    cJSON_DeleteItemFromObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(obj, "metadata"), "managedFields");
    return obj;
}

/* A deep copy of obj as a store keeps it (strip_stored): the members copied one by one, so that
 * managedFields is never copied only to be dropped. */
static cJSON *copy_stored(const cJSON *obj) {
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(obj, "metadata");
    if (!cJSON_GetObjectItemCaseSensitive(meta, "managedFields")) return cJSON_Duplicate(obj, true);
    cJSON *out = cJSON_CreateObject();
    for (const cJSON *c = obj->child; c; c = c->next) {
        cJSON *copy;
        if (c == meta) {
            copy = cJSON_CreateObject();
            for (const cJSON *m = meta->child; m; m = m->next)
                if (strcmp(m->string, "managedFields") != 0) cJSON_AddItemToObject(copy, m->string, cJSON_Duplicate(m, true));
        } else {
            copy = cJSON_Duplicate(c, true);
        }
        cJSON_AddItemToObject(out, c->string, copy);
    }
    return out;
}

struct cache {
    pthread_mutex_t mu;
    const char *what;
    cache_entry *e;
    int n, cap;
    str_map at; /* key -> its index in e */
    bool synced;
    cache_digest_fn digest;
    cache_index_fn index;
};

/* The stored object made of json, which it takes (strip_stored already done). */
static cache_obj *obj_new(const cache *c, cJSON *json) {
    cache_obj *o = xmalloc(sizeof *o);
    o->json = json;
    o->digest = c->digest ? c->digest(o->json) : NULL;
    o->index = c->index ? c->index(o->json) : NULL;
    atomic_init(&o->refs, 1);
    return o;
}

static void obj_release(cache_obj *o) {
    if (o && atomic_fetch_sub(&o->refs, 1) == 1) {
        cJSON_Delete(o->json);
        free(o->digest);
        free(o->index);
        free(o);
    }
}


cache *cache_new(const char *what) {
    cache *c = xmalloc(sizeof *c);
    *c = (cache){.what = what};
    pthread_mutex_init(&c->mu, NULL);
    return c;
}

static void clear_locked(cache *c) {
    for (int i = 0; i < c->n; i++) free(c->e[i].key), obj_release(c->e[i].obj);
    c->n = 0;
    str_map_free(&c->at);
}

void cache_free(cache *c) {
    if (!c) return;
    clear_locked(c);
    free(c->e);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static char *key_of(const char *ns, const char *name) {
    size_t n = (ns ? strlen(ns) : 0) + strlen(name) + 2;
    char *k = xmalloc(n);
    snprintf(k, n, "%s/%s", ns ? ns : "", name);
    return k;
}

static int find_locked(const cache *c, const char *ns, const char *name) {
    char *key = key_of(ns, name);
    long i = str_map_get(&c->at, key);
    free(key);
    return (int)i;
}

/* Stores key -> obj: a new entry, or (a list that names an object twice) in place of the first. */
static void append_locked(cache *c, char *key, cache_obj *obj) {
    long i = str_map_put(&c->at, key, c->n);
    if (i >= 0) {
        free(key), obj_release(c->e[i].obj);
        c->e[i].obj = obj;
        return;
    }
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 64;
        c->e = xrealloc(c->e, (size_t)c->cap * sizeof *c->e);
    }
    c->e[c->n++] = (cache_entry){key, obj};
}

/* Removes entry i: the last one takes its place. */
static void remove_locked(cache *c, int i) {
    str_map_del(&c->at, c->e[i].key);
    free(c->e[i].key);
    obj_release(c->e[i].obj);
    c->e[i] = c->e[--c->n];
    if (i < c->n) str_map_set(&c->at, c->e[i].key, i);
}

void cache_replace(cache *c, const cJSON *items) { cache_replace_ns(c, NULL, items); }

/* Removes the entries of namespace ns (their keys start "ns/"). */
static void clear_ns_locked(cache *c, const char *ns) {
    size_t n = strlen(ns);
    for (int i = c->n - 1; i >= 0; i--)
        if (!strncmp(c->e[i].key, ns, n) && c->e[i].key[n] == '/') remove_locked(c, i);
}

void cache_replace_ns(cache *c, const char *ns, const cJSON *items) {
    pthread_mutex_lock(&c->mu);
    if (ns) clear_ns_locked(c, ns);
    else clear_locked(c);
    const cJSON *o;
    cJSON_ArrayForEach(o, items) {
        const char *name = kube_meta_str(o, "name");
        if (name) append_locked(c, key_of(kube_meta_str(o, "namespace"), name), obj_new(c, copy_stored(o)));
    }
    c->synced = true;
    pthread_mutex_unlock(&c->mu);
}

/* resourceVersion as a number; false when it is not one (then versions are not compared). */
static bool version_of(const cJSON *o, unsigned long long *v) {
    const char *s = kube_meta_str(o, "resourceVersion");
    char *end;
    if (!s || !*s) return false;
    errno = 0;
    *v = strtoull(s, &end, 10);
    return !errno && !*end;
}

bool cache_put_owned(cache *c, cJSON *obj, cJSON **prev) {
    if (prev) *prev = NULL;
    const char *name = kube_meta_str(obj, "name"), *ns = kube_meta_str(obj, "namespace");
    if (!name) {
        cJSON_Delete(obj);
        return false;
    }
    pthread_mutex_lock(&c->mu);
    int i = find_locked(c, ns, name);
    unsigned long long have, got;
    bool stored = true;
    if (i >= 0 && version_of(c->e[i].obj->json, &have) && version_of(obj, &got) && got <= have) {
        /* a late event: the store has a newer version (our own write's answer), or this very one
         * (the watch echoing our write, which the store had from its answer: nothing new) */
        stored = false;
        cJSON_Delete(obj);
    } else if (i >= 0) {
        if (prev) *prev = cJSON_Duplicate(c->e[i].obj->json, true);
        obj_release(c->e[i].obj);
        c->e[i].obj = obj_new(c, strip_stored(obj));
    } else {
        append_locked(c, key_of(ns, name), obj_new(c, strip_stored(obj)));
    }
    pthread_mutex_unlock(&c->mu);
    return stored;
}

bool cache_put(cache *c, const cJSON *obj, cJSON **prev) {
    if (prev) *prev = NULL;
    return kube_meta_str(obj, "name") && cache_put_owned(c, copy_stored(obj), prev);
}

void cache_remove(cache *c, const char *ns, const char *name) {
    if (!name) return;
    pthread_mutex_lock(&c->mu);
    int i = find_locked(c, ns, name);
    if (i >= 0) remove_locked(c, i);
    pthread_mutex_unlock(&c->mu);
}

bool cache_remove_version(cache *c, const char *ns, const char *name, const char *rv) {
    if (!name || !rv) return false;
    pthread_mutex_lock(&c->mu);
    int i = find_locked(c, ns, name);
    const char *have = i >= 0 ? kube_meta_str(c->e[i].obj->json, "resourceVersion") : NULL;
    bool removed = have && !strcmp(have, rv);
    if (removed) remove_locked(c, i);
    pthread_mutex_unlock(&c->mu);
    return removed;
}

cJSON *cache_get(cache *c, const char *ns, const char *name) {
    if (!name) return NULL;
    pthread_mutex_lock(&c->mu);
    int i = find_locked(c, ns, name);
    cJSON *o = i >= 0 ? cJSON_Duplicate(c->e[i].obj->json, true) : NULL;
    pthread_mutex_unlock(&c->mu);
    return o;
}

cJSON *cache_list(cache *c, cache_keep_fn keep, void *arg) {
    cJSON *list = cJSON_CreateObject(), *items = cJSON_AddArrayToObject(list, "items");
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->n; i++)
        if (!keep || keep(c->e[i].obj->json, arg)) cJSON_AddItemToArray(items, cJSON_Duplicate(c->e[i].obj->json, true));
    pthread_mutex_unlock(&c->mu);
    return list;
}

/* Links ref, a reference item to obj (what cJSON_AddItemReferenceToArray makes, but in the view's
 * one block: a view of a thousand nodes per reconcile is not a thousand mallocs and frees), at the
 * end of array. */
static void add_reference(cJSON *array, cJSON *ref, const cJSON *obj) {
    *ref = *obj;
    ref->string = NULL;
    ref->type |= cJSON_IsReference; /* deleting it would leave obj's members alone */
    ref->next = NULL;
    cJSON *first = array->child;
    if (!first) {
        array->child = ref;
        ref->prev = ref;
    } else {
        ref->prev = first->prev; /* cJSON's lists: the first item's prev is the last */
        first->prev->next = ref;
        first->prev = ref;
    }
}

/* The view of the objects kept by keep (when given) whose index key is key (when given). */
static cJSON *view(cache *c, cache_keep_fn keep, void *arg, const char *key, cache_view *v) {
    cJSON *list = cJSON_CreateObject(), *items = cJSON_AddArrayToObject(list, "items");
    pthread_mutex_lock(&c->mu);
    *v = (cache_view){.objs = xmalloc((size_t)(c->n + 1) * sizeof *v->objs), .digested = c->digest != NULL,
                      .refs = xmalloc((size_t)(c->n + 1) * sizeof *v->refs)};
    for (int i = 0; i < c->n; i++) {
        cache_obj *o = c->e[i].obj;
        if (key && (!o->index || strcmp(o->index, key) != 0)) continue;
        if (keep && !keep(o->json, arg)) continue;
        atomic_fetch_add(&o->refs, 1);
        add_reference(items, &v->refs[v->n], o->json);
        v->objs[v->n++] = o;
    }
    pthread_mutex_unlock(&c->mu);
    v->list = list;
    return list;
}

cJSON *cache_view_list(cache *c, cache_keep_fn keep, void *arg, cache_view *v) { return view(c, keep, arg, NULL, v); }

cJSON *cache_view_index(cache *c, const char *key, cache_view *v) { return view(c, NULL, NULL, key, v); }

void cache_set_index(cache *c, cache_index_fn index) {
    pthread_mutex_lock(&c->mu);
    c->index = index;
    pthread_mutex_unlock(&c->mu);
}

void cache_set_digest(cache *c, cache_digest_fn digest) {
    pthread_mutex_lock(&c->mu);
    c->digest = digest;
    pthread_mutex_unlock(&c->mu);
}

const void *cache_view_digest(const cache_view *v, int i) {
    return i >= 0 && i < v->n ? v->objs[i]->digest : NULL;
}

void cache_view_release(cache_view *v) {
    cJSON *items = cJSON_GetObjectItemCaseSensitive(v->list, "items");
    if (items) items->child = NULL; /* its items are v->refs, one block */
    cJSON_Delete(v->list);
    free(v->refs);
    for (int i = 0; i < v->n; i++) obj_release(v->objs[i]);
    free(v->objs);
    *v = (cache_view){0};
}

bool cache_synced(cache *c) {
    pthread_mutex_lock(&c->mu);
    bool s = c->synced;
    pthread_mutex_unlock(&c->mu);
    return s;
}

int cache_size(cache *c) {
    pthread_mutex_lock(&c->mu);
    int n = c->n;
    pthread_mutex_unlock(&c->mu);
    return n;
}
