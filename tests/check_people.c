/* check_people.c - users, roles, personal tokens and the audit trail on the
 * real server over loopback: the role matrix (every operation of
 * api/openapi.json x viewer / member / admin / another team's member /
 * revoked / expired token, against the role the document states), a
 * member removed is refused at their next request, bad input is 422
 * naming the field and changes nothing, jobs and events say who, and every
 * change and refusal has its audit row (JSON and CSV, a team admin sees
 * their team only). */
#include "testlib.h"

#include <ctype.h>
#include <sqlite3.h>

static ty_proc srv;
static char admin[128];

/* One request with an optional Trainyard-Team; the status, *out the JSON
 * body when asked (NULL when it is not JSON). */
static long req(const char *token, const char *team, const char *method, const char *path, const char *body,
                cJSON **out) {
    client c;
    ck_assert_int_eq(client_init(&c, srv.url, token), 0);
    c.timeout_ms = 20000;
    if (team) snprintf(c.team, sizeof c.team, "%s", team);
    client_reply r;
    int rc = client_request(&c, method, path, body, body ? strlen(body) : 0, NULL, &r);
    client_release(&c);
    ck_assert_msg(rc == 0, "%s %s: %s", method, path, r.error);
    if (out) *out = cJSON_ParseWithLength(r.body.data ? r.body.data : "", r.body.len);
    long st = r.status;
    client_reply_release(&r);
    return st;
}

static void make_user(const char *name) {
    char body[128];
    snprintf(body, sizeof body, "{\"name\":\"%s\",\"email\":\"%s@example.org\"}", name, name);
    ck_assert_int_eq(req(admin, NULL, "POST", "/api/v1/users", body, NULL), 201);
}

static void set_role(const char *team, const char *user, const char *role) {
    char path[160], body[64];
    snprintf(path, sizeof path, "/api/v1/teams/%s/members/%s", team, user);
    snprintf(body, sizeof body, "{\"role\":\"%s\"}", role);
    long st = req(admin, NULL, "PUT", path, body, NULL);
    ck_assert_msg(st == 200 || st == 201, "PUT %s: %ld", path, st);
}

/* A personal token the admin makes for user: the secret, *id its id. */
static void user_token(const char *user, char *out, size_t n, int64_t *id) {
    char path[128];
    snprintf(path, sizeof path, "/api/v1/users/%s/tokens", user);
    cJSON *o = NULL;
    ck_assert_int_eq(req(admin, NULL, "POST", path, "{\"name\":\"test\",\"expires_in\":3600}", &o), 201);
    snprintf(out, n, "%s", ty_str(o, "token"));
    if (id) *id = (int64_t)ty_num(o, "id");
    cJSON_Delete(o);
}

/* A job to submit (no agent runs here: it stays queued). */
static char QUICK[16384];

static void load_spec(void) {
    size_t n = 0;
    char *s = file_read_all("examples/fashion_mnist_quick.json", sizeof QUICK - 1, &n);
    ck_assert_msg(s != NULL, "cannot read examples/fashion_mnist_quick.json (run from the repository root)");
    memcpy(QUICK, s, n);
    QUICK[n] = '\0';
    free(s);
}

static void setup(void) {
    memset(&srv, 0, sizeof srv);
    ty_mkdtemp(srv.dir, sizeof srv.dir, "people");
    const char *extra[] = {"--auth-fail-limit", "0", NULL}; /* the matrix's dead tokens fail often */
    ty_server_start_args(&srv, "server", extra);
    ty_token(&srv, "admin.token", admin, sizeof admin);
    load_spec();
    ck_assert_int_eq(req(admin, NULL, "POST", "/api/v1/teams", "{\"name\":\"vision\"}", NULL), 201);
    ck_assert_int_eq(req(admin, NULL, "POST", "/api/v1/teams", "{\"name\":\"nlp\"}", NULL), 201);
}

static void teardown(void) {
    ty_kill(&srv, SIGTERM);
    ty_rmrf(srv.dir);
}

/* ---------------------------------------------------------------- the matrix */

static int rank(const char *role) {
    return strcmp(role, "viewer") == 0 ? 1 : strcmp(role, "member") == 0 ? 2 : strcmp(role, "admin") == 0 ? 3 : 0;
}

typedef struct who {
    const char *label;
    char token[96];
    int role;          /* rank in vision: 0 none */
    int dead;          /* revoked or expired: 401 everywhere */
} who;

