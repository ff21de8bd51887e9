/* scheduler.c - the scheduling pass on SQLite, and the scheduler thread.
 *
 * A pass has three steps, each short: (1) upkeep in one write transaction
 * (lost nodes, devices of exited tasks freed, stopped jobs requeued or
 * failed; only the tasks and jobs the change log names); (2) the mirror
 * (mirror.c) reads again, in one read transaction, the rows that changed
 * since the last pass, the core's snapshot is built over it and the pure
 * core runs with no lock of the store held; (3) the decisions applied in one
 * write transaction, each placement under its own savepoint so a job
 * cancelled meanwhile is skipped alone (on PostgreSQL, where a statement is
 * a round trip, the placements are one statement that writes each job all
 * or nothing: cluster_place_many), and any store error rolls the whole
 * transaction back. The scheduler thread's passes commit step 3 in a
 * thread of their own (sched_pass_async: "the pass" below). The store is
 * the only durable state; the mirror a cache. */
#include "scheduler.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../common/util.h"
#include "../storage/cluster.h"
#include "../storage/store.h"
#include "eval_place.h"
#include "lifecycle.h"
#include "mirror.h"

/* ================================================================ faults */

static int g_fault_after;       /* test hook: writes left before a failure, 0 off */

void sched_fault_after(int n)
{
    __atomic_store_n(&g_fault_after, n, __ATOMIC_SEQ_CST);
}

/* A write point: -1 when the injected fault fires here. */
static int fault_point(void)
{
    int n = __atomic_load_n(&g_fault_after, __ATOMIC_SEQ_CST);
    if (n <= 0) return 0;
    if (n == 1) {
        __atomic_store_n(&g_fault_after, 0, __ATOMIC_SEQ_CST);
        log_warn("scheduler: injected fault");
        return -1;
    }
    __atomic_store_n(&g_fault_after, n - 1, __ATOMIC_SEQ_CST);
    return 0;
}

/* ================================================================ snapshot
 * The core's snapshot is built over the mirror's rows (mirror.c), which a
 * refresh keeps in step with SQLite by reading only what changed. The
 * mirror's lock is held from the refresh until the decisions are applied. */

typedef struct snap {
    mirror *m;
    sched_snapshot s;
    sched_node *nodes;
    int *ports;
    sched_mem *mem;
    sched_team *teams;
    sched_user *users;
    sched_running *run;
    const cl_job **run_job;  /* (n_running) rows in the mirror */
    sched_job *q;
    const cl_job **q_job;    /* (n_queued) */
    int *q_slot;             /* (n_queued) the job's slot in the mirror */
    int64_t *avoid;
} snap;

static int g_full_load;      /* sched_full_load: every pass loads everything */

void sched_full_load(int on)
{
    __atomic_store_n(&g_full_load, on, __ATOMIC_SEQ_CST);
}

static void bind_reap(mirror *m);
static void bind_drop(mirror *m);

static void *mirror_make(void) { return mirror_new(); }

/* The db closes: its users waited for the last binding (sched_bind_wait);
 * one still running is waited for here all the same. */
static void mirror_drop(void *p)
{
    mirror *m = p;
    pthread_mutex_lock(&m->mu);
    bind_reap(m);
    bind_drop(m);
    pthread_mutex_unlock(&m->mu);
    mirror_free(m);
}

/* The db's mirror, locked, once any binding of a pass is done (the
 * mirror is the binding's until then: sched_pass_async): NULL when none
 * could be made. */
static mirror *mirror_lock(db *d)
{
    mirror *m = db_cache(d, DB_CACHE_MIRROR, mirror_make, mirror_drop);
    if (m) {
        pthread_mutex_lock(&m->mu);
        bind_reap(m);
    }
    return m;
}

/* Brings the locked mirror in step with the store: 0, or -1. */
static int mirror_sync(mirror *m, db *d, mirror_stats *ms)
{
    if (__atomic_load_n(&g_full_load, __ATOMIC_SEQ_CST)) mirror_invalidate(m);
    return mirror_refresh(m, d, ms);
}

/* The db's mirror, locked and in step with the store: 0, or -1 (unlocked). */
static int mirror_take(db *d, mirror **out, mirror_stats *ms)
{
    mirror *m = mirror_lock(d);
    if (!m) return -1;
    if (mirror_sync(m, d, ms) < 0) {
        pthread_mutex_unlock(&m->mu);
        return -1;
    }
    *out = m;
    return 0;
}

static void mirror_give(mirror *m) { pthread_mutex_unlock(&m->mu); }

static void snap_release(snap *sp)
{
    free(sp->nodes); free(sp->ports); free(sp->mem); free(sp->teams); free(sp->users);
    free(sp->run); free(sp->run_job); free(sp->q); free(sp->q_job); free(sp->q_slot); free(sp->avoid);
    memset(sp, 0, sizeof *sp);
}

/* Builds the core's snapshot over the mirror (held by the caller): the
 * devices are the mirror's own arrays (the core only reads them). Users'
 * usage is decayed to now with time constant tau_s (a row is written only
 * while its user holds devices: docs/scheduler.md). */
