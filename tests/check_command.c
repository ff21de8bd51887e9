/* check_command.c - command jobs end to end (executor/command.c) on
 * `trainyard up --cpu-slots 2`, submitted through the API: a real 2-process
 * PyTorch DDP script (examples/ddp_train.py, gloo, Debian's python3-torch)
 * where both ranks join, the loss falls in the job's metrics, the logs come
 * back and the checkpoint directory is uploaded; a script that checks
 * TF_CONFIG has TensorFlow's exact shape and each task its own index
 * (examples/tf_config_check.py); a rank that exits 3 at attempt 1 fails the
 * gang (its peer is stopped and its chief uploads the checkpoint directory),
 * the job is requeued and attempt 2 finds the checkpoint directory restored; cancel stops the program's whole process group (SIGTERM, then
 * SIGKILL for a program that ignores it); exit codes, a program that cannot
 * start, metric lines that are not metrics, working_dir, bad specs (422,
 * nothing stored). */
#include "testlib.h"

#include <limits.h>

static ty_proc srv;
static char team_tok[128];
static char tmpdir[256];

static void start_up2(void) {
    memset(&srv, 0, sizeof srv);
    ty_mkdtemp(srv.dir, sizeof srv.dir, "cmd");
    ty_mkdtemp_shared(tmpdir, sizeof tmpdir, "cmdtmp"); /* the programs run as other uids */
    const char *extra[] = {"--cpu-slots", "2", NULL};
    ty_server_start_args(&srv, "up", extra);
    ty_token(&srv, "token", team_tok, sizeof team_tok);
}

static void stop_up(void) {
    ty_kill(&srv, SIGTERM);
    if (getenv("E2E_KEEP")) fprintf(stderr, "check_command: kept %s\n", srv.dir);
    else ty_rmrf(srv.dir);
    ty_rmrf(tmpdir);
}

/* ---------------------------------------------------------------- API helpers */

static int64_t submit_text(const char *spec) { return ty_submit(srv.url, team_tok, spec); }

static int64_t submit_json(cJSON *spec) {
    char *s = cJSON_PrintUnformatted(spec);
    ck_assert_ptr_nonnull(s);
    int64_t id = submit_text(s);
    free(s);
    return id;
}

/* An example spec as it is in examples/ (the tests run from the repository
 * root, as `make run` does, so its relative script path works as written). */
static cJSON *example(const char *name) {
    char path[256];
    snprintf(path, sizeof path, "examples/%s", name);
    size_t len = 0;
    char *s = file_read_all(path, 1 << 20, &len);
    ck_assert_msg(s != NULL, "cannot read %s (run from the repository root)", path);
    cJSON *j = cJSON_ParseWithLength(s, len);
    free(s);
    ck_assert_msg(j != NULL, "%s is not JSON", path);
    return j;
}

static cJSON *job_get(int64_t id) { return ty_job_get(srv.url, team_tok, id); }

/* Waits for `want` or a terminal state; returns the job (caller deletes). */
static cJSON *wait_state(int64_t id, const char *want, int timeout_s) {
    int64_t end = mono_ms() + (int64_t)timeout_s * 1000;
    for (;;) {
        cJSON *o = job_get(id);
        const char *s = ty_str(o, "state");
        if (strcmp(s, want) == 0 || strcmp(s, "succeeded") == 0 || strcmp(s, "failed") == 0 ||
            strcmp(s, "cancelled") == 0 || mono_ms() > end)
            return o;
        cJSON_Delete(o);
        ty_sleep_ms(100);
    }
}

static char *http_text(const char *path) { return ty_http_text(srv.url, team_tok, path); }

static char *logs_of(int64_t id, const char *task) { return ty_task_log(srv.url, team_tok, id, task); }

