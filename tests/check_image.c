/* check_image.c - command jobs with a context, in a team's container image,
 * end to end against real parts the test starts: `trainyard up` (a server
 * and a local agent isolating tasks as root, with podman), a registry on
 * loopback (Debian's docker-registry, with an htpasswd login), and an image
 * built offline from Debian's packages (tests/image/build.sh: mmdebstrap
 * minbase + python3 + a marker file, imported into podman once) and pushed
 * to that registry.
 *
 * A 2-rank job submitted with `trainyard submit job.json --context DIR`
 * pulls the image once on the node (a "pulling image" event), runs a script
 * from the context inside it as the task's uid, sees the image's files and
 * not the host's, reaches its peer over the host's network, and sends
 * metrics, logs and a checkpoint back as host jobs do. An image that does
 * not exist fails the job at its first attempt with the registry's answer
 * and no restart spent; a team without a login for the registry is refused
 * by it; cancel removes the container; a program in an image killed by its
 * memory limit fails the job with "out of memory (limit ...)" as on the
 * host; a cluster without podman refuses an
 * image job at submission. Without root, podman, docker-registry or
 * mmdebstrap the tests that need them say SKIP and why. */
#include "testlib.h"

#include <crypt.h>
#include <sys/stat.h>

#define IMAGE_LOCAL "localhost/trainyard-test:bookworm-py3"
#define REG_USER "trainer"
#define REG_PASS "pw-only-the-team-knows"

static ty_proc srv;
static char team_tok[160], admin_tok[160];
static char skip_why[512];          /* "" when containers can be tested here */
static int reg_port;
static pid_t reg_pid;
static char reg_dir[256], reg_conf[256], image_ref[160];

/* ---------------------------------------------------------------- helpers */

static int on_path(const char *prog) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", prog);
    return system(cmd) == 0;
}

static int run_quiet(const char *cmd) {
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static int write_file(const char *path, const char *text, int mode) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    int ok = fputs(text, f) >= 0;
    ok = fclose(f) == 0 && ok;
    return ok && chmod(path, (mode_t)mode) == 0 ? 0 : -1;
}

static void write_file_ck(const char *path, const char *text, int mode) {
    ck_assert_msg(write_file(path, text, mode) == 0, "cannot write %s", path);
}

static cJSON *job_get(int64_t id) { return ty_job_get(srv.url, team_tok, id); }

static cJSON *wait_state(const char *tok, int64_t id, const char *want, int timeout_s) {
    int64_t end = mono_ms() + (int64_t)timeout_s * 1000;
    for (;;) {
        cJSON *o = ty_job_get(srv.url, tok, id);
        const char *s = ty_str(o, "state");
        if (strcmp(s, want) == 0 || strcmp(s, "succeeded") == 0 || strcmp(s, "failed") == 0 ||
            strcmp(s, "cancelled") == 0 || mono_ms() > end)
            return o;
        cJSON_Delete(o);
        ty_sleep_ms(200);
    }
}

/* The job's events of a kind whose reason holds needle. */
static int count_events(const char *tok, int64_t id, const char *kind, const char *needle) {
    char path[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/events", (long long)id);
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, tok, "GET", path, NULL, &o), 200);
    int n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(o, "events")) {
        if (strcmp(ty_str(e, "kind"), kind) == 0 && strstr(ty_str(e, "reason"), needle)) n++;
    }
    cJSON_Delete(o);
    return n;
}

