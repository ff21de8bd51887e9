/* blobxfer.h - a task's checkpoint upload straight to the blob store: one
 * read pass (sha256 of the whole, MD5 of each part), POST
 * /jobs/{id}/checkpoints/uploads, the parts PUT in parallel to the presigned
 * URLs the server answered (each streamed from the source at its offset,
 * retried with backoff; an expired URL asked again), then POST .../complete.
 * The task's token goes to the server only, never to the store. A server
 * that keeps checkpoints itself (a local store) answers 409
 * upload_via_server: the caller then PUTs the bytes to the server (and this
 * process remembers it). docs/executors.md, "How checkpoints travel".
 *
 * defines: blobxfer_ckpt_upload, blobxfer_via_server */
#ifndef TRAINYARD_BLOBXFER_H
#define TRAINYARD_BLOBXFER_H

#include <cjson/cJSON.h>
#include <signal.h>
#include <stdint.h>
#include <sys/types.h>

#define BLOBXFER_VIA_SERVER 1        /* status: the server wants the bytes itself (PUT) */
#define BLOBXFER_MAX_PARTS 10000
#define BLOBXFER_MIN_PART (5LL << 20) /* S3's least part but the last */

/* The bytes to upload: read_at fills buf with up to n bytes at off and
 * returns how many (fewer only at the end), or -1. Called from several
 * threads at once (different offsets). */
typedef struct blobxfer_src {
    ssize_t (*read_at)(void *ctx, void *buf, size_t n, uint64_t off);
    void *ctx;
    uint64_t size;
} blobxfer_src;

/* Zero for the defaults. */
typedef struct blobxfer_opts {
    int64_t part_bytes;          /* 8 MiB up to 512 MiB, 64 MiB above; raised to keep parts <= 10000 */
    int parallel;                /* parts in flight: 4 */
    int max_tries;               /* per part, and for begin and complete: 8 */
    int backoff_min_ms;          /* 250, doubling to */
    int backoff_max_ms;          /* 8000; each wait +-20% jitter */
    int stall_s;                 /* a part PUT without progress this long is a failed try: 10 */
    int64_t deadline_ms;         /* mono_ms() past which no new try starts (0: none) */
    volatile sig_atomic_t *stop; /* turns non-zero: give up now (NULL: never) */
    /* Called once an upload, at the first try that failed for the store's
     * sake and is tried again (a part's transport error, stall or 5xx; the
     * server's 502/503/504): why says so, without a URL's query. From any
     * of the upload's threads. NULL: none. */
    void (*on_store_trouble)(void *ctx, const char *why);
    void *trouble_ctx;
} blobxfer_opts;

typedef struct blobxfer_result {
    /* 201: uploaded and published (answer holds the checkpoint's JSON);
     * BLOBXFER_VIA_SERVER: PUT it to the server instead; 0: the server was
     * not reached (or stopped); 409: the source could not be read whole
     * (rewritten meanwhile); else the HTTP status of the step that failed
     * (a part given up after its tries on transport errors or 5xx: 503). */
    long status;
    int store_fault;             /* the failure was the store's (a part; the server's 502/503/504 about it) */
    char sha256[65];             /* of the bytes, once the read pass ended ("" before) */
    cJSON *answer;               /* 201: the caller deletes */
    int parts;
    int64_t part_bytes;
    int part_retries;            /* part tries repeated (transport errors, 5xx) */
    int url_refreshes;           /* URLs asked again (403 from the store) */
    char err[600];               /* why, when not 201 (no URL query in it) */
} blobxfer_result;

/* Uploads src as job's checkpoint (step, epoch) through the store, talking
 * to the server at api with the task token. Fills *res (status as above).
 * Without a store upload begun (the server answered 409 upload_via_server
 * once in this process), answers BLOBXFER_VIA_SERVER after the read pass
 * (res->sha256 set, for the PUT). Abandoned uploads are aborted (DELETE
 * .../uploads/{u}, best effort). */
void blobxfer_ckpt_upload(const char *api, const char *token, int64_t job, long step, long epoch,
                          const blobxfer_src *src, const blobxfer_opts *o, blobxfer_result *res);

/* 1 once a server answered upload_via_server in this process. */
int blobxfer_via_server(void);

#endif
