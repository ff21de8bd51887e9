/* sim.c - the scheduler simulator: drives the real scheduling core
 * (scheduler/core.c) over a seeded trace of gang jobs on a simulated
 * cluster, with and without backfill, and reports pass latency, device
 * utilisation, each team's share against its weight, and the longest wait.
 * Ends with one JSON line. Run through bench/sched_sim/run.sh. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "scheduler/core.h"

#define NTEAMS 4
static const double team_weight[NTEAMS] = {4, 3, 2, 1};

/* --users U: each team's jobs belong to U users (job id mod U), so the core's
 * fair share within a team has users to order (1: the team's service account
 * alone, as before) */
static int g_users = 1;

typedef struct simjob {
    int64_t id;
    int team, priority, workers, dpw;
    int64_t max_runtime_s;
    int64_t runtime_ms;          /* actual */
    int64_t queued_at, started_at, end_at;
    int state;                   /* 0 queued, 1 running, 2 done */
} simjob;

static uint64_t rng_state;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17;
    return rng_state;
}
static double urand(void) { return (double)(rnd() >> 11) / 9007199254740992.0; }

typedef struct sim_stats {
    double *pass_ms; int n_pass, cap_pass;
    double util;                 /* while jobs waited */
    double share[NTEAMS];        /* device-seconds share while all teams waited */
    double contention_s;
    double longest_wait_s;
    double makespan_s;
    int backfilled;
    double cold_pass_ms;
} sim_stats;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void make_trace(simjob *jobs, int n, uint64_t seed)
{
    static const struct { int workers, dpw; double p; } mix[] = {
        {1, 1, 0.30}, {1, 2, 0.10}, {1, 4, 0.15}, {1, 8, 0.17},
        {2, 8, 0.10}, {4, 8, 0.08}, {8, 8, 0.05}, {16, 8, 0.03}, {32, 8, 0.02}};
    rng_state = seed * 2654435761u + 1;
    for (int i = 0; i < n; i++) {
        simjob *j = &jobs[i];
        memset(j, 0, sizeof *j);
        j->id = i + 1;
        double u = urand(), acc = 0;
        int m = 0;
        for (m = 0; m < 8; m++) { acc += mix[m].p; if (u < acc) break; }
        j->workers = mix[m].workers; j->dpw = mix[m].dpw;
        double t = urand() * 10.0, a = 0;            /* teams in proportion to weight */
        for (j->team = 0; j->team < NTEAMS - 1; j->team++) { a += team_weight[j->team]; if (t < a) break; }
        j->priority = urand() < 0.1 ? 80 : 50;
        double lr = log(600.0) + urand() * (log(14400.0) - log(600.0));
        j->max_runtime_s = (int64_t)exp(lr);
        j->runtime_ms = (int64_t)((double)j->max_runtime_s * 1000.0 * (0.3 + 0.7 * urand()));
        j->queued_at = 0;
    }
}

/* n_nodes nodes of `gpus` GPUs and 32 CPU slots, every device free. */
static sched_node *make_nodes(int n_nodes, int gpus, sched_device **gdev_out, sched_device **cdev_out)
{
    sched_node *nodes = xcalloc((size_t)n_nodes, sizeof *nodes);
    sched_device *gdev = xcalloc((size_t)n_nodes * (size_t)gpus, sizeof *gdev);
    int cpus = 32;
    sched_device *cdev = xcalloc((size_t)n_nodes * (size_t)cpus, sizeof *cdev);
    for (int i = 0; i < n_nodes; i++) {
        nodes[i].id = i + 1; nodes[i].ready = 1;
        nodes[i].n_dev[SCHED_GPU] = gpus; nodes[i].dev[SCHED_GPU] = &gdev[(size_t)i * gpus];
        nodes[i].n_dev[SCHED_CPU] = cpus; nodes[i].dev[SCHED_CPU] = &cdev[(size_t)i * cpus];
        for (int d = 0; d < gpus; d++) gdev[(size_t)i * gpus + d].id = (int64_t)i * 1000 + d + 1;
        for (int d = 0; d < cpus; d++) cdev[(size_t)i * cpus + d].id = (int64_t)i * 1000 + 100 + d;
    }
    *gdev_out = gdev;
    *cdev_out = cdev;
    return nodes;
}

/* Marks the devices the core gave placement pl as job_id's, appending each
 * to held (*n_held so far). Exits on a device held twice (a core bug). */
