/* check_migrate.c - `trainyard migrate` on real processes: a real
 * PostgreSQL 15 (scripts/pg-dev.sh, one per run, a database per case), a
 * `trainyard server` on SQLite with a `trainyard agent`, python3 command jobs
 * that report metrics and upload checkpoints:
 *  - cluster_moves: a team, its token, a user and membership, jobs that
 *    trained (metrics, logs, checkpoints: the older ones' rows marked
 *    deleted, which stay in DATA), a queued one, a context; migrate
 *    is refused while the SQLite server runs; after it stops, migrate
 *    reports every table matching, DATA keeps every file as it was and gains
 *    migrated-to (the target, no password); `trainyard server --db URL
 *    --data DATA` answers the same jobs, metrics, events, checkpoints (and
 *    their bytes' sha256), teams, users, members and contexts; the team token
 *    still works and a new job gets the next id (the sequences were set);
 *    migrate is refused while that server holds the lease, then into the
 *    non-empty database; --force --blob-store file:///DIR truncates, copies
 *    again and moves the checkpoint and context bytes: a server started on a
 *    copy of DATA without checkpoints/ and contexts/ serves the same bytes
 *    from the store;
 *  - values_exact: a database made by the storage code with awkward values
 *    (tabs, newlines, backslashes, "\N", quotes, UTF-8, 0.1, 1e-300, -2.5e-7,
 *    int64's extremes, NULLs, a sealed registry password holding every byte
 *    value): after migrate, PostgreSQL holds exactly them (read back through
 *    libpq in binary), and the identity sequences stand past max(id);
 *  - blobs_checked: checkpoint and context files made by hand; one that
 *    differs from its row refuses the migrate, nothing written; then to s3
 *    (radosgw by scripts/s3-dev.sh; file:// without it, S3_TEST_REQUIRED=1
 *    makes that a failure): the objects hold the rows' bytes, the rows name
 *    the store, the deleted checkpoint (its file gone) keeps ''.
 *  - bad_input: no --from, a --to that is not postgres://, a URL holding a
 *    password, an unreachable database, a schema older than the build: one
 *    line each and a non-zero exit, nothing written;
 *  - figures: 3,000 jobs, 100,000 metric rows and 9,000 events, migrated;
 *    prints the rows/s of docs/postgres.md ("Moving a cluster from SQLite").
 * SKIP when /usr/lib/postgresql/15/bin is absent, a failure with
 * PG_TEST_REQUIRED=1. */
#include "testlib.h"
#include "state_fixture.h"
#include "s3_fixture.h"
#include "../storage/db.h"

#include <fcntl.h>
#include <libpq-fe.h>
#include <limits.h>
#include <sqlite3.h>

#define PG_BIN "/usr/lib/postgresql/15/bin"

static char pg_root[256], pg_dir[320], pg_url[1100], pg_host_port[128];
static ty_proc srv;
static char admin_tok[128], team_tok[128];
static char base[256], tmpdir[256], script[400], flag[400], db_url[1300], db_name[64];
static pid_t agent_pid;
static int port;

/* Prints a line, reports epoch metrics and uploads a checkpoint after each
 * (argv[1]: the val_loss values), then waits for the file argv[2] ("-":
 * does not wait). */
static const char PY[] =
    "import hashlib, json, os, sys, time, urllib.request\n"
    "cfg = json.loads(os.environ['TRAINYARD_CONFIG'])\n"
    "vals = [float(v) for v in sys.argv[1].split(',')]\n"
    "base = f\"{cfg['api']}/api/v1/jobs/{cfg['job']}\"\n"
    "print('job output line', flush=True)\n"
    "for i, v in enumerate(vals):\n"
    "    step, epoch = 10 * (i + 1), i + 1\n"
    "    print('trainyard-metric ' + json.dumps({'kind': 'epoch', 'epoch': epoch, 'step': step, 'val_loss': v}),"
    " flush=True)\n"
    "    body = (f'checkpoint {cfg[\"job\"]} {i} ' * 3000).encode()\n"
    "    req = urllib.request.Request(f'{base}/checkpoints?step={step}&epoch={epoch}', data=body, method='PUT',\n"
    "        headers={'Authorization': 'Bearer ' + cfg['token'], 'Content-Type': 'application/octet-stream',\n"
    "                 'X-Checksum-Sha256': hashlib.sha256(body).hexdigest()})\n"
    "    urllib.request.urlopen(req).read()\n"
    "    print('uploaded checkpoint', i, flush=True)\n"
    "if sys.argv[2] != '-':\n"
    "    for _ in range(3000):\n"
    "        if os.path.exists(sys.argv[2]):\n"
    "            break\n"
    "        time.sleep(0.1)\n"
    "print('script done', flush=True)\n";

/* ---------------------------------------------------------------- PostgreSQL */

static int pg_have(void) { return access(PG_BIN "/initdb", X_OK) == 0 && access("scripts/pg-dev.sh", X_OK) == 0; }

