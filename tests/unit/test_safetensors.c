/* test_safetensors.c - safetensors files: round trips, st_expect, one clear message per kind of
 * corrupt file, the CRC, and the atomic save (a failed save leaves the old file and no temporary
 * file behind).
 *
 * Headers in this file are written with single quotes for readability; file_with() turns them into
 * double quotes. Every test works in a fresh temporary directory. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "formats/safetensors.h"

static char dir[64];

static int make_dir(void **state) {
    (void)state;
    const char *base = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/st-test-XXXXXX", base && strlen(base) < 40 ? base : "/tmp");
    return mkdtemp(dir) ? 0 : -1;
}

/* Removes everything in the directory (files, and directories the tests made), then the
 * directory. */
static int remove_dir(void **state) {
    (void)state;
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char p[512];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        chmod(p, 0755);
        if (remove(p) != 0) {
            char cmd[600];
            snprintf(cmd, sizeof cmd, "rm -rf '%s'", p);
            if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", p);
        }
    }
    closedir(d);
    rmdir(dir);
    return 0;
}

static const char *in_dir(const char *name, char *buf, size_t bufsz) {
    snprintf(buf, bufsz, "%s/%s", dir, name);
    return buf;
}

static void write_bytes(const char *path, const void *buf, size_t len) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

static unsigned char *read_bytes(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    assert_true(n >= 0);
    rewind(f);
    unsigned char *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return buf;
}

/* Writes a file from a header (single quotes become double quotes; header_size overrides the size
 * field unless it is UINT64_MAX) followed by data_len bytes (i * 7 + 1, or from `data`). */
static const char *file_with_size(const char *squoted, uint64_t header_size, const void *data,
                                  size_t data_len) {
    static char path[256];
    in_dir("t.safetensors", path, sizeof path);
    size_t hlen = strlen(squoted);
    unsigned char *buf = malloc(8 + hlen + data_len + 1);
    assert_non_null(buf);
    uint64_t n = header_size == UINT64_MAX ? hlen : header_size;
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)(n >> (8 * i));
    for (size_t i = 0; i < hlen; i++)
        buf[8 + i] = squoted[i] == '\'' ? '"' : (unsigned char)squoted[i];
    for (size_t i = 0; i < data_len; i++)
        buf[8 + hlen + i] = data ? ((const unsigned char *)data)[i] : (unsigned char)(i * 7 + 1);
    write_bytes(path, buf, 8 + hlen + data_len);
    free(buf);
    return path;
}

static const char *file_with(const char *squoted, size_t data_len) {
    return file_with_size(squoted, UINT64_MAX, NULL, data_len);
}

/* Opening `path` must fail with a message that starts with the path and contains every needle. */
static void expect_open_error(const char *path, const char *needle, const char *needle2) {
    st_file *f = (st_file *)1;
    err_t err;
    memset(&err, 0, sizeof err);
    int rc = st_open(&f, path, &err);
    if (rc != -1 || f != NULL || strncmp(err.msg, path, strlen(path)) != 0 ||
        !strstr(err.msg, needle) || (needle2 && !strstr(err.msg, needle2)))
        fail_msg("rc %d, message \"%s\"; wanted -1 and a message naming the file and containing "
                 "\"%s\"%s%s",
                 rc, err.msg, needle, needle2 ? " and " : "", needle2 ? needle2 : "");
}

static void expect_bad(const char *squoted, size_t data_len, const char *needle,
                       const char *needle2) {
    expect_open_error(file_with(squoted, data_len), needle, needle2);
}

static st_file *open_ok(const char *path) {
    st_file *f = NULL;
    err_t err;
    if (st_open(&f, path, &err) != 0) fail_msg("%s", err.msg);
    assert_non_null(f);
    return f;
}

/* Number of directory entries whose name contains ".tmp.". */
static int temp_files(void) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".tmp.")) n++;
    closedir(d);
    return n;
}

/* ---- CRC and dtypes ------------------------------------------------------------------------ */

static uint32_t crc_bytewise(const unsigned char *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    }
    return ~c;
}

static void test_crc32(void **state) {
    (void)state;
    assert_int_equal(st_crc32(0, "123456789", 9), 0xCBF43926u);
    assert_int_equal(st_crc32(0, "", 0), 0);
    assert_int_equal(st_crc32(0, "The quick brown fox jumps over the lazy dog", 43), 0x414FA339u);
    unsigned char buf[1000];
    uint32_t x = 12345;
    for (size_t i = 0; i < sizeof buf; i++) {
        x = x * 1103515245u + 12345u;
        buf[i] = (unsigned char)(x >> 16);
    }
    /* every alignment and length mix of the 8-byte path and the byte tails */
    for (size_t off = 0; off < 9; off++)
        for (size_t len = 0; len + off <= sizeof buf; len += 37)
            assert_int_equal(st_crc32(0, buf + off, len), crc_bytewise(buf + off, len));
    /* continuing a CRC equals one pass */
    uint32_t c = st_crc32(0, buf, 333);
    assert_int_equal(st_crc32(c, buf + 333, 667), st_crc32(0, buf, 1000));
}

