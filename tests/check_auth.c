/* check_auth.c - who may do what, on the real server binary over loopback
 * with its SQLite file: the auth matrix (every route of the route tables x
 * every token kind: admin, team A, team B, the join token, node n1's token,
 * another node's token, a task token of team A's job, a task token of team
 * B's job, no token, a bad token; a route without a row fails the test),
 * scoped lists, per-node tokens (minted at registration, revoked by a new
 * registration or by the admin), tokens stored as sha256 only, an old data
 * directory migrated, malformed requests answered 4xx JSON (raw sockets),
 * body limits, and dataset paths confined to the agent's data root
 * (`trainyard up --data-root`: ".." refused at submission, symlinks and
 * absolute paths leading out refused by the worker, with the reason), and
 * an agent whose node token the admin revoked registering again. */
#include "testlib.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sqlite3.h>
#include <sys/socket.h>
#include <sys/time.h>

#include "../api/routes.h"

static ty_proc srv;
static int port;

/* the columns of the matrix */
enum { C_ADMIN, C_TEAM_A, C_TEAM_B, C_JOIN, C_NODE, C_NODE2, C_TASK_A, C_TASK_B, C_NONE, C_BAD, NCOL };
static const char *const COL_NAME[NCOL] = {"admin", "team A", "team B", "join", "node n1", "node n2",
                                           "task A", "task B", "none", "bad"};
static char tok[NCOL][160];

static int64_t job_a, job_b, job_c, node1, node2, node3, task_a, task_b, ckpt_a, sweep_a;
static char ctx_a[80]; /* team A's context ("sha256:HEX"), which job A names */
#define REG_HOST "registry.example.com:5000" /* the matrix's {host} */

/* ---------------------------------------------------------------- raw HTTP */

typedef struct rawres {
    int status;
    char *body;        /* NUL-terminated, owned */
    size_t len;
    char ctype[80];
} rawres;

static void rawres_free(rawres *r) {
    free(r->body);
    memset(r, 0, sizeof *r);
}

/* Sends the bytes as they are on a new connection and reads the answer to
 * the end (the requests say Connection: close). status 0: no answer. */
static void raw_send(const void *req, size_t len, rawres *out) {
    memset(out, 0, sizeof *out);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    size_t done = 0;
    while (done < len) {
        ssize_t w = send(fd, (const char *)req + done, len - done, MSG_NOSIGNAL);
        if (w <= 0) break; /* the server may answer and close before reading everything */
        done += (size_t)w;
    }
    buf b;
    buf_init(&b, 8u << 20);
    char chunk[16384];
    for (;;) {
        ssize_t n = recv(fd, chunk, sizeof chunk, 0);
        if (n <= 0) break;
        ck_assert_int_eq(buf_append(&b, chunk, (size_t)n), 0);
    }
    close(fd);
    size_t blen = 0;
    char *all = buf_detach(&b, &blen);
    if (!all || blen < 12 || strncmp(all, "HTTP/1.", 7) != 0) {
        free(all);
        return;
    }
    out->status = atoi(all + 9);
    char *end = strstr(all, "\r\n\r\n");
    if (end) {
        *end = '\0';
        char *ct = strcasestr(all, "\r\nContent-Type:");
        if (ct) {
            ct += 15;
            while (*ct == ' ') ct++;
            size_t k = strcspn(ct, "\r\n");
            snprintf(out->ctype, sizeof out->ctype, "%.*s", (int)k, ct);
        }
        out->len = blen - (size_t)(end + 4 - all);
        out->body = xmalloc(out->len + 1);
        memcpy(out->body, end + 4, out->len);
        out->body[out->len] = '\0';
    }
    free(all);
}

