/* check_retention.c - what finished jobs leave on the server's disk, on
 * `trainyard up --cpu-slots 2` with short command jobs (python3 scripts
 * that print, report metrics and upload checkpoints with their task
 * token): DELETE /jobs/{id} of a running job is a 409 that changes nothing,
 * of a finished one removes its log files, checkpoint files and metrics
 * (on disk and in the API) and keeps its row and tasks, another team's is
 * a 404; the log retention (--log-retention-days 5s) removes the logs of a
 * job finished before it (410 logs_purged after) and not those of a
 * running job or one finished since; a finished job keeps its newest
 * checkpoint and the best by checkpoint.best (a middle one) and nothing
 * else; a server killed (SIGKILL) right after a DELETE answers, or
 * between its commit and the removal of the files, comes back with the
 * files gone and nothing of the job listed. */
#include "testlib.h"

#include <limits.h>
#include <sqlite3.h>

static ty_proc srv;
static char team_tok[128], admin_tok[128];
static char tmpdir[256], script[400];

/* Prints a line, reports epoch metrics (val_loss from argv[1], "-": none)
 * and uploads one checkpoint after each, then waits for the file argv[2]
 * ("-": does not wait) so the test can look while it runs. */
static const char PY[] =
    "import hashlib, json, os, sys, time, urllib.request\n"
    "cfg = json.loads(os.environ['TRAINYARD_CONFIG'])\n"
    "vals = [] if sys.argv[1] == '-' else [float(v) for v in sys.argv[1].split(',')]\n"
    "base = f\"{cfg['api']}/api/v1/jobs/{cfg['job']}\"\n"
    "print('job output line', flush=True)\n"
    "for i, v in enumerate(vals):\n"
    "    step, epoch = 10 * (i + 1), i + 1\n"
    "    print('trainyard-metric ' + json.dumps({'kind': 'epoch', 'epoch': epoch, 'step': step, 'val_loss': v}),"
    " flush=True)\n"
    "    body = (f'checkpoint {i} ' * 300).encode()\n"
    "    req = urllib.request.Request(f'{base}/checkpoints?step={step}&epoch={epoch}', data=body, method='PUT',\n"
    "        headers={'Authorization': 'Bearer ' + cfg['token'], 'Content-Type': 'application/octet-stream',\n"
    "                 'X-Checksum-Sha256': hashlib.sha256(body).hexdigest()})\n"
    "    urllib.request.urlopen(req).read()\n"
    "    print('uploaded checkpoint', i, flush=True)\n"
    "if sys.argv[2] != '-':\n"
    "    for _ in range(900):\n"
    "        if os.path.exists(sys.argv[2]):\n"
    "            break\n"
    "        time.sleep(0.1)\n"
    "print('script done', flush=True)\n";

static void start_up(const char *const *more) {
    const char *extra[16] = {"--cpu-slots", "2"};
    int n = 2;
    for (int i = 0; more && more[i] && n < 15; i++) extra[n++] = more[i];
    extra[n] = NULL;
    ty_server_start_args(&srv, "up", extra);
    ty_token(&srv, "token", team_tok, sizeof team_tok);
    ty_token(&srv, "admin.token", admin_tok, sizeof admin_tok);
}

static void setup_with(const char *const *more) {
    memset(&srv, 0, sizeof srv);
    ty_mkdtemp(srv.dir, sizeof srv.dir, "ret");
    ty_mkdtemp_shared(tmpdir, sizeof tmpdir, "rettmp"); /* the programs run as other uids */
    snprintf(script, sizeof script, "%s/job.py", tmpdir);
    ck_assert_int_eq(file_write_atomic(script, PY, sizeof PY - 1, 0644), 0);
    start_up(more);
}

static void setup(void) { setup_with(NULL); }

static void setup_retention(void) {
    const char *more[] = {"--log-retention-days", "5s", NULL};
    setup_with(more);
}

static void teardown(void) {
    ty_kill(&srv, SIGTERM);
    ty_rmrf(srv.dir);
    ty_rmrf(tmpdir);
}

/* ---------------------------------------------------------------- helpers */

