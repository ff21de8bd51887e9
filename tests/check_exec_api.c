/* check_exec_api.c - the executors' side of the API on the real server
 * binary, driven over plain HTTP as an agent and a worker would: assignments
 * (long-poll, one hand-out per task, task tokens), task status and the gang's
 * consequences (running, succeeded, requeue then failed, cancel), metrics
 * with overlapping sequence numbers, checkpoints (sha256, keep, download),
 * logs, rendezvous, server-sent events and token scoping; the real
 * `trainyard worker` of a requeued attempt (a command job's chief, an
 * evaluator) whose metrics are refused and store nothing. */
#include "testlib.h"

#include <curl/curl.h>
#include <dirent.h>
#include <pthread.h>
#include <sqlite3.h>
#include <sys/prctl.h>

static ty_proc srv;
static char team_tok[128], admin_tok[128], join_tok[128], node_tok[128]; /* node_tok: n1's own token */
static int64_t node_id;

#define SPEC(name, extra)                                                                                  \
    "{\"name\":\"" name "\",\"model\":{\"layers\":[{\"type\":\"dense\",\"units\":8,\"activation\":\"relu\","  \
    "\"input_shape\":[4]},{\"type\":\"dense\",\"units\":1,\"activation\":\"sigmoid\"}]},"                  \
    "\"compile\":{\"optimizer\":{\"type\":\"sgd\",\"learning_rate\":0.1},\"loss\":\"binary_crossentropy\","  \
    "\"metrics\":[\"accuracy\"]},\"data\":{\"source\":\"synthetic\",\"examples\":1000,\"features\":4},"     \
    "\"fit\":{\"epochs\":2,\"batch_size\":100}" extra "}"

/* ---------------------------------------------------------------- raw HTTP */

typedef struct reply {
    long status;
    buf body;
    char sha[80];         /* X-Checksum-Sha256 */
    char next[32];        /* X-Next-Offset ("" when absent) */
} reply;

static size_t on_body(char *p, size_t sz, size_t n, void *cls) {
    buf *b = cls;
    return buf_append(b, p, sz * n) == 0 ? sz * n : 0;
}

/* Copies the value of header k (with its colon) from line p into out. */
static void header_value(const char *p, size_t len, const char *k, char *out, size_t cap) {
    size_t kl = strlen(k);
    if (len <= kl || strncasecmp(p, k, kl) != 0) return;
    const char *v = p + kl;
    while (*v == ' ') v++;
    size_t m = 0;
    while (m + 1 < cap && v + m < p + len && v[m] != '\r' && v[m] != '\n') m++;
    memcpy(out, v, m);
    out[m] = '\0';
}

static size_t on_header(char *p, size_t sz, size_t n, void *cls) {
    reply *r = cls;
    size_t len = sz * n;
    header_value(p, len, "X-Checksum-Sha256:", r->sha, sizeof r->sha);
    header_value(p, len, "X-Next-Offset:", r->next, sizeof r->next);
    return len;
}

/* One request with extra headers (NULL-terminated), any body bytes. */
static long raw(const char *token, const char *method, const char *path, const void *body, size_t len,
                const char *const *headers, reply *r) {
    memset(r, 0, sizeof *r);
    buf_init(&r->body, 64u << 20);
    CURL *c = curl_easy_init();
    ck_assert_ptr_nonnull(c);
    char url[512], auth[300];
    snprintf(url, sizeof url, "%s%s", srv.url, path);
    struct curl_slist *h = NULL;
    if (token) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
        h = curl_slist_append(h, auth);
    }
    for (int i = 0; headers && headers[i]; i++) h = curl_slist_append(h, headers[i]);
    h = curl_slist_append(h, "Expect:");
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    if (body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    }
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r->body);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, r);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 30L);
    CURLcode rc = curl_easy_perform(c);
    ck_assert_msg(rc == CURLE_OK, "%s %s: %s", method, path, curl_easy_strerror(rc));
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->status);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    return r->status;
}

static long http(const char *token, const char *method, const char *path, const char *body, cJSON **out) {
    return ty_http(srv.url, token, method, path, body, out);
}

static double num(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItem(o, k);
    ck_assert_msg(cJSON_IsNumber(v), "no number %s", k);
    return v->valuedouble;
}

static const char *str(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItem(o, k);
    ck_assert_msg(cJSON_IsString(v), "no string %s", k);
    return v->valuestring;
}

/* ---------------------------------------------------------------- fixture */

/* Registers a node with POST /nodes when the cluster API is there, else
 * writes its rows straight into the server's database (as POST /nodes would). */
static int64_t register_node(const char *host, int cpu) {
    char body[256];
    snprintf(body, sizeof body, "{\"hostname\":\"%s\",\"address\":\"127.0.0.1\",\"cpu_slots\":%d,\"devices\":[]}",
             host, cpu);
    cJSON *o = NULL;
    long st = http(join_tok, "POST", "/api/v1/nodes", body, &o);
    if (st == 200 || st == 201) {
        int64_t id = (int64_t)num(o, "id");
        snprintf(node_tok, sizeof node_tok, "%s", str(o, "token")); /* the node's own token */
        cJSON_Delete(o);
        return id;
    }
    cJSON_Delete(o);
    ck_assert_int_eq(st, 404);
    ck_assert_msg(!ty_pg_url(), "POST /nodes answered 404: the node is written into trainyard.db, SQLite only");
    char path[512];
    snprintf(path, sizeof path, "%s/trainyard.db", srv.dir);
    sqlite3 *db = NULL;
    ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
    sqlite3_busy_timeout(db, 10000);
    sqlite3_stmt *s = NULL;
    ck_assert_int_eq(sqlite3_prepare_v2(db,
                                        "INSERT INTO nodes(hostname, address, cpu_slots, state, registered_at,"
                                        " last_heartbeat_at) VALUES(?, '127.0.0.1', ?, 'ready', ?, ?)",
                                        -1, &s, NULL),
                     SQLITE_OK);
    int64_t now = now_ms();
    sqlite3_bind_text(s, 1, host, -1, SQLITE_STATIC);
    sqlite3_bind_int(s, 2, cpu);
    sqlite3_bind_int64(s, 3, now);
    sqlite3_bind_int64(s, 4, now + 86400000LL); /* no heartbeat endpoint to keep it alive */
    ck_assert_int_eq(sqlite3_step(s), SQLITE_DONE);
    sqlite3_finalize(s);
    int64_t id = sqlite3_last_insert_rowid(db);
    ck_assert_int_eq(sqlite3_prepare_v2(db, "INSERT INTO devices(node_id, kind, idx) VALUES(?, 'cpu', ?)", -1, &s, NULL),
                     SQLITE_OK);
    for (int i = 0; i < cpu; i++) {
        sqlite3_reset(s);
        sqlite3_bind_int64(s, 1, id);
        sqlite3_bind_int(s, 2, i);
        ck_assert_int_eq(sqlite3_step(s), SQLITE_DONE);
    }
    sqlite3_finalize(s);
    sqlite3_close(db);
    return id;
}

static void start(void) {
    memset(&srv, 0, sizeof srv);
    ty_mkdtemp(srv.dir, sizeof srv.dir, "exec");
    /* workers are told --public-url (a proxy, or the name behind --listen 0.0.0.0) */
    static const char *const extra[] = {"--heartbeat-timeout", "3600", "--public-url", "http://trainyard.example:8443/",
                                        NULL};
    ty_server_start_args(&srv, "server", extra);
    ty_token(&srv, "token", team_tok, sizeof team_tok);
    ty_token(&srv, "admin.token", admin_tok, sizeof admin_tok);
    ty_token(&srv, "node.token", join_tok, sizeof join_tok);
    node_id = register_node("n1", 4);
}