/* method path [token] [extra header lines] [body with content type]. */
static void req(const char *method, const char *path, const char *token, const char *headers, const char *ctype,
                const void *body, size_t blen, rawres *out) {
    buf b;
    buf_init(&b, 64u << 20);
    int rc = buf_printf(&b, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n", method, path);
    if (token) rc |= buf_printf(&b, "Authorization: Bearer %s\r\n", token);
    if (headers) rc |= buf_appends(&b, headers);
    if (body) {
        if (ctype) rc |= buf_printf(&b, "Content-Type: %s\r\n", ctype);
        rc |= buf_printf(&b, "Content-Length: %zu\r\n", blen);
    } else if (strcmp(method, "POST") == 0 || strcmp(method, "PUT") == 0) {
        rc |= buf_appends(&b, "Content-Length: 0\r\n");
    }
    rc |= buf_appends(&b, "\r\n");
    if (body) rc |= buf_append(&b, body, blen);
    ck_assert_int_eq(rc, 0);
    raw_send(b.data, b.len, out);
    buf_release(&b);
}

static long jreq(const char *method, const char *path, const char *token, const char *json, cJSON **o) {
    rawres r;
    req(method, path, token, NULL, "application/json", json, json ? strlen(json) : 0, &r);
    long st = r.status;
    if (o) {
        *o = cJSON_Parse(r.body ? r.body : "");
        ck_assert_msg(*o != NULL, "%s %s answered %ld, not JSON: %.200s", method, path, st, r.body ? r.body : "");
    }
    rawres_free(&r);
    return st;
}

/* Asserts a 4xx/5xx answer is the JSON error form with that code. */
static void assert_json_error(const rawres *r, int status, const char *code) {
    ck_assert_msg(r->status == status, "answered %d, not %d: %.300s", r->status, status, r->body ? r->body : "");
    ck_assert_msg(strncmp(r->ctype, "application/json", 16) == 0, "a %d answered as '%s'", r->status, r->ctype);
    cJSON *o = cJSON_Parse(r->body ? r->body : "");
    ck_assert_msg(o != NULL, "the %d answer is not JSON: %.200s", r->status, r->body ? r->body : "");
    cJSON *e = cJSON_GetObjectItem(o, "error");
    ck_assert_msg(cJSON_IsObject(e), "no error object in %.200s", r->body);
    ck_assert_str_eq(cJSON_GetObjectItem(e, "code")->valuestring, code);
    ck_assert(cJSON_IsString(cJSON_GetObjectItem(e, "message")));
    ck_assert(cJSON_GetObjectItem(e, "field") != NULL);
    cJSON_Delete(o);
}

static const char *sget(cJSON *o, const char *k) {
    cJSON *v = cJSON_GetObjectItem(o, k);
    ck_assert_msg(cJSON_IsString(v), "no string '%s'", k);
    return v->valuestring;
}

static int64_t nget(cJSON *o, const char *k) {
    cJSON *v = cJSON_GetObjectItem(o, k);
    ck_assert_msg(cJSON_IsNumber(v), "no number '%s'", k);
    return (int64_t)v->valuedouble;
}

/* ---------------------------------------------------------------- fixture */

#define SPEC(name)                                                                                         \
    "{\"name\":\"" name "\",\"model\":{\"layers\":[{\"type\":\"dense\",\"units\":4,\"activation\":\"relu\","  \
    "\"input_shape\":[4]},{\"type\":\"dense\",\"units\":1,\"activation\":\"sigmoid\"}]},"                  \
    "\"compile\":{\"optimizer\":{\"type\":\"sgd\"},\"loss\":\"binary_crossentropy\"},"                       \
    "\"data\":{\"source\":\"synthetic\",\"examples\":100,\"features\":4},\"fit\":{\"epochs\":1,\"batch_size\":10}}"

/* A sweep of one trial (team tokens may submit one). */
#define SWEEP_BODY                                                                                         \
    "{\"name\":\"matrix\",\"job\":" SPEC("m") ",\"search\":{\"method\":\"grid\",\"parameters\":"   \
    "{\"fit.batch_size\":{\"values\":[10]}},\"metric\":\"loss\",\"mode\":\"min\",\"max_concurrent\":1}}"

static int64_t register_node(const char *host, int cpu, char *tok_out, size_t cap) {
    char body[256];
    snprintf(body, sizeof body, "{\"hostname\":\"%s\",\"address\":\"127.0.0.1\",\"cpu_slots\":%d}", host, cpu);
    cJSON *o = NULL;
    long st = jreq("POST", "/api/v1/nodes", tok[C_JOIN], body, &o);
    ck_assert_msg(st == 201 || st == 200, "POST /nodes answered %ld", st);
    int64_t id = nget(o, "id");
    if (tok_out) snprintf(tok_out, cap, "%s", sget(o, "token"));
    cJSON_Delete(o);
    return id;
}

static int64_t submit(const char *token, const char *spec) {
    cJSON *o = NULL;
    ck_assert_int_eq(jreq("POST", "/api/v1/jobs", token, spec, &o), 201);
    int64_t id = nget(o, "id");
    cJSON_Delete(o);
    return id;
}

static int64_t put_checkpoint(int64_t job, const char *token, const char *bytes) {
    char path[128], hdr[128], sha[65];
    sha256_hex(bytes, strlen(bytes), sha);
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints?step=1&epoch=0", (long long)job);
    snprintf(hdr, sizeof hdr, "X-Checksum-Sha256: %s\r\n", sha);
    rawres r;
    req("PUT", path, token, hdr, "application/octet-stream", bytes, strlen(bytes), &r);
    ck_assert_msg(r.status == 201, "checkpoint upload answered %d: %s", r.status, r.body ? r.body : "");
    cJSON *o = cJSON_Parse(r.body);
    int64_t id = nget(o, "id");
    cJSON_Delete(o);
    rawres_free(&r);
    return id;
}

/* Team A's context: a one-file folder packed with tar, uploaded. */
static void upload_context(void) {
    char src[400], file[450], tgz[400], cmd[1000];
    snprintf(src, sizeof src, "%s/ctx-src", srv.dir);
    snprintf(file, sizeof file, "%s/train.py", src);
    snprintf(tgz, sizeof tgz, "%s/ctx.tgz", srv.dir);
    ck_assert_int_eq(mkdir(src, 0700), 0);
    ck_assert_int_eq(file_write_atomic(file, "print(1)\n", 9, 0600), 0);
    snprintf(cmd, sizeof cmd, "tar czf '%s' -C '%s' .", tgz, src);
    ck_assert_int_eq(system(cmd), 0);
    size_t len = 0;
    char *bytes = file_read_all(tgz, 1u << 20, &len);
    ck_assert_ptr_nonnull(bytes);
    rawres r;
    req("POST", "/api/v1/contexts", tok[C_TEAM_A], NULL, "application/gzip", bytes, len, &r);
    ck_assert_msg(r.status == 201, "POST /contexts answered %d: %s", r.status, r.body ? r.body : "");
    rawres_free(&r);
    char hex[65];
    sha256_hex(bytes, len, hex);
    snprintf(ctx_a, sizeof ctx_a, "sha256:%s", hex);
    free(bytes);
}

static void start(void) {
    memset(&srv, 0, sizeof srv);
    ty_mkdtemp(srv.dir, sizeof srv.dir, "auth");
    static const char *const extra[] = {"--heartbeat-timeout", "3600", NULL};
    ty_server_start_args(&srv, "server", extra);
    const char *colon = strrchr(srv.url, ':');
    port = atoi(colon + 1);
    ty_token(&srv, "admin.token", tok[C_ADMIN], sizeof tok[C_ADMIN]);
    ty_token(&srv, "token", tok[C_TEAM_A], sizeof tok[C_TEAM_A]);
    ty_token(&srv, "node.token", tok[C_JOIN], sizeof tok[C_JOIN]);
    snprintf(tok[C_BAD], sizeof tok[C_BAD], "ty_this-token-was-never-issued-by-the-server-00");
    tok[C_NONE][0] = '\0';
    cJSON *o = NULL;
    ck_assert_int_eq(jreq("POST", "/api/v1/teams", tok[C_ADMIN], "{\"name\":\"teamb\"}", &o), 201);
    snprintf(tok[C_TEAM_B], sizeof tok[C_TEAM_B], "%s", sget(o, "token"));
    cJSON_Delete(o);
    node1 = register_node("n1", 4, tok[C_NODE], sizeof tok[C_NODE]);
    node2 = register_node("n2", 0, tok[C_NODE2], sizeof tok[C_NODE2]);
    node3 = register_node("n3", 0, NULL, 0);
    /* job A runs a command in team A's context: its task and node may fetch it */
    upload_context();
    char spec_a[256];
    snprintf(spec_a, sizeof spec_a, "{\"name\":\"job-a\",\"command\":{\"argv\":[\"true\"],\"context\":\"%s\"}}", ctx_a);
    job_a = submit(tok[C_TEAM_A], spec_a);
    job_b = submit(tok[C_TEAM_B], SPEC("job-b"));
    /* take the tasks of A and B as n1's agent would */
    char path[128];
    snprintf(path, sizeof path, "/api/v1/nodes/%lld/assignments?wait=2", (long long)node1);
    for (int i = 0; i < 40 && (!task_a || !task_b); i++) {
        ck_assert_int_eq(jreq("GET", path, tok[C_NODE], NULL, &o), 200);
        cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItem(o, "start")) {
            int64_t job = nget(it, "job");
            int c = job == job_a ? C_TASK_A : job == job_b ? C_TASK_B : -1;
            if (c < 0) continue;
            snprintf(tok[c], sizeof tok[c], "%s", sget(it, "token"));
            *(c == C_TASK_A ? &task_a : &task_b) = nget(it, "task");
        }
        cJSON_Delete(o);
    }
    ck_assert_msg(task_a && task_b, "the jobs were not handed out to n1");
    job_c = submit(tok[C_TEAM_A], SPEC("job-c")); /* the one the matrix cancels */
    ck_assert_int_eq(jreq("POST", "/api/v1/sweeps", tok[C_TEAM_A], SWEEP_BODY, &o), 201);
    sweep_a = nget(o, "id");
    cJSON_Delete(o);
    ckpt_a = put_checkpoint(job_a, tok[C_TASK_A], "job a's weights");
    put_checkpoint(job_b, tok[C_TASK_B], "job b's weights");
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/rendezvous/k", (long long)job_a);
    ck_assert_int_eq(jreq("PUT", path, tok[C_TASK_A], "{\"v\":1}", NULL), 200);
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/rendezvous/k", (long long)job_b);
    ck_assert_int_eq(jreq("PUT", path, tok[C_TASK_B], "{\"v\":2}", NULL), 200);
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/metrics", (long long)job_a);
    ck_assert_int_eq(jreq("POST", path, tok[C_TASK_A], "{\"metrics\":[{\"seq\":1,\"step\":1,\"loss\":0.5}]}", NULL),
                     200);
}

static void stop(void) {
    ty_kill(&srv, SIGTERM);
    ty_rmrf(srv.dir);
}

/* ---------------------------------------------------------------- the matrix */

/* Expected outcome per column: o = let through (the handler answered:
 * 2xx, or 409/422 about the request itself), U = 401, F = 403, N = 404
 * (another team's or another job's resource: ids do not leak). Each row
 * aims at team A's job A (job C for cancel; job A runs, so its DELETE is
 * the handler's 409), node n1 (n3 for the token
 * revocation), job A's task, job A's checkpoint, rendezvous key k, team
 * A's context (which job A names), the registry REG_HOST (each team's PUT
 * stores a login there, so each team's DELETE after it finds one). Job A
 * has no image: its task's registry-auth is the handler's 404 whatever
 * logins the teams hold. */
typedef struct mrow {
    const char *method, *pattern;
    const char *query;        /* appended to the path */
    const char *expect;       /* NCOL characters, columns as COL_NAME */
} mrow;

