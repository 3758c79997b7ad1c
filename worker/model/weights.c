/* weights.c - the checks every loader of weights by name makes (see weights.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "model/weights.h"

void weights_use(weights_used *u, const char *name) {
    if (u->n == u->cap) {
        u->cap = u->cap ? 2 * u->cap : 64;
        u->names = xrealloc(u->names, (size_t)u->cap * sizeof *u->names);
    }
    u->names[u->n++] = xstrdup(name);
    u->sorted = false;
}

static int name_cmp(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

bool weights_is_used(weights_used *u, const char *name) {
    if (!u->sorted && u->n > 1) qsort(u->names, (size_t)u->n, sizeof *u->names, name_cmp);
    u->sorted = true;
    return u->n && bsearch(&name, u->names, (size_t)u->n, sizeof *u->names, name_cmp);
}

void weights_used_free(weights_used *u) {
    for (int i = 0; i < u->n; i++) free(u->names[i]);
    free(u->names);
    *u = (weights_used){0};
}

/* Up to SHOWN of the names, quoted, then "and N more". */
#define SHOWN 6

int weights_check_unused(weights_used *u, const char *where, const char *const *found, int n, bool allow,
                         const char *model, err_t *err) {
    char list[640] = "";
    size_t len = 0;
    int unused = 0;
    for (int i = 0; i < n; i++) {
        if (weights_is_used(u, found[i])) continue;
        if (unused++ < SHOWN && len < sizeof list)
            len += (size_t)snprintf(list + len, sizeof list - len, "%s'%.120s'", len ? ", " : "", found[i]);
    }
    if (!unused) return 0;
    if (unused > SHOWN && len < sizeof list) snprintf(list + len, sizeof list - len, " and %d more", unused - SHOWN);
    const char *s = unused == 1 ? "" : "s";
    if (allow) {
        log_warn("%s: --allow-unused-weights: %d tensor%s the model does not use left out (%s): %s", where, unused, s,
                 model, list);
        return 0;
    }
    return err_set(err, "%s: %d tensor%s the model does not use: %s (%s; fewer layers or smaller shapes than "
                   "the weights?). Loading would drop them silently; --allow-unused-weights loads the model "
                   "without them", where, unused, s, list, model);
}

int64_t weights_first_nonfinite(const float *v, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(v[i])) return i;
    return -1;
}

int weights_nonfinite(err_t *err, const char *file, const char *tensor, const char *part, const int64_t *shape,
                      int ndim, int64_t flat, float v) {
    char at[160];
    size_t len = (size_t)snprintf(at, sizeof at, "[");
    int64_t stride = 1;
    for (int d = 1; d < ndim; d++) stride *= shape[d];
    for (int d = 0; d < ndim && len < sizeof at; d++) { /* row-major: the first index varies slowest */
        int64_t i = stride ? flat / stride : 0;
        flat -= i * stride;
        len += (size_t)snprintf(at + len, sizeof at - len, "%s%lld", d ? ", " : "", (long long)i);
        if (d + 1 < ndim) stride /= shape[d + 1];
    }
    if (len < sizeof at) snprintf(at + len, sizeof at - len, "]");
    return err_set(err, "%s: tensor '%s' holds %s%s%s at %s: weights must be finite (a damaged file, or a "
                   "model saved after its training diverged?)", file, tensor, isnan(v) ? "nan" : v > 0 ? "inf" : "-inf",
                   part ? " in " : "", part ? part : "", ndim ? at : "[0]");
}
