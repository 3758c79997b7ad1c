/* test_tokenizer.c - the tokenizer core (worker/formats/tokenizer.c) on small hand-made
 * tokenizer.json files: the pre-tokenizer patterns, merge order, byte fallback, added tokens,
 * decoding, bad files (each error names the field) and random round trips. The agreement with
 * real vocabularies is tests/cli/test_tokenizer.sh's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "formats/tokenizer.h"

/* ---- building tokenizer.json documents ---- */

typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

static void sb_add(sbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (b->n + (size_t)k + 1 > b->cap) {
        b->cap = 2 * (b->n + (size_t)k + 1);
        b->p = realloc(b->p, b->cap);
    }
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)k + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)k;
}

/* GPT-2's byte alphabet, written independently of the code under test: printable bytes stand for
 * themselves, the others for U+0100, U+0101, ... in byte order. */
static int byte_cp(int b) {
    static int map[256], done;
    if (!done) {
        int next = 256;
        for (int x = 0; x < 256; x++) {
            int printable = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255);
            map[x] = printable ? x : next++;
        }
        done = 1;
    }
    return map[b];
}

/* A JSON string literal body for a code point. */
static void sb_cp(sbuf *b, int cp) {
    if (cp == '"' || cp == '\\') sb_add(b, "\\%c", cp);
    else if (cp < 0x20 || cp >= 0x7f) sb_add(b, "\\u%04x", cp);
    else sb_add(b, "%c", cp);
}

/* Byte-level: token ids 0..255 are the bytes; extra[] tokens (in the byte alphabet, e.g. "Ġt")
 * get 256.., merges[] as "A B"; pre is the pre_tokenizer JSON. */
static char *byte_level_json(const char *pre, const char *const *extra, const char *const *merges, const char *more) {
    sbuf b = {0};
    sb_add(&b, "{\"version\": \"1.0\", \"added_tokens\": [{\"id\": %d, \"content\": \"<|endoftext|>\", \"special\": true}],"
               " \"normalizer\": null, \"pre_tokenizer\": %s, \"decoder\": {\"type\": \"ByteLevel\"},"
               " \"model\": {\"type\": \"BPE\", \"dropout\": null%s, \"vocab\": {",
           300, pre, more ? more : "");
    for (int i = 0; i < 256; i++) {
        sb_add(&b, "%s\"", i ? ", " : "");
        sb_cp(&b, byte_cp(i));
        sb_add(&b, "\": %d", i);
    }
    int id = 256;
    for (int i = 0; extra[i]; i++) sb_add(&b, ", \"%s\": %d", extra[i], id++);
    sb_add(&b, ", \"<|endoftext|>\": 300}, \"merges\": [");
    for (int i = 0; merges[i]; i++) sb_add(&b, "%s\"%s\"", i ? ", " : "", merges[i]);
    sb_add(&b, "]}}");
    return b.p;
}

static const char GPT2_PRE[] = "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}";
static const char LLAMA3_PRE[] =
    "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": "
    "\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| ?[^\\\\s\\\\p{L}\\\\p{N}]+"
    "[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"}, \"behavior\": \"Isolated\", \"invert\": false}, "
    "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]}";

/* Merges that reveal the pre-tokenizer's words: a merge across a word boundary cannot happen. */
static const char *const WORD_EXTRA[] = {"ab", "Ġa", "ĠĠ", "12", "123", "ĊĊ", "Ġb", "abĠ", "1212", NULL};
static const char *const WORD_MERGES[] = {"a b", "Ġ a", "Ġ Ġ", "1 2", "12 3", "Ċ Ċ", "Ġ b", "ab Ġ", "12 12", NULL};

static tok *load(const char *json) {
    tok *t = NULL;
    err_t err = {{0}};
    if (tok_parse(&t, "t.json", json, strlen(json), &err) < 0) fail_msg("%s", err.msg);
    return t;
}

