/* blobxfer.c - a checkpoint's upload to the blob store over the URLs the
 * server presigns (blobxfer.h): the read pass, the begin, the parts on
 * their own threads and libcurl handles, the complete, the abort. */
#include "blobxfer.h"
#include "client.h"
#include "../common/util.h"

#include <curl/curl.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define READ_CHUNK (1u << 20)
#define PARALLEL_MAX 16
#define REFRESH_MAX 3                /* a part's URL asked again at most this often */

static atomic_int g_via_server;

int blobxfer_via_server(void) { return atomic_load(&g_via_server); }

/* ---------------------------------------------------------------- the upload's state */

typedef struct xpart {
    int n;                       /* 1-based */
    uint64_t off, len;
    char *url;                   /* presigned; replaced by a refresh (mu) */
    cJSON *headers;              /* {"Content-MD5": "..."} (mu) */
    unsigned char md5[16];
} xpart;

typedef struct xfer {
    const blobxfer_src *src;
    const blobxfer_opts *o;
    const char *api, *token;
    int64_t job;
    char upload[160];            /* the server's upload token */
    xpart *parts;
    int nparts;
    pthread_mutex_t mu;          /* next, failed, err, the parts' URLs, srv, counters */
    int next;                    /* the next part to take */
    atomic_int failed;           /* a part was given up: the others stop */
    long fail_status;
    char err[600];
    pthread_mutex_t srv_mu;      /* srv */
    client srv;                  /* the server (its one handle: begin, refreshes, complete, abort) */
    int retries, refreshes;
    atomic_int troubled;         /* on_store_trouble was called */
} xfer;

static int opt_or(int v, int def) { return v > 0 ? v : def; }

/* The first store trouble of the upload, to the caller's hook. */
static void trouble(xfer *x, const char *why) {
    if (x->o->on_store_trouble && !atomic_exchange(&x->troubled, 1)) x->o->on_store_trouble(x->o->trouble_ctx, why);
}

static int stopped(const xfer *x) {
    return (x->o->stop && *x->o->stop) || (x->o->deadline_ms && mono_ms() > x->o->deadline_ms);
}

/* Sleeps the try's backoff (min doubling to max, +-20%), in 50 ms steps:
 * 0, or -1 when the upload is given up meanwhile. */
static int backoff_sleep(xfer *x, int try, unsigned *seed) {
    int64_t ms = opt_or(x->o->backoff_min_ms, 250);
    int64_t max = opt_or(x->o->backoff_max_ms, 8000);
    for (int i = 1; i < try && ms < max; i++) ms *= 2;
    if (ms > max) ms = max;
    ms = ms * (80 + (int64_t)(rand_r(seed) % 41)) / 100;
    for (int64_t t = 0; t < ms; t += 50) {
        if (stopped(x) || atomic_load(&x->failed)) return -1;
        usleep(50 * 1000);
    }
    return stopped(x) || atomic_load(&x->failed) ? -1 : 0;
}

/* The S3 error code of an XML error body ("" when none). */
static void s3_code(const char *body, size_t len, char *out, size_t cap) {
    out[0] = '\0';
    if (!body) return;
    const char *b = memmem(body, len, "<Code>", 6);
    if (!b) return;
    b += 6;
    const char *e = memmem(b, len - (size_t)(b - body), "</Code>", 7);
    if (e && (size_t)(e - b) < cap) snprintf(out, cap, "%.*s", (int)(e - b), b);
}

/* The "code" of the server's {"error":{"code",...}} ("" when none). */
static void api_code(const buf *body, char *out, size_t cap) {
    out[0] = '\0';
    cJSON *o = cJSON_ParseWithLength(body->data ? body->data : "", body->len);
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(o, "error"), "code");
    if (cJSON_IsString(c)) snprintf(out, cap, "%s", c->valuestring);
    cJSON_Delete(o);
}

