/* quota.c - teams' storage use and the disk reserve (quota.h). */
#include "quota.h"
#include "context_store.h"
#include "../common/util.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>

#define TEAM_BUCKETS 256
#define JOB_SLOTS 4096

/* One team's figure: base (the rows as read at base_at) plus what was
 * added since: adds - base_adds. adds only grows (or shrinks by a negative
 * add), so a read that ran while writes were counted keeps them. */
typedef struct team_entry {
    int64_t team_id;
    int64_t quota;                   /* -1: none */
    int64_t base[QUOTA_KINDS], base_adds[QUOTA_KINDS], adds[QUOTA_KINDS];
    int64_t base_at_ms;              /* 0: read again on the next use */
    int loaded;
    int over;                        /* at its quota on the last check */
    unsigned episode;
    struct team_entry *next;
} team_entry;

typedef struct job_slot {
    int64_t job_id;
    unsigned noted[QUOTA_NOTES];     /* episode + 1 of the last note of each kind, 0: none */
} job_slot;

typedef struct quota_cache {
    pthread_mutex_t mu;
    team_entry *teams[TEAM_BUCKETS];
    job_slot jobs[JOB_SLOTS];
    /* the disk reserve */
    char dir[4096];
    int64_t reserve_bytes;
    int reserve_pct;
    int64_t disk_at_ms;              /* when the file system was last asked */
    int64_t disk_free, disk_size;
    int disk_low;
    unsigned disk_episode;
} quota_cache;

static void *cache_make(void) {
    quota_cache *c = xcalloc(1, sizeof *c);
    if (pthread_mutex_init(&c->mu, NULL) != 0) abort();
    return c;
}

static void cache_drop(void *p) {
    quota_cache *c = p;
    for (int i = 0; i < TEAM_BUCKETS; i++) {
        team_entry *e = c->teams[i];
        while (e) {
            team_entry *n = e->next;
            free(e);
            e = n;
        }
    }
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static quota_cache *cache_of(db *d) { return db_cache(d, DB_CACHE_QUOTA, cache_make, cache_drop); }

/* (mu held) */
static team_entry *team_find(quota_cache *c, int64_t team_id, int make) {
    unsigned b = (unsigned)((uint64_t)team_id % TEAM_BUCKETS);
    for (team_entry *e = c->teams[b]; e; e = e->next)
        if (e->team_id == team_id) return e;
    if (!make) return NULL;
    team_entry *e = xcalloc(1, sizeof *e);
    e->team_id = team_id;
    e->quota = -1;
    e->next = c->teams[b];
    c->teams[b] = e;
    return e;
}

/* ---------------------------------------------------------------- the rows */

static const char SQL_TEAM_QUOTA[] = "SELECT storage_quota FROM teams WHERE id = ?";
static const char SQL_USE_LOGS[] =
    "SELECT coalesce(sum(log_bytes), 0) FROM jobs WHERE team_id = ? AND deleted_at IS NULL";
static const char SQL_USE_CKPTS[] =
    "SELECT coalesce(sum(c.size), 0) FROM jobs j JOIN checkpoints c ON c.job_id = j.id"
    " WHERE j.team_id = ? AND c.deleted_at IS NULL";
static const char SQL_TEAM_SET_QUOTA[] = "UPDATE teams SET storage_quota = ?2 WHERE id = ?1";

static int sum_query(db *d, const char *sql, int64_t team_id, int64_t *out) {
    db_stmt *st = db_prepare(d, sql);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, team_id);
    int rc = db_step(st);
    if (rc == DB_ROW) *out = db_col_int64(st, 0);
    db_done(st);
    return rc == DB_ROW ? STORE_OK : STORE_ERROR;
}

int quota_use_read(db *d, int64_t team_id, quota_use *out, int64_t *quota) {
    memset(out, 0, sizeof *out);
    db_stmt *st = db_prepare(d, SQL_TEAM_QUOTA);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, team_id);
    int rc = db_step(st);
    int64_t q = -1;
    if (rc == DB_ROW && db_col_type(st, 0) != DB_NULL) q = db_col_int64(st, 0);
    db_done(st);
    if (rc == DB_DONE) return STORE_NOT_FOUND;
    if (rc != DB_ROW) return STORE_ERROR;
    if (quota) *quota = q;
    if (sum_query(d, SQL_USE_LOGS, team_id, &out->bytes[QUOTA_LOGS]) != STORE_OK ||
        sum_query(d, SQL_USE_CKPTS, team_id, &out->bytes[QUOTA_CHECKPOINTS]) != STORE_OK ||
        ctx_store_usage(d, team_id, &out->bytes[QUOTA_CONTEXTS]) != STORE_OK)
        return STORE_ERROR;
    return STORE_OK;
}

