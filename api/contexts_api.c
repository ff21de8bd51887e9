/* contexts_api.c - POST/GET/DELETE /api/v1/contexts: a team's code folder
 * as a gzip'd tar, checked (common/ctxtar.h ctx_check) before it is kept,
 * kept once per digest under DATA/contexts/<hex> (or contexts/<hex> in the
 * server's blob store: downloads from an s3 store are a 307 to a presigned
 * GET) and once per team as a row (storage/context_store.c), and dropped
 * by the periodic pass once nothing needs it (docs/command-jobs.md,
 * "Contexts").
 *
 * Scope: a team token sees its own contexts only (another team's id is the
 * same 404 as an unknown one, so ids do not leak); a task token may fetch
 * the context of its own job; a node token the context of a job with a
 * task on its node that has not exited. */
#include "contexts_api.h"
#include "blobs_api.h"
#include "../common/ctxtar.h"
#include "../server/server.h"
#include "teams_api.h"
#include "../storage/context_store.h"
#include "../storage/quota.h"
#include "../storage/store.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define GC_BATCH 64                   /* rows one pass looks at */

/* A digest's file is written when its first row goes in and removed when
 * its last row goes: both under this lock, so an upload of the same bytes
 * by another team never finds the file about to go (or gone after it
 * counted on it). Taken on the offload thread and the housekeeping thread
 * only, never on an HTTP pool thread. */
static pthread_mutex_t g_files = PTHREAD_MUTEX_INITIALIZER;

/* 1 when s is "sha256:" and 64 lowercase hex digits; hex then points at them. */
static int parse_id(const char *s, const char **hex) {
    if (strncmp(s, "sha256:", 7) != 0) return 0;
    const char *h = s + 7;
    size_t n = 0;
    for (; h[n]; n++)
        if (!((h[n] >= '0' && h[n] <= '9') || (h[n] >= 'a' && h[n] <= 'f'))) return 0;
    if (n != 64) return 0;
    *hex = h;
    return 1;
}

/* The {id} of the path as a digest: the hex, or NULL after answering 422. */
static const char *id_param(http_req *req, http_res *res) {
    const char *hex = NULL;
    if (req->nparams < 1 || !parse_id(req->params[0], &hex)) {
        http_error(res, 422, "invalid_value", "id",
                   "a context id is \"sha256:\" and 64 lowercase hex digits, as POST /api/v1/contexts answers it");
        return NULL;
    }
    return hex;
}

static int file_path(const server *srv, const char *digest, char *out, size_t cap) {
    return sfmt(out, cap, "%s/%s", srv->context_dir, digest);
}

/* Removes the digest's file when no row holds it any more; call with
 * g_files held. */
static void file_drop_unheld(server *srv, const char *digest) {
    int held = ctx_store_digest_held(srv->db, digest);
    if (held != 0) return; /* held, or unknown (kept: a file too many costs less than one missing) */
    char path[PATH_MAX + 80];
    if (file_path(srv, digest, path, sizeof path) == 0 && unlink(path) < 0 && errno != ENOENT)
        log_warn("cannot remove the context file %s: %s", path, strerror(errno));
    if (blob_store_url(srv->blobs)[0]) { /* and its object in the blob store */
        char key[80];
        blob_err e;
        memset(&e, 0, sizeof e);
        snprintf(key, sizeof key, "contexts/%s", digest);
        int rc = blob_delete(srv->blobs, key, &e);
        if (rc != BLOB_OK)
            log_warn("cannot remove %s from the blob store %s (%s %s: %s)", key, blob_store_url(srv->blobs),
                     blob_strerror(rc), e.code, e.msg);
    }
}

static cJSON *row_json(const ctx_row *r) {
    char id[80];
    snprintf(id, sizeof id, "sha256:%s", r->digest);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddNumberToObject(o, "bytes", (double)r->bytes);
    cJSON_AddNumberToObject(o, "files", (double)r->files);
    cJSON_AddNumberToObject(o, "unpacked_bytes", (double)r->unpacked);
    store_json_time_ms(o, "created_at", r->created_at);
    store_json_time_ms(o, "used_at", r->used_at);
    return o;
}

/* ---------------------------------------------------------------- upload */

/* Keeps the checked tar: its file (unless the same bytes are there
 * already) and the team's row, under g_files. */
