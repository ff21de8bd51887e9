/* context_store.c - the contexts table (migration 11). See context_store.h
 * for the contract. */
#include "context_store.h"
#include "../common/util.h"

#include <stdio.h>
#include <string.h>

/* The states in which a job still needs its context. */
#define ACTIVE_STATES "('queued','starting','running')"

static void row_read(db_stmt *st, ctx_row *r) {
    memset(r, 0, sizeof *r);
    r->team_id = db_col_int64(st, 0);
    const char *dg = db_col_text(st, 1);
    snprintf(r->digest, sizeof r->digest, "%s", dg ? dg : "");
    r->bytes = db_col_int64(st, 2);
    r->files = db_col_int64(st, 3);
    r->unpacked = db_col_int64(st, 4);
    r->created_at = db_col_int64(st, 5);
    r->used_at = db_col_int64(st, 6);
}

static const char SQL_CTX_INSERT[] =
    "INSERT INTO contexts(team_id, digest, bytes, files, unpacked, created_at, used_at, store)"
    " VALUES(?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(team_id, digest) DO NOTHING";

int ctx_store_insert(db *d, const ctx_row *r) {
    db_stmt *st = db_prepare(d, SQL_CTX_INSERT);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, r->team_id);
    db_bind_text(st, 2, r->digest, -1);
    db_bind_int64(st, 3, r->bytes);
    db_bind_int64(st, 4, r->files);
    db_bind_int64(st, 5, r->unpacked);
    db_bind_int64(st, 6, r->created_at);
    db_bind_int64(st, 7, r->created_at);
    db_bind_text(st, 8, r->store, -1);
    if (store_step_done(st) != STORE_OK) return STORE_ERROR;
    return db_changes(d) > 0 ? STORE_OK : STORE_CONFLICT;
}

static const char SQL_CTX_TOUCH[] =
    "UPDATE contexts SET used_at = CASE WHEN used_at > ?1 THEN used_at ELSE ?1 END WHERE team_id = ?2 AND digest = ?3";

int ctx_store_touch(db *d, int64_t team_id, const char *digest, int64_t now) {
    db_stmt *st = db_prepare(d, SQL_CTX_TOUCH);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, now);
    db_bind_int64(st, 2, team_id);
    db_bind_text(st, 3, digest, -1);
    if (store_step_done(st) != STORE_OK) return STORE_ERROR;
    return db_changes(d) > 0 ? STORE_OK : STORE_NOT_FOUND;
}

static const char SQL_CTX_GET[] =
    "SELECT team_id, digest, bytes, files, unpacked, created_at, used_at FROM contexts"
    " WHERE team_id = ? AND digest = ?";

int ctx_store_get(db *d, int64_t team_id, const char *digest, ctx_row *out) {
    db_stmt *st = db_prepare(d, SQL_CTX_GET);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, team_id);
    db_bind_text(st, 2, digest, -1);
    int rc = db_step(st);
    if (rc == DB_ROW) row_read(st, out);
    db_done(st);
    return rc == DB_ROW ? STORE_OK : rc == DB_DONE ? STORE_NOT_FOUND : STORE_ERROR;
}

static const char SQL_CTX_LIST[] =
    "SELECT c.team_id, c.digest, c.bytes, c.files, c.unpacked, c.created_at, c.used_at,"
    " (SELECT COUNT(*) FROM jobs j WHERE j.context = c.digest AND j.team_id = c.team_id"
    "  AND j.state IN " ACTIVE_STATES ")"
    " FROM contexts c WHERE c.team_id = ? ORDER BY c.created_at DESC, c.digest";

int ctx_store_list(db *d, int64_t team_id, cJSON **out) {
    db_stmt *st = db_prepare(d, SQL_CTX_LIST);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, team_id);
    cJSON *arr = cJSON_CreateArray();
    int rc;
    while ((rc = db_step(st)) == DB_ROW) {
        ctx_row r;
        row_read(st, &r);
        char id[80];
        snprintf(id, sizeof id, "sha256:%s", r.digest);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "id", id);
        cJSON_AddNumberToObject(o, "bytes", (double)r.bytes);
        cJSON_AddNumberToObject(o, "files", (double)r.files);
        cJSON_AddNumberToObject(o, "unpacked_bytes", (double)r.unpacked);
        store_json_time_ms(o, "created_at", r.created_at);
        store_json_time_ms(o, "used_at", r.used_at);
        cJSON_AddNumberToObject(o, "jobs", (double)db_col_int64(st, 7));
        cJSON_AddItemToArray(arr, o);
    }
    db_done(st);
    if (rc != DB_DONE) {
        cJSON_Delete(arr);
        return STORE_ERROR;
    }
    *out = arr;
    return STORE_OK;
}

static const char SQL_CTX_USAGE[] = "SELECT COALESCE(SUM(bytes), 0) FROM contexts WHERE team_id = ?";

int ctx_store_usage(db *d, int64_t team_id, int64_t *bytes) {
    db_stmt *st = db_prepare(d, SQL_CTX_USAGE);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, team_id);
    int rc = db_step(st);
    if (rc == DB_ROW) *bytes = db_col_int64(st, 0);
    db_done(st);
    return rc == DB_ROW ? STORE_OK : STORE_ERROR;
}

static const char SQL_CTX_DELETE[] =
    "DELETE FROM contexts WHERE team_id = ?1 AND digest = ?2 AND NOT EXISTS("
    " SELECT 1 FROM jobs j WHERE j.context = ?2 AND j.team_id = ?1 AND j.state IN " ACTIVE_STATES ")";
