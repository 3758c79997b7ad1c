/* comm_nccl.c - the nccl backend (docs/comm.md): the collectives of comm.h with NCCL, on device
 * memory, one GPU per rank. It is linked into cephalo-worker-cuda only; comm.c refers to it
 * through weak symbols, so the CPU binaries link without it.
 *
 *   rendezvous  comm_set_device_stream -> nccl_open: every rank publishes its GPU's UUID in the
 *               store; rank 0 checks that no two ranks share a GPU, then publishes its
 *               ncclUniqueId (or why it refused); every rank creates a non-blocking communicator
 *               (ncclCommInitRankConfig, blocking = 0) and polls it up to the timeout
 *   ordering    at issue, an event on the caller's compute stream (nccl_issue); the communicator
 *               thread makes the backend's own stream wait for it, launches the collective and
 *               records `done`, then polls `done` and ncclCommGetAsyncError (sleeping 50-200 us
 *               between polls) until the collective finished, failed or timed out
 *   uneven      allgatherv / reduce-scatterv with unequal counts (CEPHALO_NCCL_UNEVEN): one
 *               ncclBroadcast / ncclReduce per rank in a group ("grouped"), or every block padded
 *               to the largest in a scratch buffer around one ncclAllGather / ncclReduceScatter
 *               ("pad"); "auto" takes the plain collective when the counts are equal, else grouped
 *   host values allreduce, broadcast and barrier on host memory go through a staging buffer
 *
 * Threads: NCCL lets one thread at a time operate a communicator. Every NCCL call on b->comm holds
 * b->mu; the communicator thread takes it around each call and drops it while it sleeps between
 * polls, and nccl_shutdown (comm_abort, any thread) takes it to call ncclCommAbort and set b->comm
 * to NULL, which the communicator thread then finds. A non-blocking call may return
 * ncclInProgress; then nothing else is called on the communicator, and nothing is queued on its
 * stream, until ncclCommGetAsyncError no longer says ncclInProgress (NCCL's rule for non-blocking
 * communicators). */

/* Linked into cephalo-worker-cuda only (the Makefile keeps it out of the CPU library and compiles
 * it with -I$(CUDA_HOME)/include). */

#include "comm/comm_internal.h"

#include <cuda_runtime.h>
/* nccl.h declares ncclGroupStart() and a few more without (void); it comes in by -I, not as a
 * system header, so its warnings would be ours */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/nccl_budget.h"
#include "common/strutil.h"
#include "devices/device.h"

/* NCCL takes at most 2048 operations between ncclGroupStart and ncclGroupEnd; the grouped
 * collectives (one operation per rank) go in groups of at most this many. */
#define GROUP_MAX 1024
#define UNIQUE_ID_KEY "cephalo/nccl/unique_id"

typedef enum { UNEVEN_AUTO, UNEVEN_GROUPED, UNEVEN_PAD } uneven_mode;

typedef enum { K_ALLGATHER, K_REDUCE_SCATTER, K_ALLREDUCE, K_BROADCAST, K_REDUCE } coll_kind;

/* One NCCL collective, launched on b->stream. */
typedef struct coll {
    coll_kind kind;
    const void *send;
    void *recv;
    size_t count;
    ncclDataType_t type;
    int root; /* broadcast, reduce */
} coll;

typedef struct nccl_backend nccl_backend;

struct nccl_backend {
    int rank, world, gpu;
    int cc_major; /* the GPU's compute capability, for the memory budget */
    double timeout_s;
    uneven_mode uneven;
    cudaStream_t compute; /* the caller's (registered) */
    cudaStream_t stream;  /* ours, non-blocking: every collective and copy */
    bool has_stream;
    cudaEvent_t done;     /* recorded after an operation's last work on stream */
    pthread_mutex_t mu;   /* serializes the calls on comm */
    ncclComm_t comm;      /* under mu; NULL once aborted */
    /* the communicator thread's (and nccl_open's / nccl_close's) */
    int64_t *off;          /* world+1 block offsets (elements) of the running operation */
    coll *colls;           /* world: the grouped collectives */
    void *scratch;         /* device: the padded blocks (CEPHALO_NCCL_UNEVEN=pad) */
    size_t scratch_cap;
    void *stage;           /* device: host values of allreduce / broadcast / barrier */
    size_t stage_cap;
    void *pinned;          /* page-locked host memory the staged values pass through */
    size_t pinned_cap;
    _Atomic int64_t device_bytes; /* scratch_cap + stage_cap */
    _Atomic int64_t sent, received; /* ring-equivalent payload bytes (comm.h) */
};

/* ------------------------------------------------------------------------------------------ */
/* errors and polling                                                                          */

static int cuda_fail(cudaError_t e, const char *call, err_t *err) {
    return err_set(err, "CUDA error in %s: %s (%s)", call, cudaGetErrorString(e), cudaGetErrorName(e));
}

