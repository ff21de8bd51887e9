/* jobs_api.h - health and the job endpoints: submit, list, get, cancel and
 * delete (api/jobs_api.c; the job's timeline is events_api.h). What other
 * API modules share with POST /jobs (a sweep's trials) is admission.h.
 *
 * defines: api_jobs_routes */
#ifndef TRAINYARD_JOBS_API_H
#define TRAINYARD_JOBS_API_H

#include "../server/http.h"

extern const route api_jobs_routes[];

#endif
