/* blob_s3.c - the s3 backend of the blob store (blob.h): S3 requests over
 * libcurl, signed by common/sigv4 (header auth for the server's own calls,
 * presigned URLs for workers), path-style whenever an endpoint is given;
 * keep-alive handles in a small pool behind the store's mutex; the store's
 * XML answers read by a small bounded scanner (s3_xml_*). No URL with its
 * query and no secret is ever put in an error or a log line. */
#include "blob_int.h"
#include "../common/sigv4.h"
#include "../common/util.h"

#include <curl/curl.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define XML_MAX (1 << 20)          /* an answer's body we read */
#define MAX_SKEW_S 300

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_init_once(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

/* ---------------------------------------------------------------- XML */

static int decode_entities_raw(const char *a, size_t n, char *out, size_t cap) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned long c = (unsigned char)a[i];
        if (c == '&') {
            const char *semi = memchr(a + i, ';', n - i < 12 ? n - i : 12);
            if (!semi) return -2;
            size_t el = (size_t)(semi - (a + i)) + 1;
            const char *e = a + i;
            if (el == 5 && !memcmp(e, "&amp;", 5)) c = '&';
            else if (el == 4 && !memcmp(e, "&lt;", 4)) c = '<';
            else if (el == 4 && !memcmp(e, "&gt;", 4)) c = '>';
            else if (el == 6 && !memcmp(e, "&quot;", 6)) c = '"';
            else if (el == 6 && !memcmp(e, "&apos;", 6)) c = '\'';
            else if (el > 3 && e[1] == '#') {
                char num[12];
                int hex = e[2] == 'x' || e[2] == 'X';
                size_t dl = el - 3 - (size_t)hex;
                if (dl == 0 || dl >= sizeof num) return -2;
                memcpy(num, e + 2 + hex, dl);
                num[dl] = '\0';
                char *end;
                c = strtoul(num, &end, hex ? 16 : 10);
                if (*end || c == 0 || c > 0x7f) return -2; /* ASCII only: keys, ids, tokens */
            } else {
                return -2;
            }
            i += el - 1;
        }
        if (o + 1 >= cap) return -2;
        out[o++] = (char)c;
    }
    out[o] = '\0';
    return 0;
}

/* out is "" on a failure: callers may print it whatever the answer held */
static int decode_entities(const char *a, size_t n, char *out, size_t cap) {
    int rc = decode_entities_raw(a, n, out, cap);
    if (rc != 0) out[0] = '\0';
    return rc;
}

int s3_xml_text(const char *xml, size_t len, const char *tag, size_t *pos, char *out, size_t cap) {
    if (out && cap) out[0] = '\0';
    if (!xml || !tag || !out || cap == 0) return -1;
    char open[64], close[64];
    if (sfmt(open, sizeof open, "<%s>", tag) < 0 || sfmt(close, sizeof close, "</%s>", tag) < 0) return -1;
    size_t ol = strlen(open), cl = strlen(close);
    size_t start = pos ? *pos : 0;
    if (start > len) return -1;
    const char *a = memmem(xml + start, len - start, open, ol);
    if (!a) return -1;
    a += ol;
    const char *b = memmem(a, len - (size_t)(a - xml), close, cl);
    if (!b) return -1;
    if (pos) *pos = (size_t)(b - xml) + cl;
    return decode_entities(a, (size_t)(b - a), out, cap);
}

int s3_xml_list(const char *xml, size_t len, size_t strip, blob_list_cb cb, void *ctx, int *stopped, int *truncated,
                char *token, size_t tcap) {
    *stopped = 0;
    *truncated = 0;
    if (token && tcap) token[0] = '\0';
    size_t pos = 0;
    for (;;) {
        const char *c = memmem(xml + pos, len - pos, "<Contents>", 10);
        if (!c) break;
        const char *end = memmem(c, len - (size_t)(c - xml), "</Contents>", 11);
        if (!end) return -1;
        size_t clen = (size_t)(end - c) + 11;
        char key[1100], size[32];
        size_t p = 0;
        if (s3_xml_text(c, clen, "Key", &p, key, sizeof key) != 0) return -1;
        p = 0;
        long sz = 0;
        if (s3_xml_text(c, clen, "Size", &p, size, sizeof size) != 0 || parse_long(size, 0, LONG_MAX, &sz) < 0)
            return -1;
        pos = (size_t)(end - xml) + 11;
        if (strlen(key) < strip) return -1;
        if (!*stopped && cb(ctx, key + strip, (int64_t)sz) != 0) *stopped = 1;
    }
    char t[16];
    size_t p = 0;
    if (s3_xml_text(xml, len, "IsTruncated", &p, t, sizeof t) == 0 && strcmp(t, "true") == 0) {
        p = 0;
        if (!token || s3_xml_text(xml, len, "NextContinuationToken", &p, token, tcap) != 0 || !token[0]) return -1;
        *truncated = 1;
    }
    return 0;
}

