/* proxy.c - the reverse proxy: a relay thread per proxied request. See
 * proxy.h.
 *
 * A request's life: proxy_forward (on the pool thread) writes the head to
 * send up from the request, copies the body, defers the request and starts
 * the relay thread. The thread connects, sends, reads the response head
 * and resumes the request with a response of its own making (http_res.raw):
 *   - a body: a stream whose reader (on the pool thread) takes what the
 *     thread put in the relay's buffer, or parks the request until the
 *     thread wakes it (HTTP_WAKE_STREAM, the relay's id); the thread reads
 *     the upstream, undoing its chunked coding, and waits while the buffer
 *     is full;
 *   - a WebSocket: a 101; once libmicrohttpd hands the client's socket over
 *     (http_upgrade_ops.start) the thread moves bytes both ways with poll.
 * Lifetime: the relay is counted (refs): the thread, the stream's response
 * (until its free callback) and the upgrade (until start(NULL) or the
 * thread's http_upgrade_close). The thread calls http_wake only while the
 * response is alive, and the response's free waits for a wake in flight,
 * so no wake reaches a stopped daemon. No http.c function is called with a
 * relay's lock held. */
#include "proxy.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define RING_CAP (64 * 1024)          /* the response body held at most */
#define IO_CHUNK (16 * 1024)          /* one read from the upstream; a WebSocket's buffer each way */
#define HEAD_OUT_MAX (64 * 1024)      /* the request head sent up */
#define SLICE_MS 250                  /* how often a wait before the answer looks at http_stopping */
#define PARK_MS 60000                 /* a stream reader with nothing to send parks this long at most */
#define RELAY_STACK (256 * 1024)
#define MAX_CONN_TOKENS 8

static int g_http_live, g_ws_live, g_live;
static uint64_t g_requests, g_bad_gateway;
static int64_t g_next_id;

void proxy_stats_get(proxy_stats *out) {
    out->http = __atomic_load_n(&g_http_live, __ATOMIC_RELAXED);
    out->websocket = __atomic_load_n(&g_ws_live, __ATOMIC_RELAXED);
    out->requests = __atomic_load_n(&g_requests, __ATOMIC_RELAXED);
    out->bad_gateway = __atomic_load_n(&g_bad_gateway, __ATOMIC_RELAXED);
}

typedef struct relay {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    int64_t id;                       /* its wake id (HTTP_WAKE_STREAM) */
    struct http_daemon *daemon;
    http_req *req;                    /* the thread's until it resumes it; then the reader's */
    char host[256];
    int port;
    char *head;                       /* the request head to send up, and the body */
    size_t head_len;
    char *body;
    size_t body_len;
    int ws;                           /* a WebSocket handshake */
    int is_head;                      /* a HEAD request: no body comes back */
    int header_timeout_ms;
    void (*activity)(void *cls);
    void *activity_cls;
    int64_t last_activity;            /* mono ms of the last call (atomic) */
    int up;                           /* the upstream socket, or -1 (under mu once the answer went out) */
    /* the response body, upstream to reader */
    char *ring;
    size_t off, len;
    int done, failed;                 /* the body ended (failed: cut short) */
    int attached;                     /* the stream's response is alive */
    int waiting;                      /* its reader parked for data */
    int wakes;                        /* http_wake calls in flight */
    /* WebSocket */
    int started;                      /* 0: not yet; 1: the client's socket is here; -1: never */
    int stopping;                     /* the daemon stops */
    http_upgrade *u;
    int client;
    char *extra;                      /* what the client sent past its request */
    size_t extra_len;
    struct relay *next;               /* the queue of relays for idle threads */
} relay;

static void relay_release(relay *r) {
    pthread_mutex_lock(&r->mu);
    int left = --r->refs;
    pthread_mutex_unlock(&r->mu);
    if (left) return;
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r->head);
    free(r->body);
    free(r->ring);
    free(r->extra);
    free(r);
}

static void relay_hold(relay *r) {
    pthread_mutex_lock(&r->mu);
    r->refs++;
    pthread_mutex_unlock(&r->mu);
}

