/* blobs_api.c - checkpoints uploaded straight to the blob store (blobs_api.h).
 *
 * With an s3 store a task reserves an upload (its size, sha256 and the MD5
 * of each part), PUTs the parts to the presigned URLs the server signs
 * with those MD5s (the store refuses other bytes), then asks the server to
 * complete it: the server completes the multipart upload with the MD5s it
 * signed, HEADs the object (size and ETag must be what it signed), then
 * publishes the checkpoint, marks the upload done and prunes in one
 * transaction (storage/blob_meta.c). The rows are committed before the
 * store is touched, and objects are removed after the commit that marked
 * them, so a crash leaves nothing the tick and the sweeps do not find. */
#include "blobs_api.h"
#include "exec_common.h"
#include "retention_api.h"
#include "../spec/jobspec.h"
#include "../server/server.h"
#include "../storage/blob_meta.h"
#include "../storage/exec_store.h"
#include "../storage/quota.h"
#include "../storage/store.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#define PART_MIN (5LL << 20)          /* S3's smallest part but the last */
#define PART_MAX (5LL << 30)          /* and its largest */
#define SIZE_MAX_S3 (5LL << 40)       /* its largest object */
#define PRUNE_MAX 64
#define TICK_BATCH 16                 /* expired uploads aborted per tick */
#define JOB_UPLOADS_MAX 64

/* ---------------------------------------------------------------- helpers */

static const char *store_name(server *srv) {
    const char *u = blob_store_url(srv->blobs);
    return u && u[0] ? u : "DATA";
}

/* the store's failures the API answered, by class (/metrics) */
enum { ERR_UNAVAILABLE, ERR_DENIED, ERR_FULL, ERR_NOT_FOUND, ERR_OTHER, ERR_N };
static const char *const g_err_names[ERR_N] = {"unavailable", "denied", "full", "not_found", "other"};
static pthread_mutex_t g_err_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t g_errs[ERR_N];
static uint64_t g_tick_aborted; /* expired uploads the tick aborted */

static void count_error(int rc) {
    int k = rc == BLOB_UNAVAILABLE ? ERR_UNAVAILABLE
            : rc == BLOB_DENIED    ? ERR_DENIED
            : rc == BLOB_FULL      ? ERR_FULL
            : rc == BLOB_NOT_FOUND ? ERR_NOT_FOUND
                                   : ERR_OTHER;
    pthread_mutex_lock(&g_err_mu);
    g_errs[k]++;
    pthread_mutex_unlock(&g_err_mu);
}

int api_blobs_metrics(server *srv, buf *b) {
    int64_t open = 0;
    if (blob_uploads_open_count(srv->db, &open) != STORE_OK) open = -1;
    pthread_mutex_lock(&g_err_mu);
    uint64_t errs[ERR_N], aborted = g_tick_aborted;
    memcpy(errs, g_errs, sizeof errs);
    pthread_mutex_unlock(&g_err_mu);
    int rc = 0;
    if (open >= 0)
        rc = buf_printf(b, "# HELP trainyard_blob_uploads_open Checkpoint uploads to the blob store begun and "
                           "neither completed nor aborted.\n"
                           "# TYPE trainyard_blob_uploads_open gauge\n"
                           "trainyard_blob_uploads_open %lld\n",
                        (long long)open);
    if (rc == 0)
        rc = buf_printf(b, "# HELP trainyard_blob_uploads_expired_total Uploads the server aborted because they "
                           "were not completed within --blob-upload-max-age.\n"
                           "# TYPE trainyard_blob_uploads_expired_total counter\n"
                           "trainyard_blob_uploads_expired_total %llu\n",
                        (unsigned long long)aborted);
    if (rc == 0)
        rc = buf_printf(b, "# HELP trainyard_blob_store_errors_total Requests answered with the blob store's "
                           "failure, by class.\n"
                           "# TYPE trainyard_blob_store_errors_total counter\n");
    for (int k = 0; rc == 0 && k < ERR_N; k++)
        rc = buf_printf(b, "trainyard_blob_store_errors_total{class=\"%s\"} %llu\n", g_err_names[k],
                        (unsigned long long)errs[k]);
    return rc;
}

void api_blob_error(server *srv, http_res *res, int rc, const blob_err *e, const char *what) {
    count_error(rc);
    char answer[400];
    if (e && e->http) snprintf(answer, sizeof answer, "%d %s: %s", e->http, e->code, e->msg);
    else if (e && e->code[0]) snprintf(answer, sizeof answer, "%s: %s", e->code, e->msg);
    else snprintf(answer, sizeof answer, "%s", e && e->msg[0] ? e->msg : blob_strerror(rc));
    switch (rc) {
    case BLOB_UNAVAILABLE:
        http_error(res, 503, "store_unavailable", NULL, "%s: the blob store %s did not answer (%s); retry", what,
                   store_name(srv), answer);
        snprintf(res->xhdr_name, sizeof res->xhdr_name, "Retry-After");
        snprintf(res->xhdr_value, sizeof res->xhdr_value, "5");
        break;
    case BLOB_DENIED:
        http_error(res, 502, "store_denied", NULL, "%s: the blob store %s refused the server (%s)", what,
                   store_name(srv), answer);
        break;
    case BLOB_FULL:
        http_error(res, 507, "storage_full", NULL, "%s: the blob store %s is full (%s)", what, store_name(srv), answer);
        break;
    case BLOB_NOT_FOUND:
        http_error(res, 410, "gone", NULL, "%s: the blob store %s does not have it (%s)", what, store_name(srv),
                   answer);
        break;
    default:
        http_error(res, 502, "store_error", NULL, "%s: the blob store %s answered %s", what, store_name(srv), answer);
        break;
    }
}

