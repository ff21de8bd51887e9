/* ctxfetch.c - contexts made ready off the agent's event loop (see
 * ctxfetch.h). */
#include "ctxfetch.h"
#include "../client/client.h"
#include "../common/ctxtar.h"
#include "../common/util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define CTXF_WAIT_MS 200            /* a request waiting for another's download looks at its cancel this often */

static int req_cancelled(void *ctx) { return atomic_load(&((ctxf_req *)ctx)->cancel) != 0; }

/* ---------------------------------------------------------------- contexts in flight (mu held) */

static ctxf_busy *busy_find(ctxf_pool *p, const char *hex) {
    for (int i = 0; i < p->n_busy; i++)
        if (strcmp(p->busy[i].hex, hex) == 0) return &p->busy[i];
    return NULL;
}

/* Holds hex for a request: NULL when the table is full (cannot happen with
 * CTXF_THREADS requests at once; checked all the same). */
static ctxf_busy *busy_hold(ctxf_pool *p, const char *hex) {
    ctxf_busy *b = busy_find(p, hex);
    if (!b) {
        if (p->n_busy == CTXF_BUSY_MAX) return NULL;
        b = &p->busy[p->n_busy++];
        memset(b, 0, sizeof *b);
        snprintf(b->hex, sizeof b->hex, "%s", hex);
    }
    b->users++;
    return b;
}

static void busy_release(ctxf_pool *p, const char *hex) {
    ctxf_busy *b = busy_find(p, hex);
    if (!b || --b->users > 0) return;
    *b = p->busy[--p->n_busy];
}

/* Keeps the cache under p->cache_max bytes: the least recently used go
 * first (mtime, touched on each use), never `keep` (the one just fetched)
 * nor a context a request holds (mu held: the holders cannot lose it). */
static void cache_trim(ctxf_pool *p, const char *dir, const char *keep) {
    DIR *d = opendir(dir);
    if (!d) return;
    typedef struct { char name[80]; int64_t size; time_t mtime; } ent;
    ent *v = NULL;
    size_t n = 0, cap = 0;
    int64_t total = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        struct stat sb;
        if (e->d_name[0] == '.' || strlen(e->d_name) >= sizeof v->name || fstatat(dirfd(d), e->d_name, &sb, 0) < 0 ||
            !S_ISREG(sb.st_mode))
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            v = xrealloc(v, cap * sizeof *v);
        }
        memcpy(v[n].name, e->d_name, strlen(e->d_name) + 1); /* shorter: checked above */
        v[n].size = (int64_t)sb.st_size;
        v[n].mtime = sb.st_mtime;
        total += v[n++].size;
    }
    closedir(d);
    while (total > p->cache_max) {
        ssize_t oldest = -1;
        for (size_t i = 0; i < n; i++) {
            char hex[65];
            snprintf(hex, sizeof hex, "%.64s", v[i].name);
            if (v[i].size < 0 || strcmp(v[i].name, keep) == 0 || busy_find(p, hex)) continue;
            if (oldest < 0 || v[i].mtime < v[oldest].mtime) oldest = (ssize_t)i;
        }
        if (oldest < 0) break;
        char path[PATH_MAX + 100];
        if (sfmt(path, sizeof path, "%s/%s", dir, v[oldest].name) == 0 && unlink(path) == 0)
            log_info("context cache over %lld MiB: %s dropped", (long long)(p->cache_max >> 20), v[oldest].name);
        total -= v[oldest].size;
        v[oldest].size = -1;
    }
    free(v);
}

/* ---------------------------------------------------------------- one request */

/* GET /contexts/{id} into file (its sha256 checked against the id). 0, or
 * -1 with r->rc and r->why set. */
