/* check_http.c - the real server binary on a loopback port, spoken to over
 * HTTP: health, auth (401, 403, cross-team 404), 404/405/413, bad JSON and
 * bad specs, submit/list/get/cancel, token files reused on restart, and
 * kill -9 of the server mid-submission with every acknowledged job kept. */
#include "testlib.h"

#include <fcntl.h>

static ty_proc srv;
static char team_tok[128], admin_tok[128], node_tok[128];

static const char GOOD[] =
    "{\"name\":\"syn\",\"model\":{\"layers\":[{\"type\":\"dense\",\"units\":16,\"activation\":\"relu\","
    "\"input_shape\":[10]},{\"type\":\"dense\",\"units\":1,\"activation\":\"sigmoid\"}]},"
    "\"compile\":{\"optimizer\":{\"type\":\"sgd\",\"learning_rate\":0.2},\"loss\":\"binary_crossentropy\","
    "\"metrics\":[\"accuracy\"]},\"data\":{\"source\":\"synthetic\",\"examples\":1024,\"features\":10},"
    "\"fit\":{\"epochs\":1,\"batch_size\":256}}";

static void start(void) {
    memset(&srv, 0, sizeof srv);
    ty_mkdtemp(srv.dir, sizeof srv.dir, "http");
    ty_server_start(&srv);
    ty_token(&srv, "token", team_tok, sizeof team_tok);
    ty_token(&srv, "admin.token", admin_tok, sizeof admin_tok);
    ty_token(&srv, "node.token", node_tok, sizeof node_tok);
}

static void stop(void) {
    ty_kill(&srv, SIGTERM);
    ty_rmrf(srv.dir);
}

static int64_t submit_ok(const char *tok, const char *spec) {
    cJSON *o = NULL;
    long st = ty_http(srv.url, tok, "POST", "/api/v1/jobs", spec, &o);
    ck_assert_msg(st == 201, "submit answered %ld", st);
    int64_t id = (int64_t)cJSON_GetObjectItem(o, "id")->valuedouble;
    ck_assert_str_eq(cJSON_GetObjectItem(o, "state")->valuestring, "queued");
    cJSON_Delete(o);
    return id;
}

START_TEST(health_is_public) {
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, NULL, "GET", "/api/v1/health", NULL, &o), 200);
    ck_assert_str_eq(cJSON_GetObjectItem(o, "status")->valuestring, "ok");
    cJSON_Delete(o);
}
END_TEST

START_TEST(token_files_are_private) {
    const char *names[] = {"admin.token", "token", "node.token"};
    for (int i = 0; i < 3; i++) {
        char p[512];
        snprintf(p, sizeof p, "%s/%s", srv.dir, names[i]);
        struct stat sb;
        ck_assert_int_eq(stat(p, &sb), 0);
        ck_assert_int_eq(sb.st_mode & 0777, 0600);
    }
    ck_assert_str_ne(team_tok, admin_tok);
}
END_TEST

START_TEST(auth_required) {
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, NULL, "GET", "/api/v1/jobs", NULL, &o), 401);
    ty_assert_error(o, "unauthorized", NULL);
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, "ty_not_a_real_token", "GET", "/api/v1/jobs", NULL, &o), 401);
    ty_assert_error(o, "unauthorized", NULL);
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, NULL, "POST", "/api/v1/jobs", GOOD, &o), 401);
    cJSON_Delete(o);
    /* Right token, wrong kind: a team may not create teams, a node may not submit. */
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", "/api/v1/teams", "{\"name\":\"x\"}", &o), 403);
    ty_assert_error(o, "forbidden", NULL);
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, node_tok, "POST", "/api/v1/jobs", GOOD, &o), 403);
    cJSON_Delete(o);
    /* Nothing was stored by the refused requests. */
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", "/api/v1/jobs", NULL, &o), 200);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(o, "jobs")), 0);
    cJSON_Delete(o);
}
END_TEST

START_TEST(not_found_and_method_not_allowed) {
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", "/api/v1/nothing", NULL, &o), 404);
    ty_assert_error(o, "not_found", NULL);
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "DELETE", "/api/v1/jobs", NULL, &o), 405);
    ty_assert_error(o, "method_not_allowed", NULL);
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", "/api/v1/jobs/12345", NULL, &o), 404);
    ty_assert_error(o, "not_found", NULL);
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", "/api/v1/jobs/abc", NULL, &o), 404);
    cJSON_Delete(o);
}
END_TEST

START_TEST(body_too_large) {
    size_t n = (1u << 20) + 100;
    char *big = xmalloc(n + 1);
    memset(big, ' ', n);
    big[0] = '{';
    big[n - 1] = '}';
    big[n] = '\0';
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", "/api/v1/jobs", big, &o), 413);
    ty_assert_error(o, "too_large", NULL);
    cJSON_Delete(o);
    free(big);
}
END_TEST

