/* fuzz_tokenizer.c - libFuzzer target for the tokenizers (worker/formats/tokenizer.c): the input up
 * to its first NUL byte is a tokenizer.json, the rest a text. A document that loads encodes the
 * text with and without special tokens, and the ids decode again; every id encode returns must be
 * in the vocabulary, and a byte-level tokenizer must give the text back byte for byte (docs/tokenizer.md,
 * "Round trips": when nothing prepends a space or normalizes the text). */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "formats/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Whether any member named key anywhere in o is true. */
static bool any_true(const cJSON *o, const char *key) {
    for (const cJSON *c = o ? o->child : NULL; c; c = c->next)
        if ((c->string && !strcmp(c->string, key) && cJSON_IsTrue(c)) || any_true(c, key)) return true;
    return false;
}

/* The documented round trip holds for this file: no prefix space added, no normalizer. */
static bool round_trips(const uint8_t *json, size_t len) {
    cJSON *doc = cJSON_ParseWithLength((const char *)json, len);
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(doc, "normalizer");
    bool ok = doc && (!norm || cJSON_IsNull(norm)) && !any_true(doc, "add_prefix_space");
    cJSON_Delete(doc);
    return ok;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t json_len = nul ? (size_t)(nul - data) : size;
    const char *text = nul ? (const char *)nul + 1 : "Hello, world! 123  \xc3\xa9\xe2\x96\x81 <|endoftext|>";
    size_t text_len = nul ? size - json_len - 1 : strlen(text);
    tok *t = NULL;
    err_t err;
    if (tok_parse(&t, "fuzz.json", (const char *)data, json_len, &err) < 0) return 0;
    bool check = tok_get_kind(t) == TOK_BYTE_BPE && round_trips(data, json_len);
    for (int special = 0; special < 2; special++) {
        tok_ids ids = {0};
        tok_encode(t, text, text_len, special, &ids);
        for (size_t i = 0; i < ids.n; i++)
            if (ids.v[i] < 0 || ids.v[i] >= tok_vocab_size(t)) abort();
        tok_text out = {0};
        int rc = tok_decode(t, ids.v, ids.n, &out, &err);
        if (rc < 0) abort(); /* its own ids always decode */
        if (!special && check && (out.n != text_len || memcmp(out.p, text, text_len)))
            abort();
        tok_text_free(&out);
        tok_ids_free(&ids);
    }
    tok_free(t);
    return 0;
}
