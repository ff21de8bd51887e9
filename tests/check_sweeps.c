/* check_sweeps.c - hyperparameter sweeps end to end on the real binary:
 * `trainyard up --cpu-slots 2` (or a server and an agent, for the restart),
 * trials trained for real on small slices of Fashion-MNIST.
 *
 * - grid: 4 trials (learning rate x batch size), at most max_concurrent
 *   live at once, each trial's values in its job's spec, the metric of
 *   each trial and the best as the jobs' metrics say;
 * - a parameter value that makes an invalid spec: 422 naming it, nothing stored;
 * - ASHA: promotions go on in the trial's process when they are decided at
 *   its rung's end, else resume the same job from its checkpoint (epochs go
 *   on, none repeated either way), the others end stopped early;
 * - ASHA one trial at a time: the better trial ranks first at its rung's
 *   end and trains on in the same process (one attempt), to the same
 *   metrics as the same spec trained straight through;
 * - cancel mid-sweep;
 * - a command job's grid reading its value from the environment;
 * - the server killed with SIGKILL mid-sweep and restarted on the same data:
 *   the sweep completes, every trial has its result, no rung trained twice;
 * - Idempotency-Key (a server alone: the trials stay queued): the same key
 *   and request again answer 200 with the first sweep, marked
 *   Idempotent-Replayed, and make none; another request with it is 422, a
 *   malformed key 400, both making nothing; another team's same key is its
 *   own; two requests racing with one key make one sweep. */
#include "testlib.h"

#include <curl/curl.h>
#include <math.h>
#include <pthread.h>

#include "stack_fixture.h"

static void start_up(void) { stack_up("sweeps"); }
static void start_server_agent(void) { stack_server_agent("sweeps"); }
static void stop_all(void) { stack_stop(); }

/* A small training job: epochs of a 1,200-example slice, a second or two each. */
#define JOB(EPOCHS)                                                                                           \
    "{\"name\":\"sw\",\"model\":{\"layers\":[{\"type\":\"flatten\",\"input_shape\":[28,28]},"               \
    "{\"type\":\"dense\",\"units\":32,\"activation\":\"relu\"},{\"type\":\"dense\",\"units\":10,"             \
    "\"activation\":\"softmax\"}]},\"compile\":{\"optimizer\":{\"type\":\"adam\",\"learning_rate\":0.001},"   \
    "\"loss\":\"sparse_categorical_crossentropy\",\"metrics\":[\"accuracy\"]},"                              \
    "\"data\":{\"source\":\"fashion-mnist\",\"limit\":1200,\"validation_split\":0.25,\"seed\":1},"           \
    "\"fit\":{\"epochs\":" #EPOCHS ",\"batch_size\":64},\"max_runtime_s\":300}"

static cJSON *sweep_get(int64_t id) {
    char path[64];
    snprintf(path, sizeof path, "/api/v1/sweeps/%lld", (long long)id);
    cJSON *o = NULL;
    long st = ty_http(srv.url, team_tok, "GET", path, NULL, &o);
    ck_assert_msg(st == 200, "GET %s answered %ld", path, st);
    return o;
}

static int64_t sweep_submit(const char *body) {
    cJSON *o = NULL;
    long st = ty_http(srv.url, team_tok, "POST", "/api/v1/sweeps", body, &o);
    char *t = cJSON_PrintUnformatted(o);
    ck_assert_msg(st == 201, "POST /sweeps answered %ld: %s", st, t);
    free(t);
    int64_t id = (int64_t)ty_num(o, "id");
    ck_assert_str_eq(ty_str(o, "state"), "running");
    cJSON_Delete(o);
    return id;
}

/* Polls the sweep until it ends (or timeout_s): its last answer. Counts,
 * on every poll, the trials running and the sweep's jobs not ended (both
 * at most max_live). */
static cJSON *sweep_wait(int64_t id, int timeout_s, int max_live) {
    for (int i = 0; i < timeout_s * 5; i++) {
        cJSON *o = sweep_get(id);
        int live = 0;
        cJSON *t;
        cJSON_ArrayForEach(t, cJSON_GetObjectItem(o, "trials")) live += strcmp(ty_str(t, "state"), "running") == 0;
        if (max_live) ck_assert_msg(live <= max_live, "%d trials running at once (max_concurrent %d)", live, max_live);
        if (strcmp(ty_str(o, "state"), "running") != 0) return o;
        cJSON_Delete(o);
        ty_sleep_ms(200);
    }
    ck_abort_msg("sweep %lld did not end in %d s; see %s", (long long)id, timeout_s, srv.log);
    return NULL;
}

/* The job's epoch metrics: epochs into ep (in seq order, at most max), the
 * best value of key into *best (mode max or min). Returns their number. */
static int job_epochs(int64_t job, const char *key, int mode_max, int *ep, int max, double *best) {
    cJSON *all = ty_metrics_all(srv.url, team_tok, job);
    int n = 0;
    *best = NAN;
    cJSON *m;
    cJSON_ArrayForEach(m, all) {
        double v = ty_num(m, key);
        const cJSON *vv = cJSON_GetObjectItem(m, key);
        if (cJSON_IsNumber(vv) && (isnan(*best) || (mode_max ? v > *best : v < *best))) *best = v;
        if (strcmp(ty_str(m, "kind"), "epoch") == 0 && n < max) ep[n++] = (int)ty_num(m, "epoch");
    }
    cJSON_Delete(all);
    return n;
}

