/* client.c - libcurl requests with bearer tokens and bounded bodies, to one
 * server or the leader among a list of them (moving on a connect failure or
 * a standby's 503). */
#include "client.h"

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <limits.h>
#include <sys/random.h>

#include "../common/tls.h"

#define CLIENT_EXPECT_MIN (64 * 1024) /* bytes of body above which a request asks first */
#define CLIENT_BODY_MAX (256u << 20)

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static void global_init(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

/* the trusted CA: set before requests start, read-only afterwards */
static char *g_ca_pem;
static size_t g_ca_len;

int client_trust_ca_pem(const char *pem, size_t n, const char *what, char *err, size_t errlen) {
    if (tls_check_ca(pem, n, what, err, errlen) < 0) return -1;
    char *copy = xstrndup(pem, n);
    free(g_ca_pem);
    g_ca_pem = copy;
    g_ca_len = n;
    return 0;
}

int client_trust_ca_file(const char *path, const char *what, char *err, size_t errlen) {
    size_t n = 0;
    errno = 0;
    char *pem = file_read_all(path, 1u << 20, &n);
    if (!pem) {
        snprintf(err, errlen, "%s %s: %s", what, path, errno ? strerror(errno) : "cannot be read (or over 1 MiB)");
        return -1;
    }
    char label[PATH_MAX + 64];
    snprintf(label, sizeof label, "%s %s", what, path);
    int rc = client_trust_ca_pem(pem, n, label, err, errlen);
    free(pem);
    return rc;
}

int client_trust_from_env(char *err, size_t errlen) {
    const char *pem = getenv("TRAINYARD_CA_PEM");
    if (pem && *pem) return client_trust_ca_pem(pem, strlen(pem), "TRAINYARD_CA_PEM", err, errlen);
    const char *file = getenv("TRAINYARD_CA");
    if (file && *file) return client_trust_ca_file(file, "TRAINYARD_CA", err, errlen);
    return 0;
}

const char *client_trusted_ca(void) { return g_ca_pem; }

void client_tls_apply(void *curl) {
    if (!g_ca_pem) return;
    struct curl_blob blob = {g_ca_pem, g_ca_len, CURL_BLOB_COPY};
    curl_easy_setopt((CURL *)curl, CURLOPT_CAINFO_BLOB, &blob);
}

static size_t on_ca(char *p, size_t size, size_t n, void *ud) {
    return buf_append((buf *)ud, p, size * n) < 0 ? 0 : size * n;
}

/* The CA of one server (url: one base URL) fetched unverified and trusted
 * when its hash is pin. *reached: whether the server answered at all (a
 * server that did not is not a refusal: the next of a list is asked). */
static int trust_pinned_one(const char *url, const char *pin, int *reached, char *err, size_t errlen) {
    *reached = 0;
    if (strncmp(url, "https://", 8) != 0) {
        snprintf(err, errlen, "--ca-hash needs the server's https:// URL, not %s", url);
        *reached = 1;
        return -1;
    }
    char full[1024];
    size_t ul = strlen(url);
    while (ul && url[ul - 1] == '/') ul--;
    if (sfmt(full, sizeof full, "%.*s/api/v1/tls/ca", (int)ul, url) < 0) {
        snprintf(err, errlen, "url too long");
        *reached = 1;
        return -1;
    }
    CURL *h = curl_easy_init();
    if (!h) {
        snprintf(err, errlen, "curl_easy_init failed");
        *reached = 1;
        return -1;
    }
    buf b;
    buf_init(&b, 1u << 20);
    curl_easy_setopt(h, CURLOPT_URL, full);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_ca);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 15000L);
    /* the one unverified request: what it brings back is trusted only if its hash is the pin */
    curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 0L);
    curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 0L);
    CURLcode rc = curl_easy_perform(h);
    long st = 0;
    if (rc == CURLE_OK) curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &st);
    curl_easy_cleanup(h);
    int out = -1;
    char got[TLS_PIN_LEN];
    *reached = rc == CURLE_OK;
    if (rc != CURLE_OK) snprintf(err, errlen, "cannot fetch the CA from %s: %s", full, curl_easy_strerror(rc));
    else if (st != 200)
        snprintf(err, errlen, "cannot fetch the CA from %s: answered %ld (a server without --tls auto has none to give)",
                 full, st);
    else if (tls_ca_pin(b.data ? b.data : "", b.len, got, err, errlen) < 0) {
    } else if (strcasecmp(got, pin) != 0)
        snprintf(err, errlen, "the CA at %s has the hash %s, not the --ca-hash %s given: not trusting it", full, got, pin);
    else
        out = client_trust_ca_pem(b.data, b.len, full, err, errlen);
    buf_release(&b);
    return out;
}

