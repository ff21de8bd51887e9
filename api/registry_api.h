/* registry_api.h - a team's logins for private container registries
 * (api/registry_api.c; docs/command-jobs.md, "Images").
 *
 * defines: api_registry_routes */
#ifndef TRAINYARD_REGISTRY_API_H
#define TRAINYARD_REGISTRY_API_H

#include "../server/http.h"

extern const route api_registry_routes[];

#endif
