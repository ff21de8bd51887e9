/* metrics_api.h - GET /metrics: the service in Prometheus text format (jobs
 * by state and team, queue length and waits per team, devices in use, nodes,
 * request latency by route, scheduler pass time, samples/s of running jobs).
 * docs/metrics.md lists every family.
 *
 * defines: api_metrics_routes */
#ifndef TRAINYARD_METRICS_API_H
#define TRAINYARD_METRICS_API_H

#include "../server/http.h"

extern const route api_metrics_routes[];

#endif