/* ---------------------------------------------------------------- handles */

static CURL *handle_get(blob_store *s) {
    CURL *h = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->npool > 0) h = s->pool[--s->npool];
    pthread_mutex_unlock(&s->mu);
    if (h) {
        curl_easy_reset(h); /* options gone, connections kept */
        return h;
    }
    pthread_once(&curl_once, curl_init_once);
    return curl_easy_init();
}

static void handle_put(blob_store *s, CURL *h) {
    if (!h) return;
    pthread_mutex_lock(&s->mu);
    if (s->npool < BLOB_POOL_MAX) {
        s->pool[s->npool++] = h;
        h = NULL;
    }
    pthread_mutex_unlock(&s->mu);
    if (h) curl_easy_cleanup(h);
}

void s3_close(blob_store *s) {
    for (int i = 0; i < s->npool; i++) curl_easy_cleanup(s->pool[i]);
    s->npool = 0;
}

/* ---------------------------------------------------------------- requests */

typedef struct s3_call {
    const char *op;                  /* for messages: "PUT", "HEAD bucket" */
    const char *method;
    const char *key;                 /* NULL: the bucket */
    const char *const *query;        /* unencoded "name=value" */
    const char *const *headers;      /* signed, "name:value" */
    /* body: memory, or a range of a file */
    const void *body;
    size_t body_len;
    int body_fd;                     /* -1: none */
    int64_t fd_off, fd_len;
    const char *payload_hash;        /* NULL: computed for memory bodies */
    /* answer */
    int out_fd;                      /* -1: body (2xx) into resp */
    int64_t out_written;
    buf resp;                        /* the body (bounded), or the error body */
    long status;
    int64_t content_length;
    char etag[80];
    time_t date;
    int write_failed;                /* errno of a failed write to out_fd */
    void *curl;                      /* the handle, for the status inside on_body */
    size_t sent;
} s3_call;

static void call_init(s3_call *c, const char *op, const char *method, const char *key) {
    memset(c, 0, sizeof *c);
    c->op = op;
    c->method = method;
    c->key = key;
    c->body_fd = -1;
    c->out_fd = -1;
    c->content_length = -1;
    c->date = (time_t)-1;
    buf_init(&c->resp, XML_MAX);
}

static size_t on_header(char *p, size_t size, size_t n, void *ud) {
    s3_call *c = ud;
    size_t len = size * n;
    char line[512];
    size_t l = len < sizeof line - 1 ? len : sizeof line - 1;
    memcpy(line, p, l);
    line[l] = '\0';
    line[strcspn(line, "\r\n")] = '\0';
    if (strncasecmp(line, "HTTP/", 5) == 0) { /* a new answer (after a 100 Continue): forget the last */
        c->etag[0] = '\0';
        c->content_length = -1;
        c->status = 0;
        return len;
    }
    char *colon = strchr(line, ':');
    if (!colon) return len;
    *colon = '\0';
    char *v = colon + 1;
    while (*v == ' ' || *v == '\t') v++;
    if (strcasecmp(line, "etag") == 0) snprintf(c->etag, sizeof c->etag, "%s", v);
    else if (strcasecmp(line, "content-length") == 0) {
        long cl;
        if (parse_long(v, 0, LONG_MAX, &cl) == 0) c->content_length = cl;
    } else if (strcasecmp(line, "date") == 0) {
        c->date = curl_getdate(v, NULL);
    }
    return len;
}

static size_t on_body(char *p, size_t size, size_t n, void *ud) {
    s3_call *c = ud;
    size_t len = size * n;
    if (c->out_fd >= 0 && c->status == 0) curl_easy_getinfo((CURL *)c->curl, CURLINFO_RESPONSE_CODE, &c->status);
    if (c->out_fd >= 0 && c->status >= 200 && c->status < 300) {
        size_t left = len;
        while (left) {
            ssize_t w = write(c->out_fd, p + (len - left), left);
            if (w < 0 && errno == EINTR) continue;
            if (w < 0) {
                c->write_failed = errno;
                return 0; /* curl stops: CURLE_WRITE_ERROR */
            }
            left -= (size_t)w;
        }
        c->out_written += (int64_t)len;
        return len;
    }
    if (buf_append(&c->resp, p, len) < 0) return 0; /* an answer past XML_MAX: not an S3 answer */
    return len;
}

static size_t on_read(char *p, size_t size, size_t n, void *ud) {
    s3_call *c = ud;
    size_t want = size * n;
    if (c->body_fd >= 0) {
        int64_t left = c->fd_len - (int64_t)c->sent;
        if (left <= 0) return 0;
        if ((int64_t)want > left) want = (size_t)left;
        for (;;) {
            ssize_t r = pread(c->body_fd, p, want, (off_t)(c->fd_off + (int64_t)c->sent));
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) return CURL_READFUNC_ABORT; /* the file shrank or failed */
            c->sent += (size_t)r;
            return (size_t)r;
        }
    }
    size_t left = c->body_len - c->sent;
    if (want > left) want = left;
    if (want) memcpy(p, (const char *)c->body + c->sent, want);
    c->sent += want;
    return want;
}

