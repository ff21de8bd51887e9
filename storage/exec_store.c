/* exec_store.c - tasks, metrics, log chunks, checkpoints, rendezvous and
 * progress rows for the executors. See exec_store.h for the contract. */
#include "exec_store.h"
#include "../common/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void add_int_or_null(cJSON *o, const char *key, db_stmt *st, int col) {
    if (db_col_type(st, col) == DB_NULL) cJSON_AddNullToObject(o, key);
    else cJSON_AddNumberToObject(o, key, (double)db_col_int64(st, col));
}

static void col_copy(db_stmt *st, int col, char *dst, size_t cap) {
    const char *s = db_col_text(st, col);
    snprintf(dst, cap, "%s", s ? s : "");
}

/* ---------------------------------------------------------------- jobs */

static const char SQL_JOB[] =
    "SELECT id, team_id, state, attempt, max_restarts, spec, deleted_at IS NOT NULL, coalesce(logs_purged_at, 0)"
    " FROM jobs WHERE id = ?";

int exec_store_job_get(db *d, int64_t job_id, int with_spec, exec_job *out) {
    memset(out, 0, sizeof *out);
    db_stmt *st = db_prepare(d, SQL_JOB);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, job_id);
    int rc = db_step(st);
    if (rc != DB_ROW) {
        db_done(st);
        return rc == DB_DONE ? STORE_NOT_FOUND : STORE_ERROR;
    }
    out->id = db_col_int64(st, 0);
    out->team_id = db_col_int64(st, 1);
    col_copy(st, 2, out->state, sizeof out->state);
    out->attempt = db_col_int(st, 3);
    out->max_restarts = db_col_int(st, 4);
    out->deleted = db_col_int(st, 6);
    out->logs_purged_at = db_col_int64(st, 7);
    if (with_spec) {
        const char *s = db_col_text(st, 5);
        out->spec = xstrdup(s ? s : "{}");
    }
    db_done(st);
    return STORE_OK;
}

void exec_store_job_release(exec_job *j) {
    free(j->spec);
    j->spec = NULL;
}

static const char SQL_PROGRESS_GET[] = "SELECT progress FROM jobs WHERE id = ?";
static const char SQL_PROGRESS_SET[] = "UPDATE jobs SET progress = ? WHERE id = ?";
static const char SQL_JOB_REASON[] = "UPDATE jobs SET reason = ?, updated_at = ? WHERE id = ?";

int exec_store_progress_get(db *d, int64_t job_id, char **out) {
    *out = NULL;
    db_stmt *st = db_prepare(d, SQL_PROGRESS_GET);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, job_id);
    int rc = db_step(st);
    int ret = rc == DB_ROW ? STORE_OK : rc == DB_DONE ? STORE_NOT_FOUND : STORE_ERROR;
    if (ret == STORE_OK && db_col_type(st, 0) != DB_NULL)
        *out = xstrdup(db_col_text(st, 0));
    db_done(st);
    return ret;
}

int exec_store_progress_set(db *d, int64_t job_id, const char *json) {
    db_stmt *st = db_prepare(d, SQL_PROGRESS_SET);
    if (!st) return STORE_ERROR;
    db_bind_text(st, 1, json, -1);
    db_bind_int64(st, 2, job_id);
    return store_step_done(st);
}

static const char SQL_JOB_CKPT_AT[] = "UPDATE jobs SET last_checkpoint_at = ? WHERE id = ?";

int exec_store_job_checkpointed(db *d, int64_t job_id, int64_t at_ms) {
    db_stmt *st = db_prepare(d, SQL_JOB_CKPT_AT);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, at_ms);
    db_bind_int64(st, 2, job_id);
    return store_step_done(st);
}

int exec_store_job_set_reason(db *d, int64_t job_id, const char *reason) {
    db_stmt *st = db_prepare(d, SQL_JOB_REASON);
    if (!st) return STORE_ERROR;
    db_bind_text(st, 1, reason, -1);
    db_bind_int64(st, 2, now_ms());
    db_bind_int64(st, 3, job_id);
    return store_step_done(st);
}

/* ---------------------------------------------------------------- tasks */

static const char SQL_TASK[] =
    "SELECT id, job_id, node_id, attempt, type, idx, port, state, token_hash IS NOT NULL, exit_code,"
    " reason, memory_mb FROM tasks WHERE id = ?";

int exec_store_task_get(db *d, int64_t task_id, exec_task *out) {
    memset(out, 0, sizeof *out);
    db_stmt *st = db_prepare(d, SQL_TASK);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, task_id);
    int rc = db_step(st);
    if (rc != DB_ROW) {
        db_done(st);
        return rc == DB_DONE ? STORE_NOT_FOUND : STORE_ERROR;
    }
    out->id = db_col_int64(st, 0);
    out->job_id = db_col_int64(st, 1);
    out->node_id = db_col_int64(st, 2);
    out->attempt = db_col_int(st, 3);
    col_copy(st, 4, out->type, sizeof out->type);
    out->index = db_col_int(st, 5);
    out->port = db_col_int(st, 6);
    col_copy(st, 7, out->state, sizeof out->state);
    out->handed_out = db_col_int(st, 8);
    out->has_exit = db_col_type(st, 9) != DB_NULL;
    out->exit_code = db_col_int(st, 9);
    col_copy(st, 10, out->reason, sizeof out->reason);
    out->memory_mb = db_col_int64(st, 11);
    db_done(st);
    return STORE_OK;
}

static const char SQL_NODE_EXISTS[] = "SELECT 1 FROM nodes WHERE id = ?";

