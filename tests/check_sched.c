/* check_sched.c - the scheduler: hand-made scenarios for each rule (best
 * fit, fewest nodes, reasons, quotas, backfill, preemption, admission), then
 * property tests over thousands of random clusters and job mixes through the
 * pure core, and random passes through the SQLite pass on a real database
 * file (crash mid-pass, lost nodes, max_restarts). With TY_PG_URL
 * (tests/pg_fixture.h) the database cases run on PostgreSQL, each on a
 * fresh database, holding the lease as a server does. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <dirent.h>

#include "../common/util.h"
#include "../scheduler/core.h"
#include "../scheduler/eval_place.h"
#include "../scheduler/lifecycle.h"
#include "../scheduler/mirror.h"
#include "../scheduler/scheduler.h"
#include "../storage/cluster.h"
#include "../storage/db.h"
#include "../storage/store.h"
#include "pg_fixture.h"
#include "db_fixture.h"

#include <sqlite3.h>

/* ================================================================ builders */

#define MAXN 64
#define MAXD 64
#define MAXJ 256

typedef struct world {
    sched_snapshot s;
    sched_node nodes[MAXN];
    sched_device dev[MAXN][SCHED_KINDS][MAXD];
    int ports[MAXN][8];
    sched_mem mem[MAXN][32];       /* memory held per node, per job */
    sched_team teams[8];
    sched_running run[MAXJ];
    sched_job q[MAXJ];
    int64_t avoid[MAXJ][2];
    sched_config cfg;
} world;

static world *world_new(void)
{
    world *w = xcalloc(1, sizeof *w);
    sched_config_default(&w->cfg);
    w->s.nodes = w->nodes; w->s.teams = w->teams; w->s.running = w->run; w->s.queued = w->q;
    w->s.now_ms = 1000000000;
    w->teams[0] = (sched_team){1, 1.0, 0, -1, 0, 0, 0};
    w->s.n_teams = 1;
    return w;
}

static int add_node(world *w, int gpus, int cpus)
{
    int i = w->s.n_nodes++;
    sched_node *n = &w->nodes[i];
    n->id = 100 + i; n->ready = 1;
    n->n_dev[SCHED_GPU] = gpus; n->n_dev[SCHED_CPU] = cpus;
    n->dev[SCHED_GPU] = w->dev[i][SCHED_GPU]; n->dev[SCHED_CPU] = w->dev[i][SCHED_CPU];
    for (int d = 0; d < gpus; d++) w->dev[i][SCHED_GPU][d] = (sched_device){(int64_t)i * 1000 + d + 1, 0};
    for (int d = 0; d < cpus; d++) w->dev[i][SCHED_CPU][d] = (sched_device){(int64_t)i * 1000 + 500 + d, 0};
    n->ports = w->ports[i];
    n->mem = w->mem[i];
    w->s.n_nodes_registered = w->s.n_nodes;
    return i;
}

/* Job id holds mb more MiB of memory on node i. */
static void hold_mem(world *w, int i, int64_t id, int64_t mb)
{
    sched_node *n = &w->nodes[i];
    for (int m = 0; m < n->n_mem; m++)
        if (w->mem[i][m].job_id == id) { w->mem[i][m].mb += mb; return; }
    ck_assert_int_lt(n->n_mem, 32);
    w->mem[i][n->n_mem++] = (sched_mem){id, mb};
}

/* Job id's memory leaves every node. */
static void drop_mem(world *w, int64_t id)
{
    for (int i = 0; i < w->s.n_nodes; i++) {
        int k = 0;
        for (int m = 0; m < w->nodes[i].n_mem; m++)
            if (w->mem[i][m].job_id != id) w->mem[i][k++] = w->mem[i][m];
        w->nodes[i].n_mem = k;
    }
}

