/* db_fixture.h - for the suites that open a store themselves
 * (check_storage, check_sched), on SQLite or, with TY_PG_URL, PostgreSQL
 * (tests/pg_fixture.h).
 *
 *   ty_db_open_leading(d, path)   db_open of a file or a URL; on PostgreSQL
 *                                 it then takes the lease, as a server does,
 *                                 or every write is fenced (docs/postgres.md)
 *
 * Failures abort the test (ck_assert). */
#ifndef TRAINYARD_TESTS_DB_FIXTURE_H
#define TRAINYARD_TESTS_DB_FIXTURE_H

#include <check.h>
#include <string.h>

#include "../storage/db.h"

static inline void ty_db_open_leading(db **d, const char *path) {
    char err[256];
    ck_assert_msg(db_open(d, path, err, sizeof err) == 0, "%s", err);
    if (strcmp(db_engine(*d), "postgres") != 0) return;
    db_lease_cfg cfg = {.holder = "test", .url = "http://test"};
    ck_assert_msg(db_lease_start(*d, &cfg, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(db_lease_wait(*d, 10000), 0);
}

#endif