/* The caller's hook, at most once a second. */
static void activity(relay *r) {
    if (!r->activity) return;
    int64_t now = mono_ms(), last = __atomic_load_n(&r->last_activity, __ATOMIC_RELAXED);
    if (now - last < 1000) return;
    if (!__atomic_compare_exchange_n(&r->last_activity, &last, now, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return;
    r->activity(r->activity_cls);
}

/* ---------------------------------------------------------------- headers */

static int name_is(const char *name, size_t n, const char *want) {
    return strlen(want) == n && strncasecmp(name, want, n) == 0;
}

/* 1 for a hop-by-hop header (RFC 9110 7.6.1) or one the Connection header
 * named (tokens). */
static int hop_by_hop(const char *name, size_t n, char tokens[][64], int ntokens) {
    static const char *const hop[] = {"Connection", "Keep-Alive", "Transfer-Encoding", "Upgrade",
                                      "TE",         "Trailer",    "Trailers"};
    for (size_t i = 0; i < sizeof hop / sizeof hop[0]; i++)
        if (name_is(name, n, hop[i])) return 1;
    if (n >= 6 && strncasecmp(name, "Proxy-", 6) == 0) return 1;
    for (int i = 0; i < ntokens; i++)
        if (name_is(name, n, tokens[i])) return 1;
    return 0;
}

/* The comma-separated tokens of a Connection value, appended to tokens. */
static void connection_tokens(const char *v, char tokens[][64], int *ntokens) {
    while (v && *v && *ntokens < MAX_CONN_TOKENS) {
        while (*v == ' ' || *v == '\t' || *v == ',') v++;
        size_t n = strcspn(v, ", \t");
        if (n > 0 && n < 64) {
            memcpy(tokens[*ntokens], v, n);
            tokens[*ntokens][n] = '\0';
            (*ntokens)++;
        }
        v += n;
    }
}

/* 1 when the comma-separated list v holds token (any case). */
static int has_token(const char *v, const char *token) {
    size_t tl = strlen(token);
    while (v && *v) {
        while (*v == ' ' || *v == '\t' || *v == ',') v++;
        size_t n = strcspn(v, ",");
        size_t m = n;
        while (m > 0 && (v[m - 1] == ' ' || v[m - 1] == '\t')) m--;
        if (m == tl && strncasecmp(v, token, tl) == 0) return 1;
        v += n;
    }
    return 0;
}

typedef struct head_ctx {
    buf *out;
    const proxy_target *t;
    char tokens[MAX_CONN_TOKENS][64];
    int ntokens;
    int bad;
} head_ctx;

static int cookie_is(const char *v, size_t n, const char *name) {
    size_t sl = strlen(name);
    return n > sl && strncmp(v, name, sl) == 0 && (v[sl] == '=' || v[sl] == ' ');
}

/* Ours: the daemon's cookies (the session's, a grant's) and a token
 * offered as a WebSocket subprotocol; never the app's. */
static int cookie_ours(const char *v, size_t n) {
    return cookie_is(v, n, HTTP_SESSION_COOKIE) || cookie_is(v, n, HTTP_GRANT_COOKIE);
}
static int subprotocol_ours(const char *v, size_t n) {
    return n >= strlen(HTTP_WS_BEARER) && strncmp(v, HTTP_WS_BEARER, strlen(HTTP_WS_BEARER)) == 0;
}

/* The header's list (items split at sep, joined again with sep and a
 * space) less the items ours() says are the daemon's, appended as a header
 * (nothing when no item is left). */
static void list_rewrite(head_ctx *c, const char *key, const char *value, char sep,
                         int (*ours)(const char *, size_t)) {
    char kept[HTTP_HEADERS_MAX];
    size_t used = 0;
    char stops[3] = {sep, sep == ',' ? ' ' : '\0', '\0'};
    for (const char *v = value; *v;) {
        while (*v == ' ' || *v == sep) v++;
        size_t n = strcspn(v, stops);
        if (n == 0) break;
        if (!ours(v, n) && used + n + 2 < sizeof kept) {
            if (used) {
                kept[used++] = sep;
                kept[used++] = ' ';
            }
            memcpy(kept + used, v, n);
            used += n;
        }
        v += n;
    }
    kept[used] = '\0';
    if (used && buf_printf(c->out, "%s: %s\r\n", key, kept) < 0) c->bad = 1;
}

static enum MHD_Result head_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    head_ctx *c = cls;
    if (!key || !value) return MHD_YES;
    size_t n = strlen(key);
    static const char *const never[] = {"Host", "Content-Length", "Expect", "Authorization", HTTP_CSRF_HEADER,
                                        HTTP_TEAM_HEADER, "Forwarded"};
    for (size_t i = 0; i < sizeof never / sizeof never[0]; i++)
        if (name_is(key, n, never[i])) return MHD_YES;
    if (n >= 12 && strncasecmp(key, "X-Forwarded-", 12) == 0) return MHD_YES;
    if (hop_by_hop(key, n, c->tokens, c->ntokens)) return MHD_YES;
    for (const char *const *d = c->t->drop; d && *d; d++)
        if (name_is(key, n, *d)) return MHD_YES;
    for (const char *const *a = c->t->add; a && *a; a++) {
        const char *colon = strchr(*a, ':');
        if (colon && (size_t)(colon - *a) == n && strncasecmp(*a, key, n) == 0) return MHD_YES;
    }
    if (name_is(key, n, "Cookie")) {
        list_rewrite(c, key, value, ';', cookie_ours);
        return MHD_YES;
    }
    if (name_is(key, n, "Sec-WebSocket-Protocol")) {
        list_rewrite(c, key, value, ',', subprotocol_ours);
        return MHD_YES;
    }
    if (buf_printf(c->out, "%s: %s\r\n", key, value) < 0) c->bad = 1;
    return MHD_YES;
}

static enum MHD_Result conn_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    head_ctx *c = cls;
    if (key && value && strcasecmp(key, "Connection") == 0) connection_tokens(value, c->tokens, &c->ntokens);
    return MHD_YES;
}

/* 1 for "Name: value" on one line, with a token for a name. */
static int header_ok(const char *h) {
    const char *colon = strchr(h, ':');
    if (!colon || colon == h) return 0;
    for (const char *p = h; p < colon; p++)
        if (!isalnum((unsigned char)*p) && !strchr("!#$%&'*+-.^_`|~", *p)) return 0;
    for (const char *p = colon; *p; p++)
        if (*p == '\r' || *p == '\n' || *p == '\0') return 0;
    return 1;
}

/* The request head to send up; 0, or -1 with the error answered. */
static int build_head(http_req *req, http_res *res, const proxy_target *t, int ws, buf *out) {
    const char *target = t->target ? t->target : req->raw_target ? req->raw_target : req->path;
    for (const char *p = target; *p; p++)
        if ((unsigned char)*p <= 0x20 || *p == 0x7f) {
            http_error(res, 500, "internal", NULL, "the proxy's request target holds a space or a control character");
            return -1;
        }
    head_ctx c = {.out = out, .t = t};
    MHD_get_connection_values(req->conn, MHD_HEADER_KIND, conn_header, &c);
    int rc = buf_printf(out, "%s %s HTTP/1.1\r\n", req->method, target[0] ? target : "/");
    if (rc == 0)
        rc = strchr(t->host, ':') ? buf_printf(out, "Host: [%s]:%d\r\n", t->host, t->port)
                                  : buf_printf(out, "Host: %s:%d\r\n", t->host, t->port);
    if (rc == 0) MHD_get_connection_values(req->conn, MHD_HEADER_KIND, head_header, &c);
    char addr[64];
    http_client_addr(req, addr, sizeof addr);
    const char *host = http_header(req, "Host");
    if (rc == 0) rc = buf_printf(out, "X-Forwarded-For: %s\r\nX-Forwarded-Proto: %s\r\n", addr,
                                 http_is_tls(req) ? "https" : "http");
    if (rc == 0 && host) rc = buf_printf(out, "X-Forwarded-Host: %s\r\n", host);
    if (rc == 0 && t->prefix) rc = buf_printf(out, "X-Forwarded-Prefix: %s\r\n", t->prefix);
    for (const char *const *a = t->add; rc == 0 && a && *a; a++) rc = buf_printf(out, "%s\r\n", *a);
    if (rc == 0 && ws) {
        const char *up = http_header(req, "Upgrade");
        rc = buf_printf(out, "Connection: Upgrade\r\nUpgrade: %s\r\n", up ? up : "websocket");
    } else if (rc == 0) {
        rc = buf_appends(out, "Connection: close\r\n");
    }
    int wants_body = strcmp(req->method, "POST") == 0 || strcmp(req->method, "PUT") == 0 ||
                     strcmp(req->method, "PATCH") == 0;
    if (rc == 0 && (req->body.len > 0 || wants_body)) rc = buf_printf(out, "Content-Length: %zu\r\n", req->body.len);
    if (rc == 0) rc = buf_appends(out, "\r\n");
    if (rc < 0 || c.bad) {
        http_error(res, 431, "headers_too_large", NULL, "the request's headers are too large to forward");
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- answers before the response */

static void answer_error(relay *r, int status, const char *code, const char *msg) {
    if (status == 502) __atomic_fetch_add(&g_bad_gateway, 1, __ATOMIC_RELAXED);
    http_res *a = http_res_new();
    http_error(a, status, code, NULL, "%s", msg);
    http_req *req = r->req;
    r->req = NULL;
    http_resume(req, a);
}

/* Waits for events on fd while the request is deferred, in slices that
 * look at http_stopping. 1: ready; 0: timed out; -2: the daemon stops. */
static int wait_fd(relay *r, int fd, short events, int timeout_ms) {
    int64_t end = mono_ms() + timeout_ms;
    for (;;) {
        if (http_stopping(r->req)) return -2;
        int64_t left = end - mono_ms();
        if (left <= 0) return 0;
        struct pollfd p = {fd, events, 0};
        int n = poll(&p, 1, (int)(left < SLICE_MS ? left : SLICE_MS));
        if (n > 0) return 1;
        if (n < 0 && errno != EINTR) return 1; /* the call that follows says what is wrong */
    }
}

static void lower_first(char *s) {
    if (s[0]) s[0] = (char)tolower((unsigned char)s[0]);
}

static void keepalive(int fd) {
    int on = 1, idle = 60, intvl = 10, cnt = 6;
    if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on) < 0 ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle) < 0 ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl) < 0 ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt) < 0)
        log_debug("proxy: cannot set TCP keepalive: %s", strerror(errno));
}

