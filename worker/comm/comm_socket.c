/* comm_socket.c - the socket backend: the ranks form a ring of TCP connections (rank r sends to
 * r+1 and receives from r-1, two connections per rank even for world 2) and run ring collectives
 * over it (docs/comm.md):
 *
 *   allgatherv       world-1 steps; at step s rank r sends block r-s, receives block r-s-1
 *   reduce-scatterv  world-1 steps; sends block r-s-1, receives block r-s-2 and adds it in place
 *   allreduce        reduce-scatterv then allgatherv over an even split of the elements
 *   broadcast        a chain root -> root+1 -> ... -> root-1, forwarded segment by segment
 *
 * Every step sends to the right and receives from the left at once (non-blocking sockets and
 * poll()), so no size or order of sizes can deadlock, and every poll() is bounded by the no-
 * progress timeout. Each step's payload follows a small header (operation number, kind, step,
 * bytes) that the receiver checks, so ranks that issued different operations fail with a clear
 * message instead of silently mixing data. Payloads travel in the host's byte order: every rank
 * of a job is assumed to share it. Data is moved by element size (comm_dtype_size), so every
 * dtype gathers and broadcasts; sums are F32, F64 and I64 (BF16 and F16 sums are an error).
 *
 * A failing rank tells its neighbours why before it shuts its connections: an abort frame names
 * the rank the failure started at (the origin) and how, and each rank that receives one fails with
 * it and passes it on, so every rank names the same origin. A rank that times out waiting for its
 * left neighbour first asks it (an abort frame upstream, where nothing else flows): a neighbour that
 * is alive but itself waiting passes the question on and answers with the rank it waited for; one
 * that does not answer is the one that stopped (docs/comm.md, "Abort frames"). */
#include "comm/comm_internal.h"
#include "common/clock.h"

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"

#define RING_MAGIC 0x474e5243u /* "CRNG": the hello on a new ring connection */
#define STEP_MAGIC 0x50545343u /* "CSTP": the header of a step */
#define ABORT_MAGIC 0x54424143u /* "CABT": an abort frame: this rank fails, and why */
#define WAIT_MAGIC 0x54415743u  /* "CWAT": a rank that was asked is still waiting for its own answer */
#define RING_VERSION 1u
#define SEG ((size_t)COMM_SEGMENT_BYTES)
enum { HELLO_BYTES = 16, HDR_BYTES = 24, REASON_MAX = 480 };

/* How a failure started (the frame's cause, and the word on the machine-readable line). */
enum { CAUSE_STALLED = 1, CAUSE_CLOSED = 2, CAUSE_FAILED = 3 };
static const char *const cause_words[] = {"?", "stalled", "closed", "failed"};

/* A failure as this rank tells it: the origin, the rank that saw it first hand, and its words. */
typedef struct blame {
    int origin, observer, cause;
    char reason[REASON_MAX + 1];
} blame;

typedef struct ring ring;
static void ring_shutdown(ring *g);

struct ring {
    int rank, world;
    int left, right; /* fds: receive from rank-1, send to rank+1 */
    double timeout_s;
    uint8_t *scratch; /* one segment of received partial sums */
    int64_t *off;     /* world+1 block offsets (elements) of the running operation */
    uint64_t seq;     /* operations run: every rank numbers them alike */
    int64_t sent, received;
    /* failing (the communicator thread; ring_shutdown only sets shut) */
    blame why;       /* of the failure ring_run returns */
    bool forwarded;  /* why came in an abort frame (else why.reason is this rank's own error) */
    bool told_left;  /* the left neighbour has had an abort frame already */
    bool right_eof;  /* the right neighbour closed, or failed, while owed nothing: not watched */
    bool pending;    /* ...failed: the next operation fails with its frame */
    blame pending_why;
    atomic_bool shut;
    /* what the right neighbour is still owed of the failed step before a frame may follow */
    bool owed_ok; /* false: the step cannot be completed with real data (a relay short of it) */
    uint8_t owed_hdr[HDR_BYTES];
    size_t owed_hdr_done;
    const uint8_t *owed_p;
    size_t owed_n;
};

static int left_of(const ring *g) { return (g->rank + g->world - 1) % g->world; }
static int right_of(const ring *g) { return (g->rank + 1) % g->world; }
static int block(const ring *g, int i) { return ((i % g->world) + g->world) % g->world; }

/* ------------------------------------------------------------------------------------------ */
/* errors                                                                                      */

/* The failure ring_run is about to return started at `origin` (this rank saw it first hand). */
static void blame_on(ring *g, int origin, int cause) {
    g->why.origin = origin, g->why.observer = g->rank, g->why.cause = cause;
    g->forwarded = false;
}

