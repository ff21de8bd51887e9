/* registry_store.h - a team's logins for container registries
 * (registry_creds): one per (team, registry host), the password sealed by
 * the caller; storage never sees it in the clear.
 *
 * defines: reg_cred, reg_cred_put, reg_cred_get, reg_cred_list, reg_cred_delete */
#ifndef TRAINYARD_REGISTRY_STORE_H
#define TRAINYARD_REGISTRY_STORE_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "db.h"

#define REG_HOST_MAX 256
#define REG_USER_MAX 256
#define REG_SEALED_MAX 1200

typedef struct reg_cred {
    char host[REG_HOST_MAX];
    char username[REG_USER_MAX];
    unsigned char sealed[REG_SEALED_MAX];
    size_t sealed_len;
    int64_t created_at;
} reg_cred;

/* Stores (or replaces) the team's login for host. *created: 1 when new.
 * STORE_OK or STORE_ERROR. */
int reg_cred_put(db *d, int64_t team_id, const char *host, const char *username, const void *sealed,
                 size_t sealed_len, int64_t now, int *created);
/* STORE_OK, STORE_NOT_FOUND or STORE_ERROR. */
int reg_cred_get(db *d, int64_t team_id, const char *host, reg_cred *out);
/* [{"registry", "username", "created_at"}] of the team (never the password). */
int reg_cred_list(db *d, int64_t team_id, cJSON **out);
/* STORE_OK, STORE_NOT_FOUND or STORE_ERROR. */
int reg_cred_delete(db *d, int64_t team_id, const char *host);

#endif
