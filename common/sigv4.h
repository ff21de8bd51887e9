/* sigv4.h - AWS Signature Version 4 for S3 (service "s3"), ours, on the
 * HMAC-SHA256 and SHA-256 of common/util: presigned URLs (X-Amz-* query,
 * UNSIGNED-PAYLOAD) and header-signed requests (Authorization with
 * x-amz-date and x-amz-content-sha256). docs/storage.md, "Blob stores",
 * says what a presigned URL binds.
 *
 * Paths, query names and values are given unencoded; the signer encodes
 * them once (each byte outside A-Z a-z 0-9 - _ . ~ as %XX; '/' kept in the
 * path only) and sorts the query by encoded name, then value. Every
 * function returns 0, or -1 when an argument is bad or out does not hold
 * the result (out is then ""). Nothing here logs anything; the secret is
 * only read.
 *
 * defines: sigv4_presign, sigv4_authorize, sigv4_query_string,
 *          sigv4_canonical_request, sigv4_signing_key, sigv4_uri_encode,
 *          sigv4_amz_date */
#ifndef TRAINYARD_SIGV4_H
#define TRAINYARD_SIGV4_H

#include <stddef.h>
#include <time.h>

#define SIGV4_UNSIGNED "UNSIGNED-PAYLOAD"
#define SIGV4_EMPTY_SHA256 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

typedef struct sigv4_creds {
    const char *akid;   /* access key id */
    const char *secret; /* secret access key */
    const char *token;  /* session token or NULL: X-Amz-Security-Token / x-amz-security-token */
    const char *region; /* "us-east-1" */
} sigv4_creds;

typedef struct sigv4_req {
    const char *method;              /* "GET" "PUT" "POST" "HEAD" "DELETE" */
    const char *host;                /* as sent: "127.0.0.1:7480" (a port only when not the default) */
    const char *path;                /* unencoded: "/bucket/checkpoints/12/2-ab.safetensors" */
    const char *const *query;        /* "name=value" unencoded, NULL-terminated ("uploads=" for a bare one); NULL: none */
    const char *const *headers;      /* "name:value" besides host and x-amz-*, NULL-terminated; NULL: none */
    const char *payload_hash;        /* 64 hex, or NULL: UNSIGNED-PAYLOAD */
    time_t now;
    int expires_s;                   /* presign: 1..604800 */
} sigv4_req;

/* The whole query of a presigned URL: r's own parameters and the X-Amz-*
 * ones, encoded and sorted, then "&X-Amz-Signature=HEX". The URL is
 * scheme://host + sigv4_uri_encode(path, 1) + "?" + query_out. Signed
 * headers: host and r->headers (e.g. "content-md5:..."), which the user of
 * the URL must send as signed. */
int sigv4_presign(const sigv4_creds *c, const sigv4_req *r, char *query_out, size_t cap);

/* The Authorization header's value ("AWS4-HMAC-SHA256 Credential=...,
 * SignedHeaders=...,Signature=...") for a request that sends r->headers and
 * also x-amz-date: amz_date (written here), x-amz-content-sha256:
 * r->payload_hash (UNSIGNED-PAYLOAD when NULL) and, with a session token,
 * x-amz-security-token. r->headers must not name those (nor host). */
int sigv4_authorize(const sigv4_creds *c, const sigv4_req *r, char *auth_out, size_t cap, char amz_date[17]);

/* r's query as sent: encoded, sorted, joined by '&' ("" when none). */
int sigv4_query_string(const sigv4_req *r, char *out, size_t cap);

/* Exposed for tests. extra_query / extra_headers (NULL-terminated or NULL)
 * are added to r's; host is always signed. */
int sigv4_canonical_request(const sigv4_req *r, const char *const *extra_query, const char *const *extra_headers,
                            char *out, size_t cap, char *signed_headers, size_t sh_cap);
/* date8: "YYYYMMDD" */
int sigv4_signing_key(const char *secret, const char *date8, const char *region, unsigned char key[32]);
int sigv4_uri_encode(const char *in, int keep_slash, char *out, size_t cap);
/* "YYYYMMDDTHHMMSSZ" of t (UTC). */
void sigv4_amz_date(time_t t, char out[17]);

#endif
