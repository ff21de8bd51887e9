/* store.c - teams, tokens, jobs and events. See store.h for the contract. */
#include "store.h"
#include "audit.h"
#include "cluster.h"
#include "context_store.h"
#include "../common/json_out.h"
#include "../common/util.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/crypto.h>

const char *token_kind_name(token_kind k) {
    switch (k) {
    case TOKEN_ADMIN: return "admin";
    case TOKEN_TEAM: return "team";
    case TOKEN_NODE: return "node";
    case TOKEN_TASK: return "task";
    case TOKEN_JOIN: return "join";
    case TOKEN_USER: return "user";
    }
    return "?";
}

const char *role_name(team_role r) {
    switch (r) {
    case ROLE_VIEWER: return "viewer";
    case ROLE_MEMBER: return "member";
    case ROLE_ADMIN: return "admin";
    case ROLE_NONE: break;
    }
    return "none";
}

int role_parse(const char *s, team_role *r) {
    static const team_role all[] = {ROLE_VIEWER, ROLE_MEMBER, ROLE_ADMIN};
    for (size_t i = 0; s && i < sizeof all / sizeof all[0]; i++)
        if (strcmp(s, role_name(all[i])) == 0) {
            *r = all[i];
            return 0;
        }
    return -1;
}

static int token_kind_parse(const char *s, token_kind *k) {
    static const token_kind all[] = {TOKEN_ADMIN, TOKEN_TEAM, TOKEN_NODE, TOKEN_TASK};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (strcmp(s, token_kind_name(all[i])) == 0) {
            *k = all[i];
            return 0;
        }
    return -1;
}

int store_is_terminal(const char *state) {
    return strcmp(state, "succeeded") == 0 || strcmp(state, "failed") == 0 ||
           strcmp(state, "cancelled") == 0;
}

/* Our own JSON object text (the API wrote it, json_out.h), answered as it
 * is stored: parsing and printing every running job's progress again was
 * most of a list page's cost. Its length, or 0 for anything else (null). */
static size_t stored_object(const char *text) {
    size_t n = text ? strlen(text) : 0;
    return n >= 2 && text[0] == '{' && text[n - 1] == '}' ? n : 0;
}

void store_json_stored(cJSON *o, const char *key, const char *text) {
    if (stored_object(text)) cJSON_AddRawToObject(o, key, text);
    else cJSON_AddNullToObject(o, key);
}

void store_json_text(cJSON *o, const char *key, db_stmt *st, int col) {
    const char *t = db_col_text(st, col);
    if (t) cJSON_AddStringToObject(o, key, (const char *)t);
    else cJSON_AddNullToObject(o, key);
}

/* ---------------------------------------------------------------- teams */

static const char SQL_TEAM_INSERT[] =
    "INSERT INTO teams(name, created_at) VALUES(?, ?) ON CONFLICT DO NOTHING RETURNING id";
static const char SQL_TEAM_FIND[] = "SELECT id FROM teams WHERE name = ?";
static const char SQL_TEAMS_LIST[] =
    "SELECT t.id, t.name, t.created_at, t.weight, t.guarantee, t.quota, t.max_interactive,"
    " (SELECT count(*) FROM jobs j WHERE j.team_id = t.id AND j.state IN ('queued')),"
    " (SELECT count(*) FROM jobs j WHERE j.team_id = t.id AND j.state IN ('starting','running')),"
    " (SELECT count(*) FROM allocations a JOIN jobs j ON j.id = a.job_id WHERE j.team_id = t.id)"
    " FROM teams t WHERE (?1 = 0 OR t.id = ?1) ORDER BY t.id";

int store_team_create(db *d, const char *name, int64_t *id_out) {
    db_stmt *st = db_prepare(d, SQL_TEAM_INSERT);
    if (!st) return STORE_ERROR;
    db_bind_text_static(st, 1, name, -1);
    db_bind_int64(st, 2, now_ms());
    return store_step_id(st, id_out); /* no row: the name is taken */
}

int store_team_find(db *d, const char *name, int64_t *id_out) {
    db_stmt *st = db_prepare(d, SQL_TEAM_FIND);
    if (!st) return STORE_ERROR;
    db_bind_text_static(st, 1, name, -1);
    int rc = db_step(st);
    int ret = rc == DB_ROW ? STORE_OK : rc == DB_DONE ? STORE_NOT_FOUND : STORE_ERROR;
    if (ret == STORE_OK && id_out) *id_out = db_col_int64(st, 0);
    db_done(st);
    return ret;
}

static cJSON *teams_query(db *d, int64_t team_id) {
    db_stmt *st = db_prepare(d, SQL_TEAMS_LIST);
    if (!st) return NULL;
    db_bind_int64(st, 1, team_id);
    cJSON *arr = cJSON_CreateArray();
    int rc;
    while ((rc = db_step(st)) == DB_ROW) {
        cJSON *t = cJSON_CreateObject();
        cJSON_AddNumberToObject(t, "id", (double)db_col_int64(st, 0));
        store_json_text(t, "name", st, 1);
        store_json_time(t, "created_at", st, 2);
        cJSON_AddNumberToObject(t, "weight", db_col_double(st, 3));
        cJSON_AddNumberToObject(t, "guarantee", db_col_int(st, 4));
        if (db_col_type(st, 5) == DB_NULL) cJSON_AddNullToObject(t, "quota");
        else cJSON_AddNumberToObject(t, "quota", db_col_int(st, 5));
        if (db_col_type(st, 6) == DB_NULL) cJSON_AddNullToObject(t, "max_interactive");
        else cJSON_AddNumberToObject(t, "max_interactive", db_col_int(st, 6));
        cJSON_AddNumberToObject(t, "jobs_queued", db_col_int(st, 7));
        cJSON_AddNumberToObject(t, "jobs_running", db_col_int(st, 8));
        cJSON_AddNumberToObject(t, "devices_in_use", db_col_int(st, 9));
        cJSON_AddItemToArray(arr, t);
    }
    db_done(st);
    if (rc != DB_DONE) {
        cJSON_Delete(arr);
        return NULL;
    }
    return arr;
}

cJSON *store_teams_list(db *d) { return teams_query(d, 0); }

