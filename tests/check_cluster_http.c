/* check_cluster_http.c - the cluster API through the real server binary:
 * nodes registered by the test itself (node token), re-registration by
 * hostname, heartbeats, GET /cluster with holders and utilisation, jobs
 * placed by the scheduler thread, GET /queue with reasons and estimated
 * starts, team shares (admin only), admission 422 with the numbers, and the
 * errors naming their field. Needs api_cluster_routes in api/routes.c. */
#include "testlib.h"

static ty_proc srv;
static char team_tok[128], admin_tok[128], node_tok[128]; /* node_tok: the join token (node.token) */
static char last_tok[128], prev_tok[128]; /* the tokens the last two registrations answered */

static const char SPEC_FMT[] =
    "{\"name\":\"syn\",\"model\":{\"layers\":[{\"type\":\"dense\",\"units\":1,\"activation\":\"sigmoid\","
    "\"input_shape\":[10]}]},\"compile\":{\"optimizer\":{\"type\":\"sgd\"},\"loss\":\"binary_crossentropy\"},"
    "\"data\":{\"source\":\"synthetic\",\"examples\":64,\"features\":10},\"fit\":{\"epochs\":1,\"batch_size\":32},"
    "\"strategy\":{\"type\":\"%s\"},\"resources\":{\"workers\":%d,\"devices_per_worker\":%d,\"device\":\"gpu\"}%s}";

static void start(void)
{
    memset(&srv, 0, sizeof srv);
    ty_mkdtemp(srv.dir, sizeof srv.dir, "clhttp");
    ty_server_start(&srv);
    ty_token(&srv, "token", team_tok, sizeof team_tok);
    ty_token(&srv, "admin.token", admin_tok, sizeof admin_tok);
    ty_token(&srv, "node.token", node_tok, sizeof node_tok);
}

static void stop(void)
{
    ty_kill(&srv, SIGTERM);
    ty_rmrf(srv.dir);
}

static char *spec(int workers, int dpw, const char *extra)
{
    static char s[2048];
    snprintf(s, sizeof s, SPEC_FMT, workers > 1 ? "multi_worker_mirrored" : dpw > 1 ? "mirrored" : "one_device", workers,
             dpw, extra);
    return s;
}

static int64_t register_node(const char *host, int gpus, long expect)
{
    char body[2048];
    int n = snprintf(body, sizeof body, "{\"hostname\":\"%s\",\"address\":\"10.0.0.9\",\"cpu_slots\":4,\"devices\":[", host);
    for (int g = 0; g < gpus; g++)
        n += snprintf(body + n, sizeof body - (size_t)n, "%s{\"kind\":\"gpu\",\"index\":%d,\"model\":\"NVIDIA H100\",\"memory_mb\":81559}",
                      g ? "," : "", g);
    snprintf(body + n, sizeof body - (size_t)n, "]}");
    cJSON *o = NULL;
    long st = ty_http(srv.url, node_tok, "POST", "/api/v1/nodes", body, &o);
    ck_assert_msg(st == expect, "POST /nodes answered %ld", st);
    int64_t id = (int64_t)cJSON_GetObjectItem(o, "id")->valuedouble;
    cJSON *tok = cJSON_GetObjectItem(o, "token");
    ck_assert_msg(cJSON_IsString(tok) && strlen(tok->valuestring) >= 32, "POST /nodes answered no node token");
    snprintf(prev_tok, sizeof prev_tok, "%s", last_tok);
    snprintf(last_tok, sizeof last_tok, "%s", tok->valuestring);
    cJSON_Delete(o);
    return id;
}

static const char *job_state(int64_t id, char *out, size_t cap)
{
    char path[64];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld", (long long)id);
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", path, NULL, &o), 200);
    snprintf(out, cap, "%s", cJSON_GetObjectItem(o, "state")->valuestring);
    cJSON_Delete(o);
    return out;
}

