/* net.c - comm's sockets: the listening socket, connects that retry until
 * a deadline (the peer may not be listening yet), and whole reads and
 * writes on non-blocking sockets that survive EINTR, partial transfers and
 * a vanished peer (MSG_NOSIGNAL: no SIGPIPE). */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../../common/util.h"
#include "comm_int.h"

#define NET_BUF_BYTES (4 << 20) /* socket buffers: a few chunks in flight */
#define NET_RETRY_MS 20         /* between connect attempts */

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

static int set_nonblock_cloexec(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
        return -1;
    int fd_fl = fcntl(fd, F_GETFD);
    if (fd_fl < 0 || fcntl(fd, F_SETFD, fd_fl | FD_CLOEXEC) < 0)
        return -1;
    return 0;
}

int comm_net_tune(int fd)
{
    int one = 1, sz = NET_BUF_BYTES;
    if (set_nonblock_cloexec(fd) < 0)
        return -1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0)
        return -1;
    /* capped by net.core.[rw]mem_max; a smaller buffer is not an error */
    (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
    (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
    return 0;
}

int comm_listen(const char *bind_addr, int port, int *bound_port, char err[ERR_MAX])
{
    if (port < 0 || port > 65535) {
        snprintf(err, ERR_MAX, "port %d out of range", port);
        return -1;
    }
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    /* NULL: the IPv6 wildcard, dual stack, so IPv4 and IPv6 peers both reach us */
    hints.ai_family = bind_addr ? AF_UNSPEC : AF_INET6;
    int gai = getaddrinfo(bind_addr, service, &hints, &res);
    if (gai != 0 && !bind_addr) {
        hints.ai_family = AF_INET;
        gai = getaddrinfo(NULL, service, &hints, &res);
    }
    if (gai != 0) {
        snprintf(err, ERR_MAX, "cannot resolve %.80s: %s", bind_addr ? bind_addr : "*", gai_strerror(gai));
        return -1;
    }
    int fd = -1, saved = 0;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            saved = errno;
            continue;
        }
        int one = 1, zero = 0;
        (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (a->ai_family == AF_INET6 && !bind_addr)
            (void)setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, COMM_MAX_RANKS * 2) == 0 &&
            set_nonblock_cloexec(fd) == 0)
            break;
        saved = errno;
        close(fd);
        fd = -1;
    }
    if (fd < 0) {
        snprintf(err, ERR_MAX, "cannot listen on %.80s:%d: %s", bind_addr ? bind_addr : "*", port,
                 strerror(saved ? saved : EADDRNOTAVAIL));
        freeaddrinfo(res);
        return -1;
    }
    freeaddrinfo(res);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0) {
        snprintf(err, ERR_MAX, "getsockname: %s", strerror(errno));
        close(fd);
        return -1;
    }
    int p = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                     : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    if (bound_port)
        *bound_port = p;
    return fd;
}

/* One connect attempt to one address, bounded by deadline. 0 = connected. */
static int connect_one(int fd, const struct addrinfo *a, int64_t deadline)
{
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0)
        return 0;
    if (errno != EINPROGRESS && errno != EINTR)
        return -1;
    for (;;) {
        int64_t left = deadline - mono_ms();
        if (left <= 0) {
            errno = ETIMEDOUT;
            return -1;
        }
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int r = poll(&p, 1, left > 100 ? 100 : (int)left);
        if (r < 0 && errno != EINTR)
            return -1;
        if (r > 0) {
            int soerr = 0;
            socklen_t sl = sizeof soerr;
            if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0)
                return -1;
            if (soerr) {
                errno = soerr;
                return -1;
            }
            return 0;
        }
    }
}

int comm_net_connect(const char *addr, int port, int64_t deadline, char *err, size_t errlen)
{
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    const char *why = "no attempt";
    char whybuf[128];
    for (;;) {
        struct addrinfo hints, *res = NULL;
        memset(&hints, 0, sizeof hints);
        hints.ai_socktype = SOCK_STREAM;
        hints.ai_flags = AI_NUMERICSERV;
        int gai = getaddrinfo(addr, service, &hints, &res);
        if (gai != 0) {
            snprintf(whybuf, sizeof whybuf, "cannot resolve: %s", gai_strerror(gai));
            why = whybuf;
        } else {
            for (struct addrinfo *a = res; a; a = a->ai_next) {
                int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
                if (fd < 0) {
                    snprintf(whybuf, sizeof whybuf, "socket: %s", strerror(errno));
                    why = whybuf;
                    continue;
                }
                if (connect_one(fd, a, deadline) == 0) {
                    if (comm_net_tune(fd) == 0) {
                        freeaddrinfo(res);
                        return fd;
                    }
                }
                snprintf(whybuf, sizeof whybuf, "%s", strerror(errno));
                why = whybuf;
                close(fd);
            }
            freeaddrinfo(res);
        }
        if (mono_ms() + NET_RETRY_MS >= deadline)
            break;
        sleep_ms(NET_RETRY_MS);
    }
    snprintf(err, errlen, "cannot connect to %.80s:%d before the timeout (%s)", addr, port, why);
    return -1;
}

/* Waits for fd to be ready for ev until deadline. 0, or -1 with errno. */
static int wait_fd(int fd, short ev, int64_t deadline)
{
    for (;;) {
        int64_t left = deadline - mono_ms();
        if (left <= 0) {
            errno = ETIMEDOUT;
            return -1;
        }
        struct pollfd p = {.fd = fd, .events = ev};
        int r = poll(&p, 1, left > 1000 ? 1000 : (int)left);
        if (r < 0 && errno != EINTR)
            return -1;
        if (r > 0)
            return 0; /* errors and hang-ups show in the read or write */
    }
}

int comm_net_write_all(int fd, const void *p, size_t len, int64_t deadline)
{
    const char *s = p;
    while (len > 0) {
        ssize_t w = send(fd, s, len, MSG_NOSIGNAL);
        if (w > 0) {
            s += w;
            len -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (wait_fd(fd, POLLOUT, deadline) < 0)
                return -1;
            continue;
        }
        if (w == 0)
            errno = EPIPE;
        return -1;
    }
    return 0;
}

int comm_net_read_all(int fd, void *p, size_t len, int64_t deadline)
{
    char *d = p;
    while (len > 0) {
        ssize_t r = recv(fd, d, len, 0);
        if (r > 0) {
            d += r;
            len -= (size_t)r;
            continue;
        }
        if (r == 0) {
            errno = EPIPE;
            return -1;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            if (wait_fd(fd, POLLIN, deadline) < 0)
                return -1;
            continue;
        }
        return -1;
    }
    return 0;
}
