/* backup.c - backups of a data directory while its server runs, and their
 * restore (backup.h; docs/reliability.md, "Backups and restore").
 *
 * The order is what makes the copy consistent:
 *  1. checkpoint and context files present now are hard-linked into
 *     DATA/.backup-hold (DATA's own file system): a file that a row of the
 *     snapshot names and that is removed right after the snapshot (a prune,
 *     the retention) is then still readable there;
 *  2. the database: a connection of its own, read-only, and
 *     sqlite3_backup_step(b, -1) once: every page copied inside one read
 *     transaction. In WAL mode a reader takes no write lock, so writers are
 *     never blocked; stepping in chunks would restart from page 1 after
 *     every write made through another connection;
 *  3. the snapshot's own rows name the files to keep: each is linked into
 *     the backup from the hold (or DATA, for one made after step 1), or
 *     copied on another file system (checked against the row's sha256);
 *     the hold is removed;
 *  4. tokens, attempt.key, tls/ and logs/ copied (logs are append-only: a
 *     copy taken after the snapshot holds at least what its rows name);
 *  5. manifest.json last (temp, fsync, rename) after an fsync of every
 *     folder of the backup (the files copied were each fsynced). */
#include "backup.h"
#include "blob.h"
#include "db.h"
#include "../common/util.h"
#include "../common/version.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MANIFEST "manifest.json"
#define MANIFEST_MAX (256u << 20)
#define COPY_BUF (1u << 20)

/* The data directory's single files kept under files/ (the directories
 * tls/ and logs/ go whole). */
static const char *const SINGLE_FILES[] = {"admin.token", "token", "node.token", "attempt.key", NULL};
static const char *const TREES[] = {"tls", "logs", NULL};

/* ---------------------------------------------------------------- files */

/* Copies src into dst (through a temporary name beside it, fsynced,
 * renamed) with mode; got: the sha256 of the bytes copied, *bytes their
 * count. With want (hex), bytes that differ are not kept: -2. ENOENT from
 * src: -3. Else 0, or -1 with err. */
static int copy_file(const char *src, const char *dst, int mode, const char *want, char got[65], int64_t *bytes,
                     char *err, size_t errlen) {
    int in = open(src, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (in < 0) {
        if (errno == ENOENT) return -3;
        snprintf(err, errlen, "cannot open %s: %s", src, strerror(errno));
        return -1;
    }
    char tmp[PATH_MAX + 16];
    if (sfmt(tmp, sizeof tmp, "%s.tmpXXXXXX", dst) < 0) {
        close(in);
        snprintf(err, errlen, "path too long: %s", dst);
        return -1;
    }
    int out = mkstemp(tmp);
    if (out < 0) {
        snprintf(err, errlen, "cannot create %s: %s", tmp, strerror(errno));
        close(in);
        return -1;
    }
    sha256_stream sh;
    if (sha256_stream_init(&sh) < 0) {
        snprintf(err, errlen, "sha256: cannot start");
        close(in);
        close(out);
        unlink(tmp);
        return -1;
    }
    char *b = xmalloc(COPY_BUF);
    int64_t n = 0;
    int rc = 0;
    for (;;) {
        ssize_t r = read(in, b, COPY_BUF);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            snprintf(err, errlen, "cannot read %s: %s", src, strerror(errno));
            rc = -1;
            break;
        }
        if (r == 0) break;
        if (sha256_stream_update(&sh, b, (size_t)r) < 0) {
            snprintf(err, errlen, "sha256 failed");
            rc = -1;
            break;
        }
        for (ssize_t off = 0; off < r;) {
            ssize_t w = write(out, b + off, (size_t)(r - off));
            if (w < 0 && errno == EINTR) continue;
            if (w < 0) {
                snprintf(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
                rc = -1;
                break;
            }
            off += w;
        }
        if (rc < 0) break;
        n += r;
    }
    free(b);
    close(in);
    char hex[65] = "";
    if (sha256_stream_final(&sh, hex) < 0 && rc == 0) {
        snprintf(err, errlen, "sha256 failed");
        rc = -1;
    }
    if (rc == 0 && (fchmod(out, (mode_t)mode) < 0 || fsync(out) < 0)) {
        snprintf(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
        rc = -1;
    }
    if (close(out) < 0 && rc == 0) {
        snprintf(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
        rc = -1;
    }
    if (rc == 0 && want && strcmp(hex, want) != 0) rc = -2;
    if (rc == 0 && rename(tmp, dst) < 0) {
        snprintf(err, errlen, "cannot rename %s: %s", tmp, strerror(errno));
        rc = -1;
    }
    if (rc != 0) unlink(tmp);
    if (got) snprintf(got, 65, "%s", hex);
    if (bytes) *bytes = n;
    return rc;
}

/* The sha256 of a file's bytes: 0, -3 (ENOENT) or -1 with err. */
static int sha_file(const char *path, char out[65], int64_t *bytes, char *err, size_t errlen) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        if (errno == ENOENT) return -3;
        snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    sha256_stream sh;
    if (sha256_stream_init(&sh) < 0) {
        close(fd);
        snprintf(err, errlen, "sha256: cannot start");
        return -1;
    }
    char *b = xmalloc(COPY_BUF);
    int64_t n = 0;
    int rc = 0;
    for (;;) {
        ssize_t r = read(fd, b, COPY_BUF);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            snprintf(err, errlen, "cannot read %s: %s", path, strerror(errno));
            rc = -1;
            break;
        }
        if (r == 0) break;
        if (sha256_stream_update(&sh, b, (size_t)r) < 0) rc = -1;
        n += r;
    }
    free(b);
    close(fd);
    char hex[65] = "";
    if (sha256_stream_final(&sh, hex) < 0) rc = -1;
    if (rc < 0 && !err[0]) snprintf(err, errlen, "sha256 of %s failed", path);
    snprintf(out, 65, "%s", hex);
    if (bytes) *bytes = n;
    return rc;
}

/* The parent directory of path made (0700). */
static int mkdir_parent(const char *path) {
    char dir[PATH_MAX];
    if (sfmt(dir, sizeof dir, "%s", path) < 0) return -1;
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) return 0;
    *slash = '\0';
    return mkdir_p(dir, 0700);
}

/* Calls fn for each regular file under root (rel: its path below root),
 * depth first; symbolic links and other kinds are skipped. A directory
 * that is not there is nothing. fn returns 0 to go on, non-zero to stop
 * (returned). */
