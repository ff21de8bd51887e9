/* shell.h - `trainyard shell JOB [--task NAME] [-- CMD ...]`: a command (a
 * login shell when none is given) in one of a job's running tasks, over
 * GET /api/v1/jobs/{id}/tasks/{task}/exec (a WebSocket; the protocol:
 * docs/executors.md, "Shells into tasks"). With a terminal on stdin, the
 * task gets a PTY of the terminal's size (resized with it) and the terminal
 * is raw while the session lasts (restored on every way out); otherwise
 * plain pipes, stdout and stderr apart, and the end of stdin is the
 * command's. The exit status is the command's.
 *
 * defines: shell_opts, shell_run */
#ifndef TRAINYARD_SHELL_H
#define TRAINYARD_SHELL_H

typedef struct shell_opts {
    const char *url, *token, *team; /* the CLI's server, token and team ("" none) */
    const char *job;               /* the job's id */
    const char *task;              /* a task's name or id; NULL: the job's first running task */
    int argc;                      /* the command (0: the login shell) */
    char **argv;
} shell_opts;

/* The command's exit status; or 1 (the server refused: 4xx, or the job has
 * no running task), 2 (usage), 3 (the server unreachable or a 5xx), 255
 * (the connection ended before the command's status came). */
int shell_run(const shell_opts *o);

#endif
