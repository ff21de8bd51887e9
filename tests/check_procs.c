/* check_procs.c - how the service's processes end and come back, on real
 * processes: `trainyard up` killed outright takes its server and agent with
 * it; an agent told to stop while its server is gone exits within seconds;
 * an agent killed with -9 and started again gets its node's work back at
 * once (not after a long-poll period). */
#include <check.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <sched.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>

#include "testlib.h"

static ty_proc srv;
static char team_tok[128];

static const char LONG_JOB[] =
    "{\"name\": \"long\", \"model\": {\"layers\": ["
    " {\"type\": \"dense\", \"units\": 16, \"activation\": \"relu\", \"input_shape\": [10]},"
    " {\"type\": \"dense\", \"units\": 1, \"activation\": \"sigmoid\"}]},"
    " \"compile\": {\"optimizer\": \"sgd\", \"loss\": \"binary_crossentropy\"},"
    " \"data\": {\"source\": \"synthetic\", \"examples\": 4096, \"features\": 10, \"seed\": 1},"
    " \"fit\": {\"epochs\": 100000, \"batch_size\": 64}, \"max_runtime_s\": 600}";

static int64_t submit(void) {
    cJSON *o = NULL;
    long st = ty_http(srv.url, team_tok, "POST", "/api/v1/jobs", LONG_JOB, &o);
    ck_assert_msg(st == 201, "submit answered %ld", st);
    int64_t id = (int64_t)cJSON_GetObjectItem(o, "id")->valuedouble;
    cJSON_Delete(o);
    return id;
}

/* Waits until job id is `want` at attempt >= min_attempt; returns ms waited
 * or -1 on timeout. */
static int64_t wait_job(int64_t id, const char *want, int min_attempt, int timeout_s) {
    int64_t t0 = mono_ms(), end = t0 + (int64_t)timeout_s * 1000;
    char path[64];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld", (long long)id);
    while (mono_ms() < end) {
        cJSON *o = NULL;
        ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", path, NULL, &o), 200);
        const cJSON *s = cJSON_GetObjectItem(o, "state"), *a = cJSON_GetObjectItem(o, "attempt");
        int ok = cJSON_IsString(s) && strcmp(s->valuestring, want) == 0 && cJSON_IsNumber(a) &&
                 a->valueint >= min_attempt;
        cJSON_Delete(o);
        if (ok) return mono_ms() - t0;
        ty_sleep_ms(100);
    }
    return -1;
}

static pid_t agent_start_slots(const char *tag, const char *slots) {
    char tokfile[400], logf[400], statef[400];
    snprintf(statef, sizeof statef, "%s/agent.state", srv.dir);
    snprintf(tokfile, sizeof tokfile, "%s/node.token", srv.dir);
    snprintf(logf, sizeof logf, "%s/agent-%s.log", srv.dir, tag);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        FILE *lf = freopen(logf, "a", stderr);
        (void)lf;
        /* the default long-poll wait (20 s): what a restarted agent used to wait out */
        execl(ty_bin(), ty_bin(), "agent", "--server", srv.url, "--token-file", tokfile, "--hostname", "procs-node",
              "--cpu-slots", slots, "--heartbeat", "1", "--state-file", statef, (char *)NULL);
        _exit(127);
    }
    return pid;
}

static pid_t agent_start(const char *tag) { return agent_start_slots(tag, "1"); }

/* Waits up to timeout_ms for pid (a child) to exit; ms taken or -1. */
static int64_t wait_exit(pid_t pid, int timeout_ms) {
    int64_t t0 = mono_ms();
    while (mono_ms() - t0 < timeout_ms) {
        int st;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid || (r < 0 && errno == ECHILD)) return mono_ms() - t0;
        ty_sleep_ms(20);
    }
    return -1;
}

/* pids of the processes whose parent is ppid (from /proc). */
static int children_of(pid_t ppid, pid_t *out, int cap) {
    int n = 0;
    DIR *d = opendir("/proc");
    ck_assert_ptr_nonnull(d);
    struct dirent *e;
    while ((e = readdir(d)) && n < cap) {
        char *endp;
        long pid = strtol(e->d_name, &endp, 10);
        if (*endp || pid <= 0) continue;
        char path[64], text[512];
        snprintf(path, sizeof path, "/proc/%ld/stat", pid);
        const char *fields = ty_proc_stat(path, text, sizeof text);
        char state;
        int pp;
        if (fields && sscanf(fields, " %c %d", &state, &pp) == 2 && pp == ppid) out[n++] = (pid_t)pid;
    }
    closedir(d);
    return n;
}