static int cuda_ok(cudaError_t e, const char *call, err_t *err) {
    return e == cudaSuccess ? 0 : cuda_fail(e, call, err);
}

static const char *nccl_hint(ncclResult_t r) {
    switch (r) {
    case ncclRemoteError:
        return "a peer failed or its connection broke: see the other ranks' logs";
    case ncclSystemError:
        return "a system call or the network failed; NCCL_DEBUG=WARN says more";
    case ncclInvalidUsage:
        return "NCCL refused the call (two ranks on one GPU? then use CEPHALO_COMM_BACKEND=socket); NCCL_DEBUG=WARN says why";
    case ncclUnhandledCudaError:
        return "a CUDA call inside NCCL failed; NCCL_DEBUG=WARN says which";
    default:
        return "NCCL_DEBUG=WARN prints NCCL's own diagnostics";
    }
}

/* "NCCL error in CALL: what the code means: NCCL's last message (hint)". */
static int nccl_fail(nccl_backend *b, ncclResult_t r, const char *call, err_t *err) {
    char last[512] = "";
    pthread_mutex_lock(&b->mu);
    const char *s = b->comm ? ncclGetLastError(b->comm) : NULL;
    if (s) snprintf(last, sizeof last, "%s", s);
    pthread_mutex_unlock(&b->mu);
    return err_set(err, "NCCL error in %s: %s%s%s (%s)", call, ncclGetErrorString(r), last[0] ? ": " : "", last,
                   nccl_hint(r));
}

static int aborted_error(err_t *err) {
    return err_set(err, "the NCCL communicator was aborted (comm_abort)");
}

static void pause_us(unsigned *us) {
    struct timespec ts = {0, (long)*us * 1000};
    nanosleep(&ts, NULL);
    *us = *us < 100 ? *us * 2 : 200; /* 50, 100, 200, 200, ... */
}

/* The communicator's state: ncclSuccess, ncclInProgress or the error of an earlier call. */
static int comm_state(nccl_backend *b, ncclResult_t *state, err_t *err) {
    pthread_mutex_lock(&b->mu);
    if (!b->comm) {
        pthread_mutex_unlock(&b->mu);
        return aborted_error(err);
    }
    ncclResult_t r = ncclCommGetAsyncError(b->comm, state);
    pthread_mutex_unlock(&b->mu);
    if (r != ncclSuccess) *state = r;
    return 0;
}

/* After a call on the communicator returned r: waits while it is ncclInProgress (up to the
 * deadline), then 0 on ncclSuccess or the error. `hint` ends a timeout's message. */
static int settle(nccl_backend *b, ncclResult_t r, const char *call, double deadline, const char *hint, err_t *err) {
    for (unsigned us = 50; r == ncclInProgress;) {
        if (clock_now_s() > deadline)
            return err_set(err, "%s did not complete within %g s (timeout; CEPHALO_COMM_TIMEOUT sets it)%s", call,
                           b->timeout_s, hint);
        pause_us(&us);
        if (comm_state(b, &r, err) < 0) return -1;
    }
    return r == ncclSuccess ? 0 : nccl_fail(b, r, call, err);
}

static void abort_comm(nccl_backend *b) {
    pthread_mutex_lock(&b->mu);
    if (b->comm) {
        int prev = -1;
        cudaGetDevice(&prev);
        cudaSetDevice(b->gpu);
        ncclCommAbort(b->comm);
        b->comm = NULL;
        if (prev >= 0 && prev != b->gpu) cudaSetDevice(prev);
    }
    pthread_mutex_unlock(&b->mu);
}

/* ------------------------------------------------------------------------------------------ */
/* memory                                                                                      */

/* true: device memory of this rank's GPU (or managed memory); false: host memory. */
static int is_device(const nccl_backend *b, const void *p, bool *dev, err_t *err) {
    struct cudaPointerAttributes a;
    memset(&a, 0, sizeof a);
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError(); /* memory CUDA does not know: host memory */
        *dev = false;
        return 0;
    }
    if (a.type == cudaMemoryTypeDevice && a.device != b->gpu)
        return err_set(err, "the buffer is on GPU %d, but this rank's communicator is on GPU %d", a.device, b->gpu);
    *dev = a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
    return 0;
}

static int need_device(const nccl_backend *b, const void *p, err_t *err) {
    bool dev;
    if (is_device(b, p, &dev, err) < 0) return -1;
    if (!dev)
        return err_set(err, "the buffer is host memory, and the nccl backend gathers and reduce-scatters device memory only "
                            "(comm_device_buffers says which memory a backend takes)");
    return 0;
}

/* Grows a device buffer to at least `need` bytes. The stream is idle between operations, so the
 * old buffer is free to go (cudaFree waits for the device anyway). New memory is zeroed, so that
 * the padding a padded collective moves is never uninitialized. */
