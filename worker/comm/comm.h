/* comm.h - collectives between the ranks of a job (docs/architecture.md): allgatherv, reduce-scatterv (sum),
 * allreduce (sum), broadcast and barrier, all asynchronous with wait handles, plus the TCP
 * key-value store of the rendezvous.
 *
 *   comm_config cc;
 *   comm_config_from_env(&cc, rank, world, &err);     // MASTER_ADDR, MASTER_PORT, timeout
 *   comm *c = comm_open(&cc, &err);                    // rendezvous through rank 0's store
 *   comm_req *r = comm_allgatherv(c, buf, counts, COMM_F32, "unit 3 parameters");
 *   ...compute...
 *   if (comm_wait(c, r, &err) < 0) ...;                // every error names rank, op, what, peer
 *   comm_close(c);
 *
 * Semantics shared by every operation:
 *  - Every rank issues the same operations in the same order (like NCCL and MPI); operations run
 *    one after another on the communicator's own thread, in issue order, overlapping with the
 *    caller's compute. Buffers must stay valid and untouched until the request is waited for.
 *  - Sizes are per-rank element counts (counts[world]); any may be 0. Rank i's block of a full
 *    buffer starts at the prefix sum of counts[0..i-1] (the plan's shard_sizes convention).
 *  - Operations are in place, as NCCL's are: allgatherv reads each rank's own block of buf and
 *    fills the others; reduce-scatterv leaves in this rank's block the sum over ranks of that
 *    block and clobbers the rest of buf.
 *  - Timeouts: no operation blocks longer than timeout_s without progress. A peer that dies
 *    (connection closed) fails the operation at once; a peer that stalls fails it after the
 *    timeout (and a grace of at most a quarter of it, to ask the peer). After the first failure the communicator is broken: every later operation fails
 *    immediately with the first error. So a failure anywhere reaches every rank in bounded time.
 *    The socket backend also tells every rank where the failure started: a stalled peer is named
 *    as "rank P stopped answering" on every rank, not only on its neighbours, and each failing rank
 *    writes one machine-readable line to stderr, "cephalo-comm-failure rank=R origin=P
 *    cause=stalled|closed|failed", that launchers read (docs/comm.md, "Abort frames").
 *  - Results are identical on every rank (allreduce reduces each element in one fixed order and
 *    distributes it), and deterministic from run to run for a given world size.
 *  - With world 1 nothing touches the network: every operation completes at once.
 *
 * The socket backend (comm_socket.c) connects the ranks in a ring (rank r sends to r+1 and
 * receives from r-1) and uses ring algorithms, which are bandwidth-optimal: each rank sends
 * (world-1)/world of a collective's bytes. Its buffers are host memory.
 *
 * The nccl backend (comm_nccl.c, in cephalo-worker-cuda only) runs the collectives with NCCL on
 * DEVICE memory, one GPU per rank. It starts with comm_set_device_stream (every rank calls it once,
 * before its first operation): each request then waits, on the GPU, for the work queued on the
 * registered compute stream when it was issued, and comm_wait returns once the collective has
 * finished on the GPU, so compute queued after comm_wait sees the result. Host buffers are staged
 * through device memory for allreduce, broadcast and barrier (small values such as a loss);
 * allgatherv and reduce-scatterv need device memory. docs/comm.md has the details. */
#ifndef CEPHALO_COMM_H
#define CEPHALO_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/env.h"
#include "common/err.h"

#define COMM_DEFAULT_TIMEOUT_S ((double)ENV_COMM_TIMEOUT_S) /* common/env.h: the one default */
#define COMM_MAX_WORLD 4096
/* The socket backend moves reductions and broadcasts in segments of this many bytes: reduce-
 * scatterv receives each partial sum into one scratch segment per communicator (its only buffer
 * besides the kernel's socket buffers, whatever the message size) and adds it into place; a
 * broadcast forwards each segment as soon as it has arrived. */
#define COMM_SEGMENT_BYTES (1 << 20)

typedef struct comm comm;
typedef struct comm_req comm_req;

/* BF16 / F16: 2-byte bfloat16 / IEEE half bit patterns. Every backend moves them (allgatherv,
 * broadcast); only the nccl backend sums them (the socket backend fails reduce-scatterv and
 * allreduce of BF16 and F16). */
typedef enum { COMM_F32, COMM_F64, COMM_I64, COMM_BF16, COMM_F16 } comm_dtype;

typedef struct comm_config {
    int rank, world;
    char master_addr[256]; /* host name or address of rank 0's store */
    int master_port;       /* 1..65535 */
    double timeout_s;      /* no-progress bound for every blocking step */
    char backend[16];      /* "socket" or "nccl" */
    char job_id[64];       /* the store refuses ranks of another job ("" on every rank: unchecked) */
    char nccl_uneven[16];  /* nccl: uneven counts as "grouped", "pad" or "auto" ("" = "auto") */
} comm_config;