int quota_team_set(db *d, int64_t team_id, int64_t bytes) {
    db_stmt *st = db_prepare(d, SQL_TEAM_SET_QUOTA);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, team_id);
    if (bytes >= 0) db_bind_int64(st, 2, bytes);
    else db_bind_null(st, 2);
    int rc = db_step(st);
    int changed = db_changes(d);
    db_done(st);
    if (rc != DB_DONE) return STORE_ERROR;
    if (changed != 1) return STORE_NOT_FOUND;
    quota_forget(d, team_id);
    return STORE_OK;
}

/* ---------------------------------------------------------------- the figure */

int quota_check(db *d, int64_t team_id, int64_t len, int64_t *quota, quota_use *use, unsigned *episode) {
    quota_cache *c = cache_of(d);
    if (!c) return -1;
    int64_t now = mono_ms();
    pthread_mutex_lock(&c->mu);
    team_entry *e = team_find(c, team_id, 1);
    int stale = !e->loaded || e->base_at_ms == 0 || now - e->base_at_ms >= QUOTA_RELOAD_MS;
    if (stale) {
        /* read the rows without the lock; meanwhile others use the old
         * figure (not read again by each of them: base_at is now) */
        int64_t snap[QUOTA_KINDS];
        memcpy(snap, e->adds, sizeof snap);
        e->base_at_ms = now;
        pthread_mutex_unlock(&c->mu);
        quota_use u;
        int64_t q = -1;
        int rc = quota_use_read(d, team_id, &u, &q);
        pthread_mutex_lock(&c->mu);
        if (rc == STORE_OK) {
            memcpy(e->base, u.bytes, sizeof e->base);
            memcpy(e->base_adds, snap, sizeof e->base_adds);
            e->quota = q;
            e->loaded = 1;
        } else {
            e->base_at_ms = 0;
            if (!e->loaded) {
                pthread_mutex_unlock(&c->mu);
                return -1;
            }
        }
    }
    for (int k = 0; k < QUOTA_KINDS; k++) use->bytes[k] = e->base[k] + (e->adds[k] - e->base_adds[k]);
    *quota = e->quota;
    int over = e->quota >= 0 && quota_use_total(use) + len > e->quota;
    /* a spell at the quota begins with a write that would pass it and ends
     * once the team is clearly under it again, so writes of mixed sizes
     * at the edge (a checkpoint refused, a log line taken) are one spell */
    int64_t slack = e->quota / 16 < ((int64_t)1 << 20) ? e->quota / 16 : ((int64_t)1 << 20);
    if (over && !e->over) e->episode++;
    if (over) e->over = 1;
    else if (e->quota < 0 || quota_use_total(use) < e->quota - slack) e->over = 0;
    *episode = e->episode;
    pthread_mutex_unlock(&c->mu);
    return over;
}

void quota_add(db *d, int64_t team_id, int kind, int64_t bytes) {
    quota_cache *c = cache_of(d);
    if (!c || kind < 0 || kind >= QUOTA_KINDS) return;
    pthread_mutex_lock(&c->mu);
    team_entry *e = team_find(c, team_id, 1);
    e->adds[kind] += bytes;
    pthread_mutex_unlock(&c->mu);
}

void quota_forget(db *d, int64_t team_id) {
    quota_cache *c = cache_of(d);
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < TEAM_BUCKETS; i++)
        for (team_entry *e = c->teams[i]; e; e = e->next)
            if (team_id == 0 || e->team_id == team_id) e->base_at_ms = 0;
    pthread_mutex_unlock(&c->mu);
}

