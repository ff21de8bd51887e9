/* static.c - the dashboard's files from the table compiled into the binary.
 * See static.h. The URL of web/X is /X; anything else embedded (the OpenAPI
 * document) is reachable only through static_asset and its own route. */
#include "static.h"
#include "assets.h"
#include "../common/util.h"

#include <pthread.h>
#include <string.h>

static static_file *g_files;
static size_t g_nfiles;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static const struct {
    const char *ext;
    const char *type;
} g_types[] = {
    {".html", "text/html; charset=utf-8"},
    {".js", "text/javascript; charset=utf-8"},
    {".css", "text/css; charset=utf-8"},
    {".json", "application/json"},
    {".svg", "image/svg+xml"},
    {".png", "image/png"},
    {".ico", "image/x-icon"},
    {".txt", "text/plain; charset=utf-8"},
};

/* The content type of a file name, or NULL for an extension we do not serve. */
static const char *type_of(const char *name) {
    const char *dot = strrchr(name, '.');
    if (!dot) return NULL;
    for (size_t i = 0; i < sizeof g_types / sizeof g_types[0]; i++)
        if (strcmp(dot, g_types[i].ext) == 0) return g_types[i].type;
    return NULL;
}

static void build_table(void) {
    g_files = xcalloc(embed_assets_count + 1, sizeof *g_files);
    for (size_t i = 0; i < embed_assets_count; i++) {
        const embed_asset *a = &embed_assets[i];
        const char *type = type_of(a->path);
        if (!type) continue; /* not a kind of file we serve */
        static_file *f = &g_files[g_nfiles++];
        f->src = a->path;
        f->url = strncmp(a->path, "web/", 4) == 0 ? a->path + 3 : NULL; /* "/x" */
        f->data = a->data;
        f->len = a->len;
        f->content_type = type;
        f->is_html = strcmp(type, g_types[0].type) == 0;
        f->cache_control = strncmp(a->path, "web/vendor/", 11) == 0 ? "public, max-age=31536000, immutable"
                                                                       : "no-cache";
        char hex[65];
        sha256_hex(a->data, a->len, hex);
        sfmt(f->etag, sizeof f->etag, "\"%.20s\"", hex);
    }
}

const static_file *static_find(const char *url_path) {
    pthread_once(&g_once, build_table);
    if (!url_path) return NULL;
    if (strcmp(url_path, "/") == 0) url_path = "/index.html";
    for (size_t i = 0; i < g_nfiles; i++)
        if (g_files[i].url && strcmp(g_files[i].url, url_path) == 0) return &g_files[i];
    return NULL;
}

const static_file *static_asset(const char *src_path) {
    pthread_once(&g_once, build_table);
    for (size_t i = 0; i < g_nfiles; i++)
        if (strcmp(g_files[i].src, src_path) == 0) return &g_files[i];
    return NULL;
}
