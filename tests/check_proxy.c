/* check_proxy.c - the reverse proxy (server/proxy.c) and the routes it
 * needs (server/http.c: {rest*}, method "*"), through a daemon of the
 * test's own (http_start with its route table) in front of a real app on
 * loopback (tests/proxy_upstream.py, a Python process): GET/POST/HEAD the
 * same as direct, the caller's credentials stripped and the added header
 * there, a chunked body undone, a stream that flows before the app is
 * done, WebSocket echo (and after 15 s idle), 502 for an app down or slow
 * to answer, 100 requests and 20 WebSockets at once. Clients: libcurl and
 * raw sockets for the WebSocket frames. */
#include "testlib.h"
#include "../server/http.h"
#include "../server/proxy.h"

#include <curl/curl.h>
#include <poll.h>
#include <strings.h>
#include <sys/time.h>

static pid_t g_py = -1;
static int g_up;                      /* the app's port */
static char g_dir[256];
static http_daemon *g_h;
static int g_port;                    /* the daemon's */
static int g_down;                    /* a port nothing listens on */
static int g_activity;

static void on_activity(void *cls) {
    (void)cls;
    __atomic_fetch_add(&g_activity, 1, __ATOMIC_RELAXED);
}

static const char *const g_add[] = {"Authorization: token SECRET", NULL};
static const char *const g_drop[] = {"X-Drop-Me", NULL};

/* /proxy/...: the app, the full path forwarded */
static void h_proxy(struct server *srv, http_req *req, http_res *res) {
    (void)srv;
    proxy_target t = {.host = "127.0.0.1", .port = g_up, .prefix = "/proxy", .add = g_add, .drop = g_drop,
                      .activity = on_activity};
    proxy_forward(req, res, &t);
}

/* /slow/...: a head must come within a second */
static void h_slow(struct server *srv, http_req *req, http_res *res) {
    (void)srv;
    proxy_target t = {.host = "127.0.0.1", .port = g_up, .header_timeout_ms = 1000};
    proxy_forward(req, res, &t);
}

/* /down/...: nothing listens there */
static void h_down(struct server *srv, http_req *req, http_res *res) {
    (void)srv;
    proxy_target t = {.host = "127.0.0.1", .port = g_down};
    proxy_forward(req, res, &t);
}

/* /strip/REST: the caller chooses the target, /proxy/REST */
static void h_strip(struct server *srv, http_req *req, http_res *res) {
    (void)srv;
    char target[512];
    snprintf(target, sizeof target, "/proxy/%s", req->rest);
    proxy_target t = {.host = "127.0.0.1", .port = g_up, .target = target};
    proxy_forward(req, res, &t);
}

/* /rest/{a}/{rest*}: what the route captured */
static void h_rest(struct server *srv, http_req *req, http_res *res) {
    (void)srv;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "a", req->nparams > 0 ? req->params[0] : "");
    cJSON_AddStringToObject(o, "rest", req->rest ? req->rest : "(null)");
    cJSON_AddStringToObject(o, "method", req->method);
    http_json(res, 200, o);
}

static const route g_routes[] = {
    {"GET", "/rest/{a}/{rest*}", h_rest, ALLOW_NONE, 0, ROLE_NONE},
    {"*", "/proxy/{rest*}", h_proxy, ALLOW_NONE, 8u << 20, ROLE_NONE},
    {"*", "/slow/{rest*}", h_slow, ALLOW_NONE, 0, ROLE_NONE},
    {"*", "/down/{rest*}", h_down, ALLOW_NONE, 0, ROLE_NONE},
    {"GET", "/strip/{rest*}", h_strip, ALLOW_NONE, 0, ROLE_NONE},
    {NULL, NULL, NULL, 0, 0, ROLE_NONE},
};
static const route *const g_tables[] = {g_routes, NULL};

/* ---------------------------------------------------------------- fixtures */

