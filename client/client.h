/* client.h - a small HTTP client (libcurl) for the CLI, agents and workers:
 * one call = one request with a bearer token, a bounded response body.
 *
 * defines: client_init, client_request, client_release, client_default_url,
 *          client_default_token, client_config_token_path */
#ifndef TRAINYARD_CLIENT_H
#define TRAINYARD_CLIENT_H

#include <stddef.h>
#include <stdint.h>
#include "../common/util.h"

typedef struct client {
    char url[512];              /* base, e.g. http://127.0.0.1:8080 */
    char token[256];
    long timeout_ms;            /* whole request; default 30000 */
    void *curl;                 /* CURL*, reused for keep-alive */
    char accept[64];            /* an Accept header for client_request when set ("text/csv") */
    char team[64];              /* the team a person's request acts in (Trainyard-Team), when set */
    int (*abort_cb)(void *ctx); /* client_download: polled while it runs (about 1/s and on each
                                 * block); non-zero stops the transfer ("cancelled") */
    void *abort_ctx;
    int stall_s;                /* client_download: each request fails after this long without
                                 * a byte (a stopped server or store); 0: 60 */
} client;

typedef struct client_reply {
    long status;                /* HTTP status; 0 when the server was not reached */
    buf body;                   /* response body (bounded) */
    char error[1400];           /* transport error when status == 0 */
} client_reply;

int client_init(client *c, const char *url, const char *token);
void client_release(client *c);

/* Sends method path (appended to the base url) with an optional body
 * (content type JSON unless ctype given). Fills *r (release with
 * client_reply_release). Returns 0 when a response came back (any status),
 * -1 on a transport error (r->error says why). */
int client_request(client *c, const char *method, const char *path, const char *body, size_t body_len,
                   const char *ctype, client_reply *r);
void client_reply_release(client_reply *r);

/* Downloads GET path into the file at out_path (written to a temporary name
 * beside it, renamed when complete). *status gets the HTTP status; sha_hdr
 * (65 bytes) the X-Checksum-Sha256 header or "", sha_got (65) the sha256 of
 * the bytes, loc (locn bytes) the Location header or "", *size the bytes.
 * A 307 (the bytes are in a blob store) is followed: its Location (up to
 * 4 KiB) is fetched WITHOUT the token or the team header, sha_hdr is the
 * 307's X-Checksum-Sha256, loc the store's URL without its query, *status
 * the store's answer; a 403 from the store (the URL expired) asks the server
 * again, once. A request that moves no byte for c->stall_s is a transport
 * error.
 * On a status >= 400 the error body is kept in err_body (bounded) and no
 * file is left. Returns 0 when a response came back, -1 on a transport or
 * file error (err says why), or when c->abort_cb stopped it (err
 * "cancelled"; no file is left). */
int client_download(client *c, const char *path, const char *out_path, long *status, char sha_hdr[65],
                    char sha_got[65], char *loc, size_t locn, uint64_t *size, buf *err_body, char *err,
                    size_t errlen);

/* ---------------------------------------------------------------- TLS
 * Every request of a process goes to https:// URLs with verification on
 * (libcurl's default; never turned off but for client_trust_pinned's one
 * fetch). The CA trusted is the one given here, process-wide, before the
 * process starts requests; none given: the system's store. Each returns 0,
 * or -1 with a one-line reason in err. */

/* Trusts the CA in the PEM file path (what: the flag or variable that named it). */
int client_trust_ca_file(const char *path, const char *what, char *err, size_t errlen);

/* Trusts the CA in pem (n bytes). */
int client_trust_ca_pem(const char *pem, size_t n, const char *what, char *err, size_t errlen);

/* From the environment: TRAINYARD_CA_PEM (the CA's PEM text: what an agent
 * hands its workers), else TRAINYARD_CA (a file); neither: nothing. */
int client_trust_from_env(char *err, size_t errlen);

/* As kubeadm's join: fetches GET url/api/v1/tls/ca without verifying the
 * server, checks that the sha256 of its public key is pin ("sha256:HEX"),
 * and then trusts it (every later request verifies the server with it).
 * A different CA is refused, naming both hashes. */
int client_trust_pinned(const char *url, const char *pin, char *err, size_t errlen);

/* The trusted CA's PEM text, or NULL for the system's store. */
const char *client_trusted_ca(void);

/* Sets the trusted CA on a libcurl handle (after curl_easy_reset). */
void client_tls_apply(void *curl);

/* TRAINYARD_URL, else http://127.0.0.1:8080. */
void client_default_url(char *out, size_t outlen);

/* The first of: TRAINYARD_TOKEN; the file TRAINYARD_TOKEN_FILE names
 * (when set, that file or an error); ./.trainyard/token; the token
 * `trainyard login` stored (client_config_token_path). Returns 0 or -1
 * with a message in err. */
int client_default_token(char *out, size_t outlen, char *err, size_t errlen);

/* Where `trainyard login` keeps its token: $XDG_CONFIG_HOME/trainyard/token,
 * else $HOME/.config/trainyard/token. 0, or -1 (no HOME, a path too long). */
int client_config_token_path(char *out, size_t n);

#endif
