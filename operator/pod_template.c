/* pod_template.c - spec.template checked and merged into the worker pods (pod_template.h). */
#include "operator/pod_template.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "common/json_util.h"
#include "operator/job_spec.h"
#include "operator/model_source.h"
#include "operator/quantity.h"

#define T "spec.template"

/* The pod spec fields a template may give (containers and the rest are checked on their own). */
static const char *const spec_copied[] = {"priorityClassName", "imagePullSecrets", "serviceAccountName",
                                          "runtimeClassName", "dnsPolicy", "dnsConfig", "enableServiceLinks",
                                          "shareProcessNamespace", "initContainers", NULL};
static const char *const spec_merged[] = {"automountServiceAccountToken", "tolerations", "affinity",
                                          "securityContext", "volumes", "containers", NULL};
/* Pod spec fields the operator owns, and where the job says them instead. */
static const struct {
    const char *key, *instead;
} spec_owned[] = {
    {"nodeName", "each worker runs on the node of its plan; spec.gpus.nodeSelector narrows the nodes"},
    {"nodeSelector", "use spec.gpus.nodeSelector (the planner must know it)"},
    {"restartPolicy", "Never: the operator restarts the whole gang"},
    {"hostname", "the worker's DNS name <job>-<rank>"},
    {"subdomain", "the job's headless Service"},
    {"terminationGracePeriodSeconds", "use spec.terminationGracePeriodSeconds"},
};
/* The worker container's fields a template may give, and those the operator owns. */
static const char *const worker_fields[] = {"name", "resources", "env", "envFrom", "volumeMounts",
                                            "securityContext", NULL};