int api_blob_via_server(http_req *req, http_res *res) {
    const char *via = http_query(req, "via");
    if (!via) return 0;
    if (strcmp(via, "server") == 0) return 1;
    http_error(res, 422, "invalid_value", "via", "via is \"server\" (the bytes relayed by the server) or absent");
    return -1;
}

int api_ckpt_keep(const char *spec_text) {
    int keep = 3;
    if (!spec_text) return keep;
    jobspec *spec = xcalloc(1, sizeof *spec);
    spec_error se;
    if (jobspec_parse(spec_text, strlen(spec_text), spec, &se) == 0) {
        keep = spec->checkpoint.keep;
        jobspec_release(spec);
    }
    free(spec);
    return keep < 1 ? 1 : keep;
}

/* The bytes of key into a file of their own under DATA, opened and
 * unlinked: its fd, or -1 after answering. */
static int relay_fd(server *srv, http_res *res, const char *key, const char *what) {
    unsigned char rnd[8];
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
        http_error(res, 500, "internal", NULL, "no randomness for a temporary name");
        return -1;
    }
    char dir[PATH_MAX], path[PATH_MAX + 40];
    if (sfmt(dir, sizeof dir, "%s/relay", srv->opt.data_dir) < 0 || mkdir_p(dir, 0700) < 0 ||
        sfmt(path, sizeof path, "%s/%02x%02x%02x%02x%02x%02x%02x%02x", dir, rnd[0], rnd[1], rnd[2], rnd[3], rnd[4],
             rnd[5], rnd[6], rnd[7]) < 0) {
        http_error(res, 507, "storage_full", NULL, "cannot make a temporary file to relay %s: %s", what,
                   strerror(errno));
        return -1;
    }
    blob_err e;
    memset(&e, 0, sizeof e);
    int rc = blob_get_file(srv->blobs, key, path, &e);
    if (rc != BLOB_OK) {
        unlink(path);
        api_blob_error(srv, res, rc, &e, what);
        return -1;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    unlink(path); /* the open fd keeps the bytes until the answer is sent */
    if (fd < 0) http_error(res, 500, "internal", NULL, "cannot open the relayed %s: %s", what, strerror(errno));
    return fd;
}

void api_blob_send(server *srv, http_res *res, const char *key, const char *sha256, int64_t size,
                   const char *filename, const char *content_type, int relay) {
    int fd = -1;
    if (blob_store_is_s3(srv->blobs)) {
        if (!relay) {
            char url[2048];
            if (blob_presign(srv->blobs, "GET", key, NULL, 0, NULL, srv->opt.blob_url_ttl_s, filename, url,
                             sizeof url) != BLOB_OK) {
                http_error(res, 500, "internal", NULL, "cannot sign a URL for %s", key);
                return;
            }
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "url", url);
            cJSON_AddStringToObject(o, "sha256", sha256);
            cJSON_AddNumberToObject(o, "size", (double)size);
            http_json(res, 307, o);
            snprintf(res->location, sizeof res->location, "%s", url);
            snprintf(res->etag, sizeof res->etag, "%s", sha256);
            snprintf(res->xhdr_name, sizeof res->xhdr_name, "ETag");
            snprintf(res->xhdr_value, sizeof res->xhdr_value, "\"%s\"", sha256);
            return;
        }
        fd = relay_fd(srv, res, key, key);
        if (fd < 0) return;
    } else {
        char path[PATH_MAX + 300];
        const char *root = blob_store_root(srv->blobs);
        if (!root || sfmt(path, sizeof path, "%s/%s", root, key) < 0 ||
            (fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
            http_error(res, 410, "gone", NULL, "%s is missing from the blob store %s", key, store_name(srv));
            return;
        }
    }
    struct stat sb;
    if (fstat(fd, &sb) < 0) {
        close(fd);
        http_error(res, 410, "gone", NULL, "%s is missing from the blob store %s", key, store_name(srv));
        return;
    }
    res->status = 200;
    res->fd = fd;
    res->fd_size = (uint64_t)sb.st_size;
    res->content_type = content_type;
    snprintf(res->etag, sizeof res->etag, "%s", sha256);
    if (filename) snprintf(res->disposition, sizeof res->disposition, "attachment; filename=\"%s\"", filename);
}

/* 1 when s is 64 hex digits (lowered into out), else 0. */
static int sha256_arg(const char *s, char out[65]) {
    if (!s || strlen(s) != 64) return 0;
    for (int i = 0; i < 64; i++) {
        if (!isxdigit((unsigned char)s[i])) return 0;
        out[i] = (char)tolower((unsigned char)s[i]);
    }
    out[64] = '\0';
    return 1;
}

/* 1 when s is the base64 of 16 bytes (24 characters, "==" at the end),
 * the bytes into md5; else 0. */
static int md5_arg(const char *s, unsigned char md5[16]) {
    if (!s || strlen(s) != 24 || s[22] != '=' || s[23] != '=') return 0;
    unsigned char out[20];
    if (EVP_DecodeBlock(out, (const unsigned char *)s, 24) != 18) return 0;
    memcpy(md5, out, 16);
    /* canonical: encoding the bytes gives the same text */
    char back[32];
    if (base64_encode(md5, 16, back, sizeof back) < 0 || strcmp(back, s) != 0) return 0;
    return 1;
}