static void take_devices(sched_node *nodes, const sched_result *r, const sched_place *pl, int64_t job_id,
                         sched_device **held, int *n_held)
{
    for (int t = pl->task_off; t < pl->task_off + pl->n_tasks; t++) {
        const sched_task *tk = &r->tasks[t];
        sched_node *nd = &nodes[tk->node];
        for (int d = 0; d < tk->n_dev; d++) {
            int64_t did = r->dev_ids[tk->dev_off + d];
            for (int x = 0; x < nd->n_dev[tk->kind]; x++) {
                if (nd->dev[tk->kind][x].id != did) continue;
                if (nd->dev[tk->kind][x].job_id != 0) { fprintf(stderr, "device held twice\n"); exit(1); }
                nd->dev[tk->kind][x].job_id = job_id;
                held[(*n_held)++] = &nd->dev[tk->kind][x];
            }
        }
    }
}

/* A min-heap of running jobs by end time (indices into jobs). */
typedef struct endheap { int *v; int n; const simjob *jobs; } endheap;

static int end_before(const endheap *h, int a, int b)
{
    int64_t x = h->jobs[h->v[a]].end_at, y = h->jobs[h->v[b]].end_at;
    return x < y || (x == y && h->v[a] < h->v[b]);
}

static void heap_push(endheap *h, int ji)
{
    int i = h->n++;
    h->v[i] = ji;
    while (i > 0 && end_before(h, i, (i - 1) / 2)) {
        int p = (i - 1) / 2, t = h->v[p];
        h->v[p] = h->v[i]; h->v[i] = t; i = p;
    }
}

static int heap_pop(endheap *h)
{
    int top = h->v[0];
    h->v[0] = h->v[--h->n];
    for (int i = 0;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < h->n && end_before(h, l, m)) m = l;
        if (r < h->n && end_before(h, r, m)) m = r;
        if (m == i) break;
        int t = h->v[m]; h->v[m] = h->v[i]; h->v[i] = t; i = m;
    }
    return top;
}

/* One simulation of the whole trace. The snapshot is kept between events:
 * the queue and the running list change only where jobs start or end (no
 * pass over every job of the trace per event), the next event comes from a
 * heap of end times. tick_s > 0: a pass at most once per tick_s of
 * simulated time (ends within a tick are handled together, as the real
 * scheduler coalesces the kicks of task exits); 0: a pass at every end. */
