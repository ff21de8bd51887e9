/* db_pass.c - times the persistent scheduling pass (scheduler/scheduler.c)
 * on a real SQLite file: N nodes x G GPUs (+32 CPU slots) and J queued jobs
 * of the simulator's gang mix, then passes as jobs start and end. Reports
 * each pass's split: upkeep (write transaction), refresh (the mirror reads
 * what changed), build (the core's snapshot), core, apply (the only part
 * that holds the write lock besides upkeep).
 *
 * The same database is run twice from one copy of the file: with the mirror
 * (what the server does) and with sched_full_load(1) (every pass reads the
 * whole store, as before the mirror). Between passes, C of the running jobs
 * end (their tasks exit, the job succeeds) and C new jobs are submitted, by
 * SQL on the pass's own connection; the first pass places the first wave.
 *
 * Run: bench/sched_sim/run.sh db [--nodes N] [--gpus G] [--jobs J]
 *      [--passes P] [--churn C] [--mode both|mirror|full]
 * Last line: one JSON object with both modes' figures. */
#include <sqlite3.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/util.h"
#include "scheduler/scheduler.h"
#include "storage/cluster.h"
#include "storage/store.h"

static int exec_sql(db *d, const char *sql)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db_sqlite(d), sql, -1, &st, NULL) != SQLITE_OK) return -1;
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    return rc == SQLITE_DONE || rc == SQLITE_ROW ? 0 : -1;
}

static uint64_t g_rng = 42;
static uint64_t rnd(void)
{
    g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17;
    return g_rng;
}

static const char SQL_JOB[] =
    "INSERT INTO jobs(team_id, name, spec, state, priority, attempt, max_restarts, workers,"
    " devices_per_worker, device, ps, max_runtime_s, preemptible, created_at, updated_at,"
    " queued_at) VALUES(?, 'j', '{}', 'queued', 50, 0, 3, ?, ?, 'gpu', 0, 3600, 0, ?, ?, ?)";

static int add_jobs(db *d, int64_t team, int n, int64_t now)
{
    static const struct { int w, dpw; } mix[] = {{1, 1}, {1, 1}, {1, 1}, {1, 2}, {1, 4}, {1, 8}, {1, 8}, {2, 8}, {4, 8}, {8, 8}};
    if (db_begin(d) < 0) return -1;
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db_sqlite(d), SQL_JOB, -1, &st, NULL) != SQLITE_OK) { db_rollback(d); return -1; }
    for (int j = 0; j < n; j++) {
        int m = (int)(rnd() % 10);
        sqlite3_reset(st);
        sqlite3_bind_int64(st, 1, team);
        sqlite3_bind_int(st, 2, mix[m].w);
        sqlite3_bind_int(st, 3, mix[m].dpw);
        sqlite3_bind_int64(st, 4, now);
        sqlite3_bind_int64(st, 5, now);
        sqlite3_bind_int64(st, 6, now + j);
        if (sqlite3_step(st) != SQLITE_DONE) { sqlite3_finalize(st); db_rollback(d); return -1; }
    }
    sqlite3_finalize(st);
    return db_commit(d);
}

/* c running jobs end: their tasks exit, the job succeeds (the next upkeep
 * frees their devices). */
static int end_jobs(db *d, int c)
{
    if (db_begin(d) < 0) return -1;
    sqlite3_stmt *pick = NULL, *tasks = NULL, *job = NULL;
    int ok = sqlite3_prepare_v2(db_sqlite(d), "SELECT id FROM jobs WHERE state IN ('starting','running')"
                                " ORDER BY (id * 2654435761 + ?) % 1000003 LIMIT ?", -1, &pick, NULL) == SQLITE_OK &&
             sqlite3_prepare_v2(db_sqlite(d), "UPDATE tasks SET state = 'exited', exit_code = 0 WHERE job_id = ?"
                                " AND state != 'exited'", -1, &tasks, NULL) == SQLITE_OK &&
             sqlite3_prepare_v2(db_sqlite(d), "UPDATE jobs SET state = 'succeeded' WHERE id = ?", -1, &job,
                                NULL) == SQLITE_OK;
    if (ok) {
        sqlite3_bind_int64(pick, 1, (int64_t)(rnd() % 1000003));
        sqlite3_bind_int(pick, 2, c);
        while (ok && sqlite3_step(pick) == SQLITE_ROW) {
            int64_t id = sqlite3_column_int64(pick, 0);
            sqlite3_reset(tasks); sqlite3_bind_int64(tasks, 1, id);
            sqlite3_reset(job); sqlite3_bind_int64(job, 1, id);
            ok = sqlite3_step(tasks) == SQLITE_DONE && sqlite3_step(job) == SQLITE_DONE;
        }
    }
    sqlite3_finalize(pick); sqlite3_finalize(tasks); sqlite3_finalize(job);
    if (!ok) { db_rollback(d); return -1; }
    return db_commit(d);
}

