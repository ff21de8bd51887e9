/* retention.c - the rows of deletion, log retention and checkpoint
 * collection (retention.h has the contract). Every write that belongs
 * together is one transaction, committed before any file goes. */
#include "retention.h"
#include "../common/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TERMINAL "('succeeded','failed','cancelled')"

/* Runs one statement binding (job_id, now) as ?1, ?2 (a statement without
 * ?2 refuses the second binding, harmlessly). */
static int exec_job_stmt(db *d, const char *sql, int64_t job_id, int64_t now) {
    db_stmt *st = db_prepare(d, sql);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, job_id);
    (void)db_bind_int64(st, 2, now);
    return store_step_done(st);
}

/* ---------------------------------------------------------------- delete */

static const char SQL_DEL_JOB[] =
    "SELECT state, team_id, (SELECT count(*) FROM tasks t WHERE t.job_id = j.id AND t.state != 'exited')"
    " FROM jobs j WHERE id = ?1 AND deleted_at IS NULL";
static const char SQL_DEL_SET[] = "UPDATE jobs SET deleted_at = ?2, updated_at = ?2 WHERE id = ?1 AND deleted_at IS NULL";
static const char SQL_DEL_CKPTS[] = "UPDATE checkpoints SET deleted_at = ?2 WHERE job_id = ?1 AND deleted_at IS NULL";
static const char SQL_DEL_LOGS[] = "DELETE FROM log_chunks WHERE job_id = ?1";
static const char SQL_DEL_METRICS[] = "DELETE FROM metrics WHERE job_id = ?1";
static const char SQL_DEL_EVAL[] = "DELETE FROM eval_metrics WHERE job_id = ?1";
static const char SQL_DEL_RDV[] = "DELETE FROM rendezvous WHERE job_id = ?1";

int retention_job_delete_mark(db *d, int64_t job_id, int64_t team_id, int64_t now, const char *actor, char state[16],
                              int *live_tasks) {
    state[0] = '\0';
    *live_tasks = 0;
    if (db_begin(d) < 0) return STORE_ERROR;
    db_stmt *st = db_prepare(d, SQL_DEL_JOB);
    if (!st) {
        db_rollback(d);
        return STORE_ERROR;
    }
    db_bind_int64(st, 1, job_id);
    int rc = db_step(st);
    int ret = rc == DB_ROW ? STORE_OK : rc == DB_DONE ? STORE_NOT_FOUND : STORE_ERROR;
    if (ret == STORE_OK) {
        const char *s = db_col_text(st, 0);
        snprintf(state, 16, "%s", s ? s : "");
        if (team_id && db_col_int64(st, 1) != team_id) ret = STORE_NOT_FOUND;
        *live_tasks = db_col_int(st, 2);
    }
    db_done(st);
    if (ret == STORE_OK && (!store_is_terminal(state) || *live_tasks > 0)) ret = STORE_CONFLICT;
    /* the job first: whatever the API lists goes with it in this commit */
    if (ret == STORE_OK) ret = exec_job_stmt(d, SQL_DEL_SET, job_id, now);
    if (ret == STORE_OK) ret = exec_job_stmt(d, SQL_DEL_CKPTS, job_id, now);
    if (ret == STORE_OK) ret = exec_job_stmt(d, SQL_DEL_LOGS, job_id, now);
    if (ret == STORE_OK) ret = exec_job_stmt(d, SQL_DEL_METRICS, job_id, now);
    if (ret == STORE_OK) ret = exec_job_stmt(d, SQL_DEL_EVAL, job_id, now);
    if (ret == STORE_OK) ret = exec_job_stmt(d, SQL_DEL_RDV, job_id, now);
    /* the audit log keeps who deleted it */
    if (ret == STORE_OK) ret = store_event_add(d, job_id, "deleted", actor, "its logs, checkpoints and metrics removed");
    if (ret != STORE_OK) {
        db_rollback(d);
        return ret;
    }
    if (db_commit(d) < 0) {
        db_rollback(d);
        return STORE_ERROR;
    }
    return STORE_OK;
}

/* ---------------------------------------------------------------- the pass */

/* jobs_finished (migration 12) walks finished jobs in (finished_at, id)
 * order, so a pass reads only the page after its cursor. */
static const char SQL_SCAN[] =
    "SELECT j.id, j.finished_at,"
    " (SELECT count(*) FROM tasks t WHERE t.job_id = j.id AND t.state != 'exited'),"
    " j.logs_purged_at IS NOT NULL,"
    " EXISTS(SELECT 1 FROM log_chunks l WHERE l.job_id = j.id),"
    " (SELECT count(*) FROM checkpoints c WHERE c.job_id = j.id AND c.deleted_at IS NULL)"
    " FROM jobs j WHERE j.finished_at IS NOT NULL AND (j.finished_at > ?1 OR (j.finished_at = ?1 AND j.id > ?2))"
    " AND j.finished_at < ?3 AND j.state IN " TERMINAL " AND j.deleted_at IS NULL"
    " ORDER BY j.finished_at, j.id LIMIT ?4";