/* A running job holding `count` gpus on node i (first free ones). */
static int add_running(world *w, int64_t id, int team, int prio, int preemptible, int node, int count)
{
    int r = w->s.n_running++;
    w->run[r] = (sched_running){id, team, prio, preemptible, 0, count, w->s.now_ms - 600000, 0,
                                w->s.now_ms + 3600000, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    for (int d = 0, got = 0; d < w->nodes[node].n_dev[SCHED_GPU] && got < count; d++)
        if (w->dev[node][SCHED_GPU][d].job_id == 0) { w->dev[node][SCHED_GPU][d].job_id = id; got++; }
    return r;
}

static int add_job(world *w, int64_t id, int team, int prio, int workers, int dpw, int kind)
{
    int q = w->s.n_queued++;
    w->q[q] = (sched_job){id, team, prio, workers, dpw, kind, 0, w->s.now_ms - id * 1000, 3600, 0, NULL, 0, 0, 0, 0, 0, 0};
    return q;
}

static void reason(const sched_result *r, int q, char *out, size_t cap)
{
    sched_reason_format(&r->out[q], out, cap);
}

/* ================================================================ scenarios */

START_TEST(best_fit_keeps_large_holes)
{
    world *w = world_new();
    add_node(w, 8, 4);
    int n1 = add_node(w, 8, 4);
    add_running(w, 1, 0, 50, 0, n1, 6);            /* node 1 has a 2-gpu hole */
    int q = add_job(w, 10, 0, 50, 1, 2, SCHED_GPU);
    sched_result r; sched_result_init(&r);
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_eq(r.n_place, 1);
    ck_assert_int_eq(r.out[q].place, 0);
    ck_assert_int_eq(r.tasks[r.place[0].task_off].node, n1);
    sched_result_release(&r); free(w);
}
END_TEST

START_TEST(gang_on_fewest_nodes)
{
    world *w = world_new();
    for (int i = 0; i < 4; i++) add_node(w, 4, 4);
    add_node(w, 8, 4);
    add_job(w, 10, 0, 50, 4, 2, SCHED_GPU);        /* 8 gpus: fits the 8-gpu node alone */
    add_job(w, 11, 0, 50, 4, 2, SCHED_GPU);        /* then two 4-gpu nodes */
    sched_result r; sched_result_init(&r);
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_eq(r.n_place, 2);
    ck_assert_int_eq(r.place[0].n_nodes, 1);
    ck_assert_int_eq(r.place[0].n_tasks, 4);
    ck_assert_int_eq(r.place[1].n_nodes, 2);
    /* ports distinct per node */
    for (int a = 0; a < r.n_tasks; a++)
        for (int b = a + 1; b < r.n_tasks; b++)
            if (r.tasks[a].node == r.tasks[b].node) ck_assert_int_ne(r.tasks[a].port, r.tasks[b].port);
    sched_result_release(&r); free(w);
}
END_TEST

START_TEST(reasons_people_read)
{
    world *w = world_new();
    char txt[SCHED_REASON_MAX];
    sched_result r; sched_result_init(&r);
    add_job(w, 10, 0, 50, 1, 4, SCHED_GPU);
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    reason(&r, 0, txt, sizeof txt);
    ck_assert_str_eq(txt, "no nodes have joined");

    int n0 = add_node(w, 8, 4);
    add_running(w, 1, 0, 50, 0, n0, 6);
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    reason(&r, 0, txt, sizeof txt);
    ck_assert_str_eq(txt, "needs 4 gpu on one node; largest free block is 2");
    ck_assert_int_eq(r.head_job, 10);
    ck_assert_int_gt(r.out[0].est_start_ms, w->s.now_ms);

    /* a 2-gpu job that would run past the head's reservation (8 gpu now) */
    w->q[0].devices_per_worker = 8;
    add_job(w, 11, 0, 40, 1, 2, SCHED_GPU);
    w->q[1].max_runtime_s = 7200;
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    reason(&r, 1, txt, sizeof txt);
    ck_assert_str_eq(txt, "reserved for job 10");
    /* a short one ends before it: backfilled */
    w->q[1].max_runtime_s = 60;
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_eq(r.n_place, 1);
    ck_assert_int_eq(r.place[0].backfill, 1);
    ck_assert_int_eq(r.n_backfilled, 1);
    /* backfill off: waits */
    w->cfg.backfill = 0;
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_eq(r.n_place, 0);
    w->cfg.backfill = 1;

    /* quota */
    w->teams[0].quota = 8;
    w->run[0].devices = 6;
    w->q[1].workers = 1; w->q[1].devices_per_worker = 2;
    w->q[0].devices_per_worker = 4;
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    reason(&r, 0, txt, sizeof txt);
    ck_assert_str_eq(txt, "team quota 6/8; needs 4");
    w->run[0].devices = 8;
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    reason(&r, 1, txt, sizeof txt);
    ck_assert_str_eq(txt, "team quota 8/8");
    sched_result_release(&r); free(w);
}
END_TEST

START_TEST(admission_numbers)
{
    world *w = world_new();
    sched_outcome o;
    char txt[SCHED_REASON_MAX];
    sched_job j = {1, 0, 50, 2, 16, SCHED_GPU, 0, 0, 60, 0, NULL, 0, 0, 0, 0, 0, 0};
    ck_assert_int_eq(sched_admit(&w->s, &j, &o), -1);
    ck_assert_int_eq(o.why, SW_NO_NODES);
    add_node(w, 8, 4);
    add_node(w, 8, 4);
    w->nodes[1].ready = 0;                         /* registered nodes count, ready or not */
    ck_assert_int_eq(sched_admit(&w->s, &j, &o), -1);
    sched_reason_format(&o, txt, sizeof txt);
    ck_assert_str_eq(txt, "infeasible: a worker needs 16 gpu on one node; the largest node has 8");
    j.devices_per_worker = 8; j.workers = 3;
    ck_assert_int_eq(sched_admit(&w->s, &j, &o), -1);
    sched_reason_format(&o, txt, sizeof txt);
    ck_assert_str_eq(txt, "infeasible: needs 3 workers x 8 gpu; the cluster can hold 2 such workers");
    j.workers = 2;
    ck_assert_int_eq(sched_admit(&w->s, &j, &o), 0);
    j.ps = 9;
    ck_assert_int_eq(sched_admit(&w->s, &j, &o), -1);
    ck_assert_int_eq(o.why, SW_PS_INFEASIBLE);
    free(w);
}
END_TEST

/* A job with an image goes only where the agent runs podman: the gang takes
 * the podman nodes, never the larger plain one; with none ready it waits
 * with the reason; admission refuses it where no node could ever run it. */
START_TEST(image_jobs_only_where_podman_is)
{
    world *w = world_new();
    int plain = add_node(w, 8, 4);
    int pa = add_node(w, 2, 4), pb = add_node(w, 2, 4);
    w->nodes[pa].runtimes = SCHED_RT_HOST | SCHED_RT_PODMAN;
    w->nodes[pb].runtimes = SCHED_RT_HOST | SCHED_RT_PODMAN;
    int q = add_job(w, 10, 0, 50, 2, 2, SCHED_GPU);
    w->q[q].runtime = SCHED_RT_PODMAN;
    sched_result r; sched_result_init(&r);
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_eq(r.n_place, 1);
    for (int t = r.place[0].task_off; t < r.place[0].task_off + r.place[0].n_tasks; t++)
        ck_assert_int_ne(r.tasks[t].node, plain);
    sched_result_release(&r);
    /* 3 workers of 2: the podman nodes hold 2 such; the plain node does not count */
    w->q[q].workers = 3;
    sched_result_init(&r);
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_eq(r.n_place, 0);
    char txt[SCHED_REASON_MAX];
    reason(&r, q, txt, sizeof txt);
    ck_assert_str_eq(txt, "infeasible: needs 3 workers x 2 gpu; the cluster can hold 2 such workers");
    sched_result_release(&r);
    /* no ready node with podman: it waits, saying why */
    w->q[q].workers = 1;
    w->nodes[pa].ready = 0;
    w->nodes[pb].ready = 0;
    sched_result_init(&r);
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_eq(r.n_place, 0);
    reason(&r, q, txt, sizeof txt);
    ck_assert_msg(strstr(txt, "needs a node whose agent runs podman; none of the 1 ready node does") != NULL, "%s", txt);
    sched_result_release(&r);
    /* admission: a cluster without podman anywhere refuses it */
    sched_outcome o;
    sched_job j = w->q[q];
    ck_assert_int_eq(sched_admit(&w->s, &j, &o), 0);     /* registered podman nodes, not ready: it may wait */
    w->nodes[pa].runtimes = w->nodes[pb].runtimes = 0;    /* 0: the host only */
    ck_assert_int_eq(sched_admit(&w->s, &j, &o), -1);
    ck_assert_int_eq(o.why, SW_RUNTIME);
    j.runtime = 0;
    ck_assert_int_eq(sched_admit(&w->s, &j, &o), 0);
    free(w);
}
END_TEST

START_TEST(preempt_least_work_lost)
{
    world *w = world_new();
    int n0 = add_node(w, 8, 4);
    int a = add_running(w, 1, 0, 10, 1, n0, 4);
    int b = add_running(w, 2, 0, 10, 1, n0, 4);
    w->run[a].last_checkpoint_ms = w->s.now_ms - 300000;  /* 5 min lost */
    w->run[b].last_checkpoint_ms = w->s.now_ms - 10000;   /* 10 s lost */
    add_job(w, 10, 0, 90, 1, 4, SCHED_GPU);
    sched_result r; sched_result_init(&r);
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_eq(r.n_place, 0);
    ck_assert_int_eq(r.n_stops, 1);
    ck_assert_int_eq(r.stops[0].job_id, 2);
    ck_assert_int_eq(r.stops[0].for_job, 10);
    char txt[SCHED_REASON_MAX];
    reason(&r, 0, txt, sizeof txt);
    ck_assert_str_eq(txt, "waiting for 1 preempted job to stop");
    ck_assert_int_eq(r.out[0].est_start_ms, w->s.now_ms + w->cfg.preempt_grace_ms);
    /* the victim is stopping: the next pass waits, preempts nothing more */
    w->run[b].stopping = 1;
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_eq(r.n_stops, 0);
    /* same priority never preempts; non-preemptible never either */
    w->run[b].stopping = 0;
    w->q[0].priority = 10;
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_eq(r.n_stops, 0);
    w->q[0].priority = 90;
    w->run[a].preemptible = w->run[b].preemptible = 0;
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_eq(r.n_stops, 0);
    sched_result_release(&r); free(w);
}
END_TEST

/* max_interactive: a team's notebooks and shells beyond it wait, saying
 * so; its other jobs do not; jobs placed in the pass count. */
START_TEST(max_interactive_holds_the_next)
{
    world *w = world_new();
    int n0 = add_node(w, 8, 4);
    w->teams[0].limit_interactive = 1;
    w->teams[0].max_interactive = 2;
    int a = add_running(w, 1, 0, 50, 0, n0, 1);
    w->run[a].interactive = 1;
    int q1 = add_job(w, 12, 0, 50, 1, 1, SCHED_GPU); /* the oldest (add_job: queued id s ago) */
    int q2 = add_job(w, 11, 0, 50, 1, 1, SCHED_GPU);
    int q3 = add_job(w, 10, 0, 50, 1, 1, SCHED_GPU);
    w->q[q1].interactive = w->q[q2].interactive = 1;
    sched_result r; sched_result_init(&r);
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_ge(r.out[q1].place, 0);  /* the second: placed */
    ck_assert_int_lt(r.out[q2].place, 0);  /* the third waits */
    ck_assert_int_ge(r.out[q3].place, 0);  /* a job that is not interactive does not */
    char txt[SCHED_REASON_MAX];
    reason(&r, q2, txt, sizeof txt);
    ck_assert_str_eq(txt, "the team's 2 interactive jobs are running (max_interactive 2)");
    /* max 1: one running is enough; a stopping one does not count */
    w->teams[0].max_interactive = 1;
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_lt(r.out[q1].place, 0);
    reason(&r, q1, txt, sizeof txt);
    ck_assert_str_eq(txt, "the team's 1 interactive job is running (max_interactive 1)");
    w->run[a].stopping = 1;
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_ge(r.out[q1].place, 0);
    ck_assert_int_lt(r.out[q2].place, 0);
    /* no limit */
    w->run[a].stopping = 0;
    w->teams[0].limit_interactive = 0;
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_ge(r.out[q1].place, 0);
    ck_assert_int_ge(r.out[q2].place, 0);
    sched_result_release(&r); free(w);
}
END_TEST

/* Run:AI's rule: an interactive job is not preempted while its team is
 * within its guarantee (a job waiting for its devices says so); above the
 * guarantee it is preempted as any job. */
START_TEST(interactive_kept_within_guarantee)
{
    world *w = world_new();
    w->teams[0] = (sched_team){1, 1.0, 4, -1, 0, 0, 0};
    w->teams[1] = (sched_team){2, 1.0, 0, -1, 0, 0, 0};
    w->s.n_teams = 2;
    int n0 = add_node(w, 4, 4);
    int nb = add_running(w, 1, 0, 10, 1, n0, 4);   /* team 0's notebook: preemptible, low priority */
    w->run[nb].interactive = 1;
    int q = add_job(w, 10, 1, 90, 1, 4, SCHED_GPU);
    sched_result r; sched_result_init(&r);
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_eq(r.n_stops, 0);
    ck_assert_int_lt(r.out[q].place, 0);
    char txt[SCHED_REASON_MAX];
    reason(&r, q, txt, sizeof txt);
    ck_assert_str_eq(txt, "needs the devices of interactive job 1, which is not preempted while its team is "
                          "within its guarantee");
    /* not interactive: preempted by priority */
    w->run[nb].interactive = 0;
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_eq(r.n_stops, 1);
    ck_assert_int_eq(r.stops[0].job_id, 1);
    /* interactive, its team above its guarantee (2 of 4 devices guaranteed) */
    w->run[nb].interactive = 1;
    w->teams[0].guarantee = 2;
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_eq(r.n_stops, 1);
    ck_assert_int_eq(r.stops[0].job_id, 1);
    reason(&r, q, txt, sizeof txt);
    ck_assert_str_eq(txt, "waiting for 1 preempted job to stop");
    sched_result_release(&r); free(w);
}
END_TEST

START_TEST(guarantee_reclaims_borrowed)
{
    world *w = world_new();
    w->teams[0] = (sched_team){1, 1.0, 0, -1, 0, 0, 0};
    w->teams[1] = (sched_team){2, 1.0, 4, -1, 0, 0, 0};
    w->s.n_teams = 2;
    int n0 = add_node(w, 8, 4);
    add_running(w, 1, 0, 90, 0, n0, 4);            /* team 0 borrows all 8 */
    add_running(w, 2, 0, 90, 0, n0, 4);
    w->run[1].last_checkpoint_ms = w->s.now_ms - 1000;
    add_job(w, 10, 1, 10, 1, 4, SCHED_GPU);        /* team 1, low priority, within guarantee */
    add_job(w, 11, 0, 99, 1, 4, SCHED_GPU);        /* a higher priority without guarantee */
    sched_result r; sched_result_init(&r);
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_eq(r.order[0], 0);               /* guarantee first */
    ck_assert_int_eq(r.n_stops, 1);
    ck_assert_int_eq(r.stops[0].job_id, 2);
    ck_assert_int_eq(r.stops[0].guarantee, 1);
    sched_result_release(&r); free(w);
}
END_TEST

START_TEST(fair_share_orders_teams)
{
    world *w = world_new();
    w->teams[0] = (sched_team){1, 1.0, 0, -1, 0, 0, 0};
    w->teams[1] = (sched_team){2, 3.0, 0, -1, 0, 0, 0};
    w->s.n_teams = 2;
    w->cfg.usage_blend = 1.0;
    add_node(w, 8, 0);
    for (int i = 0; i < 8; i++) add_job(w, 10 + i, i < 4 ? 0 : 1, 50, 1, 1, SCHED_GPU);
    for (int i = 0; i < 8; i++) w->q[i].queued_at_ms = w->s.now_ms;
    sched_result r; sched_result_init(&r);
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_eq(r.n_place, 8);
    /* weights 1:3: of the first 4 considered, 3 are team 1's */
    int t1 = 0;
    for (int k = 0; k < 4; k++) t1 += w->q[r.order[k]].team == 1;
    ck_assert_int_eq(t1, 3);
    /* aging lifts an old low-priority job above a young higher one */
    w->cfg.aging_s = 60;
    w->s.n_queued = 2;
    w->q[0].priority = 40; w->q[0].queued_at_ms = w->s.now_ms - 3600 * 1000;
    w->q[1].priority = 50; w->q[1].queued_at_ms = w->s.now_ms;
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_eq(r.order[0], 0);
    ck_assert_int_eq(r.out[0].eff_priority, 100);
    sched_result_release(&r); free(w);
}
END_TEST

/* The level of the fair-share tree below teams: within a team (and a band
 * of equal guarantee and aged priority), the user furthest below their
 * share goes first, then that user's oldest job. One user's 200 queued jobs
 * no longer hold a colleague's one job behind them. */
START_TEST(user_share_within_team)
{
    world *w = world_new();
    add_node(w, 4, 0);
    int64_t now = w->s.now_ms;
    /* user 7 queued 200 one-gpu jobs a minute ago, then user 9 one */
    for (int i = 0; i < 200; i++) {
        int q = add_job(w, 1 + i, 0, 50, 1, 1, SCHED_GPU);
        w->q[q].queued_at_ms = now - 60000 + i;
        w->q[q].user = 7;
    }
    int b = add_job(w, 201, 0, 50, 1, 1, SCHED_GPU);
    w->q[b].queued_at_ms = now - 1000;
    w->q[b].user = 9;
    sched_result r; sched_result_init(&r);
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    /* equal shares (nothing used yet): the oldest job first (user 7's); then
     * user 7 holds a device and user 9 none: user 9's job is second */
    ck_assert_int_eq(r.order[0], 0);
    ck_assert_int_eq(r.out[b].rank, 1);
    ck_assert_int_ge(r.out[b].place, 0);
    ck_assert_int_eq(r.n_place, 4);
    /* then user 7's jobs in their own order */
    for (int k = 2; k < 201; k++) ck_assert_int_eq(r.order[k], k - 1);

    /* user 7 holds the 4 gpus: user 9's job is considered first, and is the
     * head (the next device that frees is its) */
    for (int i = 0; i < 4; i++) add_running(w, 1000 + i, 0, 50, 0, 0, 1);
    for (int i = 0; i < 4; i++) w->run[i].user = 7;
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_eq(r.order[0], b);
    ck_assert_int_eq(r.head_job, 201);
    ck_assert_int_eq(r.n_place, 0);
    /* what each user held, for the caller to bill */
    ck_assert_int_eq(r.n_user_use, 1);
    ck_assert_int_eq(r.user_use[0].user, 7);
    ck_assert_int_eq(r.user_use[0].devices, 4);
    /* one of user 7's jobs ends: the device goes to user 9 */
    w->s.n_running = 3;
    for (int d = 0; d < 4; d++)
        if (w->dev[0][SCHED_GPU][d].job_id == 1003) w->dev[0][SCHED_GPU][d].job_id = 0;
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_eq(r.n_place, 1);
    ck_assert_int_eq(r.place[0].job_id, 201);

    /* decayed usage counts too: nothing running, user 7 used 4 gpus for
     * an hour, user 9 nothing: user 9's (youngest) job goes first */
    w->s.n_running = 0;
    for (int d = 0; d < 4; d++) w->dev[0][SCHED_GPU][d].job_id = 0;
    sched_user users[2] = {{0, 7, 4 * 3600.0}, {0, 9, 0}};
    w->s.users = users; w->s.n_users = 2;
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_eq(r.order[0], b);
    /* user 9 used three times what user 7 did: keys 0.5 x in use / 4 gpus
     * + 0.5 x usage / the team's, 0.125 + 0.125 k for user 7 after k of
     * its jobs placed, 0.375 for user 9: user 7 goes first until its key
     * passes user 9's (a tie goes to the older job: user 7's) */
    users[0].usage = 3600; users[1].usage = 3 * 3600.0;
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_eq(r.out[b].rank, 3);
    ck_assert_int_ge(r.out[b].place, 0);
    w->s.n_users = 0;

    /* priority comes first: user 9's job at a lower priority waits behind
     * every job of user 7 */
    w->q[b].priority = 40;
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_eq(r.out[b].rank, 200);
    sched_result_release(&r); free(w);
}
END_TEST

/* sched_user_key: the formula docs/scheduler.md states. */
START_TEST(user_key_formula)
{
    /* half in use, half usage: 0.5 * 2/8 + 0.5 * 30/120 */
    ck_assert(fabs(sched_user_key(2, 30, 120, 8, 0.5) - 0.25) < 1e-12);
    ck_assert(fabs(sched_user_key(2, 30, 0, 8, 0.5) - 0.125) < 1e-12);   /* no usage in the team yet */
    ck_assert(fabs(sched_user_key(2, 30, 120, 0, 1.0)) < 1e-12);         /* no ready devices */
}
END_TEST

/* ================================================================ memory */

/* A full node's memory keeps a second job off it, though its devices are free. */
START_TEST(memory_blocks_second_job)
{
    world *w = world_new();
    int n0 = add_node(w, 8, 4);
    w->nodes[n0].mem_mb = 16000;
    int a = add_job(w, 10, 0, 50, 1, 2, SCHED_GPU);
    int b = add_job(w, 11, 0, 50, 1, 2, SCHED_GPU);
    w->q[a].mem_mb = 12000;
    w->q[b].mem_mb = 8000;
    w->q[a].queued_at_ms = w->s.now_ms - 100000;   /* older: considered first */
    sched_result r; sched_result_init(&r);
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_eq(r.n_place, 1);
    ck_assert_int_eq(r.out[a].place, 0);
    ck_assert_int_eq(r.tasks[0].mem_mb, 12000);
    ck_assert_int_lt(r.out[b].place, 0);
    char txt[SCHED_REASON_MAX];
    reason(&r, b, txt, sizeof txt);
    ck_assert_str_eq(txt, "needs 8000 MiB on one node for a worker; the most free on a ready node is 4000 MiB");
    /* the same once the first runs and holds its memory there */
    add_running(w, 10, 0, 50, 0, n0, 2);
    hold_mem(w, n0, 10, 12000);
    w->q[0] = w->q[1];
    w->s.n_queued = 1;
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_eq(r.n_place, 0);
    reason(&r, 0, txt, sizeof txt);
    ck_assert_str_eq(txt, "needs 8000 MiB on one node for a worker; the most free on a ready node is 4000 MiB");
    ck_assert_int_eq(r.out[0].est_start_ms, w->run[0].end_ms);   /* when the first one's memory is back */
    /* less memory: it fits beside it */
    w->q[0].mem_mb = 4000;
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_eq(r.n_place, 1);
    /* a gang: two workers of 3000 fit in 4000 free only once */
    w->q[0].mem_mb = 3000; w->q[0].workers = 2; w->q[0].devices_per_worker = 1;
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_eq(r.n_place, 0);
    reason(&r, 0, txt, sizeof txt);
    ck_assert_str_eq(txt, "needs 2 workers with 3000 MiB each; only 1 fit in the free memory now");
    /* never on any node: infeasible, not waiting */
    w->q[0].mem_mb = 20000; w->q[0].workers = 1;
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    reason(&r, 0, txt, sizeof txt);
    ck_assert_str_eq(txt, "infeasible: asks 20000 MiB per task; the largest node offers 16000 MiB");
    sched_result_release(&r); free(w);
}
END_TEST

/* Without resources.memory a task gets its node's default share:
 * memory x its devices / the node's devices of that kind. */
START_TEST(memory_default_share)
{
    world *w = world_new();
    int c = add_node(w, 0, 4);                     /* 4 cpu slots, 24000 MiB */
    w->nodes[c].mem_mb = 24000;
    int g = add_node(w, 8, 2);                     /* 8 gpus, 2 cpu slots, 80000 MiB */
    w->nodes[g].mem_mb = 80000;
    sched_job j = {1, 0, 50, 1, 2, SCHED_CPU, 0, 0, 60, 0, NULL, 0, 0, 0, 0, 0, 0};
    ck_assert_int_eq(sched_task_mem(&w->nodes[c], &j, 0), 12000);
    ck_assert_int_eq(sched_task_mem(&w->nodes[c], &j, 1), 6000);     /* a ps: one slot of four */
    j.kind = SCHED_GPU; j.devices_per_worker = 1;
    ck_assert_int_eq(sched_task_mem(&w->nodes[g], &j, 0), 10000);
    ck_assert_int_eq(sched_task_mem(&w->nodes[g], &j, 1), 40000);    /* one slot of two */
    j.mem_mb = 5000;                                                  /* the spec's wins */
    ck_assert_int_eq(sched_task_mem(&w->nodes[g], &j, 0), 5000);
    /* placed: 2 cpu workers of 2 slots fill the cpu node, each with half its memory */
    int q = add_job(w, 10, 0, 50, 2, 2, SCHED_CPU);
    sched_result r; sched_result_init(&r);
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_eq(r.out[q].place, 0);
    for (int t = 0; t < r.n_tasks; t++) {
        ck_assert_int_eq(r.tasks[t].node, c);
        ck_assert_int_eq(r.tasks[t].mem_mb, 12000);
    }
    /* a job that took most of the node's memory leaves too little for a default share */
    w->s.n_queued = 0;
    add_running(w, 7, 0, 50, 0, g, 1);
    hold_mem(w, g, 7, 75000);
    q = add_job(w, 11, 0, 50, 1, 1, SCHED_GPU);
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_eq(r.n_place, 0);
    char txt[SCHED_REASON_MAX];
    reason(&r, q, txt, sizeof txt);
    ck_assert_str_eq(txt, "needs 10000 MiB on one node for a worker; the most free on a ready node is 5000 MiB");
    sched_result_release(&r); free(w);
}
END_TEST

/* A node that reports no memory (0) places by devices alone; its tasks
 * still carry the spec's memory as their limit. */
START_TEST(memory_zero_node_ignored)
{
    world *w = world_new();
    add_node(w, 8, 4);                             /* mem_mb 0 */
    for (int i = 0; i < 4; i++) {
        int q = add_job(w, 10 + i, 0, 50, 1, 2, SCHED_GPU);
        w->q[q].mem_mb = 1 << 20;                  /* 1 TiB each */
    }
    add_job(w, 20, 0, 50, 1, 1, SCHED_CPU);        /* no memory asked: 0 */
    sched_result r; sched_result_init(&r);
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_eq(r.n_place, 5);
    for (int t = 0; t < r.n_tasks; t++)
        ck_assert_int_eq(r.tasks[t].mem_mb, r.tasks[t].kind == SCHED_GPU ? 1 << 20 : 0);
    sched_outcome o;
    ck_assert_int_eq(sched_admit(&w->s, &w->q[0], &o), 0);
    sched_result_release(&r); free(w);
}
END_TEST

/* Preemption frees memory too: stopping the job that holds devices but not
 * the memory the head needs is not enough, and is not chosen. */
START_TEST(memory_preemption_frees_memory)
{
    world *w = world_new();
    int n0 = add_node(w, 8, 4);
    w->nodes[n0].mem_mb = 32000;
    int a = add_running(w, 1, 0, 10, 1, n0, 2);    /* 2 gpus, 30000 MiB */
    int b = add_running(w, 2, 0, 10, 1, n0, 4);    /* 4 gpus, 1000 MiB */
    hold_mem(w, n0, 1, 30000);
    hold_mem(w, n0, 2, 1000);
    w->run[a].last_checkpoint_ms = w->s.now_ms - 300000;
    w->run[b].last_checkpoint_ms = w->s.now_ms - 1000;   /* least work lost: tried first */
    int h = add_job(w, 10, 0, 90, 1, 4, SCHED_GPU);
    w->q[h].mem_mb = 16000;
    sched_result r; sched_result_init(&r);
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_eq(r.n_place, 0);
    ck_assert_int_eq(r.n_stops, 1);
    ck_assert_int_eq(r.stops[0].job_id, 1);        /* its memory, and 2 + 2 gpus */
    char txt[SCHED_REASON_MAX];
    reason(&r, h, txt, sizeof txt);
    ck_assert_str_eq(txt, "waiting for 1 preempted job to stop");
    sched_result_release(&r); free(w);
}
END_TEST

/* Backfill counts memory: a short job may not take memory the head needs
 * at its reservation, though the devices would do. */
START_TEST(memory_backfill_keeps_reservation)
{
    world *w = world_new();
    int n0 = add_node(w, 8, 4);
    w->nodes[n0].mem_mb = 24000;
    add_running(w, 1, 0, 50, 0, n0, 4);
    hold_mem(w, n0, 1, 16000);                     /* free now: 4 gpus, 8000 MiB */
    int h = add_job(w, 10, 0, 60, 1, 4, SCHED_GPU);
    w->q[h].mem_mb = 17000;
    int b = add_job(w, 11, 0, 50, 1, 2, SCHED_GPU);
    w->q[b].mem_mb = 8000;
    w->q[b].max_runtime_s = 7200;                  /* runs past the head's reservation */
    w->cfg.preemption = 0;
    sched_result r; sched_result_init(&r);
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_eq(r.head_job, 10);
    ck_assert_int_eq(r.out[h].est_start_ms, w->run[0].end_ms);
    ck_assert_int_eq(r.n_place, 0);
    char txt[SCHED_REASON_MAX];
    reason(&r, b, txt, sizeof txt);
    ck_assert_str_eq(txt, "reserved for job 10");
    /* with less memory it leaves the head its 17000 at T: backfilled */
    w->q[b].mem_mb = 7000;
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    ck_assert_int_eq(r.n_place, 1);
    ck_assert_int_eq(r.place[0].backfill, 1);
    sched_result_release(&r); free(w);
}
END_TEST

START_TEST(memory_admission)
{
    world *w = world_new();
    int n0 = add_node(w, 8, 4);
    int n1 = add_node(w, 8, 4);
    w->nodes[n0].mem_mb = 24105;
    w->nodes[n1].mem_mb = 16000;
    sched_job j = {1, 0, 50, 1, 1, SCHED_GPU, 0, 0, 60, 0, NULL, 65536, 0, 0, 0, 0, 0};
    sched_outcome o;
    char txt[SCHED_REASON_MAX];
    ck_assert_int_eq(sched_admit(&w->s, &j, &o), -1);
    sched_reason_format(&o, txt, sizeof txt);
    ck_assert_str_eq(txt, "infeasible: asks 65536 MiB per task; the largest node offers 24105 MiB");
    j.mem_mb = 12000; j.workers = 4;               /* 2 fit on the first, 1 on the second */
    ck_assert_int_eq(sched_admit(&w->s, &j, &o), -1);
    sched_reason_format(&o, txt, sizeof txt);
    ck_assert_str_eq(txt, "infeasible: needs 4 workers x 1 gpu; the cluster can hold 3 such workers");
    j.workers = 3;
    ck_assert_int_eq(sched_admit(&w->s, &j, &o), 0);
    j.mem_mb = 0; j.workers = 16;                  /* default shares always fit */
    ck_assert_int_eq(sched_admit(&w->s, &j, &o), 0);
    j.mem_mb = 65536; j.workers = 1;               /* a node that reports no memory may hold it */
    w->nodes[n1].mem_mb = 0;
    ck_assert_int_eq(sched_admit(&w->s, &j, &o), 0);
    free(w);
}
END_TEST

/* ================================================================ properties */

static uint64_t g_rng;
static uint64_t rnd(void)
{
    g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17;
    return g_rng;
}
static int rint_(int lo, int hi) { return lo + (int)(rnd() % (uint64_t)(hi - lo + 1)); }

static void random_world(world *w)
{
    memset(w, 0, sizeof *w);
    sched_config_default(&w->cfg);
    w->cfg.backfill = rint_(0, 3) != 0;
    w->cfg.preemption = rint_(0, 2) != 0;
    w->cfg.aging_s = rint_(0, 1) ? 0 : 300;
    w->s.nodes = w->nodes; w->s.teams = w->teams; w->s.running = w->run; w->s.queued = w->q;
    w->s.now_ms = 2000000000;
    w->s.n_teams = rint_(1, 4);
    for (int t = 0; t < w->s.n_teams; t++)
        w->teams[t] = (sched_team){t + 1, rint_(1, 4), rint_(0, 3) ? 0 : rint_(1, 8),
                                   rint_(0, 2) ? -1 : rint_(2, 24), (double)rint_(0, 100000), 0, 0};
    int nn = rint_(0, 12);
    static const int gp[] = {0, 1, 2, 4, 8, 8};
    for (int i = 0; i < nn; i++) {
        add_node(w, gp[rint_(0, 5)], rint_(0, 6));
        if (rint_(0, 2)) w->nodes[i].mem_mb = rint_(4, 64) * 1000;
        if (rint_(0, 9) == 0) w->nodes[i].ready = 0;
        w->nodes[i].n_ports = rint_(0, 2);
        for (int p = 0; p < w->nodes[i].n_ports; p++) w->ports[i][p] = w->cfg.port_base + rint_(0, 3);
    }
    if (rint_(0, 20) == 0) w->s.n_nodes_registered = 0, w->s.n_nodes = 0;
    /* running jobs: random free devices of one kind on one node each */
    int nr = rint_(0, 10);
    for (int r = 0; r < nr && w->s.n_nodes > 0; r++) {
        int i = rint_(0, w->s.n_nodes - 1), k = rint_(0, 3) ? SCHED_GPU : SCHED_CPU;
        int want = rint_(1, 4), got = 0;
        int64_t id = 5000 + r;
        for (int d = 0; d < w->nodes[i].n_dev[k] && got < want; d++)
            if (w->dev[i][k][d].job_id == 0 && rint_(0, 1)) { w->dev[i][k][d].job_id = id; got++; }
        if (!got) continue;
        if (rint_(0, 1)) hold_mem(w, i, id, rint_(1, 24) * 1000);
        if (rint_(0, 15) == 0) hold_mem(w, i, 9999, rint_(1, 8) * 1000);   /* a holder not running */
        int x = w->s.n_running++;
        int64_t now = w->s.now_ms;
        w->run[x] = (sched_running){id, rint_(0, w->s.n_teams - 1), rint_(0, 2) * 40 + 10, rint_(0, 1),
                                    rint_(0, 5) == 0, got, now - rint_(0, 7200) * 1000,
                                    rint_(0, 1) ? now - rint_(0, 3600) * 1000 : 0,
                                    now + (int64_t)rint_(-100, 7200) * 1000, 0, 0, 0, 0, 0, 0, 0,
                                    id % 3 /* users 0-2 of the team */, 0};
    }
    int nq = rint_(0, 40);
    for (int q = 0; q < nq; q++) {
        sched_job *j = &w->q[q];
        *j = (sched_job){100 + q, rint_(0, w->s.n_teams - 1), rint_(0, 2) * 40 + 10, rint_(1, 4),
                         rint_(1, 8), rint_(0, 4) ? SCHED_GPU : SCHED_CPU, rint_(0, 5) ? 0 : rint_(1, 2),
                         w->s.now_ms - rint_(0, 36000) * 1000, rint_(60, 14400), 0, NULL, 0, 0, 0, 0,
                         q % 3 /* users 0-2 of the team */, 0};
        if (j->devices_per_worker > 3 && rint_(0, 1)) j->devices_per_worker = rint_(1, 2);
        if (rint_(0, 2) == 0) j->mem_mb = rint_(1, 40) * 1000;
        if (w->s.n_nodes > 0 && rint_(0, 6) == 0) {
            w->avoid[q][0] = w->nodes[rint_(0, w->s.n_nodes - 1)].id;
            j->avoid = w->avoid[q]; j->n_avoid = 1;
        }
        w->s.n_queued++;
    }
}

/* Can job j run with free[k][i] devices and mem[i] MiB free on every node?
 * Closed form: identical workers fit iff sum min(floor(free/w), floor(mem /
 * the worker's memory there)) >= workers (memory where the node reports
 * it); ps fill leftover slots. */
static int fits_with(const world *w, const sched_job *j, int free_[SCHED_KINDS][MAXN], const int64_t *mem)
{
    int64_t cap = 0, cpu = 0;
    for (int i = 0; i < w->s.n_nodes; i++) {
        if (!w->nodes[i].ready) continue;
        int avoided = 0;
        for (int a = 0; a < j->n_avoid; a++) avoided |= j->avoid[a] == w->nodes[i].id;
        if (avoided) continue;
        int64_t ci = free_[j->kind][i] / j->devices_per_worker;
        int64_t need = w->nodes[i].mem_mb > 0 ? sched_task_mem(&w->nodes[i], j, 0) : 0;
        if (need > 0 && (mem[i] > 0 ? mem[i] / need : 0) < ci) ci = mem[i] > 0 ? mem[i] / need : 0;
        cap += ci;
        cpu += free_[SCHED_CPU][i];
    }
    if (cap < j->workers) return 0;
    int64_t left = j->kind == SCHED_CPU ? cpu - (int64_t)j->workers * j->devices_per_worker : cpu;
    return left >= j->ps;
}

/* Earliest time the head fits, by brute force over release instants, with
 * the placements of this pass running (backfilled ones only if with_bf). */
static int64_t head_start(const world *w, const sched_result *r, int head, int with_bf)
{
    static int free_[SCHED_KINDS][MAXN];
    static int64_t mem[MAXN];
    int64_t times[MAXJ * 2 + 1];
    int nt = 0;
    int64_t now = w->s.now_ms, grace = w->cfg.preempt_grace_ms;
    times[nt++] = now;
    for (int x = 0; x < w->s.n_running; x++) {
        int stopping = w->run[x].stopping;
        for (int s = 0; s < r->n_stops; s++) stopping |= r->stops[s].running == x;
        int64_t e = stopping || w->run[x].end_ms < now + grace ? now + grace : w->run[x].end_ms;
        times[nt++] = e;
    }
    for (int p = 0; p < r->n_place; p++) times[nt++] = now + w->q[r->place[p].job].max_runtime_s * 1000;
    int64_t best = 0;
    for (int t = 0; t < nt; t++) {
        int64_t T = times[t];
        if (best && T >= best) continue;
        for (int i = 0; i < w->s.n_nodes; i++)
            for (int k = 0; k < SCHED_KINDS; k++) {
                int f = 0;
                for (int d = 0; d < w->nodes[i].n_dev[k]; d++) {
                    int64_t jid = w->dev[i][k][d].job_id;
                    if (!jid) { f++; continue; }
                    for (int x = 0; x < w->s.n_running; x++) {
                        if (w->run[x].id != jid) continue;
                        int stopping = w->run[x].stopping;
                        for (int s = 0; s < r->n_stops; s++) stopping |= r->stops[s].running == x;
                        int64_t e = stopping || w->run[x].end_ms < now + grace ? now + grace : w->run[x].end_ms;
                        if (e <= T) f++;
                    }
                }
                free_[k][i] = f;
            }
        /* memory: what holders still running at T keep (one not running keeps it for good) */
        for (int i = 0; i < w->s.n_nodes; i++) {
            mem[i] = w->nodes[i].mem_mb;
            for (int m = 0; m < w->nodes[i].n_mem; m++) {
                int64_t e = 0;
                for (int x = 0; x < w->s.n_running; x++) {
                    if (w->run[x].id != w->mem[i][m].job_id) continue;
                    int stopping = w->run[x].stopping;
                    for (int s = 0; s < r->n_stops; s++) stopping |= r->stops[s].running == x;
                    e = stopping || w->run[x].end_ms < now + grace ? now + grace : w->run[x].end_ms;
                }
                if (!e || e > T) mem[i] -= w->mem[i][m].mb;
            }
        }
        for (int p = 0; p < r->n_place; p++) {
            const sched_place *pl = &r->place[p];
            if (pl->backfill && !with_bf) continue;
            if (now + w->q[pl->job].max_runtime_s * 1000 <= T) continue;
            for (int x = pl->task_off; x < pl->task_off + pl->n_tasks; x++) {
                free_[r->tasks[x].kind][r->tasks[x].node] -= r->tasks[x].n_dev;
                if (w->nodes[r->tasks[x].node].mem_mb > 0) mem[r->tasks[x].node] -= r->tasks[x].mem_mb;
            }
        }
        if (fits_with(w, &w->q[head], free_, mem)) best = T;
    }
    return best;
}

static long g_seen_place, g_seen_backfill, g_seen_stop, g_seen_head, g_seen_mem;

/* The same pass with every node's device summary given (sched_node.sum,
 * what the mirror keeps), counted here from the devices: the decisions
 * must be the same, field by field. */
static void check_summaries_same(world *w, const sched_result *r, int iter)
{
    sched_hold *hb = xcalloc((size_t)MAXN * SCHED_KINDS * MAXD + 1, sizeof *hb);
    for (int i = 0; i < w->s.n_nodes; i++) {
        sched_node *n = &w->nodes[i];
        sched_hold *h = &hb[(size_t)i * SCHED_KINDS * MAXD];
        n->n_holds = 0;
        for (int k = 0; k < SCHED_KINDS; k++) {
            n->n_free[k] = 0;
            for (int d = 0; d < n->n_dev[k]; d++) {
                int64_t jid = n->dev[k][d].job_id;
                if (!jid) { n->n_free[k]++; continue; }
                int y = 0;
                while (y < n->n_holds && (h[y].job_id != jid || h[y].kind != k)) y++;
                if (y == n->n_holds) h[n->n_holds++] = (sched_hold){jid, k, 0};
                h[y].count++;
            }
        }
        n->holds = h;
        n->sum = 1;
    }
    sched_result r2; sched_result_init(&r2);
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r2), 0);
    for (int i = 0; i < w->s.n_nodes; i++) { w->nodes[i].sum = 0; w->nodes[i].holds = NULL; w->nodes[i].n_holds = 0; }
    free(hb);
    ck_assert_msg(r2.n_place == r->n_place && r2.n_tasks == r->n_tasks && r2.n_dev == r->n_dev &&
                  r2.n_stops == r->n_stops && r2.n_grows == r->n_grows && r2.head_job == r->head_job &&
                  r2.head_start_ms == r->head_start_ms, "iter %d: summaries change the pass", iter);
    for (int p = 0; p < r->n_place; p++)
        ck_assert(r2.place[p].job == r->place[p].job && r2.place[p].workers == r->place[p].workers &&
                  r2.place[p].backfill == r->place[p].backfill);
    for (int t = 0; t < r->n_tasks; t++)
        ck_assert(r2.tasks[t].node == r->tasks[t].node && r2.tasks[t].port == r->tasks[t].port &&
                  r2.tasks[t].n_dev == r->tasks[t].n_dev && r2.tasks[t].mem_mb == r->tasks[t].mem_mb);
    for (int d = 0; d < r->n_dev; d++) ck_assert(r2.dev_ids[d] == r->dev_ids[d]);
    for (int x = 0; x < r->n_stops; x++)
        ck_assert(r2.stops[x].job_id == r->stops[x].job_id && r2.stops[x].shrink_to == r->stops[x].shrink_to);
    for (int q = 0; q < w->s.n_queued; q++) {
        const sched_outcome *a = &r->out[q], *b = &r2.out[q];
        ck_assert(a->rank == b->rank && a->place == b->place && a->why == b->why && a->kind == b->kind &&
                  a->a == b->a && a->b == b->b && a->c == b->c && a->est_start_ms == b->est_start_ms);
    }
    sched_result_release(&r2);
}

