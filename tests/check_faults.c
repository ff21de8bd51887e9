/* check_faults.c - fault injection on real processes (docs/reliability.md):
 * kill -9 of the server while submissions pour in and two jobs train; kill -9
 * of one worker of a gang and of an agent (the gang resumes from its latest
 * checkpoint, and attempt 2's first checkpoint is one epoch past it); a
 * checkpoint upload cut halfway or with a wrong sha256; a full disk (a small
 * tmpfs as the data directory); 64 concurrent writers; 16 clients submitting
 * at once (batches of the group commit) and a kill -9 right after some 201s.
 *
 * The short form runs in `make test`; FAULTS_LONG=1 (`make test-faults`)
 * runs the long form: three server kills, each during 500 submissions from
 * 32 clients; the agent kill as well as the worker kill; 64 writers x 200
 * rounds. */
#include "testlib.h"

#include <fcntl.h>
#include <pthread.h>
#include <sqlite3.h>
#include <sys/mount.h>

static int g_long;
static ty_proc srv;
static char team_tok[128], node_tok[128];
static char listen_arg[64];
static pid_t agent_pid;
static char mnt[256];                 /* full_disk: the tmpfs mount point, "" when none */

/* ---------------------------------------------------------------- processes */

static void start_server_fixed(const char *hb) {
    const char *extra[] = {"--listen", listen_arg, "--heartbeat-timeout", hb, NULL};
    ty_server_start_args(&srv, "server", extra);
}

/* The same with no disk reserve: the file system itself runs out (a full
 * disk's writes fail and are answered 507 storage_full), which the reserve
 * would otherwise refuse first (tests/check_quota.c has the reserve). */
static void start_server_no_reserve(const char *hb) {
    const char *extra[] = {"--listen", listen_arg, "--heartbeat-timeout", hb, "--disk-reserve", "0%", NULL};
    ty_server_start_args(&srv, "server", extra);
}

static void fresh(const char *tag) {
    memset(&srv, 0, sizeof srv);
    agent_pid = 0;
    ty_mkdtemp(srv.dir, sizeof srv.dir, tag);
    snprintf(listen_arg, sizeof listen_arg, "127.0.0.1:%d", ty_free_port());
}

/* A server (heartbeat timeout 3 s) and one agent with 2 CPU slots. */
static void setup_agent(void) {
    fresh("faults");
    start_server_fixed("3");
    ty_token(&srv, "token", team_tok, sizeof team_tok);
    ty_token(&srv, "node.token", node_tok, sizeof node_tok);
    agent_pid = ty_agent_start(&srv, "faults-node", "2");
}

/* A server only; the test plays the agent (a node that never beats). */
static void setup_server(void) {
    fresh("faults");
    start_server_fixed("3600");
    ty_token(&srv, "token", team_tok, sizeof team_tok);
    ty_token(&srv, "node.token", node_tok, sizeof node_tok);
}

static void reap(pid_t *pid, int sig) {
    if (*pid <= 0) return;
    ty_proc p = {.pid = *pid};
    ty_kill(&p, sig);
    *pid = 0;
}

static void teardown(void) {
    reap(&agent_pid, SIGTERM);
    ty_kill(&srv, SIGTERM);
    if (mnt[0]) {
        if (umount2(mnt, MNT_DETACH) < 0) fprintf(stderr, "faults: cannot unmount %s: %s\n", mnt, strerror(errno));
        rmdir(mnt);
        mnt[0] = '\0';
    }
    if (getenv("FAULTS_KEEP")) fprintf(stderr, "faults: kept %s\n", srv.dir);
    else ty_rmrf(srv.dir);
}

/* ---------------------------------------------------------------- API helpers */

/* A training job: synthetic data, 3200 examples, `batch` global batch,
 * a checkpoint every epoch, all of them kept (keep 100 >= epochs). */
static void spec_train(char *out, size_t n, const char *name, int epochs, const char *strategy, int workers,
                       int batch) {
    snprintf(out, n,
             "{\"name\":\"%s\",\"model\":{\"layers\":["
             "{\"type\":\"dense\",\"units\":256,\"activation\":\"relu\",\"input_shape\":[64]},"
             "{\"type\":\"dense\",\"units\":1,\"activation\":\"sigmoid\"}]},"
             "\"compile\":{\"optimizer\":{\"type\":\"sgd\",\"learning_rate\":0.05},"
             "\"loss\":\"binary_crossentropy\",\"metrics\":[\"accuracy\"]},"
             "\"data\":{\"source\":\"synthetic\",\"examples\":3200,\"features\":64,\"seed\":5},"
             "\"fit\":{\"epochs\":%d,\"batch_size\":%d},\"strategy\":%s,"
             "\"resources\":{\"workers\":%d,\"devices_per_worker\":1,\"device\":\"cpu\"},"
             "\"checkpoint\":{\"every_epochs\":1,\"keep\":100},\"max_restarts\":3}",
             name, epochs, batch, strategy, workers);
}

/* A job that waits forever (no GPU anywhere): the submissions' payload. */
static const char SPEC_WAITING[] =
    "{\"name\":\"waits\",\"model\":{\"layers\":[{\"type\":\"dense\",\"units\":1,\"activation\":\"sigmoid\","
    "\"input_shape\":[4]}]},\"compile\":{\"optimizer\":{\"type\":\"sgd\",\"learning_rate\":0.1},"
    "\"loss\":\"binary_crossentropy\"},\"data\":{\"source\":\"synthetic\",\"examples\":100,\"features\":4},"
    "\"fit\":{\"epochs\":1,\"batch_size\":10},\"resources\":{\"workers\":1,\"devices_per_worker\":1,"
    "\"device\":\"gpu\"},\"queue_if_infeasible\":true}";

/* A small CPU job the test itself plays the worker of. */
static const char SPEC_CPU[] =
    "{\"name\":\"played\",\"model\":{\"layers\":[{\"type\":\"dense\",\"units\":1,\"activation\":\"sigmoid\","
    "\"input_shape\":[4]}]},\"compile\":{\"optimizer\":{\"type\":\"sgd\",\"learning_rate\":0.1},"
    "\"loss\":\"binary_crossentropy\"},\"data\":{\"source\":\"synthetic\",\"examples\":100,\"features\":4},"
    "\"fit\":{\"epochs\":1,\"batch_size\":10}}";

