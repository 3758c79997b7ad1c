/* dev_common.c - what every device kind shares: the accounting allocator (dev_alloc, dev_free,
 * the OOM context), the RoPE tables, AdamW's step scalars, the gemm mode of a precision, and the
 * shorthands over the op table. Below the kinds: cpu_device.c and the CUDA files call it, and it
 * calls none of them (device.c, the kinds' table, is above them).
 *
 * Sizes are kept in a host-side table keyed by pointer (not in a header before the block), because
 * a CUDA device pointer cannot carry a host-written header. */
#include "devices/device.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/env.h"
#include "common/log.h"

typedef struct alloc_slot {
    void *p; /* NULL = empty; TOMB = deleted */
    size_t bytes;
} alloc_slot;

typedef struct alloc_table {
    alloc_slot *slots;
    size_t cap, used; /* used counts live + tombstones */
} alloc_table;

static char tomb_marker;
#define TOMB ((void *)&tomb_marker)

static size_t slot_of(const void *p, size_t cap) {
    uint64_t h = (uint64_t)(uintptr_t)p;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    return (size_t)(h & (cap - 1));
}

static void table_put(alloc_table *t, void *p, size_t bytes);

static void table_grow(alloc_table *t) {
    alloc_table old = *t;
    t->cap = old.cap ? old.cap * 2 : 256;
    t->slots = xcalloc(t->cap, sizeof(alloc_slot));
    t->used = 0;
    for (size_t i = 0; i < old.cap; i++)
        if (old.slots[i].p && old.slots[i].p != TOMB) table_put(t, old.slots[i].p, old.slots[i].bytes);
    free(old.slots);
}

static void table_put(alloc_table *t, void *p, size_t bytes) {
    if ((t->used + 1) * 2 > t->cap) table_grow(t);
    size_t i = slot_of(p, t->cap);
    while (t->slots[i].p && t->slots[i].p != TOMB) i = (i + 1) & (t->cap - 1);
    if (!t->slots[i].p) t->used++;
    t->slots[i] = (alloc_slot){p, bytes};
}

/* Removes p and returns its size; CHECK-fails on a pointer that was never allocated. */
static size_t table_take(alloc_table *t, void *p) {
    CHECK(t->cap > 0);
    size_t i = slot_of(p, t->cap);
    while (t->slots[i].p != p) {
        CHECK(t->slots[i].p != NULL); /* freeing memory this device did not allocate */
        i = (i + 1) & (t->cap - 1);
    }
    t->slots[i].p = TOMB;
    return t->slots[i].bytes;
}

static alloc_table *table_of(device *d) { return (alloc_table *)d->alloc_table; }

static void fmt_bytes(char *buf, size_t n, int64_t b) {
    if (b >= (1LL << 30)) snprintf(buf, n, "%.2f GiB", (double)b / (1 << 30));
    else if (b >= (1LL << 20)) snprintf(buf, n, "%.1f MiB", (double)b / (1 << 20));
    else snprintf(buf, n, "%lld B", (long long)b);
}

void *dev_alloc(device *d, size_t bytes, const char *what) {
    if (bytes == 0) bytes = 1;
    if (d->capacity > 0 && d->cur_bytes + (int64_t)bytes > d->capacity) {
        char need[32], used[32], cap[32];
        fmt_bytes(need, sizeof need, (int64_t)bytes);
        fmt_bytes(used, sizeof used, d->cur_bytes);
        fmt_bytes(cap, sizeof cap, d->capacity);
        err_set(&d->err,
                "rank %d: out of memory on the %s device during %s: allocating %s for %s, "
                "%s of %s already in use",
                d->rank, d->ops->name, d->context[0] ? d->context : "setup", need, what, used, cap);
        return NULL;
    }
    void *p = d->ops->raw_alloc(d, bytes);
    if (!p) {
        char need[32];
        fmt_bytes(need, sizeof need, (int64_t)bytes);
        err_set(&d->err, "rank %d: the system could not allocate %s for %s during %s", d->rank,
                need, what, d->context[0] ? d->context : "setup");
        return NULL;
    }
    if (!d->alloc_table) d->alloc_table = xcalloc(1, sizeof(alloc_table));
    table_put(table_of(d), p, bytes);
    d->cur_bytes += (int64_t)bytes;
    d->n_allocs++;
    if (d->cur_bytes > d->peak_bytes) d->peak_bytes = d->cur_bytes;
    return p;
}

