/* http.c - libmicrohttpd daemon, route matching, body limits, bearer-token
 * authentication and JSON replies. See http.h.
 *
 * Threading: libmicrohttpd's pool of epoll threads (a few, each serving
 * many connections), so a burst of requests does not become dozens of
 * runnable threads competing with the trainers for the cores. Handlers do
 * not block: the agents' long-polls, the rendezvous waits and the event
 * streams park their request (MHD_suspend_connection) on the daemon's park
 * list, and one timer thread resumes each when its time is up; http_wake
 * resumes them at once when what they wait for happens. SQLite connections
 * are pooled across threads (storage/db.c). docs/server.md, "Threading",
 * records the measurements behind this choice. */
#include "http.h"
#include "https.h"
#include "static.h"
#include "../common/json_out.h"
#include "../storage/audit.h"
#include "../storage/users.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <semaphore.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* Wake buckets of parked requests (a power of two). */
#define PARK_NB 4096

/* The largest JSON answer (a page of metrics or jobs is far below it). */
#define HTTP_JSON_MAX ((size_t)256 << 20)

/* Latency histogram buckets (upper bounds, seconds); one more for +Inf. */
static const double g_le[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                              0.25,   0.5,   1,      2.5,   5,     10,   30,    60};
#define HIST_NB (sizeof g_le / sizeof g_le[0])

typedef struct http_hist {
    uint64_t bucket[HIST_NB + 1];     /* non-cumulative counts; the last is +Inf */
    uint64_t count;
    uint64_t sum_us;
} http_hist;

struct http_daemon {
    struct MHD_Daemon *mhd;
    struct server *srv;               /* handed to every handler, never looked into */
    db *db;                           /* tokens are looked up here; a full disk is told */
    long context_max_mb;              /* an HTTP_BODY_CONTEXT route's body limit */
    const route *const *tables;
    int nroutes;                      /* slots 0..nroutes-1: routes in table order */
    int slot_static, slot_unmatched;  /* nroutes, nroutes + 1 */
    const route **slot_route;         /* (nroutes) */
    http_hist *hist;                  /* (nroutes + 2), updated with atomics */
    /* parked requests (suspended connections), resumed by park_main when
     * due and by http_wake when what they wait for happens. Each is in a
     * binary min-heap of due times (park_main looks at its root only) and,
     * unless it waits for time only, in its wake bucket (the hash of topic
     * and id: a wake of one node looks at the few requests there) and in
     * its topic's list (a wake of a whole topic). No operation walks every
     * parked request: with thousands of agents, each holding a parked
     * long-poll, a walk per due time or per woken node was most of the
     * server's CPU (docs/server.md, "Parking"). */
    pthread_mutex_t park_mu;
    pthread_cond_t park_cv;           /* CLOCK_MONOTONIC */
    pthread_t park_thread;
    int park_started;
    int closing;                      /* http_stop began: nothing parks any more */
    http_req **park_heap;             /* (park_cap) min-heap on park_due_ms */
    size_t park_n, park_cap;          /* park_cap: the connection limit (one request a connection) */
    http_req *park_bucket[PARK_NB];   /* through park_next/prev */
    http_req *park_topic[HTTP_WAKE_NTOPICS]; /* through topic_next/prev */
    uint64_t wake_seq[PARK_NB];       /* wakes of a bucket's ids, for http_wait_watch */
    uint64_t wake_topic_seq[HTTP_WAKE_NTOPICS]; /* wakes of a whole topic */
    int64_t park_next_due;            /* when park_main wakes next (mono ms) */
    int apps_only;                    /* http_set_apps_only */
    char moved_prefix[64];            /* http_set_moved: paths under it are answered 307 */
    char moved_base[256];             /* to this origin */
    int waiters;                      /* requests that parked and are not answered yet (atomic) */
    unsigned max_conns;               /* connections held at once (http_conn_limit) */
    /* offloaded requests (http_offload): suspended, their work done by off_main */
    pthread_mutex_t off_mu;
    pthread_cond_t off_cv;
    pthread_t off_thread;
    int off_started, off_closing;
    http_req *off_head, *off_tail;    /* queue through off_next */
    int deferred;                     /* under off_mu: http_defer'd, not resumed yet */
    int tls;                          /* serves HTTPS: the certificate is https.h's */
    /* upgraded connections (http_upgrade_response), until http_upgrade_close */
    pthread_mutex_t up_mu;
    struct http_upgrade *up_head;     /* started, not closed: through next/prev */
    int up_n;
    int up_closing;                   /* http_stop told them */
};

/* An upgrade: made with its response, started once the 101 is sent, closed
 * by its owner; freed when its request ends. */
struct http_upgrade {
    http_daemon *h;
    const http_upgrade_ops *ops;
    void *cls;
    struct MHD_UpgradeResponseHandle *urh;
    int state;                        /* 0: made; 1: started (linked); 2: closed */
    struct http_upgrade *next, *prev;
};

static int64_t now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* ---------------------------------------------------------------- replies */

static void res_set_body(http_res *res, int status, const char *ctype, char *body, size_t len) {
    free(res->body);
    res->status = status;
    res->content_type = ctype;
    res->body = body;
    res->len = len;
}

void http_json(http_res *res, int status, cJSON *value) {
    if (!value) value = cJSON_CreateObject();
    buf b;
    buf_init(&b, HTTP_JSON_MAX);
    int rc = value ? json_write(&b, value) : -1;
    cJSON_Delete(value);
    /* a newline for curl users */
    if (rc < 0 || buf_append(&b, "\n", 1) < 0) {
        buf_release(&b);
        http_error(res, 500, "internal", NULL, "cannot encode the response");
        return;
    }
    size_t n = 0;
    char *s = buf_detach(&b, &n); /* MHD frees it with free() */
    res_set_body(res, status, "application/json", s, n);
}

/* The error object, with "limit_bytes" when limit >= 0. */
static void error_answer(http_res *res, int status, const char *code, const char *field, int64_t limit,
                         const char *fmt, va_list ap) {
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    cJSON *root = cJSON_CreateObject();
    cJSON *e = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(e, "code", code);
    cJSON_AddStringToObject(e, "message", msg);
    if (field) cJSON_AddStringToObject(e, "field", field);
    else cJSON_AddNullToObject(e, "field");
    if (limit >= 0) cJSON_AddNumberToObject(e, "limit_bytes", (double)limit);
    buf b;
    buf_init(&b, HTTP_JSON_MAX); /* a field may name a long key of the caller's */
    int rc = json_write(&b, root);
    cJSON_Delete(root);
    if (rc < 0 || buf_append(&b, "\n", 1) < 0) {
        buf_release(&b);
        static const char fallback[] = "{\"error\":{\"code\":\"internal\",\"message\":\"out of memory\",\"field\":null}}\n";
        res_set_body(res, 500, "application/json", xstrdup(fallback), sizeof fallback - 1);
        return;
    }
    size_t n = 0;
    char *s = buf_detach(&b, &n);
    res_set_body(res, status, "application/json", s, n);
}

void http_error(http_res *res, int status, const char *code, const char *field, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    error_answer(res, status, code, field, -1, fmt, ap);
    va_end(ap);
}

void http_error_limit(http_res *res, int status, const char *code, const char *field, int64_t limit,
                      const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    error_answer(res, status, code, field, limit < 0 ? 0 : limit, fmt, ap);
    va_end(ap);
}

void http_text(http_res *res, int status, const char *content_type, const char *text, size_t len) {
    char *b = xmalloc(len + 1);
    memcpy(b, text, len);
    b[len] = '\0';
    res_set_body(res, status, content_type, b, len);
}

/* ---------------------------------------------------------------- requests */

const char *http_query(http_req *req, const char *key) {
    return MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, key);
}

const char *http_header(http_req *req, const char *name) {
    return MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, name);
}

const char *http_cookie(http_req *req, const char *name) {
    return MHD_lookup_connection_value(req->conn, MHD_COOKIE_KIND, name);
}

/* 1 when a request's Content-Type may carry a JSON body: none, JSON
 * (application/json, application/...+json, with parameters), or curl's
 * default for --data (application/x-www-form-urlencoded, taken as the
 * JSON text it holds: `curl -d @job.json` works without -H). */
static int json_content_type(const char *ct) {
    if (!ct) return 1;
    while (*ct == ' ' || *ct == '\t') ct++;
    size_t n = strcspn(ct, "; \t");
    if (n == 0) return 1;
    if (n == 16 && strncasecmp(ct, "application/json", 16) == 0) return 1;
    if (n == 33 && strncasecmp(ct, "application/x-www-form-urlencoded", 33) == 0) return 1;
    if (n > 17 && strncasecmp(ct, "application/", 12) == 0 && strncasecmp(ct + n - 5, "+json", 5) == 0) return 1;
    return 0;
}

int http_require_json(http_req *req, http_res *res) {
    const char *ct = http_header(req, MHD_HTTP_HEADER_CONTENT_TYPE);
    if (json_content_type(ct)) return 0;
    char shown[64];
    snprintf(shown, sizeof shown, "%s", ct);
    for (char *c = shown; *c; c++)
        if (!isprint((unsigned char)*c)) *c = '?';
    http_error(res, 415, "unsupported_media_type", NULL,
               "the body must be JSON (Content-Type: application/json), not %s", shown);
    return -1;
}

cJSON *http_body_json(http_req *req, http_res *res) {
    if (http_require_json(req, res) < 0) return NULL;
    if (req->body.len == 0) {
        http_error(res, 400, "bad_json", NULL, "the request body is empty; a JSON object was expected");
        return NULL;
    }
    const char *end = NULL;
    cJSON *v = cJSON_ParseWithLengthOpts(req->body.data, req->body.len, &end, 0);
    if (!v) {
        size_t off = end && end >= req->body.data ? (size_t)(end - req->body.data) : 0;
        http_error(res, 400, "bad_json", NULL, "the body is not valid JSON (near byte %zu)", off);
        return NULL;
    }
    if (!cJSON_IsObject(v)) {
        cJSON_Delete(v);
        http_error(res, 400, "bad_json", NULL, "the body must be a JSON object");
        return NULL;
    }
    return v;
}

int64_t http_param_id(http_req *req, http_res *res, int i, const char *what) {
    long v;
    if (i >= req->nparams || parse_long(req->params[i], 1, (long)INT64_MAX, &v) < 0) {
        http_error(res, 404, "not_found", NULL, "no %s '%s'", what, i < req->nparams ? req->params[i] : "");
        return -1;
    }
    return v;
}

int http_query_long(http_req *req, http_res *res, const char *key, long lo, long hi, long def, long *out) {
    const char *s = http_query(req, key);
    if (!s) {
        *out = def;
        return 0;
    }
    if (parse_long(s, lo, hi, out) < 0) {
        http_error(res, 400, "invalid_value", key, "query argument '%s' must be an integer between %ld and %ld",
                   key, lo, hi);
        return -1;
    }
    return 0;
}

void http_actor(const http_req *req, char *out, size_t outlen) {
    if (!req->authed) {
        snprintf(out, outlen, "anonymous");
        return;
    }
    if (req->who.user_id > 0) {
        snprintf(out, outlen, "user:%s", req->who.user);
        return;
    }
    switch (req->who.kind) {
    case TOKEN_ADMIN: snprintf(out, outlen, "admin"); break;
    case TOKEN_USER: snprintf(out, outlen, "user:%s", req->who.user); break;
    case TOKEN_TEAM:
        if (req->who.cluster_admin) snprintf(out, outlen, "admin");
        else snprintf(out, outlen, "team:%s (service)", req->who.team);
        break;
    case TOKEN_NODE: snprintf(out, outlen, "node:%lld", (long long)req->who.node_id); break;
    case TOKEN_JOIN: snprintf(out, outlen, "join"); break;
    case TOKEN_TASK: snprintf(out, outlen, "task:job-%lld", (long long)req->who.job_id); break;
    }
}

/* ---------------------------------------------------------------- routing */

/* Matches path against pattern, capturing {x} segments, and a last {x*}
 * segment as the rest of the path (req->rest). 1 on a match. */
