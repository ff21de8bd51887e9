/* check_metrics.c - GET /metrics of the real `trainyard up` (server + local
 * agent) on loopback, parsed by the Prometheus client's own text parser
 * (tests/parse_metrics.py, Debian python3-prometheus-client): admin token
 * only; jobs by state and team after a job succeeded; queue length and
 * waits; devices and devices in use; samples/s of a running job; the
 * request latency histogram of the routes called; scheduler pass time. */
#include "testlib.h"
#include "../common/version.h"

static ty_proc srv;
static char team_tok[128], admin_tok[128];

static const char TINY[] =
    "{\"name\":\"%s\",\"model\":{\"layers\":[{\"type\":\"flatten\",\"input_shape\":[28,28]},"
    "{\"type\":\"dense\",\"units\":32,\"activation\":\"relu\"},{\"type\":\"dense\",\"units\":10,\"activation\":\"softmax\"}]},"
    "\"compile\":{\"optimizer\":{\"type\":\"adam\",\"learning_rate\":0.001},\"loss\":\"sparse_categorical_crossentropy\","
    "\"metrics\":[\"accuracy\"]},\"data\":{\"source\":\"fashion-mnist\",\"limit\":2000,\"validation_split\":0.1,\"seed\":7},"
    "\"fit\":{\"epochs\":%d,\"batch_size\":64},\"resources\":{\"workers\":1,\"devices_per_worker\":%d,\"device\":\"cpu\"},"
    "\"queue_if_infeasible\":true}";

static void start(void) {
    memset(&srv, 0, sizeof srv);
    ty_mkdtemp(srv.dir, sizeof srv.dir, "metrics");
    const char *extra[] = {"--cpu-slots", "1", NULL}; /* one job at a time: the next one waits */
    ty_server_start_args(&srv, "up", extra);
    ty_token(&srv, "token", team_tok, sizeof team_tok);
    ty_token(&srv, "admin.token", admin_tok, sizeof admin_tok);
}

static void stop(void) {
    ty_kill(&srv, SIGTERM);
    ty_rmrf(srv.dir);
}

static int64_t submit(const char *name, int epochs, int devices) {
    char spec[2048];
    snprintf(spec, sizeof spec, TINY, name, epochs, devices);
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", "/api/v1/jobs", spec, &o), 201);
    int64_t id = (int64_t)cJSON_GetObjectItem(o, "id")->valuedouble;
    cJSON_Delete(o);
    return id;
}

static const char *job_state(int64_t id) {
    static char st[16];
    char path[64];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld", (long long)id);
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", path, NULL, &o), 200);
    snprintf(st, sizeof st, "%s", cJSON_GetObjectItem(o, "state")->valuestring);
    cJSON_Delete(o);
    return st;
}

/* Scrapes /metrics and parses it; returns the samples (array of objects). */
static cJSON *scrape(void) {
    client c;
    ck_assert_int_eq(client_init(&c, srv.url, admin_tok), 0);
    client_reply r;
    ck_assert_int_eq(client_request(&c, "GET", "/metrics", NULL, 0, NULL, &r), 0);
    client_release(&c);
    ck_assert_int_eq(r.status, 200);
    char path[400], cmd[1024];
    snprintf(path, sizeof path, "%s/metrics.txt", srv.dir);
    ck_assert_int_eq(file_write_atomic(path, r.body.data, r.body.len, 0600), 0);
    client_reply_release(&r);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/parse_metrics.py '%s'", path);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    cJSON *all = cJSON_CreateArray();
    char line[4096];
    while (fgets(line, sizeof line, p)) {
        cJSON *s = cJSON_Parse(line);
        ck_assert_msg(s != NULL, "parser output: %s", line);
        cJSON_AddItemToArray(all, s);
    }
    int st = pclose(p);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the Prometheus parser refused /metrics (see %s)", path);
    return all;
}

/* The value of the sample name{k1=v1,k2=v2} (k2 may be NULL), or -1 when absent. */
static double value(cJSON *all, const char *name, const char *k1, const char *v1, const char *k2, const char *v2) {
    cJSON *s;
    cJSON_ArrayForEach(s, all) {
        if (strcmp(cJSON_GetObjectItem(s, "name")->valuestring, name) != 0) continue;
        cJSON *l = cJSON_GetObjectItem(s, "labels");
        cJSON *a = k1 ? cJSON_GetObjectItem(l, k1) : NULL, *b = k2 ? cJSON_GetObjectItem(l, k2) : NULL;
        if (k1 && (!a || strcmp(a->valuestring, v1) != 0)) continue;
        if (k2 && (!b || strcmp(b->valuestring, v2) != 0)) continue;
        return cJSON_GetObjectItem(s, "value")->valuedouble;
    }
    return -1;
}

START_TEST(admin_token_only) {
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, NULL, "GET", "/metrics", NULL, &o), 401);
    ty_assert_error(o, "unauthorized", NULL);
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", "/metrics", NULL, &o), 403);
    ty_assert_error(o, "forbidden", NULL);
    cJSON_Delete(o);
}
END_TEST

