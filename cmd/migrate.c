/* migrate.c - `trainyard migrate --from DATA --to postgres://...`: a stopped
 * SQLite cluster's state into PostgreSQL, checked (storage/migrate_store.h
 * does the work; this file reads the arguments and prints). */
#include "migrate.h"
#include "../common/util.h"
#include "../storage/db.h"
#include "../storage/migrate_store.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void migrate_usage(FILE *f) {
    fprintf(f,
            "usage: trainyard migrate --from DATA --to postgres://USER@HOST:PORT/DB[?passfile=FILE]\n"
            "                         [--db-password-file FILE] [--force]\n"
            "                         [--blob-store file:///DIR|s3://BUCKET[/PREFIX]?endpoint=URL&region=R\n"
            "                          [--blob-credentials FILE]] [--json]\n"
            "  moves the state of the stopped server on DATA (DATA/trainyard.db) into PostgreSQL: every\n"
            "  table in one transaction, ids kept; then counts and hashes every table on both sides\n"
            "  (exit 0 only when all match). DATA is not changed but for DATA/migrated-to.\n"
            "  --from DATA    the data directory of a stopped SQLite server (refused while one runs)\n"
            "  --to URL       the database; migrated to this build's schema; refused while a server\n"
            "                 holds its lease, and when a trainyard table holds rows (unless --force)\n"
            "  --db-password-file FILE  the database password, alone in a file (mode 0600); or the\n"
            "                 URL's passfile, PGPASSFILE or PGPASSWORD (a URL holding one is refused)\n"
            "  --force        empty every trainyard table of the target (TRUNCATE, in the copy's\n"
            "                 transaction) and copy again\n"
            "  --blob-store SPEC  also move the checkpoint and context files of DATA there (each\n"
            "                 checked against its row, read back), the rows naming the store; the\n"
            "                 servers then take the same --blob-store. Without it the rows keep\n"
            "                 pointing at the data directory, which must move with the servers\n"
            "  --blob-credentials FILE  the s3 store's credentials (AWS shared-credentials, 0600)\n"
            "  --json         the report as JSON\n");
}

/* --db-password-file: one line, mode 0600; the caller wipes and frees. */
static char *password_read(const char *path) {
    struct stat st;
    if (stat(path, &st) < 0 || !S_ISREG(st.st_mode)) {
        fprintf(stderr, "trainyard: --db-password-file %s: not a readable file\n", path);
        return NULL;
    }
    if (st.st_mode & 077) {
        fprintf(stderr, "trainyard: --db-password-file %s: mode %03o lets others read it; chmod 600 it\n", path,
                (unsigned)(st.st_mode & 0777));
        return NULL;
    }
    size_t n = 0;
    char *pw = file_read_all(path, 4096, &n);
    if (!pw) {
        fprintf(stderr, "trainyard: --db-password-file %s: %s\n", path, strerror(errno));
        return NULL;
    }
    while (n && (pw[n - 1] == '\n' || pw[n - 1] == '\r')) pw[--n] = '\0';
    if (!n || memchr(pw, '\0', n) || memchr(pw, '\n', n)) {
        explicit_bzero(pw, n);
        free(pw);
        fprintf(stderr, "trainyard: --db-password-file %s: not one line of password\n", path);
        return NULL;
    }
    return pw;
}

static void print_json(const migrate_report *r) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "target", r->target);
    cJSON_AddNumberToObject(o, "schema", r->schema_version);
    cJSON_AddBoolToObject(o, "ok", r->ok);
    cJSON_AddNumberToObject(o, "rows", (double)r->rows);
    cJSON_AddNumberToObject(o, "copy_s", r->copy_s);
    cJSON_AddNumberToObject(o, "check_s", r->check_s);
    cJSON_AddNumberToObject(o, "rows_per_s", r->copy_s > 0 ? (double)r->rows / r->copy_s : 0);
    cJSON_AddNumberToObject(o, "truncated_rows", (double)r->truncated_rows);
    cJSON_AddStringToObject(o, "blob_store", r->blob_store);
    cJSON_AddNumberToObject(o, "blobs", (double)r->blobs);
    cJSON_AddNumberToObject(o, "blob_bytes", (double)r->blob_bytes);
    cJSON_AddNumberToObject(o, "blob_s", r->blob_s);
    cJSON *a = cJSON_AddArrayToObject(o, "tables");
    for (int i = 0; a && i < r->ntables; i++) {
        const migrate_table *t = &r->tables[i];
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "table", t->name);
        cJSON_AddNumberToObject(x, "rows", (double)t->rows_sqlite);
        cJSON_AddNumberToObject(x, "rows_postgres", (double)t->rows_pg);
        cJSON_AddStringToObject(x, "sqlite_hash", t->hash_sqlite);
        cJSON_AddStringToObject(x, "postgres_hash", t->hash_pg);
        cJSON_AddBoolToObject(x, "ok", t->ok);
        cJSON_AddItemToArray(a, x);
    }
    char *text = cJSON_Print(o);
    if (text) printf("%s\n", text);
    free(text);
    cJSON_Delete(o);
}

