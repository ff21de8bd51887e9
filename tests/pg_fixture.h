/* pg_fixture.h - PostgreSQL for the suites that run on both stores. One
 * PostgreSQL serves a whole lane (tests/run_all.sh starts it with
 * `PG_DEV_FAST=1 scripts/pg-dev.sh start DIR` and exports TY_PG_URL, the
 * DATABASE_URL it printed); each test takes a fresh database of it, so no
 * two tests (nor two processes) share state. Without TY_PG_URL the suites
 * run on SQLite as before. Included by tests/testlib.h; the suites that
 * open a db themselves (check_storage, check_sched) use it directly.
 *
 *   ty_pg_url()                   TY_PG_URL, or NULL (SQLite)
 *   ty_pg_new_db(url, n)          CREATE DATABASE with a name unique to the
 *                                 process and the call (the trainyard role
 *                                 has CREATEDB: scripts/pg-dev.sh); its URL:
 *                                 TY_PG_URL's host, port, user and query
 *                                 (passfile), another dbname
 *   ty_pg_data_db(dir, url, n)    the database of a data directory: the one
 *                                 named in DIR/test-db.url, else a fresh one
 *                                 written there (a restarted server gets the
 *                                 same database, as it gets the same files)
 *   ty_pg_query_int64(url, sql)   one number from a query on a session of
 *                                 its own (the tests' look into a server's
 *                                 database, as they open trainyard.db)
 *   ty_pg_query_text(url, sql, out, n)  the same for one text value
 *   ty_pg_row(url, sql, n, params)      the one row of sql with $1..$n
 *   ty_pg_int_of(url, sql, id)    a number of SQLite text whose every ? is
 *                                 id (-1 for NULL)
 *   ty_pg_exec_fenced(url, sql)   runs writes after taking the lease as
 *                                 docs/postgres.md's maintenance session
 *                                 does (only when no server holds it)
 *
 * Failures abort the test (ck_abort_msg). */
#ifndef TRAINYARD_TESTS_PG_FIXTURE_H
#define TRAINYARD_TESTS_PG_FIXTURE_H

#include <check.h>
#include <libpq-fe.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

static inline const char *ty_pg_url(void) {
    const char *u = getenv("TY_PG_URL");
    return u && *u ? u : NULL;
}

/* url with its dbname (the path after host:port) replaced by name. */
static inline void ty_pg_url_with_db(const char *url, const char *name, char *out, size_t n) {
    const char *hp = strstr(url, "://");
    ck_assert_msg(hp != NULL, "TY_PG_URL=%s: not a postgres:// URL", url);
    const char *slash = strchr(hp + 3, '/');
    ck_assert_msg(slash != NULL, "TY_PG_URL=%s: no database in the URL", url);
    const char *q = strchr(slash, '?');
    int len = snprintf(out, n, "%.*s/%s%s", (int)(slash - url), url, name, q ? q : "");
    ck_assert_msg(len > 0 && (size_t)len < n, "a database URL longer than %zu bytes", n);
}

static inline PGconn *ty_pg_connect(const char *url) {
    PGconn *c = PQconnectdb(url);
    ck_assert_msg(c != NULL && PQstatus(c) == CONNECTION_OK, "cannot connect to %s: %s", url,
                  c ? PQerrorMessage(c) : "out of memory");
    return c;
}

static inline void ty_pg_run(PGconn *c, const char *sql) {
    PGresult *r = PQexec(c, sql);
    ExecStatusType s = PQresultStatus(r);
    ck_assert_msg(s == PGRES_COMMAND_OK || s == PGRES_TUPLES_OK, "%s: %s", sql, PQerrorMessage(c));
    PQclear(r);
}

static inline void ty_pg_new_db(char *url, size_t n) {
    const char *base = ty_pg_url();
    ck_assert_msg(base != NULL, "ty_pg_new_db without TY_PG_URL");
    static unsigned calls;
    struct timeval tv;
    gettimeofday(&tv, NULL);
    char name[64];
    snprintf(name, sizeof name, "ty_%ld_%u_%06ld", (long)getpid(), ++calls, (long)tv.tv_usec);
    PGconn *c = ty_pg_connect(base);
    char sql[128];
    snprintf(sql, sizeof sql, "CREATE DATABASE %s", name);
    ty_pg_run(c, sql);
    PQfinish(c);
    ty_pg_url_with_db(base, name, url, n);
}