static int route_match(const char *pattern, const char *path, http_req *req) {
    const char *p = pattern, *s = path;
    int np = 0;
    if (req) req->rest = NULL;
    while (*p && *s) {
        if (*p != '/' || *s != '/') return 0;
        p++;
        s++;
        const char *pe = strchr(p, '/');
        const char *se = strchr(s, '/');
        size_t pl = pe ? (size_t)(pe - p) : strlen(p);
        size_t sl = se ? (size_t)(se - s) : strlen(s);
        if (!pe && pl >= 3 && p[0] == '{' && p[pl - 2] == '*' && p[pl - 1] == '}') {
            if (req) {
                req->rest = s;
                req->nparams = np;
            }
            return 1; /* the rest, slashes and all, possibly empty */
        }
        if (pl >= 2 && p[0] == '{' && p[pl - 1] == '}') {
            if (sl == 0 || sl >= HTTP_PARAM_MAX || np >= HTTP_MAX_PARAMS) return 0;
            if (req) {
                memcpy(req->params[np], s, sl);
                req->params[np][sl] = '\0';
            }
            np++;
        } else if (pl != sl || memcmp(p, s, pl) != 0) {
            return 0;
        }
        p += pl;
        s += sl;
    }
    if (*p || *s) return 0;
    if (req) req->nparams = np;
    return 1;
}

/* Finds the route for method+path; *slot gets its index in table order.
 * *path_known tells a 405 from a 404. */
static const route *route_find(const route *const *tables, const char *method, const char *path,
                               http_req *req, int *path_known, int *slot) {
    *path_known = 0;
    int i = 0;
    for (const route *const *t = tables; *t; t++) {
        for (const route *r = *t; r->pattern; r++, i++) {
            if (!route_match(r->pattern, path, NULL)) continue;
            *path_known = 1;
            if (strcmp(r->method, method) == 0 || strcmp(r->method, "*") == 0) {
                route_match(r->pattern, path, req);
                *slot = i;
                return r;
            }
        }
    }
    return NULL;
}

static void allowed_methods(const route *const *tables, const char *path, char *out, size_t outlen) {
    out[0] = '\0';
    size_t used = 0;
    for (const route *const *t = tables; *t; t++)
        for (const route *r = *t; r->pattern; r++)
            if (route_match(r->pattern, path, NULL)) {
                int n = snprintf(out + used, outlen - used, "%s%s", used ? ", " : "", r->method);
                if (n < 0 || (size_t)n >= outlen - used) return;
                used += (size_t)n;
            }
}

/* ---------------------------------------------------------------- MHD glue */

static enum MHD_Result queue(http_req *req, http_res *res) {
    struct MHD_Response *r;
    if (res->raw) { /* the caller's own response (server/proxy.c): as it is */
        r = res->raw;
        res->raw = NULL;
        req->status = res->status;
        req->sent = 0;
        req->answered = 1;
        enum MHD_Result ret = MHD_queue_response(req->conn, (unsigned)res->status, r);
        MHD_destroy_response(r);
        return ret;
    }
    if (res->fd >= 0) {
        r = MHD_create_response_from_fd64(res->fd_size, res->fd);
        res->fd = -1;
    } else if (res->stream) {
        r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, res->stream, res->stream_cls,
                                              res->stream_free);
        res->stream = NULL;
    } else {
        r = MHD_create_response_from_buffer(res->len, res->body ? res->body : (void *)"",
                                            res->body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
        res->body = NULL;
    }
    if (!r) return MHD_NO;
    if (res->content_type) MHD_add_response_header(r, "Content-Type", res->content_type);
    if (res->location[0]) MHD_add_response_header(r, "Location", res->location);
    if (res->disposition[0]) MHD_add_response_header(r, "Content-Disposition", res->disposition);
    if (res->etag[0]) MHD_add_response_header(r, "X-Checksum-Sha256", res->etag);
    if (res->xhdr_name[0]) MHD_add_response_header(r, res->xhdr_name, res->xhdr_value);
    if (res->retry_after_s > 0) {
        char ra[16];
        snprintf(ra, sizeof ra, "%d", res->retry_after_s);
        MHD_add_response_header(r, "Retry-After", ra);
    }
    MHD_add_response_header(r, "Cache-Control", "no-store");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    req->status = res->status;
    req->sent = res->len;
    req->answered = 1;
    enum MHD_Result ret = MHD_queue_response(req->conn, (unsigned)res->status, r);
    MHD_destroy_response(r);
    return ret;
}

static void res_init(http_res *res) {
    memset(res, 0, sizeof *res);
    res->fd = -1;
    res->status = 200;
}

static void res_release(http_res *res) {
    free(res->body);
    if (res->fd >= 0) close(res->fd);
    if (res->stream && res->stream_free) res->stream_free(res->stream_cls);
    if (res->raw) MHD_destroy_response(res->raw);
}

static enum MHD_Result answer_now(http_req *req, http_res *res) {
    enum MHD_Result ret = queue(req, res);
    res_release(res);
    return ret;
}

/* ---------------------------------------------------------------- failed authentications
 * Counted per client address in a fixed one-minute window. Past the limit
 * (http_set_auth_fail_limit, `--auth-fail-limit`) the address is answered
 * 429 with Retry-After, without a lookup, until its window ends: a guesser
 * learns nothing more. A token that authenticated lately (from anywhere) is
 * still let through from that address, so an agent or a user beside the
 * guesser (one node's tasks and its agent share an address) is not locked
 * out; other addresses are never slowed. */

#define AF_SLOTS 4096
#define AF_PROBE 8
#define AF_WINDOW_MS 60000
#define GOOD_SLOTS 4096
#define GOOD_MS (15 * 60 * 1000)

typedef struct af_slot {
    uint64_t key;                     /* a hash of the address; 0: empty */
    int64_t window;                   /* start of its minute (ms) */
    int fails;
} af_slot;

static af_slot g_af[AF_SLOTS];
static uint64_t g_good[GOOD_SLOTS];   /* keyed hashes of tokens that authenticated ... */
static int64_t g_good_at[GOOD_SLOTS]; /* ... and when (both read and written atomically, without the lock) */
static pthread_mutex_t g_af_mu = PTHREAD_MUTEX_INITIALIZER; /* guards g_af */
static int g_af_limit = 100;
static unsigned char g_af_seed[16];
static pthread_once_t g_af_once = PTHREAD_ONCE_INIT;

static void af_seed(void) {
    if (getrandom(g_af_seed, sizeof g_af_seed, 0) != (ssize_t)sizeof g_af_seed)
        memset(g_af_seed, 0x5c, sizeof g_af_seed); /* still a hash; only less unguessable */
}

void http_set_auth_fail_limit(int per_minute) { g_af_limit = per_minute; }

static uint64_t af_hash(const void *p, size_t n) {
    pthread_once(&g_af_once, af_seed);
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < sizeof g_af_seed; i++) h = (h ^ g_af_seed[i]) * 0x100000001b3ULL;
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ULL;
    return h ? h : 1;
}