static void upload_keep(server *srv, http_req *req, http_res *res, const char *digest, const ctx_info *info) {
    int64_t team = req->who.team_id;
    int64_t quota = (int64_t)srv->opt.context_quota_mb << 20, used = 0;
    if (ctx_store_usage(srv->db, team, &used) != STORE_OK) {
        http_db_unavailable(res);
        return;
    }
    if (used + (int64_t)req->body.len > quota) {
        http_error_limit(res, 413, "quota_exceeded", "body", quota,
                         "the team's contexts hold %lld bytes; this one (%zu bytes) would pass the quota of %ld MiB "
                         "(%lld bytes): delete contexts it no longer needs (DELETE /api/v1/contexts/{id})",
                         (long long)used, req->body.len, srv->opt.context_quota_mb, (long long)quota);
        return;
    }
    /* the disk reserve, and the team's storage quota (its logs and
     * checkpoints count too) */
    if (api_storage_admit(srv, team, (int64_t)req->body.len, "context", 413, res) < 0) return;
    char path[PATH_MAX + 80];
    if (file_path(srv, digest, path, sizeof path) < 0) {
        http_error(res, 500, "internal", NULL, "the data directory's path is too long");
        return;
    }
    /* the same digest is the same bytes: another team's upload serves */
    const char *store = blob_store_url(srv->blobs);
    int wrote = 0;
    if (!store[0]) {
        struct stat sb;
        if (stat(path, &sb) < 0 || (size_t)sb.st_size != req->body.len) {
            if (file_write_atomic(path, req->body.data, req->body.len, 0600) < 0) {
                http_error(res, 507, "storage_full", NULL, "cannot write the context: %s", strerror(errno));
                return;
            }
            wrote = 1;
        }
    } else {
        char key[80];
        blob_err e;
        memset(&e, 0, sizeof e);
        snprintf(key, sizeof key, "contexts/%s", digest);
        int64_t have = -1;
        int rc = blob_head(srv->blobs, key, &have, NULL, &e);
        if (rc != BLOB_OK || have != (int64_t)req->body.len) {
            rc = blob_put(srv->blobs, key, req->body.data, req->body.len, &e);
            if (rc != BLOB_OK) {
                api_blob_error(srv, res, rc, &e, "context");
                return;
            }
            wrote = 1;
        }
    }
    ctx_row r = {.team_id = team, .bytes = (int64_t)req->body.len, .files = info->files,
                 .unpacked = info->unpacked, .created_at = now_ms()};
    snprintf(r.digest, sizeof r.digest, "%s", digest);
    snprintf(r.store, sizeof r.store, "%s", store);
    int rc = ctx_store_insert(srv->db, &r);
    if (rc == STORE_CONFLICT) { /* only a row added beside this lock could do it: as held */
        if (ctx_store_get(srv->db, team, digest, &r) == STORE_OK) {
            http_json(res, 200, row_json(&r));
            return;
        }
        rc = STORE_ERROR;
    }
    if (rc != STORE_OK) {
        if (wrote) file_drop_unheld(srv, digest);
        http_db_unavailable(res);
        return;
    }
    r.used_at = r.created_at;
    quota_add(srv->db, team, QUOTA_CONTEXTS, r.bytes);
    snprintf(res->location, sizeof res->location, "/api/v1/contexts/sha256:%s", digest);
    http_json(res, 201, row_json(&r));
}

/* POST /api/v1/contexts (body: the gzip'd tar), on the offload thread:
 * the checks read the whole archive and the write waits for the disk. */
static void ctx_upload(server *srv, http_req *req, http_res *res) {
    if (req->body.len == 0) {
        http_error(res, 422, "invalid_context", "body",
                   "the body is empty; a gzip'd tar of the folder was expected (trainyard submit --context DIR)");
        return;
    }
    char digest[65];
    sha256_hex(req->body.data, req->body.len, digest);
    int64_t team = req->who.team_id;
    pthread_mutex_lock(&g_files);
    ctx_row r;
    int rc = ctx_store_get(srv->db, team, digest, &r);
    if (rc == STORE_OK) { /* held already: the same id, used now */
        int64_t now = now_ms();
        if (ctx_store_touch(srv->db, team, digest, now) != STORE_OK) {
            pthread_mutex_unlock(&g_files);
            http_db_unavailable(res);
            return;
        }
        if (now > r.used_at) r.used_at = now;
        pthread_mutex_unlock(&g_files);
        snprintf(res->location, sizeof res->location, "/api/v1/contexts/sha256:%s", digest);
        http_json(res, 200, row_json(&r));
        return;
    }
    if (rc != STORE_NOT_FOUND) {
        pthread_mutex_unlock(&g_files);
        http_db_unavailable(res);
        return;
    }
    ctx_limits lim;
    ctx_limits_default(&lim);
    lim.max_files = srv->opt.context_max_files;
    lim.max_unpacked = (int64_t)srv->opt.context_max_unpacked_mb << 20;
    ctx_info info;
    memset(&info, 0, sizeof info);
    char err[512] = "";
    if (ctx_check(req->body.data, req->body.len, &lim, &info, err, sizeof err) < 0) {
        pthread_mutex_unlock(&g_files);
        http_error(res, 422, "invalid_context", "body", "%s; nothing was stored",
                   err[0] ? err : "not a gzip'd tar");
        return;
    }
    upload_keep(srv, req, res, digest, &info);
    pthread_mutex_unlock(&g_files);
}

