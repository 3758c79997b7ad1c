/* bench_comm.c - loopback throughput of the socket backend's collectives: ranks are threads of
 * this process, each with its own communicator on 127.0.0.1.
 *
 *   bench_comm [MiB] [ranks...]      default: 64 MiB, ranks 2 3 4
 *
 * For each world size it times allgatherv, reduce-scatterv and allreduce of a float buffer of
 * MiB in all (split evenly), and prints the time per operation, the algorithm bandwidth
 * (buffer bytes / time) and the bus bandwidth (what each rank sends / time: (n-1)/n of the
 * buffer per ring pass, two passes for allreduce), the figure to compare with the link. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"

#define ITERS 5

typedef struct rank_arg {
    int rank, world, port;
    int64_t floats;
    double secs[3]; /* per op: allgatherv, reduce-scatterv, allreduce */
    char err[1100];
} rank_arg;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0 || getsockname(fd, (struct sockaddr *)&a, &len) < 0) return 29500;
    close(fd);
    return ntohs(a.sin_port);
}

static comm_req *issue(comm *c, int op, float *buf, const int64_t *counts, int64_t n) {
    if (op == 0) return comm_allgatherv(c, buf, counts, COMM_F32, "bench");
    if (op == 1) return comm_reduce_scatterv(c, buf, counts, COMM_F32, "bench");
    return comm_allreduce(c, buf, n, COMM_F32, "bench");
}

static void *rank_main(void *p) {
    rank_arg *a = p;
    comm_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.rank = a->rank, cfg.world = a->world, cfg.master_port = a->port, cfg.timeout_s = 60;
    snprintf(cfg.master_addr, sizeof cfg.master_addr, "127.0.0.1");
    snprintf(cfg.backend, sizeof cfg.backend, "socket");
    err_t err = {{0}};
    comm *c = comm_open(&cfg, &err);
    if (!c) {
        snprintf(a->err, sizeof a->err, "%s", err.msg);
        return NULL;
    }
    int64_t counts[64];
    for (int i = 0; i < a->world; i++) counts[i] = a->floats / a->world + (i < a->floats % a->world);
    float *buf = malloc((size_t)a->floats * sizeof *buf);
    for (int64_t i = 0; i < a->floats; i++) buf[i] = (float)(i % 13);
    for (int op = 0; op < 3 && !a->err[0]; op++) {
        if (comm_run(c, issue(c, op, buf, counts, a->floats), &err) < 0) break; /* warm-up */
        if (comm_run(c, comm_barrier(c, "bench"), &err) < 0) break;
        double t0 = now_s();
        for (int it = 0; it < ITERS; it++)
            if (comm_run(c, issue(c, op, buf, counts, a->floats), &err) < 0) break;
        a->secs[op] = (now_s() - t0) / ITERS;
        if (err.msg[0]) snprintf(a->err, sizeof a->err, "%s", err.msg);
    }
    if (err.msg[0] && !a->err[0]) snprintf(a->err, sizeof a->err, "%s", err.msg);
    free(buf);
    comm_close(c);
    return NULL;
}

static void bench_world(int world, double mib) {
    pthread_t t[64];
    rank_arg a[64];
    int port = free_port();
    for (int r = 0; r < world; r++) {
        a[r] = (rank_arg){.rank = r, .world = world, .port = port, .floats = (int64_t)(mib * 1048576 / 4)};
        pthread_create(&t[r], NULL, rank_main, &a[r]);
    }
    for (int r = 0; r < world; r++) pthread_join(t[r], NULL);
    for (int r = 0; r < world; r++)
        if (a[r].err[0]) {
            fprintf(stderr, "world %d: %s\n", world, a[r].err);
            return;
        }
    const char *names[] = {"allgatherv", "reduce-scatterv", "allreduce"};
    for (int op = 0; op < 3; op++) {
        double s = 0;
        for (int r = 0; r < world; r++) s = a[r].secs[op] > s ? a[r].secs[op] : s;
        double bytes = mib * 1048576, passes = op == 2 ? 2 : 1;
        printf("%-16s %d ranks  %7.1f MiB  %8.1f ms  algbw %7.2f GB/s  busbw %7.2f GB/s\n", names[op], world, mib,
               s * 1e3, bytes / s / 1e9, bytes * passes * (world - 1) / world / s / 1e9);
    }
}

int main(int argc, char **argv) {
    double mib = argc > 1 ? atof(argv[1]) : 64;
    if (argc > 2)
        for (int i = 2; i < argc; i++) bench_world(atoi(argv[i]), mib);
    else
        for (int w = 2; w <= 4; w++) bench_world(w, mib);
    return 0;
}
