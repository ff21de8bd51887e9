/* client.c - libcurl requests with bearer tokens and bounded bodies. */
#include "client.h"

#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <limits.h>

#include "../common/tls.h"

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

int client_trust_pinned(const char *url, const char *pin, char *err, size_t errlen) {
    pthread_once(&g_once, global_init);
    if (strncmp(url, "https://", 8) != 0) {
        snprintf(err, errlen, "--ca-hash needs the server's https:// URL, not %s", url);
        return -1;
    }
    if (strncmp(pin, "sha256:", 7) != 0 || strlen(pin) != 71 || strspn(pin + 7, "0123456789abcdefABCDEF") != 64) {
        snprintf(err, errlen, "--ca-hash wants sha256: and 64 hex digits (as the server logs it), got '%s'", pin);
        return -1;
    }
    char full[1024];
    size_t ul = strlen(url);
    while (ul && url[ul - 1] == '/') ul--;
    if (sfmt(full, sizeof full, "%.*s/api/v1/tls/ca", (int)ul, url) < 0) {
        snprintf(err, errlen, "url too long");
        return -1;
    }
    CURL *h = curl_easy_init();
    if (!h) {
        snprintf(err, errlen, "curl_easy_init failed");
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

int client_init(client *c, const char *url, const char *token) {
    pthread_once(&g_once, global_init);
    memset(c, 0, sizeof *c);
    if (sfmt(c->url, sizeof c->url, "%s", url) < 0) return -1;
    size_t n = strlen(c->url);
    while (n && c->url[n - 1] == '/') c->url[--n] = '\0';
    if (token && sfmt(c->token, sizeof c->token, "%s", token) < 0) return -1;
    c->timeout_ms = 30000;
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

int client_request(client *c, const char *method, const char *path, const char *body, size_t body_len,
                   const char *ctype, client_reply *r) {
    memset(r, 0, sizeof *r);
    buf_init(&r->body, CLIENT_BODY_MAX);
    char url[1024];
    if (sfmt(url, sizeof url, "%s%s", c->url, path) < 0) {
        snprintf(r->error, sizeof r->error, "url too long");
        return -1;
    }
    CURL *h = c->curl;
    curl_easy_reset(h);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, c->timeout_ms);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    client_tls_apply(h);
    struct curl_slist *hdr = NULL;
    char auth[300], ct[128], acc[96];
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
    if (body) {
        snprintf(ct, sizeof ct, "Content-Type: %s", ctype ? ctype : "application/json");
        hdr = curl_slist_append(hdr, ct);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
    } else if (strcmp(method, "POST") == 0 || strcmp(method, "PUT") == 0) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, "");
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)0);
    }
    hdr = curl_slist_append(hdr, "Expect:");
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    CURLcode rc = curl_easy_perform(h);
    curl_slist_free_all(hdr);
    if (rc != CURLE_OK) {
        snprintf(r->error, sizeof r->error, "%s: %s%s", url, curl_easy_strerror(rc),
                 rc == CURLE_PEER_FAILED_VERIFICATION
                     ? (g_ca_pem ? " (the server's certificate is not signed by the CA given)"
                                 : " (give the server's CA: TRAINYARD_CA=FILE or --ca-cert FILE; its DATA/tls/ca.crt)")
                     : "");
        r->status = 0;
        return -1;
    }
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->status);
    return 0;
}

void client_reply_release(client_reply *r) { buf_release(&r->body); }

void client_default_url(char *out, size_t outlen) {
    const char *u = getenv("TRAINYARD_URL");
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
} dl;

static size_t dl_header(char *p, size_t size, size_t n, void *ud) {
    dl *d = ud;
    size_t len = size * n;
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
    return rc;
}

int client_download(client *c, const char *path, const char *out_path, long *status, char sha_hdr[65],
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
    for (int round = 0; round < 2; round++) {
        snprintf(shown, sizeof shown, "%s", url);
        rc = dl_get(c, &d, url, 1, status);
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