static void stop(void) {
    ty_kill(&srv, SIGTERM);
    ty_rmrf(srv.dir);
}

/* ---------------------------------------------------------------- helpers */

static int64_t submit(const char *spec) {
    cJSON *o = NULL;
    ck_assert_int_eq(http(team_tok, "POST", "/api/v1/jobs", spec, &o), 201);
    int64_t id = (int64_t)num(o, "id");
    cJSON_Delete(o);
    return id;
}

static cJSON *job_get(int64_t id) {
    char p[64];
    snprintf(p, sizeof p, "/api/v1/jobs/%lld", (long long)id);
    cJSON *o = NULL;
    ck_assert_int_eq(http(team_tok, "GET", p, NULL, &o), 200);
    return o;
}

static void job_state(int64_t id, char *out, size_t n) {
    cJSON *o = job_get(id);
    snprintf(out, n, "%s", str(o, "state"));
    cJSON_Delete(o);
}

static void wait_state(int64_t id, const char *want, int ms) {
    char st[32] = "";
    for (int t = 0; t < ms; t += 50) {
        job_state(id, st, sizeof st);
        if (strcmp(st, want) == 0) return;
        ty_sleep_ms(50);
    }
    ck_abort_msg("job %lld is %s, not %s", (long long)id, st, want);
}

/* Long-polls the node's assignments; returns the reply object. */
static cJSON *assignments(int wait_s) {
    char p[96];
    snprintf(p, sizeof p, "/api/v1/nodes/%lld/assignments?wait=%d", (long long)node_id, wait_s);
    cJSON *o = NULL;
    ck_assert_int_eq(http(node_tok, "GET", p, NULL, &o), 200);
    ck_assert(cJSON_IsArray(cJSON_GetObjectItem(o, "start")));
    ck_assert(cJSON_IsArray(cJSON_GetObjectItem(o, "stop")));
    return o;
}

typedef struct started {
    int64_t task, job;
    int attempt;
    char token[128];
} started;

/* Waits for the scheduler to place job and the node to be told to start it. */
static started take_start(int64_t job) {
    started s;
    memset(&s, 0, sizeof s);
    for (int i = 0; i < 20 && !s.task; i++) {
        cJSON *o = assignments(2);
        cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItem(o, "start")) {
            if ((int64_t)num(it, "job") != job) continue;
            s.task = (int64_t)num(it, "task");
            s.job = job;
            s.attempt = (int)num(it, "attempt");
            snprintf(s.token, sizeof s.token, "%s", str(it, "token"));
            cJSON *cfg = cJSON_GetObjectItem(it, "config");
            ck_assert(cJSON_IsObject(cfg));
            ck_assert_str_eq(str(cfg, "token"), s.token);
            ck_assert_int_eq((int64_t)num(cfg, "job"), job);
            ck_assert_str_eq(str(cJSON_GetObjectItem(cfg, "task"), "type"), "worker");
            ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(cJSON_GetObjectItem(cfg, "cluster"), "chief")), 1);
            ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(it, "devices")), 1);
            ck_assert(cJSON_IsObject(cJSON_GetObjectItem(cfg, "spec")));
            ck_assert_str_eq(str(cfg, "api"), "http://trainyard.example:8443");
        }
        cJSON_Delete(o);
    }
    ck_assert_msg(s.task, "job %lld was never handed out", (long long)job);
    return s;
}

static void report(int64_t task, const char *body, long want) {
    char p[64];
    snprintf(p, sizeof p, "/api/v1/tasks/%lld/status", (long long)task);
    cJSON *o = NULL;
    long st = http(node_tok, "POST", p, body, &o);
    ck_assert_msg(st == want, "status report answered %ld", st);
    cJSON_Delete(o);
}

static int devices_in_use(void) {
    cJSON *o = NULL;
    ck_assert_int_eq(http(team_tok, "GET", "/api/v1/teams", NULL, &o), 200);
    int n = (int)num(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "teams"), 0), "devices_in_use");
    cJSON_Delete(o);
    return n;
}

static void post_metrics(const started *s, int from, int to) {
    buf b;
    buf_init(&b, 1u << 20);
    buf_appends(&b, "{\"metrics\":[");
    for (int i = from; i <= to; i++)
        buf_printf(&b, "%s{\"seq\":%d,\"kind\":\"step\",\"step\":%d,\"epoch\":0,\"loss\":%g,\"samples_per_sec\":1000}",
                   i > from ? "," : "", i, i * 2, 1.0 / i);
    buf_appends(&b, "]}");
    char p[64];
    snprintf(p, sizeof p, "/api/v1/jobs/%lld/metrics", (long long)s->job);
    cJSON *o = NULL;
    ck_assert_int_eq(http(s->token, "POST", p, b.data, &o), 200);
    ck_assert_int_eq((int)num(o, "acked"), to);
    cJSON_Delete(o);
    buf_release(&b);
}

static int64_t put_ckpt(const started *s, const char *data, size_t len, const char *sha, int step, long want) {
    char p[128], h[128];
    snprintf(p, sizeof p, "/api/v1/jobs/%lld/checkpoints?step=%d&epoch=%d", (long long)s->job, step, step / 10);
    snprintf(h, sizeof h, "X-Checksum-Sha256: %s", sha);
    const char *hs[] = {h, "Content-Type: application/octet-stream", NULL};
    reply r;
    long st = raw(s->token, "PUT", p, data, len, hs, &r);
    ck_assert_msg(st == want, "checkpoint upload answered %ld: %s", st, r.body.data ? r.body.data : "");
    int64_t id = 0;
    if (st == 201) {
        cJSON *o = cJSON_Parse(r.body.data);
        id = (int64_t)num(o, "id");
        ck_assert_str_eq(str(o, "sha256"), sha);
        ck_assert_int_eq((long)num(o, "size"), (long)len);
        cJSON_Delete(o);
    }
    buf_release(&r.body);
    return id;
}

