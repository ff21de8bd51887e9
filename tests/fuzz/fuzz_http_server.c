/* fuzz_http_server.c - libFuzzer target for the whole request path: a real
 * in-process server (server_open + http_start on a loopback port, SQLite in
 * a temporary directory under /dev/shm) answers each input sent over a
 * fresh TCP connection. Covers libmicrohttpd's parsing as we configure it,
 * query strings and percent-decoding, routing, authentication and every
 * handler's body parsing: the protocol bodies of agents and workers
 * (api/cluster_api.c, assignments_api.c, tasks_api.c, job_metrics_api.c,
 * logs_api.c, checkpoints_api.c, rendezvous_api.c: node registration,
 * heartbeats, task status, metrics, logs, checkpoints, rendezvous) as well
 * as jobs and teams.
 *
 * Input: one byte, then either (byte & 0x80) raw bytes sent as they are, or
 * "METHOD PATH?QUERY\nBODY" sent as a request carrying the token the byte
 * picks (none, admin, team, node, or the task token of a started job).
 * Setup registers a node, submits a job, schedules it and hands its task
 * out, so ids 1 are real. Long-polls and event streams end at once
 * (srv.stopping = 1). A 500 answer or a JSON answer that does not parse
 * aborts. docs/reliability.md, "Fuzzing". */
#define _GNU_SOURCE 1 /* strcasestr */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "api/routes.h"
#include "common/util.h"
#include "scheduler/scheduler.h"
#include "server/http.h"
#include "server/server.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static server g_srv;
static int g_port;
static char g_dir[256];
static char g_tok[5][160]; /* none, admin, team, node, task */

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *f) {
    (void)st;
    (void)flag;
    (void)f;
    return remove(p);
}

static void cleanup(void) {
    if (g_srv.http) http_stop(g_srv.http);
    g_srv.http = NULL;
    if (g_dir[0]) nftw(g_dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* Removes the data directories of earlier runs that died (a crash skips
 * atexit): ty_fuzz_http_PID_* whose PID is gone. */
static void remove_stale(const char *parent) {
    DIR *d = opendir(parent);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long pid;
        char rest[64];
        if (sscanf(e->d_name, "ty_fuzz_http_%ld_%63s", &pid, rest) != 2 || pid <= 0) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", parent, e->d_name);
        nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    }
    closedir(d);
}

/* Whether out (got bytes) holds a whole answer: its headers and as many
 * body bytes as its Content-Length says (an answer without one ends when
 * the server closes). */
static int answer_complete(const char *out, size_t got) {
    const char *end = strstr(out, "\r\n\r\n");
    if (!end) return 0;
    const char *cl = strcasestr(out, "\r\nContent-Length:");
    if (!cl || cl > end) return 0;
    size_t n = strtoul(cl + 17, NULL, 10);
    return got >= (size_t)(end + 4 - out) + n;
}

/* Sends req (n bytes) on a new connection; the answer (NUL-terminated, at
 * most cap-1 bytes kept) into out. Returns the status, 0 when none came.
 * Waits at most wait_ms between reads. libmicrohttpd's epoll mode does not
 * see that a client shut its side (shutdown(SHUT_WR)) on a connection it
 * keeps alive or whose request is unfinished: such a connection waits for
 * its idle timeout, so the answer ends at its Content-Length, and a raw
 * input (which may stop halfway) is given 250 ms; waiting 5 s for them held
 * the target to 20-45 inputs a second. */
static int exchange(const char *req, size_t n, char *out, size_t cap, int wait_ms) {
    int fd = -1;
    /* libFuzzer's timers (SIGALRM) interrupt system calls: retry on EINTR */
    for (int tries = 0; fd < 0; tries++) {
        fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) abort();
        struct timeval tv = {wait_ms / 1000, (wait_ms % 1000) * 1000};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g_port)};
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) break;
        if (errno != EINTR || tries > 100) {
            perror("fuzz_http_server: connect");
            abort();
        }
        close(fd);
        fd = -1;
    }
    size_t off = 0;
    while (off < n) {
        ssize_t w = send(fd, req + off, n - off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break; /* the server may answer and close before reading it all */
        off += (size_t)w;
    }
    shutdown(fd, SHUT_WR);
    size_t got = 0;
    out[0] = '\0';
    for (;;) {
        char tmp[4096];
        ssize_t r = recv(fd, tmp, sizeof tmp, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        size_t keep = (size_t)r < cap - 1 - got ? (size_t)r : cap - 1 - got;
        memcpy(out + got, tmp, keep);
        got += keep;
        out[got] = '\0';
        if (answer_complete(out, got) || got == cap - 1) break;
    }
    out[got] = '\0';
    close(fd);
    int status = 0;
    if (strncmp(out, "HTTP/1.", 7) == 0 && got >= 12) status = atoi(out + 9);
    return status;
}

/* The request METHOD PATH with tok (may be "") and body. */
static int request(const char *method, const char *path, const char *tok, const char *body, size_t blen,
                   char *out, size_t cap) {
    buf b;
    buf_init(&b, 1u << 24);
    if (buf_printf(&b, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: %zu\r\n", method,
                   path, blen) < 0 ||
        (tok[0] && buf_printf(&b, "Authorization: Bearer %s\r\n", tok) < 0) ||
        (blen && buf_appends(&b, "Content-Type: application/json\r\n") < 0) || buf_appends(&b, "\r\n") < 0 ||
        buf_append(&b, body, blen) < 0)
        abort();
    int st = exchange(b.data, b.len, out, cap, 5000);
    buf_release(&b);
    return st;
}

static const char *body_of(const char *resp) {
    const char *p = strstr(resp, "\r\n\r\n");
    return p ? p + 4 : "";
}

static void read_token(const char *name, char *out) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    size_t len = 0;
    char *s = file_read_all(path, 1024, &len);
    if (!s) abort();
    while (len && (s[len - 1] == '\n' || s[len - 1] == '\r')) s[--len] = '\0';
    snprintf(out, 160, "%s", s);
    free(s);
}