static int64_t submit(const char *s, long expect)
{
    cJSON *o = NULL;
    long st = ty_http(srv.url, team_tok, "POST", "/api/v1/jobs", s, &o);
    if (st != expect) {
        char *txt = cJSON_PrintUnformatted(o);
        ck_abort_msg("submit answered %ld: %s", st, txt);
    }
    int64_t id = 0;
    if (st == 201) id = (int64_t)cJSON_GetObjectItem(o, "id")->valuedouble;
    cJSON_Delete(o);
    return id;
}

START_TEST(queue_before_nodes_then_placed)
{
    cJSON *o = NULL;
    ck_assert_msg(ty_http(srv.url, team_tok, "GET", "/api/v1/cluster", NULL, &o) == 200,
                  "GET /cluster is not routed: add api_cluster_routes to api_route_tables in api/routes.c");
    cJSON_Delete(o);
    int64_t j = submit(spec(2, 2, ""), 201);
    char st[32];
    /* no node yet: it waits, and says so */
    for (int i = 0; i < 100; i++) {
        ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", "/api/v1/queue", NULL, &o), 200);
        cJSON *jobs = cJSON_GetObjectItem(o, "jobs");
        ck_assert_int_eq(cJSON_GetArraySize(jobs), 1);
        cJSON *e = cJSON_GetArrayItem(jobs, 0);
        ck_assert_int_eq((int64_t)cJSON_GetObjectItem(e, "id")->valuedouble, j);
        ck_assert_str_eq(cJSON_GetObjectItem(e, "reason")->valuestring, "no nodes have joined");
        cJSON_Delete(o);
        break;
    }
    int64_t n1 = register_node("gpu-a", 4, 201);
    ck_assert_int_eq(register_node("gpu-a", 4, 200), n1);      /* same hostname: same node */
    char n1tok[128], n1old[128];                                 /* its tokens: new, revoked */
    snprintf(n1tok, sizeof n1tok, "%s", last_tok);
    snprintf(n1old, sizeof n1old, "%s", prev_tok);
    ck_assert_str_ne(n1tok, n1old);
    for (int i = 0; i < 200 && strcmp(job_state(j, st, sizeof st), "queued") == 0; i++) ty_sleep_ms(50);
    ck_assert_str_eq(st, "starting");
    /* GET /cluster: the node, its GPUs and who holds them */
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", "/api/v1/cluster", NULL, &o), 200);
    cJSON *u = cJSON_GetObjectItem(o, "utilisation");
    ck_assert_int_eq(cJSON_GetObjectItem(u, "gpus")->valueint, 4);
    ck_assert_int_eq(cJSON_GetObjectItem(u, "gpus_used")->valueint, 4);
    cJSON *node = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "nodes"), 0);
    ck_assert_str_eq(cJSON_GetObjectItem(node, "hostname")->valuestring, "gpu-a");
    cJSON *g0 = cJSON_GetArrayItem(cJSON_GetObjectItem(node, "gpus"), 0);
    ck_assert_int_eq((int64_t)cJSON_GetObjectItem(g0, "job")->valuedouble, j);
    ck_assert_str_eq(cJSON_GetObjectItem(g0, "model")->valuestring, "NVIDIA H100");
    cJSON_Delete(o);
    /* a second job waits with the reason people read, and an estimated start */
    int64_t j2 = submit(spec(1, 4, ""), 201);
    ty_sleep_ms(300);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", "/api/v1/queue", NULL, &o), 200);
    cJSON *e = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "jobs"), 0);
    ck_assert_int_eq((int64_t)cJSON_GetObjectItem(e, "id")->valuedouble, j2);
    ck_assert_str_eq(cJSON_GetObjectItem(e, "reason")->valuestring,
                     "needs 4 gpu on one node; largest free block is 0");
    ck_assert(cJSON_IsString(cJSON_GetObjectItem(e, "estimated_start")));
    ck_assert_int_eq(cJSON_GetObjectItem(e, "position")->valueint, 1);
    cJSON_Delete(o);
    /* heartbeat */
    char path[64];
    snprintf(path, sizeof path, "/api/v1/nodes/%lld/heartbeat", (long long)n1);
    /* heartbeats take the node's own token (the re-registration's: the
     * first one was revoked by it); the join token only registers */
    ck_assert_int_eq(ty_http(srv.url, n1tok, "POST", path, NULL, &o), 200);
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, n1old, "POST", path, NULL, &o), 401);
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, node_tok, "POST", path, NULL, &o), 403);
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, n1tok, "POST", "/api/v1/nodes/999/heartbeat", NULL, &o), 403);
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "POST", "/api/v1/nodes/999/heartbeat", NULL, &o), 404);
    cJSON_Delete(o);
}
END_TEST

