/* testlib.h - helpers for integration tests: start the real trainyard binary
 * (TRAINYARD_BIN) on a free loopback port with a temporary data directory,
 * speak HTTP to it with the project's client, kill and restart it.
 * Header-only so each test binary stays one file. */
#ifndef TRAINYARD_TESTLIB_H
#define TRAINYARD_TESTLIB_H

#include <arpa/inet.h>
#include <check.h>
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../client/client.h"
#include "../common/tls.h"
#include "../common/util.h"
#include "pg_fixture.h"

typedef struct ty_proc {
    pid_t pid;
    char url[256];
    char dir[256];
    char log[320];
} ty_proc;

static inline const char *ty_bin(void) {
    const char *b = getenv("TRAINYARD_BIN");
    return b && *b ? b : "build/trainyard";
}

static inline void ty_mkdtemp(char *out, size_t n, const char *tag) {
    snprintf(out, n, "/tmp/ty_%s_XXXXXX", tag);
    ck_assert_ptr_nonnull(mkdtemp(out));
}

/* A scratch directory that tasks share with the test: a root agent runs
 * them as other uids with a private /tmp (executor/isolate.h), so it lies
 * outside /tmp and is world-writable, sticky (1777). */
static inline void ty_mkdtemp_shared(char *out, size_t n, const char *tag) {
    const char *base = "/var/lib/trainyard-tests";
    if (mkdir(base, 0755) < 0 && errno != EEXIST) ck_abort_msg("cannot make %s: %s", base, strerror(errno));
    snprintf(out, n, "%s/%s_XXXXXX", base, tag);
    ck_assert_ptr_nonnull(mkdtemp(out));
    ck_assert_int_eq(chmod(out, 01777), 0);
}

static inline void ty_rmrf(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (getenv("TY_KEEP")) return;
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", dir);
}

static inline void ty_sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Reads a token file of the data directory (admin.token, token, node.token). */
static inline void ty_token(const ty_proc *p, const char *name, char *out, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", p->dir, name);
    size_t len = 0;
    char *s = file_read_all(path, 1024, &len);
    ck_assert_msg(s != NULL, "cannot read %s", path);
    while (len && (s[len - 1] == '\n')) s[--len] = '\0';
    snprintf(out, n, "%s", s);
    free(s);
}

/* The hash an agent joins with (--ca-hash) of the CA `--tls auto` made in
 * the data directory of p (DIR/tls/ca.crt). */
static inline void ty_ca_pin(const ty_proc *p, char pin[TLS_PIN_LEN]) {
    char path[512], err[256];
    snprintf(path, sizeof path, "%s/tls/ca.crt", p->dir);
    size_t n = 0;
    char *pem = file_read_all(path, 1 << 20, &n);
    ck_assert_msg(pem != NULL, "cannot read %s", path);
    ck_assert_msg(tls_ca_pin(pem, n, pin, err, sizeof err) == 0, "%s", err);
    free(pem);
}

/* Starts `trainyard <mode> --listen 127.0.0.1:0 --data DIR [extra...]` and
 * waits until it answers /api/v1/health. With TY_PG_URL (tests/pg_fixture.h),
 * a server (mode "server", or "up", which hands it on) keeps its state in
 * the PostgreSQL database of its data directory (DIR/test-db.url: the same
 * one after a restart) through --db=URL, unless extra names a --db itself. */
static inline void ty_server_start_args(ty_proc *p, const char *mode, const char *const *extra) {
    char urlfile[512];
    snprintf(urlfile, sizeof urlfile, "%s/server.url", p->dir);
    char dbarg[600] = "";
    int own_db = 0;
    for (int i = 0; extra && extra[i]; i++)
        if (strcmp(extra[i], "--db") == 0 || strncmp(extra[i], "--db=", 5) == 0) own_db = 1;
    if (ty_pg_url() && !own_db && (strcmp(mode, "server") == 0 || strcmp(mode, "up") == 0)) {
        char dburl[512];
        ty_pg_data_db(p->dir, dburl, sizeof dburl);
        snprintf(dbarg, sizeof dbarg, "--db=%s", dburl);
    }
    unlink(urlfile);
    snprintf(p->log, sizeof p->log, "%s/server.log", p->dir);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        FILE *lf = freopen(p->log, "a", stderr);
        (void)lf;
        const char *argv[32];
        int n = 0;
        argv[n++] = ty_bin();
        argv[n++] = mode;
        argv[n++] = "--listen";
        argv[n++] = "127.0.0.1:0";
        argv[n++] = "--data";
        argv[n++] = p->dir;
        if (dbarg[0]) argv[n++] = dbarg;
        for (int i = 0; extra && extra[i] && n < 30; i++) argv[n++] = extra[i];
        argv[n] = NULL;
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    p->pid = pid;
    for (int i = 0; i < 300; i++) {
        size_t len = 0;
        char *s = file_read_all(urlfile, 256, &len);
        if (s) {
            while (len && s[len - 1] == '\n') s[--len] = '\0';
            snprintf(p->url, sizeof p->url, "%s", s);
            free(s);
            return;
        }
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) ck_abort_msg("server exited early; see %s", p->log);
        ty_sleep_ms(50);
    }
    ck_abort_msg("server did not start in 15 s; see %s", p->log);
}