static int count_files(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

/* ---------------------------------------------------------------- tests */

START_TEST(job_runs_to_succeeded) {
    int64_t job = submit(SPEC("ok", ",\"checkpoint\":{\"every_epochs\":1,\"keep\":2}"));
    started s = take_start(job);
    ck_assert_int_eq(s.attempt, 1);
    /* handed out once */
    cJSON *o = assignments(0);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(o, "start")), 0);
    cJSON_Delete(o);
    char st[32];
    job_state(job, st, sizeof st);
    ck_assert_str_eq(st, "starting");
    ck_assert_int_eq(devices_in_use(), 1);

    report(s.task, "{\"state\":\"running\"}", 200);
    report(s.task, "{\"state\":\"running\"}", 200); /* retried report */
    job_state(job, st, sizeof st);
    ck_assert_str_eq(st, "running");
    o = job_get(job);
    cJSON *t0 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "tasks"), 0);
    ck_assert_str_eq(str(t0, "node"), "n1");
    ck_assert_str_eq(str(t0, "state"), "running");
    ck_assert_str_eq(str(t0, "type"), "worker");
    ck_assert(cJSON_IsNull(cJSON_GetObjectItem(o, "progress")));
    cJSON_Delete(o);

    /* metrics: a retried batch overlapping the first stores nothing twice */
    post_metrics(&s, 1, 5);
    post_metrics(&s, 3, 8);
    char p[128];
    snprintf(p, sizeof p, "/api/v1/jobs/%lld/metrics?since=0", (long long)job);
    ck_assert_int_eq(http(team_tok, "GET", p, NULL, &o), 200);
    cJSON *ms = cJSON_GetObjectItem(o, "metrics");
    ck_assert_int_eq(cJSON_GetArraySize(ms), 8);
    for (int i = 0; i < 8; i++) {
        ck_assert_int_eq((int)num(cJSON_GetArrayItem(ms, i), "seq"), i + 1);
        ck_assert_int_eq((int)num(cJSON_GetArrayItem(ms, i), "step"), 2 * (i + 1));
    }
    ck_assert_int_eq((int)num(o, "last_seq"), 8);
    cJSON_Delete(o);
    snprintf(p, sizeof p, "/api/v1/jobs/%lld/metrics?since=5", (long long)job);
    ck_assert_int_eq(http(s.token, "GET", p, NULL, &o), 200);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(o, "metrics")), 3);
    ck_assert_int_eq((int)num(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "metrics"), 0), "seq"), 6);
    cJSON_Delete(o);
    snprintf(p, sizeof p, "/api/v1/jobs/%lld/metrics", (long long)job);
    ck_assert_int_eq(http(s.token, "POST", p, "{\"metrics\":[{\"seq\":9},{\"seq\":0}]}", &o), 422);
    ty_assert_error(o, "invalid_value", "metrics[1].seq");
    cJSON_Delete(o);
    ck_assert_int_eq(http(s.token, "POST", p, "{\"metrics\":[{\"kind\":\"step\"}]}", &o), 422);
    ty_assert_error(o, "missing_field", "metrics[0].seq");
    cJSON_Delete(o);
    ck_assert_int_eq(http(team_tok, "POST", p, "{\"metrics\":[]}", &o), 403);
    cJSON_Delete(o);
    /* a batch that says another attempt than the job's (a requeued gang's
     * worker still flushing) is refused whole (the workers say theirs: every end-to-end test's
     * metrics are batches that say their attempt) */
    ck_assert_int_eq(http(s.token, "POST", p, "{\"attempt\":2,\"metrics\":[{\"seq\":9,\"kind\":\"step\",\"step\":9}]}",
                          &o), 409);
    ty_assert_error(o, "conflict", "attempt");
    cJSON_Delete(o);
    ck_assert_int_eq(http(s.token, "POST", p, "{\"attempt\":0,\"metrics\":[]}", &o), 422);
    ty_assert_error(o, "invalid_value", "attempt");
    cJSON_Delete(o);
    snprintf(p, sizeof p, "/api/v1/jobs/%lld/metrics?since=8", (long long)job);
    ck_assert_int_eq(http(team_tok, "GET", p, NULL, &o), 200);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(o, "metrics")), 0); /* seq 9 not stored */
    cJSON_Delete(o);
    /* progress: step 16 of 2 epochs x 10 steps at 1000 samples/s, batch 100 */
    o = job_get(job);
    cJSON *pr = cJSON_GetObjectItem(o, "progress");
    ck_assert(cJSON_IsObject(pr));
    ck_assert_int_eq((int)num(pr, "step"), 16);
    ck_assert_int_eq((int)num(pr, "total_steps"), 20);
    ck_assert(fabs(num(pr, "eta_s") - 0.4) < 1e-9);
    ck_assert_int_eq((int)num(cJSON_GetObjectItem(pr, "latest"), "seq"), 8);
    cJSON_Delete(o);

    /* checkpoints: a bad checksum stores nothing; keep=2 prunes */
    static const char data1[] = "checkpoint bytes one";
    char sha[65], bad[65];
    sha256_hex(data1, sizeof data1 - 1, sha);
    sha256_hex("other", 5, bad);
    put_ckpt(&s, data1, sizeof data1 - 1, bad, 10, 422);
    snprintf(p, sizeof p, "/api/v1/jobs/%lld/checkpoints", (long long)job);
    ck_assert_int_eq(http(team_tok, "GET", p, NULL, &o), 200);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(o, "checkpoints")), 0);
    cJSON_Delete(o);
    snprintf(p, sizeof p, "/api/v1/jobs/%lld/checkpoints/latest", (long long)job);
    reply r;
    ck_assert_int_eq(raw(s.token, "GET", p, NULL, 0, NULL, &r), 404);
    buf_release(&r.body);
    int64_t c1 = put_ckpt(&s, data1, sizeof data1 - 1, sha, 10, 201);
    ck_assert_int_eq(raw(s.token, "GET", p, NULL, 0, NULL, &r), 200);
    ck_assert_int_eq(r.body.len, sizeof data1 - 1);
    ck_assert(memcmp(r.body.data, data1, r.body.len) == 0);
    ck_assert_str_eq(r.sha, sha);
    buf_release(&r.body);
    int64_t last = 0;
    for (int i = 2; i <= 4; i++) {
        char d[64], h[65];
        int n = snprintf(d, sizeof d, "checkpoint bytes %d", i);
        sha256_hex(d, (size_t)n, h);
        last = put_ckpt(&s, d, (size_t)n, h, 10 * i, 201);
    }
    snprintf(p, sizeof p, "/api/v1/jobs/%lld/checkpoints", (long long)job);
    ck_assert_int_eq(http(team_tok, "GET", p, NULL, &o), 200);
    cJSON *cl = cJSON_GetObjectItem(o, "checkpoints");
    ck_assert_int_eq(cJSON_GetArraySize(cl), 2);
    ck_assert_int_eq((int64_t)num(cJSON_GetArrayItem(cl, 0), "id"), last);
    ck_assert_int_eq((int)num(cJSON_GetArrayItem(cl, 0), "step"), 40);
    char want_sha[65];
    sha256_hex("checkpoint bytes 4", 18, want_sha);
    ck_assert_str_eq(str(cJSON_GetArrayItem(cl, 0), "sha256"), want_sha);
    cJSON_Delete(o);
    char dir[600];
    snprintf(dir, sizeof dir, "%s/checkpoints/%lld", srv.dir, (long long)job);
    ck_assert_int_eq(count_files(dir), 2);
    snprintf(p, sizeof p, "/api/v1/jobs/%lld/checkpoints/%lld", (long long)job, (long long)c1);
    ck_assert_int_eq(raw(team_tok, "GET", p, NULL, 0, NULL, &r), 404); /* pruned */
    buf_release(&r.body);
    snprintf(p, sizeof p, "/api/v1/jobs/%lld/checkpoints/%lld", (long long)job, (long long)last);
    ck_assert_int_eq(raw(team_tok, "GET", p, NULL, 0, NULL, &r), 200);
    ck_assert_str_eq(r.sha, want_sha);
    buf_release(&r.body);

    /* logs: appended chunks, read from an offset; X-Next-Offset says where
     * to read on, also before the task has written anything */
    snprintf(p, sizeof p, "/api/v1/jobs/%lld/logs?task=worker-0", (long long)job);
    ck_assert_int_eq(raw(team_tok, "GET", p, NULL, 0, NULL, &r), 200);
    ck_assert_int_eq((long)r.body.len, 0);
    ck_assert_str_eq(r.next, "0");
    buf_release(&r.body);
    ck_assert_int_eq(raw(node_tok, "POST", p, "line one\n", 9, NULL, &r), 200);
    buf_release(&r.body);
    ck_assert_int_eq(raw(s.token, "POST", p, "line two\n", 9, NULL, &r), 200);
    buf_release(&r.body);
    ck_assert_int_eq(raw(team_tok, "GET", p, NULL, 0, NULL, &r), 200);
    ck_assert_str_eq(r.body.data, "line one\nline two\n");
    ck_assert_str_eq(r.next, "18");
    buf_release(&r.body);
    snprintf(p, sizeof p, "/api/v1/jobs/%lld/logs?task=worker-0&since=9", (long long)job);
    ck_assert_int_eq(raw(team_tok, "GET", p, NULL, 0, NULL, &r), 200);
    ck_assert_str_eq(r.body.data, "line two\n");
    ck_assert_str_eq(r.next, "18");
    buf_release(&r.body);

    /* rendezvous */
    snprintf(p, sizeof p, "/api/v1/jobs/%lld/rendezvous/ring-0", (long long)job);
    ck_assert_int_eq(raw(s.token, "GET", p, NULL, 0, NULL, &r), 404);
    buf_release(&r.body);
    ck_assert_int_eq(raw(s.token, "PUT", p, "{\"addr\":\"127.0.0.1:7001\"}", 25, NULL, &r), 200);
    buf_release(&r.body);
    ck_assert_int_eq(raw(s.token, "GET", p, NULL, 0, NULL, &r), 200);
    ck_assert_str_eq(r.body.data, "{\"addr\":\"127.0.0.1:7001\"}");
    buf_release(&r.body);

    /* the chief exits 0: succeeded, devices freed, the task token revoked */
    report(s.task, "{\"state\":\"exited\",\"exit_code\":0}", 200);
    job_state(job, st, sizeof st);
    ck_assert_str_eq(st, "succeeded");
    ck_assert_int_eq(devices_in_use(), 0);
    report(s.task, "{\"state\":\"exited\",\"exit_code\":0}", 200); /* retried report */
    report(s.task, "{\"state\":\"running\"}", 409);
    snprintf(p, sizeof p, "/api/v1/jobs/%lld/metrics", (long long)job);
    ck_assert_int_eq(http(s.token, "GET", p, NULL, &o), 401);
    cJSON_Delete(o);
}
END_TEST

