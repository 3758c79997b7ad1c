/* kube_config.c - where the API server is and how to authenticate: the in-cluster service
 * account, or a kubeconfig file (current-context or a named one). No network here. */
#include "operator/client/kube.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/env.h"
#include "common/fileio.h"
#include "common/log.h"
#include "common/yaml_tree.h"

/* Kubeconfigs and service account files are small; anything bigger is not one. */
#define KUBE_MAX_CONFIG ((size_t)16 << 20)

void kube_config_free(kube_config *c) {
    if (!c) return;
    free(c->server);
    free(c->namespace);
    free(c->token);
    free(c->token_file);
    free(c->ca_file);
    free(c->ca_data);
    free(c->cert_file);
    free(c->key_file);
    free(c->cert_data);
    free(c->key_data);
    free(c->source);
    free(c->user_agent);
    memset(c, 0, sizeof *c);
}

/* Strips trailing whitespace and newlines in place (token and namespace files end with one). */
static void trim_right(char *s) {
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1])) s[--n] = '\0';
}

/* "https://host:port/" -> "https://host:port"; only http(s) URLs with a host are accepted: without
 * one ("https://", found by fuzz/fuzz_kubeconfig.c) the slashes stripped below would leave
 * "https:", and every request would fail far from the kubeconfig's line. */
static int set_server(kube_config *c, const char *server, const char *where, err_t *err) {
    size_t scheme = !strncmp(server, "https://", 8) ? 8 : !strncmp(server, "http://", 7) ? 7 : 0;
    if (!scheme) return err_set(err, "%s: server '%s' is not an http(s) URL", where, server);
    if (server[scheme] == '\0' || server[scheme] == '/')
        return err_set(err, "%s: server '%.80s' has no host (expected http(s)://HOST[:PORT])", where, server);
    if (strlen(server) > KUBE_SERVER_MAX) /* every request's URL starts with it */
        return err_set(err, "%s: server '%.60s...' is too long (at most %d characters)", where, server, KUBE_SERVER_MAX);
    c->server = xstrdup(server);
    size_t n = strlen(c->server);
    while (n > 0 && c->server[n - 1] == '/') c->server[--n] = '\0';
    return 0;
}

int kube_config_in_cluster_at(const char *sa_dir, const char *host, const char *port,
                              kube_config *c, err_t *err) {
    memset(c, 0, sizeof *c);
    const char *what = "in-cluster config";
    if (!host || !*host)
        return err_set(err, "%s: KUBERNETES_SERVICE_HOST is not set (not running in a pod? use "
                            "--kubeconfig FILE)", what);
    if (!port || !*port)
        return err_set(err, "%s: KUBERNETES_SERVICE_PORT is not set", what);
    char url[KUBE_SERVER_MAX + 1];
    /* an IPv6 service address needs brackets in a URL */
    bool v6 = strchr(host, ':') != NULL;
    if (snprintf(url, sizeof url, "https://%s%s%s:%s", v6 ? "[" : "", host, v6 ? "]" : "", port) >=
        (int)sizeof url)
        return err_set(err, "%s: KUBERNETES_SERVICE_HOST is too long", what);
    c->source = xstrdup(what);
    c->server = xstrdup(url);

    char path[4096];
    snprintf(path, sizeof path, "%s/token", sa_dir);
    size_t len;
    char *tok = file_read_all(path, KUBE_MAX_CONFIG, &len, err);
    if (!tok) {
        err_prefix(err, "%s: service account token", what);
        kube_config_free(c);
        return -1;
    }
    free(tok); /* read again by the client, and again whenever it rotates */
    c->token_file = xstrdup(path);

    snprintf(path, sizeof path, "%s/ca.crt", sa_dir);
    char *ca = file_read_all(path, KUBE_MAX_CONFIG, &len, err);
    if (!ca) {
        err_prefix(err, "%s: cluster CA", what);
        kube_config_free(c);
        return -1;
    }
    c->ca_data = ca;
    c->ca_len = len;

    snprintf(path, sizeof path, "%s/namespace", sa_dir);
    err_t ignored;
    char *ns = file_read_all(path, KUBE_MAX_CONFIG, &len, &ignored);
    if (ns) trim_right(ns);
    if (ns && *ns) {
        c->namespace = ns;
    } else {
        free(ns);
        c->namespace = xstrdup("default");
    }
    return 0;
}

int kube_config_in_cluster(kube_config *c, err_t *err) {
    const char *sa_dir;
    if (env_text(KUBE_SA_DIR_ENV, &sa_dir, err) < 0) return -1;
    if (!sa_dir) sa_dir = KUBE_SA_DIR;
    return kube_config_in_cluster_at(sa_dir, getenv("KUBERNETES_SERVICE_HOST"),
                                     getenv("KUBERNETES_SERVICE_PORT"), c, err);
}

/* ---- kubeconfig ---------------------------------------------------------------------------- */

