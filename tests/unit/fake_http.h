/* fake_http.h - a tiny scripted HTTP server on loopback for the Kubernetes client tests.
 *
 * The server answers one connection per step of a script, in order: it checks the request line
 * against the step's method and path, records the request, and answers with the step's status
 * and body (optionally in small pieces with a pause between, as a watch stream arrives), or
 * drops the connection without answering. Every answer says "Connection: close", so each request
 * is a new connection and the order is exact. When the script is done the listening socket is
 * closed: a request beyond it is refused at once instead of hanging. Deterministic and fast. */
#ifndef CEPHALO_FAKE_HTTP_H
#define CEPHALO_FAKE_HTTP_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define FAKE_MAX_STEPS 24

typedef struct fake_step {
    const char *method;
    const char *path; /* the exact path and query expected */
    int status; /* 0: close the connection without an answer */
    const char *body;
    size_t piece; /* > 0: send the body in pieces of this size, 2 ms apart */
    bool stream; /* no Content-Length: the body ends when the connection closes (a watch) */
} fake_step;

typedef struct fake_server {
    int lfd, port;
    pthread_t thread;
    const fake_step *steps;
    int n_steps, served;
    char head[FAKE_MAX_STEPS][4096]; /* request line and headers */
    char body[FAKE_MAX_STEPS][8192];
    char mismatch[4096]; /* the first difference from the script, or "" */
} fake_server;

static inline void fake_sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static inline bool fake_send(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0) return false;
        p += w, n -= (size_t)w;
    }
    return true;
}

/* Reads the request head and its Content-Length body. */
static inline bool fake_read_request(int fd, char *head, size_t headsz, char *body,
                                     size_t bodysz) {
    char buf[16384];
    size_t len = 0;
    char *end = NULL;
    while (!end) {
        struct pollfd pf = {fd, POLLIN, 0};
        if (poll(&pf, 1, 5000) <= 0 || len == sizeof buf - 1) return false;
        ssize_t r = recv(fd, buf + len, sizeof buf - 1 - len, 0);
        if (r <= 0) return false;
        len += (size_t)r;
        buf[len] = '\0';
        end = strstr(buf, "\r\n\r\n");
    }
    size_t hl = (size_t)(end - buf);
    snprintf(head, headsz, "%.*s", (int)hl, buf);
    size_t have = len - hl - 4, want = 0;
    const char *cl = strstr(head, "\r\nContent-Length:");
    if (cl) want = strtoul(cl + 17, NULL, 10);
    char *b = malloc(want + 1);
    memcpy(b, end + 4, have < want ? have : want);
    while (have < want) {
        ssize_t r = recv(fd, b + have, want - have, 0);
        if (r <= 0) break;
        have += (size_t)r;
    }
    b[have < want ? have : want] = '\0';
    snprintf(body, bodysz, "%s", b);
    free(b);
    return true;
}

static inline void *fake_main(void *arg) {
    fake_server *s = arg;
    for (int i = 0; i < s->n_steps; i++) {
        const fake_step *st = &s->steps[i];
        struct pollfd pf = {s->lfd, POLLIN, 0};
        if (poll(&pf, 1, 5000) <= 0) {
            if (!s->mismatch[0])
                snprintf(s->mismatch, sizeof s->mismatch, "step %d (%s %s): no request came", i,
                         st->method, st->path ? st->path : "...");
            break;
        }
        int fd = accept(s->lfd, NULL, NULL);
        if (fd < 0) break;
        if (!fake_read_request(fd, s->head[i], sizeof s->head[i], s->body[i], sizeof s->body[i])) {
            close(fd);
            i--; /* a connection that sent nothing (a probe): wait for the real request */
            continue;
        }
        /* path NULL: any path (the test checks it itself); as long as the script's path is */
        size_t wn = strlen(st->method) + (st->path ? strlen(st->path) : 0) + 16;
        char *want = malloc(wn);
        snprintf(want, wn, "%s %s%s", st->method, st->path ? st->path : "", st->path ? " HTTP/1.1" : "");
        size_t line = strcspn(s->head[i], "\r");
        bool same = st->path ? strlen(want) == line && strncmp(s->head[i], want, line) == 0
                             : strncmp(s->head[i], want, strlen(want)) == 0;
        if (!same && !s->mismatch[0])
            snprintf(s->mismatch, sizeof s->mismatch, "step %d: expected '%.1000s', got '%.*s'", i,
                     want, (int)line, s->head[i]);
        free(want);
        s->served = i + 1;
        if (st->status == 0) {
            close(fd);
            continue;
        }
        size_t blen = st->body ? strlen(st->body) : 0;
        char hdr[512];
        if (st->stream)
            snprintf(hdr, sizeof hdr,
                     "HTTP/1.1 %d X\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n",
                     st->status);
        else
            snprintf(hdr, sizeof hdr,
                     "HTTP/1.1 %d X\r\nContent-Type: application/json\r\nConnection: close\r\n"
                     "Content-Length: %zu\r\n\r\n",
                     st->status, blen);
        bool ok = fake_send(fd, hdr, strlen(hdr));
        for (size_t off = 0; ok && off < blen;) {
            size_t n = st->piece ? st->piece : blen;
            if (n > blen - off) n = blen - off;
            ok = fake_send(fd, st->body + off, n);
            off += n;
            if (st->piece) fake_sleep_ms(2);
        }
        shutdown(fd, SHUT_WR);
        close(fd);
    }
    close(s->lfd); /* later requests are refused at once */
    s->lfd = -1;
    return NULL;
}

/* Starts serving `steps` on 127.0.0.1 (an ephemeral port, in s->port). */
static inline int fake_start(fake_server *s, const fake_step *steps, int n) {
    memset(s, 0, sizeof *s);
    if (n > FAKE_MAX_STEPS) return -1;
    s->steps = steps;
    s->n_steps = n;
    s->lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    if (s->lfd < 0 || bind(s->lfd, (struct sockaddr *)&a, sizeof a) != 0 ||
        listen(s->lfd, 16) != 0 || getsockname(s->lfd, (struct sockaddr *)&a, &al) != 0)
        return -1;
    s->port = ntohs(a.sin_port);
    return pthread_create(&s->thread, NULL, fake_main, s) == 0 ? 0 : -1;
}

/* Waits for the script to end; returns the number of steps served. */
static inline int fake_join(fake_server *s) {
    pthread_join(s->thread, NULL);
    return s->served;
}

#endif
