/* ctxtar.h - a job's context: a folder of the team's code packed as a
 * gzip'd tar (libarchive), checked before anything keeps it, and unpacked
 * on a node into a task's own working directory.
 *
 * Packing (the CLI, `trainyard submit --context DIR`) walks DIR in name
 * order, leaves out what DIR/.trainyardignore names (.gitignore's pattern
 * rules) and refuses a symbolic link that leads out of DIR; the archive is
 * reproducible: the same files give the same bytes (owner 0, no names, no
 * gzip time stamp), so the same folder gives the same id.
 *
 * Checking (the server, on upload) reads the whole archive and refuses, naming
 * the entry: an absolute path, a `..` component, a device, FIFO or socket, a
 * symbolic link whose target leaves the archive's root, a hard link to a name
 * not earlier in the archive, more than ctx_limits.max_files entries, or more
 * than ctx_limits.max_unpacked bytes once unpacked (a gzip bomb).
 *
 * Unpacking (the agent) checks the same again (the node trusts no one), then
 * writes under the directory it is given, never outside it, files owned by
 * the given uid/gid (when the caller is root), modes kept less set-id bits.
 *
 * defines: ctx_limits, ctx_info, ctx_limits_default, ctx_pack, ctx_check,
 *          ctx_unpack, ctx_ignore, ctx_ignore_load, ctx_ignore_match,
 *          ctx_ignore_free */
#ifndef TRAINYARD_CTXTAR_H
#define TRAINYARD_CTXTAR_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct ctx_limits {
    int64_t max_files;             /* entries (files, directories, links); default 100,000 */
    int64_t max_unpacked;          /* bytes of file data once unpacked; default 1 GiB */
    int (*cancel)(void *ctx);      /* ctx_unpack: asked before each entry and 64 KiB of data;
                                    * non-zero stops it ("cancelled"). Default NULL */
    void *cancel_ctx;
} ctx_limits;

typedef struct ctx_info {
    int64_t files;                 /* regular files */
    int64_t entries;               /* every entry */
    int64_t unpacked;              /* bytes of file data */
    int64_t packed;                /* bytes of the gzip'd tar */
    char sha256[65];               /* hex sha256 of the gzip'd tar (ctx_pack only) */
} ctx_info;

void ctx_limits_default(ctx_limits *l);

/* Packs dir into out_path (created 0600, replaced atomically). 0, or -1 with
 * a message naming the path at fault in err. */
int ctx_pack(const char *dir, const char *out_path, ctx_info *info, char *err, size_t errlen);

/* Checks a gzip'd tar held in memory. 0 with info filled, or -1 with err
 * naming the entry ("entry '../x': a '..' component") or the format fault. */
int ctx_check(const void *data, size_t len, const ctx_limits *lim, ctx_info *info, char *err, size_t errlen);

/* Unpacks the gzip'd tar at tar_path into dir (which exists and is empty),
 * checking as ctx_check does; owned by uid:gid when uid != (uid_t)-1.
 * 0, or -1 with err (what was written may stay: the caller removes dir). */
int ctx_unpack(const char *tar_path, const char *dir, uid_t uid, gid_t gid, const ctx_limits *lim, char *err,
               size_t errlen);

/* .trainyardignore: the patterns of .gitignore (comments, blank lines, `!`
 * negation, a leading or middle `/` anchors to the root, a trailing `/`
 * matches directories only, `*`, `?`, `[...]`, `**`). */
typedef struct ctx_ignore ctx_ignore;
/* Loads dir/.trainyardignore (none: an empty list). NULL only on no memory. */
ctx_ignore *ctx_ignore_load(const char *dir);
/* Parses patterns from text (one a line). */
ctx_ignore *ctx_ignore_parse(const char *text);
/* 1 when the path (relative to the root, '/'-separated, no leading '/')
 * is left out. A directory left out leaves out all below it (the caller does
 * not descend). */
int ctx_ignore_match(const ctx_ignore *ig, const char *rel, int is_dir);
void ctx_ignore_free(ctx_ignore *ig);

#endif