/* `trainyard ARGS` against the server, as the team: its stdout (the
 * caller frees) and exit status. */
static char *cli_run(const char *args, int *status) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' %s --url '%s' --token '%s'", ty_bin(), args, srv.url, team_tok);
    FILE *f = popen(cmd, "r");
    ck_assert_ptr_nonnull(f);
    buf b;
    buf_init(&b, 1 << 20);
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) ck_assert_int_eq(buf_append(&b, chunk, n), 0);
    int st = pclose(f);
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    char *out = buf_detach(&b, NULL);
    return out ? out : xstrdup("");
}

/* ---------------------------------------------------------------- grid */

START_TEST(grid_end_to_end) {
    int64_t id = sweep_submit("{\"name\":\"lr-bs\",\"job\":" JOB(1) ",\"search\":{\"method\":\"grid\","
                              "\"parameters\":{\"compile.optimizer.learning_rate\":{\"values\":[0.003,0.0005]},"
                              "\"fit.batch_size\":{\"values\":[32,128]}},"
                              "\"metric\":\"val_accuracy\",\"mode\":\"max\",\"max_concurrent\":2}}");
    cJSON *o = sweep_wait(id, 240, 2);
    ck_assert_str_eq(ty_str(o, "state"), "succeeded");
    cJSON *trials = cJSON_GetObjectItem(o, "trials");
    ck_assert_int_eq(cJSON_GetArraySize(trials), 4);
    const double lrs[] = {0.003, 0.003, 0.0005, 0.0005};
    const int bss[] = {32, 128, 32, 128};
    double best = -1;
    int best_trial = -1;
    char created[4][32], finished[4][32];
    for (int i = 0; i < 4; i++) {
        cJSON *t = cJSON_GetArrayItem(trials, i);
        ck_assert_int_eq((int)ty_num(t, "trial"), i);
        ck_assert_str_eq(ty_str(t, "state"), "succeeded");
        ck_assert_int_eq((int)ty_num(t, "epochs"), 1);
        int64_t job = (int64_t)ty_num(t, "job_id");
        ck_assert_int_gt(job, 0);
        /* the trial's values are in its job's spec, and the job names its sweep and trial */
        cJSON *j = ty_job_get(srv.url, team_tok, job);
        ck_assert_str_eq(ty_str(j, "state"), "succeeded");
        ck_assert_int_eq((int)ty_num(j, "sweep"), (int)id);
        ck_assert_int_eq((int)ty_num(j, "trial"), i);
        char name[32];
        snprintf(name, sizeof name, "lr-bs-t%d", i);
        ck_assert_str_eq(ty_str(j, "name"), name);
        cJSON *spec = cJSON_GetObjectItem(j, "spec");
        double lr = ty_num(cJSON_GetObjectItem(cJSON_GetObjectItem(spec, "compile"), "optimizer"), "learning_rate");
        ck_assert_msg(fabs(lr - lrs[i]) < 1e-12, "trial %d: learning_rate %g in its spec, %g expected", i, lr, lrs[i]);
        ck_assert_int_eq((int)ty_num(cJSON_GetObjectItem(spec, "fit"), "batch_size"), bss[i]);
        snprintf(created[i], sizeof created[i], "%s", ty_str(j, "created_at"));
        snprintf(finished[i], sizeof finished[i], "%s", ty_str(j, "finished_at"));
        cJSON_Delete(j);
        cJSON *p = cJSON_GetObjectItem(t, "params");
        ck_assert(fabs(ty_num(p, "compile.optimizer.learning_rate") - lrs[i]) < 1e-12);
        ck_assert_int_eq((int)ty_num(p, "fit.batch_size"), bss[i]);
        /* the trial's metric: the best val_accuracy among its job's metrics */
        int ep[8];
        double v;
        ck_assert_int_eq(job_epochs(job, "val_accuracy", 1, ep, 8, &v), 1);
        ck_assert_msg(fabs(ty_num(t, "metric") - v) < 1e-9, "trial %d: metric %g, its job's best %g", i,
                      ty_num(t, "metric"), v);
        if (v > best) {
            best = v;
            best_trial = i;
        }
    }
    /* never more than 2 trial jobs alive at once: each job created before the
     * third of those alive with it had finished (ISO times sort as text) */
    for (int i = 0; i < 4; i++) {
        int alive = 0;
        for (int k = 0; k < 4; k++)
            if (strcmp(created[k], created[i]) <= 0 && strcmp(finished[k], created[i]) > 0) alive++;
        ck_assert_msg(alive <= 2, "%d trial jobs alive when trial %d was submitted", alive, i);
    }
    cJSON *b = cJSON_GetObjectItem(o, "best");
    ck_assert(cJSON_IsObject(b));
    ck_assert_int_eq((int)ty_num(b, "trial"), best_trial);
    ck_assert(fabs(ty_num(b, "metric") - best) < 1e-9);
    ck_assert_msg(ty_num(b, "checkpoint") > 0, "the best trial's checkpoint is named");
    cJSON_Delete(o);
    /* the CLI's table: best first */
    char args[64];
    int st;
    snprintf(args, sizeof args, "sweep-status %lld", (long long)id);
    char *out = cli_run(args, &st);
    ck_assert_int_eq(st, 0);
    const char *hdr = strstr(out, "TRIAL ");
    ck_assert_msg(hdr, "no table in: %s", out);
    const char *row = strchr(hdr, '\n');
    ck_assert_msg(row && atoi(row + 1) == best_trial, "the best trial %d is not first:\n%s", best_trial, out);
    ck_assert_msg(strstr(out, "best: trial "), "no best line: %s", out);
    free(out);
    out = cli_run("sweeps", &st);
    ck_assert_int_eq(st, 0);
    ck_assert_msg(strstr(out, "lr-bs") && strstr(out, "succeeded"), "sweeps: %s", out);
    free(out);
    /* the team's list has it; another team sees none of it */
    o = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", "/api/v1/sweeps", NULL, &o), 200);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(o, "sweeps")), 1);
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "POST", "/api/v1/teams", "{\"name\":\"other\"}", &o), 201);
    char other[128];
    snprintf(other, sizeof other, "%s", ty_str(o, "token"));
    cJSON_Delete(o);
    char path[64];
    snprintf(path, sizeof path, "/api/v1/sweeps/%lld", (long long)id);
    ck_assert_int_eq(ty_http(srv.url, other, "GET", path, NULL, &o), 404);
    ty_assert_error(o, "not_found", NULL);
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, other, "GET", "/api/v1/sweeps", NULL, &o), 200);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(o, "sweeps")), 0);
    cJSON_Delete(o);
}
END_TEST