/* A non-blocking socket connected to the upstream, or -1 with why
 * (-2: the daemon stops). */
static int upstream_connect(relay *r, char *why, size_t cap) {
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    char port[16];
    snprintf(port, sizeof port, "%d", r->port);
    int g = getaddrinfo(r->host, port, &hints, &ai);
    if (g != 0) {
        snprintf(why, cap, "cannot resolve the upstream %s: %s", r->host, gai_strerror(g));
        return -1;
    }
    int fd = -1, err = 0;
    int64_t end = mono_ms() + PROXY_CONNECT_TIMEOUT_MS;
    for (struct addrinfo *a = ai; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
        if (errno != EINPROGRESS) {
            err = errno;
            close(fd);
            fd = -1;
            continue;
        }
        int64_t left = end - mono_ms();
        int w = wait_fd(r, fd, POLLOUT, left > 0 ? (int)left : 0);
        if (w == -2) {
            close(fd);
            freeaddrinfo(ai);
            return -2;
        }
        socklen_t el = sizeof err;
        if (w == 0) err = ETIMEDOUT;
        else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0) err = errno;
        if (err == 0) break;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    if (fd < 0) {
        char e[128];
        snprintf(e, sizeof e, "%s", err == ETIMEDOUT ? "no answer to connect within 5 s" : strerror(err));
        lower_first(e);
        snprintf(why, cap, "cannot reach the upstream %s:%d: %s", r->host, r->port, e);
        return -1;
    }
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0) log_debug("proxy: no TCP_NODELAY");
    keepalive(fd);
    return fd;
}

/* Sends all of p while the request is deferred: 0, -1 (why), -2 (stopping). */
static int send_all(relay *r, int fd, const char *p, size_t n, char *why, size_t cap) {
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int rc = wait_fd(r, fd, POLLOUT, r->header_timeout_ms);
            if (rc == -2) return -2;
            if (rc == 0) {
                snprintf(why, cap, "the upstream %s:%d took no more of the request within %d s", r->host, r->port,
                         r->header_timeout_ms / 1000);
                return -1;
            }
            continue;
        }
        char e[128];
        snprintf(e, sizeof e, "%s", strerror(errno));
        lower_first(e);
        snprintf(why, cap, "the upstream %s:%d: cannot send the request: %s", r->host, r->port, e);
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- the response head */

typedef struct resp_head {
    int status;
    char *lines[128];                 /* "Name: value" (into the head buffer) */
    int nlines;
    int chunked;
    int64_t length;                   /* Content-Length, or -1 */
    char tokens[MAX_CONN_TOKENS][64];
    int ntokens;
} resp_head;

/* Parses the head in h (NUL-terminated, CRLFs as NULs once parsed). 0 or -1. */
static int parse_head(char *h, resp_head *out) {
    memset(out, 0, sizeof *out);
    out->length = -1;
    char *save = NULL;
    char *line = strtok_r(h, "\n", &save);
    if (!line || strncmp(line, "HTTP/1.", 7) != 0 || strlen(line) < 12 || line[8] != ' ') return -1;
    if (!isdigit((unsigned char)line[9]) || !isdigit((unsigned char)line[10]) || !isdigit((unsigned char)line[11]))
        return -1;
    out->status = (line[9] - '0') * 100 + (line[10] - '0') * 10 + (line[11] - '0');
    if (out->status < 100) return -1;
    while ((line = strtok_r(NULL, "\n", &save)) != NULL) {
        size_t n = strlen(line);
        while (n && (line[n - 1] == '\r' || line[n - 1] == ' ' || line[n - 1] == '\t')) line[--n] = '\0';
        if (n == 0) continue;
        if (line[0] == ' ' || line[0] == '\t') return -1; /* obsolete line folding */
        char *colon = strchr(line, ':');
        if (!colon || colon == line) return -1;
        size_t nl = (size_t)(colon - line);
        const char *v = colon + 1;
        while (*v == ' ' || *v == '\t') v++;
        if (name_is(line, nl, "Transfer-Encoding") && has_token(v, "chunked")) out->chunked = 1;
        if (name_is(line, nl, "Content-Length")) {
            long len;
            if (parse_long(v, 0, LONG_MAX, &len) < 0) return -1;
            if (out->length >= 0 && out->length != len) return -1;
            out->length = len;
        }
        if (name_is(line, nl, "Connection")) connection_tokens(v, out->tokens, &out->ntokens);
        if (out->nlines < (int)(sizeof out->lines / sizeof out->lines[0])) out->lines[out->nlines++] = line;
    }
    return 0;
}

/* Adds the upstream's end-to-end headers to resp. */
static void copy_headers(struct MHD_Response *resp, resp_head *rh) {
    for (int i = 0; i < rh->nlines; i++) {
        char *line = rh->lines[i];
        char *colon = strchr(line, ':');
        size_t nl = (size_t)(colon - line);
        if (hop_by_hop(line, nl, rh->tokens, rh->ntokens) || name_is(line, nl, "Content-Length")) continue;
        *colon = '\0';
        const char *v = colon + 1;
        while (*v == ' ' || *v == '\t') v++;
        if (MHD_add_response_header(resp, line, v) != MHD_YES) log_debug("proxy: the upstream's header %s is not passed on", line);
        *colon = ':';
    }
}

/* ---------------------------------------------------------------- the body, upstream to client */

/* Wakes the reader when it waits; called with r->mu held, which it drops
 * and takes again around the wake. */
static void wake_reader(relay *r) {
    if (!r->waiting || !r->attached) return;
    r->waiting = 0;
    r->wakes++;
    pthread_mutex_unlock(&r->mu);
    http_wake(r->daemon, HTTP_WAKE_STREAM, r->id);
    pthread_mutex_lock(&r->mu);
    if (--r->wakes == 0) pthread_cond_broadcast(&r->cv);
}

/* Hands n bytes to the reader, waiting while the buffer is full. 0, or -1
 * when the response is gone (the client left). */
