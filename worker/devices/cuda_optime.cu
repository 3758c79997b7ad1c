/* cuda_optime.cu - CEPHALO_CUDA_OPTIME=1: the CUDA device's GPU time per op class (optime.h,
 * docs/cuda.md): the ring of event pairs and its resolution. The timed op table that brackets
 * each op with cuda_optime_begin/end is cuda_device.cu's; gemm brackets its operand rounding
 * itself (cuda_gemm.cu), and sync polls the ring (cuda_mem.cu). */
#include "devices/cuda_internal.h"

extern "C" {
#include "common/log.h"
}

/* ---------------------------------------------------------------------------------------------
 * CEPHALO_CUDA_OPTIME=1: GPU time per op class (optime.h, docs/cuda.md)
 *
 * Each op of the timed table records a start and a stop event (timing enabled) on its stream
 * around the plain op; nothing waits for them. The pairs live in a ring of OT_PAIRS, resolved
 * oldest first by cudaEventElapsedTime once their stop event has completed: polled
 * (cudaEventQuery, no wait) when the ring is three quarters full and at every sync, and waited
 * for only when the ring is full (once per OT_PAIRS ops, never in practice inside a step of a
 * small model) and at close, where the table goes to stderr. Off: the plain table, no cost. */

#define OT_PAIRS 4096
#define OT_DEPTH 4 /* nesting: gemm > operand rounding */

struct cuda_optime {
    cudaEvent_t start[OT_PAIRS], stop[OT_PAIRS];
    unsigned char cls[OT_PAIRS];
    bool closed[OT_PAIRS];
    dev_stream stream[OT_PAIRS];
    int head, used;          /* slots [head, head + used) are taken, in begin order */
    int open[OT_DEPTH], depth; /* begun, not yet ended */
    optime_acc acc;
};

/* Adds the oldest pair's time if it has ended (wait: also if its work is still queued). */
static bool optime_resolve_one(cuda_optime *o, bool wait) {
    if (o->used == 0 || !o->closed[o->head]) return false;
    const int i = o->head;
    if (wait) {
        CUDA_CHECK(cudaEventSynchronize(o->stop[i]));
    } else {
        cudaError_t q = cudaEventQuery(o->stop[i]);
        if (q == cudaErrorNotReady) return false;
        CUDA_CHECK(q);
    }
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, o->start[i], o->stop[i]));
    optime_add(&o->acc, (optime_class)o->cls[i], ms);
    o->closed[i] = false;
    o->head = (o->head + 1) % OT_PAIRS, o->used--;
    return true;
}

void cuda_optime_begin(device *d, optime_class c, dev_stream s) {
    cuda_optime *o = cuda_of(d)->optime;
    if (!o) return;
    CHECK(o->depth < OT_DEPTH);
    if (o->used >= OT_PAIRS * 3 / 4)
        while (optime_resolve_one(o, false)) {
        }
    while (o->used >= OT_PAIRS - OT_DEPTH) CHECK(optime_resolve_one(o, true));
    const int i = (o->head + o->used) % OT_PAIRS;
    o->used++;
    o->cls[i] = (unsigned char)c, o->stream[i] = s, o->closed[i] = false;
    o->open[o->depth++] = i;
    CUDA_CHECK(cudaEventRecord(o->start[i], cuda_stream(d, s)));
}

void cuda_optime_end(device *d) {
    cuda_optime *o = cuda_of(d)->optime;
    if (!o) return;
    CHECK(o->depth > 0);
    const int i = o->open[--o->depth];
    CUDA_CHECK(cudaEventRecord(o->stop[i], cuda_stream(d, o->stream[i])));
    o->closed[i] = true;
}

cuda_optime *cuda_optime_new(void) {
    cuda_optime *o = (cuda_optime *)xcalloc(1, sizeof *o);
    for (int i = 0; i < OT_PAIRS; i++) {
        CUDA_CHECK(cudaEventCreate(&o->start[i]));
        CUDA_CHECK(cudaEventCreate(&o->stop[i]));
    }
    return o;
}

/* Waits for every pair, prints the table (rank, GPU) to stderr, frees o. */
void cuda_optime_finish(cuda_optime *o, int rank, int gpu) {
    while (optime_resolve_one(o, true)) {
    }
    char title[64];
    snprintf(title, sizeof title, "rank %d, GPU %d", rank, gpu);
    optime_print(&o->acc, title, stderr);
    for (int i = 0; i < OT_PAIRS; i++) {
        (void)cudaEventDestroy(o->start[i]);
        (void)cudaEventDestroy(o->stop[i]);
    }
    free(o);
}

/* At a sync (everything queued has ended): adds every closed pair, without waiting. */
void cuda_optime_poll(device *d) {
    if (cuda_optime *o = cuda_of(d)->optime)
        while (optime_resolve_one(o, false)) {
        }
}
