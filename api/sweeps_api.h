/* sweeps_api.h - hyperparameter sweeps: the routes (POST/GET /sweeps, GET
 * /sweeps/{id}, POST /sweeps/{id}/cancel) and the controller the server's
 * housekeeping runs (docs/sweeps.md).
 *
 * defines: api_sweeps_routes, api_sweeps_tick */
#ifndef TRAINYARD_SWEEPS_API_H
#define TRAINYARD_SWEEPS_API_H

#include "../server/http.h"

struct server;

extern const route api_sweeps_routes[];

/* The controller's pass (server_app.tick, once a second): for at most 16
 * running sweeps (round robin), scores the trials whose jobs ended, then
 * while fewer than max_concurrent trials run, starts the next trial or
 * (ASHA) promotes one, as scheduler/sweep.c's asha_next decides from the
 * rows; ends the sweep when nothing is left. Each step is one transaction,
 * so a restarted server goes on from the rows. */
void api_sweeps_tick(struct server *srv);

#endif
