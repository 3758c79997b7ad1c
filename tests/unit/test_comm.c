/* test_comm.c - worker/comm*.c: configuration from the environment, world 1, every collective
 * for worlds 1..5 against sequential oracles (uneven and zero counts, sizes across segments),
 * byte counters, queued asynchronous operations, failures (a dead peer, a stalled peer and the
 * origin of a failure named on every rank, ranks out of step), rendezvous in any start order,
 * strays at the store, a port in use.
 *
 * Ranks are threads of this process, each with its own communicator on 127.0.0.1 and a fresh
 * port. cmocka's asserts must run on the main thread, so a rank records its first failed check
 * (TCHECK) and the main thread asserts after joining. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"

#define MAX_RANKS 8
#define SEG COMM_SEGMENT_BYTES

/* ------------------------------------------------------------------------------------------ */
/* harness                                                                                     */

typedef struct rank_ctx rank_ctx;
typedef void (*rank_fn)(rank_ctx *x);

struct rank_ctx {
    int rank, world, port;
    double timeout_s, delay_s;
    rank_fn fn;
    void *arg;
    comm *c;
    char fail[4096]; /* first failed check */
    err_t err;       /* an error the test expects, recorded by the rank */
    int failed;      /* the expected error arrived */
    double fail_s;   /* seconds from issuing the operation to its error */
};

#define TCHECK(x, cond, ...)                                                               \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            if (!(x)->fail[0]) {                                                           \
                int n_ = snprintf((x)->fail, sizeof(x)->fail, "rank %d: %s:%d: ", (x)->rank, \
                                  __FILE__, __LINE__);                                     \
                snprintf((x)->fail + n_, sizeof(x)->fail - (size_t)n_, __VA_ARGS__);      \
            }                                                                              \
            return;                                                                        \
        }                                                                                  \
    } while (0)

#define WAIT(x, req)                                                                   \
    do {                                                                               \
        err_t e_ = {{0}};                                                              \
        TCHECK(x, comm_wait((x)->c, (req), &e_) == 0, "wait failed: %s", e_.msg);      \
    } while (0)

#define assert_msg_has(msg, needle)                                                             \
    do {                                                                                        \
        if (!strstr((msg), (needle))) fail_msg("message '%s' lacks '%s'", (msg), (needle));     \
    } while (0)

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* A port nobody listens on right now: bind port 0 and let the kernel choose. */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

static comm_config config(int rank, int world, int port, double timeout_s) {
    comm_config c;
    memset(&c, 0, sizeof c);
    c.rank = rank, c.world = world, c.master_port = port, c.timeout_s = timeout_s;
    snprintf(c.master_addr, sizeof c.master_addr, "127.0.0.1");
    snprintf(c.backend, sizeof c.backend, "socket");
    return c;
}

static void *rank_main(void *p) {
    rank_ctx *x = p;
    if (x->delay_s > 0) sleep_s(x->delay_s);
    comm_config cfg = config(x->rank, x->world, x->port, x->timeout_s);
    err_t err = {{0}};
    x->c = comm_open(&cfg, &err);
    if (!x->c) {
        snprintf(x->fail, sizeof x->fail, "rank %d: comm_open: %s", x->rank, err.msg);
        return NULL;
    }
    x->fn(x);
    comm_close(x->c);
    return NULL;
}

/* Runs fn on `world` rank threads; x[] keeps each rank's results for the caller. */
static void run_ranks(rank_ctx *x, int world, rank_fn fn, void *arg, double timeout_s, const double *delays) {
    pthread_t t[MAX_RANKS];
    int port = free_port();
    for (int r = 0; r < world; r++) {
        x[r] = (rank_ctx){.rank = r, .world = world, .port = port, .timeout_s = timeout_s, .fn = fn, .arg = arg,
                          .delay_s = delays ? delays[r] : 0};
        assert_int_equal(pthread_create(&t[r], NULL, rank_main, &x[r]), 0);
    }
    for (int r = 0; r < world; r++) pthread_join(t[r], NULL);
}

static void run_world(int world, rank_fn fn, void *arg) {
    rank_ctx x[MAX_RANKS];
    run_ranks(x, world, fn, arg, 20, NULL);
    for (int r = 0; r < world; r++)
        if (x[r].fail[0]) fail_msg("world %d: %s", world, x[r].fail);
}

/* ------------------------------------------------------------------------------------------ */
/* data                                                                                        */

