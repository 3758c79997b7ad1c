/* tokenizer.h - BPE tokenizers read from a Hugging Face tokenizer.json (docs/tokenizer.md).
 *
 * Two families:
 *   TOK_BYTE_BPE  byte-level BPE (GPT-2, Llama-3): the text is split by the GPT-2 or the Llama-3
 *                 pre-tokenizer pattern (matched by hand-written code, no regex library), each
 *                 piece's bytes are mapped to the 256 byte characters and merged by rank.
 *   TOK_SP_BPE    SentencePiece-style BPE (Llama-2, TinyLlama): spaces become U+2581 "▁" and
 *                 one is prepended, characters are merged by rank, characters missing from the
 *                 vocabulary become <0xNN> byte tokens (byte fallback).
 *
 *   tok *t;
 *   if (tok_load(&t, "tokenizer.json", &err) < 0) ...        // err names the file and field
 *   tok_ids ids = {0};
 *   tok_encode(t, text, len, false, &ids);                    // appends to ids
 *   tok_text out = {0};
 *   tok_decode(t, ids.v, ids.n, &out, &err);                  // out.p, out.n: the bytes again
 *
 * decode(encode(x)) == x for every byte string x with TOK_BYTE_BPE, and for every byte string
 * without "▁" (E2 96 81) with TOK_SP_BPE (a "▁" in the input decodes as a space). Encoding keeps a
 * cache of recent words, so a tok is not shared between threads while encoding. */
#ifndef CEPHALO_TOKENIZER_H
#define CEPHALO_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

typedef enum { TOK_BYTE_BPE, TOK_SP_BPE } tok_kind;

typedef struct tok tok;

typedef struct tok_ids {
    int32_t *v;
    size_t n, cap;
} tok_ids;

typedef struct tok_text {
    char *p;
    size_t n, cap;
} tok_text;

/* Reads and checks a tokenizer.json; errors read "FILE: FIELD: problem". */
int tok_load(tok **out, const char *path, err_t *err);
/* The same from a document in memory; name is used in the messages. */
int tok_parse(tok **out, const char *name, const char *json, size_t len, err_t *err);
void tok_free(tok *t);

tok_kind tok_get_kind(const tok *t);
/* "byte-level BPE (GPT-2 pattern)", "SentencePiece BPE with byte fallback", ... */
const char *tok_describe(const tok *t);
/* The largest token id + 1 (model vocabulary and added tokens). */
int32_t tok_vocab_size(const tok *t);
/* The id of the token whose string (as tokenizer.json writes it, e.g. "</s>", "Ġthe") is s; -1. */
int32_t tok_find(const tok *t, const char *s);
/* The string of token id as tokenizer.json writes it (the inverse of tok_find), NULL if no token
 * has the id; a linear search. */
const char *tok_string(const tok *t, int32_t id);
/* The unknown token's id (model.unk_token), -1 if none. */
int32_t tok_unk(const tok *t);
/* The end-of-text and beginning-of-text tokens among the usual names ("<|endoftext|>",
 * "<|end_of_text|>", "</s>"; "<|begin_of_text|>", "<s>"), -1 if none. */
int32_t tok_eos(const tok *t);
int32_t tok_bos(const tok *t);

/* Appends the tokens of text[0..len) to out. With special, the added tokens' strings in the text
 * (e.g. "<|endoftext|>") become their ids; without, they are ordinary text. Never fails: bytes
 * that are not UTF-8 are encoded byte by byte. */
void tok_encode(tok *t, const char *text, size_t len, bool special, tok_ids *out);
/* Appends the bytes of ids[0..n) to out; an id outside the vocabulary is an error. */
int tok_decode(const tok *t, const int32_t *ids, size_t n, tok_text *out, err_t *err);

/* ---- identity: which tokenizer made a token stream (docs/tokenizer.md "Identity") ----
 * A hash over the tokenizer's canonical content, not over its file's formatting: the kind and
 * pre-tokenizer, every id's token string and whether it is an added token, and the merges in rank
 * order. Two tokenizer.json files that encode every text alike (key order, whitespace, merges as
 * "a b" or ["a", "b"]) have one identity. Shards, checkpoints and exports record it. */
typedef enum { TOKID_UNKNOWN = 0, TOKID_BYTES = 1, TOKID_BYTE_BPE = 2, TOKID_SP_BPE = 3 } tok_id_kind;
typedef struct tok_id {
    tok_id_kind kind; /* TOKID_UNKNOWN: not recorded (llm.c shards, older files) */
    int32_t vocab;    /* the tokenizer's vocabulary size (tok_vocab_size; 256 for bytes) */
    uint64_t hash;    /* 0 for TOKID_BYTES */
} tok_id;
#define TOK_ID_NAME_MAX 48
/* The identity of a loaded tokenizer; the identity of raw bytes (tokens 0..255, no tokenizer). */
tok_id tok_identity(const tok *t);
tok_id tok_id_bytes(void);
/* "bpe-50257-0123456789abcdef" (byte-level BPE), "sp-32000-..." (SentencePiece), "bytes-256",
 * "unknown". */
void tok_id_name(tok_id id, char out[TOK_ID_NAME_MAX]);
/* Parses a name as tok_id_name writes it ("unknown" too); -1 if it is not one. */
int tok_id_parse(const char *s, tok_id *id);
bool tok_id_equal(tok_id a, tok_id b);
/* Loads path and gives its identity. */
int tok_file_identity(const char *path, tok_id *id, err_t *err);

void tok_ids_push(tok_ids *ids, int32_t id);
void tok_ids_free(tok_ids *ids);
void tok_text_free(tok_text *s);

#endif