static char *events_of(int64_t id) {
    char path[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/events", (long long)id);
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", path, NULL, &o), 200);
    char *txt = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return txt;
}

/* All metrics of a job in seq order (the caller deletes). */
static cJSON *metrics_all(int64_t id) {
    char path[128];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/metrics?since=0&limit=1000", (long long)id);
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", path, NULL, &o), 200);
    cJSON *arr = cJSON_DetachItemFromObject(o, "metrics");
    cJSON_Delete(o);
    ck_assert(cJSON_IsArray(arr));
    return arr;
}

/* Asserts the job ended in `want`; on failure shows its history and logs. */
static cJSON *expect_end(int64_t id, const char *want, int timeout_s) {
    cJSON *o = wait_state(id, want, timeout_s);
    if (strcmp(ty_str(o, "state"), want) != 0) {
        char *ev = events_of(id), *l0 = logs_of(id, "worker-0"), *l1 = logs_of(id, "worker-1");
        char *q = http_text("/api/v1/queue"), *cl = http_text("/api/v1/cluster");
        ck_abort_msg("job %lld is %s, not %s\nevents: %.2000s\nworker-0: %.3000s\nworker-1: %.2000s\n"
                     "queue: %.1000s\ncluster: %.1500s",
                     (long long)id, ty_str(o, "state"), want, ev, l0, l1, q, cl);
    }
    return o;
}

static void expect_in(const char *hay, const char *needle, const char *what) {
    ck_assert_msg(strstr(hay, needle) != NULL, "%s lacks \"%s\":\n%.4000s", what, needle, hay);
}

/* A task's log once it holds needle (the agent ships output once a second
 * and at the task's exit, which may come after the job's end state). */
static char *wait_log(int64_t id, const char *task, const char *needle, int timeout_ms) {
    int64_t end = mono_ms() + timeout_ms;
    for (;;) {
        char *l = logs_of(id, task);
        if (strstr(l, needle) || mono_ms() > end) {
            char what[64];
            snprintf(what, sizeof what, "%s's log", task);
            expect_in(l, needle, what);
            return l;
        }
        free(l);
        ty_sleep_ms(100);
    }
}

/* Debian's PyTorch must be there: a missing one fails loudly, never skips. */
static void require_torch(void) {
    int rc = system("/usr/bin/python3 -c 'import torch, numpy' >/dev/null 2>&1");
    ck_assert_msg(rc == 0,
                  "/usr/bin/python3 cannot import torch and numpy: install Debian's python3-torch and "
                  "python3-numpy (apt-get install -y python3-torch python3-numpy; scripts/deps.sh does)");
}

/* ---------------------------------------------------------------- tests */

START_TEST(ddp_two_ranks_train_and_report) {
    require_torch();
    cJSON *spec = example("ddp_train.json");
    int64_t t0 = mono_ms();
    int64_t id = submit_json(spec);
    cJSON_Delete(spec);
    cJSON *job = expect_end(id, "succeeded", 120);
    ck_assert_int_eq((int)ty_num(job, "attempt"), 1);
    cJSON_Delete(job);
    fprintf(stderr, "check_command: 2-rank DDP job submit -> succeeded in %lld ms\n", (long long)(mono_ms() - t0));

    /* both ranks joined the same process group */
    char *l0 = wait_log(id, "worker-0", "metric line(s) read", 10000);
    /* worker-1's program finishes with the chief's; whether it exits on its
     * own or is stopped because the chief finished first is a race */
    char *l1 = wait_log(id, "worker-1", "rank 1: done, 60 steps", 10000);
    expect_in(l0, "rank 0 of 2 joined", "worker-0's log");
    expect_in(l1, "rank 1 of 2 joined", "worker-1's log");
    expect_in(l0, "rank 0: done, 60 steps", "worker-0's log");
    expect_in(l1, "rank 1: done, 60 steps", "worker-1's log");
    expect_in(l0, "checkpoint uploaded: model.pt", "worker-0's log");
    free(l0);
    free(l1);

    /* metrics: numbered 1..N, steps in order, the loss falls */
    cJSON *all = metrics_all(id);
    int n = cJSON_GetArraySize(all), steps = 0, epochs = 0;
    double first_loss = -1, last_loss = -1, acc = -1;
    long last_step = 0;
    for (int i = 0; i < n; i++) {
        const cJSON *m = cJSON_GetArrayItem(all, i);
        ck_assert_int_eq((int)ty_num(m, "seq"), i + 1);
        if (strcmp(ty_str(m, "kind"), "step") == 0) {
            ck_assert_msg((long)ty_num(m, "step") > last_step, "step %.0f after %ld", ty_num(m, "step"), last_step);
            last_step = (long)ty_num(m, "step");
            if (first_loss < 0) first_loss = ty_num(m, "loss");
            last_loss = ty_num(m, "loss");
            steps++;
        } else if (strcmp(ty_str(m, "kind"), "epoch") == 0) {
            epochs++;
            acc = ty_num(m, "accuracy");
        }
    }
    cJSON_Delete(all);
    fprintf(stderr, "check_command: DDP loss %.3f -> %.3f over %d step metrics, accuracy %.3f\n", first_loss,
            last_loss, steps, acc);
    ck_assert_int_ge(steps, 2);
    ck_assert_int_eq(last_step, 60);      /* the last step always gets through the rate limit */
    ck_assert_msg(first_loss > 2.0, "first loss %.3f (10 classes: ~2.3)", first_loss);
    ck_assert_msg(last_loss < 0.75 * first_loss, "the loss did not fall: %.3f -> %.3f", first_loss, last_loss);
    ck_assert_int_eq(epochs, 1);
    ck_assert_msg(acc > 0.4, "accuracy %.3f", acc);

    /* the checkpoint: model.pt wrapped in a safetensors file, sha256 as listed */
    char path[128];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints", (long long)id);
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", path, NULL, &o), 200);
    cJSON *ck = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "checkpoints"), 0);
    ck_assert_ptr_nonnull(ck);
    ck_assert_int_eq((int)ty_num(ck, "step"), 60);
    char sha[65];
    snprintf(sha, sizeof sha, "%s", ty_str(ck, "sha256"));
    cJSON_Delete(o);
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints/latest", (long long)id);
    client c;
    ck_assert_int_eq(client_init(&c, srv.url, team_tok), 0);
    client_reply r;
    ck_assert_int_eq(client_request(&c, "GET", path, NULL, 0, NULL, &r), 0);
    ck_assert_int_eq(r.status, 200);
    char got[65];
    sha256_hex(r.body.data, r.body.len, got);
    ck_assert_str_eq(got, sha);
    ck_assert_uint_gt(r.body.len, 8);
    const unsigned char *b = (const unsigned char *)r.body.data;
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | b[i];
    ck_assert_uint_lt(8 + hl, r.body.len);
    cJSON *h = cJSON_ParseWithLength(r.body.data + 8, (size_t)hl);
    ck_assert_ptr_nonnull(h);
    cJSON *meta = cJSON_GetObjectItem(h, "__metadata__");
    ck_assert_str_eq(ty_str(meta, "format"), "trainyard-file");
    ck_assert_str_eq(ty_str(meta, "file_name"), "model.pt");
    ck_assert_str_eq(ty_str(cJSON_GetObjectItem(h, "file"), "dtype"), "U8");
    /* a torch.save zip archive follows the header */
    ck_assert_int_eq(memcmp(r.body.data + 8 + hl, "PK", 2), 0);
    cJSON_Delete(h);
    client_reply_release(&r);
    client_release(&c);
}
END_TEST

