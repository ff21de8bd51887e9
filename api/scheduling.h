/* scheduling.h - what a handler asks of the scheduler: wake it, and stop a
 * job's tasks. Below every handler (and routes.c, which lists them), so that
 * no handler includes routes.h.
 *
 * defines: api_job_stop_tasks, api_kick_scheduler */
#ifndef TRAINYARD_SCHEDULING_H
#define TRAINYARD_SCHEDULING_H

#include <stdint.h>

struct server;

/* Asks the tasks of a job to stop (cancel, preemption): marks its running
 * tasks 'stopping' so their agents send SIGTERM. Runs inside the caller's
 * transaction. 0 or -1. */
int api_job_stop_tasks(struct server *srv, int64_t job_id, const char *why);

/* Wakes the scheduler (after a submit, cancel, task exit, node change). */
void api_kick_scheduler(struct server *srv);

#endif