static uint64_t addr_key(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (!ci || !ci->client_addr) return 0;
    const struct sockaddr *sa = ci->client_addr;
    if (sa->sa_family == AF_INET)
        return af_hash(&((const struct sockaddr_in *)(const void *)sa)->sin_addr, 4);
    if (sa->sa_family == AF_INET6) /* a /64: one host's addresses are one client */
        return af_hash(&((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr, 8);
    return 0;
}

/* The address's slot (made when missing, evicting the stalest of its
 * probes); call with g_af_mu held. */
static af_slot *af_find(uint64_t key, int64_t now) {
    af_slot *stalest = NULL;
    for (int i = 0; i < AF_PROBE; i++) {
        af_slot *s = &g_af[(key + (uint64_t)i) % AF_SLOTS];
        if (s->key == key) return s;
        if (!stalest || s->window < stalest->window) stalest = s;
    }
    *stalest = (af_slot){key, now, 0};
    return stalest;
}

/* ms until the address may try again, or 0 */
/* The latest end of a block of any address (ms; 0: none yet): while it is
 * past, as nearly always, a request takes no lock and looks at no slot. */
static int64_t g_af_blocks_until;

/* ms until the address may try again, or 0 */
static int64_t af_blocked(struct MHD_Connection *conn, uint64_t tok, int64_t now) {
    if (g_af_limit <= 0 || now >= __atomic_load_n(&g_af_blocks_until, __ATOMIC_RELAXED)) return 0;
    uint64_t key = addr_key(conn);
    if (!key) return 0;
    size_t g = (size_t)(tok % GOOD_SLOTS);
    if (__atomic_load_n(&g_good[g], __ATOMIC_RELAXED) == tok &&
        now - __atomic_load_n(&g_good_at[g], __ATOMIC_RELAXED) < GOOD_MS)
        return 0; /* authenticated lately: not the guesser's */
    pthread_mutex_lock(&g_af_mu);
    int64_t wait = 0;
    af_slot *s = af_find(key, now);
    if (now - s->window >= AF_WINDOW_MS) *s = (af_slot){key, now, 0};
    if (s->fails >= g_af_limit) wait = s->window + AF_WINDOW_MS - now;
    pthread_mutex_unlock(&g_af_mu);
    return wait;
}

static void af_failed(struct MHD_Connection *conn, int64_t now) {
    uint64_t key = g_af_limit > 0 ? addr_key(conn) : 0;
    if (!key) return;
    pthread_mutex_lock(&g_af_mu);
    af_slot *s = af_find(key, now);
    if (now - s->window >= AF_WINDOW_MS) *s = (af_slot){key, now, 0};
    int fails = ++s->fails;
    int64_t until = s->window + AF_WINDOW_MS;
    pthread_mutex_unlock(&g_af_mu);
    if (fails >= g_af_limit) {
        int64_t cur = __atomic_load_n(&g_af_blocks_until, __ATOMIC_RELAXED);
        while (cur < until &&
               !__atomic_compare_exchange_n(&g_af_blocks_until, &cur, until, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
        }
    }
    if (fails == g_af_limit)
        log_warn("auth: %d failed authentications in a minute from one address: it gets 429 until the minute ends",
                 g_af_limit);
}

/* Remembers a token that authenticated: no lock, and no write at all while
 * its slot says so already (a busy client's every request would otherwise
 * write the same line of memory from every thread). */
static void af_good(uint64_t tok, int64_t now) {
    if (g_af_limit <= 0) return;
    size_t g = (size_t)(tok % GOOD_SLOTS);
    if (__atomic_load_n(&g_good[g], __ATOMIC_RELAXED) == tok &&
        now - __atomic_load_n(&g_good_at[g], __ATOMIC_RELAXED) < GOOD_MS / 2)
        return;
    __atomic_store_n(&g_good[g], tok, __ATOMIC_RELAXED);
    __atomic_store_n(&g_good_at[g], now, __ATOMIC_RELAXED);
}

static int is_read(const char *method) { return strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0; }

team_role http_route_role(const route *r, const char *method) {
    return r->role != ROLE_NONE ? r->role : is_read(method) ? ROLE_VIEWER : ROLE_MEMBER;
}

/* Who is this principal, for a refusal's message. */
static void who_text(const principal *w, char *out, size_t n) {
    if (w->user_id > 0) snprintf(out, n, "user %s", w->user);
    else if (w->kind == TOKEN_TEAM && !w->cluster_admin) snprintf(out, n, "the token of team %s", w->team);
    else snprintf(out, n, "the %s token", token_kind_name(w->kind));
}

int http_team_role_check(db *d, http_req *req, http_res *res, int64_t team_id, const char *team, team_role need) {
    const principal *w = &req->who;
    team_role have = ROLE_NONE;
    if (w->kind == TOKEN_ADMIN || w->cluster_admin) return 0;
    if (w->user_id > 0) {
        if (w->token_team > 0 && w->token_team != team_id) {
            http_error(res, 403, "forbidden", "team", "this token of user %s acts for team %s only", w->user, w->team);
            return -1;
        }
        if (members_role(d, team_id, w->user_id, &have) != STORE_OK) {
            http_db_unavailable(res);
            return -1;
        }
    } else if (w->kind == TOKEN_TEAM && w->team_id == team_id) {
        have = ROLE_ADMIN; /* a team's own token: its service account */
    }
    if (have >= need) return 0;
    char who[96];
    who_text(w, who, sizeof who);
    if (have == ROLE_NONE)
        http_error(res, 403, "forbidden", "role", "%s %s needs role %s in team %s; %s is not a member of it",
                   req->method, req->route ? req->route->pattern : req->path, role_name(need), team, who);
    else
        http_error(res, 403, "forbidden", "role", "%s %s needs role %s in team %s; %s is %s there", req->method,
                   req->route ? req->route->pattern : req->path, role_name(need), team, who, role_name(have));
    return -1;
}

/* The team a person's request acts in, and their role there: the principal
 * becomes TOKEN_TEAM with user_id set. 0, or -1 with the error in res. */
static int person_team(db *d, http_req *req, http_res *res) {
    principal *w = &req->who;
    const char *asked = http_header(req, HTTP_TEAM_HEADER);
    if (!asked || !asked[0]) asked = http_query(req, "team");
    if (asked && !asked[0]) asked = NULL;
    int64_t team_id = 0;
    char team[64] = "";
    team_role role = ROLE_NONE;
    if (w->token_team > 0) {
        if (asked && strcmp(asked, w->team) != 0) {
            http_error(res, 403, "forbidden", "team", "this token of user %s acts for team %s only, not %.64s", w->user,
                       w->team, asked);
            return -1;
        }
        team_id = w->token_team;
        snprintf(team, sizeof team, "%s", w->team);
    } else if (asked) {
        int rc = store_team_find(d, asked, &team_id);
        if (rc == STORE_ERROR) {
            http_db_unavailable(res);
            return -1;
        }
        if (rc != STORE_OK) {
            http_error(res, 403, "forbidden", "team", "user %s is not a member of team %.64s", w->user, asked);
            return -1;
        }
        snprintf(team, sizeof team, "%s", asked);
    } else {
        int rc = members_only_team(d, w->user_id, &team_id, team, &role);
        if (rc == STORE_NOT_FOUND) {
            http_error(res, 403, "forbidden", "team",
                       "user %s is in no team yet: a team admin adds them (PUT /api/v1/teams/TEAM/members/%s)",
                       w->user, w->user);
            return -1;
        }
        if (rc == STORE_CONFLICT) {
            http_error(res, 400, "missing_team", "team",
                       "user %s is in several teams: name one with the " HTTP_TEAM_HEADER " header (or ?team=)",
                       w->user);
            return -1;
        }
        if (rc != STORE_OK) {
            http_db_unavailable(res);
            return -1;
        }
    }
    if (role == ROLE_NONE && members_role(d, team_id, w->user_id, &role) != STORE_OK) {
        http_db_unavailable(res);
        return -1;
    }
    if (role == ROLE_NONE) {
        http_error(res, 403, "forbidden", "team", "user %s is not a member of team %s", w->user, team);
        return -1;
    }
    w->kind = TOKEN_TEAM;
    w->team_id = team_id;
    snprintf(w->team, sizeof w->team, "%s", team);
    w->role = role;
    return 0;
}

/* The admin token acting for the team it names (HTTP_TEAM_HEADER). */
static int admin_team(db *d, http_req *req, http_res *res, const char *asked) {
    principal *w = &req->who;
    int64_t team_id;
    int rc = store_team_find(d, asked, &team_id);
    if (rc != STORE_OK) {
        if (rc == STORE_ERROR) http_db_unavailable(res);
        else http_error(res, 404, "not_found", "team", "no team named '%.64s'", asked);
        return -1;
    }
    w->kind = TOKEN_TEAM;
    w->team_id = team_id;
    snprintf(w->team, sizeof w->team, "%s", asked);
    w->role = ROLE_ADMIN;
    w->cluster_admin = 1;
    return 0;
}

/* ---------------------------------------------------------------- grants
 * One store for the process: a ticket made through the API's daemon is
 * redeemed on the apps' daemon (server --apps-listen). */

#define GRANT_MAX 4096                /* grants held at once: the oldest goes past it */
#define GRANT_TICKET_MS 60000         /* a ticket is redeemed within a minute, once */

typedef struct grant {
    char ticket[65];                  /* sha256 of the one-time ticket; "" once redeemed */
    int64_t ticket_expires;           /* mono ms */
    char hash[65];                    /* sha256 of the cookie's value; "" until redeemed */
    char prefix[129];                 /* the path it is good under */
    char cred[300];                   /* the credential it stands for */
    int cookie;                       /* that credential is a session's cookie */
    int64_t expires;                  /* mono ms */
    struct grant *next;
} grant;

static pthread_mutex_t g_grant_mu = PTHREAD_MUTEX_INITIALIZER;
static grant *g_grants;
static int g_n_grants;

static void grant_drop(grant **pp) {
    grant *g = *pp;
    *pp = g->next;
    explicit_bzero(g, sizeof *g);
    free(g);
    g_n_grants--;
}

/* The credential of a live grant under req's path whose cookie value is
 * value (ticket 0) or whose unredeemed ticket is value (ticket 1: redeemed
 * now, its cookie's value minted into minted), into out (*cookie its kind):
 * 0, or -1 when there is none. */
static int grant_find(const http_req *req, const char *value, int ticket, char *out, size_t outlen, int *cookie,
                      char minted[48]) {
    char hash[65];
    sha256_hex(value, strnlen(value, 256), hash);
    int64_t now = mono_ms();
    int rc = -1;
    pthread_mutex_lock(&g_grant_mu);
    for (grant **pp = &g_grants; *pp;) {
        grant *g = *pp;
        if (g->expires <= now || (!g->hash[0] && g->ticket_expires <= now)) { /* stale: dropped on the way */
            grant_drop(pp);
            continue;
        }
        int hit = ticket ? g->ticket[0] && strcmp(g->ticket, hash) == 0 : g->hash[0] && strcmp(g->hash, hash) == 0;
        if (rc < 0 && hit && strncmp(req->path, g->prefix, strlen(g->prefix)) == 0 &&
            (!ticket || random_token(minted, 48) == 0)) {
            if (ticket) {
                sha256_hex(minted, strlen(minted), g->hash);
                g->ticket[0] = '\0';
            }
            snprintf(out, outlen, "%s", g->cred);
            *cookie = g->cookie;
            rc = 0;
        }
        pp = &g->next;
    }
    pthread_mutex_unlock(&g_grant_mu);
    return rc;
}

/* The bearer token, else a dashboard session's cookie (*cookie 1; not on
 * the apps' daemon), else a WebSocket's subprotocol token, else a grant's
 * credential (*granted 1: copied into gbuf): its cookie, or its ticket in
 * the query of a GET (*granted 2: the request is answered with the
 * cookie and a redirect, req->grant_cookie). */
static const char *credential(http_req *req, int *cookie, int *granted, char *gbuf, size_t gcap) {
    const char *h = http_header(req, MHD_HTTP_HEADER_AUTHORIZATION);
    *cookie = 0;
    *granted = 0;
    if (h && strncasecmp(h, "Bearer ", 7) == 0 && h[7]) {
        const char *tok = h + 7;
        while (*tok == ' ') tok++;
        return tok;
    }
    if (h) return NULL;
    const char *c = MHD_lookup_connection_value(req->conn, MHD_COOKIE_KIND, HTTP_SESSION_COOKIE);
    if (c && c[0] && !(req->daemon && req->daemon->apps_only)) {
        *cookie = 1;
        return c;
    }
    const char *sp = http_header(req, "Sec-WebSocket-Protocol");
    const char *b = sp ? strstr(sp, HTTP_WS_BEARER) : NULL;
    if (b && (b == sp || b[-1] == ' ' || b[-1] == ',')) {
        b += strlen(HTTP_WS_BEARER);
        size_t n = strcspn(b, ", \t");
        if (n == 0 || n >= gcap) return NULL;
        memcpy(gbuf, b, n);
        gbuf[n] = '\0';
        return gbuf;
    }
    const char *t = strcmp(req->method, "GET") == 0 ? http_query(req, HTTP_GRANT_PARAM) : NULL;
    if (t && t[0]) {
        char minted[48];
        if (grant_find(req, t, 1, gbuf, gcap, cookie, minted) < 0) return NULL;
        *granted = 2;
        free(req->grant_cookie);
        req->grant_cookie = xstrdup(minted);
        explicit_bzero(minted, sizeof minted);
        return gbuf;
    }
    const char *g = MHD_lookup_connection_value(req->conn, MHD_COOKIE_KIND, HTTP_GRANT_COOKIE);
    if (g && g[0] && grant_find(req, g, 0, gbuf, gcap, cookie, NULL) == 0) {
        *granted = 1;
        return gbuf;
    }
    return NULL;
}

int http_grant_ticket(http_req *req, const char *path_prefix, int64_t ttl_ms, char ticket[48]) {
    char tmp[300];
    int cookie, granted;
    const char *cred = credential(req, &cookie, &granted, tmp, sizeof tmp);
    if (!cred || strlen(cred) >= sizeof tmp || strlen(path_prefix) > 128) return -1;
    if (random_token(ticket, 48) < 0) return -1;
    grant *g = xcalloc(1, sizeof *g);
    sha256_hex(ticket, strlen(ticket), g->ticket);
    snprintf(g->prefix, sizeof g->prefix, "%s", path_prefix);
    snprintf(g->cred, sizeof g->cred, "%s", cred);
    g->cookie = cookie;
    int64_t now = mono_ms();
    g->ticket_expires = now + GRANT_TICKET_MS;
    g->expires = now + ttl_ms;
    pthread_mutex_lock(&g_grant_mu);
    if (g_n_grants >= GRANT_MAX) { /* the oldest is the list's last */
        grant **pp = &g_grants;
        while ((*pp)->next) pp = &(*pp)->next;
        grant_drop(pp);
    }
    g->next = g_grants;
    g_grants = g;
    g_n_grants++;
    pthread_mutex_unlock(&g_grant_mu);
    explicit_bzero(tmp, sizeof tmp);
    return 0;
}

/* A ticket redeemed (credential's *granted 2): 303 to the same target less
 * the ticket, with the grant's cookie (Path: the grant's prefix, which the
 * target is under), and no Referer that could carry the ticket on. */
static void answer_grant(http_req *req, http_res *res) {
    const char *t = req->raw_target ? req->raw_target : req->path;
    buf loc;
    buf_init(&loc, 4096);
    const char *q = strchr(t, '?');
    int rc = buf_append(&loc, t, q ? (size_t)(q - t) : strlen(t));
    int first = 1;
    for (const char *p = q ? q + 1 : NULL; p && *p;) {
        size_t n = strcspn(p, "&");
        size_t kl = strlen(HTTP_GRANT_PARAM);
        if (!(n >= kl && strncmp(p, HTTP_GRANT_PARAM, kl) == 0 && (p[kl] == '=' || p[kl] == '&' || !p[kl]))) {
            rc |= buf_append(&loc, first ? "?" : "&", 1) | buf_append(&loc, p, n);
            first = 0;
        }
        p += n + (p[n] == '&');
    }
    /* the cookie's path: the grant's prefix is the route's own (/proxy/jobs/ID/) */
    char path[160];
    const char *e = strchr(req->path + 1, '/');
    e = e ? strchr(e + 1, '/') : NULL;
    e = e ? strchr(e + 1, '/') : NULL;
    snprintf(path, sizeof path, "%.*s", e ? (int)(e - req->path + 1) : (int)strlen(req->path), req->path);
    if (rc || loc.len >= sizeof res->location) {
        http_error(res, 414, "uri_too_long", NULL, "the target is too long to redirect to");
    } else {
        snprintf(res->location, sizeof res->location, "%s", loc.data);
        snprintf(res->xhdr_name, sizeof res->xhdr_name, "Set-Cookie");
        int n = snprintf(res->xhdr_value, sizeof res->xhdr_value,
                         "%s=%.47s; HttpOnly; SameSite=Lax; Path=%.128s; Max-Age=%d%s", HTTP_GRANT_COOKIE,
                         req->grant_cookie, path, HTTP_GRANT_MAX_AGE_S, req->daemon->tls ? "; Secure" : "");
        if (n < 0 || (size_t)n >= sizeof res->xhdr_value) abort(); /* bounded above: cannot be */
        http_text(res, 303, "text/plain; charset=utf-8", "", 0);
    }
    buf_release(&loc);
    explicit_bzero(req->grant_cookie, strlen(req->grant_cookie));
}

/* A WebSocket handshake (Upgrade: websocket). */
static int is_websocket(http_req *req) {
    const char *u = http_header(req, "Upgrade");
    return u && strcasecmp(u, "websocket") == 0;
}

/* The request comes from a page of this server's own origin: its Origin
 * names the Host it was sent to (no Origin and no Sec-Fetch-Site: not a
 * browser, whose cross-site requests carry one of them). */
static int same_origin(http_req *req) {
    const char *o = http_header(req, "Origin"), *host = http_header(req, "Host");
    if (!o) {
        const char *sfs = http_header(req, "Sec-Fetch-Site");
        return !sfs || strcmp(sfs, "same-origin") == 0;
    }
    const char *p = strstr(o, "://");
    if (!p || !host) return 0;
    size_t scheme = (size_t)(p - o);
    int tls = req->daemon && req->daemon->tls;
    if (scheme != (tls ? 5u : 4u) || strncasecmp(o, tls ? "https" : "http", scheme) != 0) return 0;
    return strcasecmp(p + 3, host) == 0;
}

/* Authenticates the request for its route. 0 when it may go on; otherwise
 * the error is in res. */
static int authenticate(db *d, http_req *req, http_res *res) {
    const route *r = req->route;
    if ((r->allow & ~ALLOW_STANDBY) == ALLOW_NONE) return 0;
    int cookie, granted;
    char gbuf[300];
    const char *tok = credential(req, &cookie, &granted, gbuf, sizeof gbuf);
    if (!tok) {
        http_error(res, 401, "unauthorized", NULL,
                   "missing bearer token (Authorization: Bearer TOKEN), or sign in (GET /auth/login)");
        return -1;
    }
    int64_t now = now_ms();
    uint64_t tkey = af_hash(tok, strnlen(tok, 300));
    int64_t wait = af_blocked(req->conn, tkey, now);
    if (wait > 0) {
        snprintf(res->xhdr_name, sizeof res->xhdr_name, "Retry-After");
        snprintf(res->xhdr_value, sizeof res->xhdr_value, "%lld", (long long)((wait + 999) / 1000));
        http_error(res, 429, "too_many_failures", NULL,
                   "too many failed authentications from this address: retry after %lld s",
                   (long long)((wait + 999) / 1000));
        return -1;
    }
    if (strlen(tok) > 256) {
        af_failed(req->conn, now);
        http_error(res, 401, "unauthorized", NULL, "invalid token");
        return -1;
    }
    int person = strncmp(tok, USER_TOKEN_PREFIX, 4) == 0 || strncmp(tok, SESSION_PREFIX, 4) == 0;
    int rc = person ? utok_lookup(d, tok, &req->who) : store_token_lookup(d, tok, &req->who);
    /* a session only as its cookie, anything else only as a bearer token */
    if (rc == STORE_OK && (req->who.kind == TOKEN_USER ? req->who.session : 0) != cookie) rc = STORE_NOT_FOUND;
    if (rc == STORE_ERROR) {
        http_db_unavailable(res);
        return -1;
    }
    if (rc == STORE_EXPIRED) {
        char when[40] = "";
        time_t t = (time_t)(req->who.expires_at / 1000);
        struct tm tm;
        if (gmtime_r(&t, &tm)) strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
        int was_person = req->who.kind == TOKEN_USER, was_session = req->who.session;
        memset(&req->who, 0, sizeof req->who);
        af_failed(req->conn, now);
        http_error(res, 401, was_session ? "session_expired" : "token_expired", NULL, "%s expired at %s: %s",
                   was_session ? "the session" : "the token", when,
                   was_session ? "sign in again (GET /auth/login)"
                   : was_person ? "make a new one (POST /api/v1/tokens, or trainyard login)"
                                : "ask for a new one (POST /api/v1/teams/NAME/tokens)");
        return -1;
    }
    if (rc != STORE_OK) {
        memset(&req->who, 0, sizeof req->who);
        af_failed(req->conn, now);
        http_error(res, 401, "unauthorized", NULL, cookie ? "the session is unknown or ended: sign in again" : "invalid token");
        return -1;
    }
    af_good(tkey, now);
    req->authed = 1;
    principal *w = &req->who;
    int mutating = !is_read(req->method);
    /* a cookie (a session's, a grant's) is sent by the browser whatever page
     * asks: a change or a WebSocket needs proof that this origin's page asked */
    if ((cookie || granted) && (mutating || is_websocket(req)) && ((r->allow & ALLOW_ORIGIN) || is_websocket(req))) {
        if (!same_origin(req)) {
            http_error(res, 403, "csrf", "Origin",
                       "a change or a WebSocket made with a cookie must come from this server's own pages "
                       "(the Origin header names another site)");
            return -1;
        }
    } else if (w->kind == TOKEN_USER && w->session && mutating &&
               !utok_csrf_ok(tok, http_header(req, HTTP_CSRF_HEADER))) {
        http_error(res, 403, "csrf", HTTP_CSRF_HEADER,
                   "a change made with the session's cookie needs its CSRF token in the " HTTP_CSRF_HEADER
                   " header (GET /api/v1/me gives it)");
        return -1;
    }
    if (granted && mutating && !(r->allow & ALLOW_ORIGIN)) {
        http_error(res, 403, "forbidden", NULL, "a grant's cookie (%s) acts through the proxy only",
                   HTTP_GRANT_COOKIE);
        return -1;
    }
    if (w->kind == TOKEN_USER) {
        utok_touch(d, w->token_id);
        if (!w->session && !(w->scopes & (mutating ? SCOPE_WRITE : SCOPE_READ))) {
            http_error(res, 403, "forbidden", "scopes", "this token's scopes do not include %s: %s %s needs it",
                       mutating ? "write" : "read", r->method, r->pattern);
            return -1;
        }
        if (!(r->allow & ALLOW_PERSON)) {
            if (!(r->allow & ALLOW_TEAM)) {
                http_error(res, 403, "forbidden", "role", "%s %s is the cluster admin's; user %s is not", r->method,
                           r->pattern, w->user);
                return -1;
            }
            if (person_team(d, req, res) < 0) return -1;
        }
    } else if (w->kind == TOKEN_TEAM) {
        w->role = ROLE_ADMIN; /* the team's service account */
        const char *asked = http_header(req, HTTP_TEAM_HEADER);
        if (asked && asked[0] && strcmp(asked, w->team) != 0) {
            http_error(res, 403, "forbidden", "team", "the token of team %s acts for it only, not %.64s", w->team, asked);
            return -1;
        }
    } else if (w->kind == TOKEN_ADMIN) {
        const char *asked = http_header(req, HTTP_TEAM_HEADER);
        if (asked && asked[0] && (r->allow & ALLOW_TEAM) && !(r->allow & ALLOW_PERSON) &&
            admin_team(d, req, res, asked) < 0)
            return -1;
    }
    if (!(r->allow & (1u << w->kind)) && w->kind == TOKEN_JOIN) {
        http_error(res, 403, "forbidden", NULL,
                   "the join token (node.token) only registers a node (POST /api/v1/nodes); "
                   "an agent uses the token its registration returned");
        return -1;
    }
    if (!(r->allow & (1u << w->kind)) && w->kind == TOKEN_ADMIN && (r->allow & ALLOW_TEAM)) {
        /* what it touches belongs to a team (a job, a context): the admin names it */
        http_error(res, 403, "forbidden", "team",
                   "the admin token may %s %s only for a team it names in the " HTTP_TEAM_HEADER " header",
                   r->method, r->pattern);
        return -1;
    }
    if (!(r->allow & (1u << w->kind))) {
        http_error(res, 403, "forbidden", NULL, "a %s token may not %s %s", token_kind_name(w->kind), r->method,
                   r->pattern);
        return -1;
    }
    /* a route of any method ("*") asks what the request's own method would */
    team_role need = http_route_role(r, req->method);
    if (w->kind == TOKEN_TEAM && !(r->allow & ALLOW_PERSON) && w->role < need) {
        char who[96];
        who_text(w, who, sizeof who);
        http_error(res, 403, "forbidden", "role", "%s %s needs role %s in team %s; %s is %s there", req->method,
                   r->pattern, role_name(need), w->team, who, role_name(w->role));
        return -1;
    }
    if (granted == 2) { /* a ticket redeemed: its cookie, and the target without it */
        answer_grant(req, res);
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- request checks */

/* Decodes %XX escapes in place, as MHD's own unescaper does, but strictly:
 * a malformed escape, or a decoded NUL or control character, turns the
 * first byte into 0x01, which request_check refuses (400). MHD calls this
 * for the path and every query-string key and value. */
static size_t unescape_strict(void *cls, struct MHD_Connection *conn, char *s) {
    (void)cls;
    (void)conn;
    char *w = s;
    const char *r = s;
    int bad = 0;
    while (*r) {
        unsigned char c = (unsigned char)*r;
        if (c == '%') {
            if (isxdigit((unsigned char)r[1]) && isxdigit((unsigned char)r[2])) {
                char hex[3] = {r[1], r[2], 0};
                c = (unsigned char)strtoul(hex, NULL, 16);
                r += 3;
            } else {
                bad = 1;
                r++;
            }
        } else {
            r++;
        }
        if (c < 0x20 || c == 0x7f) bad = 1;
        *w++ = (char)c;
    }
    *w = '\0';
    if (bad && w > s) s[0] = '\x01';
    return (size_t)(w - s);
}

/* 1 when the bytes hold a NUL (size past the C string) or a control
 * character other than tab. */
static int has_ctl(const char *p, size_t size) {
    if (!p) return 0;
    if (strlen(p) != size) return 1;
    for (size_t i = 0; i < size; i++) {
        unsigned char c = (unsigned char)p[i];
        if ((c < 0x20 && c != '\t') || c == 0x7f) return 1;
    }
    return 0;
}

typedef struct req_scan {
    size_t bytes;                     /* keys + values + separators */
    int bad;                          /* NUL or control character */
    char bad_key[48];
    int n_length;                     /* Content-Length headers */
} req_scan;

static enum MHD_Result scan_value(void *cls, enum MHD_ValueKind kind, const char *key, size_t key_size,
                                  const char *value, size_t value_size) {
    req_scan *sc = cls;
    sc->bytes += key_size + value_size + 4;
    if (kind == MHD_HEADER_KIND && key && strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0) sc->n_length++;
    int bad = has_ctl(key, key_size) || has_ctl(value, value_size);
    /* header values keep tabs; a query argument has none */
    if (kind == MHD_GET_ARGUMENT_KIND && ((key && strchr(key, '\t')) || (value && strchr(value, '\t')))) bad = 1;
    if (bad && !sc->bad) {
        sc->bad = 1;
        size_t i = 0;
        for (; key && key[i] && i + 1 < sizeof sc->bad_key; i++)
            sc->bad_key[i] = isprint((unsigned char)key[i]) ? key[i] : '?';
        sc->bad_key[i] = '\0';
    }
    return MHD_YES;
}

/* Refuses what no route should see: a path with a NUL, a control character
 * or a malformed %-escape, a query argument likewise (400), a path and
 * query longer than HTTP_URI_MAX (414), headers larger than
 * HTTP_HEADERS_MAX (431) or holding a NUL or control character (400).
 * 0 when the request may go on; otherwise the error is in res. */
static int request_check(http_req *req, const char *url, http_res *res) {
    size_t ulen = strlen(url);
    if (has_ctl(url, ulen) || strchr(url, '\t')) {
        req->path = "(malformed path)";
        http_error(res, 400, "bad_request", NULL,
                   "the path holds a NUL byte, a control character or a malformed %%-escape");
        return -1;
    }
    req_scan q = {0};
    MHD_get_connection_values_n(req->conn, MHD_GET_ARGUMENT_KIND, scan_value, &q);
    if (ulen + q.bytes > HTTP_URI_MAX) {
        http_error(res, 414, "uri_too_long", NULL, "the path and query string are longer than the limit of %d bytes",
                   HTTP_URI_MAX);
        return -1;
    }
    if (q.bad) {
        http_error(res, 400, "bad_request", q.bad_key,
                   "query argument '%s' holds a NUL byte, a control character or a malformed %%-escape", q.bad_key);
        return -1;
    }
    req_scan h = {0};
    MHD_get_connection_values_n(req->conn, MHD_HEADER_KIND, scan_value, &h);
    if (h.bytes > HTTP_HEADERS_MAX) {
        http_error(res, 431, "headers_too_large", NULL, "the request headers are larger than the limit of %d bytes",
                   HTTP_HEADERS_MAX);
        return -1;
    }
    if (h.bad) {
        http_error(res, 400, "bad_request", NULL, "header '%s' holds a NUL byte or a control character", h.bad_key);
        return -1;
    }
    if (h.n_length > 1) {
        http_error(res, 400, "bad_request", NULL, "more than one Content-Length header");
        return -1;
    }
    return 0;
}

/* The dashboard's policy: scripts, styles, images and connections from this
 * origin only (no inline script, no outside network), never framed. */
static const char CSP[] = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
                          "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/* ---------------------------------------------------------------- parking
 * A handler that waits parks its request: the connection is suspended (MHD
 * serves the thread's other connections meanwhile) and linked on the park
 * list; park_main resumes it when its time is up, http_wake when what it
 * waits for happened. Resumed, MHD calls on_request (or the stream reader)
 * again on the same request. Lock order: park_mu, then MHD's own. */

static size_t park_hash(int topic, int64_t id) {
    uint64_t x = ((uint64_t)id * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)topic << 56);
    return (size_t)(x >> 52) & (PARK_NB - 1);
}

static void heap_set(http_daemon *h, size_t i, http_req *r) {
    h->park_heap[i] = r;
    r->park_heap = i;
}

static void heap_up(http_daemon *h, size_t i) {
    http_req *r = h->park_heap[i];
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h->park_heap[p]->park_due_ms <= r->park_due_ms) break;
        heap_set(h, i, h->park_heap[p]);
        i = p;
    }
    heap_set(h, i, r);
}

static void heap_down(http_daemon *h, size_t i) {
    http_req *r = h->park_heap[i];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->park_n) break;
        if (c + 1 < h->park_n && h->park_heap[c + 1]->park_due_ms < h->park_heap[c]->park_due_ms) c++;
        if (r->park_due_ms <= h->park_heap[c]->park_due_ms) break;
        heap_set(h, i, h->park_heap[c]);
        i = c;
    }
    heap_set(h, i, r);
}

/* Takes r off the heap, its bucket and its topic's list; park_mu held. */
static void park_unlink(http_daemon *h, http_req *r) {
    size_t i = r->park_heap;
    if (i < h->park_n && h->park_heap[i] == r) {
        http_req *last = h->park_heap[--h->park_n];
        if (last != r) {
            heap_set(h, i, last);
            heap_up(h, i);
            heap_down(h, last->park_heap);
        }
    }
    if (r->park_topic != HTTP_WAKE_NONE) {
        if (r->park_prev) r->park_prev->park_next = r->park_next;
        else h->park_bucket[park_hash(r->park_topic, r->park_id)] = r->park_next;
        if (r->park_next) r->park_next->park_prev = r->park_prev;
        if (r->topic_prev) r->topic_prev->topic_next = r->topic_next;
        else h->park_topic[r->park_topic] = r->topic_next;
        if (r->topic_next) r->topic_next->topic_prev = r->topic_prev;
    }
    r->park_next = r->park_prev = r->topic_next = r->topic_prev = NULL;
    r->parked = 0;
}

/* Unlinks and resumes r; park_mu held. */
static void park_resume(http_daemon *h, http_req *r) {
    park_unlink(h, r);
    MHD_resume_connection(r->conn);
}

/* Suspends req's connection for at most ms. 0 when parked; 1 when a wake
 * it watches (http_wait_watch) came since it looked: not parked, its
 * handler is to run again now; -1 when the daemon is stopping (nothing may
 * stay suspended past MHD_stop_daemon). */
static int park(http_daemon *h, http_req *req, int ms, int topic, int64_t id) {
    if (ms < 1) ms = 1;
    if (topic < HTTP_WAKE_NONE || topic >= HTTP_WAKE_NTOPICS) topic = HTTP_WAKE_NONE;
    pthread_mutex_lock(&h->park_mu);
    if (h->closing || h->park_n >= h->park_cap) { /* the heap holds a request per connection */
        pthread_mutex_unlock(&h->park_mu);
        return -1;
    }
    if (topic != HTTP_WAKE_NONE && req->watch_topic == topic && req->watch_id == id) {
        int own = __atomic_load_n(&h->wake_seq[park_hash(topic, id)], __ATOMIC_ACQUIRE) != req->watch_seq;
        if (own || __atomic_load_n(&h->wake_topic_seq[topic], __ATOMIC_ACQUIRE) != req->watch_topic_seq) {
            req->woken = own;
            pthread_mutex_unlock(&h->park_mu);
            return 1;
        }
    }
    MHD_suspend_connection(req->conn);
    if (!req->park_count++) __atomic_fetch_add(&h->waiters, 1, __ATOMIC_RELAXED);
    req->woken = 0;
    req->park_due_ms = mono_ms() + ms;
    req->park_topic = topic;
    req->park_id = id;
    req->parked = 1;
    req->park_next = req->park_prev = req->topic_next = req->topic_prev = NULL;
    heap_set(h, h->park_n++, req);
    heap_up(h, req->park_heap);
    if (topic != HTTP_WAKE_NONE) {
        http_req **b = &h->park_bucket[park_hash(topic, id)];
        req->park_next = *b;
        if (*b) (*b)->park_prev = req;
        *b = req;
        http_req **t = &h->park_topic[topic];
        req->topic_next = *t;
        if (*t) (*t)->topic_prev = req;
        *t = req;
    }
    if (req->park_due_ms < h->park_next_due) pthread_cond_signal(&h->park_cv);
    pthread_mutex_unlock(&h->park_mu);
    return 0;
}

/* Resumes what is due, then sleeps until the next due time (the heap's
 * root) or until park() signals an earlier one. */
static void *park_main(void *arg) {
    http_daemon *h = arg;
    pthread_mutex_lock(&h->park_mu);
    while (!h->closing) {
        int64_t now = mono_ms();
        while (h->park_n > 0 && h->park_heap[0]->park_due_ms <= now) park_resume(h, h->park_heap[0]);
        int64_t next = h->park_n > 0 ? h->park_heap[0]->park_due_ms : now + 1000;
        h->park_next_due = next;
        struct timespec ts = {(time_t)(next / 1000), (long)(next % 1000) * 1000000L};
        pthread_cond_timedwait(&h->park_cv, &h->park_mu, &ts);
    }
    pthread_mutex_unlock(&h->park_mu);
    return NULL;
}

/* Closes the park list: every parked request resumes (its handler answers
 * 503, its stream ends) and nothing parks any more; joins park_main. */
static void park_stop(http_daemon *h) {
    pthread_mutex_lock(&h->park_mu);
    __atomic_store_n(&h->closing, 1, __ATOMIC_RELEASE);
    while (h->park_n > 0) park_resume(h, h->park_heap[0]);
    pthread_cond_signal(&h->park_cv);
    pthread_mutex_unlock(&h->park_mu);
    if (h->park_started) pthread_join(h->park_thread, NULL);
    h->park_started = 0;
}

/* ---------------------------------------------------------------- offloading
 * A handler whose work blocks (a checkpoint upload: its sha256, the file
 * written and fsynced twice, two transactions; 5-10 ms) hands it to
 * off_main with http_offload: the connection is suspended and queued, the
 * pool thread goes back to its other connections, off_main runs the work
 * with a fresh res kept on the request and resumes the connection, and
 * on_request sends what the work answered. One thread: uploads are rare and
 * their disk writes gain nothing from running side by side. */

static int offload(http_daemon *h, http_req *req, http_handler fn) {
    pthread_mutex_lock(&h->off_mu);
    if (h->off_closing || !h->off_started) {
        pthread_mutex_unlock(&h->off_mu);
        return -1;
    }
    MHD_suspend_connection(req->conn);
    if (!req->park_count++) __atomic_fetch_add(&h->waiters, 1, __ATOMIC_RELAXED);
    req->off_fn = fn;
    req->off_next = NULL;
    if (h->off_tail) h->off_tail->off_next = req;
    else h->off_head = req;
    h->off_tail = req;
    pthread_cond_signal(&h->off_cv);
    pthread_mutex_unlock(&h->off_mu);
    return 0;
}

static void audit_arm(http_daemon *h, http_req *req);

static void *off_main(void *arg) {
    http_daemon *h = arg;
    pthread_mutex_lock(&h->off_mu);
    for (;;) {
        while (!h->off_head && !h->off_closing) pthread_cond_wait(&h->off_cv, &h->off_mu);
        http_req *r = h->off_head;
        if (!r) break; /* closing, and the queue is done */
        h->off_head = r->off_next;
        if (!h->off_head) h->off_tail = NULL;
        pthread_mutex_unlock(&h->off_mu);
        http_res *res = xmalloc(sizeof *res);
        res_init(res);
        audit_arm(h, r);
        r->off_fn(h->srv, r, res);
        db_precommit(h->db, NULL, NULL);
        r->off_res = res;
        MHD_resume_connection(r->conn); /* on_request sends off_res */
        pthread_mutex_lock(&h->off_mu);
    }
    pthread_mutex_unlock(&h->off_mu);
    return NULL;
}

/* Nothing is offloaded any more; what is queued is done first. */
static void off_stop(http_daemon *h) {
    pthread_mutex_lock(&h->off_mu);
    h->off_closing = 1;
    pthread_cond_signal(&h->off_cv);
    pthread_mutex_unlock(&h->off_mu);
    if (h->off_started) pthread_join(h->off_thread, NULL);
    h->off_started = 0;
}

/* ---------------------------------------------------------------- deferring
 * http_defer: the handler's work goes to another thread (the db's
 * committer), which answers with http_resume. Like an offload, but the
 * thread is not the daemon's: the answer is kept on the request (off_res)
 * and on_request sends it once resumed. */

int http_defer(http_req *req, http_res *res) {
    http_daemon *h = req->daemon;
    if (!h) return -1;
    pthread_mutex_lock(&h->off_mu);
    if (h->off_closing) {
        pthread_mutex_unlock(&h->off_mu);
        return -1;
    }
    MHD_suspend_connection(req->conn);
    if (!req->park_count++) __atomic_fetch_add(&h->waiters, 1, __ATOMIC_RELAXED);
    h->deferred++;
    pthread_mutex_unlock(&h->off_mu);
    res->deferred = 1;
    return 0;
}

http_res *http_res_new(void) {
    http_res *res = xmalloc(sizeof *res);
    res_init(res);
    return res;
}

void http_resume(http_req *req, http_res *answer) {
    http_daemon *h = req->daemon;
    req->off_res = answer;
    MHD_resume_connection(req->conn); /* on_request sends off_res; req is the pool thread's again */
    pthread_mutex_lock(&h->off_mu);
    h->deferred--;
    pthread_mutex_unlock(&h->off_mu);
}

void http_offload(http_req *req, http_res *res, http_handler fn) {
    (void)req;
    res->offload = fn;
}

/* TRAINYARD_HTTP_THREADS, else four a core (at least 4, at most 64). Each
 * thread serves its share of the connections in turn, and libmicrohttpd
 * walks a thread's suspended connections at each resume: with thousands of
 * agents parked, more threads mean a shorter queue ahead of a user's GET
 * and shorter walks (bench/cluster at 5,000 agents on 2 cores: GET p99
 * 2.1 ms with 8 threads against 2.7-2.8 ms with 2; docs/server.md). */
static unsigned http_pool_size(void) {
    const char *e = getenv("TRAINYARD_HTTP_THREADS");
    long n = 0;
    if (e && *e && parse_long(e, 1, 256, &n) == 0) return (unsigned)n;
    n = sysconf(_SC_NPROCESSORS_ONLN) * 4;
    if (n < 4) n = 4;
    if (n > 64) n = 64;
    return (unsigned)n;
}

/* How many connections the daemon holds at once. Every agent holds one for
 * its parked long-poll and one for its heartbeats and reports, so a cluster
 * of N agents needs about 2N. TRAINYARD_HTTP_MAX_CONNECTIONS when set; else
 * the descriptor limit (RLIMIT_NOFILE, its soft value raised to the hard
 * one) less 256 for the database, logs and checkpoint files, at most
 * 1,000,000. A connection past the limit is closed at once by
 * libmicrohttpd (the agent retries with backoff). */
static unsigned http_conn_limit(void) {
    struct rlimit rl;
    rlim_t nofile = 1024;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        if (rl.rlim_cur < rl.rlim_max) {
            rlim_t want = rl.rlim_max == RLIM_INFINITY ? 1048576 : rl.rlim_max;
            struct rlimit up = {want, rl.rlim_max};
            if (setrlimit(RLIMIT_NOFILE, &up) == 0) rl.rlim_cur = want;
        }
        nofile = rl.rlim_cur == RLIM_INFINITY ? 1048576 : rl.rlim_cur;
    }
    long n = nofile > 512 ? (long)(nofile - 256) : 256;
    if (n > 1000000) n = 1000000;
    const char *e = getenv("TRAINYARD_HTTP_MAX_CONNECTIONS");
    long v = 0;
    if (e && *e && parse_long(e, 16, 1000000, &v) == 0) {
        if (v > n) log_warn("http: TRAINYARD_HTTP_MAX_CONNECTIONS=%ld is above what the descriptor limit allows (%ld)", v, n);
        n = v;
    }
    return (unsigned)n;
}

