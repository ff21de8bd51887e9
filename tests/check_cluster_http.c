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
    ck_assert_int_eq(ty_http(srv.url, n1tok, "POST", path, "{}", &o), 200);
    cJSON_Delete(o);
    /* its body is JSON, as api/openapi.json says: another type is 415 */
    {
        client c;
        client_reply r;
        ck_assert_int_eq(client_init(&c, srv.url, n1tok), 0);
        ck_assert_int_eq(client_request(&c, "POST", path, "{}", 2, "text/html", &r), 0);
        client_release(&c);
        ck_assert_int_eq(r.status, 415);
        o = cJSON_ParseWithLength(r.body.data, r.body.len);
        ty_assert_error(o, "unsupported_media_type", NULL);
        cJSON_Delete(o);
        client_reply_release(&r);
    }
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

/* Admission keeps the cluster's capacity between submissions
 * (store_cluster_capacity): a node that registers, drains or comes back is
 * seen by the very next submission, not a second later. */
START_TEST(admission_follows_nodes)
{
    register_node("cap-a", 2, 201);
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", "/api/v1/jobs", spec(1, 4, ""), &o), 422);
    ty_assert_error(o, "infeasible", "resources.devices_per_worker");
    cJSON_Delete(o);
    int64_t b = register_node("cap-b", 4, 201);
    submit(spec(1, 4, ""), 201); /* at once: the new node counts */
    char path[96];
    snprintf(path, sizeof path, "/api/v1/nodes/%lld/drain", (long long)b);
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "POST", path, NULL, &o), 200);
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", "/api/v1/jobs", spec(1, 4, ""), &o), 422);
    ty_assert_error(o, "infeasible", "resources.devices_per_worker");
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "DELETE", path, NULL, &o), 200);
    cJSON_Delete(o);
    submit(spec(1, 4, ""), 201);
}
END_TEST

/* A GPU job asking `memory` per task (NULL: not given), one worker of dpw gpus. */
static char *spec_mem(int dpw, const char *memory, const char *extra)
{
    static char s[2048];
    char res[128];
    if (memory) snprintf(res, sizeof res, ",\"memory\":\"%s\"", memory);
    else res[0] = '\0';
    snprintf(s, sizeof s,
             "{\"name\":\"mem\",\"model\":{\"layers\":[{\"type\":\"dense\",\"units\":1,\"activation\":\"sigmoid\","
             "\"input_shape\":[10]}]},\"compile\":{\"optimizer\":{\"type\":\"sgd\"},\"loss\":\"binary_crossentropy\"},"
             "\"data\":{\"source\":\"synthetic\",\"examples\":64,\"features\":10},\"fit\":{\"epochs\":1,\"batch_size\":32},"
             "\"strategy\":{\"type\":\"%s\"},\"resources\":{\"workers\":1,\"devices_per_worker\":%d,\"device\":\"gpu\"%s}%s}",
             dpw > 1 ? "mirrored" : "one_device", dpw, res, extra);
    return s;
}

/* The node `host` as GET /cluster shows it (the caller cJSON_Delete()s *all). */
static cJSON *cluster_node(const char *host, cJSON **all)
{
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", "/api/v1/cluster", NULL, all), 200);
    cJSON *n = NULL;
    cJSON_ArrayForEach(n, cJSON_GetObjectItem(*all, "nodes"))
        if (strcmp(cJSON_GetObjectItem(n, "hostname")->valuestring, host) == 0) return n;
    ck_abort_msg("no node %s in GET /cluster", host);
    return NULL;
}

static char *jobs_text(void)
{
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", "/api/v1/jobs", NULL, &o), 200);
    char *t = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    ck_assert_ptr_nonnull(t);
    return t;
}

/* The memory_mb of the start items the node's agent is handed, by job. */
static int64_t handed_memory(int64_t node, const char *tok, int64_t job)
{
    char path[96];
    snprintf(path, sizeof path, "/api/v1/nodes/%lld/assignments?wait=5", (long long)node);
    for (int tries = 0; tries < 10; tries++) {
        cJSON *o = NULL;
        ck_assert_int_eq(ty_http(srv.url, tok, "GET", path, NULL, &o), 200);
        cJSON *it = NULL;
        cJSON_ArrayForEach(it, cJSON_GetObjectItem(o, "start")) {
            if ((int64_t)cJSON_GetObjectItem(it, "job")->valuedouble != job) continue;
            cJSON *m = cJSON_GetObjectItem(cJSON_GetObjectItem(it, "config"), "memory_mb");
            ck_assert(cJSON_IsNumber(m));
            int64_t v = (int64_t)m->valuedouble;
            cJSON_Delete(o);
            return v;
        }
        cJSON_Delete(o);
    }
    ck_abort_msg("job %lld was never handed to node %lld", (long long)job, (long long)node);
    return -1;
}

