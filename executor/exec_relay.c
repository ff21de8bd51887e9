/* exec_relay.c - `trainyard exec-relay`: one shell into a running task, the
 * server end of the client's WebSocket (see exec_relay.h; the protocol:
 * docs/executors.md, "Shells into tasks"). */
#include "exec_relay.h"
#include "isolate.h"
#include "proc.h"
#include "../client/client.h"
#include "../client/upgrade.h"
#include "../common/util.h"
#include "../common/ws.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

extern char **environ;

#define RELAY_FRAME_MAX (1u << 20)               /* a client frame's (and message's) most bytes */
#define RELAY_IN_MAX (RELAY_FRAME_MAX + WS_HEAD_MAX) /* undecoded bytes from the socket */
#define RELAY_CHUNK (16u << 10)                  /* one read of the command's output */
#define RELAY_OUT_LOW (256u << 10)               /* frames waiting for the socket: read no more output past this */
#define RELAY_OUT_MAX (RELAY_OUT_LOW + RELAY_CHUNK + RELAY_IN_MAX + 4096)
#define RELAY_STDIN_LOW (256u << 10)             /* stdin waiting for the command: read no more frames past this */
#define RELAY_STDIN_MAX (RELAY_STDIN_LOW + RELAY_IN_MAX)
#define RELAY_KILL_MS 2000                       /* SIGHUP, then SIGKILL this much later */
#define RELAY_DRAIN_MS 2000                      /* output still read after the command exited */
#define RELAY_LINGER_MS 2000                     /* after our Close: the peer's answer awaited */
#define RELAY_CONNECT_MS 15000
#define RELAY_MAX_ARGS 256
#define RELAY_MAX_ENV 128

/* ---------------------------------------------------------------- spawn (agent side) */

pid_t exec_relay_spawn(const char *exe, const char *json, char *const env_add[]) {
    size_t n_env = 0, n_add = 0;
    while (environ && environ[n_env]) n_env++;
    while (env_add && env_add[n_add]) n_add++;
    size_t jn = strlen(json) + sizeof "TRAINYARD_EXEC=";
    char *ej = xmalloc(jn);
    snprintf(ej, jn, "TRAINYARD_EXEC=%s", json);
    char **envp = xcalloc(n_env + n_add + 2, sizeof *envp);
    size_t k = 0;
    for (size_t i = 0; i < n_env; i++) {
        if (strncmp(environ[i], "TRAINYARD_TOKEN=", 16) == 0 || strncmp(environ[i], "TRAINYARD_EXEC=", 15) == 0)
            continue;
        int replaced = 0;
        const char *eq = strchr(environ[i], '=');
        size_t nl = eq ? (size_t)(eq - environ[i]) + 1 : strlen(environ[i]);
        for (size_t j = 0; j < n_add && !replaced; j++) replaced = strncmp(env_add[j], environ[i], nl) == 0;
        if (!replaced) envp[k++] = environ[i];
    }
    for (size_t j = 0; j < n_add; j++) envp[k++] = env_add[j];
    envp[k++] = ej;
    envp[k] = NULL;
    char *argv[] = {(char *)exe, "exec-relay", NULL};
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        if (proc_child_setup(parent, 1, SIGTERM, 1) < 0) _exit(126);
        close_range(3, ~0U, CLOSE_RANGE_CLOEXEC); /* none of the agent's descriptors (its sockets) */
        execve(exe, argv, envp);
        _exit(127);
    }
    int e = errno;
    if (pid > 0) setpgid(pid, pid);
    explicit_bzero(ej, jn); /* it holds the node's token */
    free(ej);
    free(envp);
    errno = e;
    return pid;
}

/* ---------------------------------------------------------------- configuration */

typedef struct relay_cfg {
    char server[512];
    long long node, task;
    char session[40];
    char token[256];
    pid_t worker_pid;            /* the task's worker: its mount namespace (0 none) */
    unsigned long long worker_ticks; /* its start time: the same process, not a reused pid */
    unsigned uid;                /* the task's uid (0: the relay's own) */
    int mount_ns;                /* enter the worker's mount namespace */
    int n_cg;
    char cg[ISO_CTLS][PATH_MAX]; /* the task's cgroup directories */
    char dir[PATH_MAX];          /* the job directory: cwd and HOME ("" none) */
    char tmp[PATH_MAX];          /* TMPDIR ("" none) */
    char container[128];         /* the task's container ("" none) */
    char podman[PATH_MAX];
    char runtime[64];
    int argc;
    char *argv[RELAY_MAX_ARGS + 1]; /* the command (argc 0: a login shell) */
    int tty, cols, rows;
    char term[64];
    int n_env;
    char *env[RELAY_MAX_ENV + 1];  /* the task's variables, "NAME=value" */
    char error[512];             /* the agent could not run it: this is the status's error */
} relay_cfg;

static void cfg_release(relay_cfg *c) {
    for (int i = 0; i < c->argc; i++) free(c->argv[i]);
    for (int i = 0; i < c->n_env; i++) free(c->env[i]);
    explicit_bzero(c->token, sizeof c->token);
}

static int jstr(const cJSON *o, const char *k, char *out, size_t n) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    out[0] = '\0';
    if (!v || cJSON_IsNull(v)) return 0;
    return cJSON_IsString(v) && sfmt(out, n, "%s", v->valuestring) == 0 ? 0 : -1;
}

static double jnum(const cJSON *o, const char *k, double lo, double hi, double dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi)) return dflt;
    return v->valuedouble;
}

