/* check_ports.c - a job's web ports (spec "ports", docs/jobspec.md).
 *
 * store: storage/ports_store.c on a real SQLite file: a task's ports
 * replaced (and cleared), the port named found on the job's live task with
 * the lowest id and its node's address, exited tasks left out, the names
 * the job declares when none serves it (spec first, then its tasks' rows),
 * the list of a job's live ports, and the running report's ports written in
 * the report's transaction (scheduler/lifecycle.c) and left alone for an
 * exited task.
 *
 * e2e: `trainyard up --cpu-slots 2`: a command job whose python3 script
 * serves HTTP on $TRAINYARD_PORT_WEB; GET /jobs/{id} lists the port with its
 * task, node and port, and http://127.0.0.1:PORT/ answers the script's text;
 * a repeated running report replaces the task's ports; bad running reports
 * and bad port specs are 422s naming the field; a queued job lists its
 * declared ports without node or port, and a job that ended lists no port
 * of a node. */
#include <sqlite3.h>

#include "testlib.h"

#include "../scheduler/lifecycle.h"
#include "../storage/db.h"
#include "../storage/ports_store.h"
#include "../storage/store.h"

/* ================================================================ store */

static char g_dir[256];
static char g_path[300];
static db *g_db;

static void store_setup(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/ty_ports_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(g_dir));
    snprintf(g_path, sizeof g_path, "%s/t.db", g_dir);
    char err[256];
    ck_assert_msg(db_open(&g_db, g_path, err, sizeof err) == 0, "%s", err);
}

static void store_teardown(void) {
    db_close(g_db);
    g_db = NULL;
    ty_rmrf(g_dir);
}

static void exec_sql(const char *sql) {
    char *err = NULL;
    int rc = sqlite3_exec(db_sqlite(g_db), sql, NULL, NULL, &err);
    ck_assert_msg(rc == SQLITE_OK, "%s: %s", sql, err ? err : "?");
    sqlite3_free(err);
}

static long count_rows(void) {
    sqlite3_stmt *st = NULL;
    ck_assert_int_eq(sqlite3_prepare_v2(db_sqlite(g_db), "SELECT count(*) FROM task_ports", -1, &st, NULL), SQLITE_OK);
    ck_assert_int_eq(sqlite3_step(st), SQLITE_ROW);
    long n = (long)sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return n;
}

static int64_t insert_job(int64_t team, const char *spec) {
    store_new_job row = {.name = "ports", .priority = 50, .max_restarts = 0, .workers = 2,
                         .devices_per_worker = 1, .device = "cpu", .max_runtime_s = 600};
    int64_t id = 0;
    ck_assert_int_eq(store_job_insert(g_db, team, spec, strlen(spec), &row, "team:default", &id), STORE_OK);
    return id;
}

static int64_t insert_node(const char *host, const char *address) {
    char sql[256];
    snprintf(sql, sizeof sql,
             "INSERT INTO nodes(hostname, address, cpu_slots, state, registered_at, last_heartbeat_at)"
             " VALUES('%s', '%s', 2, 'ready', 0, 0)", host, address);
    exec_sql(sql);
    return sqlite3_last_insert_rowid(db_sqlite(g_db));
}

static int64_t insert_task(int64_t job, int idx, int64_t node, const char *state) {
    char sql[256];
    snprintf(sql, sizeof sql,
             "INSERT INTO tasks(job_id, attempt, type, idx, node_id, port, state, created_at)"
             " VALUES(%lld, 1, 'worker', %d, %lld, 0, '%s', 0)",
             (long long)job, idx, (long long)node, state);
    exec_sql(sql);
    return sqlite3_last_insert_rowid(db_sqlite(g_db));
}

static void task_state(int64_t task, const char *state) {
    char sql[128];
    snprintf(sql, sizeof sql, "UPDATE tasks SET state = '%s' WHERE id = %lld", state, (long long)task);
    exec_sql(sql);
}

/* Asserts find(job, name): found on host:port, or (host NULL) not found
 * with `have` the declared names. */
static void expect_find(int64_t job, const char *name, const char *host, int port, const char *have) {
    char h[256] = "?", hv[256] = "?";
    int p = -1;
    int rc = ports_store_find(g_db, job, name, h, &p, hv, sizeof hv);
    if (host) {
        ck_assert_msg(rc == STORE_OK, "find %s: %d, not found (have \"%s\")", name, rc, hv);
        ck_assert_str_eq(h, host);
        ck_assert_int_eq(p, port);
        ck_assert_str_eq(hv, "");
    } else {
        ck_assert_msg(rc == STORE_NOT_FOUND, "find %s: %d (%s:%d), expected not found", name, rc, h, p);
        ck_assert_str_eq(hv, have);
    }
}

static const char SPEC_TB_WEB[] =
    "{\"command\":{\"argv\":[\"x\"]},\"ports\":[{\"name\":\"tb\",\"port\":6006},{\"name\":\"web\",\"port\":8000}]}";

