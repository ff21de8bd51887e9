/* routes.h - every route table of the API, and the services the API needs
 * running beside the HTTP daemon (the scheduler loop).
 *
 * defines: api_route_tables, api_start_services, api_stop_services, api_app */
#ifndef TRAINYARD_ROUTES_H
#define TRAINYARD_ROUTES_H

#include "../server/http.h"
#include "../server/server.h"

struct server;

/* NULL-terminated list of the route tables, each declared in its handler's
 * header (jobs_api.h, teams_api.h, ...). */
extern const route *const api_route_tables[];

int api_start_services(struct server *srv, char *err, size_t errlen);
void api_stop_services(struct server *srv);

/* The API as a server serves it: api_route_tables and the services. */
extern const server_app api_app;

#endif
