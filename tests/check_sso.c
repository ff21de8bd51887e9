/* check_sso.c - single sign-on through the real server (api/auth_api.c):
 * `trainyard server --oidc-*` and a real OpenID Provider
 * (tests/oidc/provider.mjs, node) on loopback, libcurl playing the browser.
 * The code flow from our /auth/login through the provider's login form to
 * our /auth/callback and its session cookie; /me and the teams the groups
 * claim gives; CSRF on a change made with the cookie; sign-out. Forged ID
 * tokens (the provider's forge mode) through the real callback, each
 * refused with its reason and no session. Memberships the claim no longer
 * gives removed at a sign-in. The device flow with `trainyard login`,
 * `whoami` and `logout` as real processes. A provider that is not up at
 * the start: one log line, token users served, 503 with the reason, and
 * the sign-in working once it is up.
 *
 * Without node or node_modules/oidc-provider (`npm ci`) the suite says SKIP
 * and passes, unless OIDC_TEST_REQUIRED=1 (tests/run_all.sh sets it). */
#include "testlib.h"

#include <cjose/cjose.h>
#include <curl/curl.h>
#include <poll.h>
#include <sqlite3.h>

#include "../server/http.h"
#include "oidc_fixture.h"

#define SECRET "s3cret-of-trainyard"

typedef oidc_op provider;

static provider g_op;
static ty_proc g_srv;
static char g_admin[160];
static int g_port;

/* ---------------------------------------------------------------- processes */

/* The fixture on port (0: any), its redirect URI our server's callback at server_port. */
static void provider_start(provider *p, int port, int server_port) {
    char redirect[128];
    snprintf(redirect, sizeof redirect, "http://127.0.0.1:%d/auth/callback", server_port);
    oidc_op_start(p, "sso_op", redirect, SECRET, port);
}

static void provider_stop(provider *p) { oidc_op_stop(p); }

/* `trainyard server --listen 127.0.0.1:port --oidc-* issuer` with its data
 * in s->dir (made when fresh; else the same directory again). */
static void server_start(ty_proc *s, int port, const char *issuer, const char *secret_dir, int fresh) {
    if (fresh) {
        memset(s, 0, sizeof *s);
        ty_mkdtemp(s->dir, sizeof s->dir, "sso_srv");
    }
    static char listen[64], secret[320], iss[160];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    snprintf(secret, sizeof secret, "%s/secret", secret_dir);
    snprintf(iss, sizeof iss, "%s", issuer);
    ck_assert_int_eq(file_write_atomic(secret, SECRET "\n", strlen(SECRET) + 1, 0600), 0);
    const char *extra[] = {"--listen", listen, "--oidc-issuer", iss, "--oidc-client-id", "trainyard",
                           "--oidc-client-secret-file", secret, NULL};
    ty_server_start_args(s, "server", extra);
}

/* ---------------------------------------------------------------- the browser */

typedef struct answer {
    long status;
    buf body;
    char location[2048];
    char cookie[512];   /* the Set-Cookie header, "" when none */
} answer;

static size_t on_data(char *p, size_t size, size_t nmemb, void *ud) {
    return buf_append(ud, p, size * nmemb) == 0 ? size * nmemb : 0;
}

static void header_value(const char *p, size_t n, size_t skip, char *out, size_t cap) {
    size_t s = skip;
    while (s < n && p[s] == ' ') s++;
    size_t e = n;
    while (e > s && (p[e - 1] == '\r' || p[e - 1] == '\n')) e--;
    snprintf(out, cap, "%.*s", (int)(e - s), p + s);
}

static size_t on_header(char *p, size_t size, size_t nmemb, void *ud) {
    answer *a = ud;
    size_t n = size * nmemb;
    if (n > 9 && !strncasecmp(p, "location:", 9)) header_value(p, n, 9, a->location, sizeof a->location);
    if (n > 11 && !strncasecmp(p, "set-cookie:", 11)) header_value(p, n, 11, a->cookie, sizeof a->cookie);
    return n;
}

static void answer_free(answer *a) { buf_release(&a->body); }

/* One request on h (which keeps the provider's cookies). headers: extra
 * header lines, NULL-terminated (may be NULL). */
static void req(CURL *h, const char *method, const char *url, const char *body, const char *const *headers,
                answer *a) {
    memset(a, 0, sizeof *a);
    buf_init(&a->body, 1 << 20);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &a->body);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, a);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 30000L);
    struct curl_slist *hdr = NULL;
    for (int i = 0; headers && headers[i]; i++) hdr = curl_slist_append(hdr, headers[i]);
    if (body) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(body));
    } else {
        curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
    }
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    CURLcode rc = curl_easy_perform(h);
    curl_slist_free_all(hdr);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, NULL);
    ck_assert_msg(rc == CURLE_OK, "%s %s: %s", method, url, curl_easy_strerror(rc));
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &a->status);
}