void http_wait(http_req *req, http_res *res, int ms, int topic, int64_t id) {
    (void)req;
    res->wait_ms = ms > 0 ? ms : 1;
    res->wait_topic = topic;
    res->wait_id = id;
}

ssize_t http_stream_wait(http_req *req, int ms) {
    return park(req->daemon, req, ms, HTTP_WAKE_NONE, 0) == 0 ? 0 : MHD_CONTENT_READER_END_OF_STREAM;
}

int http_stream_park(http_req *req, int ms, int topic, int64_t id) {
    return park(req->daemon, req, ms, topic, id);
}

int http_stopping(const http_req *req) {
    return req->daemon ? __atomic_load_n(&req->daemon->closing, __ATOMIC_ACQUIRE) : 1;
}

int http_is_tls(const http_req *req) { return req->daemon && req->daemon->tls; }

void http_set_apps_only(http_daemon *h) { h->apps_only = 1; }

int http_set_moved(http_daemon *h, const char *prefix, const char *base) {
    if (strlen(prefix) >= sizeof h->moved_prefix || strlen(base) >= sizeof h->moved_base) return -1;
    snprintf(h->moved_base, sizeof h->moved_base, "%s", base);
    snprintf(h->moved_prefix, sizeof h->moved_prefix, "%s", prefix);
    return 0;
}

