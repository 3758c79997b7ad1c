/* comm_store.c - the rendezvous key-value store (docs/architecture.md): rank 0 serves it on
 * MASTER_ADDR:MASTER_PORT, every rank (rank 0 too) is a client. The ranks publish their ring
 * addresses in it; comm_store_set/get offer it to other users.
 *
 * Wire protocol (docs/comm.md): frames of a little-endian u32 type, a u32 body length and the
 * body. A client's first frame is HELLO (magic, version, rank, world, job id), answered WELCOME
 * or REFUSE with a reason; then SET (u32 key length, key, value) answered OK, GET (key)
 * answered VALUE once the key is set, and BYE. One request at a time per client.
 *
 * The server is one thread polling every connection; it never blocks on a client. Anything that
 * is not the protocol (unknown type, a length beyond the type's bound, a request before HELLO, no
 * HELLO within the timeout, too many connections) costs the sender its connection, nothing
 * more. */
#include "comm/comm_internal.h"
#include "common/clock.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/str_map.h"

enum { MSG_HELLO = 1, MSG_WELCOME, MSG_REFUSE, MSG_SET, MSG_OK, MSG_GET, MSG_VALUE, MSG_BYE };
#define STORE_MAGIC 0x52545343u /* "CSTR" */
#define STORE_VERSION 1u
#define HELLO_FIXED 16
#define FRAME_HDR 8
#define MAX_JOB_ID 63
#define MAX_REFUSE 512
/* Connections beyond the ranks that may be open at once (strays, ranks of a wrong job). */
#define EXTRA_CONNS 64

/* ------------------------------------------------------------------------------------------ */
/* the table                                                                                    */

typedef struct kv {
    char *key;
    uint8_t *val;
    size_t n;
} kv;

typedef struct kv_table {
    kv *items;
    int n, cap;
    str_map at; /* key -> its index: a rank's keys are found without a scan of every rank's */
} kv_table;

static kv *kv_find(kv_table *t, const char *key) {
    long i = str_map_get(&t->at, key);
    return i >= 0 ? &t->items[i] : NULL;
}

/* Sets (or replaces) key. */
static void kv_put(kv_table *t, const char *key, const void *val, size_t n) {
    kv *e = kv_find(t, key);
    if (!e) {
        if (t->n == t->cap) {
            t->cap = t->cap ? 2 * t->cap : 16;
            t->items = xrealloc(t->items, (size_t)t->cap * sizeof *t->items);
        }
        str_map_put(&t->at, key, t->n);
        e = &t->items[t->n++];
        e->key = xstrdup(key);
    } else {
        free(e->val);
    }
    e->val = memcpy(xmalloc(n), val, n);
    e->n = n;
}

static void kv_free(kv_table *t) {
    for (int i = 0; i < t->n; i++) free(t->items[i].key), free(t->items[i].val);
    free(t->items);
    str_map_free(&t->at);
    *t = (kv_table){0};
}

/* ------------------------------------------------------------------------------------------ */
/* server                                                                                      */

typedef struct sconn {
    int fd;
    int rank;       /* -1 until its HELLO was accepted */
    char peer[64];  /* address, for log lines */
    double hello_by;
    uint8_t hdr[FRAME_HDR];
    size_t hdr_got;
    uint32_t type;
    uint8_t *body;
    size_t body_len, body_got;
    char *waiting; /* key of a GET not answered yet */
    uint8_t *out;  /* replies not sent yet */
    size_t out_len, out_sent, out_cap;
    bool close_when_sent; /* refused: close once the reason is out */
} sconn;

struct store_server {
    int listen_fd, wake[2];
    int world;
    char job_id[64];
    double timeout_s;
    char where[300];
    pthread_t thread;
    sconn *conns;
    int nconns, max_conns;
    kv_table table;
    bool *joined, *left; /* per rank */
    int nleft;
    bool stopping;
    double stop_by;
};

