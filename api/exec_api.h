/* exec_api.h - shells into a job's tasks through the server.
 *
 * GET /api/v1/jobs/{id}/tasks/{task}/exec (a WebSocket): the client asks
 * for a command in a running task. The server keeps a session in memory,
 * hands it to the node's agent in its next assignments answer ("exec"),
 * and waits (10 s at most) for the agent to connect back on
 * GET /api/v1/nodes/{node}/exec/{session} (Upgrade: trainyard-exec). Then
 * both requests are answered 101 and spliced (server/proxy.h): the agent's
 * side speaks the WebSocket's server end, the server copies bytes only and
 * watches the status frame go by for the job's timeline. No node listens
 * on a port of its own for this, and no agent needs to be reachable from
 * the server. The protocol (channels, status, resize) is in
 * docs/server.md, "Shells into tasks".
 *
 * defines: api_exec_routes, exec_api_take */
#ifndef TRAINYARD_EXEC_API_H
#define TRAINYARD_EXEC_API_H

#include <stdint.h>
#include <cjson/cJSON.h>
#include "../server/http.h"

extern const route api_exec_routes[];

/* The sessions of node not handed to its agent yet, as the assignments
 * answer's "exec" array (each handed once), or NULL when there are none. */
cJSON *exec_api_take(int64_t node);

#endif