static void hex16(const unsigned char md5[16], char out[33]) {
    static const char hx[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++) {
        out[2 * i] = hx[md5[i] >> 4];
        out[2 * i + 1] = hx[md5[i] & 15];
    }
    out[32] = '\0';
}

/* The upload's recorded MD5s (u->parts of them) into md5 (heap): 0 or -1. */
static int upload_md5s(const blob_upload *u, unsigned char (**md5)[16]) {
    *md5 = NULL;
    cJSON *a = cJSON_Parse(u->md5s ? u->md5s : "");
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != u->parts) {
        cJSON_Delete(a);
        return -1;
    }
    unsigned char (*m)[16] = xcalloc((size_t)u->parts, sizeof *m);
    int i = 0;
    cJSON *it;
    cJSON_ArrayForEach(it, a) {
        if (!cJSON_IsString(it) || !md5_arg(it->valuestring, m[i])) {
            free(m);
            cJSON_Delete(a);
            return -1;
        }
        i++;
    }
    cJSON_Delete(a);
    *md5 = m;
    return 0;
}

/* The ETag S3 gives the completed object: hex(md5) for one part,
 * hex(md5(md5_1 .. md5_N))-N for N. */
static void expected_etag(const blob_upload *u, const unsigned char (*md5)[16], char out[48]) {
    char hex[33];
    if (u->parts == 1 && !u->remote_id[0]) {
        hex16(md5[0], hex);
        snprintf(out, 48, "%s", hex);
        return;
    }
    unsigned char all[16];
    md5_raw(md5, (size_t)u->parts * 16, all);
    hex16(all, hex);
    snprintf(out, 48, "%s-%d", hex, u->parts);
}

/* One part's presigned PUT as the routes answer it. */
static int part_json(server *srv, const blob_upload *u, int n, const unsigned char md5[16], cJSON *arr) {
    char b64[32], url[2048];
    if (base64_encode(md5, 16, b64, sizeof b64) < 0) return -1;
    int rc = u->remote_id[0]
                 ? blob_presign(srv->blobs, "PUT", u->key, u->remote_id, n, b64, srv->opt.blob_url_ttl_s, NULL, url,
                                sizeof url)
                 : blob_presign(srv->blobs, "PUT", u->key, NULL, 0, b64, srv->opt.blob_url_ttl_s, NULL, url,
                                sizeof url);
    if (rc != BLOB_OK) return -1;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "n", n);
    cJSON_AddStringToObject(o, "url", url);
    cJSON *h = cJSON_AddObjectToObject(o, "headers");
    cJSON_AddStringToObject(h, "Content-MD5", b64);
    cJSON_AddItemToArray(arr, o);
    return 0;
}

static void answer_checkpoint(http_res *res, const blob_upload *u) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", (double)u->checkpoint_id);
    cJSON_AddStringToObject(o, "sha256", u->sha256);
    cJSON_AddNumberToObject(o, "size", (double)u->size);
    cJSON_AddNumberToObject(o, "step", (double)u->step);
    cJSON_AddNumberToObject(o, "epoch", (double)u->epoch);
    cJSON_AddNumberToObject(o, "attempt", u->attempt);
    snprintf(res->location, sizeof res->location, "/api/v1/jobs/%lld/checkpoints/%lld", (long long)u->job_id,
             (long long)u->checkpoint_id);
    http_json(res, 201, o);
}

/* Removes what an upload put in the store: its multipart upload, or its
 * one object. BLOB_OK when nothing is left. */
static int upload_discard(server *srv, const blob_upload *u, blob_err *e) {
    int rc = BLOB_OK, n = 0;
    if (u->remote_id[0]) rc = blob_mpu_abort(srv->blobs, u->key, u->remote_id, e);
    else if (u->parts > 1) rc = blob_mpu_abort_key(srv->blobs, u->key, &n, e); /* its UploadId never recorded */
    if (rc == BLOB_OK || rc == BLOB_NOT_FOUND) rc = blob_delete(srv->blobs, u->key, e);
    return rc == BLOB_NOT_FOUND ? BLOB_OK : rc;
}

/* Aborts an open upload: the row claimed aborted first (so a complete
 * racing this one cannot publish what is about to go, and one that won the
 * race keeps its object), then its parts or object removed; when the store
 * fails the row is open again for the tick. STORE_OK; STORE_CONFLICT when
 * it was not open any more (nothing removed); STORE_ERROR with *brc set
 * when the store failed (or the database). */
static int upload_abort_claimed(server *srv, const blob_upload *u, int *brc, blob_err *e) {
    *brc = BLOB_OK;
    int rc = blob_upload_mark(srv->db, u->id, "aborted");
    if (rc != STORE_OK) return rc;
    if (strcmp(u->store, blob_store_url(srv->blobs)) != 0) return STORE_OK; /* another store's: nothing to reach */
    *brc = upload_discard(srv, u, e);
    if (*brc == BLOB_OK) return STORE_OK;
    blob_upload_reopen(srv->db, u->id);
    return STORE_ERROR;
}

/* The {u} of the route (path parameter 1) of the job: 0 with *u loaded
 * (release it), or -1 after answering. */