static void check_world(world *w, int iter)
{
    sched_result r; sched_result_init(&r);
    ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
    check_summaries_same(w, &r, iter);
    g_seen_place += r.n_place; g_seen_backfill += r.n_backfilled;
    g_seen_stop += r.n_stops; g_seen_head += r.head_job != 0;
    const sched_snapshot *s = &w->s;
    /* 1. no device held twice; placed devices were free and of the right node/kind */
    for (int p = 0; p < r.n_place; p++) {
        const sched_place *pl = &r.place[p];
        const sched_job *j = &s->queued[pl->job];
        ck_assert_int_eq(r.out[pl->job].place, p);
        int nw = 0, nps = 0;
        for (int x = pl->task_off; x < pl->task_off + pl->n_tasks; x++) {
            const sched_task *t = &r.tasks[x];
            const sched_node *nd = &s->nodes[t->node];
            ck_assert_msg(nd->ready, "iter %d: task on a node that is not ready", iter);
            for (int a = 0; a < j->n_avoid; a++) ck_assert(nd->id != j->avoid[a]);
            if (t->type == 0) {
                ck_assert_int_eq(t->kind, j->kind);
                ck_assert_int_eq(t->n_dev, j->devices_per_worker);
                ck_assert_int_eq(t->index, nw);
                nw++;
            } else {
                ck_assert_int_eq(t->kind, SCHED_CPU);
                ck_assert_int_eq(t->n_dev, 1);
                ck_assert_int_eq(t->index, nps);
                nps++;
            }
            for (int p2 = 0; p2 < nd->n_ports; p2++) ck_assert_int_ne(t->port, nd->ports[p2]);
            for (int d = 0; d < t->n_dev; d++) {
                int64_t id = r.dev_ids[t->dev_off + d];
                int found = 0;
                for (int x2 = 0; x2 < nd->n_dev[t->kind]; x2++)
                    if (nd->dev[t->kind][x2].id == id) { found = 1; ck_assert_int_eq(nd->dev[t->kind][x2].job_id, 0); }
                ck_assert_msg(found, "iter %d: device %lld not on the task's node", iter, (long long)id);
            }
        }
        ck_assert_msg(nw == j->workers && nps == j->ps, "iter %d: job %lld got %d/%d workers %d/%d ps",
                      iter, (long long)j->id, nw, j->workers, nps, j->ps);
    }
    for (int a = 0; a < r.n_dev; a++)
        for (int b = a + 1; b < r.n_dev; b++)
            ck_assert_msg(r.dev_ids[a] != r.dev_ids[b], "iter %d: device held twice", iter);
    /* 1b. memory: each task carries its memory, and a node that reports memory
     * is never given more than it has free */
    for (int i = 0; i < s->n_nodes; i++) {
        int64_t used = 0, placed = 0;
        for (int m = 0; m < s->nodes[i].n_mem; m++) used += s->nodes[i].mem[m].mb;
        for (int p = 0; p < r.n_place; p++)
            for (int x = r.place[p].task_off; x < r.place[p].task_off + r.place[p].n_tasks; x++) {
                const sched_task *t = &r.tasks[x];
                if (t->node != i) continue;
                ck_assert_int_eq(t->mem_mb, sched_task_mem(&s->nodes[i], &s->queued[r.place[p].job], t->type));
                placed += t->mem_mb;
            }
        if (s->nodes[i].mem_mb > 0 && placed > 0)
            ck_assert_msg(used + placed <= s->nodes[i].mem_mb, "iter %d: node %d given %lld MiB, %lld free",
                          iter, i, (long long)placed, (long long)(s->nodes[i].mem_mb - used));
    }
    for (int a = 0; a < r.n_tasks; a++)
        for (int b = a + 1; b < r.n_tasks; b++)
            if (r.tasks[a].node == r.tasks[b].node) ck_assert_int_ne(r.tasks[a].port, r.tasks[b].port);
    /* 2. quotas: a team that got a placement is within its quota */
    for (int t = 0; t < s->n_teams; t++) {
        int64_t use = 0, placed = 0;
        for (int x = 0; x < s->n_running; x++) if (s->running[x].team == t) use += s->running[x].devices;
        for (int p = 0; p < r.n_place; p++)
            if (s->queued[r.place[p].job].team == t) placed += sched_job_devices(&s->queued[r.place[p].job]);
        if (placed && s->teams[t].quota >= 0)
            ck_assert_msg(use + placed <= s->teams[t].quota, "iter %d: team %d over quota", iter, t);
    }
    /* 3. order: (guarantee, aged priority) never increases along the order */
    int prev_g = 2, prev_e = 1 << 30, gk[MAXJ];
    for (int k = 0; k < s->n_queued; k++) {
        int q = r.order[k];
        ck_assert_int_eq(r.out[q].rank, k);
        const sched_job *j = &s->queued[q];
        int64_t use = 0;
        for (int x = 0; x < s->n_running; x++) if (s->running[x].team == j->team) use += s->running[x].devices;
        int g = use + sched_job_devices(j) <= s->teams[j->team].guarantee;
        ck_assert(g < prev_g || (g == prev_g && r.out[q].eff_priority <= prev_e));
        /* within its band, a user's jobs in a team go oldest first (then by id) */
        gk[k] = g;
        for (int k2 = k - 1; k2 >= 0; k2--) {
            const sched_job *p = &s->queued[r.order[k2]];
            if (gk[k2] != g || r.out[r.order[k2]].eff_priority != r.out[q].eff_priority) break;
            if (p->team != j->team || p->user != j->user) continue;
            ck_assert_msg(p->queued_at_ms < j->queued_at_ms || (p->queued_at_ms == j->queued_at_ms && p->id < j->id),
                          "iter %d: a band out of order", iter);
            break;
        }
        prev_g = g; prev_e = r.out[q].eff_priority;
        if (r.out[q].place < 0) {
            char txt[SCHED_REASON_MAX];
            sched_reason_format(&r.out[q], txt, sizeof txt);
            ck_assert_msg(r.out[q].why != SW_NONE && txt[0], "iter %d: job waits without reason", iter);
            g_seen_mem += r.out[q].why == SW_MEM || r.out[q].why == SW_MEM_GANG;
        }
    }
    /* 4. nobody passes the head except by backfill, and backfill never delays it */
    if (r.head_job) {
        int head = -1;
        for (int q = 0; q < s->n_queued; q++) if (s->queued[q].id == r.head_job) head = q;
        ck_assert_int_ge(head, 0);
        ck_assert_int_lt(r.out[head].place, 0);
        for (int p = 0; p < r.n_place; p++) {
            if (r.out[r.place[p].job].rank > r.out[head].rank)
                ck_assert_msg(r.place[p].backfill, "iter %d: job passed the head without backfill", iter);
            else
                ck_assert_int_eq(r.place[p].backfill, 0);
        }
        if (!w->cfg.backfill) ck_assert_int_eq(r.n_backfilled, 0);
        int64_t without = head_start(w, &r, head, 0);
        int64_t with = head_start(w, &r, head, 1);
        if (without) ck_assert_msg(with && with <= without,
                                   "iter %d: backfill delayed head %lld from %lld to %lld", iter,
                                   (long long)r.head_job, (long long)without, (long long)with);
        if (r.out[head].est_start_ms && r.n_stops == 0)
            ck_assert_int_eq(r.out[head].est_start_ms, without);
    } else {
        ck_assert_int_eq(r.n_backfilled, 0);
    }
    /* 5. victims: whole running jobs, preemptible and lower priority, or borrowed */
    for (int x = 0; x < r.n_stops; x++) {
        const sched_running *v = &s->running[r.stops[x].running];
        ck_assert_int_eq(v->stopping, 0);
        ck_assert_int_eq(r.stops[x].for_job, r.head_job);
        const sched_job *h = NULL;
        for (int q = 0; q < s->n_queued; q++) if (s->queued[q].id == r.head_job) h = &s->queued[q];
        ck_assert_ptr_nonnull(h);
        if (!r.stops[x].guarantee) ck_assert(v->preemptible && v->priority < h->priority);
        else ck_assert_int_ne(v->team, h->team);
        ck_assert_int_ne(w->cfg.preemption, 0);
    }
    sched_result_release(&r);
}

START_TEST(property_random_worlds)
{
    world *w = xmalloc(sizeof *w);
    g_rng = 0x9e3779b97f4a7c15ull ^ (uint64_t)_i;
    int n = getenv("SCHED_PROP_ITERS") ? atoi(getenv("SCHED_PROP_ITERS")) : 1000;
    for (int it = 0; it < n; it++) {
        random_world(w);
        check_world(w, it);
    }
    /* the generator must reach every rule, or the properties prove little */
    ck_assert_int_gt(g_seen_place, n);
    ck_assert_int_gt(g_seen_backfill, n / 20);
    ck_assert_int_gt(g_seen_stop, n / 50);
    ck_assert_int_gt(g_seen_head, n / 4);
    ck_assert_int_gt(g_seen_mem, n / 20);
    free(w);
}
END_TEST

/* Many passes in a row on one world: apply placements, end jobs at random;
 * devices stay consistent and every job eventually runs. */
START_TEST(property_repeated_passes)
{
    world *w = xmalloc(sizeof *w);
    g_rng = 0x1234567ull + (uint64_t)_i;
    for (int round = 0; round < 20; round++) {
        random_world(w);
        w->s.n_running = 0;
        for (int i = 0; i < w->s.n_nodes; i++) {
            w->nodes[i].n_mem = 0;
            for (int k = 0; k < SCHED_KINDS; k++)
                for (int d = 0; d < w->nodes[i].n_dev[k]; d++) w->dev[i][k][d].job_id = 0;
        }
        sched_result r; sched_result_init(&r);
        for (int step = 0; step < 60; step++) {
            check_world(w, step);
            ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
            for (int p = 0; p < r.n_place; p++) {
                const sched_place *pl = &r.place[p];
                sched_job j = w->q[pl->job];
                for (int x = pl->task_off; x < pl->task_off + pl->n_tasks; x++) {
                    const sched_task *t = &r.tasks[x];
                    if (t->mem_mb > 0) hold_mem(w, t->node, j.id, t->mem_mb);
                    for (int d = 0; d < t->n_dev; d++)
                        for (int x2 = 0; x2 < w->nodes[t->node].n_dev[t->kind]; x2++)
                            if (w->dev[t->node][t->kind][x2].id == r.dev_ids[t->dev_off + d])
                                w->dev[t->node][t->kind][x2].job_id = j.id;
                }
                w->run[w->s.n_running++] = (sched_running){j.id, j.team, j.priority, 1, 0,
                    sched_job_devices(&j), w->s.now_ms, 0, w->s.now_ms + j.max_runtime_s * 1000,
                    0, 0, 0, 0, 0, 0, 0, j.user, 0};
            }
            /* drop placed jobs from the queue (keeping id order) */
            int nq = 0;
            for (int q = 0; q < w->s.n_queued; q++)
                if (r.out[q].place < 0) { w->q[nq] = w->q[q]; nq++; }
            w->s.n_queued = nq;
            /* stops take effect, and jobs past their end finish */
            for (int x = 0; x < r.n_stops; x++) w->run[r.stops[x].running].stopping = 1;
            w->s.now_ms += 600 * 1000;
            int nr = 0;
            for (int x = 0; x < w->s.n_running; x++) {
                sched_running *v = &w->run[x];
                if (v->end_ms <= w->s.now_ms || v->stopping) {
                    drop_mem(w, v->id);
                    for (int i = 0; i < w->s.n_nodes; i++)
                        for (int k = 0; k < SCHED_KINDS; k++)
                            for (int d = 0; d < w->nodes[i].n_dev[k]; d++)
                                if (w->dev[i][k][d].job_id == v->id) w->dev[i][k][d].job_id = 0;
                    continue;
                }
                w->run[nr++] = *v;
            }
            w->s.n_running = nr;
        }
        /* nothing left feasible should still wait when the cluster is idle */
        if (w->s.n_running == 0 && w->s.n_queued > 0) {
            ck_assert_int_eq(sched_pass_core(&w->s, &w->cfg, &r), 0);
            for (int q = 0; q < w->s.n_queued; q++) {
                int why = r.out[q].why;
                /* memory: infeasible, or a ps that the workers' memory kept out */
                ck_assert_msg(r.out[q].place >= 0 || why == SW_QUOTA || why == SW_WIDE || why == SW_LARGE ||
                              why == SW_PS_INFEASIBLE || why == SW_NO_NODES || why == SW_MEM_WIDE ||
                              (why == SW_MEM && r.out[q].c == 1),
                              "job waits on an idle cluster: why %d", why);
            }
        }
        sched_result_release(&r);
    }
    free(w);
}
END_TEST

