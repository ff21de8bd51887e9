/* db.c - SQLite connections, the per-thread statement cache and migrations.
 *
 * Every thread that touches the database gets its own connection (WAL lets
 * readers run beside the one writer) with foreign keys on and a busy timeout;
 * statements are prepared once per thread and reused. Migrations run in order,
 * each in its own transaction, and record themselves in schema_migrations.
 * synchronous=NORMAL under WAL: a commit survives any process crash (kill -9);
 * docs/storage.md explains the choice and the --durability full option. */
#include "db.h"
#include "schema.h"
#include "../common/util.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct stmt_slot {
    const char *sql;
    sqlite3_stmt *st;
} stmt_slot;

typedef struct db_thread_conn {
    db *owner;
    sqlite3 *conn;
    stmt_slot *slots;             /* open addressing on the sql pointer */
    size_t nslots, used;
    struct db_thread_conn *next;
} db_thread_conn;

struct db {
    char *path;
    pthread_key_t key;
    pthread_mutex_t lock;         /* guards conns */
    db_thread_conn *conns;        /* bound to a live thread */
    db_thread_conn *idle;         /* returned by exited threads, ready for reuse */
    int nidle;
};

#define DB_IDLE_MAX 64

static int g_sync_full = 0;

void db_set_durability_full(int on) { g_sync_full = on; }

/* ---------------------------------------------------------------- connections */

static void conn_free(db_thread_conn *c) {
    for (size_t i = 0; i < c->nslots; i++)
        if (c->slots[i].st) sqlite3_finalize(c->slots[i].st);
    free(c->slots);
    sqlite3_close(c->conn);
    free(c);
}

static void conn_unlink(db *d, db_thread_conn *c) {
    pthread_mutex_lock(&d->lock);
    for (db_thread_conn **pp = &d->conns; *pp; pp = &(*pp)->next) {
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    }
    pthread_mutex_unlock(&d->lock);
}

/* A thread exits: its connection (and its prepared statements) goes to the
 * idle list for the next thread, so short-lived HTTP connection threads do
 * not pay for opening SQLite and preparing statements each time. */
static void conn_destructor(void *p) {
    db_thread_conn *c = p;
    db *d = c->owner;
    if (!sqlite3_get_autocommit(c->conn)) sqlite3_exec(c->conn, "ROLLBACK", NULL, NULL, NULL);
    for (size_t i = 0; i < c->nslots; i++)
        if (c->slots[i].st) sqlite3_reset(c->slots[i].st);
    conn_unlink(d, c);
    pthread_mutex_lock(&d->lock);
    if (d->nidle < DB_IDLE_MAX) {
        c->next = d->idle;
        d->idle = c;
        d->nidle++;
        c = NULL;
    }
    pthread_mutex_unlock(&d->lock);
    if (c) conn_free(c);
}

static int exec_simple(sqlite3 *conn, const char *sql) {
    char *msg = NULL;
    int rc = sqlite3_exec(conn, sql, NULL, NULL, &msg);
    if (rc != SQLITE_OK) {
        log_error("sqlite: %s: %s", sql, msg ? msg : sqlite3_errstr(rc));
        sqlite3_free(msg);
        return -1;
    }
    return 0;
}