/* ---------------------------------------------------------------- refused */

START_TEST(bad_parameter_refused) {
    cJSON *o = NULL;
    long st = ty_http(srv.url, team_tok, "POST", "/api/v1/sweeps",
                      "{\"name\":\"bad\",\"job\":" JOB(1) ",\"search\":{\"method\":\"grid\","
                      "\"parameters\":{\"model.layers[1].units\":{\"values\":[16,0]}},"
                      "\"metric\":\"val_loss\",\"mode\":\"min\"}}",
                      &o);
    char *t = cJSON_PrintUnformatted(o);
    ck_assert_msg(st == 422, "answered %ld: %s", st, t);
    free(t);
    ty_assert_error(o, "invalid_value", "search.parameters.model.layers[1].units");
    const char *msg = ty_str(cJSON_GetObjectItem(o, "error"), "message");
    ck_assert_msg(strstr(msg, "= 0") && strstr(msg, "trial 1"), "the message names the trial and value: %s", msg);
    cJSON_Delete(o);
    /* a search error names its search.* field */
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", "/api/v1/sweeps",
                             "{\"job\":" JOB(1) ",\"search\":{\"method\":\"grid\",\"parameters\":{\"fit.batch_size\":"
                             "{\"values\":[32]}},\"metric\":\"val_loss\"}}", &o), 422);
    ty_assert_error(o, "missing_field", "search.mode");
    cJSON_Delete(o);
    /* asha with a command job */
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", "/api/v1/sweeps",
                             "{\"job\":{\"command\":{\"argv\":[\"true\"]}},\"search\":{\"method\":\"asha\","
                             "\"parameters\":{\"command.env.LR\":{\"values\":[1,2]}},\"metric\":\"val_loss\","
                             "\"mode\":\"min\",\"max_epochs\":4}}", &o), 422);
    ty_assert_error(o, "unsupported", "search.method");
    cJSON_Delete(o);
    /* nothing stored: no sweep, no job */
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", "/api/v1/sweeps", NULL, &o), 200);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(o, "sweeps")), 0);
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", "/api/v1/jobs", NULL, &o), 200);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(o, "jobs")), 0);
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", "/api/v1/sweeps/1", NULL, &o), 404);
    cJSON_Delete(o);
}
END_TEST

/* ---------------------------------------------------------------- ASHA */

