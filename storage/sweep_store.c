/* sweep_store.c - the rows of hyperparameter sweeps (sweep_store.h has the
 * contract). Each controller step is one transaction: a trial's job and
 * the trial's row together, a trial's end and its rung row together, a
 * promotion's rung mark, trial and requeued job together. */
#include "sweep_store.h"
#include "../common/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *col_dup(db_stmt *st, int c) {
    const char *t = db_col_text(st, c);
    return t ? xstrdup(t) : NULL;
}

static void col_copy(db_stmt *st, int c, char *out, size_t cap) {
    const char *t = db_col_text(st, c);
    snprintf(out, cap, "%s", t ? t : "");
}

/* A transaction's end: commit when rc is STORE_OK, else roll back. */
static int finish_tx(db *d, int rc) {
    if (rc != STORE_OK) {
        db_rollback(d);
        return rc;
    }
    return db_commit(d) < 0 ? STORE_ERROR : STORE_OK;
}

void sweep_info_release(sweep_info *s) {
    if (!s) return;
    free(s->spec);
    free(s->reason);
    s->spec = s->reason = NULL;
}

void sweep_trials_release(sweep_trial_row *t, int n) {
    if (!t) return;
    for (int i = 0; i < n; i++) {
        free(t[i].params);
        free(t[i].reason);
        free(t[i].job_reason);
    }
    free(t);
}

/* ---------------------------------------------------------------- create */

static const char SQL_SWEEP_INSERT[] =
    "INSERT INTO sweeps(team_id, name, spec, state, created_at, updated_at, user_id)"
    " VALUES(?1, ?2, ?3, 'running', ?4, ?4, ?5) RETURNING id";
static const char SQL_TRIAL_INSERT[] =
    "INSERT INTO sweep_trials(sweep_id, trial, params, state, updated_at) VALUES(?1, ?2, ?3, 'pending', ?4)";

/* Keys live a day, as POST /jobs's (storage/store.c): a client retries
 * within seconds or minutes. */
#define SWEEP_KEY_TTL_MS (24LL * 3600 * 1000)
static const char SQL_SWEEP_KEY_PRUNE[] = "DELETE FROM sweep_keys WHERE team_id = ?1 AND created_at < ?2";
static const char SQL_SWEEP_KEY_FIND[] =
    "SELECT sweep_id, CASE WHEN request_sha256 = ?3 THEN 1 ELSE 0 END FROM sweep_keys"
    " WHERE team_id = ?1 AND idem_key = ?2 AND created_at >= ?4";
/* ON CONFLICT DO NOTHING: a key taken meanwhile is no row back, not an
 * error that would abort a PostgreSQL transaction (docs/postgres.md) */
static const char SQL_SWEEP_KEY_ADD[] =
    "INSERT INTO sweep_keys(team_id, idem_key, sweep_id, request_sha256, created_at) VALUES(?1, ?2, ?3, ?4, ?5)"
    " ON CONFLICT DO NOTHING RETURNING sweep_id";

/* The team's key seen within its day: STORE_EXPIRED (the same request) or
 * STORE_CONFLICT (another) with *first, STORE_NOT_FOUND when none, or
 * STORE_ERROR. */
static int sweep_key_find(db *d, int64_t team_id, const char *key, const char *sha, int64_t now, int64_t *first) {
    db_stmt *st = db_prepare(d, SQL_SWEEP_KEY_FIND);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, team_id);
    db_bind_text(st, 2, key, -1);
    db_bind_text(st, 3, sha, -1);
    db_bind_int64(st, 4, now - SWEEP_KEY_TTL_MS);
    int rc = db_step(st), same = 0;
    if (rc == DB_ROW) {
        *first = db_col_int64(st, 0);
        same = db_col_int(st, 1);
    }
    db_done(st);
    if (rc == DB_ROW) return same ? STORE_EXPIRED : STORE_CONFLICT;
    return rc == DB_DONE ? STORE_NOT_FOUND : STORE_ERROR;
}

/* Inside the transaction, before the insert: the team's keys past their
 * day go, then the key looked up (as sweep_key_find). */
static int sweep_key_check(db *d, int64_t team_id, const char *key, const char *sha, int64_t now, int64_t *first) {
    db_stmt *st = db_prepare(d, SQL_SWEEP_KEY_PRUNE);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, team_id);
    db_bind_int64(st, 2, now - SWEEP_KEY_TTL_MS);
    if (store_step_done(st) != STORE_OK) return STORE_ERROR;
    return sweep_key_find(d, team_id, key, sha, now, first);
}

