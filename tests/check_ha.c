/* check_ha.c - a control plane that survives its host: two servers on one
 * PostgreSQL, each in a network namespace of its own, two agents in two
 * more, a 2-worker job training across them and submissions arriving.
 *
 *   1. kill -9 of the leader: the standby leads within 10 s (the lease);
 *   2. the new leader's network cut (its veth down): the other, started
 *      again as a standby, leads within 10 s; once the link is back the
 *      cut one has stepped down and serves as a standby.
 *
 * Through both, the training job trains on without a restart (the same
 * attempt and tasks; its metrics and checkpoints go on past each
 * takeover), a job queued before the first is placed and runs after it,
 * every submission acknowledged is there, none is there twice (each
 * carries an Idempotency-Key, kept across the client's retries), and no
 * job is placed twice. The takeover times are printed (docs/ha.md).
 *
 * Beside them, one server on a PostgreSQL of its own (no namespaces): the
 * database stopped mid-run (503s naming it, the leader steps down, leads
 * again once it is back, nothing lost) and the database hung (SIGSTOP: the
 * server still stops within seconds, storage/db.h db_abandon).
 *
 * PostgreSQL 15 runs in the root namespace on the bridge (scripts/pg-dev.sh
 * with PG_DEV_LISTEN); checkpoints go to a file:// blob store both servers
 * share. Needs root (namespaces) and iproute2, else SKIP; no PostgreSQL is
 * a SKIP too, and a failure under PG_TEST_REQUIRED=1 (tests/run_all.sh). */
#include "testlib.h"

#include <dirent.h>
#include <pthread.h>
#include <stdarg.h>

#define NET "10.213.79"
#define NNS 4 /* s0, s1 (servers), n0, n1 (nodes) */

static const char *const ROLE[NNS] = {"s0", "s1", "n0", "n1"};
static const int HOST[NNS] = {11, 12, 21, 22};
static char ns[NNS][32], vroot[NNS][16], vns[NNS][16], br[16];
static int net_ready;
static char dir[256], pgdir[300], dburl[700], urls[200], team_tok[128];
static pid_t srv_pid[2], agent_pid[2];

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
    char cmd[1400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    char full[1500];
    snprintf(full, sizeof full, "%s >/dev/null 2>&1", cmd);
    return system(full);
}

static void net_teardown(void) {
    for (int i = 0; i < NNS; i++) {
        if (ns[i][0]) sh("ip netns del %s", ns[i]);
        if (vroot[i][0]) sh("ip link del %s", vroot[i]);
    }
    if (br[0]) sh("ip link del %s", br);
}

static int net_setup(void) {
    /* what a killed run left behind: this test's names only */
    sh("for n in $(ip netns list | awk '/^ty-ha[0-9]+-[sn][01]( |$)/ {print $1}'); do ip netns del $n; done");
    sh("for l in $(ip -o link show type bridge | awk -F': ' '$2 ~ /^tyhabr[0-9]+$/ {print $2}'); do ip link del $l; done");
    int id = (int)getpid() % 10000;
    snprintf(br, sizeof br, "tyhabr%d", id);
    for (int i = 0; i < NNS; i++) {
        snprintf(ns[i], sizeof ns[i], "ty-ha%d-%s", id, ROLE[i]);
        snprintf(vroot[i], sizeof vroot[i], "tyhv%d%s", id, ROLE[i]);
        snprintf(vns[i], sizeof vns[i], "tyhn%d%s", id, ROLE[i]);
    }
    if (sh("ip link add %s type bridge", br) || sh("ip addr add " NET ".1/24 dev %s", br) || sh("ip link set %s up", br))
        goto fail;
    for (int i = 0; i < NNS; i++) {
        if (sh("ip netns add %s", ns[i]) || sh("ip link add %s type veth peer name %s", vroot[i], vns[i]) ||
            sh("ip link set %s master %s up", vroot[i], br) || sh("ip link set %s netns %s", vns[i], ns[i]) ||
            sh("ip netns exec %s ip addr add " NET ".%d/24 dev %s", ns[i], HOST[i], vns[i]) ||
            sh("ip netns exec %s ip link set %s up", ns[i], vns[i]) || sh("ip netns exec %s ip link set lo up", ns[i]))
            goto fail;
    }
    return 0;
fail:
    net_teardown();
    memset(ns, 0, sizeof ns);
    memset(vroot, 0, sizeof vroot);
    br[0] = 0;
    return -1;
}

static int pg_required(void) {
    const char *r = getenv("PG_TEST_REQUIRED");
    return r && strcmp(r, "1") == 0;
}