START_TEST(failure_requeues_then_fails) {
    int64_t job = submit(SPEC("crash", ",\"max_restarts\":1"));
    started s = take_start(job);
    ck_assert_int_eq(s.attempt, 1);
    report(s.task, "{\"state\":\"running\"}", 200);
    report(s.task, "{\"state\":\"exited\",\"exit_code\":1,\"reason\":\"crashed\",\"log_tail\":\"Traceback: boom\\n\"}",
           200);
    cJSON *o = job_get(job);
    ck_assert_str_ne(str(o, "state"), "failed");
    cJSON_Delete(o);
    /* the timeline says why it was requeued */
    char p[96];
    snprintf(p, sizeof p, "/api/v1/jobs/%lld/events", (long long)job);
    ck_assert_int_eq(http(team_tok, "GET", p, NULL, &o), 200);
    int requeued = 0;
    cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(o, "events")) {
        cJSON *to = cJSON_GetObjectItem(e, "to"), *why = cJSON_GetObjectItem(e, "reason");
        if (cJSON_IsString(to) && strcmp(to->valuestring, "queued") == 0 && cJSON_IsString(why) &&
            strstr(why->valuestring, "worker-0 exited with code 1: crashed") &&
            strstr(why->valuestring, "requeued (restart 1 of 1)"))
            requeued = 1;
    }
    ck_assert_msg(requeued, "no requeue event with the task's reason");
    cJSON_Delete(o);
    ck_assert_int_le(devices_in_use(), 1); /* freed, and maybe held again by attempt 2 already */

    started s2 = take_start(job); /* the scheduler placed it again */
    ck_assert_int_eq(s2.attempt, 2);
    ck_assert_int_ne(s2.task, s.task);
    report(s2.task, "{\"state\":\"running\"}", 200);
    wait_state(job, "running", 2000);
    report(s2.task, "{\"state\":\"exited\",\"exit_code\":3,\"log_tail\":\"Traceback: boom again\\n\"}", 200);
    o = job_get(job);
    ck_assert_str_eq(str(o, "state"), "failed");
    ck_assert_ptr_nonnull(strstr(str(o, "reason"), "exited with code 3"));
    ck_assert_ptr_nonnull(strstr(str(o, "reason"), "boom again"));
    ck_assert_int_eq((int)num(o, "attempt"), 2);
    cJSON_Delete(o);
    ck_assert_int_eq(devices_in_use(), 0);
}
END_TEST

typedef struct poll_arg {
    cJSON *reply;
    int64_t ms;
} poll_arg;

static void *long_poll(void *p) {
    poll_arg *a = p;
    int64_t t0 = mono_ms();
    char path[96];
    snprintf(path, sizeof path, "/api/v1/nodes/%lld/assignments?wait=20", (long long)node_id);
    client c;
    if (client_init(&c, srv.url, node_tok) < 0) return NULL;
    client_reply r;
    if (client_request(&c, "GET", path, NULL, 0, NULL, &r) == 0 && r.status == 200)
        a->reply = cJSON_ParseWithLength(r.body.data, r.body.len);
    client_reply_release(&r);
    client_release(&c);
    a->ms = mono_ms() - t0;
    return NULL;
}

START_TEST(cancel_reaches_the_long_poll) {
    int64_t job = submit(SPEC("cancel-me", ""));
    started s = take_start(job);
    report(s.task, "{\"state\":\"running\"}", 200);
    cJSON *o = assignments(0); /* nothing to stop yet */
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(o, "stop")), 0);
    cJSON_Delete(o);
    poll_arg a = {NULL, 0};
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, long_poll, &a), 0);
    ty_sleep_ms(500);
    char p[64];
    snprintf(p, sizeof p, "/api/v1/jobs/%lld/cancel", (long long)job);
    ck_assert_int_eq(http(team_tok, "POST", p, NULL, &o), 200);
    ck_assert_str_eq(str(o, "state"), "cancelled");
    cJSON_Delete(o);
    pthread_join(th, NULL);
    ck_assert_ptr_nonnull(a.reply);
    ck_assert_msg(a.ms < 3000, "the long-poll took %lld ms", (long long)a.ms);
    cJSON *stop = cJSON_GetArrayItem(cJSON_GetObjectItem(a.reply, "stop"), 0);
    ck_assert_ptr_nonnull(stop);
    ck_assert_int_eq((int64_t)num(stop, "task"), s.task);
    ck_assert_str_eq(str(stop, "reason"), "cancelled");
    ck_assert_int_gt((int)num(stop, "grace_s"), 0);
    cJSON_Delete(a.reply);
    ck_assert_int_eq(devices_in_use(), 1); /* held until the task exits */
    report(s.task, "{\"state\":\"exited\",\"signal\":15}", 200);
    ck_assert_int_eq(devices_in_use(), 0);
    char st[32];
    job_state(job, st, sizeof st);
    ck_assert_str_eq(st, "cancelled");
    /* a cancel before the hand-out frees the devices at once */
    int64_t job2 = submit(SPEC("cancel-early", ""));
    for (int i = 0; i < 100; i++) {
        job_state(job2, st, sizeof st);
        if (strcmp(st, "starting") == 0) break;
        ty_sleep_ms(50);
    }
    ck_assert_str_eq(st, "starting");
    snprintf(p, sizeof p, "/api/v1/jobs/%lld/cancel", (long long)job2);
    ck_assert_int_eq(http(team_tok, "POST", p, NULL, &o), 200);
    cJSON_Delete(o);
    ck_assert_int_eq(devices_in_use(), 0);
    o = assignments(0);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(o, "start")), 0);
    cJSON_Delete(o);
}
END_TEST