static void conn_queue(sconn *k, uint32_t type, const void *body, size_t n) {
    if (k->out_len + FRAME_HDR + n > k->out_cap) { /* doubled: replies queued one by one are copied once */
        while (k->out_len + FRAME_HDR + n > k->out_cap) k->out_cap = k->out_cap ? 2 * k->out_cap : 256;
        k->out = xrealloc(k->out, k->out_cap);
    }
    comm_put32(k->out + k->out_len, type);
    comm_put32(k->out + k->out_len + 4, (uint32_t)n);
    if (n) memcpy(k->out + k->out_len + FRAME_HDR, body, n);
    k->out_len += FRAME_HDR + n;
}

/* Sends what the socket takes now. -1: the connection is gone. */
static int conn_flush(sconn *k) {
    while (k->out_sent < k->out_len) {
        ssize_t w = send(k->fd, k->out + k->out_sent, k->out_len - k->out_sent,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            k->out_sent += (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        return -1;
    }
    k->out_sent = k->out_len = 0;
    return 0;
}

static void conn_refuse(store_server *s, sconn *k, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void conn_refuse(store_server *s, sconn *k, const char *fmt, ...) {
    char why[MAX_REFUSE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    log_warn("rank 0: rendezvous store on %s: refused %s: %s", s->where, k->peer, why);
    conn_queue(k, MSG_REFUSE, why, strlen(why));
    k->close_when_sent = true;
}

static void conn_drop(store_server *s, int i, const char *why) {
    sconn *k = &s->conns[i];
    if (why) log_warn("rank 0: rendezvous store on %s: dropped the connection from %s: %s", s->where, k->peer, why);
    if (k->rank >= 0 && !s->left[k->rank]) s->left[k->rank] = true, s->nleft++;
    close(k->fd);
    free(k->body), free(k->waiting), free(k->out);
    s->conns[i] = s->conns[--s->nconns];
}

/* The largest body a client may send with this type before or after its HELLO; 0: none. */
static size_t body_bound(uint32_t type, bool hello_done) {
    if (!hello_done) return type == MSG_HELLO ? HELLO_FIXED + MAX_JOB_ID : 0;
    switch (type) {
    case MSG_SET: return 4 + STORE_MAX_KEY + STORE_MAX_VALUE;
    case MSG_GET: return STORE_MAX_KEY;
    case MSG_BYE: return 0;
    default: return 0;
    }
}

static void on_hello(store_server *s, sconn *k) {
    const uint8_t *b = k->body;
    if (k->body_len < HELLO_FIXED || comm_get32(b) != STORE_MAGIC) {
        conn_refuse(s, k, "not a Cephalo rank (bad greeting)");
        return;
    }
    uint32_t version = comm_get32(b + 4), rank = comm_get32(b + 8), world = comm_get32(b + 12);
    char job[MAX_JOB_ID + 1];
    size_t jl = k->body_len - HELLO_FIXED;
    memcpy(job, b + HELLO_FIXED, jl);
    job[jl] = '\0';
    if (version != STORE_VERSION)
        conn_refuse(s, k, "protocol version %u, this store speaks %u (mixed Cephalo builds?)", version, STORE_VERSION);
    else if (world != (uint32_t)s->world)
        conn_refuse(s, k, "this store serves a job of world size %d, not %u (another job on the same MASTER_PORT?)", s->world, world);
    else if (strlen(job) != jl || strcmp(job, s->job_id) != 0)
        conn_refuse(s, k, "this store serves job '%s', not '%.*s' (another job on the same MASTER_PORT?)", s->job_id, (int)jl, (const char *)b + HELLO_FIXED);
    else if (rank >= world)
        conn_refuse(s, k, "rank %u is outside world size %u", rank, world);
    else if (s->joined[rank])
        conn_refuse(s, k, "rank %u has already joined (two ranks with the same RANK?)", rank);
    else {
        k->rank = (int)rank;
        s->joined[rank] = true;
        conn_queue(k, MSG_WELCOME, NULL, 0);
    }
}

static void answer_waiting(store_server *s, const kv *e) {
    for (int i = 0; i < s->nconns; i++) {
        sconn *k = &s->conns[i];
        if (!k->waiting || strcmp(k->waiting, e->key) != 0) continue;
        conn_queue(k, MSG_VALUE, e->val, e->n);
        free(k->waiting);
        k->waiting = NULL;
    }
}

/* Copies a key of n bytes; NULL when it is empty or holds a NUL. */
static char *key_dup(const uint8_t *p, size_t n) {
    if (n == 0 || n > STORE_MAX_KEY || memchr(p, '\0', n)) return NULL;
    char *key = xmalloc(n + 1);
    memcpy(key, p, n);
    key[n] = '\0';
    return key;
}

/* Acts on one complete frame. Returns a reason to drop the connection, or NULL. */
static const char *on_frame(store_server *s, int i) {
    sconn *k = &s->conns[i];
    if (k->type == MSG_HELLO) return on_hello(s, k), NULL;
    if (k->waiting) return "a request while its GET is pending";
    if (k->type == MSG_BYE) return "";
    size_t klen = k->body_len;
    const uint8_t *kp = k->body;
    if (k->type == MSG_SET) {
        if (k->body_len < 4) return "SET without a key length";
        klen = comm_get32(k->body);
        if (klen > k->body_len - 4) return "SET key length beyond the frame";
        kp = k->body + 4;
    }
    char *key = key_dup(kp, klen);
    if (!key) return "empty key, or a NUL in the key";
    if (k->type == MSG_SET) {
        kv_put(&s->table, key, kp + klen, k->body_len - 4 - klen);
        conn_queue(k, MSG_OK, NULL, 0);
        answer_waiting(s, kv_find(&s->table, key));
        free(key);
        return NULL;
    }
    const kv *e = kv_find(&s->table, key);
    if (e) {
        conn_queue(k, MSG_VALUE, e->val, e->n);
        free(key);
    } else {
        k->waiting = key;
    }
    return NULL;
}

/* Reads what has arrived and acts on complete frames. Returns a reason to drop, or NULL. */
static const char *conn_read(store_server *s, int i) {
    for (;;) {
        sconn *k = &s->conns[i];
        if (k->close_when_sent) return NULL; /* refused: ignore the rest */
        bool in_hdr = k->hdr_got < FRAME_HDR;
        uint8_t *dst = in_hdr ? k->hdr + k->hdr_got : k->body + k->body_got;
        size_t want = in_hdr ? FRAME_HDR - k->hdr_got : k->body_len - k->body_got;
        ssize_t r = want ? recv(k->fd, dst, want, MSG_DONTWAIT) : 0;
        if (want && r == 0) return ""; /* closed: a rank leaving, or a stray giving up */
        if (want && r < 0) {
            if (errno == EINTR) continue;
            return errno == EAGAIN || errno == EWOULDBLOCK ? NULL : strerror(errno);
        }
        if (in_hdr) {
            k->hdr_got += (size_t)r;
            if (k->hdr_got < FRAME_HDR) continue;
            k->type = comm_get32(k->hdr);
            k->body_len = comm_get32(k->hdr + 4);
            bool known = k->type == MSG_HELLO || k->type == MSG_SET || k->type == MSG_GET || k->type == MSG_BYE;
            if (!known || (k->rank < 0) != (k->type == MSG_HELLO)) return "not the store protocol (unexpected frame type)";
            if (k->body_len > body_bound(k->type, k->rank >= 0)) return "frame length beyond the protocol's bound";
            k->body = xrealloc(k->body, k->body_len ? k->body_len : 1);
            k->body_got = 0;
        } else {
            k->body_got += (size_t)r;
        }
        if (k->hdr_got < FRAME_HDR || k->body_got < k->body_len) continue;
        k->hdr_got = 0; /* next frame */
        const char *why = on_frame(s, i);
        if (why) return why;
    }
}

static void accept_conn(store_server *s) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    int fd = accept(s->listen_fd, (struct sockaddr *)&ss, &len);
    if (fd < 0) {
        /* the peer gave up already, or fds ran out: then the listener stays readable, so pause
         * rather than spin; the peer's connect waits in the backlog */
        if (errno == EMFILE || errno == ENFILE) poll(NULL, 0, 10);
        return;
    }
    char peer[64];
    net_addr_str((struct sockaddr *)&ss, peer, sizeof peer);
    if (s->nconns == s->max_conns) {
        log_warn("rank 0: rendezvous store on %s: refused %s: %d connections open already", s->where, peer, s->nconns);
        close(fd);
        return;
    }
    net_set_nonblocking(fd);
    sconn *k = &s->conns[s->nconns++];
    *k = (sconn){.fd = fd, .rank = -1, .hello_by = clock_now_s() + s->timeout_s};
    snprintf(k->peer, sizeof k->peer, "%s", peer);
}

/* The next deadline the loop must wake for, as a poll() timeout. */
static int next_wake_ms(const store_server *s) {
    double next = s->stopping ? s->stop_by : 0;
    for (int i = 0; i < s->nconns; i++)
        if (s->conns[i].rank < 0 && (next == 0 || s->conns[i].hello_by < next)) next = s->conns[i].hello_by;
    return next == 0 ? -1 : net_ms_left(next);
}

static void expire_hellos(store_server *s) {
    double now = clock_now_s();
    for (int i = s->nconns - 1; i >= 0; i--)
        if (s->conns[i].rank < 0 && now >= s->conns[i].hello_by)
            conn_drop(s, i, "no greeting within the timeout");
}

static void on_wake(store_server *s) {
    double wait_s;
    if (read(s->wake[0], &wait_s, sizeof wait_s) != (ssize_t)sizeof wait_s) wait_s = 0;
    s->stopping = true;
    s->stop_by = clock_now_s() + wait_s;
}

/* Services the connections the poll found ready. pfd[2 + i] belongs to conns[i]. */
static void service(store_server *s, const struct pollfd *pfd, int n) {
    for (int i = n - 1; i >= 0; i--) { /* backwards: dropping moves the last one into i */
        short re = pfd[2 + i].revents;
        if (!re) continue;
        const char *why = NULL;
        if (re & (POLLIN | POLLHUP | POLLERR)) why = conn_read(s, i);
        sconn *k = &s->conns[i];
        if (!why && conn_flush(k) < 0) why = "";
        if (!why && k->close_when_sent && k->out_len == 0) why = "";
        if (why) conn_drop(s, i, why[0] ? why : NULL);
    }
}

static void *serve_loop(void *arg) {
    store_server *s = arg;
    struct pollfd *pfd = xcalloc((size_t)s->max_conns + 2, sizeof *pfd);
    for (;;) {
        if (s->stopping && (s->nleft == s->world || clock_now_s() >= s->stop_by)) break;
        pfd[0] = (struct pollfd){s->wake[0], POLLIN, 0};
        pfd[1] = (struct pollfd){s->listen_fd, POLLIN, 0};
        int n = s->nconns;
        for (int i = 0; i < n; i++)
            pfd[2 + i] = (struct pollfd){s->conns[i].fd, (short)(POLLIN | (s->conns[i].out_len ? POLLOUT : 0)), 0};
        int r = poll(pfd, (nfds_t)n + 2, next_wake_ms(s));
        if (r < 0 && errno != EINTR) break;
        if (r > 0) {
            if (pfd[0].revents) on_wake(s);
            service(s, pfd, n);
            if (pfd[1].revents) accept_conn(s);
        }
        expire_hellos(s);
    }
    free(pfd);
    return NULL;
}

static int bind_listen(const struct addrinfo *ai, int *fd_out) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) return -1;
    int one = 1;
    /* A restarted job must be able to serve again while the last one's sockets sit in TIME_WAIT. */
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 128) < 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    net_set_nonblocking(fd);
    *fd_out = fd;
    return 0;
}