/* Runs the real CLI with the team's token; its stdout into out. Exit status. */
static int cli(const char *tok, const char *const *args, char *out, size_t cap) {
    int p[2];
    ck_assert_int_eq(pipe(p), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        dup2(p[1], 1);
        close(p[0]);
        close(p[1]);
        setenv("TRAINYARD_URL", srv.url, 1);
        setenv("TRAINYARD_TOKEN", tok, 1);
        const char *argv[16];
        int n = 0;
        argv[n++] = ty_bin();
        for (int i = 0; args[i] && n < 15; i++) argv[n++] = args[i];
        argv[n] = NULL;
        execv(ty_bin(), (char *const *)argv);
        _exit(127);
    }
    close(p[1]);
    size_t len = 0;
    ssize_t r;
    while (len + 1 < cap && (r = read(p[0], out + len, cap - 1 - len)) > 0) len += (size_t)r;
    out[len] = '\0';
    close(p[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* `trainyard submit JOB --context DIR --json` as the team: the job's id. */
static int64_t submit_cli(const char *tok, const char *job, const char *dir) {
    char out[4096];
    const char *args[] = {"submit", job, "--context", dir, "--json", NULL};
    ck_assert_int_eq(cli(tok, args, out, sizeof out), 0);
    cJSON *sub = cJSON_Parse(out);
    ck_assert_msg(sub != NULL, "submit printed %s", out);
    int64_t id = (int64_t)ty_num(sub, "id");
    cJSON_Delete(sub);
    ck_assert_int_gt(id, 0);
    return id;
}

/* ---------------------------------------------------------------- the registry (once) */

/* A free loopback port, outside a test (no ck_assert here). */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int port = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
                       getsockname(fd, (struct sockaddr *)&a, &len) == 0
                   ? ntohs(a.sin_port)
                   : 0;
    if (fd >= 0) close(fd);
    return port;
}

static int registry_up(void) {
    reg_port = free_port();
    snprintf(reg_dir, sizeof reg_dir, "/tmp/ty_registry_XXXXXX");
    if (!reg_port || !mkdtemp(reg_dir)) {
        reg_dir[0] = '\0';
        snprintf(skip_why, sizeof skip_why, "cannot make the registry's directory or find a port");
        return -1;
    }
    char path[400], text[1024];
    /* an htpasswd login: bcrypt, which the registry requires */
    struct crypt_data cd;
    memset(&cd, 0, sizeof cd);
    char *salt = crypt_gensalt_rn("$2b$", 10, NULL, 0, cd.setting, sizeof cd.setting);
    const char *hash = salt ? crypt_r(REG_PASS, salt, &cd) : NULL;
    if (!hash || hash[0] == '*') {
        snprintf(skip_why, sizeof skip_why, "cannot make a bcrypt hash for the registry's login");
        return -1;
    }
    snprintf(path, sizeof path, "%s/htpasswd", reg_dir);
    snprintf(text, sizeof text, "%s:%s\n", REG_USER, hash);
    if (write_file(path, text, 0600) < 0) return -1;
    snprintf(path, sizeof path, "%s/config.yml", reg_dir);
    snprintf(text, sizeof text,
             "version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: %s/data\nhttp:\n  addr: 127.0.0.1:%d\n"
             "auth:\n  htpasswd:\n    realm: trainyard-test\n    path: %s/htpasswd\n",
             reg_dir, reg_port, reg_dir);
    if (write_file(path, text, 0600) < 0) return -1;
    reg_pid = fork();
    if (reg_pid == 0) {
        char logf[400];
        snprintf(logf, sizeof logf, "%s/registry.log", reg_dir);
        FILE *lf = freopen(logf, "a", stderr);
        lf = freopen(logf, "a", stdout);
        (void)lf;
        execlp("docker-registry", "docker-registry", "serve", path, (char *)NULL);
        _exit(127);
    }
    /* podman speaks plain HTTP to this one registry only (loopback) */
    snprintf(reg_conf, sizeof reg_conf, "/etc/containers/registries.conf.d/90-trainyard-test-%d.conf", reg_port);
    snprintf(text, sizeof text, "[[registry]]\nlocation = \"127.0.0.1:%d\"\ninsecure = true\n", reg_port);
    mkdir("/etc/containers", 0755);
    mkdir("/etc/containers/registries.conf.d", 0755);
    if (write_file(reg_conf, text, 0644) < 0) {
        snprintf(skip_why, sizeof skip_why, "cannot write %s", reg_conf);
        reg_conf[0] = '\0';
        return -1;
    }
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "curl -s -o /dev/null http://127.0.0.1:%d/v2/", reg_port);
    for (int i = 0; i < 100 && run_quiet(cmd) != 0; i++) ty_sleep_ms(100);
    snprintf(image_ref, sizeof image_ref, "127.0.0.1:%d/team/trainer:1", reg_port);
    /* (a push leaves no local name for image_ref: a job's pull is a real one) */
    snprintf(cmd, sizeof cmd, "podman push -q --creds %s:%s %s %s >%s/push.log 2>&1", REG_USER, REG_PASS, IMAGE_LOCAL,
             image_ref, reg_dir);
    if (run_quiet(cmd) != 0) {
        snprintf(skip_why, sizeof skip_why, "cannot push the test image to the registry (see %s/push.log)", reg_dir);
        return -1;
    }
    return 0;
}

static void registry_down(void) {
    if (image_ref[0]) { /* the name the jobs pulled; the layers stay with the test image */
        char cmd[300];
        snprintf(cmd, sizeof cmd, "podman rmi --ignore %s >/dev/null 2>&1", image_ref);
        run_quiet(cmd);
    }
    if (reg_pid > 0) {
        kill(reg_pid, SIGTERM);
        waitpid(reg_pid, NULL, 0);
    }
    if (reg_conf[0]) unlink(reg_conf);
    if (reg_dir[0] && !getenv("E2E_KEEP")) ty_rmrf(reg_dir);
}

/* What containers need here; "" when all is there. */
static void decide_skip(void) {
    if (geteuid() != 0) snprintf(skip_why, sizeof skip_why, "not root: podman runs containers as root here");
    else if (!on_path("podman")) snprintf(skip_why, sizeof skip_why, "podman is not installed");
    else if (!on_path("docker-registry")) snprintf(skip_why, sizeof skip_why, "docker-registry is not installed");
    else if (!on_path("mmdebstrap") && run_quiet("podman image exists " IMAGE_LOCAL) != 0)
        snprintf(skip_why, sizeof skip_why, "mmdebstrap is not installed (it builds the test image)");
    else if (run_quiet("tests/image/build.sh " IMAGE_LOCAL) != 0)
        snprintf(skip_why, sizeof skip_why, "tests/image/build.sh could not build the test image");
    else
        registry_up();
}

#define NEEDS_CONTAINERS()                                                           \
    do {                                                                             \
        if (skip_why[0]) {                                                           \
            fprintf(stderr, "check_image: SKIP %s: %s\n", __func__, skip_why);       \
            return;                                                                  \
        }                                                                            \
    } while (0)

/* ---------------------------------------------------------------- fixture */

static void start_with(const char *const *extra) {
    memset(&srv, 0, sizeof srv);
    ty_mkdtemp(srv.dir, sizeof srv.dir, "image");
    ty_server_start_args(&srv, "up", extra);
    ty_token(&srv, "token", team_tok, sizeof team_tok);
    ty_token(&srv, "admin.token", admin_tok, sizeof admin_tok);
}

/* The local agent's node, once it has joined: GET /cluster's nodes. */
static cJSON *wait_nodes(void) {
    for (int i = 0; i < 200; i++) {
        cJSON *o = NULL;
        ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", "/api/v1/cluster", NULL, &o), 200);
        cJSON *n = cJSON_DetachItemFromObject(o, "nodes");
        cJSON_Delete(o);
        if (cJSON_GetArraySize(n) > 0) return n;
        cJSON_Delete(n);
        ty_sleep_ms(100);
    }
    ck_abort_msg("the local agent did not join");
    return NULL;
}

static void start(void) {
    if (skip_why[0]) return;
    const char *extra[] = {"--cpu-slots", "2", NULL};
    start_with(extra);
}

static void stop(void) {
    if (!srv.pid) return;
    ty_kill(&srv, SIGTERM);
    if (getenv("E2E_KEEP")) fprintf(stderr, "check_image: kept %s\n", srv.dir);
    else ty_rmrf(srv.dir);
    memset(&srv, 0, sizeof srv);
}

static void store_login(const char *tok) {
    char path[128], body[160];
    snprintf(path, sizeof path, "/api/v1/registries/127.0.0.1:%d", reg_port);
    snprintf(body, sizeof body, "{\"username\":\"%s\",\"password\":\"%s\"}", REG_USER, REG_PASS);
    cJSON *o = NULL;
    long st = ty_http(srv.url, tok, "PUT", path, body, &o);
    ck_assert_msg(st == 201 || st == 200, "PUT %s answered %ld", path, st);
    /* the answer never holds the password */
    char *text = cJSON_PrintUnformatted(o);
    ck_assert_ptr_null(strstr(text, REG_PASS));
    free(text);
    cJSON_Delete(o);
}

/* A project folder: a script in a subfolder, a helper file, an ignored file. */
static void make_project(const char *dir) {
    char path[400];
    snprintf(path, sizeof path, "%s/lib", dir);
    ck_assert_int_eq(mkdir(path, 0755), 0);
    snprintf(path, sizeof path, "%s/lib/helper.txt", dir);
    write_file_ck(path, "helper-from-the-context\n", 0644);
    snprintf(path, sizeof path, "%s/.trainyardignore", dir);
    write_file_ck(path, "*.log\n", 0644);
    snprintf(path, sizeof path, "%s/big.log", dir);
    write_file_ck(path, "left out\n", 0644);
    snprintf(path, sizeof path, "%s/train.py", dir);
    write_file_ck(path,
               "import json, os, pathlib, socket, time\n"
               "rank, world = int(os.environ['RANK']), int(os.environ['WORLD_SIZE'])\n"
               "image = pathlib.Path('/etc/trainyard-image').read_text().strip()\n"
               "host_files = os.path.exists('/usr/share/datasets/fashion-mnist')\n"
               "helper = pathlib.Path('lib/helper.txt').read_text().strip()\n"
               "print(f'rank {rank} of {world}: image={image} host_files={host_files} helper={helper}'\n"
               "      f' ignored_present={os.path.exists(\"big.log\")} uid={os.getuid()}', flush=True)\n"
               "def first(*paths):\n"
               "    for p in paths:\n"
               "        if os.path.exists(p): return pathlib.Path(p).read_text().strip()\n"
               "    return '?'\n"
               "print('limits', 'memory=' + first('/sys/fs/cgroup/memory/memory.limit_in_bytes', '/sys/fs/cgroup/memory.max'),\n"
               "      'pids=' + first('/sys/fs/cgroup/pids/pids.max', '/sys/fs/cgroup/pids.max'), flush=True)\n"
               "addr, port = os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT'])\n"
               "if rank == 0:\n"
               "    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
               "    s.bind(('', port)); s.listen(1); c, _ = s.accept()\n"
               "    print('got', c.recv(100).decode(), flush=True)\n"
               "    for e in (1, 2):\n"
               "        print('trainyard-metric ' + json.dumps({'kind': 'epoch', 'epoch': e, 'loss': 1.0 / e}), flush=True)\n"
               "    ck = os.environ['TRAINYARD_CHECKPOINT_DIR']\n"
               "    pathlib.Path(ck, 'model.txt').write_text('weights')\n"
               "else:\n"
               "    for _ in range(200):\n"
               "        try:\n"
               "            c = socket.create_connection((addr, port)); break\n"
               "        except OSError: time.sleep(0.1)\n"
               "    c.sendall(f'hello from rank {rank}'.encode())\n",
               0644);
}

static char *task_log(int64_t id, const char *task) { return ty_task_log(srv.url, team_tok, id, task); }

/* ---------------------------------------------------------------- cases */

START_TEST(context_in_image_two_ranks) {
    NEEDS_CONTAINERS();
    store_login(team_tok);
    /* the cluster offers podman */
    cJSON *cl = wait_nodes();
    char *cltext = cJSON_PrintUnformatted(cl);
    ck_assert_msg(strstr(cltext, "\"runtimes\":[\"host\",\"podman\"]") != NULL, "no podman in %s", cltext);
    free(cltext);
    cJSON_Delete(cl);

    char proj[256], job[400];
    ty_mkdtemp_shared(proj, sizeof proj, "project");
    make_project(proj);
    snprintf(job, sizeof job, "%s/job.json", srv.dir);
    char spec[1024];
    snprintf(spec, sizeof spec,
             "{\"name\": \"in-image\", \"command\": {\"argv\": [\"python3\", \"train.py\"]},"
             " \"environment\": {\"image\": \"%s\"},"
             " \"strategy\": {\"type\": \"multi_worker_mirrored\"},"
             " \"resources\": {\"workers\": 2, \"memory\": \"512MiB\"}, \"max_restarts\": 0}",
             image_ref);
    write_file_ck(job, spec, 0644);
    int64_t id = submit_cli(team_tok, job, proj);

    cJSON *j = wait_state(team_tok, id, "succeeded", 180);
    char *w0 = task_log(id, "worker-0"), *w1 = task_log(id, "worker-1");
    ck_assert_msg(strcmp(ty_str(j, "state"), "succeeded") == 0, "job %s: %s\nworker-0:\n%s\nworker-1:\n%s",
                  ty_str(j, "state"), ty_str(j, "reason"), w0, w1);
    /* the spec names the context the CLI uploaded */
    const cJSON *cmd = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "spec"), "command");
    if (cmd) ck_assert_int_eq(strncmp(ty_str(cmd, "context"), "sha256:", 7), 0);
    cJSON_Delete(j);
    /* inside the image: its marker, not the host's data sets; the context
     * as working directory, less what .trainyardignore names; a task uid */
    for (int r = 0; r < 2; r++) {
        const char *log = r ? w1 : w0;
        char want[128];
        snprintf(want, sizeof want, "rank %d of 2: image=trainyard test image host_files=False", r);
        ck_assert_msg(strstr(log, want) != NULL, "worker-%d's log lacks '%s':\n%s", r, want, log);
        ck_assert_msg(strstr(log, "helper=helper-from-the-context ignored_present=False") != NULL, "%s", log);
        ck_assert_msg(strstr(log, "uid=0") == NULL, "the program ran as root:\n%s", log);
        /* the task's limits hold inside: its memory, the agent's pids limit */
        ck_assert_msg(strstr(log, "limits memory=536870912 pids=4096") != NULL, "worker-%d's limits:\n%s", r, log);
    }
    ck_assert_msg(strstr(w0, "got hello from rank 1") != NULL, "rank 0 did not hear rank 1:\n%s", w0);
    free(w0);
    free(w1);
    /* one pull on the node, on the job's timeline */
    ck_assert_int_eq(count_events(team_tok, id, "image", "pulling image"), 1);
    ck_assert_int_eq(count_events(team_tok, id, "image", "pulled image"), 1);
    /* metrics and the checkpoint came back as from a host task */
    cJSON *m = ty_metrics_all(srv.url, team_tok, id);
    ck_assert_int_eq(cJSON_GetArraySize(m), 2);
    ck_assert_double_eq_tol(ty_num(cJSON_GetArrayItem(m, 1), "loss"), 0.5, 1e-9);
    cJSON_Delete(m);
    char path[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints", (long long)id);
    cJSON *ck = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", path, NULL, &ck), 200);
    ck_assert_int_ge(cJSON_GetArraySize(cJSON_GetObjectItem(ck, "checkpoints")), 1);
    cJSON_Delete(ck);

    /* the same image again: cached, no pull */
    int64_t id2 = submit_cli(team_tok, job, proj);
    j = wait_state(team_tok, id2, "succeeded", 120);
    ck_assert_str_eq(ty_str(j, "state"), "succeeded");
    cJSON_Delete(j);
    ck_assert_int_eq(count_events(team_tok, id2, "image", "pulling image"), 0);

    /* pull "always": pulled again though it is there */
    char *always = strstr(spec, "\"environment\": {");
    ck_assert_ptr_nonnull(always);
    char spec3[1200];
    snprintf(spec3, sizeof spec3, "%.*s\"environment\": {\"pull\": \"always\", %s", (int)(always - spec), spec,
             always + strlen("\"environment\": {"));
    write_file_ck(job, spec3, 0644);
    int64_t id3 = submit_cli(team_tok, job, proj);
    j = wait_state(team_tok, id3, "succeeded", 120);
    ck_assert_msg(strcmp(ty_str(j, "state"), "succeeded") == 0, "%s: %s", ty_str(j, "state"), ty_str(j, "reason"));
    cJSON_Delete(j);
    ck_assert_int_eq(count_events(team_tok, id3, "image", "pulling image"), 1);
    ty_rmrf(proj);
}
END_TEST

