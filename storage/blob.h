/* blob.h - where checkpoint and context bytes live, behind one interface
 * chosen at start: the data directory ("DATA"), a shared folder
 * ("file:///abs/dir") or an S3-compatible store ("s3://BUCKET[/PREFIX]?
 * endpoint=URL&region=R"). docs/storage.md, "Blob stores", has the contract.
 *
 * Keys: "checkpoints/<job>/<name>", "contexts/<hex>", "backups/...": the
 * characters [A-Za-z0-9._/-], 1..255 bytes, no leading or trailing '/', no
 * empty segment, no ".." and no segment that starts with '.' (the local
 * stores' temporary files do). Local stores keep a key at ROOT/<key> (files
 * 0600, folders 0700, written to a temporary name, fsynced, renamed, the
 * folder fsynced); s3 at BUCKET/PREFIX<key>.
 *
 * Every function is thread-safe (the s3 store keeps a small pool of
 * keep-alive connections behind a mutex). err may be NULL; when given it
 * is filled on every failure: http (0 when no answer came), the store's
 * <Code> or an errno / curl name, and a message that holds no secret and
 * no URL query. Nothing here logs a URL's query or the secret key.
 *
 * defines: blob_store_open, blob_store_check, blob_store_url, blob_store_is_s3,
 *          blob_store_root, blob_store_close, blob_strerror, blob_key_valid,
 *          blob_put, blob_put_file, blob_head, blob_get_file, blob_delete,
 *          blob_list, blob_mpu_create, blob_mpu_complete, blob_mpu_abort, blob_mpu_abort_key,
 *          blob_presign */
#ifndef TRAINYARD_BLOB_H
#define TRAINYARD_BLOB_H

#include <stddef.h>
#include <stdint.h>

typedef struct blob_store blob_store;

enum {
    BLOB_OK = 0,
    BLOB_NOT_FOUND = -1,   /* 404 NoSuchKey / NoSuchUpload / NoSuchBucket; ENOENT */
    BLOB_DENIED = -2,      /* 403: credentials, signature, clock skew, policy; EACCES */
    BLOB_UNAVAILABLE = -3, /* no answer (connection, timeout) or 5xx: retry later */
    BLOB_BAD = -4,         /* other 4xx (BadDigest, InvalidPart, EntityTooSmall), a bad key or spec */
    BLOB_FULL = -5,        /* ENOSPC / EDQUOT (local stores) */
    BLOB_ERROR = -6        /* anything else (local: errno in err->code) */
};

typedef struct blob_err {
    int http;       /* the store's HTTP status; 0: no answer (or a local store) */
    char code[64];  /* S3 <Code>, an errno name ("ENOSPC") or a curl error name */
    char msg[256];  /* S3 <Message>, strerror or curl's text; never a secret or a URL query */
} blob_err;

/* spec: "DATA" (root = data_dir), "file:///abs" or "s3://..."; credentials:
 * NULL unless s3 (then required: an AWS shared-credentials file, [default],
 * refused unless a regular file with mode & 077 == 0). Parses and reads the
 * credentials file; no network I/O. BLOB_OK, or BLOB_BAD with err->msg
 * saying what is wrong (never quoting the secret). */
int blob_store_open(const char *spec, const char *credentials, const char *data_dir, blob_store **out,
                    blob_err *err);
/* The start-up probe: local: the root made (0700), a small object written,
 * read back and deleted; s3: the bucket (a one-key list: its 403 says
 * SignatureDoesNotMatch or InvalidAccessKeyId, its 404 NoSuchBucket; no
 * answer is UNAVAILABLE), the store's clock (over 300 s off: DENIED
 * RequestTimeTooSkewed), then PUT/GET/DELETE of a probe object. err->msg
 * names the step ("bucket: 403 SignatureDoesNotMatch"). */
int blob_store_check(blob_store *s, blob_err *err);
const char *blob_store_url(const blob_store *s);  /* normalized, no secret; "" for DATA */
int blob_store_is_s3(const blob_store *s);
const char *blob_store_root(const blob_store *s); /* local root dir; NULL for s3 */
void blob_store_close(blob_store *s);             /* secret zeroed; NULL is nothing */
const char *blob_strerror(int rc);
/* 1 when key follows the rules above, else 0. */
int blob_key_valid(const char *key);

int blob_put(blob_store *s, const char *key, const void *data, size_t len, blob_err *err);
/* Streams the file at path (never held whole in memory). */
int blob_put_file(blob_store *s, const char *key, const char *path, blob_err *err);
/* size and etag may be NULL. etag: s3's ETag as sent (quotes included);
 * local stores: "\"<size hex>-<mtime ns hex>\"", an identity, not an MD5. */
int blob_head(blob_store *s, const char *key, int64_t *size, char etag[80], blob_err *err);
/* To path (a temporary name beside it, fsynced, renamed; mode 0600). */
int blob_get_file(blob_store *s, const char *key, const char *path, blob_err *err);
int blob_delete(blob_store *s, const char *key, blob_err *err); /* missing = BLOB_OK */
/* Calls cb for each key that starts with prefix ("" = all; s3: paged,
 * 1000 a page; local: no order promised). cb returning non-zero stops the
 * listing (blob_list then returns BLOB_OK). */
typedef int (*blob_list_cb)(void *ctx, const char *key, int64_t size);
int blob_list(blob_store *s, const char *prefix, blob_list_cb cb, void *ctx, blob_err *err);

/* s3 only (BLOB_BAD on local stores): multipart uploads and presigned URLs. */
int blob_mpu_create(blob_store *s, const char *key, char upload_id[256], blob_err *err);
/* ETag of part n = "hex(md5[n-1])"; parts 1..10000. The same parts again
 * after a success: BLOB_OK (a retry after a lost answer). An upload that is
 * no more (aborted, or completed with other parts): BLOB_NOT_FOUND
 * NoSuchUpload (radosgw answers 500 there; a ListParts tells). A part never
 * sent: BLOB_BAD InvalidPart; a part before the last under 5 MiB: BLOB_BAD
 * EntityTooSmall (the upload stays open either way). */
int blob_mpu_complete(blob_store *s, const char *key, const char *upload_id, int parts,
                      const unsigned char (*md5)[16], blob_err *err);
int blob_mpu_abort(blob_store *s, const char *key, const char *upload_id, blob_err *err); /* idempotent */
/* Every multipart upload of key the store holds (ListMultipartUploads),
 * aborted: for an upload whose UploadId was never recorded (the server
 * stopped between CreateMultipartUpload and its commit). *aborted: how
 * many. */
int blob_mpu_abort_key(blob_store *s, const char *key, int *aborted, blob_err *err);
/* method "PUT" or "GET"; upload_id NULL and part 0 for a whole object (else
 * an UploadPart URL, part 1..10000); content_md5_b64 (PUT only, 24 chars)
 * signed into the URL as the Content-MD5 header, so the store refuses other
 * bytes; filename: GET's response-content-disposition attachment name, or
 * NULL; ttl_s 1..604800. The URL into url (cap bytes): BLOB_OK, or BLOB_BAD
 * (bad argument, local store, too small a buffer). */
int blob_presign(blob_store *s, const char *method, const char *key, const char *upload_id, int part,
                 const char *content_md5_b64, int ttl_s, const char *filename, char *url, size_t cap);

#endif
