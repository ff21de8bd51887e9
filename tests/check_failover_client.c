/* check_failover_client.c - clients given several server URLs (client/client.c:
 * a comma-separated list, docs/cli.md "Several servers") against real
 * processes on loopback: a dead first URL is passed over to a live server,
 * and the next client of the process goes straight to it; a server killed
 * and started again on its port within a request's retry budget; every URL
 * dead: one error naming each within the budget; an agent started with
 * --server DEAD,LIVE registers and runs a command job whose runner is handed
 * DEAD first (the server's --public-url) and still reports through LIVE; a
 * standby's 503 moves a request to the leader it names, and a submission's
 * Idempotency-Key is the same on every server it tried; an answer lost
 * after the request went out is asked again only for a GET or a request
 * with an Idempotency-Key; over https, a pinned CA taken from the first
 * server of the list that answers verifies every URL.
 *
 * The standby here is a stand-in (tests/proxy_upstream.py --standby: a real
 * HTTP server answering the standby's 503 as docs/server.md gives it) until
 * the real standby lands with the database lease; everything else is the
 * real trainyard binary. */
#include "testlib.h"
#include "../client/upgrade.h"
#include "../common/ws.h"

#include <fcntl.h>

static ty_proc srv;
static char team_tok[128], admin_tok[128];
static char listen_arg[64];
static char dead1[64], dead2[64];
static pid_t stubs[6];
static int n_stubs;

static void start(void) {
    memset(&srv, 0, sizeof srv);
    n_stubs = 0;
    ty_mkdtemp(srv.dir, sizeof srv.dir, "fo");
    snprintf(listen_arg, sizeof listen_arg, "127.0.0.1:%d", ty_free_port());
    const char *extra[] = {"--listen", listen_arg, NULL};
    ty_server_start_args(&srv, "server", extra);
    ty_token(&srv, "token", team_tok, sizeof team_tok);
    ty_token(&srv, "admin.token", admin_tok, sizeof admin_tok);
    /* closed ports: nothing listens there (connect is refused) */
    snprintf(dead1, sizeof dead1, "http://127.0.0.1:%d", ty_free_port());
    snprintf(dead2, sizeof dead2, "http://127.0.0.1:%d", ty_free_port());
    unsetenv("TRAINYARD_FAILOVER_MS");
}

static void stop(void) {
    for (int i = 0; i < n_stubs; i++) {
        kill(stubs[i], SIGTERM);
        waitpid(stubs[i], NULL, 0);
    }
    ty_kill(&srv, SIGTERM);
    ty_rmrf(srv.dir);
}

/* A stand-in started with tests/proxy_upstream.py MODE ARGS (its port file
 * and log in the data directory, named tag): its URL into url. */
static void stub_start(const char *mode, const char *leader, const char *tag, char *url, size_t n, char *log,
                       size_t logn) {
    char portfile[400];
    snprintf(portfile, sizeof portfile, "%s/%s.port", srv.dir, tag);
    snprintf(log, logn, "%s/%s.log", srv.dir, tag);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        if (!mode) execlp("python3", "python3", "tests/proxy_upstream.py", portfile, (char *)NULL);
        else if (leader)
            execlp("python3", "python3", "tests/proxy_upstream.py", mode, portfile, leader, log, (char *)NULL);
        else execlp("python3", "python3", "tests/proxy_upstream.py", mode, portfile, log, (char *)NULL);
        _exit(127);
    }
    ck_assert_int_lt(n_stubs, 6);
    stubs[n_stubs++] = pid;
    for (int i = 0; i < 200; i++) {
        size_t len = 0;
        char *s = file_read_all(portfile, 64, &len);
        if (s) {
            snprintf(url, n, "http://127.0.0.1:%s", s);
            free(s);
            return;
        }
        ty_sleep_ms(50);
    }
    ck_abort_msg("tests/proxy_upstream.py %s did not start", mode ? mode : "");
}

/* The requests a stand-in logged: a JSON array of {method, path, headers}. */
static cJSON *stub_log(const char *log) {
    cJSON *arr = cJSON_CreateArray();
    size_t len = 0;
    char *s = file_read_all(log, 1 << 20, &len);
    for (char *line = s, *nl; line && *line; line = nl + 1) {
        nl = strchr(line, '\n');
        if (!nl) break;
        *nl = '\0';
        cJSON *o = cJSON_Parse(line);
        ck_assert_msg(o != NULL, "%s: not JSON: %s", log, line);
        cJSON_AddItemToArray(arr, o);
    }
    free(s);
    return arr;
}

