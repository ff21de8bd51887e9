/* check_evaluator.c - the evaluator side-car (resources.evaluator) end to
 * end, on `trainyard up --cpu-slots 2` with real processes on loopback: a
 * train job's evaluator evaluates every epoch's checkpoint on the
 * validation split at nice 19 under SCHED_IDLE, its eval metrics in their
 * own sequence and the job's progress; an evaluator killed with -9 costs
 * the job nothing (no restart, the timeline says so); a command job's
 * evaluator sees TF_CONFIG task type evaluator with the cluster without
 * itself, and the job's checkpoints appear in its checkpoint directory.
 * docs/executors.md, "The evaluator". */
#include "testlib.h"

#include <math.h>
#include <sched.h>
#include <sys/resource.h>

static ty_proc srv;
static char team_tok[128];

static void start_up(void) {
    memset(&srv, 0, sizeof srv);
    ty_mkdtemp(srv.dir, sizeof srv.dir, "eval");
    const char *extra[] = {"--cpu-slots", "2", NULL};
    ty_server_start_args(&srv, "up", extra);
    ty_token(&srv, "token", team_tok, sizeof team_tok);
}

static void stop_up(void) {
    ty_kill(&srv, SIGTERM);
    if (getenv("E2E_KEEP")) fprintf(stderr, "eval: kept %s\n", srv.dir);
    else ty_rmrf(srv.dir);
}

/* Fashion-MNIST, 2000 examples (1800 train / 200 validation), batch 25:
 * 72 steps an epoch, a checkpoint every epoch, all kept. */
static void spec_fashion(char *out, size_t n, const char *name, int epochs) {
    snprintf(out, n,
             "{\"name\":\"%s\",\"model\":{\"layers\":["
             "{\"type\":\"flatten\",\"input_shape\":[28,28]},"
             "{\"type\":\"dense\",\"units\":64,\"activation\":\"relu\"},"
             "{\"type\":\"dense\",\"units\":10,\"activation\":\"softmax\"}]},"
             "\"compile\":{\"optimizer\":{\"type\":\"adam\",\"learning_rate\":0.001},"
             "\"loss\":\"sparse_categorical_crossentropy\",\"metrics\":[\"accuracy\"]},"
             "\"data\":{\"source\":\"fashion-mnist\",\"limit\":2000,\"validation_split\":0.1,\"seed\":7},"
             "\"fit\":{\"epochs\":%d,\"batch_size\":25},"
             "\"resources\":{\"workers\":1,\"device\":\"cpu\",\"evaluator\":true},"
             "\"checkpoint\":{\"every_epochs\":1,\"keep\":100},\"max_restarts\":2}",
             name, epochs);
}

static char *json_text(const cJSON *o) {
    char *s = cJSON_PrintUnformatted(o);
    ck_assert_ptr_nonnull(s);
    return s;
}

static void job_state(int64_t id, char *state, size_t n, int *attempt) {
    cJSON *o = ty_job_get(srv.url, team_tok, id);
    snprintf(state, n, "%s", ty_str(o, "state"));
    if (attempt) *attempt = (int)ty_num(o, "attempt");
    cJSON_Delete(o);
}

static void wait_state(int64_t id, const char *want, int timeout_s, char *state, size_t n) {
    int64_t end = mono_ms() + (int64_t)timeout_s * 1000;
    while (mono_ms() < end) {
        job_state(id, state, n, NULL);
        if (strcmp(state, want) == 0 || strcmp(state, "succeeded") == 0 || strcmp(state, "failed") == 0 ||
            strcmp(state, "cancelled") == 0)
            return;
        ty_sleep_ms(100);
    }
}

/* GET /jobs/{id}/metrics?kind=eval (every page): the eval metrics. */
static cJSON *eval_metrics(int64_t id, int64_t *last_seq) {
    char path[128];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/metrics?kind=eval&since=0&limit=10000", (long long)id);
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", path, NULL, &o), 200);
    if (last_seq) *last_seq = (int64_t)ty_num(o, "last_seq");
    cJSON *arr = cJSON_DetachItemFromObject(o, "metrics");
    cJSON_Delete(o);
    ck_assert(cJSON_IsArray(arr));
    return arr;
}

