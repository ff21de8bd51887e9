/* checkpoints_api.c - /jobs/{id}/checkpoints: a job's checkpoints, uploaded
 * by its tasks (checked against their sha256, within the disk reserve and
 * the team's quota, written durably, the oldest beyond checkpoint.keep
 * pruned) and downloaded by users and the next attempt. Rows are
 * storage/exec_store.c; the bytes are in the server's blob store (the
 * checkpoint directory by default; an s3 store answers downloads with a
 * 307 to a presigned GET, api/blobs_api.c, which also has the routes of
 * uploads straight to the store). */
#include "checkpoints_api.h"
#include "blobs_api.h"
#include "exec_common.h"
#include "retention_api.h"
#include "teams_api.h"
#include "../server/server.h"
#include "../storage/blob_meta.h"
#include "../storage/exec_store.h"
#include "../storage/quota.h"
#include "../storage/store.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#define CKPT_MAX_BODY (1ull << 30)
#define PRUNE_MAX 64

static int query_int64(http_req *req, http_res *res, const char *key, int64_t *out) {
    long v;
    if (http_query_long(req, res, key, 0, (long)INT64_MAX, 0, &v) < 0) return -1;
    *out = v;
    return 0;
}

/* PUT /api/v1/jobs/{id}/checkpoints?step=S&epoch=E (X-Checksum-Sha256: HEX) */
static void ckpt_put(server *srv, http_req *req, http_res *res) {
    exec_job j;
    if (api_job_param(srv, req, res, 1, &j) < 0) return;
    int64_t step, epoch;
    if (query_int64(req, res, "step", &step) < 0 || query_int64(req, res, "epoch", &epoch) < 0) goto out;
    const char *want = http_header(req, "X-Checksum-Sha256");
    if (!want) {
        http_error(res, 422, "missing_field", "X-Checksum-Sha256", "the header X-Checksum-Sha256 (hex sha256 of the body) is required");
        goto out;
    }
    if (req->body.len == 0) {
        http_error(res, 422, "invalid_value", "body", "the checkpoint is empty");
        goto out;
    }
    char got[65];
    sha256_hex(req->body.data, req->body.len, got);
    if (strlen(want) != 64 || strcasecmp(want, got) != 0) {
        http_error(res, 422, "checksum_mismatch", "X-Checksum-Sha256",
                   "the body's sha256 is %s, not %.64s; nothing was stored", got, want);
        goto out;
    }
    /* the disk reserve and the team's storage quota: refused whole rather
     * than written half */
    if (blob_store_url(srv->blobs)[0]) {
        /* the bytes go to another store: the quota (open uploads counted), not the disk reserve */
        if (api_blob_quota_admit(srv, j.team_id, (int64_t)req->body.len, res) < 0) goto out;
    } else {
        int64_t open_bytes = 0; /* uploads to a store reserved and not completed count too */
        if (blob_upload_open_bytes(srv->db, j.team_id, &open_bytes) != STORE_OK) open_bytes = 0;
        if (api_storage_admit(srv, j.team_id, (int64_t)req->body.len + open_bytes, "checkpoint", 507, res) < 0)
            goto out;
    }
    int64_t cid = 0;
    if (exec_store_ckpt_reserve(srv->db, j.id, j.attempt, step, epoch, (int64_t)req->body.len, got, &cid) != STORE_OK) {
        http_db_unavailable(res);
        goto out;
    }
    /* the data directory as before; another store through its interface */
    const char *store = blob_store_url(srv->blobs);
    char dir[PATH_MAX], rel[256], path[PATH_MAX + 300], key[300];
    if (sfmt(rel, sizeof rel, "%lld/%lld.safetensors", (long long)j.id, (long long)cid) < 0 ||
        sfmt(key, sizeof key, "checkpoints/%s", rel) < 0) {
        exec_store_ckpt_discard(srv->db, cid);
        http_error(res, 500, "internal", NULL, "a checkpoint's name is too long");
        goto out;
    }
    path[0] = '\0';
    if (!store[0]) {
        if (sfmt(dir, sizeof dir, "%s/%lld", srv->checkpoint_dir, (long long)j.id) < 0 ||
            sfmt(path, sizeof path, "%s/%s", srv->checkpoint_dir, rel) < 0 || mkdir_p(dir, 0700) < 0 ||
            file_write_atomic(path, req->body.data, req->body.len, 0600) < 0) {
            int e = errno;
            exec_store_ckpt_discard(srv->db, cid);
            http_error(res, 507, "storage_full", NULL, "cannot write the checkpoint: %s", strerror(e));
            goto out;
        }
    } else {
        blob_err be;
        memset(&be, 0, sizeof be);
        int brc = blob_put(srv->blobs, key, req->body.data, req->body.len, &be);
        if (brc != BLOB_OK) {
            exec_store_ckpt_discard(srv->db, cid);
            api_blob_error(srv, res, brc, &be, "checkpoint");
            goto out;
        }
    }
    /* Record it and prune in one transaction; the files go after the commit. */
    int keep = api_ckpt_keep(j.spec);
    ckpt_ref *old = xcalloc(PRUNE_MAX, sizeof *old);
    int nold = 0;
    int rc = db_begin(srv->db) < 0 ? STORE_ERROR : STORE_OK;
    if (rc == STORE_OK) rc = exec_store_ckpt_publish(srv->db, cid, store, rel);
    if (rc == STORE_OK) rc = exec_store_job_checkpointed(srv->db, j.id, now_ms());
    if (rc == STORE_OK) rc = exec_store_ckpt_prune(srv->db, j.id, keep, old, PRUNE_MAX, &nold);
    if (rc != STORE_OK || db_commit(srv->db) < 0) {
        db_rollback(srv->db);
        free(old);
        if (path[0]) unlink(path);
        else blob_delete(srv->blobs, key, NULL);
        exec_store_ckpt_discard(srv->db, cid);
        http_db_unavailable(res);
        goto out;
    }
    quota_add(srv->db, j.team_id, QUOTA_CHECKPOINTS, (int64_t)req->body.len);
    if (nold) quota_forget(srv->db, j.team_id); /* the pruned ones no longer count */
    for (int i = 0; i < nold; i++) api_ckpt_remove(srv, &old[i]);
    free(old);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", (double)cid);
    cJSON_AddStringToObject(o, "sha256", got);
    cJSON_AddNumberToObject(o, "size", (double)req->body.len);
    cJSON_AddNumberToObject(o, "step", (double)step);
    cJSON_AddNumberToObject(o, "epoch", (double)epoch);
    cJSON_AddNumberToObject(o, "attempt", j.attempt);
    snprintf(res->location, sizeof res->location, "/api/v1/jobs/%lld/checkpoints/%lld", (long long)j.id,
             (long long)cid);
    http_json(res, 201, o);
out:
    exec_store_job_release(&j);
}