static int seek_body(void *ud, curl_off_t off, int origin) {
    s3_call *c = ud;
    if (origin != SEEK_SET || off < 0) return CURL_SEEKFUNC_CANTSEEK;
    c->sent = (size_t)off;
    return CURL_SEEKFUNC_OK;
}

/* the path as signed and sent (unencoded): /bucket/prefix+key or /prefix+key */
static int object_path(const blob_store *s, const char *key, char *out, size_t cap) {
    if (s->path_style)
        return key ? sfmt(out, cap, "/%s/%s%s", s->bucket, s->prefix, key) : sfmt(out, cap, "/%s", s->bucket);
    return key ? sfmt(out, cap, "/%s%s", s->prefix, key) : sfmt(out, cap, "/");
}

static const char *curl_code_name(CURLcode cc) {
    switch (cc) {
    case CURLE_COULDNT_CONNECT: return "ConnectionRefused";
    case CURLE_COULDNT_RESOLVE_HOST: return "CouldNotResolveHost";
    case CURLE_OPERATION_TIMEDOUT: return "Timeout";
    case CURLE_SSL_CONNECT_ERROR: return "TLSError";
    case CURLE_PEER_FAILED_VERIFICATION: return "TLSVerifyFailed";
    case CURLE_SEND_ERROR: return "SendError";
    case CURLE_RECV_ERROR: return "RecvError";
    case CURLE_GOT_NOTHING: return "EmptyReply";
    case CURLE_PARTIAL_FILE: return "PartialBody";
    case CURLE_WRITE_ERROR: return "WriteError";
    case CURLE_ABORTED_BY_CALLBACK:
    case CURLE_READ_ERROR: return "ReadError";
    default: return "TransportError";
    }
}

/* rc and err for an answer that is not 2xx */
static int map_status(blob_store *s, s3_call *c, blob_err *err) {
    (void)s;
    char code[64] = "", msg[200] = "";
    const char *body = c->resp.data ? c->resp.data : "";
    size_t p = 0;
    if (s3_xml_text(body, c->resp.len, "Code", &p, code, sizeof code) != 0) code[0] = '\0';
    p = 0;
    if (s3_xml_text(body, c->resp.len, "Message", &p, msg, sizeof msg) != 0) msg[0] = '\0';
    long st = c->status;
    if (!code[0]) { /* HEAD answers have no body */
        const char *dflt = st == 404 ? (c->key ? "NoSuchKey" : "NoSuchBucket") : st == 403 ? "Forbidden"
                          : st == 400 ? "BadRequest" : st == 503 ? "ServiceUnavailable" : st >= 500 ? "InternalError" : "";
        snprintf(code, sizeof code, "%s", dflt);
    }
    int rc;
    if (st == 404) rc = BLOB_NOT_FOUND;
    else if (st == 403) rc = BLOB_DENIED;
    else if (st >= 500 || st == 408 || st == 429) rc = BLOB_UNAVAILABLE;
    else rc = BLOB_BAD;
    for (char *q = msg; *q; q++)
        if ((unsigned char)*q < 0x20) *q = ' ';
    return blob_fail(err, rc, (int)st, code, "%s%s%s: %ld %s%s%s", c->op, c->key ? " " : "", c->key ? c->key : "", st,
                     code, msg[0] ? ": " : "", msg);
}

