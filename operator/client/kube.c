/* kube.c - requests to the Kubernetes API over libcurl: TLS against the cluster CA, bearer tokens
 * re-read from their file, JSON in and out, errors carrying the API's Status message. */
#include "operator/client/kube.h"

#include <ctype.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>

#include "common/clock.h"
#include "common/fileio.h"
#include "common/json_util.h"
#include "common/log.h"
#include "common/strutil.h"

/* Events remembered for count bumps; older ones fall out round-robin (a repeat after that makes
 * a new Event, which is what the API's own event TTL would do anyway). */
#define KUBE_EVENT_CACHE 64
/* A non-2xx body is read up to this much for its message. */
#define KUBE_MAX_ERROR_BODY ((size_t)64 << 10)
#define KUBE_CONNECT_TIMEOUT_S 10L
#define KUBE_REQUEST_TIMEOUT_S 60L

typedef struct event_entry {
    char *key; /* object + type + reason + message */
    char *name; /* the Event's name */
    char *namespace;
    long count;
} event_entry;

struct kube_client {
    kube_config cfg;
    CURL *curl;
    char *token; /* current bearer token (static, or the file's content) */
    double token_read_s; /* when token_file was last read (monotonic) */
    const atomic_int *stop;
    long timeout_s; /* per request; 0: KUBE_REQUEST_TIMEOUT_S */
    const kube_gate *gate; /* kube_config.write_gate, or what kube_client_set_write_gate put */
    bool writing; /* the request under way is a write: the pre-request callback asks the gate */
    double passed_gate; /* wall time (epoch s) the write under way last passed the gate; 0: not */
    char errbuf[CURL_ERROR_SIZE];
    event_entry events[KUBE_EVENT_CACHE];
    int event_next;
};

static char *dup_or_null(const char *s) { return s ? xstrdup(s) : NULL; }

static char *dup_bytes(const char *p, size_t n) {
    if (!p) return NULL;
    char *d = xmalloc(n + 1);
    memcpy(d, p, n);
    d[n] = '\0';
    return d;
}

static void config_copy(kube_config *d, const kube_config *s) {
    d->server = dup_or_null(s->server);
    d->namespace = dup_or_null(s->namespace ? s->namespace : "default");
    d->token = dup_or_null(s->token);
    d->token_file = dup_or_null(s->token_file);
    d->ca_file = dup_or_null(s->ca_file);
    d->ca_data = dup_bytes(s->ca_data, s->ca_len);
    d->ca_len = s->ca_len;
    d->cert_file = dup_or_null(s->cert_file);
    d->key_file = dup_or_null(s->key_file);
    d->cert_data = dup_bytes(s->cert_data, s->cert_len);
    d->cert_len = s->cert_len;
    d->key_data = dup_bytes(s->key_data, s->key_len);
    d->key_len = s->key_len;
    d->source = dup_or_null(s->source ? s->source : "kube config");
    d->user_agent = dup_or_null(s->user_agent);
    d->write_gate = s->write_gate;
}

/* (Re)reads the token file when it is due or `force`d (after a 401). A failed re-read keeps the
 * old token: the file is swapped atomically by the kubelet, a read error is transient. */
static int refresh_token(kube_client *k, bool force, err_t *err) {
    if (!k->cfg.token_file) return 0;
    double now = clock_now_s();
    if (k->token && !force && now - k->token_read_s < KUBE_TOKEN_REREAD_S) return 0;
    size_t len;
    char *t = file_read_all(k->cfg.token_file, 1 << 20, &len, err);
    if (!t) {
        if (k->token) return 0;
        return err_prefix(err, "%s: bearer token", k->cfg.source);
    }
    while (len > 0 && isspace((unsigned char)t[len - 1])) t[--len] = '\0';
    if (len == 0) {
        free(t);
        if (k->token) return 0;
        return err_set(err, "%s: bearer token file %s is empty", k->cfg.source,
                       k->cfg.token_file);
    }
    free(k->token);
    k->token = t;
    k->token_read_s = now;
    return 0;
}

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;
/* curl_global_init is not thread-safe and must run once before any handle exists. */
static void curl_init(void) { curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT); }

