/* check_interactive.c - interactive jobs (spec "interactive", docs/jobspec.md,
 * "Interactive jobs"; docs/scheduler.md: max_interactive, culling).
 *
 * jupyter: `trainyard up --cpu-slots 2` with Debian's jupyter-notebook: a
 * notebook job used through the proxy with the caller's token only
 * (tests/notebook_client.py, /usr/bin/python3 and python3-websocket: the
 * contents listed, a kernel started, print(6*7) executed over its channels
 * WebSocket and 42 read back), Jupyter's own token in its environment being
 * the one derived from the task's token hash (and not on its command line),
 * Jupyter refusing a request without it; an idle notebook (idle_timeout
 * "3s") cancelled with reason "idle for 3s" and an event, its slots taken
 * by another job; requests through the proxy keeping one alive.
 *
 * stand-in: the same, with tests/fake_jupyter first on the agent's PATH
 * (the echo app of tests/proxy_upstream.py in Jupyter's place): what
 * reaches "Jupyter" carries `Authorization: token SECRET` and none of the
 * caller's credentials; its command line is the documented one.
 *
 * activity: api/activity.c on a real SQLite file: the server's start counts
 * as activity, an attached shell keeps a job alive, its detach starts the
 * idle time again, then the job is cancelled "idle for 1s" with an event.
 *
 * shells and limits: a shell job runs nothing but a sleep and holds its
 * slot until cancelled (in an image: its container sleeps, and is removed
 * with the job; SKIP without root, podman or the test image); max_interactive 1 (PATCH /teams) holds a second
 * interactive job queued with the reason and lets other jobs by; bad
 * input is a 422 naming the field. */
#include "testlib.h"

#include <sqlite3.h>

#include "../api/activity.h"
#include "../server/server.h"
#include "../spec/jobspec.h"
#include "../storage/db.h"
#include "../storage/store.h"

static ty_proc srv;
static char team_tok[128], admin_tok[128];
static char saved_path[4096];

static void up_start(void) {
    const char *extra[] = {"--cpu-slots", "2", NULL};
    ty_server_start_args(&srv, "up", extra);
    ty_token(&srv, "token", team_tok, sizeof team_tok);
    ty_token(&srv, "admin.token", admin_tok, sizeof admin_tok);
}

static void up_setup(void) {
    memset(&srv, 0, sizeof srv);
    ty_mkdtemp(srv.dir, sizeof srv.dir, "interactive");
    up_start();
}

/* The agent (and so the worker) finds tests/fake_jupyter/jupyter-notebook
 * before Debian's. */
static void standin_setup(void) {
    memset(&srv, 0, sizeof srv);
    ty_mkdtemp(srv.dir, sizeof srv.dir, "interactive-standin");
    const char *path = getenv("PATH");
    snprintf(saved_path, sizeof saved_path, "%s", path ? path : "/usr/bin:/bin");
    char cwd[1024], np[4096 + 1100];
    ck_assert_ptr_nonnull(getcwd(cwd, sizeof cwd));
    snprintf(np, sizeof np, "%s/tests/fake_jupyter:%s", cwd, saved_path);
    setenv("PATH", np, 1);
    up_start();
    setenv("PATH", saved_path, 1);
}

static void up_teardown(void) {
    ty_kill(&srv, SIGTERM);
    if (getenv("TY_KEEP")) fprintf(stderr, "check_interactive: kept %s\n", srv.dir);
    else ty_rmrf(srv.dir);
}

/* ---------------------------------------------------------------- helpers */

static cJSON *job_get(int64_t id) { return ty_job_get(srv.url, team_tok, id); }

/* Waits until the job is in state want: the job (the caller deletes).
 * Fails the test after timeout_ms. */
static cJSON *wait_state(int64_t id, const char *want, int timeout_ms) {
    int64_t end = mono_ms() + timeout_ms;
    for (;;) {
        cJSON *j = job_get(id);
        const char *st = ty_str(j, "state");
        if (strcmp(st, want) == 0) return j;
        if (mono_ms() > end) {
            char *t = cJSON_PrintUnformatted(j);
            ck_abort_msg("job %lld is not %s within %d ms: %.1500s", (long long)id, want, timeout_ms, t);
        }
        cJSON_Delete(j);
        ty_sleep_ms(100);
    }
}

