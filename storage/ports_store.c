/* ports_store.c - task_ports: a job's web ports on its tasks' nodes. See
 * ports_store.h. */
#include "ports_store.h"
#include "store_base.h"
#include "store.h"

#include <stdio.h>
#include <string.h>

#include "../common/util.h"

static const char SQL_CLEAR[] = "DELETE FROM task_ports WHERE task_id = ?1";
static const char SQL_ADD[] = "INSERT INTO task_ports(task_id, name, port) VALUES (?1, ?2, ?3)";

int ports_store_set(db *d, int64_t task_id, const char (*names)[33], const int *ports, int n) {
    db_stmt *st = db_prepare(d, SQL_CLEAR);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, task_id);
    if (store_step_done(st) != STORE_OK) return STORE_ERROR;
    for (int i = 0; i < n; i++) {
        st = db_prepare(d, SQL_ADD);
        if (!st) return STORE_ERROR;
        db_bind_int64(st, 1, task_id);
        db_bind_text(st, 2, names[i], -1);
        db_bind_int(st, 3, ports[i]);
        if (store_step_done(st) != STORE_OK) return STORE_ERROR;
    }
    return STORE_OK;
}

#define FIND_FROM                                                                       \
    " FROM task_ports tp JOIN tasks t ON t.id = tp.task_id"                             \
    " JOIN nodes n ON n.id = t.node_id JOIN jobs j ON j.id = t.job_id"                  \
    " WHERE t.job_id = ?1 AND tp.name = ?2 AND t.state <> 'exited' ORDER BY t.id LIMIT 1"
static const char SQL_FIND[] =
    "SELECT tp.port, n.address, t.id, t.token_hash,"
    " coalesce(json_extract(j.spec, '$.interactive.type') = 'notebook', 0)" FIND_FROM;
static const char SQL_FIND_PG[] =
    "SELECT tp.port, n.address, t.id, t.token_hash,"
    " coalesce(ty_json_text(j.spec, '$.interactive.type') = 'notebook', false)" FIND_FROM;
static const char SQL_SPEC[] = "SELECT spec FROM jobs WHERE id = ?1";
static const char SQL_ROW_NAMES[] =
    "SELECT tp.name FROM task_ports tp JOIN tasks t ON t.id = tp.task_id WHERE t.job_id = ?1"
    " GROUP BY tp.name ORDER BY min(t.id), tp.name";

/* Appends name to the comma-separated list in have unless it is there;
 * a name that does not fit is left out (the list stays whole names). */
static void have_add(char *have, size_t havelen, const char *name) {
    size_t nl = strlen(name), used = strlen(have);
    for (const char *p = have; *p;) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        if (len == nl && strncmp(p, name, nl) == 0) return;
        if (!c) break;
        p = c + 1;
    }
    if (used + (used ? 1 : 0) + nl + 1 > havelen) return;
    if (used) have[used++] = ',';
    memcpy(have + used, name, nl + 1);
}

/* The names the job declares: its stored spec's "ports" (and "notebook"
 * for a notebook job), then any its tasks reported beside them. */
static int declared_names(db *d, int64_t job_id, char *have, size_t havelen) {
    db_stmt *st = db_prepare(d, SQL_SPEC);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, job_id);
    int rc = db_step(st);
    if (rc == DB_ROW) {
        const char *text = db_col_text(st, 0);
        cJSON *spec = text ? cJSON_Parse(text) : NULL;
        const cJSON *p;
        cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(spec, "ports")) {
            const cJSON *n = cJSON_GetObjectItemCaseSensitive(p, "name");
            if (cJSON_IsString(n)) have_add(have, havelen, n->valuestring);
        }
        const cJSON *in = cJSON_GetObjectItemCaseSensitive(spec, "interactive");
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(in, "type");
        if (cJSON_IsString(type) && strcmp(type->valuestring, "notebook") == 0) have_add(have, havelen, "notebook");
        cJSON_Delete(spec);
    }
    db_done(st);
    if (rc != DB_ROW && rc != DB_DONE) return STORE_ERROR;
    st = db_prepare(d, SQL_ROW_NAMES);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, job_id);
    while ((rc = db_step(st)) == DB_ROW) {
        const char *n = db_col_text(st, 0);
        if (n) have_add(have, havelen, n);
    }
    db_done(st);
    return rc == DB_DONE ? STORE_OK : STORE_ERROR;
}

int ports_store_find_hit(db *d, int64_t job_id, const char *name, ports_hit *hit, char *have, size_t havelen) {
    if (have && havelen) have[0] = '\0';
    memset(hit, 0, sizeof *hit);
    db_stmt *st = db_prepare2(d, SQL_FIND, SQL_FIND_PG);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, job_id);
    db_bind_text(st, 2, name, -1);
    int rc = db_step(st);
    if (rc == DB_ROW) {
        const char *addr = db_col_text(st, 1);
        const char *hash = db_col_text(st, 3);
        hit->port = db_col_int(st, 0);
        snprintf(hit->host, sizeof hit->host, "%s", addr ? addr : "");
        hit->task = db_col_int64(st, 2);
        snprintf(hit->token_hash, sizeof hit->token_hash, "%s", hash ? hash : "");
        hit->notebook = db_col_int(st, 4) != 0;
    }
    db_done(st);
    if (rc == DB_ROW) return STORE_OK;
    if (rc != DB_DONE) return STORE_ERROR;
    if (have && havelen && declared_names(d, job_id, have, havelen) != STORE_OK) return STORE_ERROR;
    return STORE_NOT_FOUND;
}

int ports_store_find(db *d, int64_t job_id, const char *name, char host[256], int *port, char *have, size_t havelen) {
    ports_hit hit;
    int rc = ports_store_find_hit(d, job_id, name, &hit, have, havelen);
    if (rc == STORE_OK) {
        memcpy(host, hit.host, sizeof hit.host);
        *port = hit.port;
    }
    return rc;
}

static const char SQL_LIST[] =
    "SELECT tp.name, t.id, t.type, t.idx, n.hostname, n.address, tp.port FROM task_ports tp"
    " JOIN tasks t ON t.id = tp.task_id JOIN nodes n ON n.id = t.node_id"
    " WHERE t.job_id = ?1 AND t.state <> 'exited' ORDER BY t.id, tp.name";

int ports_store_list(db *d, int64_t job_id, cJSON **out) {
    *out = NULL;
    db_stmt *st = db_prepare(d, SQL_LIST);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, job_id);
    cJSON *arr = cJSON_CreateArray();
    int rc;
    while ((rc = db_step(st)) == DB_ROW) {
        cJSON *o = cJSON_CreateObject();
        char tname[48];
        const char *type = db_col_text(st, 2);
        snprintf(tname, sizeof tname, "%s-%d", type ? type : "worker", db_col_int(st, 3));
        store_json_text(o, "name", st, 0);
        cJSON_AddNumberToObject(o, "task", (double)db_col_int64(st, 1));
        cJSON_AddStringToObject(o, "task_name", tname);
        store_json_text(o, "node", st, 4);
        store_json_text(o, "address", st, 5);
        cJSON_AddNumberToObject(o, "port", db_col_int(st, 6));
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
