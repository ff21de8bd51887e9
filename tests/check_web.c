/* check_web.c - the dashboard's files served by the real server binary on a
 * loopback port: / and its assets with the right Content-Type, ETag and
 * If-None-Match -> 304, cache policy (vendor files immutable, ours
 * revalidated), the Content-Security-Policy of the page, no way out of the
 * file table (traversal, encoded dots, files outside web/), 404 JSON for
 * unknown API paths as before, and the examples the submit page starts from. */
#include "testlib.h"

#include <curl/curl.h>

static ty_proc srv;
static char team_tok[128];

static void start(void) {
    memset(&srv, 0, sizeof srv);
    ty_mkdtemp(srv.dir, sizeof srv.dir, "web");
    ty_server_start(&srv);
    ty_token(&srv, "token", team_tok, sizeof team_tok);
}

static void stop(void) {
    ty_kill(&srv, SIGTERM);
    ty_rmrf(srv.dir);
}

typedef struct got {
    long status;
    buf body;
    char ctype[128], etag[64], cache[128], csp[512], nosniff[32];
} got;

static size_t on_body(char *p, size_t size, size_t n, void *ud) {
    got *g = ud;
    return buf_append(&g->body, p, size * n) < 0 ? 0 : size * n;
}

static void keep(char *out, size_t cap, const char *line, const char *name) {
    size_t n = strlen(name);
    if (strncasecmp(line, name, n) != 0 || line[n] != ':') return;
    const char *v = line + n + 1;
    while (*v == ' ') v++;
    snprintf(out, cap, "%s", v);
    size_t l = strlen(out);
    while (l && (out[l - 1] == '\r' || out[l - 1] == '\n')) out[--l] = '\0';
}

static size_t on_header(char *p, size_t size, size_t n, void *ud) {
    got *g = ud;
    char line[1024];
    size_t len = size * n < sizeof line - 1 ? size * n : sizeof line - 1;
    memcpy(line, p, len);
    line[len] = '\0';
    keep(g->ctype, sizeof g->ctype, line, "Content-Type");
    keep(g->etag, sizeof g->etag, line, "ETag");
    keep(g->cache, sizeof g->cache, line, "Cache-Control");
    keep(g->csp, sizeof g->csp, line, "Content-Security-Policy");
    keep(g->nosniff, sizeof g->nosniff, line, "X-Content-Type-Options");
    return size * n;
}

/* GET (or HEAD) a raw path, not normalized by curl, with an optional header. */
static void fetch(const char *method, const char *path, const char *hdr, got *g) {
    memset(g, 0, sizeof *g);
    buf_init(&g->body, 4u << 20);
    CURL *c = curl_easy_init();
    ck_assert_ptr_nonnull(c);
    char url[1024];
    snprintf(url, sizeof url, "%s%s", srv.url, path);
    struct curl_slist *h = hdr ? curl_slist_append(NULL, hdr) : NULL;
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_PATH_AS_IS, 1L);
    if (strcmp(method, "HEAD") == 0) curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, g);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, g);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 10L);
    ck_assert_int_eq(curl_easy_perform(c), CURLE_OK);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &g->status);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
}

START_TEST(index_page_and_assets) {
    got g;
    fetch("GET", "/", NULL, &g);
    ck_assert_int_eq(g.status, 200);
    ck_assert_str_eq(g.ctype, "text/html; charset=utf-8");
    ck_assert_msg(strstr(g.body.data, "<title>trainyard</title>") != NULL, "not the dashboard");
    ck_assert_msg(strstr(g.body.data, "app.js") != NULL, "the page loads app.js");
    ck_assert_str_eq(g.cache, "no-cache");
    ck_assert_int_eq(g.etag[0], '"');
    ck_assert_str_eq(g.nosniff, "nosniff");
    ck_assert_msg(strstr(g.csp, "script-src 'self'") && strstr(g.csp, "frame-ancestors 'none'"), "CSP: %s", g.csp);
    buf_release(&g.body);

    fetch("GET", "/index.html", NULL, &g);
    ck_assert_int_eq(g.status, 200);
    buf_release(&g.body);

    const struct { const char *path, *type; } files[] = {
        {"/app.js", "text/javascript; charset=utf-8"},
        {"/app.css", "text/css; charset=utf-8"},
        {"/favicon.svg", "image/svg+xml"},
        {"/vendor/uPlot-1.6.32.iife.min.js", "text/javascript; charset=utf-8"},
        {"/vendor/uPlot-1.6.32.min.css", "text/css; charset=utf-8"},
        {"/vendor/uPlot-LICENSE.txt", "text/plain; charset=utf-8"},
    };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        fetch("GET", files[i].path, NULL, &g);
        ck_assert_msg(g.status == 200, "%s: %ld", files[i].path, g.status);
        ck_assert_str_eq(g.ctype, files[i].type);
        ck_assert_msg(g.body.len > 0, "%s is empty", files[i].path);
        ck_assert_msg(g.csp[0] == '\0', "only the page carries the CSP");
        if (strncmp(files[i].path, "/vendor/", 8) == 0) ck_assert_str_eq(g.cache, "public, max-age=31536000, immutable");
        else ck_assert_str_eq(g.cache, "no-cache");
        buf_release(&g.body);
    }
}
END_TEST