/* The port "notebook" of a running job, once its task reported it. */
static int wait_port(int64_t id, const char *name) {
    int64_t end = mono_ms() + 60000;
    while (mono_ms() < end) {
        cJSON *j = job_get(id);
        const cJSON *p;
        int port = 0;
        cJSON_ArrayForEach(p, cJSON_GetObjectItem(j, "ports")) {
            if (strcmp(ty_str(p, "name"), name) == 0 && ty_num(p, "port") > 0) port = (int)ty_num(p, "port");
        }
        const char *st = ty_str(j, "state");
        ck_assert_msg(strcmp(st, "failed") != 0 && strcmp(st, "cancelled") != 0, "job %lld is %s", (long long)id, st);
        cJSON_Delete(j);
        if (port) return port;
        ty_sleep_ms(100);
    }
    ck_abort_msg("job %lld reported no port %s within 60 s", (long long)id, name);
    return 0;
}

/* GET path through the server with the team's token until it answers 200
 * (Jupyter takes a few seconds to listen): the body (the caller frees). */
static char *get_until_200(const char *path, int timeout_ms) {
    int64_t end = mono_ms() + timeout_ms;
    long last = 0;
    while (mono_ms() < end) {
        client c;
        ck_assert_int_eq(client_init(&c, srv.url, team_tok), 0);
        client_reply r;
        int rc = client_request(&c, "GET", path, NULL, 0, NULL, &r);
        client_release(&c);
        last = rc == 0 ? r.status : -1;
        if (rc == 0 && r.status == 200) {
            char *s = buf_detach(&r.body, NULL);
            client_reply_release(&r);
            return s ? s : xstrdup("");
        }
        client_reply_release(&r);
        ty_sleep_ms(200);
    }
    ck_abort_msg("GET %s: no 200 within %d ms (last %ld)", path, timeout_ms, last);
    return NULL;
}

/* The hex SHA-256 of the newest task token of the job, from the server's
 * database (tasks.token_hash; on PostgreSQL through libpq). */
