/* ctxtar.c - a job's context as a gzip'd tar: packed by the CLI, checked by
 * the server, unpacked by the agent (ctxtar.h says what each promises).
 *
 * Every name is checked twice over: entry by entry as the archive streams
 * (absolute, `..`, types, limits, duplicates, a path through an earlier
 * link or file) and, once all entries are known, each symbolic link is
 * followed through the archive's own links the way the kernel would follow
 * it in the unpacked tree, so a chain of links that each look harmless
 * (`s -> .`, `t -> s/s/..`) cannot lead out either. Unpacking never follows
 * a link of the tree it writes: every path is walked from the target's
 * directory with O_NOFOLLOW, files are created O_EXCL, so even an archive
 * that got past the checks cannot write outside it. */
#include "ctxtar.h"
#include "util.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define CTX_NAME_MAX 4095            /* a path's bytes, as PATH_MAX less the NUL */
#define CTX_NAMES_MAX (64ll << 20)   /* all names together: what the checks hold in memory */
#define CTX_HEADER_SLACK 8192        /* decompressed bytes per entry beyond its data (headers, padding) */
#define CTX_LINK_HOPS 40             /* links followed in one resolution, as the kernel's ELOOP */
#define CTX_LINK_WORK (256ll << 20)  /* bytes of path compared while following links, all links together */

void ctx_limits_default(ctx_limits *l) {
    l->max_files = 100000;
    l->max_unpacked = 1ll << 30;
    l->cancel = NULL;
    l->cancel_ctx = NULL;
}

static int cancelled(const ctx_limits *l) { return l && l->cancel && l->cancel(l->cancel_ctx); }

