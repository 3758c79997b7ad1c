#include "common/json_util.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fileio.h"
#include "common/log.h"
#include "common/strutil.h"

/* Strings quoted in messages are cut here so that one long value cannot crowd out the rest. */
#define JSON_MSG_TEXT 48

/* ---- loading ----------------------------------------------------------------------------- */

static bool is_json_space(char ch) {
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r';
}

/* Copies up to `max` bytes of `s` into `out` for a message: control bytes become '?', quotes and
 * backslashes are escaped, and a cut is marked with "...". */
static void message_text(const char *s, size_t len, size_t max, char *out, size_t outsz) {
    size_t j = 0;
    CHECK(outsz >= 8);
    for (size_t i = 0; i < len && i < max && j + 5 < outsz; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\' || ch == '\'') out[j++] = '\\';
        out[j++] = ch < 0x20 || ch == 0x7f ? '?' : (char)ch;
    }
    if (len > max && j + 4 <= outsz) {
        memcpy(out + j, "...", 3);
        j += 3;
    }
    out[j] = '\0';
}

/* The 1-based line and column (in bytes, as compilers count) of the byte at `off`. */
static void line_col(const char *text, size_t off, size_t *line, size_t *col) {
    size_t line_start = 0;
    *line = 1;
    for (size_t i = 0; i < off; i++) {
        if (text[i] == '\n') {
            (*line)++;
            line_start = i + 1;
        }
    }
    *col = off - line_start + 1;
}

/* "FILE:LINE:COL: JSON syntax error near '...'" for the byte at `off`. */
static void syntax_error(const char *name, const char *text, size_t len, size_t off,
                         const char *why, err_t *err) {
    if (off > len) off = len;
    size_t line, col;
    line_col(text, off, &line, &col);
    if (off == len) {
        err_set(err, "%s:%zu:%zu: JSON syntax error at the end of the input%s", name, line, col,
                why);
        return;
    }
    size_t n = 0;
    while (off + n < len && n < 20 && text[off + n] != '\n' && text[off + n] != '\r')
        n++;
    char near[96];
    message_text(text + off, n, 20, near, sizeof near);
    err_set(err, "%s:%zu:%zu: JSON syntax error near '%s'%s", name, line, col, near, why);
}

/* What cJSON lets through, or reports only as a syntax error, found in one pass over text[0, len):
 * a NUL or another control byte between values (cJSON skips every byte up to the space as
 * whitespace), a NUL in a string, raw or as \u0000 (the C string cJSON makes ends there: the
 * rest would be lost without a word), and nesting deeper than cJSON's limit. True with the
 * offset of the first and what it is. */
static bool find_unsupported(const char *text, size_t len, size_t *off, char *why, size_t whysz) {
    int depth = 0;
    bool in_string = false;
    for (size_t i = 0; i < len; i++) {
        if (in_string) /* most bytes are a string's plain ones: passed over in a tight loop */
            while (i < len && text[i] != '"' && text[i] != '\\' && text[i] != '\0') i++;
        if (i == len) break;
        unsigned char ch = (unsigned char)text[i];
        *off = i;
        if (in_string) {
            if (ch == '"') in_string = false;
            else if (ch == 0) return snprintf(why, whysz, "a NUL byte in a string"), true;
            else if (ch == '\\' && i + 1 < len && text[i + 1] == 'u' && i + 6 <= len && !memcmp(text + i + 2, "0000", 4))
                return snprintf(why, whysz, "a \\u0000 (NUL) in a string, which is not supported (the text would end there)"), true;
            else if (ch == '\\') i++; /* the escaped character cannot end the string */
            continue;
        }
        if (ch == '"') in_string = true;
        else if ((ch == '[' || ch == '{') && ++depth > CJSON_NESTING_LIMIT)
            return snprintf(why, whysz, "nesting deeper than %d (arrays and objects inside each other)", CJSON_NESTING_LIMIT), true;
        else if ((ch == ']' || ch == '}') && depth > 0) depth--;
        else if (ch == 0)
            return snprintf(why, whysz, "a NUL byte between values (only spaces, tabs and line breaks may be there)"), true;
        else if (ch < 0x20 && !is_json_space((char)ch))
            return snprintf(why, whysz, "a control byte 0x%02x between values (only spaces, tabs and line breaks may be there)", ch), true;
    }
    return false;
}

