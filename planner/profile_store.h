/* profile_store.h - writing and merging profile files (planner/profile.h), and the profile
 * store: one file that keeps an entry per (device type, model, seq, precision) and the measured
 * collectives per world size, across `cephalo profile` runs (docs/profile.md).
 *
 * The store is $CEPHALO_PROFILE_STORE, else ~/.cache/cephalo/profiles.json; "none" (or an empty
 * value) turns it off. `cephalo plan/compare/run` use it when no --profile is given and it has
 * an entry for the model. */
#ifndef CEPHALO_PROFILE_STORE_H
#define CEPHALO_PROFILE_STORE_H

#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"
#include "planner/profile.h"

/* The profile as JSON text (the caller frees it). */
char *profile_to_json(const profile *p);
/* Writes the profile atomically, creating the parent directory. */
int profile_save(const profile *p, const char *path, err_t *err);
/* Adds src's entries and collectives to dst, replacing those with the same key (device type,
 * model, seq, precision; world and op). Returns how many replaced existing ones. */
int profile_merge(profile *dst, const profile *src);
/* The store's path into buf: 1; 0 when the store is off or there is no home directory; -1 when
 * $CEPHALO_PROFILE_STORE or $HOME is too long for buf (a cut path would name another file). */
int profile_store_path(char *buf, size_t n, err_t *err);
/* True when some entry is for this model (by name, case-insensitive). */
bool profile_has_model(const profile *p, const char *model);
/* The distinct model names of the entries, ", "-separated, into buf ("none" when empty). */
void profile_models(const profile *p, char *buf, size_t n);

#endif
