/* auth_api.h - single sign-on's routes (docs/sso.md): the dashboard's
 * sign-in through the OpenID Provider (a session cookie), its sign-out, and
 * the device flow `trainyard login` runs against this server, which keeps
 * the client secret and the provider's device code to itself:
 *
 *   GET  /auth/login[?return_to=/path]   302 to the provider's login page
 *   GET  /auth/callback?code&state       the provider's redirect back: a session
 *                                        (Set-Cookie trainyard_session) and 302
 *   POST /auth/logout                    the session (or bearer token) revoked
 *   POST /api/v1/auth/device             a device login started: {user_code, ...,
 *                                        device: an opaque handle}
 *   POST /api/v1/auth/device/token       {device}: RFC 8628's pending answers, or
 *                                        201 {token, user, expires_at}
 *
 * Without --oidc-issuer, or while the provider cannot be reached (retried
 * at most once per 30 s, at a sign-in), these answer 503 with the reason;
 * token users are never affected.
 *
 * defines: api_auth_routes, api_auth_start, AUTH_DEVICE_MAX */
#ifndef TRAINYARD_AUTH_API_H
#define TRAINYARD_AUTH_API_H

#include <stddef.h>
#include "../server/http.h"

struct server;

/* Device logins in progress at once (the oldest expired are dropped first). */
#define AUTH_DEVICE_MAX 256

extern const route api_auth_routes[];

/* Reads the client secret and makes the relying party (oidc_new: discovery
 * and keys). A provider that cannot be reached is logged in one line (its
 * URL and why) and retried later: the server starts anyway. -1 with err
 * only for a secret file that cannot be read or holds no secret; 0 when
 * single sign-on is not configured. Call once, after the server's URL is
 * known (server_serve's app start). */
int api_auth_start(struct server *srv, char *err, size_t errlen);

#endif