/* Waits (120 s at most) for the job's first eval metric. */
static void wait_first_eval(int64_t id) {
    int64_t end = mono_ms() + 120000;
    int n = 0;
    while (mono_ms() < end && n == 0) {
        cJSON *ems = eval_metrics(id, NULL);
        n = cJSON_GetArraySize(ems);
        cJSON_Delete(ems);
        if (!n) ty_sleep_ms(100);
    }
    ck_assert_msg(n > 0, "no eval metric within 120 s");
}

/* The worker process of task `name` ("evaluator-0") under the agent of
 * `trainyard up`, from the TRAINYARD_TASK_NAME its agent gave it; 0: none. */
static pid_t task_pid(const char *name) {
    pid_t ag[2], wk[8];
    if (ty_children_named(srv.pid, "agent", ag, 2) != 1) return 0;
    int n = ty_children_named(ag[0], "worker", wk, 8);
    char want[96];
    snprintf(want, sizeof want, "TRAINYARD_TASK_NAME=%s", name);
    for (int i = 0; i < n; i++) {
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/environ", (int)wk[i]);
        size_t len = 0;
        char *env = file_read_all(path, 1 << 20, &len);
        int yes = 0;
        for (size_t off = 0; env && off < len; off += strlen(env + off) + 1)
            if (strcmp(env + off, want) == 0) yes = 1;
        free(env);
        if (yes) return wk[i];
    }
    return 0;
}