kube_client *kube_client_new(const kube_config *c, err_t *err) {
    if (!c || !c->server) {
        err_set(err, "kube client: no API server configured");
        return NULL;
    }
    pthread_once(&curl_once, curl_init);
    if (curl_init_rc != CURLE_OK) {
        err_set(err, "kube client: libcurl initialisation failed: %s",
                curl_easy_strerror(curl_init_rc));
        return NULL;
    }
    kube_client *k = xcalloc(1, sizeof *k);
    config_copy(&k->cfg, c);
    k->token = dup_or_null(c->token);
    k->gate = c->write_gate;
    k->curl = curl_easy_init();
    if (!k->curl) {
        err_set(err, "kube client: cannot create a libcurl handle");
        kube_client_free(k);
        return NULL;
    }
    if (refresh_token(k, true, err) < 0) {
        kube_client_free(k);
        return NULL;
    }
    return k;
}

void kube_client_free(kube_client *k) {
    if (!k) return;
    if (k->curl) curl_easy_cleanup(k->curl);
    for (int i = 0; i < KUBE_EVENT_CACHE; i++) {
        free(k->events[i].key);
        free(k->events[i].name);
        free(k->events[i].namespace);
    }
    free(k->token);
    kube_config_free(&k->cfg);
    free(k);
}

const char *kube_client_namespace(const kube_client *k) { return k->cfg.namespace; }

void kube_client_set_stop(kube_client *k, const atomic_int *stop) { k->stop = stop; }
void kube_client_set_timeout(kube_client *k, long seconds) { k->timeout_s = seconds > 0 ? seconds : 0; }
void kube_client_set_write_gate(kube_client *k, const kube_gate *gate) { k->gate = gate; }
bool kube_may_write(const kube_client *k) { return !k->gate || k->gate->may_write(k->gate->arg); }

/* ---- paths ---------------------------------------------------------------------------------- */

/* Names, namespaces and resources go into URLs unescaped, so only URL-safe characters pass:
 * DNS-1123 names plus ':' (system:... RBAC names) and upper case (kinds in some names). */
static bool url_safe(const char *s, bool slash_ok) {
    if (!s || !*s) return false;
    for (const char *p = s; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '-' && *p != '.' && *p != ':' &&
            !(slash_ok && *p == '/'))
            return false;
    return true;
}

int kube_path(char *out, size_t outsz, const char *api_version, const char *namespace,
              const char *resource, const char *name, err_t *err) {
    if (!url_safe(api_version, true))
        return err_set(err, "invalid apiVersion '%s'", api_version ? api_version : "");
    if (!url_safe(resource, false))
        return err_set(err, "invalid resource '%s'", resource ? resource : "");
    if (namespace && *namespace && !url_safe(namespace, false))
        return err_set(err, "invalid namespace '%s'", namespace);
    if (name && !url_safe(name, false)) return err_set(err, "invalid name '%s'", name);
    bool core = strchr(api_version, '/') == NULL;
    bool ns = namespace && *namespace;
    int n = snprintf(out, outsz, "/%s/%s%s%s/%s%s%s", core ? "api" : "apis", api_version,
                     ns ? "/namespaces/" : "", ns ? namespace : "", resource, name ? "/" : "",
                     name ? name : "");
    if (n < 0 || (size_t)n >= outsz) return err_set(err, "API path too long (%s)", resource);
    return 0;
}

/* ---- transport ------------------------------------------------------------------------------ */

typedef struct buf {
    char *p;
    size_t len, cap, max;
    bool too_big;
} buf;

static size_t collect(char *ptr, size_t size, size_t nmemb, void *ud) {
    buf *b = ud;
    size_t n = size * nmemb;
    if (b->len + n > b->max) {
        b->too_big = true;
        return 0; /* aborts the transfer with CURLE_WRITE_ERROR */
    }
    str_append(&b->p, &b->len, &b->cap, ptr, n);
    return n;
}

static double wall_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int progress(void *ud, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un) {
    (void)dt, (void)dn, (void)ut, (void)un;
    const kube_client *k = ud;
    return k->stop && atomic_load(k->stop) ? 1 : 0;
}

#if LIBCURL_VERSION_NUM >= 0x075000 /* 7.80: CURLOPT_PREREQFUNCTION */
#define KUBE_HAVE_PREREQ 1
/* Called once the connection is ready, right before the request is sent: the gate's last word
 * (connecting, or waiting for a stopped process to resume, may have taken a while). */
static int prereq(void *ud, char *conn_primary_ip, char *conn_local_ip, int conn_primary_port, int conn_local_port) {
    (void)conn_primary_ip, (void)conn_local_ip, (void)conn_primary_port, (void)conn_local_port;
    kube_client *k = ud;
    if (!k->writing) return CURL_PREREQFUNC_OK;
    if (!kube_may_write(k)) return CURL_PREREQFUNC_ABORT;
    k->passed_gate = wall_now_s();
    return CURL_PREREQFUNC_OK;
}
#endif

