/* progress.c - a training job's progress from its workers' /metrics (progress.h). */
#include "operator/progress.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

#include "common/strutil.h"

#define PROGRESS_MAX_BYTES (1 << 20) /* a worker's exposition is a few KiB */

/* One sample line "name{labels} value [timestamp]": its value when the name matches. */
static bool sample_value(const char *line, size_t n, const char *name, double *out) {
    size_t k = strlen(name);
    if (n <= k || strncmp(line, name, k) != 0 || (line[k] != '{' && line[k] != ' ')) return false;
    size_t i = k;
    if (line[i] == '{') { /* label values may hold '}' inside quotes */
        bool quoted = false;
        for (i++; i < n; i++) {
            if (quoted && line[i] == '\\') i++;
            else if (line[i] == '"') quoted = !quoted;
            else if (!quoted && line[i] == '}') break;
        }
        if (i >= n) return false;
        i++;
    }
    char buf[64];
    while (i < n && line[i] == ' ') i++;
    size_t j = 0;
    while (i < n && line[i] != ' ' && j + 1 < sizeof buf) buf[j++] = line[i++];
    buf[j] = '\0';
    char *end;
    double v = strtod(buf, &end);
    if (j == 0 || *end || !isfinite(v)) return false;
    *out = v;
    return true;
}

int progress_parse(const char *text, size_t len, worker_progress *p) {
    const char *s = text, *e = text + len;
    while (s < e) {
        const char *nl = memchr(s, '\n', (size_t)(e - s));
        size_t n = nl ? (size_t)(nl - s) : (size_t)(e - s);
        if (n && s[0] != '#') {
            p->have_step |= sample_value(s, n, "cephalo_train_step", &p->step);
            p->have_ckpt |= sample_value(s, n, "cephalo_checkpoint_step", &p->ckpt_step);
            p->have_loss |= sample_value(s, n, "cephalo_train_loss", &p->loss);
            p->have_rate |= sample_value(s, n, "cephalo_train_samples_per_second", &p->samples_per_s);
        }
        s += n + 1;
    }
    return p->have_step + p->have_ckpt + p->have_loss + p->have_rate;
}

typedef struct body {
    char *buf;
    size_t len, cap;
} body;

static size_t on_data(char *ptr, size_t size, size_t nmemb, void *ud) {
    body *b = ud;
    size_t n = size * nmemb;
    if (b->len + n > PROGRESS_MAX_BYTES) return 0; /* not a worker: give up */
    str_append(&b->buf, &b->len, &b->cap, ptr, n);
    return n;
}

int progress_scrape(const char *url, double timeout_s, worker_progress *p, err_t *err) {
    CURL *c = curl_easy_init();
    if (!c) return err_set(err, "GET %s: cannot make a libcurl handle", url);
    body b = {0};
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http");
    curl_easy_setopt(c, CURLOPT_NOPROXY, "*"); /* pod IPs: never through an http_proxy */
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(timeout_s * 1e3));
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    CURLcode rc = curl_easy_perform(c);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(c);
    int ret = 0;
    if (rc != CURLE_OK) ret = err_set(err, "GET %s: %s", url, curl_easy_strerror(rc));
    else if (status != 200) ret = err_set(err, "GET %s: HTTP %ld", url, status);
    else progress_parse(b.buf ? b.buf : "", b.len, p);
    free(b.buf);
    return ret;
}