typedef int (*walk_fn)(void *ctx, const char *abs, const char *rel, const struct stat *sb);
static int walk(const char *root, const char *rel, walk_fn fn, void *ctx) {
    char dir[PATH_MAX];
    if (sfmt(dir, sizeof dir, "%s%s%s", root, rel[0] ? "/" : "", rel) < 0) return 0;
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    int rc = 0;
    while (rc == 0 && (e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char abs[PATH_MAX], sub[PATH_MAX];
        if (sfmt(abs, sizeof abs, "%s/%s", dir, e->d_name) < 0 ||
            sfmt(sub, sizeof sub, "%s%s%s", rel, rel[0] ? "/" : "", e->d_name) < 0)
            continue;
        struct stat sb;
        if (lstat(abs, &sb) < 0) continue;
        if (S_ISDIR(sb.st_mode)) rc = walk(root, sub, fn, ctx);
        else if (S_ISREG(sb.st_mode)) rc = fn(ctx, abs, sub, &sb);
    }
    closedir(d);
    return rc;
}

static void utc_text(int64_t ms, char *out, size_t cap, const char *fmt) {
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    if (!gmtime_r(&t, &tm) || strftime(out, cap, fmt, &tm) == 0) snprintf(out, cap, "?");
}

/* ---------------------------------------------------------------- backup */

typedef struct bk {
    const char *data;                 /* DATA */
    char dir[PATH_MAX];               /* the backup's folder */
    char hold[PATH_MAX];              /* DATA/.backup-hold: step 1's links */
    int link_ok;                      /* links into the backup: -1 unknown, 0 another file system, 1 they work */
    cJSON *files, *blobs, *missing;   /* the manifest's arrays */
    backup_summary *sum;
    char *err;
    size_t errlen;
} bk;

/* Step 1: every checkpoint and context file there now, hard-linked into
 * DATA/.backup-hold (DATA's own file system, wherever the backup goes):
 * a file the snapshot names stays readable whatever the server removes
 * after it. Stops at the first EXDEV (checkpoints/ a mount of its own). */
typedef struct prelink_ctx {
    bk *b;
    const char *top;                  /* "checkpoints" or "contexts" */
    int stop;
} prelink_ctx;

static int prelink_one(void *ctx, const char *abs, const char *rel, const struct stat *sb) {
    (void)sb;
    prelink_ctx *p = ctx;
    bk *b = p->b;
    char dst[PATH_MAX];
    if (strstr(rel, ".tmp")) return 0; /* a file being written (file_write_atomic's temporary) */
    if (sfmt(dst, sizeof dst, "%s/%s/%s", b->hold, p->top, rel) < 0 || mkdir_parent(dst) < 0) return 0;
    if (link(abs, dst) == 0 || errno == ENOENT || errno == EEXIST) return 0; /* gone meanwhile: step 3 says */
    if (errno == EXDEV || errno == EPERM || errno == EMLINK) {
        log_warn("backup: cannot hard-link %s into %s (%s): files removed during the backup may be missing from it",
                 abs, b->hold, strerror(errno));
        p->stop = 1;
        return 1;
    }
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* One blob the snapshot names in the local store (key "checkpoints/J/C.safetensors"
 * or "contexts/<hex>"): already linked, linked now, or copied and checked. */
static int keep_blob(bk *b, const char *key, const char *sha, int64_t size) {
    char src[PATH_MAX], dst[PATH_MAX];
    struct stat sb;
    /* step 1's link when there is one (it cannot have gone), else DATA's file */
    if (sfmt(src, sizeof src, "%s/%s", b->hold, key) < 0 || lstat(src, &sb) < 0)
        if (sfmt(src, sizeof src, "%s/%s", b->data, key) < 0) src[0] = '\0';
    if (!src[0] || sfmt(dst, sizeof dst, "%s/blobs/%s", b->dir, key) < 0) {
        snprintf(b->err, b->errlen, "path too long: %s", key);
        return -1;
    }
    const char *why = NULL;
    int linked = 0;
    if (b->link_ok != 0) {
        if (mkdir_parent(dst) < 0) {
            snprintf(b->err, b->errlen, "cannot create a folder for %s: %s", dst, strerror(errno));
            return -1;
        }
        if (link(src, dst) == 0) {
            linked = 1;
            b->link_ok = 1;
        } else if (errno == ENOENT) why = "gone from the data directory";
        else if (errno == EXDEV || errno == EPERM || errno == EMLINK) b->link_ok = 0;
        else {
            snprintf(b->err, b->errlen, "cannot link %s: %s", dst, strerror(errno));
            return -1;
        }
    }
    int64_t copied = 0;
    if (!linked && !why) {
        if (mkdir_parent(dst) < 0) {
            snprintf(b->err, b->errlen, "cannot create a folder for %s: %s", dst, strerror(errno));
            return -1;
        }
        char got[65];
        int rc = copy_file(src, dst, 0600, sha, got, &copied, b->err, b->errlen);
        if (rc == -1) return -1;
        if (rc == -3) why = "gone from the data directory";
        if (rc == -2) why = "its bytes do not match the row's sha256";
    }
    if (why) {
        log_warn("backup: %s is named by the database but %s: listed as missing in the manifest", key, why);
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "key", key);
        cJSON_AddStringToObject(m, "why", why);
        cJSON_AddItemToArray(b->missing, m);
        b->sum->blobs_missing++;
        return 0;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "key", key);
    cJSON_AddNumberToObject(o, "size", (double)size);
    cJSON_AddStringToObject(o, "sha256", sha);
    cJSON_AddBoolToObject(o, "local", 1);
    cJSON_AddBoolToObject(o, "linked", linked);
    cJSON_AddItemToArray(b->blobs, o);
    b->sum->blobs++;
    if (linked) b->sum->blobs_linked++;
    b->sum->blob_bytes_copied += copied;
    return 0;
}

/* 1 when table has column col. */
static int has_column(sqlite3 *c, const char *table, const char *col) {
    char sql[128];
    snprintf(sql, sizeof sql, "SELECT 1 FROM pragma_table_info('%s') WHERE name = ?", table);
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(c, sql, -1, &st, NULL) != SQLITE_OK) return 0;
    sqlite3_bind_text(st, 1, col, -1, SQLITE_STATIC);
    int yes = sqlite3_step(st) == SQLITE_ROW;
    sqlite3_finalize(st);
    return yes;
}

/* Step 3: the blobs the snapshot (the copy at db) names. */
static int keep_named_blobs(bk *b, const char *dbfile) {
    sqlite3 *c = NULL;
    if (sqlite3_open_v2(dbfile, &c, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
        snprintf(b->err, b->errlen, "cannot open the snapshot %s: %s", dbfile, c ? sqlite3_errmsg(c) : "no memory");
        sqlite3_close(c);
        return -1;
    }
    /* a store column (checkpoints and contexts in a blob store): '' = this data directory */
    int ck_store = has_column(c, "checkpoints", "store"), cx_store = has_column(c, "contexts", "store");
    const char *q_ck = ck_store ? "SELECT path, sha256, size, store FROM checkpoints WHERE deleted_at IS NULL AND path <> '' ORDER BY id"
                                : "SELECT path, sha256, size, '' FROM checkpoints WHERE deleted_at IS NULL AND path <> '' ORDER BY id";
    const char *q_cx = cx_store ? "SELECT digest, digest, max(bytes), store FROM contexts GROUP BY digest, store"
                                : "SELECT digest, digest, max(bytes), '' FROM contexts GROUP BY digest";
    const char *qs[2] = {q_ck, q_cx}, *tops[2] = {"checkpoints", "contexts"};
    int rc = 0;
    for (int k = 0; k < 2 && rc == 0; k++) {
        sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(c, qs[k], -1, &st, NULL) != SQLITE_OK) {
            snprintf(b->err, b->errlen, "cannot read the snapshot's %s: %s", tops[k], sqlite3_errmsg(c));
            rc = -1;
            break;
        }
        int s;
        while (rc == 0 && (s = sqlite3_step(st)) == SQLITE_ROW) {
            const char *p = (const char *)sqlite3_column_text(st, 0), *sha = (const char *)sqlite3_column_text(st, 1);
            const char *store = (const char *)sqlite3_column_text(st, 3);
            int64_t size = sqlite3_column_int64(st, 2);
            char key[600];
            if (!p || !sha || strstr(p, "..") || p[0] == '/' || sfmt(key, sizeof key, "%s/%s", tops[k], p) < 0) {
                log_warn("backup: a %s row names '%.80s': skipped", tops[k], p ? p : "");
                continue;
            }
            if (store && store[0]) { /* another store's object: the manifest names it */
                cJSON *o = cJSON_CreateObject();
                cJSON_AddStringToObject(o, "key", key);
                cJSON_AddNumberToObject(o, "size", (double)size);
                cJSON_AddStringToObject(o, "sha256", sha);
                cJSON_AddStringToObject(o, "store", store);
                cJSON_AddBoolToObject(o, "local", 0);
                cJSON_AddItemToArray(b->blobs, o);
                b->sum->blobs_remote++;
                continue;
            }
            rc = keep_blob(b, key, sha, size);
        }
        if (rc == 0 && s != SQLITE_DONE) {
            snprintf(b->err, b->errlen, "cannot read the snapshot's %s: %s", tops[k], sqlite3_errmsg(c));
            rc = -1;
        }
        sqlite3_finalize(st);
    }
    sqlite3_close(c);
    if (rc < 0) return -1;
    return 0;
}

