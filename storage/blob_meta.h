/* blob_meta.h - the rows of checkpoint uploads that tasks send straight to
 * a blob store over presigned URLs (blob_uploads, schema 18). A row is
 * inserted and committed before the store's upload is created; the
 * checkpoint row exists only from the transaction that marks its upload
 * done (blob_upload_publish); an open row past expires_at is aborted by
 * the housekeeping tick, which removes its parts or object first. So a
 * crash anywhere leaves no row pointing at nothing, and no upload the
 * tick does not find (docs/storage.md, "Blob stores").
 *
 * Storage only: the callers (api/blobs_api.c, api/checkpoints_api.c) talk
 * to the store. Return codes as store.h.
 *
 * defines: blob_upload, blob_upload_insert, blob_upload_get,
 *          blob_upload_set_remote, blob_upload_mark, blob_upload_reopen, blob_upload_publish,
 *          blob_uploads_expired, blob_uploads_of_job, blob_upload_open_bytes,
 *          blob_uploads_open_count, blob_uploads_forget */
#ifndef TRAINYARD_BLOB_META_H
#define TRAINYARD_BLOB_META_H

#include <stdint.h>
#include "db.h"
#include "exec_store.h"
#include "store_base.h"

#define BLOB_UPLOAD_MAX_PARTS 10000

typedef struct blob_upload {
    int64_t id;
    char token[65];                   /* the {u} of the routes: 32 hex */
    int64_t job_id;
    int attempt;
    int64_t step, epoch;
    char store[256];                  /* blob_store_url of the store it goes to */
    char key[256];                    /* the object's key: "checkpoints/J/A-<token>.safetensors" */
    char remote_id[256];              /* the store's UploadId; "" for one part */
    int64_t size, part_bytes;
    int parts;
    char sha256[65];                  /* as the task declared it */
    char *md5s;                       /* JSON array of base64 MD5s, one per part (heap; blob_upload_release) */
    char state[8];                    /* open, done, aborted */
    int64_t checkpoint_id;            /* done: the checkpoint made of it */
    int64_t created_at, expires_at;   /* ms since the epoch */
} blob_upload;

void blob_upload_release(blob_upload *u);

/* Inserts u (state open; id, created_at filled): STORE_OK, STORE_CONFLICT
 * for a token taken, STORE_ERROR. */
int blob_upload_insert(db *d, blob_upload *u);

/* The upload with that token of that job (job_id 0: any job). */
int blob_upload_get(db *d, const char *token, int64_t job_id, blob_upload *out);

/* The store's upload id, once created. */
int blob_upload_set_remote(db *d, int64_t id, const char *remote_id);

/* open -> state ("aborted" or "done" without a checkpoint): STORE_OK,
 * STORE_CONFLICT when it is not open any more. */
int blob_upload_mark(db *d, int64_t id, const char *state);

/* aborted -> open again: the store's parts could not be removed after the
 * row was claimed aborted, so the tick tries again. */
int blob_upload_reopen(db *d, int64_t id);

/* The verified upload made a checkpoint, in one transaction: the upload
 * is still open (else STORE_CONFLICT), the visible checkpoint row (store,
 * path = the key without "checkpoints/"), the job's last_checkpoint_at,
 * the checkpoints beyond keep hidden (their refs into pruned, at most max,
 * *n), the upload done with the checkpoint's id into *cid. */
int blob_upload_publish(db *d, const blob_upload *u, int keep, int64_t *cid, ckpt_ref *pruned, int max, int *n);

/* Open uploads with expires_at <= now, oldest first, at most max (each
 * released by the caller). */
int blob_uploads_expired(db *d, int64_t now, blob_upload *out, int max, int *n);

/* The job's open uploads, at most max. */
int blob_uploads_of_job(db *d, int64_t job_id, blob_upload *out, int max, int *n);

/* Bytes of the team's open uploads (they count against its quota). */
int blob_upload_open_bytes(db *d, int64_t team_id, int64_t *bytes);

/* Open uploads in all. */
int blob_uploads_open_count(db *d, int64_t *n);

/* Removes up to max finished rows (done or aborted) begun before the time
 * `before` (ms): their answer to a repeated complete is no longer asked
 * for; *n: how many went. */
int blob_uploads_forget(db *d, int64_t before, int max, int *n);

#endif