/* The upload's work (a sha256 of up to CKPT_MAX_BODY, the file written and
 * fsynced, its directory fsynced, two transactions) takes milliseconds of
 * disk waits: it runs on the offload thread, so the pool thread's other
 * connections are not held behind it (server/http.h http_offload). */
static void ckpt_put_offloaded(server *srv, http_req *req, http_res *res) {
    (void)srv;
    http_offload(req, res, ckpt_put);
}

/* GET /api/v1/jobs/{id}/checkpoints */
static void ckpt_list(server *srv, http_req *req, http_res *res) {
    exec_job j;
    if (api_job_param(srv, req, res, 1, &j) < 0) return;
    cJSON *arr = NULL;
    if (exec_store_ckpt_list(srv->db, j.id, &arr) != STORE_OK) {
        exec_store_job_release(&j);
        http_db_unavailable(res);
        return;
    }
    api_ckpt_mark_best(srv, j.id, j.spec, arr); /* checkpoint.best: the one kept beside the newest */
    exec_store_job_release(&j);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "job", (double)j.id);
    cJSON_AddItemToObject(o, "checkpoints", arr);
    http_json(res, 200, o);
}

static void ckpt_send(server *srv, http_res *res, int64_t job, int64_t cid, int relay) {
    exec_ckpt c;
    int rc = exec_store_ckpt_get(srv->db, job, cid, &c);
    if (rc == STORE_NOT_FOUND) {
        if (cid) http_error(res, 404, "not_found", NULL, "job %lld has no checkpoint %lld", (long long)job, (long long)cid);
        else http_error(res, 404, "not_found", NULL, "job %lld has no checkpoint yet", (long long)job);
        return;
    }
    if (rc != STORE_OK) {
        http_db_unavailable(res);
        return;
    }
    char name[96];
    snprintf(name, sizeof name, "job-%lld-checkpoint-%lld.safetensors", (long long)job, (long long)c.id);
    if (c.store[0]) {
        if (strcmp(c.store, blob_store_url(srv->blobs)) != 0) {
            http_error(res, 410, "gone", NULL,
                       "checkpoint %lld is in the blob store %s, which this server does not use", (long long)c.id,
                       c.store);
            return;
        }
        char key[300];
        snprintf(key, sizeof key, "checkpoints/%s", c.path);
        api_blob_send(srv, res, key, c.sha256, c.size, name, "application/octet-stream", relay);
        if (res->status == 200)
            snprintf(res->location, sizeof res->location, "/api/v1/jobs/%lld/checkpoints/%lld", (long long)job,
                     (long long)c.id);
        return;
    }
    char path[PATH_MAX + 300];
    int fd = sfmt(path, sizeof path, "%s/%s", srv->checkpoint_dir, c.path) == 0 ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) < 0) {
        if (fd >= 0) close(fd);
        http_error(res, 410, "gone", NULL, "the file of checkpoint %lld is missing", (long long)c.id);
        return;
    }
    res->status = 200;
    res->fd = fd;
    res->fd_size = (uint64_t)sb.st_size;
    res->content_type = "application/octet-stream";
    snprintf(res->etag, sizeof res->etag, "%s", c.sha256);
    snprintf(res->disposition, sizeof res->disposition, "attachment; filename=\"%s\"", name);
    snprintf(res->location, sizeof res->location, "/api/v1/jobs/%lld/checkpoints/%lld", (long long)job,
             (long long)c.id);
}

