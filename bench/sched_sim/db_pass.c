/* db_pass.c - times the persistent scheduling pass (scheduler/scheduler.c)
 * on a real SQLite file: N nodes x G GPUs (+32 CPU slots) and J queued jobs
 * of the simulator's gang mix, then passes as jobs start and end. Reports the
 * load / core / apply split of each pass: apply is the only part that holds
 * the write lock. Run: bench/sched_sim/run.sh db [--nodes N] [--jobs J] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "scheduler/scheduler.h"
#include "storage/cluster.h"
#include "storage/store.h"

static int exec_sql(db *d, const char *sql)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db_conn(d), sql, -1, &st, NULL) != SQLITE_OK) return -1;
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    return rc == SQLITE_DONE || rc == SQLITE_ROW ? 0 : -1;
}

int main(int argc, char **argv)
{
    int n_nodes = 1000, gpus = 8, n_jobs = 10000;
    for (int i = 1; i + 1 < argc; i += 2) {
        long v;
        if (parse_long(argv[i + 1], 1, 10000000, &v) != 0) return 2;
        if (!strcmp(argv[i], "--nodes")) n_nodes = (int)v;
        else if (!strcmp(argv[i], "--gpus")) gpus = (int)v;
        else if (!strcmp(argv[i], "--jobs")) n_jobs = (int)v;
        else return 2;
    }
    log_set_level(LOG_WARN);
    char dir[] = "/tmp/ty_dbpass_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char path[128], err[256];
    snprintf(path, sizeof path, "%s/t.db", dir);
    db *d = NULL;
    if (db_open(&d, path, err, sizeof err) < 0) { fprintf(stderr, "%s\n", err); return 1; }
    int64_t team = 0;
    if (store_team_create(d, "default", &team) != STORE_OK) return 1;
    int64_t now = now_ms();
    int idx[64];
    for (int g = 0; g < gpus; g++) idx[g] = g;
    double t0 = mono_s();
    for (int i = 0; i < n_nodes; i++) {
        char host[32];
        snprintf(host, sizeof host, "node-%04d", i);
        if (cluster_node_upsert(d, host, "10.0.0.1", 32, gpus, idx, NULL, NULL, 0, NULL, now, NULL, NULL) < 0) return 1;
    }
    static const struct { int w, dpw; } mix[] = {{1, 1}, {1, 1}, {1, 1}, {1, 2}, {1, 4}, {1, 8}, {1, 8}, {2, 8}, {4, 8}, {8, 8}};
    if (db_begin(d) < 0) return 1;
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db_conn(d),
                           "INSERT INTO jobs(team_id, name, spec, state, priority, attempt, max_restarts, workers,"
                           " devices_per_worker, device, ps, max_runtime_s, preemptible, created_at, updated_at,"
                           " queued_at) VALUES(?, 'j', '{}', 'queued', 50, 0, 3, ?, ?, 'gpu', 0, 3600, 0, ?, ?, ?)",
                           -1, &st, NULL) != SQLITE_OK)
        return 1;
    uint64_t r = 42;
    for (int j = 0; j < n_jobs; j++) {
        r ^= r << 13; r ^= r >> 7; r ^= r << 17;
        int m = (int)(r % 10);
        sqlite3_reset(st);
        sqlite3_bind_int64(st, 1, team);
        sqlite3_bind_int(st, 2, mix[m].w);
        sqlite3_bind_int(st, 3, mix[m].dpw);
        sqlite3_bind_int64(st, 4, now);
        sqlite3_bind_int64(st, 5, now);
        sqlite3_bind_int64(st, 6, now + j);
        if (sqlite3_step(st) != SQLITE_DONE) return 1;
    }
    sqlite3_finalize(st);
    if (db_commit(d) < 0) return 1;
    printf("db_pass: %d nodes x %d gpu, %d queued jobs, setup %.1f s\n", n_nodes, gpus, n_jobs, mono_s() - t0);
    sched_config cfg;
    sched_config_default(&cfg);
    cfg.heartbeat_timeout_ms = 1LL << 40;
    for (int pass = 0; pass < 8; pass++) {
        sched_pass_stats s;
        double a = mono_s();
        if (sched_pass(d, &cfg, now + pass * 1000, &s) < 0) { fprintf(stderr, "pass failed\n"); return 1; }
        printf("pass %d: %.1f ms (load %.1f, core %.1f, apply %.1f) placed %d waiting %d\n", pass,
               (mono_s() - a) * 1000, s.load_ms, s.core_ms, s.apply_ms, s.placed, s.waiting);
        /* a tenth of the running jobs end: their tasks exit */
        if (exec_sql(d, "UPDATE tasks SET state = 'exited' WHERE job_id IN (SELECT id FROM jobs WHERE state ="
                        " 'starting' AND id % 10 = 0)") < 0 ||
            exec_sql(d, "UPDATE jobs SET state = 'succeeded' WHERE state = 'starting' AND id % 10 = 0") < 0)
            return 1;
    }
    db_close(d);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) return 1;
    return 0;
}