static int64_t submit_script(const char *name, const char *vals, const char *flag, const char *ckpt) {
    char spec[1600];
    snprintf(spec, sizeof spec,
             "{\"name\":\"%s\",\"command\":{\"argv\":[\"/usr/bin/python3\",\"%s\",\"%s\",\"%s\"]},"
             "\"max_restarts\":0%s%s}",
             name, script, vals, flag, ckpt ? ",\"checkpoint\":" : "", ckpt ? ckpt : "");
    return ty_submit(srv.url, team_tok, spec);
}

static int64_t submit_sleeper(const char *name) {
    char spec[400];
    snprintf(spec, sizeof spec,
             "{\"name\":\"%s\",\"command\":{\"argv\":[\"/bin/sh\",\"-c\",\"echo running-line; sleep 120\"]},"
             "\"max_restarts\":0}",
             name);
    return ty_submit(srv.url, team_tok, spec);
}

static long get(const char *tok, const char *fmt, int64_t id, cJSON **out) {
    char path[160];
    snprintf(path, sizeof path, fmt, (long long)id);
    return ty_http(srv.url, tok, "GET", path, NULL, out);
}

static long del(const char *tok, int64_t id, cJSON **out) {
    char path[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld", (long long)id);
    return ty_http(srv.url, tok, "DELETE", path, NULL, out);
}

static const char *state_of(int64_t id, char *out, size_t cap) {
    cJSON *o = ty_job_get(srv.url, team_tok, id);
    snprintf(out, cap, "%s", ty_str(o, "state"));
    cJSON_Delete(o);
    return out;
}

static void wait_state(int64_t id, const char *want, int timeout_s) {
    int64_t end = mono_ms() + (int64_t)timeout_s * 1000;
    char st[32];
    while (strcmp(state_of(id, st, sizeof st), want) != 0) {
        ck_assert_msg(mono_ms() < end, "job %lld is %s, not %s (see %s)", (long long)id, st, want, srv.log);
        ty_sleep_ms(100);
    }
}

/* The log of worker-0 once it holds needle (output is shipped once a
 * second and at the task's exit, which may follow the job's end). */
static void wait_log(int64_t id, const char *needle) {
    int64_t end = mono_ms() + 15000;
    for (;;) {
        char *l = ty_task_log(srv.url, team_tok, id, "worker-0");
        int ok = strstr(l, needle) != NULL;
        if (!ok && mono_ms() > end) ck_abort_msg("job %lld's log lacks \"%s\":\n%.2000s", (long long)id, needle, l);
        free(l);
        if (ok) return;
        ty_sleep_ms(100);
    }
}

/* Every task of the job exited (the server takes a DELETE only then). */
static void wait_tasks_exited(int64_t id) {
    int64_t end = mono_ms() + 20000;
    for (;;) {
        cJSON *o = ty_job_get(srv.url, team_tok, id);
        int live = 0;
        cJSON *t;
        cJSON_ArrayForEach(t, cJSON_GetObjectItem(o, "tasks")) live += strcmp(ty_str(t, "state"), "exited") != 0;
        cJSON_Delete(o);
        if (!live) return;
        ck_assert_msg(mono_ms() < end, "job %lld's tasks did not exit", (long long)id);
        ty_sleep_ms(100);
    }
}

/* A finished job that wrote a log and uploaded checkpoints, its tasks
 * exited and its log all there. */
static int64_t finished_job(const char *name, const char *vals) {
    int64_t id = submit_script(name, vals, "-", NULL);
    wait_state(id, "succeeded", 90);
    wait_log(id, "script done");
    wait_tasks_exited(id);
    return id;
}

static void data_path(char *out, size_t cap, const char *kind, int64_t id) {
    snprintf(out, cap, "%s/%s/%lld", srv.dir, kind, (long long)id);
}

static int64_t db_int(const char *sql, int64_t id);

/* Regular files in DATA/kind/id and their bytes; -1 when the directory is
 * not there. On PostgreSQL a job's logs are in the database (the chunks'
 * bytes): its tasks with any, and their bytes; -1 when none. */
static int files_in(const char *kind, int64_t id, int64_t *bytes) {
    if (ty_pg_url() && strcmp(kind, "logs") == 0) {
        int n = (int)db_int("SELECT CASE WHEN count(*) = 0 THEN NULL ELSE count(DISTINCT task) END FROM log_chunks"
                            " WHERE job_id = ? AND data IS NOT NULL", id);
        if (bytes)
            *bytes = n < 0 ? 0 : db_int("SELECT sum(length) FROM log_chunks WHERE job_id = ? AND data IS NOT NULL", id);
        return n;
    }
    char dir[512];
    data_path(dir, sizeof dir, kind, id);
    DIR *d = opendir(dir);
    if (bytes) *bytes = 0;
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char p[800];
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (e->d_name[0] == '.' || stat(p, &sb) < 0 || !S_ISREG(sb.st_mode)) continue;
        n++;
        if (bytes) *bytes += sb.st_size;
    }
    closedir(d);
    return n;
}

