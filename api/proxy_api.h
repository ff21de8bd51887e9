/* proxy_api.h - a job's web ports through the server:
 * `/proxy/jobs/{id}/{name}/...` (any method, WebSocket upgrades included)
 * forwards to the port named `name` of the job's live task (the lowest
 * task id: worker-0), as the agent reported it (storage/ports_store.h),
 * through server/proxy.h. The job's team may use it with the role the
 * method asks (a viewer reads: GET, HEAD; a member acts); another team's
 * job is 404. The caller's credentials never reach the app.
 * docs/server.md, "A job's web ports".
 *
 * api_proxy_routes: the API's daemon's (the proxy's routes and
 * POST /api/v1/jobs/{id}/proxy-session); api_proxy_app_routes: the apps'
 * daemon's (server --apps-listen: the proxy's routes alone).
 *
 * defines: api_proxy_routes, api_proxy_app_routes */
#ifndef TRAINYARD_PROXY_API_H
#define TRAINYARD_PROXY_API_H

#include "../server/http.h"

extern const route api_proxy_routes[];
extern const route api_proxy_app_routes[];

#endif
