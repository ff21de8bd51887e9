/* check_isolation.c - teams kept apart on the node (executor/isolate.c), on
 * `trainyard up` run as root, through the API: team B's command job probes
 * for team A's token (/proc/PID/environ), processes, files, /tmp and
 * /dev/shm, and for the agent's and server's files, while team A's
 * training job (and a program of its own) runs on to success; a job that allocates past resources.memory is killed
 * and reported out of memory (twice: once per attempt of its budget) while
 * a neighbour finishes; a fork loop stops at the pids limit; two one-slot
 * jobs each get about one core on a two-slot node whatever they run; a task
 * cannot open another GPU's device node (the devices cgroup, with device
 * nodes made here); an agent that cannot switch users says so and the
 * cluster marks its node `isolation: none`. Root is needed for all but the
 * last: without it they say SKIP and why. docs/reliability.md has the
 * matrix these tests back. */
#include "testlib.h"
#include "../executor/isolate.h"

#include <fcntl.h>
#include <grp.h>
#include <sys/sysmacros.h>

static ty_proc srv;
static char team_a[128], team_b[128], admin[128];

static int need_root(const char *test) {
    if (geteuid() == 0) return 1;
    printf("%s: SKIP: needs root (tasks are switched to other uids, cgroups made)\n", test);
    return 0;
}

static void up_with(const char *const *extra) {
    memset(&srv, 0, sizeof srv);
    ty_mkdtemp(srv.dir, sizeof srv.dir, "iso");
    ty_server_start_args(&srv, "up", extra);
    ty_token(&srv, "token", team_a, sizeof team_a);
    ty_token(&srv, "admin.token", admin, sizeof admin);
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, admin, "POST", "/api/v1/teams", "{\"name\":\"vision\"}", &o), 201);
    snprintf(team_b, sizeof team_b, "%s", ty_str(o, "token"));
    cJSON_Delete(o);
}

static void down(void) {
    if (srv.pid > 0) ty_kill(&srv, SIGTERM);
    if (srv.dir[0] && !getenv("E2E_KEEP")) ty_rmrf(srv.dir);
    srv.dir[0] = '\0';
}

static void setup(void) { memset(&srv, 0, sizeof srv); }

/* Waits for a terminal state (or `want`); the job (caller deletes). */
static cJSON *wait_job(const char *tok, int64_t id, const char *want, int timeout_s) {
    int64_t end = mono_ms() + (int64_t)timeout_s * 1000;
    for (;;) {
        cJSON *o = ty_job_get(srv.url, tok, id);
        const char *s = ty_str(o, "state");
        if ((want && strcmp(s, want) == 0) || strcmp(s, "succeeded") == 0 || strcmp(s, "failed") == 0 ||
            strcmp(s, "cancelled") == 0 || mono_ms() > end)
            return o;
        cJSON_Delete(o);
        ty_sleep_ms(100);
    }
}

/* A command job running python3 -c SCRIPT, with env (a JSON object text or
 * NULL) and resources (JSON text or NULL). */
static int64_t submit_py(const char *tok, const char *name, const char *script, const char *env,
                         const char *resources, int max_restarts) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", name);
    cJSON_AddNumberToObject(o, "max_restarts", max_restarts);
    cJSON *cmd = cJSON_AddObjectToObject(o, "command");
    cJSON *argv = cJSON_AddArrayToObject(cmd, "argv");
    cJSON_AddItemToArray(argv, cJSON_CreateString("/usr/bin/python3"));
    cJSON_AddItemToArray(argv, cJSON_CreateString("-c"));
    cJSON_AddItemToArray(argv, cJSON_CreateString(script));
    if (env) cJSON_AddItemToObject(cmd, "env", cJSON_Parse(env));
    if (resources) cJSON_AddItemToObject(o, "resources", cJSON_Parse(resources));
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    int64_t id = ty_submit(srv.url, tok, s);
    free(s);
    return id;
}

/* The first line of the task's log that starts with prefix (copied), or
 * "" when none. */
static void log_line(const char *tok, int64_t id, const char *prefix, char *out, size_t n) {
    char *log = ty_task_log(srv.url, tok, id, "worker-0");
    out[0] = '\0';
    for (char *l = log; l && *l;) {
        char *nl = strchr(l, '\n');
        if (nl) *nl = '\0';
        if (strncmp(l, prefix, strlen(prefix)) == 0) {
            snprintf(out, n, "%s", l);
            break;
        }
        l = nl ? nl + 1 : NULL;
    }
    free(log);
}

