/* up.c - `trainyard up`: the embedded default, a server and one local agent
 * on this machine. Two child processes of the running binary: the server
 * first (it writes DIR/server.url once it listens), then an agent pointed at
 * that URL with DIR/node.token. SIGINT/SIGTERM stop the agent (which stops
 * its workers) and then the server; if either child dies, the other is
 * stopped too and `up` exits non-zero. If `up` itself is killed, its
 * children get SIGTERM (PR_SET_PDEATHSIG) and stop the same way.
 *
 * defines: cmd_up */
#include "up.h"
#include "../server/server.h"
#include "../common/util.h"
#include "../executor/proc.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define UP_MAX_ARGS 48
#define UP_WORKER_NICE "10"          /* the tasks' nice value unless --worker-nice says otherwise */

static void up_usage(FILE *f) {
    fprintf(f,
            "usage: trainyard up [--listen ADDR:PORT] [--apps-listen ADDR:PORT] [--data DIR] [--cpu-slots N]\n"
            "                    [--data-root DIR]\n"
            "                    [--hostname H] [--worker-nice N] [--worker-sched normal|idle]\n"
            "                    [agent flags: --isolation, --task-uids, --task-dir, --task-pids-max, --memory,\n"
            "                     --podman, --podman-runtime, --cache-dir, --cache-max-mb]\n"
            "                    [--log-level debug|info|warn|error] [--log-format text|json] [--access-log F]\n"
            "                    [server flags: --durability, --heartbeat-timeout, --resize-interval, --public-url, --quiet,\n"
            "                     --log-retention-days, --audit-retention-days,\n"
            "                     --tls auto, --tls-cert F --tls-key F, --insecure-http,\n"
            "                     --context-max-mb, --context-max-files, --context-max-unpacked-mb,\n"
            "                     --context-quota-mb, --context-grace-s,\n"
            "                     --disk-reserve, --log-max-per-job-default, --log-max-per-job,\n"
            "                     --db postgres://..., --db-password-file F, --lease-ttl D]\n"
            "  --tls auto: HTTPS with the server's own CA (DATA/tls/ca.crt), which the agent trusts;\n"
            "  the server (default 127.0.0.1:8080, data in ./.trainyard) and one local agent;\n"
            "  the agent runs training under SCHED_IDLE at nice " UP_WORKER_NICE " (--worker-sched normal\n"
            "  and --worker-nice 0 turn that off), so the API answers at once while jobs use\n"
            "  every core the server leaves them;\n"
            "  Ctrl-C stops both (and the agent's workers).\n");
}

static pid_t up_spawn(const char *exe, char *const argv[]) {
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        /* `up` killed outright (SIGKILL, OOM) must not leave its server and
         * agent holding the port and the data directory: SIGTERM them when
         * it dies, which stops them as Ctrl-C would. */
        /* A process group of its own: the terminal's Ctrl-C (SIGINT to the
         * foreground group) reaches `up` alone, which stops the agent
         * first, while the server still answers its drain and reports,
         * then the server. */
        if (proc_child_setup(parent, 1, SIGTERM, 0) < 0) _exit(127);
        execv(exe, argv);
        _exit(127);
    }
    return pid;
}

