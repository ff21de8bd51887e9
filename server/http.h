/* http.h - the HTTP daemon (libmicrohttpd), routing and JSON replies.
 *
 * Routes are tables exported by api/ modules (see api/routes.c) matched on
 * method and path segments ("/api/v1/jobs/{id}/cancel"). A last segment
 * "{name*}" matches the rest of the path, slashes included and possibly
 * empty (req->rest); a route's method "*" matches any method (route.pattern,
 * route.method). The daemon reads
 * the body (bounded: 413 past the route's limit), authenticates the bearer
 * token against the route's allowed token kinds (401/403), calls the handler,
 * and answers JSON. Every failure is {"error": {"code","message","field"}}.
 *
 * Other GET/HEAD paths outside /api/ are the dashboard's files
 * (server/static.h). Every answer is timed into a latency histogram per
 * route (http_latency_write, for GET /metrics).
 *
 * Threads: a small pool of epoll threads serves every connection, so a
 * handler must not block. One that waits for something (a long-poll, an
 * event stream) parks its request with http_wait / http_stream_wait: the
 * connection is suspended, no thread waits, and the handler (or the stream
 * reader) runs again when the time is up or http_wake names it.
 *
 * A handler may answer 101 and hand the connection over (a WebSocket relay,
 * server/proxy.h): http_upgrade_response, http_upgrade_close.
 *
 * defines: http_start, http_tls_replace, http_stop, http_json, http_error, http_query,
 *          http_upgrade_response, http_upgrade_close, http_stream_park, ... */
#ifndef TRAINYARD_HTTP_H
#define TRAINYARD_HTTP_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <microhttpd.h>
#include <cjson/cJSON.h>

#include "../common/util.h"
#include "../storage/store.h"

struct server;
struct audit_row;
struct http_res;
struct http_upgrade;

#define HTTP_MAX_PARAMS 4
#define HTTP_PARAM_MAX 128
#define HTTP_BODY_DEFAULT (1u << 20) /* 1 MiB unless a route says otherwise */
#define HTTP_BODY_CONTEXT ((size_t)-1) /* a route's max_body: the server's --context-max-mb */
#define HTTP_URI_MAX 8192             /* path and query string: 414 past it */
#define HTTP_HEADERS_MAX 16384        /* all header lines together: 431 past it */

/* Token kinds a route accepts (bit mask of 1 << token_kind). */
#define ALLOW_NONE 0u                 /* no token needed */
#define ALLOW_ADMIN (1u << TOKEN_ADMIN)
#define ALLOW_TEAM (1u << TOKEN_TEAM)
#define ALLOW_NODE (1u << TOKEN_NODE)
#define ALLOW_TASK (1u << TOKEN_TASK)
#define ALLOW_JOIN (1u << TOKEN_JOIN)   /* the shared agents' token: registration only */
#define ALLOW_USER (ALLOW_ADMIN | ALLOW_TEAM)
#define ALLOW_PERSON (1u << TOKEN_USER) /* a person as such, before any team is chosen (/me, /tokens) */
/* Not a token kind: a change made with a cookie (a session's, or a grant's:
 * http_grant) is admitted by a same-origin Origin header instead of the
 * X-CSRF-Token header (an app's own pages behind the proxy cannot send it).
 * A WebSocket handshake with a cookie needs a same-origin Origin on every
 * route, whatever this says. */
#define ALLOW_ORIGIN (1u << 30)

/* Not a token kind either: the route is served by a standby too (its
 * health, its /metrics). Every other route of a server that does not lead
 * (several servers on one PostgreSQL, docs/ha.md) is answered 503
 * "standby" with the leader's URL (the body's "leader", the
 * X-Trainyard-Leader header) and Retry-After: 1, before any token is
 * looked at. */
#define ALLOW_STANDBY (1u << 29)

/* People (personal tokens, dashboard sessions) act in one team a request:
 * the one their token is bound to, else the one named by this header (or
 * the query's team=), else the only team they are in. The admin token acts
 * for a team it names in this header. */
#define HTTP_TEAM_HEADER "Trainyard-Team"
#define HTTP_CSRF_HEADER "X-CSRF-Token"
#define HTTP_SESSION_COOKIE "trainyard_session"
#define HTTP_GRANT_COOKIE "trainyard_proxy"
/* A browser's WebSocket cannot send Authorization: it may offer its bearer
 * token as the subprotocol "trainyard.bearer.TOKEN" instead. */