static int sweep_key_add(db *d, int64_t team_id, const char *key, const char *sha, int64_t sweep_id, int64_t now) {
    db_stmt *st = db_prepare(d, SQL_SWEEP_KEY_ADD);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, team_id);
    db_bind_text(st, 2, key, -1);
    db_bind_int64(st, 3, sweep_id);
    db_bind_text(st, 4, sha, -1);
    db_bind_int64(st, 5, now);
    return store_step_id(st, NULL);
}

int sweep_store_create(db *d, int64_t team_id, int64_t user_id, const char *name, const char *spec_json, int n,
                       char *const *params, const char *idem_key, const char *request_sha256, int64_t *id_out) {
    if (idem_key && !request_sha256) return STORE_ERROR;
    if (db_begin(d) < 0) return STORE_ERROR;
    int64_t now = now_ms();
    if (idem_key) {
        int64_t first = 0;
        int k = sweep_key_check(d, team_id, idem_key, request_sha256, now, &first);
        if (k == STORE_EXPIRED || k == STORE_CONFLICT) { /* a replay: nothing made (the prune is kept) */
            if (finish_tx(d, STORE_OK) != STORE_OK) return STORE_ERROR;
            *id_out = first;
            return k;
        }
        if (k != STORE_NOT_FOUND) return finish_tx(d, STORE_ERROR);
    }
    db_stmt *st = db_prepare(d, SQL_SWEEP_INSERT);
    if (!st) return finish_tx(d, STORE_ERROR);
    db_bind_int64(st, 1, team_id);
    db_bind_text(st, 2, name, -1);
    db_bind_text(st, 3, spec_json, -1);
    db_bind_int64(st, 4, now);
    if (user_id > 0) db_bind_int64(st, 5, user_id);
    int64_t id = 0;
    if (store_step_id(st, &id) != STORE_OK) return finish_tx(d, STORE_ERROR);
    for (int i = 0; i < n; i++) {
        st = db_prepare(d, SQL_TRIAL_INSERT);
        if (!st) return finish_tx(d, STORE_ERROR);
        db_bind_int64(st, 1, id);
        db_bind_int(st, 2, i);
        db_bind_text(st, 3, params[i], -1);
        db_bind_int64(st, 4, now);
        if (store_step_done(st) != STORE_OK) return finish_tx(d, STORE_ERROR);
    }
    if (idem_key) {
        /* the key with the sweep, in its transaction: committed together or
         * not at all. Taken since the look-up above (another writer of the
         * same database: the write turn keeps this server's own requests
         * apart) the sweep is undone and the first one named. */
        int k = sweep_key_add(d, team_id, idem_key, request_sha256, id, now);
        if (k == STORE_CONFLICT) {
            db_rollback(d);
            int64_t first = 0;
            k = sweep_key_find(d, team_id, idem_key, request_sha256, now, &first);
            if (k != STORE_EXPIRED && k != STORE_CONFLICT) return STORE_ERROR;
            *id_out = first;
            return k;
        }
        if (k != STORE_OK) return finish_tx(d, STORE_ERROR);
    }
    int rc = finish_tx(d, STORE_OK);
    if (rc == STORE_OK) {
        db_note(d, "sweep %lld: %s created with %d trial%s", (long long)id, name, n, n == 1 ? "" : "s");
        *id_out = id;
    }
    return rc;
}

/* ---------------------------------------------------------------- read */

#define SWEEP_COLS                                                                                    \
    "s.id, s.team_id, s.name, t.name, s.state, s.spec, s.reason, s.created_at, s.updated_at,"        \
    " coalesce(s.finished_at, 0), (SELECT count(*) FROM sweep_trials x WHERE x.sweep_id = s.id),"       \
    " (SELECT name FROM users u WHERE u.id = s.user_id)"

static void sweep_row(db_stmt *st, sweep_info *o) {
    memset(o, 0, sizeof *o);
    o->id = db_col_int64(st, 0);
    o->team_id = db_col_int64(st, 1);
    col_copy(st, 2, o->name, sizeof o->name);
    col_copy(st, 3, o->team, sizeof o->team);
    col_copy(st, 4, o->state, sizeof o->state);
    o->spec = col_dup(st, 5);
    o->reason = col_dup(st, 6);
    o->created_at = db_col_int64(st, 7);
    o->updated_at = db_col_int64(st, 8);
    o->finished_at = db_col_int64(st, 9);
    o->trials = db_col_int(st, 10);
    col_copy(st, 11, o->user, sizeof o->user);
}

