/* proxy.h - the reverse proxy: a handler forwards its request to an
 * upstream host:port (a job's TensorBoard or Jupyter) and the answer flows
 * back to the client as the upstream gives it.
 *
 * What goes up: the method, the request target (by default the one the
 * client sent, %-escapes kept: an app under a base URL sees its own paths),
 * the headers less the caller's credentials (Authorization, X-CSRF-Token,
 * Trainyard-Team, the trainyard_session cookie; other cookies stay), less
 * the hop-by-hop ones (Connection and what it names, Keep-Alive, TE,
 * Trailer, Transfer-Encoding, Upgrade, Proxy-*), Host (the upstream's),
 * Expect and any X-Forwarded-* of the client's; then X-Forwarded-For,
 * -Proto, -Host (and -Prefix when given), the caller's own headers, and
 * the body the daemon read (bounded by the route's max_body).
 *
 * What comes back: the status, the headers less the hop-by-hop ones, and
 * the body, streamed (a server-sent event stream or a large file flows; no
 * more than 64 KiB is held at once). An upstream that refuses, does not
 * connect within PROXY_CONNECT_TIMEOUT_MS or sends no response head within
 * the header timeout is answered 502 bad_gateway naming why.
 *
 * WebSockets: a request with Upgrade: websocket goes up with its upgrade
 * headers; on the upstream's 101 the client is answered 101 and bytes are
 * relayed both ways until either side closes. No timeout applies to a live
 * relay (an idle terminal stays open for hours); TCP keepalive finds a dead
 * peer.
 *
 * Threads: each proxied request has a relay thread of its own (256 KiB of
 * stack where the binary's static TLS allows it), so no pool thread of the
 * daemon ever waits on an upstream: the request is deferred (http_defer)
 * until the upstream's head is in, its body is handed to the daemon's
 * stream reader through a buffer, and a WebSocket's thread moves the bytes
 * itself. A thread once done waits up to 10 s for the next request. At most PROXY_MAX_RELAYS at once (503 past it): tens of
 * WebSockets and hundreds of requests in flight are what it is made for. docs/server.md, "The
 * reverse proxy".
 *
 * Splices: two requests of the daemon's own, both answered 101, joined
 * so that what each side sends goes to the other (a shell: the client's
 * WebSocket and the node agent's connection). The server copies bytes
 * only; an observer may look at one direction as it passes.
 *
 * defines: proxy_target, proxy_forward, proxy_stats, proxy_stats_get,
 *          proxy_splice, proxy_splice_ops, proxy_splice_new,
 *          proxy_splice_answer, proxy_splice_abandon, proxy_splice_release, PROXY_* */
#ifndef TRAINYARD_PROXY_H
#define TRAINYARD_PROXY_H

#include <stdint.h>

#include "http.h"

#define PROXY_CONNECT_TIMEOUT_MS 5000   /* the upstream's TCP connect */
#define PROXY_HEADER_TIMEOUT_MS 60000   /* its response head, unless the target says */
#define PROXY_MAX_RELAYS 1024           /* requests and WebSockets through the proxy at once */
#define PROXY_HEAD_MAX 16384            /* the upstream's response head: 502 past it */

typedef struct proxy_target {
    const char *host;                 /* the upstream: an address or a name ("127.0.0.1") */
    int port;
    const char *target;               /* the request target sent up (path and query,
                                       * escaped); NULL: the client's own, as it came */
    const char *prefix;               /* X-Forwarded-Prefix ("/proxy/jobs/3/lab"), or NULL */
    const char *const *drop;          /* more request headers to drop (names,
                                       * NULL-terminated), or NULL */
    const char *const *add;           /* headers to add, "Name: value" (NULL-terminated), or
                                       * NULL; a client's header of the same name is dropped */
    int header_timeout_ms;            /* the response head's wait; 0: PROXY_HEADER_TIMEOUT_MS */
    /* Called at most once a second while bytes flow either way (for idle
     * culling), from the relay thread; NULL: none. activity_cls must
     * outlive the relays of the target (proxy_stats_get tells when none is
     * left). */
    void (*activity)(void *cls);
    void *activity_cls;
} proxy_target;

/* In a handler: forwards req to t and answers res with what the upstream
 * answers (the request is deferred meanwhile; the handler returns at once).
 * Everything t points to is copied, except activity_cls. Answers itself
 * 500 for a target that cannot be (no host, a port outside 1-65535, an
 * added header that is not "Name: value" on one line), 503 past
 * PROXY_MAX_RELAYS or while the daemon stops, 502 bad_gateway when the
 * upstream cannot be reached or does not answer ("cannot reach the upstream
 * 127.0.0.1:8888: connection refused"). */
void proxy_forward(http_req *req, http_res *res, const proxy_target *t);

typedef struct proxy_stats {
    int http;                         /* requests relayed now (head or body) */
    int websocket;                    /* WebSockets relayed now */
    uint64_t requests;                /* every request forwarded since start */
    uint64_t bad_gateway;             /* of them, answered 502 */
} proxy_stats;

/* The counts now (safe from any thread). */
void proxy_stats_get(proxy_stats *out);

/* ---------------------------------------------------------------- splices */
typedef struct proxy_splice proxy_splice;
typedef struct proxy_splice_ops {
    /* Bytes passing from side 1 to side 0, on the splice's thread, before
     * they are sent on; NULL: none. */
    void (*observe)(void *cls, const char *data, size_t len);
    /* At most once a second while bytes flow either way; NULL: none. */
    void (*activity)(void *cls);
    /* Once, when the splice is over: both sides closed, or one side never
     * came (its connection ended before the upgrade, or it was abandoned),
     * or the daemon stops. Any thread; the splice's own references are
     * gone after it (cls may be freed, unless the caller still holds the
     * splice: proxy_splice_release). */
    void (*end)(void *cls);
} proxy_splice_ops;

/* A splice whose two sides are still to come; the caller holds one
 * reference (proxy_splice_release). ops and cls must live until end. NULL
 * past PROXY_MAX_RELAYS. */
proxy_splice *proxy_splice_new(const proxy_splice_ops *ops, void *cls);

/* Answers req as side (0 or 1) of s: a 101 with the header lines given
 * ("Name: value", NULL-terminated: Upgrade among them). 0, or -1 when the
 * response cannot be made (res untouched: answer an error; the side is
 * abandoned). Every side is answered or abandoned exactly once. */
int proxy_splice_answer(proxy_splice *s, int side, http_req *req, http_res *res, const char *const *headers);

/* That side will never come: the splice ends (the other side, if there,
 * is closed). */
void proxy_splice_abandon(proxy_splice *s, int side);

/* Ends it from outside (a session cancelled): both sides are closed. */
void proxy_splice_close(proxy_splice *s);

/* The caller's reference. */
void proxy_splice_release(proxy_splice *s);

#endif