/* ---------------------------------------------------------------- two teams */

/* Team A: writes a world-readable file in /tmp and one in /dev/shm, a
 * checkpoint, a metric, then waits for team B's probe and exits 0. */
static const char *A_SCRIPT =
    "import os, time, json\n"
    "open('/tmp/a-secret', 'w').write('team A')\n"
    "os.chmod('/tmp/a-secret', 0o644)\n"
    "open('/dev/shm/a-shm', 'w').write('team A')\n"
    "open(os.environ['TRAINYARD_CHECKPOINT_DIR'] + '/model.bin', 'w').write('weights')\n"
    "print('trainyard-metric ' + json.dumps({'step': 1, 'loss': 0.5}), flush=True)\n"
    "print('A-READY uid', os.getuid(), flush=True)\n"
    "end = time.time() + 60\n"
    "while time.time() < end and not os.path.exists('/tmp/a-secret.done'):\n"
    "    time.sleep(0.1)\n"
    "    if os.environ.get('STOP_FILE') and os.path.exists(os.environ['STOP_FILE']): break\n"
    "print('A-DONE', flush=True)\n";

/* Team B: looks for everything of A's and the agent's it should not find;
 * prints one PROBE line of JSON. */
static const char *B_SCRIPT =
    "import os, json, errno, getpass\n"
    "me = os.getuid(); r = {'uid': me}\n"
    "own = json.loads(os.environ['TRAINYARD_CONFIG'])['token']\n"
    "tokens = 0; foreign = 0; pids = []\n"
    "for p in os.listdir('/proc'):\n"
    "    if not p.isdigit(): continue\n"
    "    pids.append(int(p))\n"
    "    try:\n"
    "        if os.stat('/proc/' + p).st_uid != me: foreign += 1\n"
    "    except OSError: pass\n"
    "    try:\n"
    "        env = open('/proc/%s/environ' % p, 'rb').read().decode('utf-8', 'replace')\n"
    "        for v in env.split('\\0'):\n"
    "            if v.startswith('TRAINYARD_CONFIG=') and own not in v: tokens += 1\n"
    "            if v.startswith('TRAINYARD_TOKEN='): tokens += 1\n"
    "    except OSError: pass\n"
    "r['foreign_tokens'] = tokens; r['foreign_pids'] = foreign\n"
    "try:\n"
    "    os.kill(int(os.environ['VICTIM']), 0); r['kill'] = 'ok'\n"
    "except OSError as e: r['kill'] = errno.errorcode[e.errno]\n"
    "def rd(path):\n"
    "    try: open(path).read(); return 'read'\n"
    "    except OSError as e: return errno.errorcode[e.errno]\n"
    "def ls(path):\n"
    "    try: return os.listdir(path)\n"
    "    except OSError as e: return errno.errorcode[e.errno]\n"
    "d = os.environ['DATA_DIR']\n"
    "for f in ['token', 'admin.token', 'node.token', 'agent.state', 'server.url']: r[f] = rd(d + '/' + f)\n"
    "r['data_dir'] = ls(d)\n"
    "r['task_root'] = ls('/var/lib/trainyard-tasks')\n"
    "r['victim_dir'] = ls(os.environ['VICTIM_HOME'])\n"
    "r['tmp'] = ls('/tmp'); r['shm'] = ls('/dev/shm')\n"
    "r['a_secret'] = rd('/tmp/a-secret')\n"
    "r['groups'] = os.getgroups()\n"
    "try: r['user'] = getpass.getuser()\n"
    "except Exception as e: r['user'] = repr(e)\n"
    "r['home'] = os.environ.get('HOME'); r['home_mode'] = oct(os.stat(os.environ['HOME']).st_mode & 0o777)\n"
    "r['no_new_privs'] = [l.split()[1] for l in open('/proc/self/status') if l.startswith('NoNewPrivs')][0]\n"
    "r['own_session'] = os.getsid(0) == os.getppid()\n"
    "print('PROBE ' + json.dumps(r), flush=True)\n";

