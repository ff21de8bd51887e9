/* static.h - the dashboard's files served at / from the table compiled into
 * the binary (server/assets.h): exact-match lookup only, so no request path
 * can reach a file outside the table (no directory traversal by
 * construction). Content-Type by extension, a strong ETag (sha256) with
 * If-None-Match -> 304, and cache policy by folder: web/vendor/ files carry
 * their version in their name and are cached for a year ("immutable"); the
 * others are revalidated on every use ("no-cache" + ETag).
 *
 * defines: static_find, static_asset */
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
} static_file;

/* The file served at url_path ("/" is /index.html), or NULL. Thread-safe;
 * the table is built once, on first use, and lives as long as the process. */
const static_file *static_find(const char *url_path);

/* An embedded file by its repository path ("api/openapi.json"), or NULL. */
const static_file *static_asset(const char *src_path);

#endif