static int64_t submit_image(const char *tok, const char *image, const char *argv_json, int restarts) {
    char spec[1024];
    snprintf(spec, sizeof spec,
             "{\"name\": \"img\", \"command\": {\"argv\": %s}, \"environment\": {\"image\": \"%s\"},"
             " \"resources\": {\"workers\": 1}, \"max_restarts\": %d}",
             argv_json, image, restarts);
    return ty_submit(srv.url, tok, spec);
}

START_TEST(missing_image_fails_without_restarts) {
    NEEDS_CONTAINERS();
    store_login(team_tok);
    char image[160];
    snprintf(image, sizeof image, "127.0.0.1:%d/team/no-such-image:1", reg_port);
    int64_t id = submit_image(team_tok, image, "[\"true\"]", 3);
    cJSON *j = wait_state(team_tok, id, "failed", 120);
    ck_assert_str_eq(ty_str(j, "state"), "failed");
    const char *why = ty_str(j, "reason");
    ck_assert_msg(strstr(why, image) && strstr(why, "manifest unknown"), "reason: %s", why);
    ck_assert_msg(strstr(why, "not restarted") != NULL, "reason: %s", why);
    ck_assert_int_eq((int)ty_num(j, "attempt"), 1); /* the restart budget untouched */
    cJSON_Delete(j);
    ck_assert_int_eq(count_events(team_tok, id, "state", "requeued"), 0);
}
END_TEST

