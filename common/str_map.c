/* str_map.c - see str_map.h. Linear probing at most half full; removal shifts the entries after
 * the hole back (no tombstones), so that lookups stay short after many removals. */
#include "common/str_map.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

static size_t home(const str_map *m, const char *key) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)key; *p; p++) h = (h ^ *p) * 0x100000001b3ull;
    return (size_t)(h ^ (h >> 29)) & m->mask;
}

/* The slot of key, or of the empty slot where it would go. */
static size_t slot_of(const str_map *m, const char *key) {
    size_t i = home(m, key);
    while (m->key[i] && strcmp(m->key[i], key)) i = (i + 1) & m->mask;
    return i;
}

static void grow(str_map *m) {
    str_map big = {xcalloc(m->key ? 2 * (m->mask + 1) : 16, sizeof *big.key), NULL, m->key ? 2 * m->mask + 1 : 15, m->n};
    big.val = xcalloc(big.mask + 1, sizeof *big.val);
    for (size_t i = 0; m->key && i <= m->mask; i++)
        if (m->key[i]) {
            size_t j = slot_of(&big, m->key[i]);
            big.key[j] = m->key[i], big.val[j] = m->val[i];
        }
    free(m->key), free(m->val);
    *m = big;
}

long str_map_get(const str_map *m, const char *key) {
    if (!m->key) return -1;
    size_t i = slot_of(m, key);
    return m->key[i] ? m->val[i] : -1;
}

long str_map_put(str_map *m, const char *key, long v) {
    if (!m->key || 2 * (m->n + 1) > m->mask + 1) grow(m);
    size_t i = slot_of(m, key);
    if (m->key[i]) return m->val[i];
    m->key[i] = xstrdup(key), m->val[i] = v, m->n++;
    return -1;
}

void str_map_set(str_map *m, const char *key, long v) {
    if (str_map_put(m, key, v) >= 0) m->val[slot_of(m, key)] = v;
}

void str_map_del(str_map *m, const char *key) {
    if (!m->key) return;
    size_t i = slot_of(m, key);
    if (!m->key[i]) return;
    free(m->key[i]);
    m->n--;
    /* every entry after the hole whose home is not between the hole and it moves into the hole */
    for (size_t j = (i + 1) & m->mask; m->key[j]; j = (j + 1) & m->mask) {
        size_t h = home(m, m->key[j]);
        if (((j - h) & m->mask) >= ((j - i) & m->mask)) m->key[i] = m->key[j], m->val[i] = m->val[j], i = j;
    }
    m->key[i] = NULL;
}

void str_map_free(str_map *m) {
    for (size_t i = 0; m->key && i <= m->mask; i++) free(m->key[i]);
    free(m->key), free(m->val);
    *m = (str_map){0};
}