static int upload_param(server *srv, http_req *req, http_res *res, int64_t job_id, blob_upload *u) {
    const char *tok = req->nparams > 1 ? req->params[1] : "";
    size_t n = strlen(tok);
    int ok = n == 32;
    for (size_t i = 0; ok && i < n; i++) ok = (tok[i] >= '0' && tok[i] <= '9') || (tok[i] >= 'a' && tok[i] <= 'f');
    int rc = ok ? blob_upload_get(srv->db, tok, job_id, u) : STORE_NOT_FOUND;
    if (rc == STORE_NOT_FOUND && !blob_store_is_s3(srv->blobs)) {
        http_error(res, 409, "upload_via_server", NULL,
                   "the server keeps checkpoints in %s and takes no uploads to the store: upload with PUT "
                   "/api/v1/jobs/%lld/checkpoints",
                   store_name(srv), (long long)job_id);
        return -1;
    }
    if (rc == STORE_NOT_FOUND) {
        http_error(res, 404, "not_found", NULL, "job %lld has no upload %.64s", (long long)job_id, tok);
        return -1;
    }
    if (rc != STORE_OK) {
        http_db_unavailable(res);
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- begin */

static int body_int64(cJSON *body, http_res *res, const char *key, int64_t lo, int64_t hi, int64_t *out) {
    cJSON *v = cJSON_GetObjectItemCaseSensitive(body, key);
    if (!v) {
        http_error(res, 422, "missing_field", key, "%s is required", key);
        return -1;
    }
    double d = cJSON_IsNumber(v) ? v->valuedouble : -1;
    if (!cJSON_IsNumber(v) || d != (double)(int64_t)d || (int64_t)d < lo || (int64_t)d > hi) {
        http_error(res, 422, "invalid_value", key, "%s is a whole number of %lld to %lld", key, (long long)lo,
                   (long long)hi);
        return -1;
    }
    *out = (int64_t)d;
    return 0;
}

int api_blob_quota_admit(server *srv, int64_t team_id, int64_t len, http_res *res) {
    int64_t open = 0, quota = 0;
    if (blob_upload_open_bytes(srv->db, team_id, &open) != STORE_OK) open = 0;
    quota_use use;
    unsigned ep;
    if (quota_check(srv->db, team_id, len + open, &quota, &use, &ep) != 1) return 0;
    char b1[32], b2[32], b3[32];
    quota_fmt_bytes(quota, b1, sizeof b1);
    quota_fmt_bytes(quota_use_total(&use), b2, sizeof b2);
    quota_fmt_bytes(open, b3, sizeof b3);
    http_error(res, 507, "storage_quota", NULL,
               "the team's storage quota is %s (%lld bytes), %s used and %s in open uploads: this checkpoint "
               "(%lld bytes) would pass it; nothing was stored",
               b1, (long long)quota, b2, b3, (long long)len);
    return -1;
}

/* POST /api/v1/jobs/{id}/checkpoints/uploads, on the offload thread (the
 * store's CreateMultipartUpload is a round trip). */
static void upload_begin(server *srv, http_req *req, http_res *res) {
    exec_job j;
    if (api_job_param(srv, req, res, 0, &j) < 0) return;
    cJSON *body = NULL;
    unsigned char (*md5)[16] = NULL;
    blob_upload u;
    memset(&u, 0, sizeof u);
    if (!blob_store_is_s3(srv->blobs)) {
        http_error(res, 409, "upload_via_server", NULL,
                   "the server keeps checkpoints in %s: upload with PUT /api/v1/jobs/%lld/checkpoints",
                   store_name(srv), (long long)j.id);
        goto out;
    }
    body = http_body_json(req, res);
    if (!body) goto out;
    int64_t step, epoch, size, part_bytes;
    if (body_int64(body, res, "step", 0, INT64_MAX / 2, &step) < 0 ||
        body_int64(body, res, "epoch", 0, INT64_MAX / 2, &epoch) < 0 ||
        body_int64(body, res, "size", 1, SIZE_MAX_S3, &size) < 0 ||
        body_int64(body, res, "part_bytes", 1, PART_MAX, &part_bytes) < 0)
        goto out;
    cJSON *sha = cJSON_GetObjectItemCaseSensitive(body, "sha256");
    if (!cJSON_IsString(sha) || !sha256_arg(sha->valuestring, u.sha256)) {
        http_error(res, 422, sha ? "invalid_value" : "missing_field", "sha256",
                   "sha256 is the hex sha256 of the checkpoint's bytes (64 hex digits)");
        goto out;
    }
    int64_t parts = (size + part_bytes - 1) / part_bytes;
    if (parts > 1 && part_bytes < PART_MIN) {
        http_error(res, 422, "invalid_value", "part_bytes",
                   "part_bytes is %lld to %lld (5 MiB to 5 GiB) when there is more than one part",
                   (long long)PART_MIN, (long long)PART_MAX);
        goto out;
    }
    if (parts > BLOB_UPLOAD_MAX_PARTS) {
        http_error(res, 422, "invalid_value", "part_bytes",
                   "%lld parts of %lld bytes: at most %d parts; larger parts are needed", (long long)parts,
                   (long long)part_bytes, BLOB_UPLOAD_MAX_PARTS);
        goto out;
    }
    cJSON *arr = cJSON_GetObjectItemCaseSensitive(body, "md5");
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) != (int)parts) {
        http_error(res, 422, arr ? "invalid_value" : "missing_field", "md5",
                   "md5 is an array of the base64 MD5 of each part: %lld of them", (long long)parts);
        goto out;
    }
    md5 = xcalloc((size_t)parts, sizeof *md5);
    cJSON *md5s = cJSON_CreateArray();
    int i = 0;
    cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        if (!cJSON_IsString(it) || !md5_arg(it->valuestring, md5[i])) {
            cJSON_Delete(md5s);
            http_error(res, 422, "invalid_value", "md5", "md5[%d] is not the base64 of 16 bytes (24 characters)", i);
            goto out;
        }
        cJSON_AddItemToArray(md5s, cJSON_CreateString(it->valuestring));
        i++;
    }
    u.md5s = cJSON_PrintUnformatted(md5s);
    cJSON_Delete(md5s);
    if (!u.md5s) {
        http_error(res, 500, "internal", NULL, "out of memory");
        goto out;
    }
    if (api_blob_quota_admit(srv, j.team_id, size, res) < 0) goto out;

    unsigned char rnd[16];
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
        http_error(res, 500, "internal", NULL, "no randomness for an upload's name");
        goto out;
    }
    hex16(rnd, u.token);
    u.job_id = j.id;
    u.attempt = j.attempt;
    u.step = step;
    u.epoch = epoch;
    snprintf(u.store, sizeof u.store, "%s", blob_store_url(srv->blobs));
    snprintf(u.key, sizeof u.key, "checkpoints/%lld/%d-%s.safetensors", (long long)j.id, j.attempt, u.token);
    u.size = size;
    u.part_bytes = part_bytes;
    u.parts = (int)parts;
    u.expires_at = now_ms() + (int64_t)srv->opt.blob_upload_max_age_s * 1000;
    /* the row first: whatever the store makes after it, the tick finds */
    int rc = blob_upload_insert(srv->db, &u);
    if (rc != STORE_OK) {
        http_db_unavailable(res);
        goto out;
    }
    if (parts > 1) {
        blob_err e;
        memset(&e, 0, sizeof e);
        char id[256];
        int brc = blob_mpu_create(srv->blobs, u.key, id, &e);
        if (brc != BLOB_OK) {
            blob_upload_mark(srv->db, u.id, "aborted");
            api_blob_error(srv, res, brc, &e, "checkpoint upload");
            goto out;
        }
        snprintf(u.remote_id, sizeof u.remote_id, "%s", id);
        if (blob_upload_set_remote(srv->db, u.id, u.remote_id) != STORE_OK) {
            blob_mpu_abort(srv->blobs, u.key, u.remote_id, &e);
            blob_upload_mark(srv->db, u.id, "aborted");
            http_db_unavailable(res);
            goto out;
        }
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "upload", u.token);
    cJSON *pa = cJSON_AddArrayToObject(o, "parts");
    for (int n = 1; n <= u.parts; n++)
        if (part_json(srv, &u, n, md5[n - 1], pa) < 0) {
            cJSON_Delete(o);
            http_error(res, 500, "internal", NULL, "cannot sign the URL of part %d", n);
            goto out;
        }
    char when[25];
    store_time_text(when, now_ms() + (int64_t)srv->opt.blob_url_ttl_s * 1000);
    cJSON_AddStringToObject(o, "expires_at", when);
    snprintf(res->location, sizeof res->location, "/api/v1/jobs/%lld/checkpoints/uploads/%s", (long long)j.id,
             u.token);
    http_json(res, 201, o);