/* Step 2: the snapshot into dbfile; its schema version, sha256 and size. */
static int snapshot(bk *b, const char *dbfile) {
    char src_path[PATH_MAX];
    if (sfmt(src_path, sizeof src_path, "%s/trainyard.db", b->data) < 0) {
        snprintf(b->err, b->errlen, "data directory path too long");
        return -1;
    }
    struct stat sb;
    if (stat(src_path, &sb) < 0) {
        snprintf(b->err, b->errlen, "%s: %s", src_path, strerror(errno));
        return -1;
    }
    sqlite3 *src = NULL, *dst = NULL;
    int rc = -1;
    if (sqlite3_open_v2(src_path, &src, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
        snprintf(b->err, b->errlen, "cannot open %s: %s", src_path, src ? sqlite3_errmsg(src) : "no memory");
        goto out;
    }
    sqlite3_busy_timeout(src, 10000);
    if (sqlite3_open_v2(dbfile, &dst, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) != SQLITE_OK) {
        snprintf(b->err, b->errlen, "cannot create %s: %s", dbfile, dst ? sqlite3_errmsg(dst) : "no memory");
        goto out;
    }
    sqlite3_backup *bu = sqlite3_backup_init(dst, "main", src, "main");
    if (!bu) {
        snprintf(b->err, b->errlen, "cannot start the backup: %s", sqlite3_errmsg(dst));
        goto out;
    }
    int64_t t0 = mono_ms();
    b->sum->created_at[0] = '\0';
    utc_text(now_ms(), b->sum->created_at, sizeof b->sum->created_at, "%Y-%m-%dT%H:%M:%SZ");
    int s = sqlite3_backup_step(bu, -1); /* every page in one read transaction */
    b->sum->snapshot_ms = mono_ms() - t0;
    int f = sqlite3_backup_finish(bu);
    if (s != SQLITE_DONE || f != SQLITE_OK) {
        snprintf(b->err, b->errlen, "the database's backup failed: %s (%s)", sqlite3_errstr(s != SQLITE_DONE ? s : f),
                 sqlite3_errmsg(dst));
        goto out;
    }
    /* one file of its own (no -wal beside it), checked */
    char *msg = NULL;
    if (sqlite3_exec(dst, "PRAGMA journal_mode=DELETE", NULL, NULL, &msg) != SQLITE_OK) {
        snprintf(b->err, b->errlen, "the snapshot: %s", msg ? msg : "journal_mode failed");
        sqlite3_free(msg);
        goto out;
    }
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(dst, "PRAGMA integrity_check", -1, &st, NULL) != SQLITE_OK ||
        sqlite3_step(st) != SQLITE_ROW || strcmp((const char *)sqlite3_column_text(st, 0), "ok") != 0) {
        snprintf(b->err, b->errlen, "the snapshot fails PRAGMA integrity_check: %s",
                 st && sqlite3_column_text(st, 0) ? (const char *)sqlite3_column_text(st, 0) : sqlite3_errmsg(dst));
        sqlite3_finalize(st);
        goto out;
    }
    sqlite3_finalize(st);
    st = NULL;
    if (sqlite3_prepare_v2(dst, "SELECT coalesce(max(version), 0) FROM schema_migrations", -1, &st, NULL) !=
            SQLITE_OK ||
        sqlite3_step(st) != SQLITE_ROW) {
        snprintf(b->err, b->errlen, "the snapshot has no schema version: %s", sqlite3_errmsg(dst));
        sqlite3_finalize(st);
        goto out;
    }
    b->sum->schema_version = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    rc = 0;
out:
    sqlite3_close(src);
    if (sqlite3_close(dst) != SQLITE_OK && rc == 0) {
        snprintf(b->err, b->errlen, "cannot close the snapshot");
        rc = -1;
    }
    if (rc < 0) return -1;
    int fd = open(dbfile, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fchmod(fd, 0600) < 0 || fsync(fd) < 0) {
        snprintf(b->err, b->errlen, "cannot sync %s: %s", dbfile, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    close(fd);
    b->err[0] = '\0';
    return sha_file(dbfile, b->sum->db_sha256, &b->sum->db_bytes, b->err, b->errlen) == 0 ? 0 : -1;
}

/* Step 4: one file of DATA into files/rel, its entry in the manifest. */
static int keep_file(bk *b, const char *abs, const char *rel, const struct stat *sb) {
    char dst[PATH_MAX];
    if (sfmt(dst, sizeof dst, "%s/files/%s", b->dir, rel) < 0) {
        snprintf(b->err, b->errlen, "path too long: %s", rel);
        return -1;
    }
    if (mkdir_parent(dst) < 0) {
        snprintf(b->err, b->errlen, "cannot create a folder for %s: %s", dst, strerror(errno));
        return -1;
    }
    char sha[65];
    int64_t n = 0;
    int rc = copy_file(abs, dst, 0600, NULL, sha, &n, b->err, b->errlen);
    if (rc == -3) return 0; /* removed meanwhile (a log past its retention) */
    if (rc < 0) return -1;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "path", rel);
    cJSON_AddNumberToObject(o, "size", (double)n);
    cJSON_AddStringToObject(o, "sha256", sha);
    cJSON_AddNumberToObject(o, "mode", (double)(sb->st_mode & 0777));
    cJSON_AddItemToArray(b->files, o);
    b->sum->files++;
    b->sum->file_bytes += n;
    return 0;
}

/* The tree DATA/name into files/name. */
typedef struct tree_ctx {
    bk *b;
    const char *name;
} tree_ctx;

static int tree_cb(void *ctx, const char *abs, const char *rel, const struct stat *sb) {
    tree_ctx *t = ctx;
    char r[PATH_MAX];
    if (sfmt(r, sizeof r, "%s/%s", t->name, rel) < 0) return 0;
    return keep_file(t->b, abs, r, sb) < 0 ? 1 : 0;
}

/* 1 when path is dir or below it (both resolved). */
static int path_within(const char *path, const char *dir) {
    size_t n = strlen(dir);
    return strncmp(path, dir, n) == 0 && (path[n] == '\0' || path[n] == '/' || (n == 1 && dir[0] == '/'));
}

/* fsync of dir and of every folder below it (not a syncfs: the file
 * system's other writers, the server's first, are not made to wait). */
static int fsync_dirs(const char *dir, char *err, size_t errlen) {
    DIR *d = opendir(dir);
    if (!d) {
        snprintf(err, errlen, "cannot open %s: %s", dir, strerror(errno));
        return -1;
    }
    struct dirent *e;
    int rc = 0;
    while (rc == 0 && (e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char sub[PATH_MAX];
        struct stat sb;
        if (sfmt(sub, sizeof sub, "%s/%s", dir, e->d_name) < 0 || lstat(sub, &sb) < 0) continue;
        if (S_ISDIR(sb.st_mode)) rc = fsync_dirs(sub, err, errlen);
    }
    closedir(d);
    if (rc == 0 && fsync_dir(dir) < 0) {
        snprintf(err, errlen, "cannot sync %s: %s", dir, strerror(errno));
        rc = -1;
    }
    return rc;
}

static int backup_into(const char *data_dir, const char *dest, int staging, backup_summary *out, char *err,
                       size_t errlen);

int backup_run(const char *data_dir, const char *dest, backup_summary *out, char *err, size_t errlen) {
    return backup_into(data_dir, dest, 0, out, err, errlen);
}

/* staging: dest is the data directory's own staging folder (an s3 backup's). */
static int backup_into(const char *data_dir, const char *dest, int staging, backup_summary *out, char *err,
                       size_t errlen) {
    memset(out, 0, sizeof *out);
    err[0] = '\0';
    int64_t t0 = mono_ms();
    if (dest[0] != '/') {
        snprintf(err, errlen, "the backup's destination must be an absolute path, not '%.200s'", dest);
        return -2;
    }
    char rdata[PATH_MAX], rdest[PATH_MAX];
    if (!realpath(data_dir, rdata)) {
        snprintf(err, errlen, "the data directory %s: %s", data_dir, strerror(errno));
        return -1;
    }
    /* inside DATA? asked of the deepest folder of dest that exists (the
     * rest, made below, cannot leave it: no "..") before anything is made */
    char probe[PATH_MAX];
    if (strstr(dest, "/../") || (strlen(dest) >= 3 && strcmp(dest + strlen(dest) - 3, "/..") == 0) ||
        sfmt(probe, sizeof probe, "%s", dest) < 0) {
        snprintf(err, errlen, "the backup's destination must be a plain absolute path (no ..), not '%.200s'", dest);
        return -2;
    }
    for (;;) {
        if (realpath(probe, rdest)) break;
        char *slash = strrchr(probe, '/');
        if (!slash || slash == probe) {
            snprintf(rdest, sizeof rdest, "/");
            break;
        }
        *slash = '\0';
    }
    if (!staging && path_within(rdest, rdata)) {
        snprintf(err, errlen, "the backup's destination %s is inside the data directory %s: it would not survive its loss",
                 dest, rdata);
        return -2;
    }
    if (mkdir_p(dest, 0700) < 0 || !realpath(dest, rdest)) {
        snprintf(err, errlen, "cannot create %s: %s", dest, strerror(errno));
        return -2;
    }
    if (!staging && path_within(rdest, rdata)) {
        snprintf(err, errlen, "the backup's destination %s is inside the data directory %s: it would not survive its loss",
                 rdest, rdata);
        return -2;
    }
    bk b;
    memset(&b, 0, sizeof b);
    b.data = rdata;
    b.link_ok = -1;
    b.sum = out;
    b.err = err;
    b.errlen = errlen;
    /* the folder: the UTC second, and a suffix when two backups share it */
    char stamp[32];
    utc_text(now_ms(), stamp, sizeof stamp, "%Y%m%dT%H%M%SZ");
    int made = 0;
    for (int i = 0; i < 100 && !made; i++) {
        int bad = i ? sfmt(b.dir, sizeof b.dir, "%s/" BACKUP_PREFIX "%s-%d", rdest, stamp, i)
                    : sfmt(b.dir, sizeof b.dir, "%s/" BACKUP_PREFIX "%s", rdest, stamp);
        if (bad < 0) {
            snprintf(err, errlen, "the destination's path is too long");
            return -1;
        }
        if (mkdir(b.dir, 0700) == 0) made = 1;
        else if (errno != EEXIST) {
            snprintf(err, errlen, "cannot create %s: %s", b.dir, strerror(errno));
            return -1;
        }
    }
    if (!made) {
        snprintf(err, errlen, "cannot find a free name for the backup under %s", rdest);
        return -1;
    }
    snprintf(out->path, sizeof out->path, "%s", b.dir);
    b.files = cJSON_CreateArray();
    b.blobs = cJSON_CreateArray();
    b.missing = cJSON_CreateArray();
    int rc = -1;
    char path[PATH_MAX];
    /* 1: what is there now, hard-linked */
    if (sfmt(b.hold, sizeof b.hold, "%s/.backup-hold", rdata) < 0) {
        snprintf(err, errlen, "data directory path too long");
        goto out;
    }
    rm_tree(b.hold); /* an interrupted backup's */
    if (mkdir(b.hold, 0700) < 0) {
        snprintf(err, errlen, "cannot create %s: %s", b.hold, strerror(errno));
        b.hold[0] = '\0';
        goto out;
    }
    int stop = 0;
    for (int k = 0; k < 2 && !stop; k++) {
        prelink_ctx p = {&b, k ? "contexts" : "checkpoints", 0};
        if (sfmt(path, sizeof path, "%s/%s", rdata, p.top) == 0) walk(path, "", prelink_one, &p);
        stop = p.stop;
    }
    /* 2: the database */
    if (sfmt(path, sizeof path, "%s/trainyard.db", b.dir) < 0 || snapshot(&b, path) < 0) goto out;
    /* 3: the files its rows name */
    if (keep_named_blobs(&b, path) < 0) goto out;
    /* 4: tokens, keys, tls/, logs/ */
    for (int i = 0; SINGLE_FILES[i]; i++) {
        char src[PATH_MAX];
        struct stat sb;
        if (sfmt(src, sizeof src, "%s/%s", rdata, SINGLE_FILES[i]) < 0 || lstat(src, &sb) < 0 || !S_ISREG(sb.st_mode))
            continue;
        if (keep_file(&b, src, SINGLE_FILES[i], &sb) < 0) goto out;
    }
    for (int i = 0; TREES[i]; i++) {
        tree_ctx t = {&b, TREES[i]};
        if (sfmt(path, sizeof path, "%s/%s", rdata, TREES[i]) < 0) continue;
        err[0] = '\0';
        if (walk(path, "", tree_cb, &t) != 0) goto out;
    }
    /* 5: every folder's entries on the disk (each file copied was fsynced;
     * a linked one is DATA's, written durably), then the manifest */
    if (fsync_dirs(b.dir, err, errlen) < 0) goto out;
    cJSON *m = cJSON_CreateObject();
    cJSON_AddNumberToObject(m, "format", 1);
    cJSON_AddStringToObject(m, "created_at", out->created_at);
    cJSON_AddStringToObject(m, "server_version", TRAINYARD_VERSION);
    cJSON_AddNumberToObject(m, "schema_version", out->schema_version);
    cJSON_AddStringToObject(m, "db", "trainyard.db");
    cJSON_AddNumberToObject(m, "db_bytes", (double)out->db_bytes);
    cJSON_AddStringToObject(m, "db_sha256", out->db_sha256);
    cJSON_AddStringToObject(m, "blob_store", "");
    cJSON_AddNumberToObject(m, "snapshot_ms", (double)out->snapshot_ms);
    cJSON_AddItemToObject(m, "files", b.files);
    cJSON_AddItemToObject(m, "blobs", b.blobs);
    cJSON_AddItemToObject(m, "missing", b.missing);
    b.files = b.blobs = b.missing = NULL;
    char *text = cJSON_Print(m);
    cJSON_Delete(m);
    if (!text || sfmt(path, sizeof path, "%s/" MANIFEST, b.dir) < 0 ||
        file_write_atomic(path, text, strlen(text), 0600) < 0) {
        snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
        free(text);
        goto out;
    }
    free(text);
    out->took_ms = mono_ms() - t0;
    rc = 0;
out:
    cJSON_Delete(b.files);
    cJSON_Delete(b.blobs);
    cJSON_Delete(b.missing);
    if (b.hold[0]) rm_tree(b.hold); /* step 1's links: the server's files stay in DATA */
    if (rc < 0) {
        if (!err[0]) snprintf(err, errlen, "the backup failed");
        rm_tree(b.dir);
    }
    return rc;
}

cJSON *backup_summary_json(const backup_summary *s) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "path", s->path);
    cJSON_AddStringToObject(o, "created_at", s->created_at);
    cJSON_AddNumberToObject(o, "schema_version", s->schema_version);
    cJSON_AddNumberToObject(o, "db_bytes", (double)s->db_bytes);
    cJSON_AddStringToObject(o, "db_sha256", s->db_sha256);
    cJSON_AddNumberToObject(o, "files", s->files);
    cJSON_AddNumberToObject(o, "file_bytes", (double)s->file_bytes);
    cJSON_AddNumberToObject(o, "blobs", s->blobs);
    cJSON_AddNumberToObject(o, "blobs_linked", s->blobs_linked);
    cJSON_AddNumberToObject(o, "blob_bytes_copied", (double)s->blob_bytes_copied);
    cJSON_AddNumberToObject(o, "blobs_missing", s->blobs_missing);
    cJSON_AddNumberToObject(o, "manifest_objects", s->blobs_remote);
    cJSON_AddNumberToObject(o, "snapshot_ms", (double)s->snapshot_ms);
    cJSON_AddNumberToObject(o, "writer_blocked_ms", 0); /* a read transaction: no writer waits on it */
    cJSON_AddNumberToObject(o, "took_ms", (double)s->took_ms);
    if (s->store[0]) {
        cJSON_AddStringToObject(o, "store", s->store);
        cJSON_AddNumberToObject(o, "uploaded_bytes", (double)s->uploaded_bytes);
    }
    return o;
}

