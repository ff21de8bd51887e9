/* check_worker_parse.c - what a worker parses from the server: its
 * TRAINYARD_CONFIG (executor/worker.c's static config_parse, reached by
 * #including worker.c; DEPS_check_worker_parse leaves worker.o out).
 * Regression test for what tests/fuzz/fuzz_worker_config found
 * (docs/reliability.md, "Fuzzing"): a job id out of int64's range was cast
 * (undefined behaviour) instead of refused. */
#include "../executor/worker.c"

#include <check.h>

static const char CFG_OK[] =
    "{\"job\":12,\"attempt\":2,\"api\":\"http://127.0.0.1:1\",\"token\":\"ty_x\",\"spec\":{},"
    "\"task\":{\"type\":\"ps\",\"index\":1},\"devices\":[\"cpu:0\",\"cpu:1\"],"
    "\"cluster\":{\"worker\":[\"10.0.0.1:40001\",\"10.0.0.2:40002\"],\"ps\":[\"10.0.0.3:7\"]}}";

static void config_free(wconfig *w) {
    free(w->spec_json);
    free(w->worker_addr);
    free(w->worker_port);
    free(w->ps);
}

START_TEST(worker_config_ok) {
    wconfig w;
    char err[256] = "";
    ck_assert_int_eq(config_parse(CFG_OK, &w, err, sizeof err), 0);
    ck_assert_int_eq(w.job, 12);
    ck_assert_int_eq(w.attempt, 2);
    ck_assert_str_eq(w.type, "ps");
    ck_assert_int_eq(w.n_workers, 2);
    ck_assert_str_eq(w.worker_addr[1], "10.0.0.2");
    ck_assert_int_eq(w.worker_port[1], 40002);
    ck_assert_int_eq(w.n_ps, 1);
    ck_assert_int_eq(w.ps[0].port, 7);
    ck_assert_int_eq(w.threads, 2);
    config_free(&w);
}
END_TEST

/* fuzz_worker_config: {"job":1e300,...} was cast to int64 (UB; INT64_MIN on x86) */
START_TEST(worker_config_job_out_of_range) {
    static const char *const jobs[] = {"1e300", "-1e300", "9.3e18", "0", "-4", "1e16"};
    for (size_t i = 0; i < sizeof jobs / sizeof jobs[0]; i++) {
        char cfg[512];
        snprintf(cfg, sizeof cfg, "{\"job\":%s,\"api\":\"http://h:1\",\"token\":\"t\",\"spec\":{}}", jobs[i]);
        wconfig w;
        char err[256] = "";
        ck_assert_msg(config_parse(cfg, &w, err, sizeof err) == -1, "job %s accepted", jobs[i]);
        ck_assert_str_eq(err, "TRAINYARD_CONFIG job is not a job id");
        config_free(&w);
    }
}
END_TEST

int main(void) {
    log_set_level((log_level)(LOG_ERROR + 1));
    Suite *s = suite_create("worker_parse");
    TCase *tc = tcase_create("config");
    tcase_add_test(tc, worker_config_ok);
    tcase_add_test(tc, worker_config_job_out_of_range);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
