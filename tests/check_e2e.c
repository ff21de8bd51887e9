/* check_e2e.c - the executors end to end with real processes on loopback:
 * `trainyard up` (server + local agent) or a server and agents started
 * here, and the workers they run. A job trains to succeeded with its
 * metrics, test accuracy, logs and a checkpoint whose sha256 matches;
 * cancel frees the devices within 5 s; a worker killed with -9 fails the
 * gang and the retry succeeds; kill -9 of the agent and of the server
 * mid-run cost progress, never the job, and never a duplicated step or a
 * gap in the metric sequence. Measures submit -> first training step.
 * Every strategy (default, one_device, mirrored, central_storage,
 * multi_worker_mirrored) runs a job to succeeded on `trainyard up
 * --cpu-slots 4`, and a 2-worker job whose worker 1 is killed with -9
 * resumes from its checkpoint at attempt 2; so does a CNN with batch
 * normalization. */
#include "testlib.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>

/* Fashion-MNIST, 2000 examples: 1800 train / 200 validation, trained with
 * `strategy` (a JSON object) on workers x devices_per_worker CPU slots;
 * `epochs` sets the length of a run. */
/* The next specs' layers when not NULL (else an MLP). */
static const char *g_layers;

static void spec_strategy_ps(char *out, size_t n, const char *name, int epochs, int max_restarts,
                             const char *strategy, int workers, int devices, int batch, int ps) {
    char psf[32] = "";
    if (ps) snprintf(psf, sizeof psf, ",\"ps\":%d", ps);
    snprintf(out, n,
             "{\"name\":\"%s\",\"model\":{\"layers\":[%s]},"
             "\"compile\":{\"optimizer\":{\"type\":\"adam\",\"learning_rate\":0.001},"
             "\"loss\":\"sparse_categorical_crossentropy\",\"metrics\":[\"accuracy\"]},"
             "\"data\":{\"source\":\"fashion-mnist\",\"limit\":2000,\"validation_split\":0.1,\"seed\":7},"
             "\"fit\":{\"epochs\":%d,\"batch_size\":%d},"
             "\"strategy\":%s,"
             "\"resources\":{\"workers\":%d,\"devices_per_worker\":%d,\"device\":\"cpu\"%s},"
             "\"checkpoint\":{\"every_epochs\":1,\"keep\":3},"
             "\"max_restarts\":%d}",
             name,
             g_layers ? g_layers
                      : "{\"type\":\"flatten\",\"input_shape\":[28,28]},"
                        "{\"type\":\"dense\",\"units\":128,\"activation\":\"relu\"},"
                        "{\"type\":\"dropout\",\"rate\":0.2},"
                        "{\"type\":\"dense\",\"units\":10,\"activation\":\"softmax\"}",
             epochs, batch, strategy, workers, devices, psf, max_restarts);
}

static void spec_strategy(char *out, size_t n, const char *name, int epochs, int max_restarts, const char *strategy,
                          int workers, int devices, int batch) {
    spec_strategy_ps(out, n, name, epochs, max_restarts, strategy, workers, devices, batch, 0);
}

/* The default strategy at batch 25: 72 steps an epoch. */
static void spec_fashion(char *out, size_t n, const char *name, int epochs, int max_restarts) {
    spec_strategy(out, n, name, epochs, max_restarts, "{\"type\":\"default\"}", 1, 1, 25);
}

/* Epochs of the jobs that get killed mid-run: long enough that a kill
 * after epoch 2-3 lands before the end (0.1-0.2 s an epoch optimized). */
#define E2E_LONG 30

/* ---------------------------------------------------------------- processes */

static ty_proc srv;
static char team_tok[128];
static pid_t agents[4];

/* `trainyard up` whose agent offers `slots` CPU slots. */
static void start_up_slots(const char *slots) {
    memset(&srv, 0, sizeof srv);
    memset(agents, 0, sizeof agents);
    ty_mkdtemp(srv.dir, sizeof srv.dir, "e2e");
    const char *extra[] = {"--cpu-slots", slots, NULL};
    ty_server_start_args(&srv, "up", extra);
    ty_token(&srv, "token", team_tok, sizeof team_tok);
}

/* one CPU slot: a second job can only start on devices a first one freed */
static void start_up(void) { start_up_slots("1"); }