static void snap_build(mirror *m, int64_t now, double tau_s, snap *sp)
{
    memset(sp, 0, sizeof *sp);
    sp->m = m;
    size_t np = 0, nm = 0, na = 0;
    for (int i = 0; i < m->n_nodes; i++) {
        np += (size_t)m->nodes[i].n_ports; nm += (size_t)m->nodes[i].n_mem;
    }
    int nj = m->n_live + m->n_hold;
    for (int k = 0; k < m->n_live; k++) na += (size_t)m->info[m->order[k]].n_avoid;
    sp->nodes = xcalloc((size_t)m->n_nodes + 1, sizeof *sp->nodes);
    sp->ports = xmalloc((np + 1) * sizeof(int));
    sp->mem = xmalloc((nm + 1) * sizeof *sp->mem);
    sp->teams = xcalloc((size_t)m->n_teams + 1, sizeof *sp->teams);
    sp->users = xcalloc((size_t)m->n_uusage + 1, sizeof *sp->users);
    sp->run = xmalloc(((size_t)nj + 1) * sizeof *sp->run);
    sp->run_job = xmalloc(((size_t)nj + 1) * sizeof *sp->run_job);
    sp->q = xmalloc(((size_t)m->n_live + 1) * sizeof *sp->q);
    sp->q_job = xmalloc(((size_t)m->n_live + 1) * sizeof *sp->q_job);
    sp->q_slot = xmalloc(((size_t)m->n_live + 1) * sizeof *sp->q_slot);
    sp->avoid = xmalloc((na + 1) * sizeof *sp->avoid);

    size_t pt = 0, me = 0;
    for (int i = 0; i < m->n_nodes; i++) {
        mirror_node *mn = &m->nodes[i];
        sched_node *n = &sp->nodes[i];
        n->id = mn->row.id;
        n->ready = strcmp(mn->row.state, "ready") == 0;
        n->mem_mb = mn->row.memory_mb;
        n->runtimes = (mn->row.runtimes & CL_RUNTIME_HOST ? SCHED_RT_HOST : 0) |
                      (mn->row.runtimes & CL_RUNTIME_PODMAN ? SCHED_RT_PODMAN : 0);
        /* devices come ordered by kind, index: one run per kind */
        for (int k = 0, x = 0; k < SCHED_KINDS; x += mn->n_kind[k++]) {
            n->dev[k] = &mn->sdev[x];
            n->n_dev[k] = mn->n_kind[k];
            n->n_free[k] = mn->n_free[k];
        }
        n->sum = 1; /* kept with sdev by the mirror */
        n->holds = mn->holds;
        n->n_holds = mn->n_holds;
        n->ports = &sp->ports[pt];
        for (int x = 0; x < mn->n_ports; x++) sp->ports[pt++] = mn->ports[x].port;
        n->n_ports = mn->n_ports;
        n->mem = &sp->mem[me];
        for (int x = 0; x < mn->n_mem; x++) sp->mem[me++] = (sched_mem){mn->mem[x].job_id, mn->mem[x].mb};
        n->n_mem = mn->n_mem;
    }
    for (int t = 0; t < m->n_teams; t++)
        sp->teams[t] = (sched_team){m->teams[t].id, m->teams[t].weight, m->teams[t].guarantee,
                                    m->teams[t].quota, m->teams[t].usage, m->teams[t].max_interactive >= 0,
                                    m->teams[t].max_interactive >= 0 ? m->teams[t].max_interactive : 0};
    int nu = 0;
    for (int u = 0; u < m->n_uusage; u++) {
        const cl_user_usage *uu = &m->uusage[u];
        int t = mirror_find_team(m, uu->team_id);
        if (t < 0) continue;
        double dt = uu->usage_at > 0 && now > uu->usage_at ? (double)(now - uu->usage_at) / 1000.0 : 0;
        sp->users[nu++] = (sched_user){t, uu->user_id, sched_usage_decay(uu->usage, 0, dt, tau_s)};
    }
    int nq = 0, nr = 0;
    size_t av = 0;
    /* live jobs by id, then those only holding devices: cluster_load's order */
    for (int k = 0; k < nj; k++) {
        int slot = m->order[k];
        const mirror_slot *in = &m->info[slot];
        int t = mirror_find_team(m, in->team_id);
        if (t < 0) continue;
        if (in->queued) { /* the kept sched_job: no read of the row */
            sched_job *q = &sp->q[nq];
            *q = m->sj[slot];
            q->team = t;
            q->avoid = &sp->avoid[av];
            q->n_avoid = in->n_avoid;
            for (int x = 0; x < in->n_avoid; x++) sp->avoid[av++] = m->slots[slot].avoid[x].node_id;
            sp->q_slot[nq] = slot;
            sp->q_job[nq++] = &m->slots[slot].row;
        } else {
            const cl_job *j = &m->slots[slot].row;
            int live = strcmp(j->state, "starting") == 0 || strcmp(j->state, "running") == 0;
            int64_t start = j->attempt_started_at ? j->attempt_started_at : now;
            int elastic = j->workers_min > 0 && j->workers_min < j->workers;
            int now_w = elastic && j->workers_now > 0 ? j->workers_now : j->workers;
            sp->run[nr] = (sched_running){j->id, t, j->priority, j->preemptible, j->stopping || !live,
                                          now_w * j->devices_per_worker, start,
                                          j->last_checkpoint_at, start + j->max_runtime_s * 1000,
                                          elastic ? now_w : 0, elastic ? j->workers_min : 0,
                                          elastic ? j->workers : 0, j->devices_per_worker, j->kind,
                                          j->memory_mb, 0, j->user_id, j->interactive};
            sp->run_job[nr++] = j;
        }
    }
    sp->s = (sched_snapshot){now, m->n_nodes, m->n_nodes, sp->nodes, m->n_teams, sp->teams,
                             nr, sp->run, nq, sp->q, nu, sp->users};
}

/* ================================================================ upkeep */

static const char *const FROM_ACTIVE[] = {"starting", "running", NULL};

/* What upkeep must look at since it last ran, from the change log: the
 * tasks that changed and the jobs that changed or own them. 0, or 1 when it
 * must scan everything (first run, a gap in the log, full-load mode); *seq
 * is where the log was read up to. */
static int upkeep_changes(db *d, mirror *m, uint64_t *seq, int64_t **tasks, int *nt, int64_t **jobs, int *nj)
{
    *tasks = *jobs = NULL;
    *nt = *nj = 0;
    *seq = m->upkeep_seq;
    db_change *ch = NULL;
    size_t n = 0;
    int gap = db_changes_read(d, seq, &ch, &n);
    if (gap || !m->upkeep_follows || __atomic_load_n(&g_full_load, __ATOMIC_SEQ_CST)) {
        free(ch);
        return 1;
    }
    *tasks = xmalloc((n + 1) * sizeof **tasks);
    *jobs = xmalloc((2 * n + 1) * sizeof **jobs);
    for (size_t k = 0; k < n; k++) {
        if (ch[k].table == DB_CH_TASK) (*tasks)[(*nt)++] = ch[k].id;
        else if (ch[k].table == DB_CH_JOB) (*jobs)[(*nj)++] = ch[k].id;
    }
    free(ch);
    return 0;
}