/* Encodes s, checks the ids against want (terminated by -1), and decode(encode(s)) == s. */
static void expect_ids(tok *t, const char *s, const int32_t *want) {
    tok_ids ids = {0};
    tok_encode(t, s, strlen(s), false, &ids);
    size_t n = 0;
    while (want[n] >= 0) n++;
    if (ids.n != n || (n && memcmp(ids.v, want, n * sizeof *want))) {
        char got[512] = "";
        size_t k = 0;
        for (size_t i = 0; i < ids.n && k < 400; i++) k += (size_t)snprintf(got + k, sizeof got - k, " %d", ids.v[i]);
        fail_msg("'%s': got%s (%zu tokens, expected %zu)", s, got, ids.n, n);
    }
    tok_text back = {0};
    err_t err = {{0}};
    assert_int_equal(tok_decode(t, ids.v, ids.n, &back, &err), 0);
    assert_int_equal(back.n, strlen(s));
    assert_memory_equal(back.p, s, back.n);
    tok_text_free(&back);
    tok_ids_free(&ids);
}

#define IDS(...) ((const int32_t[]){__VA_ARGS__, -1})
enum { AB = 256, GA, GG, N12, N123, NLNL, GB, ABG, N1212 };

static void test_gpt2_pattern(void **state) {
    (void)state;
    char *json = byte_level_json(GPT2_PRE, WORD_EXTRA, WORD_MERGES, NULL);
    tok *t = load(json);
    assert_int_equal(tok_get_kind(t), TOK_BYTE_BPE);
    assert_int_equal(tok_vocab_size(t), 301);
    assert_int_equal(tok_eos(t), 300);
    assert_int_equal(tok_bos(t), -1);
    expect_ids(t, "ab", IDS(AB));
    expect_ids(t, "ab ab", IDS(AB, ' ', AB));          /* " ab": "a b" (rank 0) before "Ġ a" (rank 1) */
    expect_ids(t, "a  b", IDS('a', ' ', GB));         /* \s+(?!\S) leaves the last space to " b" */
    expect_ids(t, "a   ", IDS('a', GG, ' '));         /* trailing spaces: one word, merged pairwise */
    expect_ids(t, "ab\n\nab", IDS(AB, '\n', '\n', AB)); /* "\n" (\s+(?!\S)), then "\n" (\s+) */
    expect_ids(t, "ab\n\n", IDS(AB, NLNL));
    expect_ids(t, "12345", IDS(N123, '4', '5'));
    expect_ids(t, "1212", IDS(N1212));                 /* GPT-2 numbers: one run */
    expect_ids(t, "it's", IDS('i', 't', '\'', 's'));  /* 's is its own word */
    expect_ids(t, "IT'S", IDS('I', 'T', '\'', 'S'));  /* case-sensitive: ' then S */
    expect_ids(t, "ab!!", IDS(AB, '!', '!'));
    expect_ids(t, "", (const int32_t[]){-1});
    free(json);
    tok_free(t);
}

static void test_gpt2_words_are_separate(void **state) {
    (void)state;
    /* "ab Ġ" would join a word with the space after it: the pattern keeps them apart */
    char *json = byte_level_json(GPT2_PRE, WORD_EXTRA, WORD_MERGES, NULL);
    tok *t = load(json);
    expect_ids(t, "ab x", IDS(AB, ' ', 'x'));
    free(json);
    tok_free(t);
}

static void test_llama3_pattern(void **state) {
    (void)state;
    char *json = byte_level_json(LLAMA3_PRE, WORD_EXTRA, WORD_MERGES, NULL);
    tok *t = load(json);
    assert_string_equal(tok_describe(t), "byte-level BPE, Llama-3 pattern");
    expect_ids(t, "12345", IDS(N123, '4', '5')); /* \p{N}{1,3}: "123" "45" */
    expect_ids(t, "1212", IDS(N12, '1', '2'));   /* "121" "2": not one run as with GPT-2 */
    expect_ids(t, "123123", IDS(N123, N123));
    expect_ids(t, "IT'S", IDS('I', 'T', '\'', 'S'));
    expect_ids(t, "ab\n\n", IDS(AB, NLNL));
    expect_ids(t, "a  \n\nb", IDS('a', GG, NLNL, 'b')); /* \s*[\r\n]+ takes the spaces before newlines */
    expect_ids(t, "(ab", IDS('(', AB));                /* one non-letter joins the letters' word */
    free(json);
    tok_free(t);
}

/* The same text cut into words by hand, by the pattern's rules, for inputs exercising them:
 * checked through a tokenizer whose merges join any two equal bytes of a word, so each word's
 * tokens never cross a word boundary and the boundaries can be read off the ids. */