/* ---------------------------------------------------------------- prune */

typedef struct entry_list {
    char **names;
    int *complete;
    size_t n, cap;
} entry_list;

/* The backups under dest, sorted by name (their UTC time). */
static int list_backups(const char *dest, entry_list *l, char *err, size_t errlen) {
    memset(l, 0, sizeof *l);
    DIR *d = opendir(dest);
    if (!d) {
        snprintf(err, errlen, "cannot open %s: %s", dest, strerror(errno));
        return -1;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, BACKUP_PREFIX, strlen(BACKUP_PREFIX)) != 0) continue;
        char p[PATH_MAX];
        struct stat sb;
        if (sfmt(p, sizeof p, "%s/%s", dest, e->d_name) < 0 || lstat(p, &sb) < 0 || !S_ISDIR(sb.st_mode)) continue;
        if (l->n == l->cap) {
            l->cap = l->cap ? l->cap * 2 : 16;
            l->names = xrealloc(l->names, l->cap * sizeof *l->names);
        }
        l->names[l->n++] = xstrdup(e->d_name);
    }
    closedir(d);
    if (l->n) qsort(l->names, l->n, sizeof *l->names, cmp_str);
    l->complete = xcalloc(l->n ? l->n : 1, sizeof *l->complete);
    for (size_t i = 0; i < l->n; i++) {
        char p[PATH_MAX];
        struct stat sb;
        l->complete[i] = sfmt(p, sizeof p, "%s/%s/" MANIFEST, dest, l->names[i]) == 0 && stat(p, &sb) == 0 &&
                         S_ISREG(sb.st_mode);
    }
    return 0;
}

static void list_release(entry_list *l) {
    for (size_t i = 0; i < l->n; i++) free(l->names[i]);
    free(l->names);
    free(l->complete);
}

int backup_prune(const char *dest, int keep, int *removed, char *err, size_t errlen) {
    *removed = 0;
    entry_list l;
    if (list_backups(dest, &l, err, errlen) < 0) return -1;
    int seen = 0;
    int newest_complete = -1;
    for (size_t i = l.n; i-- > 0;)
        if (l.complete[i]) {
            newest_complete = (int)i;
            break;
        }
    for (size_t i = l.n; i-- > 0;) {
        int drop;
        if (l.complete[i]) drop = ++seen > keep;
        else drop = (int)i < newest_complete; /* a newer one may be being written */
        if (!drop) continue;
        char p[PATH_MAX];
        if (sfmt(p, sizeof p, "%s/%s", dest, l.names[i]) < 0) continue;
        if (l.complete[i]) { /* incomplete first, so a half-removed folder is never taken for a backup */
            char m[PATH_MAX + 16];
            if (sfmt(m, sizeof m, "%s/" MANIFEST, p) == 0 && unlink(m) < 0 && errno != ENOENT) {
                log_warn("backup: cannot remove %s: %s", m, strerror(errno));
                continue;
            }
        }
        rm_tree(p);
        (*removed)++;
    }
    list_release(&l);
    return 0;
}

