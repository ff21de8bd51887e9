/* mirror.h - what the scheduling pass reads, kept in memory across passes.
 *
 * The mirror holds the rows of storage/cluster.h (cl_node, cl_device, cl_port,
 * cl_mem, cl_team, cl_user_usage, cl_job, cl_avoid) that cluster_load
 * returns, and follows
 * SQLite through the change log of storage/db.h: each refresh reads again,
 * by id, only the rows whose tables changed since the previous one, in one
 * read transaction; a gap in the log (overflow, a bulk change, a file not in
 * WAL mode) reloads everything. SQLite stays the only durable state: the
 * mirror is a cache, built by a full load on first use, lost with the
 * process, never written back. docs/scheduler.md (The mirror).
 *
 * What a refresh leaves equals a fresh cluster_load, field by field, but for
 * nodes' last_heartbeat_at (heartbeats are not followed: it is the value of
 * the last time the node's row was read) and avoid rows of jobs the mirror
 * does not hold (cluster_load returns every job's).
 *
 * Not thread-safe by itself: the caller holds mu around refresh and every
 * use of the rows (scheduler.c does).
 *
 * defines: mirror_new, mirror_free, mirror_refresh, mirror_invalidate,
 *          mirror_export, mirror_find_node, mirror_find_team */
#ifndef TRAINYARD_MIRROR_H
#define TRAINYARD_MIRROR_H

#include <pthread.h>
#include <stdint.h>

#include "../storage/cluster.h"
#include "core.h"

typedef struct mirror_node {
    cl_node row;
    cl_device *dev;  int n_dev;     /* ordered by kind, idx */
    sched_device *sdev;             /* (n_dev) the core's form of dev, same order: the
                                     * snapshot points into it instead of copying */
    int n_kind[SCHED_KINDS];        /* devices of each kind (cpu first: dev's order) */
    /* what sdev says, summed (sched_node.sum: the core reads these instead
     * of every device): free devices per kind, and one entry per (kind,
     * holder) by kind, then the holder's first device; kept with sdev */
    int n_free[SCHED_KINDS];
    sched_hold *holds; int n_holds;
    cl_port *ports;  int n_ports;   /* ordered by port */
    cl_mem *mem;     int n_mem;     /* ordered by job */
} mirror_node;

typedef struct mirror_job {
    cl_job row;
    cl_avoid *avoid; int n_avoid;   /* nodes that failed it twice, ordered by node */
} mirror_job;

/* What the order and the snapshot read of every job, kept apart from the
 * rows (a few bytes a job instead of a row's cache lines). */
typedef struct mirror_slot {
    int64_t id;                     /* the job's id, 0 for a free slot */
    int64_t team_id;
    int n_avoid;                    /* the job's n_avoid */
    signed char sect;               /* 0 free, 1 live (queued, starting, running), 2 holding */
    char fresh;                     /* (during a refresh) joined its section */
    char queued;                    /* state is queued */
} mirror_slot;

/* int64 -> int64, open addressing; keys > 0 */
typedef struct mirror_map {
    int64_t *key, *val;
    size_t cap, used;               /* used counts tombstones */
} mirror_map;

typedef struct mirror_stats {
    int full;                       /* 1: this refresh reloaded everything */
    int changes;                    /* log entries read */
    int nodes, devices, jobs;       /* rows read again by id */
    double ms;
} mirror_stats;

typedef struct mirror {
    pthread_mutex_t mu;
    int loaded;
    uint64_t seq;                   /* next change of the log to read */
    uint64_t version;               /* bumped by every refresh that changed anything
                                     * (a reader may key what it derives on it) */
    mirror_node *nodes; int n_nodes, cap_nodes;   /* ordered by id */
    mirror_map dev_node;            /* device id -> node id */
    mirror_job *slots; int n_slots, cap_slots;
    mirror_slot *info;              /* (n_slots) beside slots */
    /* (n_slots) the waiting outcome whose wording is the row's reason, when
     * ok: the pass compares outcomes instead of formatting every queued
     * job's reason (scheduler.c write_reasons); a refresh that reads a
     * different reason clears ok */
    struct mirror_said { sched_outcome o; char ok; } *said;
    /* (n_slots) the core's form of each queued job (mirror_job_core), kept
     * with the row: the snapshot copies it, setting team (the index of
     * info's team_id) and avoid */
    sched_job *sj;
    int *left; int n_left, cap_left;   /* (during a refresh) slots whose job left */
    int *free_slots; int n_free, cap_free;
    mirror_map job_slot;            /* job id -> slot */
    int *order; int n_live, n_hold, cap_order;    /* slots: live by id, then holding by id */
    cl_team *teams; int n_teams;    /* ordered by id */
    cl_user_usage *uusage; int n_uusage; /* ordered by team, user; read again with teams */
    /* the pass's upkeep follows the log too (scheduler.c): where it is */
    uint64_t upkeep_seq;
    int upkeep_follows;             /* 0: its next run scans everything */
    /* A pass's writes committed by a thread of their own (scheduler.c,
     * sched_pass_async): while busy, that thread alone uses the rows, mu
     * unheld, and whoever takes mu waits on idle until it is done; bind is
     * scheduler.c's record of the binding in flight or last finished, its
     * thread joined by whoever takes mu next. */
    int busy;
    pthread_cond_t idle;
    void *bind;
} mirror;

mirror *mirror_new(void);
void mirror_free(mirror *m);
/* Brings the mirror in step with the committed state of d (a full load the
 * first time, after mirror_invalidate, or on a gap in the log). 0, or -1 on
 * a store error (the mirror is then emptied: the next refresh loads it). */
int mirror_refresh(mirror *m, db *d, mirror_stats *st);
/* The next refresh reloads everything. */
void mirror_invalidate(mirror *m);
/* A copy in cluster_load's form and order (release with
 * cluster_state_release): tests compare it with a fresh load. */
void mirror_export(const mirror *m, cluster_state *out);
/* The core's form of a job's row: where a column the core reads (a field
 * of sched_job) is handed over. team and avoid are the snapshot's. */
void mirror_job_core(const cl_job *j, sched_job *out);
/* Index of a node / team by id, or -1. */
int mirror_find_node(const mirror *m, int64_t id);
int mirror_find_team(const mirror *m, int64_t id);

#endif
