/* migrate_store.h - moving a stopped SQLite cluster's state into PostgreSQL
 * (`trainyard migrate`; docs/postgres.md, "Moving a cluster from SQLite").
 *
 * The one place that reads both engines at once: DATA/trainyard.db opened
 * read-only, the target through db_open (migrated to the same version) and
 * a libpq session of its own for COPY, fenced by the lease the tool takes
 * for itself. Every table is copied in the baseline's order (foreign keys)
 * in one transaction, ids kept, the identity sequences set after; then each
 * table's rows are counted and hashed on both sides by the same code. With
 * a blob store, the checkpoint and context files of DATA are uploaded and
 * checked first, and the copied rows name the store.
 *
 * defines: migrate_opts, migrate_table, migrate_report, migrate_run */
#ifndef TRAINYARD_MIGRATE_STORE_H
#define TRAINYARD_MIGRATE_STORE_H

#include <stddef.h>
#include <stdint.h>

typedef struct migrate_opts {
    const char *data_dir;          /* DATA: trainyard.db, server.lock, checkpoints/, contexts/ */
    const char *url;               /* postgres://USER@HOST:PORT/DB[?passfile=FILE]: no password in it */
    const char *password;          /* from --db-password-file, or NULL (libpq's passfile, PGPASSWORD) */
    int force;                     /* a target holding trainyard rows is emptied (TRUNCATE) first */
    const char *blob_store;        /* NULL: rows keep store '' (the data directory); file:///DIR or s3://... */
    const char *blob_credentials;  /* the s3 store's AWS shared-credentials file */
} migrate_opts;

#define MIGRATE_TABLES_MAX 64

typedef struct migrate_table {
    char name[64];
    int64_t rows_sqlite, rows_pg;
    char hash_sqlite[65], hash_pg[65];  /* order-independent: sum of each row's sha256, mod 2^256 */
    int ok;
} migrate_table;

typedef struct migrate_report {
    char target[300];              /* host:port/db, never a password */
    int schema_version;
    int ntables;
    migrate_table tables[MIGRATE_TABLES_MAX];
    int64_t rows;                  /* copied, all tables */
    int64_t truncated_rows;        /* --force: rows the target held before (counted), removed */
    double copy_s, check_s, blob_s;
    char blob_store[512];          /* "" without --blob-store */
    int64_t blobs, blob_bytes;     /* uploaded and read back, checked against their rows */
    int ok;                        /* every table's count and hash match */
} migrate_report;

/* Moves DATA's state into the PostgreSQL database at o->url. Refused (-1,
 * one line in err, nothing written to the target) while a server holds
 * DATA/server.lock, when DATA's schema is not this build's newest, when the
 * URL holds a password or the database does not answer, when a server holds
 * the database's unexpired lease, when a trainyard table of the target
 * holds rows (unless o->force), when a file a row names is missing or
 * differs from its row. A failure while copying rolls the copy back (-1).
 * Otherwise the copy is committed and checked: 0 when every table's count
 * and hash match (r->ok; DATA/migrated-to then names the target), 1 when
 * one does not (r->tables say which). DATA is never written otherwise. */
int migrate_run(const migrate_opts *o, migrate_report *r, char *err, size_t errlen);

#endif
