/* static.c - the dashboard's files from the table compiled into the binary.
 * See static.h. The URL of web/X is /X; anything else embedded (the OpenAPI
 * document) is reachable only through static_asset and its own route.
 * web/X.gz is served as /X, gzip'd or inflated. */
#include "static.h"
#include "assets.h"
#include "../common/util.h"

#define ZLIB_CONST
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <zlib.h>

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

/* The bytes of a gzip'd file of our own build (one member; its trailer
 * says the size), NUL-terminated, or NULL when they are not that. */
static unsigned char *gunzip(const unsigned char *gz, size_t n, size_t *out_len) {
    if (n < 18) return NULL;
    size_t want = (size_t)gz[n - 4] | (size_t)gz[n - 3] << 8 | (size_t)gz[n - 2] << 16 | (size_t)gz[n - 1] << 24;
    if (want > (64u << 20) || n > UINT32_MAX) return NULL;
    unsigned char *out = xmalloc(want + 1);
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) {
        free(out);
        return NULL;
    }
    zs.next_in = gz;
    zs.avail_in = (uInt)n;
    zs.next_out = out;
    zs.avail_out = (uInt)want;
    int rc = inflate(&zs, Z_FINISH);
    size_t got = zs.total_out;
    inflateEnd(&zs);
    if (rc != Z_STREAM_END || got != want || zs.avail_in != 0) {
        free(out);
        return NULL;
    }
    out[want] = '\0';
    *out_len = want;
    return out;
}

static void build_table(void) {
    g_files = xcalloc(embed_assets_count + 1, sizeof *g_files);
    for (size_t i = 0; i < embed_assets_count; i++) {
        const embed_asset *a = &embed_assets[i];
        size_t plen = strlen(a->path);
        int gz = strncmp(a->path, "web/", 4) == 0 && plen > 3 && strcmp(a->path + plen - 3, ".gz") == 0;
        char *name = NULL;
        if (gz) { /* "web/vendor/x.js.gz": the file web/vendor/x.js */
            name = xstrdup(a->path);
            name[plen - 3] = '\0';
        }
        const char *path = gz ? name : a->path;
        const char *type = type_of(path);
        size_t len = a->len;
        const unsigned char *data = gz && type ? gunzip(a->data, a->len, &len) : a->data;
        if (!type || !data) { /* not a kind of file we serve, or not gzip'd as the Makefile does */
            if (type) log_error("static: %s is not a gzip'd file; not served", a->path);
            free(name);
            continue;
        }
        static_file *f = &g_files[g_nfiles++];
        f->src = path;
        f->url = strncmp(path, "web/", 4) == 0 ? path + 3 : NULL; /* "/x" */
        f->data = data;
        f->len = len;
        f->content_type = type;
        f->is_html = strcmp(type, g_types[0].type) == 0;
        f->cache_control = strncmp(path, "web/vendor/", 11) == 0 ? "public, max-age=31536000, immutable"
                                                                    : "no-cache";
        char hex[65];
        sha256_hex(data, len, hex);
        sfmt(f->etag, sizeof f->etag, "\"%.20s\"", hex);
        if (gz) {
            f->gz = a->data;
            f->gz_len = a->len;
            sfmt(f->gz_etag, sizeof f->gz_etag, "\"%.20s-gz\"", hex);
        }
    }
}

/* Whether a q parameter's value ("0", "0.000", "0.5", "1") is above 0. */
static int q_above_zero(const char *v) {
    while (*v == ' ' || *v == '\t') v++;
    if (*v != '0') return *v >= '1' && *v <= '9';
    v++;
    if (*v != '.') return 0;
    for (v++; *v >= '0' && *v <= '9'; v++)
        if (*v != '0') return 1;
    return 0;
}

int static_accepts_gzip(const char *ae) {
    int gzip = -1, star = -1; /* -1: not named; else whether its q is above 0 */
    for (const char *p = ae; p && *p;) {
        while (*p == ' ' || *p == '\t' || *p == ',') p++;
        const char *tok = p;
        while (*p && *p != ',' && *p != ';' && *p != ' ' && *p != '\t') p++;
        size_t n = (size_t)(p - tok);
        int ok = 1;
        while (*p && *p != ',') { /* parameters: ";q=0.5" */
            if (*p++ != ';') continue;
            while (*p == ' ' || *p == '\t') p++;
            if ((*p == 'q' || *p == 'Q') && p[1] == '=') ok = q_above_zero(p + 2);
        }
        if ((n == 4 && strncasecmp(tok, "gzip", 4) == 0) || (n == 6 && strncasecmp(tok, "x-gzip", 6) == 0))
            gzip = gzip == 1 ? 1 : ok;
        else if (n == 1 && *tok == '*')
            star = ok;
    }
    return gzip >= 0 ? gzip : star == 1;
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