/* Takes the parts of a server's answer {"parts":[{"n","url","headers"}]}
 * into x (mu held): 0, or -1 when one is malformed or unknown. */
static int take_parts(xfer *x, const cJSON *arr) {
    if (!cJSON_IsArray(arr)) return -1;
    const cJSON *p;
    cJSON_ArrayForEach(p, arr) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(p, "n");
        const cJSON *url = cJSON_GetObjectItemCaseSensitive(p, "url");
        const cJSON *h = cJSON_GetObjectItemCaseSensitive(p, "headers");
        if (!cJSON_IsNumber(n) || n->valueint < 1 || n->valueint > x->nparts || !cJSON_IsString(url) ||
            (strncmp(url->valuestring, "http://", 7) != 0 && strncmp(url->valuestring, "https://", 8) != 0) ||
            (h && !cJSON_IsObject(h)))
            return -1;
        const cJSON *v;
        cJSON_ArrayForEach(v, h) {
            if (!cJSON_IsString(v) || strpbrk(v->valuestring, "\r\n") || strpbrk(v->string, "\r\n: ")) return -1;
        }
        xpart *xp = &x->parts[n->valueint - 1];
        free(xp->url);
        cJSON_Delete(xp->headers);
        xp->url = xstrdup(url->valuestring);
        xp->headers = h ? cJSON_Duplicate(h, 1) : NULL;
        if (h && !xp->headers) abort();
    }
    return 0;
}

/* ---------------------------------------------------------------- the server */

/* One request to the server, retried on transport errors, 5xx but 507, and
 * 429 (max_tries): the status (0 unreached), the body in *r. */
static long api_call(xfer *x, client *c, const char *method, const char *path, const char *body, client_reply *r,
                     unsigned *seed) {
    int tries = opt_or(x->o->max_tries, 8);
    long st = 0;
    for (int t = 1;; t++) {
        int e = client_request(c, method, path, body, body ? strlen(body) : 0, NULL, r);
        st = e < 0 ? 0 : r->status;
        if (st && (st < 500 || st == 507) && st != 429) return st; /* 507: no room; trying again would not make any */
        if (t >= tries) return st;
        char why[200];
        snprintf(why, sizeof why, "%.190s", e < 0 ? r->error : st == 429 ? "429" : "server error");
        if (st == 502 || st == 503 || st == 504) {
            char code[64];
            api_code(&r->body, code, sizeof code);
            snprintf(why, sizeof why, "the server answered %ld %s", st, code);
            trouble(x, why);
        }
        log_warn("%s %s: %s; try %d/%d after a backoff", method, path, why, t + 1, tries);
        client_reply_release(r);
        if (backoff_sleep(x, t, seed) < 0) {
            memset(r, 0, sizeof *r);
            buf_init(&r->body, 0);
            return st;
        }
    }
}

/* Asks the server for a fresh URL of part n (an expired one): 0, or -1. */
static int refresh_part(xfer *x, int n, unsigned *seed) {
    char path[320], body[64];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints/uploads/%s/parts", (long long)x->job, x->upload);
    snprintf(body, sizeof body, "{\"parts\":[%d]}", n);
    pthread_mutex_lock(&x->srv_mu);
    client_reply r;
    long st = api_call(x, &x->srv, "POST", path, body, &r, seed);
    pthread_mutex_unlock(&x->srv_mu);
    int rc = -1;
    if (st == 200) {
        cJSON *o = cJSON_ParseWithLength(r.body.data ? r.body.data : "", r.body.len);
        pthread_mutex_lock(&x->mu);
        rc = take_parts(x, cJSON_GetObjectItemCaseSensitive(o, "parts"));
        if (rc == 0) x->refreshes++;
        pthread_mutex_unlock(&x->mu);
        cJSON_Delete(o);
    } else {
        log_warn("cannot renew the URL of part %d: the server answered %ld", n, st);
    }
    client_reply_release(&r);
    return rc;
}

/* ---------------------------------------------------------------- one part */