static const char SQL_SWEEP_GET[] = "SELECT " SWEEP_COLS " FROM sweeps s JOIN teams t ON t.id = s.team_id"
                                    " WHERE s.id = ?1 AND (?2 = 0 OR s.team_id = ?2)";

int sweep_store_get(db *d, int64_t id, int64_t team_id, sweep_info *out) {
    memset(out, 0, sizeof *out);
    db_stmt *st = db_prepare(d, SQL_SWEEP_GET);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, id);
    db_bind_int64(st, 2, team_id);
    int rc = db_step(st);
    if (rc == DB_ROW) sweep_row(st, out);
    db_done(st);
    return rc == DB_ROW ? STORE_OK : rc == DB_DONE ? STORE_NOT_FOUND : STORE_ERROR;
}

static const char SQL_SWEEP_LIST[] = "SELECT " SWEEP_COLS " FROM sweeps s JOIN teams t ON t.id = s.team_id"
                                     " WHERE (?1 = 0 OR s.team_id = ?1) AND (?2 = 0 OR s.id < ?2)"
                                     " AND (?4 IS NULL OR s.user_id = (SELECT id FROM users WHERE name = ?4))"
                                     " ORDER BY s.id DESC LIMIT ?3";

int sweep_store_list(db *d, int64_t team_id, const char *user, int64_t before, int max, sweep_info **out, int *n,
                     int64_t *next) {
    *out = NULL;
    *n = 0;
    *next = 0;
    db_stmt *st = db_prepare(d, SQL_SWEEP_LIST);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, team_id);
    db_bind_int64(st, 2, before);
    db_bind_int(st, 3, max + 1);
    if (user) db_bind_text(st, 4, user, -1);
    sweep_info *arr = xcalloc((size_t)max + 1, sizeof *arr);
    int rc, k = 0;
    while ((rc = db_step(st)) == DB_ROW) {
        if (k == max) {
            *next = arr[k - 1].id;
            continue;
        }
        sweep_row(st, &arr[k++]);
    }
    db_done(st);
    if (rc != DB_DONE) {
        for (int i = 0; i < k; i++) sweep_info_release(&arr[i]);
        free(arr);
        return STORE_ERROR;
    }
    *out = arr;
    *n = k;
    return STORE_OK;
}

static const char SQL_TRIALS[] =
    "SELECT x.trial, x.params, coalesce(x.job_id, 0), x.state, x.rung, x.epochs, x.metric, x.reason,"
    " coalesce(j.state, ''), j.reason,"
    " (SELECT count(*) FROM tasks k WHERE k.job_id = x.job_id AND k.state != 'exited')"
    " FROM sweep_trials x LEFT JOIN jobs j ON j.id = x.job_id WHERE x.sweep_id = ?1 ORDER BY x.trial";

int sweep_store_trials(db *d, int64_t sweep_id, sweep_trial_row **out, int *n) {
    *out = NULL;
    *n = 0;
    db_stmt *st = db_prepare(d, SQL_TRIALS);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, sweep_id);
    int cap = 16, k = 0, rc;
    sweep_trial_row *arr = xcalloc((size_t)cap, sizeof *arr);
    while ((rc = db_step(st)) == DB_ROW) {
        if (k == cap) {
            cap *= 2;
            arr = xrealloc(arr, (size_t)cap * sizeof *arr);
        }
        sweep_trial_row *t = &arr[k++];
        memset(t, 0, sizeof *t);
        t->trial = db_col_int(st, 0);
        t->params = col_dup(st, 1);
        t->job_id = db_col_int64(st, 2);
        col_copy(st, 3, t->state, sizeof t->state);
        t->rung = db_col_int(st, 4);
        t->epochs = db_col_int(st, 5);
        t->has_metric = db_col_type(st, 6) != DB_NULL;
        t->metric = db_col_double(st, 6);
        t->reason = col_dup(st, 7);
        col_copy(st, 8, t->job_state, sizeof t->job_state);
        t->job_reason = col_dup(st, 9);
        t->job_live_tasks = db_col_int(st, 10);
    }
    db_done(st);
    if (rc != DB_DONE) {
        sweep_trials_release(arr, k);
        return STORE_ERROR;
    }
    *out = arr;
    *n = k;
    return STORE_OK;
}

static const char SQL_RUNGS[] =
    "SELECT rung, trial, metric, promoted FROM sweep_rungs WHERE sweep_id = ?1 ORDER BY rung, trial";