/* A pass on a big cluster stays fast (the simulator measures it properly). */
START_TEST(pass_is_fast)
{
    int nn = 1000, nq = 10000;
    sched_node *nodes = xcalloc((size_t)nn, sizeof *nodes);
    sched_device *dev = xcalloc((size_t)nn * 8, sizeof *dev);
    for (int i = 0; i < nn; i++) {
        nodes[i].id = i + 1; nodes[i].ready = 1;
        nodes[i].n_dev[SCHED_GPU] = 8; nodes[i].dev[SCHED_GPU] = &dev[i * 8];
        for (int d = 0; d < 8; d++) dev[i * 8 + d].id = i * 8 + d + 1;
    }
    sched_team teams[4];
    for (int t = 0; t < 4; t++) teams[t] = (sched_team){t + 1, t + 1, 0, -1, 0, 0, 0};
    sched_job *q = xcalloc((size_t)nq, sizeof *q);
    g_rng = 77;
    static const int wd[] = {1, 2, 4, 8};
    for (int i = 0; i < nq; i++)
        q[i] = (sched_job){i + 1, rint_(0, 3), 50, rint_(1, 4), wd[rint_(0, 3)], SCHED_GPU, 0, i, 3600, 0, NULL, 0, 0, 0, 0, 0, 0};
    sched_snapshot s = {1000000, nn, nn, nodes, 4, teams, 0, NULL, nq, q, 0, NULL};
    sched_config cfg; sched_config_default(&cfg);
    sched_result r; sched_result_init(&r);
    double t0 = mono_s();
    ck_assert_int_eq(sched_pass_core(&s, &cfg, &r), 0);
    double ms = (mono_s() - t0) * 1000;
    ck_assert_int_gt(r.n_place, 100);
    ck_assert_msg(ms < 2000, "pass took %.1f ms", ms);   /* generous: ASan, shared cores */
    sched_result_release(&r);
    free(nodes); free(dev); free(q);
}
END_TEST


/* ================================================================ SQLite pass */

static char g_dir[256], g_path[512];
static db *g_db;


/* A statement of the test's own (sql: a string constant, db_prepare keeps
 * it by its address). */
static db_stmt *prep(const char *sql)
{
    db_stmt *st = db_prepare(g_db, sql);
    ck_assert_msg(st != NULL, "%s: %s", sql, db_errmsg(g_db));
    return st;
}

/* what db_wake_node told (the server wakes those agents' long-polls) */
static int64_t g_woken[64];
static int g_nwoken;
static void record_wakes(void *cls, const int64_t *nodes, int n) {
    (void)cls;
    for (int i = 0; i < n && g_nwoken < 64; i++) g_woken[g_nwoken++] = nodes[i];
}

static void db_setup(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/ty_sched_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(g_dir));
    if (ty_pg_url()) ty_pg_new_db(g_path, sizeof g_path);
    else snprintf(g_path, sizeof g_path, "%s/t.db", g_dir);
    ty_db_open_leading(&g_db, g_path);
    log_set_level(LOG_ERROR);
}

