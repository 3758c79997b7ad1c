/* data.c - token shards, CIMG image files, synthetic sources and the sample order (data.h,
 * docs/data.md). No OpenMP, no BLAS: this file is also linked into the fuzz_shard target. */
#include "formats/data.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fileio.h"
#include "common/log.h"
#include "common/strutil.h"

/* ------------------------------------------------------------------------------------------ */
/* little-endian fields and hashing                                                            */

static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static int32_t rd32s(const uint8_t *p) {
    uint32_t u = rd32(p);
    return u <= INT32_MAX ? (int32_t)u : (int32_t)(u - 0x80000000u) - INT32_MAX - 1;
}
static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static void wr32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

/* splitmix64's finaliser: a bijective 64-bit mixer. */
static uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Independent streams for the different uses of the seed. */
enum { SALT_PERM = 1, SALT_MLM, SALT_MLM_RAND, SALT_MLM_FORCE, SALT_SYN_TOK, SALT_SYN_NOISE, SALT_IMG, SALT_IMG_NOISE };

static uint64_t hash4(uint64_t salt, uint64_t seed, uint64_t a, uint64_t b) {
    return mix64(mix64(mix64(mix64(salt) ^ seed) ^ a) ^ b);
}

/* perm_e(x): a bijection of 0..n-1 keyed by (seed, epoch). Six-round balanced Feistel network on
 * the smallest 2^k >= n (k even, >= 2) with cycle walking: values >= n are mapped again until they
 * land below n, which restricted to 0..n-1 is again a bijection. At most 4x expected rounds. */
static uint64_t perm_apply(uint64_t n, uint64_t seed, uint64_t epoch, uint64_t x) {
    CHECK(n >= 1 && n <= (1ull << 62) && x < n);
    int k = 2;
    while ((1ull << k) < n) k += 2;
    int half = k / 2;
    uint64_t mask = (1ull << half) - 1, key = hash4(SALT_PERM, seed, epoch, 0);
    do {
        uint64_t l = x >> half, r = x & mask;
        for (uint64_t round = 0; round < 6; round++) {
            uint64_t f = mix64(key ^ (round << 58) ^ (r * 0xd6e8feb86659fd93ull)) & mask;
            uint64_t t = r;
            r = l ^ f;
            l = t;
        }
        x = l << half | r;
    } while (x >= n);
    return x;
}

/* ------------------------------------------------------------------------------------------ */
/* atomic output files (common/fileio.h file_out): a temporary, then fsync and rename            */

typedef struct afile {
    char *path; /* as given (the mask's path is made from it) */
    file_out o;
    FILE *f;
} afile;

static int af_open(afile *a, const char *path, err_t *err) {
    if (file_out_open(&a->o, path, FILE_OUT_ATOMIC, err) < 0) return -1;
    if (!(a->f = file_out_file(&a->o))) {
        file_out_abort(&a->o);
        return err_set(err, "%s: cannot write: out of memory", path);
    }
    a->path = xstrdup(path);
    return 0;
}

static int af_write(afile *a, const void *p, size_t n, err_t *err) {
    if (n && fwrite(p, 1, n, a->f) != n) return err_set(err, "%s: write error: %s", a->path, strerror(errno));
    return 0;
}

static void af_abort(afile *a) {
    file_out_abort(&a->o);
    free(a->path);
}