/* scripts/pg-dev.sh start, listening on the bridge too: 0, or -1 (why said) */
static int pg_start(void) {
    snprintf(pgdir, sizeof pgdir, "%s/pg", dir);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "PG_DEV_FAST=1 PG_DEV_LISTEN=" NET ".1/24 scripts/pg-dev.sh start %s 2>&1", pgdir);
    FILE *f = popen(cmd, "r");
    if (!f) return -1;
    char line[800], port[16] = "";
    while (fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "DATABASE_URL=postgres://trainyard@127.0.0.1:");
        if (p) sscanf(p + strlen("DATABASE_URL=postgres://trainyard@127.0.0.1:"), "%15[0-9]", port);
        else fprintf(stderr, "ha: pg-dev: %s", line);
    }
    int rc = pclose(f);
    if (rc != 0 || !port[0]) return -1;
    snprintf(dburl, sizeof dburl, "postgres://trainyard@" NET ".1:%s/trainyard?passfile=%s/pgpass", port, pgdir);
    return 0;
}

static void server_url(int i, char *out, size_t n) { snprintf(out, n, "http://" NET ".%d:8080", HOST[i]); }

static pid_t spawn_server(int i) {
    char data[300], logf[340], listen[64], pub[64], blobs[320];
    snprintf(data, sizeof data, "%s/%s", dir, ROLE[i]);
    mkdir(data, 0700);
    snprintf(logf, sizeof logf, "%s/server.log", data);
    snprintf(listen, sizeof listen, NET ".%d:8080", HOST[i]);
    server_url(i, pub, sizeof pub);
    snprintf(blobs, sizeof blobs, "file://%s/blobs", dir);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        FILE *lf = freopen(logf, "a", stderr);
        (void)lf;
        execlp("ip", "ip", "netns", "exec", ns[i], ty_bin(), "server", "--listen", listen, "--insecure-http",
               "--public-url", pub, "--data", data, "--db", dburl, "--blob-store", blobs, "--heartbeat-timeout", "20",
               (char *)NULL);
        _exit(127);
    }
    return pid;
}