/* ---------------------------------------------------------------- restore */

/* The backup folder src names: itself when it holds a manifest, else the
 * newest complete backup below it. */
static int resolve_src(const char *src, char *out, size_t cap, char *err, size_t errlen) {
    char m[PATH_MAX];
    struct stat sb;
    if (stat(src, &sb) < 0 || !S_ISDIR(sb.st_mode)) {
        snprintf(err, errlen, "%s is not a folder: %s", src, errno ? strerror(errno) : "not a directory");
        return -1;
    }
    if (sfmt(m, sizeof m, "%s/" MANIFEST, src) == 0 && stat(m, &sb) == 0) return sfmt(out, cap, "%s", src);
    char dbf[PATH_MAX];
    const char *base = strrchr(src, '/');
    base = base ? base + 1 : src;
    if ((sfmt(dbf, sizeof dbf, "%s/trainyard.db", src) == 0 && stat(dbf, &sb) == 0) ||
        strncmp(base, BACKUP_PREFIX, strlen(BACKUP_PREFIX)) == 0) {
        snprintf(err, errlen, "%s has no manifest.json: the backup is incomplete (interrupted, or still being written); "
                 "restore refuses it", src);
        return -1;
    }
    entry_list l;
    if (list_backups(src, &l, err, errlen) < 0) return -1;
    int rc = -1;
    for (size_t i = l.n; i-- > 0;)
        if (l.complete[i]) {
            rc = sfmt(out, cap, "%s/%s", src, l.names[i]);
            break;
        }
    if (rc < 0)
        snprintf(err, errlen, "%s holds no complete backup (a folder " BACKUP_PREFIX "* with a manifest.json)%s", src,
                 l.n ? ": those there have no manifest" : "");
    list_release(&l);
    return rc;
}

static const char *jstr(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int64_t jnum(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? (int64_t)v->valuedouble : -1;
}

/* A relative path of the manifest that stays below its root. */
static int rel_ok(const char *p) {
    return p && p[0] && p[0] != '/' && !strstr(p, "..") && strlen(p) < 512;
}

/* Takes the data directory's server.lock (made if missing) for the
 * restore's length, so no server starts on it meanwhile: the fd, or -1
 * with err when its server runs. */
static int data_dir_lock(const char *dir, char *err, size_t errlen) {
    char p[PATH_MAX];
    if (sfmt(p, sizeof p, "%s/server.lock", dir) < 0) {
        snprintf(err, errlen, "data directory path too long");
        return -1;
    }
    int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(err, errlen, "cannot open %s: %s", p, strerror(errno));
        return -1;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        close(fd);
        snprintf(err, errlen, "a trainyard server runs on %s: stop it before restoring into it", dir);
        return -1;
    }
    return fd;
}

/* Puts the backup's file at from into to: a hard link when both are on one
 * file system, else a copy; either way its bytes are checked against sha. */
static int restore_blob(const char *from, const char *to, const char *sha, char *err, size_t errlen) {
    if (mkdir_parent(to) < 0) {
        snprintf(err, errlen, "cannot create a folder for %s: %s", to, strerror(errno));
        return -1;
    }
    char got[65];
    int64_t n = 0;
    unlink(to);
    if (link(from, to) == 0) {
        err[0] = '\0';
        int rc = sha_file(to, got, &n, err, errlen);
        if (rc == 0 && strcmp(got, sha) == 0) return 0;
        unlink(to);
        if (rc == 0) snprintf(err, errlen, "%s: its sha256 is %s, the manifest says %s", from, got, sha);
        return -1;
    }
    int rc = copy_file(from, to, 0600, sha, got, &n, err, errlen);
    if (rc == -2) snprintf(err, errlen, "%s: its sha256 is %s, the manifest says %s", from, got, sha);
    if (rc == -3) snprintf(err, errlen, "%s is missing from the backup", from);
    return rc == 0 ? 0 : -1;
}

static int64_t count_rows(sqlite3 *c, const char *sql) {
    sqlite3_stmt *st = NULL;
    int64_t n = -1;
    if (sqlite3_prepare_v2(c, sql, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
        n = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return n;
}

/* The copied database at tmp: integrity_check, its schema version, counts. */
static int check_db(const char *tmp, restore_summary *out, char *err, size_t errlen) {
    sqlite3 *c = NULL;
    if (sqlite3_open_v2(tmp, &c, SQLITE_OPEN_READWRITE, NULL) != SQLITE_OK) {
        snprintf(err, errlen, "cannot open the restored database: %s", c ? sqlite3_errmsg(c) : "no memory");
        sqlite3_close(c);
        return -1;
    }
    int rc = -1;
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(c, "PRAGMA integrity_check", -1, &st, NULL) != SQLITE_OK || sqlite3_step(st) != SQLITE_ROW ||
        !sqlite3_column_text(st, 0) || strcmp((const char *)sqlite3_column_text(st, 0), "ok") != 0) {
        snprintf(err, errlen, "the backup's database fails PRAGMA integrity_check: %s",
                 st && sqlite3_column_text(st, 0) ? (const char *)sqlite3_column_text(st, 0) : sqlite3_errmsg(c));
        goto out;
    }
    sqlite3_finalize(st);
    st = NULL;
    int64_t v = count_rows(c, "SELECT coalesce(max(version), 0) FROM schema_migrations");
    if (v != out->schema_version) {
        snprintf(err, errlen, "the backup's database is at schema %lld, its manifest says %d", (long long)v,
                 out->schema_version);
        goto out;
    }
    out->jobs = count_rows(c, "SELECT count(*) FROM jobs");
    out->checkpoints = count_rows(c, "SELECT count(*) FROM checkpoints WHERE deleted_at IS NULL AND path <> ''");
    rc = 0;
out:
    sqlite3_finalize(st);
    sqlite3_close(c);
    return rc;
}

/* One object of another store the manifest lists, and its HEAD's answer. */
typedef struct robj {
    const char *key, *store;
    int64_t size;
    blob_store *st;                   /* the store's handle (of stores[]) */
    int h;                            /* blob_head's code */
    int64_t got;                      /* the size it answered */
    blob_err be;
} robj;

#define HEAD_THREADS 16               /* HEADs in flight (a remote store answers in tens of ms) */

typedef struct head_pool {
    robj *o;
    size_t n;
    size_t next;                      /* __atomic: the next object to HEAD */
} head_pool;

static void *head_worker(void *arg) {
    head_pool *p = arg;
    for (;;) {
        size_t i = __atomic_fetch_add(&p->next, 1, __ATOMIC_RELAXED);
        if (i >= p->n) return NULL;
        robj *r = &p->o[i];
        r->got = -1;
        r->h = blob_head(r->st, r->key, &r->got, NULL, &r->be);
    }
}

/* The objects the manifest lists in other stores, HEADed (HEAD_THREADS in
 * flight; the store is thread-safe), sizes compared; the rows of those not
 * found are marked deleted in the database at tmpdb when allow_missing,
 * else the restore fails naming them. */
static int check_remote(const restore_opts *o, const cJSON *blobs, const char *tmpdb, restore_summary *out, char *err,
                        size_t errlen) {
    const cJSON *it;
    size_t n = 0, cap = 0, nst = 0;
    robj *objs = NULL;
    blob_store *stores[8];
    const char *urls[8];
    int rc = 0;
    cJSON_ArrayForEach(it, blobs) {
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(it, "local"))) continue;
        const char *key = jstr(it, "key"), *store = jstr(it, "store");
        if (!key || !store || !store[0] || !blob_key_valid(key)) {
            snprintf(err, errlen, "the manifest lists an object of another store badly: %.200s", key ? key : "(no key)");
            rc = -1;
            break;
        }
        size_t k;
        for (k = 0; k < nst && strcmp(urls[k], store) != 0; k++) {
        }
        if (k == nst) {
            blob_err be;
            memset(&be, 0, sizeof be);
            if (nst == sizeof stores / sizeof stores[0]) {
                snprintf(err, errlen, "the backup names objects of more than %zu stores", nst);
                rc = -1;
                break;
            }
            int s3 = strncmp(store, "s3://", 5) == 0;
            if (blob_store_open(store, s3 ? o->credentials : NULL, o->data_dir, &stores[nst], &be) != BLOB_OK) {
                snprintf(err, errlen, "the backup's checkpoints are in the store %s, which cannot be opened: %s%s", store,
                         be.msg, s3 && !o->credentials ? " (give --blob-credentials FILE)" : "");
                rc = -1;
                break;
            }
            urls[nst++] = store;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            objs = xrealloc(objs, cap * sizeof *objs);
        }
        memset(&objs[n], 0, sizeof objs[n]);
        objs[n].key = key;
        objs[n].store = store;
        objs[n].size = jnum(it, "size");
        objs[n].st = stores[k];
        n++;
        if (strncmp(key, "checkpoints/", 12) == 0) out->checkpoints_remote++;
    }
    if (rc == 0 && n) {
        head_pool pool = {objs, n, 0};
        pthread_t th[HEAD_THREADS];
        int started = 0;
        for (int i = 0; i < HEAD_THREADS && (size_t)i < n; i++)
            if (pthread_create(&th[started], NULL, head_worker, &pool) == 0) started++;
        if (started == 0) head_worker(&pool); /* no thread: this one does them all */
        for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    }
    buf miss;
    buf_init(&miss, 4096);
    int nmiss = 0;
    const char *miss_store = "";
    sqlite3 *c = NULL;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        robj *r = &objs[i];
        if (r->h == BLOB_OK && (r->size < 0 || r->got == r->size)) continue;
        if (r->h != BLOB_OK && r->h != BLOB_NOT_FOUND) {
            snprintf(err, errlen, "HEAD %s in %s: %s (%s): the store must answer to check the backup", r->key, r->store,
                     blob_strerror(r->h), r->be.msg);
            rc = -1;
            break;
        }
        nmiss++;
        out->remote_missing++;
        miss_store = r->store;
        if (miss.len < 3000)
            buf_printf(&miss, "%s%s%s", miss.len ? ", " : "", r->key, r->h == BLOB_OK ? " (another size)" : "");
        if (o->allow_missing && strncmp(r->key, "checkpoints/", 12) == 0) {
            if (!c && sqlite3_open_v2(tmpdb, &c, SQLITE_OPEN_READWRITE, NULL) != SQLITE_OK) {
                snprintf(err, errlen, "cannot open the restored database: %s", c ? sqlite3_errmsg(c) : "no memory");
                rc = -1;
                break;
            }
            sqlite3_stmt *q = NULL;
            if (sqlite3_prepare_v2(c, "UPDATE checkpoints SET deleted_at = ? WHERE path = ? AND store = ? AND deleted_at IS NULL",
                                   -1, &q, NULL) != SQLITE_OK) {
                snprintf(err, errlen, "cannot mark %s deleted: %s", r->key, sqlite3_errmsg(c));
                rc = -1;
                break;
            }
            sqlite3_bind_int64(q, 1, now_ms());
            sqlite3_bind_text(q, 2, r->key + 12, -1, SQLITE_STATIC);
            sqlite3_bind_text(q, 3, r->store, -1, SQLITE_STATIC);
            int s = sqlite3_step(q);
            sqlite3_finalize(q);
            if (s != SQLITE_DONE) {
                snprintf(err, errlen, "cannot mark %s deleted: %s", r->key, sqlite3_errmsg(c));
                rc = -1;
                break;
            }
        }
    }
    for (size_t k = 0; k < nst; k++) blob_store_close(stores[k]);
    free(objs);
    if (c && sqlite3_close(c) != SQLITE_OK && rc == 0) {
        snprintf(err, errlen, "cannot close the restored database");
        rc = -1;
    }
    if (rc == 0 && nmiss && !o->allow_missing) {
        snprintf(err, errlen, "%d object%s the backup names %s missing from %s: %s; give --allow-missing to restore "
                 "without them (their checkpoints marked deleted)",
                 nmiss, nmiss == 1 ? "" : "s", nmiss == 1 ? "is" : "are", miss_store, miss.data ? miss.data : "");
        rc = -1;
    }
    if (rc == 0 && nmiss)
        log_warn("restore: %d object%s missing from the store, marked deleted: %s", nmiss, nmiss == 1 ? "" : "s",
                 miss.data ? miss.data : "");
    buf_release(&miss);
    return rc;
}