typedef struct part_io {
    xfer *x;
    const xpart *p;
    uint64_t pos;                /* bytes of the part sent this try */
    int src_failed;
    int stalled;                 /* stall_s without a byte either way: given up */
    curl_off_t last_ul, last_dl; /* progress seen, and when it last moved */
    int64_t moved_ms;
    buf reply;                   /* the store's answer (bounded) */
} part_io;

static size_t part_read(char *out, size_t size, size_t n, void *ud) {
    part_io *io = ud;
    size_t want = size * n;
    uint64_t left = io->p->len - io->pos;
    if (want > left) want = (size_t)left;
    if (!want) return 0;
    ssize_t got = io->x->src->read_at(io->x->src->ctx, out, want, io->p->off + io->pos);
    if (got <= 0) {
        io->src_failed = 1;
        return CURL_READFUNC_ABORT;
    }
    io->pos += (uint64_t)got;
    return (size_t)got;
}

static size_t part_sink(char *p, size_t size, size_t n, void *ud) {
    (void)buf_append(&((part_io *)ud)->reply, p, size * n); /* bounded: the rest is dropped */
    return size * n;
}

/* Also the stall check: libcurl's own (LOW_SPEED_*) averages its speed over
 * 5 s, and a stopped store's socket buffers take megabytes at once, so it
 * would see a stall many seconds late. */
static int part_progress(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal, curl_off_t ulnow) {
    (void)dltotal, (void)ultotal;
    part_io *io = ud;
    if (stopped(io->x) || atomic_load(&io->x->failed)) return 1;
    int64_t now = mono_ms();
    if (ulnow != io->last_ul || dlnow != io->last_dl) {
        io->last_ul = ulnow;
        io->last_dl = dlnow;
        io->moved_ms = now;
    } else if (now - io->moved_ms >= (int64_t)opt_or(io->x->o->stall_s, 10) * 1000) {
        io->stalled = 1;
        return 1;
    }
    return 0;
}

/* One PUT of part p: the HTTP status (0: transport error, code in *cc). */
static long part_put(xfer *x, CURL *h, const xpart *p, part_io *io, CURLcode *cc) {
    pthread_mutex_lock(&x->mu);
    char *url = xstrdup(p->url);
    struct curl_slist *hdr = NULL;
    const cJSON *v;
    cJSON_ArrayForEach(v, p->headers) {
        char line[512];
        if (sfmt(line, sizeof line, "%s: %s", v->string, v->valuestring) == 0) hdr = curl_slist_append(hdr, line);
    }
    pthread_mutex_unlock(&x->mu);
    hdr = curl_slist_append(hdr, "Expect:");
    hdr = curl_slist_append(hdr, "Content-Type:"); /* none: the presigned request is signed without one */
    io->pos = 0;
    io->src_failed = 0;
    io->stalled = 0;
    io->last_ul = io->last_dl = 0;
    io->moved_ms = mono_ms();
    buf_reset(&io->reply);
    curl_easy_reset(h);
    curl_easy_setopt(h, CURLOPT_URL, url);
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
#else
    curl_easy_setopt(h, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
    curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(h, CURLOPT_READFUNCTION, part_read);
    curl_easy_setopt(h, CURLOPT_READDATA, io);
    curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)p->len);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, part_sink);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, io);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, part_progress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, io);
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
    *cc = curl_easy_perform(h);
    long st = 0;
    if (*cc == CURLE_OK) curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &st);
    curl_slist_free_all(hdr);
    free(url);
    return st;
}

/* Gives the upload up (the first failure's reason is kept). */
static void fail(xfer *x, long status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fail(xfer *x, long status, const char *fmt, ...) {
    pthread_mutex_lock(&x->mu);
    if (!atomic_load(&x->failed)) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(x->err, sizeof x->err, fmt, ap);
        va_end(ap);
        x->fail_status = status;
        atomic_store(&x->failed, 1);
    }
    pthread_mutex_unlock(&x->mu);
}

