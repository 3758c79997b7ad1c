/* comm.c - the generic part of the comm layer (comm.h, docs/comm.md): configuration from the
 * environment, the request queue and the communicator thread that runs requests in issue order,
 * waiting, stats, world 1 without a network, and the broken state. It runs each request on the
 * backend's table (comm_internal.h's comm_backend): the socket backend (comm_socket.c), or the
 * nccl backend (comm_nccl.c).
 *
 * The nccl backend is linked into cephalo-worker-cuda only, where it registers itself at start-up
 * (comm_backend_register); in the CPU binaries the name "nccl" is then unknown, and configuring it
 * is an error that names the binary to use.
 *
 * One mutex guards the queue, the requests' completion and the stats; one condition variable
 * signals both "a request was queued" (to the communicator thread) and "a request completed" (to
 * waiters): waiters are few and wake-ups cheap, so one variable keeps the protocol obvious. */
#include "comm/comm.h"

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "common/clock.h"
#include "common/env.h"
#include "common/log.h"
#include "common/strutil.h"

/* The backends this binary has: the socket backend, and those registered at start-up. */
#define MAX_BACKENDS 4
static const comm_backend *backends[MAX_BACKENDS] = {&comm_socket_backend};
static int n_backends = 1;

void comm_backend_register(const comm_backend *b) {
    CHECK(n_backends < MAX_BACKENDS);
    backends[n_backends++] = b;
}

static const comm_backend *find_backend(const char *name) {
    for (int i = 0; i < n_backends; i++)
        if (!strcmp(backends[i]->name, name)) return backends[i];
    return NULL;
}

struct comm {
    comm_config cfg;
    const comm_backend *be; /* cfg.backend's */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    comm_req *head, *tail; /* issued, not run yet */
    comm_req *live;        /* not waited for yet: comm_close frees them */
    bool stopping, broken, has_thread;
    err_t first_err; /* once broken, every operation fails with it */
    comm_stats stats;
    pthread_t thread;
    store_server *server; /* rank 0 */
    store_client *store;
    void *state;     /* the backend's, world > 1: set in comm_open (host buffers) or, under mu, in
                        comm_set_device_stream (device buffers); NULL until then */
    bool device_set; /* comm_set_device_stream succeeded */
};

/* ------------------------------------------------------------------------------------------ */
/* configuration                                                                               */

static int env_port(const char *s, int *port, err_t *err) {
    long v;
    if (!str_to_long(s, &v) || v < 1 || v > 65535)
        return err_set(err, "MASTER_PORT: '%s' is not a port (expected an integer 1..65535)", s);
    *port = (int)v;
    return 0;
}

static int copy_var(const char *name, const char *s, char *dst, size_t cap, err_t *err) {
    if (strlen(s) >= cap) return err_set(err, "%s: '%.40s...' is too long (at most %zu characters)", name, s, cap - 1);
    memcpy(dst, s, strlen(s) + 1);
    return 0;
}

static int check_config(const comm_config *c, err_t *err) {
    if (c->world < 1 || c->world > COMM_MAX_WORLD)
        return err_set(err, "world size %d is out of range (expected 1..%d)", c->world, COMM_MAX_WORLD);
    if (c->rank < 0 || c->rank >= c->world)
        return err_set(err, "rank %d is out of range for world size %d (expected 0..%d)", c->rank, c->world, c->world - 1);
    if (!(c->timeout_s > 0 && c->timeout_s <= 1e6))
        return err_set(err, "CEPHALO_COMM_TIMEOUT: %g s is out of range (expected seconds > 0, at most 1e6)", c->timeout_s);
    if (strcmp(c->backend, "nccl") == 0 && !find_backend("nccl"))
        return err_set(err, "CEPHALO_COMM_BACKEND: 'nccl' needs cephalo-worker-cuda (this worker was built without CUDA)");
    if (!find_backend(c->backend))
        return err_set(err, "CEPHALO_COMM_BACKEND: '%s' is not a backend (expected 'socket' or 'nccl')", c->backend);
    const char *u = c->nccl_uneven;
    if (u[0] && strcmp(u, "auto") != 0 && strcmp(u, "grouped") != 0 && strcmp(u, "pad") != 0)
        return err_set(err, "CEPHALO_NCCL_UNEVEN: '%s' is not a strategy (expected 'auto', 'grouped' or 'pad')", u);
    if (c->world > 1 && (c->master_port < 1 || c->master_port > 65535))
        return err_set(err, "MASTER_PORT: %d is not a port (expected 1..65535)", c->master_port);
    if (c->world > 1 && !c->master_addr[0]) return err_set(err, "MASTER_ADDR is empty (expected rank 0's host name or address)");
    return 0;
}