static int cmp_id(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int uniq_ids(int64_t *v, int n)
{
    if (n < 2) return n;
    qsort(v, (size_t)n, sizeof *v, cmp_id);
    int k = 1;
    for (int i = 1; i < n; i++)
        if (v[i] != v[k - 1]) v[k++] = v[i];
    return k;
}

/* Lost nodes, devices of exited tasks, stopped jobs requeued or failed.
 * The last two look only at the tasks and jobs that changed since the
 * previous upkeep (the change log; everything on its first run, after a
 * gap, or when a node was lost in this one). */
static int upkeep(db *d, mirror *m, const sched_config *cfg, int64_t now, sched_pass_stats *st)
{
    uint64_t seq;
    int64_t *ctasks = NULL, *cjobs = NULL;
    int nct = 0, ncj = 0;
    int scan = upkeep_changes(d, m, &seq, &ctasks, &nct, &cjobs, &ncj);
    if (db_begin(d) < 0) { free(ctasks); free(cjobs); return -1; }
    int64_t *lost = NULL, *jobs = NULL;
    cl_reaped *rp = NULL;
    int n = now < cfg->node_loss_not_before_ms ? 0
                                               : cluster_nodes_mark_lost(d, now - cfg->heartbeat_timeout_ms, &lost);
    if (n < 0) goto fail;
    st->lost_nodes = n;
    if (n > 0) scan = 1; /* their tasks exit in this transaction */
    for (int i = 0; i < n; i++) {
        char why[CL_REASON_MAX];
        sfmt(why, sizeof why, "node %lld lost (no heartbeat for %llds)", (long long)lost[i],
             (long long)(cfg->heartbeat_timeout_ms / 1000));
        log_warn("scheduler: %s", why);
        int nj = cluster_node_tasks_lost(d, lost[i], why, now, &jobs);
        if (nj < 0) goto fail;
        for (int x = 0; x < nj; x++) {
            if (jobs[x] < 0) {   /* an evaluator: never the gang's failure */
                char ev[CL_REASON_MAX + 32];
                sfmt(ev, sizeof ev, "evaluator failed: %s", why);
                if (store_event_add(d, -jobs[x], "evaluator", "scheduler", ev) != STORE_OK) goto fail;
                continue;
            }
            if (cluster_failure_add(d, jobs[x], lost[i]) < 0) goto fail;
            if (lifecycle_stop_tasks(d, jobs[x], why) != STORE_OK) goto fail;
            if (store_event_add(d, jobs[x], "node_lost", "scheduler", why) != STORE_OK) goto fail;
        }
        free(jobs); jobs = NULL;
    }
    int nr;
    if (scan) {
        nr = cluster_jobs_all_exited(d, &rp);
    } else {
        /* the jobs of the tasks that changed, and the jobs that did */
        nct = uniq_ids(ctasks, nct);
        int found = cluster_jobs_of_tasks(d, ctasks, nct, cjobs + ncj);
        if (found < 0) goto fail;
        ncj = uniq_ids(cjobs, ncj + found);
        nr = cluster_jobs_all_exited_of(d, cjobs, ncj, &rp);
    }
    if (nr < 0) goto fail;
    for (int x = 0; x < nr; x++) {
        const cl_reaped *r = &rp[x];
        if (!r->reason[0]) continue;      /* a normal end: the task API decides */
        char why[CL_REASON_MAX + 96];
        int rc;
        if (strncmp(r->reason, "preempted", 9) == 0 || strncmp(r->reason, "resize", 6) == 0) {
            /* a preemption or a resize: requeued without using the restart budget;
             * a resize says only what was decided (its tasks' exits are theirs) */
            const char *cut = strncmp(r->reason, "resize", 6) == 0 ? strstr(r->reason, "; ") : NULL;
            int len = cut ? (int)(cut - r->reason) : (int)strlen(r->reason);
            sfmt(why, sizeof why, "%.*s; requeued", len, r->reason);
            rc = store_job_transition(d, r->job_id, FROM_ACTIVE, "queued", "scheduler", why);
            st->requeued += rc == STORE_OK;
        } else if (strncmp(r->reason, "max_runtime", 11) == 0) {
            rc = store_job_transition(d, r->job_id, FROM_ACTIVE, "failed", "scheduler", r->reason);
            st->failed += rc == STORE_OK;
        } else {
            int requeued = 0;
            rc = lifecycle_attempt_failed(d, r->job_id, r->reason, "scheduler", &requeued);
            st->requeued += rc == STORE_OK && requeued;
            st->failed += rc == STORE_OK && !requeued;
        }
        if (rc == STORE_ERROR) goto fail;
    }
    if ((scan ? cluster_release_exited(d) : cluster_release_exited_tasks(d, ctasks, nct)) < 0) goto fail;
    free(rp); free(lost); free(ctasks); free(cjobs);
    if (db_commit(d) < 0) return -1;
    m->upkeep_seq = seq;
    m->upkeep_follows = 1;
    return 0;
fail:
    db_rollback(d);
    free(rp); free(lost); free(jobs); free(ctasks); free(cjobs);
    return -1;
}

/* ================================================================ apply */

static const char SQL_SAVEPOINT[] = "SAVEPOINT place";
static const char SQL_RELEASE[] = "RELEASE place";
static const char SQL_ROLLBACK_TO[] = "ROLLBACK TO place";

static int exec1(db *d, const char *sql)
{
    db_stmt *st = db_prepare(d, sql);
    if (!st) return -1;
    int rc = db_step(st);
    db_done(st);
    return rc == DB_DONE ? 0 : -1;
}

static const char *hostname_of(const snap *sp, int node)
{
    return sp->m->nodes[node].row.hostname;
}

/* The timeline's words for a placement: "placed on HOSTS[ with N workers
 * (elastic A-B)][ by backfill]". */
static void place_why(const snap *sp, const sched_result *r, const sched_place *pl, char *why, size_t cap)
{
    const cl_job *j = sp->q_job[pl->job];
    buf b;
    buf_init(&b, cap - 64);
    int seen[16], ns = 0;
    for (int t = pl->task_off; t < pl->task_off + pl->n_tasks; t++) {
        int i = r->tasks[t].node, dup = 0;
        for (int k = 0; k < ns; k++) dup |= seen[k] == i;
        if (dup) continue;
        if (ns < 16) seen[ns++] = i;
        if (buf_printf(&b, "%s%s", b.len ? ", " : "", hostname_of(sp, i)) < 0) break;
    }
    int elastic = j->workers_min > 0 && j->workers_min < j->workers;
    char size[96] = "";
    if (elastic)
        sfmt(size, sizeof size, " with %d worker%s (elastic %d-%d)", pl->workers, pl->workers == 1 ? "" : "s",
             j->workers_min, j->workers);
    sfmt(why, cap, "placed on %s%s%s", b.data ? b.data : "", size, pl->backfill ? " by backfill" : "");
    buf_release(&b);
}

/* An elastic job started at another size than it ran with: its timeline
 * says so. 0 or -1. */
static int place_resize_event(db *d, const cl_job *j, const sched_place *pl)
{
    int elastic = j->workers_min > 0 && j->workers_min < j->workers;
    if (!elastic || j->resize_to <= 0 || pl->workers == j->workers_now) return 0;
    char what[160];
    sfmt(what, sizeof what, "%s to %d worker%s (from %d)", pl->workers > j->workers_now ? "grown" : "shrunk",
         pl->workers, pl->workers == 1 ? "" : "s", j->workers_now);
    return store_event_add(d, j->id, "resize", "scheduler", what) == STORE_OK ? 0 : -1;
}

/* Placements a statement (the first pass after a start places thousands) */
#define PLACE_BATCH 256

/* Places the pass's jobs, PLACE_BATCH a statement (cluster_place_many:
 * PostgreSQL, where each statement is a round trip): placed[p] 1 done, 0
 * skipped (the job changed, or a device is held or gone: nothing of it
 * written). 0, -1 on error; -2 when the store writes step by step
 * (apply_place). */
static int apply_place_all(db *d, const snap *sp, const sched_result *r, int64_t now, char *placed)
{
    if (!cluster_batches_writes(d)) return -2;
    if (r->n_place == 0) return 0;
    cl_place_job *jobs = xcalloc((size_t)r->n_place, sizeof *jobs);
    cl_place_task *tasks = xcalloc((size_t)r->n_tasks + 1, sizeof *tasks);
    char (*why)[512] = xcalloc((size_t)r->n_place, sizeof *why);
    for (int p = 0; p < r->n_place; p++) {
        const sched_place *pl = &r->place[p];
        for (int k = 0; k < pl->n_tasks; k++) {
            const sched_task *tk = &r->tasks[pl->task_off + k];
            tasks[pl->task_off + k] =
                (cl_place_task){tk->type ? "ps" : "worker", tk->index, tk->node_id, tk->port, tk->mem_mb,
                                tk->kind == SCHED_GPU ? tk->n_dev : 0, tk->kind == SCHED_CPU ? tk->n_dev : 0,
                                &r->dev_ids[tk->dev_off], tk->n_dev};
        }
        place_why(sp, r, pl, why[p], sizeof why[p]);
        jobs[p] = (cl_place_job){sp->q_job[pl->job]->id, why[p], pl->workers, &tasks[pl->task_off], pl->n_tasks, 0};
    }
    int rc = 0;
    for (int p = 0; p < r->n_place && rc >= 0; p += PLACE_BATCH)
        rc = cluster_place_many(d, jobs + p, r->n_place - p < PLACE_BATCH ? r->n_place - p : PLACE_BATCH, now);
    for (int p = 0; p < r->n_place; p++) placed[p] = jobs[p].attempt > 0;
    free(jobs);
    free(tasks);
    free(why);
    return rc < 0 || fault_point() < 0 ? -1 : 0;
}

/* Places one job a statement at a time (under the caller's savepoint): 0
 * done, 1 skipped (the store changed: the caller rolls back to its
 * savepoint), -1 error. */
static int apply_place(db *d, const snap *sp, const sched_result *r, const sched_place *pl, int64_t now)
{
    const cl_job *j = sp->q_job[pl->job];
    char why[512];
    place_why(sp, r, pl, why, sizeof why);
    static const char *const from_q[] = {"queued", NULL};
    int rc = store_job_transition(d, j->id, from_q, "starting", "scheduler", why);
    if (rc == STORE_CONFLICT || rc == STORE_NOT_FOUND) return 1;
    if (rc != STORE_OK || fault_point() < 0) return -1;
    int attempt = cluster_job_next_attempt(d, j->id, now);
    if (attempt < 0 || fault_point() < 0) return -1;
    if (cluster_job_set_size(d, j->id, pl->workers, 0) < 0) return -1;
    if (place_resize_event(d, j, pl) < 0) return -1;
    for (int t = pl->task_off; t < pl->task_off + pl->n_tasks; t++) {
        const sched_task *tk = &r->tasks[t];
        int64_t task_id = 0;
        /* the devices it is given below, counted on the task for usage accounting */
        int gpus = tk->kind == SCHED_GPU ? tk->n_dev : 0, cpus = tk->kind == SCHED_CPU ? tk->n_dev : 0;
        if (cluster_task_insert(d, j->id, attempt, tk->type ? "ps" : "worker", tk->index, tk->node_id,
                                tk->port, tk->mem_mb, gpus, cpus, now, &task_id) < 0)
            return -1;
        if (fault_point() < 0) return -1;
        for (int x = 0; x < tk->n_dev; x++) {
            int arc = cluster_alloc_insert(d, r->dev_ids[tk->dev_off + x], task_id, j->id);
            if (arc != 0) return arc;
            if (fault_point() < 0) return -1;
        }
    }
    return 0;
}

/* Team usage is written at most once a second (it is an integral over
 * time: a later write covers the gap), and at once when the pass changes
 * what runs. */
#define USAGE_EVERY_MS 1000

/* Whether the pass's main transaction has anything to write: placements,
 * stops, a job past its max_runtime_s, team usage due. When not, no write
 * transaction is opened (writers never queue behind an empty pass). */
static int apply_needed(const snap *sp, const sched_result *r, int64_t now)
{
    if (r->n_place > 0 || r->n_stops > 0 || r->n_grows > 0) return 1;
    for (int x = 0; x < sp->s.n_running; x++) {
        const sched_running *v = &sp->s.running[x];
        if (!v->stopping && sp->run_job[x]->attempt_started_at && now > v->end_ms) return 1;
    }
    for (int t = 0; t < sp->s.n_teams; t++)
        if (now - sp->m->teams[t].usage_at >= USAGE_EVERY_MS) return 1;
    return 0;
}

/* Waiting reasons that changed, REASON_BATCH rows per write transaction: a
 * submission waits for one short batch, never for the reasons of a whole
 * queue (10,000 new jobs write 10,000 rows). They go before the placements,
 * so a failure here fails the pass before anything is placed; the last
 * batch shares the placements' transaction (one commit fewer a pass: a
 * failure in either rolls back both). A reason is only written to a job
 * still queued (the SQL checks), so a job placed or cancelled meanwhile
 * keeps its own. */
#define REASON_BATCH 128

/* Whether two waiting outcomes read the same (sched_reason_format words
 * why, kind, a, b, c; rank, estimated start and aged priority are not in
 * the text). A field the wording comes to use belongs here too:
 * queue_order_exact compares the reasons written with this shortcut and
 * without it (sched_full_load). */
static int same_wording(const sched_outcome *x, const sched_outcome *y)
{
    return x->why == y->why && x->kind == y->kind && x->a == y->a && x->b == y->b && x->c == y->c &&
           (x->place >= 0) == (y->place >= 0);
}

typedef struct reason_row {
    int slot;
    int64_t id;
    sched_outcome o;
    char why[CL_REASON_MAX];
} reason_row;

/* A batch's reasons in one statement (cluster_batches_writes: PostgreSQL). */
static int reasons_write(db *d, const reason_row *rows, int n)
{
    int64_t ids[REASON_BATCH];
    const char *whys[REASON_BATCH];
    for (int k = 0; k < n; k++) {
        ids[k] = rows[k].id;
        whys[k] = rows[k].why;
    }
    return cluster_jobs_set_reasons(d, ids, whys, n) < 0 || fault_point() < 0 ? -1 : 0;
}

/* A batch committed: the mirror's rows take the reasons written (what a
 * refresh will read back), and remember the outcome they word. */
static void reasons_committed(mirror *m, const reason_row *rows, int n)
{
    for (int k = 0; k < n; k++) {
        cl_job *j = &m->slots[rows[k].slot].row;
        sfmt(j->reason, sizeof j->reason, "%s", rows[k].why);
        m->said[rows[k].slot].o = rows[k].o;
        m->said[rows[k].slot].ok = 1;
    }
}

/* keep_open: the pass's main transaction follows, so the last batch is
 * left open for it to join (one commit fewer a pass); its rows go to
 * *kept (*n_kept; the caller calls reasons_committed after its commit and
 * frees them), and the transaction is open on return when there was
 * anything to write. */
static int write_reasons(db *d, const snap *sp, const sched_result *r, sched_pass_stats *st, int keep_open,
                         reason_row **kept, int *n_kept)
{
    *kept = NULL;
    *n_kept = 0;
    mirror *m = sp->m;
    int cache = !__atomic_load_n(&g_full_load, __ATOMIC_SEQ_CST);
    reason_row *batch = xmalloc(REASON_BATCH * sizeof *batch);
    char why[CL_REASON_MAX];
    int in_txn = 0, rows = 0, many = cluster_batches_writes(d);
    for (int q = 0; q < sp->s.n_queued; q++) {
        const sched_outcome *o = &r->out[q];
        if (o->place >= 0) continue;
        st->waiting++;
        struct mirror_said *said = &m->said[sp->q_slot[q]];
        if (cache && said->ok && same_wording(&said->o, o)) continue; /* its reason says this already */
        sched_reason_format(o, why, sizeof why);
        const cl_job *j = sp->q_job[q];
        if (strcmp(j->reason, why) == 0) {
            said->o = *o;
            said->ok = 1;
            continue;
        }
        if (!in_txn) {
            if (db_begin(d) < 0) goto out;
            in_txn = 1;
        }
        if (!many && (cluster_job_set_reason(d, j->id, why) < 0 || fault_point() < 0)) goto fail;
        st->reasons++;
        batch[rows].slot = sp->q_slot[q];
        batch[rows].id = j->id;
        batch[rows].o = *o;
        memcpy(batch[rows].why, why, sizeof why);
        if (++rows == REASON_BATCH) {
            if (many && reasons_write(d, batch, rows) < 0) goto fail;
            in_txn = 0;
            if (db_commit(d) < 0) goto out;
            reasons_committed(m, batch, rows);
            rows = 0;
        }
    }
    if (in_txn) {
        if (many && rows && reasons_write(d, batch, rows) < 0) goto fail;
        if (!keep_open) {
            in_txn = 0;
            if (db_commit(d) < 0) goto out;
            reasons_committed(m, batch, rows);
            rows = 0;
        }
    }
    /* elastic jobs running below their most workers: why they do not grow
     * (written when it changes; the refresh reads the row back) */
    for (int x = 0; x < sp->s.n_running; x++) {
        const sched_running *v = &sp->s.running[x];
        const cl_job *j = sp->run_job[x];
        if (v->workers_min <= 0 || v->workers_now >= v->workers_max || v->stopping ||
            strcmp(j->state, "running") != 0)
            continue;
        int grows = 0;
        for (int g = 0; g < r->n_grows; g++) grows |= r->grows[g].running == x;
        if (grows) continue;
        const char *k = v->kind == SCHED_GPU ? "gpus" : "cpu slots";
        char tail[96];
        if (v->kind >= 0 && v->kind < SCHED_KINDS && r->starving[v->kind])
            sfmt(tail, sizeof tail, "queued jobs wait for %s", k);
        else if (!v->may_grow)
            sfmt(tail, sizeof tail, "it may grow once its attempt has run the resize interval");
        else
            sfmt(tail, sizeof tail, "no free %s to grow into", k);
        sfmt(why, sizeof why, "running %d of %d-%d workers: %s", v->workers_now, v->workers_min, v->workers_max,
             tail);
        if (strcmp(j->reason, why) == 0) continue;
        if (!in_txn) {
            if (db_begin(d) < 0) goto out;
            in_txn = 1;
        }
        if (cluster_job_set_running_reason(d, j->id, why) < 0) goto fail;
    }
    if (in_txn && keep_open) {
        *kept = batch;
        *n_kept = rows;
        return 0;
    }
    if (in_txn) {
        in_txn = 0;
        if (db_commit(d) < 0) goto out;
    }
    free(batch);
    return 0;
fail:
    db_rollback(d);
out:
    free(batch);
    return -1;
}

/* Node's agent has new tasks to start: told once the transaction commits
 * (db_wake_node; the server wakes its parked long-poll). */
static void wake_add(db *d, sched_pass_stats *st, int64_t node)
{
    db_wake_node(d, node);
    st->woken++;
}

/* A user's usage in its team at now, holding uu->devices: its row decayed
 * to the team's previous write, then the devices billed from there, as the
 * team's are (a row is written only while its user holds devices: before
 * the team's previous write it held none). */
static double user_usage_now(const mirror *m, const cl_team *tm, const sched_user_use *uu, int64_t now, double tau)
{
    double u = 0;
    int64_t at = 0;
    int lo = 0, hi = m->n_uusage - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        const cl_user_usage *x = &m->uusage[mid];
        if (x->team_id == tm->id && x->user_id == uu->user) { u = x->usage; at = x->usage_at; break; }
        if (x->team_id < tm->id || (x->team_id == tm->id && x->user_id < uu->user)) lo = mid + 1;
        else hi = mid - 1;
    }
    int64_t busy_from = tm->usage_at > 0 ? tm->usage_at : now;
    if (at > 0 && at < busy_from) u = sched_usage_decay(u, 0, (double)(busy_from - at) / 1000.0, tau);
    if (at > busy_from) busy_from = at;
    return sched_usage_decay(u, uu->devices, (double)(now - busy_from) / 1000.0, tau);
}