static void seterr(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void seterr(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || !errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* A name for a message: control bytes shown as '?', cut at 200 bytes, so
 * a hostile name cannot forge lines in a log or a terminal. */
static const char *shown(const char *s, char out[208]) {
    size_t n = 0;
    for (; s && *s && n < 200; s++) out[n++] = ((unsigned char)*s < 0x20 || *s == 0x7f) ? '?' : *s;
    if (s && *s) {
        out[n++] = '.';
        out[n++] = '.';
        out[n++] = '.';
    }
    out[n] = '\0';
    return out;
}

/* ================================================================ .trainyardignore */

typedef struct ig_pat {
    char *pat;      /* without the `!`, the leading `/` and the trailing `/` */
    int negate;
    int dir_only;
    int anchored;   /* matched against the whole path, else against the last name */
} ig_pat;

struct ctx_ignore {
    ig_pat *p;
    size_t n, cap;
};

/* A `[...]` class at p (just after the `[`) against c: 1 match, 0 no match,
 * -1 not a class (no closing `]`: the `[` is then an ordinary character).
 * *end gets the byte after the `]`. */
static int class_match(const char *p, unsigned char c, const char **end) {
    int neg = 0, hit = 0;
    if (*p == '!' || *p == '^') {
        neg = 1;
        p++;
    }
    const char *start = p;
    while (*p && (*p != ']' || p == start)) {
        unsigned char lo = (unsigned char)*p;
        if (lo == '\\' && p[1]) lo = (unsigned char)*++p;
        p++;
        unsigned char hi = lo;
        if (p[0] == '-' && p[1] && p[1] != ']') {
            hi = (unsigned char)p[1];
            if (hi == '\\' && p[2]) hi = (unsigned char)*++p;
            p += 2;
        }
        if (c >= lo && c <= hi) hit = 1;
    }
    if (*p != ']') return -1;
    *end = p + 1;
    return hit != neg && c != '/';
}

/* Glob p against s: `*` and `?` stay within a name, `**` between slashes
 * (or at an end) crosses any number of names. budget bounds the work of a
 * pattern with many stars against a long path. */
static int glob_match(const char *p, const char *s, long *budget) {
    while (*p) {
        if (--*budget < 0) return 0;
        if (p[0] == '*' && p[1] == '*' && (p[2] == '/' || p[2] == '\0')) {
            /* `**` only counts as such at a name's start */
            if (p[2] == '\0') return 1; /* a trailing double star (or one alone): all below */
            /* a double star and a slash: zero or more leading names */
            for (const char *t = s;; t++) {
                if (glob_match(p + 3, t, budget)) return 1;
                t = strchr(t, '/');
                if (!t) return 0;
            }
        }
        if (*p == '*') {
            while (*p == '*') p++;
            for (const char *t = s;; t++) {
                if (glob_match(p, t, budget)) return 1;
                if (*t == '\0' || *t == '/') return 0;
            }
        }
        if (*s == '\0') return 0;
        if (*p == '?') {
            if (*s == '/') return 0;
            p++;
            s++;
            continue;
        }
        if (*p == '[') {
            const char *end = NULL;
            int m = class_match(p + 1, (unsigned char)*s, &end);
            if (m >= 0) {
                if (!m) return 0;
                p = end;
                s++;
                continue;
            }
        }
        if (*p == '\\' && p[1]) p++;
        if (*p != *s) return 0;
        p++;
        s++;
    }
    return *s == '\0';
}

/* `**` that is not a whole name (`a**b`) is an ordinary star, as in git:
 * glob_match's check of the following byte only knows what follows, so a
 * `**` must also start a name to be taken as such. */
static void plain_stars(char *pat) {
    for (char *q = pat; *q; q++) {
        if (*q == '\\' && q[1]) {
            q++;
            continue;
        }
        if (q[0] == '*' && q[1] == '*' && q != pat && q[-1] != '/') {
            /* collapse the run to one star: the same match, never a `**` */
            char *r = q + 1;
            while (*r == '*') r++;
            memmove(q + 1, r, strlen(r) + 1);
        }
    }
}

static void ig_add(ctx_ignore *ig, const char *line, size_t len) {
    char *s = xstrndup(line, len);
    size_t n = strlen(s);
    if (n && s[n - 1] == '\r') s[--n] = '\0';
    /* trailing spaces go unless escaped with a backslash */
    while (n && s[n - 1] == ' ') {
        size_t bs = 0;
        while (bs + 1 < n && s[n - 2 - bs] == '\\') bs++;
        if (bs % 2) break;
        s[--n] = '\0';
    }
    char *p = s;
    if (*p == '\0' || *p == '#') {
        free(s);
        return;
    }
    ig_pat pat = {0};
    if (*p == '!') {
        pat.negate = 1;
        p++;
    } else if (p[0] == '\\' && (p[1] == '!' || p[1] == '#')) {
        p++;
    }
    n = strlen(p);
    if (n && p[n - 1] == '/' && (n < 2 || p[n - 2] != '\\')) {
        pat.dir_only = 1;
        p[--n] = '\0';
    }
    if (strchr(p, '/')) pat.anchored = 1;
    if (*p == '/') p++;
    if (*p == '\0') {
        free(s);
        return;
    }
    pat.pat = xstrdup(p);
    free(s);
    plain_stars(pat.pat);
    if (ig->n == ig->cap) {
        ig->cap = ig->cap ? ig->cap * 2 : 16;
        ig->p = xrealloc(ig->p, ig->cap * sizeof *ig->p);
    }
    ig->p[ig->n++] = pat;
}

ctx_ignore *ctx_ignore_parse(const char *text) {
    ctx_ignore *ig = xcalloc(1, sizeof *ig);
    const char *s = text ? text : "";
    while (*s) {
        const char *e = strchr(s, '\n');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        ig_add(ig, s, len);
        s += len;
        if (*s == '\n') s++;
    }
    return ig;
}

ctx_ignore *ctx_ignore_load(const char *dir) {
    char path[PATH_MAX];
    if (sfmt(path, sizeof path, "%s/.trainyardignore", dir) < 0) return ctx_ignore_parse("");
    size_t len = 0;
    char *text = file_read_all(path, 1u << 20, &len);
    ctx_ignore *ig = ctx_ignore_parse(text ? text : "");
    free(text);
    return ig;
}

int ctx_ignore_match(const ctx_ignore *ig, const char *rel, int is_dir) {
    if (!ig || !rel) return 0;
    const char *base = strrchr(rel, '/');
    base = base ? base + 1 : rel;
    int out = 0;
    for (size_t i = 0; i < ig->n; i++) {
        const ig_pat *p = &ig->p[i];
        if (p->dir_only && !is_dir) continue;
        long budget = 1L << 20;
        if (glob_match(p->pat, p->anchored ? rel : base, &budget)) out = !p->negate;
    }
    return out;
}

void ctx_ignore_free(ctx_ignore *ig) {
    if (!ig) return;
    for (size_t i = 0; i < ig->n; i++) free(ig->p[i].pat);
    free(ig->p);
    free(ig);
}

/* ================================================================ the tree of names */
/* Every name of an archive (and every directory its names imply), in a hash
 * table, for the checks that need the whole tree. */

enum { T_DIR = 1, T_IMPLICIT, T_REG, T_HARD, T_LINK };

typedef struct tnode {
    char *path;         /* normalized: no leading `/`, no `.` or empty names, no trailing `/` */
    char *target;       /* T_LINK: the link's text; T_HARD: the normalized target */
    int type;
} tnode;

typedef struct tree {
    tnode *n;
    size_t len, cap;
    size_t *slot;       /* open addressing: index + 1, 0 empty */
    size_t nslot;
    int64_t name_bytes;
    int64_t link_work;
} tree;

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}

static void tree_free(tree *t) {
    for (size_t i = 0; i < t->len; i++) {
        free(t->n[i].path);
        free(t->n[i].target);
    }
    free(t->n);
    free(t->slot);
    memset(t, 0, sizeof *t);
}

/* The node named by the n bytes at s, or NULL. */
static tnode *tree_find(tree *t, const char *s, size_t n) {
    if (!t->nslot) return NULL;
    size_t mask = t->nslot - 1;
    for (size_t i = hash_bytes(s, n) & mask;; i = (i + 1) & mask) {
        size_t v = t->slot[i];
        if (!v) return NULL;
        tnode *x = &t->n[v - 1];
        if (strlen(x->path) == n && memcmp(x->path, s, n) == 0) return x;
    }
}

static void tree_rehash(tree *t, size_t nslot) {
    free(t->slot);
    t->slot = xcalloc(nslot, sizeof *t->slot);
    t->nslot = nslot;
    for (size_t k = 0; k < t->len; k++) {
        size_t mask = nslot - 1, i = hash_bytes(t->n[k].path, strlen(t->n[k].path)) & mask;
        while (t->slot[i]) i = (i + 1) & mask;
        t->slot[i] = k + 1;
    }
}

static tnode *tree_add(tree *t, const char *s, size_t n, int type) {
    if (t->len == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 64;
        t->n = xrealloc(t->n, t->cap * sizeof *t->n);
    }
    tnode *x = &t->n[t->len++];
    x->path = xstrndup(s, n);
    x->target = NULL;
    x->type = type;
    t->name_bytes += (int64_t)n + 1;
    if (t->len * 2 > t->nslot) tree_rehash(t, t->nslot ? t->nslot * 2 : 128);
    else {
        size_t mask = t->nslot - 1, i = hash_bytes(s, n) & mask;
        while (t->slot[i]) i = (i + 1) & mask;
        t->slot[i] = t->len;
    }
    return x;
}

/* Normalizes an archive name into out (no `.` or empty names, no trailing
 * `/`). -1 with err for an absolute name, a `..`, one too long. The root
 * itself (".", "./") normalizes to "". */
static int norm_name(const char *name, char *out, size_t cap, const char *what, char *err, size_t errlen) {
    char sh[208];
    if (!name || !*name) {
        seterr(err, errlen, "%s: an entry with an empty name", what);
        return -1;
    }
    if (name[0] == '/') {
        seterr(err, errlen, "%s '%s': an absolute path is not allowed", what, shown(name, sh));
        return -1;
    }
    if (strlen(name) > CTX_NAME_MAX) {
        seterr(err, errlen, "%s '%s': a name longer than %d bytes", what, shown(name, sh), CTX_NAME_MAX);
        return -1;
    }
    size_t o = 0;
    for (const char *p = name; *p;) {
        const char *e = strchr(p, '/');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == 2 && p[0] == '.' && p[1] == '.') {
            seterr(err, errlen, "%s '%s': a '..' component is not allowed", what, shown(name, sh));
            return -1;
        }
        if (len > NAME_MAX) {
            seterr(err, errlen, "%s '%s': a name of more than %d bytes", what, shown(name, sh), NAME_MAX);
            return -1;
        }
        if (len && !(len == 1 && p[0] == '.')) {
            if (o + len + 2 > cap) {
                seterr(err, errlen, "%s '%s': too long", what, shown(name, sh));
                return -1;
            }
            if (o) out[o++] = '/';
            memcpy(out + o, p, len);
            o += len;
        }
        p += len;
        if (*p == '/') p++;
    }
    out[o] = '\0';
    return 0;
}

