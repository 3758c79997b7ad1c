/* safetensors.c - safetensors files: the writer (atomic save, CRC-32 of the data in the
 * metadata) and the reader (mmap, full validation). docs/checkpoints.md lists the rules.
 *
 * No OpenMP and no BLAS here: the fuzz target links this file with only libyaml, cJSON and libm. */
#include "formats/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/fileio.h"
#include "common/json_util.h"
#include "common/log.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host (tensor data is stored little-endian)"
#endif

/* Integers in the header are parsed by cJSON as doubles: above 2^53 they are no longer exact, so
 * larger offsets and dimensions are refused (no real file comes near: that is 8 PiB). */
#define ST_MAX_INT ((uint64_t)1 << 53)
/* Bytes handed to one write() call. */
/* Names quoted in messages are cut here. */
#define ST_MSG_NAME 80

/* ---- dtypes -------------------------------------------------------------------------------- */

static const struct {
    const char *name;
    size_t size;
} DTYPES[ST_NDTYPES] = {
    [ST_BOOL] = {"BOOL", 1},       [ST_U8] = {"U8", 1},           [ST_I8] = {"I8", 1},
    [ST_F8_E5M2] = {"F8_E5M2", 1}, [ST_F8_E4M3] = {"F8_E4M3", 1}, [ST_I16] = {"I16", 2},
    [ST_U16] = {"U16", 2},         [ST_F16] = {"F16", 2},         [ST_BF16] = {"BF16", 2},
    [ST_I32] = {"I32", 4},         [ST_U32] = {"U32", 4},         [ST_F32] = {"F32", 4},
    [ST_I64] = {"I64", 8},         [ST_U64] = {"U64", 8},         [ST_F64] = {"F64", 8},
};

size_t st_dtype_size(st_dtype dtype) {
    CHECK((unsigned)dtype < ST_NDTYPES);
    return DTYPES[dtype].size;
}

const char *st_dtype_name(st_dtype dtype) {
    CHECK((unsigned)dtype < ST_NDTYPES);
    return DTYPES[dtype].name;
}

int st_dtype_parse(const char *name) {
    for (int i = 0; i < ST_NDTYPES; i++)
        if (strcmp(name, DTYPES[i].name) == 0) return i;
    return -1;
}

/* ---- CRC-32 (slicing by 8: eight 256-entry tables, 8 bytes per step) ------------------------ */

static uint32_t crc_table[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][i] = c;
    }
    for (int t = 1; t < 8; t++)
        for (int i = 0; i < 256; i++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xff];
}

uint32_t st_crc32(uint32_t crc, const void *buf, size_t len) {
    pthread_once(&crc_once, crc_init);
    const unsigned char *p = buf;
    uint32_t c = ~crc;
    while (len > 0 && ((uintptr_t)p & 7) != 0) {
        c = crc_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
        len--;
    }
    while (len >= 8) {
        uint64_t v;
        memcpy(&v, p, 8); /* little-endian host: byte 0 is the low byte */
        uint32_t lo = (uint32_t)v ^ c, hi = (uint32_t)(v >> 32);
        c = crc_table[7][lo & 0xff] ^ crc_table[6][(lo >> 8) & 0xff] ^
            crc_table[5][(lo >> 16) & 0xff] ^ crc_table[4][lo >> 24] ^ crc_table[3][hi & 0xff] ^
            crc_table[2][(hi >> 8) & 0xff] ^ crc_table[1][(hi >> 16) & 0xff] ^
            crc_table[0][hi >> 24];
        p += 8;
        len -= 8;
    }
    while (len-- > 0)
        c = crc_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    return ~c;
}

/* ---- small helpers --------------------------------------------------------------------------- */

/* Position of the first byte that breaks UTF-8 (overlong forms, surrogates and code points above
 * U+10FFFF included), or len when the text is valid. */