/* The path with its {params} filled for team vision's objects. */
static void fill(const char *pattern, int64_t job, char *out, size_t n) {
    size_t o = 0;
    for (const char *p = pattern; *p && o + 1 < n;) {
        if (*p != '{') {
            out[o++] = *p++;
            continue;
        }
        const char *e = strchr(p, '}');
        char name[32];
        snprintf(name, sizeof name, "%.*s", (int)(e - p - 1), p + 1);
        char v[64];
        if (strcmp(name, "id") == 0 && strstr(pattern, "/tokens/")) snprintf(v, sizeof v, "999999");
        else if (strcmp(name, "id") == 0 && strstr(pattern, "/sweeps/")) snprintf(v, sizeof v, "999999");
        else if (strcmp(name, "id") == 0) snprintf(v, sizeof v, "%lld", (long long)job);
        else if (strcmp(name, "team") == 0) snprintf(v, sizeof v, "vision");
        else if (strcmp(name, "name") == 0) snprintf(v, sizeof v, strstr(pattern, "/users/") ? "carol" : "vision");
        else if (strcmp(name, "user") == 0) snprintf(v, sizeof v, "carol");
        else if (strcmp(name, "host") == 0) snprintf(v, sizeof v, "registry.example.org");
        else snprintf(v, sizeof v, "1");
        o += (size_t)snprintf(out + o, n - o, "%s", v);
        p = e + 1;
    }
    out[o < n ? o : n - 1] = '\0';
}

static int has(const cJSON *arr, const char *s) {
    const cJSON *x;
    cJSON_ArrayForEach(x, arr) if (cJSON_IsString(x) && strcmp(x->valuestring, s) == 0) return 1;
    return 0;
}