/* Over a list: the first server that answers gives the CA, which must have
 * the pin; one that gives another CA is refused at once (not skipped). The
 * one CA trusted then verifies every server of the list, so they must all
 * have certificates it signed (docs/cli.md "Several servers"). */
int client_trust_pinned(const char *url, const char *pin, char *err, size_t errlen) {
    pthread_once(&g_once, global_init);
    if (strncmp(pin, "sha256:", 7) != 0 || strlen(pin) != 71 || strspn(pin + 7, "0123456789abcdefABCDEF") != 64) {
        snprintf(err, errlen, "--ca-hash wants sha256: and 64 hex digits (as the server logs it), got '%s'", pin);
        return -1;
    }
    int n = 0;
    if (client_url_list_check(url, "the server URL", &n, err, errlen) < 0) return -1;
    buf why;
    buf_init(&why, 4096);
    for (int i = 0; i < n; i++) {
        char one[512], e[1400];
        if (client_url_at(url, i, one, sizeof one) < 0) break;
        int reached = 0;
        if (trust_pinned_one(one, pin, &reached, e, sizeof e) == 0) {
            buf_release(&why);
            return 0;
        }
        if (reached || n == 1) {
            snprintf(err, errlen, "%s", e);
            buf_release(&why);
            return -1;
        }
        (void)buf_printf(&why, "%s%s", why.len ? "; " : "", e);
    }
    snprintf(err, errlen, "no server of the list answered: %s", why.data ? why.data : "");
    buf_release(&why);
    return -1;
}

/* ---------------------------------------------------------------- URL lists */

/* The next item of a list from *p: its start and length without spaces and
 * trailing slashes; *p moves past its comma. 0 at the end. */
static int list_next(const char **p, const char **item, size_t *len) {
    const char *s = *p;
    if (!s) return 0;
    const char *comma = strchr(s, ',');
    size_t n = comma ? (size_t)(comma - s) : strlen(s);
    *p = comma ? comma + 1 : NULL;
    while (n && (*s == ' ' || *s == '\t')) s++, n--;
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '/')) n--;
    *item = s;
    *len = n;
    return 1;
}

int client_url_list_check(const char *list, const char *what, int *n, char *err, size_t errlen) {
    *n = 0;
    const char *p = list, *it;
    size_t len;
    int k = 0;
    while (list_next(&p, &it, &len)) {
        k++;
        if (len == 0) {
            snprintf(err, errlen, "%s: URL %d of the list is empty (a comma-separated list of URLs)", what, k);
            return -1;
        }
        if (len >= sizeof ((client *)0)->urls[0]) {
            snprintf(err, errlen, "%s: URL %d of the list is over 511 bytes", what, k);
            return -1;
        }
        if (k > CLIENT_MAX_URLS) {
            snprintf(err, errlen, "%s: more than %d URLs", what, CLIENT_MAX_URLS);
            return -1;
        }
    }
    if (k == 0) {
        snprintf(err, errlen, "%s: no URL", what);
        return -1;
    }
    *n = k;
    return 0;
}

int client_url_at(const char *list, int i, char *out, size_t outlen) {
    const char *p = list, *it;
    size_t len;
    for (int k = 0; list_next(&p, &it, &len); k++)
        if (k == i) return len && len < outlen ? (snprintf(out, outlen, "%.*s", (int)len, it), 0) : -1;
    return -1;
}

int client_url_list_merge(const char *first, const char *more, char *out, size_t outlen) {
    if (outlen == 0) return -1;
    out[0] = '\0';
    size_t len = 0;
    int n = 0;
    char u[512];
    for (int pass = 0; pass < 2; pass++) {
        const char *list = pass ? more : first;
        for (int i = 0; list && client_url_at(list, i, u, sizeof u) == 0; i++) {
            int dup = 0;
            char v[512];
            for (int j = 0; !dup && client_url_at(out, j, v, sizeof v) == 0; j++) dup = strcasecmp(u, v) == 0;
            if (dup) continue;
            size_t k = strlen(u) + (len ? 1 : 0);
            if (n == CLIENT_MAX_URLS || len + k >= outlen) {
                if (pass == 0) return -1;
                continue;
            }
            snprintf(out + len, outlen - len, "%s%s", len ? "," : "", u);
            len += k;
            n++;
        }
    }
    return 0;
}

int client_idempotency_key(char out[37]) {
    unsigned char b[16];
    size_t got = 0;
    while (got < sizeof b) {
        ssize_t k = getrandom(b + got, sizeof b - got, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        got += (size_t)k;
    }
    b[6] = (unsigned char)((b[6] & 0x0f) | 0x40); /* version 4 */
    b[8] = (unsigned char)((b[8] & 0x3f) | 0x80); /* RFC 4122 variant */
    static const char hex[] = "0123456789abcdef";
    int o = 0;
    for (int i = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10) out[o++] = '-';
        out[o++] = hex[b[i] >> 4];
        out[o++] = hex[b[i] & 15];
    }
    out[o] = '\0';
    return 0;
}