static int perform(blob_store *s, s3_call *c, blob_err *err) {
    char path[1024], enc_path[3200], query[8192], url[12000], auth[1024], amz_date[17], payload[65];
    if (object_path(s, c->key, path, sizeof path) < 0 || sigv4_uri_encode(path, 1, enc_path, sizeof enc_path) < 0)
        return blob_fail(err, BLOB_BAD, 0, "InvalidKey", "%s: key too long", c->op);
    sigv4_req r = {.method = c->method, .host = s->host, .path = path, .query = c->query, .headers = c->headers,
                   .now = time(NULL)};
    if (c->payload_hash) r.payload_hash = c->payload_hash;
    else if (c->body_fd < 0) {
        sha256_hex(c->body ? c->body : "", c->body_len, payload);
        r.payload_hash = payload;
    } else {
        r.payload_hash = SIGV4_UNSIGNED;
    }
    sigv4_creds cr = {s->akid, s->secret, s->token, s->region};
    if (sigv4_query_string(&r, query, sizeof query) < 0 ||
        sfmt(url, sizeof url, "%s%s%s%s", s->base, enc_path, query[0] ? "?" : "", query) < 0 ||
        sigv4_authorize(&cr, &r, auth, sizeof auth, amz_date) < 0)
        return blob_fail(err, BLOB_BAD, 0, "InvalidRequest", "%s: cannot sign the request", c->op);

    struct curl_slist *hl = NULL;
    char line[8192];
    int ok = 1;
#define ADDH(...)                                                                  \
    do {                                                                           \
        if (sfmt(line, sizeof line, __VA_ARGS__) < 0) ok = 0;                      \
        else {                                                                     \
            struct curl_slist *nl_ = curl_slist_append(hl, line);                  \
            if (!nl_) ok = 0;                                                      \
            else hl = nl_;                                                         \
        }                                                                          \
    } while (0)
    ADDH("Authorization: %s", auth);
    ADDH("x-amz-date: %s", amz_date);
    ADDH("x-amz-content-sha256: %s", r.payload_hash);
    if (s->token) ADDH("x-amz-security-token: %s", s->token);
    for (const char *const *h = c->headers; h && *h; h++) {
        const char *colon = strchr(*h, ':');
        ADDH("%.*s: %s", (int)(colon - *h), *h, colon + 1);
    }
    ADDH("Expect:");
#undef ADDH
    explicit_bzero(auth, sizeof auth);
    if (!ok) {
        curl_slist_free_all(hl);
        return blob_fail(err, BLOB_ERROR, 0, "ENOMEM", "%s: cannot build the request", c->op);
    }
    CURL *h = handle_get(s);
    if (!h) {
        curl_slist_free_all(hl);
        return blob_fail(err, BLOB_ERROR, 0, "ENOMEM", "%s: no curl handle", c->op);
    }
    char errbuf[CURL_ERROR_SIZE] = "";
    c->curl = h;
    c->status = 0;
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, c);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, c);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L); /* a stalled store: 30 s without a byte */
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, 30L);
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    if (c->out_fd < 0 && c->body_fd < 0) curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, s->timeout_ms);
    int has_body = c->body_fd >= 0 || c->body;
    if (strcmp(c->method, "HEAD") == 0) {
        curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    } else if (strcmp(c->method, "PUT") == 0 || (strcmp(c->method, "POST") == 0 && has_body)) {
        curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(h, CURLOPT_READFUNCTION, on_read);
        curl_easy_setopt(h, CURLOPT_READDATA, c);
        curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, seek_body);
        curl_easy_setopt(h, CURLOPT_SEEKDATA, c);
        curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)(c->body_fd >= 0 ? c->fd_len : (int64_t)c->body_len));
        if (strcmp(c->method, "POST") == 0) curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, "POST");
    } else if (strcmp(c->method, "POST") == 0) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, "");
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, 0L);
    } else if (strcmp(c->method, "GET") != 0) {
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, c->method);
    }
    CURLcode cc = curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &c->status);
    curl_slist_free_all(hl);
    explicit_bzero(url, sizeof url);
    if (cc != CURLE_OK) {
        handle_put(s, h); /* curl closes a broken connection itself */
        if (cc == CURLE_WRITE_ERROR && c->write_failed) {
            int rc = blob_errno(err, c->write_failed, "write", "the downloaded object");
            return rc == BLOB_NOT_FOUND ? BLOB_ERROR : rc;
        }
        if (cc == CURLE_WRITE_ERROR)
            return blob_fail(err, BLOB_UNAVAILABLE, (int)c->status, "AnswerTooLarge", "%s: an answer over 1 MiB", c->op);
        if ((cc == CURLE_ABORTED_BY_CALLBACK || cc == CURLE_READ_ERROR) && c->body_fd >= 0)
            return blob_fail(err, BLOB_ERROR, 0, "ReadError", "%s: the file being sent could not be read", c->op);
        /* curl's text names the host and port, never the path or query; cut at a '?' anyway */
        errbuf[strcspn(errbuf, "?")] = '\0';
        return blob_fail(err, BLOB_UNAVAILABLE, 0, curl_code_name(cc), "%s: %s (%s)", c->op,
                         errbuf[0] ? errbuf : curl_easy_strerror(cc), s->endpoint);
    }
    handle_put(s, h);
    if (c->status < 200 || c->status >= 300) return map_status(s, c, err);
    return BLOB_OK;
}

static void call_done(s3_call *c) { buf_release(&c->resp); }

/* ---------------------------------------------------------------- objects */

static void md5_b64(const unsigned char md5[16], char out[25]) {
    if (base64_encode(md5, 16, out, 25) != 24) out[0] = '\0';
}

int s3_put(blob_store *s, const char *key, const void *data, size_t len, blob_err *err) {
    unsigned char md5[16];
    char b64[25], hdr[64];
    md5_raw(data ? data : "", len, md5);
    md5_b64(md5, b64);
    snprintf(hdr, sizeof hdr, "content-md5:%s", b64);
    const char *headers[] = {hdr, NULL};
    s3_call c;
    call_init(&c, "PUT", "PUT", key);
    c.headers = headers;
    c.body = data ? data : "";
    c.body_len = len;
    int rc = perform(s, &c, err);
    call_done(&c);
    return rc;
}

