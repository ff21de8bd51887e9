/* db_pg.c - the PostgreSQL engine under db.h: libpq connections, statements
 * prepared from the SQLite text (?N -> $N), results read whole, SQLSTATEs
 * mapped to db.h's codes, the fencing number on the session and the change
 * capture drained before a commit. See db_pg.h; docs/postgres.md. */
#include "db_pg.h"
#include "db_codes.h"
#include "../common/util.h"

#include <libpq-fe.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* PostgreSQL's type OIDs (pg_type.h, stable since 7.x) */
#define OID_BOOL 16
#define OID_BYTEA 17
#define OID_INT8 20
#define OID_INT2 21
#define OID_INT4 23
#define OID_FLOAT4 700
#define OID_FLOAT8 701
#define OID_NUMERIC 1700

struct pg_conn {
    PGconn *conn;
    int64_t changes;              /* rows of the last command */
    char err[512];                /* the last error, one line */
    int64_t epoch;                /* ty.epoch of this session (-1: none) */
    int64_t drained;              /* rows drained from ty_changes since this session's last VACUUM of it */
    unsigned next_name;           /* statement names s1, s2, ... */
    unsigned gen;                 /* bumped by a reset: the session's statements are gone */
    int deadline_ms;              /* pg_query_*: the longest wait for an answer (0: none) */
    int broken;                   /* the connection failed: reset before its next use */
    const int64_t *abandon;       /* pg_connect's: mono_ms() of the server's stop, 0 while it runs */
    char *url, *password, *app;   /* to reconnect */
};

#define PG_MAX_PARAMS 64

/* Round trips this thread made (each PQexec*, PQprepare, or query string
 * sent and answered): db_round_trips. */
static __thread uint64_t t_round_trips;

uint64_t pg_round_trips(void) { return t_round_trips; }

struct pg_stmt {
    pg_conn *pc;
    char *sql;                    /* the PostgreSQL text */
    char name[16];                /* "" until prepared on the server */
    unsigned prepared_gen;        /* the connection generation it was prepared on */
    int nparams;
    int is_write;                 /* INSERT, UPDATE, DELETE (or WITH ... of one) */
    char *vals[PG_MAX_PARAMS];
    int lens[PG_MAX_PARAMS];
    int fmts[PG_MAX_PARAMS];
    unsigned char owned[PG_MAX_PARAMS]; /* vals[i] is ours to free */
    unsigned types[PG_MAX_PARAMS];      /* declared at the prepare: int8, float8, bytea or 0 */
    char num[PG_MAX_PARAMS][32];        /* the text of numeric values */
    PGresult *res;
    int row, nrows, ran;
    unsigned char *blob;          /* the decoded bytea of the last db_col_blob */
    size_t blob_len;
    int blob_row, blob_col;       /* whose it is: asked again (db_col_bytes, then db_col_blob), it is not decoded again */
};

/* ---------------------------------------------------------------- errors */

static void set_err(pg_conn *pc, const char *what, const char *msg) {
    char line[400];
    snprintf(line, sizeof line, "%s", msg ? msg : "?");
    char *nl = strchr(line, '\n');
    if (nl) *nl = '\0';
    snprintf(pc->err, sizeof pc->err, "%s%s%s", what ? what : "", what ? ": " : "", line);
}

/* The result's SQLSTATE as db.h's code (docs/postgres.md, "Errors"). */
static int map_state(pg_conn *pc, const PGresult *r) {
    const char *s = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
    if (!s || PQstatus(pc->conn) == CONNECTION_BAD) {
        pc->broken = 1;
        return DB_UNAVAILABLE;
    }
    if (strncmp(s, "23", 2) == 0) return DB_CONSTRAINT;                  /* integrity constraint violation */
    if (strcmp(s, "40001") == 0 || strcmp(s, "40P01") == 0 || strcmp(s, "55P03") == 0) return DB_BUSY;
    if (strcmp(s, "TY001") == 0) return DB_FENCED;
    if (strncmp(s, "08", 2) == 0 || strncmp(s, "57P0", 4) == 0) {        /* connection, shutdown */
        pc->broken = 1;
        return DB_UNAVAILABLE;
    }
    if (strcmp(s, "53100") == 0) return DB_FULL;
    return DB_ERR;
}

/* ---------------------------------------------------------------- waiting for an answer
 * Every query is sent (PQsend*) and its answer awaited here, never in a
 * blocking PQexec: a PostgreSQL that is stopped (SIGSTOP, a frozen VM) or
 * whose backend hangs keeps the TCP connection up and answers nothing, and
 * keepalives and tcp_user_timeout do not see it. Without a bound every
 * thread that asked would wait for ever, and the server's shutdown (which
 * joins them) with it. */

