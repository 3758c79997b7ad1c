/* cache.h - what the operator's watches saw, for the reconcile to read instead of asking the API
 * server (client-go's informers): one store per kind of object, keyed by namespace/name.
 *
 * The watch threads feed a store (cache_replace after every list, cache_put / cache_remove per
 * event); the reconcile thread reads copies (cache_get, cache_list) and puts the API server's
 * answers to its own writes (cache_put), so that the next reconcile sees them even before the
 * watch delivers them: a job admitted a moment ago holds its GPUs for the next job's accounting.
 * A store keeps the newer of two versions of an object (resourceVersion, compared as a number when
 * both are numbers, as etcd's revisions are), so a late watch event does not undo a write.
 *
 * A stored object leaves out metadata.managedFields, which the operator never reads (client-go
 * operators strip it with an informer transform for the same reason): it is as large as the rest
 * of a pod, and every copy and status write would carry it.
 *
 * Thread-safe: one mutex per store; readers get deep copies they own, or views of the stored
 * objects (cache_view_list), which are never changed once stored. */
#ifndef CEPHALO_CACHE_H
#define CEPHALO_CACHE_H

#include <stdbool.h>

#include <cjson/cJSON.h>

typedef struct cache cache;

/* `what` names the store in messages ("pods"); it is not copied. */
cache *cache_new(const char *what);
void cache_free(cache *c);

/* The complete current state from a list (items: the list's array): replaces everything. */
void cache_replace(cache *c, const cJSON *items);
/* The same for the objects of namespace ns only (a store fed by one watch per namespace: the
 * operator watching a list of namespaces); the other namespaces' objects stay. ns NULL: every one
 * (cache_replace). */
void cache_replace_ns(cache *c, const char *ns, const cJSON *items);
/* Stores a copy of obj (an ADDED or MODIFIED object, or a write's answer) unless the store holds
 * this version of it or a newer one (resourceVersions that are numbers: an event echoing the
 * operator's own write brings nothing the write's answer did not). *prev (may be NULL) gets the
 * version it replaced, or NULL; the caller frees it. true when obj was stored: something new. */
bool cache_put(cache *c, const cJSON *obj, cJSON **prev);
/* cache_put of obj itself, no copy (a watch event's object, parsed for the store): the store takes
 * it, and frees it at once when it does not keep it. */
bool cache_put_owned(cache *c, cJSON *obj, cJSON **prev);
/* Removes namespace/name (ns NULL or "" for cluster-scoped objects). */
void cache_remove(cache *c, const char *ns, const char *name);

/* Removes namespace/name only while the stored version is resourceVersion rv (an object the
 * reconcile put there itself, not yet replaced by the API's): true when it did. */
bool cache_remove_version(cache *c, const char *ns, const char *name, const char *rv);
/* A copy of namespace/name, or NULL. */
cJSON *cache_get(cache *c, const char *ns, const char *name);
/* {"items": [copies of the objects for which keep(obj, arg) is true (all when keep is NULL)]}. */
typedef bool (*cache_keep_fn)(const cJSON *obj, void *arg);
cJSON *cache_list(cache *c, cache_keep_fn keep, void *arg);
/* The same list without copies: its items are the stored objects themselves (reference items),
 * read-only, kept alive by the view until cache_view_release (which deletes the list too), however
 * the store changes meanwhile. For what a reconcile reads of a whole cluster (nodes, busy pods). */
typedef struct cache_obj cache_obj;
typedef struct cache_view {
    cJSON *list;
    cache_obj **objs;
    cJSON *refs; /* list's items, one block */
    int n;
    bool digested; /* the store makes digests (cache_set_digest): cache_view_digest has them */
} cache_view;
cJSON *cache_view_list(cache *c, cache_keep_fn keep, void *arg, cache_view *v);
void cache_view_release(cache_view *v);

/* Digests (client-go's transform and indexers serve the same end): what every reconcile would
 * otherwise read out of hundreds of stored objects, read once when an object is stored. `digest`
 * returns a malloc'd summary of a stored object, or NULL for none; the store frees it with the
 * object. Set before the store's first object. */
typedef void *(*cache_digest_fn)(const cJSON *obj);
void cache_set_digest(cache *c, cache_digest_fn digest);
/* The digest of a view's i-th item (its items' order), or NULL. */
const void *cache_view_digest(const cache_view *v, int i);
/* An index (client-go's indexers): `index` returns a malloc'd key of a stored object ("ml/job-a":
 * the job a pod belongs to), or NULL for none, made once when the object is stored, so that a view
 * of the objects with one key (cache_view_index) compares a string per object instead of reading
 * each object's JSON. Set before the store's first object. */
typedef char *(*cache_index_fn)(const cJSON *obj);
void cache_set_index(cache *c, cache_index_fn index);
/* cache_view_list of the objects whose index key is key. */
cJSON *cache_view_index(cache *c, const char *key, cache_view *v);

/* Whether the first list has been stored (before that the store knows nothing). */
bool cache_synced(cache *c);
int cache_size(cache *c);

#endif