/* Checks a link's text as the link at path would be followed, without
 * other links: empty, absolute, or climbing above the root are refused. */
static int link_lexical(const char *path, const char *target, char *err, size_t errlen) {
    char sh[208], sh2[208];
    if (!target || !*target) {
        seterr(err, errlen, "entry '%s': a symbolic link with an empty target", shown(path, sh));
        return -1;
    }
    if (target[0] == '/') {
        seterr(err, errlen, "entry '%s': a symbolic link to the absolute path '%s' leads out of the archive",
               shown(path, sh), shown(target, sh2));
        return -1;
    }
    long depth = 0;
    for (const char *p = path; *p; p++)
        if (*p == '/') depth++;
    for (const char *p = target; *p;) {
        const char *e = strchr(p, '/');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == 2 && p[0] == '.' && p[1] == '.') {
            if (--depth < 0) {
                seterr(err, errlen, "entry '%s': a symbolic link to '%s' leads out of the archive", shown(path, sh),
                       shown(target, sh2));
                return -1;
            }
        } else if (len && !(len == 1 && p[0] == '.')) {
            depth++;
        }
        p += len;
        if (*p == '/') p++;
    }
    return 0;
}

/* Adds an entry of the given type after the streaming checks: not twice,
 * not below an entry that is not a directory, not a directory of earlier
 * entries turned into something else. Implied directories are added (and
 * counted in *entries, against max_files). */
static int tree_enter(tree *t, const char *path, int type, int64_t *entries, int64_t max_files, char *err,
                      size_t errlen) {
    char sh[208], sh2[208];
    size_t n = strlen(path);
    tnode *x = tree_find(t, path, n);
    if (x) {
        if (x->type == T_IMPLICIT && type == T_DIR) {
            x->type = T_DIR;
            return 0;
        }
        if (x->type == T_IMPLICIT)
            seterr(err, errlen, "entry '%s': the name is a directory of earlier entries", shown(path, sh));
        else
            seterr(err, errlen, "entry '%s': the name appears twice", shown(path, sh));
        return -1;
    }
    /* the parents, nearest first, until one is known (its own parents were
     * checked when it was entered) */
    size_t cut = n;
    for (;;) {
        while (cut > 0 && path[cut - 1] != '/') cut--;
        if (cut == 0) break;
        size_t plen = cut - 1;
        tnode *p = tree_find(t, path, plen);
        if (p) {
            if (p->type != T_DIR && p->type != T_IMPLICIT) {
                char pp[CTX_NAME_MAX + 1];
                memcpy(pp, path, plen);
                pp[plen] = '\0';
                seterr(err, errlen, "entry '%s': its path passes through '%s', which is a %s", shown(path, sh),
                       shown(pp, sh2), p->type == T_LINK ? "symbolic link" : "file");
                return -1;
            }
            break;
        }
        cut = plen;
    }
    /* now enter the missing parents, then the name */
    for (size_t i = 0; i < n; i++) {
        if (path[i] != '/' || tree_find(t, path, i)) continue;
        if (++*entries > max_files) {
            seterr(err, errlen, "entry '%s': more than %lld entries (with the directories it implies)",
                   shown(path, sh), (long long)max_files);
            return -1;
        }
        tree_add(t, path, i, T_IMPLICIT);
    }
    if (t->name_bytes > CTX_NAMES_MAX) {
        seterr(err, errlen, "entry '%s': the names take more than %lld MiB", shown(path, sh),
               (long long)(CTX_NAMES_MAX >> 20));
        return -1;
    }
    tree_add(t, path, n, type);
    return 0;
}

/* Follows the link text target from the directory held in p (plen bytes) as
 * the kernel would in the unpacked tree, through the archive's own links.
 * A name the archive does not have is taken as a directory: what the
 * program later makes there is its own. 0, -1 when the path climbs above
 * the root (or grows too long), -2 when the links loop (or take too long
 * to follow). */
static int follow(tree *t, char *p, size_t plen, const char *target, int *hops) {
    if (target[0] == '/') return -1;
    for (const char *s = target; *s;) {
        const char *e = strchr(s, '/');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        if (len == 2 && s[0] == '.' && s[1] == '.') {
            if (plen == 0) return -1;
            while (plen > 0 && p[plen - 1] != '/') plen--;
            if (plen > 0) plen--;
        } else if (len && !(len == 1 && s[0] == '.')) {
            if (plen + len + 2 > CTX_NAME_MAX + 1) return -1;
            size_t at = plen;
            if (plen) p[plen++] = '/';
            memcpy(p + plen, s, len);
            plen += len;
            t->link_work += (int64_t)plen;
            if (t->link_work > CTX_LINK_WORK) return -2;
            tnode *x = tree_find(t, p, plen);
            if (x && x->type == T_LINK) {
                if (++*hops > CTX_LINK_HOPS) return -2;
                char *next = xstrdup(x->target);
                int rc = follow(t, p, at, next, hops);
                free(next);
                if (rc < 0) return rc;
                plen = strlen(p); /* follow() leaves p NUL-ended at where the link led */
            }
        }
        s += len;
        if (*s == '/') s++;
    }
    p[plen] = '\0';
    return 0;
}

/* The whole-tree check: every symbolic link, followed through the others,
 * stays within the root. */