static int apply(db *d, const sched_config *cfg, snap *sp, const sched_result *r, int64_t now,
                 sched_pass_stats *st)
{
    /* the last batch of reasons and the decisions: one transaction */
    int needed = apply_needed(sp, r, now);
    reason_row *kept = NULL;
    int n_kept = 0;
    char *placed = NULL;
    if (write_reasons(d, sp, r, st, needed, &kept, &n_kept) < 0) return -1;
    if (!needed) return 0;
    if (!db_in_tx(d) && db_begin(d) < 0) return -1;
    char why[CL_REASON_MAX];
    int changed = r->n_place > 0 || r->n_stops > 0 || r->n_grows > 0;
    /* placements: all in one statement where the store does that (it
     * writes each job all or nothing), else each under a savepoint */
    placed = xcalloc((size_t)r->n_place + 1, 1);
    int all = apply_place_all(d, sp, r, now, placed);
    if (all == -1) goto fail;
    for (int p = 0; p < r->n_place; p++) {
        const sched_place *pl = &r->place[p];
        int rc = placed[p] ? place_resize_event(d, sp->q_job[pl->job], pl) : 1;
        if (all == -2) {
            if (exec1(d, SQL_SAVEPOINT) < 0) goto fail;
            size_t notes = db_notes_mark(), changes = db_changes_mark(d);
            rc = apply_place(d, sp, r, pl, now);
            if (rc > 0) {
                if (exec1(d, SQL_ROLLBACK_TO) < 0) goto fail;
                db_notes_rewind(notes);
                db_changes_rewind(d, changes);
            }
            if (rc >= 0 && exec1(d, SQL_RELEASE) < 0) goto fail;
        }
        if (rc < 0) goto fail;
        if (rc > 0) {
            st->conflicts++;
            continue;
        }
        st->placed++;
        st->backfilled += pl->backfill;
        for (int t = pl->task_off; t < pl->task_off + pl->n_tasks; t++) wake_add(d, st, r->tasks[t].node_id);
    }
    /* preemption: ask whole gangs to stop; devices are freed when they exit */
    for (int x = 0; x < r->n_stops; x++) {
        const sched_victim *sp_ = &r->stops[x];
        const sched_running *v = &sp->s.running[sp_->running];
        const cl_job *h = NULL;
        for (int q = 0; q < sp->s.n_queued; q++) if (sp->s.queued[q].id == sp_->for_job) h = sp->q_job[q];
        const cl_job *vj = sp->run_job[sp_->running];
        int ht = h ? mirror_find_team(sp->m, h->team_id) : -1;
        if (sp_->shrink_to > 0 && sp_->guarantee)
            sfmt(why, sizeof why, "resize: shrinking to %d worker%s for job %lld: team %s's guarantee",
                 sp_->shrink_to, sp_->shrink_to == 1 ? "" : "s", (long long)sp_->for_job,
                 ht >= 0 ? sp->m->teams[ht].name : "?");
        else if (sp_->shrink_to > 0 && sp_->lend)
            sfmt(why, sizeof why, "resize: shrinking to %d worker%s for job %lld, which waits for what it grew into",
                 sp_->shrink_to, sp_->shrink_to == 1 ? "" : "s", (long long)sp_->for_job);
        else if (sp_->shrink_to > 0)
            sfmt(why, sizeof why, "resize: shrinking to %d worker%s for job %lld (priority %d over %d)",
                 sp_->shrink_to, sp_->shrink_to == 1 ? "" : "s", (long long)sp_->for_job, h ? h->priority : 0,
                 v->priority);
        else if (sp_->guarantee)
            sfmt(why, sizeof why, "preempted for job %lld: its team reclaims its guarantee",
                 (long long)sp_->for_job);
        else
            sfmt(why, sizeof why, "preempted for job %lld (priority %d over %d)", (long long)sp_->for_job,
                 h ? h->priority : 0, v->priority);
        if (lifecycle_stop_tasks(d, v->id, why) != STORE_OK || fault_point() < 0) goto fail;
        if (sp_->shrink_to > 0 && cluster_job_set_size(d, v->id, vj->workers_now, sp_->shrink_to) < 0) goto fail;
        if (store_event_add(d, v->id, sp_->shrink_to > 0 ? "resize" : "preempt", "scheduler", why) != STORE_OK ||
            fault_point() < 0)
            goto fail;
        st->stopped++;
    }
    /* elastic jobs growing into free devices: stopped at a step boundary,
     * placed again with more workers */
    for (int x = 0; x < r->n_grows; x++) {
        const sched_grow *g = &r->grows[x];
        const sched_running *v = &sp->s.running[g->running];
        sfmt(why, sizeof why, "resize: growing from %d to %d workers: %d %s%s free and no job waiting for %s",
             g->from, g->to, g->free_devices, v->kind == SCHED_GPU ? "gpu" : "cpu slot",
             g->free_devices == 1 ? "" : "s", g->free_devices == 1 ? "it" : "them");
        if (lifecycle_stop_tasks(d, v->id, why) != STORE_OK || fault_point() < 0) goto fail;
        if (cluster_job_set_size(d, v->id, g->from, g->to) < 0) goto fail;
        if (store_event_add(d, v->id, "resize", "scheduler", why) != STORE_OK) goto fail;
        st->stopped++;
    }
    /* max_runtime_s */
    for (int x = 0; x < sp->s.n_running; x++) {
        const sched_running *v = &sp->s.running[x];
        const cl_job *j = sp->run_job[x];
        if (v->stopping || !j->attempt_started_at || now <= v->end_ms) continue;
        sfmt(why, sizeof why, "max_runtime_s (%lld) exceeded", (long long)j->max_runtime_s);
        if (lifecycle_stop_tasks(d, v->id, why) != STORE_OK || fault_point() < 0) goto fail;
        if (store_event_add(d, v->id, "stop", "scheduler", why) != STORE_OK) goto fail;
        st->stopped++;
        changed = 1;
    }
    /* team usage: decayed device-seconds; then the users' within their
     * teams, for the same interval, for each user holding devices */
    double *inuse = xcalloc((size_t)sp->s.n_teams + 1, sizeof(double));
    for (int x = 0; x < sp->s.n_running; x++) inuse[sp->s.running[x].team] += sp->s.running[x].devices;
    for (int t = 0; t < sp->s.n_teams; t++) {
        const cl_team *tm = &sp->m->teams[t];
        if (tm->usage_at >= now || (!changed && now - tm->usage_at < USAGE_EVERY_MS)) continue;
        double dt = tm->usage_at > 0 ? (double)(now - tm->usage_at) / 1000.0 : 0;
        double u = sched_usage_decay(tm->usage, inuse[t], dt, cfg->usage_window_s);
        if (cluster_team_set_usage(d, tm->id, u, now) < 0) { free(inuse); goto fail; }
    }
    free(inuse);
    for (int x = 0; x < r->n_user_use; x++) {
        const sched_user_use *uu = &r->user_use[x];
        const cl_team *tm = &sp->m->teams[uu->team];
        if (tm->usage_at >= now || (!changed && now - tm->usage_at < USAGE_EVERY_MS)) continue;
        if (cluster_user_set_usage(d, tm->id, uu->user, user_usage_now(sp->m, tm, uu, now, cfg->usage_window_s),
                                   now) < 0)
            goto fail;
    }
    if (fault_point() < 0) goto fail;
    if (db_commit(d) < 0) {
        free(kept);
        free(placed);
        return -1;
    }
    reasons_committed(sp->m, kept, n_kept);
    free(kept);
    free(placed);
    return 0;
fail:
    db_rollback(d);
    free(kept);
    free(placed);
    return -1;
}