/* ---------------------------------------------------------------- upgrades
 * MHD hands the upgraded socket to upgrade_begin on the connection's pool
 * thread once the 101 is sent; the owner's start takes it from there. The
 * daemon keeps the started ones on a list so that http_stop can tell them
 * (ops->stop) and wait for their close: libmicrohttpd must not be stopped
 * under an upgraded connection its owner still uses. Lock order: up_mu,
 * then whatever ops->stop takes; an owner never holds its own lock while
 * calling http_upgrade_close. */

static void upgrade_begin(void *cls, struct MHD_Connection *conn, void *con_cls, const char *extra_in,
                          size_t extra_in_size, MHD_socket sock, struct MHD_UpgradeResponseHandle *urh) {
    (void)conn;
    (void)con_cls;
    http_upgrade *u = cls;
    http_daemon *h = u->h;
    u->urh = urh;
    pthread_mutex_lock(&h->up_mu);
    u->state = 1;
    u->prev = NULL;
    u->next = h->up_head;
    if (h->up_head) h->up_head->prev = u;
    h->up_head = u;
    h->up_n++;
    int closing = h->up_closing;
    pthread_mutex_unlock(&h->up_mu);
    u->ops->start(u->cls, u, sock, extra_in, extra_in_size);
    if (closing) { /* http_stop's round went by before it was linked: tell it now, unless closed already */
        pthread_mutex_lock(&h->up_mu);
        if (u->state == 1) u->ops->stop(u->cls);
        pthread_mutex_unlock(&h->up_mu);
    }
}