static char *events_text(int64_t id) {
    char path[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/events?limit=1000", (long long)id);
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", path, NULL, &o), 200);
    char *s = json_text(o);
    cJSON_Delete(o);
    return s;
}

/* ---------------------------------------------------------------- tests */

START_TEST(evaluator_evaluates_each_checkpoint) {
    char spec[2048], state[32];
    spec_fashion(spec, sizeof spec, "eval-each", 4);
    int64_t id = ty_submit(srv.url, team_tok, spec);
    /* the evaluator runs beside the worker, at nice 19 under SCHED_IDLE */
    pid_t ev = 0;
    for (int i = 0; i < 600 && !ev; i++) {
        ev = task_pid("evaluator-0");
        if (!ev) ty_sleep_ms(100);
    }
    ck_assert_msg(ev > 0, "no evaluator process within 60 s");
    int policy = sched_getscheduler(ev);
    errno = 0;
    int prio = getpriority(PRIO_PROCESS, (id_t)ev);
    if (kill(ev, 0) == 0) {
        ck_assert_msg(policy == SCHED_IDLE, "the evaluator's policy is %d, not SCHED_IDLE", policy);
        ck_assert_int_eq(prio, 19);
    }
    /* Every checkpoint the server held while the job ran (its list, read
     * until it succeeded and once after): once the job has ended and its
     * tasks have exited, the housekeeping pass keeps only the newest. */
    char path[128];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/checkpoints", (long long)id);
    cJSON *cks = cJSON_CreateArray();
    int64_t end = mono_ms() + 180000;
    for (int last = 0; !last && mono_ms() < end;) {
        job_state(id, state, sizeof state, NULL);
        last = strcmp(state, "succeeded") == 0 || strcmp(state, "failed") == 0 || strcmp(state, "cancelled") == 0;
        cJSON *cl = NULL;
        ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", path, NULL, &cl), 200);
        const cJSON *c, *k;
        cJSON_ArrayForEach(c, cJSON_GetObjectItem(cl, "checkpoints")) {
            int known = 0;
            cJSON_ArrayForEach(k, cks) known |= ty_num(k, "id") == ty_num(c, "id");
            if (!known) cJSON_AddItemToArray(cks, cJSON_Duplicate(c, 1));
        }
        cJSON_Delete(cl);
        if (!last) ty_sleep_ms(100);
    }
    ck_assert_str_eq(state, "succeeded");

    /* one eval metric per checkpoint that reached the server (one per
     * epoch), in the evaluator's own sequence, with the checkpoint's id,
     * step and epoch */
    int64_t last_seq = 0;
    cJSON *ems = eval_metrics(id, &last_seq);
    char *etxt = json_text(ems);
    int seen[5] = {0}, n = 0;
    const cJSON *m;
    double last_acc = -1;
    cJSON_ArrayForEach(m, ems) {
        n++;
        ck_assert_int_eq((int64_t)ty_num(m, "seq"), n);
        ck_assert_str_eq(ty_str(m, "kind"), "eval");
        ck_assert_str_eq(ty_str(m, "split"), "validation");
        ck_assert_int_eq((int)ty_num(m, "eval_examples"), 200);
        double acc = ty_num(m, "eval_accuracy");
        ck_assert_msg(acc >= 0 && acc <= 1 && ty_num(m, "eval_loss") > 0, "%s", etxt);
        const cJSON *k, *match = NULL;
        cJSON_ArrayForEach(k, cks) if (ty_num(k, "id") == ty_num(m, "checkpoint")) match = k;
        ck_assert_msg(match != NULL, "eval of checkpoint %.0f, not listed", ty_num(m, "checkpoint"));
        ck_assert_int_eq((long)ty_num(match, "step"), (long)ty_num(m, "step"));
        ck_assert_int_eq((long)ty_num(match, "epoch"), (long)ty_num(m, "epoch"));
        int e = (int)ty_num(m, "epoch");
        ck_assert_msg(e >= 1 && e <= 4, "%s", etxt);
        ck_assert_msg(!seen[e], "epoch %d evaluated twice: %s", e, etxt);
        seen[e] = 1;
        ck_assert_int_eq((long)ty_num(m, "step"), 72L * e);
        if (e == 4) last_acc = acc;
    }
    /* every checkpoint the server holds was evaluated, the final one among
     * them; one the worker's sender replaced by a newer one before it was
     * sent (an epoch shorter than a PUT: executor/report.c) never reached
     * the server, so there was nothing to evaluate */
    const cJSON *k;
    cJSON_ArrayForEach(k, cks) {
        int e = (int)ty_num(k, "epoch");
        ck_assert_msg(e >= 1 && e <= 4 && seen[e], "the checkpoint of epoch %d was not evaluated: %s", e, etxt);
    }
    ck_assert_msg(seen[4], "the final checkpoint (epoch 4) was not evaluated: %s", etxt);
    ck_assert_int_eq(last_seq, n);
    ck_assert_msg(last_acc > 0.6, "eval accuracy of the final checkpoint %.3f", last_acc);
    free(etxt);
    cJSON_Delete(cks);

    /* the chief's sequence is its own: 1..N, no eval metric in it; and the
     * evaluator, loading each epoch's checkpoint, finds the loss and
     * accuracy the chief measured on the same validation split at that
     * epoch's end (the same weights: no dropout in this model) */
    cJSON *all = ty_metrics_all(srv.url, team_tok, id);
    int i = 0, compared = 0;
    cJSON_ArrayForEach(m, all) {
        i++;
        ck_assert_int_eq((int64_t)ty_num(m, "seq"), i);
        ck_assert_str_ne(ty_str(m, "kind"), "eval");
        if (strcmp(ty_str(m, "kind"), "epoch") != 0) continue;
        const cJSON *x;
        cJSON_ArrayForEach(x, ems) {
            if (ty_num(x, "epoch") != ty_num(m, "epoch")) continue;
            ck_assert_msg(fabs(ty_num(x, "eval_loss") - ty_num(m, "val_loss")) < 1e-4 &&
                              fabs(ty_num(x, "eval_accuracy") - ty_num(m, "val_accuracy")) < 1e-9,
                          "epoch %.0f: eval %.6f/%.4f, the chief's validation %.6f/%.4f", ty_num(m, "epoch"),
                          ty_num(x, "eval_loss"), ty_num(x, "eval_accuracy"), ty_num(m, "val_loss"),
                          ty_num(m, "val_accuracy"));
            compared++;
        }
    }
    ck_assert_int_gt(i, 4);
    ck_assert_int_eq(compared, n);
    cJSON_Delete(all);
    cJSON_Delete(ems);

    /* the job's progress carries the newest eval; its tasks list the evaluator */
    cJSON *j = ty_job_get(srv.url, team_tok, id);
    const cJSON *pe = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "progress"), "eval");
    ck_assert_msg(cJSON_IsObject(pe) && ty_num(pe, "epoch") == 4, "progress.eval: %s",
                  pe ? cJSON_PrintUnformatted(pe) : "absent");
    int found = 0;
    cJSON_ArrayForEach(m, cJSON_GetObjectItem(j, "tasks")) {
        if (strcmp(ty_str(m, "name"), "evaluator-0") != 0) continue;
        found = 1;
        ck_assert_str_eq(ty_str(m, "type"), "evaluator");
        ck_assert_str_eq(ty_str(m, "state"), "exited");
        ck_assert_int_eq((int)ty_num(m, "exit_code"), 0);
    }
    ck_assert_msg(found, "no evaluator-0 in the job's tasks");
    cJSON_Delete(j);
    char *logs = ty_task_log(srv.url, team_tok, id, "evaluator-0");
    ck_assert_msg(strstr(logs, "evaluating each new checkpoint on 200 validation examples") != NULL, "%.1500s", logs);
    ck_assert_msg(strstr(logs, "done: the final checkpoint is evaluated") != NULL, "%.1500s", logs);
    free(logs);
    char *ev_txt = events_text(id);
    ck_assert_msg(strstr(ev_txt, "evaluator placed on") != NULL, "%.2000s", ev_txt);
    ck_assert_msg(strstr(ev_txt, "evaluator failed") == NULL, "%.2000s", ev_txt);
    free(ev_txt);
}
END_TEST

