/* check_netns.c - a multi_worker_mirrored job whose ring really crosses
 * hosts: two agents, each in its own network namespace (ip netns + veth on
 * a bridge, made here), one CPU slot each, so the scheduler must put one
 * worker on each; the workers find each other through the rendezvous API
 * and talk over TCP between the namespaces (their host ids differ, so no
 * shared memory). The job trains to succeeded with its metrics and test
 * accuracy, and the workers' logs show they joined. Off loopback the server
 * serves HTTPS (`--tls auto`, as a server on a network must): agent 0 joins
 * with the CA's hash (--ca-hash), agent 1 with the CA file (--ca-cert), and
 * their workers report over HTTPS with the CA the agent hands them.
 *
 * Needs root (CAP_NET_ADMIN) and iproute2: where namespaces cannot be
 * made, the test says so and passes without running. */
#include "testlib.h"

#include <stdarg.h>

static ty_proc srv;
static char team_tok[128];
static pid_t agents[2];
static char ns[2][32], br[16], veth_root[2][16], veth_ns[2][16];
static int net_ready;

#define NET "10.213.77"

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
    char cmd[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    char full[1100];
    snprintf(full, sizeof full, "%s >/dev/null 2>&1", cmd);
    return system(full);
}

static void net_teardown(void) {
    for (int i = 0; i < 2; i++) {
        if (ns[i][0]) sh("ip netns del %s", ns[i]);
        if (veth_root[i][0]) sh("ip link del %s", veth_root[i]);
    }
    if (br[0]) sh("ip link del %s", br);
}

/* Bridge BR (NET.1) in this namespace; namespace i gets NET.(2+i) on a veth
 * whose other end is on the bridge. Returns 0, or -1 (nothing left behind). */
static int net_setup(void) {
    /* what a run killed before its teardown left (a second bridge with
     * NET.1 would take the routes): this test's names only */
    sh("for n in $(ip netns list | awk '/^ty-ns[0-9]+-[01]( |$)/ {print $1}'); do ip netns del $n; done");
    sh("for l in $(ip -o link show type bridge | awk -F': ' '$2 ~ /^tybr[0-9]+$/ {print $2}'); do ip link del $l; done");
    int id = (int)getpid() % 100000;
    snprintf(br, sizeof br, "tybr%d", id);
    for (int i = 0; i < 2; i++) {
        snprintf(ns[i], sizeof ns[i], "ty-ns%d-%d", id, i);
        snprintf(veth_root[i], sizeof veth_root[i], "tyv%d%c", id, 'a' + i);
        snprintf(veth_ns[i], sizeof veth_ns[i], "tyn%d%c", id, 'a' + i);
    }
    if (sh("ip link add %s type bridge", br) || sh("ip addr add " NET ".1/24 dev %s", br) ||
        sh("ip link set %s up", br))
        goto fail;
    for (int i = 0; i < 2; i++) {
        if (sh("ip netns add %s", ns[i]) || sh("ip link add %s type veth peer name %s", veth_root[i], veth_ns[i]) ||
            sh("ip link set %s master %s up", veth_root[i], br) || sh("ip link set %s netns %s", veth_ns[i], ns[i]) ||
            sh("ip netns exec %s ip addr add " NET ".%d/24 dev %s", ns[i], 2 + i, veth_ns[i]) ||
            sh("ip netns exec %s ip link set %s up", ns[i], veth_ns[i]) ||
            sh("ip netns exec %s ip link set lo up", ns[i]))
            goto fail;
    }
    return 0;
fail:
    net_teardown();
    memset(ns, 0, sizeof ns);
    memset(veth_root, 0, sizeof veth_root);
    br[0] = 0;
    return -1;
}