int quota_note_once(db *d, int64_t job_id, int kind, unsigned episode) {
    quota_cache *c = cache_of(d);
    if (!c || kind < 0 || kind >= QUOTA_NOTES) return 1;
    pthread_mutex_lock(&c->mu);
    job_slot *s = &c->jobs[(uint64_t)job_id % JOB_SLOTS];
    if (s->job_id != job_id) {
        memset(s, 0, sizeof *s);
        s->job_id = job_id;
    }
    int first = s->noted[kind] != episode + 1;
    s->noted[kind] = episode + 1;
    pthread_mutex_unlock(&c->mu);
    return first;
}

/* ---------------------------------------------------------------- the disk reserve */

void quota_disk_reserve_set(db *d, const char *dir, int64_t bytes, int pct) {
    quota_cache *c = cache_of(d);
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    snprintf(c->dir, sizeof c->dir, "%s", dir);
    c->reserve_bytes = bytes > 0 ? bytes : 0;
    c->reserve_pct = pct > 0 ? pct : 0;
    c->disk_at_ms = 0;
    pthread_mutex_unlock(&c->mu);
}

int quota_disk_low(db *d, int64_t len, int64_t *free_bytes, int64_t *reserve, unsigned *episode) {
    *free_bytes = *reserve = 0;
    *episode = 0;
    quota_cache *c = cache_of(d);
    if (!c) return 0;
    pthread_mutex_lock(&c->mu);
    if (!c->dir[0] || (c->reserve_bytes == 0 && c->reserve_pct == 0)) {
        pthread_mutex_unlock(&c->mu);
        return 0;
    }
    int64_t now = mono_ms();
    if (c->disk_at_ms == 0 || now - c->disk_at_ms >= QUOTA_DISK_CHECK_MS) {
        /* statvfs is a few microseconds; it runs under the lock so that
         * one thread asks per period, not every request of a burst */
        struct statvfs sv;
        if (statvfs(c->dir, &sv) == 0) {
            c->disk_free = (int64_t)sv.f_bavail * (int64_t)sv.f_frsize;
            c->disk_size = (int64_t)sv.f_blocks * (int64_t)sv.f_frsize;
        } else {
            c->disk_free = INT64_MAX / 2; /* unknown: the write itself will say */
            c->disk_size = 0;
        }
        c->disk_at_ms = now;
    }
    int64_t r = c->reserve_pct > 0 ? c->disk_size / 100 * c->reserve_pct : c->reserve_bytes;
    /* the spell (its warning, its episode) is the free space under the
     * reserve; a write is refused when it would take it there */
    int low = c->disk_free - len < r, below = c->disk_free < r;
    if (below != c->disk_low) {
        char fb[32], rb[32];
        quota_fmt_bytes(c->disk_free, fb, sizeof fb);
        quota_fmt_bytes(r, rb, sizeof rb);
        if (below) {
            c->disk_episode++;
            log_warn("the data directory %s has %s free, under the disk reserve of %s: checkpoint uploads, log "
                     "appends and context uploads are refused until space is freed",
                     c->dir, fb, rb);
        } else {
            log_info("the data directory %s has %s free again, above the disk reserve of %s", c->dir, fb, rb);
        }
        c->disk_low = below;
    }
    *free_bytes = c->disk_free;
    *reserve = r;
    *episode = c->disk_episode;
    pthread_mutex_unlock(&c->mu);
    return low;
}

static const char SQL_TEAM_NAME[] = "SELECT name FROM teams WHERE id = ?";

int quota_team_name(db *d, int64_t team_id, char *out, size_t cap) {
    if (cap) out[0] = '\0';
    db_stmt *st = db_prepare(d, SQL_TEAM_NAME);
    if (!st) return STORE_ERROR;
    db_bind_int64(st, 1, team_id);
    int rc = db_step(st);
    if (rc == DB_ROW) {
        const char *n = db_col_text(st, 0);
        snprintf(out, cap, "%s", n ? n : "");
    }
    db_done(st);
    return rc == DB_ROW ? STORE_OK : rc == DB_DONE ? STORE_NOT_FOUND : STORE_ERROR;
}

void quota_fmt_bytes(int64_t b, char *out, size_t cap) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    if (b < 1024) {
        snprintf(out, cap, "%" PRId64 " B", b);
        return;
    }
    double v = (double)b;
    int u = 0;
    while (v >= 1024.0 && u < 5) {
        v /= 1024.0;
        u++;
    }
    snprintf(out, cap, "%.1f %s", v, units[u]);
}