/* One integer from the server's database, opened read-only beside it
 * (on PostgreSQL: a session of its own). */
static int64_t db_int(const char *sql, int64_t id) {
    if (ty_pg_url()) { /* its PostgreSQL database */
        char u[512];
        ty_pg_data_db(srv.dir, u, sizeof u);
        return ty_pg_int_of(u, sql, id);
    }
    char path[512];
    snprintf(path, sizeof path, "%s/trainyard.db", srv.dir);
    sqlite3 *db = NULL;
    ck_assert_int_eq(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_busy_timeout(db, 5000);
    sqlite3_stmt *st = NULL;
    ck_assert_msg(sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK, "%s: %s", sql, sqlite3_errmsg(db));
    sqlite3_bind_int64(st, 1, id);
    ck_assert_int_eq(sqlite3_step(st), SQLITE_ROW);
    int64_t v = sqlite3_column_type(st, 0) == SQLITE_NULL ? -1 : sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(db);
    return v;
}

/* 1 when GET /jobs (the team's and the admin's) lists the job. */
static int listed(int64_t id) {
    const char *toks[] = {team_tok, admin_tok};
    int found = 0;
    for (int k = 0; k < 2; k++) {
        cJSON *o = NULL;
        ck_assert_int_eq(ty_http(srv.url, toks[k], "GET", "/api/v1/jobs?limit=1000", NULL, &o), 200);
        cJSON *j;
        cJSON_ArrayForEach(j, cJSON_GetObjectItem(o, "jobs")) found |= (int64_t)ty_num(j, "id") == id;
        cJSON_Delete(o);
    }
    return found;
}

/* Everything the API has of a deleted job is a 404, for its team and the
 * admin, and no list names it. */
static void expect_gone(int64_t id) {
    static const char *const paths[] = {
        "/api/v1/jobs/%lld",
        "/api/v1/jobs/%lld/logs?task=worker-0",
        "/api/v1/jobs/%lld/checkpoints",
        "/api/v1/jobs/%lld/checkpoints/latest",
        "/api/v1/jobs/%lld/metrics?since=0",
        "/api/v1/jobs/%lld/events",
    };
    const char *toks[] = {team_tok, admin_tok};
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
            cJSON *o = NULL;
            long st = get(toks[k], paths[i], id, &o);
            ck_assert_msg(st == 404, "%s of deleted job %lld answered %ld", paths[i], (long long)id, st);
            ty_assert_error(o, "not_found", NULL);
            cJSON_Delete(o);
        }
    char path[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/cancel", (long long)id);
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", path, NULL, &o), 404);
    cJSON_Delete(o);
    ck_assert_msg(!listed(id), "deleted job %lld is still listed", (long long)id);
    char *q = ty_http_text(srv.url, admin_tok, "/api/v1/queue");
    char *c = ty_http_text(srv.url, admin_tok, "/api/v1/cluster");
    char needle[48];
    snprintf(needle, sizeof needle, "\"job\":%lld,", (long long)id);
    ck_assert_msg(!strstr(q, needle) && !strstr(c, needle), "the queue or the cluster names job %lld", (long long)id);
    free(q);
    free(c);
}

/* ---------------------------------------------------------------- delete */

START_TEST(delete_running_is_409_and_finished_goes) {
    int64_t run = submit_sleeper("ret-running");
    int64_t fin = finished_job("ret-finished", "0.5,0.4");
    wait_state(run, "running", 60);
    wait_log(run, "running-line");

    /* a running job: 409 naming its state, and nothing changes */
    cJSON *o = NULL;
    ck_assert_int_eq(del(team_tok, run, &o), 409);
    ty_assert_error(o, "conflict", NULL);
    const char *msg = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "error"), "message")->valuestring;
    ck_assert_msg(strstr(msg, "is running") && strstr(msg, "cancel"), "the 409 says: %s", msg);
    cJSON_Delete(o);
    char st[32];
    ck_assert_str_eq(state_of(run, st, sizeof st), "running");
    wait_log(run, "running-line");
    ck_assert_int_ge(files_in("logs", run, NULL), 1);
    ck_assert_int_eq((int)db_int("SELECT deleted_at FROM jobs WHERE id = ?", run), -1);

    /* the finished job's files are there, with metrics and checkpoints */
    int64_t log_bytes = 0, ck_bytes = 0;
    ck_assert_int_ge(files_in("logs", fin, &log_bytes), 1);
    ck_assert_int_ge(files_in("checkpoints", fin, &ck_bytes), 1);
    ck_assert_int_ge(db_int("SELECT count(*) FROM metrics WHERE job_id = ?", fin), 2);
    ck_assert_int_ge(db_int("SELECT count(*) FROM log_chunks WHERE job_id = ?", fin), 1);

    /* another team: the same 404 as an unknown job, and nothing goes */
    cJSON *team = NULL;
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "POST", "/api/v1/teams", "{\"name\":\"other\"}", &team), 201);
    char other[128];
    snprintf(other, sizeof other, "%s", ty_str(team, "token"));
    cJSON_Delete(team);
    ck_assert_int_eq(del(other, fin, &o), 404);
    ty_assert_error(o, "not_found", NULL);
    cJSON_Delete(o);
    ck_assert_int_eq(del(team_tok, 999999, &o), 404);
    cJSON_Delete(o);
    ck_assert_int_ge(files_in("checkpoints", fin, NULL), 1);
    ck_assert_int_eq(get(team_tok, "/api/v1/jobs/%lld", fin, &o), 200);
    cJSON_Delete(o);

    /* the team deletes it: files, metrics and log rows gone; row and tasks kept */
    ck_assert_int_eq(del(team_tok, fin, &o), 200);
    ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(o, "deleted")));
    ck_assert_int_eq((int64_t)ty_num(o, "id"), fin);
    ck_assert_msg((int64_t)ty_num(o, "freed_bytes") >= log_bytes + ck_bytes && log_bytes + ck_bytes > 0,
                  "freed_bytes %.0f, files held %lld", ty_num(o, "freed_bytes"), (long long)(log_bytes + ck_bytes));
    cJSON_Delete(o);
    ck_assert_int_eq(files_in("logs", fin, NULL), -1);
    ck_assert_int_eq(files_in("checkpoints", fin, NULL), -1);
    ck_assert_int_gt(db_int("SELECT deleted_at FROM jobs WHERE id = ?", fin), 0);
    ck_assert_int_ge(db_int("SELECT count(*) FROM tasks WHERE job_id = ?", fin), 1);
    ck_assert_int_eq(db_int("SELECT count(*) FROM metrics WHERE job_id = ?", fin), 0);
    ck_assert_int_eq(db_int("SELECT count(*) FROM log_chunks WHERE job_id = ?", fin), 0);
    ck_assert_int_eq(db_int("SELECT count(*) FROM checkpoints WHERE job_id = ? AND deleted_at IS NULL", fin), 0);
    expect_gone(fin);
    ck_assert_int_eq(del(team_tok, fin, &o), 404); /* again: gone */
    cJSON_Delete(o);
    ck_assert_int_eq(del(admin_tok, fin, &o), 404);
    cJSON_Delete(o);

    /* the running job is untouched; cancelled, the admin may delete it */
    ck_assert_str_eq(state_of(run, st, sizeof st), "running");
    char path[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/cancel", (long long)run);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", path, NULL, &o), 200);
    cJSON_Delete(o);
    int64_t end = mono_ms() + 30000;
    long code;
    while ((code = del(admin_tok, run, &o)) == 409 && mono_ms() < end) { /* its task is still stopping */
        cJSON_Delete(o);
        ty_sleep_ms(200);
    }
    ck_assert_int_eq(code, 200);
    cJSON_Delete(o);
    ck_assert_int_eq(files_in("logs", run, NULL), -1);
    expect_gone(run);
}
END_TEST