START_TEST(role_matrix_follows_the_document) {
    make_user("vi");
    make_user("me");
    make_user("ad");
    make_user("out");
    make_user("gone");
    make_user("old");
    make_user("carol");
    set_role("vision", "vi", "viewer");
    set_role("vision", "me", "member");
    set_role("vision", "ad", "admin");
    set_role("nlp", "out", "member");
    set_role("vision", "gone", "admin");
    set_role("vision", "old", "admin");
    who w[6] = {{"viewer", "", 1, 0}, {"member", "", 2, 0}, {"admin", "", 3, 0},
                {"other team", "", 0, 0}, {"revoked", "", 3, 1}, {"expired", "", 3, 1}};
    int64_t gone_id = 0, old_id = 0;
    user_token("vi", w[0].token, sizeof w[0].token, NULL);
    user_token("me", w[1].token, sizeof w[1].token, NULL);
    user_token("ad", w[2].token, sizeof w[2].token, NULL);
    user_token("out", w[3].token, sizeof w[3].token, NULL);
    user_token("gone", w[4].token, sizeof w[4].token, &gone_id);
    user_token("old", w[5].token, sizeof w[5].token, &old_id);
    char path[256];
    snprintf(path, sizeof path, "/api/v1/tokens/%lld", (long long)gone_id);
    ck_assert_int_eq(req(admin, NULL, "DELETE", path, NULL, NULL), 204);
    /* an expired token: its expiry moved into the past in the real database file, with the server
     * stopped (a write beside a running server is not how the service is kept) */
    ty_kill(&srv, SIGTERM);
    char sql[128];
    snprintf(sql, sizeof sql, "UPDATE user_tokens SET expires_at = 1000 WHERE id = %lld", (long long)old_id);
    if (ty_pg_url()) { /* its PostgreSQL database: a maintenance session, the lease given back */
        char u[512];
        ty_pg_data_db(srv.dir, u, sizeof u);
        ty_pg_exec_fenced(u, sql);
    } else {
        sqlite3 *db = NULL;
        char dbp[600];
        snprintf(dbp, sizeof dbp, "%s/trainyard.db", srv.dir);
        ck_assert_int_eq(sqlite3_open(dbp, &db), SQLITE_OK);
        sqlite3_busy_timeout(db, 5000);
        ck_assert_int_eq(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
        sqlite3_close(db);
    }
    const char *extra[] = {"--auth-fail-limit", "0", NULL};
    ty_server_start_args(&srv, "server", extra);
    /* the member's own job: the object every {id} names */
    cJSON *job = NULL;
    ck_assert_int_eq(req(w[1].token, "vision", "POST", "/api/v1/jobs", QUICK, &job), 201);
    int64_t jid = (int64_t)ty_num(job, "id");
    ck_assert_str_eq(ty_str(job, "user"), "me");
    cJSON_Delete(job);

    size_t len = 0;
    char *text = file_read_all("api/openapi.json", 4u << 20, &len);
    ck_assert(text != NULL);
    cJSON *doc = cJSON_ParseWithLength(text, len);
    free(text);
    ck_assert(doc != NULL);
    static const char *const methods[] = {"get", "post", "put", "patch", "delete"};
    int checked = 0;
    cJSON *p;
    /* the sign-in routes last: POST /auth/logout ends the credential it is given */
    for (int pass = 0; pass < 2; pass++)
    cJSON_ArrayForEach(p, cJSON_GetObjectItem(doc, "paths")) {
        if (strcmp(p->string, "/api/v1/health") == 0) continue;
        if ((strncmp(p->string, "/auth/", 6) == 0) != (pass == 1)) continue;
        for (size_t m = 0; m < sizeof methods / sizeof methods[0]; m++) {
            cJSON *op = cJSON_GetObjectItem(p, methods[m]);
            if (!op) continue;
            const cJSON *kinds = cJSON_GetObjectItem(op, "x-trainyard-tokens");
            if (cJSON_GetArraySize(kinds) == 0) continue; /* public */
            const cJSON *role = cJSON_GetObjectItem(op, "x-trainyard-role");
            int team_op = has(kinds, "team"), person_op = has(kinds, "person");
            char M[8];
            for (size_t i = 0; i <= strlen(methods[m]); i++) M[i] = (char)toupper((unsigned char)methods[m][i]);
            fill(p->string, jid, path, sizeof path);
            const char *body = m == 0 || m == 4 ? NULL : "{}";
            /* the admin last: what it changes (a member taken out) the others do not meet first */
            for (int k = 0; k < 6; k++) {
                const who *x = &w[k];
                int need = role && cJSON_IsString(role) ? rank(role->valuestring) : 0;
                int allowed;
                if (x->dead) allowed = 0;
                else if (person_op && !need) allowed = 1;            /* /me, /tokens: any person */
                else if (team_op || person_op) allowed = x->role > 0 && x->role >= need;
                else allowed = 0;                                     /* admin, node, task only */
                cJSON *o = NULL;
                long st = req(x->token, "vision", M, path, body, &o);
                if (allowed) {
                    ck_assert_msg(st != 401 && st != 403, "%s %s as %s (role %s): %ld, expected it allowed",
                                  M, p->string, x->label, role ? role->valuestring : "-", st);
                } else {
                    long want = x->dead ? 401 : 403;
                    ck_assert_msg(st == want, "%s %s as %s (role %s): %ld, expected %ld", M, p->string, x->label,
                                  role ? role->valuestring : "-", st, want);
                    /* a refusal for lack of a role names the role it needs */
                    if (st == 403 && need && x->role > 0) {
                        const char *msg = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "error"), "message")->valuestring;
                        ck_assert_msg(strstr(msg, role->valuestring) != NULL, "%s %s: '%s' names no role", M,
                                      p->string, msg);
                    }
                }
                cJSON_Delete(o);
                checked++;
            }
            if (strstr(p->string, "/members/{user}")) set_role("vision", "carol", "viewer"); /* as it was */
        }
    }
    cJSON_Delete(doc);
    ck_assert_int_gt(checked, 6 * 40);
}
END_TEST

/* ---------------------------------------------------------------- members, tokens */

START_TEST(removed_member_is_refused_at_once) {
    make_user("ada");
    set_role("vision", "ada", "member");
    char tok[96];
    user_token("ada", tok, sizeof tok, NULL);
    ck_assert_int_eq(req(tok, NULL, "GET", "/api/v1/jobs", NULL, NULL), 200); /* her only team */
    ck_assert_int_eq(req(admin, NULL, "DELETE", "/api/v1/teams/vision/members/ada", NULL, NULL), 204);
    cJSON *o = NULL;
    ck_assert_int_eq(req(tok, NULL, "GET", "/api/v1/jobs", NULL, &o), 403);
    cJSON_Delete(o);
    ck_assert_int_eq(req(tok, "vision", "GET", "/api/v1/jobs", NULL, &o), 403);
    ty_assert_error(o, "forbidden", "team");
    cJSON_Delete(o);
    /* /me still answers: she is a person with no team */
    ck_assert_int_eq(req(tok, NULL, "GET", "/api/v1/me", NULL, &o), 200);
    ck_assert_str_eq(ty_str(o, "name"), "ada");
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(o, "teams")), 0);
    cJSON_Delete(o);
}
END_TEST