/* Binds master_addr:master_port; when that address is not one of this host's (a service
 * address that forwards here), the wildcard address of the same family. */
static int store_listen(const comm_config *cfg, int *fd, err_t *err) {
    char service[16];
    snprintf(service, sizeof service, "%d", cfg->master_port);
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int g = getaddrinfo(cfg->master_addr, service, &hints, &res);
    if (g) return err_set(err, "cannot serve the rendezvous store: MASTER_ADDR '%s': %s", cfg->master_addr, gai_strerror(g));
    int rc = bind_listen(res, fd), e = errno;
    if (rc < 0 && e == EADDRNOTAVAIL) {
        struct addrinfo *any = NULL;
        hints.ai_family = res->ai_family;
        hints.ai_flags = AI_PASSIVE;
        if (getaddrinfo(NULL, service, &hints, &any) == 0) {
            rc = bind_listen(any, fd), e = errno;
            freeaddrinfo(any);
        }
    }
    freeaddrinfo(res);
    if (rc == 0) return 0;
    if (e == EADDRINUSE)
        return err_set(err, "cannot serve the rendezvous store on %s:%d: the port is in use (another job or program has it; choose another MASTER_PORT)", cfg->master_addr, cfg->master_port);
    return err_set(err, "cannot serve the rendezvous store on %s:%d: %s", cfg->master_addr, cfg->master_port, strerror(e));
}