static int peer_error(ring *g, int peer, int e, err_t *err) {
    blame_on(g, peer, CAUSE_CLOSED);
    if (e == ECONNRESET || e == EPIPE || e == 0)
        return err_set(err, "rank %d closed the connection (it has probably failed; see its log)", peer);
    return err_set(err, "connection with rank %d: %s", peer, strerror(e));
}

static int timeout_error(ring *g, bool receiving, err_t *err) {
    blame_on(g, receiving ? left_of(g) : right_of(g), CAUSE_STALLED);
    if (receiving)
        return err_set(err, "nothing from rank %d for %g s (timeout; CEPHALO_COMM_TIMEOUT sets it)", left_of(g), g->timeout_s);
    return err_set(err, "rank %d took no data for %g s (timeout; CEPHALO_COMM_TIMEOUT sets it)", right_of(g), g->timeout_s);
}

/* One step: send to the right while receiving from the left (step_run). */
typedef struct step {
    uint16_t kind, index;
    bool send, recv;
    const uint8_t *sp; /* to the right */
    size_t sn;
    uint8_t *rp; /* from the left */
    size_t rn;
    int reduce; /* -1: store what arrives at rp; else the comm_dtype to add it into rp */
    bool relay; /* broadcast: sp == rp, each segment is forwarded once it has arrived */
} step;

typedef struct xfer {
    uint8_t shdr[HDR_BYTES], rhdr[HDR_BYTES];
    size_t shdr_done, sdone, rhdr_done, rdone;
} xfer;

/* ------------------------------------------------------------------------------------------ */
/* abort frames (docs/comm.md, "Abort frames")                                                 */

/* How long a failing rank waits for a neighbour's answer, and for a neighbour to take a frame:
 * a quarter of the timeout, within [50 ms, 2 s]. A stopped neighbour costs no more than that. */
static double grace(const ring *g) {
    double s = g->timeout_s / 4;
    return s < 0.05 ? 0.05 : s > 2 ? 2 : s;
}

/* magic, origin, observer, cause, reason length, 0; then the reason. */
static size_t put_abort(uint8_t *f, const blame *b) {
    size_t len = strlen(b->reason);
    comm_put32(f, ABORT_MAGIC);
    comm_put32(f + 4, (uint32_t)b->origin);
    comm_put32(f + 8, (uint32_t)b->observer);
    comm_put32(f + 12, (uint32_t)b->cause);
    comm_put32(f + 16, (uint32_t)len);
    comm_put32(f + 20, 0);
    memcpy(f + HDR_BYTES, b->reason, len);
    return HDR_BYTES + len;
}

/* The reason of an abort frame whose head h came from `peer` on fd. 0, or -1 with err. */
static int read_abort(ring *g, int fd, int peer, const uint8_t *h, blame *b, err_t *err) {
    uint32_t origin = comm_get32(h + 4), observer = comm_get32(h + 8), cause = comm_get32(h + 12), len = comm_get32(h + 16);
    if (origin >= (uint32_t)g->world || observer >= (uint32_t)g->world || cause < CAUSE_STALLED || cause > CAUSE_FAILED || len > REASON_MAX)
        return err_set(err, "rank %d sent a malformed abort frame (protocol error)", peer);
    if (net_read_all(fd, b->reason, len, clock_now_s() + grace(g)) < 0) return peer_error(g, peer, errno, err);
    for (uint32_t i = 0; i < len; i++)
        if ((unsigned char)b->reason[i] < ' ') b->reason[i] = '?'; /* one line in the logs */
    b->reason[len] = '\0';
    b->origin = (int)origin, b->observer = (int)observer, b->cause = (int)cause;
    return 0;
}

/* Fails with what an abort frame from `peer` says; it is passed on as it is. */
static int forwarded(ring *g, int peer, const blame *b, err_t *err) {
    g->why = *b;
    g->forwarded = true;
    return err_set(err, "rank %d aborted: rank %d %s (rank %d: %s)", peer, b->origin,
                   b->cause == CAUSE_STALLED ? "stopped answering" : "failed", b->observer, b->reason);
}

/* The right neighbour is gone (errno e): the frame it sent before, if one came (from_right). */
static int right_closed(ring *g, int e, err_t *err) {
    return g->pending ? forwarded(g, right_of(g), &g->pending_why, err) : peer_error(g, right_of(g), e, err);
}

/* What the right connection brings (nothing but abort frames flows that way): 1 with the frame in
 * *b, 0 for nothing or its end (an error only while `owing` the right neighbour data: once it has
 * everything it may finish and close), -1 with err. */