void dev_free(device *d, void *p) {
    if (!p) return;
    size_t bytes = table_take(table_of(d), p);
    d->ops->raw_free(d, p, bytes);
    d->cur_bytes -= (int64_t)bytes;
    d->n_allocs--;
}

void dev_free_table(device *d) {
    alloc_table *t = table_of(d);
    if (!t) return;
    free(t->slots);
    free(t);
    d->alloc_table = NULL;
}

/* Ends s (cut by vsnprintf to size - 1 bytes) after its last whole word, with "...", so that an OOM
 * message never shows half a word; a single over-long word is cut before a UTF-8 character. */
static void cut_at_word(char *s, size_t size) {
    size_t keep = size - 4; /* room for "..." and the NUL */
    size_t at = keep;
    while (at > 0 && s[at] != ' ') at--; /* s[at] == ' ': s[0..at) ends with a whole word */
    if (at == 0)
        for (at = keep; at > 0 && ((unsigned char)s[at] & 0xC0) == 0x80; at--) {}
    while (at > 0 && s[at - 1] == ' ') at--;
    memcpy(s + at, "...", 4);
}

void dev_set_context(device *d, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(d->context, sizeof d->context, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof d->context) cut_at_word(d->context, sizeof d->context);
}

void dev_zero(device *d, float *x, int64_t n) { d->ops->fill(d, x, 0.0f, n); }

dev_adamw dev_adamw_step(double lr, double beta1, double beta2, double eps, double wd, long t, float gscale) {
    return (dev_adamw){.b1 = (float)beta1, .b2 = (float)beta2, .one_m_b1 = (float)(1.0 - beta1),
                       .one_m_b2 = (float)(1.0 - beta2), .eps = (float)eps, .decay = (float)(1.0 - lr * wd),
                       .neg_step = (float)(-lr / (1.0 - pow(beta1, (double)t))),
                       .bc2_sqrt = (float)sqrt(1.0 - pow(beta2, (double)t)), .gscale = gscale};
}

/* CEPHALO_CUDA_TF32=0 keeps fp32 matmuls exact on CUDA too (PyTorch's allow_tf32 = False): the
 * GPU tests check the multi-rank invariant that way, where TF32 rounding would hide a real error */
dev_matmul dev_matmul_for(precision p, bool cuda) {
    if (p == PREC_BF16) return DEV_MATMUL_BF16;
    if (p == PREC_FP16) return DEV_MATMUL_FP16;
    /* NULL: checked at start (env_entry) */
    return cuda && env_flag("CEPHALO_CUDA_TF32", NULL) == 1 ? DEV_MATMUL_TF32 : DEV_MATMUL_FP32;
}

void dev_to_half(device *d, precision p, uint16_t *out, const float *in, int64_t n) {
    CHECK(precision_half(p));
    (p == PREC_BF16 ? d->ops->to_bf16 : d->ops->to_fp16)(d, out, in, n);
}

void dev_from_half(device *d, precision p, float *out, const uint16_t *in, int64_t n) {
    CHECK(precision_half(p));
    (p == PREC_BF16 ? d->ops->from_bf16 : d->ops->from_fp16)(d, out, in, n);
}

void dev_upload(device *d, void *dst, const void *src, size_t bytes) {
    d->ops->copy(d, dst, src, bytes, COPY_H2D);
}

void dev_download(device *d, void *dst, const void *src, size_t bytes) {
    d->ops->copy(d, dst, src, bytes, COPY_D2H);
}

/* The angles as PyTorch / Hugging Face Llama computes them, in fp32: angle = float(t) *
 * inv_freq[i] rounded to float, then cos and sin of that fp32 angle evaluated in double and
 * rounded once. A double-precision angle would differ from PyTorch by up to half an ulp of the
 * angle (~8e-6 at t = 255), more than the 1e-6 agreement wanted; in this order the tables agree
 * with PyTorch's to about an ulp. The CPU and CUDA devices both use this table, so their
 * rotations are the same bits. */
void dev_rope_table(const float *inv_freq, int T, int hd, float *cos_t, float *sin_t) {
    int half = hd / 2;
    for (int i = 0; i < half; i++)
        for (int t = 0; t < T; t++) {
            float angle = (float)t * inv_freq[i];
            cos_t[(int64_t)t * half + i] = (float)cos((double)angle);
            sin_t[(int64_t)t * half + i] = (float)sin((double)angle);
        }
}
