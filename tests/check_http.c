/* check_http.c - the real server binary on a loopback port, spoken to over
 * HTTP: health, auth (401, 403, cross-team 404), 404/405/413, bad JSON and
 * bad specs, submit/list/get/cancel, a job's model summary, token files
 * reused on restart, and kill -9 of the server mid-submission with every
 * acknowledged job kept. */
#include "testlib.h"
#include "../common/json_out.h"

#include <fcntl.h>
#include <math.h>

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
    ck_assert_str_eq(cJSON_GetObjectItem(last, "actor")->valuestring, "team:default (service)");
    cJSON_Delete(o);
}
END_TEST

/* A layer of a job's model_summary: its name, type, output shape (one
 * example's, "26,26,32") and Param # (all; trainable). */
static void assert_layer(const cJSON *summary, int i, const char *name, const char *type, const char *shape,
                         long params, long trainable) {
    const cJSON *l = cJSON_GetArrayItem(cJSON_GetObjectItem(summary, "layers"), i);
    ck_assert_msg(cJSON_IsObject(l), "model_summary.layers[%d] is missing", i);
    ck_assert_str_eq(cJSON_GetObjectItem(l, "name")->valuestring, name);
    ck_assert_str_eq(cJSON_GetObjectItem(l, "type")->valuestring, type);
    char got[64] = "";
    const cJSON *d;
    cJSON_ArrayForEach(d, cJSON_GetObjectItem(l, "output_shape"))
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%d", got[0] ? "," : "", (int)d->valuedouble);
    ck_assert_msg(strcmp(got, shape) == 0, "%s: output_shape [%s], expected [%s]", name, got, shape);
    ck_assert_int_eq((long)cJSON_GetObjectItem(l, "params")->valuedouble, params);
    ck_assert_int_eq((long)cJSON_GetObjectItem(l, "trainable_params")->valuedouble, trainable);
}

static void assert_totals(const cJSON *summary, long total, long trainable, long fixed) {
    ck_assert_int_eq((long)cJSON_GetObjectItem(summary, "total_params")->valuedouble, total);
    ck_assert_int_eq((long)cJSON_GetObjectItem(summary, "trainable_params")->valuedouble, trainable);
    ck_assert_int_eq((long)cJSON_GetObjectItem(summary, "non_trainable_params")->valuedouble, fixed);
}

/* GET /jobs/{id} carries the model as Keras' model.summary() shows it, from
 * the stored spec alone (the jobs stay queued: nothing trains here); a
 * command job's is null; lists and the submit answer do not carry it. */
/* One POST with an Idempotency-Key: its status, the job's id (0: none). */
static long keyed_submit(const char *key, const char *spec, int64_t *id, char *code, size_t cap) {
    client c;
    ck_assert_int_eq(client_init(&c, srv.url, team_tok), 0);
    snprintf(c.idempotency_key, sizeof c.idempotency_key, "%s", key);
    client_reply r;
    ck_assert_int_eq(client_request(&c, "POST", "/api/v1/jobs", spec, strlen(spec), NULL, &r), 0);
    long status = r.status;
    cJSON *o = cJSON_ParseWithLength(r.body.data, r.body.len);
    ck_assert_ptr_nonnull(o);
    cJSON *jid = cJSON_GetObjectItem(o, "id"), *e = cJSON_GetObjectItem(o, "error");
    *id = cJSON_IsNumber(jid) ? (int64_t)jid->valuedouble : 0;
    snprintf(code, cap, "%s", e ? cJSON_GetObjectItem(e, "code")->valuestring : "");
    if (e) ck_assert_str_eq(cJSON_GetObjectItem(e, "field")->valuestring, "Idempotency-Key");
    cJSON_Delete(o);
    client_reply_release(&r);
    client_release(&c);
    return status;
}

static int count_jobs(void) {
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", "/api/v1/jobs?limit=1000", NULL, &o), 200);
    int n = cJSON_GetArraySize(cJSON_GetObjectItem(o, "jobs"));
    cJSON_Delete(o);
    return n;
}