START_TEST(login_is_the_teams_own) {
    NEEDS_CONTAINERS();
    store_login(team_tok);
    /* another team, without a login for the registry */
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "POST", "/api/v1/teams", "{\"name\":\"other\"}", &o), 201);
    char other[160];
    snprintf(other, sizeof other, "%s", ty_str(o, "token"));
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, other, "GET", "/api/v1/registries", NULL, &o), 200);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(o, "registries")), 0);
    cJSON_Delete(o);
    /* the first team's list shows the user, never the password */
    char *text = ty_http_text(srv.url, team_tok, "/api/v1/registries");
    ck_assert_ptr_nonnull(strstr(text, REG_USER));
    ck_assert_ptr_null(strstr(text, REG_PASS));
    free(text);
    int64_t id = submit_image(other, image_ref, "[\"true\"]", 2);
    cJSON *j = wait_state(other, id, "failed", 120);
    ck_assert_str_eq(ty_str(j, "state"), "failed");
    ck_assert_msg(strstr(ty_str(j, "reason"), "unauthorized") != NULL, "reason: %s", ty_str(j, "reason"));
    cJSON_Delete(j);
    /* a team's token cannot read a job's login: only its task can */
    char path[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/registry-auth", (long long)id);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", path, NULL, NULL) / 100, 4);
    /* the server's files hold the password sealed, never in the clear (grep
     * says 2 when a file it listed was gone before it read it: the agent's
     * state is written through a temporary file; it looks again) */
    char cmd[600];
    snprintf(cmd, sizeof cmd, "grep -rqa '%s' %s", REG_PASS, srv.dir);
    int found = run_quiet(cmd);
    for (int k = 0; k < 5 && found == 2; k++) found = run_quiet(cmd);
    ck_assert_msg(found == 1, "the password is in the clear under %s (grep: %d)", srv.dir, found);
}
END_TEST

