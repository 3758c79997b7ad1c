/* profile_cache.h - `cephalo run`'s own numbers: the local devices profiled for the job's model
 * before it plans (`cephalo profile --quick`, in this process), kept in a cache directory under a
 * key of the device signature and the model, so that the next run of the same job plans at once
 * (docs/run.md, "Profiling before planning").
 *
 * The cache is $CEPHALO_PROFILE_CACHE, else $XDG_CACHE_HOME/cephalo/profiles, else
 * ~/.cache/cephalo/profiles; "none" (or empty) turns profiling before planning off. Each entry
 * is KEY.json (the profile) and KEY.sig (the signature text the key hashes: the CPU model, the
 * host's cores, this build's version, the devices, the model spec's hash, seq and precision). An
 * entry whose signature differs or whose profile cannot be read is reported and measured again.
 * A profile is measured into $TMPDIR and then kept in the cache, so that a cache that cannot
 * keep it costs the entry (said, with the reason), never the profile. */
#ifndef CEPHALO_PROFILE_CACHE_H
#define CEPHALO_PROFILE_CACHE_H

#include <stdbool.h>
#include <stddef.h>

#include "cli/job.h"
#include "planner/profile.h"

typedef struct pcache_opts {
    bool may_profile; /* false: use a cached profile only (a dry run) */
    bool quiet;       /* the profiler's progress lines left out (its failures still shown) */
} pcache_opts;

/* The job's profile of the local devices: 1 with it in *out (the caller frees it) and where it
 * came from in source ("the cached profile PATH", or "the profile just measured (not cached)"
 * when the cache cannot keep it: said on stderr with the reason), or 0: the plan uses the store
 * or estimates (the cache is off, a GPU device; a dry run with nothing cached and a failed
 * profile say so on stderr). Never fails the run. */
int pcache_profile(const job *j, const pcache_opts *o, profile *out, char *source, size_t n);
/* The cache directory into buf: 1; 0 when off or there is no home directory. */
int pcache_dir(char *buf, size_t n);
/* The signature text of the job's devices and model (the caller frees it), and its key (16 hex
 * digits and a NUL into key[17]). */
char *pcache_signature(const job *j, char key[17]);

#endif