int store_serve(const comm_config *cfg, store_server **out, err_t *err) {
    int fd;
    if (store_listen(cfg, &fd, err) < 0) return -1;
    store_server *s = xcalloc(1, sizeof *s);
    s->listen_fd = fd;
    if (pipe(s->wake) < 0) {
        close(fd);
        free(s);
        return err_set(err, "rendezvous store: pipe: %s", strerror(errno));
    }
    s->world = cfg->world;
    snprintf(s->job_id, sizeof s->job_id, "%s", cfg->job_id);
    s->timeout_s = cfg->timeout_s;
    snprintf(s->where, sizeof s->where, "%s:%d", cfg->master_addr, cfg->master_port);
    s->max_conns = cfg->world + EXTRA_CONNS;
    s->conns = xcalloc((size_t)s->max_conns, sizeof *s->conns);
    s->joined = xcalloc((size_t)cfg->world, sizeof *s->joined);
    s->left = xcalloc((size_t)cfg->world, sizeof *s->left);
    int e = pthread_create(&s->thread, NULL, serve_loop, s);
    CHECK(e == 0); /* only resource exhaustion fails here */
    *out = s;
    return 0;
}

void store_serve_stop(store_server *s, double wait_s) {
    if (!s) return;
    ssize_t w = write(s->wake[1], &wait_s, sizeof wait_s);
    CHECK(w == (ssize_t)sizeof wait_s); /* an empty pipe takes 8 bytes */
    pthread_join(s->thread, NULL);
    while (s->nconns) conn_drop(s, s->nconns - 1, NULL);
    close(s->listen_fd), close(s->wake[0]), close(s->wake[1]);
    kv_free(&s->table);
    free(s->conns), free(s->joined), free(s->left);
    free(s);
}