static int64_t submit(const char *spec) { return ty_submit(srv.url, team_tok, spec); }

static void job_state(int64_t id, char *state, size_t n, int *attempt) {
    cJSON *o = ty_job_get(srv.url, team_tok, id);
    snprintf(state, n, "%s", ty_str(o, "state"));
    if (attempt) *attempt = (int)ty_num(o, "attempt");
    cJSON_Delete(o);
}

static void wait_state(int64_t id, const char *want, int timeout_s) {
    char state[32] = "";
    int64_t end = mono_ms() + (int64_t)timeout_s * 1000;
    while (mono_ms() < end) {
        job_state(id, state, sizeof state, NULL);
        if (strcmp(state, want) == 0) return;
        if (!strcmp(state, "succeeded") || !strcmp(state, "failed") || !strcmp(state, "cancelled")) break;
        ty_sleep_ms(100);
    }
    ck_abort_msg("job %lld is %s, not %s (after up to %d s)", (long long)id, state, want, timeout_s);
}

/* The job's checkpoints (the caller deletes). */
static cJSON *checkpoints(int64_t id) {
    char path[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints", (long long)id);
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", path, NULL, &o), 200);
    cJSON *arr = cJSON_DetachItemFromObject(o, "checkpoints");
    cJSON_Delete(o);
    ck_assert(cJSON_IsArray(arr));
    return arr;
}

static void wait_checkpoints(int64_t id, int n, int timeout_s) {
    int64_t end = mono_ms() + (int64_t)timeout_s * 1000;
    int have = 0;
    while (mono_ms() < end) {
        cJSON *c = checkpoints(id);
        have = cJSON_GetArraySize(c);
        cJSON_Delete(c);
        if (have >= n) return;
        ty_sleep_ms(20); /* an optimized build trains an epoch of these jobs in ~7 ms */
    }
    ck_abort_msg("job %lld has %d checkpoints, not %d, after %d s", (long long)id, have, n, timeout_s);
}

/* A finished job's metrics: seq 1..N without a gap or a duplicate, steps
 * strictly increasing, epochs 1..epochs once each. */
static void check_metric_seq(int64_t id, int epochs) {
    cJSON *all = ty_metrics_all(srv.url, team_tok, id);
    int n = cJSON_GetArraySize(all);
    ck_assert_int_gt(n, epochs);
    long last_step = 0;
    int seen[128] = {0};
    for (int i = 0; i < n; i++) {
        const cJSON *m = cJSON_GetArrayItem(all, i);
        ck_assert_msg((int64_t)ty_num(m, "seq") == i + 1, "job %lld: metric %d has seq %.0f: a gap or a duplicate",
                      (long long)id, i + 1, ty_num(m, "seq"));
        if (strcmp(ty_str(m, "kind"), "step") == 0) {
            long s = (long)ty_num(m, "step");
            ck_assert_msg(s > last_step, "job %lld: step %ld after step %ld", (long long)id, s, last_step);
            last_step = s;
        } else if (strcmp(ty_str(m, "kind"), "epoch") == 0) {
            int e = (int)ty_num(m, "epoch");
            ck_assert(e >= 1 && e <= epochs && e < 128);
            ck_assert_msg(!seen[e], "job %lld: epoch %d reported twice", (long long)id, e);
            seen[e] = 1;
        }
    }
    for (int e = 1; e <= epochs; e++) ck_assert_msg(seen[e], "job %lld: epoch %d never reported", (long long)id, e);
    cJSON_Delete(all);
}

static char *http_text(const char *path) { return ty_http_text(srv.url, team_tok, path); }

/* ---------------------------------------------------------------- the test as an agent */

static int64_t register_node(const char *host, int cpu) {
    char body[256];
    snprintf(body, sizeof body, "{\"hostname\":\"%s\",\"address\":\"127.0.0.1\",\"cpu_slots\":%d,\"devices\":[]}",
             host, cpu);
    cJSON *o = NULL;
    long st = ty_http(srv.url, node_tok, "POST", "/api/v1/nodes", body, &o);
    ck_assert_msg(st == 200 || st == 201, "POST /nodes answered %ld", st);
    int64_t id = (int64_t)ty_num(o, "id");
    /* the node's own token, where the server mints one (else the join token acts) */
    if (ty_str(o, "token")[0]) snprintf(node_tok, sizeof node_tok, "%s", ty_str(o, "token"));
    cJSON_Delete(o);
    return id;
}

typedef struct played {
    int64_t job, task;
    char token[160];
} played;

/* Takes the start of every job in jobs[0..n) from the node's assignments and
 * reports each task running. */
static void take_starts(int64_t node, const int64_t *jobs, int n, played *out) {
    memset(out, 0, sizeof *out * (size_t)n);
    int got = 0;
    for (int round = 0; round < 40 && got < n; round++) {
        char p[96];
        snprintf(p, sizeof p, "/api/v1/nodes/%lld/assignments?wait=1", (long long)node);
        cJSON *o = NULL;
        ck_assert_int_eq(ty_http(srv.url, node_tok, "GET", p, NULL, &o), 200);
        cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItem(o, "start")) {
            int64_t job = (int64_t)ty_num(it, "job");
            for (int i = 0; i < n; i++) {
                if (jobs[i] != job || out[i].task) continue;
                out[i].job = job;
                out[i].task = (int64_t)ty_num(it, "task");
                snprintf(out[i].token, sizeof out[i].token, "%s", ty_str(it, "token"));
                got++;
            }
        }
        cJSON_Delete(o);
    }
    ck_assert_msg(got == n, "%d of %d jobs handed out", got, n);
    for (int i = 0; i < n; i++) {
        char p[96];
        snprintf(p, sizeof p, "/api/v1/tasks/%lld/status", (long long)out[i].task);
        cJSON *o = NULL;
        ck_assert_int_eq(ty_http(srv.url, node_tok, "POST", p, "{\"state\":\"running\"}", &o), 200);
        cJSON_Delete(o);
    }
}

