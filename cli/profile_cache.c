/* profile_cache.c - profiling the local devices before planning, cached (profile_cache.h). */
#include "cli/profile_cache.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/profile_cmd.h"
#include "cli/launch.h"
#include "common/clock.h"
#include "common/env.h"
#include "common/fileio.h"
#include "common/hostinfo.h"
#include "common/log.h"
#include "common/strutil.h"
#include "common/version.h"
#include "planner/model_json.h"
#include "planner/profile.h"
#include "planner/profile_store.h"

#define PCACHE_FORMAT "cephalo profile cache 1" /* the signature's first line: a new layout, new keys */

int pcache_dir(char *buf, size_t n) {
    const char *env, *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int w, given = env_text("CEPHALO_PROFILE_CACHE", &env, NULL); /* checked at start (env_entry) */
    if (given == ENV_OFF) return 0;
    if (given == ENV_GIVEN) {
        w = snprintf(buf, n, "%s", env);
    } else if (xdg && *xdg) {
        w = snprintf(buf, n, "%s/cephalo/profiles", xdg);
    } else if (home && *home) {
        w = snprintf(buf, n, "%s/.cache/cephalo/profiles", home);
    } else {
        return 0;
    }
    return w > 0 && (size_t)w < n; /* a cut path would name another directory: off */
}