/* A retry of a submission whose answer was lost (a failover) carries the
 * same Idempotency-Key: it gets the first job back, 200, and no second. */
START_TEST(idempotency_key_makes_one_job) {
    int before = count_jobs();
    int64_t a = 0, b = 0, c = 0;
    char code[64];
    ck_assert_int_eq(keyed_submit("5f0c7d3e-9a41-4b6e-8f21-0d3c6b2a9e11", GOOD, &a, code, sizeof code), 201);
    ck_assert_int_gt(a, 0);
    ck_assert_int_eq(keyed_submit("5f0c7d3e-9a41-4b6e-8f21-0d3c6b2a9e11", GOOD, &b, code, sizeof code), 200);
    ck_assert_int_eq(b, a);
    ck_assert_int_eq(count_jobs(), before + 1);
    /* the same key for another spec: refused, naming the header; nothing made */
    char other[sizeof GOOD + 8];
    snprintf(other, sizeof other, "%s", GOOD);
    char *name = strstr(other, "\"syn\"");
    ck_assert_ptr_nonnull(name);
    memcpy(name, "\"syx\"", 5);
    ck_assert_int_eq(keyed_submit("5f0c7d3e-9a41-4b6e-8f21-0d3c6b2a9e11", other, &c, code, sizeof code), 422);
    ck_assert_str_eq(code, "idempotency_key_reused");
    /* a key that is no key (a space in it): 400 naming the header, nothing made */
    ck_assert_int_eq(keyed_submit("has space", GOOD, &c, code, sizeof code), 400);
    ck_assert_str_eq(code, "invalid_value");
    ck_assert_int_eq(count_jobs(), before + 1);
    /* a new key: a new job */
    ck_assert_int_eq(keyed_submit("0b1f0c52-6a7e-4c55-9e0a-2f6d1f3b8c40", GOOD, &c, code, sizeof code), 201);
    ck_assert_int_ne(c, a);
    ck_assert_int_eq(count_jobs(), before + 2);
}
END_TEST

