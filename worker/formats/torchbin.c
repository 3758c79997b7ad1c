/* torchbin.c - a PyTorch state dict from torch.save's zip archive, read without running it
 * (torchbin.h says what is accepted).
 *
 * Three layers: the zip's central directory (stored entries; zip64 sizes and offsets), a pickle
 * interpreter restricted to torch.save's opcodes for a state dict, and the tensors it builds
 * checked against their storages. Values live in one growing pool and are referred to by index;
 * nothing the pickle says is trusted before it is checked. */
#include "formats/torchbin.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fileio.h"
#include "common/log.h"

/* ---- the zip archive ---- */

typedef struct zentry {
    const char *name; /* not NUL-terminated: name_len bytes in the central directory */
    size_t name_len;
    const unsigned char *data;
    uint64_t size;
} zentry;

typedef struct zip {
    const unsigned char *b;
    size_t len;
    const char *label;
    zentry *e;
    int n;
} zip;

static uint64_t le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static int zentry_cmp(const void *a, const void *b) {
    const zentry *x = a, *y = b;
    size_t n = x->name_len < y->name_len ? x->name_len : y->name_len;
    int c = memcmp(x->name, y->name, n);
    return c ? c : (x->name_len > y->name_len) - (x->name_len < y->name_len);
}

/* Whether [off, off + n) lies within the buffer. */
static bool within(const zip *z, uint64_t off, uint64_t n) { return off <= z->len && n <= z->len - off; }

static int zip_bad(const zip *z, err_t *err, const char *what) {
    return err_set(err, "%s: %s (a corrupt or truncated torch.save archive)", z->label, what);
}

/* The zip64 extra field's values for the central-directory fields that are all ones. */
static int zip64_extra(const zip *z, const unsigned char *x, size_t xlen, uint64_t *usize, uint64_t *csize,
                       uint64_t *off, err_t *err) {
    while (xlen >= 4) {
        unsigned id = (unsigned)le(x, 2), n = (unsigned)le(x + 2, 2);
        if (n > xlen - 4) return zip_bad(z, err, "an extra field runs past its entry");
        if (id == 1) {
            const unsigned char *p = x + 4, *end = p + n;
            uint64_t *fields[] = {usize, csize, off};
            for (int i = 0; i < 3; i++) {
                if (*fields[i] != 0xFFFFFFFFu) continue;
                if (end - p < 8) return zip_bad(z, err, "a zip64 extra field is too short");
                *fields[i] = le(p, 8), p += 8;
            }
        }
        x += 4 + n, xlen -= 4 + n;
    }
    return 0;
}