static int b64_value(int ch) {
    if (ch >= 'A' && ch <= 'Z') return ch - 'A';
    if (ch >= 'a' && ch <= 'z') return ch - 'a' + 26;
    if (ch >= '0' && ch <= '9') return ch - '0' + 52;
    if (ch == '+') return 62;
    if (ch == '/') return 63;
    return -1;
}

/* Standard base64 (whitespace ignored, padding optional). NULL when the text is not base64. */
static char *b64_decode(const char *in, size_t *out_len) {
    size_t n = strlen(in);
    char *out = xmalloc(n / 4 * 3 + 4);
    size_t o = 0;
    unsigned acc = 0;
    int bits = 0, pad = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)in[i];
        if (isspace(ch)) continue;
        if (ch == '=') {
            pad++;
            continue;
        }
        int v = b64_value(ch);
        if (v < 0 || pad) { /* a foreign character, or data after the padding */
            free(out);
            return NULL;
        }
        acc = (acc << 6) | (unsigned)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (char)((acc >> bits) & 0xff);
        }
    }
    if (bits >= 6 || pad > 2) { /* one dangling character cannot encode a byte */
        free(out);
        return NULL;
    }
    out[o] = '\0';
    *out_len = o;
    return out;
}

typedef struct kc {
    yctx y;
    const char *dir;
} kc;

/* An optional string field; *out stays NULL when absent. */
static int opt_string(const kc *k, const ynode *map, const char *path, const char *key,
                      const char **out) {
    *out = NULL;
    const ynode *n = ymap_get(map, key);
    if (!n) return 0;
    char full[256];
    snprintf(full, sizeof full, "%s.%s", path, key);
    return ynode_string(&k->y, n, full, out);
}

/* A "-data" field (base64 PEM) decoded into *data. */
static int opt_data(const kc *k, const ynode *map, const char *path, const char *key, char **data,
                    size_t *len) {
    const char *s;
    if (opt_string(k, map, path, key, &s) < 0) return -1;
    if (!s) return 0;
    *data = b64_decode(s, len);
    if (!*data || *len == 0)
        return err_set(k->y.err, "%s:%d: %s.%s: not valid base64", k->y.file,
                       ymap_get(map, key)->line, path, key);
    return 0;
}

/* A file path field, made absolute against the kubeconfig's directory when relative. */
static int opt_file(const kc *k, const ynode *map, const char *path, const char *key,
                    char **out) {
    const char *s;
    if (opt_string(k, map, path, key, &s) < 0) return -1;
    if (!s) return 0;
    if (s[0] == '/' || !k->dir || !*k->dir) {
        *out = xstrdup(s);
    } else {
        size_t n = strlen(k->dir) + strlen(s) + 2;
        *out = xmalloc(n);
        snprintf(*out, n, "%s/%s", k->dir, s);
    }
    return 0;
}

/* The map under `field` of the entry of list `list` whose name is `name`, e.g. the `cluster` of
 * clusters[i] with clusters[i].name == name. *path gets "clusters[i].cluster" for messages. */
static int find_named(const kc *k, const ynode *root, const char *list, const char *name,
                      const char *field, const ynode **out, char *path, size_t pathsz) {
    const ynode *seq;
    if (ymap_require(&k->y, root, "kubeconfig", list, &seq) < 0 ||
        ynode_expect(&k->y, seq, YNODE_SEQ, list) < 0)
        return -1;
    for (size_t i = 0; i < seq->n; i++) {
        char at[64];
        snprintf(at, sizeof at, "%s[%zu]", list, i);
        const ynode *e = seq->items[i], *nm;
        const char *s;
        if (ynode_expect(&k->y, e, YNODE_MAP, at) < 0 ||
            ymap_require(&k->y, e, at, "name", &nm) < 0)
            return -1;
        char npath[80];
        snprintf(npath, sizeof npath, "%s.name", at);
        if (ynode_string(&k->y, nm, npath, &s) < 0) return -1;
        if (strcmp(s, name) != 0) continue;
        const ynode *v;
        if (ymap_require(&k->y, e, at, field, &v) < 0) return -1;
        snprintf(path, pathsz, "%s.%s", at, field);
        if (ynode_expect(&k->y, v, YNODE_MAP, path) < 0) return -1;
        *out = v;
        return 0;
    }
    return err_set(k->y.err, "%s:%d: %s: no entry named '%s'", k->y.file, seq->line, list, name);
}

static int parse_cluster(const kc *k, const ynode *cl, const char *path, kube_config *c) {
    const ynode *srv;
    const char *server;
    char spath[300];
    snprintf(spath, sizeof spath, "%s.server", path);
    if (ymap_require(&k->y, cl, path, "server", &srv) < 0 ||
        ynode_string(&k->y, srv, spath, &server) < 0)
        return -1;
    char where[400];
    snprintf(where, sizeof where, "%s:%d: %s", k->y.file, srv->line, spath);
    if (set_server(c, server, where, k->y.err) < 0) return -1;
    const ynode *insecure = ymap_get(cl, "insecure-skip-tls-verify");
    bool skip = false;
    if (insecure) {
        char ipath[300];
        snprintf(ipath, sizeof ipath, "%s.insecure-skip-tls-verify", path);
        if (ynode_bool(&k->y, insecure, ipath, &skip) < 0) return -1;
        if (skip)
            return err_set(k->y.err, "%s:%d: %s: refused: the operator always verifies the API "
                                     "server against the cluster CA (give certificate-authority "
                                     "or certificate-authority-data)",
                           k->y.file, insecure->line, ipath);
    }
    if (opt_data(k, cl, path, "certificate-authority-data", &c->ca_data, &c->ca_len) < 0)
        return -1;
    if (!c->ca_data && opt_file(k, cl, path, "certificate-authority", &c->ca_file) < 0) return -1;
    return 0;
}

