/* report.h - what a task tells the API, shared by the training worker
 * (executor/worker.c) and the command runner (executor/command.c): a sender
 * thread that batches metrics (numbered when a batch is first sent, resent
 * as is until acknowledged, retried with backoff while the server is away)
 * and a thread of its own that uploads the newest checkpoint it is handed;
 * and the retry, rendezvous and checkpoint transfer helpers both use before
 * and after the work.
 *
 * defines: report_* */
#ifndef TRAINYARD_REPORT_H
#define TRAINYARD_REPORT_H

#include <curl/curl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>

#include "../client/client.h"

#include <cjson/cJSON.h>

#define REPORT_BACKOFF_MIN_MS 250
#define REPORT_BACKOFF_MAX_MS 5000
#define REPORT_PENDING_MAX 20000     /* unsent metrics kept; oldest step metrics go first */
#define REPORT_BATCH_MAX 500
#define REPORT_FLUSH_MS 1000
#define REPORT_RDV_TIMEOUT (-3)      /* report_rdv_get: the deadline passed */
#define REPORT_PUT_MAX (1LL << 30)   /* the most PUT /checkpoints takes (the store's uploads: 5 TiB) */

/* The API a task speaks to before its work starts, and what ends its waits. */
typedef struct report_api {
    client *c;                       /* the caller's client */
    int64_t job;
    volatile sig_atomic_t *stop;     /* turns 1 on SIGTERM: the waits give up */
    const char *stopped;             /* err when they do ("stopped before training started") */
} report_api;

/* Sleeps the next backoff (250 ms doubling to 5 s) in 50 ms steps: 0, or -1
 * when a stop came. */
int report_wait_retry(volatile sig_atomic_t *stop, int64_t *backoff_ms);

/* PUT body (JSON) as key of the attempt's rendezvous, retrying while the
 * server is away: 0, or -1 with err (a 4xx answer, or a stop). */
int report_rdv_put(const report_api *a, const char *key, const char *body, char *err, size_t errlen);

/* Long-polls key of the rendezvous (wait_s a poll) until a task publishes
 * it: 0 with *out its JSON (the caller deletes; NULL when not JSON), -1 with
 * err (a 4xx answer, or a stop), REPORT_RDV_TIMEOUT once mono_ms() passes
 * deadline_ms. */
int report_rdv_get(const report_api *a, const char *key, int wait_s, int64_t deadline_ms, cJSON **out, char *err,
                   size_t errlen);

/* Downloads the job's latest checkpoint into out_path, retrying while the
 * server is away or the transfer is torn (checksum mismatch): 1 with its
 * sha256 in sha (65 bytes), 0 when the job has none, -1 with err. */
int report_fetch_ckpt(const report_api *a, const char *out_path, char sha[65], char *err, size_t errlen);

/* PUT the job's checkpoint (step, epoch): head (head_len bytes), then, when
 * fd >= 0, the file from its current offset; total bytes in all, sha256 sha.
 * h: a handle to reuse (reset here), or NULL for a fresh one. Returns the
 * HTTP status, 0 when the server was not reached; err says why unless 200
 * or 201 ("answered N: body" or the transport error). */
long report_put_ckpt(CURL *h, const char *api, const char *token, int64_t job, long step, long epoch,
                     const char *sha, const void *head, size_t head_len, int fd, uint64_t total, char *err,
                     size_t errlen);

/* A checkpoint's bytes for report_upload_ckpt: head (head_len bytes), then,
 * when fd >= 0, the file from its offset 0 (read with pread); total in all. */
typedef struct report_ckpt_bytes {
    const char *api, *token;
    int64_t job;
    int attempt;                     /* the task's, said in the job events */
    long step, epoch;
    const void *head;
    size_t head_len;
    int fd;
    uint64_t total;
    volatile sig_atomic_t *stop;     /* NULL, or turns 1: the store upload is given up */
    int64_t deadline_ms;             /* mono_ms() past which no new try starts (0: none) */
    const struct blobxfer_opts *xfer;/* the store upload's tries and parts (NULL: the defaults) */
} report_ckpt_bytes;

/* Uploads the job's checkpoint: straight to the blob store over the URLs the
 * server presigns (client/blobxfer.h), or, when the server keeps checkpoints
 * itself (it answered upload_via_server: remembered for the process), with
 * report_put_ckpt (413 without sending when past REPORT_PUT_MAX). h as
 * report_put_ckpt's. Returns the HTTP status (201:
 * the checkpoint is recorded, only once the store has it whole and the
 * server verified it), 0 when the server was not reached; err says why
 * unless 201; sha (65) the bytes' sha256 once they were read.
 *
 * The store failing: the first failed try of a spell (a part's transport
 * error, stall or 5xx; the server's 502/503/504 about the store) posts one
 * job event of kind "checkpoint_store" (the upload failed, training goes
 * on), the first upload to reach the store after it another (they reach the
 * store again). The caller keeps its retries (report_sender's backoff). */