out:
    free(md5);
    free(u.md5s);
    cJSON_Delete(body);
    exec_store_job_release(&j);
}

static void upload_begin_offloaded(server *srv, http_req *req, http_res *res) {
    (void)srv;
    http_offload(req, res, upload_begin);
}

/* ---------------------------------------------------------------- parts */

/* POST /api/v1/jobs/{id}/checkpoints/uploads/{u}/parts {"parts":[1,3]}:
 * the URLs of those parts signed again (signing is local: no store call). */
static void upload_parts(server *srv, http_req *req, http_res *res) {
    exec_job j;
    if (api_job_param(srv, req, res, 0, &j) < 0) return;
    blob_upload u;
    memset(&u, 0, sizeof u);
    unsigned char (*md5)[16] = NULL;
    cJSON *body = NULL;
    if (upload_param(srv, req, res, j.id, &u) < 0) goto out;
    if (strcmp(u.state, "open") != 0) {
        http_error(res, 409, "upload_closed", NULL, "upload %s is %s", u.token, u.state);
        goto out;
    }
    if (strcmp(u.store, blob_store_url(srv->blobs)) != 0 || !blob_store_is_s3(srv->blobs)) {
        http_error(res, 410, "gone", NULL, "upload %s goes to the blob store %s, which this server does not use",
                   u.token, u.store);
        goto out;
    }
    body = http_body_json(req, res);
    if (!body) goto out;
    cJSON *arr = cJSON_GetObjectItemCaseSensitive(body, "parts");
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) < 1 || cJSON_GetArraySize(arr) > u.parts) {
        http_error(res, 422, arr ? "invalid_value" : "missing_field", "parts",
                   "parts is an array of 1 to %d part numbers", u.parts);
        goto out;
    }
    if (upload_md5s(&u, &md5) < 0) {
        http_error(res, 500, "internal", NULL, "upload %s has no readable MD5s", u.token);
        goto out;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON *pa = cJSON_AddArrayToObject(o, "parts");
    cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        long n;
        if (api_json_int(it, 1, u.parts, &n) < 0) {
            cJSON_Delete(o);
            http_error(res, 422, "invalid_value", "parts", "a part number is 1 to %d", u.parts);
            goto out;
        }
        if (part_json(srv, &u, (int)n, md5[n - 1], pa) < 0) {
            cJSON_Delete(o);
            http_error(res, 500, "internal", NULL, "cannot sign the URL of part %ld", n);
            goto out;
        }
    }
    char when[25];
    store_time_text(when, now_ms() + (int64_t)srv->opt.blob_url_ttl_s * 1000);
    cJSON_AddStringToObject(o, "expires_at", when);
    http_json(res, 200, o);
