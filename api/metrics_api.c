/* metrics_api.c - GET /metrics in the Prometheus text exposition format
 * (version 0.0.4). Numbers come from storage/stats.c (SQL aggregates), the
 * HTTP daemon's latency histogram (server/http.c) and the scheduler thread's
 * pass durations (scheduler/scheduler.c). Admin token: the families name
 * every team and running job. See docs/metrics.md. */
#include "metrics_api.h"
#include "backup_api.h"
#include "blobs_api.h"
#include "../common/version.h"
#include "../scheduler/scheduler.h"
#include "../server/server.h"
#include "../storage/stats.h"

#include <stdlib.h>
#include <string.h>

#define METRICS_MAX (8u << 20)

static const char *const g_states[] = {"queued", "starting", "running", "succeeded", "failed", "cancelled"};

/* Writes a label value with \, " and newline escaped as the format asks. */
static int put_label(buf *b, const char *v) {
    for (const char *p = v; *p; p++) {
        int rc;
        if (*p == '\\') rc = buf_appends(b, "\\\\");
        else if (*p == '"') rc = buf_appends(b, "\\\"");
        else if (*p == '\n') rc = buf_appends(b, "\\n");
        else rc = buf_append(b, p, 1);
        if (rc < 0) return -1;
    }
    return 0;
}