int retention_scan(db *d, int64_t after_finished, int64_t after_id, int64_t until, retention_job *out, int max,
                   int *n) {
    *n = 0;
    db_stmt *st = db_prepare(d, SQL_SCAN);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, after_finished);
    db_bind_int64(st, 2, after_id);
    db_bind_int64(st, 3, until);
    db_bind_int(st, 4, max);
    int rc;
    while ((rc = db_step(st)) == DB_ROW && *n < max) {
        retention_job *j = &out[(*n)++];
        j->id = db_col_int64(st, 0);
        j->finished_at = db_col_int64(st, 1);
        j->live_tasks = db_col_int(st, 2);
        j->logs_purged = db_col_int(st, 3);
        j->has_log_rows = db_col_int(st, 4);
        j->checkpoints = db_col_int(st, 5);
    }
    db_done(st);
    return rc == DB_DONE || rc == DB_ROW ? STORE_OK : STORE_ERROR;
}

/* ---------------------------------------------------------------- logs */

static const char SQL_LOGS_SET[] =
    "UPDATE jobs SET logs_purged_at = ?2, log_bytes = 0 WHERE id = ?1 AND logs_purged_at IS NULL"
    " AND deleted_at IS NULL";
static const char SQL_LOGS_STATE[] = "SELECT coalesce(logs_purged_at, 0), coalesce(finished_at, 0) FROM jobs WHERE id = ?";

int retention_logs_mark(db *d, int64_t job_id, int64_t now) {
    if (db_begin(d) < 0) return STORE_ERROR;
    int ret = exec_job_stmt(d, SQL_LOGS_SET, job_id, now);
    if (ret == STORE_OK && db_changes(d) != 1) ret = STORE_NOT_FOUND;
    if (ret == STORE_OK) ret = exec_job_stmt(d, SQL_DEL_LOGS, job_id, now);
    if (ret != STORE_OK) {
        db_rollback(d);
        return ret;
    }
    if (db_commit(d) < 0) {
        db_rollback(d);
        return STORE_ERROR;
    }
    return STORE_OK;
}

int retention_logs_state(db *d, int64_t job_id, int64_t *purged_at, int64_t *finished_at) {
    *purged_at = *finished_at = 0;
    db_stmt *st = db_prepare(d, SQL_LOGS_STATE);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, job_id);
    int rc = db_step(st);
    if (rc == DB_ROW) {
        *purged_at = db_col_int64(st, 0);
        *finished_at = db_col_int64(st, 1);
    }
    db_done(st);
    return rc == DB_ROW ? STORE_OK : rc == DB_DONE ? STORE_NOT_FOUND : STORE_ERROR;
}

/* ---------------------------------------------------------------- checkpoints */

/* The job's visible checkpoints, then the reports of the metric (?2: its
 * JSON path) at their steps or epochs: the chief's (src 0) and the
 * evaluator's (src 1). One pass over the job's metrics (their primary key
 * starts with job_id); the matching is done here. */
static const char SQL_CKPT_STEPS[] =
    "SELECT id, step, epoch FROM checkpoints WHERE job_id = ?1 AND deleted_at IS NULL ORDER BY id DESC LIMIT 1000";
static const char SQL_CKPT_VALUES[] =
    "WITH c AS (SELECT step, epoch FROM checkpoints WHERE job_id = ?1 AND deleted_at IS NULL)"
    " SELECT src, seq, step, epoch, v FROM ("
    "  SELECT 0 AS src, seq, step, epoch, json_extract(data, ?2) AS v FROM metrics"
    "   WHERE job_id = ?1 AND (step IN (SELECT step FROM c) OR epoch IN (SELECT epoch FROM c))"
    "  UNION ALL"
    "  SELECT 1, seq, step, epoch, json_extract(data, ?2) FROM eval_metrics"
    "   WHERE job_id = ?1 AND (step IN (SELECT step FROM c) OR epoch IN (SELECT epoch FROM c)))"
    " WHERE typeof(v) IN ('integer','real')";
static const char SQL_CKPT_VALUES_PG[] =
    "WITH c AS (SELECT step, epoch FROM checkpoints WHERE job_id = $1 AND deleted_at IS NULL)"
    " SELECT src, seq, step, epoch, v FROM ("
    "  SELECT 0 AS src, seq, step, epoch, ty_json_num(data, $2::text) AS v FROM metrics"
    "   WHERE job_id = $1 AND (step IN (SELECT step FROM c) OR epoch IN (SELECT epoch FROM c))"
    "   AND ty_json_type(data, $2::text) IN ('integer','real')"
    "  UNION ALL"
    "  SELECT 1, seq, step, epoch, ty_json_num(data, $2::text) FROM eval_metrics"
    "   WHERE job_id = $1 AND (step IN (SELECT step FROM c) OR epoch IN (SELECT epoch FROM c))"
    "   AND ty_json_type(data, $2::text) IN ('integer','real')) AS m";