static int grow_device(nccl_backend *b, void **p, size_t *cap, size_t need, const char *what, err_t *err) {
    if (need <= *cap) return 0;
    if (*p) cudaFree(*p);
    atomic_fetch_sub(&b->device_bytes, (int64_t)*cap);
    *p = NULL, *cap = 0;
    cudaError_t e = cudaMalloc(p, need);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *p = NULL;
        char sz[32];
        return err_set(err, "cannot allocate %s of device memory on GPU %d for %s: %s", str_bytes((double)need, sz, sizeof sz),
                       b->gpu, what, cudaGetErrorString(e));
    }
    *cap = need;
    atomic_fetch_add(&b->device_bytes, (int64_t)need);
    return cuda_ok(cudaMemsetAsync(*p, 0, need, b->stream), "cudaMemsetAsync", err);
}

static int grow_pinned(nccl_backend *b, size_t need, err_t *err) {
    if (need <= b->pinned_cap) return 0;
    if (b->pinned) cudaFreeHost(b->pinned);
    b->pinned = NULL, b->pinned_cap = 0;
    size_t n = need < 4096 ? 4096 : need;
    cudaError_t e = cudaMallocHost(&b->pinned, n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        b->pinned = NULL;
        return err_set(err, "cannot allocate %zu bytes of page-locked host memory for staging: %s", n, cudaGetErrorString(e));
    }
    b->pinned_cap = n;
    return 0;
}

static int copy(nccl_backend *b, void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, err_t *err) {
    if (n == 0) return 0;
    return cuda_ok(cudaMemcpyAsync(dst, src, n, kind, b->stream), "cudaMemcpyAsync", err);
}

/* ------------------------------------------------------------------------------------------ */
/* launching collectives                                                                       */

static const char *const coll_names[] = {"ncclAllGather", "ncclReduceScatter", "ncclAllReduce", "ncclBroadcast", "ncclReduce"};

static ncclDataType_t nccl_type(comm_dtype t) {
    switch (t) {
    case COMM_F32: return ncclFloat32;
    case COMM_F64: return ncclFloat64;
    case COMM_I64: return ncclInt64;
    case COMM_BF16: return ncclBfloat16;
    case COMM_F16: return ncclFloat16;
    }
    return ncclFloat32;
}

/* Under b->mu. */
static ncclResult_t coll_call(nccl_backend *b, const coll *c) {
    switch (c->kind) {
    case K_ALLGATHER: return ncclAllGather(c->send, c->recv, c->count, c->type, b->comm, b->stream);
    case K_REDUCE_SCATTER: return ncclReduceScatter(c->send, c->recv, c->count, c->type, ncclSum, b->comm, b->stream);
    case K_ALLREDUCE: return ncclAllReduce(c->send, c->recv, c->count, c->type, ncclSum, b->comm, b->stream);
    case K_BROADCAST: return ncclBroadcast(c->send, c->recv, c->count, c->type, c->root, b->comm, b->stream);
    case K_REDUCE: return ncclReduce(c->send, c->recv, c->count, c->type, ncclSum, c->root, b->comm, b->stream);
    }
    return ncclInvalidArgument;
}

/* Launches n collectives on b->stream: one call, or groups of at most GROUP_MAX. Returns once
 * they are queued on the stream (not finished). */
