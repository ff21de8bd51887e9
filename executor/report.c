/* report.c - the sender's threads and the API helpers of report.h. Metric
 * sequence numbers are given when a batch is first sent and the same batch
 * is resent until acknowledged: a retry never duplicates, and dropping
 * unsent step metrics (bounded buffer) never leaves a gap. */
#include "report.h"
#include "../client/blobxfer.h"
#include "../common/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------- before and after the work */

int report_wait_retry(volatile sig_atomic_t *stop, int64_t *backoff_ms) {
    *backoff_ms = *backoff_ms ? *backoff_ms * 2 : REPORT_BACKOFF_MIN_MS;
    if (*backoff_ms > REPORT_BACKOFF_MAX_MS) *backoff_ms = REPORT_BACKOFF_MAX_MS;
    for (int64_t t = 0; t < *backoff_ms && !*stop; t += 50) usleep(50 * 1000);
    return *stop ? -1 : 0;
}

int report_rdv_put(const report_api *a, const char *key, const char *body, char *err, size_t errlen) {
    char path[160];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/rendezvous/%s", (long long)a->job, key);
    int64_t backoff = 0;
    for (;;) {
        client_reply r;
        int e = client_request(a->c, "PUT", path, body, strlen(body), NULL, &r);
        long st = e < 0 ? 0 : r.status;
        client_reply_release(&r);
        if (st >= 200 && st < 300) return 0;
        if (st >= 400 && st < 500) {
            snprintf(err, errlen, "PUT %s answered %ld", path, st);
            return -1;
        }
        if (report_wait_retry(a->stop, &backoff) < 0) {
            snprintf(err, errlen, "%s", a->stopped);
            return -1;
        }
    }
}

int report_rdv_get(const report_api *a, const char *key, int wait_s, int64_t deadline_ms, cJSON **out, char *err,
                   size_t errlen) {
    char path[160];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/rendezvous/%s?wait=%d", (long long)a->job, key, wait_s);
    *out = NULL;
    int64_t backoff = 0;
    long saved = a->c->timeout_ms;
    a->c->timeout_ms = (wait_s + 15) * 1000L; /* a long-poll outlasts the usual timeout */
    int rc = -1;
    for (;;) {
        if (*a->stop) {
            snprintf(err, errlen, "%s", a->stopped);
            break;
        }
        if (mono_ms() > deadline_ms) {
            rc = REPORT_RDV_TIMEOUT;
            break;
        }
        client_reply r;
        int e = client_request(a->c, "GET", path, NULL, 0, NULL, &r);
        long st = e < 0 ? 0 : r.status;
        if (st == 200) {
            *out = cJSON_ParseWithLength(r.body.data ? r.body.data : "", r.body.len);
            client_reply_release(&r);
            rc = 0;
            break;
        }
        client_reply_release(&r);
        if (st == 404) continue; /* not published yet: the long-poll expired */
        if (st >= 400 && st < 500) {
            snprintf(err, errlen, "GET %s answered %ld", path, st);
            break;
        }
        if (report_wait_retry(a->stop, &backoff) < 0) {
            snprintf(err, errlen, "%s", a->stopped);
            break;
        }
    }
    a->c->timeout_ms = saved;
    return rc;
}