/* A sign-in as user: GET server/auth/login, the provider's pages and login
 * form, then our callback; its answer into cb. */
static void sign_in(const char *server, const char *issuer, const char *user, const char *password, answer *cb) {
    CURL *h = curl_easy_init();
    curl_easy_setopt(h, CURLOPT_COOKIEFILE, ""); /* the cookie engine, in memory */
    char url[2048], form[256], callback[300];
    snprintf(url, sizeof url, "%s/auth/login?return_to=/%%23/jobs", server);
    snprintf(callback, sizeof callback, "%s/auth/callback", server);
    const char *post = NULL;
    for (int hop = 0; hop < 20; hop++) {
        answer a;
        req(h, post ? "POST" : "GET", url, post,
            post ? (const char *const[]){"Content-Type: application/x-www-form-urlencoded", NULL} : NULL, &a);
        post = NULL;
        if (!strncmp(url, callback, strlen(callback))) {
            *cb = a;
            curl_easy_cleanup(h);
            return;
        }
        if (a.status >= 300 && a.status < 400) {
            if (a.location[0] == '/') snprintf(url, sizeof url, "%s%.1900s", issuer, a.location);
            else snprintf(url, sizeof url, "%s", a.location);
            answer_free(&a);
            continue;
        }
        ck_assert_msg(a.status == 200, "%s: %ld %s", url, a.status, a.body.data ? a.body.data : "");
        const char *f = a.body.data ? strstr(a.body.data, "action=\"/interaction/") : NULL;
        ck_assert_msg(f != NULL, "no login form at %s: %s", url, a.body.data ? a.body.data : "");
        f += strlen("action=\"");
        snprintf(url, sizeof url, "%s%.*s", issuer, (int)strcspn(f, "\""), f);
        snprintf(form, sizeof form, "login=%s&password=%s", user, password);
        post = form;
        answer_free(&a);
    }
    ck_abort_msg("the browser did not reach our callback in 20 hops");
}

/* The session value of a Set-Cookie header ("tys_..."), into out. */
static void cookie_value(const char *set_cookie, char *out, size_t n) {
    const char *v = strstr(set_cookie, HTTP_SESSION_COOKIE "=");
    ck_assert_msg(v != NULL, "no session cookie in '%s'", set_cookie);
    v += strlen(HTTP_SESSION_COOKIE "=");
    snprintf(out, n, "%.*s", (int)strcspn(v, ";"), v);
}

/* A request to our server with the session cookie (and CSRF token, team when given). */
static long with_cookie(const char *method, const char *path, const char *session, const char *csrf, const char *team,
                        const char *body, cJSON **out, answer *keep) {
    CURL *h = curl_easy_init();
    char url[512], cookie[200], csrfh[160], teamh[128];
    snprintf(url, sizeof url, "%s%s", g_srv.url, path);
    snprintf(cookie, sizeof cookie, "Cookie: " HTTP_SESSION_COOKIE "=%s", session);
    snprintf(csrfh, sizeof csrfh, "X-CSRF-Token: %s", csrf ? csrf : "");
    snprintf(teamh, sizeof teamh, "Trainyard-Team: %s", team ? team : "");
    const char *hdr[5] = {cookie, "Content-Type: application/json", NULL, NULL, NULL};
    int n = 2;
    if (csrf) hdr[n++] = csrfh;
    if (team) hdr[n++] = teamh;
    answer a;
    req(h, method, url, body, hdr, &a);
    curl_easy_cleanup(h);
    if (out) *out = cJSON_ParseWithLength(a.body.data ? a.body.data : "", a.body.len);
    long st = a.status;
    if (keep) *keep = a;
    else answer_free(&a);
    return st;
}

/* A request to the provider's control port; its answer parsed. */
static cJSON *control(const provider *p, const char *method, const char *path, const char *json) {
    CURL *h = curl_easy_init();
    char url[512];
    snprintf(url, sizeof url, "%s%s", p->control, path);
    answer a;
    req(h, method, url, json, json ? (const char *const[]){"Content-Type: application/json", NULL} : NULL, &a);
    curl_easy_cleanup(h);
    cJSON *j = cJSON_Parse(a.body.data ? a.body.data : "");
    ck_assert_msg(a.status == 200 && j, "%s %s: %ld %s", method, path, a.status, a.body.data ? a.body.data : "");
    answer_free(&a);
    return j;
}

