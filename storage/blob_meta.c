/* blob_meta.c - the rows of checkpoint uploads to a blob store
 * (blob_meta.h): inserted before the store's upload exists, published in
 * one transaction with the checkpoint row and the pruning, aborted when
 * they expire. */
#include "blob_meta.h"
#include "../common/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define UPLOAD_COLS                                                                                                \
    "id, token, job_id, attempt, step, epoch, store, key, remote_id, size, part_bytes, parts, sha256, md5s, state," \
    " coalesce(checkpoint_id, 0), created_at, expires_at"

static void col_copy(db_stmt *st, int col, char *dst, size_t cap) {
    const char *s = db_col_text(st, col);
    snprintf(dst, cap, "%s", s ? s : "");
}

static void upload_row(db_stmt *st, blob_upload *u) {
    memset(u, 0, sizeof *u);
    u->id = db_col_int64(st, 0);
    col_copy(st, 1, u->token, sizeof u->token);
    u->job_id = db_col_int64(st, 2);
    u->attempt = db_col_int(st, 3);
    u->step = db_col_int64(st, 4);
    u->epoch = db_col_int64(st, 5);
    col_copy(st, 6, u->store, sizeof u->store);
    col_copy(st, 7, u->key, sizeof u->key);
    col_copy(st, 8, u->remote_id, sizeof u->remote_id);
    u->size = db_col_int64(st, 9);
    u->part_bytes = db_col_int64(st, 10);
    u->parts = db_col_int(st, 11);
    col_copy(st, 12, u->sha256, sizeof u->sha256);
    const char *m = db_col_text(st, 13);
    u->md5s = xstrdup(m ? m : "[]");
    col_copy(st, 14, u->state, sizeof u->state);
    u->checkpoint_id = db_col_int64(st, 15);
    u->created_at = db_col_int64(st, 16);
    u->expires_at = db_col_int64(st, 17);
}

void blob_upload_release(blob_upload *u) {
    if (!u) return;
    free(u->md5s);
    u->md5s = NULL;
}

static const char SQL_INSERT[] =
    "INSERT INTO blob_uploads(token, job_id, attempt, step, epoch, store, key, remote_id, size, part_bytes, parts,"
    " sha256, md5s, state, created_at, expires_at)"
    " VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, 'open', ?14, ?15)"
    " ON CONFLICT DO NOTHING RETURNING id";

int blob_upload_insert(db *d, blob_upload *u) {
    db_stmt *st = db_prepare(d, SQL_INSERT);
    if (!st) return STORE_ERROR;
    if (!u->created_at) u->created_at = now_ms();
    db_bind_text(st, 1, u->token, -1);
    db_bind_int64(st, 2, u->job_id);
    db_bind_int(st, 3, u->attempt);
    db_bind_int64(st, 4, u->step);
    db_bind_int64(st, 5, u->epoch);
    db_bind_text(st, 6, u->store, -1);
    db_bind_text(st, 7, u->key, -1);
    db_bind_text(st, 8, u->remote_id, -1);
    db_bind_int64(st, 9, u->size);
    db_bind_int64(st, 10, u->part_bytes);
    db_bind_int(st, 11, u->parts);
    db_bind_text(st, 12, u->sha256, -1);
    db_bind_text(st, 13, u->md5s ? u->md5s : "[]", -1);
    db_bind_int64(st, 14, u->created_at);
    db_bind_int64(st, 15, u->expires_at);
    int rc = store_step_id(st, &u->id);
    if (rc != STORE_OK) return rc;
    snprintf(u->state, sizeof u->state, "open");
    return STORE_OK;
}

static const char SQL_GET[] =
    "SELECT " UPLOAD_COLS " FROM blob_uploads WHERE token = ?1 AND (?2 = 0 OR job_id = ?2)";

int blob_upload_get(db *d, const char *token, int64_t job_id, blob_upload *out) {
    db_stmt *st = db_prepare(d, SQL_GET);
    if (!st) return STORE_ERROR;
    db_bind_text(st, 1, token, -1);
    db_bind_int64(st, 2, job_id);
    int rc = db_step(st);
    if (rc == DB_ROW) upload_row(st, out);
    db_done(st);
    return rc == DB_ROW ? STORE_OK : rc == DB_DONE ? STORE_NOT_FOUND : STORE_ERROR;
}

static const char SQL_SET_REMOTE[] = "UPDATE blob_uploads SET remote_id = ?2 WHERE id = ?1 AND state = 'open'";

int blob_upload_set_remote(db *d, int64_t id, const char *remote_id) {
    db_stmt *st = db_prepare(d, SQL_SET_REMOTE);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, id);
    db_bind_text(st, 2, remote_id, -1);
    return store_step_one(d, st);
}

static const char SQL_MARK[] = "UPDATE blob_uploads SET state = ?2 WHERE id = ?1 AND state = 'open'";

int blob_upload_mark(db *d, int64_t id, const char *state) {
    if (strcmp(state, "aborted") != 0 && strcmp(state, "done") != 0) return STORE_ERROR;
    db_stmt *st = db_prepare(d, SQL_MARK);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, id);
    db_bind_text(st, 2, state, -1);
    return store_step_one(d, st);
}

int blob_upload_reopen(db *d, int64_t id) {
    db_stmt *st = db_prepare(d, "UPDATE blob_uploads SET state = 'open' WHERE id = ?1 AND state = 'aborted'");
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, id);
    return store_step_one(d, st);
}

static const char SQL_CKPT_INSERT[] =
    "INSERT INTO checkpoints(job_id, attempt, step, epoch, size, sha256, path, store, created_at)"
    " VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) RETURNING id";