/* Rewrites bytes at offset (the header's count), then flushes, syncs and renames. */
static int af_finish(afile *a, long patch_off, const void *patch, size_t patch_n, err_t *err) {
    if (patch_n && (fseek(a->f, patch_off, SEEK_SET) != 0 || fwrite(patch, 1, patch_n, a->f) != patch_n)) {
        err_set(err, "%s: write error: %s", a->path, strerror(errno));
        af_abort(a);
        return -1;
    }
    int rc = file_out_close(&a->o, err);
    free(a->path);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* read-only mappings                                                                          */

typedef struct mapping {
    const uint8_t *p;
    size_t len;
} mapping;

/* Maps path; min_len is the header size: shorter files are refused by the caller's check, which
 * gets the bytes read into hdr instead (so a 0-byte file never reaches mmap). */
static int map_file(const char *path, mapping *m, uint8_t *hdr, size_t hdr_len, size_t *file_len, err_t *err) {
    m->p = NULL;
    m->len = 0;
    struct stat st;
    int fd = file_open_read(path, true, &st, err);
    if (fd < 0) return -1;
    *file_len = (size_t)st.st_size;
    if (*file_len < hdr_len) { /* too short: hand the caller what there is */
        ssize_t got = pread(fd, hdr, *file_len, 0);
        close(fd);
        if (got < 0 || (size_t)got != *file_len) return err_set(err, "%s: read error: %s", path, strerror(errno));
        return 0;
    }
    void *p = mmap(NULL, *file_len, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    close(fd);
    if (p == MAP_FAILED) return err_set(err, "%s: cannot map: %s", path, strerror(map_errno));
    m->p = p;
    m->len = *file_len;
    memcpy(hdr, p, hdr_len);
    return 0;
}

static void unmap(mapping *m) {
    if (m->p) munmap((void *)m->p, m->len);
    m->p = NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* token shards                                                                                */

/* hdr holds min(file_len, 1024) bytes of the file. */
/* Every field of a token shard's header, the tokenizer identity slots included: the one check
 * of the in-memory and the file paths (they once disagreed on a header whose slots carried the
 * tokenizer marker and a kind no tokenizer has). */
static int shard_check_header(const char *name, const uint8_t *hdr, size_t file_len, int64_t *n_tokens, int *ver,
                              tok_id *tokenizer, err_t *err) {
    if (file_len < DATA_SHARD_HEADER_BYTES)
        return err_set(err, "%s: file is %zu bytes, shorter than the %d-byte header of an llm.c token shard", name,
                       file_len, DATA_SHARD_HEADER_BYTES);
    int32_t magic = rd32s(hdr), version = rd32s(hdr + 4), count = rd32s(hdr + 8);
    if (magic != DATA_SHARD_MAGIC)
        return err_set(err, "%s: bad magic %d in the header (expected %d: not an llm.c token shard)", name, magic,
                       DATA_SHARD_MAGIC);
    if (version != DATA_SHARD_VERSION && version != DATA_SHARD_VERSION_U32)
        return err_set(err, "%s: unknown shard version %d in the header (supported: %d, uint16 tokens; %d, uint32 tokens)",
                       name, version, DATA_SHARD_VERSION, DATA_SHARD_VERSION_U32);
    if (count < 0) return err_set(err, "%s: negative token count %d in the header", name, count);
    unsigned size = version == DATA_SHARD_VERSION ? 2 : 4;
    uint64_t want = DATA_SHARD_HEADER_BYTES + size * (uint64_t)count;
    if (file_len != want)
        return err_set(err,
                       "%s: the header says %d tokens (%llu bytes with the header, version %d: %u bytes a token) but "
                       "the file has %zu bytes (room for %llu tokens%s)",
                       name, count, (unsigned long long)want, version, size, file_len,
                       (unsigned long long)((file_len - DATA_SHARD_HEADER_BYTES) / size),
                       (file_len - DATA_SHARD_HEADER_BYTES) % size ? (size == 2 ? " and an odd byte" : " and odd bytes") : "");
    *n_tokens = count;
    *ver = version;
    return data_shard_tokenizer(name, hdr, tokenizer, err);
}

int data_shard_check_version(const char *name, const void *buf, size_t len, int64_t *n_tokens, int *version,
                             err_t *err) {
    uint8_t hdr[DATA_SHARD_HEADER_BYTES] = {0};
    memcpy(hdr, buf, len < sizeof hdr ? len : sizeof hdr);
    tok_id id;
    return shard_check_header(name, hdr, len, n_tokens, version, &id, err);
}

int data_shard_check(const char *name, const void *buf, size_t len, int64_t *n_tokens, err_t *err) {
    int version;
    return data_shard_check_version(name, buf, len, n_tokens, &version, err);
}

struct data_shard_writer {
    afile f;
    int64_t count;
    int version;
    tok_id tok;
    bool masked; /* a loss mask is written beside (mask) */
    afile mask;
};

int data_mask_path(const char *shard, char *buf, size_t n, err_t *err) {
    size_t len = strlen(shard);
    if (len >= 4 && !strcmp(shard + len - 4, ".bin")) len -= 4;
    if (len + 6 > n) return err_set(err, "%s: the path of its loss mask is too long", shard);
    memcpy(buf, shard, len);
    memcpy(buf + len, ".mask", 6);
    return 0;
}

int data_shard_tokenizer(const char *name, const void *hdr, tok_id *id, err_t *err) {
    const uint8_t *h = hdr;
    *id = (tok_id){0};
    if (rd32(h + 12) != DATA_SHARD_TOKID_MARK) return 0;
    uint32_t kind = rd32(h + 16), vocab = rd32(h + 20);
    uint64_t hash = (uint64_t)rd32(h + 24) | (uint64_t)rd32(h + 28) << 32;
    bool ok = (kind == TOKID_BYTES && vocab == 256 && hash == 0) ||
              ((kind == TOKID_BYTE_BPE || kind == TOKID_SP_BPE) && vocab >= 1 && vocab <= (1u << 24));
    if (!ok)
        return err_set(err, "%s: header slots 3..7 carry the tokenizer marker but kind %u, vocabulary %u are not a "
                            "tokenizer identity (expected kind 1 with vocabulary 256, or kind 2 or 3 with 1..%u)",
                       name, kind, vocab, 1u << 24);
    *id = (tok_id){(tok_id_kind)kind, (int32_t)vocab, hash};
    return 0;
}

data_shard_writer *data_shard_writer_open(const char *path, err_t *err) {
    return data_shard_writer_open_version(path, DATA_SHARD_VERSION, err);
}

data_shard_writer *data_shard_writer_open_version(const char *path, int version, err_t *err) {
    if (version != DATA_SHARD_VERSION && version != DATA_SHARD_VERSION_U32) {
        err_set(err, "%s: shard version %d (expected %d or %d)", path, version, DATA_SHARD_VERSION, DATA_SHARD_VERSION_U32);
        return NULL;
    }
    data_shard_writer *w = xcalloc(1, sizeof *w);
    w->version = version;
    if (af_open(&w->f, path, err) < 0) {
        free(w);
        return NULL;
    }
    uint8_t hdr[DATA_SHARD_HEADER_BYTES] = {0};
    wr32(hdr, DATA_SHARD_MAGIC);
    wr32(hdr + 4, (uint32_t)version);
    if (af_write(&w->f, hdr, sizeof hdr, err) < 0) {
        data_shard_writer_abort(w);
        return NULL;
    }
    return w;
}

/* Tokens from a uint16 or a uint32 array (one of t16, t32), little-endian in the shard's width. */
static int shard_add(data_shard_writer *w, const uint16_t *t16, const uint32_t *t32, int64_t n, err_t *err) {
    if (n < 0 || n > DATA_SHARD_MAX_TOKENS - w->count)
        return err_set(err, "%s: a shard holds at most %d tokens (has %lld, adding %lld)", w->f.path,
                       DATA_SHARD_MAX_TOKENS, (long long)w->count, (long long)n);
    unsigned size = w->version == DATA_SHARD_VERSION ? 2 : 4;
    uint8_t buf[8192];
    for (int64_t i = 0; i < n;) {
        size_t k = 0;
        for (; k < sizeof buf / size && i < n; k++, i++) {
            uint32_t v = t16 ? t16[i] : t32[i];
            if (size == 2 && v > 0xffff)
                return err_set(err, "%s: token %lld is %u, too large for a version 1 shard (uint16 tokens; version %d "
                                    "holds uint32)",
                               w->f.path, (long long)(w->count + i), v, DATA_SHARD_VERSION_U32);
            buf[size * k] = (uint8_t)v;
            buf[size * k + 1] = (uint8_t)(v >> 8);
            if (size == 4) {
                buf[4 * k + 2] = (uint8_t)(v >> 16);
                buf[4 * k + 3] = (uint8_t)(v >> 24);
            }
        }
        if (af_write(&w->f, buf, size * k, err) < 0) return -1;
    }
    w->count += n;
    return 0;
}

int data_shard_writer_add(data_shard_writer *w, const uint16_t *tokens, int64_t n, err_t *err) {
    CHECK(!w->masked);
    return shard_add(w, tokens, NULL, n, err);
}

int data_shard_writer_add32(data_shard_writer *w, const uint32_t *tokens, int64_t n, err_t *err) {
    CHECK(!w->masked);
    return shard_add(w, NULL, tokens, n, err);
}

int data_shard_writer_enable_mask(data_shard_writer *w, err_t *err) {
    CHECK(!w->masked && w->count == 0);
    char path[4096];
    if (data_mask_path(w->f.path, path, sizeof path, err) < 0 || af_open(&w->mask, path, err) < 0) return -1;
    w->masked = true;
    uint8_t hdr[DATA_SHARD_HEADER_BYTES] = {0};
    wr32(hdr, DATA_MASK_MAGIC);
    wr32(hdr + 4, DATA_MASK_VERSION);
    return af_write(&w->mask, hdr, sizeof hdr, err);
}

int data_shard_writer_add32_masked(data_shard_writer *w, const uint32_t *tokens, const uint8_t *mask, int64_t n,
                                   err_t *err) {
    CHECK(w->masked);
    for (int64_t i = 0; i < n; i++) CHECK(mask[i] <= 1);
    if (shard_add(w, NULL, tokens, n, err) < 0) return -1;
    return af_write(&w->mask, mask, (size_t)n, err);
}

int64_t data_shard_writer_count(const data_shard_writer *w) { return w->count; }

void data_shard_writer_set_tokenizer(data_shard_writer *w, tok_id id) { w->tok = id; }

int data_shard_writer_close(data_shard_writer *w, err_t *err) {
    uint8_t h[24] = {0}; /* header slots 2..7: the count, then the tokenizer's identity */
    wr32(h, (uint32_t)w->count);
    if (w->tok.kind != TOKID_UNKNOWN) {
        wr32(h + 4, DATA_SHARD_TOKID_MARK);
        wr32(h + 8, (uint32_t)w->tok.kind);
        wr32(h + 12, (uint32_t)w->tok.vocab);
        wr32(h + 16, (uint32_t)w->tok.hash);
        wr32(h + 20, (uint32_t)(w->tok.hash >> 32));
    }
    int rc = 0;
    if (!w->masked) { /* a mask left beside an earlier shard of this name is not this shard's */
        char mp[4096];
        if (data_mask_path(w->f.path, mp, sizeof mp, NULL) == 0 && unlink(mp) != 0 && errno != ENOENT) {
            err_set(err, "%s: cannot remove the stale loss mask %s: %s", w->f.path, mp, strerror(errno));
            data_shard_writer_abort(w);
            return -1;
        }
    }
    if (w->masked) { /* the mask first: a shard never appears without the mask it was written with */
        rc = af_finish(&w->mask, 8, h, 4, err);
        w->masked = false;
        if (rc < 0) {
            af_abort(&w->f);
            free(w);
            return -1;
        }
    }
    rc = af_finish(&w->f, 8, h, sizeof h, err);
    free(w);
    return rc;
}

void data_shard_writer_abort(data_shard_writer *w) {
    if (!w) return;
    af_abort(&w->f);
    if (w->masked) af_abort(&w->mask);
    free(w);
}

int data_shard_write(const char *path, const uint16_t *tokens, int64_t n, err_t *err) {
    data_shard_writer *w = data_shard_writer_open(path, err);
    if (!w) return -1;
    if (data_shard_writer_add(w, tokens, n, err) < 0) {
        data_shard_writer_abort(w);
        return -1;
    }
    return data_shard_writer_close(w, err);
}

/* ------------------------------------------------------------------------------------------ */
/* CIMG image files                                                                            */

static const char cimg_magic[4] = {'C', 'I', 'M', 'G'};

static uint64_t cimg_pixels(const data_image_info *in) {
    return (uint64_t)in->channels * in->height * in->width;
}

/* Range checks shared by the reader and the writer. */
static int cimg_check_dims(const char *name, const data_image_info *in, err_t *err) {
    if (in->channels < 1 || in->channels > DATA_CIMG_MAX_CHANNELS)
        return err_set(err, "%s: %u channels (expected 1..%d)", name, in->channels, DATA_CIMG_MAX_CHANNELS);
    if (in->height < 1 || in->height > DATA_CIMG_MAX_SIDE || in->width < 1 || in->width > DATA_CIMG_MAX_SIDE)
        return err_set(err, "%s: image size %ux%u (height and width must be 1..%d)", name, in->height, in->width,
                       DATA_CIMG_MAX_SIDE);
    if (cimg_pixels(in) > DATA_CIMG_MAX_PIXELS)
        return err_set(err, "%s: %ux%ux%u = %llu values per image (at most %d)", name, in->channels, in->height,
                       in->width, (unsigned long long)cimg_pixels(in), DATA_CIMG_MAX_PIXELS);
    if (in->n_classes < 1 || in->n_classes > DATA_CIMG_MAX_CLASSES)
        return err_set(err, "%s: %u classes (expected 1..%d; labels are uint16)", name, in->n_classes,
                       DATA_CIMG_MAX_CLASSES);
    return 0;
}

static int cimg_check_header(const char *name, const uint8_t *h, size_t file_len, data_image_info *info, err_t *err) {
    if (file_len < DATA_CIMG_HEADER_BYTES)
        return err_set(err, "%s: file is %zu bytes, shorter than the %d-byte CIMG header", name, file_len,
                       DATA_CIMG_HEADER_BYTES);
    if (memcmp(h, cimg_magic, 4) != 0) {
        char found[20];
        size_t k = 0;
        for (int i = 0; i < 4; i++) {
            if (h[i] >= 0x20 && h[i] < 0x7f && h[i] != '\\') found[k++] = (char)h[i];
            else k += (size_t)snprintf(found + k, sizeof found - k, "\\x%02x", h[i]);
        }
        found[k] = '\0';
        return err_set(err, "%s: bad magic \"%s\" (expected \"CIMG\": not a CIMG image file)", name, found);
    }
    uint32_t version = rd32(h + 4);
    if (version != DATA_CIMG_VERSION)
        return err_set(err, "%s: unknown CIMG version %u (supported: %d)", name, version, DATA_CIMG_VERSION);
    data_image_info in = {.count = rd32(h + 8), .channels = rd32(h + 12), .height = rd32(h + 16),
                          .width = rd32(h + 20), .n_classes = rd32(h + 24)};
    if (cimg_check_dims(name, &in, err) < 0) return -1;
    for (int i = 28; i < DATA_CIMG_HEADER_BYTES; i++)
        if (h[i]) return err_set(err, "%s: header byte %d is %u (bytes 28..63 are reserved and must be 0)", name, i, h[i]);
    uint64_t rec = 2 + cimg_pixels(&in), want = DATA_CIMG_HEADER_BYTES + (uint64_t)in.count * rec;
    if (file_len != want)
        return err_set(err,
                       "%s: the header says %u images of %ux%ux%u (%llu bytes with the header) but the file has %zu "
                       "bytes",
                       name, in.count, in.channels, in.height, in.width, (unsigned long long)want, file_len);
    *info = in;
    return 0;
}

int data_image_check(const char *name, const void *buf, size_t len, data_image_info *info, err_t *err) {
    uint8_t hdr[DATA_CIMG_HEADER_BYTES] = {0};
    memcpy(hdr, buf, len < sizeof hdr ? len : sizeof hdr);
    return cimg_check_header(name, hdr, len, info, err);
}

int data_image_file_info(const char *path, data_image_info *info, err_t *err) {
    struct stat st;
    int fd = file_open_read(path, true, &st, err);
    if (fd < 0) return -1;
    uint8_t hdr[DATA_CIMG_HEADER_BYTES] = {0};
    ssize_t got = pread(fd, hdr, sizeof hdr, 0);
    int read_errno = errno;
    close(fd);
    if (got < 0 || ((size_t)got < sizeof hdr && got < st.st_size))
        return err_set(err, "%s: read error: %s", path, got < 0 ? strerror(read_errno) : "the file is shorter than its size");
    return cimg_check_header(path, hdr, (size_t)st.st_size, info, err);
}

struct data_image_writer {
    afile f;
    data_image_info info;
};

data_image_writer *data_image_writer_open(const char *path, const data_image_info *info, err_t *err) {
    if (cimg_check_dims(path, info, err) < 0) return NULL;
    data_image_writer *w = xcalloc(1, sizeof *w);
    w->info = *info;
    w->info.count = 0;
    if (af_open(&w->f, path, err) < 0) {
        free(w);
        return NULL;
    }
    uint8_t h[DATA_CIMG_HEADER_BYTES] = {0};
    memcpy(h, cimg_magic, 4);
    wr32(h + 4, DATA_CIMG_VERSION);
    wr32(h + 12, info->channels);
    wr32(h + 16, info->height);
    wr32(h + 20, info->width);
    wr32(h + 24, info->n_classes);
    if (af_write(&w->f, h, sizeof h, err) < 0) {
        data_image_writer_abort(w);
        return NULL;
    }
    return w;
}

int data_image_writer_add(data_image_writer *w, uint16_t label, const uint8_t *pixels, err_t *err) {
    if (label >= w->info.n_classes)
        return err_set(err, "%s: image %u: label %u is not below the file's %u classes", w->f.path, w->info.count,
                       label, w->info.n_classes);
    if (w->info.count == UINT32_MAX) return err_set(err, "%s: a CIMG file holds at most %u images", w->f.path, UINT32_MAX);
    uint8_t lb[2] = {(uint8_t)label, (uint8_t)(label >> 8)};
    if (af_write(&w->f, lb, 2, err) < 0 || af_write(&w->f, pixels, (size_t)cimg_pixels(&w->info), err) < 0) return -1;
    w->info.count++;
    return 0;
}

int data_image_writer_close(data_image_writer *w, err_t *err) {
    uint8_t cnt[4];
    wr32(cnt, w->info.count);
    int rc = af_finish(&w->f, 8, cnt, 4, err);
    free(w);
    return rc;
}

void data_image_writer_abort(data_image_writer *w) {
    if (!w) return;
    af_abort(&w->f);
    free(w);
}

int data_image_write(const char *path, const data_image_info *info, const uint16_t *labels, const uint8_t *pixels,
                     err_t *err) {
    data_image_writer *w = data_image_writer_open(path, info, err);
    if (!w) return -1;
    size_t px = (size_t)cimg_pixels(info);
    for (uint32_t i = 0; i < info->count; i++)
        if (data_image_writer_add(w, labels[i], pixels + (size_t)i * px, err) < 0) {
            data_image_writer_abort(w);
            return -1;
        }
    return data_image_writer_close(w, err);
}

/* ------------------------------------------------------------------------------------------ */
/* synthetic images                                                                            */

typedef struct synth_img {
    int label, dx, dy, freq, colour, phase;
} synth_img;

static synth_img synth_img_params(uint64_t seed, int64_t s, int n_classes) {
    static const int dirs[8][2] = {{1, 0}, {0, 1}, {1, 1}, {1, -1}, {2, 1}, {1, 2}, {2, -1}, {1, -2}};
    uint64_t h = hash4(SALT_IMG, seed, (uint64_t)s, 0);
    synth_img p;
    p.label = (int)(h % (uint64_t)n_classes);
    p.dx = dirs[p.label % 8][0];
    p.dy = dirs[p.label % 8][1];
    p.freq = 1 + (p.label / 8) % 4;
    p.colour = p.label / 32;
    p.phase = (int)((h >> 32) & 255);
    return p;
}

/* One pixel: a triangle wave along the class's direction (64..192, or 96..160 on the channels the
 * class's colour dims) plus noise in -6..6. Integer arithmetic only: identical everywhere. */
static uint8_t synth_pixel(const synth_img *p, uint64_t seed, int64_t s, int c, int y, int x, int size,
                           int64_t index) {
    int64_t proj = (int64_t)p->dx * x + (int64_t)p->dy * y;
    int64_t ph = ((proj * p->freq * 256 / size + p->phase) % 256 + 256) % 256;
    int tri = (int)(ph < 128 ? 128 - ph : ph - 128); /* 0..128 */
    bool dim = p->colour > 0 && ((p->colour >> (c % 5)) & 1);
    int v = dim ? 96 + tri / 2 : 64 + tri;
    v += (int)(hash4(SALT_IMG_NOISE, seed, (uint64_t)s, (uint64_t)index) % 13) - 6;
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

void data_synthetic_image(uint64_t seed, int64_t s, int channels, int size, int n_classes, uint8_t *pixels,
                          int32_t *label) {
    CHECK(channels >= 1 && size >= 1 && n_classes >= 1);
    synth_img p = synth_img_params(seed, s, n_classes);
    int64_t i = 0;
    for (int c = 0; c < channels; c++)
        for (int y = 0; y < size; y++)
            for (int x = 0; x < size; x++, i++) pixels[i] = synth_pixel(&p, seed, s, c, y, x, size, i);
    *label = p.label;
}

/* ------------------------------------------------------------------------------------------ */
/* sources                                                                                     */

typedef enum { SRC_TOKENS, SRC_SYN_TOKENS, SRC_IMAGES, SRC_SYN_IMAGES } src_kind;

typedef struct shard {
    char *path;
    mapping map;
    int64_t n_tokens, n_windows;
    int version; /* 1: uint16 tokens, 2: uint32 */
    tok_id tok;  /* the header's tokenizer identity */
    char *mask_path; /* the loss mask beside it, if there is one (mask.p) */
    mapping mask;
} shard;

struct data_source {
    src_kind kind;
    uint64_t seed;
    int64_t n_samples; /* W; INT64_MAX for synthetic sources */
    /* tokens */
    data_task task;
    int seq, vocab;
    int n_shards;
    shard *shards;
    int tok_first; /* the first shard with a tokenizer identity, or -1 (check_shard_tokenizer) */
    int64_t *win_start; /* n_shards + 1 prefix sums of n_windows */
    int64_t total_tokens;
    bool masked; /* the shards have loss masks */
    /* images */
    char *path;
    mapping map;
    data_image_info info;
    int channels, size, n_classes;
};

static const char *task_name(data_task t) { return t == DATA_MLM ? "mlm" : "clm"; }

static int check_token_args(int seq, int vocab, data_task task, err_t *err) {
    if (seq < 1 || seq > (1 << 24)) return err_set(err, "data: sequence length %d (expected 1..%d)", seq, 1 << 24);
    if (task != DATA_CLM && task != DATA_MLM) return err_set(err, "data: unknown task %d", (int)task);
    if (vocab < (task == DATA_MLM ? 3 : 2))
        return err_set(err, "data: vocabulary size %d (expected >= %d for %s)", vocab, task == DATA_MLM ? 3 : 2,
                       task_name(task));
    return 0;
}

/* --- spec expansion: files, directories, globs, comma lists --- */

typedef struct strlist {
    char **v;
    int n, cap;
} strlist;

static void sl_add(strlist *l, const char *s) {
    if (l->n == l->cap) l->v = xrealloc(l->v, sizeof *l->v * (size_t)(l->cap = l->cap ? 2 * l->cap : 8));
    l->v[l->n++] = xstrdup(s);
}

static void sl_free(strlist *l) {
    for (int i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
    *l = (strlist){0};
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* A validation shard by its name: a component "val" (cephalo data's val_000000.bin, llm.c's
 * fineweb_val_000000.bin), "valid" or "validation", between '_', '-' and '.'. */
bool data_is_validation_shard(const char *name) {
    const char *base = strrchr(name, '/') ? strrchr(name, '/') + 1 : name;
    for (const char *p = base; *p;) {
        size_t n = strcspn(p, "_-.");
        if ((n == 3 && !strncmp(p, "val", 3)) || (n == 5 && !strncmp(p, "valid", 5)) ||
            (n == 10 && !strncmp(p, "validation", 10)))
            return true;
        p += n + (p[n] != 0);
    }
    return false;
}

/* The first names of `names` that are (val) or are not validation shards, for a message. */
static void list_names(const strlist *names, bool val, char *buf, size_t cap) {
    size_t k = 0;
    int shown = 0;
    buf[0] = 0;
    for (int i = 0; i < names->n && k + 8 < cap; i++) {
        if (data_is_validation_shard(names->v[i]) != val) continue;
        if (shown++ == 3) {
            snprintf(buf + k, cap - k, ", ...");
            return;
        }
        k += (size_t)snprintf(buf + k, cap - k, "%s%s", k ? ", " : "", names->v[i]);
    }
}

/* A directory's *.bin shards for a role: training leaves its validation shards out (they are the
 * held-out data: training on them would make the validation loss meaningless), and validation
 * takes only them when the directory has any. A directory of validation shards alone trains on
 * nothing: named files or a pattern say that is meant. */
static int pick_role(const char *dir, strlist *names, data_role role, err_t *err) {
    int n_val = 0;
    for (int i = 0; i < names->n; i++) n_val += data_is_validation_shard(names->v[i]);
    if (n_val == 0 || (n_val == names->n && role == DATA_VALIDATION)) return 0;
    char shown[256];
    list_names(names, true, shown, sizeof shown);
    if (role == DATA_TRAIN && n_val == names->n)
        return err_set(err, "%s: only validation shards (%s): name them (%s/%s) to train on them, or give the "
                       "training shards", dir, shown, dir, names->v[0]);
    bool keep_val = role == DATA_VALIDATION;
    if (role == DATA_TRAIN)
        log_msg("info", "%s: %d validation shard%s left out of the training data (%s); give %s with --val-data", dir,
                n_val, n_val == 1 ? "" : "s", shown, n_val == 1 ? "it" : "them");
    int k = 0;
    for (int i = 0; i < names->n; i++) {
        if (data_is_validation_shard(names->v[i]) == keep_val) names->v[k++] = names->v[i];
        else free(names->v[i]);
    }
    names->n = k;
    return 0;
}

static int expand_dir(const char *dir, data_role role, strlist *out, err_t *err) {
    DIR *d = opendir(dir);
    if (!d) return err_set(err, "%s: cannot open directory: %s", dir, strerror(errno));
    strlist names = {0};
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n > 4 && !strcmp(e->d_name + n - 4, ".bin")) sl_add(&names, e->d_name);
    }
    closedir(d);
    if (!names.n) return err_set(err, "%s: no *.bin token shards in the directory", dir);
    qsort(names.v, (size_t)names.n, sizeof *names.v, cmp_str);
    if (pick_role(dir, &names, role, err) < 0) {
        sl_free(&names);
        return -1;
    }
    size_t dl = strlen(dir);
    bool slash = dl && dir[dl - 1] == '/';
    for (int i = 0; i < names.n; i++) {
        size_t len = dl + 1 + strlen(names.v[i]) + 1;
        char *p = xmalloc(len);
        snprintf(p, len, "%s%s%s", dir, slash ? "" : "/", names.v[i]);
        sl_add(out, p);
        free(p);
    }
    sl_free(&names);
    return 0;
}

static int expand_item(const char *item, data_role role, strlist *out, err_t *err) {
    struct stat st;
    if (stat(item, &st) != 0 && strpbrk(item, "*?[")) { /* an existing name is taken literally */
        glob_t g;
        int rc = glob(item, 0, NULL, &g);
        if (rc == GLOB_NOMATCH) return err_set(err, "%s: no files match the pattern", item);
        if (rc != 0) return err_set(err, "%s: cannot expand the pattern", item);
        qsort(g.gl_pathv, g.gl_pathc, sizeof *g.gl_pathv, cmp_str);
        for (size_t i = 0; i < g.gl_pathc; i++) sl_add(out, g.gl_pathv[i]);
        globfree(&g);
        return 0;
    }
    if (stat(item, &st) != 0) return err_set(err, "%s: cannot open: %s", item, strerror(errno));
    if (S_ISDIR(st.st_mode)) return expand_dir(item, role, out, err);
    sl_add(out, item);
    return 0;
}

static int expand_spec(const char *spec, data_role role, strlist *out, err_t *err) {
    if (!spec || !*spec) return err_set(err, "data: empty data path");
    char *copy = xstrdup(spec), *save = NULL;
    int rc = 0;
    for (char *p = copy;; p = NULL) {
        char *item = strtok_r(p, ",", &save);
        if (!item) break;
        if ((rc = expand_item(item, role, out, err)) < 0) break;
    }
    free(copy);
    if (!rc && !out->n) rc = err_set(err, "data: '%s' names no files", spec);
    return rc;
}

static bool is_shard_file(const char *name) {
    return str_ends_with(name, ".bin") || str_ends_with(name, ".mask") || !strcmp(name, "tokenizer.json");
}

/* The *.bin files of a data directory (those expand_dir reads), their *.mask loss masks and the
 * tokenizer.json the trainer takes from there (state/mtok.h). */
static const out_kind data_dir_input = {"data directory", is_shard_file, true, NULL, NULL};

void data_spec_inputs(out_set *s, const char *opt, const char *spec) {
    if (!spec || !strcmp(spec, "synthetic")) return;
    char *copy = xstrdup(spec), *save = NULL;
    for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        out_input_path(s, opt, item, &data_dir_input); /* a file, a directory, or a pattern */
        if (item == copy && !file_is_dir(item)) { /* the tokenizer.json beside the first (state/mtok.h) */
            const char *slash = strrchr(item, '/');
            char *tokfile = slash ? str_printf("%.*s/tokenizer.json", (int)(slash - item), item) : xstrdup("tokenizer.json");
            out_input(s, opt, tokfile);
            free(tokfile);
        }
        if (!str_ends_with(item, ".bin")) continue;
        /* X.bin's loss mask X.mask (or a pattern's) is read too: never an output */
        size_t n = strlen(item);
        char *mask = xmalloc(n + 2);
        snprintf(mask, n + 2, "%.*s.mask", (int)(n - 4), item);
        out_input_path(s, opt, mask, &data_dir_input);
        free(mask);
    }
    free(copy);
}

/* --- token sources --- */

static data_source *ds_new(src_kind kind, uint64_t seed) {
    data_source *ds = xcalloc(1, sizeof *ds);
    ds->kind = kind;
    ds->seed = seed;
    ds->tok_first = -1;
    return ds;
}

void data_close(data_source *ds) {
    if (!ds) return;
    for (int i = 0; i < ds->n_shards; i++) {
        unmap(&ds->shards[i].map);
        unmap(&ds->shards[i].mask);
        free(ds->shards[i].path);
        free(ds->shards[i].mask_path);
    }
    free(ds->shards);
    free(ds->win_start);
    unmap(&ds->map);
    free(ds->path);
    free(ds);
}

/* The shard's loss mask, when there is one beside it: its header against the shard's count. */
static int open_mask(shard *sh, err_t *err) {
    char path[4096];
    struct stat st;
    if (data_mask_path(sh->path, path, sizeof path, err) < 0) return -1;
    if (stat(path, &st) != 0) return 0; /* none */
    sh->mask_path = xstrdup(path);
    uint8_t hdr[DATA_SHARD_HEADER_BYTES] = {0};
    size_t len;
    if (map_file(path, &sh->mask, hdr, sizeof hdr, &len, err) < 0) return -1;
    if (len < DATA_SHARD_HEADER_BYTES)
        return err_set(err, "%s: file is %zu bytes, shorter than the %d-byte header of a loss mask", path, len,
                       DATA_SHARD_HEADER_BYTES);
    if (rd32(hdr) != DATA_MASK_MAGIC || rd32s(hdr + 4) != DATA_MASK_VERSION)
        return err_set(err, "%s: not a loss mask (header magic %u, version %d; expected %u, version %d)", path, rd32(hdr),
                       rd32s(hdr + 4), DATA_MASK_MAGIC, DATA_MASK_VERSION);
    int64_t count = rd32s(hdr + 8);
    if (count != sh->n_tokens || len != DATA_SHARD_HEADER_BYTES + (uint64_t)count)
        return err_set(err, "%s: the loss mask has %lld entries in its header and %zu bytes after it, but its shard %s "
                            "has %lld tokens (one byte per token expected)",
                       path, (long long)count, len - DATA_SHARD_HEADER_BYTES, sh->path, (long long)sh->n_tokens);
    return 0;
}

static int open_shard(shard *sh, const char *path, int seq, err_t *err) {
    uint8_t hdr[DATA_SHARD_HEADER_BYTES] = {0};
    size_t len;
    sh->path = xstrdup(path);
    if (map_file(path, &sh->map, hdr, sizeof hdr, &len, err) < 0) return -1;
    if (shard_check_header(path, hdr, len, &sh->n_tokens, &sh->version, &sh->tok, err) < 0) return -1;
    sh->n_windows = sh->n_tokens >= (int64_t)seq + 1 ? (sh->n_tokens - 1) / seq : 0;
    return open_mask(sh, err);
}

/* Shard i's tokenizer against the others' and the model's vocabulary: data written with another
 * tokenizer, or with one whose ids the model cannot embed, is refused before the first step
 * rather than when a large id is read mid-run. Shards without an identity pass (their tokens are
 * checked as read). The shards before i that have one all have the first one's (they passed), so
 * i is compared with that one alone: not with every shard before it (thousands in a directory). */
static int check_shard_tokenizer(data_source *ds, int i, err_t *err) {
    const shard *sh = &ds->shards[i];
    char a[TOK_ID_NAME_MAX], b[TOK_ID_NAME_MAX];
    if (sh->tok.kind == TOKID_UNKNOWN) return 0;
    tok_id_name(sh->tok, a);
    if (ds->tok_first < 0) ds->tok_first = i;
    const shard *first = &ds->shards[ds->tok_first];
    if (!tok_id_equal(first->tok, sh->tok)) {
        tok_id_name(first->tok, b);
        return err_set(err, "%s: written with tokenizer %s, but %s with %s: the shards of one run need one tokenizer",
                       sh->path, a, first->path, b);
    }
    if (sh->tok.vocab > ds->vocab)
        return err_set(err, "%s: written with tokenizer %s (vocabulary %d), larger than the model's vocabulary %d: "
                            "not this model's data (tokenize it with the model's tokenizer.json)",
                       sh->path, a, (int)sh->tok.vocab, ds->vocab);
    return 0;
}

/* Masks are all or none (a step mixing masked and unmasked windows has no one meaning of its loss);
 * MLM chooses its own targets. */
static int check_shard_mask(data_source *ds, int i, err_t *err) {
    const shard *sh = &ds->shards[i];
    bool has = sh->mask_path != NULL;
    if (i == 0) ds->masked = has;
    if (has != ds->masked) {
        const shard *a = has ? sh : &ds->shards[0], *b = has ? &ds->shards[0] : sh;
        return err_set(err, "%s has a loss mask (%s) but %s has none: the shards of one run need masks on all or none",
                       a->path, a->mask_path, b->path);
    }
    if (has && ds->task == DATA_MLM)
        return err_set(err, "%s: a loss mask (%s) is for causal language models; MLM chooses its own targets",
                       sh->path, sh->mask_path);
    return 0;
}

tok_id data_tokenizer(const data_source *ds, const char **first) {
    if (first) *first = ds->n_shards ? ds->shards[ds->tok_first < 0 ? 0 : ds->tok_first].path : NULL;
    return ds->tok_first < 0 ? (tok_id){0} : ds->shards[ds->tok_first].tok;
}

int data_open_tokens(data_source **out, const char *spec, data_role role, int seq, int vocab, data_task task,
                     uint64_t seed, err_t *err) {
    *out = NULL;
    if (check_token_args(seq, vocab, task, err) < 0) return -1;
    strlist files = {0};
    if (expand_spec(spec, role, &files, err) < 0) {
        sl_free(&files);
        return -1;
    }
    data_source *ds = ds_new(SRC_TOKENS, seed);
    ds->task = task;
    ds->seq = seq;
    ds->vocab = vocab;
    ds->shards = xcalloc((size_t)files.n, sizeof *ds->shards);
    ds->win_start = xcalloc((size_t)files.n + 1, sizeof *ds->win_start);
    for (int i = 0; i < files.n; i++) {
        ds->n_shards = i + 1;
        if (open_shard(&ds->shards[i], files.v[i], seq, err) < 0) {
            sl_free(&files);
            data_close(ds);
            return -1;
        }
        if (check_shard_tokenizer(ds, i, err) < 0) {
            sl_free(&files);
            data_close(ds);
            return -1;
        }
        if (check_shard_mask(ds, i, err) < 0) {
            sl_free(&files);
            data_close(ds);
            return -1;
        }
        ds->win_start[i + 1] = ds->win_start[i] + ds->shards[i].n_windows;
        ds->total_tokens += ds->shards[i].n_tokens;
    }
    sl_free(&files);
    ds->n_samples = ds->win_start[ds->n_shards];
    if (ds->n_samples == 0) {
        char list[600];
        size_t k = 0;
        int i = 0;
        for (; i < ds->n_shards && k < sizeof list - 200; i++)
            k += (size_t)snprintf(list + k, sizeof list - k, "%s%s: %lld tokens", i ? ", " : "", ds->shards[i].path,
                                  (long long)ds->shards[i].n_tokens);
        if (i < ds->n_shards && k < sizeof list - 8) snprintf(list + k, sizeof list - k, ", ...");
        err_set(err, "data: no training sample: every shard is shorter than seq+1 = %d tokens (%s)", seq + 1, list);
        data_close(ds);
        return -1;
    }
    *out = ds;
    return 0;
}

int data_open_synthetic_tokens(data_source **out, int seq, int vocab, data_task task, uint64_t seed, err_t *err) {
    *out = NULL;
    if (check_token_args(seq, vocab, task, err) < 0) return -1;
    data_source *ds = ds_new(SRC_SYN_TOKENS, seed);
    ds->task = task;
    ds->seq = seq;
    ds->vocab = vocab;
    ds->n_samples = INT64_MAX;
    *out = ds;
    return 0;
}

int64_t data_sample_index(const data_source *ds, int64_t s) {
    if (s < 0) return -1;
    if (ds->kind == SRC_SYN_TOKENS || ds->kind == SRC_SYN_IMAGES) return s;
    uint64_t w = (uint64_t)ds->n_samples;
    return (int64_t)perm_apply(w, ds->seed, (uint64_t)s / w, (uint64_t)s % w);
}

/* The shard that sample s (of a shard source) reads, and its window's first token there. */
static const shard *locate(const data_source *ds, int64_t s, int64_t *first) {
    int64_t w = data_sample_index(ds, s);
    int lo = 0, hi = ds->n_shards - 1; /* the shard with win_start[i] <= w < win_start[i+1] */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (ds->win_start[mid] <= w) lo = mid;
        else hi = mid - 1;
    }
    *first = (w - ds->win_start[lo]) * ds->seq;
    return &ds->shards[lo];
}

/* The mask bytes of sample s's targets (tokens first+1 .. first+seq), checked to be 0 or 1;
 * tg (may be NULL) gets -1 where the byte is 0, *n (may be NULL) the count of 1s. */
static int apply_mask(const data_source *ds, int64_t s, int32_t *tg, int64_t *n, err_t *err) {
    int64_t first, count = 0;
    const shard *sh = locate(ds, s, &first);
    const uint8_t *m = sh->mask.p + DATA_SHARD_HEADER_BYTES + first + 1;
    for (int t = 0; t < ds->seq; t++) {
        if (m[t] > 1)
            return err_set(err, "%s: entry %lld is %u (a loss mask holds 0 or 1)", sh->mask_path,
                           (long long)(first + 1 + t), m[t]);
        count += m[t];
        if (tg && !m[t]) tg[t] = -1;
    }
    if (n) *n = count;
    return 0;
}

int data_sample_targets(data_source *ds, int64_t s, int64_t *n, err_t *err) {
    CHECK(ds->masked);
    if (s < 0) return err_set(err, "data: negative sample index %lld", (long long)s);
    return apply_mask(ds, s, NULL, n, err);
}

bool data_has_loss_mask(const data_source *ds) { return ds->masked; }

/* Fills in[0..seq) with the window's first seq tokens and *last with token seq, checking each. */
static int read_window(const data_source *ds, int64_t s, int32_t *in, int32_t *last, err_t *err) {
    int seq = ds->seq;
    if (ds->kind == SRC_SYN_TOKENS) {
        int64_t m = ds->vocab - 1; /* tokens 0..vocab-2: vocab-1 stays free for the MLM mask */
        uint64_t h = hash4(SALT_SYN_TOK, ds->seed, (uint64_t)s, 0);
        int64_t start = (int64_t)(h % (uint64_t)m), stride = 1 + (int64_t)((h >> 32) % 4);
        for (int t = 0; t <= seq; t++) {
            int64_t v = (start + stride * t) % m;
            uint64_t hn = hash4(SALT_SYN_NOISE, ds->seed, (uint64_t)s, (uint64_t)t);
            if (hn % 50 == 0) v = (int64_t)((hn >> 16) % (uint64_t)m);
            if (t < seq) in[t] = (int32_t)v;
            else *last = (int32_t)v;
        }
        return 0;
    }
    int64_t first;
    const shard *sh = locate(ds, s, &first);
    bool wide = sh->version == DATA_SHARD_VERSION_U32;
    const uint8_t *p = sh->map.p + DATA_SHARD_HEADER_BYTES + (wide ? 4 : 2) * first;
    bool mlm = ds->task == DATA_MLM;
    int n = mlm ? seq : seq + 1; /* MLM does not use the window's last token */
    for (int t = 0; t < n; t++) {
        uint32_t u = wide ? rd32(p + 4 * t) : rd16(p + 2 * t);
        if (u >= (uint32_t)ds->vocab)
            return err_set(err, "%s: token %lld is %u, not below the model's vocabulary size %d", sh->path,
                           (long long)(first + t), u, ds->vocab);
        int v = (int)u;
        if (mlm && v == ds->vocab - 1)
            return err_set(err,
                           "%s: token %lld is %d, the mask token of MLM (vocab-1); data tokens must be below %d for "
                           "a model with vocabulary size %d",
                           sh->path, (long long)(first + t), v, ds->vocab - 1, ds->vocab);
        if (t < seq) in[t] = v;
        else *last = v;
    }
    if (mlm) *last = 0;
    return 0;
}

/* BERT masking of inputs[0..seq) in place; targets -1 where not chosen. */
static void mlm_mask(const data_source *ds, int64_t s, int32_t *in, int32_t *tg) {
    int seq = ds->seq, mask_id = ds->vocab - 1, chosen = 0;
    const uint64_t thresh = (uint64_t)(0.15 * (double)(1u << 24)); /* 24-bit uniform < 0.15 */
    for (int t = 0; t < seq; t++) tg[t] = -1;
    for (int pass = 0; pass < 2 && !chosen; pass++)
        for (int t = 0; t < seq; t++) {
            uint64_t h = hash4(SALT_MLM, ds->seed, (uint64_t)s, (uint64_t)t);
            if (pass == 0 && (h >> 40) >= thresh) continue;
            if (pass == 1 && (uint64_t)t != hash4(SALT_MLM_FORCE, ds->seed, (uint64_t)s, 0) % (uint64_t)seq) continue;
            chosen++;
            tg[t] = in[t];
            int r = (int)((h & 0xffffff) % 10);
            if (r < 8) in[t] = mask_id;
            else if (r == 8)
                in[t] = (int32_t)(hash4(SALT_MLM_RAND, ds->seed, (uint64_t)s, (uint64_t)t) % (uint64_t)(ds->vocab - 1));
        }
}

int data_get_tokens(data_source *ds, int64_t s, int32_t *inputs, int32_t *targets, err_t *err) {
    if (ds->kind != SRC_TOKENS && ds->kind != SRC_SYN_TOKENS)
        return err_set(err, "data: the source holds images, not tokens");
    if (s < 0) return err_set(err, "data: negative sample index %lld", (long long)s);
    int32_t last = 0;
    if (read_window(ds, s, inputs, &last, err) < 0) return -1;
    if (ds->task == DATA_CLM) {
        for (int t = 0; t + 1 < ds->seq; t++) targets[t] = inputs[t + 1];
        targets[ds->seq - 1] = last;
        if (ds->masked) return apply_mask(ds, s, targets, NULL, err);
    } else {
        mlm_mask(ds, s, inputs, targets);
    }
    return 0;
}

/* --- image sources --- */

static int check_image_args(int channels, int size, int n_classes, err_t *err) {
    if (channels < 1 || channels > DATA_CIMG_MAX_CHANNELS)
        return err_set(err, "data: %d image channels (expected 1..%d)", channels, DATA_CIMG_MAX_CHANNELS);
    if (size < 1 || size > DATA_CIMG_MAX_SIDE || (uint64_t)channels * (uint64_t)size * (uint64_t)size > DATA_CIMG_MAX_PIXELS)
        return err_set(err, "data: image size %d (expected 1..%d, at most %d values per image)", size,
                       DATA_CIMG_MAX_SIDE, DATA_CIMG_MAX_PIXELS);
    if (n_classes < 1 || n_classes > DATA_CIMG_MAX_CLASSES)
        return err_set(err, "data: %d classes (expected 1..%d)", n_classes, DATA_CIMG_MAX_CLASSES);
    return 0;
}

int data_open_images(data_source **out, const char *path, int channels, int size, int n_classes, uint64_t seed,
                     err_t *err) {
    *out = NULL;
    if (check_image_args(channels, size, n_classes, err) < 0) return -1;
    data_source *ds = ds_new(SRC_IMAGES, seed);
    ds->path = xstrdup(path);
    uint8_t hdr[DATA_CIMG_HEADER_BYTES] = {0};
    size_t len;
    if (map_file(path, &ds->map, hdr, sizeof hdr, &len, err) < 0 || cimg_check_header(path, hdr, len, &ds->info, err) < 0)
        goto fail;
    const data_image_info *in = &ds->info;
    if ((int)in->channels != channels) {
        err_set(err, "%s: the file's images have %u channels but the model takes %d", path, in->channels, channels);
        goto fail;
    }
    if ((int)in->height != size || (int)in->width != size) {
        err_set(err, "%s: the file's images are %ux%u (height x width) but the model takes %dx%d", path, in->height,
                in->width, size, size);
        goto fail;
    }
    if ((int)in->n_classes != n_classes) {
        err_set(err, "%s: the file has %u classes but the model has %d", path, in->n_classes, n_classes);
        goto fail;
    }
    if (in->count == 0) {
        err_set(err, "%s: the file holds no images", path);
        goto fail;
    }
    ds->channels = channels;
    ds->size = size;
    ds->n_classes = n_classes;
    ds->n_samples = in->count;
    *out = ds;
    return 0;
fail:
    data_close(ds);
    return -1;
}

int data_open_synthetic_images(data_source **out, int channels, int size, int n_classes, uint64_t seed, err_t *err) {
    *out = NULL;
    if (check_image_args(channels, size, n_classes, err) < 0) return -1;
    data_source *ds = ds_new(SRC_SYN_IMAGES, seed);
    ds->channels = channels;
    ds->size = size;
    ds->n_classes = n_classes;
    ds->n_samples = INT64_MAX;
    *out = ds;
    return 0;
}

static float norm_pixel(uint8_t x) { return ((float)x / 255.0f - 0.5f) / 0.5f; }

int data_get_image(data_source *ds, int64_t s, float *pixels, int32_t *label, err_t *err) {
    if (ds->kind != SRC_IMAGES && ds->kind != SRC_SYN_IMAGES)
        return err_set(err, "data: the source holds tokens, not images");
    if (s < 0) return err_set(err, "data: negative sample index %lld", (long long)s);
    int size = ds->size;
    if (ds->kind == SRC_SYN_IMAGES) {
        synth_img p = synth_img_params(ds->seed, s, ds->n_classes);
        int64_t i = 0;
        for (int c = 0; c < ds->channels; c++)
            for (int y = 0; y < size; y++)
                for (int x = 0; x < size; x++, i++) pixels[i] = norm_pixel(synth_pixel(&p, ds->seed, s, c, y, x, size, i));
        *label = p.label;
        return 0;
    }
    int64_t idx = data_sample_index(ds, s);
    size_t px = (size_t)cimg_pixels(&ds->info);
    const uint8_t *rec = ds->map.p + DATA_CIMG_HEADER_BYTES + (size_t)idx * (2 + px);
    uint16_t lab = rd16(rec);
    if (lab >= ds->info.n_classes)
        return err_set(err, "%s: image %lld has label %u, not below the file's %u classes", ds->path, (long long)idx,
                       lab, ds->info.n_classes);
    for (size_t i = 0; i < px; i++) pixels[i] = norm_pixel(rec[2 + i]);
    *label = lab;
    return 0;
}

/* --- common --- */

bool data_is_images(const data_source *ds) { return ds->kind == SRC_IMAGES || ds->kind == SRC_SYN_IMAGES; }

int64_t data_num_samples(const data_source *ds) { return ds->n_samples; }

int64_t data_epoch_steps(const data_source *ds, long epochs, int64_t batch) {
    if (ds->n_samples == INT64_MAX || batch < 1) return 0;
    return ((int64_t)epochs * ds->n_samples + batch - 1) / batch;
}

void data_describe(const data_source *ds, char *buf, size_t n) {
    if (!n) return;
    switch (ds->kind) {
    case SRC_TOKENS: {
        if (ds->n_shards == 1)
            snprintf(buf, n, "tokens: 1 shard (%s), %lld tokens, %lld windows of %d+1, %s, vocab %d, seed %llu",
                     ds->shards[0].path, (long long)ds->total_tokens, (long long)ds->n_samples, ds->seq,
                     ds->masked ? "clm, loss masks" : task_name(ds->task), ds->vocab, (unsigned long long)ds->seed);
        else
            snprintf(buf, n, "tokens: %d shards (%s .. %s), %lld tokens, %lld windows of %d+1, %s, vocab %d, seed %llu",
                     ds->n_shards, ds->shards[0].path, ds->shards[ds->n_shards - 1].path, (long long)ds->total_tokens,
                     (long long)ds->n_samples, ds->seq, ds->masked ? "clm, loss masks" : task_name(ds->task), ds->vocab,
                     (unsigned long long)ds->seed);
        break;
    }
    case SRC_SYN_TOKENS:
        snprintf(buf, n, "tokens: synthetic (arithmetic sequences), seq %d, %s, vocab %d, seed %llu", ds->seq,
                 task_name(ds->task), ds->vocab, (unsigned long long)ds->seed);
        break;
    case SRC_IMAGES:
        snprintf(buf, n, "images: %s, %u images of %ux%ux%u, %u classes, seed %llu", ds->path, ds->info.count,
                 ds->info.channels, ds->info.height, ds->info.width, ds->info.n_classes, (unsigned long long)ds->seed);
        break;
    case SRC_SYN_IMAGES:
        snprintf(buf, n, "images: synthetic (oriented stripes), %dx%dx%d, %d classes, seed %llu", ds->channels, ds->size,
                 ds->size, ds->n_classes, (unsigned long long)ds->seed);
        break;
    }
}