START_TEST(tokens_are_personal_scoped_and_revocable) {
    make_user("ada");
    set_role("vision", "ada", "member");
    set_role("nlp", "ada", "viewer");
    char tok[96];
    user_token("ada", tok, sizeof tok, NULL);
    cJSON *o = NULL;
    /* two teams: the request names one */
    ck_assert_int_eq(req(tok, NULL, "GET", "/api/v1/jobs", NULL, &o), 400);
    ty_assert_error(o, "missing_team", "team");
    cJSON_Delete(o);
    /* her own read-only token bound to nlp */
    ck_assert_int_eq(req(tok, NULL, "POST", "/api/v1/tokens",
                         "{\"name\":\"ci\",\"expires_in\":600,\"team\":\"nlp\",\"scopes\":[\"read\"]}", &o), 201);
    char ro[96];
    snprintf(ro, sizeof ro, "%s", ty_str(o, "token"));
    int64_t ro_id = (int64_t)ty_num(o, "id");
    ck_assert_str_eq(ty_str(o, "team"), "nlp");
    cJSON_Delete(o);
    ck_assert_int_eq(req(ro, NULL, "GET", "/api/v1/jobs", NULL, &o), 200); /* nlp, without naming it */
    cJSON_Delete(o);
    ck_assert_int_eq(req(ro, "vision", "GET", "/api/v1/jobs", NULL, &o), 403);
    ty_assert_error(o, "forbidden", "team");
    cJSON_Delete(o);
    ck_assert_int_eq(req(ro, NULL, "POST", "/api/v1/tokens", "{\"name\":\"x\"}", &o), 403);
    ty_assert_error(o, "forbidden", "scopes");
    cJSON_Delete(o);
    /* listed without secrets; revoked at once */
    ck_assert_int_eq(req(tok, NULL, "GET", "/api/v1/tokens", NULL, &o), 200);
    cJSON *list = cJSON_GetObjectItem(o, "tokens");
    ck_assert_int_eq(cJSON_GetArraySize(list), 2);
    char *all = cJSON_PrintUnformatted(o);
    ck_assert_msg(strstr(all, ro) == NULL && strstr(all, tok) == NULL, "a secret in the listing");
    free(all);
    cJSON_Delete(o);
    char path[64];
    snprintf(path, sizeof path, "/api/v1/tokens/%lld", (long long)ro_id);
    ck_assert_int_eq(req(tok, NULL, "DELETE", path, NULL, NULL), 204);
    ck_assert_int_eq(req(ro, NULL, "GET", "/api/v1/jobs", NULL, NULL), 401);
    ck_assert_int_eq(req(tok, NULL, "DELETE", path, NULL, NULL), 404);
    /* a team's token is its service account, and says so */
    char team[128];
    ty_token(&srv, "token", team, sizeof team);
    ck_assert_int_eq(req(team, NULL, "GET", "/api/v1/me", NULL, &o), 200);
    ck_assert_str_eq(ty_str(o, "kind"), "service");
    ck_assert_str_eq(ty_str(o, "name"), "team:default (service)");
    cJSON_Delete(o);
    ck_assert_int_eq(req(team, NULL, "POST", "/api/v1/tokens", "{\"name\":\"x\"}", &o), 403);
    cJSON_Delete(o);
}
END_TEST