cJSON *store_team_get(db *d, int64_t team_id) {
    cJSON *arr = teams_query(d, team_id);
    if (!arr) return NULL;
    cJSON *t = cJSON_DetachItemFromArray(arr, 0);
    cJSON_Delete(arr);
    return t;
}

/* ---------------------------------------------------------------- tokens */

static const char SQL_TOKEN_INSERT[] =
    "INSERT INTO tokens(hash, kind, team_id, job_id, created_at) VALUES(?, ?, ?, ?, ?)";
static const char SQL_TOKEN_LOOKUP[] =
    "SELECT k.kind, k.team_id, k.job_id, t.name, k.node_id, k.hash, k.expires_at FROM tokens k"
    " LEFT JOIN teams t ON t.id = k.team_id"
    " WHERE k.hash = ? AND k.revoked_at IS NULL";
static const char SQL_TOKEN_COUNT[] = "SELECT count(*) FROM tokens WHERE kind = ? AND revoked_at IS NULL";

int store_token_add(db *d, const char *token, token_kind kind, int64_t team_id, int64_t job_id) {
    char hash[65];
    sha256_hex(token, strlen(token), hash);
    db_stmt *st = db_prepare(d, SQL_TOKEN_INSERT);
    if (!st) return STORE_ERROR;
    db_bind_text(st, 1, hash, -1);
    /* the join token is a 'node' token without a node (tokens.node_id NULL) */
    db_bind_text_static(st, 2, token_kind_name(kind == TOKEN_JOIN ? TOKEN_NODE : kind), -1);
    if (team_id > 0) db_bind_int64(st, 3, team_id);
    if (job_id > 0) db_bind_int64(st, 4, job_id);
    db_bind_int64(st, 5, now_ms());
    int rc = db_step(st);
    db_done(st);
    return rc == DB_DONE ? STORE_OK : STORE_ERROR;
}

static int token_query(db *d, const char hash[65], principal *who) {
    db_stmt *st = db_prepare(d, SQL_TOKEN_LOOKUP);
    if (!st) return STORE_ERROR;
    db_bind_text(st, 1, hash, -1);
    int rc = db_step(st);
    int ret = STORE_NOT_FOUND;
    if (rc == DB_ROW) {
        memset(who, 0, sizeof *who);
        const char *kind = db_col_text(st, 0);
        const char *stored = db_col_text(st, 5);
        if (!stored || strlen(stored) != 64 || CRYPTO_memcmp(stored, hash, 64) != 0) {
            ret = STORE_NOT_FOUND;
        } else if (kind && token_kind_parse(kind, &who->kind) == 0) {
            who->team_id = db_col_int64(st, 1);
            who->job_id = db_col_int64(st, 2);
            const char *team = db_col_text(st, 3);
            snprintf(who->team, sizeof who->team, "%s", team ? team : "");
            who->node_id = db_col_int64(st, 4);
            who->expires_at = db_col_int64(st, 6); /* NULL: 0, never */
            if (who->kind == TOKEN_NODE && who->node_id <= 0) who->kind = TOKEN_JOIN;
            ret = STORE_OK;
        } else {
            ret = STORE_ERROR;
        }
    } else if (rc != DB_DONE) {
        ret = STORE_ERROR;
    }
    db_done(st);
    return ret;
}

/* Each thread keeps its last few tokens found, with the db_auth_generation
 * they were read at: a request with one of them costs no query until the
 * next commit that writes tokens or teams (a revocation is one; the stream
 * of submissions and metrics is not), and an unknown token always asks. */
#define TOKEN_CACHE_N 8
typedef struct token_cached {
    uint64_t gen;                 /* unique to its db (storage/db.h); 0: empty */
    char hash[65];
    principal who;
} token_cached;
static __thread token_cached t_tokens[TOKEN_CACHE_N];
static __thread unsigned t_tokens_next;

/* A found token past its expiry (which the cache keeps with it, so a kept
 * answer expires on time too). */
static int expiry_check(const principal *who) {
    return who->expires_at > 0 && now_ms() >= who->expires_at ? STORE_EXPIRED : STORE_OK;
}

int store_token_lookup(db *d, const char *token, principal *who) {
    char hash[65];
    sha256_hex(token, strlen(token), hash);
    uint64_t gen = db_auth_generation(d); /* moves only with a write of tokens or teams */
    for (int i = 0; gen && i < TOKEN_CACHE_N; i++) {
        const token_cached *c = &t_tokens[i];
        if (c->gen == gen && CRYPTO_memcmp(c->hash, hash, 64) == 0) {
            *who = c->who;
            return expiry_check(who);
        }
    }
    int ret = token_query(d, hash, who);
    if (ret == STORE_OK && gen) {
        token_cached *c = &t_tokens[t_tokens_next++ % TOKEN_CACHE_N];
        c->gen = gen;
        memcpy(c->hash, hash, sizeof c->hash);
        c->who = *who;
    }
    return ret == STORE_OK ? expiry_check(who) : ret;
}

static const char SQL_TOKEN_INSERT_EXP[] =
    "INSERT INTO tokens(hash, kind, team_id, created_at, expires_at) VALUES(?, 'team', ?, ?, ?)";

int store_token_add_expiring(db *d, const char *token, int64_t team_id, int64_t expires_at) {
    char hash[65];
    sha256_hex(token, strlen(token), hash);
    db_stmt *st = db_prepare(d, SQL_TOKEN_INSERT_EXP);
    if (!st) return STORE_ERROR;
    db_bind_text(st, 1, hash, -1);
    db_bind_int64(st, 2, team_id);
    db_bind_int64(st, 3, now_ms());
    if (expires_at > 0) db_bind_int64(st, 4, expires_at);
    int rc = db_step(st);
    db_done(st);
    return rc == DB_DONE ? STORE_OK : STORE_ERROR;
}

static const char SQL_TEAM_TOKENS_EXPIRE[] =
    "UPDATE tokens SET expires_at = ?1 WHERE team_id = ?2 AND kind = 'team' AND revoked_at IS NULL"
    " AND hash != ?3 AND (expires_at IS NULL OR expires_at > ?1)";