out:
    free(md5);
    cJSON_Delete(body);
    blob_upload_release(&u);
    exec_store_job_release(&j);
}

/* ---------------------------------------------------------------- complete */

/* Strips the quotes of an ETag and lowers it. */
static void etag_plain(const char *in, char *out, size_t cap) {
    size_t k = 0;
    for (const char *p = in; *p && k + 1 < cap; p++)
        if (*p != '"') out[k++] = (char)tolower((unsigned char)*p);
    out[k] = '\0';
}

/* POST /api/v1/jobs/{id}/checkpoints/uploads/{u}/complete, on the offload
 * thread. */
static void upload_complete(server *srv, http_req *req, http_res *res) {
    exec_job j;
    if (api_job_param(srv, req, res, 1, &j) < 0) return;
    blob_upload u;
    memset(&u, 0, sizeof u);
    unsigned char (*md5)[16] = NULL;
    ckpt_ref *pruned = NULL;
    if (upload_param(srv, req, res, j.id, &u) < 0) goto out;
    if (strcmp(u.state, "done") == 0) { /* a retry after a lost answer */
        answer_checkpoint(res, &u);
        goto out;
    }
    if (strcmp(u.state, "open") != 0) {
        http_error(res, 409, "upload_closed", NULL, "upload %s was aborted; begin another", u.token);
        goto out;
    }
    if (strcmp(u.store, blob_store_url(srv->blobs)) != 0 || !blob_store_is_s3(srv->blobs)) {
        http_error(res, 410, "gone", NULL, "upload %s goes to the blob store %s, which this server does not use",
                   u.token, u.store);
        goto out;
    }
    if (upload_md5s(&u, &md5) < 0) {
        http_error(res, 500, "internal", NULL, "upload %s has no readable MD5s", u.token);
        goto out;
    }
    blob_err e;
    memset(&e, 0, sizeof e);
    int rc = BLOB_OK;
    if (u.remote_id[0]) {
        rc = blob_mpu_complete(srv->blobs, u.key, u.remote_id, u.parts, (const unsigned char (*)[16])md5, &e);
        if (rc == BLOB_BAD && (strcmp(e.code, "InvalidPart") == 0 || strcmp(e.code, "InvalidPartOrder") == 0 ||
                               strcmp(e.code, "EntityTooSmall") == 0)) {
            http_error(res, 409, "upload_incomplete", NULL,
                       "upload %s: the store does not have every part with the MD5 signed for it (%s: %s); PUT the "
                       "missing parts, then complete again",
                       u.token, e.code, e.msg);
            goto out;
        }
        if (rc == BLOB_NOT_FOUND) rc = BLOB_OK; /* completed by an earlier try: the HEAD below says */
        if (rc != BLOB_OK) {
            api_blob_error(srv, res, rc, &e, "checkpoint upload");
            goto out;
        }
    }
    int64_t size = -1;
    char etag[80] = "", got[80], want[48];
    rc = blob_head(srv->blobs, u.key, &size, etag, &e);
    if (rc == BLOB_NOT_FOUND) {
        http_error(res, 409, "upload_incomplete", NULL, "upload %s: the store has no object yet; PUT %s, then complete again",
                   u.token, u.remote_id[0] ? "the parts" : "part 1");
        goto out;
    }
    if (rc != BLOB_OK) {
        api_blob_error(srv, res, rc, &e, "checkpoint upload");
        goto out;
    }
    etag_plain(etag, got, sizeof got);
    expected_etag(&u, (const unsigned char (*)[16])md5, want);
    if (size != u.size || strcmp(got, want) != 0) {
        blob_err e2;
        int brc2;
        upload_abort_claimed(srv, &u, &brc2, &e2);
        http_error(res, 422, "verification_failed", NULL,
                   "upload %s: the store holds %lld bytes with ETag %s; %lld bytes with ETag %s were signed; the "
                   "object was removed and the upload aborted",
                   u.token, (long long)size, got, (long long)u.size, want);
        goto out;
    }
    int keep = api_ckpt_keep(j.spec);
    pruned = xcalloc(PRUNE_MAX, sizeof *pruned);
    int n = 0;
    int64_t cid = 0;
    rc = blob_upload_publish(srv->db, &u, keep, &cid, pruned, PRUNE_MAX, &n);
    if (rc == STORE_CONFLICT) { /* another complete won the race: its answer */
        blob_upload again;
        if (blob_upload_get(srv->db, u.token, j.id, &again) == STORE_OK) {
            if (strcmp(again.state, "done") == 0) answer_checkpoint(res, &again);
            else http_error(res, 409, "upload_closed", NULL, "upload %s was aborted; begin another", u.token);
            blob_upload_release(&again);
        } else {
            http_db_unavailable(res);
        }
        goto out;
    }
    if (rc != STORE_OK) {
        http_db_unavailable(res);
        goto out;
    }
    quota_add(srv->db, j.team_id, QUOTA_CHECKPOINTS, u.size);
    if (n) quota_forget(srv->db, j.team_id);
    for (int i = 0; i < n; i++) api_ckpt_remove(srv, &pruned[i]);
    u.checkpoint_id = cid;
    answer_checkpoint(res, &u);
out:
    free(pruned);
    free(md5);
    blob_upload_release(&u);
    exec_store_job_release(&j);
}