static void test_round_trip_random(void **state) {
    (void)state;
    const char *pres[2] = {GPT2_PRE, LLAMA3_PRE};
    static const char *const pieces[] = {" ", "  ", "\t", "\n", "\r\n", "a", "b", "Z", "1", "23", "'s", "'LL", "!", "?",
                                         "\xc3\xa9", "\xe4\xb8\xad", "\xf0\x9f\x98\x80", "\xcc\x81", "\xe2\x80\x83",
                                         "\xc2\xa0", "\xff", "\xc3", "\xe2\x96", "\x80", "\xed\xa0\x80", "\xc0\xaf"};
    uint64_t x = 88172645463325252ull;
    for (int p = 0; p < 2; p++) {
        char *json = byte_level_json(pres[p], WORD_EXTRA, WORD_MERGES, NULL);
        tok *t = load(json);
        for (int iter = 0; iter < 3000; iter++) {
            char s[400];
            size_t n = 0;
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            int parts = (int)(x % 40);
            for (int k = 0; k < parts; k++) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                const char *pc = pieces[x % (sizeof pieces / sizeof *pieces)];
                if ((x >> 20) % 7 == 0) { /* a random byte */
                    s[n++] = (char)(x >> 40);
                } else {
                    memcpy(s + n, pc, strlen(pc));
                    n += strlen(pc);
                }
            }
            tok_ids ids = {0};
            tok_encode(t, s, n, false, &ids);
            tok_text back = {0};
            err_t err = {{0}};
            assert_int_equal(tok_decode(t, ids.v, ids.n, &back, &err), 0);
            assert_int_equal(back.n, n);
            if (n) assert_memory_equal(back.p, s, n);
            tok_text_free(&back);
            tok_ids_free(&ids);
        }
        free(json);
        tok_free(t);
    }
}

/* ---- SentencePiece ---- */

static char *sp_json(const char *norm, const char *pre, const char *dec, const char *model_more) {
    sbuf b = {0};
    sb_add(&b, "{\"added_tokens\": [{\"id\": 0, \"content\": \"<unk>\"}, {\"id\": 1, \"content\": \"<s>\"},"
               " {\"id\": 2, \"content\": \"</s>\"}], \"normalizer\": %s, \"pre_tokenizer\": %s, \"decoder\": %s,"
               " \"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"fuse_unk\": true%s,"
               " \"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"</s>\": 2",
           norm, pre, dec, model_more);
    for (int i = 0; i < 256; i++) sb_add(&b, ", \"<0x%02X>\": %d", i, 3 + i);
    /* 259.. */
    sb_add(&b, ", \"\\u2581\": 259, \"a\": 260, \"b\": 261, \"\\u2581a\": 262, \"ab\": 263, \"\\u2581ab\": 264,"
               " \"\\u2581\\u2581\": 265, \"\\u00e9\": 266, \"b\\u2581\": 267},"
               " \"merges\": [\"\\u2581 a\", \"a b\", \"\\u2581a b\", \"\\u2581 \\u2581\"]}}");
    return b.p;
}

static const char SP_NORM[] = "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": \"\\u2581\"},"
                              " {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\\u2581\"}]}";
static const char SP_DEC[] = "{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": {\"String\":"
                             " \"\\u2581\"}, \"content\": \" \"}, {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"},"
                             " {\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]}";