/* The times needle occurs in text. */
static int count_of(const char *text, const char *needle) {
    int n = 0;
    for (const char *p = strstr(text, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

/* Checks a finished ASHA sweep: rungs of 1, 2, 4 epochs; promoted trials
 * trained on without repeating an epoch, in their process (promoted at
 * their rung's end) or from their checkpoint (a new attempt); the rest
 * stopped early. Returns the number of promotions. */
static int check_asha(cJSON *o, int n_trials) {
    static const int rung_epochs[] = {1, 2, 4};
    cJSON *trials = cJSON_GetObjectItem(o, "trials");
    ck_assert_int_eq(cJSON_GetArraySize(trials), n_trials);
    int promoted = 0, stopped = 0;
    cJSON *t;
    cJSON_ArrayForEach(t, trials) {
        int rung = (int)ty_num(t, "rung");
        int64_t job = (int64_t)ty_num(t, "job_id");
        const char *state = ty_str(t, "state");
        ck_assert_msg(rung >= 0 && rung <= 2, "rung %d", rung);
        ck_assert_int_eq((int)ty_num(t, "epochs"), rung_epochs[rung]);
        int ep[16];
        double best;
        int n = job_epochs(job, "val_loss", 0, ep, 16, &best);
        /* epochs 1..r_k exactly once each, in order: a promotion trains on, never again */
        ck_assert_msg(n == rung_epochs[rung], "trial %d: %d epoch rows for rung %d", (int)ty_num(t, "trial"), n, rung);
        for (int i = 0; i < n; i++) ck_assert_int_eq(ep[i], i + 1);
        cJSON *j = ty_job_get(srv.url, team_tok, job);
        ck_assert_int_eq((int)ty_num(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "spec"), "fit"), "epochs"),
                         rung_epochs[rung]);
        if (rung > 0) {
            promoted++;
            /* the same job throughout: each promotion either went on in its
             * process, asked at its rung's end, or was a new attempt resumed
             * from its checkpoint */
            int attempt = (int)ty_num(j, "attempt");
            /* the output of an attempt that ran while the server was down
             * reaches it when the agent's backoff ends: up to seconds after
             * the sweep did */
            char *log = NULL;
            int resumed = 0, went_on = 0;
            for (int k = 0; k < 100; k++) {
                free(log);
                log = ty_task_log(srv.url, team_tok, job, "worker-0");
                resumed = count_of(log, "resuming from the job's latest checkpoint");
                went_on = count_of(log, "it goes on in its process");
                if (resumed == attempt - 1 && resumed + went_on == rung) break;
                ty_sleep_ms(100);
            }
            ck_assert_msg(resumed == attempt - 1 && resumed + went_on == rung,
                          "trial %d at rung %d, attempt %d: %d resumed, %d went on in %s", (int)ty_num(t, "trial"),
                          rung, attempt, resumed, went_on, log);
            free(log);
        }
        if (rung < 2) {
            ck_assert_str_eq(state, "stopped");
            char want[64];
            snprintf(want, sizeof want, "stopped early at rung %d (%d epoch", rung, rung_epochs[rung]);
            ck_assert_msg(strstr(ty_str(t, "reason"), want), "reason: %s", ty_str(t, "reason"));
            stopped++;
        } else {
            ck_assert_str_eq(state, "succeeded");
        }
        cJSON_Delete(j);
    }
    ck_assert_int_ge(stopped, 1);
    return promoted;
}

#define ASHA_BODY(NAME, TRIALS)                                                                               \
    "{\"name\":\"" NAME "\",\"job\":" JOB(1) ",\"search\":{\"method\":\"asha\","                             \
    "\"parameters\":{\"compile.optimizer.learning_rate\":{\"log_uniform\":[0.0001,0.01]}},"                 \
    "\"metric\":\"val_loss\",\"mode\":\"min\",\"max_trials\":" #TRIALS ",\"max_concurrent\":2,"              \
    "\"max_epochs\":4,\"min_epochs\":1,\"reduction_factor\":2,\"seed\":7}}"

START_TEST(asha_promotes_and_stops) {
    int64_t id = sweep_submit(ASHA_BODY("asha", 4));
    cJSON *o = sweep_wait(id, 300, 2);
    ck_assert_str_eq(ty_str(o, "state"), "succeeded");
    ck_assert_int_ge(check_asha(o, 4), 1);
    cJSON_Delete(o);
}
END_TEST

/* One trial at a time, two trials: with seed 1, trial 0 draws the tiny
 * learning rate and trial 1 the good one (tests/check_sweep_logic.c
 * asserts the draw); rungs of 1 and 2 epochs, η 2. Trial 0 is the only
 * result at rung 0 when it reports: it stops. Trial 1 reports a better
 * val_loss: the best of 2, it is promoted at once and trains rung 1 in the
 * same process. */
#define CONT_BODY                                                                                             \
    "{\"name\":\"cont\",\"job\":" JOB(1) ",\"search\":{\"method\":\"asha\","                             \
    "\"parameters\":{\"compile.optimizer.learning_rate\":{\"values\":[0.003,0.00001]}},"                     \
    "\"metric\":\"val_loss\",\"mode\":\"min\",\"max_concurrent\":1,\"max_epochs\":2,\"reduction_factor\":2," \
    "\"seed\":1}}"

/* The job's metric key at epoch `epoch` (an epoch row); NAN when none. */
static double epoch_value(int64_t job, int epoch, const char *key) {
    cJSON *all = ty_metrics_all(srv.url, team_tok, job);
    double v = NAN;
    cJSON *m;
    cJSON_ArrayForEach(m, all) if (strcmp(ty_str(m, "kind"), "epoch") == 0 && (int)ty_num(m, "epoch") == epoch) v =
        ty_num(m, key);
    cJSON_Delete(all);
    return v;
}

START_TEST(asha_continues_in_process) {
    int64_t id = sweep_submit(CONT_BODY);
    cJSON *o = sweep_wait(id, 180, 1);
    ck_assert_str_eq(ty_str(o, "state"), "succeeded");
    cJSON *trials = cJSON_GetObjectItem(o, "trials");
    ck_assert_int_eq(cJSON_GetArraySize(trials), 2);
    cJSON *t0 = cJSON_GetArrayItem(trials, 0), *t1 = cJSON_GetArrayItem(trials, 1);
    ck_assert(ty_num(cJSON_GetObjectItem(t1, "params"), "compile.optimizer.learning_rate") == 0.003);
    /* trial 0: one epoch, stopped at rung 0 */
    ck_assert_str_eq(ty_str(t0, "state"), "stopped");
    ck_assert_int_eq((int)ty_num(t0, "epochs"), 1);
    ck_assert_int_eq((int)ty_num(t0, "rung"), 0);
    /* trial 1: both rungs in one process: one attempt, epochs 1 and 2 once each */
    ck_assert_str_eq(ty_str(t1, "state"), "succeeded");
    ck_assert_int_eq((int)ty_num(t1, "epochs"), 2);
    ck_assert_int_eq((int)ty_num(t1, "rung"), 1);
    int64_t job = (int64_t)ty_num(t1, "job_id");
    int ep[8];
    double best;
    ck_assert_int_eq(job_epochs(job, "val_loss", 0, ep, 8, &best), 2);
    ck_assert(ep[0] == 1 && ep[1] == 2);
    cJSON *j = ty_job_get(srv.url, team_tok, job);
    ck_assert_int_eq((int)ty_num(j, "attempt"), 1);
    ck_assert_str_eq(ty_str(j, "state"), "succeeded");
    cJSON *spec = cJSON_Duplicate(cJSON_GetObjectItem(j, "spec"), 1);
    ck_assert_int_eq((int)ty_num(cJSON_GetObjectItem(spec, "fit"), "epochs"), 2); /* the rung it went on to */
    cJSON_Delete(j);
    char *log = ty_task_log(srv.url, team_tok, job, "worker-0");
    ck_assert_msg(count_of(log, "it goes on in its process") == 1, "no promotion in its process in %s", log);
    ck_assert_msg(!strstr(log, "resuming from"), "trial 1 was restarted: %s", log);
    free(log);
    /* its timeline says why */
    char path[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/events", (long long)job);
    cJSON *ev = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", path, NULL, &ev), 200);
    int said = 0;
    cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(ev, "events")) {
        const char *why = ty_str(e, "reason");
        said += strcmp(ty_str(e, "kind"), "sweep") == 0 && why && strstr(why, "promoted to rung 1 (2 epochs)") &&
                strstr(why, "in its process");
    }
    cJSON_Delete(ev);
    ck_assert_int_eq(said, 1);
    /* it kept its progress: the same spec trained straight through for 2
     * epochs ends where the trial did, to the last bit */
    cJSON_ReplaceItemInObject(spec, "name", cJSON_CreateString("straight"));
    char *text = cJSON_PrintUnformatted(spec);
    cJSON_Delete(spec);
    int64_t straight = ty_submit(srv.url, team_tok, text);
    free(text);
    char state[16] = "";
    for (int i = 0; i < 600; i++) {
        cJSON *s = ty_job_get(srv.url, team_tok, straight);
        snprintf(state, sizeof state, "%s", ty_str(s, "state"));
        cJSON_Delete(s);
        if (strcmp(state, "succeeded") == 0 || strcmp(state, "failed") == 0 || strcmp(state, "cancelled") == 0) break;
        ty_sleep_ms(200);
    }
    ck_assert_str_eq(state, "succeeded");
    for (int e2 = 1; e2 <= 2; e2++) {
        double a = epoch_value(job, e2, "val_loss"), b = epoch_value(straight, e2, "val_loss");
        ck_assert_msg(!isnan(a) && a == b, "epoch %d: val_loss %.17g in the sweep, %.17g straight through", e2, a, b);
        a = epoch_value(job, e2, "loss");
        b = epoch_value(straight, e2, "loss");
        ck_assert_msg(!isnan(a) && a == b, "epoch %d: loss %.17g in the sweep, %.17g straight through", e2, a, b);
    }
    cJSON_Delete(o);
}
END_TEST

/* ---------------------------------------------------------------- cancel */

START_TEST(cancel_mid_sweep) {
    int64_t id = sweep_submit("{\"name\":\"long\",\"job\":" JOB(200) ",\"search\":{\"method\":\"grid\","
                              "\"parameters\":{\"fit.batch_size\":{\"values\":[32,64,128]}},"
                              "\"metric\":\"val_accuracy\",\"mode\":\"max\",\"max_concurrent\":1}}");
    int64_t job = 0;
    for (int i = 0; i < 300 && !job; i++) {
        cJSON *o = sweep_get(id);
        cJSON *t0 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "trials"), 0);
        if (ty_num(t0, "epochs") >= 1) job = (int64_t)ty_num(t0, "job_id");
        cJSON_Delete(o);
        if (!job) ty_sleep_ms(200);
    }
    ck_assert_msg(job > 0, "trial 0 never trained an epoch");
    /* a running sweep's trial job is the sweep's: not deleted under it */
    char jpath[64];
    snprintf(jpath, sizeof jpath, "/api/v1/jobs/%lld", (long long)job);
    cJSON *d = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "DELETE", jpath, NULL, &d), 409);
    ck_assert_msg(strstr(ty_str(cJSON_GetObjectItem(d, "error"), "message"), "of sweep"), "not the sweep's 409");
    cJSON_Delete(d);
    char path[64];
    snprintf(path, sizeof path, "/api/v1/sweeps/%lld/cancel", (long long)id);
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", path, NULL, &o), 200);
    ck_assert_str_eq(ty_str(o, "state"), "cancelled");
    cJSON *t;
    cJSON_ArrayForEach(t, cJSON_GetObjectItem(o, "trials")) ck_assert_str_eq(ty_str(t, "state"), "cancelled");
    /* the results so far are kept */
    ck_assert_int_ge((int)ty_num(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "trials"), 0), "epochs"), 1);
    cJSON_Delete(o);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", path, NULL, &o), 409);
    ty_assert_error(o, "conflict", NULL);
    cJSON_Delete(o);
    cJSON *j = ty_job_get(srv.url, team_tok, job);
    ck_assert_str_eq(ty_str(j, "state"), "cancelled");
    cJSON_Delete(j);
    /* the sweep ended: its trial's job may go once its task has exited */
    long st = 0;
    for (int i = 0; i < 100; i++) {
        st = ty_http(srv.url, team_tok, "DELETE", jpath, NULL, NULL);
        if (st != 409) break;
        ty_sleep_ms(200);
    }
    ck_assert_int_eq(st, 200);
    /* no trial starts after it (trial 0's job, deleted, is in no listing) */
    ty_sleep_ms(2500);
    ck_assert_int_eq(ty_http(srv.url, team_tok, "GET", "/api/v1/jobs", NULL, &o), 200);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(o, "jobs")), 0);
    cJSON_Delete(o);
}
END_TEST