int store_team_tokens_expire(db *d, int64_t team_id, const char *keep_token, int64_t at, int *n) {
    char hash[65];
    sha256_hex(keep_token, strlen(keep_token), hash);
    db_stmt *st = db_prepare(d, SQL_TEAM_TOKENS_EXPIRE);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, at);
    db_bind_int64(st, 2, team_id);
    db_bind_text(st, 3, hash, -1);
    int rc = db_step(st);
    if (n) *n = rc == DB_DONE ? db_changes(d) : 0;
    db_done(st);
    return rc == DB_DONE ? STORE_OK : STORE_ERROR;
}

int store_token_count(db *d, token_kind kind, int64_t *n) {
    db_stmt *st = db_prepare(d, SQL_TOKEN_COUNT);
    if (!st) return STORE_ERROR;
    db_bind_text_static(st, 1, token_kind_name(kind), -1);
    int rc = db_step(st);
    if (rc == DB_ROW) *n = db_col_int64(st, 0);
    db_done(st);
    return rc == DB_ROW ? STORE_OK : STORE_ERROR;
}

/* ---------------------------------------------------------------- events */

static const char SQL_EVENT_INSERT[] =
    "INSERT INTO job_events(job_id, ts, kind, from_state, to_state, actor, reason)"
    " VALUES(?, ?, ?, ?, ?, ?, ?)";

static int event_insert(db *d, int64_t job_id, const char *kind, const char *from, const char *to,
                        const char *actor, const char *reason) {
    db_stmt *st = db_prepare(d, SQL_EVENT_INSERT);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, job_id);
    db_bind_int64(st, 2, now_ms());
    db_bind_text_static(st, 3, kind, -1);
    if (from) db_bind_text(st, 4, from, -1);
    if (to) db_bind_text(st, 5, to, -1);
    db_bind_text(st, 6, actor, -1);
    if (reason) db_bind_text(st, 7, reason, -1);
    int rc = db_step(st);
    db_done(st);
    if (rc != DB_DONE) return STORE_ERROR;
    /* the console's line of it: the reason's first line */
    const char *r = reason ? reason : "";
    int rl = (int)strcspn(r, "\n");
    if (rl > 300) rl = 300;
    if (to) db_note(d, "job %lld: %s%s%s (%s): %.*s", (long long)job_id, from ? from : "", from ? " -> " : "", to, actor,
                    rl, r);
    else db_note(d, "job %lld: %s (%s): %.*s", (long long)job_id, kind, actor, rl, r);
    return STORE_OK;
}

int store_event_add(db *d, int64_t job_id, const char *kind, const char *actor, const char *reason) {
    return event_insert(d, job_id, kind, NULL, NULL, actor, reason);
}

static const char SQL_EVENTS[] =
    "SELECT id, ts, kind, from_state, to_state, actor, reason FROM job_events"
    " WHERE job_id = ? AND id > ? ORDER BY id LIMIT ?";

int store_job_events(db *d, int64_t job_id, int64_t after, int limit, cJSON **out) {
    db_stmt *st = db_prepare(d, SQL_EVENTS);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, job_id);
    db_bind_int64(st, 2, after);
    db_bind_int(st, 3, limit);
    cJSON *arr = cJSON_CreateArray();
    int rc;
    while ((rc = db_step(st)) == DB_ROW) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "id", (double)db_col_int64(st, 0));
        store_json_time(e, "time", st, 1);
        store_json_text(e, "kind", st, 2);
        store_json_text(e, "from", st, 3);
        store_json_text(e, "to", st, 4);
        store_json_text(e, "actor", st, 5);
        store_json_text(e, "reason", st, 6);
        cJSON_AddItemToArray(arr, e);
    }
    db_done(st);
    if (rc != DB_DONE) {
        cJSON_Delete(arr);
        return STORE_ERROR;
    }
    *out = arr;
    return STORE_OK;
}

/* ---------------------------------------------------------------- jobs */

static const char SQL_JOB_INSERT[] =
    "INSERT INTO jobs(team_id, name, spec, state, priority, attempt, max_restarts, workers,"
    " devices_per_worker, device, ps, max_runtime_s, preemptible, queue_if_infeasible, reason,"
    " created_at, updated_at, queued_at, strategy, memory_mb, workers_min, context, sweep_id, trial, user_id)"
    " VALUES(?, ?, ?, 'queued', ?, 0, ?, ?, ?, ?, ?, ?, ?, ?, 'waiting for the scheduler', ?, ?, ?, ?, ?, ?, ?,"
    " ?, ?, ?) RETURNING id";

/* The job's row and its "submitted" event, inside the caller's transaction.
 * A job naming a context marks it used, in the same transaction: a context
 * deleted or collected since the caller looked (context_store.h) fails the
 * insert with STORE_NOT_FOUND instead of leaving a job without its code. */
int store_job_insert_rows(db *d, int64_t team_id, const char *spec_json, size_t spec_len, const store_new_job *job,
                          const char *actor, int64_t *id_out) {
    db_stmt *st = db_prepare(d, SQL_JOB_INSERT);
    if (!st) return STORE_ERROR;
    int64_t now = now_ms();
    db_bind_int64(st, 1, team_id);
    db_bind_text(st, 2, job->name, -1);
    db_bind_text(st, 3, spec_json, (int)spec_len);
    db_bind_int(st, 4, job->priority);
    db_bind_int(st, 5, job->max_restarts);
    db_bind_int(st, 6, job->workers);
    db_bind_int(st, 7, job->devices_per_worker);
    db_bind_text(st, 8, job->device, -1);
    db_bind_int(st, 9, job->ps);
    db_bind_int64(st, 10, job->max_runtime_s);
    db_bind_int(st, 11, job->preemptible);
    db_bind_int(st, 12, job->queue_if_infeasible);
    db_bind_int64(st, 13, now);
    db_bind_int64(st, 14, now);
    db_bind_int64(st, 15, now);
    db_bind_text(st, 16, job->strategy ? job->strategy : "default", -1);
    db_bind_int64(st, 17, job->memory_mb);
    db_bind_int(st, 18, job->workers_min);
    if (job->context && job->context[0]) db_bind_text(st, 19, job->context, -1);
    else db_bind_null(st, 19);
    if (job->sweep_id > 0) {
        db_bind_int64(st, 20, job->sweep_id);
        db_bind_int(st, 21, job->trial);
    }
    if (job->user_id > 0) db_bind_int64(st, 22, job->user_id);
    int64_t id = 0;
    int rc = store_step_id(st, &id);
    if (rc != STORE_OK) return STORE_ERROR;
    if (job->context && job->context[0]) {
        rc = ctx_store_touch(d, team_id, job->context, now);
        if (rc != STORE_OK) return rc;
    }
    if (event_insert(d, id, "state", NULL, "queued", actor, "submitted") != STORE_OK) return STORE_ERROR;
    *id_out = id;
    return STORE_OK;
}