/* ------------------------------------------------------------------------------------------ */
/* client                                                                                      */

struct store_client {
    int fd; /* -1: world 1, `local` is the store */
    double timeout_s;
    char where[300];
    pthread_mutex_t mu;        /* one request at a time */
    bool broken;               /* a request failed midway: the stream is out of step */
    atomic_bool aborted;
    kv_table local;
};

static int client_fail(store_client *s, err_t *err, int e, const char *doing) {
    s->broken = true;
    if (atomic_load(&s->aborted)) return err_set(err, "%s: this rank aborted its communicator", doing);
    if (e == ECONNRESET || e == EPIPE)
        return err_set(err, "%s: the rendezvous store at %s (rank 0) closed the connection (rank 0 has probably failed; see its log)", doing, s->where);
    if (e == ETIMEDOUT)
        return err_set(err, "%s: no answer from the rendezvous store at %s (rank 0) for %g s (timeout; CEPHALO_COMM_TIMEOUT sets it)", doing, s->where, s->timeout_s);
    return err_set(err, "%s: rendezvous store at %s: %s", doing, s->where, strerror(e));
}

/* Sends one frame and reads the reply's header; the caller reads the body. */
static int request(store_client *s, uint32_t type, const void *a, size_t an, const void *b, size_t bn,
                   uint32_t *rtype, uint32_t *rlen, double deadline) {
    uint8_t hdr[FRAME_HDR];
    comm_put32(hdr, type);
    comm_put32(hdr + 4, (uint32_t)(an + bn));
    if (net_write_all(s->fd, hdr, sizeof hdr, deadline) < 0 || net_write_all(s->fd, a, an, deadline) < 0 ||
        net_write_all(s->fd, b, bn, deadline) < 0 || net_read_all(s->fd, hdr, sizeof hdr, deadline) < 0)
        return -1;
    *rtype = comm_get32(hdr);
    *rlen = comm_get32(hdr + 4);
    return 0;
}

