/* teams_api.h - what the other handlers need of teams: the check a bulk
 * write (a checkpoint, a context) passes against the server's disk reserve
 * and the team's storage quota, and a team's storage in its JSON form.
 *
 * defines: api_teams_routes, api_storage_admit, api_team_storage_json */
#ifndef TRAINYARD_TEAMS_API_H
#define TRAINYARD_TEAMS_API_H

#include <stdint.h>
#include <cjson/cJSON.h>
#include "../server/http.h"
#include "../server/server.h"

extern const route api_teams_routes[];

/* A write of len bytes of the team's `what` ("checkpoint", "context"):
 * 0 to go on, or -1 with the answer in res: 507 disk_reserve when it would
 * take the data directory's free space under --disk-reserve (for everyone);
 * past the team's storage quota, 507 storage_quota, or 413 quota_exceeded
 * (with limit_bytes) when quota_status is 413. Each message names the team,
 * its quota and its use. A database that cannot be read lets it go on. */
int api_storage_admit(server *srv, int64_t team_id, int64_t len, const char *what, int quota_status, http_res *res);

/* Adds "storage_quota" (bytes or null) and "storage_used" {logs,
 * checkpoints, contexts, total} (bytes, from the rows) to a team's JSON
 * (which has its "id"): 0, or -1 when the database cannot be read. */
int api_team_storage_json(server *srv, cJSON *team);

#endif