#define HTTP_WS_BEARER "trainyard.bearer."

typedef struct http_req {
    struct MHD_Connection *conn;
    const char *method;
    const char *path;                 /* without the query string */
    buf body;
    int nparams;
    char params[HTTP_MAX_PARAMS][HTTP_PARAM_MAX]; /* {x} segments, in order */
    const char *rest;                 /* a {x*} last segment: the rest of path after its
                                       * slash (possibly ""), else NULL; not in params */
    char *raw_target;                 /* the request target as it came: path and query,
                                       * %-escapes kept (heap, owned) */
    char *grant_cookie;               /* a grant's ticket redeemed: its cookie's value (heap, owned) */
    struct http_upgrade *upgrade;     /* http_upgrade_response's handle, until the request ends */
    principal who;                    /* valid when the route needs a token */
    int authed;
    struct audit_row *audit;          /* this request's audit row (storage/audit.h), or NULL */
    int64_t audit_id;                 /* its id once written */
    int audit_status;                 /* the status written with it */
    const struct route *route;
    int64_t t0_us;
    int status;                       /* what was answered (for the log) */
    size_t sent;
    int too_large;
    int answered;
    int slot;                         /* latency histogram slot: route index, or static/unmatched */
    /* waiting (http_wait): the handler runs again on the same request */
    int calls;                        /* the handler's runs before this one */
    int64_t keep[4];                  /* the handler's own state across runs */
    int woken;                        /* this run follows an http_wake of its own id (not its time, not a wake of all) */
    /* offloaded (http_offload): the work, and its answer once done */
    void (*off_fn)(struct server *srv, struct http_req *req, struct http_res *res);
    struct http_res *off_res;
    struct http_req *off_next;
    /* parked: owned by the daemon's park list while suspended */
    struct http_daemon *daemon;
    int parked;
    int park_count;                   /* times parked */
    int park_topic;
    int64_t park_id, park_due_ms;
    size_t park_heap;                 /* its index in the daemon's heap of due times */
    int watch_topic;                  /* http_wait_watch in this run: what it watches, */
    int64_t watch_id;
    uint64_t watch_seq, watch_topic_seq; /* and the wake counts it saw */
    struct http_req *park_next, *park_prev;   /* its wake bucket: same hash of (topic, id) */
    struct http_req *topic_next, *topic_prev; /* every parked request of its topic */
} http_req;

typedef struct http_res {
    int status;
    char *body;                       /* heap, owned; NULL = empty */
    size_t len;
    const char *content_type;
    char location[2048];              /* Location header when non-empty (a sign-in's redirect to
                                       * the provider carries state, nonce and PKCE) */
    char disposition[256];            /* Content-Disposition when non-empty */
    char etag[80];                    /* X-Checksum-Sha256 when non-empty */
    char xhdr_name[32];               /* one more header when non-empty */
    char xhdr_value[256];             /* (a Set-Cookie with its attributes fits) */
    int retry_after_s;                /* > 0: a Retry-After header */
    int fd;                           /* >= 0: send this file (ownership passes) */
    uint64_t fd_size;
    /* Streaming (server-sent events, long bodies): MHD calls stream(cls, pos,
     * buf, max) until it returns MHD_CONTENT_READER_END_OF_STREAM. */
    MHD_ContentReaderCallback stream;
    void *stream_cls;
    MHD_ContentReaderFreeCallback stream_free;
    /* A response built by the caller (server/proxy.c), sent as it is with
     * status: none of the fields above, none of the headers the daemon adds
     * to its own answers. Ownership passes. */
    struct MHD_Response *raw;
    /* http_offload: no answer yet; run this on the offload thread */
    void (*offload)(struct server *srv, struct http_req *req, struct http_res *res);
    /* http_defer: no answer yet; another thread gives it (http_resume) */
    int deferred;
    /* http_wait: no answer yet; run the handler again within wait_ms */
    int wait_ms;
    int wait_topic;
    int64_t wait_id;
} http_res;

typedef void (*http_handler)(struct server *srv, http_req *req, http_res *res);