static int hello(store_client *s, const comm_config *cfg, err_t *err) {
    uint8_t h[HELLO_FIXED + MAX_JOB_ID];
    size_t jl = strnlen(cfg->job_id, MAX_JOB_ID);
    comm_put32(h, STORE_MAGIC);
    comm_put32(h + 4, STORE_VERSION);
    comm_put32(h + 8, (uint32_t)cfg->rank);
    comm_put32(h + 12, (uint32_t)cfg->world);
    memcpy(h + HELLO_FIXED, cfg->job_id, jl);
    uint32_t type, len;
    double deadline = clock_now_s() + s->timeout_s;
    if (request(s, MSG_HELLO, h, HELLO_FIXED + jl, NULL, 0, &type, &len, deadline) < 0)
        return client_fail(s, err, errno, "rendezvous");
    if (type == MSG_WELCOME && len == 0) return 0;
    if (type != MSG_REFUSE || len > MAX_REFUSE)
        return err_set(err, "rendezvous: %s does not answer like a Cephalo rendezvous store (is MASTER_PORT right?)", s->where);
    char why[MAX_REFUSE + 1] = "";
    if (net_read_all(s->fd, why, len, deadline) < 0) return client_fail(s, err, errno, "rendezvous");
    why[len] = '\0';
    return err_set(err, "rendezvous: the store at %s refused this rank: %s", s->where, why);
}

static store_client *client_new(const comm_config *cfg, int fd) {
    store_client *s = xcalloc(1, sizeof *s);
    s->fd = fd;
    s->timeout_s = cfg->timeout_s;
    snprintf(s->where, sizeof s->where, "%s:%d", cfg->master_addr, cfg->master_port);
    pthread_mutex_init(&s->mu, NULL);
    atomic_init(&s->aborted, false);
    return s;
}

static void client_free(store_client *s) {
    if (s->fd >= 0) close(s->fd);
    kv_free(&s->local);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

int store_connect(const comm_config *cfg, store_client **out, err_t *err) {
    int fd = net_connect(cfg->master_addr, cfg->master_port, clock_now_s() + cfg->timeout_s, err);
    if (fd < 0) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        return err_set(err, "rendezvous: the store of rank 0: %s (is rank 0 running? MASTER_ADDR and MASTER_PORT must name it)", why);
    }
    store_client *s = client_new(cfg, fd);
    if (hello(s, cfg, err) < 0) {
        client_free(s);
        return -1;
    }
    *out = s;
    return 0;
}

store_client *store_local(const comm_config *cfg) { return client_new(cfg, -1); }

static int check_key(const char *key, err_t *err) {
    size_t n = strlen(key);
    if (n == 0 || n > STORE_MAX_KEY) return err_set(err, "store: key '%.40s' must have 1 to %d bytes", key, STORE_MAX_KEY);
    return 0;
}

static int client_usable(store_client *s, const char *doing, err_t *err) {
    if (atomic_load(&s->aborted)) return err_set(err, "%s: this rank aborted its communicator", doing);
    if (s->broken) return err_set(err, "%s: the connection to the rendezvous store failed earlier", doing);
    return 0;
}