static int emit(relay *r, const char *p, size_t n) {
    while (n > 0) {
        pthread_mutex_lock(&r->mu);
        while (r->attached && r->len == RING_CAP) pthread_cond_wait(&r->cv, &r->mu);
        if (!r->attached) {
            pthread_mutex_unlock(&r->mu);
            return -1;
        }
        if (r->off + r->len == RING_CAP) { /* room only at the front */
            memmove(r->ring, r->ring + r->off, r->len);
            r->off = 0;
        }
        size_t k = RING_CAP - r->off - r->len;
        if (k > n) k = n;
        memcpy(r->ring + r->off + r->len, p, k);
        r->len += k;
        wake_reader(r);
        pthread_mutex_unlock(&r->mu);
        p += k;
        n -= k;
    }
    activity(r);
    return 0;
}

static void finish(relay *r, int failed) {
    pthread_mutex_lock(&r->mu);
    r->done = 1;
    r->failed = failed;
    wake_reader(r);
    pthread_mutex_unlock(&r->mu);
}

/* MHD's reader, on the pool thread. */
static ssize_t stream_read(void *cls, uint64_t pos, char *out, size_t max) {
    (void)pos;
    relay *r = cls;
    for (;;) {
        http_wait_watch(r->req, HTTP_WAKE_STREAM, r->id);
        pthread_mutex_lock(&r->mu);
        if (r->len > 0) {
            size_t n = r->len < max ? r->len : max;
            memcpy(out, r->ring + r->off, n);
            r->off += n;
            r->len -= n;
            if (r->len == 0) r->off = 0;
            pthread_cond_broadcast(&r->cv);
            pthread_mutex_unlock(&r->mu);
            return (ssize_t)n;
        }
        if (r->done) {
            int failed = r->failed;
            pthread_mutex_unlock(&r->mu);
            return failed ? MHD_CONTENT_READER_END_WITH_ERROR : MHD_CONTENT_READER_END_OF_STREAM;
        }
        r->waiting = 1;
        pthread_mutex_unlock(&r->mu);
        int p = http_stream_park(r->req, PARK_MS, HTTP_WAKE_STREAM, r->id);
        if (p == 0) return 0;
        if (p < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
}

static void stream_free(void *cls) {
    relay *r = cls;
    pthread_mutex_lock(&r->mu);
    r->attached = 0;
    if (r->up >= 0) shutdown(r->up, SHUT_RDWR); /* the thread's read ends */
    pthread_cond_broadcast(&r->cv);
    while (r->wakes > 0) pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
    relay_release(r);
}

/* The chunked coding, undone as bytes come. */
typedef struct dechunk {
    enum { CH_SIZE, CH_EXT, CH_DATA, CH_DATA_END, CH_TRAILER, CH_DONE } st;
    uint64_t left;
    int digits;
    size_t line;                      /* bytes of the trailer line so far */
} dechunk;

/* Feeds n bytes; emits the data. 0, 1 once the last chunk and trailer are
 * in, -1 on a malformed coding or a client gone. */
static int dechunk_feed(relay *r, dechunk *d, const char *p, size_t n) {
    size_t i = 0;
    while (i < n) {
        char c = p[i];
        switch (d->st) {
        case CH_SIZE:
            if (isxdigit((unsigned char)c)) {
                if (d->digits++ >= 15) return -1;
                d->left = d->left * 16 + (uint64_t)(isdigit((unsigned char)c) ? c - '0' : (tolower((unsigned char)c) - 'a' + 10));
                i++;
                break;
            }
            if (d->digits == 0) return -1;
            d->st = CH_EXT;
            break;
        case CH_EXT: /* chunk extensions, then CRLF */
            i++;
            if (c == '\n') {
                d->digits = 0;
                d->line = 0;
                d->st = d->left ? CH_DATA : CH_TRAILER;
            }
            break;
        case CH_DATA: {
            size_t k = n - i;
            if (k > d->left) k = (size_t)d->left;
            if (emit(r, p + i, k) < 0) return -1;
            i += k;
            d->left -= k;
            if (!d->left) d->st = CH_DATA_END;
            break;
        }
        case CH_DATA_END:
            i++;
            if (c == '\n') d->st = CH_SIZE;
            else if (c != '\r') return -1;
            break;
        case CH_TRAILER:
            i++;
            if (c == '\n') {
                if (d->line == 0) {
                    d->st = CH_DONE;
                    return 1;
                }
                d->line = 0;
            } else if (c != '\r') {
                d->line++;
            }
            break;
        case CH_DONE: return 1;
        }
    }
    return d->st == CH_DONE;
}

/* The body after the head: leftover bytes first, then the socket, as the
 * head framed it. Ends with finish(). */
static void pump_body(relay *r, int fd, const resp_head *rh, int nobody, const char *left, size_t left_len) {
    char *in = xmalloc(IO_CHUNK);
    dechunk d = {0};
    int64_t remain = rh->length;
    int rc = 0, end = nobody;
    const char *p = left;
    size_t n = left_len;
    while (!end) {
        if (n > 0) {
            if (rh->chunked) {
                rc = dechunk_feed(r, &d, p, n);
                if (rc != 0) break;
            } else {
                size_t k = n;
                if (remain >= 0 && (int64_t)k > remain) k = (size_t)remain;
                if (emit(r, p, k) < 0) {
                    rc = -1;
                    break;
                }
                if (remain >= 0) {
                    remain -= (int64_t)k;
                    if (remain == 0) break;
                }
            }
        } else if (!rh->chunked && remain == 0) {
            break;
        }
        struct pollfd pf = {fd, POLLIN, 0};
        if (poll(&pf, 1, -1) < 0 && errno != EINTR) {
            rc = -1;
            break;
        }
        ssize_t got = recv(fd, in, IO_CHUNK, 0);
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            n = 0;
            continue;
        }
        if (got <= 0) { /* the end: fine only for a body framed by it */
            rc = (got == 0 && !rh->chunked && remain < 0) ? 1 : -1;
            break;
        }
        p = in;
        n = (size_t)got;
    }
    free(in);
    finish(r, rc < 0);
}

/* The answer with the upstream's status, headers and a streamed body. */
static void answer_stream(relay *r, int fd, resp_head *rh, const char *left, size_t left_len) {
    int st = rh->status;
    int nobody = r->is_head || st < 200 || st == 204 || st == 304;
    uint64_t size = MHD_SIZE_UNKNOWN;
    if (nobody) size = (r->is_head && rh->length >= 0 && !rh->chunked) ? (uint64_t)rh->length : 0;
    else if (!rh->chunked && rh->length >= 0) size = (uint64_t)rh->length;
    if (st < 200) st = 502; /* an interim answer out of place (1xx other than a WebSocket's 101) */
    r->ring = xmalloc(RING_CAP);
    struct MHD_Response *resp = MHD_create_response_from_callback(size, IO_CHUNK, stream_read, r, stream_free);
    if (!resp) {
        answer_error(r, 502, "bad_gateway", "cannot make the response");
        return;
    }
    copy_headers(resp, rh);
    pthread_mutex_lock(&r->mu);
    r->attached = 1;
    r->refs++; /* the response's, until stream_free */
    pthread_mutex_unlock(&r->mu);
    http_res *a = http_res_new();
    a->status = st;
    a->raw = resp;
    http_req *req = r->req;
    /* the reader keeps r->req: the request lives as long as its response */
    http_resume(req, a);
    pump_body(r, fd, rh, nobody, left, left_len);
}

/* ---------------------------------------------------------------- WebSocket */

static void ws_start(void *cls, http_upgrade *u, int fd, const char *extra, size_t extra_len) {
    relay *r = cls;
    pthread_mutex_lock(&r->mu);
    if (u) {
        r->u = u;
        r->client = fd;
        if (extra_len) {
            r->extra = xmalloc(extra_len);
            memcpy(r->extra, extra, extra_len);
            r->extra_len = extra_len;
        }
        r->started = 1;
    } else {
        r->started = -1;
    }
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    if (!u) relay_release(r); /* the upgrade's hold: nothing more comes from it */
}

static void ws_stop(void *cls) {
    relay *r = cls;
    pthread_mutex_lock(&r->mu);
    r->stopping = 1;
    if (r->up >= 0) shutdown(r->up, SHUT_RDWR);
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static const http_upgrade_ops g_ws_ops = {ws_start, ws_stop};

typedef struct pipe_buf {
    char *data;
    size_t off, len;
} pipe_buf;

/* Reads what fd has into b (when b has room). 0, or -1 at its end or an error. */
static int pb_fill(int fd, pipe_buf *b) {
    if (b->off + b->len == IO_CHUNK && b->off > 0) {
        memmove(b->data, b->data + b->off, b->len);
        b->off = 0;
    }
    size_t room = IO_CHUNK - b->off - b->len;
    if (!room) return 0;
    ssize_t n = recv(fd, b->data + b->off + b->len, room, 0);
    if (n > 0) {
        b->len += (size_t)n;
        return 0;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
    return -1;
}

/* Writes what b holds to fd. 0, or -1 on an error. */
static int pb_drain(int fd, pipe_buf *b) {
    if (!b->len) return 0;
    ssize_t n = send(fd, b->data + b->off, b->len, MSG_NOSIGNAL);
    if (n > 0) {
        b->off += (size_t)n;
        b->len -= (size_t)n;
        if (!b->len) b->off = 0;
        return 0;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
    return -1;
}

/* Moves bytes both ways until a side closes or the daemon stops. */
static void ws_pump(relay *r, int up, const char *left, size_t left_len) {
    int client = r->client;
    keepalive(client);
    pipe_buf c2u = {xmalloc(IO_CHUNK), 0, 0}, u2c = {xmalloc(IO_CHUNK), 0, 0};
    size_t k = r->extra_len < IO_CHUNK ? r->extra_len : IO_CHUNK;
    if (k) memcpy(c2u.data, r->extra, k);
    c2u.len = k;
    k = left_len < IO_CHUNK ? left_len : IO_CHUNK;
    if (k) memcpy(u2c.data, left, k);
    u2c.len = k;
    for (;;) {
        pthread_mutex_lock(&r->mu);
        int stop = r->stopping;
        pthread_mutex_unlock(&r->mu);
        if (stop) break;
        struct pollfd pf[2] = {{client, 0, 0}, {up, 0, 0}};
        if (c2u.len < IO_CHUNK) pf[0].events |= POLLIN;
        if (u2c.len) pf[0].events |= POLLOUT;
        if (u2c.len < IO_CHUNK) pf[1].events |= POLLIN;
        if (c2u.len) pf[1].events |= POLLOUT;
        if (poll(pf, 2, -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        size_t before = c2u.len + u2c.len;
        int end = 0;
        if ((pf[0].revents & (POLLIN | POLLHUP | POLLERR)) && pb_fill(client, &c2u) < 0) end = 1;
        if ((pf[1].revents & (POLLIN | POLLHUP | POLLERR)) && pb_fill(up, &u2c) < 0) end = 1;
        if (pb_drain(up, &c2u) < 0 || pb_drain(client, &u2c) < 0) end = 1;
        if (c2u.len + u2c.len != before || (pf[0].revents | pf[1].revents) & POLLOUT) activity(r);
        if (end) { /* what one side said last still reaches the other (its close frame) */
            for (int i = 0; i < 3 && (c2u.len || u2c.len); i++) {
                (void)pb_drain(up, &c2u);
                (void)pb_drain(client, &u2c);
            }
            break;
        }
    }
    free(c2u.data);
    free(u2c.data);
}

/* The upstream said 101: answer 101, wait for the client's socket, relay. */
static void answer_ws(relay *r, int up, resp_head *rh, const char *left, size_t left_len) {
    struct MHD_Response *resp = http_upgrade_response(r->req, &g_ws_ops, r);
    if (!resp) {
        answer_error(r, 502, "bad_gateway", "this server cannot relay a WebSocket (no upgrade support)");
        return;
    }
    const char *upg = "websocket";
    for (int i = 0; i < rh->nlines; i++)
        if (strncasecmp(rh->lines[i], "Upgrade:", 8) == 0) {
            upg = rh->lines[i] + 8;
            while (*upg == ' ' || *upg == '\t') upg++;
        }
    if (MHD_add_response_header(resp, "Connection", "Upgrade") != MHD_YES ||
        MHD_add_response_header(resp, "Upgrade", upg) != MHD_YES)
        log_warn("proxy: cannot set the 101's upgrade headers");
    copy_headers(resp, rh);
    relay_hold(r); /* the upgrade's, until start(NULL) or http_upgrade_close */
    /* added before taken off: the two never read 0 together while the relay
     * lives (a reader of proxy_stats_get frees what relays point to then) */
    __atomic_fetch_add(&g_ws_live, 1, __ATOMIC_RELAXED);
    __atomic_fetch_sub(&g_http_live, 1, __ATOMIC_RELAXED);
    http_res *a = http_res_new();
    a->status = 101;
    a->raw = resp;
    http_req *req = r->req;
    r->req = NULL;
    http_resume(req, a);
    pthread_mutex_lock(&r->mu);
    while (r->started == 0) pthread_cond_wait(&r->cv, &r->mu);
    int started = r->started;
    pthread_mutex_unlock(&r->mu);
    if (started == 1) {
        ws_pump(r, up, left, left_len);
        http_upgrade_close(r->u);
        relay_release(r); /* the upgrade's hold */
    }
    __atomic_fetch_add(&g_http_live, 1, __ATOMIC_RELAXED); /* relay_main takes it off */
    __atomic_fetch_sub(&g_ws_live, 1, __ATOMIC_RELAXED);
}

/* ---------------------------------------------------------------- the relay thread */

/* Reads the response head: 0 with *head_end (the bytes after it are body),
 * -1 with why, -2 stopping. Interim 1xx heads other than 101 are skipped. */
static int read_head(relay *r, int fd, char *hb, size_t cap, size_t *got, size_t *head_end, char *why, size_t wcap) {
    size_t n = 0;
    int64_t end = mono_ms() + r->header_timeout_ms;
    for (;;) {
        char *e = n >= 4 ? memmem(hb, n, "\r\n\r\n", 4) : NULL;
        if (e) {
            size_t he = (size_t)(e - hb) + 4;
            int interim = n >= 12 && strncmp(hb, "HTTP/1.", 7) == 0 && hb[9] == '1' && strncmp(hb + 9, "101", 3) != 0;
            if (!interim) {
                *got = n;
                *head_end = he;
                return 0;
            }
            memmove(hb, hb + he, n - he);
            n -= he;
            continue;
        }
        if (n >= PROXY_HEAD_MAX) {
            snprintf(why, wcap, "the upstream %s:%d sent a response head larger than %d bytes", r->host, r->port,
                     PROXY_HEAD_MAX);
            return -1;
        }
        int64_t left = end - mono_ms();
        int w = left > 0 ? wait_fd(r, fd, POLLIN, (int)left) : 0;
        if (w == -2) return -2;
        if (w == 0) {
            snprintf(why, wcap, "the upstream %s:%d sent no response head within %d ms", r->host, r->port,
                     r->header_timeout_ms);
            return -1;
        }
        ssize_t k = recv(fd, hb + n, cap - 1 - n, 0);
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
        if (k <= 0) {
            char e2[128];
            snprintf(e2, sizeof e2, "%s", k == 0 ? "closed the connection" : strerror(errno));
            lower_first(e2);
            snprintf(why, wcap, "the upstream %s:%d %s before its response head", r->host, r->port, e2);
            return -1;
        }
        n += (size_t)k;
        hb[n] = '\0';
    }
}

static void relay_run(relay *r) {
    char why[512];
    size_t cap = PROXY_HEAD_MAX + IO_CHUNK + 1;
    char *hb = xmalloc(cap);
    int fd = upstream_connect(r, why, sizeof why);
    if (fd == -2) {
        answer_error(r, 503, "unavailable", "the server is stopping; retry");
        goto out;
    }
    if (fd < 0) {
        answer_error(r, 502, "bad_gateway", why);
        goto out;
    }
    pthread_mutex_lock(&r->mu);
    r->up = fd;
    pthread_mutex_unlock(&r->mu);
    int rc = send_all(r, fd, r->head, r->head_len, why, sizeof why);
    if (rc == 0 && r->body_len) rc = send_all(r, fd, r->body, r->body_len, why, sizeof why);
    size_t got = 0, he = 0;
    if (rc == 0) rc = read_head(r, fd, hb, cap, &got, &he, why, sizeof why);
    if (rc == -2) {
        answer_error(r, 503, "unavailable", "the server is stopping; retry");
        goto out;
    }
    if (rc < 0) {
        answer_error(r, 502, "bad_gateway", why);
        goto out;
    }
    activity(r);
    char *head = xmalloc(he + 1);
    memcpy(head, hb, he);
    head[he] = '\0';
    resp_head rh;
    if (parse_head(head, &rh) < 0) {
        snprintf(why, sizeof why, "the upstream %s:%d sent a malformed response head", r->host, r->port);
        answer_error(r, 502, "bad_gateway", why);
    } else if (r->ws && rh.status == 101) {
        answer_ws(r, fd, &rh, hb + he, got - he);
    } else {
        answer_stream(r, fd, &rh, hb + he, got - he);
    }
    free(head);
out:
    free(hb);
    pthread_mutex_lock(&r->mu);
    int up = r->up;
    r->up = -1;
    pthread_mutex_unlock(&r->mu);
    if (up >= 0) close(up);
    __atomic_fetch_sub(&g_http_live, 1, __ATOMIC_RELAXED);
    __atomic_fetch_sub(&g_live, 1, __ATOMIC_RELAXED);
    relay_release(r);
}

/* Relay threads are kept a while once done (at most POOL_IDLE_MAX idle,
 * each for POOL_IDLE_MS): a thread a request costs its creation only when
 * requests come faster than they end. A poster takes an idle thread by
 * counting it off g_idle and queueing the relay; a thread that times out
 * still takes what was queued for it. */
#define POOL_IDLE_MAX 64
#define POOL_IDLE_MS 10000
static pthread_mutex_t g_pool_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_pool_cv = PTHREAD_COND_INITIALIZER;
static relay *g_queue_head, *g_queue_tail;
static int g_idle;

static void *relay_main(void *arg) {
    relay *r = arg;
    for (;;) {
        relay_run(r);
        pthread_mutex_lock(&g_pool_mu);
        if (g_idle >= POOL_IDLE_MAX) {
            pthread_mutex_unlock(&g_pool_mu);
            return NULL;
        }
        g_idle++;
        struct timespec end;
        clock_gettime(CLOCK_REALTIME, &end);
        end.tv_sec += POOL_IDLE_MS / 1000;
        while (!g_queue_head && pthread_cond_timedwait(&g_pool_cv, &g_pool_mu, &end) == 0) {
        }
        r = g_queue_head;
        if (r) { /* the poster counted this thread off g_idle */
            g_queue_head = r->next;
            if (!g_queue_head) g_queue_tail = NULL;
        } else {
            g_idle--;
        }
        pthread_mutex_unlock(&g_pool_mu);
        if (!r) return NULL;
    }
}

/* Hands r to an idle relay thread: 0, or -1 when none is idle. */
static int relay_post(relay *r) {
    pthread_mutex_lock(&g_pool_mu);
    if (g_idle == 0) {
        pthread_mutex_unlock(&g_pool_mu);
        return -1;
    }
    g_idle--;
    r->next = NULL;
    if (g_queue_tail) g_queue_tail->next = r;
    else g_queue_head = r;
    g_queue_tail = r;
    pthread_cond_signal(&g_pool_cv);
    pthread_mutex_unlock(&g_pool_mu);
    return 0;
}

/* ---------------------------------------------------------------- proxy_forward */

/* Starts r's relay thread, detached, with a stack of `stack` bytes (0: the
 * default). 0, or an errno. */
static int relay_thread(relay *r, size_t stack) {
    pthread_attr_t at;
    pthread_t th;
    int rc = pthread_attr_init(&at);
    if (rc) return rc;
    if (stack) rc = pthread_attr_setstacksize(&at, stack);
    if (!rc) rc = pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    if (!rc) rc = pthread_create(&th, &at, relay_main, r);
    pthread_attr_destroy(&at);
    return rc;
}

void proxy_forward(http_req *req, http_res *res, const proxy_target *t) {
    if (!t || !t->host || !t->host[0] || strlen(t->host) >= 256 || strpbrk(t->host, " \r\n/") || t->port < 1 ||
        t->port > 65535) {
        http_error(res, 500, "internal", NULL, "the proxy's upstream is not a host and port");
        return;
    }
    for (const char *const *a = t->add; a && *a; a++)
        if (!header_ok(*a)) {
            http_error(res, 500, "internal", NULL, "the proxy adds a header that is not \"Name: value\"");
            return;
        }
    if (__atomic_add_fetch(&g_live, 1, __ATOMIC_RELAXED) > PROXY_MAX_RELAYS) {
        __atomic_fetch_sub(&g_live, 1, __ATOMIC_RELAXED);
        http_error(res, 503, "unavailable", NULL, "too many requests through the proxy at once (%d); retry",
                   PROXY_MAX_RELAYS);
        return;
    }
    const char *upg = http_header(req, "Upgrade"), *conn = http_header(req, "Connection");
    int ws = upg && has_token(upg, "websocket") && conn && has_token(conn, "upgrade");
    buf head;
    buf_init(&head, HEAD_OUT_MAX);
    if (build_head(req, res, t, ws, &head) < 0) {
        buf_release(&head);
        __atomic_fetch_sub(&g_live, 1, __ATOMIC_RELAXED);
        return;
    }
    relay *r = xcalloc(1, sizeof *r);
    if (pthread_mutex_init(&r->mu, NULL) != 0 || pthread_cond_init(&r->cv, NULL) != 0) abort();
    r->refs = 1; /* the thread's */
    r->id = __atomic_add_fetch(&g_next_id, 1, __ATOMIC_RELAXED);
    r->daemon = req->daemon;
    r->req = req;
    snprintf(r->host, sizeof r->host, "%s", t->host);
    r->port = t->port;
    r->head = buf_detach(&head, &r->head_len);
    if (req->body.len) {
        r->body = xmalloc(req->body.len);
        memcpy(r->body, req->body.data, req->body.len);
        r->body_len = req->body.len;
    }
    r->ws = ws;
    r->is_head = strcmp(req->method, "HEAD") == 0;
    r->header_timeout_ms = t->header_timeout_ms > 0 ? t->header_timeout_ms : PROXY_HEADER_TIMEOUT_MS;
    r->activity = t->activity;
    r->activity_cls = t->activity_cls;
    r->last_activity = mono_ms() - 1000;
    r->up = -1;
    r->client = -1;
    __atomic_fetch_add(&g_requests, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&g_http_live, 1, __ATOMIC_RELAXED);
    if (http_defer(req, res) < 0) {
        __atomic_fetch_sub(&g_http_live, 1, __ATOMIC_RELAXED);
        __atomic_fetch_sub(&g_live, 1, __ATOMIC_RELAXED);
        relay_release(r);
        http_error(res, 503, "unavailable", NULL, "the server is stopping; retry");
        return;
    }
    /* a binary with a large static TLS (the CUDA and BLAS libraries) needs more than the
     * small stack: the default then, from the first refusal on */
    static int small_ok = 1;
    int ok = relay_post(r) == 0;
    if (!ok && __atomic_load_n(&small_ok, __ATOMIC_RELAXED)) {
        ok = relay_thread(r, RELAY_STACK) == 0;
        if (!ok) __atomic_store_n(&small_ok, 0, __ATOMIC_RELAXED);
    }
    if (!ok) ok = relay_thread(r, 0) == 0;
    if (!ok) { /* deferred already: answer through the same door */
        __atomic_fetch_sub(&g_http_live, 1, __ATOMIC_RELAXED);
        __atomic_fetch_sub(&g_live, 1, __ATOMIC_RELAXED);
        relay_release(r);
        http_res *a = http_res_new();
        http_error(a, 503, "unavailable", NULL, "cannot start a relay thread; retry");
        http_resume(req, a);
    }
}

/* ---------------------------------------------------------------- splices */

typedef struct splice_side {          /* an upgrade's cls: which side of which splice */
    proxy_splice *s;
    int side;
} splice_side;

struct proxy_splice {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    const proxy_splice_ops *ops;
    void *cls;
    int side[2];                      /* 0: to come; 1: here; -1: never */
    http_upgrade *u[2];
    int fd[2];
    char *extra[2];                   /* what a side sent past its request */
    size_t extra_len[2];
    int pumping, ended, stopping;
    int64_t last_activity;
    splice_side ss[2];                /* the upgrades' cls */
};


void proxy_splice_release(proxy_splice *s) {
    pthread_mutex_lock(&s->mu);
    int left = --s->refs;
    pthread_mutex_unlock(&s->mu);
    if (left) return;
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->extra[0]);
    free(s->extra[1]);
    free(s);
    __atomic_fetch_sub(&g_live, 1, __ATOMIC_RELAXED);
}

proxy_splice *proxy_splice_new(const proxy_splice_ops *ops, void *cls) {
    if (__atomic_add_fetch(&g_live, 1, __ATOMIC_RELAXED) > PROXY_MAX_RELAYS) {
        __atomic_fetch_sub(&g_live, 1, __ATOMIC_RELAXED);
        return NULL;
    }
    proxy_splice *s = xcalloc(1, sizeof *s);
    if (pthread_mutex_init(&s->mu, NULL) != 0 || pthread_cond_init(&s->cv, NULL) != 0) abort();
    s->refs = 1;
    s->ops = ops;
    s->cls = cls;
    s->fd[0] = s->fd[1] = -1;
    for (int i = 0; i < 2; i++) {
        s->ss[i].s = s;
        s->ss[i].side = i;
    }
    return s;
}

/* The end: the sides that came are closed, end() called once. Called with
 * no lock held, by the one that saw the splice over. */
static void splice_finish(proxy_splice *s) {
    pthread_mutex_lock(&s->mu);
    if (s->ended) {
        pthread_mutex_unlock(&s->mu);
        return;
    }
    s->ended = 1;
    http_upgrade *u0 = s->side[0] == 1 ? s->u[0] : NULL, *u1 = s->side[1] == 1 ? s->u[1] : NULL;
    s->u[0] = s->u[1] = NULL;
    pthread_mutex_unlock(&s->mu);
    if (u0) http_upgrade_close(u0);
    if (u1) http_upgrade_close(u1);
    if (s->ops->end) s->ops->end(s->cls);
    /* the upgrades' holds: those that came (start(NULL) released its own) */
    if (u0) proxy_splice_release(s);
    if (u1) proxy_splice_release(s);
}

static void splice_activity(proxy_splice *s) {
    if (!s->ops->activity) return;
    int64_t now = mono_ms(), last = __atomic_load_n(&s->last_activity, __ATOMIC_RELAXED);
    if (now - last < 1000) return;
    if (!__atomic_compare_exchange_n(&s->last_activity, &last, now, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return;
    s->ops->activity(s->cls);
}

static void *splice_main(void *arg) {
    proxy_splice *s = arg;
    int a = s->fd[0], b = s->fd[1];
    keepalive(a);
    keepalive(b);
    __atomic_fetch_add(&g_ws_live, 1, __ATOMIC_RELAXED);
    /* a2b: side 0 to side 1; b2a: side 1 to side 0 (observed) */
    pipe_buf a2b = {xmalloc(IO_CHUNK), 0, 0}, b2a = {xmalloc(IO_CHUNK), 0, 0};
    size_t k = s->extra_len[0] < IO_CHUNK ? s->extra_len[0] : IO_CHUNK;
    if (k) memcpy(a2b.data, s->extra[0], k);
    a2b.len = k;
    k = s->extra_len[1] < IO_CHUNK ? s->extra_len[1] : IO_CHUNK;
    if (k) memcpy(b2a.data, s->extra[1], k);
    b2a.len = k;
    if (b2a.len && s->ops->observe) s->ops->observe(s->cls, b2a.data, b2a.len);
    for (;;) {
        pthread_mutex_lock(&s->mu);
        int stop = s->stopping;
        pthread_mutex_unlock(&s->mu);
        if (stop) break;
        struct pollfd pf[2] = {{a, 0, 0}, {b, 0, 0}};
        if (a2b.len < IO_CHUNK) pf[0].events |= POLLIN;
        if (b2a.len) pf[0].events |= POLLOUT;
        if (b2a.len < IO_CHUNK) pf[1].events |= POLLIN;
        if (a2b.len) pf[1].events |= POLLOUT;
        if (poll(pf, 2, 1000) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        size_t before = a2b.len + b2a.len, had = b2a.off + b2a.len;
        int end = 0;
        if ((pf[0].revents & (POLLIN | POLLHUP | POLLERR)) && pb_fill(a, &a2b) < 0) end = 1;
        if ((pf[1].revents & (POLLIN | POLLHUP | POLLERR)) && pb_fill(b, &b2a) < 0) end = 1;
        if (s->ops->observe && b2a.off + b2a.len > had) s->ops->observe(s->cls, b2a.data + had, b2a.off + b2a.len - had);
        if (pb_drain(b, &a2b) < 0 || pb_drain(a, &b2a) < 0) end = 1;
        if (a2b.len + b2a.len != before) splice_activity(s);
        if (end) { /* what one side said last still reaches the other (its close frame) */
            for (int i = 0; i < 3 && (a2b.len || b2a.len); i++) {
                (void)pb_drain(b, &a2b);
                (void)pb_drain(a, &b2a);
            }
            break;
        }
    }
    free(a2b.data);
    free(b2a.data);
    __atomic_fetch_sub(&g_ws_live, 1, __ATOMIC_RELAXED);
    splice_finish(s);
    proxy_splice_release(s); /* the thread's */
    return NULL;
}

/* A side came or was given up: starts the pump once both are here, ends
 * the splice once either never comes. */
static void splice_settle(proxy_splice *s) {
    pthread_mutex_lock(&s->mu);
    int go = s->side[0] == 1 && s->side[1] == 1 && !s->pumping && !s->ended;
    int over = (s->side[0] == -1 || s->side[1] == -1) && !s->ended;
    if (go) {
        s->pumping = 1;
        s->refs++; /* the thread's */
    }
    pthread_mutex_unlock(&s->mu);
    if (go) {
        pthread_attr_t at;
        pthread_t th;
        int rc = pthread_attr_init(&at);
        if (!rc) rc = pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        if (!rc) rc = pthread_create(&th, &at, splice_main, s);
        if (!rc) (void)pthread_attr_destroy(&at);
        if (rc) {
            log_warn("proxy: cannot start a splice's thread: %s", strerror(rc));
            splice_finish(s);
            proxy_splice_release(s);
        }
    } else if (over) {
        splice_finish(s);
    }
}

static void splice_start(void *cls, http_upgrade *u, int fd, const char *extra, size_t extra_len) {
    splice_side *ss = cls;
    proxy_splice *s = ss->s;
    int side = ss->side;
    pthread_mutex_lock(&s->mu);
    if (u) {
        s->u[side] = u;
        s->fd[side] = fd;
        if (extra_len) {
            s->extra[side] = xmalloc(extra_len);
            memcpy(s->extra[side], extra, extra_len);
            s->extra_len[side] = extra_len;
        }
        s->side[side] = 1;
    } else {
        s->side[side] = -1;
    }
    int ended = s->ended;
    pthread_mutex_unlock(&s->mu);
    if (u && ended) { /* over before this side came: close it */
        http_upgrade_close(u);
        proxy_splice_release(s);
        return;
    }
    splice_settle(s);
    if (!u) proxy_splice_release(s); /* the upgrade's hold: nothing more comes from it */
}

/* http_stop began: the pump ends (it closes the sides); must not block */
static void splice_stop(void *cls) {
    proxy_splice *s = ((splice_side *)cls)->s;
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    for (int i = 0; i < 2; i++)
        if (s->side[i] == 1 && s->fd[i] >= 0) shutdown(s->fd[i], SHUT_RDWR);
    pthread_mutex_unlock(&s->mu);
}

int proxy_splice_answer(proxy_splice *s, int side, http_req *req, http_res *res, const char *const *headers) {
    static const http_upgrade_ops ops = {splice_start, splice_stop};
    splice_side *ss = &s->ss[side];
    struct MHD_Response *resp = http_upgrade_response(req, &ops, ss);
    if (!resp) {
        proxy_splice_abandon(s, side);
        return -1;
    }
    for (const char *const *h = headers; h && *h; h++) {
        const char *c = strchr(*h, ':');
        if (!c) continue;
        char name[64];
        size_t n = (size_t)(c - *h);
        if (n >= sizeof name) continue;
        memcpy(name, *h, n);
        name[n] = '\0';
        c++;
        while (*c == ' ') c++;
        if (MHD_add_response_header(resp, name, c) != MHD_YES) log_warn("proxy: cannot set the 101's %s", name);
    }
    pthread_mutex_lock(&s->mu);
    s->refs++; /* the upgrade's, until start(NULL) or the close */
    pthread_mutex_unlock(&s->mu);
    res->status = 101;
    res->raw = resp;
    return 0;
}

void proxy_splice_abandon(proxy_splice *s, int side) {
    pthread_mutex_lock(&s->mu);
    if (s->side[side] == 0) s->side[side] = -1;
    pthread_mutex_unlock(&s->mu);
    splice_settle(s);
}

void proxy_splice_close(proxy_splice *s) {
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    int pumping = s->pumping;
    for (int i = 0; i < 2; i++)
        if (s->side[i] == 1 && s->fd[i] >= 0) shutdown(s->fd[i], SHUT_RDWR);
    pthread_mutex_unlock(&s->mu);
    if (!pumping) splice_finish(s);
}
