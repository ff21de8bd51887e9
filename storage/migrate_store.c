/* migrate_store.c - a stopped SQLite cluster's state moved into PostgreSQL
 * (migrate_store.h; docs/postgres.md, "Moving a cluster from SQLite").
 *
 * The order of the work is what keeps both sides safe:
 *  1. DATA/server.lock taken (flock, held to the end): no server runs on
 *     DATA, and none starts meanwhile; DATA/trainyard.db opened read-only,
 *     its schema this build's newest;
 *  2. the target opened with db_open (migrated to the same version), the
 *     lease taken for the tool (holder "migrate"): refused while a server
 *     holds it; a libpq session of our own carries the lease's epoch, so
 *     the fence lets its writes through;
 *  3. the tables compared (the PostgreSQL texts' list, in their order: every
 *     REFERENCES names a table before it; the same columns on both sides),
 *     the target's trainyard tables empty (or, with force, truncated in the
 *     copy's transaction);
 *  4. with a blob store: every checkpoint and context file the rows name,
 *     checked against its row, uploaded, read back and checked again, before
 *     any row names the store;
 *  5. one transaction: COPY of every table (ids kept), the checkpoints' and
 *     contexts' store set for what step 4 moved, each identity sequence set
 *     past max(id), COMMIT;
 *  6. per table: the count and an order-independent hash (the sum of every
 *     row's sha256, mod 2^256) of each row's canonical text, computed by the
 *     same code over the same SELECT on both sides;
 *  7. DATA/migrated-to written when every table matches. */
#include "migrate_store.h"
#include "blob.h"
#include "db.h"
#include "schema.h"
#include "schema_pg.h"
#include "../common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <libpq-fe.h>
#include <limits.h>
#include <stdarg.h>
#include <openssl/sha.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define COLS_MAX 64
#define COPY_FLUSH (1u << 20)

/* ---------------------------------------------------------------- tables */

typedef struct mcol {
    char name[64];
    char kind;       /* 'i' integer, 'f' double, 't' text, 'b' bytea */
    int identity;    /* GENERATED ... AS IDENTITY */
} mcol;

typedef struct mtable {
    char name[64];
    int ncols;
    mcol cols[COLS_MAX];
    char select[4096];   /* SELECT "a", "b" FROM "t" ORDER BY <primary key> */
    char copy[4096];     /* COPY "t" ("a", "b") FROM STDIN */
    int store_col, deleted_col, path_col; /* checkpoints/contexts: the store column (-1: none) */
} mtable;

typedef struct mctx {
    const migrate_opts *o;
    migrate_report *r;
    sqlite3 *lite;
    db *d;
    PGconn *pg;
    int ntables;
    mtable *t;
    const char *store_url;   /* the rows moved name this store; NULL: nothing moves */
    char *err;
    size_t errlen;
} mctx;

static void fail(mctx *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(mctx *m, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->err, m->errlen, fmt, ap);
    va_end(ap);
}

/* libpq's message on one line. */
static const char *pg_msg(const char *s, char *out, size_t cap) {
    snprintf(out, cap, "%s", s ? s : "");
    for (char *p = out; *p; p++)
        if (*p == '\n' || *p == '\t') *p = ' ';
    size_t n = strlen(out);
    while (n && out[n - 1] == ' ') out[--n] = '\0';
    return out;
}

static int quote_ident(const char *s, char *out, size_t cap) {
    size_t k = 0;
    if (cap < 3) return -1;
    out[k++] = '"';
    for (; *s; s++) {
        if (k + 3 >= cap) return -1;
        if (*s == '"') out[k++] = '"';
        out[k++] = *s;
    }
    out[k++] = '"';
    out[k] = '\0';
    return 0;
}

/* The database's own tables, which hold no cluster state to move:
 * the migrations' record, the lease, ty_meta and the change capture's
 * ty_changes (schema 23). */
static int pg_own_table(const char *name) {
    static const char *const own[] = {"schema_migrations", "ty_lease", "ty_meta", "ty_changes"};
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
        if (strcmp(name, own[i]) == 0) return 1;
    return 0;
}

/* The tables the PostgreSQL texts create (the baseline, then each later
 * migration's), in their order: each REFERENCES there names a table made
 * before it. Without the database's own (pg_own_table). */
static int scan_tables(const char *text, char names[][64], int n, int cap) {
    for (const char *p = text; (p = strstr(p, "CREATE TABLE ")) != NULL;) {
        p += 13;
        if (strncmp(p, "IF NOT EXISTS ", 14) == 0) p += 14;
        size_t len = strcspn(p, "( \n");
        if (len == 0 || len >= 64) continue;
        char name[64];
        memcpy(name, p, len);
        name[len] = '\0';
        if (pg_own_table(name)) continue;
        if (n == cap) return -1;
        snprintf(names[n++], 64, "%s", name);
    }
    return n;
}

static int baseline_tables(char names[][64], int cap) {
    int n = scan_tables(schema_pg_baseline, names, 0, cap);
    for (int i = 0; i < schema_migrations_n && n >= 0; i++)
        if (schema_migrations[i].version > SCHEMA_PG_BASE && schema_migrations[i].pg)
            n = scan_tables(schema_migrations[i].pg, names, n, cap);
    return n;
}

static int in_list(char names[][64], int n, const char *s) {
    for (int i = 0; i < n; i++)
        if (strcmp(names[i], s) == 0) return 1;
    return 0;
}

/* A query of one text parameter on our session: the result (caller clears) or NULL with err. */
static PGresult *pg_q(mctx *m, const char *sql, const char *p1, ExecStatusType want) {
    const char *v[1] = {p1};
    PGresult *res = PQexecParams(m->pg, sql, p1 ? 1 : 0, NULL, p1 ? v : NULL, NULL, NULL, 0);
    if (PQresultStatus(res) != want) {
        char msg[400];
        fail(m, "the database at %s: %s", m->r->target, pg_msg(PQresultErrorMessage(res), msg, sizeof msg));
        PQclear(res);
        return NULL;
    }
    return res;
}