static int key_cmp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The first key of `obj`'s members that appears twice, or NULL. Small objects compare pairs; large
 * ones (a tokenizer's vocabulary) sort a copy of their keys. */
static const char *twice_in(const cJSON *obj) {
    int n = cJSON_GetArraySize(obj), k = 0;
    if (n < 2) return NULL;
    const char *small[16], *dup = NULL;
    const char **keys = n <= 16 ? small : xmalloc((size_t)n * sizeof *keys);
    const cJSON *m;
    cJSON_ArrayForEach(m, obj) keys[k++] = m->string ? m->string : "";
    if (n <= 16) {
        for (int i = 1; i < n && !dup; i++)
            for (int j = 0; j < i && !dup; j++)
                if (!strcmp(keys[i], keys[j])) dup = keys[i];
        return dup;
    }
    qsort(keys, (size_t)n, sizeof *keys, key_cmp);
    for (int i = 1; i < n && !dup; i++)
        if (!strcmp(keys[i - 1], keys[i])) dup = keys[i];
    free(keys);
    return dup;
}

/* The first object in `item` (itself, or nested at any depth) with a key twice; its key in *key. */
static const cJSON *find_duplicate(const cJSON *item, const char **key) {
    if (cJSON_IsObject(item) && (*key = twice_in(item))) return item;
    const cJSON *m, *found;
    cJSON_ArrayForEach(m, item) {
        if ((cJSON_IsObject(m) || cJSON_IsArray(m)) && (found = find_duplicate(m, key))) return found;
    }
    return NULL;
}

/* The path from `item` down to `target` ("a.b[2].c"; "" for item itself) into buf[len..n). */
static bool path_to(const cJSON *item, const cJSON *target, char *buf, size_t n, size_t len) {
    if (item == target) return true;
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, item) {
        if (cJSON_IsObject(m) || cJSON_IsArray(m)) {
            char part[JSON_MSG_TEXT * 2 + 8];
            if (cJSON_IsArray(item)) snprintf(part, sizeof part, "[%d]", i);
            else message_text(m->string ? m->string : "", strlen(m->string ? m->string : ""), JSON_MSG_TEXT, part, sizeof part);
            /* a message only: a path longer than the buffer is cut */
            int w = snprintf(buf + len, n - len, "%s%s", len && !cJSON_IsArray(item) ? "." : "", part);
            size_t next = w < 0 || (size_t)w >= n - len ? n - 1 : len + (size_t)w;
            if (path_to(m, target, buf, n, next)) return true;
            buf[len] = '\0';
        }
        i++;
    }
    return false;
}

/* A key twice in one object, anywhere in the document, is refused: cJSON keeps both members and
 * json_get() would take the first where Python's json (and serde, and transformers) take the
 * last, so two readers would read two documents. Every JSON the project reads comes through
 * json_parse, so this is the one rule for all of them. */
static int refuse_duplicates(const char *name, const cJSON *root, err_t *err) {
    const char *key = NULL;
    const cJSON *obj = find_duplicate(root, &key);
    if (!obj) return 0;
    char path[512] = "", shown[JSON_MSG_TEXT * 2 + 8];
    path_to(root, obj, path, sizeof path, 0);
    message_text(key, strlen(key), JSON_MSG_TEXT, shown, sizeof shown);
    return err_set(err, "%s: %s%sfield '%s' appears twice (readers differ on which one counts)", name, path,
                   *path ? ": " : "", shown);
}