/* One value of the server's database (a statement giving one integer), read
 * or written with the server stopped (it keeps its database to itself). */
static long long db_int(const char *sql) {
    char path[400];
    snprintf(path, sizeof path, "%s/trainyard.db", g_srv.dir);
    sqlite3 *sq = NULL;
    ck_assert_int_eq(sqlite3_open_v2(path, &sq, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
    sqlite3_busy_timeout(sq, 5000);
    sqlite3_stmt *st = NULL;
    ck_assert_msg(sqlite3_prepare_v2(sq, sql, -1, &st, NULL) == SQLITE_OK, "%s: %s", sql, sqlite3_errmsg(sq));
    int rc = sqlite3_step(st);
    long long v = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -1;
    ck_assert_msg(rc == SQLITE_ROW || rc == SQLITE_DONE, "%s: %s", sql, sqlite3_errmsg(sq));
    sqlite3_finalize(st);
    sqlite3_close(sq);
    return v;
}

static void team_create(const char *name) {
    char body[96];
    snprintf(body, sizeof body, "{\"name\":\"%s\"}", name);
    long st = ty_http(g_srv.url, g_admin, "POST", "/api/v1/teams", body, NULL);
    ck_assert_msg(st == 201 || st == 409, "POST /teams %s: %ld", name, st);
}

/* The role the teams array of a /me answer gives in team ("" when none). */
static const char *role_in(const cJSON *me, const char *team) {
    const cJSON *t;
    cJSON_ArrayForEach(t, cJSON_GetObjectItem(me, "teams"))
        if (!strcmp(ty_str(t, "team"), team)) return ty_str(t, "role");
    return "";
}

/* ---------------------------------------------------------------- fixture */

static void setup(void) {
    char why[128];
    if (!oidc_have_provider(why, sizeof why)) return;
    int port = ty_free_port();
    provider_start(&g_op, 0, port);
    g_port = port;
    server_start(&g_srv, port, g_op.issuer, g_op.dir, 1);
    ty_token(&g_srv, "admin.token", g_admin, sizeof g_admin);
    team_create("vision");
    team_create("nlp");
}

static void teardown(void) {
    ty_kill(&g_srv, SIGTERM);
    if (g_srv.dir[0]) ty_rmrf(g_srv.dir);
    provider_stop(&g_op);
}

#define NEED_PROVIDER()                                                            \
    do {                                                                           \
        if (!g_op.pid) {                                                           \
            printf("SKIP %s: no OpenID Provider (node, npm ci)\n", __func__);     \
            return;                                                                \
        }                                                                          \
    } while (0)

/* ---------------------------------------------------------------- tests */

START_TEST(code_flow_session_csrf_logout) {
    NEED_PROVIDER();
    answer cb;
    sign_in(g_srv.url, g_op.issuer, "ada", "ada-password", &cb);
    ck_assert_msg(cb.status == 302, "callback: %ld %s", cb.status, cb.body.data ? cb.body.data : "");
    ck_assert_str_eq(cb.location, "/#/jobs");
    /* the cookie's attributes: the page's script never sees it, other sites do not send it */
    ck_assert_msg(strstr(cb.cookie, "; HttpOnly") && strstr(cb.cookie, "; SameSite=Lax") && strstr(cb.cookie, "; Path=/") &&
                      strstr(cb.cookie, "; Max-Age=43200"), "%s", cb.cookie);
    ck_assert_ptr_null(strstr(cb.cookie, "Secure")); /* plain HTTP on loopback */
    char session[128];
    cookie_value(cb.cookie, session, sizeof session);
    ck_assert_msg(!strncmp(session, "tys_", 4), "%s", session);
    answer_free(&cb);

    cJSON *me = NULL;
    ck_assert_int_eq(with_cookie("GET", "/api/v1/me", session, NULL, NULL, NULL, &me, NULL), 200);
    ck_assert_str_eq(ty_str(me, "name"), "ada");
    ck_assert_str_eq(ty_str(me, "kind"), "user");
    ck_assert_str_eq(ty_str(me, "email"), "ada@example.org");
    ck_assert_str_eq(ty_str(me, "signed_in_via"), "oidc session");
    ck_assert_str_eq(role_in(me, "vision"), "admin"); /* the groups claim: vision:admin */
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(me, "teams")), 1);
    char csrf[80];
    snprintf(csrf, sizeof csrf, "%s", ty_str(me, "csrf"));
    ck_assert_uint_eq(strlen(csrf), 64);
    cJSON_Delete(me);

    /* a change with the cookie alone is refused: a page of another site could send it */
    cJSON *o = NULL;
    ck_assert_int_eq(with_cookie("POST", "/api/v1/tokens", session, NULL, NULL, "{\"name\":\"ci\"}", &o, NULL), 403);
    ty_assert_error(o, "csrf", HTTP_CSRF_HEADER);
    cJSON_Delete(o);
    ck_assert_int_eq(with_cookie("POST", "/api/v1/tokens", session, "0000", NULL, "{\"name\":\"ci\"}", NULL, NULL), 403);
    ck_assert_int_eq(with_cookie("POST", "/api/v1/tokens", session, csrf, NULL, "{\"name\":\"ci\"}", &o, NULL), 201);
    ck_assert(!strncmp(ty_str(o, "token"), "typ_", 4));
    cJSON_Delete(o);
    /* a team's route in the team the header names */
    ck_assert_int_eq(with_cookie("GET", "/api/v1/teams/vision/members", session, NULL, "vision", NULL, NULL, NULL), 200);
    /* the sign-in is in the audit trail */
    cJSON *audit = NULL;
    ck_assert_int_eq(ty_http(g_srv.url, g_admin, "GET", "/api/v1/audit?user=ada&action=/auth/callback", NULL, &audit), 200);
    const cJSON *row = cJSON_GetArrayItem(cJSON_GetObjectItem(audit, "audit"), 0);
    ck_assert_msg(row && (int)ty_num(row, "status") == 302, "no sign-in row in the audit trail");
    cJSON_Delete(audit);

    /* sign-out: without the CSRF token refused, with it the session ends and the cookie is cleared */
    ck_assert_int_eq(with_cookie("POST", "/auth/logout", session, NULL, NULL, NULL, NULL, NULL), 403);
    answer out;
    ck_assert_int_eq(with_cookie("POST", "/auth/logout", session, csrf, NULL, NULL, NULL, &out), 200);
    ck_assert_msg(strstr(out.cookie, HTTP_SESSION_COOKIE "=;") && strstr(out.cookie, "Max-Age=0"), "%s", out.cookie);
    answer_free(&out);
    ck_assert_int_eq(with_cookie("GET", "/api/v1/me", session, NULL, NULL, NULL, &o, NULL), 401);
    ty_assert_error(o, "unauthorized", NULL);
    cJSON_Delete(o);
    /* the session is a cookie only: as a bearer token it is nothing */
    ck_assert_int_eq(ty_http(g_srv.url, session, "GET", "/api/v1/me", NULL, NULL), 401);
}
END_TEST