/* The tables on both sides: the same list (the PostgreSQL texts'), the same columns. */
static int tables_load(mctx *m) {
    char names[MIGRATE_TABLES_MAX][64];
    int n = baseline_tables(names, MIGRATE_TABLES_MAX);
    if (n <= 0) {
        fail(m, "cannot read the table list of the PostgreSQL schema");
        return -1;
    }
    /* SQLite's tables: none the list lacks */
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(m->lite,
                           "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\'"
                           " AND name <> 'schema_migrations' ORDER BY name",
                           -1, &st, NULL) != SQLITE_OK) {
        fail(m, "%s/trainyard.db: %s", m->o->data_dir, sqlite3_errmsg(m->lite));
        return -1;
    }
    int lite_n = 0, rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        const char *t = (const char *)sqlite3_column_text(st, 0);
        lite_n++;
        if (!in_list(names, n, t)) {
            fail(m, "table %s of %s/trainyard.db is not in this build's PostgreSQL schema: it cannot place it", t,
                 m->o->data_dir);
            sqlite3_finalize(st);
            return -1;
        }
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) {
        fail(m, "%s/trainyard.db: %s", m->o->data_dir, sqlite3_errmsg(m->lite));
        return -1;
    }
    /* PostgreSQL's: none the list lacks either */
    PGresult *res = pg_q(m,
                         "SELECT c.relname FROM pg_class c WHERE c.relkind IN ('r', 'p') AND c.relnamespace ="
                         " (SELECT relnamespace FROM pg_class WHERE oid = 'ty_lease'::regclass) ORDER BY 1",
                         NULL, PGRES_TUPLES_OK);
    if (!res) return -1;
    int pg_n = 0;
    for (int i = 0; i < PQntuples(res); i++) {
        if (pg_own_table(PQgetvalue(res, i, 0))) continue;
        pg_n++;
        if (!in_list(names, n, PQgetvalue(res, i, 0))) {
            fail(m, "table %s of the database at %s is not in this build's PostgreSQL schema: it cannot fill it",
                 PQgetvalue(res, i, 0), m->r->target);
            PQclear(res);
            return -1;
        }
    }
    PQclear(res);
    if (lite_n != n || pg_n != n) {
        fail(m, "this build's PostgreSQL schema has %d tables, %s/trainyard.db %d and the database at %s %d", n,
             m->o->data_dir, lite_n,
             m->r->target, pg_n);
        return -1;
    }

    m->t = xcalloc((size_t)n, sizeof *m->t);
    m->ntables = n;
    for (int ti = 0; ti < n; ti++) {
        mtable *t = &m->t[ti];
        memcpy(t->name, names[ti], sizeof t->name); /* NUL-terminated within 64 */
        t->store_col = t->deleted_col = t->path_col = -1;
        res = pg_q(m,
                   "SELECT a.attname, format_type(a.atttypid, NULL), a.attidentity <> '' FROM pg_attribute a"
                   " WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
                   t->name, PGRES_TUPLES_OK);
        if (!res) return -1;
        if (PQntuples(res) > COLS_MAX) {
            fail(m, "table %s has more than %d columns", t->name, COLS_MAX);
            PQclear(res);
            return -1;
        }
        for (int i = 0; i < PQntuples(res); i++) {
            mcol *c = &t->cols[t->ncols++];
            snprintf(c->name, sizeof c->name, "%s", PQgetvalue(res, i, 0));
            const char *ty = PQgetvalue(res, i, 1);
            c->identity = strcmp(PQgetvalue(res, i, 2), "t") == 0;
            if (strcmp(ty, "bigint") == 0 || strcmp(ty, "integer") == 0 || strcmp(ty, "smallint") == 0) c->kind = 'i';
            else if (strcmp(ty, "double precision") == 0) c->kind = 'f';
            else if (strcmp(ty, "text") == 0) c->kind = 't';
            else if (strcmp(ty, "bytea") == 0) c->kind = 'b';
            else {
                fail(m, "column %s.%s has the type %s, which migrate does not copy", t->name, c->name, ty);
                PQclear(res);
                return -1;
            }
            if (strcmp(c->name, "store") == 0) t->store_col = i;
            if (strcmp(c->name, "deleted_at") == 0) t->deleted_col = i;
            if (strcmp(c->name, "path") == 0) t->path_col = i;
        }
        PQclear(res);
        if (strcmp(t->name, "checkpoints") != 0 && strcmp(t->name, "contexts") != 0) t->store_col = -1;
        /* the same columns in SQLite */
        if (sqlite3_prepare_v2(m->lite, "SELECT name FROM pragma_table_info(?1)", -1, &st, NULL) != SQLITE_OK) {
            fail(m, "%s/trainyard.db: %s", m->o->data_dir, sqlite3_errmsg(m->lite));
            return -1;
        }
        sqlite3_bind_text(st, 1, t->name, -1, SQLITE_STATIC);
        int lite_cols = 0;
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
            const char *cn = (const char *)sqlite3_column_text(st, 0);
            int found = 0;
            for (int i = 0; i < t->ncols; i++) found |= strcmp(t->cols[i].name, cn) == 0;
            if (!found) {
                fail(m, "column %s.%s of %s/trainyard.db is not in the database at %s", t->name, cn, m->o->data_dir,
                     m->r->target);
                sqlite3_finalize(st);
                return -1;
            }
            lite_cols++;
        }
        sqlite3_finalize(st);
        if (lite_cols != t->ncols) {
            fail(m, "table %s: %d columns in %s/trainyard.db, %d in the database at %s", t->name, lite_cols,
                 m->o->data_dir, t->ncols, m->r->target);
            return -1;
        }
        /* the primary key, for the order of the SELECT both sides run */
        res = pg_q(m,
                   "SELECT a.attname FROM pg_index i CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n)"
                   " JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum"
                   " WHERE i.indrelid = $1::regclass AND i.indisprimary ORDER BY k.n",
                   t->name, PGRES_TUPLES_OK);
        if (!res) return -1;
        buf sel, cp, cols, order;
        buf_init(&sel, sizeof t->select);
        buf_init(&cp, sizeof t->copy);
        buf_init(&cols, sizeof t->select);
        buf_init(&order, sizeof t->select);
        char q[160], qt[160];
        int bad = quote_ident(t->name, qt, sizeof qt) < 0;
        for (int i = 0; i < t->ncols && !bad; i++)
            bad = quote_ident(t->cols[i].name, q, sizeof q) < 0 || buf_printf(&cols, "%s%s", i ? ", " : "", q) < 0;
        /* no primary key: every column orders it */
        int npk = PQntuples(res);
        for (int i = 0; i < (npk ? npk : t->ncols) && !bad; i++)
            bad = quote_ident(npk ? PQgetvalue(res, i, 0) : t->cols[i].name, q, sizeof q) < 0 ||
                  buf_printf(&order, "%s%s", i ? ", " : "", q) < 0;
        PQclear(res);
        if (!bad)
            bad = buf_printf(&sel, "SELECT %s FROM %s ORDER BY %s", cols.data, qt, order.data) < 0 ||
                  buf_printf(&cp, "COPY %s (%s) FROM STDIN", qt, cols.data) < 0;
        if (!bad) {
            snprintf(t->select, sizeof t->select, "%s", sel.data);
            snprintf(t->copy, sizeof t->copy, "%s", cp.data);
        }
        buf_release(&sel);
        buf_release(&cp);
        buf_release(&cols);
        buf_release(&order);
        if (bad) {
            fail(m, "table %s: its statements are too long", t->name);
            return -1;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- values */

/* One value of a row, whichever side it came from. */
typedef struct mval {
    int null;
    int mismatch;        /* SQLite held another type than the column's (kept as its text) */
    int64_t i;
    double f;
    const void *p;       /* text or bytes */
    size_t n;
} mval;

static const char HEX[] = "0123456789abcdef";

/* Whether the SQLite row's store column is to name the store the blobs
 * moved to: a checkpoint not deleted, with a path, in the data directory;
 * any context in the data directory. */
static int store_moves(const mctx *m, const mtable *t, const mval *v) {
    if (!m->store_url || t->store_col < 0) return 0;
    const mval *s = &v[t->store_col];
    if (s->null || s->n != 0) return 0;
    if (t->deleted_col >= 0 && !v[t->deleted_col].null) return 0;
    if (t->path_col >= 0 && (v[t->path_col].null || v[t->path_col].n == 0)) return 0;
    return 1;
}

/* Column i of a SQLite row as the column's kind reads it. */
static void lite_val(sqlite3_stmt *st, int i, char kind, mval *v) {
    memset(v, 0, sizeof *v);
    int ty = sqlite3_column_type(st, i);
    if (ty == SQLITE_NULL) {
        v->null = 1;
        return;
    }
    switch (kind) {
    case 'i':
        if (ty == SQLITE_INTEGER) {
            v->i = sqlite3_column_int64(st, i);
            return;
        }
        break;
    case 'f':
        if (ty == SQLITE_FLOAT || ty == SQLITE_INTEGER) {
            v->f = sqlite3_column_double(st, i);
            return;
        }
        break;
    case 't':
        if (ty != SQLITE_BLOB) {
            v->p = sqlite3_column_text(st, i);
            v->n = (size_t)sqlite3_column_bytes(st, i);
            return;
        }
        break;
    case 'b':
        v->p = sqlite3_column_blob(st, i);
        v->n = (size_t)sqlite3_column_bytes(st, i);
        if (!v->p) v->p = "";
        return;
    }
    /* another type than the column's: its text, as SQLite gives it */
    v->mismatch = 1;
    v->p = sqlite3_column_text(st, i);
    v->n = (size_t)sqlite3_column_bytes(st, i);
    if (!v->p) v->p = "";
}

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Column i of a PostgreSQL row (text format) as the column's kind reads it;
 * a bytea is decoded into scratch. */
static int pg_val(PGresult *res, int row, int i, char kind, mval *v, buf *scratch) {
    memset(v, 0, sizeof *v);
    if (PQgetisnull(res, row, i)) {
        v->null = 1;
        return 0;
    }
    const char *s = PQgetvalue(res, row, i);
    size_t n = (size_t)PQgetlength(res, row, i);
    char *end = NULL;
    switch (kind) {
    case 'i':
        errno = 0;
        v->i = strtoll(s, &end, 10);
        return errno || *end ? -1 : 0;
    case 'f':
        v->f = strtod(s, &end);
        return *end ? -1 : 0;
    case 't':
        v->p = s;
        v->n = n;
        return 0;
    case 'b':
        if (n < 2 || s[0] != '\\' || s[1] != 'x' || n % 2) return -1;
        buf_reset(scratch);
        for (size_t k = 2; k < n; k += 2) {
            int hi = hexval(s[k]), lo = hexval(s[k + 1]);
            if (hi < 0 || lo < 0) return -1;
            char c = (char)(hi << 4 | lo);
            if (buf_append(scratch, &c, 1) < 0) return -1;
        }
        v->p = scratch->data ? scratch->data : "";
        v->n = scratch->len;
        return 0;
    }
    return -1;
}

/* ---------------------------------------------------------------- the hash */

/* A row's canonical text: per column, N; for NULL, i<int>; f<%.17g>;
 * t<len>:<bytes>; b<len>:<hex>; a value SQLite held with another type
 * than its column's is x<len>:<its text>, which never equals the other
 * side's. Both sides go through this function. */
static int canon_row(const mtable *t, const mval *v, buf *b) {
    buf_reset(b);
    for (int i = 0; i < t->ncols; i++) {
        const mval *x = &v[i];
        int rc = 0;
        if (x->null) rc = buf_append(b, "N;", 2);
        else if (x->mismatch) rc = buf_printf(b, "x%zu:", x->n) < 0 || buf_append(b, x->p, x->n) < 0 || buf_append(b, ";", 1) < 0 ? -1 : 0;
        else switch (t->cols[i].kind) {
            case 'i': rc = buf_printf(b, "i%lld;", (long long)x->i); break;
            case 'f': rc = buf_printf(b, "f%.17g;", x->f); break;
            case 't':
                rc = buf_printf(b, "t%zu:", x->n) < 0 || buf_append(b, x->p, x->n) < 0 || buf_append(b, ";", 1) < 0 ? -1 : 0;
                break;
            case 'b': {
                rc = buf_printf(b, "b%zu:", x->n);
                const unsigned char *p = x->p;
                for (size_t k = 0; k < x->n && rc == 0; k++) {
                    char h[2] = {HEX[p[k] >> 4], HEX[p[k] & 15]};
                    rc = buf_append(b, h, 2);
                }
                if (rc == 0) rc = buf_append(b, ";", 1);
                break;
            }
            }
        if (rc < 0) return -1;
    }
    return 0;
}

/* The sum of the rows' sha256, as four big-endian 64-bit words, mod 2^256:
 * the same for the same rows in any order, and a duplicated row counts. */
typedef struct msum {
    uint64_t w[4];
    int64_t rows;
} msum;

static void sum_add(msum *s, const buf *row) {
    unsigned char d[SHA256_DIGEST_LENGTH];
    SHA256((const unsigned char *)(row->data ? row->data : ""), row->len, d);
    unsigned carry = 0;
    for (int k = 3; k >= 0; k--) {
        uint64_t x = 0;
        for (int j = 0; j < 8; j++) x = x << 8 | d[k * 8 + j];
        uint64_t a = s->w[k] + x;
        unsigned c1 = a < x;
        uint64_t b2 = a + carry;
        unsigned c2 = b2 < a;
        s->w[k] = b2;
        carry = c1 | c2;
    }
    s->rows++;
}

static void sum_hex(const msum *s, char out[65]) {
    for (int k = 0; k < 4; k++) snprintf(out + 16 * k, 17, "%016llx", (unsigned long long)s->w[k]);
}

/* The table's rows in SQLite, with the store column as the copy writes it. */
static int hash_lite(mctx *m, const mtable *t, msum *s) {
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(m->lite, t->select, -1, &st, NULL) != SQLITE_OK) {
        fail(m, "%s/trainyard.db: %s: %s", m->o->data_dir, t->name, sqlite3_errmsg(m->lite));
        return -1;
    }
    mval v[COLS_MAX];
    buf b;
    buf_init(&b, (size_t)1 << 31);
    int rc, out = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        for (int i = 0; i < t->ncols; i++) lite_val(st, i, t->cols[i].kind, &v[i]);
        if (store_moves(m, t, v)) {
            v[t->store_col].p = m->store_url;
            v[t->store_col].n = strlen(m->store_url);
        }
        if (canon_row(t, v, &b) < 0) {
            fail(m, "%s: a row too large to hash", t->name);
            out = -1;
            break;
        }
        sum_add(s, &b);
    }
    if (out == 0 && rc != SQLITE_DONE) {
        fail(m, "%s/trainyard.db: %s: %s", m->o->data_dir, t->name, sqlite3_errmsg(m->lite));
        out = -1;
    }
    sqlite3_finalize(st);
    buf_release(&b);
    return out;
}

