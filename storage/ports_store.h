/* ports_store.h - a job's web ports: the port of its node that serves each
 * port a task's job declares (spec "ports"), as the task's agent reported it
 * with the task's start (POST /tasks/{id}/status "ports"), in task_ports
 * (migration 16). What the server's proxy reaches at /proxy/jobs/ID/NAME/
 * and the job's answer lists. Rows stay after the task exits; only live
 * tasks' rows are read.
 *
 * defines: ports_store_set, ports_store_find, ports_store_find_hit, ports_store_list */
#ifndef TRAINYARD_PORTS_STORE_H
#define TRAINYARD_PORTS_STORE_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "db.h"

/* Replaces the task's ports (n may be 0). names[i]: NUL-terminated, ports[i]
 * 1-65535 (the caller checks both). Runs in the caller's transaction when
 * one is open. STORE_OK, or STORE_ERROR (no such task, a database failure). */
int ports_store_set(db *d, int64_t task_id, const char (*names)[33], const int *ports, int n);

/* The port named `name` of the job's live task (state not 'exited'), the lowest task id first
 * (worker-0 / the interactive task): *port and host (the node's address, nodes.address),
 * STORE_OK; STORE_NOT_FOUND when none, with `have` set to the comma-separated names the job
 * declares (from its spec or its tasks' rows; "" when none). STORE_ERROR on a database
 * failure. `have` is "" after STORE_OK; a list longer than havelen is cut at a name. */
int ports_store_find(db *d, int64_t job_id, const char *name, char host[256], int *port, char *have, size_t havelen);

/* What ports_store_find_hit finds: the serving task's node address and
 * port, the task, its token's hash (tasks.token_hash, the hex SHA-256 of
 * the token it was handed; "" when none) and whether the job is a
 * notebook job (its spec's interactive.type). */
typedef struct ports_hit {
    char host[256];
    int port;
    int64_t task;
    char token_hash[65];
    int notebook;
} ports_hit;

/* ports_store_find, with the task's token hash and the job's kind: the
 * same answers, *hit filled on STORE_OK. */
int ports_store_find_hit(db *d, int64_t job_id, const char *name, ports_hit *hit, char *have, size_t havelen);

/* The ports of the job's live tasks: *out an array (the caller deletes) of
 * {"name", "task" (id), "task_name" ("worker-0"), "node" (hostname),
 * "address" (nodes.address), "port"}, by task id then name. STORE_OK or
 * STORE_ERROR. */
int ports_store_list(db *d, int64_t job_id, cJSON **out);

#endif