/* ---------------------------------------------------------------- forged tokens */

static cjose_jwk_t *provider_key(void) {
    size_t n = 0;
    char *json = file_read_all(g_op.keyfile, 65536, &n);
    ck_assert_ptr_nonnull(json);
    cjose_err e;
    cjose_jwk_t *k = cjose_jwk_import(json, n, &e);
    ck_assert_msg(k != NULL, "%s", cjose_err_message(e.code));
    free(json);
    return k;
}

/* A good token's claims for ada (exp in an hour, a nonce of no login). */
static cJSON *claims(void) {
    cJSON *c = cJSON_CreateObject();
    int64_t now = now_ms() / 1000;
    cJSON_AddStringToObject(c, "iss", g_op.issuer);
    cJSON_AddStringToObject(c, "aud", "trainyard");
    cJSON_AddStringToObject(c, "sub", "ada");
    cJSON_AddStringToObject(c, "preferred_username", "ada");
    cJSON_AddNumberToObject(c, "iat", (double)now);
    cJSON_AddNumberToObject(c, "exp", (double)(now + 3600));
    cJSON_AddStringToObject(c, "nonce", "a-nonce-of-no-login");
    return c;
}

/* Signs claims (consumed) RS256 with key under kid. */
static char *sign(cjose_jwk_t *key, cJSON *c) {
    char *payload = cJSON_PrintUnformatted(c);
    cJSON_Delete(c);
    cjose_err e;
    cjose_header_t *h = cjose_header_new(&e);
    ck_assert(cjose_header_set(h, CJOSE_HDR_ALG, CJOSE_HDR_ALG_RS256, &e));
    ck_assert(cjose_header_set(h, CJOSE_HDR_KID, "fixture-rsa-1", &e));
    cjose_jws_t *jws = cjose_jws_sign(key, h, (const uint8_t *)payload, strlen(payload), &e);
    ck_assert_msg(jws != NULL, "%s", cjose_err_message(e.code));
    const char *ser = NULL;
    ck_assert(cjose_jws_export(jws, &ser, &e));
    char *out = xstrdup(ser);
    cjose_jws_release(jws);
    cjose_header_release(h);
    free(payload);
    cjose_jwk_release(key);
    return out;
}