cJSON *json_parse(const char *name, const char *text, size_t len, err_t *err) {
    size_t start = 0;
    while (start < len && is_json_space(text[start]))
        start++;
    if (start == len) {
        err_set(err, "%s: the document is empty", name);
        return NULL;
    }
    /* cJSON is given the length, but a NUL-terminated private copy keeps it from ever reading
     * past the caller's bytes, whatever the input (fuzzers hand us unterminated buffers). */
    char *copy = xmalloc(len + 1);
    memcpy(copy, text, len);
    copy[len] = '\0';
    const char *end = NULL;
    /* The *Opts variant reports the error position through `end` rather than only through
     * cJSON's global error pointer, so parsing stays thread-safe. */
    cJSON *root = cJSON_ParseWithLengthOpts(copy, len, &end, false);
    size_t off = end ? (size_t)(end - copy) : 0, bad;
    char why[160];
    /* what was read, and the byte cJSON stopped at when it failed: a problem found there is the
     * reason it failed, or one that it let through */
    if (find_unsupported(copy, root || off >= len ? len : off + 1, &bad, why, sizeof why)) {
        size_t line, col;
        line_col(copy, bad, &line, &col);
        err_set(err, "%s:%zu:%zu: %s", name, line, col, why);
        cJSON_Delete(root);
        free(copy);
        return NULL;
    }
    if (!root) {
        syntax_error(name, copy, len, off, "", err);
        free(copy);
        return NULL;
    }
    while (off < len && is_json_space(copy[off]))
        off++;
    if (off < len) {
        syntax_error(name, copy, len, off, " (content after the end of the document)", err);
        cJSON_Delete(root);
        root = NULL;
    }
    free(copy);
    if (root && refuse_duplicates(name, root, err) < 0) {
        cJSON_Delete(root);
        root = NULL;
    }
    return root;
}

cJSON *json_load_file(const char *path, err_t *err) {
    size_t len = 0;
    char *buf = file_read_all(path, JSON_MAX_FILE, &len, err);
    if (!buf) return NULL;
    cJSON *root = json_parse(path, buf, len, err);
    free(buf);
    return root;
}

/* ---- writing ----------------------------------------------------------------------------- */

cJSON *json_text(const char *s, size_t len) {
    const unsigned char *u = (const unsigned char *)s;
    char *out = xmalloc(6 * len + 3), *o = out; /* the longest: every byte a \u00XX */
    *o++ = '"';
    for (size_t i = 0; i < len;) {
        int n = str_utf8_len(u + i, len - i);
        if (n == 0) { /* not UTF-8: the replacement character, as decoders do */
            memcpy(o, "\xEF\xBF\xBD", 3), o += 3, i++;
        } else if (u[i] == '"' || u[i] == '\\') {
            *o++ = '\\', *o++ = (char)u[i++];
        } else if (u[i] < 0x20) {
            o += sprintf(o, "\\u%04x", u[i++]);
        } else {
            memcpy(o, u + i, (size_t)n), o += n, i += (size_t)n;
        }
    }
    *o++ = '"';
    *o = '\0';
    cJSON *item = cJSON_CreateRaw(out);
    free(out);
    return item;
}

/* ---- messages ---------------------------------------------------------------------------- */

const char *json_type_name(const cJSON *item) {
    if (!item) return "nothing";
    if (cJSON_IsObject(item)) return "an object";
    if (cJSON_IsArray(item)) return "an array";
    if (cJSON_IsString(item)) return "a string";
    if (cJSON_IsNumber(item)) return "a number";
    if (cJSON_IsBool(item)) return "a boolean";
    if (cJSON_IsNull(item)) return "null";
    return "an invalid value";
}