static void db_teardown(void)
{
    sched_fault_after(0);
    db_close(g_db);
    g_db = NULL;
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* sql's one ?, when it has one, is a. */
static long q1(const char *sql, int64_t a)
{
    db_stmt *st = prep(sql);
    if (strchr(sql, '?')) ck_assert_int_eq(db_bind_int64(st, 1, a), 0);
    ck_assert_msg(db_step(st) == DB_ROW, "%s: %s", sql, db_errmsg(g_db));
    long n = (long)db_col_int64(st, 0);
    db_done(st);
    return n;
}

static void qtext(const char *sql, int64_t a, char *out, size_t cap)
{
    db_stmt *st = prep(sql);
    ck_assert_int_eq(db_bind_int64(st, 1, a), 0);
    ck_assert_msg(db_step(st) == DB_ROW, "%s: %s", sql, db_errmsg(g_db));
    const char *t = db_col_text(st, 0);
    snprintf(out, cap, "%s", t ? t : "");
    db_done(st);
}

/* A savepoint's text, or a write whose one ?, when it has one, is a. */
static void exec_sql(const char *sql, int64_t a)
{
    if (!strchr(sql, '?')) {
        ck_assert_msg(db_exec(g_db, sql) == 0, "%s: %s", sql, db_errmsg(g_db));
        return;
    }
    db_stmt *st = prep(sql);
    ck_assert_int_eq(db_bind_int64(st, 1, a), 0);
    ck_assert_msg(db_step(st) == DB_DONE, "%s: %s", sql, db_errmsg(g_db));
    db_done(st);
}

static int64_t team(const char *name, int quota)
{
    int64_t id = 0;
    if (store_team_find(g_db, name, &id) != STORE_OK)
        ck_assert_int_eq(store_team_create(g_db, name, &id), STORE_OK);
    if (quota >= 0) ck_assert_int_eq(cluster_team_set_shares(g_db, name, 0, 0, 0, quota, 1), 0);
    return id;
}

static int64_t node(const char *host, int gpus, int cpus, int64_t now)
{
    int idx[16];
    for (int i = 0; i < gpus; i++) idx[i] = i;
    int64_t id = 0;
    int created = 0;
    ck_assert_int_eq(cluster_node_upsert(g_db, host, "10.0.0.1", cpus, gpus, idx, NULL, NULL, 0, NULL, now, &id, &created), 0);
    return id;
}

static int64_t job(int64_t team_id, int prio, int workers, int dpw, const char *device, int ps,
                   int max_restarts, int preemptible)
{
    static const char sql[] =
        "INSERT INTO jobs(team_id, name, spec, state, priority, attempt, max_restarts, workers,"
        " devices_per_worker, device, ps, max_runtime_s, preemptible, created_at, updated_at, queued_at)"
        " VALUES(?, 'j', '{}', 'queued', ?, 0, ?, ?, ?, ?, ?, 3600, ?, ?, ?, ?) RETURNING id";
    db_stmt *st = prep(sql);
    int64_t now = now_ms();
    db_bind_int64(st, 1, team_id);
    db_bind_int(st, 2, prio);
    db_bind_int(st, 3, max_restarts);
    db_bind_int(st, 4, workers);
    db_bind_int(st, 5, dpw);
    db_bind_text(st, 6, device, -1);
    db_bind_int(st, 7, ps);
    db_bind_int(st, 8, preemptible);
    db_bind_int64(st, 9, now);
    db_bind_int64(st, 10, now);
    db_bind_int64(st, 11, now);
    ck_assert_msg(db_step(st) == DB_ROW, "%s", db_errmsg(g_db));
    int64_t id = db_col_int64(st, 0);
    ck_assert_int_eq(db_step(st), DB_DONE); /* the write completes (the change log sees it) */
    db_done(st);
    return id;
}

/* A job's events as one text (for the asserts' messages). */
static const char SQL_EVENTS_TEXT[] =
    "SELECT group_concat(kind || ': ' || coalesce(reason, ''), ' | ') FROM job_events WHERE job_id = ?";
static const char SQL_EVENTS_TEXT_PG[] =
    "SELECT string_agg(kind || ': ' || coalesce(reason, ''), ' | ' ORDER BY id) FROM job_events WHERE job_id = $1";

static void state_of(int64_t id, char *out, size_t cap)
{
    qtext("SELECT state FROM jobs WHERE id = ?", id, out, cap);
}

/* Invariants a user would check in the database after any pass. */
static void check_db(void)
{
    /* an allocation's device is on its task's node, of the right kind */
    ck_assert_int_eq(q1("SELECT count(*) FROM allocations a JOIN tasks t ON t.id = a.task_id"
                        " JOIN devices d ON d.id = a.device_id JOIN jobs j ON j.id = a.job_id"
                        " WHERE d.node_id != t.node_id OR t.job_id != a.job_id"
                        " OR d.kind != CASE WHEN t.type = 'ps' THEN 'cpu' ELSE j.device END", 0), 0);
    /* all or nothing: every job holding anything in its current attempt holds its whole gang */
    ck_assert_int_eq(q1("SELECT count(*) FROM jobs j WHERE EXISTS(SELECT 1 FROM tasks t WHERE t.job_id = j.id"
                        " AND t.attempt = j.attempt AND t.state IN ('assigned','running'))"
                        " AND ((SELECT count(*) FROM tasks t WHERE t.job_id = j.id AND t.attempt = j.attempt"
                        "       AND t.type = 'worker') != j.workers"
                        "   OR (SELECT count(*) FROM tasks t WHERE t.job_id = j.id AND t.attempt = j.attempt"
                        "       AND t.type = 'ps') != j.ps"
                        "   OR (SELECT count(*) FROM allocations a JOIN tasks t ON t.id = a.task_id"
                        "       WHERE t.job_id = j.id AND t.attempt = j.attempt)"
                        "      != j.workers * j.devices_per_worker + j.ps)", 0), 0);
    /* a queued job holds nothing; a starting job holds its gang, unless its
     * attempt was stopped (preempted before its tasks started: they were
     * dropped, the next upkeep requeues it) */
    ck_assert_int_eq(q1("SELECT count(*) FROM allocations a JOIN jobs j ON j.id = a.job_id"
                        " WHERE j.state = 'queued'", 0), 0);
    ck_assert_int_eq(q1("SELECT count(*) FROM jobs j WHERE j.state = 'starting' AND"
                        " (SELECT count(*) FROM allocations a WHERE a.job_id = j.id)"
                        "  != j.workers * j.devices_per_worker + j.ps"
                        " AND NOT EXISTS(SELECT 1 FROM tasks t WHERE t.job_id = j.id AND t.attempt = j.attempt"
                        "                AND t.state IN ('stopping','exited'))", 0), 0);
    /* ports unique per node among live tasks */
    ck_assert_int_eq(q1("SELECT count(*) FROM (SELECT node_id, port FROM tasks WHERE state != 'exited'"
                        " AND type != 'evaluator' GROUP BY node_id, port HAVING count(*) > 1) AS dup", 0), 0);
    /* an evaluator holds no device, and no job has two in one attempt */
    ck_assert_int_eq(q1("SELECT count(*) FROM allocations a JOIN tasks t ON t.id = a.task_id"
                        " WHERE t.type = 'evaluator'", 0), 0);
    ck_assert_int_eq(q1("SELECT count(*) FROM (SELECT 1 FROM tasks WHERE type = 'evaluator'"
                        " GROUP BY job_id, attempt HAVING count(*) > 1) AS dup", 0), 0);
    /* memory: a node that reports memory holds at most that much for its live tasks */
    ck_assert_int_eq(q1("SELECT count(*) FROM nodes n WHERE n.memory_mb > 0 AND n.memory_mb <"
                        " (SELECT coalesce(sum(t.memory_mb), 0) FROM tasks t WHERE t.node_id = n.id"
                        "  AND (t.id IN (SELECT task_id FROM allocations)"
                        "       OR (t.type = 'evaluator' AND t.state != 'exited')))", 0), 0);
    /* quotas */
    ck_assert_int_eq(q1("SELECT count(*) FROM teams tm WHERE tm.quota IS NOT NULL AND tm.quota <"
                        " (SELECT coalesce(sum(j.workers * j.devices_per_worker), 0) FROM jobs j"
                        "  WHERE j.team_id = tm.id AND j.state IN ('starting','running'))", 0), 0);
}

/* After a pass that committed: every queued job says why it waits. */
static void check_reasons(void)
{
    ck_assert_int_eq(q1("SELECT count(*) FROM jobs WHERE state = 'queued' AND (reason IS NULL OR reason = '')", 0), 0);
}

START_TEST(db_pass_places_gangs)
{
    int64_t now = now_ms();
    sched_config cfg; sched_config_default(&cfg);
    int64_t t = team("default", -1);
    int64_t j0 = job(t, 50, 2, 2, "gpu", 1, 3, 0);
    sched_pass_stats st;
    ck_assert_int_eq(sched_pass(g_db, &cfg, now, &st), 0);
    char txt[256];
    qtext("SELECT reason FROM jobs WHERE id = ?", j0, txt, sizeof txt);
    ck_assert_str_eq(txt, "no nodes have joined");
    char msg[256];
    sched_job spec = {.workers = 2, .devices_per_worker = 16, .kind = SCHED_GPU};
    ck_assert_int_eq(sched_admit_job(g_db, &spec, msg, sizeof msg), 0);   /* queues until nodes join */

    node("n1", 4, 2, now);
    node("n2", 4, 2, now);
    ck_assert_int_eq(sched_admit_job(g_db, &spec, msg, sizeof msg), 1);
    ck_assert_str_eq(msg, "infeasible: a worker needs 16 gpu on one node; the largest node has 4");
    spec.devices_per_worker = 2;
    ck_assert_int_eq(sched_admit_job(g_db, &spec, msg, sizeof msg), 0);

    int64_t j1 = job(t, 50, 1, 4, "gpu", 0, 3, 0);
    int64_t j2 = job(t, 40, 1, 1, "cpu", 0, 3, 0);
    g_nwoken = 0;
    db_set_wake_hook(g_db, record_wakes, NULL);
    ck_assert_int_eq(sched_pass(g_db, &cfg, now + 1000, &st), 0);
    ck_assert_int_eq(st.placed, 3);
    /* the agents to wake, told after the commit: exactly the nodes given tasks, each once */
    ck_assert_int_eq(g_nwoken, q1("SELECT count(DISTINCT node_id) FROM tasks", 0));
    for (int i = 0; i < g_nwoken; i++) {
        ck_assert_int_eq(q1("SELECT count(*) FROM tasks WHERE node_id = ?", g_woken[i]) > 0, 1);
        for (int k = 0; k < i; k++) ck_assert_int_ne(g_woken[k], g_woken[i]);
    }
    /* a stop wakes the nodes of the job's tasks, after its commit; a rollback wakes nobody */
    g_nwoken = 0;
    ck_assert_int_eq(db_begin(g_db), 0);
    ck_assert_int_eq(store_job_stop_tasks(g_db, j2, "test"), STORE_OK);
    ck_assert_int_eq(g_nwoken, 0);
    db_rollback(g_db);
    ck_assert_int_eq(g_nwoken, 0);
    ck_assert_int_eq(q1("SELECT count(*) FROM tasks WHERE job_id = ? AND state = 'stopping'", j2), 0);
    state_of(j0, txt, sizeof txt); ck_assert_str_eq(txt, "starting");
    state_of(j1, txt, sizeof txt); ck_assert_str_eq(txt, "starting");
    state_of(j2, txt, sizeof txt); ck_assert_str_eq(txt, "starting");
    ck_assert_int_eq(q1("SELECT attempt FROM jobs WHERE id = ?", j0), 1);
    ck_assert_int_eq(q1("SELECT count(*) FROM tasks WHERE job_id = ?", j0), 3);
    ck_assert_int_eq(q1("SELECT count(*) FROM allocations WHERE job_id = ?", j0), 5);
    ck_assert_int_eq(q1("SELECT count(DISTINCT node_id) FROM tasks WHERE job_id = ? AND type = 'worker'", j0), 1);
    ck_assert_int_eq(q1("SELECT count(*) FROM job_events WHERE job_id = ? AND actor = 'scheduler'"
                        " AND to_state = 'starting' AND reason LIKE 'placed on n%'", j0), 1);
    /* the next job waits with the reason people read */
    int64_t j3 = job(t, 50, 1, 4, "gpu", 0, 3, 0);
    ck_assert_int_eq(sched_pass(g_db, &cfg, now + 2000, &st), 0);
    ck_assert_int_eq(st.placed, 0);
    ck_assert_int_eq(g_nwoken, 0); /* nobody to wake */
    db_set_wake_hook(g_db, NULL, NULL);
    qtext("SELECT reason FROM jobs WHERE id = ?", j3, txt, sizeof txt);
    ck_assert_str_eq(txt, "needs 4 gpu on one node; largest free block is 0");
    sched_queue_entry *qv = NULL; int nq = 0;
    ck_assert_int_eq(sched_queue_view(g_db, &cfg, now + 2000, &qv, &nq), 0);
    ck_assert_int_eq(nq, 1);
    ck_assert_int_eq(qv[0].job_id, j3);
    ck_assert_int_gt(qv[0].est_start_ms, now);
    free(qv);
    check_db();
    check_reasons();
    /* a committed stop wakes each node with a task of the job, once */
    g_nwoken = 0;
    db_set_wake_hook(g_db, record_wakes, NULL);
    ck_assert_int_eq(db_begin(g_db), 0);
    ck_assert_int_eq(store_job_stop_tasks(g_db, j0, "test"), STORE_OK);
    ck_assert_int_eq(g_nwoken, 0);
    ck_assert_int_eq(db_commit(g_db), 0);
    db_set_wake_hook(g_db, NULL, NULL);
    ck_assert_int_eq(g_nwoken, 1);
    ck_assert_int_eq(g_woken[0], q1("SELECT node_id FROM tasks WHERE job_id = ? LIMIT 1", j0));
}
END_TEST

/* Memory through the SQLite pass: each task records its memory (the
 * spec's, or its node's default share), a second job waits on the memory
 * the first holds and starts once the first's tasks exit. */
START_TEST(db_memory_placement)
{
    int64_t now = now_ms();
    sched_config cfg; sched_config_default(&cfg);
    int64_t t = team("default", -1);
    int idx[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    int64_t nid = 0;
    ck_assert_int_eq(cluster_node_upsert(g_db, "m1", "10.0.0.9", 4, 8, idx, NULL, NULL, 32000,
                                         "{\"mode\":\"user\"}", now, &nid, NULL), 0);
    int64_t a = job(t, 60, 1, 2, "gpu", 0, 3, 0);
    exec_sql("UPDATE jobs SET memory_mb = 20000 WHERE id = ?", a);
    int64_t b = job(t, 50, 1, 1, "cpu", 0, 3, 0);                /* default share: 32000 / 4 slots */
    int64_t c = job(t, 40, 1, 2, "gpu", 0, 3, 0);
    exec_sql("UPDATE jobs SET memory_mb = 6000 WHERE id = ?", c);
    sched_pass_stats st;
    ck_assert_int_eq(sched_pass(g_db, &cfg, now + 1000, &st), 0);
    ck_assert_int_eq(st.placed, 2);
    ck_assert_int_eq(q1("SELECT memory_mb FROM tasks WHERE job_id = ?", a), 20000);
    ck_assert_int_eq(q1("SELECT memory_mb FROM tasks WHERE job_id = ?", b), 8000);
    char txt[256];
    qtext("SELECT reason FROM jobs WHERE id = ?", c, txt, sizeof txt);
    ck_assert_str_eq(txt, "needs 6000 MiB on one node for a worker; the most free on a ready node is 4000 MiB");
    check_db();
    /* the first job ends: its memory is free again, the third starts */
    exec_sql("UPDATE tasks SET state = 'exited' WHERE job_id = ?", a);
    exec_sql("UPDATE jobs SET state = 'succeeded' WHERE id = ?", a);
    ck_assert_int_eq(sched_pass(g_db, &cfg, now + 2000, &st), 0);
    state_of(c, txt, sizeof txt);
    ck_assert_str_eq(txt, "starting");
    ck_assert_int_eq(q1("SELECT memory_mb FROM tasks WHERE job_id = ?", c), 6000);
    check_db();
}
END_TEST

/* The evaluator's node (pure): the chief's node when it has the memory, else
 * the ready node with the most free memory; the default share of one CPU
 * slot; nothing when no node has room. */
START_TEST(evaluator_node_choice)
{
    sched_eval_node n[4] = {
        {1, 1, 4, 8000, 6000},     /* chief's node: 2000 free; default share 8000/4 = 2000 */
        {2, 1, 2, 16000, 0},       /* most free, share 8000 */
        {3, 0, 8, 64000, 0},       /* not ready */
        {4, 1, 2, 0, 0},           /* memory not reported: holds any, counts as most free */
    };
    sched_eval_want w = {7, 0, 1, 0, NULL};
    int64_t mem = -1;
    ck_assert_int_eq(sched_place_evaluator(n, 4, &w, &mem), 0);
    ck_assert_int_eq(mem, 2000);
    ck_assert_int_eq(n[0].used_mb, 8000);
    /* the chief's node is full now: the node with the most free memory */
    ck_assert_int_eq(sched_place_evaluator(n, 4, &w, &mem), 3);
    ck_assert_int_eq(mem, 0);
    int64_t avoid[1] = {4};
    sched_eval_want w2 = {8, 3000, 1, 1, avoid};  /* resources.memory 3000 MiB */
    ck_assert_int_eq(sched_place_evaluator(n, 4, &w2, &mem), 1);
    ck_assert_int_eq(mem, 3000);
    ck_assert_int_eq(n[1].used_mb, 3000);
    sched_eval_want w3 = {9, 14000, 0, 1, avoid};  /* no ready node has 14000 MiB free */
    ck_assert_int_eq(sched_place_evaluator(n, 4, &w3, &mem), -1);
    ck_assert_int_eq(n[1].used_mb, 3000);
}
END_TEST

/* The evaluator beside the gang, on SQLite: placed after the gang with no
 * device, its memory counted on its node; a gang with no room for it starts
 * anyway and gets it when room appears; its failure is an event that costs
 * the job nothing; a new attempt gets a new one. */
START_TEST(db_evaluator_placement)
{
    int64_t now = now_ms();
    sched_config cfg; sched_config_default(&cfg);
    int64_t t = team("default", -1);
    int64_t m1 = 0, m2 = 0, m3 = 0;
    ck_assert_int_eq(cluster_node_upsert(g_db, "m1", "10.0.0.1", 2, 0, NULL, NULL, NULL, 4096, NULL, now, &m1, NULL), 0);
    int64_t a = job(t, 60, 1, 1, "cpu", 0, 3, 0);
    exec_sql("UPDATE jobs SET spec = '{\"resources\":{\"evaluator\":true}}' WHERE id = ?", a);
    ck_assert_int_eq(sched_pass(g_db, &cfg, now + 10, NULL), 0);
    check_db();
    char txt[1024];
    state_of(a, txt, sizeof txt);
    ck_assert_str_eq(txt, "starting");
    ck_assert_int_eq(q1("SELECT count(*) FROM tasks WHERE job_id = ? AND type = 'evaluator' AND idx = 0"
                        " AND attempt = 1 AND port = 0 AND state = 'assigned'", a), 1);
    ck_assert_int_eq(q1("SELECT memory_mb FROM tasks WHERE job_id = ? AND type = 'evaluator'", a), 2048);
    ck_assert_int_eq(q1("SELECT count(*) FROM allocations WHERE job_id = ?", a), 1);  /* the worker's slot only */
    qtext(db_sql(g_db, SQL_EVENTS_TEXT, SQL_EVENTS_TEXT_PG), a, txt, sizeof txt);
    ck_assert_msg(strstr(txt, "evaluator: evaluator placed on m1 (attempt 1)") != NULL, "%s", txt);
    /* the gang runs without waiting for its evaluator to start */
    int64_t w0 = q1("SELECT id FROM tasks WHERE job_id = ? AND type = 'worker'", a);
    int64_t ev = q1("SELECT id FROM tasks WHERE job_id = ? AND type = 'evaluator'", a);
    int flags = 0;
    ck_assert_int_eq(lifecycle_task_running(g_db, w0, NULL, "agent", &flags), STORE_OK);
    state_of(a, txt, sizeof txt);
    ck_assert_str_eq(txt, "running");
    ck_assert_int_eq(lifecycle_task_running(g_db, ev, NULL, "agent", &flags), STORE_OK);
    /* the evaluator's memory is counted: a second job's worker (2048 MiB) waits */
    int64_t b = job(t, 50, 1, 1, "cpu", 0, 3, 0);
    ck_assert_int_eq(sched_pass(g_db, &cfg, now + 20, NULL), 0);
    state_of(b, txt, sizeof txt);
    ck_assert_str_eq(txt, "queued");
    qtext("SELECT reason FROM jobs WHERE id = ?", b, txt, sizeof txt);
    ck_assert_msg(strstr(txt, "2048 MiB") != NULL, "%s", txt);
    /* the evaluator fails: an event; the job runs on, no restart counted, no new evaluator */
    lifecycle_exit e = {137, 9, "killed", NULL};
    ck_assert_int_eq(lifecycle_task_exited(g_db, ev, &e, "agent", &flags), STORE_OK);
    qtext(db_sql(g_db, SQL_EVENTS_TEXT, SQL_EVENTS_TEXT_PG), a, txt, sizeof txt);
    ck_assert_msg(q1("SELECT state = 'running' FROM jobs WHERE id = ?", a), "%s", txt);
    ck_assert_int_eq(q1("SELECT failures FROM jobs WHERE id = ?", a), 0);
    ck_assert_int_eq(q1("SELECT count(*) FROM tasks WHERE job_id = ? AND state = 'running'", a), 1);
    ck_assert_int_eq(q1("SELECT count(*) FROM job_events WHERE job_id = ? AND kind = 'evaluator'"
                        " AND reason LIKE 'evaluator failed: evaluator-0 was killed by signal 9%'", a), 1);
    ck_assert_int_eq(sched_pass(g_db, &cfg, now + 30, NULL), 0);
    check_db();
    ck_assert_int_eq(q1("SELECT count(*) FROM tasks WHERE job_id = ? AND type = 'evaluator'", a), 1);
    state_of(b, txt, sizeof txt);          /* its memory is free again: b starts */
    ck_assert_str_eq(txt, "starting");
    /* no room for the evaluator: the gang starts anyway, the evaluator follows when a node joins */
    ck_assert_int_eq(cluster_node_upsert(g_db, "m2", "10.0.0.2", 1, 0, NULL, NULL, NULL, 1000, NULL, now, &m2, NULL), 0);
    int64_t c = job(t, 50, 1, 1, "cpu", 0, 3, 0);
    exec_sql("UPDATE jobs SET spec = '{\"resources\":{\"evaluator\":true}}' WHERE id = ?", c);
    ck_assert_int_eq(sched_pass(g_db, &cfg, now + 40, NULL), 0);
    check_db();
    state_of(c, txt, sizeof txt);
    ck_assert_str_eq(txt, "starting");
    ck_assert_int_eq(q1("SELECT node_id FROM tasks WHERE job_id = ? AND type = 'worker'", c), m2);
    ck_assert_int_eq(q1("SELECT count(*) FROM tasks WHERE job_id = ? AND type = 'evaluator'", c), 0);
    ck_assert_int_eq(sched_pass(g_db, &cfg, now + 45, NULL), 0);   /* said once, not every pass */
    ck_assert_int_eq(q1("SELECT count(*) FROM job_events WHERE job_id = ? AND kind = 'evaluator' AND reason ="
                        " 'evaluator waits: 1000 MiB for it on m2, and no ready node has that free;"
                        " the gang runs without it (attempt 1)'", c), 1);
    ck_assert_int_eq(cluster_node_upsert(g_db, "m3", "10.0.0.3", 2, 0, NULL, NULL, NULL, 8000, NULL, now + 50, &m3, NULL), 0);
    ck_assert_int_eq(sched_pass(g_db, &cfg, now + 50, NULL), 0);
    check_db();
    ck_assert_int_eq(q1("SELECT node_id FROM tasks WHERE job_id = ? AND type = 'evaluator'", c), m3);
    ck_assert_int_eq(q1("SELECT memory_mb FROM tasks WHERE job_id = ? AND type = 'evaluator'", c), 4000);
    /* a new attempt of a gets a new evaluator */
    lifecycle_exit bad = {1, 0, "boom", NULL};
    ck_assert_int_eq(lifecycle_task_exited(g_db, w0, &bad, "agent", &flags), STORE_OK);
    state_of(a, txt, sizeof txt);
    ck_assert_str_eq(txt, "queued");
    ck_assert_int_eq(q1("SELECT failures FROM jobs WHERE id = ?", a), 1);

    ck_assert_int_eq(sched_pass(g_db, &cfg, now + 60, NULL), 0);
    check_db();
    state_of(a, txt, sizeof txt);
    ck_assert_str_eq(txt, "starting");
    ck_assert_int_eq(q1("SELECT count(*) FROM tasks WHERE job_id = ? AND type = 'evaluator' AND attempt = 2", a), 1);
}
END_TEST

/* Heartbeats for every ready node except those in `silent`. */
static void beat_all(int64_t now, const int64_t *silent, int ns)
{
    db_stmt *st = prep("SELECT id FROM nodes ORDER BY id");
    int64_t ids[64]; int n = 0;
    while (n < 64 && db_step(st) == DB_ROW) ids[n++] = db_col_int64(st, 0);
    db_done(st);
    for (int i = 0; i < n; i++) {
        int skip = 0;
        for (int k = 0; k < ns; k++) skip |= silent[k] == ids[i];
        if (!skip) ck_assert_int_eq(cluster_node_heartbeat(g_db, ids[i], now), 0);
    }
}

START_TEST(db_lost_node_requeue_and_restarts)
{
    int64_t now = now_ms();
    sched_config cfg; sched_config_default(&cfg);
    int64_t t = team("default", -1);
    int64_t a = node("a", 2, 1, now), b = node("b", 8, 1, now);
    int64_t j = job(t, 50, 1, 2, "gpu", 0, 2, 0);
    ck_assert_int_eq(sched_pass(g_db, &cfg, now, NULL), 0);
    ck_assert_int_eq(q1("SELECT node_id FROM tasks WHERE job_id = ?", j), a);   /* best fit */
    exec_sql("UPDATE tasks SET state = 'running' WHERE job_id = ?", j);
    exec_sql("UPDATE jobs SET state = 'running' WHERE id = ?", j);
    char txt[512];
    for (int round = 1; round <= 3; round++) {
        /* a goes silent: lost; the job is requeued (or failed past its budget) */
        now += 40000;
        beat_all(now, &a, 1);
        sched_pass_stats st;
        ck_assert_int_eq(sched_pass(g_db, &cfg, now, &st), 0);
        check_db();
        ck_assert_int_eq(st.lost_nodes, 1);
        ck_assert_int_eq(q1("SELECT count FROM node_failures WHERE job_id = ? AND node_id = " "(SELECT id FROM nodes WHERE hostname = 'a')", j), round);
        state_of(j, txt, sizeof txt);
        if (round <= 2) {
            /* requeued and placed again in the same pass; avoid a after two failures */
            ck_assert_str_eq(txt, "starting");
            ck_assert_int_ge(q1("SELECT attempt FROM jobs WHERE id = ?", j), round + 1);
            ck_assert_int_eq(q1("SELECT node_id FROM tasks WHERE job_id = ?1 AND attempt = "
                                "(SELECT attempt FROM jobs WHERE id = ?1)", j), b);
            ck_assert_int_eq(q1("SELECT count(*) FROM job_events WHERE job_id = ? AND to_state = 'queued'"
                                " AND reason LIKE 'node % lost%requeued%'", j), round);
            /* a comes back; the job is moved to a again for the next round */
            beat_all(now + 1, NULL, 0);
            ck_assert_str_eq(txt, "starting");
            exec_sql("UPDATE tasks SET state = 'exited' WHERE job_id = ?", j);
            exec_sql("UPDATE jobs SET state = 'queued', reason = 'x' WHERE id = ?", j);
            ck_assert_int_eq(sched_pass(g_db, &cfg, now + 2, NULL), 0);
            if (round == 1) {
                ck_assert_int_eq(q1("SELECT node_id FROM tasks WHERE job_id = ?1 AND attempt = "
                                    "(SELECT attempt FROM jobs WHERE id = ?1)", j), a);
            } else {
                /* failed twice on a: avoided */
                ck_assert_int_eq(q1("SELECT node_id FROM tasks WHERE job_id = ?1 AND attempt = "
                                    "(SELECT attempt FROM jobs WHERE id = ?1)", j), b);
                /* force it onto a by filling b, to lose it a third time */
                exec_sql("UPDATE tasks SET state = 'exited' WHERE job_id = ?", j);
                exec_sql("UPDATE jobs SET state = 'queued', reason = 'x' WHERE id = ?", j);
                exec_sql("DELETE FROM node_failures WHERE job_id = ?", j);
                exec_sql("INSERT INTO node_failures(job_id, node_id, count) VALUES(?, (SELECT id FROM nodes"
                         " WHERE hostname = 'b'), 2)", j);
                /* node_failures has no rowid: its writers note it (storage/db.h), as this stand-in must */
                db_change_note(g_db, DB_CH_AVOID, j);
                ck_assert_int_eq(sched_pass(g_db, &cfg, now + 3, NULL), 0);
                ck_assert_int_eq(q1("SELECT node_id FROM tasks WHERE job_id = ?1 AND attempt = "
                                    "(SELECT attempt FROM jobs WHERE id = ?1)", j), a);
                /* back to the true history: two failures, both on a */
                exec_sql("DELETE FROM node_failures WHERE job_id = ?", j);
                exec_sql("INSERT INTO node_failures(job_id, node_id, count) VALUES(?, (SELECT id FROM nodes"
                         " WHERE hostname = 'a'), 2)", j);
                db_change_note(g_db, DB_CH_AVOID, j);
            }
            exec_sql("UPDATE jobs SET state = 'running' WHERE id = ?", j);
        } else {
            /* failures: a 1 + b 1 + a 1 = 3 > max_restarts 2 */
            ck_assert_str_eq(txt, "failed");
            qtext("SELECT reason FROM jobs WHERE id = ?", j, txt, sizeof txt);
            ck_assert_msg(strstr(txt, "restart budget spent (max_restarts 2)"), "%s", txt);
        }
    }
    ck_assert_int_eq(q1("SELECT count(*) FROM allocations WHERE job_id = ?", j), 0);
}
END_TEST

/* One restart budget, whatever failed: max_restarts 1 allows one failure
 * (here a worker exiting 1), and the next (a lost node) ends the job. */
START_TEST(db_one_restart_budget)
{
    int64_t now = now_ms();
    sched_config cfg; sched_config_default(&cfg);
    int64_t t = team("default", -1);
    int64_t a = node("a", 2, 1, now);
    int64_t j = job(t, 50, 1, 1, "gpu", 0, 1, 0);
    char txt[512];
    ck_assert_int_eq(sched_pass(g_db, &cfg, now, NULL), 0);
    exec_sql("UPDATE tasks SET state = 'running' WHERE job_id = ?", j);
    exec_sql("UPDATE jobs SET state = 'running' WHERE id = ?", j);
    /* 1: the worker fails: requeued, restart 1 of 1 */
    int64_t task = q1("SELECT id FROM tasks WHERE job_id = ?1 AND attempt = (SELECT attempt FROM jobs WHERE id = ?1)", j);
    lifecycle_exit e = {1, 0, "boom", NULL};
    int flags = 0;
    ck_assert_int_eq(lifecycle_task_exited(g_db, task, &e, "agent", &flags), STORE_OK);
    state_of(j, txt, sizeof txt);
    ck_assert_str_eq(txt, "queued");
    qtext("SELECT reason FROM jobs WHERE id = ?", j, txt, sizeof txt);
    ck_assert_msg(strstr(txt, "requeued (restart 1 of 1)"), "%s", txt);
    /* placed again */
    now += 1000;
    beat_all(now, NULL, 0);
    ck_assert_int_eq(sched_pass(g_db, &cfg, now, NULL), 0);
    state_of(j, txt, sizeof txt);
    ck_assert_str_eq(txt, "starting");
    exec_sql("UPDATE tasks SET state = 'running' WHERE job_id = ?", j);
    exec_sql("UPDATE jobs SET state = 'running' WHERE id = ?", j);
    ck_assert_int_eq(q1("SELECT failures FROM jobs WHERE id = ?", j), 1);
    /* 2: node a is lost: the budget is spent, the job fails */
    now += 40000;
    beat_all(now, &a, 1);
    ck_assert_int_eq(sched_pass(g_db, &cfg, now, NULL), 0);
    state_of(j, txt, sizeof txt);
    ck_assert_str_eq(txt, "failed");
    qtext("SELECT reason FROM jobs WHERE id = ?", j, txt, sizeof txt);
    ck_assert_msg(strstr(txt, "lost") && strstr(txt, "restart budget spent (max_restarts 1)"), "%s", txt);
    ck_assert_int_eq(q1("SELECT failures FROM jobs WHERE id = ?", j), 2);
}
END_TEST

START_TEST(db_preempt_then_requeue)
{
    int64_t now = now_ms();
    sched_config cfg; sched_config_default(&cfg);
    int64_t t = team("default", -1);
    node("a", 4, 1, now);
    int64_t low = job(t, 10, 1, 4, "gpu", 0, 3, 1);
    ck_assert_int_eq(sched_pass(g_db, &cfg, now, NULL), 0);
    exec_sql("UPDATE jobs SET state = 'running' WHERE id = ?", low);
    exec_sql("UPDATE tasks SET state = 'running', token_hash = 'handed-out' WHERE job_id = ?", low);
    int64_t high = job(t, 90, 1, 4, "gpu", 0, 3, 0);
    sched_pass_stats st;
    ck_assert_int_eq(sched_pass(g_db, &cfg, now + 1000, &st), 0);
    ck_assert_int_eq(st.stopped, 1);
    char txt[256];
    qtext("SELECT reason FROM jobs WHERE id = ?", high, txt, sizeof txt);
    ck_assert_str_eq(txt, "waiting for 1 preempted job to stop");
    ck_assert_int_eq(q1("SELECT count(*) FROM tasks WHERE job_id = ? AND state = 'stopping'"
                        " AND reason LIKE 'preempted for job %'", low), 1);
    ck_assert_int_eq(q1("SELECT count(*) FROM allocations WHERE job_id = ?", low), 4);  /* held until exit */
    /* the tasks exit: the victim is requeued and the high job placed */
    exec_sql("UPDATE tasks SET state = 'exited' WHERE job_id = ?", low);
    ck_assert_int_eq(sched_pass(g_db, &cfg, now + 2000, &st), 0);
    state_of(low, txt, sizeof txt); ck_assert_str_eq(txt, "queued");
    state_of(high, txt, sizeof txt); ck_assert_str_eq(txt, "starting");
    ck_assert_int_eq(st.requeued, 1);
    check_db();
}
END_TEST

static int64_t person(const char *name)
{
    db_stmt *st = prep("INSERT INTO users(name, source, created_at) VALUES(?, 'admin', 0) RETURNING id");
    db_bind_text(st, 1, name, -1);
    ck_assert_msg(db_step(st) == DB_ROW, "%s", db_errmsg(g_db));
    int64_t id = db_col_int64(st, 0);
    ck_assert_int_eq(db_step(st), DB_DONE); /* the write completes (the change log sees it) */
    db_done(st);
    return id;
}

static void job_user(int64_t job_id, int64_t user_id)
{
    db_stmt *st = prep("UPDATE jobs SET user_id = ?2 WHERE id = ?1");
    db_bind_int64(st, 1, job_id);
    db_bind_int64(st, 2, user_id);
    ck_assert_msg(db_step(st) == DB_DONE, "%s", db_errmsg(g_db));
    db_done(st);
}

/* A job's tasks ended and it succeeded (what the task API writes). */
static void job_ends(int64_t id)
{
    exec_sql("UPDATE tasks SET state = 'exited' WHERE job_id = ?", id);
    exec_sql("UPDATE jobs SET state = 'succeeded' WHERE id = ?", id);
}

/* Fair share within a team on a real database file: one team, 4 gpus. A
 * queues 200 one-gpu jobs, the first pass runs 4 of them; then B queues
 * one. B's job is first in the queue at once (the head: the next gpu that
 * frees is its), and when one of A's jobs ends the next pass places B's,
 * not A's fifth. Each user's usage is kept in user_usage and read back by
 * a new mirror (a restarted server). */
START_TEST(db_user_share_within_team)
{
    int64_t now = now_ms();
    sched_config cfg; sched_config_default(&cfg);
    int64_t t = team("default", -1);
    int64_t a = person("ann"), b = person("bob");
    node("n1", 4, 0, now);
    int64_t ja[200];
    ck_assert_int_eq(db_begin(g_db), 0);
    for (int i = 0; i < 200; i++) { ja[i] = job(t, 50, 1, 1, "gpu", 0, 0, 0); job_user(ja[i], a); }
    ck_assert_int_eq(db_commit(g_db), 0);
    sched_pass_stats st;
    ck_assert_int_eq(sched_pass(g_db, &cfg, now, &st), 0);
    ck_assert_int_eq(st.placed, 4);
    for (int i = 0; i < 4; i++) exec_sql("UPDATE jobs SET state = 'running' WHERE id = ?", ja[i]);
    int64_t jb = job(t, 50, 1, 1, "gpu", 0, 0, 0);
    job_user(jb, b);
    ck_assert_int_eq(sched_pass(g_db, &cfg, now + 2000, &st), 0);
    ck_assert_int_eq(st.placed, 0);
    sched_queue_entry *e = NULL;
    int n = 0;
    ck_assert_int_eq(sched_queue_view(g_db, &cfg, now + 2500, &e, &n), 0);
    ck_assert_int_eq(n, 197);
    ck_assert_int_eq(e[0].job_id, jb);          /* first in the queue, behind nobody */
    ck_assert_int_gt(e[0].est_start_ms, 0);     /* the head: it holds the reservation */
    ck_assert_int_eq(e[1].job_id, ja[4]);
    free(e);
    /* A has been billed for its 4 gpus, B for nothing yet */
    ck_assert_int_eq(q1("SELECT count(*) FROM user_usage WHERE user_id = ?", a), 1);
    ck_assert_int_eq(q1("SELECT count(*) FROM user_usage WHERE user_id = ?", b), 0);
    ck_assert_int_gt(q1("SELECT CAST(usage * 1000 AS INTEGER) FROM user_usage WHERE user_id = ?", a), 0);
    /* one of A's jobs ends: the freed gpu is B's */
    job_ends(ja[0]);
    ck_assert_int_eq(sched_pass(g_db, &cfg, now + 3000, &st), 0);
    ck_assert_int_eq(st.placed, 1);
    char txt[64];
    state_of(jb, txt, sizeof txt); ck_assert_str_eq(txt, "starting");
    state_of(ja[4], txt, sizeof txt); ck_assert_str_eq(txt, "queued");
    check_db();

    /* a restart keeps the users' usage: A ran 3 gpus for an hour more, every
     * job ended; a new process's mirror orders a new job of B's before an
     * older one of A's */
    beat_all(now + 3600 * 1000, NULL, 0);   /* (so the node is not lost meanwhile) */
    ck_assert_int_eq(sched_pass(g_db, &cfg, now + 3600 * 1000, &st), 0);
    job_ends(ja[1]); job_ends(ja[2]); job_ends(ja[3]); job_ends(jb);
    exec_sql("UPDATE jobs SET state = 'cancelled' WHERE state = 'queued' AND id > ?", 0);
    ck_assert_int_eq(sched_pass(g_db, &cfg, now + 3600 * 1000 + 1000, &st), 0);
    double ua = 0;
    {
        db_stmt *q = prep("SELECT usage FROM user_usage WHERE user_id = ?");
        db_bind_int64(q, 1, a);
        ck_assert_int_eq(db_step(q), DB_ROW);
        ua = db_col_double(q, 0);
        db_done(q);
    }
    /* 3-4 gpus over an hour with a 1 h time constant: about 3 x 3600 x (1 - 1/e) */
    ck_assert_msg(ua > 5000 && ua < 10000, "usage %f", ua);
    db_close(g_db);
    ty_db_open_leading(&g_db, g_path);
    int64_t old_a = job(t, 50, 1, 1, "gpu", 0, 0, 0);
    job_user(old_a, a);
    int64_t new_b = job(t, 50, 1, 1, "gpu", 0, 0, 0);
    job_user(new_b, b);
    ck_assert_int_eq(sched_queue_view(g_db, &cfg, now + 3600 * 1000 + 2000, &e, &n), 0);
    ck_assert_int_eq(n, 2);
    ck_assert_int_eq(e[0].job_id, new_b);
    free(e);
}
END_TEST

/* Random clusters through the real SQLite pass, with random faults: after
 * every pass, successful or rolled back, the invariants hold. */
static int mirror_matches(mirror *m);

/* async: each pass's decisions are committed by its binding thread
 * (sched_pass_async, the server's form) while the world moves on this
 * thread, on its own connection; the binding is waited for before the
 * checks. */
static void property_random_with_faults(int seed, int async)
{
    g_rng = 0xabcdefull + (uint64_t)seed;
    int64_t now = now_ms();
    sched_config cfg; sched_config_default(&cfg);
    cfg.backfill = rint_(0, 1);
    int64_t teams[3];
    teams[0] = team("default", -1);
    teams[1] = team("t1", rint_(2, 8));
    teams[2] = team("t2", -1);
    int nn = rint_(1, 5);
    char host[32];
    for (int i = 0; i < nn; i++) {
        snprintf(host, sizeof host, "n%d", i);
        node(host, rint_(0, 8), rint_(0, 4), now);
    }
    int nj = rint_(5, 25);
    for (int x = 0; x < nj; x++)
        job(teams[rint_(0, 2)], rint_(0, 2) * 40 + 10, rint_(1, 3), rint_(1, 4), rint_(0, 3) ? "gpu" : "cpu",
            rint_(0, 4) ? 0 : 1, rint_(0, 2), rint_(0, 1));
    int faults = 0;
    for (int pass = 0; pass < 12; pass++) {
        now += 5000;
        beat_all(now, NULL, 0);
        long allocs_before = q1("SELECT count(*) FROM allocations", 0);
        long starting_before = q1("SELECT count(*) FROM jobs WHERE state = 'starting'", 0);
        int fault = rint_(0, 2) == 0 ? rint_(1, 12) : 0;
        sched_fault_after(fault);
        sched_pass_stats st;
        int rc = async ? sched_pass_async(g_db, &cfg, now, &st, NULL, NULL) : sched_pass(g_db, &cfg, now, &st);
        if (!async) {
            sched_fault_after(0);
            check_db();
            if (rc == 0) check_reasons();
        }
        if (rc != 0) {
            faults++;
            /* rolled back whole: nothing placed by that pass */
            ck_assert_int_le(q1("SELECT count(*) FROM allocations", 0), allocs_before);
            ck_assert_int_le(q1("SELECT count(*) FROM jobs WHERE state = 'starting'", 0), starting_before);
        }
        /* the world moves: some jobs run and end, some are cancelled (with
         * async, while the pass's binding commits) */
        db_stmt *s2 = prep("SELECT id, state FROM jobs WHERE state IN ('starting','running','queued') ORDER BY id");
        int64_t ids[64]; int states[64]; int n = 0;
        while (n < 64 && db_step(s2) == DB_ROW) {
            ids[n] = db_col_int64(s2, 0);
            states[n++] = db_col_text(s2, 1)[0];
        }
        db_done(s2);
        for (int x = 0; x < n; x++) {
            int r = rint_(0, 5);
            if (states[x] == 's' && r < 3) {
                exec_sql("UPDATE jobs SET state = 'running' WHERE id = ?", ids[x]);
                exec_sql("UPDATE tasks SET state = 'running' WHERE job_id = ? AND state = 'assigned'", ids[x]);
            } else if (states[x] == 'r' && r == 0) {
                exec_sql("UPDATE tasks SET state = 'exited' WHERE job_id = ?", ids[x]);
                exec_sql("UPDATE jobs SET state = 'succeeded' WHERE id = ?", ids[x]);
            } else if (states[x] == 'q' && r == 0) {
                exec_sql("UPDATE jobs SET state = 'cancelled' WHERE id = ?", ids[x]);
            }
        }
        if (async && rc == 0) {
            sched_pass_stats b;
            int brc = sched_bind_wait(g_db, &b);
            ck_assert_int_ne(brc, 1); /* a binding was there to wait for */
            ck_assert_int_eq(sched_bind_wait(g_db, NULL), 1); /* and only one */
            sched_fault_after(0);
            check_db();
            if (brc == 0) {
                ck_assert_int_le(b.placed + b.conflicts, st.decided);
                ck_assert_double_ge(b.bound_ms, st.load_ms + st.core_ms);
            } else {
                faults++;
            }
        }
        sched_fault_after(0);
    }
    ck_assert_int_le(faults, 12);
    if (async) {
        /* the passes' mirror, followed through the bindings, equals a fresh load */
        mirror *pm = db_cache(g_db, DB_CACHE_MIRROR, NULL, NULL);
        ck_assert_ptr_nonnull(pm);
        mirror_matches(pm);
    }
}

START_TEST(db_property_random_with_faults)
{
    property_random_with_faults(_i, 0);
}
END_TEST

START_TEST(db_property_async_binding)
{
    property_random_with_faults(_i, 1);
}
END_TEST


/* ================================================================ the mirror */

/* The mirror's rows equal a fresh cluster_load, field by field, but for
 * nodes' last_heartbeat_at (heartbeats are not followed) and the avoid rows
 * of jobs the state does not hold. */
static void same_state(const cluster_state *a, const cluster_state *b)
{
    ck_assert_int_eq(a->n_nodes, b->n_nodes);
    for (int i = 0; i < a->n_nodes; i++) {
        const cl_node *x = &a->nodes[i], *y = &b->nodes[i];
        ck_assert_int_eq(x->id, y->id);
        ck_assert_str_eq(x->hostname, y->hostname);
        ck_assert_str_eq(x->address, y->address);
        ck_assert_int_eq(x->cpu_slots, y->cpu_slots);
        ck_assert_str_eq(x->state, y->state);
        ck_assert_int_eq(x->registered_at, y->registered_at);
        ck_assert_int_eq(x->memory_mb, y->memory_mb);
        ck_assert_int_eq(!x->isolation, !y->isolation);
        if (x->isolation) ck_assert_str_eq(x->isolation, y->isolation);
    }
    ck_assert_int_eq(a->n_devices, b->n_devices);
    for (int i = 0; i < a->n_devices; i++) {
        const cl_device *x = &a->devices[i], *y = &b->devices[i];
        ck_assert_int_eq(x->id, y->id);
        ck_assert_int_eq(x->node_id, y->node_id);
        ck_assert_int_eq(x->kind, y->kind);
        ck_assert_int_eq(x->idx, y->idx);
        ck_assert_str_eq(x->model, y->model);
        ck_assert_int_eq(x->memory_mb, y->memory_mb);
        ck_assert_int_eq(x->job_id, y->job_id);
        ck_assert_int_eq(x->task_id, y->task_id);
    }
    ck_assert_int_eq(a->n_ports, b->n_ports);
    for (int i = 0; i < a->n_ports; i++) {
        ck_assert_int_eq(a->ports[i].node_id, b->ports[i].node_id);
        ck_assert_int_eq(a->ports[i].port, b->ports[i].port);
    }
    ck_assert_int_eq(a->n_mem, b->n_mem);
    for (int i = 0; i < a->n_mem; i++) {
        ck_assert_int_eq(a->mem[i].node_id, b->mem[i].node_id);
        ck_assert_int_eq(a->mem[i].job_id, b->mem[i].job_id);
        ck_assert_int_eq(a->mem[i].mb, b->mem[i].mb);
    }
    ck_assert_int_eq(a->n_teams, b->n_teams);
    for (int i = 0; i < a->n_teams; i++) {
        const cl_team *x = &a->teams[i], *y = &b->teams[i];
        ck_assert_int_eq(x->id, y->id);
        ck_assert_str_eq(x->name, y->name);
        ck_assert(x->weight == y->weight);
        ck_assert_int_eq(x->guarantee, y->guarantee);
        ck_assert_int_eq(x->quota, y->quota);
        ck_assert_int_eq(x->max_interactive, y->max_interactive);
        ck_assert(x->usage == y->usage);
        ck_assert_int_eq(x->usage_at, y->usage_at);
    }
    ck_assert_int_eq(a->n_uusage, b->n_uusage);
    for (int i = 0; i < a->n_uusage; i++) {
        const cl_user_usage *x = &a->uusage[i], *y = &b->uusage[i];
        ck_assert_int_eq(x->team_id, y->team_id);
        ck_assert_int_eq(x->user_id, y->user_id);
        ck_assert(x->usage == y->usage);
        ck_assert_int_eq(x->usage_at, y->usage_at);
    }
    ck_assert_int_eq(a->n_jobs, b->n_jobs);
    for (int i = 0; i < a->n_jobs; i++) {
        const cl_job *x = &a->jobs[i], *y = &b->jobs[i];
        ck_assert_int_eq(x->id, y->id);
        ck_assert_int_eq(x->user_id, y->user_id);
        ck_assert_int_eq(x->interactive, y->interactive);
        ck_assert_int_eq(x->team_id, y->team_id);
        ck_assert_str_eq(x->state, y->state);
        ck_assert_int_eq(x->priority, y->priority);
        ck_assert_int_eq(x->workers, y->workers);
        ck_assert_int_eq(x->devices_per_worker, y->devices_per_worker);
        ck_assert_int_eq(x->kind, y->kind);
        ck_assert_int_eq(x->ps, y->ps);
        ck_assert_int_eq(x->preemptible, y->preemptible);
        ck_assert_int_eq(x->queue_if_infeasible, y->queue_if_infeasible);
        ck_assert_int_eq(x->attempt, y->attempt);
        ck_assert_int_eq(x->max_restarts, y->max_restarts);
        ck_assert_int_eq(x->max_runtime_s, y->max_runtime_s);
        ck_assert_int_eq(x->queued_at, y->queued_at);
        ck_assert_int_eq(x->last_checkpoint_at, y->last_checkpoint_at);
        ck_assert_int_eq(x->attempt_started_at, y->attempt_started_at);
        ck_assert_int_eq(x->memory_mb, y->memory_mb);
        ck_assert_int_eq(x->stopping, y->stopping);
        ck_assert_str_eq(x->reason, y->reason);
    }
    /* avoid rows of the jobs held, in order */
    int k = 0;
    for (int i = 0; i < b->n_avoid; i++) {
        int held = 0;
        for (int x = 0; x < b->n_jobs && !held; x++) held = b->jobs[x].id == b->avoid[i].job_id;
        if (!held) continue;
        ck_assert_int_lt(k, a->n_avoid);
        ck_assert_int_eq(a->avoid[k].job_id, b->avoid[i].job_id);
        ck_assert_int_eq(a->avoid[k].node_id, b->avoid[i].node_id);
        k++;
    }
    ck_assert_int_eq(k, a->n_avoid);
}

/* Refreshes m and compares it with a fresh load; returns whether the
 * refresh read only what changed. */
static int mirror_matches(mirror *m)
{
    mirror_stats ms;
    ck_assert_int_eq(mirror_refresh(m, g_db, &ms), 0);
    cluster_state a, b;
    mirror_export(m, &a);
    ck_assert_int_eq(cluster_load(g_db, &b), 0);
    same_state(&a, &b);
    cluster_state_release(&a);
    cluster_state_release(&b);
    /* each node's device summary (what the core reads instead of every
     * device) says what its devices say */
    for (int i = 0; i < m->n_nodes; i++) {
        const mirror_node *n = &m->nodes[i];
        int fr[SCHED_KINDS] = {0}, held = 0;
        for (int x = 0; x < n->n_dev; x++) {
            ck_assert_int_eq(n->sdev[x].job_id, n->dev[x].job_id);
            if (!n->dev[x].job_id) { fr[n->dev[x].kind]++; continue; }
            int y = 0;
            while (y < n->n_holds && (n->holds[y].job_id != n->dev[x].job_id || n->holds[y].kind != n->dev[x].kind)) y++;
            ck_assert_msg(y < n->n_holds, "node %lld: a holder not in its summary", (long long)n->row.id);
            held++;
        }
        int sum = 0;
        for (int y = 0; y < n->n_holds; y++) sum += n->holds[y].count;
        ck_assert_int_eq(sum, held);
        for (int k = 0; k < SCHED_KINDS; k++) ck_assert_int_eq(n->n_free[k], fr[k]);
    }
    return !ms.full;
}

static const char *const FROM_LIVE[] = {"queued", "starting", "running", NULL};

/* Random writes through the storage functions the server uses (nodes
 * joining, re-registering with other devices, draining, going lost and
 * coming back; jobs submitted, placed, started, ending, cancelled,
 * preempted, failing on a node; teams and their shares), and the pass
 * itself; after each step the mirror equals a fresh cluster_load. */
START_TEST(db_mirror_follows_sqlite)
{
    g_rng = 0x5eed00ull + (uint64_t)_i;
    int64_t now = now_ms();
    sched_config cfg; sched_config_default(&cfg);
    cfg.heartbeat_timeout_ms = 30000;
    mirror *m = mirror_new();
    int64_t teams[3] = {team("default", -1), team("t1", -1), team("t2", 4)};
    ck_assert(mirror_matches(m) == 0); /* the first refresh loads everything */
    int incremental = 0, steps = 0;
    for (int step = 0; step < 120; step++) {
        now += 1000;
        char host[32];
        int op = rint_(0, 13);
        /* mostly a job holding tasks: their changes are the ones the job's row derives from */
        int64_t some_job = q1(rint_(0, 2) ? "SELECT coalesce((SELECT id FROM jobs WHERE state IN ('starting','running')"
                                            " ORDER BY random() LIMIT 1), 0)"
                                          : "SELECT coalesce((SELECT id FROM jobs ORDER BY random() LIMIT 1), 0)", 0);
        int64_t some_node = q1("SELECT coalesce((SELECT id FROM nodes ORDER BY random() LIMIT 1), 0)", 0);
        switch (op) {
        case 0: { /* a node joins or re-registers with other devices, memory, isolation */
            snprintf(host, sizeof host, "n%d", rint_(0, 6));
            int idx[8], ng = rint_(0, 8);
            for (int g = 0; g < ng; g++) idx[g] = g;
            ck_assert_int_eq(cluster_node_upsert(g_db, host, "10.0.0.2", rint_(0, 4), ng, idx, NULL, NULL,
                                                 rint_(0, 1) * 16000, rint_(0, 1) ? "{\"mode\":\"none\"}" : NULL,
                                                 now, NULL, NULL), 0);
            break;
        }
        case 1: /* heartbeats: a lost node comes back */
            if (some_node) ck_assert_int_eq(cluster_node_heartbeat(g_db, some_node, now), 0);
            break;
        case 2:
            if (some_node) ck_assert_int_ge(cluster_node_drain(g_db, some_node, rint_(0, 1), NULL), 0);
            break;
        case 3: { /* nodes silent for long are lost */
            if (some_node) ck_assert_int_eq(cluster_node_heartbeat(g_db, some_node, now - 100000), 0);
            int64_t *ids = NULL;
            ck_assert_int_ge(cluster_nodes_mark_lost(g_db, now - 50000, &ids), 0);
            free(ids);
            break;
        }
        case 4: case 5: /* submissions */
            job(teams[rint_(0, 2)], rint_(0, 2) * 40 + 10, rint_(1, 3), rint_(1, 4), rint_(0, 3) ? "gpu" : "cpu",
                rint_(0, 4) ? 0 : 1, rint_(0, 2), rint_(0, 1));
            break;
        case 6: case 7: { /* the pass: upkeep, placements, reasons, usage */
            sched_pass_stats st;
            ck_assert_int_eq(sched_pass(g_db, &cfg, now, &st), 0);
            break;
        }
        case 8: /* tasks start or exit */
            if (some_job) {
                exec_sql(rint_(0, 1) ? "UPDATE tasks SET state = 'running' WHERE job_id = ? AND state = 'assigned'"
                                     : "UPDATE tasks SET state = 'exited' WHERE job_id = ?", some_job);
                if (rint_(0, 1)) ck_assert_int_ge(cluster_release_exited(g_db), 0);
            }
            break;
        case 9: /* cancel, or a stop (tasks stopping) */
            if (some_job && rint_(0, 1)) store_job_transition(g_db, some_job, FROM_LIVE, "cancelled", "test", "test");
            else if (some_job) { /* started tasks asked to stop: only tasks rows change */
                exec_sql("UPDATE tasks SET state = 'running', token_hash = 'started' WHERE job_id = ?"
                         " AND state = 'assigned'", some_job);
                incremental += mirror_matches(m);
                steps++;
                ck_assert_int_eq(lifecycle_stop_tasks(g_db, some_job, "preempted for a test"), STORE_OK);
            }
            break;
        case 10: /* a node failed a job (twice: avoided) */
            if (some_job && some_node) {
                ck_assert_int_eq(cluster_failure_add(g_db, some_job, some_node), 0);
                ck_assert_int_eq(cluster_failure_add(g_db, some_job, some_node), 0);
            }
            break;
        case 11: /* team shares and a new team */
            if (rint_(0, 3) == 0) {
                snprintf(host, sizeof host, "team%d", step);
                team(host, -1);
            } else {
                ck_assert_int_eq(cluster_team_set_shares(g_db, "t1", rint_(1, 4), rint_(0, 4), 1, rint_(4, 16), 1), 0);
            }
            break;
        case 12:
            if (some_job) ck_assert_int_eq(cluster_job_set_reason(g_db, some_job, "a reason of a test"), 0);
            break;
        case 13: /* a job starts running; a checkpoint */
            if (some_job) {
                exec_sql("UPDATE jobs SET state = 'running' WHERE id = ? AND state = 'starting'", some_job);
                exec_sql("UPDATE jobs SET last_checkpoint_at = 12345 WHERE id = ?", some_job);
            }
            break;
        }
        if (rint_(0, 2) == 0) continue; /* several steps between refreshes too */
        incremental += mirror_matches(m);
        steps++;
    }
    incremental += mirror_matches(m);
    steps++;
    /* the refreshes were incremental (a full reload would pass trivially) */
    ck_assert_int_ge(incremental, steps - 3);
    ck_assert_int_gt(q1("SELECT count(*) FROM allocations", 0) + q1("SELECT count(*) FROM tasks", 0), 0);
    mirror_free(m);
}
END_TEST

/* A change rolled back, whole or to a savepoint, never shows in the mirror,
 * and nothing of it is published; what commits beside it does. */
START_TEST(db_mirror_rollback_invisible)
{
    int64_t now = now_ms();
    int64_t t = team("default", -1);
    node("n1", 4, 2, now);
    int64_t j1 = job(t, 50, 1, 1, "gpu", 0, 0, 0), j2 = job(t, 50, 1, 1, "gpu", 0, 0, 0);
    mirror *m = mirror_new();
    mirror_matches(m);
    uint64_t from = db_changes_head(g_db);
    /* a transaction rolled back */
    ck_assert_int_eq(db_begin(g_db), 0);
    ck_assert_int_eq(store_job_transition(g_db, j1, FROM_LIVE, "cancelled", "test", "rolled back"), STORE_OK);
    ck_assert_int_eq(cluster_node_drain(g_db, q1("SELECT id FROM nodes", 0), 1, NULL), 0);
    db_rollback(g_db);
    /* a savepoint rolled back inside a transaction that commits */
    ck_assert_int_eq(db_begin(g_db), 0);
    exec_sql("SAVEPOINT sp", 0);
    size_t mark = db_changes_mark(g_db);
    ck_assert_int_eq(store_job_transition(g_db, j1, FROM_LIVE, "cancelled", "test", "rolled back"), STORE_OK);
    exec_sql("ROLLBACK TO sp", 0);
    db_changes_rewind(g_db, mark);
    exec_sql("RELEASE sp", 0);
    ck_assert_int_eq(cluster_job_set_reason(g_db, j2, "committed"), 0);
    ck_assert_int_eq(db_commit(g_db), 0);
    db_change *ch = NULL;
    size_t n = 0;
    ck_assert_int_eq(db_changes_read(g_db, &from, &ch, &n), 0);
    ck_assert_int_eq(n, 1);
    ck_assert_int_eq(ch[0].table, DB_CH_JOB);
    ck_assert_int_eq(ch[0].id, j2);
    free(ch);
    ck_assert(mirror_matches(m));
    cluster_state a;
    mirror_export(m, &a);
    for (int x = 0; x < a.n_jobs; x++) {
        ck_assert_str_eq(a.jobs[x].state, "queued");
        if (a.jobs[x].id == j2) ck_assert_str_eq(a.jobs[x].reason, "committed");
    }
    ck_assert_str_eq(a.nodes[0].state, "ready");
    cluster_state_release(&a);
    mirror_free(m);
}
END_TEST

/* A process killed between a write and its commit loses nothing it had
 * acknowledged (committed), and what it had not committed is not there:
 * the mirror is a cache, SQLite the state; the next process's mirror,
 * loaded from the file, equals it. */
START_TEST(db_crash_before_commit_loses_nothing)
{
    int64_t now = now_ms();
    int64_t t = team("default", -1);
    node("n1", 8, 2, now);
    node("n2", 8, 2, now);
    int64_t jobs[6];
    for (int x = 0; x < 6; x++) jobs[x] = job(t, 50, 1, x < 3 ? 4 : 8, "gpu", 0, 0, 0);
    int fd[2];
    ck_assert_int_eq(pipe(fd), 0);
    int pg = strcmp(db_engine(g_db), "postgres") == 0;
    if (pg) db_lease_stop(g_db); /* the child leads: it is the server here */
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) { /* the server: never touches the parent's connections */
        close(fd[0]);
        db *d = NULL;
        char err[256];
        if (db_open(&d, g_path, err, sizeof err) < 0) _exit(2);
        if (strcmp(db_engine(d), "postgres") == 0) { /* the server leads before it writes */
            db_lease_cfg lc = {.holder = "test-child", .url = "http://test", .ttl_ms = 1500, .renew_ms = 300,
                               .deadline_ms = 1000};
            if (db_lease_start(d, &lc, err, sizeof err) < 0 || db_lease_wait(d, 20000) < 0) _exit(7);
        }
        sched_config cfg; sched_config_default(&cfg);
        sched_pass_stats st;
        if (sched_pass(d, &cfg, now, &st) < 0) _exit(3);
        long placed = st.placed;
        if (write(fd[1], &placed, sizeof placed) != (ssize_t)sizeof placed) _exit(4); /* acknowledged */
        /* the next decisions: written, not committed */
        if (db_begin(d) < 0) _exit(5);
        static const char *const from_q[] = {"queued", NULL};
        for (int x = 0; x < 6; x++) store_job_transition(d, jobs[x], from_q, "cancelled", "test", "lost");
        cluster_node_drain(d, 1, 1, NULL);
        kill(getpid(), SIGKILL);
        _exit(6);
    }
    close(fd[1]);
    long placed = -1;
    ck_assert_int_eq(read(fd[0], &placed, sizeof placed), (ssize_t)sizeof placed);
    close(fd[0]);
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "the child exited with %d",
                  WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    ck_assert_int_gt(placed, 0);
    if (pg) { /* the next server takes the lease once the killed one's expires */
        char err[256];
        db_lease_cfg lc = {.holder = "test", .url = "http://test"};
        ck_assert_msg(db_lease_start(g_db, &lc, err, sizeof err) == 0, "%s", err);
        ck_assert_int_eq(db_lease_wait(g_db, 10000), 0);
    }
    /* every acknowledged placement is there, nothing uncommitted is */
    ck_assert_int_eq(q1("SELECT count(*) FROM jobs WHERE state = 'starting'", 0), placed);
    ck_assert_int_eq(q1("SELECT count(*) FROM jobs WHERE state = 'cancelled'", 0), 0);
    ck_assert_int_eq(q1("SELECT count(*) FROM nodes WHERE state = 'drained'", 0), 0);
    ck_assert_int_eq(q1("SELECT count(DISTINCT job_id) FROM allocations", 0), placed);
    check_db();
    /* the restarted server's mirror is loaded from the file and follows it */
    mirror *m = mirror_new();
    ck_assert(!mirror_matches(m));
    sched_config cfg; sched_config_default(&cfg);
    ck_assert_int_eq(sched_pass(g_db, &cfg, now + 1000, NULL), 0);
    ck_assert(mirror_matches(m));
    mirror_free(m);
    check_db();
}
END_TEST

/* Jobs with explicit times, so that two databases get the same rows. */
static int64_t job_at(int64_t team_id, int prio, int workers, int dpw, const char *device, int64_t at)
{
    static const char sql[] =
        "INSERT INTO jobs(team_id, name, spec, state, priority, attempt, max_restarts, workers,"
        " devices_per_worker, device, ps, max_runtime_s, preemptible, created_at, updated_at, queued_at)"
        " VALUES(?, 'j', '{}', 'queued', ?, 0, 1, ?, ?, ?, 0, ?, ?, ?, ?, ?) RETURNING id";
    db_stmt *st = prep(sql);
    db_bind_int64(st, 1, team_id);
    db_bind_int(st, 2, prio);
    db_bind_int(st, 3, workers);
    db_bind_int(st, 4, dpw);
    db_bind_text(st, 5, device, -1);
    db_bind_int(st, 6, 600 * (1 + (int)(at % 7)));
    db_bind_int(st, 7, (int)(at % 2));
    db_bind_int64(st, 8, at);
    db_bind_int64(st, 9, at);
    db_bind_int64(st, 10, at);
    ck_assert_msg(db_step(st) == DB_ROW, "%s", db_errmsg(g_db));
    int64_t id = db_col_int64(st, 0);
    ck_assert_int_eq(db_step(st), DB_DONE); /* the write completes (the change log sees it) */
    db_done(st);
    return id;
}

/* The world moves the same way on whichever database g_db is. */
static void world_moves(uint64_t seed, int64_t now, const int64_t *teams)
{
    uint64_t saved = g_rng;
    g_rng = seed;
    db_stmt *s2 = prep("SELECT id, state FROM jobs WHERE state IN ('starting','running','queued') ORDER BY id");
    int64_t ids[256]; int states[256]; int n = 0;
    while (n < 256 && db_step(s2) == DB_ROW) {
        ids[n] = db_col_int64(s2, 0);
        states[n++] = db_col_text(s2, 1)[0];
    }
    db_done(s2);
    for (int x = 0; x < n; x++) {
        int r = rint_(0, 7);
        if (states[x] == 's' && r < 3) {
            exec_sql("UPDATE jobs SET state = 'running' WHERE id = ?", ids[x]);
            exec_sql("UPDATE tasks SET state = 'running' WHERE job_id = ? AND state = 'assigned'", ids[x]);
        } else if (states[x] == 'r' && r == 0) {
            exec_sql("UPDATE tasks SET state = 'exited' WHERE job_id = ?", ids[x]);
            exec_sql("UPDATE jobs SET state = 'succeeded' WHERE id = ?", ids[x]);
        } else if (states[x] == 'q' && r == 0) {
            store_job_transition(g_db, ids[x], FROM_LIVE, "cancelled", "test", "test");
        }
    }
    int nj = rint_(0, 6);
    for (int x = 0; x < nj; x++)
        job_at(teams[rint_(0, 2)], rint_(0, 2) * 40 + 10, rint_(1, 3), rint_(1, 8), rint_(0, 3) ? "gpu" : "cpu",
               now + x);
    if (rint_(0, 5) == 0) ck_assert_int_ge(cluster_node_drain(g_db, rint_(1, 6), rint_(0, 1), NULL), 0);
    g_rng = saved;
}

static void beat_nodes(int64_t now)
{
    for (int64_t id = 1; id <= q1("SELECT max(id) FROM nodes", 0); id++) cluster_node_heartbeat(g_db, id, now);
}

/* What placed and what waits must not depend on the mirror: the same world
 * on two database files, one scheduled over the mirror, the other loading
 * everything every pass (sched_full_load), gives the same queue order, the
 * same reasons and estimated starts, and the same placements, device for
 * device, pass after pass. */
START_TEST(queue_order_exact)
{
    g_rng = 0x0de7ull + (uint64_t)_i;
    uint64_t seed = rnd();
    char path2[512];
    if (ty_pg_url()) ty_pg_new_db(path2, sizeof path2);
    else snprintf(path2, sizeof path2, "%s/full.db", g_dir);
    db *a = g_db, *b = NULL;
    ty_db_open_leading(&b, path2);
    int64_t now = 1700000000000LL;
    sched_config cfg; sched_config_default(&cfg);
    cfg.backfill = (int)(seed % 2);
    int64_t teams[3];
    for (int side = 0; side < 2; side++) {
        g_db = side ? b : a;
        uint64_t saved = g_rng;
        g_rng = seed;
        teams[0] = team("default", -1);
        teams[1] = team("t1", rint_(4, 16));
        teams[2] = team("t2", -1);
        ck_assert_int_eq(cluster_team_set_shares(g_db, "t2", 3, 4, 1, 0, 0), 0);
        int nn = rint_(2, 6);
        for (int i = 0; i < nn; i++) {
            char host[32];
            snprintf(host, sizeof host, "n%d", i);
            int idx[8], ng = rint_(0, 8);
            for (int g = 0; g < ng; g++) idx[g] = g;
            ck_assert_int_eq(cluster_node_upsert(g_db, host, "10.0.0.1", rint_(1, 4), ng, idx, NULL, NULL,
                                                 rint_(0, 1) * 32000, NULL, now, NULL, NULL), 0);
        }
        int nj = rint_(10, 40);
        for (int x = 0; x < nj; x++)
            job_at(teams[rint_(0, 2)], rint_(0, 2) * 40 + 10, rint_(1, 3), rint_(1, 8), rint_(0, 3) ? "gpu" : "cpu",
                   now - 100000 + x * 997);
        g_rng = saved;
    }
    int placed = 0;
    for (int pass = 0; pass < 10; pass++) {
        now += 5000;
        sched_queue_entry *qe[2] = {NULL, NULL};
        int nq[2] = {0, 0};
        sched_pass_stats st[2];
        for (int side = 0; side < 2; side++) {
            g_db = side ? b : a;
            sched_full_load(side);
            beat_nodes(now);
            ck_assert_int_eq(sched_queue_view(g_db, &cfg, now, &qe[side], &nq[side]), 0);
            ck_assert_int_eq(sched_pass(g_db, &cfg, now, &st[side]), 0);
        }
        sched_full_load(0);
        ck_assert_int_eq(st[0].full_load, 0); /* the mirror read only what changed */
        ck_assert_int_eq(nq[0], nq[1]);
        for (int k = 0; k < nq[0]; k++) {
            ck_assert_int_eq(qe[0][k].job_id, qe[1][k].job_id);
            ck_assert_int_eq(qe[0][k].eff_priority, qe[1][k].eff_priority);
            ck_assert_int_eq(qe[0][k].est_start_ms, qe[1][k].est_start_ms);
            ck_assert_int_eq(qe[0][k].will_start, qe[1][k].will_start);
            ck_assert_str_eq(qe[0][k].reason, qe[1][k].reason);
        }
        free(qe[0]); free(qe[1]);
        ck_assert_int_eq(st[0].placed, st[1].placed);
        ck_assert_int_eq(st[0].stopped, st[1].stopped);
        ck_assert_int_eq(st[0].waiting, st[1].waiting);
        placed += st[0].placed;
        /* the same devices to the same jobs, the same tasks and ports */
        static const char *const sums[] = {
            "SELECT coalesce(sum(device_id * 1000003 + job_id * 7919 + task_id), 0) FROM allocations",
            "SELECT coalesce(sum(id * 31 + job_id * 1009 + node_id * 65537 + port * 7 + memory_mb), 0) FROM tasks",
            "SELECT coalesce(sum(id * length(reason) + length(state)), 0) FROM jobs",
            "SELECT count(*) FROM allocations"};
        for (int q = 0; q < 4; q++) {
            g_db = a;
            long va = q1(sums[q], 0);
            g_db = b;
            long vb = q1(sums[q], 0);
            ck_assert_int_eq(va, vb);
        }
        uint64_t mv = rnd();
        g_db = a;
        world_moves(mv, now, teams);
        g_db = b;
        world_moves(mv, now, teams);
    }
    g_db = a;
    ck_assert_int_gt(placed, 0);
    db_close(b);
}
END_TEST


/* The admission's capacity (store_cluster_capacity, kept per db and read
 * again only when nodes or devices change) equals the aggregate over the
 * nodes and devices tables, through joins, drains, losses, heartbeats that
 * bring a node back, re-registrations with other devices, placements. */
static const char SQL_CAPACITY_REF[] =
    "WITH per AS (SELECT n.id, n.memory_mb AS mem, count(v.id) AS c FROM nodes n"
    "   LEFT JOIN devices v ON v.node_id = n.id AND v.kind = ?1 WHERE n.state = 'ready' GROUP BY n.id)"
    "SELECT (SELECT count(*) FROM per),"
    " coalesce((SELECT max(c) FROM per), 0),"
    " coalesce((SELECT sum(c) FROM per), 0),"
    " (SELECT count(*) FROM devices v JOIN nodes n ON n.id = v.node_id WHERE n.state = 'ready' AND v.kind = 'cpu'),"
    " coalesce((SELECT sum(c / ?2) FROM per), 0),"
    " (SELECT count(*) FROM per WHERE mem > 0),"
    " coalesce((SELECT max(mem) FROM per WHERE c >= ?2), 0),"
    " (SELECT count(*) FROM per WHERE c >= ?2 AND (mem = 0 OR ?3 <= 0 OR mem >= ?3)),"
    " coalesce((SELECT sum(CASE WHEN mem > 0 AND ?3 > 0 AND mem / ?3 < c / ?2 THEN mem / ?3 ELSE c / ?2 END)"
    "   FROM per), 0)";

static void capacity_matches(const char *kind, int pw, int64_t mem)
{
    store_capacity c;
    ck_assert_int_eq(store_cluster_capacity(g_db, kind, pw, mem, &c), STORE_OK);
    db_stmt *st = prep(SQL_CAPACITY_REF);
    db_bind_text(st, 1, kind, -1);
    db_bind_int(st, 2, pw > 0 ? pw : 1);
    db_bind_int64(st, 3, mem);
    ck_assert_msg(db_step(st) == DB_ROW, "%s", db_errmsg(g_db));
    ck_assert_int_eq(c.nodes, db_col_int(st, 0));
    ck_assert_int_eq(c.largest, db_col_int(st, 1));
    ck_assert_int_eq(c.total, db_col_int(st, 2));
    ck_assert_int_eq(c.cpu_total, db_col_int(st, 3));
    ck_assert_int_eq(c.workers_fit, db_col_int(st, 4));
    ck_assert_int_eq(c.mem_nodes, db_col_int(st, 5));
    ck_assert_int_eq(c.mem_largest, db_col_int64(st, 6));
    ck_assert_int_eq(c.mem_hold, db_col_int(st, 7));
    ck_assert_int_eq(c.mem_workers_fit, db_col_int(st, 8));
    db_done(st);
}

START_TEST(db_capacity_follows_nodes)
{
    g_rng = 0xcafeull + (uint64_t)_i;
    int64_t now = 1700000000000LL;
    sched_config cfg; sched_config_default(&cfg);
    int64_t t = team("default", -1);
    for (int step = 0; step < 60; step++) {
        now += 1000;
        int64_t some_node = q1("SELECT coalesce((SELECT id FROM nodes ORDER BY random() LIMIT 1), 0)", 0);
        switch (rint_(0, 6)) {
        case 0: case 1: {
            char host[32];
            snprintf(host, sizeof host, "n%d", rint_(0, 5));
            int idx[8], ng = rint_(0, 8);
            for (int g = 0; g < ng; g++) idx[g] = g;
            ck_assert_int_eq(cluster_node_upsert(g_db, host, "10.0.0.3", rint_(0, 4), ng, idx, NULL, NULL,
                                                 rint_(0, 2) * 12000, NULL, now, NULL, NULL), 0);
            break;
        }
        case 2:
            if (some_node) ck_assert_int_ge(cluster_node_drain(g_db, some_node, rint_(0, 1), NULL), 0);
            break;
        case 3: {
            if (some_node) ck_assert_int_eq(cluster_node_heartbeat(g_db, some_node, now - 100000), 0);
            int64_t *ids = NULL;
            ck_assert_int_ge(cluster_nodes_mark_lost(g_db, now - 50000, &ids), 0);
            free(ids);
            break;
        }
        case 4: /* a lost node beats again */
            if (some_node) ck_assert_int_eq(cluster_node_heartbeat(g_db, some_node, now), 0);
            break;
        case 5:
            job(t, 50, rint_(1, 2), rint_(1, 4), "gpu", 0, 0, 0);
            ck_assert_int_eq(sched_pass(g_db, &cfg, now, NULL), 0);
            break;
        default:
            break;
        }
        capacity_matches(rint_(0, 1) ? "gpu" : "cpu", rint_(0, 4), rint_(0, 2) * 5000);
    }
}
END_TEST


/* A pass writes only the waiting reasons that changed: the next pass over an
 * unchanged store writes none, over the mirror (outcomes compared) and with a
 * full load (texts compared) alike; a reason changed behind its back is
 * written again. */
START_TEST(db_reasons_not_rewritten)
{
    int64_t now = now_ms();
    sched_config cfg; sched_config_default(&cfg);
    int64_t t = team("default", -1);
    node("n1", 4, 2, now);
    for (int x = 0; x < 6; x++) job(t, 50, 1, 4, "gpu", 0, 0, 0);
    sched_pass_stats st;
    ck_assert_int_eq(sched_pass(g_db, &cfg, now, &st), 0);
    ck_assert_int_eq(st.placed, 1);
    ck_assert_int_eq(st.reasons, 5);
    for (int full = 0; full < 2; full++) {
        sched_full_load(full);
        ck_assert_int_eq(sched_pass(g_db, &cfg, now + 1, &st), 0);
        ck_assert_int_eq(st.waiting, 5);
        ck_assert_int_eq(st.reasons, 0);
    }
    sched_full_load(0);
    int64_t j = q1("SELECT max(id) FROM jobs WHERE state = 'queued'", 0);
    ck_assert_int_eq(cluster_job_set_reason(g_db, j, "stale"), 0);
    ck_assert_int_eq(sched_pass(g_db, &cfg, now + 2, &st), 0);
    ck_assert_int_eq(st.reasons, 1);
    char txt[256];
    qtext("SELECT reason FROM jobs WHERE id = ?", j, txt, sizeof txt);
    ck_assert_str_ne(txt, "stale");
}
END_TEST

/* A write the change log does not see (a connection of its own: the
 * mirror learns nothing of it), as another writer racing the pass. */
static void write_unseen(const char *sql)
{
    if (ty_pg_url()) {
        PGconn *c = PQconnectdb(g_path);
        ck_assert_msg(PQstatus(c) == CONNECTION_OK, "%s", PQerrorMessage(c));
        PGresult *r = PQexec(c, "SELECT set_config('ty.epoch', epoch::text, false) FROM ty_lease");
        ck_assert_msg(PQresultStatus(r) == PGRES_TUPLES_OK, "%s", PQresultErrorMessage(r));
        PQclear(r);
        r = PQexec(c, sql);
        ck_assert_msg(PQresultStatus(r) == PGRES_COMMAND_OK, "%s: %s", sql, PQresultErrorMessage(r));
        PQclear(r);
        PQfinish(c);
        return;
    }
    sqlite3 *s = NULL;
    ck_assert_int_eq(sqlite3_open(g_path, &s), SQLITE_OK);
    sqlite3_busy_timeout(s, 5000);
    char *err = NULL;
    int rc = sqlite3_exec(s, sql, NULL, NULL, &err);
    ck_assert_msg(rc == SQLITE_OK, "%s: %s", sql, err ? err : "?");
    sqlite3_free(err);
    sqlite3_close(s);
}

/* A job cancelled behind the mirror's back, between the pass's read and
 * its writes: its placement is skipped (nothing of it written, a conflict
 * counted, the pass succeeds) and the others are placed whole. On
 * PostgreSQL a placement is one statement (cluster_place), which also
 * skips a job whose device is held, writing nothing; SQLite writes step by
 * step under a savepoint (cluster_place answers -2 there). */
START_TEST(db_place_skips_what_changed)
{
    int64_t now = now_ms();
    sched_config cfg; sched_config_default(&cfg);
    int64_t t = team("default", -1);
    int64_t a = job(t, 50, 1, 2, "gpu", 0, 0, 0);
    int64_t b = job(t, 50, 2, 1, "gpu", 0, 0, 0);
    int64_t c = job(t, 50, 1, 1, "gpu", 0, 0, 0);
    sched_pass_stats st;
    node("n1", 0, 2, now); /* no gpu yet: the mirror holds them queued */
    for (int k = 0; k < 2; k++) {
        ck_assert_int_eq(sched_pass(g_db, &cfg, now + k, &st), 0);
        ck_assert_int_eq(st.placed, 0);
    }
    node("n1", 8, 2, now);
    char sql[160];
    snprintf(sql, sizeof sql, "UPDATE jobs SET state = 'cancelled' WHERE id = %lld", (long long)a);
    write_unseen(sql);
    ck_assert_int_eq(sched_pass(g_db, &cfg, now + 1000, &st), 0);
    ck_assert_int_eq(st.conflicts, 1);
    ck_assert_int_eq(st.placed, 2);
    char txt[64];
    qtext("SELECT state FROM jobs WHERE id = ?", a, txt, sizeof txt);
    ck_assert_str_eq(txt, "cancelled");
    ck_assert_int_eq(q1("SELECT attempt FROM jobs WHERE id = ?", a), 0);
    ck_assert_int_eq(q1("SELECT count(*) FROM tasks WHERE job_id = ?", a), 0);
    ck_assert_int_eq(q1("SELECT count(*) FROM allocations WHERE job_id = ?", a), 0);
    ck_assert_int_eq(q1("SELECT count(*) FROM job_events WHERE job_id = ? AND to_state = 'starting'", a), 0);
    for (int k = 0; k < 2; k++) {
        int64_t j = k ? c : b;
        qtext("SELECT state FROM jobs WHERE id = ?", j, txt, sizeof txt);
        ck_assert_str_eq(txt, "starting");
        ck_assert_int_eq(q1("SELECT attempt FROM jobs WHERE id = ?", j), 1);
        ck_assert_int_eq(q1("SELECT workers_now FROM jobs WHERE id = ?", j), k ? 1 : 2);
        ck_assert_int_eq(q1("SELECT count(*) FROM tasks WHERE job_id = ? AND attempt = 1 AND state = 'assigned'", j),
                         k ? 1 : 2);
        ck_assert_int_eq(q1("SELECT count(*) FROM allocations WHERE job_id = ?", j), k ? 1 : 2);
        ck_assert_int_eq(q1("SELECT count(*) FROM allocations a JOIN tasks t ON t.id = a.task_id"
                            " WHERE a.job_id = ? AND t.job_id = a.job_id", j), k ? 1 : 2);
        ck_assert_int_eq(q1("SELECT count(*) FROM job_events WHERE job_id = ? AND kind = 'state'"
                            " AND from_state = 'queued' AND to_state = 'starting' AND actor = 'scheduler'"
                            " AND reason LIKE 'placed on n1%'", j), 1);
    }
    check_db();
    /* one statement: a held device writes nothing */
    int64_t d = job(t, 50, 1, 1, "gpu", 0, 0, 0);
    int64_t held = q1("SELECT min(device_id) FROM allocations WHERE job_id = ?", c);
    int64_t free_dev = q1("SELECT min(id) FROM devices WHERE kind = 'gpu' AND id NOT IN"
                          " (SELECT device_id FROM allocations)", 0);
    int64_t n1 = q1("SELECT min(id) FROM nodes", 0);
    cl_place_task tk = {"worker", 0, n1, 29500, 0, 1, 0, &held, 1};
    ck_assert_int_eq(db_begin(g_db), 0);
    int rc = cluster_place(g_db, d, "placed on n1", 1, now + 2000, &tk, 1);
    if (!ty_pg_url()) {
        ck_assert_int_eq(rc, -2);
        db_rollback(g_db);
        return;
    }
    ck_assert_int_eq(rc, 0);
    ck_assert_int_eq(q1("SELECT count(*) FROM tasks WHERE job_id = ?", d), 0);
    ck_assert_int_eq(q1("SELECT attempt FROM jobs WHERE id = ?", d), 0);
    tk.devices = &free_dev;
    ck_assert_int_eq(cluster_place(g_db, d, "placed on n1", 1, now + 2000, &tk, 1), 1);
    ck_assert_int_eq(cluster_place(g_db, d, "placed on n1", 1, now + 2000, &tk, 1), 0); /* no longer queued */
    ck_assert_int_eq(db_commit(g_db), 0);
    ck_assert_int_eq(q1("SELECT count(*) FROM allocations WHERE job_id = ?", d), 1);
    ck_assert_int_eq(q1("SELECT count(*) FROM job_events WHERE job_id = ? AND to_state = 'starting'", d), 1);
    check_db();
    /* several jobs in one statement (the pass's form): each all or nothing,
     * the others placed; a reason with the array literal's quotes */
    int64_t e = job(t, 50, 1, 1, "gpu", 0, 0, 0), f = job(t, 50, 1, 1, "gpu", 0, 0, 0), g = job(t, 50, 1, 1, "gpu", 0, 0, 0);
    exec_sql("UPDATE jobs SET state = 'cancelled' WHERE id = ?", g);
    int64_t f0 = q1("SELECT min(id) FROM devices WHERE kind = 'gpu' AND id NOT IN (SELECT device_id FROM allocations)", 0);
    int64_t f1 = q1("SELECT max(id) FROM devices WHERE kind = 'gpu' AND id NOT IN (SELECT device_id FROM allocations)", 0);
    ck_assert_int_ne(f0, f1);
    cl_place_task te = {"worker", 0, n1, 29501, 0, 1, 0, &held, 1}, tf = {"worker", 0, n1, 29502, 0, 1, 0, &f0, 1},
                  tg = {"worker", 0, n1, 29503, 0, 1, 0, &f1, 1};
    static const char odd[] = "placed on \"n1\", a \\ and {braces}";
    cl_place_job pj[3] = {{e, "placed on n1", 1, &te, 1, 9}, {f, odd, 1, &tf, 1, 9}, {g, "placed on n1", 1, &tg, 1, 9}};
    ck_assert_int_eq(db_begin(g_db), 0);
    ck_assert_int_eq(cluster_place_many(g_db, pj, 3, now + 3000), 1);
    ck_assert_int_eq(db_commit(g_db), 0);
    ck_assert_int_eq(pj[0].attempt, 0); /* its device is held */
    ck_assert_int_eq(pj[1].attempt, 1);
    ck_assert_int_eq(pj[2].attempt, 0); /* no longer queued */
    ck_assert_int_eq(q1("SELECT count(*) FROM tasks WHERE job_id = ?", e), 0);
    ck_assert_int_eq(q1("SELECT count(*) FROM tasks WHERE job_id = ?", g), 0);
    ck_assert_int_eq(q1("SELECT count(*) FROM allocations WHERE job_id = ?", f), 1);
    ck_assert_int_eq(q1("SELECT min(device_id) FROM allocations WHERE job_id = ?", f), f0);
    qtext("SELECT reason FROM job_events WHERE job_id = ? AND to_state = 'starting'", f, txt, sizeof txt);
    ck_assert_str_eq(txt, odd);
    qtext("SELECT state FROM jobs WHERE id = ?", e, txt, sizeof txt);
    ck_assert_str_eq(txt, "queued");
    check_db();
}
END_TEST

/* ================================================================ main */

/* The scheduler thread's voluntary context switches (it names itself
 * ty-sched), or -1 when it is not found. */
static long sched_thread_switches(void)
{
    DIR *dir = opendir("/proc/self/task");
    if (!dir) return -1;
    long n = -1;
    struct dirent *e;
    while (n < 0 && (e = readdir(dir))) {
        if (e->d_name[0] == '.') continue;
        char path[320], name[64] = "";
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        int named = fgets(name, sizeof name, f) && strncmp(name, "ty-sched", 8) == 0;
        fclose(f);
        if (!named) continue;
        snprintf(path, sizeof path, "/proc/self/task/%s/status", e->d_name);
        if (!(f = fopen(path, "r"))) continue;
        char line[256];
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "voluntary_ctxt_switches: %ld", &n) == 1) break;
        fclose(f);
    }
    closedir(dir);
    return n;
}