/* GET /jobs/{id} and GET /jobs are answered from what each server thread
 * kept until the next commit (api/answer_cache.h): every answer given after
 * a write was acknowledged shows it, whichever thread answers (three GETs
 * of each on fresh connections after every write), and a team that may not
 * see the job still gets its 404 after the owner's answer was kept. */
static int64_t listed_step(int64_t job) {
    cJSON *o = NULL;
    ck_assert_int_eq(http(team_tok, "GET", "/api/v1/jobs?limit=5", NULL, &o), 200);
    int64_t step = -1;
    cJSON *j;
    cJSON_ArrayForEach(j, cJSON_GetObjectItem(o, "jobs")) {
        if ((int64_t)num(j, "id") != job) continue;
        cJSON *p = cJSON_GetObjectItem(j, "progress");
        step = cJSON_IsObject(p) ? (int64_t)num(p, "step") : 0;
    }
    cJSON_Delete(o);
    return step;
}

START_TEST(answers_follow_writes) {
    int64_t job = submit(SPEC("fresh", ""));
    started s = take_start(job);
    report(s.task, "{\"state\":\"running\"}", 200);
    for (int i = 1; i <= 40; i++) {
        post_metrics(&s, i, i);
        for (int k = 0; k < 3; k++) {
            cJSON *o = job_get(job);
            cJSON *p = cJSON_GetObjectItem(o, "progress");
            ck_assert_msg(cJSON_IsObject(p) && (int64_t)num(p, "step") == 2 * i, "after metric %d, GET shows step %lld",
                          i, cJSON_IsObject(p) ? (long long)num(p, "step") : -1LL);
            cJSON_Delete(o);
            int64_t ls = listed_step(job);
            ck_assert_msg(ls == 2 * i, "after metric %d, the list shows step %lld", i, (long long)ls);
        }
    }
    /* another team: 404 on a job whose answer the owner's GETs keep */
    cJSON *o = NULL;
    ck_assert_int_eq(http(admin_tok, "POST", "/api/v1/teams", "{\"name\":\"other\"}", &o), 201);
    char other[128];
    snprintf(other, sizeof other, "%s", str(o, "token"));
    cJSON_Delete(o);
    char p[64];
    snprintf(p, sizeof p, "/api/v1/jobs/%lld", (long long)job);
    for (int k = 0; k < 3; k++) {
        cJSON_Delete(job_get(job));
        ck_assert_int_eq(http(other, "GET", p, NULL, &o), 404);
        cJSON_Delete(o);
        ck_assert_int_eq(http(other, "GET", "/api/v1/jobs", NULL, &o), 200);
        ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(o, "jobs")), 0);
        cJSON_Delete(o);
    }
    /* a cancel shows at once */
    snprintf(p, sizeof p, "/api/v1/jobs/%lld/cancel", (long long)job);
    ck_assert_int_eq(http(team_tok, "POST", p, NULL, &o), 200);
    cJSON_Delete(o);
    for (int k = 0; k < 3; k++) {
        char st[32];
        job_state(job, st, sizeof st);
        ck_assert_str_eq(st, "cancelled");
    }
}
END_TEST

START_TEST(events_stream_and_scoping) {
    int64_t job = submit(SPEC("watch", ""));
    started s = take_start(job);
    report(s.task, "{\"state\":\"running\"}", 200);
    post_metrics(&s, 1, 2);
    report(s.task, "{\"state\":\"exited\",\"exit_code\":0}", 200);
    char p[96];
    snprintf(p, sizeof p, "/api/v1/jobs/%lld/events?since=0", (long long)job);
    const char *hs[] = {"Accept: text/event-stream", NULL};
    reply r;
    ck_assert_int_eq(raw(team_tok, "GET", p, NULL, 0, hs, &r), 200);
    ck_assert_ptr_nonnull(strstr(r.body.data, "event: state"));
    ck_assert_ptr_nonnull(strstr(r.body.data, "\"to\":\"running\""));
    ck_assert_ptr_nonnull(strstr(r.body.data, "\"to\":\"succeeded\""));
    ck_assert_ptr_nonnull(strstr(r.body.data, "event: metric"));
    buf_release(&r.body);
    /* without the Accept header: the JSON timeline as before */
    cJSON *o = NULL;
    ck_assert_int_eq(http(team_tok, "GET", p, NULL, &o), 200);
    ck_assert(cJSON_IsArray(cJSON_GetObjectItem(o, "events")));
    cJSON_Delete(o);

    /* scoping: another team and another job's task token see a 404 */
    ck_assert_int_eq(http(admin_tok, "POST", "/api/v1/teams", "{\"name\":\"other\"}", &o), 201);
    char other[128];
    snprintf(other, sizeof other, "%s", str(o, "token"));
    cJSON_Delete(o);
    snprintf(p, sizeof p, "/api/v1/jobs/%lld/metrics", (long long)job);
    ck_assert_int_eq(http(other, "GET", p, NULL, &o), 404);
    cJSON_Delete(o);
    ck_assert_int_eq(http(node_tok, "GET", p, NULL, &o), 403);
    cJSON_Delete(o);
    int64_t job2 = submit(SPEC("other-job", ""));
    started s2 = take_start(job2);
    ck_assert_int_eq(http(s2.token, "GET", p, NULL, &o), 404);
    cJSON_Delete(o);
    snprintf(p, sizeof p, "/api/v1/jobs/%lld/checkpoints", (long long)job);
    ck_assert_int_eq(http(s2.token, "GET", p, NULL, &o), 404);
    cJSON_Delete(o);
    /* unknown node, unknown task, bad report */
    ck_assert_int_eq(http(admin_tok, "GET", "/api/v1/nodes/999/assignments", NULL, &o), 404);
    cJSON_Delete(o);
    /* a node's token acts for its own node only */
    ck_assert_int_eq(http(node_tok, "GET", "/api/v1/nodes/999/assignments", NULL, &o), 403);
    cJSON_Delete(o);
    report(99999, "{\"state\":\"running\"}", 404);
    snprintf(p, sizeof p, "/api/v1/tasks/%lld/status", (long long)s2.task);
    ck_assert_int_eq(http(node_tok, "POST", p, "{\"state\":\"sleeping\"}", &o), 422);
    ty_assert_error(o, "invalid_value", "state");
    cJSON_Delete(o);
    ck_assert_int_eq(http(node_tok, "POST", p, "{\"state\":\"exited\"}", &o), 422);
    ty_assert_error(o, "missing_field", "exit_code");
    cJSON_Delete(o);
    ck_assert_int_eq(http(s2.token, "POST", p, "{\"state\":\"running\"}", &o), 403);
    cJSON_Delete(o);
}
END_TEST


/* ---------------------------------------------------------------- parked waits
 * The server serves every connection from a small pool of threads; a
 * long-poll, a rendezvous wait and an event stream park their request
 * instead of holding a thread. Many of each at once must leave the pool
 * free for everyone else, and each must come back when its news arrives. */

typedef struct waiter {
    char path[160];
    const char *token;
    int sse;                          /* Accept: text/event-stream */
    long status;
    buf body;
    int64_t t0, ms;                   /* start; how long the request took */
    volatile int64_t metric_at;       /* sse: when "event: metric" first arrived (mono ms) */
} waiter;