static void test_dtypes(void **state) {
    (void)state;
    assert_int_equal(st_dtype_size(ST_F32), 4);
    assert_int_equal(st_dtype_size(ST_BF16), 2);
    assert_int_equal(st_dtype_size(ST_F64), 8);
    assert_int_equal(st_dtype_size(ST_BOOL), 1);
    assert_string_equal(st_dtype_name(ST_BF16), "BF16");
    assert_string_equal(st_dtype_name(ST_F8_E4M3), "F8_E4M3");
    for (int i = 0; i < ST_NDTYPES; i++)
        assert_int_equal(st_dtype_parse(st_dtype_name((st_dtype)i)), i);
    assert_int_equal(st_dtype_parse("f32"), -1);
    assert_int_equal(st_dtype_parse("F4"), -1);
}

/* ---- round trips --------------------------------------------------------------------------- */

static void test_round_trip(void **state) {
    (void)state;
    float w[6] = {1.5f, -2, 3, 4, 5, 6.25f};
    uint16_t h[4] = {0x3c00, 0x4000, 0xbc00, 0};
    uint16_t bf[3] = {0x3f80, 0x4000, 0xc040};
    double scalar = 3.141592653589793;
    int64_t steps[2] = {-1, INT64_MAX};
    int8_t i8[3] = {-128, 0, 127};
    uint8_t u8[5] = {1, 2, 3, 4, 5};
    uint8_t flag[1] = {1};
    int32_t none[1] = {0};

    st_writer *wr = st_writer_new();
    /* added with a 1-byte tensor first, so the layout must reorder for alignment */
    st_writer_add(wr, "i8", ST_I8, 1, (int64_t[]){3}, i8);
    st_writer_add(wr, "layer.0.w", ST_F32, 2, (int64_t[]){2, 3}, w);
    st_writer_add(wr, "h", ST_F16, 1, (int64_t[]){4}, h);
    st_writer_add(wr, "bf", ST_BF16, 2, (int64_t[]){3, 1}, bf);
    st_writer_add(wr, "scalar", ST_F64, 0, NULL, &scalar);
    st_writer_add(wr, "steps", ST_I64, 1, (int64_t[]){2}, steps);
    st_writer_add(wr, "empty", ST_I32, 2, (int64_t[]){0, 5}, NULL);
    st_writer_add(wr, "empty2", ST_I32, 1, (int64_t[]){0}, none);
    st_writer_add(wr, "u8", ST_U8, 1, (int64_t[]){5}, u8);
    st_writer_add(wr, "flag", ST_BOOL, 0, NULL, flag);
    st_writer_add(wr, "odd \"name\"\n\xc3\xa9", ST_U8, 1, (int64_t[]){1}, u8);
    st_writer_meta(wr, "format", "cephalo-checkpoint");
    st_writer_meta(wr, "note", "quotes \" backslash \\ newline \n tab \t caf\xc3\xa9");
    char path[256];
    in_dir("rt.safetensors", path, sizeof path);
    err_t err;
    if (st_writer_save(wr, path, 0, &err) != 0) fail_msg("%s", err.msg);
    st_writer_free(wr);
    assert_int_equal(temp_files(), 0);

    /* the header size is a multiple of 8 */
    size_t len;
    unsigned char *bytes = read_bytes(path, &len);
    uint64_t n = 0;
    for (int i = 0; i < 8; i++)
        n |= (uint64_t)bytes[i] << (8 * i);
    assert_int_equal(n % 8, 0);
    assert_true(bytes[8] == '{');
    free(bytes);

    st_file *f = open_ok(path);
    assert_string_equal(st_label(f), path);
    assert_int_equal(st_count(f), 11);
    assert_string_equal(st_meta(f, "format"), "cephalo-checkpoint");
    assert_string_equal(st_meta(f, "note"), "quotes \" backslash \\ newline \n tab \t caf\xc3\xa9");
    assert_non_null(st_meta(f, ST_CRC_KEY));
    assert_null(st_meta(f, "missing"));

    const void *p;
    if (st_expect(f, "layer.0.w", ST_F32, 2, (int64_t[]){2, 3}, &p, &err) != 0)
        fail_msg("%s", err.msg);
    assert_memory_equal(p, w, sizeof w);
    assert_int_equal(st_expect(f, "h", ST_F16, 1, (int64_t[]){4}, &p, &err), 0);
    assert_memory_equal(p, h, sizeof h);
    assert_int_equal(st_expect(f, "bf", ST_BF16, 2, (int64_t[]){3, 1}, &p, &err), 0);
    assert_memory_equal(p, bf, sizeof bf);
    assert_int_equal(st_expect(f, "scalar", ST_F64, 0, NULL, &p, &err), 0);
    assert_memory_equal(p, &scalar, sizeof scalar);
    assert_int_equal(st_expect(f, "steps", ST_I64, 1, (int64_t[]){2}, &p, &err), 0);
    assert_memory_equal(p, steps, sizeof steps);
    assert_int_equal(st_expect(f, "i8", ST_I8, 1, (int64_t[]){3}, &p, &err), 0);
    assert_memory_equal(p, i8, sizeof i8);
    assert_int_equal(st_expect(f, "u8", ST_U8, 1, (int64_t[]){5}, &p, &err), 0);
    assert_memory_equal(p, u8, sizeof u8);
    assert_int_equal(st_expect(f, "flag", ST_BOOL, 0, NULL, &p, &err), 0);
    assert_memory_equal(p, flag, 1);
    assert_int_equal(st_expect(f, "empty", ST_I32, 2, (int64_t[]){0, 5}, NULL, &err), 0);
    assert_int_equal(st_expect(f, "odd \"name\"\n\xc3\xa9", ST_U8, 1, (int64_t[]){1}, &p, &err), 0);

    const st_tensor *t = st_find(f, "empty2");
    assert_non_null(t);
    assert_int_equal(t->nbytes, 0);
    assert_int_equal(t->ndim, 1);
    assert_int_equal(t->shape[0], 0);
    t = st_find(f, "scalar");
    assert_int_equal(t->ndim, 0);
    assert_int_equal(t->nbytes, 8);
    assert_null(st_find(f, "nope"));

    /* tensors come in data order: descending element size, each aligned to its element size,
     * contiguous */
    const unsigned char *expect_next = st_tensor_at(f, 0)->data;
    size_t last_size = 8;
    for (int i = 0; i < st_count(f); i++) {
        t = st_tensor_at(f, i);
        size_t es = st_dtype_size(t->dtype);
        assert_true(es <= last_size);
        last_size = es;
        assert_int_equal((uintptr_t)t->data % es, 0);
        assert_ptr_equal(t->data, expect_next);
        expect_next = (const unsigned char *)t->data + t->nbytes;
        assert_ptr_equal(st_find(f, t->name), t);
    }
    /* the order added is kept within one element size */
    assert_string_equal(st_tensor_at(f, 0)->name, "scalar");
    assert_string_equal(st_tensor_at(f, 1)->name, "steps");
    assert_string_equal(st_tensor_at(f, 2)->name, "layer.0.w");
    st_close(f);
}

