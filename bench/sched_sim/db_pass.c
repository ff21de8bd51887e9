/* db_pass.c - times the persistent scheduling pass (scheduler/scheduler.c)
 * on a real store, a SQLite file or (--db URL) a PostgreSQL database: N
 * nodes x G GPUs (+32 CPU slots) and J queued jobs of the simulator's gang
 * mix, then passes as jobs start and end. Reports each pass's split: upkeep
 * (write transaction), refresh (the mirror reads what changed), build (the
 * core's snapshot), core, apply (the only part that holds the write lock
 * besides upkeep).
 *
 * The same database is run twice from one copy of the file: with the mirror
 * (what the server does) and with sched_full_load(1) (every pass reads the
 * whole store, as before the mirror). Between passes, C of the running jobs
 * end (their tasks exit, the job succeeds) and C new jobs are submitted, by
 * SQL on the pass's own connection; the first pass places the first wave.
 * After the mirror run's last pass, its mirror must equal a fresh
 * cluster_load (the run fails otherwise).
 *
 * The passes run as the server's scheduler thread runs them
 * (sched_pass_async): each returns once decided, and its binding (the
 * apply, the evaluators) commits in a thread of its own while the churn
 * runs, as the cluster's other writers run beside the scheduler in a
 * server, and then the rest of the thread's gap between passes (twice the
 * pass: scheduler.c). A pass's time is its decision plus whatever of its
 * binding was left after them (the next pass would wait for that first);
 * "committed at" is the time from its start until its binding was done.
 * --bind sync runs each pass whole (sched_pass), as before the binding
 * thread; --gap none starts the next pass right after the churn.
 *
 * A PostgreSQL database cannot be copied by its owner: there the full-load
 * run follows the mirror run on the same database (the same sizes: the
 * churn ends as many jobs as it submits). Its setup commits with
 * synchronous_commit off (its own session only); the passes run with the
 * database's setting, or the URL's (options=-c synchronous_commit=off).
 *
 * Run: bench/sched_sim/run.sh db [--nodes N] [--gpus G] [--jobs J]
 *      [--passes P] [--churn C] [--mode both|mirror|full] [--db URL]
 *      [--vacuum 0|1] (PostgreSQL: VACUUM ANALYZE after the first wave, 1)
 *      [--bind async|sync] (async, the server's: sched_pass_async)
 *      [--gap server|none] (server: the scheduler thread's gap between passes)
 * (DB=postgres bench/sched_sim/run.sh db starts one with scripts/pg-dev.sh
 * and passes its URL; the database must be empty.)
 * Last line: one JSON object with both modes' figures. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/util.h"
#include "scheduler/mirror.h"
#include "scheduler/scheduler.h"
#include "storage/cluster.h"
#include "storage/store.h"

static uint64_t g_rng = 42;
static int g_vacuum = 1; /* --vacuum 0: no VACUUM ANALYZE after the first wave */
static int g_bind_async = 1; /* --bind sync: each pass commits its decisions before it returns */
static int g_gap = 1;        /* --gap none: the next pass right after the churn */
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
    for (int j = 0; j < n; j++) {
        int m = (int)(rnd() % 10);
        db_stmt *st = db_prepare(d, SQL_JOB);
        if (!st) { db_rollback(d); return -1; }
        db_bind_int64(st, 1, team);
        db_bind_int(st, 2, mix[m].w);
        db_bind_int(st, 3, mix[m].dpw);
        db_bind_int64(st, 4, now);
        db_bind_int64(st, 5, now);
        db_bind_int64(st, 6, now + j);
        int rc = db_step(st);
        db_done(st);
        if (rc != DB_DONE) { db_rollback(d); return -1; }
    }
    return db_commit(d);
}

/* c running jobs end: their tasks exit, the job succeeds (the next upkeep
 * frees their devices). */
static const char SQL_PICK[] = "SELECT id FROM jobs WHERE state IN ('starting','running')"
                               " ORDER BY (id * 2654435761 + ?) % 1000003 LIMIT ?";
static const char SQL_END_TASKS[] = "UPDATE tasks SET state = 'exited', exit_code = 0 WHERE job_id = ?"
                                    " AND state != 'exited'";
static const char SQL_END_JOB[] = "UPDATE jobs SET state = 'succeeded' WHERE id = ?";