int report_fetch_ckpt(const report_api *a, const char *out_path, char sha[65], char *err, size_t errlen) {
    char path[128];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints/latest", (long long)a->job);
    int64_t backoff = 0;
    long saved = a->c->timeout_ms;
    a->c->timeout_ms = 600000;
    int rc = -1;
    for (;;) {
        long st = 0;
        char sha_hdr[65] = "", sha_got[65] = "", derr[256] = "";
        uint64_t size = 0;
        buf eb;
        buf_init(&eb, 4096);
        int e = client_download(a->c, path, out_path, &st, sha_hdr, sha_got, NULL, 0, &size, &eb, derr, sizeof derr);
        buf_release(&eb);
        if (e == 0 && st == 404) {
            rc = 0;
            break;
        }
        if (e == 0 && st == 200 && !sha_hdr[0]) {
            snprintf(err, errlen, "the latest checkpoint came without X-Checksum-Sha256");
            break;
        }
        if (e == 0 && st == 200 && strcasecmp(sha_hdr, sha_got) == 0) {
            memcpy(sha, sha_got, 65);
            rc = 1;
            break;
        }
        if (e == 0 && st != 200 && st < 500 && st != 429) {
            snprintf(err, errlen, "GET %s answered %ld", path, st);
            break;
        }
        if (e == 0 && st == 200) /* a torn transfer: fetch again */
            log_warn("checkpoint checksum mismatch (got %.16s..., server says %.16s...); fetching again", sha_got,
                     sha_hdr);
        else
            log_warn("cannot fetch the latest checkpoint (%s); retrying", e < 0 ? derr : "server error");
        if (report_wait_retry(a->stop, &backoff) < 0) {
            snprintf(err, errlen, "%s", a->stopped);
            break;
        }
    }
    if (rc != 1) unlink(out_path);
    a->c->timeout_ms = saved;
    return rc;
}

typedef struct put_src {
    const char *head;
    size_t head_len, head_off;
    int fd;                          /* -1: head only */
} put_src;

static size_t put_read(char *p, size_t size, size_t n, void *ud) {
    put_src *u = ud;
    size_t want = size * n;
    if (u->head_off < u->head_len) {
        size_t got = u->head_len - u->head_off < want ? u->head_len - u->head_off : want;
        memcpy(p, u->head + u->head_off, got);
        u->head_off += got;
        return got;
    }
    if (u->fd < 0) return 0;
    ssize_t r = read(u->fd, p, want);
    return r < 0 ? CURL_READFUNC_ABORT : (size_t)r;
}

static size_t put_sink(char *p, size_t size, size_t n, void *ud) {
    (void)buf_append((buf *)ud, p, size * n); /* bounded: the rest of an error body is dropped */
    return size * n;
}

/* Which server of api's list took the last PUT, for the process. */
static volatile int g_put_cur;

/* One PUT to base (one URL). *sent: bytes of the request that went out
 * (0: the server was not reached, nothing read from fd). */
static long put_ckpt_one(CURL *h, const char *base, const char *token, int64_t job, long step, long epoch,
                         const char *sha, const void *head, size_t head_len, int fd, uint64_t total, long *sent,
                         char *err, size_t errlen) {
    curl_easy_reset(h);
    char url[1024], auth[320], hsum[128];
    snprintf(url, sizeof url, "%s/api/v1/jobs/%lld/checkpoints?step=%ld&epoch=%ld", base, (long long)job, step, epoch);
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
    snprintf(hsum, sizeof hsum, "X-Checksum-Sha256: %s", sha);
    struct curl_slist *hdr = curl_slist_append(NULL, auth);
    hdr = curl_slist_append(hdr, hsum);
    hdr = curl_slist_append(hdr, "Content-Type: application/octet-stream");
    hdr = curl_slist_append(hdr, "Expect:");
    buf reply;
    buf_init(&reply, 1 << 16);
    put_src u = {head, head_len, 0, fd};
    client_tls_apply(h);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(h, CURLOPT_READFUNCTION, put_read);
    curl_easy_setopt(h, CURLOPT_READDATA, &u);
    curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)total);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, put_sink);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &reply);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 600000L);
    /* a server cut off mid-upload (its network gone: nothing answers, not
     * even a reset) is left after 10 s without a byte, for the list's next */
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, 10L);
    CURLcode rc = curl_easy_perform(h);
    long st = 0;
    if (rc == CURLE_OK) curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &st);
    else snprintf(err, errlen, "%.160s: %.80s", url, curl_easy_strerror(rc));
    if (curl_easy_getinfo(h, CURLINFO_REQUEST_SIZE, sent) != CURLE_OK) *sent = 1;
    if (st && st != 201 && st != 200) snprintf(err, errlen, "answered %ld: %.200s", st, reply.data ? reply.data : "");
    buf_release(&reply);
    curl_slist_free_all(hdr);
    return st;
}

