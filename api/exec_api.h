/* exec_api.h - the endpoints agents and workers speak (docs/api-executors.md):
 * assignments long-poll, task status, metrics, logs, checkpoints, rendezvous,
 * and what users read of a running job (progress, tasks, server-sent events).
 *
 * defines: api_exec_routes, exec_node_registered, exec_events_stream, exec_wants_event_stream, exec_job_decorate */
#ifndef TRAINYARD_EXEC_API_H
#define TRAINYARD_EXEC_API_H

#include <stdint.h>
#include <cjson/cJSON.h>
#include "../server/http.h"

extern const route api_exec_routes[];

struct server;

/* The node registered (again): its long-polls begun before now answer at
 * once with nothing, so no task is handed to an agent's previous life. */
void exec_node_registered(int64_t node);

/* 1 when the request's Accept header asks for text/event-stream. */
int exec_wants_event_stream(http_req *req);

/* Answers GET /jobs/{id}/events as server-sent events (the caller checked
 * the job exists and the token may see it): every job event after ?after=ID
 * (or Last-Event-ID) as `event: state`, and metrics with seq > ?since=SEQ
 * (default: only new ones) as `event: metric`; ends when the job is
 * finished and everything was sent, or when the server stops. */
void exec_events_stream(struct server *srv, http_req *req, http_res *res, int64_t job_id);

/* Adds "progress" (epoch, step, latest metrics, ETA; null before the first
 * metric) and "tasks" (the current attempt's tasks: type, index, node,
 * port, state, exit code) to a job's JSON form. 0, or -1 when a read
 * failed and a part is missing (null progress or no tasks): such an answer
 * is not kept. */
int exec_job_decorate(struct server *srv, int64_t job_id, cJSON *job);

#endif