/* POST metrics seq from..to as the task: the status (0: not reached). */
static long post_metrics(client *c, const played *p, int from, int to) {
    buf b;
    buf_init(&b, 1u << 20);
    buf_appends(&b, "{\"metrics\":[");
    for (int i = from; i <= to; i++)
        buf_printf(&b, "%s{\"seq\":%d,\"kind\":\"step\",\"step\":%d,\"epoch\":0,\"loss\":%g}", i > from ? "," : "",
                   i, i, 1.0 / i);
    buf_appends(&b, "]}");
    char path[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/metrics", (long long)p->job);
    snprintf(c->token, sizeof c->token, "%s", p->token);
    client_reply r;
    long st = client_request(c, "POST", path, b.data, b.len, NULL, &r) == 0 ? r.status : 0;
    client_reply_release(&r);
    buf_release(&b);
    return st;
}

/* ---------------------------------------------------------------- raw HTTP */

static int port_of(const char *url) {
    const char *c = strrchr(url, ':');
    ck_assert_ptr_nonnull(c);
    long port = 0;
    ck_assert_int_eq(parse_long(c + 1, 1, 65535, &port), 0);
    return (int)port;
}

static int dial(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port_of(srv.url));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

static void send_all(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        ck_assert_msg(w > 0, "send: %s", strerror(errno));
        c += w;
        n -= (size_t)w;
    }
}

/* PUT a checkpoint over a raw socket: announces `announced` bytes, sends the
 * first `sent` of data; when sent < announced the socket is closed there
 * (a cut upload) and 0 is returned; else the status of the answer. */
static long put_ckpt_raw(const played *p, const char *data, size_t announced, size_t sent, const char *sha, int step,
                         cJSON **out) {
    int fd = dial();
    char head[1024];
    int hn = snprintf(head, sizeof head,
                      "PUT /api/v1/jobs/%lld/checkpoints?step=%d&epoch=%d HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                      "Authorization: Bearer %s\r\nX-Checksum-Sha256: %s\r\n"
                      "Content-Type: application/octet-stream\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
                      (long long)p->job, step, step, p->token, sha, announced);
    send_all(fd, head, (size_t)hn);
    send_all(fd, data, sent);
    if (sent < announced) {
        ty_sleep_ms(200); /* the server has read part of the body */
        close(fd);
        return 0;
    }
    buf b;
    buf_init(&b, 1u << 20);
    char tmp[4096];
    ssize_t r;
    while ((r = recv(fd, tmp, sizeof tmp, 0)) > 0) ck_assert_int_eq(buf_append(&b, tmp, (size_t)r), 0);
    close(fd);
    long status = 0;
    ck_assert_msg(b.data && sscanf(b.data, "HTTP/1.%*d %ld", &status) == 1, "no status line");
    const char *body = b.data ? strstr(b.data, "\r\n\r\n") : NULL;
    if (out) *out = body ? cJSON_Parse(body + 4) : NULL;
    buf_release(&b);
    return status;
}

