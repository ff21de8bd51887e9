/* assignments_api.h - GET /nodes/{id}/assignments: the long-poll that hands
 * an agent its tasks to start (token, cluster, devices, spec) and to stop
 * (docs/api-executors.md).
 *
 * defines: api_assignments_routes, api_assignments_node_registered */
#ifndef TRAINYARD_ASSIGNMENTS_API_H
#define TRAINYARD_ASSIGNMENTS_API_H

#include <stdint.h>
#include "../server/http.h"

extern const route api_assignments_routes[];

/* The node registered (again): its long-polls begun before now answer at
 * once with nothing, so no task is handed to an agent's previous life. */
void api_assignments_node_registered(int64_t node);

#endif
