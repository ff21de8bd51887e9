/* schema.h - the numbered migrations of the trainyard database.
 *
 * Migration N moves the schema from version N-1 to N; the version lives in
 * the `schema_migrations` table. Never edit a migration that has shipped: add
 * the next one. See docs/storage.md. */
#ifndef TRAINYARD_SCHEMA_H
#define TRAINYARD_SCHEMA_H

typedef struct migration {
    int version;
    const char *name;
    const char *sql;              /* SQLite's text */
    const char *pg;               /* PostgreSQL's (from SCHEMA_PG_BASE + 1 on; before, the baseline) */
} migration;

/* The version PostgreSQL's history starts at: storage/schema_pg.c's
 * baseline is the schema migrations 1..18 left, in one text. */
#define SCHEMA_PG_BASE 18

extern const migration schema_migrations[];
extern const int schema_migrations_n;

#endif