/* ================================================================ evaluators */

/* Places the evaluator side-car of every active job that wants one and whose
 * attempt has none yet, after the gangs (never part of their all-or-nothing
 * placement: a gang starts without its evaluator when no node has the
 * memory, and the evaluator follows in a later pass when room appears).
 * Reads its own small view of the nodes' memory, so the gangs this pass
 * placed are counted. 0, or -1 on a store error (rolled back). */
static int place_evaluators(db *d, int64_t now, sched_pass_stats *st)
{
    cl_eval_want *w = NULL;
    cl_eval_node *cn = NULL;
    sched_eval_node *en = NULL;
    int *node_of = NULL;         /* per want: the node index chosen, -1 a waiting event to write, -2 nothing */
    int64_t *mem_of = NULL;
    char (*why)[CL_REASON_MAX] = NULL;
    int nw = cluster_evaluators_wanted(d, &w);
    if (nw <= 0) return nw;
    int nn = cluster_eval_nodes(d, &cn);
    if (nn < 0) { free(w); return -1; }
    en = xcalloc((size_t)nn + 1, sizeof *en);
    node_of = xcalloc((size_t)nw, sizeof *node_of);
    mem_of = xcalloc((size_t)nw, sizeof *mem_of);
    why = xcalloc((size_t)nw, sizeof *why);
    for (int i = 0; i < nn; i++)
        en[i] = (sched_eval_node){cn[i].id, cn[i].ready, cn[i].cpu_slots, cn[i].memory_mb, cn[i].used_mb};
    /* decide first (reads only), so a pass with nothing to write opens no write transaction */
    int writes = 0;
    for (int x = 0; x < nw; x++) {
        sched_eval_want want = {w[x].job_id, w[x].memory_mb, w[x].chief_node, w[x].n_avoid, w[x].avoid};
        node_of[x] = sched_place_evaluator(en, nn, &want, &mem_of[x]);
        if (node_of[x] >= 0) {
            sfmt(why[x], sizeof why[x], "evaluator placed on %s (attempt %d)", cn[node_of[x]].hostname,
                 w[x].attempt);
            writes++;
            continue;
        }
        /* no room now: a later pass tries again; the timeline says so once an attempt */
        int c = -1;
        for (int k = 0; k < nn; k++)
            if (cn[k].id == w[x].chief_node) c = k;
        if (c >= 0)
            sfmt(why[x], sizeof why[x], "evaluator waits: %lld MiB for it on %s, and no ready node has that free;"
                 " the gang runs without it (attempt %d)", (long long)sched_eval_need(&en[c], &want),
                 cn[c].hostname, w[x].attempt);
        else
            sfmt(why[x], sizeof why[x], "evaluator waits: no ready node has the memory for it; the gang runs"
                 " without it (attempt %d)", w[x].attempt);
        int seen = cluster_event_exists(d, w[x].job_id, "evaluator", why[x]);
        if (seen < 0) goto fail_nolock;
        node_of[x] = seen ? -2 : -1;
        writes += !seen;
    }
    if (writes == 0) goto done;
    if (db_begin(d) < 0) goto fail_nolock;
    for (int x = 0; x < nw; x++) {
        if (node_of[x] == -2) continue;
        if (node_of[x] >= 0) {
            int i = node_of[x];
            int rc = cluster_evaluator_insert(d, w[x].job_id, w[x].attempt, cn[i].id, mem_of[x], now);
            if (rc < 0 || fault_point() < 0) goto fail;
            if (rc > 0) continue;           /* the job moved on meanwhile */
            wake_add(d, st, cn[i].id);
        }
        if (store_event_add(d, w[x].job_id, "evaluator", "scheduler", why[x]) != STORE_OK) goto fail;
    }
    if (db_commit(d) < 0) goto fail;
done:
    free(w); free(cn); free(en); free(node_of); free(mem_of); free(why);
    return 0;
fail:
    db_rollback(d);
fail_nolock:
    free(w); free(cn); free(en); free(node_of); free(mem_of); free(why);
    return -1;
}