static const mrow MATRIX[] = {
    /*                                                                       admin,A,B,join,n1,n2,tA,tB,none,bad */
    {"GET", "/api/v1/health", "", "oooooooooo"},
    {"POST", "/api/v1/jobs", "", "FooFFFFFUU"},
    {"GET", "/api/v1/jobs", "", "oooFFFFFUU"},
    {"GET", "/api/v1/jobs/{id}", "", "ooNFFFFFUU"},
    {"DELETE", "/api/v1/jobs/{id}", "", "ooNFFFFFUU"}, /* job A runs: 409 for its team and the admin */
    {"POST", "/api/v1/jobs/{id}/cancel", "", "ooNFFFFFUU"},
    {"GET", "/api/v1/jobs/{id}/events", "", "ooNFFFFFUU"},
    {"GET", "/api/v1/teams", "", "oooFFFFFUU"},
    {"POST", "/api/v1/teams", "", "oFFFFFFFUU"},
    {"GET", "/api/v1/nodes/{id}/assignments", "?wait=0", "oFFFoFFFUU"},
    {"POST", "/api/v1/tasks/{id}/status", "", "oFFFoFFFUU"},
    {"POST", "/api/v1/jobs/{id}/metrics", "", "FFFFFFoNUU"},
    {"POST", "/api/v1/jobs/{id}/events", "", "FFFFFFoNUU"},
    {"POST", "/api/v1/jobs/{id}/rung", "", "FFFFFFoNUU"}, /* job A is no sweep's trial: the handler's 422/409 */
    {"GET", "/api/v1/jobs/{id}/metrics", "", "ooNFFFoNUU"},
    {"POST", "/api/v1/jobs/{id}/logs", "?task=worker-0", "FFFFoFoNUU"},
    {"GET", "/api/v1/jobs/{id}/logs", "?task=worker-0", "ooNFFFoNUU"},
    {"PUT", "/api/v1/jobs/{id}/checkpoints", "?step=2&epoch=0", "FFFFFFoNUU"},
    {"GET", "/api/v1/jobs/{id}/checkpoints", "", "ooNFFFoNUU"},
    {"GET", "/api/v1/jobs/{id}/checkpoints/latest", "", "ooNFFFoNUU"},
    {"GET", "/api/v1/jobs/{id}/checkpoints/{cid}", "", "ooNFFFoNUU"},
    /* the server runs with DATA: task A's upload routes are the handler's 409 upload_via_server */
    {"POST", "/api/v1/jobs/{id}/checkpoints/uploads", "", "FFFFFFoNUU"},
    {"POST", "/api/v1/jobs/{id}/checkpoints/uploads/{u}/parts", "", "FFFFFFoNUU"},
    {"POST", "/api/v1/jobs/{id}/checkpoints/uploads/{u}/complete", "", "FFFFFFoNUU"},
    {"DELETE", "/api/v1/jobs/{id}/checkpoints/uploads/{u}", "", "FFFFFFoNUU"},
    {"GET", "/api/v1/blob-store", "", "oFFFFFFFUU"},
    {"PUT", "/api/v1/jobs/{id}/rendezvous/{key}", "", "FFFFFFoNUU"},
    {"GET", "/api/v1/jobs/{id}/rendezvous/{key}", "", "FFFFFFoNUU"},
    {"POST", "/api/v1/nodes", "", "oFFoFFFFUU"},
    {"POST", "/api/v1/nodes/{id}/heartbeat", "", "oFFFoFFFUU"},
    {"DELETE", "/api/v1/nodes/{id}/token", "", "oFFFFFFFUU"},
    {"POST", "/api/v1/nodes/{id}/drain", "", "oFFFoFFFUU"},
    {"DELETE", "/api/v1/nodes/{id}/drain", "", "oFFFoFFFUU"},
    {"GET", "/api/v1/cluster", "", "oooFFFFFUU"},
    {"GET", "/api/v1/queue", "", "oooFFFFFUU"},
    {"PATCH", "/api/v1/teams/{name}", "", "oFFFFFFFUU"},
    {"POST", "/api/v1/teams/{name}", "", "oFFFFFFFUU"},
    {"POST", "/api/v1/teams/{name}/tokens", "", "ooNFFFFFUU"},
    {"GET", "/api/v1/tls/ca", "", "NNNNNNNNNN"},
    {"GET", "/metrics", "", "oFFFFFFFUU"},
    {"GET", "/api/v1/openapi.json", "", "oooooooooo"},
    {"GET", "/api/v1/examples", "", "oooFFFFFUU"},
    {"POST", "/api/v1/contexts", "", "FooFFFFFUU"},
    {"GET", "/api/v1/contexts", "", "FooFFFFFUU"},
    {"GET", "/api/v1/contexts/{id}", "", "FoNFoNoNUU"},
    {"DELETE", "/api/v1/contexts/{id}", "", "FoNFFFFFUU"},
    {"PUT", "/api/v1/registries/{host}", "", "FooFFFFFUU"},
    {"GET", "/api/v1/registries", "", "FooFFFFFUU"},
    {"DELETE", "/api/v1/registries/{host}", "", "FooFFFFFUU"},
    {"GET", "/api/v1/jobs/{id}/registry-auth", "", "FFFFFFNNUU"},
    {"GET", "/api/v1/usage", "", "oooFFFFFUU"},
    {"POST", "/api/v1/sweeps", "", "FooFFFFFUU"},
    {"GET", "/api/v1/sweeps", "", "oooFFFFFUU"},
    {"GET", "/api/v1/sweeps/{id}", "", "ooNFFFFFUU"},
    {"POST", "/api/v1/sweeps/{id}/cancel", "", "ooNFFFFFUU"}, /* the admin cancels it; team A's then is a 409 */
    /* people: {name} and {user} are "nobody" (no such user), {team} team A's */
    {"POST", "/api/v1/users", "", "oFFFFFFFUU"},
    {"GET", "/api/v1/users", "", "oFFFFFFFUU"},
    {"GET", "/api/v1/users/{name}", "", "NFFFFFFFUU"},
    {"POST", "/api/v1/users/{name}/tokens", "", "NFFFFFFFUU"},
    {"GET", "/api/v1/teams/{team}/members", "", "ooFFFFFFUU"},
    {"PUT", "/api/v1/teams/{team}/members/{user}", "", "ooFFFFFFUU"},
    {"DELETE", "/api/v1/teams/{team}/members/{user}", "", "NNFFFFFFUU"},
    {"POST", "/api/v1/tokens", "", "FFFFFFFFUU"}, /* a person's only */
    {"GET", "/api/v1/tokens", "", "FFFFFFFFUU"},
    {"DELETE", "/api/v1/tokens/{id}", "", "NFFFFFFFUU"},
    {"GET", "/api/v1/me", "", "oooFFFFFUU"},
    {"GET", "/api/v1/audit", "", "oooFFFFFUU"}, /* a team's token: its own team's */
    /* a job's web ports: job A declares none (404 to whoever may see it); asked with GET */
    {"*", "/proxy/jobs/{id}/{name}/{rest*}", "", "NNNFFFFFUU"},
    {"GET", "/proxy/jobs/{id}/{name}", "", "ooNFFFFFUU"},
    {"POST", "/api/v1/jobs/{id}/proxy-session", "", "ooNFFFFFUU"},
    /* shells: asked without a WebSocket upgrade, the handler's 400 to whoever may */
    {"GET", "/api/v1/jobs/{id}/tasks/{task}/exec", "", "ooNFFFFFUU"},
    {"GET", "/api/v1/nodes/{id}/exec/{session}", "", "oFFFoFFFUU"},
    /* single sign-on, not configured here: its public routes answer 503 (or 400 for a callback without
     * code) to everyone; sign-out is a person's */
    /* a backup: the body {} lacks dest, the admin's 422 (let through) */
    {"POST", "/api/v1/backups", "", "oFFFFFFFUU"},
    {"GET", "/auth/login", "", "oooooooooo"},
    {"GET", "/auth/callback", "", "oooooooooo"},
    {"POST", "/auth/logout", "", "FFFFFFFFUU"},
    {"POST", "/api/v1/auth/device", "", "oooooooooo"},
    {"POST", "/api/v1/auth/device/token", "", "oooooooooo"},
};
#define NROWS ((int)(sizeof MATRIX / sizeof MATRIX[0]))