/* TRAINYARD_EXEC into c. 0, or -1 with why. */
static int cfg_parse(const char *text, relay_cfg *c, char *why, size_t whylen) {
    memset(c, 0, sizeof *c);
    cJSON *o = cJSON_Parse(text);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        snprintf(why, whylen, "TRAINYARD_EXEC is not a JSON object");
        return -1;
    }
    int bad = jstr(o, "server", c->server, sizeof c->server) < 0 || jstr(o, "session", c->session, sizeof c->session) < 0 ||
              jstr(o, "token", c->token, sizeof c->token) < 0 || jstr(o, "dir", c->dir, sizeof c->dir) < 0 ||
              jstr(o, "tmp", c->tmp, sizeof c->tmp) < 0 || jstr(o, "container", c->container, sizeof c->container) < 0 ||
              jstr(o, "podman", c->podman, sizeof c->podman) < 0 || jstr(o, "runtime", c->runtime, sizeof c->runtime) < 0 ||
              jstr(o, "term", c->term, sizeof c->term) < 0 || jstr(o, "error", c->error, sizeof c->error) < 0;
    c->node = (long long)jnum(o, "node", 1, 9007199254740992.0, 0);
    c->task = (long long)jnum(o, "task", 0, 9007199254740992.0, 0);
    c->worker_pid = (pid_t)jnum(o, "worker_pid", 0, 4194304, 0);
    c->worker_ticks = (unsigned long long)jnum(o, "worker_ticks", 0, 1e18, 0);
    c->uid = (unsigned)jnum(o, "uid", 0, 4294967294.0, 0);
    c->mount_ns = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "mount_ns"));
    c->tty = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "tty"));
    c->cols = (int)jnum(o, "cols", 1, 65535, 80);
    c->rows = (int)jnum(o, "rows", 1, 65535, 24);
    const cJSON *v;
    cJSON_ArrayForEach(v, cJSON_GetObjectItemCaseSensitive(o, "cgroups")) {
        if (c->n_cg == ISO_CTLS || !cJSON_IsString(v) || sfmt(c->cg[c->n_cg], sizeof c->cg[0], "%s", v->valuestring) < 0)
            bad = 1;
        else
            c->n_cg++;
    }
    cJSON_ArrayForEach(v, cJSON_GetObjectItemCaseSensitive(o, "command")) {
        if (c->argc == RELAY_MAX_ARGS || !cJSON_IsString(v)) bad = 1;
        else c->argv[c->argc++] = xstrdup(v->valuestring);
    }
    cJSON_ArrayForEach(v, cJSON_GetObjectItemCaseSensitive(o, "env")) {
        if (c->n_env == RELAY_MAX_ENV || !cJSON_IsString(v) || !strchr(v->valuestring, '=')) bad = 1;
        else c->env[c->n_env++] = xstrdup(v->valuestring);
    }
    cJSON_Delete(o);
    if (!c->term[0]) snprintf(c->term, sizeof c->term, "xterm-256color");
    if (bad || !c->server[0] || !c->node || strlen(c->session) != 32 || strspn(c->session, "0123456789abcdef") != 32) {
        snprintf(why, whylen, "TRAINYARD_EXEC lacks or mangles server, node, session, cgroups, command or env");
        return -1;
    }
    if (c->container[0] && !c->podman[0]) {
        snprintf(why, whylen, "TRAINYARD_EXEC names a container but no podman");
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- the command */

typedef struct child_err {       /* what a child that could not exec says on its error pipe */
    int err;
    int code;                    /* its exit: 126, or 127 (not found) */
    char what[96];
} child_err;

/* In the child (async-signal-safe): reports errno and what failed, exits. */
static void child_fail(int fd, int code, const char *what) {
    child_err ce;
    memset(&ce, 0, sizeof ce);
    ce.err = errno;
    ce.code = code;
    for (size_t i = 0; what[i] && i < sizeof ce.what - 1; i++) ce.what[i] = what[i];
    ssize_t w = write(fd, &ce, sizeof ce);
    (void)w;
    _exit(code);
}

/* In the child: execve of argv[0] along path (a name without '/'), as
 * execvp does, with stack buffers only. Returns with errno when none ran. */
static void exec_search(char *const argv[], char *const envp[], const char *path) {
    const char *name = argv[0];
    int has_slash = 0;
    for (const char *p = name; *p; p++) has_slash |= *p == '/';
    if (has_slash) {
        execve(name, argv, envp);
        return;
    }
    int eacces = 0;
    size_t nl = 0;
    while (name[nl]) nl++;
    for (const char *s = path;;) {
        const char *e = s;
        while (*e && *e != ':') e++;
        char full[PATH_MAX];
        size_t dl = (size_t)(e - s);
        if (dl + 1 + nl < sizeof full) {
            size_t k = 0;
            if (dl == 0) full[k++] = '.';
            for (const char *q = s; q < e; q++) full[k++] = *q;
            full[k++] = '/';
            for (size_t i = 0; i < nl; i++) full[k++] = name[i];
            full[k] = '\0';
            execve(full, argv, envp);
            struct stat sb; /* EACCES for a file that is there; a directory we may not search hides none */
            if (errno == EACCES && stat(full, &sb) == 0) eacces = 1;
        }
        if (!*e) break;
        s = e + 1;
    }
    errno = eacces ? EACCES : ENOENT;
}

typedef struct relay relay;

/* "NAME=" of entry e is among list (n entries). */
static int env_in(const char *e, char *const list[], int n) {
    const char *eq = strchr(e, '=');
    size_t k = eq ? (size_t)(eq - e) + 1 : strlen(e);
    for (int i = 0; i < n; i++)
        if (strncmp(list[i], e, k) == 0) return 1;
    return 0;
}

/* The variables the command gets besides the agent's: TERM, the task's
 * HOME, USER, LOGNAME and TMPDIR when it runs as the task's uid, and the
 * task's TRAINYARD_* (owned strings; n entries). */
static int env_ours(const relay_cfg *c, char *out[], int cap) {
    int n = 0;
    char s[PATH_MAX + 16];
    snprintf(s, sizeof s, "TERM=%s", c->term);
    out[n++] = xstrdup(s);
    if (c->uid) {
        if (c->dir[0] && sfmt(s, sizeof s, "HOME=%s", c->dir) == 0) out[n++] = xstrdup(s);
        snprintf(s, sizeof s, "USER=trainyard-%u", c->uid);
        out[n++] = xstrdup(s);
        snprintf(s, sizeof s, "LOGNAME=trainyard-%u", c->uid);
        out[n++] = xstrdup(s);
        if (c->tmp[0] && sfmt(s, sizeof s, "TMPDIR=%s", c->tmp) == 0) out[n++] = xstrdup(s);
    }
    for (int i = 0; i < c->n_env && n < cap; i++) out[n++] = xstrdup(c->env[i]);
    return n;
}

/* The environment of what the relay execs: ours first, then the relay's own
 * (the agent's) less the secrets and plumbing and, for a command that runs
 * as the task's uid, less what an isolated task does not inherit
 * (iso_env_keep). NULL-terminated; the strings of ours are owned by ours. */
static char **env_build(const relay_cfg *c, char *ours[], int n_ours, int isolated) {
    size_t n_env = 0;
    while (environ && environ[n_env]) n_env++;
    char **envp = xcalloc(n_env + (size_t)n_ours + 1, sizeof *envp);
    size_t k = 0;
    for (int i = 0; i < n_ours; i++) envp[k++] = ours[i];
    static const char *const drop[] = {"TRAINYARD_TOKEN=", "TRAINYARD_EXEC=", "TRAINYARD_CA_PEM=", "TRAINYARD_CA=",
                                       "TRAINYARD_CONFIG=", "TRAINYARD_CONTAINER=", NULL};
    for (size_t i = 0; i < n_env; i++) {
        int skip = env_in(environ[i], ours, n_ours);
        for (int d = 0; drop[d] && !skip; d++) skip = strncmp(environ[i], drop[d], strlen(drop[d])) == 0;
        if (!skip && isolated && !iso_env_keep(environ[i])) skip = 1;
        if (!skip) envp[k++] = environ[i];
    }
    envp[k] = NULL;
    (void)c;
    return envp;
}

static const char LOGIN_SHELL[] = "if command -v bash >/dev/null 2>&1; then exec bash -l; fi; exec sh -l";

/* `podman [--runtime R] exec -i [-t] --detach-keys= --user U:U --workdir DIR
 * --env NAME... CONTAINER CMD...`: the values of the variables come from
 * podman's environment, so none shows in a process listing. Owned. */
static char **podman_argv(const relay_cfg *c, char *const ours[], int n_ours) {
    char **v = xcalloc((size_t)(24 + 2 * n_ours + c->argc + 4), sizeof *v);
    int k = 0;
    v[k++] = xstrdup(c->podman);
    if (c->runtime[0]) {
        v[k++] = xstrdup("--runtime");
        v[k++] = xstrdup(c->runtime);
    }
    v[k++] = xstrdup("exec");
    v[k++] = xstrdup("-i");
    if (c->tty) v[k++] = xstrdup("-t");
    v[k++] = xstrdup("--detach-keys="); /* no key sequence detaches: ctrl-p is the shell's */
    if (c->uid) v[k++] = xasprintf("--user=%u:%u", c->uid, c->uid);
    if (c->dir[0]) v[k++] = xasprintf("--workdir=%s", c->dir);
    for (int i = 0; i < n_ours; i++) {
        const char *eq = strchr(ours[i], '=');
        if (!eq || eq == ours[i] || ours[i][0] == '-' || strncmp(ours[i], "TMPDIR=", 7) == 0) continue;
        v[k++] = xstrdup("--env");
        v[k++] = xstrndup(ours[i], (size_t)(eq - ours[i]));
    }
    v[k++] = xstrdup(c->container);
    if (c->argc) {
        for (int i = 0; i < c->argc; i++) v[k++] = xstrdup(c->argv[i]);
    } else {
        v[k++] = xstrdup("/bin/sh");
        v[k++] = xstrdup("-c");
        v[k++] = xstrdup(LOGIN_SHELL);
    }
    v[k] = NULL;
    return v;
}

static void argv_free(char **v) {
    for (size_t i = 0; v && v[i]; i++) free(v[i]);
    free(v);
}

/* ---------------------------------------------------------------- the relay */

struct relay {
    relay_cfg *cfg;
    client_conn k;
    ws_decoder dec;
    buf in;                      /* from the socket, not decoded yet */
    buf out;                     /* frames for the socket */
    buf to_cmd;                  /* stdin for the command */
    uint8_t *chunk;              /* a read's scratch */
    int sock_pending;            /* the socket may hold bytes poll does not show (TLS) */
    int peer_closed;             /* the client's Close came */
    int peer_gone;               /* the connection ended or failed */
    int close_sent, status_sent;
    pid_t pid;                   /* the command (its session's leader); 0 none */
    int exited, status;
    int64_t exited_at;
    int fd_out, fd_err, fd_in;   /* PTY master (all three the same fd with a tty) or pipes; -1 closed */
    int stdin_eof;               /* channel 5 came */
    int hup_sent;
    int64_t kill_at;             /* SIGKILL due (0 none) */
    int64_t linger_until;        /* after our Close */
};

static void queue_frame(relay *r, int opcode, const void *p, size_t n) {
    if (r->peer_gone || r->close_sent) return;
    if (ws_frame(&r->out, opcode, p, n, 0) < 0) {
        /* the bounds above leave room for every frame: cannot happen */
        log_error("session %s: no room for a frame of %zu bytes", r->cfg->session, n);
        r->peer_gone = 1;
    }
}

static void queue_close(relay *r, int code, const char *reason) {
    if (r->close_sent || r->peer_gone) {
        r->close_sent = 1;
        return;
    }
    uint8_t p[WS_CONTROL_MAX];
    p[0] = (uint8_t)(code >> 8);
    p[1] = (uint8_t)code;
    size_t n = strlen(reason);
    if (n > sizeof p - 2) n = sizeof p - 2;
    memcpy(p + 2, reason, n);
    queue_frame(r, WS_CLOSE, p, n + 2);
    r->close_sent = 1;
    r->linger_until = mono_ms() + RELAY_LINGER_MS;
}

/* The status frame (channel 3), then Close 1000. */
static void queue_status(relay *r, const char *json) {
    if (r->status_sent) return;
    size_t n = strlen(json);
    char *p = xmalloc(n + 1);
    p[0] = 3;
    memcpy(p + 1, json, n);
    queue_frame(r, WS_BINARY, p, n + 1);
    free(p);
    r->status_sent = 1;
    queue_close(r, 1000, "");
}

static void status_error(relay *r, int code, const char *why) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "exit", code);
    cJSON_AddStringToObject(o, "error", why);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!s) abort();
    log_warn("session %s (task %lld): %s", r->cfg->session, r->cfg->task, why);
    queue_status(r, s);
    cJSON_free(s);
}

