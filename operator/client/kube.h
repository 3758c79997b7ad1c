/* kube.h - a small Kubernetes API client on libcurl: configuration (in-cluster or kubeconfig),
 * JSON requests (get, list, create, replace, delete, JSON merge patch, the status subresource),
 * optimistic-concurrency updates retried on 409 Conflict, Events, and streaming GETs for watches.
 *
 *   kube_config cfg;
 *   if (kube_config_in_cluster(&cfg, &err) < 0) ...        // or kube_config_load(path, NULL, ...)
 *   kube_client *k = kube_client_new(&cfg, &err);
 *   kube_config_free(&cfg);                                 // the client keeps its own copy
 *   char path[KUBE_PATH_MAX];
 *   kube_path(path, sizeof path, "v1", "default", "configmaps", "plan");
 *   cJSON *cm; long status;
 *   if (kube_get(k, path, &cm, &status, &err) < 0 && status == 404) ...
 *
 * Every request verifies TLS against the cluster CA (there is no "insecure" switch: a kubeconfig
 * asking for insecure-skip-tls-verify is refused). Errors name the method, the URL, the HTTP
 * status and the message of the API's Status object. A client is one libcurl handle: it is not
 * thread-safe; a thread that needs its own connection makes its own client from the config. */
#ifndef CEPHALO_KUBE_H
#define CEPHALO_KUBE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "common/err.h"

/* The service account directory of a pod (token, ca.crt, namespace). */
#define KUBE_SA_DIR "/var/run/secrets/kubernetes.io/serviceaccount"
/* An environment variable that, when set and not empty, names another service account directory
 * (a pod run as a local process by tests/k8s/kubelet.py, which cannot mount KUBE_SA_DIR). */
#define KUBE_SA_DIR_ENV "CEPHALO_SERVICEACCOUNT_DIR"
/* Responses larger than this are refused (a list of every Pod of a big cluster fits). */
#define KUBE_MAX_BODY ((size_t)256 << 20)
/* API paths are built into buffers of this size. */
#define KUBE_PATH_MAX 1024
#define KUBE_SERVER_MAX 511 /* the API server's URL ("https://host:port") */
#define KUBE_URL_MAX 8192   /* a request's URL: the server, the path, a list's query (continue token) */
/* A bearer token read from a file is re-read after this many seconds (bound service account
 * tokens rotate; the kubelet rewrites the file well before expiry) and after any 401. */
#define KUBE_TOKEN_REREAD_S 60.0

/* A write gate (the fence of leader election, lease.h): may_write(arg) says whether this process
 * may change anything in the cluster now. It is asked before every request that is not a read -
 * create, update, patch, delete, Events: every method but GET - and again by libcurl just before
 * the request goes out on its connection (after connecting, which may take long), so that a
 * write is sent only while the gate is open; a write already sent when it closes is the only one
 * that lands. A refused request gets status KUBE_FENCED and is not sent at all. Called from the
 * requesting thread: it must be thread-safe and quick. */
typedef struct kube_gate {
    bool (*may_write)(void *arg);
    void *arg;
} kube_gate;
#define KUBE_FENCED (-1L) /* the status of a write the gate refused (no response: 0, HTTP: 100..599) */

/* Where to reach the API server and how to authenticate. Byte buffers (`*_data`) hold PEM text
 * already decoded from a kubeconfig's base64; they are handed to libcurl as blobs, never written
 * to disk. Every field may be NULL except server. */
typedef struct kube_config {
    char *server; /* "https://host:port" (or "http://..." for local tests), no trailing '/' */
    char *namespace; /* the default namespace: the context's, the pod's, or "default" */
    char *token; /* a static bearer token */
    char *token_file; /* a bearer token file, re-read (in-cluster, or a kubeconfig tokenFile) */
    char *ca_file; /* PEM bundle of the cluster CA */
    char *ca_data;
    size_t ca_len;
    char *cert_file, *key_file; /* client certificate and key (PEM) */
    char *cert_data, *key_data;
    size_t cert_len, key_len;
    char *source; /* "in-cluster config" or the kubeconfig path, for messages */
    char *user_agent; /* the User-Agent header (audit logs name it); NULL: "cephalo-operator" */
    const kube_gate *write_gate; /* NULL: writes are never refused; not owned (must outlive clients) */
} kube_config;