/* The central directory: every entry's name, and its data found through its local header. */
static int zip_read(zip *z, err_t *err) {
    if (z->len >= 2 && z->b[0] == 0x80)
        return err_set(err, "%s: a pickle, not a zip archive: the legacy torch.save format (before PyTorch 1.6) is "
                       "not read; save it again with a newer PyTorch, or as safetensors", z->label);
    if (z->len < 22 || le(z->b, 4) != 0x04034b50)
        return err_set(err, "%s: not a zip archive (torch.save writes one; expected the signature PK\\3\\4)", z->label);
    size_t eocd = z->len - 22, stop = z->len > 22 + 65535 ? z->len - 22 - 65535 : 0;
    while (le(z->b + eocd, 4) != 0x06054b50) {
        if (eocd == stop) return zip_bad(z, err, "no end-of-central-directory record");
        eocd--;
    }
    uint64_t count = le(z->b + eocd + 10, 2), cd = le(z->b + eocd + 16, 4);
    if ((count == 0xFFFF || cd == 0xFFFFFFFFu) && eocd >= 20 && le(z->b + eocd - 20, 4) == 0x07064b50) {
        uint64_t rec = le(z->b + eocd - 20 + 8, 8);
        if (!within(z, rec, 56) || le(z->b + rec, 4) != 0x06064b50) return zip_bad(z, err, "a bad zip64 record");
        count = le(z->b + rec + 32, 8), cd = le(z->b + rec + 48, 8);
    }
    if (count > z->len / 46) return zip_bad(z, err, "more entries than the file can hold");
    z->e = xcalloc((size_t)count + 1, sizeof *z->e);
    uint64_t p = cd;
    for (uint64_t i = 0; i < count; i++) {
        if (!within(z, p, 46) || le(z->b + p, 4) != 0x02014b50) return zip_bad(z, err, "a bad central directory entry");
        const unsigned char *c = z->b + p;
        uint64_t method = le(c + 10, 2), csize = le(c + 20, 4), usize = le(c + 24, 4), off = le(c + 42, 4);
        size_t nlen = (size_t)le(c + 28, 2), xlen = (size_t)le(c + 30, 2), clen = (size_t)le(c + 32, 2);
        if (!within(z, p + 46, (uint64_t)nlen + xlen + clen)) return zip_bad(z, err, "a central directory entry runs past the end");
        if (zip64_extra(z, c + 46 + nlen, xlen, &usize, &csize, &off, err) < 0) return -1;
        zentry *e = &z->e[z->n++];
        e->name = (const char *)c + 46, e->name_len = nlen;
        if (method != 0)
            return err_set(err, "%s: entry '%.*s' is compressed (method %" PRIu64 "); torch.save stores entries "
                           "uncompressed, and only those are read", z->label, (int)(nlen > 200 ? 200 : nlen), e->name, method);
        if (csize != usize) return zip_bad(z, err, "a stored entry whose sizes differ");
        if (!within(z, off, 30) || le(z->b + off, 4) != 0x04034b50) return zip_bad(z, err, "a bad local file header");
        uint64_t data = off + 30 + le(z->b + off + 26, 2) + le(z->b + off + 28, 2);
        if (!within(z, data, usize)) {
            char what[300];
            snprintf(what, sizeof what, "entry '%.*s' runs past the end of the file", (int)(nlen > 200 ? 200 : nlen), e->name);
            return zip_bad(z, err, what);
        }
        e->data = z->b + data, e->size = usize;
        p += 46 + nlen + xlen + clen;
    }
    if (z->n > 1) qsort(z->e, (size_t)z->n, sizeof *z->e, zentry_cmp);
    for (int i = 1; i < z->n; i++)
        if (!zentry_cmp(&z->e[i - 1], &z->e[i])) return zip_bad(z, err, "an entry name given twice");
    return 0;
}

/* The entry named prefix + rest, or NULL (z->e sorted by name: a state dict has a storage per
 * tensor, tens of thousands in a large model). */
static const zentry *zip_find(const zip *z, const char *prefix, size_t plen, const char *rest) {
    char name[512];
    size_t rlen = strlen(rest);
    if (plen + rlen > sizeof name) return NULL;
    memcpy(name, prefix, plen), memcpy(name + plen, rest, rlen);
    zentry key = {.name = name, .name_len = plen + rlen};
    return z->n ? bsearch(&key, z->e, (size_t)z->n, sizeof key, zentry_cmp) : NULL;
}

/* ---- the restricted pickle machine ---- */

typedef enum { V_NONE, V_BOOL, V_INT, V_STR, V_TUPLE, V_DICT, V_GLOBAL, V_STORAGE, V_TENSOR, V_MARK } vkind;
typedef enum { G_ORDERED_DICT, G_REBUILD_TENSOR, G_REBUILD_PARAMETER, G_STORAGE } gkind;

typedef struct val {
    vkind k;
    int64_t num;     /* INT, BOOL; GLOBAL: its gkind; STORAGE: elements; TENSOR: storage offset */
    const char *str; /* STR (str_len bytes in data.pkl); STORAGE: its key */
    size_t str_len;
    int dtype;       /* GLOBAL G_STORAGE, STORAGE, TENSOR: an st_dtype */
    int *items;      /* TUPLE; DICT: key, value, ...; TENSOR: storage, size tuple, stride tuple */
    int n, cap;
} val;

#define TB_MAX_VALS (1 << 24)
#define TB_MAX_MEMO (1 << 24)

typedef struct vm {
    const char *label;
    const unsigned char *pk; /* data.pkl */
    size_t len, pos, op_at;
    val *v;
    int nv, capv;
    int *stack, sp, cap_stack;
    int *memo, cap_memo, n_memo; /* n_memo: entries stored (MEMOIZE's next index) */
    err_t *err;
} vm;