/* Part p to the store, with its tries: 0, or -1 (the upload failed). */
static int part_upload(xfer *x, CURL *h, const xpart *p, unsigned *seed) {
    int tries = opt_or(x->o->max_tries, 8), refreshed = 0;
    part_io io = {.x = x, .p = p};
    buf_init(&io.reply, 8192);
    int rc = -1;
    for (int t = 1;;) {
        if (stopped(x)) {
            fail(x, 0, "part %d/%d: stopped", p->n, x->nparts);
            break;
        }
        if (atomic_load(&x->failed)) break;
        CURLcode cc = CURLE_OK;
        long st = part_put(x, h, p, &io, &cc);
        if (st == 200) {
            rc = 0;
            break;
        }
        if (cc == CURLE_ABORTED_BY_CALLBACK && !io.stalled) {
            if (!atomic_load(&x->failed)) fail(x, 0, "part %d/%d: stopped", p->n, x->nparts);
            break;
        }
        if (io.src_failed) {
            fail(x, 409, "part %d/%d: the checkpoint could not be read again at offset %llu", p->n, x->nparts,
                 (unsigned long long)(p->off + io.pos));
            break;
        }
        char code[64], why[160];
        s3_code(io.reply.data, io.reply.len, code, sizeof code);
        if (st) snprintf(why, sizeof why, "%ld%s%s", st, code[0] ? " " : "", code);
        else if (io.stalled) snprintf(why, sizeof why, "no progress in %d s", opt_or(x->o->stall_s, 10));
        else snprintf(why, sizeof why, "%s", curl_easy_strerror(cc));
        if (st == 403 && refreshed < REFRESH_MAX) { /* expired while queued or retried: a fresh URL, no try spent */
            refreshed++;
            log_warn("part %d/%d: the store answered %s; asking the server for a fresh URL", p->n, x->nparts, why);
            if (refresh_part(x, p->n, seed) == 0) continue;
            fail(x, 503, "part %d/%d: %s, and no fresh URL from the server", p->n, x->nparts, why);
            break;
        }
        int transient = st == 0 || st >= 500 || st == 408 || st == 429 || strcmp(code, "RequestTimeout") == 0;
        if (!transient) {
            fail(x, st, "part %d/%d: the store answered %s", p->n, x->nparts, why);
            break;
        }
        if (t >= tries) {
            fail(x, 503, "part %d/%d: %s (%d tries)", p->n, x->nparts, why, tries);
            break;
        }
        char shown[512];
        pthread_mutex_lock(&x->mu);
        (void)url_redact(p->url, shown, sizeof shown);
        x->retries++;
        pthread_mutex_unlock(&x->mu);
        log_warn("part %d/%d to %s: %s; try %d/%d after a backoff", p->n, x->nparts, shown, why, t + 1, tries);
        char said[300];
        snprintf(said, sizeof said, "part %d/%d: %s", p->n, x->nparts, why);
        trouble(x, said);
        if (backoff_sleep(x, t, seed) < 0) {
            if (!atomic_load(&x->failed)) fail(x, 0, "part %d/%d: stopped", p->n, x->nparts);
            break;
        }
        t++;
    }
    buf_release(&io.reply);
    return rc;
}

typedef struct worker_arg {
    xfer *x;
    int index;
} worker_arg;

static void *part_worker(void *arg) {
    worker_arg *w = arg;
    xfer *x = w->x;
    unsigned seed = (unsigned)mono_ms() ^ (unsigned)(w->index * 2654435761u) ^ (unsigned)getpid();
    CURL *h = curl_easy_init();
    if (!h) {
        fail(x, 0, "curl_easy_init failed");
        return NULL;
    }
    for (;;) {
        pthread_mutex_lock(&x->mu);
        int i = atomic_load(&x->failed) ? x->nparts : x->next++;
        pthread_mutex_unlock(&x->mu);
        if (i >= x->nparts || part_upload(x, h, &x->parts[i], &seed) < 0) break;
    }
    curl_easy_cleanup(h);
    return NULL;
}