/* Downloads the job's latest checkpoint: its bytes' sha256 in got. */
static void latest_sha(int64_t job, char got[65], size_t *len) {
    char path[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints/latest", (long long)job);
    client c;
    ck_assert_int_eq(client_init(&c, srv.url, team_tok), 0);
    client_reply r;
    ck_assert_int_eq(client_request(&c, "GET", path, NULL, 0, NULL, &r), 0);
    ck_assert_msg(r.status == 200, "GET %s answered %ld", path, r.status);
    sha256_hex(r.body.data ? r.body.data : "", r.body.len, got);
    *len = r.body.len;
    client_reply_release(&r);
    client_release(&c);
}

/* ================================================================ 1. server kill -9 */

/* POST /api/v1/jobs: the HTTP status (0: no answer, the server died) and,
 * for a 2xx with an id, that id in *id. */
static int post_job(client *c, const char *spec, size_t len, int64_t *id) {
    client_reply r;
    *id = 0;
    if (client_request(c, "POST", "/api/v1/jobs", spec, len, NULL, &r) < 0) {
        client_reply_release(&r);
        return 0;
    }
    int st = r.status;
    if (st >= 200 && st < 300) {
        cJSON *o = cJSON_ParseWithLength(r.body.data ? r.body.data : "", r.body.len);
        if (cJSON_IsNumber(cJSON_GetObjectItem(o, "id"))) *id = (int64_t)ty_num(o, "id");
        cJSON_Delete(o);
    }
    client_reply_release(&r);
    return st;
}

typedef struct sub_run {
    int n;                        /* submissions to try */
    int next;                     /* atomic: next index */
    int acked;                    /* atomic: 2xx with an id */
    int failed;                   /* atomic: no answer (the server died) */
    int errors5xx;                /* atomic: 5xx answers */
    int64_t *ids;                 /* (n) acknowledged ids, 0 when not */
} sub_run;

static void *submitter(void *arg) {
    sub_run *s = arg;
    client c;
    if (client_init(&c, srv.url, team_tok) != 0) return NULL;
    c.timeout_ms = 10000;
    for (;;) {
        int i = __atomic_fetch_add(&s->next, 1, __ATOMIC_SEQ_CST);
        if (i >= s->n) break;
        int64_t id = 0;
        int st = post_job(&c, SPEC_WAITING, sizeof SPEC_WAITING - 1, &id);
        if (st == 0) {
            __atomic_fetch_add(&s->failed, 1, __ATOMIC_SEQ_CST);
        } else if (st >= 200 && st < 300) {
            if (id) {
                s->ids[i] = id;
                __atomic_fetch_add(&s->acked, 1, __ATOMIC_SEQ_CST);
            }
        } else if (st >= 500) {
            __atomic_fetch_add(&s->errors5xx, 1, __ATOMIC_SEQ_CST);
        }
    }
    client_release(&c);
    return NULL;
}

#define TRAIN_EPOCHS 80

START_TEST(server_kill9_during_submissions) {
    char spec[4096];
    int64_t train[2];
    for (int i = 0; i < 2; i++) {
        char name[32];
        snprintf(name, sizeof name, "train-%d", i);
        spec_train(spec, sizeof spec, name, TRAIN_EPOCHS, "{\"type\":\"default\"}", 1, 32);
        train[i] = submit(spec);
    }
    for (int i = 0; i < 2; i++) wait_checkpoints(train[i], 2, 120);

    for (int i = 0; i < 2; i++) { /* both train while the submissions come and the server dies */
        char state[32];
        job_state(train[i], state, sizeof state, NULL);
        ck_assert_msg(strcmp(state, "running") == 0, "training job %d is %s before the kill", i, state);
    }
    /* the long form kills the server 3 times, each during 500 submissions */
    int rounds = g_long ? 3 : 1;
    for (int round = 0; round < rounds; round++) {
        sub_run s;
        memset(&s, 0, sizeof s);
        s.n = g_long ? 500 : 100;
        s.ids = xcalloc((size_t)s.n, sizeof *s.ids);
        int nthreads = g_long ? 32 : 10;
        pthread_t th[32];
        for (int t = 0; t < nthreads; t++) ck_assert_int_eq(pthread_create(&th[t], NULL, submitter, &s), 0);
        /* kill -9 once a third of them are acknowledged */
        int64_t end = mono_ms() + 60000;
        while (__atomic_load_n(&s.acked, __ATOMIC_SEQ_CST) < s.n / 3 && mono_ms() < end) ty_sleep_ms(1);
        ck_assert_int_eq(WTERMSIG(ty_kill(&srv, SIGKILL)), SIGKILL);
        int acked_at_kill = __atomic_load_n(&s.acked, __ATOMIC_SEQ_CST);
        for (int t = 0; t < nthreads; t++) pthread_join(th[t], NULL);
        fprintf(stderr, "faults: server kill %d: %d of %d submissions acknowledged (%d by the end, %d unanswered)\n",
                round + 1, acked_at_kill, s.n, s.acked, s.failed);
        ck_assert_int_eq(s.errors5xx, 0);
        ck_assert_int_ge(s.acked, s.n / 3);
        ck_assert_int_gt(s.failed, 0); /* the kill did land during the submissions */

        start_server_fixed("3");
        for (int i = 0; i < 2; i++) { /* they were still training at the kill */
            char state[32];
            job_state(train[i], state, sizeof state, NULL);
            ck_assert_msg(strcmp(state, "succeeded") != 0, "training job %d ended before the kill: lengthen it", i);
        }
        /* every acknowledged job is there, as submitted */
        for (int i = 0; i < s.n; i++) {
            if (!s.ids[i]) continue;
            char state[32];
            job_state(s.ids[i], state, sizeof state, NULL);
            ck_assert_msg(strcmp(state, "queued") == 0, "job %lld is %s", (long long)s.ids[i], state);
        }
        free(s.ids);
    }
    /* the training jobs finish, without a gap in their metrics */
    for (int i = 0; i < 2; i++) {
        wait_state(train[i], "succeeded", 180);
        char state[32];
        int attempt = 0;
        job_state(train[i], state, sizeof state, &attempt);
        ck_assert_int_eq(attempt, 1); /* the workers rode out the server's death */
        check_metric_seq(train[i], TRAIN_EPOCHS);
    }
}
END_TEST

/* ================================================================ 1b. group commit, kill -9 */

/* Submissions that arrive together share one transaction (storage/db.h,
 * group commit): many clients submit distinct jobs at once, so batches
 * form; the server is killed with SIGKILL right after some 201s; after a
 * restart, every job answered 201 is there with the spec it was sent. */

typedef struct grp_run {
    int n;                        /* submissions to try */
    int next;                     /* atomic: next index */
    int acked;                    /* atomic: 201 with an id */
    int failed;                   /* atomic: no answer (the server died) */
    int errors5xx;                /* atomic */
    int other;                    /* atomic: any other answer (none expected) */
    int64_t *ids;                 /* (n) the id each 201 named, 0 when none */
} grp_run;

/* Submission i's spec: its own name and seed, so a job read back can only
 * match the one submission it came from. */
static void grp_spec(char *out, size_t cap, int i) {
    snprintf(out, cap,
             "{\"name\":\"grp-%d\",\"model\":{\"layers\":[{\"type\":\"dense\",\"units\":1,\"activation\":\"sigmoid\","
             "\"input_shape\":[4]}]},\"compile\":{\"optimizer\":{\"type\":\"sgd\",\"learning_rate\":0.1},"
             "\"loss\":\"binary_crossentropy\"},\"data\":{\"source\":\"synthetic\",\"examples\":%d,\"features\":4,"
             "\"seed\":%d},\"fit\":{\"epochs\":1,\"batch_size\":10},\"resources\":{\"workers\":1,"
             "\"devices_per_worker\":1,\"device\":\"gpu\"},\"queue_if_infeasible\":true}",
             i, 100 + i, i);
}

static void *grp_submitter(void *arg) {
    grp_run *s = arg;
    client c;
    if (client_init(&c, srv.url, team_tok) != 0) return NULL;
    c.timeout_ms = 10000;
    char spec[1024];
    for (;;) {
        int i = __atomic_fetch_add(&s->next, 1, __ATOMIC_SEQ_CST);
        if (i >= s->n) break;
        grp_spec(spec, sizeof spec, i);
        int64_t id = 0;
        int st = post_job(&c, spec, strlen(spec), &id);
        if (st == 0) {
            __atomic_fetch_add(&s->failed, 1, __ATOMIC_SEQ_CST);
        } else if (st == 201) {
            if (id) {
                s->ids[i] = id;
                __atomic_fetch_add(&s->acked, 1, __ATOMIC_SEQ_CST);
            }
        } else if (st >= 500) {
            __atomic_fetch_add(&s->errors5xx, 1, __ATOMIC_SEQ_CST);
        } else {
            __atomic_fetch_add(&s->other, 1, __ATOMIC_SEQ_CST);
        }
    }
    client_release(&c);
    return NULL;
}

/* A value of the server's /metrics (admin token), -1 when absent. */
static double metric_value(const char *name) {
    char admin[128];
    ty_token(&srv, "admin.token", admin, sizeof admin);
    client c;
    ck_assert_int_eq(client_init(&c, srv.url, admin), 0);
    client_reply r;
    ck_assert_int_eq(client_request(&c, "GET", "/metrics", NULL, 0, NULL, &r), 0);
    ck_assert_int_eq(r.status, 200);
    double v = -1;
    size_t nl = strlen(name);
    for (const char *p = r.body.data; p && *p;) {
        if (strncmp(p, name, nl) == 0 && p[nl] == ' ') {
            v = strtod(p + nl + 1, NULL);
            break;
        }
        const char *e = strchr(p, '\n');
        p = e ? e + 1 : NULL;
    }
    client_reply_release(&r);
    client_release(&c);
    return v;
}

START_TEST(group_commit_kill9_keeps_every_201) {
    int rounds = g_long ? 3 : 1;
    for (int round = 0; round < rounds; round++) {
        grp_run s;
        memset(&s, 0, sizeof s);
        s.n = g_long ? 3000 : 600;
        s.ids = xcalloc((size_t)s.n, sizeof *s.ids);
        enum { THREADS = 16 };
        pthread_t th[THREADS];
        for (int t = 0; t < THREADS; t++) ck_assert_int_eq(pthread_create(&th[t], NULL, grp_submitter, &s), 0);
        /* batches formed: some transaction held more than one submission */
        int64_t end = mono_ms() + 60000;
        while (__atomic_load_n(&s.acked, __ATOMIC_SEQ_CST) < s.n / 4 && mono_ms() < end) ty_sleep_ms(1);
        double batch_max = metric_value("trainyard_db_group_batch_max");
        double commits = metric_value("trainyard_db_group_commits_total");
        double writes = metric_value("trainyard_db_group_writes_total");
        /* kill -9 right after some 201s, the others still pouring in */
        while (__atomic_load_n(&s.acked, __ATOMIC_SEQ_CST) < s.n / 3 && mono_ms() < end) ty_sleep_ms(1);
        ck_assert_int_eq(WTERMSIG(ty_kill(&srv, SIGKILL)), SIGKILL);
        int acked_at_kill = __atomic_load_n(&s.acked, __ATOMIC_SEQ_CST);
        for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
        fprintf(stderr,
                "faults: group commit kill %d: %d of %d acknowledged at the kill (%d by the end, %d unanswered); "
                "before it %.0f writes in %.0f commits, the largest %.0f\n",
                round + 1, acked_at_kill, s.n, s.acked, s.failed, writes, commits, batch_max);
        ck_assert_int_eq(s.errors5xx, 0);
        ck_assert_int_eq(s.other, 0);
        ck_assert_int_ge(s.acked, s.n / 3);
        ck_assert_int_gt(s.failed, 0); /* the kill landed during the submissions */
        ck_assert_msg(batch_max >= 2 && writes > commits,
                      "no batch held two submissions (largest %.0f, %.0f writes in %.0f commits)", batch_max, writes,
                      commits);

        start_server_fixed("3600");
        /* every 201 is there, queued, with the spec it was sent, under its own id */
        int checked = 0;
        char spec[1024];
        for (int i = 0; i < s.n; i++) {
            if (!s.ids[i]) continue;
            cJSON *o = ty_job_get(srv.url, team_tok, s.ids[i]);
            ck_assert_msg(o != NULL, "job %lld (submission %d) answered 201 and is gone", (long long)s.ids[i], i);
            char name[32];
            snprintf(name, sizeof name, "grp-%d", i);
            ck_assert_str_eq(ty_str(o, "name"), name);
            ck_assert_str_eq(ty_str(o, "state"), "queued");
            grp_spec(spec, sizeof spec, i);
            cJSON *sent = cJSON_Parse(spec);
            ck_assert_msg(cJSON_Compare(cJSON_GetObjectItem(o, "spec"), sent, 1),
                          "job %lld's spec differs from submission %d's", (long long)s.ids[i], i);
            cJSON_Delete(sent);
            cJSON_Delete(o);
            checked++;
        }
        ck_assert_int_eq(checked, s.acked);
        free(s.ids);
    }
}
END_TEST

/* ================================================================ 2. gang member kill -9 */

/* The worker process of task `name` (TRAINYARD_TASK_NAME) among the agent's children. */
static pid_t task_pid(pid_t agent, const char *name) {
    pid_t wk[8];
    int n = ty_children_named(agent, "worker", wk, 8);
    char want[96];
    snprintf(want, sizeof want, "TRAINYARD_TASK_NAME=%s", name);
    for (int i = 0; i < n; i++) {
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/environ", (int)wk[i]);
        size_t len = 0;
        char *env = file_read_all(path, 1 << 20, &len);
        int yes = 0;
        for (size_t off = 0; env && off < len; off += strlen(env + off) + 1) yes |= strcmp(env + off, want) == 0;
        free(env);
        if (yes) return wk[i];
    }
    return 0;
}

#define GANG_EPOCHS 40
#define GANG_BATCH 64 /* 3200 / 64 = 50 steps an epoch */

/* A 2-worker multi_worker_mirrored gang loses a worker (or its agent) to
 * kill -9 after 3 checkpoints: attempt 2 starts from the latest checkpoint
 * of attempt 1 (the chief logs the sha256 it resumed from, and attempt 2's
 * first checkpoint is the end of the epoch after it, not epoch 1) and the
 * job succeeds without a metric gap. */
static void gang_resumes(int kill_agent) {
    char spec[4096];
    spec_train(spec, sizeof spec, kill_agent ? "gang-agent" : "gang-worker", GANG_EPOCHS,
               "{\"type\":\"multi_worker_mirrored\"}", 2, GANG_BATCH);
    int64_t id = submit(spec);
    /* early in the run: in an optimized build 25 epochs take about a second,
     * and a kill after the last epoch's checkpoint leaves attempt 2 nothing
     * to train (and no checkpoint of its own: the check below failed once so) */
    wait_checkpoints(id, 2, 120);
    if (kill_agent) {
        pid_t wk[4];
        int nw = ty_children_named(agent_pid, "worker", wk, 4);
        ck_assert_int_eq(nw, 2);
        reap(&agent_pid, SIGKILL);
        /* the orphaned workers stop (their agent is gone) */
        for (int i = 0; i < 300; i++) {
            int alive = 0;
            for (int k = 0; k < nw; k++) alive |= kill(wk[k], 0) == 0;
            if (!alive) break;
            ty_sleep_ms(50);
        }
        for (int k = 0; k < nw; k++) ck_assert_msg(kill(wk[k], 0) < 0, "a worker outlived its agent by 15 s");
        agent_pid = ty_agent_start(&srv, "faults-node", "2");
    } else {
        pid_t victim = task_pid(agent_pid, "worker-1");
        ck_assert_int_gt(victim, 0);
        ck_assert_int_eq(kill(victim, SIGKILL), 0);
    }
    wait_state(id, "succeeded", 240);
    char state[32];
    int attempt = 0;
    job_state(id, state, sizeof state, &attempt);
    ck_assert_int_eq(attempt, 2);
    check_metric_seq(id, GANG_EPOCHS);

    /* the checkpoints: attempt 2's first is one epoch past attempt 1's last */
    cJSON *cks = checkpoints(id);
    const cJSON *last1 = NULL, *first2 = NULL, *c;
    cJSON_ArrayForEach(c, cks) {
        int a = (int)ty_num(c, "attempt");
        if (a == 1 && (!last1 || ty_num(c, "step") > ty_num(last1, "step"))) last1 = c;
        if (a == 2 && (!first2 || ty_num(c, "step") < ty_num(first2, "step"))) first2 = c;
    }
    ck_assert_msg(last1 && first2, "checkpoints of both attempts expected");
    long steps_per_epoch = 3200 / GANG_BATCH;
    fprintf(stderr, "faults: %s kill: attempt 1 checkpointed step %.0f (epoch %.0f); attempt 2's first: step %.0f\n",
            kill_agent ? "agent" : "worker", ty_num(last1, "step"), ty_num(last1, "epoch"), ty_num(first2, "step"));
    ck_assert_int_eq((long)ty_num(first2, "epoch"), (long)ty_num(last1, "epoch") + 1);
    /* attempt 1's last may be mid-epoch (a stopped worker checkpoints where it is) */
    ck_assert_int_eq((long)ty_num(first2, "step"), ((long)ty_num(last1, "step") / steps_per_epoch + 1) * steps_per_epoch);
    char path[128], want[128];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/logs?task=worker-0", (long long)id);
    snprintf(want, sizeof want, "resuming from the job's latest checkpoint (sha256 %.16s", ty_str(last1, "sha256"));
    char *logs = http_text(path);
    ck_assert_msg(strstr(logs, want) != NULL, "worker-0's log lacks '%s': %.1500s", want, logs);
    free(logs);
    cJSON_Delete(cks);
}

START_TEST(worker_kill9_gang_resumes_from_checkpoint) { gang_resumes(0); }
END_TEST

START_TEST(agent_kill9_gang_resumes_from_checkpoint) { gang_resumes(1); }
END_TEST

/* ================================================================ 3. checkpoint uploads */

/* n bytes i * mul + add (a checkpoint's stand-in) and their sha256. */
static char *pattern(size_t n, int mul, int add, char sha[65]) {
    char *p = xmalloc(n);
    for (size_t i = 0; i < n; i++) p[i] = (char)(i * (size_t)mul + (size_t)add);
    sha256_hex(p, n, sha);
    return p;
}

START_TEST(checkpoint_cut_or_bad_sha_keeps_the_previous) {
    int64_t node = register_node("ck-node", 1);
    int64_t job = submit(SPEC_CPU);
    played p;
    take_starts(node, &job, 1, &p);

    size_t n = 256 * 1024;
    char sha_a[65], sha_b[65], got[65];
    char *a = pattern(n, 7, 1, sha_a), *b = pattern(n, 13, 5, sha_b);
    cJSON *o = NULL;
    ck_assert_int_eq(put_ckpt_raw(&p, a, n, n, sha_a, 10, &o), 201);
    cJSON_Delete(o);

    /* a wrong sha256: 422, nothing stored */
    ck_assert_int_eq(put_ckpt_raw(&p, b, n, n, sha_a, 20, &o), 422);
    ck_assert_str_eq(ty_str(cJSON_GetObjectItem(o, "error"), "code"), "checksum_mismatch");
    cJSON_Delete(o);
    /* cut halfway: Content-Length n, n/2 sent, then the socket closed */
    put_ckpt_raw(&p, b, n, n / 2, sha_b, 30, NULL);
    /* cut after all but one byte */
    put_ckpt_raw(&p, b, n, n - 1, sha_b, 40, NULL);
    ty_sleep_ms(300);

    cJSON *cks = checkpoints(job);
    ck_assert_int_eq(cJSON_GetArraySize(cks), 1);
    ck_assert_str_eq(ty_str(cJSON_GetArrayItem(cks, 0), "sha256"), sha_a);
    ck_assert_int_eq((long)ty_num(cJSON_GetArrayItem(cks, 0), "step"), 10);
    cJSON_Delete(cks);
    size_t len = 0;
    latest_sha(job, got, &len);
    ck_assert_int_eq(len, n);
    ck_assert_str_eq(got, sha_a);
    /* one file on disk: nothing of the refused uploads left behind */
    char cmd[512];
    snprintf(cmd, sizeof cmd, "test \"$(find '%s/checkpoints' -type f | wc -l)\" = 1", srv.dir);
    ck_assert_msg(system(cmd) == 0, "stray files under %s/checkpoints", srv.dir);

    /* the next good upload is taken */
    ck_assert_int_eq(put_ckpt_raw(&p, b, n, n, sha_b, 50, &o), 201);
    cJSON_Delete(o);
    latest_sha(job, got, &len);
    ck_assert_str_eq(got, sha_b);
    free(a);
    free(b);
}
END_TEST

/* ================================================================ 4. full disk */

static void integrity_ok(const char *dbpath) {
    sqlite3 *db = NULL;
    ck_assert_int_eq(sqlite3_open_v2(dbpath, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_busy_timeout(db, 10000);
    sqlite3_stmt *st = NULL;
    ck_assert_int_eq(sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &st, NULL), SQLITE_OK);
    ck_assert_int_eq(sqlite3_step(st), SQLITE_ROW);
    ck_assert_str_eq((const char *)sqlite3_column_text(st, 0), "ok");
    sqlite3_finalize(st);
    sqlite3_close(db);
}

/* Fills the file system under dir: returns the filler's path in out. */
static void fill_disk(const char *dir, char *out, size_t n) {
    snprintf(out, n, "%s/filler", dir);
    int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ck_assert_int_ge(fd, 0);
    static char block[65536];
    for (;;) {
        ssize_t w = write(fd, block, sizeof block);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
    }
    for (;;) { /* the last partial page */
        ssize_t w = write(fd, block, 512);
        if (w <= 0) break;
    }
    close(fd);
}

/* A write refused for lack of space: 507 storage_full naming the disk. */
static void assert_full(long st, cJSON *o, const char *what) {
    ck_assert_msg(st == 507, "%s on a full disk answered %ld: %s", what, st, o ? cJSON_PrintUnformatted(o) : "");
    cJSON *e = cJSON_GetObjectItem(o, "error");
    ck_assert_str_eq(ty_str(e, "code"), "storage_full");
    ck_assert_msg(strstr(ty_str(e, "message"), "full") != NULL, "message: %s", ty_str(e, "message"));
}

START_TEST(full_disk_refuses_writes_and_recovers) {
    memset(&srv, 0, sizeof srv);
    if (ty_pg_url()) {
        fprintf(stderr, "faults: SKIPPED full_disk on PostgreSQL: the database is not on the data directory's"
                        " disk (its free-space check is SQLite's; a full PostgreSQL disk fails the write: 503)\n");
        fresh("faults");
        return;
    }
    ty_mkdtemp(mnt, sizeof mnt, "fullmnt");
    if (mount("tmpfs", mnt, "tmpfs", 0, "size=6m,mode=0700") < 0) {
        fprintf(stderr, "faults: SKIPPED full_disk: cannot mount a tmpfs on %s (%s); needs root or CAP_SYS_ADMIN\n",
                mnt, strerror(errno));
        rmdir(mnt);
        mnt[0] = '\0';
        fresh("faults");
        return;
    }
    /* for main() to unmount it should this test fail (check runs no teardown then) */
    char note[64];
    snprintf(note, sizeof note, "/tmp/ty_faults_mount.%d", (int)getppid());
    if (file_write_atomic(note, mnt, strlen(mnt), 0600) < 0) fprintf(stderr, "faults: cannot write %s\n", note);
    ck_assert_int_eq(sfmt(srv.dir, sizeof srv.dir, "%s/data", mnt), 0);
    ck_assert_int_eq(mkdir(srv.dir, 0700), 0);
    snprintf(listen_arg, sizeof listen_arg, "127.0.0.1:%d", ty_free_port());
    start_server_no_reserve("3600");
    ty_token(&srv, "token", team_tok, sizeof team_tok);
    ty_token(&srv, "node.token", node_tok, sizeof node_tok);
    int64_t node = register_node("full-node", 1);
    int64_t job = submit(SPEC_CPU);
    played p;
    take_starts(node, &job, 1, &p);
    client c;
    ck_assert_int_eq(client_init(&c, srv.url, team_tok), 0);
    ck_assert_int_eq(post_metrics(&c, &p, 1, 10), 200);
    int64_t acked[20];
    for (int i = 0; i < 20; i++) acked[i] = submit(SPEC_WAITING);
    size_t n = 256 * 1024;
    char sha_a[65], sha_b[65], got[65];
    char *a = pattern(n, 3, 1, sha_a), *b = pattern(n, 11, 2, sha_b);
    cJSON *o = NULL;
    ck_assert_int_eq(put_ckpt_raw(&p, a, n, n, sha_a, 10, &o), 201);
    cJSON_Delete(o);
    char logpath[96];
    snprintf(logpath, sizeof logpath, "/api/v1/jobs/%lld/logs?task=worker-0", (long long)job);
    static const char line[] = "a line of the worker's output\n";
    snprintf(c.token, sizeof c.token, "%s", p.token);
    client_reply r;
    ck_assert_int_eq(client_request(&c, "POST", logpath, line, sizeof line - 1, "text/plain", &r), 0);
    ck_assert_int_eq(r.status, 200);
    client_reply_release(&r);
    snprintf(c.token, sizeof c.token, "%s", team_tok);

    char filler[512];
    fill_disk(mnt, filler, sizeof filler);
    /* writes: refused with a clear cause, every time */
    int metrics_seq = 11;
    for (int round = 0; round < 3; round++) {
        o = NULL;
        /* a WAL page or two may still fit: write until the disk says no */
        long st = 0;
        for (int k = 0; k < 200; k++) {
            st = ty_http(srv.url, team_tok, "POST", "/api/v1/jobs", SPEC_WAITING, &o);
            if (st != 201) break;
            cJSON_Delete(o);
            o = NULL;
        }
        assert_full(st, o, "POST /jobs");
        cJSON_Delete(o);
        st = post_metrics(&c, &p, metrics_seq, metrics_seq + 50);
        if (st == 200) metrics_seq += 51;
        else ck_assert_msg(st == 507, "POST metrics on a full disk answered %ld", st);
        snprintf(c.token, sizeof c.token, "%s", team_tok);
        st = put_ckpt_raw(&p, b, n, n, sha_b, 20 + round, &o);
        assert_full(st, o, "PUT checkpoint");
        cJSON_Delete(o);
        snprintf(c.token, sizeof c.token, "%s", p.token);
        for (int k = 0; k < 64; k++) { /* a page of the log file may still fit */
            ck_assert_int_eq(client_request(&c, "POST", logpath, b, 4096, "text/plain", &r), 0);
            st = r.status;
            o = st == 200 ? NULL : cJSON_ParseWithLength(r.body.data, r.body.len);
            client_reply_release(&r);
            if (st != 200) break;
        }
        assert_full(st, o, "POST logs");
        cJSON_Delete(o);
        snprintf(c.token, sizeof c.token, "%s", team_tok);
    }
    /* the checkpoint taken before the disk filled is intact */
    size_t len = 0;
    latest_sha(job, got, &len);
    ck_assert_str_eq(got, sha_a);
    /* reads: every acknowledged job is there */
    for (int i = 0; i < 20; i++) {
        char state[32];
        job_state(acked[i], state, sizeof state, NULL);
        ck_assert_str_eq(state, "queued");
    }
    char dbpath[600];
    snprintf(dbpath, sizeof dbpath, "%s/trainyard.db", srv.dir);
    integrity_ok(dbpath);

    /* space returns: the same server takes writes again */
    ck_assert_int_eq(unlink(filler), 0);
    int64_t after = submit(SPEC_WAITING);
    char state[32];
    job_state(after, state, sizeof state, NULL);
    ck_assert_str_eq(state, "queued");
    ck_assert_int_eq(post_metrics(&c, &p, metrics_seq, metrics_seq + 5), 200);
    ck_assert_int_eq(put_ckpt_raw(&p, b, n, n, sha_b, 30, &o), 201);
    cJSON_Delete(o);
    latest_sha(job, got, &len);
    ck_assert_str_eq(got, sha_b);
    snprintf(c.token, sizeof c.token, "%s", p.token);
    ck_assert_int_eq(client_request(&c, "POST", logpath, line, sizeof line - 1, "text/plain", &r), 0);
    ck_assert_int_eq(r.status, 200);
    client_reply_release(&r);
    free(a);
    free(b);
    cJSON *all = ty_metrics_all(srv.url, team_tok, job);
    ck_assert_int_eq(cJSON_GetArraySize(all), metrics_seq + 5);
    for (int i = 0; i < metrics_seq + 5; i++) ck_assert_int_eq((int)ty_num(cJSON_GetArrayItem(all, i), "seq"), i + 1);
    cJSON_Delete(all);
    client_release(&c);
    ty_kill(&srv, SIGTERM);
    integrity_ok(dbpath);
}
END_TEST

/* ================================================================ 5. many writers */

#define WRITERS 64
#define METRIC_JOBS 16

typedef struct writers_run {
    played p[METRIC_JOBS];
    int rounds;
    int errors5xx, unanswered;    /* atomics */
    int last5xx;
} writers_run;

typedef struct writer_arg {
    writers_run *w;
    int index;
} writer_arg;

static void *writer(void *arg) {
    writer_arg *a = arg;
    writers_run *w = a->w;
    client c;
    if (client_init(&c, srv.url, team_tok) != 0) return NULL;
    c.timeout_ms = 60000;
    for (int r = 0; r < w->rounds; r++) {
        long st = 0;
        client_reply rep;
        if (a->index % 4 == 0) { /* a worker posting its metrics */
            st = post_metrics(&c, &w->p[a->index / 4], r * 10 + 1, r * 10 + 10);
        } else {
            snprintf(c.token, sizeof c.token, "%s", team_tok);
            if (client_request(&c, "POST", "/api/v1/jobs", SPEC_WAITING, sizeof SPEC_WAITING - 1, NULL, &rep) == 0) {
                st = rep.status;
                if (st == 201 && a->index % 4 == 3) { /* and cancels it */
                    cJSON *o = cJSON_ParseWithLength(rep.body.data, rep.body.len);
                    char path[96];
                    snprintf(path, sizeof path, "/api/v1/jobs/%lld/cancel", (long long)ty_num(o, "id"));
                    cJSON_Delete(o);
                    client_reply_release(&rep);
                    st = client_request(&c, "POST", path, NULL, 0, NULL, &rep) == 0 ? rep.status : 0;
                }
            }
            client_reply_release(&rep);
        }
        if (st == 0) __atomic_fetch_add(&w->unanswered, 1, __ATOMIC_SEQ_CST);
        else if (st >= 500) {
            __atomic_fetch_add(&w->errors5xx, 1, __ATOMIC_SEQ_CST);
            w->last5xx = (int)st;
        }
    }
    client_release(&c);
    return NULL;
}

START_TEST(many_writers_no_5xx) {
    int64_t node = register_node("busy-node", METRIC_JOBS);
    int64_t jobs[METRIC_JOBS];
    for (int i = 0; i < METRIC_JOBS; i++) jobs[i] = submit(SPEC_CPU);
    writers_run *w = xcalloc(1, sizeof *w);
    take_starts(node, jobs, METRIC_JOBS, w->p);
    w->rounds = g_long ? 200 : 12;
    pthread_t th[WRITERS];
    writer_arg args[WRITERS];
    int64_t t0 = mono_ms();
    for (int i = 0; i < WRITERS; i++) {
        args[i] = (writer_arg){w, i};
        ck_assert_int_eq(pthread_create(&th[i], NULL, writer, &args[i]), 0);
    }
    for (int i = 0; i < WRITERS; i++) pthread_join(th[i], NULL);
    fprintf(stderr, "faults: %d writers x %d rounds in %lld ms: %d 5xx, %d unanswered\n", WRITERS, w->rounds,
            (long long)(mono_ms() - t0), w->errors5xx, w->unanswered);
    ck_assert_msg(w->errors5xx == 0, "%d answers were 5xx (last %d)", w->errors5xx, w->last5xx);
    ck_assert_int_eq(w->unanswered, 0);
    /* every metric stored once, in order */
    for (int i = 0; i < METRIC_JOBS; i++) {
        cJSON *all = ty_metrics_all(srv.url, team_tok, jobs[i]);
        ck_assert_int_eq(cJSON_GetArraySize(all), w->rounds * 10);
        for (int k = 0; k < w->rounds * 10; k++) ck_assert_int_eq((int)ty_num(cJSON_GetArrayItem(all, k), "seq"), k + 1);
        cJSON_Delete(all);
    }
    /* every acknowledged submission is stored: 48 writers x rounds (+ the 16 played jobs) */
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", "/api/v1/jobs?limit=1", NULL, &o), 200);
    int64_t newest = (int64_t)ty_num(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "jobs"), 0), "id");
    cJSON_Delete(o);
    ck_assert_int_eq(newest, METRIC_JOBS + (WRITERS - METRIC_JOBS) * w->rounds);
    free(w);
}
END_TEST