int exec_store_node_exists(db *d, int64_t node_id) {
    db_stmt *st = db_prepare(d, SQL_NODE_EXISTS);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, node_id);
    int rc = db_step(st);
    db_done(st);
    return rc == DB_ROW ? STORE_OK : rc == DB_DONE ? STORE_NOT_FOUND : STORE_ERROR;
}

static const char SQL_NODE_PENDING[] =
    "SELECT id FROM tasks WHERE node_id = ? AND state = 'assigned' AND token_hash IS NULL ORDER BY id LIMIT ?";

int exec_store_node_pending(db *d, int64_t node_id, int64_t *ids, int max, int *n) {
    *n = 0;
    db_stmt *st = db_prepare(d, SQL_NODE_PENDING);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, node_id);
    db_bind_int(st, 2, max);
    int rc;
    while ((rc = db_step(st)) == DB_ROW && *n < max) ids[(*n)++] = db_col_int64(st, 0);
    db_done(st);
    return rc == DB_DONE || rc == DB_ROW ? STORE_OK : STORE_ERROR;
}

static const char SQL_TASK_HANDOUT[] =
    "UPDATE tasks SET token_hash = ? WHERE id = ? AND state = 'assigned' AND token_hash IS NULL";

int exec_store_task_handout(db *d, int64_t task_id, const char *token_hash) {
    db_stmt *st = db_prepare(d, SQL_TASK_HANDOUT);
    if (!st) return STORE_ERROR;
    db_bind_text(st, 1, token_hash, -1);
    db_bind_int64(st, 2, task_id);
    int rc = db_step(st);
    int changed = db_changes(d);
    db_done(st);
    if (rc != DB_DONE) return STORE_ERROR;
    return changed == 1 ? STORE_OK : STORE_CONFLICT;
}

static const char SQL_NODE_REVOKE_ASSIGNED[] =
    "UPDATE tokens SET revoked_at = ?1 WHERE revoked_at IS NULL AND hash IN"
    " (SELECT token_hash FROM tasks WHERE node_id = ?2 AND state = 'assigned' AND token_hash IS NOT NULL"
    "  AND id NOT IN (SELECT value FROM json_each(?3)))";
static const char SQL_NODE_RESET_HANDOUTS[] =
    "UPDATE tasks SET token_hash = NULL WHERE node_id = ?1 AND state = 'assigned'"
    " AND id NOT IN (SELECT value FROM json_each(?2))";
static const char SQL_NODE_REVOKE_ASSIGNED_PG[] =
    "UPDATE tokens SET revoked_at = $1 WHERE revoked_at IS NULL AND hash IN"
    " (SELECT token_hash FROM tasks WHERE node_id = $2 AND state = 'assigned' AND token_hash IS NOT NULL"
    "  AND id NOT IN (SELECT jsonb_array_elements_text($3::text::jsonb)::bigint))";
static const char SQL_NODE_RESET_HANDOUTS_PG[] =
    "UPDATE tasks SET token_hash = NULL WHERE node_id = $1 AND state = 'assigned'"
    " AND id NOT IN (SELECT jsonb_array_elements_text($2::text::jsonb)::bigint)";

int exec_store_node_reset_handouts(db *d, int64_t node_id, const char *keep_json) {
    db_stmt *st = db_prepare2(d, SQL_NODE_REVOKE_ASSIGNED, SQL_NODE_REVOKE_ASSIGNED_PG);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, now_ms());
    db_bind_int64(st, 2, node_id);
    db_bind_text(st, 3, keep_json, -1);
    if (store_step_done(st) != STORE_OK) return STORE_ERROR;
    st = db_prepare2(d, SQL_NODE_RESET_HANDOUTS, SQL_NODE_RESET_HANDOUTS_PG);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, node_id);
    db_bind_text(st, 2, keep_json, -1);
    return store_step_done(st);
}

static const char SQL_NODE_STOPPING[] =
    "SELECT id, job_id, reason FROM tasks WHERE node_id = ? AND state = 'stopping' ORDER BY id";

int exec_store_node_stopping(db *d, int64_t node_id, cJSON **out) {
    db_stmt *st = db_prepare(d, SQL_NODE_STOPPING);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, node_id);
    cJSON *arr = cJSON_CreateArray();
    int rc;
    while ((rc = db_step(st)) == DB_ROW) {
        cJSON *t = cJSON_CreateObject();
        cJSON_AddNumberToObject(t, "task", (double)db_col_int64(st, 0));
        cJSON_AddNumberToObject(t, "job", (double)db_col_int64(st, 1));
        const char *r = db_col_text(st, 2);
        cJSON_AddStringToObject(t, "reason", r ? r : "stopped");
        cJSON_AddItemToArray(arr, t);
    }
    db_done(st);
    if (rc != DB_DONE) {
        cJSON_Delete(arr);
        return STORE_ERROR;
    }
    *out = arr;
    return STORE_OK;
}

static const char SQL_ATTEMPT_CLUSTER[] =
    "SELECT t.type, t.idx, n.address, t.port FROM tasks t JOIN nodes n ON n.id = t.node_id"
    " WHERE t.job_id = ? AND t.attempt = ? AND t.type != 'evaluator' ORDER BY t.type, t.idx";