/* ---------------------------------------------------------------- the read pass */

/* sha256 of the whole, MD5 of each part: 0, or -1 with res->err. */
static int read_pass(xfer *x, blobxfer_result *res) {
    EVP_MD_CTX *sha = EVP_MD_CTX_new(), *md5 = EVP_MD_CTX_new();
    unsigned char *chunk = xmalloc(READ_CHUNK);
    int rc = -1;
    if (!sha || !md5 || !EVP_DigestInit_ex(sha, EVP_sha256(), NULL)) {
        snprintf(res->err, sizeof res->err, "cannot start sha256");
        goto out;
    }
    for (int i = 0; i < x->nparts; i++) {
        xpart *p = &x->parts[i];
        if (!EVP_DigestInit_ex(md5, EVP_md5(), NULL)) {
            snprintf(res->err, sizeof res->err, "cannot start md5");
            goto out;
        }
        for (uint64_t done = 0; done < p->len;) {
            if (stopped(x)) {
                snprintf(res->err, sizeof res->err, "stopped");
                goto out;
            }
            size_t want = p->len - done < READ_CHUNK ? (size_t)(p->len - done) : READ_CHUNK;
            ssize_t got = x->src->read_at(x->src->ctx, chunk, want, p->off + done);
            if (got <= 0) {
                snprintf(res->err, sizeof res->err, "cannot read the checkpoint at offset %llu (%s)",
                         (unsigned long long)(p->off + done), got < 0 ? "read error" : "shorter than its size");
                goto out;
            }
            if (!EVP_DigestUpdate(sha, chunk, (size_t)got) || !EVP_DigestUpdate(md5, chunk, (size_t)got)) goto out;
            done += (uint64_t)got;
        }
        unsigned int l = 0;
        if (!EVP_DigestFinal_ex(md5, p->md5, &l) || l != 16) goto out;
    }
    unsigned char d[32];
    unsigned int l = 0;
    if (!EVP_DigestFinal_ex(sha, d, &l) || l != 32) goto out;
    static const char hx[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        res->sha256[2 * i] = hx[d[i] >> 4];
        res->sha256[2 * i + 1] = hx[d[i] & 15];
    }
    res->sha256[64] = '\0';
    rc = 0;
out:
    if (rc < 0 && !res->err[0]) snprintf(res->err, sizeof res->err, "cannot hash the checkpoint");
    EVP_MD_CTX_free(sha);
    EVP_MD_CTX_free(md5);
    free(chunk);
    return rc;
}

/* ---------------------------------------------------------------- the upload */

/* The part size for size bytes. */
static int64_t part_size(uint64_t size, int64_t want) {
    int64_t b = want > 0 ? want : size > (512ull << 20) ? (64LL << 20) : (8LL << 20);
    if ((uint64_t)b < size && b < BLOBXFER_MIN_PART) b = BLOBXFER_MIN_PART;
    if ((size + (uint64_t)b - 1) / (uint64_t)b > BLOBXFER_MAX_PARTS) {
        b = (int64_t)((size + BLOBXFER_MAX_PARTS - 1) / BLOBXFER_MAX_PARTS);
        b = (b + (1 << 20) - 1) / (1 << 20) * (1 << 20);
    }
    return b;
}

/* Best effort: DELETE the upload (one try). */
static void abort_upload(xfer *x) {
    char path[320];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints/uploads/%s", (long long)x->job, x->upload);
    client_reply r;
    long saved = x->srv.timeout_ms;
    x->srv.timeout_ms = 5000; /* best effort: the server's sweep aborts what is left open */
    int e = client_request(&x->srv, "DELETE", path, NULL, 0, NULL, &r);
    x->srv.timeout_ms = saved;
    if (e < 0 || (r.status != 204 && r.status != 404))
        log_warn("cannot abort upload %.12s...: %s", x->upload, e < 0 ? r.error : "refused");
    client_reply_release(&r);
}