static char *b64u(const char *s) {
    char *o = NULL;
    size_t len = 0;
    cjose_err e;
    ck_assert(cjose_base64url_encode((const uint8_t *)s, strlen(s), &o, &len, &e));
    char *r = xstrdup(o);
    cjose_get_dealloc()(o);
    return r;
}

/* The provider's token endpoint answers tok (freed) for the next sign-in,
 * which our callback must refuse with want in its answer, and no session. */
static void forged_refused(char *tok, const char *want) {
    cJSON *body = cJSON_CreateObject();
    cJSON_AddStringToObject(body, "id_token", tok);
    char *text = cJSON_PrintUnformatted(body);
    cJSON_Delete(control(&g_op, "PUT", "/forge", text));
    free(text);
    cJSON_Delete(body);
    free(tok);
    answer cb;
    sign_in(g_srv.url, g_op.issuer, "ada", "ada-password", &cb);
    cJSON_Delete(control(&g_op, "DELETE", "/forge", NULL));
    ck_assert_msg(cb.status == 401, "a forged token (%s): %ld %s", want, cb.status, cb.body.data ? cb.body.data : "");
    ck_assert_msg(cb.body.data && strstr(cb.body.data, want), "wanted '%s' in: %s", want, cb.body.data ? cb.body.data : "");
    ck_assert_msg(!cb.cookie[0], "a refused sign-in set a cookie: %s", cb.cookie);
    answer_free(&cb);
}

START_TEST(forged_tokens_refused) {
    NEED_PROVIDER();
    /* alg none: unsigned */
    cJSON *c = claims();
    char *payload = cJSON_PrintUnformatted(c);
    cJSON_Delete(c);
    char *h64 = b64u("{\"alg\":\"none\",\"kid\":\"fixture-rsa-1\"}"), *p64 = b64u(payload);
    char *none = xmalloc(strlen(h64) + strlen(p64) + 3);
    snprintf(none, strlen(h64) + strlen(p64) + 3, "%s.%s.", h64, p64);
    free(h64);
    free(p64);
    free(payload);
    forged_refused(none, "id token: alg 'none' refused");
    /* a key of no one's: the provider's kid, another key */
    cjose_err e;
    forged_refused(sign(cjose_jwk_create_RSA_random(2048, NULL, 0, &e), claims()),
                   "id token: the signature does not verify with key 'fixture-rsa-1'");
    /* minted for another client, by another issuer, long expired */
    c = claims();
    cJSON_ReplaceItemInObject(c, "aud", cJSON_CreateString("another-client"));
    forged_refused(sign(provider_key(), c), "id token: aud does not contain client_id 'trainyard'");
    c = claims();
    cJSON_ReplaceItemInObject(c, "iss", cJSON_CreateString("http://127.0.0.1:1"));
    forged_refused(sign(provider_key(), c), "id token: iss 'http://127.0.0.1:1' is not the issuer");
    c = claims();
    cJSON_ReplaceItemInObject(c, "exp", cJSON_CreateNumber((double)(now_ms() / 1000 - 3600)));
    cJSON_ReplaceItemInObject(c, "iat", cJSON_CreateNumber((double)(now_ms() / 1000 - 7200)));
    forged_refused(sign(provider_key(), c), "id token: expired");
    /* the provider's own token of a sign-in that succeeded, shown again in another */
    answer cb;
    sign_in(g_srv.url, g_op.issuer, "ada", "ada-password", &cb);
    ck_assert_int_eq(cb.status, 302);
    answer_free(&cb);
    cJSON *st = control(&g_op, "GET", "/stats", NULL);
    char *last = xstrdup(cJSON_GetObjectItem(st, "last_id_token")->valuestring);
    cJSON_Delete(st);
    forged_refused(last, "id token: nonce");
    /* a browser is shown the reason too */
    CURL *h = curl_easy_init();
    char url[512];
    snprintf(url, sizeof url, "%s/auth/callback?code=x&state=no-such-state", g_srv.url);
    answer a;
    req(h, "GET", url, NULL, (const char *const[]){"Accept: text/html", NULL}, &a);
    curl_easy_cleanup(h);
    ck_assert_int_eq(a.status, 401);
    ck_assert_msg(a.body.data && strstr(a.body.data, "<p class=\"alert\" id=\"reason\">unknown or expired state</p>"),
                  "%s", a.body.data ? a.body.data : "");
    ck_assert(!a.cookie[0]);
    answer_free(&a);
    /* the provider's refusal */
    h = curl_easy_init();
    snprintf(url, sizeof url, "%s/auth/callback?error=access_denied&error_description=no&state=s", g_srv.url);
    req(h, "GET", url, NULL, NULL, &a);
    curl_easy_cleanup(h);
    ck_assert_int_eq(a.status, 403);
    ck_assert_msg(a.body.data && strstr(a.body.data, "the provider answered access_denied: no"), "%s", a.body.data);
    answer_free(&a);
    /* of all these sign-ins, the one that succeeded made a session, and only it */
    ty_kill(&g_srv, SIGTERM);
    ck_assert_int_eq(db_int("SELECT count(*) FROM user_tokens WHERE kind = 'session'"), 1);
}
END_TEST