START_TEST(cancel_removes_the_container) {
    NEEDS_CONTAINERS();
    store_login(team_tok);
    int64_t id = submit_image(team_tok, image_ref, "[\"sleep\", \"600\"]", 0);
    cJSON *j = wait_state(team_tok, id, "running", 120);
    ck_assert_str_eq(ty_str(j, "state"), "running");
    cJSON_Delete(j);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "podman ps -q --filter label=trainyard.job=%lld | grep -q .", (long long)id);
    int seen = 0;
    for (int i = 0; i < 100 && !seen; i++) {
        seen = run_quiet(cmd) == 0;
        if (!seen) ty_sleep_ms(200);
    }
    ck_assert_msg(seen, "no container of job %lld runs", (long long)id);
    char path[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/cancel", (long long)id);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", path, "{}", NULL), 200);
    j = wait_state(team_tok, id, "cancelled", 60);
    ck_assert_str_eq(ty_str(j, "state"), "cancelled");
    cJSON_Delete(j);
    snprintf(cmd, sizeof cmd, "podman ps -aq --filter label=trainyard.job=%lld | grep -q .", (long long)id);
    int gone = 0;
    for (int i = 0; i < 150 && !gone; i++) {
        gone = run_quiet(cmd) != 0;
        if (!gone) ty_sleep_ms(200);
    }
    ck_assert_msg(gone, "job %lld's container is still there after cancel", (long long)id);
}
END_TEST