START_TEST(etag_revalidation_and_head) {
    got g;
    fetch("GET", "/app.js", NULL, &g);
    ck_assert_int_eq(g.status, 200);
    char etag[64], hdr[128];
    snprintf(etag, sizeof etag, "%s", g.etag);
    size_t len = g.body.len;
    buf_release(&g.body);
    snprintf(hdr, sizeof hdr, "If-None-Match: %s", etag);
    fetch("GET", "/app.js", hdr, &g);
    ck_assert_int_eq(g.status, 304);
    ck_assert_int_eq(g.body.len, 0);
    ck_assert_str_eq(g.etag, etag);
    buf_release(&g.body);
    fetch("GET", "/app.js", "If-None-Match: \"0000\"", &g);
    ck_assert_int_eq(g.status, 200);
    ck_assert_int_eq(g.body.len, len);
    buf_release(&g.body);
    fetch("HEAD", "/app.js", NULL, &g);
    ck_assert_int_eq(g.status, 200);
    ck_assert_int_eq(g.body.len, 0);
    ck_assert_str_eq(g.etag, etag);
    buf_release(&g.body);
}
END_TEST

START_TEST(no_way_out_of_the_table) {
    const char *paths[] = {
        "/../Makefile", "/vendor/../../README.md", "/%2e%2e/%2e%2e/etc/passwd", "/..%2fMakefile",
        "/web/index.html", "/api/openapi.json", "/openapi.json", "/examples/fashion_mnist_quick.json",
        "/vendor/", "/vendor", "//etc/passwd", "/app.js/", "/.git/config", "/APP.JS",
    };
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        got g;
        fetch("GET", paths[i], NULL, &g);
        ck_assert_msg(g.status == 404, "%s answered %ld", paths[i], g.status);
        ck_assert_msg(strncmp(g.ctype, "application/json", 16) == 0, "%s: %s", paths[i], g.ctype);
        ck_assert_msg(strstr(g.body.data, "\"not_found\"") != NULL, "%s: %s", paths[i], g.body.data);
        buf_release(&g.body);
    }
    /* a file's path under /api/ is never a file */
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", "/api/v1/index.html", NULL, &o), 404);
    ty_assert_error(o, "not_found", NULL);
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", "/api/v1/nothing", NULL, &o), 404);
    ty_assert_error(o, "not_found", NULL);
    cJSON_Delete(o);
    /* the files are read-only */
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", "/index.html", "{}", &o), 404);
    cJSON_Delete(o);
}
END_TEST

START_TEST(examples_for_the_submit_page) {
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, NULL, "GET", "/api/v1/examples", NULL, &o), 401);
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", "/api/v1/examples", NULL, &o), 200);
    cJSON *arr = cJSON_GetObjectItem(o, "examples");
    int found = 0;
    cJSON *e;
    cJSON_ArrayForEach(e, arr) {
        if (strcmp(cJSON_GetObjectItem(e, "file")->valuestring, "fashion_mnist_quick.json") != 0) continue;
        found = 1;
        cJSON *spec = cJSON_GetObjectItem(e, "spec");
        ck_assert_str_eq(cJSON_GetObjectItem(spec, "name")->valuestring, "fashion-quick");
        /* the example as served is the file in examples/, and it is accepted as it is */
        char *s = cJSON_PrintUnformatted(spec);
        cJSON *job = NULL;
        ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", "/api/v1/jobs", s, &job), 201);
        free(s);
        cJSON_Delete(job);
    }
    ck_assert_msg(found, "fashion_mnist_quick.json is not among the examples");
    cJSON_Delete(o);
    /* the job list carries strategy and progress for the dashboard */
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", "/api/v1/jobs", NULL, &o), 200);
    cJSON *j = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "jobs"), 0);
    ck_assert_str_eq(cJSON_GetObjectItem(j, "strategy")->valuestring, "default");
    ck_assert(cJSON_IsNull(cJSON_GetObjectItem(j, "progress")));
    cJSON_Delete(o);
}
END_TEST

int main(void) {
    Suite *s = suite_create("web");
    TCase *tc = tcase_create("static");
    tcase_add_checked_fixture(tc, start, stop);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, index_page_and_assets);
    tcase_add_test(tc, etag_revalidation_and_head);
    tcase_add_test(tc, no_way_out_of_the_table);
    tcase_add_test(tc, examples_for_the_submit_page);
    suite_add_tcase(s, tc);
    return ty_run_suite(s);
}