static int tree_check_links(tree *t, char *err, size_t errlen, const char *dir) {
    char p[CTX_NAME_MAX + 2], sh[208], sh2[208], sh3[208];
    for (size_t i = 0; i < t->len; i++) {
        tnode *x = &t->n[i];
        if (x->type != T_LINK) continue;
        size_t plen = strlen(x->path);
        while (plen > 0 && x->path[plen - 1] != '/') plen--;
        if (plen > 0) plen--;
        memcpy(p, x->path, plen);
        p[plen] = '\0';
        int hops = 0;
        int rc = follow(t, p, plen, x->target, &hops);
        if (rc < 0) {
            if (rc == -2)
                seterr(err, errlen, "%s'%s': its links loop or take too long to follow", dir ? "" : "entry ",
                       shown(x->path, sh));
            else if (dir)
                seterr(err, errlen, "'%s' is a link that leads out of %s (to %s)", shown(x->path, sh),
                       shown(dir, sh2), shown(x->target, sh3));
            else
                seterr(err, errlen, "entry '%s': a symbolic link to '%s' leads out of the archive (through its links)",
                       shown(x->path, sh), shown(x->target, sh2));
            return -1;
        }
    }
    return 0;
}

/* ================================================================ packing */

typedef struct packer {
    struct archive *a;
    int out_fd;
    sha256_stream sha;
    int64_t written;
    dev_t skip_dev;             /* the archive being written, when inside dir */
    ino_t skip_ino;
    const char *dir;
    ctx_ignore *ig;
    ctx_info info;
    tree t;
    char *err;
    size_t errlen;
} packer;

static la_ssize_t pack_write_cb(struct archive *a, void *cd, const void *data, size_t n) {
    packer *pk = cd;
    const char *p = data;
    size_t left = n;
    while (left) {
        ssize_t w = write(pk->out_fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            archive_set_error(a, errno ? errno : EIO, "cannot write the archive: %s", strerror(errno ? errno : EIO));
            return -1;
        }
        p += w;
        left -= (size_t)w;
    }
    sha256_stream_update(&pk->sha, data, n);
    pk->written += (int64_t)n;
    return (la_ssize_t)n;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int pack_header(packer *pk, struct archive_entry *e) {
    if (archive_write_header(pk->a, e) != ARCHIVE_OK) {
        seterr(pk->err, pk->errlen, "cannot write the archive: %s", archive_error_string(pk->a));
        return -1;
    }
    return 0;
}

static struct archive_entry *pack_entry(const char *rel, const struct stat *st, mode_t type) {
    struct archive_entry *e = archive_entry_new();
    if (!e) {
        fprintf(stderr, "out of memory\n");
        abort();
    }
    archive_entry_set_pathname(e, rel);
    archive_entry_set_filetype(e, type);
    archive_entry_set_perm(e, st->st_mode & 0777);
    archive_entry_set_uid(e, 0);
    archive_entry_set_gid(e, 0);
    archive_entry_set_mtime(e, st->st_mtim.tv_sec, 0);
    return e;
}

static int pack_file(packer *pk, int dfd, const char *name, const char *rel) {
    char sh[208];
    int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        seterr(pk->err, pk->errlen, "cannot read '%s': %s", shown(rel, sh), fd < 0 ? strerror(errno) : "changed while packed");
        if (fd >= 0) close(fd);
        return -1;
    }
    struct archive_entry *e = pack_entry(rel, &st, AE_IFREG);
    archive_entry_set_size(e, st.st_size);
    int rc = pack_header(pk, e);
    archive_entry_free(e);
    int64_t got = 0;
    char *b = rc == 0 ? xmalloc(1 << 16) : NULL;
    while (rc == 0) {
        ssize_t r = read(fd, b, 1 << 16);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            seterr(pk->err, pk->errlen, "cannot read '%s': %s", shown(rel, sh), strerror(errno));
            rc = -1;
            break;
        }
        if (r == 0) break;
        if (got + r > st.st_size) break;
        if (archive_write_data(pk->a, b, (size_t)r) != r) {
            seterr(pk->err, pk->errlen, "cannot write the archive: %s", archive_error_string(pk->a));
            rc = -1;
            break;
        }
        got += r;
    }
    free(b);
    close(fd);
    if (rc == 0 && got != st.st_size) {
        seterr(pk->err, pk->errlen, "'%s' changed while it was packed", shown(rel, sh));
        rc = -1;
    }
    pk->info.unpacked += got;
    return rc;
}

