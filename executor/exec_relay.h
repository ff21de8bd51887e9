/* exec_relay.h - `trainyard exec-relay` (hidden): one shell into a running
 * task (docs/executors.md, "Shells into tasks"). The agent starts one per
 * exec session it is handed, as root from its main thread, with what it
 * needs in TRAINYARD_EXEC (JSON, read and removed from the environment at
 * once): the server's URL, the node's id and token, the session, the task's
 * worker pid, uid, cgroups and job directory (or its container), the
 * command, tty, size, TERM and the task's variables.
 *
 * The relay opens GET /api/v1/nodes/{node}/exec/{session} (Upgrade:
 * trainyard-exec) with the node's token and, after the 101, is the server
 * end of the client's WebSocket: it starts the command in the task's
 * isolation (the worker's mount namespace, its cgroups, a session of its
 * own, its uid with no supplementary groups and no new privileges, cwd and
 * HOME the job directory; for an image `podman exec` into the task's
 * container) on a PTY or on pipes, relays channels 0-5 of the exec
 * protocol, and ends with the status frame and a Close. Bounded buffers, one
 * poll() loop.
 *
 * defines: exec_relay_spawn, cmd_exec_relay */
#ifndef TRAINYARD_EXEC_RELAY_H
#define TRAINYARD_EXEC_RELAY_H

#include <sys/types.h>

/* Starts `exe exec-relay` with the agent's environment (less
 * TRAINYARD_TOKEN) plus TRAINYARD_EXEC=json and env_add (NULL-terminated,
 * may be NULL): its own process group, SIGTERM when the calling thread
 * dies, stdin from /dev/null, its log lines on the agent's stderr. The pid,
 * or -1 with errno. */
pid_t exec_relay_spawn(const char *exe, const char *json, char *const env_add[]);

/* `trainyard exec-relay`: 0 when the session ran to its end, 1 when it could
 * not reach the server or was refused. */
int cmd_exec_relay(int argc, char **argv);

#endif