static void app_start(void) {
    ty_mkdtemp(g_dir, sizeof g_dir, "proxy");
    char portfile[320];
    snprintf(portfile, sizeof portfile, "%s/port", g_dir);
    g_py = fork();
    if (g_py == 0) {
        execlp("python3", "python3", "tests/proxy_upstream.py", portfile, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 200 && !g_up; i++) {
        FILE *f = fopen(portfile, "r");
        if (f) {
            if (fscanf(f, "%d", &g_up) != 1) g_up = 0;
            fclose(f);
        }
        if (!g_up) ty_sleep_ms(50);
    }
    if (!g_up) {
        fprintf(stderr, "check_proxy: tests/proxy_upstream.py did not start\n");
        exit(1);
    }
}

static void app_stop(void) {
    if (g_py > 0) {
        kill(g_py, SIGTERM);
        waitpid(g_py, NULL, 0);
    }
    ty_rmrf(g_dir);
}

static void daemon_start(void) {
    char err[256];
    g_down = ty_free_port();
    g_activity = 0;
    g_h = http_start(NULL, NULL, 0, "127.0.0.1", 0, g_tables, NULL, NULL, &g_port, err, sizeof err);
    ck_assert_msg(g_h != NULL, "http_start: %s", err);
}

/* Stops the daemon, then waits for every relay thread to be done. */
static void daemon_stop(void) {
    http_stop(g_h);
    proxy_stats st = {0};
    for (int i = 0; i < 500; i++) {
        proxy_stats_get(&st);
        if (st.http == 0 && st.websocket == 0) break;
        ty_sleep_ms(10);
    }
    ck_assert_int_eq(st.http + st.websocket, 0);
}

/* ---------------------------------------------------------------- HTTP client */

typedef struct answer {
    long status;
    buf body, head;
    int64_t t0, first_ms;             /* ms from the start to the first body byte (-1: none) */
} answer;

static size_t on_body(char *p, size_t sz, size_t n, void *ud) {
    answer *a = ud;
    if (a->first_ms < 0 && sz * n > 0) a->first_ms = mono_ms() - a->t0;
    return buf_append(&a->body, p, sz * n) == 0 ? sz * n : 0;
}

static size_t on_head(char *p, size_t sz, size_t n, void *ud) {
    answer *a = ud;
    return buf_append(&a->head, p, sz * n) == 0 ? sz * n : 0;
}

static CURL *easy(int port, const char *method, const char *path, const char *body, struct curl_slist *hdrs,
                  answer *a) {
    memset(a, 0, sizeof *a);
    buf_init(&a->body, 8u << 20);
    buf_init(&a->head, 1u << 20);
    a->first_ms = -1;
    a->t0 = mono_ms();
    char url[1024];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    CURL *c = curl_easy_init();
    ck_assert_ptr_nonnull(c);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, a);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_head);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, a);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 30L);
    curl_easy_setopt(c, CURLOPT_PATH_AS_IS, 1L);
    if (strcmp(method, "HEAD") == 0) curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    else curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    if (body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    }
    if (hdrs) curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
    return c;
}

static long fetch(int port, const char *method, const char *path, const char *body, struct curl_slist *hdrs,
                  answer *a) {
    CURL *c = easy(port, method, path, body, hdrs, a);
    CURLcode rc = curl_easy_perform(c);
    ck_assert_msg(rc == CURLE_OK, "%s %s: %s", method, path, curl_easy_strerror(rc));
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &a->status);
    curl_easy_cleanup(c);
    return a->status;
}

static void answer_free(answer *a) {
    buf_release(&a->body);
    buf_release(&a->head);
}

/* A response header's value (first of the name), or NULL. */
static const char *head_value(answer *a, const char *name, char *out, size_t cap) {
    size_t n = strlen(name);
    for (const char *l = a->head.data; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        if (strncasecmp(l, name, n) == 0 && l[n] == ':') {
            const char *v = l + n + 1;
            while (*v == ' ') v++;
            size_t k = strcspn(v, "\r\n");
            snprintf(out, cap, "%.*s", (int)k, v);
            return out;
        }
    }
    return NULL;
}

static cJSON *json_of(answer *a) {
    cJSON *o = cJSON_ParseWithLength(a->body.data, a->body.len);
    ck_assert_msg(o != NULL, "not JSON: %.200s", a->body.data ? a->body.data : "");
    return o;
}

static const char *hdr_of(cJSON *echo, const char *name) {
    cJSON *v = cJSON_GetObjectItem(cJSON_GetObjectItem(echo, "headers"), name);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* ---------------------------------------------------------------- WebSocket client */

static void set_timeout(int fd, int s) {
    struct timeval tv = {s, 0};
    ck_assert_int_eq(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv), 0);
}

static void send_all(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        ck_assert_msg(w > 0, "send: %s", strerror(errno));
        c += w;
        n -= (size_t)w;
    }
}