static void ctx_upload_offloaded(server *srv, http_req *req, http_res *res) {
    (void)srv;
    http_offload(req, res, ctx_upload);
}

/* ---------------------------------------------------------------- list, get */

/* GET /api/v1/contexts */
static void ctx_list(server *srv, http_req *req, http_res *res) {
    cJSON *arr = NULL;
    int64_t used = 0;
    if (ctx_store_list(srv->db, req->who.team_id, &arr) != STORE_OK) {
        http_db_unavailable(res);
        return;
    }
    if (ctx_store_usage(srv->db, req->who.team_id, &used) != STORE_OK) {
        cJSON_Delete(arr);
        http_db_unavailable(res);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "contexts", arr);
    cJSON_AddNumberToObject(o, "used_bytes", (double)used);
    cJSON_AddNumberToObject(o, "quota_bytes", (double)((int64_t)srv->opt.context_quota_mb << 20));
    http_json(res, 200, o);
}

/* GET /api/v1/contexts/{id}: the tar, sent from its file; from an s3 store
 * a 307 to a presigned GET, or with relay (?via=server, on the offload
 * thread) the bytes fetched by the server. */
static void ctx_get_as(server *srv, http_req *req, http_res *res, int relay) {
    const char *digest = id_param(req, res);
    if (!digest) return;
    int may = 0;
    if (req->who.kind == TOKEN_TEAM) {
        ctx_row r;
        int rc = ctx_store_get(srv->db, req->who.team_id, digest, &r);
        may = rc == STORE_OK ? 1 : rc == STORE_NOT_FOUND ? 0 : -1;
    } else if (req->who.kind == TOKEN_TASK) {
        may = ctx_store_job_names(srv->db, req->who.job_id, digest);
    } else if (req->who.kind == TOKEN_NODE) {
        may = ctx_store_node_needs(srv->db, req->who.node_id, digest);
    }
    if (may < 0) {
        http_db_unavailable(res);
        return;
    }
    if (!may) {
        http_error(res, 404, "not_found", NULL, "no context sha256:%s", digest);
        return;
    }
    char store[256];
    int64_t bytes = 0;
    int rc = ctx_store_digest_store(srv->db, digest, blob_store_url(srv->blobs), store, sizeof store, &bytes);
    if (rc == STORE_ERROR) {
        http_db_unavailable(res);
        return;
    }
    char name[64];
    snprintf(name, sizeof name, "context-%.12s.tar.gz", digest);
    if (rc == STORE_OK && store[0]) {
        if (strcmp(store, blob_store_url(srv->blobs)) != 0) {
            http_error(res, 410, "gone", NULL, "context sha256:%s is in the blob store %s, which this server does not use",
                       digest, store);
            return;
        }
        char key[80];
        snprintf(key, sizeof key, "contexts/%s", digest);
        api_blob_send(srv, res, key, digest, bytes, name, "application/gzip", relay);
        return;
    }
    char path[PATH_MAX + 80];
    int fd = file_path(srv, digest, path, sizeof path) == 0 ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) < 0) {
        if (fd >= 0) close(fd);
        http_error(res, 410, "gone", NULL, "the file of context sha256:%s is missing", digest);
        return;
    }
    res->status = 200;
    res->fd = fd;
    res->fd_size = (uint64_t)sb.st_size;
    res->content_type = "application/gzip";
    snprintf(res->etag, sizeof res->etag, "%s", digest);
    snprintf(res->disposition, sizeof res->disposition, "attachment; filename=\"context-%.12s.tar.gz\"", digest);
}

static void ctx_get_relayed(server *srv, http_req *req, http_res *res) { ctx_get_as(srv, req, res, 1); }

static void ctx_get(server *srv, http_req *req, http_res *res) {
    int via = api_blob_via_server(req, res);
    if (via < 0) return;
    if (via && blob_store_is_s3(srv->blobs)) api_blob_relay(srv, req, res, ctx_get_relayed);
    else ctx_get_as(srv, req, res, 0);
}

/* ---------------------------------------------------------------- delete */