/* Kicks while a pass is already due wake no one: during a stream of
 * submissions (a kick each) the thread waits out its gap and runs one pass
 * for all of them, woken by its timer, not once per kick. 1,500 queued
 * jobs make the passes (and so the gaps) last a few milliseconds; kicks
 * every 20 us for 400 ms then cost a couple of switches a pass. Waking on
 * each kick cost one per kick that fell in a gap: thousands. */
START_TEST(db_kicks_while_pending_wake_no_one)
{
    if (ty_pg_url()) {
        printf("SKIP db_kicks_while_pending_wake_no_one on PostgreSQL: it counts the scheduler thread's context"
               " switches, and there every query's wait on its socket is one\n");
        return;
    }
    int64_t t = team("kick", -1);
    ck_assert_int_eq(db_begin(g_db), 0);
    for (int i = 0; i < 1500; i++) job(t, 50, 1, 1, "cpu", 0, 0, 0);
    ck_assert_int_eq(db_commit(g_db), 0);
    sched_config cfg;
    sched_config_default(&cfg);
    ck_assert_int_eq(sched_start(g_db, &cfg), 0);
    sched_thread_stats st;
    for (int i = 0; i < 500; i++) {
        sched_thread_stats_get(&st);
        if (st.passes >= 1) break;
        usleep(10 * 1000);
    }
    ck_assert_uint_ge(st.passes, 1);
    long s0 = sched_thread_switches();
    ck_assert_int_ge(s0, 0);
    uint64_t p0 = st.passes;
    int64_t end = mono_ms() + 400;
    long kicks = 0;
    while (mono_ms() < end) {
        sched_kick();
        kicks++;
        usleep(20);
    }
    long s1 = sched_thread_switches();
    sched_thread_stats_get(&st);
    sched_stop();
    long sw = s1 - s0;
    uint64_t passes = st.passes - p0;
    ck_assert_msg(sw <= 3 * (long)passes + 10, "%ld switches of the scheduler thread for %llu passes and %ld kicks", sw,
                  (unsigned long long)passes, kicks);
}
END_TEST

