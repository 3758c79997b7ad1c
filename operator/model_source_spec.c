/* model_source_spec.c - spec.model.initFrom read and checked from the job alone (msrc_parse,
 * model_source.h). Apart from model_source.c, which reads a ConfigMap through the API server
 * (libcurl), so that job_spec.c's parse links and is fuzzed without a client
 * (fuzz/fuzz_job_spec.c). */
#include "operator/model_source.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/strutil.h"

#define FIELD "spec.model.initFrom"
#define SOURCES "persistentVolumeClaim, hostPath or nfs"

static const cJSON *get(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }

/* A required non-empty string field of obj: 0 with *out, else -1 naming FIELD.where.key. */
static int need_str(const cJSON *obj, const char *where, const char *key, const char **out, err_t *err) {
    const cJSON *v = get(obj, key);
    if (!v) return err_set(err, FIELD ".%s.%s: missing", where, key);
    if (!cJSON_IsString(v) || !*v->valuestring)
        return err_set(err, FIELD ".%s.%s: expected a non-empty string", where, key);
    *out = v->valuestring;
    return 0;
}

/* A Kubernetes object name (DNS-1123 subdomain): what the pod's volume needs, checked here so
 * that a bad name fails the job with the field rather than every pod creation. */
static bool dns_subdomain(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > 253) return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        bool alnum = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
        if (!alnum && !((c == '-' || c == '.') && i > 0 && i + 1 < n)) return false;
    }
    return true;
}

/* The volume source's checks; *claim: a persistentVolumeClaim's claimName, else NULL. */
static int check_source(const char *kind, const cJSON *src, const char **claim, err_t *err) {
    const char *a, *b;
    *claim = NULL;
    char where[64];
    snprintf(where, sizeof where, "volume.%s", kind);
    if (!cJSON_IsObject(src)) return err_set(err, FIELD ".%s: expected an object", where);
    if (!strcmp(kind, "persistentVolumeClaim")) {
        if (need_str(src, where, "claimName", &a, err) < 0) return -1;
        if (!dns_subdomain(a))
            return err_set(err, FIELD ".%s.claimName: '%.80s' is not a claim name (lower-case letters, digits, '-' "
                           "and '.')", where, a);
        *claim = a;
        return 0;
    }
    if (!strcmp(kind, "hostPath")) {
        if (need_str(src, where, "path", &a, err) < 0) return -1;
        return a[0] == '/' ? 0 : err_set(err, FIELD ".%s.path: '%.80s' is not an absolute path", where, a);
    }
    if (need_str(src, where, "server", &a, err) < 0 || need_str(src, where, "path", &b, err) < 0) return -1;
    return b[0] == '/' ? 0 : err_set(err, FIELD ".%s.path: '%.80s' is not an absolute path", where, b);
}

/* initFrom.volume: exactly one volume source of those we know how to mount read-only. */
static int parse_volume(const cJSON *vol, msrc *out, err_t *err) {
    static const char *const known[] = {"persistentVolumeClaim", "hostPath", "nfs", NULL};
    if (!vol) return err_set(err, FIELD ".volume: missing (expected one volume source: " SOURCES ")");
    if (!cJSON_IsObject(vol)) return err_set(err, FIELD ".volume: expected an object with one volume source (" SOURCES ")");
    int n = 0;
    char keys[256] = "";
    const cJSON *item;
    cJSON_ArrayForEach(item, vol) {
        size_t len = strlen(keys);
        snprintf(keys + len, sizeof keys - len, "%s%s", n ? ", " : "", item->string);
        n++;
    }
    if (n != 1)
        return err_set(err, FIELD ".volume: expected exactly one volume source (" SOURCES "), got %d%s%s%s", n,
                       n ? " (" : "", keys, n ? ")" : "");
    for (int i = 0; known[i]; i++)
        if (!strcmp(vol->child->string, known[i])) {
            out->kind = known[i];
            out->source = vol->child;
            return check_source(out->kind, out->source, &out->claim, err);
        }
    return err_set(err, FIELD ".volume.%.64s: not a supported volume source (expected " SOURCES ")", vol->child->string);
}