/* A program in an image that allocates past the task's memory limit is
 * killed by the kernel, and the job's reason says so with the limit, as a
 * host task's does (not a bare "exit code 137"); a program that exits 137
 * itself is not taken for one. The agent's cgroup the container ran under
 * is gone after each. */
START_TEST(oom_in_image_names_the_limit) {
    NEEDS_CONTAINERS();
    store_login(team_tok);
    char spec[1024];
    snprintf(spec, sizeof spec,
             "{\"name\": \"img-oom\", \"command\": {\"argv\": [\"python3\", \"-c\","
             " \"x = b'x' * (512 << 20); print('allocated', len(x))\"]},"
             " \"environment\": {\"image\": \"%s\"}, \"resources\": {\"workers\": 1, \"memory\": \"128MiB\"},"
             " \"max_restarts\": 0}",
             image_ref);
    int64_t id = ty_submit(srv.url, team_tok, spec);
    cJSON *j = wait_state(team_tok, id, "failed", 120);
    char *w0 = task_log(id, "worker-0");
    ck_assert_msg(strcmp(ty_str(j, "state"), "failed") == 0, "job %s: %s\n%s", ty_str(j, "state"),
                  ty_str(j, "reason"), w0);
    ck_assert_msg(strstr(ty_str(j, "reason"), "exited with code 137: out of memory (limit 128 MiB)") != NULL,
                  "reason: %s\n%s", ty_str(j, "reason"), w0);
    ck_assert_msg(strstr(w0, "allocated") == NULL, "the allocation succeeded:\n%s", w0);
    cJSON_Delete(j);
    free(w0);

    id = submit_image(team_tok, image_ref, "[\"sh\", \"-c\", \"exit 137\"]", 0);
    j = wait_state(team_tok, id, "failed", 120);
    ck_assert_str_eq(ty_str(j, "state"), "failed");
    ck_assert_msg(strstr(ty_str(j, "reason"), "exited with code 137") != NULL &&
                      strstr(ty_str(j, "reason"), "out of memory") == NULL,
                  "reason: %s", ty_str(j, "reason"));
    cJSON_Delete(j);

    /* the agent's container parents: none left once the tasks are gone */
    pid_t ag[2];
    ck_assert_int_eq(ty_children_named(srv.pid, "agent", ag, 2), 1);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "ls -d /sys/fs/cgroup/*/trainyard-ctr-%d/*/ 2>/dev/null | grep -q .", (int)ag[0]);
    int left = 1;
    for (int i = 0; i < 50 && left; i++) {
        left = run_quiet(cmd) == 0;
        if (left) ty_sleep_ms(100);
    }
    ck_assert_msg(!left, "container cgroups of agent %d are left under /sys/fs/cgroup", (int)ag[0]);
}
END_TEST