/* Sets up the handle for one request; returns the header list to free after it. */
static struct curl_slist *setup(kube_client *k, const char *method, const char *url,
                                const char *content_type, const char *body, long timeout_s,
                                err_t *err) {
    CURL *c = k->curl;
    curl_easy_reset(c); /* keeps the connection cache: requests reuse the TLS connection */
    k->errbuf[0] = '\0';
    CURLcode rc = CURLE_OK;
#define SET(opt, val) \
    if (rc == CURLE_OK) rc = curl_easy_setopt(c, opt, val)
/* a PEM from memory (a copied blob) when the configuration has one, else from its file */
#define SET_PEM(what, blob_opt, file_opt, type_opt)                                          \
    if (k->cfg.what##_data) {                                                                \
        struct curl_blob b = {k->cfg.what##_data, k->cfg.what##_len, CURL_BLOB_COPY};        \
        SET(blob_opt, &b);                                                                   \
        if (type_opt) SET(type_opt, "PEM");                                                  \
    } else if (k->cfg.what##_file) {                                                         \
        SET(file_opt, k->cfg.what##_file);                                                   \
    }
    SET(CURLOPT_URL, url);
    SET(CURLOPT_NOSIGNAL, 1L);
    SET(CURLOPT_ERRORBUFFER, k->errbuf);
    SET(CURLOPT_CONNECTTIMEOUT, timeout_s < KUBE_CONNECT_TIMEOUT_S ? timeout_s : KUBE_CONNECT_TIMEOUT_S);
    SET(CURLOPT_TIMEOUT, timeout_s);
    SET(CURLOPT_TCP_KEEPALIVE, 1L);
    SET(CURLOPT_FOLLOWLOCATION, 0L);
    SET(CURLOPT_SSL_VERIFYPEER, 1L);
    SET(CURLOPT_SSL_VERIFYHOST, 2L);
    SET(CURLOPT_NOPROGRESS, 0L);
    SET(CURLOPT_XFERINFOFUNCTION, progress);
    SET(CURLOPT_XFERINFODATA, k);
    SET(CURLOPT_USERAGENT, k->cfg.user_agent ? k->cfg.user_agent : "cephalo-operator");
#ifdef KUBE_HAVE_PREREQ
    SET(CURLOPT_PREREQFUNCTION, prereq);
    SET(CURLOPT_PREREQDATA, k);
#endif
    SET_PEM(ca, CURLOPT_CAINFO_BLOB, CURLOPT_CAINFO, 0);
    SET_PEM(cert, CURLOPT_SSLCERT_BLOB, CURLOPT_SSLCERT, CURLOPT_SSLCERTTYPE);
    SET_PEM(key, CURLOPT_SSLKEY_BLOB, CURLOPT_SSLKEY, CURLOPT_SSLKEYTYPE);
    if (strcmp(method, "GET") == 0) {
        SET(CURLOPT_HTTPGET, 1L);
    } else {
        SET(CURLOPT_CUSTOMREQUEST, method);
        if (body) {
            SET(CURLOPT_POSTFIELDS, body);
            SET(CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(body));
        }
    }
#undef SET_PEM
#undef SET
    if (rc != CURLE_OK) {
        /* e.g. a libcurl whose TLS backend cannot take a CA or key from memory */
        err_set(err, "%s %s: libcurl refused an option: %s", method, url, curl_easy_strerror(rc));
        return NULL;
    }
    struct curl_slist *h = curl_slist_append(NULL, "Accept: application/json");
    h = curl_slist_append(h, "Expect:"); /* no 100-continue round trip for bodies */
    if (body) {
        char ct[128];
        snprintf(ct, sizeof ct, "Content-Type: %s", content_type ? content_type : "application/json");
        h = curl_slist_append(h, ct);
    }
    if (k->token) {
        size_t n = strlen(k->token) + 32;
        char *auth = xmalloc(n);
        snprintf(auth, n, "Authorization: Bearer %s", k->token);
        h = curl_slist_append(h, auth);
        free(auth);
    }
    if (!h) {
        err_set(err, "%s %s: out of memory for headers", method, url);
        return NULL;
    }
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    return h;
}

/* "HTTP 404 (NotFound): configmaps \"x\" not found" from a Status body, or the body's start. */
static void status_error(err_t *err, const char *method, const char *url, long status,
                         const char *body, size_t len) {
    err_t ignored; /* a body that is no Status is quoted below */
    cJSON *st = body && len ? json_parse("body", body, len, &ignored) : NULL;
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(st, "message");
    const cJSON *reason = cJSON_GetObjectItemCaseSensitive(st, "reason");
    if (cJSON_IsString(msg)) {
        err_set(err, "%s %s: HTTP %ld%s%s%s: %s", method, url, status,
                cJSON_IsString(reason) ? " (" : "", cJSON_IsString(reason) ? reason->valuestring : "",
                cJSON_IsString(reason) ? ")" : "", msg->valuestring);
    } else {
        char text[201];
        size_t n = 0;
        for (size_t i = 0; body && i < len && n < sizeof text - 1; i++)
            text[n++] = isprint((unsigned char)body[i]) ? body[i] : ' ';
        text[n] = '\0';
        err_set(err, "%s %s: HTTP %ld%s%s", method, url, status, n ? ": " : " (empty body)", text);
    }
    cJSON_Delete(st);
}

static _Atomic long kube_counts[KUBE_VERB_COUNT];

const char *kube_verb_name(kube_verb v) {
    static const char *names[KUBE_VERB_COUNT] = {"get", "list", "create", "update", "patch", "delete", "watch"};
    return v < KUBE_VERB_COUNT ? names[v] : "?";
}

long kube_requests(kube_verb v) { return v < KUBE_VERB_COUNT ? kube_counts[v] : 0; }

/* A GET of a collection (the path's last segment is a resource, not a name) is a list: core paths
 * /api/v1/R or /api/v1/namespaces/NS/R, group paths /apis/G/V/R or /apis/G/V/namespaces/NS/R. */
static kube_verb verb_of(const char *method, const char *path) {
    if (!strcmp(method, "POST")) return KUBE_VERB_CREATE;
    if (!strcmp(method, "PUT")) return KUBE_VERB_UPDATE;
    if (!strcmp(method, "PATCH")) return KUBE_VERB_PATCH;
    if (!strcmp(method, "DELETE")) return KUBE_VERB_DELETE;
    size_t len = strcspn(path, "?");
    int segs = 0;
    for (size_t i = 0; i < len; i++) segs += path[i] == '/' && i + 1 < len;
    bool core = !strncmp(path, "/api/", 5), named_ns = strstr(path, "/namespaces/") != NULL;
    int collection = (core ? 3 : 4) + (named_ns ? 2 : 0);
    bool ns_itself = named_ns && segs == collection - 1; /* /api/v1/namespaces/NS */
    return segs == collection && !ns_itself ? KUBE_VERB_LIST : KUBE_VERB_GET;
}

/* The server (at most KUBE_SERVER_MAX: kube_config.c) and the path: a cut URL would ask for
 * something else, so a path too long for it is an error. */
static int url_of(const kube_client *k, const char *path, char *url, err_t *err) {
    return str_fmt(url, KUBE_URL_MAX, err, "the request URL", "%s%s", k->cfg.server, path);
}

/* A write that passed the gate and went out, but finds it closed once done: the process was
 * stopped (or slowed) between the gate's last word and the send, or while the answer was on its
 * way. No client can close that window (kube.h); it is said, with the wall time the write passed
 * the gate, so that the write can be told from one sent after the fence closed (a bug). */
static void report_late_write(const kube_client *k, const char *method, const char *url, CURLcode rc) {
    if (!k->writing || kube_may_write(k)) return;
    long code = 0;
    if (rc == CURLE_OK) curl_easy_getinfo(k->curl, CURLINFO_RESPONSE_CODE, &code);
    char how[64];
    if (rc == CURLE_OK) snprintf(how, sizeof how, "HTTP %ld", code);
    else snprintf(how, sizeof how, "%s", curl_easy_strerror(rc));
    log_warn("%s %s: in flight when the leader Lease ran out: it passed the fence at %.6f (epoch s) "
             "while leading; answered: %s", method, url, k->passed_gate, how);
}

/* A write the gate refused: not sent. */
static int fenced(long *status, const char *method, const char *url, err_t *err) {
    *status = KUBE_FENCED;
    return err_set(err, "%s %s: not sent: this replica does not hold the leader Lease (fenced)", method, url);
}

int kube_request(kube_client *k, const char *method, const char *path, const char *content_type,
                 const char *body, cJSON **out, long *status, err_t *err) {
    if (out) *out = NULL;
    long st_local;
    if (!status) status = &st_local;
    *status = 0;
    char url[KUBE_URL_MAX];
    if (url_of(k, path, url, err) < 0) return -1;
    k->writing = strcmp(method, "GET") != 0;
    for (int attempt = 0;; attempt++) {
        if (k->writing && !kube_may_write(k)) return fenced(status, method, url, err);
        k->passed_gate = k->writing ? wall_now_s() : 0; /* the pre-request callback renews it */
        if (refresh_token(k, false, err) < 0) return -1;
        struct curl_slist *h = setup(k, method, url, content_type, body,
                                     k->timeout_s ? k->timeout_s : KUBE_REQUEST_TIMEOUT_S, err);
        if (!h) return -1;
        kube_counts[verb_of(method, path)]++;
        buf b = {.max = KUBE_MAX_BODY};
        curl_easy_setopt(k->curl, CURLOPT_WRITEFUNCTION, collect);
        curl_easy_setopt(k->curl, CURLOPT_WRITEDATA, &b);
        CURLcode rc = curl_easy_perform(k->curl);
        curl_slist_free_all(h);
        if (rc != CURLE_ABORTED_BY_CALLBACK) report_late_write(k, method, url, rc);
        if (rc != CURLE_OK) {
            free(b.p);
            if (k->writing && !kube_may_write(k) && rc == CURLE_ABORTED_BY_CALLBACK)
                return fenced(status, method, url, err); /* the gate closed while connecting */
            if (b.too_big)
                err_set(err, "%s %s: response larger than %zu MiB", method, url,
                        KUBE_MAX_BODY >> 20);
            else if (rc == CURLE_ABORTED_BY_CALLBACK)
                err_set(err, "%s %s: stopped", method, url);
            else
                err_set(err, "%s %s: %s", method, url, k->errbuf[0] ? k->errbuf : curl_easy_strerror(rc));
            return -1;
        }
        curl_easy_getinfo(k->curl, CURLINFO_RESPONSE_CODE, status);
        /* a rotated token: the old one may be rejected before our periodic re-read is due */
        if (*status == 401 && k->cfg.token_file && attempt == 0) {
            free(b.p);
            if (refresh_token(k, true, err) < 0) return -1;
            continue;
        }
        if (*status < 200 || *status > 299) {
            status_error(err, method, url, *status, b.p, b.len);
            free(b.p);
            return -1;
        }
        int ret = 0;
        if (out && b.len > 0) {
            err_t why;
            *out = json_parse("body", b.p, b.len, &why);
            if (!*out) ret = err_set(err, "%s %s: HTTP %ld but the body is not JSON (%s)", method, url, *status, why.msg);
        }
        free(b.p);
        return ret;
    }
}

static int request_json(kube_client *k, const char *method, const char *path, const char *ctype,
                        const cJSON *obj, cJSON **out, long *status, err_t *err) {
    char *body = obj ? cJSON_PrintUnformatted(obj) : NULL;
    if (obj && !body) return err_set(err, "%s %s: cannot serialise the body", method, path);
    int rc = kube_request(k, method, path, ctype, body, out, status, err);
    free(body);
    return rc;
}

int kube_get(kube_client *k, const char *path, cJSON **out, long *status, err_t *err) {
    return kube_request(k, "GET", path, NULL, NULL, out, status, err);
}

int kube_create(kube_client *k, const char *collection, const cJSON *obj, cJSON **out,
                long *status, err_t *err) {
    return request_json(k, "POST", collection, NULL, obj, out, status, err);
}

int kube_replace(kube_client *k, const char *path, const cJSON *obj, cJSON **out, long *status,
                 err_t *err) {
    return request_json(k, "PUT", path, NULL, obj, out, status, err);
}

int kube_delete(kube_client *k, const char *path, long *status, err_t *err) {
    char p[KUBE_PATH_MAX + 64];
    snprintf(p, sizeof p, "%s%cpropagationPolicy=Background", path, strchr(path, '?') ? '&' : '?');
    return kube_request(k, "DELETE", p, NULL, NULL, NULL, status, err);
}

int kube_merge_patch(kube_client *k, const char *path, const cJSON *patch, cJSON **out,
                     long *status, err_t *err) {
    return request_json(k, "PATCH", path, "application/merge-patch+json", patch, out, status, err);
}

static int status_path(char *out, size_t sz, const char *path, err_t *err) {
    if (strchr(path, '?')) return err_set(err, "%s: a status path takes no query", path);
    if (snprintf(out, sz, "%s/status", path) >= (int)sz) return err_set(err, "%s: path too long", path);
    return 0;
}

int kube_replace_status(kube_client *k, const char *path, const cJSON *obj, cJSON **out,
                        long *status, err_t *err) {
    char p[KUBE_PATH_MAX + 16];
    if (status) *status = 0;
    if (status_path(p, sizeof p, path, err) < 0) return -1;
    return kube_replace(k, p, obj, out, status, err);
}

int kube_merge_patch_status(kube_client *k, const char *path, const cJSON *patch, cJSON **out,
                            long *status, err_t *err) {
    char p[KUBE_PATH_MAX + 16];
    if (status) *status = 0;
    if (status_path(p, sizeof p, path, err) < 0) return -1;
    return kube_merge_patch(k, p, patch, out, status, err);
}

int kube_update_retry(kube_client *k, const char *path, bool status_subresource, int attempts,
                      kube_mutate_fn mutate, void *arg, cJSON **out, long *status, err_t *err) {
    if (out) *out = NULL;
    long st_local;
    if (!status) status = &st_local;
    if (attempts < 1) attempts = 1;
    for (int i = 0; i < attempts; i++) {
        cJSON *obj;
        if (kube_get(k, path, &obj, status, err) < 0) return -1;
        if (!obj) return err_set(err, "GET %s: empty body", path);
        int m = mutate(obj, arg, err);
        if (m <= 0) {
            if (m == 0 && out)
                *out = obj;
            else
                cJSON_Delete(obj);
            return m;
        }
        /* the GET's resourceVersion stays in obj: the PUT fails with 409 if anyone wrote since */
        int rc = status_subresource ? kube_replace_status(k, path, obj, out, status, err)
                                    : kube_replace(k, path, obj, out, status, err);
        cJSON_Delete(obj);
        if (rc == 0) return 0;
        if (*status != 409) return -1;
    }
    return err_prefix(err, "gave up after %d conflicting updates", attempts);
}

/* ---- events --------------------------------------------------------------------------------- */

static void format_time(char *out, size_t outsz, bool micro) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char base[32];
    strftime(base, sizeof base, "%Y-%m-%dT%H:%M:%S", &tm);
    if (micro)
        snprintf(out, outsz, "%s.%06ldZ", base, ts.tv_nsec / 1000);
    else
        snprintf(out, outsz, "%sZ", base);
}

void kube_time_now(char *out, size_t outsz) { format_time(out, outsz, false); }
void kube_time_at(double t, char *out, size_t outsz) {
    time_t tt = (time_t)ceil(t);
    struct tm tm;
    strftime(out, outsz, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&tt, &tm));
}
double kube_time_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}
void kube_microtime_now(char *out, size_t outsz) { format_time(out, outsz, true); }