START_TEST(set_find_live_lowest_and_have) {
    int64_t team = 0;
    ck_assert_int_eq(store_team_create(g_db, "t", &team), STORE_OK);
    int64_t job = insert_job(team, SPEC_TB_WEB);
    int64_t n1 = insert_node("node-a", "10.0.0.1"), n2 = insert_node("node-b", "10.0.0.2");
    int64_t w0 = insert_task(job, 0, n1, "running"), w1 = insert_task(job, 1, n2, "running");

    /* nothing reported yet: the spec's names */
    expect_find(job, "tb", NULL, 0, "tb,web");
    const char names2[][33] = {"tb", "web"};
    const int ports2[] = {41000, 41001};
    ck_assert_int_eq(ports_store_set(g_db, w0, names2, ports2, 2), STORE_OK);
    expect_find(job, "tb", "10.0.0.1", 41000, "");
    expect_find(job, "web", "10.0.0.1", 41001, "");
    expect_find(job, "nope", NULL, 0, "tb,web");

    /* replaced, not added to: w0 has only web now, tb is w1's */
    const char names1[][33] = {"web"};
    const int ports1[] = {42000};
    ck_assert_int_eq(ports_store_set(g_db, w0, names1, ports1, 1), STORE_OK);
    expect_find(job, "tb", NULL, 0, "tb,web");
    const char names_tb[][33] = {"tb"};
    const int ports_tb[] = {43000};
    ck_assert_int_eq(ports_store_set(g_db, w1, names_tb, ports_tb, 1), STORE_OK);
    expect_find(job, "tb", "10.0.0.2", 43000, "");
    expect_find(job, "web", "10.0.0.1", 42000, "");

    /* both have tb: the lowest task id (worker-0) */
    ck_assert_int_eq(ports_store_set(g_db, w0, names2, ports2, 2), STORE_OK);
    expect_find(job, "tb", "10.0.0.1", 41000, "");
    /* a stopping task still serves; an exited one does not */
    task_state(w0, "stopping");
    expect_find(job, "tb", "10.0.0.1", 41000, "");
    task_state(w0, "exited");
    expect_find(job, "tb", "10.0.0.2", 43000, "");
    expect_find(job, "web", NULL, 0, "tb,web");
    task_state(w1, "exited");
    expect_find(job, "tb", NULL, 0, "tb,web");

    /* n = 0 clears a task's ports */
    task_state(w1, "running");
    ck_assert_int_eq(ports_store_set(g_db, w1, NULL, NULL, 0), STORE_OK);
    expect_find(job, "tb", NULL, 0, "tb,web");
    ck_assert_int_eq(ports_store_set(g_db, 999999, names1, ports1, 1), STORE_ERROR); /* no such task */

    /* have: "" for a job that declares none; the tasks' own names after
     * the spec's; a notebook's own; cut at a whole name */
    int64_t plain = insert_job(team, "{\"command\":{\"argv\":[\"x\"]}}");
    expect_find(plain, "tb", NULL, 0, "");
    int64_t pt = insert_task(plain, 0, n1, "exited");
    const char odd[][33] = {"zeta", "alpha"};
    const int oddp[] = {1, 2};
    ck_assert_int_eq(ports_store_set(g_db, pt, odd, oddp, 2), STORE_OK);
    expect_find(plain, "zeta", NULL, 0, "alpha,zeta");
    int64_t mixed = insert_job(team, SPEC_TB_WEB);
    int64_t mt = insert_task(mixed, 0, n2, "exited");
    const char extra[][33] = {"web", "extra"};
    ck_assert_int_eq(ports_store_set(g_db, mt, extra, oddp, 2), STORE_OK);
    expect_find(mixed, "tb", NULL, 0, "tb,web,extra");
    int64_t nb = insert_job(team, "{\"interactive\":{\"type\":\"notebook\"},\"ports\":[{\"name\":\"tb\",\"port\":1}]}");
    expect_find(nb, "notebook", NULL, 0, "tb,notebook");
    char h[256], hv[8];
    int p = 0;
    ck_assert_int_eq(ports_store_find(g_db, mixed, "tb", h, &p, hv, sizeof hv), STORE_NOT_FOUND);
    ck_assert_str_eq(hv, "tb,web"); /* "tb,web,extra" does not fit in 8 */

    /* the hit: its task, the task's token hash, whether the job is a notebook's */
    int64_t nt = insert_task(nb, 0, n2, "running");
    const char nbn[][33] = {"notebook", "tb"};
    const int nbp[] = {48888, 46006};
    ck_assert_int_eq(ports_store_set(g_db, nt, nbn, nbp, 2), STORE_OK);
    ports_hit hit;
    ck_assert_int_eq(ports_store_find_hit(g_db, nb, "notebook", &hit, NULL, 0), STORE_OK);
    ck_assert_str_eq(hit.host, "10.0.0.2");
    ck_assert_int_eq(hit.port, 48888);
    ck_assert_int_eq(hit.task, nt);
    ck_assert_int_eq(hit.notebook, 1);
    ck_assert_str_eq(hit.token_hash, ""); /* not handed out yet */
    char sql[160];
    snprintf(sql, sizeof sql, "UPDATE tasks SET token_hash = '%064d' WHERE id = %lld", 7, (long long)nt);
    exec_sql(sql);
    ck_assert_int_eq(ports_store_find_hit(g_db, nb, "tb", &hit, NULL, 0), STORE_OK);
    ck_assert_int_eq(hit.port, 46006);
    ck_assert_int_eq(hit.notebook, 1);
    ck_assert_int_eq(strlen(hit.token_hash), 64);
    ck_assert_str_eq(hit.token_hash + 60, "0007");
    ck_assert_int_eq(ports_store_find_hit(g_db, job, "tb", &hit, NULL, 0), STORE_NOT_FOUND);
    ck_assert_int_eq(ports_store_find_hit(g_db, mixed, "web", &hit, NULL, 0), STORE_NOT_FOUND);
    int64_t mt2 = insert_task(mixed, 1, n1, "running");
    ck_assert_int_eq(ports_store_set(g_db, mt2, names1, ports1, 1), STORE_OK);
    ck_assert_int_eq(ports_store_find_hit(g_db, mixed, "web", &hit, NULL, 0), STORE_OK);
    ck_assert_int_eq(hit.notebook, 0); /* a command job's port */
}
END_TEST