struct MHD_Response *http_upgrade_response(http_req *req, const http_upgrade_ops *ops, void *cls) {
    if (!req->daemon || req->upgrade || MHD_is_feature_supported(MHD_FEATURE_UPGRADE) != MHD_YES) return NULL;
    http_upgrade *u = xcalloc(1, sizeof *u);
    u->h = req->daemon;
    u->ops = ops;
    u->cls = cls;
    struct MHD_Response *r = MHD_create_response_for_upgrade(upgrade_begin, u);
    if (!r) {
        free(u);
        return NULL;
    }
    req->upgrade = u; /* on_completed frees it (and tells an owner never started) */
    return r;
}

void http_upgrade_close(http_upgrade *u) {
    http_daemon *h = u->h;
    struct MHD_UpgradeResponseHandle *urh = u->urh;
    pthread_mutex_lock(&h->up_mu);
    if (u->state == 1) {
        if (u->prev) u->prev->next = u->next;
        else h->up_head = u->next;
        if (u->next) u->next->prev = u->prev;
        h->up_n--;
    }
    u->state = 2;
    pthread_mutex_unlock(&h->up_mu);
    /* last: the request may end (on_completed frees u) as soon as this runs */
    if (MHD_upgrade_action(urh, MHD_UPGRADE_ACTION_CLOSE) != MHD_YES) log_warn("http: cannot close an upgraded connection");
}

int http_upgraded_count(http_daemon *h) {
    pthread_mutex_lock(&h->up_mu);
    int n = h->up_n;
    pthread_mutex_unlock(&h->up_mu);
    return n;
}

/* No lock: the counts only grow, under park_mu, before the wake resumes
 * anyone; park() compares them again under park_mu. A wake counted before
 * these loads came after the commit it announces, so the look that follows
 * sees that commit. */
void http_wait_watch(http_req *req, int topic, int64_t id) {
    http_daemon *h = req->daemon;
    if (!h || topic <= HTTP_WAKE_NONE || topic >= HTTP_WAKE_NTOPICS) return;
    req->watch_topic = topic;
    req->watch_id = id;
    req->watch_seq = __atomic_load_n(&h->wake_seq[park_hash(topic, id)], __ATOMIC_ACQUIRE);
    req->watch_topic_seq = __atomic_load_n(&h->wake_topic_seq[topic], __ATOMIC_ACQUIRE);
}

/* park_mu held. */
static void wake_locked(http_daemon *h, int topic, int64_t id) {
    if (id == 0) { /* a wake of everyone names no one */
        __atomic_fetch_add(&h->wake_topic_seq[topic], 1, __ATOMIC_RELEASE);
        while (h->park_topic[topic]) {
            h->park_topic[topic]->woken = 0;
            park_resume(h, h->park_topic[topic]);
        }
        return;
    }
    size_t b = park_hash(topic, id);
    __atomic_fetch_add(&h->wake_seq[b], 1, __ATOMIC_RELEASE);
    for (http_req *r = h->park_bucket[b], *nx; r; r = nx) {
        nx = r->park_next;
        if (r->park_topic == topic && r->park_id == id) {
            r->woken = 1;
            park_resume(h, r);
        }
    }
}

void http_wake(http_daemon *h, int topic, int64_t id) {
    if (!h || topic <= HTTP_WAKE_NONE || topic >= HTTP_WAKE_NTOPICS) return;
    pthread_mutex_lock(&h->park_mu);
    wake_locked(h, topic, id);
    pthread_mutex_unlock(&h->park_mu);
}

void http_wake_many(http_daemon *h, int topic, const int64_t *ids, int n) {
    if (!h || topic <= HTTP_WAKE_NONE || topic >= HTTP_WAKE_NTOPICS || n <= 0) return;
    pthread_mutex_lock(&h->park_mu);
    for (int i = 0; i < n; i++)
        if (ids[i] != 0) wake_locked(h, topic, ids[i]);
    pthread_mutex_unlock(&h->park_mu);
}

/* Answers a dashboard file (GET or HEAD), or 304 when If-None-Match names
 * its ETag; a file kept gzip'd goes so to a client that accepts gzip. The
 * bytes live as long as the process: no copy. */
static enum MHD_Result answer_static(http_req *req, const static_file *f) {
    int gz = f->gz && static_accepts_gzip(http_header(req, MHD_HTTP_HEADER_ACCEPT_ENCODING));
    const char *etag = gz ? f->gz_etag : f->etag;
    const char *inm = http_header(req, MHD_HTTP_HEADER_IF_NONE_MATCH);
    int not_modified = inm && (strstr(inm, etag) != NULL || strcmp(inm, "*") == 0);
    size_t len = gz ? f->gz_len : f->len;
    struct MHD_Response *r = not_modified
        ? MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT)
        : MHD_create_response_from_buffer(len, (void *)(gz ? f->gz : f->data), MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", f->content_type);
    MHD_add_response_header(r, "ETag", etag);
    MHD_add_response_header(r, "Cache-Control", f->cache_control);
    if (f->gz) MHD_add_response_header(r, "Vary", "Accept-Encoding");
    if (gz && !not_modified) MHD_add_response_header(r, "Content-Encoding", "gzip");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    if (f->is_html) {
        MHD_add_response_header(r, "Content-Security-Policy", CSP);
        MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
        MHD_add_response_header(r, "X-Frame-Options", "DENY");
    }
    req->status = not_modified ? 304 : 200;
    req->sent = not_modified ? 0 : len;
    req->answered = 1;
    enum MHD_Result ret = MHD_queue_response(req->conn, (unsigned)req->status, r);
    MHD_destroy_response(r);
    return ret;
}

/* A route's body limit: its own, the default, or (HTTP_BODY_CONTEXT) the
 * server's --context-max-mb. */
static size_t body_max(const http_daemon *h, const route *r) {
    if (r->max_body == HTTP_BODY_CONTEXT) return (size_t)h->context_max_mb << 20;
    return r->max_body ? r->max_body : HTTP_BODY_DEFAULT;
}

/* 413 too_large with the limit; n: the announced length, or -1 (a chunked
 * body that went past it). A context is refused in the option's own unit. */
static void too_large(http_req *req, http_res *res, long n) {
    size_t max = req->body.max;
    if (req->route && req->route->max_body == HTTP_BODY_CONTEXT) {
        if (n >= 0)
            http_error_limit(res, 413, "too_large", "body", (int64_t)max,
                             "the context is %ld bytes; the limit is %zu MiB (the server's --context-max-mb)", n,
                             max >> 20);
        else
            http_error_limit(res, 413, "too_large", "body", (int64_t)max,
                             "the context is larger than the limit of %zu MiB (the server's --context-max-mb)",
                             max >> 20);
    } else if (n >= 0) {
        http_error_limit(res, 413, "too_large", NULL, (int64_t)max, "the body is %ld bytes; the limit here is %zu",
                         n, max);
    } else {
        http_error_limit(res, 413, "too_large", NULL, (int64_t)max, "the body is larger than the limit of %zu bytes",
                         max);
    }
}

void http_db_unavailable(http_res *res) {
    const char *why = db_unavailable_reason(); /* PostgreSQL out of reach, or this server fenced */
    if (why) http_error(res, 503, "unavailable", NULL, "%s; retry", why);
    else http_error(res, 503, "unavailable", NULL, "the database is busy or unavailable; retry");
}