static void simulate(int n_nodes, int gpus, int n_jobs, uint64_t seed, int backfill, int64_t tick_s, sim_stats *st)
{
    sched_config cfg;
    sched_config_default(&cfg);
    cfg.backfill = backfill;
    cfg.preemption = 0;
    simjob *jobs = xcalloc((size_t)n_jobs, sizeof *jobs);
    make_trace(jobs, n_jobs, seed);

    sched_device *gdev, *cdev;
    sched_node *nodes = make_nodes(n_nodes, gpus, &gdev, &cdev);
    sched_team teams[NTEAMS];
    for (int t = 0; t < NTEAMS; t++) teams[t] = (sched_team){t + 1, team_weight[t], 0, -1, 0, 0, 0};
    /* the queue in id order (all queued at t=0), compacted as jobs start */
    sched_job *q = xcalloc((size_t)n_jobs, sizeof *q);
    int *qmap = xcalloc((size_t)n_jobs, sizeof(int));
    int nq = 0;
    int team_waiting[NTEAMS] = {0};
    for (int i = 0; i < n_jobs; i++) {
        simjob *j = &jobs[i];
        q[nq] = (sched_job){j->id, j->team, j->priority, j->workers, j->dpw, SCHED_GPU, 0,
                            j->queued_at, j->max_runtime_s, 0, NULL, 0, 0, 0, 0,
                            g_users > 1 ? j->id % g_users : 0, 0};
        qmap[nq++] = i;
        team_waiting[j->team]++;
    }
    /* running jobs: a dense array (swap-remove), each job's place in it */
    sched_running *run = xcalloc((size_t)n_jobs, sizeof *run);
    int *runmap = xcalloc((size_t)n_jobs, sizeof(int)), *runpos = xcalloc((size_t)n_jobs, sizeof(int));
    int nr = 0;
    endheap heap = {xcalloc((size_t)n_jobs + 1, sizeof(int)), 0, jobs};
    /* where each job's devices are, to free them: (device pointer list) */
    sched_device ***held = xcalloc((size_t)n_jobs, sizeof *held);
    int *n_held = xcalloc((size_t)n_jobs, sizeof(int));
    char *placed = xcalloc((size_t)n_jobs, 1);

    sched_result r;
    sched_result_init(&r);
    int64_t now = 0;
    int done = 0, total_gpus = n_nodes * gpus;
    double busy_integral = 0, wait_window = 0, team_busy[NTEAMS] = {0}, contention = 0;
    int team_busy_now[NTEAMS] = {0};
    int busy_now = 0;
    memset(st, 0, sizeof *st);
    int first = 1;
    while (done < n_jobs) {
        sched_snapshot s = {now, n_nodes, n_nodes, nodes, NTEAMS, teams, nr, run, nq, q, 0, NULL};
        double t0 = mono_s();
        if (sched_pass_core(&s, &cfg, &r) != 0) { fprintf(stderr, "pass failed\n"); exit(1); }
        double ms = (mono_s() - t0) * 1000.0;  /* the pass alone */
        if (first) { st->cold_pass_ms = ms; first = 0; }
        if (nq > 0) {
            if (st->n_pass >= st->cap_pass) {
                st->cap_pass = st->cap_pass ? st->cap_pass * 2 : 1024;
                st->pass_ms = xrealloc(st->pass_ms, (size_t)st->cap_pass * sizeof(double));
            }
            st->pass_ms[st->n_pass++] = ms;
        }
        st->backfilled += r.n_backfilled;
        int all_wait = 1;
        for (int t = 0; t < NTEAMS; t++) all_wait &= team_waiting[t] > 0;
        for (int p = 0; p < r.n_place; p++) {
            const sched_place *pl = &r.place[p];
            int ji = qmap[pl->job];
            simjob *j = &jobs[ji];
            placed[pl->job] = 1;
            j->state = 1; j->started_at = now; j->end_at = now + j->runtime_ms;
            double w = (double)(now - j->queued_at) / 1000.0;
            if (w > st->longest_wait_s) st->longest_wait_s = w;
            held[ji] = xcalloc((size_t)(j->workers * j->dpw), sizeof(sched_device *));
            take_devices(nodes, &r, pl, j->id, held[ji], &n_held[ji]);
            busy_now += j->workers * j->dpw;
            team_busy_now[j->team] += j->workers * j->dpw;
            team_waiting[j->team]--;
            run[nr] = (sched_running){j->id, j->team, j->priority, 0, 0, j->workers * j->dpw,
                                      j->started_at, 0, j->started_at + j->max_runtime_s * 1000,
                                      0, 0, 0, 0, 0, 0, 0, g_users > 1 ? j->id % g_users : 0, 0};
            runmap[nr] = ji;
            runpos[ji] = nr++;
            heap_push(&heap, ji);
        }
        if (r.n_place > 0) { /* the queue less the jobs started, in order */
            int k = 0;
            for (int x = 0; x < nq; x++) {
                if (placed[x]) { placed[x] = 0; continue; }
                q[k] = q[x];
                qmap[k++] = qmap[x];
            }
            nq = k;
        }
        /* next event: the earliest end (the next tick with one, when ticking) */
        if (heap.n == 0) { fprintf(stderr, "stuck with %d queued\n", n_jobs - done); exit(1); }
        int64_t next = jobs[heap.v[0]].end_at;
        if (tick_s > 0) {
            int64_t tick = tick_s * 1000;
            next = (next + tick - 1) / tick * tick;
        }
        double dt = (double)(next - now) / 1000.0;
        for (int t = 0; t < NTEAMS; t++)
            teams[t].usage = sched_usage_decay(teams[t].usage, team_busy_now[t], dt, cfg.usage_window_s);
        if (nq > 0) { busy_integral += busy_now * dt; wait_window += dt; }
        if (all_wait) {
            for (int t = 0; t < NTEAMS; t++) team_busy[t] += team_busy_now[t] * dt;
            contention += dt;
        }
        now = next;
        while (heap.n > 0 && jobs[heap.v[0]].end_at <= now) {
            int i = heap_pop(&heap);
            simjob *j = &jobs[i];
            j->state = 2; done++;
            for (int d = 0; d < n_held[i]; d++) held[i][d]->job_id = 0;
            free(held[i]); held[i] = NULL;
            busy_now -= j->workers * j->dpw;
            team_busy_now[j->team] -= j->workers * j->dpw;
            int at = runpos[i];
            run[at] = run[--nr];
            runmap[at] = runmap[nr];
            runpos[runmap[at]] = at;
        }
    }
    st->util = wait_window > 0 ? busy_integral / ((double)total_gpus * wait_window) : 0;
    double sum = 0;
    for (int t = 0; t < NTEAMS; t++) sum += team_busy[t];
    for (int t = 0; t < NTEAMS; t++) st->share[t] = sum > 0 ? team_busy[t] / sum : 0;
    st->contention_s = contention;
    st->makespan_s = (double)now / 1000.0;
    sched_result_release(&r);
    free(jobs); free(nodes); free(gdev); free(cdev); free(q); free(qmap); free(run); free(runmap); free(runpos);
    free(heap.v); free(held); free(n_held); free(placed);
}