static int parse_user(const kc *k, const ynode *u, const char *path, kube_config *c) {
    /* auth plugins run programs or speak OAuth; the operator only needs what a service account
     * or an admin kubeconfig carries */
    static const char *const unsupported[] = {"exec", "auth-provider", "username", "password",
                                              NULL};
    for (int i = 0; unsupported[i]; i++) {
        const ynode *n = ymap_get(u, unsupported[i]);
        if (n)
            return err_set(k->y.err, "%s:%d: %s.%s: not supported (use token, tokenFile or a "
                                     "client certificate)",
                           k->y.file, n->line, path, unsupported[i]);
    }
    const char *tok;
    if (opt_string(k, u, path, "token", &tok) < 0) return -1;
    if (tok) c->token = xstrdup(tok);
    if (opt_file(k, u, path, "tokenFile", &c->token_file) < 0 ||
        opt_data(k, u, path, "client-certificate-data", &c->cert_data, &c->cert_len) < 0 ||
        opt_data(k, u, path, "client-key-data", &c->key_data, &c->key_len) < 0)
        return -1;
    if (!c->cert_data && opt_file(k, u, path, "client-certificate", &c->cert_file) < 0) return -1;
    if (!c->key_data && opt_file(k, u, path, "client-key", &c->key_file) < 0) return -1;
    bool has_cert = c->cert_data || c->cert_file, has_key = c->key_data || c->key_file;
    if (has_cert != has_key)
        return err_set(k->y.err, "%s:%d: %s: missing field '%s'", k->y.file, u->line, path,
                       has_cert ? "client-key-data' (or 'client-key"
                                : "client-certificate-data' (or 'client-certificate");
    return 0;
}

int kube_config_parse(const char *name, const char *dir, const char *text, size_t len,
                      const char *context, kube_config *c, err_t *err) {
    memset(c, 0, sizeof *c);
    ynode *root = ytree_load_string(name, text, len, err);
    if (!root) return -1;
    kc k = {{name, err}, dir};
    int rc = -1;
    const ynode *cur, *ctx, *cl, *u = NULL, *n;
    const char *ctx_name = context, *cl_name, *u_name = NULL, *ns = NULL;
    char ctx_path[128], cl_path[128], u_path[128];
    if (ynode_expect(&k.y, root, YNODE_MAP, "kubeconfig") < 0) goto out;
    if (!ctx_name) {
        if (ymap_require(&k.y, root, "kubeconfig", "current-context", &cur) < 0 ||
            ynode_string(&k.y, cur, "current-context", &ctx_name) < 0)
            goto out;
    }
    if (find_named(&k, root, "contexts", ctx_name, "context", &ctx, ctx_path, sizeof ctx_path) <
        0)
        goto out;
    char fpath[160];
    snprintf(fpath, sizeof fpath, "%s.cluster", ctx_path);
    if (ymap_require(&k.y, ctx, ctx_path, "cluster", &n) < 0 ||
        ynode_string(&k.y, n, fpath, &cl_name) < 0 ||
        opt_string(&k, ctx, ctx_path, "user", &u_name) < 0 ||
        opt_string(&k, ctx, ctx_path, "namespace", &ns) < 0)
        goto out;
    if (find_named(&k, root, "clusters", cl_name, "cluster", &cl, cl_path, sizeof cl_path) < 0 ||
        parse_cluster(&k, cl, cl_path, c) < 0)
        goto out;
    if (u_name && (find_named(&k, root, "users", u_name, "user", &u, u_path, sizeof u_path) < 0 ||
                   parse_user(&k, u, u_path, c) < 0))
        goto out;
    c->namespace = xstrdup(ns ? ns : "default");
    c->source = xstrdup(name);
    rc = 0;
out:
    ytree_free(root);
    if (rc < 0) kube_config_free(c);
    return rc;
}

int kube_config_load(const char *path, const char *context, kube_config *c, err_t *err) {
    memset(c, 0, sizeof *c);
    size_t len;
    char *text = file_read_all(path, KUBE_MAX_CONFIG, &len, err);
    if (!text) return -1;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        slash[slash == dir ? 1 : 0] = '\0'; /* "/kubeconfig" lives in "/" */
    else
        dir[0] = '\0';
    int rc = kube_config_parse(path, dir, text, len, context, c, err);
    free(text);
    return rc;
}
