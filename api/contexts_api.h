/* contexts_api.h - the contexts of command jobs: a team's code folder
 * uploaded once as a gzip'd tar and named by its jobs' `command.context`
 * (docs/command-jobs.md, "Contexts").
 *
 * defines: api_contexts_routes, api_context_check_held, api_contexts_tick */
#ifndef TRAINYARD_CONTEXTS_API_H
#define TRAINYARD_CONTEXTS_API_H

#include "../server/http.h"

struct server;

extern const route api_contexts_routes[];

/* For a submission naming context `id` ("sha256:HEX") in field (the spec's
 * command.context or interactive.context): 0 when the team holds it; else
 * -1 with the answer in res (422 invalid_value naming field when the team
 * does not, 503 when the database does not answer). */
int api_context_check_held(struct server *srv, int64_t team_id, const char *field, const char *id, http_res *res);

/* The 422 of a submission naming a context the team does not hold. */
void api_context_not_held(http_res *res, const char *field, const char *id);

/* Periodic housekeeping (server_app.tick): drops the contexts past their
 * grace (--context-grace-s) that no job to run names, with their files
 * when no team holds the same bytes. Runs the pass at most every
 * min(grace / 4, 60) seconds. */
void api_contexts_tick(struct server *srv);

#endif
