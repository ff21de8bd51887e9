/* quota.h - what the teams' data holds on the server's disk, and its
 * bounds: a team's storage quota (teams.storage_quota) and the free space
 * the server keeps on its data directory's file system (the disk reserve).
 *
 * A team's use is its logs (jobs.log_bytes of its jobs not deleted), its
 * checkpoints (checkpoints.size of the visible ones) and its contexts
 * (contexts.bytes). Summing those rows on every log post would cost a scan
 * per request, so the server keeps a figure per team in memory: read from
 * the rows on first use and again every QUOTA_RELOAD_MS (or sooner after
 * quota_forget), plus every write accepted since (quota_add). The rows are
 * durable, so a restarted server starts right. Storage only: the API
 * decides what a write past a bound gets.
 *
 * defines: quota_use, quota_use_read, quota_team_set, quota_check,
 *          quota_add, quota_forget, quota_note_once, quota_disk_reserve_set,
 *          quota_disk_low, quota_team_name, quota_fmt_bytes */
#ifndef TRAINYARD_QUOTA_H
#define TRAINYARD_QUOTA_H

#include <stddef.h>
#include <stdint.h>
#include "db.h"
#include "store.h"

#define QUOTA_RELOAD_MS 10000        /* the in-memory figure is read again from the rows this often */
#define QUOTA_DISK_CHECK_MS 100      /* free space is asked of the file system at most this often */

enum { QUOTA_LOGS, QUOTA_CHECKPOINTS, QUOTA_CONTEXTS, QUOTA_KINDS };

typedef struct quota_use {
    int64_t bytes[QUOTA_KINDS];      /* by kind: logs, checkpoints, contexts */
} quota_use;

static inline int64_t quota_use_total(const quota_use *u) {
    return u->bytes[QUOTA_LOGS] + u->bytes[QUOTA_CHECKPOINTS] + u->bytes[QUOTA_CONTEXTS];
}

/* The team's use from the rows, and its quota (*quota -1: none; quota may
 * be NULL): STORE_OK, STORE_NOT_FOUND (no such team), STORE_ERROR. */
int quota_use_read(db *d, int64_t team_id, quota_use *out, int64_t *quota);

/* teams.storage_quota = bytes (-1: none): STORE_OK, STORE_NOT_FOUND,
 * STORE_ERROR. The in-memory figure follows at once. */
int quota_team_set(db *d, int64_t team_id, int64_t bytes);

/* Whether `len` more bytes would pass the team's quota: 1 (over), 0, or -1
 * when the rows cannot be read (the write goes on: a busy database is not a
 * full disk). *quota (-1: none) and *use as the server counts them now;
 * *episode numbers the team's spells at its quota (for quota_note_once):
 * it changes each time the team reaches its quota after being under it. */
int quota_check(db *d, int64_t team_id, int64_t len, int64_t *quota, quota_use *use, unsigned *episode);

/* Counts an accepted write of `bytes` (negative: freed) of kind into the
 * team's figure. */
void quota_add(db *d, int64_t team_id, int kind, int64_t bytes);

/* Reads the team's figure from the rows again on its next use (after a
 * change the writers do not count: checkpoints pruned, contexts dropped, a
 * quota set); team_id 0: every team. */
void quota_forget(db *d, int64_t team_id);

/* Notes of a log: 1 the first time for this job in this episode (of its
 * team at its quota, of the disk under its reserve, of the job at its cap),
 * else 0: one note line per spell, not one per request. Kept in memory for
 * the most recent jobs (a job pushed out, or a restart, may get one more). */
enum { QUOTA_NOTE_TEAM, QUOTA_NOTE_DISK, QUOTA_NOTE_CAP, QUOTA_NOTES };
int quota_note_once(db *d, int64_t job_id, int kind, unsigned episode);

/* The disk reserve: writes that would leave less free than `bytes`, or
 * than `pct` percent of the file system when pct > 0, on the file system
 * of `dir` are refused. bytes 0 and pct 0: no reserve. */
void quota_disk_reserve_set(db *d, const char *dir, int64_t bytes, int pct);

/* 1 when writing `len` bytes would leave less than the reserve free (and
 * the first call of such a spell logs a warning), else 0; *free and
 * *reserve in bytes, *episode numbers the spells. The file system is asked
 * at most every QUOTA_DISK_CHECK_MS; a failed statvfs counts as enough. */
int quota_disk_low(db *d, int64_t len, int64_t *free_bytes, int64_t *reserve, unsigned *episode);

/* The team's name (for messages): STORE_OK, STORE_NOT_FOUND, STORE_ERROR. */
int quota_team_name(db *d, int64_t team_id, char *out, size_t cap);

/* "1.0 GiB", "512 KiB", "17 B": for messages. */
void quota_fmt_bytes(int64_t b, char *out, size_t cap);

#endif