/* The concrete path of a row: {id} by the resource it names. */
static void row_path(const mrow *m, char *out, size_t cap) {
    buf b;
    buf_init(&b, cap);
    const char *p = m->pattern;
    int rc = 0;
    while (*p) {
        if (*p != '{') {
            rc |= buf_append(&b, p++, 1);
            continue;
        }
        const char *e = strchr(p, '}');
        size_t n = (size_t)(e - p + 1);
        if (strncmp(p, "{id}", n) == 0 && strncmp(m->pattern, "/api/v1/sweeps/", 15) == 0) {
            rc |= buf_printf(&b, "%lld", (long long)sweep_a);
        } else if (strncmp(p, "{id}", n) == 0 && strncmp(m->pattern, "/api/v1/tokens/", 15) == 0) {
            rc |= buf_appends(&b, "999999"); /* no such personal token */
        } else if (strncmp(p, "{rest*}", n) == 0) {
            rc |= buf_appends(&b, "index.html");
        } else if (strncmp(p, "{name}", n) == 0 && strncmp(m->pattern, "/proxy/", 7) == 0) {
            rc |= buf_appends(&b, "web");
        } else if (strncmp(p, "{team}", n) == 0) {
            rc |= buf_appends(&b, "default");
        } else if (strncmp(p, "{user}", n) == 0 || (strncmp(p, "{name}", n) == 0 && strstr(m->pattern, "/users/"))) {
            rc |= buf_appends(&b, "nobody");
        } else if (strncmp(p, "{id}", n) == 0 && strncmp(m->pattern, "/api/v1/contexts/", 17) == 0) {
            rc |= buf_appends(&b, ctx_a); /* named by job A: DELETE is a 409 */
        } else if (strncmp(p, "{id}", n) == 0) {
            int64_t id = strncmp(m->pattern, "/api/v1/jobs/", 13) == 0 || strncmp(m->pattern, "/proxy/jobs/", 12) == 0
                             ? (strstr(m->pattern, "/cancel") ? job_c : job_a)
                         : strncmp(m->pattern, "/api/v1/nodes/", 14) == 0
                             ? (strstr(m->pattern, "/token") ? node3 : node1)
                         : strncmp(m->pattern, "/api/v1/tasks/", 14) == 0 ? task_a
                                                                          : -1;
            ck_assert_msg(id > 0, "no target for {id} in %s", m->pattern);
            rc |= buf_printf(&b, "%lld", (long long)id);
        } else if (strncmp(p, "{cid}", n) == 0) {
            rc |= buf_printf(&b, "%lld", (long long)ckpt_a);
        } else if (strncmp(p, "{task}", n) == 0) {
            rc |= buf_appends(&b, "worker-0");
        } else if (strncmp(p, "{session}", n) == 0) {
            rc |= buf_appends(&b, "0123456789abcdef0123456789abcdef");
        } else if (strncmp(p, "{u}", n) == 0) {
            rc |= buf_appends(&b, "0123456789abcdef0123456789abcdef"); /* no such upload */
        } else if (strncmp(p, "{key}", n) == 0) {
            rc |= buf_appends(&b, "k");
        } else if (strncmp(p, "{name}", n) == 0) {
            rc |= buf_appends(&b, "default");
        } else if (strncmp(p, "{host}", n) == 0) {
            rc |= buf_appends(&b, REG_HOST);
        } else {
            ck_abort_msg("the matrix does not know the parameter %.*s of %s", (int)n, p, m->pattern);
        }
        p = e + 1;
    }
    rc |= buf_appends(&b, m->query);
    ck_assert_int_eq(rc, 0);
    snprintf(out, cap, "%s", b.data);
    buf_release(&b);
}

/* A body the route would take from its own caller (so that a request let
 * through is answered by the handler, not refused for its form). */
static const char *row_body(const mrow *m, int col, char *scratch, size_t cap, const char **ctype) {
    static int seq = 0;
    *ctype = "application/json";
    if (strcmp(m->method, "GET") == 0 || strcmp(m->method, "DELETE") == 0 || strcmp(m->method, "*") == 0) return NULL;
    seq++;
    if (strcmp(m->pattern, "/api/v1/jobs") == 0) return SPEC("matrix");
    if (strcmp(m->pattern, "/api/v1/sweeps") == 0) return SWEEP_BODY;
    if (strcmp(m->pattern, "/api/v1/teams") == 0) {
        snprintf(scratch, cap, "{\"name\":\"matrix-%d-%d\"}", col, seq);
        return scratch;
    }
    if (strcmp(m->pattern, "/api/v1/nodes") == 0) {
        snprintf(scratch, cap, "{\"hostname\":\"matrix-%d-%d\",\"address\":\"127.0.0.1\",\"cpu_slots\":0}", col, seq);
        return scratch;
    }
    if (strstr(m->pattern, "/status")) return "{\"state\":\"running\"}";
    if (strstr(m->pattern, "/metrics")) return "{\"metrics\":[{\"seq\":2,\"step\":2,\"loss\":0.4}]}";
    /* an "image" line at job A's attempt (image_pull_failed would fail the job) */
    if (strstr(m->pattern, "/events")) return "{\"kind\":\"image\",\"message\":\"pulled\",\"attempt\":1}";
    /* an attempt no int holds: the handler's 422, never a cast out of range */
    if (strstr(m->pattern, "/rung")) return "{\"attempt\":1e300,\"epoch\":1}";
    if (strstr(m->pattern, "/registries/")) return "{\"username\":\"matrix\",\"password\":\"s3cret\"}";
    if (strstr(m->pattern, "/logs")) {
        *ctype = "text/plain";
        return "a line\n";
    }
    if (strstr(m->pattern, "/checkpoints")) {
        *ctype = "application/octet-stream";
        return "weights";
    }
    if (strstr(m->pattern, "/teams/")) return "{\"weight\":1}";
    if (strcmp(m->pattern, "/api/v1/contexts") == 0) {
        *ctype = "application/gzip";
        return "not a tar"; /* the handler's 422: let through */
    }
    return "{}";
}

static char classify(int status) {
    return status == 401 ? 'U' : status == 403 ? 'F' : status == 404 ? 'N' : 'o';
}

START_TEST(auth_matrix) {
    /* every route has a row, and every row is a route */
    int nroutes = 0;
    for (const route *const *t = api_route_tables; *t; t++)
        for (const route *r = *t; r->pattern; r++, nroutes++) {
            int found = 0;
            for (int i = 0; i < NROWS; i++)
                found |= strcmp(MATRIX[i].method, r->method) == 0 && strcmp(MATRIX[i].pattern, r->pattern) == 0;
            ck_assert_msg(found, "route %s %s has no row in the auth matrix (tests/check_auth.c)", r->method,
                          r->pattern);
        }
    ck_assert_int_eq(nroutes, NROWS);

    int status[NROWS][NCOL];
    char errors[4096] = "";
    size_t elen = 0;
    for (int i = 0; i < NROWS; i++) {
        const mrow *m = &MATRIX[i];
        ck_assert_int_eq((int)strlen(m->expect), NCOL);
        char path[256];
        row_path(m, path, sizeof path);
        for (int c = 0; c < NCOL; c++) {
            char scratch[256];
            const char *ctype = NULL;
            const char *body = row_body(m, c, scratch, sizeof scratch, &ctype);
            rawres r;
            req(strcmp(m->method, "*") == 0 ? "GET" : m->method, path, c == C_NONE ? NULL : tok[c], NULL, ctype, body, body ? strlen(body) : 0, &r);
            status[i][c] = r.status;
            int sso_off = r.status == 503 && strstr(m->pattern, "auth/") != NULL; /* no --oidc-issuer here */
            ck_assert_msg(r.status >= 200 && (r.status < 500 || sso_off), "%s %s as %s answered %d: %.200s", m->method, path,
                          COL_NAME[c], r.status, r.body ? r.body : "");
            if (r.status >= 400) {
                /* every refusal is the JSON error form */
                cJSON *o = cJSON_Parse(r.body ? r.body : "");
                ck_assert_msg(o && cJSON_IsObject(cJSON_GetObjectItem(o, "error")), "%s %s as %s: %d without JSON error",
                              m->method, path, COL_NAME[c], r.status);
                cJSON_Delete(o);
            }
            if (classify(r.status) != m->expect[c] && elen < sizeof errors - 200) {
                int n = snprintf(errors + elen, sizeof errors - elen, "\n  %s %s as %s: %d (expected %c): %.100s",
                                 m->method, path, COL_NAME[c], r.status, m->expect[c], r.body ? r.body : "");
                if (n > 0) elen += (size_t)n;
            }
            rawres_free(&r);
        }
    }
    /* the table, as recorded in docs/reliability.md */
    printf("\n## Auth matrix (status per token; rows aim at team A's job / node n1 / job A's task)\n\n| route |");
    for (int c = 0; c < NCOL; c++) printf(" %s |", COL_NAME[c]);
    printf("\n|---|");
    for (int c = 0; c < NCOL; c++) printf("---|");
    printf("\n");
    for (int i = 0; i < NROWS; i++) {
        printf("| `%s %s` |", MATRIX[i].method, MATRIX[i].pattern);
        for (int c = 0; c < NCOL; c++) printf(" %d |", status[i][c]);
        printf("\n");
    }
    fflush(stdout);
    ck_assert_msg(elen == 0, "the auth matrix differs:%s", errors);
}
END_TEST

