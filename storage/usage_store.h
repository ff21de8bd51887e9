/* usage_store.h - usage accounting: who used what, read only from durable
 * rows, so a server restart loses and counts twice nothing.
 *
 * Device time is each task's devices (tasks.gpus, tasks.cpus, set at its
 * placement) times the part of [tasks.created_at, tasks.finished_at, or now
 * while it lives] inside the window [from, to). A preempted attempt's tasks
 * end when they exit, so it counts the time they held devices, no more.
 * Jobs: "run" (a task of the job overlaps the window), ended in the window
 * as succeeded, failed or cancelled (jobs.finished_at), preemptions (the
 * job's timeline events of kind 'preempt' in the window). Waits: first
 * placement (the job's earliest task) minus submission, for jobs first
 * placed in the window. Storage (per team, now): jobs.log_bytes, live
 * checkpoints, contexts. Deleted jobs (jobs.deleted_at) still count.
 *
 * defines: usage_by, usage_jobs, usage_row, usage_report, usage_query,
 *          usage_report_release, usage_split_days, USAGE_DAY_MS */
#ifndef TRAINYARD_USAGE_STORE_H
#define TRAINYARD_USAGE_STORE_H

#include <stdint.h>

#include "db.h"

#define USAGE_DAY_MS 86400000LL

typedef enum { USAGE_BY_TEAM = 0, USAGE_BY_JOB, USAGE_BY_DAY, USAGE_BY_USER } usage_by;

typedef struct usage_jobs {
    int64_t run, succeeded, failed, cancelled, preempted;
} usage_jobs;

typedef struct usage_row {
    int64_t team_id;
    char team[64];
    int64_t job_id;              /* by job */
    char job_name[256];          /* by job */
    int64_t user_id;             /* by user: who submitted (0: a team's service token or the admin) */
    char user[64];               /* by user: their name ("" for 0) */
    int64_t day;                 /* by day: the UTC midnight (ms) that starts it */
    double gpu_s, cpu_s;         /* device seconds */
    usage_jobs jobs;
    int n_waits;                 /* jobs first placed in the window (the waits' count) */
    double wait_median_s, wait_p95_s; /* meaningful when n_waits > 0 */
    int64_t logs_bytes, checkpoints_bytes, contexts_bytes; /* by team: held now */
} usage_row;

typedef struct usage_report {
    usage_row *rows;             /* by team: by name; by job: by id; by day: by day, then team */
    int n_rows;
    usage_row total;             /* the window's totals (jobs counted once each) */
} usage_report;

/* The report of the window [from, to) (ms), counting live tasks until now,
 * for one team (team_id > 0) or every team (0). By team, every team in
 * scope has a row (its storage counts even when it ran nothing); by job
 * and by day, only rows with something in them. STORE_OK (*out filled;
 * release with usage_report_release) or STORE_ERROR. */
int usage_query(db *d, int64_t from, int64_t to, int64_t now, usage_by by, int64_t team_id, usage_report *out);
void usage_report_release(usage_report *r);

/* Splits [a, b) (ms) at UTC midnights: the start of each day it touches
 * into day[i] and the milliseconds of [a, b) in that day into ms[i], in
 * order, at most cap pieces. The count (0 when b <= a), or -1 when more
 * than cap pieces would be needed. */
int usage_split_days(int64_t a, int64_t b, int64_t *day, int64_t *ms, int cap);

#endif