int store_job_insert(db *d, int64_t team_id, const char *spec_json, size_t spec_len,
                     const store_new_job *job, const char *actor, int64_t *id_out) {
    if (db_begin(d) < 0) return STORE_ERROR;
    int64_t id = 0;
    int rc = store_job_insert_rows(d, team_id, spec_json, spec_len, job, actor, &id);
    if (rc != STORE_OK) {
        db_rollback(d);
        return rc == STORE_NOT_FOUND ? STORE_NOT_FOUND : STORE_ERROR;
    }
    if (db_commit(d) < 0) return STORE_ERROR;
    *id_out = id;
    return STORE_OK;
}

/* A submission queued for the group commit: its own copies of what it
 * inserts (the caller's buffers may be gone when the batch runs). */
typedef struct job_submit {
    db_group_item item;
    int64_t team_id;
    store_new_job job;
    char *name, *spec, *device, *strategy, *actor, *context;
    size_t spec_len;
    int64_t id;
    cJSON *json;
    store_submit_done done;
    void *arg;
    int replay;                  /* STORE_EXPIRED or STORE_CONFLICT: the key was used (no job made) */
    char *idem_key;
    int audited;
    audit_row audit;             /* its request's audit row, written with it (status 201) */
} job_submit;

/* Keys live a day: a client retries within seconds or minutes. */
#define SUBMIT_KEY_TTL_MS (24LL * 3600 * 1000)
static const char SQL_SUBMIT_KEY_FIND[] =
    "SELECT k.job_id, CASE WHEN j.spec = ?3 THEN 1 ELSE 0 END FROM submit_keys k JOIN jobs j ON j.id = k.job_id"
    " WHERE k.team_id = ?1 AND k.idem_key = ?2 AND k.created_at >= ?4";
static const char SQL_SUBMIT_KEY_PRUNE[] = "DELETE FROM submit_keys WHERE team_id = ?1 AND created_at < ?2";
static const char SQL_SUBMIT_KEY_ADD[] =
    "INSERT INTO submit_keys(team_id, idem_key, job_id, created_at) VALUES(?1, ?2, ?3, ?4)";

/* A key seen before (within its day): 1 with the job (*same: the same
 * spec), 0 none, -1 store error. Older keys of the team go first. */
static int submit_key_find(db *d, const job_submit *s, int64_t now, int64_t *job, int *same) {
    db_stmt *st = db_prepare(d, SQL_SUBMIT_KEY_PRUNE);
    if (!st) return -1;
    db_bind_int64(st, 1, s->team_id);
    db_bind_int64(st, 2, now - SUBMIT_KEY_TTL_MS);
    if (store_step_done(st) != STORE_OK) return -1;
    if (!(st = db_prepare(d, SQL_SUBMIT_KEY_FIND))) return -1;
    db_bind_int64(st, 1, s->team_id);
    db_bind_text(st, 2, s->job.idem_key, -1);
    db_bind_text(st, 3, s->spec, (int)s->spec_len);
    db_bind_int64(st, 4, now - SUBMIT_KEY_TTL_MS);
    int rc = db_step(st);
    if (rc == DB_ROW) {
        *job = db_col_int64(st, 0);
        *same = db_col_int(st, 1);
    }
    db_done(st);
    return rc == DB_ROW ? 1 : rc == DB_DONE ? 0 : -1;
}

static int job_submit_run(db *d, void *arg) {
    job_submit *s = arg;
    int64_t now = now_ms();
    if (s->job.idem_key) {
        int64_t first = 0;
        int same = 0, found = submit_key_find(d, s, now, &first, &same);
        if (found < 0) return STORE_ERROR;
        if (found) { /* a replay: nothing is written (the savepoint is released empty) */
            s->id = first;
            s->replay = same ? STORE_EXPIRED : STORE_CONFLICT;
            if (same && store_job_get(d, first, 0, 0, &s->json) != STORE_OK) {
                s->json = NULL;
                return STORE_ERROR;
            }
            return STORE_OK;
        }
    }
    int rc = store_job_insert_rows(d, s->team_id, s->spec, s->spec_len, &s->job, s->actor, &s->id);
    if (rc != STORE_OK) return rc == STORE_NOT_FOUND ? STORE_NOT_FOUND : STORE_ERROR;
    if (s->job.idem_key) {
        db_stmt *st = db_prepare(d, SQL_SUBMIT_KEY_ADD);
        if (!st) return STORE_ERROR;
        db_bind_int64(st, 1, s->team_id);
        db_bind_text(st, 2, s->job.idem_key, -1);
        db_bind_int64(st, 3, s->id);
        db_bind_int64(st, 4, now);
        if (store_step_done(st) != STORE_OK) return STORE_ERROR;
    }
    if (s->audited) {
        s->audit.status = 201; /* what the handler answers once this commits */
        if (audit_insert(d, &s->audit, NULL) != STORE_OK) return STORE_ERROR;
    }
    /* the answer's job, read in the same transaction: what the commit makes durable */
    if (store_job_get(d, s->id, 0, 0, &s->json) != STORE_OK) {
        s->json = NULL;
        return STORE_ERROR;
    }
    return STORE_OK;
}

static void job_submit_free(job_submit *s) {
    free(s->idem_key);
    free(s->name);
    free(s->spec);
    free(s->device);
    free(s->strategy);
    free(s->actor);
    free(s->context);
    free(s);
}

static void job_submit_done(void *arg, int rc) {
    job_submit *s = arg;
    if (rc != STORE_OK) {
        cJSON_Delete(s->json);
        s->json = NULL;
        s->id = 0;
        rc = rc == STORE_NOT_FOUND ? STORE_NOT_FOUND : STORE_ERROR;
    }
    else if (s->replay)
        rc = s->replay;
    s->done(s->arg, rc, s->id, s->json);
    job_submit_free(s);
}

static char *dup_or_null(const char *p) { return p ? xstrdup(p) : NULL; }