int exec_store_attempt_cluster(db *d, int64_t job_id, int attempt, cJSON **out) {
    db_stmt *st = db_prepare(d, SQL_ATTEMPT_CLUSTER);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, job_id);
    db_bind_int(st, 2, attempt);
    cJSON *c = cJSON_CreateObject();
    cJSON *chief = cJSON_AddArrayToObject(c, "chief");
    cJSON *worker = cJSON_AddArrayToObject(c, "worker");
    cJSON *ps = cJSON_AddArrayToObject(c, "ps");
    int rc;
    while ((rc = db_step(st)) == DB_ROW) {
        const char *type = db_col_text(st, 0);
        int idx = db_col_int(st, 1);
        const char *addr = db_col_text(st, 2);
        char hp[300];
        snprintf(hp, sizeof hp, "%s:%d", addr ? addr : "127.0.0.1", db_col_int(st, 3));
        if (type && strcmp(type, "ps") == 0) {
            cJSON_AddItemToArray(ps, cJSON_CreateString(hp));
        } else {
            cJSON_AddItemToArray(worker, cJSON_CreateString(hp));
            if (idx == 0) cJSON_AddItemToArray(chief, cJSON_CreateString(hp));
        }
    }
    db_done(st);
    if (rc != DB_DONE) {
        cJSON_Delete(c);
        return STORE_ERROR;
    }
    *out = c;
    return STORE_OK;
}

static const char SQL_TASK_DEVICES[] =
    "SELECT v.kind, v.idx FROM allocations a JOIN devices v ON v.id = a.device_id"
    " WHERE a.task_id = ? ORDER BY v.kind, v.idx";

int exec_store_task_devices(db *d, int64_t task_id, cJSON **out) {
    db_stmt *st = db_prepare(d, SQL_TASK_DEVICES);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, task_id);
    cJSON *arr = cJSON_CreateArray();
    int rc;
    while ((rc = db_step(st)) == DB_ROW) {
        char name[64];
        const char *k = db_col_text(st, 0);
        snprintf(name, sizeof name, "%s:%d", k ? k : "cpu", db_col_int(st, 1));
        cJSON_AddItemToArray(arr, cJSON_CreateString(name));
    }
    db_done(st);
    if (rc != DB_DONE) {
        cJSON_Delete(arr);
        return STORE_ERROR;
    }
    *out = arr;
    return STORE_OK;
}

static const char SQL_TASK_RUNNING[] =
    "UPDATE tasks SET state = CASE WHEN state = 'assigned' THEN 'running' ELSE state END,"
    " started_at = coalesce(started_at, ?2) WHERE id = ?1 AND state != 'exited'";
static const char SQL_TASK_EXITED[] =
    "UPDATE tasks SET state = 'exited', exit_code = ?2, reason = coalesce(?3, reason), finished_at = ?4"
    " WHERE id = ?1 AND state != 'exited'";

static int update_one(db *d, db_stmt *st) {
    int rc = db_step(st);
    int changed = db_changes(d);
    db_done(st);
    if (rc != DB_DONE) return STORE_ERROR;
    return changed == 1 ? STORE_OK : STORE_CONFLICT;
}

int exec_store_task_set_running(db *d, int64_t task_id) {
    db_stmt *st = db_prepare(d, SQL_TASK_RUNNING);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, task_id);
    db_bind_int64(st, 2, now_ms());
    return update_one(d, st);
}

int exec_store_task_set_exited(db *d, int64_t task_id, int exit_code, const char *reason) {
    db_stmt *st = db_prepare(d, SQL_TASK_EXITED);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, task_id);
    db_bind_int(st, 2, exit_code);
    if (reason) db_bind_text(st, 3, reason, -1);
    db_bind_int64(st, 4, now_ms());
    return update_one(d, st);
}

static const char SQL_TASK_FREE[] = "DELETE FROM allocations WHERE task_id = ?";

int exec_store_task_free(db *d, int64_t task_id) {
    db_stmt *st = db_prepare(d, SQL_TASK_FREE);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, task_id);
    return store_step_done(st);
}

static const char SQL_TASK_REVOKE[] =
    "UPDATE tokens SET revoked_at = ?1 WHERE revoked_at IS NULL AND kind = 'task'"
    " AND hash = (SELECT token_hash FROM tasks WHERE id = ?2)";

int exec_store_task_revoke_token(db *d, int64_t task_id) {
    db_stmt *st = db_prepare(d, SQL_TASK_REVOKE);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, now_ms());
    db_bind_int64(st, 2, task_id);
    return store_step_done(st);
}

static const char SQL_DROP_UNSTARTED_FREE[] =
    "DELETE FROM allocations WHERE task_id IN"
    " (SELECT id FROM tasks WHERE job_id = ? AND state IN ('assigned','stopping') AND token_hash IS NULL)";
static const char SQL_DROP_UNSTARTED[] =
    "UPDATE tasks SET state = 'exited', reason = ?2, finished_at = ?3"
    " WHERE job_id = ?1 AND state IN ('assigned','stopping') AND token_hash IS NULL";

int exec_store_attempt_drop_unstarted(db *d, int64_t job_id, const char *why) {
    db_stmt *st = db_prepare(d, SQL_DROP_UNSTARTED_FREE);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, job_id);
    if (store_step_done(st) != STORE_OK) return STORE_ERROR;
    st = db_prepare(d, SQL_DROP_UNSTARTED);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, job_id);
    db_bind_text(st, 2, why, -1);
    db_bind_int64(st, 3, now_ms());
    return store_step_done(st);
}

/* total and running count the gang (an evaluator is beside it, not in it);
 * live counts every task still to exit, the evaluator included. */
static const char SQL_ATTEMPT_COUNTS[] =
    "SELECT coalesce(sum(CASE WHEN type != 'evaluator' THEN 1 ELSE 0 END), 0),"
    " coalesce(sum(CASE WHEN state = 'running' AND type != 'evaluator' THEN 1 ELSE 0 END), 0),"
    " coalesce(sum(CASE WHEN state != 'exited' THEN 1 ELSE 0 END), 0) FROM tasks WHERE job_id = ? AND attempt = ?";