static int pack_dir(packer *pk, int dfd, const char *prefix, int depth) {
    char sh[208];
    if (depth > 256) {
        seterr(pk->err, pk->errlen, "'%s': folders nested more than 256 deep", shown(prefix, sh));
        return -1;
    }
    int fd2 = dup(dfd);
    DIR *d = fd2 >= 0 ? fdopendir(fd2) : NULL;
    if (!d) {
        seterr(pk->err, pk->errlen, "cannot list '%s': %s", prefix[0] ? shown(prefix, sh) : pk->dir, strerror(errno));
        if (fd2 >= 0) close(fd2);
        return -1;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    errno = 0;
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 32;
            names = xrealloc(names, cap * sizeof *names);
        }
        names[n++] = xstrdup(de->d_name);
    }
    closedir(d);
    if (n) qsort(names, n, sizeof *names, cmp_str);
    int rc = 0;
    char *rel = xmalloc(PATH_MAX);
    for (size_t i = 0; i < n && rc == 0; i++) {
        if (sfmt(rel, PATH_MAX, "%s%s%s", prefix, prefix[0] ? "/" : "", names[i]) < 0) {
            seterr(pk->err, pk->errlen, "'%s/%s': the path is too long", shown(prefix, sh), names[i]);
            rc = -1;
            break;
        }
        struct stat st;
        if (fstatat(dfd, names[i], &st, AT_SYMLINK_NOFOLLOW) < 0) {
            seterr(pk->err, pk->errlen, "cannot read '%s': %s", shown(rel, sh), strerror(errno));
            rc = -1;
            break;
        }
        if (st.st_dev == pk->skip_dev && st.st_ino == pk->skip_ino) continue;
        int is_dir = S_ISDIR(st.st_mode);
        if (ctx_ignore_match(pk->ig, rel, is_dir)) continue;
        int64_t ignore_count = 0;
        if (S_ISREG(st.st_mode)) {
            rc = tree_enter(&pk->t, rel, T_REG, &ignore_count, INT64_MAX, pk->err, pk->errlen);
            if (rc == 0) rc = pack_file(pk, dfd, names[i], rel);
            pk->info.files++;
        } else if (is_dir) {
            rc = tree_enter(&pk->t, rel, T_DIR, &ignore_count, INT64_MAX, pk->err, pk->errlen);
            struct archive_entry *e = rc == 0 ? pack_entry(rel, &st, AE_IFDIR) : NULL;
            if (e) {
                rc = pack_header(pk, e);
                archive_entry_free(e);
            }
            int sub = rc == 0 ? openat(dfd, names[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) : -1;
            if (rc == 0 && sub < 0) {
                seterr(pk->err, pk->errlen, "cannot open '%s': %s", shown(rel, sh), strerror(errno));
                rc = -1;
            }
            if (rc == 0) rc = pack_dir(pk, sub, rel, depth + 1);
            if (sub >= 0) close(sub);
        } else if (S_ISLNK(st.st_mode)) {
            char target[PATH_MAX];
            ssize_t tl = readlinkat(dfd, names[i], target, sizeof target - 1);
            if (tl < 0) {
                seterr(pk->err, pk->errlen, "cannot read the link '%s': %s", shown(rel, sh), strerror(errno));
                rc = -1;
                break;
            }
            target[tl] = '\0';
            char ignored[512];
            if (link_lexical(rel, target, ignored, sizeof ignored) < 0) {
                char sh2[208], sh3[208];
                seterr(pk->err, pk->errlen, "'%s' is a link that leads out of %s (to %s)", shown(rel, sh),
                       shown(pk->dir, sh2), shown(target, sh3));
                rc = -1;
                break;
            }
            rc = tree_enter(&pk->t, rel, T_LINK, &ignore_count, INT64_MAX, pk->err, pk->errlen);
            if (rc == 0) pk->t.n[pk->t.len - 1].target = xstrdup(target);
            struct archive_entry *e = rc == 0 ? pack_entry(rel, &st, AE_IFLNK) : NULL;
            if (e) {
                archive_entry_set_perm(e, 0777);
                archive_entry_set_symlink(e, target);
                rc = pack_header(pk, e);
                archive_entry_free(e);
            }
        } else {
            const char *what = S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISSOCK(st.st_mode) ? "a socket" : "a device";
            seterr(pk->err, pk->errlen, "'%s' is %s: a context holds only files, folders and symbolic links",
                   shown(rel, sh), what);
            rc = -1;
        }
        pk->info.entries++;
    }
    free(rel);
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    return rc;
}

int ctx_pack(const char *dir, const char *out_path, ctx_info *info, char *err, size_t errlen) {
    char sh[208];
    packer pk;
    memset(&pk, 0, sizeof pk);
    pk.dir = dir;
    pk.err = err;
    pk.errlen = errlen;
    pk.out_fd = -1;
    if (info) memset(info, 0, sizeof *info);
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
        seterr(err, errlen, "cannot open the folder %s: %s", shown(dir, sh), strerror(errno));
        return -1;
    }
    /* an ignore file that cannot be read is an error, not an empty list:
     * packing what it meant to leave out could send secrets */
    char tmp[PATH_MAX];
    size_t ilen = 0;
    char *itext = NULL;
    if (sfmt(tmp, sizeof tmp, "%s/.trainyardignore", dir) == 0) {
        itext = file_read_all(tmp, 1u << 20, &ilen);
        if (!itext && errno != ENOENT) {
            seterr(err, errlen, "cannot read %s: %s", shown(tmp, sh), errno == EFBIG ? "larger than 1 MiB" : strerror(errno));
            close(dfd);
            return -1;
        }
    }
    pk.ig = ctx_ignore_parse(itext);
    free(itext);
    if (sfmt(tmp, sizeof tmp, "%s.tmp.XXXXXX", out_path) < 0) {
        seterr(err, errlen, "%s: the path is too long", shown(out_path, sh));
        ctx_ignore_free(pk.ig);
        close(dfd);
        return -1;
    }
    pk.out_fd = mkostemp(tmp, O_CLOEXEC); /* 0600 */
    if (pk.out_fd < 0) {
        seterr(err, errlen, "cannot create %s: %s", shown(tmp, sh), strerror(errno));
        ctx_ignore_free(pk.ig);
        close(dfd);
        return -1;
    }
    struct stat ost;
    if (fstat(pk.out_fd, &ost) == 0) {
        pk.skip_dev = ost.st_dev;
        pk.skip_ino = ost.st_ino;
    }
    int rc = -1;
    if (sha256_stream_init(&pk.sha) < 0) {
        seterr(err, errlen, "cannot start a sha256");
        goto out;
    }
    pk.a = archive_write_new();
    if (!pk.a) {
        seterr(err, errlen, "out of memory");
        goto out;
    }
    /* pax only where ustar cannot say it (long or non-ASCII names); gzip
     * without its time stamp: the same files give the same bytes */
    if (archive_write_set_format_pax_restricted(pk.a) != ARCHIVE_OK ||
        archive_write_add_filter_gzip(pk.a) != ARCHIVE_OK ||
        archive_write_set_options(pk.a, "gzip:!timestamp") != ARCHIVE_OK ||
        archive_write_set_bytes_per_block(pk.a, 10240) != ARCHIVE_OK ||
        archive_write_set_bytes_in_last_block(pk.a, 1) != ARCHIVE_OK ||
        archive_write_open(pk.a, &pk, NULL, pack_write_cb, NULL) != ARCHIVE_OK) {
        seterr(err, errlen, "cannot start the archive: %s", archive_error_string(pk.a));
        goto out;
    }
    if (pack_dir(&pk, dfd, "", 0) < 0) goto out;
    if (tree_check_links(&pk.t, err, errlen, dir) < 0) goto out;
    if (archive_write_close(pk.a) != ARCHIVE_OK) {
        seterr(err, errlen, "cannot finish the archive: %s", archive_error_string(pk.a));
        goto out;
    }
    if (fsync(pk.out_fd) < 0) {
        seterr(err, errlen, "cannot write %s: %s", shown(tmp, sh), strerror(errno));
        goto out;
    }
    rc = 0;