/* In a container the command is conmon's child, not podman exec's: ending
 * podman exec leaves it running. Its processes are found by the variable
 * TRAINYARD_EXEC_SESSION=<session> that it (and what it starts) got, in
 * /proc/PID/environ of the host (the relay is root). The number signalled. */
static int session_kill(const relay *r, int sig) {
    if (!r->cfg->container[0]) return 0;
    char want[64];
    int wl = snprintf(want, sizeof want, "TRAINYARD_EXEC_SESSION=%s", r->cfg->session);
    DIR *d = opendir("/proc");
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    char *env = xmalloc(1 << 16);
    while ((e = readdir(d)) != NULL) {
        long pid;
        if (parse_long(e->d_name, 2, 1L << 30, &pid) < 0 || pid == (long)getpid()) continue;
        char path[64];
        snprintf(path, sizeof path, "/proc/%ld/environ", pid);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        ssize_t len = read(fd, env, (1 << 16) - 1);
        close(fd);
        for (ssize_t i = 0; len > 0 && i + wl <= len; i += (ssize_t)strnlen(env + i, (size_t)(len - i)) + 1) {
            if (memcmp(env + i, want, (size_t)wl) == 0 && (i + wl == len || env[i + wl] == '\0')) {
                if (kill((pid_t)pid, sig) == 0) n++;
                break;
            }
        }
    }
    free(env);
    closedir(d);
    return n;
}

