/* test_data.c - worker/formats/data.c: llm.c token shards and their validation, the token dataset (spec
 * expansion, vocabulary checks, the per-epoch sample order, CLM and MLM targets), CIMG image files
 * and their validation, synthetic token and image sources. Files are written under a fresh
 * temporary directory. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "formats/data.h"

static char dir[64];
static char pathbuf[8][256];
static int pathnext;

/* A path under the test directory (a few stay valid at once). */
static const char *P(const char *name) {
    char *p = pathbuf[pathnext++ % 8];
    snprintf(p, 256, "%s/%s", dir, name);
    return p;
}

static int setup(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/test_data.XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void write_raw(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (n) assert_int_equal(fwrite(p, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static long file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

#define assert_msg_has(err, needle)                                                                \
    do {                                                                                           \
        if (!strstr((err).msg, (needle))) fail_msg("message '%s' lacks '%s'", (err).msg, (needle)); \
    } while (0)

/* A shard of n tokens, token i = (base + i) % mod. */
static void make_shard(const char *path, int64_t n, int base, int mod) {
    uint16_t *t = malloc(sizeof *t * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) t[i] = (uint16_t)((base + i) % mod);
    err_t err = {{0}};
    if (data_shard_write(path, t, n, &err) < 0) fail_msg("%s", err.msg);
    free(t);
}

/* Raw shard bytes with the given header fields and n tokens. */
static uint8_t *raw_shard(int32_t magic, int32_t version, int32_t count, int n, size_t *len) {
    *len = 1024 + 2 * (size_t)n;
    uint8_t *b = calloc(1, *len);
    int32_t h[3] = {magic, version, count};
    memcpy(b, h, sizeof h); /* the tests run little-endian */
    for (int i = 0; i < n; i++) b[1024 + 2 * i] = (uint8_t)i;
    return b;
}

static void expect_open_error(const char *spec, int seq, int vocab, data_task task, const char *n1, const char *n2) {
    data_source *ds = (data_source *)1;
    err_t err = {{0}};
    assert_int_equal(data_open_tokens(&ds, spec, DATA_TRAIN, seq, vocab, task, 1, &err), -1);
    assert_null(ds);
    assert_msg_has(err, n1);
    if (n2) assert_msg_has(err, n2);
}

/* ---- shards ---- */

static void test_shard_roundtrip(void **state) {
    (void)state;
    const char *p = P("rt.bin");
    uint16_t t[37];
    for (int i = 0; i < 37; i++) t[i] = (uint16_t)(i * 1777 % 65536);
    err_t err = {{0}};
    assert_int_equal(data_shard_write(p, t, 37, &err), 0);
    assert_int_equal(file_size(p), 1024 + 2 * 37);
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    assert_int_equal(access(tmp, F_OK), -1); /* renamed into place */
    /* header bytes as llm.c writes them */
    FILE *f = fopen(p, "rb");
    int32_t h[256];
    uint16_t back[37];
    assert_int_equal(fread(h, 4, 256, f), 256);
    assert_int_equal(fread(back, 2, 37, f), 37);
    fclose(f);
    assert_int_equal(h[0], 20240520);
    assert_int_equal(h[1], 1);
    assert_int_equal(h[2], 37);
    for (int i = 3; i < 256; i++) assert_int_equal(h[i], 0);
    assert_memory_equal(back, t, sizeof t);

    /* read back through the dataset: seq 4 -> windows at 0, 4, ..., 32 (9 windows) */
    data_source *ds;
    assert_int_equal(data_open_tokens(&ds, p, DATA_TRAIN, 4, 65536, DATA_CLM, 5, &err), 0);
    assert_int_equal(data_num_samples(ds), 9);
    assert_false(data_is_images(ds));
    for (int64_t s = 0; s < 9; s++) {
        int32_t in[4], tg[4];
        assert_int_equal(data_get_tokens(ds, s, in, tg, &err), 0);
        int64_t w = data_sample_index(ds, s);
        for (int i = 0; i < 4; i++) {
            assert_int_equal(in[i], t[4 * w + i]);
            assert_int_equal(tg[i], t[4 * w + i + 1]);
        }
    }
    data_close(ds);

    /* empty shards are valid files */
    assert_int_equal(data_shard_write(P("empty.bin"), NULL, 0, &err), 0);
    assert_int_equal(file_size(P("empty.bin")), 1024);
}

/* Loss masks: written beside the shard (header, one byte a token), applied to targets (the mask
 * of token t+1 decides target t), counted per sample; a source mixing masked and unmasked
 * shards, a mask of the wrong length, a byte other than 0/1 and MLM with masks are errors. */
static void test_loss_mask(void **state) {
    (void)state;
    err_t err = {{0}};
    enum { N = 41 };
    uint32_t t[N];
    uint8_t m[N];
    for (int i = 0; i < N; i++) t[i] = (uint32_t)(i * 7 % 50), m[i] = (uint8_t)(i % 3 == 1 || i % 5 == 0);
    const char *p = P("sft_000000.bin");
    data_shard_writer *w = data_shard_writer_open(p, &err);
    assert_non_null(w);
    assert_int_equal(data_shard_writer_enable_mask(w, &err), 0);
    assert_int_equal(data_shard_writer_add32_masked(w, t, m, 20, &err), 0);
    assert_int_equal(data_shard_writer_add32_masked(w, t + 20, m + 20, N - 20, &err), 0);
    assert_int_equal(data_shard_writer_close(w, &err), 0);
    char mp[300];
    assert_int_equal(data_mask_path(p, mp, sizeof mp, &err), 0);
    assert_string_equal(mp + strlen(mp) - 16, "/sft_000000.mask");
    assert_int_equal(file_size(mp), 1024 + N);
    FILE *f = fopen(mp, "rb");
    int32_t h[256];
    uint8_t back[N];
    assert_int_equal(fread(h, 4, 256, f), 256);
    assert_int_equal(fread(back, 1, N, f), N);
    fclose(f);
    assert_int_equal(h[0], DATA_MASK_MAGIC);
    assert_int_equal(h[1], DATA_MASK_VERSION);
    assert_int_equal(h[2], N);
    assert_memory_equal(back, m, N);

    data_source *ds;
    assert_int_equal(data_open_tokens(&ds, p, DATA_TRAIN, 4, 64, DATA_CLM, 3, &err), 0);
    assert_true(data_has_loss_mask(ds));
    assert_int_equal(data_num_samples(ds), 10);
    for (int64_t s = 0; s < 10; s++) {
        int32_t in[4], tg[4];
        int64_t cnt, want = 0;
        assert_int_equal(data_get_tokens(ds, s, in, tg, &err), 0);
        assert_int_equal(data_sample_targets(ds, s, &cnt, &err), 0);
        int64_t w0 = 4 * data_sample_index(ds, s);
        for (int i = 0; i < 4; i++) {
            assert_int_equal(in[i], (int32_t)t[w0 + i]); /* inputs are never masked */
            assert_int_equal(tg[i], m[w0 + i + 1] ? (int32_t)t[w0 + i + 1] : -1);
            want += m[w0 + i + 1];
        }
        assert_int_equal(cnt, want);
    }
    data_close(ds);
    expect_open_error(p, 4, 64, DATA_MLM, "sft_000000.mask", "MLM");
    /* the same shard written again without a mask: the old mask goes */
    make_shard(P("again.bin"), 30, 0, 50);
    w = data_shard_writer_open(P("again.bin"), &err);
    assert_int_equal(data_shard_writer_enable_mask(w, &err), 0);
    assert_int_equal(data_shard_writer_add32_masked(w, t, m, 30, &err), 0);
    assert_int_equal(data_shard_writer_close(w, &err), 0);
    assert_int_equal(file_size(P("again.mask")), 1024 + 30);
    make_shard(P("again.bin"), 30, 0, 50);
    assert_int_equal(access(P("again.mask"), F_OK), -1);

    /* mixed: a plain shard beside a masked one */
    make_shard(P("plain.bin"), 30, 0, 50);
    char spec[700];
    snprintf(spec, sizeof spec, "%s,%s", p, P("plain.bin"));
    expect_open_error(spec, 4, 64, DATA_CLM, "has a loss mask", "plain.bin has none");
    /* a mask of another length than its shard */
    make_shard(P("short.bin"), 30, 0, 50);
    uint8_t hdr[1024 + 29] = {0};
    int32_t hh[3] = {DATA_MASK_MAGIC, DATA_MASK_VERSION, 29};
    memcpy(hdr, hh, sizeof hh);
    write_raw(P("short.mask"), hdr, sizeof hdr);
    expect_open_error(P("short.bin"), 4, 64, DATA_CLM, "short.mask", "has 30 tokens");
    /* a byte other than 0 or 1: an error when read */
    make_shard(P("two.bin"), 30, 0, 50);
    uint8_t two[1024 + 30] = {0};
    hh[2] = 30;
    memcpy(two, hh, sizeof hh);
    memset(two + 1024, 2, 30);
    write_raw(P("two.mask"), two, sizeof two);
    assert_int_equal(data_open_tokens(&ds, P("two.bin"), DATA_TRAIN, 4, 64, DATA_CLM, 3, &err), 0);
    int32_t in[4], tg[4];
    assert_int_equal(data_get_tokens(ds, 0, in, tg, &err), -1);
    assert_msg_has(err, "two.mask: entry");
    data_close(ds);
}

/* The tokenizer's identity in header slots 3..7: written, read back, and checked against the
 * model's vocabulary and the other shards when the data is opened; llm.c's zeros read as
 * unknown; a marker with a bad identity is an error naming the file. */
static void test_shard_tokenizer(void **state) {
    (void)state;
    err_t err = {{0}};
    const tok_id bpe = {TOKID_BYTE_BPE, 300, 0x0123456789abcdefull}, other = {TOKID_BYTE_BPE, 300, 0x42};
    const char *paths[] = {P("tk_a.bin"), P("tk_b.bin"), P("tk_c.bin")};
    const tok_id ids[] = {bpe, other, tok_id_bytes()};
    uint16_t t[40];
    for (int i = 0; i < 40; i++) t[i] = (uint16_t)(i * 7 % 256);
    for (int k = 0; k < 3; k++) {
        data_shard_writer *w = data_shard_writer_open(paths[k], &err);
        assert_non_null(w);
        data_shard_writer_set_tokenizer(w, ids[k]);
        assert_int_equal(data_shard_writer_add(w, t, 40, &err), 0);
        assert_int_equal(data_shard_writer_close(w, &err), 0);
    }
    /* the header as bytes: llm.c's three fields, then the marker and the identity */
    FILE *f = fopen(paths[0], "rb");
    uint32_t h[256];
    assert_int_equal(fread(h, 4, 256, f), 256);
    fclose(f);
    assert_int_equal(h[0], 20240520);
    assert_int_equal(h[1], 1);
    assert_int_equal(h[2], 40);
    assert_int_equal(h[3], 0x44494b54); /* "TKID" */
    assert_int_equal(h[4], TOKID_BYTE_BPE);
    assert_int_equal(h[5], 300);
    assert_int_equal(h[6], 0x89abcdefu);
    assert_int_equal(h[7], 0x01234567u);
    for (int i = 8; i < 256; i++) assert_int_equal(h[i], 0);
    tok_id back;
    assert_int_equal(data_shard_tokenizer(paths[0], h, &back, &err), 0);
    assert_true(tok_id_equal(back, bpe));

    /* through the dataset */
    data_source *ds;
    const char *where;
    assert_int_equal(data_open_tokens(&ds, paths[0], DATA_TRAIN, 4, 300, DATA_CLM, 1, &err), 0);
    assert_true(tok_id_equal(data_tokenizer(ds, &where), bpe));
    assert_string_equal(where, paths[0]);
    data_close(ds);
    assert_int_equal(data_open_tokens(&ds, paths[2], DATA_TRAIN, 4, 256, DATA_CLM, 1, &err), 0);
    assert_true(tok_id_equal(data_tokenizer(ds, NULL), tok_id_bytes()));
    data_close(ds);

    /* a vocabulary larger than the model's is refused at open, before any token is read */
    assert_int_equal(data_open_tokens(&ds, paths[0], DATA_TRAIN, 4, 299, DATA_CLM, 1, &err), -1);
    assert_msg_has(err, "tk_a.bin: written with tokenizer bpe-300-0123456789abcdef (vocabulary 300), larger than "
                        "the model's vocabulary 299");
    /* two tokenizers in one run */
    char spec[600];
    snprintf(spec, sizeof spec, "%s,%s", paths[0], paths[1]);
    assert_int_equal(data_open_tokens(&ds, spec, DATA_TRAIN, 4, 300, DATA_CLM, 1, &err), -1);
    assert_msg_has(err, "tk_b.bin: written with tokenizer bpe-300-0000000000000042, but ");
    assert_msg_has(err, "tk_a.bin with bpe-300-0123456789abcdef");

    /* llm.c's shards (zeros) are unknown, and mix with any */
    make_shard(P("llmc.bin"), 40, 0, 256);
    snprintf(spec, sizeof spec, "%s,%s", P("llmc.bin"), paths[0]);
    assert_int_equal(data_open_tokens(&ds, spec, DATA_TRAIN, 4, 300, DATA_CLM, 1, &err), 0);
    assert_true(tok_id_equal(data_tokenizer(ds, &where), bpe));
    assert_string_equal(where, paths[0]);
    data_close(ds);
    assert_int_equal(data_open_tokens(&ds, P("llmc.bin"), DATA_TRAIN, 4, 300, DATA_CLM, 1, &err), 0);
    assert_int_equal(data_tokenizer(ds, NULL).kind, TOKID_UNKNOWN);
    data_close(ds);

    /* the marker with a bad identity */
    h[4] = 9;
    assert_int_equal(data_shard_tokenizer("x.bin", h, &back, &err), -1);
    assert_msg_has(err, "x.bin: header slots 3..7 carry the tokenizer marker but kind 9");
    h[4] = TOKID_BYTES, h[5] = 300;
    assert_int_equal(data_shard_tokenizer("x.bin", h, &back, &err), -1);
}

/* Version 2 shards: uint32 tokens, for vocabularies above 65536 (llm.c's Llama-3 shards). */
static void test_shard_u32(void **state) {
    (void)state;
    const char *p = P("u32.bin");
    uint32_t t[21];
    for (int i = 0; i < 21; i++) t[i] = (uint32_t)(i * 6151 % 128256);
    err_t err = {{0}};
    data_shard_writer *w = data_shard_writer_open_version(p, DATA_SHARD_VERSION_U32, &err);
    assert_non_null(w);
    assert_int_equal(data_shard_writer_add32(w, t, 21, &err), 0);
    assert_int_equal(data_shard_writer_close(w, &err), 0);
    assert_int_equal(file_size(p), 1024 + 4 * 21);
    FILE *f = fopen(p, "rb");
    int32_t h[256];
    uint32_t back[21];
    assert_int_equal(fread(h, 4, 256, f), 256);
    assert_int_equal(fread(back, 4, 21, f), 21);
    fclose(f);
    assert_int_equal(h[0], 20240520);
    assert_int_equal(h[1], 2);
    assert_int_equal(h[2], 21);
    assert_memory_equal(back, t, sizeof t);

    data_source *ds;
    assert_int_equal(data_open_tokens(&ds, p, DATA_TRAIN, 4, 128256, DATA_CLM, 5, &err), 0);
    assert_int_equal(data_num_samples(ds), 5);
    for (int64_t s = 0; s < 5; s++) {
        int32_t in[4], tg[4];
        assert_int_equal(data_get_tokens(ds, s, in, tg, &err), 0);
        int64_t win = data_sample_index(ds, s);
        for (int i = 0; i < 4; i++) {
            assert_int_equal(in[i], (int32_t)t[4 * win + i]);
            assert_int_equal(tg[i], (int32_t)t[4 * win + i + 1]);
        }
    }
    data_close(ds);
    /* a model with a smaller vocabulary: the token is named */
    assert_int_equal(data_open_tokens(&ds, p, DATA_TRAIN, 20, 1000, DATA_CLM, 5, &err), 0);
    int32_t in[20], tg[20];
    assert_int_equal(data_get_tokens(ds, 0, in, tg, &err), -1);
    assert_msg_has(err, "u32.bin: token 1 is 6151, not below the model's vocabulary size 1000");
    data_close(ds);

    /* uint32 tokens into a version 1 shard: only below 65536 */
    w = data_shard_writer_open(P("narrow.bin"), &err);
    assert_int_equal(data_shard_writer_add32(w, t, 3, &err), 0);
    uint32_t big = 70000;
    assert_int_equal(data_shard_writer_add32(w, &big, 1, &err), -1);
    assert_msg_has(err, "narrow.bin: token 3 is 70000, too large for a version 1 shard");
    data_shard_writer_abort(w);
    assert_null(data_shard_writer_open_version(P("v9.bin"), 9, &err));
    assert_msg_has(err, "shard version 9 (expected 1 or 2)");
    int64_t n;
    int version;
    uint8_t img[1024 + 8] = {0};
    int32_t hh[3] = {20240520, 2, 2};
    memcpy(img, hh, sizeof hh);
    assert_int_equal(data_shard_check_version("m.bin", img, sizeof img, &n, &version, &err), 0);
    assert_int_equal(n, 2);
    assert_int_equal(version, 2);
}

static void test_shard_header_errors(void **state) {
    (void)state;
    size_t len;
    uint8_t *b = raw_shard(20240520, 1, 20, 20, &len);
    err_t err = {{0}};
    int64_t n = -1;
    assert_int_equal(data_shard_check("x.bin", b, len, &n, &err), 0);
    assert_int_equal(n, 20);

    const char *p = P("hdr.bin");
    write_raw(p, b, 100); /* truncated inside the header */
    expect_open_error(p, 4, 256, DATA_CLM, p, "100 bytes, shorter than the 1024-byte header");
    write_raw(p, b, 0);
    expect_open_error(p, 4, 256, DATA_CLM, p, "0 bytes, shorter than the 1024-byte header");
    free(b);

    b = raw_shard(12345, 1, 20, 20, &len);
    write_raw(p, b, len);
    expect_open_error(p, 4, 256, DATA_CLM, "bad magic 12345", "expected 20240520");
    free(b);

    b = raw_shard(20240520, 3, 20, 20, &len);
    write_raw(p, b, len);
    expect_open_error(p, 4, 256, DATA_CLM, p, "unknown shard version 3 in the header");
    expect_open_error(p, 4, 256, DATA_CLM, "1, uint16 tokens", "2, uint32 tokens");
    free(b);

    b = raw_shard(20240520, 2, 20, 20, &len); /* version 2: 20 uint32 tokens need 1104 bytes */
    write_raw(p, b, len);
    expect_open_error(p, 4, 256, DATA_CLM, "says 20 tokens (1104 bytes with the header, version 2: 4 bytes a token)",
                      "file has 1064 bytes (room for 10 tokens)");
    write_raw(p, b, len - 1);
    expect_open_error(p, 4, 256, DATA_CLM, "file has 1063 bytes", "(room for 9 tokens and odd bytes)");
    free(b);

    b = raw_shard(20240520, 1, 60, 20, &len); /* says 60 tokens, holds 20 */
    write_raw(p, b, len);
    expect_open_error(p, 4, 256, DATA_CLM, "says 60 tokens", "file has 1064 bytes (room for 20 tokens)");
    write_raw(p, b, len - 1);
    expect_open_error(p, 4, 256, DATA_CLM, "file has 1063 bytes", "and an odd byte");
    free(b);

    b = raw_shard(20240520, 1, -3, 0, &len);
    write_raw(p, b, len);
    expect_open_error(p, 4, 256, DATA_CLM, p, "negative token count -3");
    free(b);

    /* the tokenizer marker with a kind no tokenizer has: the in-memory check refuses it as the
     * file path does (fuzz_shard found them disagreeing) */
    b = raw_shard(20240520, 1, 20, 20, &len);
    uint32_t slots[2] = {DATA_SHARD_TOKID_MARK, 22272};
    memcpy(b + 12, slots, sizeof slots);
    write_raw(p, b, len);
    expect_open_error(p, 4, 256, DATA_CLM, "carry the tokenizer marker but kind 22272", "not a tokenizer identity");
    assert_int_equal(data_shard_check("x.bin", b, len, &n, &err), -1);
    assert_msg_has(err, "x.bin: header slots 3..7 carry the tokenizer marker but kind 22272");
    free(b);

    expect_open_error(P("missing.bin"), 4, 256, DATA_CLM, "missing.bin: cannot open", NULL);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s/emptydir'", dir);
    assert_int_equal(system(cmd), 0);
    expect_open_error(P("emptydir"), 4, 256, DATA_CLM, "emptydir: no *.bin token shards", NULL);
    expect_open_error(P("nomatch_*.bin"), 4, 256, DATA_CLM, "no files match", NULL);

    /* writer errors name the file */
    assert_int_equal(data_shard_write(P("no/such/dir/x.bin"), NULL, 0, &err), -1);
    assert_msg_has(err, "no/such/dir/x.bin: cannot write: No such file or directory");
}

static void test_bad_arguments(void **state) {
    (void)state;
    make_shard(P("args.bin"), 100, 0, 200);
    expect_open_error(P("args.bin"), 0, 256, DATA_CLM, "sequence length 0", NULL);
    expect_open_error(P("args.bin"), 4, 1, DATA_CLM, "vocabulary size 1", NULL);
    expect_open_error(P("args.bin"), 4, 2, DATA_MLM, "vocabulary size 2 (expected >= 3 for mlm)", NULL);
    data_source *ds;
    err_t err = {{0}};
    assert_int_equal(data_open_tokens(&ds, P("args.bin"), DATA_TRAIN, 4, 256, DATA_CLM, 1, &err), 0);
    int32_t in[4], tg[4];
    assert_int_equal(data_get_tokens(ds, -1, in, tg, &err), -1);
    assert_msg_has(err, "negative sample index -1");
    float px[3];
    int32_t label;
    assert_int_equal(data_get_image(ds, 0, px, &label, &err), -1);
    assert_msg_has(err, "holds tokens, not images");
    char desc[512];
    data_describe(ds, desc, sizeof desc);
    if (!strstr(desc, "1 shard") || !strstr(desc, "100 tokens") || !strstr(desc, "24 windows of 4+1"))
        fail_msg("description: %s", desc);
    data_close(ds);
    data_close(NULL);
}

static void test_token_vocab_errors(void **state) {
    (void)state;
    uint16_t t[9] = {1, 2, 3, 4, 5, 300, 6, 7, 8};
    err_t err = {{0}};
    const char *p = P("vocab.bin");
    assert_int_equal(data_shard_write(p, t, 9, &err), 0);
    data_source *ds;
    int32_t in[8], tg[8];
    assert_int_equal(data_open_tokens(&ds, p, DATA_TRAIN, 8, 300, DATA_CLM, 1, &err), 0);
    assert_int_equal(data_get_tokens(ds, 0, in, tg, &err), -1);
    assert_msg_has(err, p);
    assert_msg_has(err, "token 5 is 300, not below the model's vocabulary size 300");
    data_close(ds);
    /* vocab 301 is fine for CLM, but MLM reserves 300 = vocab-1 as the mask */
    assert_int_equal(data_open_tokens(&ds, p, DATA_TRAIN, 8, 301, DATA_CLM, 1, &err), 0);
    assert_int_equal(data_get_tokens(ds, 0, in, tg, &err), 0);
    data_close(ds);
    assert_int_equal(data_open_tokens(&ds, p, DATA_TRAIN, 8, 301, DATA_MLM, 1, &err), 0);
    assert_int_equal(data_get_tokens(ds, 0, in, tg, &err), -1);
    assert_msg_has(err, "token 5 is 300, the mask token of MLM");
    assert_msg_has(err, "must be below 300");
    data_close(ds);
    /* the last token of the window is checked too (it is a CLM target) */
    uint16_t u[9] = {1, 2, 3, 4, 5, 6, 7, 8, 999};
    assert_int_equal(data_shard_write(p, u, 9, &err), 0);
    assert_int_equal(data_open_tokens(&ds, p, DATA_TRAIN, 8, 300, DATA_CLM, 1, &err), 0);
    assert_int_equal(data_get_tokens(ds, 0, in, tg, &err), -1);
    assert_msg_has(err, "token 8 is 999");
    data_close(ds);
}

static void test_no_windows(void **state) {
    (void)state;
    make_shard(P("short_a.bin"), 8, 0, 100);
    make_shard(P("short_b.bin"), 3, 0, 100);
    char spec[600];
    snprintf(spec, sizeof spec, "%s,%s", P("short_a.bin"), P("short_b.bin"));
    expect_open_error(spec, 8, 256, DATA_CLM, "shorter than seq+1 = 9 tokens", "short_a.bin: 8 tokens");
    expect_open_error(spec, 8, 256, DATA_CLM, "short_b.bin: 3 tokens", NULL);
    /* seq 7: short_a has one window of 8 tokens, short_b none */
    data_source *ds;
    err_t err = {{0}};
    assert_int_equal(data_open_tokens(&ds, spec, DATA_TRAIN, 7, 256, DATA_CLM, 1, &err), 0);
    assert_int_equal(data_num_samples(ds), 1);
    data_close(ds);
}

/* ---- sample order ---- */

/* Shards in d/: order_0.bin .. order_2.bin with 41, 10, 23 tokens; token = shard*1000 + index. */
static const char *order_dir(void) {
    static char d[300];
    snprintf(d, sizeof d, "%s/order", dir);
    mkdir(d, 0777);
    const int lens[3] = {41, 10, 23};
    for (int k = 0; k < 3; k++) {
        char p[400];
        snprintf(p, sizeof p, "%s/order_%d.bin", d, k);
        make_shard(p, lens[k], k * 1000, 65536);
    }
    return d;
}

static void test_order_is_permutation(void **state) {
    (void)state;
    const char *d = order_dir();
    data_source *ds;
    err_t err = {{0}};
    const int seq = 4;
    assert_int_equal(data_open_tokens(&ds, d, DATA_TRAIN, seq, 65536, DATA_CLM, 42, &err), 0);
    /* windows: (41-1)/4 = 10, (10-1)/4 = 2, (23-1)/4 = 5 */
    const int64_t W = 17;
    assert_int_equal(data_num_samples(ds), W);
    int first_of[17]; /* the first input token of each window, in the shards' order */
    int k = 0;
    const int nw[3] = {10, 2, 5};
    for (int sh = 0; sh < 3; sh++)
        for (int w = 0; w < nw[sh]; w++) first_of[k++] = sh * 1000 + w * seq;
    int order[3][17];
    for (int e = 0; e < 3; e++) {
        int seen[17] = {0};
        for (int64_t i = 0; i < W; i++) {
            int64_t s = e * W + i, w = data_sample_index(ds, s);
            assert_true(w >= 0 && w < W);
            seen[w]++;
            order[e][i] = (int)w;
            int32_t in[4], tg[4];
            assert_int_equal(data_get_tokens(ds, s, in, tg, &err), 0);
            /* the window is contiguous, inside one shard, and the targets are shifted by one */
            assert_int_equal(in[0], first_of[w]);
            for (int t = 0; t < seq; t++) {
                assert_int_equal(in[t], first_of[w] + t);
                assert_int_equal(tg[t], first_of[w] + t + 1);
            }
        }
        for (int w = 0; w < W; w++) assert_int_equal(seen[w], 1); /* every window exactly once */
    }
    /* shuffled, and differently in each epoch */
    int identity = 1;
    for (int i = 0; i < W; i++) identity &= order[0][i] == i;
    assert_false(identity);
    assert_memory_not_equal(order[0], order[1], sizeof order[0]);
    assert_memory_not_equal(order[1], order[2], sizeof order[0]);
    data_close(ds);
}

static void test_order_random_access(void **state) {
    (void)state;
    const char *d = order_dir();
    data_source *a, *b, *c;
    err_t err = {{0}};
    assert_int_equal(data_open_tokens(&a, d, DATA_TRAIN, 4, 65536, DATA_CLM, 7, &err), 0);
    assert_int_equal(data_open_tokens(&b, d, DATA_TRAIN, 4, 65536, DATA_CLM, 7, &err), 0);
    assert_int_equal(data_open_tokens(&c, d, DATA_TRAIN, 4, 65536, DATA_CLM, 8, &err), 0);
    enum { N = 100 };
    int32_t fwd[N][4], tg[4], in[4];
    for (int s = 0; s < N; s++) assert_int_equal(data_get_tokens(a, s, fwd[s], tg, &err), 0);
    /* another source, reversed and strided order, with other reads in between */
    for (int s = N - 1; s >= 0; s -= 3) {
        assert_int_equal(data_get_tokens(b, 1000 + s, in, tg, &err), 0);
        assert_int_equal(data_get_tokens(b, s, in, tg, &err), 0);
        assert_memory_equal(in, fwd[s], sizeof in);
    }
    for (int s = 0; s < N; s++) {
        assert_int_equal(data_get_tokens(a, s, in, tg, &err), 0); /* again: same answer */
        assert_memory_equal(in, fwd[s], sizeof in);
    }
    int differ = 0;
    for (int s = 0; s < N; s++) {
        assert_int_equal(data_get_tokens(c, s, in, tg, &err), 0);
        differ += memcmp(in, fwd[s], sizeof in) != 0;
    }
    assert_true(differ > N / 2); /* another seed, another order */
    /* the spec forms agree: a directory is its *.bin files sorted by name; a glob and a list */
    char spec[1200];
    snprintf(spec, sizeof spec, "%s/order_0.bin,%s/order_1.bin,%s/order_2.bin", d, d, d);
    data_source *l, *g;
    assert_int_equal(data_open_tokens(&l, spec, DATA_TRAIN, 4, 65536, DATA_CLM, 7, &err), 0);
    snprintf(spec, sizeof spec, "%s/order_*.bin", d);
    assert_int_equal(data_open_tokens(&g, spec, DATA_TRAIN, 4, 65536, DATA_CLM, 7, &err), 0);
    for (int s = 0; s < N; s++) {
        assert_int_equal(data_get_tokens(l, s, in, tg, &err), 0);
        assert_memory_equal(in, fwd[s], sizeof in);
        assert_int_equal(data_get_tokens(g, s, in, tg, &err), 0);
        assert_memory_equal(in, fwd[s], sizeof in);
    }
    data_close(a);
    data_close(b);
    data_close(c);
    data_close(l);
    data_close(g);
}

/* Many W (1, powers of 2 and 4 and their neighbours): every epoch's order is a permutation. */
static void test_order_many_sizes(void **state) {
    (void)state;
    const int64_t sizes[] = {1, 2, 3, 4, 5, 15, 16, 17, 63, 64, 65, 255, 1000, 4097};
    err_t err = {{0}};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        int64_t W = sizes[k];
        make_shard(P("many.bin"), W + 1, 0, 65536); /* seq 1: W windows */
        data_source *ds;
        assert_int_equal(data_open_tokens(&ds, P("many.bin"), DATA_TRAIN, 1, 65536, DATA_CLM, 99 + k, &err), 0);
        assert_int_equal(data_num_samples(ds), W);
        char *seen = calloc((size_t)W, 1);
        for (int e = 0; e < 2; e++) {
            memset(seen, 0, (size_t)W);
            for (int64_t i = 0; i < W; i++) {
                int64_t w = data_sample_index(ds, e * W + i);
                if (w < 0 || w >= W || seen[w]) fail_msg("W=%lld epoch %d: window %lld repeated or out of range", (long long)W, e, (long long)w);
                seen[w] = 1;
            }
        }
        free(seen);
        data_close(ds);
    }
}

/* ---- MLM ---- */

static void test_mlm_masking(void **state) {
    (void)state;
    const int seq = 8192, vocab = 1000;
    make_shard(P("mlm.bin"), seq + 1, 0, vocab - 1);
    data_source *ds;
    err_t err = {{0}};
    assert_int_equal(data_open_tokens(&ds, P("mlm.bin"), DATA_TRAIN, seq, vocab, DATA_MLM, 3, &err), 0);
    int32_t *in = malloc(sizeof *in * seq), *tg = malloc(sizeof *tg * seq), *in2 = malloc(sizeof *in * seq),
            *tg2 = malloc(sizeof *tg * seq);
    assert_int_equal(data_get_tokens(ds, 0, in, tg, &err), 0);
    int chosen = 0, masked = 0, kept = 0, random = 0;
    for (int t = 0; t < seq; t++) {
        int orig = t % (vocab - 1);
        if (tg[t] == -1) {
            assert_int_equal(in[t], orig); /* unchosen: input is the token */
            continue;
        }
        chosen++;
        assert_int_equal(tg[t], orig); /* the target is the original token */
        if (in[t] == vocab - 1) masked++;
        else if (in[t] == orig) kept++;
        else {
            assert_true(in[t] >= 0 && in[t] < vocab - 1);
            random++;
        }
    }
    double f = (double)chosen / seq;
    if (f < 0.13 || f > 0.17) fail_msg("chosen fraction %.3f", f);
    double fm = (double)masked / chosen, fr = (double)random / chosen;
    if (fm < 0.75 || fm > 0.85 || fr < 0.06 || fr > 0.14) fail_msg("mask %.3f random %.3f kept %d", fm, fr, kept);
    assert_true(kept > 0);
    /* deterministic: the same sample again, and from another source */
    assert_int_equal(data_get_tokens(ds, 0, in2, tg2, &err), 0);
    assert_memory_equal(in, in2, sizeof *in * seq);
    assert_memory_equal(tg, tg2, sizeof *tg * seq);
    /* another epoch of the same window is masked differently */
    assert_int_equal(data_get_tokens(ds, 1, in2, tg2, &err), 0);
    assert_memory_not_equal(tg, tg2, sizeof *tg * seq);
    data_close(ds);
    free(in);
    free(tg);
    free(in2);
    free(tg2);

    /* short sequences: at least one target in every sample */
    make_shard(P("mlm2.bin"), 301, 0, 50);
    assert_int_equal(data_open_tokens(&ds, P("mlm2.bin"), DATA_TRAIN, 2, 51, DATA_MLM, 3, &err), 0);
    for (int64_t s = 0; s < 1000; s++) {
        int32_t a[2], b[2];
        assert_int_equal(data_get_tokens(ds, s, a, b, &err), 0);
        assert_true(b[0] != -1 || b[1] != -1);
    }
    data_close(ds);
}

/* ---- synthetic tokens ---- */

static void test_synthetic_tokens(void **state) {
    (void)state;
    data_source *a, *b, *c;
    err_t err = {{0}};
    const int seq = 64, vocab = 100;
    assert_int_equal(data_open_synthetic_tokens(&a, seq, vocab, DATA_CLM, 5, &err), 0);
    assert_int_equal(data_open_synthetic_tokens(&b, seq, vocab, DATA_CLM, 5, &err), 0);
    assert_int_equal(data_open_synthetic_tokens(&c, seq, vocab, DATA_CLM, 6, &err), 0);
    assert_int_equal(data_num_samples(a), INT64_MAX);
    int32_t in[64], tg[64], in2[64], tg2[64], prev[64] = {0};
    int steady = 0, steps = 0, differ_seed = 0;
    for (int64_t s = 0; s < 200; s++) {
        assert_int_equal(data_get_tokens(a, s, in, tg, &err), 0);
        assert_int_equal(data_get_tokens(b, s, in2, tg2, &err), 0);
        assert_memory_equal(in, in2, sizeof in);
        assert_memory_equal(tg, tg2, sizeof tg);
        assert_memory_not_equal(in, prev, sizeof in);
        memcpy(prev, in, sizeof in);
        assert_int_equal(data_get_tokens(c, s, in2, tg2, &err), 0);
        differ_seed += memcmp(in, in2, sizeof in) != 0;
        for (int t = 0; t < seq; t++) {
            assert_true(in[t] >= 0 && in[t] < vocab - 1);
            if (t + 1 < seq) assert_int_equal(tg[t], in[t + 1]);
        }
        /* learnable: mostly a constant stride mod vocab-1 */
        int stride = ((in[1] - in[0]) % (vocab - 1) + vocab - 1) % (vocab - 1);
        for (int t = 1; t < seq; t++, steps++)
            steady += ((in[t] - in[t - 1]) % (vocab - 1) + vocab - 1) % (vocab - 1) == stride;
    }
    assert_true(differ_seed > 190);
    if (steady < steps * 0.9) fail_msg("only %d of %d steps follow the stride", steady, steps);
    char desc[256];
    data_describe(a, desc, sizeof desc);
    assert_non_null(strstr(desc, "synthetic"));
    data_close(a);
    data_close(b);
    data_close(c);

    /* MLM on synthetic data: never the mask token in the data itself */
    assert_int_equal(data_open_synthetic_tokens(&a, seq, vocab, DATA_MLM, 5, &err), 0);
    int with_target = 0;
    for (int64_t s = 0; s < 50; s++) {
        assert_int_equal(data_get_tokens(a, s, in, tg, &err), 0);
        for (int t = 0; t < seq; t++) {
            if (tg[t] != -1) {
                with_target++;
                assert_true(tg[t] < vocab - 1);
            } else {
                assert_true(in[t] < vocab - 1);
            }
        }
    }
    assert_true(with_target > 50 * seq / 10);
    data_close(a);
}

/* ---- images ---- */

static void make_images(const char *path, data_image_info info, uint16_t *labels, uint8_t *px) {
    size_t n = (size_t)info.channels * info.height * info.width;
    for (uint32_t i = 0; i < info.count; i++) {
        labels[i] = (uint16_t)(i % info.n_classes);
        for (size_t j = 0; j < n; j++) px[i * n + j] = (uint8_t)(i * 31 + j * 7);
    }
    err_t err = {{0}};
    if (data_image_write(path, &info, labels, px, &err) < 0) fail_msg("%s", err.msg);
}

static void test_image_roundtrip(void **state) {
    (void)state;
    data_image_info info = {.count = 23, .channels = 3, .height = 4, .width = 4, .n_classes = 5};
    uint16_t labels[23];
    uint8_t px[23 * 48];
    const char *p = P("img.cimg");
    make_images(p, info, labels, px);
    assert_int_equal(file_size(p), 64 + 23 * (2 + 48));
    data_image_info got;
    err_t err = {{0}};
    assert_int_equal(data_image_file_info(p, &got, &err), 0);
    assert_memory_equal(&got, &info, sizeof info);
    /* header bytes */
    FILE *f = fopen(p, "rb");
    uint8_t h[64];
    assert_int_equal(fread(h, 1, 64, f), 64);
    fclose(f);
    assert_memory_equal(h, "CIMG", 4);
    uint32_t v[6];
    memcpy(v, h + 4, sizeof v);
    assert_int_equal(v[0], 1);
    assert_int_equal(v[1], 23);
    assert_int_equal(v[2], 3);
    assert_int_equal(v[3], 4);
    assert_int_equal(v[4], 4);
    assert_int_equal(v[5], 5);

    data_source *ds;
    assert_int_equal(data_open_images(&ds, p, 3, 4, 5, 11, &err), 0);
    assert_true(data_is_images(ds));
    assert_int_equal(data_num_samples(ds), 23);
    for (int e = 0; e < 2; e++) {
        int seen[23] = {0};
        for (int64_t i = 0; i < 23; i++) {
            float out[48];
            int32_t label;
            int64_t s = e * 23 + i, idx = data_sample_index(ds, s);
            assert_int_equal(data_get_image(ds, s, out, &label, &err), 0);
            seen[idx]++;
            assert_int_equal(label, labels[idx]);
            for (int j = 0; j < 48; j++) {
                float want = ((float)px[idx * 48 + j] / 255.0f - 0.5f) / 0.5f;
                assert_true(out[j] == want && out[j] >= -1.0f && out[j] <= 1.0f);
            }
        }
        for (int i = 0; i < 23; i++) assert_int_equal(seen[i], 1);
    }
    int32_t in[4], tg[4];
    assert_int_equal(data_get_tokens(ds, 0, in, tg, &err), -1);
    assert_msg_has(err, "holds images, not tokens");
    char desc[512];
    data_describe(ds, desc, sizeof desc);
    if (!strstr(desc, "23 images of 3x4x4") || !strstr(desc, "5 classes")) fail_msg("description: %s", desc);
    data_close(ds);
}

static void expect_image_error(const char *path, int c, int s, int k, const char *n1, const char *n2) {
    data_source *ds = (data_source *)1;
    err_t err = {{0}};
    assert_int_equal(data_open_images(&ds, path, c, s, k, 1, &err), -1);
    assert_null(ds);
    assert_msg_has(err, n1);
    if (n2) assert_msg_has(err, n2);
}

static void test_image_errors(void **state) {
    (void)state;
    data_image_info info = {.count = 4, .channels = 1, .height = 2, .width = 2, .n_classes = 3};
    uint16_t labels[4];
    uint8_t px[16];
    const char *good = P("good.cimg"), *bad = P("bad.cimg");
    make_images(good, info, labels, px);
    size_t len = 64 + 4 * 6;
    uint8_t b[64 + 4 * 6], c[sizeof b];
    FILE *f = fopen(good, "rb");
    assert_int_equal(fread(b, 1, len, f), len);
    fclose(f);

    /* model mismatches name both sides */
    expect_image_error(good, 3, 2, 3, "1 channels but the model takes 3", NULL);
    expect_image_error(good, 1, 4, 3, "are 2x2 (height x width) but the model takes 4x4", NULL);
    expect_image_error(good, 1, 2, 10, "has 3 classes but the model has 10", NULL);
    expect_image_error(P("none.cimg"), 1, 2, 3, "none.cimg: cannot open", NULL);

    write_raw(bad, b, 30);
    expect_image_error(bad, 1, 2, 3, "30 bytes, shorter than the 64-byte CIMG header", NULL);
    memcpy(c, b, len);
    memcpy(c, "\x89PNG", 4);
    write_raw(bad, c, len);
    expect_image_error(bad, 1, 2, 3, "bad magic \"\\x89PNG\"", "expected \"CIMG\"");
    memcpy(c, b, len);
    c[4] = 9;
    write_raw(bad, c, len);
    expect_image_error(bad, 1, 2, 3, "unknown CIMG version 9", NULL);
    memcpy(c, b, len);
    c[12] = 0; /* 0 channels */
    write_raw(bad, c, len);
    expect_image_error(bad, 1, 2, 3, "0 channels", NULL);
    memcpy(c, b, len);
    c[40] = 1;
    write_raw(bad, c, len);
    expect_image_error(bad, 1, 2, 3, "header byte 40 is 1", NULL);
    write_raw(bad, b, len - 1);
    expect_image_error(bad, 1, 2, 3, "says 4 images of 1x2x2 (88 bytes with the header)", "file has 87 bytes");
    memcpy(c, b, len);
    c[8] = 0; /* count 0, with 0 records */
    write_raw(bad, c, 64);
    expect_image_error(bad, 1, 2, 3, "holds no images", NULL);
    err_t err = {{0}};
    data_image_info got;
    assert_int_equal(data_image_check("mem.cimg", c, 64, &got, &err), 0); /* a valid, empty file */
    assert_int_equal(data_image_check("mem.cimg", c, 63, &got, &err), -1);
    assert_msg_has(err, "mem.cimg: file is 63 bytes");

    /* a label >= n_classes is reported on read, with the image's index */
    memcpy(c, b, len);
    c[64 + 2 * 6] = 7; /* image 2's label */
    write_raw(bad, c, len);
    data_source *ds;
    assert_int_equal(data_open_images(&ds, bad, 1, 2, 3, 1, &err), 0);
    int failures = 0;
    for (int64_t s = 0; s < 4; s++) {
        float out[4];
        int32_t label;
        if (data_get_image(ds, s, out, &label, &err) < 0) {
            failures++;
            assert_msg_has(err, "image 2 has label 7, not below the file's 3 classes");
            assert_msg_has(err, bad);
        }
    }
    assert_int_equal(failures, 1);
    data_close(ds);

    /* the writer refuses bad labels and dimensions */
    data_image_writer *w = data_image_writer_open(P("w.cimg"), &info, &err);
    assert_non_null(w);
    uint8_t four[4] = {0};
    assert_int_equal(data_image_writer_add(w, 3, four, &err), -1);
    assert_msg_has(err, "label 3 is not below the file's 3 classes");
    data_image_writer_abort(w);
    assert_int_equal(access(P("w.cimg.tmp"), F_OK), -1);
    assert_int_equal(access(P("w.cimg"), F_OK), -1);
    data_image_info huge = {.count = 0, .channels = 3, .height = 70000, .width = 2, .n_classes = 3};
    assert_null(data_image_writer_open(P("h.cimg"), &huge, &err));
    assert_msg_has(err, "image size 70000x2");
}

static void test_synthetic_images(void **state) {
    (void)state;
    const int C = 3, S = 16, K = 4;
    data_source *a, *b;
    err_t err = {{0}};
    assert_int_equal(data_open_synthetic_images(&a, C, S, K, 9, &err), 0);
    assert_int_equal(data_open_synthetic_images(&b, C, S, K, 9, &err), 0);
    assert_true(data_is_images(a));
    float x[3 * 16 * 16], y[3 * 16 * 16];
    uint8_t u[3 * 16 * 16];
    int count[4] = {0};
    /* per-class mean of |horizontal difference| vs |vertical difference|: the stripes' direction */
    double dh[4] = {0}, dv[4] = {0};
    for (int64_t s = 0; s < 400; s++) {
        int32_t la, lb, lu;
        assert_int_equal(data_get_image(a, s, x, &la, &err), 0);
        assert_int_equal(data_get_image(b, s, y, &lb, &err), 0);
        assert_memory_equal(x, y, sizeof x);
        assert_int_equal(la, lb);
        assert_true(la >= 0 && la < K);
        count[la]++;
        data_synthetic_image(9, s, C, S, K, u, &lu); /* the uint8 form is the same image */
        assert_int_equal(lu, la);
        for (int j = 0; j < C * S * S; j++) assert_true(x[j] == ((float)u[j] / 255.0f - 0.5f) / 0.5f);
        for (int r = 0; r < S - 1; r++)
            for (int q = 0; q < S - 1; q++) {
                dh[la] += abs(u[r * S + q + 1] - u[r * S + q]);
                dv[la] += abs(u[(r + 1) * S + q] - u[r * S + q]);
            }
    }
    for (int k = 0; k < K; k++) assert_true(count[k] > 50);
    /* class 0 varies along x (vertical stripes), class 1 along y */
    if (!(dh[0] > 2 * dv[0] && dv[1] > 2 * dh[1])) fail_msg("h/v %f %f / %f %f", dh[0], dv[0], dh[1], dv[1]);
    char desc[256];
    data_describe(a, desc, sizeof desc);
    assert_non_null(strstr(desc, "synthetic"));
    data_close(a);
    data_close(b);
    assert_int_equal(data_open_synthetic_images(&a, 0, S, K, 9, &err), -1);
    assert_msg_has(err, "0 image channels");
}

/* Which shards are validation shards, by name. */
static void test_validation_names(void **state) {
    (void)state;
    const char *val[] = {"val_000000.bin", "fineweb_val_000000.bin", "d/tiny-valid.bin", "validation.bin", "x.val.bin"};
    const char *not_val[] = {"train_000001.bin", "interval.bin", "valley_000.bin", "d_val/train.bin", "eval_0.bin"};
    for (size_t i = 0; i < sizeof val / sizeof val[0]; i++)
        if (!data_is_validation_shard(val[i])) fail_msg("%s is a validation shard", val[i]);
    for (size_t i = 0; i < sizeof not_val / sizeof not_val[0]; i++)
        if (data_is_validation_shard(not_val[i])) fail_msg("%s is not a validation shard", not_val[i]);
}

/* A directory of cephalo data's shards: training leaves val_*.bin out, validation takes only it;
 * a directory of validation shards alone trains on nothing; a named validation file trains. */
static void test_directory_roles(void **state) {
    (void)state;
    char d[300], only[300];
    snprintf(d, sizeof d, "%s/roles", dir);
    snprintf(only, sizeof only, "%s/onlyval", dir);
    mkdir(d, 0777), mkdir(only, 0777);
    make_shard(P("roles/train_000000.bin"), 41, 0, 100);
    make_shard(P("roles/train_000001.bin"), 21, 0, 100);
    make_shard(P("roles/val_000000.bin"), 11, 0, 100);
    make_shard(P("onlyval/val_000000.bin"), 11, 0, 100);
    data_source *ds;
    err_t err = {{0}};
    /* seq 10: windows (n-1)/10 per shard: 4 + 2 train, 1 validation */
    assert_int_equal(data_open_tokens(&ds, d, DATA_TRAIN, 10, 256, DATA_CLM, 1, &err), 0);
    assert_int_equal(data_num_samples(ds), 6);
    data_close(ds);
    assert_int_equal(data_open_tokens(&ds, d, DATA_VALIDATION, 10, 256, DATA_CLM, 1, &err), 0);
    assert_int_equal(data_num_samples(ds), 1);
    data_close(ds);
    assert_int_equal(data_open_tokens(&ds, only, DATA_TRAIN, 10, 256, DATA_CLM, 1, &err), -1);
    assert_msg_has(err, "only validation shards (val_000000.bin)");
    assert_int_equal(data_open_tokens(&ds, P("onlyval/val_000000.bin"), DATA_TRAIN, 10, 256, DATA_CLM, 1, &err), 0);
    assert_int_equal(data_num_samples(ds), 1);
    data_close(ds);
    /* a directory without validation shards: everything, for either role */
    assert_int_equal(data_open_tokens(&ds, order_dir(), DATA_VALIDATION, 10, 256, DATA_CLM, 1, &err), 0);
    assert_int_equal(data_num_samples(ds), 4 + 0 + 2);
    data_close(ds);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shard_roundtrip),
        cmocka_unit_test(test_shard_tokenizer),    cmocka_unit_test(test_shard_header_errors),
        cmocka_unit_test(test_shard_u32),
        cmocka_unit_test(test_bad_arguments),      cmocka_unit_test(test_token_vocab_errors),
        cmocka_unit_test(test_no_windows),         cmocka_unit_test(test_order_is_permutation),
        cmocka_unit_test(test_order_random_access), cmocka_unit_test(test_order_many_sizes),
        cmocka_unit_test(test_mlm_masking),        cmocka_unit_test(test_synthetic_tokens),
        cmocka_unit_test(test_image_roundtrip),    cmocka_unit_test(test_image_errors),
        cmocka_unit_test(test_synthetic_images),   cmocka_unit_test(test_validation_names),
        cmocka_unit_test(test_directory_roles),    cmocka_unit_test(test_loss_mask),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