/* One PostgreSQL for the whole run (started by main, stopped by main). */
static int pg_start(void) {
    snprintf(pg_root, sizeof pg_root, "/tmp/ty_migpg_XXXXXX");
    if (!mkdtemp(pg_root)) return -1;
    snprintf(pg_dir, sizeof pg_dir, "%s/pg", pg_root);
    chmod(pg_root, 0711); /* as root the server runs as postgres: it must reach DIR */
    char cmd[800];
    snprintf(cmd, sizeof cmd, "PG_DEV_FAST=1 scripts/pg-dev.sh start '%s' 2>&1", pg_dir);
    FILE *f = popen(cmd, "r");
    if (!f) return -1;
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "DATABASE_URL=", 13) == 0) {
            snprintf(pg_url, sizeof pg_url, "%s", line + 13);
            pg_url[strcspn(pg_url, "\r\n")] = '\0';
        } else {
            fputs(line, stderr);
        }
    }
    if (pclose(f) != 0 || !pg_url[0]) return -1;
    /* postgres://trainyard@HOST:PORT/trainyard?passfile=... */
    const char *at = strchr(pg_url, '@'), *sl = at ? strchr(at, '/') : NULL;
    if (!at || !sl) return -1;
    snprintf(pg_host_port, sizeof pg_host_port, "%.*s", (int)(sl - at - 1), at + 1);
    /* the passfile names the database trainyard; each case has its own: one for any */
    char pass[400], all[400];
    snprintf(pass, sizeof pass, "%s/pgpass", pg_dir);
    snprintf(all, sizeof all, "%s/pgpass-any", pg_root);
    size_t n = 0;
    char *t = file_read_all(pass, 4096, &n);
    if (!t) return -1;
    /* host:port:db:user:password */
    char *p1 = strchr(t, ':'), *p2 = p1 ? strchr(p1 + 1, ':') : NULL, *p3 = p2 ? strchr(p2 + 1, ':') : NULL;
    if (!p3) {
        free(t);
        return -1;
    }
    buf b;
    buf_init(&b, 8192);
    int bad = buf_append(&b, t, (size_t)(p2 - t + 1)) < 0 || buf_appends(&b, "*") < 0 || buf_appends(&b, p3) < 0;
    explicit_bzero(t, n);
    free(t);
    if (bad || file_write_atomic(all, b.data, b.len, 0600) < 0) bad = 1;
    explicit_bzero(b.data, b.len);
    buf_release(&b);
    if (bad) return -1;
    char *q = strstr(pg_url, "?passfile=");
    if (!q) return -1;
    snprintf(q, sizeof pg_url - (size_t)(q - pg_url), "?passfile=%s", all);
    return 0;
}

static void pg_stop(void) {
    if (!pg_dir[0]) return;
    char cmd[800];
    snprintf(cmd, sizeof cmd, "scripts/pg-dev.sh stop '%s' >/dev/null 2>&1", pg_dir);
    if (system(cmd) != 0) fprintf(stderr, "pg-dev.sh stop %s failed\n", pg_dir);
    ty_rmrf(pg_root);
}

/* A database of its own for the case (its owner the trainyard role), made
 * by the cluster's superuser over the socket; db_url names it. */
static void pg_database(const char *name) {
    snprintf(db_name, sizeof db_name, "%s", name);
    char cmd[1200];
    const char *port_s = strchr(pg_host_port, ':');
    ck_assert_ptr_nonnull(port_s);
    snprintf(cmd, sizeof cmd,
             "%s " PG_BIN "/psql -q -X -h '%s/run' -p %s -d postgres -c 'CREATE DATABASE %s OWNER trainyard' >&2",
             geteuid() == 0 ? "runuser -u postgres --" : "", pg_dir, port_s + 1, name);
    ck_assert_msg(system(cmd) == 0, "cannot create the database %s", name);
    const char *q = strchr(pg_url, '?');
    snprintf(db_url, sizeof db_url, "postgres://trainyard@%s/%s%s", pg_host_port, name, q ? q : "");
}

/* Our own session on the case's database (the libpq passfile of the URL). */
static PGconn *pg_conn(void) {
    const char *keys[] = {"dbname", NULL};
    const char *vals[] = {db_url, NULL};
    PGconn *c = PQconnectdbParams(keys, vals, 1);
    ck_assert_msg(PQstatus(c) == CONNECTION_OK, "%s", PQerrorMessage(c));
    return c;
}

static char *pg_text(PGconn *c, const char *sql) {
    PGresult *r = PQexec(c, sql);
    ck_assert_msg(PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1, "%s: %s", sql, PQresultErrorMessage(r));
    char *s = xstrdup(PQgetvalue(r, 0, 0));
    PQclear(r);
    return s;
}

/* ---------------------------------------------------------------- processes */