static void task_token_hash(int64_t job, char out[65]) {
    if (ty_pg_url()) { /* the server's PostgreSQL database */
        char u[512], arg[24];
        ty_pg_data_db(srv.dir, u, sizeof u);
        snprintf(arg, sizeof arg, "%lld", (long long)job);
        const char *params[1] = {arg};
        PGresult *r = ty_pg_row(u, "SELECT token_hash FROM tasks WHERE job_id = $1 ORDER BY id DESC LIMIT 1", 1, params);
        ck_assert_int_eq(PQgetlength(r, 0, 0), 64);
        snprintf(out, 65, "%s", PQgetvalue(r, 0, 0));
        PQclear(r);
        return;
    }
    char path[600];
    snprintf(path, sizeof path, "%s/trainyard.db", srv.dir);
    sqlite3 *d = NULL;
    ck_assert_int_eq(sqlite3_open_v2(path, &d, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_busy_timeout(d, 5000);
    sqlite3_stmt *st = NULL;
    ck_assert_int_eq(sqlite3_prepare_v2(d, "SELECT token_hash FROM tasks WHERE job_id = ?1 ORDER BY id DESC LIMIT 1",
                                        -1, &st, NULL),
                     SQLITE_OK);
    sqlite3_bind_int64(st, 1, job);
    ck_assert_int_eq(sqlite3_step(st), SQLITE_ROW);
    const char *h = (const char *)sqlite3_column_text(st, 0);
    ck_assert_ptr_nonnull(h);
    ck_assert_int_eq(strlen(h), 64);
    snprintf(out, 65, "%s", h);
    sqlite3_finalize(st);
    sqlite3_close(d);
}

/* Runs a shell command line; its output (the caller frees) and *rc. */
static char *run_cmd(const char *cmd, int *rc) {
    FILE *f = popen(cmd, "r");
    ck_assert_ptr_nonnull(f);
    buf b;
    buf_init(&b, 1 << 20);
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) ck_assert_int_eq(buf_append(&b, chunk, n), 0);
    int st = pclose(f);
    *rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
    char *s = buf_detach(&b, NULL);
    return s ? s : xstrdup("");
}

static void cancel(int64_t id) {
    char path[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/cancel", (long long)id);
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", path, NULL, &o), 200);
    cJSON_Delete(o);
}

static void expect_422(const char *token, const char *method, const char *path, const char *body, const char *code,
                       const char *field) {
    cJSON *o = NULL;
    long st = ty_http(srv.url, token, method, path, body, &o);
    char *txt = cJSON_PrintUnformatted(o);
    ck_assert_msg(st == 422, "%s %s %s answered %ld: %s", method, path, body, st, txt);
    free(txt);
    ty_assert_error(o, code, field);
    cJSON_Delete(o);
}

/* The job's timeline holds a state change to `to` with reason `why`. */
static int has_event(int64_t id, const char *to, const char *why) {
    char path[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/events", (long long)id);
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", path, NULL, &o), 200);
    int found = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(o, "events")) {
        if (strcmp(ty_str(e, "to"), to) == 0 && strcmp(ty_str(e, "reason"), why) == 0) found = 1;
    }
    cJSON_Delete(o);
    return found;
}

/* ---------------------------------------------------------------- jupyter */

/* `trainyard submit notebook.json --context DIR`: the team's folder goes
 * with a notebook as with a command job (interactive.context); the job's
 * id, its folder in dir (the caller removes it). */
static int64_t submit_notebook_with_context(char dir[256]) {
    char file[400], spec[400];
    ty_mkdtemp_shared(dir, 256, "nbctx");
    snprintf(file, sizeof file, "%s/hello-from-context.txt", dir);
    ck_assert_int_eq(file_write_atomic(file, "hi\n", 3, 0644), 0);
    snprintf(spec, sizeof spec, "%s.json", dir);
    static const char nb[] = "{\"name\":\"nb\",\"interactive\":{\"type\":\"notebook\"},\"max_restarts\":0}";
    ck_assert_int_eq(file_write_atomic(spec, nb, sizeof nb - 1, 0644), 0);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "TRAINYARD_URL=%s TRAINYARD_TOKEN=%s %s submit %s --context %s --json 2>&1", srv.url,
             team_tok, getenv("TRAINYARD_BIN"), spec, dir);
    int rc = 0;
    char *out = run_cmd(cmd, &rc);
    unlink(spec);
    ck_assert_msg(rc == 0, "submit --context exited %d: %s", rc, out);
    const char *js = out[0] == '{' ? out : strstr(out, "\n{"); /* after the CLI's line about the upload */
    cJSON *o = js ? cJSON_Parse(js) : NULL;
    ck_assert_msg(o != NULL, "%s", out);
    int64_t id = (int64_t)ty_num(o, "id");
    cJSON_Delete(o);
    free(out);
    cJSON *job = job_get(id);
    const cJSON *in = cJSON_GetObjectItem(cJSON_GetObjectItem(job, "spec"), "interactive");
    char *jt = cJSON_PrintUnformatted(job);
    ck_assert_msg(in && strncmp(ty_str(in, "context"), "sha256:", 7) == 0, "%s", jt);
    free(jt);
    cJSON_Delete(job);
    return id;
}

/* A notebook through the proxy, as a browser uses it: the caller's own
 * token only; Jupyter's is the one derived from the task's; it opens in
 * its context (submitted by the CLI with --context). */
START_TEST(notebook_through_the_proxy) {
    char ctxdir[256];
    int64_t id = submit_notebook_with_context(ctxdir);
    wait_port(id, "notebook");
    char path[128];
    snprintf(path, sizeof path, "/proxy/jobs/%lld/notebook/api/status", (long long)id);
    free(get_until_200(path, 60000));

    char cmd[1024];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/notebook_client.py %s %s %lld 2>&1", srv.url, team_tok,
             (long long)id);
    int rc = 0;
    char *out = run_cmd(cmd, &rc);
    ck_assert_msg(rc == 0, "notebook_client.py exited %d:\n%s", rc, out);
    ck_assert_msg(strstr(out, "stdout: 42\n") && strstr(out, "status: ok\n"), "%s", out);
    free(out);
    /* it opened in the task's copy of its context: the kernel's working directory */
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 tests/notebook_client.py %s %s %lld 'import os; print(sorted(os.listdir(\".\")))' 2>&1",
             srv.url, team_tok, (long long)id);
    out = run_cmd(cmd, &rc);
    ck_assert_msg(rc == 0 && strstr(out, "hello-from-context.txt"), "notebook_client.py exited %d:\n%s", rc, out);
    free(out);
    ty_rmrf(ctxdir);

    /* the kernel (a child of Jupyter) sees Jupyter's token: the secret of
     * the task's token hash; it is not on Jupyter's command line */
    char hash[65], secret[65];
    task_token_hash(id, hash);
    jobspec_notebook_secret(hash, secret);
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 tests/notebook_client.py %s %s %lld "
             "'import os; print(os.environ.get(\"JUPYTER_TOKEN\"), open(\"/proc/%%d/cmdline\" %% os.getppid()).read().count(os.environ.get(\"JUPYTER_TOKEN\", \"-\")))' 2>&1",
             srv.url, team_tok, (long long)id);
    out = run_cmd(cmd, &rc);
    ck_assert_msg(rc == 0, "notebook_client.py exited %d:\n%s", rc, out);
    char want[128];
    snprintf(want, sizeof want, "stdout: %s 0\n", secret);
    ck_assert_msg(strstr(out, want) != NULL, "want \"%s\" in:\n%s", want, out);
    free(out);

    /* Jupyter itself refuses a request without its token */
    cJSON *job = job_get(id);
    int port = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, cJSON_GetObjectItem(job, "ports")) if (ty_num(p, "port") > 0) port = (int)ty_num(p, "port");
    cJSON_Delete(job);
    char direct[64];
    snprintf(direct, sizeof direct, "http://127.0.0.1:%d", port);
    client c;
    ck_assert_int_eq(client_init(&c, direct, NULL), 0);
    client_reply r;
    snprintf(path, sizeof path, "/proxy/jobs/%lld/notebook/api/contents", (long long)id);
    ck_assert_int_eq(client_request(&c, "GET", path, NULL, 0, NULL, &r), 0);
    ck_assert_int_eq(r.status, 403);
    client_reply_release(&r);
    client_release(&c);
    /* nor does the proxy let in a caller without trainyard's */
    ck_assert_int_eq(ty_http(srv.url, NULL, "GET", path, NULL, NULL), 401);

    cancel(id);
    cJSON *done = wait_state(id, "cancelled", 30000);
    cJSON_Delete(done);
}
END_TEST


