/* check_agent_parse.c - what an agent parses from the server: the reply of
 * GET /nodes/{id}/assignments through executor/agent.c's static
 * inbox_process, task_start and task_stop (reached by #including agent.c;
 * DEPS_check_agent_parse leaves agent.o out). Regression test for what
 * tests/fuzz/fuzz_agent_assignments found (docs/reliability.md, "Fuzzing"):
 * task ids and grace_s out of int64's range were cast (undefined behaviour)
 * instead of ignored. */
#include "../executor/agent.c"

#include <check.h>

/* An agent that holds AGENT_MAX_TASKS tasks matching no id: task_start
 * refuses before spawning and queues an exit report, so what the parser
 * made of a reply shows in the outbox. */
static agent *full_agent(task *dummy) {
    agent *a = xcalloc(1, sizeof *a);
    pthread_mutex_init(&a->mu, NULL);
    int p[2];
    ck_assert_int_eq(pipe2(p, O_NONBLOCK | O_CLOEXEC), 0);
    a->wake_r = p[0];
    a->wake_w = p[1];
    memset(dummy, 0, sizeof *dummy);
    dummy->id = INT64_MIN;
    dummy->exited = dummy->stop_sent = 1;
    dummy->fd = -1;
    for (int i = 0; i < AGENT_MAX_TASKS; i++) a->tasks[i] = dummy;
    a->n_tasks = AGENT_MAX_TASKS;
    return a;
}

static void agent_feed(agent *a, const char *reply) {
    a->inbox = xcalloc(1, sizeof *a->inbox);
    a->inbox[0] = xstrdup(reply);
    a->inbox_len = a->inbox_cap = 1;
    inbox_process(a);
}

static void agent_free(agent *a) {
    for (int i = 0; i < a->out_len; i++) free(a->outbox[(a->out_head + i) % OUTBOX_MAX].body);
    for (int i = 0; i < RECENT_MAX; i++) free(a->recents[i].body);
    close(a->wake_r);
    close(a->wake_w);
    pthread_mutex_destroy(&a->mu);
    free(a);
}

START_TEST(agent_assignment_ids) {
    task dummy;
    agent *a = full_agent(&dummy);
    /* a well-formed start: refused (agent full) and reported for task 5 */
    agent_feed(a, "{\"start\":[{\"task\":5,\"job\":12,\"config\":{}}],\"stop\":[]}");
    ck_assert_int_eq(a->out_len, 1);
    ck_assert_str_eq(a->outbox[a->out_head].path, "/api/v1/tasks/5/status");
    ck_assert_ptr_nonnull(strstr(a->outbox[a->out_head].body, "too many tasks on this agent"));
    /* fuzz_agent_assignments: ids past int64 were cast (UB); now the item is ignored */
    agent_feed(a, "{\"start\":[{\"task\":1e300,\"job\":-1e300,\"config\":{}},{\"task\":7,\"job\":9.3e18}],"
                  "\"stop\":[{\"task\":1e30}]}");
    ck_assert_int_eq(a->out_len, 1);
    /* a stop for a task not here is answered with an exit report; grace_s out of range is ignored */
    agent_feed(a, "{\"stop\":[{\"task\":6,\"grace_s\":1e300}]}");
    ck_assert_int_eq(a->out_len, 2);
    ck_assert_str_eq(a->outbox[(a->out_head + 1) % OUTBOX_MAX].path, "/api/v1/tasks/6/status");
    agent_free(a);
}
END_TEST

int main(void) {
    log_set_level((log_level)(LOG_ERROR + 1));
    Suite *s = suite_create("agent_parse");
    TCase *tc = tcase_create("assignments");
    tcase_add_test(tc, agent_assignment_ids);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