/* ---------------------------------------------------------------- command jobs */

START_TEST(command_grid) {
    /* submitted with the CLI, from a file */
    char file[400];
    snprintf(file, sizeof file, "%s/sweep.json", srv.dir);
    const char *body =
        "{\"name\":\"cmd\",\"job\":{\"command\":{\"argv\":[\"/bin/sh\",\"-c\","
        "\"echo trainyard-metric '{\\\"kind\\\": \\\"epoch\\\", \\\"epoch\\\": 1, \\\"val_loss\\\": '$LR'}'\"]},"
        "\"max_restarts\":0},"
        "\"search\":{\"method\":\"grid\",\"parameters\":{\"command.env.LR\":{\"values\":[0.5,0.25,2]}},"
        "\"metric\":\"val_loss\",\"mode\":\"min\",\"max_concurrent\":2}}";
    ck_assert_int_eq(file_write_atomic(file, body, strlen(body), 0600), 0);
    char args[512];
    int st;
    snprintf(args, sizeof args, "sweep '%s'", file);
    char *out = cli_run(args, &st);
    ck_assert_msg(st == 0, "trainyard sweep exited %d: %s", st, out);
    ck_assert_msg(strncmp(out, "submitted sweep ", 16) == 0 && strstr(out, "3 trials"), "%s", out);
    int64_t id = atoll(out + 16);
    free(out);
    cJSON *o = sweep_wait(id, 120, 2);
    ck_assert_str_eq(ty_str(o, "state"), "succeeded");
    const double want[] = {0.5, 0.25, 2};
    for (int i = 0; i < 3; i++) {
        cJSON *t = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "trials"), i);
        ck_assert_str_eq(ty_str(t, "state"), "succeeded");
        ck_assert_msg(fabs(ty_num(t, "metric") - want[i]) < 1e-12, "trial %d: metric %g", i, ty_num(t, "metric"));
        cJSON *j = ty_job_get(srv.url, team_tok, (int64_t)ty_num(t, "job_id"));
        cJSON *env = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "spec"), "command"), "env");
        ck_assert(cJSON_IsString(cJSON_GetObjectItem(env, "LR")));
        cJSON_Delete(j);
    }
    cJSON *b = cJSON_GetObjectItem(o, "best");
    ck_assert_int_eq((int)ty_num(b, "trial"), 1);
    ck_assert(fabs(ty_num(b, "metric") - 0.25) < 1e-12);
    cJSON_Delete(o);
}
END_TEST