static void test_sentencepiece(void **state) {
    (void)state;
    char *json = sp_json(SP_NORM, "null", SP_DEC, ", \"byte_fallback\": true");
    tok *t = load(json);
    assert_int_equal(tok_get_kind(t), TOK_SP_BPE);
    assert_string_equal(tok_describe(t), "SentencePiece BPE with byte fallback");
    assert_int_equal(tok_eos(t), 2);
    assert_int_equal(tok_bos(t), 1);
    expect_ids(t, "ab", IDS(264));                  /* ▁ab */
    expect_ids(t, "ab ab", IDS(264, 264));
    expect_ids(t, "ba", IDS(259, 261, 260));         /* ▁ b a: "▁ a" cannot apply */
    expect_ids(t, " ab", IDS(259, 264));             /* ▁▁ab: "▁ a" (rank 0) first, then "▁a b" */
    expect_ids(t, "\xc3\xa9", IDS(259, 266));       /* é is a vocabulary character */
    expect_ids(t, "\xe4\xb8\xad", IDS(259, 3 + 0xe4, 3 + 0xb8, 3 + 0xad)); /* 中: byte fallback */
    expect_ids(t, "a\xff", IDS(262, 3 + 0xff));     /* not UTF-8: the byte's token */
    expect_ids(t, "", (const int32_t[]){-1});
    /* "▁" in the text is a space after decoding: the one input that does not round-trip */
    tok_ids ids = {0};
    tok_encode(t, "a\xe2\x96\x81" "b", 5, false, &ids);
    tok_text back = {0};
    err_t err = {{0}};
    assert_int_equal(tok_decode(t, ids.v, ids.n, &back, &err), 0);
    assert_string_equal(back.p, "a b");
    tok_text_free(&back);
    tok_ids_free(&ids);
    /* random round trips over bytes that never form "▁" */
    uint64_t x = 0x9e3779b97f4a7c15ull;
    static const char alphabet[] = "ab \n\t\xc3\xa9\xe4\xb8\xad\xff\x80";
    for (int iter = 0; iter < 3000; iter++) {
        char s[200];
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        size_t n = x % sizeof s;
        for (size_t i = 0; i < n; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            s[i] = alphabet[x % (sizeof alphabet - 1)];
        }
        tok_ids r = {0};
        tok_encode(t, s, n, false, &r);
        tok_text b2 = {0};
        assert_int_equal(tok_decode(t, r.v, r.n, &b2, &err), 0);
        assert_int_equal(b2.n, n);
        if (n) assert_memory_equal(b2.p, s, n);
        tok_text_free(&b2);
        tok_ids_free(&r);
    }
    free(json);
    tok_free(t);
}

static void test_sentencepiece_metaspace_and_unk(void **state) {
    (void)state;
    /* Metaspace pre-tokenizer (no normalizer), no byte fallback: unknown characters are <unk>, fused */
    char *json = sp_json("null", "{\"type\": \"Metaspace\", \"replacement\": \"\\u2581\", \"prepend_scheme\": \"always\", "
                                 "\"split\": true}",
                         "{\"type\": \"Metaspace\", \"replacement\": \"\\u2581\", \"prepend_scheme\": \"always\"}", "");
    tok *t = load(json);
    assert_string_equal(tok_describe(t), "SentencePiece BPE");
    tok_ids ids = {0};
    const char *s = "ab \xe4\xb8\xad\xe4\xb8\xad" "a";
    tok_encode(t, s, strlen(s), false, &ids);
    assert_int_equal(ids.n, 4); /* ▁ab ▁ <unk> a */
    assert_int_equal(ids.v[0], 264);
    assert_int_equal(ids.v[1], 259);
    assert_int_equal(ids.v[2], 0);
    assert_int_equal(ids.v[3], 260);
    tok_ids_free(&ids);
    free(json);
    tok_free(t);
}

static void test_special_tokens(void **state) {
    (void)state;
    char *json = byte_level_json(GPT2_PRE, WORD_EXTRA, WORD_MERGES, NULL);
    tok *t = load(json);
    const char *s = "ab<|endoftext|>ab";
    tok_ids ids = {0};
    tok_encode(t, s, strlen(s), true, &ids);
    assert_int_equal(ids.n, 3);
    assert_int_equal(ids.v[1], 300);
    tok_ids_free(&ids);
    tok_encode(t, s, strlen(s), false, &ids); /* ordinary text */
    assert_true(ids.n > 3);
    for (size_t i = 0; i < ids.n; i++) assert_int_not_equal(ids.v[i], 300);
    tok_text back = {0};
    err_t err = {{0}};
    assert_int_equal(tok_decode(t, ids.v, ids.n, &back, &err), 0);
    assert_string_equal(back.p, s);
    tok_text_free(&back);
    int32_t eos = 300, badid = 301;
    assert_int_equal(tok_decode(t, &eos, 1, &back, &err), 0);
    assert_string_equal(back.p, "<|endoftext|>");
    assert_int_equal(tok_decode(t, &badid, 1, &back, &err), -1);
    assert_non_null(strstr(err.msg, "token 0 is 301, outside the vocabulary (0..300)"));
    assert_int_equal(tok_find(t, "Ġa"), GA);
    assert_int_equal(tok_find(t, "nope"), -1);
    tok_text_free(&back);
    tok_ids_free(&ids);
    free(json);
    tok_free(t);
}