/* idle_timeout "3s": cancelled with the reason and an event, its slots
 * freed (a job of both slots runs); requests through the proxy keep one
 * alive. */
START_TEST(idle_notebook_is_cancelled) {
    int64_t idle = ty_submit(srv.url, team_tok,
                             "{\"name\":\"idle\",\"interactive\":{\"type\":\"notebook\"},\"idle_timeout\":\"3s\","
                             "\"max_restarts\":0}");
    int64_t t0 = mono_ms();
    cJSON *j = wait_state(idle, "cancelled", 60000);
    ck_assert_str_eq(ty_str(j, "reason"), "idle for 3s");
    cJSON_Delete(j);
    ck_assert_msg(mono_ms() - t0 >= 3000, "cancelled after %lld ms", (long long)(mono_ms() - t0));
    ck_assert(has_event(idle, "cancelled", "idle for 3s"));
    /* its slot is free: a job of both slots runs to its end */
    int64_t both = ty_submit(srv.url, team_tok,
                             "{\"name\":\"both\",\"command\":{\"argv\":[\"true\"]},"
                             "\"strategy\":{\"type\":\"mirrored\"},\"resources\":{\"devices_per_worker\":2},\"max_restarts\":0}");
    j = wait_state(both, "succeeded", 60000);
    cJSON_Delete(j);

    /* kept alive by requests, one a second, for three times its timeout */
    int64_t busy = ty_submit(srv.url, team_tok,
                             "{\"name\":\"busy\",\"interactive\":{\"type\":\"notebook\"},\"idle_timeout\":4,"
                             "\"max_restarts\":0}");
    wait_port(busy, "notebook");
    char path[128];
    snprintf(path, sizeof path, "/proxy/jobs/%lld/notebook/api/status", (long long)busy);
    free(get_until_200(path, 60000));
    for (int64_t end = mono_ms() + 12000; mono_ms() < end; ty_sleep_ms(1000)) {
        free(get_until_200(path, 5000));
        j = job_get(busy);
        ck_assert_str_eq(ty_str(j, "state"), "running");
        cJSON_Delete(j);
    }
    /* then left alone: cancelled */
    j = wait_state(busy, "cancelled", 30000);
    ck_assert_str_eq(ty_str(j, "reason"), "idle for 4s");
    cJSON_Delete(j);
}
END_TEST