static size_t utf8_invalid_at(const unsigned char *s, size_t len) {
    size_t i = 0;
    while (i < len) {
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t n;
        uint32_t cp, min;
        if ((c & 0xE0) == 0xC0) {
            n = 2;
            cp = c & 0x1F;
            min = 0x80;
        } else if ((c & 0xF0) == 0xE0) {
            n = 3;
            cp = c & 0x0F;
            min = 0x800;
        } else if ((c & 0xF8) == 0xF0) {
            n = 4;
            cp = c & 0x07;
            min = 0x10000;
        } else {
            return i;
        }
        if (len - i < n) return i;
        for (size_t k = 1; k < n; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return i;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
        i += n;
    }
    return len;
}

/* A name as messages quote it: cut at ST_MSG_NAME bytes ("..."), control bytes shown as '?'. */
static const char *shown(const char *s, char *buf, size_t bufsz) {
    size_t j = 0, i = 0;
    CHECK(bufsz >= ST_MSG_NAME + 4);
    for (; s[i] && i < ST_MSG_NAME; i++) {
        unsigned char ch = (unsigned char)s[i];
        buf[j++] = ch < 0x20 || ch == 0x7f ? '?' : (char)ch;
    }
    if (s[i]) {
        memcpy(buf + j, "...", 3);
        j += 3;
    }
    buf[j] = '\0';
    return buf;
}

/* "[2, 3]" (at most ST_MAX_DIMS dimensions). */
static const char *shape_text(int ndim, const int64_t *shape, char *buf, size_t bufsz) {
    size_t j = 0;
    j += (size_t)snprintf(buf + j, bufsz - j, "[");
    for (int d = 0; d < ndim && j < bufsz; d++)
        j += (size_t)snprintf(buf + j, bufsz - j, "%s%" PRId64, d ? ", " : "", shape[d]);
    if (j < bufsz) snprintf(buf + j, bufsz - j, "]");
    return buf;
}

/* a * b, false on overflow. */
static bool mul_u64(uint64_t a, uint64_t b, uint64_t *out) {
    if (a != 0 && b > UINT64_MAX / a) return false;
    *out = a * b;
    return true;
}

/* Elements and bytes of a tensor; false when either overflows (or exceeds ST_MAX_INT bytes,
 * which no file can hold). */
static bool tensor_bytes(st_dtype dtype, int ndim, const int64_t *shape, uint64_t *nbytes) {
    uint64_t count = 1;
    for (int d = 0; d < ndim; d++)
        if (!mul_u64(count, (uint64_t)shape[d], &count)) return false;
    return mul_u64(count, st_dtype_size(dtype), nbytes) && *nbytes <= ST_MAX_INT;
}

typedef struct {
    const char *key;
    int idx;
} keyed;

static int keyed_cmp(const void *a, const void *b) {
    const keyed *x = a, *y = b;
    int c = strcmp(x->key, y->key);
    return c ? c : (x->idx > y->idx) - (x->idx < y->idx);
}

/* Sorts keys[0..n) and returns the first key that appears twice, or NULL. */
static const char *sort_find_duplicate(keyed *keys, int n) {
    if (n > 1) qsort(keys, (size_t)n, sizeof *keys, keyed_cmp);
    for (int i = 1; i < n; i++)
        if (strcmp(keys[i - 1].key, keys[i].key) == 0) return keys[i].key;
    return NULL;
}

/* ---- growing byte buffer (the header being written) ---------------------------------------- */

typedef struct {
    char *p;
    size_t len, cap;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        b->p = xrealloc(b->p, cap);
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_str(sbuf *b, const char *s) {
    sb_add(b, s, strlen(s));
}

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    CHECK(n >= 0 && (size_t)n < sizeof tmp);
    sb_add(b, tmp, (size_t)n);
}

/* A JSON string literal: quotes, backslashes and control bytes escaped; other bytes (UTF-8,
 * checked by the caller) as they are. */
static void sb_json_string(sbuf *b, const char *s) {
    sb_add(b, "\"", 1);
    for (const char *p = s; *p; p++) {
        unsigned char ch = (unsigned char)*p;
        if (ch == '"' || ch == '\\') {
            char esc[2] = {'\\', (char)ch};
            sb_add(b, esc, 2);
        } else if (ch < 0x20) {
            sb_printf(b, "\\u%04x", ch);
        } else {
            sb_add(b, p, 1);
        }
    }
    sb_add(b, "\"", 1);
}

/* ---- writer -------------------------------------------------------------------------------- */

typedef struct {
    char *name;
    st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data;
    uint64_t nbytes;
} w_tensor;

struct st_writer {
    w_tensor *t;
    int n, cap;
    char **keys, **vals;
    int nmeta, capmeta;
    char problem[768]; /* the first mistake made while adding; reported by st_writer_save() */
};

st_writer *st_writer_new(void) {
    return xcalloc(1, sizeof(st_writer));
}

void st_writer_free(st_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->n; i++)
        free(w->t[i].name);
    for (int i = 0; i < w->nmeta; i++) {
        free(w->keys[i]);
        free(w->vals[i]);
    }
    free(w->t);
    free(w->keys);
    free(w->vals);
    free(w);
}