int comm_config_from_env(comm_config *cfg, int rank, int world, err_t *err) {
    memset(cfg, 0, sizeof *cfg);
    cfg->rank = rank, cfg->world = world;
    cfg->timeout_s = COMM_DEFAULT_TIMEOUT_S;
    snprintf(cfg->master_addr, sizeof cfg->master_addr, "127.0.0.1");
    snprintf(cfg->backend, sizeof cfg->backend, "socket");
    const char *addr = getenv("MASTER_ADDR"), *port = getenv("MASTER_PORT");
    if (addr && !addr[0]) return err_set(err, "MASTER_ADDR is set but empty (expected rank 0's host name or address)");
    if (addr && copy_var("MASTER_ADDR", addr, cfg->master_addr, sizeof cfg->master_addr, err) < 0) return -1;
    if (port && env_port(port, &cfg->master_port, err) < 0) return -1;
    if (!port && world > 1)
        return err_set(err, "MASTER_PORT is not set (expected the port of rank 0's rendezvous store, 1..65535)");
    /* the CEPHALO_* ones through their rows (common/env.c): the values and messages of every program */
    const char *backend, *uneven, *job;
    if (env_number("CEPHALO_COMM_TIMEOUT", &cfg->timeout_s, err) < 0 || !(backend = env_word("CEPHALO_COMM_BACKEND", err)) ||
        !(uneven = env_word("CEPHALO_NCCL_UNEVEN", err)) || env_text("CEPHALO_JOB_ID", &job, err) < 0)
        return -1;
    /* the rows' words fit: "socket", "grouped" */
    snprintf(cfg->backend, sizeof cfg->backend, "%s", backend);
    snprintf(cfg->nccl_uneven, sizeof cfg->nccl_uneven, "%s", uneven);
    if (job && copy_var("CEPHALO_JOB_ID", job, cfg->job_id, sizeof cfg->job_id, err) < 0) return -1;
    return check_config(cfg, err);
}

/* ------------------------------------------------------------------------------------------ */
/* the communicator thread                                                                     */

static void fail_request(comm *c, comm_req *r) {
    r->rc = -1;
    if (!c->broken) {
        /* the first failure: say where, break the communicator, and tell the peers by closing
         * the connections, so the failure reaches every rank at once instead of by timeouts (the
         * socket backend has told its neighbours why already, in abort frames that name the rank
         * the failure started at: comm_socket.c) */
        err_prefix(&r->err, "rank %d: %s%s%s", c->cfg.rank, comm_op_name(r->op), r->what[0] ? " of " : "", r->what);
        c->first_err = r->err;
        c->broken = true;
        if (c->state) c->be->shutdown(c->state);
    }
    r->err = c->first_err;
}

static void account(comm *c, comm_req *r, double ms) {
    c->stats.busy_ms += ms;
    if (c->state) c->be->bytes(c->state, &c->stats.bytes_sent, &c->stats.bytes_received);
    if (r->rc < 0) return;
    int64_t *n[] = {&c->stats.allgathers, &c->stats.reduce_scatters, &c->stats.allreduces,
                    &c->stats.broadcasts, &c->stats.barriers};
    (*n[r->op])++;
}

static int backend_run(comm *c, void *state, comm_req *r, err_t *err) {
    if (state) return c->be->run(state, r, err);
    return err_set(err, "the %s backend has no GPU yet (every rank must call comm_set_device_stream before its first "
                        "operation)", c->be->name);
}

static void *comm_thread(void *arg) {
    comm *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->head && !c->stopping) pthread_cond_wait(&c->cv, &c->mu);
        comm_req *r = c->head;
        if (!r) break; /* stopping, and the queue is drained */
        c->head = r->next;
        if (!c->head) c->tail = NULL;
        bool run = !c->broken;
        void *state = c->state;
        pthread_mutex_unlock(&c->mu);
        double t0 = clock_now_s();
        r->rc = run ? backend_run(c, state, r, &r->err) : -1;
        double ms = (clock_now_s() - t0) * 1e3;
        pthread_mutex_lock(&c->mu);
        if (r->rc < 0) fail_request(c, r);
        account(c, r, ms);
        r->done = true;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* issuing and waiting                                                                         */

static comm_req *new_request(comm *c, comm_op op, void *buf, comm_dtype t, const char *what) {
    CHECK(c != NULL);
    CHECK(t == COMM_F32 || t == COMM_F64 || t == COMM_I64 || t == COMM_BF16 || t == COMM_F16);
    comm_req *r = xcalloc(1, sizeof *r);
    r->op = op, r->buf = buf, r->dtype = t;
    snprintf(r->what, sizeof r->what, "%s", what ? what : "");
    return r;
}

