/* routes.c - the list of route tables the server answers, and the services
 * started with it. A new API module adds its table here. */
#include "routes.h"

#include <stdio.h>

#include "activity.h"
#include "assignments_api.h"
#include "auth_api.h"
#include "backup_api.h"
#include "blobs_api.h"
#include "checkpoints_api.h"
#include "cluster_api.h"
#include "contexts_api.h"
#include "events_api.h"
#include "exec_api.h"
#include "job_metrics_api.h"
#include "jobs_api.h"
#include "logs_api.h"
#include "metrics_api.h"
#include "people_api.h"
#include "proxy_api.h"
#include "registry_api.h"
#include "rendezvous_api.h"
#include "retention_api.h"
#include "sweeps_api.h"
#include "tasks_api.h"
#include "teams_api.h"
#include "usage_api.h"
#include "web_api.h"
#include "../server/server.h"
#include "../scheduler/scheduler.h"

const route *const api_route_tables[] = {
    api_jobs_routes,
    api_teams_routes,
    api_assignments_routes,
    api_tasks_routes,
    api_events_routes,
    api_job_metrics_routes,
    api_logs_routes,
    api_checkpoints_routes,
    api_rendezvous_routes,
    api_cluster_routes,
    api_metrics_routes,
    api_web_routes,
    api_contexts_routes,
    api_registry_routes,
    api_usage_routes,
    api_sweeps_routes,
    api_people_routes,
    api_proxy_routes,
    api_exec_routes,
    api_auth_routes,
    api_backup_routes,
    api_blobs_routes,
    NULL,
};

/* A commit gave these nodes tasks to start or stop (the scheduler's
 * placements, a stop of a job's tasks by a preemption, a cancel or a gang's
 * end): their agents' parked long-polls look at once (db_wake_node). */
static void wake_agents(void *cls, const int64_t *nodes, int n) {
    struct server *srv = cls;
    if (n < 0) http_wake(srv->http, HTTP_WAKE_NODE, 0);
    else http_wake_many(srv->http, HTTP_WAKE_NODE, nodes, n);
}

int api_start_services(struct server *srv, char *err, size_t errlen) {
    db_set_wake_hook(srv->db, wake_agents, srv);
    if (api_auth_start(srv, err, errlen) < 0) return -1; /* a provider not reached is no error: retried later */
    sched_config cfg;
    sched_config_default(&cfg);
    if (srv->opt.heartbeat_timeout_s > 0) cfg.heartbeat_timeout_ms = (int64_t)srv->opt.heartbeat_timeout_s * 1000;
    if (srv->opt.resize_interval_s >= 0) cfg.resize_interval_ms = (int64_t)srv->opt.resize_interval_s * 1000;
    if (sched_start(srv->db, &cfg) < 0) {
        snprintf(err, errlen, "cannot start the scheduler thread");
        return -1;
    }
    if (api_sweeps_start(srv) < 0) {
        sched_stop();
        snprintf(err, errlen, "cannot start the sweeps' controller thread");
        return -1;
    }
    return 0;
}

void api_stop_services(struct server *srv) {
    srv->stopping = 1; /* long-polls and event streams end so the daemon can stop */
    api_sweeps_stop();
    sched_stop();
    api_backup_stop(srv); /* a periodic backup under way ends first */
}

/* The server's periodic housekeeping: contexts past their grace; what
 * finished jobs leave on the disk (logs past the retention, checkpoints
 * beyond the newest and the best, files of deleted jobs). (The sweeps'
 * controller has a thread of its own, api_sweeps_start: a trial's job may
 * be requeued while a pass of the retention runs, which is safe because
 * the collection keeps a job's newest checkpoint in the transaction that
 * marks the others, and a requeued attempt reads the newest before it
 * uploads one of its own.) And jobs idle past their idle_timeout
 * cancelled (api/activity.h). */
static void api_tick(struct server *srv) {
    api_activity_tick(srv); /* idle jobs cancelled */
    api_contexts_tick(srv);
    api_retention_tick(srv);
    api_backup_tick(srv); /* starts a due periodic backup on a thread of its own */
    api_blobs_tick(srv); /* checkpoint uploads past --blob-upload-max-age aborted */
}

/* The apps' daemon (server --apps-listen): a job's web ports only. */
static const route *const api_apps_route_tables[] = {
    api_proxy_app_routes,
    NULL,
};

const server_app api_app = {api_route_tables, api_apps_route_tables, api_start_services, api_stop_services, api_tick};
