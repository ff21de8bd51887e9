/* check_shell.c - shells into running tasks (`trainyard shell`, the agent's
 * exec relay, the server's exec routes) end to end on real parts:
 * `trainyard up --cpu-slots 2` on loopback (a server and a local agent that
 * isolates tasks when run as root), the real CLI binary as a user runs it
 * (stdin a pipe, or a PTY of its own from forkpty), and for images podman
 * with the test image (tests/image/build.sh) as tests/check_image.c uses it.
 *
 * host: a command job that leaves a marker in its private /tmp and sleeps;
 * `shell JOB -- id -u` prints the task's uid (not 0 when the agent
 * isolates), sees the task's /tmp and only its uid's processes; exit 3
 * comes back as the CLI's status, a signal as 128+S, a command that does
 * not exist as 127 with why; stdin piped through cat, stdout and stderr
 * apart; on a PTY `stty size` reports the terminal's size and a resize
 * mid-run, the login shell takes typed lines; another team gets 404, a
 * viewer 403, an unknown task 404, a job with no running task says so; a
 * CLI stopped mid-command ends the command in the task; a plain WebSocket
 * client gets its ping answered, types with text frames, ends stdin with
 * channel 5, and hears the status frame, then Close 1000, last; a CLI
 * whose stdout reader has gone ends the session (141).
 *
 * relay: `trainyard server` alone, the test as the node's agent: the real
 * `trainyard exec-relay` for the sessions handed out relays a command's
 * output and exit status; told the task is not running here it still
 * connects and the CLI prints why and exits 126; a session the server does
 * not know is refused (404, exit 1) and its log holds no token.
 *
 * tls: `up --tls auto`: output of 2 MB, 200 KB of stdin and a PTY through
 * TLS (the CLI trusts TRAINYARD_CA, the relay the agent's CA); no CA: exit
 * 3 saying what to set.
 *
 * image: a job in the test image: the shell sees the image's
 * /etc/trainyard-image (absent on the host), as the task's uid, on pipes
 * and on a PTY; a CLI stopped mid-command ends it in the container too. Without root, podman or the image it says SKIP and why. */
#include "testlib.h"

#include "../client/upgrade.h"
#include "../common/ws.h"

#include <fcntl.h>
#include <glob.h>
#include <poll.h>
#include <pty.h>
#include <sys/ioctl.h>
#include <termios.h>

#define IMAGE_LOCAL "localhost/trainyard-test:bookworm-py3"

static ty_proc srv;
static char team_tok[128], admin_tok[128];
static int64_t g_job;
static char g_ca[400];           /* the CA file of a --tls auto server ("" plain HTTP) */

/* ---------------------------------------------------------------- helpers */

typedef struct cli_run {
    int rc;                      /* exit status, 128+S for a signal, -1 timed out */
    buf out, err;
} cli_run;

static void cli_run_release(cli_run *r) {
    buf_release(&r->out);
    buf_release(&r->err);
}

static void env_for(const char *token) {
    setenv("TRAINYARD_URL", srv.url, 1);
    setenv("TRAINYARD_TOKEN", token, 1);
    unsetenv("TRAINYARD_TEAM");
    if (g_ca[0]) setenv("TRAINYARD_CA", g_ca, 1);
    else unsetenv("TRAINYARD_CA");
}

/* Reads what fd has into b (non-blocking); 0 at EOF. */
static int drain(int fd, buf *b) {
    char chunk[4096];
    for (;;) {
        ssize_t n = read(fd, chunk, sizeof chunk);
        if (n > 0) {
            ck_assert_int_eq(buf_append(b, chunk, (size_t)n), 0);
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) return 1;
        return 0;
    }
}

/* `trainyard shell ARGS...` with token, stdin the text in (NULL: /dev/null),
 * stdout and stderr kept apart; killed after timeout_s. */
static cli_run run_shell(const char *token, const char *in, int timeout_s, const char *const *args) {
    cli_run r;
    memset(&r, 0, sizeof r);
    buf_init(&r.out, 8 << 20);
    buf_init(&r.err, 1 << 20);
    int pi[2], po[2], pe[2];
    ck_assert_int_eq(pipe2(pi, O_CLOEXEC), 0);
    ck_assert_int_eq(pipe2(po, O_CLOEXEC), 0);
    ck_assert_int_eq(pipe2(pe, O_CLOEXEC), 0);
    env_for(token);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        dup2(pi[0], 0);
        dup2(po[1], 1);
        dup2(pe[1], 2);
        const char *argv[32];
        int n = 0;
        argv[n++] = ty_bin();
        argv[n++] = "shell";
        for (int i = 0; args[i] && n < 31; i++) argv[n++] = args[i];
        argv[n] = NULL;
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(pi[0]);
    close(po[1]);
    close(pe[1]);
    if (in) {
        size_t len = strlen(in);
        ck_assert_int_eq(write(pi[1], in, len), (ssize_t)len);
    }
    close(pi[1]);
    fcntl(po[0], F_SETFL, O_NONBLOCK);
    fcntl(pe[0], F_SETFL, O_NONBLOCK);
    int open_o = 1, open_e = 1;
    int64_t end = mono_ms() + (int64_t)timeout_s * 1000;
    while ((open_o || open_e) && mono_ms() < end) {
        struct pollfd pf[2] = {{.fd = open_o ? po[0] : -1, .events = POLLIN}, {.fd = open_e ? pe[0] : -1, .events = POLLIN}};
        poll(pf, 2, 200);
        if (open_o) open_o = drain(po[0], &r.out);
        if (open_e) open_e = drain(pe[0], &r.err);
    }
    close(po[0]);
    close(pe[0]);
    int st = 0;
    r.rc = -1;
    while (mono_ms() < end + 2000) {
        if (waitpid(pid, &st, WNOHANG) == pid) {
            r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            break;
        }
        ty_sleep_ms(50);
    }
    if (r.rc == -1) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    if (!r.out.data) buf_appends(&r.out, "");
    if (!r.err.data) buf_appends(&r.err, "");
    return r;
}