/* The begin: 0 with x->upload and the parts' URLs; -1 with res set. */
static int begin(xfer *x, long step, long epoch, blobxfer_result *res, unsigned *seed) {
    cJSON *o = cJSON_CreateObject();
    cJSON *md5s = cJSON_AddArrayToObject(o, "md5");
    if (!o || !md5s) abort();
    cJSON_AddNumberToObject(o, "step", (double)step);
    cJSON_AddNumberToObject(o, "epoch", (double)epoch);
    cJSON_AddNumberToObject(o, "size", (double)x->src->size);
    cJSON_AddStringToObject(o, "sha256", res->sha256);
    cJSON_AddNumberToObject(o, "part_bytes", (double)res->part_bytes);
    for (int i = 0; i < x->nparts; i++) {
        char s[32];
        if (base64_encode(x->parts[i].md5, 16, s, sizeof s) < 0) abort();
        if (!cJSON_AddItemToArray(md5s, cJSON_CreateString(s))) abort();
    }
    char *body = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!body) abort();
    char path[128];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints/uploads", (long long)x->job);
    client_reply r;
    long st = api_call(x, &x->srv, "POST", path, body, &r, seed);
    free(body);
    int rc = -1;
    char code[64];
    api_code(&r.body, code, sizeof code);
    if (st == 201) {
        cJSON *a = cJSON_ParseWithLength(r.body.data ? r.body.data : "", r.body.len);
        const cJSON *u = cJSON_GetObjectItemCaseSensitive(a, "upload");
        if (cJSON_IsString(u) && strlen(u->valuestring) < sizeof x->upload &&
            strspn(u->valuestring, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.") ==
                strlen(u->valuestring) &&
            u->valuestring[0]) {
            snprintf(x->upload, sizeof x->upload, "%s", u->valuestring);
            int bad = take_parts(x, cJSON_GetObjectItemCaseSensitive(a, "parts"));
            for (int i = 0; !bad && i < x->nparts; i++)
                if (!x->parts[i].url) bad = 1;
            if (bad) {
                res->status = 502;
                snprintf(res->err, sizeof res->err, "POST %s: the server's parts are malformed or missing", path);
                abort_upload(x);
            } else {
                rc = 0;
            }
        } else {
            res->status = 502;
            snprintf(res->err, sizeof res->err, "POST %s answered 201 without an upload", path);
        }
        cJSON_Delete(a);
    } else if (st == 409 && strcmp(code, "upload_via_server") == 0) {
        atomic_store(&g_via_server, 1);
        res->status = BLOBXFER_VIA_SERVER;
    } else if (st == 405 || (st == 404 && r.body.data && strstr(r.body.data, "no such endpoint"))) {
        /* a server from before the route */
        res->status = BLOBXFER_VIA_SERVER;
    } else {
        res->status = st;
        res->store_fault = st == 502 || st == 503 || st == 504; /* the server about the store */
        if (st) snprintf(res->err, sizeof res->err, "POST %s answered %ld: %.300s", path, st, r.body.data ? r.body.data : "");
        else snprintf(res->err, sizeof res->err, "%.500s", r.error);
    }
    client_reply_release(&r);
    return rc;
}

/* The complete, retried (idempotent): 0 with res->answer, or -1 with res set. */
static int complete(xfer *x, blobxfer_result *res, unsigned *seed) {
    char path[320];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints/uploads/%s/complete", (long long)x->job, x->upload);
    client_reply r;
    long st = api_call(x, &x->srv, "POST", path, "{}", &r, seed);
    int rc = -1;
    if (st == 201) {
        res->answer = cJSON_ParseWithLength(r.body.data ? r.body.data : "", r.body.len);
        rc = 0;
    } else {
        res->status = st;
        res->store_fault = st == 502 || st == 503 || st == 504; /* the server about the store */
        if (st) snprintf(res->err, sizeof res->err, "complete answered %ld: %.300s", st, r.body.data ? r.body.data : "");
        else snprintf(res->err, sizeof res->err, "complete: %.500s", r.error);
    }
    client_reply_release(&r);
    return rc;
}