/* Runs `trainyard ARGS` with env (NAME=value ... or "") in front; stdout
 * and stderr into out; its exit code; *ms how long it took. */
static int cli(const char *env, const char *args, buf *out, int64_t *ms) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "env %s '%s' %s 2>&1", env, ty_bin(), args);
    int64_t t0 = mono_ms();
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    buf_init(out, 4u << 20);
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, p)) > 0) ck_assert_int_eq(buf_append(out, chunk, n), 0);
    int st = pclose(p);
    if (ms) *ms = mono_ms() - t0;
    ck_assert_msg(WIFEXITED(st), "trainyard %s did not exit", args);
    return WEXITSTATUS(st);
}

static const char *SPEC = "{\"name\":\"fo\",\"command\":{\"argv\":[\"/bin/true\"]},\"max_restarts\":0}";

static void write_spec(char *path, size_t n, const char *text) {
    snprintf(path, n, "%s/spec-%d.json", srv.dir, (int)(mono_ms() % 100000));
    ck_assert_int_eq(file_write_atomic(path, text, strlen(text), 0600), 0);
}

/* (1) the first URL a closed port: through the second, and the next client
 * of the process (the CLI makes one per request) goes straight to it. */
START_TEST(dead_first_url_is_passed_over) {
    char list[1024];
    snprintf(list, sizeof list, "%s, %s/", dead1, srv.url); /* spaces and a trailing slash are dropped */
    client c;
    ck_assert_int_eq(client_init(&c, list, team_tok), 0);
    ck_assert_int_eq(c.n_urls, 2);
    ck_assert_str_eq(c.url, dead1);
    client_reply r;
    int64_t t0 = mono_ms();
    ck_assert_int_eq(client_request(&c, "GET", "/api/v1/jobs", NULL, 0, NULL, &r), 0);
    int64_t moved_ms = mono_ms() - t0;
    ck_assert_int_eq(r.status, 200);
    ck_assert_int_eq(c.attempts, 2);
    ck_assert_str_eq(c.url, srv.url);
    client_reply_release(&r);
    /* the same client again: one attempt */
    ck_assert_int_eq(client_request(&c, "GET", "/api/v1/jobs", NULL, 0, NULL, &r), 0);
    ck_assert_int_eq(c.attempts, 1);
    client_reply_release(&r);
    client_release(&c);
    /* a new client with the same list starts where the last one ended */
    client d;
    ck_assert_int_eq(client_init(&d, list, team_tok), 0);
    ck_assert_str_eq(d.url, srv.url);
    ck_assert_int_eq(client_request(&d, "POST", "/api/v1/jobs", SPEC, strlen(SPEC), NULL, &r), 0);
    ck_assert_int_eq(r.status, 201);
    ck_assert_int_eq(d.attempts, 1);
    client_reply_release(&r);
    client_release(&d);
    fprintf(stderr, "check_failover_client: moved past a refused URL in %lld ms\n", (long long)moved_ms);
    ck_assert_msg(moved_ms < 1000, "moving past a refused URL took %lld ms", (long long)moved_ms);

    /* the CLI, through TRAINYARD_URL and --url */
    char env[2048], args[800], spec[400];
    snprintf(env, sizeof env, "TRAINYARD_URL='%s,%s' TRAINYARD_TOKEN=%s", dead1, srv.url, team_tok);
    write_spec(spec, sizeof spec, SPEC);
    snprintf(args, sizeof args, "submit --json '%s'", spec);
    buf out;
    int64_t ms = 0;
    int rc = cli(env, args, &out, &ms);
    ck_assert_msg(rc == 0, "submit exited %d: %s", rc, out.data ? out.data : "");
    cJSON *j = cJSON_Parse(out.data);
    ck_assert_msg(j && ty_num(j, "id") > 0, "submit printed %s", out.data);
    cJSON_Delete(j);
    buf_release(&out);
    fprintf(stderr, "check_failover_client: CLI submit past a refused URL: %lld ms\n", (long long)ms);
    snprintf(env, sizeof env, "TRAINYARD_TOKEN=%s", team_tok);
    snprintf(args, sizeof args, "jobs --json --url '%s,%s'", dead1, srv.url);
    rc = cli(env, args, &out, NULL);
    ck_assert_msg(rc == 0, "jobs exited %d: %s", rc, out.data ? out.data : "");
    j = cJSON_Parse(out.data);
    ck_assert_msg(j && cJSON_GetArraySize(cJSON_GetObjectItem(j, "jobs")) == 2, "jobs printed %s", out.data);
    cJSON_Delete(j);
    buf_release(&out);
    /* a bad list is a usage error naming the item */
    snprintf(args, sizeof args, "jobs --url '%s,,%s'", dead1, srv.url);
    ck_assert_int_eq(cli(env, args, &out, NULL), 2);
    ck_assert_msg(strstr(out.data, "--url: URL 2 of the list is empty"), "said %s", out.data);
    buf_release(&out);
}
END_TEST

