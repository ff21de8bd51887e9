/* stats.h - read-only aggregate queries over the store, for GET /metrics
 * (jobs by state and team, queue length and waits, devices in use, nodes,
 * training rate of running jobs) and the dashboard's job list (strategy and
 * progress beside each job). Pure SQL: no HTTP, no scheduling decisions.
 *
 * defines: stats_row, stats_query */
#ifndef TRAINYARD_STATS_H
#define TRAINYARD_STATS_H

#include <stdint.h>
#include <cjson/cJSON.h>

#include "db.h"

/* One aggregate row; which fields mean what depends on the query. */
typedef struct stats_row {
    char team[64];                    /* team name, or "" */
    char key[16];                     /* a state or a device kind, or "" */
    int64_t id;                       /* a job or team id, or 0 */
    double v[3];
} stats_row;

typedef enum stats_kind {
    STATS_TEAMS,          /* team, id = team id */
    STATS_JOBS,           /* team, key = state, v0 = jobs */
    STATS_QUEUE,          /* team (every team), v0 = queued jobs, v1 = longest wait s, v2 = sum of waits s */
    STATS_DEVICES,        /* key = kind, v0 = devices on ready nodes, v1 = of which allocated */
    STATS_DEVICES_TEAM,   /* team, key = kind, v0 = devices allocated to the team's jobs */
    STATS_NODES,          /* key = node state, v0 = nodes, v1 = memory they offer (MiB),
                           * v2 = memory their live tasks hold (MiB) */
    STATS_RUNNING,        /* team, id = job, v0 = samples/s, v1 = step, v2 = fraction done (running jobs) */
} stats_kind;

/* Runs one aggregate query at time now_ms. *out (malloc'd, caller frees;
 * NULL when *n is 0) gets *n rows. 0, or -1 on a store error. */
int stats_query(db *d, stats_kind kind, int64_t now_ms, stats_row **out, int *n);


#endif
