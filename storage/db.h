/* db.h - the SQLite store: one database file, WAL, foreign keys, busy
 * timeout, numbered migrations recorded in the database itself.
 *
 * Each thread gets its own connection (opened on first use) and its own cache
 * of prepared statements keyed by the SQL text's address, so handlers call
 * db_prepare(d, SQL_CONSTANT) on every request at no cost. storage/ knows
 * nothing of HTTP or scheduling: it stores and queries.
 *
 * defines: db_open, db_close, db_prepare, db_step, db_bind_*, db_col_*,
 *          db_changes, db_round_trips, db_errmsg, db_in_tx, db_exec, db_sqlite, db_begin, db_commit,
 *          db_rollback, db_precommit, db_version, db_migrations_count, db_migrate_to,
 *          db_disk_full, db_generation, db_note, db_notes_mark, db_notes_rewind, db_set_wake_hook, db_wake_node,
 *          db_change_note, db_changes_mark, db_changes_rewind, db_changes_head,
 *          db_changes_read (the change log the scheduler's mirror follows), db_cache,
 *          db_group_add, db_group_stats_get (group commit), db_auth_generation,
 *          db_checkpoints */
#ifndef TRAINYARD_DB_H
#define TRAINYARD_DB_H

#include <stdint.h>
#include <stddef.h>

#include "db_codes.h"

typedef struct db db;

/* Opens (creating if needed) the database at path and migrates it to the
 * newest schema. On error returns -1 with a message in err and *out NULL. */
int db_open(db **out, const char *path, char *err, size_t errlen);

/* Same, but migrates only up to version `target` (tests of migrations). */
int db_open_at(db **out, const char *path, int target, char *err, size_t errlen);

/* The server is stopping: from now on no answer of PostgreSQL is awaited
 * longer than 2 s, so a database that hangs (stopped, a backend stuck:
 * the TCP connection stays up) cannot hold the threads the stop joins; a
 * healthy one answers long before. SQLite: nothing changes. */
void db_abandon(db *d);
void db_close(db *d);

/* Whether path names a PostgreSQL database (postgres://... or
 * postgresql://...) rather than a SQLite file. db_open of such a URL
 * connects with libpq (its passfile, PGPASSFILE, PGPASSWORD, or the
 * password given here first, from --db-password-file; a URL holding one
 * is refused), migrates the database and gives a db as a file does. */
int db_is_url(const char *path);
void db_set_password(const char *password);

/* ---------------------------------------------------------------- statements
 * The one interface to the store's queries: every file of storage/ prepares,
 * binds, steps and reads columns through these, never through the engine's
 * own calls, so a query is written once for every engine. Indexes count as
 * SQLite's do: bind parameters from 1, columns from 0. */
typedef struct db_stmt db_stmt;

/* A prepared statement for sql (a string constant: the cache is keyed by its
 * address), reset with bindings cleared. NULL on error (logged). Do not
 * free it; db_done it when done (a statement left mid-result holds its read
 * snapshot until the thread's next db_prepare of it). */
db_stmt *db_prepare(db *d, const char *sql);

/* The same for a statement PostgreSQL needs written its own way (JSON,
 * SQLite's dynamic types): pg_sql there, sqlite_sql in SQLite. Both are
 * string constants; docs/postgres.md lists what differs. */
db_stmt *db_prepare2(db *d, const char *sqlite_sql, const char *pg_sql);
/* Which of the two is this db's (for helpers that prepare it later). */
const char *db_sql(db *d, const char *sqlite_sql, const char *pg_sql);

/* A read transaction with one snapshot for every statement in it (SQLite's
 * BEGIN DEFERRED; PostgreSQL's REPEATABLE READ READ ONLY): 0 or -1. Ended
 * by db_rollback. */
int db_begin_read(db *d);

/* Resets a statement from db_prepare so its locks are released. */
void db_done(db_stmt *st);

/* One step: DB_ROW, DB_DONE, or a failure (DB_CONSTRAINT, DB_BUSY,
 * DB_FULL, DB_ERR). */
int db_step(db_stmt *st);

/* Binds parameter i (from 1): 0, or non-zero when i is out of range.
 * db_bind_text copies s (n bytes, or up to its NUL when n < 0);
 * db_bind_text_static keeps the pointer, which must outlive the statement's
 * db_done. db_bind_blob copies. */
int db_bind_int64(db_stmt *st, int i, int64_t v);
int db_bind_int(db_stmt *st, int i, int v);
int db_bind_double(db_stmt *st, int i, double v);
int db_bind_null(db_stmt *st, int i);
int db_bind_text(db_stmt *st, int i, const char *s, int n);
int db_bind_text_static(db_stmt *st, int i, const char *s, int n);
int db_bind_blob(db_stmt *st, int i, const void *p, int n);

