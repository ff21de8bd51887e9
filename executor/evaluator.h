/* evaluator.h - the evaluator side-car of a train job (resources.evaluator):
 * `trainyard worker` started with task type "evaluator". It watches the
 * job's checkpoints through the API with its task token (GET
 * /jobs/{id}/checkpoints, then /checkpoints/{cid}), and for each new one
 * loads it into a model built from the spec and evaluates it on the job's
 * validation split (data.validation_split), or the source's test split when
 * there is no validation split. Each result is a metric of kind "eval"
 * (eval_loss, eval_accuracy, eval_examples, split, checkpoint, step,
 * epoch), numbered in the evaluator's own sequence (GET
 * /jobs/{id}/metrics?kind=eval). After the final checkpoint (its epoch is
 * fit.epochs) it exits 0; on SIGTERM it evaluates the final checkpoint when
 * that is there and not evaluated yet (the chief finished), else exits 143.
 * The agent runs it at nice 19 under SCHED_IDLE. docs/executors.md, "The
 * evaluator".
 *
 * defines: evaluator_run */
#ifndef TRAINYARD_EVALUATOR_H
#define TRAINYARD_EVALUATOR_H

#include <signal.h>
#include <stdint.h>

#include "../spec/jobspec.h"

#define EVALUATOR_POLL_MS 1000      /* how often the checkpoint list is read */

/* Runs the evaluator of job `job` until the final checkpoint is evaluated
 * or *stop turns 1. Returns the worker's exit status: 0 (the final
 * checkpoint evaluated), 143 (stopped), 1 (failed: the last line of its
 * output, `trainyard worker: error: ...`, says why). */
int evaluator_run(const char *api, const char *token, int64_t job, int attempt, const jobspec *spec,
                  volatile sig_atomic_t *stop);

#endif
