/* cluster_api.h - the cluster endpoints: node registration (join token;
 * answers a per-node token), heartbeats (that node token), revocation of a
 * node's token (admin), GET /cluster and GET /queue (users), and team shares
 * (admin: weight, guarantee, quota). Handlers over storage/cluster.c and
 * scheduler/scheduler.h; the route table is registered in api/routes.c.
 *
 * defines: api_cluster_routes, api_node_scope */
#ifndef TRAINYARD_CLUSTER_API_H
#define TRAINYARD_CLUSTER_API_H

#include "../server/http.h"

extern const route api_cluster_routes[];

/* A per-node token acts for its own node only: 0 when req may act for
 * node (any other token kind, or that node's token), else -1 after
 * answering 403 forbidden. */
int api_node_scope(const http_req *req, http_res *res, int64_t node);

#endif