static uint64_t mix(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Same on every rank: counts of pattern p for world n. Zeros, all-zero-but-one, all zero, and
 * blocks spanning several segments. */
static void make_counts(int p, int n, int64_t *k) {
    for (int i = 0; i < n; i++) {
        uint64_t h = mix((uint64_t)(p * 1000 + n * 10 + i));
        switch (p) {
        case 0: k[i] = h % 3 == 0 ? 0 : (int64_t)(h % 2000); break;                 /* small, zeros */
        case 1: k[i] = i == (int)(mix((uint64_t)n) % (uint64_t)n) ? 300007 : 0; break; /* one > 1 MiB */
        case 2: k[i] = 0; break;
        default: k[i] = i == 0 ? 0 : (int64_t)(h % 400000); break;                   /* large, uneven */
        }
    }
}

static int64_t sum_counts(const int64_t *k, int n) {
    int64_t t = 0;
    for (int i = 0; i < n; i++) t += k[i];
    return t;
}

static comm_dtype pattern_type(int p) { return p == 0 ? COMM_F64 : p == 2 ? COMM_I64 : COMM_F32; }
static size_t dsize(comm_dtype t) { return t == COMM_F32 ? 4 : 8; }

/* Element j of block b (exact in every type). */
static void put_value(void *buf, comm_dtype t, int64_t at, int b, int64_t j) {
    double v = (double)b * 1000003.0 + (double)j;
    if (t == COMM_F32) ((float *)buf)[at] = (float)((b * 400009 + j) % 16000000);
    else if (t == COMM_F64) ((double *)buf)[at] = v;
    else ((int64_t *)buf)[at] = (int64_t)b << 40 | j;
}

static bool value_is(const void *buf, comm_dtype t, int64_t at, int b, int64_t j) {
    uint8_t want[8];
    put_value(want, t, 0, b, j);
    return memcmp((const uint8_t *)buf + at * (int64_t)dsize(t), want, dsize(t)) == 0;
}

/* ------------------------------------------------------------------------------------------ */
/* configuration                                                                               */

static void clear_env(void) {
    const char *vars[] = {"MASTER_ADDR", "MASTER_PORT", "CEPHALO_COMM_TIMEOUT", "CEPHALO_COMM_BACKEND", "CEPHALO_JOB_ID",
                          "CEPHALO_NCCL_UNEVEN"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) unsetenv(vars[i]);
}

static void expect_env_error(const char *var, const char *value, int world, const char *needle) {
    clear_env();
    if (world > 1 && var[0] && strcmp(var, "MASTER_PORT") != 0) setenv("MASTER_PORT", "29500", 1);
    if (var[0]) setenv(var, value, 1);
    comm_config cfg;
    err_t err = {{0}};
    if (comm_config_from_env(&cfg, 0, world, &err) == 0) fail_msg("%s='%s' accepted", var, value);
    assert_msg_has(err.msg, needle);
}

static void test_config_env(void **state) {
    (void)state;
    comm_config cfg;
    err_t err = {{0}};
    clear_env();
    assert_int_equal(comm_config_from_env(&cfg, 0, 1, &err), 0);
    assert_string_equal(cfg.master_addr, "127.0.0.1");
    assert_string_equal(cfg.backend, "socket");
    assert_true(cfg.timeout_s == COMM_DEFAULT_TIMEOUT_S);
    setenv("MASTER_ADDR", "node-a.example", 1);
    setenv("MASTER_PORT", "29500", 1);
    setenv("CEPHALO_COMM_TIMEOUT", "2.5", 1);
    setenv("CEPHALO_JOB_ID", "job-7", 1);
    assert_int_equal(comm_config_from_env(&cfg, 3, 4, &err), 0);
    assert_string_equal(cfg.master_addr, "node-a.example");
    assert_int_equal(cfg.master_port, 29500);
    assert_true(cfg.timeout_s == 2.5);
    assert_string_equal(cfg.job_id, "job-7");
    for (int i = 0; i < 3; i++) {
        const char *u[] = {"auto", "grouped", "pad"};
        setenv("CEPHALO_NCCL_UNEVEN", u[i], 1);
        assert_int_equal(comm_config_from_env(&cfg, 3, 4, &err), 0);
        assert_string_equal(cfg.nccl_uneven, u[i]);
    }

    expect_env_error("", "", 2, "MASTER_PORT is not set");
    expect_env_error("MASTER_PORT", "http", 2, "MASTER_PORT: 'http' is not a port (expected an integer 1..65535)");
    expect_env_error("MASTER_PORT", "70000", 2, "MASTER_PORT");
    expect_env_error("MASTER_PORT", "0", 1, "MASTER_PORT");
    expect_env_error("MASTER_PORT", "29500x", 2, "MASTER_PORT");
    /* the CEPHALO_* ones in common/env.c's words, as every program refuses them at start */
    expect_env_error("CEPHALO_COMM_TIMEOUT", "-1", 2, "$CEPHALO_COMM_TIMEOUT is '-1', expected seconds > 0, at most 1e6");
    expect_env_error("CEPHALO_COMM_TIMEOUT", "0", 2, "CEPHALO_COMM_TIMEOUT");
    expect_env_error("CEPHALO_COMM_TIMEOUT", "soon", 2, "CEPHALO_COMM_TIMEOUT");
    expect_env_error("CEPHALO_COMM_TIMEOUT", "inf", 2, "CEPHALO_COMM_TIMEOUT");
    expect_env_error("CEPHALO_COMM_TIMEOUT", "nan", 2, "CEPHALO_COMM_TIMEOUT");
    expect_env_error("CEPHALO_COMM_TIMEOUT", " 5", 2, "CEPHALO_COMM_TIMEOUT");
    expect_env_error("CEPHALO_COMM_BACKEND", "mpi", 2, "$CEPHALO_COMM_BACKEND is 'mpi', expected socket or nccl");
    /* this test links the CPU worker library: the nccl backend is not there */
    expect_env_error("CEPHALO_COMM_BACKEND", "nccl", 2,
                     "CEPHALO_COMM_BACKEND: 'nccl' needs cephalo-worker-cuda (this worker was built without CUDA)");
    expect_env_error("CEPHALO_NCCL_UNEVEN", "padded", 2,
                     "$CEPHALO_NCCL_UNEVEN is 'padded', expected auto, grouped or pad");
    expect_env_error("MASTER_ADDR", "", 2, "MASTER_ADDR is set but empty");
    char longv[400];
    memset(longv, 'a', sizeof longv - 1);
    longv[sizeof longv - 1] = '\0';
    expect_env_error("MASTER_ADDR", longv, 2, "MASTER_ADDR: ");
    expect_env_error("CEPHALO_JOB_ID", longv, 2, "$CEPHALO_JOB_ID is 399 characters long");
    expect_env_error("CEPHALO_JOB_ID", "job\n7", 2, "$CEPHALO_JOB_ID is 'job");
    clear_env();
    setenv("MASTER_PORT", "29500", 1);
    assert_int_equal(comm_config_from_env(&cfg, 2, 2, &err), -1);
    assert_msg_has(err.msg, "rank 2 is out of range for world size 2");
    clear_env();
}

/* ------------------------------------------------------------------------------------------ */
/* world 1                                                                                     */

static void test_world1(void **state) {
    (void)state;
    comm_config cfg = config(0, 1, 0, 60);
    err_t err = {{0}};
    comm *c = comm_open(&cfg, &err);
    assert_non_null(c);
    float a[5] = {1, 2, 3, 4, 5};
    int64_t counts[1] = {5};
    assert_int_equal(comm_wait(c, comm_allgatherv(c, a, counts, COMM_F32, "a"), &err), 0);
    assert_int_equal(comm_wait(c, comm_reduce_scatterv(c, a, counts, COMM_F32, "a"), &err), 0);
    assert_int_equal(comm_run(c, comm_allreduce(c, a, 5, COMM_F32, "a"), &err), 0);
    assert_int_equal(comm_run(c, comm_broadcast(c, a, sizeof a, 0, "a"), &err), 0);
    assert_int_equal(comm_run(c, comm_barrier(c, "b"), &err), 0);
    assert_int_equal(comm_wait(c, NULL, &err), 0);
    for (int i = 0; i < 5; i++) assert_true(a[i] == (float)(i + 1));
    /* the socket backend: host buffers, no device, no scratch */
    assert_false(comm_device_buffers(c));
    assert_int_equal(comm_set_device_stream(c, NULL, 0, &err), 0);
    assert_int_equal(comm_device_scratch_bytes(c), 0);
    comm_stats st;
    comm_get_stats(c, &st);
    assert_int_equal(st.allgathers + st.reduce_scatters + st.allreduces + st.broadcasts + st.barriers, 5);
    assert_int_equal(comm_set_device_stream(c, NULL, 0, &err), -1);
    assert_msg_has(err.msg, "comm_set_device_stream was called twice");
    assert_int_equal(st.bytes_sent + st.bytes_received, 0);
    char v[16];
    size_t n;
    assert_int_equal(comm_store_set(c, "k", "hello", 5, &err), 0);
    assert_int_equal(comm_store_get(c, "k", v, sizeof v, &n, &err), 0);
    assert_int_equal(n, 5);
    assert_memory_equal(v, "hello", 5);
    assert_int_equal(comm_store_get(c, "missing", v, sizeof v, &n, &err), -1);
    assert_msg_has(err.msg, "not set");
    comm_abort(c, "test");
    assert_int_equal(comm_run(c, comm_barrier(c, "b"), &err), -1);
    assert_msg_has(err.msg, "rank 0: communicator aborted: test");
    comm_close(c);
}

/* ------------------------------------------------------------------------------------------ */
/* allgatherv                                                                                  */

static void check_stats(rank_ctx *x, int64_t sent, int64_t received, int64_t ops) {
    comm_stats st;
    comm_get_stats(x->c, &st);
    TCHECK(x, st.bytes_sent == sent && st.bytes_received == received, "bytes sent %lld received %lld, expected %lld %lld",
           (long long)st.bytes_sent, (long long)st.bytes_received, (long long)sent, (long long)received);
    int64_t all = st.allgathers + st.reduce_scatters + st.allreduces + st.broadcasts + st.barriers;
    TCHECK(x, all == ops, "%lld operations counted, expected %lld", (long long)all, (long long)ops);
}

static void allgatherv_rank(rank_ctx *x) {
    int n = x->world, r = x->rank;
    int64_t k[MAX_RANKS], sent = 0, received = 0;
    for (int p = 0; p < 4; p++) {
        make_counts(p, n, k);
        comm_dtype t = pattern_type(p);
        int64_t total = sum_counts(k, n), off = 0;
        for (int b = 0; b < r; b++) off += k[b];
        uint8_t *buf = malloc((size_t)total * dsize(t) + 1);
        memset(buf, 0xA5, (size_t)total * dsize(t));
        for (int64_t j = 0; j < k[r]; j++) put_value(buf, t, off + j, r, j);
        WAIT(x, comm_allgatherv(x->c, buf, k, t, "pattern"));
        int64_t at = 0;
        for (int b = 0; b < n; b++)
            for (int64_t j = 0; j < k[b]; j++, at++)
                if (!value_is(buf, t, at, b, j)) {
                    free(buf);
                    TCHECK(x, false, "pattern %d: block %d element %lld wrong", p, b, (long long)j);
                }
        free(buf);
        if (n > 1) sent += (total - k[(r + 1) % n]) * (int64_t)dsize(t), received += (total - k[r]) * (int64_t)dsize(t);
    }
    check_stats(x, sent, received, 4);
}

static void test_allgatherv(void **state) {
    (void)state;
    for (int n = 1; n <= 5; n++) run_world(n, allgatherv_rank, NULL);
}

/* ------------------------------------------------------------------------------------------ */
/* reduce-scatterv                                                                             */

/* Rank r's contribution to element i: small integers (sums exact) or floats in [0.5, 1.5). */
static double contribution(int r, int64_t i, bool integers) {
    uint64_t h = mix((uint64_t)r << 40 ^ (uint64_t)i);
    return integers ? (double)((int)(h % 17) - 8) : 0.5 + (double)(h >> 11) * 0x1p-53;
}

static void reduce_scatterv_rank(rank_ctx *x) {
    int n = x->world, r = x->rank;
    int64_t k[MAX_RANKS], sent = 0, received = 0;
    for (int p = 0; p < 5; p++) {
        make_counts(p % 4, n, k);
        bool integers = p < 4;
        comm_dtype t = p == 0 ? COMM_F64 : COMM_F32;
        int64_t total = sum_counts(k, n), off = 0;
        for (int b = 0; b < r; b++) off += k[b];
        void *buf = malloc((size_t)total * dsize(t) + 1);
        for (int64_t i = 0; i < total; i++) {
            double v = contribution(r, i, integers);
            if (t == COMM_F32) ((float *)buf)[i] = (float)v;
            else ((double *)buf)[i] = v;
        }
        WAIT(x, comm_reduce_scatterv(x->c, buf, k, t, "gradients"));
        for (int64_t i = off; i < off + k[r]; i++) {
            double want = 0;
            for (int q = 0; q < n; q++) want += t == COMM_F32 ? (double)(float)contribution(q, i, integers) : contribution(q, i, integers);
            double got = t == COMM_F32 ? ((float *)buf)[i] : ((double *)buf)[i];
            bool ok = integers ? got == want : fabs(got - want) <= 1e-6 * fabs(want);
            if (!ok) free(buf);
            TCHECK(x, ok, "pattern %d element %lld: %.9g, expected %.9g", p, (long long)i, got, want);
        }
        free(buf);
        if (n > 1) sent += (total - k[r]) * (int64_t)dsize(t), received += (total - k[(r + n - 1) % n]) * (int64_t)dsize(t);
    }
    check_stats(x, sent, received, 5);
}

static void test_reduce_scatterv(void **state) {
    (void)state;
    for (int n = 1; n <= 5; n++) run_world(n, reduce_scatterv_rank, NULL);
}

/* ------------------------------------------------------------------------------------------ */
/* allreduce                                                                                   */

typedef struct digests {
    uint64_t d[MAX_RANKS][16];
} digests;

static uint64_t digest(const void *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ ((const uint8_t *)p)[i]) * 1099511628211ull;
    return h;
}