static int vm_bad(vm *m, const char *what) {
    return err_set(m->err, "%s: data.pkl: %s at byte %zu (a corrupt file, or not a state dict torch.save wrote)",
                   m->label, what, m->op_at);
}

static int new_val(vm *m, vkind k) {
    if (m->nv == TB_MAX_VALS) return -1;
    if (m->nv == m->capv) {
        m->capv = m->capv ? 2 * m->capv : 256;
        m->v = xrealloc(m->v, (size_t)m->capv * sizeof *m->v);
    }
    m->v[m->nv] = (val){.k = k};
    return m->nv++;
}

static void add_item(val *x, int item) {
    if (x->n == x->cap) {
        x->cap = x->cap ? 2 * x->cap : 4;
        x->items = xrealloc(x->items, (size_t)x->cap * sizeof *x->items);
    }
    x->items[x->n++] = item;
}

static int push(vm *m, int v) {
    if (v < 0) return vm_bad(m, "too many values");
    if (m->sp == m->cap_stack) {
        if (m->sp >= TB_MAX_VALS) return vm_bad(m, "a stack too deep");
        m->cap_stack = m->cap_stack ? 2 * m->cap_stack : 64;
        m->stack = xrealloc(m->stack, (size_t)m->cap_stack * sizeof *m->stack);
    }
    m->stack[m->sp++] = v;
    return 0;
}

static int pop(vm *m, int *out) {
    if (m->sp == 0 || m->v[m->stack[m->sp - 1]].k == V_MARK) return vm_bad(m, "an opcode takes a value from an empty stack");
    *out = m->stack[--m->sp];
    return 0;
}

/* The bytes of an operand: n more must be there. */
static const unsigned char *take(vm *m, size_t n) {
    if (n > m->len - m->pos) return NULL;
    const unsigned char *p = m->pk + m->pos;
    m->pos += n;
    return p;
}

/* The stack's top down to its latest MARK, as a new tuple (the MARK popped). */
static int to_mark(vm *m, int *tuple) {
    int i = m->sp - 1;
    while (i >= 0 && m->v[m->stack[i]].k != V_MARK) i--;
    if (i < 0) return vm_bad(m, "no MARK for the opcode that needs one");
    int t = new_val(m, V_TUPLE);
    if (t < 0) return vm_bad(m, "too many values");
    for (int j = i + 1; j < m->sp; j++) add_item(&m->v[t], m->stack[j]);
    m->sp = i;
    *tuple = t;
    return 0;
}

static int memo_put(vm *m, uint64_t idx) {
    if (m->sp == 0) return vm_bad(m, "a memo store with nothing on the stack");
    if (idx >= TB_MAX_MEMO) return vm_bad(m, "a memo index beyond any state dict's");
    if (idx >= (uint64_t)m->cap_memo) {
        int cap = m->cap_memo ? m->cap_memo : 64;
        while ((uint64_t)cap <= idx) cap *= 2;
        m->memo = xrealloc(m->memo, (size_t)cap * sizeof *m->memo);
        for (int i = m->cap_memo; i < cap; i++) m->memo[i] = -1;
        m->cap_memo = cap;
    }
    if (m->memo[idx] < 0) m->n_memo++;
    m->memo[idx] = m->stack[m->sp - 1];
    return 0;
}

static int memo_get(vm *m, uint64_t idx) {
    if (idx >= (uint64_t)m->cap_memo || m->memo[idx] < 0) return vm_bad(m, "a memo fetch of an index never stored");
    return push(m, m->memo[idx]);
}

/* The typed storages torch.save names, and the element type of each. */
static const struct {
    const char *name;
    st_dtype dtype;
} STORAGES[] = {{"FloatStorage", ST_F32}, {"HalfStorage", ST_F16},  {"BFloat16Storage", ST_BF16},
                {"DoubleStorage", ST_F64}, {"LongStorage", ST_I64}, {"IntStorage", ST_I32},
                {"ShortStorage", ST_I16}, {"CharStorage", ST_I8},   {"ByteStorage", ST_U8},
                {"BoolStorage", ST_BOOL}};