/* The longest wait for an answer when the session sets no deadline of its
 * own: the server's statement_timeout (60 s, session_setup), which cancels a
 * slow statement there, and a margin. Past it the connection is dropped (a
 * transaction open on it is rolled back by the server) and the caller gets
 * DB_UNAVAILABLE. */
#define PG_ANSWER_MS (75 * 1000)
/* Once the server stops (pg_connect's abandon set), no answer is awaited
 * longer than this past the later of the stop and the wait's start: a
 * healthy server's answers come long before, a hung one's never. */
#define PG_STOP_WAIT_MS 2000
#define PG_POLL_SLICE_MS 200

static int64_t stop_of(const int64_t *abandon) { return abandon ? __atomic_load_n(abandon, __ATOMIC_ACQUIRE) : 0; }

static int64_t abandoned_at(const pg_conn *pc) { return stop_of(pc->abandon); }

/* The connection is given up: pc->err says why (the caller's message if
 * msg, else libpq's). DB_UNAVAILABLE. */
static int give_up(pg_conn *pc, const char *msg) {
    set_err(pc, NULL, msg ? msg : PQerrorMessage(pc->conn));
    pc->broken = 1;
    return DB_UNAVAILABLE;
}

/* Waits until libpq holds the next result of what was sent (PQgetResult
 * will not block): 0; or -1 when none came by end_ms, or by
 * PG_STOP_WAIT_MS after the process began to stop, or the connection
 * failed (pc broken, pc->err says which). */
static int await_ready(pg_conn *pc, int64_t start_ms, int64_t end_ms) {
    while (PQisBusy(pc->conn)) {
        int64_t now = mono_ms(), stop = abandoned_at(pc), until = end_ms;
        if (stop) {
            int64_t cut = (stop > start_ms ? stop : start_ms) + PG_STOP_WAIT_MS;
            if (cut < until) until = cut;
        }
        if (now >= until) {
            char msg[120];
            if (stop && until < end_ms)
                snprintf(msg, sizeof msg, "no answer within %d ms of the server stopping", PG_STOP_WAIT_MS);
            else
                snprintf(msg, sizeof msg, "no answer within %lld ms", (long long)(end_ms - start_ms));
            give_up(pc, msg);
            return -1;
        }
        int64_t left = until - now;
        struct pollfd p = {.fd = PQsocket(pc->conn), .events = POLLIN};
        if (p.fd < 0) {
            give_up(pc, NULL);
            return -1;
        }
        int n = poll(&p, 1, (int)(left < PG_POLL_SLICE_MS ? left : PG_POLL_SLICE_MS));
        if (n < 0 && errno != EINTR) {
            give_up(pc, strerror(errno));
            return -1;
        }
        if (n > 0 && !PQconsumeInput(pc->conn)) {
            give_up(pc, NULL);
            return -1;
        }
    }
    return 0;
}

/* The answer to what was just sent, waiting at most ms: its last result
 * (a failing statement of a query string ends it, so an error is the last
 * result), or NULL with pc broken and pc->err saying why (sent is 0 when
 * the send itself failed). */
static PGresult *await_last(pg_conn *pc, int sent, int ms) {
    if (!sent) {
        give_up(pc, NULL);
        return NULL;
    }
    int64_t start = mono_ms(), end = start + ms;
    PGresult *last = NULL;
    for (;;) {
        if (await_ready(pc, start, end) < 0) {
            PQclear(last);
            return NULL;
        }
        PGresult *x = PQgetResult(pc->conn);
        if (!x) break;
        PQclear(last);
        last = x;
    }
    if (!last) give_up(pc, NULL);
    return last;
}

/* The longest wait for this session's answers: its deadline (the lease's
 * connection), else PG_ANSWER_MS. */
static int answer_ms(const pg_conn *pc) { return pc->deadline_ms > 0 ? pc->deadline_ms : PG_ANSWER_MS; }

static PGresult *run_text(pg_conn *pc, const char *sql) {
    return await_last(pc, PQsendQuery(pc->conn, sql), answer_ms(pc));
}

/* ---------------------------------------------------------------- connections */

void pg_target(const char *url, char *out, size_t cap) {
    char *e = NULL;
    PQconninfoOption *o = PQconninfoParse(url, &e);
    if (!o) {
        PQfreemem(e);
        snprintf(out, cap, "the database");
        return;
    }
    const char *host = NULL, *port = NULL, *dbname = NULL;
    for (PQconninfoOption *p = o; p->keyword; p++) {
        if (!p->val) continue;
        if (strcmp(p->keyword, "host") == 0) host = p->val;
        else if (strcmp(p->keyword, "hostaddr") == 0 && !host) host = p->val;
        else if (strcmp(p->keyword, "port") == 0) port = p->val;
        else if (strcmp(p->keyword, "dbname") == 0) dbname = p->val;
    }
    /* several hosts (a multi-host URL): each with its port, h1:p1,h2:p2 */
    size_t off = 0;
    const char *h = host ? host : "localhost", *p = port ? port : "5432";
    for (int i = 0; off < cap; i++) {
        size_t hl = strcspn(h, ","), pl = strcspn(p, ",");
        int w = snprintf(out + off, cap - off, "%s%.*s:%.*s", i ? "," : "", (int)hl, h, (int)(pl ? pl : 4),
                         pl ? p : "5432");
        if (w < 0) break;
        off += (size_t)w;
        if (!h[hl]) break;
        h += hl + 1;
        if (p[pl]) p += pl + 1; /* one port for every host: the last one is kept */
    }
    if (off < cap) snprintf(out + off, cap - off, "/%s", dbname ? dbname : "");
    PQconninfoFree(o);
}

