/* events_api.h - a job's timeline, /jobs/{id}/events: GET as JSON or, with
 * Accept: text/event-stream, as server-sent events (state changes, events
 * and metrics as they come); POST by the job's tasks (an image pull began,
 * ended or failed; docs/api-executors.md).
 *
 * defines: api_events_routes */
#ifndef TRAINYARD_EVENTS_API_H
#define TRAINYARD_EVENTS_API_H

#include "../server/http.h"

extern const route api_events_routes[];

#endif