long report_put_ckpt(CURL *h, const char *api, const char *token, int64_t job, long step, long epoch,
                     const char *sha, const void *head, size_t head_len, int fd, uint64_t total, char *err,
                     size_t errlen) {
    CURL *own = NULL;
    if (!h) h = own = curl_easy_init();
    if (!h) {
        snprintf(err, errlen, "curl_easy_init failed");
        return 0;
    }
    /* api may be a list of servers (the agent's, docs/executors.md): from
     * the one that took the last PUT, the next when one is not reached or
     * is a standby (503); a PUT may be sent again, from where fd was. */
    int n = 0;
    char why[300];
    if (client_url_list_check(api, "api", &n, why, sizeof why) < 0) {
        snprintf(err, errlen, "%s", why);
        if (own) curl_easy_cleanup(own);
        return 0;
    }
    off_t start = fd >= 0 ? lseek(fd, 0, SEEK_CUR) : 0;
    int first = g_put_cur;
    long st = 0;
    for (int i = 0; i < n; i++) {
        int at = (first + i) % n;
        char base[512];
        if (client_url_at(api, at, base, sizeof base) < 0) break;
        if (i && fd >= 0 && (start < 0 || lseek(fd, start, SEEK_SET) < 0)) break; /* cannot send it again */
        long sent = 0;
        st = put_ckpt_one(h, base, token, job, step, epoch, sha, head, head_len, fd, total, &sent, err, errlen);
        if (st && st != 503) {
            g_put_cur = at;
            break;
        }
    }
    if (own) curl_easy_cleanup(own);
    return st;
}

/* ---------------------------------------------------------------- through the store */

static ssize_t bytes_read_at(void *ctx, void *p, size_t n, uint64_t off) {
    const report_ckpt_bytes *b = ctx;
    if (off < b->head_len) {
        size_t k = b->head_len - (size_t)off < n ? b->head_len - (size_t)off : n;
        memcpy(p, (const char *)b->head + off, k);
        return (ssize_t)k;
    }
    if (b->fd < 0) return 0;
    for (;;) {
        ssize_t r = pread(b->fd, p, n, (off_t)(off - b->head_len));
        if (r >= 0 || errno != EINTR) return r;
    }
}

/* The store's spells of failure, for this process (its one task's uploads):
 * whether one is on and its event was posted. */
static pthread_mutex_t g_spell_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_spell_posted;

/* POST /jobs/{id}/events {"kind":"checkpoint_store"}, one try: 1 when taken. */
static int store_event(const report_ckpt_bytes *b, const char *msg) {
    client c;
    if (client_init(&c, b->api, b->token) < 0) return 0;
    c.timeout_ms = 10000;
    cJSON *o = cJSON_CreateObject();
    if (!o) abort();
    cJSON_AddStringToObject(o, "kind", "checkpoint_store");
    cJSON_AddStringToObject(o, "message", msg);
    cJSON_AddNumberToObject(o, "attempt", b->attempt > 0 ? b->attempt : 1);
    char *body = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!body) abort();
    char path[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/events", (long long)b->job);
    client_reply r;
    int e = client_request(&c, "POST", path, body, strlen(body), NULL, &r);
    int ok = e == 0 && r.status == 200;
    if (!ok)
        log_warn("job event not taken (%s): %s", e < 0 ? r.error : "refused", msg);
    client_reply_release(&r);
    free(body);
    client_release(&c);
    return ok;
}

/* A spell begins: its one event, unless posted already. */
static void spell_failed(const report_ckpt_bytes *b, const char *why) {
    pthread_mutex_lock(&g_spell_mu);
    if (!g_spell_posted) {
        char msg[900];
        snprintf(msg, sizeof msg, "checkpoint upload failed (step %ld: %.600s); retrying, training goes on", b->step,
                 why);
        log_warn("%s", msg);
        g_spell_posted = store_event(b, msg); /* not taken: said at the next failure */
    }
    pthread_mutex_unlock(&g_spell_mu);
}

