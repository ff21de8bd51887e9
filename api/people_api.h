/* people_api.h - users, team members and their roles, personal tokens, who
 * am I, and the audit trail (docs/people.md):
 *
 *   POST   /api/v1/users                     cluster admin: a user {"name","email"}
 *   GET    /api/v1/users[/{name}]            cluster admin
 *   POST   /api/v1/users/{name}/tokens       cluster admin: a token for a user
 *   GET    /api/v1/teams/{team}/members      the team's viewers and up
 *   PUT    /api/v1/teams/{team}/members/{user}  the team's admins: {"role"}
 *   DELETE /api/v1/teams/{team}/members/{user}  the team's admins
 *   POST   /api/v1/tokens                    a person: {"name","expires_in","team"?,"scopes"?}
 *   GET    /api/v1/tokens                    a person's own tokens (never a secret)
 *   DELETE /api/v1/tokens/{id}               revoked at once
 *   GET    /api/v1/me                        who the credential speaks for
 *   GET    /api/v1/audit                     cluster admin: all; a team's admins: their team
 *
 * defines: api_people_routes */
#ifndef TRAINYARD_PEOPLE_API_H
#define TRAINYARD_PEOPLE_API_H

#include "../server/http.h"

extern const route api_people_routes[];

#endif