static void test_save_is_deterministic_and_resavable(void **state) {
    (void)state;
    float a[3] = {1, 2, 3};
    uint16_t b[2] = {7, 8};
    st_writer *w = st_writer_new();
    st_writer_add(w, "b", ST_F16, 1, (int64_t[]){2}, b);
    st_writer_add(w, "a", ST_F32, 1, (int64_t[]){3}, a);
    st_writer_meta(w, "k", "v");
    char p1[256], p2[256];
    err_t err;
    assert_int_equal(st_writer_save(w, in_dir("d1.safetensors", p1, sizeof p1), 0, &err), 0);
    assert_int_equal(st_writer_save(w, in_dir("d2.safetensors", p2, sizeof p2), 0, &err), 0);
    size_t l1, l2;
    unsigned char *b1 = read_bytes(p1, &l1), *b2 = read_bytes(p2, &l2);
    assert_int_equal(l1, l2);
    assert_memory_equal(b1, b2, l1);
    free(b1);
    free(b2);
    /* saving again over the same path replaces the file */
    a[0] = 42;
    assert_int_equal(st_writer_save(w, p1, 0, &err), 0);
    st_writer_free(w);
    st_file *f = open_ok(p1);
    const void *d;
    assert_int_equal(st_expect(f, "a", ST_F32, 1, (int64_t[]){3}, &d, &err), 0);
    assert_true(((const float *)d)[0] == 42);
    st_close(f);
}

