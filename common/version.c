/* version.c - the build's version (version.h); the strings come from the generated
 * cephalo_build_version.h (Makefile: VERSION + git describe). */
#include "common/version.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cephalo_build_version.h"
#include "common/args.h"
#include "common/env.h"

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

int cephalo_version_cmd(const char *name, int argc, char **argv) {
    static const struct option opts[] = {{"json", no_argument, 0, 'j'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    char cmd[96], usage[256];
    snprintf(cmd, sizeof cmd, "%s version", name);
    snprintf(usage, sizeof usage,
             "usage: %s version [--json]   (or %s --version [--json])\n"
             "The release and commit this binary was built from; --json: as one JSON object.\n", name, name);
    args a = args_begin(argc, argv, cmd, opts, "", usage);
    bool json = false;
    int ch;
    while ((ch = args_next(&a)) > 0) json = true;
    if (ch < 0 || args_no_operands(&a)) return ARGS_BAD;
    if (!json) {
        char line[256];
        cephalo_version_line(name, line, sizeof line);
        fputs(line, stdout);
        return 0;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", name);
    cJSON_AddStringToObject(o, "version", cephalo_version());
    cJSON_AddStringToObject(o, "release", cephalo_release());
    cJSON_AddStringToObject(o, "commit", cephalo_commit());
    char *text = cJSON_PrintUnformatted(o);
    puts(text);
    free(text);
    cJSON_Delete(o);
    return 0;
}

void cephalo_build_info_metric(FILE *f, const char *component) {
    fprintf(f, "# HELP cephalo_build_info " CEPHALO_BUILD_INFO_HELP "\n"
               "# TYPE cephalo_build_info gauge\n"
               "cephalo_build_info{component=\"%s\",version=\"%s\",commit=\"%s\"} 1\n",
            component, cephalo_version(), cephalo_commit());
}

int cephalo_check_operator_version(const char *self, char *msg, size_t n) {
    const char *op;
    err_t err;
    int given = env_text(CEPHALO_ENV_OPERATOR_VERSION, &op, &err);
    if (given < 0) return snprintf(msg, n, "%s", err.msg), -1;
    if (given != ENV_GIVEN || cephalo_same_release(op, cephalo_version())) return 0;
    snprintf(msg, n, "%s is version %s, but the cephalo-operator that started it is version %s (%s): a worker "
                     "must be of its operator's release; use the worker image of release %.*s (spec.image, or the "
                     "operator's --worker-image)",
             self, cephalo_version(), op, CEPHALO_ENV_OPERATOR_VERSION, (int)strcspn(op, "+-"), op);
    return -1;
}