/* DELETE /api/v1/contexts/{id}, on the offload thread (the file goes too). */
static void ctx_delete(server *srv, http_req *req, http_res *res) {
    const char *digest = id_param(req, res);
    if (!digest) return;
    int jobs = 0;
    pthread_mutex_lock(&g_files);
    int rc = ctx_store_delete(srv->db, req->who.team_id, digest, &jobs);
    if (rc == STORE_OK) file_drop_unheld(srv, digest);
    pthread_mutex_unlock(&g_files);
    if (rc == STORE_NOT_FOUND) {
        http_error(res, 404, "not_found", NULL, "no context sha256:%s", digest);
    } else if (rc == STORE_CONFLICT) {
        http_error(res, 409, "conflict", NULL,
                   "context sha256:%s is named by %d queued, starting or running job%s of the team; it can go once "
                   "they end (or are cancelled)",
                   digest, jobs, jobs == 1 ? "" : "s");
    } else if (rc != STORE_OK) {
        http_db_unavailable(res);
    } else {
        quota_forget(srv->db, req->who.team_id); /* its bytes no longer count */
        res->status = 204;
    }
}

static void ctx_delete_offloaded(server *srv, http_req *req, http_res *res) {
    (void)srv;
    http_offload(req, res, ctx_delete);
}

/* ---------------------------------------------------------------- submissions */

void api_context_not_held(http_res *res, const char *field, const char *id) {
    http_error(res, 422, "invalid_value", field,
               "the team has no context %s; upload it with POST /api/v1/contexts (trainyard submit --context DIR)",
               id);
}

int api_context_check_held(server *srv, int64_t team_id, const char *field, const char *id, http_res *res) {
    const char *digest = NULL;
    if (!parse_id(id, &digest)) { /* the spec's parser refused it already */
        api_context_not_held(res, field, id);
        return -1;
    }
    ctx_row r;
    int rc = ctx_store_get(srv->db, team_id, digest, &r);
    if (rc == STORE_OK) return 0;
    if (rc == STORE_NOT_FOUND) api_context_not_held(res, field, id);
    else http_db_unavailable(res);
    return -1;
}

/* ---------------------------------------------------------------- collection */

void api_contexts_tick(server *srv) {
    static int64_t last;
    int64_t now = now_ms(), grace_ms = (int64_t)srv->opt.context_grace_s * 1000;
    int64_t every = grace_ms / 4;
    if (every < 1000) every = 1000;
    if (every > 60000) every = 60000;
    if (now - last < every) return;
    last = now;
    int64_t before = now - grace_ms;
    ctx_row *rows = xcalloc(GC_BATCH, sizeof *rows);
    int n = 0;
    if (ctx_store_gc_candidates(srv->db, before, rows, GC_BATCH, &n) != STORE_OK) {
        log_warn("contexts: cannot look for unused contexts (the database is busy); next pass later");
        n = 0;
    }
    for (int i = 0; i < n; i++) {
        pthread_mutex_lock(&g_files);
        int rc = ctx_store_gc_drop(srv->db, rows[i].team_id, rows[i].digest, before);
        if (rc == STORE_OK) file_drop_unheld(srv, rows[i].digest);
        pthread_mutex_unlock(&g_files);
        if (rc == STORE_OK) quota_add(srv->db, rows[i].team_id, QUOTA_CONTEXTS, -rows[i].bytes);
        if (rc == STORE_OK)
            log_info("contexts: dropped sha256:%s of team %lld (%lld bytes): unused for %lld s", rows[i].digest,
                     (long long)rows[i].team_id, (long long)rows[i].bytes, (long long)((now - rows[i].used_at) / 1000));
        else if (rc == STORE_ERROR)
            log_warn("contexts: cannot drop sha256:%s of team %lld (the database is busy); next pass", rows[i].digest,
                     (long long)rows[i].team_id);
    }
    free(rows);
}

/* ---------------------------------------------------------------- routes */

const route api_contexts_routes[] = {
    {"POST", "/api/v1/contexts", ctx_upload_offloaded, ALLOW_TEAM, HTTP_BODY_CONTEXT, ROLE_NONE},
    {"GET", "/api/v1/contexts", ctx_list, ALLOW_TEAM, 0, ROLE_NONE},
    {"GET", "/api/v1/contexts/{id}", ctx_get, ALLOW_TEAM | ALLOW_TASK | ALLOW_NODE, 0, ROLE_NONE},
    {"DELETE", "/api/v1/contexts/{id}", ctx_delete_offloaded, ALLOW_TEAM, 0, ROLE_NONE},
    {NULL, NULL, NULL, 0, 0, ROLE_NONE},
};