static void test_no_tensors(void **state) {
    (void)state;
    st_writer *w = st_writer_new();
    char path[256];
    err_t err;
    assert_int_equal(st_writer_save(w, in_dir("none.safetensors", path, sizeof path), 0, &err), 0);
    st_writer_free(w);
    st_file *f = open_ok(path);
    assert_int_equal(st_count(f), 0);
    assert_null(st_find(f, "x"));
    assert_string_equal(st_meta(f, ST_CRC_KEY), "00000000");
    st_close(f);
}

/* A file as other writers make it: no checksum, tensors listed out of offset order, header not
 * padded; and the reference implementation's own example file. */
static void test_foreign_files(void **state) {
    (void)state;
    st_file *f = open_ok(file_with("{'b': {'dtype': 'F32', 'shape': [2], 'data_offsets': [4, 12]},"
                                   " 'a': {'dtype': 'U8', 'shape': [4], 'data_offsets': [0, 4],"
                                   " 'extra': 'ignored'}}",
                                   12));
    assert_int_equal(st_count(f), 2);
    assert_string_equal(st_tensor_at(f, 0)->name, "a");
    assert_string_equal(st_tensor_at(f, 1)->name, "b");
    assert_null(st_meta(f, ST_CRC_KEY));
    const unsigned char *a = st_find(f, "a")->data;
    assert_int_equal(a[0], 1);
    assert_int_equal(a[3], 22);
    st_close(f);

    static const char example[] = "<\0\0\0\0\0\0\0{\"test\":{\"dtype\":\"I32\",\"shape\":[2,2],"
                                  "\"data_offsets\":[0,16]}}"
                                  "\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0";
    char path[256];
    write_bytes(in_dir("example.safetensors", path, sizeof path), example, sizeof example - 1);
    f = open_ok(path);
    err_t err;
    const void *d;
    if (st_expect(f, "test", ST_I32, 2, (int64_t[]){2, 2}, &d, &err) != 0) fail_msg("%s", err.msg);
    assert_int_equal(((const int32_t *)d)[3], 0);
    st_close(f);
}

static void test_padded_header(void **state) {
    (void)state;
    /* padded with spaces (as writers align the header), with whitespace inside too */
    st_file *f = open_ok(file_with("{ '__metadata__' : {'x': 'y'},\n 'a': {'dtype': 'I16', "
                                   "'shape': [3], 'data_offsets': [0, 6]} }            ",
                                   6));
    assert_int_equal(st_count(f), 1);
    assert_string_equal(st_meta(f, "x"), "y");
    st_close(f);
}

static void test_parse_from_memory(void **state) {
    (void)state;
    static const char buf[] = "\x38\0\0\0\0\0\0\0{\"a\":{\"dtype\":\"U8\",\"shape\":[2],"
                              "\"data_offsets\":[0,2]}}   xy";
    st_file *f = NULL;
    err_t err;
    if (st_parse(&f, buf, sizeof buf - 1, "mem", &err) != 0) fail_msg("%s", err.msg);
    assert_string_equal(st_label(f), "mem");
    assert_memory_equal(st_find(f, "a")->data, "xy", 2);
    assert_ptr_equal(st_find(f, "a")->data, buf + 8 + 0x38);
    st_close(f);
    assert_int_equal(st_parse(&f, buf, 20, "mem", &err), -1);
    assert_null(f);
    assert_non_null(strstr(err.msg, "mem: header size 56 bytes is larger than the 12 bytes"));
}

/* ---- st_expect ----------------------------------------------------------------------------- */

static void expect_fails(const st_file *f, const char *name, st_dtype dtype, int ndim,
                         const int64_t *shape, const char *needle) {
    err_t err;
    const void *d = (const void *)1;
    int rc = st_expect(f, name, dtype, ndim, shape, &d, &err);
    if (rc != -1 || d != NULL || !strstr(err.msg, needle) ||
        strncmp(err.msg, st_label(f), strlen(st_label(f))) != 0)
        fail_msg("rc %d, message \"%s\"; wanted -1 and \"%s\"", rc, err.msg, needle);
}