/* What every session of ours does first: its name, its limits, and
 * ty.capture on (its writes' changes go to ty_changes, marked with its
 * backend pid: the ty_note_* triggers, schema 23). JIT off: the
 * scheduler's full load (100,000 jobs with correlated subqueries) is
 * costed past jit_above_cost and spent 200 of its 275 ms compiling
 * (docs/postgres.md, "Speed"); none of our statements runs long enough
 * to win it back. */
static int session_setup(pg_conn *pc) {
    char sql[600];
    char app[64];
    snprintf(app, sizeof app, "%s", pc->app ? pc->app : "trainyard");
    for (char *p = app; *p; p++)
        if (*p == '\'' || *p == '\\') *p = '_';
    snprintf(sql, sizeof sql,
             "SET application_name = '%s';"
             " SET idle_in_transaction_session_timeout = '3s';"
             " SET lock_timeout = '5s';"
             " SET statement_timeout = '60s';"
             " SET client_min_messages = warning;"
             " SET jit = off;"
             " SET ty.capture = 'on';",
             app);
    t_round_trips++;
    PGresult *r = run_text(pc, sql);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    if (!ok && r) set_err(pc, "session setup", PQresultErrorMessage(r));
    PQclear(r);
    pc->epoch = -1;
    return ok ? 0 : -1;
}

static void notice_quiet(void *arg, const PGresult *r) {
    (void)arg;
    (void)r;
}

/* Every connection notices a dead peer within seconds (a leader cut off
 * from the network must find out before its lease can expire, and a
 * request must not hang for TCP's minutes): keepalives on an idle one,
 * tcp_user_timeout on one with a request in flight. The URL's own
 * settings win (they come after). */
static PGconn *connect_url(const char *url, const char *password, const char *user_timeout_ms) {
    const char *keys[10] = {"connect_timeout", "keepalives", "keepalives_idle", "keepalives_interval",
                            "keepalives_count", "tcp_user_timeout", "dbname", NULL, NULL, NULL};
    const char *vals[10] = {"5", "1", "5", "1", "3", user_timeout_ms, url, NULL, NULL, NULL};
    int k = 7;
    if (password) {
        keys[k] = "password";
        vals[k] = password;
        k++;
    }
    keys[k] = NULL;
    return PQconnectdbParams(keys, vals, 1);
}

pg_conn *pg_connect(const char *url, const char *password, const char *app, const int64_t *abandon, char *err,
                    size_t errlen) {
    if (stop_of(abandon)) { /* stopping: a hung database would hold a connect for its connect_timeout */
        snprintf(err, errlen, "cannot reach the database: the server is stopping");
        return NULL;
    }
    /* the lease's own connection gives up sooner: a renewal that hangs
     * must not outlast the leader's deadline */
    int lease = app && strstr(app, "lease") != NULL;
    PGconn *conn = connect_url(url, password, lease ? "1500" : "5000");
    if (!conn) {
        snprintf(err, errlen, "cannot reach the database: out of memory");
        return NULL;
    }
    if (PQstatus(conn) != CONNECTION_OK) {
        char target[256], msg[300];
        pg_target(url, target, sizeof target);
        snprintf(msg, sizeof msg, "%s", PQerrorMessage(conn));
        for (char *p = msg; *p; p++)
            if (*p == '\n' || *p == '\t') *p = ' ';
        size_t n = strlen(msg);
        while (n && msg[n - 1] == ' ') msg[--n] = '\0';
        snprintf(err, errlen, "cannot reach the database at %s: %s", target, msg);
        PQfinish(conn);
        return NULL;
    }
    PQsetNoticeReceiver(conn, notice_quiet, NULL);
    pg_conn *pc = xcalloc(1, sizeof *pc);
    pc->conn = conn;
    pc->url = xstrdup(url);
    pc->password = password ? xstrdup(password) : NULL;
    pc->app = xstrdup(app ? app : "trainyard");
    pc->abandon = abandon;
    if (session_setup(pc) < 0) {
        snprintf(err, errlen, "%s", pc->err);
        pg_close(pc);
        return NULL;
    }
    return pc;
}