/* ---------------------------------------------------------------- stand-in */

START_TEST(what_reaches_jupyter) {
    int64_t id = ty_submit(srv.url, team_tok, "{\"name\":\"nb\",\"interactive\":{\"type\":\"notebook\"},\"max_restarts\":0}");
    wait_port(id, "notebook");
    char path[128];
    snprintf(path, sizeof path, "/proxy/jobs/%lld/notebook/argv", (long long)id);
    char *text = get_until_200(path, 60000);
    cJSON *o = cJSON_Parse(text);
    ck_assert_msg(o != NULL, "%s", text);
    char hash[65], secret[65];
    task_token_hash(id, hash);
    jobspec_notebook_secret(hash, secret);
    ck_assert_str_eq(ty_str(o, "jupyter_token"), secret);
    char *argv = cJSON_PrintUnformatted(cJSON_GetObjectItem(o, "argv"));
    char want[160];
    snprintf(want, sizeof want, "\"--NotebookApp.base_url=/proxy/jobs/%lld/notebook/\"", (long long)id);
    ck_assert_msg(strstr(argv, want) != NULL, "%s", argv);
    ck_assert_msg(strstr(argv, "\"--ip=0.0.0.0\"") && strstr(argv, "\"--no-browser\"") &&
                      strstr(argv, "\"--NotebookApp.allow_remote_access=True\"") && strstr(argv, "\"--notebook-dir=/"),
                  "%s", argv);
    ck_assert_msg(strstr(argv, secret) == NULL, "the token is on the command line: %s", argv);
    free(argv);
    cJSON_Delete(o);
    free(text);

    /* the request that reaches it: Jupyter's token, none of the caller's
     * credentials (a token of its own in Authorization included) */
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "curl -sS -H 'Authorization: Bearer %s' -H 'Cookie: trainyard_session=abc; other=1' "
             "%s/proxy/jobs/%lld/notebook/api/echo",
             team_tok, srv.url, (long long)id);
    int rc = 0;
    char *body = run_cmd(cmd, &rc);
    ck_assert_msg(rc == 0, "curl exited %d: %s", rc, body);
    cJSON *e = cJSON_Parse(body);
    ck_assert_msg(e != NULL, "%s", body);
    free(body);
    char *lines = cJSON_PrintUnformatted(cJSON_GetObjectItem(e, "lines"));
    snprintf(want, sizeof want, "\"Authorization: token %s\"", secret);
    ck_assert_msg(strstr(lines, want) != NULL, "no %s in %s", want, lines);
    ck_assert_msg(strstr(lines, team_tok) == NULL, "the caller's token reached Jupyter: %s", lines);
    ck_assert_msg(strstr(lines, "Bearer") == NULL && strstr(lines, "trainyard_session") == NULL, "%s", lines);
    free(lines);
    cJSON_Delete(e);
    cancel(id);
}
END_TEST

/* ---------------------------------------------------------------- activity */

static char g_dir[256];

static void db_setup(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/ty_activity_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(g_dir));
}

static void db_teardown(void) { ty_rmrf(g_dir); }

static void sql(db *d, const char *q) {
    char *err = NULL;
    ck_assert_msg(sqlite3_exec(db_sqlite(d), q, NULL, NULL, &err) == SQLITE_OK, "%s: %s", q, err ? err : "?");
    sqlite3_free(err);
}

static const char *job_state(db *d, int64_t id) {
    static char st[16];
    ck_assert_int_eq(store_job_state(d, id, st, NULL), STORE_OK);
    return st;
}

/* A shell attached keeps the job; the later of its start, its last
 * activity and the server's start counts. */