static void test_expect_errors(void **state) {
    (void)state;
    float w[6] = {0};
    st_writer *wr = st_writer_new();
    st_writer_add(wr, "w", ST_F32, 2, (int64_t[]){2, 3}, w);
    char path[256];
    err_t err;
    assert_int_equal(st_writer_save(wr, in_dir("e.safetensors", path, sizeof path), 0, &err), 0);
    st_writer_free(wr);
    st_file *f = open_ok(path);
    expect_fails(f, "v", ST_F32, 2, (int64_t[]){2, 3}, "tensor 'v' not found");
    expect_fails(f, "w", ST_BF16, 2, (int64_t[]){2, 3},
                 "tensor 'w': expected BF16 [2, 3], found F32 [2, 3]");
    expect_fails(f, "w", ST_F32, 2, (int64_t[]){3, 2},
                 "tensor 'w': expected F32 [3, 2], found F32 [2, 3]");
    expect_fails(f, "w", ST_F32, 1, (int64_t[]){6}, "expected F32 [6], found F32 [2, 3]");
    expect_fails(f, "w", ST_F32, 0, NULL, "expected F32 [], found F32 [2, 3]");
    st_close(f);
}

/* ---- corrupt files ------------------------------------------------------------------------- */

#define T_A(dtype, shape, offs)                                                                    \
    "'a': {'dtype': '" dtype "', 'shape': " shape ", 'data_offsets': " offs "}"
#define A_OK T_A("F32", "[2]", "[0, 8]")

static void test_bad_sizes(void **state) {
    (void)state;
    char path[256];
    write_bytes(in_dir("short.safetensors", path, sizeof path), "abc", 3);
    expect_open_error(path, "the file is 3 bytes, shorter than the 8-byte header size", NULL);
    write_bytes(path, "", 0);
    expect_open_error(path, "the file is 0 bytes", NULL);
    expect_open_error(file_with_size("{}", 200000000, NULL, 0),
                      "header size 200000000 bytes is larger than the limit", NULL);
    expect_open_error(file_with_size("{}", UINT64_MAX - 1, NULL, 0),
                      "header size 18446744073709551614 bytes", NULL);
    expect_open_error(file_with_size("{" A_OK "}", 1000, NULL, 8),
                      "header size 1000 bytes is larger than the", "bytes after the size field");
    expect_open_error(file_with_size("", 0, NULL, 0), "header: the document is empty", NULL);
}

static void test_bad_json(void **state) {
    (void)state;
    expect_bad("{'a': {'dtype': 'F32',,}}", 0, "header:1:24: JSON syntax error", NULL);
    expect_bad("[1, 2]", 0, "the header is not a JSON object (got an array of 2 items)", NULL);
    expect_bad("{} x", 0, "JSON syntax error", "content after the end");
    expect_bad("{'\xff': 1}", 0, "not valid UTF-8 (byte 2 of the header)", NULL);
    expect_bad("{'\xc0\x80': 1}", 0, "not valid UTF-8", NULL);     /* overlong NUL */
    expect_bad("{'\xed\xa0\x80': 1}", 0, "not valid UTF-8", NULL); /* surrogate */
}

static void test_bad_entries(void **state) {
    (void)state;
    expect_bad("{'a': [1]}", 0, "tensor 'a': expected an object with dtype, shape", NULL);
    expect_bad("{'a': {'shape': [2], 'data_offsets': [0, 8]}}", 8,
               "tensor 'a': missing field 'dtype'", NULL);
    expect_bad("{'a': {'dtype': 'F32', 'data_offsets': [0, 8]}}", 8,
               "tensor 'a': missing field 'shape'", NULL);
    expect_bad("{'a': {'dtype': 'F32', 'shape': [2]}}", 8,
               "tensor 'a': missing field 'data_offsets'", NULL);
    expect_bad("{'a': {'dtype': 'F32', 'dtype': 'F32', 'shape': [2], 'data_offsets': [0, 8]}}", 8,
               "header: a: field 'dtype' appears twice", NULL);
    expect_bad("{" T_A("F12", "[2]", "[0, 8]") "}", 8,
               "tensor 'a': unknown or unsupported dtype \"F12\"", "known: BOOL, U8");
    expect_bad("{'a': {'dtype': 4, 'shape': [2], 'data_offsets': [0, 8]}}", 8,
               "tensor 'a': dtype: expected a string, got 4", NULL);
    expect_bad("{" T_A("F32", "2", "[0, 8]") "}", 8,
               "tensor 'a': shape: expected an array of non-negative integers, got 2", NULL);
    expect_bad("{" T_A("F32", "[2, -2]", "[0, 8]") "}", 8,
               "tensor 'a': shape[1]: expected a non-negative integer, got -2", NULL);
    expect_bad("{" T_A("F32", "[1.5]", "[0, 8]") "}", 8,
               "shape[0]: expected a non-negative integer, got 1.5", NULL);
    expect_bad("{" T_A("F32", "['2']", "[0, 8]") "}", 8,
               "shape[0]: expected a non-negative integer, got a string", NULL);
    expect_bad("{" T_A("F32", "[1, 1, 1, 1, 1, 1, 1, 1, 2]", "[0, 8]") "}", 8,
               "tensor 'a': shape has 9 dimensions, at most 8", NULL);
    expect_bad("{" T_A("F32", "[4294967296, 4294967296, 4294967296]", "[0, 8]") "}", 8,
               "tensor 'a': shape [4294967296, 4294967296, 4294967296] of F32 overflows", NULL);
    expect_bad("{" T_A("F32", "[100000000000000000]", "[0, 8]") "}", 8,
               "shape[0]: expected a non-negative integer", NULL);
    expect_bad("{" T_A("F32", "[2]", "[0, 8, 16]") "}", 8,
               "tensor 'a': data_offsets: expected an array of two integers [begin, end], got an "
               "array of 3 items",
               NULL);
    expect_bad("{" T_A("F32", "[2]", "{}") "}", 8,
               "data_offsets: expected an array of two integers", "got an object");
    expect_bad("{" T_A("F32", "[2]", "[0, null]") "}", 8,
               "tensor 'a': data_offsets[1]: expected a non-negative integer, got null", NULL);
    expect_bad("{" T_A("F32", "[0]", "[8, 0]") "}", 8,
               "tensor 'a': data_offsets [8, 0]: begin is after end", NULL);
    expect_bad("{" T_A("F32", "[4]", "[0, 16]") "}", 8,
               "tensor 'a': data_offsets [0, 16]: end is beyond the data buffer (8 bytes)", NULL);
    expect_bad("{" T_A("F32", "[4]", "[0, 8]") "}", 8,
               "tensor 'a': data_offsets [0, 8] hold 8 bytes, but shape [4] of F32 needs 16 bytes",
               NULL);
}