#define SHELL(tok, in, ...) run_shell(tok, in, 60, (const char *const[]){__VA_ARGS__, NULL})

/* `trainyard shell ARGS...` on a PTY of rows x cols (forkpty), typing
 * `typed` once `wait_for` shows on it (NULL: at once); resized to rows2 x
 * cols2 after resize_ms (0: never). The PTY's text into out; the exit
 * status. */
static int run_shell_pty(const char *token, int rows, int cols, const char *wait_for, const char *typed, int resize_ms,
                         int rows2, int cols2, buf *out, const char *const *args) {
    env_for(token);
    setenv("TERM", "xterm-256color", 1);
    struct winsize ws = {.ws_row = (unsigned short)rows, .ws_col = (unsigned short)cols};
    int master = -1;
    pid_t pid = forkpty(&master, NULL, NULL, &ws);
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        const char *argv[32];
        int n = 0;
        argv[n++] = ty_bin();
        argv[n++] = "shell";
        for (int i = 0; args[i] && n < 31; i++) argv[n++] = args[i];
        argv[n] = NULL;
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    int64_t start = mono_ms(), end = start + 60000;
    int typed_done = typed == NULL, resized = resize_ms == 0;
    for (;;) {
        if (!typed_done && (!wait_for || (out->data && strstr(out->data, wait_for)))) {
            ck_assert_int_eq(write(master, typed, strlen(typed)), (ssize_t)strlen(typed));
            typed_done = 1;
        }
        if (!resized && mono_ms() - start >= resize_ms) {
            struct winsize w2 = {.ws_row = (unsigned short)rows2, .ws_col = (unsigned short)cols2};
            ck_assert_int_eq(ioctl(master, TIOCSWINSZ, &w2), 0); /* SIGWINCH to the CLI */
            resized = 1;
        }
        struct pollfd pf = {.fd = master, .events = POLLIN};
        int pr = poll(&pf, 1, 100);
        if (pr > 0) {
            char b[4096];
            ssize_t n = read(master, b, sizeof b);
            if (n <= 0) break; /* EIO: the CLI has gone */
            ck_assert_int_eq(buf_append(out, b, (size_t)n), 0);
        }
        if (mono_ms() > end) {
            kill(pid, SIGKILL);
            break;
        }
    }
    int st = 0;
    waitpid(pid, &st, 0);
    close(master);
    if (!out->data) buf_appends(out, "");
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

#define PTY_ARGS(...) (const char *const[]){__VA_ARGS__, NULL}

static cJSON *wait_running(const char *tok, int64_t id, int timeout_s) {
    int64_t end = mono_ms() + (int64_t)timeout_s * 1000;
    for (;;) {
        cJSON *o = ty_job_get(srv.url, tok, id);
        const char *s = ty_str(o, "state");
        const cJSON *t0 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "tasks"), 0);
        if ((strcmp(s, "running") == 0 && strcmp(ty_str(t0, "state"), "running") == 0) || strcmp(s, "failed") == 0 ||
            strcmp(s, "cancelled") == 0 || strcmp(s, "succeeded") == 0 || mono_ms() > end)
            return o;
        cJSON_Delete(o);
        ty_sleep_ms(200);
    }
}

static void expect_running(int64_t id, int timeout_s) {
    cJSON *o = wait_running(team_tok, id, timeout_s);
    char *txt = cJSON_PrintUnformatted(o);
    ck_assert_msg(strcmp(ty_str(o, "state"), "running") == 0, "job %lld did not run: %.1500s", (long long)id, txt);
    free(txt);
    cJSON_Delete(o);
}

static void job_id_text(char *out, size_t n) { snprintf(out, n, "%lld", (long long)g_job); }

/* ---------------------------------------------------------------- fixture */

static void up_start_args(const char *const *extra) {
    memset(&srv, 0, sizeof srv);
    ty_mkdtemp(srv.dir, sizeof srv.dir, "shell");
    ty_server_start_args(&srv, "up", extra);
    ty_token(&srv, "token", team_tok, sizeof team_tok);
    ty_token(&srv, "admin.token", admin_tok, sizeof admin_tok);
}

static void up_start(void) {
    const char *extra[] = {"--cpu-slots", "2", NULL};
    up_start_args(extra);
}

static void submit_sleeper(void) {
    /* the task's private /tmp holds its marker (under isolation, not the host's /tmp) */
    g_job = ty_submit(srv.url, team_tok,
                      "{\"name\":\"sleeper\",\"command\":{\"argv\":[\"/bin/sh\",\"-c\","
                      "\"echo from-the-task > /tmp/shell-marker-$TRAINYARD_TASK_ID; exec sleep 600\"]},"
                      "\"max_restarts\":0}");
    expect_running(g_job, 60);
}

static void host_setup(void) {
    up_start();
    submit_sleeper();
}

/* `up --tls auto`: the CLI verifies the server with its CA (TRAINYARD_CA),
 * the agent's relay with the CA the agent was given. */
static void tls_setup(void) {
    const char *extra[] = {"--tls", "auto", "--cpu-slots", "2", NULL};
    up_start_args(extra);
    ck_assert_msg(strncmp(srv.url, "https://", 8) == 0, "not https: %s", srv.url);
    snprintf(g_ca, sizeof g_ca, "%s/tls/ca.crt", srv.dir);
    char err[512];
    ck_assert_msg(client_trust_ca_file(g_ca, "ca", err, sizeof err) == 0, "%s", err);
    submit_sleeper();
}