static inline void ty_server_start(ty_proc *p) { ty_server_start_args(p, "server", NULL); }

/* Sends sig and reaps the process; returns its wait status. */
static inline int ty_kill(ty_proc *p, int sig) {
    if (p->pid <= 0) return 0;
    kill(p->pid, sig);
    int status = 0;
    for (int i = 0; i < 200; i++) {
        if (waitpid(p->pid, &status, WNOHANG) == p->pid) {
            p->pid = 0;
            return status;
        }
        ty_sleep_ms(50);
    }
    kill(p->pid, SIGKILL);
    waitpid(p->pid, &status, 0);
    p->pid = 0;
    return status;
}

/* One request; returns the status and (if out) the parsed JSON body. */
static inline long ty_http(const char *url, const char *token, const char *method, const char *path,
                           const char *body, cJSON **out) {
    client c;
    ck_assert_int_eq(client_init(&c, url, token), 0);
    client_reply r;
    int rc = client_request(&c, method, path, body, body ? strlen(body) : 0, NULL, &r);
    client_release(&c);
    ck_assert_msg(rc == 0, "request failed: %s", r.error);
    long status = r.status;
    if (out) {
        *out = cJSON_ParseWithLength(r.body.data ? r.body.data : "", r.body.len);
        ck_assert_msg(*out != NULL, "%s %s: reply is not JSON: %.200s", method, path, r.body.data ? r.body.data : "");
    }
    client_reply_release(&r);
    return status;
}

/* Asserts an error body: {"error": {"code": code, "field": field}}. */
static inline void ty_assert_error(cJSON *o, const char *code, const char *field) {
    cJSON *e = cJSON_GetObjectItem(o, "error");
    ck_assert_msg(cJSON_IsObject(e), "no error object");
    ck_assert_str_eq(cJSON_GetObjectItem(e, "code")->valuestring, code);
    ck_assert(cJSON_IsString(cJSON_GetObjectItem(e, "message")));
    cJSON *f = cJSON_GetObjectItem(e, "field");
    if (field) {
        ck_assert_msg(cJSON_IsString(f), "no field in the error");
        ck_assert_str_eq(f->valuestring, field);
    } else {
        ck_assert(cJSON_IsNull(f));
    }
}

/* A free loopback port (so a restarted server keeps its URL). */
static inline int ty_free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t len = sizeof a;
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* `trainyard agent` for the server p (DIR/node.token), offering `slots` CPU
 * slots as host `hostname`; its output is appended to DIR/agent.log. */