static pid_t agent_in_ns(int i) {
    char tokfile[400], logf[400], statef[400], addr[32], name[32], url[128];
    snprintf(statef, sizeof statef, "%s/agent%d.state", srv.dir, i);
    snprintf(tokfile, sizeof tokfile, "%s/node.token", srv.dir);
    snprintf(logf, sizeof logf, "%s/agent%d.log", srv.dir, i);
    snprintf(addr, sizeof addr, NET ".%d", 2 + i);
    snprintf(name, sizeof name, "netns-node-%d", i);
    /* the server listens on the bridge address */
    const char *port = strrchr(srv.url, ':');
    ck_assert_ptr_nonnull(port);
    snprintf(url, sizeof url, "https://" NET ".1%s", port);
    /* agent 0 trusts the CA whose hash it was given, agent 1 the CA's file */
    char cafile[400], pin[TLS_PIN_LEN];
    snprintf(cafile, sizeof cafile, "%s/tls/ca.crt", srv.dir);
    ty_ca_pin(&srv, pin);
    const char *trust_flag = i == 0 ? "--ca-hash" : "--ca-cert", *trust = i == 0 ? pin : cafile;
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        FILE *lf = freopen(logf, "a", stderr);
        (void)lf;
        unsetenv("TRAINYARD_CA");
        execlp("ip", "ip", "netns", "exec", ns[i], ty_bin(), "agent", "--server", url, trust_flag, trust,
               "--token-file", tokfile, "--hostname", name, "--address", addr, "--cpu-slots", "1", "--heartbeat",
               "1", "--poll-wait", "3", "--state-file", statef, (char *)NULL);
        _exit(127);
    }
    return pid;
}

static void setup(void) {
    memset(&srv, 0, sizeof srv);
    memset(agents, 0, sizeof agents);
    net_ready = 0;
    if (geteuid() != 0) {
        fprintf(stderr, "SKIP check_netns: not root, cannot make network namespaces\n");
        return;
    }
    if (sh("ip -V") != 0) {
        fprintf(stderr, "SKIP check_netns: iproute2 (ip) is not installed\n");
        return;
    }
    if (net_setup() < 0) {
        fprintf(stderr, "SKIP check_netns: cannot make network namespaces with veth and a bridge here\n");
        return;
    }
    net_ready = 1;
    ty_mkdtemp(srv.dir, sizeof srv.dir, "netns");
    const char *extra[] = {"--listen", NET ".1:0", "--heartbeat-timeout", "5", "--tls", "auto", NULL};
    ty_server_start_args(&srv, "server", extra);
    ty_token(&srv, "token", team_tok, sizeof team_tok);
    char cafile[400], err[512];
    snprintf(cafile, sizeof cafile, "%s/tls/ca.crt", srv.dir);
    ck_assert_msg(client_trust_ca_file(cafile, "ca", err, sizeof err) == 0, "%s", err);
    for (int i = 0; i < 2; i++) agents[i] = agent_in_ns(i);
}

static void teardown(void) {
    for (int i = 0; i < 2; i++) {
        if (agents[i] > 0) {
            ty_proc p = {.pid = agents[i]};
            ty_kill(&p, SIGTERM);
        }
    }
    ty_kill(&srv, SIGTERM);
    if (srv.dir[0]) {
        if (getenv("E2E_KEEP")) fprintf(stderr, "netns: kept %s\n", srv.dir);
        else ty_rmrf(srv.dir);
    }
    if (net_ready) net_teardown();
}

static char *logs_of(int64_t id, const char *task) {
    char path[128];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/logs?task=%s", (long long)id, task);
    client c;
    ck_assert_int_eq(client_init(&c, srv.url, team_tok), 0);
    client_reply r;
    ck_assert_int_eq(client_request(&c, "GET", path, NULL, 0, NULL, &r), 0);
    char *s = r.status == 200 ? buf_detach(&r.body, NULL) : NULL;
    client_reply_release(&r);
    client_release(&c);
    return s ? s : xstrdup("");
}