static void test_ignore_merges(void **state) {
    (void)state;
    /* "xyz" is in the vocabulary but no merge makes it: with ignore_merges a word equal to a token
     * is that token */
    static const char *const extra[] = {"ab", "xyz", NULL};
    static const char *const merges[] = {"a b", NULL};
    char *json = byte_level_json(LLAMA3_PRE, extra, merges, ", \"ignore_merges\": true");
    tok *t = load(json);
    expect_ids(t, "xyz", IDS(257));
    expect_ids(t, "xyzab", IDS('x', 'y', 'z', AB));
    free(json);
    tok_free(t);
}

/* ---- bad files ---- */

static void expect_error(const char *json, const char *n1, const char *n2) {
    tok *t = (tok *)1;
    err_t err = {{0}};
    assert_int_equal(tok_parse(&t, "bad.json", json, strlen(json), &err), -1);
    assert_null(t);
    if (!strstr(err.msg, n1) || (n2 && !strstr(err.msg, n2)))
        fail_msg("error '%s' lacks '%s'%s%s", err.msg, n1, n2 ? " or " : "", n2 ? n2 : "");
}

static void test_bad_files(void **state) {
    (void)state;
    /* two tokens with one id (found by fuzz_tokenizer): the id would decode as only one of them */
    char *dup = sp_json(SP_NORM, "null", SP_DEC, ", \"byte_fallback\": true");
    char *b = strstr(dup, "\"b\": 261");
    assert_non_null(b);
    memcpy(b, "\"b\": 260", 8);
    expect_error(dup, "model.vocab: \"a\" and \"b\" both have id 260 (expected one token per id)", NULL);
    free(dup);
    expect_error("{", "bad.json", "JSON syntax error");
    expect_error("[1]", "bad.json", "expected an object");
    expect_error("{}", "missing field 'model'", NULL);
    expect_error("{\"model\": {\"type\": \"Unigram\", \"vocab\": {}}}", "model.type: \"Unigram\" is not supported",
                 "expected \"BPE\"");
    expect_error("{\"model\": {\"type\": \"BPE\", \"merges\": []}}", "missing field 'vocab'", NULL);
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": [1], \"merges\": []}}", "model.vocab: expected an object", NULL);
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": \"x\"}, \"merges\": []}}", "model.vocab[\"a\"]",
                 "expected a token id");
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}, \"merges\": []}}", "model.vocab[\"a\"]", NULL);
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 2000000000}, \"merges\": []}}",
                 "model.vocab[\"a\"]: expected a token id in 0..16777215, got another number", NULL);
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"a\": 1}, \"merges\": []}}",
                 "model.vocab: field 'a' appears twice", NULL);
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}}", "missing field 'merges'", NULL);
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a b\"]}}",
                 "model.merges[0]: \"ab\" is not in model.vocab", NULL);
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a\"]}}", "model.merges[0]",
                 "expected \"LEFT RIGHT\"");
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [3]}}", "model.merges[0]", "got a number");
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
                 "neither a ByteLevel pre-tokenizer nor SentencePiece", NULL);
    expect_error("{\"added_tokens\": [{\"id\": \"x\", \"content\": \"<s>\"}], \"model\": {\"type\": \"BPE\", \"vocab\": "
                 "{\"a\": 0}, \"merges\": []}}",
                 "added_tokens[0].id", NULL);
    expect_error("{\"added_tokens\": [{\"id\": 1}], \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
                 "added_tokens[0]: missing field 'content'", NULL);
    expect_error("{\"added_tokens\": [{\"id\": 5, \"content\": \"a\"}], \"model\": {\"type\": \"BPE\", \"vocab\": "
                 "{\"a\": 0}, \"merges\": []}}",
                 "added_tokens[0]: \"a\" has id 5 but model.vocab gives it 0", NULL);
    expect_error("{\"normalizer\": {\"type\": \"NFC\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
                 "normalizer.type: unsupported normalizer \"NFC\"", NULL);
    expect_error("{\"pre_tokenizer\": {\"type\": \"Whitespace\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, "
                 "\"merges\": []}}",
                 "pre_tokenizer.type: unsupported pre-tokenizer \"Whitespace\"", NULL);
    expect_error("{\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
                 "{\"Regex\": \"\\\\w+\"}, \"behavior\": \"Isolated\"}]}, \"model\": {\"type\": \"BPE\", \"vocab\": "
                 "{\"a\": 0}, \"merges\": []}}",
                 "pre_tokenizer.pretokenizers[0].pattern.Regex: unsupported pattern", NULL);
    expect_error("{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, "
                 "\"merges\": []}}",
                 "for byte 0x00 (byte-level BPE needs all 256)", NULL);
    expect_error("{\"pre_tokenizer\": {\"type\": \"Metaspace\"}, \"model\": {\"type\": \"BPE\", \"byte_fallback\": true, "
                 "\"vocab\": {\"a\": 0}, \"merges\": []}}",
                 "no token \"<0x00>\" although model.byte_fallback is true", NULL);
    expect_error("{\"pre_tokenizer\": {\"type\": \"Metaspace\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, "
                 "\"merges\": []}}",
                 "neither byte_fallback nor an unk_token", NULL);
    expect_error("{\"pre_tokenizer\": {\"type\": \"Metaspace\"}, \"model\": {\"type\": \"BPE\", \"dropout\": 0.1, "
                 "\"vocab\": {\"a\": 0}, \"merges\": []}}",
                 "model.dropout: BPE dropout is not supported", NULL);
    expect_error("{\"pre_tokenizer\": {\"type\": \"Metaspace\"}, \"model\": {\"type\": \"BPE\", \"continuing_subword_prefix\": "
                 "\"##\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
                 "model.continuing_subword_prefix: \"##\" is not supported", NULL);
    expect_error("{\"pre_tokenizer\": {\"type\": \"Metaspace\"}, \"decoder\": {\"type\": \"WordPiece\"}, \"model\": "
                 "{\"type\": \"BPE\", \"unk_token\": \"a\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
                 "decoder.type: unsupported decoder \"WordPiece\"", NULL);
    tok *t;
    err_t err = {{0}};
    assert_int_equal(tok_load(&t, "/nonexistent/tokenizer.json", &err), -1);
    assert_non_null(strstr(err.msg, "/nonexistent/tokenizer.json: cannot open"));
}