static pid_t spawn_agent(int k) {
    int i = 2 + k;
    char tokfile[300], logf[300], statef[300], addr[32], name[32];
    snprintf(tokfile, sizeof tokfile, "%s/s0/node.token", dir);
    snprintf(logf, sizeof logf, "%s/agent%d.log", dir, k);
    snprintf(statef, sizeof statef, "%s/agent%d.state", dir, k);
    snprintf(addr, sizeof addr, NET ".%d", HOST[i]);
    snprintf(name, sizeof name, "ha-node-%d", k);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        FILE *lf = freopen(logf, "a", stderr);
        (void)lf;
        execlp("ip", "ip", "netns", "exec", ns[i], ty_bin(), "agent", "--server", urls, "--token-file", tokfile,
               "--hostname", name, "--address", addr, "--cpu-slots", "1", "--heartbeat", "1", "--poll-wait", "3",
               "--state-file", statef, "--worker-sched", "idle", (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* GET /api/v1/health of the server at url straight (no list): its role,
 * "" when it does not answer. */
static void role_at(const char *url, char *role, size_t n) {
    role[0] = '\0';
    client c;
    if (client_init(&c, url, NULL) < 0) return;
    c.timeout_ms = 1500;
    client_reply r;
    if (client_request(&c, "GET", "/api/v1/health", NULL, 0, NULL, &r) == 0 && r.status == 200) {
        cJSON *o = cJSON_ParseWithLength(r.body.data, r.body.len);
        const char *v = cJSON_GetStringValue(cJSON_GetObjectItem(o, "role"));
        if (v) snprintf(role, n, "%s", v);
        cJSON_Delete(o);
    }
    client_reply_release(&r);
    client_release(&c);
}

/* Waits up to ms for the server at url to say role: the seconds it took, or -1. */
static double wait_role_at(const char *url, const char *want, int ms) {
    int64_t t0 = mono_ms(), end = t0 + ms;
    char role[32];
    while (mono_ms() < end) {
        role_at(url, role, sizeof role);
        if (strcmp(role, want) == 0) return (double)(mono_ms() - t0) / 1000.0;
        ty_sleep_ms(50);
    }
    return -1;
}

/* wait_role_at of server i */
static double wait_role(int i, const char *want, int ms) {
    char url[64];
    server_url(i, url, sizeof url);
    return wait_role_at(url, want, ms);
}

/* A request through the URL list, as the CLI makes it (the client moves to
 * the leader): the status, the JSON in *out (may be NULL). */
static long req(const char *method, const char *path, const char *body, const char *key, cJSON **out) {
    client c;
    ck_assert_int_eq(client_init(&c, urls, team_tok), 0);
    c.failover_ms = 20000;
    if (key) snprintf(c.idempotency_key, sizeof c.idempotency_key, "%s", key);
    client_reply r;
    int rc = client_request(&c, method, path, body, body ? strlen(body) : 0, NULL, &r);
    long status = rc == 0 ? r.status : 0;
    if (out) *out = status ? cJSON_ParseWithLength(r.body.data, r.body.len) : NULL;
    client_reply_release(&r);
    client_release(&c);
    return status;
}

/* The job's worker-0 log as the leader serves it (the caller frees). */
static char *task_log(int64_t id) { return ty_task_log(urls, team_tok, id, "worker-0"); }

/* The log served now begins with what was served before (a takeover):
 * the logs are the database's, not the DATA of the leader that got them. */
static void log_kept(int64_t id, const char *before, const char *after) {
    char *now = task_log(id);
    ck_assert_msg(strncmp(now, before, strlen(before)) == 0,
                  "after %s the log served does not begin with the %zu bytes served before it (now %zu bytes: %.200s)",
                  after, strlen(before), strlen(now), now);
    free(now);
}

static cJSON *job(int64_t id) {
    char path[64];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld", (long long)id);
    cJSON *o = NULL;
    ck_assert_int_eq(req("GET", path, NULL, NULL, &o), 200);
    return o;
}

static const char *state_of(cJSON *j) { return cJSON_GetStringValue(cJSON_GetObjectItem(j, "state")); }

/* The training job's progress: its latest step, its newest checkpoint's
 * step. */
static void progress(int64_t id, int64_t *step, int *ckpts) {
    cJSON *j = job(id);
    cJSON *p = cJSON_GetObjectItem(j, "progress");
    *step = p ? (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(p, "step")) : 0;
    cJSON_Delete(j);
    char path[80];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints", (long long)id);
    cJSON *o = NULL;
    ck_assert_int_eq(req("GET", path, NULL, NULL, &o), 200);
    *ckpts = 0;
    cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(o, "checkpoints")) {
        int s = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(c, "step"));
        if (s > *ckpts) *ckpts = s;
    }
    cJSON_Delete(o);
}

/* The job's attempt and its tasks' ids, as text ("1: 4,5"). */
static void placement(int64_t id, char *out, size_t n) {
    cJSON *j = job(id);
    int off = snprintf(out, n, "%d:", (int)cJSON_GetNumberValue(cJSON_GetObjectItem(j, "attempt")));
    cJSON *t;
    cJSON_ArrayForEach(t, cJSON_GetObjectItem(j, "tasks")) {
        if (off < (int)n)
            off += snprintf(out + off, n - (size_t)off, " %lld", (long long)cJSON_GetNumberValue(cJSON_GetObjectItem(t, "id")));
    }
    cJSON_Delete(j);
}

/* ---------------------------------------------------------------- submissions
 * A thread posting a job every 200 ms, each with a name and a key of its
 * own, across the takeover: what was acknowledged (201, or 200 for a retry
 * the server had already done). */

#define SUB_MAX 256
static struct {
    pthread_t th;
    volatile int stop;
    int n, acked;
    int64_t id[SUB_MAX];
    char name[SUB_MAX][32];
    int ok[SUB_MAX];
} sub;

static const char SPEC_WAIT[] =
    "{\"name\":\"%s\",\"model\":{\"layers\":[{\"type\":\"dense\",\"units\":1,\"activation\":\"sigmoid\","
    "\"input_shape\":[4]}]},\"compile\":{\"optimizer\":\"sgd\",\"loss\":\"binary_crossentropy\"},"
    "\"data\":{\"source\":\"synthetic\",\"features\":4},\"fit\":{\"epochs\":1,\"batch_size\":10},"
    "\"resources\":{\"workers\":1,\"devices_per_worker\":1,\"device\":\"gpu\"},\"queue_if_infeasible\":true}";

static void *submitter(void *arg) {
    int round = (int)(intptr_t)arg;
    while (!sub.stop && sub.n < SUB_MAX) {
        int k = sub.n;
        snprintf(sub.name[k], sizeof sub.name[k], "ha-sub-%d-%d", round, k);
        char body[1024], key[37];
        snprintf(body, sizeof body, SPEC_WAIT, sub.name[k]);
        if (client_idempotency_key(key) < 0) break;
        cJSON *o = NULL;
        long st = req("POST", "/api/v1/jobs", body, key, &o);
        if ((st == 201 || st == 200) && o) {
            sub.id[k] = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(o, "id"));
            sub.ok[k] = 1;
            sub.acked++;
        }
        cJSON_Delete(o);
        sub.n = k + 1;
        ty_sleep_ms(200);
    }
    return NULL;
}

static void submitter_start(int round) {
    memset(&sub, 0, sizeof sub);
    ck_assert_int_eq(pthread_create(&sub.th, NULL, submitter, (void *)(intptr_t)round), 0);
}

/* Stops it and checks: every acknowledged submission is there, each name
 * once (none twice), and each waits queued (none placed). */
static void submitter_check(int round) {
    sub.stop = 1;
    pthread_join(sub.th, NULL);
    ck_assert_msg(sub.acked > 0, "no submission was acknowledged");
    cJSON *o = NULL;
    ck_assert_int_eq(req("GET", "/api/v1/jobs?limit=1000", NULL, NULL, &o), 200);
    char prefix[32];
    snprintf(prefix, sizeof prefix, "ha-sub-%d-", round);
    int seen[SUB_MAX] = {0};
    cJSON *j;
    cJSON_ArrayForEach(j, cJSON_GetObjectItem(o, "jobs")) {
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(j, "name"));
        if (!name || strncmp(name, prefix, strlen(prefix)) != 0) continue;
        int k = atoi(name + strlen(prefix));
        ck_assert_msg(k >= 0 && k < sub.n, "a job %s nobody submitted", name);
        seen[k]++;
        ck_assert_msg(seen[k] == 1, "%s is there twice", name);
        ck_assert_str_eq(state_of(j), "queued");
        if (sub.ok[k])
            ck_assert_int_eq((int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(j, "id")), sub.id[k]);
    }
    int there = 0;
    for (int k = 0; k < sub.n; k++) {
        if (sub.ok[k]) ck_assert_msg(seen[k] == 1, "%s was acknowledged (job %lld) and is not there", sub.name[k],
                                     (long long)sub.id[k]);
        there += seen[k];
    }
    fprintf(stderr, "ha: round %d: %d submissions, %d acknowledged, %d there, none twice\n", round, sub.n, sub.acked,
            there);
    cJSON_Delete(o);
}