/* Lists are scoped: a team sees its own jobs, the admin all. */
START_TEST(lists_are_scoped) {
    cJSON *o = NULL;
    int has_a, has_b;
    const int cols[] = {C_TEAM_A, C_TEAM_B, C_ADMIN};
    for (int k = 0; k < 3; k++) {
        ck_assert_int_eq(jreq("GET", "/api/v1/jobs", tok[cols[k]], NULL, &o), 200);
        has_a = has_b = 0;
        cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItem(o, "jobs")) {
            has_a |= nget(it, "id") == job_a;
            has_b |= nget(it, "id") == job_b;
        }
        cJSON_Delete(o);
        ck_assert_int_eq(has_a, cols[k] != C_TEAM_B);
        ck_assert_int_eq(has_b, cols[k] != C_TEAM_A);
    }
    /* the cluster view hides another team's job ids */
    ck_assert_int_eq(jreq("GET", "/api/v1/cluster", tok[C_TEAM_B], NULL, &o), 200);
    char *txt = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    ck_assert_msg(strstr(txt, "another team") != NULL, "team B sees no 'another team' holder: %s", txt);
    char needle[64];
    snprintf(needle, sizeof needle, "\"job\":%lld", (long long)job_a);
    ck_assert_msg(strstr(txt, needle) == NULL, "team B sees job A in /cluster: %s", txt);
    free(txt);
    /* a task token of job B cannot read job A's checkpoint by id either */
    char path[128];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints/%lld", (long long)job_b, (long long)ckpt_a);
    rawres r;
    req("GET", path, tok[C_TASK_B], NULL, NULL, NULL, 0, &r);
    assert_json_error(&r, 404, "not_found");
    rawres_free(&r);
}
END_TEST

/* Per-node tokens: the join token registers and nothing else; a
 * registration answers a new token and revokes the node's earlier ones;
 * the admin revokes a node's token (401 after), a new registration heals. */
START_TEST(node_tokens) {
    char t1[160], t2[160], t3[160], path[128];
    int64_t id = register_node("life", 1, t1, sizeof t1);
    snprintf(path, sizeof path, "/api/v1/nodes/%lld/heartbeat", (long long)id);
    ck_assert_int_eq(jreq("POST", path, t1, "{}", NULL), 200);
    cJSON *o = NULL;
    ck_assert_int_eq(jreq("POST", path, tok[C_JOIN], "{}", &o), 403);
    ck_assert_msg(strstr(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "error"), "message")->valuestring, "join token"),
                  "the 403 does not say the join token only registers");
    cJSON_Delete(o);
    /* n1's token may not act for this node */
    ck_assert_int_eq(jreq("POST", path, tok[C_NODE], "{}", NULL), 403);
    /* an agent restarting: same hostname, same id, new token, old one revoked */
    ck_assert_int_eq(register_node("life", 1, t2, sizeof t2), id);
    ck_assert_str_ne(t1, t2);
    ck_assert_int_eq(jreq("POST", path, t1, "{}", NULL), 401);
    ck_assert_int_eq(jreq("POST", path, t2, "{}", NULL), 200);
    /* the admin revokes it */
    char del[128];
    snprintf(del, sizeof del, "/api/v1/nodes/%lld/token", (long long)id);
    ck_assert_int_eq(jreq("DELETE", del, tok[C_ADMIN], NULL, &o), 200);
    ck_assert_int_eq(nget(o, "revoked"), 1);
    ck_assert_str_eq(sget(o, "hostname"), "life");
    cJSON_Delete(o);
    rawres r;
    req("POST", path, t2, NULL, "application/json", "{}", 2, &r);
    assert_json_error(&r, 401, "unauthorized");
    rawres_free(&r);
    snprintf(path, sizeof path, "/api/v1/nodes/%lld/assignments?wait=0", (long long)id);
    ck_assert_int_eq(jreq("GET", path, t2, NULL, NULL), 401);
    ck_assert_int_eq(jreq("DELETE", del, tok[C_ADMIN], NULL, &o), 200);
    ck_assert_int_eq(nget(o, "revoked"), 0);
    cJSON_Delete(o);
    ck_assert_int_eq(jreq("DELETE", "/api/v1/nodes/999999/token", tok[C_ADMIN], NULL, NULL), 404);
    /* registering again with the join token gives a working token */
    ck_assert_int_eq(register_node("life", 1, t3, sizeof t3), id);
    ck_assert_int_eq(jreq("GET", path, t3, NULL, NULL), 200);
    ck_assert_int_eq(jreq("GET", path, t2, NULL, NULL), 401);
    /* a node token cannot register (only the join token and the admin) */
    ck_assert_int_eq(jreq("POST", "/api/v1/nodes", t3, "{\"hostname\":\"life\",\"address\":\"a\"}", NULL), 403);
}
END_TEST

