/* rendezvous_api.h - /jobs/{id}/rendezvous/{key}: values put by a job's
 * tasks (up to 64 KiB each), scoped to the attempt, and read with ?wait=S
 * (docs/api-executors.md).
 *
 * defines: api_rendezvous_routes */
#ifndef TRAINYARD_RENDEZVOUS_API_H
#define TRAINYARD_RENDEZVOUS_API_H

#include "../server/http.h"

extern const route api_rendezvous_routes[];

#endif