START_TEST(list_live_ports) {
    int64_t team = 0;
    ck_assert_int_eq(store_team_create(g_db, "t", &team), STORE_OK);
    int64_t job = insert_job(team, SPEC_TB_WEB);
    int64_t n1 = insert_node("node-a", "10.0.0.1"), n2 = insert_node("node-b", "10.0.0.2");
    int64_t w0 = insert_task(job, 0, n1, "running"), w1 = insert_task(job, 1, n2, "assigned");
    int64_t old = insert_task(job, 2, n2, "exited");
    const char names[][33] = {"web", "tb"};
    const int p0[] = {41001, 41000}, p1[] = {42001, 42000}, p2[] = {1, 2};
    ck_assert_int_eq(ports_store_set(g_db, w0, names, p0, 2), STORE_OK);
    ck_assert_int_eq(ports_store_set(g_db, w1, names, p1, 2), STORE_OK);
    ck_assert_int_eq(ports_store_set(g_db, old, names, p2, 2), STORE_OK);
    cJSON *arr = NULL;
    ck_assert_int_eq(ports_store_list(g_db, job, &arr), STORE_OK);
    ck_assert_int_eq(cJSON_GetArraySize(arr), 4);
    static const struct { const char *name, *task_name, *node, *address; int port; } want[] = {
        {"tb", "worker-0", "node-a", "10.0.0.1", 41000},
        {"web", "worker-0", "node-a", "10.0.0.1", 41001},
        {"tb", "worker-1", "node-b", "10.0.0.2", 42000},
        {"web", "worker-1", "node-b", "10.0.0.2", 42001}};
    for (int i = 0; i < 4; i++) {
        const cJSON *e = cJSON_GetArrayItem(arr, i);
        ck_assert_str_eq(ty_str(e, "name"), want[i].name);
        ck_assert_str_eq(ty_str(e, "task_name"), want[i].task_name);
        ck_assert_str_eq(ty_str(e, "node"), want[i].node);
        ck_assert_str_eq(ty_str(e, "address"), want[i].address);
        ck_assert_int_eq((int)ty_num(e, "port"), want[i].port);
        ck_assert_int_eq((int64_t)ty_num(e, "task"), i < 2 ? w0 : w1);
    }
    cJSON_Delete(arr);
}
END_TEST

/* The running report's ports go in with the report (one transaction);
 * an exited task's report is a conflict and leaves its ports alone. */
START_TEST(running_report_writes_ports) {
    int64_t team = 0;
    ck_assert_int_eq(store_team_create(g_db, "t", &team), STORE_OK);
    int64_t job = insert_job(team, SPEC_TB_WEB);
    exec_sql("UPDATE jobs SET state = 'starting', attempt = 1");
    int64_t n1 = insert_node("node-a", "10.0.0.1");
    int64_t w0 = insert_task(job, 0, n1, "assigned");
    lifecycle_ports lp = {.n = 2, .names = {"tb", "web"}, .ports = {45000, 45001}};
    int flags = 0;
    ck_assert_int_eq(lifecycle_task_running(g_db, w0, &lp, "agent", &flags), STORE_OK);
    expect_find(job, "web", "10.0.0.1", 45001, "");
    /* repeated: replaced */
    lifecycle_ports again = {.n = 1, .names = {"web"}, .ports = {45002}};
    ck_assert_int_eq(lifecycle_task_running(g_db, w0, &again, "agent", &flags), STORE_OK);
    expect_find(job, "web", "10.0.0.1", 45002, "");
    expect_find(job, "tb", NULL, 0, "tb,web");
    /* no ports given: left as they are */
    ck_assert_int_eq(lifecycle_task_running(g_db, w0, NULL, "agent", &flags), STORE_OK);
    expect_find(job, "web", "10.0.0.1", 45002, "");
    task_state(w0, "exited");
    ck_assert_int_eq(lifecycle_task_running(g_db, w0, &lp, "agent", &flags), STORE_CONFLICT);
    ck_assert_int_eq(count_rows(), 1);
}
END_TEST

/* ================================================================ e2e */

static ty_proc srv;
static char team_tok[128], admin_tok[128];
static char tmpdir[256];

static void up_setup(void) {
    memset(&srv, 0, sizeof srv);
    ty_mkdtemp(srv.dir, sizeof srv.dir, "ports");
    ty_mkdtemp_shared(tmpdir, sizeof tmpdir, "portstmp"); /* the programs may run as other uids */
    const char *extra[] = {"--cpu-slots", "2", NULL};
    ty_server_start_args(&srv, "up", extra);
    ty_token(&srv, "token", team_tok, sizeof team_tok);
    ty_token(&srv, "admin.token", admin_tok, sizeof admin_tok);
}

static void up_teardown(void) {
    ty_kill(&srv, SIGTERM);
    if (getenv("TY_KEEP")) fprintf(stderr, "check_ports: kept %s\n", srv.dir);
    else ty_rmrf(srv.dir);
    ty_rmrf(tmpdir);
}

/* The job's "ports" entry named name that has a port (a live task's), or
 * NULL; *job_out the job (the caller deletes). */
static const cJSON *port_entry(int64_t id, const char *name, cJSON **job_out) {
    cJSON *job = ty_job_get(srv.url, team_tok, id);
    *job_out = job;
    const cJSON *p;
    cJSON_ArrayForEach(p, cJSON_GetObjectItem(job, "ports")) {
        if (strcmp(ty_str(p, "name"), name) == 0 && ty_num(p, "port") > 0) return p;
    }
    return NULL;
}

/* GET http://127.0.0.1:port/ until it answers 200 (the script may not
 * listen yet): the body (the caller frees), NULL after timeout_ms. */
static char *fetch_direct(int port, int timeout_ms) {
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
    int64_t end = mono_ms() + timeout_ms;
    while (mono_ms() < end) {
        client c;
        ck_assert_int_eq(client_init(&c, url, NULL), 0);
        client_reply r;
        int rc = client_request(&c, "GET", "/", NULL, 0, NULL, &r);
        client_release(&c);
        if (rc == 0 && r.status == 200) {
            char *s = buf_detach(&r.body, NULL);
            client_reply_release(&r);
            return s ? s : xstrdup("");
        }
        client_reply_release(&r);
        ty_sleep_ms(100);
    }
    return NULL;
}