/* The table's rows in PostgreSQL, read one at a time. */
static int hash_pg(mctx *m, const mtable *t, msum *s) {
    if (!PQsendQuery(m->pg, t->select) || !PQsetSingleRowMode(m->pg)) {
        char msg[400];
        fail(m, "the database at %s: %s: %s", m->r->target, t->name, pg_msg(PQerrorMessage(m->pg), msg, sizeof msg));
        return -1;
    }
    mval v[COLS_MAX];
    buf b, scratch[COLS_MAX];
    buf_init(&b, (size_t)1 << 31);
    for (int i = 0; i < t->ncols; i++) buf_init(&scratch[i], (size_t)1 << 30);
    int out = 0;
    PGresult *res;
    while ((res = PQgetResult(m->pg)) != NULL) {
        ExecStatusType rs = PQresultStatus(res);
        if (rs == PGRES_SINGLE_TUPLE && out == 0) {
            for (int i = 0; i < t->ncols && out == 0; i++)
                if (pg_val(res, 0, i, t->cols[i].kind, &v[i], &scratch[i]) < 0) {
                    fail(m, "%s.%s: a value PostgreSQL gave cannot be read: %.40s", t->name, t->cols[i].name,
                         PQgetvalue(res, 0, i));
                    out = -1;
                }
            if (out == 0 && canon_row(t, v, &b) < 0) {
                fail(m, "%s: a row too large to hash", t->name);
                out = -1;
            }
            if (out == 0) sum_add(s, &b);
        } else if (rs != PGRES_TUPLES_OK && rs != PGRES_SINGLE_TUPLE && out == 0) {
            char msg[400];
            fail(m, "the database at %s: %s: %s", m->r->target, t->name,
                 pg_msg(PQresultErrorMessage(res), msg, sizeof msg));
            out = -1;
        }
        PQclear(res);
    }
    buf_release(&b);
    for (int i = 0; i < t->ncols; i++) buf_release(&scratch[i]);
    return out;
}