/* Tokens are stored as sha256 hex only; a node's token row names its node. */
START_TEST(tokens_stored_hashed) {
    if (ty_pg_url()) { /* the same look, on the server's PostgreSQL database */
        char u[512];
        ty_pg_data_db(srv.dir, u, sizeof u);
        for (int c = 0; c < NCOL; c++) {
            if (c == C_NONE || c == C_BAD) continue;
            char sha[65];
            sha256_hex(tok[c], strlen(tok[c]), sha);
            const char *params[2] = {sha, tok[c]};
            PGresult *r = ty_pg_row(u, "SELECT count(*), sum(CASE WHEN hash = $1 THEN 1 ELSE 0 END),"
                                       " coalesce(max(node_id), 0) FROM tokens WHERE hash = $1 OR strpos(hash, $2) > 0",
                                    2, params);
            ck_assert_msg(atoi(PQgetvalue(r, 0, 0)) == 1 && atoi(PQgetvalue(r, 0, 1)) == 1,
                          "the %s token is not stored as exactly one sha256", COL_NAME[c]);
            int64_t node = strtoll(PQgetvalue(r, 0, 2), NULL, 10);
            PQclear(r);
            if (c == C_NODE) ck_assert_int_eq(node, node1);
            else if (c == C_NODE2) ck_assert_int_eq(node, node2);
            else ck_assert_int_eq(node, 0);
        }
        ck_assert_int_eq(ty_pg_query_int64(u, "SELECT count(*) FROM tokens WHERE length(hash) != 64"), 0);
        return;
    }
    char path[512];
    snprintf(path, sizeof path, "%s/trainyard.db", srv.dir);
    sqlite3 *sq = NULL;
    ck_assert_int_eq(sqlite3_open_v2(path, &sq, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_busy_timeout(sq, 10000);
    for (int c = 0; c < NCOL; c++) {
        if (c == C_NONE || c == C_BAD) continue;
        char sha[65];
        sha256_hex(tok[c], strlen(tok[c]), sha);
        sqlite3_stmt *st = NULL;
        ck_assert_int_eq(sqlite3_prepare_v2(sq,
                                            "SELECT count(*), sum(hash = ?), max(node_id) FROM tokens"
                                            " WHERE hash = ? OR instr(hash, ?) > 0",
                                            -1, &st, NULL),
                         SQLITE_OK);
        sqlite3_bind_text(st, 1, sha, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, sha, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, tok[c], -1, SQLITE_STATIC);
        ck_assert_int_eq(sqlite3_step(st), SQLITE_ROW);
        ck_assert_msg(sqlite3_column_int(st, 0) == 1 && sqlite3_column_int(st, 1) == 1,
                      "the %s token is not stored as exactly one sha256", COL_NAME[c]);
        int64_t node = sqlite3_column_int64(st, 2);
        if (c == C_NODE) ck_assert_int_eq(node, node1);
        else if (c == C_NODE2) ck_assert_int_eq(node, node2);
        else ck_assert_int_eq(node, 0);
        sqlite3_finalize(st);
    }
    sqlite3_stmt *st = NULL;
    ck_assert_int_eq(sqlite3_prepare_v2(sq, "SELECT count(*) FROM tokens WHERE length(hash) != 64", -1, &st, NULL),
                     SQLITE_OK);
    ck_assert_int_eq(sqlite3_step(st), SQLITE_ROW);
    ck_assert_int_eq(sqlite3_column_int(st, 0), 0);
    sqlite3_finalize(st);
    sqlite3_close(sq);
}
END_TEST

/* ---------------------------------------------------------------- malformed requests */

START_TEST(malformed_requests) {
    char path[160];
    rawres r;
    /* a NUL in the path (job A exists: before the fix this answered it) */
    snprintf(path, sizeof path, "/api/v1/jobs/%lld%%00", (long long)job_a);
    req("GET", path, tok[C_ADMIN], NULL, NULL, NULL, 0, &r);
    assert_json_error(&r, 400, "bad_request");
    rawres_free(&r);
    snprintf(path, sizeof path, "/api/v1/jobs/%lld%%00/cancel", (long long)job_a);
    req("POST", path, tok[C_ADMIN], NULL, NULL, NULL, 0, &r);
    assert_json_error(&r, 400, "bad_request");
    rawres_free(&r);
    /* bad percent-encoding, an encoded control character, a raw one */
    const char *bad_paths[] = {"/api/v1/jobs/%zz", "/api/v1/jobs/1%4", "/api/v1/jobs/1%", "/api/v1/jobs/1%0a",
                               "/api/v1/jobs/1%7f", "/api/v1/jobs/1\x01"};
    for (size_t i = 0; i < sizeof bad_paths / sizeof bad_paths[0]; i++) {
        req("GET", bad_paths[i], tok[C_ADMIN], NULL, NULL, NULL, 0, &r);
        assert_json_error(&r, 400, "bad_request");
        rawres_free(&r);
    }
    /* the same in a query argument */
    req("GET", "/api/v1/jobs?state=%00running", tok[C_ADMIN], NULL, NULL, NULL, 0, &r);
    assert_json_error(&r, 400, "bad_request");
    ck_assert_msg(strstr(r.body, "state") != NULL, "the error does not name the argument");
    rawres_free(&r);
    req("GET", "/api/v1/jobs?st%zzate=1", tok[C_ADMIN], NULL, NULL, NULL, 0, &r);
    assert_json_error(&r, 400, "bad_request");
    rawres_free(&r);
    /* an overlong path: 414 JSON up to the daemon's own buffer (32 KiB) */
    char *longp = xmalloc(12001);
    memcpy(longp, "/api/v1/", 8);
    memset(longp + 8, 'a', 12000 - 8);
    longp[12000] = '\0';
    req("GET", longp, tok[C_ADMIN], NULL, NULL, NULL, 0, &r);
    assert_json_error(&r, 414, "uri_too_long");
    rawres_free(&r);
    free(longp);
    /* huge headers: 431 JSON up to the daemon's buffer */
    char *big = xmalloc(20100);
    int n = snprintf(big, 32, "X-Big: ");
    memset(big + n, 'b', 20000);
    memcpy(big + n + 20000, "\r\n", 3);
    req("GET", "/api/v1/jobs", tok[C_ADMIN], big, NULL, NULL, 0, &r);
    assert_json_error(&r, 431, "headers_too_large");
    rawres_free(&r);
    free(big);
    /* past the daemon's buffer libmicrohttpd answers itself (not JSON), still 4xx */
    char *huge = xmalloc(40100);
    n = snprintf(huge, 32, "X-Huge: ");
    memset(huge + n, 'h', 40000);
    memcpy(huge + n + 40000, "\r\n", 3);
    req("GET", "/api/v1/jobs", tok[C_ADMIN], huge, NULL, NULL, 0, &r);
    ck_assert_int_eq(r.status, 431);
    rawres_free(&r);
    free(huge);
    /* a control character in a header */
    req("GET", "/api/v1/jobs", tok[C_ADMIN], "X-A: a\x01z\r\n", NULL, NULL, 0, &r);
    assert_json_error(&r, 400, "bad_request");
    rawres_free(&r);
    /* Content-Length: two differing (request smuggling) -> 400 JSON; not a
     * number -> libmicrohttpd's own 400 before any handler */
    static const char two[] = "POST /api/v1/teams HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                              "Content-Type: application/json\r\nContent-Length: 2\r\nContent-Length: 9\r\n\r\n{}";
    raw_send(two, sizeof two - 1, &r);
    assert_json_error(&r, 400, "bad_request");
    rawres_free(&r);
    static const char nan_len[] = "POST /api/v1/teams HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                                  "Content-Length: abc\r\n\r\n{}";
    raw_send(nan_len, sizeof nan_len - 1, &r);
    ck_assert_int_eq(r.status, 400);
    rawres_free(&r);
    /* invalid JSON, a JSON array, an empty body */
    req("POST", "/api/v1/teams", tok[C_ADMIN], NULL, "application/json", "{\"name\":", 8, &r);
    assert_json_error(&r, 400, "bad_json");
    rawres_free(&r);
    req("POST", "/api/v1/jobs", tok[C_TEAM_A], NULL, "application/json", "[1]", 3, &r);
    ck_assert_int_eq(r.status, 400);
    rawres_free(&r);
    req("POST", "/api/v1/teams", tok[C_ADMIN], NULL, NULL, NULL, 0, &r);
    assert_json_error(&r, 400, "bad_json");
    rawres_free(&r);
    /* wrong Content-Type on a JSON endpoint: 415, nothing stored */
    req("POST", "/api/v1/teams", tok[C_ADMIN], NULL, "text/plain", "{\"name\":\"plain\"}", 16, &r);
    assert_json_error(&r, 415, "unsupported_media_type");
    rawres_free(&r);
    req("POST", "/api/v1/jobs", tok[C_TEAM_A], NULL, "multipart/form-data; boundary=x", SPEC("mp"),
        strlen(SPEC("mp")), &r);
    assert_json_error(&r, 415, "unsupported_media_type");
    rawres_free(&r);
    /* curl's default for --data and JSON with a charset are taken */
    req("POST", "/api/v1/teams", tok[C_ADMIN], NULL, "application/x-www-form-urlencoded", "{\"name\":\"curl\"}", 15,
        &r);
    ck_assert_int_eq(r.status, 201);
    rawres_free(&r);
    req("POST", "/api/v1/teams", tok[C_ADMIN], NULL, "application/json; charset=utf-8", "{\"name\":\"utf\"}", 14, &r);
    ck_assert_int_eq(r.status, 201);
    rawres_free(&r);
    cJSON *o = NULL;
    ck_assert_int_eq(jreq("GET", "/api/v1/teams", tok[C_ADMIN], NULL, &o), 200);
    char *txt = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    ck_assert_msg(strstr(txt, "\"plain\"") == NULL, "a refused request stored a team");
    free(txt);
    /* the server is still fine */
    ck_assert_int_eq(jreq("GET", "/api/v1/health", NULL, NULL, NULL), 200);
}
END_TEST

/* Body limits: 413 JSON naming the limit, from Content-Length before the
 * body is read (1 MiB default, 1 GiB checkpoints, 64 KiB rendezvous). */
START_TEST(body_limits) {
    struct {
        const char *method;
        char path[128];
        const char *token;
        const char *limit;
    } cases[3] = {{"POST", "/api/v1/jobs", tok[C_TEAM_A], "1048576"},
                  {"PUT", "", tok[C_TASK_A], "1073741824"},
                  {"PUT", "", tok[C_TASK_A], "65536"}};
    snprintf(cases[1].path, sizeof cases[1].path, "/api/v1/jobs/%lld/checkpoints?step=3&epoch=0", (long long)job_a);
    snprintf(cases[2].path, sizeof cases[2].path, "/api/v1/jobs/%lld/rendezvous/big", (long long)job_a);
    for (int i = 0; i < 3; i++) {
        char hdr[96], reqs[1024];
        snprintf(hdr, sizeof hdr, "%s", i == 1 ? "2147483648" : "1048577000");
        int n = snprintf(reqs, sizeof reqs,
                         "%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer %s\r\n"
                         "Content-Type: application/json\r\nContent-Length: %s\r\n\r\n",
                         cases[i].method, cases[i].path, cases[i].token, hdr);
        rawres r;
        raw_send(reqs, (size_t)n, &r);
        assert_json_error(&r, 413, "too_large");
        ck_assert_msg(strstr(r.body, cases[i].limit) != NULL, "the 413 does not name the limit %s: %s",
                      cases[i].limit, r.body);
        rawres_free(&r);
    }
    /* a chunked body past the limit is discarded and answered 413 */
    size_t big = (1u << 20) + 4096;
    char *body = xmalloc(big);
    memset(body, ' ', big);
    body[0] = '{';
    body[big - 1] = '}';
    buf b;
    buf_init(&b, 4u << 20);
    int rc = buf_printf(&b,
                        "POST /api/v1/teams HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer %s\r\n"
                        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n%zx\r\n",
                        tok[C_ADMIN], big);
    rc |= buf_append(&b, body, big);
    rc |= buf_appends(&b, "\r\n0\r\n\r\n");
    ck_assert_int_eq(rc, 0);
    rawres r;
    raw_send(b.data, b.len, &r);
    assert_json_error(&r, 413, "too_large");
    ck_assert_msg(strstr(r.body, "1048576") != NULL, "the 413 does not name the limit: %s", r.body);
    rawres_free(&r);
    buf_release(&b);
    free(body);
}
END_TEST

/* ---------------------------------------------------------------- old data directory */

/* A data directory of the schema before per-node tokens (migration 4):
 * the server migrates it, its node.token becomes the join token, the other
 * tokens keep working. Then the join token is rotated (file removed, server
 * restarted): the old one is refused. */
START_TEST(old_data_dir_migrates) {
    if (ty_pg_url()) {
        printf("SKIP old_data_dir_migrates on PostgreSQL: it rewrites trainyard.db to schema version 4, which"
               " exists only as SQLite's history (PostgreSQL starts at the baseline, 18)\n");
        return;
    }
    ty_proc old;
    memset(&old, 0, sizeof old);
    ty_mkdtemp(old.dir, sizeof old.dir, "authold");
    ty_server_start(&old);
    char admin[160], join[160], team[160];
    ty_token(&old, "admin.token", admin, sizeof admin);
    ty_token(&old, "node.token", join, sizeof join);
    ty_token(&old, "token", team, sizeof team);
    ty_kill(&old, SIGTERM);
    char path[512];
    snprintf(path, sizeof path, "%s/trainyard.db", old.dir);
    sqlite3 *sq = NULL;
    ck_assert_int_eq(sqlite3_open(path, &sq), SQLITE_OK);
    char *err = NULL;
    int rc = sqlite3_exec(sq,
                          "DROP INDEX tokens_node; ALTER TABLE tokens DROP COLUMN node_id;"
                          " ALTER TABLE jobs DROP COLUMN strategy;"
                          " ALTER TABLE nodes DROP COLUMN memory_mb; ALTER TABLE nodes DROP COLUMN isolation;"
                          " ALTER TABLE jobs DROP COLUMN memory_mb; ALTER TABLE tasks DROP COLUMN memory_mb;"
                          " DROP TABLE eval_metrics;"
                          " ALTER TABLE jobs DROP COLUMN workers_min; ALTER TABLE jobs DROP COLUMN workers_now;"
                          " ALTER TABLE jobs DROP COLUMN resize_to;"
                          " ALTER TABLE tokens DROP COLUMN expires_at;"
                          " DROP TABLE contexts; DROP INDEX jobs_context; ALTER TABLE jobs DROP COLUMN context;"
                          " ALTER TABLE nodes DROP COLUMN runtimes; DROP TABLE registry_creds;"
                          " DROP INDEX jobs_finished; DROP INDEX tasks_created;"
                          " ALTER TABLE tasks DROP COLUMN gpus; ALTER TABLE tasks DROP COLUMN cpus;"
                          " ALTER TABLE teams DROP COLUMN storage_quota; ALTER TABLE jobs DROP COLUMN log_bytes;"
                          " ALTER TABLE jobs DROP COLUMN deleted_at; ALTER TABLE jobs DROP COLUMN logs_purged_at;"
                          " DROP TABLE sweep_keys;"
                          " DROP TABLE sweep_rungs; DROP TABLE sweep_trials; DROP TABLE sweeps; DROP INDEX jobs_sweep;"
                          " ALTER TABLE jobs DROP COLUMN sweep_id; ALTER TABLE jobs DROP COLUMN trial;"
                          " DROP TABLE audit; DROP TABLE token_use; DROP TABLE user_tokens; DROP TABLE members;"
                          " ALTER TABLE jobs DROP COLUMN user_id; DROP TABLE users;"
                          " DROP TABLE user_usage; DROP TABLE task_ports;"
                          " ALTER TABLE teams DROP COLUMN max_interactive;"
                          " DROP TABLE blob_uploads; ALTER TABLE checkpoints DROP COLUMN store;"
                          " DROP TABLE submit_keys; DROP INDEX jobs_evaluator;"
                          " DROP INDEX log_chunks_at; ALTER TABLE log_chunks DROP COLUMN data;"
                          " DELETE FROM schema_migrations WHERE version >= 5;",
                          NULL, NULL, &err);
    ck_assert_msg(rc == SQLITE_OK, "cannot make a version-4 database: %s", err ? err : "?");
    sqlite3_close(sq);
    ty_server_start(&old);
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(old.url, join, "POST", "/api/v1/nodes", "{\"hostname\":\"h\",\"address\":\"a\"}", &o), 201);
    char ntok[160];
    snprintf(ntok, sizeof ntok, "%s", sget(o, "token"));
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(old.url, ntok, "POST", "/api/v1/nodes/1/heartbeat", NULL, &o), 200);
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(old.url, join, "POST", "/api/v1/nodes/1/heartbeat", NULL, &o), 403);
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(old.url, admin, "GET", "/api/v1/teams", NULL, &o), 200);
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(old.url, team, "GET", "/api/v1/jobs", NULL, &o), 200);
    cJSON_Delete(o);
    /* rotating the join token: remove node.token and restart; the old one is revoked */
    ty_kill(&old, SIGTERM);
    snprintf(path, sizeof path, "%s/node.token", old.dir);
    ck_assert_int_eq(unlink(path), 0);
    ty_server_start(&old);
    char join2[160];
    ty_token(&old, "node.token", join2, sizeof join2);
    ck_assert_str_ne(join, join2);
    ck_assert_int_eq(ty_http(old.url, join, "POST", "/api/v1/nodes", "{\"hostname\":\"h\",\"address\":\"a\"}", &o), 401);
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(old.url, join2, "POST", "/api/v1/nodes", "{\"hostname\":\"h\",\"address\":\"a\"}", &o), 200);
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(old.url, ntok, "POST", "/api/v1/nodes/1/heartbeat", NULL, &o), 401); /* re-registered */
    cJSON_Delete(o);
    ty_kill(&old, SIGTERM);
    ty_rmrf(old.dir);
}
END_TEST