/* ---------------------------------------------------------------- fixture */

static void setup(void) {
    memset(srv_pid, 0, sizeof srv_pid);
    memset(agent_pid, 0, sizeof agent_pid);
    net_ready = 0;
    dir[0] = '\0';
    if (geteuid() != 0 || sh("ip -V") != 0) {
        fprintf(stderr, "SKIP check_ha: needs root and iproute2 to make network namespaces\n");
        return;
    }
    if (access("/usr/lib/postgresql/15/bin/postgres", X_OK) != 0) {
        ck_assert_msg(!pg_required(), "PG_TEST_REQUIRED=1 and no PostgreSQL 15 (apt-get install postgresql-15)");
        fprintf(stderr, "SKIP check_ha: no PostgreSQL 15 (/usr/lib/postgresql/15/bin)\n");
        return;
    }
    if (net_setup() < 0) {
        fprintf(stderr, "SKIP check_ha: cannot make network namespaces with veth and a bridge here\n");
        return;
    }
    net_ready = 1;
    ty_mkdtemp(dir, sizeof dir, "ha");
    ck_assert_int_eq(chmod(dir, 0755), 0);
    ck_assert_msg(pg_start() == 0, "scripts/pg-dev.sh start %s failed", pgdir);
    char u0[64], u1[64];
    server_url(0, u0, sizeof u0);
    server_url(1, u1, sizeof u1);
    snprintf(urls, sizeof urls, "%s,%s", u0, u1);
    srv_pid[0] = spawn_server(0);
    ck_assert_msg(wait_role(0, "leader", 20000) >= 0, "s0 did not lead; see %s/s0/server.log", dir);
    srv_pid[1] = spawn_server(1);
    ck_assert_msg(wait_role(1, "standby", 20000) >= 0, "s1 did not stand by; see %s/s1/server.log", dir);
    ty_proc s0 = {.pid = 0};
    snprintf(s0.dir, sizeof s0.dir, "%.200s/s0", dir);
    ty_token(&s0, "token", team_tok, sizeof team_tok);
    for (int k = 0; k < 2; k++) agent_pid[k] = spawn_agent(k);
    int64_t end = mono_ms() + 30000;
    int nodes = 0;
    while (mono_ms() < end && nodes < 2) {
        cJSON *o = NULL;
        if (req("GET", "/api/v1/cluster", NULL, NULL, &o) == 200) nodes = cJSON_GetArraySize(cJSON_GetObjectItem(o, "nodes"));
        cJSON_Delete(o);
        if (nodes < 2) ty_sleep_ms(200);
    }
    ck_assert_msg(nodes == 2, "only %d node(s) registered; see %s/agent*.log", nodes, dir);
}

static void stop_pid(pid_t *p) {
    if (*p > 0) {
        ty_proc q = {.pid = *p};
        ty_kill(&q, SIGTERM);
    }
    *p = 0;
}

static void teardown(void) {
    for (int k = 0; k < 2; k++) stop_pid(&agent_pid[k]);
    for (int i = 0; i < 2; i++) stop_pid(&srv_pid[i]);
    /* a re-executed ex-leader is the same process (exec keeps the pid) */
    if (pgdir[0]) sh("scripts/pg-dev.sh stop %s", pgdir);
    if (dir[0]) {
        if (getenv("TY_KEEP")) fprintf(stderr, "ha: kept %s\n", dir);
        else ty_rmrf(dir);
    }
    if (net_ready) net_teardown();
}

/* ---------------------------------------------------------------- the test */

/* 2 workers, one per node (one slot each), training until the test is done
 * with it (cancelled), a checkpoint every epoch (the newest 3 kept). The
 * agents run them under SCHED_IDLE: this test runs beside make test's loop
 * (tests/run_all.sh), whose checks must not wait for a core behind it. */
static const char SPEC_TRAIN[] =
    "{\"name\":\"ha-train\",\"model\":{\"layers\":["
    "{\"type\":\"dense\",\"units\":256,\"activation\":\"relu\",\"input_shape\":[64]},"
    "{\"type\":\"dense\",\"units\":1,\"activation\":\"sigmoid\"}]},"
    "\"compile\":{\"optimizer\":{\"type\":\"sgd\",\"learning_rate\":0.05},\"loss\":\"binary_crossentropy\"},"
    "\"data\":{\"source\":\"synthetic\",\"examples\":24000,\"features\":64,\"seed\":5},"
    "\"fit\":{\"epochs\":5000,\"batch_size\":64},"
    "\"strategy\":{\"type\":\"multi_worker_mirrored\",\"communication\":\"ring\"},"
    "\"resources\":{\"workers\":2,\"devices_per_worker\":1,\"device\":\"cpu\"},"
    "\"checkpoint\":{\"every_epochs\":1,\"keep\":3},\"max_restarts\":3}";