static inline pid_t ty_agent_start(const ty_proc *p, const char *hostname, const char *slots) {
    char tokfile[400], logf[400], statef[400];
    snprintf(statef, sizeof statef, "%s/agent.state", p->dir);
    snprintf(tokfile, sizeof tokfile, "%s/node.token", p->dir);
    snprintf(logf, sizeof logf, "%s/agent.log", p->dir);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        FILE *lf = freopen(logf, "a", stderr);
        (void)lf;
        execl(ty_bin(), ty_bin(), "agent", "--server", p->url, "--token-file", tokfile, "--hostname", hostname,
              "--cpu-slots", slots, "--heartbeat", "1", "--poll-wait", "3", "--state-file", statef, (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* Pids whose parent is ppid and whose argv[1] is `sub` (agent, worker). */
/* /proc/.../stat of a process or thread read into text (cap bytes): the
 * fields after "(comm)", or NULL when it cannot be read. */
static inline const char *ty_proc_stat(const char *path, char *text, size_t cap) {
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    size_t len = fread(text, 1, cap - 1, f);
    fclose(f);
    text[len] = '\0';
    const char *rp = strrchr(text, ')');
    return rp ? rp + 1 : NULL;
}

static inline int ty_children_named(pid_t ppid, const char *sub, pid_t *out, int max) {
    DIR *d = opendir("/proc");
    ck_assert_ptr_nonnull(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < max) {
        long pid;
        if (parse_long(e->d_name, 1, 1L << 30, &pid) < 0) continue;
        char path[64], stat[512];
        snprintf(path, sizeof path, "/proc/%ld/stat", pid);
        const char *fields = ty_proc_stat(path, stat, sizeof stat);
        char st;
        int pp;
        if (!fields || sscanf(fields, " %c %d", &st, &pp) != 2 || pp != ppid || st == 'Z') continue;
        snprintf(path, sizeof path, "/proc/%ld/cmdline", pid);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        char cmd[512];
        size_t len = fread(cmd, 1, sizeof cmd - 1, f);
        fclose(f);
        cmd[len] = '\0';
        size_t a0 = strlen(cmd);
        if (a0 + 1 < len && strcmp(cmd + a0 + 1, sub) == 0) out[n++] = (pid_t)pid;
    }
    closedir(d);
    return n;
}

/* All metrics of a job in seq order, through GET /jobs/{id}/metrics pages
 * (the caller deletes). */
static inline cJSON *ty_metrics_all(const char *url, const char *token, int64_t id) {
    cJSON *all = cJSON_CreateArray();
    int64_t since = 0;
    for (;;) {
        char path[128];
        snprintf(path, sizeof path, "/api/v1/jobs/%lld/metrics?since=%lld&limit=1000", (long long)id, (long long)since);
        cJSON *o = NULL;
        ck_assert_int_eq(ty_http(url, token, "GET", path, NULL, &o), 200);
        cJSON *arr = cJSON_GetObjectItem(o, "metrics");
        int n = cJSON_GetArraySize(arr);
        while (cJSON_GetArraySize(arr) > 0) {
            cJSON *m = cJSON_DetachItemFromArray(arr, 0);
            since = (int64_t)cJSON_GetObjectItem(m, "seq")->valuedouble;
            cJSON_AddItemToArray(all, m);
        }
        cJSON_Delete(o);
        if (n == 0) break;
    }
    return all;
}

/* A number (-1 when absent) or a string ("" when absent) of a JSON object. */
static inline double ty_num(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItem(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

static inline const char *ty_str(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItem(o, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

/* POST /jobs with the spec text (201 asserted): the job's id. */
static inline int64_t ty_submit(const char *url, const char *token, const char *spec) {
    cJSON *o = NULL;
    long st = ty_http(url, token, "POST", "/api/v1/jobs", spec, &o);
    char *reply = cJSON_PrintUnformatted(o);
    ck_assert_msg(st == 201, "submit answered %ld: %s\nspec: %s", st, reply, spec);
    free(reply);
    int64_t id = (int64_t)ty_num(o, "id");
    cJSON_Delete(o);
    return id;
}

/* GET /jobs/{id} (200 asserted): the job (the caller deletes). */
static inline cJSON *ty_job_get(const char *url, const char *token, int64_t id) {
    char path[64];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld", (long long)id);
    cJSON *o = NULL;
    long st = ty_http(url, token, "GET", path, NULL, &o);
    ck_assert_msg(st == 200, "GET %s answered %ld", path, st);
    return o;
}

/* GET a text resource (logs), 200 asserted: the body (the caller frees). */
static inline char *ty_http_text(const char *url, const char *token, const char *path) {
    client c;
    ck_assert_int_eq(client_init(&c, url, token), 0);
    client_reply r;
    ck_assert_int_eq(client_request(&c, "GET", path, NULL, 0, NULL, &r), 0);
    ck_assert_msg(r.status == 200, "GET %s answered %ld", path, r.status);
    char *s = buf_detach(&r.body, NULL);
    client_reply_release(&r);
    client_release(&c);
    return s ? s : xstrdup("");
}

/* The log of a job's task (worker-0, ps-1) as text (the caller frees). */
static inline char *ty_task_log(const char *url, const char *token, int64_t id, const char *task) {
    char path[128];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/logs?task=%s", (long long)id, task);
    return ty_http_text(url, token, path);
}

/* A test case of suite s with a per-test fixture and a timeout. */
static inline TCase *ty_tcase(Suite *s, const char *name, SFun setup, SFun teardown, int timeout_s) {
    TCase *tc = tcase_create(name);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, timeout_s);
    suite_add_tcase(s, tc);
    return tc;
}

static inline int ty_run_suite(Suite *s) {
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

#endif