int sweep_store_rungs(db *d, int64_t sweep_id, sweep_rung_row **out, int *n) {
    *out = NULL;
    *n = 0;
    db_stmt *st = db_prepare(d, SQL_RUNGS);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, sweep_id);
    int cap = 16, k = 0, rc;
    sweep_rung_row *arr = xcalloc((size_t)cap, sizeof *arr);
    while ((rc = db_step(st)) == DB_ROW) {
        if (k == cap) {
            cap *= 2;
            arr = xrealloc(arr, (size_t)cap * sizeof *arr);
        }
        arr[k].rung = db_col_int(st, 0);
        arr[k].trial = db_col_int(st, 1);
        arr[k].metric = db_col_double(st, 2);
        arr[k].promoted = db_col_int(st, 3);
        k++;
    }
    db_done(st);
    if (rc != DB_DONE) {
        free(arr);
        return STORE_ERROR;
    }
    *out = arr;
    *n = k;
    return STORE_OK;
}

static const char SQL_RUNNING[] = "SELECT id FROM sweeps WHERE state = 'running' AND id > ?1 ORDER BY id LIMIT ?2";

int sweep_store_running(db *d, int64_t after_id, int64_t *ids, int max, int *n) {
    *n = 0;
    db_stmt *st = db_prepare(d, SQL_RUNNING);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, after_id);
    db_bind_int(st, 2, max);
    int rc;
    while ((rc = db_step(st)) == DB_ROW && *n < max) ids[(*n)++] = db_col_int64(st, 0);
    db_done(st);
    return rc == DB_DONE || rc == DB_ROW ? STORE_OK : STORE_ERROR;
}

/* ---------------------------------------------------------------- metrics */

static const char SQL_M_EPOCHS[] =
    "SELECT coalesce(max(epoch), 0) FROM metrics WHERE job_id = ?1 AND kind = 'epoch'";
static const char SQL_M_RANGE[] =
    "SELECT min(v), max(v), count(v) FROM (SELECT json_extract(data, ?2) AS v FROM metrics WHERE job_id = ?1) AS m"
    " WHERE typeof(v) IN ('integer','real')";
static const char SQL_M_LAST[] =
    "SELECT v FROM (SELECT seq, json_extract(data, ?2) AS v FROM metrics"
    "  WHERE job_id = ?1 AND kind = 'epoch' AND epoch = ?3) AS m"
    " WHERE typeof(v) IN ('integer','real') ORDER BY seq DESC LIMIT 1";
static const char SQL_M_RANGE_PG[] =
    "SELECT min(v), max(v), count(v) FROM (SELECT ty_json_num(data, $2::text) AS v FROM metrics WHERE job_id = $1"
    " AND ty_json_type(data, $2::text) IN ('integer','real')) AS m";
static const char SQL_M_LAST_PG[] =
    "SELECT ty_json_num(data, $2::text) FROM metrics"
    " WHERE job_id = $1 AND kind = 'epoch' AND epoch = $3 AND ty_json_type(data, $2::text) IN ('integer','real')"
    " ORDER BY seq DESC LIMIT 1";

int sweep_store_job_metric(db *d, int64_t job_id, const char *metric, int mode_max, sweep_metric *out) {
    memset(out, 0, sizeof *out);
    db_stmt *st = db_prepare(d, SQL_M_EPOCHS);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, job_id);
    int rc = db_step(st);
    if (rc == DB_ROW) out->epochs = db_col_int(st, 0);
    db_done(st);
    if (rc != DB_ROW) return STORE_ERROR;
    /* the key quoted as one JSON path member; a name that cannot be one
     * (a quote or backslash in it) has no value anywhere */
    if (!metric[0] || strpbrk(metric, "\"\\")) return STORE_OK;
    char path[80];
    if (sfmt(path, sizeof path, "$.\"%s\"", metric) < 0) return STORE_OK;
    st = db_prepare2(d, SQL_M_RANGE, SQL_M_RANGE_PG);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, job_id);
    db_bind_text(st, 2, path, -1);
    rc = db_step(st);
    if (rc == DB_ROW && db_col_int(st, 2) > 0) {
        out->has_best = 1;
        out->best = db_col_double(st, mode_max ? 1 : 0);
    }
    db_done(st);
    if (rc != DB_ROW) return STORE_ERROR;
    if (out->epochs <= 0) return STORE_OK;
    st = db_prepare2(d, SQL_M_LAST, SQL_M_LAST_PG);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, job_id);
    db_bind_text(st, 2, path, -1);
    db_bind_int(st, 3, out->epochs);
    rc = db_step(st);
    if (rc == DB_ROW) {
        out->has_last = 1;
        out->last = db_col_double(st, 0);
    }
    db_done(st);
    return rc == DB_ROW || rc == DB_DONE ? STORE_OK : STORE_ERROR;
}

