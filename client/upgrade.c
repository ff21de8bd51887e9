/* upgrade.c - an HTTP/1.1 connection taken over after a 101 (see upgrade.h). */
#include "upgrade.h"

#include <curl/curl.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define HEAD_MAX (16u << 10)     /* an answer's status line and headers */
#define BODY_MAX (64u << 10)     /* a refusal's body kept */

void client_conn_close(client_conn *k) {
    if (k->curl) curl_easy_cleanup(k->curl);
    k->curl = NULL;
    k->fd = -1;
    buf_release(&k->head);
    buf_release(&k->body);
    buf_release(&k->extra);
}

ssize_t client_conn_send(client_conn *k, const void *p, size_t n) {
    size_t sent = 0;
    CURLcode rc = curl_easy_send(k->curl, p, n, &sent);
    if (rc == CURLE_AGAIN) return 0;
    if (rc != CURLE_OK) return -1;
    return (ssize_t)sent;
}

ssize_t client_conn_recv(client_conn *k, void *p, size_t n) {
    size_t got = 0;
    CURLcode rc = curl_easy_recv(k->curl, p, n, &got);
    if (rc == CURLE_AGAIN) return -2;
    if (rc != CURLE_OK) return -1;
    return (ssize_t)got;
}

/* Waits until fd is ready for events or deadline (mono ms): 1, 0 at the
 * deadline, -1 on an error. */
static int wait_fd(int fd, short events, int64_t deadline) {
    for (;;) {
        int64_t left = deadline - mono_ms();
        if (left <= 0) return 0;
        struct pollfd pf = {.fd = fd, .events = events};
        int r = poll(&pf, 1, (int)(left > 1000 ? 1000 : left));
        if (r > 0) return 1;
        if (r < 0 && errno != EINTR) return -1;
    }
}

/* The host[:port] of url (after the scheme, up to the path). */
static int url_host(const char *url, char *out, size_t n) {
    const char *h = strstr(url, "://");
    h = h ? h + 3 : url;
    size_t len = strcspn(h, "/?#");
    if (!len || len >= n) return -1;
    memcpy(out, h, len);
    out[len] = '\0';
    return 0;
}

const char *client_conn_header(const client_conn *k, const char *name, char *out, size_t n) {
    size_t nl = strlen(name);
    const char *p = k->head.data ? k->head.data : "";
    while ((p = strstr(p, "\r\n")) != NULL) {
        p += 2;
        if (strncasecmp(p, name, nl) != 0 || p[nl] != ':') continue;
        const char *v = p + nl + 1;
        while (*v == ' ' || *v == '\t') v++;
        size_t len = strcspn(v, "\r\n");
        while (len && (v[len - 1] == ' ' || v[len - 1] == '\t')) len--;
        if (len >= n) return NULL;
        memcpy(out, v, len);
        out[len] = '\0';
        return out;
    }
    return NULL;
}

