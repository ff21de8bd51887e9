/* client.h - a small HTTP client (libcurl) for the CLI, agents and workers:
 * one call = one request with a bearer token, a bounded response body.
 *
 * A client holds a list of server URLs and finds the one that leads.
 *
 * defines: client_init, client_request, client_release, client_default_url,
 *          client_default_token, client_config_token_path, client_url_list_check,
 *          client_url_at */
#ifndef TRAINYARD_CLIENT_H
#define TRAINYARD_CLIENT_H

#include <stddef.h>
#include <stdint.h>
#include "../common/util.h"

/* A client speaks to one of up to CLIENT_MAX_URLS servers (a comma-separated
 * list: several servers on one database, one of them leading; docs/cli.md
 * "Several servers"). It keeps the index of the one that last answered
 * (process-wide, per list), and moves on a connect failure or a standby's
 * 503 (client_request). */
#define CLIENT_MAX_URLS 8
#define CLIENT_FAILOVER_MS 15000     /* the default retry budget of a request over a list */

typedef struct client {
    char url[512];              /* the base in use, e.g. http://127.0.0.1:8080: the one that
                                 * last answered (the list's first until one has) */
    char urls[CLIENT_MAX_URLS][512]; /* the list, each without a trailing '/' */
    int n_urls, cur;            /* cur: urls[cur] is url */
    long failover_ms;           /* how long a request may keep moving and retrying: -1 (what
                                 * client_init sets) TRAINYARD_FAILOVER_MS, else 15000; 0 one
                                 * try of each URL, no waiting (a caller with its own backoff) */
    char idempotency_key[80];   /* sent as Idempotency-Key when set: a POST that carries one
                                 * is retried when its answer was lost */
    int attempts;               /* the HTTP attempts the last client_request made */
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

/* url: one base URL or a comma-separated list of them (spaces around the
 * commas and trailing slashes dropped). -1: an empty list, more than
 * CLIENT_MAX_URLS, a URL of 512 bytes or more (client_url_list_check says
 * which), or no libcurl handle. */
int client_init(client *c, const char *url, const char *token);

/* Checks a URL list as client_init reads it: 0 and the count in *n, or -1
 * with a one-line reason naming what (the flag or variable). */
int client_url_list_check(const char *list, const char *what, int *n, char *err, size_t errlen);

/* A fresh Idempotency-Key: a random (v4) UUID, 36 characters and a NUL.
 * Made once per submission and kept across its retries. 0, or -1 when the
 * system gives no randomness. */
int client_idempotency_key(char out[37]);

/* The i-th URL (0-based) of a list into out: 0, or -1 when there is none. */
int client_url_at(const char *list, int i, char *out, size_t outlen);

/* first's URLs, then those of more that first does not name (compared
 * without trailing slashes, case-insensitively), as a list into out; a URL
 * that would make it CLIENT_MAX_URLS + 1 long or outlen bytes is left out.
 * 0, or -1 when first alone does not fit (out is then first's copy, cut). */
int client_url_list_merge(const char *first, const char *more, char *out, size_t outlen);
void client_release(client *c);

/* Sends method path (appended to the base url) with an optional body
 * (content type JSON unless ctype given). Fills *r (release with
 * client_reply_release). Returns 0 when a response came back (any status),
 * -1 on a transport error (r->error says why).
 *
 * Over a list (two URLs or more) it moves to another URL, and tries again:
 * - on a connect failure (refused, unreachable, TLS refused, a timeout
 *   before a byte of the request went out): to the next URL;
 * - on a 503 whose JSON error is "standby": to the URL its leader (body
 *   "leader", else header X-Trainyard-Leader) names when that is in the
 *   list, else to the next. With one URL it waits on that URL the same way;
 * - on a connection lost after the request went out: only for GET, HEAD,
 *   PUT, DELETE or with c->idempotency_key set (else -1, as it may have
 *   been done), to the next URL.
 * Each URL is tried once at once; then it waits 200 ms, doubling to 1 s,
 * before each further round, for c->failover_ms in all (the last round
 * starts at its end, each connect then cut to the time left, 0.5 s at
 * least), then returns -1 with every URL and its last answer in r->error
 * ("no server of N answered as leader within S s (K tries); URL: why; ..."). Any
 * other answer (a 503 that is not a standby's: the leader's database is
 * down) comes back as it is. With one URL a transport error is returned at
 * once, as it always was. */
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

/* TRAINYARD_URL (a URL or a comma-separated list), else http://127.0.0.1:8080. */
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