static double pct(double *v, int n, double p)
{
    if (n == 0) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    int i = (int)ceil(p * n) - 1;
    if (i < 0) i = 0;
    if (i >= n) i = n - 1;
    return v[i];
}

/* ================================================================ elastic
 * An open system for the elastic comparison: the trace's jobs arrive over
 * time (Poisson, offered load `load` of the GPUs) instead of all at once. A
 * share of the multi-worker jobs is elastic (resources.workers {"min": max/4
 * rounded up, "max": its workers}): the core starts it with what fits, grows
 * it into GPUs no queued job waits for (sched_grow), and the simulator
 * carries out a resize as trainyard does: the gang stops at once, is
 * requeued with its target and placed again by the next pass, paying
 * `resize_cost_s` of no progress at its new size. Work is worker-time: a job
 * of W workers and runtime R does W x R, at n workers it progresses n per
 * second (the global batch does not change; the step time scales as 1/n).
 * The same trace and arrival times run with share 0 (every job a fixed gang)
 * and with the share, in one run. */

typedef struct ojob {
    int64_t id;
    int team, priority, workers, dpw, lo;   /* lo: elastic min, 0 for a fixed gang */
    int64_t max_runtime_s;
    double work;                            /* worker-ms left */
    int64_t arrive, first_start, seg_start, end_at;
    int n, state, resize_to, resizes, seg;  /* state: -1 not arrived, 0 queued, 1 running, 2 done */
    int n_held;
    sched_device **held;
} ojob;

typedef struct oev { int64_t t; int ji, seg; } oev;

typedef struct oheap { oev *v; int n, cap; } oheap;

static int oev_before(const oev *a, const oev *b) { return a->t < b->t || (a->t == b->t && a->ji < b->ji); }

static void oheap_push(oheap *h, oev e)
{
    if (h->n == h->cap) { h->cap = h->cap ? h->cap * 2 : 1024; h->v = xrealloc(h->v, (size_t)h->cap * sizeof *h->v); }
    int i = h->n++;
    h->v[i] = e;
    while (i > 0 && oev_before(&h->v[i], &h->v[(i - 1) / 2])) {
        oev t = h->v[(i - 1) / 2]; h->v[(i - 1) / 2] = h->v[i]; h->v[i] = t; i = (i - 1) / 2;
    }
}

static oev oheap_pop(oheap *h)
{
    oev top = h->v[0];
    h->v[0] = h->v[--h->n];
    for (int i = 0;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < h->n && oev_before(&h->v[l], &h->v[m])) m = l;
        if (r < h->n && oev_before(&h->v[r], &h->v[m])) m = r;
        if (m == i) break;
        oev t = h->v[m]; h->v[m] = h->v[i]; h->v[i] = t; i = m;
    }
    return top;
}

typedef struct open_stats {
    double util;                 /* busy GPU-time / (GPUs x time until the last job ends) */
    double util_waiting;         /* the same while some job waited */
    double wait_median_s, wait_p95_s, jct_median_s, makespan_s;
    int resizes, grows, shrinks, preemptions;
} open_stats;

static void ojob_stop(ojob *j, int64_t now)
{
    j->work -= (double)j->n * (double)(now - j->seg_start);
    if (j->work < 0) j->work = 0;
    for (int d = 0; d < j->n_held; d++) j->held[d]->job_id = 0;
    j->n_held = 0;
    j->seg++;
}

