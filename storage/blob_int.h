/* blob_int.h - the blob store's insides shared by storage/blob.c (the
 * store, its spec, credentials and the local backends) and
 * storage/blob_s3.c (the s3 backend). Not for other files: blob.h is the
 * interface. */
#ifndef TRAINYARD_BLOB_INT_H
#define TRAINYARD_BLOB_INT_H

#include "blob.h"

#include <limits.h>
#include <pthread.h>
#include <stdarg.h>

enum { BLOB_KIND_DATA, BLOB_KIND_FILE, BLOB_KIND_S3 };

#define BLOB_POOL_MAX 8

struct blob_store {
    int kind;
    char root[PATH_MAX];     /* local stores */
    char url[1200];          /* normalized, no secret ("" for DATA) */
    /* s3 */
    char bucket[64];
    char prefix[256];        /* "" or ending in '/' */
    char region[32];
    char endpoint[320];      /* scheme://host[:port], default port left out */
    char host[300];          /* Host as sent: "127.0.0.1:7480", "bucket.s3.us-east-1.amazonaws.com" */
    char base[320];          /* scheme://host: where requests go (virtual-hosted: the bucket's host) */
    int https;
    int path_style;          /* 1: /bucket/key (whenever an endpoint is given) */
    char cred_path[PATH_MAX];
    char akid[128];
    char secret[256];        /* zeroed at close; never in a message */
    char *token;             /* aws_session_token or NULL; zeroed at close */
    long timeout_ms;
    int list_page;           /* ListObjectsV2 max-keys (1000; tests make it small) */
    int64_t put_single_max;  /* blob_put_file: one PUT up to this (5 GiB), else multipart */
    int64_t put_part_bytes;  /* ... of parts this large (1 GiB) */
    pthread_mutex_t mu;      /* the pool of keep-alive handles */
    void *pool[BLOB_POOL_MAX];
    int npool;
};

/* Fills err (when not NULL) and returns rc. */
int blob_fail(blob_err *err, int rc, int http, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* s3 backend (blob_s3.c) */
int s3_check(blob_store *s, blob_err *err);
int s3_put(blob_store *s, const char *key, const void *data, size_t len, blob_err *err);
int s3_put_file(blob_store *s, const char *key, const char *path, blob_err *err);
int s3_head(blob_store *s, const char *key, int64_t *size, char etag[80], blob_err *err);
int s3_get_file(blob_store *s, const char *key, const char *path, blob_err *err);
int s3_delete(blob_store *s, const char *key, blob_err *err);
int s3_list(blob_store *s, const char *prefix, blob_list_cb cb, void *ctx, blob_err *err);
int s3_mpu_create(blob_store *s, const char *key, char upload_id[256], blob_err *err);
int s3_mpu_complete(blob_store *s, const char *key, const char *upload_id, int parts,
                    const unsigned char (*md5)[16], blob_err *err);
int s3_mpu_abort(blob_store *s, const char *key, const char *upload_id, blob_err *err);
int s3_mpu_abort_key(blob_store *s, const char *key, int *aborted, blob_err *err);
int s3_presign(blob_store *s, const char *method, const char *key, const char *upload_id, int part,
               const char *content_md5_b64, int ttl_s, const char *filename, char *url, size_t cap);
void s3_close(blob_store *s); /* the pool's handles */

/* The store's XML answers, bounded (tests/fuzz/fuzz_s3_xml.c). s3_xml_text:
 * the text of the next <tag>...</tag> at or after *pos (pos may be NULL:
 * from the start), entities decoded (ASCII only), into out: 0 (and *pos
 * past the close tag), -1 when absent, -2 when too long or malformed.
 * s3_xml_list: a ListObjectsV2 page: cb(ctx, Key less its first strip
 * bytes, Size) for each <Contents> (until cb returns non-zero: *stopped),
 * *truncated and the NextContinuationToken into token; 0, or -1 when the
 * page is malformed. */
int s3_xml_text(const char *xml, size_t len, const char *tag, size_t *pos, char *out, size_t cap);
int s3_xml_list(const char *xml, size_t len, size_t strip, blob_list_cb cb, void *ctx, int *stopped, int *truncated,
                char *token, size_t tcap);

/* A temporary file beside dest (dest's folder/.NAME.tmpXXXXXX, 0600):
 * open, then commit (fsync, rename over dest, fsync the folder) or abort. */
int blob_tmp_open(const char *dest, char tmp[PATH_MAX], blob_err *err);
int blob_tmp_commit(int fd, const char *tmp, const char *dest, blob_err *err);
void blob_tmp_abort(int fd, const char *tmp);
/* err from errno: ENOENT -> NOT_FOUND, EACCES/EPERM -> DENIED, ENOSPC/EDQUOT -> FULL, else ERROR. */
int blob_errno(blob_err *err, int e, const char *what, const char *path);

#endif