/* Corrupted files (bytes replaced, cut short) load or give an error, never crash; what loads
 * still round-trips. */
static void test_corrupted_files(void **state) {
    (void)state;
    char *good = sp_json(SP_NORM, "null", SP_DEC, ", \"byte_fallback\": true");
    size_t n = strlen(good);
    char *bad = malloc(n + 1);
    uint64_t x = 0x2545f4914f6cdd1dull;
    int loaded = 0;
    for (int iter = 0; iter < 400; iter++) {
        memcpy(bad, good, n + 1);
        size_t len = n;
        static const char junk[] = "{}[]\",:0123456789 ab\\u";
        for (int k = 0; k < 1 + iter % 3; k++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            bad[x % n] = junk[(x >> 32) % (sizeof junk - 1)];
        }
        if (iter % 4 == 0) len = (size_t)(x >> 40) % n; /* cut short */
        tok *t = NULL;
        err_t err = {{0}};
        if (tok_parse(&t, "c.json", bad, len, &err) < 0) {
            assert_null(t);
            assert_non_null(strstr(err.msg, "c.json"));
            continue;
        }
        loaded++;
        tok_ids ids = {0};
        tok_encode(t, "ab ba \xc3\xa9", 8, false, &ids);
        tok_text back = {0};
        assert_int_equal(tok_decode(t, ids.v, ids.n, &back, &err), 0);
        tok_text_free(&back);
        tok_ids_free(&ids);
        tok_free(t);
    }
    assert_true(loaded > 0); /* some corruptions hit only strings and still load */
    free(bad);
    free(good);
}

/* ---- identity ---- */

static tok_id ident_of(const char *json) {
    tok *t = load(json);
    tok_id id = tok_identity(t);
    tok_free(t);
    return id;
}

/* The identity follows the content, not the file: another key order, whitespace, merges as
 * arrays give the same; one more merge, another merge order, another pattern or an added token's
 * flag change it. Names round-trip through tok_id_parse. */
