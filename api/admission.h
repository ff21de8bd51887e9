/* admission.h - the parts of a job's submission that other API modules
 * share with POST /jobs, so a job submitted for them (a sweep's trial) is
 * admitted and stored as any other. Below the handlers that submit jobs
 * (jobs_api.c, sweeps_api.c).
 *
 * defines: api_job_admit, api_job_row, api_idempotency_key */
#ifndef TRAINYARD_ADMISSION_H
#define TRAINYARD_ADMISSION_H

#include <stddef.h>
#include "../spec/jobspec.h"
#include "../storage/store.h"
#include "../server/http.h"

struct server;

/* POST /jobs's admission of a parsed spec: the server's log cap
 * (--log-max-per-job) and whether any set of ready nodes could ever hold
 * it (unless queue_if_infeasible). 0 admitted; 1 refused, with the error's
 * code ("invalid_value", "infeasible"), field (NULL: none) and message as
 * POST /jobs answers them (a 422); -1 the database failed. */
int api_job_admit(struct server *srv, const jobspec *spec, const char **code, const char **field, char *msg,
                  size_t cap);

/* The jobs row's columns of a parsed spec (pointers into spec; sweep_id
 * and trial 0). */
void api_job_row(const jobspec *spec, store_new_job *row);

/* A submission's Idempotency-Key header (POST /jobs, POST /sweeps): a key
 * the client makes per submission (a UUID) and keeps across its retries,
 * so a retry whose first answer was lost gets the first job or sweep back.
 * 0 with *key (NULL: no header; it points into req), or -1 after answering
 * 400 invalid_value naming the header when it is not 1-255 printable ASCII
 * characters without spaces. */
int api_idempotency_key(http_req *req, http_res *res, const char **key);

#endif
