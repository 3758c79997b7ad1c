/* cuda_mem.cu - the CUDA device's memory: the caching allocator behind dev_alloc, the scratch
 * buffers outside the accounting (cuda_scratch, cuda_must_malloc), copies and sync, page-locked
 * host memory for the offload copies, streams and events (device.h's memory ops).
 *
 * Below every other CUDA file: the op families and the attention kernels take their scratch
 * here, and this file calls nothing of theirs. */
#include <string.h>

#include "devices/cuda_internal.h"

extern "C" {
#include "common/log.h"
}

struct dev_event {
    cudaEvent_t ev;
};

/* ---------------------------------------------------------------------------------------------
 * memory: a caching allocator. Sizes are rounded to a class (cuda_internal.h) and freed blocks
 * wait on the free list of their class; cudaMalloc only on a miss. dev_alloc (dev_common.c) does
 * the accounting against d->capacity; this layer only supplies raw memory. */

static size_t round_class(size_t bytes) {
    size_t unit = bytes < CUDA_LARGE ? CUDA_SMALL : CUDA_LARGE;
    if (bytes > SIZE_MAX - unit) return 0; /* overflow: no class */
    return (bytes + unit - 1) / unit * unit;
}

/* The free list of a rounded size; created when create. */
static cuda_freelist *freelist(cuda_state *st, size_t bytes, bool create) {
    for (int i = 0; i < st->n_lists; i++)
        if (st->lists[i].bytes == bytes) return &st->lists[i];
    if (!create) return NULL;
    if (st->n_lists == st->cap_lists) {
        st->cap_lists = st->cap_lists ? 2 * st->cap_lists : 64;
        st->lists = (cuda_freelist *)xrealloc(st->lists, (size_t)st->cap_lists * sizeof *st->lists);
    }
    cuda_freelist *l = &st->lists[st->n_lists++];
    memset(l, 0, sizeof *l);
    l->bytes = bytes;
    return l;
}

/* cudaFree's every cached block (after the queued work: a cached block is free, but the
 * kernels that last used it may still be running). */
static void release_cached(device *d) {
    cuda_state *st = cuda_of(d);
    for (int s = 0; s < DEV_STREAMS; s++) host_wait(d, st->stream[s]);
    for (int i = 0; i < st->n_lists; i++) {
        cuda_freelist *l = &st->lists[i];
        for (int j = 0; j < l->n; j++) CUDA_CHECK(cudaFree(l->blocks[j]));
        st->reserved_bytes -= (int64_t)l->bytes * l->n;
        l->n = 0;
    }
}

/* cudaMalloc that clears the (non-sticky) error it leaves behind on failure, so the next
 * launch check does not report it. */
static void *try_malloc(size_t bytes) {
    void *p = NULL;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

void *cuda_raw_alloc(device *d, size_t bytes) {
    cuda_state *st = cuda_of(d);
    size_t rounded = round_class(bytes);
    if (!rounded) return NULL;
    cuda_freelist *l = freelist(st, rounded, false);
    if (l && l->n > 0) return l->blocks[--l->n];
    void *p = try_malloc(rounded);
    if (!p) { /* the cache may hold the memory in blocks of other sizes */
        release_cached(d);
        p = try_malloc(rounded);
        if (!p) return NULL;
    }
    st->reserved_bytes += (int64_t)rounded;
    return p; /* cudaMalloc memory is 256-byte aligned (dev_alloc promises 64) */
}

/* Back to the cache, not to cudaFree. Safe with work still queued because every kernel runs on
 * the compute stream: whoever gets the block next uses it in work queued after the work that
 * used it before. (The trainer keeps memory that h2d/d2h copies touch alive until their events
 * have completed.) */
void cuda_raw_free(device *d, void *p, size_t bytes) {
    cuda_freelist *l = freelist(cuda_of(d), round_class(bytes), true);
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 16;
        l->blocks = (void **)xrealloc(l->blocks, (size_t)l->cap * sizeof *l->blocks);
    }
    l->blocks[l->n++] = p;
}

