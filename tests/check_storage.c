/* check_storage.c - the store on real database files: migrations from
 * an empty file and from every earlier version, tokens stored hashed only,
 * jobs and their timeline, state transitions and their conflicts. With
 * TY_PG_URL (tests/pg_fixture.h) the same cases run on PostgreSQL, each on a
 * fresh database, holding the lease; those about SQLite itself (its file,
 * WAL, checkpointer, resident mapping, migrations 1..17) say SKIP there, and
 * the fence has a case of its own. */
#include <sqlite3.h>
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <pthread.h>
#include <stdint.h>

#include "../spec/jobspec.h"
#include "../common/util.h"
#include "../storage/cluster.h"
#include <sys/stat.h>

#include "../storage/blob_meta.h"
#include "../storage/db.h"
#include "../storage/exec_store.h"
#include "../storage/store.h"
#include "../storage/sweep_store.h"
#include "pg_fixture.h"
#include "db_fixture.h"

static char g_dir[256];
static char g_path[512];

static void setup(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/ty_storage_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(g_dir));
    if (ty_pg_url()) ty_pg_new_db(g_path, sizeof g_path);
    else snprintf(g_path, sizeof g_path, "%s/t.db", g_dir);
}

/* On PostgreSQL, a case about SQLite itself says why it does not run. */
static int sqlite_only(const char *test, const char *why) {
    if (!ty_pg_url()) return 0;
    printf("SKIP %s on PostgreSQL: %s\n", test, why);
    fflush(stdout);
    return 1;
}