typedef struct route {
    const char *method;               /* "GET", ...; "*": any method */
    const char *pattern;              /* "/api/v1/jobs/{id}"; NULL ends a table. A last
                                       * segment "{x*}" takes the rest of the path
                                       * ("/proxy/{rest*}" matches "/proxy/" and
                                       * "/proxy/a/b?q", not "/proxy"): req->rest */
    http_handler handler;
    unsigned allow;                   /* ALLOW_* mask; ALLOW_NONE = public */
    size_t max_body;                  /* 0 = HTTP_BODY_DEFAULT; HTTP_BODY_CONTEXT: the
                                       * server's option (413 field "body", in MiB) */
    team_role role;                   /* the role a team's principal needs (ALLOW_TEAM);
                                       * ROLE_NONE: a viewer for GET/HEAD, else a member.
                                       * A route taking ALLOW_PERSON checks roles itself. */
} route;

typedef struct http_daemon http_daemon;

/* Starts listening on host:port (port 0 = any free port) with the given
 * route tables (a NULL-terminated list of tables). *port_out gets the bound
 * port. With tls_cert_pem and tls_key_pem (PEM text, copied) it serves
 * HTTPS only (libmicrohttpd over GnuTLS, the protocols and ciphers of
 * server/https.h's HTTPS_PRIORITIES): a plain HTTP request gets no answer;
 * one process serves HTTPS from one daemon at a time. Returns NULL with a
 * message in err on failure. The pool has TRAINYARD_HTTP_THREADS threads
 * (default: four a core, at least 4).
 *
 * Every handler is handed srv, which the daemon never looks into: it looks
 * bearer tokens up in d and bounds an HTTP_BODY_CONTEXT route's body at
 * context_max_mb MiB. */
http_daemon *http_start(struct server *srv, db *d, long context_max_mb, const char *host, int port,
                        const route *const *tables,
                        const char *tls_cert_pem, const char *tls_key_pem, int *port_out, char *err,
                        size_t errlen);

/* Every handshake after this is handed cert_pem (PEM, the chain after it)
 * and key_pem; connections already made keep theirs; the daemon goes on
 * (no restart, nothing dropped). 0, or -1 with err (a pair that does not
 * parse or match, or a daemon that serves plain HTTP): the one served
 * before stays. */
int http_tls_replace(http_daemon *h, const char *cert_pem, const char *key_pem, char *err, size_t errlen);

void http_stop(http_daemon *h);

/* ---------------------------------------------------------------- waiting */
/* What a parked request waits for; http_wake(h, topic, id) resumes it. */
enum {
    HTTP_WAKE_NONE = 0,               /* time only */
    HTTP_WAKE_NODE,                   /* a node's assignments (id: node) */
    HTTP_WAKE_RDV,                    /* a job's rendezvous keys (id: job) */
    HTTP_WAKE_STREAM,                 /* a stream's data (id: the stream's own, server/proxy.c) */
    HTTP_WAKE_EXEC,                   /* a shell's session (id: the session's own, api/exec_api.c) */
    HTTP_WAKE_NTOPICS
};

/* In a handler: answer nothing yet, and run the handler again on this
 * request within ms milliseconds, or at once when http_wake(topic, id) is
 * called. The connection is suspended meanwhile: no thread waits.
 * req->calls counts the handler's earlier runs; req->keep carries its state.
 * If the daemon is stopping, the request is answered 503 instead. */
/* req->woken tells a run that follows http_wake(topic, its id) from one
 * that follows its time or a wake of the whole topic (id 0). */
void http_wait(http_req *req, http_res *res, int ms, int topic, int64_t id);

/* In a stream reader (http_res.stream) with nothing to send yet: parks the
 * request (as http_wait) and returns 0 for the reader to return; the
 * reader is called again within ms. Returns MHD_CONTENT_READER_END_OF_STREAM
 * when the daemon is stopping. */
ssize_t http_stream_wait(http_req *req, int ms);

/* In a stream reader that watches (topic, id) (http_wait_watch before it
 * looked for data): parks the request for at most ms, resumed at once by
 * http_wake(topic, id). 0: parked (the reader returns 0); 1: a wake came
 * since the watch, not parked: look again now; -1: the daemon is stopping
 * (the reader ends its stream). */
int http_stream_park(http_req *req, int ms, int topic, int64_t id);

/* 1 once http_stop has begun on req's daemon (a thread that answers a
 * deferred request looks, and answers 503 rather than wait on). */
int http_stopping(const http_req *req);

/* 1 when the daemon serves HTTPS (for X-Forwarded-Proto). */
int http_is_tls(const http_req *req);

/* In a handler that may http_wait on (topic, id): call it before looking
 * at what it waits for. A wake of (topic, id), or of the whole topic, that
 * comes after this call and before the request parks is not lost: the
 * handler runs again at once (req->woken set) instead of parking. Without
 * it, such a wake finds nothing parked and the request waits its time. */