/* A node reports its memory and isolation; GET /cluster shows them and the
 * memory the placed tasks hold; a job asking more memory than any node
 * offers is refused with the field named and nothing stored; the agent is
 * handed each task's memory; a bad isolation report is a 422. */
START_TEST(node_memory_and_isolation)
{
    static const char iso[] = "{\"mode\":\"user\",\"cgroup\":\"v2\",\"enforced\":[\"uid\",\"private_tmp\",\"memory\"]}";
    char body[1024];
    snprintf(body, sizeof body,
             "{\"hostname\":\"mem-a\",\"address\":\"10.0.0.7\",\"cpu_slots\":4,\"memory_mb\":24105,"
             "\"devices\":[{\"kind\":\"gpu\",\"index\":0},{\"kind\":\"gpu\",\"index\":1}],\"isolation\":%s}", iso);
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, node_tok, "POST", "/api/v1/nodes", body, &o), 201);
    int64_t nid = (int64_t)cJSON_GetObjectItem(o, "id")->valuedouble;
    char ntok[160];
    snprintf(ntok, sizeof ntok, "%s", cJSON_GetObjectItem(o, "token")->valuestring);
    ck_assert_int_eq(cJSON_GetObjectItem(o, "memory_mb")->valueint, 24105);
    cJSON_Delete(o);

    cJSON *n = cluster_node("mem-a", &o);
    ck_assert_int_eq((int64_t)cJSON_GetObjectItem(n, "memory_mb")->valuedouble, 24105);
    ck_assert_int_eq((int64_t)cJSON_GetObjectItem(n, "memory_used_mb")->valuedouble, 0);
    char *shown = cJSON_PrintUnformatted(cJSON_GetObjectItem(n, "isolation"));
    ck_assert_str_eq(shown, iso);
    free(shown);
    cJSON *u = cJSON_GetObjectItem(o, "utilisation");
    ck_assert_int_eq((int64_t)cJSON_GetObjectItem(u, "memory_mb")->valuedouble, 24105);
    ck_assert_int_eq((int64_t)cJSON_GetObjectItem(u, "memory_used_mb")->valuedouble, 0);
    cJSON_Delete(o);

    /* more memory per task than any node offers: 422 on resources.memory, nothing stored */
    char *before = jobs_text();
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", "/api/v1/jobs", spec_mem(1, "64GiB", ""), &o), 422);
    ty_assert_error(o, "infeasible", "resources.memory");
    const char *msg = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "error"), "message")->valuestring;
    ck_assert_msg(strstr(msg, "asks 65536 MiB per task; the largest node offers 24105 MiB"), "%s", msg);
    cJSON_Delete(o);
    char *after = jobs_text();
    ck_assert_str_eq(before, after);
    free(before); free(after);
    /* a bad size is the spec's 422, naming the field too */
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", "/api/v1/jobs", spec_mem(1, "8 gib", ""), &o), 422);
    ty_assert_error(o, "invalid_value", "resources.memory");
    cJSON_Delete(o);

    /* 8 GiB fits: placed; its task holds 8192 MiB of the node and is handed that limit */
    int64_t j = submit(spec_mem(1, "8GiB", ""), 201);
    char st[32];
    for (int i = 0; i < 200 && strcmp(job_state(j, st, sizeof st), "queued") == 0; i++) ty_sleep_ms(50);
    ck_assert_str_eq(st, "starting");
    n = cluster_node("mem-a", &o);
    ck_assert_int_eq((int64_t)cJSON_GetObjectItem(n, "memory_used_mb")->valuedouble, 8192);
    ck_assert_int_eq((int64_t)cJSON_GetObjectItem(cJSON_GetObjectItem(o, "utilisation"), "memory_used_mb")->valuedouble,
                     8192);
    cJSON_Delete(o);
    ck_assert_int_eq(handed_memory(nid, ntok, j), 8192);
    /* no memory asked: the node's default share, half its memory for one of its two gpus */
    int64_t j2 = submit(spec_mem(1, NULL, ""), 201);
    for (int i = 0; i < 200 && strcmp(job_state(j2, st, sizeof st), "queued") == 0; i++) ty_sleep_ms(50);
    ck_assert_str_eq(st, "starting");
    ck_assert_int_eq(handed_memory(nid, ntok, j2), 24105 / 2);
    n = cluster_node("mem-a", &o);
    ck_assert_int_eq((int64_t)cJSON_GetObjectItem(n, "memory_used_mb")->valuedouble, 8192 + 24105 / 2);
    cJSON_Delete(o);

    /* bad reports: 422 naming the field, and the node keeps what it had */
    static const struct { const char *extra, *code, *field; } bad[] = {
        {"\"isolation\":\"user\"", "invalid_type", "isolation"},
        {"\"isolation\":{\"mode\":\"root\"}", "invalid_value", "isolation.mode"},
        {"\"isolation\":{\"cgroup\":\"v2\"}", "missing_field", "isolation.mode"},
        {"\"isolation\":{\"mode\":\"user\",\"cgroup\":\"v3\"}", "invalid_value", "isolation.cgroup"},
        {"\"isolation\":{\"mode\":\"user\",\"enforced\":\"uid\"}", "invalid_type", "isolation.enforced"},
        {"\"isolation\":{\"mode\":\"user\",\"enforced\":[\"uid\",\"selinux\"]}", "invalid_value",
         "isolation.enforced[1]"},
        {"\"isolation\":{\"mode\":\"user\",\"enforced\":[\"uid\",7]}", "invalid_type", "isolation.enforced[1]"},
        {"\"isolation\":{\"mode\":\"user\",\"enforced\":[\"uid\",\"uid\"]}", "invalid_value", "isolation.enforced[1]"},
        {"\"isolation\":{\"mode\":\"none\",\"reason\":5}", "invalid_type", "isolation.reason"},
        {"\"isolation\":{\"mode\":\"none\",\"why\":\"x\"}", "unknown_field", "isolation.why"},
        {"\"memory_mb\":-1", "invalid_value", "memory_mb"},
        {"\"memory_mb\":1099511627777", "invalid_value", "memory_mb"},
        {"\"memory_mb\":\"24GiB\"", "invalid_type", "memory_mb"},
        {"\"tasks\":5", "invalid_type", "tasks"},
        {"\"tasks\":[3,\"x\"]", "invalid_value", "tasks[1]"},
        {"\"tasks\":[0]", "invalid_value", "tasks[0]"},
        {"\"tasks\":[1.5]", "invalid_value", "tasks[0]"},
    };
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        snprintf(body, sizeof body, "{\"hostname\":\"mem-a\",\"address\":\"10.0.0.7\",\"cpu_slots\":4,%s}",
                 bad[b].extra);
        ck_assert_int_eq(ty_http(srv.url, node_tok, "POST", "/api/v1/nodes", body, &o), 422);
        ty_assert_error(o, bad[b].code, bad[b].field);
        cJSON_Delete(o);
    }
    char longer[400];
    memset(longer, 'x', 257);
    longer[257] = '\0';
    snprintf(body, sizeof body, "{\"hostname\":\"mem-a\",\"address\":\"a\",\"isolation\":{\"mode\":\"none\",\"reason\":\"%s\"}}",
             longer);
    ck_assert_int_eq(ty_http(srv.url, node_tok, "POST", "/api/v1/nodes", body, &o), 422);
    ty_assert_error(o, "invalid_value", "isolation.reason");
    cJSON_Delete(o);
    n = cluster_node("mem-a", &o);
    ck_assert_int_eq((int64_t)cJSON_GetObjectItem(n, "memory_mb")->valuedouble, 24105);
    shown = cJSON_PrintUnformatted(cJSON_GetObjectItem(n, "isolation"));
    ck_assert_str_eq(shown, iso);
    free(shown);
    cJSON_Delete(o);

    /* an agent that says nothing: memory 0, isolation unknown; and a node that reports
     * no memory may hold any, so the 64 GiB job is admitted (it waits for its gpu) */
    ck_assert_int_eq(ty_http(srv.url, node_tok, "POST", "/api/v1/nodes",
                             "{\"hostname\":\"old-agent\",\"address\":\"10.0.0.8\",\"devices\":[{\"kind\":\"gpu\",\"index\":0}]}",
                             &o), 201);
    cJSON_Delete(o);
    n = cluster_node("old-agent", &o);
    ck_assert_int_eq((int64_t)cJSON_GetObjectItem(n, "memory_mb")->valuedouble, 0);
    ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(n, "isolation"), "mode")->valuestring, "unknown");
    cJSON_Delete(o);
    int64_t big = submit(spec_mem(1, "64GiB", ""), 201);
    for (int i = 0; i < 200 && strcmp(job_state(big, st, sizeof st), "queued") == 0; i++) ty_sleep_ms(50);
    ck_assert_str_eq(st, "starting");
    n = cluster_node("old-agent", &o);
    ck_assert_int_eq((int64_t)cJSON_GetObjectItem(n, "memory_used_mb")->valuedouble, 65536);
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
    tcase_add_test(tc, admission_follows_nodes);
    tcase_add_test(tc, node_memory_and_isolation);
    suite_add_tcase(s, tc);
    return ty_run_suite(s);
}