int exec_store_attempt_counts(db *d, int64_t job_id, int attempt, int *total, int *running, int *live) {
    db_stmt *st = db_prepare(d, SQL_ATTEMPT_COUNTS);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, job_id);
    db_bind_int(st, 2, attempt);
    int rc = db_step(st);
    if (rc == DB_ROW) {
        *total = db_col_int(st, 0);
        *running = db_col_int(st, 1);
        *live = db_col_int(st, 2);
    }
    db_done(st);
    return rc == DB_ROW ? STORE_OK : STORE_ERROR;
}

static const char SQL_ATTEMPT_CHIEF[] =
    "SELECT state, exit_code FROM tasks WHERE job_id = ? AND attempt = ? AND type = 'worker' AND idx = 0";

int exec_store_attempt_chief(db *d, int64_t job_id, int attempt, int *exited, int *code) {
    *exited = 0;
    *code = 0;
    db_stmt *st = db_prepare(d, SQL_ATTEMPT_CHIEF);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, job_id);
    db_bind_int(st, 2, attempt);
    int rc = db_step(st);
    if (rc == DB_ROW) {
        const char *s = db_col_text(st, 0);
        *exited = s && strcmp(s, "exited") == 0;
        *code = db_col_type(st, 1) == DB_NULL ? -1 : db_col_int(st, 1);
    }
    db_done(st);
    return rc == DB_ROW ? STORE_OK : rc == DB_DONE ? STORE_NOT_FOUND : STORE_ERROR;
}

static const char SQL_JOB_TASKS[] =
    "SELECT t.id, t.type, t.idx, n.hostname, t.node_id, n.address, t.port, t.state, t.exit_code, t.reason,"
    " t.started_at, t.finished_at FROM tasks t JOIN nodes n ON n.id = t.node_id"
    " WHERE t.job_id = ? AND t.attempt = ? ORDER BY t.type DESC, t.idx";

int exec_store_job_tasks(db *d, int64_t job_id, int attempt, cJSON **out) {
    db_stmt *st = db_prepare(d, SQL_JOB_TASKS);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, job_id);
    db_bind_int(st, 2, attempt);
    cJSON *arr = cJSON_CreateArray();
    int rc;
    while ((rc = db_step(st)) == DB_ROW) {
        cJSON *t = cJSON_CreateObject();
        char name[48];
        const char *type = db_col_text(st, 1);
        snprintf(name, sizeof name, "%s-%d", type ? type : "worker", db_col_int(st, 2));
        cJSON_AddNumberToObject(t, "id", (double)db_col_int64(st, 0));
        store_json_text(t, "type", st, 1);
        cJSON_AddNumberToObject(t, "index", db_col_int(st, 2));
        cJSON_AddStringToObject(t, "name", name);
        store_json_text(t, "node", st, 3);
        cJSON_AddNumberToObject(t, "node_id", (double)db_col_int64(st, 4));
        store_json_text(t, "address", st, 5);
        cJSON_AddNumberToObject(t, "port", db_col_int(st, 6));
        store_json_text(t, "state", st, 7);
        add_int_or_null(t, "exit_code", st, 8);
        store_json_text(t, "reason", st, 9);
        store_json_time(t, "started_at", st, 10);
        store_json_time(t, "finished_at", st, 11);
        cJSON_AddItemToArray(arr, t);
    }
    db_done(st);
    if (rc != DB_DONE) {
        cJSON_Delete(arr);
        return STORE_ERROR;
    }
    *out = arr;
    return STORE_OK;
}

/* ---------------------------------------------------------------- metrics */

int exec_store_job_attempt(db *d, int64_t job_id, int *attempt) {
    db_stmt *st = db_prepare(d, "SELECT attempt FROM jobs WHERE id = ?");
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, job_id);
    int rc = db_step(st);
    if (rc == DB_ROW) *attempt = db_col_int(st, 0);
    db_done(st);
    return rc == DB_ROW ? STORE_OK : rc == DB_DONE ? STORE_NOT_FOUND : STORE_ERROR;
}

static const char SQL_METRIC_ADD[] =
    "INSERT INTO metrics(job_id, seq, attempt, kind, step, epoch, ts, data)"
    " VALUES(?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING";

/* kind 'eval' (the evaluator's metrics): a table and a sequence of their own. */
static const char SQL_EVAL_ADD[] =
    "INSERT INTO eval_metrics(job_id, seq, attempt, kind, step, epoch, ts, data)"
    " VALUES(?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING";

static int is_eval(const char *kind) { return kind && strcmp(kind, "eval") == 0; }

int exec_store_metric_add(db *d, int64_t job_id, int64_t seq, int attempt, const char *kind,
                          const int64_t *step, const int64_t *epoch, const char *data, int *inserted) {
    db_stmt *st = db_prepare(d, is_eval(kind) ? SQL_EVAL_ADD : SQL_METRIC_ADD);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, job_id);
    db_bind_int64(st, 2, seq);
    db_bind_int(st, 3, attempt);
    db_bind_text(st, 4, kind, -1);
    if (step) db_bind_int64(st, 5, *step);
    if (epoch) db_bind_int64(st, 6, *epoch);
    db_bind_int64(st, 7, now_ms());
    db_bind_text(st, 8, data, -1);
    int rc = db_step(st);
    int changed = db_changes(d);
    db_done(st);
    if (rc != DB_DONE) return STORE_ERROR;
    if (inserted) *inserted = changed == 1;
    return STORE_OK;
}