/* ---------------------------------------------------------------- data roots */

#define CSV_SPEC(path)                                                                                      \
    "{\"name\":\"csv\",\"max_restarts\":0,\"model\":{\"layers\":[{\"type\":\"dense\",\"units\":1,"             \
    "\"activation\":\"sigmoid\",\"input_shape\":[2]}]},\"compile\":{\"optimizer\":{\"type\":\"sgd\"},"           \
    "\"loss\":\"binary_crossentropy\"},\"data\":{\"source\":\"csv\",\"path\":\"" path "\"},"                      \
    "\"fit\":{\"epochs\":1,\"batch_size\":4}}"

static void write_csv(const char *path) {
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < 16; i++) fprintf(f, "%d,%d,%d\n", i % 3, i % 5, i % 2);
    ck_assert_int_eq(fclose(f), 0);
}

/* Waits for a finished state; returns the job (caller deletes). */
static cJSON *wait_finished(const ty_proc *p, const char *team, int64_t id) {
    char path[64];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld", (long long)id);
    for (int i = 0; i < 600; i++) {
        cJSON *o = NULL;
        ck_assert_int_eq(ty_http(p->url, team, "GET", path, NULL, &o), 200);
        const char *st = sget(o, "state");
        if (strcmp(st, "succeeded") == 0 || strcmp(st, "failed") == 0 || strcmp(st, "cancelled") == 0) return o;
        cJSON_Delete(o);
        ty_sleep_ms(100);
    }
    ck_abort_msg("job %lld did not finish in 60 s", (long long)id);
    return NULL;
}