static int family(buf *b, const char *name, const char *type, const char *help) {
    return buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* name{team="T"[,k="v"]} value */
static int sample_team(buf *b, const char *name, const char *team, const char *k, const char *v, double value) {
    int rc = buf_printf(b, "%s{team=\"", name);
    if (rc == 0) rc = put_label(b, team);
    if (rc == 0 && k) rc = buf_printf(b, "\",%s=\"%s", k, v);
    if (rc == 0) rc = buf_printf(b, "\"} %.17g\n", value);
    return rc;
}

static int write_jobs(server *srv, buf *b, int64_t now) {
    stats_row *teams = NULL, *jobs = NULL, *queue = NULL;
    int nt = 0, nj = 0, nq = 0, rc = -1;
    if (stats_query(srv->db, STATS_TEAMS, now, &teams, &nt) < 0 ||
        stats_query(srv->db, STATS_JOBS, now, &jobs, &nj) < 0 ||
        stats_query(srv->db, STATS_QUEUE, now, &queue, &nq) < 0)
        goto out;
    rc = family(b, "trainyard_jobs", "gauge", "Jobs by state and team.");
    for (int t = 0; rc == 0 && t < nt; t++)
        for (size_t s = 0; rc == 0 && s < sizeof g_states / sizeof g_states[0]; s++) {
            double v = 0;
            for (int j = 0; j < nj; j++)
                if (strcmp(jobs[j].team, teams[t].team) == 0 && strcmp(jobs[j].key, g_states[s]) == 0) v = jobs[j].v[0];
            rc = sample_team(b, "trainyard_jobs", teams[t].team, "state", g_states[s], v);
        }
    if (rc == 0) rc = family(b, "trainyard_queue_length", "gauge", "Queued jobs per team.");
    for (int q = 0; rc == 0 && q < nq; q++) rc = sample_team(b, "trainyard_queue_length", queue[q].team, NULL, NULL, queue[q].v[0]);
    if (rc == 0)
        rc = family(b, "trainyard_queue_wait_seconds_max", "gauge",
                    "How long the team's longest-waiting queued job has waited (0 when none waits).");
    for (int q = 0; rc == 0 && q < nq; q++)
        rc = sample_team(b, "trainyard_queue_wait_seconds_max", queue[q].team, NULL, NULL, queue[q].v[1]);
    if (rc == 0)
        rc = family(b, "trainyard_queue_wait_seconds_mean", "gauge",
                    "Mean time the team's queued jobs have waited so far (0 when none waits).");
    for (int q = 0; rc == 0 && q < nq; q++)
        rc = sample_team(b, "trainyard_queue_wait_seconds_mean", queue[q].team, NULL, NULL,
                         queue[q].v[0] > 0 ? queue[q].v[2] / queue[q].v[0] : 0);
out:
    free(teams);
    free(jobs);
    free(queue);
    return rc;
}

static int write_devices(server *srv, buf *b, int64_t now) {
    stats_row *dev = NULL, *byteam = NULL, *nodes = NULL;
    int nd = 0, nt = 0, nn = 0, rc = -1;
    if (stats_query(srv->db, STATS_DEVICES, now, &dev, &nd) < 0 ||
        stats_query(srv->db, STATS_DEVICES_TEAM, now, &byteam, &nt) < 0 ||
        stats_query(srv->db, STATS_NODES, now, &nodes, &nn) < 0)
        goto out;
    static const char *const kinds[] = {"cpu", "gpu"};
    rc = family(b, "trainyard_devices", "gauge", "Devices of ready nodes by kind (cpu: CPU slots).");
    for (int k = 0; rc == 0 && k < 2; k++) {
        double v = 0;
        for (int i = 0; i < nd; i++) if (strcmp(dev[i].key, kinds[k]) == 0) v = dev[i].v[0];
        rc = buf_printf(b, "trainyard_devices{kind=\"%s\"} %.17g\n", kinds[k], v);
    }
    if (rc == 0) rc = family(b, "trainyard_devices_in_use", "gauge", "Devices allocated to jobs, by kind.");
    for (int k = 0; rc == 0 && k < 2; k++) {
        double v = 0;
        for (int i = 0; i < nd; i++) if (strcmp(dev[i].key, kinds[k]) == 0) v = dev[i].v[1];
        rc = buf_printf(b, "trainyard_devices_in_use{kind=\"%s\"} %.17g\n", kinds[k], v);
    }
    if (rc == 0) rc = family(b, "trainyard_team_devices_in_use", "gauge", "Devices allocated to a team's jobs, by kind.");
    for (int i = 0; rc == 0 && i < nt; i++)
        rc = sample_team(b, "trainyard_team_devices_in_use", byteam[i].team, "kind", byteam[i].key, byteam[i].v[0]);
    if (rc == 0) rc = family(b, "trainyard_nodes", "gauge", "Registered nodes by state.");
    for (int i = 0; rc == 0 && i < nn; i++) rc = buf_printf(b, "trainyard_nodes{state=\"%s\"} %.17g\n", nodes[i].key, nodes[i].v[0]);
    double mem = 0, mem_used = 0;
    for (int i = 0; i < nn; i++)
        if (strcmp(nodes[i].key, "ready") == 0) { mem = nodes[i].v[1]; mem_used = nodes[i].v[2]; }
    if (rc == 0) rc = family(b, "trainyard_node_memory_bytes", "gauge", "Memory the ready nodes offer their tasks.");
    if (rc == 0) rc = buf_printf(b, "trainyard_node_memory_bytes %.17g\n", mem * 1048576.0);
    if (rc == 0) rc = family(b, "trainyard_node_memory_in_use_bytes", "gauge", "Memory the live tasks on the ready nodes hold.");
    if (rc == 0) rc = buf_printf(b, "trainyard_node_memory_in_use_bytes %.17g\n", mem_used * 1048576.0);
out:
    free(dev);
    free(byteam);
    free(nodes);
    return rc;
}

static int write_running(server *srv, buf *b, int64_t now) {
    stats_row *r = NULL;
    int n = 0;
    if (stats_query(srv->db, STATS_RUNNING, now, &r, &n) < 0) return -1;
    int rc = family(b, "trainyard_job_samples_per_second", "gauge",
                    "Training throughput of each running job, as its chief last reported it.");
    for (int i = 0; rc == 0 && i < n; i++) {
        char job[32];
        sfmt(job, sizeof job, "%lld", (long long)r[i].id);
        rc = sample_team(b, "trainyard_job_samples_per_second", r[i].team, "job", job, r[i].v[0]);
    }
    if (rc == 0) rc = family(b, "trainyard_job_progress_ratio", "gauge", "Fraction of its steps each running job has done.");
    for (int i = 0; rc == 0 && i < n; i++) {
        char job[32];
        sfmt(job, sizeof job, "%lld", (long long)r[i].id);
        rc = sample_team(b, "trainyard_job_progress_ratio", r[i].team, "job", job, r[i].v[2]);
    }
    free(r);
    return rc;
}

static int pass_histogram(buf *b, const char *name, const char *help, const uint64_t *bucket, double sum) {
    int rc = family(b, name, "histogram", help);
    uint64_t cum = 0;
    for (int i = 0; rc == 0 && i < SCHED_PASS_NB; i++) {
        cum += bucket[i];
        rc = buf_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, sched_pass_le[i], (unsigned long long)cum);
    }
    cum += bucket[SCHED_PASS_NB];
    if (rc == 0)
        rc = buf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9f\n%s_count %llu\n", name, (unsigned long long)cum,
                        name, sum, name, (unsigned long long)cum);
    return rc;
}

static int write_scheduler(buf *b) {
    sched_thread_stats st;
    sched_thread_stats_get(&st);
    int rc = pass_histogram(b, "trainyard_scheduler_pass_duration_seconds",
                            "Duration of the scheduler thread's passes, until decided (upkeep, refresh, decide).",
                            st.bucket, st.sum_s);
    if (rc == 0)
        rc = pass_histogram(b, "trainyard_scheduler_pass_bound_seconds",
                            "From a pass's start until its decisions were committed (its binding done).",
                            st.bound_bucket, st.bound_sum_s);
    if (rc == 0) rc = family(b, "trainyard_scheduler_pass_failures_total", "counter", "Scheduler passes rolled back on an error.");
    if (rc == 0) rc = buf_printf(b, "trainyard_scheduler_pass_failures_total %llu\n", (unsigned long long)st.failed);
    return rc;
}

/* The db's group commit (storage/db.h): batches, the writes in them, the
 * largest, and an item's wait from its queueing to its batch's BEGIN. */