static void upload_complete_offloaded(server *srv, http_req *req, http_res *res) {
    (void)srv;
    http_offload(req, res, upload_complete);
}

/* ---------------------------------------------------------------- abort */

/* DELETE /api/v1/jobs/{id}/checkpoints/uploads/{u}, on the offload thread. */
static void upload_abort(server *srv, http_req *req, http_res *res) {
    exec_job j;
    if (api_job_param(srv, req, res, 0, &j) < 0) return;
    blob_upload u;
    memset(&u, 0, sizeof u);
    if (upload_param(srv, req, res, j.id, &u) < 0) goto out;
    if (strcmp(u.state, "done") == 0) {
        http_error(res, 409, "upload_closed", NULL, "upload %s is checkpoint %lld already", u.token,
                   (long long)u.checkpoint_id);
        goto out;
    }
    if (strcmp(u.state, "open") == 0) {
        blob_err e;
        memset(&e, 0, sizeof e);
        int brc = BLOB_OK;
        int rc = upload_abort_claimed(srv, &u, &brc, &e);
        if (rc == STORE_ERROR && brc != BLOB_OK) { /* open again: the tick aborts it at its expiry */
            api_blob_error(srv, res, brc, &e, "checkpoint upload abort");
            goto out;
        }
        if (rc == STORE_ERROR) {
            http_db_unavailable(res);
            goto out;
        }
        if (rc == STORE_CONFLICT) { /* completed meanwhile */
            http_error(res, 409, "upload_closed", NULL, "upload %s was completed meanwhile", u.token);
            goto out;
        }
    }
    res->status = 204;
out:
    blob_upload_release(&u);
    exec_store_job_release(&j);
}

static void upload_abort_offloaded(server *srv, http_req *req, http_res *res) {
    (void)srv;
    http_offload(req, res, upload_abort);
}

/* ---------------------------------------------------------------- the store */

/* GET /api/v1/blob-store (admin) */
static void store_get(server *srv, http_req *req, http_res *res) {
    (void)req;
    int64_t open = 0;
    if (blob_uploads_open_count(srv->db, &open) != STORE_OK) {
        http_db_unavailable(res);
        return;
    }
    const char *url = blob_store_url(srv->blobs);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "kind", blob_store_is_s3(srv->blobs) ? "s3" : url[0] ? "file" : "data");
    cJSON_AddStringToObject(o, "url", url[0] ? url : "DATA");
    cJSON_AddNumberToObject(o, "uploads_open", (double)open);
    cJSON_AddNumberToObject(o, "url_ttl_s", srv->opt.blob_url_ttl_s);
    cJSON_AddNumberToObject(o, "upload_max_age_s", srv->opt.blob_upload_max_age_s);
    http_json(res, 200, o);
}

/* ---------------------------------------------------------------- housekeeping */

#define FORGET_AFTER_MS (24LL * 3600 * 1000) /* a finished upload's row is kept this long */

void api_blobs_tick(server *srv) {
    static int64_t last;
    static int failing;
    int64_t now = now_ms();
    if (now - last < 1000) return;
    last = now;
    static int64_t forget_next;
    if (now >= forget_next) { /* finished rows a day old: a bounded delete a minute */
        int gone = 0;
        if (blob_uploads_forget(srv->db, now - FORGET_AFTER_MS, 1000, &gone) != STORE_OK) gone = 0;
        forget_next = now + (gone >= 1000 ? 1000 : 60000);
    }
    blob_upload rows[TICK_BATCH];
    int n = 0;
    if (blob_uploads_expired(srv->db, now, rows, TICK_BATCH, &n) != STORE_OK) return;
    for (int i = 0; i < n; i++) {
        blob_upload *u = &rows[i];
        blob_err e;
        memset(&e, 0, sizeof e);
        int brc = BLOB_OK;
        int rc = upload_abort_claimed(srv, u, &brc, &e);
        if (rc == STORE_ERROR && brc != BLOB_OK) {
            if (!failing)
                log_warn("blob store %s: cannot abort the expired upload %s of job %lld (%s %s: %s); retried "
                         "each second",
                         store_name(srv), u->token, (long long)u->job_id, blob_strerror(brc), e.code, e.msg);
            failing = 1;
        }
        if (rc == STORE_OK) {
            failing = 0;
            pthread_mutex_lock(&g_err_mu);
            g_tick_aborted++;
            pthread_mutex_unlock(&g_err_mu);
            log_info("job %lld: checkpoint upload %s (step %lld, %lld bytes) not completed within %d s: aborted",
                     (long long)u->job_id, u->token, (long long)u->step, (long long)u->size,
                     srv->opt.blob_upload_max_age_s);
        }
        blob_upload_release(u);
    }
}