/* The value as a message shows it after "got": "x" (quoted), 3.5, true, null, an object. */
static const char *describe(const cJSON *item, char *buf, size_t bufsz) {
    if (cJSON_IsString(item) && item->valuestring) {
        char text[JSON_MSG_TEXT * 2 + 8];
        const char *s = item->valuestring;
        message_text(s, strlen(s), JSON_MSG_TEXT, text, sizeof text);
        snprintf(buf, bufsz, "\"%s\"", text);
    } else if (cJSON_IsNumber(item)) {
        snprintf(buf, bufsz, "%.15g", item->valuedouble);
    } else if (cJSON_IsTrue(item)) {
        snprintf(buf, bufsz, "true");
    } else if (cJSON_IsFalse(item)) {
        snprintf(buf, bufsz, "false");
    } else {
        snprintf(buf, bufsz, "%s", json_type_name(item));
    }
    return buf;
}

/* Sets "FILE: PATH: <message>" (no "PATH: " for the root, whose path is ""). */
static int fail(const json_ctx *c, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(const json_ctx *c, const char *path, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!path || !path[0]) return err_set(c->err, "%s: %s", c->file, msg);
    return err_set(c->err, "%s: %s: %s", c->file, path, msg);
}

/* "expected X, got Y" - the common shape of a wrong value. */
static int fail_expected(const json_ctx *c, const cJSON *item, const char *path,
                         const char *expected) {
    char got[JSON_MSG_TEXT * 2 + 16];
    return fail(c, path, "expected %s, got %s", expected, describe(item, got, sizeof got));
}

/* ---- members ----------------------------------------------------------------------------- */

const cJSON *json_get(const cJSON *obj, const char *key) {
    if (!cJSON_IsObject(obj)) return NULL;
    return cJSON_GetObjectItemCaseSensitive(obj, key);
}

int json_require(const json_ctx *c, const cJSON *obj, const char *path, const char *key,
                 const cJSON **out) {
    *out = NULL;
    if (json_expect_object(c, obj, path) < 0) return -1;
    *out = json_get(obj, key);
    if (*out) return 0;
    return fail(c, path, "missing field '%s'", key);
}

/* Index of `key` in `allowed`, or -1. */
static int key_index(const char *key, const char *const *allowed, size_t nallowed) {
    for (size_t i = 0; i < nallowed; i++)
        if (strcmp(key, allowed[i]) == 0) return (int)i;
    return -1;
}

int json_check_keys(const json_ctx *c, const cJSON *obj, const char *path,
                    const char *const *allowed) {
    if (json_expect_object(c, obj, path) < 0) return -1;
    size_t nallowed = 0;
    while (allowed[nallowed])
        nallowed++;
    CHECK(nallowed <= 64); /* one bit per allowed key below */
    uint64_t seen = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, obj) {
        const char *key = m->string ? m->string : "";
        char shown[JSON_MSG_TEXT * 2 + 8];
        message_text(key, strlen(key), JSON_MSG_TEXT, shown, sizeof shown);
        int k = key_index(key, allowed, nallowed);
        if (k < 0) {
            char sugg[256];
            int ns = str_suggest(key, allowed, nallowed, 1, sugg, sizeof sugg);
            return fail(c, path, "unknown field '%s'%s%s%s", shown, ns ? " (did you mean " : "",
                        ns ? sugg : "", ns ? "?)" : "");
        }
        if (seen & ((uint64_t)1 << k)) return fail(c, path, "duplicate field '%s'", shown);
        seen |= (uint64_t)1 << k;
    }
    return 0;
}

/* ---- typed values ------------------------------------------------------------------------ */

int json_expect_object(const json_ctx *c, const cJSON *item, const char *path) {
    if (cJSON_IsObject(item)) return 0;
    return fail_expected(c, item, path, "an object");
}

int json_expect_array(const json_ctx *c, const cJSON *item, const char *path, int *n) {
    if (!cJSON_IsArray(item)) return fail_expected(c, item, path, "an array");
    if (n) *n = cJSON_GetArraySize(item);
    return 0;
}

/* Writes "a number >= 0", "a number > 0 and < 1e+09", ... for the sides that have a bound.
 * `sides` selects them: 1 lower, 2 upper, 3 both. */