/* ---------------------------------------------------------------- restart */

START_TEST(server_killed_mid_sweep) {
    int64_t id = sweep_submit(ASHA_BODY("crash", 4));
    /* wait until some rung is recorded and a trial is training, then SIGKILL */
    for (int i = 0; i < 600; i++) {
        cJSON *o = sweep_get(id);
        int paused_or_done = 0, running = 0;
        cJSON *t;
        cJSON_ArrayForEach(t, cJSON_GetObjectItem(o, "trials")) {
            const char *s = ty_str(t, "state");
            paused_or_done += strcmp(s, "paused") == 0 || strcmp(s, "stopped") == 0;
            running += strcmp(s, "running") == 0 && ty_num(t, "epochs") >= 1;
        }
        cJSON_Delete(o);
        if (paused_or_done >= 1 && running >= 1) break;
        ty_sleep_ms(100);
    }
    ty_kill(&srv, SIGKILL);
    ty_sleep_ms(500);
    stack_server_restart();
    cJSON *o = sweep_wait(id, 300, 2);
    ck_assert_str_eq(ty_str(o, "state"), "succeeded");
    check_asha(o, 4);
    cJSON_Delete(o);
}
END_TEST

/* ---------------------------------------------------------------- Idempotency-Key */

static void start_server_only(void) {
    memset(&srv, 0, sizeof srv);
    agent = 0;
    ty_mkdtemp(srv.dir, sizeof srv.dir, "sweeps-idem");
    ty_server_start(&srv);
    stack_tokens();
}

#define IDEM_BODY(NAME)                                                                                       \
    "{\"name\":\"" NAME "\",\"job\":" JOB(1) ",\"search\":{\"method\":\"grid\","                             \
    "\"parameters\":{\"fit.batch_size\":{\"values\":[32,64]}},\"metric\":\"val_loss\",\"mode\":\"min\"}}"

/* A POST /sweeps answer with the headers a test looks at. */
typedef struct keyed_answer {
    long status;
    cJSON *body;
    char replayed[32];       /* Idempotent-Replayed's value, "" when absent */
    char location[128];
} keyed_answer;