/* Which URL of a list answered last, for this process: every client made
 * with the same list starts there (the CLI makes one per request; an agent
 * one per thread). A small table keyed by the list's hash. */
#define CUR_SLOTS 16
static pthread_mutex_t g_cur_mu = PTHREAD_MUTEX_INITIALIZER;
static struct { uint64_t key; int idx; } g_cur[CUR_SLOTS];
static int g_cur_next;

static uint64_t list_key(const client *c) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the URLs */
    for (int i = 0; i < c->n_urls; i++) {
        for (const char *s = c->urls[i]; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
        h = (h ^ ',') * 1099511628211ull;
    }
    return h | 1; /* never 0: an empty slot */
}

static int cur_get(const client *c) {
    uint64_t k = list_key(c);
    int idx = 0;
    pthread_mutex_lock(&g_cur_mu);
    for (int i = 0; i < CUR_SLOTS; i++)
        if (g_cur[i].key == k) idx = g_cur[i].idx;
    pthread_mutex_unlock(&g_cur_mu);
    return idx >= 0 && idx < c->n_urls ? idx : 0;
}

static void cur_put(const client *c) {
    if (c->n_urls < 2) return;
    uint64_t k = list_key(c);
    pthread_mutex_lock(&g_cur_mu);
    int slot = -1;
    for (int i = 0; i < CUR_SLOTS && slot < 0; i++)
        if (g_cur[i].key == k) slot = i;
    if (slot < 0) slot = g_cur_next++ % CUR_SLOTS;
    g_cur[slot].key = k;
    g_cur[slot].idx = c->cur;
    pthread_mutex_unlock(&g_cur_mu);
}

static void set_cur(client *c, int i) {
    c->cur = i;
    memcpy(c->url, c->urls[i], sizeof c->url);
}

int client_init(client *c, const char *url, const char *token) {
    pthread_once(&g_once, global_init);
    memset(c, 0, sizeof *c);
    char err[160];
    int n = 0;
    if (!url || client_url_list_check(url, "url", &n, err, sizeof err) < 0) return -1;
    for (int i = 0; i < n; i++)
        if (client_url_at(url, i, c->urls[i], sizeof c->urls[i]) < 0) return -1;
    c->n_urls = n;
    set_cur(c, cur_get(c));
    if (token && sfmt(c->token, sizeof c->token, "%s", token) < 0) return -1;
    c->timeout_ms = 30000;
    c->failover_ms = -1;
    c->curl = curl_easy_init();
    return c->curl ? 0 : -1;
}

void client_release(client *c) {
    if (c->curl) curl_easy_cleanup(c->curl);
    c->curl = NULL;
}

static size_t on_data(char *p, size_t size, size_t n, void *ud) {
    client_reply *r = ud;
    if (buf_append(&r->body, p, size * n) < 0) return 0; /* past the cap: abort */
    return size * n;
}

/* What one attempt came to. */
enum { TRY_ANSWER, TRY_STANDBY, TRY_CONNECT, TRY_LOST, TRY_FATAL };

typedef struct try_hdr {
    char leader[512];             /* X-Trainyard-Leader */
} try_hdr;

static size_t on_header(char *p, size_t size, size_t n, void *ud) {
    try_hdr *t = ud;
    size_t len = size * n;
    static const char name[] = "X-Trainyard-Leader:";
    if (len > sizeof name - 1 && strncasecmp(p, name, sizeof name - 1) == 0) {
        size_t i = sizeof name - 1;
        while (i < len && (p[i] == ' ' || p[i] == '\t')) i++;
        size_t k = len - i;
        while (k && (p[i + k - 1] == '\r' || p[i + k - 1] == '\n' || p[i + k - 1] == ' ')) k--;
        if (k < sizeof t->leader) {
            memcpy(t->leader, p + i, k);
            t->leader[k] = '\0';
        }
    }
    return len;
}

/* A 503's body: whether it is a standby's, and the leader it names ("" none). */
static int standby_body(const char *data, size_t len, const char *hdr_leader, char *leader, size_t n) {
    leader[0] = '\0';
    cJSON *o = cJSON_ParseWithLength(data ? data : "", len);
    const cJSON *e = o ? cJSON_GetObjectItemCaseSensitive(o, "error") : NULL;
    if (cJSON_IsObject(e)) e = cJSON_GetObjectItemCaseSensitive(e, "code"); /* {"error":{"code":...}} too */
    int standby = cJSON_IsString(e) && strcmp(e->valuestring, "standby") == 0;
    const cJSON *l = o ? cJSON_GetObjectItemCaseSensitive(o, "leader") : NULL;
    if (standby) {
        if (cJSON_IsString(l) && l->valuestring[0]) snprintf(leader, n, "%s", l->valuestring);
        else if (hdr_leader[0]) snprintf(leader, n, "%s", hdr_leader);
        size_t k = strlen(leader);
        while (k && leader[k - 1] == '/') leader[--k] = '\0';
    }
    cJSON_Delete(o);
    return standby;
}