void http_wait_watch(http_req *req, int topic, int64_t id);

/* Resumes at once every parked request waiting on topic and id (id 0: any
 * id of the topic). Safe from any thread; h may be NULL. */
void http_wake(http_daemon *h, int topic, int64_t id);
/* The same for each of n ids, under one lock. */
void http_wake_many(http_daemon *h, int topic, const int64_t *ids, int n);

/* For a handler whose work blocks (disk writes and fsyncs: a checkpoint
 * upload): call it instead of answering, and fn runs with the same req and
 * a fresh res on the daemon's offload thread while the connection is
 * suspended; what fn answers is sent when it returns. The pool thread
 * serves its other connections meanwhile. */
void http_offload(http_req *req, http_res *res, http_handler fn);

/* For a handler whose answer another thread gives once its work is done
 * (a submission waiting for its group commit, storage/db.h db_group_add):
 * suspends the connection and returns 0; the handler hands req on and
 * returns without answering, and the pool thread serves its other
 * connections meanwhile. That thread builds the answer in http_res_new()
 * and calls http_resume(req, answer) exactly once; req stays valid until
 * then and must not be touched after. -1 when the daemon is stopping:
 * nothing is suspended, answer now. http_stop waits for every deferred
 * request's answer. */
int http_defer(http_req *req, http_res *res);
http_res *http_res_new(void);
void http_resume(http_req *req, http_res *answer);

/* ---------------------------------------------------------------- upgrades
 * A 101 answer hands the connection over to the caller's code (a WebSocket
 * relay): the daemon no longer reads or writes it, and no timeout applies. */
typedef struct http_upgrade http_upgrade;
typedef struct http_upgrade_ops {
    /* The 101 is sent: fd is the client's socket (non-blocking; never close
     * it: http_upgrade_close does), extra the bytes the client sent past its
     * request. Runs on a pool thread: hand the work on and return. Called
     * once; with u NULL and fd -1 when the connection ended before the
     * upgrade (the client left, the daemon stopped, the 101 was refused). */
    void (*start)(void *cls, http_upgrade *u, int fd, const char *extra, size_t extra_len);
    /* http_stop began: the owner calls http_upgrade_close soon (http_stop
     * waits 2 s for every upgraded connection). Any thread; may come before
     * start returns; must not block. */
    void (*stop)(void *cls);
} http_upgrade_ops;

/* A 101 Switching Protocols response for req (the caller adds its headers:
 * Connection must hold "upgrade", and Upgrade is required), for res->raw
 * with res->status 101. ops and cls must live until start has been called
 * and, when u was not NULL, until http_upgrade_close returns. NULL when
 * libmicrohttpd cannot (no upgrade support). */
struct MHD_Response *http_upgrade_response(http_req *req, const http_upgrade_ops *ops, void *cls);

/* Ends an upgraded connection (closes the client's socket): once, from any
 * thread; u is not to be used after. */
void http_upgrade_close(http_upgrade *u);

/* Connections upgraded and not closed yet. */
int http_upgraded_count(http_daemon *h);

/* ---------------------------------------------------------------- grants
 * A browser tab cannot send Authorization to an app's pages behind the
 * proxy, which may be served on an origin of their own (server
 * --apps-listen). A grant lets the credential of a request (its bearer
 * token or its session cookie) stand for it there:
 *   - http_grant_ticket makes a one-time ticket (into ticket) for the
 *     credential of req, good under path_prefix (at most 128 bytes);
 *   - a GET under that prefix with ?trainyard_grant=TICKET, on any daemon
 *     of the process, within a minute, once, is answered 303 to the same
 *     target without it and a random cookie HTTP_GRANT_COOKIE with
 *     Path=path_prefix (HttpOnly, SameSite=Lax, Secure over TLS);
 *   - a later request under that prefix with the cookie and no
 *     Authorization is authenticated as if it carried the credential
 *     itself (a revoked token, a removed member or an ended session is
 *     refused at once).
 * Grants live in the process's memory for ttl_ms (a restart ends them)
 * and are never written anywhere. 0, or -1 (no credential on req). */
#define HTTP_GRANT_PARAM "trainyard_grant"
#define HTTP_GRANT_MAX_AGE_S (12 * 3600)
int http_grant_ticket(http_req *req, const char *path_prefix, int64_t ttl_ms, char ticket[48]);

