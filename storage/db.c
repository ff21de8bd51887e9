/* db.c - SQLite connections, the per-thread statement cache and migrations.
 *
 * Every thread that touches the database gets its own connection (WAL lets
 * readers run beside the one writer) with foreign keys on and a busy handler
 * of short sleeps; statements are prepared once per thread and reused.
 * Explicit write transactions (db_begin) take turns on an in-process mutex
 * before BEGIN IMMEDIATE; WAL checkpoints run in a thread of their own, off
 * the requests' path. Writes that arrive together share one transaction
 * (group commit: a committer thread, db_group_add). Migrations run in order, each in its own transaction,
 * and record themselves in schema_migrations. synchronous=NORMAL under WAL: a
 * commit survives any process crash (kill -9); docs/storage.md explains the
 * choice and the --durability full option; docs/reliability.md the load. */
#include "db.h"
#include "db_pg.h"
#include "schema.h"
#include "schema_pg.h"
#include "../common/util.h"

#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <pthread.h>
#include <limits.h>
#include <libpq-fe.h>
#include <sqlite3.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

typedef struct db_thread_conn db_thread_conn;

/* A statement of the cache: SQLite's or PostgreSQL's (one of s, p), with
 * the connection it belongs to. */
struct db_stmt {
    sqlite3_stmt *s;
    pg_stmt *p;
    db_thread_conn *c;
};

typedef struct stmt_slot {
    const char *sql;
    db_stmt *st;
} stmt_slot;

struct db_thread_conn {
    db *owner;
    sqlite3 *conn;                /* SQLite, or */
    pg_conn *pg;                  /* PostgreSQL */
    stmt_slot *slots;             /* open addressing on the sql pointer */
    size_t nslots, used;
    int holds_write;              /* this thread holds d->write (db_begin) */
    /* changes of the open transaction to tables the scheduling pass reads
     * (db_change_note): published on commit, dropped on rollback */
    db_change *chg;
    size_t n_chg, cap_chg;
    int chg_all;                  /* too many to list: "everything changed" */
    int auth_dirty;               /* the open transaction wrote tokens or teams (db_auth_generation) */
    struct db_thread_conn *next;
};

struct db {
    char *path;                   /* the file, or PostgreSQL's host:port/dbname (never a password) */
    char *pg_url;                 /* PostgreSQL: the URL (NULL: SQLite) */
    char *pg_password;            /* PostgreSQL: the password from a file (NULL: libpq finds it) */
    int64_t epoch;                /* PostgreSQL: the fencing number this server writes with (0: none) */
    int64_t stop_ms;              /* db_abandon: mono_ms() of the server's stop, 0 while it runs (atomic) */
    /* PostgreSQL: the lease (db_lease_start), its thread and what it knows */
    struct {
        pthread_t th;
        int running, stop, kick;
        pthread_mutex_t mu;
        pthread_cond_t cv;
        db_lease_cfg cfg;
        char *holder, *url;
        int role;                 /* DB_LEADER / DB_STANDBY (atomic) */
        char leader_url[512];     /* under mu */
        int64_t ms_left;          /* under mu */
        uint64_t fenced;          /* writes the fence refused (atomic) */
        int64_t last_ok_ms;       /* mono_ms of the last renewal (atomic): a leader whose lease thread
                                   * is stuck past the deadline is no leader (db_role) */
    } lease;
    pthread_key_t key;
    pthread_mutex_t lock;         /* guards conns */
    db_thread_conn *conns;        /* bound to a live thread */
    db_thread_conn *idle;         /* returned by exited threads, ready for reuse */
    int nidle;
    /* Writers of explicit transactions queue here, in the process, before
     * BEGIN IMMEDIATE: a waiting writer wakes the moment the previous one
     * commits instead of polling SQLite's lock with sleeps (docs/storage.md). */
    pthread_mutex_t write;
    /* The WAL checkpointer thread: commits only count frames (wal hook); this
     * thread checkpoints, so no request pays for a checkpoint's fsyncs. */
    pthread_t ckpt_th;
    int ckpt_running, ckpt_stop;
    pthread_mutex_t ckpt_mu;
    pthread_cond_t ckpt_cv;
    int wal_frames;               /* under ckpt_mu: frames in the WAL at the last commit */
    int ckpt_from;                /* under ckpt_mu: frames in the WAL at the last checkpoint */
    int ckpt_new;                 /* under ckpt_mu: a commit since the last checkpoint */
    uint64_t ckpt_count;          /* under ckpt_mu: checkpoints run (db_checkpoints) */
    /* Bumped after every commit of every connection of this process (the
     * WAL hook runs once the commit is visible); db_generation. */
    uint64_t generation;
    uint64_t auth_generation;     /* bumped after a commit that wrote tokens or teams */
    int wal;                      /* the file is in WAL mode: the hook sees every commit */
    /* db_wake_node's hook: told of nodes after the commit that gave them work */
    void (*wake_fn)(void *cls, const int64_t *nodes, int n);
    void *wake_cls;
    pid_t ckpt_pid;               /* the process that runs the checkpointer (not a fork child) */
    /* The change log (db_changes_read): a ring of the last DB_CHANGES_CAP
     * published changes; entry seq s sits at log[s % cap]. */
    pthread_mutex_t chg_mu;
    db_change *log;               /* (DB_CHANGES_CAP), allocated on first use */
    uint64_t log_head;            /* seq of the next entry */
    uint64_t log_all;             /* "everything" published before this seq (0: never) */
    /* Group commit (db_group_add): items queued for the committer thread. */
    pthread_t grp_th;
    int grp_running, grp_stop;
    pid_t grp_pid;                /* the process that runs the committer */
    pthread_mutex_t grp_mu;
    pthread_cond_t grp_cv;
    db_group_item *grp_head, *grp_tail;
    db_group_stats grp_stats;     /* under grp_mu */
    struct {                      /* db_cache: objects kept with the db (under lock) */
        void *obj;
        void (*release)(void *);
    } cache[DB_CACHE_SLOTS];
};

#define DB_IDLE_MAX 64

/* why the thread's last statement found PostgreSQL out of reach (db_unavailable_reason) */
static __thread char t_unavailable[512];

static int g_sync_full = 0;

void db_set_durability_full(int on) { g_sync_full = on; }

/* ---------------------------------------------------------------- residency */

static long g_resident_max_mb = 2048;

void db_set_resident_max_mb(long max_mb) { g_resident_max_mb = max_mb; }

typedef struct resident_map {
    void *addr;
    size_t len;
} resident_map;

typedef struct resident_file {
    const char *suffix;           /* "" (the database) or "-wal" */
    size_t mapped;                /* bytes from offset 0 locked so far */
    resident_map *maps;
    int n, cap;
} resident_file;

/* Locks what the file has grown by since the last call: a new mapping of
 * [mapped, size rounded down to a page), mlock'ed. 0, or -1 (why in err). */
