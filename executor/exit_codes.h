/* exit_codes.h - the exit status of a task's process (`trainyard worker`,
 * the command runner, the evaluator), as the agent reads it: what worker.h
 * says of it holds for all three.
 *
 * defines: WORKER_EXIT_OK, WORKER_EXIT_FAILED, WORKER_EXIT_STOPPED */
#ifndef TRAINYARD_EXIT_CODES_H
#define TRAINYARD_EXIT_CODES_H

#define WORKER_EXIT_OK 0
#define WORKER_EXIT_FAILED 1
#define WORKER_EXIT_STOPPED 143 /* 128 + SIGTERM: a stop, never mistaken for success */

#endif