/* One request to urls[c->cur]. */
static int try_once(client *c, const char *method, const char *path, const char *body, size_t body_len,
                    const char *ctype, long connect_ms, client_reply *r, char *leader, size_t leadern) {
    buf_reset(&r->body);
    r->status = 0;
    r->error[0] = '\0';
    char url[1024];
    if (sfmt(url, sizeof url, "%s%s", c->url, path) < 0) {
        snprintf(r->error, sizeof r->error, "url too long");
        return TRY_FATAL;
    }
    try_hdr th;
    th.leader[0] = '\0';
    CURL *h = c->curl;
    curl_easy_reset(h);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &th);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, c->timeout_ms);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, connect_ms);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    client_tls_apply(h);
    struct curl_slist *hdr = NULL;
    char auth[300], ct[128], acc[96], idem[112];
    if (c->token[0]) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", c->token);
        hdr = curl_slist_append(hdr, auth);
    }
    if (c->accept[0]) {
        snprintf(acc, sizeof acc, "Accept: %s", c->accept);
        hdr = curl_slist_append(hdr, acc);
    }
    char team[96];
    if (c->team[0]) {
        snprintf(team, sizeof team, "Trainyard-Team: %s", c->team);
        hdr = curl_slist_append(hdr, team);
    }
    if (c->idempotency_key[0]) {
        snprintf(idem, sizeof idem, "Idempotency-Key: %s", c->idempotency_key);
        hdr = curl_slist_append(hdr, idem);
    }
    if (body) {
        snprintf(ct, sizeof ct, "Content-Type: %s", ctype ? ctype : "application/json");
        hdr = curl_slist_append(hdr, ct);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
    } else if (strcmp(method, "POST") == 0 || strcmp(method, "PUT") == 0) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, "");
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)0);
    }
    /* A large body asks first (Expect: 100-continue): a server that refuses
     * it on its headers (413, 401) answers before the body is sent. Sent
     * anyway, the refused body was cut off by the server's close, and the
     * answer with it ("Failed sending data to the peer"). A small one is
     * sent at once. */
    hdr = curl_slist_append(hdr, body && body_len > CLIENT_EXPECT_MIN ? "Expect: 100-continue" : "Expect:");
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    CURLcode rc = curl_easy_perform(h);
    curl_slist_free_all(hdr);
    c->attempts++;
    if (rc != CURLE_OK) {
        snprintf(r->error, sizeof r->error, "%s: %s%s", url, curl_easy_strerror(rc),
                 rc == CURLE_PEER_FAILED_VERIFICATION
                     ? (g_ca_pem ? " (the server's certificate is not signed by the CA given)"
                                 : " (give the server's CA: TRAINYARD_CA=FILE or --ca-cert FILE; its DATA/tls/ca.crt)")
                     : "");
        r->status = 0;
        if (rc == CURLE_WRITE_ERROR || rc == CURLE_OUT_OF_MEMORY || rc == CURLE_ABORTED_BY_CALLBACK ||
            rc == CURLE_URL_MALFORMAT || rc == CURLE_UNSUPPORTED_PROTOCOL || rc == CURLE_BAD_FUNCTION_ARGUMENT)
            return TRY_FATAL;
        /* Not a byte of the request went out (refused, unreachable, no TLS,
         * a connect timeout): nothing can have been done. */
        long sent = 0;
        if (curl_easy_getinfo(h, CURLINFO_REQUEST_SIZE, &sent) != CURLE_OK) sent = 1;
        return sent == 0 ? TRY_CONNECT : TRY_LOST;
    }
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->status);
    if (r->status == 503 && standby_body(r->body.data, r->body.len, th.leader, leader, leadern)) return TRY_STANDBY;
    return TRY_ANSWER;
}

static long failover_default(void) {
    const char *e = getenv("TRAINYARD_FAILOVER_MS");
    long v;
    if (e && *e && parse_long(e, 0, 3600000, &v) == 0) return v;
    return CLIENT_FAILOVER_MS;
}

/* The moves of one request over the list: what each URL said, the budget
 * and the backoff. */
typedef struct mover {
    int n;
    long budget, backoff;
    int64_t t0, deadline;
    int since_wait;
    int tried[CLIENT_MAX_URLS];
    char said[CLIENT_MAX_URLS][200];
} mover;