typedef struct ckpt_val {
    int64_t id, step, epoch;
    int rank;                     /* 0 best: at its step from the chief, 1 the evaluator; 2, 3 at its epoch; 4 none */
    int64_t seq;                  /* the report's seq within its rank: the newest wins */
    double v;
} ckpt_val;

int retention_ckpt_best(db *d, int64_t job_id, const char *metric, int best_max, int64_t *best_id, double *value) {
    *best_id = 0;
    *value = 0;
    /* the name is letters, digits, '_', '.', '-' (spec/jobspec.c): quoted, a
     * '.' in it is part of the key, not a path step */
    char path[96];
    if (strchr(metric, '"') || sfmt(path, sizeof path, "$.\"%s\"", metric) < 0) return STORE_ERROR;
    db_stmt *st = db_prepare(d, SQL_CKPT_STEPS);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, job_id);
    int n = 0, cap = 16, rc;
    ckpt_val *c = xmalloc((size_t)cap * sizeof *c);
    while ((rc = db_step(st)) == DB_ROW) {
        if (n == cap) c = xrealloc(c, (size_t)(cap *= 2) * sizeof *c);
        c[n] = (ckpt_val){db_col_int64(st, 0), db_col_int64(st, 1), db_col_int64(st, 2), 4,
                          0, 0};
        n++;
    }
    db_done(st);
    if (rc != DB_DONE || n == 0) {
        free(c);
        return rc == DB_DONE ? STORE_OK : STORE_ERROR;
    }
    st = db_prepare2(d, SQL_CKPT_VALUES, SQL_CKPT_VALUES_PG);
    if (!st) {
        free(c);
        return STORE_ERROR;
    }
    db_bind_int64(st, 1, job_id);
    db_bind_text(st, 2, path, -1);
    while ((rc = db_step(st)) == DB_ROW) {
        int src = db_col_int(st, 0);
        int64_t seq = db_col_int64(st, 1);
        int has_step = db_col_type(st, 2) != DB_NULL, has_epoch = db_col_type(st, 3) != DB_NULL;
        int64_t step = db_col_int64(st, 2), epoch = db_col_int64(st, 3);
        double v = db_col_double(st, 4);
        for (int i = 0; i < n; i++) {
            int rank = has_step && step == c[i].step ? src : has_epoch && epoch == c[i].epoch ? 2 + src : 4;
            if (rank < c[i].rank || (rank == c[i].rank && rank < 4 && seq > c[i].seq)) {
                c[i].rank = rank;
                c[i].seq = seq;
                c[i].v = v;
            }
        }
    }
    db_done(st);
    if (rc != DB_DONE) {
        free(c);
        return STORE_ERROR;
    }
    /* newest first: an older one replaces the best only when strictly better */
    for (int i = 0; i < n; i++) {
        if (c[i].rank == 4) continue;
        if (!*best_id || (best_max ? c[i].v > *value : c[i].v < *value)) {
            *best_id = c[i].id;
            *value = c[i].v;
        }
    }
    free(c);
    return STORE_OK;
}

static const char SQL_CKPT_NEWEST[] =
    "SELECT coalesce(max(id), 0) FROM checkpoints WHERE job_id = ?1 AND deleted_at IS NULL";
static const char SQL_CKPT_REST[] =
    "SELECT id, path, size, store FROM checkpoints WHERE job_id = ?1 AND deleted_at IS NULL AND id != ?2 AND id != ?3"
    " ORDER BY id LIMIT ?4";
static const char SQL_CKPT_HIDE_ONE[] = "UPDATE checkpoints SET deleted_at = ?2 WHERE id = ?1";

