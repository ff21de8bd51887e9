/* check_openapi.c - api/openapi.json against the server's route tables:
 * every route (method and path pattern) is in the document and every
 * operation of the document is a route, with the same token kinds
 * (x-trainyard-tokens vs the route's ALLOW_* mask); the running server
 * serves the same document at /api/v1/openapi.json without a token.
 * (tests/web/openapi.test.mjs validates it against the OpenAPI 3 schema.) */
#include "testlib.h"

#include <ctype.h>

#include "../api/routes.h"

static cJSON *load_doc(void) {
    size_t len = 0;
    char *s = file_read_all("api/openapi.json", 4u << 20, &len);
    ck_assert_msg(s != NULL, "cannot read api/openapi.json (run from the repository root)");
    cJSON *doc = cJSON_ParseWithLength(s, len);
    free(s);
    ck_assert_msg(doc != NULL, "api/openapi.json is not JSON");
    return doc;
}

static void lower(const char *in, char *out, size_t cap) {
    size_t i = 0;
    for (; in[i] && i + 1 < cap; i++) out[i] = (char)tolower((unsigned char)in[i]);
    out[i] = '\0';
}

/* The ALLOW_* mask named by an operation's x-trainyard-tokens. */
static unsigned doc_mask(const cJSON *op) {
    const cJSON *t = cJSON_GetObjectItem(op, "x-trainyard-tokens");
    ck_assert_msg(cJSON_IsArray(t), "an operation without x-trainyard-tokens");
    unsigned m = 0;
    const cJSON *k;
    cJSON_ArrayForEach(k, t) {
        if (strcmp(k->valuestring, "admin") == 0) m |= ALLOW_ADMIN;
        else if (strcmp(k->valuestring, "team") == 0) m |= ALLOW_TEAM;
        else if (strcmp(k->valuestring, "node") == 0) m |= ALLOW_NODE;
        else if (strcmp(k->valuestring, "task") == 0) m |= ALLOW_TASK;
        else if (strcmp(k->valuestring, "join") == 0) m |= ALLOW_JOIN;
        else if (strcmp(k->valuestring, "person") == 0) m |= ALLOW_PERSON;
        else ck_abort_msg("unknown token kind %s", k->valuestring);
    }
    return m;
}

/* A route of any method ("*") is documented as each of these. */
static const char *const ANY[] = {"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"};
#define N_ANY ((int)(sizeof ANY / sizeof ANY[0]))

/* The document's path of a route's pattern: a rest segment "{x*}" is "{x}". */
static void doc_pattern(const char *pattern, char *out, size_t cap) {
    size_t o = 0;
    for (const char *p = pattern; *p && o + 1 < cap; p++)
        if (!(*p == '*' && p[1] == '}')) out[o++] = *p;
    out[o] = '\0';
}