int main(void) {
    const char *l = getenv("FAULTS_LONG");
    g_long = l && *l && strcmp(l, "0") != 0;
    Suite *s = suite_create(g_long ? "faults (long)" : "faults");
    TCase *procs = ty_tcase(s, "processes", setup_agent, teardown, 400);
    tcase_add_test(procs, server_kill9_during_submissions);
    tcase_add_test(procs, worker_kill9_gang_resumes_from_checkpoint);
    if (g_long) tcase_add_test(procs, agent_kill9_gang_resumes_from_checkpoint);
    TCase *played_tc = ty_tcase(s, "played agent", setup_server, teardown, 300);
    tcase_add_test(played_tc, checkpoint_cut_or_bad_sha_keeps_the_previous);
    tcase_add_test(played_tc, many_writers_no_5xx);
    TCase *subs = ty_tcase(s, "group commit", setup_server, teardown, 300);
    tcase_add_test(subs, group_commit_kill9_keeps_every_201);
    TCase *disk = ty_tcase(s, "disk", NULL, teardown, 120);
    tcase_add_test(disk, full_disk_refuses_writes_and_recovers);
    int rc = ty_run_suite(s);
    /* a failed full-disk test (no teardown after a failure) leaves its tmpfs mounted */
    char note[64];
    snprintf(note, sizeof note, "/tmp/ty_faults_mount.%d", (int)getpid());
    size_t len = 0;
    char *m = file_read_all(note, 4096, &len);
    if (m) {
        if (umount2(m, MNT_DETACH) == 0) fprintf(stderr, "faults: unmounted %s left by a failed test\n", m);
        rmdir(m);
        free(m);
        unlink(note);
    }
    return rc;
}