static cJSON *probe_field(cJSON *p, const char *k) {
    cJSON *v = cJSON_GetObjectItem(p, k);
    ck_assert_msg(v != NULL, "probe has no %s", k);
    return v;
}

/* A worker process running as uid (its environ's TRAINYARD_TASK_NAME),
 * found by the test (root): its pid and HOME. */
static pid_t find_task_pid(unsigned uid, char *home, size_t n) {
    DIR *d = opendir("/proc");
    ck_assert_ptr_nonnull(d);
    pid_t found = 0;
    struct dirent *e;
    while ((e = readdir(d)) && !found) {
        long pid;
        if (parse_long(e->d_name, 1, 1L << 30, &pid) < 0) continue;
        char p[64];
        struct stat sb;
        snprintf(p, sizeof p, "/proc/%ld", pid);
        if (stat(p, &sb) < 0 || sb.st_uid != uid) continue;
        snprintf(p, sizeof p, "/proc/%ld/environ", pid);
        size_t len = 0;
        char *env = file_read_all(p, 1 << 20, &len);
        if (!env) continue;
        for (size_t i = 0; i < len; i += strlen(env + i) + 1)
            if (strncmp(env + i, "HOME=", 5) == 0) {
                snprintf(home, n, "%s", env + i + 5);
                found = (pid_t)pid;
            }
        free(env);
    }
    closedir(d);
    return found;
}

/* Team A's training job: the seed MLP on 2,000 Fashion-MNIST examples. */
#define A_TRAIN                                                                                               \
    "{\"name\":\"team-a-train\",\"model\":{\"layers\":[{\"type\":\"flatten\",\"input_shape\":[28,28]},"    \
    "{\"type\":\"dense\",\"units\":64,\"activation\":\"relu\"},{\"type\":\"dropout\",\"rate\":0.2},"          \
    "{\"type\":\"dense\",\"units\":10,\"activation\":\"softmax\"}]},\"compile\":{\"optimizer\":{\"type\":"      \
    "\"adam\"},\"loss\":\"sparse_categorical_crossentropy\",\"metrics\":[\"accuracy\"]},\"data\":{\"source\":"   \
    "\"fashion-mnist\",\"limit\":2000,\"validation_split\":0.1,\"seed\":7},\"fit\":{\"epochs\":12,"           \
    "\"batch_size\":64},\"max_restarts\":0}"

