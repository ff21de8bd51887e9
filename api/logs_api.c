/* logs_api.c - /jobs/{id}/logs: what a job's tasks print, appended by their
 * agents (on SQLite one file per task under the log directory, each chunk
 * recorded in storage/exec_store.c; on PostgreSQL the chunks' bytes in the
 * database, so every server of the cluster serves them) within the disk
 * reserve, the job's log cap and its team's quota, and read back by
 * offset. A node's token posts only for jobs with a task on its node. Logs the retention removed are a 410
 * (retention_api.h). */
#include "logs_api.h"
#include "exec_common.h"
#include "retention_api.h"
#include "../spec/jobspec.h"
#include "../server/server.h"
#include "../storage/cluster.h"
#include "../storage/exec_store.h"
#include "../storage/quota.h"
#include "../storage/store.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define LOG_READ_MAX (1L << 20)

static pthread_mutex_t g_log_lock = PTHREAD_MUTEX_INITIALIZER;

static int valid_task_name(const char *s) {
    size_t n = strlen(s);
    if (n < 1 || n > 32 || !islower((unsigned char)s[0])) return 0;
    for (size_t i = 0; i < n; i++)
        if (!islower((unsigned char)s[i]) && !isdigit((unsigned char)s[i]) && s[i] != '-' && s[i] != '_')
            return 0;
    return 1;
}

static int log_path(server *srv, int64_t job, const char *task, char *out, size_t cap, int mkdir) {
    char dir[PATH_MAX];
    if (sfmt(dir, sizeof dir, "%s/%lld", srv->log_dir, (long long)job) < 0) return -1;
    if (mkdir && mkdir_p(dir, 0700) < 0) return -1;
    return sfmt(out, cap, "%s/%s.log", dir, task);
}

static const char *task_query(http_req *req, http_res *res, int required) {
    const char *task = http_query(req, "task");
    if (!task) {
        if (!required) return "worker-0";
        http_error(res, 400, "missing_field", "task", "the query argument task is required (e.g. task=worker-0)");
        return NULL;
    }
    if (!valid_task_name(task)) {
        http_error(res, 400, "invalid_value", "task", "task must look like worker-0 or ps-1");
        return NULL;
    }
    return task;
}

/* What of a log post is kept: the first `take` bytes of the body, then
 * `note` (a line saying why the rest is dropped; "" when none). Bounds,
 * first met first: the disk reserve, the job's log cap, the team's quota.
 * A post past a bound is still a 200 (with "dropped"): the agent would
 * retry an error forever. */
typedef struct log_admit {
    size_t take;
    char note[512];
} log_admit;

/* The job's log cap in bytes: its spec's logs.max_size, else the server's
 * default; never more than --log-max-per-job. */
static int64_t log_cap_bytes(const server *srv, const char *max_size) {
    int64_t mb = srv->opt.log_max_per_job_default_mb;
    spec_error se;
    int64_t want = 0;
    if (max_size[0] && jobspec_size_text(max_size, &JOBSPEC_SIZE_LOG_MAX, &want, &se) == 0 && want > 0) mb = want;
    if (mb > srv->opt.log_max_per_job_mb) mb = srv->opt.log_max_per_job_mb;
    return mb << 20;
}