START_TEST(tf_config_has_tensorflow_shape) {
    cJSON *spec = example("tf_config_check.json");
    int64_t id = submit_json(spec);
    cJSON_Delete(spec);
    cJSON_Delete(expect_end(id, "succeeded", 60));
    char *l0 = wait_log(id, "worker-0", "TF_CONFIG ok: task worker 0 of 2", 10000);
    char *l1 = wait_log(id, "worker-1", "TF_CONFIG ok: task worker 1 of 2", 10000);
    expect_in(l0, "CUDA_VISIBLE_DEVICES=''", "worker-0's log"); /* a CPU task */
    free(l0);
    free(l1);
    cJSON *all = metrics_all(id);
    ck_assert_int_eq(cJSON_GetArraySize(all), 1);
    const cJSON *m = cJSON_GetArrayItem(all, 0);
    ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(m, "tf_config_ok")));
    ck_assert_int_eq((int)ty_num(m, "workers"), 2);
    cJSON_Delete(all);
}
END_TEST

START_TEST(failed_rank_requeues_and_checkpoint_dir_is_restored) {
    require_torch();
    cJSON *spec = example("ddp_train.json");
    cJSON *cmd = cJSON_GetObjectItem(spec, "command");
    cJSON_DeleteItemFromObject(cmd, "argv");
    const char *argv[] = {"/usr/bin/python3", "examples/ddp_train.py", "--steps", "40", "--fail-rank", "1"};
    cJSON_AddItemToObject(cmd, "argv", cJSON_CreateStringArray(argv, 6));
    cJSON_ReplaceItemInObject(spec, "name", cJSON_CreateString("ddp-fail-once"));
    int64_t id = submit_json(spec);
    cJSON_Delete(spec);
    cJSON *job = expect_end(id, "succeeded", 180);
    ck_assert_int_eq((int)ty_num(job, "attempt"), 2);
    cJSON_Delete(job);
    /* the gang failed on worker-1's exit status and was requeued */
    char *ev = events_of(id);
    expect_in(ev, "worker-1 exited with code 3", "the events");
    expect_in(ev, "requeued", "the events");
    free(ev);
    /* attempt 1's rank 0 wrote model.pt, its worker uploaded it; attempt 2
     * found it restored in every task's checkpoint directory */
    char *l0 = wait_log(id, "worker-0", "rank 0: done, 40 steps", 10000);
    char *l1 = wait_log(id, "worker-1", "rank 1: done, 40 steps", 10000);
    expect_in(l0, "rank 0: checkpoint saved at step 20", "worker-0's log");
    expect_in(l0, "stop: SIGTERM to the program", "worker-0's log"); /* the failed gang's peer */
    expect_in(l0, "checkpoint uploaded: model.pt", "worker-0's log");
    expect_in(l0, "checkpoint restored: model.pt", "worker-0's log");
    expect_in(l0, "resumed from", "worker-0's log");
    expect_in(l0, "at step 20", "worker-0's log");
    expect_in(l0, "rank 0: done, 40 steps", "worker-0's log");
    expect_in(l1, "rank 1: failing on purpose at step 20 (attempt 1)", "worker-1's log");
    expect_in(l1, "checkpoint restored: model.pt", "worker-1's log");
    expect_in(l1, "rank 1 of 2 joined (MASTER", "worker-1's log");
    expect_in(l1, "attempt 2)", "worker-1's log");
    free(l0);
    free(l1);
    /* the checkpoints: attempt 1's (step 20, restored above) until the job
     * has ended, then retention keeps the newest only (attempt 2's, step
     * 40) once the housekeeping tick has seen the end: wait for that */
    char path[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints", (long long)id);
    int at1 = -1, at2 = 0, total = 0;
    for (int tries = 0; tries < 200 && !(at1 == 0 && at2 == 1 && total == 1); tries++) {
        if (tries) ty_sleep_ms(100);
        cJSON *o = NULL;
        ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", path, NULL, &o), 200);
        at1 = at2 = total = 0;
        const cJSON *ck;
        cJSON_ArrayForEach(ck, cJSON_GetObjectItem(o, "checkpoints")) {
            total++;
            if (ty_num(ck, "attempt") == 1 && ty_num(ck, "step") == 20) at1++;
            if (ty_num(ck, "attempt") == 2 && ty_num(ck, "step") == 40) at2++;
        }
        cJSON_Delete(o);
    }
    ck_assert_int_eq(at2, 1);
    ck_assert_msg(at1 == 0 && total == 1, "after the end: %d checkpoints, %d of attempt 1 (retention keeps the newest)",
                  total, at1);
    /* metrics: one sequence across the attempts, without a gap; attempt 2's
     * start where its checkpoint left off */
    cJSON *all = metrics_all(id);
    int n = cJSON_GetArraySize(all), last_attempt = 0;
    long first_step_2 = -1;
    for (int i = 0; i < n; i++) {
        const cJSON *m = cJSON_GetArrayItem(all, i);
        ck_assert_int_eq((int)ty_num(m, "seq"), i + 1);
        int a = (int)ty_num(m, "attempt");
        ck_assert_int_ge(a, last_attempt);
        last_attempt = a;
        if (a == 2 && first_step_2 < 0) first_step_2 = (long)ty_num(m, "step");
    }
    cJSON_Delete(all);
    ck_assert_int_eq(last_attempt, 2);
    ck_assert_int_eq(first_step_2, 21);
}
END_TEST

/* Reads the pids a program wrote to tmpdir/name (one per line). */
static int read_pids(const char *name, pid_t *out, int max, int timeout_ms) {
    char path[400];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    int64_t end = mono_ms() + timeout_ms;
    for (;;) {
        size_t len = 0;
        char *s = file_read_all(path, 4096, &len);
        int n = 0;
        for (char *p = s; p && *p && n < max;) {
            long v = strtol(p, &p, 10);
            if (v > 0) out[n++] = (pid_t)v;
            while (*p == '\n') p++;
        }
        int complete = s && len && s[len - 1] == '\n' && n >= max;
        free(s);
        if (complete || mono_ms() > end) return n;
        ty_sleep_ms(50);
    }
}

static int gone_within(const pid_t *pids, int n, int ms) {
    int64_t end = mono_ms() + ms;
    for (;;) {
        int alive = 0;
        for (int i = 0; i < n; i++) {
            char p[64];
            snprintf(p, sizeof p, "/proc/%d/stat", (int)pids[i]);
            FILE *f = fopen(p, "r");
            if (!f) continue;
            char st[256] = "";
            size_t len = fread(st, 1, sizeof st - 1, f);
            fclose(f);
            st[len] = '\0';
            const char *rp = strrchr(st, ')');
            if (rp && rp[1] == ' ' && rp[2] != 'Z') alive++;
        }
        if (!alive) return 1;
        if (mono_ms() > end) return 0;
        ty_sleep_ms(50);
    }
}

/* Cancel: SIGTERM to the program's whole group (a child it started too);
 * a program that ignores SIGTERM is killed with its group after the grace
 * period. */
START_TEST(cancel_stops_the_process_group) {
    char spec[2048], path[96];
    /* sh (the group leader) writes its pid and a background sleep's */
    snprintf(spec, sizeof spec,
             "{\"name\":\"cmd-cancel\",\"command\":{\"argv\":[\"/bin/sh\",\"-c\","
             "\"echo saved > $TRAINYARD_CHECKPOINT_DIR/state.txt; sleep 300 & echo $$ > $OUT/p.tmp; echo $! >> $OUT/p.tmp; mv $OUT/p.tmp $OUT/%s; "
             "wait\"],\"env\":{\"OUT\":\"%s\"}},\"max_restarts\":0}",
             "term", tmpdir);
    int64_t id = submit_text(spec);
    pid_t pids[2];
    ck_assert_int_eq(read_pids("term", pids, 2, 30000), 2);
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/cancel", (long long)id);
    int64_t t0 = mono_ms();
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", path, NULL, &o), 200);
    cJSON_Delete(o);
    ck_assert_msg(gone_within(pids, 2, 4000), "the program or its child still runs 4 s after cancel");
    fprintf(stderr, "check_command: cancel -> program group gone in %lld ms\n", (long long)(mono_ms() - t0));
    cJSON_Delete(expect_end(id, "cancelled", 30));
    free(wait_log(id, "worker-0", "stop: SIGTERM to the program", 10000));
    /* stopped, the chief still saved its checkpoint directory */
    free(wait_log(id, "worker-0", "checkpoint uploaded: state.txt", 10000));
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints", (long long)id);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", path, NULL, &o), 200);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(o, "checkpoints")), 1);
    cJSON_Delete(o);

    /* one that ignores SIGTERM: SIGKILL to the group after the grace period */
    snprintf(spec, sizeof spec,
             "{\"name\":\"cmd-cancel-stubborn\",\"command\":{\"argv\":[\"/bin/sh\",\"-c\","
             "\"trap '' TERM; sleep 300 & echo $$ > $OUT/p.tmp; echo $! >> $OUT/p.tmp; mv $OUT/p.tmp $OUT/%s; "
             "while :; do wait; done\"],\"env\":{\"OUT\":\"%s\"}},\"max_restarts\":0}",
             "stubborn", tmpdir);
    id = submit_text(spec);
    ck_assert_int_eq(read_pids("stubborn", pids, 2, 30000), 2);
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/cancel", (long long)id);
    t0 = mono_ms();
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", path, NULL, &o), 200);
    cJSON_Delete(o);
    ty_sleep_ms(2000);
    ck_assert_msg(kill(pids[0], 0) == 0, "the stubborn program should still run 2 s after cancel");
    ck_assert_msg(gone_within(pids, 2, 8000), "the stubborn program or its child still runs 10 s after cancel");
    int64_t ms = mono_ms() - t0;
    fprintf(stderr, "check_command: stubborn program killed %lld ms after cancel\n", (long long)ms);
    ck_assert_int_ge(ms, 4500);
    cJSON_Delete(expect_end(id, "cancelled", 30));
    free(wait_log(id, "worker-0", "SIGKILL", 10000));
}
END_TEST