/* sha256 (hex) and md5 of len bytes of fd at off */
static int digest_range(int fd, int64_t off, int64_t len, char sha[65], unsigned char md5[16]) {
    EVP_MD_CTX *a = EVP_MD_CTX_new(), *b = EVP_MD_CTX_new();
    char *chunk = xmalloc(1 << 20);
    int ok = a && b && EVP_DigestInit_ex(a, EVP_sha256(), NULL) && EVP_DigestInit_ex(b, EVP_md5(), NULL);
    int64_t done = 0;
    while (ok && done < len) {
        size_t want = (size_t)(len - done < (1 << 20) ? len - done : (1 << 20));
        ssize_t r = pread(fd, chunk, want, (off_t)(off + done));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            ok = 0;
            break;
        }
        ok = EVP_DigestUpdate(a, chunk, (size_t)r) && EVP_DigestUpdate(b, chunk, (size_t)r);
        done += r;
    }
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned int dl = 0;
    if (ok) ok = EVP_DigestFinal_ex(a, d, &dl) && dl == 32;
    if (ok) {
        static const char hx[] = "0123456789abcdef";
        for (int i = 0; i < 32; i++) {
            sha[2 * i] = hx[d[i] >> 4];
            sha[2 * i + 1] = hx[d[i] & 15];
        }
        sha[64] = '\0';
        ok = EVP_DigestFinal_ex(b, md5, &dl) && dl == 16;
    }
    free(chunk);
    EVP_MD_CTX_free(a);
    EVP_MD_CTX_free(b);
    return ok ? 0 : -1;
}

/* one PUT (or UploadPart) of a range of fd, its sha256 and MD5 signed */
static int put_range(blob_store *s, const char *key, const char *const *query, int fd, int64_t off, int64_t len,
                     unsigned char md5[16], blob_err *err) {
    char sha[65], b64[25], hdr[64];
    if (digest_range(fd, off, len, sha, md5) < 0)
        return blob_fail(err, BLOB_ERROR, 0, "ReadError", "PUT: the file could not be read");
    md5_b64(md5, b64);
    snprintf(hdr, sizeof hdr, "content-md5:%s", b64);
    const char *headers[] = {hdr, NULL};
    s3_call c;
    call_init(&c, query ? "UploadPart" : "PUT", "PUT", key);
    c.query = query;
    c.headers = headers;
    c.body_fd = fd;
    c.fd_off = off;
    c.fd_len = len;
    c.payload_hash = sha;
    int rc = perform(s, &c, err);
    call_done(&c);
    return rc;
}

int s3_put_file(blob_store *s, const char *key, const char *path, blob_err *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        int rc = blob_errno(err, errno, "open", path);
        return rc == BLOB_NOT_FOUND ? BLOB_BAD : rc;
    }
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return blob_fail(err, BLOB_BAD, 0, "EINVAL", "open %s: not a regular file", path);
    }
    int64_t size = (int64_t)st.st_size;
    int rc;
    unsigned char md5[16];
    if (size <= s->put_single_max) {
        rc = put_range(s, key, NULL, fd, 0, size, md5, err);
    } else { /* past one PUT's limit (5 GiB): a multipart upload of 1 GiB parts */
        const int64_t part = s->put_part_bytes;
        int64_t nparts = (size + part - 1) / part;
        int parts = nparts > 10000 ? 10001 : (int)nparts;
        char id[256];
        rc = parts > 10000 ? blob_fail(err, BLOB_BAD, 0, "EntityTooLarge", "PUT %s: more than 10000 parts", path)
                           : s3_mpu_create(s, key, id, err);
        if (rc == BLOB_OK) {
            unsigned char (*md5s)[16] = xcalloc((size_t)parts, 16);
            char qid[300], qn[32];
            snprintf(qid, sizeof qid, "uploadId=%s", id);
            for (int n = 1; n <= parts && rc == BLOB_OK; n++) {
                snprintf(qn, sizeof qn, "partNumber=%d", n);
                const char *query[] = {qn, qid, NULL};
                int64_t off = (int64_t)(n - 1) * part;
                rc = put_range(s, key, query, fd, off, size - off < part ? size - off : part, md5s[n - 1], err);
            }
            if (rc == BLOB_OK) rc = s3_mpu_complete(s, key, id, parts, (const unsigned char (*)[16])md5s, err);
            if (rc != BLOB_OK) s3_mpu_abort(s, key, id, NULL);
            free(md5s);
        }
    }
    close(fd);
    return rc;
}

int s3_head(blob_store *s, const char *key, int64_t *size, char etag[80], blob_err *err) {
    s3_call c;
    call_init(&c, "HEAD", "HEAD", key);
    int rc = perform(s, &c, err);
    if (rc == BLOB_OK) {
        if (size) *size = c.content_length;
        if (etag) snprintf(etag, 80, "%s", c.etag);
    }
    call_done(&c);
    return rc;
}

