/* model_source.c - spec.model.initFrom: a Hugging Face directory on a volume (model_source.h): its
 * config.json read for planning (a ConfigMap through the API), its volume in the worker pods. The
 * spec's own checks, which need no API server, are model_source_spec.c's. */
#include "operator/model_source.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#define FIELD "spec.model.initFrom"

static const cJSON *get(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }

/* config.json's text from the ConfigMap: 0 with *text (the caller frees it); -1 or -2 (API). */
static int read_configmap(kube_client *k, const char *ns, const msrc *s, char **text, err_t *err) {
    char path[KUBE_PATH_MAX];
    if (kube_path(path, sizeof path, "v1", ns, "configmaps", s->cm_name, err) < 0)
        return err_prefix(err, FIELD ".configMap.name");
    cJSON *cm = NULL;
    long status = 0;
    if (kube_get(k, path, &cm, &status, err) < 0)
        return status == 404 ? err_set(err, FIELD ".configMap: ConfigMap %s/%s not found", ns, s->cm_name) : -2;
    const cJSON *data = get(cm, "data"), *v = get(data, s->cm_key);
    int rc = 0;
    if (cJSON_IsString(v)) {
        *text = strdup(v->valuestring);
        if (!*text) rc = err_set(err, "out of memory");
    } else {
        char keys[512] = "";
        const cJSON *item;
        cJSON_ArrayForEach(item, data) {
            size_t len = strlen(keys);
            snprintf(keys + len, sizeof keys - len, "%s%s", len ? ", " : "", item->string);
        }
        rc = err_set(err, FIELD ".configMap: ConfigMap %s/%s has no key %s (it has: %s)", ns, s->cm_name, s->cm_key,
                     *keys ? keys : "none");
    }
    cJSON_Delete(cm);
    return rc;
}

int msrc_model(kube_client *k, const char *ns, const msrc *s, model_spec *m, err_t *err) {
    char *text = NULL, src[600];
    if (s->config) {
        text = cJSON_PrintUnformatted(s->config);
        if (!text) return err_set(err, "out of memory");
        snprintf(src, sizeof src, FIELD ".config");
    } else {
        int rc = read_configmap(k, ns, s, &text, err);
        if (rc < 0) return rc;
        snprintf(src, sizeof src, FIELD ".configMap (ConfigMap %s/%s, key %s)", ns, s->cm_name, s->cm_key);
    }
    int rc = model_load_hf_string(src, text, strlen(text), s->name, m, err);
    free(text);
    return rc;
}

void msrc_pod(const msrc *s, cJSON *volumes, cJSON *mounts) {
    cJSON *src = cJSON_Duplicate(s->source, true);
    /* the workers only read the model; a claim or an export mounted read-only can be shared by
     * every pod (ReadOnlyMany) and is safe from a stray write */
    if (strcmp(s->kind, "hostPath") != 0) { /* hostPath has no readOnly: the mount's says it */
        cJSON_DeleteItemFromObjectCaseSensitive(src, "readOnly");
        cJSON_AddBoolToObject(src, "readOnly", true);
    }
    kube_pod_volume(volumes, mounts, MSRC_VOLUME, MSRC_MOUNT, true, s->kind, src);
}
