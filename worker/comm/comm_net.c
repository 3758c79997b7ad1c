/* comm_net.c - TCP helpers of the comm layer: monotonic deadlines, connect with retry, whole
 * reads and writes bounded by a deadline, socket tuning, address strings.
 *
 * Every fd here is non-blocking and every wait is a poll() with the time left, so no call can
 * block past its deadline. Sends use MSG_NOSIGNAL: a peer that died must produce an error
 * (EPIPE), not a SIGPIPE that kills this process. */
#include "comm/comm_internal.h"
#include "common/clock.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int net_ms_left(double deadline) {
    double ms = (deadline - clock_now_s()) * 1e3;
    if (ms <= 0) return 0;
    return ms > 1e9 ? 1000000000 : (int)ms + 1; /* round up: never wake just before it */
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

void net_set_nonblocking(int fd) {
    int fl = fcntl(fd, F_GETFL, 0);
    if (fl >= 0) fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* Whether the kernel grants socket buffers of `want` bytes (Linux caps them at
 * net.core.rmem_max / wmem_max and reports twice the size granted), tried on a spare socket. */
static bool buffers_granted(int family, int want) {
    int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0), ok = 0;
    if (fd < 0) return false;
    for (int opt = 0; opt < 2; opt++) {
        int name = opt ? SO_RCVBUF : SO_SNDBUF, got = 0;
        socklen_t len = sizeof got;
        if (setsockopt(fd, SOL_SOCKET, name, &want, sizeof want) == 0 &&
            getsockopt(fd, SOL_SOCKET, name, &got, &len) == 0 && got >= want)
            ok++;
    }
    close(fd);
    return ok == 2;
}

void net_tune(int fd) {
    int one = 1, buf = NET_SOCKET_BUFFER;
    /* Best effort: a refused option costs speed, not correctness. */
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    /* Setting a buffer size turns Linux's autotuning off for the socket: where the cap would
     * shrink the request (stock kernels cap at ~208 KiB), autotuning does better. */
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (buf <= 0 || getsockname(fd, (struct sockaddr *)&ss, &len) < 0 || !buffers_granted(ss.ss_family, buf)) return;
    (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
}

void net_addr_str(const struct sockaddr *sa, char *buf, size_t n) {
    char host[128], port[16];
    socklen_t len = sa->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
    if (getnameinfo(sa, len, host, sizeof host, port, sizeof port, NI_NUMERICHOST | NI_NUMERICSERV)) {
        snprintf(buf, n, "?");
        return;
    }
    snprintf(buf, n, sa->sa_family == AF_INET6 ? "[%s]:%s" : "%s:%s", host, port);
}

bool net_split_hostport(const char *s, char *host, size_t hostsz, int *port) {
    const char *colon, *h = s;
    size_t hl;
    if (s[0] == '[') {
        const char *close = strchr(s, ']');
        if (!close || close[1] != ':') return false;
        h = s + 1, hl = (size_t)(close - h), colon = close + 1;
    } else {
        colon = strrchr(s, ':');
        if (!colon) return false;
        hl = (size_t)(colon - s);
    }
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (hl == 0 || hl >= hostsz || *end || end == colon + 1 || p < 1 || p > 65535) return false;
    memcpy(host, h, hl);
    host[hl] = '\0';
    *port = (int)p;
    return true;
}

const char *net_strerror(int errnum) {
    if (errnum == ECONNRESET || errnum == EPIPE) return "closed the connection";
    if (errnum == ETIMEDOUT) return "timeout";
    return strerror(errnum);
}

/* ------------------------------------------------------------------------------------------ */
/* connect                                                                                     */

/* One non-blocking connect to one address, waiting at most until `until`. fd, or -1 with errno. */
static int connect_one(const struct addrinfo *ai, double until) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) return -1;
    net_set_nonblocking(fd);
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) return fd;
    int e = errno;
    if (e == EINPROGRESS) {
        struct pollfd p = {fd, POLLOUT, 0};
        int n;
        while ((n = poll(&p, 1, net_ms_left(until))) < 0 && errno == EINTR) {
        }
        socklen_t len = sizeof e;
        if (n == 0) e = ETIMEDOUT;
        else if (n < 0) e = errno;
        else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) < 0) e = errno;
        if (e == 0) return fd;
    }
    close(fd);
    errno = e;
    return -1;
}

int net_connect(const char *host, int port, double deadline, err_t *err) {
    char service[16], why[256] = "no attempt";
    snprintf(service, sizeof service, "%d", port);
    double start = clock_now_s(), backoff = 0.01;
    for (;;) {
        struct addrinfo hints = {0}, *res = NULL;
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        int g = getaddrinfo(host, service, &hints, &res);
        if (g) {
            snprintf(why, sizeof why, "%s", g == EAI_SYSTEM ? strerror(errno) : gai_strerror(g));
        } else {
            for (const struct addrinfo *ai = res; ai; ai = ai->ai_next) {
                /* A SYN to a host that is not up yet can hang: give each attempt a few seconds
                 * so a peer that comes up meanwhile is found by the next one. */
                double until = clock_now_s() + 3.0;
                int fd = connect_one(ai, until < deadline ? until : deadline);
                if (fd >= 0) {
                    freeaddrinfo(res);
                    return fd;
                }
                snprintf(why, sizeof why, "%s", strerror(errno));
            }
            freeaddrinfo(res);
        }
        double left = deadline - clock_now_s();
        if (left <= 0) break;
        sleep_s(backoff < left ? backoff : left);
        backoff = backoff * 2 > 0.25 ? 0.25 : backoff * 2;
    }
    return err_set(err, "cannot connect to %s:%d for %.3g s: %s", host, port, deadline - start, why);
}

/* ------------------------------------------------------------------------------------------ */
/* whole reads and writes                                                                      */

static int wait_fd(int fd, short events, double deadline) {
    struct pollfd p = {fd, events, 0};
    for (;;) {
        int n = poll(&p, 1, net_ms_left(deadline));
        if (n > 0) return 0;
        if (n == 0) return errno = ETIMEDOUT, -1;
        if (errno != EINTR) return -1;
    }
}

int net_write_all(int fd, const void *p, size_t n, double deadline) {
    const uint8_t *b = p;
    while (n > 0) {
        ssize_t k = send(fd, b, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0) {
            b += k, n -= (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return -1;
        if (wait_fd(fd, POLLOUT, deadline) < 0) return -1;
    }
    return 0;
}

int net_read_all(int fd, void *p, size_t n, double deadline) {
    uint8_t *b = p;
    while (n > 0) {
        ssize_t k = recv(fd, b, n, MSG_DONTWAIT);
        if (k > 0) {
            b += k, n -= (size_t)k;
            continue;
        }
        if (k == 0) return errno = ECONNRESET, -1;
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
        if (wait_fd(fd, POLLIN, deadline) < 0) return -1;
    }
    return 0;
}