/* Needs no podman: an agent told not to use it offers only the host. */
START_TEST(image_refused_without_podman) {
    const char *extra[] = {"--cpu-slots", "2", "--podman", "none", NULL};
    start_with(extra);
    cJSON *o = wait_nodes();
    char *t = cJSON_PrintUnformatted(o);
    ck_assert_msg(strstr(t, "\"runtimes\":[\"host\"]") != NULL, "%s", t);
    free(t);
    cJSON_Delete(o);
    const char *spec = "{\"command\": {\"argv\": [\"true\"]}, \"environment\": {\"image\": \"debian:12\"}}";
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", "/api/v1/jobs", spec, &o), 422);
    ty_assert_error(o, "infeasible", "environment.image");
    ck_assert_msg(strstr(ty_str(cJSON_GetObjectItem(o, "error"), "message"), "podman") != NULL, "no podman named");
    cJSON_Delete(o);
    /* nothing stored */
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", "/api/v1/jobs", NULL, &o), 200);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(o, "jobs")), 0);
    cJSON_Delete(o);
    /* queued when asked, with the reason */
    spec = "{\"command\": {\"argv\": [\"true\"]}, \"environment\": {\"image\": \"debian:12\"},"
           " \"queue_if_infeasible\": true}";
    int64_t id = ty_submit(srv.url, team_tok, spec);
    cJSON *j = NULL;
    for (int i = 0; i < 50; i++) {
        j = job_get(id);
        if (strstr(ty_str(j, "reason"), "podman")) break;
        cJSON_Delete(j);
        j = NULL;
        ty_sleep_ms(100);
    }
    ck_assert_msg(j != NULL, "the queued job's reason never named podman");
    ck_assert_str_eq(ty_str(j, "state"), "queued");
    cJSON_Delete(j);
}
END_TEST

/* Host tasks (no image) with contexts: the agent fetches a context once per
 * node (one "fetched" line for the two tasks of a gang), each task starts in
 * its own copy, and the cache keeps under --cache-max-mb, least recently
 * used out first. */
static void random_file(const char *path, size_t n) {
    FILE *in = fopen("/dev/urandom", "rb"), *out = fopen(path, "wb");
    ck_assert_ptr_nonnull(in);
    ck_assert_ptr_nonnull(out);
    char b[4096];
    while (n) {
        size_t k = n < sizeof b ? n : sizeof b;
        ck_assert_uint_eq(fread(b, 1, k, in), k);
        ck_assert_uint_eq(fwrite(b, 1, k, out), k);
        n -= k;
    }
    fclose(in);
    fclose(out);
}

static int count_in_file(const char *path, const char *needle) {
    size_t len = 0;
    char *s = file_read_all(path, 64 << 20, &len);
    int n = 0;
    for (const char *p = s ? s : ""; (p = strstr(p, needle)); p++) n++;
    free(s);
    return n;
}

