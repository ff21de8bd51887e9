/* usage_api.h - who used what: GET /api/v1/usage (api/usage_api.c).
 *
 * defines: api_usage_routes */
#ifndef TRAINYARD_USAGE_API_H
#define TRAINYARD_USAGE_API_H

#include "../server/http.h"

extern const route api_usage_routes[];

#endif