void pg_close(pg_conn *pc) {
    if (!pc) return;
    if (pc->conn) PQfinish(pc->conn);
    if (pc->password) {
        explicit_bzero(pc->password, strlen(pc->password));
        free(pc->password);
    }
    free(pc->url);
    free(pc->app);
    free(pc);
}

int pg_broken(pg_conn *pc) { return pc->broken || PQstatus(pc->conn) == CONNECTION_BAD; }

int pg_check_alive(pg_conn *pc) {
    if (!pg_broken(pc)) return 0;
    if (abandoned_at(pc)) { /* stopping: no new session (a reset could wait connect_timeout) */
        set_err(pc, "the database does not answer", "the server is stopping");
        return -1;
    }
    PQreset(pc->conn);
    if (PQstatus(pc->conn) != CONNECTION_OK) {
        set_err(pc, "the database does not answer", PQerrorMessage(pc->conn));
        return -1;
    }
    pc->broken = 0;
    pc->gen++; /* the statements prepared before are gone with the old session */
    if (session_setup(pc) < 0) {
        pc->broken = 1;
        return -1;
    }
    return 0;
}

/* A session that died while idle (its server restarted, or a failover of
 * PostgreSQL moved the primary: with a multi-host URL and
 * target_session_attrs=read-write a reset reaches the new one) is found out
 * only at its next round trip. When that round trip was made outside a
 * transaction and does nothing by itself (a PREPARE, a SET, a BEGIN), it is
 * made once more on a fresh session, its ty.epoch set again, instead of
 * failing the request. 1: opened again, try once more. */
static int revive_idle(pg_conn *pc, int was_idle, int64_t epoch) {
    if (!was_idle || PQstatus(pc->conn) != CONNECTION_BAD) return 0;
    pc->broken = 1;
    if (pg_check_alive(pc) < 0) return 0;
    if (epoch >= 0 && pg_set_epoch(pc, epoch) != 0) return 0;
    char where[300];
    pg_target(pc->url, where, sizeof where);
    log_warn("postgres: a session found closed was opened again (%s, %s)", where, PQhost(pc->conn));
    return 1;
}

/* The statements' names live with the session: a reset forgets them. */
static unsigned conn_gen(const pg_conn *pc) { return pc->gen; }

/* ---------------------------------------------------------------- text */

/* SQLite's parameters as PostgreSQL's: ?N -> $N, a bare ? -> $(largest so
 * far + 1), SQLite's own numbering rule; $N (a text written for PostgreSQL)
 * stays. String literals, quoted names and -- comments are copied as they
 * are. *nparams gets the largest N. */
static char *translate(const char *in, int *nparams) {
    size_t n = strlen(in);
    char *out = xmalloc(n * 12 + 16); /* "?" becomes at most "$NNNNN::text" */
    size_t o = 0;
    int maxn = 0;
    for (size_t i = 0; i < n;) {
        char ch = in[i];
        if (ch == '\'' || ch == '"') {
            size_t j = i + 1;
            while (j < n && !(in[j] == ch && (j + 1 >= n || in[j + 1] != ch))) j += in[j] == ch ? 2 : 1;
            if (j < n) j++;
            memcpy(out + o, in + i, j - i);
            o += j - i;
            i = j;
        } else if (ch == '-' && i + 1 < n && in[i + 1] == '-') {
            while (i < n && in[i] != '\n') out[o++] = in[i++];
        } else if (ch == '$' && i + 1 < n && isdigit((unsigned char)in[i + 1])) {
            /* a text written for PostgreSQL already numbers its parameters */
            int num = 0;
            out[o++] = in[i++];
            while (i < n && isdigit((unsigned char)in[i])) {
                if (num < 100000) num = num * 10 + (in[i] - '0');
                out[o++] = in[i++];
            }
            if (num > maxn) maxn = num;
        } else if (ch == '?') {
            i++;
            int num = 0;
            if (i < n && isdigit((unsigned char)in[i])) {
                while (i < n && isdigit((unsigned char)in[i]) && num < 100000) num = num * 10 + (in[i++] - '0');
            } else {
                num = maxn + 1;
            }
            if (num > maxn) maxn = num;
            o += (size_t)snprintf(out + o, 16, "$%d", num);
            /* "?N IS NULL" tells PostgreSQL nothing of the parameter's type,
             * and it must know one before anything else uses it: text */
            size_t k = i;
            while (k < n && isspace((unsigned char)in[k])) k++;
            if (strncasecmp(in + k, "IS NULL", 7) == 0 || strncasecmp(in + k, "IS NOT NULL", 11) == 0) {
                memcpy(out + o, "::text", 6);
                o += 6;
            }
        } else {
            out[o++] = ch;
            i++;
        }
    }
    out[o] = '\0';
    *nparams = maxn;
    return out;
}

static int starts_with_word(const char *s, const char *w) {
    while (isspace((unsigned char)*s) || *s == '(') s++;
    size_t n = strlen(w);
    return strncasecmp(s, w, n) == 0 && !isalnum((unsigned char)s[n]) && s[n] != '_';
}