static int read_right(ring *g, bool owing, blame *b, err_t *err) {
    uint8_t h[HDR_BYTES];
    ssize_t k = recv(g->right, h, 1, MSG_DONTWAIT | MSG_PEEK);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
    if (k <= 0) {
        if (owing) return right_closed(g, k == 0 ? 0 : errno, err);
        g->right_eof = true;
        return 0;
    }
    if (net_read_all(g->right, h, HDR_BYTES, clock_now_s() + grace(g)) < 0 || comm_get32(h) != ABORT_MAGIC)
        return err_set(err, "rank %d sent data on the wrong connection (protocol error)", right_of(g));
    return read_abort(g, g->right, right_of(g), h, b, err) < 0 ? -1 : 1;
}

/* Sending to the right neighbour failed (errno e): it may have said why before it went. */
static int right_gone(ring *g, int e, err_t *err) {
    blame b;
    if (!g->pending && read_right(g, false, &b, err) > 0) return forwarded(g, right_of(g), &b, err);
    return right_closed(g, e, err);
}

/* Tells the right neighbour, which asked, that this rank still waits for its own answer, until
 * `deadline`. */
static void tell_waiting(ring *g, double deadline) {
    uint8_t f[HDR_BYTES] = {0};
    comm_put32(f, WAIT_MAGIC);
    comm_put32(f + 4, (uint32_t)net_ms_left(deadline));
    (void)net_write_all(g->right, f, sizeof f, deadline);
}

/* This rank has had nothing from its left neighbour, and err blames it. Before failing, ask it: an
 * abort frame upstream, where nothing else flows, says so. A left neighbour that is alive, but has
 * itself waited on its own left, answers in turn (ask_left there) with the rank it found, and
 * meanwhile says that it is still waiting (a wait frame moves the deadline on). A left neighbour
 * that does not answer within the grace is the one that stopped. `asked`: the right neighbour asked
 * this rank the same; `right_clear`: a frame may go to it now (no step is half sent). -1 always,
 * with err the answer or the blame of the left neighbour. */