static const char SQL_METRICS_LIST[] =
    "SELECT seq, attempt, kind, ts, data FROM metrics WHERE job_id = ?1 AND seq > ?2"
    " AND (?3 IS NULL OR kind = ?3) ORDER BY seq LIMIT ?4";
static const char SQL_METRICS_LAST[] = "SELECT coalesce(max(seq), 0) FROM metrics WHERE job_id = ?";
static const char SQL_EVAL_LIST[] =
    "SELECT seq, attempt, kind, ts, data FROM eval_metrics WHERE job_id = ?1 AND seq > ?2"
    " AND (?3 IS NULL OR kind = ?3) ORDER BY seq LIMIT ?4";
static const char SQL_EVAL_LAST[] = "SELECT coalesce(max(seq), 0) FROM eval_metrics WHERE job_id = ?";

static cJSON *metric_row(db_stmt *st, int c0) {
    const char *data = db_col_text(st, c0 + 4);
    cJSON *m = data ? cJSON_Parse(data) : NULL;
    if (!cJSON_IsObject(m)) {
        cJSON_Delete(m);
        m = cJSON_CreateObject();
    }
    cJSON_DeleteItemFromObject(m, "seq");
    cJSON_DeleteItemFromObject(m, "kind");
    cJSON_DeleteItemFromObject(m, "attempt");
    cJSON_DeleteItemFromObject(m, "time");
    cJSON_AddNumberToObject(m, "seq", (double)db_col_int64(st, c0));
    store_json_text(m, "kind", st, c0 + 2);
    cJSON_AddNumberToObject(m, "attempt", db_col_int(st, c0 + 1));
    store_json_time(m, "time", st, c0 + 3);
    return m;
}

int exec_store_metrics_list(db *d, int64_t job_id, int64_t since, const char *kind, int limit, cJSON **out,
                            int64_t *last_seq) {
    db_stmt *st = db_prepare(d, is_eval(kind) ? SQL_EVAL_LAST : SQL_METRICS_LAST);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, job_id);
    int rc = db_step(st);
    if (rc == DB_ROW) *last_seq = db_col_int64(st, 0);
    db_done(st);
    if (rc != DB_ROW) return STORE_ERROR;
    if (!out) return STORE_OK;
    st = db_prepare(d, is_eval(kind) ? SQL_EVAL_LIST : SQL_METRICS_LIST);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, job_id);
    db_bind_int64(st, 2, since);
    if (kind) db_bind_text(st, 3, kind, -1);
    db_bind_int(st, 4, limit);
    cJSON *arr = cJSON_CreateArray();
    while ((rc = db_step(st)) == DB_ROW) cJSON_AddItemToArray(arr, metric_row(st, 0));
    db_done(st);
    if (rc != DB_DONE) {
        cJSON_Delete(arr);
        return STORE_ERROR;
    }
    *out = arr;
    return STORE_OK;
}

static const char SQL_METRIC_LATEST[] =
    "SELECT seq, attempt, kind, ts, data FROM metrics WHERE job_id = ?1 AND (?2 IS NULL OR kind = ?2)"
    " ORDER BY seq DESC LIMIT 1";
/* the evaluation of the newest checkpoint (an evaluator may evaluate an
 * older one after it: the final one first when it is stopped) */
static const char SQL_EVAL_LATEST[] =
    "SELECT seq, attempt, kind, ts, data FROM eval_metrics WHERE job_id = ?1 AND (?2 IS NULL OR kind = ?2)"
    " ORDER BY step DESC, seq DESC LIMIT 1";

int exec_store_metric_latest(db *d, int64_t job_id, const char *kind, cJSON **out) {
    *out = NULL;
    db_stmt *st = db_prepare(d, is_eval(kind) ? SQL_EVAL_LATEST : SQL_METRIC_LATEST);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, job_id);
    if (kind) db_bind_text(st, 2, kind, -1);
    int rc = db_step(st);
    if (rc == DB_ROW) *out = metric_row(st, 0);
    db_done(st);
    return rc == DB_ROW || rc == DB_DONE ? STORE_OK : STORE_ERROR;
}

static const char SQL_EPOCH_THROUGHPUT[] =
    "SELECT count(*), total(json_extract(data, '$.samples_per_sec') * json_extract(data, '$.seconds')),"
    " total(json_extract(data, '$.seconds')) FROM metrics WHERE job_id = ?1 AND kind = 'epoch'"
    " AND json_valid(data)"
    " AND json_type(data, '$.samples_per_sec') IN ('integer', 'real') AND json_extract(data, '$.samples_per_sec') > 0"
    " AND json_type(data, '$.seconds') IN ('integer', 'real') AND json_extract(data, '$.seconds') > 0";
static const char SQL_EPOCH_THROUGHPUT_PG[] =
    "SELECT count(*), coalesce(sum(ty_json_num(data, '$.samples_per_sec') * ty_json_num(data, '$.seconds')), 0.0),"
    " coalesce(sum(ty_json_num(data, '$.seconds')), 0.0) FROM metrics WHERE job_id = $1 AND kind = 'epoch'"
    " AND ty_json_valid(data)"
    " AND ty_json_type(data, '$.samples_per_sec') IN ('integer', 'real') AND ty_json_num(data, '$.samples_per_sec') > 0"
    " AND ty_json_type(data, '$.seconds') IN ('integer', 'real') AND ty_json_num(data, '$.seconds') > 0";

