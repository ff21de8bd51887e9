/* audit.c - the audit trail's rows (see audit.h). */
#include "audit.h"

#include <string.h>

#include "store_base.h"
#include "../common/json_out.h"

static const char SQL_AUDIT_INSERT[] =
    "INSERT INTO audit(at, actor, user_id, token_id, team_id, method, route, target, client, status)"
    " VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id";
static const char SQL_AUDIT_STATUS[] = "UPDATE audit SET status = ? WHERE id = ?";

int audit_insert(db *d, const audit_row *r, int64_t *id) {
    db_stmt *st = db_prepare(d, SQL_AUDIT_INSERT);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, r->at);
    db_bind_text(st, 2, r->actor, -1);
    if (r->user_id > 0) db_bind_int64(st, 3, r->user_id);
    if (r->token_id > 0) db_bind_int64(st, 4, r->token_id);
    if (r->team_id > 0) db_bind_int64(st, 5, r->team_id);
    db_bind_text(st, 6, r->method, -1);
    db_bind_text(st, 7, r->route, -1);
    if (r->target[0]) db_bind_text(st, 8, r->target, -1);
    if (r->client[0]) db_bind_text(st, 9, r->client, -1);
    db_bind_int(st, 10, r->status);
    int rc = store_step_id(st, id);
    if (rc == STORE_CONFLICT) rc = STORE_ERROR;
    return rc;
}

int audit_set_status(db *d, int64_t id, int status) {
    db_stmt *st = db_prepare(d, SQL_AUDIT_STATUS);
    if (!st) return STORE_ERROR;
    db_bind_int(st, 1, status);
    db_bind_int64(st, 2, id);
    return store_step_done(st);
}

static const char SQL_AUDIT_QUERY[] =
    "SELECT a.id, a.at, a.actor, u.name, a.token_id, t.name, a.method, a.route, a.target, a.client, a.status"
    " FROM audit a LEFT JOIN users u ON u.id = a.user_id LEFT JOIN teams t ON t.id = a.team_id"
    " WHERE (?1 = 0 OR a.at >= ?1) AND (?2 = 0 OR a.at < ?2) AND (?3 IS NULL OR u.name = ?3)"
    " AND (?4 = 0 OR a.team_id = ?4) AND (?5 IS NULL OR instr(a.method || ' ' || a.route, ?5) > 0)"
    " AND (?6 = 0 OR a.id < ?6) ORDER BY a.id DESC LIMIT ?7";
static const char SQL_AUDIT_QUERY_PG[] =
    "SELECT a.id, a.at, a.actor, u.name, a.token_id, t.name, a.method, a.route, a.target, a.client, a.status"
    " FROM audit a LEFT JOIN users u ON u.id = a.user_id LEFT JOIN teams t ON t.id = a.team_id"
    " WHERE ($1 = 0 OR a.at >= $1) AND ($2 = 0 OR a.at < $2) AND ($3::text IS NULL OR u.name = $3)"
    " AND ($4 = 0 OR a.team_id = $4) AND ($5::text IS NULL OR strpos(a.method || ' ' || a.route, $5) > 0)"
    " AND ($6 = 0 OR a.id < $6) ORDER BY a.id DESC LIMIT $7";

int audit_query(db *d, const audit_filter *f, int csv, buf *out, int64_t *next) {
    db_stmt *st = db_prepare2(d, SQL_AUDIT_QUERY, SQL_AUDIT_QUERY_PG);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, f->since);
    db_bind_int64(st, 2, f->until);
    if (f->user) db_bind_text(st, 3, f->user, -1);
    db_bind_int64(st, 4, f->team_id);
    if (f->action) db_bind_text(st, 5, f->action, -1);
    db_bind_int64(st, 6, f->before);
    db_bind_int(st, 7, f->limit + 1);
    static const char *const cols[] = {"id", "time", "actor", "user", "token_id", "team",
                                       "method", "route", "target", "client", "status"};
    int full = csv ? 0 : buf_append(out, "[", 1);
    for (int c = 0; csv && c < 11; c++) full |= buf_printf(out, "%s%s", c ? "," : "", cols[c]);
    if (csv) full |= buf_append(out, "\n", 1);
    int rc, n = 0;
    int64_t last = 0;
    *next = 0;
    while ((rc = db_step(st)) == DB_ROW) {
        if (n == f->limit) {
            *next = last;
            continue;
        }
        last = db_col_int64(st, 0);
        char when[25];
        store_time_text(when, db_col_int64(st, 1));
        if (!csv && n) full |= buf_append(out, ",", 1);
        if (!csv) full |= buf_append(out, "{", 1);
        for (int c = 0; c < 11; c++) {
            int null = db_col_type(st, c) == DB_NULL;
            int num = c == 0 || c == 4 || c == 10;
            const char *txt = c == 1 ? when : db_col_text(st, c);
            if (csv) {
                if (c) full |= buf_append(out, ",", 1);
                if (num && !null) full |= buf_printf(out, "%lld", (long long)db_col_int64(st, c));
                else if (!null || c == 1) full |= buf_csv_field(out, txt);
            } else {
                if (c) full |= buf_append(out, ",", 1);
                full |= json_write_string(out, cols[c]);
                full |= buf_append(out, ":", 1);
                if (null && c != 1) full |= buf_append(out, "null", 4);
                else if (num) full |= json_write_int(out, db_col_int64(st, c));
                else full |= json_write_string(out, txt);
            }
        }
        full |= csv ? buf_append(out, "\n", 1) : buf_append(out, "}", 1);
        n++;
    }
    db_done(st);
    if (!csv) full |= buf_append(out, "]", 1);
    return rc != DB_DONE || full ? STORE_ERROR : STORE_OK;
}

static const char SQL_AUDIT_PRUNE[] =
    "DELETE FROM audit WHERE id IN (SELECT a.id FROM (SELECT id, at FROM audit ORDER BY id LIMIT 10000) AS a WHERE a.at < ?)";

int audit_prune(db *d, int64_t before, int *n) {
    db_stmt *st = db_prepare(d, SQL_AUDIT_PRUNE);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, before);
    int rc = store_step_done(st);
    if (n) *n = rc == STORE_OK ? db_changes(d) : 0;
    return rc;
}
