/* scheduling.c - what a handler asks of the scheduler (see scheduling.h). */
#include "scheduling.h"

#include "../scheduler/lifecycle.h"
#include "../scheduler/scheduler.h"
#include "../server/server.h"
#include "../storage/store.h"

int api_job_stop_tasks(struct server *srv, int64_t job_id, const char *why) {
    /* tasks never handed out to an agent are closed at once: no agent would report them */
    /* the agents running the others are woken to stop them (db_wake_node) */
    if (lifecycle_stop_tasks(srv->db, job_id, why) != STORE_OK) return -1;
    return 0;
}

void api_kick_scheduler(struct server *srv) {
    (void)srv;
    sched_kick();
}