int store_job_submit(db *d, int64_t team_id, const char *spec_json, size_t spec_len, const store_new_job *job,
                     const char *actor, const audit_row *audit, store_submit_done done, void *arg) {
    job_submit *s = xcalloc(1, sizeof *s);
    if (audit) {
        s->audited = 1;
        s->audit = *audit;
    }
    s->team_id = team_id;
    s->job = *job;
    s->name = dup_or_null(job->name);
    s->device = dup_or_null(job->device);
    s->strategy = dup_or_null(job->strategy);
    s->context = dup_or_null(job->context);
    s->idem_key = dup_or_null(job->idem_key);
    s->actor = xstrdup(actor ? actor : "");
    s->spec = xmalloc(spec_len + 1);
    memcpy(s->spec, spec_json, spec_len);
    s->spec[spec_len] = '\0';
    s->spec_len = spec_len;
    s->job.name = s->name;
    s->job.device = s->device;
    s->job.strategy = s->strategy;
    s->job.context = s->context;
    s->job.idem_key = s->idem_key;
    s->done = done;
    s->arg = arg;
    s->item.run = job_submit_run;
    s->item.done = job_submit_done;
    s->item.arg = s;
    if (db_group_add(d, &s->item) < 0) {
        job_submit_free(s);
        return STORE_ERROR;
    }
    return STORE_OK;
}

static const char SQL_JOB_FAILURE[] =
    "UPDATE jobs SET failures = failures + 1 WHERE id = ? RETURNING failures, max_restarts";

int store_job_count_failure(db *d, int64_t job_id, int *failures, int *max_restarts) {
    db_stmt *st = db_prepare(d, SQL_JOB_FAILURE);
    if (!st) return -1;
    db_bind_int64(st, 1, job_id);
    int rc = db_step(st), ret = -1;
    if (rc == DB_ROW) {
        *failures = db_col_int(st, 0);
        *max_restarts = db_col_int(st, 1);
        ret = *failures <= *max_restarts;
    }
    db_done(st);
    return ret;
}

#define JOB_COLS                                                                              \
    "j.id, j.name, t.name, j.state, j.priority, j.attempt, j.max_restarts, j.workers,"       \
    " j.devices_per_worker, j.device, j.ps, j.workers_min, j.workers_now,"                   \
    " j.max_runtime_s, j.preemptible, j.reason,"                                              \
    " j.created_at, j.updated_at, j.started_at, j.finished_at, j.sweep_id, j.trial, u.name"

/* A job's JSON form, column by column of JOB_COLS: one table for the tree
 * (job_row, GET /jobs/{id}) and the text (job_row_write, the list). Kinds:
 * I integer, i integer or null, T text or null, B boolean, t a time (ms) or null; `in` names
 * the object the field sits in ("resources"), NULL at the top. */
typedef struct job_field {
    const char *key;
    char kind;
    const char *in;
} job_field;

static const job_field JOB_FIELDS[] = {
    {"id", 'I', NULL},           {"name", 'T', NULL},          {"team", 'T', NULL},
    {"state", 'T', NULL},        {"priority", 'I', NULL},      {"attempt", 'I', NULL},
    {"max_restarts", 'I', NULL}, {"workers", 'I', "resources"}, {"devices_per_worker", 'I', "resources"},
    {"device", 'T', "resources"}, {"ps", 'I', "resources"},
    {"workers_min", 'I', "resources"}, {"workers_now", 'I', "resources"}, {"max_runtime_s", 'I', NULL},
    {"preemptible", 'B', NULL},  {"reason", 'T', NULL},        {"created_at", 't', NULL},
    {"updated_at", 't', NULL},   {"started_at", 't', NULL},    {"finished_at", 't', NULL},
    {"sweep", 'i', NULL},        {"trial", 'i', NULL}, /* the sweep and trial it runs; null for a job of its own */
    {"user", 'T', NULL}, /* who submitted it; null: a team's service token or the admin */
};
#define JOB_NFIELDS ((int)(sizeof JOB_FIELDS / sizeof JOB_FIELDS[0]))

static cJSON *job_row(db_stmt *st) {
    cJSON *j = cJSON_CreateObject(), *in = NULL;
    for (int c = 0; c < JOB_NFIELDS; c++) {
        const job_field *f = &JOB_FIELDS[c];
        cJSON *o = j;
        if (f->in) {
            if (!in) in = cJSON_AddObjectToObject(j, f->in);
            o = in;
        }
        switch (f->kind) {
        case 'I': cJSON_AddNumberToObject(o, f->key, (double)db_col_int64(st, c)); break;
        case 'i':
            if (db_col_type(st, c) == DB_NULL) cJSON_AddNullToObject(o, f->key);
            else cJSON_AddNumberToObject(o, f->key, (double)db_col_int64(st, c));
            break;
        case 'B': cJSON_AddBoolToObject(o, f->key, db_col_int(st, c)); break;
        case 't': store_json_time(o, f->key, st, c); break;
        default: store_json_text(o, f->key, st, c); break;
        }
    }
    return j;
}

/* A text column as a JSON string, or null. */
static int write_text(buf *out, const char *t) { return t ? json_write_string(out, t) : buf_append(out, "null", 4); }

/* The same object as text, without its closing brace (the list adds
 * fields). 0, or -1 when out is full. */
static int job_row_write(buf *out, db_stmt *st) {
    int rc = buf_append(out, "{", 1);
    const char *in = NULL;
    for (int c = 0; rc == 0 && c < JOB_NFIELDS; c++) {
        const job_field *f = &JOB_FIELDS[c];
        if (in && f->in != in) rc |= buf_append(out, "}", 1); /* leaving "resources" */
        if (c) rc |= buf_append(out, ",", 1);
        if (f->in && f->in != in) { /* entering it */
            rc |= json_write_string(out, f->in);
            rc |= buf_append(out, ":{", 2);
        }
        in = f->in;
        rc |= json_write_string(out, f->key);
        rc |= buf_append(out, ":", 1);
        int null = db_col_type(st, c) == DB_NULL;
        switch (f->kind) {
        case 'I':
        case 'i': rc |= null ? buf_append(out, "null", 4) : json_write_int(out, db_col_int64(st, c)); break;
        case 'B': rc |= db_col_int(st, c) ? buf_append(out, "true", 4) : buf_append(out, "false", 5); break;
        case 't':
            if (null || db_col_int64(st, c) <= 0) {
                rc |= buf_append(out, "null", 4);
            } else {
                char t[25];
                store_time_text(t, db_col_int64(st, c));
                rc |= json_write_string(out, t);
            }
            break;
        default: rc |= write_text(out, db_col_text(st, c)); break;
        }
    }
    if (in) rc |= buf_append(out, "}", 1);
    return rc ? -1 : 0;
}