static const char SPEC_SMALL[] =
    "{\"name\":\"ha-queued\",\"model\":{\"layers\":[{\"type\":\"dense\",\"units\":1,\"activation\":\"sigmoid\","
    "\"input_shape\":[4]}]},\"compile\":{\"optimizer\":\"sgd\",\"loss\":\"binary_crossentropy\"},"
    "\"data\":{\"source\":\"synthetic\",\"features\":4},\"fit\":{\"epochs\":1,\"batch_size\":10},"
    "\"resources\":{\"workers\":1,\"devices_per_worker\":1,\"device\":\"cpu\"}}";

/* Waits until the training job has moved past (step, ckpts) on the leader
 * it has now: it trains on and its checkpoints land. */
static void trains_on(int64_t id, int64_t step, int ckpts, const char *after) {
    int64_t end = mono_ms() + 60000, s = 0;
    int c = 0;
    while (mono_ms() < end) {
        progress(id, &s, &c);
        if (s > step && c > ckpts) break;
        ty_sleep_ms(300);
    }
    ck_assert_msg(s > step && c > ckpts, "after %s: the job's step %lld (was %lld), newest checkpoint at step %d (was %d)",
                  after, (long long)s, (long long)step, c, ckpts);
}

START_TEST(leader_fails_over) {
    if (!net_ready) return; /* skipped, said why */
    char key[37];
    ck_assert_int_eq(client_idempotency_key(key), 0);
    cJSON *o = NULL;
    ck_assert_int_eq(req("POST", "/api/v1/jobs", SPEC_TRAIN, key, &o), 201);
    int64_t train = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(o, "id"));
    cJSON_Delete(o);
    /* it trains, on both nodes, and has a checkpoint */
    int64_t step = 0, end = mono_ms() + 90000;
    int ckpts = 0;
    while (mono_ms() < end) {
        progress(train, &step, &ckpts);
        if (step > 0 && ckpts > 0) break;
        ty_sleep_ms(300);
    }
    ck_assert_msg(step > 0 && ckpts > 0, "the job did not train (step %lld, %d checkpoints); see %s", (long long)step,
                  ckpts, dir);
    /* a job that must wait for the slots the training holds */
    ck_assert_int_eq(client_idempotency_key(key), 0);
    ck_assert_int_eq(req("POST", "/api/v1/jobs", SPEC_SMALL, key, &o), 201);
    int64_t queued = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(o, "id"));
    cJSON_Delete(o);
    char placed[200];
    placement(train, placed, sizeof placed);
    /* its output so far, as the first leader serves it */
    char *logged = task_log(train);
    for (int64_t lend = mono_ms() + 30000; !logged[0] && mono_ms() < lend; ty_sleep_ms(300)) {
        free(logged);
        logged = task_log(train);
    }
    ck_assert_msg(logged[0], "the training job logged nothing in 30 s; see %s", dir);

    /* 1. kill -9 of the leader */
    submitter_start(1);
    ty_sleep_ms(1500);
    progress(train, &step, &ckpts);
    int64_t t0 = mono_ms();
    ck_assert_int_eq(kill(srv_pid[0], SIGKILL), 0);
    waitpid(srv_pid[0], NULL, 0);
    srv_pid[0] = 0;
    double took = wait_role(1, "leader", 20000);
    ck_assert_msg(took >= 0, "s1 did not lead within 20 s of the kill; see %s/s1/server.log", dir);
    double kill_s = (double)(mono_ms() - t0) / 1000.0;
    ty_sleep_ms(2000);
    submitter_check(1);
    fprintf(stderr, "ha: kill -9 of the leader: the standby led %.2f s later\n", kill_s);
    ck_assert_msg(kill_s < 10.0, "the standby led %.2f s after the kill (want < 10 s)", kill_s);
    trains_on(train, step, ckpts, "the kill");
    log_kept(train, logged, "the kill");
    free(logged);
    logged = task_log(train);
    char now[200];
    placement(train, now, sizeof now);
    ck_assert_msg(strcmp(now, placed) == 0, "the job was placed again: %s, was %s", now, placed);

    /* 2. s0 back as a standby; the leader's network cut */
    srv_pid[0] = spawn_server(0);
    ck_assert_msg(wait_role(0, "standby", 20000) >= 0, "s0 did not come back as a standby; see %s/s0/server.log", dir);
    submitter_start(2);
    ty_sleep_ms(1500);
    progress(train, &step, &ckpts);
    t0 = mono_ms();
    ck_assert_int_eq(sh("ip link set %s down", vroot[1]), 0);
    took = wait_role(0, "leader", 20000);
    ck_assert_msg(took >= 0, "s0 did not lead within 20 s of the cut; see %s/s0/server.log", dir);
    double cut_s = (double)(mono_ms() - t0) / 1000.0;
    ty_sleep_ms(2000);
    submitter_check(2);
    fprintf(stderr, "ha: the leader's network cut: the standby led %.2f s later\n", cut_s);
    ck_assert_msg(cut_s < 10.0, "the standby led %.2f s after the cut (want < 10 s)", cut_s);
    trains_on(train, step, ckpts, "the cut");
    log_kept(train, logged, "the cut");
    free(logged);
    placement(train, now, sizeof now);
    ck_assert_msg(strcmp(now, placed) == 0, "the job was placed again: %s, was %s", now, placed);
    /* the link back: the cut one stepped down and stands by */
    ck_assert_int_eq(sh("ip link set %s up", vroot[1]), 0);
    ck_assert_msg(wait_role(1, "standby", 30000) >= 0, "s1 is not a standby once its link is back; see %s/s1/server.log",
                  dir);
    char logp[320];
    snprintf(logp, sizeof logp, "%s/s1/server.log", dir);
    size_t n = 0;
    char *log = file_read_all(logp, 8 << 20, &n);
    ck_assert_ptr_nonnull(log);
    ck_assert_msg(strstr(log, "no longer the leader") != NULL, "s1 never said it stepped down; see %s", logp);
    free(log);

    /* the training, still in its first attempt, is cancelled; the queued
     * job is placed and runs */
    cJSON *j = job(train);
    ck_assert_str_eq(state_of(j), "running");
    ck_assert_int_eq((int)cJSON_GetNumberValue(cJSON_GetObjectItem(j, "attempt")), 1);
    cJSON_Delete(j);
    j = NULL;
    char cpath[80];
    snprintf(cpath, sizeof cpath, "/api/v1/jobs/%lld/cancel", (long long)train);
    ck_assert_int_eq(req("POST", cpath, NULL, NULL, NULL), 200);
    end = mono_ms() + 180000;
    const char *st = "";
    while (mono_ms() < end) {
        cJSON_Delete(j);
        j = job(queued);
        st = state_of(j);
        if (strcmp(st, "succeeded") == 0 || strcmp(st, "failed") == 0) break;
        ty_sleep_ms(500);
    }
    ck_assert_msg(strcmp(st, "succeeded") == 0, "the queued job: %s; see %s", st, dir);
    ck_assert_int_eq((int)cJSON_GetNumberValue(cJSON_GetObjectItem(j, "attempt")), 1);
    cJSON_Delete(j);
    fprintf(stderr, "ha: takeover after kill -9 %.2f s, after the cut %.2f s; the job trained on in attempt 1\n",
            kill_s, cut_s);
}
END_TEST

