/* checkpoints_api.h - /jobs/{id}/checkpoints: upload (PUT, with
 * X-Checksum-Sha256), list, the newest and one by id (docs/api-executors.md).
 *
 * defines: api_checkpoints_routes */
#ifndef TRAINYARD_CHECKPOINTS_API_H
#define TRAINYARD_CHECKPOINTS_API_H

#include "../server/http.h"

extern const route api_checkpoints_routes[];

#endif