/* ---------------------------------------------------------------- the copy */

/* A value in COPY's text format. */
static int copy_val(buf *b, char kind, const mval *v) {
    if (v->null) return buf_append(b, "\\N", 2);
    if (!v->mismatch && kind == 'i') return buf_printf(b, "%lld", (long long)v->i);
    if (!v->mismatch && kind == 'f') {
        if (v->f != v->f) return buf_appends(b, "NaN");
        if (v->f > 1.7976931348623157e308) return buf_appends(b, "Infinity");
        if (v->f < -1.7976931348623157e308) return buf_appends(b, "-Infinity");
        return buf_printf(b, "%.17g", v->f);
    }
    const unsigned char *p = v->p;
    if (!v->mismatch && kind == 'b') {
        if (buf_append(b, "\\\\x", 3) < 0) return -1;
        for (size_t k = 0; k < v->n; k++) {
            char h[2] = {HEX[p[k] >> 4], HEX[p[k] & 15]};
            if (buf_append(b, h, 2) < 0) return -1;
        }
        return 0;
    }
    /* text (or a value of another type, as text: PostgreSQL judges it) */
    size_t run = 0;
    for (size_t k = 0; k < v->n; k++) {
        const char *esc = NULL;
        switch (p[k]) {
        case '\\': esc = "\\\\"; break;
        case '\t': esc = "\\t"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        }
        if (!esc) continue;
        if (buf_append(b, p + run, k - run) < 0 || buf_appends(b, esc) < 0) return -1;
        run = k + 1;
    }
    return buf_append(b, p + run, v->n - run);
}

static int copy_flush(mctx *m, buf *b) {
    if (b->len && PQputCopyData(m->pg, b->data, (int)b->len) != 1) {
        char msg[400];
        fail(m, "the database at %s: COPY: %s", m->r->target, pg_msg(PQerrorMessage(m->pg), msg, sizeof msg));
        return -1;
    }
    buf_reset(b);
    return 0;
}

