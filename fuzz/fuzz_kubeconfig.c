/* fuzz_kubeconfig.c - libFuzzer target for the operator's kubeconfig reader (kube_config_parse:
 * YAML through common/yaml_tree.c, then the current context, its cluster and user, base64 data
 * and relative file paths in operator/client/kube_config.c). A config that parses is checked for what
 * the client relies on (an http(s) server without a trailing '/', a namespace) and its decoded
 * buffers are read to their stated lengths; a refused one must say why. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "operator/client/kube.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Where the buffers are summed into, so the reads are not optimised away. */
static volatile unsigned sink;

static void read_bytes(const char *p, size_t n) {
    if (!p) return;
    for (size_t i = 0; i < n; i++)
        sink += (unsigned char)p[i];
}

static void check(const kube_config *c) {
    size_t n = c->server ? strlen(c->server) : 0;
    if (n == 0 || (strncmp(c->server, "https://", 8) && strncmp(c->server, "http://", 7)) || c->server[n - 1] == '/')
        abort();
    if (!c->namespace || !*c->namespace || !c->source) abort();
    read_bytes(c->ca_data, c->ca_len), read_bytes(c->cert_data, c->cert_len), read_bytes(c->key_data, c->key_len);
    const char *strs[] = {c->token, c->token_file, c->ca_file, c->cert_file, c->key_file};
    for (size_t i = 0; i < sizeof strs / sizeof *strs; i++)
        if (strs[i]) sink += (unsigned)strlen(strs[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kube_config c;
    err_t err;
    err.msg[0] = '\0';
    int rc = kube_config_parse("kubeconfig", "/etc/kube", (const char *)data, size, NULL, &c, &err);
    if (rc != 0 && (rc != -1 || !err.msg[0])) abort(); /* a refusal without its reason */
    if (rc == 0) check(&c);
    kube_config_free(&c);
    return 0;
}