static int fetch(ctxf_pool *p, ctxf_req *r, const char *file) {
    const char *hex = r->id + 7;
    client c;
    if (client_init(&c, p->server, r->token) < 0) {
        r->rc = CTXF_FAILED;
        snprintf(r->why, sizeof r->why, "cannot fetch context %s: no HTTP client", r->id);
        return -1;
    }
    c.abort_cb = req_cancelled;
    c.abort_ctx = r;
    char path[128], sha_hdr[65] = "", sha_got[65] = "", err[512] = "";
    snprintf(path, sizeof path, "/api/v1/contexts/%s", r->id);
    long status = 0;
    uint64_t size = 0;
    buf eb;
    buf_init(&eb, 4096);
    int64_t t0 = mono_ms();
    int rc = client_download(&c, path, file, &status, sha_hdr, sha_got, NULL, 0, &size, &eb, err, sizeof err);
    client_release(&c);
    r->fetch_ms = (double)(mono_ms() - t0);
    if (rc < 0 && req_cancelled(r)) {
        r->rc = CTXF_CANCELLED;
        snprintf(r->why, sizeof r->why, "cancelled while context %s was fetched", r->id);
        buf_release(&eb);
        return -1;
    }
    if (rc < 0 || status != 200 || strcmp(sha_got, hex) != 0) {
        if (rc == 0 && status == 200) unlink(file);
        r->rc = CTXF_FAILED;
        snprintf(r->why, sizeof r->why, "cannot fetch context %s: %s", r->id,
                 rc < 0 ? err : status != 200 ? (eb.len ? eb.data : "refused") : "its sha256 does not match its id");
        buf_release(&eb);
        return -1;
    }
    buf_release(&eb);
    r->fetched = 1;
    r->bytes = size;
    log_info("task %lld: context %.19s... fetched (%llu bytes, %.0f ms)", (long long)r->task, r->id,
             (unsigned long long)size, r->fetch_ms);
    return 0;
}

/* Makes r's context ready: in the cache (downloaded unless there, one
 * download per context at a time), then unpacked into r->dir. */
static void make_ready(ctxf_pool *p, ctxf_req *r) {
    const char *hex = r->id + 7;
    char dir[PATH_MAX], file[PATH_MAX + 80], keep[80];
    r->rc = CTXF_OK;
    if (sfmt(dir, sizeof dir, "%s/contexts", p->cache_dir) < 0 || mkdir_p(dir, 0700) < 0 ||
        sfmt(file, sizeof file, "%s/%s.tar.gz", dir, hex) < 0) {
        r->rc = CTXF_FAILED;
        snprintf(r->why, sizeof r->why, "cannot make the context cache %.300s: %s", dir, strerror(errno));
        return;
    }
    snprintf(keep, sizeof keep, "%s.tar.gz", hex);
    pthread_mutex_lock(&p->mu);
    if (!busy_hold(p, hex)) {
        pthread_mutex_unlock(&p->mu);
        r->rc = CTXF_FAILED;
        snprintf(r->why, sizeof r->why, "cannot fetch context %s: too many contexts in flight", r->id);
        return;
    }
    for (;;) {
        /* another request downloads it: wait for that one */
        while (busy_find(p, hex)->fetching && !req_cancelled(r)) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += CTXF_WAIT_MS * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&p->cv, &p->mu, &ts);
        }
        if (req_cancelled(r)) {
            r->rc = CTXF_CANCELLED;
            snprintf(r->why, sizeof r->why, "cancelled before context %s was ready", r->id);
            break;
        }
        struct stat sb;
        if (stat(file, &sb) == 0) break; /* there (or its download by another just ended) */
        busy_find(p, hex)->fetching = 1;
        pthread_mutex_unlock(&p->mu);
        int rc = fetch(p, r, file);
        pthread_mutex_lock(&p->mu);
        busy_find(p, hex)->fetching = 0;
        pthread_cond_broadcast(&p->cv); /* those waiting find it there, or try it themselves */
        if (rc == 0) cache_trim(p, dir, keep);
        break;
    }
    pthread_mutex_unlock(&p->mu);
    if (r->rc == CTXF_OK) {
        utimensat(AT_FDCWD, file, NULL, 0); /* used: the cache keeps the recent ones */
        ctx_limits lim;
        ctx_limits_default(&lim);
        lim.cancel = req_cancelled;
        lim.cancel_ctx = r;
        char err[512] = "";
        int64_t t0 = mono_ms();
        if (ctx_unpack(file, r->dir, r->uid, (gid_t)r->uid, &lim, err, sizeof err) < 0) {
            r->rc = req_cancelled(r) ? CTXF_CANCELLED : CTXF_FAILED;
            snprintf(r->why, sizeof r->why, "%s context %s: %s",
                     r->rc == CTXF_CANCELLED ? "cancelled while unpacking" : "cannot unpack", r->id, err);
        }
        r->unpack_ms = (double)(mono_ms() - t0);
    }
    pthread_mutex_lock(&p->mu);
    busy_release(p, hex);
    pthread_mutex_unlock(&p->mu);
}