/* ================================================================ the pass
 * A pass decides, then binds. Deciding: the upkeep, the mirror's refresh,
 * the core's snapshot and the core, all under the mirror's lock. Binding:
 * the decisions committed (apply, then the evaluators). sched_pass does both
 * in its caller's thread. sched_pass_async hands the binding to a thread of
 * its own and returns once decided, as kube-scheduler binds a pod after its
 * scheduling cycle: the caller goes on (the scheduler thread to its gap, a
 * bench to its churn) while the store commits. The mirror stays the
 * binding's (busy) until it is done: the next pass, an admission or a queue
 * view waits for it when it takes the lock, so the mirror is never ahead of
 * the store nor read while the binding writes the reasons into it. */

typedef struct bind_job {
    db *d;
    mirror *m;
    sched_config cfg;
    int64_t now;
    snap sp;
    sched_result r;
    sched_pass_stats st;
    double t0;                /* mono_s when the pass began */
    pthread_t th;
    int joinable;             /* run by a thread of its own, not yet joined */
    int rc;                   /* 0 committed, -1 failed (rolled back) */
    int collected;            /* its outcome was handed out (sched_bind_wait, sched_pass_async) */
} bind_job;

static void bind_free(bind_job *bj)
{
    if (!bj) return;
    sched_result_release(&bj->r);
    snap_release(&bj->sp);
    free(bj);
}

/* The mirror's lock is held; a binding, if any, is done: its thread joined.
 * Its record is left for its outcome to be taken. */
static void bind_reap(mirror *m)
{
    while (m->busy) pthread_cond_wait(&m->idle, &m->mu);
    bind_job *bj = m->bind;
    if (bj && bj->joinable) {
        pthread_join(bj->th, NULL);
        bj->joinable = 0;
    }
}

/* Decides (the mirror's lock held): 0, or -1 on a store error. */
static int decide(bind_job *bj)
{
    db *d = bj->d;
    mirror *m = bj->m;
    sched_pass_stats *st = &bj->st;
    const sched_config *cfg = &bj->cfg;
    int64_t now = bj->now;
    mirror_stats ms;
    uint64_t rt0 = db_round_trips();
    if (upkeep(d, m, cfg, now, st) < 0) { log_error("scheduler: upkeep failed"); return -1; }
    double tu = mono_s();
    uint64_t rt1 = db_round_trips();
    if (mirror_sync(m, d, &ms) < 0) return -1;
    double tm = mono_s();
    uint64_t rt2 = db_round_trips();
    snap_build(m, now, cfg->usage_window_s, &bj->sp);
    snap *sp = &bj->sp;
    for (int x = 0; x < sp->s.n_running; x++) {
        sched_running *v = &sp->run[x];
        const cl_job *j = sp->run_job[x];
        v->may_grow = v->workers_min > 0 && !v->stopping && strcmp(j->state, "running") == 0 &&
                      j->attempt_started_at > 0 && now - j->attempt_started_at >= cfg->resize_interval_ms;
    }
    double t1 = mono_s();
    if (sched_pass_core(&sp->s, cfg, &bj->r) < 0) { log_error("scheduler: malformed snapshot"); return -1; }
    double t2 = mono_s();
    st->rt_upkeep = (int)(rt1 - rt0); st->rt_refresh = (int)(rt2 - rt1);
    st->load_ms = (t1 - bj->t0) * 1000; st->core_ms = (t2 - t1) * 1000;
    st->upkeep_ms = (tu - bj->t0) * 1000; st->refresh_ms = (tm - tu) * 1000; st->build_ms = (t1 - tm) * 1000;
    st->full_load = ms.full;
    st->rows_read = ms.nodes + ms.devices + ms.jobs;
    st->decided = bj->r.n_place;
    return 0;
}