/* ---------------------------------------------------------------- the controller's steps */

static const char SQL_TRIAL_RUN[] =
    "UPDATE sweep_trials SET state = 'running', job_id = ?3, rung = ?4, updated_at = ?5"
    " WHERE sweep_id = ?1 AND trial = ?2 AND state = 'pending'";
static const char SQL_SWEEP_USER[] = "SELECT user_id FROM sweeps WHERE id = ?1";
static const char SQL_TRIAL_PARAMS[] = "SELECT params FROM sweep_trials WHERE sweep_id = ?1 AND trial = ?2";

int sweep_store_trial_start(db *d, int64_t sweep_id, int trial, int rung, int64_t team_id, const char *spec_json,
                            const store_new_job *job, const char *actor, int64_t *job_id_out) {
    if (db_begin(d) < 0) return STORE_ERROR;
    int64_t job_id = 0;
    store_new_job mine = *job; /* a trial's job is its sweep's submitter's */
    db_stmt *su = db_prepare(d, SQL_SWEEP_USER);
    if (!su) return finish_tx(d, STORE_ERROR);
    db_bind_int64(su, 1, sweep_id);
    if (db_step(su) == DB_ROW) mine.user_id = db_col_int64(su, 0);
    db_done(su);
    int rc = store_job_insert_rows(d, team_id, spec_json, strlen(spec_json), &mine, actor, &job_id);
    if (rc != STORE_OK) return finish_tx(d, rc);
    db_stmt *st = db_prepare(d, SQL_TRIAL_RUN);
    if (!st) return finish_tx(d, STORE_ERROR);
    db_bind_int64(st, 1, sweep_id);
    db_bind_int(st, 2, trial);
    db_bind_int64(st, 3, job_id);
    db_bind_int(st, 4, rung);
    db_bind_int64(st, 5, now_ms());
    if ((rc = store_step_one(d, st)) != STORE_OK) return finish_tx(d, rc);
    char why[600];
    char *params = NULL;
    st = db_prepare(d, SQL_TRIAL_PARAMS);
    if (!st) return finish_tx(d, STORE_ERROR);
    db_bind_int64(st, 1, sweep_id);
    db_bind_int(st, 2, trial);
    if (db_step(st) == DB_ROW) params = col_dup(st, 0);
    db_done(st);
    snprintf(why, sizeof why, "trial %d of sweep %lld: %.500s", trial, (long long)sweep_id, params ? params : "{}");
    free(params);
    rc = store_event_add(d, job_id, "sweep", actor, why);
    rc = finish_tx(d, rc);
    if (rc == STORE_OK) *job_id_out = job_id;
    return rc;
}

static const char SQL_TRIAL_FAIL[] =
    "UPDATE sweep_trials SET state = 'failed', reason = ?3, updated_at = ?4"
    " WHERE sweep_id = ?1 AND trial = ?2 AND state = 'pending'";

int sweep_store_trial_fail_pending(db *d, int64_t sweep_id, int trial, const char *reason) {
    db_stmt *st = db_prepare(d, SQL_TRIAL_FAIL);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, sweep_id);
    db_bind_int(st, 2, trial);
    db_bind_text(st, 3, reason, -1);
    db_bind_int64(st, 4, now_ms());
    if (store_step_done(st) != STORE_OK) return STORE_ERROR;
    return db_changes(d) == 1 ? STORE_OK : STORE_CONFLICT;
}

static const char SQL_TRIAL_END[] =
    "UPDATE sweep_trials SET state = ?3, epochs = ?4, metric = CASE WHEN ?5 THEN ?6 ELSE metric END,"
    " reason = ?7, updated_at = ?8 WHERE sweep_id = ?1 AND trial = ?2 AND state = 'running'"
    " RETURNING job_id";
/* PostgreSQL's CASE wants a boolean, not the integer 0/1 bound */
static const char SQL_TRIAL_END_PG[] =
    "UPDATE sweep_trials SET state = $3, epochs = $4, metric = CASE WHEN $5 <> 0 THEN $6 ELSE metric END,"
    " reason = $7, updated_at = $8 WHERE sweep_id = $1 AND trial = $2 AND state = 'running'"
    " RETURNING job_id";
