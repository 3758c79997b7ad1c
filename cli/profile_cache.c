/* profile_cache.c - profiling the local devices before planning, cached (profile_cache.h). */
#include "cli/profile_cache.h"

#include <cjson/cJSON.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/profile_cmd.h"
#include "cli/run.h"
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

/* Whether the entry at path (KEY.json, beside KEY.sig) is this signature's and a readable profile
 * with the model; why not into why (empty: there is no entry). */
static bool entry_ok(const char *path, const char *sigpath, const char *sig, const char *model, char *why, size_t n) {
    why[0] = '\0';
    if (access(path, F_OK) != 0) return false;
    err_t err;
    size_t len;
    char *text = file_read_all(sigpath, 1 << 16, &len, &err);
    if (!text || strcmp(text, sig) != 0) {
        snprintf(why, n, "%s does not match this job's devices and model", sigpath);
        free(text);
        return false;
    }
    free(text);
    profile p;
    if (profile_load_file(path, &p, &err) < 0) {
        snprintf(why, n, "%s", err.msg);
        return false;
    }
    bool has = profile_has_model(&p, model);
    profile_free(&p);
    if (!has) snprintf(why, n, "%s has no entry for model %s", path, model);
    return has;
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
        int fd = open(logpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) saved = dup(STDERR_FILENO), dup2(fd, STDERR_FILENO), close(fd);
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

int pcache_profile(const job *j, const pcache_opts *o, char *path, size_t n) {
    for (int i = 0; i < j->n_items; i++)
        if (j->items[i].threads <= 0) return 0; /* `cephalo profile` measures CPU devices only */
    char dir[PATH_LEN];
    if (!j->model_arg || !pcache_dir(dir, sizeof dir)) return 0; /* turned off: the plan says "costs: analytic estimates" */
    char key[17], why[PATH_LEN + 256];
    char *sig = pcache_signature(j, key);
    char sigpath[PATH_LEN + 32], tmp[PATH_LEN + 48], logpath[PATH_LEN + 48];
    int rc = 0;
    if (snprintf(path, n, "%s/%s.json", dir, key) >= (int)n ||
        snprintf(sigpath, sizeof sigpath, "%s/%s.sig", dir, key) >= (int)sizeof sigpath) {
        fprintf(stderr, "cephalo run: warning: the profile cache path %s is too long; costs from estimates\n", dir);
        goto out;
    }
    if (entry_ok(path, sigpath, sig, j->model.name, why, sizeof why)) {
        fprintf(stderr, "cephalo run: costs from the cached profile %s (no profiling needed)\n", path);
        rc = 1;
        goto out;
    }
    if (why[0]) fprintf(stderr, "cephalo run: warning: the cached profile is unusable: %s; profiling again\n", why);
    if (!o->may_profile) {
        fprintf(stderr, "cephalo run: note: no cached profile of these devices for %s (a run measures one); costs "
                        "from estimates\n", j->model.name);
        goto out;
    }
    err_t err;
    if (file_make_dir(dir, true, &err) < 0) {
        fprintf(stderr, "cephalo run: warning: the profile cache %s: %s; costs from estimates\n", dir, err.msg);
        goto out;
    }
    snprintf(tmp, sizeof tmp, "%s/%s.json.%d.tmp", dir, key, (int)getpid());
    snprintf(logpath, sizeof logpath, "%s/%s.log.%d.tmp", dir, key, (int)getpid());
    fprintf(stderr, "cephalo run: profiling the devices for %s before planning (once; cached as %s; "
                    "--no-profile skips it)\n", j->model.name, path);
    double t0 = clock_now_s();
    if (measure(j, tmp, logpath, o->quiet) != 0) {
        fprintf(stderr, "cephalo run: warning: profiling failed (above); costs from estimates\n");
        unlink(tmp);
        goto out;
    }
    /* the signature first: a profile without it is no entry, one with it is complete */
    if (file_write_atomic(sigpath, sig, strlen(sig), 0, &err) < 0 || rename(tmp, path) != 0) {
        fprintf(stderr, "cephalo run: warning: cannot keep the profile in %s; costs from estimates\n", dir);
        unlink(tmp);
        goto out;
    }
    fprintf(stderr, "cephalo run: profiled in %.1f s\n", clock_now_s() - t0);
    rc = 1;
out:
    free(sig);
    return rc;
}