/* A daemon for a job's apps only (server --apps-listen): it serves no
 * static file (the dashboard is not there) and takes no session cookie
 * (only bearer tokens and grants): a page of one job's app cannot act as
 * the person on another job's. */
void http_set_apps_only(http_daemon *h);

/* Requests whose path is under prefix and that carry no Authorization
 * header (a browser's: a page, a cookie) are answered 307 to base followed
 * by their target, before anything else (the proxy's paths, moved to the
 * apps' origin, so that no app's page ever runs at the dashboard's). A
 * request with a bearer token is served here as before. 0, or -1 when
 * either is too long. */
int http_set_moved(http_daemon *h, const char *prefix, const char *base);

/* A read that is an act (opening a shell): its audit row is written when
 * it is answered, as a change's is. */
void http_audit_read(http_req *req);

/* Appends the request latency histogram by route (Prometheus text format,
 * trainyard_http_request_duration_seconds) to out: 0, or -1 when out is full. */
int http_latency_write(http_daemon *h, buf *out);

/* ---------------------------------------------------------------- replies */
/* Answers status with the JSON value (ownership passes; NULL = {}). */
void http_json(http_res *res, int status, cJSON *value);

/* Answers {"error": {"code", "message", "field"}}; field may be NULL. */
void http_error(http_res *res, int status, const char *code, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* http_error with "limit_bytes": limit in the error object (a 413's limit,
 * or a quota's). */
void http_error_limit(http_res *res, int status, const char *code, const char *field, int64_t limit,
                      const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* Answers a plain body (copied) with a content type. */
void http_text(http_res *res, int status, const char *content_type, const char *text, size_t len);

/* ---------------------------------------------------------------- requests */
/* A query-string argument, or NULL. */
const char *http_query(http_req *req, const char *key);

/* A request header, or NULL. */
const char *http_header(http_req *req, const char *name);

/* 503 unavailable: the database did not answer the request's statement
 * (PostgreSQL's host and reason, or this server fenced, when the store
 * says; else "busy or unavailable"). */
void http_db_unavailable(http_res *res);

/* A cookie of the request, or NULL. */
const char *http_cookie(http_req *req, const char *name);

/* The peer's address as text ("-" when unknown). */
void http_client_addr(const http_req *req, char *out, size_t outlen);

/* The role a request of method on route r asks of a team principal (see
 * route.role: its own, else a viewer for GET and HEAD, a member for the
 * rest; a route of any method asks what the request's method would). */
team_role http_route_role(const route *r, const char *method);

/* 0 when req's principal holds at least `need` in team_id (the admin
 * token always; a team's token in its own team; a person by their
 * membership, read now); else -1 after answering 403 naming the role it
 * needs (or 503). */
int http_team_role_check(db *d, http_req *req, http_res *res, int64_t team_id, const char *team, team_role need);

/* 0 when the Content-Type may carry JSON (none, application/json or
 * +json, or curl's default application/x-www-form-urlencoded); else -1
 * after answering 415 unsupported_media_type. */
int http_require_json(http_req *req, http_res *res);

/* Parses the body as a JSON object; on failure answers 400 bad_json (or 415
 * for a body whose Content-Type is not JSON) and returns NULL. */
cJSON *http_body_json(http_req *req, http_res *res);

/* Parses path parameter i as a positive id; on failure answers 404
 * not_found naming `what` and returns -1. */
int64_t http_param_id(http_req *req, http_res *res, int i, const char *what);

/* Parses a non-negative integer query argument in [lo, hi] (default def when
 * absent); on failure answers 400 naming the argument and returns -1. */
int http_query_long(http_req *req, http_res *res, const char *key, long lo, long hi, long def,
                    long *out);

/* "user:NAME" (a person), "team:NAME (service)" (a team's token),
 * "admin", "node:ID", "join", "task:job-JOB" for events. */
void http_actor(const http_req *req, char *out, size_t outlen);

/* The access log: one line a request, in the Common Log Format with the
 * actor as the user and the time taken in milliseconds at the end,
 * appended to path (created 0600). 0, or -1 (errno). NULL closes it. The
 * console shows requests at debug level only (5xx and early closes at warn). */
int http_access_log_open(const char *path);

/* Failed authentications one client address may make in a minute before it
 * is answered 429 with Retry-After (default 100; 0: no limit). */
void http_set_auth_fail_limit(int per_minute);

#endif