static char listen_arg[64];

static void start_server_fixed(void) {
    const char *extra[] = {"--listen", listen_arg, "--heartbeat-timeout", "3", NULL};
    ty_server_start_args(&srv, "server", extra);
}

static void start_server_only(void) {
    memset(&srv, 0, sizeof srv);
    memset(agents, 0, sizeof agents);
    ty_mkdtemp(srv.dir, sizeof srv.dir, "e2e");
    snprintf(listen_arg, sizeof listen_arg, "127.0.0.1:%d", ty_free_port());
    start_server_fixed();
    ty_token(&srv, "token", team_tok, sizeof team_tok);
}

/* `trainyard agent` for the server, its output appended to DIR/agent.log. */
static pid_t agent_start(void) { return ty_agent_start(&srv, "e2e-node", "2"); }

static void reap(pid_t *pid, int sig) {
    if (*pid <= 0) return;
    ty_proc p = {.pid = *pid};
    ty_kill(&p, sig);
    *pid = 0;
}

static void stop_all(void) {
    for (int i = 0; i < 4; i++) reap(&agents[i], SIGTERM);
    ty_kill(&srv, SIGTERM);
    /* keep the data directory of a failed run for a look */
    if (getenv("E2E_KEEP")) fprintf(stderr, "e2e: kept %s\n", srv.dir);
    else ty_rmrf(srv.dir);
}

/* ---------------------------------------------------------------- API helpers */

static int64_t submit(const char *spec) { return ty_submit(srv.url, team_tok, spec); }

static cJSON *job_get(int64_t id) { return ty_job_get(srv.url, team_tok, id); }

static char *http_text(const char *path) { return ty_http_text(srv.url, team_tok, path); }

static void job_state(int64_t id, char *state, size_t n, int *attempt) {
    cJSON *o = job_get(id);
    cJSON *s = cJSON_GetObjectItem(o, "state");
    snprintf(state, n, "%s", cJSON_IsString(s) ? s->valuestring : "?");
    cJSON *a = cJSON_GetObjectItem(o, "attempt");
    if (attempt) *attempt = cJSON_IsNumber(a) ? a->valueint : 0;
    cJSON_Delete(o);
}

/* Waits until the job reaches `want` (or a terminal state): the state. */
static void wait_state(int64_t id, const char *want, int timeout_s, char *state, size_t n) {
    int64_t end = mono_ms() + (int64_t)timeout_s * 1000;
    while (mono_ms() < end) {
        job_state(id, state, n, NULL);
        if (strcmp(state, want) == 0) return;
        if (strcmp(state, "succeeded") == 0 || strcmp(state, "failed") == 0 || strcmp(state, "cancelled") == 0) return;
        ty_sleep_ms(100);
    }
}

/* All metrics of a job in seq order (the caller deletes). */
static cJSON *metrics_all(int64_t id) { return ty_metrics_all(srv.url, team_tok, id); }

static int is_kind(const cJSON *m, const char *kind) {
    const cJSON *k = cJSON_GetObjectItem(m, "kind");
    return cJSON_IsString(k) && strcmp(k->valuestring, kind) == 0;
}

/* Highest epoch with an epoch metric so far. */
static int epochs_reported(int64_t id) {
    cJSON *all = metrics_all(id);
    int best = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, all) if (is_kind(m, "epoch") && ty_num(m, "epoch") > best) best = (int)ty_num(m, "epoch");
    cJSON_Delete(all);
    return best;
}

static void wait_epochs(int64_t id, int epochs, int timeout_s) {
    int64_t end = mono_ms() + (int64_t)timeout_s * 1000;
    while (mono_ms() < end) {
        if (epochs_reported(id) >= epochs) return;
        ty_sleep_ms(200);
    }
    ck_abort_msg("job %lld did not report %d epochs in %d s", (long long)id, epochs, timeout_s);
}

/* The invariants of a finished job's metrics: seq 1..N without a gap, every
 * step reported once and in order, epochs 1..E once each, one test metric
 * with an accuracy above min_acc. */