static bool str_is(const char *s, size_t n, const char *want) { return strlen(want) == n && !memcmp(s, want, n); }

/* A global by module and name: one of the few a state dict needs, or an error naming it. */
static int global(vm *m, const char *mod, size_t mlen, const char *name, size_t nlen) {
    int g = new_val(m, V_GLOBAL);
    if (g < 0) return vm_bad(m, "too many values");
    val *x = &m->v[g];
    if (str_is(mod, mlen, "collections") && str_is(name, nlen, "OrderedDict")) x->num = G_ORDERED_DICT;
    else if (str_is(mod, mlen, "torch._utils") && str_is(name, nlen, "_rebuild_tensor_v2")) x->num = G_REBUILD_TENSOR;
    else if (str_is(mod, mlen, "torch._utils") && str_is(name, nlen, "_rebuild_parameter")) x->num = G_REBUILD_PARAMETER;
    else {
        x->num = -1;
        for (size_t i = 0; mlen == 5 && !memcmp(mod, "torch", 5) && i < sizeof STORAGES / sizeof *STORAGES; i++)
            if (str_is(name, nlen, STORAGES[i].name)) x->num = G_STORAGE, x->dtype = (int)STORAGES[i].dtype;
    }
    if (x->num < 0)
        return err_set(m->err, "%s: data.pkl: global '%.*s.%.*s' at byte %zu is not one a state dict holds: the reader "
                       "runs no code, and knows only collections.OrderedDict, torch._utils._rebuild_tensor_v2, "
                       "torch._utils._rebuild_parameter and torch's typed storages (a pickle that needs more is refused)",
                       m->label, (int)(mlen > 100 ? 100 : mlen), mod, (int)(nlen > 100 ? 100 : nlen), name, m->op_at);
    return push(m, g);
}

static bool is_int(const vm *m, int v) { return m->v[v].k == V_INT; }

/* An int tuple of at most ST_MAX_DIMS entries (a size or a stride). */
static bool int_tuple(const vm *m, int v) {
    const val *t = &m->v[v];
    if (t->k != V_TUPLE || t->n > ST_MAX_DIMS) return false;
    for (int i = 0; i < t->n; i++)
        if (!is_int(m, t->items[i]) || m->v[t->items[i]].num < 0) return false;
    return true;
}

/* REDUCE: the callable's result, recorded rather than computed. */
static int reduce(vm *m) {
    int args, fn;
    if (pop(m, &args) < 0 || pop(m, &fn) < 0) return -1;
    const val *f = &m->v[fn], *a = &m->v[args];
    if (f->k != V_GLOBAL || a->k != V_TUPLE) return vm_bad(m, "REDUCE of something that is not a known global and a tuple");
    if (f->num == G_ORDERED_DICT) {
        if (a->n != 0) return vm_bad(m, "OrderedDict called with arguments");
        return push(m, new_val(m, V_DICT));
    }
    if (f->num == G_REBUILD_PARAMETER) { /* (tensor, requires_grad, backward_hooks): the tensor */
        if (a->n < 1 || m->v[a->items[0]].k != V_TENSOR) return vm_bad(m, "_rebuild_parameter of something not a tensor");
        return push(m, a->items[0]);
    }
    if (f->num != G_REBUILD_TENSOR) return vm_bad(m, "a storage type called");
    /* (storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata]) */
    if (a->n < 4 || m->v[a->items[0]].k != V_STORAGE || !is_int(m, a->items[1]) || m->v[a->items[1]].num < 0 ||
        !int_tuple(m, a->items[2]) || !int_tuple(m, a->items[3]) || m->v[a->items[2]].n != m->v[a->items[3]].n)
        return vm_bad(m, "_rebuild_tensor_v2 with arguments other than (storage, offset, size, stride, ...)");
    int t = new_val(m, V_TENSOR);
    if (t < 0) return vm_bad(m, "too many values");
    a = &m->v[args];
    val *x = &m->v[t];
    x->num = m->v[a->items[1]].num;
    x->dtype = m->v[a->items[0]].dtype;
    add_item(x, a->items[0]), add_item(x, a->items[2]), add_item(x, a->items[3]);
    return push(m, t);
}