typedef struct curl_sink {
    buf body;
    keyed_answer *a;
} curl_sink;

static size_t on_body(char *p, size_t size, size_t n, void *arg) {
    curl_sink *k = arg;
    return buf_append(&k->body, p, size * n) == 0 ? size * n : 0;
}

/* "Name: value\r\n" into out when the line is that header. */
static void header_value(const char *line, size_t len, const char *name, char *out, size_t cap) {
    size_t nl = strlen(name);
    if (len <= nl + 1 || strncasecmp(line, name, nl) != 0 || line[nl] != ':') return;
    const char *v = line + nl + 1;
    size_t vl = len - nl - 1;
    while (vl && (*v == ' ' || *v == '\t')) v++, vl--;
    while (vl && (v[vl - 1] == '\r' || v[vl - 1] == '\n' || v[vl - 1] == ' ')) vl--;
    snprintf(out, cap, "%.*s", (int)vl, v);
}

static size_t on_header(char *p, size_t size, size_t n, void *arg) {
    curl_sink *k = arg;
    header_value(p, size * n, "Idempotent-Replayed", k->a->replayed, sizeof k->a->replayed);
    header_value(p, size * n, "Location", k->a->location, sizeof k->a->location);
    return size * n;
}

/* POST /api/v1/sweeps with the token and an Idempotency-Key (NULL: none),
 * through libcurl to see the answer's headers; the caller deletes a->body. */
static void keyed_sweep(const char *tok, const char *key, const char *body, keyed_answer *a) {
    memset(a, 0, sizeof *a);
    curl_sink k = {.a = a};
    buf_init(&k.body, 4u << 20);
    CURL *h = curl_easy_init();
    ck_assert_ptr_nonnull(h);
    char url[sizeof srv.url + 32], auth[200], idem[400];
    snprintf(url, sizeof url, "%s/api/v1/sweeps", srv.url);
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", tok);
    struct curl_slist *hd = curl_slist_append(NULL, auth);
    ck_assert_ptr_nonnull(hd);
    ck_assert_ptr_nonnull(hd = curl_slist_append(hd, "Content-Type: application/json"));
    if (key) {
        snprintf(idem, sizeof idem, "Idempotency-Key: %s", key);
        ck_assert_ptr_nonnull(hd = curl_slist_append(hd, idem));
    }
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &k);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &k);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 60L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    CURLcode rc = curl_easy_perform(h);
    ck_assert_msg(rc == CURLE_OK, "POST /sweeps: %s", curl_easy_strerror(rc));
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &a->status);
    curl_slist_free_all(hd);
    curl_easy_cleanup(h);
    a->body = cJSON_ParseWithLength(k.body.data ? k.body.data : "", k.body.len);
    ck_assert_msg(a->body != NULL, "POST /sweeps answered %ld, not JSON: %.200s", a->status,
                  k.body.data ? k.body.data : "");
    buf_release(&k.body);
}

/* Every sweep of every team (the admin's list). */
static int count_sweeps(void) {
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "GET", "/api/v1/sweeps?limit=200", NULL, &o), 200);
    int n = cJSON_GetArraySize(cJSON_GetObjectItem(o, "sweeps"));
    cJSON_Delete(o);
    return n;
}

static void assert_made(const keyed_answer *a, int status) {
    char *t = cJSON_PrintUnformatted(a->body);
    ck_assert_msg(a->status == status, "POST /sweeps answered %ld (not %d): %s", a->status, status, t);
    free(t);
    char want[64];
    snprintf(want, sizeof want, "/api/v1/sweeps/%lld", (long long)ty_num(a->body, "id"));
    ck_assert_str_eq(a->location, want);
    ck_assert_str_eq(a->replayed, status == 200 ? "true" : "");
}

