/* tokenizer.c - byte-level and SentencePiece-style BPE from a Hugging Face tokenizer.json
 * (tokenizer.h, docs/tokenizer.md).
 *
 * The pipeline, as the tokenizers library runs it: added tokens are split out (only when asked),
 * the rest is normalized (SentencePiece: "▁" prepended, spaces replaced), cut into words by the
 * pre-tokenizer, and each word is turned into symbols (byte-level: its bytes; SentencePiece: its
 * characters, or <0xNN> byte tokens for characters not in the vocabulary) that are merged pair
 * by pair, always the pair of lowest merge rank first and, among equal ranks, the leftmost. */
#include "formats/tokenizer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fileio.h"
#include "common/json_util.h"
#include "common/log.h"
#include "common/strutil.h"
#include "formats/unicode_tab.h"

/* ------------------------------------------------------------------------------------------ */
/* growable buffers                                                                            */

void tok_ids_push(tok_ids *o, int32_t id) {
    if (o->n == o->cap) o->v = xrealloc(o->v, sizeof *o->v * (o->cap = o->cap ? 2 * o->cap : 256));
    o->v[o->n++] = id;
}

static void text_add(tok_text *o, const void *p, size_t n) {
    if (o->n + n + 1 > o->cap) {
        while (o->n + n + 1 > o->cap) o->cap = o->cap ? 2 * o->cap : 256;
        o->p = xrealloc(o->p, o->cap);
    }
    memcpy(o->p + o->n, p, n);
    o->n += n;
    o->p[o->n] = '\0';
}

void tok_ids_free(tok_ids *ids) {
    free(ids->v);
    *ids = (tok_ids){0};
}

void tok_text_free(tok_text *s) {
    free(s->p);
    *s = (tok_text){0};
}

/* ------------------------------------------------------------------------------------------ */
/* hashing and the two hash tables: strings -> id, id pairs -> merge                           */

static uint64_t hash_bytes(const void *p, size_t n) {
    const uint8_t *s = p;
    uint64_t h = 0x9e3779b97f4a7c15ull ^ n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, n);
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
    return h ^ (h >> 29);
}

/* Open addressing, keys in a blob the table owns. */
typedef struct strmap {
    uint32_t *slot; /* entry index + 1, 0 = empty */
    size_t mask;
    char *blob;
    size_t blob_n, blob_cap;
    uint32_t *off, *len;
    int32_t *val;
    size_t n, cap;
} strmap;

static void sm_grow(strmap *m);

static int64_t sm_get(const strmap *m, const char *k, size_t n) {
    if (!m->slot) return -1;
    for (size_t i = hash_bytes(k, n) & m->mask;; i = (i + 1) & m->mask) {
        uint32_t e = m->slot[i];
        if (!e) return -1;
        e--;
        if (m->len[e] == n && !memcmp(m->blob + m->off[e], k, n)) return m->val[e];
    }
}

static void sm_insert_slot(strmap *m, uint32_t e) {
    for (size_t i = hash_bytes(m->blob + m->off[e], m->len[e]) & m->mask;; i = (i + 1) & m->mask)
        if (!m->slot[i]) {
            m->slot[i] = e + 1;
            return;
        }
}

/* Adds k -> v unless k is there; returns false when it was. */
static bool sm_put(strmap *m, const char *k, size_t n, int32_t v) {
    if (sm_get(m, k, n) >= 0) return false;
    if (2 * (m->n + 1) > m->mask + 1 || !m->slot) sm_grow(m);
    if (m->n == m->cap) {
        m->cap = m->cap ? 2 * m->cap : 1024;
        m->off = xrealloc(m->off, sizeof *m->off * m->cap);
        m->len = xrealloc(m->len, sizeof *m->len * m->cap);
        m->val = xrealloc(m->val, sizeof *m->val * m->cap);
    }
    if (m->blob_n + n + 1 > m->blob_cap) {
        while (m->blob_n + n + 1 > m->blob_cap) m->blob_cap = m->blob_cap ? 2 * m->blob_cap : 65536;
        m->blob = xrealloc(m->blob, m->blob_cap);
    }
    memcpy(m->blob + m->blob_n, k, n);
    m->blob[m->blob_n + n] = '\0';
    m->off[m->n] = (uint32_t)m->blob_n;
    m->len[m->n] = (uint32_t)n;
    m->val[m->n] = v;
    m->blob_n += n + 1;
    sm_insert_slot(m, (uint32_t)m->n++);
    return true;
}

static void sm_grow(strmap *m) {
    size_t size = m->slot ? 2 * (m->mask + 1) : 2048;
    free(m->slot);
    m->slot = xcalloc(size, sizeof *m->slot);
    m->mask = size - 1;
    for (size_t e = 0; e < m->n; e++) sm_insert_slot(m, (uint32_t)e);
}

static void sm_free(strmap *m) {
    free(m->slot);
    free(m->blob);
    free(m->off);
    free(m->len);
    free(m->val);
}

/* (left id, right id) -> (rank, merged id) */
typedef struct merge_ent {
    uint64_t key; /* left << 32 | right, + 1 so that 0 means empty */
    int32_t rank, id;
} merge_ent;

typedef struct mergemap {
    merge_ent *e;
    size_t mask, n;
} mergemap;

static uint64_t pair_key(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1; }
static size_t pair_hash(uint64_t k) { return (size_t)((k * 0x9e3779b97f4a7c15ull) >> 20); }

static const merge_ent *mm_get(const mergemap *m, int32_t a, int32_t b) {
    uint64_t k = pair_key(a, b);
    for (size_t i = pair_hash(k) & m->mask;; i = (i + 1) & m->mask) {
        if (m->e[i].key == k) return &m->e[i];
        if (!m->e[i].key) return NULL;
    }
}

static void mm_init(mergemap *m, size_t n) {
    size_t size = 1024;
    while (size < 2 * n + 2) size *= 2;
    m->e = xcalloc(size, sizeof *m->e);
    m->mask = size - 1;
    m->n = 0;
}

/* Keeps the first (lowest) rank of a pair listed twice, as the tokenizers library does. */
static void mm_put(mergemap *m, int32_t a, int32_t b, int32_t rank, int32_t id) {
    uint64_t k = pair_key(a, b);
    size_t i = pair_hash(k) & m->mask;
    while (m->e[i].key && m->e[i].key != k) i = (i + 1) & m->mask;
    if (m->e[i].key) return;
    m->e[i] = (merge_ent){k, rank, id};
    m->n++;
}

/* ------------------------------------------------------------------------------------------ */
/* the tokenizer                                                                               */

/* Token ids are below 2^24, the largest vocabulary a model file allows: the tables are per id. */
#define TOK_MAX_ID ((1 << 24) - 1)

typedef enum { PRE_NONE, PRE_GPT2, PRE_LLAMA3 } pre_kind;
/* SentencePiece words: the whole text (cut only where no merge can join), or also cut before
 * every "▁" (the Metaspace pre-tokenizer with split) */
typedef enum { SEG_WHOLE, SEG_METASPACE } seg_kind;

typedef struct added_tok {
    char *content;
    size_t len;
    int32_t id;
} added_tok;

/* A direct-mapped cache of recent words: a word's bytes -> its tokens. Words longer than
 * CACHE_KEY bytes or with more than CACHE_IDS tokens are not cached. */
#define CACHE_SLOTS (1 << 16)
#define CACHE_KEY 30
#define CACHE_IDS 15
typedef struct cache_ent {
    uint8_t klen, nids;
    char key[CACHE_KEY];
    int32_t ids[CACHE_IDS];
} cache_ent;