/* One table, SQLite to PostgreSQL, inside the open transaction. */
static int copy_table(mctx *m, const mtable *t, int64_t *rows) {
    PGresult *res = PQexec(m->pg, t->copy);
    if (PQresultStatus(res) != PGRES_COPY_IN) {
        char msg[400];
        fail(m, "the database at %s: %s: %s", m->r->target, t->copy, pg_msg(PQresultErrorMessage(res), msg, sizeof msg));
        PQclear(res);
        return -1;
    }
    PQclear(res);
    sqlite3_stmt *st = NULL;
    const char *why = NULL;
    char whybuf[600];
    if (sqlite3_prepare_v2(m->lite, t->select, -1, &st, NULL) != SQLITE_OK) {
        snprintf(whybuf, sizeof whybuf, "%s/trainyard.db: %s", m->o->data_dir, sqlite3_errmsg(m->lite));
        why = whybuf;
    }
    buf b;
    buf_init(&b, (size_t)1 << 31);
    mval v[COLS_MAX];
    int rc = SQLITE_DONE;
    while (!why && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        for (int i = 0; i < t->ncols; i++) lite_val(st, i, t->cols[i].kind, &v[i]);
        if (store_moves(m, t, v)) {
            v[t->store_col].p = m->store_url;
            v[t->store_col].n = strlen(m->store_url);
        }
        for (int i = 0; i < t->ncols && !why; i++)
            if ((i && buf_append(&b, "\t", 1) < 0) || copy_val(&b, t->cols[i].kind, &v[i]) < 0) why = "a row too large";
        if (!why && buf_append(&b, "\n", 1) < 0) why = "a row too large";
        (*rows)++;
        if (!why && b.len >= COPY_FLUSH && copy_flush(m, &b) < 0) {
            snprintf(whybuf, sizeof whybuf, "%s", m->err);
            why = whybuf;
        }
    }
    if (!why && rc != SQLITE_DONE) {
        snprintf(whybuf, sizeof whybuf, "%s/trainyard.db: %s", m->o->data_dir, sqlite3_errmsg(m->lite));
        why = whybuf;
    }
    sqlite3_finalize(st);
    if (!why && copy_flush(m, &b) < 0) {
        snprintf(whybuf, sizeof whybuf, "%s", m->err);
        why = whybuf;
    }
    buf_release(&b);
    PQputCopyEnd(m->pg, why);
    int out = 0;
    while ((res = PQgetResult(m->pg)) != NULL) {
        if (PQresultStatus(res) != PGRES_COMMAND_OK && out == 0) {
            char msg[600];
            if (why) fail(m, "%s: %s", t->name, why);
            else fail(m, "%s: PostgreSQL refused a row: %s", t->name, pg_msg(PQresultErrorMessage(res), msg, sizeof msg));
            out = -1;
        }
        PQclear(res);
    }
    if (why && out == 0) {
        fail(m, "%s: %s", t->name, why);
        out = -1;
    }
    return out;
}

/* ---------------------------------------------------------------- blobs */

static int file_sha256(const char *path, char hex[65], int64_t *size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return -1;
    sha256_stream sh;
    if (sha256_stream_init(&sh) < 0) {
        close(fd);
        return -1;
    }
    char *b = xmalloc(1u << 20);
    int64_t n = 0;
    int rc = 0;
    for (;;) {
        ssize_t r = read(fd, b, 1u << 20);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            rc = -1;
            break;
        }
        if (r == 0) break;
        if (sha256_stream_update(&sh, b, (size_t)r) < 0) rc = -1;
        n += r;
    }
    free(b);
    close(fd);
    if (sha256_stream_final(&sh, hex) < 0) rc = -1;
    *size = n;
    return rc;
}

/* One file of DATA to the store under key, checked before (against the
 * row's size and sha256) and after (read back). */
static int blob_move(mctx *m, blob_store *bs, const char *tmpdir, const char *path, const char *key, int64_t size,
                     const char *sha, const char *what) {
    char got[65];
    int64_t n = 0;
    if (file_sha256(path, got, &n) < 0) {
        fail(m, "%s: cannot read %s: %s (its row names it: the blobs were not moved)", what, path, strerror(errno));
        return -1;
    }
    if (n != size || strcmp(got, sha) != 0) {
        fail(m, "%s: %s holds %lld bytes of sha256 %.12s..., its row says %lld bytes of %.12s...", what, path,
             (long long)n, got, (long long)size, sha);
        return -1;
    }
    blob_err e;
    memset(&e, 0, sizeof e);
    int rc = blob_put_file(bs, key, path, &e);
    if (rc != BLOB_OK) {
        fail(m, "%s: cannot store %s in %s: %s %s: %s", what, key, m->store_url, blob_strerror(rc), e.code, e.msg);
        return -1;
    }
    char back[PATH_MAX];
    if (sfmt(back, sizeof back, "%s/back", tmpdir) < 0) {
        fail(m, "a temporary path is too long");
        return -1;
    }
    rc = blob_get_file(bs, key, back, &e);
    if (rc != BLOB_OK) {
        fail(m, "%s: cannot read %s back from %s: %s %s: %s", what, key, m->store_url, blob_strerror(rc), e.code, e.msg);
        return -1;
    }
    int hrc = file_sha256(back, got, &n);
    unlink(back);
    if (hrc < 0 || n != size || strcmp(got, sha) != 0) {
        fail(m, "%s: %s read back from %s is not what was sent (%lld bytes, sha256 %.12s...)", what, key, m->store_url,
             (long long)n, got);
        return -1;
    }
    m->r->blobs++;
    m->r->blob_bytes += size;
    return 0;
}

