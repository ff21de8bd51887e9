/* static.h - the dashboard's files served at / from the table compiled into
 * the binary (server/assets.h): exact-match lookup only, so no request path
 * can reach a file outside the table (no directory traversal by
 * construction). Content-Type by extension, a strong ETag (sha256) with
 * If-None-Match -> 304, and cache policy by folder: web/vendor/ files carry
 * their version in their name and are cached for a year ("immutable"); the
 * others are revalidated on every use ("no-cache" + ETag).
 *
 * web/vendor/'s scripts and style sheets are embedded gzip'd (the table
 * holds "web/vendor/x.js.gz"): a client that accepts gzip gets those bytes
 * with Content-Encoding: gzip, another the file inflated once, on first use
 * of the table; each form has its own ETag, and both say Vary:
 * Accept-Encoding.
 *
 * defines: static_find, static_asset, static_accepts_gzip */
#ifndef TRAINYARD_STATIC_H
#define TRAINYARD_STATIC_H

#include <stddef.h>

typedef struct static_file {
    const char *url;                  /* "/index.html", "/vendor/..." */
    const char *src;                  /* "web/index.html" */
    const unsigned char *data;
    size_t len;
    const char *content_type;
    const char *cache_control;
    char etag[24];                    /* "\"" + 20 hex of the sha256 + "\"" */
    int is_html;                      /* gets the Content-Security-Policy */
    const unsigned char *gz;          /* the same bytes gzip'd, or NULL (then data is the embedded file) */
    size_t gz_len;
    char gz_etag[32];                 /* "\"" + 20 hex of the sha256 of data + "-gz\"" */
} static_file;

/* The file served at url_path ("/" is /index.html), or NULL. Thread-safe;
 * the table is built once, on first use, and lives as long as the process. */
const static_file *static_find(const char *url_path);

/* An embedded file by its repository path ("api/openapi.json"), or NULL. */
const static_file *static_asset(const char *src_path);

/* Whether an Accept-Encoding header value accepts gzip: "gzip" (or
 * "x-gzip", or "*") among its comma-separated codings, with no q of 0.
 * NULL (no header) does not. */
int static_accepts_gzip(const char *accept_encoding);

#endif
