/* worker.h - `trainyard worker`: one task of a job, started by the agent
 * with TRAINYARD_CONFIG. Parses the spec from the config, resumes from the
 * job's latest checkpoint, trains with the engine (executor/train_loop.h)
 * and reports metrics and checkpoints through the API from a background
 * sender thread, so that training never waits on the network.
 *
 * Exit status: 0 trained to the end (test metrics delivered); 143 stopped by
 * SIGTERM (cancel, preemption, agent stop) after the chief uploaded a
 * checkpoint; 1 failed, with the reason as the last log line.
 * Contract: docs/api-executors.md; behaviour: docs/executors.md.
 *
 * defines: cmd_worker, worker_run */
#ifndef TRAINYARD_WORKER_H
#define TRAINYARD_WORKER_H

#include "exit_codes.h"

/* Runs the task described by the JSON text config (TRAINYARD_CONFIG).
 * Returns the process exit status above. */
int worker_run(const char *config);

/* `trainyard worker`: reads TRAINYARD_CONFIG from the environment. */
int cmd_worker(int argc, char **argv);

#endif