START_TEST(bad_input_names_the_field_and_changes_nothing) {
    make_user("ada");
    cJSON *o = NULL;
    ck_assert_int_eq(req(admin, NULL, "PUT", "/api/v1/teams/vision/members/nobody", "{\"role\":\"member\"}", &o), 422);
    ty_assert_error(o, "invalid_value", "user");
    cJSON_Delete(o);
    ck_assert_int_eq(req(admin, NULL, "PUT", "/api/v1/teams/vision/members/ada", "{\"role\":\"owner\"}", &o), 422);
    ty_assert_error(o, "invalid_value", "role");
    cJSON_Delete(o);
    ck_assert_int_eq(req(admin, NULL, "PUT", "/api/v1/teams/vision/members/ada", "{}", &o), 422);
    ty_assert_error(o, "missing_field", "role");
    cJSON_Delete(o);
    ck_assert_int_eq(req(admin, NULL, "POST", "/api/v1/users", "{\"name\":\"ada\"}", &o), 409);
    ty_assert_error(o, "conflict", "name");
    cJSON_Delete(o);
    ck_assert_int_eq(req(admin, NULL, "POST", "/api/v1/users", "{\"name\":\"a b\"}", &o), 422);
    ty_assert_error(o, "invalid_value", "name");
    cJSON_Delete(o);
    ck_assert_int_eq(req(admin, NULL, "POST", "/api/v1/users", "{\"name\":\"bo\",\"email\":\"no-at\"}", &o), 422);
    ty_assert_error(o, "invalid_value", "email");
    cJSON_Delete(o);
    ck_assert_int_eq(req(admin, NULL, "POST", "/api/v1/users/ada/tokens", "{\"name\":\"x\",\"expires_in\":5}", &o), 422);
    ty_assert_error(o, "invalid_value", "expires_in");
    cJSON_Delete(o);
    ck_assert_int_eq(req(admin, NULL, "POST", "/api/v1/users/ada/tokens", "{\"name\":\"x\",\"team\":\"nlp\"}", &o), 422);
    ty_assert_error(o, "invalid_value", "team");
    cJSON_Delete(o);
    ck_assert_int_eq(req(admin, NULL, "POST", "/api/v1/users/ada/tokens", "{\"name\":\"x\",\"scopes\":[\"root\"]}", &o),
                     422);
    ty_assert_error(o, "invalid_value", "scopes");
    cJSON_Delete(o);
    /* nothing of it was made */
    ck_assert_int_eq(req(admin, NULL, "GET", "/api/v1/teams/vision/members", NULL, &o), 200);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(o, "members")), 0);
    cJSON_Delete(o);
    ck_assert_int_eq(req(admin, NULL, "GET", "/api/v1/users", NULL, &o), 200);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(o, "users")), 1);
    cJSON_Delete(o);
}
END_TEST

/* ---------------------------------------------------------------- who did what */