static void up_stop(void) {
    ty_kill(&srv, SIGTERM);
    if (getenv("TY_KEEP")) fprintf(stderr, "check_shell: kept %s\n", srv.dir);
    else ty_rmrf(srv.dir);
}

/* ---------------------------------------------------------------- host */

START_TEST(command_runs_as_the_task) {
    char job[32];
    job_id_text(job, sizeof job);
    cli_run r = SHELL(team_tok, NULL, job, "--", "id", "-u");
    ck_assert_msg(r.rc == 0, "rc %d, stderr: %s", r.rc, r.err.data);
    long uid = -1;
    ck_assert_msg(parse_long(strtok(r.out.data, "\n"), 0, 1L << 32, &uid) == 0, "id -u printed: %s", r.out.data);
    if (geteuid() == 0) ck_assert_msg(uid >= 200000, "the shell runs as uid %ld, not the task's", uid);
    else ck_assert_int_eq(uid, (long)geteuid());
    cli_run_release(&r);

    /* the same uid, directory and /tmp as the task; only its uid's processes */
    r = SHELL(team_tok, NULL, job, "--", "sh", "-c",
              "id -u; pwd; echo HOME=$HOME; cat /tmp/shell-marker-$TRAINYARD_TASK_ID; echo task=$TRAINYARD_TASK_NAME; "
              "ps -eo user= | sort -u | wc -l; ps -eo args= | grep -c '^sleep 600'; "
              "echo fds=$(ls /proc/self/fd | wc -l)");
    ck_assert_msg(r.rc == 0, "rc %d, stderr: %s", r.rc, r.err.data);
    ck_assert_msg(strstr(r.out.data, "from-the-task\n") != NULL, "the task's /tmp is not the shell's: %s", r.out.data);
    ck_assert_msg(strstr(r.out.data, "task=worker-0\n") != NULL, "%s", r.out.data);
    /* stdin, stdout, stderr and ls's own: nothing of the agent's or the relay's */
    ck_assert_msg(strstr(r.out.data, "fds=4\n") != NULL, "descriptors leaked into the command: %s", r.out.data);
    if (geteuid() == 0) {
        char cwd[256] = "", home[300];
        sscanf(strchr(r.out.data, '\n') + 1, "%255s", cwd);
        ck_assert_msg(strncmp(cwd, "/var/lib/trainyard-tasks/", 25) == 0, "cwd %s is not the job directory", cwd);
        snprintf(home, sizeof home, "HOME=%s\n", cwd);
        ck_assert_msg(strstr(r.out.data, home) != NULL, "HOME is not the job directory: %s", r.out.data);
        /* hidepid: one user's processes, the task's sleep among them */
        ck_assert_msg(strstr(r.out.data, "\n1\n1\n") != NULL, "other users' processes seen, or no task: %s", r.out.data);
        glob_t g;
        ck_assert_msg(glob("/tmp/shell-marker-*", 0, NULL, &g) == GLOB_NOMATCH, "the marker is in the host's /tmp");
    }
    cli_run_release(&r);
}
END_TEST

START_TEST(exit_status_and_streams) {
    char job[32];
    job_id_text(job, sizeof job);
    cli_run r = SHELL(team_tok, NULL, job, "--", "sh", "-c", "exit 3");
    ck_assert_msg(r.rc == 3, "rc %d, stderr: %s", r.rc, r.err.data);
    cli_run_release(&r);
    /* in the job's timeline, opened and ended with its status, and in the audit trail */
    char path[160];
    snprintf(path, sizeof path, "/api/v1/jobs/%s/events", job);
    char *ev = NULL;
    for (int64_t end = mono_ms() + 5000; mono_ms() < end; ty_sleep_ms(100)) { /* the end is written as the splice ends */
        free(ev);
        ev = ty_http_text(srv.url, team_tok, path);
        if (strstr(ev, "shell in worker-0 ended: exit 3")) break;
    }
    ck_assert_msg(strstr(ev, "shell in worker-0 opened: sh -c exit 3") && strstr(ev, "shell in worker-0 ended: exit 3"),
                  "the timeline: %.2000s", ev);
    ck_assert_msg(strstr(ev, "team:default (service)") != NULL, "the actor: %.2000s", ev);
    free(ev);
    char *au = ty_http_text(srv.url, admin_tok, "/api/v1/audit?action=/exec");
    ck_assert_msg(strstr(au, "/api/v1/jobs/{id}/tasks/{task}/exec") && strstr(au, "\"status\":101"), "the audit: %.1500s", au);
    free(au);
    r = SHELL(team_tok, NULL, job, "--", "sh", "-c", "kill -TERM $$");
    ck_assert_int_eq(r.rc, 128 + SIGTERM);
    cli_run_release(&r);
    /* stdin through, its end the command's; stdout and stderr apart */
    r = SHELL(team_tok, "hi\nthere\n", job, "--", "cat");
    ck_assert_msg(r.rc == 0, "rc %d, stderr: %s", r.rc, r.err.data);
    ck_assert_str_eq(r.out.data, "hi\nthere\n");
    cli_run_release(&r);
    r = SHELL(team_tok, NULL, job, "--", "sh", "-c", "echo to-out; echo to-err >&2; exit 0");
    ck_assert_int_eq(r.rc, 0);
    ck_assert_str_eq(r.out.data, "to-out\n");
    ck_assert_str_eq(r.err.data, "to-err\n");
    cli_run_release(&r);
    /* an argument with spaces and symbols arrives as it was */
    r = SHELL(team_tok, NULL, job, "--", "printf", "[%s]", "a b&c=d?e%f");
    ck_assert_str_eq(r.out.data, "[a b&c=d?e%f]");
    cli_run_release(&r);
    /* 200 KB through stdin and back */
    char *big = xmalloc(200001);
    for (int i = 0; i < 200000; i++) big[i] = (char)('a' + i % 26);
    big[200000] = '\0';
    r = SHELL(team_tok, big, job, "--", "wc", "-c");
    ck_assert_msg(strstr(r.out.data, "200000") != NULL, "wc -c: %s (stderr %s)", r.out.data, r.err.data);
    cli_run_release(&r);
    free(big);
    /* a command that is not there: 127 and why */
    r = SHELL(team_tok, NULL, job, "--", "no-such-command-here");
    ck_assert_int_eq(r.rc, 127);
    ck_assert_msg(strstr(r.err.data, "no-such-command-here") != NULL, "stderr: %s", r.err.data);
    cli_run_release(&r);
    /* --task by name */
    r = SHELL(team_tok, NULL, job, "--task", "worker-0", "--", "sh", "-c", "echo $TRAINYARD_TASK_NAME");
    ck_assert_str_eq(r.out.data, "worker-0\n");
    cli_run_release(&r);
}
END_TEST