long report_upload_ckpt(CURL *h, const report_ckpt_bytes *b, char sha[65], char *err, size_t errlen);

/* The caller's checkpoints, opaque objects the sender holds until uploaded. */
typedef struct report_ckpt_ops {
    /* One try, on the checkpoint thread: 0 uploaded, -1 refused or gone
     * (dropped), -2 not delivered: tried again after the backoff unless a
     * newer one came (err says why; "" when upload logged it itself). */
    int (*upload)(void *ctx, void *ck, long step, long epoch, char *err, size_t errlen);
    void (*release)(void *ck);
    /* Optional: the same version. Then the sender keeps the last one
     * uploaded, and is not handed it (or the one pending) again. */
    int (*same)(const void *a, const void *b);
} report_ckpt_ops;

/* The sender; its fields are its own (use the functions below). */
typedef struct report_sender {
    const char *api, *token;         /* the caller's, outliving the sender */
    int64_t job;
    const report_ckpt_ops *ops;
    void *ctx;
    pthread_t thread;                /* the metrics */
    pthread_t ck_thread;             /* the checkpoints (a slow store never holds metrics back) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int started, quit, flush_now;
    int server_ok;                   /* the last request reached the server */
    cJSON **pending;                 /* (n_pending) metrics without seq, oldest first */
    int n_pending, cap_pending;
    long dropped;                    /* step metrics dropped while the server was away */
    int64_t next_seq;                /* the seq the next batch starts at */
    int attempt;                     /* > 0: said with each batch (the server refuses a stale one) */
    int over;                        /* the server refused a batch (409): the job is at another attempt */
    char *inflight;                  /* a sent-but-unacknowledged batch (JSON), resent as is */
    int64_t inflight_last;           /* its last seq */
    int64_t backoff_ms;
    void *ck;                        /* the newest checkpoint not uploaded yet (NULL none) */
    long ck_step, ck_epoch;
    int64_t ck_gen;                  /* counts report_set_ckpt's hand-overs (ends a backoff) */
    volatile sig_atomic_t ck_cancel; /* report_stop: the upload in flight gives up (report_ckpt_cancel) */
    int ck_busy;                     /* an upload is in flight */
    void *ck_done;                   /* with ops->same: the last one uploaded (or given at start) */
    long uploaded_step;              /* step of the last checkpoint the server took (-1 none) */
} report_sender;

/* Starts the thread; metrics are numbered from next_seq. done: with
 * ops->same, the version the job has already (owned), else NULL. */
int report_start(report_sender *s, const char *api, const char *token, int64_t job, int64_t next_seq,
                 const report_ckpt_ops *ops, void *ctx, void *done);

/* The job attempt this sender reports for: each batch says it, and the
 * server refuses (409) the batches of an attempt it has already requeued.
 * Then this attempt is over: the refused batch, what is queued and every
 * later report_push are dropped (logged once), and report_attempt_over
 * turns 1. Call after report_start, before the first report_push. */
void report_set_attempt(report_sender *s, int attempt);

/* 1 once the server refused a batch because the job is at another attempt
 * (its gang was requeued): nothing this task reports is taken any more. */
int report_attempt_over(report_sender *s);

/* Queues a metric (owned). Sent at the next tick (~1 s), or at once when a
 * batch is full. */
void report_push(report_sender *s, cJSON *m);

/* Sends what is queued now rather than at the next tick. */
void report_flush_soon(report_sender *s);

/* Hands over a checkpoint (owned) to upload; it replaces one not uploaded
 * yet. With ops->same, one that is the version pending or uploaded is dropped. */
void report_set_ckpt(report_sender *s, void *ck, long step, long epoch);

/* Drops the checkpoint not uploaded yet and waits for the one in flight;
 * returns the last uploaded (with ops->same; else NULL), valid until the
 * next report_set_ckpt. */
const void *report_ckpt_settle(report_sender *s);

/* The flag report_stop raises so that an upload in flight gives up rather
 * than hold the stop (a stopped store: minutes of tries): ops->upload hands
 * it to report_upload_ckpt as its stop. Valid once s is (before start too). */
volatile sig_atomic_t *report_ckpt_cancel(report_sender *s);

long report_uploaded_step(report_sender *s);
int report_server_ok(report_sender *s);
long report_dropped(report_sender *s);

/* Waits until everything queued is delivered, or timeout_s passes: 0 when
 * delivered. */
int report_drain(report_sender *s, int timeout_s);

/* Ends the threads (the metrics after one last try; a checkpoint upload in
 * flight is cancelled: report_drain first to deliver) and frees what was not delivered.
 * Safe on a zeroed sender that never started. */
void report_stop(report_sender *s);

#endif