static size_t waiter_body(char *p, size_t sz, size_t n, void *cls) {
    waiter *w = cls;
    if (buf_append(&w->body, p, sz * n) < 0) return 0;
    if (w->sse && !w->metric_at && w->body.data && strstr(w->body.data, "event: metric")) w->metric_at = mono_ms();
    return sz * n;
}

static void *waiter_main(void *arg) {
    waiter *w = arg;
    buf_init(&w->body, 1u << 20);
    CURL *c = curl_easy_init();
    if (!c) return NULL;
    char url[512], auth[300];
    snprintf(url, sizeof url, "%s%s", srv.url, w->path);
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", w->token);
    struct curl_slist *h = curl_slist_append(NULL, auth);
    if (w->sse) h = curl_slist_append(h, "Accept: text/event-stream");
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, waiter_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, w);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
    w->t0 = mono_ms();
    if (curl_easy_perform(c) == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &w->status);
    w->ms = mono_ms() - w->t0;
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    return NULL;
}

#define N_POLL 12
#define N_RDV 12
#define N_SSE 8

START_TEST(parked_waits_hold_no_thread) {
    int64_t job = submit(SPEC("parked", ""));
    started s = take_start(job);
    report(s.task, "{\"state\":\"running\"}", 200);
    cJSON *o = assignments(0);
    cJSON_Delete(o);

    static waiter w[N_POLL + N_RDV + N_SSE];
    pthread_t th[N_POLL + N_RDV + N_SSE];
    memset(w, 0, sizeof w);
    for (int i = 0; i < N_POLL + N_RDV + N_SSE; i++) {
        if (i < N_POLL) {
            snprintf(w[i].path, sizeof w[i].path, "/api/v1/nodes/%lld/assignments?wait=6", (long long)node_id);
            w[i].token = node_tok;
        } else if (i < N_POLL + N_RDV) {
            snprintf(w[i].path, sizeof w[i].path, "/api/v1/jobs/%lld/rendezvous/ready?wait=30", (long long)job);
            w[i].token = s.token;
        } else {
            snprintf(w[i].path, sizeof w[i].path, "/api/v1/jobs/%lld/events?since=0", (long long)job);
            w[i].token = team_tok;
            w[i].sse = 1;
        }
        ck_assert_int_eq(pthread_create(&th[i], NULL, waiter_main, &w[i]), 0);
    }
    ty_sleep_ms(500); /* all parked */

    /* the pool serves everyone else meanwhile (a pool thread held by a wait would stall these for seconds) */
    int64_t worst = 0;
    for (int i = 0; i < 40; i++) {
        int64_t t0 = mono_ms();
        cJSON_Delete(job_get(job));
        int64_t ms = mono_ms() - t0;
        if (ms > worst) worst = ms;
    }
    ck_assert_msg(worst < 1500, "GET /jobs/{id} took %lld ms beside %d parked waits", (long long)worst,
                  N_POLL + N_RDV + N_SSE);

    /* a metric reaches every event stream; the put of a key every rendezvous wait */
    post_metrics(&s, 1, 1);
    int64_t t_put = mono_ms();
    reply r;
    ck_assert_int_eq(raw(s.token, "PUT", "/api/v1/jobs/0/rendezvous/x", "1", 1, NULL, &r), 404);
    buf_release(&r.body);
    char p[128];
    snprintf(p, sizeof p, "/api/v1/jobs/%lld/rendezvous/ready", (long long)job);
    ck_assert_int_eq(raw(s.token, "PUT", p, "{\"go\":1}", 8, NULL, &r), 200);
    buf_release(&r.body);
    for (int i = N_POLL; i < N_POLL + N_RDV; i++) {
        pthread_join(th[i], NULL);
        ck_assert_int_eq(w[i].status, 200);
        ck_assert_str_eq(w[i].body.data, "{\"go\":1}");
        /* woken by the put, not by its 30 s deadline */
        ck_assert_msg(w[i].t0 + w[i].ms - t_put < 5000, "a rendezvous wait came back %lld ms after the put",
                      (long long)(w[i].t0 + w[i].ms - t_put));
        buf_release(&w[i].body);
    }
    for (int k = 0; k < 100; k++) {
        int all = 1;
        for (int i = N_POLL + N_RDV; i < N_POLL + N_RDV + N_SSE; i++) all &= w[i].metric_at != 0;
        if (all) break;
        ty_sleep_ms(50);
    }
    for (int i = N_POLL + N_RDV; i < N_POLL + N_RDV + N_SSE; i++)
        ck_assert_msg(w[i].metric_at, "event stream %d never got the metric", i);

    /* a new job is handed out to one of the parked long-polls (the others answer at their deadline) */
    int64_t job2 = submit(SPEC("parked-2", ""));
    int handed = 0;
    for (int i = 0; i < N_POLL; i++) {
        pthread_join(th[i], NULL);
        ck_assert_int_eq(w[i].status, 200);
        cJSON *a = cJSON_Parse(w[i].body.data);
        ck_assert_ptr_nonnull(a);
        cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItem(a, "start")) handed += (int64_t)num(it, "job") == job2;
        cJSON_Delete(a);
        buf_release(&w[i].body);
    }
    ck_assert_int_eq(handed, 1);

    /* the job ends: every stream ends after its last events */
    report(s.task, "{\"state\":\"exited\",\"exit_code\":0}", 200);
    for (int i = N_POLL + N_RDV; i < N_POLL + N_RDV + N_SSE; i++) {
        pthread_join(th[i], NULL);
        ck_assert_int_eq(w[i].status, 200);
        ck_assert_ptr_nonnull(strstr(w[i].body.data, "\"to\":\"succeeded\""));
        buf_release(&w[i].body);
    }
}
END_TEST

/* A server told to stop while requests are parked answers them and exits
 * cleanly (libmicrohttpd must not be stopped with a connection suspended). */
START_TEST(stop_with_parked_waits) {
    int64_t job = submit(SPEC("parked-stop", ""));
    started s = take_start(job);
    report(s.task, "{\"state\":\"running\"}", 200);
    static waiter w[3];
    pthread_t th[3];
    memset(w, 0, sizeof w);
    snprintf(w[0].path, sizeof w[0].path, "/api/v1/nodes/%lld/assignments?wait=30", (long long)node_id);
    w[0].token = node_tok;
    snprintf(w[1].path, sizeof w[1].path, "/api/v1/jobs/%lld/rendezvous/never?wait=30", (long long)job);
    w[1].token = s.token;
    snprintf(w[2].path, sizeof w[2].path, "/api/v1/jobs/%lld/events", (long long)job);
    w[2].token = team_tok;
    w[2].sse = 1;
    cJSON_Delete(assignments(0));
    for (int i = 0; i < 3; i++) ck_assert_int_eq(pthread_create(&th[i], NULL, waiter_main, &w[i]), 0);
    ty_sleep_ms(500);
    int64_t t0 = mono_ms();
    int st = ty_kill(&srv, SIGTERM);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the server's exit status: %d", st);
    ck_assert_msg(mono_ms() - t0 < 5000, "the server took %lld ms to stop", (long long)(mono_ms() - t0));
    for (int i = 0; i < 3; i++) {
        pthread_join(th[i], NULL);
        ck_assert_msg(w[i].ms < 10000, "wait %d lasted %lld ms", i, (long long)w[i].ms);
        buf_release(&w[i].body);
    }
    ck_assert_int_eq(w[0].status, 200); /* the poll answers (empty) */
    ck_assert_int_eq(w[2].status, 200); /* the stream ends */
}
END_TEST