START_TEST(tty_size_resize_and_login_shell) {
    char job[32];
    job_id_text(job, sizeof job);
    buf out;
    buf_init(&out, 1 << 20);
    int rc = run_shell_pty(team_tok, 33, 111, NULL, NULL, 0, 0, 0, &out,
                           PTY_ARGS(job, "--", "sh", "-c", "stty size; tty; exit 5"));
    ck_assert_msg(rc == 5, "rc %d: %s", rc, out.data);
    ck_assert_msg(strstr(out.data, "33 111\r\n") != NULL, "stty size: %s", out.data);
    ck_assert_msg(strstr(out.data, "/dev/pts/") != NULL, "no terminal: %s", out.data);
    buf_reset(&out);
    /* resized mid-run: the command sees the new size */
    rc = run_shell_pty(team_tok, 24, 80, NULL, NULL, 500, 50, 150, &out,
                       PTY_ARGS(job, "--", "sh", "-c", "sleep 3; stty size"));
    ck_assert_msg(rc == 0, "rc %d: %s", rc, out.data);
    ck_assert_msg(strstr(out.data, "50 150\r\n") != NULL, "stty size after the resize: %s", out.data);
    buf_reset(&out);
    /* the login shell (no command) takes typed lines */
    rc = run_shell_pty(team_tok, 24, 80, NULL, "echo typed-$((6*7)); exit 7\r", 0, 0, 0, &out, PTY_ARGS(job));
    ck_assert_msg(rc == 7, "rc %d: %s", rc, out.data);
    ck_assert_msg(strstr(out.data, "typed-42") != NULL, "the shell's output: %s", out.data);
    buf_release(&out);
}
END_TEST

START_TEST(refusals) {
    char job[32];
    job_id_text(job, sizeof job);
    /* another team: the job does not exist for it */
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "POST", "/api/v1/teams", "{\"name\":\"other\"}", &o), 201);
    char other[128];
    snprintf(other, sizeof other, "%s", ty_str(o, "token"));
    cJSON_Delete(o);
    cli_run r = SHELL(other, NULL, job, "--task", "worker-0", "--", "id");
    ck_assert_int_eq(r.rc, 1);
    ck_assert_msg(strstr(r.err.data, "HTTP 404") != NULL && !strchr(strchr(r.err.data, '\n') + 1, '\n'),
                  "not one line naming a 404: %s", r.err.data);
    ck_assert_str_eq(r.out.data, "");
    cli_run_release(&r);
    r = SHELL(other, NULL, job, "--", "id"); /* looking for its running task: the same 404 */
    ck_assert_int_eq(r.rc, 1);
    ck_assert_msg(strstr(r.err.data, "HTTP 404") != NULL, "%s", r.err.data);
    cli_run_release(&r);
    /* a viewer reads the job, may not open a shell */
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "POST", "/api/v1/users", "{\"name\":\"vi\"}", NULL), 201);
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "PUT", "/api/v1/teams/default/members/vi", "{\"role\":\"viewer\"}", NULL),
                     201);
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "POST", "/api/v1/users/vi/tokens", "{\"name\":\"t\"}", &o), 201);
    char vi[96];
    snprintf(vi, sizeof vi, "%s", ty_str(o, "token"));
    cJSON_Delete(o);
    r = SHELL(vi, NULL, job, "--", "id");
    ck_assert_int_eq(r.rc, 1);
    ck_assert_msg(strstr(r.err.data, "HTTP 403") != NULL && strstr(r.err.data, "role") != NULL, "%s", r.err.data);
    cli_run_release(&r);
    /* no such task */
    r = SHELL(team_tok, NULL, job, "--task", "worker-9", "--", "id");
    ck_assert_int_eq(r.rc, 1);
    ck_assert_msg(strstr(r.err.data, "HTTP 404") != NULL, "%s", r.err.data);
    cli_run_release(&r);
    /* usage */
    r = SHELL(team_tok, NULL, "x1", "--", "id");
    ck_assert_int_eq(r.rc, 2);
    cli_run_release(&r);
    r = SHELL(team_tok, NULL, job, "--task", "../x", "--", "id");
    ck_assert_int_eq(r.rc, 2);
    cli_run_release(&r);
    /* a job that ended has no running task */
    char path[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%s/cancel", job);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", path, NULL, NULL), 200);
    cJSON *j = NULL;
    for (int i = 0; i < 150; i++) {
        j = ty_job_get(srv.url, team_tok, g_job);
        if (strcmp(ty_str(j, "state"), "cancelled") == 0) break;
        cJSON_Delete(j);
        j = NULL;
        ty_sleep_ms(200);
    }
    ck_assert_ptr_nonnull(j);
    cJSON_Delete(j);
    r = SHELL(team_tok, NULL, job, "--", "id");
    ck_assert_int_eq(r.rc, 1);
    ck_assert_msg(strstr(r.err.data, "no running task") != NULL, "%s", r.err.data);
    cli_run_release(&r);
}
END_TEST

