/* oidc.h - the OpenID Connect relying party: discovery, the authorization
 * code flow with PKCE (S256), state and nonce, ID token verification
 * (JWS through cjose, keys from the provider's JWKS) and the device
 * authorization grant (RFC 8628) on the server's side. No route here: the
 * handlers call these, each a blocking call (HTTP to the provider with
 * libcurl), from an offload thread; one oidc is shared by every thread (an
 * internal mutex). docs/sso.md states what is checked and why.
 *
 * Every failure writes one line into err (ERR_MAX bytes are enough) that
 * names what failed: the URL for a request to the provider ("oidc: URL:
 * Connection refused"), the check for an ID token ("id token: aud does not
 * contain client_id 'trainyard'").
 *
 * defines: oidc, oidc_config, oidc_identity, oidc_device, OIDC_OK,
 *          OIDC_ERROR, OIDC_PENDING, OIDC_SLOW_DOWN, OIDC_DENIED,
 *          OIDC_EXPIRED, oidc_new, oidc_free, oidc_login_url,
 *          oidc_callback, oidc_verify_id_token, oidc_device_start,
 *          oidc_device_poll, oidc_username_valid */
#ifndef TRAINYARD_OIDC_H
#define TRAINYARD_OIDC_H

#include <stddef.h>
#include <stdint.h>

typedef struct oidc oidc;

typedef struct oidc_config {
    const char *issuer;        /* exactly as the provider's discovery names itself */
    const char *client_id;
    const char *client_secret;
    const char *redirect_uri;  /* our callback URL, registered with the provider */
    const char *groups_claim;  /* NULL or "": "groups" */
    int64_t skew_s;            /* clock skew allowed on exp, iat, nbf; 0: 60 */
} oidc_config;

/* Who signed in: the ID token's claims. */
typedef struct oidc_identity {
    char sub[256];
    char username[128];        /* preferred_username, a valid user name */
    char email[256];           /* "" when the token has none */
    char name[256];            /* "" when the token has none */
    int ngroups;
    char groups[64][128];      /* the groups claim, in the token's order */
} oidc_identity;

/* A device authorization started with the provider (RFC 8628, 3.2). */
typedef struct oidc_device {
    char device_code[512];     /* for oidc_device_poll; the server keeps it, never the user */
    char user_code[64];
    char verification_uri[512];
    char verification_uri_complete[1024]; /* "" when the provider gives none */
    int interval;              /* seconds between polls (5 when not given) */
    int expires_in;            /* seconds */
} oidc_device;

/* What oidc_device_poll returns (and OIDC_OK / OIDC_ERROR, everything else). */
#define OIDC_OK 0
#define OIDC_ERROR (-1)
#define OIDC_PENDING 1         /* authorization_pending: poll again after interval */
#define OIDC_SLOW_DOWN 2       /* slow_down: add 5 s to the interval (RFC 8628, 3.5) */
#define OIDC_DENIED 3          /* access_denied: the user refused */
#define OIDC_EXPIRED 4         /* expired_token: start again */

/* Discovery: GETs ISSUER/.well-known/openid-configuration (5 s timeout),
 * checks that its "issuer" is c->issuer exactly, reads the authorization,
 * token, JWKS and (optional) device authorization endpoints, the ID token
 * algs the provider signs with, whether it has a "groups" scope and how the
 * client authenticates at the token endpoint (client_secret_basic, else
 * client_secret_post); then fetches the JWKS. The config's strings are
 * copied. Returns the relying party, or NULL with one line in err naming
 * the URL and why. */
oidc *oidc_new(const oidc_config *c, char *err, size_t errlen);

/* Frees o and what it remembers (NULL: nothing). */
void oidc_free(oidc *o);

/* The provider URL to send a browser to, into url (n bytes): response_type
 * code, scope "openid profile email" (+ "groups" when the provider lists
 * that scope), client_id, redirect_uri, and a fresh state, nonce and PKCE
 * S256 code_challenge. The state (256 random bits, url-safe), its nonce,
 * code_verifier and return_to are remembered for 10 minutes and one
 * callback; 1024 logins are remembered at most (the oldest is forgotten).
 * return_to (NULL: "/") must be a path of this server: it starts with one
 * "/" (not "//" nor "/\"), has no control characters, under 1024 bytes.
 * 0, or -1 (return_to refused, url too small, no random bytes). */
int oidc_login_url(oidc *o, const char *return_to, char *url, size_t n);

/* The redirect back from the provider: takes the state (once: an unknown,
 * used or expired state is "unknown or expired state"), POSTs code and the
 * code_verifier to the token endpoint, verifies the ID token with the
 * login's nonce (oidc_verify_id_token) and fills id and return_to (rtlen
 * bytes) with the path given to oidc_login_url. 0, or -1 with err. */
int oidc_callback(oidc *o, const char *code, const char *state, oidc_identity *id, char *return_to, size_t rtlen,
                  char *err, size_t errlen);

/* Verifies an ID token (the checks in order; docs/sso.md, "ID token checks"):
 * a JWS compact serialization whose header alg is asymmetric (RS*, PS*,
 * ES*, EdDSA: "none" and HS* are refused) and one the provider lists in
 * id_token_signing_alg_values_supported; the key the header's kid names in
 * the JWKS (an unknown kid re-fetches the JWKS, at most once in 10 s), of
 * the alg's key type; the signature (cjose_jws_verify); iss is the issuer;
 * aud contains client_id, azp (when present, and required when aud has
 * several) is client_id; exp > now - skew; iat <= now + skew; nbf (when
 * present) <= now + skew; nonce equals nonce (when nonce is not NULL); a
 * nonce not seen before (each accepted token's nonce is remembered until
 * its exp, so a replayed token is refused); sub; preferred_username, a
 * valid user name (oidc_username_valid); the groups claim, when present,
 * an array of at most 64 strings. Fills id; 0, or -1 with one line in err
 * naming the check. */
int oidc_verify_id_token(oidc *o, const char *jwt, const char *nonce, oidc_identity *id, char *err, size_t errlen);

/* RFC 8628, 3.1: asks the provider's device authorization endpoint for a
 * device code (same scopes as a login), client authenticated. 0 with out
 * filled, or -1 with err (the provider has no such endpoint, it refused,
 * an answer that does not fit). */
int oidc_device_start(oidc *o, oidc_device *out, char *err, size_t errlen);

/* One poll of the token endpoint for device_code (grant_type
 * urn:ietf:params:oauth:grant-type:device_code). OIDC_OK: the ID token
 * verified (without a nonce) and id filled; OIDC_PENDING, OIDC_SLOW_DOWN,
 * OIDC_DENIED, OIDC_EXPIRED as the provider answered; OIDC_ERROR with err. */
int oidc_device_poll(oidc *o, const char *device_code, oidc_identity *id, char *err, size_t errlen);

/* 1 when s is a user name: 1 to 63 of letters, digits, '.', '_', '-'. */
int oidc_username_valid(const char *s);

#endif