/* Ends the command: SIGHUP to its session's group (and, in a container,
 * to its processes there) now, SIGKILL later. */
static void end_command(relay *r) {
    if (r->fd_in >= 0 && r->fd_in != r->fd_out) {
        close(r->fd_in);
        r->fd_in = -1;
    }
    if (!r->pid || r->hup_sent || (r->exited && !r->cfg->container[0])) return;
    r->hup_sent = 1;
    if (!r->exited && kill(-r->pid, SIGHUP) < 0) kill(r->pid, SIGHUP);
    session_kill(r, SIGHUP);
    r->kill_at = mono_ms() + RELAY_KILL_MS;
}

/* Starts the command (fork, isolation, exec). 0, or -1 with the status's
 * code and why. */
static int command_start(relay *r, int *code, char *why, size_t whylen) {
    relay_cfg *c = r->cfg;
    int isolated = c->uid != 0;
    char *ours[RELAY_MAX_ENV + 8];
    int n_ours = env_ours(c, ours, RELAY_MAX_ENV + 8);
    /* in a container: how its processes are found to end them (session_kill) */
    if (c->container[0] && n_ours < RELAY_MAX_ENV + 8) {
        char sv[64];
        snprintf(sv, sizeof sv, "TRAINYARD_EXEC_SESSION=%s", c->session);
        ours[n_ours++] = xstrdup(sv);
    }
    char **envp = env_build(c, ours, n_ours, isolated && !c->container[0]);
    char **pargv = NULL;
    char *shell_bash[] = {"bash", "-l", NULL}, *shell_sh[] = {"sh", "-l", NULL};
    char *const *argv = c->argc ? c->argv : shell_bash;
    if (c->container[0]) argv = pargv = podman_argv(c, ours, n_ours);
    const char *path = "/usr/local/bin:/usr/bin:/bin";
    for (size_t i = 0; envp[i]; i++)
        if (strncmp(envp[i], "PATH=", 5) == 0) path = envp[i] + 5;

    int rc = -1, mnt = -1, cgfd[ISO_CTLS], ep[2] = {-1, -1}, master = -1, slave = -1;
    int pin[2] = {-1, -1}, pout[2] = {-1, -1}, perr[2] = {-1, -1};
    for (int i = 0; i < ISO_CTLS; i++) cgfd[i] = -1;
    *code = 126;
    /* the worker's mount namespace, held before its pid could be reused */
    if (c->mount_ns && c->worker_pid > 0 && !c->container[0]) {
        char p[64];
        snprintf(p, sizeof p, "/proc/%d/ns/mnt", (int)c->worker_pid);
        mnt = open(p, O_RDONLY | O_CLOEXEC);
        if (mnt < 0 || (c->worker_ticks && proc_start_ticks(c->worker_pid) != c->worker_ticks)) {
            snprintf(why, whylen, "the task's worker (pid %d) is gone", (int)c->worker_pid);
            goto out;
        }
    }
    for (int i = 0; i < c->n_cg && !c->container[0]; i++) {
        char p[PATH_MAX + 16];
        if (sfmt(p, sizeof p, "%s/cgroup.procs", c->cg[i]) < 0 || (cgfd[i] = open(p, O_WRONLY | O_CLOEXEC)) < 0) {
            snprintf(why, whylen, "cannot join the task's cgroup %.300s: %s", c->cg[i], strerror(errno));
            goto out;
        }
    }
    if (pipe2(ep, O_CLOEXEC) < 0) goto sys_fail;
    if (c->tty) {
        char name[128];
        struct winsize ws = {.ws_row = (unsigned short)c->rows, .ws_col = (unsigned short)c->cols};
        if ((master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC)) < 0 || grantpt(master) < 0 || unlockpt(master) < 0 ||
            ptsname_r(master, name, sizeof name) != 0 || (slave = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC)) < 0 ||
            ioctl(master, TIOCSWINSZ, &ws) < 0)
            goto sys_fail;
        /* the task's uid owns its terminal, as login would make it */
        if (c->uid && (fchown(slave, c->uid, c->uid) < 0 || fchmod(slave, 0620) < 0)) goto sys_fail;
    } else if (pipe2(pin, O_CLOEXEC) < 0 || pipe2(pout, O_CLOEXEC) < 0 || pipe2(perr, O_CLOEXEC) < 0) {
        goto sys_fail;
    }

    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) goto sys_fail;
    if (pid == 0) {
        /* async-signal-safe calls only from here to exec */
        int in = c->tty ? slave : pin[0], o1 = c->tty ? slave : pout[1], o2 = c->tty ? slave : perr[1];
        if (dup2(in, 0) < 0 || dup2(o1, 1) < 0 || dup2(o2, 2) < 0) child_fail(ep[1], 126, "its stdin and stdout");
        /* nothing else of the relay's reaches the command (its socket to the
         * server); the error pipe still works until the exec closes it */
        if (close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) < 0) child_fail(ep[1], 126, "closing the relay's descriptors");
        for (int i = 0; i < c->n_cg; i++)
            if (cgfd[i] >= 0 && write(cgfd[i], "0", 1) != 1) child_fail(ep[1], 126, "joining the task's cgroup");
        if (mnt >= 0 && setns(mnt, CLONE_NEWNS) < 0) child_fail(ep[1], 126, "entering the task's mount namespace");
        if (setsid() < 0) child_fail(ep[1], 126, "setsid");
        if (c->tty && ioctl(0, TIOCSCTTY, 0) < 0) child_fail(ep[1], 126, "making the PTY its terminal");
        if (c->dir[0] && !c->container[0] && chdir(c->dir) < 0) child_fail(ep[1], 126, "entering the job directory");
        if (isolated && !c->container[0]) {
            if (setgroups(0, NULL) < 0) child_fail(ep[1], 126, "dropping supplementary groups");
            if (setresgid(c->uid, c->uid, c->uid) < 0) child_fail(ep[1], 126, "setresgid");
            if (setresuid(c->uid, c->uid, c->uid) < 0) child_fail(ep[1], 126, "setresuid");
            if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) child_fail(ep[1], 126, "PR_SET_NO_NEW_PRIVS");
        }
        /* after the change of uid, which clears the parent-death signal */
        if (proc_child_setup(parent, 0, SIGKILL, 0) < 0) child_fail(ep[1], 126, "the relay is gone");
        if (c->container[0]) {
            execve(argv[0], argv, envp);
            child_fail(ep[1], errno == ENOENT ? 127 : 126, "run podman");
        }
        exec_search(argv, envp, path);
        if (!c->argc) { /* no bash: the plain shell */
            exec_search(shell_sh, envp, path);
            argv = shell_sh;
        }
        child_fail(ep[1], errno == ENOENT ? 127 : 126, argv[0]);
    }
    close(ep[1]);
    ep[1] = -1;
    child_err ce;
    ssize_t n;
    do n = read(ep[0], &ce, sizeof ce);
    while (n < 0 && errno == EINTR);
    if (n == (ssize_t)sizeof ce) { /* it did not get to exec */
        ce.what[sizeof ce.what - 1] = '\0';
        int st;
        waitpid(pid, &st, 0);
        *code = ce.code;
        int is_exec = !c->container[0] && (strcmp(ce.what, argv[0]) == 0 || strcmp(ce.what, "sh") == 0);
        if (is_exec) snprintf(why, whylen, "cannot run %s: %s", ce.what, strerror(ce.err));
        else snprintf(why, whylen, "cannot start the command (%s): %s", ce.what, strerror(ce.err));
        goto out;
    }
    r->pid = pid;
    if (c->tty) {
        r->fd_out = r->fd_in = master;
        master = -1;
    } else {
        r->fd_in = pin[1];
        r->fd_out = pout[0];
        r->fd_err = perr[0];
        pin[1] = pout[0] = perr[0] = -1;
    }
    if ((r->fd_in >= 0 && proc_set_nonblock(r->fd_in) < 0) || proc_set_nonblock(r->fd_out) < 0 ||
        (r->fd_err >= 0 && proc_set_nonblock(r->fd_err) < 0))
        log_warn("session %s: cannot make the command's descriptors non-blocking: %s", c->session, strerror(errno));
    log_info("session %s (task %lld): started %s%s as pid %d%s", c->session, c->task,
             c->container[0] ? "podman exec into " : "", c->container[0] ? c->container : argv[0], (int)pid,
             c->tty ? " on a PTY" : "");
    rc = 0;
    goto out;