static void writer_problem(st_writer *w, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void writer_problem(st_writer *w, const char *fmt, ...) {
    if (w->problem[0]) return; /* keep the first */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->problem, sizeof w->problem, fmt, ap);
    va_end(ap);
}

void st_writer_add(st_writer *w, const char *name, st_dtype dtype, int ndim, const int64_t *shape,
                   const void *data) {
    CHECK(w && name && (ndim <= 0 || shape));
    char nm[ST_MSG_NAME + 4];
    shown(name, nm, sizeof nm);
    if (utf8_invalid_at((const unsigned char *)name, strlen(name)) != strlen(name)) {
        writer_problem(w, "tensor '%s': the name is not valid UTF-8", nm);
        return;
    }
    if (strcmp(name, "__metadata__") == 0) {
        writer_problem(w, "a tensor may not be named '__metadata__'");
        return;
    }
    if ((unsigned)dtype >= ST_NDTYPES) {
        writer_problem(w, "tensor '%s': invalid dtype %d", nm, (int)dtype);
        return;
    }
    if (ndim < 0 || ndim > ST_MAX_DIMS) {
        writer_problem(w, "tensor '%s': %d dimensions, expected 0 to %d", nm, ndim, ST_MAX_DIMS);
        return;
    }
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0) {
            writer_problem(w, "tensor '%s': dimension %d is negative (%" PRId64 ")", nm, d,
                           shape[d]);
            return;
        }
    }
    uint64_t nbytes;
    if (!tensor_bytes(dtype, ndim, shape, &nbytes)) {
        writer_problem(w, "tensor '%s': the size of the tensor overflows", nm);
        return;
    }
    if (nbytes > 0 && !data) {
        writer_problem(w, "tensor '%s': no data given for %" PRIu64 " bytes", nm, nbytes);
        return;
    }
    if (w->n == w->cap) {
        w->cap = w->cap ? w->cap * 2 : 16;
        w->t = xrealloc(w->t, (size_t)w->cap * sizeof *w->t);
    }
    w_tensor *t = &w->t[w->n++];
    memset(t, 0, sizeof *t);
    t->name = xstrdup(name);
    t->dtype = dtype;
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++)
        t->shape[d] = shape[d];
    t->data = data;
    t->nbytes = nbytes;
}

void st_writer_meta(st_writer *w, const char *key, const char *value) {
    CHECK(w && key && value);
    char k[ST_MSG_NAME + 4];
    shown(key, k, sizeof k);
    if (strcmp(key, ST_CRC_KEY) == 0) {
        writer_problem(w, "metadata key '%s' is reserved (the writer sets it)", ST_CRC_KEY);
        return;
    }
    if (utf8_invalid_at((const unsigned char *)key, strlen(key)) != strlen(key) ||
        utf8_invalid_at((const unsigned char *)value, strlen(value)) != strlen(value)) {
        writer_problem(w, "metadata '%s': key or value is not valid UTF-8", k);
        return;
    }
    if (w->nmeta == w->capmeta) {
        w->capmeta = w->capmeta ? w->capmeta * 2 : 8;
        w->keys = xrealloc(w->keys, (size_t)w->capmeta * sizeof *w->keys);
        w->vals = xrealloc(w->vals, (size_t)w->capmeta * sizeof *w->vals);
    }
    w->keys[w->nmeta] = xstrdup(key);
    w->vals[w->nmeta] = xstrdup(value);
    w->nmeta++;
}

/* Checks what st_writer_add/meta could not (names given twice) and lays the data out: fills
 * order[] (tensor indices by descending element size, stable) and the buffer size. */
static int writer_layout(const st_writer *w, int *order, uint64_t *total, char *why, size_t whysz) {
    char nm[ST_MSG_NAME + 4];
    if (w->problem[0]) {
        snprintf(why, whysz, "%s", w->problem);
        return -1;
    }
    keyed *keys = xmalloc((size_t)(w->n > w->nmeta ? w->n : w->nmeta) * sizeof *keys + 1);
    for (int i = 0; i < w->n; i++)
        keys[i] = (keyed){w->t[i].name, i};
    const char *dup = sort_find_duplicate(keys, w->n);
    if (dup) {
        snprintf(why, whysz, "tensor '%s' was added twice", shown(dup, nm, sizeof nm));
        free(keys);
        return -1;
    }
    for (int i = 0; i < w->nmeta; i++)
        keys[i] = (keyed){w->keys[i], i};
    dup = sort_find_duplicate(keys, w->nmeta);
    if (dup) {
        snprintf(why, whysz, "metadata key '%s' was given twice", shown(dup, nm, sizeof nm));
        free(keys);
        return -1;
    }
    free(keys);
    int k = 0;
    uint64_t off = 0;
    for (size_t size = 8; size >= 1; size /= 2) {
        for (int i = 0; i < w->n; i++) {
            if (st_dtype_size(w->t[i].dtype) != size) continue;
            order[k++] = i;
            off += w->t[i].nbytes;
            if (off > ST_MAX_INT) {
                snprintf(why, whysz, "the tensors add up to more than 2^53 bytes");
                return -1;
            }
        }
    }
    CHECK(k == w->n);
    *total = off;
    return 0;
}

