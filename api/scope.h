/* scope.h - what a token may act for beyond the routes its kind may call
 * (the route table's auth): a node's own token acts for that node only.
 * Below the handlers that check it (cluster_api.c, assignments_api.c,
 * tasks_api.c).
 *
 * defines: api_node_scope, api_own_or_admin */
#ifndef TRAINYARD_SCOPE_H
#define TRAINYARD_SCOPE_H

#include <stdint.h>
#include "../server/http.h"

/* A per-node token acts for its own node only: 0 when req may act for
 * node (any other token kind, or that node's token), else -1 after
 * answering 403 forbidden. */
int api_node_scope(const http_req *req, http_res *res, int64_t node);

/* A member acts on their own jobs (sweep 0) or sweeps (sweep 1) only; a
 * team admin, a team's own token and the admin on any of the team's. 0
 * when req may act on it; else -1 after answering 404 (not the team's),
 * 403 naming the role it needs, or 503. */
int api_own_or_admin(db *d, http_req *req, http_res *res, int sweep, int64_t id);

#endif
