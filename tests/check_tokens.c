/* check_tokens.c - token hygiene on the real server over loopback: failed
 * authentications are limited per client address (429 with Retry-After past
 * `--auth-fail-limit`, while another address is not slowed and a token that
 * authenticated lately still passes); team tokens made with an expiry stop
 * working at it; a rotation gives a new token and the old one a grace
 * period, then 401 "token expired", which the CLI says as such; bad values
 * are refused naming the field. */
#include "testlib.h"

#include <curl/curl.h>

static ty_proc srv;
static char admin[128], team[128];

static void setup(void) {
    memset(&srv, 0, sizeof srv);
    ty_mkdtemp(srv.dir, sizeof srv.dir, "tokens");
    const char *extra[] = {"--auth-fail-limit", "20", NULL};
    ty_server_start_args(&srv, "server", extra);
    ty_token(&srv, "admin.token", admin, sizeof admin);
    ty_token(&srv, "token", team, sizeof team);
}

static void teardown(void) {
    ty_kill(&srv, SIGTERM);
    ty_rmrf(srv.dir);
}

typedef struct hdrs {
    char retry_after[32];
} hdrs;

static size_t on_header(char *p, size_t size, size_t n, void *ud) {
    hdrs *h = ud;
    size_t len = size * n;
    if (len > 13 && strncasecmp(p, "Retry-After:", 12) == 0) {
        size_t k = len - 12 < sizeof h->retry_after - 1 ? len - 12 : sizeof h->retry_after - 1;
        memcpy(h->retry_after, p + 12, k);
        h->retry_after[k] = '\0';
    }
    return len;
}

static size_t sink(char *p, size_t size, size_t n, void *ud) {
    (void)p;
    (void)ud;
    return size * n;
}

/* GET /api/v1/jobs with token from the source address `from`: the status
 * (Retry-After into h when given). */
static long get_from(const char *from, const char *token, hdrs *h) {
    CURL *c = curl_easy_init();
    ck_assert_ptr_nonnull(c);
    char url[300], auth[300];
    snprintf(url, sizeof url, "%s/api/v1/jobs", srv.url);
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
    struct curl_slist *hl = curl_slist_append(NULL, auth);
    hdrs scratch;
    memset(&scratch, 0, sizeof scratch);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(c, CURLOPT_INTERFACE, from);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, h ? h : &scratch);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, sink);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 10000L);
    CURLcode rc = curl_easy_perform(c);
    ck_assert_msg(rc == CURLE_OK, "GET from %s: %s", from, curl_easy_strerror(rc));
    long st = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &st);
    curl_slist_free_all(hl);
    curl_easy_cleanup(c);
    return st;
}

START_TEST(failed_authentications_are_limited_per_address) {
    /* the team's token authenticates from 127.0.0.1 before the storm */
    ck_assert_int_eq(get_from("127.0.0.1", team, NULL), 200);
    int n401 = 0, n429 = 0;
    hdrs h;
    memset(&h, 0, sizeof h);
    for (int i = 0; i < 30; i++) {
        char wrong[64];
        snprintf(wrong, sizeof wrong, "ty_wrong_%d", i);
        long st = get_from("127.0.0.1", wrong, &h);
        ck_assert_msg(st == 401 || st == 429, "a wrong token got %ld", st);
        if (st == 401) ck_assert_int_eq(n429, 0); /* 429 once past the limit, then only 429 */
        n401 += st == 401;
        n429 += st == 429;
    }
    ck_assert_int_eq(n401, 20);
    ck_assert_int_eq(n429, 10);
    long retry = strtol(h.retry_after, NULL, 10);
    ck_assert_msg(retry >= 1 && retry <= 60, "Retry-After '%s'", h.retry_after);
    /* a valid token from the same address that has not authenticated lately
     * is held back too (a guesser learns nothing) ... */
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, admin, "POST", "/api/v1/teams", "{\"name\": \"other\"}", &o), 429);
    cJSON_Delete(o);
    /* ... but the team's token, which did, still works from there */
    ck_assert_int_eq(get_from("127.0.0.1", team, NULL), 200);
    /* another address is not slowed: its wrong tokens get 401, its good ones 200 */
    ck_assert_int_eq(get_from("127.0.0.2", "ty_wrong_elsewhere", NULL), 401);
    ck_assert_int_eq(get_from("127.0.0.2", admin, NULL), 200);
    ck_assert_int_eq(get_from("127.0.0.2", team, NULL), 200);
}
END_TEST