START_TEST(bad_json_and_bad_specs) {
    struct {
        const char *body;
        long status;
        const char *code, *field;
    } cases[] = {
        {"{\"name\": ", 400, "bad_json", NULL},
        {"[1,2]", 400, "bad_json", NULL},
        {"{\"model\":{\"layers\":[{\"type\":\"dense\",\"units\":0}]}}", 422, "invalid_value", "model.layers[0].units"},
        {"{\"nmae\":\"x\"}", 422, "unknown_field", "nmae"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cJSON *o = NULL;
        long st = ty_http(srv.url, team_tok, "POST", "/api/v1/jobs", cases[i].body, &o);
        ck_assert_msg(st == cases[i].status, "case %zu: %ld", i, st);
        cJSON *e = cJSON_GetObjectItem(o, "error");
        ck_assert_str_eq(cJSON_GetObjectItem(e, "code")->valuestring, cases[i].code);
        if (cases[i].field) ck_assert_str_eq(cJSON_GetObjectItem(e, "field")->valuestring, cases[i].field);
        cJSON_Delete(o);
    }
    /* Nothing stored. */
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", "/api/v1/jobs", NULL, &o), 200);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(o, "jobs")), 0);
    cJSON_Delete(o);
    /* Bad query arguments name the argument. */
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", "/api/v1/jobs?state=sleeping", NULL, &o), 400);
    ty_assert_error(o, "invalid_value", "state");
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", "/api/v1/jobs?limit=0", NULL, &o), 400);
    ty_assert_error(o, "invalid_value", "limit");
    cJSON_Delete(o);
}
END_TEST

START_TEST(submit_get_list_cancel) {
    client c;
    ck_assert_int_eq(client_init(&c, srv.url, team_tok), 0);
    client_reply r;
    ck_assert_int_eq(client_request(&c, "POST", "/api/v1/jobs", GOOD, strlen(GOOD), NULL, &r), 0);
    ck_assert_int_eq(r.status, 201);
    cJSON *o = cJSON_Parse(r.body.data);
    int64_t id = (int64_t)cJSON_GetObjectItem(o, "id")->valuedouble;
    cJSON_Delete(o);
    client_reply_release(&r);
    client_release(&c);

    char path[64];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld", (long long)id);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", path, NULL, &o), 200);
    ck_assert_str_eq(cJSON_GetObjectItem(o, "name")->valuestring, "syn");
    ck_assert_str_eq(cJSON_GetObjectItem(o, "team")->valuestring, "default");
    ck_assert(cJSON_IsObject(cJSON_GetObjectItem(o, "spec")));
    cJSON_Delete(o);

    int64_t id2 = submit_ok(team_tok, GOOD);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", "/api/v1/jobs?limit=1", NULL, &o), 200);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(o, "jobs")), 1);
    ck_assert_int_eq((int64_t)cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "jobs"), 0), "id")->valuedouble, id2);
    ck_assert_int_eq((int64_t)cJSON_GetObjectItem(o, "next_before")->valuedouble, id2);
    cJSON_Delete(o);

    snprintf(path, sizeof path, "/api/v1/jobs/%lld/cancel", (long long)id);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", path, "{\"reason\":\"changed my mind\"}", &o), 200);
    ck_assert_str_eq(cJSON_GetObjectItem(o, "state")->valuestring, "cancelled");
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", path, NULL, &o), 409);
    ty_assert_error(o, "conflict", NULL);
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", path, "{\"why\":1}", &o), 422);
    ty_assert_error(o, "unknown_field", "why");
    cJSON_Delete(o);

    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", "/api/v1/jobs?state=cancelled", NULL, &o), 200);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(o, "jobs")), 1);
    cJSON_Delete(o);

    snprintf(path, sizeof path, "/api/v1/jobs/%lld/events", (long long)id);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", path, NULL, &o), 200);
    cJSON *ev = cJSON_GetObjectItem(o, "events");
    ck_assert_int_ge(cJSON_GetArraySize(ev), 2);
    cJSON *last = cJSON_GetArrayItem(ev, cJSON_GetArraySize(ev) - 1);
    ck_assert_str_eq(cJSON_GetObjectItem(last, "to")->valuestring, "cancelled");
    ck_assert_str_eq(cJSON_GetObjectItem(last, "reason")->valuestring, "changed my mind");
    ck_assert_str_eq(cJSON_GetObjectItem(last, "actor")->valuestring, "team:default");
    cJSON_Delete(o);
}
END_TEST