static int blobs_move(mctx *m, blob_store *bs) {
    char tmpdir[] = "/tmp/trainyard-migrate-XXXXXX";
    if (!mkdtemp(tmpdir)) {
        fail(m, "cannot make a temporary folder: %s", strerror(errno));
        return -1;
    }
    int out = 0;
    sqlite3_stmt *st = NULL;
    /* the checkpoints whose rows the copy points at the store (store_moves) */
    if (sqlite3_prepare_v2(m->lite,
                           "SELECT id, path, size, sha256 FROM checkpoints WHERE store = '' AND deleted_at IS NULL"
                           " AND path <> '' ORDER BY id",
                           -1, &st, NULL) != SQLITE_OK) {
        fail(m, "%s/trainyard.db: %s", m->o->data_dir, sqlite3_errmsg(m->lite));
        out = -1;
    }
    while (out == 0 && sqlite3_step(st) == SQLITE_ROW) {
        const char *rel = (const char *)sqlite3_column_text(st, 1);
        char path[PATH_MAX], key[300], what[64];
        snprintf(what, sizeof what, "checkpoint %lld", (long long)sqlite3_column_int64(st, 0));
        if (sfmt(path, sizeof path, "%s/checkpoints/%s", m->o->data_dir, rel) < 0 ||
            sfmt(key, sizeof key, "checkpoints/%s", rel) < 0 || !blob_key_valid(key)) {
            fail(m, "%s: its path %.80s cannot be a key of the store", what, rel);
            out = -1;
            break;
        }
        const char *sha = (const char *)sqlite3_column_text(st, 3);
        out = blob_move(m, bs, tmpdir, path, key, sqlite3_column_int64(st, 2), sha ? sha : "", what);
    }
    sqlite3_finalize(st);
    st = NULL;
    /* every context file held by a row in the data directory (teams share one by digest) */
    if (out == 0 && sqlite3_prepare_v2(m->lite,
                                       "SELECT digest, max(bytes) FROM contexts WHERE store = '' GROUP BY digest"
                                       " ORDER BY digest",
                                       -1, &st, NULL) != SQLITE_OK) {
        fail(m, "%s/trainyard.db: %s", m->o->data_dir, sqlite3_errmsg(m->lite));
        out = -1;
    }
    while (out == 0 && st && sqlite3_step(st) == SQLITE_ROW) {
        const char *dg = (const char *)sqlite3_column_text(st, 0);
        char path[PATH_MAX], key[300], what[96];
        snprintf(what, sizeof what, "context %.64s", dg ? dg : "");
        if (!dg || sfmt(path, sizeof path, "%s/contexts/%s", m->o->data_dir, dg) < 0 ||
            sfmt(key, sizeof key, "contexts/%s", dg) < 0 || !blob_key_valid(key)) {
            fail(m, "%s: its digest cannot be a key of the store", what);
            out = -1;
            break;
        }
        out = blob_move(m, bs, tmpdir, path, key, sqlite3_column_int64(st, 1), dg, what);
    }
    sqlite3_finalize(st);
    rmdir(tmpdir);
    return out;
}

/* ---------------------------------------------------------------- the run */

static double now_s(void) { return mono_s(); }

/* Refuses a target holding trainyard rows unless force; counts them. */
static int target_rows(mctx *m, int64_t *rows, char *names, size_t cap) {
    *rows = 0;
    names[0] = '\0';
    for (int i = 0; i < m->ntables; i++) {
        char sql[300], q[160];
        if (quote_ident(m->t[i].name, q, sizeof q) < 0 || sfmt(sql, sizeof sql, "SELECT count(*) FROM %s", q) < 0)
            return -1;
        PGresult *res = pg_q(m, sql, NULL, PGRES_TUPLES_OK);
        if (!res) return -1;
        long long n = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
        PQclear(res);
        if (n > 0) {
            *rows += n;
            size_t l = strlen(names);
            if (l + 80 < cap) snprintf(names + l, cap - l, "%s%s %lld", l ? ", " : "", m->t[i].name, n);
        }
    }
    return 0;
}

/* The lease: refused while a server holds it, then taken by the tool. */
static int lease_take(mctx *m) {
    PGresult *res = pg_q(m,
                         "SELECT holder, url, CASE WHEN expires_at > clock_timestamp() THEN 1 ELSE 0 END,"
                         " CASE WHEN expires_at > clock_timestamp() THEN ceil(extract(epoch FROM expires_at - clock_timestamp()))::bigint"
                         " ELSE 0 END"
                         " FROM ty_lease WHERE id = 1",
                         NULL, PGRES_TUPLES_OK);
    if (!res) return -1;
    if (PQntuples(res) == 1 && strcmp(PQgetvalue(res, 0, 2), "1") == 0) {
        fail(m, "the database at %s is in use: %s (%s) holds its lease for %s s more; stop every trainyard server on it "
                "first",
             m->r->target, PQgetvalue(res, 0, 0), PQgetvalue(res, 0, 1), PQgetvalue(res, 0, 3));
        PQclear(res);
        return -1;
    }
    PQclear(res);
    char host[128] = "localhost", url[256];
    if (gethostname(host, sizeof host - 1) < 0) snprintf(host, sizeof host, "localhost");
    snprintf(url, sizeof url, "migrate://%s/pid/%ld", host, (long)getpid());
    db_lease_cfg cfg = {.holder = "migrate", .url = url};
    char err[300];
    if (db_lease_start(m->d, &cfg, err, sizeof err) < 0) {
        fail(m, "the database at %s: cannot take part in its lease: %s", m->r->target, err);
        return -1;
    }
    if (db_lease_wait(m->d, 15000) < 0) {
        char who[300] = "";
        int64_t left = 0;
        db_leader(m->d, who, sizeof who, &left);
        fail(m, "the database at %s is in use: %s holds its lease; stop every trainyard server on it first", m->r->target,
             who[0] ? who : "another server");
        return -1;
    }
    char epoch[32];
    snprintf(epoch, sizeof epoch, "%lld", (long long)db_epoch(m->d));
    res = pg_q(m, "SELECT set_config('ty.epoch', $1, false)", epoch, PGRES_TUPLES_OK);
    if (!res) return -1;
    PQclear(res);
    return 0;
}

static int pg_cmd(mctx *m, const char *sql) {
    PGresult *res = pg_q(m, sql, NULL, PGRES_COMMAND_OK);
    if (!res) return -1;
    PQclear(res);
    return 0;
}