static char *job_text(int64_t id) {
    cJSON *o = ty_job_get(srv.url, team_tok, id);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

static void expect_422(const char *token, const char *path, const char *body, const char *code, const char *field) {
    cJSON *o = NULL;
    long st = ty_http(srv.url, token, "POST", path, body, &o);
    char *txt = cJSON_PrintUnformatted(o);
    ck_assert_msg(st == 422, "POST %s %s answered %ld: %s", path, body, st, txt);
    free(txt);
    ty_assert_error(o, code, field);
    cJSON_Delete(o);
}

START_TEST(command_job_serves_its_port) {
    char script[400], spec[1024];
    snprintf(script, sizeof script, "%s/serve.py", tmpdir);
    static const char py[] =
        "import http.server, os\n"
        "port = int(os.environ['TRAINYARD_PORT_WEB'])\n"
        "print('serving on', port, 'tb', os.environ.get('TRAINYARD_PORT_MY_TB'), flush=True)\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        body = ('hello from job %s on %d\\n' % (os.environ.get('TRAINYARD_TASK_NAME', '?'), port)).encode()\n"
        "        self.send_response(200)\n"
        "        self.send_header('Content-Length', str(len(body)))\n"
        "        self.end_headers()\n"
        "        self.wfile.write(body)\n"
        "    def log_message(self, *a):\n"
        "        pass\n"
        "http.server.HTTPServer(('0.0.0.0', port), H).serve_forever()\n";
    ck_assert_int_eq(file_write_atomic(script, py, sizeof py - 1, 0644), 0);
    snprintf(spec, sizeof spec,
             "{\"name\":\"serve\",\"command\":{\"argv\":[\"/usr/bin/python3\",\"%s\"]},"
             "\"ports\":[{\"name\":\"web\",\"port\":8000},{\"name\":\"my-tb\",\"port\":6006}],\"max_restarts\":0}",
             script);
    int64_t id = ty_submit(srv.url, team_tok, spec);

    /* the running report brings the ports: the job lists them with task, node and port */
    int64_t end = mono_ms() + 60000;
    cJSON *job = NULL;
    const cJSON *web = NULL;
    while (!(web = port_entry(id, "web", &job)) && mono_ms() < end) {
        const char *st = ty_str(job, "state");
        ck_assert_msg(strcmp(st, "failed") != 0 && strcmp(st, "cancelled") != 0, "job %s", st);
        cJSON_Delete(job);
        ty_sleep_ms(100);
    }
    ck_assert_msg(web != NULL, "no port \"web\" listed within 60 s");
    int port = (int)ty_num(web, "port");
    ck_assert_int_gt(port, 0);
    ck_assert_int_le(port, 65535);
    ck_assert_int_ne(port, 8000); /* the agent's pick, not the declared default */
    ck_assert_str_eq(ty_str(web, "task_name"), "worker-0");
    ck_assert_str_ne(ty_str(web, "node"), "");
    ck_assert_int_gt((int)ty_num(web, "task"), 0);
    int64_t task = (int64_t)ty_num(web, "task");
    char want_url[96];
    snprintf(want_url, sizeof want_url, "/proxy/jobs/%lld/web/", (long long)id);
    ck_assert_str_eq(ty_str(web, "url"), want_url);
    const cJSON *tb = NULL;
    cJSON *job2 = NULL;
    tb = port_entry(id, "my-tb", &job2);
    ck_assert_ptr_nonnull(tb);
    int tb_port = (int)ty_num(tb, "port");
    ck_assert_int_ne(tb_port, port);
    cJSON_Delete(job2);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(job, "ports")), 2);
    /* the declared order: web, then my-tb */
    ck_assert_str_eq(ty_str(cJSON_GetArrayItem(cJSON_GetObjectItem(job, "ports"), 0), "name"), "web");
    cJSON_Delete(job);

    /* the program listens on the port it was given */
    char *body = fetch_direct(port, 30000);
    ck_assert_msg(body != NULL, "nothing answered on 127.0.0.1:%d", port);
    char want[96];
    snprintf(want, sizeof want, "hello from job worker-0 on %d\n", port);
    ck_assert_str_eq(body, want);
    free(body);
    char *log = NULL;
    char line[96];
    snprintf(line, sizeof line, "serving on %d tb %d", port, tb_port);
    for (int64_t e2 = mono_ms() + 10000; mono_ms() < e2; ty_sleep_ms(100)) {
        free(log);
        log = ty_task_log(srv.url, team_tok, id, "worker-0");
        if (strstr(log, line)) break;
    }
    ck_assert_msg(strstr(log, line) != NULL, "worker-0's log lacks \"%s\":\n%.2000s", line, log);
    free(log);

    /* the running report's ports, checked by the server */
    char path[96];
    snprintf(path, sizeof path, "/api/v1/tasks/%lld/status", (long long)task);
    expect_422(admin_tok, path, "{\"state\":\"running\",\"ports\":[8000]}", "invalid_type", "ports");
    expect_422(admin_tok, path, "{\"state\":\"running\",\"ports\":{\"Web\":8000}}", "invalid_value", "ports.Web");
    expect_422(admin_tok, path, "{\"state\":\"running\",\"ports\":{\"web\":0}}", "invalid_value", "ports.web");
    expect_422(admin_tok, path, "{\"state\":\"running\",\"ports\":{\"web\":65536}}", "invalid_value", "ports.web");
    expect_422(admin_tok, path, "{\"state\":\"running\",\"ports\":{\"web\":\"80\"}}", "invalid_value", "ports.web");
    expect_422(admin_tok, path,
               "{\"state\":\"running\",\"ports\":{\"a\":1,\"b\":2,\"c\":3,\"d\":4,\"e\":5,\"f\":6,\"g\":7,\"h\":8,"
               "\"i\":9}}", "invalid_value", "ports");
    expect_422(admin_tok, path, "{\"state\":\"exited\",\"exit_code\":0,\"ports\":{\"web\":8000}}", "invalid_value",
               "ports");
    /* nothing of those was written */
    cJSON *j3 = NULL;
    ck_assert_int_eq((int)ty_num(port_entry(id, "web", &j3), "port"), port);
    cJSON_Delete(j3);

    /* a repeated running report replaces the task's ports (one the spec
     * does not declare is listed after the declared ones) */
    char body2[160];
    snprintf(body2, sizeof body2, "{\"state\":\"running\",\"ports\":{\"web\":%d,\"other\":4242}}", port);
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "POST", path, body2, &o), 200);
    cJSON_Delete(o);
    cJSON *j4 = ty_job_get(srv.url, team_tok, id);
    const cJSON *ports = cJSON_GetObjectItem(j4, "ports");
    ck_assert_int_eq(cJSON_GetArraySize(ports), 3);
    ck_assert_str_eq(ty_str(cJSON_GetArrayItem(ports, 0), "name"), "web");
    ck_assert_str_eq(ty_str(cJSON_GetArrayItem(ports, 1), "name"), "my-tb");
    ck_assert(ty_num(cJSON_GetArrayItem(ports, 1), "port") < 0); /* no longer the task's */
    ck_assert_str_eq(ty_str(cJSON_GetArrayItem(ports, 2), "name"), "other");
    ck_assert_int_eq((int)ty_num(cJSON_GetArrayItem(ports, 2), "port"), 4242);
    cJSON_Delete(j4);

    /* ended: no port of a node is listed any more */
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/cancel", (long long)id);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", path, NULL, &o), 200);
    cJSON_Delete(o);
    int gone = 0;
    for (int64_t e3 = mono_ms() + 30000; !gone && mono_ms() < e3; ty_sleep_ms(100)) {
        cJSON *j5 = NULL;
        gone = port_entry(id, "web", &j5) == NULL;
        if (gone) {
            const cJSON *first = cJSON_GetArrayItem(cJSON_GetObjectItem(j5, "ports"), 0);
            ck_assert_str_eq(ty_str(first, "name"), "web");
            ck_assert_str_eq(ty_str(first, "url"), want_url);
            ck_assert_ptr_null(cJSON_GetObjectItem(first, "node"));
        }
        cJSON_Delete(j5);
    }
    char *txt = job_text(id);
    ck_assert_msg(gone, "the ended job still lists a port: %.2000s", txt);
    free(txt);
}
END_TEST

