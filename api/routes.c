/* routes.c - the list of route tables the server answers, and the services
 * started with it. A new API module adds its table here. */
#include "routes.h"
#include "../server/server.h"
#include "../storage/store.h"

const route *const api_route_tables[] = {
    api_jobs_routes,
    api_teams_routes,
    NULL,
};

int api_start_services(struct server *srv, char *err, size_t errlen) {
    (void)srv;
    (void)err;
    (void)errlen;
    return 0;
}

void api_stop_services(struct server *srv) { (void)srv; }

int api_job_stop_tasks(struct server *srv, int64_t job_id, const char *why) {
    return store_job_stop_tasks(srv->db, job_id, why) == STORE_OK ? 0 : -1;
}

void api_kick_scheduler(struct server *srv) { (void)srv; }