START_TEST(job_model_summary) {
    static const char CNN[] =
        "{\"name\":\"cnn\",\"model\":{\"layers\":[{\"type\":\"conv2d\",\"filters\":32,\"kernel_size\":3,"
        "\"activation\":\"relu\",\"input_shape\":[28,28]},{\"type\":\"max_pooling2d\"},"
        "{\"type\":\"batch_normalization\"},{\"type\":\"flatten\"},{\"type\":\"dropout\",\"rate\":0.25},"
        "{\"type\":\"dense\",\"units\":10,\"activation\":\"softmax\"}]},"
        "\"compile\":{\"optimizer\":\"adam\",\"loss\":\"sparse_categorical_crossentropy\",\"metrics\":[\"accuracy\"]},"
        "\"data\":{\"source\":\"fashion-mnist\",\"limit\":512},\"fit\":{\"epochs\":1,\"batch_size\":64}}";
    static const char COMMAND[] = "{\"name\":\"cmd\",\"command\":{\"argv\":[\"true\"]}}";
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", "/api/v1/jobs", CNN, &o), 201);
    int64_t cnn = (int64_t)cJSON_GetObjectItem(o, "id")->valuedouble;
    ck_assert_msg(cJSON_GetObjectItem(o, "model_summary") == NULL, "the submit answer carries no model_summary");
    cJSON_Delete(o);
    int64_t mlp = submit_ok(team_tok, GOOD);
    int64_t cmd = submit_ok(team_tok, COMMAND);

    char path[64];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld", (long long)cnn);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", path, NULL, &o), 200);
    const cJSON *m = cJSON_GetObjectItem(o, "model_summary");
    ck_assert_msg(cJSON_IsObject(m), "a CNN job's answer has a model_summary object");
    const cJSON *in = cJSON_GetObjectItem(m, "input_shape");
    ck_assert_int_eq(cJSON_GetArraySize(in), 3); /* [28, 28] takes one channel before a conv2d */
    ck_assert_int_eq((int)cJSON_GetArrayItem(in, 2)->valuedouble, 1);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(m, "layers")), 6);
    assert_layer(m, 0, "conv2d_0", "conv2d", "26,26,32", 320, 320); /* 3*3*1*32 + 32 */
    assert_layer(m, 1, "max_pooling2d_0", "max_pooling2d", "13,13,32", 0, 0);
    /* gamma and beta trainable, the moving mean and variance not */
    assert_layer(m, 2, "batch_normalization_0", "batch_normalization", "13,13,32", 128, 64);
    assert_layer(m, 3, "flatten_0", "flatten", "5408", 0, 0);
    assert_layer(m, 4, "dropout_0", "dropout", "5408", 0, 0);
    assert_layer(m, 5, "dense_0", "dense", "10", 54090, 54090); /* 5408*10 + 10 */
    assert_totals(m, 54538, 54474, 64);
    cJSON_Delete(o);

    snprintf(path, sizeof path, "/api/v1/jobs/%lld", (long long)mlp);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", path, NULL, &o), 200);
    m = cJSON_GetObjectItem(o, "model_summary");
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(m, "layers")), 2);
    assert_layer(m, 0, "dense_0", "dense", "16", 176, 176); /* 10*16 + 16 */
    assert_layer(m, 1, "dense_1", "dense", "1", 17, 17);
    assert_totals(m, 193, 193, 0);
    ck_assert_int_eq((int)cJSON_GetArrayItem(cJSON_GetObjectItem(m, "input_shape"), 0)->valuedouble, 10);
    cJSON_Delete(o);

    snprintf(path, sizeof path, "/api/v1/jobs/%lld", (long long)cmd);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", path, NULL, &o), 200);
    ck_assert_msg(cJSON_IsNull(cJSON_GetObjectItem(o, "model_summary")), "a command job's model_summary is null");
    cJSON_Delete(o);

    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", "/api/v1/jobs", NULL, &o), 200);
    const cJSON *j;
    cJSON_ArrayForEach(j, cJSON_GetObjectItem(o, "jobs"))
        ck_assert_msg(cJSON_GetObjectItem(j, "model_summary") == NULL, "a listed job carries no model_summary");
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

/* ---------------------------------------------------------------- json_out
 * The server writes its answers with json_write (common/json_out.c), not
 * cJSON_PrintUnformatted: the same bytes, except that -0 is 0 and a number
 * whose %.15g reads back only approximately gets its exact %.17g. */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static double rnd_number(void) {
    switch (rnd() % 8) {
    case 0: return (double)(int64_t)(rnd() % 2000) - 1000;                 /* small ints */
    case 1: return (double)(int64_t)(rnd() >> 11) * ((rnd() & 1) ? 1 : -1); /* up to 2^53 */
    case 2: return (double)(rnd() % 100000) / 1000.0;                      /* decimals */
    case 3: return 1e15 * (double)(rnd() % 1000);                          /* large, integral */
    case 4: {                                                               /* any finite bits */
        uint64_t u;
        double d;
        do {
            u = rnd();
            memcpy(&d, &u, sizeof d);
        } while (isnan(d) || isinf(d) || d == 0);
        return d;
    }
    case 5: return (double)rnd() / 3.0;
    case 6: return 1761000000000.0 + (double)(rnd() % 100000);              /* ms timestamps */
    default: return (double)(rnd() % 1000) * 1e-300;
    }
}

static cJSON *rnd_tree(int depth) {
    int k = (int)(rnd() % (depth > 3 ? 5 : 7));
    switch (k) {
    case 0: return cJSON_CreateNumber(rnd_number());
    case 1: {
        char str[40];
        int n = (int)(rnd() % 39);
        for (int i = 0; i < n; i++) str[i] = (char)(1 + rnd() % 255); /* every byte but NUL */
        str[n] = 0;
        return cJSON_CreateString(str);
    }
    case 2: return cJSON_CreateBool((int)(rnd() & 1));
    case 3: return cJSON_CreateNull();
    case 4: return cJSON_CreateNumber((double)(int)(rnd() % 100));
    case 5: {
        cJSON *a = cJSON_CreateArray();
        int n = (int)(rnd() % 5);
        for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, rnd_tree(depth + 1));
        return a;
    }
    default: {
        cJSON *o = cJSON_CreateObject();
        int n = (int)(rnd() % 5);
        for (int i = 0; i < n; i++) {
            char key[16];
            snprintf(key, sizeof key, "k%d\t\"%d", i, (int)(rnd() % 10));
            cJSON_AddItemToObject(o, key, rnd_tree(depth + 1));
        }
        return o;
    }
    }
}