/* data.path: ".." refused at submission (422 naming the field); a symlink
 * inside the agent's data root that leads out, and an absolute path
 * outside, fail the job with the reason; a file inside trains. */
START_TEST(data_paths_confined) {
    ty_proc up;
    memset(&up, 0, sizeof up);
    ty_mkdtemp(up.dir, sizeof up.dir, "authroot");
    char root[200], outside[200], f[300], l[300];
    ck_assert_int_eq(sfmt(root, sizeof root, "%s/root", up.dir), 0);
    ck_assert_int_eq(sfmt(outside, sizeof outside, "%s/outside", up.dir), 0);
    ck_assert_int_eq(mkdir(root, 0700), 0);
    ck_assert_int_eq(mkdir(outside, 0700), 0);
    ck_assert_int_eq(sfmt(f, sizeof f, "%s/inside.csv", root), 0);
    write_csv(f);
    ck_assert_int_eq(sfmt(f, sizeof f, "%s/secret.csv", outside), 0);
    write_csv(f);
    ck_assert_int_eq(sfmt(l, sizeof l, "%s/escape.csv", root), 0);
    ck_assert_int_eq(symlink(f, l), 0);
    ck_assert_int_eq(sfmt(l, sizeof l, "%s/sub", root), 0);
    ck_assert_int_eq(symlink(outside, l), 0); /* a directory symlink leading out */
    char data_dir[200];
    ck_assert_int_eq(sfmt(data_dir, sizeof data_dir, "%s/data", up.dir), 0);
    /* the worker's own confinement, as on an agent that does not isolate
     * tasks: an isolated task (check_isolation) sees the data root alone,
     * read-only, and `outside` not at all */
    const char *extra[] = {"--cpu-slots", "2", "--data-root", root, "--isolation", "none", NULL};
    char keep[256];
    ck_assert_int_eq(sfmt(keep, sizeof keep, "%s", up.dir), 0);
    ck_assert_int_eq(sfmt(up.dir, sizeof up.dir, "%s", data_dir), 0);
    ck_assert_int_eq(mkdir(data_dir, 0700), 0);
    ty_server_start_args(&up, "up", extra);
    char team[160];
    ty_token(&up, "token", team, sizeof team);
    cJSON *o = NULL;
    /* at submission */
    ck_assert_int_eq(ty_http(up.url, team, "POST", "/api/v1/jobs", CSV_SPEC("../outside/secret.csv"), &o), 422);
    ty_assert_error(o, "invalid_value", "data.path");
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(up.url, team, "POST", "/api/v1/jobs", CSV_SPEC("a/../../x.csv"), &o), 422);
    ty_assert_error(o, "invalid_value", "data.path");
    cJSON_Delete(o);
    /* at the worker: symlinks out, an absolute path out */
    char abs_spec[2048];
    snprintf(abs_spec, sizeof abs_spec, CSV_SPEC("%s"), f);
    const char *refused[] = {CSV_SPEC("escape.csv"), CSV_SPEC("sub/secret.csv"), abs_spec};
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(ty_http(up.url, team, "POST", "/api/v1/jobs", refused[i], &o), 201);
        int64_t id = nget(o, "id");
        cJSON_Delete(o);
        o = wait_finished(&up, team, id);
        ck_assert_str_eq(sget(o, "state"), "failed");
        const char *why = sget(o, "reason");
        ck_assert_msg(strstr(why, "outside the agent's data roots") != NULL, "job %d's reason: %s", i, why);
        cJSON_Delete(o);
    }
    /* a file inside the root trains */
    ck_assert_int_eq(ty_http(up.url, team, "POST", "/api/v1/jobs", CSV_SPEC("inside.csv"), &o), 201);
    int64_t id = nget(o, "id");
    cJSON_Delete(o);
    o = wait_finished(&up, team, id);
    ck_assert_msg(strcmp(sget(o, "state"), "succeeded") == 0, "inside.csv: %s (%s)", sget(o, "state"),
                  cJSON_IsString(cJSON_GetObjectItem(o, "reason")) ? sget(o, "reason") : "");
    cJSON_Delete(o);
    /* the admin revokes the agent's node token: its next call is refused
     * (401), it registers again with the join token, and jobs still run */
    char admin[160];
    ty_token(&up, "admin.token", admin, sizeof admin);
    ck_assert_int_eq(ty_http(up.url, admin, "DELETE", "/api/v1/nodes/1/token", NULL, &o), 200);
    ck_assert_int_eq(nget(o, "revoked"), 1);
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(up.url, team, "POST", "/api/v1/jobs", CSV_SPEC("inside.csv"), &o), 201);
    id = nget(o, "id");
    cJSON_Delete(o);
    o = wait_finished(&up, team, id);
    ck_assert_msg(strcmp(sget(o, "state"), "succeeded") == 0, "after the revocation: %s (%s)", sget(o, "state"),
                  cJSON_IsString(cJSON_GetObjectItem(o, "reason")) ? sget(o, "reason") : "");
    cJSON_Delete(o);
    if (ty_pg_url()) { /* the same count, on the server's PostgreSQL database */
        char u[512];
        ty_pg_data_db(up.dir, u, sizeof u);
        ck_assert_int_eq(ty_pg_query_int64(u, "SELECT count(*) FROM tokens WHERE node_id = 1"), 2);
        ck_assert_int_eq(ty_pg_query_int64(u, "SELECT count(revoked_at) FROM tokens WHERE node_id = 1"), 1);
        ty_kill(&up, SIGTERM);
        ty_rmrf(keep);
        return;
    }
    char db_path[300];
    ck_assert_int_eq(sfmt(db_path, sizeof db_path, "%s/trainyard.db", up.dir), 0);
    sqlite3 *sq = NULL;
    ck_assert_int_eq(sqlite3_open_v2(db_path, &sq, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_busy_timeout(sq, 10000);
    sqlite3_stmt *st = NULL;
    ck_assert_int_eq(sqlite3_prepare_v2(sq, "SELECT count(*), count(revoked_at) FROM tokens WHERE node_id = 1", -1, &st,
                                        NULL),
                     SQLITE_OK);
    ck_assert_int_eq(sqlite3_step(st), SQLITE_ROW);
    ck_assert_int_eq(sqlite3_column_int(st, 0), 2); /* the revoked one and the one registered again */
    ck_assert_int_eq(sqlite3_column_int(st, 1), 1);
    sqlite3_finalize(st);
    sqlite3_close(sq);
    ty_kill(&up, SIGTERM);
    ty_rmrf(keep);
}
END_TEST

int main(void) {
    Suite *s = suite_create("auth");
    TCase *tc = tcase_create("server");
    tcase_set_timeout(tc, 120);
    tcase_add_unchecked_fixture(tc, start, stop);
    tcase_add_test(tc, auth_matrix);
    tcase_add_test(tc, lists_are_scoped);
    tcase_add_test(tc, node_tokens);
    tcase_add_test(tc, tokens_stored_hashed);
    tcase_add_test(tc, malformed_requests);
    tcase_add_test(tc, body_limits);
    suite_add_tcase(s, tc);
    TCase *mig = tcase_create("migration");
    tcase_set_timeout(mig, 60);
    tcase_add_test(mig, old_data_dir_migrates);
    suite_add_tcase(s, mig);
    TCase *dr = tcase_create("data_roots");
    tcase_set_timeout(dr, 120);
    tcase_add_test(dr, data_paths_confined);
    suite_add_tcase(s, dr);
    return ty_run_suite(s);
}