/* BINPERSID: ('storage', storage type, key, location, elements) names a storage. */
static int persid(vm *m) {
    int pid;
    if (pop(m, &pid) < 0) return -1;
    const val *t = &m->v[pid];
    if (t->k != V_TUPLE || t->n != 5 || m->v[t->items[0]].k != V_STR ||
        !str_is(m->v[t->items[0]].str, m->v[t->items[0]].str_len, "storage") || m->v[t->items[1]].k != V_GLOBAL ||
        m->v[t->items[1]].num != G_STORAGE || m->v[t->items[2]].k != V_STR || !is_int(m, t->items[4]) ||
        m->v[t->items[4]].num < 0)
        return vm_bad(m, "a persistent id other than ('storage', type, key, location, elements)");
    int s = new_val(m, V_STORAGE);
    if (s < 0) return vm_bad(m, "too many values");
    t = &m->v[pid];
    m->v[s].dtype = m->v[t->items[1]].dtype;
    m->v[s].str = m->v[t->items[2]].str, m->v[s].str_len = m->v[t->items[2]].str_len;
    m->v[s].num = m->v[t->items[4]].num;
    return push(m, s);
}

/* SETITEM(S): key/value pairs from the top of the stack into the dict below them. */
static int setitems(vm *m, int tuple) {
    int d;
    if (pop(m, &d) < 0) return -1;
    val *t = &m->v[tuple];
    if (m->v[d].k != V_DICT || t->n % 2) return vm_bad(m, "SETITEMS on something not a dict, or a key without a value");
    for (int i = 0; i < t->n; i++) add_item(&m->v[d], t->items[i]);
    return push(m, d);
}

static int op_string(vm *m, int lenbytes) {
    const unsigned char *p = take(m, (size_t)lenbytes);
    if (!p) return vm_bad(m, "a string length cut off");
    uint64_t n = le(p, lenbytes);
    const unsigned char *s = n <= m->len - m->pos ? take(m, (size_t)n) : NULL;
    if (!s) return vm_bad(m, "a string running past the end of data.pkl");
    int v = new_val(m, V_STR);
    if (v >= 0) m->v[v].str = (const char *)s, m->v[v].str_len = (size_t)n;
    return push(m, v);
}

static int op_int(vm *m, int bytes, bool is_signed) {
    const unsigned char *p = take(m, (size_t)bytes);
    if (!p) return vm_bad(m, "an integer cut off");
    uint64_t u = le(p, bytes);
    int64_t x = (int64_t)u;
    if (is_signed && bytes < 8 && (u >> (8 * bytes - 1)) & 1) x = (int64_t)(u | (~(uint64_t)0 << (8 * bytes)));
    int v = new_val(m, V_INT);
    if (v >= 0) m->v[v].num = x;
    return push(m, v);
}

