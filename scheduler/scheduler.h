/* scheduler.h - the persistent scheduler: keeps what a pass reads from
 * SQLite in memory (mirror.h: read again only where the store changed),
 * runs the pure core (core.h) with no lock
 * held, and applies its decisions in one short write transaction, so a crash
 * mid-pass leaves no partial allocation. Also: lost nodes and their jobs'
 * requeue, the admission check for submit, the queue view for GET /queue,
 * and the scheduler thread the server runs. See docs/scheduler.md.
 *
 * defines: sched_pass, sched_full_load, sched_admit_job, sched_queue_view, sched_start,
 *          sched_kick, sched_stop, sched_fault_after */
#ifndef TRAINYARD_SCHEDULER_H
#define TRAINYARD_SCHEDULER_H

#include <stddef.h>
#include <stdint.h>

#include "../storage/db.h"
#include "core.h"

typedef struct sched_pass_stats {
    int placed;          /* jobs started (queued -> starting) */
    int backfilled;      /* of which out of order */
    int stopped;         /* jobs asked to stop (preemption, max_runtime_s) */
    int waiting;         /* queued jobs left waiting */
    int requeued;        /* jobs back to queued (preempted, node lost) */
    int failed;          /* jobs failed (restart budget spent, max_runtime_s) */
    int lost_nodes;      /* nodes marked lost in this pass */
    int conflicts;       /* placements dropped because the store changed under them */
    int reasons;         /* waiting reasons written (only those that changed) */
    int woken;           /* nodes given new tasks (their agents are told with db_wake_node) */
    double load_ms, core_ms, apply_ms;
    /* load_ms in parts: the upkeep transaction, the mirror's refresh
     * (full_load: it read everything; rows_read: rows read again by id),
     * the core's snapshot built over it */
    double upkeep_ms, refresh_ms, build_ms;
    int full_load, rows_read;
    /* round trips to the store (PostgreSQL; 0 on SQLite) in the upkeep,
     * the refresh and the apply (the placements, reasons, evaluators) */
    int rt_upkeep, rt_refresh, rt_apply;
    /* placements decided (placed counts those committed); sched_pass_async:
     * the time its start waited for the previous pass's binding (part of
     * load_ms), and the time from its start until its own binding was done
     * (its decisions committed); the binding's CPU time, in its thread */
    int decided;
    double waited_ms, bound_ms, bind_cpu_ms;
} sched_pass_stats;

/* One pass at time now_ms: lost nodes, reaping of stopped jobs, placement,
 * preemption, waiting reasons, team usage. Returns 0, or -1 on a store error
 * (or an injected fault), in which case the decision transaction was rolled
 * back whole. out may be NULL. */
int sched_pass(db *d, const sched_config *cfg, int64_t now_ms, sched_pass_stats *out);

/* The same pass, its decisions committed by a thread of its own: returns
 * once decided (out: what the decision reads and decides; the binding's
 * figures come from sched_bind_wait). The mirror is the binding's until it
 * is done: the next pass, an admission or a queue view waits for it first,
 * so the next pass reads what this one committed. The previous pass's
 * binding, unless sched_bind_wait took it: its figures into *prev and its
 * outcome into *prev_rc (0 committed, -1 failed: rolled back and logged;
 * 1 none to give; either may be NULL). Returns 0, or -1 when the decision
 * failed (nothing written but the upkeep's). Wait for the last binding
 * (sched_bind_wait) before db_close. */
int sched_pass_async(db *d, const sched_config *cfg, int64_t now_ms, sched_pass_stats *out, sched_pass_stats *prev,
                     int *prev_rc);

/* Waits for the binding of the last sched_pass_async on d, if any: 0 it
 * committed, -1 it failed (rolled back), its figures into out (may be
 * NULL: placed, conflicts, apply_ms, bound_ms...); 1 when there was none to
 * wait for (or it was waited for already). */
int sched_bind_wait(db *d, sched_pass_stats *out);

/* on 1: every pass (and queue view, admission) loads the whole store
 * again instead of reading only what changed, as before the mirror (the
 * benchmark's comparison; tests). Off by default. */
void sched_full_load(int on);

/* Admission for a submitted spec: 0 feasible, or no node has joined yet
 * (the job queues with the reason "no nodes have joined"); 1 infeasible on
 * the registered nodes, with the message for the 422 in msg ("infeasible: a
 * worker needs 16 gpu on one node; the largest node has 8"); -1 on a store
 * error. */
int sched_admit_job(db *d, const sched_job *job, char *msg, size_t cap);

/* GET /queue: queued jobs in the order the scheduler considers them. */
typedef struct sched_queue_entry {
    int64_t job_id, team_id;
    int rank, priority, eff_priority;
    int64_t queued_at_ms;
    int64_t est_start_ms;            /* 0: no reservation */
    int will_start;                  /* 1: placed by this pass's decisions */
    char team[64];
    char reason[SCHED_REASON_MAX];
} sched_queue_entry;

/* Fills *out (malloc'd, caller frees) with *n entries, by rank. 0 or -1. */
int sched_queue_view(db *d, const sched_config *cfg, int64_t now_ms, sched_queue_entry **out, int *n);

/* The scheduler thread: a pass on every kick and every cfg->tick_ms.
 * sched_start returns 0 or -1; sched_kick is safe from any thread (and a
 * no-op when the thread is not running); sched_stop joins it. */
int sched_start(db *d, const sched_config *cfg);
/* The running thread's configuration (the defaults when not running). */
void sched_config_current(sched_config *out);
void sched_kick(void);
void sched_stop(void);

/* How long the thread's passes take (GET /metrics): counts per duration
 * bucket (upper bounds in sched_pass_le, one more for +Inf), their sum, and
 * the passes that failed (a decision or a binding rolled back). A pass is
 * timed from its start until it decided (its wait for the previous binding
 * included); bound_* time it from its start until its decisions were
 * committed. */
#define SCHED_PASS_NB 12
extern const double sched_pass_le[SCHED_PASS_NB];
typedef struct sched_thread_stats {
    uint64_t bucket[SCHED_PASS_NB + 1];   /* non-cumulative */
    uint64_t passes, failed;
    double sum_s, last_s;
    uint64_t bound_bucket[SCHED_PASS_NB + 1];
    uint64_t bound;
    double bound_sum_s;
} sched_thread_stats;
void sched_thread_stats_get(sched_thread_stats *out);

/* Test hook: the n-th write of the next decision transactions fails (0 off),
 * as a crash there would. */
void sched_fault_after(int n);

#endif
