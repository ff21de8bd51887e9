/* retention_api.c - the files of deleted jobs, the log retention and the
 * collection of finished jobs' checkpoints (retention_api.h). Every removal
 * follows the commit that marked what it removes: a crash between the two
 * leaves files that nothing lists, which the sweeps find and remove. */
#include "retention_api.h"
#include "../common/util.h"
#include "../server/server.h"
#include "../spec/jobspec.h"
#include "../storage/audit.h"
#include "../storage/blob.h"
#include "../storage/exec_store.h"
#include "../storage/retention.h"
#include "../storage/store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SCAN_ROWS 256              /* finished jobs read per pass and kind */
#define ACT_MAX 4                  /* jobs whose files go per pass and kind */
#define SWEEP_SPAN 512             /* ids a sweep looks at per pass */
#define SWEEP_EVERY_MS (10 * 60 * 1000)
#define RESCAN_EVERY_MS (60 * 60 * 1000)
#define LIVE_WAIT_MS (60 * 60 * 1000) /* a job whose tasks have not exited holds the cursor this long */
#define COLLECT_MAX 256

/* ---------------------------------------------------------------- files */

/* Removes dir's entries and dir itself; *bytes and *files count the
 * regular files removed. A directory that is not there is nothing to do. */
static void remove_dir(const char *dir, int64_t *bytes, int *files) {
    DIR *d = opendir(dir);
    if (!d) {
        if (errno != ENOENT) log_warn("retention: cannot open %s: %s", dir, strerror(errno));
        return;
    }
    int fd = dirfd(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        struct stat sb;
        if (fstatat(fd, e->d_name, &sb, AT_SYMLINK_NOFOLLOW) < 0) continue;
        if (S_ISDIR(sb.st_mode)) { /* nothing the server writes; removed whole all the same */
            char sub[PATH_MAX];
            if (sfmt(sub, sizeof sub, "%s/%s", dir, e->d_name) == 0) rm_tree(sub);
            continue;
        }
        if (unlinkat(fd, e->d_name, 0) < 0) {
            if (errno != ENOENT) log_warn("retention: cannot remove %s/%s: %s", dir, e->d_name, strerror(errno));
            continue;
        }
        if (S_ISREG(sb.st_mode)) {
            *bytes += (int64_t)sb.st_size;
            (*files)++;
        }
    }
    closedir(d);
    if (rmdir(dir) < 0 && errno != ENOENT) log_warn("retention: cannot remove %s: %s", dir, strerror(errno));
}

static void job_dir(char *out, size_t cap, const char *base, int64_t job_id) {
    if (sfmt(out, cap, "%s/%lld", base, (long long)job_id) < 0) out[0] = '\0';
}

/* Unlinks a checkpoint file (path relative to the checkpoint directory);
 * its bytes when it was there, else 0. */
static int64_t unlink_ckpt(server *srv, const char *rel) {
    char p[PATH_MAX + 300];
    struct stat sb;
    if (!rel[0] || sfmt(p, sizeof p, "%s/%s", srv->checkpoint_dir, rel) < 0) return 0;
    if (lstat(p, &sb) < 0) return 0;
    if (unlink(p) < 0) {
        if (errno != ENOENT) log_warn("retention: cannot remove %s: %s", p, strerror(errno));
        return 0;
    }
    return S_ISREG(sb.st_mode) ? (int64_t)sb.st_size : 0;
}

int64_t api_ckpt_remove(server *srv, const ckpt_ref *r) {
    if (!r->path[0]) return 0;
    if (!r->store[0]) return unlink_ckpt(srv, r->path);
    /* in a store this server does not run with: the sweeps of a server
     * that does find it (its row keeps the path) */
    if (!srv->blobs || strcmp(r->store, blob_store_url(srv->blobs)) != 0) return 0;
    char key[300];
    if (sfmt(key, sizeof key, "checkpoints/%s", r->path) < 0) return 0;
    blob_err e;
    memset(&e, 0, sizeof e);
    int rc = blob_delete(srv->blobs, key, &e);
    if (rc != BLOB_OK) { /* the row keeps its path: the next sweep tries again */
        log_warn("retention: cannot remove %s from the blob store %s (%s %s: %s); the sweeps retry", key, r->store,
                 blob_strerror(rc), e.code, e.msg);
        return 0;
    }
    if (retention_ckpt_gone(srv->db, r->store, r->path) != STORE_OK)
        log_warn("retention: %s is removed from the blob store; its row is not marked so (the database is busy)", key);
    return r->size;
}