/* A CLI stopped (SIGTERM) while `sleep 321` runs in the task: it exits
 * 143, and the sleep is gone from the task soon after (listed by `ps_cmd`
 * run in the task, which prints the processes' command lines). */
static void stop_cli_midway(const char *job, const char *ps_cmd) {
    env_for(team_tok);
    int po[2];
    ck_assert_int_eq(pipe2(po, O_CLOEXEC), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int devnull = open("/dev/null", O_RDONLY);
        dup2(devnull, 0);
        dup2(po[1], 1);
        execl(ty_bin(), ty_bin(), "shell", job, "--", "sh", "-c", "echo started; exec sleep 321", (char *)NULL);
        _exit(127);
    }
    close(po[1]);
    char b[64] = "";
    ssize_t n = read(po[0], b, sizeof b - 1); /* blocks until the command speaks */
    ck_assert_msg(n > 0 && strstr(b, "started"), "the command did not start: %zd", n);
    kill(pid, SIGTERM);
    int st = 0;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGTERM, "the CLI's status %d", st);
    close(po[0]);
    int gone = 0;
    for (int i = 0; i < 50 && !gone; i++) {
        cli_run r = SHELL(team_tok, NULL, job, "--", "sh", "-c", ps_cmd);
        ck_assert_msg(r.rc == 0 && strstr(r.out.data, "sh -c"), "cannot list the task's processes: %s %s", r.out.data,
                      r.err.data);
        gone = strstr(r.out.data, "sleep 321") == NULL;
        cli_run_release(&r);
        if (!gone) ty_sleep_ms(200);
    }
    ck_assert_msg(gone, "the command still runs in the task after its CLI stopped");
}

static const char PS_ARGS[] = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done";

START_TEST(stopped_cli_ends_the_command) {
    char job[32];
    job_id_text(job, sizeof job);
    stop_cli_midway(job, PS_ARGS);
}
END_TEST

/* The protocol as a plain WebSocket client speaks it (no CLI): a ping is
 * answered with its payload, a text frame is stdin, channel 5 ends stdin,
 * then the status frame and Close 1000 come last. */
static int next_msg(client_conn *k, ws_decoder *d, buf *in, ws_msg *m, int64_t end) {
    for (;;) {
        size_t used = 0;
        int rc = ws_decode(d, (uint8_t *)in->data, in->len, &used, m);
        ck_assert_msg(rc >= 0, "the relay broke the protocol: %s", d->err);
        if (used) { /* m points into in: copy it out before dropping the bytes */
            static uint8_t keep[1 << 16];
            size_t n = m->len < sizeof keep ? m->len : sizeof keep;
            memcpy(keep, m->data, n);
            memmove(in->data, in->data + used, in->len - used);
            in->len -= used;
            m->data = keep;
            m->len = n;
        }
        if (rc == 1) return 1;
        if (used) continue;
        char b[4096];
        ssize_t n = client_conn_recv(k, b, sizeof b);
        if (n == -2) {
            struct pollfd pf = {.fd = k->fd, .events = POLLIN};
            if (mono_ms() > end) return 0;
            poll(&pf, 1, 200);
            continue;
        }
        if (n <= 0) return 0;
        ck_assert_int_eq(buf_append(in, b, (size_t)n), 0);
    }
}

START_TEST(raw_websocket_client) {
    client c;
    ck_assert_int_eq(client_init(&c, srv.url, team_tok), 0);
    char key[25], want[29], got[64], path[128], hdr[256];
    ck_assert_int_eq(ws_key_new(key), 0);
    ck_assert_int_eq(ws_accept_key(key, want), 0);
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/tasks/worker-0/exec?command=cat&tty=0", (long long)g_job);
    snprintf(hdr, sizeof hdr,
             "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n",
             key);
    client_conn k;
    char err[512];
    ck_assert_msg(client_upgrade(&c, path, hdr, 30000, &k, err, sizeof err) == 0, "%s", err);
    client_release(&c);
    ck_assert_msg(k.status == 101, "answered %ld: %s", k.status, k.body.data ? k.body.data : "");
    ck_assert_ptr_nonnull(client_conn_header(&k, "Sec-WebSocket-Accept", got, sizeof got));
    ck_assert_str_eq(got, want);
    buf out;
    buf_init(&out, 1 << 16);
    ck_assert_int_eq(ws_frame(&out, WS_PING, "are-you-there", 13, 1), 0);
    ck_assert_int_eq(ws_frame(&out, WS_TEXT, "typed as text\n", 14, 1), 0);
    ck_assert_int_eq(ws_frame(&out, WS_BINARY, "\x04{\"cols\":100,\"rows\":30}", 24, 1), 0); /* no PTY: ignored */
    ck_assert_int_eq(ws_frame(&out, WS_BINARY, "\x00" "and binary\n", 12, 1), 0);
    ck_assert_int_eq(ws_frame(&out, WS_BINARY, "\x05", 1, 1), 0);
    for (size_t off = 0; off < out.len;) {
        ssize_t n = client_conn_send(&k, out.data + off, out.len - off);
        ck_assert_int_ge(n, 0);
        off += (size_t)n;
    }
    ws_decoder d;
    ws_decoder_init(&d, 0, 1 << 20, 1 << 20);
    buf in, stdout_;
    buf_init(&in, 1 << 21);
    buf_init(&stdout_, 1 << 16);
    if (k.extra.len) buf_append(&in, k.extra.data, k.extra.len);
    int pong = 0, status = 0, closed = 0;
    int64_t end = mono_ms() + 30000;
    ws_msg m;
    while (!closed && next_msg(&k, &d, &in, &m, end)) {
        ck_assert_msg(!status || m.opcode == WS_CLOSE, "a frame after the status");
        if (m.opcode == WS_PONG) {
            ck_assert(m.len == 13 && memcmp(m.data, "are-you-there", 13) == 0);
            pong = 1;
        } else if (m.opcode == WS_BINARY && m.len && m.data[0] == 1) {
            buf_append(&stdout_, m.data + 1, m.len - 1);
        } else if (m.opcode == WS_BINARY && m.len && m.data[0] == 3) {
            ck_assert(m.len == 11 && memcmp(m.data + 1, "{\"exit\":0}", 10) == 0);
            status = 1;
        } else if (m.opcode == WS_CLOSE) {
            ck_assert_int_eq(m.close_code, 1000);
            closed = 1;
        }
    }
    ck_assert_msg(pong && status && closed, "pong %d status %d close %d", pong, status, closed);
    ck_assert_str_eq(stdout_.data, "typed as text\nand binary\n");
    buf_reset(&out);
    ck_assert_int_eq(ws_frame(&out, WS_CLOSE, "\x03\xe8", 2, 1), 0);
    client_conn_send(&k, out.data, out.len);
    client_conn_close(&k);
    ws_decoder_release(&d);
    buf_release(&in);
    buf_release(&out);
    buf_release(&stdout_);
}
END_TEST