static void log_admit_decide(server *srv, const exec_job *j, const char *body, size_t len, log_admit *a) {
    a->take = len;
    a->note[0] = '\0';
    if (!len) return;
    char nl[2] = "";
    int64_t free_b, reserve;
    unsigned ep;
    if (quota_disk_low(srv->db, (int64_t)len, &free_b, &reserve, &ep) == 1) {
        a->take = 0;
        if (quota_note_once(srv->db, j->id, QUOTA_NOTE_DISK, ep)) {
            char fb[32], rb[32];
            quota_fmt_bytes(free_b, fb, sizeof fb);
            quota_fmt_bytes(reserve, rb, sizeof rb);
            snprintf(a->note, sizeof a->note,
                     "[trainyard server: the server's disk has %s free, under its reserve of %s: output of this job "
                     "is dropped until space is freed]\n",
                     fb, rb);
        }
        return;
    }
    int64_t kept = 0;
    char max_size[64];
    if (exec_store_job_log_state(srv->db, j->id, &kept, max_size, sizeof max_size) == STORE_OK) {
        int64_t cap = log_cap_bytes(srv, max_size);
        if (kept >= cap) { /* noted when it got there */
            a->take = 0;
            return;
        }
        if (kept + (int64_t)len > cap) {
            a->take = (size_t)(cap - kept);
            if (a->take && body[a->take - 1] != '\n') nl[0] = '\n';
            char cb[32];
            quota_fmt_bytes(cap, cb, sizeof cb);
            if (quota_note_once(srv->db, j->id, QUOTA_NOTE_CAP, 0))
                snprintf(a->note, sizeof a->note,
                         "%s[trainyard server: this job's log reached its cap of %s: further output is dropped (set "
                         "\"logs\": {\"max_size\": \"...\"} in the job's spec to keep more, up to %lld MiB)]\n",
                         nl, cb, (long long)srv->opt.log_max_per_job_mb);
            return;
        }
    }
    int64_t quota;
    quota_use use;
    if (quota_check(srv->db, j->team_id, (int64_t)len, &quota, &use, &ep) == 1) {
        int64_t room = quota - quota_use_total(&use);
        a->take = room > 0 ? (size_t)room : 0;
        if (a->take && body[a->take - 1] != '\n') nl[0] = '\n';
        if (quota_note_once(srv->db, j->id, QUOTA_NOTE_TEAM, ep)) {
            char team[64] = "", qb[32], ub[32];
            if (quota_team_name(srv->db, j->team_id, team, sizeof team) != STORE_OK)
                snprintf(team, sizeof team, "%lld", (long long)j->team_id);
            quota_fmt_bytes(quota, qb, sizeof qb);
            quota_fmt_bytes(quota_use_total(&use) + (int64_t)a->take, ub, sizeof ub); /* with what is taken */
            snprintf(a->note, sizeof a->note,
                     "%s[trainyard server: team %s is at its storage quota (%s of %s): further output of this job "
                     "is dropped]\n",
                     nl, team, ub, qb);
        }
    }
}

/* The answer to a log post: where its bytes begin and end, what was
 * dropped. */
static void logs_posted(http_res *res, int64_t off, size_t total, size_t dropped) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "offset", (double)off);
    cJSON_AddNumberToObject(o, "next_offset", (double)(off + (int64_t)total));
    cJSON_AddNumberToObject(o, "dropped", (double)dropped);
    http_json(res, 200, o);
}

/* A log post kept in the database (exec_store_logs_in_db): the chunk, its
 * bytes and the job's log_bytes in one transaction, so whichever server
 * leads next serves it; a failure keeps nothing and is a 503 the agent
 * retries. */
static void logs_post_db(server *srv, http_res *res, const exec_job *j, const char *task, const char *body,
                         size_t len) {
    log_admit adm;
    log_admit_decide(srv, j, body, len, &adm);
    size_t nlen = strlen(adm.note), total = adm.take + nlen;
    int64_t off = 0;
    if (total) {
        char *b = xmalloc(total);
        memcpy(b, body, adm.take);
        memcpy(b + adm.take, adm.note, nlen);
        pthread_mutex_lock(&g_log_lock);
        int rc = exec_store_log_append(srv->db, j->id, task, j->attempt, b, (int64_t)total, &off);
        pthread_mutex_unlock(&g_log_lock);
        free(b);
        if (rc != STORE_OK) {
            http_db_unavailable(res);
            return;
        }
        quota_add(srv->db, j->team_id, QUOTA_LOGS, (int64_t)total);
    } else if (exec_store_log_end(srv->db, j->id, task, &off) != STORE_OK) { /* where the log ends */
        http_db_unavailable(res);
        return;
    }
    logs_posted(res, off, total, len - adm.take);
}

/* POST /api/v1/jobs/{id}/logs?task=worker-0 (raw text lines) */
static void logs_post(server *srv, http_req *req, http_res *res) {
    exec_job j;
    if (api_job_param(srv, req, res, 0, &j) < 0) return;
    if (req->who.kind == TOKEN_NODE) {
        int on = cluster_node_runs_job(srv->db, req->who.node_id, j.id);
        if (on <= 0) {
            exec_store_job_release(&j);
            if (on < 0) http_db_unavailable(res);
            else http_error(res, 403, "forbidden", NULL, "node %lld runs no task of job %lld",
                            (long long)req->who.node_id, (long long)j.id);
            return;
        }
    }
    if (j.logs_purged_at) { /* a late post would bring back what the retention removed */
        api_logs_purged_answer(srv, res, j.id, j.logs_purged_at);
        return;
    }
    const char *task = task_query(req, res, 1);
    if (!task) return;
    if (exec_store_logs_in_db(srv->db)) {
        logs_post_db(srv, res, &j, task, req->body.data, req->body.len);
        return;
    }
    char path[PATH_MAX + 64];
    if (log_path(srv, j.id, task, path, sizeof path, 1) < 0) {
        http_error(res, 500, "internal", NULL, "cannot create the log directory: %s", strerror(errno));
        return;
    }
    log_admit adm;
    log_admit_decide(srv, &j, req->body.data, req->body.len, &adm);
    size_t nlen = strlen(adm.note), total = adm.take + nlen;
    pthread_mutex_lock(&g_log_lock);
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    struct stat sb;
    int64_t off = -1;
    int ok = fd >= 0 && fstat(fd, &sb) == 0;
    if (ok) {
        off = (int64_t)sb.st_size;
        size_t done = 0;
        while (ok && done < total) {
            const char *from = done < adm.take ? req->body.data + done : adm.note + (done - adm.take);
            size_t want = done < adm.take ? adm.take - done : total - done;
            ssize_t w = write(fd, from, want);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) ok = 0;
            else done += (size_t)w;
        }
        if (!ok && ftruncate(fd, (off_t)off) < 0) log_warn("cannot undo a partial log write to %s", path);
    }
    if (fd >= 0) close(fd);
    pthread_mutex_unlock(&g_log_lock);
    if (!ok) {
        http_error(res, 500, "internal", NULL, "cannot write the log: %s", strerror(errno));
        return;
    }
    if (total) {
        if (exec_store_log_chunk_add(srv->db, j.id, task, j.attempt, off, (int64_t)total) != STORE_OK)
            log_warn("job %lld: cannot record a log chunk of %s", (long long)j.id, task);
        else quota_add(srv->db, j.team_id, QUOTA_LOGS, (int64_t)total);
    }
    logs_posted(res, off, total, req->body.len - adm.take);
}