/* Reaps our children (orphans we adopted as subreaper) until none is left
 * or timeout_ms passes; how many are left. */
static int reap_children(int timeout_ms) {
    pid_t rest[8];
    int64_t t0 = mono_ms();
    int m;
    while ((m = children_of(getpid(), rest, 8)) > 0 && mono_ms() - t0 < timeout_ms) {
        for (int i = 0; i < m; i++) waitpid(rest[i], NULL, WNOHANG);
        ty_sleep_ms(50);
    }
    return m;
}

/* The nice value and scheduling policy of every thread of pid (from
 * /proc/PID/task/TID/stat, fields 19 and 41): how many threads, with the
 * lowest and highest nice seen and a mask of 1 << policy (SCHED_OTHER 0,
 * SCHED_IDLE 5). */
static int thread_sched(pid_t pid, int *lo, int *hi, unsigned *policies) {
    char dir[64];
    snprintf(dir, sizeof dir, "/proc/%d/task", (int)pid);
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    *lo = 100;
    *hi = -100;
    *policies = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[384], text[1024];
        snprintf(path, sizeof path, "%s/%s/stat", dir, e->d_name);
        const char *fields = ty_proc_stat(path, text, sizeof text);
        int nice;
        /* after "(comm)": state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
         * utime stime cutime cstime priority nice */
        if (!fields || sscanf(fields, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %d", &nice) != 1)
            continue;
        /* field 41 (policy) is the 39th after "(comm)" */
        const char *f = fields;
        for (int k = 1; k < 39 && f; k++) {
            f = strchr(f + 1, ' ');
        }
        unsigned policy;
        if (!f || sscanf(f, " %u", &policy) != 1 || policy > 31) continue;
        if (nice < *lo) *lo = nice;
        if (nice > *hi) *hi = nice;
        *policies |= 1u << policy;
        n++;
    }
    closedir(d);
    return n;
}

static int port_open(const char *url) {
    const char *p = strrchr(url, ':');
    ck_assert_ptr_nonnull(p);
    int port = atoi(p + 1);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

static void setup(void) {
    memset(&srv, 0, sizeof srv);
    ty_mkdtemp(srv.dir, sizeof srv.dir, "procs");
    /* orphans (the server and agent of a killed `up`) become our children */
    ck_assert_int_eq(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
}

static void teardown(void) {
    ty_kill(&srv, SIGKILL);
    ty_rmrf(srv.dir);
}

/* kill -9 of `up` while a job trains: its server, agent and worker stop
 * (they held the port and the data directory before). */
START_TEST(up_killed_takes_its_children)
{
    const char *extra[] = {"--cpu-slots", "1", NULL};
    ty_server_start_args(&srv, "up", extra);
    ty_token(&srv, "token", team_tok, sizeof team_tok);
    int64_t id = submit();
    ck_assert_msg(wait_job(id, "running", 1, 60) >= 0, "the job did not start");
    pid_t kids[8];
    int n = children_of(srv.pid, kids, 8);
    ck_assert_int_eq(n, 2); /* server and agent */
    /* up runs training under SCHED_IDLE at nice 10 (every thread of the
     * worker), its server and agent as SCHED_OTHER at 0. The job is running
     * once the agent has forked the worker, which sets its priority after
     * entering its isolation: wait for that (at most 10 s) */
    int workers = 0, lo, hi;
    unsigned pol;
    for (int t = 0; t < 200; t++) {
        int settled = 1;
        for (int i = 0; i < n; i++) {
            pid_t w[4];
            int nw = children_of(kids[i], w, 4);
            for (int k = 0; k < nw; k++)
                if (thread_sched(w[k], &lo, &hi, &pol) <= 0 || lo != 10 || hi != 10) settled = 0;
        }
        if (settled) break;
        ty_sleep_ms(50);
    }
    for (int i = 0; i < n; i++) {
        ck_assert_int_gt(thread_sched(kids[i], &lo, &hi, &pol), 0);
        ck_assert_msg(lo == 0 && hi == 0, "up's child %d runs at nice %d..%d", (int)kids[i], lo, hi);
        ck_assert_msg(pol == 1u << SCHED_OTHER, "up's child %d runs under policies 0x%x", (int)kids[i], pol);
        pid_t w[4];
        int nw = children_of(kids[i], w, 4);
        for (int k = 0; k < nw; k++, workers++) {
            ck_assert_int_gt(thread_sched(w[k], &lo, &hi, &pol), 0);
            ck_assert_msg(lo == 10 && hi == 10, "the worker %d runs at nice %d..%d", (int)w[k], lo, hi);
            ck_assert_msg(pol == 1u << SCHED_IDLE, "the worker %d runs under policies 0x%x", (int)w[k], pol);
        }
    }
    ck_assert_int_eq(workers, 1);
    pid_t up = srv.pid;
    kill(up, SIGKILL);
    ck_assert_int_ge(wait_exit(up, 5000), 0);
    srv.pid = 0;
    /* the agent's worker is a grandchild: it reparents to us when the agent ends */
    for (int i = 0; i < n; i++) {
        int64_t ms = wait_exit(kids[i], 20000);
        ck_assert_msg(ms >= 0, "pid %d (a child of up) still runs 20 s after up was killed", (int)kids[i]);
        printf("up killed: child %d exited after %lld ms\n", (int)kids[i], (long long)ms);
    }
    ck_assert_msg(!port_open(srv.url), "the server port still answers");
    int m = reap_children(15000);
    ck_assert_msg(m == 0, "%d process(es) of up are left (a worker?)", m);
    /* the data directory is free again: up starts on it */
    ty_server_start_args(&srv, "up", extra);
    ck_assert_int_ge(wait_job(id, "running", 2, 60), 0); /* and the job goes on, attempt 2 */
}
END_TEST

/* Ctrl-C in the terminal of `trainyard up` (SIGINT to its whole process
 * group) while a job trains: `up` stops the agent first, which drains its
 * node and reports its task's exit while the server still answers, then
 * the server. The agent used to get the SIGINT at the same moment as the
 * server, and logged "server unreachable ... could not drain". */
START_TEST(up_ctrl_c_stops_agent_first)
{
    snprintf(srv.log, sizeof srv.log, "%s/up.log", srv.dir);
    char urlfile[400];
    snprintf(urlfile, sizeof urlfile, "%s/server.url", srv.dir);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        setpgid(0, 0); /* as a shell puts a job in its own group */
        FILE *lf = freopen(srv.log, "a", stderr);
        (void)lf;
        execl(ty_bin(), ty_bin(), "up", "--listen", "127.0.0.1:0", "--data", srv.dir, "--cpu-slots", "1",
              (char *)NULL);
        _exit(127);
    }
    setpgid(pid, pid);
    srv.pid = pid;
    for (int i = 0; i < 300 && !srv.url[0]; i++) {
        size_t len = 0;
        char *u = file_read_all(urlfile, 256, &len);
        if (u) {
            while (len && u[len - 1] == '\n') u[--len] = '\0';
            snprintf(srv.url, sizeof srv.url, "%s", u);
            free(u);
        } else {
            ty_sleep_ms(50);
        }
    }
    ck_assert_msg(srv.url[0], "up did not start; see %s", srv.log);
    ty_token(&srv, "token", team_tok, sizeof team_tok);
    int64_t id = submit();
    ck_assert_msg(wait_job(id, "running", 1, 60) >= 0, "the job did not start");
    ck_assert_int_eq(kill(-pid, SIGINT), 0); /* the terminal's Ctrl-C */
    int64_t ms = wait_exit(pid, 30000);
    ck_assert_msg(ms >= 0, "up still runs 30 s after Ctrl-C");
    srv.pid = 0;
    printf("up: Ctrl-C -> exited in %lld ms\n", (long long)ms);
    size_t len = 0;
    char *log = file_read_all(srv.log, 1 << 22, &len);
    ck_assert_ptr_nonnull(log);
    const char *tail = len > 3000 ? log + len - 3000 : log; /* what the messages quote */
    ck_assert_msg(strstr(log, "drained: the server hands it no new task") != NULL, "the node was not drained:\n%s",
                  tail);
    ck_assert_msg(strstr(log, "unreachable") == NULL && strstr(log, "could not drain") == NULL,
                  "the agent lost the server while stopping:\n%s", tail);
    ck_assert_msg(strstr(log, "status report(s) not delivered") == NULL, "reports were lost:\n%s", tail);
    free(log);
    reap_children(15000);
}
END_TEST

/* The console of `up` tells a person what happened (the node joining, the
 * job submitted, placed, running, cancelled; the stop), not every request:
 * those go to DIR/access.log in the Common Log Format. With --log-level
 * debug --log-format json every console line is a JSON object and the
 * requests are there too. */
START_TEST(up_console_tells_what_happened)
{
    const char *extra[] = {"--cpu-slots", "1", NULL};
    ty_server_start_args(&srv, "up", extra);
    ty_token(&srv, "token", team_tok, sizeof team_tok);
    int64_t id = submit();
    ck_assert_msg(wait_job(id, "running", 1, 60) >= 0, "the job did not start");
    char path[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/cancel", (long long)id);
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", path, NULL, &o), 200);
    cJSON_Delete(o);
    ck_assert_int_ge(wait_job(id, "cancelled", 1, 30), 0);
    ty_sleep_ms(1500); /* a heartbeat or two and a long-poll more */
    ty_kill(&srv, SIGTERM);
    size_t len = 0;
    char *log = file_read_all(srv.log, 1 << 22, &len);
    ck_assert_ptr_nonnull(log);
    const char *tail = len > 3000 ? log + len - 3000 : log;
    char want[6][96];
    snprintf(want[0], sizeof want[0], "node 1 (");
    snprintf(want[1], sizeof want[1], "job %lld: queued (team:default (service)): submitted", (long long)id);
    snprintf(want[2], sizeof want[2], "job %lld: queued -> starting (scheduler): placed on", (long long)id);
    snprintf(want[3], sizeof want[3], "job %lld: starting -> running", (long long)id);
    snprintf(want[4], sizeof want[4], "-> cancelled (team:default (service))");
    snprintf(want[5], sizeof want[5], "server info: stopped");
    for (int i = 0; i < 6; i++) ck_assert_msg(strstr(log, want[i]) != NULL, "the console lacks '%s':\n%s", want[i], tail);
    ck_assert_msg(strstr(log, " /api/v1/") == NULL, "the console shows requests at info:\n%s", tail);
    free(log);
    /* the requests are in the access log, one line each, Common Log Format */
    char alog[320];
    snprintf(alog, sizeof alog, "%s/access.log", srv.dir);
    char *a = file_read_all(alog, 1 << 22, &len);
    ck_assert_ptr_nonnull(a);
    ck_assert_msg(strstr(a, "127.0.0.1 - team:default [") && strstr(a, "] \"POST /api/v1/jobs HTTP/1.1\" 201 "),
                  "access.log: %.2000s", a);
    ck_assert_msg(strstr(a, "\"POST /api/v1/nodes/1/heartbeat HTTP/1.1\" 200 "), "access.log: %.2000s", a);
    free(a);

    /* json and debug: every line an object; the requests on the console too */
    ty_rmrf(srv.dir);
    ck_assert_int_eq(mkdir(srv.dir, 0700), 0);
    const char *dbg[] = {"--cpu-slots", "1", "--log-level", "debug", "--log-format", "json", NULL};
    ty_server_start_args(&srv, "up", dbg);
    ty_sleep_ms(1500);
    ty_kill(&srv, SIGTERM);
    log = file_read_all(srv.log, 1 << 22, &len);
    ck_assert_ptr_nonnull(log);
    int lines = 0, requests = 0;
    for (char *l = log; l && *l;) {
        char *nl = strchr(l, '\n');
        if (nl) *nl = '\0';
        cJSON *j = cJSON_Parse(l);
        ck_assert_msg(j != NULL, "not a JSON line: %s", l);
        ck_assert(cJSON_IsString(cJSON_GetObjectItem(j, "time")) && cJSON_IsString(cJSON_GetObjectItem(j, "level")) &&
                  cJSON_IsString(cJSON_GetObjectItem(j, "component")) &&
                  cJSON_IsString(cJSON_GetObjectItem(j, "message")));
        if (strstr(cJSON_GetObjectItem(j, "message")->valuestring, "POST /api/v1/nodes")) requests++;
        cJSON_Delete(j);
        lines++;
        l = nl ? nl + 1 : NULL;
    }
    free(log);
    ck_assert_int_gt(lines, 5);
    ck_assert_int_ge(requests, 1);
}
END_TEST

/* An agent told SIGTERM while its server is gone stops its worker and
 * exits within seconds, not after its grace periods and report retries. */
START_TEST(agent_stops_fast_without_server)
{
    ty_server_start(&srv);
    ty_token(&srv, "token", team_tok, sizeof team_tok);
    pid_t ag = agent_start("1");
    int64_t id = submit();
    ck_assert_msg(wait_job(id, "running", 1, 60) >= 0, "the job did not start");
    ty_sleep_ms(500);
    ty_kill(&srv, SIGKILL);
    kill(ag, SIGTERM);
    int64_t ms = wait_exit(ag, 30000);
    printf("agent stopped %lld ms after SIGTERM with its server gone\n", (long long)ms);
    ck_assert_msg(ms >= 0 && ms < 6000, "the agent took %lld ms to stop (limit 6000)", (long long)ms);
    ck_assert_msg(reap_children(5000) == 0, "the worker outlived its agent");
    /* the undelivered exit is kept for the next agent */
    char statef[400];
    snprintf(statef, sizeof statef, "%s/agent.state", srv.dir);
    size_t len = 0;
    char *s = file_read_all(statef, 1 << 16, &len);
    ck_assert_ptr_nonnull(s);
    ck_assert_msg(strstr(s, "\"task\""), "state file has no task: %s", s);
    free(s);
}
END_TEST

/* kill -9 of an agent while its job trains, and a new agent on the node:
 * the job is requeued and running again within seconds (it used to wait
 * for the dead agent's long-poll to expire: 21 s). */
START_TEST(restarted_agent_rejoins_at_once)
{
    ty_server_start(&srv);
    ty_token(&srv, "token", team_tok, sizeof team_tok);
    pid_t ag = agent_start("1");
    int64_t id = submit();
    ck_assert_msg(wait_job(id, "running", 1, 60) >= 0, "the job did not start");
    ty_sleep_ms(1500); /* the agent sits in its long-poll */
    kill(ag, SIGKILL);
    ck_assert_int_ge(wait_exit(ag, 5000), 0);
    ag = agent_start("2");
    int64_t ms = wait_job(id, "running", 2, 40);
    printf("restarted agent: attempt 2 running after %lld ms\n", (long long)ms);
    ck_assert_msg(ms >= 0 && ms < 10000, "attempt 2 took %lld ms to run (limit 10000)", (long long)ms);
    kill(ag, SIGTERM);
    ck_assert_int_ge(wait_exit(ag, 20000), 0);
}
END_TEST


/* An agent told SIGTERM while its server runs, with two tasks: a training
 * job that stops at once and a program that takes 2 s over its SIGTERM. The
 * first's exit requeues its job, which the scheduler hands straight back to
 * this node (a slot is free, the node still looks ready, and the agent's
 * long-poll is woken at once). The agent must hand it back unstarted; it
 * used to start a worker after its SIGTERMs and hold its stop up to the
 * 15 s deadline. */
START_TEST(stopping_agent_starts_nothing)
{
    ty_server_start(&srv);
    ty_token(&srv, "token", team_tok, sizeof team_tok);
    pid_t ag = agent_start_slots("1", "2");
    int64_t id = submit();
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", "/api/v1/jobs",
                             "{\"name\":\"slow-stop\",\"command\":{\"argv\":[\"/bin/sh\",\"-c\","
                             "\"trap 'sleep 2; exit 0' TERM; while :; do sleep 0.1; done\"]},\"max_restarts\":0}",
                             &o), 201);
    int64_t slow = (int64_t)cJSON_GetObjectItem(o, "id")->valuedouble;
    cJSON_Delete(o);
    ck_assert_msg(wait_job(id, "running", 1, 60) >= 0, "the job did not start");
    ck_assert_msg(wait_job(slow, "running", 1, 60) >= 0, "the command job did not start");
    ty_sleep_ms(500);
    kill(ag, SIGTERM);
    int64_t ms = wait_exit(ag, 30000);
    printf("agent stopped %lld ms after SIGTERM, its server up\n", (long long)ms);
    char logf[400];
    snprintf(logf, sizeof logf, "%s/agent-1.log", srv.dir);
    size_t len = 0;
    char *log = file_read_all(logf, 1 << 20, &len);
    ck_assert_ptr_nonnull(log);
    ck_assert_msg(ms >= 0 && ms < 8000, "the agent took %lld ms to stop (limit 8000):\n%s", (long long)ms, log);
    int started = 0;
    for (const char *p = log; (p = strstr(p, " started as pid ")); p++) started++;
    ck_assert_msg(started == 2, "the agent started %d workers:\n%s", started, log);
    pid_t kids[8];
    int n = children_of(getpid(), kids, 8), others = 0;
    for (int i = 0; i < n; i++) others += kids[i] != srv.pid; /* the server is ours too */
    ck_assert_msg(others == 0, "a worker outlived its agent:\n%s", log);
    free(log);
    /* the agent drained its node as it stopped: the job waits for a node,
     * queued, not handed to the gone agent until its heartbeats time out */
    char path[64];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld", (long long)id);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", path, NULL, &o), 200);
    if (strcmp(cJSON_GetObjectItem(o, "state")->valuestring, "queued") != 0) {
        char slog[400];
        snprintf(slog, sizeof slog, "%s/server.log", srv.dir);
        char *t = file_read_all(slog, 1 << 20, &len);
        fprintf(stderr, "%s\n", t ? t : "");
        ck_abort_msg("job %lld is %s", (long long)id, cJSON_GetObjectItem(o, "state")->valuestring);
    }
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", "/api/v1/cluster", NULL, &o), 200);
    const cJSON *node = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "nodes"), 0);
    ck_assert_ptr_nonnull(node);
    ck_assert_str_eq(cJSON_GetObjectItem(node, "state")->valuestring, "drained");
    cJSON_Delete(o);
    /* an agent started again on the node brings it back: the job runs */
    ag = agent_start_slots("2", "2");
    ck_assert_msg(wait_job(id, "running", 1, 30) >= 0, "the job did not run on the node's new agent");
    kill(ag, SIGTERM);
    ck_assert_int_ge(wait_exit(ag, 20000), 0);
}
END_TEST