static void teardown(void) {
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* One number from sql (a string constant: db_prepare keeps it by its
 * address), with ?1 bound to text when text is not NULL and ?2 to id. */
static long count2(db *d, const char *sql, const char *text, int64_t id) {
    db_stmt *st = db_prepare(d, sql);
    ck_assert_ptr_nonnull(st);
    if (text) ck_assert_int_eq(db_bind_text(st, 1, text, -1), 0);
    if (id) ck_assert_int_eq(db_bind_int64(st, 2, id), 0);
    ck_assert_int_eq(db_step(st), DB_ROW);
    long n = (long)db_col_int64(st, 0);
    db_done(st);
    return n;
}

static long count(db *d, const char *sql) { return count2(d, sql, NULL, 0); }

static const char SPEC[] =
    "{\"name\":\"t\",\"model\":{\"layers\":[{\"type\":\"dense\",\"units\":1,\"activation\":\"sigmoid\","
    "\"input_shape\":[10]}]},\"compile\":{\"optimizer\":\"sgd\",\"loss\":\"binary_crossentropy\"},"
    "\"data\":{\"source\":\"synthetic\",\"features\":10}}";

static int64_t submit(db *d, int64_t team) {
    jobspec spec;
    spec_error e;
    ck_assert_msg(jobspec_parse(SPEC, strlen(SPEC), &spec, &e) == 0, "%s: %s", e.field, e.message);
    int64_t id = 0;
    store_new_job row = {.name = spec.name, .priority = spec.priority, .max_restarts = spec.max_restarts,
                         .workers = spec.resources.workers,
                         .devices_per_worker = spec.resources.devices_per_worker, .ps = spec.resources.ps,
                         .device = device_kind_name(spec.resources.device),
                         .max_runtime_s = spec.max_runtime_s, .preemptible = spec.preemptible};
    ck_assert_int_eq(store_job_insert(d, team, SPEC, strlen(SPEC), &row, "team:default", &id), STORE_OK);
    return id;
}

START_TEST(migrate_empty_file) {
    db *d = NULL;
    char err[256];
    ck_assert_int_eq(db_open(&d, g_path, err, sizeof err), 0);
    ck_assert_int_eq(db_version(d), db_migrations_count());
    ck_assert_int_eq(count(d, "SELECT count(*) FROM schema_migrations"), db_migrations_count());
    if (!ty_pg_url()) { /* SQLite's settings: WAL, foreign keys */
        sqlite3_stmt *st = NULL;
        sqlite3_prepare_v2(db_sqlite(d), "PRAGMA journal_mode", -1, &st, NULL);
        ck_assert_int_eq(sqlite3_step(st), SQLITE_ROW);
        ck_assert_str_eq((const char *)sqlite3_column_text(st, 0), "wal");
        sqlite3_finalize(st);
        ck_assert_int_eq(count(d, "PRAGMA foreign_keys"), 1);
    }
    db_close(d);
    /* Opening again is a no-op. */
    ck_assert_int_eq(db_open(&d, g_path, err, sizeof err), 0);
    ck_assert_int_eq(count(d, "SELECT count(*) FROM schema_migrations"), db_migrations_count());
    db_close(d);
}
END_TEST

/* From every earlier version k: a database left at k with data in it moves
 * to the newest version and keeps its data. */
START_TEST(migrate_from_every_version) {
    if (sqlite_only("migrate_from_every_version", "versions 1..17 exist only as SQLite's history (a PostgreSQL"
                    " database starts at the baseline, version 18)")) return;
    for (int k = 1; k < db_migrations_count(); k++) {
        unlink(g_path);
        db *d = NULL;
        char err[256];
        ck_assert_int_eq(db_open_at(&d, g_path, k, err, sizeof err), 0);
        ck_assert_int_eq(db_version(d), k);
        int64_t team = 0;
        ck_assert_int_eq(store_team_create(d, "default", &team), STORE_OK);
        /* Version-1 columns only, so the insert works at every k. */
        sqlite3_stmt *st = NULL;
        ck_assert_int_eq(sqlite3_prepare_v2(db_sqlite(d),
                                            "INSERT INTO jobs(team_id,name,spec,state,priority,max_restarts,"
                                            "workers,devices_per_worker,device,max_runtime_s,created_at,updated_at)"
                                            " VALUES(?, 'old', '{}', 'queued', 50, 3, 2, 1, 'cpu', 60, 1000, 1000)",
                                            -1, &st, NULL),
                         SQLITE_OK);
        sqlite3_bind_int64(st, 1, team);
        ck_assert_int_eq(sqlite3_step(st), SQLITE_DONE);
        sqlite3_finalize(st);
        db_close(d);

        ck_assert_int_eq(db_open(&d, g_path, err, sizeof err), 0);
        ck_assert_int_eq(db_version(d), db_migrations_count());
        ck_assert_int_eq(count(d, "SELECT count(*) FROM jobs WHERE name = 'old' AND workers = 2"), 1);
        if (k < 2) {
            /* Migration 2 back-fills queued_at and gives teams a weight. */
            ck_assert_int_eq(count(d, "SELECT count(*) FROM jobs WHERE queued_at = 1000"), 1);
            ck_assert_int_eq(count(d, "SELECT count(*) FROM teams WHERE weight = 1.0"), 1);
        }
        int64_t id = submit(d, team);
        ck_assert_int_gt(id, 1);
        db_close(d);
    }
}
END_TEST

/* Migration 8 rebuilds tasks (type 'evaluator' allowed): a task holding a
 * device at version 7 keeps its id, columns and allocation, and an
 * evaluator task can be stored only after it. */
START_TEST(migrate_tasks_keeps_allocations) {
    if (sqlite_only("migrate_tasks_keeps_allocations", "migration 8 of a SQLite file (PostgreSQL starts at 18)")) return;
    unlink(g_path);
    db *d = NULL;
    char err[256];
    ck_assert_int_eq(db_open_at(&d, g_path, 7, err, sizeof err), 0);
    int64_t team = 0;
    ck_assert_int_eq(store_team_create(d, "default", &team), STORE_OK);
    /* a job as a version-7 server wrote it (store_job_insert writes today's columns) */
    char jsql[512];
    snprintf(jsql, sizeof jsql,
             "INSERT INTO jobs(team_id, name, spec, state, priority, attempt, max_restarts, workers,"
             " devices_per_worker, device, ps, max_runtime_s, preemptible, queue_if_infeasible, reason,"
             " created_at, updated_at, queued_at, strategy, memory_mb)"
             " VALUES(%lld, 'j', '{}', 'queued', 50, 0, 3, 1, 1, 'cpu', 0, 60, 0, 0, 'waiting', 1, 1, 1, 'default', 0)",
             (long long)team);
    ck_assert_int_eq(sqlite3_exec(db_sqlite(d), jsql, NULL, NULL, NULL), SQLITE_OK);
    int64_t job = sqlite3_last_insert_rowid(db_sqlite(d));
    static const char *const setup[] = {
        "INSERT INTO nodes(id, hostname, address, cpu_slots, state, registered_at, last_heartbeat_at, memory_mb)"
        " VALUES(5, 'n5', '127.0.0.1', 2, 'ready', 1, 1, 4096)",
        "INSERT INTO devices(id, node_id, kind, idx) VALUES(9, 5, 'cpu', 0)",
        "INSERT INTO tasks(id, job_id, attempt, type, idx, node_id, port, state, created_at, token_hash, memory_mb)"
        " VALUES(42, ?1, 1, 'worker', 0, 5, 7001, 'running', 1, 'abc', 2048)",
        "INSERT INTO allocations(device_id, task_id, job_id) VALUES(9, 42, ?1)",
    };
    for (size_t i = 0; i < sizeof setup / sizeof setup[0]; i++) {
        sqlite3_stmt *st = NULL;
        ck_assert_int_eq(sqlite3_prepare_v2(db_sqlite(d), setup[i], -1, &st, NULL), SQLITE_OK);
        if (sqlite3_bind_parameter_count(st) > 0) sqlite3_bind_int64(st, 1, job);
        ck_assert_int_eq(sqlite3_step(st), SQLITE_DONE);
        sqlite3_finalize(st);
    }
    ck_assert_int_ne(sqlite3_exec(db_sqlite(d), "INSERT INTO tasks(job_id, attempt, type, idx, node_id, port, state,"
                                  " created_at) VALUES(1, 1, 'evaluator', 0, 5, 0, 'assigned', 1)", NULL, NULL, NULL),
                     SQLITE_OK);
    db_close(d);
    ck_assert_int_eq(db_open(&d, g_path, err, sizeof err), 0);
    ck_assert_int_eq(db_version(d), db_migrations_count());
    ck_assert_int_eq(count(d, "SELECT count(*) FROM tasks WHERE id = 42 AND type = 'worker' AND port = 7001"
                              " AND state = 'running' AND token_hash = 'abc' AND memory_mb = 2048"), 1);
    ck_assert_int_eq(count(d, "SELECT count(*) FROM allocations WHERE device_id = 9 AND task_id = 42"), 1);
    ck_assert_int_eq(count(d, "SELECT count(*) FROM pragma_foreign_key_check"), 0);
    ck_assert_int_eq(count(d, "SELECT count(*) FROM sqlite_master WHERE name IN ('tasks_node_state', 'tasks_job')"), 2);
    char sql[256];
    snprintf(sql, sizeof sql, "INSERT INTO tasks(job_id, attempt, type, idx, node_id, port, state, created_at)"
             " VALUES(%lld, 1, 'evaluator', 0, 5, 0, 'assigned', 1)", (long long)job);
    ck_assert_int_eq(sqlite3_exec(db_sqlite(d), sql, NULL, NULL, NULL), SQLITE_OK);
    ck_assert_int_ne(sqlite3_exec(db_sqlite(d), "DELETE FROM tasks WHERE id = 42", NULL, NULL, NULL), SQLITE_OK);
    db_close(d);
}
END_TEST

START_TEST(refuses_newer_schema) {
    db *d = NULL;
    char err[256];
    ck_assert_int_eq(db_open(&d, g_path, err, sizeof err), 0);
    ck_assert_int_eq(db_exec(d, "INSERT INTO schema_migrations VALUES(999, 'future', 0)"), 0);
    db_close(d);
    ck_assert_int_eq(db_open(&d, g_path, err, sizeof err), -1);
    ck_assert_ptr_null(d);
    ck_assert_msg(strstr(err, "newer") != NULL, "%s", err);
}
END_TEST

START_TEST(not_a_database) {
    if (sqlite_only("not_a_database", "a file that is not SQLite's (a PostgreSQL URL names no file)")) return;
    FILE *f = fopen(g_path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("this is not a database, just text that is long enough to be a header............\n", f);
    fclose(f);
    db *d = NULL;
    char err[256];
    ck_assert_int_eq(db_open(&d, g_path, err, sizeof err), -1);
    ck_assert_ptr_null(d);
}
END_TEST

START_TEST(tokens_hashed) {
    db *d = NULL;
    ty_db_open_leading(&d, g_path);
    int64_t team = 0;
    ck_assert_int_eq(store_team_create(d, "vision", &team), STORE_OK);
    char tok[64];
    ck_assert_int_eq(random_token(tok, sizeof tok), 0);
    ck_assert_int_eq(strlen(tok), 46);
    ck_assert_int_eq(store_token_add(d, tok, TOKEN_TEAM, team, 0), STORE_OK);
    principal who;
    ck_assert_int_eq(store_token_lookup(d, tok, &who), STORE_OK);
    ck_assert_int_eq(who.kind, TOKEN_TEAM);
    ck_assert_int_eq(who.team_id, team);
    ck_assert_str_eq(who.team, "vision");
    /* The token itself is nowhere in the database, only its sha256. */
    ck_assert_int_eq(count2(d, "SELECT count(*) FROM tokens WHERE hash = ?1", tok, 0), 0);
    char h[65];
    sha256_hex(tok, strlen(tok), h);
    ck_assert_int_eq(count2(d, "SELECT count(*) FROM tokens WHERE hash = ?1", h, 0), 1);
    tok[5] ^= 1;
    ck_assert_int_eq(store_token_lookup(d, tok, &who), STORE_NOT_FOUND);
    ck_assert_int_eq(store_team_create(d, "vision", NULL), STORE_CONFLICT);
    db_close(d);
}
END_TEST

/* store_jobs_list writes JSON text: parsed, each object must also be the
 * same as store_job_get's (less the spec) plus strategy and progress. */
static cJSON *list_jobs(db *d, int64_t team, const char *state, int64_t before, int limit, int64_t *next) {
    buf b;
    buf_init(&b, 1u << 20);
    ck_assert_int_eq(store_jobs_list(d, team, state, NULL, before, limit, &b, next), STORE_OK);
    cJSON *arr = cJSON_Parse(b.data);
    ck_assert_msg(cJSON_IsArray(arr), "not a JSON array: %s", b.data);
    buf_release(&b);
    cJSON *j;
    cJSON_ArrayForEach(j, arr) {
        cJSON *one = NULL;
        ck_assert_int_eq(store_job_get(d, (int64_t)cJSON_GetObjectItem(j, "id")->valuedouble, 0, 0, &one), STORE_OK);
        cJSON *copy = cJSON_Duplicate(j, 1);
        cJSON_DeleteItemFromObject(copy, "strategy");
        cJSON_DeleteItemFromObject(copy, "progress");
        char *a = cJSON_PrintUnformatted(copy), *g = cJSON_PrintUnformatted(one);
        ck_assert_msg(strcmp(a, g) == 0, "list %s\nget  %s", a, g);
        ck_assert(cJSON_IsString(cJSON_GetObjectItem(j, "strategy")));
        ck_assert_ptr_nonnull(cJSON_GetObjectItem(j, "progress"));
        free(a);
        free(g);
        cJSON_Delete(copy);
        cJSON_Delete(one);
    }
    return arr;
}

START_TEST(job_lifecycle_and_events) {
    db *d = NULL;
    ty_db_open_leading(&d, g_path);
    int64_t a = 0, b = 0;
    ck_assert_int_eq(store_team_create(d, "a", &a), STORE_OK);
    ck_assert_int_eq(store_team_create(d, "b", &b), STORE_OK);
    int64_t j1 = submit(d, a), j2 = submit(d, b);
    cJSON *o = NULL;
    ck_assert_int_eq(store_job_get(d, j1, a, 1, &o), STORE_OK);
    ck_assert_str_eq(cJSON_GetObjectItem(o, "state")->valuestring, "queued");
    ck_assert_str_eq(cJSON_GetObjectItem(o, "team")->valuestring, "a");
    ck_assert(cJSON_IsObject(cJSON_GetObjectItem(o, "spec")));
    cJSON_Delete(o);
    ck_assert_int_eq(store_job_get(d, j2, a, 0, &o), STORE_NOT_FOUND); /* other team */
    ck_assert_int_eq(store_job_get(d, j2, 0, 0, &o), STORE_OK);        /* admin scope */
    cJSON_Delete(o);

    static const char *const from_queued[] = {"queued", NULL};
    ck_assert_int_eq(store_job_transition(d, j1, from_queued, "starting", "scheduler", "placed"), STORE_OK);
    ck_assert_int_eq(store_job_transition(d, j1, from_queued, "starting", "scheduler", "again"), STORE_CONFLICT);
    ck_assert_int_eq(store_job_transition(d, j1, NULL, "cancelled", "team:a", "user"), STORE_OK);
    ck_assert_int_eq(store_job_transition(d, j1, NULL, "cancelled", "team:a", "twice"), STORE_CONFLICT);
    ck_assert_int_eq(store_job_transition(d, 999, NULL, "cancelled", "team:a", "none"), STORE_NOT_FOUND);

    cJSON *ev = NULL;
    ck_assert_int_eq(store_job_events(d, j1, 0, 100, &ev), STORE_OK);
    ck_assert_int_eq(cJSON_GetArraySize(ev), 3);
    cJSON *last = cJSON_GetArrayItem(ev, 2);
    ck_assert_str_eq(cJSON_GetObjectItem(last, "from")->valuestring, "starting");
    ck_assert_str_eq(cJSON_GetObjectItem(last, "to")->valuestring, "cancelled");
    ck_assert_str_eq(cJSON_GetObjectItem(last, "actor")->valuestring, "team:a");
    ck_assert_str_eq(cJSON_GetObjectItem(last, "reason")->valuestring, "user");
    cJSON_Delete(ev);

    ck_assert_int_eq(store_job_get(d, j1, 0, 0, &o), STORE_OK);
    ck_assert(cJSON_IsString(cJSON_GetObjectItem(o, "finished_at")));
    cJSON_Delete(o);

    /* Listing: newest first, by state, paging with a cursor. */
    for (int i = 0; i < 5; i++) submit(d, a);
    int64_t next = 0;
    cJSON *arr = list_jobs(d, a, "queued", 0, 3, &next);
    ck_assert_int_eq(cJSON_GetArraySize(arr), 3);
    int first = (int)cJSON_GetObjectItem(cJSON_GetArrayItem(arr, 0), "id")->valuedouble;
    int third = (int)cJSON_GetObjectItem(cJSON_GetArrayItem(arr, 2), "id")->valuedouble;
    ck_assert_int_gt(first, third);
    ck_assert_int_eq(next, third);
    cJSON_Delete(arr);
    arr = list_jobs(d, a, "queued", next, 3, &next);
    ck_assert_int_eq(cJSON_GetArraySize(arr), 2);
    ck_assert_int_eq(next, 0);
    cJSON_Delete(arr);
    arr = list_jobs(d, a, "cancelled", 0, 10, &next);
    ck_assert_int_eq(cJSON_GetArraySize(arr), 1);
    cJSON_Delete(arr);
    db_close(d);
}
END_TEST

/* A statement from the cache works across many calls and threads reuse
 * pooled connections. */
static void *thread_reads(void *p) {
    db *d = p;
    for (int i = 0; i < 200; i++) {
        int64_t id;
        if (store_team_find(d, "default", &id) != STORE_OK) return (void *)1;
    }
    return NULL;
}

START_TEST(threads_share_the_pool) {
    db *d = NULL;
    ty_db_open_leading(&d, g_path);
    ck_assert_int_eq(store_team_create(d, "default", NULL), STORE_OK);
    for (int round = 0; round < 5; round++) {
        pthread_t t[4];
        for (int i = 0; i < 4; i++) ck_assert_int_eq(pthread_create(&t[i], NULL, thread_reads, d), 0);
        for (int i = 0; i < 4; i++) {
            void *r;
            pthread_join(t[i], &r);
            ck_assert_ptr_null(r);
        }
    }
    db_close(d);
}
END_TEST

/* db_generation changes after every commit of the db's connections, from
 * any thread, and not on a read or a rolled-back write; what is kept on it
 * (the token lookups of store_token_lookup) never outlives a commit: a
 * revoked token is refused on the next lookup, on the thread that had it
 * and on another. */
static void *thread_writes(void *arg) {
    db *d = arg;
    return store_team_create(d, "from-a-thread", NULL) == STORE_OK ? NULL : (void *)1;
}

static void *thread_lookup(void *arg) {
    void **a = arg;
    principal who;
    return (void *)(intptr_t)store_token_lookup(a[0], a[1], &who);
}

static void exec_sql(db *d, const char *sql) { ck_assert_msg(db_exec(d, sql) == 0, "%s: %s", sql, db_errmsg(d)); }

/* The changes read since from: 0 with them in ch/n, or 1 for a gap. */
static int changes(db *d, uint64_t *from, db_change **ch, size_t *n) {
    free(*ch);
    *ch = NULL;
    return db_changes_read(d, from, ch, n);
}

static int has_change(const db_change *ch, size_t n, int table, int64_t id) {
    for (size_t i = 0; i < n; i++)
        if (ch[i].table == table && ch[i].id == id) return 1;
    return 0;
}

/* The change log the scheduler's mirror follows: a change is published
 * once committed (from any thread, in a transaction or not), never before,
 * and never when rolled back (whole or to a savepoint); heartbeats are not
 * changes; the writers of nodes and node_failures note theirs; a bulk
 * transaction or a reader left too far behind gets a gap (reload). */
START_TEST(changes_follow_commits) {
    db *d = NULL;
    ty_db_open_leading(&d, g_path);
    int64_t team = 0;
    ck_assert_int_eq(store_team_create(d, "vision", &team), STORE_OK);
    uint64_t from = db_changes_head(d);
    db_change *ch = NULL;
    size_t n = 0;
    ck_assert_int_eq(changes(d, &from, &ch, &n), 0);
    ck_assert_uint_eq(n, 0);
    /* a write committed by store_job_insert: the job's row */
    int64_t id = submit(d, team);
    ck_assert_int_eq(changes(d, &from, &ch, &n), 0);
    ck_assert(has_change(ch, n, DB_CH_JOB, id));
    /* a write outside any transaction (autocommit), from another thread */
    pthread_t t;
    void *r;
    ck_assert_int_eq(pthread_create(&t, NULL, thread_writes, d), 0);
    pthread_join(t, &r);
    ck_assert_ptr_null(r);
    ck_assert_int_eq(changes(d, &from, &ch, &n), 0);
    ck_assert_uint_ge(n, 1);
    ck_assert_int_eq(ch[0].table, DB_CH_TEAM);
    /* in a transaction: nothing until the commit */
    ck_assert_int_eq(db_begin(d), 0);
    ck_assert_int_eq(cluster_job_set_reason(d, id, "waiting"), 0);
    ck_assert_int_eq(changes(d, &from, &ch, &n), 0);
    ck_assert_uint_eq(n, 0);
    ck_assert_int_eq(db_commit(d), 0);
    ck_assert_int_eq(changes(d, &from, &ch, &n), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert(has_change(ch, n, DB_CH_JOB, id));
    /* rolled back: nothing */
    ck_assert_int_eq(db_begin(d), 0);
    ck_assert_int_eq(store_job_transition(d, id, NULL, "cancelled", "test", "x"), STORE_OK);
    db_rollback(d);
    ck_assert_int_eq(changes(d, &from, &ch, &n), 0);
    ck_assert_uint_eq(n, 0);
    /* a savepoint rolled back: only what stays */
    int64_t node = 0;
    int gpu[2] = {0, 1};
    ck_assert_int_eq(cluster_node_upsert(d, "n1", "10.0.0.1", 1, 2, gpu, NULL, NULL, 0, NULL, 1000, &node, NULL), 0);
    ck_assert_int_eq(changes(d, &from, &ch, &n), 0);
    ck_assert(has_change(ch, n, DB_CH_NODE, node));      /* noted by its writer */
    ck_assert_uint_ge(n, 4);                              /* and its three devices */
    ck_assert_int_eq(db_begin(d), 0);
    exec_sql(d, "SAVEPOINT sp");
    size_t mark = db_changes_mark(d);
    ck_assert_int_eq(cluster_failure_add(d, id, node), 0);
    exec_sql(d, "ROLLBACK TO sp");
    db_changes_rewind(d, mark);
    exec_sql(d, "RELEASE sp");
    ck_assert_int_eq(cluster_team_set_usage(d, team, 1.5, 2000), 0);
    ck_assert_int_eq(db_commit(d), 0);
    ck_assert_int_eq(changes(d, &from, &ch, &n), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert(has_change(ch, n, DB_CH_TEAM, team));
    /* heartbeats are not changes; a drain is */
    ck_assert_int_eq(cluster_node_heartbeat(d, node, 5000), 0);
    ck_assert_int_eq(changes(d, &from, &ch, &n), 0);
    ck_assert_uint_eq(n, 0);
    ck_assert_int_eq(cluster_node_drain(d, node, 1, NULL), 0);
    ck_assert_int_eq(changes(d, &from, &ch, &n), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert(has_change(ch, n, DB_CH_NODE, node));
    /* a bulk transaction publishes "everything": the reader reloads */
    ck_assert_int_eq(db_begin(d), 0);
    exec_sql(d, "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 70000)"
                " INSERT INTO teams(name, created_at) SELECT 'bulk' || x, 0 FROM c");
    ck_assert_int_eq(db_commit(d), 0);
    ck_assert_int_eq(changes(d, &from, &ch, &n), 1);
    ck_assert_int_eq(changes(d, &from, &ch, &n), 0);
    /* a reader left behind by more than the log holds: a gap */
    uint64_t behind = from;
    for (int k = 0; k < 4; k++) exec_sql(d, "UPDATE teams SET weight = weight + 1 WHERE name LIKE 'bulk%'"
                                            " AND id % 2 = 0");
    ck_assert_int_eq(changes(d, &behind, &ch, &n), 1);
    ck_assert_int_eq(changes(d, &from, &ch, &n), 1);
    free(ch);
    db_close(d);
}
END_TEST

START_TEST(generation_follows_commits) {
    db *d = NULL, *d2 = NULL;
    char err[256];
    ty_db_open_leading(&d, g_path);
    int64_t team = 0;
    ck_assert_int_eq(store_team_create(d, "vision", &team), STORE_OK);
    uint64_t g0 = db_generation(d);
    ck_assert_uint_ne(g0, 0);
    /* reads leave it */
    int64_t found = 0;
    ck_assert_int_eq(store_team_find(d, "vision", &found), STORE_OK);
    ck_assert_int_eq(count(d, "SELECT count(*) FROM jobs"), 0);
    ck_assert_uint_eq(db_generation(d), g0);
    /* a write in this thread, one in another, and a transaction rolled back */
    int64_t id = submit(d, team);
    uint64_t g1 = db_generation(d);
    ck_assert_uint_ne(g1, g0);
    pthread_t t;
    void *r;
    ck_assert_int_eq(pthread_create(&t, NULL, thread_writes, d), 0);
    pthread_join(t, &r);
    ck_assert_ptr_null(r);
    uint64_t g2 = db_generation(d);
    ck_assert_uint_ne(g2, g1);
    ck_assert_int_eq(db_begin(d), 0);
    ck_assert_int_eq(store_job_transition(d, id, NULL, "cancelled", "test", "x"), STORE_OK);
    db_rollback(d);
    ck_assert_uint_eq(db_generation(d), g2);
    /* another db (here on the same file) never shares its numbers */
    ck_assert_int_eq(db_open(&d2, g_path, err, sizeof err), 0);
    ck_assert_uint_ne(db_generation(d2), db_generation(d));
    db_close(d2);

    /* a token found, and found again (kept), until it is revoked */
    char tok[64];
    ck_assert_int_eq(random_token(tok, sizeof tok), 0);
    ck_assert_int_eq(store_token_add(d, tok, TOKEN_TEAM, team, 0), STORE_OK);
    principal who;
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(store_token_lookup(d, tok, &who), STORE_OK);
        ck_assert_int_eq(who.team_id, team);
        ck_assert_str_eq(who.team, "vision");
    }
    void *args[2] = {d, tok};
    ck_assert_int_eq(pthread_create(&t, NULL, thread_lookup, args), 0);
    pthread_join(t, &r);
    ck_assert_int_eq((int)(intptr_t)r, STORE_OK);
    char h[65], sql[200];
    sha256_hex(tok, strlen(tok), h);
    snprintf(sql, sizeof sql, "UPDATE tokens SET revoked_at = 1 WHERE hash = '%s'", h);
    exec_sql(d, sql);
    ck_assert_int_eq(store_token_lookup(d, tok, &who), STORE_NOT_FOUND);
    ck_assert_int_eq(pthread_create(&t, NULL, thread_lookup, args), 0);
    pthread_join(t, &r);
    ck_assert_int_eq((int)(intptr_t)r, STORE_NOT_FOUND);
    /* a team renamed: the principal's team name follows at once */
    char tok2[64];
    ck_assert_int_eq(random_token(tok2, sizeof tok2), 0);
    ck_assert_int_eq(store_token_add(d, tok2, TOKEN_TEAM, team, 0), STORE_OK);
    ck_assert_int_eq(store_token_lookup(d, tok2, &who), STORE_OK);
    ck_assert_str_eq(who.team, "vision");
    exec_sql(d, "UPDATE teams SET name = 'sight' WHERE name = 'vision'");
    ck_assert_int_eq(store_token_lookup(d, tok2, &who), STORE_OK);
    ck_assert_str_eq(who.team, "sight");
    db_close(d);
}
END_TEST

/* ---------------------------------------------------------------- group commit */

typedef struct grp_done {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n;                        /* submissions answered */
    int rc[3];
    int64_t id[3];
    char name[3][16];             /* the answer's job name */
} grp_done;

typedef struct grp_arg {
    grp_done *g;
    int k;
} grp_arg;

static void grp_on_done(void *arg, int rc, int64_t id, cJSON *job) {
    grp_arg *a = arg;
    grp_done *g = a->g;
    pthread_mutex_lock(&g->mu);
    g->rc[a->k] = rc;
    g->id[a->k] = id;
    const cJSON *n = cJSON_GetObjectItem(job, "name");
    snprintf(g->name[a->k], sizeof g->name[a->k], "%s", cJSON_IsString(n) ? n->valuestring : "");
    g->n++;
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
    cJSON_Delete(job);
}

/* Submissions queued while the write turn is taken form one batch; one of
 * them fails (a team that does not exist: its foreign key), and only its
 * own savepoint is rolled back: the others commit, each answered with its
 * own id and job, and the failed one left nothing. */
/* Locked memory of this process (VmLck), KiB. */
static long vm_locked_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    ck_assert_ptr_nonnull(f);
    char line[256];
    long kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmLck: %ld kB", &kb) == 1) break;
    fclose(f);
    return kb;
}

static long file_kb(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long)(st.st_size / 1024) : 0;
}

/* The database file and its WAL are kept in memory as they grow (the
 * checkpointer thread locks them within a second), and let go at close. */
START_TEST(database_kept_resident) {
    if (sqlite_only("database_kept_resident", "the mlock'ed mapping of SQLite's file and WAL")) return;
    db_set_resident_max_mb(64);
    long before = vm_locked_kb();
    db *d = NULL;
    char err[256];
    ck_assert_int_eq(db_open(&d, g_path, err, sizeof err), 0);
    for (int i = 0; i < 100; i++) {
        char name[64];
        int64_t id;
        snprintf(name, sizeof name, "team-%d-with-a-longer-name", i);
        ck_assert_int_eq(store_team_create(d, name, &id), STORE_OK);
    }
    char wal[600];
    snprintf(wal, sizeof wal, "%s-wal", g_path);
    long want = 0, got = 0;
    for (int i = 0; i < 25; i++) {
        want = (file_kb(g_path) + file_kb(wal)) / 4 * 4 - 8; /* whole pages, less the last one of each */
        got = vm_locked_kb() - before;
        if (want > 32 && got >= want) break;
        usleep(100 * 1000);
    }
    ck_assert_msg(want > 32 && got >= want, "%ld KiB locked for %ld KiB of database and WAL (%ld + %ld)", got, want,
                  file_kb(g_path), file_kb(wal));
    db_close(d);
    ck_assert_int_eq(vm_locked_kb(), before);
    db_set_resident_max_mb(2048);
}
END_TEST

START_TEST(group_commit_isolates_a_failed_write) {
    db *d = NULL;
    ty_db_open_leading(&d, g_path);
    int64_t team = 0;
    ck_assert_int_eq(store_team_create(d, "vision", &team), STORE_OK);
    uint64_t auth0 = db_auth_generation(d);
    grp_done g;
    memset(&g, 0, sizeof g);
    pthread_mutex_init(&g.mu, NULL);
    pthread_cond_init(&g.cv, NULL);
    grp_arg args[3] = {{&g, 0}, {&g, 1}, {&g, 2}};
    const char *names[3] = {"first", "orphan", "third"};
    int64_t teams[3] = {team, team + 1000, team};
    /* hold the write turn: the committer takes what is queued and waits
     * for the turn; the rest queue behind it */
    ck_assert_int_eq(db_begin(d), 0);
    for (int k = 0; k < 3; k++) {
        store_new_job row = {.name = names[k], .workers = 1, .devices_per_worker = 1, .device = "cpu"};
        ck_assert_int_eq(store_job_submit(d, teams[k], SPEC, strlen(SPEC), &row, "team:vision", NULL, grp_on_done, &args[k]),
                         STORE_OK);
    }
    pthread_mutex_lock(&g.mu);
    ck_assert_int_eq(g.n, 0); /* nothing is answered before its commit */
    pthread_mutex_unlock(&g.mu);
    db_rollback(d);
    pthread_mutex_lock(&g.mu);
    while (g.n < 3) pthread_cond_wait(&g.cv, &g.mu);
    pthread_mutex_unlock(&g.mu);
    ck_assert_int_eq(g.rc[0], STORE_OK);
    ck_assert_int_eq(g.rc[1], STORE_ERROR);
    ck_assert_int_eq(g.rc[2], STORE_OK);
    ck_assert_int_eq(g.id[1], 0);
    ck_assert_int_ne(g.id[0], g.id[2]);
    ck_assert_str_eq(g.name[0], "first");
    ck_assert_str_eq(g.name[2], "third");
    /* what each answer named is committed; the failed one left no row, no event */
    ck_assert_int_eq(count(d, "SELECT count(*) FROM jobs"), 2);
    ck_assert_int_eq(count(d, "SELECT count(*) FROM job_events"), 2);
    for (int k = 0; k < 3; k += 2)
        ck_assert_int_eq(count2(d, "SELECT count(*) FROM jobs WHERE name = ?1 AND id = ?2", names[k], g.id[k]), 1);
    db_group_stats st;
    db_group_stats_get(d, &st);
    ck_assert_uint_eq(st.items, 3);
    /* [first] then [orphan, third], or all three at once: the failed one
     * always shared its batch (the turn was held until all were queued) */
    ck_assert_uint_le(st.batches, 2);
    ck_assert_uint_eq(st.largest, 4 - st.batches);
    /* job writes leave the tokens' number alone */
    ck_assert_uint_eq(db_auth_generation(d), auth0);
    db_close(d);
    pthread_cond_destroy(&g.cv);
    pthread_mutex_destroy(&g.mu);
}
END_TEST

/* A reader keeping the WAL from restarting (a read transaction held open on
 * another connection, as the server's readers do under load) does not make
 * every commit past 1,000 frames a checkpoint: the checkpointer runs once per
 * 1,000 frames the WAL grew by (and once a second), here a handful for 3,000
 * commits. Waking it on every commit past the mark made one checkpoint (two
 * fsyncs) per commit. */
START_TEST(checkpoints_follow_the_wal_growth) {
    if (sqlite_only("checkpoints_follow_the_wal_growth", "SQLite's WAL and its checkpointer thread")) return;
    db *d = NULL;
    char err[256];
    ck_assert_int_eq(db_open(&d, g_path, err, sizeof err), 0);
    sqlite3 *r = NULL;
    ck_assert_int_eq(sqlite3_open_v2(g_path, &r, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    ck_assert_int_eq(sqlite3_exec(r, "BEGIN; SELECT count(*) FROM teams;", NULL, NULL, NULL), SQLITE_OK);
    uint64_t c0 = db_checkpoints(d);
    double t0 = mono_s();
    for (int i = 0; i < 3000; i++) {
        char name[64];
        int64_t id;
        snprintf(name, sizeof name, "wal-team-%d", i);
        ck_assert_int_eq(store_team_create(d, name, &id), STORE_OK);
        usleep(200); /* commits spread out, as a server's are: time for a checkpoint between them */
    }
    usleep(300 * 1000); /* the checkpointer's last wake */
    double secs = mono_s() - t0;
    uint64_t n = db_checkpoints(d) - c0;
    char wal[600];
    snprintf(wal, sizeof wal, "%s-wal", g_path);
    struct stat sb;
    ck_assert_int_eq(stat(wal, &sb), 0);
    long frames = (long)((sb.st_size - 32) / (4096 + 24));
    ck_assert_msg(frames > 3000, "the WAL holds %ld frames: the reader did not keep it", frames);
    ck_assert_msg(n >= 1 && n <= (uint64_t)(frames / 1000 + secs + 3),
                  "%llu checkpoints for %ld frames in %.1f s", (unsigned long long)n, frames, secs);
    sqlite3_exec(r, "COMMIT", NULL, NULL, NULL);
    sqlite3_close(r);
    db_close(d);
}
END_TEST

/* blob_uploads on a db holding job 7 of team (attempt 1) with two
 * checkpoints in the data directory (store ''), the newer at step 10
 * ('7/1.safetensors'): an upload is taken, published with the checkpoint
 * row and the pruning in one transaction (once: a second publish is a
 * conflict), counted for the quota and the housekeeping tick, expired,
 * aborted and forgotten. */
static void blob_uploads_check(db *d, int64_t team) {
    exec_ckpt c;
    /* an upload: open, then its remote id, counted against the team */
    const char *store = "s3://b/p?endpoint=http://127.0.0.1:1&region=us-east-1";
    blob_upload u;
    memset(&u, 0, sizeof u);
    snprintf(u.token, sizeof u.token, "0123456789abcdef0123456789abcdef");
    u.job_id = 7;
    u.attempt = 1;
    u.step = 20;
    u.epoch = 2;
    snprintf(u.store, sizeof u.store, "%s", store);
    snprintf(u.key, sizeof u.key, "checkpoints/7/1-%s.safetensors", u.token);
    u.size = 12 << 20;
    u.part_bytes = 8 << 20;
    u.parts = 2;
    memset(u.sha256, 'e', 64);
    u.md5s = "[\"AAAAAAAAAAAAAAAAAAAAAA==\",\"BBBBBBBBBBBBBBBBBBBBBB==\"]";
    u.expires_at = now_ms() + 60000;
    ck_assert_int_eq(blob_upload_insert(d, &u), STORE_OK);
    ck_assert_int_gt(u.id, 0);
    blob_upload dup = u;
    ck_assert_int_eq(blob_upload_insert(d, &dup), STORE_CONFLICT); /* the token is unique */
    ck_assert_int_eq(blob_upload_set_remote(d, u.id, "upload-1"), STORE_OK);
    int64_t bytes = 0, open = 0;
    ck_assert_int_eq(blob_upload_open_bytes(d, team, &bytes), STORE_OK);
    ck_assert_int_eq(bytes, 12 << 20);
    ck_assert_int_eq(blob_upload_open_bytes(d, team + 1, &bytes), STORE_OK);
    ck_assert_int_eq(bytes, 0);
    blob_upload got;
    ck_assert_int_eq(blob_upload_get(d, u.token, 8, &got), STORE_NOT_FOUND); /* another job's */
    ck_assert_int_eq(blob_upload_get(d, u.token, 7, &got), STORE_OK);
    ck_assert_str_eq(got.remote_id, "upload-1");
    ck_assert_str_eq(got.state, "open");
    ck_assert_str_eq(got.md5s, u.md5s);
    ck_assert_int_eq(got.parts, 2);
    ck_assert_int_eq(got.size, 12 << 20);

    /* published with keep 1: the checkpoint is visible in the store, the
     * older one pruned in the same transaction, the upload done */
    ckpt_ref pruned[4];
    int n = 0;
    int64_t cid = 0;
    ck_assert_int_eq(blob_upload_publish(d, &got, 1, &cid, pruned, 4, &n), STORE_OK);
    ck_assert_int_gt(cid, 0);
    ck_assert_int_eq(n, 1);
    ck_assert_str_eq(pruned[0].path, "7/1.safetensors");
    ck_assert_str_eq(pruned[0].store, "");
    ck_assert_int_eq(pruned[0].size, 5);
    ck_assert_int_eq(exec_store_ckpt_get(d, 7, 0, &c), STORE_OK);
    ck_assert_int_eq(c.id, cid);
    ck_assert_str_eq(c.store, store);
    ck_assert_str_eq(c.path, got.key + strlen("checkpoints/"));
    ck_assert_str_eq(c.sha256, u.sha256);
    blob_upload_release(&got);
    ck_assert_int_eq(blob_upload_get(d, u.token, 0, &got), STORE_OK);
    ck_assert_str_eq(got.state, "done");
    ck_assert_int_eq(got.checkpoint_id, cid);
    ck_assert_int_eq(blob_upload_publish(d, &got, 1, &cid, pruned, 4, &n), STORE_CONFLICT);
    ck_assert_int_eq(count(d, "SELECT count(*) FROM checkpoints WHERE deleted_at IS NULL"), 1);
    blob_upload_release(&got);
    ck_assert_int_eq(blob_upload_open_bytes(d, team, &bytes), STORE_OK);
    ck_assert_int_eq(bytes, 0);

    /* an expired one: listed for the tick, aborted once */
    blob_upload e = u;
    snprintf(e.token, sizeof e.token, "fedcba9876543210fedcba9876543210");
    e.expires_at = 1000;
    e.created_at = 0;
    ck_assert_int_eq(blob_upload_insert(d, &e), STORE_OK);
    ck_assert_int_eq(blob_uploads_open_count(d, &open), STORE_OK);
    ck_assert_int_eq(open, 1);
    blob_upload rows[4];
    ck_assert_int_eq(blob_uploads_expired(d, 999, rows, 4, &n), STORE_OK);
    ck_assert_int_eq(n, 0);
    ck_assert_int_eq(blob_uploads_expired(d, now_ms(), rows, 4, &n), STORE_OK);
    ck_assert_int_eq(n, 1);
    ck_assert_str_eq(rows[0].token, e.token);
    blob_upload_release(&rows[0]);
    ck_assert_int_eq(blob_uploads_of_job(d, 7, rows, 4, &n), STORE_OK);
    ck_assert_int_eq(n, 1);
    blob_upload_release(&rows[0]);
    ck_assert_int_eq(blob_upload_mark(d, e.id, "aborted"), STORE_OK);
    ck_assert_int_eq(blob_upload_mark(d, e.id, "aborted"), STORE_CONFLICT);
    ck_assert_int_eq(blob_uploads_expired(d, now_ms(), rows, 4, &n), STORE_OK);
    ck_assert_int_eq(n, 0);

    /* finished rows are forgotten after a while; an open one stays */
    blob_upload o = u;
    snprintf(o.token, sizeof o.token, "00112233445566778899aabbccddeeff");
    o.expires_at = now_ms() + 60000;
    ck_assert_int_eq(blob_upload_insert(d, &o), STORE_OK);
    ck_assert_int_eq(blob_uploads_forget(d, 0, 10, &n), STORE_OK);
    ck_assert_int_eq(n, 0); /* none begun before the epoch */
    ck_assert_int_eq(blob_uploads_forget(d, now_ms() + 1000, 1, &n), STORE_OK);
    ck_assert_int_eq(n, 1); /* max */
    ck_assert_int_eq(blob_uploads_forget(d, now_ms() + 1000, 10, &n), STORE_OK);
    ck_assert_int_eq(n, 1);
    ck_assert_int_eq(count(d, "SELECT count(*) FROM blob_uploads"), 1);
    ck_assert_int_eq(count(d, "SELECT count(*) FROM blob_uploads WHERE state = 'open'"), 1);
}

/* Migration 18: rows of a version-17 file keep their bytes in the data
 * directory (store ''); blob_uploads takes an upload, publishes it with
 * the checkpoint row and the pruning in one transaction (once: a second
 * publish is a conflict), and counts open uploads for the quota and the
 * housekeeping tick. */
START_TEST(migrate_blob_stores) {
    if (sqlite_only("migrate_blob_stores", "migration 18 of a version-17 SQLite file (the PostgreSQL baseline is"
                    " 18)")) return;
    unlink(g_path);
    db *d = NULL;
    char err[256];
    ck_assert_int_eq(db_open_at(&d, g_path, 17, err, sizeof err), 0);
    int64_t team = 0;
    ck_assert_int_eq(store_team_create(d, "default", &team), STORE_OK);
    char sql[1024];
    snprintf(sql, sizeof sql,
             "INSERT INTO jobs(id, team_id, name, spec, state, priority, attempt, max_restarts, workers,"
             " devices_per_worker, device, ps, max_runtime_s, preemptible, created_at, updated_at)"
             " VALUES(7, %lld, 'j', '{}', 'running', 50, 1, 3, 1, 1, 'cpu', 0, 60, 0, 1, 1);"
             "INSERT INTO checkpoints(job_id, attempt, step, epoch, size, sha256, path, created_at)"
             " VALUES(7, 1, 10, 1, 5, 'aa', '7/1.safetensors', 1);"
             "INSERT INTO checkpoints(job_id, attempt, step, epoch, size, sha256, path, created_at, deleted_at)"
             " VALUES(7, 1, 5, 0, 5, 'bb', '7/2.safetensors', 1, 2);"
             "INSERT INTO contexts(team_id, digest, bytes, files, unpacked, created_at, used_at)"
             " VALUES(%lld, 'cc', 10, 1, 10, 1, 1);",
             (long long)team, (long long)team);
    ck_assert_int_eq(sqlite3_exec(db_sqlite(d), sql, NULL, NULL, NULL), SQLITE_OK);
    ck_assert_int_ne(sqlite3_exec(db_sqlite(d), "SELECT store FROM checkpoints", NULL, NULL, NULL), SQLITE_OK);
    db_close(d);
    ck_assert_int_eq(db_open(&d, g_path, err, sizeof err), 0);
    ck_assert_int_eq(db_version(d), db_migrations_count());
    ck_assert_int_eq(count(d, "SELECT count(*) FROM checkpoints WHERE store = ''"), 2);
    ck_assert_int_eq(count(d, "SELECT count(*) FROM contexts WHERE store = '' AND digest = 'cc'"), 1);
    exec_ckpt c;
    ck_assert_int_eq(exec_store_ckpt_get(d, 7, 0, &c), STORE_OK);
    ck_assert_str_eq(c.store, "");
    ck_assert_str_eq(c.path, "7/1.safetensors");

    blob_uploads_check(d, team);
    ck_assert_int_eq(count(d, "SELECT count(*) FROM pragma_foreign_key_check"), 0);
    db_close(d);
}
END_TEST

/* The same uploads on a database made at the newest version (on
 * PostgreSQL: its baseline), the rows written in text both engines take. */
START_TEST(blob_uploads_publish_and_expire) {
    db *d = NULL;
    ty_db_open_leading(&d, g_path);
    int64_t team = 0;
    ck_assert_int_eq(store_team_create(d, "default", &team), STORE_OK);
    char sql[1024];
    snprintf(sql, sizeof sql,
             "INSERT INTO jobs(id, team_id, name, spec, state, priority, attempt, max_restarts, workers,"
             " devices_per_worker, device, ps, max_runtime_s, preemptible, created_at, updated_at)"
             " VALUES(7, %lld, 'j', '{}', 'running', 50, 1, 3, 1, 1, 'cpu', 0, 60, 0, 1, 1)",
             (long long)team);
    exec_sql(d, sql);
    exec_sql(d, "INSERT INTO checkpoints(job_id, attempt, step, epoch, size, sha256, path, created_at)"
                " VALUES(7, 1, 10, 1, 5, 'aa', '7/1.safetensors', 1)");
    exec_sql(d, "INSERT INTO checkpoints(job_id, attempt, step, epoch, size, sha256, path, created_at, deleted_at)"
                " VALUES(7, 1, 5, 0, 5, 'bb', '7/2.safetensors', 1, 2)");
    exec_ckpt c;
    ck_assert_int_eq(exec_store_ckpt_get(d, 7, 0, &c), STORE_OK);
    ck_assert_str_eq(c.store, "");
    ck_assert_str_eq(c.path, "7/1.safetensors");
    blob_uploads_check(d, team);
    db_close(d);
}
END_TEST

/* The running jobs the idle culler watches, with their idle_timeout as
 * the spec says it (seconds, or a duration): "30m" is 1,800 s (SQLite's
 * CAST made it 30, PostgreSQL's number helper dropped every string), 0 and
 * a job not running are not watched. */
START_TEST(idle_watched_reads_durations) {
    db *d = NULL;
    ty_db_open_leading(&d, g_path);
    int64_t team = 0;
    ck_assert_int_eq(store_team_create(d, "default", &team), STORE_OK);
    static const char *const specs[] = {"{\"idle_timeout\":\"30m\"}", "{\"idle_timeout\":\"3s\"}",
                                        "{\"idle_timeout\":4}", "{\"idle_timeout\":0}", "{\"name\":\"x\"}",
                                        "{\"idle_timeout\":\"1.5h\"}"};
    for (int k = 0; k < 6; k++) {
        char sql[1024];
        snprintf(sql, sizeof sql,
                 "INSERT INTO jobs(id, team_id, name, spec, state, priority, attempt, max_restarts, workers,"
                 " devices_per_worker, device, ps, max_runtime_s, preemptible, created_at, updated_at, started_at)"
                 " VALUES(%d, %lld, 'j', '%s', '%s', 50, 1, 0, 1, 1, 'cpu', 0, 60, 0, 1, 1, %d)",
                 k + 1, (long long)team, specs[k], k == 5 ? "queued" : "running", 1000 + k);
        exec_sql(d, sql);
    }
    store_idle_job *w = NULL;
    int n = 0;
    ck_assert_int_eq(store_jobs_idle_watched(d, &w, &n), STORE_OK);
    ck_assert_int_eq(n, 3);
    ck_assert_int_eq(w[0].id, 1);
    ck_assert_int_eq(w[0].idle_timeout_s, 1800);
    ck_assert_int_eq(w[0].started_ms, 1000);
    ck_assert_int_eq(w[1].id, 2);
    ck_assert_int_eq(w[1].idle_timeout_s, 3);
    ck_assert_int_eq(w[2].id, 3);
    ck_assert_int_eq(w[2].idle_timeout_s, 4);
    free(w);
    db_close(d);
}
END_TEST

/* PostgreSQL's fence: A leads and writes; its lease is made to expire (a
 * maintenance session, as a paused A would let it) and B takes it at the
 * next epoch; A, still believing it leads, writes again: the database
 * refuses it (DB_FENCED, counted), and nothing of it is in the table,
 * while B's writes go through. */
/* ---------------------------------------------------------------- sweeps made once */

static char *const SWEEP_PARAMS[] = {"{\"fit.batch_size\":32}", "{\"fit.batch_size\":64}"};
static const char SWEEP_SPEC[] = "{\"name\":\"s\",\"job\":{},\"search\":{}}";
#define SHA_A "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
#define SHA_B "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"

static int sweep_keyed(db *d, int64_t team, const char *key, const char *sha, int64_t *id) {
    *id = 0;
    return sweep_store_create(d, team, 0, "s", SWEEP_SPEC, 2, SWEEP_PARAMS, key, sha, id);
}

typedef struct sweep_racer {
    db *d;
    int64_t team, id;
    int rc;
    pthread_barrier_t *go;
} sweep_racer;

static void *sweep_race(void *arg) {
    sweep_racer *r = arg;
    pthread_barrier_wait(r->go);
    r->rc = sweep_keyed(r->d, r->team, "race", SHA_A, &r->id);
    return NULL;
}

/* A sweep's Idempotency-Key is stored with it in one transaction: the
 * same key and request again make nothing and name the first sweep
 * (STORE_EXPIRED), another request is STORE_CONFLICT, another team's key
 * is its own, a key past its day is gone, and two creates racing with one
 * key make one sweep. */
START_TEST(sweep_keys_make_one_sweep) {
    db *d = NULL;
    ty_db_open_leading(&d, g_path);
    int64_t a = 0, b = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0;
    ck_assert_int_eq(store_team_create(d, "a", &a), STORE_OK);
    ck_assert_int_eq(store_team_create(d, "b", &b), STORE_OK);
    ck_assert_int_eq(sweep_keyed(d, a, "k1", SHA_A, &s1), STORE_OK);
    ck_assert_int_gt(s1, 0);
    ck_assert_int_eq(sweep_keyed(d, a, "k1", SHA_A, &s2), STORE_EXPIRED);
    ck_assert_int_eq(s2, s1);
    ck_assert_int_eq(sweep_keyed(d, a, "k1", SHA_B, &s2), STORE_CONFLICT);
    ck_assert_int_eq(s2, s1);
    ck_assert_int_eq(count(d, "SELECT count(*) FROM sweeps"), 1);
    ck_assert_int_eq(count(d, "SELECT count(*) FROM sweep_trials"), 2);
    /* another team's same key is its own */
    ck_assert_int_eq(sweep_keyed(d, b, "k1", SHA_A, &s3), STORE_OK);
    ck_assert_int_ne(s3, s1);
    sweep_info si;
    ck_assert_int_eq(sweep_store_get(d, s3, b, &si), STORE_OK);
    sweep_info_release(&si);
    /* no key: a sweep each time */
    ck_assert_int_eq(sweep_keyed(d, a, NULL, NULL, &s4), STORE_OK);
    ck_assert_int_eq(sweep_keyed(d, a, NULL, NULL, &s2), STORE_OK);
    ck_assert_int_ne(s2, s4);
    ck_assert_int_eq(count(d, "SELECT count(*) FROM sweeps"), 4);
    /* a day later the key is gone (pruned with the team's next keyed create)
     * and makes a new sweep; team b's is untouched */
    char sql[200];
    snprintf(sql, sizeof sql, "UPDATE sweep_keys SET created_at = created_at - %lld WHERE team_id = %lld",
             24LL * 3600 * 1000 + 1000, (long long)a);
    ck_assert_msg(db_exec(d, sql) == 0, "%s", db_errmsg(d));
    ck_assert_int_eq(sweep_keyed(d, a, "k1", SHA_B, &s2), STORE_OK);
    ck_assert_int_gt(s2, s3);
    ck_assert_int_eq(count2(d, "SELECT count(*) FROM sweep_keys WHERE idem_key = ?1 AND sweep_id = ?2", "k1", s2),
                     1);
    ck_assert_int_eq(count2(d, "SELECT count(*) FROM sweep_keys WHERE idem_key = ?1 AND sweep_id = ?2", "k1", s1),
                     0);
    ck_assert_int_eq(sweep_keyed(d, b, "k1", SHA_A, &s4), STORE_EXPIRED);
    ck_assert_int_eq(s4, s3);
    /* two at once with one key, each thread on its own connection: one sweep */
    long before = count(d, "SELECT count(*) FROM sweeps");
    for (int round = 0; round < 5; round++) {
        ck_assert_msg(db_exec(d, "DELETE FROM sweep_keys WHERE idem_key = 'race'") == 0, "%s", db_errmsg(d));
        pthread_barrier_t go;
        ck_assert_int_eq(pthread_barrier_init(&go, NULL, 2), 0);
        sweep_racer r[2] = {{.d = d, .team = a, .go = &go}, {.d = d, .team = a, .go = &go}};
        pthread_t t[2];
        for (int i = 0; i < 2; i++) ck_assert_int_eq(pthread_create(&t[i], NULL, sweep_race, &r[i]), 0);
        for (int i = 0; i < 2; i++) ck_assert_int_eq(pthread_join(t[i], NULL), 0);
        pthread_barrier_destroy(&go);
        ck_assert_msg((r[0].rc == STORE_OK && r[1].rc == STORE_EXPIRED) ||
                          (r[0].rc == STORE_EXPIRED && r[1].rc == STORE_OK),
                      "round %d: %d and %d", round, r[0].rc, r[1].rc);
        ck_assert_int_eq(r[0].id, r[1].id);
        ck_assert_int_eq(count(d, "SELECT count(*) FROM sweeps"), before + round + 1);
    }
    db_close(d);
}
END_TEST

START_TEST(fenced_write_after_takeover) {
    if (!ty_pg_url()) {
        printf("SKIP fenced_write_after_takeover on SQLite: one server, one file, no lease\n");
        return;
    }
    db *a = NULL, *b = NULL;
    char err[256];
    ck_assert_msg(db_open(&a, g_path, err, sizeof err) == 0, "%s", err);
    /* A renews only every 5 s: the takeover below comes before */
    db_lease_cfg ca = {.holder = "a", .url = "http://a", .ttl_ms = 6000, .renew_ms = 5000, .deadline_ms = 5500};
    ck_assert_msg(db_lease_start(a, &ca, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(db_lease_wait(a, 10000), 0);
    int64_t ea = db_epoch(a);
    ck_assert_int_gt(ea, 0);
    ck_assert_int_eq(store_team_create(a, "before", NULL), STORE_OK);
    ck_assert_msg(db_open(&b, g_path, err, sizeof err) == 0, "%s", err);
    db_lease_cfg cb = {.holder = "b", .url = "http://b", .ttl_ms = 2000, .renew_ms = 200, .deadline_ms = 1500};
    ck_assert_msg(db_lease_start(b, &cb, err, sizeof err) == 0, "%s", err);
    ck_assert_int_ne(db_lease_wait(b, 500), 0); /* A holds it */
    ck_assert_int_eq(ty_pg_query_int64(g_path, "UPDATE ty_lease SET expires_at = clock_timestamp() WHERE id = 1"
                                               " RETURNING epoch"), ea);
    ck_assert_int_eq(db_lease_wait(b, 5000), 0);
    ck_assert_int_gt(db_epoch(b), ea);
    uint64_t f0 = db_fenced_writes(a);
    int64_t id = 0;
    ck_assert_int_ne(store_team_create(a, "fenced", &id), STORE_OK);
    ck_assert_uint_gt(db_fenced_writes(a), f0);
    ck_assert_int_ne(db_exec(a, "UPDATE teams SET weight = 7 WHERE name = 'before'"), 0);
    ck_assert_int_eq(store_team_create(b, "after", NULL), STORE_OK);
    ck_assert_int_eq(count2(b, "SELECT count(*) FROM teams WHERE name = ?1", "fenced", 0), 0);
    ck_assert_int_eq(count2(b, "SELECT count(*) FROM teams WHERE name = ?1 AND weight = 7", "before", 0), 0);
    ck_assert_int_eq(count2(b, "SELECT count(*) FROM teams WHERE name = ?1", "after", 0), 1);
    db_close(a);
    db_close(b);
}
END_TEST

int main(void) {
    Suite *s = suite_create("storage");
    TCase *tc = tcase_create("sqlite");
    tcase_add_checked_fixture(tc, setup, teardown);
    /* PostgreSQL: changes_follow_commits' 70,000-row transaction and its
     * updates through the change-capture triggers take 1-8 s on 2 busy cores */
    if (ty_pg_url()) tcase_set_timeout(tc, 60);
    tcase_add_test(tc, migrate_empty_file);
    tcase_add_test(tc, migrate_from_every_version);
    tcase_add_test(tc, refuses_newer_schema);
    tcase_add_test(tc, migrate_tasks_keeps_allocations);
    tcase_add_test(tc, migrate_blob_stores);
    tcase_add_test(tc, blob_uploads_publish_and_expire);
    tcase_add_test(tc, not_a_database);
    tcase_add_test(tc, tokens_hashed);
    tcase_add_test(tc, job_lifecycle_and_events);
    tcase_add_test(tc, threads_share_the_pool);
    tcase_add_test(tc, generation_follows_commits);
    tcase_add_test(tc, group_commit_isolates_a_failed_write);
    tcase_add_test(tc, checkpoints_follow_the_wal_growth);
    tcase_add_test(tc, database_kept_resident);
    tcase_add_test(tc, changes_follow_commits);
    tcase_add_test(tc, fenced_write_after_takeover);
    tcase_add_test(tc, sweep_keys_make_one_sweep);
    tcase_add_test(tc, idle_watched_reads_durations);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