out:
    if (pk.a) archive_write_free(pk.a);
    char hex[65] = "";
    if (pk.sha.ctx) sha256_stream_final(&pk.sha, hex);
    if (close(pk.out_fd) < 0 && rc == 0) {
        seterr(err, errlen, "cannot write %s: %s", shown(tmp, sh), strerror(errno));
        rc = -1;
    }
    if (rc == 0 && rename(tmp, out_path) < 0) {
        seterr(err, errlen, "cannot rename %s to %s: %s", tmp, shown(out_path, sh), strerror(errno));
        rc = -1;
    }
    if (rc < 0) unlink(tmp);
    close(dfd);
    ctx_ignore_free(pk.ig);
    tree_free(&pk.t);
    if (rc == 0 && info) {
        *info = pk.info;
        info->packed = pk.written;
        memcpy(info->sha256, hex, sizeof info->sha256);
    }
    return rc;
}

/* ================================================================ reading */

typedef struct unpacker unpacker;

/* One pass over an opened archive: every check, and (with u) every entry
 * written. */
static int unpack_entry(unpacker *u, struct archive *a, struct archive_entry *e, const char *path, int type,
                        const char *target, char *err, size_t errlen, int64_t *data_left);
static int unpack_finish(unpacker *u, char *err, size_t errlen);

static struct archive *reader_new(char *err, size_t errlen) {
    struct archive *a = archive_read_new();
    if (!a) {
        seterr(err, errlen, "out of memory");
        return NULL;
    }
    /* zlib inside libarchive only: never an outside gzip program */
    if (archive_read_support_filter_gzip(a) != ARCHIVE_OK || archive_read_support_format_tar(a) != ARCHIVE_OK) {
        seterr(err, errlen, "this build's libarchive cannot read gzip'd tars by itself");
        archive_read_free(a);
        return NULL;
    }
    return a;
}

static int walk(struct archive *a, const ctx_limits *lim_in, ctx_info *info, unpacker *u, char *err, size_t errlen) {
    ctx_limits lim;
    if (lim_in) lim = *lim_in;
    else ctx_limits_default(&lim);
    tree t;
    memset(&t, 0, sizeof t);
    ctx_info in;
    memset(&in, 0, sizeof in);
    int64_t tree_entries = 0;
    char *scratch = u ? NULL : xmalloc(1 << 16);
    char *path = xmalloc(CTX_NAME_MAX + 2), *hard = xmalloc(CTX_NAME_MAX + 2);
    char sh[208];
    int rc = -1;
    for (int first = 1;; first = 0) {
        if (cancelled(&lim)) {
            seterr(err, errlen, "cancelled");
            goto out;
        }
        struct archive_entry *e;
        int r = archive_read_next_header(a, &e);
        if (first && (r == ARCHIVE_OK || r == ARCHIVE_WARN || r == ARCHIVE_EOF)) {
            if (archive_filter_code(a, 0) != ARCHIVE_FILTER_GZIP) {
                seterr(err, errlen, "not a gzip'd tar: the data is not gzip");
                goto out;
            }
        }
        if (r == ARCHIVE_EOF) break;
        if (r != ARCHIVE_OK) {
            const char *why = archive_error_string(a);
            if (first && archive_filter_code(a, 0) != ARCHIVE_FILTER_GZIP)
                seterr(err, errlen, "not a gzip'd tar: the data is not gzip");
            else if (first)
                seterr(err, errlen, "not a gzip'd tar: %s", why ? why : "unreadable");
            else
                seterr(err, errlen, "the archive is damaged after %lld entries: %s", (long long)in.entries,
                       why ? why : "unreadable");
            goto out;
        }
        const char *raw = archive_entry_pathname(e);
        if (!raw) raw = archive_entry_pathname_utf8(e);
        if (!raw) {
            seterr(err, errlen, "entry %lld: a name that cannot be read", (long long)in.entries + 1);
            goto out;
        }
        if (!*raw) {
            seterr(err, errlen, "entry %lld: an empty name", (long long)in.entries + 1);
            goto out;
        }
        if (norm_name(raw, path, CTX_NAME_MAX + 2, "entry", err, errlen) < 0) goto out;
        in.entries++;
        if (in.entries > lim.max_files || ++tree_entries > lim.max_files) {
            seterr(err, errlen, "entry '%s': more than %lld entries", shown(raw, sh), (long long)lim.max_files);
            goto out;
        }
        const char *hl = archive_entry_hardlink(e);
        if (!hl) hl = archive_entry_hardlink_utf8(e);
        mode_t ft = archive_entry_filetype(e);
        int type;
        const char *target = NULL;
        if (hl) {
            if (norm_name(hl, hard, CTX_NAME_MAX + 2, "hard link target", err, errlen) < 0) {
                char tmp[512];
                snprintf(tmp, sizeof tmp, "%s", err);
                seterr(err, errlen, "entry '%s': %s", shown(raw, sh), tmp);
                goto out;
            }
            tnode *x = tree_find(&t, hard, strlen(hard));
            if (!x || (x->type != T_REG && x->type != T_HARD)) {
                char sh2[208];
                seterr(err, errlen, "entry '%s': a hard link to '%s', which is not a file earlier in the archive",
                       shown(raw, sh), shown(hl, sh2));
                goto out;
            }
            type = T_HARD;
            target = hard;
        } else if (ft == AE_IFREG) {
            type = T_REG;
        } else if (ft == AE_IFDIR) {
            type = T_DIR;
        } else if (ft == AE_IFLNK) {
            type = T_LINK;
            target = archive_entry_symlink(e);
            if (!target) target = archive_entry_symlink_utf8(e);
            if (link_lexical(path, target, err, errlen) < 0) goto out;
        } else {
            const char *what = ft == AE_IFCHR ? "a character device" : ft == AE_IFBLK ? "a block device"
                               : ft == AE_IFIFO ? "a FIFO" : ft == AE_IFSOCK ? "a socket" : "an unknown kind of entry";
            seterr(err, errlen, "entry '%s': %s is not allowed (only files, directories and links)", shown(raw, sh), what);
            goto out;
        }
        if (path[0] == '\0') {
            if (type != T_DIR) {
                seterr(err, errlen, "entry '%s': only a directory may name the root", shown(raw, sh));
                goto out;
            }
        } else {
            if (tree_enter(&t, path, type, &tree_entries, lim.max_files, err, errlen) < 0) goto out;
            if (target) t.n[t.len - 1].target = xstrdup(target);
        }
        if (type == T_REG) in.files++;
        int64_t left = lim.max_unpacked - in.unpacked;
        if (archive_entry_size_is_set(e) && archive_entry_size(e) > left && type == T_REG) {
            seterr(err, errlen, "entry '%s': more than %lld bytes once unpacked", shown(raw, sh),
                   (long long)lim.max_unpacked);
            goto out;
        }
        int64_t before = left;
        if (u) {
            if (unpack_entry(u, a, e, path, type, target, err, errlen, &left) < 0) goto out;
        } else if (type == T_REG) {
            for (;;) {
                la_ssize_t n = archive_read_data(a, scratch, 1 << 16);
                if (n == 0) break;
                if (n < 0) {
                    seterr(err, errlen, "entry '%s': the data is damaged: %s", shown(raw, sh), archive_error_string(a));
                    goto out;
                }
                left -= n;
                if (left < 0) break;
            }
        }
        in.unpacked += before - left;
        if (left < 0) {
            seterr(err, errlen, "entry '%s': more than %lld bytes once unpacked", shown(raw, sh),
                   (long long)lim.max_unpacked);
            goto out;
        }
        /* what the tar takes decompressed beyond the data (headers, long
         * names, skipped bytes) is bounded too, or a gzip bomb of headers
         * would go unseen */
        int64_t stream = archive_filter_bytes(a, 0);
        if (stream > lim.max_unpacked + (in.entries + 1) * (int64_t)CTX_HEADER_SLACK + (1 << 20)) {
            seterr(err, errlen, "entry '%s': the archive's headers take more than %lld bytes once unpacked",
                   shown(raw, sh), (long long)(stream - in.unpacked));
            goto out;
        }
    }
    if (tree_check_links(&t, err, errlen, NULL) < 0) goto out;
    if (u && unpack_finish(u, err, errlen) < 0) goto out;
    rc = 0;
out:
    tree_free(&t);
    free(scratch);
    free(path);
    free(hard);
    if (info) *info = in;
    return rc;
}