/* (2) the server killed, then started again on the same port while a CLI
 * call is waiting out its budget: the call goes through. */
START_TEST(server_back_within_the_budget) {
    char env[2048], args[800];
    snprintf(env, sizeof env, "TRAINYARD_URL='%s,%s' TRAINYARD_TOKEN=%s", dead1, srv.url, team_tok);
    snprintf(args, sizeof args, "jobs --json");
    ty_kill(&srv, SIGKILL);
    char cmd[4096], outf[400];
    snprintf(outf, sizeof outf, "%s/jobs.out", srv.dir);
    snprintf(cmd, sizeof cmd, "env %s '%s' %s >'%s' 2>&1; echo $? >>'%s'", env, ty_bin(), args, outf, outf);
    int64_t t0 = mono_ms();
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    ty_sleep_ms(2000);
    const char *extra[] = {"--listen", listen_arg, NULL};
    ty_server_start_args(&srv, "server", extra);
    int64_t back = mono_ms() - t0;
    int st = 0;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    int64_t took = mono_ms() - t0;
    size_t len = 0;
    char *s = file_read_all(outf, 1 << 20, &len);
    ck_assert_ptr_nonnull(s);
    fprintf(stderr, "check_failover_client: server back after %lld ms, the call answered after %lld ms\n",
            (long long)back, (long long)took);
    ck_assert_msg(strstr(s, "\"jobs\"") && len >= 2 && s[len - 2] == '0', "the call said: %s", s);
    ck_assert_msg(took < CLIENT_FAILOVER_MS, "took %lld ms", (long long)took);
    free(s);
}
END_TEST

/* (3) every URL dead: one error naming each, within the budget. */
START_TEST(all_dead_fails_within_the_budget) {
    char env[2048], args[400];
    snprintf(env, sizeof env, "TRAINYARD_URL='%s,%s' TRAINYARD_TOKEN=%s TRAINYARD_FAILOVER_MS=2000", dead1, dead2,
             team_tok);
    snprintf(args, sizeof args, "jobs");
    buf out;
    int64_t ms = 0;
    int rc = cli(env, args, &out, &ms);
    fprintf(stderr, "check_failover_client: all dead, budget 2000 ms: exit %d after %lld ms: %s", rc, (long long)ms,
            out.data ? out.data : "\n");
    ck_assert_int_eq(rc, 3);
    ck_assert_msg(strstr(out.data, "no server of 2 answered as leader"), "said %s", out.data);
    char want[128];
    snprintf(want, sizeof want, "%s: Couldn't connect to server", dead1);
    ck_assert_msg(strstr(out.data, want), "said %s", out.data);
    snprintf(want, sizeof want, "%s: Couldn't connect to server", dead2);
    ck_assert_msg(strstr(out.data, want), "said %s", out.data);
    ck_assert_msg(ms >= 1500 && ms < 3500, "took %lld ms", (long long)ms);
    buf_release(&out);
    /* one URL, dead: at once, as always */
    snprintf(env, sizeof env, "TRAINYARD_URL='%s' TRAINYARD_TOKEN=%s", dead1, team_tok);
    rc = cli(env, args, &out, &ms);
    ck_assert_int_eq(rc, 3);
    ck_assert_msg(ms < 1000 && strstr(out.data, "Couldn't connect"), "%lld ms: %s", (long long)ms, out.data);
    buf_release(&out);
    /* the default budget, from the library */
    client c;
    char list[1024];
    snprintf(list, sizeof list, "%s,%s", dead1, dead2);
    ck_assert_int_eq(client_init(&c, list, NULL), 0);
    ck_assert_int_eq(c.failover_ms, -1);
    c.failover_ms = 0; /* one try of each, no waiting (what an agent uses) */
    client_reply r;
    int64_t t0 = mono_ms();
    ck_assert_int_eq(client_request(&c, "GET", "/api/v1/health", NULL, 0, NULL, &r), -1);
    ck_assert_int_eq(c.attempts, 2);
    ck_assert_msg(mono_ms() - t0 < 1000, "one round took %lld ms", (long long)(mono_ms() - t0));
    client_reply_release(&r);
    client_release(&c);
}
END_TEST