START_TEST(two_teams_apart) {
    if (!need_root("two_teams_apart")) return;
    const char *extra[] = {"--cpu-slots", "3", NULL};
    up_with(extra);
    /* team A trains, and runs a program of its own beside it */
    int64_t train = ty_submit(srv.url, team_a, A_TRAIN);
    cJSON *jt = wait_job(team_a, train, "running", 60);
    ck_assert_str_eq(ty_str(jt, "state"), "running");
    cJSON_Delete(jt);
    int64_t a = submit_py(team_a, "team-a", A_SCRIPT, NULL, NULL, 0);
    char line[4096] = ""; /* the probe's line: its listings and paths make it long */
    for (int i = 0; i < 300 && !line[0]; i++) {
        ty_sleep_ms(100);
        log_line(team_a, a, "A-READY", line, sizeof line);
    }
    ck_assert_msg(line[0], "team A's job did not start");
    unsigned a_uid = (unsigned)strtoul(line + strlen("A-READY uid "), NULL, 10);
    ck_assert_uint_ge(a_uid, 200000);
    ck_assert_uint_le(a_uid, 299999);
    char home[PATH_MAX] = "";
    pid_t victim = find_task_pid(a_uid, home, sizeof home);
    ck_assert_msg(victim > 0, "no process of uid %u", a_uid);
    struct stat sb;
    ck_assert_int_eq(stat(home, &sb), 0);
    ck_assert_uint_eq(sb.st_uid, a_uid);
    ck_assert_uint_eq(sb.st_mode & 0777, 0700);

    char env[PATH_MAX + 1024];
    snprintf(env, sizeof env, "{\"VICTIM\":\"%d\",\"VICTIM_HOME\":\"%s\",\"DATA_DIR\":\"%s\"}", (int)victim, home,
             srv.dir);
    int64_t b = submit_py(team_b, "team-b", B_SCRIPT, env, NULL, 0);
    cJSON *jb = wait_job(team_b, b, NULL, 60);
    ck_assert_msg(strcmp(ty_str(jb, "state"), "succeeded") == 0, "team B's probe: %s %s", ty_str(jb, "state"),
                  ty_str(jb, "reason"));
    cJSON_Delete(jb);
    log_line(team_b, b, "PROBE ", line, sizeof line);
    ck_assert_msg(line[0], "no PROBE line in team B's log");
    cJSON *p = cJSON_Parse(line + 6);
    ck_assert_ptr_nonnull(p);
    unsigned b_uid = (unsigned)ty_num(p, "uid");
    ck_assert_uint_ne(b_uid, a_uid);
    ck_assert_uint_ge(b_uid, 200000);
    /* no token of A's (nor the agent's), no process of anyone else */
    ck_assert_int_eq((int)ty_num(p, "foreign_tokens"), 0);
    ck_assert_int_eq((int)ty_num(p, "foreign_pids"), 0);
    ck_assert_str_eq(ty_str(p, "kill"), "EPERM");
    /* the server's and agent's files: not readable, the directory not listable */
    const char *files[] = {"token", "admin.token", "node.token", "agent.state", "server.url"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
        ck_assert_msg(strcmp(ty_str(p, files[i]), "read") != 0, "team B read %s", files[i]);
    ck_assert_msg(cJSON_IsString(probe_field(p, "data_dir")), "team B listed the data directory");
    ck_assert_str_eq(ty_str(p, "task_root"), "EACCES");
    ck_assert_msg(cJSON_IsString(probe_field(p, "victim_dir")), "team B listed team A's job directory");
    /* its /tmp and /dev/shm hold its own things only, and the way to the
     * agent's data root (its cwd, this checkout) when that lies under /tmp:
     * the data root is bound there read-only */
    char cwd[PATH_MAX], root_top[PATH_MAX] = "";
    if (getcwd(cwd, sizeof cwd) && strncmp(cwd, "/tmp/", 5) == 0) {
        snprintf(root_top, sizeof root_top, "%s", cwd + 5);
        char *slash = strchr(root_top, '/');
        if (slash) *slash = '\0';
    }
    cJSON *t;
    cJSON_ArrayForEach(t, probe_field(p, "tmp")) {
        if (root_top[0] && strcmp(t->valuestring, root_top) == 0) continue;
        ck_assert_msg(strncmp(t->valuestring, "trainyard-job", 13) == 0, "team B's /tmp shows %s", t->valuestring);
        char own[64];
        snprintf(own, sizeof own, "trainyard-job%lld-", (long long)b);
        ck_assert_msg(strncmp(t->valuestring, own, strlen(own)) == 0, "team B's /tmp shows %s", t->valuestring);
    }
    ck_assert_int_eq(cJSON_GetArraySize(probe_field(p, "shm")), 0);
    ck_assert_str_ne(ty_str(p, "a_secret"), "read");
    ck_assert_int_eq(cJSON_GetArraySize(probe_field(p, "groups")), 0);
    ck_assert_str_eq(ty_str(p, "home_mode"), "0o700");
    /* a uid without a passwd entry still has a user name (PyTorch needs one) */
    ck_assert_msg(strncmp(ty_str(p, "user"), "trainyard-", 10) == 0, "team B's user name: %s", ty_str(p, "user"));
    ck_assert_str_eq(ty_str(p, "no_new_privs"), "1");
    ck_assert(cJSON_IsTrue(probe_field(p, "own_session"))); /* the task's worker leads its session */
    cJSON_Delete(p);

    /* team A trains on to success: its checkpoints and metrics came back */
    jt = wait_job(team_a, train, NULL, 120);
    ck_assert_msg(strcmp(ty_str(jt, "state"), "succeeded") == 0, "team A's training: %s %s", ty_str(jt, "state"),
                  ty_str(jt, "reason"));
    cJSON *test = cJSON_GetObjectItem(cJSON_GetObjectItem(jt, "progress"), "test");
    ck_assert_msg(ty_num(test, "test_accuracy") > 0.5, "team A's test accuracy %.3f", ty_num(test, "test_accuracy"));
    cJSON_Delete(jt);
    char done[PATH_MAX + 32];
    snprintf(done, sizeof done, "/proc/%d/root/tmp/a-secret.done", (int)victim);
    int fd = open(done, O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    ck_assert_msg(fd >= 0, "cannot reach team A's /tmp: %s", strerror(errno));
    close(fd);
    cJSON *ja = wait_job(team_a, a, NULL, 60);
    ck_assert_msg(strcmp(ty_str(ja, "state"), "succeeded") == 0, "team A: %s %s", ty_str(ja, "state"),
                  ty_str(ja, "reason"));
    cJSON_Delete(ja);
    cJSON *ck = NULL;
    char path[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints", (long long)a);
    ck_assert_int_eq(ty_http(srv.url, team_a, "GET", path, NULL, &ck), 200);
    ck_assert_int_ge(cJSON_GetArraySize(cJSON_GetObjectItem(ck, "checkpoints")), 1);
    cJSON_Delete(ck);
    /* ... and its job directory went with it */
    ck_assert_int_eq(stat(home, &sb), -1);
    down();
}
END_TEST

/* ---------------------------------------------------------------- limits */

static const char *HOG_SCRIPT =
    "import time\n"
    "b = []\n"
    "for i in range(64):\n"
    "    b.append(bytearray(16 << 20))\n"
    "    print('allocated', (i + 1) * 16, 'MiB', flush=True)\n"
    "print('NOT-KILLED', flush=True)\n";

static const char *CALM_SCRIPT =
    "import time\n"
    "for i in range(15):\n"
    "    print('neighbour step', i, flush=True); time.sleep(0.2)\n";

START_TEST(memory_limit_kills_the_hog_only) {
    if (!need_root("memory_limit_kills_the_hog_only")) return;
    const char *extra[] = {"--cpu-slots", "2", NULL};
    up_with(extra);
    int64_t hog = submit_py(team_a, "hog", HOG_SCRIPT, NULL, "{\"memory\":\"160MiB\"}", 1);
    int64_t calm = submit_py(team_b, "calm", CALM_SCRIPT, NULL, NULL, 0);
    cJSON *j = wait_job(team_a, hog, NULL, 90);
    ck_assert_str_eq(ty_str(j, "state"), "failed");
    ck_assert_msg(strstr(ty_str(j, "reason"), "out of memory (limit 160 MiB)"), "reason: %s", ty_str(j, "reason"));
    ck_assert_int_eq((int)ty_num(j, "attempt"), 2); /* max_restarts 1: each OOM counted once */
    cJSON_Delete(j);
    /* the timeline says so, once per attempt */
    cJSON *ev = NULL;
    char path[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/events", (long long)hog);
    ck_assert_int_eq(ty_http(srv.url, team_a, "GET", path, NULL, &ev), 200);
    int ooms = 0;
    cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(ev, "events"))
        if (strstr(ty_str(e, "reason"), "out of memory (limit 160 MiB)")) ooms++;
    ck_assert_int_eq(ooms, 2);
    cJSON_Delete(ev);
    char line[256];
    log_line(team_a, hog, "NOT-KILLED", line, sizeof line);
    ck_assert_str_eq(line, "");
    j = wait_job(team_b, calm, NULL, 60);
    ck_assert_msg(strcmp(ty_str(j, "state"), "succeeded") == 0, "the neighbour: %s %s", ty_str(j, "state"),
                  ty_str(j, "reason"));
    cJSON_Delete(j);
    down();
}
END_TEST

static const char *FORK_SCRIPT =
    "import os, time\n"
    "n = 0\n"
    "try:\n"
    "    while n < 2000:\n"
    "        if os.fork() == 0:\n"
    "            time.sleep(60); os._exit(0)\n"
    "        n += 1\n"
    "except OSError as e:\n"
    "    print('FORK-FAILED', n, e.strerror, flush=True)\n";

START_TEST(fork_loop_stops_at_pids_limit) {
    if (!need_root("fork_loop_stops_at_pids_limit")) return;
    const char *extra[] = {"--cpu-slots", "2", "--task-pids-max", "64", NULL};
    up_with(extra);
    int64_t id = submit_py(team_a, "forks", FORK_SCRIPT, NULL, NULL, 0);
    cJSON *j = wait_job(team_a, id, NULL, 60);
    ck_assert_msg(strcmp(ty_str(j, "state"), "succeeded") == 0, "%s %s", ty_str(j, "state"), ty_str(j, "reason"));
    cJSON_Delete(j);
    char line[256];
    log_line(team_a, id, "FORK-FAILED", line, sizeof line);
    int n = 0;
    char why[128] = "";
    ck_assert_msg(sscanf(line, "FORK-FAILED %d %127[^\n]", &n, why) == 2, "no FORK-FAILED line: '%s'", line);
    ck_assert_int_lt(n, 64);
    ck_assert_int_gt(n, 10);
    ck_assert_str_eq(why, "Resource temporarily unavailable");
    /* the node goes on: a job after it runs (its leftovers were killed) */
    id = submit_py(team_a, "after", "print('after')", NULL, NULL, 0);
    j = wait_job(team_a, id, NULL, 60);
    ck_assert_str_eq(ty_str(j, "state"), "succeeded");
    cJSON_Delete(j);
    down();
}
END_TEST

/* Spins `procs` busy processes from START for 4 s; prints the cores used. */
static const char *SPIN_SCRIPT =
    "import os, time\n"
    "start = float(os.environ['START']); n = int(os.environ['PROCS'])\n"
    "while time.time() < start: time.sleep(0.01)\n"
    "kids = []\n"
    "for i in range(n):\n"
    "    pid = os.fork()\n"
    "    if pid == 0:\n"
    "        end = start + 4\n"
    "        while time.time() < end: pass\n"
    "        os._exit(0)\n"
    "    kids.append(pid)\n"
    "for k in kids: os.waitpid(k, 0)\n"
    "t = os.times()\n"
    "print('CORES %.3f' % ((t.children_user + t.children_system) / 4.0), flush=True)\n";

START_TEST(cpu_weight_follows_slots) {
    if (!need_root("cpu_weight_follows_slots")) return;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (ncpu != 2) {
        printf("cpu_weight_follows_slots: SKIP: written for a 2-core machine (this one has %ld)\n", ncpu);
        return;
    }
    /* normal scheduling, so that only the weights share the cores */
    const char *extra[] = {"--cpu-slots", "2", "--worker-sched", "normal", "--worker-nice", "0", NULL};
    up_with(extra);
    char env_a[128], env_b[128];
    double start = (double)now_ms() / 1000.0 + 4.0;
    snprintf(env_a, sizeof env_a, "{\"START\":\"%.3f\",\"PROCS\":\"3\"}", start);
    snprintf(env_b, sizeof env_b, "{\"START\":\"%.3f\",\"PROCS\":\"1\"}", start);
    int64_t a = submit_py(team_a, "three", SPIN_SCRIPT, env_a, NULL, 0);
    int64_t b = submit_py(team_b, "one", SPIN_SCRIPT, env_b, NULL, 0);
    cJSON *ja = wait_job(team_a, a, NULL, 60), *jb = wait_job(team_b, b, NULL, 60);
    ck_assert_str_eq(ty_str(ja, "state"), "succeeded");
    ck_assert_str_eq(ty_str(jb, "state"), "succeeded");
    cJSON_Delete(ja);
    cJSON_Delete(jb);
    char la[128], lb[128];
    log_line(team_a, a, "CORES", la, sizeof la);
    log_line(team_b, b, "CORES", lb, sizeof lb);
    double ca = atof(la + 6), cb = atof(lb + 6);
    printf("cpu_weight_follows_slots: 3 processes got %.2f cores, 1 process %.2f\n", ca, cb);
    /* without weights the 3 processes take 3/4 of the node: 1.5 and 0.5
     * cores, a ratio of 3; with weights by slots about 1 each. The ratio,
     * not the cores, is asserted: a busy machine lowers both alike. */
    ck_assert_msg(ca > 0.2 && cb > 0.2, "the jobs got %.2f and %.2f cores", ca, cb);
    ck_assert_msg(ca / cb > 0.7 && ca / cb < 1.4, "3 processes got %.2f cores, 1 process %.2f", ca, cb);
    down();
}
END_TEST

/* ---------------------------------------------------------------- devices */

/* A task holding GPU 0 of two opens /dev/nvidia0's number (ENXIO: no driver
 * here, or success on a GPU machine) but not /dev/nvidia1's (EPERM). The
 * nodes are made here with mknod; the task enters its isolation exactly as
 * the agent's child does. */
START_TEST(other_gpus_denied) {
    if (!need_root("other_gpus_denied")) return;
    iso_options o;
    iso_options_default(&o);
    o.cpu_slots = 2;
    o.n_gpus = 2;
    o.gpu_minor[0] = 0;
    o.gpu_minor[1] = 1;
    isolator iso;
    char err[512] = "";
    ck_assert_msg(iso_init(&iso, &o, ty_bin(), err, sizeof err) == 0, "%s", err);
    if (iso.cg != ISO_CG_V1) {
        printf("other_gpus_denied: SKIP: no cgroup v1 devices controller here (the v2 filter is not written)\n");
        iso_release(&iso);
        return;
    }
    iso_task t;
    ck_assert_msg(iso_task_prepare(&iso, 1, 1, 256, 1, "0", &t, err, sizeof err) == 0, "%s", err);
    char n0[PATH_MAX + 16], n1[PATH_MAX + 16];
    snprintf(n0, sizeof n0, "%s/nvidia0", t.dir);
    snprintf(n1, sizeof n1, "%s/nvidia1", t.dir);
    ck_assert_int_eq(mknod(n0, S_IFCHR | 0666, makedev(195, 0)), 0);
    ck_assert_int_eq(mknod(n1, S_IFCHR | 0666, makedev(195, 1)), 0);
    ck_assert_int_eq(chmod(n0, 0666), 0); /* past the umask */
    ck_assert_int_eq(chmod(n1, 0666), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        if (iso_task_enter(&t) < 0) _exit(10);
        int f0 = open(n0, O_RDWR);
        int e0 = errno;
        int f1 = open(n1, O_RDWR);
        int e1 = errno;
        if (f1 >= 0 || e1 != EPERM) _exit(11); /* another GPU: denied */
        if (f0 < 0 && e0 != ENXIO) _exit(12);    /* its own: allowed (no driver: ENXIO) */
        _exit(0);
    }
    int st = 0;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child exit %d (10 enter, 11 other GPU opened, 12 own "
                  "GPU refused)", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    int oom = 1;
    iso_task_finish(&iso, &t, &oom);
    ck_assert_int_eq(oom, 0);
    iso_release(&iso);
}
END_TEST

/* The cgroup v2 device filter (a BPF program: cgroup v2 has no devices
 * files), on this machine's cgroup2 mount: a process in the cgroup cannot
 * open the denied GPU's device node, and opens the other. */
START_TEST(v2_gpu_filter) {
    if (!need_root("v2_gpu_filter")) return;
    const char *mounts[] = {"/sys/fs/cgroup/unified", "/sys/fs/cgroup"};
    char cg[256] = "";
    for (int i = 0; i < 2 && !cg[0]; i++) {
        char p[300];
        struct stat sb;
        snprintf(p, sizeof p, "%s/cgroup.procs", mounts[i]);
        if (stat(p, &sb) < 0) continue;
        snprintf(p, sizeof p, "%s/cgroup.controllers", mounts[i]); /* cgroup2 only */
        if (stat(p, &sb) == 0) snprintf(cg, sizeof cg, "%s/ty-devtest-%d", mounts[i], (int)getpid());
    }
    if (!cg[0]) {
        printf("v2_gpu_filter: SKIP: no cgroup2 mount\n");
        return;
    }
    ck_assert_int_eq(mkdir(cg, 0755), 0);
    char err[512] = "";
    int deny[] = {1};
    int rc = iso_bpf_deny_gpus(cg, deny, 1, err, sizeof err);
    if (rc < 0 && (errno == EPERM || strstr(err, "Operation not permitted"))) {
        rmdir(cg);
        printf("v2_gpu_filter: SKIP: BPF not permitted here: %s\n", err);
        return;
    }
    ck_assert_msg(rc == 0, "%s", err);
    char dir[64];
    ty_mkdtemp(dir, sizeof dir, "isodev");
    char n0[128], n1[128];
    snprintf(n0, sizeof n0, "%s/nvidia0", dir);
    snprintf(n1, sizeof n1, "%s/nvidia1", dir);
    ck_assert_int_eq(mknod(n0, S_IFCHR | 0666, makedev(195, 0)), 0);
    ck_assert_int_eq(mknod(n1, S_IFCHR | 0666, makedev(195, 1)), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        char procs[300];
        snprintf(procs, sizeof procs, "%s/cgroup.procs", cg);
        FILE *f = fopen(procs, "w");
        if (!f || fprintf(f, "%d\n", (int)getpid()) < 0 || fclose(f) != 0) _exit(10);
        int f1 = open(n1, O_RDWR);
        if (f1 >= 0 || errno != EPERM) _exit(11);
        int f0 = open(n0, O_RDWR);
        if (f0 < 0 && errno != ENXIO) _exit(12);
        _exit(0);
    }
    int st = 0;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ty_rmrf(dir);
    rmdir(cg);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0,
                  "child exit %d (10 join, 11 the denied GPU opened, 12 the other refused)",
                  WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}
END_TEST

/* ---------------------------------------------------------------- not root */

START_TEST(not_root_says_so) {
    memset(&srv, 0, sizeof srv);
    ty_mkdtemp(srv.dir, sizeof srv.dir, "isonr");
    ty_server_start(&srv);
    char agent_dir[256];
    ty_mkdtemp(agent_dir, sizeof agent_dir, "isonra");
    char tok[128], logf[320], statef[320];
    ty_token(&srv, "node.token", tok, sizeof tok);
    ty_token(&srv, "admin.token", admin, sizeof admin);
    snprintf(logf, sizeof logf, "%s/agent.log", agent_dir);
    snprintf(statef, sizeof statef, "%s/agent.state", agent_dir);
    const char *mode = geteuid() == 0 ? "nobody" : "self";
    if (geteuid() == 0) ck_assert_int_eq(chown(agent_dir, 65534, 65534), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        FILE *lf = freopen(logf, "a", stderr);
        (void)lf;
        /* root runs the agent as nobody: it cannot switch users either */
        if (geteuid() == 0 && (setgroups(0, NULL) < 0 || setgid(65534) < 0 || setuid(65534) < 0)) _exit(126);
        execl(ty_bin(), ty_bin(), "agent", "--server", srv.url, "--token", tok, "--hostname", "plain",
              "--cpu-slots", "1", "--heartbeat", "1", "--state-file", statef, (char *)NULL);
        _exit(127);
    }
    cJSON *node = NULL;
    for (int i = 0; i < 100 && !node; i++) {
        ty_sleep_ms(100);
        cJSON *c = NULL;
        ck_assert_int_eq(ty_http(srv.url, admin, "GET", "/api/v1/cluster", NULL, &c), 200);
        cJSON *n;
        cJSON_ArrayForEach(n, cJSON_GetObjectItem(c, "nodes"))
            if (strcmp(ty_str(n, "hostname"), "plain") == 0) node = cJSON_Duplicate(n, 1);
        cJSON_Delete(c);
    }
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    ck_assert_msg(node != NULL, "the agent (%s) did not register; see %s", mode, logf);
    cJSON *iso = cJSON_GetObjectItem(node, "isolation");
    ck_assert_str_eq(ty_str(iso, "mode"), "none");
    ck_assert_msg(strstr(ty_str(iso, "reason"), "not root"), "reason: %s", ty_str(iso, "reason"));
    ck_assert_int_gt((int)ty_num(node, "memory_mb"), 0);
    cJSON_Delete(node);
    size_t len = 0;
    char *log = file_read_all(logf, 1 << 20, &len);
    ck_assert_ptr_nonnull(log);
    const char *w = strstr(log, "teams are not isolated on this node");
    ck_assert_msg(w != NULL, "the agent did not say it: %s", log);
    ck_assert_msg(strstr(w + 1, "teams are not isolated on this node") == NULL, "said more than once");
    free(log);
    ty_kill(&srv, SIGTERM);
    ty_rmrf(srv.dir);
    ty_rmrf(agent_dir);
    srv.dir[0] = '\0';
}
END_TEST

int main(void) {
    Suite *s = suite_create("isolation");
    TCase *tc = ty_tcase(s, "isolation", setup, down, 180);
    tcase_add_test(tc, two_teams_apart);
    tcase_add_test(tc, memory_limit_kills_the_hog_only);
    tcase_add_test(tc, fork_loop_stops_at_pids_limit);
    tcase_add_test(tc, cpu_weight_follows_slots);
    tcase_add_test(tc, other_gpus_denied);
    tcase_add_test(tc, v2_gpu_filter);
    tcase_add_test(tc, not_root_says_so);
    return ty_run_suite(s);
}