sys_fail:
    snprintf(why, whylen, "cannot start the command: %s", strerror(errno));
out:
    if (mnt >= 0) close(mnt);
    for (int i = 0; i < ISO_CTLS; i++)
        if (cgfd[i] >= 0) close(cgfd[i]);
    int fds[] = {ep[0], ep[1], master, slave, pin[0], pin[1], pout[0], pout[1], perr[0], perr[1]};
    for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++)
        if (fds[i] >= 0) close(fds[i]);
    free(envp);
    for (int i = 0; i < n_ours; i++) free(ours[i]);
    argv_free(pargv);
    return rc;
}

/* A resize (channel 4): {"cols": C, "rows": R}. */
static void on_resize(relay *r, const uint8_t *p, size_t n) {
    if (!r->cfg->tty || r->fd_out < 0) return;
    cJSON *o = cJSON_ParseWithLength((const char *)p, n);
    double cols = jnum(o, "cols", 1, 65535, 0), rows = jnum(o, "rows", 1, 65535, 0);
    cJSON_Delete(o);
    if (cols <= 0 || rows <= 0) {
        log_warn("session %s: a resize that is not {\"cols\": 1-65535, \"rows\": 1-65535}: ignored", r->cfg->session);
        return;
    }
    struct winsize ws = {.ws_row = (unsigned short)rows, .ws_col = (unsigned short)cols};
    if (ioctl(r->fd_out, TIOCSWINSZ, &ws) < 0) log_warn("session %s: TIOCSWINSZ: %s", r->cfg->session, strerror(errno));
}