START_TEST(attached_shell_and_restart_count) {
    char path[300], err[256];
    snprintf(path, sizeof path, "%s/t.db", g_dir);
    server s;
    memset(&s, 0, sizeof s);
    ck_assert_msg(db_open(&s.db, path, err, sizeof err) == 0, "%s", err);
    int64_t team = 0, id = 0, other = 0;
    ck_assert_int_eq(store_team_create(s.db, "t", &team), STORE_OK);
    static const char spec[] = "{\"interactive\":{\"type\":\"shell\"},\"idle_timeout\":1}";
    store_new_job row = {.name = "sh", .priority = 50, .workers = 1, .devices_per_worker = 1, .device = "cpu",
                         .max_runtime_s = 600};
    ck_assert_int_eq(store_job_insert(s.db, team, spec, strlen(spec), &row, "team:t", &id), STORE_OK);
    ck_assert_int_eq(store_job_insert(s.db, team, spec, strlen(spec), &row, "team:t", &other), STORE_OK);
    char q[200];
    /* running for a minute already, with a timeout of one second */
    snprintf(q, sizeof q, "UPDATE jobs SET state = 'running', started_at = %lld", (long long)(now_ms() - 60000));
    sql(s.db, q);

    api_activity_tick(&s); /* the server's start: activity for every job */
    ck_assert_str_eq(job_state(s.db, id), "running");
    activity_attach(&s, id, +1);
    ty_sleep_ms(1300);
    api_activity_tick(&s);
    ck_assert_str_eq(job_state(s.db, id), "running");       /* a shell is attached */
    ck_assert_str_eq(job_state(s.db, other), "cancelled");  /* nothing kept this one */
    activity_attach(&s, id, -1);
    activity_attach(&s, id, -1);                            /* never below 0 */
    api_activity_tick(&s);
    ck_assert_str_eq(job_state(s.db, id), "running");       /* the detach was activity */
    ty_sleep_ms(1300);
    api_activity_tick(&s);
    ck_assert_str_eq(job_state(s.db, id), "cancelled");
    cJSON *ev = NULL;
    ck_assert_int_eq(store_job_events(s.db, id, 0, 100, &ev), STORE_OK);
    const cJSON *last = cJSON_GetArrayItem(ev, cJSON_GetArraySize(ev) - 1);
    ck_assert_str_eq(ty_str(last, "to"), "cancelled");
    ck_assert_str_eq(ty_str(last, "reason"), "idle for 1s");
    ck_assert_str_eq(ty_str(last, "actor"), "server");
    cJSON_Delete(ev);
    char txt[32];
    jobspec_idle_text(1800, txt);
    ck_assert_str_eq(txt, "30m");
    jobspec_idle_text(90, txt);
    ck_assert_str_eq(txt, "90s");
    jobspec_idle_text(7200, txt);
    ck_assert_str_eq(txt, "2h");
    jobspec_idle_text(172800, txt);
    ck_assert_str_eq(txt, "2d");
    db_close(s.db);
}
END_TEST

/* ---------------------------------------------------------------- shells and limits */

START_TEST(shell_holds_its_slot) {
    int64_t sh = ty_submit(srv.url, team_tok, "{\"name\":\"sh\",\"interactive\":{\"type\":\"shell\"},\"idle_timeout\":0}");
    cJSON *j = wait_state(sh, "running", 60000);
    cJSON_Delete(j);
    /* a job of both slots waits while the shell holds one */
    int64_t both = ty_submit(srv.url, team_tok,
                             "{\"name\":\"both\",\"command\":{\"argv\":[\"true\"]},"
                             "\"strategy\":{\"type\":\"mirrored\"},\"resources\":{\"devices_per_worker\":2},\"max_restarts\":0}");
    ty_sleep_ms(3000);
    j = job_get(both);
    ck_assert_str_eq(ty_str(j, "state"), "queued");
    cJSON_Delete(j);
    j = job_get(sh);
    ck_assert_str_eq(ty_str(j, "state"), "running");
    cJSON_Delete(j);
    char *log = NULL;
    for (int64_t end = mono_ms() + 30000;; ty_sleep_ms(200)) { /* logs are shipped a little later */
        free(log);
        log = ty_task_log(srv.url, team_tok, sh, "worker-0");
        if ((strstr(log, "interactive shell") && strstr(log, "started /usr/bin/sleep")) || mono_ms() > end) break;
    }
    ck_assert_msg(strstr(log, "interactive shell") && strstr(log, "started /usr/bin/sleep"), "%.2000s", log);
    free(log);
    cancel(sh);
    j = wait_state(sh, "cancelled", 30000);
    cJSON_Delete(j);
    j = wait_state(both, "succeeded", 60000);
    cJSON_Delete(j);
}
END_TEST