int ctx_check(const void *data, size_t len, const ctx_limits *lim, ctx_info *info, char *err, size_t errlen) {
    if (info) memset(info, 0, sizeof *info);
    const unsigned char *d = data;
    if (len < 2 || d[0] != 0x1f || d[1] != 0x8b) {
        seterr(err, errlen, "not a gzip'd tar: the data is not gzip");
        return -1;
    }
    struct archive *a = reader_new(err, errlen);
    if (!a) return -1;
    int rc = -1;
    if (archive_read_open_memory(a, data, len) != ARCHIVE_OK)
        seterr(err, errlen, "not a gzip'd tar: %s", archive_error_string(a));
    else
        rc = walk(a, lim, info, NULL, err, errlen);
    archive_read_free(a);
    if (info) info->packed = (int64_t)len;
    return rc;
}

/* ================================================================ unpacking */

typedef struct dirfix {
    char *path;
    mode_t mode;
    time_t mtime;
    int has_mtime;
} dirfix;

struct unpacker {
    int root;
    uid_t uid;
    gid_t gid;
    dirfix *fix;
    size_t nfix, capfix;
    char *buf;
    const ctx_limits *lim;         /* its cancel */
};

static void add_fix(unpacker *u, const char *path, mode_t mode, time_t mtime, int has_mtime) {
    if (u->nfix == u->capfix) {
        u->capfix = u->capfix ? u->capfix * 2 : 64;
        u->fix = xrealloc(u->fix, u->capfix * sizeof *u->fix);
    }
    u->fix[u->nfix++] = (dirfix){xstrdup(path), mode, mtime, has_mtime};
}

static int own(unpacker *u, int fd) {
    if (u->uid == (uid_t)-1) return 0;
    return fchown(fd, u->uid, u->gid);
}

/* The directory holding path's last name, opened by walking from the root
 * without following any link; missing directories are made (when create).
 * *name gets the last name (in path). -1 with errno. */
