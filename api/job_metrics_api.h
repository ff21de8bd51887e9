/* job_metrics_api.h - /jobs/{id}/metrics: a job's training metrics (step,
 * epoch, test, eval), posted by its tasks and read by users, and the
 * job's progress computed from them (docs/api-executors.md). Not GET
 * /metrics, the service's own (metrics_api.h).
 *
 * defines: api_job_metrics_routes */
#ifndef TRAINYARD_JOB_METRICS_API_H
#define TRAINYARD_JOB_METRICS_API_H

#include "../server/http.h"

extern const route api_job_metrics_routes[];

#endif