/* ---------------------------------------------------------------- statements */

pg_stmt *pg_prepare(pg_conn *pc, const char *sqlite_sql) {
    int np = 0;
    char *sql = translate(sqlite_sql, &np);
    if (np > PG_MAX_PARAMS) {
        set_err(pc, "prepare", "more than 64 parameters");
        free(sql);
        return NULL;
    }
    pg_stmt *st = xcalloc(1, sizeof *st);
    st->pc = pc;
    st->sql = sql;
    st->nparams = np;
    st->is_write = starts_with_word(sql, "INSERT") || starts_with_word(sql, "UPDATE") ||
                   starts_with_word(sql, "DELETE") ||
                   (starts_with_word(sql, "WITH") && (strstr(sql, "INSERT") || strstr(sql, "UPDATE") ||
                                                      strstr(sql, "DELETE")));
    return st;
}

static void clear_binds(pg_stmt *st) {
    for (int i = 0; i < st->nparams; i++) {
        if (st->owned[i]) free(st->vals[i]);
        st->vals[i] = NULL;
        st->owned[i] = 0;
        st->lens[i] = 0;
        st->fmts[i] = 0;
    }
}

void pg_reset(pg_stmt *st) {
    if (st->res) PQclear(st->res);
    st->res = NULL;
    st->row = st->nrows = st->ran = 0;
    free(st->blob);
    st->blob = NULL;
    clear_binds(st);
}

void pg_stmt_free(pg_stmt *st) {
    if (!st) return;
    pg_reset(st);
    free(st->sql);
    free(st);
}

int pg_is_write(const pg_stmt *st) { return st->is_write; }

static int bind_slot(pg_stmt *st, int i) {
    if (i < 1 || i > st->nparams) return -1;
    int k = i - 1;
    if (st->owned[k]) free(st->vals[k]);
    st->vals[k] = NULL;
    st->owned[k] = 0;
    st->lens[k] = 0;
    st->fmts[k] = 0;
    return k;
}

/* A parameter's declared type is the one it was first bound with (int8,
 * float8, bytea), fixed when the statement is prepared on the server: a
 * later binding of another kind travels as text, which PostgreSQL parses
 * as the declared type. */
static void note_type(pg_stmt *st, int k, unsigned oid) {
    if (!st->name[0] && !st->types[k]) st->types[k] = oid;
}

int pg_bind_int64(pg_stmt *st, int i, int64_t v) {
    int k = bind_slot(st, i);
    if (k < 0) return 1;
    snprintf(st->num[k], sizeof st->num[k], "%" PRId64, v);
    st->vals[k] = st->num[k];
    note_type(st, k, OID_INT8);
    return 0;
}

int pg_bind_double(pg_stmt *st, int i, double v) {
    int k = bind_slot(st, i);
    if (k < 0) return 1;
    snprintf(st->num[k], sizeof st->num[k], "%.17g", v);
    st->vals[k] = st->num[k];
    note_type(st, k, OID_FLOAT8);
    return 0;
}

int pg_bind_null(pg_stmt *st, int i) { return bind_slot(st, i) < 0; }

int pg_bind_text(pg_stmt *st, int i, const char *s, int n, int copy) {
    int k = bind_slot(st, i);
    if (k < 0) return 1;
    if (!s) return 0;
    size_t len = n < 0 ? strlen(s) : (size_t)n;
    if (memchr(s, '\0', len)) len = strlen(s); /* PostgreSQL's text holds no NUL */
    if (copy || (n >= 0 && s[len] != '\0')) {
        char *c = xmalloc(len + 1);
        memcpy(c, s, len);
        c[len] = '\0';
        st->vals[k] = c;
        st->owned[k] = 1;
    } else {
        st->vals[k] = (char *)s;
    }
    return 0;
}

int pg_bind_blob(pg_stmt *st, int i, const void *p, int n) {
    int k = bind_slot(st, i);
    if (k < 0) return 1;
    if (!p || n < 0) return 0;
    char *c = xmalloc((size_t)n + 1);
    memcpy(c, p, (size_t)n);
    st->vals[k] = c;
    st->owned[k] = 1;
    st->lens[k] = n;
    st->fmts[k] = 1; /* binary */
    note_type(st, k, OID_BYTEA);
    return 0;
}

static PGresult *run_prepare(pg_conn *pc, const char *name, const pg_stmt *st) {
    return await_last(pc, PQsendPrepare(pc->conn, name, st->sql, st->nparams, st->nparams ? st->types : NULL),
                      answer_ms(pc));
}

static PGresult *run_prepared(pg_stmt *st) {
    return await_last(st->pc,
                      PQsendQueryPrepared(st->pc->conn, st->name, st->nparams, (const char *const *)st->vals,
                                          st->lens, st->fmts, 0),
                      answer_ms(st->pc));
}

