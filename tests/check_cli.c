/* check_cli.c - the CLI's everyday commands as a script uses them, against
 * the real `trainyard up` on loopback: watch (progress lines, then the exit
 * code of how the job ended: 0 succeeded, 5 cancelled), watch --json (one
 * object per change), status (with the model's summary table), queue,
 * cluster, events, checkpoints and --download
 * (the file's sha256 equals the listed one), and the exit codes for a job
 * that does not exist (1), bad usage (2) and an unreachable server (3). */
#include "testlib.h"

#include <math.h>

static ty_proc srv;
static char team_tok[128];

static void start(void) {
    memset(&srv, 0, sizeof srv);
    ty_mkdtemp(srv.dir, sizeof srv.dir, "cli");
    const char *extra[] = {"--cpu-slots", "1", NULL};
    ty_server_start_args(&srv, "up", extra);
    ty_token(&srv, "token", team_tok, sizeof team_tok);
    setenv("TRAINYARD_URL", srv.url, 1);
    setenv("TRAINYARD_TOKEN", team_tok, 1);
}

static void stop(void) {
    ty_kill(&srv, SIGTERM);
    ty_rmrf(srv.dir);
}

/* Runs `trainyard ARGS` (stdout into out, stderr dropped); its exit code. */
static int cli(const char *args, buf *out) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>/dev/null", ty_bin(), args);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    buf_init(out, 4u << 20);
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, p)) > 0) ck_assert_int_eq(buf_append(out, chunk, n), 0);
    int st = pclose(p);
    ck_assert_msg(WIFEXITED(st), "trainyard %s did not exit", args);
    return WEXITSTATUS(st);
}

static cJSON *cli_json(const char *args, int want_rc) {
    buf out;
    int rc = cli(args, &out);
    ck_assert_msg(rc == want_rc, "trainyard %s exited %d: %s", args, rc, out.data ? out.data : "");
    cJSON *v = cJSON_Parse(out.data ? out.data : "");
    ck_assert_msg(v != NULL, "trainyard %s: not JSON: %s", args, out.data ? out.data : "");
    buf_release(&out);
    return v;
}

static int64_t submit(const char *name, int epochs) {
    char spec[1400], path[400], args[600];
    snprintf(spec, sizeof spec,
             "{\"name\":\"%s\",\"model\":{\"layers\":[{\"type\":\"flatten\",\"input_shape\":[28,28]},"
             "{\"type\":\"dense\",\"units\":32,\"activation\":\"relu\"},{\"type\":\"dense\",\"units\":10,"
             "\"activation\":\"softmax\"}]},\"compile\":{\"optimizer\":{\"type\":\"adam\",\"learning_rate\":0.001},"
             "\"loss\":\"sparse_categorical_crossentropy\",\"metrics\":[\"accuracy\"]},\"data\":{\"source\":"
             "\"fashion-mnist\",\"limit\":2000,\"validation_split\":0.1,\"seed\":7},\"fit\":{\"epochs\":%d,"
             "\"batch_size\":64},\"checkpoint\":{\"every_epochs\":1,\"keep\":2}}",
             name, epochs);
    snprintf(path, sizeof path, "%s/%s.json", srv.dir, name);
    ck_assert_int_eq(file_write_atomic(path, spec, strlen(spec), 0600), 0);
    snprintf(args, sizeof args, "submit --json '%s'", path);
    cJSON *j = cli_json(args, 0);
    int64_t id = (int64_t)cJSON_GetObjectItem(j, "id")->valuedouble;
    cJSON_Delete(j);
    return id;
}

