/* blob_s3.c - the s3 backend of the blob store (blob.h): requests signed
 * with common/sigv4 over libcurl. Not in this build yet: every call says
 * so (the spec and credentials are already read by blob.c). */
#include "blob_int.h"

#define NOT_YET(err) blob_fail(err, BLOB_UNAVAILABLE, 0, "NotImplemented", "the s3 backend is not in this build yet")

int s3_check(blob_store *s, blob_err *err) { (void)s; return NOT_YET(err); }
int s3_put(blob_store *s, const char *key, const void *data, size_t len, blob_err *err) { (void)s; (void)key; (void)data; (void)len; return NOT_YET(err); }
int s3_put_file(blob_store *s, const char *key, const char *path, blob_err *err) { (void)s; (void)key; (void)path; return NOT_YET(err); }
int s3_head(blob_store *s, const char *key, int64_t *size, char etag[80], blob_err *err) { (void)s; (void)key; (void)size; (void)etag; return NOT_YET(err); }
int s3_get_file(blob_store *s, const char *key, const char *path, blob_err *err) { (void)s; (void)key; (void)path; return NOT_YET(err); }
int s3_delete(blob_store *s, const char *key, blob_err *err) { (void)s; (void)key; return NOT_YET(err); }
int s3_list(blob_store *s, const char *prefix, blob_list_cb cb, void *ctx, blob_err *err) { (void)s; (void)prefix; (void)cb; (void)ctx; return NOT_YET(err); }
int s3_mpu_create(blob_store *s, const char *key, char upload_id[256], blob_err *err) { (void)s; (void)key; (void)upload_id; return NOT_YET(err); }
int s3_mpu_complete(blob_store *s, const char *key, const char *upload_id, int parts, const unsigned char (*md5)[16], blob_err *err) { (void)s; (void)key; (void)upload_id; (void)parts; (void)md5; return NOT_YET(err); }
int s3_mpu_abort(blob_store *s, const char *key, const char *upload_id, blob_err *err) { (void)s; (void)key; (void)upload_id; return NOT_YET(err); }
int s3_presign(blob_store *s, const char *method, const char *key, const char *upload_id, int part, const char *content_md5_b64, int ttl_s, const char *filename, char *url, size_t cap) {
    (void)s; (void)method; (void)key; (void)upload_id; (void)part; (void)content_md5_b64; (void)ttl_s; (void)filename; (void)url; (void)cap;
    return BLOB_BAD;
}
void s3_close(blob_store *s) { (void)s; }