/* (4) an agent with --server DEAD,LIVE registers and runs a command job;
 * the server tells workers a dead URL (--public-url), so the runner reaches
 * the server only through the agent's list, which it is handed. */
START_TEST(agent_and_its_tasks_use_the_list) {
    ty_kill(&srv, SIGTERM);
    char pub[96];
    snprintf(pub, sizeof pub, "%s", dead2);
    const char *extra[] = {"--listen", listen_arg, "--public-url", pub, NULL};
    ty_server_start_args(&srv, "server", extra);
    char tokfile[400], logf[400], statef[400], list[512];
    snprintf(statef, sizeof statef, "%s/agent.state", srv.dir);
    snprintf(tokfile, sizeof tokfile, "%s/node.token", srv.dir);
    snprintf(logf, sizeof logf, "%s/agent.log", srv.dir);
    snprintf(list, sizeof list, "%s,%s", dead1, srv.url);
    pid_t agent = fork();
    ck_assert_int_ge(agent, 0);
    if (agent == 0) {
        FILE *lf = freopen(logf, "a", stderr);
        (void)lf;
        execl(ty_bin(), ty_bin(), "agent", "--server", list, "--token-file", tokfile, "--hostname", "fo-node",
              "--cpu-slots", "1", "--heartbeat", "1", "--poll-wait", "3", "--state-file", statef, (char *)NULL);
        _exit(127);
    }
    const char *spec =
        "{\"name\":\"fo-cmd\",\"command\":{\"argv\":[\"/usr/bin/python3\",\"-c\","
        "\"import json,os; c=json.loads(os.environ['TRAINYARD_CONFIG']); "
        "print('servers=' + ','.join(c['servers'])); print('api=' + c['api']); print('loss=0.5')\"]},"
        "\"max_restarts\":0}";
    int64_t id = ty_submit(srv.url, team_tok, spec);
    int64_t end = mono_ms() + 30000;
    char state[32] = "";
    while (mono_ms() < end) {
        cJSON *o = ty_job_get(srv.url, team_tok, id);
        snprintf(state, sizeof state, "%s", ty_str(o, "state"));
        cJSON_Delete(o);
        if (!strcmp(state, "succeeded") || !strcmp(state, "failed") || !strcmp(state, "cancelled")) break;
        ty_sleep_ms(200);
    }
    char *log = ty_task_log(srv.url, team_tok, id, "worker-0");
    kill(agent, SIGTERM);
    waitpid(agent, NULL, 0);
    ck_assert_msg(!strcmp(state, "succeeded"), "job %lld is %s; log: %s (see %s)", (long long)id, state, log, logf);
    char want[1024];
    snprintf(want, sizeof want, "servers=%s,%s,%s", dead2, dead1, srv.url);
    ck_assert_msg(strstr(log, want), "the log has no '%s': %s", want, log);
    snprintf(want, sizeof want, "api=%s", srv.url);
    ck_assert_msg(strstr(log, want), "the log has no '%s': %s", want, log);
    free(log);
    size_t n = 0;
    char *alog = file_read_all(logf, 1 << 22, &n);
    ck_assert_ptr_nonnull(alog);
    ck_assert_msg(strstr(alog, "registered as node"), "agent log: %s", alog);
    free(alog);
}
END_TEST

/* (5) a standby's 503 moves a submission to the leader it names, skipping
 * the URLs between; with no leader named, to the next; the Idempotency-Key
 * is the same on every server one submission tried, and new for the next.
 * The standbys are stand-ins (see the top of the file). */