START_TEST(host_contexts_fetched_once_and_cache_bounded) {
    char cache[256];
    ty_mkdtemp(cache, sizeof cache, "ctxcache");
    const char *extra[] = {"--cpu-slots", "2", "--podman", "none", "--cache-dir", cache, "--cache-max-mb", "1", NULL};
    start_with(extra);
    int64_t ids[2];
    char digest[2][80];
    for (int k = 0; k < 2; k++) {
        char proj[256], path[400], job[400];
        ty_mkdtemp_shared(proj, sizeof proj, "hostproj");
        snprintf(path, sizeof path, "%s/weights.bin", proj);
        random_file(path, 700 * 1024); /* incompressible: two do not fit in 1 MiB */
        snprintf(path, sizeof path, "%s/run.sh", proj);
        write_file_ck(path, "test -f weights.bin && echo \"rank $RANK in $(pwd) as $(id -u)\"\n", 0644);
        snprintf(job, sizeof job, "%s/job%d.json", srv.dir, k);
        write_file_ck(job,
                      "{\"command\": {\"argv\": [\"/bin/sh\", \"run.sh\"]}, \"resources\": {\"workers\": 2},"
                      " \"strategy\": {\"type\": \"multi_worker_mirrored\"}, \"max_restarts\": 0}",
                      0644);
        ids[k] = submit_cli(team_tok, job, proj);
        cJSON *j = wait_state(team_tok, ids[k], "succeeded", 120);
        char *w0 = task_log(ids[k], "worker-0"), *w1 = task_log(ids[k], "worker-1");
        ck_assert_msg(strcmp(ty_str(j, "state"), "succeeded") == 0, "job %s: %s\n%s\n%s", ty_str(j, "state"),
                      ty_str(j, "reason"), w0, w1);
        const char *ctx = ty_str(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "spec"), "command"), "context");
        snprintf(digest[k], sizeof digest[k], "%s", ctx[0] ? ctx + 7 : "");
        cJSON_Delete(j);
        /* each task in its own copy, as its own uid (not root) */
        ck_assert_msg(strstr(w0, "rank 0 in /") && strstr(w1, "rank 1 in /"), "%s\n%s", w0, w1);
        ck_assert_msg(strstr(w0, " as 0\n") == NULL, "the task ran as root: %s", w0);
        char d0[300] = "", d1[300] = "";
        ck_assert_int_eq(sscanf(strstr(w0, "rank 0 in "), "rank 0 in %299s", d0), 1);
        ck_assert_int_eq(sscanf(strstr(w1, "rank 1 in "), "rank 1 in %299s", d1), 1);
        ck_assert_msg(strcmp(d0, d1) != 0, "the two tasks shared a directory: %s", d0);
        free(w0);
        free(w1);
        ty_rmrf(proj);
    }
    /* one fetch per job on this node, for its two tasks */
    ck_assert_int_eq(count_in_file(srv.log, "fetched ("), 2);
    /* the cache: the second context only (the first dropped to stay under 1 MiB) */
    char p0[600], p1[600];
    ck_assert_int_eq(strlen(digest[0]), 64);
    snprintf(p0, sizeof p0, "%s/contexts/%s.tar.gz", cache, digest[0]);
    snprintf(p1, sizeof p1, "%s/contexts/%s.tar.gz", cache, digest[1]);
    ck_assert_msg(access(p0, F_OK) != 0, "%s is still cached", p0);
    ck_assert_msg(access(p1, F_OK) == 0, "%s is not cached", p1);
    ty_rmrf(cache);
}
END_TEST

START_TEST(bad_environment_specs) {
    const char *extra[] = {"--cpu-slots", "2", "--podman", "none", NULL};
    start_with(extra);
    static const struct {
        const char *spec, *code, *field;
    } cases[] = {
        {"{\"command\": {\"argv\": [\"true\"]}, \"environment\": {\"image\": \"-v /:/host\"}}", "invalid_value",
         "environment.image"},
        {"{\"command\": {\"argv\": [\"true\"]}, \"environment\": {\"image\": \"UPPER/case\"}}", "invalid_value",
         "environment.image"},
        {"{\"command\": {\"argv\": [\"true\"]}, \"environment\": {}}", "missing_field", "environment.image"},
        {"{\"command\": {\"argv\": [\"true\"]}, \"environment\": {\"image\": \"a\", \"pull\": \"never\"}}",
         "invalid_value", "environment.pull"},
        {"{\"command\": {\"argv\": [\"true\"]}, \"environment\": {\"image\": \"a\", \"cpus\": 2}}", "unknown_field",
         "environment.cpus"},
        {"{\"command\": {\"argv\": [\"true\"], \"context\": \"sha256:abc\"}}", "invalid_value", "command.context"},
        {"{\"model\": {\"input_shape\": [4], \"layers\": [{\"type\": \"dense\", \"units\": 2}]},"
         " \"environment\": {\"image\": \"a\"}}",
         "invalid_value", "environment"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cJSON *o = NULL;
        long st = ty_http(srv.url, team_tok, "POST", "/api/v1/jobs", cases[i].spec, &o);
        ck_assert_msg(st == 422, "case %zu answered %ld", i, st);
        ty_assert_error(o, cases[i].code, cases[i].field);
        cJSON_Delete(o);
    }
}
END_TEST

int main(void) {
    decide_skip();
    if (skip_why[0]) fprintf(stderr, "check_image: SKIP the container cases: %s\n", skip_why);
    Suite *s = suite_create("image");
    TCase *tc = ty_tcase(s, "containers", start, stop, 300);
    tcase_add_test(tc, context_in_image_two_ranks);
    tcase_add_test(tc, missing_image_fails_without_restarts);
    tcase_add_test(tc, login_is_the_teams_own);
    tcase_add_test(tc, cancel_removes_the_container);
    tcase_add_test(tc, oom_in_image_names_the_limit);
    TCase *tn = ty_tcase(s, "no podman", NULL, stop, 120);
    tcase_add_test(tn, image_refused_without_podman);
    tcase_add_test(tn, bad_environment_specs);
    tcase_add_test(tn, host_contexts_fetched_once_and_cache_bounded);
    int rc = ty_run_suite(s);
    registry_down();
    return rc;
}