/* SIGTERM to pid, then SIGKILL after grace_ms; reaps it. */
static void up_stop_child(pid_t pid, int grace_ms) {
    if (pid <= 0) return;
    kill(pid, SIGTERM);
    for (int t = 0; t < grace_ms; t += 50) {
        int st;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid || (r < 0 && errno == ECHILD)) return;
        usleep(50 * 1000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* ---------------------------------------------------------------- cmd_up, by phase
 *
 * The flags split between the server and the agent; the files in the data
 * directory; the server started; its URL awaited; the agent started; both
 * watched until a stop signal or the end of either; both stopped. One
 * up_run holds what the phases share; a phase returns UP_ON to go on, else
 * the exit status. */

#define UP_ON (-1)

typedef struct up_run {
    char exe[PATH_MAX];
    char *srv_argv[UP_MAX_ARGS];     /* the server's command line (NULL-terminated) */
    char *agent_extra[UP_MAX_ARGS];  /* the user's flags for the agent */
    int ns, na;
    server_options so;               /* what up reads of the server's flags: --data, --tls auto */
    char urlfile[PATH_MAX + 32], tokfile[PATH_MAX + 32], statefile[PATH_MAX + 32], cafile[PATH_MAX + 32];
    int sigfd;
    pid_t srv, agent;
    int stop;                        /* a stop signal came before the server listened */
    char url[256];                   /* the server's, from server.url */
} up_run;

/* An agent's flag (with its value, it goes to the agent only). */
static int up_agent_flag(const char *a) {
    return strcmp(a, "--cpu-slots") == 0 || strcmp(a, "--data-root") == 0 || strcmp(a, "--hostname") == 0 ||
           strcmp(a, "--address") == 0 || strcmp(a, "--worker-nice") == 0 || strcmp(a, "--worker-sched") == 0 ||
           strcmp(a, "--isolation") == 0 || strcmp(a, "--task-uids") == 0 || strcmp(a, "--task-dir") == 0 ||
           strcmp(a, "--task-pids-max") == 0 || strcmp(a, "--memory") == 0 || strcmp(a, "--podman") == 0 ||
           strcmp(a, "--podman-runtime") == 0 || strcmp(a, "--cache-dir") == 0 || strcmp(a, "--cache-max-mb") == 0;
}

/* A server's flag that takes a value. */
static int up_server_value_flag(const char *a) {
    return strcmp(a, "--listen") == 0 || strcmp(a, "--data") == 0 || strcmp(a, "--durability") == 0 ||
           strcmp(a, "--heartbeat-timeout") == 0 || strcmp(a, "--resize-interval") == 0 ||
           strcmp(a, "--access-log") == 0 || strcmp(a, "--public-url") == 0 || strcmp(a, "--tls") == 0 ||
           strcmp(a, "--apps-listen") == 0 || strcmp(a, "--apps-url") == 0 || strcmp(a, "--tls-cert") == 0 || strcmp(a, "--tls-key") == 0 || strcmp(a, "--auth-fail-limit") == 0 ||
           strcmp(a, "--db-resident-mb") == 0 || strcmp(a, "--log-retention-days") == 0 ||
           strcmp(a, "--audit-retention-days") == 0 ||
           strncmp(a, "--context-", 10) == 0 || strcmp(a, "--disk-reserve") == 0 || strncmp(a, "--backup-", 9) == 0 || strncmp(a, "--blob-", 7) == 0 ||
           strcmp(a, "--log-max-per-job-default") == 0 || strcmp(a, "--log-max-per-job") == 0 ||
           strcmp(a, "--db") == 0 || strcmp(a, "--db-password-file") == 0 || strcmp(a, "--lease-ttl") == 0;
}

/* Splits the flags: the agent's go to the agent, the rest to the server
 * (which validates them); the console's level and format go to both. */
static int up_flags(up_run *u, int argc, char **argv) {
    if (proc_self_exe(u->exe, sizeof u->exe) < 0) {
        fprintf(stderr, "trainyard up: cannot find the running binary\n");
        return 1;
    }
    u->srv_argv[u->ns++] = u->exe;
    u->srv_argv[u->ns++] = "server";
    server_options_default(&u->so);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            up_usage(stdout);
            return 0;
        }
        int agent_flag = up_agent_flag(a);
        int both = strcmp(a, "--log-level") == 0 || strcmp(a, "--log-format") == 0;
        int takes_value = agent_flag || both || up_server_value_flag(a);
        if (strcmp(a, "--tls") == 0 && i + 1 < argc && strcmp(argv[i + 1], "auto") == 0) u->so.tls_auto = 1;
        if (both && i + 1 < argc) {
            u->agent_extra[u->na++] = argv[i];
            u->agent_extra[u->na++] = argv[i + 1];
            log_level l;
            log_format f;
            if (strcmp(a, "--log-level") == 0 && log_level_parse(argv[i + 1], &l) == 0) log_set_level(l);
            if (strcmp(a, "--log-format") == 0 && log_format_parse(argv[i + 1], &f) == 0) log_set_format(f);
        }
        if (takes_value && i + 1 >= argc) {
            fprintf(stderr, "trainyard up: %s wants a value\n", a);
            return 2;
        }
        if (u->ns + 2 >= UP_MAX_ARGS || u->na + 2 >= UP_MAX_ARGS) {
            fprintf(stderr, "trainyard up: too many arguments\n");
            return 2;
        }
        if (agent_flag) {
            u->agent_extra[u->na++] = argv[i];
            u->agent_extra[u->na++] = argv[++i];
            continue;
        }
        if (strcmp(a, "--data") == 0 && sfmt(u->so.data_dir, sizeof u->so.data_dir, "%s", argv[i + 1]) < 0) {
            fprintf(stderr, "trainyard up: --data path too long\n");
            return 2;
        }
        u->srv_argv[u->ns++] = argv[i];
        if (takes_value) u->srv_argv[u->ns++] = argv[++i];
    }
    u->srv_argv[u->ns] = NULL;
    log_set_prefix("up");
    return UP_ON;
}

/* The files of the data directory up reads or names: server.url (a stale
 * one removed), the CA, node.token, agent.state. */
static int up_files(up_run *u) {
    const char *data = u->so.data_dir;
    if (sfmt(u->urlfile, sizeof u->urlfile, "%s/server.url", data) < 0 ||
        sfmt(u->cafile, sizeof u->cafile, "%s/tls/ca.crt", data) < 0 ||
        sfmt(u->tokfile, sizeof u->tokfile, "%s/node.token", data) < 0 ||
        sfmt(u->statefile, sizeof u->statefile, "%s/agent.state", data) < 0) {
        fprintf(stderr, "trainyard up: --data path too long\n");
        return 2;
    }
    unlink(u->urlfile); /* a stale one from an earlier run must not be mistaken for ours */
    return UP_ON;
}