/* In an image, a shell job's container runs the long sleep until the job
 * is cancelled, and goes with it. Needs root, podman and the test image
 * tests/check_image.c builds (else SKIP). */
#define IMAGE_LOCAL "localhost/trainyard-test:bookworm-py3"

START_TEST(shell_in_an_image) {
    int rc = 0;
    char *out = run_cmd("podman image exists " IMAGE_LOCAL " 2>&1", &rc);
    free(out);
    if (geteuid() != 0 || rc != 0) {
        fprintf(stderr, "check_interactive: SKIP shell_in_an_image: %s\n",
                geteuid() != 0 ? "not root: podman runs containers as root here"
                               : "no image " IMAGE_LOCAL " (tests/image/build.sh makes it)");
        return;
    }
    int64_t sh = ty_submit(srv.url, team_tok,
                           "{\"name\":\"sh\",\"interactive\":{\"type\":\"shell\"},\"idle_timeout\":0,"
                           "\"environment\":{\"image\":\"" IMAGE_LOCAL "\"},\"max_restarts\":0}");
    cJSON *j = wait_state(sh, "running", 120000);
    cJSON_Delete(j);
    char cmd[256];
    snprintf(cmd, sizeof cmd,
             "podman ps --filter label=trainyard.job=%lld --filter label=trainyard.task=worker-0 "
             "--format '{{.Command}}' 2>&1",
             (long long)sh);
    int64_t end = mono_ms() + 60000;
    for (;;) { /* the job's id may be another test's too: the agent's label tells */
        out = run_cmd(cmd, &rc);
        if (strstr(out, "sleep 2147483647")) break;
        ck_assert_msg(mono_ms() < end, "no container of job %lld sleeping: %s", (long long)sh, out);
        free(out);
        ty_sleep_ms(200);
    }
    free(out);
    char *log = NULL;
    for (end = mono_ms() + 30000;; ty_sleep_ms(200)) { /* the log comes a little later */
        free(log);
        log = ty_task_log(srv.url, team_tok, sh, "worker-0");
        if (strstr(log, "started sleep in image " IMAGE_LOCAL " as container trainyard-") || mono_ms() > end) break;
    }
    ck_assert_msg(strstr(log, "started sleep in image " IMAGE_LOCAL " as container trainyard-"), "%.2000s", log);
    char name[128] = "";
    const char *at = strstr(log, "as container ");
    ck_assert_int_eq(sscanf(at + 13, "%127s", name), 1);
    free(log);
    cancel(sh);
    j = wait_state(sh, "cancelled", 60000);
    cJSON_Delete(j);
    snprintf(cmd, sizeof cmd, "podman container exists %s", name);
    end = mono_ms() + 30000;
    for (;;) {
        free(run_cmd(cmd, &rc));
        if (rc != 0) break;
        ck_assert_msg(mono_ms() < end, "container %s is still there after the cancel", name);
        ty_sleep_ms(200);
    }
}
END_TEST