/* One server per data directory (a second would be a second writer of its
 * database): another `trainyard server` on it is refused, naming the first
 * one's pid, and changes nothing; the directory is free again once the
 * first is gone, kill -9 included. */
START_TEST(second_server_refused) {
    ty_server_start(&srv);
    char tok[128], tok_after[128];
    ty_token(&srv, "token", tok, sizeof tok);
    char cmd[800];
    snprintf(cmd, sizeof cmd, "'%s' server --listen 127.0.0.1:0 --data '%s' 2>&1", ty_bin(), srv.dir);
    FILE *f = popen(cmd, "r");
    ck_assert_ptr_nonnull(f);
    char out[2048];
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = '\0';
    int st = pclose(f);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) != 0, "a second server on the directory exited %d: %s", st, out);
    char pid[32];
    snprintf(pid, sizeof pid, "(pid %d)", (int)srv.pid);
    ck_assert_msg(strstr(out, "is in use by another trainyard server") && strstr(out, pid), "%s", out);
    /* the first still serves, with the same tokens */
    ck_assert_int_eq(ty_http(srv.url, tok, "GET", "/api/v1/jobs", NULL, NULL), 200);
    ty_token(&srv, "token", tok_after, sizeof tok_after);
    ck_assert_str_eq(tok, tok_after);
    ty_kill(&srv, SIGKILL);
    ty_server_start(&srv);
    ck_assert_int_eq(ty_http(srv.url, tok, "GET", "/api/v1/jobs", NULL, NULL), 200);
}
END_TEST

int main(void) {
    Suite *s = suite_create("procs");
    TCase *tc = tcase_create("procs");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 180);
    tcase_add_test(tc, up_killed_takes_its_children);
    tcase_add_test(tc, up_ctrl_c_stops_agent_first);
    tcase_add_test(tc, up_console_tells_what_happened);
    tcase_add_test(tc, agent_stops_fast_without_server);
    tcase_add_test(tc, restarted_agent_rejoins_at_once);
    tcase_add_test(tc, stopping_agent_starts_nothing);
    tcase_add_test(tc, second_server_refused);
    suite_add_tcase(s, tc);
    return ty_run_suite(s);
}