/* The header: {"__metadata__":{...,"cephalo.crc32":"..."},"name":{...},...}, padded with spaces
 * to a multiple of 8 bytes. */
static void writer_header(const st_writer *w, const int *order, uint32_t crc, sbuf *h) {
    sb_str(h, "{\"__metadata__\":{");
    for (int i = 0; i < w->nmeta; i++) {
        sb_json_string(h, w->keys[i]);
        sb_str(h, ":");
        sb_json_string(h, w->vals[i]);
        sb_str(h, ",");
    }
    sb_printf(h, "\"%s\":\"%08" PRIx32 "\"}", ST_CRC_KEY, crc);
    uint64_t off = 0;
    for (int k = 0; k < w->n; k++) {
        const w_tensor *t = &w->t[order[k]];
        sb_str(h, ",");
        sb_json_string(h, t->name);
        sb_printf(h, ":{\"dtype\":\"%s\",\"shape\":[", st_dtype_name(t->dtype));
        for (int d = 0; d < t->ndim; d++)
            sb_printf(h, "%s%" PRId64, d ? "," : "", t->shape[d]);
        sb_printf(h, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", off, off + t->nbytes);
        off += t->nbytes;
    }
    sb_str(h, "}");
    while (h->len % 8 != 0)
        sb_str(h, " ");
}

int st_writer_save(st_writer *w, const char *path, int flags, err_t *err) {
    CHECK(w && path);
    char why[1024];
    int *order = xmalloc((size_t)w->n * sizeof *order + 1);
    uint64_t total = 0;
    if (writer_layout(w, order, &total, why, sizeof why) < 0) {
        free(order);
        return err_set(err, "%s: cannot save: %s", path, why);
    }
    uint32_t crc = 0;
    for (int k = 0; k < w->n; k++)
        if (w->t[order[k]].nbytes) crc = st_crc32(crc, w->t[order[k]].data, w->t[order[k]].nbytes);
    sbuf h = {0};
    writer_header(w, order, crc, &h);
    unsigned char size_field[8];
    for (int i = 0; i < 8; i++)
        size_field[i] = (unsigned char)((uint64_t)h.len >> (8 * i));

    file_out o;
    int rc = file_out_open(&o, path, flags & FILE_OUT_OWN, err);
    if (rc == 0) {
        bool ok = file_write_all(o.fd, size_field, sizeof size_field) == 0 && file_write_all(o.fd, h.p, h.len) == 0;
        for (int k = 0; ok && k < w->n; k++)
            ok = file_write_all(o.fd, w->t[order[k]].data, w->t[order[k]].nbytes) == 0;
        if (!ok) {
            int e = errno;
            err_set(err, "%s: cannot save: writing the temporary file %s failed: %s", path, o.tmp, strerror(e));
            file_out_abort(&o);
            rc = -1;
        } else rc = file_out_close(&o, err);
    }
    free(h.p);
    free(order);
    return rc;
}

/* ---- reader -------------------------------------------------------------------------------- */

struct st_file {
    char *label;
    void *map; /* the mapping made by st_open(), or NULL */
    size_t map_len;
    st_tensor *t; /* in data-buffer order */
    int n;
    keyed *by_name; /* tensor names sorted, for st_find() */
    char **keys, **vals;
    int nmeta;
    void **owned; /* buffers st_from_tensors was given (freed on close) */
    int n_owned;
};

void st_close(st_file *f) {
    if (!f) return;
    for (int i = 0; i < f->n; i++)
        free((char *)f->t[i].name);
    for (int i = 0; i < f->nmeta; i++) {
        free(f->keys[i]);
        free(f->vals[i]);
    }
    free(f->t);
    free(f->by_name);
    free(f->keys);
    free(f->vals);
    if (f->map) munmap(f->map, f->map_len);
    for (int i = 0; i < f->n_owned; i++) free(f->owned[i]);
    free(f->owned);
    free(f->label);
    free(f);
}

int st_from_tensors(st_file **out, const char *label, const st_tensor *t, int n, void *map, size_t map_len,
                    void **owned, int n_owned, err_t *err) {
    st_file *f = xcalloc(1, sizeof *f);
    f->label = xstrdup(label);
    f->map = map, f->map_len = map_len;
    f->owned = owned, f->n_owned = n_owned;
    f->t = xcalloc((size_t)n + 1, sizeof *f->t);
    f->by_name = xmalloc((size_t)n * sizeof *f->by_name + 1);
    for (int i = 0; i < n; i++) {
        f->t[i] = t[i];
        f->t[i].name = xstrdup(t[i].name);
        f->by_name[i] = (keyed){f->t[i].name, i};
    }
    f->n = n;
    *out = NULL;
    keyed *names = xmalloc((size_t)n * sizeof *names + 1);
    memcpy(names, f->by_name, (size_t)n * sizeof *names);
    const char *dup = sort_find_duplicate(names, n);
    free(names);
    if (dup) {
        char nm[ST_MSG_NAME + 4];
        err_set(err, "%s: tensor '%s' appears twice", label, shown(dup, nm, sizeof nm));
        st_close(f);
        return -1;
    }
    if (n > 1) qsort(f->by_name, (size_t)n, sizeof *f->by_name, keyed_cmp);
    *out = f;
    return 0;
}

int st_count(const st_file *f) {
    return f->n;
}

const st_tensor *st_tensor_at(const st_file *f, int i) {
    CHECK(i >= 0 && i < f->n);
    return &f->t[i];
}

const char *st_label(const st_file *f) {
    return f->label;
}

const st_tensor *st_find(const st_file *f, const char *name) {
    int lo = 0, hi = f->n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(f->by_name[mid].key, name);
        if (c == 0) return &f->t[f->by_name[mid].idx];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

const char *st_meta(const st_file *f, const char *key) {
    for (int i = 0; i < f->nmeta; i++)
        if (strcmp(f->keys[i], key) == 0) return f->vals[i];
    return NULL;
}

/* What a JSON value is, for "got ...": a number's value, otherwise its kind. */
static const char *got_text(const cJSON *item, char *buf, size_t bufsz) {
    if (cJSON_IsNumber(item))
        snprintf(buf, bufsz, "%.17g", item->valuedouble);
    else if (cJSON_IsArray(item))
        snprintf(buf, bufsz, "an array of %d items", cJSON_GetArraySize(item));
    else
        snprintf(buf, bufsz, "%s", json_type_name(item));
    return buf;
}

/* A non-negative integral number no larger than ST_MAX_INT. */
static bool json_u53(const cJSON *item, uint64_t *out) {
    if (!cJSON_IsNumber(item)) return false;
    double v = item->valuedouble;
    if (!isfinite(v) || v < 0 || v > (double)ST_MAX_INT || v != floor(v)) return false;
    *out = (uint64_t)v;
    return true;
}

/* One tensor entry as parsed, before the data pointer is known. */
typedef struct {
    st_tensor t;
    uint64_t begin, end;
    int idx; /* position in the header */
} p_tensor;

static int offsets_cmp(const void *a, const void *b) {
    const p_tensor *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

/* One "name": {"dtype": ..., "shape": [...], "data_offsets": [b, e]} entry. Unknown fields are
 * ignored (as the reference implementation does); the three known ones must appear once. */
static int parse_tensor(const char *label, const char *name, const cJSON *e, size_t data_len,
                        p_tensor *out, err_t *err) {
    char nm[ST_MSG_NAME + 4], got[96];
    shown(name, nm, sizeof nm);
    if (!cJSON_IsObject(e))
        return err_set(err,
                       "%s: tensor '%s': expected an object with dtype, shape and data_offsets, "
                       "got %s",
                       label, nm, got_text(e, got, sizeof got));
    static const char *const FIELDS[3] = {"dtype", "shape", "data_offsets"};
    const cJSON *field[3] = {NULL, NULL, NULL};
    const cJSON *m;
    cJSON_ArrayForEach(m, e) { /* a field twice was refused by json_parse */
        for (int k = 0; k < 3; k++)
            if (m->string && strcmp(m->string, FIELDS[k]) == 0) field[k] = m;
    }
    for (int k = 0; k < 3; k++)
        if (!field[k])
            return err_set(err, "%s: tensor '%s': missing field '%s'", label, nm, FIELDS[k]);

    /* dtype */
    if (!cJSON_IsString(field[0]) || !field[0]->valuestring)
        return err_set(err, "%s: tensor '%s': dtype: expected a string, got %s", label, nm,
                       got_text(field[0], got, sizeof got));
    int dt = st_dtype_parse(field[0]->valuestring);
    if (dt < 0) {
        char known[256];
        size_t j = 0;
        for (int i = 0; i < ST_NDTYPES; i++)
            j += (size_t)snprintf(known + j, sizeof known - j, "%s%s", i ? ", " : "",
                                  DTYPES[i].name);
        char dn[ST_MSG_NAME + 4];
        return err_set(err, "%s: tensor '%s': unknown or unsupported dtype \"%s\" (known: %s)",
                       label, nm, shown(field[0]->valuestring, dn, sizeof dn), known);
    }
    out->t.dtype = (st_dtype)dt;

    /* shape */
    if (!cJSON_IsArray(field[1]))
        return err_set(err,
                       "%s: tensor '%s': shape: expected an array of non-negative integers, got %s",
                       label, nm, got_text(field[1], got, sizeof got));
    int ndim = cJSON_GetArraySize(field[1]);
    if (ndim > ST_MAX_DIMS)
        return err_set(err, "%s: tensor '%s': shape has %d dimensions, at most %d are supported",
                       label, nm, ndim, ST_MAX_DIMS);
    out->t.ndim = ndim;
    int d = 0;
    cJSON_ArrayForEach(m, field[1]) {
        uint64_t v;
        if (!json_u53(m, &v))
            return err_set(err,
                           "%s: tensor '%s': shape[%d]: expected a non-negative integer, got %s",
                           label, nm, d, got_text(m, got, sizeof got));
        out->t.shape[d++] = (int64_t)v;
    }
    char shp[200];
    shape_text(ndim, out->t.shape, shp, sizeof shp);
    uint64_t nbytes;
    if (!tensor_bytes(out->t.dtype, ndim, out->t.shape, &nbytes))
        return err_set(err, "%s: tensor '%s': shape %s of %s overflows (more than 2^53 bytes)",
                       label, nm, shp, st_dtype_name(out->t.dtype));

    /* data_offsets */
    if (!cJSON_IsArray(field[2]) || cJSON_GetArraySize(field[2]) != 2)
        return err_set(err,
                       "%s: tensor '%s': data_offsets: expected an array of two integers "
                       "[begin, end], got %s",
                       label, nm, got_text(field[2], got, sizeof got));
    uint64_t be[2];
    for (int k = 0; k < 2; k++) {
        const cJSON *v = cJSON_GetArrayItem(field[2], k);
        if (!json_u53(v, &be[k]))
            return err_set(err,
                           "%s: tensor '%s': data_offsets[%d]: expected a non-negative integer, "
                           "got %s",
                           label, nm, k, got_text(v, got, sizeof got));
    }
    if (be[0] > be[1])
        return err_set(
            err, "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "]: begin is after end",
            label, nm, be[0], be[1]);
    if (be[1] > data_len)
        return err_set(err,
                       "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "]: end is beyond "
                       "the data buffer (%zu bytes)",
                       label, nm, be[0], be[1], data_len);
    if (be[1] - be[0] != nbytes)
        return err_set(err,
                       "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] hold %" PRIu64
                       " bytes, but shape %s of %s needs %" PRIu64 " bytes",
                       label, nm, be[0], be[1], be[1] - be[0], shp, st_dtype_name(out->t.dtype),
                       nbytes);
    out->begin = be[0];
    out->end = be[1];
    out->t.nbytes = (size_t)nbytes;
    out->t.name = xstrdup(name);
    return 0;
}

/* "__metadata__": an object of string values. */
static int parse_meta(const char *label, const cJSON *meta, st_file *f, err_t *err) {
    char got[96], k[ST_MSG_NAME + 4];
    if (!cJSON_IsObject(meta))
        return err_set(err, "%s: __metadata__: expected an object of strings, got %s", label,
                       got_text(meta, got, sizeof got));
    int n = cJSON_GetArraySize(meta);
    f->keys = xcalloc((size_t)n + 1, sizeof *f->keys);
    f->vals = xcalloc((size_t)n + 1, sizeof *f->vals);
    const cJSON *m;
    cJSON_ArrayForEach(m, meta) {
        const char *key = m->string ? m->string : "";
        if (!cJSON_IsString(m) || !m->valuestring)
            return err_set(err, "%s: __metadata__: '%s': expected a string, got %s", label,
                           shown(key, k, sizeof k), got_text(m, got, sizeof got));
        f->keys[f->nmeta] = xstrdup(key);
        f->vals[f->nmeta] = xstrdup(m->valuestring);
        f->nmeta++;
    }
    return 0; /* a key twice was refused by json_parse */
}

/* The tensors, sorted by offsets, must cover the data buffer exactly: the first begins at 0,
 * each begins where the previous one ends, the last ends at the end of the buffer. */
static int check_coverage(const char *label, const p_tensor *pt, int n, size_t data_len,
                          err_t *err) {
    char a[ST_MSG_NAME + 4], b[ST_MSG_NAME + 4];
    uint64_t pos = 0;
    for (int i = 0; i < n; i++) {
        const p_tensor *t = &pt[i];
        if (t->begin < pos)
            return err_set(err,
                           "%s: tensors '%s' [%" PRIu64 ", %" PRIu64 "] and '%s' [%" PRIu64
                           ", %" PRIu64 "] overlap",
                           label, shown(pt[i - 1].t.name, a, sizeof a), pt[i - 1].begin,
                           pt[i - 1].end, shown(t->t.name, b, sizeof b), t->begin, t->end);
        if (t->begin > pos) {
            if (i == 0)
                return err_set(err,
                               "%s: gap of %" PRIu64 " bytes at the start of the data buffer, "
                               "before tensor '%s' [%" PRIu64 ", %" PRIu64 "] (tensors must "
                               "cover the data buffer without gaps)",
                               label, t->begin, shown(t->t.name, b, sizeof b), t->begin, t->end);
            return err_set(err,
                           "%s: gap of %" PRIu64 " bytes between tensors '%s' [%" PRIu64
                           ", %" PRIu64 "] and '%s' [%" PRIu64 ", %" PRIu64 "] (tensors must "
                           "cover the data buffer without gaps)",
                           label, t->begin - pos, shown(pt[i - 1].t.name, a, sizeof a),
                           pt[i - 1].begin, pt[i - 1].end, shown(t->t.name, b, sizeof b), t->begin,
                           t->end);
        }
        pos = t->end;
    }
    if (pos != data_len) {
        if (n == 0)
            return err_set(err,
                           "%s: the data buffer holds %zu bytes, but the header lists no tensors",
                           label, data_len);
        return err_set(err,
                       "%s: %" PRIu64 " bytes of the data buffer (%zu bytes) follow the last "
                       "tensor '%s' [%" PRIu64 ", %" PRIu64 "] (tensors must cover the data "
                       "buffer without gaps)",
                       label, (uint64_t)data_len - pos, data_len,
                       shown(pt[n - 1].t.name, a, sizeof a), pt[n - 1].begin, pt[n - 1].end);
    }
    return 0;
}

/* The checksum, when the file has one: ST_CRC_KEY holds 8 hex digits. */
static int check_crc(const char *label, const st_file *f, const unsigned char *data,
                     size_t data_len, err_t *err) {
    const char *v = st_meta(f, ST_CRC_KEY);
    if (!v) return 0;
    char k[ST_MSG_NAME + 4];
    bool hex = strlen(v) == 8;
    for (int i = 0; hex && i < 8; i++)
        hex = (v[i] >= '0' && v[i] <= '9') || (v[i] >= 'a' && v[i] <= 'f') ||
              (v[i] >= 'A' && v[i] <= 'F');
    if (!hex)
        return err_set(err, "%s: __metadata__: '%s': expected 8 hex digits, got \"%s\"", label,
                       ST_CRC_KEY, shown(v, k, sizeof k));
    uint32_t want = (uint32_t)strtoul(v, NULL, 16);
    uint32_t have = st_crc32(0, data, data_len);
    if (want != have)
        return err_set(err,
                       "%s: data checksum mismatch: the header's %s is %08" PRIx32
                       ", the data buffer's is %08" PRIx32 " (the file is corrupt)",
                       label, ST_CRC_KEY, want, have);
    return 0;
}

int st_parse(st_file **out, const void *buf, size_t len, const char *label, err_t *err) {
    CHECK(out);
    *out = NULL;
    if (!label) label = "(memory)";
    const unsigned char *b = buf;
    if (len < 8)
        return err_set(err,
                       "%s: the file is %zu bytes, shorter than the 8-byte header size field "
                       "(not a safetensors file)",
                       label, len);
    uint64_t n = 0;
    for (int i = 0; i < 8; i++)
        n |= (uint64_t)b[i] << (8 * i);
    if (n > ST_MAX_HEADER)
        return err_set(err,
                       "%s: header size %" PRIu64 " bytes is larger than the limit of %" PRIu64
                       " bytes (corrupt, or not a safetensors file)",
                       label, n, ST_MAX_HEADER);
    if (n > len - 8)
        return err_set(err,
                       "%s: header size %" PRIu64 " bytes is larger than the %zu bytes after "
                       "the size field (truncated or corrupt file)",
                       label, n, len - 8);
    const unsigned char *header = b + 8, *data = b + 8 + n;
    size_t hlen = (size_t)n, data_len = len - 8 - hlen;
    size_t bad = utf8_invalid_at(header, hlen);
    if (bad != hlen)
        return err_set(err, "%s: the header is not valid UTF-8 (byte %zu of the header)", label,
                       bad);
    cJSON *root = json_parse("header", (const char *)header, hlen, err);
    if (!root) return err_prefix(err, "%s", label);
    char got[96];
    if (!cJSON_IsObject(root)) {
        err_set(err, "%s: the header is not a JSON object (got %s)", label,
                got_text(root, got, sizeof got));
        cJSON_Delete(root);
        return -1;
    }

    st_file *f = xcalloc(1, sizeof *f);
    f->label = xstrdup(label);
    int members = cJSON_GetArraySize(root);
    p_tensor *pt = xcalloc((size_t)members + 1, sizeof *pt);
    int np = 0, rc = -1;
    const cJSON *m;
    /* a name given twice (a tensor, __metadata__, a metadata key) was refused by json_parse */
    cJSON_ArrayForEach(m, root) {
        const char *key = m->string ? m->string : "";
        if (strcmp(key, "__metadata__") == 0) {
            if (parse_meta(label, m, f, err) < 0) goto fail;
            continue;
        }
        pt[np].idx = np;
        if (parse_tensor(label, key, m, data_len, &pt[np], err) < 0) goto fail;
        np++;
    }
    if (np > 1) qsort(pt, (size_t)np, sizeof *pt, offsets_cmp);
    if (check_coverage(label, pt, np, data_len, err) < 0) goto fail;
    if (check_crc(label, f, data, data_len, err) < 0) goto fail;

    f->t = xcalloc((size_t)np + 1, sizeof *f->t);
    f->by_name = xmalloc((size_t)np * sizeof *f->by_name + 1);
    for (int i = 0; i < np; i++) {
        f->t[i] = pt[i].t;
        f->t[i].data = data + pt[i].begin;
        pt[i].t.name = NULL; /* owned by f now */
        f->by_name[i] = (keyed){f->t[i].name, i};
    }
    f->n = np;
    if (np > 1) qsort(f->by_name, (size_t)np, sizeof *f->by_name, keyed_cmp);
    *out = f;
    rc = 0;
fail:
    for (int i = 0; i < np; i++)
        free((char *)pt[i].t.name);
    free(pt);
    cJSON_Delete(root);
    if (rc < 0) st_close(f);
    return rc;
}

int st_open(st_file **out, const char *path, err_t *err) {
    CHECK(out && path);
    *out = NULL;
    struct stat sb;
    int fd = file_open_read(path, true, &sb, err);
    if (fd < 0) return -1;
    if (sb.st_size <= 0) {
        close(fd);
        return st_parse(out, "", 0, path, err);
    }
    if ((uint64_t)sb.st_size > SIZE_MAX) {
        close(fd);
        return err_set(err, "%s: the file is too large to map", path);
    }
    size_t len = (size_t)sb.st_size;
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) return err_set(err, "%s: cannot map the file: %s", path, strerror(e));
    if (st_parse(out, map, len, path, err) < 0) {
        munmap(map, len);
        return -1;
    }
    (*out)->map = map;
    (*out)->map_len = len;
    return 0;
}

int st_expect(const st_file *f, const char *name, st_dtype dtype, int ndim, const int64_t *shape,
              const void **data, err_t *err) {
    CHECK(f && name && ndim >= 0 && ndim <= ST_MAX_DIMS && (ndim == 0 || shape));
    if (data) *data = NULL;
    char nm[ST_MSG_NAME + 4], want[200], have[200];
    shown(name, nm, sizeof nm);
    const st_tensor *t = st_find(f, name);
    if (!t) return err_set(err, "%s: tensor '%s' not found", f->label, nm);
    bool same = t->dtype == dtype && t->ndim == ndim;
    for (int d = 0; same && d < ndim; d++)
        same = t->shape[d] == shape[d];
    if (!same)
        return err_set(err, "%s: tensor '%s': expected %s %s, found %s %s", f->label, nm,
                       st_dtype_name(dtype), shape_text(ndim, shape, want, sizeof want),
                       st_dtype_name(t->dtype), shape_text(t->ndim, t->shape, have, sizeof have));
    if (data) *data = t->data;
    return 0;
}