/* ---------------------------------------------------------------- the database lost
 * One server on a PostgreSQL on loopback, which is stopped under it
 * (pg_ctl stop -m immediate) and started again: while it is gone a write is
 * 503 naming the database's host and libpq's reason and stores nothing;
 * within the lease's deadline the server no longer leads; once it is back
 * the server leads again and has lost nothing it acknowledged. */

static char lost_dir[256], lost_pg[300], lost_url[700], lost_listen[32];
static ty_proc lost_srv;
static pid_t frozen[128]; /* PostgreSQL's processes stopped by pg_freeze */
static int n_frozen;

static int pg_ctl(const char *what) {
    char cmd[900];
    snprintf(cmd, sizeof cmd, "%s /usr/lib/postgresql/15/bin/pg_ctl -D %s/data -l %s/log/postgres.log -w %s%s",
             geteuid() == 0 ? "runuser -u postgres --" : "", lost_pg, lost_pg, what,
             strcmp(what, "stop") == 0 ? " -m immediate" : "");
    return sh("%s", cmd);
}

static void lost_setup(void) {
    memset(&lost_srv, 0, sizeof lost_srv);
    lost_dir[0] = lost_pg[0] = '\0';
    if (access("/usr/lib/postgresql/15/bin/postgres", X_OK) != 0) {
        ck_assert_msg(!pg_required(), "PG_TEST_REQUIRED=1 and no PostgreSQL 15 (apt-get install postgresql-15)");
        fprintf(stderr, "SKIP check_ha (database lost): no PostgreSQL 15\n");
        return;
    }
    ty_mkdtemp(lost_dir, sizeof lost_dir, "halost");
    ck_assert_int_eq(chmod(lost_dir, 0755), 0);
    snprintf(lost_pg, sizeof lost_pg, "%s/pg", lost_dir);
    char cmd[600], line[800], url[700] = "";
    /* durable (not PG_DEV_FAST): its crash must keep what it committed */
    snprintf(cmd, sizeof cmd, "scripts/pg-dev.sh start %s 2>&1", lost_pg);
    FILE *f = popen(cmd, "r");
    ck_assert_ptr_nonnull(f);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "DATABASE_URL=", 13) == 0) sscanf(line + 13, "%699s", url);
    ck_assert_int_eq(pclose(f), 0);
    ck_assert_msg(url[0], "scripts/pg-dev.sh start printed no DATABASE_URL");
    snprintf(lost_srv.dir, sizeof lost_srv.dir, "%.200s/data", lost_dir);
    mkdir(lost_srv.dir, 0700);
    /* a fixed port: a server that stops leading starts again (the same
     * process, exec'd) and listens where it did */
    snprintf(lost_url, sizeof lost_url, "%s", url);
    snprintf(lost_listen, sizeof lost_listen, "127.0.0.1:%d", ty_free_port());
    const char *extra[] = {"--db", lost_url, "--listen", lost_listen, NULL};
    ty_server_start_args(&lost_srv, "server", extra);
    ty_token(&lost_srv, "token", team_tok, sizeof team_tok);
}