/* ---------------------------------------------------------------- retention */

START_TEST(log_retention_removes_old_logs_only) {
    int64_t run = submit_sleeper("ret-live");
    wait_state(run, "running", 60);
    int64_t old = finished_job("ret-old", "-");
    ck_assert_int_ge(files_in("logs", old, NULL), 1);

    /* 5 s after its end, within a few ticks: 410 saying when and why */
    int64_t end = mono_ms() + 20000;
    cJSON *o = NULL;
    long st;
    while ((st = get(team_tok, "/api/v1/jobs/%lld/logs?task=worker-0", old, NULL)) == 200 && mono_ms() < end)
        ty_sleep_ms(200);
    ck_assert_int_eq(get(team_tok, "/api/v1/jobs/%lld/logs?task=worker-0", old, &o), 410);
    ty_assert_error(o, "logs_purged", NULL);
    cJSON *e = cJSON_GetObjectItem(o, "error");
    ck_assert_msg(strstr(ty_str(e, "message"), "retention") && strstr(ty_str(e, "message"), "--log-retention-days"),
                  "the 410 says: %s", ty_str(e, "message"));
    ck_assert_msg(strlen(ty_str(e, "purged_at")) >= 20, "no purged_at in the 410");
    cJSON_Delete(o);
    ck_assert_int_eq(files_in("logs", old, NULL), -1);
    ck_assert_int_gt(db_int("SELECT logs_purged_at FROM jobs WHERE id = ?", old), 0);
    ck_assert_int_eq(db_int("SELECT log_bytes FROM jobs WHERE id = ?", old), 0);
    ck_assert_int_eq(db_int("SELECT count(*) FROM log_chunks WHERE job_id = ?", old), 0);
    /* the job itself stays */
    o = ty_job_get(srv.url, team_tok, old);
    ck_assert_str_eq(ty_str(o, "state"), "succeeded");
    cJSON_Delete(o);

    /* a job finished since keeps its logs; so does the running one, older than the setting */
    int64_t fresh = finished_job("ret-fresh", "-");
    char *l = ty_task_log(srv.url, team_tok, fresh, "worker-0");
    ck_assert_msg(strstr(l, "job output line"), "the fresh job's log: %s", l);
    free(l);
    ck_assert_int_ge(files_in("logs", fresh, NULL), 1);
    l = ty_task_log(srv.url, team_tok, run, "worker-0");
    ck_assert_msg(strstr(l, "running-line"), "the running job's log: %s", l);
    free(l);
    ck_assert_int_ge(files_in("logs", run, NULL), 1);
    ck_assert_int_eq((int)db_int("SELECT logs_purged_at FROM jobs WHERE id = ?", run), -1);
    /* what the server said it removed */
    size_t n = 0;
    char *log = file_read_all(srv.log, 1 << 24, &n);
    ck_assert_ptr_nonnull(log);
    char needle[64];
    snprintf(needle, sizeof needle, "job %lld: logs removed", (long long)old);
    ck_assert_msg(strstr(log, needle), "the server's log lacks \"%s\"", needle);
    free(log);
}
END_TEST

