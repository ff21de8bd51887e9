/* stats.c - aggregate queries for GET /metrics and the dashboard's job list.
 * Every statement is prepared through db_prepare; every query has the same
 * column shape (team, key, id, v0, v1, v2), so one loop reads them all. */
#include "stats.h"

#include <stdlib.h>
#include <string.h>

#include "../common/util.h"

static const char SQL_TEAMS[] = "SELECT name, '', id, 0, 0, 0 FROM teams ORDER BY name";
static const char SQL_JOBS[] =
    "SELECT t.name, j.state, 0, count(*), 0, 0 FROM jobs j JOIN teams t ON t.id = j.team_id"
    " WHERE j.deleted_at IS NULL GROUP BY t.name, j.state ORDER BY t.name, j.state";
static const char SQL_QUEUE[] =
    "SELECT t.name, '', t.id, count(j.id), coalesce(max(?1 - j.queued_at), 0) / 1000.0,"
    " coalesce(sum(?1 - j.queued_at), 0) / 1000.0"
    " FROM teams t LEFT JOIN jobs j ON j.team_id = t.id AND j.state = 'queued'"
    " GROUP BY t.id ORDER BY t.name";
static const char SQL_DEVICES[] =
    "SELECT '', d.kind, 0, count(*), count(a.device_id), 0 FROM devices d"
    " JOIN nodes n ON n.id = d.node_id AND n.state = 'ready'"
    " LEFT JOIN allocations a ON a.device_id = d.id GROUP BY d.kind ORDER BY d.kind";
static const char SQL_DEVICES_TEAM[] =
    "SELECT t.name, d.kind, 0, count(*), 0, 0 FROM allocations a JOIN devices d ON d.id = a.device_id"
    " JOIN jobs j ON j.id = a.job_id JOIN teams t ON t.id = j.team_id"
    " GROUP BY t.name, d.kind ORDER BY t.name, d.kind";
static const char SQL_NODES[] =
    "SELECT '', n.state, 0, count(*), sum(n.memory_mb),"
    " coalesce(sum((SELECT sum(t.memory_mb) FROM tasks t WHERE t.node_id = n.id"
    "   AND t.id IN (SELECT task_id FROM allocations))), 0)"
    " FROM nodes n GROUP BY n.state ORDER BY n.state";
static const char SQL_RUNNING[] =
    "SELECT t.name, j.state, j.id,"
    " coalesce(json_extract(j.progress, '$.samples_per_sec'), 0),"
    " coalesce(json_extract(j.progress, '$.step'), 0),"
    " coalesce(json_extract(j.progress, '$.fraction'), 0)"
    " FROM jobs j JOIN teams t ON t.id = j.team_id"
    " WHERE j.state = 'running' AND json_valid(coalesce(j.progress, 'null')) ORDER BY j.id";
static const char SQL_RUNNING_PG[] =
    "SELECT t.name, j.state, j.id,"
    " coalesce(ty_json_num(j.progress, '$.samples_per_sec'), 0),"
    " coalesce(ty_json_num(j.progress, '$.step'), 0),"
    " coalesce(ty_json_num(j.progress, '$.fraction'), 0)"
    " FROM jobs j JOIN teams t ON t.id = j.team_id"
    " WHERE j.state = 'running' AND ty_json_valid(coalesce(j.progress, 'null')) ORDER BY j.id";

static void col_text(db_stmt *st, int col, char *out, size_t cap) {
    const char *t = db_col_text(st, col);
    if (sfmt(out, cap, "%s", t ? (const char *)t : "") < 0) out[cap - 1] = '\0';
}

int stats_query(db *d, stats_kind kind, int64_t now_ms, stats_row **out, int *n) {
    const char *const sql[] = {SQL_TEAMS, SQL_JOBS,  SQL_QUEUE,  SQL_DEVICES,
                               SQL_DEVICES_TEAM, SQL_NODES, db_sql(d, SQL_RUNNING, SQL_RUNNING_PG)};
    *out = NULL;
    *n = 0;
    if ((unsigned)kind >= sizeof sql / sizeof sql[0]) return -1;
    db_stmt *st = db_prepare(d, sql[kind]);
    if (!st) return -1;
    if (kind == STATS_QUEUE) db_bind_int64(st, 1, now_ms);
    stats_row *rows = NULL;
    int cnt = 0, cap = 0, rc;
    while ((rc = db_step(st)) == DB_ROW) {
        if (cnt == cap) {
            cap = cap ? cap * 2 : 16;
            rows = xrealloc(rows, (size_t)cap * sizeof *rows);
        }
        stats_row *r = &rows[cnt++];
        memset(r, 0, sizeof *r);
        col_text(st, 0, r->team, sizeof r->team);
        col_text(st, 1, r->key, sizeof r->key);
        r->id = db_col_int64(st, 2);
        for (int k = 0; k < 3; k++) r->v[k] = db_col_double(st, 3 + k);
    }
    db_done(st);
    if (rc != DB_DONE) {
        log_error("stats: query %d: %s", (int)kind, db_errmsg(d));
        free(rows);
        return -1;
    }
    *out = rows;
    *n = cnt;
    return 0;
}
