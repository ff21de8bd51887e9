/* dataroot.c - data.path confined to the agent's data roots (realpath and
 * a prefix check on whole components). See dataroot.h. */
#include "dataroot.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../../common/util.h"

int data_path_has_dotdot(const char *path) {
    for (const char *p = path; *p;) {
        size_t len = strcspn(p, "/");
        if (len == 2 && p[0] == '.' && p[1] == '.') return 1;
        p += len;
        while (*p == '/') p++;
    }
    return 0;
}

/* 1 when the resolved path is the root or lies under it (whole components). */
static int under(const char *resolved, const char *root) {
    size_t n = strlen(root);
    if (n == 1 && root[0] == '/') return 1;
    return strncmp(resolved, root, n) == 0 && (resolved[n] == '\0' || resolved[n] == '/');
}

/* The realpaths of the roots that exist: 0 or more, into rr. */
static int roots_real(const char *root, char rr[2][PATH_MAX]) {
    int n = 0;
    if (realpath(root && *root ? root : ".", rr[n])) n++;
    if (realpath(DATAROOT_SYSTEM, rr[n])) n++;
    return n;
}

static int inside(const char *resolved, char rr[2][PATH_MAX], int nr) {
    for (int i = 0; i < nr; i++)
        if (under(resolved, rr[i])) return 1;
    return 0;
}

int data_path_confine(const char *path, const char *root, char *out, size_t cap, char *err, size_t errlen) {
    const char *shown_root = root && *root ? root : "the agent's working directory";
    if (data_path_has_dotdot(path)) {
        snprintf(err, errlen, "data.path '%.120s' has a '..' component: it must stay under the agent's data roots",
                 path);
        return -1;
    }
    char cand[PATH_MAX];
    if (sfmt(cand, sizeof cand, "%s%s%s", path[0] == '/' ? "" : (root && *root ? root : "."),
             path[0] == '/' ? "" : "/", path) < 0) {
        snprintf(err, errlen, "data.path '%.120s' is too long", path);
        return -1;
    }
    char resolved[PATH_MAX];
    if (!realpath(cand, resolved)) {
        snprintf(err, errlen, "data.path '%.120s': cannot open %.160s: %s", path, cand, strerror(errno));
        return -1;
    }
    char rr[2][PATH_MAX];
    int nr = roots_real(root, rr);
    if (!inside(resolved, rr, nr)) {
        snprintf(err, errlen,
                 "data.path '%.120s' resolves to %.160s, outside the agent's data roots (%.120s, %s); "
                 "a symlink may not lead out of them",
                 path, resolved, shown_root, DATAROOT_SYSTEM);
        return -1;
    }
    struct stat sb;
    if (stat(resolved, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        /* an IDX directory: its files are opened by name, so each symlink among them is checked too */
        DIR *d = opendir(resolved);
        if (!d) {
            snprintf(err, errlen, "data.path '%.120s': cannot list %.160s: %s", path, resolved, strerror(errno));
            return -1;
        }
        struct dirent *e;
        int bad = 0;
        while (!bad && (e = readdir(d))) {
            if (e->d_type != DT_LNK && e->d_type != DT_UNKNOWN) continue;
            char ent[PATH_MAX], real[PATH_MAX];
            if (sfmt(ent, sizeof ent, "%s/%s", resolved, e->d_name) < 0) continue;
            if (!realpath(ent, real)) continue; /* dangling: the loader will say it cannot open it */
            if (!inside(real, rr, nr)) {
                snprintf(err, errlen,
                         "data.path '%.120s': %.100s resolves to %.160s, outside the agent's data roots "
                         "(%.120s, %s); a symlink may not lead out of them",
                         path, e->d_name, real, shown_root, DATAROOT_SYSTEM);
                bad = 1;
            }
        }
        closedir(d);
        if (bad) return -1;
    }
    if (sfmt(out, cap, "%s", resolved) < 0) {
        snprintf(err, errlen, "data.path '%.120s' is too long once resolved", path);
        return -1;
    }
    return 0;
}