typedef struct list_ctx {
    char (*keys)[256];
    int64_t *sizes;
    int n, max;
} list_ctx;

static int list_cb(void *c, const char *key, int64_t size) {
    list_ctx *l = c;
    if (l->n >= l->max) return 1;
    snprintf(l->keys[l->n], 256, "%s", key);
    l->sizes[l->n] = size;
    l->n++;
    return 0;
}

void api_blob_job_deleted(server *srv, int64_t job_id, int64_t *freed) {
    if (!srv->blobs) return;
    blob_upload *rows = xcalloc(JOB_UPLOADS_MAX, sizeof *rows);
    int n = 0;
    const char *url = blob_store_url(srv->blobs);
    if (blob_uploads_of_job(srv->db, job_id, rows, JOB_UPLOADS_MAX, &n) == STORE_OK) {
        for (int i = 0; i < n; i++) {
            blob_err e;
            int brc;
            upload_abort_claimed(srv, &rows[i], &brc, &e); /* one the store kept stays open for the tick */
            blob_upload_release(&rows[i]);
        }
    }
    free(rows);
    if (!url[0]) return; /* the data directory's files: api_retention_delete_files */
    char prefix[64];
    snprintf(prefix, sizeof prefix, "checkpoints/%lld/", (long long)job_id);
    list_ctx l = {xcalloc(256, 256), xcalloc(256, sizeof(int64_t)), 0, 256};
    blob_err e;
    memset(&e, 0, sizeof e);
    for (int round = 0; round < 64; round++) { /* 256 a round: a job keeps few */
        l.n = 0;
        int rc = blob_list(srv->blobs, prefix, list_cb, &l, &e);
        if (rc != BLOB_OK) {
            log_warn("job %lld deleted: cannot list its objects in %s (%s %s: %s); the sweeps remove them later",
                     (long long)job_id, url, blob_strerror(rc), e.code, e.msg);
            break;
        }
        int removed = 0;
        for (int i = 0; i < l.n; i++)
            if (blob_delete(srv->blobs, l.keys[i], &e) == BLOB_OK) {
                *freed += l.sizes[i];
                removed++;
            }
        if (l.n < l.max || removed == 0) break;
    }
    free(l.keys);
    free(l.sizes);
}

/* ---------------------------------------------------------------- relays */

#define RELAY_MAX 8 /* ?via=server fetches at once; past it 503 */

static pthread_mutex_t g_relay_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_relays;

typedef struct relay_job {
    server *srv;
    http_req *req;
    http_handler fn;
} relay_job;

static void relay_done(void) {
    pthread_mutex_lock(&g_relay_mu);
    g_relays--;
    pthread_mutex_unlock(&g_relay_mu);
}

static void *relay_main(void *arg) {
    relay_job *j = arg;
    http_res *a = http_res_new();
    j->fn(j->srv, j->req, a);
    http_resume(j->req, a);
    free(j);
    relay_done();
    return NULL;
}

void api_blob_relay(server *srv, http_req *req, http_res *res, http_handler fn) {
    pthread_mutex_lock(&g_relay_mu);
    int ok = g_relays < RELAY_MAX;
    if (ok) g_relays++;
    pthread_mutex_unlock(&g_relay_mu);
    if (!ok) {
        http_error(res, 503, "relay_busy", NULL,
                   "the server is relaying %d downloads from the blob store already; retry, or download from "
                   "the store itself (without ?via=server)",
                   RELAY_MAX);
        snprintf(res->xhdr_name, sizeof res->xhdr_name, "Retry-After");
        snprintf(res->xhdr_value, sizeof res->xhdr_value, "5");
        return;
    }
    if (http_defer(req, res) < 0) {
        relay_done();
        http_error(res, 503, "unavailable", NULL, "the server is stopping; retry");
        return;
    }
    relay_job *j = xcalloc(1, sizeof *j);
    j->srv = srv;
    j->req = req;
    j->fn = fn;
    pthread_attr_t at;
    pthread_t th;
    int rc = pthread_attr_init(&at);
    if (rc == 0) {
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        rc = pthread_create(&th, &at, relay_main, j);
        pthread_attr_destroy(&at);
    }
    if (rc != 0) {
        free(j);
        relay_done();
        http_res *a = http_res_new();
        http_error(a, 503, "unavailable", NULL, "cannot start the relay's thread; retry");
        http_resume(req, a);
    }
}

/* ---------------------------------------------------------------- routes */

const route api_blobs_routes[] = {
    {"POST", "/api/v1/jobs/{id}/checkpoints/uploads", upload_begin_offloaded, ALLOW_TASK, 4u << 20, ROLE_NONE},
    {"POST", "/api/v1/jobs/{id}/checkpoints/uploads/{u}/parts", upload_parts, ALLOW_TASK, 1u << 20, ROLE_NONE},
    {"POST", "/api/v1/jobs/{id}/checkpoints/uploads/{u}/complete", upload_complete_offloaded, ALLOW_TASK, 0,
     ROLE_NONE},
    {"DELETE", "/api/v1/jobs/{id}/checkpoints/uploads/{u}", upload_abort_offloaded, ALLOW_TASK, 0, ROLE_NONE},
    {"GET", "/api/v1/blob-store", store_get, ALLOW_ADMIN, 0, ROLE_NONE},
    {NULL, NULL, NULL, 0, 0, ROLE_NONE},
};
