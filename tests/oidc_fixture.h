/* oidc_fixture.h - a real OpenID Provider for the sign-on tests: panva's
 * oidc-provider run by node (tests/oidc/provider.mjs) on loopback, for
 * check_oidc (server/oidc.c alone) and check_sso (the real server). The
 * provider prints one JSON line ({"issuer", "control"}) once it listens.
 * Include after check.h, cJSON and common/util.h.
 *
 *   oidc_have_provider(why, n)  0 with why when node or the package is missing
 *   oidc_op_start(p, tag, redirect, secret, port)  port 0: any
 *   oidc_op_stop(p)             stopped, its directory removed (not with TY_KEEP) */
#ifndef TRAINYARD_TESTS_OIDC_FIXTURE_H
#define TRAINYARD_TESTS_OIDC_FIXTURE_H

#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct oidc_op {
    pid_t pid;
    char dir[256], issuer[128], control[128], keyfile[320];
} oidc_op;

static int oidc_have_provider(char *why, size_t n) {
    if (system("command -v node >/dev/null 2>&1") != 0) return snprintf(why, n, "node is not on the PATH"), 0;
    struct stat st;
    if (stat("node_modules/oidc-provider/package.json", &st) != 0)
        return snprintf(why, n, "node_modules/oidc-provider is missing (run npm ci)"), 0;
    return 1;
}

/* Starts the provider in a new directory /tmp/ty_TAG_XXXXXX: client
 * "trainyard" with the client secret secret, redirect URI redirect, its
 * signing key in p->keyfile (the forging tests read it). */
static void oidc_op_start(oidc_op *p, const char *tag, const char *redirect, const char *secret, int port) {
    memset(p, 0, sizeof *p);
    snprintf(p->dir, sizeof p->dir, "/tmp/ty_%s_XXXXXX", tag);
    ck_assert_ptr_nonnull(mkdtemp(p->dir));
    char secretfile[320], log[320], portarg[16];
    snprintf(secretfile, sizeof secretfile, "%s/secret", p->dir);
    snprintf(p->keyfile, sizeof p->keyfile, "%s/key.json", p->dir);
    snprintf(log, sizeof log, "%s/provider.log", p->dir);
    snprintf(portarg, sizeof portarg, "%d", port);
    char text[128];
    int tn = snprintf(text, sizeof text, "%s\n", secret);
    ck_assert(tn > 0 && (size_t)tn < sizeof text);
    ck_assert_int_eq(file_write_atomic(secretfile, text, (size_t)tn, 0600), 0);
    int fd[2];
    ck_assert_int_eq(pipe(fd), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        dup2(fd[1], 1);
        close(fd[0]);
        close(fd[1]);
        if (!freopen(log, "a", stderr)) _exit(126);
        if (port)
            execlp("node", "node", "tests/oidc/provider.mjs", "--redirect-uri", redirect, "--client-secret-file",
                   secretfile, "--key-file", p->keyfile, "--port", portarg, (char *)NULL);
        else
            execlp("node", "node", "tests/oidc/provider.mjs", "--redirect-uri", redirect, "--client-secret-file",
                   secretfile, "--key-file", p->keyfile, (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    p->pid = pid;
    char line[1024];
    size_t len = 0;
    int64_t end = mono_ms() + 30000;
    while (len < sizeof line - 1 && !memchr(line, '\n', len)) {
        struct pollfd pf = {fd[0], POLLIN, 0};
        int left = (int)(end - mono_ms());
        ck_assert_msg(left > 0 && poll(&pf, 1, left) == 1, "the provider did not start in 30 s; see %s", log);
        ssize_t r = read(fd[0], line + len, sizeof line - 1 - len);
        ck_assert_msg(r > 0, "the provider exited; see %s", log);
        len += (size_t)r;
    }
    close(fd[0]);
    line[len] = '\0';
    cJSON *j = cJSON_Parse(line);
    ck_assert_msg(cJSON_IsObject(j), "provider said: %s", line);
    snprintf(p->issuer, sizeof p->issuer, "%s", cJSON_GetObjectItem(j, "issuer")->valuestring);
    snprintf(p->control, sizeof p->control, "%s", cJSON_GetObjectItem(j, "control")->valuestring);
    cJSON_Delete(j);
}

static void oidc_op_stop(oidc_op *p) {
    if (p->pid > 0) {
        kill(p->pid, SIGTERM);
        waitpid(p->pid, NULL, 0);
        p->pid = 0;
    }
    if (p->dir[0] && !getenv("TY_KEEP")) {
        char cmd[400];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", p->dir);
        if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", p->dir);
    }
    p->dir[0] = '\0';
}

#endif