/* ---------------------------------------------------------------- checkpoints */

START_TEST(finished_job_keeps_newest_and_best) {
    char flag[420];
    snprintf(flag, sizeof flag, "%s/go", tmpdir);
    /* val_loss by checkpoint: the 3rd is the best (min) */
    int64_t id = submit_script("ret-best", "0.9,0.5,0.2,0.6,0.7", flag,
                               "{\"keep\":10,\"best\":{\"metric\":\"val_loss\",\"mode\":\"min\"}}");
    int64_t plain = submit_script("ret-plain", "0.3,0.2,0.1", "-", NULL);
    wait_log(id, "uploaded checkpoint 4");

    /* while it runs, all five are there (keep 10), the best marked */
    cJSON *o = NULL;
    int64_t end = mono_ms() + 15000, best_id = 0;
    for (;;) {
        ck_assert_int_eq(get(team_tok, "/api/v1/jobs/%lld/checkpoints", id, &o), 200);
        cJSON *c;
        best_id = 0;
        cJSON_ArrayForEach(c, cJSON_GetObjectItem(o, "checkpoints")) if (cJSON_IsTrue(cJSON_GetObjectItem(c, "best")))
            best_id = (int64_t)ty_num(c, "id");
        int n = cJSON_GetArraySize(cJSON_GetObjectItem(o, "checkpoints"));
        cJSON_Delete(o);
        ck_assert_int_eq(n, 5);
        if (best_id || mono_ms() > end) break; /* the metrics arrive within a second or so */
        ty_sleep_ms(200);
    }
    ck_assert_int_eq(files_in("checkpoints", id, NULL), 5);
    ck_assert_msg(best_id > 0, "no checkpoint is marked best while the job runs");
    ck_assert_int_eq(db_int("SELECT step FROM checkpoints WHERE id = ?", best_id), 30);

    ck_assert_int_eq(file_write_atomic(flag, "go", 2, 0644), 0);
    wait_state(id, "succeeded", 60);
    wait_state(plain, "succeeded", 60);

    /* once it has ended: the newest (step 50) and the best (step 30), nothing else */
    end = mono_ms() + 20000;
    int n = 0;
    while ((n = files_in("checkpoints", id, NULL)) != 2 && mono_ms() < end) ty_sleep_ms(200);
    ck_assert_int_eq(n, 2);
    ck_assert_int_eq(get(team_tok, "/api/v1/jobs/%lld/checkpoints", id, &o), 200);
    cJSON *arr = cJSON_GetObjectItem(o, "checkpoints");
    ck_assert_int_eq(cJSON_GetArraySize(arr), 2);
    cJSON *newest = cJSON_GetArrayItem(arr, 0), *best = cJSON_GetArrayItem(arr, 1);
    ck_assert_int_eq((int)ty_num(newest, "step"), 50);
    ck_assert(cJSON_IsFalse(cJSON_GetObjectItem(newest, "best")));
    ck_assert_int_eq((int)ty_num(best, "step"), 30);
    ck_assert_int_eq((int)ty_num(best, "epoch"), 3);
    ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(best, "best")));
    ck_assert_int_eq((int64_t)ty_num(best, "id"), best_id);
    cJSON_Delete(o);
    ck_assert_int_eq(db_int("SELECT count(*) FROM checkpoints WHERE job_id = ? AND deleted_at IS NOT NULL", id), 3);
    /* the kept files are the ones listed, and they download */
    char path[128];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints/%lld", (long long)id, (long long)best_id);
    free(ty_http_text(srv.url, team_tok, path));

    /* without checkpoint.best: the newest alone */
    end = mono_ms() + 20000;
    while ((n = files_in("checkpoints", plain, NULL)) != 1 && mono_ms() < end) ty_sleep_ms(200);
    ck_assert_int_eq(n, 1);
    ck_assert_int_eq(get(team_tok, "/api/v1/jobs/%lld/checkpoints", plain, &o), 200);
    arr = cJSON_GetObjectItem(o, "checkpoints");
    ck_assert_int_eq(cJSON_GetArraySize(arr), 1);
    ck_assert_int_eq((int)ty_num(cJSON_GetArrayItem(arr, 0), "step"), 30);
    ck_assert(cJSON_IsFalse(cJSON_GetObjectItem(cJSON_GetArrayItem(arr, 0), "best")));
    cJSON_Delete(o);
}
END_TEST

