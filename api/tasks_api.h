/* tasks_api.h - POST /tasks/{id}/status: an agent's report that a task runs
 * or has exited, with its exit code, signal, reason and log tail
 * (docs/api-executors.md).
 *
 * defines: api_tasks_routes */
#ifndef TRAINYARD_TASKS_API_H
#define TRAINYARD_TASKS_API_H

#include "../server/http.h"

extern const route api_tasks_routes[];

#endif