static char g_resp[1 << 20];

static void setup_fail(const char *what) {
    fprintf(stderr, "fuzz_http_server: setup: %s: %.500s\n", what, g_resp);
    cleanup();
    abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    signal(SIGPIPE, SIG_IGN);
    log_set_level((log_level)(LOG_ERROR + 1));
    remove_stale("/dev/shm");
    remove_stale("/tmp");
    snprintf(g_dir, sizeof g_dir, "/dev/shm/ty_fuzz_http_%ld_XXXXXX", (long)getpid());
    if (!mkdtemp(g_dir)) {
        snprintf(g_dir, sizeof g_dir, "/tmp/ty_fuzz_http_%ld_XXXXXX", (long)getpid());
        if (!mkdtemp(g_dir)) abort();
    }
    atexit(cleanup);
    server_options o;
    server_options_default(&o);
    snprintf(o.data_dir, sizeof o.data_dir, "%s", g_dir);
    o.port = 0;
    o.quiet = 1;
    char err[256];
    if (server_open(&g_srv, &o, err, sizeof err) < 0) {
        fprintf(stderr, "fuzz_http_server: %s\n", err);
        abort();
    }
    http_set_auth_fail_limit(0); /* random tokens by the thousand: every one looked up */
    g_srv.http = http_start(&g_srv, g_srv.db, g_srv.opt.context_max_mb, "127.0.0.1", 0, api_route_tables, NULL,
                            NULL, &g_port, err, sizeof err);
    if (!g_srv.http) {
        fprintf(stderr, "fuzz_http_server: %s\n", err);
        abort();
    }
    g_srv.port = g_port;
    snprintf(g_srv.url, sizeof g_srv.url, "http://127.0.0.1:%d", g_port);
    read_token("admin.token", g_tok[1]);
    read_token("token", g_tok[2]);
    read_token("node.token", g_tok[3]);

    /* a node, a job on it, its task handed out: ids 1 exist, a task token works */
    static const char node[] = "{\"hostname\":\"fuzz-node\",\"address\":\"127.0.0.1\",\"cpu_slots\":4,\"devices\":[]}";
    int st = request("POST", "/api/v1/nodes", g_tok[3], node, sizeof node - 1, g_resp, sizeof g_resp);
    if (st != 200 && st != 201) setup_fail("register");
    cJSON *r = cJSON_Parse(body_of(g_resp));
    const cJSON *nt = cJSON_GetObjectItemCaseSensitive(r, "token");
    if (cJSON_IsString(nt)) snprintf(g_tok[3], sizeof g_tok[3], "%s", nt->valuestring); /* the node's own */
    cJSON_Delete(r);
    static const char job[] =
        "{\"name\":\"fuzz\",\"model\":{\"layers\":[{\"type\":\"dense\",\"units\":2,\"activation\":\"softmax\","
        "\"input_shape\":[3]}]},\"compile\":{\"optimizer\":\"sgd\",\"loss\":\"sparse_categorical_crossentropy\"},"
        "\"data\":{\"source\":\"synthetic\",\"examples\":8,\"features\":3},\"resources\":{\"workers\":1}}";
    st = request("POST", "/api/v1/jobs", g_tok[2], job, sizeof job - 1, g_resp, sizeof g_resp);
    if (st != 201 && st != 200 && st != 202) setup_fail("submit");
    sched_config cfg;
    sched_config_default(&cfg);
    sched_pass_stats ps;
    if (sched_pass(g_srv.db, &cfg, now_ms(), &ps) < 0) setup_fail("schedule");
    st = request("GET", "/api/v1/nodes/1/assignments", g_tok[3], "", 0, g_resp, sizeof g_resp);
    cJSON *a = cJSON_Parse(body_of(g_resp));
    const cJSON *t0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(a, "start"), 0);
    const cJSON *tok = cJSON_GetObjectItemCaseSensitive(t0, "token");
    if (st != 200 || !cJSON_IsString(tok)) setup_fail("assignments");
    snprintf(g_tok[4], sizeof g_tok[4], "%s", tok->valuestring);
    cJSON_Delete(a);
    static const char running[] = "{\"state\":\"running\"}";
    st = request("POST", "/api/v1/tasks/1/status", g_tok[3], running, sizeof running - 1, g_resp, sizeof g_resp);
    if (st != 200 && st != 204) setup_fail("task running");
    g_srv.stopping = 1; /* long-polls and event streams answer at once */
    return 0;
}