START_TEST(admission_and_errors)
{
    register_node("gpu-b", 8, 201);
    cJSON *o = NULL;
    /* a worker wider than any node: 422 infeasible with the numbers */
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", "/api/v1/jobs", spec(1, 16, ""), &o), 422);
    cJSON *err = cJSON_GetObjectItem(o, "error");
    ck_assert_str_eq(cJSON_GetObjectItem(err, "code")->valuestring, "infeasible");
    ck_assert_msg(strstr(cJSON_GetObjectItem(err, "message")->valuestring, "needs 16 gpu on one node; the largest node has 8"),
                  "%s", cJSON_GetObjectItem(err, "message")->valuestring);
    cJSON_Delete(o);
    /* ... unless it asks to queue */
    int64_t j = submit(spec(1, 16, ",\"queue_if_infeasible\":true"), 201);
    (void)j;
    /* Fragmentation: 20 gpu in all (8 + 6 + 6), but an 8-gpu worker fits on one node only. */
    register_node("gpu-c", 6, 201);
    register_node("gpu-d", 6, 201);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", "/api/v1/jobs", spec(2, 8, ""), &o), 422);
    ty_assert_error(o, "infeasible", "resources.workers");
    cJSON_Delete(o);
    submit(spec(4, 4, ""), 201); /* 4-gpu workers: 2 + 1 + 1 fit */
    /* node registration errors name the field */
    ck_assert_int_eq(ty_http(srv.url, node_tok, "POST", "/api/v1/nodes",
                             "{\"hostname\":\"x\",\"address\":\"a\",\"devices\":[{\"kind\":\"gpu\"}]}", &o), 422);
    ty_assert_error(o, "missing_field", "devices[0].index");
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, node_tok, "POST", "/api/v1/nodes",
                             "{\"hostname\":\"x\",\"address\":\"a\",\"colour\":1}", &o), 422);
    ty_assert_error(o, "unknown_field", "colour");
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, node_tok, "POST", "/api/v1/nodes",
                             "{\"hostname\":\"x\",\"address\":\"a\",\"cpu_slots\":-1}", &o), 422);
    ty_assert_error(o, "invalid_value", "cpu_slots");
    cJSON_Delete(o);
    /* a team token may not register nodes */
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", "/api/v1/nodes", "{\"hostname\":\"x\",\"address\":\"a\"}", &o), 403);
    cJSON_Delete(o);
}
END_TEST

