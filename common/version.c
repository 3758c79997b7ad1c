/* version.c - the build's version (version.h); the strings come from the generated
 * cephalo_build_version.h (Makefile: VERSION + git describe). */
#include "common/version.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cephalo_build_version.h"

const char *cephalo_version(void) { return CEPHALO_BUILD_VERSION; }
const char *cephalo_release(void) { return CEPHALO_BUILD_RELEASE; }
const char *cephalo_commit(void) { return CEPHALO_BUILD_COMMIT; }

static size_t release_len(const char *v) { return strcspn(v, "+-"); }

bool cephalo_same_release(const char *a, const char *b) {
    size_t la = release_len(a), lb = release_len(b);
    return la == lb && la > 0 && !memcmp(a, b, la);
}

void cephalo_version_line(const char *name, char *out, size_t n) {
    snprintf(out, n, "%s %s (commit %s)\n", name, cephalo_version(), cephalo_commit());
}

void cephalo_build_info_metric(FILE *f, const char *component) {
    fprintf(f, "# HELP cephalo_build_info " CEPHALO_BUILD_INFO_HELP "\n"
               "# TYPE cephalo_build_info gauge\n"
               "cephalo_build_info{component=\"%s\",version=\"%s\",commit=\"%s\"} 1\n",
            component, cephalo_version(), cephalo_commit());
}

int cephalo_check_operator_version(const char *self, char *msg, size_t n) {
    const char *op = getenv(CEPHALO_ENV_OPERATOR_VERSION);
    if (!op || !*op || cephalo_same_release(op, cephalo_version())) return 0;
    snprintf(msg, n, "%s is version %s, but the cephalo-operator that started it is version %s (%s): a worker "
                     "must be of its operator's release; use the worker image of release %.*s (spec.image, or the "
                     "operator's --worker-image)",
             self, cephalo_version(), op, CEPHALO_ENV_OPERATOR_VERSION, (int)strcspn(op, "+-"), op);
    return -1;
}
