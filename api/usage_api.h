/* usage_api.h - who used what: GET /api/v1/usage (api/usage_api.c).
 *
 * defines: api_usage_routes, api_time_arg, api_wants_csv */
#ifndef TRAINYARD_USAGE_API_H
#define TRAINYARD_USAGE_API_H

#include "../server/http.h"

extern const route api_usage_routes[];

/* A time of the query (key) into *ms: an ISO 8601 date or time (UTC
 * unless it has an offset) or ms since the epoch. 0 absent, 1 given, -1
 * after answering 422 naming the key. */
int api_time_arg(http_req *req, http_res *res, const char *key, int64_t *ms);

/* 1 when the request asks for CSV (Accept names text/csv). */
int api_wants_csv(http_req *req);

#endif