static const struct {
    const char *key, *instead;
} worker_owned[] = {
    {"command", "the image's cephalo-worker"},
    {"args", "built from the job's spec"},
    {"image", "use spec.image"},
    {"imagePullPolicy", "use spec.imagePullPolicy"},
};
/* The operator's volumes and where it mounts them: a template's may use neither name nor path. */
static const char *const own_volumes[] = {"plan", "data", "checkpoints", MSRC_VOLUME, NULL};
static const char *const own_mounts[] = {"/etc/cephalo", JOB_SPEC_DATA_MOUNT, JOB_SPEC_CKPT_MOUNT, MSRC_MOUNT, NULL};
/* Environment variables the operator sets on the worker (common/worker_cmd.h), less CEPHALO_*. */
static const char *const own_env[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", NULL};

static bool listed(const char *const *list, const char *s) {
    for (int i = 0; list[i]; i++)
        if (!strcmp(list[i], s)) return true;
    return false;
}

static const char *str_of(const cJSON *o, const char *key) {
    const cJSON *v = json_get(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* ---- the check ------------------------------------------------------------------------------- */

/* labels or annotations: strings, none of the operator's keys. */
static int check_map(const cJSON *m, const char *what, err_t *err) {
    if (!m) return 0;
    if (!cJSON_IsObject(m)) return err_set(err, T ".metadata.%s: expected a map of strings", what);
    const cJSON *kv;
    cJSON_ArrayForEach(kv, m) {
        if (!cJSON_IsString(kv)) return err_set(err, T ".metadata.%s.%s: expected a string", what, kv->string);
        if (!strncmp(kv->string, "cephalo.dev/", 12) || !strcmp(kv->string, "app.kubernetes.io/name") ||
            !strcmp(kv->string, "app.kubernetes.io/managed-by"))
            return err_set(err, T ".metadata.%s.%s: owned by the operator (it marks its worker pods with it)", what,
                           kv->string);
    }
    return 0;
}

static int check_metadata(const cJSON *md, err_t *err) {
    if (!md) return 0;
    if (!cJSON_IsObject(md)) return err_set(err, T ".metadata: expected an object");
    const cJSON *kv;
    cJSON_ArrayForEach(kv, md)
        if (strcmp(kv->string, "labels") && strcmp(kv->string, "annotations"))
            return err_set(err, T ".metadata.%s: not supported (a template gives labels and annotations; the "
                           "operator names the pods)", kv->string);
    if (check_map(json_get(md, "labels"), "labels", err) < 0) return -1;
    return check_map(json_get(md, "annotations"), "annotations", err);
}

/* volumes (where != NULL: "volumes") or a container's volumeMounts: objects with a name, none of
 * the operator's names or mount paths. */
static int check_named_list(const cJSON *arr, const char *where, bool mounts, err_t *err) {
    if (!arr) return 0;
    if (!cJSON_IsArray(arr)) return err_set(err, "%s: expected a list", where);
    const cJSON *it;
    int i = 0;
    cJSON_ArrayForEach(it, arr) {
        const char *name = str_of(it, "name"), *path = mounts ? str_of(it, "mountPath") : NULL;
        if (!cJSON_IsObject(it) || !name) return err_set(err, "%s[%d]: expected an object with a name", where, i);
        if (listed(own_volumes, name))
            return err_set(err, "%s[%d].name: '%s' is the operator's own volume (its plan, claims or model)", where, i,
                           name);
        if (path && listed(own_mounts, path))
            return err_set(err, "%s[%d].mountPath: '%s' is where the operator mounts its own volume", where, i, path);
        i++;
    }
    return 0;
}

static int check_env(const cJSON *env, const char *where, err_t *err) {
    if (!env) return 0;
    if (!cJSON_IsArray(env)) return err_set(err, "%s.env: expected a list", where);
    const cJSON *e;
    cJSON_ArrayForEach(e, env) {
        const char *name = str_of(e, "name");
        if (!name) return err_set(err, "%s.env: an entry without a name", where);
        if (!strncmp(name, "CEPHALO_", 8) || listed(own_env, name))
            return err_set(err, "%s.env.%s: owned by the operator (the worker's plan, rendezvous and job)", where,
                           name);
    }
    return 0;
}

/* The worker's requests and limits: quantities (quantity.h), the GPU left to the operator. */
static int check_resources(const cJSON *res, const char *w, err_t *err) {
    if (!res) return 0;
    if (!cJSON_IsObject(res)) return err_set(err, "%s.resources: expected an object with requests and limits", w);
    const char *parts[] = {"requests", "limits"};
    for (int i = 0; i < 2; i++) {
        const cJSON *part = json_get(res, parts[i]), *kv;
        if (part && !cJSON_IsObject(part)) return err_set(err, "%s.resources.%s: expected a map of quantities", w, parts[i]);
        if (json_get(part, "nvidia.com/gpu"))
            return err_set(err, "%s.resources.%s.nvidia.com/gpu: owned by the operator (one GPU per worker, as "
                           "planned)", w, parts[i]);
        cJSON_ArrayForEach(kv, part) {
            double v;
            err_t qe;
            if (quantity_json(kv, &v, &qe) < 0) return err_set(err, "%s.resources.%s.%s: %s", w, parts[i], kv->string, qe.msg);
        }
    }
    return 0;
}

/* The worker container's part: resources (not the GPU), env, envFrom, volume mounts. */
static int check_worker(const cJSON *c, err_t *err) {
    const char *w = T ".spec.containers[" POD_TEMPLATE_WORKER "]";
    for (size_t i = 0; i < sizeof worker_owned / sizeof *worker_owned; i++)
        if (json_get(c, worker_owned[i].key))
            return err_set(err, "%s.%s: owned by the operator (%s)", w, worker_owned[i].key, worker_owned[i].instead);
    const cJSON *kv;
    cJSON_ArrayForEach(kv, c)
        if (!listed(worker_fields, kv->string))
            return err_set(err, "%s.%s: not supported (the worker takes resources, env, envFrom, volumeMounts and "
                           "securityContext)", w, kv->string);
    if (check_resources(json_get(c, "resources"), w, err) < 0) return -1;
    char where[160];
    snprintf(where, sizeof where, "%s.volumeMounts", w);
    if (check_named_list(json_get(c, "volumeMounts"), where, true, err) < 0) return -1;
    return check_env(json_get(c, "env"), w, err);
}

static int check_containers(const cJSON *cs, err_t *err) {
    if (!cs) return 0;
    if (!cJSON_IsArray(cs)) return err_set(err, T ".spec.containers: expected a list");
    const cJSON *c;
    int i = 0, workers = 0;
    cJSON_ArrayForEach(c, cs) {
        const char *name = str_of(c, "name");
        if (!cJSON_IsObject(c) || !name) return err_set(err, T ".spec.containers[%d]: expected an object with a name", i);
        if (!strcmp(name, POD_TEMPLATE_WORKER)) {
            if (workers++) return err_set(err, T ".spec.containers: the container '" POD_TEMPLATE_WORKER "' twice");
            if (check_worker(c, err) < 0) return -1;
        } else if (!str_of(c, "image")) {
            return err_set(err, T ".spec.containers[%s]: a sidecar needs an image", name);
        }
        i++;
    }
    return 0;
}

static int check_spec(const cJSON *ps, err_t *err) {
    if (!ps) return 0;
    if (!cJSON_IsObject(ps)) return err_set(err, T ".spec: expected an object");
    const cJSON *kv;
    cJSON_ArrayForEach(kv, ps) {
        for (size_t i = 0; i < sizeof spec_owned / sizeof *spec_owned; i++)
            if (!strcmp(kv->string, spec_owned[i].key))
                return err_set(err, T ".spec.%s: owned by the operator (%s)", kv->string, spec_owned[i].instead);
        if (!listed(spec_copied, kv->string) && !listed(spec_merged, kv->string))
            return err_set(err, T ".spec.%s: not supported in a CephaloJob's pod template", kv->string);
    }
    const cJSON *aff = json_get(ps, "affinity"), *tol = json_get(ps, "tolerations");
    if (aff && !cJSON_IsObject(aff)) return err_set(err, T ".spec.affinity: expected an object");
    if (tol && !cJSON_IsArray(tol)) return err_set(err, T ".spec.tolerations: expected a list");
    const cJSON *sc = json_get(ps, "securityContext");
    if (sc && !cJSON_IsObject(sc)) return err_set(err, T ".spec.securityContext: expected an object");
    if (check_named_list(json_get(ps, "volumes"), T ".spec.volumes", false, err) < 0) return -1;
    return check_containers(json_get(ps, "containers"), err);
}

int pod_template_check(const cJSON *tmpl, err_t *err) {
    if (!tmpl) return 0;
    if (!cJSON_IsObject(tmpl)) return err_set(err, T ": expected an object (a PodTemplateSpec)");
    const cJSON *kv;
    cJSON_ArrayForEach(kv, tmpl)
        if (strcmp(kv->string, "metadata") && strcmp(kv->string, "spec"))
            return err_set(err, T ".%s: not supported (a template has metadata and spec)", kv->string);
    if (check_metadata(json_get(tmpl, "metadata"), err) < 0) return -1;
    return check_spec(json_get(tmpl, "spec"), err);
}

/* The container named worker in a template's pod spec, or NULL. */
static const cJSON *template_worker(const cJSON *tmpl) {
    const cJSON *c;
    cJSON_ArrayForEach(c, json_get(json_get(tmpl, "spec"), "containers"))
        if (str_of(c, "name") && !strcmp(str_of(c, "name"), POD_TEMPLATE_WORKER)) return c;
    return NULL;
}

double pod_template_memory_limit(const cJSON *tmpl) {
    const cJSON *v = json_get(json_get(json_get(template_worker(tmpl), "resources"), "limits"), "memory");
    double bytes;
    err_t err;
    return v && quantity_json(v, &bytes, &err) == 0 ? bytes : 0;
}

/* ---- the merge ------------------------------------------------------------------------------- */

static cJSON *child(cJSON *o, const char *key) { return cJSON_GetObjectItemCaseSensitive(o, key); }

/* Each member of from that `to` lacks, copied: the operator's values win (checked: none clash). */
static void add_missing(cJSON *to, const cJSON *from) {
    const cJSON *kv;
    cJSON_ArrayForEach(kv, from)
        if (!child(to, kv->string)) cJSON_AddItemToObject(to, kv->string, cJSON_Duplicate(kv, true));
}

/* Each member of from put into to (the template's value replaces a default of the operator's). */
static void put_all(cJSON *to, const cJSON *from) {
    const cJSON *kv;
    cJSON_ArrayForEach(kv, from) {
        cJSON_DeleteItemFromObjectCaseSensitive(to, kv->string);
        cJSON_AddItemToObject(to, kv->string, cJSON_Duplicate(kv, true));
    }
}

static cJSON *object_at(cJSON *o, const char *key) {
    cJSON *c = child(o, key);
    return c ? c : cJSON_AddObjectToObject(o, key);
}

static void append_all(cJSON *o, const char *key, const cJSON *items) {
    if (!items) return;
    cJSON *arr = child(o, key);
    if (!arr) arr = cJSON_AddArrayToObject(o, key);
    const cJSON *it;
    cJSON_ArrayForEach(it, items) cJSON_AddItemToArray(arr, cJSON_Duplicate(it, true));
}

/* The template's required node affinity ANDed with the operator's (one term: the planned host):
 * every template term gets the host's expressions. Its preferred terms and pod (anti-)affinity
 * are copied. */
static void merge_affinity(cJSON *ps, const cJSON *aff) {
    cJSON *mine = object_at(ps, "affinity");
    const char *pod_kinds[] = {"podAffinity", "podAntiAffinity"};
    for (int i = 0; i < 2; i++) {
        const cJSON *k = json_get(aff, pod_kinds[i]);
        if (!k) continue;
        cJSON_DeleteItemFromObjectCaseSensitive(mine, pod_kinds[i]);
        cJSON_AddItemToObject(mine, pod_kinds[i], cJSON_Duplicate(k, true));
    }
    const cJSON *na = json_get(aff, "nodeAffinity");
    if (!na) return;
    cJSON *my_na = object_at(mine, "nodeAffinity");
    if (json_get(na, "preferredDuringSchedulingIgnoredDuringExecution"))
        append_all(my_na, "preferredDuringSchedulingIgnoredDuringExecution",
                   json_get(na, "preferredDuringSchedulingIgnoredDuringExecution"));
    const cJSON *terms = json_get(json_get(na, "requiredDuringSchedulingIgnoredDuringExecution"), "nodeSelectorTerms");
    cJSON *my_terms = child(child(my_na, "requiredDuringSchedulingIgnoredDuringExecution"), "nodeSelectorTerms");
    if (!cJSON_IsArray(terms) || cJSON_GetArraySize(terms) == 0 || !my_terms) return;
    const cJSON *host = child(cJSON_GetArrayItem(my_terms, 0), "matchExpressions"), *t;
    cJSON *anded = cJSON_CreateArray();
    cJSON_ArrayForEach(t, terms) {
        cJSON *term = cJSON_Duplicate(t, true);
        append_all(term, "matchExpressions", host);
        cJSON_AddItemToArray(anded, term);
    }
    cJSON_ReplaceItemInObjectCaseSensitive(child(my_na, "requiredDuringSchedulingIgnoredDuringExecution"),
                                           "nodeSelectorTerms", anded);
}

static void merge_worker(cJSON *ctr, const cJSON *c) {
    const cJSON *res = json_get(c, "resources");
    const char *parts[] = {"requests", "limits"};
    for (int i = 0; res && i < 2; i++)
        if (json_get(res, parts[i])) add_missing(object_at(object_at(ctr, "resources"), parts[i]), json_get(res, parts[i]));
    append_all(ctr, "env", json_get(c, "env"));
    append_all(ctr, "envFrom", json_get(c, "envFrom"));
    append_all(ctr, "volumeMounts", json_get(c, "volumeMounts"));
    if (json_get(c, "securityContext")) put_all(object_at(ctr, "securityContext"), json_get(c, "securityContext"));
}

static void merge_containers(cJSON *ps, const cJSON *cs) {
    cJSON *mine = child(ps, "containers"), *worker = NULL, *it;
    cJSON_ArrayForEach(it, mine)
        if (!strcmp(str_of(it, "name") ? str_of(it, "name") : "", POD_TEMPLATE_WORKER)) worker = it;
    const cJSON *c;
    cJSON_ArrayForEach(c, cs) {
        if (!strcmp(str_of(c, "name"), POD_TEMPLATE_WORKER)) {
            if (worker) merge_worker(worker, c);
        } else {
            cJSON_AddItemToArray(mine, cJSON_Duplicate(c, true)); /* a sidecar */
        }
    }
}

void pod_template_apply(const cJSON *tmpl, cJSON *pod) {
    cJSON *md = object_at(pod, "metadata"), *ps = object_at(pod, "spec");
    const cJSON *tmd = json_get(tmpl, "metadata"), *tps = json_get(tmpl, "spec");
    if (json_get(tmd, "labels")) add_missing(object_at(md, "labels"), json_get(tmd, "labels"));
    if (json_get(tmd, "annotations")) add_missing(object_at(md, "annotations"), json_get(tmd, "annotations"));
    const cJSON *kv;
    cJSON_ArrayForEach(kv, tps)
        if (listed(spec_copied, kv->string)) {
            cJSON_DeleteItemFromObjectCaseSensitive(ps, kv->string);
            cJSON_AddItemToObject(ps, kv->string, cJSON_Duplicate(kv, true));
        }
    /* workers use no API: no token unless the template asks for one */
    const cJSON *automount = json_get(tps, "automountServiceAccountToken");
    cJSON_DeleteItemFromObjectCaseSensitive(ps, "automountServiceAccountToken");
    cJSON_AddBoolToObject(ps, "automountServiceAccountToken", cJSON_IsTrue(automount));
    append_all(ps, "tolerations", json_get(tps, "tolerations"));
    if (json_get(tps, "affinity")) merge_affinity(ps, json_get(tps, "affinity"));
    if (json_get(tps, "securityContext")) put_all(object_at(ps, "securityContext"), json_get(tps, "securityContext"));
    append_all(ps, "volumes", json_get(tps, "volumes"));
    if (json_get(tps, "containers")) merge_containers(ps, json_get(tps, "containers"));
}
