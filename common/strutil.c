/* realpath() is XSI, beyond the POSIX base the build selects (str_path_name) */
#define _XOPEN_SOURCE 700

#include "common/log.h"
#include "common/strutil.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void str_normalize(const char *in, char *out, size_t outsz) {
    size_t j = 0;
    for (; *in && j + 1 < outsz; in++) {
        if (*in == '-' || *in == '_' || *in == ' ' || *in == '.') continue;
        out[j++] = (char)tolower((unsigned char)*in);
    }
    out[j] = '\0';
}

int str_edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    int *row = calloc(lb + 1, sizeof *row);
    if (!row) return 1 << 20;
    for (size_t j = 0; j <= lb; j++) row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int up = row[j];
            int sub = diag + (a[i - 1] != b[j - 1]);
            int best = up + 1 < row[j - 1] + 1 ? up + 1 : row[j - 1] + 1;
            row[j] = sub < best ? sub : best;
            diag = up;
        }
    }
    int d = row[lb];
    free(row);
    return d;
}

int str_suggest(const char *name, const char *const *candidates, size_t ncand, int max, char *out,
                size_t outsz) {
    char key[128], cand[128];
    str_normalize(name, key, sizeof key);
    int limit = (int)strlen(key) / 3;
    if (limit < 2) limit = 2;
    out[0] = '\0';
    int written = 0;
    /* Closest first: walk the distances upward so the best suggestion leads. */
    for (int d = 0; d <= limit && written < max; d++) {
        for (size_t i = 0; i < ncand && written < max; i++) {
            str_normalize(candidates[i], cand, sizeof cand);
            int dist = str_edit_distance(key, cand);
            /* A prefix match ("a100" for "a10040gb") is as good as a near miss. */
            bool prefix = strlen(key) >= 2 && strncmp(cand, key, strlen(key)) == 0;
            if (dist != d && !(prefix && d == 1 && dist > limit)) continue;
            size_t len = strlen(out);
            snprintf(out + len, outsz - len, "%s'%s'", written ? ", " : "", candidates[i]);
            written++;
        }
    }
    return written;
}

bool str_to_long(const char *s, long *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end) return false;
    *out = v;
    return true;
}

bool str_to_double(const char *s, double *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v)) return false;
    *out = v;
    return true;
}

bool str_to_size(const char *s, int64_t *out) {
    /* strtod alone would also take " 5", "+5", "inf" and hex ("0x10") */
    if (!s || !(isdigit((unsigned char)*s) || *s == '.') || strpbrk(s, "xX")) return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !isfinite(v)) return false;
    static const char units[] = "KMGT";
    const char *u = *end ? strchr(units, toupper((unsigned char)*end)) : NULL;
    double mul = u ? (double)(1ULL << (10 * (u - units + 1))) : 1;
    if (u) end++;
    if (u && *end == 'i') end++;
    if (*end == 'B') end++;
    if (*end || !(v > 0) || v * mul > 4.611686018427388e18 || v * mul < 1) return false;
    *out = (int64_t)(v * mul);
    return true;
}

void str_one_line(const char *in, char *out, size_t n) {
    size_t k = 0;
    if (!n) return;
    for (const unsigned char *p = (const unsigned char *)in; *p; p++) {
        char esc[8] = {(char)*p, 0};
        if (*p == '\n') memcpy(esc, "\\n", 3);
        else if (*p == '\r') memcpy(esc, "\\r", 3);
        else if (*p < 0x20 && *p != '\t') snprintf(esc, sizeof esc, "\\x%02x", *p);
        else if (*p == 0x7f) memcpy(esc, "\\x7f", 5);
        size_t len = strlen(esc);
        if (k + len >= n) break; /* cut to fit, never inside an escape */
        memcpy(out + k, esc, len);
        k += len;
    }
    out[k] = '\0';
}

const char *str_bytes(double bytes, char *buf, size_t bufsz) {
    const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    double v = bytes;
    while (fabs(v) >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, bufsz, u ? "%.2f %s" : "%.0f %s", v, unit[u]);
    return buf;
}