int retention_ckpt_collect_mark(db *d, int64_t job_id, int64_t keep_id, int64_t now, ckpt_ref *refs, int max,
                                int *n, int64_t *newest_id) {
    *n = 0;
    *newest_id = 0;
    if (max > 256) max = 256;
    int64_t ids[256];
    if (db_begin(d) < 0) return STORE_ERROR;
    int ret = STORE_ERROR;
    db_stmt *st = db_prepare(d, SQL_CKPT_NEWEST);
    if (!st) goto fail;
    db_bind_int64(st, 1, job_id);
    if (db_step(st) != DB_ROW) {
        db_done(st);
        goto fail;
    }
    *newest_id = db_col_int64(st, 0);
    db_done(st);
    st = db_prepare(d, SQL_CKPT_REST);
    if (!st) goto fail;
    db_bind_int64(st, 1, job_id);
    db_bind_int64(st, 2, *newest_id);
    db_bind_int64(st, 3, keep_id);
    db_bind_int(st, 4, max);
    int rc;
    int k = 0;
    while ((rc = db_step(st)) == DB_ROW && k < max) {
        ids[k] = db_col_int64(st, 0);
        const char *p = db_col_text(st, 1);
        const char *s = db_col_text(st, 3);
        snprintf(refs[k].path, sizeof refs[k].path, "%s", p ? p : "");
        snprintf(refs[k].store, sizeof refs[k].store, "%s", s ? s : "");
        refs[k].size = db_col_int64(st, 2);
        k++;
    }
    db_done(st);
    if (rc != DB_DONE && rc != DB_ROW) goto fail;
    for (int i = 0; i < k; i++)
        if (exec_job_stmt(d, SQL_CKPT_HIDE_ONE, ids[i], now) != STORE_OK) goto fail;
    if (db_commit(d) < 0) goto fail;
    *n = k;
    return STORE_OK;
fail:
    db_rollback(d);
    return ret;
}

/* ---------------------------------------------------------------- sweeps */

static const char SQL_SWEEP_JOBS[] =
    "SELECT id, deleted_at IS NOT NULL FROM jobs WHERE id > ?1 AND id <= ?1 + ?2"
    " AND (deleted_at IS NOT NULL OR logs_purged_at IS NOT NULL) ORDER BY id LIMIT ?3";
static const char SQL_SWEEP_JOBS_MORE[] = "SELECT EXISTS(SELECT 1 FROM jobs WHERE id > ?1 + ?2)";
static const char SQL_SWEEP_CKPTS[] =
    "SELECT path, store, size FROM checkpoints WHERE id > ?1 AND id <= ?1 + ?2 AND deleted_at IS NOT NULL AND path != ''"
    " ORDER BY id LIMIT ?3";
static const char SQL_SWEEP_CKPTS_MORE[] = "SELECT EXISTS(SELECT 1 FROM checkpoints WHERE id > ?1 + ?2)";

static int more_after(db *d, const char *sql, int64_t after_id, int64_t span, int *more) {
    db_stmt *st = db_prepare(d, sql);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, after_id);
    db_bind_int64(st, 2, span);
    int rc = db_step(st);
    if (rc == DB_ROW) *more = db_col_int(st, 0);
    db_done(st);
    return rc == DB_ROW ? STORE_OK : STORE_ERROR;
}

int retention_sweep_jobs(db *d, int64_t after_id, int64_t span, int64_t *ids, int *deleted, int max, int *n,
                         int *more) {
    *n = 0;
    *more = 0;
    db_stmt *st = db_prepare(d, SQL_SWEEP_JOBS);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, after_id);
    db_bind_int64(st, 2, span);
    db_bind_int(st, 3, max);
    int rc;
    while ((rc = db_step(st)) == DB_ROW && *n < max) {
        ids[*n] = db_col_int64(st, 0);
        deleted[*n] = db_col_int(st, 1);
        (*n)++;
    }
    db_done(st);
    if (rc != DB_DONE && rc != DB_ROW) return STORE_ERROR;
    return more_after(d, SQL_SWEEP_JOBS_MORE, after_id, span, more);
}

int retention_sweep_ckpts(db *d, int64_t after_id, int64_t span, ckpt_ref *refs, int max, int *n, int *more) {
    *n = 0;
    *more = 0;
    db_stmt *st = db_prepare(d, SQL_SWEEP_CKPTS);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, after_id);
    db_bind_int64(st, 2, span);
    db_bind_int(st, 3, max);
    int rc;
    while ((rc = db_step(st)) == DB_ROW && *n < max) {
        const char *p = db_col_text(st, 0);
        const char *s = db_col_text(st, 1);
        snprintf(refs[*n].path, sizeof refs[*n].path, "%s", p ? p : "");
        snprintf(refs[*n].store, sizeof refs[*n].store, "%s", s ? s : "");
        refs[*n].size = db_col_int64(st, 2);
        (*n)++;
    }
    db_done(st);
    if (rc != DB_DONE && rc != DB_ROW) return STORE_ERROR;
    return more_after(d, SQL_SWEEP_CKPTS_MORE, after_id, span, more);
}

static const char SQL_CKPT_GONE[] =
    "UPDATE checkpoints SET path = '' WHERE store = ?1 AND path = ?2 AND deleted_at IS NOT NULL";

int retention_ckpt_gone(db *d, const char *store, const char *path) {
    db_stmt *st = db_prepare(d, SQL_CKPT_GONE);
    if (!st) return STORE_ERROR;
    db_bind_text(st, 1, store, -1);
    db_bind_text(st, 2, path, -1);
    return store_step_done(st);
}