START_TEST(what_the_cluster_does) {
    /* one job to the end */
    int64_t done = submit("m-done", 2, 1);
    for (int i = 0; i < 600 && strcmp(job_state(done), "succeeded") != 0; i++) ty_sleep_ms(100);
    ck_assert_str_eq(job_state(done), "succeeded");
    /* one long job running on the only slot, one waiting behind it */
    int64_t run = submit("m-run", 400, 1);
    int64_t wait = submit("m-wait", 1, 1);
    cJSON *m = NULL;
    double rate = -1;
    char jid[32];
    snprintf(jid, sizeof jid, "%lld", (long long)run);
    for (int i = 0; i < 300 && rate <= 0; i++) {
        cJSON_Delete(m);
        m = scrape();
        rate = value(m, "trainyard_job_samples_per_second", "job", jid, "team", "default");
        if (rate <= 0) ty_sleep_ms(100);
    }
    ck_assert_msg(rate > 0, "no samples/s for running job %s", jid);
    ck_assert_str_eq(job_state(wait), "queued");
    ck_assert(value(m, "trainyard_build_info", "version", TRAINYARD_VERSION, NULL, NULL) == 1);
    ck_assert(value(m, "trainyard_jobs", "team", "default", "state", "succeeded") == 1);
    ck_assert(value(m, "trainyard_jobs", "team", "default", "state", "running") == 1);
    ck_assert(value(m, "trainyard_jobs", "team", "default", "state", "queued") == 1);
    ck_assert(value(m, "trainyard_jobs", "team", "default", "state", "failed") == 0);
    ck_assert(value(m, "trainyard_queue_length", "team", "default", NULL, NULL) == 1);
    ck_assert(value(m, "trainyard_queue_wait_seconds_max", "team", "default", NULL, NULL) >= 0);
    ck_assert(value(m, "trainyard_devices", "kind", "cpu", NULL, NULL) == 1);
    ck_assert(value(m, "trainyard_devices_in_use", "kind", "cpu", NULL, NULL) == 1);
    ck_assert(value(m, "trainyard_team_devices_in_use", "team", "default", "kind", "cpu") == 1);
    ck_assert(value(m, "trainyard_nodes", "state", "ready", NULL, NULL) == 1);
    ck_assert(value(m, "trainyard_node_memory_bytes", NULL, NULL, NULL, NULL) >= 0);
    ck_assert(value(m, "trainyard_node_memory_in_use_bytes", NULL, NULL, NULL, NULL) >= 0);
    double frac = value(m, "trainyard_job_progress_ratio", "job", jid, NULL, NULL);
    ck_assert_msg(frac >= 0 && frac <= 1, "progress %g", frac);
    /* latency histograms of the routes this test called */
    ck_assert(value(m, "trainyard_http_request_duration_seconds_count", "route", "/api/v1/jobs", "method", "POST") == 3);
    ck_assert(value(m, "trainyard_http_request_duration_seconds_count", "route", "/api/v1/jobs/{id}", "method", "GET") >= 1);
    ck_assert(value(m, "trainyard_http_request_duration_seconds_bucket", "route", "/api/v1/jobs", "le", "+Inf") == 3);
    ck_assert(value(m, "trainyard_http_request_duration_seconds_sum", "route", "/api/v1/jobs", "method", "POST") > 0);
    ck_assert(value(m, "trainyard_scheduler_pass_duration_seconds_count", NULL, NULL, NULL, NULL) >= 1);
    ck_assert(value(m, "trainyard_scheduler_pass_duration_seconds_bucket", "le", "+Inf", NULL, NULL) >= 1);
    /* the passes' bindings: each counted once the next pass found it done */
    double bound = value(m, "trainyard_scheduler_pass_bound_seconds_count", NULL, NULL, NULL, NULL);
    ck_assert(bound >= 1);
    ck_assert(value(m, "trainyard_scheduler_pass_bound_seconds_bucket", "le", "+Inf", NULL, NULL) == bound);
    ck_assert(bound <= value(m, "trainyard_scheduler_pass_duration_seconds_count", NULL, NULL, NULL, NULL));
    ck_assert(value(m, "trainyard_scheduler_pass_bound_seconds_sum", NULL, NULL, NULL, NULL) > 0);
    cJSON_Delete(m);
    /* cancelled: its devices come back, the waiting job runs */
    char path[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/cancel", (long long)run);
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", path, NULL, &o), 200);
    cJSON_Delete(o);
    for (int i = 0; i < 600 && strcmp(job_state(wait), "succeeded") != 0; i++) ty_sleep_ms(100);
    m = scrape();
    ck_assert(value(m, "trainyard_jobs", "team", "default", "state", "cancelled") == 1);
    ck_assert(value(m, "trainyard_jobs", "team", "default", "state", "succeeded") == 2);
    ck_assert(value(m, "trainyard_queue_length", "team", "default", NULL, NULL) == 0);
    ck_assert(value(m, "trainyard_queue_wait_seconds_max", "team", "default", NULL, NULL) == 0);
    cJSON_Delete(m);
}
END_TEST

int main(void) {
    Suite *s = suite_create("metrics");
    TCase *tc = tcase_create("scrape");
    tcase_add_checked_fixture(tc, start, stop);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, admin_token_only);
    tcase_add_test(tc, what_the_cluster_does);
    suite_add_tcase(s, tc);
    return ty_run_suite(s);
}