static void recv_all(int fd, void *p, size_t n) {
    char *c = p;
    while (n) {
        ssize_t r = recv(fd, c, n, 0);
        ck_assert_msg(r > 0, "recv: %s", r == 0 ? "closed" : strerror(errno));
        c += r;
        n -= (size_t)r;
    }
}

/* A WebSocket through the proxy to the app's echo: the socket, after the 101. */
static int ws_open(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g_port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    set_timeout(fd, 20);
    static const char hs[] = "GET /proxy/ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                             "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                             "Sec-WebSocket-Version: 13\r\nAuthorization: Bearer ty_not_for_the_app\r\n\r\n";
    send_all(fd, hs, sizeof hs - 1);
    char head[4096];
    size_t n = 0;
    while (n < 4 || memcmp(head + n - 4, "\r\n\r\n", 4) != 0) {
        ck_assert_uint_lt(n, sizeof head - 1);
        recv_all(fd, head + n, 1);
        n++;
    }
    head[n] = '\0';
    ck_assert_msg(strncmp(head, "HTTP/1.1 101", 12) == 0, "handshake answered: %s", head);
    /* the app's accept key for the RFC 6455 example key */
    ck_assert_msg(strstr(head, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=") != NULL, "no accept key: %s", head);
    return fd;
}

static void ws_send(int fd, const char *msg) {
    size_t n = strlen(msg);
    ck_assert_uint_lt(n, 126);
    unsigned char f[4 + 2 + 126];
    static const unsigned char mask[4] = {0x11, 0x22, 0x33, 0x44};
    f[0] = 0x81;
    f[1] = (unsigned char)(0x80 | n);
    memcpy(f + 2, mask, 4);
    for (size_t i = 0; i < n; i++) f[6 + i] = (unsigned char)msg[i] ^ mask[i % 4];
    send_all(fd, f, 6 + n);
}

static void ws_expect(int fd, const char *msg) {
    unsigned char h[2];
    recv_all(fd, h, 2);
    ck_assert_int_eq(h[0], 0x81);
    size_t n = h[1] & 0x7f;
    ck_assert_uint_lt(n, 126);
    char got[128];
    recv_all(fd, got, n);
    got[n] = '\0';
    ck_assert_str_eq(got, msg);
}

/* ---------------------------------------------------------------- tests */

START_TEST(rest_routes_and_any_method) {
    answer a;
    ck_assert_int_eq(fetch(g_port, "GET", "/rest/x/a/b/c.txt", NULL, NULL, &a), 200);
    cJSON *o = json_of(&a);
    ck_assert_str_eq(cJSON_GetObjectItem(o, "a")->valuestring, "x");
    ck_assert_str_eq(cJSON_GetObjectItem(o, "rest")->valuestring, "a/b/c.txt");
    cJSON_Delete(o);
    answer_free(&a);
    ck_assert_int_eq(fetch(g_port, "GET", "/rest/x/", NULL, NULL, &a), 200);
    o = json_of(&a);
    ck_assert_str_eq(cJSON_GetObjectItem(o, "rest")->valuestring, "");
    cJSON_Delete(o);
    answer_free(&a);
    ck_assert_int_eq(fetch(g_port, "GET", "/rest/x", NULL, NULL, &a), 404);
    answer_free(&a);
    ck_assert_int_eq(fetch(g_port, "POST", "/rest/x/y", "", NULL, &a), 405);
    answer_free(&a);
    /* one "*" route serves every method */
    const char *methods[] = {"GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"};
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
        ck_assert_int_eq(fetch(g_port, methods[i], "/proxy/echo", NULL, NULL, &a), 200);
        o = json_of(&a);
        ck_assert_str_eq(cJSON_GetObjectItem(o, "method")->valuestring, methods[i]);
        cJSON_Delete(o);
        answer_free(&a);
    }
}
END_TEST

START_TEST(same_as_direct) {
    answer d, p;
    char v[64];
    /* a 1 MiB file, byte for byte, with its length and its ETag */
    ck_assert_int_eq(fetch(g_up, "GET", "/proxy/file", NULL, NULL, &d), 200);
    ck_assert_int_eq(fetch(g_port, "GET", "/proxy/file", NULL, NULL, &p), 200);
    ck_assert_uint_eq(d.body.len, 1u << 20);
    ck_assert_uint_eq(p.body.len, d.body.len);
    ck_assert_int_eq(memcmp(p.body.data, d.body.data, d.body.len), 0);
    ck_assert_str_eq(head_value(&p, "Content-Length", v, sizeof v), "1048576");
    ck_assert_str_eq(head_value(&p, "ETag", v, sizeof v), "\"f1\"");
    answer_free(&d);
    answer_free(&p);
    /* HEAD: the length, no body */
    ck_assert_int_eq(fetch(g_port, "HEAD", "/proxy/file", NULL, NULL, &p), 200);
    ck_assert_uint_eq(p.body.len, 0);
    ck_assert_str_eq(head_value(&p, "Content-Length", v, sizeof v), "1048576");
    answer_free(&p);
    /* POST: method, target (escapes kept) and body as direct */
    const char *path = "/proxy/echo?a=1&b=%20x&c=%2F";
    ck_assert_int_eq(fetch(g_up, "POST", path, "hello=1&x=\xc3\xa9", NULL, &d), 200);
    ck_assert_int_eq(fetch(g_port, "POST", path, "hello=1&x=\xc3\xa9", NULL, &p), 200);
    cJSON *od = json_of(&d), *op = json_of(&p);
    const char *keys[] = {"method", "path", "body"};
    for (int i = 0; i < 3; i++)
        ck_assert_str_eq(cJSON_GetObjectItem(op, keys[i])->valuestring, cJSON_GetObjectItem(od, keys[i])->valuestring);
    ck_assert_str_eq(cJSON_GetObjectItem(op, "path")->valuestring, path);
    cJSON_Delete(od);
    cJSON_Delete(op);
    answer_free(&d);
    answer_free(&p);
    /* the upstream's status as it is */
    ck_assert_int_eq(fetch(g_port, "GET", "/proxy/status/418", NULL, NULL, &p), 418);
    answer_free(&p);
    ck_assert_int_eq(fetch(g_port, "GET", "/proxy/nothing", NULL, NULL, &p), 404);
    ck_assert(strstr(p.body.data, "no such thing") != NULL);
    answer_free(&p);
    /* a chunked body, undone and passed on */
    ck_assert_int_eq(fetch(g_port, "GET", "/proxy/chunked", NULL, NULL, &p), 200);
    ck_assert_str_eq(p.body.data, "alpha-beta-gamma");
    answer_free(&p);
    /* a target the caller chose */
    ck_assert_int_eq(fetch(g_port, "GET", "/strip/echo", NULL, NULL, &p), 200);
    op = json_of(&p);
    ck_assert_str_eq(cJSON_GetObjectItem(op, "path")->valuestring, "/proxy/echo");
    cJSON_Delete(op);
    answer_free(&p);
}
END_TEST

START_TEST(credentials_stripped) {
    struct curl_slist *h = NULL;
    h = curl_slist_append(h, "Authorization: Bearer ty_caller_secret");
    h = curl_slist_append(h, "Cookie: trainyard_session=ty_s_secret; _xsrf=keepme; trainyard_proxy=g_secret; username-x=y");
    h = curl_slist_append(h, "Sec-WebSocket-Protocol: trainyard.exec.v1, trainyard.bearer.ty_ws_secret, chat");
    h = curl_slist_append(h, "X-CSRF-Token: csrf_secret");
    h = curl_slist_append(h, "Trainyard-Team: vision");
    h = curl_slist_append(h, "X-Drop-Me: 1");
    h = curl_slist_append(h, "X-Forwarded-For: 6.6.6.6");
    h = curl_slist_append(h, "Proxy-Authorization: Basic eA==");
    h = curl_slist_append(h, "X-Keep: yes");
    answer a;
    ck_assert_int_eq(fetch(g_port, "GET", "/proxy/echo", NULL, h, &a), 200);
    curl_slist_free_all(h);
    ck_assert_msg(strstr(a.body.data, "secret") == NULL, "a credential reached the app: %s", a.body.data);
    cJSON *o = json_of(&a);
    ck_assert_str_eq(hdr_of(o, "authorization"), "token SECRET");
    ck_assert_str_eq(hdr_of(o, "cookie"), "_xsrf=keepme; username-x=y");
    ck_assert_str_eq(hdr_of(o, "sec-websocket-protocol"), "trainyard.exec.v1, chat");
    ck_assert_ptr_null(hdr_of(o, "x-csrf-token"));
    ck_assert_ptr_null(hdr_of(o, "trainyard-team"));
    ck_assert_ptr_null(hdr_of(o, "x-drop-me"));
    ck_assert_ptr_null(hdr_of(o, "proxy-authorization"));
    ck_assert_str_eq(hdr_of(o, "x-keep"), "yes");
    ck_assert_str_eq(hdr_of(o, "x-forwarded-for"), "127.0.0.1");
    ck_assert_str_eq(hdr_of(o, "x-forwarded-proto"), "http");
    ck_assert_str_eq(hdr_of(o, "x-forwarded-prefix"), "/proxy");
    char want[64];
    snprintf(want, sizeof want, "127.0.0.1:%d", g_port);
    ck_assert_str_eq(hdr_of(o, "x-forwarded-host"), want);
    snprintf(want, sizeof want, "127.0.0.1:%d", g_up);
    ck_assert_str_eq(hdr_of(o, "host"), want);
    cJSON_Delete(o);
    /* the app's own header comes back; its hop-by-hop one does not */
    char v[64];
    ck_assert_str_eq(head_value(&a, "X-Upstream", v, sizeof v), "yes");
    ck_assert_ptr_null(head_value(&a, "Keep-Alive", v, sizeof v));
    answer_free(&a);
}
END_TEST

START_TEST(stream_flows_before_the_end) {
    answer a;
    ck_assert_int_eq(fetch(g_port, "GET", "/proxy/stream", NULL, NULL, &a), 200);
    int64_t total = mono_ms() - a.t0;
    /* the app takes 3 s; its first event came at once */
    ck_assert_msg(total >= 2900, "the stream took %lld ms", (long long)total);
    ck_assert_msg(a.first_ms >= 0 && a.first_ms < 1000, "first byte after %lld ms", (long long)a.first_ms);
    ck_assert(strstr(a.body.data, "data: tick 0\n\n") == a.body.data);
    ck_assert(strstr(a.body.data, "data: tick 6\n\n") != NULL);
    char v[64];
    ck_assert_str_eq(head_value(&a, "Content-Type", v, sizeof v), "text/event-stream");
    /* bytes flowed for 3 s: the activity hook was called, at most once a second */
    int n = __atomic_load_n(&g_activity, __ATOMIC_RELAXED);
    ck_assert_msg(n >= 2 && n <= 5, "activity called %d times", n);
    answer_free(&a);
}
END_TEST

START_TEST(websocket_echo_and_idle) {
    int fd = ws_open();
    ws_send(fd, "hello");
    ws_expect(fd, "hello");
    proxy_stats st;
    proxy_stats_get(&st);
    ck_assert_int_eq(st.websocket, 1);
    ty_sleep_ms(15000); /* idle: no timeout closes it */
    ws_send(fd, "again after 15 s");
    ws_expect(fd, "again after 15 s");
    close(fd);
    for (int i = 0; i < 300 && st.websocket; i++) {
        ty_sleep_ms(10);
        proxy_stats_get(&st);
    }
    ck_assert_int_eq(st.websocket, 0);
}
END_TEST

START_TEST(upstream_down_or_slow_is_502) {
    answer a;
    ck_assert_int_eq(fetch(g_port, "GET", "/down/x", NULL, NULL, &a), 502);
    cJSON *o = json_of(&a);
    ty_assert_error(o, "bad_gateway", NULL);
    const char *msg = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "error"), "message")->valuestring;
    ck_assert_msg(strstr(msg, "connection refused") != NULL, "message: %s", msg);
    cJSON_Delete(o);
    answer_free(&a);
    int64_t t0 = mono_ms();
    ck_assert_int_eq(fetch(g_port, "GET", "/slow/slowhead", NULL, NULL, &a), 502);
    ck_assert_int_lt(mono_ms() - t0, 2500);
    o = json_of(&a);
    ty_assert_error(o, "bad_gateway", NULL);
    msg = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "error"), "message")->valuestring;
    ck_assert_msg(strstr(msg, "no response head within 1000 ms") != NULL, "message: %s", msg);
    cJSON_Delete(o);
    answer_free(&a);
}
END_TEST