START_TEST(max_interactive_and_bad_input) {
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "PATCH", "/api/v1/teams/default", "{\"max_interactive\":1}", &o), 200);
    ck_assert_int_eq((int)ty_num(o, "max_interactive"), 1);
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "GET", "/api/v1/teams", NULL, &o), 200);
    ck_assert_int_eq((int)ty_num(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "teams"), 0), "max_interactive"), 1);
    cJSON_Delete(o);

    int64_t a = ty_submit(srv.url, team_tok, "{\"name\":\"a\",\"interactive\":{\"type\":\"shell\"}}");
    cJSON *j = wait_state(a, "running", 60000);
    cJSON_Delete(j);
    int64_t b = ty_submit(srv.url, team_tok, "{\"name\":\"b\",\"interactive\":{\"type\":\"shell\"}}");
    int64_t end = mono_ms() + 20000;
    for (;;) {
        j = job_get(b);
        if (strcmp(ty_str(j, "reason"), "the team's 1 interactive job is running (max_interactive 1)") == 0) break;
        ck_assert_msg(mono_ms() < end, "job %lld: %s, %s", (long long)b, ty_str(j, "state"), ty_str(j, "reason"));
        cJSON_Delete(j);
        ty_sleep_ms(100);
    }
    ck_assert_str_eq(ty_str(j, "state"), "queued");
    cJSON_Delete(j);
    /* a job that is not interactive takes the free slot */
    int64_t cmd = ty_submit(srv.url, team_tok, "{\"name\":\"c\",\"command\":{\"argv\":[\"true\"]},\"max_restarts\":0}");
    j = wait_state(cmd, "succeeded", 60000);
    cJSON_Delete(j);
    j = job_get(b);
    ck_assert_str_eq(ty_str(j, "state"), "queued");
    cJSON_Delete(j);
    /* the first ends: the second runs */
    cancel(a);
    j = wait_state(b, "running", 60000);
    cJSON_Delete(j);
    cancel(b);
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "PATCH", "/api/v1/teams/default", "{\"max_interactive\":null}", &o),
                     200);
    ck_assert(cJSON_IsNull(cJSON_GetObjectItem(o, "max_interactive")));
    cJSON_Delete(o);

    /* bad input: 422 naming the field, nothing changed */
    expect_422(admin_tok, "PATCH", "/api/v1/teams/default", "{\"max_interactive\":-1}", "invalid_value",
               "max_interactive");
    expect_422(admin_tok, "PATCH", "/api/v1/teams/default", "{\"max_interactive\":\"2\"}", "invalid_type",
               "max_interactive");
    expect_422(admin_tok, "PATCH", "/api/v1/teams/default", "{\"max_interactive\":1.5}", "invalid_type",
               "max_interactive");
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "GET", "/api/v1/teams", NULL, &o), 200);
    ck_assert(cJSON_IsNull(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "teams"), 0), "max_interactive")));
    cJSON_Delete(o);
    expect_422(team_tok, "POST", "/api/v1/jobs", "{\"interactive\":{\"type\":\"shell\"},\"idle_timeout\":-1}",
               "invalid_value", "idle_timeout");
    expect_422(team_tok, "POST", "/api/v1/jobs", "{\"interactive\":{\"type\":\"x\"}}", "invalid_value",
               "interactive.type");
    expect_422(team_tok, "POST", "/api/v1/jobs", "{\"interactive\":{\"type\":\"shell\"},\"idle_timeout\":\"soon\"}",
               "invalid_value", "idle_timeout");
    expect_422(team_tok, "POST", "/api/v1/jobs", "{\"command\":{\"argv\":[\"x\"]},\"idle_timeout\":60}",
               "invalid_value", "idle_timeout");
    /* a context the team does not hold, named where the spec names it */
    expect_422(team_tok, "POST", "/api/v1/jobs",
               "{\"interactive\":{\"type\":\"notebook\",\"context\":\"sha256:"
               "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\"}}",
               "invalid_value", "interactive.context");
}
END_TEST

int main(void) {
    Suite *s = suite_create("interactive");
    TCase *act = ty_tcase(s, "activity", db_setup, db_teardown, 30);
    tcase_add_test(act, attached_shell_and_restart_count);
    TCase *nb = ty_tcase(s, "jupyter", up_setup, up_teardown, 240);
    tcase_add_test(nb, notebook_through_the_proxy);
    tcase_add_test(nb, idle_notebook_is_cancelled);
    TCase *si = ty_tcase(s, "standin", standin_setup, up_teardown, 120);
    tcase_add_test(si, what_reaches_jupyter);
    TCase *sh = ty_tcase(s, "shells", up_setup, up_teardown, 180);
    tcase_add_test(sh, shell_holds_its_slot);
    tcase_add_test(sh, shell_in_an_image);
    tcase_add_test(sh, max_interactive_and_bad_input);
    return ty_run_suite(s);
}
