/* db_pg.h - the PostgreSQL engine under db.h (libpq), private to storage/db.c.
 *
 * One pg_conn per thread, as SQLite's connections are; statements are
 * prepared on the server once per connection (named s1, s2, ...) from the
 * SQLite text, its ?N and ? parameters rewritten to $N; values travel as
 * text (bytea as hex), int64 and double parameters declared as int8 and
 * float8 so PostgreSQL never guesses a narrower type. A result is read whole
 * at the first step and handed out row by row. */
#ifndef TRAINYARD_DB_PG_H
#define TRAINYARD_DB_PG_H

#include <stddef.h>
#include <stdint.h>

typedef struct pg_conn pg_conn;
typedef struct pg_stmt pg_stmt;

/* Connects to url (postgres://... or a libpq keyword string) with the
 * password (NULL: the URL's passfile, PGPASSFILE or PGPASSWORD, as libpq
 * reads them), then sets the session up (application_name, timeouts,
 * ty.capture). NULL with one line naming the host and libpq's reason in
 * err.
 *
 * abandon (NULL: none): the owner's mono_ms() of its stop, 0 while it
 * runs (read atomically). Once set, no session is opened (NULL, "the
 * server is stopping"), a broken one is not opened again, and no answer is
 * awaited past 2 s from the later of the stop and the wait's start: a
 * PostgreSQL that hangs (stopped, a backend stuck) cannot hold the
 * server's threads, and so its shutdown, for ever. Otherwise an answer is
 * awaited at most the deadline, else 75 s (statement_timeout is 60 s). */
pg_conn *pg_connect(const char *url, const char *password, const char *app, const int64_t *abandon, char *err,
                    size_t errlen);
void pg_close(pg_conn *pc);

/* host:port/dbname of a URL or a connection, never a password: for logs. */
void pg_target(const char *url, char *out, size_t cap);

/* A statement (not yet on the server: prepared at its first step). */
pg_stmt *pg_prepare(pg_conn *pc, const char *sqlite_sql);
void pg_stmt_free(pg_stmt *st);
void pg_reset(pg_stmt *st);          /* result and bindings cleared */
/* DB_ROW / DB_DONE / DB_*; *ran set to 1 when this step executed the
 * statement (its first step), so the caller can publish an autocommit
 * write. */
int pg_step(pg_stmt *st, int *ran);
int pg_is_write(const pg_stmt *st);

int pg_bind_int64(pg_stmt *st, int i, int64_t v);
int pg_bind_double(pg_stmt *st, int i, double v);
int pg_bind_null(pg_stmt *st, int i);
int pg_bind_text(pg_stmt *st, int i, const char *s, int n, int copy);
int pg_bind_blob(pg_stmt *st, int i, const void *p, int n);

int pg_col_type(pg_stmt *st, int i);
int64_t pg_col_int64(pg_stmt *st, int i);
double pg_col_double(pg_stmt *st, int i);
const char *pg_col_text(pg_stmt *st, int i);
const void *pg_col_blob(pg_stmt *st, int i);
int pg_col_bytes(pg_stmt *st, int i);

/* Round trips the calling thread has made to any PostgreSQL session. */
uint64_t pg_round_trips(void);

int64_t pg_changes(pg_conn *pc);
const char *pg_errmsg(pg_conn *pc);
int pg_in_tx(pg_conn *pc);
/* Inside a transaction a statement failed in: only ROLLBACK (TO) helps. */
int pg_tx_failed(pg_conn *pc);
/* The connection died (a network cut, the server restarted): the next
 * pg_check_alive resets it. */
int pg_broken(pg_conn *pc);
/* 0 when the connection answers (reset if it was broken), else -1. */
int pg_check_alive(pg_conn *pc);

/* Runs sql (one or more statements, no parameters): 0 or DB_* (the error
 * in pg_errmsg). */
int pg_exec(pg_conn *pc, const char *sql);
/* Every call waits at most ms for an answer (0: the default bound below);
 * past it, DB_UNAVAILABLE and the connection is reset at its next use. For
 * the lease's thread. */
void pg_set_deadline(pg_conn *pc, int ms);

/* Runs a query with parameters (text) and returns its first column of the
 * first row as an int64 in *out: 0, DB_DONE when it returned no row, or
 * another DB_* code. */
int pg_query_int64(pg_conn *pc, const char *sql, int n, const char *const *vals, int64_t *out);
/* The same, the value as text (into out, cap bytes). */
int pg_query_text(pg_conn *pc, const char *sql, int n, const char *const *vals, char *out, size_t cap);

/* Makes this session's writes carry the fencing number epoch (SET ty.epoch)
 * when it does not already: 0 or DB_*. */
int pg_set_epoch(pg_conn *pc, int64_t epoch);
int64_t pg_epoch_set(const pg_conn *pc);

/* Takes the session's captured changes (the ty_note triggers' rows, since
 * the last drain) and hands each (table, id) to add: 0 or DB_*. Run before
 * COMMIT, inside the transaction, so they commit or vanish with it. */
int pg_drain(pg_conn *pc, void (*add)(void *cls, int table, int64_t id), void *cls);
/* The same and COMMIT, in one round trip: 0 when both ran (the changes
 * handed to add belong to the committed transaction), else DB_* (the
 * transaction is then failed or ended: the caller rolls back what is left,
 * and drops what add was given). */
int pg_drain_commit(pg_conn *pc, void (*add)(void *cls, int table, int64_t id), void *cls);

/* Outside a transaction, after a commit: VACUUMs ty_changes once this
 * session has drained 4,096 rows since its last time. Every row captured
 * is a dead tuple once drained, which each drain reads again until a
 * VACUUM (7 ms a drain after a 200,000-row transaction, 0.2 ms after it);
 * autovacuum comes by only every minute. */
void pg_chg_tidy(pg_conn *pc);

#endif