static void allreduce_rank(rank_ctx *x) {
    digests *dg = x->arg;
    int n = x->world, r = x->rank;
    const int64_t sizes[] = {0, 1, 3, 1001, 700001};
    const comm_dtype types[] = {COMM_F32, COMM_F64, COMM_I64};
    int64_t sent = 0, received = 0, ops = 0;
    for (int ti = 0; ti < 3; ti++)
        for (int si = 0; si < 5; si++) {
            comm_dtype t = types[ti];
            int64_t count = sizes[si];
            if (t != COMM_F32 && count > 2000) continue;
            void *buf = malloc((size_t)count * 8 + 1);
            for (int64_t i = 0; i < count; i++) {
                double v = contribution(r, i, false);
                if (t == COMM_F32) ((float *)buf)[i] = (float)v;
                else if (t == COMM_F64) ((double *)buf)[i] = v;
                else ((int64_t *)buf)[i] = (int64_t)(mix((uint64_t)(r * 7919 + i)) >> 8) - (1ll << 55);
            }
            WAIT(x, comm_allreduce(x->c, buf, count, t, "norms"));
            ops++;
            for (int64_t i = 0; i < count; i++) {
                double want = 0;
                int64_t iwant = 0;
                for (int q = 0; q < n; q++) {
                    want += t == COMM_F32 ? (double)(float)contribution(q, i, false) : contribution(q, i, false);
                    iwant += (int64_t)(mix((uint64_t)(q * 7919 + i)) >> 8) - (1ll << 55);
                }
                bool ok = t == COMM_I64 ? ((int64_t *)buf)[i] == iwant
                        : fabs((t == COMM_F32 ? ((float *)buf)[i] : ((double *)buf)[i]) - want) <= 1e-6 * want;
                if (!ok) free(buf);
                TCHECK(x, ok, "type %d count %lld element %lld wrong", (int)t, (long long)count, (long long)i);
            }
            dg->d[r][ti * 5 + si] = digest(buf, (size_t)count * dsize(t));
            free(buf);
            /* the even split: the first count % n ranks own one element more */
            int64_t e[MAX_RANKS], es = (int64_t)dsize(t);
            for (int q = 0; q < n; q++) e[q] = count / n + (q < count % n);
            if (n > 1) {
                sent += ((count - e[r]) + (count - e[(r + 1) % n])) * es;
                received += ((count - e[(r + n - 1) % n]) + (count - e[r])) * es;
            }
        }
    check_stats(x, sent, received, ops);
}