/* An upload reached the store: the spell, if one was said, is over. */
static void spell_over(const report_ckpt_bytes *b) {
    pthread_mutex_lock(&g_spell_mu);
    if (g_spell_posted) {
        char msg[160];
        snprintf(msg, sizeof msg, "checkpoints reach the store again (step %ld)", b->step);
        log_info("%s", msg);
        store_event(b, msg);
        g_spell_posted = 0;
    }
    pthread_mutex_unlock(&g_spell_mu);
}

static void on_trouble(void *ctx, const char *why) { spell_failed(ctx, why); }

long report_upload_ckpt(CURL *h, const report_ckpt_bytes *b, char sha[65], char *err, size_t errlen) {
    blobxfer_src src = {bytes_read_at, (void *)b, b->total};
    blobxfer_opts o = {0};
    if (b->xfer) o = *b->xfer;
    o.stop = b->stop;
    o.deadline_ms = b->deadline_ms;
    o.on_store_trouble = on_trouble;
    o.trouble_ctx = (void *)b;
    blobxfer_result res;
    int64_t t0 = mono_ms();
    blobxfer_ckpt_upload(b->api, b->token, b->job, b->step, b->epoch, &src, &o, &res);
    snprintf(sha, 65, "%s", res.sha256);
    cJSON_Delete(res.answer);
    if (res.status == 201) {
        double s = (double)(mono_ms() - t0) / 1000.0;
        log_info("checkpoint in the store: step %ld, %llu bytes in %d part(s), %.1f s (%.0f MiB/s), %d part retries, "
                 "%d URLs renewed",
                 b->step, (unsigned long long)b->total, res.parts, s, s > 0 ? (double)b->total / s / 1048576.0 : 0.0,
                 res.part_retries, res.url_refreshes);
        spell_over(b);
        return 201;
    }
    if (res.status != BLOBXFER_VIA_SERVER) {
        snprintf(err, errlen, "%s", res.err[0] ? res.err : "upload failed");
        if (res.store_fault) spell_failed(b, res.err);
        return res.status;
    }
    if (!res.sha256[0]) { /* not read whole */
        snprintf(err, errlen, "%s", res.err);
        return 0;
    }
    if (b->total > (uint64_t)REPORT_PUT_MAX) {
        snprintf(err, errlen, "%llu bytes: more than the server takes itself (1 GiB; a server on an S3 store takes "
                 "more)", (unsigned long long)b->total);
        return 413;
    }
    if (b->fd >= 0 && lseek(b->fd, 0, SEEK_SET) < 0) {
        snprintf(err, errlen, "cannot rewind the checkpoint: %s", strerror(errno));
        return 409;
    }
    return report_put_ckpt(h, b->api, b->token, b->job, b->step, b->epoch, res.sha256, b->head, b->head_len, b->fd,
                           b->total, err, errlen);
}

/* ---------------------------------------------------------------- sender */

static void cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(cv, mu, &ts);
}

void report_push(report_sender *s, cJSON *m) {
    pthread_mutex_lock(&s->mu);
    if (s->over) { /* the server refuses this attempt's metrics: nothing is queued */
        pthread_mutex_unlock(&s->mu);
        cJSON_Delete(m);
        return;
    }
    if (s->n_pending == REPORT_PENDING_MAX) {
        /* Full (a long outage): drop the oldest step metric; epoch and
         * test metrics are few and always kept. */
        int i = 0;
        while (i < s->n_pending) {
            const cJSON *k = cJSON_GetObjectItemCaseSensitive(s->pending[i], "kind");
            if (cJSON_IsString(k) && strcmp(k->valuestring, "step") == 0) break;
            i++;
        }
        if (i == s->n_pending) i = 0;
        cJSON_Delete(s->pending[i]);
        memmove(&s->pending[i], &s->pending[i + 1], (size_t)(s->n_pending - i - 1) * sizeof *s->pending);
        s->n_pending--;
        s->dropped++;
    }
    if (s->n_pending == s->cap_pending) {
        s->cap_pending = s->cap_pending ? s->cap_pending * 2 : 256;
        s->pending = xrealloc(s->pending, (size_t)s->cap_pending * sizeof *s->pending);
    }
    s->pending[s->n_pending++] = m;
    pthread_mutex_unlock(&s->mu);
}