/* One opcode; 1 at STOP. */
static int step(vm *m) {
    m->op_at = m->pos;
    const unsigned char *p = take(m, 1);
    if (!p) return vm_bad(m, "the end of data.pkl before STOP");
    int t, a, b, c;
    switch (*p) {
    case 0x80: /* PROTO */
        if (!(p = take(m, 1)) || *p < 2 || *p > 5) return vm_bad(m, "a pickle protocol other than 2..5");
        return 0;
    case 0x95: /* FRAME: a length hint */
        return take(m, 8) ? 0 : vm_bad(m, "a FRAME cut off");
    case '.': return 1; /* STOP */
    case '(': return push(m, new_val(m, V_MARK));
    case '}': return push(m, new_val(m, V_DICT));
    case ')': return push(m, new_val(m, V_TUPLE));
    case 'N': return push(m, new_val(m, V_NONE));
    case 0x88: case 0x89: /* NEWTRUE, NEWFALSE */
        if ((t = new_val(m, V_BOOL)) >= 0) m->v[t].num = *p == 0x88;
        return push(m, t);
    case 't': return to_mark(m, &t) < 0 ? -1 : push(m, t); /* TUPLE */
    case 0x85: case 0x86: case 0x87: { /* TUPLE1..3 */
        int n = *p - 0x84, items[3];
        for (int i = n - 1; i >= 0; i--)
            if (pop(m, &items[i]) < 0) return -1;
        if ((t = new_val(m, V_TUPLE)) < 0) return push(m, t);
        for (int i = 0; i < n; i++) add_item(&m->v[t], items[i]);
        return push(m, t);
    }
    case 'q': return (p = take(m, 1)) ? memo_put(m, *p) : vm_bad(m, "BINPUT cut off");
    case 'r': return (p = take(m, 4)) ? memo_put(m, le(p, 4)) : vm_bad(m, "LONG_BINPUT cut off");
    case 0x94: return memo_put(m, (uint64_t)m->n_memo); /* MEMOIZE */
    case 'h': return (p = take(m, 1)) ? memo_get(m, *p) : vm_bad(m, "BINGET cut off");
    case 'j': return (p = take(m, 4)) ? memo_get(m, le(p, 4)) : vm_bad(m, "LONG_BINGET cut off");
    case 'X': return op_string(m, 4);    /* BINUNICODE */
    case 0x8c: return op_string(m, 1);   /* SHORT_BINUNICODE */
    case 0x8d: return op_string(m, 8);   /* BINUNICODE8 */
    case 'J': return op_int(m, 4, true); /* BININT */
    case 'K': return op_int(m, 1, false);
    case 'M': return op_int(m, 2, false);
    case 0x8a: /* LONG1: n little-endian two's complement bytes */
        if (!(p = take(m, 1)) || *p > 8) return vm_bad(m, "a LONG1 wider than 8 bytes");
        return *p == 0 ? op_int(m, 0, false) : op_int(m, *p, true);
    case 'c': { /* GLOBAL "module\nname\n" */
        const char *s = (const char *)m->pk + m->pos, *end = (const char *)m->pk + m->len;
        const char *nl1 = memchr(s, '\n', (size_t)(end - s)), *nl2 = nl1 ? memchr(nl1 + 1, '\n', (size_t)(end - nl1 - 1)) : NULL;
        if (!nl2) return vm_bad(m, "a GLOBAL without its two lines");
        m->pos = (size_t)(nl2 + 1 - (const char *)m->pk);
        return global(m, s, (size_t)(nl1 - s), nl1 + 1, (size_t)(nl2 - nl1 - 1));
    }
    case 0x93: /* STACK_GLOBAL */
        if (pop(m, &b) < 0 || pop(m, &a) < 0) return -1;
        if (m->v[a].k != V_STR || m->v[b].k != V_STR) return vm_bad(m, "STACK_GLOBAL of something other than two strings");
        return global(m, m->v[a].str, m->v[a].str_len, m->v[b].str, m->v[b].str_len);
    case 'R': return reduce(m);
    case 'Q': return persid(m);
    case 's': /* SETITEM */
        if (pop(m, &b) < 0 || pop(m, &a) < 0) return -1;
        if ((c = new_val(m, V_TUPLE)) < 0) return push(m, c);
        add_item(&m->v[c], a), add_item(&m->v[c], b);
        return setitems(m, c);
    case 'u': return to_mark(m, &t) < 0 ? -1 : setitems(m, t); /* SETITEMS */
    case 'b': /* BUILD: an OrderedDict's attributes (a state dict's _metadata); not kept */
        if (pop(m, &a) < 0 || pop(m, &b) < 0) return -1;
        if (m->v[b].k != V_DICT) return vm_bad(m, "BUILD on something not a dict");
        return push(m, b);
    default: {
        char what[96];
        snprintf(what, sizeof what, "opcode 0x%02x%s%c%s, not one torch.save writes for a state dict", *p,
                 *p >= 0x20 && *p < 0x7f ? " ('" : "", *p >= 0x20 && *p < 0x7f ? *p : ' ',
                 *p >= 0x20 && *p < 0x7f ? "')" : "");
        return vm_bad(m, what);
    }
    }
}

/* ---- the tensors ---- */

/* The bytes of tensor x (a V_TENSOR) in row-major order: a pointer into its storage when its
 * strides are row-major's, else a copy added to owned. Sizes, strides and offset are checked
 * against the storage, and the storage against its entry. */
