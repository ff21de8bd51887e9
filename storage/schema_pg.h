/* schema_pg.h - the PostgreSQL baseline: the schema as of migration 18.
 *
 * A PostgreSQL database starts at version 18: schema_pg_baseline, run with
 * PQexec inside one transaction on an empty database, creates what SQLite
 * has after migrations 1..18 plus the PostgreSQL-only objects (ty_lease,
 * ty_meta, ty_json_*, ty_note, ty_fence, ty_install_fences). It writes no
 * schema_migrations row: the caller inserts versions 1..18 with the names of
 * schema_migrations[] (schema.h) in the same transaction. Its last statement
 * is `SELECT ty_install_fences()`, so PQexec answers PGRES_TUPLES_OK. See
 * docs/postgres.md, "The schema on PostgreSQL". */
#ifndef TRAINYARD_SCHEMA_PG_H
#define TRAINYARD_SCHEMA_PG_H

extern const char schema_pg_baseline[];

#endif