static const char SQL_CTX_ACTIVE_JOBS[] =
    "SELECT COUNT(*) FROM jobs WHERE context = ? AND team_id = ? AND state IN " ACTIVE_STATES;

int ctx_store_delete(db *d, int64_t team_id, const char *digest, int *jobs) {
    *jobs = 0;
    db_stmt *st = db_prepare(d, SQL_CTX_DELETE);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, team_id);
    db_bind_text(st, 2, digest, -1);
    if (store_step_done(st) != STORE_OK) return STORE_ERROR;
    if (db_changes(d) > 0) return STORE_OK;
    /* kept: not there, or in use (the count is what the answer says) */
    ctx_row r;
    int rc = ctx_store_get(d, team_id, digest, &r);
    if (rc != STORE_OK) return rc;
    st = db_prepare(d, SQL_CTX_ACTIVE_JOBS);
    if (!st) return STORE_ERROR;
    db_bind_text(st, 1, digest, -1);
    db_bind_int64(st, 2, team_id);
    rc = db_step(st);
    if (rc == DB_ROW) *jobs = db_col_int(st, 0);
    db_done(st);
    return rc == DB_ROW ? STORE_CONFLICT : STORE_ERROR;
}

static const char SQL_CTX_HELD[] = "SELECT 1 FROM contexts WHERE digest = ? LIMIT 1";

int ctx_store_digest_held(db *d, const char *digest) {
    db_stmt *st = db_prepare(d, SQL_CTX_HELD);
    if (!st) return -1;
    db_bind_text(st, 1, digest, -1);
    int rc = db_step(st);
    db_done(st);
    return rc == DB_ROW ? 1 : rc == DB_DONE ? 0 : -1;
}

/* A row past its grace: unused since before ?1, no job of its team that
 * names it still to run, none that finished at or after ?1. */
#define GC_WHERE                                                                                                \
    " c.used_at < ?1 AND NOT EXISTS(SELECT 1 FROM jobs j WHERE j.context = c.digest AND j.team_id = c.team_id" \
    " AND (j.state IN " ACTIVE_STATES " OR COALESCE(j.finished_at, j.updated_at) >= ?1))"

static const char SQL_CTX_GC[] =
    "SELECT c.team_id, c.digest, c.bytes, c.files, c.unpacked, c.created_at, c.used_at FROM contexts c WHERE" GC_WHERE
    " ORDER BY c.used_at LIMIT ?2";

int ctx_store_gc_candidates(db *d, int64_t before, ctx_row *out, int max, int *n) {
    *n = 0;
    db_stmt *st = db_prepare(d, SQL_CTX_GC);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, before);
    db_bind_int(st, 2, max);
    int rc;
    while ((rc = db_step(st)) == DB_ROW && *n < max) row_read(st, &out[(*n)++]);
    db_done(st);
    return rc == DB_ROW || rc == DB_DONE ? STORE_OK : STORE_ERROR;
}

static const char SQL_CTX_GC_DROP[] =
    "DELETE FROM contexts AS c WHERE c.team_id = ?2 AND c.digest = ?3 AND" GC_WHERE;

int ctx_store_gc_drop(db *d, int64_t team_id, const char *digest, int64_t before) {
    db_stmt *st = db_prepare(d, SQL_CTX_GC_DROP);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, before);
    db_bind_int64(st, 2, team_id);
    db_bind_text(st, 3, digest, -1);
    if (store_step_done(st) != STORE_OK) return STORE_ERROR;
    return db_changes(d) > 0 ? STORE_OK : STORE_NOT_FOUND;
}

static const char SQL_CTX_JOB[] = "SELECT 1 FROM jobs WHERE id = ? AND context = ?";

int ctx_store_job_names(db *d, int64_t job_id, const char *digest) {
    db_stmt *st = db_prepare(d, SQL_CTX_JOB);
    if (!st) return -1;
    db_bind_int64(st, 1, job_id);
    db_bind_text(st, 2, digest, -1);
    int rc = db_step(st);
    db_done(st);
    return rc == DB_ROW ? 1 : rc == DB_DONE ? 0 : -1;
}

static const char SQL_CTX_NODE[] =
    "SELECT 1 FROM jobs j JOIN tasks t ON t.job_id = j.id"
    " WHERE j.context = ? AND t.node_id = ? AND t.state != 'exited' LIMIT 1";

int ctx_store_node_needs(db *d, int64_t node_id, const char *digest) {
    db_stmt *st = db_prepare(d, SQL_CTX_NODE);
    if (!st) return -1;
    db_bind_text(st, 1, digest, -1);
    db_bind_int64(st, 2, node_id);
    int rc = db_step(st);
    db_done(st);
    return rc == DB_ROW ? 1 : rc == DB_DONE ? 0 : -1;
}

static const char SQL_CTX_STORE[] =
    "SELECT store, bytes FROM contexts WHERE digest = ?1 ORDER BY store = ?2 DESC LIMIT 1";

int ctx_store_digest_store(db *d, const char *digest, const char *prefer, char *out, size_t cap, int64_t *bytes) {
    if (cap) out[0] = '\0';
    *bytes = 0;
    db_stmt *st = db_prepare(d, SQL_CTX_STORE);
    if (!st) return STORE_ERROR;
    db_bind_text(st, 1, digest, -1);
    db_bind_text(st, 2, prefer ? prefer : "", -1);
    int rc = db_step(st);
    if (rc == DB_ROW) {
        const char *v = db_col_text(st, 0);
        snprintf(out, cap, "%s", v ? v : "");
        *bytes = db_col_int64(st, 1);
    }
    db_done(st);
    return rc == DB_ROW ? STORE_OK : rc == DB_DONE ? STORE_NOT_FOUND : STORE_ERROR;
}