/* Column i (from 0) of the row db_step returned. A NULL reads as 0 or
 * NULL; text stays valid until the next step or db_done. */
int db_col_type(db_stmt *st, int i);
int64_t db_col_int64(db_stmt *st, int i);
int db_col_int(db_stmt *st, int i);
double db_col_double(db_stmt *st, int i);
const char *db_col_text(db_stmt *st, int i);
const void *db_col_blob(db_stmt *st, int i);
int db_col_bytes(db_stmt *st, int i);

/* Rows the calling thread's last INSERT, UPDATE or DELETE changed. */
int64_t db_changes(db *d);

/* Round trips the calling thread has made to PostgreSQL since it started
 * (a statement, a PREPARE, a BEGIN or COMMIT: each a wait for the server);
 * always 0 on SQLite, whose statements are calls in the process. Read it
 * before and after a piece of work to count that work's (the pass's
 * stats, the benchmark). */
uint64_t db_round_trips(void);

/* The calling thread's last error, for a log line. */
const char *db_errmsg(db *d);

/* Why the calling thread's last statement found PostgreSQL out of reach
 * ("the database does not answer: HOST:PORT/DB: libpq's reason") or this
 * server fenced, for a 503's message; NULL after a statement that ran, and
 * always on SQLite. */
const char *db_unavailable_reason(void);

/* Whether the calling thread is inside a transaction (db_begin, or a
 * BEGIN it ran itself). */
int db_in_tx(db *d);

/* Runs sql (one statement or several, no parameters, not cached): 0 or -1
 * (logged). For text built at run time (savepoints, tests' fixtures). */
int db_exec(db *d, const char *sql);

/* SQLite's handle of the calling thread's connection, for what only SQLite
 * has (tests' PRAGMAs, the file's own checks). */
struct sqlite3;
struct sqlite3 *db_sqlite(db *d);

/* BEGIN IMMEDIATE / COMMIT / ROLLBACK on this thread's connection: 0 or -1. */
int db_begin(db *d);
int db_commit(db *d);
void db_rollback(db *d);

/* A write that belongs with this thread's next transaction (the audit row
 * of the request it serves): fn(d, arg) runs once, inside the transaction,
 * just before the next db_commit's COMMIT; when it fails (-1) the whole
 * transaction is rolled back and db_commit fails. NULL clears it (a
 * request that committed nothing). */
void db_precommit(db *d, int (*fn)(db *d, void *arg), void *arg);

/* A line for the console (log_info) about a change this thread is making:
 * said at once outside a transaction, else kept until db_commit succeeds
 * (and dropped by a rollback or a failed commit), so the console never
 * tells of a change that did not happen. Lines past 64 KiB of pending
 * notes are dropped. */