/* Binds what was decided (in whichever thread runs it; the mirror is the
 * binding's): 0, or -1 on a store error (rolled back). */
static int bind(bind_job *bj)
{
    db *d = bj->d;
    sched_pass_stats *st = &bj->st;
    double t2 = mono_s(), c2 = thread_cpu_s();
    uint64_t rt2 = db_round_trips();
    int rc = 0;
    if (apply(d, &bj->cfg, &bj->sp, &bj->r, bj->now, st) < 0) {
        log_error("scheduler: apply failed, rolled back");
        rc = -1;
    } else if (place_evaluators(d, bj->now, st) < 0) {
        log_error("scheduler: evaluator placement failed, rolled back");
        rc = -1;
    }
    double t3 = mono_s();
    st->rt_apply = (int)(db_round_trips() - rt2);
    st->apply_ms = (t3 - t2) * 1000;
    st->bound_ms = (t3 - bj->t0) * 1000;
    st->bind_cpu_ms = (thread_cpu_s() - c2) * 1000;
    if (rc == 0 && (st->placed || st->stopped || st->requeued || st->failed || st->lost_nodes))
        log_debug("scheduler: placed %d (backfill %d), stopped %d, requeued %d, failed %d, lost nodes %d,"
                 " waiting %d; load %.1f ms, core %.1f ms, apply %.1f ms",
                 st->placed, st->backfilled, st->stopped, st->requeued, st->failed, st->lost_nodes, st->waiting,
                 st->load_ms, st->core_ms, st->apply_ms);
    sched_result_release(&bj->r);
    snap_release(&bj->sp);
    bj->rc = rc;
    return rc;
}

static void *bind_main(void *arg)
{
    bind_job *bj = arg;
    pthread_setname_np(pthread_self(), "ty-bind");
    bind(bj);
    mirror *m = bj->m;
    pthread_mutex_lock(&m->mu);
    m->busy = 0;
    pthread_cond_broadcast(&m->idle);
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

static bind_job *bind_new(db *d, mirror *m, const sched_config *cfg, int64_t now, double t0)
{
    bind_job *bj = xcalloc(1, sizeof *bj);
    bj->d = d;
    bj->m = m;
    bj->cfg = *cfg;
    bj->now = now;
    bj->t0 = t0;
    sched_result_init(&bj->r);
    return bj;
}

static void bind_drop(mirror *m)
{
    bind_free(m->bind);
    m->bind = NULL;
}

/* The mirror's lock held and no binding running: the last binding's record
 * is dropped; its outcome into *prev and *prev_rc when not yet handed out
 * (else they are left alone). */
static void bind_take(mirror *m, sched_pass_stats *prev, int *prev_rc)
{
    bind_job *bj = m->bind;
    if (bj && !bj->collected) {
        if (prev) *prev = bj->st;
        if (prev_rc) *prev_rc = bj->rc;
    }
    bind_drop(m);
}

int sched_pass(db *d, const sched_config *cfg, int64_t now, sched_pass_stats *out)
{
    double t0 = mono_s();
    mirror *m = mirror_lock(d);
    if (!m) {
        if (out) memset(out, 0, sizeof *out);
        return -1;
    }
    bind_job *bj = bind_new(d, m, cfg, now, t0);
    int ret = decide(bj) < 0 ? -1 : bind(bj);
    if (out) *out = bj->st;
    bind_free(bj);
    mirror_give(m);
    return ret;
}

int sched_pass_async(db *d, const sched_config *cfg, int64_t now, sched_pass_stats *out, sched_pass_stats *prev,
                     int *prev_rc)
{
    double t0 = mono_s();
    if (prev_rc) *prev_rc = 1;
    mirror *m = mirror_lock(d); /* waits for the previous binding */
    if (!m) {
        if (out) memset(out, 0, sizeof *out);
        return -1;
    }
    bind_take(m, prev, prev_rc);
    bind_job *bj = bind_new(d, m, cfg, now, t0);
    bj->st.waited_ms = (mono_s() - t0) * 1000;
    if (decide(bj) < 0) {
        if (out) *out = bj->st;
        bind_free(bj);
        mirror_give(m);
        return -1;
    }
    if (out) *out = bj->st;
    m->bind = bj;
    m->busy = 1;
    if (pthread_create(&bj->th, NULL, bind_main, bj) != 0) {
        m->busy = 0; /* no thread: bound here */
        bind(bj);
    } else {
        bj->joinable = 1;
    }
    mirror_give(m);
    return 0;
}

int sched_bind_wait(db *d, sched_pass_stats *out)
{
    mirror *m = db_cache(d, DB_CACHE_MIRROR, NULL, NULL);
    if (!m) return 1;
    pthread_mutex_lock(&m->mu);
    bind_reap(m);
    bind_job *bj = m->bind;
    int rc = 1;
    if (bj && !bj->collected) {
        if (out) *out = bj->st;
        rc = bj->rc;
        bj->collected = 1;
    }
    pthread_mutex_unlock(&m->mu);
    return rc;
}

/* ================================================================ admission */

int sched_admit_job(db *d, const sched_job *job, char *msg, size_t cap)
{
    mirror *m;
    if (mirror_take(d, &m, NULL) < 0) return -1;
    /* what sched_admit reads: each node's devices per kind and memory */
    sched_node *nodes = xcalloc((size_t)m->n_nodes + 1, sizeof *nodes);
    for (int i = 0; i < m->n_nodes; i++) {
        const mirror_node *mn = &m->nodes[i];
        nodes[i].id = mn->row.id;
        nodes[i].ready = strcmp(mn->row.state, "ready") == 0;
        nodes[i].mem_mb = mn->row.memory_mb;
        nodes[i].runtimes = (mn->row.runtimes & CL_RUNTIME_HOST ? SCHED_RT_HOST : 0) |
                            (mn->row.runtimes & CL_RUNTIME_PODMAN ? SCHED_RT_PODMAN : 0);
        for (int x = 0; x < mn->n_dev; x++) nodes[i].n_dev[mn->dev[x].kind]++;
    }
    sched_snapshot s = {now_ms(), m->n_nodes, m->n_nodes, nodes, 0, NULL, 0, NULL, 0, NULL, 0, NULL};
    sched_outcome o;
    int rc = sched_admit(&s, job, &o);
    mirror_give(m);
    free(nodes);
    if (rc != 0) sched_reason_format(&o, msg, cap);
    return rc == 0 || o.why == SW_NO_NODES ? 0 : 1;
}

/* ================================================================ queue view */

int sched_queue_view(db *d, const sched_config *cfg, int64_t now, sched_queue_entry **out, int *n)
{
    *out = NULL; *n = 0;
    mirror *m;
    if (mirror_take(d, &m, NULL) < 0) return -1;
    snap sp;
    snap_build(m, now, cfg->usage_window_s, &sp);
    sched_result r;
    sched_result_init(&r);
    if (sched_pass_core(&sp.s, cfg, &r) < 0) { snap_release(&sp); mirror_give(m); return -1; }
    int nq = sp.s.n_queued;
    sched_queue_entry *e = xcalloc((size_t)nq + 1, sizeof *e);
    for (int k = 0; k < nq; k++) {
        int q = r.order[k];
        const sched_outcome *o = &r.out[q];
        const cl_job *j = sp.q_job[q];
        e[k].job_id = j->id;
        e[k].team_id = j->team_id;
        e[k].rank = k;
        e[k].priority = j->priority;
        e[k].eff_priority = o->eff_priority;
        e[k].queued_at_ms = j->queued_at;
        e[k].est_start_ms = o->est_start_ms;
        e[k].will_start = o->place >= 0;
        int t = mirror_find_team(m, j->team_id);
        sfmt(e[k].team, sizeof e[k].team, "%s", t >= 0 ? m->teams[t].name : "?");
        if (o->place >= 0) sfmt(e[k].reason, sizeof e[k].reason, "starting on the next pass");
        else sched_reason_format(o, e[k].reason, sizeof e[k].reason);
    }
    sched_result_release(&r);
    snap_release(&sp);
    mirror_give(m);
    *out = e; *n = nq;
    return 0;
}

/* ================================================================ thread */

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t th;
    int running, stop, kicked;
    db *d;
    sched_config cfg;
} g_sched = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, 0, NULL, {0}};