/* A reader of the CLI's stdout that goes away ends the session as SIGPIPE
 * ends a plain program: `trainyard shell JOB -- yes | head -c 100`. */
START_TEST(closed_stdout_ends_the_session) {
    char job[32];
    job_id_text(job, sizeof job);
    env_for(team_tok);
    int po[2];
    ck_assert_int_eq(pipe2(po, O_CLOEXEC), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int devnull = open("/dev/null", O_RDONLY);
        dup2(devnull, 0);
        dup2(po[1], 1);
        execl(ty_bin(), ty_bin(), "shell", job, "--", "yes", "from-the-task", (char *)NULL);
        _exit(127);
    }
    close(po[1]);
    char b[100];
    size_t got = 0;
    while (got < sizeof b) {
        ssize_t n = read(po[0], b + got, sizeof b - got);
        ck_assert_int_gt(n, 0);
        got += (size_t)n;
    }
    ck_assert(memcmp(b, "from-the-task\n", 14) == 0);
    close(po[0]);
    int st = 0;
    for (int i = 0; i < 200 && waitpid(pid, &st, WNOHANG) != pid; i++) ty_sleep_ms(50);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGPIPE, "the CLI's status %d", st);
    int gone = 0;
    for (int i = 0; i < 50 && !gone; i++) {
        cli_run r = SHELL(team_tok, NULL, job, "--", "sh", "-c", PS_ARGS);
        gone = strstr(r.out.data, "yes from-the-task") == NULL;
        cli_run_release(&r);
        if (!gone) ty_sleep_ms(200);
    }
    ck_assert_msg(gone, "yes still runs in the task");
}
END_TEST

/* Over https: a PTY's size, 2 MB of output and 200 KB of stdin through TLS. */
START_TEST(over_tls) {
    char job[32];
    job_id_text(job, sizeof job);
    cli_run r = SHELL(team_tok, NULL, job, "--", "sh", "-c", "head -c 2000000 /dev/zero | tr '\\0' x; exit 6");
    ck_assert_msg(r.rc == 6, "rc %d: %s", r.rc, r.err.data);
    ck_assert_uint_eq(r.out.len, 2000000);
    ck_assert(r.out.data[0] == 'x' && r.out.data[1999999] == 'x');
    cli_run_release(&r);
    char *big = xmalloc(200001);
    memset(big, 'y', 200000);
    big[200000] = '\0';
    r = SHELL(team_tok, big, job, "--", "wc", "-c");
    free(big);
    ck_assert_msg(strstr(r.out.data, "200000") != NULL, "wc -c: %s (stderr %s)", r.out.data, r.err.data);
    cli_run_release(&r);
    buf out;
    buf_init(&out, 1 << 20);
    int rc = run_shell_pty(team_tok, 30, 90, NULL, NULL, 0, 0, 0, &out, PTY_ARGS(job, "--", "stty", "size"));
    ck_assert_msg(rc == 0 && strstr(out.data, "30 90\r\n"), "rc %d: %s", rc, out.data);
    buf_release(&out);
    /* without the CA the CLI refuses the server, and says what to do */
    g_ca[0] = '\0';
    r = SHELL(team_tok, NULL, job, "--task", "worker-0", "--", "true");
    ck_assert_int_eq(r.rc, 3);
    ck_assert_msg(strstr(r.err.data, "TRAINYARD_CA") != NULL, "%s", r.err.data);
    cli_run_release(&r);
}
END_TEST

/* ---------------------------------------------------------------- relay */

/* `trainyard server` with no agent: the test registers a node and plays its
 * agent's part (assignments, the running report), and starts the real
 * `trainyard exec-relay` itself for the sessions handed to that node. */
static int64_t g_node;
static char g_node_tok[160];

static void server_setup(void) {
    memset(&srv, 0, sizeof srv);
    ty_mkdtemp(srv.dir, sizeof srv.dir, "shellrelay");
    const char *extra[] = {"--heartbeat-timeout", "120", NULL};
    ty_server_start_args(&srv, "server", extra);
    ty_token(&srv, "token", team_tok, sizeof team_tok);
    ty_token(&srv, "admin.token", admin_tok, sizeof admin_tok);
    char join[160];
    ty_token(&srv, "node.token", join, sizeof join);
    cJSON *o = NULL;
    long st = ty_http(srv.url, join, "POST", "/api/v1/nodes",
                      "{\"hostname\":\"relay-node\",\"address\":\"127.0.0.1\",\"cpu_slots\":2,\"devices\":[]}", &o);
    ck_assert_msg(st == 200 || st == 201, "POST /nodes answered %ld", st);
    g_node = (int64_t)ty_num(o, "id");
    snprintf(g_node_tok, sizeof g_node_tok, "%s", ty_str(o, "token"));
    cJSON_Delete(o);
    ck_assert_int_gt(g_node, 0);
    ck_assert_str_ne(g_node_tok, "");
}