static const char SQL_RUNG_INSERT[] =
    "INSERT INTO sweep_rungs(sweep_id, rung, trial, metric, promoted) VALUES(?1, ?2, ?3, ?4, 0)"
    " ON CONFLICT(sweep_id, rung, trial) DO UPDATE SET metric = excluded.metric";

int sweep_store_trial_end(db *d, int64_t sweep_id, int trial, const char *state, int epochs, int has_metric,
                          double metric, const char *reason, int rung, double rung_metric, const char *actor) {
    if (db_begin(d) < 0) return STORE_ERROR;
    db_stmt *st = db_prepare2(d, SQL_TRIAL_END, SQL_TRIAL_END_PG);
    if (!st) return finish_tx(d, STORE_ERROR);
    db_bind_int64(st, 1, sweep_id);
    db_bind_int(st, 2, trial);
    db_bind_text(st, 3, state, -1);
    db_bind_int(st, 4, epochs);
    db_bind_int(st, 5, has_metric);
    db_bind_double(st, 6, metric);
    if (reason) db_bind_text(st, 7, reason, -1);
    db_bind_int64(st, 8, now_ms());
    int s = db_step(st);
    int64_t job_id = s == DB_ROW ? db_col_int64(st, 0) : 0;
    if (s == DB_ROW) s = db_step(st);
    db_done(st);
    if (s != DB_DONE) return finish_tx(d, STORE_ERROR);
    if (!job_id) return finish_tx(d, STORE_CONFLICT);
    if (rung >= 0) {
        st = db_prepare(d, SQL_RUNG_INSERT);
        if (!st) return finish_tx(d, STORE_ERROR);
        db_bind_int64(st, 1, sweep_id);
        db_bind_int(st, 2, rung);
        db_bind_int(st, 3, trial);
        db_bind_double(st, 4, rung_metric);
        if (store_step_done(st) != STORE_OK) return finish_tx(d, STORE_ERROR);
    }
    char why[700];
    snprintf(why, sizeof why, "trial %d of sweep %lld %s: %.600s", trial, (long long)sweep_id, state,
             reason ? reason : "");
    return finish_tx(d, store_event_add(d, job_id, "sweep", actor, why));
}

static const char SQL_RUNG_PROMOTE[] =
    "UPDATE sweep_rungs SET promoted = 1 WHERE sweep_id = ?1 AND rung = ?2 AND trial = ?3 AND promoted = 0";
static const char SQL_TRIAL_RESUME[] =
    "UPDATE sweep_trials SET state = 'running', rung = ?3 + 1, reason = NULL, updated_at = ?4"
    " WHERE sweep_id = ?1 AND trial = ?2 AND state = 'paused' AND rung = ?3 AND job_id = ?5";
/* the job may only go back to the queue once every task of its attempt has
 * exited: its last checkpoint is uploaded, and no agent still reports on it */
static const char SQL_JOB_RESPEC[] =
    "UPDATE jobs SET spec = ?2, finished_at = NULL WHERE id = ?1 AND state = 'succeeded' AND deleted_at IS NULL"
    " AND NOT EXISTS(SELECT 1 FROM tasks k WHERE k.job_id = ?1 AND k.state != 'exited')";

int sweep_store_trial_promote(db *d, int64_t sweep_id, int trial, int from, int64_t job_id, const char *spec_json,
                              const char *actor, const char *reason) {
    static const char *const succeeded[] = {"succeeded", NULL};
    int rc;
    if (db_begin(d) < 0) return STORE_ERROR;
    db_stmt *st = db_prepare(d, SQL_RUNG_PROMOTE);
    if (!st) return finish_tx(d, STORE_ERROR);
    db_bind_int64(st, 1, sweep_id);
    db_bind_int(st, 2, from);
    db_bind_int(st, 3, trial);
    if ((rc = store_step_one(d, st)) != STORE_OK) return finish_tx(d, rc);
    st = db_prepare(d, SQL_TRIAL_RESUME);
    if (!st) return finish_tx(d, STORE_ERROR);
    db_bind_int64(st, 1, sweep_id);
    db_bind_int(st, 2, trial);
    db_bind_int(st, 3, from);
    db_bind_int64(st, 4, now_ms());
    db_bind_int64(st, 5, job_id);
    if ((rc = store_step_one(d, st)) != STORE_OK) return finish_tx(d, rc);
    st = db_prepare(d, SQL_JOB_RESPEC);
    if (!st) return finish_tx(d, STORE_ERROR);
    db_bind_int64(st, 1, job_id);
    db_bind_text(st, 2, spec_json, -1);
    if ((rc = store_step_one(d, st)) != STORE_OK) return finish_tx(d, rc);
    rc = store_job_transition(d, job_id, succeeded, "queued", actor, reason);
    return finish_tx(d, rc);
}