/* In-cluster: KUBERNETES_SERVICE_HOST/PORT and the service account files in KUBE_SA_DIR (or in
 * $CEPHALO_SERVICEACCOUNT_DIR when that is set and not empty). */
int kube_config_in_cluster(kube_config *c, err_t *err);
/* Same, with the service account directory and the host/port given (tests, odd mounts). */
int kube_config_in_cluster_at(const char *sa_dir, const char *host, const char *port,
                              kube_config *c, err_t *err);
/* A kubeconfig file; `context` NULL takes current-context. Relative file paths are resolved
 * against the kubeconfig's directory. Errors name file:line and the field. */
int kube_config_load(const char *path, const char *context, kube_config *c, err_t *err);
/* The same from text; `name` is the file name used in messages and `dir` the directory relative
 * paths are resolved against (NULL: the current directory). */
int kube_config_parse(const char *name, const char *dir, const char *text, size_t len,
                      const char *context, kube_config *c, err_t *err);
void kube_config_free(kube_config *c);

typedef struct kube_client kube_client;

/* A client with its own copy of the configuration. NULL with the error set when the
 * configuration cannot be used (e.g. an unreadable token file). */
kube_client *kube_client_new(const kube_config *c, err_t *err);
void kube_client_free(kube_client *k);
/* The configuration's default namespace. */
const char *kube_client_namespace(const kube_client *k);
/* Requests check this flag (from any thread or a signal handler) and give up when it is set:
 * a long watch returns within about a second. NULL: never. */
void kube_client_set_stop(kube_client *k, const atomic_int *stop);
/* Bounds every later request (connect included) to `seconds`; 0 restores the default (60 s). */
void kube_client_set_timeout(kube_client *k, long seconds);
/* Replaces the write gate the client got from its configuration (NULL: none; the election's own
 * client, whose Lease writes are what keeps the gate open). */
void kube_client_set_write_gate(kube_client *k, const kube_gate *gate);
/* Whether a write would be let through now (always without a gate). */
bool kube_may_write(const kube_client *k);

/* The path of a resource: api_version "v1" -> /api/v1, "group/version" -> /apis/group/version;
 * namespace NULL or "" for cluster-scoped resources or all namespaces; name NULL for the
 * collection. Names are checked (DNS-1123 characters) so they need no escaping. */
int kube_path(char *out, size_t outsz, const char *api_version, const char *namespace,
              const char *resource, const char *name, err_t *err);

/* Requests sent to the API server by every client of this process, by verb: what the operator's
 * /metrics reports (cephalo_operator_api_requests_total) and its scale benchmark counts. A GET of
 * a collection is a list; a watch is counted when its stream is opened. */
typedef enum { KUBE_VERB_GET, KUBE_VERB_LIST, KUBE_VERB_CREATE, KUBE_VERB_UPDATE, KUBE_VERB_PATCH,
               KUBE_VERB_DELETE, KUBE_VERB_WATCH, KUBE_VERB_COUNT } kube_verb;
const char *kube_verb_name(kube_verb v);
long kube_requests(kube_verb v);

/* One request. `body` may be NULL; `content_type` NULL means application/json. On a 2xx status
 * returns 0 and the parsed body in *out (NULL when the body is empty or out is NULL). Otherwise
 * -1 with *status set to the HTTP status (0 when no response came: connection refused, TLS
 * failure, stopped) and the error naming the method, URL, status and the API's message. */
int kube_request(kube_client *k, const char *method, const char *path, const char *content_type,
                 const char *body, cJSON **out, long *status, err_t *err);

/* GET (one object or a list: `path` may carry a query string). */
int kube_get(kube_client *k, const char *path, cJSON **out, long *status, err_t *err);
/* POST obj to a collection path. */
int kube_create(kube_client *k, const char *collection, const cJSON *obj, cJSON **out,
                long *status, err_t *err);
/* PUT obj (with metadata.resourceVersion for optimistic concurrency: a stale one gets 409). */
int kube_replace(kube_client *k, const char *path, const cJSON *obj, cJSON **out, long *status,
                 err_t *err);