static int launch(nccl_backend *b, const coll *cs, int n, double deadline, err_t *err) {
    for (int i = 0; i < n; i += GROUP_MAX) {
        int m = n - i < GROUP_MAX ? n - i : GROUP_MAX;
        const char *call = m > 1 ? "ncclGroupEnd" : coll_names[cs[i].kind];
        pthread_mutex_lock(&b->mu);
        if (!b->comm) {
            pthread_mutex_unlock(&b->mu);
            return aborted_error(err);
        }
        ncclResult_t r;
        if (m == 1) {
            r = coll_call(b, &cs[i]);
        } else if ((r = ncclGroupStart()) == ncclSuccess) {
            for (int j = 0; j < m && (r == ncclSuccess || r == ncclInProgress); j++) {
                r = coll_call(b, &cs[i + j]);
                if (r != ncclSuccess && r != ncclInProgress) call = coll_names[cs[i + j].kind];
            }
            ncclResult_t end = ncclGroupEnd(); /* closes the group even after a failed call */
            if (r == ncclSuccess || r == ncclInProgress) r = end;
        } else {
            call = "ncclGroupStart";
        }
        pthread_mutex_unlock(&b->mu);
        if (settle(b, r, call, deadline, "", err) < 0) return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* the operations                                                                              */

/* Host values to copy back from b->pinned once the operation has finished. */
typedef struct staged {
    void *host;
    size_t bytes;
} staged;

static void set_offsets(nccl_backend *b, const int64_t *counts, int64_t *max, bool *even) {
    b->off[0] = 0, *max = 0, *even = true;
    for (int i = 0; i < b->world; i++) {
        b->off[i + 1] = b->off[i] + counts[i];
        if (counts[i] > *max) *max = counts[i];
        if (counts[i] != counts[0]) *even = false;
    }
}

/* The scratch of a padded operation: world slots of max elements. */
static int pad_scratch(nccl_backend *b, int64_t max, size_t esz, const char *what, err_t *err) {
    if ((uint64_t)max > SIZE_MAX / esz / (size_t)b->world) return err_set(err, "%s: the padded buffer overflows", what);
    return grow_device(b, &b->scratch, &b->scratch_cap, (size_t)max * esz * (size_t)b->world, what, err);
}

/* In place: rank i's block of r->buf to every rank. */
static int allgatherv(nccl_backend *b, comm_req *r, double deadline, err_t *err) {
    size_t s = comm_dtype_size(r->dtype);
    ncclDataType_t type = nccl_type(r->dtype);
    int64_t max;
    bool even;
    set_offsets(b, r->counts, &max, &even);
    if (b->off[b->world] == 0) return 0;
    if (need_device(b, r->buf, err) < 0) return -1;
    uint8_t *buf = r->buf;
    const int64_t *c = r->counts, *off = b->off;
    if (even && b->uneven != UNEVEN_GROUPED) { /* NCCL's in-place allgather: send = recv + rank * count */
        coll one = {K_ALLGATHER, buf + (size_t)off[b->rank] * s, buf, (size_t)max, type, 0};
        return launch(b, &one, 1, deadline, err);
    }
    if (b->uneven == UNEVEN_PAD) {
        if (pad_scratch(b, max, s, "the padded allgatherv", err) < 0) return -1;
        size_t slot = (size_t)max * s;
        uint8_t *sc = b->scratch;
        if (copy(b, sc + (size_t)b->rank * slot, buf + (size_t)off[b->rank] * s, (size_t)c[b->rank] * s, cudaMemcpyDeviceToDevice, err) < 0) return -1;
        coll one = {K_ALLGATHER, sc + (size_t)b->rank * slot, sc, (size_t)max, type, 0};
        if (launch(b, &one, 1, deadline, err) < 0) return -1;
        for (int i = 0; i < b->world; i++)
            if (i != b->rank && copy(b, buf + (size_t)off[i] * s, sc + (size_t)i * slot, (size_t)c[i] * s, cudaMemcpyDeviceToDevice, err) < 0) return -1;
        return 0;
    }
    int n = 0; /* grouped: rank i broadcasts its block, in place */
    for (int i = 0; i < b->world; i++)
        if (c[i] > 0) b->colls[n++] = (coll){K_BROADCAST, buf + (size_t)off[i] * s, buf + (size_t)off[i] * s, (size_t)c[i], type, i};
    return launch(b, b->colls, n, deadline, err);
}

/* In place: this rank's block of r->buf becomes the sum over ranks of that block. */
static int reduce_scatterv(nccl_backend *b, comm_req *r, double deadline, err_t *err) {
    size_t s = comm_dtype_size(r->dtype);
    ncclDataType_t type = nccl_type(r->dtype);
    int64_t max;
    bool even;
    set_offsets(b, r->counts, &max, &even);
    if (b->off[b->world] == 0) return 0;
    if (need_device(b, r->buf, err) < 0) return -1;
    uint8_t *buf = r->buf;
    const int64_t *c = r->counts, *off = b->off;
    if (even && b->uneven != UNEVEN_GROUPED) { /* NCCL's in-place reduce-scatter: recv = send + rank * count */
        coll one = {K_REDUCE_SCATTER, buf, buf + (size_t)off[b->rank] * s, (size_t)max, type, 0};
        return launch(b, &one, 1, deadline, err);
    }
    if (b->uneven == UNEVEN_PAD) {
        if (pad_scratch(b, max, s, "the padded reduce-scatterv", err) < 0) return -1;
        size_t slot = (size_t)max * s;
        uint8_t *sc = b->scratch, *mine = sc + (size_t)b->rank * slot;
        for (int i = 0; i < b->world; i++)
            if (copy(b, sc + (size_t)i * slot, buf + (size_t)off[i] * s, (size_t)c[i] * s, cudaMemcpyDeviceToDevice, err) < 0) return -1;
        coll one = {K_REDUCE_SCATTER, sc, mine, (size_t)max, type, 0};
        if (launch(b, &one, 1, deadline, err) < 0) return -1;
        return copy(b, buf + (size_t)off[b->rank] * s, mine, (size_t)c[b->rank] * s, cudaMemcpyDeviceToDevice, err);
    }
    int n = 0; /* grouped: block i is summed onto rank i, in place */
    for (int i = 0; i < b->world; i++)
        if (c[i] > 0) b->colls[n++] = (coll){K_REDUCE, buf + (size_t)off[i] * s, buf + (size_t)off[i] * s, (size_t)c[i], type, i};
    return launch(b, b->colls, n, deadline, err);
}

/* allreduce, broadcast and barrier: device memory in place; host memory through b->stage. */
static int whole(nccl_backend *b, comm_req *r, double deadline, staged *sg, err_t *err) {
    coll one = {K_ALLREDUCE, NULL, NULL, 0, nccl_type(r->dtype), 0};
    void *buf = r->op == COMM_OP_BARRIER ? (void *)&r->one : r->buf;
    size_t bytes;
    if (r->op == COMM_OP_BROADCAST) {
        bytes = (size_t)r->bytes;
        one.kind = K_BROADCAST, one.count = bytes, one.type = ncclUint8, one.root = r->root;
    } else {
        int64_t n = 0;
        for (int i = 0; i < b->world; i++) n += r->counts[i];
        one.count = (size_t)n;
        bytes = (size_t)n * comm_dtype_size(r->dtype);
    }
    if (bytes == 0) return 0;
    bool dev;
    if (is_device(b, buf, &dev, err) < 0) return -1;
    void *p = buf;
    if (!dev) {
        if (grow_device(b, &b->stage, &b->stage_cap, bytes < 4096 ? 4096 : bytes, "staging host values", err) < 0) return -1;
        if (grow_pinned(b, bytes, err) < 0) return -1;
        memcpy(b->pinned, buf, bytes);
        if (copy(b, b->stage, b->pinned, bytes, cudaMemcpyHostToDevice, err) < 0) return -1;
        p = b->stage;
        sg->host = buf, sg->bytes = bytes;
    }
    one.send = one.recv = p;
    if (launch(b, &one, 1, deadline, err) < 0) return -1;
    return dev ? 0 : copy(b, b->pinned, b->stage, bytes, cudaMemcpyDeviceToHost, err);
}

/* Polls until the operation's work has finished on the GPU. Two bounds of timeout_s each: for the
 * compute work the operation waits for (queued before it was issued), and from then on for the
 * collective itself, where what this rank waits for is its peers. */
static int wait_done(nccl_backend *b, comm_req *r, err_t *err) {
    bool ready = r->ready == NULL;
    double since = clock_now_s();
    for (unsigned us = 50;;) {
        if (!ready) {
            cudaError_t e = cudaEventQuery((cudaEvent_t)r->ready);
            if (e == cudaSuccess) ready = true, since = clock_now_s();
            else if (e != cudaErrorNotReady) return cuda_fail(e, "cudaEventQuery (the compute stream's work)", err);
            else if (clock_now_s() - since > b->timeout_s)
                return err_set(err, "the compute work queued before this operation did not finish within %g s (timeout; "
                                    "CEPHALO_COMM_TIMEOUT sets it): is the GPU hung, or the compute stream waiting for "
                                    "this operation?", b->timeout_s);
        }
        cudaError_t e = cudaEventQuery(b->done);
        if (e == cudaSuccess) return 0;
        if (e != cudaErrorNotReady) return cuda_fail(e, "cudaEventQuery (the collective)", err);
        ncclResult_t st;
        if (comm_state(b, &st, err) < 0) return -1;
        if (st != ncclSuccess && st != ncclInProgress) return nccl_fail(b, st, "the collective", err);
        if (ready && clock_now_s() - since > b->timeout_s)
            return err_set(err, "the collective did not finish within %g s of this rank's data being ready (timeout; "
                                "CEPHALO_COMM_TIMEOUT sets it): a peer has probably failed or stalled, or the ranks "
                                "issued different operations (see the other ranks' logs)", b->timeout_s);
        pause_us(&us);
    }
}

/* The bytes the socket backend's ring would move for r (docs/comm.md, "Algorithms and bytes"). */
static void ring_equivalent(const nccl_backend *b, const comm_req *r, int64_t *sent, int64_t *received) {
    int n = b->world, me = b->rank, right = (me + 1) % n, left = (me + n - 1) % n;
    int64_t s = (int64_t)comm_dtype_size(r->dtype), total = 0;
    *sent = *received = 0;
    if (r->op == COMM_OP_BROADCAST) {
        int pos = (me - r->root + n) % n;
        *sent = pos < n - 1 ? r->bytes : 0;
        *received = pos > 0 ? r->bytes : 0;
        return;
    }
    const int64_t *c = r->counts;
    for (int i = 0; i < n; i++) total += c[i];
    switch (r->op) {
    case COMM_OP_ALLGATHERV:
        *sent = s * (total - c[right]), *received = s * (total - c[me]);
        break;
    case COMM_OP_REDUCE_SCATTERV:
        *sent = s * (total - c[me]), *received = s * (total - c[left]);
        break;
    default: /* allreduce and barrier: reduce-scatterv then allgatherv over the even split */
        *sent = s * (2 * total - c[me] - c[right]), *received = s * (2 * total - c[left] - c[me]);
        break;
    }
}

static int run_op(nccl_backend *b, comm_req *r, err_t *err) {
    double deadline = clock_now_s() + b->timeout_s; /* for queuing the work (NCCL may connect lazily) */
    if (r->ready && cuda_ok(cudaStreamWaitEvent(b->stream, (cudaEvent_t)r->ready, 0), "cudaStreamWaitEvent", err) < 0) return -1;
    staged sg = {NULL, 0};
    int rc;
    switch (r->op) {
    case COMM_OP_ALLGATHERV: rc = allgatherv(b, r, deadline, err); break;
    case COMM_OP_REDUCE_SCATTERV: rc = reduce_scatterv(b, r, deadline, err); break;
    default: rc = whole(b, r, deadline, &sg, err); break;
    }
    if (rc < 0) return -1;
    if (cuda_ok(cudaEventRecord(b->done, b->stream), "cudaEventRecord", err) < 0 || wait_done(b, r, err) < 0) return -1;
    if (sg.host) memcpy(sg.host, b->pinned, sg.bytes);
    if (r->op == COMM_OP_BARRIER && r->one != b->world)
        return err_set(err, "the ranks' barrier values sum to %lld, not %d (protocol error)", (long long)r->one, b->world);
    return 0;
}

/* On the communicator thread: runs r and returns once it has finished on the GPU (or failed: then
 * the NCCL communicator is aborted). */
static int nccl_run(void *state, comm_req *r, err_t *err) {
    nccl_backend *b = state;
    int rc = cuda_ok(cudaSetDevice(b->gpu), "cudaSetDevice", err);
    if (rc == 0) rc = run_op(b, r, err);
    if (rc < 0) {
        abort_comm(b); /* the communicator is broken (comm.c); peers may then fail sooner */
        return -1;
    }
    int64_t sent, received;
    ring_equivalent(b, r, &sent, &received);
    atomic_fetch_add(&b->sent, sent);
    atomic_fetch_add(&b->received, received);
    return 0;
}

/* On the issuing thread: records r->ready on the compute stream when r's buffer is device memory. */
static int nccl_issue(void *state, comm_req *r, err_t *err) {
    nccl_backend *b = state;
    void *p = r->op == COMM_OP_BARRIER ? NULL : r->buf;
    if (!p) return 0;
    int prev = b->gpu; /* the caller's current device, restored */
    if (cuda_ok(cudaGetDevice(&prev), "cudaGetDevice", err) < 0) return -1;
    if (prev != b->gpu && cuda_ok(cudaSetDevice(b->gpu), "cudaSetDevice", err) < 0) return -1;
    bool dev;
    int rc = is_device(b, p, &dev, err);
    if (rc == 0 && dev) { /* host values need no event: they are complete at issue */
        cudaEvent_t e;
        rc = cuda_ok(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags", err);
        if (rc == 0 && (rc = cuda_ok(cudaEventRecord(e, b->compute), "cudaEventRecord (the compute stream)", err)) < 0) cudaEventDestroy(e);
        if (rc == 0) r->ready = e;
    }
    if (prev != b->gpu) cudaSetDevice(prev);
    return rc;
}

static void nccl_req_free(comm_req *r) {
    if (r->ready) cudaEventDestroy((cudaEvent_t)r->ready);
    r->ready = NULL;
}

static void nccl_bytes(const void *state, int64_t *sent, int64_t *received) {
    const nccl_backend *b = state;
    *sent = atomic_load(&((nccl_backend *)b)->sent);
    *received = atomic_load(&((nccl_backend *)b)->received);
}

static int64_t nccl_scratch_bytes(const void *state) { return atomic_load(&((nccl_backend *)state)->device_bytes); }

/* ncclCommAbort, from any thread: serialized with the communicator thread's NCCL calls. */
static void nccl_shutdown(void *state) {
    if (state) abort_comm(state);
}

/* ------------------------------------------------------------------------------------------ */
/* rendezvous                                                                                  */

typedef struct gpu_entry {
    char uuid[48];
    int rank;
} gpu_entry;

static int by_uuid(const void *a, const void *b) {
    const gpu_entry *x = a, *y = b;
    int c = strcmp(x->uuid, y->uuid);
    return c ? c : (x->rank > y->rank) - (x->rank < y->rank);
}

static void gpu_key(char *key, size_t n, int rank) { snprintf(key, n, "cephalo/nccl/gpu/%d", rank); }

/* "GPU-<uuid> <PCI bus id> <host>": what this rank publishes about its GPU. */
static int describe_gpu(int gpu, char *out, size_t n, err_t *err) {
    struct cudaDeviceProp prop;
    char bus[32] = "?", host[256] = "?";
    if (cuda_ok(cudaGetDeviceProperties(&prop, gpu), "cudaGetDeviceProperties", err) < 0) return -1;
    if (cudaDeviceGetPCIBusId(bus, sizeof bus, gpu) != cudaSuccess) (void)cudaGetLastError();
    if (gethostname(host, sizeof host) < 0) snprintf(host, sizeof host, "?");
    host[sizeof host - 1] = '\0';
    const unsigned char *u = (const unsigned char *)prop.uuid.bytes;
    snprintf(out, n, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x %s %s", u[0], u[1], u[2],
             u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15], bus, host);
    return 0;
}

/* Rank 0: reads every rank's GPU and fails when two ranks share one (NCCL cannot run them). */
static int check_gpus(const nccl_backend *b, store_client *st, err_t *err) {
    gpu_entry *e = xcalloc((size_t)b->world, sizeof *e);
    char (*desc)[384] = xcalloc((size_t)b->world, sizeof *desc);
    int rc = 0;
    for (int i = 0; i < b->world && rc == 0; i++) {
        char key[64];
        size_t n;
        gpu_key(key, sizeof key, i);
        if (store_get(st, key, desc[i], sizeof desc[i] - 1, &n, err) < 0) {
            rc = err_prefix(err, "waiting for rank %d's GPU", i);
            break;
        }
        desc[i][n] = '\0';
        snprintf(e[i].uuid, sizeof e[i].uuid, "%.*s", (int)strcspn(desc[i], " "), desc[i]);
        e[i].rank = i;
    }
    if (rc == 0) qsort(e, (size_t)b->world, sizeof *e, by_uuid);
    for (int i = 1; i < b->world && rc == 0; i++)
        if (strcmp(e[i - 1].uuid, e[i].uuid) == 0)
            rc = err_set(err, "ranks %d and %d share one GPU (%s): NCCL needs a GPU of its own for every rank; run several "
                              "ranks per GPU with CEPHALO_COMM_BACKEND=socket",
                         e[i - 1].rank, e[i].rank, desc[e[i].rank]);
    free(desc);
    free(e);
    return rc;
}

/* The unique id of the communicator: rank 0 makes it (after checking the GPUs) and publishes it
 * as 'I' + id, or 'E' + why it refused, so that the other ranks fail at once rather than by
 * timeout; the others read it. */
static int exchange_id(nccl_backend *b, store_client *st, ncclUniqueId *id, err_t *err) {
    char me[384], key[64];
    gpu_key(key, sizeof key, b->rank);
    if (describe_gpu(b->gpu, me, sizeof me, err) < 0 || store_set(st, key, me, strlen(me), err) < 0) return -1;
    uint8_t val[1 + sizeof(ncclUniqueId) + sizeof err->msg];
    size_t n;
    if (b->rank == 0) {
        int rc = check_gpus(b, st, err);
        ncclResult_t r = ncclSuccess;
        if (rc == 0 && (r = ncclGetUniqueId(id)) != ncclSuccess)
            rc = err_set(err, "NCCL error in ncclGetUniqueId: %s (%s)", ncclGetErrorString(r), nccl_hint(r));
        if (rc == 0) {
            val[0] = 'I';
            memcpy(val + 1, id, sizeof *id);
            n = 1 + sizeof *id;
        } else {
            val[0] = 'E';
            n = 1 + (size_t)snprintf((char *)val + 1, sizeof val - 1, "%s", err->msg);
            if (n > sizeof val - 1) n = sizeof val - 1;
        }
        err_t ignored;
        if (store_set(st, UNIQUE_ID_KEY, val, n, rc == 0 ? err : &ignored) < 0 && rc == 0) return -1;
        return rc;
    }
    if (store_get(st, UNIQUE_ID_KEY, val, sizeof val - 1, &n, err) < 0) return err_prefix(err, "waiting for rank 0's NCCL id");
    if (n >= 1 && val[0] == 'E') {
        val[n] = '\0';
        return err_set(err, "rank 0 stopped the rendezvous: %s", (char *)val + 1);
    }
    if (n != 1 + sizeof *id || val[0] != 'I') return err_set(err, "rank 0 published a malformed NCCL id (%zu bytes)", n);
    memcpy(id, val + 1, sizeof *id);
    return 0;
}

static int create_comm(nccl_backend *b, const ncclUniqueId *id, err_t *err) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0; /* every call returns at once, so that init and collectives can time out */
    config.commName = "cephalo";
    ncclComm_t nc = NULL;
    ncclResult_t r = ncclCommInitRankConfig(&nc, b->world, *id, b->rank, &config);
    if (!nc) return err_set(err, "NCCL error in ncclCommInitRankConfig: %s (%s)", ncclGetErrorString(r), nccl_hint(r));
    b->comm = nc;
    if (settle(b, r, "ncclCommInitRankConfig", clock_now_s() + b->timeout_s,
               ": a rank has not joined, or NCCL cannot reach it (NCCL_SOCKET_IFNAME picks NCCL's network "
               "interface; NCCL_DEBUG=INFO shows its progress)", err) < 0) {
        abort_comm(b);
        return -1;
    }
    return 0;
}

/* NCCL's own buffers are outside every allocator of ours: they come off the device's capacity
 * before the communicator takes them (common/nccl_budget.h has the estimate and its sources). */
static int budget_nccl(nccl_backend *b, err_t *err) {
    if (cuda_ok(cudaDeviceGetAttribute(&b->cc_major, cudaDevAttrComputeCapabilityMajor, b->gpu),
                "cudaDeviceGetAttribute", err) < 0)
        return -1;
    return cuda_device_reserve(b->gpu, nccl_device_bytes(b->world, b->cc_major),
                               "NCCL's communicator buffers", err);
}

static uneven_mode parse_uneven(const char *s) {
    return !strcmp(s, "grouped") ? UNEVEN_GROUPED : !strcmp(s, "pad") ? UNEVEN_PAD : UNEVEN_AUTO;
}

static void nccl_close(void *state);

/* comm_set_device_stream: cudaSetDevice(gpu), checks through the store that no two ranks share a
 * GPU, meets through the store (rank 0's ncclUniqueId), creates the non-blocking NCCL
 * communicator (bounded by the timeout) and the backend's stream. */
static int nccl_open(const comm_config *cfg, store_client *st, int gpu, void *compute_stream, void **out, err_t *err) {
    *out = NULL;
    int ngpu = 0;
    if (cuda_ok(cudaGetDeviceCount(&ngpu), "cudaGetDeviceCount", err) < 0) return -1;
    if (gpu >= ngpu) return err_set(err, "GPU %d does not exist (%d visible; CUDA_VISIBLE_DEVICES selects them)", gpu, ngpu);
    if (cuda_ok(cudaSetDevice(gpu), "cudaSetDevice", err) < 0) return -1;
    nccl_backend *b = xcalloc(1, sizeof *b);
    b->rank = cfg->rank, b->world = cfg->world, b->gpu = gpu, b->timeout_s = cfg->timeout_s;
    b->uneven = parse_uneven(cfg->nccl_uneven);
    b->compute = (cudaStream_t)compute_stream;
    pthread_mutex_init(&b->mu, NULL);
    b->off = xcalloc((size_t)b->world + 1, sizeof *b->off);
    b->colls = xcalloc((size_t)b->world, sizeof *b->colls);
    ncclUniqueId id;
    int rc = budget_nccl(b, err);
    size_t free_before = 0, free_after = 0, total = 0;
    if (rc == 0 && cudaMemGetInfo(&free_before, &total) != cudaSuccess) (void)cudaGetLastError();
    if (rc == 0) rc = exchange_id(b, st, &id, err);
    if (rc == 0) rc = create_comm(b, &id, err);
    if (rc == 0 && free_before && cudaMemGetInfo(&free_after, &total) == cudaSuccess)
        log_msg("info", "rank %d: NCCL's communicator took %lld MiB of GPU %d at set-up (budget %lld MiB; "
                "buffers connected at the first collectives come on top)", b->rank,
                (long long)(((int64_t)free_before - (int64_t)free_after) >> 20), gpu,
                (long long)(nccl_device_bytes(b->world, b->cc_major) >> 20));
    if (rc == 0) rc = cuda_ok(cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags", err);
    if (rc == 0) b->has_stream = true;
    if (rc == 0) rc = cuda_ok(cudaEventCreateWithFlags(&b->done, cudaEventDisableTiming), "cudaEventCreateWithFlags", err);
    if (rc < 0) {
        abort_comm(b); /* the peers' init then fails sooner */
        nccl_close(b);
        return -1;
    }
    *out = b;
    return 0;
}

/* After the communicator thread has stopped: finalizes and destroys the communicator (aborts it
 * when that does not complete within the timeout) and frees the rest. */
static void nccl_close(void *state) {
    nccl_backend *b = state;
    if (!b) return;
    cudaSetDevice(b->gpu);
    if (b->comm) {
        err_t e;
        if (settle(b, ncclCommFinalize(b->comm), "ncclCommFinalize", clock_now_s() + b->timeout_s, "", &e) == 0) {
            ncclCommDestroy(b->comm);
            b->comm = NULL;
        } else {
            log_warn("rank %d: closing the NCCL communicator: %s; aborting it", b->rank, e.msg);
            abort_comm(b);
        }
    }
    if (b->has_stream) cudaStreamDestroy(b->stream);
    if (b->done) cudaEventDestroy(b->done);
    if (b->scratch) cudaFree(b->scratch);
    if (b->stage) cudaFree(b->stage);
    if (b->pinned) cudaFreeHost(b->pinned);
    pthread_mutex_destroy(&b->mu);
    free(b->colls);
    free(b->off);
    free(b);
}

/* ------------------------------------------------------------------------------------------ */
/* the backend's table (comm_internal.h)                                                       */

static const comm_backend nccl_comm_backend = {
    .name = "nccl",
    .device_buffers = true,
    .open = nccl_open,
    .issue = nccl_issue,
    .run = nccl_run,
    .req_free = nccl_req_free,
    .bytes = nccl_bytes,
    .scratch_bytes = nccl_scratch_bytes,
    .shutdown = nccl_shutdown,
    .close = nccl_close,
};

/* Linked into cephalo-worker-cuda (and the GPU tests) only: there CEPHALO_COMM_BACKEND=nccl finds
 * this backend; the CPU binaries never reference this file. */
__attribute__((constructor)) static void nccl_register(void) { comm_backend_register(&nccl_comm_backend); }