static sqlite3 *conn_open(const char *path, char *err, size_t errlen) {
    sqlite3 *conn = NULL;
    int rc = sqlite3_open_v2(path, &conn,
                             SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
    if (rc != SQLITE_OK) {
        snprintf(err, errlen, "cannot open %s: %s", path, conn ? sqlite3_errmsg(conn) : sqlite3_errstr(rc));
        sqlite3_close(conn);
        return NULL;
    }
    sqlite3_busy_timeout(conn, 10000);
    sqlite3_extended_result_codes(conn, 1);
    if (exec_simple(conn, "PRAGMA journal_mode=WAL") < 0 ||
        exec_simple(conn, g_sync_full ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL") < 0 ||
        exec_simple(conn, "PRAGMA foreign_keys=ON") < 0 ||
        exec_simple(conn, "PRAGMA temp_store=MEMORY") < 0) {
        snprintf(err, errlen, "cannot configure %s: %s", path, sqlite3_errmsg(conn));
        sqlite3_close(conn);
        return NULL;
    }
    return conn;
}

static db_thread_conn *thread_conn(db *d) {
    db_thread_conn *c = pthread_getspecific(d->key);
    if (c) return c;
    pthread_mutex_lock(&d->lock);
    c = d->idle;
    if (c) {
        d->idle = c->next;
        d->nidle--;
        c->next = d->conns;
        d->conns = c;
    }
    pthread_mutex_unlock(&d->lock);
    if (c) {
        if (pthread_setspecific(d->key, c) != 0) {
            conn_unlink(d, c);
            conn_free(c);
            return NULL;
        }
        return c;
    }
    char err[256];
    sqlite3 *conn = conn_open(d->path, err, sizeof err);
    if (!conn) {
        log_error("db: %s", err);
        return NULL;
    }
    c = xcalloc(1, sizeof *c);
    c->owner = d;
    c->conn = conn;
    c->nslots = 64;
    c->slots = xcalloc(c->nslots, sizeof *c->slots);
    pthread_mutex_lock(&d->lock);
    c->next = d->conns;
    d->conns = c;
    pthread_mutex_unlock(&d->lock);
    if (pthread_setspecific(d->key, c) != 0) {
        conn_unlink(d, c);
        conn_free(c);
        return NULL;
    }
    return c;
}

sqlite3 *db_conn(db *d) {
    db_thread_conn *c = thread_conn(d);
    return c ? c->conn : NULL;
}

/* ---------------------------------------------------------------- statements */

static size_t slot_index(const char *sql, size_t nslots) {
    uintptr_t h = (uintptr_t)sql;
    h ^= h >> 17;
    h *= 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 7) & (nslots - 1);
}

static void slots_grow(db_thread_conn *c) {
    size_t n = c->nslots * 2;
    stmt_slot *s = xcalloc(n, sizeof *s);
    for (size_t i = 0; i < c->nslots; i++) {
        if (!c->slots[i].sql) continue;
        size_t j = slot_index(c->slots[i].sql, n);
        while (s[j].sql) j = (j + 1) & (n - 1);
        s[j] = c->slots[i];
    }
    free(c->slots);
    c->slots = s;
    c->nslots = n;
}

sqlite3_stmt *db_prepare(db *d, const char *sql) {
    db_thread_conn *c = thread_conn(d);
    if (!c) return NULL;
    size_t i = slot_index(sql, c->nslots);
    while (c->slots[i].sql) {
        if (c->slots[i].sql == sql) {
            sqlite3_stmt *st = c->slots[i].st;
            sqlite3_reset(st);
            sqlite3_clear_bindings(st);
            return st;
        }
        i = (i + 1) & (c->nslots - 1);
    }
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v3(c->conn, sql, -1, SQLITE_PREPARE_PERSISTENT, &st, NULL);
    if (rc != SQLITE_OK) {
        log_error("sqlite prepare: %s: %s", sqlite3_errmsg(c->conn), sql);
        return NULL;
    }
    if ((c->used + 1) * 2 > c->nslots) {
        slots_grow(c);
        i = slot_index(sql, c->nslots);
        while (c->slots[i].sql) i = (i + 1) & (c->nslots - 1);
    }
    c->slots[i].sql = sql;
    c->slots[i].st = st;
    c->used++;
    return st;
}

void db_done(sqlite3_stmt *st) {
    if (!st) return;
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
}

/* ---------------------------------------------------------------- transactions */

int db_begin(db *d) {
    sqlite3 *c = db_conn(d);
    return c ? exec_simple(c, "BEGIN IMMEDIATE") : -1;
}

int db_commit(db *d) {
    sqlite3 *c = db_conn(d);
    if (!c) return -1;
    if (exec_simple(c, "COMMIT") < 0) {
        exec_simple(c, "ROLLBACK");
        return -1;
    }
    return 0;
}

void db_rollback(db *d) {
    sqlite3 *c = db_conn(d);
    if (c && !sqlite3_get_autocommit(c)) exec_simple(c, "ROLLBACK");
}

/* ---------------------------------------------------------------- migrations */

int db_migrations_count(void) { return schema_migrations_n; }

static int version_of(sqlite3 *conn) {
    sqlite3_stmt *st = NULL;
    int v = -1;
    if (sqlite3_prepare_v2(conn, "SELECT coalesce(max(version), 0) FROM schema_migrations", -1, &st,
                           NULL) != SQLITE_OK)
        return -1;
    if (sqlite3_step(st) == SQLITE_ROW) v = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    return v;
}

int db_version(db *d) {
    sqlite3 *c = db_conn(d);
    return c ? version_of(c) : -1;
}

static int migrate(sqlite3 *conn, int target, char *err, size_t errlen) {
    if (exec_simple(conn,
                    "CREATE TABLE IF NOT EXISTS schema_migrations("
                    " version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)") < 0) {
        snprintf(err, errlen, "cannot create schema_migrations: %s", sqlite3_errmsg(conn));
        return -1;
    }
    int have = version_of(conn);
    if (have < 0) {
        snprintf(err, errlen, "cannot read the schema version: %s", sqlite3_errmsg(conn));
        return -1;
    }
    if (have > schema_migrations_n) {
        snprintf(err, errlen, "database schema version %d is newer than this build knows (%d)", have,
                 schema_migrations_n);
        return -1;
    }
    for (int i = 0; i < schema_migrations_n; i++) {
        const migration *m = &schema_migrations[i];
        if (m->version <= have || m->version > target) continue;
        if (exec_simple(conn, "BEGIN IMMEDIATE") < 0) {
            snprintf(err, errlen, "migration %d: cannot begin: %s", m->version, sqlite3_errmsg(conn));
            return -1;
        }
        char *msg = NULL;
        if (sqlite3_exec(conn, m->sql, NULL, NULL, &msg) != SQLITE_OK) {
            snprintf(err, errlen, "migration %d (%s) failed: %s", m->version, m->name, msg ? msg : "?");
            sqlite3_free(msg);
            exec_simple(conn, "ROLLBACK");
            return -1;
        }
        sqlite3_stmt *st = NULL;
        int rc = sqlite3_prepare_v2(conn,
                                    "INSERT INTO schema_migrations(version, name, applied_at) VALUES(?,?,?)",
                                    -1, &st, NULL);
        if (rc == SQLITE_OK) {
            sqlite3_bind_int(st, 1, m->version);
            sqlite3_bind_text(st, 2, m->name, -1, SQLITE_STATIC);
            sqlite3_bind_int64(st, 3, now_ms());
            rc = sqlite3_step(st) == SQLITE_DONE ? SQLITE_OK : SQLITE_ERROR;
        }
        sqlite3_finalize(st);
        if (rc != SQLITE_OK || exec_simple(conn, "COMMIT") < 0) {
            snprintf(err, errlen, "migration %d: cannot record: %s", m->version, sqlite3_errmsg(conn));
            exec_simple(conn, "ROLLBACK");
            return -1;
        }
        log_debug("db: applied migration %d (%s)", m->version, m->name);
    }
    return 0;
}

/* ---------------------------------------------------------------- open/close */

int db_open_at(db **out, const char *path, int target, char *err, size_t errlen) {
    *out = NULL;
    sqlite3 *conn = conn_open(path, err, errlen);
    if (!conn) return -1;
    int rc = migrate(conn, target, err, errlen);
    sqlite3_close(conn);
    if (rc < 0) return -1;
    db *d = xcalloc(1, sizeof *d);
    d->path = xstrdup(path);
    if (pthread_key_create(&d->key, conn_destructor) != 0) {
        snprintf(err, errlen, "pthread_key_create failed");
        free(d->path);
        free(d);
        return -1;
    }
    pthread_mutex_init(&d->lock, NULL);
    *out = d;
    return 0;
}

int db_open(db **out, const char *path, char *err, size_t errlen) {
    return db_open_at(out, path, schema_migrations_n, err, errlen);
}

void db_close(db *d) {
    if (!d) return;
    pthread_key_delete(d->key);
    pthread_mutex_lock(&d->lock);
    db_thread_conn *lists[2] = {d->conns, d->idle};
    d->conns = d->idle = NULL;
    pthread_mutex_unlock(&d->lock);
    for (int l = 0; l < 2; l++) {
        db_thread_conn *c = lists[l];
        while (c) {
            db_thread_conn *next = c->next;
            conn_free(c);
            c = next;
        }
    }
    pthread_mutex_destroy(&d->lock);
    free(d->path);
    free(d);
}

const char *db_path(db *d) { return d->path; }