static void to_stdin(relay *r, const uint8_t *p, size_t n) {
    if (r->stdin_eof || r->fd_in < 0 || !n) return;
    if (buf_append(&r->to_cmd, p, n) < 0) /* the bounds leave room: cannot happen */
        log_error("session %s: stdin over its bound: %zu bytes dropped", r->cfg->session, n);
}

static void on_message(relay *r, const ws_msg *m) {
    switch (m->opcode) {
    case WS_TEXT: /* a plain tool types */
        to_stdin(r, m->data, m->len);
        break;
    case WS_BINARY:
        if (!m->len) break;
        if (m->data[0] == 0) to_stdin(r, m->data + 1, m->len - 1);
        else if (m->data[0] == 4) on_resize(r, m->data + 1, m->len - 1);
        else if (m->data[0] == 5) r->stdin_eof = 1;
        break;
    case WS_PING:
        queue_frame(r, WS_PONG, m->data, m->len);
        break;
    case WS_CLOSE:
        r->peer_closed = 1;
        log_info("session %s: the client closed (%d)", r->cfg->session, m->close_code);
        queue_close(r, m->close_code == 1005 ? 1000 : m->close_code, "");
        end_command(r);
        break;
    default:
        break;
    }
}

static int can_read_sock(const relay *r) {
    return !r->peer_gone && !r->peer_closed && r->in.len < RELAY_IN_MAX && r->to_cmd.len < RELAY_STDIN_LOW &&
           r->out.len < RELAY_OUT_LOW;
}

/* Handles the whole frames that r->in holds. */
static void sock_decode(relay *r) {
    size_t at = 0;
    for (;;) {
        size_t used = 0;
        ws_msg m;
        int rc = ws_decode(&r->dec, (uint8_t *)r->in.data + at, r->in.len - at, &used, &m);
        at += used;
        if (rc < 0) {
            log_warn("session %s: %s: closing (%d)", r->cfg->session, r->dec.err, r->dec.close_code);
            queue_close(r, r->dec.close_code, r->dec.err);
            r->peer_closed = 1;
            end_command(r);
            break;
        }
        if (rc == 1) on_message(r, &m);
        if (!used || r->peer_closed) break;
    }
    if (at) {
        memmove(r->in.data, r->in.data + at, r->in.len - at);
        r->in.len -= at;
    }
}

static void sock_read(relay *r) {
    while (can_read_sock(r)) {
        size_t room = RELAY_IN_MAX - r->in.len;
        ssize_t n = client_conn_recv(&r->k, r->chunk, room < 65536 ? room : 65536);
        if (n == -2) {
            r->sock_pending = 0;
            return;
        }
        if (n <= 0) {
            if (!r->peer_closed) log_info("session %s: the connection ended", r->cfg->session);
            r->peer_gone = 1;
            end_command(r);
            return;
        }
        buf_append(&r->in, r->chunk, (size_t)n); /* room was checked */
        sock_decode(r);
        r->sock_pending = 1; /* more may wait: read until "nothing now" */
    }
}

static void sock_write(relay *r) {
    while (r->out.len && !r->peer_gone) {
        ssize_t n = client_conn_send(&r->k, r->out.data, r->out.len);
        if (n < 0) {
            r->peer_gone = 1;
            end_command(r);
            return;
        }
        if (n == 0) return;
        memmove(r->out.data, r->out.data + n, r->out.len - (size_t)n);
        r->out.len -= (size_t)n;
    }
    if (r->peer_gone) buf_reset(&r->out);
}

