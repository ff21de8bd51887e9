/* cluster_api.h - the cluster endpoints: node registration (join token;
 * answers a per-node token), heartbeats (that node token), revocation of a
 * node's token (admin), GET /cluster and GET /queue (users), and team shares
 * (admin: weight, guarantee, quota). Handlers over storage/cluster.c and
 * scheduler/scheduler.h; the route table is registered in api/routes.c.
 *
 * defines: api_cluster_routes */
#ifndef TRAINYARD_CLUSTER_API_H
#define TRAINYARD_CLUSTER_API_H

#include "../server/http.h"

extern const route api_cluster_routes[];

#endif