static void test_allreduce(void **state) {
    (void)state;
    for (int n = 1; n <= 5; n++) {
        digests dg;
        memset(&dg, 0, sizeof dg);
        run_world(n, allreduce_rank, &dg);
        for (int r = 1; r < n; r++)
            if (memcmp(dg.d[r], dg.d[0], sizeof dg.d[0]) != 0) fail_msg("world %d: rank %d's results differ from rank 0's", n, r);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* broadcast                                                                                   */

static void broadcast_rank(rank_ctx *x) {
    int n = x->world, r = x->rank;
    const int64_t sizes[] = {0, 1, 7, SEG + 3, 2 * SEG + 12345};
    int64_t sent = 0, received = 0, ops = 0;
    uint8_t *buf = malloc(2 * SEG + 12345);
    for (int root = 0; root < n; root++)
        for (int si = 0; si < 5; si++) {
            int64_t bytes = sizes[si];
            for (int64_t i = 0; i < bytes; i++) buf[i] = r == root ? (uint8_t)(mix((uint64_t)(root * 131 + i)) >> 56) : 0xEE;
            comm_req *q = comm_broadcast(x->c, buf, bytes, root, "parameters");
            err_t e = {{0}};
            if (comm_wait(x->c, q, &e) < 0) free(buf);
            TCHECK(x, e.msg[0] == '\0', "broadcast: %s", e.msg);
            ops++;
            for (int64_t i = 0; i < bytes; i++)
                if (buf[i] != (uint8_t)(mix((uint64_t)(root * 131 + i)) >> 56)) {
                    free(buf);
                    TCHECK(x, false, "root %d, %lld bytes: byte %lld wrong", root, (long long)bytes, (long long)i);
                }
            int pos = (r - root + n) % n; /* the chain: root sends, the last only receives */
            if (pos < n - 1) sent += bytes;
            if (pos > 0) received += bytes;
        }
    free(buf);
    check_stats(x, sent, received, ops);
}

static void test_broadcast(void **state) {
    (void)state;
    for (int n = 1; n <= 5; n++) run_world(n, broadcast_rank, NULL);
}

/* ------------------------------------------------------------------------------------------ */
/* queued operations and the barrier                                                           */

typedef struct flag {
    pthread_mutex_t mu;
    int set;
} flag;

static void queued_rank(rank_ctx *x) {
    int n = x->world, r = x->rank;
    flag *f = x->arg;
    int64_t k[MAX_RANKS];
    for (int i = 0; i < n; i++) k[i] = 1000 + 37 * i;
    int64_t total = sum_counts(k, n), off = 0;
    for (int b = 0; b < r; b++) off += k[b];
    float *ag = calloc((size_t)total, 4), *rs = malloc((size_t)total * 4), *ar = malloc(4000 * 4);
    double bc[333];
    for (int64_t j = 0; j < k[r]; j++) ag[off + j] = (float)(r * 10000 + j);
    for (int64_t i = 0; i < total; i++) rs[i] = (float)(r + i % 5);
    for (int i = 0; i < 4000; i++) ar[i] = (float)(i % 7);
    for (int i = 0; i < 333; i++) bc[i] = r == n - 1 ? i * 0.5 : -1;
    /* rank 0 arrives late at the barrier: nobody may leave it before the flag is set */
    if (r == 0) {
        sleep_s(0.05);
        pthread_mutex_lock(&f->mu);
        f->set = 1;
        pthread_mutex_unlock(&f->mu);
    }
    comm_req *q[6] = {comm_barrier(x->c, "start"),
                      comm_allgatherv(x->c, ag, k, COMM_F32, "ag"),
                      comm_reduce_scatterv(x->c, rs, k, COMM_F32, "rs"),
                      comm_allreduce(x->c, ar, 4000, COMM_F32, "ar"),
                      comm_broadcast(x->c, bc, sizeof bc, n - 1, "bc"),
                      comm_barrier(x->c, "end")};
    err_t e = {{0}};
    int bad = 0;
    for (int i = 5; i >= 0; i--) bad |= comm_wait(x->c, q[i], &e) < 0; /* any order */
    bool ok = !bad;
    pthread_mutex_lock(&f->mu);
    ok = ok && f->set == 1;
    pthread_mutex_unlock(&f->mu);
    for (int b = 0, at = 0; ok && b < n; b++)
        for (int64_t j = 0; j < k[b]; j++, at++) ok = ok && ag[at] == (float)(b * 10000 + j);
    for (int64_t i = off; ok && i < off + k[r]; i++) ok = ok && rs[i] == (float)(n * (n - 1) / 2 + n * (i % 5));
    for (int i = 0; ok && i < 4000; i++) ok = ok && ar[i] == (float)(n * (i % 7));
    for (int i = 0; ok && i < 333; i++) ok = ok && bc[i] == i * 0.5;
    free(ag), free(rs), free(ar);
    TCHECK(x, ok, "queued operations: wrong results or error '%s'", e.msg);
    comm_stats st;
    comm_get_stats(x->c, &st);
    TCHECK(x, st.allgathers == 1 && st.reduce_scatters == 1 && st.allreduces == 1 && st.broadcasts == 1 && st.barriers == 2,
           "operation counters wrong");
    TCHECK(x, st.busy_ms >= 0, "busy_ms negative");
}

static void test_queued_and_barrier(void **state) {
    (void)state;
    for (int n = 1; n <= 5; n++) {
        flag f = {PTHREAD_MUTEX_INITIALIZER, 0};
        run_world(n, queued_rank, &f);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* failures                                                                                    */

/* Rank 2 aborts before the fourth allreduce; the others' fourth wait fails fast. */
static void dead_peer_rank(rank_ctx *x) {
    float v[1000];
    for (int it = 0; it < 6; it++) {
        for (int i = 0; i < 1000; i++) v[i] = 1;
        if (it == 3 && x->rank == 2) comm_abort(x->c, "test: simulated failure");
        double t0 = now_s();
        err_t e = {{0}};
        if (comm_run(x->c, comm_allreduce(x->c, v, 1000, COMM_F32, "step 3 gradients"), &e) < 0) {
            x->fail_s = now_s() - t0;
            x->err = e;
            x->failed = 1;
            /* broken: the next operation fails at once with the same first error */
            err_t e2 = {{0}};
            t0 = now_s();
            TCHECK(x, comm_run(x->c, comm_barrier(x->c, "after"), &e2) < 0, "an operation succeeded after a failure");
            TCHECK(x, strcmp(e2.msg, e.msg) == 0, "later error '%s' differs from the first '%s'", e2.msg, e.msg);
            TCHECK(x, now_s() - t0 < 0.5, "a broken communicator took %.2f s to fail", now_s() - t0);
            return;
        }
        TCHECK(x, it < 3, "allreduce %d succeeded without rank 2", it);
    }
}

static void test_dead_peer(void **state) {
    (void)state;
    rank_ctx x[MAX_RANKS];
    run_ranks(x, 4, dead_peer_rank, NULL, 30, NULL);
    for (int r = 0; r < 4; r++) {
        if (x[r].fail[0]) fail_msg("%s", x[r].fail);
        assert_true(x[r].failed);
        print_message("rank %d failed after %.3f s: %s\n", r, x[r].fail_s, x[r].err.msg);
        assert_true(x[r].fail_s < 5); /* the timeout is 30 s */
        char prefix[64];
        snprintf(prefix, sizeof prefix, "rank %d: allreduce of step 3 gradients: ", r);
        if (r != 2) assert_msg_has(x[r].err.msg, prefix);
    }
    assert_msg_has(x[2].err.msg, "rank 2: communicator aborted: test: simulated failure");
    /* rank 3 receives from rank 2 and rank 1 sends to it, so they usually see the death first
     * hand; but either may first find its other neighbour gone, when the failure travelled around
     * the ring faster than its own poll() woke up (seen under heavy load; docs/comm.md). At least
     * one of them names rank 2, and each names one of its neighbours. */
    const char *dead2 = "rank 2 closed the connection (it has probably failed; see its log)";
    if (!strstr(x[3].err.msg, "rank 0 closed the connection")) assert_msg_has(x[3].err.msg, dead2);
    if (!strstr(x[1].err.msg, "rank 0 closed the connection")) assert_msg_has(x[1].err.msg, dead2);
    assert_true(strstr(x[1].err.msg, dead2) || strstr(x[3].err.msg, dead2));
    assert_msg_has(x[0].err.msg, "closed the connection");
    /* the origin travels: rank 0 is no neighbour of rank 2, and names it all the same */
    assert_msg_has(x[0].err.msg, "aborted: rank 2 failed (rank ");
}

typedef struct stall {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
} stall;

/* Rank 1 never issues the allgatherv; it closes only after the others have failed (any world). */
static void stalled_rank(rank_ctx *x) {
    stall *s = x->arg;
    if (x->rank == 1) {
        pthread_mutex_lock(&s->mu);
        double until = now_s() + 10;
        while (s->done < x->world - 1 && now_s() < until) {
            pthread_mutex_unlock(&s->mu);
            sleep_s(0.01);
            pthread_mutex_lock(&s->mu);
        }
        pthread_mutex_unlock(&s->mu);
        return;
    }
    float buf[100 * MAX_RANKS];
    int64_t k[MAX_RANKS];
    for (int i = 0; i < x->world; i++) k[i] = 100;
    double t0 = now_s();
    err_t e = {{0}};
    x->failed = comm_run(x->c, comm_allgatherv(x->c, buf, k, COMM_F32, "unit 3 parameters"), &e) < 0;
    x->fail_s = now_s() - t0;
    x->err = e;
    pthread_mutex_lock(&s->mu);
    s->done++;
    pthread_mutex_unlock(&s->mu);
}

static void test_stalled_peer(void **state) {
    (void)state;
    stall s = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    rank_ctx x[MAX_RANKS];
    run_ranks(x, 3, stalled_rank, &s, 1.0, NULL);
    for (int r = 0; r < 3; r++)
        if (x[r].fail[0]) fail_msg("%s", x[r].fail);
    for (int r = 0; r < 3; r += 2) {
        assert_true(x[r].failed);
        print_message("rank %d failed after %.3f s: %s\n", r, x[r].fail_s, x[r].err.msg);
        assert_true(x[r].fail_s >= 0.5 && x[r].fail_s < 3.0);
    }
    /* Rank 2 times out on rank 1; rank 0 learns who stopped from rank 2's abort frame. Or rank 0
     * times out first, asks rank 2, and rank 2 passes the question on to rank 1, which does not
     * answer: then rank 2 says "nothing from rank 1 for 0.99 s (rank 0 timed out waiting ...)". */
    assert_msg_has(x[2].err.msg, "rank 2: allgatherv of unit 3 parameters: nothing from rank 1 for ");
    assert_msg_has(x[2].err.msg, "CEPHALO_COMM_TIMEOUT sets");
    assert_msg_has(x[0].err.msg, "rank 0: allgatherv of unit 3 parameters: rank 2 aborted: rank 1 stopped answering (rank 2: nothing from rank 1 for ");
}

/* The origin of a stall travels around the ring: in worlds of 4 and 5, rank 1 stalls, and every
 * other rank names it, however far from it, whichever rank timed out first (docs/comm.md, "Abort
 * frames"). */
static void test_stall_origin(void **state) {
    (void)state;
    for (int n = 4; n <= 5; n++) {
        stall s = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
        rank_ctx x[MAX_RANKS];
        run_ranks(x, n, stalled_rank, &s, 1.0, NULL);
        for (int r = 0; r < n; r++) {
            if (x[r].fail[0]) fail_msg("%s", x[r].fail);
            if (r == 1) continue;
            print_message("world %d: rank %d failed after %.3f s: %s\n", n, r, x[r].fail_s, x[r].err.msg);
            assert_true(x[r].failed);
            assert_true(x[r].fail_s >= 0.5 && x[r].fail_s < 4.0); /* the timeout, then a grace per question */
            assert_msg_has(x[r].err.msg, r == 2 ? ": nothing from rank 1 for " : " aborted: rank 1 stopped answering (rank ");
        }
    }
}

/* Rank 1 issues a different size than rank 0: both fail at once, saying so. */
static void mismatch_rank(rank_ctx *x) {
    float buf[16];
    int64_t m = x->rank == 0 ? 4 : 5, k[2] = {m, m};
    err_t e = {{0}};
    double t0 = now_s();
    x->failed = comm_run(x->c, comm_allgatherv(x->c, buf, k, COMM_F32, "unit 0"), &e) < 0;
    x->fail_s = now_s() - t0;
    x->err = e;
}

static void test_out_of_step(void **state) {
    (void)state;
    rank_ctx x[MAX_RANKS];
    run_ranks(x, 2, mismatch_rank, NULL, 20, NULL);
    for (int r = 0; r < 2; r++) {
        if (x[r].fail[0]) fail_msg("%s", x[r].fail);
        assert_true(x[r].failed);
        assert_true(x[r].fail_s < 5);
        print_message("rank %d: %s\n", r, x[r].err.msg);
    }
    /* whoever reads the other's header first says why; the other may see it close first */
    const char *m0 = "rank 0: allgatherv of unit 0: rank 1 sent step 0 of operation #1 (allgatherv, 20 bytes) where this rank expects step 0 of operation #1 (allgatherv, 16 bytes) (the ranks issued different operations or sizes)";
    const char *m1 = "rank 1: allgatherv of unit 0: rank 0 sent step 0 of operation #1 (allgatherv, 16 bytes) where this rank expects step 0 of operation #1 (allgatherv, 20 bytes)";
    if (!strstr(x[0].err.msg, m0) && !strstr(x[1].err.msg, m1)) fail_msg("neither rank says the ranks are out of step");
    for (int r = 0; r < 2; r++)
        if (!strstr(x[r].err.msg, "different operations") && !strstr(x[r].err.msg, "closed the connection"))
            fail_msg("rank %d: unexpected error '%s'", r, x[r].err.msg);
}

/* ------------------------------------------------------------------------------------------ */
/* rendezvous                                                                                  */

static void allreduce_small_rank(rank_ctx *x) {
    int64_t v[3] = {x->rank, 1, 2};
    WAIT(x, comm_allreduce(x->c, v, 3, COMM_I64, "check"));
    int n = x->world;
    TCHECK(x, v[0] == n * (n - 1) / 2 && v[1] == n && v[2] == 2 * n, "wrong sums");
}

static void test_rendezvous_any_order(void **state) {
    (void)state;
    const double late0[] = {0.3, 0.1, 0.05, 0};   /* rank 0 last */
    const double mixed[] = {0.1, 0, 0.2, 0.05, 0.15};
    rank_ctx x[MAX_RANKS];
    run_ranks(x, 4, allreduce_small_rank, NULL, 20, late0);
    for (int r = 0; r < 4; r++)
        if (x[r].fail[0]) fail_msg("%s", x[r].fail);
    run_ranks(x, 5, allreduce_small_rank, NULL, 20, mixed);
    for (int r = 0; r < 5; r++)
        if (x[r].fail[0]) fail_msg("%s", x[r].fail);
}

/* Raw store protocol, for strays (comm_store.c). */
enum { HELLO = 1, REFUSE = 3 };

static int raw_connect(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        close(fd);
        return -1;
    }
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Sends a HELLO and returns the refusal text ("" when welcomed or dropped). */
static void raw_hello(int port, uint32_t magic, int rank, int world, const char *job, char *why, size_t n) {
    int fd = raw_connect(port);
    uint8_t m[8 + 16 + 64];
    size_t jl = strlen(job);
    put32(m, HELLO), put32(m + 4, (uint32_t)(16 + jl));
    put32(m + 8, magic), put32(m + 12, 1), put32(m + 16, (uint32_t)rank), put32(m + 20, (uint32_t)world);
    memcpy(m + 24, job, jl);
    why[0] = '\0';
    if (fd < 0 || send(fd, m, 24 + jl, MSG_NOSIGNAL) < 0) return;
    uint8_t h[8];
    if (recv(fd, h, 8, MSG_WAITALL) == 8 && h[0] == REFUSE) {
        size_t len = (size_t)(h[4] | h[5] << 8);
        len = len < n - 1 ? len : n - 1;
        ssize_t k = recv(fd, why, len, MSG_WAITALL);
        why[k > 0 ? k : 0] = '\0';
    }
    close(fd);
}

typedef struct strays {
    char refusal[4][512];
    char intruder[1024];
    int silent_fd;
} strays;

static void send_garbage(int port, const void *p, size_t n) {
    int fd = raw_connect(port);
    if (fd < 0) return;
    (void)send(fd, p, n, MSG_NOSIGNAL);
    uint8_t b;
    (void)recv(fd, &b, 1, 0); /* the server drops us */
    close(fd);
}

/* Rank 0 plays the strays while the others wait in a barrier; then the job must still work. */
static void strays_rank(rank_ctx *x) {
    strays *s = x->arg;
    if (x->rank == 0) {
        s->silent_fd = raw_connect(x->port); /* connects and says nothing */
        uint8_t junk[64];
        for (int i = 0; i < 64; i++) junk[i] = (uint8_t)mix((uint64_t)i);
        send_garbage(x->port, junk, sizeof junk);
        uint8_t huge[8] = {HELLO, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}; /* a 4 GiB greeting */
        send_garbage(x->port, huge, sizeof huge);
        uint8_t set_first[12] = {4, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0}; /* a SET before HELLO */
        send_garbage(x->port, set_first, sizeof set_first);
        raw_hello(x->port, 0x52545343u, 1, 2, "", s->refusal[0], sizeof s->refusal[0]);
        raw_hello(x->port, 0x52545343u, 1, 3, "other-job", s->refusal[1], sizeof s->refusal[1]);
        raw_hello(x->port, 0x52545343u, 2, 3, "", s->refusal[2], sizeof s->refusal[2]);
        raw_hello(x->port, 0x12345678u, 1, 3, "", s->refusal[3], sizeof s->refusal[3]);
        /* a whole rank of a job with another world size */
        comm_config cfg = config(1, 2, x->port, 2);
        err_t e = {{0}};
        comm *c = comm_open(&cfg, &e);
        if (c) comm_close(c);
        snprintf(s->intruder, sizeof s->intruder, "%s", c ? "accepted" : e.msg);
    }
    WAIT(x, comm_barrier(x->c, "strays"));
    allreduce_small_rank(x);
    char v[32];
    size_t n;
    err_t e = {{0}};
    if (x->rank == 1) TCHECK(x, comm_store_set(x->c, "greeting", "from rank 1", 11, &e) == 0, "%s", e.msg);
    if (x->rank == 2) {
        TCHECK(x, comm_store_get(x->c, "greeting", v, sizeof v, &n, &e) == 0, "%s", e.msg);
        TCHECK(x, n == 11 && memcmp(v, "from rank 1", 11) == 0, "wrong value");
    }
    WAIT(x, comm_barrier(x->c, "end"));
    if (x->rank == 0 && s->silent_fd >= 0) close(s->silent_fd);
}

static void test_store_strays(void **state) {
    (void)state;
    strays s;
    memset(&s, 0, sizeof s);
    rank_ctx x[MAX_RANKS];
    run_ranks(x, 3, strays_rank, &s, 5, NULL);
    for (int r = 0; r < 3; r++)
        if (x[r].fail[0]) fail_msg("%s", x[r].fail);
    assert_msg_has(s.refusal[0], "this store serves a job of world size 3, not 2 (another job on the same MASTER_PORT?)");
    assert_msg_has(s.refusal[1], "this store serves job '', not 'other-job'");
    assert_msg_has(s.refusal[2], "rank 2 has already joined");
    assert_msg_has(s.refusal[3], "not a Cephalo rank");
    print_message("intruder: %s\n", s.intruder);
    assert_msg_has(s.intruder, "rank 1: rendezvous: the store at 127.0.0.1:");
    assert_msg_has(s.intruder, "refused this rank: this store serves a job of world size 3, not 2");
}

/* A GET of a key nobody sets times out (and only the store suffers); a port in use is refused. */
static void store_timeout_rank(rank_ctx *x) {
    stall *s = x->arg;
    char v[8];
    size_t n;
    err_t e = {{0}};
    if (x->rank == 1) {
        double t0 = now_s();
        int rc = comm_store_get(x->c, "never", v, sizeof v, &n, &e);
        double took = now_s() - t0;
        pthread_mutex_lock(&s->mu);
        s->done = 1;
        pthread_mutex_unlock(&s->mu);
        TCHECK(x, rc < 0, "got a key nobody set");
        TCHECK(x, strstr(e.msg, "rank 1: store get of 'never': no rank set it within 0.5 s (timeout; CEPHALO_COMM_TIMEOUT sets it)"), "%s", e.msg);
        TCHECK(x, took < 3, "took %.2f s", took);
    } else {
        /* not in a collective meanwhile: rank 1 makes no progress there for 0.5 s */
        for (;;) {
            pthread_mutex_lock(&s->mu);
            int done = s->done;
            pthread_mutex_unlock(&s->mu);
            if (done) break;
            sleep_s(0.01);
        }
    }
    WAIT(x, comm_barrier(x->c, "after"));
}

static void test_store_timeout_and_port_in_use(void **state) {
    (void)state;
    rank_ctx x[MAX_RANKS];
    stall s = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    run_ranks(x, 2, store_timeout_rank, &s, 0.5, NULL);
    for (int r = 0; r < 2; r++)
        if (x[r].fail[0]) fail_msg("%s", x[r].fail);

    int port = free_port(), fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(fd, 4), 0);
    comm_config cfg = config(0, 2, port, 5);
    err_t e = {{0}};
    double t0 = now_s();
    assert_null(comm_open(&cfg, &e));
    assert_true(now_s() - t0 < 1);
    print_message("%s\n", e.msg);
    assert_msg_has(e.msg, "rank 0: cannot serve the rendezvous store on 127.0.0.1:");
    assert_msg_has(e.msg, "the port is in use");
    close(fd);
}

/* ------------------------------------------------------------------------------------------ */
/* BF16 on the socket backend: gathered and broadcast by element size; sums are an error         */

static void bf16_rank(rank_ctx *x) {
    int n = x->world, r = x->rank;
    int64_t k[MAX_RANKS], total = 0, off = 0;
    for (int i = 0; i < n; i++) k[i] = 3 + 2 * i; /* odd counts: blocks not 4-byte aligned */
    for (int i = 0; i < n; i++) total += k[i], off += i < r ? k[i] : 0;
    uint16_t buf[64];
    memset(buf, 0, sizeof buf);
    for (int64_t j = 0; j < k[r]; j++) buf[off + j] = (uint16_t)(0x3f80 + r * 64 + j);
    WAIT(x, comm_allgatherv(x->c, buf, k, COMM_BF16, "bf16 parameters"));
    for (int b = 0, at = 0; b < n; b++)
        for (int64_t j = 0; j < k[b]; j++, at++)
            TCHECK(x, buf[at] == (uint16_t)(0x3f80 + b * 64 + j), "block %d element %lld: 0x%04x", b, (long long)j, buf[at]);
    comm_stats st;
    comm_get_stats(x->c, &st);
    TCHECK(x, st.bytes_sent == 2 * (total - k[(r + 1) % n]), "bytes sent %lld", (long long)st.bytes_sent);
    err_t e = {{0}};
    TCHECK(x, comm_wait(x->c, comm_reduce_scatterv(x->c, buf, k, COMM_BF16, "bf16 gradients"), &e) == -1, "bf16 sum accepted");
    TCHECK(x, strstr(e.msg, "reduce-scatterv of bf16 gradients: the socket backend cannot sum BF16") != NULL, "message: %s", e.msg);
}

static void test_bf16_socket(void **state) {
    (void)state;
    for (int n = 2; n <= 3; n++) run_world(n, bf16_rank, NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_env),
        cmocka_unit_test(test_world1),
        cmocka_unit_test(test_allgatherv),
        cmocka_unit_test(test_reduce_scatterv),
        cmocka_unit_test(test_allreduce),
        cmocka_unit_test(test_broadcast),
        cmocka_unit_test(test_bf16_socket),
        cmocka_unit_test(test_queued_and_barrier),
        cmocka_unit_test(test_dead_peer),
        cmocka_unit_test(test_stalled_peer),
        cmocka_unit_test(test_stall_origin),
        cmocka_unit_test(test_out_of_step),
        cmocka_unit_test(test_rendezvous_any_order),
        cmocka_unit_test(test_store_strays),
        cmocka_unit_test(test_store_timeout_and_port_in_use),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