/* One try at base (one URL of c's list). *reached: a byte of the request went out. */
static int upgrade_one(const client *c, const char *base, const char *path, const char *headers, long timeout_ms,
                       client_conn *k, int *reached, char *err, size_t errlen) {
    *reached = 0;
    memset(k, 0, sizeof *k);
    k->fd = -1;
    buf_init(&k->head, HEAD_MAX);
    buf_init(&k->body, BODY_MAX);
    buf_init(&k->extra, HEAD_MAX);
    char url[1024], host[512];
    if (sfmt(url, sizeof url, "%s%s", base, path) < 0 || url_host(base, host, sizeof host) < 0) {
        snprintf(err, errlen, "the server's URL or the path is too long");
        return -1;
    }
    int64_t deadline = mono_ms() + timeout_ms;
    CURL *h = curl_easy_init();
    if (!h) {
        snprintf(err, errlen, "curl_easy_init failed");
        return -1;
    }
    k->curl = h;
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_CONNECT_ONLY, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms < 5000 ? timeout_ms : 5000L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    client_tls_apply(h);
    CURLcode rc = curl_easy_perform(h);
    curl_socket_t sock = CURL_SOCKET_BAD;
    if (rc == CURLE_OK) rc = curl_easy_getinfo(h, CURLINFO_ACTIVESOCKET, &sock);
    if (rc != CURLE_OK || sock == CURL_SOCKET_BAD) {
        snprintf(err, errlen, "%s: %s%s", base, curl_easy_strerror(rc),
                 rc == CURLE_PEER_FAILED_VERIFICATION && !client_trusted_ca()
                     ? " (give the server's CA: TRAINYARD_CA=FILE or --ca-cert FILE; its DATA/tls/ca.crt)"
                     : "");
        client_conn_close(k);
        return -1;
    }
    k->fd = (int)sock;
    *reached = 1;

    buf req;
    buf_init(&req, 64u << 10);
    int ok = buf_printf(&req, "GET %s HTTP/1.1\r\nHost: %s\r\n", path, host) == 0;
    if (ok && c->token[0]) ok = buf_printf(&req, "Authorization: Bearer %s\r\n", c->token) == 0;
    if (ok && c->team[0]) ok = buf_printf(&req, "Trainyard-Team: %s\r\n", c->team) == 0;
    if (ok && headers) ok = buf_appends(&req, headers) == 0;
    ok = ok && buf_appends(&req, "\r\n") == 0;
    if (!ok) {
        snprintf(err, errlen, "the request is too long");
        buf_release(&req);
        client_conn_close(k);
        return -1;
    }
    int sent_ok = 1;
    for (size_t off = 0; off < req.len;) {
        ssize_t n = client_conn_send(k, req.data + off, req.len - off);
        if (n < 0) {
            snprintf(err, errlen, "%s: the connection failed while sending the request", base);
            sent_ok = 0;
            break;
        }
        off += (size_t)n;
        if (off < req.len && wait_fd(k->fd, POLLOUT, deadline) <= 0) {
            snprintf(err, errlen, "%s: no room to send the request within %ld ms", base, timeout_ms);
            sent_ok = 0;
            break;
        }
    }
    explicit_bzero(req.data, req.len); /* it held the token */
    buf_release(&req);
    if (!sent_ok) {
        client_conn_close(k);
        return -1;
    }

    /* the answer's head */
    char chunk[4096];
    const char *end = NULL;
    while (!end) {
        ssize_t n = client_conn_recv(k, chunk, sizeof chunk);
        if (n == -2) {
            if (wait_fd(k->fd, POLLIN, deadline) > 0) continue;
            snprintf(err, errlen, "%s: no answer within %ld ms", base, timeout_ms);
        } else if (n <= 0) {
            snprintf(err, errlen, "%s: the connection ended before an answer", base);
        } else if (buf_append(&k->head, chunk, (size_t)n) < 0) {
            snprintf(err, errlen, "%s: an answer's head over %u bytes", base, HEAD_MAX);
        } else {
            end = strstr(k->head.data, "\r\n\r\n");
            continue;
        }
        client_conn_close(k);
        return -1;
    }
    size_t head_len = (size_t)(end - k->head.data) + 4;
    size_t past = k->head.len - head_len;
    int code = 0;
    if (sscanf(k->head.data, "HTTP/1.%*d %3d", &code) != 1 || code < 100 || code > 599) {
        snprintf(err, errlen, "%s: not an HTTP answer", base);
        client_conn_close(k);
        return -1;
    }
    k->status = code;
    buf *rest = code == 101 ? &k->extra : &k->body;
    if (past && buf_append(rest, k->head.data + head_len, past) < 0) {
        client_conn_close(k);
        snprintf(err, errlen, "%s: an answer too long", base);
        return -1;
    }
    k->head.len = head_len;
    k->head.data[head_len] = '\0';
    if (code == 101) return 0;
    /* a refusal: its body, as long as Content-Length says (else to the end) */
    char cl[32];
    long want = -1;
    if (client_conn_header(k, "Content-Length", cl, sizeof cl) && parse_long(cl, 0, BODY_MAX, &want) < 0) want = -1;
    if (want < 0 && deadline > mono_ms() + 2000) deadline = mono_ms() + 2000; /* to its end, 2 s at most */
    while (want < 0 || (long)k->body.len < want) {
        ssize_t n = client_conn_recv(k, chunk, sizeof chunk);
        if (n == -2) {
            if (wait_fd(k->fd, POLLIN, deadline) > 0) continue;
            break;
        }
        if (n <= 0 || buf_append(&k->body, chunk, (size_t)n) < 0) break;
    }
    return 0;
}

int client_upgrade(const client *c, const char *path, const char *headers, long timeout_ms, client_conn *k,
                   char *err, size_t errlen) {
    /* Over a list: from the URL in use, the next one when a server cannot
     * be reached or answers 503 (a standby; it gives no shell). Once
     * round, no waiting: the caller's own retries, if any, do that. */
    int n = c->n_urls > 0 ? c->n_urls : 1;
    for (int i = 0;; i++) {
        const char *base = c->n_urls > 0 ? c->urls[(c->cur + i) % n] : c->url;
        int reached = 0;
        int rc = upgrade_one(c, base, path, headers, timeout_ms, k, &reached, err, errlen);
        if (i + 1 >= n) return rc;
        if (rc == 0 && k->status != 503) return 0;
        if (rc < 0 && reached) return rc; /* it may have been taken: not again */
        if (rc == 0) client_conn_close(k);
    }
}