int s3_get_file(blob_store *s, const char *key, const char *path, blob_err *err) {
    char tmp[PATH_MAX];
    int fd = blob_tmp_open(path, tmp, err);
    if (fd < 0) return fd;
    s3_call c;
    call_init(&c, "GET", "GET", key);
    c.out_fd = fd;
    int rc = perform(s, &c, err);
    if (rc == BLOB_OK && c.content_length >= 0 && c.out_written != c.content_length)
        rc = blob_fail(err, BLOB_UNAVAILABLE, (int)c.status, "PartialBody", "GET: %lld of %lld bytes",
                       (long long)c.out_written, (long long)c.content_length);
    call_done(&c);
    if (rc != BLOB_OK) {
        blob_tmp_abort(fd, tmp);
        return rc;
    }
    return blob_tmp_commit(fd, tmp, path, err);
}

int s3_delete(blob_store *s, const char *key, blob_err *err) {
    s3_call c;
    call_init(&c, "DELETE", "DELETE", key);
    int rc = perform(s, &c, err);
    call_done(&c);
    if (rc == BLOB_NOT_FOUND) { /* missing = ok; a missing bucket is not */
        if (err && strcmp(err->code, "NoSuchBucket") == 0) return rc;
        if (err) memset(err, 0, sizeof *err);
        return BLOB_OK;
    }
    return rc;
}

int s3_list(blob_store *s, const char *prefix, blob_list_cb cb, void *ctx, blob_err *err) {
    char full[600], qp[700], token[1100] = "", qt[1200];
    if (sfmt(full, sizeof full, "%s%s", s->prefix, prefix) < 0 || sfmt(qp, sizeof qp, "prefix=%s", full) < 0)
        return blob_fail(err, BLOB_BAD, 0, "InvalidKey", "list: prefix too long");
    char qmax[32];
    snprintf(qmax, sizeof qmax, "max-keys=%d", s->list_page > 0 && s->list_page <= 1000 ? s->list_page : 1000);
    for (int page = 0; page < 1000000; page++) {
        const char *query[] = {"list-type=2", qmax, qp, token[0] ? qt : NULL, NULL};
        s3_call c;
        call_init(&c, "LIST", "GET", NULL);
        c.query = query;
        int rc = perform(s, &c, err);
        if (rc != BLOB_OK) {
            call_done(&c);
            return rc;
        }
        int stopped = 0, truncated = 0;
        if (s3_xml_list(c.resp.data ? c.resp.data : "", c.resp.len, strlen(s->prefix), cb, ctx, &stopped, &truncated,
                        token, sizeof token) < 0) {
            call_done(&c);
            return blob_fail(err, BLOB_UNAVAILABLE, 200, "MalformedXML", "LIST: an answer that is not a ListObjectsV2 page");
        }
        call_done(&c);
        if (stopped || !truncated) return BLOB_OK;
        if (sfmt(qt, sizeof qt, "continuation-token=%s", token) < 0)
            return blob_fail(err, BLOB_UNAVAILABLE, 200, "MalformedXML", "LIST: continuation token too long");
    }
    return blob_fail(err, BLOB_UNAVAILABLE, 200, "TooManyPages", "LIST: more than a million pages");
}

/* ---------------------------------------------------------------- multipart */

int s3_mpu_create(blob_store *s, const char *key, char upload_id[256], blob_err *err) {
    upload_id[0] = '\0';
    const char *query[] = {"uploads=", NULL};
    s3_call c;
    call_init(&c, "CreateMultipartUpload", "POST", key);
    c.query = query;
    int rc = perform(s, &c, err);
    if (rc == BLOB_OK) {
        size_t p = 0;
        if (s3_xml_text(c.resp.data ? c.resp.data : "", c.resp.len, "UploadId", &p, upload_id, 256) != 0 ||
            !upload_id[0]) {
            upload_id[0] = '\0';
            rc = blob_fail(err, BLOB_UNAVAILABLE, (int)c.status, "MalformedXML", "CreateMultipartUpload: no UploadId in the answer");
        }
    }
    call_done(&c);
    return rc;
}