static int write_group_commit(server *srv, buf *b) {
    db_group_stats g;
    db_group_stats_get(srv->db, &g);
    int rc = family(b, "trainyard_db_group_commits_total", "counter",
                    "Transactions of the group commit (each holds the submissions queued together).");
    if (rc == 0) rc = buf_printf(b, "trainyard_db_group_commits_total %llu\n", (unsigned long long)g.batches);
    if (rc == 0) rc = family(b, "trainyard_db_group_writes_total", "counter", "Writes (submissions) committed by them.");
    if (rc == 0) rc = buf_printf(b, "trainyard_db_group_writes_total %llu\n", (unsigned long long)g.items);
    if (rc == 0) rc = family(b, "trainyard_db_group_batch_max", "gauge", "The most writes one group commit held.");
    if (rc == 0) rc = buf_printf(b, "trainyard_db_group_batch_max %llu\n", (unsigned long long)g.largest);
    if (rc == 0)
        rc = family(b, "trainyard_db_group_wait_seconds_max", "gauge",
                    "The longest a write waited in the queue for its batch to begin.");
    if (rc == 0) rc = buf_printf(b, "trainyard_db_group_wait_seconds_max %.6f\n", (double)g.wait_us_max / 1e6);
    if (rc == 0)
        rc = family(b, "trainyard_db_group_wait_seconds_sum", "counter",
                    "Writes' waits in the queue for their batch to begin, summed (divide by the writes for the mean).");
    if (rc == 0) rc = buf_printf(b, "trainyard_db_group_wait_seconds_sum %.6f\n", (double)g.wait_us_sum / 1e6);
    if (rc == 0)
        rc = family(b, "trainyard_db_group_commit_seconds_sum", "counter",
                    "Time from a batch's BEGIN to the end of its COMMIT, summed over the batches.");
    if (rc == 0) rc = buf_printf(b, "trainyard_db_group_commit_seconds_sum %.6f\n", (double)g.commit_us_sum / 1e6);
    return rc;
}

/* Leadership (docs/ha.md): this server's role, its fencing number, the
 * writes the fence refused it. On SQLite: leader, epoch 0. */
static int write_lease(server *srv, buf *b) {
    int rc = family(b, "trainyard_leader", "gauge", "1 when this server leads, 0 when it stands by.");
    if (rc == 0) rc = buf_printf(b, "trainyard_leader{store=\"%s\"} %d\n", db_engine(srv->db), db_role(srv->db) == DB_LEADER);
    if (rc == 0) rc = family(b, "trainyard_lease_epoch", "gauge", "The fencing number this server writes with (0: none).");
    if (rc == 0) rc = buf_printf(b, "trainyard_lease_epoch %lld\n", (long long)db_epoch(srv->db));
    if (rc == 0)
        rc = family(b, "trainyard_fenced_writes_total", "counter",
                    "Writes the database refused this server: it no longer held the lease.");
    if (rc == 0) rc = buf_printf(b, "trainyard_fenced_writes_total %llu\n", (unsigned long long)db_fenced_writes(srv->db));
    return rc;
}

/* GET /metrics */
static void metrics_get(server *srv, http_req *req, http_res *res) {
    (void)req;
    buf b;
    buf_init(&b, METRICS_MAX);
    int64_t now = now_ms();
    int rc = family(&b, "trainyard_build_info", "gauge", "The running version (always 1).");
    if (rc == 0) rc = buf_printf(&b, "trainyard_build_info{version=\"%s\"} 1\n", TRAINYARD_VERSION);
    if (rc == 0) rc = write_lease(srv, &b);
    if (rc == 0 && db_role(srv->db) != DB_LEADER) { /* a standby: what it knows without the leader's state */
        size_t len = 0;
        char *body = buf_detach(&b, &len);
        res->status = 200;
        res->content_type = "text/plain; version=0.0.4; charset=utf-8";
        res->body = body;
        res->len = len;
        return;
    }
    int db_rc = 0;
    if (rc == 0 && (db_rc = write_jobs(srv, &b, now)) == 0 && (db_rc = write_devices(srv, &b, now)) == 0)
        db_rc = write_running(srv, &b, now);
    if (rc == 0 && db_rc < 0) {
        buf_release(&b);
        http_error(res, 503, "unavailable", NULL, "the database is busy or unavailable; retry");
        return;
    }
    if (rc == 0) rc = write_scheduler(&b);
    if (rc == 0) rc = write_group_commit(srv, &b);
    if (rc == 0 && srv->http) rc = http_latency_write(srv->http, &b);
    if (rc == 0) rc = api_backup_metrics(&b);
    if (rc == 0) rc = api_blobs_metrics(srv, &b);
    if (rc < 0) {
        buf_release(&b);
        http_error(res, 500, "internal", NULL, "the metrics are larger than %u bytes", METRICS_MAX);
        return;
    }
    size_t len = 0;
    char *body = buf_detach(&b, &len);
    res->status = 200;
    res->content_type = "text/plain; version=0.0.4; charset=utf-8";
    res->body = body;
    res->len = len;
}

const route api_metrics_routes[] = {
    {"GET", "/metrics", metrics_get, ALLOW_ADMIN | ALLOW_STANDBY, 0, ROLE_NONE},
    {NULL, NULL, NULL, 0, 0, ROLE_NONE},
};