static int resident_grow(const char *path, resident_file *f, size_t *total, size_t max, char *err, size_t errlen) {
    char name[PATH_MAX];
    if (sfmt(name, sizeof name, "%s%s", path, f->suffix) < 0) return 0;
    struct stat st;
    if (stat(name, &st) < 0) return 0; /* no WAL yet */
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t want = (size_t)st.st_size / page * page;
    if (want <= f->mapped) return 0;
    size_t add = want - f->mapped;
    if (*total + add > max) {
        snprintf(err, errlen, "the database and its WAL outgrew --db-resident-mb (%zu MiB): the rest stays on disk",
                 max >> 20);
        return -1;
    }
    int fd = open(name, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    void *a = mmap(NULL, add, PROT_READ, MAP_SHARED, fd, (off_t)f->mapped);
    close(fd);
    if (a == MAP_FAILED) {
        snprintf(err, errlen, "mmap of %s: %s", name, strerror(errno));
        return -1;
    }
    /* the system call itself: sanitizer runtimes turn mlock() into a no-op */
    if (syscall(SYS_mlock, a, add) != 0) {
        snprintf(err, errlen, "mlock of %zu KiB of %s: %s (RLIMIT_MEMLOCK; root or LimitMEMLOCK= in the unit)",
                 add >> 10, name, strerror(errno));
        munmap(a, add);
        return -1;
    }
    if (f->n == f->cap) {
        f->cap = f->cap ? f->cap * 2 : 16;
        f->maps = xrealloc(f->maps, (size_t)f->cap * sizeof *f->maps);
    }
    f->maps[f->n++] = (resident_map){a, add};
    f->mapped = want;
    *total += add;
    return 0;
}

static void resident_release(resident_file *f) {
    for (int i = 0; i < f->n; i++) munmap(f->maps[i].addr, f->maps[i].len);
    free(f->maps);
    memset(f, 0, sizeof *f);
}

/* ---------------------------------------------------------------- connections */

static void conn_free(db_thread_conn *c) {
    for (size_t i = 0; i < c->nslots; i++)
        if (c->slots[i].st) {
            if (c->slots[i].st->s) sqlite3_finalize(c->slots[i].st->s);
            pg_stmt_free(c->slots[i].st->p);
            free(c->slots[i].st);
        }
    free(c->slots);
    free(c->chg);
    if (c->conn) sqlite3_close(c->conn);
    pg_close(c->pg);
    free(c);
}

/* Inside a transaction (BEGIN ran, COMMIT or ROLLBACK not yet). */
static int conn_in_tx(db_thread_conn *c) { return c->pg ? pg_in_tx(c->pg) : !sqlite3_get_autocommit(c->conn); }

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
    if (conn_in_tx(c)) {
        if (c->pg) pg_exec(c->pg, "ROLLBACK");
        else sqlite3_exec(c->conn, "ROLLBACK", NULL, NULL, NULL);
    }
    if (c->holds_write) {
        c->holds_write = 0;
        pthread_mutex_unlock(&d->write);
    }
    for (size_t i = 0; i < c->nslots; i++)
        if (c->slots[i].st) {
            if (c->slots[i].st->s) sqlite3_reset(c->slots[i].st->s);
            else pg_reset(c->slots[i].st->p);
        }
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

/* Busy handler: short sleeps (20 us doubling to 1 ms) for up to 10 s. SQLite's
 * own (sqlite3_busy_timeout) sleeps 1, 2, 5, 10 ... 100 ms between tries, so a
 * writer that meets the lock twice already waits 8 ms after it was freed. */
#define DB_BUSY_TRIES 10000
static int busy_wait(void *arg, int n) {
    (void)arg;
    if (n >= DB_BUSY_TRIES) return 0;
    long us = n < 6 ? 20L << n : 1000L;
    struct timespec ts = {0, us * 1000L};
    nanosleep(&ts, NULL);
    return 1;
}

/* The WAL grew by this many frames (pages) since the last checkpoint, or
 * since it restarted: wake the checkpointer. Counting from the last
 * checkpoint matters: a WAL that readers keep from restarting holds more
 * than this for long stretches, and a wake on every commit past it made a
 * checkpoint (with its two fsyncs) of a few frames per commit, 600 a
 * second under bench/api's submissions (docs/storage.md). */
#define DB_CKPT_FRAMES 1000

static void changes_publish(db *d, db_thread_conn *c);

static int wal_hook(void *arg, sqlite3 *conn, const char *name, int frames) {
    (void)name;
    db_thread_conn *c = arg;
    if (!c) return SQLITE_OK;
    db *d = c->owner;
    /* after the commit is visible: the changes it made go to the log (a
     * reader that drains them afterwards reads the rows as committed), and
     * a reader that saw the old number reads again (db_generation) */
    changes_publish(d, c);
    if (c->auth_dirty) {
        c->auth_dirty = 0;
        __atomic_fetch_add(&d->auth_generation, 1, __ATOMIC_RELEASE);
    }
    __atomic_fetch_add(&d->generation, 1, __ATOMIC_RELEASE);
    if (!d->ckpt_running || getpid() != d->ckpt_pid) { /* no checkpointer thread, or a fork
                                                          child (check's test runner) */
        if (frames >= DB_CKPT_FRAMES) sqlite3_wal_checkpoint_v2(conn, NULL, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
        return SQLITE_OK;
    }
    pthread_mutex_lock(&d->ckpt_mu);
    d->wal_frames = frames;
    d->ckpt_new = 1;
    if (frames < d->ckpt_from) d->ckpt_from = 0; /* the WAL restarted */
    if (frames - d->ckpt_from >= DB_CKPT_FRAMES) pthread_cond_signal(&d->ckpt_cv);
    pthread_mutex_unlock(&d->ckpt_mu);
    return SQLITE_OK;
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
    sqlite3_busy_handler(conn, busy_wait, NULL);
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

static int trace_ms(void);
static int commit_hook(void *arg);
static void update_hook(void *arg, int op, const char *dbname, const char *table, sqlite3_int64 rowid);
static void rollback_hook(void *arg);

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
    char err[512];
    if (d->pg_url) {
        pg_conn *pc = pg_connect(d->pg_url, d->pg_password, "trainyard", &d->stop_ms, err, sizeof err);
        if (!pc) {
            log_error("db: %s", err);
            snprintf(t_unavailable, sizeof t_unavailable, "%s", err); /* for the request's 503 */
            return NULL;
        }
        c = xcalloc(1, sizeof *c);
        c->owner = d;
        c->pg = pc;
    } else {
        sqlite3 *conn = conn_open(d->path, err, sizeof err);
        if (!conn) {
            log_error("db: %s", err);
            return NULL;
        }
        if (trace_ms()) sqlite3_commit_hook(conn, commit_hook, NULL);
        c = xcalloc(1, sizeof *c);
        c->owner = d;
        c->conn = conn;
        sqlite3_wal_hook(conn, wal_hook, c); /* replaces the autocheckpoint */
        sqlite3_update_hook(conn, update_hook, c);
        sqlite3_rollback_hook(conn, rollback_hook, c);
    }
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

static sqlite3 *db_conn(db *d) {
    db_thread_conn *c = thread_conn(d);
    return c ? c->conn : NULL;
}

struct sqlite3 *db_sqlite(db *d) { return d->pg_url ? NULL : db_conn(d); }

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

static void stmt_reset(db_stmt *st) {
    if (st->s) {
        sqlite3_reset(st->s);
        sqlite3_clear_bindings(st->s);
    } else {
        pg_reset(st->p);
    }
}

db_stmt *db_prepare(db *d, const char *sql) {
    db_thread_conn *c = thread_conn(d);
    if (!c) return NULL;
    size_t i = slot_index(sql, c->nslots);
    while (c->slots[i].sql) {
        if (c->slots[i].sql == sql) {
            db_stmt *st = c->slots[i].st;
            stmt_reset(st);
            return st;
        }
        i = (i + 1) & (c->nslots - 1);
    }
    sqlite3_stmt *s = NULL;
    pg_stmt *p = NULL;
    if (c->pg) {
        p = pg_prepare(c->pg, sql);
        if (!p) {
            log_error("postgres prepare: %s: %s", pg_errmsg(c->pg), sql);
            return NULL;
        }
    } else {
        int rc = sqlite3_prepare_v3(c->conn, sql, -1, SQLITE_PREPARE_PERSISTENT, &s, NULL);
        if (rc != SQLITE_OK) {
            log_error("sqlite prepare: %s: %s", sqlite3_errmsg(c->conn), sql);
            return NULL;
        }
    }
    if ((c->used + 1) * 2 > c->nslots) {
        slots_grow(c);
        i = slot_index(sql, c->nslots);
        while (c->slots[i].sql) i = (i + 1) & (c->nslots - 1);
    }
    db_stmt *st = xmalloc(sizeof *st);
    st->s = s;
    st->p = p;
    st->c = c;
    c->slots[i].sql = sql;
    c->slots[i].st = st;
    c->used++;
    return st;
}

void db_done(db_stmt *st) {
    if (st) stmt_reset(st);
}

static int conn_exec(db_thread_conn *c, const char *sql);

const char *db_sql(db *d, const char *sqlite_sql, const char *pg_sql) { return d->pg_url ? pg_sql : sqlite_sql; }

db_stmt *db_prepare2(db *d, const char *sqlite_sql, const char *pg_sql) {
    return db_prepare(d, d->pg_url ? pg_sql : sqlite_sql);
}

int db_begin_read(db *d) {
    db_thread_conn *c = thread_conn(d);
    if (!c) return -1;
    return conn_exec(c, c->pg ? "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY" : "BEGIN DEFERRED");
}

static void pg_autocommit_done(db_thread_conn *c);
static int pg_epoch_ready(db_thread_conn *c);
static void lease_fenced(db *d);

const char *db_unavailable_reason(void) { return t_unavailable[0] ? t_unavailable : NULL; }

/* The reason of a DB_UNAVAILABLE or DB_FENCED answer on c, kept for the
 * thread's 503 (db_unavailable_reason); any other answer clears it. */
static void note_unavailable(db_thread_conn *c, int rc) {
    if (rc == DB_UNAVAILABLE)
        snprintf(t_unavailable, sizeof t_unavailable, "the database does not answer: %s: %s", c->owner->path,
                 pg_errmsg(c->pg));
    else if (rc == DB_FENCED)
        snprintf(t_unavailable, sizeof t_unavailable,
                 "this server no longer holds the lease (another leads, or its lease expired); nothing was written");
    else
        t_unavailable[0] = '\0';
}

int db_step(db_stmt *st) {
    if (st->p) {
        int ran = 0;
        if (!pg_in_tx(st->c->pg) && pg_is_write(st->p)) {
            int e = pg_epoch_ready(st->c);
            if (e) return e;
        }
        int rc = pg_step(st->p, &ran);
        if (rc == DB_FENCED) lease_fenced(st->c->owner);
        if (ran || rc == DB_UNAVAILABLE) note_unavailable(st->c, rc);
        /* a write outside a transaction has committed: publish it as a
         * COMMIT does (its captured changes, the generations) */
        if (ran && (rc == DB_ROW || rc == DB_DONE) && pg_is_write(st->p) && !pg_in_tx(st->c->pg))
            pg_autocommit_done(st->c);
        return rc;
    }
    int rc = sqlite3_step(st->s);
    if (rc == SQLITE_ROW || rc == SQLITE_DONE) return rc;
    switch (rc & 0xff) { /* extended codes: the primary code is the low byte */
    case SQLITE_CONSTRAINT: return DB_CONSTRAINT;
    case SQLITE_BUSY:
    case SQLITE_LOCKED: return DB_BUSY;
    case SQLITE_FULL: return DB_FULL;
    default: return DB_ERR;
    }
}

int db_bind_int64(db_stmt *st, int i, int64_t v) {
    return st->p ? pg_bind_int64(st->p, i, v) : sqlite3_bind_int64(st->s, i, v);
}
int db_bind_int(db_stmt *st, int i, int v) { return st->p ? pg_bind_int64(st->p, i, v) : sqlite3_bind_int(st->s, i, v); }
int db_bind_double(db_stmt *st, int i, double v) {
    return st->p ? pg_bind_double(st->p, i, v) : sqlite3_bind_double(st->s, i, v);
}
int db_bind_null(db_stmt *st, int i) { return st->p ? pg_bind_null(st->p, i) : sqlite3_bind_null(st->s, i); }
int db_bind_text(db_stmt *st, int i, const char *s, int n) {
    if (st->p) return pg_bind_text(st->p, i, s, n, 1);
    return s ? sqlite3_bind_text(st->s, i, s, n, SQLITE_TRANSIENT) : sqlite3_bind_null(st->s, i);
}
int db_bind_text_static(db_stmt *st, int i, const char *s, int n) {
    if (st->p) return pg_bind_text(st->p, i, s, n, 0);
    return s ? sqlite3_bind_text(st->s, i, s, n, SQLITE_STATIC) : sqlite3_bind_null(st->s, i);
}
int db_bind_blob(db_stmt *st, int i, const void *p, int n) {
    return st->p ? pg_bind_blob(st->p, i, p, n) : sqlite3_bind_blob(st->s, i, p, n, SQLITE_TRANSIENT);
}

int db_col_type(db_stmt *st, int i) { return st->p ? pg_col_type(st->p, i) : sqlite3_column_type(st->s, i); }
int64_t db_col_int64(db_stmt *st, int i) {
    return st->p ? pg_col_int64(st->p, i) : sqlite3_column_int64(st->s, i);
}
int db_col_int(db_stmt *st, int i) { return st->p ? (int)pg_col_int64(st->p, i) : sqlite3_column_int(st->s, i); }
double db_col_double(db_stmt *st, int i) {
    return st->p ? pg_col_double(st->p, i) : sqlite3_column_double(st->s, i);
}
const char *db_col_text(db_stmt *st, int i) {
    return st->p ? pg_col_text(st->p, i) : (const char *)sqlite3_column_text(st->s, i);
}
const void *db_col_blob(db_stmt *st, int i) {
    return st->p ? pg_col_blob(st->p, i) : sqlite3_column_blob(st->s, i);
}
int db_col_bytes(db_stmt *st, int i) { return st->p ? pg_col_bytes(st->p, i) : sqlite3_column_bytes(st->s, i); }

int64_t db_changes(db *d) {
    db_thread_conn *c = thread_conn(d);
    if (!c) return 0;
    return c->pg ? pg_changes(c->pg) : sqlite3_changes64(c->conn);
}

const char *db_errmsg(db *d) {
    db_thread_conn *c = thread_conn(d);
    if (!c) return "no database connection";
    return c->pg ? pg_errmsg(c->pg) : sqlite3_errmsg(c->conn);
}

uint64_t db_round_trips(void) { return pg_round_trips(); }

int db_in_tx(db *d) {
    db_thread_conn *c = thread_conn(d);
    return c && conn_in_tx(c);
}

/* Runs sql on c: 0 or -1 (logged). */
static int conn_exec(db_thread_conn *c, const char *sql) {
    if (!c->pg) return exec_simple(c->conn, sql);
    int rc = pg_exec(c->pg, sql);
    note_unavailable(c, rc);
    if (rc != 0) {
        log_error("postgres: %s: %s", sql, pg_errmsg(c->pg));
        return -1;
    }
    return 0;
}

int db_exec(db *d, const char *sql) {
    db_thread_conn *c = thread_conn(d);
    if (!c) return -1;
    if (c->pg && !pg_in_tx(c->pg) && pg_epoch_ready(c) != 0) return -1;
    int rc = conn_exec(c, sql);
    /* text run outside a transaction has committed on its own: publish its
     * captured changes and move the generations, as db_step does (else they
     * waited in ty_changes for the connection's next commit) */
    if (rc == 0 && c->pg && !pg_in_tx(c->pg)) pg_autocommit_done(c);
    return rc;
}

/* ---------------------------------------------------------------- tracing
 * TRAINYARD_DB_TRACE=MS (read once) logs every wait for the write turn and
 * every hold of it past MS milliseconds, with the hold's time on the CPU, its
 * BEGIN's wait for SQLite's lock and the thread's context switches, and the
 * first 30 commits made outside db_begin (autocommit writes), each with its
 * caller as an offset for `addr2line -f -e build/trainyard`. Off: one load. */

static int g_trace = -1;
static int g_autocommit_logged;
static __thread int t_in_begin;
static __thread double t_write_from, t_write_cpu, t_begin_ms;
static __thread long t_vcsw, t_ivcsw;
static __thread void *t_write_caller;

static int trace_ms(void) {
    int t = __atomic_load_n(&g_trace, __ATOMIC_RELAXED);
    if (t < 0) {
        const char *e = getenv("TRAINYARD_DB_TRACE");
        long v = 0;
        t = e && parse_long(e, 1, 100000, &v) == 0 ? (int)v : 0;
        __atomic_store_n(&g_trace, t, __ATOMIC_RELAXED);
    }
    return t;
}

/* The caller as an offset in its object. */
static void *rel(void *caller) {
    Dl_info di;
    return dladdr(caller, &di) && di.dli_fbase ? (void *)((char *)caller - (char *)di.dli_fbase) : caller;
}

static int commit_hook(void *arg) {
    (void)arg;
    if (t_in_begin || __atomic_fetch_add(&g_autocommit_logged, 1, __ATOMIC_RELAXED) >= 30) return 0;
    void *fr[8];
    int n = backtrace(fr, 8);
    char line[512];
    int off = 0;
    for (int i = 2; i < n && off < (int)sizeof line - 24; i++)
        off += snprintf(line + off, sizeof line - (size_t)off, " %p", rel(fr[i]));
    log_warn("db trace: autocommit write from%s", line);
    return 0;
}

/* ---------------------------------------------------------------- the write turn */

/* Takes d->write for this thread (at most 10 s): 0, or -1 on timeout. */
static int write_lock(db *d, db_thread_conn *c, void *caller) {
    if (c->holds_write) return 0;
    double t0 = trace_ms() ? mono_s() : 0;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 10;
    int rc = pthread_mutex_timedlock(&d->write, &ts);
    if (rc != 0) {
        log_error("db: no write turn in 10 s: %s", strerror(rc));
        return -1;
    }
    c->holds_write = 1;
    t_in_begin = 1;
    if (t0 > 0) {
        t_write_from = mono_s();
        t_write_cpu = thread_cpu_s();
        struct rusage ru;
        getrusage(RUSAGE_THREAD, &ru);
        t_vcsw = ru.ru_nvcsw;
        t_ivcsw = ru.ru_nivcsw;
        t_write_caller = rel(caller);
        if ((t_write_from - t0) * 1000 > trace_ms())
            log_warn("db trace: waited %.1f ms for the write turn (caller %p)", (t_write_from - t0) * 1000, rel(caller));
    }
    return 0;
}

static void write_unlock(db *d, db_thread_conn *c) {
    if (!c->holds_write) return;
    c->holds_write = 0;
    t_in_begin = 0;
    pthread_mutex_unlock(&d->write);
    if (trace_ms() && (mono_s() - t_write_from) * 1000 > trace_ms()) {
        struct rusage ru;
        getrusage(RUSAGE_THREAD, &ru);
        log_warn("db trace: held the write turn %.1f ms, %.1f ms on the CPU, BEGIN %.1f ms, switches %ld voluntary"
                 " %ld preempted (caller %p)",
                 (mono_s() - t_write_from) * 1000, (thread_cpu_s() - t_write_cpu) * 1000, t_begin_ms,
                 ru.ru_nvcsw - t_vcsw, ru.ru_nivcsw - t_ivcsw, t_write_caller);
    }
}

int db_begin(db *d) {
    db_thread_conn *c = thread_conn(d);
    if (!c) return -1;
    int nested = c->holds_write; /* a BEGIN inside a transaction: SQLite refuses it, the turn stays */
    if (write_lock(d, c, __builtin_return_address(0)) < 0) return -1;
    double t0 = trace_ms() ? mono_s() : 0;
    int rc;
    if (c->pg) /* PostgreSQL only warns of a BEGIN inside a transaction: refuse it as SQLite does */
        rc = pg_in_tx(c->pg) || pg_epoch_ready(c) != 0 ? -1 : conn_exec(c, "BEGIN");
    else
        rc = exec_simple(c->conn, "BEGIN IMMEDIATE");
    if (t0 > 0) t_begin_ms = (mono_s() - t0) * 1000;
    if (rc < 0) {
        if (!nested) write_unlock(d, c);
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- notes */

#define NOTES_MAX (64 * 1024)
static __thread char t_notes[NOTES_MAX]; /* lines, each NUL-terminated, kept until the commit */
static __thread size_t t_notes_len;

static void notes_flush(int say) {
    for (size_t off = 0; say && off < t_notes_len; off += strlen(t_notes + off) + 1) log_info("%s", t_notes + off);
    t_notes_len = 0;
}

void db_note(db *d, const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    db_thread_conn *c = thread_conn(d);
    if (!c || !conn_in_tx(c)) { /* no transaction: the change is done */
        log_info("%s", line);
        return;
    }
    size_t len = strlen(line) + 1;
    if (t_notes_len + len > NOTES_MAX) return;
    memcpy(t_notes + t_notes_len, line, len);
    t_notes_len += len;
}

size_t db_notes_mark(void) { return t_notes_len; }

void db_notes_rewind(size_t mark) {
    if (mark < t_notes_len) t_notes_len = mark;
}

/* ---------------------------------------------------------------- wakes */

#define WAKES_MAX 1024
static __thread int64_t t_wakes[WAKES_MAX]; /* nodes to tell of after the commit */
static __thread int t_nwakes, t_wakes_all;   /* t_wakes_all: more than WAKES_MAX */

static int cmp_node(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static void wakes_flush(db *d, int tell) {
    int n = t_nwakes, all = t_wakes_all;
    t_nwakes = t_wakes_all = 0;
    if (!tell || !d->wake_fn) return;
    if (all) {
        d->wake_fn(d->wake_cls, NULL, -1);
        return;
    }
    if (n == 0) return;
    qsort(t_wakes, (size_t)n, sizeof *t_wakes, cmp_node);
    int m = 0;
    for (int i = 0; i < n; i++)
        if (m == 0 || t_wakes[m - 1] != t_wakes[i]) t_wakes[m++] = t_wakes[i];
    d->wake_fn(d->wake_cls, t_wakes, m);
}

void db_set_wake_hook(db *d, void (*fn)(void *cls, const int64_t *nodes, int n), void *cls) {
    d->wake_cls = cls;
    d->wake_fn = fn;
}

void db_wake_node(db *d, int64_t node) {
    if (!d->wake_fn) return;
    db_thread_conn *c = thread_conn(d);
    if (!c || !conn_in_tx(c)) { /* no transaction: the change is done */
        d->wake_fn(d->wake_cls, &node, 1);
        return;
    }
    if (t_nwakes < WAKES_MAX) t_wakes[t_nwakes++] = node;
    else t_wakes_all = 1;
}

/* ---------------------------------------------------------------- changes */

/* Per transaction: at most this many listed changes, then "everything". */
#define CHG_PENDING_MAX 65536

static void chg_add(db_thread_conn *c, int table, int64_t id) {
    if (c->chg_all) return;
    if (c->n_chg == CHG_PENDING_MAX) {
        c->chg_all = 1;
        return;
    }
    if (c->n_chg == c->cap_chg) {
        c->cap_chg = c->cap_chg ? c->cap_chg * 2 : 256;
        c->chg = xrealloc(c->chg, c->cap_chg * sizeof *c->chg);
    }
    c->chg[c->n_chg++] = (db_change){table, id};
}

/* Rows of the tables the pass reads, written through this connection: every
 * INSERT, UPDATE and DELETE of a rowid table. nodes are left out (each
 * heartbeat updates its node: the node writers that matter note it with
 * db_change_note); node_failures has no rowid (its writer notes it). */
static void update_hook(void *arg, int op, const char *dbname, const char *table, sqlite3_int64 rowid) {
    (void)op;
    (void)dbname;
    db_thread_conn *c = arg;
    int t;
    switch (table[0]) {
    case 'j': t = strcmp(table, "jobs") == 0 ? DB_CH_JOB : 0; break;
    case 't':
        t = strcmp(table, "tasks") == 0 ? DB_CH_TASK : strcmp(table, "teams") == 0 ? DB_CH_TEAM : 0;
        if (t == DB_CH_TEAM || strcmp(table, "tokens") == 0) c->auth_dirty = 1;
        break;
    case 'u': /* users, user_tokens: who a cached token speaks for (members has no rowid: never cached);
               * user_usage: the level of the fair share below teams, followed as the teams' */
        t = strcmp(table, "user_usage") == 0 ? DB_CH_TEAM : 0;
        if (strcmp(table, "users") == 0 || strcmp(table, "user_tokens") == 0) c->auth_dirty = 1;
        break;
    case 'a': t = strcmp(table, "allocations") == 0 ? DB_CH_ALLOC : 0; break; /* rowid = device_id */
    case 'd': t = strcmp(table, "devices") == 0 ? DB_CH_DEVICE : 0; break;
    default: t = 0;
    }
    if (t) chg_add(c, t, rowid);
}

static void rollback_hook(void *arg) {
    db_thread_conn *c = arg;
    c->auth_dirty = 0;
    c->n_chg = 0;
    c->chg_all = 0;
}

void db_change_note(db *d, int table, int64_t id) {
    db_thread_conn *c = thread_conn(d);
    if (!c) return;
    int autocommit = !conn_in_tx(c);
    chg_add(c, table, id);
    if (autocommit) changes_publish(d, c); /* the statement has committed */
}

size_t db_changes_mark(db *d) {
    db_thread_conn *c = thread_conn(d);
    return c && !c->chg_all ? c->n_chg : 0;
}

void db_changes_rewind(db *d, size_t mark) {
    db_thread_conn *c = thread_conn(d);
    if (c && !c->chg_all && mark < c->n_chg) c->n_chg = mark;
}

static void changes_publish(db *d, db_thread_conn *c) {
    if (!c->n_chg && !c->chg_all) return;
    pthread_mutex_lock(&d->chg_mu);
    if (c->chg_all) {
        d->log_all = ++d->log_head;
    } else {
        if (!d->log) d->log = xcalloc(DB_CHANGES_CAP, sizeof *d->log);
        for (size_t i = 0; i < c->n_chg; i++) d->log[d->log_head++ % DB_CHANGES_CAP] = c->chg[i];
    }
    pthread_mutex_unlock(&d->chg_mu);
    c->n_chg = 0;
    c->chg_all = 0;
    if (c->cap_chg > 4096) { /* a bulk transaction's array is not kept */
        free(c->chg);
        c->chg = NULL;
        c->cap_chg = 0;
    }
}

uint64_t db_changes_head(db *d) {
    pthread_mutex_lock(&d->chg_mu);
    uint64_t h = d->log_head;
    pthread_mutex_unlock(&d->chg_mu);
    return h;
}

int db_changes_read(db *d, uint64_t *from, db_change **out, size_t *n) {
    *out = NULL;
    *n = 0;
    if (!d->wal) return 1; /* commits go unseen (db_generation) */
    pthread_mutex_lock(&d->chg_mu);
    uint64_t head = d->log_head, f = *from;
    int gap = f > head || f < d->log_all || head - f > DB_CHANGES_CAP || (head > f && !d->log);
    if (!gap && head > f) {
        *n = (size_t)(head - f);
        *out = xmalloc(*n * sizeof **out);
        for (uint64_t s = f; s < head; s++) (*out)[s - f] = d->log[s % DB_CHANGES_CAP];
    }
    *from = head;
    pthread_mutex_unlock(&d->chg_mu);
    return gap;
}

static __thread int (*t_pre_fn)(db *d, void *arg);
static __thread void *t_pre_arg;

void db_precommit(db *d, int (*fn)(db *d, void *arg), void *arg) {
    (void)d;
    t_pre_fn = fn;
    t_pre_arg = arg;
}

/* ---------------------------------------------------------------- PostgreSQL's commits
 * What SQLite's hooks do, PostgreSQL's triggers do: the ty_note_* triggers
 * write each change a transaction makes to the tables the pass reads into
 * ty_changes, marked with the session's backend pid (and a (100, 0) for the
 * tables tokens are read from). A commit drains the session's rows inside
 * the transaction, so the rows it hands over are exactly the committed
 * transaction's, then publishes them as the WAL hook does once COMMIT has
 * returned. */

static void pg_chg_add(void *cls, int table, int64_t id) {
    db_thread_conn *c = cls;
    if (table == 100) c->auth_dirty = 1;
    else chg_add(c, table, id);
}

/* After a commit of this connection: the changes to the log, and the
 * numbers that say "read again" (db_generation, db_auth_generation). */
static void pg_published(db_thread_conn *c) {
    db *d = c->owner;
    changes_publish(d, c);
    if (c->auth_dirty) {
        c->auth_dirty = 0;
        __atomic_fetch_add(&d->auth_generation, 1, __ATOMIC_RELEASE);
    }
    __atomic_fetch_add(&d->generation, 1, __ATOMIC_RELEASE);
}

/* COMMIT of c's open transaction: 0, or -1 with nothing of it published
 * (rolled back; or, when the connection died with the COMMIT in flight,
 * an outcome the database alone knows: the caller answers 503). */
static int pg_commit(db_thread_conn *c) {
    int rc = -1;
    if (pg_tx_failed(c->pg)) {
        log_warn("postgres: a transaction that failed was rolled back: %s", pg_errmsg(c->pg));
    } else {
        int e = pg_drain_commit(c->pg, pg_chg_add, c);
        note_unavailable(c, e);
        if (e != 0) log_error("postgres: %s", pg_errmsg(c->pg));
        else if (!pg_in_tx(c->pg)) rc = 0;
    }
    if (rc == 0) {
        pg_published(c);
        pg_chg_tidy(c->pg);
        return 0;
    }
    if (pg_in_tx(c->pg)) conn_exec(c, "ROLLBACK");
    c->n_chg = 0;
    c->chg_all = 0;
    c->auth_dirty = 0;
    return -1;
}

/* A write outside a transaction has committed on its own. */
static void pg_autocommit_done(db_thread_conn *c) {
    if (pg_drain(c->pg, pg_chg_add, c) != 0) {
        /* the change is committed but not listed: readers reload everything */
        log_warn("postgres: %s", pg_errmsg(c->pg));
        c->chg_all = 1;
    }
    pg_published(c);
    pg_chg_tidy(c->pg);
}

/* The session carries the fencing number the server leads with, so its
 * writes pass ty_fence (none while it does not lead: they are refused). */
static int pg_epoch_ready(db_thread_conn *c) {
    int64_t e = __atomic_load_n(&c->owner->epoch, __ATOMIC_ACQUIRE);
    if (e <= 0 || pg_epoch_set(c->pg) == e) return 0;
    int rc = pg_set_epoch(c->pg, e);
    if (rc) {
        log_warn("postgres: cannot set the fencing number: %s", pg_errmsg(c->pg));
        note_unavailable(c, rc == DB_UNAVAILABLE ? rc : DB_OK);
    }
    return rc;
}

int db_commit(db *d) {
    db_thread_conn *c = thread_conn(d);
    if (!c) return -1;
    int rc = 0;
    int (*pre)(db *, void *) = t_pre_fn;
    t_pre_fn = NULL; /* once: the first transaction the request commits */
    if (pre && conn_in_tx(c) && pre(d, t_pre_arg) < 0) {
        conn_exec(c, "ROLLBACK");
        c->n_chg = 0;
        c->chg_all = 0;
        write_unlock(d, c);
        notes_flush(0);
        wakes_flush(d, 0);
        return -1;
    }
    if (c->pg) {
        rc = pg_commit(c);
    } else if (exec_simple(c->conn, "COMMIT") < 0) {
        if (!sqlite3_get_autocommit(c->conn)) exec_simple(c->conn, "ROLLBACK");
        c->n_chg = 0;
        c->chg_all = 0;
        rc = -1;
    } else {
        changes_publish(d, c); /* the WAL hook did already, unless the file is not in WAL mode */
    }
    write_unlock(d, c);
    notes_flush(rc == 0);
    wakes_flush(d, rc == 0);
    return rc;
}

void db_rollback(db *d) {
    db_thread_conn *c = thread_conn(d);
    if (!c) return;
    if (conn_in_tx(c)) conn_exec(c, "ROLLBACK");
    if (c->pg) {
        c->n_chg = 0;
        c->chg_all = 0;
        c->auth_dirty = 0;
    }
    write_unlock(d, c);
    notes_flush(0);
    wakes_flush(d, 0);
}

/* ---------------------------------------------------------------- disk space */

int db_disk_full(db *d, char *msg, size_t cap) {
    if (d->pg_url) return 0; /* PostgreSQL's disk: a full one fails the write (DB_FULL) */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", d->path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) *slash = '\0';
    else snprintf(dir, sizeof dir, "%s", slash ? "/" : ".");
    struct statvfs sv;
    if (statvfs(dir, &sv) < 0) return 0;
    unsigned long long avail = (unsigned long long)sv.f_bavail * sv.f_frsize;
    if (avail >= DB_DISK_LOW) return 0;
    if (msg && cap)
        snprintf(msg, cap, "the disk holding %s is full (%llu KiB free); writes are refused until space is freed",
                 dir, avail / 1024);
    return 1;
}

/* ---------------------------------------------------------------- checkpointer */

static void *ckpt_main(void *arg) {
    db *d = arg;
    /* the files kept resident (db_set_resident_max_mb), grown here once a second
     * or after a checkpoint */
    resident_file res[2] = {{.suffix = ""}, {.suffix = "-wal"}};
    size_t res_total = 0, res_max = g_resident_max_mb > 0 ? (size_t)g_resident_max_mb << 20 : 0;
    int res_on = res_max > 0;
    pthread_mutex_lock(&d->ckpt_mu);
    while (!d->ckpt_stop) {
        if (res_on) {
            pthread_mutex_unlock(&d->ckpt_mu);
            char why[PATH_MAX + 200] = "";
            for (int i = 0; i < 2 && res_on; i++)
                if (resident_grow(d->path, &res[i], &res_total, res_max, why, sizeof why) < 0) {
                    log_warn("db: the database is no longer kept in memory: %s", why);
                    res_on = 0;
                }
            pthread_mutex_lock(&d->ckpt_mu);
        }
        /* DB_CKPT_FRAMES more since the last checkpoint, else once a second
         * when anything was committed */
        if (d->wal_frames - d->ckpt_from < DB_CKPT_FRAMES) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += 1;
            pthread_cond_timedwait(&d->ckpt_cv, &d->ckpt_mu, &ts);
        }
        if (d->ckpt_stop) break;
        int due = d->ckpt_new;
        d->ckpt_new = 0;
        pthread_mutex_unlock(&d->ckpt_mu);
        int log = -1, done = 0;
        if (due) {
            sqlite3 *conn = db_conn(d);
            /* PASSIVE: never waits for, nor blocks, readers and writers */
            double t0 = mono_s();
            int rc = conn ? sqlite3_wal_checkpoint_v2(conn, NULL, SQLITE_CHECKPOINT_PASSIVE, &log, &done) : SQLITE_ERROR;
            if (trace_ms() && (mono_s() - t0) * 1000 > trace_ms())
                log_warn("db trace: checkpoint of %d frames (%d done) took %.1f ms", log, done, (mono_s() - t0) * 1000);
            if (rc != SQLITE_OK && rc != SQLITE_BUSY)
                log_warn("db: checkpoint: %s", conn ? sqlite3_errmsg(conn) : "no connection");
            if (rc != SQLITE_OK) log = -1;
        }
        pthread_mutex_lock(&d->ckpt_mu);
        if (due) d->ckpt_count++;
        if (log >= 0) d->ckpt_from = log; /* what the WAL held when it was checkpointed */
    }
    pthread_mutex_unlock(&d->ckpt_mu);
    resident_release(&res[0]);
    resident_release(&res[1]);
    return NULL;
}

/* ---------------------------------------------------------------- group commit
 * One committer thread per db. It sleeps while nothing is queued; woken, it
 * takes what is queued (at most DB_GROUP_MAX), runs the items in one
 * transaction, a savepoint each, commits, and calls their done. What
 * arrives meanwhile is the next batch: nothing ever waits for a batch to
 * fill, and an item waits at most for the batch before it (and for the
 * write turn, like any db_begin). */

static const char SQL_GRP_SAVEPOINT[] = "SAVEPOINT db_group_item";
static const char SQL_GRP_ROLLBACK_TO[] = "ROLLBACK TO db_group_item";
static const char SQL_GRP_RELEASE[] = "RELEASE db_group_item";

static int step_const(db *d, const char *sql) {
    db_stmt *st = db_prepare(d, sql);
    if (!st) return -1;
    int rc = db_step(st);
    db_done(st);
    return rc == DB_DONE ? 0 : -1;
}

static double now_us_f(void) { return mono_s() * 1e6; }

/* Runs one batch (a list linked through next) and calls every done. */
static void group_commit(db *d, db_group_item *batch) {
    double t0 = now_us_f();
    uint64_t n = 0, wait_sum = 0, wait_max = 0;
    for (db_group_item *it = batch; it; it = it->next) {
        n++;
        it->rc = -1;
        uint64_t w = t0 > (double)it->queued_us ? (uint64_t)(t0 - (double)it->queued_us) : 0;
        wait_sum += w;
        if (w > wait_max) wait_max = w;
    }
    db_thread_conn *conn = thread_conn(d);
    if (conn && db_begin(d) == 0) {
        int lost = 0; /* the transaction ended under us (SQLite rolls it all back on some errors) */
        for (db_group_item *it = batch; it && !lost; it = it->next) {
            size_t notes = db_notes_mark(), changes = db_changes_mark(d);
            if (step_const(d, SQL_GRP_SAVEPOINT) < 0) {
                lost = !conn_in_tx(conn);
                continue;
            }
            int rc = it->run(d, it->arg);
            if (!conn_in_tx(conn)) {
                lost = 1;
                break;
            }
            if (rc != 0) {
                if (step_const(d, SQL_GRP_ROLLBACK_TO) < 0) {
                    lost = 1; /* its writes could not be undone: the batch must not commit them */
                    break;
                }
                db_notes_rewind(notes);
                db_changes_rewind(d, changes);
            }
            if (step_const(d, SQL_GRP_RELEASE) < 0) {
                lost = 1;
                break;
            }
            it->rc = rc;
        }
        if (lost) {
            log_warn("db: a group commit of %llu writes was rolled back: %s", (unsigned long long)n,
                     db_errmsg(d));
            db_rollback(d);
        } else if (db_commit(d) < 0) {
            lost = 1;
        }
        if (lost)
            for (db_group_item *it = batch; it; it = it->next) it->rc = -1;
    } else {
        log_warn("db: a group commit of %llu writes could not begin", (unsigned long long)n);
    }
    double t1 = now_us_f();
    pthread_mutex_lock(&d->grp_mu);
    d->grp_stats.batches++;
    d->grp_stats.items += n;
    if (n > d->grp_stats.largest) d->grp_stats.largest = n;
    d->grp_stats.wait_us_sum += wait_sum;
    if (wait_max > d->grp_stats.wait_us_max) d->grp_stats.wait_us_max = wait_max;
    d->grp_stats.commit_us_sum += (uint64_t)(t1 - t0);
    pthread_mutex_unlock(&d->grp_mu);
    for (db_group_item *it = batch, *next; it; it = next) {
        next = it->next; /* done may free it */
        it->done(it->arg, it->rc);
    }
}

static void *grp_main(void *arg) {
    db *d = arg;
    pthread_mutex_lock(&d->grp_mu);
    for (;;) {
        while (!d->grp_head && !d->grp_stop) pthread_cond_wait(&d->grp_cv, &d->grp_mu);
        if (!d->grp_head) break; /* stopping, and everything queued is done */
        db_group_item *batch = d->grp_head, *last = batch;
        for (int k = 1; k < DB_GROUP_MAX && last->next; k++) last = last->next;
        d->grp_head = last->next;
        if (!d->grp_head) d->grp_tail = NULL;
        last->next = NULL;
        pthread_mutex_unlock(&d->grp_mu);
        group_commit(d, batch);
        pthread_mutex_lock(&d->grp_mu);
    }
    pthread_mutex_unlock(&d->grp_mu);
    return NULL;
}

int db_group_add(db *d, db_group_item *it) {
    it->next = NULL;
    it->rc = -1;
    it->queued_us = (int64_t)now_us_f();
    pthread_mutex_lock(&d->grp_mu);
    if (d->grp_stop) {
        pthread_mutex_unlock(&d->grp_mu);
        return -1;
    }
    if (!d->grp_running || getpid() != d->grp_pid) { /* no committer in this process: alone, now */
        pthread_mutex_unlock(&d->grp_mu);
        group_commit(d, it);
        return 0;
    }
    if (d->grp_tail) d->grp_tail->next = it;
    else d->grp_head = it;
    d->grp_tail = it;
    pthread_cond_signal(&d->grp_cv);
    pthread_mutex_unlock(&d->grp_mu);
    return 0;
}

uint64_t db_checkpoints(db *d) {
    pthread_mutex_lock(&d->ckpt_mu);
    uint64_t n = d->ckpt_count;
    pthread_mutex_unlock(&d->ckpt_mu);
    return n;
}

void db_group_stats_get(db *d, db_group_stats *out) {
    pthread_mutex_lock(&d->grp_mu);
    *out = d->grp_stats;
    pthread_mutex_unlock(&d->grp_mu);
}

/* Lets the committer finish what is queued, then stops it. */
static void grp_stop(db *d) {
    pthread_mutex_lock(&d->grp_mu);
    d->grp_stop = 1;
    pthread_cond_signal(&d->grp_cv);
    int join = d->grp_running && getpid() == d->grp_pid;
    pthread_mutex_unlock(&d->grp_mu);
    if (join) pthread_join(d->grp_th, NULL);
    d->grp_running = 0;
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
    db_thread_conn *c = thread_conn(d);
    if (!c) return -1;
    if (!c->pg) return version_of(c->conn);
    int64_t v = -1;
    return pg_query_int64(c->pg, "SELECT coalesce(max(version), 0) FROM schema_migrations", 0, NULL, &v) == 0
               ? (int)v
               : -1;
}

/* PostgreSQL's history starts at the baseline (storage/schema_pg.c: the
 * schema as migrations 1..SCHEMA_PG_BASE left it, in one text); every later
 * migration has a text of its own for PostgreSQL (migration.pg). One server
 * migrates at a time (an advisory lock), each migration in a transaction of
 * its own (DDL is transactional there), recorded as SQLite records it. */
#define PG_MIGRATE_LOCK "7479"

static int pg_record(pg_conn *pc, const migration *m) {
    char ver[16], at[24];
    snprintf(ver, sizeof ver, "%d", m->version);
    snprintf(at, sizeof at, "%lld", (long long)now_ms());
    const char *vals[3] = {ver, m->name, at};
    int64_t got = 0;
    return pg_query_int64(pc, "INSERT INTO schema_migrations(version, name, applied_at) VALUES($1, $2, $3)"
                              " RETURNING version", 3, vals, &got);
}

static int pg_migrate_locked(pg_conn *pc, int target, char *err, size_t errlen) {
    int64_t exists = 0, have = 0;
    if (pg_query_int64(pc, "SELECT (to_regclass('schema_migrations') IS NOT NULL)::int", 0, NULL, &exists) != 0 ||
        (exists && pg_query_int64(pc, "SELECT coalesce(max(version), 0) FROM schema_migrations", 0, NULL, &have) != 0)) {
        snprintf(err, errlen, "cannot read the schema version: %s", pg_errmsg(pc));
        return -1;
    }
    if (have > schema_migrations_n) {
        snprintf(err, errlen, "database schema version %lld is newer than this build knows (%d)", (long long)have,
                 schema_migrations_n);
        return -1;
    }
    if (have == 0) {
        if (target < SCHEMA_PG_BASE) {
            snprintf(err, errlen, "a PostgreSQL database starts at schema version %d", SCHEMA_PG_BASE);
            return -1;
        }
        int bad = pg_exec(pc, "BEGIN") || pg_exec(pc, schema_pg_baseline);
        for (int i = 0; !bad && i < schema_migrations_n && schema_migrations[i].version <= SCHEMA_PG_BASE; i++)
            bad = pg_record(pc, &schema_migrations[i]) != 0;
        if (bad || pg_exec(pc, "COMMIT")) {
            snprintf(err, errlen, "the PostgreSQL schema (version %d) failed: %s", SCHEMA_PG_BASE, pg_errmsg(pc));
            pg_exec(pc, "ROLLBACK");
            return -1;
        }
        log_debug("db: made the PostgreSQL schema at version %d", SCHEMA_PG_BASE);
        have = SCHEMA_PG_BASE;
    }
    for (int i = 0; i < schema_migrations_n; i++) {
        const migration *m = &schema_migrations[i];
        if (m->version <= have || m->version > target) continue;
        if (!m->pg) {
            snprintf(err, errlen, "migration %d (%s) has no PostgreSQL text", m->version, m->name);
            return -1;
        }
        if (pg_exec(pc, "BEGIN") || pg_exec(pc, m->pg) || pg_exec(pc, "SELECT ty_install_fences()") ||
            pg_record(pc, m) || pg_exec(pc, "COMMIT")) {
            snprintf(err, errlen, "migration %d (%s) failed: %s", m->version, m->name, pg_errmsg(pc));
            pg_exec(pc, "ROLLBACK");
            return -1;
        }
        log_debug("db: applied migration %d (%s)", m->version, m->name);
    }
    return 0;
}

static int pg_migrate(pg_conn *pc, int target, char *err, size_t errlen) {
    if (pg_exec(pc, "SELECT pg_advisory_lock(" PG_MIGRATE_LOCK ")")) {
        snprintf(err, errlen, "cannot take the migration lock: %s", pg_errmsg(pc));
        return -1;
    }
    int rc = pg_migrate_locked(pc, target, err, errlen);
    pg_exec(pc, "SELECT pg_advisory_unlock(" PG_MIGRATE_LOCK ")");
    return rc;
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

static int journal_is_wal(sqlite3 *conn) {
    sqlite3_stmt *st = NULL;
    int wal = 0;
    if (sqlite3_prepare_v2(conn, "PRAGMA journal_mode", -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW) {
        const char *m = (const char *)sqlite3_column_text(st, 0);
        wal = m && strcmp(m, "wal") == 0;
    }
    sqlite3_finalize(st);
    return wal;
}

uint64_t db_generation(db *d) {
    if (!d->wal) return 0;
    return __atomic_load_n(&d->generation, __ATOMIC_ACQUIRE) + 1;
}

uint64_t db_auth_generation(db *d) {
    if (!d->wal) return 0;
    return __atomic_load_n(&d->auth_generation, __ATOMIC_ACQUIRE) + 1;
}

static char *g_pg_password;

void db_set_password(const char *password) {
    if (g_pg_password) {
        explicit_bzero(g_pg_password, strlen(g_pg_password));
        free(g_pg_password);
    }
    g_pg_password = password ? xstrdup(password) : NULL;
}

int db_is_url(const char *path) {
    return strncmp(path, "postgres://", 11) == 0 || strncmp(path, "postgresql://", 13) == 0;
}

/* A URL's password would end in logs and process listings: refused. */
static int pg_url_check(const char *url, char *err, size_t errlen) {
    char *e = NULL;
    PQconninfoOption *o = PQconninfoParse(url, &e);
    if (!o) {
        snprintf(err, errlen, "--db: not a PostgreSQL URL: %s", e ? e : "?");
        PQfreemem(e);
        return -1;
    }
    int pw = 0;
    for (PQconninfoOption *p = o; p->keyword; p++)
        if (strcmp(p->keyword, "password") == 0 && p->val && p->val[0]) pw = 1;
    PQconninfoFree(o);
    if (pw) {
        snprintf(err, errlen, "--db: the URL holds a password; put it in --db-password-file FILE, a passfile"
                              " (?passfile=FILE, PGPASSFILE) or PGPASSWORD instead");
        return -1;
    }
    return 0;
}

int db_open_at(db **out, const char *path, int target, char *err, size_t errlen) {
    *out = NULL;
    int wal = 1, pg = db_is_url(path);
    char target_name[300] = "";
    if (pg) {
        if (pg_url_check(path, err, errlen) < 0) return -1;
        pg_conn *pc = pg_connect(path, g_pg_password, "trainyard migrate", NULL, err, errlen);
        if (!pc) return -1;
        int rc = pg_migrate(pc, target, err, errlen);
        pg_close(pc);
        if (rc < 0) return -1;
        pg_target(path, target_name, sizeof target_name);
    } else {
        /* No global memory statistics: with them every sqlite3_malloc of every
         * thread takes one process-wide mutex (before the first open only;
         * SQLITE_MISUSE afterwards, harmless). */
        sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);
        sqlite3 *conn = conn_open(path, err, errlen);
        if (!conn) return -1;
        int rc = migrate(conn, target, err, errlen);
        wal = journal_is_wal(conn);
        sqlite3_close(conn);
        if (rc < 0) return -1;
    }
    db *d = xcalloc(1, sizeof *d);
    d->path = xstrdup(pg ? target_name : path);
    if (pg) {
        d->pg_url = xstrdup(path);
        d->pg_password = g_pg_password ? xstrdup(g_pg_password) : NULL;
    }
    if (pthread_key_create(&d->key, conn_destructor) != 0) {
        snprintf(err, errlen, "pthread_key_create failed");
        free(d->path);
        free(d->pg_url);
        free(d->pg_password);
        free(d);
        return -1;
    }
    pthread_mutex_init(&d->lock, NULL);
    pthread_mutex_init(&d->write, NULL);
    pthread_mutex_init(&d->ckpt_mu, NULL);
    pthread_cond_init(&d->ckpt_cv, NULL);
    pthread_mutex_init(&d->chg_mu, NULL);
    d->log_head = 1;
    d->log_all = 1; /* a reader from before the first change (seq 0) reloads */
    pthread_mutex_init(&d->lease.mu, NULL);
    pthread_cond_init(&d->lease.cv, NULL);
    d->lease.role = DB_STANDBY;
    d->wal = wal;
    /* numbers of different dbs (one closed, another opened at its address)
     * never meet: each starts at its own 2^40 */
    static uint64_t instances;
    d->generation = __atomic_add_fetch(&instances, 1, __ATOMIC_RELAXED) << 40;
    d->auth_generation = d->generation;
    d->ckpt_pid = getpid();
    if (!pg) { /* PostgreSQL checkpoints by itself */
        d->ckpt_running = 1;
        if (pthread_create(&d->ckpt_th, NULL, ckpt_main, d) != 0) d->ckpt_running = 0;
        if (!d->ckpt_running) log_warn("db: no checkpointer thread; SQLite checkpoints on commit");
    }
    pthread_mutex_init(&d->grp_mu, NULL);
    pthread_cond_init(&d->grp_cv, NULL);
    d->grp_pid = getpid();
    d->grp_running = pthread_create(&d->grp_th, NULL, grp_main, d) == 0;
    if (!d->grp_running) log_warn("db: no committer thread; grouped writes commit one by one");
    *out = d;
    return 0;
}

int db_open(db **out, const char *path, char *err, size_t errlen) {
    return db_open_at(out, path, schema_migrations_n, err, errlen);
}

void db_abandon(db *d) {
    int64_t now = mono_ms();
    if (d) __atomic_store_n(&d->stop_ms, now > 0 ? now : 1, __ATOMIC_RELEASE);
}

void db_close(db *d) {
    if (!d) return;
    grp_stop(d);
    db_lease_stop(d);
    if (d->ckpt_running && getpid() == d->ckpt_pid) {
        pthread_mutex_lock(&d->ckpt_mu);
        d->ckpt_stop = 1;
        pthread_cond_signal(&d->ckpt_cv);
        pthread_mutex_unlock(&d->ckpt_mu);
        pthread_join(d->ckpt_th, NULL);
        d->ckpt_running = 0;
    }
    pthread_key_delete(d->key);
    for (int i = 0; i < DB_CACHE_SLOTS; i++)
        if (d->cache[i].obj && d->cache[i].release) d->cache[i].release(d->cache[i].obj);
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
    pthread_mutex_destroy(&d->write);
    pthread_mutex_destroy(&d->ckpt_mu);
    pthread_cond_destroy(&d->ckpt_cv);
    pthread_mutex_destroy(&d->chg_mu);
    pthread_mutex_destroy(&d->grp_mu);
    pthread_cond_destroy(&d->grp_cv);
    free(d->log);
    free(d->path);
    free(d->pg_url);
    free(d->lease.holder);
    free(d->lease.url);
    pthread_mutex_destroy(&d->lease.mu);
    pthread_cond_destroy(&d->lease.cv);
    if (d->pg_password) {
        explicit_bzero(d->pg_password, strlen(d->pg_password));
        free(d->pg_password);
    }
    free(d);
}

const char *db_engine(db *d) { return d->pg_url ? "postgres" : "sqlite"; }

/* ---------------------------------------------------------------- the lease */

static void lease_fenced(db *d) {
    __atomic_fetch_add(&d->lease.fenced, 1, __ATOMIC_RELAXED);
    if (!d->lease.running) return;
    pthread_mutex_lock(&d->lease.mu); /* the lease thread looks at once */
    d->lease.kick = 1;
    pthread_cond_signal(&d->lease.cv);
    pthread_mutex_unlock(&d->lease.mu);
}

int db_meta_ensure(db *d, const char *key, const char *value, char *out, size_t cap) {
    db_thread_conn *c = thread_conn(d);
    if (!c || !c->pg) return -1;
    const char *v[2] = {key, value};
    int64_t ignored = 0;
    int rc = pg_query_int64(c->pg, "INSERT INTO ty_meta(key, value) VALUES($1, $2) ON CONFLICT (key) DO NOTHING"
                                   " RETURNING 1", 2, v, &ignored);
    if ((rc != 0 && rc != DB_DONE) || pg_query_text(c->pg, "SELECT value FROM ty_meta WHERE key = $1", 1, v, out, cap) != 0) {
        log_error("postgres: ty_meta %s: %s", key, pg_errmsg(c->pg));
        return -1;
    }
    return 0;
}

uint64_t db_fenced_writes(db *d) { return __atomic_load_n(&d->lease.fenced, __ATOMIC_RELAXED); }

int db_role(db *d) {
    if (!d->pg_url) return DB_LEADER;
    int role = __atomic_load_n(&d->lease.role, __ATOMIC_ACQUIRE);
    if (role == DB_LEADER &&
        mono_ms() - __atomic_load_n(&d->lease.last_ok_ms, __ATOMIC_ACQUIRE) >= d->lease.cfg.deadline_ms)
        return DB_STANDBY; /* not renewed in time, whatever the lease's thread is waiting for */
    return role;
}

int64_t db_epoch(db *d) { return __atomic_load_n(&d->epoch, __ATOMIC_ACQUIRE); }

void db_leader(db *d, char *url, size_t cap, int64_t *ms_left) {
    if (!d->pg_url) {
        if (cap) url[0] = '\0';
        if (ms_left) *ms_left = 0;
        return;
    }
    pthread_mutex_lock(&d->lease.mu);
    snprintf(url, cap, "%s", d->lease.leader_url);
    if (ms_left) *ms_left = d->lease.ms_left;
    pthread_mutex_unlock(&d->lease.mu);
}

static void lease_set_role(db *d, int role, int64_t epoch, const char *why) {
    int was = __atomic_load_n(&d->lease.role, __ATOMIC_ACQUIRE);
    /* the epoch first when leading (writes may start once the role says so),
     * last when stepping down */
    if (role == DB_LEADER) __atomic_store_n(&d->epoch, epoch, __ATOMIC_RELEASE);
    __atomic_store_n(&d->lease.role, role, __ATOMIC_RELEASE);
    if (role != DB_LEADER) __atomic_store_n(&d->epoch, 0, __ATOMIC_RELEASE);
    if (was == role) return;
    if (role == DB_LEADER) log_info("db: this server leads (epoch %lld)", (long long)epoch);
    else log_warn("db: this server stands by: %s", why);
    if (d->lease.cfg.changed) d->lease.cfg.changed(d->lease.cfg.cls, role, epoch);
}

/* The lease was just renewed or taken, with this server's url in it. */
static void lease_held(db *d, const char *url, double *last_ok) {
    *last_ok = mono_s();
    __atomic_store_n(&d->lease.last_ok_ms, mono_ms(), __ATOMIC_RELEASE);
    pthread_mutex_lock(&d->lease.mu);
    snprintf(d->lease.leader_url, sizeof d->lease.leader_url, "%s", url);
    d->lease.ms_left = d->lease.cfg.ttl_ms;
    pthread_mutex_unlock(&d->lease.mu);
}

/* One look at the lease: renew it (leading) or take it when it has expired
 * (standing by). last_ok: when the leader last renewed (monotonic s). */
static void lease_round(db *d, pg_conn *pc, double *last_ok) {
    char ttl[16], ep[24], url[512];
    pthread_mutex_lock(&d->lease.mu);
    snprintf(url, sizeof url, "%.511s", d->lease.url);
    pthread_mutex_unlock(&d->lease.mu);
    snprintf(ttl, sizeof ttl, "%d", d->lease.cfg.ttl_ms);
    int64_t e = db_epoch(d), got = 0;
    if (db_role(d) == DB_LEADER) {
        snprintf(ep, sizeof ep, "%lld", (long long)e);
        const char *v[4] = {d->lease.holder, ep, ttl, url};
        int rc = pg_query_int64(pc,
                                "UPDATE ty_lease SET expires_at = clock_timestamp() + $3::int * interval '1 millisecond',"
                                " url = $4"
                                " WHERE id = 1 AND holder = $1 AND epoch = $2::bigint AND expires_at > clock_timestamp()"
                                " RETURNING epoch",
                                4, v, &got);
        if (rc == 0) {
            lease_held(d, url, last_ok);
        } else if (rc == DB_DONE) {
            lease_set_role(d, DB_STANDBY, 0, "the lease was lost (expired or taken by another server)");
        } else if ((mono_s() - *last_ok) * 1000 >= d->lease.cfg.deadline_ms) {
            char why[700];
            snprintf(why, sizeof why, "the lease could not be renewed for %d ms: %.600s", d->lease.cfg.deadline_ms,
                     pg_errmsg(pc));
            lease_set_role(d, DB_STANDBY, 0, why);
        }
        return;
    }
    const char *v[3] = {d->lease.holder, url, ttl};
    int rc = pg_query_int64(pc,
                            "UPDATE ty_lease SET holder = $1, url = $2, epoch = epoch + 1,"
                            " acquired_at = clock_timestamp(),"
                            " expires_at = clock_timestamp() + $3::int * interval '1 millisecond'"
                            " WHERE id = 1 AND (expires_at <= clock_timestamp() OR holder = $1) RETURNING epoch",
                            3, v, &got);
    if (rc == 0) {
        lease_held(d, url, last_ok);
        lease_set_role(d, DB_LEADER, got, "");
        return;
    }
    char text[600] = "";
    int64_t left = 0;
    if (pg_query_text(pc,
                      "SELECT CASE WHEN expires_at > clock_timestamp() THEN url ELSE '' END || ' ' ||"
                      " greatest(0, (extract(epoch FROM expires_at - clock_timestamp()) * 1000)::bigint)"
                      " FROM ty_lease WHERE id = 1",
                      0, NULL, text, sizeof text) == 0) {
        char *sp = strrchr(text, ' ');
        if (sp) {
            *sp = '\0';
            left = strtoll(sp + 1, NULL, 10);
        }
    }
    pthread_mutex_lock(&d->lease.mu);
    snprintf(d->lease.leader_url, sizeof d->lease.leader_url, "%.500s", text);
    d->lease.ms_left = left;
    pthread_mutex_unlock(&d->lease.mu);
}

static void *lease_main(void *arg) {
    db *d = arg;
    pg_conn *pc = NULL;
    double last_ok = 0;
    pthread_mutex_lock(&d->lease.mu);
    while (!d->lease.stop) {
        pthread_mutex_unlock(&d->lease.mu);
        if (!pc) {
            char err[512];
            pc = pg_connect(d->pg_url, d->pg_password, "trainyard lease", &d->stop_ms, err, sizeof err);
            /* an answer may take up to the deadline's slack (a loaded host),
             * never longer: the thread must be free to step down in time */
            if (pc) pg_set_deadline(pc, d->lease.cfg.deadline_ms - d->lease.cfg.renew_ms);
            if (!pc && db_role(d) == DB_LEADER && (mono_s() - last_ok) * 1000 >= d->lease.cfg.deadline_ms)
                lease_set_role(d, DB_STANDBY, 0, err);
        }
        if (pc) {
            lease_round(d, pc, &last_ok);
            if (pg_broken(pc) && pg_check_alive(pc) < 0) {
                pg_close(pc);
                pc = NULL;
            }
        }
        pthread_mutex_lock(&d->lease.mu);
        if (d->lease.stop) break;
        if (!d->lease.kick) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            long ns = ts.tv_nsec + (long)(d->lease.cfg.renew_ms % 1000) * 1000000L;
            ts.tv_sec += d->lease.cfg.renew_ms / 1000 + ns / 1000000000L;
            ts.tv_nsec = ns % 1000000000L;
            pthread_cond_timedwait(&d->lease.cv, &d->lease.mu, &ts);
        }
        d->lease.kick = 0;
    }
    pthread_mutex_unlock(&d->lease.mu);
    if (pc && db_role(d) == DB_LEADER) { /* give it back: a standby takes over now, not at expiry */
        char ep[24];
        snprintf(ep, sizeof ep, "%lld", (long long)db_epoch(d));
        const char *v[2] = {d->lease.holder, ep};
        int64_t got = 0;
        pg_query_int64(pc, "UPDATE ty_lease SET expires_at = '-infinity' WHERE id = 1 AND holder = $1"
                           " AND epoch = $2::bigint RETURNING epoch", 2, v, &got);
    }
    lease_set_role(d, DB_STANDBY, 0, "the server stops");
    pg_close(pc);
    return NULL;
}

int db_lease_start(db *d, const db_lease_cfg *cfg, char *err, size_t errlen) {
    if (!d->pg_url) return 0;
    if (d->lease.running) {
        snprintf(err, errlen, "the lease is already taken part in");
        return -1;
    }
    d->lease.cfg = *cfg;
    d->lease.cfg.holder = d->lease.cfg.url = NULL;
    if (!d->lease.cfg.ttl_ms) d->lease.cfg.ttl_ms = 6000;
    if (!d->lease.cfg.renew_ms) d->lease.cfg.renew_ms = 1000;
    if (!d->lease.cfg.deadline_ms) d->lease.cfg.deadline_ms = 4000;
    if (d->lease.cfg.renew_ms >= d->lease.cfg.deadline_ms || d->lease.cfg.deadline_ms >= d->lease.cfg.ttl_ms) {
        snprintf(err, errlen, "the lease needs renew < deadline < ttl (%d, %d, %d ms)", d->lease.cfg.renew_ms,
                 d->lease.cfg.deadline_ms, d->lease.cfg.ttl_ms);
        return -1;
    }
    free(d->lease.holder);
    free(d->lease.url);
    d->lease.holder = xstrdup(cfg->holder ? cfg->holder : "");
    d->lease.url = xstrdup(cfg->url ? cfg->url : "");
    d->lease.stop = 0;
    d->lease.running = 1;
    if (pthread_create(&d->lease.th, NULL, lease_main, d) != 0) {
        d->lease.running = 0;
        snprintf(err, errlen, "cannot start the lease thread");
        return -1;
    }
    return 0;
}

void db_lease_set_url(db *d, const char *url) {
    if (!d->pg_url || !d->lease.running) return;
    char *u = xstrdup(url);
    pthread_mutex_lock(&d->lease.mu);
    char *old = d->lease.url;
    d->lease.url = u;
    pthread_mutex_unlock(&d->lease.mu);
    free(old);
}

void db_lease_stop(db *d) {
    if (!d->lease.running) return;
    pthread_mutex_lock(&d->lease.mu);
    d->lease.stop = 1;
    pthread_cond_signal(&d->lease.cv);
    pthread_mutex_unlock(&d->lease.mu);
    pthread_join(d->lease.th, NULL);
    d->lease.running = 0;
}

int db_lease_wait(db *d, int timeout_ms) {
    double until = mono_s() + timeout_ms / 1000.0;
    while (db_role(d) != DB_LEADER) {
        if (mono_s() >= until) return -1;
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return 0;
}

const char *db_path(db *d) { return d->path; }

void *db_cache(db *d, int slot, void *(*make)(void), void (*release)(void *)) {
    if (slot < 0 || slot >= DB_CACHE_SLOTS) return NULL;
    pthread_mutex_lock(&d->lock);
    if (!d->cache[slot].obj && make) {
        d->cache[slot].obj = make();
        d->cache[slot].release = release;
    }
    void *o = d->cache[slot].obj;
    pthread_mutex_unlock(&d->lock);
    return o;
}
