/* blobs_api.h - the blob store behind checkpoints and contexts, as the API
 * sees it: the checkpoint upload routes (tasks send the bytes straight to
 * an S3 store over presigned URLs; the server signs, verifies and
 * publishes), downloads answered with a 307 to a presigned GET or relayed
 * (?via=server), the admin's view of the store, and the housekeeping that
 * aborts expired uploads (docs/server.md, "Blob store"; docs/storage.md,
 * "Blob stores").
 *
 * defines: api_blobs_routes, api_blob_error, api_blob_send, api_blobs_tick,
 *          api_blob_job_deleted, api_ckpt_keep, api_blob_quota_admit, api_blob_relay,
 *          api_blobs_metrics */
#ifndef TRAINYARD_BLOBS_API_H
#define TRAINYARD_BLOBS_API_H

#include <stdint.h>
#include "../server/http.h"
#include "../storage/blob.h"

struct server;

extern const route api_blobs_routes[];

/* Answers a failed store call: 503 store_unavailable (Retry-After: 5),
 * 502 store_denied, 507 storage_full, 410 gone (not found), 502
 * store_error; the message names the store and quotes its answer. what:
 * the operation ("upload part list", "checkpoint 12"). */
void api_blob_error(struct server *srv, http_res *res, int rc, const blob_err *e, const char *what);

/* Answers a download of key from the server's store: on s3 a 307 to a
 * presigned GET (Location; X-Checksum-Sha256 and ETag: the sha256; body
 * {"url","sha256","size"}), or with relay the bytes themselves (fetched
 * to a temporary file, which must run on the offload thread); on a local
 * store the file. filename: the attachment's name. */
void api_blob_send(struct server *srv, http_res *res, const char *key, const char *sha256, int64_t size,
                   const char *filename, const char *content_type, int relay);

/* Runs fn (a ?via=server download: api_blob_send with relay) on a thread
 * of its own while the connection waits (http_defer), so a large object's
 * fetch holds neither a pool thread nor the offload thread that checkpoint
 * uploads use. At most 8 at once: past that, 503 relay_busy with
 * Retry-After. */
void api_blob_relay(struct server *srv, http_req *req, http_res *res, http_handler fn);

/* 1 when the request asks ?via=server, 0 when it does not, -1 after
 * answering 422 for another value. */
int api_blob_via_server(http_req *req, http_res *res);

/* The team's storage quota for len more bytes in a blob store other than
 * the data directory (the disk reserve is the data directory's: not
 * asked), the team's open uploads counted: 0, or -1 after 507
 * storage_quota. */
int api_blob_quota_admit(struct server *srv, int64_t team_id, int64_t len, http_res *res);

/* The job spec's checkpoint.keep (at least 1; 3 when the spec says none). */
int api_ckpt_keep(const char *spec);

/* /metrics: trainyard_blob_uploads_open, trainyard_blob_uploads_expired_total
 * and trainyard_blob_store_errors_total{class} appended to b; 0, or -1
 * when b is full. */
int api_blobs_metrics(struct server *srv, buf *b);

/* Housekeeping (the server's tick): open uploads past their expiry aborted
 * in the store, then marked aborted. */
void api_blobs_tick(struct server *srv);

/* After the commit that deleted job_id: its objects in the store
 * (checkpoints/J/) removed and its open uploads aborted; *freed grows by
 * the bytes removed. */
void api_blob_job_deleted(struct server *srv, int64_t job_id, int64_t *freed);

#endif