/* long enough that the evaluator is still at work after its first eval */
#define KILL_EPOCHS 40

START_TEST(evaluator_killed_costs_the_job_nothing) {
    char spec[2048], state[32];
    spec_fashion(spec, sizeof spec, "eval-kill", KILL_EPOCHS);
    int64_t id = ty_submit(srv.url, team_tok, spec);
    /* once it has evaluated a checkpoint, kill -9 the evaluator */
    wait_first_eval(id);
    pid_t ev = task_pid("evaluator-0");
    ck_assert_int_gt(ev, 0);
    ck_assert_int_eq(kill(ev, SIGKILL), 0);
    wait_state(id, "succeeded", 180, state, sizeof state);
    int attempt = 0;
    job_state(id, state, sizeof state, &attempt);
    ck_assert_str_eq(state, "succeeded");
    ck_assert_int_eq(attempt, 1); /* no restart: the gang never stopped */
    char *ev_txt = events_text(id);
    ck_assert_msg(strstr(ev_txt, "evaluator failed: evaluator-0 was killed by signal 9") != NULL, "%.3000s", ev_txt);
    ck_assert_msg(strstr(ev_txt, "requeued") == NULL, "%.3000s", ev_txt);
    free(ev_txt);
    /* the workers trained to the end: every epoch reported once */
    cJSON *all = ty_metrics_all(srv.url, team_tok, id);
    int epochs = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, all) if (strcmp(ty_str(m, "kind"), "epoch") == 0) epochs++;
    ck_assert_int_eq(epochs, KILL_EPOCHS);
    cJSON_Delete(all);
}
END_TEST