/* The X-Next-Offset header of a log read. */
static void next_offset(http_res *res, long long off) {
    snprintf(res->xhdr_name, sizeof res->xhdr_name, "X-Next-Offset");
    snprintf(res->xhdr_value, sizeof res->xhdr_value, "%lld", off);
}

/* GET /api/v1/jobs/{id}/logs?task=worker-0&since=OFFSET&limit=BYTES -> text.
 * The next offset is since + the length of the body, also when the task has
 * written nothing yet (a follower keeps asking from there). */
static void logs_get(server *srv, http_req *req, http_res *res) {
    exec_job j;
    if (api_job_param(srv, req, res, 0, &j) < 0) return;
    if (j.logs_purged_at) { /* a 410 that says when and why, not an empty log */
        api_logs_purged_answer(srv, res, j.id, j.logs_purged_at);
        return;
    }
    const char *task = task_query(req, res, 0);
    if (!task) return;
    long since, limit;
    if (http_query_long(req, res, "since", 0, (long)INT64_MAX, 0, &since) < 0) return;
    if (http_query_long(req, res, "limit", 1, LOG_READ_MAX, LOG_READ_MAX, &limit) < 0) return;
    if (exec_store_logs_in_db(srv->db)) {
        /* the chunks' bytes; a chunk without them was written to a file
         * (a cluster migrated from SQLite): the file, as below */
        buf b;
        buf_init(&b, (size_t)limit);
        int rc = exec_store_log_read(srv->db, j.id, task, since, limit, &b);
        if (rc == STORE_OK) {
            http_text(res, 200, "text/plain; charset=utf-8", b.data ? b.data : "", b.len);
            next_offset(res, (long long)since + (long long)b.len);
        }
        buf_release(&b);
        if (rc == STORE_OK) return;
        if (rc != STORE_NOT_FOUND) {
            http_db_unavailable(res);
            return;
        }
    }
    char path[PATH_MAX + 64];
    if (log_path(srv, j.id, task, path, sizeof path, 0) < 0) {
        http_error(res, 500, "internal", NULL, "log path too long");
        return;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        http_text(res, 200, "text/plain; charset=utf-8", "", 0);
        next_offset(res, since);
        return;
    }
    struct stat sb;
    if (fstat(fd, &sb) < 0) {
        close(fd);
        http_error(res, 500, "internal", NULL, "cannot read the log");
        return;
    }
    size_t n = since >= sb.st_size ? 0 : (size_t)(sb.st_size - since);
    if (n > (size_t)limit) n = (size_t)limit;
    char *b = xmalloc(n + 1);
    ssize_t got = n ? pread(fd, b, n, (off_t)since) : 0;
    close(fd);
    if (got < 0) {
        free(b);
        http_error(res, 500, "internal", NULL, "cannot read the log");
        return;
    }
    http_text(res, 200, "text/plain; charset=utf-8", b, (size_t)got);
    free(b);
    next_offset(res, (long long)since + (long long)got);
}

const route api_logs_routes[] = {
    {"POST", "/api/v1/jobs/{id}/logs", logs_post, ALLOW_NODE | ALLOW_TASK, 0, ROLE_NONE},
    {"GET", "/api/v1/jobs/{id}/logs", logs_get, ALLOW_USER | ALLOW_TASK, 0, ROLE_NONE},
    {NULL, NULL, NULL, 0, 0, ROLE_NONE},
};