/* A job's port through the server: /proxy/jobs/{id}/web/... reaches the
 * program, which sees its full path and none of the caller's credentials;
 * another team gets 404, a viewer may read but not write, an unknown port
 * is 404 naming the job's ports, a port nothing listens on is 502 with the
 * reason and the job runs on. */
/* One raw request to the server (head as given, "Host" added): the status,
 * with the answer's head and body in out. -1 when it cannot be sent. */
static int raw_request_to(const char *url, const char *method, const char *path, const char *headers, const char *body,
                          char *out, size_t cap) {
    int port = atoi(strrchr(url, ':') + 1);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in sa = {0};
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        close(fd);
        return -1;
    }
    char head[4096];
    int n = snprintf(head, sizeof head, "%s %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n%sContent-Length: %zu\r\n\r\n%s",
                     method, path, port, headers, body ? strlen(body) : 0, body ? body : "");
    if (n < 0 || (size_t)n >= sizeof head || write(fd, head, (size_t)n) != n) {
        close(fd);
        return -1;
    }
    size_t got = 0;
    ssize_t k;
    while (got + 1 < cap && (k = read(fd, out + got, cap - 1 - got)) > 0) got += (size_t)k;
    out[got] = '\0';
    close(fd);
    int status = -1;
    if (sscanf(out, "HTTP/1.%*d %d", &status) != 1) return -1;
    return status;
}

static int raw_request(const char *method, const char *path, const char *headers, const char *body, char *out,
                       size_t cap) {
    return raw_request_to(srv.url, method, path, headers, body, out, cap);
}

/* A ticket for job id's ports from POST /api/v1/jobs/{id}/proxy-session with
 * token, traded at base (the apps' origin, or the server's) for the grant's
 * cookie ("trainyard_proxy=..."), checking the 303 and the cookie's form. */
static void grant_cookie(const char *base, const char *token, int64_t id, char *cookie, size_t cap) {
    cJSON *o = NULL;
    char path[200];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/proxy-session", (long long)id);
    ck_assert_int_eq(ty_http(srv.url, token, "POST", path, NULL, &o), 201);
    ck_assert_str_eq(ty_str(o, "param"), "trainyard_grant");
    char ticket[64];
    snprintf(ticket, sizeof ticket, "%s", ty_str(o, "ticket"));
    cJSON_Delete(o);
    char *ans = malloc(65536);
    ck_assert_ptr_nonnull(ans);
    /* traded once, for a cookie and the same target without it */
    snprintf(path, sizeof path, "/proxy/jobs/%lld/web/tab?x=1&trainyard_grant=%s", (long long)id, ticket);
    ck_assert_int_eq(raw_request_to(base, "GET", path, "", NULL, ans, 65536), 303);
    char want[160];
    snprintf(want, sizeof want, "Location: /proxy/jobs/%lld/web/tab?x=1\r\n", (long long)id);
    ck_assert_msg(strcasestr(ans, want) != NULL, "%.600s", ans);
    const char *sc = strcasestr(ans, "Set-Cookie: trainyard_proxy=");
    ck_assert_msg(sc != NULL, "%.600s", ans);
    snprintf(cookie, cap, "%.*s", (int)strcspn(sc + 12, ";\r\n"), sc + 12);
    snprintf(want, sizeof want, "Path=/proxy/jobs/%lld/;", (long long)id);
    ck_assert_msg(strstr(sc, want) && strstr(sc, "HttpOnly") && strstr(sc, "SameSite=Lax"), "%.300s", sc);
    ck_assert_int_eq(raw_request_to(base, "GET", path, "", NULL, ans, 65536), 401);
    free(ans);
}

/* A command job serving tests/'s echo app on its port "web" (and declaring
 * "dead", which nothing serves), once the port is listed and answers. */
