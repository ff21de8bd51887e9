/* web_api.h - what the dashboard and API clients read besides the jobs:
 * GET /api/v1/openapi.json (the API's OpenAPI 3 document, public) and
 * GET /api/v1/examples (the job specs of examples/, to start a submission
 * from). Both are compiled into the binary (server/assets.h).
 *
 * defines: api_web_routes */
#ifndef TRAINYARD_WEB_API_H
#define TRAINYARD_WEB_API_H

#include "../server/http.h"

extern const route api_web_routes[];

#endif