/* Every identity sequence past its table's max(id). */
static int sequences_set(mctx *m) {
    for (int ti = 0; ti < m->ntables; ti++) {
        const mtable *t = &m->t[ti];
        for (int i = 0; i < t->ncols; i++) {
            if (!t->cols[i].identity) continue;
            char qt[160], qc[160], sql[800];
            if (quote_ident(t->name, qt, sizeof qt) < 0 || quote_ident(t->cols[i].name, qc, sizeof qc) < 0 ||
                sfmt(sql, sizeof sql,
                     "SELECT setval(pg_get_serial_sequence('%s', '%s'), coalesce((SELECT max(%s) FROM %s), 0) + 1,"
                     " false)",
                     qt, t->cols[i].name, qc, qt) < 0) {
                fail(m, "%s: its sequence statement is too long", t->name);
                return -1;
            }
            PGresult *res = pg_q(m, sql, NULL, PGRES_TUPLES_OK);
            if (!res) return -1;
            PQclear(res);
        }
    }
    return 0;
}

static int lite_open(mctx *m) {
    char path[PATH_MAX];
    if (sfmt(path, sizeof path, "%s/trainyard.db", m->o->data_dir) < 0) {
        fail(m, "--from: path too long");
        return -1;
    }
    struct stat sb;
    if (stat(path, &sb) < 0) {
        fail(m, "%s: %s (is %s a trainyard data directory?)", path, strerror(errno), m->o->data_dir);
        return -1;
    }
    /* A stopped server leaves no WAL: the file alone is the state, read as
     * immutable, so not even a -shm is made in DATA. A WAL left by a server
     * that was killed is read through (its -wal and -shm are there already). */
    char wal[PATH_MAX + 8], uri[3 * PATH_MAX + 32];
    int has_wal = sfmt(wal, sizeof wal, "%s-wal", path) == 0 && stat(wal, &sb) == 0;
    size_t k = 0;
    k += (size_t)snprintf(uri, sizeof uri, "file:");
    for (const unsigned char *p = (const unsigned char *)path; *p && k + 4 < sizeof uri; p++) {
        if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || strchr("/-._~", *p))
            uri[k++] = (char)*p;
        else
            k += (size_t)snprintf(uri + k, sizeof uri - k, "%%%02X", *p);
    }
    uri[k] = '\0';
    if (sfmt(uri + k, sizeof uri - k, "?mode=ro%s", has_wal ? "" : "&immutable=1") < 0) {
        fail(m, "--from: path too long");
        return -1;
    }
    if (sqlite3_open_v2(uri, &m->lite, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, NULL) != SQLITE_OK) {
        fail(m, "%s: cannot open: %s", path, m->lite ? sqlite3_errmsg(m->lite) : "out of memory");
        return -1;
    }
    sqlite3_busy_timeout(m->lite, 5000);
    sqlite3_stmt *st = NULL;
    int v = -1;
    if (sqlite3_prepare_v2(m->lite, "SELECT coalesce(max(version), 0) FROM schema_migrations", -1, &st, NULL) ==
            SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW)
        v = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    if (v < 0) {
        fail(m, "%s: not a trainyard database: %s", path, sqlite3_errmsg(m->lite));
        return -1;
    }
    m->r->schema_version = v;
    if (v != db_migrations_count()) {
        fail(m, "%s is at schema version %d, this build's newest is %d: %s", path, v, db_migrations_count(),
             v < db_migrations_count() ? "start this build's `trainyard server --data DIR` on it once (it migrates), "
                                         "stop it, then migrate"
                                       : "use the build that wrote it");
        return -1;
    }
    /* one snapshot for the copy and the check */
    if (sqlite3_exec(m->lite, "BEGIN", NULL, NULL, NULL) != SQLITE_OK) {
        fail(m, "%s: %s", path, sqlite3_errmsg(m->lite));
        return -1;
    }
    return 0;
}

static int pg_open_own(mctx *m) {
    const char *keys[5] = {"dbname", "connect_timeout", "application_name", NULL, NULL};
    const char *vals[5] = {m->o->url, "5", "trainyard migrate", NULL, NULL};
    if (m->o->password) {
        keys[3] = "password";
        vals[3] = m->o->password;
    }
    m->pg = PQconnectdbParams(keys, vals, 1);
    if (!m->pg || PQstatus(m->pg) != CONNECTION_OK) {
        char msg[400];
        fail(m, "cannot reach the database at %s: %s", m->r->target,
             pg_msg(m->pg ? PQerrorMessage(m->pg) : "out of memory", msg, sizeof msg));
        return -1;
    }
    return pg_cmd(m, "SET client_min_messages = warning");
}

/* A URL holding a password is refused before anything is opened. */
static int url_check(mctx *m) {
    if (!db_is_url(m->o->url)) {
        fail(m, "--to: not a PostgreSQL URL (postgres://USER@HOST:PORT/DB)");
        return -1;
    }
    char *e = NULL;
    PQconninfoOption *opt = PQconninfoParse(m->o->url, &e);
    if (!opt) {
        char msg[300];
        fail(m, "--to: not a PostgreSQL URL: %s", pg_msg(e, msg, sizeof msg));
        PQfreemem(e);
        return -1;
    }
    int pw = 0;
    const char *host = NULL, *port = NULL, *dbname = NULL;
    for (PQconninfoOption *p = opt; p->keyword; p++) {
        if (!p->val) continue;
        if (strcmp(p->keyword, "password") == 0 && p->val[0]) pw = 1;
        else if (strcmp(p->keyword, "host") == 0) host = p->val;
        else if (strcmp(p->keyword, "hostaddr") == 0 && !host) host = p->val;
        else if (strcmp(p->keyword, "port") == 0) port = p->val;
        else if (strcmp(p->keyword, "dbname") == 0) dbname = p->val;
    }
    snprintf(m->r->target, sizeof m->r->target, "%s:%s/%s", host ? host : "localhost", port ? port : "5432",
             dbname ? dbname : "");
    PQconninfoFree(opt);
    if (pw) {
        fail(m, "--to: the URL holds a password; put it in --db-password-file FILE, a passfile (?passfile=FILE, "
                "PGPASSFILE) or PGPASSWORD instead");
        return -1;
    }
    return 0;
}

static int migrated_to_write(mctx *m) {
    char path[PATH_MAX], text[512], when[32];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    if (sfmt(path, sizeof path, "%s/migrated-to", m->o->data_dir) < 0 ||
        sfmt(text, sizeof text, "%s\nmigrated_at %s, schema %d\n", m->r->target, when, m->r->schema_version) < 0 ||
        file_write_atomic(path, text, strlen(text), 0644) < 0) {
        fail(m, "the copy is checked, but %s/migrated-to cannot be written: %s", m->o->data_dir, strerror(errno));
        return -1;
    }
    return 0;
}

