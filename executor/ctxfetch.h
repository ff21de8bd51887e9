/* ctxfetch.h - a job's context made ready for a task off the agent's event
 * loop: fetched from the server into the node's cache (once per node: the
 * tasks that want the same context while it downloads wait for that one
 * download), then unpacked into the task's own directory. A small pool of
 * threads does the work; the loop hands a request over and goes on
 * (heartbeats, reports, other tasks' starts), and takes it back once done,
 * woken through a file descriptor. A request can be cancelled at any time
 * (the task was stopped): the download or the unpacking stops within a
 * second or a block.
 *
 * defines: ctxf_pool, ctxf_req, ctxf_start, ctxf_submit, ctxf_cancel,
 *          ctxf_take_done, ctxf_stop */
#ifndef TRAINYARD_CTXFETCH_H
#define TRAINYARD_CTXFETCH_H

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#define CTXF_THREADS 4               /* contexts made ready at once; more wait their turn */
#define CTXF_BUSY_MAX 64             /* distinct contexts in flight (one per request at most) */

enum { CTXF_OK = 0, CTXF_FAILED = -1, CTXF_CANCELLED = -2 };

/* One task's context. The caller fills the inputs, hands it to
 * ctxf_submit and gets it back from ctxf_take_done (then owns it again). */
typedef struct ctxf_req {
    int64_t task, job;               /* whose (for the log) */
    char id[72];                     /* "sha256:" and 64 hex digits */
    char dir[PATH_MAX];              /* unpacked into this directory (exists, empty) */
    uid_t uid;                       /* the files' owner ((uid_t)-1: the agent's) */
    char token[256];                 /* the node's token (GET /contexts/{id}) */
    atomic_int cancel;               /* ctxf_cancel */
    /* results */
    int rc;                          /* CTXF_OK, CTXF_FAILED (why), CTXF_CANCELLED */
    char why[900];
    int fetched;                     /* 1: this request downloaded it (else the cache had it) */
    uint64_t bytes;                  /* its size when fetched */
    double fetch_ms, unpack_ms;
    struct ctxf_req *next;
} ctxf_req;

typedef struct ctxf_busy {           /* a context some request is making ready */
    char hex[65];
    int users;                       /* requests holding it (fetching, waiting or unpacking) */
    int fetching;                    /* one of them downloads it now */
} ctxf_busy;

typedef struct ctxf_pool {
    char server[512];
    char cache_dir[PATH_MAX];        /* contexts in cache_dir/contexts/HEX.tar.gz */
    int64_t cache_max;               /* bytes kept there, least recently used out first */
    int wake_fd;                     /* written (one byte) when a request is done */
    pthread_mutex_t mu;
    pthread_cond_t cv;               /* queue not empty, a download ended, quit */
    pthread_t threads[CTXF_THREADS];
    int n_threads, started, quit;
    ctxf_req *queue, *queue_tail;    /* waiting for a thread, oldest first */
    ctxf_req *done;                  /* finished, for ctxf_take_done */
    ctxf_req *running[CTXF_THREADS]; /* being worked on (so that ctxf_stop can cancel them) */
    ctxf_busy busy[CTXF_BUSY_MAX];
    int n_busy;
} ctxf_pool;

/* Sets the pool up (threads start with the first request). 0, or -1. */
int ctxf_start(ctxf_pool *p, const char *server, const char *cache_dir, int64_t cache_max, int wake_fd);

/* Queues r (owned by the pool until ctxf_take_done hands it back). 0, or
 * -1 when no thread can be started (r stays the caller's). */
int ctxf_submit(ctxf_pool *p, ctxf_req *r);

/* Asks r to stop (safe from any thread, before or while it runs): it comes
 * back done with CTXF_CANCELLED unless it had finished. */
void ctxf_cancel(ctxf_req *r);

/* The requests finished since the last call (a list through next), each
 * the caller's again; NULL when none. */
ctxf_req *ctxf_take_done(ctxf_pool *p);

/* Cancels what is queued or running, ends the threads and frees nothing
 * the caller owns: every request submitted and not yet taken comes back
 * from a last ctxf_take_done. */
void ctxf_stop(ctxf_pool *p);

#endif