START_TEST(groups_replace_oidc_memberships) {
    NEED_PROVIDER();
    team_create("research");
    team_create("infra");
    /* bob exists (the admin made him) with an oidc membership the claim does not give, and one set through the API */
    ck_assert_int_eq(ty_http(g_srv.url, g_admin, "POST", "/api/v1/users", "{\"name\":\"bob\"}", NULL), 201);
    long put = ty_http(g_srv.url, g_admin, "PUT", "/api/v1/teams/infra/members/bob", "{\"role\":\"member\"}", NULL);
    ck_assert_msg(put == 200 || put == 201, "PUT member: %ld", put);
    ty_kill(&g_srv, SIGTERM);
    ck_assert_int_eq(db_int("INSERT INTO members(team_id, user_id, role, source, created_at) SELECT t.id, u.id, "
                            "'admin', 'oidc', 0 FROM teams t, users u WHERE t.name = 'research' AND u.name = 'bob' "
                            "RETURNING 1"), 1);
    server_start(&g_srv, g_port, g_op.issuer, g_op.dir, 0);
    answer cb;
    sign_in(g_srv.url, g_op.issuer, "bob", "bob-password", &cb);
    ck_assert_msg(cb.status == 302, "%ld %s", cb.status, cb.body.data ? cb.body.data : "");
    char session[128];
    cookie_value(cb.cookie, session, sizeof session);
    answer_free(&cb);
    cJSON *me = NULL;
    ck_assert_int_eq(with_cookie("GET", "/api/v1/me", session, NULL, NULL, NULL, &me, NULL), 200);
    ck_assert_str_eq(ty_str(me, "name"), "bob");
    ck_assert_str_eq(role_in(me, "vision"), "viewer");
    ck_assert_str_eq(role_in(me, "nlp"), "member");
    ck_assert_str_eq(role_in(me, "research"), ""); /* no longer given: removed */
    ck_assert_str_eq(role_in(me, "infra"), "member"); /* the API's: kept */
    cJSON_Delete(me);
    /* a viewer of vision reads there, and may not change */
    answer jobs;
    long st = with_cookie("GET", "/api/v1/jobs", session, NULL, "vision", NULL, NULL, &jobs);
    ck_assert_msg(st == 200, "GET /jobs as bob in vision: %ld %s", st, jobs.body.data ? jobs.body.data : "");
    answer_free(&jobs);
}
END_TEST

/* The binary's absolute path (the CLI runs in another directory). */
static const char *bin_abs(void) {
    static char path[PATH_MAX];
    ck_assert_msg(realpath(ty_bin(), path) != NULL, "no %s", ty_bin());
    return path;
}

/* Runs `trainyard ARGS...` with HOME home (in it, so no .trainyard/token is
 * found) and no token in the environment; stdout into out (cap bytes). */
