/* logs_api.h - /jobs/{id}/logs: a task's output, posted by its agent as raw
 * text (bounded by the disk reserve, the job's log cap and the team's
 * quota) and read by users from an offset, with X-Next-Offset
 * (docs/api-executors.md).
 *
 * defines: api_logs_routes */
#ifndef TRAINYARD_LOGS_API_H
#define TRAINYARD_LOGS_API_H

#include "../server/http.h"

extern const route api_logs_routes[];

#endif