static const char SQL_DONE[] =
    "UPDATE blob_uploads SET state = 'done', checkpoint_id = ?2 WHERE id = ?1 AND state = 'open'";

int blob_upload_publish(db *d, const blob_upload *u, int keep, int64_t *cid, ckpt_ref *pruned, int max, int *n) {
    *n = 0;
    *cid = 0;
    const char *path = strncmp(u->key, "checkpoints/", 12) == 0 ? u->key + 12 : u->key;
    if (db_begin(d) < 0) return STORE_ERROR;
    int64_t now = now_ms();
    int rc = STORE_ERROR;
    db_stmt *st = db_prepare(d, SQL_DONE);
    if (st) { /* claimed first: a second complete racing this one finds it done */
        db_bind_int64(st, 1, u->id);
        db_bind_null(st, 2);
        rc = store_step_one(d, st);
    }
    if (rc == STORE_OK) {
        rc = STORE_ERROR;
        st = db_prepare(d, SQL_CKPT_INSERT);
        if (st) {
            db_bind_int64(st, 1, u->job_id);
            db_bind_int(st, 2, u->attempt);
            db_bind_int64(st, 3, u->step);
            db_bind_int64(st, 4, u->epoch);
            db_bind_int64(st, 5, u->size);
            db_bind_text(st, 6, u->sha256, -1);
            db_bind_text(st, 7, path, -1);
            db_bind_text(st, 8, u->store, -1);
            db_bind_int64(st, 9, now);
            if (store_step_id(st, cid) == STORE_OK) rc = STORE_OK;
        }
    }
    if (rc == STORE_OK) {
        st = db_prepare(d, "UPDATE blob_uploads SET checkpoint_id = ?2 WHERE id = ?1");
        rc = STORE_ERROR;
        if (st) {
            db_bind_int64(st, 1, u->id);
            db_bind_int64(st, 2, *cid);
            rc = store_step_done(st);
        }
    }
    if (rc == STORE_OK) rc = exec_store_job_checkpointed(d, u->job_id, now);
    if (rc == STORE_OK) rc = exec_store_ckpt_prune(d, u->job_id, keep < 1 ? 1 : keep, pruned, max, n);
    if (rc != STORE_OK || db_commit(d) < 0) {
        db_rollback(d);
        *n = 0;
        *cid = 0;
        return rc == STORE_CONFLICT ? STORE_CONFLICT : STORE_ERROR;
    }
    return STORE_OK;
}

static int upload_rows(db *d, const char *sql, int64_t arg, blob_upload *out, int max, int *n) {
    *n = 0;
    db_stmt *st = db_prepare(d, sql);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, arg);
    db_bind_int(st, 2, max);
    int rc;
    while ((rc = db_step(st)) == DB_ROW && *n < max) upload_row(st, &out[(*n)++]);
    db_done(st);
    if (rc != DB_DONE && rc != DB_ROW) {
        for (int i = 0; i < *n; i++) blob_upload_release(&out[i]);
        *n = 0;
        return STORE_ERROR;
    }
    return STORE_OK;
}

static const char SQL_EXPIRED[] =
    "SELECT " UPLOAD_COLS " FROM blob_uploads WHERE state = 'open' AND expires_at <= ?1"
    " ORDER BY expires_at, id LIMIT ?2";

int blob_uploads_expired(db *d, int64_t now, blob_upload *out, int max, int *n) {
    return upload_rows(d, SQL_EXPIRED, now, out, max, n);
}

static const char SQL_OF_JOB[] =
    "SELECT " UPLOAD_COLS " FROM blob_uploads WHERE job_id = ?1 AND state = 'open' ORDER BY id LIMIT ?2";

int blob_uploads_of_job(db *d, int64_t job_id, blob_upload *out, int max, int *n) {
    return upload_rows(d, SQL_OF_JOB, job_id, out, max, n);
}

static const char SQL_OPEN_BYTES[] =
    "SELECT coalesce(sum(u.size), 0) FROM blob_uploads u JOIN jobs j ON j.id = u.job_id"
    " WHERE u.state = 'open' AND j.team_id = ?1";

int blob_upload_open_bytes(db *d, int64_t team_id, int64_t *bytes) {
    *bytes = 0;
    db_stmt *st = db_prepare(d, SQL_OPEN_BYTES);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, team_id);
    int rc = db_step(st);
    if (rc == DB_ROW) *bytes = db_col_int64(st, 0);
    db_done(st);
    return rc == DB_ROW ? STORE_OK : STORE_ERROR;
}

int blob_uploads_open_count(db *d, int64_t *n) {
    *n = 0;
    db_stmt *st = db_prepare(d, "SELECT count(*) FROM blob_uploads WHERE state = 'open'");
    if (!st) return STORE_ERROR;
    int rc = db_step(st);
    if (rc == DB_ROW) *n = db_col_int64(st, 0);
    db_done(st);
    return rc == DB_ROW ? STORE_OK : STORE_ERROR;
}

int blob_uploads_forget(db *d, int64_t before, int max, int *n) {
    *n = 0;
    db_stmt *st = db_prepare(d, "DELETE FROM blob_uploads WHERE id IN (SELECT id FROM blob_uploads "
                                     "WHERE state != 'open' AND created_at < ?1 ORDER BY id LIMIT ?2)");
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, before);
    db_bind_int(st, 2, max);
    int rc = db_step(st);
    if (rc == DB_DONE) *n = (int)db_changes(d);
    db_done(st);
    return rc == DB_DONE ? STORE_OK : STORE_ERROR;
}