/* A JSON answer must parse; a 500 is a bug. */
static void check_answer(int st, const uint8_t *data, size_t size) {
    if (st == 500) {
        fprintf(stderr, "500 for input of %zu bytes:\n%.2000s\n", size, g_resp);
        (void)data;
        abort();
    }
    if (!strstr(g_resp, "Content-Type: application/json") || strstr(g_resp, "chunked")) return;
    const char *cl = strstr(g_resp, "Content-Length: ");
    const char *b = strstr(g_resp, "\r\n\r\n");
    if (!cl || !b || strncmp(g_resp, "HEAD", 4) == 0) return;
    size_t n = strtoul(cl + 16, NULL, 10);
    if (strlen(b + 4) < n || n == 0) return; /* HEAD, or kept only in part */
    cJSON *v = cJSON_ParseWithLength(b + 4, n);
    if (!v) {
        fprintf(stderr, "answer is not JSON:\n%.2000s\n", g_resp);
        abort();
    }
    cJSON_Delete(v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 65536) return 0;
    int st;
    if (data[0] & 0x80) {
        st = exchange((const char *)data + 1, size - 1, g_resp, sizeof g_resp, 250);
    } else {
        const uint8_t *p = data + 1, *end = data + size;
        const uint8_t *nl = memchr(p, '\n', (size_t)(end - p));
        size_t line = nl ? (size_t)(nl - p) : (size_t)(end - p);
        char head[2048];
        if (line >= sizeof head) return 0;
        memcpy(head, p, line);
        head[line] = '\0';
        /* the request line must stay one line: no CR/LF/NUL inside */
        if (strlen(head) != line || strchr(head, '\r')) return 0;
        char *sp = strchr(head, ' ');
        const char *method = "GET", *path = head;
        if (sp) {
            *sp = '\0';
            method = head;
            path = sp + 1;
        }
        if (!*method || strchr(path, ' ') || !*path) return 0;
        const uint8_t *body = nl ? nl + 1 : end;
        st = request(method, path, g_tok[data[0] % 5], (const char *)body, (size_t)(end - body), g_resp,
                     sizeof g_resp);
    }
    check_answer(st, data, size);
    return 0;
}