static void print_text(const migrate_report *r, const char *data) {
    printf("%-18s %10s  %-16s  %-16s  %s\n", "table", "rows", "sqlite hash", "postgres hash", "ok");
    for (int i = 0; i < r->ntables; i++) {
        const migrate_table *t = &r->tables[i];
        char rows[48];
        if (t->rows_sqlite == t->rows_pg) snprintf(rows, sizeof rows, "%lld", (long long)t->rows_sqlite);
        else snprintf(rows, sizeof rows, "%lld/%lld", (long long)t->rows_sqlite, (long long)t->rows_pg);
        printf("%-18s %10s  %.16s  %.16s  %s\n", t->name, rows, t->hash_sqlite, t->hash_pg, t->ok ? "ok" : "DIFFERS");
    }
    printf("copied %lld rows of %d tables into %s (schema %d) in %.2f s (%.0f rows/s), checked in %.2f s%s\n",
           (long long)r->rows, r->ntables, r->target, r->schema_version, r->copy_s,
           r->copy_s > 0 ? (double)r->rows / r->copy_s : 0, r->check_s,
           r->ok ? ": every table matches" : ": SOME TABLES DIFFER");
    if (r->truncated_rows)
        printf("--force: the %lld rows the database held were removed first\n", (long long)r->truncated_rows);
    if (r->blob_store[0])
        printf("blobs: %lld checkpoint and context files (%.1f MiB) stored in %s and read back, each matching its "
               "row, in %.2f s; start the servers with --blob-store '%s'%s\n",
               (long long)r->blobs, r->blob_bytes / 1048576.0, r->blob_store, r->blob_s, r->blob_store,
               strncmp(r->blob_store, "s3://", 5) == 0 ? " and its --blob-credentials" : "");
    else
        printf("blobs: not moved: the rows keep naming the data directory, so %s must move with the servers "
               "(or be on a file system they share); --blob-store moves them\n",
               data);
    printf("tokens: their rows moved; the files (admin.token, token, node.token, attempt.key, tls/) and the jobs' "
           "logs (logs/) stay in %s: the new servers need them (copy %s, then trainyard server --db URL --data DIR)\n",
           data, data);
}

int cmd_migrate(int argc, char **argv) {
    static const struct option longopts[] = {
        {"from", required_argument, NULL, 'f'},
        {"to", required_argument, NULL, 't'},
        {"db-password-file", required_argument, NULL, 'p'},
        {"force", no_argument, NULL, 'F'},
        {"blob-store", required_argument, NULL, 'b'},
        {"blob-credentials", required_argument, NULL, 'c'},
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *from = NULL, *to = NULL, *pwfile = NULL, *store = NULL, *creds = NULL;
    int force = 0, json = 0, c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case 'f': from = optarg; break;
        case 't': to = optarg; break;
        case 'p': pwfile = optarg; break;
        case 'F': force = 1; break;
        case 'b': store = optarg; break;
        case 'c': creds = optarg; break;
        case 'j': json = 1; break;
        case 'h': migrate_usage(stdout); return 0;
        default:
            fprintf(stderr, "trainyard: migrate: unknown or incomplete option %s (trainyard migrate --help)\n",
                    argv[optind - 1]);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "trainyard: migrate: unexpected argument %s (trainyard migrate --help)\n", argv[optind]);
        return 2;
    }
    if (!from) {
        fprintf(stderr, "trainyard: migrate: --from DATA is needed (the stopped server's data directory)\n");
        return 2;
    }
    if (!to) {
        fprintf(stderr, "trainyard: migrate: --to postgres://USER@HOST:PORT/DB is needed\n");
        return 2;
    }
    if (!db_is_url(to)) {
        fprintf(stderr, "trainyard: migrate: --to must be a PostgreSQL URL (postgres://USER@HOST:PORT/DB)\n");
        return 2;
    }
    if (creds && !store) {
        fprintf(stderr, "trainyard: migrate: --blob-credentials goes with --blob-store s3://...\n");
        return 2;
    }
    /* the engine's own lines (the lease taken and given back) are not the tool's story */
    log_set_level(LOG_ERROR);
    char *pw = NULL;
    if (pwfile && !(pw = password_read(pwfile))) return 2;
    migrate_opts o = {.data_dir = from, .url = to, .password = pw, .force = force, .blob_store = store,
                      .blob_credentials = creds};
    migrate_report *r = xcalloc(1, sizeof *r);
    char err[1200];
    int rc = migrate_run(&o, r, err, sizeof err);
    if (pw) {
        explicit_bzero(pw, strlen(pw));
        free(pw);
    }
    if (rc < 0) {
        fprintf(stderr, "trainyard: migrate: %s\n", err);
        free(r);
        return 1;
    }
    if (json) print_json(r);
    else print_text(r, from);
    free(r);
    return rc == 0 ? 0 : 3;
}
