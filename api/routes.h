/* routes.h - every route table of the API, and the services the API needs
 * running beside the HTTP daemon (the scheduler loop).
 *
 * defines: api_route_tables, api_start_services, api_stop_services, api_app */
#ifndef TRAINYARD_ROUTES_H
#define TRAINYARD_ROUTES_H

#include "../server/http.h"
#include "../server/server.h"

struct server;

extern const route api_jobs_routes[];
extern const route api_teams_routes[];
extern const route api_exec_routes[];
extern const route api_registry_routes[];   /* api/registry_api.c */
extern const route api_usage_routes[];      /* api/usage_api.c */

/* NULL-terminated list of the tables above (and those of other modules). */
extern const route *const api_route_tables[];

int api_start_services(struct server *srv, char *err, size_t errlen);
void api_stop_services(struct server *srv);

/* The API as a server serves it: api_route_tables and the services. */
extern const server_app api_app;




/* Asks the tasks of a job to stop (cancel, preemption): marks its running
 * tasks 'stopping' so their agents send SIGTERM. Runs inside the caller's
 * transaction. 0 or -1. */
int api_job_stop_tasks(struct server *srv, int64_t job_id, const char *why);

/* Wakes the scheduler (after a submit, cancel, task exit, node change). */
void api_kick_scheduler(struct server *srv);
#endif
