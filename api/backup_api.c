/* backup_api.c - backups taken while the server serves (backup_api.h):
 * one at a time (a second is 409 backup_running), each on a thread of its
 * own so that neither a pool thread nor the offload thread (checkpoint
 * uploads) waits for its copies; POST /api/v1/backups is answered when its
 * backup is done (http_defer). The periodic backups (--backup-to) run the
 * same code, then keep the newest --backup-keep. */
#include "backup_api.h"
#include "../server/server.h"
#include "../storage/backup.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static int g_running;                 /* a backup is under way (either kind) */
static int64_t g_next_ms;             /* the next periodic one (mono ms; 0: not planned yet) */
static int64_t g_last_success_s;      /* unix seconds of the last complete backup */
static uint64_t g_failures;           /* backups that failed since the start */

/* 1 when this caller now holds the one backup slot. */
static int claim(void) {
    pthread_mutex_lock(&g_mu);
    int ok = !g_running;
    if (ok) g_running = 1;
    pthread_mutex_unlock(&g_mu);
    return ok;
}

/* A destination as it may be logged: a folder as it is, an s3 URL without
 * its query (url_redact). */
static const char *dest_for_log(const char *dest, char *out, size_t cap) {
    if (strncmp(dest, "s3://", 5) != 0) return dest;
    url_redact(dest, out, cap);
    return out;
}