/* A standby's answer to what only the leader serves (ALLOW_STANDBY). The
 * leader's URL is the lease's (what it advertises): clients move there
 * when their list names it (docs/cli.md). */
static void standby_answer(http_daemon *h, http_res *res) {
    char leader[512];
    int64_t left = 0;
    db_leader(h->db, leader, sizeof leader, &left);
    cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
    char msg[700];
    if (leader[0]) snprintf(msg, sizeof msg, "this server is a standby; the leader is %.600s", leader);
    else snprintf(msg, sizeof msg, "this server is a standby and no server leads now; a standby takes over within seconds");
    cJSON_AddStringToObject(e, "code", "standby");
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddNullToObject(e, "field");
    if (leader[0]) cJSON_AddStringToObject(o, "leader", leader);
    else cJSON_AddNullToObject(o, "leader");
    http_json(res, 503, o);
    res->retry_after_s = 1;
    if (leader[0] && strlen(leader) < sizeof res->xhdr_value) {
        snprintf(res->xhdr_name, sizeof res->xhdr_name, "X-Trainyard-Leader");
        snprintf(res->xhdr_value, sizeof res->xhdr_value, "%.255s", leader);
    }
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls) {
    (void)version;
    http_daemon *h = cls;
    http_req *req = *con_cls;
    http_res res;
    res_init(&res);

    if (!req || !req->conn) { /* made by uri_logged with the raw target, or not */
        if (!req) {
            req = xcalloc(1, sizeof *req);
            *con_cls = req;
        }
        req->conn = conn;
        req->method = method;
        req->path = url;
        req->t0_us = now_us();
        req->daemon = h;
        req->slot = h->slot_unmatched;
        if (request_check(req, url, &res) < 0) return answer_now(req, &res);
        if (h->moved_prefix[0] && strncmp(url, h->moved_prefix, strlen(h->moved_prefix)) == 0 &&
            !MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION)) {
            /* served by another daemon (the apps' origin): a browser goes there
             * (a request with a bearer token is no page's: it is served here) */
            int n = snprintf(res.location, sizeof res.location, "%s%s", h->moved_base,
                             req->raw_target ? req->raw_target : url);
            if (n < 0 || (size_t)n >= sizeof res.location) http_error(&res, 414, "uri_too_long", NULL, "the target is too long");
            else http_text(&res, 307, "text/plain; charset=utf-8", "", 0);
            return answer_now(req, &res);
        }
        if (!h->apps_only && (strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0) && strncmp(url, "/api/", 5) != 0) {
            const static_file *f = static_find(url);
            if (f) {
                req->slot = h->slot_static;
                return answer_static(req, f);
            }
        }
        int path_known = 0;
        req->route = route_find(h->tables, method, url, req, &path_known, &req->slot);
        if (!req->route) {
            if (path_known) {
                char allow[128];
                allowed_methods(h->tables, url, allow, sizeof allow);
                http_error(&res, 405, "method_not_allowed", NULL, "%s is not allowed on %s (allowed: %s)",
                           method, url, allow);
            } else {
                http_error(&res, 404, "not_found", NULL, "no such endpoint: %s %s", method, url);
            }
            return answer_now(req, &res);
        }
        size_t max = body_max(h, req->route);
        buf_init(&req->body, max);
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        long n;
        if (cl && parse_long(cl, 0, LONG_MAX, &n) == 0 && (size_t)n > max) {
            too_large(req, &res, n);
            return answer_now(req, &res);
        }
        if (!(req->route->allow & ALLOW_STANDBY) && h->db && db_role(h->db) != DB_LEADER) {
            standby_answer(h, &res);
            return answer_now(req, &res);
        }
        if (authenticate(h->db, req, &res) < 0) return answer_now(req, &res);
        return MHD_YES;
    }
    if (req->answered) {
        *upload_data_size = 0; /* discard the rest of a body we already refused */
        return MHD_YES;
    }
    if (*upload_data_size) {
        if (!req->too_large && buf_append(&req->body, upload_data, *upload_data_size) < 0) req->too_large = 1;
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (req->too_large) {
        too_large(req, &res, -1);
        return answer_now(req, &res);
    }
    if (req->off_res) { /* resumed by off_main: its answer */
        res = *req->off_res;
        free(req->off_res);
        req->off_res = NULL;
    } else {
        for (;;) {
            req->watch_topic = HTTP_WAKE_NONE; /* http_wait_watch holds for one run */
            audit_arm(h, req);
            req->route->handler(h->srv, req, &res);
            db_precommit(h->db, NULL, NULL);
            req->calls++;
            if (res.deferred) { /* suspended: another thread answers (http_resume) */
                res_release(&res);
                return MHD_YES;
            }
            if (res.offload) {
                http_handler fn = res.offload;
                res_release(&res);
                res_init(&res);
                if (offload(h, req, fn) == 0) return MHD_YES;
                http_error(&res, 503, "unavailable", NULL, "the server is stopping; retry");
                return answer_now(req, &res);
            }
            if (res.wait_ms <= 0) break;
            int ms = res.wait_ms, topic = res.wait_topic;
            int64_t id = res.wait_id;
            res_release(&res);
            res_init(&res);
            int pr = park(h, req, ms, topic, id);
            if (pr == 0) return MHD_YES;
            if (pr == 1) continue; /* woken while it looked: it looks again now */
            http_error(&res, 503, "unavailable", NULL, "the server is stopping; retry");
            return answer_now(req, &res);
        }
    }
    /* a write refused for lack of disk space: say so (507), not "busy; retry" or "internal" */
    char full[320];
    if (!res.raw && h->db && (res.status == 500 || res.status == 503) && db_disk_full(h->db, full, sizeof full))
        http_error(&res, 507, "storage_full", NULL, "%s", full);
    return answer_now(req, &res);
}

/* Counts one answered request in its slot's histogram. */
static void hist_add(http_daemon *h, int slot, int64_t us) {
    if (slot < 0 || slot > h->slot_unmatched) return;
    http_hist *hh = &h->hist[slot];
    double s = (double)us / 1e6;
    size_t b = 0;
    while (b < HIST_NB && s > g_le[b]) b++;
    __atomic_fetch_add(&hh->bucket[b], 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&hh->sum_us, (uint64_t)(us > 0 ? us : 0), __ATOMIC_RELAXED);
    __atomic_fetch_add(&hh->count, 1, __ATOMIC_RELAXED);
}

/* ---------------------------------------------------------------- access log */

static int g_access_fd = -1;

int http_access_log_open(const char *path) {
    int fd = -1;
    if (path && (fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600)) < 0) return -1;
    int old = __atomic_exchange_n(&g_access_fd, fd, __ATOMIC_ACQ_REL);
    if (old >= 0) close(old);
    return 0;
}

/* HOST - ACTOR [24/Nov/2026:20:31:50 +0000] "GET /api/v1/jobs/1 HTTP/1.1" 200 123 0.31 */
static void access_line(struct MHD_Connection *conn, const http_req *req, double ms) {
    int fd = __atomic_load_n(&g_access_fd, __ATOMIC_ACQUIRE);
    if (fd < 0) return;
    char host[INET6_ADDRSTRLEN] = "-", actor[96] = "-", when[64];
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (ci && ci->client_addr) {
        const struct sockaddr *sa = ci->client_addr;
        if (sa->sa_family == AF_INET)
            inet_ntop(AF_INET, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, host, sizeof host);
        else if (sa->sa_family == AF_INET6)
            inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr, host, sizeof host);
    }
    http_actor(req, actor, sizeof actor);
    char *svc = strstr(actor, " (service)"); /* the log's user field is one word: team:NAME */
    if (svc) *svc = '\0';
    for (char *c = actor; *c; c++)
        if (*c == ' ') *c = '_';
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(when, sizeof when, "%d/%b/%Y:%H:%M:%S +0000", &tm);
    char line[1024];
    int n = snprintf(line, sizeof line, "%s - %s [%s] \"%s %.600s HTTP/1.1\" %d %zu %.2f\n", host,
                     actor[0] ? actor : "-", when, req->method, req->path, req->status, req->sent, ms);
    if (n <= 0) return;
    if ((size_t)n >= sizeof line) {
        n = (int)sizeof line - 1;
        line[n - 1] = '\n';
    }
    ssize_t w = write(fd, line, (size_t)n); /* O_APPEND: one line a write, never split */
    (void)w;
}

/* ---------------------------------------------------------------- audit */