static const char SQL_TRIAL_NEXT_RUNG[] =
    "UPDATE sweep_trials SET rung = ?3 + 1, updated_at = ?4"
    " WHERE sweep_id = ?1 AND trial = ?2 AND state = 'running' AND rung = ?3 AND job_id = ?5";
static const char SQL_RUNG_INSERT_PROMOTED[] =
    "INSERT INTO sweep_rungs(sweep_id, rung, trial, metric, promoted) VALUES(?1, ?2, ?3, ?4, 1)"
    " ON CONFLICT(sweep_id, rung, trial) DO NOTHING";
static const char SQL_JOB_RESPEC_RUNNING[] =
    "UPDATE jobs SET spec = ?2 WHERE id = ?1 AND state = 'running' AND attempt = ?3 AND deleted_at IS NULL";

int sweep_store_trial_continue(db *d, int64_t sweep_id, int trial, int from, int64_t job_id, int attempt,
                               double metric, const char *spec_json, const char *actor, const char *reason) {
    int rc;
    if (db_begin(d) < 0) return STORE_ERROR;
    db_stmt *st = db_prepare(d, SQL_TRIAL_NEXT_RUNG);
    if (!st) return finish_tx(d, STORE_ERROR);
    db_bind_int64(st, 1, sweep_id);
    db_bind_int(st, 2, trial);
    db_bind_int(st, 3, from);
    db_bind_int64(st, 4, now_ms());
    db_bind_int64(st, 5, job_id);
    if ((rc = store_step_one(d, st)) != STORE_OK) return finish_tx(d, rc);
    st = db_prepare(d, SQL_RUNG_INSERT_PROMOTED);
    if (!st) return finish_tx(d, STORE_ERROR);
    db_bind_int64(st, 1, sweep_id);
    db_bind_int(st, 2, from);
    db_bind_int(st, 3, trial);
    db_bind_double(st, 4, metric);
    if ((rc = store_step_one(d, st)) != STORE_OK) return finish_tx(d, rc);
    st = db_prepare(d, SQL_JOB_RESPEC_RUNNING);
    if (!st) return finish_tx(d, STORE_ERROR);
    db_bind_int64(st, 1, job_id);
    db_bind_text(st, 2, spec_json, -1);
    db_bind_int(st, 3, attempt);
    if ((rc = store_step_one(d, st)) != STORE_OK) return finish_tx(d, rc);
    return finish_tx(d, store_event_add(d, job_id, "sweep", actor, reason));
}

static const char SQL_TRIAL_RUNNING_JOB[] =
    "SELECT 1 FROM sweep_trials WHERE sweep_id = ?1 AND trial = ?2 AND state = 'running' AND job_id = ?3";
static const char SQL_JOB_REOPEN[] =
    "UPDATE jobs SET finished_at = NULL WHERE id = ?1 AND state = 'succeeded' AND deleted_at IS NULL"
    " AND NOT EXISTS(SELECT 1 FROM tasks k WHERE k.job_id = ?1 AND k.state != 'exited')";

int sweep_store_trial_requeue(db *d, int64_t sweep_id, int trial, int64_t job_id, const char *actor,
                              const char *reason) {
    static const char *const succeeded[] = {"succeeded", NULL};
    int rc;
    if (db_begin(d) < 0) return STORE_ERROR;
    db_stmt *st = db_prepare(d, SQL_TRIAL_RUNNING_JOB);
    if (!st) return finish_tx(d, STORE_ERROR);
    db_bind_int64(st, 1, sweep_id);
    db_bind_int(st, 2, trial);
    db_bind_int64(st, 3, job_id);
    int s = db_step(st);
    db_done(st);
    if (s != DB_ROW) return finish_tx(d, s == DB_DONE ? STORE_CONFLICT : STORE_ERROR);
    st = db_prepare(d, SQL_JOB_REOPEN);
    if (!st) return finish_tx(d, STORE_ERROR);
    db_bind_int64(st, 1, job_id);
    if ((rc = store_step_one(d, st)) != STORE_OK) return finish_tx(d, rc);
    return finish_tx(d, store_job_transition(d, job_id, succeeded, "queued", actor, reason));
}

static const char SQL_STOP_PAUSED[] =
    "UPDATE sweep_trials SET state = 'stopped', updated_at = ?2,"
    " reason = 'stopped early at rung ' || rung || ' (' || epochs || ' epoch' || CASE WHEN epochs = 1 THEN '' ELSE 's' END || ')'"
    " WHERE sweep_id = ?1 AND state = 'paused'";