/* PostgreSQL hung, not gone: its postmaster and every process it started
 * stopped (SIGSTOP). The kernel keeps their sockets up and acknowledges
 * what is sent, so a client sees no error, only no answer. */
static int pg_freeze(void) {
    char path[400];
    snprintf(path, sizeof path, "%s/data/postmaster.pid", lost_pg);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    long pm = 0;
    int got = fscanf(f, "%ld", &pm);
    fclose(f);
    if (got != 1 || pm <= 0 || kill((pid_t)pm, SIGSTOP) != 0) return -1;
    frozen[n_frozen++] = (pid_t)pm;
    DIR *d = opendir("/proc");
    if (!d) return -1;
    struct dirent *e;
    while ((e = readdir(d)) && n_frozen < (int)(sizeof frozen / sizeof frozen[0])) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 0) continue;
        char stat[600];
        snprintf(path, sizeof path, "/proc/%ld/stat", pid);
        FILE *sf = fopen(path, "r");
        if (!sf) continue;
        size_t n = fread(stat, 1, sizeof stat - 1, sf);
        fclose(sf);
        stat[n] = '\0';
        const char *rp = strrchr(stat, ')'); /* "pid (comm) state ppid ..." */
        long ppid = 0;
        char st;
        if (rp && sscanf(rp + 1, " %c %ld", &st, &ppid) == 2 && ppid == pm && kill((pid_t)pid, SIGSTOP) == 0)
            frozen[n_frozen++] = (pid_t)pid;
    }
    closedir(d);
    return 0;
}

static void pg_thaw(void) {
    for (int i = 0; i < n_frozen; i++) kill(frozen[i], SIGCONT);
    n_frozen = 0;
}

static void lost_teardown(void) {
    pg_thaw();
    ty_kill(&lost_srv, SIGTERM);
    if (lost_pg[0]) sh("scripts/pg-dev.sh stop %s", lost_pg);
    if (lost_dir[0] && !getenv("TY_KEEP")) ty_rmrf(lost_dir);
}

static int count_jobs(const char *url) {
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(url, team_tok, "GET", "/api/v1/jobs?limit=1000", NULL, &o), 200);
    int n = cJSON_GetArraySize(cJSON_GetObjectItem(o, "jobs"));
    cJSON_Delete(o);
    return n;
}

START_TEST(database_lost_mid_run) {
    if (!lost_pg[0]) return; /* skipped, said why */
    char body[1024];
    snprintf(body, sizeof body, SPEC_WAIT, "ha-before");
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(lost_srv.url, team_tok, "POST", "/api/v1/jobs", body, &o), 201);
    cJSON_Delete(o);
    int before = count_jobs(lost_srv.url);
    ck_assert_int_eq(pg_ctl("stop"), 0);
    /* a write: 503 naming the database and why; nothing stored */
    snprintf(body, sizeof body, SPEC_WAIT, "ha-during");
    client c;
    ck_assert_int_eq(client_init(&c, lost_srv.url, team_tok), 0);
    client_reply r;
    ck_assert_int_eq(client_request(&c, "POST", "/api/v1/jobs", body, strlen(body), NULL, &r), 0);
    ck_assert_int_eq(r.status, 503);
    o = cJSON_ParseWithLength(r.body.data, r.body.len);
    ck_assert_ptr_nonnull(o);
    const char *msg = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "error"), "message"));
    /* a session open when it went: "server closed the connection"; a new
     * one: "Connection refused"; the host and port either way */
    ck_assert_msg(msg && strstr(msg, "database") && strstr(msg, "127.0.0.1:"), "503 says: %s", msg ? msg : "(nothing)");
    cJSON_Delete(o);
    client_reply_release(&r);
    client_release(&c);
    /* it stops leading within the deadline (4 s of the default 6 s lease):
     * a standby's health, or none while it starts again */
    int64_t t0 = mono_ms();
    char role[32] = "leader";
    while (mono_ms() - t0 < 8000) {
        role_at(lost_srv.url, role, sizeof role);
        if (strcmp(role, "leader") != 0) break;
        ty_sleep_ms(100);
    }
    ck_assert_msg(strcmp(role, "leader") != 0, "still the leader 8 s after its database went");
    fprintf(stderr, "ha: the database gone: the server no longer answered as the leader %.2f s later\n", (double)(mono_ms() - t0) / 1000.0);
    /* the database back: the server leads again, with what it acknowledged */
    ck_assert_int_eq(pg_ctl("start"), 0);
    ck_assert_msg(wait_role_at(lost_srv.url, "leader", 30000) >= 0, "not the leader 30 s after its database came back");
    ck_assert_int_eq(count_jobs(lost_srv.url), before);
}
END_TEST

