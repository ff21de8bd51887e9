/* routes.c - the list of route tables the server answers, and the services
 * started with it. A new API module adds its table here. */
#include "routes.h"

#include <stdio.h>

#include "cluster_api.h"
#include "metrics_api.h"
#include "web_api.h"
#include "../server/server.h"
#include "../scheduler/lifecycle.h"
#include "../scheduler/scheduler.h"
#include "../storage/store.h"

const route *const api_route_tables[] = {
    api_jobs_routes,
    api_teams_routes,
    api_exec_routes,
    api_cluster_routes,
    api_metrics_routes,
    api_web_routes,
    NULL,
};

/* A pass placed or stopped tasks: the long-polls of the nodes given tasks
 * look at once (every node's when n < 0). */
static void wake_agents(void *cls, const int64_t *nodes, int n) {
    struct server *srv = cls;
    if (n < 0) http_wake(srv->http, HTTP_WAKE_NODE, 0);
    for (int i = 0; i < n; i++) http_wake(srv->http, HTTP_WAKE_NODE, nodes[i]);
}

int api_start_services(struct server *srv, char *err, size_t errlen) {
    sched_config cfg;
    sched_config_default(&cfg);
    cfg.on_change = wake_agents;
    cfg.on_change_cls = srv;
    if (srv->opt.heartbeat_timeout_s > 0) cfg.heartbeat_timeout_ms = (int64_t)srv->opt.heartbeat_timeout_s * 1000;
    if (srv->opt.resize_interval_s >= 0) cfg.resize_interval_ms = (int64_t)srv->opt.resize_interval_s * 1000;
    if (sched_start(srv->db, &cfg) < 0) {
        snprintf(err, errlen, "cannot start the scheduler thread");
        return -1;
    }
    return 0;
}

void api_stop_services(struct server *srv) {
    srv->stopping = 1; /* long-polls and event streams end so the daemon can stop */
    sched_stop();
}

int api_job_stop_tasks(struct server *srv, int64_t job_id, const char *why) {
    /* tasks never handed out to an agent are closed at once: no agent would report them */
    if (lifecycle_stop_tasks(srv->db, job_id, why) != STORE_OK) return -1;
    http_wake(srv->http, HTTP_WAKE_NODE, 0); /* the agents running the others stop them now */
    return 0;
}

void api_kick_scheduler(struct server *srv) {
    (void)srv;
    sched_kick();
}

const server_app api_app = {api_route_tables, api_start_services, api_stop_services};