static int ensure_prepared(pg_stmt *st) {
    pg_conn *pc = st->pc;
    if (st->name[0] && st->prepared_gen == conn_gen(pc)) return 0;
    char name[16];
    snprintf(name, sizeof name, "s%u", ++pc->next_name);
    int idle = PQtransactionStatus(pc->conn) == PQTRANS_IDLE;
    int64_t epoch = pc->epoch;
    t_round_trips++;
    PGresult *r = run_prepare(pc, name, st);
    if (PQresultStatus(r) != PGRES_COMMAND_OK && revive_idle(pc, idle, epoch)) {
        PQclear(r);
        snprintf(name, sizeof name, "s%u", ++pc->next_name);
        t_round_trips++;
        r = run_prepare(pc, name, st);
    }
    int rc = 0;
    if (!r) {
        rc = DB_UNAVAILABLE;
        log_error("postgres prepare: %s: %s", pc->err, st->sql);
    } else if (PQresultStatus(r) != PGRES_COMMAND_OK) {
        rc = map_state(pc, r);
        set_err(pc, NULL, PQresultErrorMessage(r));
        log_error("postgres prepare: %s: %s", pc->err, st->sql);
    } else {
        memcpy(st->name, name, sizeof name);
        st->prepared_gen = conn_gen(pc);
    }
    PQclear(r);
    return rc;
}

int pg_step(pg_stmt *st, int *ran) {
    pg_conn *pc = st->pc;
    *ran = 0;
    if (st->ran) {
        if (st->row < st->nrows) st->row++;
        return st->row < st->nrows ? DB_ROW : DB_DONE;
    }
    if (pg_broken(pc) && pg_check_alive(pc) < 0) return DB_UNAVAILABLE;
    int rc = ensure_prepared(st);
    if (rc) return rc;
    int idle = PQtransactionStatus(pc->conn) == PQTRANS_IDLE;
    int64_t epoch = pc->epoch;
    t_round_trips++;
    st->res = run_prepared(st);
    ExecStatusType s = PQresultStatus(st->res);
    /* a read outside a transaction, on a session found closed: once more on
     * a fresh one (a write is never sent twice) */
    if (s != PGRES_TUPLES_OK && s != PGRES_COMMAND_OK && !st->is_write && revive_idle(pc, idle, epoch) &&
        ensure_prepared(st) == 0) {
        PQclear(st->res);
        t_round_trips++;
        st->res = run_prepared(st);
        s = PQresultStatus(st->res);
    }
    st->ran = 1;
    *ran = 1;
    if (s == PGRES_TUPLES_OK || s == PGRES_COMMAND_OK) {
        const char *t = PQcmdTuples(st->res);
        pc->changes = t && *t ? strtoll(t, NULL, 10) : 0;
        st->nrows = s == PGRES_TUPLES_OK ? PQntuples(st->res) : 0;
        st->row = 0;
        return st->nrows > 0 ? DB_ROW : DB_DONE;
    }
    if (!st->res) return DB_UNAVAILABLE; /* no answer: pc->err says why */
    rc = map_state(pc, st->res);
    set_err(pc, NULL, PQresultErrorMessage(st->res));
    if (rc == DB_ERR) log_error("postgres: %s: %s", pc->err, st->sql);
    PQclear(st->res);
    st->res = NULL;
    st->nrows = 0;
    return rc;
}

/* ---------------------------------------------------------------- columns */

static int col_ok(pg_stmt *st, int i) {
    return st->res && st->row < st->nrows && i >= 0 && i < PQnfields(st->res);
}

int pg_col_type(pg_stmt *st, int i) {
    if (!col_ok(st, i) || PQgetisnull(st->res, st->row, i)) return DB_NULL;
    switch (PQftype(st->res, i)) {
    case OID_INT2:
    case OID_INT4:
    case OID_INT8:
    case OID_BOOL: return DB_INTEGER;
    case OID_FLOAT4:
    case OID_FLOAT8: return DB_FLOAT;
    case OID_NUMERIC: return strpbrk(PQgetvalue(st->res, st->row, i), ".eE") ? DB_FLOAT : DB_INTEGER;
    case OID_BYTEA: return DB_BLOB;
    default: return DB_TEXT;
    }
}

int64_t pg_col_int64(pg_stmt *st, int i) {
    if (!col_ok(st, i) || PQgetisnull(st->res, st->row, i)) return 0;
    const char *v = PQgetvalue(st->res, st->row, i);
    if (PQftype(st->res, i) == OID_BOOL) return v[0] == 't';
    if (PQftype(st->res, i) == OID_FLOAT8 || PQftype(st->res, i) == OID_FLOAT4 || strpbrk(v, ".eE"))
        return (int64_t)strtod(v, NULL); /* SQLite's cast of a real: toward zero */
    return strtoll(v, NULL, 10);
}