START_TEST(standby_moves_to_the_leader_with_one_key) {
    char sb_leader[96], sb_none[96], log_leader[400], log_none[400];
    stub_start("--standby", srv.url, "sbl", sb_leader, sizeof sb_leader, log_leader, sizeof log_leader);
    stub_start("--standby", "none", "sbn", sb_none, sizeof sb_none, log_none, sizeof log_none);
    char env[2048], args[800], spec[400];
    write_spec(spec, sizeof spec, SPEC);
    snprintf(args, sizeof args, "submit --json '%s'", spec);
    /* none -> (next) leader-naming standby -> (its leader, past dead1) the server */
    snprintf(env, sizeof env, "TRAINYARD_URL='%s,%s,%s,%s' TRAINYARD_TOKEN=%s", sb_none, sb_leader, dead1, srv.url,
             team_tok);
    buf out;
    int64_t ms = 0;
    int rc = cli(env, args, &out, &ms);
    ck_assert_msg(rc == 0, "submit exited %d: %s", rc, out.data ? out.data : "");
    buf_release(&out);
    fprintf(stderr, "check_failover_client: standby, standby, leader: submitted in %lld ms\n", (long long)ms);
    cJSON *a = stub_log(log_none), *b = stub_log(log_leader);
    ck_assert_int_eq(cJSON_GetArraySize(a), 1);
    ck_assert_int_eq(cJSON_GetArraySize(b), 1);
    const cJSON *ha = cJSON_GetObjectItem(cJSON_GetArrayItem(a, 0), "headers");
    const cJSON *hb = cJSON_GetObjectItem(cJSON_GetArrayItem(b, 0), "headers");
    const char *ka = ty_str(ha, "idempotency-key"), *kb = ty_str(hb, "idempotency-key");
    ck_assert_msg(strlen(ka) == 36 && ka[14] == '4', "Idempotency-Key '%s' is not a v4 UUID", ka);
    ck_assert_str_eq(ka, kb);
    ck_assert_str_eq(ty_str(cJSON_GetArrayItem(a, 0), "path"), "/api/v1/jobs");
    char first[40];
    snprintf(first, sizeof first, "%s", ka);
    cJSON_Delete(a);
    cJSON_Delete(b);
    /* the next submission: a new key */
    snprintf(env, sizeof env, "TRAINYARD_URL='%s,%s' TRAINYARD_TOKEN=%s", sb_leader, srv.url, team_tok);
    ck_assert_int_eq(cli(env, args, &out, NULL), 0);
    buf_release(&out);
    b = stub_log(log_leader);
    ck_assert_int_eq(cJSON_GetArraySize(b), 2);
    const char *k2 = ty_str(cJSON_GetObjectItem(cJSON_GetArrayItem(b, 1), "headers"), "idempotency-key");
    ck_assert_int_eq((int)strlen(k2), 36);
    ck_assert_str_ne(k2, first);
    cJSON_Delete(b);
    /* a sweep submission carries one too (whatever the server then says of
     * this sweep) */
    char sweep[400];
    write_spec(sweep, sizeof sweep, "{\"name\":\"fo-sweep\",\"job\":{},\"search\":{}}");
    snprintf(args, sizeof args, "sweep --json '%s'", sweep);
    (void)cli(env, args, &out, NULL);
    buf_release(&out);
    b = stub_log(log_leader);
    ck_assert_int_eq(cJSON_GetArraySize(b), 3);
    ck_assert_str_eq(ty_str(cJSON_GetArrayItem(b, 2), "path"), "/api/v1/sweeps");
    const char *k3 = ty_str(cJSON_GetObjectItem(cJSON_GetArrayItem(b, 2), "headers"), "idempotency-key");
    ck_assert_int_eq((int)strlen(k3), 36);
    cJSON_Delete(b);
    /* a GET carries none */
    ck_assert_int_eq(cli(env, "jobs --json", &out, NULL), 0);
    buf_release(&out);
    b = stub_log(log_leader);
    ck_assert_int_eq(cJSON_GetArraySize(b), 4);
    ck_assert_str_eq(ty_str(cJSON_GetObjectItem(cJSON_GetArrayItem(b, 3), "headers"), "idempotency-key"), "");
    cJSON_Delete(b);
    /* standbys alone: the budget, then an error naming each and its leader */
    snprintf(env, sizeof env, "TRAINYARD_URL='%s,%s' TRAINYARD_TOKEN=%s TRAINYARD_FAILOVER_MS=1500", sb_none, sb_leader,
             team_tok);
    rc = cli(env, "jobs", &out, &ms);
    ck_assert_int_eq(rc, 3);
    char want[1024];
    snprintf(want, sizeof want, "%s: standby, leader unknown; %s: standby, leader %s", sb_none, sb_leader, srv.url);
    ck_assert_msg(strstr(out.data, want), "said %s", out.data);
    ck_assert_msg(ms >= 1000 && ms < 3000, "took %lld ms", (long long)ms);
    buf_release(&out);
    /* a 503 that is not a standby's (the leader's database down) comes
     * back as it is: no move (tests/proxy_upstream.py's /status/503) */
    char up[96], uplog[400];
    stub_start(NULL, NULL, "up", up, sizeof up, uplog, sizeof uplog);
    client c;
    char list[1024];
    snprintf(list, sizeof list, "%s,%s", up, srv.url);
    ck_assert_int_eq(client_init(&c, list, team_tok), 0);
    client_reply r;
    ck_assert_int_eq(client_request(&c, "GET", "/status/503", NULL, 0, NULL, &r), 0);
    ck_assert_int_eq(r.status, 503);
    ck_assert_int_eq(c.attempts, 1);
    ck_assert_str_eq(c.url, up);
    client_reply_release(&r);
    client_release(&c);
}
END_TEST

