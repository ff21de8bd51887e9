/* check_ports.c - a job's web ports (spec "ports", docs/jobspec.md).
 *
 * store: storage/ports_store.c on a real SQLite file: a task's ports
 * replaced (and cleared), the port named found on the job's live task with
 * the lowest id and its node's address, exited tasks left out, the names
 * the job declares when none serves it (spec first, then its tasks' rows),
 * the list of a job's live ports, and the running report's ports written in
 * the report's transaction (scheduler/lifecycle.c) and left alone for an
 * exited task. */
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
    int rc = sqlite3_exec(db_conn(g_db), sql, NULL, NULL, &err);
    ck_assert_msg(rc == SQLITE_OK, "%s: %s", sql, err ? err : "?");
    sqlite3_free(err);
}

static long count_rows(void) {
    sqlite3_stmt *st = NULL;
    ck_assert_int_eq(sqlite3_prepare_v2(db_conn(g_db), "SELECT count(*) FROM task_ports", -1, &st, NULL), SQLITE_OK);
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
    return sqlite3_last_insert_rowid(db_conn(g_db));
}

static int64_t insert_task(int64_t job, int idx, int64_t node, const char *state) {
    char sql[256];
    snprintf(sql, sizeof sql,
             "INSERT INTO tasks(job_id, attempt, type, idx, node_id, port, state, created_at)"
             " VALUES(%lld, 1, 'worker', %d, %lld, 0, '%s', 0)",
             (long long)job, idx, (long long)node, state);
    exec_sql(sql);
    return sqlite3_last_insert_rowid(db_conn(g_db));
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

int main(void) {
    Suite *s = suite_create("ports");
    TCase *store = ty_tcase(s, "store", store_setup, store_teardown, 30);
    tcase_add_test(store, set_find_live_lowest_and_have);
    tcase_add_test(store, list_live_ports);
    tcase_add_test(store, running_report_writes_ports);
    return ty_run_suite(s);
}