/* The first entry of list `what` ("start", "exec") in the node's
 * assignments within 20 s (the caller deletes). */
static cJSON *assignment(const char *what) {
    char path[128];
    snprintf(path, sizeof path, "/api/v1/nodes/%lld/assignments?wait=2", (long long)g_node);
    for (int i = 0; i < 10; i++) {
        cJSON *o = NULL;
        ck_assert_int_eq(ty_http(srv.url, g_node_tok, "GET", path, NULL, &o), 200);
        cJSON *e = cJSON_DetachItemFromArray(cJSON_GetObjectItem(o, what), 0);
        cJSON_Delete(o);
        if (e) return e;
    }
    ck_abort_msg("no \"%s\" entry for node %lld within 20 s", what, (long long)g_node);
    return NULL;
}

/* The CLI in the background: its pid; its stdout and stderr into files. */
static pid_t cli_background(const char *job, const char *dir, const char *cmd) {
    env_for(team_tok);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        char o[400], e[400];
        snprintf(o, sizeof o, "%s/cli.out", dir);
        snprintf(e, sizeof e, "%s/cli.err", dir);
        if (!freopen("/dev/null", "r", stdin) || !freopen(o, "w", stdout) || !freopen(e, "w", stderr)) _exit(126);
        execl(ty_bin(), ty_bin(), "shell", job, "--", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* `trainyard exec-relay` with TRAINYARD_EXEC = json: its exit status. */
static int relay_run(const char *json) {
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        char lf[400];
        snprintf(lf, sizeof lf, "%s/relay.log", srv.dir);
        if (!freopen(lf, "a", stderr)) _exit(126);
        setenv("TRAINYARD_EXEC", json, 1);
        execl(ty_bin(), ty_bin(), "exec-relay", (char *)NULL);
        _exit(127);
    }
    int st = 0;
    for (int i = 0; i < 600 && waitpid(pid, &st, WNOHANG) != pid; i++) ty_sleep_ms(50);
    if (kill(pid, 0) == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
        ck_abort_msg("the relay did not end within 30 s");
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static char *relay_json(const cJSON *entry, const char *error) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "server", srv.url);
    cJSON_AddNumberToObject(o, "node", (double)g_node);
    cJSON_AddStringToObject(o, "session", ty_str(entry, "session"));
    cJSON_AddStringToObject(o, "token", g_node_tok);
    cJSON_AddNumberToObject(o, "task", ty_num(entry, "task"));
    cJSON_AddItemToObject(o, "command", cJSON_Duplicate(cJSON_GetObjectItem(entry, "command"), 1));
    cJSON_AddBoolToObject(o, "tty", cJSON_IsTrue(cJSON_GetObjectItem(entry, "tty")));
    cJSON *env = cJSON_AddArrayToObject(o, "env");
    cJSON_AddItemToArray(env, cJSON_CreateString("TRAINYARD_TASK_NAME=worker-0"));
    if (error) cJSON_AddStringToObject(o, "error", error);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

static int cli_wait(pid_t pid) {
    int st = 0;
    for (int i = 0; i < 600 && waitpid(pid, &st, WNOHANG) != pid; i++) ty_sleep_ms(50);
    if (kill(pid, 0) == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
        return -1;
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static char *read_text(const char *dir, const char *name) {
    char p[400];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    char *t = file_read_all(p, 1 << 20, NULL);
    return t ? t : xstrdup("");
}

START_TEST(relay_alone_and_a_task_not_running) {
    int64_t id = ty_submit(srv.url, team_tok, "{\"name\":\"r\",\"command\":{\"argv\":[\"sleep\",\"600\"]},\"max_restarts\":0}");
    cJSON *start = assignment("start");
    int64_t task = (int64_t)ty_num(start, "task");
    cJSON_Delete(start);
    char path[96], job[32];
    snprintf(path, sizeof path, "/api/v1/tasks/%lld/status", (long long)task);
    ck_assert_int_eq(ty_http(srv.url, g_node_tok, "POST", path, "{\"state\":\"running\"}", NULL), 200);
    snprintf(job, sizeof job, "%lld", (long long)id);

    /* the relay's own work (no isolation asked): the command's output and status */
    pid_t cli = cli_background(job, srv.dir, "echo relayed $TRAINYARD_TASK_NAME; exit 9");
    cJSON *e = assignment("exec");
    ck_assert_int_eq((int64_t)ty_num(e, "task"), task);
    ck_assert_int_eq((int)strlen(ty_str(e, "session")), 32);
    char *json = relay_json(e, NULL);
    ck_assert_int_eq(relay_run(json), 0);
    free(json);
    cJSON_Delete(e);
    ck_assert_int_eq(cli_wait(cli), 9);
    char *out = read_text(srv.dir, "cli.out");
    ck_assert_str_eq(out, "relayed worker-0\n");
    free(out);

    /* the agent could not run it: the relay still connects, and the client hears why */
    cli = cli_background(job, srv.dir, "true");
    e = assignment("exec");
    json = relay_json(e, "task 99 is not running on this node");
    ck_assert_int_eq(relay_run(json), 0);
    free(json);
    cJSON_Delete(e);
    ck_assert_int_eq(cli_wait(cli), 126);
    char *err = read_text(srv.dir, "cli.err");
    ck_assert_msg(strstr(err, "error: task 99 is not running on this node\n") != NULL, "stderr: %s", err);
    free(err);

    /* a session the server does not know: refused, exit 1, nothing run */
    cJSON *bogus = cJSON_CreateObject();
    cJSON_AddStringToObject(bogus, "session", "0123456789abcdef0123456789abcdef");
    cJSON_AddNumberToObject(bogus, "task", (double)task);
    cJSON_AddItemToObject(bogus, "command", cJSON_CreateArray());
    json = relay_json(bogus, NULL);
    ck_assert_int_eq(relay_run(json), 1);
    free(json);
    cJSON_Delete(bogus);
    char *log = read_text(srv.dir, "relay.log");
    ck_assert_msg(strstr(log, "answered 404") != NULL, "relay.log: %s", log);
    ck_assert_msg(strstr(log, g_node_tok) == NULL, "the node's token is in the relay's log");
    free(log);
}
END_TEST

/* ---------------------------------------------------------------- image */

static char skip_why[256];

static void image_decide(void) {
    if (geteuid() != 0) snprintf(skip_why, sizeof skip_why, "not root: podman runs containers as root here");
    else if (system("command -v podman >/dev/null 2>&1") != 0) snprintf(skip_why, sizeof skip_why, "no podman");
    else if (system("podman image exists " IMAGE_LOCAL " || tests/image/build.sh " IMAGE_LOCAL " >/dev/null 2>&1") != 0)
        snprintf(skip_why, sizeof skip_why, "no test image (tests/image/build.sh could not build it)");
}

static void image_setup(void) {
    if (skip_why[0]) return;
    up_start();
    g_job = ty_submit(srv.url, team_tok,
                      "{\"name\":\"in-image\",\"command\":{\"argv\":[\"/bin/sleep\",\"600\"]},"
                      "\"environment\":{\"image\":\"" IMAGE_LOCAL "\"},\"max_restarts\":0}");
    expect_running(g_job, 180);
}

static void image_teardown(void) {
    if (!skip_why[0]) up_stop();
}

START_TEST(shell_in_the_image) {
    if (skip_why[0]) {
        fprintf(stderr, "check_shell: SKIP %s: %s\n", __func__, skip_why);
        return;
    }
    struct stat sb;
    ck_assert_msg(stat("/etc/trainyard-image", &sb) < 0, "the host has the image's marker file");
    char job[32];
    job_id_text(job, sizeof job);
    /* the container may still be starting when the job reads running */
    cli_run r;
    memset(&r, 0, sizeof r);
    for (int i = 0; i < 60; i++) {
        r = SHELL(team_tok, NULL, job, "--", "sh", "-c", "cat /etc/trainyard-image; id -u; echo $TRAINYARD_TASK_NAME");
        if (r.rc == 0) break;
        cli_run_release(&r);
        ty_sleep_ms(500);
    }
    ck_assert_msg(r.rc == 0, "rc %d: %s", r.rc, r.err.data);
    ck_assert_msg(strstr(r.out.data, "trainyard test image\n") != NULL, "not the image's file: %s", r.out.data);
    ck_assert_msg(strstr(r.out.data, "\nworker-0\n") != NULL, "%s", r.out.data);
    long uid = -1;
    ck_assert_int_eq(parse_long(strtok(strchr(r.out.data, '\n') + 1, "\n"), 0, 1L << 32, &uid), 0);
    ck_assert_msg(uid >= 200000, "the shell in the image runs as uid %ld", uid);
    cli_run_release(&r);
    r = SHELL(team_tok, "through the container\n", job, "--", "cat");
    ck_assert_str_eq(r.out.data, "through the container\n");
    cli_run_release(&r);
    r = SHELL(team_tok, NULL, job, "--", "sh", "-c", "exit 4");
    ck_assert_int_eq(r.rc, 4);
    cli_run_release(&r);
    /* the command's options are its own, not podman's */
    r = SHELL(team_tok, NULL, job, "--", "echo", "--help", "-t", "--user=0");
    ck_assert_msg(r.rc == 0 && strcmp(r.out.data, "--help -t --user=0\n") == 0, "rc %d: %s %s", r.rc, r.out.data,
                  r.err.data);
    cli_run_release(&r);
    buf out;
    buf_init(&out, 1 << 20);
    int rc = run_shell_pty(team_tok, 40, 100, NULL, NULL, 0, 0, 0, &out,
                           PTY_ARGS(job, "--", "sh", "-c", "stty size; cat /etc/trainyard-image"));
    ck_assert_msg(rc == 0, "rc %d: %s", rc, out.data);
    ck_assert_msg(strstr(out.data, "40 100\r\n") && strstr(out.data, "trainyard test image"), "%s", out.data);
    buf_release(&out);
    /* the command is conmon's child in the container, not podman exec's: it ends all the same */
    stop_cli_midway(job, PS_ARGS);
}
END_TEST

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    image_decide();
    Suite *s = suite_create("shell");
    TCase *host = ty_tcase(s, "host", host_setup, up_stop, 240);
    tcase_add_test(host, command_runs_as_the_task);
    tcase_add_test(host, exit_status_and_streams);
    tcase_add_test(host, tty_size_resize_and_login_shell);
    tcase_add_test(host, stopped_cli_ends_the_command);
    tcase_add_test(host, refusals);
    tcase_add_test(host, raw_websocket_client);
    tcase_add_test(host, closed_stdout_ends_the_session);
    TCase *rel = ty_tcase(s, "relay", server_setup, up_stop, 120);
    tcase_add_test(rel, relay_alone_and_a_task_not_running);
    TCase *tls = ty_tcase(s, "tls", tls_setup, up_stop, 240);
    tcase_add_test(tls, over_tls);
    TCase *img = ty_tcase(s, "image", image_setup, image_teardown, 400);
    tcase_add_test(img, shell_in_the_image);
    return ty_run_suite(s);
}