static void test_bad_layout(void **state) {
    (void)state;
    expect_bad("{" A_OK ", " A_OK "}", 8, "header: field 'a' appears twice", NULL);
    expect_bad("{" A_OK ", 'b': {'dtype': 'U8', 'shape': [4], 'data_offsets': [4, 8]}}", 8,
               "tensors 'a' [0, 8] and 'b' [4, 8] overlap", NULL);
    expect_bad("{" A_OK ", 'b': {'dtype': 'U8', 'shape': [0], 'data_offsets': [4, 4]}}", 8,
               "overlap", NULL);
    expect_bad("{" A_OK ", 'b': {'dtype': 'U8', 'shape': [4], 'data_offsets': [12, 16]}}", 16,
               "gap of 4 bytes between tensors 'a' [0, 8] and 'b' [12, 16]", NULL);
    expect_bad("{" T_A("F32", "[2]", "[4, 12]") "}", 12,
               "gap of 4 bytes at the start of the data buffer, before tensor 'a' [4, 12]", NULL);
    expect_bad("{" A_OK "}", 11, "3 bytes of the data buffer (11 bytes) follow the last tensor 'a'",
               NULL);
    expect_bad("{}", 5, "the data buffer holds 5 bytes, but the header lists no tensors", NULL);
    /* empty tensors: anywhere on a boundary is fine */
    st_file *f = open_ok(file_with("{" A_OK ", 'e': {'dtype': 'F64', 'shape': [0, 3], "
                                   "'data_offsets': [8, 8]}, 'z': {'dtype': 'I8', 'shape': [0],"
                                   " 'data_offsets': [0, 0]}}",
                                   8));
    assert_int_equal(st_count(f), 3);
    assert_string_equal(st_tensor_at(f, 0)->name, "z");
    assert_string_equal(st_tensor_at(f, 2)->name, "e");
    st_close(f);
}

static void test_bad_metadata(void **state) {
    (void)state;
    expect_bad("{'__metadata__': [], " A_OK "}", 8,
               "__metadata__: expected an object of strings, got an array", NULL);
    expect_bad("{'__metadata__': {'k': 3}, " A_OK "}", 8,
               "__metadata__: 'k': expected a string, got 3", NULL);
    expect_bad("{'__metadata__': {'k': 'a', 'k': 'b'}, " A_OK "}", 8,
               "header: __metadata__: field 'k' appears twice", NULL);
    expect_bad("{'__metadata__': {}, '__metadata__': {}, " A_OK "}", 8,
               "header: field '__metadata__' appears twice", NULL);
    expect_bad("{'__metadata__': {'cephalo.crc32': 'xyz'}, " A_OK "}", 8,
               "'cephalo.crc32': expected 8 hex digits, got \"xyz\"", NULL);
}