START_TEST(multi_worker_ring_crosses_namespaces) {
    if (!net_ready) return; /* skipped, said why */
    /* both nodes registered */
    int64_t end = mono_ms() + 30000;
    int nodes = 0;
    while (mono_ms() < end && nodes < 2) {
        cJSON *o = NULL;
        ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", "/api/v1/cluster", NULL, &o), 200);
        nodes = cJSON_GetArraySize(cJSON_GetObjectItem(o, "nodes"));
        cJSON_Delete(o);
        if (nodes < 2) ty_sleep_ms(200);
    }
    ck_assert_msg(nodes == 2, "only %d node(s) registered; see %s/agent*.log", nodes, srv.dir);

    const char *spec =
        "{\"name\":\"netns-mwm\",\"model\":{\"layers\":["
        "{\"type\":\"dense\",\"units\":64,\"activation\":\"relu\",\"input_shape\":[784]},"
        "{\"type\":\"dropout\",\"rate\":0.2},"
        "{\"type\":\"dense\",\"units\":10,\"activation\":\"softmax\"}]},"
        "\"compile\":{\"optimizer\":{\"type\":\"adam\",\"learning_rate\":0.002},"
        "\"loss\":\"sparse_categorical_crossentropy\",\"metrics\":[\"accuracy\"]},"
        "\"data\":{\"source\":\"fashion-mnist\",\"limit\":2000,\"validation_split\":0.1,\"seed\":3},"
        "\"fit\":{\"epochs\":3,\"batch_size\":40},"
        "\"strategy\":{\"type\":\"multi_worker_mirrored\",\"communication\":\"ring\"},"
        "\"resources\":{\"workers\":2,\"devices_per_worker\":1,\"device\":\"cpu\"}}";
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", "/api/v1/jobs", spec, &o), 201);
    int64_t id = (int64_t)cJSON_GetObjectItem(o, "id")->valuedouble;
    cJSON_Delete(o);

    char state[32] = "";
    end = mono_ms() + 180000;
    while (mono_ms() < end) {
        char path[64];
        snprintf(path, sizeof path, "/api/v1/jobs/%lld", (long long)id);
        ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", path, NULL, &o), 200);
        snprintf(state, sizeof state, "%s", cJSON_GetObjectItem(o, "state")->valuestring);
        /* one worker on each node */
        cJSON *tasks = cJSON_GetObjectItem(o, "tasks");
        if (cJSON_GetArraySize(tasks) == 2) {
            const char *n0 = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(tasks, 0), "node"));
            const char *n1 = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(tasks, 1), "node"));
            if (n0 && n1) ck_assert_msg(strcmp(n0, n1) != 0, "both workers on node %s", n0);
        }
        cJSON_Delete(o);
        if (!strcmp(state, "succeeded") || !strcmp(state, "failed") || !strcmp(state, "cancelled")) break;
        ty_sleep_ms(250);
    }
    char *l0 = logs_of(id, "worker-0"), *l1 = logs_of(id, "worker-1");
    ck_assert_msg(strcmp(state, "succeeded") == 0, "job %s\nworker-0: %.2000s\nworker-1: %.2000s", state, l0, l1);
    /* each worker joined the ring from its own namespace */
    ck_assert_msg(strstr(l0, "joining 2 workers") != NULL, "worker-0: %.2000s", l0);
    ck_assert_msg(strstr(l1, "joining 2 workers") != NULL, "worker-1: %.2000s", l1);
    ck_assert_msg(strstr(l0, "test: loss") != NULL, "worker-0: %.2000s", l0);
    free(l0);
    free(l1);

    /* the chief's metrics: 3 epochs of 45 steps, a test accuracy */
    char path[128];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/metrics?since=0&kind=test", (long long)id);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", path, NULL, &o), 200);
    cJSON *m = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "metrics"), 0);
    ck_assert_ptr_nonnull(m);
    double acc = cJSON_GetObjectItem(m, "test_accuracy")->valuedouble;
    ck_assert_msg(acc > 0.65, "test accuracy %.3f", acc);
    ck_assert_int_eq((int)cJSON_GetObjectItem(m, "step")->valuedouble, 135);
    fprintf(stderr, "netns: 2 workers in 2 namespaces trained to test accuracy %.3f\n", acc);
    cJSON_Delete(o);
}
END_TEST

int main(void) {
    Suite *s = suite_create("netns");
    TCase *t = tcase_create("two_hosts");
    tcase_add_checked_fixture(t, setup, teardown);
    tcase_set_timeout(t, 240);
    tcase_add_test(t, multi_worker_ring_crosses_namespaces);
    suite_add_tcase(s, t);
    return ty_run_suite(s);
}
