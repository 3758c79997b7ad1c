/* hostinfo.c - this machine's CPUs (hostinfo.h). */
#include "common/hostinfo.h"

#include <ctype.h>
#include <stdio.h>
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
