/* backup.h - a consistent copy of a data directory while its server runs,
 * and its restore on another machine (docs/reliability.md, "Backups and
 * restore").
 *
 * A backup is the folder DEST/trainyard-backup-<UTC time>/ holding
 * trainyard.db (SQLite's online backup of the live database, through a
 * connection of its own that only reads: writers in WAL mode go on),
 * files/ (the tokens, attempt.key, tls/ and logs/, copied), blobs/ (the
 * checkpoint and context files the snapshot's rows name: hard links when
 * DEST is on DATA's file system, else copies checked against the rows'
 * sha256) and manifest.json, written last (temp, fsync, rename): a folder
 * without it is incomplete, and restore refuses it.
 *
 * This module knows the data directory's layout and SQLite; nothing of
 * HTTP or of the server's threads (api/backup_api.c calls it).
 *
 * defines: backup_run, backup_run_s3, backup_summary_json, backup_prune,
 *          backup_prune_s3, backup_restore_s3, backup_restore, backup_summary,
 *          restore_summary, BACKUP_PREFIX */
#ifndef TRAINYARD_BACKUP_H
#define TRAINYARD_BACKUP_H

#include <limits.h>
#include <stdint.h>
#include <stddef.h>

#define BACKUP_PREFIX "trainyard-backup-"

typedef struct backup_summary {
    char path[PATH_MAX];       /* the backup's folder */
    char created_at[32];       /* "2026-11-28T15:01:02Z": when the snapshot was taken */
    int schema_version;        /* of the snapshot */
    int64_t db_bytes;          /* the snapshot's size */
    char db_sha256[65];
    int files;                 /* under files/ */
    int64_t file_bytes;
    int blobs;                 /* local checkpoint and context files the snapshot names, in blobs/ */
    int blobs_linked;          /* of them, hard links */
    int64_t blob_bytes_copied; /* bytes copied (and checked) for the others */
    int blobs_missing;         /* named by a row but gone (or not matching its sha256): listed in the manifest */
    int blobs_remote;          /* rows naming another store's objects: listed in the manifest, not copied */
    int64_t snapshot_ms;       /* sqlite3_backup_step(-1): the read transaction's length */
    int64_t took_ms;           /* the whole backup */
    char store[512];           /* an s3 backup's store (path is then its key prefix "backups/<name>"); "" */
    int64_t uploaded_bytes;    /* an s3 backup's bytes PUT */
} backup_summary;

/* Backs up the data directory data_dir (its trainyard.db and files) into a
 * new folder under dest (an absolute directory, made 0700 if missing; not
 * inside data_dir). Safe while a server writes the database: the snapshot
 * takes no write lock. 0 with *out; -2 with err when dest is wrong (not
 * absolute, cannot be made, inside data_dir); -1 with err for any other
 * failure (the unfinished folder is removed). */
int backup_run(const char *data_dir, const char *dest, backup_summary *out, char *err, size_t errlen);

/* The same to an s3 store (dest "s3://BUCKET[/PREFIX]?endpoint=URL&region=R",
 * credentials its AWS shared-credentials file): the folder is made in
 * data_dir/.backup-staging (links, no copies), its files PUT under
 * backups/<name>/ with manifest.json last, the staging removed. 0, -2
 * (dest or credentials wrong: err), -1 (err). */
int backup_run_s3(const char *data_dir, const char *dest, const char *credentials, backup_summary *out, char *err,
                  size_t errlen);

/* The summary as the API answers it (POST /api/v1/backups): a cJSON
 * object the caller deletes. */
struct cJSON;
struct cJSON *backup_summary_json(const backup_summary *s);

/* Keeps the newest `keep` complete backups under dest and removes the
 * older ones, and the incomplete folders (no manifest.json) older than the
 * newest complete one (a newer one may be being written). *removed: how
 * many went. 0, or -1 with err. */
int backup_prune(const char *dest, int keep, int *removed, char *err, size_t errlen);

/* backup_prune for an s3 destination: backups/<name>/ objects, the
 * manifest deleted first. */
int backup_prune_s3(const char *dest, const char *credentials, int keep, int *removed, char *err, size_t errlen);

typedef struct restore_summary {
    char path[PATH_MAX];       /* the backup restored */
    char created_at[32];
    int schema_version;
    int64_t jobs;
    int64_t checkpoints;       /* live checkpoint rows */
    int64_t checkpoints_local; /* of them, files restored */
    int64_t checkpoints_remote;/* of them, objects of another store (file:// or s3://), each HEADed */
    int64_t remote_missing;    /* of those, not found (then marked deleted: allow_missing) */
    int files;                 /* tokens, keys, tls/, logs/ restored */
    int blobs;                 /* checkpoint and context files restored */
    int blobs_missing;         /* listed as missing when the backup was taken (checkpoints: marked deleted) */
} restore_summary;

typedef struct restore_opts {
    const char *src;           /* a backup folder, or a folder of backups (the newest complete one) */
    const char *data_dir;
    int force;                 /* replace a database data_dir holds */
    const char *credentials;   /* the store's credentials file (s3), or NULL */
    int allow_missing;         /* objects of another store not found: their checkpoints marked deleted */
} restore_opts;

/* Restores the backup o->src into o->data_dir. Refuses: a data_dir that
 * holds a database (unless force) or whose server runs, a backup without
 * manifest.json, a schema newer than this build's. Checks the database's
 * sha256 and PRAGMA integrity_check and every file's sha256; restores the
 * files with their modes; HEADs every object the manifest lists in
 * another store (a file:// or s3:// blob store): missing ones are named in
 * err and the restore fails, unless allow_missing (their rows are then
 * marked deleted); the database is renamed into place last, so a failed
 * restore leaves no database behind. 0 with *out, or -1 with err. */
int backup_restore(const restore_opts *o, restore_summary *out, char *err, size_t errlen);

/* The same from an s3 store (o->src "s3://...", o->credentials): the newest
 * complete backup under backups/ downloaded into data_dir/.restore-staging,
 * restored from there, the staging removed. */
int backup_restore_s3(const restore_opts *o, restore_summary *out, char *err, size_t errlen);

#endif