START_TEST(hundred_requests_at_once) {
    enum { N = 100 };
    CURLM *m = curl_multi_init();
    CURL *c[N];
    answer a[N];
    for (int i = 0; i < N; i++) {
        char path[64];
        snprintf(path, sizeof path, "/proxy/echo?i=%d", i);
        c[i] = easy(g_port, "GET", path, NULL, NULL, &a[i]);
        curl_multi_add_handle(m, c[i]);
    }
    int running = 1;
    int64_t end = mono_ms() + 60000;
    while (running && mono_ms() < end) {
        ck_assert_int_eq(curl_multi_perform(m, &running), CURLM_OK);
        if (running) ck_assert_int_eq(curl_multi_poll(m, NULL, 0, 100, NULL), CURLM_OK);
    }
    ck_assert_int_eq(running, 0);
    for (int i = 0; i < N; i++) {
        long st = 0;
        curl_easy_getinfo(c[i], CURLINFO_RESPONSE_CODE, &st);
        ck_assert_msg(st == 200, "request %d answered %ld", i, st);
        cJSON *o = json_of(&a[i]);
        char want[64];
        snprintf(want, sizeof want, "/proxy/echo?i=%d", i);
        ck_assert_str_eq(cJSON_GetObjectItem(o, "path")->valuestring, want);
        cJSON_Delete(o);
        curl_multi_remove_handle(m, c[i]);
        curl_easy_cleanup(c[i]);
        answer_free(&a[i]);
    }
    curl_multi_cleanup(m);
}
END_TEST