static const char SQL_JOB_GET[] =
    "SELECT " JOB_COLS ", j.spec FROM jobs j JOIN teams t ON t.id = j.team_id LEFT JOIN users u ON u.id = j.user_id"
    " WHERE j.id = ?1 AND (?2 = 0 OR j.team_id = ?2) AND j.deleted_at IS NULL";

int store_job_get(db *d, int64_t id, int64_t team_id, int with_spec, cJSON **out) {
    db_stmt *st = db_prepare(d, SQL_JOB_GET);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, id);
    db_bind_int64(st, 2, team_id);
    int rc = db_step(st);
    if (rc != DB_ROW) {
        db_done(st);
        return rc == DB_DONE ? STORE_NOT_FOUND : STORE_ERROR;
    }
    cJSON *j = job_row(st);
    if (with_spec) {
        const char *spec = db_col_text(st, JOB_NFIELDS);
        int n = db_col_bytes(st, JOB_NFIELDS);
        cJSON *s = spec ? cJSON_ParseWithLength(spec, (size_t)n) : NULL;
        if (s) cJSON_AddItemToObject(j, "spec", s);
        else cJSON_AddNullToObject(j, "spec");
    }
    db_done(st);
    *out = j;
    return STORE_OK;
}

static const char SQL_JOBS_LIST[] =
    "SELECT " JOB_COLS ", j.strategy, j.progress FROM jobs j JOIN teams t ON t.id = j.team_id"
    " LEFT JOIN users u ON u.id = j.user_id"
    " WHERE (?1 = 0 OR j.team_id = ?1) AND (?2 IS NULL OR j.state = ?2) AND (?3 = 0 OR j.id < ?3)"
    " AND (?5 IS NULL OR u.name = ?5) AND j.deleted_at IS NULL ORDER BY j.id DESC LIMIT ?4";

int store_jobs_list(db *d, int64_t team_id, const char *state, const char *user, int64_t before, int limit,
                    buf *out, int64_t *next) {
    db_stmt *st = db_prepare(d, SQL_JOBS_LIST);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, team_id);
    if (state) db_bind_text(st, 2, state, -1);
    if (user) db_bind_text(st, 5, user, -1);
    db_bind_int64(st, 3, before);
    db_bind_int(st, 4, limit + 1);
    int rc, n = 0, full = buf_append(out, "[", 1);
    int64_t last = 0;
    *next = 0;
    while ((rc = db_step(st)) == DB_ROW) {
        if (n == limit) {
            *next = last;
            continue;
        }
        last = db_col_int64(st, 0);
        /* the job, and what the dashboard's table shows beside its columns */
        if (n) full |= buf_append(out, ",", 1);
        full |= job_row_write(out, st);
        full |= buf_appends(out, ",\"strategy\":");
        full |= write_text(out, db_col_text(st, JOB_NFIELDS));
        const char *progress = db_col_text(st, JOB_NFIELDS + 1);
        size_t pl = stored_object(progress);
        full |= buf_appends(out, ",\"progress\":");
        full |= pl ? buf_append(out, progress, pl) : buf_append(out, "null", 4);
        full |= buf_append(out, "}", 1);
        n++;
    }
    db_done(st);
    full |= buf_append(out, "]", 1);
    if (rc != DB_DONE || full) return STORE_ERROR;
    return STORE_OK;
}

static const char SQL_JOB_OWNER[] =
    "SELECT j.team_id, j.user_id, u.name FROM jobs j LEFT JOIN users u ON u.id = j.user_id"
    " WHERE j.id = ? AND j.deleted_at IS NULL";
static const char SQL_SWEEP_OWNER[] =
    "SELECT s.team_id, s.user_id, u.name FROM sweeps s LEFT JOIN users u ON u.id = s.user_id WHERE s.id = ?";

int store_owner(db *d, int sweep, int64_t id, int64_t *team_id, int64_t *user_id, char user[64]) {
    db_stmt *st = db_prepare(d, sweep ? SQL_SWEEP_OWNER : SQL_JOB_OWNER);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, id);
    int rc = db_step(st);
    if (rc == DB_ROW) {
        *team_id = db_col_int64(st, 0);
        *user_id = db_col_int64(st, 1);
        const char *u = db_col_text(st, 2);
        snprintf(user, 64, "%s", u ? u : "");
    }
    db_done(st);
    return rc == DB_ROW ? STORE_OK : rc == DB_DONE ? STORE_NOT_FOUND : STORE_ERROR;
}

/* a deleted job (DELETE /jobs/{id}) is not found: it ended, so no
 * transition ever applies to it */
static const char SQL_JOB_STATE[] = "SELECT state, team_id FROM jobs WHERE id = ? AND deleted_at IS NULL";

int store_job_state(db *d, int64_t id, char state[16], int64_t *team_id) {
    db_stmt *st = db_prepare(d, SQL_JOB_STATE);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, id);
    int rc = db_step(st);
    int ret = rc == DB_ROW ? STORE_OK : rc == DB_DONE ? STORE_NOT_FOUND : STORE_ERROR;
    if (ret == STORE_OK) {
        const char *s = db_col_text(st, 0);
        snprintf(state, 16, "%s", s ? s : "");
        if (team_id) *team_id = db_col_int64(st, 1);
    }
    db_done(st);
    return ret;
}

/* The spec's idle_timeout as written (seconds, or a duration such as
 * "30m"), read in C: CAST(json_extract(...) AS INTEGER) made "30m" 30
 * seconds on SQLite, and ty_json_num made every string NULL (never culled)
 * on PostgreSQL. */
static const char SQL_IDLE_WATCHED[] =
    "SELECT j.id, json_extract(j.spec, '$.idle_timeout'),"
    " max(coalesce(j.started_at, 0), coalesce((SELECT max(t.started_at) FROM tasks t"
    "   WHERE t.job_id = j.id AND t.attempt = j.attempt), 0))"
    " FROM jobs j WHERE j.state = 'running' AND json_valid(j.spec)"
    " AND json_type(j.spec, '$.idle_timeout') IN ('integer', 'real', 'text') ORDER BY j.id";