static int64_t echo_job(void) {
    char script[400], spec[1024];
    snprintf(script, sizeof script, "%s/echo.py", tmpdir);
    static const char py[] =
        "import http.server, os\n"
        "port = int(os.environ['TRAINYARD_PORT_WEB'])\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def answer(self):\n"
        "        n = int(self.headers.get('Content-Length') or 0)\n"
        "        got = self.rfile.read(n) if n else b''\n"
        "        body = ('%s %s\\n%s\\n' % (self.command, self.path, str(self.headers))).encode() + got\n"
        "        self.send_response(200)\n"
        "        self.send_header('Content-Length', str(len(body)))\n"
        "        self.end_headers()\n"
        "        self.wfile.write(body)\n"
        "    do_GET = do_POST = answer\n"
        "    def log_message(self, *a):\n"
        "        pass\n"
        "http.server.HTTPServer(('0.0.0.0', port), H).serve_forever()\n";
    ck_assert_int_eq(file_write_atomic(script, py, sizeof py - 1, 0644), 0);
    snprintf(spec, sizeof spec,
             "{\"name\":\"echo\",\"command\":{\"argv\":[\"/usr/bin/python3\",\"%s\"]},"
             "\"ports\":[{\"name\":\"web\",\"port\":8000},{\"name\":\"dead\",\"port\":9000}],\"max_restarts\":0}",
             script);
    int64_t id = ty_submit(srv.url, team_tok, spec);
    cJSON *job = NULL;
    const cJSON *web = NULL;
    for (int64_t end = mono_ms() + 60000; !(web = port_entry(id, "web", &job)) && mono_ms() < end;) {
        cJSON_Delete(job);
        ty_sleep_ms(100);
    }
    ck_assert_msg(web != NULL, "no port \"web\" listed within 60 s");
    char *direct = fetch_direct((int)ty_num(web, "port"), 30000);
    ck_assert_ptr_nonnull(direct);
    free(direct);
    cJSON_Delete(job);
    return id;
}

START_TEST(job_port_through_the_proxy) {
    int64_t id = echo_job();
    cJSON *job = NULL;

    char path[160];
    snprintf(path, sizeof path, "/proxy/jobs/%lld/web/hello/a%%20b?x=1", (long long)id);
    char *got = ty_http_text(srv.url, team_tok, path);
    char want[160];
    snprintf(want, sizeof want, "GET /proxy/jobs/%lld/web/hello/a%%20b?x=1\n", (long long)id);
    ck_assert_msg(strncmp(got, want, strlen(want)) == 0, "the app got: %.1000s", got);
    ck_assert_msg(strcasestr(got, "authorization") == NULL && strstr(got, team_tok) == NULL,
                  "the caller's token reached the app: %.1000s", got);
    snprintf(want, sizeof want, "X-Forwarded-Prefix: /proxy/jobs/%lld/web", (long long)id);
    ck_assert_msg(strstr(got, want) != NULL, "no %s: %.1000s", want, got);
    free(got);
    /* a POST's body goes up */
    cJSON *o = NULL;
    client c;
    ck_assert_int_eq(client_init(&c, srv.url, team_tok), 0);
    client_reply r;
    ck_assert_int_eq(client_request(&c, "POST", path, "{\"cell\":1}", 10, NULL, &r), 0);
    ck_assert_int_eq(r.status, 200);
    ck_assert_msg(r.body.data && strstr(r.body.data, "{\"cell\":1}"), "%.500s", r.body.data ? r.body.data : "");
    client_reply_release(&r);
    client_release(&c);
    /* the app's root without its slash: a redirect */
    snprintf(path, sizeof path, "/proxy/jobs/%lld/web", (long long)id);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", path, NULL, NULL), 308);

    /* another team: the job does not exist for it */
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "POST", "/api/v1/teams", "{\"name\":\"other\"}", &o), 201);
    char other[128];
    snprintf(other, sizeof other, "%s", ty_str(o, "token"));
    cJSON_Delete(o);
    snprintf(path, sizeof path, "/proxy/jobs/%lld/web/", (long long)id);
    ck_assert_int_eq(ty_http(srv.url, other, "GET", path, NULL, &o), 404);
    cJSON_Delete(o);
    /* a viewer reads, may not write */
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "POST", "/api/v1/users", "{\"name\":\"vi\"}", NULL), 201);
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "PUT", "/api/v1/teams/default/members/vi", "{\"role\":\"viewer\"}", NULL),
                     201);
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "POST", "/api/v1/users/vi/tokens", "{\"name\":\"t\"}", &o), 201);
    char vi[96];
    snprintf(vi, sizeof vi, "%s", ty_str(o, "token"));
    cJSON_Delete(o);
    got = ty_http_text(srv.url, vi, path);
    ck_assert_msg(strncmp(got, "GET /proxy/jobs/", 16) == 0, "%.300s", got);
    free(got);
    ck_assert_int_eq(ty_http(srv.url, vi, "POST", path, "{}", &o), 403);
    ty_assert_error(o, "forbidden", "role");
    cJSON_Delete(o);
    /* no such port: 404 naming the job's */
    snprintf(path, sizeof path, "/proxy/jobs/%lld/nope/", (long long)id);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", path, NULL, &o), 404);
    const char *msg = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "error"), "message")->valuestring;
    ck_assert_msg(strstr(msg, "web") && strstr(msg, "dead"), "%s", msg);
    cJSON_Delete(o);
    /* a port nothing listens on: 502 with the reason; the job runs on */
    snprintf(path, sizeof path, "/proxy/jobs/%lld/dead/", (long long)id);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", path, NULL, &o), 502);
    msg = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "error"), "message")->valuestring;
    ck_assert_msg(strstr(msg, "refused") != NULL, "%s", msg);
    cJSON_Delete(o);
    job = ty_job_get(srv.url, team_tok, id);
    ck_assert_str_eq(ty_str(job, "state"), "running");
    cJSON_Delete(job);

    /* a browser tab: a ticket traded once for a grant's cookie, which stands
     * for the token under the job's proxy path only; a change with it needs
     * this server's Origin, and it dies with the token */
    char *ans = malloc(65536), hdr[600], cookie[200] = "";
    ck_assert_ptr_nonnull(ans);
    grant_cookie(srv.url, vi, id, cookie, sizeof cookie);
    /* a ticket is good under its own job's path only */
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/proxy-session", (long long)id);
    ck_assert_int_eq(ty_http(srv.url, vi, "POST", path, NULL, &o), 201);
    snprintf(path, sizeof path, "/proxy/jobs/%lld/web/?trainyard_grant=%s", (long long)id + 1000, ty_str(o, "ticket"));
    cJSON_Delete(o);
    ck_assert_int_eq(raw_request("GET", path, "", NULL, ans, 65536), 401);
    snprintf(hdr, sizeof hdr, "Cookie: %s\r\n", cookie);
    snprintf(path, sizeof path, "/proxy/jobs/%lld/web/tab", (long long)id);
    ck_assert_int_eq(raw_request("GET", path, hdr, NULL, ans, 65536), 200);
    ck_assert_msg(strstr(ans, "GET /proxy/jobs/") && !strstr(ans, cookie + 16), "the app saw the grant: %.2000s", ans);
    /* not a key to the API */
    snprintf(path, sizeof path, "/api/v1/jobs/%lld", (long long)id);
    ck_assert_int_eq(raw_request("GET", path, hdr, NULL, ans, 65536), 401);
    /* a viewer's grant writes nothing; a member's with another site's Origin neither */
    snprintf(path, sizeof path, "/proxy/jobs/%lld/web/tab", (long long)id);
    snprintf(hdr, sizeof hdr, "Cookie: %s\r\nOrigin: http://127.0.0.1:%s\r\n", cookie, strrchr(srv.url, ':') + 1);
    ck_assert_int_eq(raw_request("POST", path, hdr, "{}", ans, 65536), 403);
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "PUT", "/api/v1/teams/default/members/vi", "{\"role\":\"member\"}", NULL),
                     200);
    ck_assert_int_eq(raw_request("POST", path, hdr, "{}", ans, 65536), 200);
    snprintf(hdr, sizeof hdr, "Cookie: %s\r\nOrigin: http://evil.example\r\n", cookie);
    ck_assert_int_eq(raw_request("POST", path, hdr, "{}", ans, 65536), 403);
    ck_assert_msg(strstr(ans, "\"Origin\""), "%.500s", ans);
    /* revoked: the grant goes with the token at once */
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "DELETE", "/api/v1/teams/default/members/vi", NULL, NULL), 204);
    snprintf(hdr, sizeof hdr, "Cookie: %s\r\n", cookie);
    int st = raw_request("GET", path, hdr, NULL, ans, 65536);
    ck_assert_msg(st == 403 || st == 404 || st == 401, "a removed member's grant answered %d", st);
    free(ans);
}
END_TEST