struct tok {
    tok_kind kind;
    pre_kind pre;
    seg_kind seg;
    bool add_prefix_space; /* byte-level: a space before text that does not start with one */
    bool ignore_merges;    /* a word that is a vocabulary token is that token */
    bool sp_prepend;       /* SentencePiece: "▁" before the text */
    bool sp_strip;         /* decoding: drop the first space (the prepended one) */
    bool fuse_unk;         /* consecutive <unk> are one */
    int32_t n_ids, unk;
    strmap vocab;          /* token string -> id (model vocabulary and added tokens) */
    mergemap merges;
    mergemap joins;        /* (last character of a merge's left, first of its right) code points */
    int32_t byte_id[256];  /* byte-level: the token of each byte; SP: <0xNN> (or -1) */
    char *dec_blob;        /* each id's decoded bytes */
    uint32_t *dec_off, *dec_len;
    added_tok *added;
    int n_added;
    uint8_t added_first[256]; /* some added token starts with this byte */
    mergemap added_next;      /* the added tokens' trie: (node, byte) -> node, the root 0 */
    int32_t *added_end;       /* per node: the added token that ends there, or -1 */
    cache_ent *cache;
    char desc[96];
    uint64_t ident; /* tok_identity's hash, computed at load */
    /* scratch for one word */
    int32_t *sym_id, *sym_prev, *sym_next;
    size_t sym_cap;
    struct heap_ent *heap;
    size_t heap_cap;
    char *norm;
    size_t norm_cap;
};

tok_kind tok_get_kind(const tok *t) { return t->kind; }
const char *tok_describe(const tok *t) { return t->desc; }
int32_t tok_vocab_size(const tok *t) { return t->n_ids; }

int32_t tok_find(const tok *t, const char *s) { return (int32_t)sm_get(&t->vocab, s, strlen(s)); }

const char *tok_string(const tok *t, int32_t id) {
    for (size_t e = 0; e < t->vocab.n; e++)
        if (t->vocab.val[e] == id) return t->vocab.blob + t->vocab.off[e];
    return NULL;
}

int32_t tok_unk(const tok *t) { return t->unk; }

static int32_t find_first(const tok *t, const char *const *names) {
    for (int i = 0; names[i]; i++) {
        int32_t id = tok_find(t, names[i]);
        if (id >= 0) return id;
    }
    return -1;
}

int32_t tok_eos(const tok *t) {
    static const char *const names[] = {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", NULL};
    return find_first(t, names);
}

int32_t tok_bos(const tok *t) {
    static const char *const names[] = {"<|begin_of_text|>", "<s>", "<|startoftext|>", "<bos>", NULL};
    return find_first(t, names);
}

void tok_free(tok *t) {
    if (!t) return;
    sm_free(&t->vocab);
    free(t->merges.e);
    free(t->joins.e);
    free(t->dec_blob);
    free(t->dec_off);
    free(t->dec_len);
    for (int i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    free(t->added_next.e);
    free(t->added_end);
    free(t->cache);
    free(t->sym_id);
    free(t->sym_prev);
    free(t->sym_next);
    free(t->heap);
    free(t->norm);
    free(t);
}

/* ------------------------------------------------------------------------------------------ */
/* UTF-8 and the character classes                                                             */

/* The code point at s[0..n) (n >= 1) and its length; a byte that does not start a valid,
 * shortest-form sequence is a "character" of its own, code point -1 (no class). */
static int32_t utf8_next(const uint8_t *s, size_t n, int *len) {
    uint8_t c = s[0];
    *len = 1;
    if (c < 0x80) return c;
    int k;
    int32_t cp, min;
    if (c >= 0xc2 && c <= 0xdf) k = 1, cp = c & 0x1f, min = 0x80;
    else if (c >= 0xe0 && c <= 0xef) k = 2, cp = c & 0x0f, min = 0x800;
    else if (c >= 0xf0 && c <= 0xf4) k = 3, cp = c & 0x07, min = 0x10000;
    else return -1;
    if ((size_t)k >= n) return -1;
    for (int i = 1; i <= k; i++) {
        if ((s[i] & 0xc0) != 0x80) return -1;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp < 0xe000)) return -1;
    *len = k + 1;
    return cp;
}

static bool in_ranges(const uni_range *r, int n, int32_t cp) {
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if ((uint32_t)cp < r[mid].lo) hi = mid - 1;
        else if ((uint32_t)cp > r[mid].hi) lo = mid + 1;
        else return true;
    }
    return false;
}

enum { C_OTHER = 0, C_LETTER = 1, C_NUMBER = 2, C_SPACE = 4, C_NEWLINE = 8 };

static uint8_t ascii_class[128];

static void init_ascii_class(void) {
    for (int c = 0; c < 128; c++) {
        uint8_t k = C_OTHER;
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) k = C_LETTER;
        else if (c >= '0' && c <= '9') k = C_NUMBER;
        else if (c == ' ' || (c >= 9 && c <= 13)) k = C_SPACE;
        if (c == '\r' || c == '\n') k |= C_NEWLINE;
        ascii_class[c] = k;
    }
}

static int char_class(int32_t cp) {
    if (cp < 0) return C_OTHER;
    if (cp < 128) return ascii_class[cp];
    if (in_ranges(uni_letter_ranges, uni_letter_count, cp)) return C_LETTER;
    if (in_ranges(uni_number_ranges, uni_number_count, cp)) return C_NUMBER;
    if (in_ranges(uni_space_ranges, uni_space_count, cp)) return C_SPACE;
    return C_OTHER;
}

/* A cursor over the text: the class and length of the character at i. */
typedef struct cur {
    const uint8_t *s;
    size_t n;
} cur;

static int cls_at(const cur *c, size_t i, int *len) {
    if (i >= c->n) {
        *len = 0;
        return -1;
    }
    if (c->s[i] < 0x80) {
        *len = 1;
        return ascii_class[c->s[i]];
    }
    return char_class(utf8_next(c->s + i, c->n - i, len));
}

/* End of the run of characters whose class has a bit of mask, from i. */
static size_t run_of(const cur *c, size_t i, int mask) {
    int len, k;
    while ((k = cls_at(c, i, &len)) >= 0 && (k & mask)) i += (size_t)len;
    return i;
}

/* End of the run of "other" characters (not letter, number or space), from i. */
static size_t run_other(const cur *c, size_t i) {
    int len, k;
    while ((k = cls_at(c, i, &len)) >= 0 && !(k & (C_LETTER | C_NUMBER | C_SPACE))) i += (size_t)len;
    return i;
}

/* ------------------------------------------------------------------------------------------ */
/* the pre-tokenizer patterns, matched by hand                                                 */

/* 's 't 're 've 'm 'll 'd at i (case-insensitive when nocase): the match's end, or 0. */
static size_t contraction(const cur *c, size_t i, bool nocase) {
    if (c->s[i] != '\'' || i + 1 >= c->n) return 0;
    char a = (char)c->s[i + 1], b = i + 2 < c->n ? (char)c->s[i + 2] : 0;
    if (nocase) {
        if (a >= 'A' && a <= 'Z') a = (char)(a - 'A' + 'a');
        if (b >= 'A' && b <= 'Z') b = (char)(b - 'A' + 'a');
    }
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    return 0;
}

/* \s+(?!\S) then \s+, from i where a space starts. At the end of the text: the whole run. Before
 * a non-space, \s+ backtracks one character so that a space follows: the run less its last
 * character (which then starts the next word, " word"); a run of one is matched by \s+ alone. */
static size_t space_run(const cur *c, size_t i) {
    size_t end = run_of(c, i, C_SPACE);
    if (end >= c->n) return end;
    size_t last = i; /* the start of the run's last character */
    for (size_t p = i; p < end;) {
        int len;
        cls_at(c, p, &len);
        last = p;
        p += (size_t)len;
    }
    return last > i ? last : end;
}

/* GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t gpt2_word(const cur *c, size_t i) {
    size_t e = contraction(c, i, false);
    if (e) return e;
    int len, k = cls_at(c, i, &len);
    size_t j = i;
    if (c->s[i] == ' ') { /* " ?" then a letter, number or other run */
        int len2, k2 = cls_at(c, i + 1, &len2);
        if (k2 >= 0 && !(k2 & C_SPACE)) j = i + 1, k = k2;
    }
    if (k & C_LETTER) return run_of(c, j, C_LETTER);
    if (k & C_NUMBER) return run_of(c, j, C_NUMBER);
    if (!(k & C_SPACE)) return run_other(c, j);
    return space_run(c, i);
}

/* Llama-3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}
 *          | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
static size_t llama3_word(const cur *c, size_t i) {
    size_t e = contraction(c, i, true);
    if (e) return e;
    int len, k = cls_at(c, i, &len);
    if (k & C_LETTER) return run_of(c, i, C_LETTER);
    if (!(k & (C_NUMBER | C_NEWLINE))) { /* one character that is not \r \n L N, then letters */
        int len2, k2 = cls_at(c, i + (size_t)len, &len2);
        if (k2 >= 0 && (k2 & C_LETTER)) return run_of(c, i + (size_t)len, C_LETTER);
    }
    if (k & C_NUMBER) { /* at most three */
        size_t j = i;
        for (int n = 0, kj; n < 3 && (kj = cls_at(c, j, &len)) >= 0 && (kj & C_NUMBER); n++) j += (size_t)len;
        return j;
    }
    size_t j = i;
    if (c->s[i] == ' ') {
        int len2, k2 = cls_at(c, i + 1, &len2);
        if (k2 >= 0 && !(k2 & (C_SPACE | C_LETTER | C_NUMBER))) j = i + 1, k = k2;
    }
    if (!(k & (C_SPACE | C_LETTER | C_NUMBER))) { /* ?[^\s\p{L}\p{N}]+[\r\n]* */
        j = run_other(c, j);
        while (j < c->n && (c->s[j] == '\r' || c->s[j] == '\n')) j++;
        return j;
    }
    /* \s*[\r\n]+: the run up to its last \r or \n, and the \r \n that follow it */
    size_t end = run_of(c, i, C_SPACE), nl = 0;
    for (size_t p = i; p < end; p++)
        if (c->s[p] == '\r' || c->s[p] == '\n') nl = p + 1;
    if (nl) return nl;
    return space_run(c, i);
}

/* ------------------------------------------------------------------------------------------ */
/* BPE on one word                                                                             */

typedef struct heap_ent {
    int32_t rank, pos, left, right;
} heap_ent;