void blobxfer_ckpt_upload(const char *api, const char *token, int64_t job, long step, long epoch,
                          const blobxfer_src *src, const blobxfer_opts *o, blobxfer_result *res) {
    static const blobxfer_opts none;
    if (!o) o = &none;
    memset(res, 0, sizeof *res);
    xfer x;
    memset(&x, 0, sizeof x);
    x.src = src;
    x.o = o;
    x.api = api;
    x.token = token;
    x.job = job;
    pthread_mutex_init(&x.mu, NULL);
    pthread_mutex_init(&x.srv_mu, NULL);
    unsigned seed = (unsigned)mono_ms() ^ (unsigned)getpid();
    res->part_bytes = part_size(src->size, o->part_bytes);
    x.nparts = src->size ? (int)((src->size + (uint64_t)res->part_bytes - 1) / (uint64_t)res->part_bytes) : 1;
    res->parts = x.nparts;
    x.parts = xcalloc((size_t)x.nparts, sizeof *x.parts);
    for (int i = 0; i < x.nparts; i++) {
        x.parts[i].n = i + 1;
        x.parts[i].off = (uint64_t)i * (uint64_t)res->part_bytes;
        uint64_t end = x.parts[i].off + (uint64_t)res->part_bytes;
        x.parts[i].len = (end > src->size ? src->size : end) - x.parts[i].off;
    }
    int have_client = 0;
    if (read_pass(&x, res) < 0) {
        res->status = stopped(&x) ? 0 : 409; /* the source is not what its size said (being rewritten?) */
        goto out;
    }
    if (blobxfer_via_server()) {
        res->status = BLOBXFER_VIA_SERVER;
        goto out;
    }
    if (client_init(&x.srv, api, token) < 0) {
        snprintf(res->err, sizeof res->err, "cannot make an HTTP client");
        goto out;
    }
    have_client = 1;
    x.srv.timeout_ms = 60000;
    if (begin(&x, step, epoch, res, &seed) < 0) goto out;

    int par = o->parallel > 0 ? o->parallel : 4;
    if (par > PARALLEL_MAX) par = PARALLEL_MAX;
    if (par > x.nparts) par = x.nparts;
    pthread_t th[PARALLEL_MAX];
    worker_arg wa[PARALLEL_MAX];
    int started = 0;
    for (int i = 0; i < par; i++) {
        wa[i] = (worker_arg){&x, i};
        if (pthread_create(&th[i], NULL, part_worker, &wa[i]) != 0) break;
        started++;
    }
    if (!started) fail(&x, 0, "cannot start the part threads");
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    res->part_retries = x.retries;
    res->url_refreshes = x.refreshes;
    if (atomic_load(&x.failed)) {
        res->status = x.fail_status;
        res->store_fault = x.fail_status != 409 && !stopped(&x); /* 409: our source, not the store */
        snprintf(res->err, sizeof res->err, "%s", x.err);
        if (!stopped(&x)) abort_upload(&x); /* stopped: no time to wait; the server's sweep aborts it */
        goto out;
    }
    if (complete(&x, res, &seed) < 0) {
        /* unreached: perhaps done and its answer lost; else the server
         * answered (5xx: nothing changed) and the upload can go */
        if (res->status) abort_upload(&x);
        goto out;
    }
    res->status = 201;
out:
    if (have_client) client_release(&x.srv);
    for (int i = 0; i < x.nparts; i++) {
        free(x.parts[i].url);
        cJSON_Delete(x.parts[i].headers);
    }
    free(x.parts);
    pthread_mutex_destroy(&x.mu);
    pthread_mutex_destroy(&x.srv_mu);
}