int store_set(store_client *s, const char *key, const void *val, size_t n, err_t *err) {
    if (check_key(key, err) < 0) return -1;
    if (n > STORE_MAX_VALUE) return err_set(err, "store: value of '%s' has %zu bytes, more than %d", key, n, STORE_MAX_VALUE);
    char doing[STORE_MAX_KEY + 32];
    snprintf(doing, sizeof doing, "store set of '%s'", key);
    pthread_mutex_lock(&s->mu);
    int rc = client_usable(s, doing, err);
    if (rc == 0 && s->fd < 0) kv_put(&s->local, key, val, n);
    if (rc == 0 && s->fd >= 0) {
        size_t kn = strlen(key);
        uint8_t kl[4];
        comm_put32(kl, (uint32_t)kn);
        uint8_t *msg = xmalloc(kn + n);
        memcpy(msg, key, kn);
        if (n) memcpy(msg + kn, val, n);
        uint32_t type, len;
        if (request(s, MSG_SET, kl, 4, msg, kn + n, &type, &len, clock_now_s() + s->timeout_s) < 0)
            rc = client_fail(s, err, errno, doing);
        else if (type != MSG_OK || len != 0)
            s->broken = true, rc = err_set(err, "%s: the store at %s answered out of protocol", doing, s->where);
        free(msg);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static int get_remote(store_client *s, const char *key, void *val, size_t cap, size_t *n, const char *doing, err_t *err) {
    uint32_t type, len;
    double deadline = clock_now_s() + s->timeout_s;
    if (request(s, MSG_GET, key, strlen(key), NULL, 0, &type, &len, deadline) < 0) {
        if (errno == ETIMEDOUT) {
            s->broken = true;
            return err_set(err, "%s: no rank set it within %g s (timeout; CEPHALO_COMM_TIMEOUT sets it)", doing, s->timeout_s);
        }
        return client_fail(s, err, errno, doing);
    }
    if (type != MSG_VALUE || len > STORE_MAX_VALUE) {
        s->broken = true;
        return err_set(err, "%s: the store at %s answered out of protocol", doing, s->where);
    }
    uint8_t *tmp = xmalloc(len ? len : 1);
    int rc = net_read_all(s->fd, tmp, len, deadline) < 0 ? client_fail(s, err, errno, doing) : 0;
    if (rc == 0 && len > cap) rc = err_set(err, "%s: the value has %u bytes, more than the %zu expected", doing, len, cap);
    if (rc == 0) {
        if (len) memcpy(val, tmp, len);
        *n = len;
    }
    free(tmp);
    return rc;
}

int store_get(store_client *s, const char *key, void *val, size_t cap, size_t *n, err_t *err) {
    if (check_key(key, err) < 0) return -1;
    char doing[STORE_MAX_KEY + 32];
    snprintf(doing, sizeof doing, "store get of '%s'", key);
    pthread_mutex_lock(&s->mu);
    int rc = client_usable(s, doing, err);
    if (rc == 0 && s->fd >= 0) rc = get_remote(s, key, val, cap, n, doing, err);
    if (rc == 0 && s->fd < 0) {
        const kv *e = kv_find(&s->local, key);
        if (!e) rc = err_set(err, "%s: not set (world size 1: no other rank can set it)", doing);
        else if (e->n > cap) rc = err_set(err, "%s: the value has %zu bytes, more than the %zu expected", doing, e->n, cap);
        else {
            if (e->n) memcpy(val, e->val, e->n);
            *n = e->n;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int store_local_addr(store_client *s, struct sockaddr_storage *ss, socklen_t *len, err_t *err) {
    *len = sizeof *ss;
    if (getsockname(s->fd, (struct sockaddr *)ss, len) < 0) return err_set(err, "getsockname: %s", strerror(errno));
    return 0;
}

void store_shutdown(store_client *s) {
    atomic_store(&s->aborted, true);
    if (s->fd >= 0) shutdown(s->fd, SHUT_RDWR); /* wakes a GET blocked in poll() */
}

void store_close(store_client *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    if (s->fd >= 0 && !s->broken && !atomic_load(&s->aborted)) {
        uint8_t hdr[FRAME_HDR];
        comm_put32(hdr, MSG_BYE);
        comm_put32(hdr + 4, 0);
        (void)net_write_all(s->fd, hdr, sizeof hdr, clock_now_s() + 1.0); /* best effort */
    }
    pthread_mutex_unlock(&s->mu);
    client_free(s);
}