static int cli(const char *home, char *out, size_t cap, const char *const *args) {
    const char *exe = bin_abs();
    int fd[2];
    ck_assert_int_eq(pipe(fd), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        dup2(fd[1], 1);
        close(fd[0]);
        close(fd[1]);
        setenv("HOME", home, 1);
        unsetenv("XDG_CONFIG_HOME");
        unsetenv("TRAINYARD_TOKEN");
        unsetenv("TRAINYARD_TOKEN_FILE");
        setenv("TRAINYARD_URL", g_srv.url, 1);
        if (chdir(home) != 0) _exit(126);
        const char *argv[12] = {exe};
        int n = 1;
        for (int i = 0; args[i] && n < 11; i++) argv[n++] = args[i];
        argv[n] = NULL;
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(fd[1]);
    size_t len = 0;
    for (;;) {
        ssize_t r = read(fd[0], out + len, cap - 1 - len);
        if (r <= 0) break;
        len += (size_t)r;
        if (len >= cap - 1) break;
    }
    out[len] = '\0';
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

START_TEST(device_flow_cli) {
    NEED_PROVIDER();
    char home[256];
    ty_mkdtemp(home, sizeof home, "sso_home");
    /* trainyard login: reads its code from its output, approved as bob at the provider */
    const char *exe = bin_abs();
    int fd[2];
    ck_assert_int_eq(pipe(fd), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        dup2(fd[1], 1);
        close(fd[0]);
        close(fd[1]);
        setenv("HOME", home, 1);
        unsetenv("XDG_CONFIG_HOME");
        unsetenv("TRAINYARD_TOKEN");
        if (chdir(home) != 0) _exit(126);
        execl(exe, exe, "login", "--url", g_srv.url, (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    char out[4096];
    size_t len = 0;
    const char *code = NULL;
    int64_t end = mono_ms() + 30000;
    while (!code || !strchr(code, '\n')) {
        struct pollfd pf = {fd[0], POLLIN, 0};
        int left = (int)(end - mono_ms());
        ck_assert_msg(left > 0 && poll(&pf, 1, left) == 1, "trainyard login printed no code: %.*s", (int)len, out);
        ssize_t r = read(fd[0], out + len, sizeof out - 1 - len);
        ck_assert_msg(r > 0, "trainyard login ended: %.*s", (int)len, out);
        len += (size_t)r;
        out[len] = '\0';
        code = strstr(out, "enter the code ");
    }
    code += strlen("enter the code ");
    char user_code[32], body[128];
    snprintf(user_code, sizeof user_code, "%.*s", (int)strcspn(code, "\n"), code);
    ck_assert_msg(strstr(out, "To sign in, open ") && strstr(out, "/device\n") && strstr(out, "user_code="), "%s", out);
    snprintf(body, sizeof body, "{\"user_code\":\"%s\",\"username\":\"bob\"}", user_code);
    cJSON *ok = control(&g_op, "POST", "/device/approve", body);
    ck_assert_str_eq(ty_str(ok, "approved"), "bob");
    cJSON_Delete(ok);
    for (;;) {
        ssize_t r = read(fd[0], out + len, sizeof out - 1 - len);
        if (r <= 0) break;
        len += (size_t)r;
    }
    out[len] = '\0';
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "trainyard login: %s", out);
    ck_assert_msg(strstr(out, "Signed in as bob"), "%s", out);

    /* the token file: 0600 in a 0700 folder */
    char path[420], dir[400];
    snprintf(dir, sizeof dir, "%s/.config/trainyard", home);
    snprintf(path, sizeof path, "%s/token", dir);
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_int_eq(st.st_mode & 0777, 0600);
    ck_assert_int_eq(stat(dir, &st), 0);
    ck_assert_int_eq(st.st_mode & 0777, 0700);
    char token[128];
    size_t tl = 0;
    char *t = file_read_all(path, 1024, &tl);
    ck_assert_ptr_nonnull(t);
    snprintf(token, sizeof token, "%.*s", (int)strcspn(t, "\n"), t);
    free(t);
    ck_assert(!strncmp(token, "typ_", 4));

    /* the CLI uses it when no other token is given */
    char said[4096];
    ck_assert_int_eq(cli(home, said, sizeof said, (const char *const[]){"whoami", NULL}), 0);
    ck_assert_msg(strstr(said, "name:       bob\n") && strstr(said, "signed in:  oidc device login") &&
                      strstr(said, "vision (viewer)") && strstr(said, "nlp (member)"), "%s", said);
    ck_assert_int_eq(cli(home, said, sizeof said, (const char *const[]){"jobs", "--team", "nlp", NULL}), 0);

    /* logout: revoked, and the file removed */
    ck_assert_int_eq(cli(home, said, sizeof said, (const char *const[]){"logout", NULL}), 0);
    ck_assert_msg(strstr(said, "Signed out: the token is revoked"), "%s", said);
    ck_assert_int_ne(stat(path, &st), 0);
    ck_assert_int_eq(ty_http(g_srv.url, token, "GET", "/api/v1/me", NULL, NULL), 401);
    ck_assert_int_eq(cli(home, said, sizeof said, (const char *const[]){"whoami", NULL}), 2); /* no token now */
    ty_rmrf(home);
}
END_TEST

START_TEST(device_poll_paced) {
    NEED_PROVIDER();
    cJSON *d = NULL;
    ck_assert_int_eq(ty_http(g_srv.url, NULL, "POST", "/api/v1/auth/device", "{}", &d), 200);
    ck_assert(!strncmp(ty_str(d, "device"), "tyd_", 4));
    ck_assert_int_eq((int)ty_num(d, "interval"), 5);
    char body[200];
    snprintf(body, sizeof body, "{\"device\":\"%s\"}", ty_str(d, "device"));
    cJSON_Delete(d);
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(g_srv.url, NULL, "POST", "/api/v1/auth/device/token", body, &o), 400);
    ty_assert_error(o, "authorization_pending", NULL);
    cJSON_Delete(o);
    /* again at once: before the interval */
    ck_assert_int_eq(ty_http(g_srv.url, NULL, "POST", "/api/v1/auth/device/token", body, &o), 400);
    ty_assert_error(o, "slow_down", NULL);
    ck_assert_int_eq((int)ty_num(o, "interval"), 10);
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(g_srv.url, NULL, "POST", "/api/v1/auth/device/token",
                             "{\"device\":\"tyd_nosuchhandle\"}", &o), 400);
    ty_assert_error(o, "expired_token", NULL);
    cJSON_Delete(o);
}
END_TEST

/* A provider down at the start: one line naming its URL; tokens work; the
 * sign-in is a 503 with the reason, and works once the provider is up. */
START_TEST(issuer_down_at_start) {
    NEED_PROVIDER();
    int op_port = ty_free_port(), port = ty_free_port();
    char issuer[64];
    snprintf(issuer, sizeof issuer, "http://127.0.0.1:%d", op_port);
    ty_proc s;
    char scratch[256];
    ty_mkdtemp(scratch, sizeof scratch, "sso_down");
    setenv("TRAINYARD_OIDC_RETRY_MS", "1000", 1);
    server_start(&s, port, issuer, scratch, 1);
    unsetenv("TRAINYARD_OIDC_RETRY_MS");
    char admin[160];
    ty_token(&s, "admin.token", admin, sizeof admin);
    ck_assert_int_eq(ty_http(s.url, admin, "GET", "/api/v1/jobs", NULL, NULL), 200);
    size_t n = 0;
    char *log = file_read_all(s.log, 1 << 20, &n);
    ck_assert_ptr_nonnull(log);
    char want[200];
    snprintf(want, sizeof want, "sso: single sign-on is not available: oidc: %s/.well-known/openid-configuration: "
             "Connection refused", issuer);
    const char *at = strstr(log, want);
    ck_assert_msg(at && !strstr(at + 1, "sso: single sign-on is not available"), "%s", log);
    free(log);
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(s.url, NULL, "GET", "/auth/login", NULL, &o), 503);
    ty_assert_error(o, "sso_unavailable", NULL);
    ck_assert_msg(strstr(ty_str(cJSON_GetObjectItem(o, "error"), "message"), "Connection refused"), "no reason");
    cJSON_Delete(o);
    /* the provider comes up: the next sign-in after the retry period finds it */
    provider p;
    provider_start(&p, op_port, port);
    ty_sleep_ms(1100);
    CURL *h = curl_easy_init();
    char url[300];
    snprintf(url, sizeof url, "%s/auth/login", s.url);
    answer a;
    req(h, "GET", url, NULL, NULL, &a);
    curl_easy_cleanup(h);
    ck_assert_msg(a.status == 302 && !strncmp(a.location, issuer, strlen(issuer)), "%ld %s", a.status,
                  a.body.data ? a.body.data : "");
    answer_free(&a);
    provider_stop(&p);
    ty_kill(&s, SIGTERM);
    ty_rmrf(s.dir);
    ty_rmrf(scratch);
}
END_TEST

int main(void) {
    char why[128];
    if (!oidc_have_provider(why, sizeof why)) {
        if (getenv("OIDC_TEST_REQUIRED") && !strcmp(getenv("OIDC_TEST_REQUIRED"), "1")) {
            fprintf(stderr, "check_sso: %s, and OIDC_TEST_REQUIRED=1\n", why);
            return 1;
        }
        printf("SKIP check_sso: %s\n", why);
        return 0;
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);
    Suite *s = suite_create("sso");
    TCase *tc = ty_tcase(s, "sso", setup, teardown, 120);
    tcase_add_test(tc, code_flow_session_csrf_logout);
    tcase_add_test(tc, forged_tokens_refused);
    tcase_add_test(tc, groups_replace_oidc_memberships);
    tcase_add_test(tc, device_flow_cli);
    tcase_add_test(tc, device_poll_paced);
    tcase_add_test(tc, issuer_down_at_start);
    return ty_run_suite(s);
}
