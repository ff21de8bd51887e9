/* ctxtar_none.c - stands in for common/ctxtar.c in the GPU bundle's
 * trainyard (Makefile, gpu-bundle): libarchive would bring libxml2 and ICU
 * along (35 MB more than the bundle may carry), and the bundle exists to
 * train on a GPU machine, not to take teams' code. Every context operation
 * says so instead of packing, checking or unpacking: a server of this build
 * refuses uploads (422 naming the body), an agent fails a task that names a
 * context with this reason, the CLI's --context exits 2. */
#include "../../common/ctxtar.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NONE "contexts need libarchive, which this build (the GPU bundle) leaves out"

void ctx_limits_default(ctx_limits *l) {
    l->max_files = 100000;
    l->max_unpacked = 1LL << 30;
}

int ctx_pack(const char *dir, const char *out_path, ctx_info *info, char *err, size_t errlen) {
    (void)dir, (void)out_path;
    memset(info, 0, sizeof *info);
    snprintf(err, errlen, "%s", NONE);
    return -1;
}

int ctx_check(const void *data, size_t len, const ctx_limits *lim, ctx_info *info, char *err, size_t errlen) {
    (void)data, (void)len, (void)lim;
    memset(info, 0, sizeof *info);
    snprintf(err, errlen, "%s", NONE);
    return -1;
}

int ctx_unpack(const char *tar_path, const char *dir, uid_t uid, gid_t gid, const ctx_limits *lim, char *err,
               size_t errlen) {
    (void)tar_path, (void)dir, (void)uid, (void)gid, (void)lim;
    snprintf(err, errlen, "%s", NONE);
    return -1;
}

/* No patterns: nothing is packed anyway. */
struct ctx_ignore {
    int unused;
};

ctx_ignore *ctx_ignore_parse(const char *text) {
    (void)text;
    return calloc(1, sizeof(ctx_ignore));
}

ctx_ignore *ctx_ignore_load(const char *dir) {
    (void)dir;
    return calloc(1, sizeof(ctx_ignore));
}

int ctx_ignore_match(const ctx_ignore *ig, const char *rel, int is_dir) {
    (void)ig, (void)rel, (void)is_dir;
    return 0;
}

void ctx_ignore_free(ctx_ignore *ig) { free(ig); }