/* A checkpoint upload's disk work (its sha256, the file written and
 * fsynced, two transactions) runs on the offload thread, not on the pool
 * thread that read it: with one pool thread (TRAINYARD_HTTP_THREADS=1),
 * GETs beside three 32 MiB uploads are answered in under half of an
 * upload's time (3 ms against 99-198 here; 33 against 208-306 under ASan),
 * not behind its work (a GET waited 150 ms beside 105 ms uploads without
 * the offload). */
typedef struct uploads {
    started s;
    int64_t ms[3];
    int done;
} uploads;

static void *upload_main(void *p) {
    uploads *u = p;
    size_t len = 32u << 20;
    char *data = malloc(len);
    ck_assert_ptr_nonnull(data);
    for (size_t i = 0; i < len; i++) data[i] = (char)(i * 2654435761u >> 13);
    char sha[65];
    sha256_hex(data, len, sha);
    for (int k = 0; k < 3; k++) {
        int64_t t0 = mono_ms();
        put_ckpt(&u->s, data, len, sha, 10 * (k + 1), 201);
        u->ms[k] = mono_ms() - t0;
    }
    free(data);
    __atomic_store_n(&u->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

START_TEST(upload_work_holds_no_pool_thread) {
    stop();
    setenv("TRAINYARD_HTTP_THREADS", "1", 1);
    start();
    int64_t job = submit(SPEC("big-ckpt", ",\"checkpoint\":{\"every_epochs\":1,\"keep\":1}"));
    uploads u;
    memset(&u, 0, sizeof u);
    u.s = take_start(job);
    report(u.s.task, "{\"state\":\"running\"}", 200);
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, upload_main, &u), 0);
    int64_t worst = 0;
    int n = 0;
    while (!__atomic_load_n(&u.done, __ATOMIC_ACQUIRE)) {
        int64_t t0 = mono_ms();
        cJSON *o = NULL;
        ck_assert_int_eq(http(team_tok, "GET", "/api/v1/health", NULL, &o), 200);
        cJSON_Delete(o);
        int64_t ms = mono_ms() - t0;
        if (ms > worst) worst = ms;
        n++;
        ty_sleep_ms(2);
    }
    pthread_join(th, NULL);
    int64_t shortest = u.ms[0];
    for (int k = 1; k < 3; k++)
        if (u.ms[k] < shortest) shortest = u.ms[k];
    printf("uploads of 32 MiB: %lld, %lld, %lld ms; %d GETs beside them, the slowest %lld ms\n", (long long)u.ms[0],
           (long long)u.ms[1], (long long)u.ms[2], n, (long long)worst);
    ck_assert_msg(worst * 2 < shortest, "a GET waited %lld ms beside uploads of %lld ms", (long long)worst,
                  (long long)shortest);
    cJSON *o = NULL;
    char p[96];
    snprintf(p, sizeof p, "/api/v1/jobs/%lld/checkpoints", (long long)job);
    ck_assert_int_eq(http(team_tok, "GET", p, NULL, &o), 200);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(o, "checkpoints")), 1); /* keep 1 */
    cJSON_Delete(o);
}
END_TEST

/* ---------------------------------------------------------------- stale senders */

/* A task handed out: its token and config (owned). */
typedef struct handed {
    int64_t task;
    int attempt, index;
    char type[16], token[128];
    cJSON *config;
} handed;

/* Takes the n tasks of job's next attempt, as the node's agent would. */
static void take_all(int64_t job, handed *out, int n) {
    memset(out, 0, (size_t)n * sizeof *out);
    int got = 0;
    for (int i = 0; i < 20 && got < n; i++) {
        cJSON *o = assignments(2);
        cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItem(o, "start")) {
            if ((int64_t)num(it, "job") != job || got == n) continue;
            handed *h = &out[got++];
            h->task = (int64_t)num(it, "task");
            h->attempt = (int)num(it, "attempt");
            snprintf(h->token, sizeof h->token, "%s", str(it, "token"));
            h->config = cJSON_Duplicate(cJSON_GetObjectItem(it, "config"), 1);
            ck_assert_ptr_nonnull(h->config);
            const cJSON *t = cJSON_GetObjectItem(h->config, "task");
            snprintf(h->type, sizeof h->type, "%s", str(t, "type"));
            h->index = (int)num(t, "index");
        }
        cJSON_Delete(o);
    }
    ck_assert_msg(got == n, "job %lld: %d of %d tasks handed out", (long long)job, got, n);
}

static handed *find_task(handed *v, int n, const char *type, int index) {
    for (int i = 0; i < n; i++)
        if (strcmp(v[i].type, type) == 0 && v[i].index == index) return &v[i];
    ck_abort_msg("no %s-%d among the tasks handed out", type, index);
    return NULL;
}

static void handed_release(handed *v, int n) {
    for (int i = 0; i < n; i++) cJSON_Delete(v[i].config);
}

/* `trainyard worker` started as the agent starts it, for the task h (its
 * config's api pointed at this server), its output into log. */
static pid_t worker_spawn(const handed *h, const char *log) {
    cJSON *cfg = cJSON_Duplicate(h->config, 1);
    ck_assert_ptr_nonnull(cfg);
    cJSON_ReplaceItemInObject(cfg, "api", cJSON_CreateString(srv.url));
    char *text = cJSON_PrintUnformatted(cfg);
    cJSON_Delete(cfg);
    ck_assert_ptr_nonnull(text);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* a failed case leaves no worker behind */
        if (!freopen(log, "a", stderr) || dup2(2, 1) < 0) _exit(126);
        setenv("TRAINYARD_CONFIG", text, 1);
        execl(ty_bin(), ty_bin(), "worker", (char *)NULL);
        _exit(127);
    }
    free(text);
    return pid;
}

/* The worker's exit code, once it has exited (within timeout_s), and its
 * output (the caller frees). */
static int worker_end(pid_t pid, const char *log, int timeout_s, char **out) {
    int st = 0;
    int64_t end = mono_ms() + (int64_t)timeout_s * 1000;
    while (waitpid(pid, &st, WNOHANG) == 0) {
        if (mono_ms() > end) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            size_t len = 0;
            char *txt = file_read_all(log, 1 << 20, &len);
            ck_abort_msg("the worker did not exit within %d s:\n%.4000s", timeout_s, txt ? txt : "");
        }
        ty_sleep_ms(50);
    }
    size_t len = 0;
    *out = file_read_all(log, 1 << 20, &len);
    ck_assert_ptr_nonnull(*out);
    ck_assert_msg(WIFEXITED(st), "the worker was killed by signal %d:\n%.4000s", WTERMSIG(st), *out);
    return WEXITSTATUS(st);
}

static int metrics_count(int64_t job, const char *kind) {
    char p[128];
    snprintf(p, sizeof p, "/api/v1/jobs/%lld/metrics?since=0%s%s", (long long)job, kind ? "&kind=" : "",
             kind ? kind : "");
    cJSON *o = NULL;
    ck_assert_int_eq(http(team_tok, "GET", p, NULL, &o), 200);
    int n = cJSON_GetArraySize(cJSON_GetObjectItem(o, "metrics"));
    cJSON_Delete(o);
    return n;
}

/* Fails task h (exit code 1): the gang is requeued; its next attempt is
 * handed out (n tasks, into next) and the job is at attempt 2. */
static void requeue_to_attempt_2(int64_t job, const handed *h, handed *next, int n) {
    report(h->task, "{\"state\":\"exited\",\"exit_code\":1,\"reason\":\"failed on purpose\"}", 200);
    take_all(job, next, n);
    for (int i = 0; i < n; i++) ck_assert_int_eq(next[i].attempt, 2);
    cJSON *o = job_get(job);
    ck_assert_int_eq((int)num(o, "attempt"), 2);
    cJSON_Delete(o);
}