static const char SQL_IDLE_WATCHED_PG[] =
    "SELECT j.id, ty_json_text(j.spec, '$.idle_timeout'),"
    " greatest(coalesce(j.started_at, 0), coalesce((SELECT max(t.started_at) FROM tasks t"
    "   WHERE t.job_id = j.id AND t.attempt = j.attempt), 0))"
    " FROM jobs j WHERE j.state = 'running' AND ty_json_valid(j.spec)"
    " AND ty_json_type(j.spec, '$.idle_timeout') IN ('integer', 'real', 'text') ORDER BY j.id";

int store_jobs_idle_watched(db *d, store_idle_job **out, int *n) {
    *out = NULL;
    *n = 0;
    db_stmt *st = db_prepare2(d, SQL_IDLE_WATCHED, SQL_IDLE_WATCHED_PG);
    if (!st) return STORE_ERROR;
    int rc, cap = 0;
    while ((rc = db_step(st)) == DB_ROW) {
        if (*n == cap) {
            cap = cap ? cap * 2 : 16;
            *out = xrealloc(*out, (size_t)cap * sizeof **out);
        }
        /* as jobspec.c reads it: a bare number is seconds, rounded up */
        const char *t = db_col_text(st, 1);
        int64_t ms = 0;
        if (!t || duration_parse_ms(t, 1e3, 1e15, &ms) < 0 || ms <= 0) continue;
        (*out)[(*n)++] = (store_idle_job){db_col_int64(st, 0), (ms + 999) / 1000, db_col_int64(st, 2)};
    }
    db_done(st);
    if (rc != DB_DONE) {
        free(*out);
        *out = NULL;
        *n = 0;
        return STORE_ERROR;
    }
    return STORE_OK;
}

static const char SQL_JOB_SET_STATE[] =
    "UPDATE jobs SET state = ?2, reason = ?3, updated_at = ?4,"
    " started_at = CASE WHEN ?2 = 'running' AND started_at IS NULL THEN ?4 ELSE started_at END,"
    " finished_at = CASE WHEN ?2 IN ('succeeded','failed','cancelled') THEN ?4 ELSE finished_at END,"
    " queued_at = CASE WHEN ?2 = 'queued' THEN ?4 ELSE queued_at END"
    " WHERE id = ?1 AND state = ?5";

int store_job_transition(db *d, int64_t id, const char *const *from, const char *to,
                         const char *actor, const char *reason) {
    char cur[16];
    int rc = store_job_state(d, id, cur, NULL);
    if (rc != STORE_OK) return rc;
    int allowed = 0;
    if (!from) {
        allowed = !store_is_terminal(cur);
    } else {
        for (const char *const *f = from; *f; f++)
            if (strcmp(*f, cur) == 0) allowed = 1;
    }
    if (!allowed) return STORE_CONFLICT;
    db_stmt *st = db_prepare(d, SQL_JOB_SET_STATE);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, id);
    db_bind_text(st, 2, to, -1);
    if (reason) db_bind_text(st, 3, reason, -1);
    db_bind_int64(st, 4, now_ms());
    db_bind_text(st, 5, cur, -1);
    int s = db_step(st);
    int changed = db_changes(d);
    db_done(st);
    if (s != DB_DONE) return STORE_ERROR;
    if (changed != 1) return STORE_CONFLICT;
    return event_insert(d, id, "state", cur, to, actor, reason);
}

static const char SQL_STOP_TASKS[] =
    "UPDATE tasks SET state = 'stopping', reason = ? WHERE job_id = ? AND state IN ('assigned','running')"
    " RETURNING node_id";

/* Each node with a task asked to stop is woken once the change commits
 * (db_wake_node): its agent learns of the stop at once. */
int store_job_stop_tasks(db *d, int64_t job_id, const char *why) {
    db_stmt *st = db_prepare(d, SQL_STOP_TASKS);
    if (!st) return STORE_ERROR;
    db_bind_text(st, 1, why, -1);
    db_bind_int64(st, 2, job_id);
    int rc;
    while ((rc = db_step(st)) == DB_ROW)
        if (db_col_type(st, 0) != DB_NULL) db_wake_node(d, db_col_int64(st, 0));
    db_done(st);
    return rc == DB_DONE ? STORE_OK : STORE_ERROR;
}

/* The capacity is computed from what each node has (its state, memory and
 * devices per kind), kept per db and read again only when the change log
 * says a node or a device changed (allocations do not count): a
 * submission costs a pass over the nodes in memory, not a scan of every
 * device row. Nodes not ready are read again each time (a heartbeat brings
 * a lost node back without a change noted). */
static const char SQL_CAP_NODES[] =
    "SELECT n.id, n.state = 'ready', n.memory_mb,"
    " (SELECT count(*) FROM devices v WHERE v.node_id = n.id AND v.kind = 'cpu'),"
    " (SELECT count(*) FROM devices v WHERE v.node_id = n.id AND v.kind = 'gpu')"
    " FROM nodes n ORDER BY n.id";
static const char SQL_CAP_STATE[] = "SELECT state = 'ready' FROM nodes WHERE id = ?";

typedef struct cap_node {
    int64_t id, mem;
    int ready, cpu, gpu;
} cap_node;

typedef struct cap_cache {
    pthread_mutex_t mu;
    int valid;
    uint64_t seq;                 /* the change log read up to here */
    cap_node *nodes;
    int n;
} cap_cache;