static void test_identity(void **state) {
    (void)state;
    char *base = byte_level_json(GPT2_PRE, WORD_EXTRA, WORD_MERGES, NULL);
    tok_id a = ident_of(base);
    assert_int_equal(a.kind, TOKID_BYTE_BPE);
    assert_int_equal(a.vocab, 301);
    assert_true(a.hash != 0);

    /* the same document reformatted (whitespace after every key's colon), and with the merges
     * as ["A", "B"] pairs */
    sbuf b = {0};
    for (const char *c = base; *c; c++)
        if (!strncmp(c, "\": ", 3)) sb_add(&b, "\" :\n\t"), c += 2;
        else sb_add(&b, "%c", *c);
    assert_true(tok_id_equal(a, ident_of(b.p)));
    sbuf c = {0};
    const char *m = strstr(base, "\"merges\": [");
    assert_non_null(m);
    sb_add(&c, "%.*s\"merges\": [", (int)(m - base), base);
    for (int i = 0; WORD_MERGES[i]; i++) {
        const char *sp = strchr(WORD_MERGES[i], ' ');
        sb_add(&c, "%s[\"%.*s\", \"%s\"]", i ? ", " : "", (int)(sp - WORD_MERGES[i]), WORD_MERGES[i], sp + 1);
    }
    sb_add(&c, "]}}");
    assert_true(tok_id_equal(a, ident_of(c.p)));

    /* content changes */
    const char *const fewer[] = {"a b", "Ġ a", "Ġ Ġ", "1 2", "12 3", "Ċ Ċ", "Ġ b", "ab Ġ", NULL};
    const char *const swapped[] = {"Ġ a", "a b", "Ġ Ġ", "1 2", "12 3", "Ċ Ċ", "Ġ b", "ab Ġ", "12 12", NULL};
    char *d1 = byte_level_json(GPT2_PRE, WORD_EXTRA, fewer, NULL);
    char *d2 = byte_level_json(GPT2_PRE, WORD_EXTRA, swapped, NULL);
    char *d3 = byte_level_json(LLAMA3_PRE, WORD_EXTRA, WORD_MERGES, NULL);
    tok_id i1 = ident_of(d1), i2 = ident_of(d2), i3 = ident_of(d3);
    assert_false(tok_id_equal(a, i1));
    assert_false(tok_id_equal(a, i2));
    assert_false(tok_id_equal(a, i3));
    assert_int_equal(i1.vocab, 301);

    /* names */
    char name[TOK_ID_NAME_MAX], want[TOK_ID_NAME_MAX];
    tok_id_name(a, name);
    snprintf(want, sizeof want, "bpe-301-%016llx", (unsigned long long)a.hash);
    assert_string_equal(name, want);
    tok_id back;
    assert_int_equal(tok_id_parse(name, &back), 0);
    assert_true(tok_id_equal(a, back));
    tok_id_name(tok_id_bytes(), name);
    assert_string_equal(name, "bytes-256");
    assert_int_equal(tok_id_parse(name, &back), 0);
    assert_true(tok_id_equal(back, tok_id_bytes()));
    tok_id_name((tok_id){0}, name);
    assert_string_equal(name, "unknown");
    assert_int_equal(tok_id_parse("unknown", &back), 0);
    assert_int_equal(back.kind, TOKID_UNKNOWN);
    static const char *const bad[] = {"bpe-301", "bpe-0-0123456789abcdef", "bpe-301-0123", "sp-x-0123456789abcdef",
                                      "bpe-301-0123456789ABCDEF", "bytes-257", "gpt2", ""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) assert_int_equal(tok_id_parse(bad[i], &back), -1);

    /* tok_string inverts tok_find */
    tok *t = load(base);
    assert_string_equal(tok_string(t, 300), "<|endoftext|>");
    assert_int_equal(tok_find(t, tok_string(t, AB)), AB);
    assert_null(tok_string(t, 299)); /* no token has the id */
    tok_free(t);
    free(base), free(b.p), free(c.p), free(d1), free(d2), free(d3);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_identity),
        cmocka_unit_test(test_gpt2_pattern),     cmocka_unit_test(test_gpt2_words_are_separate),
        cmocka_unit_test(test_llama3_pattern),   cmocka_unit_test(test_round_trip_random),
        cmocka_unit_test(test_sentencepiece),    cmocka_unit_test(test_sentencepiece_metaspace_and_unk),
        cmocka_unit_test(test_special_tokens),   cmocka_unit_test(test_ignore_merges),
        cmocka_unit_test(test_bad_files),        cmocka_unit_test(test_corrupted_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