typedef struct comm_stats {
    int64_t allgathers, reduce_scatters, allreduces, broadcasts, barriers; /* completed ops */
    /* payload bytes over the network; nccl: what the socket backend's ring would move for the
     * same operations (NCCL's own traffic depends on its algorithm), so runs stay comparable */
    int64_t bytes_sent, bytes_received;
    double busy_ms; /* time the communicator thread spent running operations */
} comm_stats;

/* Fills cfg from MASTER_ADDR (default 127.0.0.1), MASTER_PORT (required when world > 1),
 * CEPHALO_COMM_TIMEOUT (seconds, default 60), CEPHALO_COMM_BACKEND ("socket", the default, or
 * "nccl"), CEPHALO_JOB_ID (optional, at most 63 characters) and CEPHALO_NCCL_UNEVEN ("auto", the
 * default, "grouped" or "pad"). Bad values are an error that names the variable; "nccl" is one in
 * a worker built without CUDA. */
int comm_config_from_env(comm_config *cfg, int rank, int world, err_t *err);

/* Rendezvous: rank 0 serves the key-value store on master_addr:master_port; every rank connects
 * to it (retrying until the timeout, so ranks may start in any order), publishes its own
 * listening address, and connects to its ring neighbours (socket backend; the nccl backend meets
 * in comm_set_device_stream, once the GPU is known). */
comm *comm_open(const comm_config *cfg, err_t *err);
/* Registers the caller's compute stream (a cudaStream_t, NULL for the legacy default stream) and
 * its GPU (an index among the visible GPUs). The nccl backend (world > 1) then creates its NCCL
 * communicator: a collective call, every rank makes it once, before its first operation, bounded
 * by the timeout; it fails when two ranks share a GPU (NCCL cannot; use the socket backend). It
 * also creates the backend's own stream on that GPU, and leaves `gpu` current on the calling
 * thread. A no-op for the socket backend. Called twice, it is an error. */
int comm_set_device_stream(comm *c, void *compute_stream, int gpu, err_t *err);
/* True when the collectives' buffers are device memory (nccl), false when host memory (socket). */
bool comm_device_buffers(const comm *c);
/* Device memory the backend allocated beside the caller's buffers (cudaMalloc, not counted by the
 * caller's allocator): the nccl backend's padding scratch (CEPHALO_NCCL_UNEVEN=pad: world x the
 * largest block of the largest padded operation so far) and its staging buffer for host values.
 * It grows lazily, to the largest operation that needed it. 0 for the socket backend. */
int64_t comm_device_scratch_bytes(const comm *c);
/* Waits for queued operations (bounded by the timeout), then closes the connections. Rank 0's
 * store stays up until every rank has said goodbye or the timeout passes. */
void comm_close(comm *c);
/* Closes every connection at once (peers then fail fast instead of timing out), e.g. when this
 * rank hits an error of its own. Every later operation fails with "rank R: communicator aborted:
 * why". Callable from any thread while operations run, but not during comm_close. The
 * communicator stays valid for comm_close. nccl: aborts the NCCL communicator (ncclCommAbort);
 * peers inside a collective with this rank fail when NCCL's transport notices or by timeout. */
void comm_abort(comm *c, const char *why);

int comm_rank(const comm *c);
int comm_world(const comm *c);
double comm_timeout_s(const comm *c);

/* `what` names the data in error messages ("unit 3 parameters"); copied. */
comm_req *comm_allgatherv(comm *c, void *buf, const int64_t *counts, comm_dtype t,
                          const char *what);
comm_req *comm_reduce_scatterv(comm *c, void *buf, const int64_t *counts, comm_dtype t,
                               const char *what); /* F32, F64 or BF16 (BF16: nccl only) */
comm_req *comm_allreduce(comm *c, void *buf, int64_t count, comm_dtype t, const char *what);
comm_req *comm_broadcast(comm *c, void *buf, int64_t bytes, int root, const char *what);
comm_req *comm_barrier(comm *c, const char *what);

/* Waits for a request and frees it; -1 with the operation's error. NULL is a no-op success. */
int comm_wait(comm *c, comm_req *r, err_t *err);
/* Issue + wait in one call. */
int comm_run(comm *c, comm_req *r, err_t *err);

void comm_get_stats(const comm *c, comm_stats *out);

/* The rendezvous store, for other users (the nccl backend's unique id, a job's start time).
 * get blocks until the key is set or the timeout passes; *n receives the value's length. */
int comm_store_set(comm *c, const char *key, const void *val, size_t n, err_t *err);
int comm_store_get(comm *c, const char *key, void *val, size_t cap, size_t *n, err_t *err);

#endif