/* PostgreSQL hangs (stopped, its sockets up): a request waiting for it,
 * then the server told to stop. The server stops within seconds (each wait
 * for the database gives up 2 s after the stop began; storage/db.h
 * db_abandon) instead of joining threads that wait for ever; the request is
 * answered or its connection closed, never left hanging; what it asked was
 * not stored; and once PostgreSQL runs again, a server started on it has
 * everything it acknowledged. */
START_TEST(database_hangs_at_stop) {
    if (!lost_pg[0]) return; /* skipped, said why */
    char body[1024];
    snprintf(body, sizeof body, SPEC_WAIT, "ha-hang-before");
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(lost_srv.url, team_tok, "POST", "/api/v1/jobs", body, &o), 201);
    cJSON_Delete(o);
    int before = count_jobs(lost_srv.url);
    /* from the freeze to the thaw no ck_assert: a failed one ends the test
     * process at once (no teardown), which would leave PostgreSQL stopped */
    int frozen_ok = pg_freeze() == 0;
    /* a submission in a child process: it waits on the hung database */
    pid_t req = frozen_ok ? fork() : -1;
    if (req == 0) { /* no ck_assert here either: a child's would count as the test's */
        char b[1024];
        snprintf(b, sizeof b, SPEC_WAIT, "ha-hang-during");
        client c;
        client_reply r;
        if (client_init(&c, lost_srv.url, team_tok) != 0) _exit(1);
        int rc = client_request(&c, "POST", "/api/v1/jobs", b, strlen(b), NULL, &r);
        _exit(rc != 0 ? 2 : r.status == 503 ? 0 : 1); /* 503, or the connection closed */
    }
    int status = 0, done = 0, rs = 0, req_done = 0;
    double took = 0;
    if (req > 0) {
        ty_sleep_ms(500);
        int64_t t0 = mono_ms();
        kill(lost_srv.pid, SIGTERM);
        while (!done && mono_ms() - t0 < 20000) {
            done = waitpid(lost_srv.pid, &status, WNOHANG) == lost_srv.pid;
            if (!done) ty_sleep_ms(50);
        }
        took = (double)(mono_ms() - t0) / 1000.0;
        if (done) lost_srv.pid = 0;
        t0 = mono_ms();
        while (!(req_done = waitpid(req, &rs, WNOHANG) == req) && mono_ms() - t0 < 10000) ty_sleep_ms(50);
    }
    pg_thaw();
    if (req > 0 && !done) { /* the server hung: it goes now, not with the test's process */
        kill(lost_srv.pid, SIGKILL);
        waitpid(lost_srv.pid, &status, 0);
        lost_srv.pid = 0;
    }
    if (req > 0 && !req_done) {
        kill(req, SIGKILL);
        waitpid(req, &rs, 0);
    }
    ck_assert_msg(frozen_ok, "could not stop PostgreSQL's processes (%s/data/postmaster.pid)", lost_pg);
    ck_assert_int_gt(req, 0);
    ck_assert_msg(done, "the server had not stopped 20 s after SIGTERM with its database hung");
    fprintf(stderr, "ha: the database hung: the server stopped %.2f s after SIGTERM\n", took);
    ck_assert_msg(took < 10.0, "the server took %.2f s to stop with its database hung", took);
    ck_assert_msg(req_done, "the submission still waited 10 s after the server stopped");
    ck_assert_msg(WIFEXITED(rs) && WEXITSTATUS(rs) != 1, "the submission got neither 503 nor a closed connection");
    /* PostgreSQL runs again: a server on it has what was acknowledged, and
     * not the submission it never committed */
    const char *extra[] = {"--db", lost_url, "--listen", lost_listen, NULL};
    ty_server_start_args(&lost_srv, "server", extra);
    ck_assert_msg(wait_role_at(lost_srv.url, "leader", 30000) >= 0, "not the leader 30 s after its start");
    ck_assert_int_eq(count_jobs(lost_srv.url), before);
}
END_TEST

int main(void) {
    Suite *s = suite_create("ha");
    TCase *tl = tcase_create("database_lost");
    tcase_add_checked_fixture(tl, lost_setup, lost_teardown);
    tcase_set_timeout(tl, 120);
    tcase_add_test(tl, database_lost_mid_run);
    tcase_add_test(tl, database_hangs_at_stop);
    suite_add_tcase(s, tl);
    TCase *t = tcase_create("failover");
    tcase_add_checked_fixture(t, setup, teardown);
    tcase_set_timeout(t, 420);
    tcase_add_test(t, leader_fails_over);
    suite_add_tcase(s, t);
    return ty_run_suite(s);
}