int s3_mpu_complete(blob_store *s, const char *key, const char *upload_id, int parts,
                    const unsigned char (*md5)[16], blob_err *err) {
    buf body;
    buf_init(&body, (size_t)parts * 96 + 128);
    int ok = buf_appends(&body, "<CompleteMultipartUpload>") == 0;
    for (int n = 1; ok && n <= parts; n++) {
        char hex[33];
        for (int i = 0; i < 16; i++) snprintf(hex + 2 * i, 3, "%02x", md5[n - 1][i]);
        ok = buf_printf(&body, "<Part><PartNumber>%d</PartNumber><ETag>\"%s\"</ETag></Part>", n, hex) == 0;
    }
    ok = ok && buf_appends(&body, "</CompleteMultipartUpload>") == 0;
    if (!ok) {
        buf_release(&body);
        return blob_fail(err, BLOB_ERROR, 0, "ENOMEM", "CompleteMultipartUpload: body too large");
    }
    char qid[300];
    if (sfmt(qid, sizeof qid, "uploadId=%s", upload_id) < 0) {
        buf_release(&body);
        return blob_fail(err, BLOB_BAD, 0, "InvalidArgument", "CompleteMultipartUpload: upload id too long");
    }
    const char *query[] = {qid, NULL};
    s3_call c;
    call_init(&c, "CompleteMultipartUpload", "POST", key);
    c.query = query;
    c.body = body.data;
    c.body_len = body.len;
    int rc = perform(s, &c, err);
    if (rc == BLOB_OK && c.resp.data && memmem(c.resp.data, c.resp.len, "<Error>", 7)) {
        /* S3 may answer 200 and then an error in the body */
        char code[64] = "", msg[200] = "";
        size_t p = 0;
        s3_xml_text(c.resp.data, c.resp.len, "Code", &p, code, sizeof code);
        p = 0;
        s3_xml_text(c.resp.data, c.resp.len, "Message", &p, msg, sizeof msg);
        int r2 = strcmp(code, "InternalError") == 0 || strcmp(code, "SlowDown") == 0 ? BLOB_UNAVAILABLE : BLOB_BAD;
        rc = blob_fail(err, r2, (int)c.status, code, "CompleteMultipartUpload: 200 %s: %s", code, msg);
    }
    call_done(&c);
    buf_release(&body);
    if (rc == BLOB_UNAVAILABLE && err && err->http == 500) {
        /* radosgw 16.2 answers a completed or aborted upload with 500
         * InternalError ("This multipart completion is already in
         * progress"): ask ListParts whether the upload still exists (a
         * completion with the same parts again answers 200, as S3's) */
        const char *lq[] = {qid, "max-parts=1", NULL};
        blob_err le = {0};
        call_init(&c, "ListParts", "GET", key);
        c.query = lq;
        int lrc = perform(s, &c, &le);
        call_done(&c);
        if (lrc == BLOB_NOT_FOUND && strcmp(le.code, "NoSuchBucket") != 0) /* radosgw: 404 NoSuchKey */
            rc = blob_fail(err, BLOB_NOT_FOUND, 404, "NoSuchUpload",
                           "CompleteMultipartUpload %s: no such upload (completed or aborted; the store answered 500)", key);
    }
    return rc;
}

int s3_mpu_abort(blob_store *s, const char *key, const char *upload_id, blob_err *err) {
    char qid[300];
    if (sfmt(qid, sizeof qid, "uploadId=%s", upload_id) < 0)
        return blob_fail(err, BLOB_BAD, 0, "InvalidArgument", "AbortMultipartUpload: upload id too long");
    const char *query[] = {qid, NULL};
    s3_call c;
    call_init(&c, "AbortMultipartUpload", "DELETE", key);
    c.query = query;
    int rc = perform(s, &c, err);
    call_done(&c);
    if (rc == BLOB_NOT_FOUND && (!err || strcmp(err->code, "NoSuchBucket") != 0)) { /* NoSuchUpload: done already */
        if (err) memset(err, 0, sizeof *err);
        return BLOB_OK;
    }
    return rc;
}

/* ListMultipartUploads under the key, each upload of exactly that key
 * aborted; again until a listing finds none (an aborted upload leaves the
 * listing, so no marker is needed). */
int s3_mpu_abort_key(blob_store *s, const char *key, int *aborted, blob_err *err) {
    *aborted = 0;
    char full[600], qp[700];
    if (sfmt(full, sizeof full, "%s%s", s->prefix, key) < 0 || sfmt(qp, sizeof qp, "prefix=%s", full) < 0)
        return blob_fail(err, BLOB_BAD, 0, "InvalidKey", "ListMultipartUploads: key too long");
    for (int round = 0; round < 16; round++) {
        const char *query[] = {"uploads=", "max-uploads=1000", qp, NULL};
        s3_call c;
        call_init(&c, "ListMultipartUploads", "GET", NULL);
        c.query = query;
        int rc = perform(s, &c, err);
        if (rc != BLOB_OK) {
            call_done(&c);
            return rc;
        }
        const char *x = c.resp.data ? c.resp.data : "";
        size_t len = c.resp.len, pos = 0;
        int found = 0;
        for (;;) {
            const char *u = memmem(x + pos, len - pos, "<Upload>", 8);
            if (!u) break;
            size_t at = (size_t)(u - x) + 8;
            const char *end = memmem(x + at, len - at, "</Upload>", 9);
            if (!end) break;
            size_t elen = (size_t)(end - x);
            char k[600], id[256];
            size_t kp = at, ip = at;
            pos = elen + 9;
            if (s3_xml_text(x, elen, "Key", &kp, k, sizeof k) != 0 || s3_xml_text(x, elen, "UploadId", &ip, id, sizeof id) != 0)
                continue;
            if (strcmp(k, full) != 0) continue; /* another key under the same prefix */
            found++;
            rc = s3_mpu_abort(s, key, id, err);
            if (rc != BLOB_OK) {
                call_done(&c);
                return rc;
            }
            (*aborted)++;
        }
        call_done(&c);
        if (!found) return BLOB_OK;
    }
    return BLOB_OK;
}