/* Queues r, or with world 1 completes it at once (every operation is the identity there). A
 * device backend first marks, on the compute stream, the work r's data waits for (its issue). */
static comm_req *issue(comm *c, comm_req *r) {
    pthread_mutex_lock(&c->mu);
    void *state = c->broken ? NULL : c->state;
    pthread_mutex_unlock(&c->mu);
    int issued = state && c->be->issue ? c->be->issue(state, r, &r->err) : 0;
    pthread_mutex_lock(&c->mu);
    r->live_next = c->live;
    if (c->live) c->live->live_prev = r;
    c->live = r;
    if (issued < 0 || c->cfg.world == 1) {
        r->rc = c->broken || issued < 0 ? -1 : 0;
        if (r->rc < 0) fail_request(c, r);
        account(c, r, 0);
        r->done = true;
    } else {
        if (c->tail) c->tail->next = r;
        else c->head = r;
        c->tail = r;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    return r;
}

static int64_t *copy_counts(const comm *c, const int64_t *counts, const void *buf) {
    CHECK(counts != NULL);
    int64_t *k = xmalloc((size_t)c->cfg.world * sizeof *k), total = 0;
    for (int i = 0; i < c->cfg.world; i++) {
        CHECK(counts[i] >= 0 && counts[i] <= INT64_MAX / 8 - total);
        k[i] = counts[i];
        total += counts[i];
    }
    CHECK(buf != NULL || total == 0);
    return k;
}

/* count elements split as evenly as possible, the first count % world ranks one more. */
static int64_t *even_split(const comm *c, int64_t count) {
    int world = c->cfg.world;
    int64_t *k = xmalloc((size_t)world * sizeof *k);
    for (int i = 0; i < world; i++) k[i] = count / world + (i < count % world);
    return k;
}

comm_req *comm_allgatherv(comm *c, void *buf, const int64_t *counts, comm_dtype t, const char *what) {
    comm_req *r = new_request(c, COMM_OP_ALLGATHERV, buf, t, what);
    r->counts = copy_counts(c, counts, buf);
    return issue(c, r);
}

comm_req *comm_reduce_scatterv(comm *c, void *buf, const int64_t *counts, comm_dtype t, const char *what) {
    CHECK(t == COMM_F32 || t == COMM_F64 || t == COMM_BF16 || t == COMM_F16);
    comm_req *r = new_request(c, COMM_OP_REDUCE_SCATTERV, buf, t, what);
    r->counts = copy_counts(c, counts, buf);
    return issue(c, r);
}

comm_req *comm_allreduce(comm *c, void *buf, int64_t count, comm_dtype t, const char *what) {
    CHECK(count >= 0 && count <= INT64_MAX / 8 && (buf != NULL || count == 0));
    comm_req *r = new_request(c, COMM_OP_ALLREDUCE, buf, t, what);
    r->counts = even_split(c, count);
    return issue(c, r);
}

comm_req *comm_broadcast(comm *c, void *buf, int64_t bytes, int root, const char *what) {
    CHECK(bytes >= 0 && (buf != NULL || bytes == 0));
    CHECK(c != NULL && root >= 0 && root < c->cfg.world);
    comm_req *r = new_request(c, COMM_OP_BROADCAST, buf, COMM_F32, what);
    r->bytes = bytes, r->root = root;
    return issue(c, r);
}

comm_req *comm_barrier(comm *c, const char *what) {
    comm_req *r = new_request(c, COMM_OP_BARRIER, NULL, COMM_I64, what);
    r->one = 1;
    r->counts = even_split(c, 1);
    return issue(c, r);
}

static void free_request(comm *c, comm_req *r) {
    if (r->live_prev) r->live_prev->live_next = r->live_next;
    else c->live = r->live_next;
    if (r->live_next) r->live_next->live_prev = r->live_prev;
    if (r->ready && c->be->req_free) c->be->req_free(r);
    free(r->counts);
    free(r);
}

int comm_wait(comm *c, comm_req *r, err_t *err) {
    if (!r) return 0;
    pthread_mutex_lock(&c->mu);
    while (!r->done) pthread_cond_wait(&c->cv, &c->mu);
    int rc = r->rc;
    if (rc < 0 && err) *err = r->err;
    free_request(c, r);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int comm_run(comm *c, comm_req *r, err_t *err) { return comm_wait(c, r, err); }

/* ------------------------------------------------------------------------------------------ */
/* open, close, abort                                                                          */

static comm *comm_new(const comm_config *cfg) {
    comm *c = xcalloc(1, sizeof *c);
    c->cfg = *cfg;
    c->be = find_backend(cfg->backend); /* check_config found it */
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    return c;
}

static int connect_world(comm *c, err_t *err) {
    const comm_config *cfg = &c->cfg;
    if (cfg->rank == 0 && store_serve(cfg, &c->server, err) < 0) return -1;
    if (store_connect(cfg, &c->store, err) < 0) return -1;
    /* a device backend meets in comm_set_device_stream, once the GPU is known */
    if (!c->be->device_buffers && c->be->open(cfg, c->store, -1, NULL, &c->state, err) < 0) return -1;
    int e = pthread_create(&c->thread, NULL, comm_thread, c);
    if (e) return err_set(err, "cannot start the communicator thread: %s", strerror(e));
    c->has_thread = true;
    return 0;
}

comm *comm_open(const comm_config *cfg, err_t *err) {
    if (check_config(cfg, err) < 0) {
        err_prefix(err, "comm");
        return NULL;
    }
    comm *c = comm_new(cfg);
    if (cfg->world == 1) {
        c->store = store_local(cfg);
        return c;
    }
    if (connect_world(c, err) < 0) {
        err_prefix(err, "rank %d", cfg->rank);
        store_serve_stop(c->server, 0); /* the others fail at once instead of by timeout */
        c->server = NULL;
        comm_close(c);
        return NULL;
    }
    return c;
}

void comm_close(comm *c) {
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    c->stopping = true;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (c->has_thread) pthread_join(c->thread, NULL); /* runs (or fails) what is queued */
    while (c->live) free_request(c, c->live);
    if (c->state) c->be->close(c->state);
    store_close(c->store);
    store_serve_stop(c->server, c->cfg.timeout_s);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

void comm_abort(comm *c, const char *why) {
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    if (!c->broken) {
        err_set(&c->first_err, "rank %d: communicator aborted: %s", c->cfg.rank, why ? why : "no reason given");
        c->broken = true;
    }
    void *state = c->state;
    pthread_mutex_unlock(&c->mu);
    if (state) c->be->shutdown(state);
    store_shutdown(c->store);
}

/* ------------------------------------------------------------------------------------------ */
/* the device                                                                                  */

int comm_set_device_stream(comm *c, void *compute_stream, int gpu, err_t *err) {
    CHECK(c != NULL && gpu >= 0);
    if (c->device_set) return err_set(err, "rank %d: comm_set_device_stream was called twice", c->cfg.rank);
    if (!c->be->device_buffers || c->cfg.world == 1) { /* host buffers, or nothing to move */
        c->device_set = true;
        return 0;
    }
    void *state = NULL;
    if (c->be->open(&c->cfg, c->store, gpu, compute_stream, &state, err) < 0) {
        err_prefix(err, "rank %d: %s rendezvous on GPU %d", c->cfg.rank, c->be->name, gpu);
        pthread_mutex_lock(&c->mu);
        if (!c->broken) c->first_err = *err, c->broken = true;
        pthread_mutex_unlock(&c->mu);
        return -1;
    }
    pthread_mutex_lock(&c->mu);
    c->state = state;
    pthread_mutex_unlock(&c->mu);
    c->device_set = true;
    return 0;
}

bool comm_device_buffers(const comm *c) { return c->be->device_buffers; }

int64_t comm_device_scratch_bytes(const comm *c) {
    comm *m = (comm *)c; /* the mutex changes, the communicator does not */
    pthread_mutex_lock(&m->mu);
    void *state = c->state;
    pthread_mutex_unlock(&m->mu);
    return state && c->be->scratch_bytes ? c->be->scratch_bytes(state) : 0;
}

/* ------------------------------------------------------------------------------------------ */
/* accessors, stats, store                                                                     */

int comm_rank(const comm *c) { return c->cfg.rank; }
int comm_world(const comm *c) { return c->cfg.world; }
double comm_timeout_s(const comm *c) { return c->cfg.timeout_s; }

void comm_get_stats(const comm *c, comm_stats *out) {
    comm *m = (comm *)c; /* the mutex changes, the communicator does not */
    pthread_mutex_lock(&m->mu);
    *out = c->stats;
    pthread_mutex_unlock(&m->mu);
}

int comm_store_set(comm *c, const char *key, const void *val, size_t n, err_t *err) {
    if (store_set(c->store, key, val, n, err) < 0) return err_prefix(err, "rank %d", c->cfg.rank);
    return 0;
}

int comm_store_get(comm *c, const char *key, void *val, size_t cap, size_t *n, err_t *err) {
    if (store_get(c->store, key, val, cap, n, err) < 0) return err_prefix(err, "rank %d", c->cfg.rank);
    return 0;
}