START_TEST(json_out_writes_what_cjson_writes) {
    int differ = 0;
    for (int t = 0; t < 3000; t++) {
        cJSON *v = rnd_tree(0);
        char *want = cJSON_PrintUnformatted(v);
        size_t n = 0;
        char *got = json_print(v, &n);
        ck_assert_ptr_nonnull(want);
        ck_assert_ptr_nonnull(got);
        ck_assert_uint_eq(n, strlen(got));
        if (strcmp(got, want) != 0) {
            /* only a number may differ: cJSON keeps %.15g when it reads back within an
             * epsilon; ours reads back exactly (the same text again, the same tree) */
            cJSON *back = cJSON_Parse(got);
            ck_assert_msg(back != NULL, "tree %d: ours does not parse: %s", t, got);
            char *again = json_print(back, NULL);
            ck_assert_msg(strcmp(again, got) == 0, "tree %d: %s reads back as %s", t, got, again);
            ck_assert_msg(cJSON_Compare(back, v, 1), "tree %d:\n ours  %s\n cJSON %s", t, got, want);
            free(again);
            cJSON_Delete(back);
            differ++;
        }
        free(want);
        free(got);
        cJSON_Delete(v);
    }
    ck_assert_msg(differ < 300, "%d of 3000 trees differ from cJSON's text", differ);
    /* the edges, spelled out */
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "max", 9007199254740992.0);
    cJSON_AddNumberToObject(o, "min", -9007199254740992.0);
    cJSON_AddNumberToObject(o, "past", 9007199254740994.0);
    cJSON_AddNumberToObject(o, "tenth", 0.1);
    cJSON_AddNumberToObject(o, "third", 1.0 / 3.0);
    cJSON_AddNumberToObject(o, "nan", NAN);
    cJSON_AddNumberToObject(o, "inf", -INFINITY);
    cJSON_AddNumberToObject(o, "negzero", -0.0);
    cJSON_AddStringToObject(o, "s", "a\"b\\c\n\x01\x7f\xc3\xa9");
    char *got = json_print(o, NULL);
    ck_assert_str_eq(got, "{\"max\":9007199254740992,\"min\":-9007199254740992,\"past\":9007199254740994,"
                          "\"tenth\":0.1,\"third\":0.33333333333333331,\"nan\":null,\"inf\":null,\"negzero\":0,"
                          "\"s\":\"a\\\"b\\\\c\\n\\u0001\x7f\xc3\xa9\"}");
    /* and it reads back as the same numbers */
    cJSON *back = cJSON_Parse(got);
    ck_assert_ptr_nonnull(back);
    ck_assert(cJSON_GetObjectItem(back, "third")->valuedouble == 1.0 / 3.0);
    ck_assert(cJSON_GetObjectItem(back, "past")->valuedouble == 9007199254740994.0);
    cJSON_Delete(back);
    free(got);
    /* a full buffer is an error, not a cut text */
    buf small;
    buf_init(&small, 10);
    ck_assert_int_eq(json_write(&small, o), -1);
    buf_release(&small);
    cJSON_Delete(o);
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
    tcase_add_test(tc, idempotency_key_makes_one_job);
    tcase_add_test(tc, job_model_summary);
    tcase_add_test(tc, teams_and_cross_team_isolation);
    tcase_add_test(tc, kill9_keeps_acknowledged_jobs);
    suite_add_tcase(s, tc);
    TCase *tj = tcase_create("json_out");
    tcase_add_test(tj, json_out_writes_what_cjson_writes);
    suite_add_tcase(s, tj);
    return ty_run_suite(s);
}