double pg_col_double(pg_stmt *st, int i) {
    if (!col_ok(st, i) || PQgetisnull(st->res, st->row, i)) return 0;
    const char *v = PQgetvalue(st->res, st->row, i);
    if (PQftype(st->res, i) == OID_BOOL) return v[0] == 't';
    return strtod(v, NULL);
}

const char *pg_col_text(pg_stmt *st, int i) {
    if (!col_ok(st, i) || PQgetisnull(st->res, st->row, i)) return NULL;
    return PQgetvalue(st->res, st->row, i);
}

const void *pg_col_blob(pg_stmt *st, int i) {
    if (!col_ok(st, i) || PQgetisnull(st->res, st->row, i)) return NULL;
    if (st->blob && st->blob_row == st->row && st->blob_col == i) return st->blob;
    free(st->blob);
    st->blob = NULL;
    st->blob_len = 0;
    const char *v = PQgetvalue(st->res, st->row, i);
    if (PQftype(st->res, i) != OID_BYTEA) {
        st->blob_len = strlen(v);
        return v;
    }
    size_t n = 0;
    unsigned char *b = PQunescapeBytea((const unsigned char *)v, &n);
    if (!b) return NULL;
    st->blob = xmalloc(n + 1);
    memcpy(st->blob, b, n);
    PQfreemem(b);
    st->blob_len = n;
    st->blob_row = st->row;
    st->blob_col = i;
    return st->blob;
}

int pg_col_bytes(pg_stmt *st, int i) {
    if (!col_ok(st, i) || PQgetisnull(st->res, st->row, i)) return 0;
    if (PQftype(st->res, i) == OID_BYTEA) {
        if (!pg_col_blob(st, i)) return 0;
        return (int)st->blob_len;
    }
    return PQgetlength(st->res, st->row, i);
}

/* ---------------------------------------------------------------- the session */

int64_t pg_changes(pg_conn *pc) { return pc->changes; }
const char *pg_errmsg(pg_conn *pc) { return pc->err[0] ? pc->err : "not an error"; }
int pg_in_tx(pg_conn *pc) {
    PGTransactionStatusType t = PQtransactionStatus(pc->conn);
    return t == PQTRANS_INTRANS || t == PQTRANS_INERROR || t == PQTRANS_ACTIVE;
}

int pg_tx_failed(pg_conn *pc) { return PQtransactionStatus(pc->conn) == PQTRANS_INERROR; }

int pg_exec(pg_conn *pc, const char *sql) {
    if (pg_broken(pc) && pg_check_alive(pc) < 0) return DB_UNAVAILABLE;
    int idle = PQtransactionStatus(pc->conn) == PQTRANS_IDLE;
    int64_t epoch = pc->epoch;
    t_round_trips++;
    PGresult *r = run_text(pc, sql);
    ExecStatusType s = PQresultStatus(r);
    if (s != PGRES_COMMAND_OK && s != PGRES_TUPLES_OK && (strncmp(sql, "BEGIN", 5) == 0 || strncmp(sql, "SET ", 4) == 0) &&
        revive_idle(pc, idle, epoch)) {
        PQclear(r);
        t_round_trips++;
        r = run_text(pc, sql);
        s = PQresultStatus(r);
    }
    int rc = 0;
    if (!r) {
        rc = DB_UNAVAILABLE; /* no answer: pc->err says why */
    } else if (s != PGRES_COMMAND_OK && s != PGRES_TUPLES_OK) {
        rc = map_state(pc, r);
        set_err(pc, NULL, PQresultErrorMessage(r));
    }
    PQclear(r);
    return rc;
}

void pg_set_deadline(pg_conn *pc, int ms) { pc->deadline_ms = ms; }

static PGresult *query(pg_conn *pc, const char *sql, int n, const char *const *vals, int *rc) {
    *rc = 0;
    if (pg_broken(pc) && pg_check_alive(pc) < 0) {
        *rc = DB_UNAVAILABLE;
        return NULL;
    }
    t_round_trips++;
    /* the lease's thread sets a deadline: it has to step down in time */
    PGresult *r = await_last(pc, PQsendQueryParams(pc->conn, sql, n, NULL, vals, NULL, NULL, 0), answer_ms(pc));
    if (!r) { /* no answer in time: the session is dropped (a reset makes another) */
        *rc = DB_UNAVAILABLE;
        return NULL;
    }
    ExecStatusType s = PQresultStatus(r);
    if (s != PGRES_TUPLES_OK && s != PGRES_COMMAND_OK) {
        *rc = map_state(pc, r);
        set_err(pc, NULL, PQresultErrorMessage(r));
        PQclear(r);
        return NULL;
    }
    return r;
}