/* outcome: 1 a backup completed, -1 one failed, 0 none was taken (refused) */
static void release(int outcome) {
    pthread_mutex_lock(&g_mu);
    g_running = 0;
    if (outcome > 0) g_last_success_s = now_ms() / 1000;
    if (outcome < 0) g_failures++;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

/* ---------------------------------------------------------------- POST /api/v1/backups */

typedef struct job {
    http_req *req;
    char data[PATH_MAX];
    char dest[PATH_MAX];
    char creds[PATH_MAX];             /* --backup-credentials, for an s3:// dest */
} job;

/* A folder, or an s3 store with the server's --backup-credentials. */
static int run_one(const char *data, const char *dest, const char *creds, backup_summary *s, char *err, size_t errlen) {
    if (strncmp(dest, "s3://", 5) == 0) return backup_run_s3(data, dest, creds, s, err, errlen);
    return backup_run(data, dest, s, err, errlen);
}

static void *run_requested(void *arg) {
    job *j = arg;
    backup_summary s;
    char err[1024];
    int rc = run_one(j->data, j->dest, j->creds, &s, err, sizeof err);
    release(rc == 0 ? 1 : rc == -2 ? 0 : -1);
    http_res *a = http_res_new();
    if (rc == 0) {
        log_info("backup: %s (database %lld bytes, snapshot %lld ms, %d files, %d blobs, %d missing) in %lld ms",
                 s.path, (long long)s.db_bytes, (long long)s.snapshot_ms, s.files, s.blobs, s.blobs_missing,
                 (long long)s.took_ms);
        http_json(a, 201, backup_summary_json(&s));
    } else if (rc == -2) {
        http_error(a, 422, "invalid_value", "dest", "%s", err);
    } else {
        char shown[512];
        log_error("backup to %s failed: %s", dest_for_log(j->dest, shown, sizeof shown), err);
        http_error(a, 500, "backup_failed", NULL, "%s", err);
    }
    http_resume(j->req, a);
    free(j);
    return NULL;
}

static void backup_create(server *srv, http_req *req, http_res *res) {
    cJSON *body = http_body_json(req, res);
    if (!body) return;
    const char *dest = NULL;
    for (cJSON *f = body->child; f; f = f->next) {
        if (strcmp(f->string, "dest") == 0) {
            if (!cJSON_IsString(f)) {
                http_error(res, 422, "invalid_type", "dest", "dest must be a string");
                goto out;
            }
            dest = f->valuestring;
        } else {
            http_error(res, 422, "unknown_field", f->string, "unknown field '%s' (allowed: dest)", f->string);
            goto out;
        }
    }
    if (!dest || !dest[0]) {
        http_error(res, 422, "missing_field", "dest", "dest is required: an absolute folder on the server's machine");
        goto out;
    }
    int s3 = strncmp(dest, "s3://", 5) == 0;
    if (s3 && !srv->opt.backup_credentials[0]) {
        http_error(res, 422, "invalid_value", "dest",
                   "this server has no --backup-credentials FILE: an s3:// destination cannot be written");
        goto out;
    }
    if (s3 && strlen(dest) >= PATH_MAX - 64) {
        http_error(res, 422, "invalid_value", "dest", "dest is too long");
        goto out;
    }
    if (!s3 && (dest[0] != '/' || strlen(dest) >= PATH_MAX - 64 || strstr(dest, "/../") || strcspn(dest, "\r\n") < strlen(dest))) {
        http_error(res, 422, "invalid_value", "dest",
                   "dest must be an absolute folder path on the server's machine, or s3://BUCKET[/PREFIX]?endpoint=URL");
        goto out;
    }
    if (!claim()) {
        http_error(res, 409, "backup_running", NULL, "a backup is under way; retry when it is done");
        goto out;
    }
    job *j = xcalloc(1, sizeof *j);
    j->req = req;
    snprintf(j->data, sizeof j->data, "%s", srv->opt.data_dir);
    snprintf(j->dest, sizeof j->dest, "%s", dest);
    snprintf(j->creds, sizeof j->creds, "%s", srv->opt.backup_credentials);
    if (http_defer(req, res) < 0) {
        release(0);
        free(j);
        http_error(res, 503, "unavailable", NULL, "the server is stopping; retry");
        goto out;
    }
    pthread_attr_t at;
    pthread_t th;
    int rc = pthread_attr_init(&at);
    if (rc == 0) {
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        rc = pthread_create(&th, &at, run_requested, j);
        pthread_attr_destroy(&at);
    }
    if (rc != 0) {
        release(0);
        free(j);
        http_res *a = http_res_new();
        http_error(a, 503, "unavailable", NULL, "cannot start the backup's thread; retry");
        http_resume(req, a);
    }
out:
    cJSON_Delete(body);
}

/* ---------------------------------------------------------------- periodic */

static pthread_t g_periodic;
static int g_periodic_started;

static void *run_periodic(void *arg) {
    server *srv = arg;
    backup_summary s;
    char err[1024];
    int rc = run_one(srv->opt.data_dir, srv->opt.backup_to, srv->opt.backup_credentials, &s, err, sizeof err);
    char shown[512];
    const char *to = dest_for_log(srv->opt.backup_to, shown, sizeof shown);
    if (rc == 0) {
        int removed = 0;
        char perr[512];
        int pr = strncmp(srv->opt.backup_to, "s3://", 5) == 0
                     ? backup_prune_s3(srv->opt.backup_to, srv->opt.backup_credentials, srv->opt.backup_keep, &removed,
                                       perr, sizeof perr)
                     : backup_prune(srv->opt.backup_to, srv->opt.backup_keep, &removed, perr, sizeof perr);
        if (pr < 0)
            log_error("backup: cannot remove old backups under %s: %s", to, perr);
        log_info("backup: %s (snapshot %lld ms, %d blobs, %d missing) in %lld ms; %d older removed (keep %d)", s.path,
                 (long long)s.snapshot_ms, s.blobs, s.blobs_missing, (long long)s.took_ms, removed,
                 srv->opt.backup_keep);
    } else {
        log_error("backup: the periodic backup to %s failed: %s; next in %lld s", to, err,
                  (long long)(srv->opt.backup_every_ms / 1000));
    }
    pthread_mutex_lock(&g_mu);
    g_next_ms = mono_ms() + srv->opt.backup_every_ms;
    pthread_mutex_unlock(&g_mu);
    release(rc == 0 ? 1 : -1);
    return NULL;
}

void api_backup_tick(server *srv) {
    if (!srv->opt.backup_to[0] || srv->opt.backup_every_ms <= 0 || srv->stopping) return;
    int64_t now = mono_ms();
    pthread_mutex_lock(&g_mu);
    if (g_next_ms == 0) g_next_ms = now + srv->opt.backup_every_ms;
    int due = now >= g_next_ms;
    pthread_mutex_unlock(&g_mu);
    if (!due) return;
    if (g_periodic_started) { /* the previous one's thread has ended (g_next_ms moved past it) */
        pthread_join(g_periodic, NULL);
        g_periodic_started = 0;
    }
    if (!claim()) return; /* a requested backup runs: the next tick */
    if (pthread_create(&g_periodic, NULL, run_periodic, srv) != 0) {
        log_error("backup: cannot start the periodic backup's thread");
        release(-1);
        return;
    }
    g_periodic_started = 1;
}

void api_backup_stop(server *srv) {
    (void)srv;
    if (g_periodic_started) {
        pthread_join(g_periodic, NULL);
        g_periodic_started = 0;
    }
}

int api_backup_metrics(buf *b) {
    pthread_mutex_lock(&g_mu);
    int64_t last = g_last_success_s;
    uint64_t fails = g_failures;
    int running = g_running;
    pthread_mutex_unlock(&g_mu);
    int rc = buf_printf(b, "# HELP trainyard_backup_last_success_seconds The unix time of the last backup that "
                           "completed (0: none since the server started).\n"
                           "# TYPE trainyard_backup_last_success_seconds gauge\n"
                           "trainyard_backup_last_success_seconds %lld\n",
                        (long long)last);
    if (rc == 0)
        rc = buf_printf(b, "# HELP trainyard_backup_failures_total Backups that failed since the server started.\n"
                           "# TYPE trainyard_backup_failures_total counter\n"
                           "trainyard_backup_failures_total %llu\n",
                        (unsigned long long)fails);
    if (rc == 0)
        rc = buf_printf(b, "# HELP trainyard_backup_running 1 while a backup is under way.\n"
                           "# TYPE trainyard_backup_running gauge\n"
                           "trainyard_backup_running %d\n",
                        running);
    return rc;
}

const route api_backup_routes[] = {
    {"POST", "/api/v1/backups", backup_create, ALLOW_ADMIN, 0, ROLE_NONE},
    {NULL, NULL, NULL, 0, 0, ROLE_NONE},
};
