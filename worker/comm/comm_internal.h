/* comm_internal.h - what the parts of the comm layer share; not for other modules.
 *
 *   comm_types.c   the operations' names and the element types' sizes (below all the others)
 *   comm.c         config, request queue, the communicator thread, stats, broken state; it runs
 *                  every request through a backend (comm_backend, below)
 *   comm_net.c     TCP helpers: deadlines, connect with retry, reads and writes with a deadline
 *   comm_store.c   the rendezvous key-value store: rank 0's server and every rank's client
 *   comm_socket.c  the socket backend: the ring and its collectives
 *   comm_nccl.c    the nccl backend (cephalo-worker-cuda only: it registers itself when linked)
 *
 * Errors from comm_net/comm_store/comm_socket name the peer and the cause; comm.c prefixes them
 * with "rank R: OP of WHAT". */
#ifndef CEPHALO_COMM_INTERNAL_H
#define CEPHALO_COMM_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "comm/comm.h"

/* ------------------------------------------------------------------------------------------ */
/* requests (comm.c creates them, the backend runs them)                                       */

typedef enum {
    COMM_OP_ALLGATHERV,
    COMM_OP_REDUCE_SCATTERV,
    COMM_OP_ALLREDUCE,
    COMM_OP_BROADCAST,
    COMM_OP_BARRIER
} comm_op;

struct comm_req {
    comm_op op;
    comm_dtype dtype;
    void *buf;
    int64_t *counts;  /* per rank: allgatherv, reduce-scatterv; allreduce: the even split */
    int64_t bytes;    /* broadcast */
    int root;         /* broadcast */
    int64_t one;      /* barrier: the value allreduced (1 per rank, world after) */
    void *ready;      /* nccl: a cudaEvent_t recorded on the compute stream at issue, or NULL */
    char what[96];
    /* under comm.mu */
    bool done;
    int rc;
    err_t err;
    comm_req *next;             /* queue of issued requests */
    comm_req *live_prev, *live_next; /* every request not yet waited for */
};

/* comm_types.c: below comm.c and every backend, which all name operations and size elements. */
const char *comm_op_name(comm_op op);
size_t comm_dtype_size(comm_dtype t);

/* ------------------------------------------------------------------------------------------ */
/* little-endian wire fields                                                                   */

static inline void comm_put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void comm_put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint32_t comm_get32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static inline uint64_t comm_get64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* ------------------------------------------------------------------------------------------ */
/* TCP helpers (comm_net.c)                                                                    */

/* Socket buffer size asked for on ring connections (the kernel caps it at net.core.*mem_max);
 * 0 leaves them to the kernel's autotuning. */
#ifndef NET_SOCKET_BUFFER
#define NET_SOCKET_BUFFER (4 << 20)
#endif

/* Milliseconds until the deadline for poll(), at least 0. */
int net_ms_left(double deadline);
/* Connects to host:port, retrying refusals and unresolvable names until the deadline (the peer
 * may not be listening yet, its DNS name may not exist yet). Returns a non-blocking fd or -1. */
int net_connect(const char *host, int port, double deadline, err_t *err);
/* Whole reads and writes on a non-blocking fd, bounded by the deadline. 0, or -1 with errno
 * (ETIMEDOUT at the deadline, ECONNRESET when the peer closed the connection). */
int net_write_all(int fd, const void *p, size_t n, double deadline);
int net_read_all(int fd, void *p, size_t n, double deadline);
void net_set_nonblocking(int fd);
/* TCP_NODELAY and large buffers: the ring sends big messages in both directions at once. */
void net_tune(int fd);
/* "1.2.3.4:5" or "[::1]:5". */
void net_addr_str(const struct sockaddr *sa, char *buf, size_t n);
/* Splits "host:port" / "[v6]:port"; false when malformed. */
bool net_split_hostport(const char *s, char *host, size_t hostsz, int *port);
/* The message for a failed net_* call: "closed the connection", "timeout", strerror. */
const char *net_strerror(int errnum);

/* ------------------------------------------------------------------------------------------ */
/* the rendezvous store (comm_store.c)                                                         */

#define STORE_MAX_KEY 255
#define STORE_MAX_VALUE (1 << 20)

typedef struct store_server store_server;
typedef struct store_client store_client;

/* Rank 0: binds master_addr:master_port and serves on its own thread. */
int store_serve(const comm_config *cfg, store_server **out, err_t *err);
/* Stops serving once every rank has said goodbye (or disconnected), or after wait_s. */
void store_serve_stop(store_server *s, double wait_s);

/* Connects (retrying until the timeout) and introduces this rank; the server refuses a rank of
 * another job or world size, or a rank already connected. */
int store_connect(const comm_config *cfg, store_client **out, err_t *err);
/* world 1: a store in this process, nothing on the network. */
store_client *store_local(const comm_config *cfg);
int store_set(store_client *s, const char *key, const void *val, size_t n, err_t *err);
int store_get(store_client *s, const char *key, void *val, size_t cap, size_t *n, err_t *err);
/* The local address of the connection to the store: an address the other ranks can reach. */
int store_local_addr(store_client *s, struct sockaddr_storage *ss, socklen_t *len, err_t *err);
/* Fails every later call at once (comm_abort); the client stays valid for store_close. */
void store_shutdown(store_client *s);
/* Says goodbye (rank 0 stops serving after every rank has) and frees. */
void store_close(store_client *s);

/* ------------------------------------------------------------------------------------------ */
/* backends: comm.c runs every request through one, as the devices run ops through dev_ops      */

/* A backend's functions on its own state (a ring, an NCCL communicator). comm.c serializes run
 * on the communicator thread; shutdown and req_free may come from any thread. */
typedef struct comm_backend {
    const char *name;    /* CEPHALO_COMM_BACKEND's value */
    bool device_buffers; /* the collectives' buffers are device memory (comm_device_buffers) */
    /* This rank's side: opened in comm_open for a host backend (gpu -1, no stream) and in
     * comm_set_device_stream for a device backend, once the GPU is known. */
    int (*open)(const comm_config *cfg, store_client *st, int gpu, void *compute_stream, void **state,
                err_t *err);
    /* On the issuing thread, before r is queued; NULL: nothing to do. */
    int (*issue)(void *state, comm_req *r, err_t *err);
    /* On the communicator thread: runs r; the error names the peer and the cause (comm.c adds the
     * rank and the operation). */
    int (*run)(void *state, comm_req *r, err_t *err);
    /* Frees what issue attached to r (r->ready); NULL: nothing. */
    void (*req_free)(comm_req *r);
    /* Payload bytes moved so far (stats). */
    void (*bytes)(const void *state, int64_t *sent, int64_t *received);
    /* Device memory of its own (comm_device_scratch_bytes); NULL: none. */
    int64_t (*scratch_bytes)(const void *state);
    /* Fails the running operation and every later one at once (peers notice: connections close,
     * the NCCL communicator aborts). */
    void (*shutdown)(void *state);
    /* After the communicator thread has stopped. */
    void (*close)(void *state);
} comm_backend;

/* The socket backend (comm_socket.c): always there. */
extern const comm_backend comm_socket_backend;
/* Makes a backend known by its name: comm_nccl.c registers itself at start-up in the binaries it
 * is linked into (cephalo-worker-cuda), so the CPU binaries need no reference to it. */
void comm_backend_register(const comm_backend *b);


#endif