/* ---------------------------------------------------------------- presign */

static int b64_md5_ok(const char *b) {
    if (strlen(b) != 24 || strcmp(b + 22, "==") != 0) return 0;
    for (int i = 0; i < 22; i++)
        if (!isalnum((unsigned char)b[i]) && b[i] != '+' && b[i] != '/') return 0;
    return 1;
}

int s3_presign(blob_store *s, const char *method, const char *key, const char *upload_id, int part,
               const char *content_md5_b64, int ttl_s, const char *filename, char *url, size_t cap) {
    char path[1024], enc_path[3200], query[12000], qid[300], qn[32], disp[300], hdr[64];
    const char *q[4] = {NULL, NULL, NULL, NULL};
    const char *h[2] = {NULL, NULL};
    int nq = 0;
    if (object_path(s, key, path, sizeof path) < 0 || sigv4_uri_encode(path, 1, enc_path, sizeof enc_path) < 0)
        return BLOB_BAD;
    if (upload_id) {
        if (sfmt(qid, sizeof qid, "uploadId=%s", upload_id) < 0) return BLOB_BAD;
        snprintf(qn, sizeof qn, "partNumber=%d", part);
        q[nq++] = qn;
        q[nq++] = qid;
    }
    if (strcmp(method, "PUT") == 0) {
        if (filename) return BLOB_BAD;
        if (content_md5_b64) {
            if (!b64_md5_ok(content_md5_b64)) return BLOB_BAD;
            snprintf(hdr, sizeof hdr, "content-md5:%s", content_md5_b64);
            h[0] = hdr;
        }
    } else {
        if (content_md5_b64) return BLOB_BAD;
        if (filename) {
            size_t fl = strlen(filename);
            if (fl == 0 || fl > 200 || filename[0] == '.') return BLOB_BAD;
            for (size_t i = 0; i < fl; i++) {
                int ch = (unsigned char)filename[i];
                if (!isalnum(ch) && ch != '.' && ch != '_' && ch != '-') return BLOB_BAD;
            }
            snprintf(disp, sizeof disp, "response-content-disposition=attachment; filename=\"%s\"", filename);
            q[nq++] = disp;
        }
    }
    sigv4_req r = {.method = method, .host = s->host, .path = path, .query = nq ? q : NULL, .headers = h[0] ? h : NULL,
                   .now = time(NULL), .expires_s = ttl_s};
    sigv4_creds cr = {s->akid, s->secret, s->token, s->region};
    if (sigv4_presign(&cr, &r, query, sizeof query) < 0) return BLOB_BAD;
    if (sfmt(url, cap, "%s%s?%s", s->base, enc_path, query) < 0) {
        url[0] = '\0';
        return BLOB_BAD;
    }
    return BLOB_OK;
}

/* ---------------------------------------------------------------- check */

int s3_check(blob_store *s, blob_err *err) {
    /* the bucket: a one-key list rather than HEAD, whose answers have no
     * body to tell InvalidAccessKeyId from SignatureDoesNotMatch */
    const char *lq[] = {"list-type=2", "max-keys=1", NULL};
    s3_call c;
    call_init(&c, "bucket", "GET", NULL);
    c.query = lq;
    int rc = perform(s, &c, err);
    time_t date = c.date;
    call_done(&c);
    if (rc != BLOB_OK) return rc;
    if (date != (time_t)-1) {
        long skew = (long)(date - time(NULL));
        if (skew > MAX_SKEW_S || skew < -MAX_SKEW_S)
            return blob_fail(err, BLOB_DENIED, 0, "RequestTimeTooSkewed",
                             "the store's clock is %ld s %s ours; presigned URLs would be refused", labs(skew),
                             skew > 0 ? "ahead of" : "behind");
    }
    char tok[64], key[96];
    if (random_token(tok, sizeof tok) < 0) return blob_fail(err, BLOB_ERROR, 0, "EIO", "no random bytes");
    snprintf(key, sizeof key, "trainyard-probe-%.16s", tok + 3);
    for (char *q = key + 16; *q; q++)
        if (!isalnum((unsigned char)*q)) *q = 'x';
    unsigned char probe[16];
    memcpy(probe, tok + 20, sizeof probe);
    rc = s3_put(s, key, probe, sizeof probe, err);
    if (rc != BLOB_OK) return rc;
    call_init(&c, "GET probe", "GET", key);
    rc = perform(s, &c, err);
    if (rc == BLOB_OK && (c.resp.len != sizeof probe || memcmp(c.resp.data, probe, sizeof probe) != 0))
        rc = blob_fail(err, BLOB_UNAVAILABLE, (int)c.status, "ProbeMismatch", "GET probe: other bytes than were written");
    call_done(&c);
    int drc = s3_delete(s, key, rc == BLOB_OK ? err : NULL);
    return rc != BLOB_OK ? rc : drc;
}