static int tensor_of(vm *m, const zip *z, const char *prefix, size_t plen, const char *name, int x, st_tensor *out,
                     void ***owned, int *n_owned) {
    const val *t = &m->v[x], *st = &m->v[t->items[0]], *size = &m->v[t->items[1]], *stride = &m->v[t->items[2]];
    char key[160];
    if (st->str_len > 100 || memchr(st->str, '/', st->str_len) || memchr(st->str, 0, st->str_len))
        return err_set(m->err, "%s: tensor '%s': a storage key that is no file name", m->label, name);
    snprintf(key, sizeof key, "data/%.*s", (int)st->str_len, st->str);
    const zentry *e = zip_find(z, prefix, plen, key);
    size_t es = st_dtype_size((st_dtype)st->dtype);
    if (!e) return err_set(m->err, "%s: tensor '%s': its storage %.*s%s is not in the archive", m->label, name, (int)plen, prefix, key);
    if ((uint64_t)st->num > e->size / es)
        return err_set(m->err, "%s: tensor '%s': storage %s holds %" PRIu64 " bytes, less than its %" PRId64 " elements of %s "
                       "(truncated or corrupt)", m->label, name, key, e->size, st->num, st_dtype_name((st_dtype)st->dtype));
    *out = (st_tensor){.name = name, .dtype = (st_dtype)st->dtype, .ndim = size->n};
    uint64_t numel = 1, last = (uint64_t)t->num; /* the highest element index used */
    bool contiguous = true;
    uint64_t want_stride = 1;
    for (int i = size->n - 1; i >= 0; i--) {
        uint64_t n = (uint64_t)m->v[size->items[i]].num, s = (uint64_t)m->v[stride->items[i]].num;
        out->shape[i] = (int64_t)n;
        if (n > ((uint64_t)1 << 40) || s > ((uint64_t)1 << 40)) numel = 0, last = UINT64_MAX;
        contiguous &= n == 1 || s == want_stride;
        want_stride *= n;
        numel *= n;
        if (n > 0 && last != UINT64_MAX) last += (n - 1) * s;
    }
    if (numel == 0 && last != UINT64_MAX) last = 0;
    if (last == UINT64_MAX || numel > ((uint64_t)1 << 40) || (numel > 0 && last >= (uint64_t)st->num))
        return err_set(m->err, "%s: tensor '%s': its sizes, strides and offset reach beyond its storage of %" PRId64
                       " elements (corrupt)", m->label, name, st->num);
    out->nbytes = (size_t)numel * es;
    if (numel == 0) { /* its offset is never used: it may lie anywhere */
        out->data = e->data;
        return 0;
    }
    const unsigned char *base = e->data + (size_t)t->num * es; /* within: last < the storage's elements */
    if (contiguous) {
        out->data = base;
        return 0;
    }
    unsigned char *copy = xmalloc(out->nbytes);
    int64_t idx[ST_MAX_DIMS] = {0};
    for (uint64_t k = 0; k < numel; k++) { /* row-major order: the last index fastest */
        uint64_t at = 0;
        for (int i = 0; i < size->n; i++) at += (uint64_t)idx[i] * (uint64_t)m->v[stride->items[i]].num;
        memcpy(copy + k * es, base + at * es, es);
        for (int i = size->n - 1; i >= 0 && ++idx[i] == out->shape[i]; i--) idx[i] = 0;
    }
    *owned = xrealloc(*owned, (size_t)(*n_owned + 1) * sizeof **owned);
    (*owned)[(*n_owned)++] = copy;
    out->data = copy;
    return 0;
}

static void vm_free(vm *m) {
    for (int i = 0; i < m->nv; i++) free(m->v[i].items);
    free(m->v), free(m->stack), free(m->memo);
}

/* The archive's prefix: the directory of its one data.pkl. */
static int find_pickle(const zip *z, const zentry **pkl, size_t *plen, err_t *err) {
    *pkl = NULL;
    for (int i = 0; i < z->n; i++) {
        const zentry *e = &z->e[i];
        if (e->name_len >= 9 && !memcmp(e->name + e->name_len - 9, "/data.pkl", 9) &&
            !memchr(e->name, '/', e->name_len - 9)) {
            if (*pkl) return err_set(err, "%s: two data.pkl in the archive", z->label);
            *pkl = e, *plen = e->name_len - 8; /* "archive/" */
        }
    }
    if (!*pkl) return err_set(err, "%s: no ARCHIVE/data.pkl in the zip: not a torch.save file", z->label);
    const zentry *bo = zip_find(z, (*pkl)->name, *plen, "byteorder");
    if (bo && !(bo->size == 6 && !memcmp(bo->data, "little", 6)))
        return err_set(err, "%s: byteorder is not \"little\": big-endian tensors are not read", z->label);
    return 0;
}