Suite *sched_suite(void);

Suite *sched_suite(void)
{
    Suite *s = suite_create("sched");
    /* on PostgreSQL only the cases that use a database run: the pure core's
     * are the same whatever the store, and the SQLite run has them */
    int pg = ty_pg_url() != NULL;
    if (pg) {
        printf("SKIP the core case on PostgreSQL: it opens no database (the run on SQLite has it)\n");
    } else {
        TCase *tc = tcase_create("core");
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, best_fit_keeps_large_holes);
        tcase_add_test(tc, gang_on_fewest_nodes);
        tcase_add_test(tc, reasons_people_read);
        tcase_add_test(tc, admission_numbers);
        tcase_add_test(tc, image_jobs_only_where_podman_is);
        tcase_add_test(tc, preempt_least_work_lost);
        tcase_add_test(tc, guarantee_reclaims_borrowed);
        tcase_add_test(tc, max_interactive_holds_the_next);
        tcase_add_test(tc, interactive_kept_within_guarantee);
        tcase_add_test(tc, fair_share_orders_teams);
        tcase_add_test(tc, user_share_within_team);
        tcase_add_test(tc, user_key_formula);
        tcase_add_test(tc, memory_blocks_second_job);
        tcase_add_test(tc, memory_default_share);
        tcase_add_test(tc, memory_zero_node_ignored);
        tcase_add_test(tc, memory_preemption_frees_memory);
        tcase_add_test(tc, memory_backfill_keeps_reservation);
        tcase_add_test(tc, memory_admission);
        tcase_add_test(tc, evaluator_node_choice);
        tcase_add_loop_test(tc, property_random_worlds, 0, 4);
        tcase_add_loop_test(tc, property_repeated_passes, 0, 2);
        tcase_add_test(tc, pass_is_fast);
        suite_add_tcase(s, tc);
    }
    TCase *td = tcase_create("sqlite");
    tcase_set_timeout(td, 120);
    tcase_add_checked_fixture(td, db_setup, db_teardown);
    tcase_add_test(td, db_pass_places_gangs);
    tcase_add_test(td, db_memory_placement);
    tcase_add_test(td, db_lost_node_requeue_and_restarts);
    tcase_add_test(td, db_preempt_then_requeue);
    tcase_add_test(td, db_user_share_within_team);
    tcase_add_test(td, db_one_restart_budget);
    tcase_add_test(td, db_evaluator_placement);
    /* fewer random seeds on PostgreSQL (the same statements, a round trip
     * each): the run on SQLite covers the 40 and 8 */
    tcase_add_loop_test(td, db_property_random_with_faults, 0, pg ? 10 : 40);
    tcase_add_loop_test(td, db_property_async_binding, 0, pg ? 10 : 40);
    tcase_add_loop_test(td, db_mirror_follows_sqlite, 0, pg ? 4 : 8);
    tcase_add_test(td, db_mirror_rollback_invisible);
    tcase_add_test(td, db_crash_before_commit_loses_nothing);
    tcase_add_loop_test(td, queue_order_exact, 0, pg ? 4 : 8);
    tcase_add_loop_test(td, db_capacity_follows_nodes, 0, 4);
    tcase_add_test(td, db_reasons_not_rewritten);
    tcase_add_test(td, db_place_skips_what_changed);
    tcase_add_test(td, db_kicks_while_pending_wake_no_one);
    suite_add_tcase(s, td);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(sched_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