static int run(mctx *m, int lock_fd) {
    (void)lock_fd;
    const migrate_opts *o = m->o;
    migrate_report *r = m->r;
    if (lite_open(m) < 0) return -1;

    /* the blob store first: a bad spec or credentials changes nothing */
    blob_store *bs = NULL;
    if (o->blob_store && o->blob_store[0] && strcmp(o->blob_store, "DATA") != 0) {
        blob_err e;
        memset(&e, 0, sizeof e);
        if (blob_store_open(o->blob_store, o->blob_credentials, o->data_dir, &bs, &e) != BLOB_OK) {
            fail(m, "--blob-store: %s", e.msg);
            return -1;
        }
        if (!blob_store_url(bs)[0]) {
            blob_store_close(bs);
            bs = NULL;
        } else if (blob_store_check(bs, &e) != BLOB_OK) {
            fail(m, "--blob-store %s: %s", blob_store_url(bs), e.msg);
            blob_store_close(bs);
            return -1;
        }
    }
    int out = -1;
    if (bs) {
        m->store_url = blob_store_url(bs);
        snprintf(r->blob_store, sizeof r->blob_store, "%s", m->store_url);
    }

    if (o->password) db_set_password(o->password);
    char err[600];
    if (db_open(&m->d, o->url, err, sizeof err) < 0) {
        fail(m, "%s", err);
        goto done;
    }
    if (pg_open_own(m) < 0 || lease_take(m) < 0 || tables_load(m) < 0) goto done;
    int64_t held = 0;
    char names[1024];
    if (target_rows(m, &held, names, sizeof names) < 0) goto done;
    if (held && !o->force) {
        fail(m, "the database at %s already holds trainyard rows (%s): refused; --force empties every trainyard table "
                "(TRUNCATE) in the copy's transaction and copies again",
             r->target, names);
        goto done;
    }

    if (bs) {
        double t0 = now_s();
        if (blobs_move(m, bs) < 0) goto done;
        r->blob_s = now_s() - t0;
    }

    /* the copy: one transaction */
    double t0 = now_s();
    if (pg_cmd(m, "BEGIN") < 0) goto done;
    if (held) {
        buf tr;
        buf_init(&tr, 8192);
        int bad = buf_appends(&tr, "TRUNCATE ") < 0;
        for (int i = 0; i < m->ntables && !bad; i++) {
            char q[160];
            bad = quote_ident(m->t[i].name, q, sizeof q) < 0 || buf_printf(&tr, "%s%s", i ? ", " : "", q) < 0;
        }
        int rc = bad ? -1 : pg_cmd(m, tr.data);
        buf_release(&tr);
        if (rc < 0) goto rollback;
        r->truncated_rows = held;
    }
    for (int i = 0; i < m->ntables; i++) {
        int64_t rows = 0;
        if (copy_table(m, &m->t[i], &rows) < 0) goto rollback;
        r->rows += rows;
    }
    if (sequences_set(m) < 0 || pg_cmd(m, "COMMIT") < 0) goto rollback;
    r->copy_s = now_s() - t0;

    /* the check: the same SELECT, the same hash, both sides */
    t0 = now_s();
    r->ntables = m->ntables;
    r->ok = 1;
    for (int i = 0; i < m->ntables; i++) {
        migrate_table *mt = &r->tables[i];
        snprintf(mt->name, sizeof mt->name, "%s", m->t[i].name);
        msum a, b;
        memset(&a, 0, sizeof a);
        memset(&b, 0, sizeof b);
        if (hash_lite(m, &m->t[i], &a) < 0 || hash_pg(m, &m->t[i], &b) < 0) goto done;
        mt->rows_sqlite = a.rows;
        mt->rows_pg = b.rows;
        sum_hex(&a, mt->hash_sqlite);
        sum_hex(&b, mt->hash_pg);
        mt->ok = a.rows == b.rows && strcmp(mt->hash_sqlite, mt->hash_pg) == 0;
        r->ok &= mt->ok;
    }
    r->check_s = now_s() - t0;
    if (r->ok && migrated_to_write(m) < 0) goto done;
    out = r->ok ? 0 : 1;
    goto done;

rollback : {
    char keep[1024];
    snprintf(keep, sizeof keep, "%s", m->err);
    PGresult *res = PQexec(m->pg, "ROLLBACK");
    PQclear(res);
    fail(m, "%s (the copy was rolled back: the database at %s is as it was)", keep, r->target);
}
done:
    if (m->pg) PQfinish(m->pg);
    m->pg = NULL;
    db_close(m->d); /* gives the lease back */
    m->d = NULL;
    if (o->password) db_set_password(NULL);
    blob_store_close(bs);
    return out;
}

int migrate_run(const migrate_opts *o, migrate_report *r, char *err, size_t errlen) {
    memset(r, 0, sizeof *r);
    mctx m = {.o = o, .r = r, .err = err, .errlen = errlen};
    err[0] = '\0';
    if (!o->data_dir || !o->url) {
        fail(&m, "--from DATA and --to postgres://... are both needed");
        return -1;
    }
    if (url_check(&m) < 0) return -1;
    char lock[PATH_MAX];
    if (sfmt(lock, sizeof lock, "%s/server.lock", o->data_dir) < 0) {
        fail(&m, "--from: path too long");
        return -1;
    }
    struct stat sb;
    if (stat(o->data_dir, &sb) < 0 || !S_ISDIR(sb.st_mode)) {
        fail(&m, "--from %s: not a data directory (%s)", o->data_dir, errno ? strerror(errno) : "not a folder");
        return -1;
    }
    /* held to the end: no server runs on DATA, and none starts meanwhile */
    int fd = open(lock, O_RDWR | O_CLOEXEC);
    if (fd < 0 && errno != ENOENT) {
        fail(&m, "cannot open %s: %s", lock, strerror(errno));
        return -1;
    }
    if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) < 0) {
        fail(&m, "a trainyard server runs on %s (it holds %s): stop it first", o->data_dir, lock);
        close(fd);
        return -1;
    }
    int rc = run(&m, fd);
    if (m.lite) sqlite3_close(m.lite);
    free(m.t);
    if (fd >= 0) close(fd);
    return rc;
}