START_TEST(twenty_websockets_at_once) {
    enum { N = 20 };
    int fd[N];
    for (int i = 0; i < N; i++) fd[i] = ws_open();
    proxy_stats st;
    proxy_stats_get(&st);
    ck_assert_int_eq(st.websocket, N);
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < N; i++) {
            char msg[64];
            snprintf(msg, sizeof msg, "socket %d round %d", i, round);
            ws_send(fd[i], msg);
        }
        for (int i = 0; i < N; i++) {
            char msg[64];
            snprintf(msg, sizeof msg, "socket %d round %d", i, round);
            ws_expect(fd[i], msg);
        }
    }
    for (int i = 0; i < N; i++) close(fd[i]);
}
END_TEST

/* http_stop while a WebSocket and an event stream are relayed: it returns
 * (libmicrohttpd is not stopped under an upgraded or suspended connection,
 * which would abort), both clients see their connection end, and every
 * relay thread is done. */
START_TEST(stop_with_relays_open) {
    int ws = ws_open();
    ws_send(ws, "before the stop");
    ws_expect(ws, "before the stop");
    int st = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g_port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(connect(st, (struct sockaddr *)&sa, sizeof sa), 0);
    set_timeout(st, 20);
    static const char get[] = "GET /proxy/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    send_all(st, get, sizeof get - 1);
    char got[4096];
    size_t n = 0;
    while (n < sizeof got - 1) { /* until the first event is in */
        ssize_t r = recv(st, got + n, sizeof got - 1 - n, 0);
        ck_assert_int_gt(r, 0);
        n += (size_t)r;
        got[n] = '\0';
        if (strstr(got, "tick 0")) break;
    }
    proxy_stats s;
    proxy_stats_get(&s);
    ck_assert_int_eq(s.websocket, 1);
    ck_assert_int_eq(s.http, 1);
    int64_t t0 = mono_ms();
    http_stop(g_h);
    g_h = NULL;
    ck_assert_int_lt(mono_ms() - t0, 5000);
    /* both see the end (a close, or a reset) */
    char b[256];
    ssize_t r;
    while ((r = recv(ws, b, sizeof b, 0)) > 0) {
    }
    ck_assert_int_le(r, 0);
    while ((r = recv(st, b, sizeof b, 0)) > 0) {
    }
    ck_assert_int_le(r, 0);
    ck_assert_msg(mono_ms() - t0 < 5000, "the clients saw the end after %lld ms (a receive timed out?)",
                  (long long)(mono_ms() - t0));
    close(ws);
    close(st);
}
END_TEST

int main(void) {
    curl_global_init(CURL_GLOBAL_ALL);
    signal(SIGPIPE, SIG_IGN);
    Suite *s = suite_create("proxy");
    TCase *tc = ty_tcase(s, "proxy", daemon_start, daemon_stop, 90);
    tcase_add_unchecked_fixture(tc, app_start, app_stop);
    tcase_add_test(tc, rest_routes_and_any_method);
    tcase_add_test(tc, same_as_direct);
    tcase_add_test(tc, credentials_stripped);
    tcase_add_test(tc, stream_flows_before_the_end);
    tcase_add_test(tc, websocket_echo_and_idle);
    tcase_add_test(tc, upstream_down_or_slow_is_502);
    tcase_add_test(tc, hundred_requests_at_once);
    tcase_add_test(tc, twenty_websockets_at_once);
    tcase_add_test(tc, stop_with_relays_open);
    int rc = ty_run_suite(s);
    curl_global_cleanup();
    return rc;
}
