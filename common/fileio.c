#include "fileio.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

char *file_read_all(const char *path, size_t max_bytes, size_t *len_out, err_t *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        err_set(err, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 4096, len = 0, got;
    char *buf = xmalloc(cap + 1);
    while ((got = fread(buf + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len > max_bytes) {
            fclose(f);
            free(buf);
            err_set(err, "%s: file is larger than %zu MiB", path, max_bytes >> 20);
            return NULL;
        }
        if (len == cap) buf = xrealloc(buf, (cap *= 2) + 1);
    }
    int read_errno = ferror(f) ? errno : 0;
    fclose(f);
    if (read_errno) {
        free(buf);
        err_set(err, "%s: read error: %s", path, strerror(read_errno));
        return NULL;
    }
    buf[len] = '\0';
    *len_out = len;
    return buf;
}