START_TEST(watch_to_the_end_and_after) {
    int64_t id = submit("cli-ok", 3);
    char args[600];
    buf out;
    snprintf(args, sizeof args, "watch %lld --interval 100", (long long)id);
    ck_assert_int_eq(cli(args, &out), 0);
    /* not a terminal: a line per change, the last one complete */
    ck_assert_msg(strstr(out.data, "[########################] 100%") != NULL, "%s", out.data);
    ck_assert_msg(strstr(out.data, "epoch 3/3") && strstr(out.data, "succeeded"), "%s", out.data);
    ck_assert_msg(strstr(out.data, "loss 0.") != NULL, "no live loss: %s", out.data);
    buf_release(&out);

    snprintf(args, sizeof args, "watch %lld --json", (long long)id);
    cJSON *w = cli_json(args, 0); /* finished: exactly one line */
    ck_assert_str_eq(cJSON_GetObjectItem(w, "state")->valuestring, "succeeded");
    ck_assert_int_eq((int)cJSON_GetObjectItem(cJSON_GetObjectItem(w, "progress"), "epochs")->valuedouble, 3);
    cJSON_Delete(w);

    /* status reads for a person: tasks, epoch and step of the total, the
     * losses and accuracies, the test metrics, the model as Keras'
     * model.summary() (784 x 32 + 32 and 32 x 10 + 10 params); --json keeps
     * the object */
    snprintf(args, sizeof args, "status %lld", (long long)id);
    ck_assert_int_eq(cli(args, &out), 0);
    const char *lines[] = {"state:      succeeded", "tasks:      worker-0", "epoch:      3 of 3\n",
                           "step:       ", " (100%)", "train:      loss 0.", "validation: loss 0.",
                           "test:       loss 0.", "samples/s", "timeline:",
                           "model:\n  Layer (type)         Output Shape  Param #\n"
                           "  ==========================================\n",
                           "  flatten_0 (Flatten)  (None, 784)         0\n",
                           "  dense_0 (Dense)      (None, 32)     25,120\n",
                           "  dense_1 (Dense)      (None, 10)        330\n",
                           "  Total params: 25,450\n", "  Trainable params: 25,450\n", "  Non-trainable params: 0\n"};
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++)
        ck_assert_msg(strstr(out.data, lines[i]) != NULL, "status lacks '%s':\n%s", lines[i], out.data);
    ck_assert_msg(strstr(out.data, "\"latest_epoch\"") == NULL, "status prints raw JSON:\n%s", out.data);
    buf_release(&out);
    snprintf(args, sizeof args, "status %lld --json", (long long)id);
    cJSON *sj = cli_json(args, 0);
    ck_assert(cJSON_IsObject(cJSON_GetObjectItem(cJSON_GetObjectItem(sj, "progress"), "test")));
    cJSON_Delete(sj);

    snprintf(args, sizeof args, "events %lld --json", (long long)id);
    cJSON *ev = cli_json(args, 0);
    cJSON *evs = cJSON_GetObjectItem(ev, "events");
    ck_assert_int_ge(cJSON_GetArraySize(evs), 4);
    ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(evs, cJSON_GetArraySize(evs) - 1), "to")->valuestring,
                     "succeeded");
    cJSON_Delete(ev);
    snprintf(args, sizeof args, "events %lld", (long long)id);
    ck_assert_int_eq(cli(args, &out), 0);
    ck_assert_msg(strstr(out.data, "submitted") && strstr(out.data, "succeeded"), "%s", out.data);
    buf_release(&out);

    /* checkpoints: the list, and the newest downloaded and verified */
    snprintf(args, sizeof args, "checkpoints %lld --json", (long long)id);
    cJSON *ck = cli_json(args, 0);
    cJSON *newest = cJSON_GetArrayItem(cJSON_GetObjectItem(ck, "checkpoints"), 0);
    ck_assert_ptr_nonnull(newest);
    char sha[65];
    snprintf(sha, sizeof sha, "%s", cJSON_GetObjectItem(newest, "sha256")->valuestring);
    ck_assert_int_eq((int)cJSON_GetObjectItem(newest, "epoch")->valuedouble, 3);
    cJSON_Delete(ck);
    char file[400];
    snprintf(file, sizeof file, "%s/model.safetensors", srv.dir);
    snprintf(args, sizeof args, "checkpoints %lld --download -o '%s' --json", (long long)id, file);
    cJSON *dl = cli_json(args, 0);
    ck_assert_str_eq(cJSON_GetObjectItem(dl, "sha256")->valuestring, sha);
    cJSON_Delete(dl);
    size_t len = 0;
    char *bytes = file_read_all(file, 64u << 20, &len);
    ck_assert_ptr_nonnull(bytes);
    char got[65];
    sha256_hex(bytes, len, got);
    free(bytes);
    ck_assert_str_eq(got, sha);
    snprintf(args, sizeof args, "checkpoints %lld --download --checkpoint 99999 -o '%s.x'", (long long)id, file);
    ck_assert_int_eq(cli(args, &out), 1);
    buf_release(&out);
    snprintf(file + strlen(file), sizeof file - strlen(file), ".x");
    ck_assert_int_ne(access(file, F_OK), 0); /* nothing left behind */
}
END_TEST

/* The speed of a finished job is its run's mean: the samples it trained
 * (epochs x the training examples of its spec) over its training time (the
 * sum of its epoch metrics' seconds), not the last step's figure. */
