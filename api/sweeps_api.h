/* sweeps_api.h - hyperparameter sweeps: the routes (POST/GET /sweeps, GET
 * /sweeps/{id}, POST /sweeps/{id}/cancel, and POST /jobs/{id}/rung, an ASHA
 * trial's question at the end of a rung) and the controller that turns
 * trials into jobs, on a thread of its own (docs/sweeps.md).
 *
 * defines: api_sweeps_routes, api_sweeps_start, api_sweeps_stop, api_sweeps_kick,
 *          api_sweeps_trial_config */
#ifndef TRAINYARD_SWEEPS_API_H
#define TRAINYARD_SWEEPS_API_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "../server/http.h"

struct server;

extern const route api_sweeps_routes[];

/* Starts the controller's thread: it makes a pass at once, then whenever
 * kicked (api_sweeps_kick) and at least once a second. A pass, for at most
 * 16 running sweeps (round robin), scores the trials whose jobs ended,
 * then while fewer than max_concurrent trials run, starts the next trial
 * or (ASHA) promotes one, as scheduler/sweep.c's asha_next decides from the
 * rows; ends the sweep when nothing is left. Each step is one transaction,
 * so a restarted server goes on from the rows. 0, or -1 when the thread
 * cannot start. */
int api_sweeps_start(struct server *srv);

/* Stops the thread (after the pass it is in). Safe when it never started. */
void api_sweeps_stop(void);

/* A job changed state (a trial's may have ended): a pass now rather than at
 * the next second. Safe from any thread, cheap; kicks during a pass make one
 * more pass. */
void api_sweeps_kick(void);

/* What a task of job job_id needs to know of its sweep, added to its
 * config (docs/api-executors.md): for a trial running in a running ASHA
 * sweep, "sweep": {"id", "trial", "max_epochs"}, and its worker asks
 * POST /jobs/{id}/rung at the end of each rung short of max_epochs. 1
 * added, 0 not such a trial, -1 on a database error (nothing added). */
int api_sweeps_trial_config(struct server *srv, int64_t job_id, cJSON *config);

#endif
