/* hostinfo.c - this machine's CPUs (hostinfo.h). */
#include "common/hostinfo.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int host_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* "key<tabs>: value" lines: the value of the first line whose key is one of keys, squeezed. */
void host_cpu_model(char *buf, size_t n) {
    static const char *const keys[] = {"model name", "Model", "cpu model"};
    snprintf(buf, n, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (!colon) continue;
        size_t klen = (size_t)(colon - line);
        while (klen && isspace((unsigned char)line[klen - 1])) klen--;
        int hit = 0;
        for (size_t k = 0; k < sizeof keys / sizeof *keys && !hit; k++)
            hit = strlen(keys[k]) == klen && !strncmp(line, keys[k], klen);
        if (!hit) continue;
        size_t used = 0;
        for (const char *p = colon + 1; *p && used + 1 < n; p++) {
            if (isspace((unsigned char)*p) && (used == 0 || buf[used - 1] == ' ')) continue;
            buf[used++] = isspace((unsigned char)*p) ? ' ' : *p;
        }
        while (used && buf[used - 1] == ' ') used--;
        buf[used] = '\0';
        if (used) break;
        snprintf(buf, n, "unknown");
    }
    fclose(f);
}

/* A cgroup limit file's bytes; 0 for "max", a missing file, or no number. */
static int64_t cgroup_limit(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char buf[64] = "";
    bool got = fgets(buf, sizeof buf, f) != NULL;
    fclose(f);
    char *end;
    long long v = got ? strtoll(buf, &end, 10) : 0;
    return got && end != buf && v > 0 ? (int64_t)v : 0;
}

/* This process's cgroup v2 path ("0::/kubepods/..." in /proc/self/cgroup) into buf; "" if none. */
static void cgroup_v2_path(char *buf, size_t n) {
    buf[0] = '\0';
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f) return;
    char line[1024];
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "0::", 3)) {
            line[strcspn(line, "\n")] = '\0';
            snprintf(buf, n, "%s", line + 3);
            break;
        }
    fclose(f);
}

int64_t host_memory_bytes(void) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    int64_t phys = pages > 0 && page > 0 ? (int64_t)pages * page : 0, best = phys;
    char own[1024], v2[1100];
    cgroup_v2_path(own, sizeof own);
    snprintf(v2, sizeof v2, "/sys/fs/cgroup%s/memory.max", strcmp(own, "/") ? own : "");
    /* in a container the cgroup namespace makes its own cgroup the root: /sys/fs/cgroup/memory.max;
     * v1 writes a huge number for "no limit", and any limit above the machine's memory is none */
    const char *files[] = {v2, "/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        int64_t lim = cgroup_limit(files[i]);
        if (lim > 0 && (best == 0 || lim < best)) best = lim;
    }
    return best;
}