/* "30 days", "2 s": the retention as said in messages. */
static void retention_text(int64_t ms, char *out, size_t cap) {
    if (ms % (86400 * 1000LL) == 0) snprintf(out, cap, "%lld day%s", (long long)(ms / 86400000), ms == 86400000 ? "" : "s");
    else if (ms % (3600 * 1000LL) == 0) snprintf(out, cap, "%lld h", (long long)(ms / 3600000));
    else if (ms % (60 * 1000LL) == 0) snprintf(out, cap, "%lld min", (long long)(ms / 60000));
    else snprintf(out, cap, "%.3g s", (double)ms / 1000.0);
}

static void time_iso(int64_t ms, char out[32]) {
    time_t s = (time_t)(ms / 1000);
    struct tm tm;
    if (!gmtime_r(&s, &tm) || strftime(out, 32, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0) snprintf(out, 32, "%lld", (long long)ms);
}

/* ---------------------------------------------------------------- delete */

void api_retention_delete_files(server *srv, int64_t job_id, int64_t *freed) {
    *freed = 0;
    const char *pause = getenv("TRAINYARD_TEST_DELETE_PAUSE_MS");
    long ms;
    if (pause && parse_long(pause, 1, 600000, &ms) == 0) usleep((useconds_t)ms * 1000);
    char dir[PATH_MAX];
    int files = 0;
    job_dir(dir, sizeof dir, srv->log_dir, job_id);
    if (dir[0]) remove_dir(dir, freed, &files);
    job_dir(dir, sizeof dir, srv->checkpoint_dir, job_id);
    if (dir[0]) remove_dir(dir, freed, &files);
    log_info("job %lld deleted: %d file%s removed (%lld bytes); its row and tasks are kept", (long long)job_id, files,
             files == 1 ? "" : "s", (long long)*freed);
}

/* ---------------------------------------------------------------- answers */

void api_logs_purged_answer(server *srv, http_res *res, int64_t job_id, int64_t purged_at) {
    char when[32], keep[32];
    time_iso(purged_at, when);
    retention_text(srv->opt.log_retention_ms, keep, sizeof keep);
    cJSON *o = cJSON_CreateObject();
    cJSON *e = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(e, "code", "logs_purged");
    char msg[256];
    if (srv->opt.log_retention_ms > 0)
        snprintf(msg, sizeof msg,
                 "the logs of job %lld were removed at %s by the log retention: the server keeps a job's logs "
                 "%s after it ends (--log-retention-days)",
                 (long long)job_id, when, keep);
    else
        snprintf(msg, sizeof msg, "the logs of job %lld were removed at %s by the log retention (--log-retention-days)",
                 (long long)job_id, when);
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddNullToObject(e, "field");
    store_json_time_ms(e, "purged_at", purged_at);
    http_json(res, 410, o);
}

/* The spec's checkpoint.best: 1 with metric and mode, 0 when none. */
static int spec_best(const char *spec_text, char metric[64], int *best_max) {
    if (!spec_text) return 0;
    jobspec *spec = xcalloc(1, sizeof *spec);
    spec_error se;
    int have = 0;
    if (jobspec_parse(spec_text, strlen(spec_text), spec, &se) == 0) {
        if (spec->checkpoint.best_metric[0]) {
            snprintf(metric, 64, "%s", spec->checkpoint.best_metric);
            *best_max = spec->checkpoint.best_max;
            have = 1;
        }
        jobspec_release(spec);
    }
    free(spec);
    return have;
}

void api_ckpt_mark_best(server *srv, int64_t job_id, const char *spec, cJSON *arr) {
    char metric[64];
    int best_max = 0;
    int64_t best = 0;
    double value = 0;
    if (spec_best(spec, metric, &best_max) && retention_ckpt_best(srv->db, job_id, metric, best_max, &best, &value) != STORE_OK)
        best = 0; /* the list is still right without the mark */
    cJSON *c;
    cJSON_ArrayForEach(c, arr) {
        cJSON *id = cJSON_GetObjectItem(c, "id");
        cJSON_AddBoolToObject(c, "best", best && cJSON_IsNumber(id) && (int64_t)id->valuedouble == best);
    }
}

/* ---------------------------------------------------------------- the pass */

typedef struct cursor {
    int64_t fin, id;              /* the last job passed: (finished_at, id) */
    int64_t pass_started;         /* when the pass from the start began */
} cursor;

static struct {
    cursor collect, logs;
    int64_t sweep_job, sweep_ckpt;  /* the sweeps' positions (ids) */
    int sweep_jobs_done, sweep_ckpts_done;
    int64_t sweep_next;             /* when the next sweep begins (0: at once: the first is at start) */
    int64_t audit_next;             /* when audit rows past --audit-retention-days are next removed */
} g;

/* Past the end of the finished jobs: a new pass from the start once an
 * hour, for a job that ended while a clock went back. */
static void cursor_end(cursor *c, int64_t now) {
    if (now - c->pass_started < RESCAN_EVERY_MS) return;
    c->fin = c->id = 0;
    c->pass_started = now;
}

/* Keeps the newest checkpoint of a finished job and, with checkpoint.best,
 * the best; marks the rest deleted, then removes their files. */
static void collect_job(server *srv, int64_t job_id) {
    exec_job j;
    if (exec_store_job_get(srv->db, job_id, 1, &j) != STORE_OK) return;
    char metric[64] = "";
    int best_max = 0;
    int64_t best = 0;
    double value = 0;
    int with_best = spec_best(j.spec, metric, &best_max);
    exec_store_job_release(&j);
    if (with_best && retention_ckpt_best(srv->db, job_id, metric, best_max, &best, &value) != STORE_OK) return;
    ckpt_ref *refs = xcalloc(COLLECT_MAX, sizeof *refs);
    int n = 0;
    int64_t newest = 0;
    if (retention_ckpt_collect_mark(srv->db, job_id, best, now_ms(), refs, COLLECT_MAX, &n, &newest) == STORE_OK) {
        int64_t freed = 0;
        for (int i = 0; i < n; i++) freed += api_ckpt_remove(srv, &refs[i]);
        if (n > 0) {
            char kept[160];
            if (best && best != newest)
                snprintf(kept, sizeof kept, "kept %lld (the newest) and %lld (the best by %s: %g)", (long long)newest,
                         (long long)best, metric, value);
            else if (best)
                snprintf(kept, sizeof kept, "kept %lld (the newest, and the best by %s: %g)", (long long)newest, metric,
                         value);
            else
                snprintf(kept, sizeof kept, "kept %lld (the newest)", (long long)newest);
            log_info("job %lld ended: %s; %d older checkpoint%s removed (%lld bytes)", (long long)job_id, kept, n,
                     n == 1 ? "" : "s", (long long)freed);
        }
    }
    free(refs);
}

static void purge_logs(server *srv, int64_t job_id, int64_t finished_at) {
    int rc = retention_logs_mark(srv->db, job_id, now_ms());
    if (rc == STORE_ERROR) return;
    char dir[PATH_MAX], keep[32], when[32];
    int64_t bytes = 0;
    int files = 0;
    job_dir(dir, sizeof dir, srv->log_dir, job_id);
    if (dir[0]) remove_dir(dir, &bytes, &files);
    if (rc != STORE_OK) return;
    retention_text(srv->opt.log_retention_ms, keep, sizeof keep);
    time_iso(finished_at, when);
    log_info("job %lld: logs removed, %d file%s (%lld bytes): it ended at %s, more than %s ago (--log-retention-days)",
             (long long)job_id, files, files == 1 ? "" : "s", (long long)bytes, when, keep);
}

/* One page of finished jobs after c; acts on at most ACT_MAX of them.
 * logs: the log retention (jobs ended before until), else the checkpoint
 * collection. */
static void pass(server *srv, cursor *c, int logs, int64_t until, int64_t now) {
    retention_job *rows = xcalloc(SCAN_ROWS, sizeof *rows);
    int n = 0, acted = 0, i = 0;
    if (retention_scan(srv->db, c->fin, c->id, until, rows, SCAN_ROWS, &n) != STORE_OK) n = 0;
    for (; i < n; i++) {
        retention_job *r = &rows[i];
        /* a task still stopping may upload a checkpoint or ship its last
         * output: the job waits (and the cursor with it) until it exits */
        if (r->live_tasks > 0 && now - r->finished_at < LIVE_WAIT_MS) break;
        int todo = r->live_tasks == 0 && (logs ? !r->logs_purged && r->has_log_rows : r->checkpoints > 1);
        if (logs && r->live_tasks == 0 && !r->logs_purged && !todo) {
            char dir[PATH_MAX];
            struct stat sb;
            job_dir(dir, sizeof dir, srv->log_dir, r->id);
            todo = dir[0] && stat(dir, &sb) == 0;
        }
        if (todo) {
            if (acted == ACT_MAX) break;
            acted++;
            if (logs) purge_logs(srv, r->id, r->finished_at);
            else collect_job(srv, r->id);
        }
        c->fin = r->finished_at;
        c->id = r->id;
    }
    if (i == n && n < SCAN_ROWS) cursor_end(c, now);
    free(rows);
}

/* Files of deleted jobs and checkpoints that a crash (or a failed unlink)
 * left: a full sweep at start, then one every SWEEP_EVERY_MS, SWEEP_SPAN
 * ids of each per call. */
static void sweep(server *srv, int64_t now) {
    if (now < g.sweep_next) return;
    if (!g.sweep_jobs_done) {
        int64_t ids[SWEEP_SPAN];
        int deleted[SWEEP_SPAN], n = 0, more = 0;
        if (retention_sweep_jobs(srv->db, g.sweep_job, SWEEP_SPAN, ids, deleted, SWEEP_SPAN, &n, &more) != STORE_OK)
            return;
        for (int i = 0; i < n; i++) {
            char dir[PATH_MAX];
            int64_t bytes = 0;
            int files = 0;
            job_dir(dir, sizeof dir, srv->log_dir, ids[i]);
            if (dir[0]) remove_dir(dir, &bytes, &files);
            if (deleted[i]) {
                job_dir(dir, sizeof dir, srv->checkpoint_dir, ids[i]);
                if (dir[0]) remove_dir(dir, &bytes, &files);
            }
            if (files > 0)
                log_info("job %lld: removed %d file%s (%lld bytes) left of its %s", (long long)ids[i], files,
                         files == 1 ? "" : "s", (long long)bytes, deleted[i] ? "deletion" : "removed logs");
        }
        g.sweep_job += SWEEP_SPAN;
        if (!more) g.sweep_jobs_done = 1;
    } else if (!g.sweep_ckpts_done) {
        ckpt_ref *refs = xcalloc(SWEEP_SPAN, sizeof *refs);
        int n = 0, more = 0, removed = 0;
        int64_t bytes = 0;
        if (retention_sweep_ckpts(srv->db, g.sweep_ckpt, SWEEP_SPAN, refs, SWEEP_SPAN, &n, &more) != STORE_OK) {
            free(refs);
            return;
        }
        for (int i = 0; i < n; i++) {
            int64_t b = api_ckpt_remove(srv, &refs[i]);
            if (b > 0) {
                bytes += b;
                removed++;
            }
        }
        free(refs);
        if (removed > 0)
            log_info("removed %d checkpoint file%s (%lld bytes) left of deleted checkpoints", removed,
                     removed == 1 ? "" : "s", (long long)bytes);
        g.sweep_ckpt += SWEEP_SPAN;
        if (!more) g.sweep_ckpts_done = 1;
    }
    if (g.sweep_jobs_done && g.sweep_ckpts_done) {
        g.sweep_job = g.sweep_ckpt = 0;
        g.sweep_jobs_done = g.sweep_ckpts_done = 0;
        g.sweep_next = now + SWEEP_EVERY_MS;
    }
}

void api_retention_tick(server *srv) {
    int64_t now = now_ms();
    if (!g.collect.pass_started) g.collect.pass_started = g.logs.pass_started = now;
    sweep(srv, now);
    pass(srv, &g.collect, 0, now + 1, now);
    if (srv->opt.log_retention_ms > 0) pass(srv, &g.logs, 1, now - srv->opt.log_retention_ms, now);
    if (srv->opt.audit_retention_ms > 0 && now >= g.audit_next) { /* a bounded delete a minute */
        int n = 0;
        if (audit_prune(srv->db, now - srv->opt.audit_retention_ms, &n) == STORE_OK && n > 0)
            log_info("audit: removed %d row%s older than the audit retention (--audit-retention-days)", n,
                     n == 1 ? "" : "s");
        g.audit_next = now + (n >= 10000 ? 1000 : 60000);
    }
}