static void mover_init(client *c, mover *m) {
    memset(m, 0, sizeof *m);
    c->attempts = 0;
    if (c->n_urls == 0) { /* a client filled by hand: its url alone */
        memcpy(c->urls[0], c->url, sizeof c->urls[0]);
        c->n_urls = 1;
    }
    m->n = c->n_urls;
    m->budget = c->failover_ms >= 0 ? c->failover_ms : failover_default();
    m->t0 = mono_ms();
    m->deadline = m->t0 + m->budget;
    m->backoff = 200;
}

/* The connect timeout of the next attempt: 5 s, less when the budget's end
 * is nearer (after the first round). */
static long mover_connect_ms(const client *c, const mover *m) {
    if (m->budget <= 0 || c->attempts < m->n) return 5000;
    int64_t left = m->deadline - mono_ms();
    return left < 500 ? 500 : left < 5000 ? (long)left : 5000;
}

/* After a failed attempt at urls[c->cur] (standby: a standby's 503 naming
 * leader, "" none; else why: the transport error "URL/path: why"): moves c
 * to the URL to try next, waiting first when every URL has had its try
 * since the last wait. 0: try again; -1: the budget is spent. */
static int mover_next(client *c, mover *m, int standby, const char *leader, const char *why) {
    int at = c->cur, n = m->n;
    m->tried[at] = 1;
    int next = (at + 1) % n;
    if (standby) {
        snprintf(m->said[at], sizeof m->said[at], "standby, leader %s", leader[0] ? leader : "unknown");
        for (int i = 0; leader[0] && i < n; i++)
            if (strcasecmp(c->urls[i], leader) == 0 && i != at) next = i;
    } else {
        const char *e = why;
        size_t ul = strlen(c->url);
        if (strncmp(e, c->url, ul) == 0) { /* "URL/path: why": the why */
            const char *colon = strstr(e + ul, ": ");
            if (colon) e = colon + 2;
        }
        snprintf(m->said[at], sizeof m->said[at], "%s", e);
    }
    m->since_wait++;
    int round_done = m->since_wait >= n;
    int64_t now = mono_ms();
    if (c->attempts >= n && round_done && now >= m->deadline) return -1;
    if (round_done) { /* the last wait ends at the budget's end: one more round then */
        long wait = m->deadline - now < m->backoff ? (long)(m->deadline - now) : m->backoff;
        struct timespec ts = {wait / 1000, (wait % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
        }
        m->backoff = m->backoff * 2 > 1000 ? 1000 : m->backoff * 2;
        m->since_wait = 0;
    }
    if (next != at) log_debug("%s: %s; trying %s", c->urls[at], m->said[at], c->urls[next]);
    set_cur(c, next);
    return 0;
}

/* The error once the budget is spent: every URL and what it said. */
static void mover_error(const client *c, const mover *m, char *out, size_t cap) {
    int w = snprintf(out, cap, "no server of %d answered as leader within %.1f s (%d tries)", m->n,
                     (double)(mono_ms() - m->t0) / 1000.0, c->attempts);
    size_t off = w < 0 ? 0 : (size_t)w;
    for (int i = 0; i < m->n && off < cap; i++) {
        w = snprintf(out + off, cap - off, "; %s: %s", c->urls[i], m->tried[i] ? m->said[i] : "not tried");
        if (w < 0) break;
        off += (size_t)w;
    }
}

int client_request(client *c, const char *method, const char *path, const char *body, size_t body_len,
                   const char *ctype, client_reply *r) {
    memset(r, 0, sizeof *r);
    buf_init(&r->body, CLIENT_BODY_MAX);
    mover m;
    mover_init(c, &m);
    int idem = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0 || strcmp(method, "PUT") == 0 ||
               strcmp(method, "DELETE") == 0 || c->idempotency_key[0];
    for (;;) {
        char leader[512];
        int k = try_once(c, method, path, body, body_len, ctype, mover_connect_ms(c, &m), r, leader, sizeof leader);
        if (k == TRY_ANSWER) {
            cur_put(c);
            return 0;
        }
        if (k == TRY_FATAL) return -1;
        if (m.n == 1 && k != TRY_STANDBY) return -1; /* one URL: a transport error as it always was */
        if (k == TRY_LOST && !idem) {
            char e[sizeof r->error];
            snprintf(e, sizeof e, "%.1300s (the request may have been done: not sent again)", r->error);
            snprintf(r->error, sizeof r->error, "%s", e);
            return -1;
        }
        if (mover_next(c, &m, k == TRY_STANDBY, leader, r->error) < 0) break;
    }
    client_reply_release(r);
    memset(r, 0, sizeof *r);
    buf_init(&r->body, CLIENT_BODY_MAX);
    mover_error(c, &m, r->error, sizeof r->error);
    return -1;
}

void client_reply_release(client_reply *r) { buf_release(&r->body); }

void client_default_url(char *out, size_t outlen) {
    const char *u = getenv("TRAINYARD_URL"); /* a list too */
    snprintf(out, outlen, "%s", u && *u ? u : "http://127.0.0.1:8080");
}

int client_config_token_path(char *out, size_t n) {
    const char *x = getenv("XDG_CONFIG_HOME");
    if (x && x[0] == '/') return sfmt(out, n, "%s/trainyard/token", x);
    const char *home = getenv("HOME");
    if (!home || home[0] != '/') return -1;
    return sfmt(out, n, "%s/.config/trainyard/token", home);
}

/* The token held in file, into out: 0; -1 with err (a file that does not
 * hold one); 1 when there is no such file (errno ENOENT). */
static int token_from_file(const char *file, char *out, size_t outlen, char *err, size_t errlen) {
    size_t len = 0;
    char *s = file_read_all(file, 1024, &len);
    if (!s) {
        if (errno == ENOENT) return 1;
        snprintf(err, errlen, "cannot read the token file %s: %s", file, strerror(errno));
        return -1;
    }
    while (len && (s[len - 1] == '\n' || s[len - 1] == '\r' || s[len - 1] == ' ')) s[--len] = '\0';
    int rc = sfmt(out, outlen, "%s", s);
    free(s);
    if (rc < 0 || len == 0) {
        snprintf(err, errlen, "%s does not hold a token", file);
        return -1;
    }
    return 0;
}

int client_default_token(char *out, size_t outlen, char *err, size_t errlen) {
    const char *t = getenv("TRAINYARD_TOKEN");
    if (t && *t) {
        if (sfmt(out, outlen, "%s", t) < 0) {
            snprintf(err, errlen, "TRAINYARD_TOKEN is too long");
            return -1;
        }
        return 0;
    }
    const char *file = getenv("TRAINYARD_TOKEN_FILE");
    if (file && *file) { /* named: that file or nothing */
        int rc = token_from_file(file, out, outlen, err, errlen);
        if (rc > 0) snprintf(err, errlen, "no token: TRAINYARD_TOKEN_FILE names %s, which does not exist", file);
        return rc == 0 ? 0 : -1;
    }
    int rc = token_from_file(".trainyard/token", out, outlen, err, errlen);
    if (rc <= 0) return rc;
    char cfg[PATH_MAX];
    if (client_config_token_path(cfg, sizeof cfg) == 0) {
        rc = token_from_file(cfg, out, outlen, err, errlen);
        if (rc <= 0) return rc;
    } else {
        snprintf(cfg, sizeof cfg, "~/.config/trainyard/token");
    }
    snprintf(err, errlen, "no token: set TRAINYARD_TOKEN, run where .trainyard/token exists, or sign in with "
             "trainyard login (%s)", cfg);
    return -1;
}

/* ---------------------------------------------------------------- download */

typedef struct dl {
    CURL *h;
    FILE *f;
    sha256_stream sha;
    uint64_t n;
    long status;
    buf *err_body;
    char sha_hdr[65];
    char loc[4096];              /* a presigned URL is long */
    int failed;
    int loc_long;                /* a Location past loc: not followed */
    long sent;                   /* bytes of the request sent (0: not connected) */
    try_hdr th;                  /* X-Trainyard-Leader */
} dl;

static size_t dl_header(char *p, size_t size, size_t n, void *ud) {
    dl *d = ud;
    size_t len = size * n;
    on_header(p, size, n, &d->th);
    if (len >= 9 && strncasecmp(p, "Location:", 9) == 0) {
        size_t i = 9;
        while (i < len && p[i] == ' ') i++;
        size_t k = len - i;
        while (k && (p[i + k - 1] == '\r' || p[i + k - 1] == '\n' || p[i + k - 1] == ' ')) k--;
        if (k >= sizeof d->loc) {
            d->loc[0] = '\0';
            d->loc_long = 1;
        } else {
            memcpy(d->loc, p + i, k);
            d->loc[k] = '\0';
        }
        return len;
    }
    char line[512];
    size_t k = len < sizeof line - 1 ? len : sizeof line - 1;
    memcpy(line, p, k);
    line[k] = '\0';
    while (k && (line[k - 1] == '\r' || line[k - 1] == '\n')) line[--k] = '\0';
    if (strncasecmp(line, "X-Checksum-Sha256:", 18) == 0) {
        const char *v = line + 18;
        while (*v == ' ') v++;
        if (sfmt(d->sha_hdr, sizeof d->sha_hdr, "%s", v) < 0) d->sha_hdr[0] = '\0'; /* not a sha256 */
    }
    return len;
}

static size_t dl_data(char *p, size_t size, size_t n, void *ud) {
    dl *d = ud;
    size_t len = size * n;
    if (!d->status) curl_easy_getinfo(d->h, CURLINFO_RESPONSE_CODE, &d->status);
    if (d->status >= 300 && d->status < 400) return len; /* a redirect's body ({"url",...}): not the file */
    if (d->status >= 400) {
        if (d->err_body) buf_append(d->err_body, p, len); /* keeps what fits */
        return len;
    }
    if (fwrite(p, 1, len, d->f) != len || sha256_stream_update(&d->sha, p, len) < 0) {
        d->failed = 1;
        return 0;
    }
    d->n += len;
    return len;
}

static int dl_progress(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal, curl_off_t ulnow) {
    (void)dltotal, (void)dlnow, (void)ultotal, (void)ulnow;
    const client *c = ud;
    return c->abort_cb(c->abort_ctx) ? 1 : 0; /* non-zero: CURLE_ABORTED_BY_CALLBACK */
}

/* One GET of url into d (its file rewound, its sha256 restarted): with the
 * client's token and team when to_server, with nothing of the client's but
 * the timeouts and the abort callback otherwise (a store's presigned URL: the
 * token must not reach it, and S3 refuses a second auth mechanism). Its TLS
 * is the server's CA for the server, the system's store for a store.
 * Returns curl's code; *status the HTTP status. */
static CURLcode dl_get(client *c, dl *d, const char *url, int to_server, long *status) {
    d->n = 0;
    d->status = 0;
    d->failed = 0;
    d->loc[0] = d->sha_hdr[0] = '\0';
    d->loc_long = 0;
    d->sent = 0;
    d->th.leader[0] = '\0';
    if (d->err_body) buf_reset(d->err_body);
    char ignored[65];
    if (d->sha.ctx) sha256_stream_final(&d->sha, ignored);
    if (fflush(d->f) != 0 || ftruncate(fileno(d->f), 0) < 0 || fseek(d->f, 0, SEEK_SET) < 0 ||
        sha256_stream_init(&d->sha) < 0) {
        d->failed = 1;
        return CURLE_WRITE_ERROR;
    }
    CURL *h = c->curl;
    d->h = h;
    curl_easy_reset(h);
    struct curl_slist *hdr = NULL;
    char auth[300], team[96];
    if (to_server && c->token[0]) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", c->token);
        hdr = curl_slist_append(hdr, auth);
    }
    if (to_server && c->team[0]) {
        snprintf(team, sizeof team, "Trainyard-Team: %s", c->team);
        hdr = curl_slist_append(hdr, team);
    }
    if (to_server) client_tls_apply(h);
    curl_easy_setopt(h, CURLOPT_URL, url);
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
#else
    curl_easy_setopt(h, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, dl_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, d);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, dl_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, d);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L); /* averaged over 5 s: seen a few seconds late */
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, (long)(c->stall_s > 0 ? c->stall_s : 60));
    if (c->abort_cb) {
        curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, dl_progress);
        curl_easy_setopt(h, CURLOPT_XFERINFODATA, c);
        curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    }
    CURLcode rc = curl_easy_perform(h);
    curl_slist_free_all(hdr);
    *status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, status);
    if (curl_easy_getinfo(h, CURLINFO_REQUEST_SIZE, &d->sent) != CURLE_OK) d->sent = 1;
    if (to_server) c->attempts++;
    return rc;
}