/* Runs data.pkl and makes the st_file, which takes `map`; unmapped on failure. */
static int run(vm *m, const zip *z, const char *prefix, size_t plen, void *map, size_t map_len, st_file **out) {
    int rc, top = -1;
    while ((rc = step(m)) == 0) {}
    if (rc > 0 && (m->sp != 1 || m->v[top = m->stack[0]].k != V_DICT))
        rc = vm_bad(m, "a pickle whose value is not one dict (a state dict)");
    if (rc < 0) {
        if (map) munmap(map, map_len);
        return -1;
    }
    const val *d = &m->v[top];
    int n = d->n / 2;
    st_tensor *ts = xcalloc((size_t)n + 1, sizeof *ts);
    char **names = xcalloc((size_t)n + 1, sizeof *names);
    void **owned = NULL;
    int n_owned = 0;
    rc = 0;
    for (int i = 0; rc == 0 && i < n; i++) {
        const val *k = &m->v[d->items[2 * i]];
        int v = d->items[2 * i + 1];
        if (k->k != V_STR || memchr(k->str, 0, k->str_len) || k->str_len > 1000) {
            rc = vm_bad(m, "a state dict key that is not a name");
            break;
        }
        names[i] = xmalloc(k->str_len + 1);
        memcpy(names[i], k->str, k->str_len), names[i][k->str_len] = 0;
        if (m->v[v].k != V_TENSOR)
            rc = err_set(m->err, "%s: '%s' is not a tensor: a state dict of tensors is read (not a checkpoint "
                         "holding one among other things)", m->label, names[i]);
        else rc = tensor_of(m, z, prefix, plen, names[i], v, &ts[i], &owned, &n_owned);
    }
    if (rc == 0) rc = st_from_tensors(out, m->label, ts, n, map, map_len, owned, n_owned, m->err);
    else {
        for (int i = 0; i < n_owned; i++) free(owned[i]);
        free(owned);
        if (map) munmap(map, map_len);
    }
    for (int i = 0; i < n; i++) free(names[i]);
    free(names), free(ts);
    return rc;
}

/* map: the mapping the st_file takes (NULL for tb_parse's buffer); unmapped on failure. */
static int parse(st_file **out, const void *buf, size_t len, const char *label, void *map, err_t *err) {
    *out = NULL;
    zip z = {buf, len, label, NULL, 0};
    const zentry *pkl;
    size_t plen = 0;
    int rc = zip_read(&z, err) < 0 || find_pickle(&z, &pkl, &plen, err) < 0 ? -1 : 0;
    if (rc < 0) {
        free(z.e);
        if (map) munmap(map, len);
        return -1;
    }
    vm m = {.label = label, .pk = pkl->data, .len = (size_t)pkl->size, .err = err};
    rc = run(&m, &z, pkl->name, plen, map, len, out);
    vm_free(&m);
    free(z.e);
    return rc;
}

int tb_parse(st_file **out, const void *buf, size_t len, const char *label, err_t *err) {
    return parse(out, buf, len, label ? label : "(memory)", NULL, err);
}

int tb_open(st_file **out, const char *path, err_t *err) {
    *out = NULL;
    struct stat sb;
    int fd = file_open_read(path, true, &sb, err);
    if (fd < 0) return -1;
    if (sb.st_size <= 0 || (uint64_t)sb.st_size > SIZE_MAX) {
        close(fd);
        return err_set(err, "%s: %s", path, sb.st_size <= 0 ? "the file is empty" : "the file is too large to map");
    }
    size_t len = (size_t)sb.st_size;
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) return err_set(err, "%s: cannot map the file: %s", path, strerror(e));
    return parse(out, map, len, path, map, err);
}