int exec_store_epoch_throughput(db *d, int64_t job_id, int *epochs, double *samples, double *seconds) {
    *epochs = 0;
    *samples = *seconds = 0;
    db_stmt *st = db_prepare2(d, SQL_EPOCH_THROUGHPUT, SQL_EPOCH_THROUGHPUT_PG);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, job_id);
    int rc = db_step(st);
    if (rc == DB_ROW) {
        *epochs = db_col_int(st, 0);
        *samples = db_col_double(st, 1);
        *seconds = db_col_double(st, 2);
    }
    db_done(st);
    return rc == DB_ROW ? STORE_OK : STORE_ERROR;
}

/* ---------------------------------------------------------------- logs */

static const char SQL_LOG_CHUNK[] =
    "INSERT INTO log_chunks(job_id, task, attempt, seq, \"offset\", length, ts)"
    " VALUES(?1, ?2, ?3, (SELECT coalesce(max(seq), 0) + 1 FROM log_chunks"
    "  WHERE job_id = ?1 AND task = ?2 AND attempt = ?3), ?4, ?5, ?6)";

static const char SQL_LOG_BYTES_ADD[] = "UPDATE jobs SET log_bytes = log_bytes + ?2 WHERE id = ?1";

int exec_store_logs_in_db(db *d) { return strcmp(db_engine(d), "postgres") == 0; }

/* Where the task's log ends (across its attempts: one log a task): the end
 * of its last chunk, found through log_chunks_at, not by reading them all
 * (a week of output a second is 600,000 chunks). */
#define LOG_END                                                                                         \
    "coalesce((SELECT \"offset\" + length FROM log_chunks WHERE job_id = ?1 AND task = ?2"                  \
    " ORDER BY \"offset\" DESC LIMIT 1), 0)"

/* the chunk at the end of the task's log */
static const char SQL_LOG_APPEND[] =
    "INSERT INTO log_chunks(job_id, task, attempt, seq, \"offset\", length, ts, data)"
    " VALUES(?1, ?2, ?3, (SELECT coalesce(max(seq), 0) + 1 FROM log_chunks"
    "  WHERE job_id = ?1 AND task = ?2 AND attempt = ?3),"
    " " LOG_END ", ?4, ?5, ?6) RETURNING \"offset\"";

/* A chunk and the job's log_bytes in one transaction (the team's storage
 * use is summed from log_bytes, so it never misses a chunk after a crash):
 * data NULL, a chunk of a file at offset; else its bytes at the log's end,
 * *offset set. */
static int log_chunk_write(db *d, int64_t job_id, const char *task, int attempt, int64_t *offset, int64_t length,
                           const void *data) {
    if (length <= 0 || length > INT32_MAX) return STORE_ERROR;
    if (db_begin(d) < 0) return STORE_ERROR;
    db_stmt *st = db_prepare(d, data ? SQL_LOG_APPEND : SQL_LOG_CHUNK);
    int rc = STORE_ERROR;
    if (st) {
        db_bind_int64(st, 1, job_id);
        db_bind_text(st, 2, task, -1);
        db_bind_int(st, 3, attempt);
        if (data) {
            db_bind_int64(st, 4, length);
            db_bind_int64(st, 5, now_ms());
            db_bind_blob(st, 6, data, (int)length);
            if (db_step(st) == DB_ROW) {
                *offset = db_col_int64(st, 0);
                rc = db_step(st) == DB_DONE ? STORE_OK : STORE_ERROR;
            }
            db_done(st);
        } else {
            db_bind_int64(st, 4, *offset);
            db_bind_int64(st, 5, length);
            db_bind_int64(st, 6, now_ms());
            rc = store_step_done(st);
        }
    }
    if (rc == STORE_OK) {
        st = db_prepare(d, SQL_LOG_BYTES_ADD);
        rc = STORE_ERROR;
        if (st) {
            db_bind_int64(st, 1, job_id);
            db_bind_int64(st, 2, length);
            rc = store_step_done(st);
        }
    }
    if (rc != STORE_OK || db_commit(d) < 0) {
        db_rollback(d);
        return STORE_ERROR;
    }
    return STORE_OK;
}

int exec_store_log_chunk_add(db *d, int64_t job_id, const char *task, int attempt, int64_t offset, int64_t length) {
    return log_chunk_write(d, job_id, task, attempt, &offset, length, NULL);
}

int exec_store_log_append(db *d, int64_t job_id, const char *task, int attempt, const void *data, int64_t len,
                          int64_t *offset) {
    return data ? log_chunk_write(d, job_id, task, attempt, offset, len, data) : STORE_ERROR;
}

/* One number of a job's logs (of one task's when task is not NULL). */
static int log_number(db *d, const char *sql, int64_t job_id, const char *task, int64_t *out) {
    *out = 0;
    db_stmt *st = db_prepare(d, sql);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, job_id);
    if (task) db_bind_text(st, 2, task, -1);
    int rc = db_step(st);
    if (rc == DB_ROW) *out = db_col_int64(st, 0);
    db_done(st);
    return rc == DB_ROW ? STORE_OK : STORE_ERROR;
}

static const char SQL_LOG_DB_BYTES[] =
    "SELECT coalesce(sum(length), 0) FROM log_chunks WHERE job_id = ?1 AND data IS NOT NULL";
static const char SQL_LOG_END[] = "SELECT " LOG_END;

int exec_store_log_db_bytes(db *d, int64_t job_id, int64_t *bytes) {
    return log_number(d, SQL_LOG_DB_BYTES, job_id, NULL, bytes);
}