int pg_query_int64(pg_conn *pc, const char *sql, int n, const char *const *vals, int64_t *out) {
    int rc;
    PGresult *r = query(pc, sql, n, vals, &rc);
    if (!r) return rc;
    rc = DB_DONE;
    if (PQntuples(r) > 0 && PQnfields(r) > 0 && !PQgetisnull(r, 0, 0)) {
        *out = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
        rc = 0;
    }
    PQclear(r);
    return rc;
}

int pg_query_text(pg_conn *pc, const char *sql, int n, const char *const *vals, char *out, size_t cap) {
    int rc;
    PGresult *r = query(pc, sql, n, vals, &rc);
    if (!r) return rc;
    rc = DB_DONE;
    if (PQntuples(r) > 0 && PQnfields(r) > 0 && !PQgetisnull(r, 0, 0)) {
        snprintf(out, cap, "%s", PQgetvalue(r, 0, 0));
        rc = 0;
    }
    PQclear(r);
    return rc;
}

int pg_set_epoch(pg_conn *pc, int64_t epoch) {
    if (pc->epoch == epoch && !pg_broken(pc)) return 0;
    char sql[80];
    snprintf(sql, sizeof sql, "SET ty.epoch = '%" PRId64 "'", epoch);
    int rc = pg_exec(pc, sql);
    if (rc == 0) pc->epoch = epoch;
    return rc;
}

int64_t pg_epoch_set(const pg_conn *pc) { return pc->epoch; }

/* This session's captured changes, taken (schema 23: one unlogged table,
 * each row marked with its session's backend pid). */
#define SQL_DRAIN "DELETE FROM ty_changes WHERE pid = pg_backend_pid() RETURNING t, id"

/* The drain's rows (table, id) handed to add, and counted for pg_chg_tidy. */
static void drained_rows(pg_conn *pc, PGresult *r, void (*add)(void *cls, int table, int64_t id), void *cls) {
    int n = PQntuples(r);
    for (int k = 0; k < n; k++)
        add(cls, (int)strtol(PQgetvalue(r, k, 0), NULL, 10), strtoll(PQgetvalue(r, k, 1), NULL, 10));
    pc->drained += n;
}

int pg_drain(pg_conn *pc, void (*add)(void *cls, int table, int64_t id), void *cls) {
    t_round_trips++;
    PGresult *r = run_text(pc, SQL_DRAIN);
    if (!r) return DB_UNAVAILABLE;
    if (PQresultStatus(r) != PGRES_TUPLES_OK) {
        int rc = map_state(pc, r);
        set_err(pc, "change capture", PQresultErrorMessage(r));
        PQclear(r);
        return rc;
    }
    drained_rows(pc, r, add, cls);
    PQclear(r);
    return 0;
}

int pg_drain_commit(pg_conn *pc, void (*add)(void *cls, int table, int64_t id), void *cls) {
    /* one query string, one round trip: the server runs the COMMIT only
     * when the DELETE succeeded (an error skips the rest of the string) */
    t_round_trips++;
    if (!PQsendQuery(pc->conn, SQL_DRAIN "; COMMIT")) {
        set_err(pc, "commit", PQerrorMessage(pc->conn));
        pc->broken = 1;
        return DB_UNAVAILABLE;
    }
    int rc = 0, k = 0;
    int64_t start = mono_ms(), end = start + answer_ms(pc);
    PGresult *r;
    for (;;) {
        if (await_ready(pc, start, end) < 0) return DB_UNAVAILABLE; /* pc->err says why */
        if (!(r = PQgetResult(pc->conn))) break;
        ExecStatusType s = PQresultStatus(r);
        if (rc == 0 && k == 0 && s == PGRES_TUPLES_OK) { /* the drain */
            drained_rows(pc, r, add, cls);
        } else if (rc == 0 && !(k == 1 && s == PGRES_COMMAND_OK)) { /* the first failure says why */
            rc = map_state(pc, r);
            set_err(pc, k == 0 ? "change capture" : "commit", PQresultErrorMessage(r));
        }
        PQclear(r);
        k++;
    }
    if (rc == 0 && k != 2) { /* the answer ended early: the connection went */
        set_err(pc, "commit", PQerrorMessage(pc->conn));
        pc->broken = 1;
        rc = DB_UNAVAILABLE;
    }
    return rc;
}

#define PG_CHG_TIDY_ROWS 4096

void pg_chg_tidy(pg_conn *pc) {
    if (pc->drained < PG_CHG_TIDY_ROWS || pg_in_tx(pc) || pg_broken(pc)) return;
    pc->drained = 0;
    t_round_trips++;
    PGresult *r = run_text(pc, "VACUUM ty_changes");
    if (!r) {
        log_warn("postgres: %s", pc->err);
        return;
    }
    if (PQresultStatus(r) != PGRES_COMMAND_OK) {
        map_state(pc, r);
        set_err(pc, "change capture", PQresultErrorMessage(r));
        log_warn("postgres: %s", pc->err);
    }
    PQclear(r);
}