static bool heap_less(const heap_ent *a, const heap_ent *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(tok *t, size_t *n, heap_ent e) {
    if (*n == t->heap_cap) t->heap = xrealloc(t->heap, sizeof *t->heap * (t->heap_cap = t->heap_cap ? 2 * t->heap_cap : 64));
    size_t i = (*n)++;
    while (i > 0 && heap_less(&e, &t->heap[(i - 1) / 2])) {
        t->heap[i] = t->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    t->heap[i] = e;
}

static heap_ent heap_pop(tok *t, size_t *n) {
    heap_ent top = t->heap[0], last = t->heap[--*n];
    size_t i = 0;
    for (;;) {
        size_t k = 2 * i + 1;
        if (k >= *n) break;
        if (k + 1 < *n && heap_less(&t->heap[k + 1], &t->heap[k])) k++;
        if (!heap_less(&t->heap[k], &last)) break;
        t->heap[i] = t->heap[k];
        i = k;
    }
    if (*n) t->heap[i] = last;
    return top;
}

static void sym_reserve(tok *t, size_t n) {
    if (n <= t->sym_cap) return;
    while (t->sym_cap < n) t->sym_cap = t->sym_cap ? 2 * t->sym_cap : 256;
    t->sym_id = xrealloc(t->sym_id, sizeof *t->sym_id * t->sym_cap);
    t->sym_prev = xrealloc(t->sym_prev, sizeof *t->sym_prev * t->sym_cap);
    t->sym_next = xrealloc(t->sym_next, sizeof *t->sym_next * t->sym_cap);
}

static void push_pair(tok *t, size_t *hn, int32_t pos) {
    if (pos < 0) return;
    int32_t nx = t->sym_next[pos];
    if (nx < 0) return;
    const merge_ent *m = mm_get(&t->merges, t->sym_id[pos], t->sym_id[nx]);
    if (m) heap_push(t, hn, (heap_ent){m->rank, pos, t->sym_id[pos], t->sym_id[nx]});
}

/* Merges t->sym_id[0..n) (n >= 1) and appends the result. */
static void bpe_merge(tok *t, size_t n, tok_ids *out) {
    for (size_t i = 0; i < n; i++) {
        t->sym_prev[i] = (int32_t)i - 1;
        t->sym_next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    size_t hn = 0;
    for (size_t i = 0; i + 1 < n; i++) push_pair(t, &hn, (int32_t)i);
    while (hn) {
        heap_ent e = heap_pop(t, &hn);
        int32_t nx = t->sym_next[e.pos];
        if (t->sym_id[e.pos] != e.left || nx < 0 || t->sym_id[nx] != e.right) continue; /* stale */
        t->sym_id[e.pos] = mm_get(&t->merges, e.left, e.right)->id;
        t->sym_id[nx] = -1;
        t->sym_next[e.pos] = t->sym_next[nx];
        if (t->sym_next[nx] >= 0) t->sym_prev[t->sym_next[nx]] = e.pos;
        push_pair(t, &hn, t->sym_prev[e.pos]);
        push_pair(t, &hn, e.pos);
    }
    for (int32_t i = 0; i >= 0; i = t->sym_next[i]) tok_ids_push(out, t->sym_id[i]);
}

/* The initial symbols of a word: byte-level, one per byte; SentencePiece, one per character in
 * the vocabulary, else its bytes' <0xNN> tokens (or <unk>, fused with a preceding <unk>). */
static size_t word_symbols(tok *t, const uint8_t *w, size_t n) {
    sym_reserve(t, n + 1);
    size_t k = 0;
    if (t->kind == TOK_BYTE_BPE) {
        for (size_t i = 0; i < n; i++) t->sym_id[k++] = t->byte_id[w[i]];
        return k;
    }
    for (size_t i = 0; i < n;) {
        int len;
        utf8_next(w + i, n - i, &len);
        int64_t id = sm_get(&t->vocab, (const char *)w + i, (size_t)len);
        if (id >= 0) t->sym_id[k++] = (int32_t)id;
        else
            for (int b = 0; b < len; b++) {
                int32_t bid = t->byte_id[w[i + (size_t)b]];
                if (bid < 0) {
                    if (t->fuse_unk && k && t->sym_id[k - 1] == t->unk) continue;
                    bid = t->unk;
                }
                t->sym_id[k++] = bid;
            }
        i += (size_t)len;
    }
    return k;
}

static void byte_level_string(const tok *t, const uint8_t *w, size_t n, tok_text *s);

/* Encodes one word, through the cache. */
static void encode_word(tok *t, const uint8_t *w, size_t n, tok_ids *out) {
    if (!n) return;
    cache_ent *ce = NULL;
    if (n <= CACHE_KEY) {
        ce = &t->cache[hash_bytes(w, n) & (CACHE_SLOTS - 1)];
        if (ce->klen == n && !memcmp(ce->key, w, n)) {
            for (int i = 0; i < ce->nids; i++) tok_ids_push(out, ce->ids[i]);
            return;
        }
    }
    size_t first = out->n;
    bool done = false;
    if (t->ignore_merges) {
        int64_t id;
        if (t->kind == TOK_BYTE_BPE) {
            char buf[4 * CACHE_KEY];
            tok_text s = {0};
            if (2 * n + 3 <= sizeof buf) { /* each byte maps to a 1- or 2-byte character */
                s.p = buf;
                s.cap = sizeof buf;
                byte_level_string(t, w, n, &s);
                id = sm_get(&t->vocab, s.p, s.n);
            } else {
                byte_level_string(t, w, n, &s);
                id = sm_get(&t->vocab, s.p, s.n);
                free(s.p);
            }
        } else {
            id = sm_get(&t->vocab, (const char *)w, n);
        }
        if (id >= 0) tok_ids_push(out, (int32_t)id), done = true;
    }
    if (!done) {
        size_t k = word_symbols(t, w, n);
        if (k) bpe_merge(t, k, out);
    }
    if (ce && out->n - first <= CACHE_IDS) {
        ce->klen = (uint8_t)n;
        memcpy(ce->key, w, n);
        ce->nids = (uint8_t)(out->n - first);
        memcpy(ce->ids, out->v + first, sizeof *ce->ids * ce->nids);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* encoding                                                                                    */

static const char SP_SPACE[] = "\xe2\x96\x81"; /* U+2581 "▁" */

/* SentencePiece: "▁" + text with ' ' -> "▁", into t->norm. */
static size_t sp_normalize(tok *t, const uint8_t *s, size_t n) {
    size_t need = 3 * n + 3;
    if (need > t->norm_cap) t->norm = xrealloc(t->norm, t->norm_cap = need);
    size_t k = 0;
    if (t->sp_prepend && n) memcpy(t->norm, SP_SPACE, 3), k = 3;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') memcpy(t->norm + k, SP_SPACE, 3), k += 3;
        else t->norm[k++] = (char)s[i];
    }
    return k;
}

static bool is_sp_space(const uint8_t *s, size_t n, size_t i) {
    return i + 3 <= n && s[i] == 0xe2 && s[i + 1] == 0x96 && s[i + 2] == 0x81;
}

/* The words of normalized SentencePiece text. BPE never joins two neighbouring characters c1 c2
 * unless some merge's left part ends in c1 and its right part starts in c2 (the first merge across
 * a boundary is such a merge), so the text can be cut wherever no merge does: the result is the
 * same as merging the whole text, and the pieces are short enough for the word cache (in Llama-2's
 * vocabulary: before each "▁" after another character, around newlines, ...). SEG_METASPACE also
 * cuts before every "▁" (the Metaspace pre-tokenizer with split). */
/* A word, its leading <unk> fused with a trailing one of the word before (the cut did not change
 * what fuse_unk does to the whole text). */
static void sp_word(tok *t, const uint8_t *w, size_t n, tok_ids *out) {
    size_t before = out->n;
    encode_word(t, w, n, out);
    if (t->fuse_unk && before > 0 && out->n > before && out->v[before] == t->unk && out->v[before - 1] == t->unk) {
        memmove(out->v + before, out->v + before + 1, sizeof *out->v * (out->n - before - 1));
        out->n--;
    }
}

static void sp_encode_segment(tok *t, const uint8_t *s, size_t n, tok_ids *out) {
    size_t start = 0;
    int len;
    int32_t prev = utf8_next(s, n, &len);
    for (size_t i = (size_t)len; i < n; i += (size_t)len) {
        int32_t c = utf8_next(s + i, n - i, &len);
        bool cut = (t->seg == SEG_METASPACE && c == 0x2581) || prev < 0 || c < 0 || !mm_get(&t->joins, prev, c);
        prev = c;
        if (!cut) continue;
        sp_word(t, s + start, i - start, out);
        start = i;
    }
    sp_word(t, s + start, n - start, out);
}

static void encode_segment(tok *t, const uint8_t *s, size_t n, tok_ids *out) {
    if (!n) return;
    if (t->kind == TOK_SP_BPE) {
        size_t k = sp_normalize(t, s, n);
        sp_encode_segment(t, (const uint8_t *)t->norm, k, out);
        return;
    }
    uint8_t *tmp = NULL;
    if (t->add_prefix_space && s[0] != ' ') {
        tmp = xmalloc(n + 1);
        tmp[0] = ' ';
        memcpy(tmp + 1, s, n);
        s = tmp;
        n++;
    }
    cur c = {s, n};
    for (size_t i = 0; i < n;) {
        size_t e = t->pre == PRE_LLAMA3 ? llama3_word(&c, i) : t->pre == PRE_GPT2 ? gpt2_word(&c, i) : n;
        if (e <= i) e = i + 1; /* cannot happen: every character matches some alternative */
        encode_word(t, s + i, e - i, out);
        i = e;
    }
    free(tmp);
}

/* The added token that starts at s[0..n), longest first; -1. One walk down the trie, at most the
 * longest token's length: not a comparison with each added token at every place of the text. */
static int added_at(const tok *t, const uint8_t *s, size_t n) {
    int best = -1;
    int32_t at = 0;
    for (size_t k = 0; k < n; k++) {
        const merge_ent *e = mm_get(&t->added_next, at, s[k]);
        if (!e) break;
        at = e->id;
        if (t->added_end[at] >= 0) best = t->added_end[at];
    }
    return best;
}

void tok_encode(tok *t, const char *text, size_t len, bool special, tok_ids *out) {
    const uint8_t *s = (const uint8_t *)text;
    if (!special || !t->n_added) {
        encode_segment(t, s, len, out);
        return;
    }
    size_t start = 0;
    for (size_t i = 0; i < len;) {
        int a = t->added_first[s[i]] ? added_at(t, s + i, len - i) : -1;
        if (a < 0) {
            i++;
            continue;
        }
        encode_segment(t, s + start, i - start, out);
        tok_ids_push(out, t->added[a].id);
        i += t->added[a].len;
        start = i;
    }
    encode_segment(t, s + start, len - start, out);
}

/* ------------------------------------------------------------------------------------------ */
/* decoding                                                                                    */

int tok_decode(const tok *t, const int32_t *ids, size_t n, tok_text *out, err_t *err) {
    size_t first = out->n;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_ids)
            return err_set(err, "token %zu is %d, outside the vocabulary (0..%d)", i, ids[i], t->n_ids - 1);
        text_add(out, t->dec_blob + t->dec_off[ids[i]], t->dec_len[ids[i]]);
    }
    if (t->sp_strip && out->n > first && out->p[first] == ' ') { /* the prepended "▁" */
        memmove(out->p + first, out->p + first + 1, out->n - first - 1);
        out->p[--out->n] = '\0';
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* loading: the byte-level alphabet                                                            */

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes
 * for U+0100.. in byte order. */
static int32_t byte_char(int b) {
    if ((b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff)) return b;
    int n = 0;
    for (int x = 0; x < b; x++)
        if (!((x >= '!' && x <= '~') || (x >= 0xa1 && x <= 0xac) || (x >= 0xae && x <= 0xff))) n++;
    return 256 + n;
}

static size_t utf8_put(char *o, int32_t cp) {
    if (cp < 0x80) return o[0] = (char)cp, 1;
    if (cp < 0x800) return o[0] = (char)(0xc0 | cp >> 6), o[1] = (char)(0x80 | (cp & 0x3f)), 2;
    if (cp < 0x10000)
        return o[0] = (char)(0xe0 | cp >> 12), o[1] = (char)(0x80 | ((cp >> 6) & 0x3f)), o[2] = (char)(0x80 | (cp & 0x3f)), 3;
    o[0] = (char)(0xf0 | cp >> 18);
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

static char byte_chars[256][3];
static uint8_t byte_chars_len[256];
static int16_t char_byte[324]; /* code point (< 324) -> byte, -1 */

static void init_tables(void) {
    static bool done;
    if (done) return; /* idempotent: the same values each time */
    init_ascii_class();
    for (int c = 0; c < 324; c++) char_byte[c] = -1;
    for (int b = 0; b < 256; b++) {
        int32_t cp = byte_char(b);
        byte_chars_len[b] = (uint8_t)utf8_put(byte_chars[b], cp);
        char_byte[cp] = (int16_t)b;
    }
    done = true;
}

static void byte_level_string(const tok *t, const uint8_t *w, size_t n, tok_text *s) {
    (void)t;
    for (size_t i = 0; i < n; i++) {
        if (s->n + 3 <= s->cap) { /* fast path: room (text_add reallocates otherwise) */
            memcpy(s->p + s->n, byte_chars[w[i]], byte_chars_len[w[i]]);
            s->n += byte_chars_len[w[i]];
        } else {
            text_add(s, byte_chars[w[i]], byte_chars_len[w[i]]);
        }
    }
}

/* A byte-level token string back to bytes; false if it has a character outside the alphabet. */
static bool byte_level_decode(const char *s, size_t n, tok_text *out) {
    for (size_t i = 0; i < n;) {
        int len;
        int32_t cp = utf8_next((const uint8_t *)s + i, n - i, &len);
        if (cp < 0 || cp >= 324 || char_byte[cp] < 0) return false;
        uint8_t b = (uint8_t)char_byte[cp];
        text_add(out, &b, 1);
        i += (size_t)len;
    }
    return true;
}

/* "<0x41>" -> 0x41, else -1 */
static int byte_token(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* ------------------------------------------------------------------------------------------ */
/* loading: tokenizer.json                                                                     */

#define GPT2_PATTERN "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define LLAMA3_PATTERN                                                                                               \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|" \
    "\\s+(?!\\S)|\\s+"

typedef struct loader {
    json_ctx c;
    tok *t;
    bool byte_level, sp_space;
} loader;

static int need_type(loader *L, const cJSON *o, const char *path, const char **type) {
    if (json_expect_object(&L->c, o, path) < 0) return -1;
    const cJSON *ty;
    if (json_require(&L->c, o, path, "type", &ty) < 0) return -1;
    char *p = str_printf("%s.type", path); /* Sequences nest: a field path has no bound */
    int rc = json_string(&L->c, ty, p, type);
    free(p);
    return rc;
}

static bool get_bool(const cJSON *o, const char *key, bool dflt) {
    const cJSON *v = json_get(o, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

/* A Split pre-tokenizer: one of the two known patterns, behavior Isolated, not inverted. */
static int load_split(loader *L, const cJSON *o, const char *path) {
    const cJSON *pat = json_get(o, "pattern"), *re = json_get(pat, "Regex");
    const cJSON *b = json_get(o, "behavior");
    const char *beh = cJSON_IsString(b) ? b->valuestring : "";
    if (!cJSON_IsString(re))
        return err_set(L->c.err, "%s: %s.pattern: expected {\"Regex\": \"...\"} (a Split on a string is not supported)",
                       L->c.file, path);
    if (!strcmp(re->valuestring, LLAMA3_PATTERN)) L->t->pre = PRE_LLAMA3;
    else if (!strcmp(re->valuestring, GPT2_PATTERN)) L->t->pre = PRE_GPT2;
    else
        return err_set(L->c.err,
                       "%s: %s.pattern.Regex: unsupported pattern \"%.60s%s\" (supported: the GPT-2 and the Llama-3 "
                       "pre-tokenizer patterns; docs/tokenizer.md)",
                       L->c.file, path, re->valuestring, strlen(re->valuestring) > 60 ? "..." : "");
    if (strcmp(beh, "Isolated") || get_bool(o, "invert", false))
        return err_set(L->c.err, "%s: %s: expected behavior \"Isolated\" and invert false, got \"%s\"", L->c.file, path,
                       beh);
    return 0;
}

static int load_pre(loader *L, const cJSON *o, const char *path);

static int load_pre_one(loader *L, const cJSON *o, const char *path) {
    const char *type;
    if (need_type(L, o, path, &type) < 0) return -1;
    if (!strcmp(type, "Sequence")) return load_pre(L, json_get(o, "pretokenizers"), path);
    if (!strcmp(type, "Split")) return load_split(L, o, path);
    if (!strcmp(type, "ByteLevel")) {
        L->byte_level = true;
        L->t->add_prefix_space = get_bool(o, "add_prefix_space", false);
        if (get_bool(o, "use_regex", true)) {
            if (L->t->pre != PRE_NONE)
                return err_set(L->c.err, "%s: %s: a ByteLevel with use_regex after a Split (two patterns)", L->c.file,
                               path);
            L->t->pre = PRE_GPT2;
        }
        return 0;
    }
    if (!strcmp(type, "Metaspace")) {
        const cJSON *r = json_get(o, "replacement"), *ps = json_get(o, "prepend_scheme");
        if (cJSON_IsString(r) && strcmp(r->valuestring, SP_SPACE))
            return err_set(L->c.err, "%s: %s.replacement: expected \"\xe2\x96\x81\", got \"%s\"", L->c.file, path,
                           r->valuestring);
        const char *scheme = cJSON_IsString(ps) ? ps->valuestring : get_bool(o, "add_prefix_space", true) ? "always" : "never";
        if (strcmp(scheme, "always") && strcmp(scheme, "first") && strcmp(scheme, "never"))
            return err_set(L->c.err, "%s: %s.prepend_scheme: expected \"always\", \"first\" or \"never\", got \"%s\"",
                           L->c.file, path, scheme);
        L->sp_space = true;
        L->t->sp_prepend = strcmp(scheme, "never") != 0;
        L->t->seg = get_bool(o, "split", true) ? SEG_METASPACE : SEG_WHOLE;
        return 0;
    }
    return err_set(L->c.err, "%s: %s.type: unsupported pre-tokenizer \"%s\" (supported: ByteLevel, Split with the "
                             "GPT-2 or Llama-3 pattern, Metaspace, Sequence of those)",
                   L->c.file, path, type);
}

static int load_pre(loader *L, const cJSON *o, const char *path) {
    if (!o || cJSON_IsNull(o)) return 0;
    if (!cJSON_IsArray(o)) return load_pre_one(L, o, path);
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, o) { /* one pass: cJSON_GetArrayItem walks the list from its start */
        char *p = str_printf("%s.pretokenizers[%d]", path, i++); /* as in need_type */
        int rc = load_pre_one(L, e, p);
        free(p);
        if (rc < 0) return -1;
    }
    return 0;
}

/* Normalizers: SentencePiece's Prepend("▁") and Replace(" ", "▁"), nothing else. */
static int load_norm_one(loader *L, const cJSON *o, const char *path) {
    const char *type;
    if (need_type(L, o, path, &type) < 0) return -1;
    if (!strcmp(type, "Sequence")) {
        const cJSON *a = json_get(o, "normalizers"), *e;
        if (!cJSON_IsArray(a)) return err_set(L->c.err, "%s: %s.normalizers: expected an array", L->c.file, path);
        int i = 0;
        cJSON_ArrayForEach(e, a) {
            char *p = str_printf("%s.normalizers[%d]", path, i++); /* as in need_type */
            int rc = load_norm_one(L, e, p);
            free(p);
            if (rc < 0) return -1;
        }
        return 0;
    }
    if (!strcmp(type, "Prepend")) {
        const cJSON *p = json_get(o, "prepend");
        if (!cJSON_IsString(p) || strcmp(p->valuestring, SP_SPACE))
            return err_set(L->c.err, "%s: %s.prepend: expected \"\xe2\x96\x81\"", L->c.file, path);
        L->t->sp_prepend = true;
        L->sp_space = true;
        return 0;
    }
    if (!strcmp(type, "Replace")) {
        const cJSON *s = json_get(json_get(o, "pattern"), "String"), *ct = json_get(o, "content");
        if (!cJSON_IsString(s) || strcmp(s->valuestring, " ") || !cJSON_IsString(ct) || strcmp(ct->valuestring, SP_SPACE))
            return err_set(L->c.err, "%s: %s: only Replace {\"String\": \" \"} -> \"\xe2\x96\x81\" is supported",
                           L->c.file, path);
        L->sp_space = true;
        return 0;
    }
    return err_set(L->c.err, "%s: %s.type: unsupported normalizer \"%s\" (supported: SentencePiece's Prepend and "
                             "Replace of spaces by \"\xe2\x96\x81\")",
                   L->c.file, path, type);
}

/* Decoders: checked for what they are, the behaviour follows from the family. */
static int load_dec_one(loader *L, const cJSON *o, const char *path) {
    const char *type;
    if (need_type(L, o, path, &type) < 0) return -1;
    if (!strcmp(type, "Sequence")) {
        const cJSON *a = json_get(o, "decoders"), *e;
        if (!cJSON_IsArray(a)) return err_set(L->c.err, "%s: %s.decoders: expected an array", L->c.file, path);
        int i = 0;
        cJSON_ArrayForEach(e, a) {
            char *p = str_printf("%s.decoders[%d]", path, i++); /* as in need_type */
            int rc = load_dec_one(L, e, p);
            free(p);
            if (rc < 0) return -1;
        }
        return 0;
    }
    if (!strcmp(type, "Strip")) {
        const cJSON *st = json_get(o, "start");
        L->t->sp_strip = cJSON_IsNumber(st) && st->valuedouble >= 1;
        return 0;
    }
    if (!strcmp(type, "Metaspace")) {
        const cJSON *ps = json_get(o, "prepend_scheme");
        L->t->sp_strip = !(cJSON_IsString(ps) && !strcmp(ps->valuestring, "never")) && get_bool(o, "add_prefix_space", true);
        return 0;
    }
    if (!strcmp(type, "ByteLevel") || !strcmp(type, "ByteFallback") || !strcmp(type, "Fuse") || !strcmp(type, "Replace"))
        return 0;
    return err_set(L->c.err, "%s: %s.type: unsupported decoder \"%s\"", L->c.file, path, type);
}

static int load_vocab(loader *L, const cJSON *model) {
    const cJSON *vocab;
    int n;
    if (json_require(&L->c, model, "model", "vocab", &vocab) < 0) return -1;
    if (!cJSON_IsObject(vocab))
        return err_set(L->c.err, "%s: model.vocab: expected an object {\"token\": id, ...}, got %s", L->c.file,
                       json_type_name(vocab));
    n = cJSON_GetArraySize(vocab);
    if (n < 1) return err_set(L->c.err, "%s: model.vocab: empty", L->c.file);
    for (const cJSON *e = vocab->child; e; e = e->next) {
        double v = cJSON_IsNumber(e) ? e->valuedouble : -1;
        if (v < 0 || v > TOK_MAX_ID || v != (double)(int32_t)v)
            return err_set(L->c.err, "%s: model.vocab[\"%.80s\"]: expected a token id in 0..%d, got %s", L->c.file,
                           e->string, TOK_MAX_ID, cJSON_IsNumber(e) ? "another number" : json_type_name(e));
        if (!sm_put(&L->t->vocab, e->string, strlen(e->string), (int32_t)v)) /* json_parse refuses it first */
            return err_set(L->c.err, "%s: model.vocab: the token \"%.80s\" is listed twice", L->c.file, e->string);
        if ((int32_t)v + 1 > L->t->n_ids) L->t->n_ids = (int32_t)v + 1;
    }
    return 0;
}

/* The first and the last code point of a token string (-1 for bytes that are not UTF-8). */
static int32_t first_char(const char *s, size_t n) {
    int len;
    return utf8_next((const uint8_t *)s, n, &len);
}

static int32_t last_char(const char *s, size_t n) {
    size_t i = n - 1;
    while (i > 0 && n - i < 4 && ((uint8_t)s[i] & 0xc0) == 0x80) i--;
    int len;
    int32_t c = utf8_next((const uint8_t *)s + i, n - i, &len);
    return i + (size_t)len == n ? c : -1;
}

/* One merge: "A B" or ["A", "B"]. */
static int merge_parts(loader *L, const cJSON *m, int i, const char **a, size_t *an, const char **b, size_t *bn) {
    if (cJSON_IsString(m)) {
        const char *s = m->valuestring, *sp = strchr(s, ' ');
        if (!sp || strchr(sp + 1, ' ') || sp == s || !sp[1])
            return err_set(L->c.err, "%s: model.merges[%d]: expected \"LEFT RIGHT\" (two tokens, one space), got \"%.80s\"",
                           L->c.file, i, s);
        *a = s, *an = (size_t)(sp - s), *b = sp + 1, *bn = strlen(sp + 1);
        return 0;
    }
    const cJSON *l = cJSON_IsArray(m) ? m->child : NULL, *r = l ? l->next : NULL;
    if (cJSON_IsString(l) && cJSON_IsString(r) && !r->next) { /* exactly two strings */
        *a = l->valuestring, *an = strlen(*a);
        *b = r->valuestring, *bn = strlen(*b);
        return 0;
    }
    return err_set(L->c.err, "%s: model.merges[%d]: expected \"LEFT RIGHT\" or [\"LEFT\", \"RIGHT\"], got %s", L->c.file, i,
                   json_type_name(m));
}

static int load_merges(loader *L, const cJSON *model) {
    const cJSON *merges;
    int n;
    if (json_require(&L->c, model, "model", "merges", &merges) < 0 || json_expect_array(&L->c, merges, "model.merges", &n) < 0)
        return -1;
    mm_init(&L->t->merges, (size_t)n);
    mm_init(&L->t->joins, (size_t)n);
    char *buf = NULL;
    size_t cap = 0;
    int i = 0, rc = 0;
    for (const cJSON *m = merges->child; m && !rc; m = m->next, i++) {
        const char *a = NULL, *b = NULL;
        size_t an = 0, bn = 0;
        if ((rc = merge_parts(L, m, i, &a, &an, &b, &bn)) < 0) break;
        if (an + bn + 1 > cap) buf = xrealloc(buf, cap = 2 * (an + bn + 1));
        memcpy(buf, a, an);
        memcpy(buf + an, b, bn);
        int64_t ia = sm_get(&L->t->vocab, a, an), ib = sm_get(&L->t->vocab, b, bn), ic = sm_get(&L->t->vocab, buf, an + bn);
        if (ia < 0 || ib < 0 || ic < 0) {
            const char *what = ia < 0 ? a : ib < 0 ? b : buf;
            int wn = (int)(ia < 0 ? an : ib < 0 ? bn : an + bn);
            rc = err_set(L->c.err, "%s: model.merges[%d]: \"%.*s\" is not in model.vocab", L->c.file, i,
                         wn > 80 ? 80 : wn, what);
            break;
        }
        mm_put(&L->t->merges, (int32_t)ia, (int32_t)ib, i, (int32_t)ic);
        mm_put(&L->t->joins, last_char(a, an), first_char(b, bn), 0, 0);
    }
    free(buf);
    return rc;
}

static int load_added(loader *L, const cJSON *root) {
    const cJSON *a = json_get(root, "added_tokens");
    if (!a || cJSON_IsNull(a)) return 0;
    int n;
    if (json_expect_array(&L->c, a, "added_tokens", &n) < 0) return -1;
    L->t->added = xcalloc((size_t)n + 1, sizeof *L->t->added);
    const cJSON *e;
    cJSON_ArrayForEach(e, a) { /* one pass: cJSON_GetArrayItem walks the list from its start */
        const cJSON *id, *content;
        int i = L->t->n_added; /* this entry's index: each one read is added */
        char p[64];
        long v;
        const char *s;
        snprintf(p, sizeof p, "added_tokens[%d]", i);
        if (json_expect_object(&L->c, e, p) < 0 || json_require(&L->c, e, p, "id", &id) < 0 ||
            json_require(&L->c, e, p, "content", &content) < 0)
            return -1;
        snprintf(p, sizeof p, "added_tokens[%d].id", i);
        if (json_int(&L->c, id, p, 0, TOK_MAX_ID, &v) < 0) return -1;
        snprintf(p, sizeof p, "added_tokens[%d].content", i);
        if (json_string(&L->c, content, p, &s) < 0) return -1;
        int64_t have = sm_get(&L->t->vocab, s, strlen(s));
        if (have >= 0 && have != v)
            return err_set(L->c.err, "%s: added_tokens[%d]: \"%s\" has id %ld but model.vocab gives it %lld", L->c.file,
                           i, s, v, (long long)have);
        sm_put(&L->t->vocab, s, strlen(s), (int32_t)v);
        if ((int32_t)v + 1 > L->t->n_ids) L->t->n_ids = (int32_t)v + 1;
        added_tok *at = &L->t->added[L->t->n_added++];
        at->content = xstrdup(s);
        at->len = strlen(s);
        at->id = (int32_t)v;
        L->t->added_first[(uint8_t)s[0]] = 1;
    }
    return 0;
}

/* The added tokens' trie (added_at): a node per distinct prefix, at most one per byte of them. Of
 * two equal tokens the first is found. */
static void build_added_trie(tok *t) {
    size_t bytes = 0;
    for (int i = 0; i < t->n_added; i++) bytes += t->added[i].len;
    mm_init(&t->added_next, bytes);
    t->added_end = xmalloc((bytes + 1) * sizeof *t->added_end);
    t->added_end[0] = -1;
    int32_t nodes = 1;
    for (int i = 0; i < t->n_added; i++) {
        int32_t at = 0;
        for (size_t k = 0; k < t->added[i].len; k++) {
            uint8_t c = (uint8_t)t->added[i].content[k];
            const merge_ent *e = mm_get(&t->added_next, at, c);
            if (!e) mm_put(&t->added_next, at, c, 0, nodes), t->added_end[nodes] = -1;
            at = e ? e->id : nodes++;
        }
        if (t->added_end[at] < 0) t->added_end[at] = i;
    }
}

/* Each id's decoded bytes; ids that no token has decode to nothing. */
static int build_decoder(loader *L) {
    tok *t = L->t;
    t->dec_off = xcalloc((size_t)t->n_ids, sizeof *t->dec_off);
    t->dec_len = xcalloc((size_t)t->n_ids, sizeof *t->dec_len);
    tok_text blob = {0};
    text_add(&blob, "", 0);
    uint8_t *is_added = xcalloc((size_t)t->n_ids, 1);
    for (int i = 0; i < t->n_added; i++) is_added[t->added[i].id] = 1;
    /* one token per id: a second string with the same id would decode as the first */
    uint32_t *owner = xcalloc((size_t)t->n_ids, sizeof *owner); /* vocabulary entry + 1 */
    for (size_t e = 0; e < t->vocab.n; e++) {
        int32_t id = t->vocab.val[e];
        const char *s = t->vocab.blob + t->vocab.off[e];
        size_t n = t->vocab.len[e], at = blob.n;
        int bt;
        if (owner[id]) {
            const char *other = t->vocab.blob + t->vocab.off[owner[id] - 1];
            free(blob.p), free(is_added), free(owner);
            return err_set(L->c.err, "%s: model.vocab: \"%.80s\" and \"%.80s\" both have id %d (expected one token per id)",
                           L->c.file, other, s, id);
        }
        owner[id] = (uint32_t)e + 1;
        if (is_added[id]) text_add(&blob, s, n);
        else if (t->kind == TOK_BYTE_BPE) {
            if (!byte_level_decode(s, n, &blob)) {
                free(blob.p), free(is_added), free(owner);
                return err_set(L->c.err, "%s: model.vocab[\"%.80s\"]: not a byte-level token (a character outside "
                                         "the 256 byte characters)",
                               L->c.file, s);
            }
        } else if ((bt = byte_token(s, n)) >= 0) {
            uint8_t b = (uint8_t)bt;
            text_add(&blob, &b, 1);
        } else {
            for (size_t i = 0; i < n;)
                if (is_sp_space((const uint8_t *)s, n, i)) text_add(&blob, " ", 1), i += 3;
                else text_add(&blob, s + i, 1), i++;
        }
        t->dec_off[id] = (uint32_t)at;
        t->dec_len[id] = (uint32_t)(blob.n - at);
    }
    t->dec_blob = blob.p;
    free(is_added), free(owner);
    return 0;
}

/* The byte tokens: byte-level needs all 256; SentencePiece's byte fallback uses <0xNN>. */
static int build_bytes(loader *L, bool byte_fallback) {
    tok *t = L->t;
    for (int b = 0; b < 256; b++) {
        if (t->kind == TOK_BYTE_BPE) {
            int64_t id = sm_get(&t->vocab, byte_chars[b], byte_chars_len[b]);
            if (id < 0)
                return err_set(L->c.err, "%s: model.vocab: no token \"%.*s\" for byte 0x%02X (byte-level BPE needs all 256)",
                               L->c.file, byte_chars_len[b], byte_chars[b], b);
            t->byte_id[b] = (int32_t)id;
        } else {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", b);
            int64_t id = byte_fallback ? sm_get(&t->vocab, name, 6) : -1;
            if (byte_fallback && id < 0)
                return err_set(L->c.err, "%s: model.vocab: no token \"%s\" although model.byte_fallback is true", L->c.file,
                               name);
            t->byte_id[b] = (int32_t)id;
        }
    }
    return 0;
}

static int load_model(loader *L, const cJSON *root, bool *byte_fallback) {
    const cJSON *model;
    const char *type;
    if (json_require(&L->c, root, "", "model", &model) < 0) return -1;
    const cJSON *ty = json_get(model, "type");
    if (ty && need_type(L, model, "model", &type) < 0) return -1;
    if (ty && strcmp(type, "BPE"))
        return err_set(L->c.err, "%s: model.type: \"%s\" is not supported (expected \"BPE\")", L->c.file, type);
    if (load_vocab(L, model) < 0 || load_merges(L, model) < 0) return -1;
    const cJSON *d = json_get(model, "dropout");
    if (cJSON_IsNumber(d) && d->valuedouble != 0)
        return err_set(L->c.err, "%s: model.dropout: BPE dropout is not supported (expected null)", L->c.file);
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix", NULL};
    for (int i = 0; affixes[i]; i++) {
        const cJSON *a = json_get(model, affixes[i]);
        if (cJSON_IsString(a) && a->valuestring[0])
            return err_set(L->c.err, "%s: model.%s: \"%s\" is not supported (expected null)", L->c.file, affixes[i],
                           a->valuestring);
    }
    L->t->ignore_merges = get_bool(model, "ignore_merges", false);
    *byte_fallback = get_bool(model, "byte_fallback", false);
    L->t->fuse_unk = get_bool(model, "fuse_unk", false);
    const cJSON *unk = json_get(model, "unk_token");
    L->t->unk = cJSON_IsString(unk) ? (int32_t)sm_get(&L->t->vocab, unk->valuestring, strlen(unk->valuestring)) : -1;
    return 0;
}

static int load_root(loader *L, const cJSON *root) {
    tok *t = L->t;
    bool byte_fallback = false;
    if (json_expect_object(&L->c, root, "(the document)") < 0) return -1;
    if (load_model(L, root, &byte_fallback) < 0 || load_added(L, root) < 0) return -1;
    build_added_trie(t);
    const cJSON *norm = json_get(root, "normalizer"), *dec = json_get(root, "decoder");
    if (norm && !cJSON_IsNull(norm) && load_norm_one(L, norm, "normalizer") < 0) return -1;
    if (load_pre(L, json_get(root, "pre_tokenizer"), "pre_tokenizer") < 0) return -1;
    if (dec && !cJSON_IsNull(dec) && load_dec_one(L, dec, "decoder") < 0) return -1;
    if (L->byte_level == L->sp_space)
        return err_set(L->c.err, "%s: %s", L->c.file,
                       L->byte_level ? "pre_tokenizer: both ByteLevel and SentencePiece's \"\xe2\x96\x81\" (not supported)"
                                     : "pre_tokenizer, normalizer: neither a ByteLevel pre-tokenizer nor SentencePiece's "
                                       "\"\xe2\x96\x81\" spaces (supported: byte-level BPE as in GPT-2 and Llama-3, "
                                       "SentencePiece BPE as in Llama-2)");
    t->kind = L->byte_level ? TOK_BYTE_BPE : TOK_SP_BPE;
    if (t->kind == TOK_SP_BPE && !byte_fallback && t->unk < 0)
        return err_set(L->c.err, "%s: model: neither byte_fallback nor an unk_token in model.vocab (characters outside "
                                 "the vocabulary would have no token)",
                       L->c.file);
    if (build_bytes(L, byte_fallback) < 0 || build_decoder(L) < 0) return -1;
    snprintf(t->desc, sizeof t->desc, "%s",
             t->kind == TOK_SP_BPE ? (byte_fallback ? "SentencePiece BPE with byte fallback" : "SentencePiece BPE")
             : t->pre == PRE_LLAMA3 ? "byte-level BPE, Llama-3 pattern"
             : t->pre == PRE_GPT2   ? "byte-level BPE, GPT-2 pattern"
                                    : "byte-level BPE, no pattern");
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* identity                                                                                    */

/* FNV-1a, 64-bit: simple, stable across platforms and releases (the hash is stored in files). */
static void fnv(uint64_t *h, const void *p, size_t n) {
    const uint8_t *s = p;
    for (size_t i = 0; i < n; i++) *h = (*h ^ s[i]) * 0x100000001b3ull;
}

static void fnv_u32(uint64_t *h, uint32_t v) {
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    fnv(h, b, 4);
}

static int merge_rank_cmp(const void *a, const void *b) {
    const merge_ent *x = a, *y = b;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

/* The canonical content, in a fixed order: a version tag, the kind, the pattern and the flags
 * that change encoding; then per id 0..n_ids-1 its token string (length-prefixed; absent ids
 * hash as length 0xffffffff) and whether it is an added token; then the merges by rank as
 * (left id, right id, merged id). */
static uint64_t compute_identity(const tok *t) {
    uint64_t h = 0xcbf29ce484222325ull;
    fnv(&h, "cephalo-tokenizer-1", 19);
    fnv_u32(&h, (uint32_t)t->kind);
    fnv_u32(&h, (uint32_t)t->pre);
    fnv_u32(&h, (uint32_t)t->seg);
    fnv_u32(&h, (uint32_t)(t->add_prefix_space | t->ignore_merges << 1 | t->sp_prepend << 2 | t->sp_strip << 3 |
                           t->fuse_unk << 4));
    fnv_u32(&h, (uint32_t)t->unk);
    fnv_u32(&h, (uint32_t)t->n_ids);
    uint32_t *entry = xcalloc((size_t)t->n_ids, sizeof *entry); /* vocabulary entry + 1 */
    for (size_t e = 0; e < t->vocab.n; e++) entry[t->vocab.val[e]] = (uint32_t)e + 1;
    uint8_t *is_added = xcalloc((size_t)t->n_ids, 1);
    for (int i = 0; i < t->n_added; i++) is_added[t->added[i].id] = 1;
    for (int32_t id = 0; id < t->n_ids; id++) {
        if (!entry[id]) {
            fnv_u32(&h, 0xffffffffu);
            continue;
        }
        size_t e = entry[id] - 1;
        fnv_u32(&h, t->vocab.len[e]);
        fnv(&h, t->vocab.blob + t->vocab.off[e], t->vocab.len[e]);
        fnv(&h, &is_added[id], 1);
    }
    free(entry), free(is_added);
    merge_ent *m = xmalloc((t->merges.n + 1) * sizeof *m);
    size_t k = 0;
    for (size_t i = 0; i <= t->merges.mask; i++)
        if (t->merges.e[i].key) m[k++] = t->merges.e[i];
    qsort(m, k, sizeof *m, merge_rank_cmp);
    fnv_u32(&h, (uint32_t)k);
    for (size_t i = 0; i < k; i++) {
        uint64_t key = m[i].key - 1;
        fnv_u32(&h, (uint32_t)(key >> 32));
        fnv_u32(&h, (uint32_t)key);
        fnv_u32(&h, (uint32_t)m[i].id);
    }
    free(m);
    return h;
}

tok_id tok_identity(const tok *t) {
    return (tok_id){t->kind == TOK_SP_BPE ? TOKID_SP_BPE : TOKID_BYTE_BPE, t->n_ids, t->ident};
}

tok_id tok_id_bytes(void) { return (tok_id){TOKID_BYTES, 256, 0}; }

void tok_id_name(tok_id id, char out[TOK_ID_NAME_MAX]) {
    switch (id.kind) {
    case TOKID_BYTES: snprintf(out, TOK_ID_NAME_MAX, "bytes-%d", (int)id.vocab); break;
    case TOKID_BYTE_BPE:
    case TOKID_SP_BPE:
        snprintf(out, TOK_ID_NAME_MAX, "%s-%d-%016llx", id.kind == TOKID_SP_BPE ? "sp" : "bpe", (int)id.vocab,
                 (unsigned long long)id.hash);
        break;
    default: snprintf(out, TOK_ID_NAME_MAX, "unknown");
    }
}

int tok_id_parse(const char *s, tok_id *id) {
    *id = (tok_id){0};
    if (!strcmp(s, "unknown")) return 0;
    if (!strcmp(s, "bytes-256")) return *id = tok_id_bytes(), 0;
    tok_id_kind kind = !strncmp(s, "bpe-", 4) ? TOKID_BYTE_BPE : !strncmp(s, "sp-", 3) ? TOKID_SP_BPE : TOKID_UNKNOWN;
    if (kind == TOKID_UNKNOWN) return -1;
    const char *p = s + (kind == TOKID_SP_BPE ? 3 : 4);
    char *end;
    errno = 0;
    long v = strtol(p, &end, 10);
    if (errno || end == p || *end != '-' || v < 1 || v > TOK_MAX_ID + 1) return -1;
    const char *hx = end + 1;
    if (strlen(hx) != 16 || strspn(hx, "0123456789abcdef") != 16) return -1;
    *id = (tok_id){kind, (int32_t)v, strtoull(hx, NULL, 16)};
    return 0;
}

bool tok_id_equal(tok_id a, tok_id b) { return a.kind == b.kind && a.vocab == b.vocab && a.hash == b.hash; }

int tok_file_identity(const char *path, tok_id *id, err_t *err) {
    tok *t;
    if (tok_load(&t, path, err) < 0) return -1;
    *id = tok_identity(t);
    tok_free(t);
    return 0;
}

int tok_parse(tok **out, const char *name, const char *json, size_t len, err_t *err) {
    *out = NULL;
    init_tables();
    cJSON *root = json_parse(name, json, len, err);
    if (!root) return -1;
    tok *t = xcalloc(1, sizeof *t);
    t->unk = -1;
    loader L = {{name, err}, t, false, false};
    int rc = load_root(&L, root);
    cJSON_Delete(root);
    if (rc < 0) {
        tok_free(t);
        return -1;
    }
    t->cache = xcalloc(CACHE_SLOTS, sizeof *t->cache);
    t->ident = compute_identity(t);
    *out = t;
    return 0;
}

int tok_load(tok **out, const char *path, err_t *err) {
    *out = NULL;
    size_t len;
    char *text = file_read_all(path, JSON_MAX_FILE, &len, err);
    if (!text) return -1;
    int rc = tok_parse(out, path, text, len, err);
    free(text);
    return rc;
}