const double sched_pass_le[SCHED_PASS_NB] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                             0.05,   0.1,   0.25,   0.5,   1,    2.5};
static sched_thread_stats g_pass_stats; /* under g_sched.mu */

void sched_thread_stats_get(sched_thread_stats *out)
{
    pthread_mutex_lock(&g_sched.mu);
    *out = g_pass_stats;
    pthread_mutex_unlock(&g_sched.mu);
}

/* Kicks are coalesced: a pass starts at least twice the previous pass's
 * length (its decision, and the CPU time of the last binding it found done)
 * after the end of that pass (at most SCHED_GAP_MAX_MS later), so the
 * passes never take more than a third of a core, and a stream of submissions
 * to a long queue costs a pass per gap, not a pass per submission. A short
 * queue (passes of a millisecond) is scheduled at once, as before; so is a
 * kick after a quiet spell. */
#define SCHED_GAP_MIN_MS 0
#define SCHED_GAP_MAX_MS 250

static void deadline_in(struct timespec *ts, int64_t ms)
{
    clock_gettime(CLOCK_REALTIME, ts);
    int64_t ns = ts->tv_nsec + (ms % 1000) * 1000000;
    ts->tv_sec += ms / 1000 + ns / 1000000000;
    ts->tv_nsec = ns % 1000000000;
}

static int le_bucket(double s)
{
    int b = 0;
    while (b < SCHED_PASS_NB && s > sched_pass_le[b]) b++;
    return b;
}

/* g_sched.mu held: a pass that took took s (none when < 0), and the
 * binding of the one before it, whose outcome was prev_rc (1: none). */
static void pass_count(double took, int failed, int prev_rc, const sched_pass_stats *prev)
{
    if (took >= 0) {
        g_pass_stats.bucket[le_bucket(took)]++;
        g_pass_stats.passes++;
        g_pass_stats.failed += (uint64_t)failed;
        g_pass_stats.sum_s += took;
        g_pass_stats.last_s = took;
    }
    if (prev_rc == 1) return;
    double b = prev->bound_ms / 1000.0;
    g_pass_stats.bound_bucket[le_bucket(b)]++;
    g_pass_stats.bound++;
    g_pass_stats.bound_sum_s += b;
    g_pass_stats.failed += prev_rc < 0;
}

static void *sched_main(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "ty-sched"); /* in top, perf and /proc/PID/task */
    double last_end = 0, last_took = 0;
    pthread_mutex_lock(&g_sched.mu);
    while (!g_sched.stop) {
        if (!g_sched.kicked) {
            struct timespec ts;
            deadline_in(&ts, g_sched.cfg.tick_ms);
            pthread_cond_timedwait(&g_sched.cv, &g_sched.mu, &ts);
        }
        if (g_sched.stop) break;
        double gap_ms = 2000.0 * last_took;
        if (gap_ms < SCHED_GAP_MIN_MS) gap_ms = SCHED_GAP_MIN_MS;
        if (gap_ms > SCHED_GAP_MAX_MS) gap_ms = SCHED_GAP_MAX_MS;
        double wait_ms = last_end > 0 ? gap_ms - (mono_s() - last_end) * 1000.0 : 0;
        if (wait_ms > 0) { /* kicks meanwhile join this pass */
            struct timespec ts;
            deadline_in(&ts, (int64_t)wait_ms + 1);
            while (!g_sched.stop && pthread_cond_timedwait(&g_sched.cv, &g_sched.mu, &ts) == 0) {}
            if (g_sched.stop) break;
        }
        g_sched.kicked = 0;
        pthread_mutex_unlock(&g_sched.mu);
        sched_pass_stats st, prev;
        int prev_rc;
        double t0 = mono_s();
        int failed = sched_pass_async(g_sched.d, &g_sched.cfg, now_ms(), &st, &prev, &prev_rc) < 0;
        double took = mono_s() - t0;
        last_end = mono_s();
        /* the gap keeps the passes to a third of a core: the decision's
         * time, and the CPU its binding (of the pass before) spent here */
        last_took = took + (prev_rc != 1 ? prev.bind_cpu_ms / 1000.0 : 0);
        if (failed) log_warn("scheduler: pass failed");
        pthread_mutex_lock(&g_sched.mu);
        pass_count(took, failed, prev_rc, &prev);
    }
    pthread_mutex_unlock(&g_sched.mu);
    /* the last pass's decisions committed before the db may close */
    sched_pass_stats prev;
    int prev_rc = sched_bind_wait(g_sched.d, &prev);
    pthread_mutex_lock(&g_sched.mu);
    pass_count(-1, 0, prev_rc, &prev);
    pthread_mutex_unlock(&g_sched.mu);
    return NULL;
}

int sched_start(db *d, const sched_config *cfg)
{
    pthread_mutex_lock(&g_sched.mu);
    if (g_sched.running) { pthread_mutex_unlock(&g_sched.mu); return -1; }
    g_sched.d = d;
    g_sched.cfg = *cfg;
    if (g_sched.cfg.tick_ms <= 0) g_sched.cfg.tick_ms = 1000;
    if (!g_sched.cfg.node_loss_not_before_ms)
        g_sched.cfg.node_loss_not_before_ms = now_ms() + g_sched.cfg.heartbeat_timeout_ms;
    g_sched.stop = 0;
    g_sched.kicked = 1;
    if (pthread_create(&g_sched.th, NULL, sched_main, NULL) != 0) {
        pthread_mutex_unlock(&g_sched.mu);
        return -1;
    }
    g_sched.running = 1;
    pthread_mutex_unlock(&g_sched.mu);
    return 0;
}

void sched_config_current(sched_config *out)
{
    pthread_mutex_lock(&g_sched.mu);
    if (g_sched.running) *out = g_sched.cfg;
    else sched_config_default(out);
    pthread_mutex_unlock(&g_sched.mu);
}

/* A kick while one is pending changes nothing (the pass it asked for is
 * still to come, and reads everything committed before it starts), so it
 * wakes no one: during a stream of submissions the thread, waiting out its
 * gap, is woken by the timer instead of once per job. */
void sched_kick(void)
{
    pthread_mutex_lock(&g_sched.mu);
    if (!g_sched.kicked) {
        g_sched.kicked = 1;
        pthread_cond_signal(&g_sched.cv);
    }
    pthread_mutex_unlock(&g_sched.mu);
}

void sched_stop(void)
{
    pthread_mutex_lock(&g_sched.mu);
    if (!g_sched.running) { pthread_mutex_unlock(&g_sched.mu); return; }
    g_sched.stop = 1;
    pthread_cond_signal(&g_sched.cv);
    pthread_mutex_unlock(&g_sched.mu);
    pthread_join(g_sched.th, NULL);
    pthread_mutex_lock(&g_sched.mu);
    g_sched.running = 0;
    pthread_mutex_unlock(&g_sched.mu);
}