START_TEST(a_finished_job_shows_its_mean_speed) {
    int64_t id = submit("cli-speed", 4);
    char args[600];
    buf out;
    snprintf(args, sizeof args, "watch %lld --interval 100", (long long)id);
    ck_assert_int_eq(cli(args, &out), 0);
    buf_release(&out);
    /* limit 2000, validation_split 0.1: 1800 training examples an epoch */
    const double samples = 4 * 1800.0;
    cJSON *all = ty_metrics_all(srv.url, team_tok, id);
    double secs = 0, last_step_sps = -1;
    int epochs = 0;
    cJSON *m;
    cJSON_ArrayForEach(m, all) {
        if (strcmp(ty_str(m, "kind"), "epoch") == 0) {
            ck_assert_double_gt(ty_num(m, "seconds"), 0);
            secs += ty_num(m, "seconds");
            epochs++;
        } else if (strcmp(ty_str(m, "kind"), "step") == 0 && ty_num(m, "samples_per_sec") > 0) {
            last_step_sps = ty_num(m, "samples_per_sec");
        }
    }
    cJSON_Delete(all);
    ck_assert_int_eq(epochs, 4);
    double want = samples / secs;

    snprintf(args, sizeof args, "status %lld --json", (long long)id);
    cJSON *sj = cli_json(args, 0);
    cJSON *p = cJSON_GetObjectItem(sj, "progress");
    double mean = ty_num(p, "mean_samples_per_sec");
    ck_assert_msg(fabs(mean - want) <= 0.001 * want, "progress.mean_samples_per_sec %.1f, want %.0f samples / %.4f s = %.1f",
                  mean, samples, secs, want);
    ck_assert_msg(fabs(ty_num(p, "train_seconds") - secs) <= 1e-6 * secs, "train_seconds %.6f, want %.6f",
                  ty_num(p, "train_seconds"), secs);
    /* the newest figure stays what the worker last reported */
    ck_assert_msg(fabs(ty_num(p, "samples_per_sec") - last_step_sps) <= 1e-6 * last_step_sps,
                  "samples_per_sec %.1f, the last step's %.1f", ty_num(p, "samples_per_sec"), last_step_sps);
    cJSON_Delete(sj);

    snprintf(args, sizeof args, "status %lld", (long long)id);
    ck_assert_int_eq(cli(args, &out), 0);
    const char *line = strstr(out.data, "speed:      ");
    ck_assert_msg(line != NULL, "status shows no speed:\n%s", out.data);
    double shown = strtod(line + strlen("speed:      "), NULL);
    ck_assert_msg(fabs(shown - want) <= 0.001 * want + 1,
                  "status shows %.0f samples/s; %.0f samples in %.4f s of training is %.0f:\n%s", shown, samples, secs,
                  want, out.data);
    ck_assert_msg(strstr(line, "mean") != NULL, "status does not say the speed is the mean:\n%s", out.data);
    buf_release(&out);
}
END_TEST

START_TEST(queue_cluster_and_a_cancelled_watch) {
    int64_t run = submit("cli-long", 2000);
    int64_t wait = submit("cli-wait", 1);
    /* the long job holds the only slot: the other waits, with its reason */
    cJSON *q = NULL;
    for (int i = 0; i < 100; i++) {
        cJSON_Delete(q);
        q = cli_json("queue --json", 0);
        if (cJSON_GetArraySize(cJSON_GetObjectItem(q, "jobs")) == 1) break;
        ty_sleep_ms(100);
    }
    cJSON *first = cJSON_GetArrayItem(cJSON_GetObjectItem(q, "jobs"), 0);
    ck_assert_ptr_nonnull(first);
    ck_assert_int_eq((int64_t)cJSON_GetObjectItem(first, "id")->valuedouble, wait);
    ck_assert(strlen(cJSON_GetObjectItem(first, "reason")->valuestring) > 0);
    cJSON_Delete(q);
    buf out;
    ck_assert_int_eq(cli("queue", &out), 0);
    ck_assert_msg(strstr(out.data, "1 queued") != NULL, "%s", out.data);
    buf_release(&out);
    cJSON *c = cli_json("cluster --json", 0);
    cJSON *node = cJSON_GetArrayItem(cJSON_GetObjectItem(c, "nodes"), 0);
    cJSON *holders = cJSON_GetObjectItem(cJSON_GetObjectItem(node, "cpu_slots"), "holders");
    ck_assert_int_eq(cJSON_GetArraySize(holders), 1);
    ck_assert_int_eq((int64_t)cJSON_GetObjectItem(cJSON_GetArrayItem(holders, 0), "job")->valuedouble, run);
    cJSON_Delete(c);
    char args[128], want[64];
    ck_assert_int_eq(cli("cluster", &out), 0);
    snprintf(want, sizeof want, "[job %lld: 1]", (long long)run);
    ck_assert_msg(strstr(out.data, want) != NULL, "%s", out.data);
    /* the node's memory in use (the running job's share) and its isolation */
    ck_assert_msg(strstr(out.data, "    memory ") && strstr(out.data, " MiB in use; isolation "), "%s", out.data);
    ck_assert_msg(strstr(out.data, "    memory 0/") == NULL, "no memory in use under a running job: %s", out.data);
    buf_release(&out);
    /* cancel it from the side: watch ends with 5 */
    char path[96];
    snprintf(path, sizeof path, "/api/v1/jobs/%lld/cancel", (long long)run);
    cJSON *o = NULL;
    ck_assert_int_eq(ty_http(srv.url, team_tok, "POST", path, NULL, &o), 200);
    cJSON_Delete(o);
    snprintf(args, sizeof args, "watch %lld --interval 100", (long long)run);
    ck_assert_int_eq(cli(args, &out), 5);
    ck_assert_msg(strstr(out.data, "cancelled") != NULL, "%s", out.data);
    buf_release(&out);
}
END_TEST