/* server --apps-listen: a job's apps on an origin of their own. A browser
 * (no Authorization) sent to the proxy's paths on the API's origin is
 * redirected there; a bearer token is served where it asks; the apps'
 * origin serves no dashboard, no API and no session cookie, only the
 * proxy, with tickets traded there for grants. */
static char g_apps[160];

static void apps_setup(void) {
    memset(&srv, 0, sizeof srv);
    ty_mkdtemp(srv.dir, sizeof srv.dir, "apps");
    ty_mkdtemp_shared(tmpdir, sizeof tmpdir, "appstmp");
    const char *extra[] = {"--cpu-slots", "2", "--apps-listen", "127.0.0.1:0", NULL};
    ty_server_start_args(&srv, "up", extra);
    ty_token(&srv, "token", team_tok, sizeof team_tok);
    ty_token(&srv, "admin.token", admin_tok, sizeof admin_tok);
    char path[300];
    snprintf(path, sizeof path, "%s/apps.url", srv.dir);
    size_t n = 0;
    char *u = file_read_all(path, 4096, &n);
    ck_assert_msg(u != NULL, "no %s", path);
    snprintf(g_apps, sizeof g_apps, "%.*s", (int)strcspn(u, "\n"), u);
    free(u);
    ck_assert_msg(strncmp(g_apps, "http://127.0.0.1:", 17) == 0 && strcmp(g_apps, srv.url) != 0, "%s", g_apps);
}

START_TEST(apps_on_their_own_origin) {
    int64_t id = echo_job();
    char *ans = malloc(65536), path[200], hdr[800], want[300], cookie[200];
    ck_assert_ptr_nonnull(ans);
    /* a browser at the API's origin: sent to the apps' (path and query kept) */
    snprintf(path, sizeof path, "/proxy/jobs/%lld/web/page?q=1", (long long)id);
    ck_assert_int_eq(raw_request("GET", path, "", NULL, ans, 65536), 307);
    snprintf(want, sizeof want, "Location: %s/proxy/jobs/%lld/web/page?q=1\r\n", g_apps, (long long)id);
    ck_assert_msg(strcasestr(ans, want) != NULL, "%.500s", ans);
    /* a bearer token is no page's: served at the API's origin as before */
    snprintf(hdr, sizeof hdr, "Authorization: Bearer %s\r\n", team_tok);
    ck_assert_int_eq(raw_request("GET", path, hdr, NULL, ans, 65536), 200);
    /* the proxy-session names the apps' origin; its ticket is traded there */
    cJSON *o = NULL;
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/proxy-session", (long long)id);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", path, NULL, &o), 201);
    ck_assert_str_eq(ty_str(o, "apps_url"), g_apps);
    cJSON_Delete(o);
    grant_cookie(g_apps, team_tok, id, cookie, sizeof cookie);
    snprintf(hdr, sizeof hdr, "Cookie: %s\r\n", cookie);
    snprintf(path, sizeof path, "/proxy/jobs/%lld/web/tab", (long long)id);
    ck_assert_int_eq(raw_request_to(g_apps, "GET", path, hdr, NULL, ans, 65536), 200);
    ck_assert_msg(strstr(ans, "GET /proxy/jobs/") != NULL, "%.500s", ans);
    /* a change from the apps' own pages, with the cookie: their Origin */
    snprintf(hdr, sizeof hdr, "Cookie: %s\r\nOrigin: %s\r\n", cookie, g_apps);
    ck_assert_int_eq(raw_request_to(g_apps, "POST", path, hdr, "{}", ans, 65536), 200);
    snprintf(hdr, sizeof hdr, "Cookie: %s\r\nOrigin: %s\r\n", cookie, srv.url);
    ck_assert_int_eq(raw_request_to(g_apps, "POST", path, hdr, "{}", ans, 65536), 403);
    /* nothing else there: no dashboard, no API, no session cookie */
    ck_assert_int_eq(raw_request_to(g_apps, "GET", "/", "", NULL, ans, 65536), 404);
    snprintf(hdr, sizeof hdr, "Authorization: Bearer %s\r\n", team_tok);
    ck_assert_int_eq(raw_request_to(g_apps, "GET", "/api/v1/jobs", hdr, NULL, ans, 65536), 404);
    ck_assert_int_eq(raw_request_to(g_apps, "GET", path, "Cookie: trainyard_session=tys_x\r\n", NULL, ans, 65536), 401);
    free(ans);
}
END_TEST