/* ---------------------------------------------------------------- kill -9 */

/* The `trainyard server` that `up` started. */
static pid_t server_pid(void) {
    pid_t p[2];
    ck_assert_int_eq(ty_children_named(srv.pid, "server", p, 2), 1);
    return p[0];
}

/* SIGKILL to the server; `up` stops its agent and exits; then `up` again
 * on the same data directory. */
static void kill9_and_restart(void) {
    pid_t s = server_pid();
    ck_assert_int_eq(kill(s, SIGKILL), 0);
    ty_kill(&srv, SIGTERM);
    unsetenv("TRAINYARD_TEST_DELETE_PAUSE_MS");
    start_up(NULL);
}

static void wait_files_gone(int64_t id) {
    int64_t end = mono_ms() + 20000;
    while ((files_in("logs", id, NULL) != -1 || files_in("checkpoints", id, NULL) != -1) && mono_ms() < end)
        ty_sleep_ms(100);
    ck_assert_msg(files_in("logs", id, NULL) == -1, "the logs of deleted job %lld are still on disk", (long long)id);
    ck_assert_msg(files_in("checkpoints", id, NULL) == -1, "the checkpoints of deleted job %lld are still on disk",
                  (long long)id);
}

START_TEST(killed_after_delete_answers) {
    int64_t id = finished_job("ret-kill-a", "0.4");
    cJSON *o = NULL;
    ck_assert_int_eq(del(team_tok, id, &o), 200);
    cJSON_Delete(o);
    kill9_and_restart();
    wait_files_gone(id);
    expect_gone(id);
    ck_assert_int_gt(db_int("SELECT deleted_at FROM jobs WHERE id = ?", id), 0);
}
END_TEST