static void check_metrics_steps_of(int64_t id, int epochs, double min_acc, int steps_per_epoch, int async) {
    cJSON *all = metrics_all(id);
    int n = cJSON_GetArraySize(all);
    ck_assert_int_gt(n, epochs);
    long last_step = 0, last_epoch_step = 0;
    int seen_epoch[256] = {0}, tests = 0;
    for (int i = 0; i < n; i++) {
        const cJSON *m = cJSON_GetArrayItem(all, i);
        ck_assert_msg((int64_t)ty_num(m, "seq") == i + 1, "metric %d has seq %.0f: a gap or a duplicate", i + 1,
                      ty_num(m, "seq"));
        if (is_kind(m, "step")) {
            long s = (long)ty_num(m, "step");
            ck_assert_msg(s > last_step, "step %ld reported after step %ld (seq %d)", s, last_step, i + 1);
            last_step = s;
            ck_assert(ty_num(m, "loss") >= 0);
        } else if (is_kind(m, "epoch")) {
            int e = (int)ty_num(m, "epoch");
            ck_assert(e >= 1 && e <= epochs && e < 256);
            ck_assert_msg(!seen_epoch[e], "epoch %d reported twice", e);
            seen_epoch[e] = 1;
            ck_assert(ty_num(m, "val_accuracy") >= 0);
            if ((long)ty_num(m, "step") > last_epoch_step) last_epoch_step = (long)ty_num(m, "step");
        } else if (is_kind(m, "test")) {
            tests++;
            ck_assert_msg(ty_num(m, "test_accuracy") > min_acc, "test accuracy %.3f", ty_num(m, "test_accuracy"));
        }
    }
    for (int e = 1; e <= epochs; e++) ck_assert_msg(seen_epoch[e], "epoch %d never reported", e);
    ck_assert_int_eq(tests, 1);
    /* the last epoch metric carries the job's last step; a step metric for
     * it comes only from the worker that made it (parameter_server: any of
     * them, asynchronously; the chief reports its own) */
    ck_assert_int_eq(last_epoch_step, epochs * steps_per_epoch);
    if (async) {
        ck_assert_int_le(last_step, epochs * steps_per_epoch);
        ck_assert_int_ge(last_step, epochs * steps_per_epoch - 4);
    } else {
        ck_assert_int_eq(last_step, epochs * steps_per_epoch);
    }
    cJSON_Delete(all);
}

static void check_metrics_steps(int64_t id, int epochs, double min_acc, int steps_per_epoch) {
    check_metrics_steps_of(id, epochs, min_acc, steps_per_epoch, 0);
}

static void check_metrics(int64_t id, int epochs, double min_acc) {
    check_metrics_steps(id, epochs, min_acc, 72);
}

/* ---------------------------------------------------------------- tests */

START_TEST(job_runs_to_succeeded) {
    char spec[2048], state[32];
    spec_fashion(spec, sizeof spec, "e2e-small", 4, 1);
    int64_t t0 = mono_ms();
    int64_t id = submit(spec);
    /* submit -> first training step (the first step metric is sent at once) */
    int64_t first = 0;
    while (mono_ms() - t0 < 60000 && !first) {
        char path[96];
        snprintf(path, sizeof path, "/api/v1/jobs/%lld/metrics?since=0&kind=step&limit=1", (long long)id);
        cJSON *o = NULL;
        ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", path, NULL, &o), 200);
        if (cJSON_GetArraySize(cJSON_GetObjectItem(o, "metrics")) > 0) first = mono_ms();
        cJSON_Delete(o);
        if (!first) ty_sleep_ms(20);
    }
    ck_assert_msg(first, "no training step within 60 s");
    fprintf(stderr, "e2e: submit -> first training step: %lld ms\n", (long long)(first - t0));

    wait_state(id, "succeeded", 120, state, sizeof state);
    ck_assert_str_eq(state, "succeeded");
    check_metrics(id, 4, 0.6);

    /* the job shows its progress and test metrics */
    cJSON *j = job_get(id);
    cJSON *p = cJSON_GetObjectItem(j, "progress");
    ck_assert(cJSON_IsObject(p));
    ck_assert(cJSON_IsObject(cJSON_GetObjectItem(p, "test")));
    cJSON_Delete(j);

    /* the worker's output reached the job's logs */
    char path[128];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/logs?task=worker-0", (long long)id);
    char *logs = http_text(path);
    ck_assert_msg(strstr(logs, "first training step") != NULL, "logs: %.500s", logs);
    ck_assert_msg(strstr(logs, "test: loss") != NULL, "logs: %.500s", logs);
    free(logs);

    /* the checkpoint downloads with the sha256 the list reports */
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints", (long long)id);
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", path, NULL, &o), 200);
    cJSON *cks = cJSON_GetObjectItem(o, "checkpoints");
    ck_assert_int_ge(cJSON_GetArraySize(cks), 1);
    ck_assert_int_le(cJSON_GetArraySize(cks), 3); /* checkpoint.keep */
    cJSON *ck = NULL, *it;
    cJSON_ArrayForEach(it, cks) if (!ck || ty_num(it, "step") > ty_num(ck, "step")) ck = it;
    ck_assert_int_eq((long)ty_num(ck, "epoch"), 4);
    char want[65];
    snprintf(want, sizeof want, "%s", cJSON_GetObjectItem(ck, "sha256")->valuestring);
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints/%lld", (long long)id, (long long)ty_num(ck, "id"));
    cJSON_Delete(o);
    client c;
    ck_assert_int_eq(client_init(&c, srv.url, team_tok), 0);
    client_reply r;
    ck_assert_int_eq(client_request(&c, "GET", path, NULL, 0, NULL, &r), 0);
    ck_assert_int_eq(r.status, 200);
    char got[65];
    sha256_hex(r.body.data, r.body.len, got);
    ck_assert_str_eq(got, want);
    ck_assert_int_gt(r.body.len, 100000); /* 784*128 + 128*10 weights and two Adam slots */
    client_reply_release(&r);
    client_release(&c);
}
END_TEST