/* A download (client_download: checkpoints, contexts) and a WebSocket
 * upgrade (client_upgrade: shells, the exec relay) move over the list too:
 * past a dead URL and a standby. */
START_TEST(downloads_and_upgrades_move_too) {
    char sb[96], sblog[400], up[96], uplog[400], list[1024], file[400], err[1400], sha[65], got[65];
    stub_start("--standby", "none", "sbd", sb, sizeof sb, sblog, sizeof sblog);
    stub_start(NULL, NULL, "upws", up, sizeof up, uplog, sizeof uplog);
    snprintf(file, sizeof file, "%s/jobs.json", srv.dir);
    snprintf(list, sizeof list, "%s,%s,%s", sb, dead1, srv.url);
    client c;
    ck_assert_int_eq(client_init(&c, list, team_tok), 0);
    long status = 0;
    uint64_t size = 0;
    ck_assert_msg(client_download(&c, "/api/v1/jobs", file, &status, sha, got, NULL, 0, &size, NULL, err,
                                  sizeof err) == 0, "%s", err);
    ck_assert_int_eq(status, 200);
    ck_assert_int_eq(c.attempts, 3);
    ck_assert_str_eq(c.url, srv.url);
    size_t n = 0;
    char *text = file_read_all(file, 1 << 20, &n);
    ck_assert_msg(text && strstr(text, "\"jobs\""), "downloaded %s", text ? text : "nothing");
    free(text);
    client_release(&c);
    /* all dead or standby: an error naming each, within the budget */
    setenv("TRAINYARD_FAILOVER_MS", "600", 1);
    snprintf(list, sizeof list, "%s,%s", sb, dead1);
    ck_assert_int_eq(client_init(&c, list, team_tok), 0);
    ck_assert_int_eq(client_download(&c, "/api/v1/jobs", file, &status, sha, got, NULL, 0, &size, NULL, err,
                                     sizeof err), -1);
    ck_assert_msg(strstr(err, "standby, leader unknown") && strstr(err, "Couldn't connect"), "%s", err);
    client_release(&c);
    unsetenv("TRAINYARD_FAILOVER_MS");
    /* an upgrade: past the standby's 503 and the dead URL to a WebSocket */
    snprintf(list, sizeof list, "%s,%s,%s", sb, dead1, up);
    ck_assert_int_eq(client_init(&c, list, NULL), 0);
    char key[25], want[29], acc[64], hdr[256];
    ck_assert_int_eq(ws_key_new(key), 0);
    ck_assert_int_eq(ws_accept_key(key, want), 0);
    snprintf(hdr, sizeof hdr,
             "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n", key);
    client_conn k;
    ck_assert_msg(client_upgrade(&c, "/ws", hdr, 5000, &k, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(k.status, 101);
    ck_assert_ptr_nonnull(client_conn_header(&k, "Sec-WebSocket-Accept", acc, sizeof acc));
    ck_assert_str_eq(acc, want);
    client_conn_close(&k);
    client_release(&c);
}
END_TEST

/* An answer lost after the request went out: a GET and a keyed POST are
 * asked again at the next server; a POST without a key is not (it may have
 * been done). */
START_TEST(lost_answer_is_retried_only_when_safe) {
    char drop[96], log[400];
    stub_start("--drop", NULL, "drop", drop, sizeof drop, log, sizeof log);
    char list[1024];
    snprintf(list, sizeof list, "%s,%s", drop, srv.url);
    client c;
    client_reply r;
    ck_assert_int_eq(client_init(&c, list, team_tok), 0);
    ck_assert_int_eq(client_request(&c, "GET", "/api/v1/jobs", NULL, 0, NULL, &r), 0);
    ck_assert_int_eq(r.status, 200);
    ck_assert_int_eq(c.attempts, 2);
    client_reply_release(&r);
    client_release(&c);
    /* the list's index is now the server's: start from the dropper again */
    ck_assert_int_eq(client_init(&c, list, team_tok), 0);
    c.cur = 0;
    snprintf(c.url, sizeof c.url, "%s", drop);
    int rc = client_request(&c, "POST", "/api/v1/jobs", SPEC, strlen(SPEC), NULL, &r);
    ck_assert_int_eq(rc, -1);
    ck_assert_int_eq(c.attempts, 1);
    ck_assert_msg(strstr(r.error, "not sent again"), "said %s", r.error);
    client_reply_release(&r);
    c.cur = 0;
    snprintf(c.url, sizeof c.url, "%s", drop);
    ck_assert_int_eq(client_idempotency_key(c.idempotency_key), 0);
    ck_assert_int_eq(client_request(&c, "POST", "/api/v1/jobs", SPEC, strlen(SPEC), NULL, &r), 0);
    ck_assert_int_eq(r.status, 201);
    ck_assert_int_eq(c.attempts, 2);
    client_reply_release(&r);
    client_release(&c);
    cJSON *l = stub_log(log);
    ck_assert_int_eq(cJSON_GetArraySize(l), 3);
    cJSON_Delete(l);
}
END_TEST

/* TLS over a list: --ca-hash takes the CA from the first server that
 * answers (a dead one is skipped, one with another CA refused at once), and
 * the one CA trusted then verifies every URL: a server whose certificate it
 * did not sign is moved past. */
START_TEST(pinned_ca_over_a_list) {
    ty_proc a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    ty_mkdtemp(a.dir, sizeof a.dir, "fotlsa");
    ty_mkdtemp(b.dir, sizeof b.dir, "fotlsb");
    const char *extra[] = {"--tls", "auto", NULL};
    ty_server_start_args(&a, "server", extra);
    ty_server_start_args(&b, "server", extra);
    char pin_a[TLS_PIN_LEN], pin_b[TLS_PIN_LEN], tok_b[128], err[2048], list[1024];
    ty_ca_pin(&a, pin_a);
    ty_ca_pin(&b, pin_b);
    ck_assert_str_ne(pin_a, pin_b); /* each --tls auto made its own CA */
    ty_token(&b, "token", tok_b, sizeof tok_b);
    /* a server that gives another CA: refused at once, naming both hashes */
    snprintf(list, sizeof list, "%s,%s", a.url, b.url);
    ck_assert_int_eq(client_trust_pinned(list, pin_b, err, sizeof err), -1);
    ck_assert_msg(strstr(err, pin_a) && strstr(err, pin_b), "%s", err);
    ck_assert_ptr_null(client_trusted_ca());
    /* a dead one first: skipped; B's CA trusted */
    snprintf(list, sizeof list, "https://127.0.0.1:%d,%s", ty_free_port(), b.url);
    ck_assert_msg(client_trust_pinned(list, pin_b, err, sizeof err) == 0, "%s", err);
    ck_assert_ptr_nonnull(client_trusted_ca());
    /* every URL verified with it: A's certificate fails, B answers */
    snprintf(list, sizeof list, "%s,%s", a.url, b.url);
    client c;
    client_reply r;
    ck_assert_int_eq(client_init(&c, list, tok_b), 0);
    ck_assert_int_eq(client_request(&c, "GET", "/api/v1/jobs", NULL, 0, NULL, &r), 0);
    ck_assert_int_eq(r.status, 200);
    ck_assert_int_eq(c.attempts, 2);
    ck_assert_str_eq(c.url, b.url);
    client_reply_release(&r);
    client_release(&c);
    /* all dead: one error naming each */
    char d1[64], d2[64];
    snprintf(d1, sizeof d1, "https://127.0.0.1:%d", ty_free_port());
    snprintf(d2, sizeof d2, "https://127.0.0.1:%d", ty_free_port());
    snprintf(list, sizeof list, "%s,%s", d1, d2);
    ck_assert_int_eq(client_trust_pinned(list, pin_b, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "no server of the list answered") && strstr(err, d1) && strstr(err, d2), "%s", err);
    ty_kill(&a, SIGTERM);
    ty_kill(&b, SIGTERM);
    ty_rmrf(a.dir);
    ty_rmrf(b.dir);
}
END_TEST

/* The list helpers: checks, items, the agent's merge for its tasks. */
START_TEST(url_lists) {
    char err[200], out[512];
    int n = 0;
    ck_assert_int_eq(client_url_list_check("http://a:1", "x", &n, err, sizeof err), 0);
    ck_assert_int_eq(n, 1);
    ck_assert_int_eq(client_url_list_check(" http://a:1/ , https://b:2 ", "x", &n, err, sizeof err), 0);
    ck_assert_int_eq(n, 2);
    ck_assert_int_eq(client_url_at(" http://a:1/ , https://b:2 ", 1, out, sizeof out), 0);
    ck_assert_str_eq(out, "https://b:2");
    ck_assert_int_eq(client_url_at("http://a:1", 1, out, sizeof out), -1);
    ck_assert_int_eq(client_url_list_check("", "--server", &n, err, sizeof err), -1);
    ck_assert_int_eq(client_url_list_check("http://a,", "--server", &n, err, sizeof err), -1);
    ck_assert_str_eq(err, "--server: URL 2 of the list is empty (a comma-separated list of URLs)");
    ck_assert_int_eq(client_url_list_check("a,b,c,d,e,f,g,h,i", "--server", &n, err, sizeof err), -1);
    ck_assert_str_eq(err, "--server: more than 8 URLs");
    ck_assert_int_eq(client_url_list_merge("http://p:1", "http://a:1,HTTP://P:1/,http://b:2", out, sizeof out), 0);
    ck_assert_str_eq(out, "http://p:1,http://a:1,http://b:2");
    ck_assert_int_eq(client_url_list_merge("http://p:1", "http://p:1", out, sizeof out), 0);
    ck_assert_str_eq(out, "http://p:1");
    ck_assert_int_eq(client_url_list_merge("http://p:1", "http://a:1", out, 16), 0); /* no room: left out */
    ck_assert_str_eq(out, "http://p:1");
    char key[37], key2[37];
    ck_assert_int_eq(client_idempotency_key(key), 0);
    ck_assert_int_eq(client_idempotency_key(key2), 0);
    ck_assert_int_eq((int)strlen(key), 36);
    ck_assert_str_ne(key, key2);
    ck_assert(key[8] == '-' && key[13] == '-' && key[14] == '4' && key[18] == '-' && key[23] == '-');
}
END_TEST

int main(void) {
    Suite *s = suite_create("failover_client");
    TCase *lists = tcase_create("lists");
    tcase_add_test(lists, url_lists);
    suite_add_tcase(s, lists);
    TCase *tc = ty_tcase(s, "failover", start, stop, 60);
    tcase_add_test(tc, dead_first_url_is_passed_over);
    tcase_add_test(tc, server_back_within_the_budget);
    tcase_add_test(tc, all_dead_fails_within_the_budget);
    tcase_add_test(tc, standby_moves_to_the_leader_with_one_key);
    tcase_add_test(tc, lost_answer_is_retried_only_when_safe);
    tcase_add_test(tc, downloads_and_upgrades_move_too);
    TCase *tls = tcase_create("tls");
    tcase_set_timeout(tls, 60);
    tcase_add_test(tls, pinned_ca_over_a_list);
    suite_add_tcase(s, tls);
    TCase *ag = ty_tcase(s, "agent", start, stop, 90);
    tcase_add_test(ag, agent_and_its_tasks_use_the_list);
    return ty_run_suite(s);
}