/* A cancel stops the evaluator with the workers, at once. */
START_TEST(cancel_stops_the_evaluator) {
    char spec[2048], state[32];
    spec_fashion(spec, sizeof spec, "eval-cancel", 3000);
    int64_t id = ty_submit(srv.url, team_tok, spec);
    wait_first_eval(id);
    pid_t ev = task_pid("evaluator-0"), wk = task_pid("worker-0");
    ck_assert_int_gt(ev, 0);
    ck_assert_int_gt(wk, 0);
    char path[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/cancel", (long long)id);
    cJSON *o = NULL;
    int64_t t0 = mono_ms();
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", path, NULL, &o), 200);
    cJSON_Delete(o);
    while (mono_ms() - t0 < 8000 && (kill(ev, 0) == 0 || kill(wk, 0) == 0)) ty_sleep_ms(50);
    ck_assert_msg(kill(ev, 0) < 0, "the evaluator still runs 8 s after the cancel");
    ck_assert_msg(kill(wk, 0) < 0, "the worker still runs 8 s after the cancel");
    fprintf(stderr, "eval: cancel -> evaluator and worker gone: %lld ms\n", (long long)(mono_ms() - t0));
    job_state(id, state, sizeof state, NULL);
    ck_assert_str_eq(state, "cancelled");
    char *ev_txt = events_text(id);
    ck_assert_msg(strstr(ev_txt, "evaluator failed") == NULL, "%.3000s", ev_txt);
    free(ev_txt);
}
END_TEST

/* A preemption stops the evaluator with the workers (no "evaluator failed"),
 * and the next attempt gets an evaluator of its own that evaluates again. */
START_TEST(preemption_stops_and_replaces_the_evaluator) {
    char spec[2200], base[2048], state[32];
    spec_fashion(base, sizeof base, "eval-preempt", 3000);
    ck_assert_int_eq(base[0], '{');
    snprintf(spec, sizeof spec, "{\"preemptible\":true,\"priority\":10,%s", base + 1);
    int64_t id = ty_submit(srv.url, team_tok, spec);
    wait_first_eval(id);
    pid_t ev1 = task_pid("evaluator-0");
    ck_assert_int_gt(ev1, 0);
    /* a job of priority 90 that needs both slots preempts it */
    int64_t hi = ty_submit(srv.url, team_tok,
                           "{\"name\":\"urgent\",\"command\":{\"argv\":[\"/bin/sleep\",\"3\"]},"
                           "\"strategy\":{\"type\":\"multi_worker_mirrored\"},\"resources\":{\"workers\":2},"
                           "\"priority\":90,\"max_runtime_s\":60}");
    int64_t t0 = mono_ms();
    while (mono_ms() - t0 < 30000 && kill(ev1, 0) == 0) ty_sleep_ms(50);
    ck_assert_msg(kill(ev1, 0) < 0, "the evaluator still runs 30 s after the preemption");
    wait_state(hi, "succeeded", 90, state, sizeof state);
    ck_assert_str_eq(state, "succeeded");
    /* attempt 2 runs with an evaluator of its own, which evaluates again */
    int64_t end = mono_ms() + 120000;
    pid_t ev2 = 0;
    int attempt = 0;
    while (mono_ms() < end && !(ev2 > 0 && ev2 != ev1 && attempt == 2)) {
        job_state(id, state, sizeof state, &attempt);
        ev2 = task_pid("evaluator-0");
        ty_sleep_ms(100);
    }
    ck_assert_msg(ev2 > 0 && ev2 != ev1 && attempt == 2, "attempt %d, evaluator %d (was %d)", attempt, (int)ev2,
                  (int)ev1);
    int64_t seq1 = 0, seq2 = 0;
    cJSON_Delete(eval_metrics(id, &seq1));
    end = mono_ms() + 120000;
    while (mono_ms() < end && seq2 <= seq1) {
        cJSON_Delete(eval_metrics(id, &seq2));
        if (seq2 <= seq1) ty_sleep_ms(200);
    }
    ck_assert_msg(seq2 > seq1, "the second attempt's evaluator posted nothing");
    char *ev_txt = events_text(id);
    ck_assert_msg(strstr(ev_txt, "preempted for job") != NULL, "%.3000s", ev_txt);
    ck_assert_msg(strstr(ev_txt, "evaluator failed") == NULL, "%.3000s", ev_txt);
    free(ev_txt);
    char path[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/cancel", (long long)id);
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", path, NULL, &o), 200);
    cJSON_Delete(o);
}
END_TEST

/* The same program in every task: the evaluator (by its TF_CONFIG) prints
 * its environment and waits for the job's checkpoint to appear in its
 * directory; worker 0 writes that checkpoint and stays until the
 * evaluator said it saw it (the chief's worker uploads it within ~12 s). */
static const char CMD_SCRIPT[] =
    "case \"$TF_CONFIG\" in\n"
    "*'\"type\":\"evaluator\"'*)\n"
    "  echo \"TF_CONFIG=$TF_CONFIG\"; echo \"RANK=${RANK-unset}\"\n"
    "  echo \"CKDIR=${TRAINYARD_CHECKPOINT_DIR:+set}\"\n"
    "  i=0; while [ ! -f \"$TRAINYARD_CHECKPOINT_DIR/model.txt\" ] && [ $i -lt 900 ]; do sleep 0.1; i=$((i+1)); done\n"
    "  echo \"evaluator saw: $(cat \"$TRAINYARD_CHECKPOINT_DIR/model.txt\")\";;\n"
    "*)\n"
    "  printf weights-1 > \"$TRAINYARD_CHECKPOINT_DIR/.tmp\" && mv \"$TRAINYARD_CHECKPOINT_DIR/.tmp\" "
    "\"$TRAINYARD_CHECKPOINT_DIR/model.txt\"\n"
    "  sleep 25;;\n"
    "esac\n";

START_TEST(command_evaluator_sees_tf_config) {
    cJSON *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "name", "eval-command");
    cJSON *cmd = cJSON_AddObjectToObject(s, "command");
    const char *argv[] = {"/bin/sh", "-c", CMD_SCRIPT};
    cJSON_AddItemToObject(cmd, "argv", cJSON_CreateStringArray(argv, 3));
    cJSON *res = cJSON_AddObjectToObject(s, "resources");
    cJSON_AddNumberToObject(res, "workers", 1);
    cJSON_AddBoolToObject(res, "evaluator", 1);
    cJSON_AddNumberToObject(s, "max_restarts", 0);
    char *spec = json_text(s);
    cJSON_Delete(s);
    int64_t id = ty_submit(srv.url, team_tok, spec);
    free(spec);
    /* the normalized spec keeps the field */
    cJSON *j = ty_job_get(srv.url, team_tok, id);
    ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "spec"), "resources"),
                                               "evaluator")));
    cJSON_Delete(j);
    char state[32];
    wait_state(id, "succeeded", 120, state, sizeof state);
    char *logs = ty_task_log(srv.url, team_tok, id, "evaluator-0");
    ck_assert_msg(strcmp(state, "succeeded") == 0, "%s; evaluator-0: %.2000s", state, logs);
    /* TF_CONFIG: task evaluator 0, the cluster of the workers without it */
    const char *tf = strstr(logs, "TF_CONFIG=");
    ck_assert_msg(tf != NULL, "%.2000s", logs);
    char line[1024];
    size_t len = strcspn(tf + 10, "\n");
    ck_assert_int_lt(len, sizeof line);
    memcpy(line, tf + 10, len);
    line[len] = '\0';
    cJSON *tc = cJSON_Parse(line);
    ck_assert_msg(tc != NULL, "TF_CONFIG is not JSON: %s", line);
    const cJSON *task = cJSON_GetObjectItem(tc, "task"), *cluster = cJSON_GetObjectItem(tc, "cluster");
    ck_assert_str_eq(ty_str(task, "type"), "evaluator");
    ck_assert_int_eq((int)ty_num(task, "index"), 0);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(cluster, "worker")), 1);
    ck_assert_int_eq(cJSON_GetArraySize(cluster), 1); /* "worker" only: no "evaluator", no "chief" */
    cJSON_Delete(tc);
    ck_assert_msg(strstr(logs, "RANK=unset") != NULL, "%.2000s", logs);
    ck_assert_msg(strstr(logs, "CKDIR=set") != NULL, "%.2000s", logs);
    ck_assert_msg(strstr(logs, "evaluator saw: weights-1") != NULL, "%.2000s", logs);
    free(logs);
}
END_TEST

int main(void) {
    Suite *s = suite_create("evaluator");
    TCase *tc = ty_tcase(s, "up", start_up, stop_up, 300);
    tcase_add_test(tc, evaluator_evaluates_each_checkpoint);
    tcase_add_test(tc, evaluator_killed_costs_the_job_nothing);
    tcase_add_test(tc, cancel_stops_the_evaluator);
    tcase_add_test(tc, preemption_stops_and_replaces_the_evaluator);
    tcase_add_test(tc, command_evaluator_sees_tf_config);
    return ty_run_suite(s);
}