/* Runs the binary with args; its stdout and stderr into out; the exit status. */
static int run_ty(char *out, size_t cap, const char *const *args) {
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        close(fds[0]);
        close(fds[1]);
        const char *argv[32];
        int n = 0;
        argv[n++] = ty_bin();
        for (int i = 0; args[i] && n < 31; i++) argv[n++] = args[i];
        argv[n] = NULL;
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(fds[1]);
    size_t len = 0;
    for (;;) {
        ssize_t r = read(fds[0], out + len, cap - 1 - len);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        len += (size_t)r;
        if (len == cap - 1) break;
    }
    out[len] = '\0';
    close(fds[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int lines_of(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

/* The server on data directory dir, on the test's port. */
static void server_on(const char *dir, const char *const *more) {
    snprintf(srv.dir, sizeof srv.dir, "%s", dir);
    char listen[64];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    const char *extra[16] = {"--listen", listen};
    int n = 2;
    for (int i = 0; more && more[i] && n < 15; i++) extra[n++] = more[i];
    extra[n] = NULL;
    ty_server_start_args(&srv, "server", extra);
    ty_token(&srv, "admin.token", admin_tok, sizeof admin_tok);
}

static void agent_start(void) {
    char tokfile[400], logf[400], statef[400];
    snprintf(statef, sizeof statef, "%s/agent.state", base);
    snprintf(tokfile, sizeof tokfile, "%s/node.token", srv.dir);
    snprintf(logf, sizeof logf, "%s/agent.log", base);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        FILE *lf = freopen(logf, "a", stderr);
        (void)lf;
        execl(ty_bin(), ty_bin(), "agent", "--server", srv.url, "--token-file", tokfile, "--hostname", "mig-node",
              "--cpu-slots", "2", "--heartbeat", "1", "--poll-wait", "3", "--state-file", statef, (char *)NULL);
        _exit(127);
    }
    agent_pid = pid;
}

static void agent_stop(void) {
    if (agent_pid > 0) {
        kill(agent_pid, SIGTERM);
        waitpid(agent_pid, NULL, 0);
        agent_pid = 0;
    }
}

static void setup(void) {
    memset(&srv, 0, sizeof srv);
    agent_pid = 0;
    ty_mkdtemp(base, sizeof base, "mig");
    ty_mkdtemp_shared(tmpdir, sizeof tmpdir, "migtmp"); /* the programs run as other uids */
    snprintf(script, sizeof script, "%s/job.py", tmpdir);
    snprintf(flag, sizeof flag, "%s/finish", tmpdir);
    ck_assert_int_eq(file_write_atomic(script, PY, sizeof PY - 1, 0644), 0);
    port = ty_free_port();
}

static void teardown(void) {
    int fd = open(flag, O_WRONLY | O_CREAT, 0644);
    if (fd >= 0) close(fd);
    agent_stop();
    ty_kill(&srv, SIGTERM);
    ty_rmrf(base);
    ty_rmrf(tmpdir);
}

/* ---------------------------------------------------------------- helpers */

/* where check_migrate's server is, for state_fixture.h */
static ty_state S = {&srv, admin_tok, team_tok, script, base, base};

/* Every file under dir (name, size, mtime) as lines, sorted. */
static char *tree_listing(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "cd '%s' && find . -mindepth 1 -path ./logs -prune -o -print0 | sort -z | xargs -0 stat -c '%%n %%s %%Y'", dir);
    FILE *f = popen(cmd, "r");
    ck_assert_ptr_nonnull(f);
    buf b;
    buf_init(&b, 1 << 20);
    char line[1024];
    while (fgets(line, sizeof line, f)) ck_assert_int_eq(buf_appends(&b, line), 0);
    pclose(f);
    return buf_detach(&b, NULL);
}

/* ---------------------------------------------------------------- the cluster moved */

START_TEST(cluster_moves) {
    pg_database("moves");
    char data[320], out[16384];
    snprintf(data, sizeof data, "%s/data", base);
    server_on(data, NULL);
    agent_start();
    ty_team_with_member(&S, team_tok, sizeof team_tok);
    /* jobs that trained: one keeps its newest checkpoint, one ran to its end with 2 */
    int64_t done = ty_submit_script(&S, "done", "0.5,0.4,0.3", "-");
    int64_t two = ty_submit_script(&S, "two", "0.9,0.8", "-");
    ty_wait_job_state(&S, done, "succeeded", 90);
    ty_wait_job_state(&S, two, "succeeded", 90);
    for (int i = 0; ty_ckpt_count(&S, done) != 1 || ty_ckpt_count(&S, two) != 1; i++) {
        ck_assert_msg(i < 600, "the finished jobs kept %d and %d checkpoints", ty_ckpt_count(&S, done), ty_ckpt_count(&S, two));
        ty_sleep_ms(100);
    }
    int64_t queued = ty_submit(srv.url, team_tok,
                               "{\"name\":\"queued\",\"command\":{\"argv\":[\"/bin/true\"]},"
                               "\"strategy\":{\"type\":\"multi_worker_mirrored\"},\"resources\":{\"workers\":16,"
                               "\"device\":\"cpu\"},\"queue_if_infeasible\":true}");
    /* a context (a team's folder) */
    char ctxdir[400], ctxfile[480];
    snprintf(ctxdir, sizeof ctxdir, "%s/ctx", base);
    ck_assert_int_eq(mkdir(ctxdir, 0700), 0);
    snprintf(ctxfile, sizeof ctxfile, "%s/train.py", ctxdir);
    ck_assert_int_eq(file_write_atomic(ctxfile, "print('hello')\n", 15, 0644), 0);
    setenv("TRAINYARD_URL", srv.url, 1);
    setenv("TRAINYARD_TOKEN", team_tok, 1);
    const char *push[] = {"context", "push", ctxdir, NULL};
    int rc = run_ty(out, sizeof out, push);
    ck_assert_msg(rc == 0, "context push: %d: %s", rc, out);
    ty_sleep_ms(1200); /* a scheduling pass: the queued job stays queued */

    /* every answer */
    ty_recorded rec[TY_NREC];
    int nrec = 0;
    int64_t ids[3] = {done, two, queued};
    ty_record_jobs(rec, &nrec, &S, ids, 3);
    ty_record(rec, &nrec, &S, team_tok, "/api/v1/contexts");
    char *log_before = ty_task_log(srv.url, team_tok, done, "worker-0");
    ck_assert_ptr_nonnull(strstr(log_before, "script done"));
    ty_ckpt ck[8];
    int nck = ty_record_ckpts(&S, ids, 2, ck, 8);
    ck_assert_int_eq(nck, 2); /* a finished job keeps its newest; the others' rows are marked deleted */

    /* refused while the SQLite server runs */
    const char *margs[] = {"migrate", "--from", data, "--to", db_url, NULL};
    rc = run_ty(out, sizeof out, margs);
    ck_assert_msg(rc == 1 && strstr(out, "a trainyard server runs on") && lines_of(out) == 1, "%d: %s", rc, out);

    agent_stop();
    ty_kill(&srv, SIGTERM);
    char *before = tree_listing(data);
    rc = run_ty(out, sizeof out, margs);
    printf("migrate:\n%s", out);
    ck_assert_msg(rc == 0, "migrate: %d: %s", rc, out);
    ck_assert_ptr_nonnull(strstr(out, ": every table matches"));
    ck_assert_ptr_null(strstr(out, "DIFFERS"));
    ck_assert_ptr_nonnull(strstr(out, "must move with the servers"));
    ck_assert_ptr_nonnull(strstr(out, "the new servers need them"));
    ck_assert_ptr_null(strstr(out, "passfile")); /* nor anything of the URL but host:port/db */
    /* DATA: as it was, and migrated-to naming the target */
    char *after = tree_listing(data);
    char mt[400];
    snprintf(mt, sizeof mt, "%s/migrated-to", data);
    size_t mlen = 0;
    char *mtext = file_read_all(mt, 4096, &mlen);
    ck_assert_ptr_nonnull(mtext);
    char want[300];
    snprintf(want, sizeof want, "%s/%s\n", pg_host_port, db_name);
    ck_assert_msg(strncmp(mtext, want, strlen(want)) == 0, "migrated-to: %s", mtext);
    ck_assert_ptr_null(strstr(mtext, "pgpass"));
    free(mtext);
    {
        /* the listing after, without migrated-to's own line, is the one before */
        buf b;
        buf_init(&b, 1 << 20);
        for (const char *l = after; *l;) {
            const char *e = strchr(l, '\n');
            size_t n = e ? (size_t)(e - l + 1) : strlen(l);
            if (strncmp(l, "./migrated-to ", 14) != 0) ck_assert_int_eq(buf_append(&b, l, n), 0);
            l += n;
        }
        ck_assert_msg(strcmp(b.data ? b.data : "", before) == 0, "DATA changed:\n%s\nthen\n%s", before, b.data);
        buf_release(&b);
    }
    free(before);
    free(after);

    /* the same answers from PostgreSQL, with DATA's tokens */
    const char *pgargs[] = {"--db", db_url, NULL};
    server_on(data, pgargs);
    ty_compare_all(rec, nrec, &S, "after the move");
    for (int i = 0; i < nck; i++) {
        char sha[65];
        ty_ckpt_sha(&S, ck[i].job, ck[i].id, sha);
        ck_assert_str_eq(sha, ck[i].sha);
    }
    char *log_after = ty_task_log(srv.url, team_tok, done, "worker-0");
    ck_assert_str_eq(log_after, log_before);
    free(log_after);
    /* the sequences stand past the ids copied */
    int64_t next = ty_submit(srv.url, team_tok, "{\"name\":\"after\",\"command\":{\"argv\":[\"/bin/true\"]}}");
    ck_assert_int_eq(next, queued + 1);

    /* refused while that server holds the lease (from a copy of DATA: DATA's own lock refuses first) */
    char data2[320], cp[800];
    snprintf(data2, sizeof data2, "%s/data2", base);
    snprintf(cp, sizeof cp, "cp -a '%s' '%s'", data, data2);
    ck_assert_int_eq(system(cp), 0);
    const char *m2[] = {"migrate", "--from", data2, "--to", db_url, "--force", NULL};
    rc = run_ty(out, sizeof out, m2);
    ck_assert_msg(rc == 1 && strstr(out, "holds its lease") && strstr(out, srv.url) && lines_of(out) == 1, "%d: %s", rc,
                  out);
    rc = run_ty(out, sizeof out, margs);
    ck_assert_msg(rc == 1 && strstr(out, "a trainyard server runs on") && lines_of(out) == 1, "%d: %s", rc, out);
    ty_kill(&srv, SIGTERM);
    /* refused into a database holding rows */
    rc = run_ty(out, sizeof out, margs);
    ck_assert_msg(rc == 1 && strstr(out, "already holds trainyard rows") && strstr(out, "--force") &&
                      lines_of(out) == 1,
                  "%d: %s", rc, out);

    /* --force, and the bytes into a file:// store */
    char store[400], spec[420];
    snprintf(store, sizeof store, "%s/blobs", base);
    snprintf(spec, sizeof spec, "file://%s", store);
    const char *fargs[] = {"migrate", "--from", data, "--to", db_url, "--force", "--blob-store", spec, NULL};
    rc = run_ty(out, sizeof out, fargs);
    printf("migrate --force --blob-store:\n%s", out);
    ck_assert_msg(rc == 0, "migrate --force: %d: %s", rc, out);
    ck_assert_ptr_nonnull(strstr(out, ": every table matches"));
    ck_assert_ptr_nonnull(strstr(out, "were removed first"));
    ck_assert_ptr_nonnull(strstr(out, "blobs: 3 checkpoint and context files"));
    struct stat sb;
    for (int i = 0; i < nck; i++) {
        char obj[600];
        snprintf(obj, sizeof obj, "%s/checkpoints/%lld/%lld.safetensors", store, (long long)ck[i].job,
                 (long long)ck[i].id);
        ck_assert_msg(stat(obj, &sb) == 0, "%s is not in the store", obj);
    }
    /* a copy of DATA without the bytes: the store serves them */
    char data3[320], cmd[2000];
    snprintf(data3, sizeof data3, "%s/data3", base);
    snprintf(cmd, sizeof cmd, "cp -a '%s' '%s' && rm -rf '%s/checkpoints' '%s/contexts' '%s/server.lock'", data, data3,
             data3, data3, data3);
    ck_assert_int_eq(system(cmd), 0);
    const char *sargs[] = {"--db", db_url, "--blob-store", spec, NULL};
    server_on(data3, sargs);
    /* the same answers, the jobs' too (the new job's row went with --force) */
    ty_compare_all(rec, nrec, &S, "after the move to the store");
    for (int i = 0; i < nck; i++) {
        char sha[65];
        ty_ckpt_sha(&S, ck[i].job, ck[i].id, sha);
        ck_assert_str_eq(sha, ck[i].sha);
    }
    PGconn *c = pg_conn();
    char *n_moved = pg_text(c, "SELECT count(*) FROM checkpoints WHERE store LIKE 'file://%' AND deleted_at IS NULL");
    char *n_ctx = pg_text(c, "SELECT count(*) FROM contexts WHERE store LIKE 'file://%'");
    ck_assert_str_eq(n_moved, "2");
    ck_assert_str_eq(n_ctx, "1");
    free(n_moved);
    free(n_ctx);
    PQfinish(c);
    free(log_before);
    for (int i = 0; i < nrec; i++) cJSON_Delete(rec[i].body);
}
END_TEST

/* ---------------------------------------------------------------- values made by hand */

static sqlite3 *lite_make(const char *data) {
    ck_assert_int_eq(mkdir(data, 0700), 0);
    char path[400], err[300];
    snprintf(path, sizeof path, "%s/trainyard.db", data);
    db *d = NULL;
    ck_assert_msg(db_open(&d, path, err, sizeof err) == 0, "%s", err);
    db_close(d);
    sqlite3 *l = NULL;
    ck_assert_int_eq(sqlite3_open(path, &l), SQLITE_OK);
    ck_assert_int_eq(sqlite3_exec(l, "PRAGMA foreign_keys = ON", NULL, NULL, NULL), SQLITE_OK);
    return l;
}

static void lite_exec(sqlite3 *l, const char *sql) {
    char *e = NULL;
    ck_assert_msg(sqlite3_exec(l, sql, NULL, NULL, &e) == SQLITE_OK, "%s: %s", sql, e ? e : "");
}

/* The awkward text every text column of the case holds some of. */
static const char AWK[] = "tab\there\nnew line\r\\back\\slash \\N 'quote' \"dq\" caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac";

START_TEST(values_exact) {
    pg_database("exact");
    char data[320], out[16384];
    snprintf(data, sizeof data, "%s/data", base);
    sqlite3 *l = lite_make(data);
    lite_exec(l, "BEGIN");
    sqlite3_stmt *st = NULL;
    ck_assert_int_eq(sqlite3_prepare_v2(l,
                                        "INSERT INTO teams(id, name, created_at, weight, guarantee, quota, usage,"
                                        " usage_at) VALUES (?1, ?2, ?3, ?4, 0, ?5, ?6, 0)",
                                        -1, &st, NULL),
                     SQLITE_OK);
    const double weights[] = {0.1, 1e-300, -2.5e-7, 1.7976931348623157e308, 2.0 / 3.0};
    for (int i = 0; i < 5; i++) {
        char name[96];
        snprintf(name, sizeof name, "%s %d", AWK, i);
        sqlite3_bind_int64(st, 1, 10 + i * 7);
        sqlite3_bind_text(st, 2, name, -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(st, 3, i == 0 ? INT64_MAX : i == 1 ? INT64_MIN : i);
        sqlite3_bind_double(st, 4, weights[i]);
        if (i % 2) sqlite3_bind_null(st, 5);
        else sqlite3_bind_int64(st, 5, -(int64_t)i);
        sqlite3_bind_double(st, 6, weights[4 - i]);
        ck_assert_int_eq(sqlite3_step(st), SQLITE_DONE);
        sqlite3_reset(st);
    }
    sqlite3_finalize(st);
    unsigned char sealed[300];
    for (int i = 0; i < 300; i++) sealed[i] = (unsigned char)(i * 7 + 3);
    sealed[0] = 0;
    sealed[1] = '\\';
    sealed[2] = '\t';
    ck_assert_int_eq(sqlite3_prepare_v2(l,
                                        "INSERT INTO registry_creds(team_id, host, username, sealed, created_at)"
                                        " VALUES (10, ?1, ?1, ?2, 5)",
                                        -1, &st, NULL),
                     SQLITE_OK);
    sqlite3_bind_text(st, 1, AWK, -1, SQLITE_STATIC);
    sqlite3_bind_blob(st, 2, sealed, sizeof sealed, SQLITE_STATIC);
    ck_assert_int_eq(sqlite3_step(st), SQLITE_DONE);
    sqlite3_finalize(st);
    ck_assert_int_eq(sqlite3_prepare_v2(l,
                                        "INSERT INTO jobs(id, team_id, name, spec, state, priority, max_restarts,"
                                        " workers, devices_per_worker, device, max_runtime_s, created_at, updated_at,"
                                        " reason) VALUES (?1, 10, ?2, '{}', 'failed', 1, 0, 1, 1, 'cpu', 60, 1, 2, ?3)",
                                        -1, &st, NULL),
                     SQLITE_OK);
    for (int i = 0; i < 3; i++) {
        sqlite3_bind_int64(st, 1, 100 + 50 * i); /* ids with gaps: the sequence goes past the largest */
        sqlite3_bind_text(st, 2, AWK, -1, SQLITE_STATIC);
        if (i) sqlite3_bind_text(st, 3, "", 0, SQLITE_STATIC);
        else sqlite3_bind_null(st, 3);
        ck_assert_int_eq(sqlite3_step(st), SQLITE_DONE);
        sqlite3_reset(st);
    }
    sqlite3_finalize(st);
    lite_exec(l, "INSERT INTO metrics(job_id, seq, attempt, kind, step, epoch, ts, data) VALUES"
                 " (200, 1, 0, 'step', NULL, 3, 4, '{\"loss\": 0.30000000000000004, \"s\": \"a\\\\tb\"}')");
    lite_exec(l, "COMMIT");
    sqlite3_close(l);

    const char *margs[] = {"migrate", "--from", data, "--to", db_url, NULL};
    int rc = run_ty(out, sizeof out, margs);
    ck_assert_msg(rc == 0 && strstr(out, ": every table matches"), "migrate: %d: %s", rc, out);

    /* read back in binary: the very bytes and doubles */
    PGconn *c = pg_conn();
    const char *q = "SELECT id, name, created_at, weight, quota, usage FROM teams WHERE id >= 10 ORDER BY id";
    PGresult *r = PQexecParams(c, q, 0, NULL, NULL, NULL, NULL, 1);
    ck_assert_msg(PQresultStatus(r) == PGRES_TUPLES_OK, "%s", PQresultErrorMessage(r));
    ck_assert_int_eq(PQntuples(r), 5);
    for (int i = 0; i < 5; i++) {
        char name[96];
        snprintf(name, sizeof name, "%s %d", AWK, i);
        ck_assert_int_eq(PQgetlength(r, i, 1), (int)strlen(name));
        ck_assert(memcmp(PQgetvalue(r, i, 1), name, strlen(name)) == 0);
        uint64_t be = 0, want;
        memcpy(&be, PQgetvalue(r, i, 2), 8);
        int64_t created = (int64_t)__builtin_bswap64(be);
        ck_assert(created == (i == 0 ? INT64_MAX : i == 1 ? INT64_MIN : i));
        double w, u;
        memcpy(&be, PQgetvalue(r, i, 3), 8);
        be = __builtin_bswap64(be);
        memcpy(&w, &be, 8);
        memcpy(&want, &weights[i], 8);
        ck_assert_msg(be == want, "team %d: weight %.17g, was %.17g", i, w, weights[i]);
        memcpy(&be, PQgetvalue(r, i, 5), 8);
        be = __builtin_bswap64(be);
        memcpy(&u, &be, 8);
        memcpy(&want, &weights[4 - i], 8);
        ck_assert_msg(be == want, "team %d: usage %.17g, was %.17g", i, u, weights[4 - i]);
        ck_assert_int_eq(PQgetisnull(r, i, 4), i % 2);
    }
    PQclear(r);
    r = PQexecParams(c, "SELECT sealed, host FROM registry_creds", 0, NULL, NULL, NULL, NULL, 1);
    ck_assert_int_eq(PQntuples(r), 1);
    ck_assert_int_eq(PQgetlength(r, 0, 0), (int)sizeof sealed);
    ck_assert(memcmp(PQgetvalue(r, 0, 0), sealed, sizeof sealed) == 0);
    ck_assert_str_eq(PQgetvalue(r, 0, 1), AWK);
    PQclear(r);
    char *v = pg_text(c, "SELECT count(*) FROM jobs WHERE reason IS NULL");
    ck_assert_str_eq(v, "1");
    free(v);
    v = pg_text(c, "SELECT count(*) FROM jobs WHERE reason = ''");
    ck_assert_str_eq(v, "2");
    free(v);
    v = pg_text(c, "SELECT data FROM metrics");
    ck_assert_str_eq(v, "{\"loss\": 0.30000000000000004, \"s\": \"a\\\\tb\"}"); /* SQL keeps both backslashes */
    free(v);
    /* the next ids: past max(id) */
    v = pg_text(c, "SELECT last_value || ' ' || is_called FROM jobs_id_seq");
    ck_assert_msg(strcmp(v, "201 false") == 0 || strcmp(v, "200 true") == 0, "jobs_id_seq: %s", v);
    free(v);
    v = pg_text(c, "SELECT last_value || ' ' || is_called FROM teams_id_seq");
    ck_assert_msg(strcmp(v, "39 false") == 0 || strcmp(v, "38 true") == 0, "teams_id_seq: %s", v);
    free(v);
    PQfinish(c);
}
END_TEST

/* ---------------------------------------------------------------- blobs checked, to s3 */

static s3_dev dev;
static int s3_up;

static void setup_s3(void) {
    setup();
    char why[256];
    s3_up = 0;
    if (!s3_have(why, sizeof why)) {
        if (s3_required()) ck_abort_msg("S3_TEST_REQUIRED=1: %s", why);
        fprintf(stderr, "check_migrate: the s3 part of blobs_checked: SKIP: %s (file:// instead)\n", why);
        return;
    }
    ck_assert_msg(s3_start(&dev, "migs3", 512) == 0, "scripts/s3-dev.sh start failed (above)");
    s3_up = 1;
}

static void teardown_s3(void) {
    teardown();
    if (s3_up) s3_stop(&dev);
    s3_up = 0;
}

static void put_file(const char *data, const char *rel, const char *bytes, size_t n) {
    char path[600], dir[600];
    snprintf(path, sizeof path, "%s/%s", data, rel);
    snprintf(dir, sizeof dir, "%s", path);
    *strrchr(dir, '/') = '\0';
    ck_assert_int_eq(mkdir_p(dir, 0700), 0);
    ck_assert_int_eq(file_write_atomic(path, bytes, n, 0600), 0);
}

/* Checkpoint and context files checked against their rows before any row
 * names the store: one that differs refuses the migrate with nothing
 * written; then they go to s3 (or a file:// store without radosgw), the
 * deleted checkpoint stays where it was. */
START_TEST(blobs_checked) {
    pg_database("blobs");
    char data[320], out[16384], sha1[65], sha3[65], shac[65];
    snprintf(data, sizeof data, "%s/data", base);
    sqlite3 *l = lite_make(data);
    const char ck1[] = "checkpoint one bytes", ck3[] = "checkpoint three bytes", ctx[] = "a context tarball";
    sha256_hex(ck1, sizeof ck1 - 1, sha1);
    sha256_hex(ck3, sizeof ck3 - 1, sha3);
    sha256_hex(ctx, sizeof ctx - 1, shac);
    char sql[2000];
    snprintf(sql, sizeof sql,
             "INSERT INTO teams(id, name, created_at) VALUES (2, 'vision', 1);"
             "INSERT INTO jobs(id, team_id, name, spec, state, priority, max_restarts, workers, devices_per_worker,"
             " device, max_runtime_s, created_at, updated_at) VALUES (1, 2, 'j', '{}', 'succeeded', 1, 0, 1, 1, 'cpu',"
             " 60, 1, 2);"
             "INSERT INTO checkpoints(id, job_id, attempt, step, epoch, size, sha256, path, created_at, deleted_at)"
             " VALUES (1, 1, 0, 10, 1, %zu, '%s', '1/1.safetensors', 3, NULL),"
             " (2, 1, 0, 20, 2, 5, '%s', '1/2.safetensors', 4, 5),"
             " (3, 1, 0, 30, 3, %zu, '%s', '1/3.safetensors', 6, NULL);"
             "INSERT INTO contexts(team_id, digest, bytes, files, unpacked, created_at, used_at)"
             " VALUES (2, '%s', %zu, 1, 40, 7, 8);",
             sizeof ck1 - 1, sha1, sha1, sizeof ck3 - 1, sha3, shac, sizeof ctx - 1);
    lite_exec(l, sql);
    sqlite3_close(l);
    put_file(data, "checkpoints/1/1.safetensors", ck1, sizeof ck1 - 1);
    put_file(data, "checkpoints/1/3.safetensors", "not what its row says!", 22); /* checkpoint 2's file is gone */
    snprintf(sql, sizeof sql, "contexts/%s", shac);
    put_file(data, sql, ctx, sizeof ctx - 1);

    char spec[600], store[400];
    const char *creds = NULL;
    if (s3_up) {
        ck_assert_int_eq(s3_bucket(&dev, "migrated"), 0);
        s3_spec(&dev, "migrated", spec, sizeof spec);
        creds = dev.creds;
    } else {
        snprintf(store, sizeof store, "%s/store", base);
        snprintf(spec, sizeof spec, "file://%s", store);
    }
    const char *margs[] = {"migrate", "--from", data, "--to", db_url, "--blob-store", spec,
                           creds ? "--blob-credentials" : NULL, creds, NULL};
    int rc = run_ty(out, sizeof out, margs);
    ck_assert_msg(rc == 1 && strstr(out, "checkpoint 3: ") && strstr(out, "its row says") && lines_of(out) == 1,
                  "%d: %s", rc, out);
    PGconn *c = pg_conn();
    char *v = pg_text(c, "SELECT (SELECT count(*) FROM jobs) + (SELECT count(*) FROM checkpoints)");
    ck_assert_str_eq(v, "0");
    free(v);

    put_file(data, "checkpoints/1/3.safetensors", ck3, sizeof ck3 - 1);
    rc = run_ty(out, sizeof out, margs);
    ck_assert_msg(rc == 0 && strstr(out, "blobs: 3 checkpoint and context files"), "%d: %s", rc, out);
    printf("to %s:\n%s", s3_up ? "s3" : "file://", out);
    /* the rows name the store, but the deleted checkpoint's */
    PGresult *r = PQexec(c, "SELECT id, store FROM checkpoints ORDER BY id");
    ck_assert_int_eq(PQntuples(r), 3);
    ck_assert_msg(strncmp(PQgetvalue(r, 0, 1), s3_up ? "s3://migrated" : "file://", s3_up ? 13 : 7) == 0, "%s",
                  PQgetvalue(r, 0, 1));
    ck_assert_str_eq(PQgetvalue(r, 1, 1), "");
    ck_assert_str_eq(PQgetvalue(r, 2, 1), PQgetvalue(r, 0, 1));
    v = pg_text(c, "SELECT store FROM contexts");
    ck_assert_str_eq(v, PQgetvalue(r, 0, 1));
    free(v);
    PQclear(r);
    PQfinish(c);
    /* the objects hold the bytes */
    const char *keys[3] = {"checkpoints/1/1.safetensors", "checkpoints/1/3.safetensors", sql};
    const char *want[3] = {sha1, sha3, shac};
    for (int i = 0; i < 3; i++) {
        buf b;
        buf_init(&b, 1 << 20);
        char path[700];
        if (s3_up) {
            snprintf(path, sizeof path, "/migrated/%s", keys[i]);
            ck_assert_int_eq(s3_req(&dev, "GET", path, NULL, &b), 200);
        } else {
            snprintf(path, sizeof path, "%s/%s", store, keys[i]);
            size_t n = 0;
            char *t = file_read_all(path, 1 << 20, &n);
            ck_assert_msg(t != NULL, "%s is not in the store", path);
            ck_assert_int_eq(buf_append(&b, t, n), 0);
            free(t);
        }
        char got[65];
        sha256_hex(b.data ? b.data : "", b.len, got);
        ck_assert_msg(strcmp(got, want[i]) == 0, "%s holds other bytes", keys[i]);
        buf_release(&b);
    }
    if (s3_up) {
        char k[8][256];
        ck_assert_int_eq(s3_keys(&dev, "migrated", "checkpoints/", k, 8), 2);
    }
}
END_TEST

/* ---------------------------------------------------------------- bad input */

START_TEST(bad_input) {
    char data[320], out[4096], url[600];
    snprintf(data, sizeof data, "%s/data", base);
    sqlite3 *l = lite_make(data);
    /* a schema older than the build: refused, the file not migrated */
    lite_exec(l, "DELETE FROM schema_migrations WHERE version = (SELECT max(version) FROM schema_migrations)");
    sqlite3_close(l);
    snprintf(url, sizeof url, "postgres://trainyard@%s/trainyard", pg_host_port[0] ? pg_host_port : "127.0.0.1:5432");
    struct {
        const char *args[8];
        int rc;
        const char *says;
    } cases[] = {
        {{"migrate", "--to", url, NULL}, 2, "--from DATA is needed"},
        {{"migrate", "--from", data, NULL}, 2, "--to postgres://"},
        {{"migrate", "--from", data, "--to", "/tmp/other.db", NULL}, 2, "must be a PostgreSQL URL"},
        {{"migrate", "--from", data, "--to", "postgres://trainyard:secret@127.0.0.1:1/x", NULL}, 1, "holds a password"},
        {{"migrate", "--from", data, "--to", "postgres://trainyard@127.0.0.1:1/x", NULL}, 1, "schema version"},
        {{"migrate", "--from", "/nonexistent/dir", "--to", url, NULL}, 1, "not a data directory"},
        {{"migrate", "--from", data, "--to", url, "--bogus", NULL}, 2, "unknown or incomplete option"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = run_ty(out, sizeof out, cases[i].args);
        ck_assert_msg(rc == cases[i].rc && strstr(out, cases[i].says) && lines_of(out) == 1,
                      "case %zu: %d: %s", i, rc, out);
        ck_assert_ptr_null(strstr(out, "secret"));
    }
    /* at the newest version, an unreachable database is named */
    rm_tree(data);
    sqlite3_close(lite_make(data));
    const char *un[] = {"migrate", "--from", data, "--to", "postgres://trainyard@127.0.0.1:1/x", NULL};
    int rc = run_ty(out, sizeof out, un);
    ck_assert_msg(rc == 1 && strstr(out, "cannot reach the database at 127.0.0.1:1/x") && lines_of(out) == 1, "%d: %s",
                  rc, out);
    char path[400];
    snprintf(path, sizeof path, "%s/migrated-to", data);
    struct stat sb;
    ck_assert_int_ne(stat(path, &sb), 0);
}
END_TEST

/* ---------------------------------------------------------------- figures */

START_TEST(figures) {
    pg_database("figures");
    char data[320], out[16384];
    snprintf(data, sizeof data, "%s/data", base);
    sqlite3 *l = lite_make(data);
    lite_exec(l, "BEGIN");
    lite_exec(l, "INSERT INTO teams(id, name, created_at) VALUES (2, 'vision', 1)");
    sqlite3_stmt *job = NULL, *ev = NULL, *met = NULL;
    ck_assert_int_eq(sqlite3_prepare_v2(l,
                                        "INSERT INTO jobs(team_id, name, spec, state, priority, max_restarts, workers,"
                                        " devices_per_worker, device, max_runtime_s, created_at, updated_at,"
                                        " started_at, finished_at) VALUES (2, 'job-' || ?1, ?2, 'succeeded', 50, 3,"
                                        " 2, 1, 'cpu', 86400, ?3, ?3, ?3, ?3 + 60000)",
                                        -1, &job, NULL),
                     SQLITE_OK);
    ck_assert_int_eq(sqlite3_prepare_v2(l,
                                        "INSERT INTO job_events(job_id, ts, kind, from_state, to_state, actor, reason)"
                                        " VALUES (?1, ?2, 'state', 'queued', 'running', 'scheduler', 'placed')",
                                        -1, &ev, NULL),
                     SQLITE_OK);
    ck_assert_int_eq(sqlite3_prepare_v2(l,
                                        "INSERT INTO metrics(job_id, seq, attempt, kind, step, epoch, ts, data)"
                                        " VALUES (?1, ?2, 0, 'step', ?3, 1, ?4, ?5)",
                                        -1, &met, NULL),
                     SQLITE_OK);
    const int jobs = 3000, per = 34; /* 102,000 metric rows */
    for (int j = 1; j <= jobs; j++) {
        char spec[200], d[160];
        snprintf(spec, sizeof spec,
                 "{\"name\":\"job-%d\",\"command\":{\"argv\":[\"python3\",\"train.py\",\"--lr\",\"0.%d\"]}}", j, j);
        sqlite3_bind_int(job, 1, j);
        sqlite3_bind_text(job, 2, spec, -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(job, 3, 1700000000000LL + j * 1000LL);
        ck_assert_int_eq(sqlite3_step(job), SQLITE_DONE);
        sqlite3_reset(job);
        for (int e = 0; e < 3; e++) {
            sqlite3_bind_int(ev, 1, j);
            sqlite3_bind_int64(ev, 2, 1700000000000LL + j * 1000LL + e);
            ck_assert_int_eq(sqlite3_step(ev), SQLITE_DONE);
            sqlite3_reset(ev);
        }
        for (int s = 1; s <= per; s++) {
            snprintf(d, sizeof d, "{\"loss\": %.17g, \"lr\": 0.001, \"samples_per_sec\": %d.5}", 1.0 / (s + j), 900 + s);
            sqlite3_bind_int(met, 1, j);
            sqlite3_bind_int(met, 2, s);
            sqlite3_bind_int(met, 3, s * 10);
            sqlite3_bind_int64(met, 4, 1700000000000LL + j * 1000LL + s);
            sqlite3_bind_text(met, 5, d, -1, SQLITE_TRANSIENT);
            ck_assert_int_eq(sqlite3_step(met), SQLITE_DONE);
            sqlite3_reset(met);
        }
    }
    sqlite3_finalize(job);
    sqlite3_finalize(ev);
    sqlite3_finalize(met);
    lite_exec(l, "COMMIT");
    sqlite3_close(l);
    const char *margs[] = {"migrate", "--from", data, "--to", db_url, "--json", NULL};
    int64_t t0 = mono_ms();
    int rc = run_ty(out, sizeof out, margs);
    int64_t took = mono_ms() - t0;
    ck_assert_msg(rc == 0, "migrate: %d: %s", rc, out);
    cJSON *o = cJSON_Parse(out);
    ck_assert_msg(o != NULL, "not JSON: %s", out);
    ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(o, "ok")));
    ck_assert_int_eq((int64_t)ty_num(o, "rows"), 1 + jobs + 3 * jobs + (int64_t)jobs * per);
    printf("figures: %lld rows (%d jobs, %d metric rows, %d events) copied in %.2f s (%.0f rows/s), checked in "
           "%.2f s; the command took %.2f s\n",
           (long long)ty_num(o, "rows"), jobs, jobs * per, 3 * jobs, ty_num(o, "copy_s"), ty_num(o, "rows_per_s"),
           ty_num(o, "check_s"), took / 1000.0);
    cJSON_Delete(o);
}
END_TEST

int main(void) {
    if (!pg_have()) {
        const char *req = getenv("PG_TEST_REQUIRED");
        if (req && strcmp(req, "1") == 0) {
            fprintf(stderr, "check_migrate: FAIL: PostgreSQL 15 is required (PG_TEST_REQUIRED=1) but %s is absent\n",
                    PG_BIN);
            return 1;
        }
        printf("check_migrate: SKIP: %s is absent (Debian's postgresql-15; scripts/deps.sh)\n", PG_BIN);
        return 0;
    }
    if (pg_start() < 0) {
        fprintf(stderr, "check_migrate: scripts/pg-dev.sh start failed (see %s/log)\n", pg_dir);
        pg_stop();
        return 1;
    }
    Suite *s = suite_create("migrate");
    TCase *tc = ty_tcase(s, "cluster_moves", setup, teardown, 180);
    tcase_add_test(tc, cluster_moves);
    tc = ty_tcase(s, "values_exact", setup, teardown, 60);
    tcase_add_test(tc, values_exact);
    tc = ty_tcase(s, "blobs_checked", setup_s3, teardown_s3, 120);
    tcase_add_test(tc, blobs_checked);
    tc = ty_tcase(s, "bad_input", setup, teardown, 60);
    tcase_add_test(tc, bad_input);
    tc = ty_tcase(s, "figures", setup, teardown, 120);
    tcase_add_test(tc, figures);
    int rc = ty_run_suite(s);
    pg_stop();
    return rc;
}