/* The checkpoint files the backup's manifest says were gone from the data
 * directory when it was taken (a prune racing a copy): their rows are
 * marked deleted in the database at tmpdb, so the restored server lists
 * no checkpoint it cannot serve. A context's row stays (its file is
 * uploaded again by whoever submits it). */
static int mark_missing(const cJSON *missing, const char *tmpdb, restore_summary *out, char *err, size_t errlen) {
    int n = cJSON_GetArraySize(missing);
    out->blobs_missing = n;
    if (n == 0) return 0;
    sqlite3 *c = NULL;
    if (sqlite3_open_v2(tmpdb, &c, SQLITE_OPEN_READWRITE, NULL) != SQLITE_OK) {
        snprintf(err, errlen, "cannot open the restored database: %s", c ? sqlite3_errmsg(c) : "no memory");
        sqlite3_close(c);
        return -1;
    }
    int store = has_column(c, "checkpoints", "store");
    const char *sql = store ? "UPDATE checkpoints SET deleted_at = ? WHERE path = ? AND store = '' AND deleted_at IS NULL"
                            : "UPDATE checkpoints SET deleted_at = ? WHERE path = ? AND deleted_at IS NULL";
    int rc = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, missing) {
        const char *key = jstr(it, "key");
        if (!key || strncmp(key, "checkpoints/", 12) != 0) continue;
        sqlite3_stmt *q = NULL;
        if (sqlite3_prepare_v2(c, sql, -1, &q, NULL) != SQLITE_OK) {
            rc = -1;
            break;
        }
        sqlite3_bind_int64(q, 1, now_ms());
        sqlite3_bind_text(q, 2, key + 12, -1, SQLITE_STATIC);
        int s = sqlite3_step(q);
        sqlite3_finalize(q);
        if (s != SQLITE_DONE) {
            rc = -1;
            break;
        }
        log_warn("restore: %s was missing when the backup was taken: its checkpoint is marked deleted", key);
    }
    if (rc < 0) snprintf(err, errlen, "cannot mark the missing checkpoints deleted: %s", sqlite3_errmsg(c));
    if (sqlite3_close(c) != SQLITE_OK && rc == 0) {
        snprintf(err, errlen, "cannot close the restored database");
        rc = -1;
    }
    return rc;
}

static int restore_folder(const restore_opts *o, int locked, restore_summary *out, char *err, size_t errlen);

int backup_restore(const restore_opts *o, restore_summary *out, char *err, size_t errlen) {
    return restore_folder(o, 0, out, err, errlen);
}