START_TEST(every_route_is_documented) {
    cJSON *doc = load_doc();
    ck_assert_str_eq(cJSON_GetObjectItem(doc, "openapi")->valuestring, "3.0.3");
    cJSON *paths = cJSON_GetObjectItem(doc, "paths");
    int n = 0;
    for (const route *const *t = api_route_tables; *t; t++)
        for (const route *r = *t; r->pattern; r++, n++)
          for (int am = 0; am < (strcmp(r->method, "*") == 0 ? N_ANY : 1); am++) {
            char m[16], doc_path[256];
            lower(strcmp(r->method, "*") == 0 ? ANY[am] : r->method, m, sizeof m);
            doc_pattern(r->pattern, doc_path, sizeof doc_path);
            cJSON *p = cJSON_GetObjectItem(paths, doc_path);
            ck_assert_msg(p != NULL, "route %s %s is not in api/openapi.json", r->method, r->pattern);
            cJSON *op = cJSON_GetObjectItem(p, m);
            ck_assert_msg(op != NULL, "route %s %s is not in api/openapi.json (as %s)", r->method, r->pattern, m);
            ck_assert_msg(doc_mask(op) == (r->allow & ~(ALLOW_ORIGIN | ALLOW_STANDBY)),
                          "%s %s: the document's token kinds differ from the route's", r->method, r->pattern);
            /* a route a standby serves too: said so (every other one is its 503 standby) */
            const cJSON *sb = cJSON_GetObjectItem(op, "x-trainyard-standby");
            ck_assert_msg(((r->allow & ALLOW_STANDBY) != 0) == cJSON_IsTrue(sb),
                          "%s %s: x-trainyard-standby true is stated exactly for the routes a standby serves",
                          r->method, r->pattern);
            /* a cookie's change checked by its Origin rather than X-CSRF-Token: said so */
            const cJSON *csrf = cJSON_GetObjectItem(op, "x-trainyard-csrf");
            ck_assert_msg(((r->allow & ALLOW_ORIGIN) != 0) == (cJSON_IsString(csrf) && strcmp(csrf->valuestring, "origin") == 0),
                          "%s %s: x-trainyard-csrf \"origin\" is stated exactly for the routes that check the Origin",
                          r->method, r->pattern);
            /* the role a team principal needs: stated for every route a team may call, as the server checks it
             * (a route that takes a person as such, with no role of its own, checks roles itself: none) */
            const cJSON *role = cJSON_GetObjectItem(op, "x-trainyard-role");
            int stated = (r->allow & ALLOW_TEAM) && !((r->allow & ALLOW_PERSON) && r->role == ROLE_NONE);
            if (stated) {
                ck_assert_msg(cJSON_IsString(role), "%s %s: no x-trainyard-role", r->method, r->pattern);
                /* a route of any method asks what each method would */
                team_role want = http_route_role(r, strcmp(r->method, "*") == 0 ? ANY[am] : r->method);
                ck_assert_msg(strcmp(role->valuestring, role_name(want)) == 0,
                              "%s %s: x-trainyard-role %s, the server asks %s", m, r->pattern, role->valuestring,
                              role_name(want));
            } else {
                ck_assert_msg(role == NULL, "%s %s: x-trainyard-role on a route no team role opens", r->method,
                              r->pattern);
            }
            /* every {param} of the path is declared */
            for (const char *b = strchr(doc_path, '{'); b; b = strchr(b + 1, '{')) {
                const char *e = strchr(b, '}');
                char name[64];
                snprintf(name, sizeof name, "%.*s", (int)(e - b - 1), b + 1);
                int found = 0;
                cJSON *prm;
                cJSON_ArrayForEach(prm, cJSON_GetObjectItem(op, "parameters"))
                    if (strcmp(cJSON_GetObjectItem(prm, "name")->valuestring, name) == 0 &&
                        strcmp(cJSON_GetObjectItem(prm, "in")->valuestring, "path") == 0) found = 1;
                ck_assert_msg(found, "%s %s: path parameter %s is not declared", r->method, r->pattern, name);
            }
        }
    ck_assert_int_gt(n, 20);
    cJSON_Delete(doc);
}
END_TEST

START_TEST(every_documented_operation_is_a_route) {
    cJSON *doc = load_doc();
    static const char *const methods[] = {"get", "put", "post", "delete", "options", "head", "patch", "trace"};
    int ops = 0;
    cJSON *p;
    cJSON_ArrayForEach(p, cJSON_GetObjectItem(doc, "paths")) {
        cJSON *op;
        cJSON_ArrayForEach(op, p) {
            int is_method = 0;
            for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++)
                if (strcmp(op->string, methods[i]) == 0) is_method = 1;
            if (!is_method) continue;
            ops++;
            int found = 0;
            for (const route *const *t = api_route_tables; *t && !found; t++)
                for (const route *r = *t; r->pattern && !found; r++) {
                    char m[16], doc_path[256];
                    lower(r->method, m, sizeof m);
                    doc_pattern(r->pattern, doc_path, sizeof doc_path);
                    found = strcmp(doc_path, p->string) == 0 &&
                            (strcmp(m, op->string) == 0 || strcmp(r->method, "*") == 0);
                }
            ck_assert_msg(found, "api/openapi.json documents %s %s, which the server does not answer", op->string,
                          p->string);
            ck_assert_msg(cJSON_GetObjectItem(op, "responses") != NULL, "%s %s has no responses", op->string, p->string);
        }
    }
    ck_assert_int_gt(ops, 20);
    cJSON_Delete(doc);
}
END_TEST

START_TEST(served_as_built) {
    ty_proc srv;
    memset(&srv, 0, sizeof srv);
    ty_mkdtemp(srv.dir, sizeof srv.dir, "openapi");
    ty_server_start(&srv);
    cJSON *served = NULL;
    ck_assert_int_eq(ty_http(srv.url, NULL, "GET", "/api/v1/openapi.json", NULL, &served), 200);
    cJSON *doc = load_doc();
    ck_assert_msg(cJSON_Compare(doc, served, 1), "the server serves a different document than api/openapi.json");
    cJSON_Delete(doc);
    cJSON_Delete(served);
    ty_kill(&srv, SIGTERM);
    ty_rmrf(srv.dir);
}
END_TEST

int main(void) {
    Suite *s = suite_create("openapi");
    TCase *tc = tcase_create("document");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, every_route_is_documented);
    tcase_add_test(tc, every_documented_operation_is_a_route);
    tcase_add_test(tc, served_as_built);
    suite_add_tcase(s, tc);
    return ty_run_suite(s);
}