static void test_crc_catches_flipped_byte(void **state) {
    (void)state;
    float w[256];
    for (int i = 0; i < 256; i++)
        w[i] = (float)i;
    st_writer *wr = st_writer_new();
    st_writer_add(wr, "w", ST_F32, 2, (int64_t[]){16, 16}, w);
    char path[256];
    err_t err;
    assert_int_equal(st_writer_save(wr, in_dir("crc.safetensors", path, sizeof path), 0, &err), 0);
    st_writer_free(wr);
    st_close(open_ok(path));

    size_t len;
    unsigned char *bytes = read_bytes(path, &len);
    char want[16];
    snprintf(want, sizeof want, "%08x", (unsigned)st_crc32(0, bytes + len - 1024, 1024));
    bytes[len - 500] ^= 0x10;
    char have[16];
    snprintf(have, sizeof have, "%08x", (unsigned)st_crc32(0, bytes + len - 1024, 1024));
    write_bytes(path, bytes, len);
    free(bytes);
    char needle[128];
    snprintf(needle, sizeof needle, "the header's cephalo.crc32 is %s, the data buffer's is %s",
             want, have);
    expect_open_error(path, "data checksum mismatch", needle);
}

static void test_open_errors(void **state) {
    (void)state;
    char path[256];
    expect_open_error(in_dir("absent.safetensors", path, sizeof path), "cannot open",
                      "No such file or directory");
    expect_open_error(dir, "is a directory, expected a file", NULL);
    expect_open_error("/dev/null", "not a regular file", NULL);
}

/* ---- writer mistakes and the atomic save --------------------------------------------------- */

static void expect_save_error(st_writer *w, const char *path, const char *needle) {
    err_t err;
    memset(&err, 0, sizeof err);
    int rc = st_writer_save(w, path, 0, &err);
    if (rc != -1 || !strstr(err.msg, needle) || strncmp(err.msg, path, strlen(path)) != 0)
        fail_msg("rc %d, message \"%s\"; wanted -1 and \"%s\"", rc, err.msg, needle);
    assert_int_equal(temp_files(), 0);
}

static void test_writer_mistakes(void **state) {
    (void)state;
    char path[256];
    in_dir("never.safetensors", path, sizeof path);
    float x[4] = {0};

    st_writer *w = st_writer_new();
    st_writer_add(w, "x", ST_F32, 1, (int64_t[]){4}, x);
    st_writer_add(w, "x", ST_F32, 1, (int64_t[]){4}, x);
    expect_save_error(w, path, "tensor 'x' was added twice");
    st_writer_free(w);

    w = st_writer_new();
    st_writer_add(w, "x", ST_F32, 2, (int64_t[]){4, -1}, x);
    expect_save_error(w, path, "tensor 'x': dimension 1 is negative (-1)");
    st_writer_free(w);

    w = st_writer_new();
    st_writer_add(w, "x", ST_F32, 9, (int64_t[]){1, 1, 1, 1, 1, 1, 1, 1, 1}, x);
    expect_save_error(w, path, "tensor 'x': 9 dimensions, expected 0 to 8");
    st_writer_free(w);

    w = st_writer_new();
    st_writer_add(w, "x", ST_F32, 1, (int64_t[]){4}, NULL);
    expect_save_error(w, path, "tensor 'x': no data given for 16 bytes");
    st_writer_free(w);

    w = st_writer_new();
    st_writer_add(w, "x", ST_F32, 3, (int64_t[]){INT64_MAX, INT64_MAX, 2}, x);
    expect_save_error(w, path, "the size of the tensor overflows");
    st_writer_free(w);

    w = st_writer_new();
    st_writer_add(w, "__metadata__", ST_F32, 1, (int64_t[]){4}, x);
    expect_save_error(w, path, "may not be named '__metadata__'");
    st_writer_free(w);

    w = st_writer_new();
    st_writer_add(w, "bad\xff", ST_F32, 1, (int64_t[]){4}, x);
    expect_save_error(w, path, "not valid UTF-8");
    st_writer_free(w);

    w = st_writer_new();
    st_writer_meta(w, ST_CRC_KEY, "00000000");
    expect_save_error(w, path, "'cephalo.crc32' is reserved");
    st_writer_free(w);

    w = st_writer_new();
    st_writer_meta(w, "k", "1");
    st_writer_meta(w, "k", "2");
    expect_save_error(w, path, "metadata key 'k' was given twice");
    st_writer_free(w);

    assert_int_equal(access(path, F_OK), -1);
}

/* Saves a one-tensor file holding `value` at path. */
static void save_value(const char *path, float value) {
    st_writer *w = st_writer_new();
    st_writer_add(w, "v", ST_F32, 0, NULL, &value);
    err_t err;
    if (st_writer_save(w, path, 0, &err) != 0) fail_msg("%s", err.msg);
    st_writer_free(w);
}