/* The signal pipe, and the server started. */
static int up_start_server(up_run *u) {
    u->sigfd = proc_sigpipe_open();
    if (u->sigfd < 0) {
        log_error("cannot install signal handlers: %s", strerror(errno));
        return 1;
    }
    u->srv = up_spawn(u->exe, u->srv_argv);
    if (u->srv < 0) {
        log_error("cannot start the server: %s", strerror(errno));
        return 1;
    }
    return UP_ON;
}

/* Waits for the server to listen (it writes server.url after binding), 30
 * s at most; a stop signal meanwhile sets u->stop. */
static int up_await_server(up_run *u) {
    for (int i = 0; i < 600 && !u->url[0]; i++) {
        int chld = 0, term = 0;
        proc_sigpipe_drain(u->sigfd, &chld, &term);
        if (term) {
            u->stop = 1;
            break;
        }
        int st;
        if (waitpid(u->srv, &st, WNOHANG) == u->srv) {
            log_error("the server exited before listening (see the messages above)");
            return 1;
        }
        size_t len = 0;
        char *s = file_read_all(u->urlfile, sizeof u->url - 1, &len);
        if (s) {
            while (len && (s[len - 1] == '\n' || s[len - 1] == '\r')) s[--len] = '\0';
            snprintf(u->url, sizeof u->url, "%s", s);
            free(s);
            break;
        }
        usleep(50 * 1000);
    }
    if (!u->stop && !u->url[0]) {
        log_error("the server did not start listening within 30 s");
        up_stop_child(u->srv, 5000);
        return 1;
    }
    return UP_ON;
}

/* The agent started, pointed at the server with its token and state
 * files (and the server's own CA under --tls auto). */
static int up_start_agent(up_run *u) {
    char *ag_argv[UP_MAX_ARGS + 8];
    int n = 0;
    ag_argv[n++] = u->exe;
    ag_argv[n++] = "agent";
    ag_argv[n++] = "--server";
    ag_argv[n++] = u->url;
    ag_argv[n++] = "--token-file";
    ag_argv[n++] = u->tokfile;
    ag_argv[n++] = "--state-file";
    ag_argv[n++] = u->statefile;
    if (u->so.tls_auto) { /* the server's own CA, read from its directory */
        ag_argv[n++] = "--ca-cert";
        ag_argv[n++] = u->cafile;
    }
    /* the server shares these cores: training takes only the time the
     * server and the agent leave (SCHED_IDLE: a waking server thread
     * takes the core at once; docs/server.md "Training beside the
     * server"); a later --worker-sched or --worker-nice of the user's
     * overrides these */
    ag_argv[n++] = "--worker-sched";
    ag_argv[n++] = "idle";
    ag_argv[n++] = "--worker-nice";
    ag_argv[n++] = UP_WORKER_NICE;
    for (int i = 0; i < u->na; i++) ag_argv[n++] = u->agent_extra[i];
    ag_argv[n] = NULL;
    u->agent = up_spawn(u->exe, ag_argv);
    if (u->agent < 0) {
        log_error("cannot start the agent: %s", strerror(errno));
        up_stop_child(u->srv, 10000);
        return 1;
    }
    log_info("server %s (pid %d) and local agent (pid %d) running; Ctrl-C stops both", u->url, (int)u->srv,
             (int)u->agent);
    return UP_ON;
}

/* Both running: until a stop signal (0) or the end of either (1, the
 * other stopped next). */
static int up_watch(up_run *u) {
    for (;;) {
        struct pollfd pf = {.fd = u->sigfd, .events = POLLIN};
        if (poll(&pf, 1, 1000) < 0 && errno != EINTR) return 1;
        int chld = 0, term = 0;
        proc_sigpipe_drain(u->sigfd, &chld, &term);
        if (term) return 0;
        int st;
        if (waitpid(u->srv, &st, WNOHANG) == u->srv) {
            log_error("the server exited (status %d): stopping the agent", st);
            u->srv = 0;
            return 1;
        }
        if (waitpid(u->agent, &st, WNOHANG) == u->agent) {
            log_error("the agent exited (status %d): stopping the server", st);
            u->agent = 0;
            return 1;
        }
    }
}

int cmd_up(int argc, char **argv) {
    up_run u;
    memset(&u, 0, sizeof u);
    int rc = up_flags(&u, argc, argv);
    if (rc == UP_ON) rc = up_files(&u);
    if (rc == UP_ON) rc = up_start_server(&u);
    if (rc == UP_ON) rc = up_await_server(&u);
    if (rc == UP_ON && !u.stop) rc = up_start_agent(&u);
    if (rc != UP_ON) return rc;
    rc = u.stop ? 0 : up_watch(&u);
    log_info("stopping the agent and the server");
    /* The agent first: it stops its workers (grace 10 s) and reports their exits. */
    up_stop_child(u.agent, 20000);
    up_stop_child(u.srv, 15000);
    return rc;
}