/* client_download with an err_body always given. */
static int download(client *c, const char *path, const char *out_path, long *status, char sha_hdr[65],
                    char sha_got[65], char *loc, size_t locn, uint64_t *size, buf *err_body, char *err,
                    size_t errlen) {
    dl d;
    memset(&d, 0, sizeof d);
    d.err_body = err_body;
    *status = 0;
    sha_hdr[0] = sha_got[0] = '\0';
    if (locn) loc[0] = '\0';
    *size = 0;
    char url[1024], tmp[4096];
    if (sfmt(url, sizeof url, "%s%s", c->url, path) < 0 || sfmt(tmp, sizeof tmp, "%s.part", out_path) < 0) {
        snprintf(err, errlen, "path too long");
        return -1;
    }
    d.f = fopen(tmp, "wb");
    if (!d.f) {
        snprintf(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
        return -1;
    }
    if (sha256_stream_init(&d.sha) < 0) {
        fclose(d.f);
        unlink(tmp);
        snprintf(err, errlen, "cannot start sha256");
        return -1;
    }
    /* The server answers the bytes (200), or a 307 to the store: then the
     * store's URL is fetched without the token, and the 307's checksum is
     * the one the bytes must have. A store's 403 (the URL expired while this
     * waited) sends us back to the server once for a fresh one. */
    char want[65] = "", where[4096] = "", shown[1100];
    snprintf(shown, sizeof shown, "%s", url);
    CURLcode rc = CURLE_OK;
    mover m;
    mover_init(c, &m);
    for (int round = 0; round < 2; round++) {
        snprintf(shown, sizeof shown, "%s", url);
        rc = dl_get(c, &d, url, 1, status);
        /* Over a list, the server's GET moves as client_request does (a GET
         * may always be asked again). */
        for (;;) {
            char leader[512] = "";
            int standby = rc == CURLE_OK && !d.failed && *status == 503 &&
                          standby_body(d.err_body->data, d.err_body->len, d.th.leader, leader, sizeof leader);
            int down = rc != CURLE_OK && !d.failed && rc != CURLE_ABORTED_BY_CALLBACK && rc != CURLE_WRITE_ERROR;
            if (!standby && !(down && m.n > 1)) break;
            char why[1100];
            snprintf(why, sizeof why, "%s: %s", url, curl_easy_strerror(rc));
            if (mover_next(c, &m, standby, leader, why) < 0) {
                mover_error(c, &m, err, errlen);
                fclose(d.f);
                unlink(tmp);
                if (d.sha.ctx) sha256_stream_final(&d.sha, leader);
                return -1;
            }
            if (sfmt(url, sizeof url, "%s%s", c->url, path) < 0) {
                snprintf(err, errlen, "path too long");
                fclose(d.f);
                unlink(tmp);
                if (d.sha.ctx) sha256_stream_final(&d.sha, leader);
                return -1;
            }
            snprintf(shown, sizeof shown, "%s", url);
            rc = dl_get(c, &d, url, 1, status);
        }
        if (rc == CURLE_OK && !d.failed) cur_put(c);
        if (rc != CURLE_OK || d.failed || *status != 307) break;
        if (!d.loc[0]) {
            snprintf(err, errlen, "%s answered 307 %s", url,
                     d.loc_long ? "with a Location over 4 KiB: not followed" : "without a Location");
            fclose(d.f);
            unlink(tmp);
            return -1;
        }
        snprintf(want, sizeof want, "%s", d.sha_hdr);
        if (d.loc[0] == '/') { /* relative: the server's own */
            if (sfmt(where, sizeof where, "%s%s", c->url, d.loc) < 0) where[0] = '\0';
        } else {
            snprintf(where, sizeof where, "%s", d.loc);
        }
        (void)url_redact(where, shown, sizeof shown);
        if (strncasecmp(where, "http://", 7) != 0 && strncasecmp(where, "https://", 8) != 0) {
            snprintf(err, errlen, "%s answered 307 to %s: not an http(s) URL", url, shown);
            fclose(d.f);
            unlink(tmp);
            return -1;
        }
        rc = dl_get(c, &d, where, 0, status);
        if (rc != CURLE_OK || d.failed || *status != 403) break;
        if (round == 0) log_warn("the store refused %s (403: expired?); asking the server for a fresh URL", shown);
    }
    int ok = rc == CURLE_OK && !d.failed && *status < 300;
    if (fclose(d.f) != 0) ok = 0;
    char got[65] = "";
    if (d.sha.ctx) sha256_stream_final(&d.sha, got);
    if (rc == CURLE_ABORTED_BY_CALLBACK) {
        snprintf(err, errlen, "cancelled");
        unlink(tmp);
        return -1;
    }
    if (rc != CURLE_OK && !d.failed) {
        snprintf(err, errlen, "%s: %s", shown, curl_easy_strerror(rc));
        unlink(tmp);
        return -1;
    }
    if (d.failed) {
        snprintf(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
        unlink(tmp);
        return -1;
    }
    if (!ok) { /* an error answer: its body went to err_body */
        unlink(tmp);
        return 0;
    }
    if (rename(tmp, out_path) < 0) {
        snprintf(err, errlen, "cannot rename %s: %s", tmp, strerror(errno));
        unlink(tmp);
        return -1;
    }
    snprintf(sha_hdr, 65, "%s", where[0] ? want : d.sha_hdr);
    snprintf(sha_got, 65, "%s", got);
    if (locn) {
        if (where[0]) (void)url_redact(where, loc, locn); /* where the bytes came from, without the signature */
        else snprintf(loc, locn, "%s", d.loc);
    }
    *size = d.n;
    return 0;
}

int client_download(client *c, const char *path, const char *out_path, long *status, char sha_hdr[65],
                    char sha_got[65], char *loc, size_t locn, uint64_t *size, buf *err_body, char *err,
                    size_t errlen) {
    if (err_body) return download(c, path, out_path, status, sha_hdr, sha_got, loc, locn, size, err_body, err, errlen);
    buf own; /* a standby's 503 is known by its body: kept even when the caller wants none */
    buf_init(&own, 1u << 16);
    int rc = download(c, path, out_path, status, sha_hdr, sha_got, loc, locn, size, &own, err, errlen);
    buf_release(&own);
    return rc;
}