START_TEST(cancel_frees_devices_within_5s) {
    char spec[2048], state[32];
    spec_fashion(spec, sizeof spec, "e2e-cancel", 200, 0);
    int64_t id = submit(spec);
    wait_epochs(id, 1, 90);
    pid_t ag[2], wk[2];
    ck_assert_int_eq(ty_children_named(srv.pid, "agent", ag, 2), 1);
    ck_assert_int_eq(ty_children_named(ag[0], "worker", wk, 2), 1);
    char path[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/cancel", (long long)id);
    int64_t t0 = mono_ms();
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", path, NULL, &o), 200);
    cJSON_Delete(o);
    /* Freed: the worker is gone and the next job gets the node's only slot. */
    char spec2[2048];
    spec_fashion(spec2, sizeof spec2, "e2e-after-cancel", 1, 0);
    int64_t id2 = submit(spec2);
    int gone = 0;
    while (mono_ms() - t0 < 5000 && !gone) {
        gone = kill(wk[0], 0) < 0;
        if (!gone) ty_sleep_ms(50);
    }
    int64_t worker_gone_ms = mono_ms() - t0;
    ck_assert_msg(gone, "the worker still runs 5 s after cancel");
    job_state(id, state, sizeof state, NULL);
    ck_assert_str_eq(state, "cancelled");
    /* the devices are free again: the next job is placed and runs */
    wait_state(id2, "running", 30, state, sizeof state);
    int64_t next_ms = mono_ms() - t0;
    ck_assert_msg(strcmp(state, "running") == 0 || strcmp(state, "succeeded") == 0, "second job: %s", state);
    fprintf(stderr, "e2e: cancel -> worker gone: %lld ms, -> next job running: %lld ms\n", (long long)worker_gone_ms,
            (long long)next_ms);
    ck_assert_msg(next_ms <= 5000, "the devices were freed only after %lld ms", (long long)next_ms);
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/logs?task=worker-0", (long long)id);
    char *logs = http_text(path);
    ck_assert_msg(strstr(logs, "stopped by SIGTERM") != NULL, "logs: %.800s", logs);
    free(logs);
}
END_TEST

START_TEST(crashed_task_fails_gang_and_retry_succeeds) {
    char spec[2048], state[32];
    spec_fashion(spec, sizeof spec, "e2e-crash", E2E_LONG, 2);
    int64_t id = submit(spec);
    wait_epochs(id, 2, 90);
    pid_t ag[2], wk[2];
    ck_assert_int_eq(ty_children_named(srv.pid, "agent", ag, 2), 1);
    ck_assert_int_eq(ty_children_named(ag[0], "worker", wk, 2), 1);
    ck_assert_int_eq(kill(wk[0], SIGKILL), 0);
    wait_state(id, "succeeded", 150, state, sizeof state);
    int attempt = 0;
    job_state(id, state, sizeof state, &attempt);
    ck_assert_str_eq(state, "succeeded");
    ck_assert_int_eq(attempt, 2);
    check_metrics(id, E2E_LONG, 0.6);
    /* the history says why the first attempt ended */
    char path[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/events", (long long)id);
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", path, NULL, &o), 200);
    char *txt = cJSON_PrintUnformatted(o);
    ck_assert_msg(strstr(txt, "signal 9") != NULL, "events: %.1500s", txt);
    free(txt);
    cJSON_Delete(o);
}
END_TEST

START_TEST(agent_kill9_then_new_agent_resumes) {
    char spec[2048], state[32];
    spec_fashion(spec, sizeof spec, "e2e-agent", E2E_LONG, 2);
    agents[0] = agent_start();
    int64_t id = submit(spec);
    wait_epochs(id, 3, 90);
    pid_t wk[2];
    ck_assert_int_eq(ty_children_named(agents[0], "worker", wk, 2), 1);
    reap(&agents[0], SIGKILL);
    /* the orphaned worker stops (its agent is gone) after a checkpoint */
    for (int i = 0; i < 200 && kill(wk[0], 0) == 0; i++) ty_sleep_ms(50);
    ck_assert_msg(kill(wk[0], 0) < 0, "the worker outlived its agent by 10 s");
    agents[1] = agent_start();
    wait_state(id, "succeeded", 150, state, sizeof state);
    int attempt = 0;
    job_state(id, state, sizeof state, &attempt);
    ck_assert_str_eq(state, "succeeded");
    ck_assert_int_eq(attempt, 2);
    check_metrics(id, E2E_LONG, 0.6);
    /* attempt 2 resumed from a checkpoint: it did not start at epoch 1 */
    char path[128];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/logs?task=worker-0", (long long)id);
    char *logs = http_text(path);
    ck_assert_msg(strstr(logs, "resuming from the job's latest checkpoint") != NULL, "logs: %.800s", logs);
    free(logs);
}
END_TEST

START_TEST(server_kill9_then_restart_no_gap) {
    char spec[2048], state[32];
    spec_fashion(spec, sizeof spec, "e2e-server", E2E_LONG, 2);
    agents[0] = agent_start();
    int64_t id = submit(spec);
    wait_epochs(id, 2, 90);
    ck_assert_int_eq(WTERMSIG(ty_kill(&srv, SIGKILL)), SIGKILL);
    ty_sleep_ms(2500); /* the worker trains on and buffers its metrics */
    start_server_fixed();
    wait_state(id, "succeeded", 150, state, sizeof state);
    int attempt = 0;
    job_state(id, state, sizeof state, &attempt);
    ck_assert_str_eq(state, "succeeded");
    ck_assert_int_eq(attempt, 1); /* the job never noticed */
    check_metrics(id, E2E_LONG, 0.6);
}
END_TEST

/* ---------------------------------------------------------------- strategies */

static void start_up4(void) { start_up_slots("4"); }

/* The log of a job's task, as text (the caller frees). */
static char *task_logs(int64_t id, const char *task) { return ty_task_log(srv.url, team_tok, id, task); }

/* Batch 40: 45 steps an epoch; divisible by 1, 2 and 4 replicas. */
#define STRAT_BATCH 40
#define STRAT_STEPS 45

typedef struct strat_case {
    const char *name, *strategy;
    int workers, devices;
    const char *log_says;        /* in worker-0's log */
    int ps;                      /* parameter_server: ps tasks */
} strat_case;

START_TEST(every_strategy_runs_to_succeeded) {
    static const strat_case cases[] = {
        {"s-default", "{\"type\":\"default\"}", 1, 1, "1 worker(s) x 1 replica(s)", 0},
        {"s-one-device", "{\"type\":\"one_device\"}", 1, 1, "1 worker(s) x 1 replica(s)", 0},
        {"s-mirrored", "{\"type\":\"mirrored\"}", 1, 2, "1 worker(s) x 2 replica(s)", 0},
        {"s-mirrored-one", "{\"type\":\"mirrored\",\"cross_device_ops\":\"reduction_to_one_device\"}", 1, 4,
         "1 worker(s) x 4 replica(s)", 0},
        {"s-central", "{\"type\":\"central_storage\"}", 1, 2, "1 worker(s) x 2 replica(s)", 0},
        {"s-mwm", "{\"type\":\"multi_worker_mirrored\",\"communication\":\"ring\"}", 2, 1, "joining 2 workers", 0},
        {"s-mwm-2x2", "{\"type\":\"multi_worker_mirrored\"}", 2, 2, "2 worker(s) x 2 replica(s)", 0},
        {"s-ps", "{\"type\":\"parameter_server\"}", 2, 1, "parameter servers initialised", 1},
    };
    enum { N = sizeof cases / sizeof cases[0] };
    int64_t ids[N];
    for (int i = 0; i < N; i++) {
        char spec[3000];
        spec_strategy_ps(spec, sizeof spec, cases[i].name, 2, 0, cases[i].strategy, cases[i].workers,
                         cases[i].devices, STRAT_BATCH, cases[i].ps);
        ids[i] = submit(spec);
    }
    for (int i = 0; i < N; i++) {
        char state[32];
        int64_t t0 = mono_ms();
        wait_state(ids[i], "succeeded", 240, state, sizeof state);
        if (strcmp(state, "succeeded") != 0) {
            char *logs = task_logs(ids[i], "worker-0");
            ck_abort_msg("%s: %s; worker-0: %.1500s", cases[i].name, state, logs);
        }
        fprintf(stderr, "e2e: %s (%d x %d) succeeded (waited %lld ms more)\n", cases[i].name, cases[i].workers,
                cases[i].devices, (long long)(mono_ms() - t0));
        /* a parameter server's step is one worker's part of a global batch */
        check_metrics_steps_of(ids[i], 2, 0.6, cases[i].ps ? STRAT_STEPS * cases[i].workers : STRAT_STEPS,
                               cases[i].ps);
        char *logs = task_logs(ids[i], "worker-0");
        ck_assert_msg(strstr(logs, cases[i].log_says) != NULL, "%s: worker-0 log lacks '%s': %.1500s",
                      cases[i].name, cases[i].log_says, logs);
        free(logs);
        if (cases[i].workers > 1 && !cases[i].ps) {
            logs = task_logs(ids[i], "worker-1");
            ck_assert_msg(strstr(logs, "joining 2 workers") != NULL, "%s: worker-1: %.1500s", cases[i].name, logs);
            free(logs);
        }
    }
}
END_TEST

/* Whether a worker process runs the task named `name` ("worker-1"), from
 * the TRAINYARD_TASK_NAME its agent gave it. */
static int is_task(pid_t pid, const char *name) {
    char path[64], want[96];
    snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
    snprintf(want, sizeof want, "TRAINYARD_TASK_NAME=%s", name);
    size_t len = 0;
    char *env = file_read_all(path, 1 << 20, &len);
    int yes = 0;
    for (size_t off = 0; env && off < len; off += strlen(env + off) + 1)
        if (strcmp(env + off, want) == 0) yes = 1;
    free(env);
    return yes;
}

/* The worker process of task `name` among the agent's children (0: none). */
static pid_t task_pid(const char *name) {
    pid_t ag[2], wk[8];
    ck_assert_int_eq(ty_children_named(srv.pid, "agent", ag, 2), 1);
    int n = ty_children_named(ag[0], "worker", wk, 8);
    for (int i = 0; i < n; i++)
        if (is_task(wk[i], name)) return wk[i];
    return 0;
}

/* A 2-worker multi_worker_mirrored job of `layers` (NULL: the MLP) whose
 * worker 1 is killed with -9 after epoch 2 resumes from its checkpoint at
 * attempt 2 and succeeds, with every step's metrics. */
static void kill_worker1_resumes(const char *name, const char *layers) {
    char spec[3000], state[32];
    g_layers = layers;
    spec_strategy(spec, sizeof spec, name, E2E_LONG, 2, "{\"type\":\"multi_worker_mirrored\"}", 2, 1,
                  STRAT_BATCH);
    g_layers = NULL;
    int64_t id = submit(spec);
    wait_epochs(id, 2, 120);
    pid_t victim = task_pid("worker-1");
    ck_assert_int_gt(victim, 0);
    ck_assert_int_eq(kill(victim, SIGKILL), 0);
    wait_state(id, "succeeded", 200, state, sizeof state);
    int attempt = 0;
    job_state(id, state, sizeof state, &attempt);
    if (strcmp(state, "succeeded") != 0) {
        char *logs = task_logs(id, "worker-0");
        ck_abort_msg("%s: %s; worker-0: %.1500s", name, state, logs);
    }
    ck_assert_int_eq(attempt, 2);
    check_metrics_steps(id, E2E_LONG, 0.6, STRAT_STEPS);
    char *logs = task_logs(id, "worker-0");
    ck_assert_msg(strstr(logs, "resuming from the job's latest checkpoint") != NULL, "logs: %.1500s", logs);
    free(logs);
}

START_TEST(multi_worker_kill9_of_one_worker_resumes_from_checkpoint) {
    kill_worker1_resumes("s-mwm-kill", NULL);
}
END_TEST

/* A CNN with batch normalization through the whole path: submitted,
 * trained by 2 workers, one killed with -9, resumed from the checkpoint
 * (weights, optimizer slots and moving statistics) at attempt 2 to
 * succeeded, with its metrics and test accuracy. */
START_TEST(cnn_multi_worker_kill9_resumes_from_checkpoint) {
    kill_worker1_resumes("cnn-mwm-kill",
                         "{\"type\":\"conv2d\",\"filters\":8,\"kernel_size\":3,\"activation\":\"relu\","
                         "\"input_shape\":[28,28]},{\"type\":\"batch_normalization\"},{\"type\":\"max_pooling2d\"},"
                         "{\"type\":\"conv2d\",\"filters\":8,\"kernel_size\":3,\"strides\":2,\"activation\":\"relu\"},"
                         "{\"type\":\"flatten\"},{\"type\":\"dropout\",\"rate\":0.2},"
                         "{\"type\":\"dense\",\"units\":10,\"activation\":\"softmax\"}");
}
END_TEST

/* parameter_server: a dead worker stops nothing; its agent starts it again. */
START_TEST(parameter_server_worker_kill9_trains_on) {
    char spec[3000], state[32];
    spec_strategy_ps(spec, sizeof spec, "s-ps-kill", 12, 0, "{\"type\":\"parameter_server\"}", 2, 1, STRAT_BATCH, 1);
    int64_t id = submit(spec);
    wait_epochs(id, 2, 120);
    ck_assert_int_gt(task_pid("ps-0"), 0);
    pid_t victim = task_pid("worker-1");
    ck_assert_int_gt(victim, 0);
    ck_assert_int_eq(kill(victim, SIGKILL), 0);
    wait_state(id, "succeeded", 200, state, sizeof state);
    int attempt = 0;
    job_state(id, state, sizeof state, &attempt);
    ck_assert_str_eq(state, "succeeded");
    ck_assert_int_eq(attempt, 1); /* no gang restart: the others trained on */
    check_metrics_steps(id, 12, 0.6, STRAT_STEPS * 2);
    char *logs = task_logs(id, "worker-1");
    ck_assert_msg(strstr(logs, "starting it again") != NULL, "worker-1: %.1500s", logs);
    free(logs);
}
END_TEST

int main(void) {
    Suite *s = suite_create("e2e");
    TCase *up = ty_tcase(s, "up", start_up, stop_all, 240);
    tcase_add_test(up, job_runs_to_succeeded);
    tcase_add_test(up, cancel_frees_devices_within_5s);
    tcase_add_test(up, crashed_task_fails_gang_and_retry_succeeds);
    TCase *faults = ty_tcase(s, "faults", start_server_only, stop_all, 240);
    tcase_add_test(faults, agent_kill9_then_new_agent_resumes);
    tcase_add_test(faults, server_kill9_then_restart_no_gap);
    TCase *strat = ty_tcase(s, "strategies", start_up4, stop_all, 300);
    tcase_add_test(strat, every_strategy_runs_to_succeeded);
    tcase_add_test(strat, multi_worker_kill9_of_one_worker_resumes_from_checkpoint);
    tcase_add_test(strat, cnn_multi_worker_kill9_resumes_from_checkpoint);
    tcase_add_test(strat, parameter_server_worker_kill9_trains_on);
    return ty_run_suite(s);
}