START_TEST(teams_and_cross_team_isolation) {
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "POST", "/api/v1/teams", "{\"name\":\"vision\"}", &o), 201);
    char vision_tok[128];
    snprintf(vision_tok, sizeof vision_tok, "%s", cJSON_GetObjectItem(o, "token")->valuestring);
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "POST", "/api/v1/teams", "{\"name\":\"vision\"}", &o), 409);
    ty_assert_error(o, "conflict", "name");
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "POST", "/api/v1/teams", "{\"name\":\"Bad Name\"}", &o), 422);
    ty_assert_error(o, "invalid_value", "name");
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "POST", "/api/v1/teams", "{}", &o), 422);
    ty_assert_error(o, "missing_field", "name");
    cJSON_Delete(o);

    int64_t mine = submit_ok(vision_tok, GOOD);
    char path[64];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld", (long long)mine);
    /* Another team's job does not exist for the default team. */
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", path, NULL, &o), 404);
    cJSON_Delete(o);
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/cancel", (long long)mine);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", path, NULL, &o), 404);
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", "/api/v1/jobs", NULL, &o), 200);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(o, "jobs")), 0);
    cJSON_Delete(o);
    /* The owner and the admin see it. */
    ck_assert_int_eq(ty_http(srv.url, vision_tok, "GET", "/api/v1/jobs", NULL, &o), 200);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(o, "jobs")), 1);
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "GET", "/api/v1/jobs", NULL, &o), 200);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(o, "jobs")), 1);
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, vision_tok, "GET", "/api/v1/teams", NULL, &o), 200);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(o, "teams")), 1);
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "GET", "/api/v1/teams", NULL, &o), 200);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(o, "teams")), 2);
    cJSON_Delete(o);
}
END_TEST

/* A child submits as fast as it can and appends every acknowledged id to a
 * file; the server is killed with SIGKILL mid-stream, restarted on the same
 * data directory, and every acknowledged job must be there. */
START_TEST(kill9_keeps_acknowledged_jobs) {
    char acked[512];
    snprintf(acked, sizeof acked, "%s/acked.txt", srv.dir);
    pid_t child = fork();
    ck_assert_int_ge(child, 0);
    if (child == 0) {
        int fd = open(acked, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) _exit(1);
        client c;
        if (client_init(&c, srv.url, team_tok) < 0) _exit(1);
        for (int i = 0; i < 100000; i++) {
            client_reply r;
            if (client_request(&c, "POST", "/api/v1/jobs", GOOD, strlen(GOOD), NULL, &r) < 0) break;
            if (r.status == 201) {
                cJSON *o = cJSON_Parse(r.body.data);
                char line[32];
                int n = snprintf(line, sizeof line, "%lld\n", (long long)cJSON_GetObjectItem(o, "id")->valuedouble);
                if (write(fd, line, (size_t)n) != n) _exit(1);
                cJSON_Delete(o);
            }
            client_reply_release(&r);
        }
        client_release(&c);
        close(fd);
        _exit(0);
    }
    ty_sleep_ms(1500);
    int st = ty_kill(&srv, SIGKILL);
    ck_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    int cst;
    waitpid(child, &cst, 0);
    ck_assert(WIFEXITED(cst) && WEXITSTATUS(cst) == 0);

    ty_server_start(&srv);
    char tok2[128];
    ty_token(&srv, "token", tok2, sizeof tok2);
    ck_assert_str_eq(tok2, team_tok); /* token files are reused */
    FILE *f = fopen(acked, "r");
    ck_assert_ptr_nonnull(f);
    long long id;
    int n = 0;
    while (fscanf(f, "%lld", &id) == 1) {
        char path[64];
        snprintf(path, sizeof path, "/api/v1/jobs/%lld", id);
        ck_assert_msg(ty_http(srv.url, team_tok, "GET", path, NULL, NULL) == 200, "acknowledged job %lld lost", id);
        n++;
    }
    fclose(f);
    ck_assert_msg(n >= 20, "only %d jobs were acknowledged before the kill", n);
    fprintf(stderr, "kill9: %d acknowledged jobs, all present after restart\n", n);
}
END_TEST

int main(void) {
    Suite *s = suite_create("http");
    TCase *tc = tcase_create("server");
    tcase_add_checked_fixture(tc, start, stop);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, health_is_public);
    tcase_add_test(tc, token_files_are_private);
    tcase_add_test(tc, auth_required);
    tcase_add_test(tc, not_found_and_method_not_allowed);
    tcase_add_test(tc, body_too_large);
    tcase_add_test(tc, bad_json_and_bad_specs);
    tcase_add_test(tc, submit_get_list_cancel);
    tcase_add_test(tc, teams_and_cross_team_isolation);
    tcase_add_test(tc, kill9_keeps_acknowledged_jobs);
    suite_add_tcase(s, tc);
    return ty_run_suite(s);
}
