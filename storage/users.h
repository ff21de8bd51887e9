/* users.h - people: users, their roles in teams (members), their personal
 * access tokens and dashboard sessions (user_tokens), and the audit trail.
 *
 * A user is a name (letters, digits, '.', '_', '-'; 1-63, starting with a
 * letter or digit) with an email, made by the cluster admin ('admin') or
 * on a first single sign-on ('oidc'). A membership gives a user one role
 * in one team; a membership from the provider's groups claim ('oidc') is
 * replaced on every sign-in, one set through the API ('api') only by the
 * API. Personal tokens ("typ_..." + 43 random characters) and sessions
 * ("tys_...") are stored as sha256 only, each with an expiry; a session
 * also keeps its CSRF token's sha256. Roles are read on every request
 * (members_role): a membership removed refuses the user's next request.
 *
 * Codes as store_base.h.
 *
 * defines: users_name_ok, users_create, users_find, users_signed_in, users_list, users_get,
 *          members_put, members_delete, members_role, members_list, members_teams,
 *          members_only_team, members_sync, utok_create, utok_lookup, utok_csrf_of, utok_csrf_ok,
 *          utok_list, utok_revoke, utok_revoke_value, utok_touch */
#ifndef TRAINYARD_USERS_H
#define TRAINYARD_USERS_H

#include <stdint.h>
#include <cjson/cJSON.h>
#include "db.h"
#include "store.h"
#include "../common/util.h"

#define USER_TOKEN_PREFIX "typ_"
#define SESSION_PREFIX "tys_"
#define UTOK_LEN 48                  /* prefix + 43 characters + NUL, rounded */

/* 1 when s is a user name (see above). */
int users_name_ok(const char *s);

/* ---------------------------------------------------------------- users */
/* A new user: STORE_CONFLICT when the name is taken. source: "admin" | "oidc". */
int users_create(db *d, const char *name, const char *email, const char *source, int64_t *id);
int users_find(db *d, const char *name, int64_t *id);
/* A single sign-on of name: the user, made ('oidc') when new (*created 1),
 * its email and last_login_at updated. */
int users_signed_in(db *d, const char *name, const char *email, int64_t *id, int *created);
cJSON *users_list(db *d);                 /* NULL on error */
cJSON *users_get(db *d, int64_t id);      /* NULL when none */

/* ---------------------------------------------------------------- members */
/* Sets the user's role in the team (source "api" | "oidc"); *created 1
 * when the user was no member before. */
int members_put(db *d, int64_t team_id, int64_t user_id, team_role role, const char *source, int *created);
int members_delete(db *d, int64_t team_id, int64_t user_id);   /* STORE_NOT_FOUND: no member */
/* The user's role in the team: ROLE_NONE when not a member (STORE_OK). */
int members_role(db *d, int64_t team_id, int64_t user_id, team_role *role);
cJSON *members_list(db *d, int64_t team_id);  /* [{"user","email","role","source","since"}] */
cJSON *members_teams(db *d, int64_t user_id); /* [{"team","role","source"}] */
/* The user's team when they are in exactly one: STORE_OK; STORE_NOT_FOUND
 * for none, STORE_CONFLICT for several. */
int members_only_team(db *d, int64_t user_id, int64_t *team_id, char team[64], team_role *role);

/* What a sign-in's groups claim gives: a role in a team by name. */
typedef struct member_grant {
    char team[64];
    team_role role;
} member_grant;
/* Makes the user's 'oidc' memberships exactly these (one transaction of
 * the caller's, or its own when none is open): teams that do not exist
 * are skipped (*skipped counts them); an 'api' membership of the same
 * team is left as it is. */
int members_sync(db *d, int64_t user_id, const member_grant *g, int n, int *skipped);

/* ---------------------------------------------------------------- tokens and sessions */
typedef struct utok_new {
    int session;                 /* 1: a dashboard session */
    const char *name;            /* the token's name (a session's: "dashboard") */
    int64_t team_id;             /* bound to one team; 0: any of the user's */
    unsigned scopes;             /* SCOPE_READ | SCOPE_WRITE */
    const char *via;             /* "api", "oidc", "device" */
    int64_t expires_at;          /* ms; required */
} utok_new;
/* Makes a token or session and stores its hash: token gets the secret,
 * *id its id. */
int utok_create(db *d, int64_t user_id, const utok_new *n, char token[UTOK_LEN], int64_t *id);
/* The person a token or session value speaks for (kind TOKEN_USER, team
 * not chosen): STORE_OK; STORE_EXPIRED (who filled); STORE_NOT_FOUND
 * (unknown, revoked); STORE_ERROR. */
int utok_lookup(db *d, const char *token, principal *who);
/* A session's CSRF token: sha256 of "csrf:" and the session's secret, so
 * only who holds the cookie (HttpOnly: the page's own requests) can know
 * it, and nothing more is stored. utok_csrf_ok compares in constant time. */
void utok_csrf_of(const char *session, char out[65]);
int utok_csrf_ok(const char *session, const char *csrf);
/* The user's personal tokens (not sessions), newest first, never the
 * secret: [{"id","name","team","scopes","via","created_at","expires_at","last_used_at","revoked_at"}]. */
cJSON *utok_list(db *d, int64_t user_id);
/* Revokes a token or session of the user (user_id 0: anyone's):
 * STORE_NOT_FOUND when no live one has that id. */
int utok_revoke(db *d, int64_t user_id, int64_t id);
int utok_revoke_value(db *d, const char *token); /* by its secret (a sign-out) */
/* Notes a use (token_use), at most once a minute a token. */
void utok_touch(db *d, int64_t token_id);

#endif