static int open_parent(unpacker *u, const char *path, int create, const char **name) {
    int fd = dup(u->root);
    if (fd < 0) return -1;
    const char *p = path;
    for (;;) {
        const char *e = strchr(p, '/');
        if (!e) break;
        size_t len = (size_t)(e - p);
        char comp[NAME_MAX + 1];
        if (len == 0 || len > NAME_MAX || (len == 2 && p[0] == '.' && p[1] == '.')) {
            close(fd);
            errno = EINVAL;
            return -1;
        }
        memcpy(comp, p, len);
        comp[len] = '\0';
        int next = openat(fd, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (next < 0 && errno == ENOENT && create) {
            if (mkdirat(fd, comp, 0700) < 0 && errno != EEXIST) {
                close(fd);
                return -1;
            }
            next = openat(fd, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (next >= 0) {
                if (own(u, next) < 0) {
                    int se = errno;
                    close(next);
                    close(fd);
                    errno = se;
                    return -1;
                }
                char *implied = xstrndup(path, (size_t)(e - path));
                add_fix(u, implied, 0755, 0, 0);
                free(implied);
            }
        }
        int se = errno;
        close(fd);
        if (next < 0) {
            errno = se;
            return -1;
        }
        fd = next;
        p = e + 1;
    }
    *name = p;
    return fd;
}

static int unpack_entry(unpacker *u, struct archive *a, struct archive_entry *e, const char *path, int type,
                        const char *target, char *err, size_t errlen, int64_t *data_left) {
    char sh[208];
    if (path[0] == '\0') return 0; /* the root: the caller's directory as it is */
    const char *name;
    int pfd = open_parent(u, path, 1, &name);
    if (pfd < 0) {
        seterr(err, errlen, "entry '%s': cannot make its folder: %s", shown(path, sh), strerror(errno));
        return -1;
    }
    mode_t mode = archive_entry_perm(e) & 0777; /* never set-uid, set-gid or sticky */
    struct timespec ts[2] = {{0, UTIME_OMIT}, {archive_entry_mtime(e), 0}};
    int has_mtime = archive_entry_mtime_is_set(e);
    if (!has_mtime) ts[1].tv_nsec = UTIME_OMIT;
    int rc = -1;
    if (type == T_DIR) {
        if (mkdirat(pfd, name, 0700) < 0 && errno != EEXIST) {
            seterr(err, errlen, "entry '%s': cannot make the folder: %s", shown(path, sh), strerror(errno));
            goto out;
        }
        int fd = openat(pfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0 || own(u, fd) < 0) {
            seterr(err, errlen, "entry '%s': cannot open the folder: %s", shown(path, sh), strerror(errno));
            if (fd >= 0) close(fd);
            goto out;
        }
        close(fd);
        /* modes and times of folders last: a read-only folder still takes
         * its entries, and writing them does not change its time */
        add_fix(u, path, mode, ts[1].tv_sec, has_mtime);
        rc = 0;
    } else if (type == T_REG) {
        int fd = openat(pfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY, 0600);
        if (fd < 0) {
            seterr(err, errlen, "entry '%s': cannot create the file: %s", shown(path, sh), strerror(errno));
            goto out;
        }
        for (;;) {
            if (cancelled(u->lim)) {
                seterr(err, errlen, "cancelled");
                close(fd);
                goto out;
            }
            la_ssize_t n = archive_read_data(a, u->buf, 1 << 16);
            if (n == 0) break;
            if (n < 0) {
                seterr(err, errlen, "entry '%s': the data is damaged: %s", shown(path, sh), archive_error_string(a));
                close(fd);
                goto out;
            }
            *data_left -= n;
            if (*data_left < 0) { /* the caller names the limit */
                close(fd);
                rc = 0;
                goto out;
            }
            for (la_ssize_t off = 0; off < n;) {
                ssize_t w = write(fd, u->buf + off, (size_t)(n - off));
                if (w < 0 && errno == EINTR) continue;
                if (w <= 0) {
                    seterr(err, errlen, "entry '%s': cannot write: %s", shown(path, sh), strerror(w < 0 ? errno : EIO));
                    close(fd);
                    goto out;
                }
                off += w;
            }
        }
        if (own(u, fd) < 0 || fchmod(fd, mode) < 0 || futimens(fd, ts) < 0) {
            seterr(err, errlen, "entry '%s': cannot set its owner, mode or time: %s", shown(path, sh), strerror(errno));
            close(fd);
            goto out;
        }
        if (close(fd) < 0) {
            seterr(err, errlen, "entry '%s': cannot write: %s", shown(path, sh), strerror(errno));
            goto out;
        }
        rc = 0;
    } else if (type == T_LINK) {
        if (symlinkat(target, pfd, name) < 0 ||
            (u->uid != (uid_t)-1 && fchownat(pfd, name, u->uid, u->gid, AT_SYMLINK_NOFOLLOW) < 0) ||
            utimensat(pfd, name, ts, AT_SYMLINK_NOFOLLOW) < 0) {
            seterr(err, errlen, "entry '%s': cannot make the link: %s", shown(path, sh), strerror(errno));
            goto out;
        }
        rc = 0;
    } else if (type == T_HARD) {
        const char *tname;
        int tfd = open_parent(u, target, 0, &tname);
        struct stat st;
        if (tfd < 0 || fstatat(tfd, tname, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode) ||
            linkat(tfd, tname, pfd, name, 0) < 0) {
            char sh2[208];
            seterr(err, errlen, "entry '%s': cannot link to '%s': %s", shown(path, sh), shown(target, sh2),
                   tfd < 0 || errno ? strerror(errno) : "not a file");
            if (tfd >= 0) close(tfd);
            goto out;
        }
        close(tfd);
        rc = 0;
    }
out:
    close(pfd);
    return rc;
}

static int cmp_fix_deep_first(const void *a, const void *b) {
    size_t la = strlen(((const dirfix *)a)->path), lb = strlen(((const dirfix *)b)->path);
    return la < lb ? 1 : la > lb ? -1 : 0;
}

static int unpack_finish(unpacker *u, char *err, size_t errlen) {
    char sh[208];
    if (u->nfix) qsort(u->fix, u->nfix, sizeof *u->fix, cmp_fix_deep_first);
    for (size_t i = 0; i < u->nfix; i++) {
        const char *name;
        int pfd = open_parent(u, u->fix[i].path, 0, &name);
        int fd = pfd >= 0 ? openat(pfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) : -1;
        struct timespec ts[2] = {{0, UTIME_OMIT}, {u->fix[i].mtime, u->fix[i].has_mtime ? 0 : UTIME_OMIT}};
        if (fd < 0 || fchmod(fd, u->fix[i].mode) < 0 || futimens(fd, ts) < 0) {
            seterr(err, errlen, "entry '%s': cannot set the folder's mode: %s", shown(u->fix[i].path, sh),
                   strerror(errno));
            if (fd >= 0) close(fd);
            if (pfd >= 0) close(pfd);
            return -1;
        }
        close(fd);
        close(pfd);
    }
    return 0;
}

int ctx_unpack(const char *tar_path, const char *dir, uid_t uid, gid_t gid, const ctx_limits *lim, char *err,
               size_t errlen) {
    char sh[208];
    unpacker u;
    memset(&u, 0, sizeof u);
    u.uid = uid;
    u.gid = gid;
    u.lim = lim;
    u.root = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (u.root < 0) {
        seterr(err, errlen, "cannot open %s: %s", shown(dir, sh), strerror(errno));
        return -1;
    }
    struct archive *a = reader_new(err, errlen);
    int rc = -1;
    if (a) {
        u.buf = xmalloc(1 << 16);
        if (archive_read_open_filename(a, tar_path, 1 << 16) != ARCHIVE_OK)
            seterr(err, errlen, "cannot read %s: %s", shown(tar_path, sh), archive_error_string(a));
        else
            rc = walk(a, lim, NULL, &u, err, errlen);
        archive_read_free(a);
    }
    for (size_t i = 0; i < u.nfix; i++) free(u.fix[i].path);
    free(u.fix);
    free(u.buf);
    close(u.root);
    return rc;
}