static int end_jobs(db *d, int c)
{
    if (db_begin(d) < 0) return -1;
    int64_t *ids = xcalloc((size_t)c + 1, sizeof *ids);
    int n = 0, ok = 1;
    db_stmt *pick = db_prepare(d, SQL_PICK);
    if (!pick) ok = 0;
    else {
        db_bind_int64(pick, 1, (int64_t)(rnd() % 1000003));
        db_bind_int(pick, 2, c);
        int rc;
        while ((rc = db_step(pick)) == DB_ROW && n < c) ids[n++] = db_col_int64(pick, 0);
        ok = rc == DB_ROW || rc == DB_DONE;
        db_done(pick);
    }
    for (int k = 0; ok && k < n; k++) {
        db_stmt *tasks = db_prepare(d, SQL_END_TASKS);
        if (!tasks) { ok = 0; break; }
        db_bind_int64(tasks, 1, ids[k]);
        ok = db_step(tasks) == DB_DONE;
        db_done(tasks);
        db_stmt *job = ok ? db_prepare(d, SQL_END_JOB) : NULL;
        if (!job) { ok = 0; break; }
        db_bind_int64(job, 1, ids[k]);
        ok = db_step(job) == DB_DONE;
        db_done(job);
    }
    free(ids);
    if (!ok) { db_rollback(d); return -1; }
    return db_commit(d);
}

/* Opens the store; on PostgreSQL also takes the lease, as a server does
 * before it writes (docs/postgres.md, the fence). */
static int open_store(db **d, const char *path)
{
    char err[256];
    if (db_open(d, path, err, sizeof err) < 0) { fprintf(stderr, "%s\n", err); return -1; }
    if (strcmp(db_engine(*d), "postgres") == 0) {
        db_lease_cfg cfg = {.holder = "db_pass", .url = "http://127.0.0.1:1"};
        if (db_lease_start(*d, &cfg, err, sizeof err) < 0 || db_lease_wait(*d, 20000) < 0) {
            fprintf(stderr, "the lease: %s\n", err[0] ? err : "not led within 20 s");
            db_close(*d);
            *d = NULL;
            return -1;
        }
    }
    return 0;
}

static int cmp_job_id(const void *a, const void *b)
{
    int64_t x = ((const cl_job *)a)->id, y = ((const cl_job *)b)->id;
    return (x > y) - (x < y);
}

/* The scheduler's mirror, brought up to date, against a fresh cluster_load:
 * what a pass reads incrementally (by id, or prefetched in one statement on
 * PostgreSQL) must be what loading everything reads. 1 when they agree, 0
 * (with the first difference on stderr) when not, -1 on error. */
static int mirror_agrees(db *d)
{
    mirror *m = db_cache(d, DB_CACHE_MIRROR, NULL, NULL);
    if (!m || mirror_refresh(m, d, NULL) < 0) return -1;
    cluster_state a, b;
    mirror_export(m, &a);
    if (cluster_load(d, &b) < 0) { cluster_state_release(&a); return -1; }
    const char *what = NULL;
    if (a.n_nodes != b.n_nodes || a.n_devices != b.n_devices) what = "node or device count";
    for (int i = 0; !what && i < a.n_devices; i++)
        if (a.devices[i].id != b.devices[i].id || a.devices[i].job_id != b.devices[i].job_id ||
            a.devices[i].task_id != b.devices[i].task_id) what = "a device's holder";
    if (!what && (a.n_ports != b.n_ports || a.n_mem != b.n_mem)) what = "port or memory rows";
    for (int i = 0; !what && i < a.n_ports; i++)
        if (a.ports[i].node_id != b.ports[i].node_id || a.ports[i].port != b.ports[i].port) what = "a port";
    for (int i = 0; !what && i < a.n_mem; i++)
        if (a.mem[i].node_id != b.mem[i].node_id || a.mem[i].job_id != b.mem[i].job_id || a.mem[i].mb != b.mem[i].mb)
            what = "a node's memory";
    if (!what && (a.n_jobs != b.n_jobs || a.n_avoid != b.n_avoid)) what = "job or avoid count";
    if (!what) {
        qsort(a.jobs, (size_t)a.n_jobs, sizeof *a.jobs, cmp_job_id);
        qsort(b.jobs, (size_t)b.n_jobs, sizeof *b.jobs, cmp_job_id);
    }
    for (int i = 0; !what && i < a.n_jobs; i++) {
        const cl_job *x = &a.jobs[i], *y = &b.jobs[i];
        if (x->id != y->id || strcmp(x->state, y->state) || strcmp(x->reason, y->reason) || x->attempt != y->attempt ||
            x->attempt_started_at != y->attempt_started_at || x->stopping != y->stopping || x->runtime != y->runtime ||
            x->interactive != y->interactive)
            what = "a job";
    }
    if (what) fprintf(stderr, "db_pass: the mirror differs from a fresh load: %s\n", what);
    cluster_state_release(&a);
    cluster_state_release(&b);
    return what ? 0 : 1;
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
    double bound, waited;   /* medians: the pass's start to its decisions committed; its wait for them after the churn */
    double rt_upkeep, rt_refresh, rt_apply; /* round trips (PostgreSQL), medians */
    int passes;
    int agrees; /* the mirror equals a fresh load after the last pass (mirror run) */
} figures;