START_TEST(idempotency_key_makes_one_sweep) {
    static const char KEY[] = "5f0c7d3e-9a41-4b6e-8f21-0d3c6b2a9e11";
    keyed_answer a, b;
    keyed_sweep(team_tok, KEY, IDEM_BODY("once"), &a);
    assert_made(&a, 201);
    int64_t id = (int64_t)ty_num(a.body, "id");
    ck_assert_int_gt(id, 0);
    ck_assert_int_eq(count_sweeps(), 1);
    /* the retry of a lost answer: the first sweep, 200, marked, nothing new */
    keyed_sweep(team_tok, KEY, IDEM_BODY("once"), &b);
    assert_made(&b, 200);
    ck_assert_int_eq((int64_t)ty_num(b.body, "id"), id);
    ck_assert_str_eq(ty_str(b.body, "name"), "once");
    ck_assert_str_eq(ty_str(b.body, "created_at"), ty_str(a.body, "created_at"));
    ck_assert_int_eq((int)ty_num(b.body, "n_trials"), 2);
    ck_assert(cJSON_Compare(cJSON_GetObjectItem(a.body, "search"), cJSON_GetObjectItem(b.body, "search"), 1));
    ck_assert(cJSON_Compare(cJSON_GetObjectItem(a.body, "job"), cJSON_GetObjectItem(b.body, "job"), 1));
    cJSON_Delete(b.body);
    ck_assert_int_eq(count_sweeps(), 1);
    /* the same key with another request: 422 naming the header, nothing made */
    keyed_sweep(team_tok, KEY, IDEM_BODY("other"), &b);
    ck_assert_int_eq(b.status, 422);
    ty_assert_error(b.body, "idempotency_key_reused", "Idempotency-Key");
    ck_assert_str_eq(b.replayed, "");
    cJSON_Delete(b.body);
    ck_assert_int_eq(count_sweeps(), 1);
    /* a key that is no key (a space; 256 characters): 400 naming it, nothing made */
    keyed_sweep(team_tok, "has space", IDEM_BODY("bad-key"), &b);
    ck_assert_int_eq(b.status, 400);
    ty_assert_error(b.body, "invalid_value", "Idempotency-Key");
    cJSON_Delete(b.body);
    char longkey[257];
    memset(longkey, 'k', 256);
    longkey[256] = '\0';
    keyed_sweep(team_tok, longkey, IDEM_BODY("bad-key"), &b);
    ck_assert_int_eq(b.status, 400);
    ty_assert_error(b.body, "invalid_value", "Idempotency-Key");
    cJSON_Delete(b.body);
    ck_assert_int_eq(count_sweeps(), 1);
    /* another team's same key and request: a sweep of its own */
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, admin_tok, "POST", "/api/v1/teams", "{\"name\":\"vision\"}", &o), 201);
    char vision[128];
    snprintf(vision, sizeof vision, "%s", ty_str(o, "token"));
    cJSON_Delete(o);
    keyed_sweep(vision, KEY, IDEM_BODY("once"), &b);
    assert_made(&b, 201);
    int64_t theirs = (int64_t)ty_num(b.body, "id");
    ck_assert_int_ne(theirs, id);
    ck_assert_str_eq(ty_str(b.body, "team"), "vision");
    cJSON_Delete(b.body);
    keyed_sweep(vision, KEY, IDEM_BODY("once"), &b);
    assert_made(&b, 200);
    ck_assert_int_eq((int64_t)ty_num(b.body, "id"), theirs);
    cJSON_Delete(b.body);
    ck_assert_int_eq(count_sweeps(), 2);
    /* without a key, the same request twice is two sweeps */
    keyed_sweep(team_tok, NULL, IDEM_BODY("once"), &b);
    assert_made(&b, 201);
    ck_assert_int_ne((int64_t)ty_num(b.body, "id"), id);
    cJSON_Delete(b.body);
    ck_assert_int_eq(count_sweeps(), 3);
    cJSON_Delete(a.body);
}
END_TEST

typedef struct racer {
    const char *key;
    pthread_barrier_t *go;
    keyed_answer a;
} racer;

static void *race_one(void *arg) {
    racer *r = arg;
    pthread_barrier_wait(r->go);
    keyed_sweep(team_tok, r->key, IDEM_BODY("race"), &r->a);
    return NULL;
}

/* Two identical requests at once (a client's retry crossing its first try):
 * one 201, one 200 naming the same sweep, and one sweep made. */
START_TEST(idempotency_key_race_makes_one_sweep) {
    for (int round = 0; round < 4; round++) {
        char key[64];
        snprintf(key, sizeof key, "race-%d-7d3e9a41", round);
        pthread_barrier_t go;
        ck_assert_int_eq(pthread_barrier_init(&go, NULL, 2), 0);
        racer r[2] = {{.key = key, .go = &go}, {.key = key, .go = &go}};
        pthread_t t[2];
        for (int i = 0; i < 2; i++) ck_assert_int_eq(pthread_create(&t[i], NULL, race_one, &r[i]), 0);
        for (int i = 0; i < 2; i++) ck_assert_int_eq(pthread_join(t[i], NULL), 0);
        pthread_barrier_destroy(&go);
        int first = r[0].a.status == 201 ? 0 : 1;
        assert_made(&r[first].a, 201);
        assert_made(&r[1 - first].a, 200);
        ck_assert_int_eq((int64_t)ty_num(r[0].a.body, "id"), (int64_t)ty_num(r[1].a.body, "id"));
        cJSON_Delete(r[0].a.body);
        cJSON_Delete(r[1].a.body);
        ck_assert_int_eq(count_sweeps(), round + 1);
    }
}
END_TEST

int main(void) {
    Suite *s = suite_create("sweeps");
    tcase_add_test(ty_tcase(s, "grid", start_up, stop_all, 300), grid_end_to_end);
    tcase_add_test(ty_tcase(s, "refused", start_up, stop_all, 60), bad_parameter_refused);
    tcase_add_test(ty_tcase(s, "asha", start_up, stop_all, 360), asha_promotes_and_stops);
    tcase_add_test(ty_tcase(s, "continue", start_up, stop_all, 240), asha_continues_in_process);
    tcase_add_test(ty_tcase(s, "cancel", start_up, stop_all, 120), cancel_mid_sweep);
    tcase_add_test(ty_tcase(s, "command", start_up, stop_all, 150), command_grid);
    tcase_add_test(ty_tcase(s, "restart", start_server_agent, stop_all, 360), server_killed_mid_sweep);
    TCase *idem = ty_tcase(s, "idempotent", start_server_only, stop_all, 60);
    tcase_add_test(idem, idempotency_key_makes_one_sweep);
    tcase_add_test(idem, idempotency_key_race_makes_one_sweep);
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) return 1; /* before the tests' threads */
    return ty_run_suite(s);
}