/* locked: the caller holds data_dir's server.lock (an s3 restore's) */
static int restore_folder(const restore_opts *o, int locked, restore_summary *out, char *err, size_t errlen) {
    const char *src = o->src, *data_dir = o->data_dir;
    int force = o->force;
    int lock_fd = -1;
    memset(out, 0, sizeof *out);
    err[0] = '\0';
    char bdir[PATH_MAX], p[PATH_MAX], q[PATH_MAX];
    if (resolve_src(src, bdir, sizeof bdir, err, errlen) < 0) return -1;
    snprintf(out->path, sizeof out->path, "%s", bdir);
    if (sfmt(p, sizeof p, "%s/" MANIFEST, bdir) < 0) {
        snprintf(err, errlen, "path too long: %s", bdir);
        return -1;
    }
    size_t mlen = 0;
    char *mtext = file_read_all(p, MANIFEST_MAX, &mlen);
    if (!mtext) {
        snprintf(err, errlen, "cannot read %s: %s", p, strerror(errno));
        return -1;
    }
    cJSON *m = cJSON_ParseWithLength(mtext, mlen);
    free(mtext);
    int rc = -1;
    char tmpdb[PATH_MAX] = "";
    if (!cJSON_IsObject(m) || jnum(m, "format") != 1 || !jstr(m, "db_sha256") || jnum(m, "schema_version") < 1) {
        snprintf(err, errlen, "%s is not a trainyard backup manifest (format 1)", p);
        goto out;
    }
    out->schema_version = (int)jnum(m, "schema_version");
    snprintf(out->created_at, sizeof out->created_at, "%s", jstr(m, "created_at") ? jstr(m, "created_at") : "?");
    if (out->schema_version > db_migrations_count()) {
        snprintf(err, errlen, "the backup's schema (version %d) is newer than this trainyard knows (%d): restore it "
                 "with the version that made it (%s) or a newer one", out->schema_version, db_migrations_count(),
                 jstr(m, "server_version") ? jstr(m, "server_version") : "?");
        goto out;
    }
    /* the target: no server on it, no database in it unless --force */
    if (mkdir_p(data_dir, 0700) < 0) {
        snprintf(err, errlen, "cannot create %s: %s", data_dir, strerror(errno));
        goto out;
    }
    if (!locked && (lock_fd = data_dir_lock(data_dir, err, errlen)) < 0) goto out;
    struct stat sb;
    if (sfmt(q, sizeof q, "%s/trainyard.db", data_dir) < 0) {
        snprintf(err, errlen, "data directory path too long");
        goto out;
    }
    if (stat(q, &sb) == 0 && !force) {
        snprintf(err, errlen, "%s already holds a database (trainyard.db): restore into an empty folder, or give "
                 "--force to replace it", data_dir);
        goto out;
    }
    /* the database, copied to a temporary name and checked */
    if (sfmt(p, sizeof p, "%s/trainyard.db", bdir) < 0 || sfmt(tmpdb, sizeof tmpdb, "%s/.trainyard.db.restore", data_dir) < 0) {
        snprintf(err, errlen, "path too long");
        goto out;
    }
    char got[65];
    int64_t n = 0;
    int c = copy_file(p, tmpdb, 0600, jstr(m, "db_sha256"), got, &n, err, errlen);
    if (c == -2) snprintf(err, errlen, "%s: its sha256 is %s, the manifest says %s", p, got, jstr(m, "db_sha256"));
    if (c == -3) snprintf(err, errlen, "%s is missing: the backup is damaged", p);
    if (c != 0) goto out;
    if (check_db(tmpdb, out, err, errlen) < 0) goto out;
    /* files/ with their modes */
    cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(m, "files")) {
        const char *rel = jstr(it, "path"), *sha = jstr(it, "sha256");
        int64_t mode = jnum(it, "mode");
        if (!rel_ok(rel) || !sha || mode < 0 || mode > 0777) {
            snprintf(err, errlen, "the manifest lists a file badly: %.200s", rel ? rel : "(no path)");
            goto out;
        }
        if (sfmt(p, sizeof p, "%s/files/%s", bdir, rel) < 0 || sfmt(q, sizeof q, "%s/%s", data_dir, rel) < 0 ||
            mkdir_parent(q) < 0) {
            snprintf(err, errlen, "cannot make a place for %s", rel);
            goto out;
        }
        c = copy_file(p, q, (int)mode, sha, got, &n, err, errlen);
        if (c == -2) snprintf(err, errlen, "%s: its sha256 is %s, the manifest says %s", p, got, sha);
        if (c == -3) snprintf(err, errlen, "%s is missing from the backup", p);
        if (c != 0) goto out;
        out->files++;
    }
    /* blobs/ into the data directory's stores */
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(m, "blobs")) {
        const char *key = jstr(it, "key"), *sha = jstr(it, "sha256");
        if (!rel_ok(key) || !sha) {
            snprintf(err, errlen, "the manifest lists a blob badly: %.200s", key ? key : "(no key)");
            goto out;
        }
        if (!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(it, "local"))) continue; /* check_remote's */
        if (sfmt(p, sizeof p, "%s/blobs/%s", bdir, key) < 0 || sfmt(q, sizeof q, "%s/%s", data_dir, key) < 0) {
            snprintf(err, errlen, "path too long: %s", key);
            goto out;
        }
        if (restore_blob(p, q, sha, err, errlen) < 0) goto out;
        out->blobs++;
        out->checkpoints_local += strncmp(key, "checkpoints/", 12) == 0;
    }
    if (mark_missing(cJSON_GetObjectItemCaseSensitive(m, "missing"), tmpdb, out, err, errlen) < 0) goto out;
    if (check_remote(o, cJSON_GetObjectItemCaseSensitive(m, "blobs"), tmpdb, out, err, errlen) < 0) goto out;
    /* the database last: a stale WAL of a replaced one must not be replayed onto it */
    for (int i = 0; i < 2; i++) {
        if (sfmt(q, sizeof q, "%s/trainyard.db%s", data_dir, i ? "-shm" : "-wal") == 0 && unlink(q) < 0 &&
            errno != ENOENT) {
            snprintf(err, errlen, "cannot remove %s: %s", q, strerror(errno));
            goto out;
        }
    }
    if (sfmt(q, sizeof q, "%s/trainyard.db", data_dir) < 0 || rename(tmpdb, q) < 0 || fsync_dir(data_dir) < 0) {
        snprintf(err, errlen, "cannot put the database in place at %s: %s", q, strerror(errno));
        goto out;
    }
    tmpdb[0] = '\0';
    rc = 0;
out:
    if (tmpdb[0]) unlink(tmpdb);
    if (lock_fd >= 0) close(lock_fd);
    cJSON_Delete(m);
    return rc;
}

/* ---------------------------------------------------------------- s3 destinations
 *
 * A backup to s3://BUCKET[/PREFIX]?endpoint=...: the same folder made in
 * DATA/.backup-staging (the blobs hard-linked, no copy), each of its files
 * PUT under backups/<name>/ (blob_put_file streams, multipart past one
 * PUT), manifest.json last; the staging folder removed. A restore from
 * s3:// downloads the newest complete one into DIR/.restore-staging and
 * restores from there. */

#define STAGE_BACKUP ".backup-staging"
#define STAGE_RESTORE ".restore-staging"
#define S3_PREFIX "backups/"

typedef struct up_ctx {
    blob_store *st;
    const char *name;
    int64_t bytes;
    int n;
    char *err;
    size_t errlen;
} up_ctx;

static int upload_one(void *ctx, const char *abs, const char *rel, const struct stat *sb) {
    up_ctx *u = ctx;
    if (strcmp(rel, MANIFEST) == 0) return 0; /* last */
    char key[512];
    blob_err be;
    memset(&be, 0, sizeof be);
    if (sfmt(key, sizeof key, S3_PREFIX "%s/%s", u->name, rel) < 0 || !blob_key_valid(key)) {
        snprintf(u->err, u->errlen, "%s cannot be a key of the store (its name)", rel);
        return 1;
    }
    int rc = blob_put_file(u->st, key, abs, &be);
    if (rc != BLOB_OK) {
        snprintf(u->err, u->errlen, "PUT %s: %s (%s)", key, blob_strerror(rc), be.msg);
        return 1;
    }
    u->bytes += sb->st_size;
    u->n++;
    return 0;
}

static int open_s3(const char *url, const char *credentials, const char *data_dir, blob_store **st, char *err,
                   size_t errlen) {
    blob_err be;
    memset(&be, 0, sizeof be);
    *st = NULL;
    if (blob_store_open(url, credentials, data_dir, st, &be) != BLOB_OK) {
        snprintf(err, errlen, "%s", be.msg[0] ? be.msg : "the s3 store cannot be opened");
        return -1;
    }
    if (!blob_store_is_s3(*st)) {
        blob_store_close(*st);
        *st = NULL;
        snprintf(err, errlen, "not an s3:// store (a backup goes to a folder or to s3://BUCKET[/PREFIX]?endpoint=URL)");
        return -1;
    }
    return 0;
}

int backup_run_s3(const char *data_dir, const char *dest, const char *credentials, backup_summary *out, char *err,
                  size_t errlen) {
    memset(out, 0, sizeof *out);
    int64_t t0 = mono_ms();
    blob_store *st = NULL;
    if (open_s3(dest, credentials, data_dir, &st, err, errlen) < 0) return -2;
    char stage[PATH_MAX];
    if (sfmt(stage, sizeof stage, "%s/" STAGE_BACKUP, data_dir) < 0) {
        blob_store_close(st);
        snprintf(err, errlen, "data directory path too long");
        return -1;
    }
    rm_tree(stage); /* an interrupted one's */
    int rc = backup_into(data_dir, stage, 1, out, err, errlen);
    if (rc < 0) {
        rm_tree(stage);
        blob_store_close(st);
        return -1;
    }
    const char *name = strrchr(out->path, '/');
    name = name ? name + 1 : out->path;
    up_ctx u = {st, name, 0, 0, err, errlen};
    char key[512], mpath[PATH_MAX + 32];
    blob_err be;
    memset(&be, 0, sizeof be);
    err[0] = '\0';
    if (walk(out->path, "", upload_one, &u) != 0) rc = -1;
    else if (sfmt(key, sizeof key, S3_PREFIX "%s/" MANIFEST, name) < 0 ||
             sfmt(mpath, sizeof mpath, "%s/" MANIFEST, out->path) < 0) {
        snprintf(err, errlen, "path too long");
        rc = -1;
    } else {
        int b = blob_put_file(st, key, mpath, &be);
        if (b != BLOB_OK) {
            snprintf(err, errlen, "PUT %s: %s (%s)", key, blob_strerror(b), be.msg);
            rc = -1;
        }
    }
    char keyname[600];
    if (sfmt(keyname, sizeof keyname, S3_PREFIX "%s", name) < 0) keyname[0] = '\0';
    rm_tree(stage);
    if (rc == 0) {
        snprintf(out->path, sizeof out->path, "%s", keyname);
        snprintf(out->store, sizeof out->store, "%s", blob_store_url(st));
        out->uploaded_bytes = u.bytes;
        out->took_ms = mono_ms() - t0;
    } else if (!err[0]) {
        snprintf(err, errlen, "the upload to %s failed", blob_store_url(st));
    }
    blob_store_close(st);
    return rc;
}