void db_note(db *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Nodes whose agents have new work (a task to start, a task to stop): each
 * is handed to the hook after db_commit succeeds (at once outside a
 * transaction; never after a rollback), sorted and once each, on the
 * committing thread; n is -1 (nodes NULL: every node) after a transaction
 * that named more than 1,024. The server's hook wakes those agents' parked
 * long-polls; storage knows nothing of them. Set the hook before any
 * thread writes. */
void db_set_wake_hook(db *d, void (*fn)(void *cls, const int64_t *nodes, int n), void *cls);
void db_wake_node(db *d, int64_t node);

/* For a savepoint: the notes kept so far, and back to them after a
 * ROLLBACK TO (the notes of what was undone are dropped). */
size_t db_notes_mark(void);
void db_notes_rewind(size_t mark);

/* ---------------------------------------------------------------- the change log
 * What the scheduling pass reads (storage/cluster.c cluster_load) is kept in
 * memory by the scheduler (scheduler/mirror.c) and followed through this log:
 * every committed change to a row it reads, as (table, row id). SQLite stays
 * the only durable state; the log is a cache's invalidation list.
 *
 * Changes are caught by SQLite's update hook on every connection of this db
 * (any INSERT, UPDATE or DELETE of jobs, tasks, teams, user_usage, devices and
 * allocations, whoever issues it), kept with the open transaction, published
 * once the commit is visible (the WAL hook) and dropped by a rollback. Two
 * tables are noted by their writers (db_change_note): nodes (the hook leaves
 * them out: every heartbeat updates its node, and the pass does not read
 * last_heartbeat_at) and node_failures (no rowid: the hook does not see it).
 * A transaction of more than 65,536 changes publishes "everything". */
enum {
    DB_CH_NODE = 1,   /* nodes row (id): noted by its writers */
    DB_CH_DEVICE,     /* devices row (id) */
    DB_CH_ALLOC,      /* allocations row (id = its device's id) */
    DB_CH_TASK,       /* tasks row (id) */
    DB_CH_JOB,        /* jobs row (id) */
    DB_CH_TEAM,       /* teams row (id), or a user_usage row (its rowid): the shares */
    DB_CH_AVOID       /* node_failures of a job (id = job id): noted by its writer */
};
typedef struct db_change {
    int table;        /* DB_CH_* */
    int64_t id;
} db_change;

/* The log keeps the last DB_CHANGES_CAP changes; a reader further behind
 * reloads everything. */
#define DB_CHANGES_CAP (1u << 17)

/* Notes a change this thread is making (a table the update hook does not
 * see): kept with the open transaction, or published at once outside one. */
void db_change_note(db *d, int table, int64_t id);

/* For a savepoint: the changes noted so far, and back to them after a
 * ROLLBACK TO (what was undone is dropped; a change kept by mistake costs
 * only a row read again). */
size_t db_changes_mark(db *d);
void db_changes_rewind(db *d, size_t mark);

/* The seq the next published change will have. A reader that takes it
 * before a full load and reads from it afterwards misses nothing (a change
 * committed during the load is read again). */
uint64_t db_changes_head(db *d);

/* The changes published from seq *from on, into *out (malloc'd, *n of them;
 * the caller frees; in publication order, ids may repeat); *from becomes
 * the next seq. Returns 0, or 1 when the reader must reload everything:
 * the log overflowed past *from, "everything" was published since, or the
 * file is not in WAL mode (commits go unseen). Never fails otherwise. */
int db_changes_read(db *d, uint64_t *from, db_change **out, size_t *n);

/* An object kept with the db and released by db_close (release(obj)):
 * the one in `slot`, made by make() on the first call that passes make
 * (NULL when none, or make is NULL). The object guards itself: db_cache
 * only hands it out. Slots: DB_CACHE_MIRROR (scheduler/mirror.c),
 * DB_CACHE_CAPACITY (store_cluster_capacity), DB_CACHE_QUOTA (quota.c). */
enum { DB_CACHE_MIRROR, DB_CACHE_CAPACITY, DB_CACHE_QUOTA, DB_CACHE_SLOTS };
void *db_cache(db *d, int slot, void *(*make)(void), void (*release)(void *));

/* Whether the file system holding the database has less than DB_DISK_LOW
 * bytes left for an unprivileged writer: 1 with a sentence naming the cause
 * in msg (for a 507 answer), else 0. */
#define DB_DISK_LOW (256ULL * 1024)
int db_disk_full(db *d, char *msg, size_t cap);

/* Schema version recorded in the database (0 for an empty file). */
int db_version(db *d);

/* Number of migrations this build knows (the newest version). */
int db_migrations_count(void);

/* ---------------------------------------------------------------- group commit
 * Writes that arrive together share one transaction and one commit. A
 * writer queues an item (db_group_add) and goes on with other work; the
 * db's committer thread takes everything queued (at most DB_GROUP_MAX),
 * runs each item's run() in a SAVEPOINT of its own inside one BEGIN
 * IMMEDIATE (the write turn of db_begin), commits, and only then calls each
 * item's done() with its result. It never waits for a batch to fill: an
 * item queued while the committer sleeps is taken at once, alone; items
 * queued while a batch commits form the next batch. An item's run() that
 * fails rolls back its own savepoint only; the others of its batch commit.
 *
 * done(arg, rc) is called exactly once per queued item, on the committer
 * thread: rc is run()'s result (0 = committed: the change is as durable as
 * any commit, see db_set_durability_full), or -1 when the batch could not
 * begin or commit (nothing of it was written). done may free the item. */
#define DB_GROUP_MAX 256
typedef struct db_group_item {
    int (*run)(db *d, void *arg);     /* inside the batch's transaction: 0, or non-zero to undo its writes */
    void (*done)(void *arg, int rc);  /* after the COMMIT returned (or failed) */
    void *arg;
    /* the db's, set by db_group_add */
    struct db_group_item *next;
    int rc;
    int64_t queued_us;
} db_group_item;

/* Queues it for the next batch: 0 (done will be called), or -1 when the db
 * is closing (done is never called). In a process other than the one that
 * opened the db (a fork), the item is run and committed at once, alone. */
int db_group_add(db *d, db_group_item *it);

/* What the committer did since the db was opened. */
typedef struct db_group_stats {
    uint64_t batches;                 /* transactions committed or failed */
    uint64_t items;                   /* items in them */
    uint64_t largest;                 /* most items in one batch */
    uint64_t wait_us_sum;             /* an item's time from db_group_add to its batch's BEGIN, summed */
    uint64_t wait_us_max;             /* and the longest */
    uint64_t commit_us_sum;           /* a batch's BEGIN to the end of its COMMIT, summed */
} db_group_stats;
void db_group_stats_get(db *d, db_group_stats *out);

/* Checkpoints the checkpointer thread has run (PASSIVE, with their fsyncs):
 * one each time the WAL has grown by 1,000 frames since the last (or since
 * it restarted), and one a second while anything is committed; never one a
 * commit, however long readers keep the WAL from restarting. */
uint64_t db_checkpoints(db *d);

/* synchronous=FULL for every connection opened after this call (power-loss
 * durability at the cost of an fsync per commit). Default NORMAL. */
void db_set_durability_full(int on);

/* Keeps the database file and its WAL in memory (a read-only shared
 * mapping of each, mlock'ed, grown as the files grow, by the checkpointer
 * thread), up to max_mb MiB in all (0: off; default 2048). A page the server
 * reads, or a WAL page a commit partly overwrites, is then never read from
 * the disk: a disk that stalls, or a host that reclaims page cache, stalls
 * no request. When mlock is refused (RLIMIT_MEMLOCK, no CAP_IPC_LOCK) the
 * server says so once and goes on without. Set before db_open. */
void db_set_resident_max_mb(long max_mb);

/* A number that changes after every commit made through this db (the
 * process's connections; the server is the database's only writer, held by
 * its data directory's lock). Read it before a query: what the query read
 * stays current for as long as the number is the same, so an answer built
 * from it may be kept and served again (the job and token caches). Never
 * 0, and never the same for two dbs of one process (a key needs no db);
 * 0 when the file is not in WAL mode (a commit then goes unseen), and
 * nothing may be kept. */
uint64_t db_generation(db *d);

/* The same for what a token lookup reads: a number that changes after
 * every commit that wrote a row of tokens or teams (SQLite's update hook
 * sees the writes, whoever makes them), so a token found while it stays
 * the same is still valid (a revocation is such a commit). Busy writers of
 * other tables (submissions, metrics) leave it alone. 0 when the file is
 * not in WAL mode. */
uint64_t db_auth_generation(db *d);

/* Path of the database file; for PostgreSQL, host:port/dbname. */
const char *db_path(db *d);

/* Which engine holds the state: "sqlite" or "postgres". */
const char *db_engine(db *d);

/* ---------------------------------------------------------------- leadership
 * Several servers may share one PostgreSQL database; one of them leads (it
 * alone schedules and writes), the others stand by. The leader is the holder
 * of the lease, the one row of ty_lease, judged by the database's clock: a
 * standby takes it once it has expired (or at once when it is this server's
 * own, left by its previous process: its data directory's lock says that
 * one is gone), with the fencing number (epoch) one
 * higher; the leader renews it every renew_ms. Every write carries the
 * epoch of its server (the session's ty.epoch) and the database refuses it
 * (ty_fence: DB_FENCED) unless that epoch holds an unexpired lease, so a
 * server that lost the lease while paused writes nothing after waking.
 * A leader that could not renew for deadline_ms steps down on its own,
 * before the lease can expire (ttl_ms). docs/ha.md tells the whole story.
 * With SQLite (one server, one file) the server always leads, at epoch 0. */
enum { DB_LEADER = 1, DB_STANDBY = 2 };
typedef struct db_lease_cfg {
    const char *holder;             /* this server's id (DATA/server.id) */
    const char *url;                /* the URL clients are told to use */
    int ttl_ms, renew_ms, deadline_ms; /* 0: 6000, 1000, 4000 */
    /* told of every change of role, on the lease thread (role, epoch) */
    void (*changed)(void *cls, int role, int64_t epoch);
    void *cls;
} db_lease_cfg;

/* Starts taking part in the election (a thread of its own with its own
 * connection): 0, or -1 with the reason in err. SQLite: nothing to do. */
int db_lease_start(db *d, const db_lease_cfg *cfg, char *err, size_t errlen);
/* The URL this server advertises from now on (its listener bound a port of
 * its own choosing after the lease started): written with the next
 * renewal, or with the lease when it takes one. */
void db_lease_set_url(db *d, const char *url);

/* Gives the lease back (a standby then takes over at once rather than when
 * it expires) and stops the thread; db_close does it too. */
void db_lease_stop(db *d);
int db_role(db *d);
int64_t db_epoch(db *d);
/* The leader's URL as the last look at the lease saw it ("" when none
 * holds an unexpired lease), and for a leader the ms its lease has left. */
void db_leader(db *d, char *url, size_t cap, int64_t *ms_left);
/* Waits until this server leads: 0, or -1 after timeout_ms. */
int db_lease_wait(db *d, int timeout_ms);
/* Writes refused by the fence since the db was opened. */
uint64_t db_fenced_writes(db *d);

/* PostgreSQL: a value every server sharing the database reads alike
 * (ty_meta): value is stored when key has none yet; out gets the stored
 * one. 0, or -1 (SQLite, where a server's DATA holds such things). */
int db_meta_ensure(db *d, const char *key, const char *value, char *out, size_t cap);

#endif
