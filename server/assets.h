/* assets.h - files compiled into the binary at build time (the dashboard's
 * web/ folder and api/openapi.json): scripts/embed_assets.sh writes the
 * table into BUILD/gen/assets.c. server/static.c serves them.
 *
 * defines: embed_asset, embed_assets, embed_assets_count */
#ifndef TRAINYARD_ASSETS_H
#define TRAINYARD_ASSETS_H

#include <stddef.h>

typedef struct embed_asset {
    const char *path;                 /* as in the repository: "web/index.html"; NULL ends */
    const unsigned char *data;        /* the bytes, NUL-terminated (not counted in len) */
    size_t len;
} embed_asset;

extern const embed_asset embed_assets[];
extern const size_t embed_assets_count;

#endif