/* DELETE with propagationPolicy=Background (owned objects go too). */
int kube_delete(kube_client *k, const char *path, long *status, err_t *err);
/* PATCH with application/merge-patch+json (RFC 7386: null removes a field, objects merge). */
int kube_merge_patch(kube_client *k, const char *path, const cJSON *patch, cJSON **out,
                     long *status, err_t *err);
/* The status subresource: PUT or merge-PATCH path + "/status". The main resource ignores status
 * changes when the subresource is enabled, and the subresource ignores everything else. */
int kube_replace_status(kube_client *k, const char *path, const cJSON *obj, cJSON **out,
                        long *status, err_t *err);
int kube_merge_patch_status(kube_client *k, const char *path, const cJSON *patch, cJSON **out,
                            long *status, err_t *err);

/* Read-modify-write with conflict retries (client-go's RetryOnConflict): GET path, let `mutate`
 * change the object in place, PUT it back (to path + "/status" when `status_subresource`). A 409
 * Conflict means someone wrote in between: start again from a fresh GET, up to `attempts` times
 * in all. `mutate` returns 1 to write, 0 when nothing needs writing (no PUT is made), -1 with the
 * error set to give up. The written (or unchanged) object goes to *out when out is not NULL. */
typedef int (*kube_mutate_fn)(cJSON *obj, void *arg, err_t *err);
int kube_update_retry(kube_client *k, const char *path, bool status_subresource, int attempts,
                      kube_mutate_fn mutate, void *arg, cJSON **out, long *status, err_t *err);

/* A core/v1 Event about an object. The client remembers the events it emitted recently: the same
 * (object, type, reason, message) again bumps `count` and lastTimestamp on the existing Event
 * (a merge patch) instead of creating another, as kubectl describe expects. */
typedef struct kube_event {
    const char *namespace; /* of the event: the object's namespace */
    const char *api_version, *kind, *name, *uid; /* the involved object (uid may be NULL) */
    const char *type; /* "Normal" or "Warning" */
    const char *reason; /* CamelCase, e.g. "Planned" */
    const char *message;
    const char *component; /* source.component, e.g. "cephalo-operator" */
} kube_event;
int kube_event_emit(kube_client *k, const kube_event *ev, err_t *err);

/* A streaming GET for watches: each piece of a 2xx body goes to `on_data` as it arrives
 * (return 0 to go on, -1 with the error set to stop). A non-2xx answer is collected and turned
 * into the usual error with *status set. Returns 0 when the server ended the stream, -1 on error,
 * when on_data stopped it, or when the stop flag was raised (err says which). `timeout_s` bounds
 * the whole stream (0: none). */
typedef int (*kube_data_fn)(const char *data, size_t len, void *arg, err_t *err);
int kube_stream(kube_client *k, const char *path, double timeout_s, kube_data_fn on_data,
                void *arg, long *status, err_t *err);

/* Timestamps as the API writes them: RFC 3339 "2024-05-01T12:00:00Z" (Time) and with
 * microseconds "2024-05-01T12:00:00.000000Z" (MicroTime, used by Leases). */
void kube_time_now(char *out, size_t outsz);
void kube_microtime_now(char *out, size_t outsz);
/* Time t (seconds since the epoch) as an RFC 3339 Time, rounded up to the second: a time to wait
 * for is never shown earlier than it is. */
void kube_time_at(double t, char *out, size_t outsz);
/* Now in seconds since the epoch (wall time: to compare with the API's timestamps). */
double kube_time_now_s(void);
/* Parses either form into seconds since the epoch; false when it is neither. */
bool kube_time_parse(const char *s, double *out);

/* metadata.<field> of an object as a string, or NULL. */
const char *kube_meta_str(const cJSON *obj, const char *field);
/* A pod's volume: {"name": name, source_kind: source} appended to the pod spec's volumes (source
 * is taken over) and its mount at mount_path to the container's volumeMounts. */
void kube_pod_volume(cJSON *volumes, cJSON *mounts, const char *name, const char *mount_path, bool read_only,
                     const char *source_kind, cJSON *source);

#endif
