/* testlib.h - helpers for integration tests: start the real trainyard binary
 * (TRAINYARD_BIN) on a free loopback port with a temporary data directory,
 * speak HTTP to it with the project's client, kill and restart it.
 * Header-only so each test binary stays one file. */
#ifndef TRAINYARD_TESTLIB_H
#define TRAINYARD_TESTLIB_H

#include <check.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../api/client.h"
#include "../common/util.h"

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

static inline void ty_rmrf(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
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

/* Starts `trainyard <mode> --listen 127.0.0.1:0 --data DIR [extra...]` and
 * waits until it answers /api/v1/health. */
static inline void ty_server_start_args(ty_proc *p, const char *mode, const char *const *extra) {
    char urlfile[512];
    snprintf(urlfile, sizeof urlfile, "%s/server.url", p->dir);
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

static inline int ty_run_suite(Suite *s) {
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

#endif