static void simulate_open(int n_nodes, int gpus, int n_jobs, uint64_t seed, double share, double load,
                          double resize_cost_s, open_stats *st)
{
    sched_config cfg;
    sched_config_default(&cfg);
    cfg.preemption = 1;          /* shrinks (and priority preemption) in both runs */
    cfg.resize_interval_ms = 0;
    simjob *tr = xcalloc((size_t)n_jobs, sizeof *tr);
    make_trace(tr, n_jobs, seed);
    ojob *jobs = xcalloc((size_t)n_jobs, sizeof *jobs);
    double mean_gpu_ms = 0;
    for (int i = 0; i < n_jobs; i++) mean_gpu_ms += (double)tr[i].workers * tr[i].dpw * (double)tr[i].runtime_ms;
    mean_gpu_ms /= n_jobs;
    double gap_ms = mean_gpu_ms / (load * (double)n_nodes * gpus);   /* mean inter-arrival */
    rng_state = seed * 0x9E3779B97F4A7C15ull + 7;                     /* arrivals and elastic picks */
    double t = 0;
    for (int i = 0; i < n_jobs; i++) {
        ojob *j = &jobs[i];
        j->id = tr[i].id; j->team = tr[i].team; j->priority = tr[i].priority;
        j->workers = tr[i].workers; j->dpw = tr[i].dpw; j->max_runtime_s = tr[i].max_runtime_s;
        j->work = (double)tr[i].workers * (double)tr[i].runtime_ms;
        t += -log(1.0 - urand()) * gap_ms;
        j->arrive = (int64_t)t;
        double pick = urand();
        j->lo = j->workers >= 2 && pick < share ? (j->workers + 3) / 4 : 0;
        j->state = -1;
        j->held = xcalloc((size_t)(j->workers * j->dpw), sizeof *j->held);
    }
    free(tr);
    sched_device *gdev, *cdev;
    sched_node *nodes = make_nodes(n_nodes, gpus, &gdev, &cdev);
    sched_team teams[NTEAMS];
    for (int k = 0; k < NTEAMS; k++) teams[k] = (sched_team){k + 1, team_weight[k], 0, -1, 0, 0, 0};
    sched_job *q = xcalloc((size_t)n_jobs, sizeof *q);
    int *qmap = xcalloc((size_t)n_jobs, sizeof(int));
    sched_running *run = xcalloc((size_t)n_jobs, sizeof *run);
    int *runmap = xcalloc((size_t)n_jobs, sizeof(int));
    int *queued = xcalloc((size_t)n_jobs, sizeof(int)), nqd = 0;     /* queued jobs, arrival order */
    int *running = xcalloc((size_t)n_jobs, sizeof(int)), nrun = 0;
    double *waits = xcalloc((size_t)n_jobs, sizeof(double)), *jct = xcalloc((size_t)n_jobs, sizeof(double));
    oheap heap = {0};
    sched_result r;
    sched_result_init(&r);
    memset(st, 0, sizeof *st);
    int64_t now = 0;
    int next_arrival = 0, done = 0, busy = 0, n_wait = 0;
    double busy_integral = 0, busy_waiting = 0, waiting_time = 0;
    while (done < n_jobs) {
        while (next_arrival < n_jobs && jobs[next_arrival].arrive <= now) {
            jobs[next_arrival].state = 0;
            queued[nqd++] = next_arrival++;
        }
        int nq = 0, nr = 0;
        for (int x = 0; x < nqd; x++) {
            ojob *j = &jobs[queued[x]];
            q[nq] = (sched_job){j->id, j->team, j->priority, j->workers, j->dpw, SCHED_GPU, 0, j->arrive,
                                j->max_runtime_s, 0, NULL, 0, j->lo, j->resize_to, 0, 0, 0};
            qmap[nq++] = queued[x];
        }
        for (int x = 0; x < nrun; x++) {
            ojob *j = &jobs[running[x]];
            int64_t left = (int64_t)(j->work / j->n);
            run[nr] = (sched_running){j->id, j->team, j->priority, 0, 0, j->n * j->dpw, j->seg_start, 0,
                                      now + left, j->lo ? j->n : 0, j->lo, j->lo ? j->workers : 0, j->dpw,
                                      SCHED_GPU, 0, j->lo > 0, 0, 0};
            runmap[nr++] = running[x];
        }
        sched_snapshot s = {now, n_nodes, n_nodes, nodes, NTEAMS, teams, nr, run, nq, q, 0, NULL};
        if (sched_pass_core(&s, &cfg, &r) != 0) { fprintf(stderr, "pass failed\n"); exit(1); }
        for (int p = 0; p < r.n_place; p++) {
            const sched_place *pl = &r.place[p];
            ojob *j = &jobs[qmap[pl->job]];
            int restart = j->first_start > 0 || j->resizes > 0;
            if (!j->first_start) { j->first_start = now > 0 ? now : 1; waits[n_wait++] = (double)(now - j->arrive) / 1000; }
            j->state = 1; j->n = pl->workers; j->resize_to = 0; j->seg++; j->seg_start = now;
            if (restart) j->work += (double)j->n * resize_cost_s * 1000.0;
            take_devices(nodes, &r, pl, j->id, j->held, &j->n_held);
            busy += j->n * j->dpw;
            j->end_at = now + (int64_t)ceil(j->work / j->n);
            oheap_push(&heap, (oev){j->end_at, qmap[pl->job], j->seg});
        }
        int again = 0;
        for (int g = 0; g < r.n_grows; g++) {          /* stop, requeue with the target */
            int ji = runmap[r.grows[g].running];
            ojob *j = &jobs[ji];
            busy -= j->n * j->dpw;
            ojob_stop(j, now);
            j->state = 0; j->resize_to = r.grows[g].to; j->resizes++;
            st->grows++;
            again = 1;
        }
        st->resizes += r.n_grows;
        for (int x = 0; x < r.n_stops; x++) {          /* shrunk or preempted: requeued */
            int ji = runmap[r.stops[x].running];
            ojob *j = &jobs[ji];
            if (j->state != 1) continue;
            busy -= j->n * j->dpw;
            ojob_stop(j, now);
            j->state = 0; j->resize_to = r.stops[x].shrink_to;
            if (r.stops[x].shrink_to > 0) { j->resizes++; st->resizes++; st->shrinks++; }
            else st->preemptions++;
            again = 1;
        }
        /* the lists as they are now */
        int k = 0;
        for (int x = 0; x < nqd; x++) if (jobs[queued[x]].state == 0) queued[k++] = queued[x];
        nqd = k;
        k = 0;
        for (int x = 0; x < nrun; x++) if (jobs[running[x]].state == 1) running[k++] = running[x];
        nrun = k;
        for (int p = 0; p < r.n_place; p++) running[nrun++] = qmap[r.place[p].job];
        for (int g = 0; g < r.n_grows; g++) queued[nqd++] = runmap[r.grows[g].running];
        for (int x = 0; x < r.n_stops; x++)
            if (jobs[runmap[r.stops[x].running]].state == 0) queued[nqd++] = runmap[r.stops[x].running];
        /* the next event */
        while (heap.n > 0 && (heap.v[0].seg != jobs[heap.v[0].ji].seg || jobs[heap.v[0].ji].state != 1))
            oheap_pop(&heap);
        int64_t next = INT64_MAX;
        if (again) next = now;
        else {
            if (heap.n > 0) next = heap.v[0].t;
            if (next_arrival < n_jobs && jobs[next_arrival].arrive < next) next = jobs[next_arrival].arrive;
            if (next == INT64_MAX) { fprintf(stderr, "stuck with %d queued\n", nqd); exit(1); }
        }
        double dt = (double)(next - now);
        busy_integral += busy * dt;
        if (nqd > 0) { busy_waiting += busy * dt; waiting_time += dt; }
        now = next;
        while (heap.n > 0 && heap.v[0].t <= now) {
            oev e = oheap_pop(&heap);
            ojob *j = &jobs[e.ji];
            if (e.seg != j->seg || j->state != 1) continue;
            busy -= j->n * j->dpw;
            ojob_stop(j, now);
            j->state = 2;
            jct[done++] = (double)(now - j->arrive) / 1000;
        }
        k = 0;
        for (int x = 0; x < nrun; x++) if (jobs[running[x]].state == 1) running[k++] = running[x];
        nrun = k;
    }
    double total = (double)n_nodes * gpus;
    st->makespan_s = (double)now / 1000;
    st->util = now > 0 ? busy_integral / (total * (double)now) : 0;
    st->util_waiting = waiting_time > 0 ? busy_waiting / (total * waiting_time) : 0;
    st->wait_median_s = pct(waits, n_wait, 0.5);
    st->wait_p95_s = pct(waits, n_wait, 0.95);
    st->jct_median_s = pct(jct, done, 0.5);
    sched_result_release(&r);
    for (int i = 0; i < n_jobs; i++) free(jobs[i].held);
    free(jobs); free(nodes); free(gdev); free(cdev); free(q); free(qmap); free(run); free(runmap);
    free(queued); free(running); free(waits); free(jct); free(heap.v);
}