/* The backups under backups/ of a store: their names, sorted, and which
 * have a manifest. */
typedef struct s3_names {
    entry_list l;
    int failed;
} s3_names;

static int s3_name_cb(void *ctx, const char *key, int64_t size) {
    (void)size;
    s3_names *s = ctx;
    entry_list *l = &s->l;
    const char *p = key + strlen(S3_PREFIX);
    if (strncmp(key, S3_PREFIX BACKUP_PREFIX, strlen(S3_PREFIX BACKUP_PREFIX)) != 0) return 0;
    const char *slash = strchr(p, '/');
    if (!slash) return 0;
    size_t n = (size_t)(slash - p);
    size_t i;
    for (i = 0; i < l->n; i++)
        if (strlen(l->names[i]) == n && strncmp(l->names[i], p, n) == 0) break;
    if (i == l->n) {
        if (l->n == l->cap) {
            l->cap = l->cap ? l->cap * 2 : 16;
            l->names = xrealloc(l->names, l->cap * sizeof *l->names);
            l->complete = xrealloc(l->complete, l->cap * sizeof *l->complete);
        }
        l->names[l->n] = xstrndup(p, n);
        l->complete[l->n++] = 0;
    }
    if (strcmp(slash + 1, MANIFEST) == 0) l->complete[i] = 1;
    return 0;
}

static int s3_list_backups(blob_store *st, entry_list *out, char *err, size_t errlen) {
    s3_names s;
    memset(&s, 0, sizeof s);
    blob_err be;
    memset(&be, 0, sizeof be);
    int rc = blob_list(st, S3_PREFIX, s3_name_cb, &s, &be);
    if (rc != BLOB_OK) {
        snprintf(err, errlen, "listing %s" S3_PREFIX ": %s (%s)", blob_store_url(st), blob_strerror(rc), be.msg);
        list_release(&s.l);
        return -1;
    }
    /* sort names and flags together */
    for (size_t i = 1; i < s.l.n; i++)
        for (size_t j = i; j > 0 && strcmp(s.l.names[j - 1], s.l.names[j]) > 0; j--) {
            char *t = s.l.names[j];
            s.l.names[j] = s.l.names[j - 1];
            s.l.names[j - 1] = t;
            int c = s.l.complete[j];
            s.l.complete[j] = s.l.complete[j - 1];
            s.l.complete[j - 1] = c;
        }
    if (!s.l.complete) s.l.complete = xcalloc(1, sizeof *s.l.complete);
    *out = s.l;
    return 0;
}

typedef struct key_list {
    char **keys;
    size_t n, cap;
} key_list;

static int key_cb(void *ctx, const char *key, int64_t size) {
    (void)size;
    key_list *k = ctx;
    if (k->n == k->cap) {
        k->cap = k->cap ? k->cap * 2 : 64;
        k->keys = xrealloc(k->keys, k->cap * sizeof *k->keys);
    }
    k->keys[k->n++] = xstrdup(key);
    return 0;
}

static void keys_release(key_list *k) {
    for (size_t i = 0; i < k->n; i++) free(k->keys[i]);
    free(k->keys);
}

/* Removes every object of the backup name (its manifest first). */
static int s3_remove_backup(blob_store *st, const char *name, char *err, size_t errlen) {
    char prefix[512], key[600];
    blob_err be;
    memset(&be, 0, sizeof be);
    if (sfmt(prefix, sizeof prefix, S3_PREFIX "%s/", name) < 0 || sfmt(key, sizeof key, "%s" MANIFEST, prefix) < 0)
        return -1;
    int rc = blob_delete(st, key, &be);
    key_list k;
    memset(&k, 0, sizeof k);
    if (rc == BLOB_OK) rc = blob_list(st, prefix, key_cb, &k, &be);
    for (size_t i = 0; rc == BLOB_OK && i < k.n; i++) rc = blob_delete(st, k.keys[i], &be);
    keys_release(&k);
    if (rc != BLOB_OK) {
        snprintf(err, errlen, "removing %s: %s (%s)", prefix, blob_strerror(rc), be.msg);
        return -1;
    }
    return 0;
}

int backup_prune_s3(const char *dest, const char *credentials, int keep, int *removed, char *err, size_t errlen) {
    *removed = 0;
    blob_store *st = NULL;
    if (open_s3(dest, credentials, NULL, &st, err, errlen) < 0) return -1;
    entry_list l;
    if (s3_list_backups(st, &l, err, errlen) < 0) {
        blob_store_close(st);
        return -1;
    }
    int newest_complete = -1, seen = 0, rc = 0;
    for (size_t i = l.n; i-- > 0;)
        if (l.complete[i]) {
            newest_complete = (int)i;
            break;
        }
    for (size_t i = l.n; i-- > 0 && rc == 0;) {
        int drop = l.complete[i] ? ++seen > keep : (int)i < newest_complete;
        if (!drop) continue;
        if (s3_remove_backup(st, l.names[i], err, errlen) < 0) rc = -1;
        else (*removed)++;
    }
    list_release(&l);
    blob_store_close(st);
    return rc;
}

int backup_restore_s3(const restore_opts *o, restore_summary *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    blob_store *st = NULL;
    if (open_s3(o->src, o->credentials, NULL, &st, err, errlen) < 0) return -1;
    int rc = -1, lock_fd = -1;
    entry_list l;
    memset(&l, 0, sizeof l);
    key_list k;
    memset(&k, 0, sizeof k);
    char stage[PATH_MAX] = "", local[PATH_MAX], dbf[PATH_MAX];
    struct stat sb;
    /* the target's refusals before any download */
    if (mkdir_p(o->data_dir, 0700) < 0) {
        snprintf(err, errlen, "cannot create %s: %s", o->data_dir, strerror(errno));
        goto out;
    }
    if ((lock_fd = data_dir_lock(o->data_dir, err, errlen)) < 0) goto out;
    if (sfmt(dbf, sizeof dbf, "%s/trainyard.db", o->data_dir) == 0 && stat(dbf, &sb) == 0 && !o->force) {
        snprintf(err, errlen, "%s already holds a database (trainyard.db): restore into an empty folder, or give "
                 "--force to replace it", o->data_dir);
        goto out;
    }
    if (s3_list_backups(st, &l, err, errlen) < 0) goto out;
    int pick = -1;
    for (size_t i = l.n; i-- > 0;)
        if (l.complete[i]) {
            pick = (int)i;
            break;
        }
    if (pick < 0) {
        snprintf(err, errlen, "%s holds no complete backup under " S3_PREFIX " (one with a manifest.json)%s",
                 blob_store_url(st), l.n ? ": those there have none" : "");
        goto out;
    }
    char prefix[512];
    blob_err be;
    memset(&be, 0, sizeof be);
    if (sfmt(prefix, sizeof prefix, S3_PREFIX "%s/", l.names[pick]) < 0 ||
        sfmt(stage, sizeof stage, "%s/" STAGE_RESTORE, o->data_dir) < 0) {
        snprintf(err, errlen, "path too long");
        stage[0] = '\0';
        goto out;
    }
    rm_tree(stage);
    int b = blob_list(st, prefix, key_cb, &k, &be);
    if (b != BLOB_OK) {
        snprintf(err, errlen, "listing %s: %s (%s)", prefix, blob_strerror(b), be.msg);
        goto out;
    }
    for (size_t i = 0; i < k.n; i++) {
        if (sfmt(local, sizeof local, "%s/%s/%s", stage, l.names[pick], k.keys[i] + strlen(prefix)) < 0 ||
            mkdir_parent(local) < 0) {
            snprintf(err, errlen, "cannot make a place for %s", k.keys[i]);
            goto out;
        }
        b = blob_get_file(st, k.keys[i], local, &be);
        if (b != BLOB_OK) {
            snprintf(err, errlen, "GET %s: %s (%s)", k.keys[i], blob_strerror(b), be.msg);
            goto out;
        }
    }
    restore_opts o2 = *o;
    if (sfmt(local, sizeof local, "%s/%s", stage, l.names[pick]) < 0) goto out;
    o2.src = local;
    rc = restore_folder(&o2, 1, out, err, errlen);
    if (rc == 0) snprintf(out->path, sizeof out->path, "%s %s", blob_store_url(st), prefix);
out:
    if (stage[0]) rm_tree(stage);
    if (lock_fd >= 0) close(lock_fd);
    keys_release(&k);
    list_release(&l);
    blob_store_close(st);
    return rc;
}