/* Before it runs, a job lists the ports it declares with their url only;
 * bad port specs are 422s naming the field, and store nothing. */
START_TEST(declared_before_it_runs_and_bad_specs) {
    /* a GPU no node here has: queued, never placed */
    int64_t id = ty_submit(srv.url, team_tok,
                           "{\"name\":\"queued\",\"command\":{\"argv\":[\"true\"]},\"queue_if_infeasible\":true,"
                           "\"resources\":{\"device\":\"gpu\"},\"ports\":[{\"name\":\"tensorboard\",\"port\":6006}]}");
    cJSON *job = ty_job_get(srv.url, team_tok, id);
    ck_assert_str_eq(ty_str(job, "state"), "queued");
    const cJSON *ports = cJSON_GetObjectItem(job, "ports");
    ck_assert_int_eq(cJSON_GetArraySize(ports), 1);
    const cJSON *p = cJSON_GetArrayItem(ports, 0);
    ck_assert_str_eq(ty_str(p, "name"), "tensorboard");
    char want_url[96];
    snprintf(want_url, sizeof want_url, "/proxy/jobs/%lld/tensorboard/", (long long)id);
    ck_assert_str_eq(ty_str(p, "url"), want_url);
    ck_assert_ptr_null(cJSON_GetObjectItem(p, "port"));
    ck_assert_ptr_null(cJSON_GetObjectItem(p, "node"));
    cJSON_Delete(job);
    /* a job without ports lists none */
    int64_t plain = ty_submit(srv.url, team_tok,
                              "{\"name\":\"plain\",\"command\":{\"argv\":[\"true\"]},\"queue_if_infeasible\":true,"
                              "\"resources\":{\"device\":\"gpu\"}}");
    job = ty_job_get(srv.url, team_tok, plain);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(job, "ports")), 0);
    cJSON_Delete(job);

    static const char *const bad[][3] = {
        {"{\"command\":{\"argv\":[\"x\"]},\"ports\":[{\"name\":\"tb\",\"port\":6006},{\"name\":\"ui\",\"port\":0}]}",
         "invalid_value", "ports[1].port"},
        {"{\"command\":{\"argv\":[\"x\"]},\"ports\":[{\"name\":\"Tb\",\"port\":6006}]}", "invalid_value",
         "ports[0].name"},
        {"{\"command\":{\"argv\":[\"x\"]},\"ports\":[{\"name\":\"tb\",\"port\":1},{\"name\":\"tb\",\"port\":2}]}",
         "invalid_value", "ports[1].name"},
        {"{\"command\":{\"argv\":[\"x\"]},\"ports\":[{\"port\":1}]}", "missing_field", "ports[0].name"},
        {"{\"command\":{\"argv\":[\"x\"]},\"ports\":[{\"name\":\"tb\",\"port\":\"1\"}]}", "invalid_type",
         "ports[0].port"},
        {"{\"command\":{\"argv\":[\"x\"]},\"ports\":{}}", "invalid_type", "ports"},
        {"{\"interactive\":{\"type\":\"notebook\"},\"command\":{\"argv\":[\"x\"]}}", "invalid_value", "command"},
        {"{\"command\":{\"argv\":[\"x\"]},\"idle_timeout\":\"30m\"}", "invalid_value", "idle_timeout"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        expect_422(team_tok, "/api/v1/jobs", bad[i][0], bad[i][1], bad[i][2]);
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", "/api/v1/jobs", NULL, &o), 200);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(o, "jobs")), 2); /* the two above */
    cJSON_Delete(o);
}
END_TEST

int main(void) {
    Suite *s = suite_create("ports");
    TCase *store = ty_tcase(s, "store", store_setup, store_teardown, 30);
    tcase_add_test(store, set_find_live_lowest_and_have);
    tcase_add_test(store, list_live_ports);
    tcase_add_test(store, running_report_writes_ports);
    TCase *e2e = ty_tcase(s, "e2e", up_setup, up_teardown, 180);
    tcase_add_test(e2e, declared_before_it_runs_and_bad_specs);
    tcase_add_test(e2e, command_job_serves_its_port);
    tcase_add_test(e2e, job_port_through_the_proxy);
    TCase *apps = tcase_create("apps");
    tcase_add_checked_fixture(apps, apps_setup, up_teardown);
    tcase_set_timeout(apps, 180);
    tcase_add_test(apps, apps_on_their_own_origin);
    suite_add_tcase(s, apps);
    return ty_run_suite(s);
}