START_TEST(exit_codes_for_scripts) {
    buf out;
    ck_assert_int_eq(cli("watch 424242", &out), 1);     /* no such job: refused */
    buf_release(&out);
    ck_assert_int_eq(cli("events 424242 --json", &out), 1);
    ck_assert_msg(strstr(out.data, "\"not_found\"") != NULL, "--json prints the error: %s", out.data);
    buf_release(&out);
    ck_assert_int_eq(cli("watch notanid", &out), 2);    /* usage */
    buf_release(&out);
    ck_assert_int_eq(cli("queue extra", &out), 2);
    buf_release(&out);
    ck_assert_int_eq(cli("checkpoints 1 --download --checkpoint x", &out), 2);
    buf_release(&out);
    ck_assert_int_eq(cli("queue --url http://127.0.0.1:1", &out), 3); /* unreachable */
    buf_release(&out);
    ck_assert_int_eq(cli("cluster --token ty_wrong", &out), 1);       /* 401 */
    buf_release(&out);
}
END_TEST

/* `trainyard --help` names every command there is; `--version` the version
 * and what the binary was built with; an unknown command is a usage error
 * that prints the same list. */
START_TEST(help_lists_every_command_and_version_says_the_build) {
    static const char *const commands[] = {"up",     "server", "agent",  "worker", "train",  "submit",
                                           "jobs",   "status", "watch",  "logs",   "events", "checkpoints",
                                           "cancel", "queue",  "cluster", "teams", "usage",  "version",
                                           "sweep",  "sweeps", "sweep-status", "shell"};
    buf out;
    ck_assert_int_eq(cli("--help", &out), 0);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        char want[48];
        snprintf(want, sizeof want, "\n  %s ", commands[i]);
        ck_assert_msg(strstr(out.data, want) != NULL, "--help does not list '%s':\n%s", commands[i], out.data);
    }
    buf_release(&out);
    /* every listed command is one the binary takes: its --help answers 0 */
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(commands[i], "version") == 0) continue;
        char args[64];
        snprintf(args, sizeof args, "%s --help", commands[i]);
        int rc = cli(args, &out);
        ck_assert_msg(rc == 0, "trainyard %s exited %d", args, rc);
        buf_release(&out);
    }
    ck_assert_int_eq(cli("--version", &out), 0);
    ck_assert_msg(strncmp(out.data, "trainyard 0.", 12) == 0, "--version: %s", out.data);
    ck_assert_msg(strstr(out.data, "CUDA") && strstr(out.data, "OpenBLAS"), "--version names no build: %s",
                  out.data);
    buf_release(&out);
    ck_assert_int_eq(cli("version", &out), 0);
    buf_release(&out);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "'%s' frobnicate 2>&1", ty_bin());
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    char text[8192];
    size_t n = fread(text, 1, sizeof text - 1, p);
    text[n] = '\0';
    int st = pclose(p);
    ck_assert_int_eq(WEXITSTATUS(st), 2);
    ck_assert_msg(strstr(text, "unknown command 'frobnicate'") && strstr(text, "\n  checkpoints "),
                  "unknown command: %s", text);
}
END_TEST

int main(void) {
    Suite *s = suite_create("cli");
    TCase *tu = tcase_create("usage");
    tcase_add_test(tu, help_lists_every_command_and_version_says_the_build);
    suite_add_tcase(s, tu);
    TCase *tc = tcase_create("commands");
    tcase_add_checked_fixture(tc, start, stop);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, watch_to_the_end_and_after);
    tcase_add_test(tc, a_finished_job_shows_its_mean_speed);
    tcase_add_test(tc, queue_cluster_and_a_cancelled_watch);
    tcase_add_test(tc, exit_codes_for_scripts);
    suite_add_tcase(s, tc);
    return ty_run_suite(s);
}