extern "C" int64_t cuda_reserved_bytes(device *d) { return cuda_of(d)->reserved_bytes; }

/* cudaMalloc for the device's own buffers outside the accounting (scratch, rope tables): on a
 * failure the cache is released and the call retried once; a second failure aborts, naming
 * what was wanted (these are small, covered by the capacity's reserve). */
void *cuda_must_malloc(device *d, size_t bytes, const char *what) {
    void *p = try_malloc(bytes);
    if (!p) {
        release_cached(d);
        p = try_malloc(bytes);
    }
    if (!p) {
        fprintf(stderr, "%s:%d: rank %d: out of GPU memory for %zu bytes of %s during %s\n",
                __FILE__, __LINE__, d->rank, bytes, what, d->context[0] ? d->context : "setup");
        abort();
    }
    return p;
}

void *cuda_scratch(device *d, size_t bytes) {
    cuda_state *st = cuda_of(d);
    if (bytes <= st->scratch_bytes) return st->scratch;
    host_wait(d, compute(d)); /* queued kernels may use the old buffer */
    if (st->scratch) CUDA_CHECK(cudaFree(st->scratch));
    st->scratch = NULL, st->scratch_bytes = 0;
    size_t want = round_class(bytes);
    st->scratch = cuda_must_malloc(d, want, "kernel scratch");
    st->scratch_bytes = want;
    return st->scratch;
}

static cudaMemcpyKind memcpy_kind(copy_kind kind) {
    switch (kind) {
    case COPY_H2D: return cudaMemcpyHostToDevice;
    case COPY_D2H: return cudaMemcpyDeviceToHost;
    default: return cudaMemcpyDeviceToDevice;
    }
}

/* In compute order; a copy from or to the host waits, since host memory may be pageable and
 * the caller reads or reuses it right after. */
void cuda_copy(device *d, void *dst, const void *src, size_t bytes, copy_kind kind) {
    if (!bytes) return;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, memcpy_kind(kind), compute(d)));
    if (kind != COPY_D2D) host_wait(d, compute(d));
}

void cuda_sync(device *d) {
    for (int s = 0; s < DEV_STREAMS; s++)
        CUDA_CHECK(cudaStreamSynchronize(cuda_stream(d, (dev_stream)s)));
    d->host_syncs++; /* one wait for the caller, however many streams */
    cuda_optime_poll(d); /* everything has ended: no wait */
}

/* ---------------------------------------------------------------------------------------------
 * host memory, streams and events */

void *cuda_host_alloc(device *d, size_t bytes) {
    (void)d;
    void *p = NULL;
    if (cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

void cuda_host_free(device *d, void *p) {
    (void)d;
    if (p) CUDA_CHECK(cudaFreeHost(p));
}

void cuda_copy_async(device *d, void *dst, const void *src, size_t bytes, copy_kind kind,
                     dev_stream s) {
    if (!bytes) return;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, memcpy_kind(kind), cuda_stream(d, s)));
}

dev_event *cuda_event_new(device *d) {
    (void)d;
    dev_event *e = (dev_event *)xmalloc(sizeof *e);
    CUDA_CHECK(cudaEventCreateWithFlags(&e->ev, cudaEventDisableTiming));
    return e;
}

void cuda_event_free(device *d, dev_event *e) {
    (void)d;
    if (!e) return;
    CUDA_CHECK(cudaEventDestroy(e->ev));
    free(e);
}

void cuda_event_record(device *d, dev_event *e, dev_stream s) {
    CUDA_CHECK(cudaEventRecord(e->ev, cuda_stream(d, s)));
}

/* A never-recorded event counts as complete for cudaStreamWaitEvent, as device.h wants. */
void cuda_stream_wait(device *d, dev_stream s, dev_event *e) {
    CUDA_CHECK(cudaStreamWaitEvent(cuda_stream(d, s), e->ev, 0));
}

void cuda_event_sync(device *d, dev_event *e) {
    CUDA_CHECK(cudaEventSynchronize(e->ev));
    d->host_syncs++;
}

void *cuda_native_stream(device *d, dev_stream s) { return (void *)cuda_stream(d, s); }