/* GET /api/v1/jobs/{id}/checkpoints/latest and /{cid}; relay: ?via=server
 * (on the offload thread: the bytes are fetched from the store first). */
static void ckpt_get_as(server *srv, http_req *req, http_res *res, int latest, int relay) {
    exec_job j;
    if (api_job_param(srv, req, res, 0, &j) < 0) return;
    int64_t cid = 0;
    if (!latest) {
        cid = http_param_id(req, res, 1, "checkpoint");
        if (cid < 0) return;
    }
    ckpt_send(srv, res, j.id, cid, relay);
}

static void ckpt_latest_relayed(server *srv, http_req *req, http_res *res) { ckpt_get_as(srv, req, res, 1, 1); }
static void ckpt_get_relayed(server *srv, http_req *req, http_res *res) { ckpt_get_as(srv, req, res, 0, 1); }

static void ckpt_latest(server *srv, http_req *req, http_res *res) {
    int via = api_blob_via_server(req, res);
    if (via < 0) return;
    if (via && blob_store_is_s3(srv->blobs)) api_blob_relay(srv, req, res, ckpt_latest_relayed);
    else ckpt_get_as(srv, req, res, 1, 0);
}

static void ckpt_get(server *srv, http_req *req, http_res *res) {
    int via = api_blob_via_server(req, res);
    if (via < 0) return;
    if (via && blob_store_is_s3(srv->blobs)) api_blob_relay(srv, req, res, ckpt_get_relayed);
    else ckpt_get_as(srv, req, res, 0, 0);
}

const route api_checkpoints_routes[] = {
    {"PUT", "/api/v1/jobs/{id}/checkpoints", ckpt_put_offloaded, ALLOW_TASK, CKPT_MAX_BODY, ROLE_NONE},
    {"GET", "/api/v1/jobs/{id}/checkpoints", ckpt_list, ALLOW_USER | ALLOW_TASK, 0, ROLE_NONE},
    {"GET", "/api/v1/jobs/{id}/checkpoints/latest", ckpt_latest, ALLOW_USER | ALLOW_TASK, 0, ROLE_NONE},
    {"GET", "/api/v1/jobs/{id}/checkpoints/{cid}", ckpt_get, ALLOW_USER | ALLOW_TASK, 0, ROLE_NONE},
    {NULL, NULL, NULL, 0, 0, ROLE_NONE},
};
