/* fuzz_agent_assignments.c - libFuzzer target for what an agent parses from
 * the server: the long-poll reply of GET /nodes/{id}/assignments ({"start":
 * [...], "stop": [...], "exec": [...]}) through executor/agent.c's
 * inbox_process, task_start, task_stop and exec_begin (static: reached by
 * #including agent.c). The agent is built full (AGENT_MAX_TASKS tasks that
 * never match, AGENT_MAX_RELAYS shells), so task_start refuses before
 * spawning anything and queues an exit report instead, and exec_begin
 * refuses a session after reading it; stops of unknown tasks queue theirs. Every queued report must be a JSON object.
 * docs/reliability.md, "Fuzzing". */
#include "executor/agent.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static agent *g_a;
static task g_dummy;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    log_set_level(LOG_ERROR + 1);
    g_a = xcalloc(1, sizeof *g_a);
    pthread_mutex_init(&g_a->mu, NULL);
    int p[2];
    if (pipe2(p, O_NONBLOCK | O_CLOEXEC) < 0) abort();
    g_a->wake_r = p[0];
    g_a->wake_w = p[1];
    g_dummy.id = INT64_MIN; /* matches no id from JSON (they are > -2^63) */
    g_dummy.exited = 1;     /* a stop for it is a no-op: nothing is signalled */
    g_dummy.stop_sent = 1;
    g_dummy.fd = -1;
    for (int i = 0; i < AGENT_MAX_TASKS; i++) g_a->tasks[i] = &g_dummy;
    g_a->n_tasks = AGENT_MAX_TASKS;
    g_a->n_relays = AGENT_MAX_RELAYS; /* no relay is ever started */
    snprintf(g_a->exe, sizeof g_a->exe, "/bin/false");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    agent *a = g_a;
    char *item = xmalloc(size + 1);
    memcpy(item, data, size);
    item[size] = '\0';
    a->inbox = xcalloc(1, sizeof *a->inbox);
    a->inbox[0] = item;
    a->inbox_len = a->inbox_cap = 1;
    inbox_process(a);
    if (a->inbox || a->inbox_len || a->n_tasks != AGENT_MAX_TASKS || a->n_relays != AGENT_MAX_RELAYS) abort();
    /* what was queued for the server: check, then drop (nothing is sent) */
    while (a->out_len) {
        outmsg *m = &a->outbox[a->out_head];
        cJSON *v = cJSON_Parse(m->body);
        if (!cJSON_IsObject(v) || strncmp(m->path, "/api/v1/tasks/", 14) != 0) abort();
        cJSON_Delete(v);
        free(m->body);
        m->body = NULL;
        a->out_head = (a->out_head + 1) % OUTBOX_MAX;
        a->out_len--;
    }
    for (int i = 0; i < RECENT_MAX; i++) {
        free(a->recents[i].body);
        a->recents[i].body = NULL;
        a->recents[i].id = 0;
    }
    a->n_recent = a->recent_next = 0;
    return 0;
}