/* CPU time of this thread: what the pass costs, less the time it waited
 * for a core (the build machine is shared). */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(const double *v, int n, double p)
{
    if (n <= 0) return 0;
    double *c = xmalloc((size_t)n * sizeof *c);
    memcpy(c, v, (size_t)n * sizeof *c);
    qsort(c, (size_t)n, sizeof *c, cmp_double);
    int i = (int)ceil(p * n) - 1;
    if (i < 0) i = 0;
    if (i >= n) i = n - 1;
    double r = c[i];
    free(c);
    return r;
}

typedef struct figures {
    double first, med, p99, cpu_med, cpu_p99, upkeep, refresh, build, core, apply;
    int passes;
} figures;

/* Runs the passes on the database at path: full 1 = the whole store read
 * each pass. */
static int run(const char *path, int full, int passes, int churn, int64_t now, int64_t team, figures *f)
{
    char err[256];
    db *d = NULL;
    if (db_open(&d, path, err, sizeof err) < 0) { fprintf(stderr, "%s\n", err); return -1; }
    sched_full_load(full);
    sched_config cfg;
    sched_config_default(&cfg);
    cfg.heartbeat_timeout_ms = 1LL << 40;
    double *tot = xcalloc((size_t)passes, sizeof(double)), *cpu = xcalloc((size_t)passes, sizeof(double)), *part[5];
    for (int k = 0; k < 5; k++) part[k] = xcalloc((size_t)passes, sizeof(double));
    g_rng = 42;
    int rc = 0;
    for (int pass = 0; pass < passes; pass++) {
        sched_pass_stats s;
        double a = mono_s(), ca = cpu_s();
        if (sched_pass(d, &cfg, now + pass * 1000, &s) < 0) { fprintf(stderr, "pass failed\n"); rc = -1; break; }
        tot[pass] = (mono_s() - a) * 1000;
        cpu[pass] = (cpu_s() - ca) * 1000;
        part[0][pass] = s.upkeep_ms; part[1][pass] = s.refresh_ms; part[2][pass] = s.build_ms;
        part[3][pass] = s.core_ms; part[4][pass] = s.apply_ms;
        printf("%s pass %2d: %7.1f ms, cpu %7.1f ms (upkeep %6.1f, refresh %6.1f%s %6d rows, build %5.1f, core %5.1f, apply %6.1f)"
               " placed %d waiting %d reasons %d\n", full ? "full  " : "mirror", pass, tot[pass], cpu[pass], s.upkeep_ms,
               s.refresh_ms, s.full_load ? " full," : ",     ", s.rows_read, s.build_ms, s.core_ms, s.apply_ms, s.placed,
               s.waiting, s.reasons);
        if (end_jobs(d, churn) < 0 || add_jobs(d, team, churn, now + pass * 1000) < 0) {
            fprintf(stderr, "churn failed\n"); rc = -1; break;
        }
    }
    /* warm passes: after the first two (the first wave placed, its reasons written) */
    int w0 = passes > 4 ? 2 : 1, nw = passes - w0;
    f->passes = nw;
    f->first = tot[0];
    f->med = pct(tot + w0, nw, 0.5);
    f->p99 = pct(tot + w0, nw, 0.99);
    f->cpu_med = pct(cpu + w0, nw, 0.5);
    f->cpu_p99 = pct(cpu + w0, nw, 0.99);
    f->upkeep = pct(part[0] + w0, nw, 0.5);
    f->refresh = pct(part[1] + w0, nw, 0.5);
    f->build = pct(part[2] + w0, nw, 0.5);
    f->core = pct(part[3] + w0, nw, 0.5);
    f->apply = pct(part[4] + w0, nw, 0.5);
    printf("%s: first %.1f ms; passes %d..%d: median %.1f ms, p99 %.1f ms; cpu median %.1f ms, p99 %.1f ms"
           " (medians: upkeep %.1f, refresh %.1f, build %.1f, core %.1f, apply %.1f)\n", full ? "full  " : "mirror",
           f->first, w0, passes - 1, f->med, f->p99, f->cpu_med, f->cpu_p99, f->upkeep, f->refresh, f->build, f->core,
           f->apply);
    free(tot);
    free(cpu);
    for (int k = 0; k < 5; k++) free(part[k]);
    db_close(d);
    return rc;
}