void http_client_addr(const http_req *req, char *out, size_t outlen) {
    snprintf(out, outlen, "-");
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(req->conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (!ci || !ci->client_addr || outlen < INET6_ADDRSTRLEN) return;
    const struct sockaddr *sa = ci->client_addr;
    if (sa->sa_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, out, (socklen_t)outlen);
    else if (sa->sa_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr, out, (socklen_t)outlen);
}

/* The request's audit row as known now (its status comes when answered). */
static audit_row *audit_make(db *d, const http_req *req) {
    audit_row *a = xcalloc(1, sizeof *a);
    a->at = now_ms();
    http_actor(req, a->actor, sizeof a->actor);
    if (req->authed) {
        a->user_id = req->who.user_id;
        a->token_id = req->who.token_id;
        if (req->who.kind == TOKEN_TEAM || req->who.kind == TOKEN_TASK) a->team_id = req->who.team_id;
    }
    /* a team's own routes (/teams/{name}..., /teams/{team}/members...): that team */
    if (!a->team_id && req->route && req->nparams > 0 && strncmp(req->route->pattern, "/api/v1/teams/{", 15) == 0 &&
        store_team_find(d, req->params[0], &a->team_id) != STORE_OK)
        a->team_id = 0;
    snprintf(a->method, sizeof a->method, "%s", req->method);
    snprintf(a->route, sizeof a->route, "%.95s", req->route ? req->route->pattern : req->path);
    /* the path's {x} values by name: "id=12", "team=vision user=ada" */
    size_t off = 0;
    const char *p = req->route ? req->route->pattern : "";
    for (int i = 0; i < req->nparams && (p = strchr(p, '{')) != NULL; i++) {
        const char *e = strchr(p, '}');
        if (!e) break;
        int n = snprintf(a->target + off, sizeof a->target - off, "%s%.*s=%s", off ? " " : "", (int)(e - p - 1),
                         p + 1, req->params[i]);
        if (n < 0 || (size_t)n >= sizeof a->target - off) break;
        off += (size_t)n;
        p = e;
    }
    http_client_addr(req, a->client, sizeof a->client);
    return a;
}

/* A change's row goes into the change's own transaction (db_precommit). */
static int audit_precommit(db *d, void *arg) {
    http_req *req = arg;
    req->audit->status = 0;
    if (audit_insert(d, req->audit, &req->audit_id) != STORE_OK) return -1;
    req->audit_status = 0;
    return 0;
}

/* Before the handler: a mutating request of a person, a team's token or
 * the admin gets its row, to be written with what it changes. */
static void audit_arm(http_daemon *h, http_req *req) {
    if (!req->authed || is_read(req->method)) return;
    token_kind k = req->who.kind;
    if (k != TOKEN_TEAM && k != TOKEN_USER && k != TOKEN_ADMIN) return;
    if (!req->audit) req->audit = audit_make(h->db, req);
    if (req->audit_id == 0) db_precommit(h->db, audit_precommit, req);
}

void http_audit_read(http_req *req) {
    if (!req->authed || !req->daemon || req->audit) return;
    token_kind k = req->who.kind;
    if (k != TOKEN_TEAM && k != TOKEN_USER && k != TOKEN_ADMIN) return;
    req->audit = audit_make(req->daemon->db, req);
}

/* Once answered: the status into the row written with the change, or the
 * row alone (a refusal, or a request that changed nothing). */
static void audit_finish(http_daemon *h, http_req *req) {
    if (!req->audit && req->status != 401 && req->status != 403) return;
    if (h->db && db_role(h->db) != DB_LEADER) { /* a standby writes nothing (the fence refuses it): the leader audits */
        free(req->audit);
        req->audit = NULL;
        return;
    }
    if (!req->audit) req->audit = audit_make(h->db, req);
    if (req->audit_id > 0) {
        if (req->status != req->audit_status) (void)audit_set_status(h->db, req->audit_id, req->status);
    } else if (req->audit_id == 0) {
        req->audit->status = req->status;
        if (audit_insert(h->db, req->audit, NULL) != STORE_OK)
            log_warn("audit: cannot write the row of %s %s (%d)", req->method, req->path, req->status);
    }
    free(req->audit);
    req->audit = NULL;
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    http_daemon *h = cls;
    (void)conn;
    http_req *req = *con_cls;
    if (!req) return;
    if (req->upgrade) {
        http_upgrade *u = req->upgrade;
        pthread_mutex_lock(&h->up_mu);
        int state = u->state;
        pthread_mutex_unlock(&h->up_mu);
        if (state == 0) u->ops->start(u->cls, NULL, -1, NULL, 0); /* never upgraded: its owner lets go */
        if (state != 1) free(u);
        else log_warn("http: an upgraded connection ended before its owner closed it");
        req->upgrade = NULL;
    }
    if (!req->conn) { /* MHD answered it before on_request (a head too large) */
        free(req->raw_target);
    free(req->grant_cookie);
        free(req);
        *con_cls = NULL;
        return;
    }
    if (req->parked) { /* MHD closed it while parked (only at stop): never leave it linked */
        pthread_mutex_lock(&h->park_mu);
        if (req->parked) park_unlink(h, req);
        pthread_mutex_unlock(&h->park_mu);
    }
    if (req->off_res) { /* offloaded work done, but the client left before its answer */
        res_release(req->off_res);
        free(req->off_res);
        req->off_res = NULL;
    }
    if (req->park_count) __atomic_fetch_sub(&h->waiters, 1, __ATOMIC_RELAXED);
    int64_t us = now_us() - req->t0_us;
    hist_add(h, req->slot, us);
    double ms = (double)us / 1000.0;
    access_line(conn, req, ms);
    audit_finish(h, req);
    log_msg(req->status >= 500 || toe != MHD_REQUEST_TERMINATED_COMPLETED_OK ? LOG_WARN : LOG_DEBUG,
            "%s %s %d %zuB %.2fms%s", req->method, req->path, req->status, req->sent, ms,
            toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " (connection closed early)");
    buf_release(&req->body);
    free(req->raw_target);
    free(req->grant_cookie);
    free(req);
    *con_cls = NULL;
}

/* The request target as it came (before any %-escape is decoded): kept on
 * a request made here, which on_request then fills in. */
static void *uri_logged(void *cls, const char *uri, struct MHD_Connection *conn) {
    (void)cls;
    (void)conn;
    http_req *req = xcalloc(1, sizeof *req);
    req->raw_target = xstrdup(uri ? uri : "");
    return req;
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = '\0';
    log_warn("http: %s", line);
}

/* What a daemon holds once its threads are stopped (its TLS session, locks,
 * grants, tables), then the daemon itself. */
static void daemon_free(http_daemon *h) {
    if (h->tls) https_close();
    pthread_cond_destroy(&h->off_cv);
    pthread_mutex_destroy(&h->off_mu);
    pthread_cond_destroy(&h->park_cv);
    pthread_mutex_destroy(&h->park_mu);
    pthread_mutex_destroy(&h->up_mu);
    free(h->park_heap);
    free(h->slot_route);
    free(h->hist);
    free(h);
}

http_daemon *http_start(struct server *srv, db *d, long context_max_mb, const char *host, int port,
                        const route *const *tables,
                        const char *tls_cert_pem, const char *tls_key_pem, int *port_out, char *err,
                        size_t errlen) {
    if (tls_cert_pem && MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
        snprintf(err, errlen, "this libmicrohttpd was built without TLS: HTTPS cannot be served");
        return NULL;
    }
    if (tls_cert_pem && MHD_is_feature_supported(MHD_FEATURE_HTTPS_CERT_CALLBACK2) != MHD_YES) {
        snprintf(err, errlen,
                 "this libmicrohttpd cannot hand a certificate per handshake (MHD_OPTION_HTTPS_CERT_CALLBACK2, "
                 "GnuTLS 3.6.3 or later): HTTPS cannot be served");
        return NULL;
    }
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        snprintf(err, errlen, "not an IPv4 address: %s", host);
        return NULL;
    }
    http_daemon *h = xcalloc(1, sizeof *h);
    h->srv = srv;
    h->db = d;
    h->context_max_mb = context_max_mb;
    h->tables = tables;
    for (const route *const *t = tables; *t; t++)
        for (const route *r = *t; r->pattern; r++) h->nroutes++;
    h->slot_static = h->nroutes;
    h->slot_unmatched = h->nroutes + 1;
    h->slot_route = xcalloc((size_t)h->nroutes + 1, sizeof *h->slot_route);
    h->hist = xcalloc((size_t)h->nroutes + 2, sizeof *h->hist);
    int k = 0;
    for (const route *const *t = tables; *t; t++)
        for (const route *r = *t; r->pattern; r++) h->slot_route[k++] = r;
    pthread_condattr_t ca;
    if (pthread_mutex_init(&h->park_mu, NULL) != 0 || pthread_condattr_init(&ca) != 0) abort();
    if (pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) != 0 || pthread_cond_init(&h->park_cv, &ca) != 0) abort();
    pthread_condattr_destroy(&ca);
    if (pthread_mutex_init(&h->off_mu, NULL) != 0 || pthread_cond_init(&h->off_cv, NULL) != 0) abort();
    if (pthread_mutex_init(&h->up_mu, NULL) != 0) abort();
    h->park_next_due = INT64_MAX;
    if (pthread_create(&h->park_thread, NULL, park_main, h) != 0) {
        snprintf(err, errlen, "cannot start the HTTP timer thread");
        goto fail;
    }
    h->park_started = 1;
    if (pthread_create(&h->off_thread, NULL, off_main, h) != 0) {
        snprintf(err, errlen, "cannot start the HTTP offload thread");
        goto fail;
    }
    h->off_started = 1;
    unsigned threads = http_pool_size();
    h->max_conns = http_conn_limit();
    h->park_cap = (size_t)h->max_conns + 64;
    h->park_heap = calloc(h->park_cap, sizeof *h->park_heap);
    if (!h->park_heap) {
        snprintf(err, errlen, "cannot allocate the park heap for %u connections", h->max_conns);
        goto fail;
    }
    log_debug("http: %u pool threads, at most %u connections", threads, h->max_conns);
    unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    /* a 101 hands a connection over (http_upgrade_response: WebSockets through the proxy) */
    if (MHD_is_feature_supported(MHD_FEATURE_UPGRADE) == MHD_YES) flags |= MHD_ALLOW_UPGRADE;
    struct MHD_OptionItem tls_opts[3] = {{MHD_OPTION_END, 0, NULL}, {MHD_OPTION_END, 0, NULL}, {MHD_OPTION_END, 0, NULL}};
    if (tls_cert_pem) {
        /* the certificate is handed per handshake (https.h), so that a
         * renewed or re-read one is served without a restart */
        char why[256];
        if (https_open(tls_cert_pem, tls_key_pem, why, sizeof why) < 0) {
            snprintf(err, errlen, "cannot serve HTTPS: %s", why);
            goto fail;
        }
        h->tls = 1;
        flags |= MHD_USE_TLS;
        tls_opts[0] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_PRIORITIES, 0, (void *)HTTPS_PRIORITIES};
        tls_opts[1] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_CERT_CALLBACK2, 0, (void *)https_retrieve};
    }
    h->mhd = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, on_request, h,
                              MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, NULL,
                              MHD_OPTION_ARRAY, tls_opts,
                              MHD_OPTION_THREAD_POOL_SIZE, threads,
                              MHD_OPTION_UNESCAPE_CALLBACK, unescape_strict, NULL,
                              MHD_OPTION_URI_LOG_CALLBACK, uri_logged, NULL,
                              MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                              MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)300,
                              MHD_OPTION_CONNECTION_LIMIT, h->max_conns,
                              MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned)1024,
                              MHD_OPTION_END);
    if (!h->mhd) {
        snprintf(err, errlen, "cannot listen on %s:%d: %s", host, port,
                 errno ? strerror(errno) : "libmicrohttpd failed to start");
        goto fail;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->mhd, MHD_DAEMON_INFO_BIND_PORT);
    if (port_out) *port_out = info ? info->port : port;
    return h;
fail:
    off_stop(h);
    park_stop(h);
    daemon_free(h);
    return NULL;
}

int http_tls_replace(http_daemon *h, const char *cert_pem, const char *key_pem, char *err, size_t errlen) {
    if (!h->tls) {
        snprintf(err, errlen, "the server serves plain HTTP: no certificate to replace");
        return -1;
    }
    return https_set(cert_pem, key_pem, err, errlen);
}

void http_stop(http_daemon *h) {
    if (!h) return;
    park_stop(h); /* every parked request resumed: none may be suspended at MHD_stop_daemon */
    off_stop(h);  /* and every offloaded one done and resumed */
    /* and every deferred one answered by its thread (a group commit: it
     * answers once its batch commits or fails; at most the 10 s of a write turn) */
    for (int i = 0; i < 6000; i++) {
        pthread_mutex_lock(&h->off_mu);
        int left = h->deferred;
        pthread_mutex_unlock(&h->off_mu);
        if (!left) break;
        usleep(5000);
    }
    /* and answered: a long-poll gets its (empty) answer, a stream its end,
     * rather than a connection closed under them (at most 2 s) */
    for (int i = 0; i < 400 && __atomic_load_n(&h->waiters, __ATOMIC_RELAXED) > 0; i++) usleep(5000);
    /* and every upgraded connection closed by its owner (at most 2 s) */
    pthread_mutex_lock(&h->up_mu);
    h->up_closing = 1;
    for (http_upgrade *u = h->up_head; u; u = u->next) u->ops->stop(u->cls);
    pthread_mutex_unlock(&h->up_mu);
    for (int i = 0; i < 400 && http_upgraded_count(h) > 0; i++) usleep(5000);
    MHD_stop_daemon(h->mhd);
    daemon_free(h);
}

int http_latency_write(http_daemon *h, buf *out) {
    static const char name[] = "trainyard_http_request_duration_seconds";
    int rc = buf_printf(out,
                        "# HELP %s Time from a request's arrival to the end of its answer, by route pattern "
                        "(static: dashboard files; unmatched: 404/405).\n# TYPE %s histogram\n",
                        name, name);
    for (int i = 0; rc == 0 && i <= h->slot_unmatched; i++) {
        http_hist snap;
        for (size_t b = 0; b <= HIST_NB; b++) snap.bucket[b] = __atomic_load_n(&h->hist[i].bucket[b], __ATOMIC_RELAXED);
        snap.count = __atomic_load_n(&h->hist[i].count, __ATOMIC_RELAXED);
        snap.sum_us = __atomic_load_n(&h->hist[i].sum_us, __ATOMIC_RELAXED);
        if (!snap.count) continue;
        const char *method = i < h->nroutes ? h->slot_route[i]->method : i == h->slot_static ? "GET" : "any";
        const char *pat = i < h->nroutes ? h->slot_route[i]->pattern : i == h->slot_static ? "static" : "unmatched";
        /* the counts are read one by one while others add: make the series consistent */
        uint64_t cum = 0;
        for (size_t b = 0; rc == 0 && b < HIST_NB; b++) {
            cum += snap.bucket[b];
            rc = buf_printf(out, "%s_bucket{method=\"%s\",route=\"%s\",le=\"%g\"} %llu\n", name, method, pat,
                            g_le[b], (unsigned long long)cum);
        }
        cum += snap.bucket[HIST_NB];
        if (rc == 0)
            rc = buf_printf(out,
                            "%s_bucket{method=\"%s\",route=\"%s\",le=\"+Inf\"} %llu\n"
                            "%s_sum{method=\"%s\",route=\"%s\"} %.6f\n%s_count{method=\"%s\",route=\"%s\"} %llu\n",
                            name, method, pat, (unsigned long long)cum, name, method, pat,
                            (double)snap.sum_us / 1e6, name, method, pat, (unsigned long long)cum);
    }
    return rc;
}
