/* command.h - one task of a command job (a team's own program, spec
 * `"command": {"argv", "env", "working_dir"}`), run by `trainyard worker`
 * in place of the training loop: rendezvous of the tasks through the API,
 * TF_CONFIG / torch.distributed / TRAINYARD_CONFIG in the environment, the
 * program in its own process group with its output forwarded as the job's
 * logs and its `trainyard-metric {json}` lines as the job's metrics, and a
 * checkpoint directory saved and restored across attempts. An interactive
 * job's task runs here too, with the notebook or the shell's long sleep as
 * its program (docs/jobspec.md, "Interactive jobs").
 * Behaviour and contract: docs/command-jobs.md.
 *
 * defines: command_run */
#ifndef TRAINYARD_COMMAND_H
#define TRAINYARD_COMMAND_H

#include <signal.h>

#include "../spec/jobspec.h"

/* Runs the task described by config (the TRAINYARD_CONFIG text) for the
 * command job spec. *stop turns 1 on SIGTERM/SIGINT (the worker's handler):
 * the program's group gets SIGTERM, then SIGKILL after a grace period.
 * Returns the worker's exit status: the program's own (128 + N when killed
 * by signal N), 143 when stopped, 127 when the program cannot be started,
 * 1 when the task cannot be set up or its reports cannot be delivered. */
int command_run(const char *config, const jobspec *spec, volatile sig_atomic_t *stop);

#endif