/* POST path with token and body: the status, the JSON into *out. */
static long post(const char *token, const char *path, const char *body, cJSON **out) {
    return ty_http(srv.url, token, "POST", path, body, out);
}

START_TEST(expiring_and_rotated_tokens) {
    cJSON *o = NULL;
    /* a team made with a token that expires in a minute */
    ck_assert_int_eq(post(admin, "/api/v1/teams", "{\"name\": \"short\", \"expires_in\": 60}", &o), 201);
    const char *exp = ty_str(o, "expires_at");
    ck_assert_msg(exp && strlen(exp) >= 20, "no expires_at: %s", exp ? exp : "null");
    char t1[160];
    snprintf(t1, sizeof t1, "%s", ty_str(o, "token"));
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, t1, "GET", "/api/v1/jobs", NULL, NULL), 200);

    /* rotation by the team itself: a new token; the old one works for the grace, then not */
    ck_assert_int_eq(post(t1, "/api/v1/teams/short/tokens", "{\"rotate\": true, \"grace_s\": 2}", &o), 201);
    char t2[160];
    snprintf(t2, sizeof t2, "%s", ty_str(o, "token"));
    ck_assert_int_eq((int)ty_num(o, "rotated"), 1);
    ck_assert(cJSON_IsNull(cJSON_GetObjectItem(o, "expires_at")));
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, t1, "GET", "/api/v1/jobs", NULL, NULL), 200);
    ck_assert_int_eq(ty_http(srv.url, t2, "GET", "/api/v1/jobs", NULL, NULL), 200);
    ty_sleep_ms(2300);
    ck_assert_int_eq(ty_http(srv.url, t1, "GET", "/api/v1/jobs", NULL, &o), 401);
    ty_assert_error(o, "token_expired", NULL);
    ck_assert_msg(strstr(ty_str(cJSON_GetObjectItem(o, "error"), "message"), "token expired"), "message");
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, t2, "GET", "/api/v1/jobs", NULL, NULL), 200);

    /* the CLI says so, not a bare 401 */
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "TRAINYARD_URL='%s' TRAINYARD_TOKEN='%s' '%s' jobs 2>&1", srv.url, t1, ty_bin());
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    char out[2048] = "";
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 1, "the CLI exited %d: %s", st, out);
    ck_assert_msg(strstr(out, "token expired") != NULL, "the CLI said: %s", out);

    /* a team cannot make tokens for another; the admin can, and may rotate with no grace */
    ck_assert_int_eq(post(t2, "/api/v1/teams/default/tokens", "{}", &o), 404);
    cJSON_Delete(o);
    ck_assert_int_eq(post(admin, "/api/v1/teams/short/tokens", "{\"rotate\": true, \"grace_s\": 0}", &o), 201);
    char t3[160];
    snprintf(t3, sizeof t3, "%s", ty_str(o, "token"));
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, t2, "GET", "/api/v1/jobs", NULL, NULL), 401);
    ck_assert_int_eq(ty_http(srv.url, t3, "GET", "/api/v1/jobs", NULL, NULL), 200);

    /* bad values: 422 naming the field, nothing made */
    struct {
        const char *body, *code, *field;
    } bad[] = {
        {"{\"expires_in\": 10}", "invalid_value", "expires_in"},
        {"{\"expires_in\": \"1d\"}", "invalid_type", "expires_in"},
        {"{\"expires_in\": 1.5e9}", "invalid_value", "expires_in"},
        {"{\"rotate\": \"yes\"}", "invalid_type", "rotate"},
        {"{\"grace_s\": -1}", "invalid_value", "grace_s"},
        {"{\"scope\": \"all\"}", "unknown_field", "scope"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(post(admin, "/api/v1/teams/short/tokens", bad[i].body, &o), 422);
        ty_assert_error(o, bad[i].code, bad[i].field);
        cJSON_Delete(o);
    }
    ck_assert_int_eq(ty_http(srv.url, t3, "GET", "/api/v1/jobs", NULL, NULL), 200);
}
END_TEST

int main(void) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    Suite *s = suite_create("tokens");
    TCase *tc = ty_tcase(s, "tokens", setup, teardown, 60);
    tcase_add_test(tc, failed_authentications_are_limited_per_address);
    tcase_add_test(tc, expiring_and_rotated_tokens);
    return ty_run_suite(s);
}