static inline void ty_pg_data_db(const char *dir, char *url, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/test-db.url", dir);
    FILE *f = fopen(path, "r");
    if (f) {
        char *got = fgets(url, (int)n, f);
        fclose(f);
        ck_assert_msg(got != NULL, "%s: empty", path);
        url[strcspn(url, "\n")] = '\0';
        return;
    }
    ty_pg_new_db(url, n);
    f = fopen(path, "w");
    ck_assert_msg(f != NULL, "cannot write %s", path);
    fprintf(f, "%s\n", url);
    ck_assert_int_eq(fclose(f), 0);
}

static inline PGresult *ty_pg_one(PGconn *c, const char *sql) {
    PGresult *r = PQexec(c, sql);
    ck_assert_msg(PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 && PQnfields(r) >= 1,
                  "%s: %s (%d rows)", sql, PQerrorMessage(c), PQntuples(r));
    return r;
}

static inline int64_t ty_pg_query_int64(const char *url, const char *sql) {
    PGconn *c = ty_pg_connect(url);
    PGresult *r = ty_pg_one(c, sql);
    int64_t v = PQgetisnull(r, 0, 0) ? 0 : strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    PQfinish(c);
    return v;
}

static inline void ty_pg_query_text(const char *url, const char *sql, char *out, size_t n) {
    PGconn *c = ty_pg_connect(url);
    PGresult *r = ty_pg_one(c, sql);
    snprintf(out, n, "%s", PQgetisnull(r, 0, 0) ? "" : PQgetvalue(r, 0, 0));
    PQclear(r);
    PQfinish(c);
}

/* The one row sql answers, its $1.. bound to the n texts of params (the
 * caller PQclear's). */
static inline PGresult *ty_pg_row(const char *url, const char *sql, int n, const char *const *params) {
    PGconn *c = ty_pg_connect(url);
    PGresult *r = PQexecParams(c, sql, n, NULL, params, NULL, NULL, 0);
    ck_assert_msg(PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1, "%s: %s (%d rows)", sql,
                  PQerrorMessage(c), PQntuples(r));
    PQfinish(c);
    return r;
}

/* A number of sql written for SQLite with one parameter (every ? is id),
 * -1 for NULL. */
static inline int64_t ty_pg_int_of(const char *url, const char *sql, int64_t id) {
    char text[1024], arg[24];
    size_t o = 0;
    for (const char *p = sql; *p; p++) {
        ck_assert_msg(o + 3 < sizeof text, "%s: too long", sql);
        if (*p == '?') {
            memcpy(text + o, "$1", 2);
            o += 2;
        } else {
            text[o++] = *p;
        }
    }
    text[o] = '\0';
    snprintf(arg, sizeof arg, "%lld", (long long)id);
    const char *params[1] = {arg};
    PGresult *r = ty_pg_row(url, text, strchr(sql, '?') ? 1 : 0, params);
    int64_t v = PQgetisnull(r, 0, 0) ? -1 : strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    return v;
}

static inline void ty_pg_exec_fenced(const char *url, const char *sql) {
    PGconn *c = ty_pg_connect(url);
    ty_pg_run(c, "BEGIN");
    PGresult *r = PQexec(c, "UPDATE ty_lease SET holder = 'test', url = '', epoch = epoch + 1,"
                            " acquired_at = clock_timestamp(), expires_at = clock_timestamp() + interval '1 min'"
                            " WHERE id = 1 AND expires_at < clock_timestamp() RETURNING epoch");
    ck_assert_msg(PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1,
                  "the lease of %s is held (stop the server first): %s", url, PQerrorMessage(c));
    PQclear(r);
    ty_pg_run(c, "SELECT set_config('ty.epoch', epoch::text, true) FROM ty_lease WHERE id = 1");
    ty_pg_run(c, sql);
    ty_pg_run(c, "UPDATE ty_lease SET expires_at = '-infinity' WHERE id = 1 AND holder = 'test'");
    ty_pg_run(c, "COMMIT");
    PQfinish(c);
}

#endif
