/* lifecycle.h - what a task's state change means for its job. The gang is
 * the unit of failure: every task of the attempt running -> job running; a
 * task that fails stops the others and requeues the job (or fails it when no
 * attempts remain); the chief exiting 0 ends the job as succeeded once every
 * task exited. The evaluator (type "evaluator") is beside the gang: it is
 * stopped with it and the job's end waits for its exit (bounded by the
 * agent's stop grace), but its own failure is only an event ("evaluator
 * failed: ...") and never stops, fails or requeues the job. Each report is one transaction; job states change only through
 * store_job_transition (which writes the event).
 *
 * defines: lifecycle_task_running, lifecycle_ports, lifecycle_task_exited, lifecycle_exit,
 *          lifecycle_stop_tasks, lifecycle_attempt_failed */
#ifndef TRAINYARD_LIFECYCLE_H
#define TRAINYARD_LIFECYCLE_H

#include <stdint.h>
#include "../storage/db.h"

/* What an agent reports about a task that ended. */
typedef struct lifecycle_exit {
    int exit_code;               /* process exit status; 128+signal when killed */
    int signal;                  /* 0 = none */
    const char *reason;          /* NULL or the agent's words */
    const char *log_tail;        /* NULL or the last lines of the task's output */
} lifecycle_exit;

/* Outcome flags, so the caller knows whom to wake. */
enum { LC_NONE = 0, LC_JOB_CHANGED = 1, LC_DEVICES_FREED = 2 };

/* The web ports a task's agent gave it (the report's "ports": name -> port
 * of its node), at most 8. */
typedef struct lifecycle_ports {
    int n;
    char names[8][33];
    int ports[8];
} lifecycle_ports;

/* Task started. ports (NULL: none reported) replace the task's task_ports
 * rows in the same transaction (a repeated report's too). STORE_OK (*flags
 * set), STORE_NOT_FOUND, STORE_CONFLICT when the task already exited (its
 * ports unchanged), STORE_ERROR. Idempotent. */
int lifecycle_task_running(db *d, int64_t task_id, const lifecycle_ports *ports, const char *actor, int *flags);

/* Task ended: frees its devices, revokes its token and applies the gang's
 * rules to the job. STORE_OK (also for a repeated report), STORE_NOT_FOUND,
 * STORE_ERROR. */
int lifecycle_task_exited(db *d, int64_t task_id, const lifecycle_exit *e, const char *actor, int *flags);

/* Stops a job's attempt: live tasks -> stopping (their agents SIGTERM them),
 * tasks never handed out -> exited with their devices freed. Runs inside the
 * caller's transaction. */
int lifecycle_stop_tasks(db *d, int64_t job_id, const char *why);

/* An attempt of an active job failed (a task exited non-zero, its node was
 * lost): the one restart rule. Counts the failure; requeues the job while
 * failures <= max_restarts ("...; requeued (restart N of M)"), else fails it
 * ("...; restart budget spent (max_restarts M)"). Runs inside the caller's
 * transaction. STORE_OK (*requeued 1 or 0), STORE_CONFLICT when the job was
 * no longer active, STORE_ERROR. */
int lifecycle_attempt_failed(db *d, int64_t job_id, const char *what, const char *actor, int *requeued);

/* A fault no restart mends (an image that cannot be pulled): attempt
 * `attempt` of the job fails for good, its tasks are stopped, and its
 * restart budget is untouched (the reason says why). STORE_CONFLICT when
 * the job is no longer live or runs another attempt. Its own transaction. */
int lifecycle_job_fail_now(db *d, int64_t job_id, int attempt, const char *what, const char *actor);

#endif