static void json_fig(const char *name, const figures *f, int last)
{
    printf("\"%s\":{\"first_ms\":%.1f,\"median_ms\":%.1f,\"p99_ms\":%.1f,\"cpu_median_ms\":%.1f,"
           "\"cpu_p99_ms\":%.1f,\"upkeep_ms\":%.1f,\"refresh_ms\":%.1f,\"build_ms\":%.1f,\"core_ms\":%.1f,"
           "\"apply_ms\":%.1f,\"passes\":%d}%s",
           name, f->first, f->med, f->p99, f->cpu_med, f->cpu_p99, f->upkeep, f->refresh, f->build, f->core, f->apply,
           f->passes, last ? "" : ",");
}

int main(int argc, char **argv)
{
    int n_nodes = 1000, gpus = 8, n_jobs = 10000, passes = 20, churn = 50;
    const char *mode = "both";
    for (int i = 1; i + 1 < argc; i += 2) {
        long v = 0;
        if (!strcmp(argv[i], "--mode")) { mode = argv[i + 1]; continue; }
        if (parse_long(argv[i + 1], 0, 10000000, &v) != 0) return 2;
        if (!strcmp(argv[i], "--nodes")) n_nodes = (int)v;
        else if (!strcmp(argv[i], "--gpus")) gpus = (int)v;
        else if (!strcmp(argv[i], "--jobs")) n_jobs = (int)v;
        else if (!strcmp(argv[i], "--passes")) passes = (int)v;
        else if (!strcmp(argv[i], "--churn")) churn = (int)v;
        else return 2;
    }
    if (passes < 2 || gpus > 64) return 2;
    int do_mirror = strcmp(mode, "full") != 0, do_full = strcmp(mode, "mirror") != 0;
    log_set_level(LOG_WARN);
    char dir[] = "/tmp/ty_dbpass_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char path[128], path2[160], err[256];
    snprintf(path, sizeof path, "%s/t.db", dir);
    snprintf(path2, sizeof path2, "%s/full.db", dir);
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
        snprintf(host, sizeof host, "node-%05d", i);
        if (cluster_node_upsert(d, host, "10.0.0.1", 32, gpus, idx, NULL, NULL, 0, NULL, now, NULL, NULL) < 0) return 1;
    }
    if (add_jobs(d, team, n_jobs, now) < 0) return 1;
    if (exec_sql(d, "PRAGMA wal_checkpoint(TRUNCATE)") < 0) return 1;
    db_close(d);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", path, path2);
    if (system(cmd) != 0) return 1;
    printf("db_pass: %d nodes x %d gpu + 32 cpu slots, %d queued jobs, %d passes, %d jobs end and %d are"
           " submitted between passes; setup %.1f s\n", n_nodes, gpus, n_jobs, passes, churn, churn, mono_s() - t0);
    figures fm = {0}, ff = {0};
    if (do_mirror && run(path, 0, passes, churn, now, team, &fm) < 0) return 1;
    if (do_full && run(path2, 1, passes, churn, now, team, &ff) < 0) return 1;
    printf("{\"nodes\":%d,\"gpus_per_node\":%d,\"jobs\":%d,\"passes\":%d,\"churn\":%d,", n_nodes, gpus, n_jobs,
           passes, churn);
    json_fig("mirror", &fm, 0);
    json_fig("full_load", &ff, 1);
    printf("}\n");
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) return 1;
    return 0;
}