void report_flush_soon(report_sender *s) {
    pthread_mutex_lock(&s->mu);
    s->flush_now = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void report_set_ckpt(report_sender *s, void *ck, long step, long epoch) {
    pthread_mutex_lock(&s->mu);
    const report_ckpt_ops *o = s->ops;
    if (o->same && ((s->ck && o->same(ck, s->ck)) || (s->ck_done && o->same(ck, s->ck_done)))) {
        pthread_mutex_unlock(&s->mu);
        o->release(ck); /* on its way, or there already */
        return;
    }
    if (s->ck) o->release(s->ck); /* an older one not uploaded yet: the newer supersedes it */
    s->ck = ck;
    s->ck_step = step;
    s->ck_epoch = epoch;
    s->ck_gen++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

const void *report_ckpt_settle(report_sender *s) {
    pthread_mutex_lock(&s->mu);
    if (s->ck) s->ops->release(s->ck);
    s->ck = NULL;
    while (s->ck_busy) pthread_cond_wait(&s->cv, &s->mu);
    const void *done = s->ck_done;
    pthread_mutex_unlock(&s->mu);
    return done;
}

volatile sig_atomic_t *report_ckpt_cancel(report_sender *s) { return &s->ck_cancel; }

long report_uploaded_step(report_sender *s) {
    pthread_mutex_lock(&s->mu);
    long v = s->uploaded_step;
    pthread_mutex_unlock(&s->mu);
    return v;
}

int report_server_ok(report_sender *s) {
    pthread_mutex_lock(&s->mu);
    int v = s->server_ok;
    pthread_mutex_unlock(&s->mu);
    return v;
}

long report_dropped(report_sender *s) {
    pthread_mutex_lock(&s->mu);
    long v = s->dropped;
    pthread_mutex_unlock(&s->mu);
    return v;
}

static void set_server_ok(report_sender *s, int ok) {
    pthread_mutex_lock(&s->mu);
    s->server_ok = ok;
    pthread_mutex_unlock(&s->mu);
}

/* Is everything delivered? (mu held) */
static int sender_idle(const report_sender *s) { return !s->inflight && !s->n_pending && !s->ck && !s->ck_busy; }

/* Are the metrics delivered? (mu held) */
static int metrics_idle(const report_sender *s) { return !s->inflight && !s->n_pending; }

/* The checkpoint handed over, one try: 0, or -1 to retry after the backoff. */
static int sender_ckpt(report_sender *s) {
    pthread_mutex_lock(&s->mu);
    void *ck = s->ck;
    long step = s->ck_step, epoch = s->ck_epoch;
    s->ck = NULL; /* taken: put back on failure unless a newer one came */
    s->ck_busy = ck != NULL;
    int was_ok = s->server_ok;
    pthread_mutex_unlock(&s->mu);
    if (!ck) return 0;
    char err[512] = "";
    int up = s->ops->upload(s->ctx, ck, step, epoch, err, sizeof err);
    if (up == -2 && was_ok && err[0]) log_warn("checkpoint upload failed (%s); retrying", err);
    pthread_mutex_lock(&s->mu);
    s->server_ok = up != -2;
    if (up == 0) {
        s->uploaded_step = step;
        if (s->ops->same) {
            if (s->ck_done) s->ops->release(s->ck_done);
            s->ck_done = ck;
            ck = NULL;
        }
    } else if (up == -2 && !s->ck) {
        s->ck = ck;
        s->ck_step = step;
        s->ck_epoch = epoch;
        ck = NULL;
    }
    s->ck_busy = 0;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (ck) s->ops->release(ck);
    return up == -2 ? -1 : 0;
}

/* One round: send the in-flight (or a new) batch of metrics. Returns 0 when
 * the server took it (or there was none), -1 on a failure to retry after
 * the backoff. */
static int sender_round(report_sender *s, client *c) {
    pthread_mutex_lock(&s->mu);
    if (!s->inflight && s->n_pending) {
        int n = s->n_pending < REPORT_BATCH_MAX ? s->n_pending : REPORT_BATCH_MAX;
        cJSON *o = cJSON_CreateObject();
        cJSON *arr = cJSON_AddArrayToObject(o, "metrics");
        if (!o || !arr) abort();
        if (s->attempt > 0 && !cJSON_AddNumberToObject(o, "attempt", s->attempt)) abort();
        for (int i = 0; i < n; i++) {
            cJSON_AddNumberToObject(s->pending[i], "seq", (double)(s->next_seq + i));
            cJSON_AddItemToArray(arr, s->pending[i]);
        }
        memmove(s->pending, s->pending + n, (size_t)(s->n_pending - n) * sizeof *s->pending);
        s->n_pending -= n;
        s->inflight = cJSON_PrintUnformatted(o);
        if (!s->inflight) abort();
        s->inflight_last = s->next_seq + n - 1;
        s->next_seq += n;
        cJSON_Delete(o);
    }
    char *body = s->inflight ? xstrdup(s->inflight) : NULL;
    int64_t last = s->inflight_last;
    int was_ok = s->server_ok;
    pthread_mutex_unlock(&s->mu);
    if (!body) return 0;

    char path[128];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/metrics", (long long)s->job);
    client_reply r;
    int e = client_request(c, "POST", path, body, strlen(body), NULL, &r);
    free(body);
    int rc = 0;
    if (e < 0 || r.status >= 500 || r.status == 429) {
        if (was_ok) log_warn("metrics not delivered (%s); retrying with backoff", e < 0 ? r.error : "server error");
        set_server_ok(s, 0);
        rc = -1;
    } else if (r.status == 409) {
        /* the job is at another attempt (its gang was requeued): this
         * attempt is over, and every later batch would be refused too */
        pthread_mutex_lock(&s->mu);
        int queued = s->n_pending;
        for (int i = 0; i < s->n_pending; i++) cJSON_Delete(s->pending[i]);
        s->n_pending = 0;
        free(s->inflight);
        s->inflight = NULL;
        s->over = 1;
        s->server_ok = 1;
        int attempt = s->attempt;
        pthread_mutex_unlock(&s->mu);
        log_warn("attempt %d is over: %.300s (metrics up to seq %lld and %d queued dropped; no more are sent)",
                 attempt, r.body.data ? r.body.data : "", (long long)last, queued);
    } else {
        if (!was_ok) log_info("server reachable again: delivering buffered metrics");
        if (r.status != 200)
            log_warn("POST metrics answered %ld: %.300s (batch up to seq %lld dropped)", r.status,
                     r.body.data ? r.body.data : "", (long long)last);
        pthread_mutex_lock(&s->mu);
        s->server_ok = 1;
        free(s->inflight);
        s->inflight = NULL;
        pthread_mutex_unlock(&s->mu);
    }
    client_reply_release(&r);
    return rc;
}

static void *sender_main(void *arg) {
    report_sender *s = arg;
    client c;
    if (client_init(&c, s->api, s->token) < 0) {
        log_error("cannot make an HTTP client for the metrics");
        return NULL;
    }
    c.timeout_ms = 30000;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        int quit = s->quit;
        pthread_mutex_unlock(&s->mu);
        int rc = sender_round(s, &c);
        pthread_mutex_lock(&s->mu);
        if (rc < 0) {
            s->backoff_ms = s->backoff_ms ? s->backoff_ms * 2 : REPORT_BACKOFF_MIN_MS;
            if (s->backoff_ms > REPORT_BACKOFF_MAX_MS) s->backoff_ms = REPORT_BACKOFF_MAX_MS;
        } else {
            s->backoff_ms = 0;
        }
        if (quit && (metrics_idle(s) || rc < 0)) {
            pthread_mutex_unlock(&s->mu);
            break;
        }
        pthread_cond_broadcast(&s->cv); /* wake a waiting drain */
        int64_t wait_ms = rc < 0 ? s->backoff_ms : (s->n_pending >= REPORT_BATCH_MAX ? 0 : REPORT_FLUSH_MS);
        if (wait_ms > 0 && !s->flush_now && !(s->quit && rc == 0)) cond_wait_ms(&s->cv, &s->mu, wait_ms);
        s->flush_now = 0;
        pthread_mutex_unlock(&s->mu);
    }
    client_release(&c);
    return NULL;
}

/* The checkpoint thread: uploads what report_set_ckpt hands over, on its
 * own, so a slow or failing store (an upload's tries take minutes) never
 * holds the metrics back. A failed upload is tried again after a backoff
 * (250 ms doubling to 5 s), at once when a newer checkpoint comes; on quit,
 * one last try. */
static void *ckpt_main(void *arg) {
    report_sender *s = arg;
    int64_t backoff = 0;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->ck && !s->quit) pthread_cond_wait(&s->cv, &s->mu);
        if (!s->ck) break; /* quit, nothing pending */
        int quit = s->quit;
        pthread_mutex_unlock(&s->mu);
        int rc = sender_ckpt(s);
        pthread_mutex_lock(&s->mu);
        pthread_cond_broadcast(&s->cv); /* wake a waiting drain */
        if (rc == 0) {
            backoff = 0;
            continue;
        }
        if (quit) break;
        backoff = backoff ? backoff * 2 : REPORT_BACKOFF_MIN_MS;
        if (backoff > REPORT_BACKOFF_MAX_MS) backoff = REPORT_BACKOFF_MAX_MS;
        int64_t gen = s->ck_gen, end = mono_ms() + backoff;
        while (!s->quit && s->ck_gen == gen && mono_ms() < end) cond_wait_ms(&s->cv, &s->mu, end - mono_ms());
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

void report_set_attempt(report_sender *s, int attempt) {
    pthread_mutex_lock(&s->mu);
    s->attempt = attempt;
    pthread_mutex_unlock(&s->mu);
}

int report_attempt_over(report_sender *s) {
    if (!s->started) return 0;
    pthread_mutex_lock(&s->mu);
    int v = s->over;
    pthread_mutex_unlock(&s->mu);
    return v;
}

int report_start(report_sender *s, const char *api, const char *token, int64_t job, int64_t next_seq,
                 const report_ckpt_ops *ops, void *ctx, void *done) {
    memset(s, 0, sizeof *s);
    s->api = api;
    s->token = token;
    s->job = job;
    s->ops = ops;
    s->ctx = ctx;
    s->ck_done = done;
    s->next_seq = next_seq;
    s->server_ok = 1;
    s->uploaded_step = -1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (pthread_create(&s->thread, NULL, sender_main, s) != 0) {
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
        if (done) ops->release(done);
        s->ck_done = NULL;
        return -1;
    }
    if (pthread_create(&s->ck_thread, NULL, ckpt_main, s) != 0) {
        pthread_mutex_lock(&s->mu);
        s->quit = 1;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
        for (int i = 0; i < s->n_pending; i++) cJSON_Delete(s->pending[i]);
        free(s->pending);
        free(s->inflight);
        if (done) ops->release(done);
        s->ck_done = NULL;
        return -1;
    }
    s->started = 1;
    return 0;
}

int report_drain(report_sender *s, int timeout_s) {
    int64_t deadline = mono_ms() + (int64_t)timeout_s * 1000;
    pthread_mutex_lock(&s->mu);
    while (!sender_idle(s) && mono_ms() < deadline) {
        s->flush_now = 1;
        pthread_cond_broadcast(&s->cv);
        cond_wait_ms(&s->cv, &s->mu, 200);
    }
    int idle = sender_idle(s);
    pthread_mutex_unlock(&s->mu);
    return idle ? 0 : -1;
}

void report_stop(report_sender *s) {
    if (!s->started) return;
    pthread_mutex_lock(&s->mu);
    s->quit = 1;
    s->flush_now = 1;
    s->ck_cancel = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    pthread_join(s->ck_thread, NULL);
    for (int i = 0; i < s->n_pending; i++) cJSON_Delete(s->pending[i]);
    free(s->pending);
    free(s->inflight);
    if (s->ck) s->ops->release(s->ck);
    if (s->ck_done) s->ops->release(s->ck_done);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    s->started = 0;
}
