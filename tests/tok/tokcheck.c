/* tokcheck.c - compares our tokenizer with token ids from an independent implementation
 * (tests/tok/tok.mjs encode), token for token, and checks decode(encode(x)) == x.
 *
 *   tokcheck TOKENIZER.json CORPUS.json IDS.json    CORPUS: an array of documents (strings), IDS: an
 *                                                   array of arrays of ids, one per document
 *
 * Prints one summary line, and for the first few mismatching documents the first differing token
 * with the text around it. Exit status 0 when every document agrees and round-trips, 1 if not,
 * 2 on bad input. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json_util.h"
#include "formats/tokenizer.h"

static void show(const char *what, const tok *t, const int32_t *ids, size_t n, size_t at) {
    err_t err;
    size_t lo = at > 3 ? at - 3 : 0, hi = at + 4 < n ? at + 4 : n;
    printf("    %s:", what);
    for (size_t i = lo; i < hi; i++) {
        tok_text s = {0};
        if (tok_decode(t, ids + i, 1, &s, &err) < 0) printf(" %d(?)", ids[i]);
        else {
            printf(" %s%d'", i == at ? "*" : "", ids[i]);
            for (size_t k = 0; k < s.n; k++) {
                unsigned char c = (unsigned char)s.p[k];
                if (c < 0x20 || c == '\'') printf("\\x%02x", c);
                else putchar(c);
            }
            putchar('\'');
        }
        tok_text_free(&s);
    }
    putchar('\n');
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: tokcheck TOKENIZER.json CORPUS.json IDS.json\n");
        return 2;
    }
    err_t err;
    tok *t;
    cJSON *docs = NULL, *want = NULL;
    if (tok_load(&t, argv[1], &err) < 0 || !(docs = json_load_file(argv[2], &err)) ||
        !(want = json_load_file(argv[3], &err))) {
        fprintf(stderr, "tokcheck: %s\n", err.msg);
        return 2;
    }
    int n = cJSON_GetArraySize(docs), bad = 0, bad_rt = 0;
    if (!cJSON_IsArray(docs) || !cJSON_IsArray(want) || cJSON_GetArraySize(want) != n) {
        fprintf(stderr, "tokcheck: %s and %s must be arrays of the same length\n", argv[2], argv[3]);
        return 2;
    }
    long long bytes = 0, tokens = 0;
    const cJSON *d = docs->child, *w = want->child;
    for (int i = 0; i < n; i++, d = d->next, w = w->next) {
        const char *text = cJSON_IsString(d) ? d->valuestring : "";
        size_t len = strlen(text);
        tok_ids ids = {0};
        tok_encode(t, text, len, false, &ids);
        bytes += (long long)len;
        tokens += (long long)ids.n;
        int m = cJSON_GetArraySize(w);
        int32_t *ref = calloc((size_t)m + 1, sizeof *ref);
        int k = 0;
        for (const cJSON *e = w->child; e; e = e->next) ref[k++] = (int32_t)e->valuedouble;
        size_t at = 0;
        while (at < ids.n && at < (size_t)m && ids.v[at] == ref[at]) at++;
        if (at < ids.n || at < (size_t)m) {
            if (bad++ < 5) {
                printf("  document %d (%zu bytes): %zu tokens here, %d there; first difference at token %zu\n", i, len,
                       ids.n, m, at);
                show("ours  ", t, ids.v, ids.n, at);
                show("theirs", t, ref, (size_t)m, at);
            }
        }
        tok_text back = {0};
        if (tok_decode(t, ids.v, ids.n, &back, &err) < 0 || back.n != len || (len && memcmp(back.p, text, len))) {
            if (bad_rt++ < 5) printf("  document %d: decode(encode(x)) != x (%zu bytes back, %zu in)\n", i, back.n, len);
        }
        tok_text_free(&back);
        tok_ids_free(&ids);
        free(ref);
    }
    printf("%s: %d documents, %lld bytes, %lld tokens; %d differ from the reference, %d do not round-trip\n",
           argv[1], n, bytes, tokens, bad, bad_rt);
    cJSON_Delete(docs);
    cJSON_Delete(want);
    tok_free(t);
    return bad || bad_rt ? 1 : 0;
}
