/* str_map.h - strings to numbers in a hash table (open addressing, keys copied): a name looked up
 * in O(1), for the loops over what users feed in (node names, keys of a YAML mapping, shards,
 * stored objects) that would otherwise scan a list for each item and take quadratic time.
 *
 *   str_map m = {0};
 *   if (str_map_put(&m, name, i) >= 0) ...   // name was there: its value came back
 *   long v = str_map_get(&m, name);          // -1 when absent
 *   str_map_free(&m);
 *
 * Values are >= 0 (-1 says "absent"). A zeroed str_map is empty. */
#ifndef CEPHALO_STR_MAP_H
#define CEPHALO_STR_MAP_H

#include <stddef.h>

typedef struct str_map {
    char **key; /* per slot: the key's copy, NULL when empty */
    long *val;
    size_t mask, n; /* slots - 1 (0 before the first key), keys */
} str_map;

/* The value of key, or -1. */
long str_map_get(const str_map *m, const char *key);
/* Adds key -> v (v >= 0) when key is absent and returns -1; else returns key's value, unchanged. */
long str_map_put(str_map *m, const char *key, long v);
/* Sets key -> v (v >= 0), added or replaced. */
void str_map_set(str_map *m, const char *key, long v);
/* Removes key (if there). */
void str_map_del(str_map *m, const char *key);
void str_map_free(str_map *m);

#endif