/* Reads the command's output from *fd into channel ch's frames. */
static void out_read(relay *r, int *fd, int ch) {
    for (int i = 0; i < 8 && *fd >= 0; i++) {
        if (r->out.len >= RELAY_OUT_LOW && !r->peer_gone && !r->close_sent) return;
        r->chunk[0] = (uint8_t)ch;
        ssize_t n = read(*fd, r->chunk + 1, RELAY_CHUNK);
        if (n > 0) {
            queue_frame(r, WS_BINARY, r->chunk, (size_t)n + 1); /* dropped once the peer is gone */
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        /* EOF, or EIO from a PTY whose every slave is closed */
        if (r->fd_in == *fd) r->fd_in = -1;
        close(*fd);
        *fd = -1;
    }
}

static void in_write(relay *r) {
    while (r->to_cmd.len && r->fd_in >= 0) {
        ssize_t n = write(r->fd_in, r->to_cmd.data, r->to_cmd.len);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (n < 0) { /* the command closed its stdin (EPIPE): what is left goes nowhere */
            buf_reset(&r->to_cmd);
            if (r->fd_in != r->fd_out) close(r->fd_in);
            r->fd_in = -1;
            return;
        }
        memmove(r->to_cmd.data, r->to_cmd.data + n, r->to_cmd.len - (size_t)n);
        r->to_cmd.len -= (size_t)n;
    }
    /* channel 5 on pipes: EOF once what came before it is written */
    if (r->stdin_eof && !r->to_cmd.len && r->fd_in >= 0 && r->fd_in != r->fd_out) {
        close(r->fd_in);
        r->fd_in = -1;
    }
}

/* The command's end: its status once reaped and its output drained. */
static void check_child(relay *r, int64_t now) {
    if (r->pid && !r->exited) {
        int st;
        pid_t w = waitpid(r->pid, &st, WNOHANG);
        if (w == r->pid || (w < 0 && errno == ECHILD)) {
            r->exited = 1;
            r->status = w == r->pid ? st : 0xff00;
            r->exited_at = now;
            kill(-r->pid, SIGKILL); /* what it left in its session goes with it */
            /* in a container too; after a SIGHUP, its SIGKILL waits its turn */
            if (!r->hup_sent) session_kill(r, SIGKILL);
            if (!r->hup_sent || !r->cfg->container[0]) r->kill_at = 0;
        }
    }
    if (r->kill_at && now >= r->kill_at) {
        if (!r->exited) {
            kill(-r->pid, SIGKILL);
            kill(r->pid, SIGKILL);
        }
        session_kill(r, SIGKILL);
        r->kill_at = 0;
    }
    if (!r->exited) return;
    if ((r->fd_out >= 0 || r->fd_err >= 0) && now - r->exited_at > RELAY_DRAIN_MS) {
        if (r->fd_out >= 0) close(r->fd_out);
        if (r->fd_err >= 0) close(r->fd_err);
        if (r->fd_in == r->fd_out) r->fd_in = -1;
        r->fd_out = r->fd_err = -1;
    }
    if (r->fd_out >= 0 || r->fd_err >= 0 || r->status_sent) return;
    if (r->fd_in >= 0) {
        close(r->fd_in);
        r->fd_in = -1;
    }
    int code, sig;
    char why[160];
    proc_exit_describe(r->status, &code, &sig, why, sizeof why);
    char json[96];
    if (sig) snprintf(json, sizeof json, "{\"exit\":%d,\"signal\":%d}", 128 + sig, sig);
    else snprintf(json, sizeof json, "{\"exit\":%d}", code < 0 ? 255 : code);
    log_info("session %s (task %lld): the command %s", r->cfg->session, r->cfg->task, why);
    queue_status(r, json);
}

static int relay_loop(relay *r, int sigfd) {
    for (;;) {
        int64_t now = mono_ms();
        check_child(r, now);
        int child_done = !r->pid || r->exited;
        if (child_done && !r->kill_at && r->close_sent && (r->peer_gone || !r->out.len) &&
            (r->peer_gone || r->peer_closed || now >= r->linger_until))
            return 0;
        struct pollfd pf[5];
        int ix_sock, ix_out = -1, ix_err = -1, ix_in = -1;
        int nf = 0;
        pf[nf].fd = sigfd;
        pf[nf++].events = POLLIN;
        ix_sock = nf;
        pf[nf].fd = r->peer_gone ? -1 : r->k.fd;
        pf[nf++].events = (short)((can_read_sock(r) ? POLLIN : 0) | (r->out.len ? POLLOUT : 0));
        int room = r->out.len < RELAY_OUT_LOW || r->peer_gone || r->close_sent;
        if (r->fd_out >= 0) {
            ix_out = nf;
            pf[nf].fd = r->fd_out;
            pf[nf++].events = (short)((room ? POLLIN : 0) | (r->fd_in == r->fd_out && r->to_cmd.len ? POLLOUT : 0));
        }
        if (r->fd_err >= 0) {
            ix_err = nf;
            pf[nf].fd = r->fd_err;
            pf[nf++].events = room ? POLLIN : 0;
        }
        if (r->fd_in >= 0 && r->fd_in != r->fd_out) {
            ix_in = nf;
            pf[nf].fd = r->fd_in;
            pf[nf++].events = r->to_cmd.len ? POLLOUT : 0;
        }
        int64_t wake = -1;
        if (r->kill_at) wake = r->kill_at;
        if (r->exited && (r->fd_out >= 0 || r->fd_err >= 0)) {
            int64_t d = r->exited_at + RELAY_DRAIN_MS + 1;
            wake = wake < 0 || d < wake ? d : wake;
        }
        if (r->close_sent && r->linger_until) wake = wake < 0 || r->linger_until < wake ? r->linger_until : wake;
        int timeout = wake < 0 ? -1 : (int)(wake > now ? wake - now : 0);
        if (r->sock_pending && can_read_sock(r)) timeout = 0;
        if (r->stdin_eof && !r->to_cmd.len && r->fd_in >= 0 && r->fd_in != r->fd_out) timeout = 0;
        if (timeout < 0 && child_done && !r->status_sent) timeout = 1000; /* cannot happen: check again */
        int pr = poll(pf, (nfds_t)nf, timeout);
        if (pr < 0 && errno != EINTR) {
            log_error("session %s: poll: %s", r->cfg->session, strerror(errno));
            return 1;
        }
        if (pr < 0) continue;
        if (pf[0].revents) {
            int chld = 0, term = 0;
            proc_sigpipe_drain(sigfd, &chld, &term);
            if (term && !r->close_sent) {
                log_info("session %s: stopped (the agent stops): ending the command", r->cfg->session);
                queue_close(r, 1001, "the node's agent stops");
                r->peer_closed = 1;
                end_command(r);
            }
        }
        if (pf[ix_sock].revents & (POLLOUT | POLLERR | POLLHUP)) sock_write(r);
        if ((pf[ix_sock].revents & (POLLIN | POLLERR | POLLHUP)) || r->sock_pending) sock_read(r);
        if (ix_out >= 0 && (pf[ix_out].revents & POLLOUT)) in_write(r);
        if (ix_out >= 0 && (pf[ix_out].revents & (POLLIN | POLLHUP | POLLERR))) out_read(r, &r->fd_out, 1);
        if (ix_err >= 0 && (pf[ix_err].revents & (POLLIN | POLLHUP | POLLERR))) out_read(r, &r->fd_err, 2);
        if (ix_in >= 0 && pf[ix_in].revents) in_write(r);
        if (r->stdin_eof) in_write(r);
        if (r->out.len) sock_write(r);
    }
}

int cmd_exec_relay(int argc, char **argv) {
    (void)argv;
    log_set_prefix("exec-relay");
    if (argc != 1) {
        fprintf(stderr, "trainyard exec-relay takes no arguments: the agent starts it, with TRAINYARD_EXEC\n");
        return 2;
    }
    const char *text = getenv("TRAINYARD_EXEC");
    if (!text || !*text) {
        fprintf(stderr, "trainyard exec-relay: no TRAINYARD_EXEC (the agent starts it)\n");
        return 2;
    }
    relay_cfg *cfg = xcalloc(1, sizeof *cfg);
    char why[600];
    int bad = cfg_parse(text, cfg, why, sizeof why);
    unsetenv("TRAINYARD_EXEC"); /* it holds the node's token: not for the command */
    if (bad < 0) {
        log_error("%s", why);
        cfg_release(cfg);
        free(cfg);
        return 2;
    }
    int sigfd = proc_sigpipe_open();
    relay r;
    memset(&r, 0, sizeof r);
    r.cfg = cfg;
    r.fd_out = r.fd_err = r.fd_in = -1;
    client c;
    if (sigfd < 0 || client_init(&c, cfg->server, cfg->token) < 0) {
        log_error("session %s: cannot set up: %s", cfg->session, strerror(errno));
        cfg_release(cfg);
        free(cfg);
        return 1;
    }
    char path[160];
    snprintf(path, sizeof path, "/api/v1/nodes/%lld/exec/%s", cfg->node, cfg->session);
    char err[1500];
    int rc = client_upgrade(&c, path, "Connection: Upgrade\r\nUpgrade: trainyard-exec\r\n", RELAY_CONNECT_MS, &r.k,
                            err, sizeof err);
    explicit_bzero(c.token, sizeof c.token);
    client_release(&c);
    if (rc < 0 || r.k.status != 101) {
        if (rc < 0) log_error("session %s: %s", cfg->session, err);
        else log_error("session %s: the server answered %ld: %.300s", cfg->session, r.k.status,
                       r.k.body.data ? r.k.body.data : "");
        if (rc == 0) client_conn_close(&r.k);
        cfg_release(cfg);
        free(cfg);
        return 1;
    }
    ws_decoder_init(&r.dec, 1, RELAY_FRAME_MAX, RELAY_FRAME_MAX);
    buf_init(&r.in, RELAY_IN_MAX);
    buf_init(&r.out, RELAY_OUT_MAX);
    buf_init(&r.to_cmd, RELAY_STDIN_MAX);
    r.chunk = xmalloc(65536 > RELAY_CHUNK + 1 ? 65536 : RELAY_CHUNK + 1);
    if (r.k.extra.len) buf_append(&r.in, r.k.extra.data, r.k.extra.len);
    r.sock_pending = 1;
    int code = 126;
    if (cfg->error[0]) {
        status_error(&r, 126, cfg->error);
    } else if (command_start(&r, &code, why, sizeof why) < 0) {
        status_error(&r, code, why);
    }
    sock_decode(&r); /* what came with the 101 */
    int ret = relay_loop(&r, sigfd);
    if (r.pid && !r.exited) { /* the loop failed: nothing of the session stays */
        kill(-r.pid, SIGKILL);
        kill(r.pid, SIGKILL);
        waitpid(r.pid, NULL, 0);
    }
    int fds[] = {r.fd_out, r.fd_err, r.fd_in != r.fd_out ? r.fd_in : -1};
    for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++)
        if (fds[i] >= 0) close(fds[i]);
    client_conn_close(&r.k);
    ws_decoder_release(&r.dec);
    buf_release(&r.in);
    buf_release(&r.out);
    buf_release(&r.to_cmd);
    free(r.chunk);
    cfg_release(cfg);
    free(cfg);
    return ret;
}