/* TRAINYARD_TEST_DELETE_PAUSE_MS holds the DELETE between its commit and
 * the removal of the files: the server dies there, with the files still on
 * disk, and the next start removes them. */
START_TEST(killed_between_commit_and_removal) {
    ty_kill(&srv, SIGTERM);
    setenv("TRAINYARD_TEST_DELETE_PAUSE_MS", "60000", 1);
    start_up(NULL);
    int64_t id = finished_job("ret-kill-b", "0.4,0.3");
    ck_assert_int_ge(files_in("checkpoints", id, NULL), 1);
    pid_t child = fork();
    ck_assert_int_ge(child, 0);
    if (child == 0) { /* the DELETE, which will never be answered */
        client c;
        if (client_init(&c, srv.url, team_tok) < 0) _exit(1);
        char path[96];
        snprintf(path, sizeof path, "/api/v1/jobs/%lld", (long long)id);
        client_reply r;
        client_request(&c, "DELETE", path, NULL, 0, NULL, &r);
        _exit(0);
    }
    int64_t end = mono_ms() + 20000;
    while (db_int("SELECT coalesce(deleted_at, 0) FROM jobs WHERE id = ?", id) == 0 && mono_ms() < end) ty_sleep_ms(50);
    ck_assert_int_gt(db_int("SELECT deleted_at FROM jobs WHERE id = ?", id), 0);
    /* committed: the API already has nothing of it, the files are still there
     * (on PostgreSQL the logs were in the database: gone with the commit) */
    cJSON *o = NULL;
    ck_assert_int_eq(get(team_tok, "/api/v1/jobs/%lld", id, &o), 404);
    cJSON_Delete(o);
    if (ty_pg_url()) ck_assert_int_eq(files_in("logs", id, NULL), -1);
    else ck_assert_int_ge(files_in("logs", id, NULL), 1);
    ck_assert_int_ge(files_in("checkpoints", id, NULL), 1);
    kill9_and_restart();
    int status = 0;
    waitpid(child, &status, 0);
    wait_files_gone(id);
    expect_gone(id);
    size_t n = 0;
    char *log = file_read_all(srv.log, 1 << 24, &n);
    ck_assert_ptr_nonnull(log);
    char needle[64];
    snprintf(needle, sizeof needle, "job %lld: removed", (long long)id);
    ck_assert_msg(strstr(log, needle), "the server's log lacks \"%s\"", needle);
    free(log);
}
END_TEST

int main(void) {
    Suite *s = suite_create("retention");
    TCase *tc = ty_tcase(s, "delete", setup, teardown, 240);
    tcase_add_test(tc, delete_running_is_409_and_finished_goes);
    tc = ty_tcase(s, "logs", setup_retention, teardown, 180);
    tcase_add_test(tc, log_retention_removes_old_logs_only);
    tc = ty_tcase(s, "checkpoints", setup, teardown, 180);
    tcase_add_test(tc, finished_job_keeps_newest_and_best);
    tc = ty_tcase(s, "crash", setup, teardown, 240);
    tcase_add_test(tc, killed_after_delete_answers);
    tcase_add_test(tc, killed_between_commit_and_removal);
    return ty_run_suite(s);
}