START_TEST(team_shares_admin_only)
{
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "PATCH", "/api/v1/teams/default", "{\"quota\":4}", &o), 403);
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "PATCH", "/api/v1/teams/default",
                             "{\"weight\":2,\"guarantee\":2,\"quota\":4}", &o), 200);
    ck_assert_int_eq(cJSON_GetObjectItem(o, "quota")->valueint, 4);
    ck_assert_int_eq(cJSON_GetObjectItem(o, "guarantee")->valueint, 2);
    ck_assert(cJSON_GetObjectItem(o, "weight")->valuedouble == 2.0);
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "PATCH", "/api/v1/teams/default", "{\"guarantee\":8}", &o), 422);
    ty_assert_error(o, "invalid_value", "guarantee");
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "PATCH", "/api/v1/teams/default", "{\"weight\":0}", &o), 422);
    ty_assert_error(o, "invalid_value", "weight");
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "PATCH", "/api/v1/teams/nobody", "{\"weight\":1}", &o), 404);
    cJSON_Delete(o);
    /* the quota holds: 4 gpus in use at most */
    register_node("gpu-c", 8, 201);
    /* a first, alone: had one pass seen both, b (within the team's guarantee of 2) would go
     * first and a (4 more) wait for the quota, a legitimate order that this test is not about */
    int64_t a = submit(spec(1, 4, ""), 201);
    char st[32];
    for (int i = 0; i < 200 && strcmp(job_state(a, st, sizeof st), "queued") == 0; i++) ty_sleep_ms(50);
    if (strcmp(st, "starting") != 0) {
        ck_assert_int_eq(ty_http(srv.url, admin_tok, "GET", "/api/v1/queue", NULL, &o), 200);
        char *txt = cJSON_PrintUnformatted(o);
        ck_abort_msg("job %lld is %s: %s", (long long)a, st, txt);
    }
    int64_t b = submit(spec(1, 2, ""), 201);
    ty_sleep_ms(300);
    ck_assert_str_eq(job_state(b, st, sizeof st), "queued");
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", "/api/v1/queue", NULL, &o), 200);
    cJSON *e = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "jobs"), 0);
    ck_assert_str_eq(cJSON_GetObjectItem(e, "reason")->valuestring, "team quota 4/4");
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "PATCH", "/api/v1/teams/default", "{\"quota\":null}", &o), 200);
    ck_assert(cJSON_IsNull(cJSON_GetObjectItem(o, "quota")));
    cJSON_Delete(o);
    for (int i = 0; i < 200 && strcmp(job_state(b, st, sizeof st), "queued") == 0; i++) ty_sleep_ms(50);
    ck_assert_str_eq(st, "starting");
}
END_TEST

/* An admin drains a node: no new task goes there, its heartbeats say so;
 * back in service, the waiting job is placed. */
START_TEST(drained_node_takes_no_task)
{
    int64_t n = register_node("gpu-drain", 8, 201);
    char tok[128], path[96];
    snprintf(tok, sizeof tok, "%s", last_tok);
    cJSON *o = NULL;
    snprintf(path, sizeof path, "/api/v1/nodes/%lld/drain", (long long)n);
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "POST", path, NULL, &o), 200);
    ck_assert_str_eq(cJSON_GetObjectItem(o, "state")->valuestring, "drained");
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", path, NULL, &o), 403);
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "POST", "/api/v1/nodes/999/drain", NULL, &o), 404);
    cJSON_Delete(o);
    char hb[96];
    snprintf(hb, sizeof hb, "/api/v1/nodes/%lld/heartbeat", (long long)n);
    ck_assert_int_eq(ty_http(srv.url, tok, "POST", hb, "{}", &o), 200);
    ck_assert_str_eq(cJSON_GetObjectItem(o, "state")->valuestring, "drained");
    cJSON_Delete(o);
    int64_t j = submit(spec(1, 2, ""), 201);
    ty_sleep_ms(1500); /* a scheduler tick or more */
    char st[32];
    ck_assert_str_eq(job_state(j, st, sizeof st), "queued");
    /* the node's own token puts it back */
    ck_assert_int_eq(ty_http(srv.url, tok, "DELETE", path, NULL, &o), 200);
    ck_assert_str_eq(cJSON_GetObjectItem(o, "state")->valuestring, "ready");
    cJSON_Delete(o);
    for (int i = 0; i < 200 && strcmp(job_state(j, st, sizeof st), "queued") == 0; i++) ty_sleep_ms(50);
    ck_assert_str_eq(st, "starting");
    ck_assert_int_eq(ty_http(srv.url, tok, "POST", hb, "{}", &o), 200);
    ck_assert_str_eq(cJSON_GetObjectItem(o, "state")->valuestring, "ready");
    cJSON_Delete(o);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("cluster_http");
    TCase *tc = tcase_create("api");
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, start, stop);
    tcase_add_test(tc, queue_before_nodes_then_placed);
    tcase_add_test(tc, admission_and_errors);
    tcase_add_test(tc, team_shares_admin_only);
    tcase_add_test(tc, drained_node_takes_no_task);
    suite_add_tcase(s, tc);
    return ty_run_suite(s);
}