/* Runs the passes on the database at path: full 1 = the whole store read
 * each pass. */
static int run(const char *path, int full, int passes, int churn, int64_t now, int64_t team, figures *f)
{
    db *d = NULL;
    if (open_store(&d, path) < 0) return -1;
    sched_full_load(full);
    sched_config cfg;
    sched_config_default(&cfg);
    cfg.heartbeat_timeout_ms = 1LL << 40;
    double *tot = xcalloc((size_t)passes, sizeof(double)), *cpu = xcalloc((size_t)passes, sizeof(double)), *part[10];
    for (int k = 0; k < 10; k++) part[k] = xcalloc((size_t)passes, sizeof(double));
    g_rng = 42;
    int rc = 0;
    double prev_bind_cpu = 0;
    for (int pass = 0; pass < passes; pass++) {
        sched_pass_stats s;
        double a = mono_s(), ca = thread_cpu_s(), churn_ms = 0, wait_ms = 0;
        /* the server's form: the pass returns once decided and its binding
         * commits meanwhile; the churn (the cluster's other writers, on
         * their own threads in a server) runs beside it, then the rest of
         * the scheduler thread's gap (scheduler.c: twice the decision and
         * the last binding's CPU here, at most 250 ms; --gap none: no gap);
         * what of the binding is left after them is the pass's too (the next
         * pass would wait for it first) */
        int ok = g_bind_async ? sched_pass_async(d, &cfg, now + pass * 1000, &s, NULL, NULL) == 0
                              : sched_pass(d, &cfg, now + pass * 1000, &s) == 0;
        if (!ok) { fprintf(stderr, "pass failed\n"); rc = -1; break; }
        double e = mono_s();
        tot[pass] = (e - a) * 1000;
        cpu[pass] = (thread_cpu_s() - ca) * 1000;
        double c0 = mono_s();
        if (end_jobs(d, churn) < 0 || add_jobs(d, team, churn, now + pass * 1000) < 0) {
            fprintf(stderr, "churn failed\n"); rc = -1; break;
        }
        churn_ms = (mono_s() - c0) * 1000;
        if (g_gap) {
            double gap = 2 * (tot[pass] + (g_bind_async ? prev_bind_cpu : 0));
            if (gap > 250) gap = 250;
            double left = gap - (mono_s() - e) * 1000;
            if (left > 0) usleep((useconds_t)(left * 1000));
        }
        if (g_bind_async) {
            double w0 = mono_s();
            sched_pass_stats b;
            if (sched_bind_wait(d, &b) != 0) { fprintf(stderr, "the binding failed\n"); rc = -1; break; }
            wait_ms = (mono_s() - w0) * 1000;
            tot[pass] += wait_ms;
            cpu[pass] += b.bind_cpu_ms;
            prev_bind_cpu = b.bind_cpu_ms;
            s.placed = b.placed; s.waiting = b.waiting; s.reasons = b.reasons;
            s.apply_ms = b.apply_ms; s.rt_apply = b.rt_apply; s.bound_ms = b.bound_ms;
        } else {
            s.bound_ms = tot[pass];
        }
        part[8][pass] = s.bound_ms;
        part[9][pass] = wait_ms;
        part[0][pass] = s.upkeep_ms; part[1][pass] = s.refresh_ms; part[2][pass] = s.build_ms;
        part[3][pass] = s.core_ms; part[4][pass] = s.apply_ms;
        part[5][pass] = s.rt_upkeep; part[6][pass] = s.rt_refresh; part[7][pass] = s.rt_apply;
        printf("%s pass %2d: %7.1f ms, cpu %7.1f ms (upkeep %6.1f, refresh %6.1f%s %6d rows, build %5.1f, core %5.1f, apply %6.1f)"
               " placed %d waiting %d reasons %d; round trips %d/%d/%d; committed at %.1f ms",
               full ? "full  " : "mirror", pass, tot[pass], cpu[pass], s.upkeep_ms,
               s.refresh_ms, s.full_load ? " full," : ",     ", s.rows_read, s.build_ms, s.core_ms, s.apply_ms, s.placed,
               s.waiting, s.reasons, s.rt_upkeep, s.rt_refresh, s.rt_apply, s.bound_ms);
        printf(" (churn %.1f ms, then waited %.1f)\n", churn_ms, wait_ms);
        /* PostgreSQL: after the first wave (every queued job placed or
         * given its reason, the tables' statistics taken before it), the
         * VACUUM ANALYZE that autovacuum runs within its naptime (60 s) of
         * such a burst in a server; here the passes follow at once. SQLite
         * has no such daemon: its server runs without statistics, as here. */
        if (pass == 1 && g_vacuum && strcmp(db_engine(d), "postgres") == 0) {
            double va = mono_s();
            if (db_exec(d, "VACUUM ANALYZE") < 0) { fprintf(stderr, "VACUUM ANALYZE: %s\n", db_errmsg(d)); rc = -1; break; }
            printf("%s after pass 1: VACUUM ANALYZE %.1f ms\n", full ? "full  " : "mirror", (mono_s() - va) * 1000);
        }
    }
    if (rc == 0 && !full) {
        f->agrees = mirror_agrees(d);
        if (f->agrees != 1) rc = -1;
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
    f->rt_upkeep = pct(part[5] + w0, nw, 0.5);
    f->rt_refresh = pct(part[6] + w0, nw, 0.5);
    f->rt_apply = pct(part[7] + w0, nw, 0.5);
    f->bound = pct(part[8] + w0, nw, 0.5);
    f->waited = pct(part[9] + w0, nw, 0.5);
    printf("%s: first %.1f ms; passes %d..%d: median %.1f ms, p99 %.1f ms; cpu median %.1f ms, p99 %.1f ms"
           " (medians: upkeep %.1f, refresh %.1f, build %.1f, core %.1f, apply %.1f; round trips %.0f/%.0f/%.0f);"
           " committed at %.1f ms (median; binding %s, waited for %.1f ms)\n",
           full ? "full  " : "mirror", f->first, w0, passes - 1, f->med, f->p99, f->cpu_med, f->cpu_p99, f->upkeep,
           f->refresh, f->build, f->core, f->apply, f->rt_upkeep, f->rt_refresh, f->rt_apply, f->bound,
           g_bind_async ? "async" : "in the pass", f->waited);
    free(tot);
    free(cpu);
    for (int k = 0; k < 10; k++) free(part[k]);
    db_close(d);
    return rc;
}

static void json_fig(const char *name, const figures *f, int last)
{
    printf("\"%s\":{\"first_ms\":%.1f,\"median_ms\":%.1f,\"p99_ms\":%.1f,\"cpu_median_ms\":%.1f,"
           "\"cpu_p99_ms\":%.1f,\"upkeep_ms\":%.1f,\"refresh_ms\":%.1f,\"build_ms\":%.1f,\"core_ms\":%.1f,"
           "\"apply_ms\":%.1f,\"round_trips\":{\"upkeep\":%.0f,\"refresh\":%.0f,\"apply\":%.0f},\"passes\":%d,"
           "\"bind\":\"%s\",\"gap\":\"%s\",\"committed_ms\":%.1f,\"waited_ms\":%.1f%s}%s",
           name, f->first, f->med, f->p99, f->cpu_med, f->cpu_p99, f->upkeep, f->refresh, f->build, f->core, f->apply,
           f->rt_upkeep, f->rt_refresh, f->rt_apply, f->passes, g_bind_async ? "async" : "sync", g_gap ? "server" : "none", f->bound, f->waited, f->agrees ? ",\"mirror_equals_load\":true" : "", last ? "" : ",");
}

int main(int argc, char **argv)
{
    int n_nodes = 1000, gpus = 8, n_jobs = 10000, passes = 20, churn = 50;
    const char *mode = "both", *url = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        long v = 0;
        if (!strcmp(argv[i], "--mode")) { mode = argv[i + 1]; continue; }
        if (!strcmp(argv[i], "--db")) { url = argv[i + 1]; continue; }
        /* two-way flags: the first word is the default's (1) */
        static const struct { const char *flag, *yes, *no, *what; int *to; } two[] = {
            {"--gap", "server", "none", "the scheduler thread's gap, the default", &g_gap},
            {"--bind", "async", "sync", "the server's, the default", &g_bind_async},
        };
        int k = 0;
        while (k < 2 && strcmp(argv[i], two[k].flag)) k++;
        if (k < 2) {
            if (strcmp(argv[i + 1], two[k].yes) && strcmp(argv[i + 1], two[k].no)) {
                fprintf(stderr, "%s: %s (%s) or %s\n", two[k].flag, two[k].yes, two[k].what, two[k].no);
                return 2;
            }
            *two[k].to = strcmp(argv[i + 1], two[k].yes) == 0;
            continue;
        }
        if (parse_long(argv[i + 1], 0, 10000000, &v) != 0) return 2;
        if (!strcmp(argv[i], "--nodes")) n_nodes = (int)v;
        else if (!strcmp(argv[i], "--gpus")) gpus = (int)v;
        else if (!strcmp(argv[i], "--jobs")) n_jobs = (int)v;
        else if (!strcmp(argv[i], "--passes")) passes = (int)v;
        else if (!strcmp(argv[i], "--churn")) churn = (int)v;
        else if (!strcmp(argv[i], "--vacuum")) g_vacuum = v != 0;

        else return 2;
    }
    if (passes < 2 || gpus > 64) return 2;
    if (url && !db_is_url(url)) { fprintf(stderr, "--db: a postgres:// URL\n"); return 2; }
    int do_mirror = strcmp(mode, "full") != 0, do_full = strcmp(mode, "mirror") != 0;
    log_set_level(LOG_WARN);
    setvbuf(stdout, NULL, _IOLBF, 0); /* each pass's line as it ends */
    char dir[] = "/tmp/ty_dbpass_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char path[128], path2[160];
    snprintf(path, sizeof path, "%s/t.db", dir);
    snprintf(path2, sizeof path2, "%s/full.db", dir);
    const char *store = url ? url : path, *store2 = url ? url : path2;
    db *d = NULL;
    if (open_store(&d, store) < 0) return 1;
    /* the setup's commits need not wait for the disk (PostgreSQL: this session only) */
    if (url && db_exec(d, "SET synchronous_commit = off") < 0) return 1;
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
    if (url) {
        /* the statistics autovacuum would soon gather, of the tables filled here; tasks and
         * allocations are still empty, and a table never analyzed is planned by its size */
        if (db_exec(d, "ANALYZE nodes, devices, jobs") < 0) return 1;
    } else if (db_exec(d, "PRAGMA wal_checkpoint(TRUNCATE)") < 0) {
        return 1;
    }
    db_close(d);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", path, path2);
    if (!url && system(cmd) != 0) return 1;
    printf("db_pass: %s, %d nodes x %d gpu + 32 cpu slots, %d queued jobs, %d passes, %d jobs end and %d are"
           " submitted between passes; setup %.1f s\n", url ? "postgres" : "sqlite", n_nodes, gpus, n_jobs, passes,
           churn, churn, mono_s() - t0);
    figures fm = {0}, ff = {0};
    if (do_mirror && run(store, 0, passes, churn, now, team, &fm) < 0) return 1;
    /* on the same PostgreSQL database the full run goes on in time after the mirror's */
    int64_t now2 = url && do_mirror ? now + (int64_t)(passes + 1) * 1000 : now;
    if (do_full && run(store2, 1, passes, churn, now2, team, &ff) < 0) return 1;
    printf("{\"store\":\"%s\",\"nodes\":%d,\"gpus_per_node\":%d,\"jobs\":%d,\"passes\":%d,\"churn\":%d,",
           url ? "postgres" : "sqlite", n_nodes, gpus, n_jobs, passes, churn);
    json_fig("mirror", &fm, 0);
    json_fig("full_load", &ff, 1);
    printf("}\n");
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) return 1;
    return 0;
}
