/* registry_store.c - a team's registry logins. See registry_store.h. */
#include "registry_store.h"
#include "store.h"

#include <stdio.h>
#include <string.h>

static const char SQL_PUT[] =
    "INSERT INTO registry_creds(team_id, host, username, sealed, created_at) VALUES(?1, ?2, ?3, ?4, ?5)"
    " ON CONFLICT(team_id, host) DO UPDATE SET username = excluded.username, sealed = excluded.sealed,"
    " created_at = excluded.created_at";
static const char SQL_HAS[] = "SELECT 1 FROM registry_creds WHERE team_id = ?1 AND host = ?2";
static const char SQL_GET[] =
    "SELECT host, username, sealed, created_at FROM registry_creds WHERE team_id = ?1 AND host = ?2";
static const char SQL_LIST[] =
    "SELECT host, username, created_at FROM registry_creds WHERE team_id = ?1 ORDER BY host";
static const char SQL_DELETE[] = "DELETE FROM registry_creds WHERE team_id = ?1 AND host = ?2";

int reg_cred_put(db *d, int64_t team_id, const char *host, const char *username, const void *sealed,
                 size_t sealed_len, int64_t now, int *created) {
    if (db_begin(d) < 0) return STORE_ERROR;
    db_stmt *st = db_prepare(d, SQL_HAS);
    if (!st) goto fail;
    db_bind_int64(st, 1, team_id);
    db_bind_text(st, 2, host, -1);
    int rc = db_step(st);
    db_done(st);
    if (rc != DB_ROW && rc != DB_DONE) goto fail;
    *created = rc == DB_DONE;
    if (!(st = db_prepare(d, SQL_PUT))) goto fail;
    db_bind_int64(st, 1, team_id);
    db_bind_text(st, 2, host, -1);
    db_bind_text(st, 3, username, -1);
    db_bind_blob(st, 4, sealed, (int)sealed_len);
    db_bind_int64(st, 5, now);
    rc = db_step(st);
    db_done(st);
    if (rc != DB_DONE || db_commit(d) < 0) goto fail;
    return STORE_OK;
fail:
    db_rollback(d);
    return STORE_ERROR;
}

int reg_cred_get(db *d, int64_t team_id, const char *host, reg_cred *out) {
    memset(out, 0, sizeof *out);
    db_stmt *st = db_prepare(d, SQL_GET);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, team_id);
    db_bind_text(st, 2, host, -1);
    int rc = db_step(st);
    if (rc != DB_ROW) {
        db_done(st);
        return rc == DB_DONE ? STORE_NOT_FOUND : STORE_ERROR;
    }
    const char *h = db_col_text(st, 0), *u = db_col_text(st, 1);
    snprintf(out->host, sizeof out->host, "%s", h ? h : "");
    snprintf(out->username, sizeof out->username, "%s", u ? u : "");
    int n = db_col_bytes(st, 2);
    const void *b = db_col_blob(st, 2);
    if (n < 0 || (size_t)n > sizeof out->sealed || (n > 0 && !b)) {
        db_done(st);
        return STORE_ERROR;
    }
    if (n) memcpy(out->sealed, b, (size_t)n);
    out->sealed_len = (size_t)n;
    out->created_at = db_col_int64(st, 3);
    db_done(st);
    return STORE_OK;
}

int reg_cred_list(db *d, int64_t team_id, cJSON **out) {
    *out = NULL;
    db_stmt *st = db_prepare(d, SQL_LIST);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, team_id);
    cJSON *arr = cJSON_CreateArray();
    int rc;
    while ((rc = db_step(st)) == DB_ROW) {
        cJSON *o = cJSON_CreateObject();
        const char *h = db_col_text(st, 0), *u = db_col_text(st, 1);
        cJSON_AddStringToObject(o, "registry", h ? h : "");
        cJSON_AddStringToObject(o, "username", u ? u : "");
        store_json_time_ms(o, "created_at", db_col_int64(st, 2));
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

int reg_cred_delete(db *d, int64_t team_id, const char *host) {
    db_stmt *st = db_prepare(d, SQL_DELETE);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, team_id);
    db_bind_text(st, 2, host, -1);
    int rc = db_step(st);
    db_done(st);
    if (rc != DB_DONE) return STORE_ERROR;
    return db_changes(d) > 0 ? STORE_OK : STORE_NOT_FOUND;
}
