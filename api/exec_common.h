/* exec_common.h - what the endpoints of running jobs share (assignments,
 * task status, events, metrics, logs, checkpoints, rendezvous): the job a
 * request may touch, an integer field's check and the periods of their
 * long-polls (a busy database's 503 is server/http.h's http_db_unavailable).
 *
 * Scope: a task token touches only its own job, a team token its team's
 * jobs, the admin all; another job is a 404 (ids do not leak). A node's
 * token acts for its own node (scope.h).
 *
 * defines: EXEC_POLL_MS, EXEC_WAIT_MAX_S, api_job_param, api_json_int */
#ifndef TRAINYARD_EXEC_COMMON_H
#define TRAINYARD_EXEC_COMMON_H

#include <stdint.h>
#include <cjson/cJSON.h>
#include "../server/http.h"
#include "../storage/exec_store.h"

#define EXEC_POLL_MS 150   /* long-poll and event-stream database poll period */
#define EXEC_WAIT_MAX_S 60 /* the longest ?wait= of a long-poll */

struct server;

/* The job of the route's first {id} when the request's token may see it:
 * its id with *j loaded (its spec too when with_spec; release it with
 * exec_store_job_release), or -1 with the answer (400 / 404 / 503) in res
 * and nothing to release. A deleted job is a 404 for everyone. */
int64_t api_job_param(struct server *srv, http_req *req, http_res *res, int with_spec, exec_job *j);

/* A JSON integer in [lo, hi] into *out: 0, or -1 when v is not a number,
 * not whole, or out of range (*out untouched). */
int api_json_int(const cJSON *v, long lo, long hi, long *out);

#endif