static const char SQL_SWEEP_END[] =
    "UPDATE sweeps SET state = ?2, reason = ?3, updated_at = ?4, finished_at = ?4 WHERE id = ?1 AND state = 'running'";

int sweep_store_finish(db *d, int64_t sweep_id, const char *state, const char *reason) {
    int rc;
    if (db_begin(d) < 0) return STORE_ERROR;
    int64_t now = now_ms();
    db_stmt *st = db_prepare(d, SQL_STOP_PAUSED);
    if (!st) return finish_tx(d, STORE_ERROR);
    db_bind_int64(st, 1, sweep_id);
    db_bind_int64(st, 2, now);
    if (store_step_done(st) != STORE_OK) return finish_tx(d, STORE_ERROR);
    st = db_prepare(d, SQL_SWEEP_END);
    if (!st) return finish_tx(d, STORE_ERROR);
    db_bind_int64(st, 1, sweep_id);
    db_bind_text(st, 2, state, -1);
    db_bind_text(st, 3, reason, -1);
    db_bind_int64(st, 4, now);
    if ((rc = store_step_one(d, st)) != STORE_OK) return finish_tx(d, rc);
    rc = finish_tx(d, STORE_OK);
    if (rc == STORE_OK) db_note(d, "sweep %lld: %s: %s", (long long)sweep_id, state, reason);
    return rc;
}

static const char SQL_TRIALS_LIVE_JOBS[] =
    "SELECT job_id FROM sweep_trials WHERE sweep_id = ?1 AND state = 'running' AND job_id IS NOT NULL ORDER BY trial";
static const char SQL_TRIALS_CANCEL[] =
    "UPDATE sweep_trials SET state = 'cancelled', reason = ?2, updated_at = ?3"
    " WHERE sweep_id = ?1 AND state IN ('pending','running','paused')";

int sweep_store_cancel(db *d, int64_t sweep_id, const char *reason, int64_t *jobs, int max, int *n) {
    *n = 0;
    int64_t now = now_ms();
    db_stmt *st = db_prepare(d, SQL_SWEEP_END);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, sweep_id);
    db_bind_text_static(st, 2, "cancelled", -1);
    db_bind_text(st, 3, reason, -1);
    db_bind_int64(st, 4, now);
    int rc = store_step_one(d, st);
    if (rc != STORE_OK) return rc;
    st = db_prepare(d, SQL_TRIALS_LIVE_JOBS);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, sweep_id);
    while ((rc = db_step(st)) == DB_ROW)
        if (*n < max) jobs[(*n)++] = db_col_int64(st, 0);
    db_done(st);
    if (rc != DB_DONE) return STORE_ERROR;
    st = db_prepare(d, SQL_TRIALS_CANCEL);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, sweep_id);
    db_bind_text(st, 2, reason, -1);
    db_bind_int64(st, 3, now);
    return store_step_done(st);
}

static const char SQL_NEWEST_CKPT[] =
    "SELECT coalesce(max(id), 0) FROM checkpoints WHERE job_id = ?1 AND deleted_at IS NULL";

int sweep_store_newest_checkpoint(db *d, int64_t job_id, int64_t *ckpt_id) {
    *ckpt_id = 0;
    db_stmt *st = db_prepare(d, SQL_NEWEST_CKPT);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, job_id);
    int rc = db_step(st);
    if (rc == DB_ROW) *ckpt_id = db_col_int64(st, 0);
    db_done(st);
    return rc == DB_ROW ? STORE_OK : STORE_ERROR;
}

static const char SQL_JOB_SWEEP_RUNNING[] =
    "SELECT j.sweep_id, j.trial FROM jobs j JOIN sweeps s ON s.id = j.sweep_id"
    " WHERE j.id = ?1 AND s.state = 'running'";

int sweep_store_job_in_running_sweep(db *d, int64_t job_id, int64_t *sweep_id, int *trial) {
    *sweep_id = 0;
    *trial = 0;
    db_stmt *st = db_prepare(d, SQL_JOB_SWEEP_RUNNING);
    if (!st) return -1;
    db_bind_int64(st, 1, job_id);
    int rc = db_step(st);
    if (rc == DB_ROW) {
        *sweep_id = db_col_int64(st, 0);
        *trial = db_col_int(st, 1);
    }
    db_done(st);
    return rc == DB_ROW ? 1 : rc == DB_DONE ? 0 : -1;
}