int main(int argc, char **argv)
{
    int n_nodes = 1000, gpus = 8, n_jobs = 10000;
    uint64_t seed = 42;
    int64_t tick_s = 0;
    long elastic_pct = -1, load_pct = 95, resize_cost_s = 30;
    for (int i = 1; i + 1 < argc; i += 2) {
        long v;
        if (parse_long(argv[i + 1], 1, 100000000, &v) != 0) { fprintf(stderr, "bad value %s\n", argv[i + 1]); return 2; }
        if (!strcmp(argv[i], "--nodes")) n_nodes = (int)v;
        else if (!strcmp(argv[i], "--gpus")) gpus = (int)v;
        else if (!strcmp(argv[i], "--jobs")) n_jobs = (int)v;
        else if (!strcmp(argv[i], "--seed")) seed = (uint64_t)v;
        else if (!strcmp(argv[i], "--tick")) tick_s = v;
        else if (!strcmp(argv[i], "--elastic")) elastic_pct = v > 100 ? 100 : v;
        else if (!strcmp(argv[i], "--load")) load_pct = v;
        else if (!strcmp(argv[i], "--resize-cost")) resize_cost_s = v;
        else if (!strcmp(argv[i], "--users")) g_users = (int)v;
        else {
            fprintf(stderr, "usage: sim [--nodes N] [--gpus G] [--jobs J] [--seed S] [--tick SECONDS] [--users U]\n"
                            "           [--elastic PERCENT [--load PERCENT] [--resize-cost SECONDS]]\n");
            return 2;
        }
    }
    if (elastic_pct >= 0) {
        /* the elastic comparison: the same arrivals with fixed gangs and with
         * PERCENT of the multi-worker jobs elastic */
        printf("sched_sim elastic: %d nodes x %d gpu, %d jobs arriving at %ld%% offered load, seed %llu,"
               " %ld%% of multi-worker jobs elastic (min = max/4), resize cost %ld s\n",
               n_nodes, gpus, n_jobs, load_pct, (unsigned long long)seed, elastic_pct, resize_cost_s);
        open_stats fx, el;
        double w0 = mono_s();
        simulate_open(n_nodes, gpus, n_jobs, seed, 0.0, (double)load_pct / 100, (double)resize_cost_s, &fx);
        simulate_open(n_nodes, gpus, n_jobs, seed, (double)elastic_pct / 100, (double)load_pct / 100,
                      (double)resize_cost_s, &el);
        double w1 = mono_s();
        printf("%-8s util %.1f%% (while jobs waited %.1f%%), wait median %.0f s p95 %.0f s, job time median %.0f s,"
               " makespan %.1f h\n", "fixed", fx.util * 100, fx.util_waiting * 100, fx.wait_median_s, fx.wait_p95_s,
               fx.jct_median_s, fx.makespan_s / 3600);
        printf("%-8s util %.1f%% (while jobs waited %.1f%%), wait median %.0f s p95 %.0f s, job time median %.0f s,"
               " makespan %.1f h, %d resizes (%d grows, %d shrinks), %d preemptions\n", "elastic", el.util * 100,
               el.util_waiting * 100, el.wait_median_s, el.wait_p95_s, el.jct_median_s, el.makespan_s / 3600,
               el.resizes, el.grows, el.shrinks, el.preemptions);
        printf("(fixed: %d preemptions)\n", fx.preemptions);
        printf("wall %.1f s\n", w1 - w0);
        printf("{\"bench\":\"sched_sim_elastic\",\"nodes\":%d,\"gpus_per_node\":%d,\"jobs\":%d,\"seed\":%llu,"
               "\"load\":%.2f,\"elastic_share\":%.2f,\"resize_cost_s\":%ld,"
               "\"fixed\":{\"util\":%.4f,\"util_waiting\":%.4f,\"wait_median_s\":%.0f,\"wait_p95_s\":%.0f,"
               "\"jct_median_s\":%.0f,\"makespan_s\":%.0f},"
               "\"elastic\":{\"util\":%.4f,\"util_waiting\":%.4f,\"wait_median_s\":%.0f,\"wait_p95_s\":%.0f,"
               "\"jct_median_s\":%.0f,\"makespan_s\":%.0f,\"resizes\":%d,\"grows\":%d,\"shrinks\":%d}}\n",
               n_nodes, gpus, n_jobs, (unsigned long long)seed, (double)load_pct / 100, (double)elastic_pct / 100,
               resize_cost_s, fx.util, fx.util_waiting, fx.wait_median_s, fx.wait_p95_s, fx.jct_median_s,
               fx.makespan_s, el.util, el.util_waiting, el.wait_median_s, el.wait_p95_s, el.jct_median_s,
               el.makespan_s, el.resizes, el.grows, el.shrinks);
        return 0;
    }
    printf("sched_sim: %d nodes x %d gpu, %d jobs, seed %llu, teams weights 4:3:2:1, %s\n",
           n_nodes, gpus, n_jobs, (unsigned long long)seed, tick_s ? "a pass per tick with job ends" : "a pass per job end");
    sim_stats on, off;
    double w0 = mono_s();
    simulate(n_nodes, gpus, n_jobs, seed, 1, tick_s, &on);
    double w1 = mono_s();
    simulate(n_nodes, gpus, n_jobs, seed, 0, tick_s, &off);
    double w2 = mono_s();
    double pass_total = 0;
    for (int k = 0; k < on.n_pass; k++) pass_total += on.pass_ms[k];
    double med = pct(on.pass_ms, on.n_pass, 0.5), p99 = pct(on.pass_ms, on.n_pass, 0.99);
    double wsum = 0, maxdev = 0;
    for (int t = 0; t < NTEAMS; t++) wsum += team_weight[t];
    printf("passes (backfill on, queue non-empty): %d, median %.2f ms, p99 %.2f ms, first (cold, %d queued) %.2f ms\n",
           on.n_pass, med, p99, n_jobs, on.cold_pass_ms);
    printf("utilisation while jobs waited: backfill %.1f%%, no backfill %.1f%%\n", on.util * 100, off.util * 100);
    printf("makespan: backfill %.1f h, no backfill %.1f h; jobs started by backfill: %d\n",
           on.makespan_s / 3600, off.makespan_s / 3600, on.backfilled);
    printf("team shares while every team had jobs waiting (%.1f h, backfill on):\n", on.contention_s / 3600);
    for (int t = 0; t < NTEAMS; t++) {
        double want = team_weight[t] / wsum;
        double dev = want > 0 ? (on.share[t] - want) / want : 0;
        if (fabs(dev) > maxdev) maxdev = fabs(dev);
        printf("  team %d weight %.0f: share %.1f%% (weight share %.1f%%, off by %+.1f%%)\n",
               t + 1, team_weight[t], on.share[t] * 100, want * 100, dev * 100);
    }
    printf("longest wait: backfill %.1f h, no backfill %.1f h\n", on.longest_wait_s / 3600, off.longest_wait_s / 3600);
    printf("wall: backfill run %.1f s (of which passes %.1f s), no-backfill run %.1f s\n", w1 - w0, pass_total / 1000,
           w2 - w1);
    printf("{\"nodes\":%d,\"gpus_per_node\":%d,\"jobs\":%d,\"seed\":%llu,\"tick_s\":%lld,\"passes\":%d,"
           "\"pass_median_ms\":%.3f,\"pass_p99_ms\":%.3f,\"pass_cold_ms\":%.3f,"
           "\"util_backfill\":%.4f,\"util_no_backfill\":%.4f,"
           "\"share\":[%.4f,%.4f,%.4f,%.4f],\"weights\":[4,3,2,1],\"share_max_rel_dev\":%.4f,"
           "\"longest_wait_s\":%.0f,\"longest_wait_no_backfill_s\":%.0f,\"backfilled\":%d}\n",
           n_nodes, gpus, n_jobs, (unsigned long long)seed, (long long)tick_s, on.n_pass, med, p99, on.cold_pass_ms,
           on.util, off.util, on.share[0], on.share[1], on.share[2], on.share[3], maxdev,
           on.longest_wait_s, off.longest_wait_s, on.backfilled);
    free(on.pass_ms); free(off.pass_ms);
    return 0;
}