int exec_store_log_end(db *d, int64_t job_id, const char *task, int64_t *end) {
    return log_number(d, SQL_LOG_END, job_id, task, end);
}

/* The chunks from the one holding byte ?3 (the last to begin at or before
 * it) up to ?3 + ?4: a range of log_chunks_at. */
static const char SQL_LOG_READ[] =
    "SELECT \"offset\", length, data IS NULL, data FROM log_chunks"
    " WHERE job_id = ?1 AND task = ?2 AND \"offset\" < ?3 + ?4 AND \"offset\" >= coalesce((SELECT \"offset\""
    "  FROM log_chunks WHERE job_id = ?1 AND task = ?2 AND \"offset\" <= ?3 ORDER BY \"offset\" DESC LIMIT 1), 0)"
    " AND \"offset\" + length > ?3 ORDER BY \"offset\", id";

int exec_store_log_read(db *d, int64_t job_id, const char *task, int64_t since, int64_t limit, buf *out) {
    db_stmt *st = db_prepare(d, SQL_LOG_READ);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, job_id);
    db_bind_text(st, 2, task, -1);
    db_bind_int64(st, 3, since);
    db_bind_int64(st, 4, limit);
    int64_t at = since, end = since + limit;
    int rc, ret = STORE_OK;
    while ((rc = db_step(st)) == DB_ROW && at < end) {
        int64_t off = db_col_int64(st, 0), len = db_col_int64(st, 1);
        if (db_col_int(st, 2)) { ret = STORE_NOT_FOUND; break; } /* in a file */
        if (off + len <= at) continue;                            /* read already */
        if (off > at) break;                                      /* a gap: never written */
        int nb = db_col_bytes(st, 3);               /* then the blob, as SQLite wants them */
        const unsigned char *b = db_col_blob(st, 3);
        if (!b || nb != len) { ret = STORE_ERROR; break; }
        int64_t from = at - off, n = len - from;
        if (n > end - at) n = end - at;
        if (buf_append(out, b + from, (size_t)n) < 0) { ret = STORE_ERROR; break; }
        at += n;
    }
    if (rc != DB_ROW && rc != DB_DONE) ret = STORE_ERROR;
    db_done(st);
    return ret;
}

static const char SQL_LOG_STATE[] =
    "SELECT log_bytes, CASE WHEN json_valid(spec) THEN json_extract(spec, '$.logs.max_size') END"
    " FROM jobs WHERE id = ?";
static const char SQL_LOG_STATE_PG[] =
    "SELECT log_bytes, CASE WHEN ty_json_valid(spec) THEN ty_json_text(spec, '$.logs.max_size') END"
    " FROM jobs WHERE id = $1";

int exec_store_job_log_state(db *d, int64_t job_id, int64_t *log_bytes, char *max_size, size_t cap) {
    *log_bytes = 0;
    if (cap) max_size[0] = '\0';
    db_stmt *st = db_prepare2(d, SQL_LOG_STATE, SQL_LOG_STATE_PG);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, job_id);
    int rc = db_step(st);
    if (rc == DB_ROW) {
        *log_bytes = db_col_int64(st, 0);
        /* a size as written: "2GiB", or an integer of bytes (its decimal text reads back the same) */
        int ty = db_col_type(st, 1);
        if (ty == DB_TEXT || ty == DB_INTEGER) col_copy(st, 1, max_size, cap);
    }
    db_done(st);
    return rc == DB_ROW ? STORE_OK : rc == DB_DONE ? STORE_NOT_FOUND : STORE_ERROR;
}

/* ---------------------------------------------------------------- checkpoints */

static const char SQL_CKPT_RESERVE[] =
    "INSERT INTO checkpoints(job_id, attempt, step, epoch, size, sha256, path, created_at, deleted_at)"
    " VALUES(?1, ?2, ?3, ?4, ?5, ?6, '', ?7, ?7) RETURNING id";
static const char SQL_CKPT_PUBLISH[] =
    "UPDATE checkpoints SET path = ?2, store = ?4, deleted_at = NULL, created_at = ?3 WHERE id = ?1";
static const char SQL_CKPT_DISCARD[] = "DELETE FROM checkpoints WHERE id = ?";

int exec_store_ckpt_reserve(db *d, int64_t job_id, int attempt, int64_t step, int64_t epoch, int64_t size,
                            const char *sha256, int64_t *id_out) {
    db_stmt *st = db_prepare(d, SQL_CKPT_RESERVE);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, job_id);
    db_bind_int(st, 2, attempt);
    db_bind_int64(st, 3, step);
    db_bind_int64(st, 4, epoch);
    db_bind_int64(st, 5, size);
    db_bind_text(st, 6, sha256, -1);
    db_bind_int64(st, 7, now_ms());
    return store_step_id(st, id_out) == STORE_OK ? STORE_OK : STORE_ERROR;
}

int exec_store_ckpt_publish(db *d, int64_t id, const char *store, const char *path) {
    db_stmt *st = db_prepare(d, SQL_CKPT_PUBLISH);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, id);
    db_bind_text(st, 2, path, -1);
    db_bind_int64(st, 3, now_ms());
    db_bind_text(st, 4, store ? store : "", -1);
    return update_one(d, st) == STORE_OK ? STORE_OK : STORE_ERROR;
}

int exec_store_ckpt_discard(db *d, int64_t id) {
    db_stmt *st = db_prepare(d, SQL_CKPT_DISCARD);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, id);
    return store_step_done(st);
}

#define CKPT_COLS "id, attempt, step, epoch, size, sha256, path, created_at, store"