static void describe_range(double lo, double hi, json_bounds b, int sides, char *out,
                           size_t outsz) {
    const char *ge = b == JSON_OPEN ? ">" : ">=", *le = b == JSON_OPEN ? "<" : "<=";
    bool has_lo = (sides & 1) && lo > -INFINITY, has_hi = (sides & 2) && hi < INFINITY;
    if (has_lo && has_hi)
        snprintf(out, outsz, "a number %s %g and %s %g", ge, lo, le, hi);
    else if (has_lo)
        snprintf(out, outsz, "a number %s %g", ge, lo);
    else if (has_hi)
        snprintf(out, outsz, "a number %s %g", le, hi);
    else
        snprintf(out, outsz, "a number");
}

int json_number(const json_ctx *c, const cJSON *item, const char *path, double lo, double hi,
                json_bounds bounds, double *out) {
    char want[96];
    /* cJSON turns 1e999 into infinity; no measured quantity is infinite. */
    if (!cJSON_IsNumber(item) || !isfinite(item->valuedouble)) {
        describe_range(lo, hi, bounds, 3, want, sizeof want);
        return fail_expected(c, item, path, want);
    }
    double v = item->valuedouble;
    bool open = bounds == JSON_OPEN;
    bool low = open ? !(v > lo) : !(v >= lo);
    bool high = open ? !(v < hi) : !(v <= hi);
    if (low || high) {
        describe_range(lo, hi, bounds, low ? 1 : 2, want, sizeof want);
        return fail_expected(c, item, path, want);
    }
    *out = v;
    return 0;
}

int json_int(const json_ctx *c, const cJSON *item, const char *path, long lo, long hi, long *out) {
    char want[96];
    if (!cJSON_IsNumber(item) || !isfinite(item->valuedouble) ||
        item->valuedouble != floor(item->valuedouble))
        return fail_expected(c, item, path, "an integer");
    double v = item->valuedouble;
    /* Compare as doubles before converting: casting an out-of-range double to long is undefined.
     * Beyond 2^53 doubles are no longer exact integers, so such values are refused too. */
    bool low = v < (double)lo || v <= -9007199254740992.0;
    bool high = v > (double)hi || v >= 9007199254740992.0;
    if (low || high) {
        if (low)
            snprintf(want, sizeof want, "an integer >= %ld", lo);
        else
            snprintf(want, sizeof want, "an integer <= %ld", hi);
        return fail_expected(c, item, path, want);
    }
    *out = (long)v;
    return 0;
}

int json_string(const json_ctx *c, const cJSON *item, const char *path, const char **out) {
    if (!cJSON_IsString(item) || !item->valuestring)
        return fail_expected(c, item, path, "a string");
    if (!item->valuestring[0]) return fail(c, path, "expected a non-empty string");
    *out = item->valuestring;
    return 0;
}

int json_enum(const json_ctx *c, const cJSON *item, const char *path, const char *const *choices,
              int *index) {
    int n = 0;
    if (cJSON_IsString(item) && item->valuestring) {
        for (; choices[n]; n++) {
            if (strcmp(item->valuestring, choices[n]) == 0) {
                *index = n;
                return 0;
            }
        }
    }
    while (choices[n])
        n++;
    char want[256] = "";
    for (int i = 0; i < n; i++) {
        size_t len = strlen(want);
        const char *sep = i == 0 ? "" : i == n - 1 ? " or " : ", ";
        snprintf(want + len, sizeof want - len, "%s\"%s\"", sep, choices[i]);
    }
    return fail_expected(c, item, path, want);
}

int json_bool(const json_ctx *c, const cJSON *item, const char *path, bool *out) {
    if (!cJSON_IsBool(item)) return fail_expected(c, item, path, "true or false");
    *out = cJSON_IsTrue(item);
    return 0;
}

double json_float_decimal(float f) {
    char b[32];
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(b, sizeof b, "%.*g", prec, (double)f);
        if (strtof(b, NULL) == f) return strtod(b, NULL);
    }
    return (double)f; /* 9 digits always read back; NaN and inf stay what they are */
}