/* The program's exit status is the task's; a program that cannot start
 * is 127; metric lines that are not metrics are logged and skipped;
 * working_dir is where the program starts. */
START_TEST(exit_codes_metric_lines_and_working_dir) {
    int64_t id = submit_text("{\"name\":\"cmd-exit7\",\"command\":{\"argv\":[\"/bin/sh\",\"-c\","
                             "\"echo about to fail; exit 7\"]},\"max_restarts\":0}");
    cJSON *job = expect_end(id, "failed", 60);
    expect_in(ty_str(job, "reason"), "exited with code 7", "the job's reason");
    cJSON_Delete(job);

    id = submit_text("{\"name\":\"cmd-missing\",\"command\":{\"argv\":[\"no-such-program-here\"]},\"max_restarts\":0}");
    job = expect_end(id, "failed", 60);
    expect_in(ty_str(job, "reason"), "code 127", "the job's reason");
    cJSON_Delete(job);
    char *l0 = wait_log(id, "worker-0", "command not found: no-such-program-here", 10000);
    free(l0);

    id = submit_text(
        "{\"name\":\"cmd-lines\",\"command\":{\"argv\":[\"/bin/sh\",\"-c\","
        "\"pwd; echo \\\"OMP=$OMP_NUM_THREADS LR=$LR PYU=$PYTHONUNBUFFERED RANK=$RANK WS=$WORLD_SIZE\\\"; "
        "echo to-stderr >&2; echo 'trainyard-metric {\\\"step\\\": 1, \\\"loss\\\": 0.5, \\\"seq\\\": 99}'; "
        "echo 'trainyard-metric not json'; "
        "echo 'trainyard-metric {\\\"step\\\": 2, \\\"nested\\\": {\\\"a\\\": 1}}'; "
        "echo 'trainyard-metric {\\\"kind\\\": \\\"bogus\\\"}'; "
        "echo 'trainyard-metric {\\\"step\\\": -1}'; "
        "echo 'trainyard-metric {\\\"kind\\\": \\\"epoch\\\", \\\"epoch\\\": 1, \\\"step\\\": 2, \\\"loss\\\": 0.25}'; "
        "printf 'no newline at the end'\"],"
        "\"working_dir\":\"examples\",\"env\":{\"LR\":\"0.1\"}},\"max_restarts\":0}");
    cJSON_Delete(expect_end(id, "succeeded", 60));
    l0 = wait_log(id, "worker-0", "no newline at the end\n", 10000);
    char cwd[PATH_MAX], want[PATH_MAX + 16];
    ck_assert_ptr_nonnull(getcwd(cwd, sizeof cwd));
    snprintf(want, sizeof want, "%s/examples\n", cwd);
    expect_in(l0, want, "worker-0's log (pwd)");
    expect_in(l0, "OMP=1 LR=0.1 PYU=1 RANK=0 WS=1\n", "worker-0's log (environment)");
    expect_in(l0, "to-stderr\n", "worker-0's log (stderr)");
    expect_in(l0, "metric line ignored (not JSON)", "worker-0's log");
    expect_in(l0, "metric line ignored (values must be", "worker-0's log");
    expect_in(l0, "metric line ignored (kind must be", "worker-0's log");
    expect_in(l0, "metric line ignored (step must be", "worker-0's log");
    expect_in(l0, "no newline at the end\n", "worker-0's log");
    free(l0);
    cJSON *all = metrics_all(id);
    ck_assert_int_eq(cJSON_GetArraySize(all), 2);
    const cJSON *m0 = cJSON_GetArrayItem(all, 0), *m1 = cJSON_GetArrayItem(all, 1);
    ck_assert_int_eq((int)ty_num(m0, "seq"), 1); /* the program's "seq" is not trainyard's */
    ck_assert_str_eq(ty_str(m0, "kind"), "step");
    ck_assert(ty_num(m0, "loss") == 0.5);
    ck_assert_int_eq((int)ty_num(m1, "seq"), 2);
    ck_assert_str_eq(ty_str(m1, "kind"), "epoch");
    ck_assert(ty_num(m1, "loss") == 0.25);
    cJSON_Delete(all);

    /* the program holds no descriptor of the agent's or the worker's (their
     * sockets to the server): 0, 1, 2 and the one ls reads /proc with */
    id = submit_text("{\"name\":\"cmd-fds\",\"command\":{\"argv\":[\"/bin/ls\",\"/proc/self/fd\"]},\"max_restarts\":0}");
    cJSON_Delete(expect_end(id, "succeeded", 60));
    l0 = wait_log(id, "worker-0", "the program exited", 10000);
    const char *fds = strstr(l0, "started /bin/ls");
    ck_assert_ptr_nonnull(fds);
    fds = strchr(fds, '\n') + 1;
    const char *after = fds + 8, *eol = strchr(after, '\n');
    ck_assert_msg(strncmp(fds, "0\n1\n2\n3\n", 8) == 0 && eol && memmem(after, (size_t)(eol - after), "the program exited", 18),
                  "the program's descriptors (then the worker's next line): %s", fds);
    free(l0);
}
END_TEST