/* A command job's chief of attempt 1 still running after its peer failed
 * and the gang was requeued (attempt 2 handed out): its program's metric
 * line goes out saying attempt 1, is refused (409), and nothing is stored;
 * the worker logs that its attempt is over. */
START_TEST(stale_command_chief_metrics_refused) {
    char dir[256], path[400], log[400];
    ty_mkdtemp(dir, sizeof dir, "stalecmd");
    char spec[1024];
    snprintf(spec, sizeof spec,
             "{\"name\":\"stale-cmd\",\"command\":{\"argv\":[\"/bin/sh\",\"-c\","
             "\"touch $OUT/started; while [ ! -e $OUT/go ]; do sleep 0.05; done; "
             "echo 'trainyard-metric {\\\"step\\\": 7, \\\"loss\\\": 0.5}'\"],\"env\":{\"OUT\":\"%s\"}},"
             "\"strategy\":{\"type\":\"multi_worker_mirrored\"},\"resources\":{\"workers\":2,\"device\":\"cpu\"},"
             "\"max_restarts\":1}",
             dir);
    int64_t job = submit(spec);
    handed a1[2], a2[2];
    take_all(job, a1, 2);
    handed *w0 = find_task(a1, 2, "worker", 0), *w1 = find_task(a1, 2, "worker", 1);
    report(w0->task, "{\"state\":\"running\"}", 200);
    report(w1->task, "{\"state\":\"running\"}", 200);
    /* worker-1's address, as its runner would publish it */
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/rendezvous/command-worker-1", (long long)job);
    ck_assert_int_eq(http(w1->token, "PUT", path, "{\"addr\":\"127.0.0.1\",\"port\":1}", NULL), 200);
    snprintf(log, sizeof log, "%s/worker-0.log", dir);
    pid_t pid = worker_spawn(w0, log);
    snprintf(path, sizeof path, "%s/started", dir);
    for (int i = 0; i < 600 && access(path, F_OK) != 0; i++) ty_sleep_ms(50);
    ck_assert_msg(access(path, F_OK) == 0, "the program of worker-0 did not start");

    requeue_to_attempt_2(job, w1, a2, 2);
    snprintf(path, sizeof path, "%s/go", dir);
    ck_assert_int_eq(file_write_atomic(path, "", 0, 0644), 0);
    char *out = NULL;
    ck_assert_int_eq(worker_end(pid, log, 60, &out), 0); /* the program's own status */
    ck_assert_msg(strstr(out, "attempt 1 is over") != NULL, "worker-0 of attempt 1:\n%.4000s", out);
    ck_assert_msg(strstr(out, "1 metric line(s) read") != NULL, "worker-0 of attempt 1:\n%.4000s", out);
    free(out);
    ck_assert_int_eq(metrics_count(job, NULL), 0);
    handed_release(a1, 2);
    handed_release(a2, 2);
    ty_rmrf(dir);
}
END_TEST

/* The evaluator of attempt 1, started after the gang was requeued: its
 * eval metrics go out saying attempt 1 and are refused; it stops there
 * (exit 143, as stopped) and nothing is stored. The checkpoints it reads
 * are attempt 1's, made by a real worker beforehand. */
START_TEST(stale_evaluator_metrics_refused) {
    char dir[256], log[400];
    ty_mkdtemp(dir, sizeof dir, "staleeval");
    int64_t job = submit(
        "{\"name\":\"stale-eval\",\"model\":{\"layers\":[{\"type\":\"dense\",\"units\":8,\"activation\":\"relu\","
        "\"input_shape\":[4]},{\"type\":\"dense\",\"units\":1,\"activation\":\"sigmoid\"}]},"
        "\"compile\":{\"optimizer\":{\"type\":\"sgd\",\"learning_rate\":0.1},\"loss\":\"binary_crossentropy\","
        "\"metrics\":[\"accuracy\"]},\"data\":{\"source\":\"synthetic\",\"examples\":1000,\"features\":4,"
        "\"validation_split\":0.2},\"fit\":{\"epochs\":2,\"batch_size\":100},"
        "\"resources\":{\"workers\":1,\"device\":\"cpu\",\"evaluator\":true},"
        "\"checkpoint\":{\"every_epochs\":1,\"keep\":10},\"max_restarts\":1}");
    handed a1[2], a2[2];
    take_all(job, a1, 2);
    handed *w0 = find_task(a1, 2, "worker", 0), *ev = find_task(a1, 2, "evaluator", 0);
    report(w0->task, "{\"state\":\"running\"}", 200);
    report(ev->task, "{\"state\":\"running\"}", 200);
    /* attempt 1's chief trains and checkpoints each epoch */
    snprintf(log, sizeof log, "%s/worker-0.log", dir);
    char *out = NULL;
    ck_assert_int_eq(worker_end(worker_spawn(w0, log), log, 60, &out), 0);
    free(out);
    char p[96];
    snprintf(p, sizeof p, "/api/v1/jobs/%lld/checkpoints", (long long)job);
    cJSON *o = NULL;
    ck_assert_int_eq(http(team_tok, "GET", p, NULL, &o), 200);
    /* one per epoch, or the last alone (a newer one replaces one not uploaded yet) */
    ck_assert_int_ge(cJSON_GetArraySize(cJSON_GetObjectItem(o, "checkpoints")), 1);
    cJSON_Delete(o);
    ck_assert_int_eq(metrics_count(job, "eval"), 0);

    requeue_to_attempt_2(job, w0, a2, 2);
    snprintf(log, sizeof log, "%s/evaluator-0.log", dir);
    ck_assert_int_eq(worker_end(worker_spawn(ev, log), log, 60, &out), 143);
    ck_assert_msg(strstr(out, "attempt 1 is over") != NULL, "evaluator-0 of attempt 1:\n%.4000s", out);
    ck_assert_msg(strstr(out, "eval_accuracy") != NULL, "evaluator-0 evaluated nothing:\n%.4000s", out);
    free(out);
    ck_assert_int_eq(metrics_count(job, "eval"), 0);
    handed_release(a1, 2);
    handed_release(a2, 2);
    ty_rmrf(dir);
}
END_TEST

int main(void) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    Suite *s = suite_create("exec_api");
    TCase *tc = tcase_create("server");
    tcase_add_checked_fixture(tc, start, stop);
    tcase_set_timeout(tc, 90);
    tcase_add_test(tc, job_runs_to_succeeded);
    tcase_add_test(tc, failure_requeues_then_fails);
    tcase_add_test(tc, cancel_reaches_the_long_poll);
    tcase_add_test(tc, events_stream_and_scoping);
    tcase_add_test(tc, answers_follow_writes);
    tcase_add_test(tc, upload_work_holds_no_pool_thread);
    tcase_add_test(tc, parked_waits_hold_no_thread);
    tcase_add_test(tc, stop_with_parked_waits);
    suite_add_tcase(s, tc);
    /* the real worker binary, started here as an agent would */
    TCase *stale = tcase_create("stale");
    tcase_add_checked_fixture(stale, start, stop);
    tcase_set_timeout(stale, 150);
    tcase_add_test(stale, stale_command_chief_metrics_refused);
    tcase_add_test(stale, stale_evaluator_metrics_refused);
    suite_add_tcase(s, stale);
    int rc = ty_run_suite(s);
    curl_global_cleanup();
    return rc;
}