void str_append(char **p, size_t *len, size_t *cap, const void *data, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 4096;
        while (c < *len + n + 1) c *= 2;
        *p = xrealloc(*p, c);
        *cap = c;
    }
    memcpy(*p + *len, data, n);
    *len += n;
    (*p)[*len] = '\0';
}

/* vasprintf is a GNU extension: the length first, then the text */
static char *vformat(const char *fmt, va_list ap) {
    va_list again;
    va_copy(again, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    CHECK(n >= 0); /* only a bad format: never input */
    char *text = xmalloc((size_t)n + 1);
    vsnprintf(text, (size_t)n + 1, fmt, again);
    va_end(again);
    return text;
}

void str_appendf(char **p, size_t *len, size_t *cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *text = vformat(fmt, ap);
    va_end(ap);
    str_append(p, len, cap, text, strlen(text));
    free(text);
}

char *str_printf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *text = vformat(fmt, ap);
    va_end(ap);
    return text;
}

int str_fmt(char *buf, size_t n, err_t *err, const char *what, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(buf, n, fmt, ap);
    va_end(ap);
    if (len >= 0 && (size_t)len < n) return 0;
    /* the start of what would have been written is enough to recognize it */
    return err_set(err, "%s '%.60s%s' is too long (at most %zu characters)", what, n ? buf : "", len > 60 ? "..." : "",
                   n ? n - 1 : 0);
}

int str_utf8_len(const unsigned char *s, size_t n) {
    if (n == 0) return 0;
    int len = s[0] < 0x80 ? 1 : (s[0] >> 5) == 6 ? 2 : (s[0] >> 4) == 14 ? 3 : (s[0] >> 3) == 30 ? 4 : 0;
    if (len <= 1) return len;
    if ((size_t)len > n) return 0;
    uint32_t cp = s[0] & (0x7F >> len);
    for (int k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (s[k] & 0x3F);
    }
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    return cp >= min_cp[len] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF) ? len : 0;
}

bool str_ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

char *str_path_clean(const char *path) {
    size_t n = strlen(path);
    char *out = xmalloc(n + 2), *w = out;
    bool abs = path[0] == '/';
    size_t keep = abs; /* out[0..keep) cannot be taken back by "..": the root, or leading "../"s */
    if (abs) *w++ = '/';
    for (const char *p = path; *p;) {
        size_t len = strcspn(p, "/");
        if (len == 0 || (len == 1 && p[0] == '.')) {
            /* an empty or "." component: nothing */
        } else if (len == 2 && p[0] == '.' && p[1] == '.') {
            if ((size_t)(w - out) > keep) { /* drop the last component */
                while (w > out + keep && w[-1] != '/') w--;
                if (w > out + keep) w--; /* its separator */
            } else if (!abs) { /* above where the path starts: kept */
                if (w > out) *w++ = '/';
                *w++ = '.', *w++ = '.';
                keep = (size_t)(w - out);
            }
        } else {
            if (w > out && w[-1] != '/') *w++ = '/';
            memcpy(w, p, len), w += len;
        }
        p += len + (p[len] == '/');
    }
    if (w == out) *w++ = '.';
    *w = '\0';
    return out;
}

char *str_path_name(const char *path) {
    char *clean = str_path_clean(path);
    const char *slash = strrchr(clean, '/'), *base = slash ? slash + 1 : clean;
    if (*base && strcmp(base, ".") && strcmp(base, "..")) {
        char *name = xstrdup(base);
        free(clean);
        return name;
    }
    /* ".", "..", "../..", "/": no name in the spelling; the directory's own, when it exists */
    char real[PATH_MAX];
    bool found = realpath(clean, real) != NULL;
    free(clean);
    if (!found) return xstrdup("");
    slash = strrchr(real, '/'); /* absolute: there is one */
    return xstrdup(slash + 1);
}