/* The chief uploads a new checkpoint file while the program still runs
 * (every 10 s, once the file is 2 s old), and not again at the end when
 * it has not changed. The program watches the job's checkpoints itself,
 * with the task token from TRAINYARD_CONFIG. */
START_TEST(checkpoint_uploaded_while_running) {
    char script[400], spec[1024];
    snprintf(script, sizeof script, "%s/watch_ckpt.py", tmpdir);
    static const char py[] =
        "import json, os, sys, time, urllib.request\n"
        "cfg = json.loads(os.environ['TRAINYARD_CONFIG'])\n"
        "d = os.environ['TRAINYARD_CHECKPOINT_DIR']\n"
        "with open(d + '/.state.tmp', 'w') as f: f.write('v1')\n"
        "os.rename(d + '/.state.tmp', d + '/state.bin')  # whole, under its final name\n"
        "print('trainyard-metric ' + json.dumps({'step': 5, 'loss': 1.0}))\n"
        "url = f\"{cfg['api']}/api/v1/jobs/{cfg['job']}/checkpoints\"\n"
        "for _ in range(300):\n"
        "    req = urllib.request.Request(url, headers={'Authorization': 'Bearer ' + cfg['token']})\n"
        "    cks = json.load(urllib.request.urlopen(req))['checkpoints']\n"
        "    if cks:\n"
        "        print('seen while running: step', cks[0]['step'])\n"
        "        sys.exit(0)\n"
        "    time.sleep(0.1)\n"
        "sys.exit(5)\n";
    ck_assert_int_eq(file_write_atomic(script, py, sizeof py - 1, 0644), 0);
    snprintf(spec, sizeof spec,
             "{\"name\":\"cmd-ckpt-live\",\"command\":{\"argv\":[\"/usr/bin/python3\",\"%s\"]},"
             "\"max_restarts\":0}",
             script);
    int64_t id = submit_text(spec);
    cJSON_Delete(expect_end(id, "succeeded", 90));
    char *l0 = wait_log(id, "worker-0", "metric line(s) read", 10000);
    expect_in(l0, "seen while running: step 5", "worker-0's log");
    expect_in(l0, "checkpoint uploaded: state.bin", "worker-0's log");
    expect_in(l0, "checkpoint state.bin unchanged since it was uploaded", "worker-0's log");
    free(l0);
    char path[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints", (long long)id);
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", path, NULL, &o), 200);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(o, "checkpoints")), 1);
    cJSON_Delete(o);
}
END_TEST

/* A bad command spec is a 422 naming the field, and nothing is stored. */
START_TEST(bad_command_spec_is_422_and_stores_nothing) {
    static const char *const bad[][2] = {
        {"{\"command\":{\"argv\":[]}}", "command.argv"},
        {"{\"command\":{\"argv\":[\"x\"],\"env\":{\"RANK\":\"1\"}}}", "command.env.RANK"},
        {"{\"command\":{\"argv\":[\"x\"],\"env\":{\"TRAINYARD_CHECKPOINT_DIR\":\"/\"}}}",
         "command.env.TRAINYARD_CHECKPOINT_DIR"},
        {"{\"command\":{\"argv\":[\"x\"],\"working_dir\":\"../etc\"}}", "command.working_dir"},
        {"{\"command\":{\"argv\":[\"x\"]},\"fit\":{\"epochs\":1}}", "fit"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cJSON *o = NULL;
        long st = ty_http(srv.url, team_tok, "POST", "/api/v1/jobs", bad[i][0], &o);
        ck_assert_msg(st == 422, "%s answered %ld", bad[i][0], st);
        ty_assert_error(o, "invalid_value", bad[i][1]);
        cJSON_Delete(o);
    }
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", "/api/v1/jobs", NULL, &o), 200);
    cJSON *jobs = cJSON_GetObjectItem(o, "jobs");
    ck_assert_msg(cJSON_IsArray(jobs) && cJSON_GetArraySize(jobs) == 0, "a refused spec left a job behind");
    cJSON_Delete(o);
}
END_TEST

int main(void) {
    Suite *s = suite_create("command");
    /* one case per kind, so that CK_RUN_CASE=torch runs the PyTorch ones */
    TCase *basic = ty_tcase(s, "basic", start_up2, stop_up, 180);
    tcase_add_test(basic, bad_command_spec_is_422_and_stores_nothing);
    tcase_add_test(basic, tf_config_has_tensorflow_shape);
    tcase_add_test(basic, exit_codes_metric_lines_and_working_dir);
    tcase_add_test(basic, checkpoint_uploaded_while_running);
    TCase *stop = ty_tcase(s, "cancel", start_up2, stop_up, 120);
    tcase_add_test(stop, cancel_stops_the_process_group);
    TCase *torch = ty_tcase(s, "torch", start_up2, stop_up, 300);
    tcase_add_test(torch, ddp_two_ranks_train_and_report);
    tcase_add_test(torch, failed_rank_requeues_and_checkpoint_dir_is_restored);
    return ty_run_suite(s);
}