static int ask_left(ring *g, const xfer *x, bool asked, bool right_clear, err_t *err) {
    if (x->rhdr_done != 0) return -1; /* it stopped in the middle of a frame: no answer can come */
    snprintf(g->why.reason, sizeof g->why.reason, "%.*s", REASON_MAX, err->msg);
    uint8_t f[HDR_BYTES + REASON_MAX];
    /* a wait frame moves the deadline to the asked rank's own, plus a margin for the answer's way
     * back; never further than the timeout (or two graces) from now */
    double now = clock_now_s(), deadline = now + grace(g), margin = grace(g) / 4 < 0.05 ? grace(g) / 4 : 0.05;
    double limit = now + (g->timeout_s > 2 * grace(g) ? g->timeout_s : 2 * grace(g));
    g->told_left = true;
    if (net_write_all(g->left, f, put_abort(f, &g->why), deadline) < 0) return -1;
    if (asked && right_clear) tell_waiting(g, deadline);
    for (;;) {
        struct pollfd p[2] = {{g->left, POLLIN, 0}, {g->right_eof ? -1 : g->right, POLLIN, 0}};
        int n = poll(p, 2, net_ms_left(deadline));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        blame b;
        err_t e;
        if (p[1].revents) { /* the right neighbour gave up on this rank too, or fails otherwise */
            int k = read_right(g, false, &b, &e);
            if (k < 0) g->right_eof = true; /* we fail anyway: stop listening to it */
            if (k > 0 && !(b.origin == g->rank && b.cause == CAUSE_STALLED)) return forwarded(g, right_of(g), &b, err);
            if (k > 0 && right_clear) {
                asked = true;
                tell_waiting(g, deadline);
            }
        }
        if (!p[0].revents) continue;
        uint8_t h[HDR_BYTES];
        if (net_read_all(g->left, h, HDR_BYTES, deadline) < 0) return -1;
        if (comm_get32(h) == WAIT_MAGIC) { /* the answer is on its way along the ring */
            double until = clock_now_s() + comm_get32(h + 4) * 1e-3 + margin;
            deadline = until > deadline ? (until < limit ? until : limit) : deadline;
            if (asked && right_clear) tell_waiting(g, deadline);
            continue;
        }
        /* a step header after all: the neighbour was only slow, and keeps the blame */
        if (comm_get32(h) != ABORT_MAGIC || read_abort(g, g->left, left_of(g), h, &b, &e) < 0) return -1;
        return forwarded(g, left_of(g), &b, err);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* one step: send to the right while receiving from the left                                   */

static void put_header(uint8_t *h, uint16_t kind, uint16_t index, uint64_t seq, uint64_t bytes) {
    comm_put32(h, STEP_MAGIC);
    comm_put32(h + 4, (uint32_t)kind | (uint32_t)index << 16);
    comm_put64(h + 8, seq);
    comm_put64(h + 16, bytes);
}

static void describe(char *buf, size_t n, uint32_t kind_index, uint64_t seq, uint64_t bytes) {
    unsigned kind = kind_index & 0xffff;
    const char *name = kind <= COMM_OP_BARRIER ? comm_op_name((comm_op)kind) : "?";
    snprintf(buf, n, "step %u of operation #%llu (%s, %llu bytes)", kind_index >> 16,
             (unsigned long long)seq, name, (unsigned long long)bytes);
}

static int check_header(const ring *g, const step *st, const xfer *x, err_t *err) {
    uint8_t want[HDR_BYTES];
    put_header(want, st->kind, st->index, g->seq, st->rn);
    if (memcmp(want, x->rhdr, HDR_BYTES) == 0) return 0;
    if (comm_get32(x->rhdr) != STEP_MAGIC)
        return err_set(err, "rank %d sent bytes that are not a step header (the ranks issued different operations or sizes)", left_of(g));
    char got[128], exp[128];
    describe(got, sizeof got, comm_get32(x->rhdr + 4), comm_get64(x->rhdr + 8), comm_get64(x->rhdr + 16));
    describe(exp, sizeof exp, comm_get32(want + 4), g->seq, st->rn);
    return err_set(err, "rank %d sent %s where this rank expects %s (the ranks issued different operations or sizes)", left_of(g), got, exp);
}

static void add_into(void *dst, const void *src, size_t bytes, comm_dtype t) {
    if (t == COMM_F32) {
        float *d = dst;
        const float *s = src;
        for (size_t i = 0; i < bytes / sizeof(float); i++) d[i] += s[i];
    } else if (t == COMM_F64) {
        double *d = dst;
        const double *s = src;
        for (size_t i = 0; i < bytes / sizeof(double); i++) d[i] += s[i];
    } else {
        int64_t *d = dst;
        const int64_t *s = src;
        for (size_t i = 0; i < bytes / sizeof(int64_t); i++) d[i] = (int64_t)((uint64_t)d[i] + (uint64_t)s[i]); /* wraps, no UB */
    }
}

/* Payload bytes that may go out now: a relay forwards only whole segments (and the tail). */
static size_t sendable(const step *st, const xfer *x) {
    if (!st->relay || x->rdone == st->rn) return st->sn;
    return x->rdone / SEG * SEG;
}

/* Sends what the socket takes, up to a segment per call so the receive side gets its turn. */
static int do_send(ring *g, const step *st, xfer *x, bool *moved, err_t *err) {
    for (size_t budget = SEG; budget > 0;) {
        bool hdr = x->shdr_done < HDR_BYTES;
        const uint8_t *p = hdr ? x->shdr + x->shdr_done : st->sp + x->sdone;
        size_t n = hdr ? HDR_BYTES - x->shdr_done : sendable(st, x) - x->sdone;
        if (n == 0) return 0;
        ssize_t k = send(g->right, p, n < budget ? n : budget, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        if (k < 0) return right_gone(g, errno, err);
        *moved = true;
        budget -= (size_t)k < budget ? (size_t)k : budget;
        if (hdr) x->shdr_done += (size_t)k;
        else x->sdone += (size_t)k, g->sent += k;
    }
    return 0;
}

/* Where the next received bytes go and how many may come: the header, the destination, or the
 * scratch segment of a reduction. */
static uint8_t *recv_target(const ring *g, const step *st, xfer *x, size_t *n) {
    if (x->rhdr_done < HDR_BYTES) return *n = HDR_BYTES - x->rhdr_done, x->rhdr + x->rhdr_done;
    if (st->reduce < 0) return *n = st->rn - x->rdone, st->rp + x->rdone;
    size_t in_seg = x->rdone % SEG, left = st->rn - x->rdone;
    *n = SEG - in_seg < left ? SEG - in_seg : left;
    return g->scratch + in_seg;
}

static int do_recv(ring *g, const step *st, xfer *x, bool *moved, err_t *err) {
    for (size_t budget = SEG; budget > 0;) {
        size_t n;
        uint8_t *p = recv_target(g, st, x, &n);
        if (n == 0) return 0;
        ssize_t k = recv(g->left, p, n < budget ? n : budget, MSG_DONTWAIT);
        if (k == 0) return peer_error(g, left_of(g), 0, err);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        if (k < 0) return peer_error(g, left_of(g), errno, err);
        *moved = true;
        budget -= (size_t)k < budget ? (size_t)k : budget;
        if (x->rhdr_done < HDR_BYTES) {
            x->rhdr_done += (size_t)k;
            if (x->rhdr_done == HDR_BYTES && comm_get32(x->rhdr) == ABORT_MAGIC) {
                blame b;
                if (read_abort(g, g->left, left_of(g), x->rhdr, &b, err) < 0) return -1;
                return forwarded(g, left_of(g), &b, err);
            }
            if (x->rhdr_done == HDR_BYTES && check_header(g, st, x, err) < 0) return -1;
            continue;
        }
        x->rdone += (size_t)k, g->received += k;
        if (st->reduce >= 0 && (x->rdone % SEG == 0 || x->rdone == st->rn)) {
            size_t start = (x->rdone - 1) / SEG * SEG; /* the segment just completed */
            add_into(st->rp + start, g->scratch, x->rdone - start, (comm_dtype)st->reduce);
        }
    }
    return 0;
}

/* The right connection is readable: its end, or an abort frame. A frame that blames this rank
 * for stalling is a question: the right neighbour gave up waiting for it. When this rank has
 * itself waited on its left for half the timeout (`waited`; -1: it does not wait on its left), it
 * passes the question on (ask_left) instead of taking the blame. */
static int from_right(ring *g, const xfer *x, bool sending, double waited, err_t *err) {
    blame b;
    int k = read_right(g, sending, &b, err);
    if (k <= 0) return k;
    bool right_clear = !sending || x->shdr_done == 0;
    if (b.origin == g->rank && b.cause == CAUSE_STALLED && waited >= g->timeout_s / 2) {
        blame_on(g, left_of(g), CAUSE_STALLED);
        err_set(err, "nothing from rank %d for %.2g s (rank %d timed out waiting for this rank; CEPHALO_COMM_TIMEOUT sets the timeout)",
                left_of(g), waited, right_of(g));
        return ask_left(g, x, true, right_clear, err);
    }
    if (sending) return forwarded(g, right_of(g), &b, err);
    /* owing it nothing, this operation may still complete, as with a neighbour that closed */
    g->pending = g->right_eof = true;
    g->pending_why = b;
    return 0;
}

static int step_loop(ring *g, const step *st, xfer *x, err_t *err) {
    double last = clock_now_s(), last_in = last; /* of progress; of bytes from the left */
    for (;;) {
        bool sending = st->send && (x->shdr_done < HDR_BYTES || x->sdone < st->sn);
        bool receiving = st->recv && (x->rhdr_done < HDR_BYTES || x->rdone < st->rn);
        if (!sending && !receiving) return 0;
        bool ready = sending && (x->shdr_done < HDR_BYTES || sendable(st, x) > x->sdone);
        /* The right connection is watched for abort frames, and for its end while this step owes
         * it data (read_right). */
        struct pollfd p[2] = {{sending || !g->right_eof ? g->right : -1, (short)(POLLIN | (ready ? POLLOUT : 0)), 0},
                              {receiving ? g->left : -1, POLLIN, 0}};
        int n = poll(p, 2, net_ms_left(last + g->timeout_s));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return err_set(err, "poll: %s", strerror(errno));
        if (n == 0) {
            timeout_error(g, receiving, err);
            return receiving ? ask_left(g, x, false, !sending || x->shdr_done == 0, err) : -1;
        }
        bool moved = false;
        size_t got = x->rhdr_done + x->rdone;
        /* sending first: a peer that is out of step then gets our header before we fail */
        if ((p[0].revents & (POLLOUT | POLLERR | POLLHUP)) && ready && do_send(g, st, x, &moved, err) < 0) return -1;
        if (p[1].revents && do_recv(g, st, x, &moved, err) < 0) return -1;
        if (x->rhdr_done + x->rdone != got) last_in = clock_now_s();
        if ((p[0].revents & (POLLIN | POLLERR | POLLHUP)) &&
            from_right(g, x, sending, receiving ? clock_now_s() - last_in : -1, err) < 0)
            return -1;
        if (moved) last = clock_now_s();
    }
}

static int step_run(ring *g, const step *st, err_t *err) {
    xfer x = {0};
    put_header(x.shdr, st->kind, st->index, g->seq, st->send ? st->sn : 0);
    if (step_loop(g, st, &x, err) == 0) return 0;
    /* What the right neighbour is owed before an abort frame may follow: nothing when the step
     * has not begun on the wire; else the rest of it, if this rank has that data (a relay may not) */
    bool begun = st->send && x.shdr_done > 0;
    g->owed_ok = !begun || !st->relay || x.rdone == st->rn;
    memcpy(g->owed_hdr, x.shdr, HDR_BYTES);
    g->owed_hdr_done = begun ? x.shdr_done : HDR_BYTES;
    g->owed_p = begun ? st->sp + x.sdone : NULL;
    g->owed_n = begun ? st->sn - x.sdone : 0;
    return -1;
}

/* ------------------------------------------------------------------------------------------ */
/* the collectives                                                                             */

static void set_offsets(ring *g, const int64_t *counts) {
    g->off[0] = 0;
    for (int i = 0; i < g->world; i++) g->off[i + 1] = g->off[i] + counts[i];
}

/* A ring step over blocks: send block sb, receive block rb. */
static int block_step(ring *g, comm_req *r, uint16_t index, int sb, int rb, int reduce, err_t *err) {
    size_t esz = comm_dtype_size(r->dtype);
    uint8_t *buf = r->op == COMM_OP_BARRIER ? (uint8_t *)&r->one : r->buf;
    step st = {.kind = (uint16_t)r->op, .index = index, .send = true, .recv = true, .reduce = reduce,
               .sp = buf + (size_t)g->off[sb] * esz, .sn = (size_t)r->counts[sb] * esz,
               .rp = buf + (size_t)g->off[rb] * esz, .rn = (size_t)r->counts[rb] * esz};
    return step_run(g, &st, err);
}

/* Step s sends block r-s and receives block r-s-1; `first` numbers the steps in the header. */
static int allgatherv(ring *g, comm_req *r, int first, err_t *err) {
    set_offsets(g, r->counts);
    for (int s = 0; s < g->world - 1; s++)
        if (block_step(g, r, (uint16_t)(first + s), block(g, g->rank - s), block(g, g->rank - s - 1), -1, err) < 0) return -1;
    return 0;
}

/* Step s sends block r-s-1 and adds the received block r-s-2 into place: after world-1 steps
 * block b holds x_{b+1} + x_{b+2} + ... + x_b, summed in that order, on rank b. */
static int reduce_scatterv(ring *g, comm_req *r, err_t *err) {
    set_offsets(g, r->counts);
    for (int s = 0; s < g->world - 1; s++)
        if (block_step(g, r, (uint16_t)s, block(g, g->rank - s - 1), block(g, g->rank - s - 2), (int)r->dtype, err) < 0) return -1;
    return 0;
}

static int broadcast(ring *g, comm_req *r, err_t *err) {
    int pos = block(g, g->rank - r->root); /* place in the chain that starts at the root */
    size_t n = (size_t)r->bytes;
    step st = {.kind = (uint16_t)r->op, .send = pos < g->world - 1, .recv = pos > 0, .reduce = -1,
               .relay = pos > 0 && pos < g->world - 1, .sp = r->buf, .sn = n, .rp = r->buf, .rn = n};
    return step_run(g, &st, err);
}

static int run_op(ring *g, comm_req *r, err_t *err) {
    /* every rank fails the same operation here, before anything moves */
    bool half = r->dtype == COMM_BF16 || r->dtype == COMM_F16;
    if (half && (r->op == COMM_OP_REDUCE_SCATTERV || r->op == COMM_OP_ALLREDUCE))
        return err_set(err, "the socket backend cannot sum %s (sum in F32, or use CEPHALO_COMM_BACKEND=nccl)",
                       r->dtype == COMM_BF16 ? "BF16" : "F16");
    if (g->pending) return forwarded(g, right_of(g), &g->pending_why, err); /* from_right */
    switch (r->op) {
    case COMM_OP_ALLGATHERV: return allgatherv(g, r, 0, err);
    case COMM_OP_REDUCE_SCATTERV: return reduce_scatterv(g, r, err);
    case COMM_OP_BROADCAST: return broadcast(g, r, err);
    case COMM_OP_ALLREDUCE:
    case COMM_OP_BARRIER:
        /* Each element is summed on its owner only, then copied: bit-identical everywhere. */
        if (reduce_scatterv(g, r, err) < 0 || allgatherv(g, r, g->world - 1, err) < 0) return -1;
        if (r->op == COMM_OP_BARRIER && r->one != g->world)
            return err_set(err, "the ranks' barrier values sum to %lld, not %d (protocol error)", (long long)r->one, g->world);
        return 0;
    }
    return err_set(err, "unknown operation %d", (int)r->op);
}

/* The first failure of this rank: the machine-readable line (the launcher reads it), an abort
 * frame to each neighbour (best effort, each bounded by the grace: a stopped neighbour takes
 * nothing), then the connections shut down. */
static void tell_neighbours(ring *g, const err_t *err) {
    if (atomic_exchange(&g->shut, true)) return; /* comm_abort shut them down meanwhile */
    if (!g->forwarded) snprintf(g->why.reason, sizeof g->why.reason, "%.*s", REASON_MAX, err->msg);
    fprintf(stderr, "cephalo-comm-failure rank=%d origin=%d cause=%s\n", g->rank, g->why.origin, cause_words[g->why.cause]);
    uint8_t f[HDR_BYTES + REASON_MAX];
    size_t n = put_abort(f, &g->why);
    double deadline = clock_now_s() + grace(g);
    if (!g->told_left) (void)net_write_all(g->left, f, n, deadline);
    /* to the right only at a frame boundary: first the rest of a half-sent step, if it can be */
    size_t hdr_left = HDR_BYTES - g->owed_hdr_done;
    if (g->owed_ok && (hdr_left == 0 || net_write_all(g->right, g->owed_hdr + g->owed_hdr_done, hdr_left, deadline) == 0) &&
        (g->owed_n == 0 || net_write_all(g->right, g->owed_p, g->owed_n, deadline) == 0))
        (void)net_write_all(g->right, f, n, deadline);
    ring_shutdown(g);
}

static int ring_run(ring *g, comm_req *r, err_t *err) {
    g->seq++;
    blame_on(g, g->rank, CAUSE_FAILED); /* unless the error blames a peer */
    g->owed_ok = true, g->owed_hdr_done = HDR_BYTES, g->owed_n = 0;
    int rc = run_op(g, r, err);
    if (rc < 0) tell_neighbours(g, err);
    return rc;
}

static void ring_bytes(const ring *g, int64_t *sent, int64_t *received) {
    *sent = g->sent;
    *received = g->received;
}

/* ------------------------------------------------------------------------------------------ */
/* building the ring                                                                           */

static void put_hello(uint8_t *h, int rank, int world) {
    comm_put32(h, RING_MAGIC);
    comm_put32(h + 4, RING_VERSION);
    comm_put32(h + 8, (uint32_t)rank);
    comm_put32(h + 12, (uint32_t)world);
}

static bool hello_is(const uint8_t *h, int rank, int world) {
    uint8_t want[HELLO_BYTES];
    put_hello(want, rank, world);
    return memcmp(h, want, HELLO_BYTES) == 0;
}

static void ring_key(char *key, size_t n, int rank) { snprintf(key, n, "cephalo/ring/%d", rank); }

/* Listens on the address this rank reaches the store from, on a port the kernel picks, and
 * publishes "address:port" in the store. */
static int listen_and_publish(ring *g, store_client *st, int *lfd, err_t *err) {
    struct sockaddr_storage ss;
    socklen_t len;
    if (store_local_addr(st, &ss, &len, err) < 0) return -1;
    if (ss.ss_family == AF_INET) ((struct sockaddr_in *)&ss)->sin_port = 0;
    else ((struct sockaddr_in6 *)&ss)->sin6_port = 0;
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return err_set(err, "socket: %s", strerror(errno));
    *lfd = fd;
    net_tune(fd); /* before listen(): accepted sockets inherit the buffers, and the window scale */
    if (bind(fd, (struct sockaddr *)&ss, len) < 0 || listen(fd, 16) < 0) return err_set(err, "ring listener: %s", strerror(errno));
    len = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &len) < 0) return err_set(err, "getsockname: %s", strerror(errno));
    net_set_nonblocking(fd);
    char addr[128], key[64];
    net_addr_str((struct sockaddr *)&ss, addr, sizeof addr);
    ring_key(key, sizeof key, g->rank);
    return store_set(st, key, addr, strlen(addr), err);
}

static int connect_right(ring *g, store_client *st, err_t *err) {
    char key[64], addr[128], host[128];
    size_t n;
    int port, right = right_of(g);
    ring_key(key, sizeof key, right);
    if (store_get(st, key, addr, sizeof addr - 1, &n, err) < 0) return err_prefix(err, "waiting for rank %d's address", right);
    addr[n] = '\0';
    if (!net_split_hostport(addr, host, sizeof host, &port))
        return err_set(err, "rank %d published a malformed address '%s'", right, addr);
    double deadline = clock_now_s() + g->timeout_s;
    int fd = net_connect(host, port, deadline, err);
    if (fd < 0) return err_prefix(err, "connecting to rank %d", right);
    g->right = fd;
    net_tune(fd);
    uint8_t h[HELLO_BYTES];
    put_hello(h, g->rank, g->world);
    if (net_write_all(fd, h, sizeof h, deadline) < 0) return peer_error(g, right, errno, err);
    return 0;
}

/* Accepts connections until one greets as rank-1 of this world; strays are closed. */
static int accept_left(ring *g, int lfd, err_t *err) {
    int left = left_of(g);
    double deadline = clock_now_s() + g->timeout_s;
    for (;;) {
        struct pollfd p = {lfd, POLLIN, 0};
        int n = poll(&p, 1, net_ms_left(deadline));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return err_set(err, "rank %d did not connect for %g s (timeout; CEPHALO_COMM_TIMEOUT sets it)", left, g->timeout_s);
        struct sockaddr_storage ss;
        socklen_t len = sizeof ss;
        int fd = accept(lfd, (struct sockaddr *)&ss, &len);
        if (fd < 0) continue;
        net_set_nonblocking(fd);
        uint8_t h[HELLO_BYTES];
        if (net_read_all(fd, h, sizeof h, deadline) == 0 && hello_is(h, left, g->world)) {
            g->left = fd;
            put_hello(h, g->rank, g->world);
            if (net_write_all(fd, h, sizeof h, deadline) < 0) return peer_error(g, left, errno, err);
            return 0;
        }
        char peer[64];
        net_addr_str((struct sockaddr *)&ss, peer, sizeof peer);
        log_warn("rank %d: closed a connection from %s on the ring port: not rank %d of this job", g->rank, peer, left);
        close(fd);
    }
}

/* The right neighbour answers our hello with its own. */
static int check_right_hello(ring *g, err_t *err) {
    uint8_t h[HELLO_BYTES];
    if (net_read_all(g->right, h, sizeof h, clock_now_s() + g->timeout_s) < 0) {
        if (errno == ETIMEDOUT) return err_set(err, "rank %d did not answer for %g s (timeout; CEPHALO_COMM_TIMEOUT sets it)", right_of(g), g->timeout_s);
        return peer_error(g, right_of(g), errno, err);
    }
    if (!hello_is(h, right_of(g), g->world))
        return err_set(err, "the address rank %d published answers as another rank or job", right_of(g));
    return 0;
}

static void ring_close(ring *g);

/* Listens, publishes this rank's address in the store, connects to rank+1, accepts rank-1. */
static int ring_open(const comm_config *cfg, store_client *st, ring **out, err_t *err) {
    ring *g = xcalloc(1, sizeof *g);
    g->rank = cfg->rank, g->world = cfg->world, g->timeout_s = cfg->timeout_s;
    g->left = g->right = -1;
    atomic_init(&g->shut, false);
    int lfd = -1;
    /* Every rank connects before it accepts; the connection completes in the listener's backlog,
     * so the order in which ranks get here does not matter. */
    int rc = listen_and_publish(g, st, &lfd, err);
    if (rc == 0) rc = connect_right(g, st, err);
    if (rc == 0) rc = accept_left(g, lfd, err);
    if (rc == 0) rc = check_right_hello(g, err);
    if (lfd >= 0) close(lfd);
    if (rc < 0) {
        ring_close(g);
        return err_prefix(err, "ring rendezvous");
    }
    g->scratch = xmalloc(SEG);
    g->off = xcalloc((size_t)g->world + 1, sizeof *g->off);
    *out = g;
    return 0;
}

/* shutdown(2) of both connections, from any thread: peers and our own poll() fail at once. */
static void ring_shutdown(ring *g) {
    if (!g) return;
    atomic_store(&g->shut, true);
    if (g->left >= 0) shutdown(g->left, SHUT_RDWR);
    if (g->right >= 0) shutdown(g->right, SHUT_RDWR);
}

static void ring_close(ring *g) {
    if (!g) return;
    if (g->left >= 0) close(g->left);
    if (g->right >= 0) close(g->right);
    free(g->scratch);
    free(g->off);
    free(g);
}

/* ------------------------------------------------------------------------------------------ */
/* the backend's table (comm_internal.h)                                                       */

static int socket_open(const comm_config *cfg, store_client *st, int gpu, void *compute_stream, void **state,
                       err_t *err) {
    (void)gpu, (void)compute_stream; /* host memory */
    ring *g = NULL;
    int rc = ring_open(cfg, st, &g, err);
    *state = g;
    return rc;
}

static int socket_run(void *state, comm_req *r, err_t *err) { return ring_run(state, r, err); }
static void socket_bytes(const void *state, int64_t *sent, int64_t *received) { ring_bytes(state, sent, received); }
static void socket_shutdown(void *state) { ring_shutdown(state); }
static void socket_close(void *state) { ring_close(state); }

const comm_backend comm_socket_backend = {
    .name = "socket",
    .device_buffers = false,
    .open = socket_open,
    .run = socket_run,
    .bytes = socket_bytes,
    .shutdown = socket_shutdown,
    .close = socket_close,
};
