/* check_web.c - the dashboard's files served by the real server binary on a
 * loopback port: / and its assets with the right Content-Type, ETag and
 * If-None-Match -> 304, cache policy (vendor files immutable, ours
 * revalidated), the Content-Security-Policy of the page, no way out of the
 * file table (traversal, encoded dots, files outside web/), 404 JSON for
 * unknown API paths as before, the examples the submit page starts from,
 * and web/vendor/'s scripts and style sheets gzip'd for a client that takes
 * gzip (Content-Encoding, Vary, an ETag of their own), the file itself for
 * one that does not. */
#include "testlib.h"

#include <curl/curl.h>
#include <zlib.h>

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
    char ctype[128], etag[64], cache[128], csp[512], nosniff[32], cenc[32], vary[64];
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
    keep(g->cenc, sizeof g->cenc, line, "Content-Encoding");
    keep(g->vary, sizeof g->vary, line, "Vary");
    return size * n;
}

/* GET (or HEAD) a raw path, not normalized by curl, with up to two headers
 * (curl decodes nothing: a gzip'd body comes as it was sent). */
static void fetch2(const char *method, const char *path, const char *hdr, const char *hdr2, got *g) {
    memset(g, 0, sizeof *g);
    buf_init(&g->body, 4u << 20);
    CURL *c = curl_easy_init();
    ck_assert_ptr_nonnull(c);
    char url[1024];
    snprintf(url, sizeof url, "%s%s", srv.url, path);
    struct curl_slist *h = hdr ? curl_slist_append(NULL, hdr) : NULL;
    if (hdr2) h = curl_slist_append(h, hdr2);
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

static void fetch(const char *method, const char *path, const char *hdr, got *g) { fetch2(method, path, hdr, NULL, g); }

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

/* A gzip stream inflated, NUL-terminated; NULL when it is not one. */
static unsigned char *inflate_all(const char *gz, size_t n, size_t *out_len) {
    size_t cap = 8u << 20;
    unsigned char *out = malloc(cap);
    ck_assert_ptr_nonnull(out);
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    ck_assert_int_eq(inflateInit2(&zs, 16 + MAX_WBITS), Z_OK);
    zs.next_in = (unsigned char *)gz;
    zs.avail_in = (uInt)n;
    zs.next_out = out;
    zs.avail_out = (uInt)(cap - 1);
    int rc = inflate(&zs, Z_FINISH);
    *out_len = zs.total_out;
    inflateEnd(&zs);
    if (rc != Z_STREAM_END) {
        free(out);
        return NULL;
    }
    out[*out_len] = '\0';
    return out;
}

START_TEST(vendor_files_gzipped_for_who_takes_gzip) {
    const struct { const char *url, *file, *type; } files[] = {
        {"/vendor/xterm-5.5.0.min.js", "web/vendor/xterm-5.5.0.min.js", "text/javascript; charset=utf-8"},
        {"/vendor/xterm-5.5.0.css", "web/vendor/xterm-5.5.0.css", "text/css; charset=utf-8"},
        {"/vendor/uPlot-1.6.32.iife.min.js", "web/vendor/uPlot-1.6.32.iife.min.js", "text/javascript; charset=utf-8"},
    };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        size_t flen = 0;
        char *want = file_read_all(files[i].file, 16u << 20, &flen);
        ck_assert_msg(want != NULL, "read %s", files[i].file);
        got g;
        /* a browser: the gzip'd bytes, which inflate to the file */
        fetch("GET", files[i].url, "Accept-Encoding: gzip, deflate, br", &g);
        ck_assert_int_eq(g.status, 200);
        ck_assert_str_eq(g.cenc, "gzip");
        ck_assert_str_eq(g.vary, "Accept-Encoding");
        ck_assert_str_eq(g.ctype, files[i].type);
        ck_assert_str_eq(g.cache, "public, max-age=31536000, immutable");
        ck_assert_msg(g.body.len < flen / 2, "%s: %zu gzip'd bytes of %zu", files[i].url, g.body.len, flen);
        size_t n = 0;
        unsigned char *plain = inflate_all(g.body.data, g.body.len, &n);
        ck_assert_msg(plain && n == flen && memcmp(plain, want, flen) == 0, "%s inflates to the file", files[i].url);
        free(plain);
        char gz_etag[64], hdr[128];
        snprintf(gz_etag, sizeof gz_etag, "%s", g.etag);
        ck_assert_msg(strlen(gz_etag) > 4 && strcmp(gz_etag + strlen(gz_etag) - 4, "-gz\"") == 0, "etag %s", gz_etag);
        buf_release(&g.body);

        /* no Accept-Encoding, gzip refused (q=0, even with "*"), or another coding: the file itself */
        const char *plain_hdrs[] = {NULL, "Accept-Encoding: gzip;q=0, *", "Accept-Encoding: br", "Accept-Encoding: identity",
                                    "Accept-Encoding: GZIP;Q=0.000"};
        for (size_t k = 0; k < sizeof plain_hdrs / sizeof plain_hdrs[0]; k++) {
            fetch("GET", files[i].url, plain_hdrs[k], &g);
            ck_assert_int_eq(g.status, 200);
            ck_assert_msg(g.cenc[0] == '\0', "%s with %s: Content-Encoding %s", files[i].url, plain_hdrs[k] ? plain_hdrs[k] : "none", g.cenc);
            ck_assert_str_eq(g.vary, "Accept-Encoding");
            ck_assert_msg(g.body.len == flen && memcmp(g.body.data, want, flen) == 0, "%s as it is", files[i].url);
            ck_assert_str_ne(g.etag, gz_etag);
            buf_release(&g.body);
        }
        /* "*" and x-gzip take gzip; q=0.5 too */
        const char *gz_hdrs[] = {"Accept-Encoding: *", "Accept-Encoding: x-gzip", "Accept-Encoding: br;q=1.0, gzip;q=0.5"};
        for (size_t k = 0; k < sizeof gz_hdrs / sizeof gz_hdrs[0]; k++) {
            fetch("GET", files[i].url, gz_hdrs[k], &g);
            ck_assert_msg(strcmp(g.cenc, "gzip") == 0, "%s with %s: not gzip'd", files[i].url, gz_hdrs[k]);
            buf_release(&g.body);
        }
        /* each form revalidates with its own ETag */
        snprintf(hdr, sizeof hdr, "If-None-Match: %s", gz_etag);
        fetch2("GET", files[i].url, hdr, "Accept-Encoding: gzip", &g);
        ck_assert_int_eq(g.status, 304);
        ck_assert_str_eq(g.etag, gz_etag);
        ck_assert_int_eq(g.body.len, 0);
        buf_release(&g.body);
        fetch("GET", files[i].url, hdr, &g);
        ck_assert_int_eq(g.status, 200);
        ck_assert_int_eq(g.body.len, flen);
        buf_release(&g.body);
        free(want);
    }
    /* our own files are not compressed */
    got g;
    fetch("GET", "/app.js", "Accept-Encoding: gzip", &g);
    ck_assert_int_eq(g.status, 200);
    ck_assert_str_eq(g.cenc, "");
    ck_assert_str_eq(g.vary, "");
    buf_release(&g.body);
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
    tcase_add_test(tc, vendor_files_gzipped_for_who_takes_gzip);
    suite_add_tcase(s, tc);
    return ty_run_suite(s);
}