/* initFrom.path: a relative directory inside the volume, without ".." (the pod's mount is all the
 * worker may read). out->dir and out->name follow from it. */
static int parse_path(const cJSON *p, msrc *out, err_t *err) {
    const char *path = "";
    if (p && !cJSON_IsString(p)) return err_set(err, FIELD ".path: expected a string");
    if (p) path = p->valuestring;
    if (path[0] == '/')
        return err_set(err, FIELD ".path: '%.80s' is absolute (expected a directory relative to the volume's root)", path);
    if (strlen(path) > 4000) return err_set(err, FIELD ".path: longer than 4000 characters");
    for (const char *c = path; *c;) {
        size_t seg = strcspn(c, "/");
        if (seg == 2 && c[0] == '.' && c[1] == '.')
            return err_set(err, FIELD ".path: '%.80s' leaves the volume ('..'; expected a directory inside it)", path);
        c += seg + (c[seg] == '/');
    }
    size_t len = strlen(path);
    while (len > 0 && path[len - 1] == '/') len--;
    snprintf(out->dir, sizeof out->dir, MSRC_MOUNT "%s%.*s", len ? "/" : "", (int)len, path); /* at most 4000 + 14 */
    /* as `cephalo` names a model directory ("gpt2/" and "gpt2/." are gpt2), by the spelling alone:
     * the volume is not mounted here, and its root ("", ".") has no name of its own; refused when
     * too long, not cut */
    char *clean = str_path_clean(path); /* relative, without "..": "." or names */
    const char *slash = strrchr(clean, '/'), *base = slash ? slash + 1 : clean;
    int rc = str_fmt(out->name, sizeof out->name, err, FIELD ".path: the model name taken from the directory's name",
                     "%s", strcmp(base, ".") ? base : "hf-model");
    free(clean);
    return rc;
}

/* initFrom.config or initFrom.configMap: exactly one. */
static int parse_config(const cJSON *from, msrc *out, err_t *err) {
    const cJSON *cfg = get(from, "config"), *cm = get(from, "configMap");
    if (cfg && cm) return err_set(err, FIELD ": give config or configMap, not both");
    if (!cfg && !cm)
        return err_set(err, FIELD ": missing config or configMap (the model's config.json, inline or in a "
                       "ConfigMap: the operator plans from it and cannot read the volume)");
    if (cfg) {
        if (!cJSON_IsObject(cfg)) return err_set(err, FIELD ".config: expected an object (config.json's content)");
        out->config = cfg;
        return 0;
    }
    if (!cJSON_IsObject(cm)) return err_set(err, FIELD ".configMap: expected an object {name, key}");
    if (need_str(cm, "configMap", "name", &out->cm_name, err) < 0) return -1;
    if (!dns_subdomain(out->cm_name))
        return err_set(err, FIELD ".configMap.name: '%.80s' is not a ConfigMap name", out->cm_name);
    out->cm_key = MSRC_CONFIG_KEY;
    if (get(cm, "key") && need_str(cm, "configMap", "key", &out->cm_key, err) < 0) return -1;
    return 0;
}

int msrc_parse(const cJSON *spec_model, msrc *out, err_t *err) {
    const cJSON *from = get(spec_model, "initFrom");
    memset(out, 0, sizeof *out);
    if (!from) return 0;
    if (!cJSON_IsObject(from)) return err_set(err, FIELD ": expected an object {volume, path, config or configMap}");
    if (get(spec_model, "name") || get(spec_model, "inline"))
        return err_set(err, "spec.model: give one of name, inline and initFrom (initFrom's config.json is the model)");
    if (parse_volume(get(from, "volume"), out, err) < 0 || parse_path(get(from, "path"), out, err) < 0 ||
        parse_config(from, out, err) < 0)
        return -1;
    return 1;
}