/* ---------------------------------------------------------------- the pool */

static void done_push(ctxf_pool *p, ctxf_req *r) { /* mu held */
    r->next = p->done;
    p->done = r;
    char one = 1;
    ssize_t w = write(p->wake_fd, &one, 1); /* a full pipe wakes the loop all the same */
    (void)w;
}

static void *worker_main(void *arg) {
    ctxf_pool *p = arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL); /* the agent's signals are the loop's */
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->queue && !p->quit) pthread_cond_wait(&p->cv, &p->mu);
        if (!p->queue) break;
        ctxf_req *r = p->queue;
        p->queue = r->next;
        if (!p->queue) p->queue_tail = NULL;
        r->next = NULL;
        int slot = 0;
        while (slot < CTXF_THREADS - 1 && p->running[slot]) slot++;
        p->running[slot] = r;
        pthread_mutex_unlock(&p->mu);
        make_ready(p, r);
        pthread_mutex_lock(&p->mu);
        p->running[slot] = NULL;
        done_push(p, r);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int ctxf_start(ctxf_pool *p, const char *server, const char *cache_dir, int64_t cache_max, int wake_fd) {
    memset(p, 0, sizeof *p);
    if (sfmt(p->server, sizeof p->server, "%s", server) < 0 ||
        sfmt(p->cache_dir, sizeof p->cache_dir, "%s", cache_dir) < 0)
        return -1;
    p->cache_max = cache_max;
    p->wake_fd = wake_fd;
    if (pthread_mutex_init(&p->mu, NULL) != 0) return -1;
    if (pthread_cond_init(&p->cv, NULL) != 0) {
        pthread_mutex_destroy(&p->mu);
        return -1;
    }
    p->started = 1;
    return 0;
}

int ctxf_submit(ctxf_pool *p, ctxf_req *r) {
    atomic_store(&r->cancel, 0);
    r->rc = CTXF_OK;
    r->why[0] = '\0';
    r->fetched = 0;
    r->next = NULL;
    pthread_mutex_lock(&p->mu);
    if (p->quit) {
        pthread_mutex_unlock(&p->mu);
        return -1;
    }
    while (p->n_threads < CTXF_THREADS) { /* all at the first request: they wait on cv when idle */
        if (pthread_create(&p->threads[p->n_threads], NULL, worker_main, p) != 0) break;
        p->n_threads++;
    }
    if (p->n_threads == 0) {
        pthread_mutex_unlock(&p->mu);
        return -1;
    }
    if (p->queue_tail) p->queue_tail->next = r;
    else p->queue = r;
    p->queue_tail = r;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return 0;
}

void ctxf_cancel(ctxf_req *r) { atomic_store(&r->cancel, 1); }

ctxf_req *ctxf_take_done(ctxf_pool *p) {
    if (!p->started) return NULL;
    pthread_mutex_lock(&p->mu);
    ctxf_req *d = p->done;
    p->done = NULL;
    pthread_mutex_unlock(&p->mu);
    return d;
}

void ctxf_stop(ctxf_pool *p) {
    if (!p->started) return;
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    while (p->queue) {
        ctxf_req *r = p->queue;
        p->queue = r->next;
        atomic_store(&r->cancel, 1);
        r->rc = CTXF_CANCELLED;
        snprintf(r->why, sizeof r->why, "cancelled before context %s was fetched", r->id);
        done_push(p, r);
    }
    p->queue_tail = NULL;
    for (int i = 0; i < CTXF_THREADS; i++)
        if (p->running[i]) atomic_store(&p->running[i]->cancel, 1);
    pthread_cond_broadcast(&p->cv);
    int n = p->n_threads;
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < n; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_lock(&p->mu);
    p->n_threads = 0;
    pthread_mutex_unlock(&p->mu);
}