static void *cap_make(void) {
    cap_cache *c = xcalloc(1, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    return c;
}

static void cap_drop(void *p) {
    cap_cache *c = p;
    pthread_mutex_destroy(&c->mu);
    free(c->nodes);
    free(c);
}

/* The cache in step with the store (c->mu held): 0 or -1. */
static int cap_sync(db *d, cap_cache *c) {
    db_change *ch = NULL;
    size_t n = 0;
    uint64_t seq = c->seq;
    int reload = !c->valid || db_changes_read(d, &seq, &ch, &n);
    for (size_t k = 0; k < n && !reload; k++) reload = ch[k].table == DB_CH_NODE || ch[k].table == DB_CH_DEVICE;
    free(ch);
    if (reload) {
        c->valid = 0;
        c->seq = db_changes_head(d); /* a change during the read is read again next time */
        db_stmt *st = db_prepare(d, SQL_CAP_NODES);
        if (!st) return -1;
        int cap = 0, rc;
        c->n = 0;
        while ((rc = db_step(st)) == DB_ROW) {
            if (c->n == cap) {
                cap = cap ? cap * 2 : 256;
                c->nodes = xrealloc(c->nodes, (size_t)cap * sizeof *c->nodes);
            }
            c->nodes[c->n++] = (cap_node){db_col_int64(st, 0), db_col_int64(st, 2),
                                          db_col_int(st, 1), db_col_int(st, 3),
                                          db_col_int(st, 4)};
        }
        db_done(st);
        if (rc != DB_DONE) return -1;
        c->valid = 1;
        return 0;
    }
    c->seq = seq;
    for (int i = 0; i < c->n; i++) {
        if (c->nodes[i].ready) continue;
        db_stmt *st = db_prepare(d, SQL_CAP_STATE);
        if (!st) return -1;
        db_bind_int64(st, 1, c->nodes[i].id);
        int rc = db_step(st);
        if (rc == DB_ROW) c->nodes[i].ready = db_col_int(st, 0);
        db_done(st);
        if (rc != DB_ROW) { /* gone, or an error: read everything next time */
            c->valid = 0;
            return rc == DB_DONE ? cap_sync(d, c) : -1;
        }
    }
    return 0;
}

/* On top of the per-node cache above (a pass over the nodes in memory per
 * submission, plus a read of each node not ready), the answers themselves
 * are kept by (kind, per worker, memory) while cluster_nodes_version has
 * not moved, and a second at most (a node marked lost moves the version
 * before its commit): a burst of submissions costs one pass. Before either
 * existed, the query read every node and device row per submission (tens of
 * ms at 5,000 nodes, bench/cluster). TRAINYARD_CAPACITY_KEEP=0 keeps no
 * answers (the per-node cache stays). */
#define CAP_KEEP 16
#define CAP_KEEP_MS 1000
static struct {
    pthread_mutex_t mu;
    struct cap_kept {
        const db *owner;
        char kind[8];
        int per_worker;
        int64_t memory_mb;
        uint64_t version;
        int64_t at_ms;
        store_capacity c;
    } e[CAP_KEEP];
    int next;
} g_cap = {.mu = PTHREAD_MUTEX_INITIALIZER};

static int cap_query(db *d, const char *kind, int per_worker, int64_t memory_mb, store_capacity *out);

/* TRAINYARD_CAPACITY_KEEP=0: every submission queries, as before (bench/cluster). */
static int cap_keep_off(void) {
    static int off = -1;
    int o = __atomic_load_n(&off, __ATOMIC_RELAXED);
    if (o < 0) {
        const char *e = getenv("TRAINYARD_CAPACITY_KEEP");
        o = e && strcmp(e, "0") == 0;
        __atomic_store_n(&off, o, __ATOMIC_RELAXED);
    }
    return o;
}

int store_cluster_capacity(db *d, const char *kind, int per_worker, int64_t memory_mb, store_capacity *out) {
    if (cap_keep_off()) return cap_query(d, kind, per_worker, memory_mb, out);
    uint64_t v = cluster_nodes_version(); /* before the query: a change during it is a miss next time */
    int64_t now = mono_ms();
    pthread_mutex_lock(&g_cap.mu);
    for (int i = 0; i < CAP_KEEP; i++) {
        const struct cap_kept *k = &g_cap.e[i];
        if (k->owner == d && k->version == v && now - k->at_ms < CAP_KEEP_MS && k->per_worker == per_worker &&
            k->memory_mb == memory_mb && strcmp(k->kind, kind) == 0) {
            *out = k->c;
            pthread_mutex_unlock(&g_cap.mu);
            return STORE_OK;
        }
    }
    pthread_mutex_unlock(&g_cap.mu);
    int rc = cap_query(d, kind, per_worker, memory_mb, out);
    if (rc != STORE_OK || strlen(kind) >= sizeof g_cap.e[0].kind) return rc;
    pthread_mutex_lock(&g_cap.mu);
    struct cap_kept *k = &g_cap.e[g_cap.next];
    g_cap.next = (g_cap.next + 1) % CAP_KEEP;
    k->owner = d;
    snprintf(k->kind, sizeof k->kind, "%s", kind);
    k->per_worker = per_worker;
    k->memory_mb = memory_mb;
    k->version = v;
    k->at_ms = now;
    k->c = *out;
    pthread_mutex_unlock(&g_cap.mu);
    return rc;
}

static int cap_query(db *d, const char *kind, int per_worker, int64_t memory_mb, store_capacity *out) {
    memset(out, 0, sizeof *out);
    cap_cache *c = db_cache(d, DB_CACHE_CAPACITY, cap_make, cap_drop);
    if (!c) return STORE_ERROR;
    pthread_mutex_lock(&c->mu);
    if (cap_sync(d, c) < 0) {
        c->valid = 0;
        pthread_mutex_unlock(&c->mu);
        return STORE_ERROR;
    }
    int gpu = strcmp(kind, "gpu") == 0, cpu = strcmp(kind, "cpu") == 0;
    int pw = per_worker > 0 ? per_worker : 1;
    for (int i = 0; i < c->n; i++) {
        const cap_node *nd = &c->nodes[i];
        if (!nd->ready) continue;
        int k = gpu ? nd->gpu : cpu ? nd->cpu : 0;
        out->nodes++;
        if (k > out->largest) out->largest = k;
        out->total += k;
        out->cpu_total += nd->cpu;
        out->workers_fit += k / pw;
        out->mem_nodes += nd->mem > 0;
        if (k >= pw && nd->mem > out->mem_largest) out->mem_largest = nd->mem;
        out->mem_hold += k >= pw && (nd->mem == 0 || memory_mb <= 0 || nd->mem >= memory_mb);
        int64_t byw = k / pw;
        if (nd->mem > 0 && memory_mb > 0 && nd->mem / memory_mb < byw) byw = nd->mem / memory_mb;
        out->mem_workers_fit += (int)byw;
    }
    pthread_mutex_unlock(&c->mu);
    return STORE_OK;
}