static uint64_t fnv1a64(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* "cpu:1t:67108864,cpu:1t:20971520x2": the devices as `cephalo profile --devices` takes them */
static char *devices_arg(const job *j) {
    char *s = xstrdup("");
    for (int i = 0; i < j->n_items; i++) {
        const job_device *d = &j->items[i];
        char *t = str_printf("%s%scpu:%dt:%lld", s, i ? "," : "", d->threads, (long long)d->memory_bytes);
        free(s);
        s = d->count > 1 ? str_printf("%sx%d", t, d->count) : xstrdup(t);
        free(t);
    }
    return s;
}

char *pcache_signature(const job *j, char key[17]) {
    char cpu[256];
    host_cpu_model(cpu, sizeof cpu);
    cJSON *mj = model_to_json(&j->model);
    char *mtext = cJSON_PrintUnformatted(mj);
    cJSON_Delete(mj);
    CHECK(mtext != NULL);
    char *devs = devices_arg(j);
    /* what the measurements depend on: the machine, the build that measures, the devices (their
     * threads time it, their memory bounds the microbatches), the model's shapes, seq, precision */
    char *sig = str_printf(PCACHE_FORMAT "\ncpu: %s\ncores: %d\nbuild: %s\ndevices: %s\nmodel: %s %016llx\n"
                           "seq: %ld\nprecision: %s\n",
                           cpu, host_cores(), cephalo_version(), devs, j->model.name,
                           (unsigned long long)fnv1a64(mtext), j->seq, precision_name(j->train.prec));
    snprintf(key, 17, "%016llx", (unsigned long long)fnv1a64(sig));
    free(mtext);
    free(devs);
    return sig;
}

/* The entry at path (KEY.json, beside KEY.sig) into *out when it is this signature's and a
 * readable profile with the model: true; else why not into why (empty: there is no entry). */
static bool entry_load(const char *path, const char *sigpath, const char *sig, const char *model, profile *out,
                       char *why, size_t n) {
    why[0] = '\0';
    if (access(path, F_OK) != 0) return false;
    err_t err;
    size_t len;
    char *text = file_read_all(sigpath, 1 << 16, &len, &err);
    if (!text) snprintf(why, n, "%s", err.msg); /* missing, a directory, unreadable: said as such */
    else if (strcmp(text, sig) != 0) snprintf(why, n, "%s does not match this job's devices and model", sigpath);
    free(text);
    if (why[0]) return false;
    if (profile_load_file(path, out, &err) < 0) {
        snprintf(why, n, "%s", err.msg);
        return false;
    }
    if (profile_has_model(out, model)) return true;
    profile_free(out);
    snprintf(why, n, "%s has no entry for model %s", path, model);
    return false;
}

/* `cephalo profile --quick` in this process into tmp: its exit status. Quiet: its progress goes
 * to a file shown only when it fails. */
static int measure(const job *j, const char *tmp, const char *logpath, bool quiet) {
    char *devs = devices_arg(j), seq[24], check[24];
    snprintf(seq, sizeof seq, "%ld", j->seq);
    /* the step check at the job's batch, where its plan will run (at most 16 samples a device:
     * a dozen steps of a large batch would cost more than they tell) */
    long cb = j->batch, cap = 16L * j->n_devices;
    snprintf(check, sizeof check, "%ld", cb < cap ? cb : cap);
    bool with_check = cb > j->n_devices;
    char *argv[18] = {"profile", "--devices", devs, "--model", j->model_arg, "--precision",
                      (char *)precision_name(j->train.prec), "--quick", "--store", "none", "-o", (char *)tmp};
    int argc = 12;
    if (j->seq) argv[argc++] = "--seq", argv[argc++] = seq;
    if (with_check) argv[argc++] = "--check-batch", argv[argc++] = check;
    argv[argc] = NULL;
    fflush(stderr);
    int saved = -1;
    if (quiet) {
        file_out log;
        err_t ignored; /* no log: the progress shows */
        if (file_out_open(&log, logpath, FILE_OUT_STREAM, &ignored) == 0)
            saved = dup(STDERR_FILENO), dup2(log.fd, STDERR_FILENO), file_out_abort(&log);
    }
    int rc = profile_main(argc, argv);
    fflush(stderr);
    if (saved >= 0) {
        dup2(saved, STDERR_FILENO), close(saved);
        if (rc) { /* what went wrong, after all */
            size_t len;
            err_t err;
            char *log = file_read_all(logpath, 1 << 20, &len, &err);
            if (log) fputs(log, stderr);
            free(log);
        }
    }
    unlink(logpath);
    free(devs);
    return rc;
}

/* Keeps the profile just measured as the cache's entry: the signature first (a profile without it
 * is no entry, one with it is complete), each written atomically. */
static int keep_entry(const profile *p, const char *dir, const char *path, const char *sigpath, const char *sig,
                      err_t *err) {
    if (file_make_dir(dir, true, err) < 0 || file_write_atomic(sigpath, sig, strlen(sig), 0, err) < 0) return -1;
    return profile_save(p, path, err);
}

int pcache_profile(const job *j, const pcache_opts *o, profile *out, char *source, size_t n) {
    for (int i = 0; i < j->n_items; i++)
        if (j->items[i].threads <= 0) return 0; /* `cephalo profile` measures CPU devices only */
    char dir[PATH_LEN];
    if (!j->model_arg || !pcache_dir(dir, sizeof dir)) return 0; /* turned off: the plan says "costs: analytic estimates" */
    char key[17], why[PATH_LEN + 256];
    char *sig = pcache_signature(j, key);
    char path[PATH_LEN + 32], sigpath[PATH_LEN + 32], work[PATH_LEN], tmp[PATH_LEN + 16], logpath[PATH_LEN + 16];
    const char *tmpdir = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    int rc = 0;
    err_t err;
    if (snprintf(path, sizeof path, "%s/%s.json", dir, key) >= (int)sizeof path ||
        snprintf(sigpath, sizeof sigpath, "%s/%s.sig", dir, key) >= (int)sizeof sigpath) {
        fprintf(stderr, "cephalo run: warning: the profile cache path %s is too long; costs from estimates\n", dir);
        goto out;
    }
    if (entry_load(path, sigpath, sig, j->model.name, out, why, sizeof why)) {
        fprintf(stderr, "cephalo run: costs from the cached profile %s (no profiling needed)\n", path);
        snprintf(source, n, "the cached profile %s", path); /* the caller's buffer holds a cache path */
        rc = 1;
        goto out;
    }
    if (why[0]) fprintf(stderr, "cephalo run: warning: the cached profile is unusable: %s; profiling again\n", why);
    if (!o->may_profile) {
        fprintf(stderr, "cephalo run: note: no cached profile of these devices for %s (a run measures one); costs "
                        "from estimates\n", j->model.name);
        goto out;
    }
    /* measured outside the cache: a cache that cannot be written costs the entry, never the profile */
    /* in a directory of its own (mkdtemp): a shared $TMPDIR's other users cannot have put a
     * link where the profile and its log are written */
    if (str_fmt(work, sizeof work, &err, "$TMPDIR: the path", "%s/cephalo-pcache-XXXXXX", tmpdir) < 0 ||
        (!mkdtemp(work) && err_set(&err, "%s: cannot create: %s", work, strerror(errno)) < 0)) {
        fprintf(stderr, "cephalo run: warning: %s; costs from estimates\n", err.msg);
        goto out;
    }
    snprintf(tmp, sizeof tmp, "%s/profile.json", work);
    snprintf(logpath, sizeof logpath, "%s/profile.log", work);
    fprintf(stderr, "cephalo run: profiling the devices for %s before planning (once; cached as %s; "
                    "--no-profile skips it)\n", j->model.name, path);
    double t0 = clock_now_s();
    int measured = measure(j, tmp, logpath, o->quiet);
    if (measured == 0 && profile_load_file(tmp, out, &err) < 0) measured = (fprintf(stderr, "cephalo run: %s\n", err.msg), 1);
    unlink(tmp);
    rmdir(work);
    if (measured != 0) {
        fprintf(stderr, "cephalo run: warning: profiling failed (above); costs from estimates\n");
        goto out;
    }
    fprintf(stderr, "cephalo run: profiled in %.1f s\n", clock_now_s() - t0);
    rc = 1;
    if (keep_entry(out, dir, path, sigpath, sig, &err) == 0) {
        snprintf(source, n, "the cached profile %s", path);
        goto out;
    }
    fprintf(stderr, "cephalo run: warning: the profile cannot be kept in the cache: %s; this run plans from it all "
                    "the same (the next one measures again)\n", err.msg);
    snprintf(source, n, "the profile just measured (not cached)");
out:
    free(sig);
    return rc;
}