START_TEST(jobs_events_and_audit_say_who) {
    make_user("ada");
    make_user("bob");
    set_role("vision", "ada", "member");
    set_role("vision", "bob", "admin");
    char ada[96], bob[96];
    user_token("ada", ada, sizeof ada, NULL);
    user_token("bob", bob, sizeof bob, NULL);
    cJSON *o = NULL;
    ck_assert_int_eq(req(ada, NULL, "POST", "/api/v1/jobs", QUICK, &o), 201);
    int64_t a1 = (int64_t)ty_num(o, "id");
    cJSON_Delete(o);
    ck_assert_int_eq(req(bob, NULL, "POST", "/api/v1/jobs", QUICK, &o), 201);
    int64_t b1 = (int64_t)ty_num(o, "id");
    cJSON_Delete(o);
    /* a member may not cancel another's job; an admin may */
    char path[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/cancel", (long long)b1);
    ck_assert_int_eq(req(ada, NULL, "POST", path, NULL, &o), 403);
    ty_assert_error(o, "forbidden", "role");
    cJSON_Delete(o);
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/cancel", (long long)a1);
    ck_assert_int_eq(req(bob, NULL, "POST", path, NULL, NULL), 200);
    /* the timeline names people */
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/events", (long long)a1);
    ck_assert_int_eq(req(ada, NULL, "GET", path, NULL, &o), 200);
    cJSON *ev = cJSON_GetObjectItem(o, "events");
    ck_assert_str_eq(ty_str(cJSON_GetArrayItem(ev, 0), "actor"), "user:ada");
    ck_assert_str_eq(ty_str(cJSON_GetArrayItem(ev, cJSON_GetArraySize(ev) - 1), "actor"), "user:bob");
    cJSON_Delete(o);
    /* ?user= */
    ck_assert_int_eq(req(ada, NULL, "GET", "/api/v1/jobs?user=bob", NULL, &o), 200);
    cJSON *jobs = cJSON_GetObjectItem(o, "jobs");
    ck_assert_int_eq(cJSON_GetArraySize(jobs), 1);
    ck_assert_int_eq((int64_t)ty_num(cJSON_GetArrayItem(jobs, 0), "id"), b1);
    cJSON_Delete(o);
    /* usage by user: one row each */
    ck_assert_int_eq(req(bob, NULL, "GET", "/api/v1/usage?by=user", NULL, &o), 200);
    ck_assert_str_eq(ty_str(o, "by"), "user");
    cJSON_Delete(o);
    /* the audit trail: the member may not read it; the team's admin reads the team's */
    ck_assert_int_eq(req(ada, NULL, "GET", "/api/v1/audit?team=vision", NULL, &o), 403);
    cJSON_Delete(o);
    ck_assert_int_eq(req(bob, NULL, "GET", "/api/v1/audit?team=vision&user=ada", NULL, &o), 200);
    cJSON *rows = cJSON_GetObjectItem(o, "audit");
    int submit = 0, refused = 0;
    cJSON *r;
    cJSON_ArrayForEach(r, rows) {
        ck_assert_str_eq(ty_str(r, "user"), "ada");
        ck_assert_str_eq(ty_str(r, "team"), "vision");
        ck_assert_str_eq(ty_str(r, "client"), "127.0.0.1");
        if (strcmp(ty_str(r, "route"), "/api/v1/jobs") == 0 && ty_num(r, "status") == 201) submit++;
        if (strcmp(ty_str(r, "route"), "/api/v1/jobs/{id}/cancel") == 0 && ty_num(r, "status") == 403) refused++;
    }
    ck_assert_int_eq(submit, 1);
    ck_assert_int_eq(refused, 1);
    cJSON_Delete(o);
    ck_assert_int_eq(req(bob, NULL, "GET", "/api/v1/audit?team=nlp", NULL, &o), 403);
    cJSON_Delete(o);
    /* CSV */
    client c;
    ck_assert_int_eq(client_init(&c, srv.url, admin), 0);
    snprintf(c.accept, sizeof c.accept, "text/csv");
    client_reply rep;
    ck_assert_int_eq(client_request(&c, "GET", "/api/v1/audit?action=/cancel", NULL, 0, NULL, &rep), 0);
    ck_assert_int_eq(rep.status, 200);
    ck_assert_msg(rep.body.data && strncmp(rep.body.data, "id,time,actor,user,", 19) == 0, "CSV header");
    ck_assert_msg(strstr(rep.body.data, ",user:ada,") && strstr(rep.body.data, ",user:bob,"), "%s", rep.body.data);
    client_reply_release(&rep);
    client_release(&c);
}
END_TEST

/* a change's audit row is written with the change: a rolled-back change
 * leaves none but its refusal; the database says so after a restart */
START_TEST(audit_rows_survive_a_restart) {
    make_user("ada");
    set_role("vision", "ada", "admin");
    /* the status is set once the answer has gone (0 until then: committed, answer not recorded) */
    int answered = 0;
    for (int i = 0; i < 100 && !answered; i++) {
        cJSON *o = NULL;
        ck_assert_int_eq(req(admin, NULL, "GET", "/api/v1/audit?action=/members/", NULL, &o), 200);
        answered = (int)ty_num(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "audit"), 0), "status") == 201;
        cJSON_Delete(o);
        if (!answered) ty_sleep_ms(20);
    }
    ck_assert(answered);
    ty_kill(&srv, SIGKILL);
    const char *extra[] = {"--auth-fail-limit", "0", NULL};
    ty_server_start_args(&srv, "server", extra);
    cJSON *o = NULL;
    ck_assert_int_eq(req(admin, NULL, "GET", "/api/v1/audit?action=/members/", NULL, &o), 200);
    cJSON *rows = cJSON_GetObjectItem(o, "audit");
    ck_assert_int_eq(cJSON_GetArraySize(rows), 1);
    ck_assert_str_eq(ty_str(cJSON_GetArrayItem(rows, 0), "target"), "team=vision user=ada");
    ck_assert_int_eq((int)ty_num(cJSON_GetArrayItem(rows, 0), "status"), 201);
    cJSON_Delete(o);
}
END_TEST

int main(void) {
    Suite *s = suite_create("people");
    TCase *tc = ty_tcase(s, "people", setup, teardown, 240);
    tcase_add_test(tc, role_matrix_follows_the_document);
    tcase_add_test(tc, removed_member_is_refused_at_once);
    tcase_add_test(tc, tokens_are_personal_scoped_and_revocable);
    tcase_add_test(tc, bad_input_names_the_field_and_changes_nothing);
    tcase_add_test(tc, jobs_events_and_audit_say_who);
    tcase_add_test(tc, audit_rows_survive_a_restart);
    return ty_run_suite(s);
}