static const char SQL_CKPT_GET[] =
    "SELECT " CKPT_COLS " FROM checkpoints WHERE job_id = ?1 AND deleted_at IS NULL"
    " AND (?2 = 0 OR id = ?2) ORDER BY id DESC LIMIT 1";
static const char SQL_CKPT_LIST[] =
    "SELECT " CKPT_COLS " FROM checkpoints WHERE job_id = ? AND deleted_at IS NULL ORDER BY id DESC";

static void ckpt_row(db_stmt *st, exec_ckpt *c) {
    memset(c, 0, sizeof *c);
    c->id = db_col_int64(st, 0);
    c->attempt = db_col_int(st, 1);
    c->step = db_col_int64(st, 2);
    c->epoch = db_col_int64(st, 3);
    c->size = db_col_int64(st, 4);
    col_copy(st, 5, c->sha256, sizeof c->sha256);
    col_copy(st, 6, c->path, sizeof c->path);
    col_copy(st, 8, c->store, sizeof c->store);
}

int exec_store_ckpt_get(db *d, int64_t job_id, int64_t cid, exec_ckpt *out) {
    db_stmt *st = db_prepare(d, SQL_CKPT_GET);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, job_id);
    db_bind_int64(st, 2, cid);
    int rc = db_step(st);
    if (rc == DB_ROW) ckpt_row(st, out);
    db_done(st);
    return rc == DB_ROW ? STORE_OK : rc == DB_DONE ? STORE_NOT_FOUND : STORE_ERROR;
}

int exec_store_ckpt_list(db *d, int64_t job_id, cJSON **out) {
    db_stmt *st = db_prepare(d, SQL_CKPT_LIST);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, job_id);
    cJSON *arr = cJSON_CreateArray();
    int rc;
    while ((rc = db_step(st)) == DB_ROW) {
        exec_ckpt c;
        ckpt_row(st, &c);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "id", (double)c.id);
        cJSON_AddNumberToObject(o, "step", (double)c.step);
        cJSON_AddNumberToObject(o, "epoch", (double)c.epoch);
        cJSON_AddNumberToObject(o, "size", (double)c.size);
        cJSON_AddStringToObject(o, "sha256", c.sha256);
        store_json_time(o, "created_at", st, 7);
        cJSON_AddNumberToObject(o, "attempt", c.attempt);
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

static const char SQL_CKPT_BEYOND[] =
    "SELECT id, path, store, size FROM checkpoints WHERE job_id = ? AND deleted_at IS NULL"
    " ORDER BY id DESC LIMIT 9223372036854775807 OFFSET ?"; /* no limit, in words both engines take */
static const char SQL_CKPT_HIDE[] = "UPDATE checkpoints SET deleted_at = ? WHERE id = ?";

int exec_store_ckpt_prune(db *d, int64_t job_id, int keep, ckpt_ref *refs, int max, int *n) {
    *n = 0;
    int64_t ids[64];
    int nids = 0;
    db_stmt *st = db_prepare(d, SQL_CKPT_BEYOND);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, job_id);
    db_bind_int(st, 2, keep);
    int rc;
    while ((rc = db_step(st)) == DB_ROW) {
        if (nids >= (int)(sizeof ids / sizeof ids[0]) || nids >= max) continue; /* the rest next time */
        ids[nids] = db_col_int64(st, 0);
        col_copy(st, 1, refs[nids].path, sizeof refs[nids].path);
        col_copy(st, 2, refs[nids].store, sizeof refs[nids].store);
        refs[nids].size = db_col_int64(st, 3);
        nids++;
    }
    db_done(st);
    if (rc != DB_DONE) return STORE_ERROR;
    for (int i = 0; i < nids; i++) {
        st = db_prepare(d, SQL_CKPT_HIDE);
        if (!st) return STORE_ERROR;
        db_bind_int64(st, 1, now_ms());
        db_bind_int64(st, 2, ids[i]);
        if (store_step_done(st) != STORE_OK) return STORE_ERROR;
    }
    *n = nids;
    return STORE_OK;
}

/* ---------------------------------------------------------------- rendezvous */

static const char SQL_RDV_PUT[] =
    "INSERT INTO rendezvous(job_id, attempt, key, value) VALUES(?1, ?2, ?3, ?4)"
    " ON CONFLICT(job_id, attempt, key) DO UPDATE SET value = excluded.value";
static const char SQL_RDV_GET[] = "SELECT value FROM rendezvous WHERE job_id = ? AND attempt = ? AND key = ?";

int exec_store_rdv_put(db *d, int64_t job_id, int attempt, const char *key, const char *value, size_t len) {
    db_stmt *st = db_prepare(d, SQL_RDV_PUT);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, job_id);
    db_bind_int(st, 2, attempt);
    db_bind_text(st, 3, key, -1);
    db_bind_text(st, 4, value, (int)len);
    return store_step_done(st);
}

int exec_store_rdv_get(db *d, int64_t job_id, int attempt, const char *key, char **value, size_t *len) {
    *value = NULL;
    *len = 0;
    db_stmt *st = db_prepare(d, SQL_RDV_GET);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, job_id);
    db_bind_int(st, 2, attempt);
    db_bind_text(st, 3, key, -1);
    int rc = db_step(st);
    if (rc == DB_ROW) {
        const char *v = db_col_text(st, 0);
        int n = db_col_bytes(st, 0);
        *value = xstrndup(v ? v : "", (size_t)n);
        *len = (size_t)n;
    }
    db_done(st);
    return rc == DB_ROW ? STORE_OK : rc == DB_DONE ? STORE_NOT_FOUND : STORE_ERROR;
}