static void assert_value(const char *path, float value) {
    st_file *f = open_ok(path);
    const void *d;
    err_t err;
    if (st_expect(f, "v", ST_F32, 0, NULL, &d, &err) != 0) fail_msg("%s", err.msg);
    assert_true(*(const float *)d == value);
    st_close(f);
}

static void test_save_into_missing_directory(void **state) {
    (void)state;
    char path[256];
    in_dir("no/such/dir/x.safetensors", path, sizeof path);
    st_writer *w = st_writer_new();
    float v = 1;
    st_writer_add(w, "v", ST_F32, 0, NULL, &v);
    expect_save_error(w, path, "No such file or directory");
    st_writer_free(w);
}

/* A save that fails half-way through writing (the file size limit stands in for a full disk)
 * leaves the previous file as it was and removes its temporary file. */
static void test_failed_write_keeps_old_file(void **state) {
    (void)state;
    char path[256];
    in_dir("keep.safetensors", path, sizeof path);
    save_value(path, 7);

    size_t n = 1 << 20;
    float *big = calloc(n, sizeof *big);
    assert_non_null(big);
    st_writer *w = st_writer_new();
    st_writer_add(w, "v", ST_F32, 1, (int64_t[]){(int64_t)n}, big);

    struct rlimit old;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    struct rlimit small = old;
    small.rlim_cur = 64 << 10;
    void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &small), 0);
    err_t err;
    int rc = st_writer_save(w, path, 0, &err);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, old_handler);

    st_writer_free(w);
    free(big);
    if (rc != -1 || !strstr(err.msg, "cannot save: writing the temporary file") ||
        !strstr(err.msg, "File too large") || strncmp(err.msg, path, strlen(path)) != 0)
        fail_msg("rc %d, message \"%s\"", rc, err.msg);
    assert_int_equal(temp_files(), 0);
    assert_value(path, 7);
}

/* A directory is in the way: refused before a temporary is written (common/fileio.h), and the
 * directory is left as it is. */
static void test_failed_rename(void **state) {
    (void)state;
    char path[256], inner[300];
    in_dir("adir", path, sizeof path);
    assert_int_equal(mkdir(path, 0755), 0);
    snprintf(inner, sizeof inner, "%s/f", path);
    write_bytes(inner, "x", 1);
    st_writer *w = st_writer_new();
    float v = 1;
    st_writer_add(w, "v", ST_F32, 0, NULL, &v);
    expect_save_error(w, path, "is a directory, expected a file");
    st_writer_free(w);
    assert_int_equal(access(inner, F_OK), 0);
}

/* Not writable directory: only meaningful when not root (root writes anyway). */
static void test_read_only_directory(void **state) {
    (void)state;
    if (geteuid() == 0) skip();
    char sub[256], path[300];
    in_dir("ro", sub, sizeof sub);
    assert_int_equal(mkdir(sub, 0755), 0);
    snprintf(path, sizeof path, "%s/x.safetensors", sub);
    save_value(path, 3);
    assert_int_equal(chmod(sub, 0555), 0);
    st_writer *w = st_writer_new();
    float v = 4;
    st_writer_add(w, "v", ST_F32, 0, NULL, &v);
    err_t err;
    int rc = st_writer_save(w, path, 0, &err);
    st_writer_free(w);
    chmod(sub, 0755);
    if (rc != -1 || !strstr(err.msg, "Permission denied")) fail_msg("rc %d: %s", rc, err.msg);
    assert_value(path, 3);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc32),
        cmocka_unit_test(test_dtypes),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_save_is_deterministic_and_resavable),
        cmocka_unit_test(test_no_tensors),
        cmocka_unit_test(test_foreign_files),
        cmocka_unit_test(test_padded_header),
        cmocka_unit_test(test_parse_from_memory),
        cmocka_unit_test(test_expect_errors),
        cmocka_unit_test(test_bad_sizes),
        cmocka_unit_test(test_bad_json),
        cmocka_unit_test(test_bad_entries),
        cmocka_unit_test(test_bad_layout),
        cmocka_unit_test(test_bad_metadata),
        cmocka_unit_test(test_crc_catches_flipped_byte),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_writer_mistakes),
        cmocka_unit_test(test_save_into_missing_directory),
        cmocka_unit_test(test_failed_write_keeps_old_file),
        cmocka_unit_test(test_failed_rename),
        cmocka_unit_test(test_read_only_directory),
    };
    return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