/* Days since 1970-01-01 of a proleptic Gregorian date (timegm is not POSIX). */
static long days_from_civil(long y, long m, long d) {
    y -= m <= 2;
    long era = (y >= 0 ? y : y - 399) / 400;
    long yoe = y - era * 400;
    long doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    long doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

bool kube_time_parse(const char *s, double *out) {
    int y, mo, d, h, mi, se, n = 0;
    if (!s || sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d%n", &y, &mo, &d, &h, &mi, &se, &n) != 6 || n != 19)
        return false;
    if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || se > 60) return false;
    const char *p = s + n;
    double frac = 0, scale = 0.1;
    if (*p == '.') {
        p++;
        if (!isdigit((unsigned char)*p)) return false;
        for (; isdigit((unsigned char)*p); p++, scale /= 10) frac += (*p - '0') * scale;
    }
    long offset = 0;
    if (*p == 'Z' || *p == 'z') {
        p++;
    } else if (*p == '+' || *p == '-') {
        int oh, om, m = 0;
        if (sscanf(p + 1, "%2d:%2d%n", &oh, &om, &m) != 2 || m != 5) return false;
        offset = (oh * 3600L + om * 60L) * (*p == '-' ? -1 : 1);
        p += 6;
    } else {
        return false;
    }
    if (*p) return false;
    *out = (double)(days_from_civil(y, mo, d) * 86400L + h * 3600L + mi * 60L + se - offset) + frac;
    return true;
}

const char *kube_meta_str(const cJSON *obj, const char *field) {
    const cJSON *md = cJSON_GetObjectItemCaseSensitive(obj, "metadata");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(md, field);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static char *event_key(const kube_event *ev) {
    size_t n = 64;
    const char *parts[] = {ev->namespace, ev->kind, ev->name, ev->uid, ev->type, ev->reason,
                           ev->message};
    for (size_t i = 0; i < sizeof parts / sizeof *parts; i++) n += parts[i] ? strlen(parts[i]) : 0;
    char *key = xmalloc(n);
    snprintf(key, n, "%s\x1f%s\x1f%s\x1f%s\x1f%s\x1f%s\x1f%s", ev->namespace, ev->kind, ev->name,
             ev->uid ? ev->uid : "", ev->type, ev->reason, ev->message ? ev->message : "");
    return key;
}

/* Bumps count and lastTimestamp of an Event we made; 1 when the Event is gone (404). */
static int event_bump(kube_client *k, event_entry *e, err_t *err) {
    char path[KUBE_PATH_MAX], now[40];
    if (kube_path(path, sizeof path, "v1", e->namespace, "events", e->name, err) < 0) return -1;
    kube_time_now(now, sizeof now);
    cJSON *patch = cJSON_CreateObject();
    cJSON_AddNumberToObject(patch, "count", (double)(e->count + 1));
    cJSON_AddStringToObject(patch, "lastTimestamp", now);
    long status;
    int rc = kube_merge_patch(k, path, patch, NULL, &status, err);
    cJSON_Delete(patch);
    if (rc == 0) {
        e->count++;
        return 0;
    }
    return status == 404 ? 1 : -1;
}

int kube_event_emit(kube_client *k, const kube_event *ev, err_t *err) {
    if (!ev->namespace || !ev->kind || !ev->name || !ev->api_version || !ev->reason ||
        !*ev->reason)
        return err_set(err, "event: namespace, involved object and reason are required");
    if (!ev->type || (strcmp(ev->type, "Normal") != 0 && strcmp(ev->type, "Warning") != 0))
        return err_set(err, "event %s: type must be Normal or Warning", ev->reason);
    char *key = event_key(ev);
    for (int i = 0; i < KUBE_EVENT_CACHE; i++) {
        event_entry *e = &k->events[i];
        if (!e->key || strcmp(e->key, key) != 0) continue;
        int rc = event_bump(k, e, err);
        if (rc <= 0) {
            free(key);
            return rc;
        }
        free(e->key), free(e->name), free(e->namespace); /* deleted (TTL): make a new one */
        memset(e, 0, sizeof *e);
        break;
    }
    /* named like client-go's recorder: the object's name and a unique hex suffix */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    char name[256], now[40], path[KUBE_PATH_MAX];
    snprintf(name, sizeof name, "%.200s.%llx", ev->name,
             (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec);
    kube_time_now(now, sizeof now);
    if (kube_path(path, sizeof path, "v1", ev->namespace, "events", NULL, err) < 0) {
        free(key);
        return -1;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "apiVersion", "v1");
    cJSON_AddStringToObject(o, "kind", "Event");
    cJSON *md = cJSON_AddObjectToObject(o, "metadata");
    cJSON_AddStringToObject(md, "name", name);
    cJSON_AddStringToObject(md, "namespace", ev->namespace);
    cJSON *inv = cJSON_AddObjectToObject(o, "involvedObject");
    cJSON_AddStringToObject(inv, "apiVersion", ev->api_version);
    cJSON_AddStringToObject(inv, "kind", ev->kind);
    cJSON_AddStringToObject(inv, "name", ev->name);
    cJSON_AddStringToObject(inv, "namespace", ev->namespace);
    if (ev->uid) cJSON_AddStringToObject(inv, "uid", ev->uid);
    cJSON_AddStringToObject(o, "reason", ev->reason);
    char msg[1025]; /* the API truncates long messages anyway; keep Events small */
    snprintf(msg, sizeof msg, "%s", ev->message ? ev->message : "");
    cJSON_AddStringToObject(o, "message", msg);
    cJSON_AddStringToObject(o, "type", ev->type);
    cJSON_AddNumberToObject(o, "count", 1);
    cJSON_AddStringToObject(o, "firstTimestamp", now);
    cJSON_AddStringToObject(o, "lastTimestamp", now);
    const char *comp = ev->component ? ev->component : "cephalo-operator";
    cJSON_AddObjectToObject(o, "source");
    cJSON_AddStringToObject(cJSON_GetObjectItem(o, "source"), "component", comp);
    cJSON_AddStringToObject(o, "reportingComponent", comp);
    long status;
    int rc = kube_create(k, path, o, NULL, &status, err);
    cJSON_Delete(o);
    if (rc < 0) {
        free(key);
        return -1;
    }
    event_entry *e = &k->events[k->event_next];
    k->event_next = (k->event_next + 1) % KUBE_EVENT_CACHE;
    free(e->key), free(e->name), free(e->namespace);
    e->key = key;
    e->name = xstrdup(name);
    e->namespace = xstrdup(ev->namespace);
    e->count = 1;
    return 0;
}

/* ---- streaming ------------------------------------------------------------------------------ */

typedef struct stream_ctx {
    kube_client *k;
    kube_data_fn on_data;
    void *arg;
    err_t *err;
    int ok; /* -1 unknown, 1 a 2xx body is streaming, 0 an error body is being collected */
    bool stopped_by_callback;
    buf errbody;
} stream_ctx;

static size_t stream_write(char *ptr, size_t size, size_t nmemb, void *ud) {
    stream_ctx *s = ud;
    size_t n = size * nmemb;
    if (s->ok < 0) {
        long code = 0;
        curl_easy_getinfo(s->k->curl, CURLINFO_RESPONSE_CODE, &code);
        s->ok = code >= 200 && code <= 299;
    }
    if (!s->ok) {
        /* keep the start of an error body for its message, drop the rest */
        size_t room = s->errbody.max - s->errbody.len;
        collect(ptr, 1, n < room ? n : room, &s->errbody);
        return n;
    }
    if (s->on_data(ptr, n, s->arg, s->err) < 0) {
        s->stopped_by_callback = true;
        return 0;
    }
    return n;
}

int kube_stream(kube_client *k, const char *path, double timeout_s, kube_data_fn on_data,
                void *arg, long *status, err_t *err) {
    long st_local;
    if (!status) status = &st_local;
    *status = 0;
    char url[KUBE_URL_MAX];
    if (url_of(k, path, url, err) < 0) return -1;
    for (int attempt = 0;; attempt++) {
        if (refresh_token(k, false, err) < 0) return -1;
        k->writing = false;
        struct curl_slist *h = setup(k, "GET", url, NULL, NULL, (long)(timeout_s + 0.999), err);
        if (!h) return -1;
        kube_counts[KUBE_VERB_WATCH]++;
        stream_ctx s = {k, on_data, arg, err, -1, false, {.max = KUBE_MAX_ERROR_BODY}};
        curl_easy_setopt(k->curl, CURLOPT_WRITEFUNCTION, stream_write);
        curl_easy_setopt(k->curl, CURLOPT_WRITEDATA, &s);
        CURLcode rc = curl_easy_perform(k->curl);
        curl_slist_free_all(h);
        curl_easy_getinfo(k->curl, CURLINFO_RESPONSE_CODE, status);
        if (s.stopped_by_callback) {
            free(s.errbody.p);
            return -1; /* err was set by on_data */
        }
        if (*status == 401 && k->cfg.token_file && attempt == 0) {
            free(s.errbody.p);
            if (refresh_token(k, true, err) < 0) return -1;
            continue;
        }
        int ret = 0;
        if (*status != 0 && (*status < 200 || *status > 299)) {
            status_error(err, "GET", url, *status, s.errbody.p, s.errbody.len);
            ret = -1;
        } else if (rc == CURLE_ABORTED_BY_CALLBACK) {
            ret = err_set(err, "GET %s: stopped", url);
        } else if (rc == CURLE_OPERATION_TIMEDOUT && s.ok == 1) {
            ret = 0; /* our own bound on a quiet stream: the same as the server ending it */
        } else if (rc != CURLE_OK) {
            ret = err_set(err, "GET %s: %s", url, k->errbuf[0] ? k->errbuf : curl_easy_strerror(rc));
        }
        free(s.errbody.p);
        return ret;
    }
}

void kube_pod_volume(cJSON *volumes, cJSON *mounts, const char *name, const char *mount_path, bool read_only,
                     const char *source_kind, cJSON *source) {
    cJSON *v = cJSON_CreateObject();
    cJSON_AddStringToObject(v, "name", name);
    cJSON_AddItemToObject(v, source_kind, source);
    cJSON_AddItemToArray(volumes, v);
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "name", name);
    cJSON_AddStringToObject(m, "mountPath", mount_path);
    cJSON_AddBoolToObject(m, "readOnly", read_only);
    cJSON_AddItemToArray(mounts, m);
}
