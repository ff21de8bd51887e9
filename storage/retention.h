/* retention.h - the rows behind what finished jobs leave on the server's
 * disk: deleting a job (DELETE /jobs/{id}), the log retention, the
 * collection of a finished job's checkpoints, and the sweeps that find the
 * files of what is marked deleted. Storage only: the files themselves are
 * removed by the caller (api/retention.c) after the commit that marks them,
 * so a crash leaves files the sweeps find again, never rows that point at
 * files already gone.
 *
 * Return codes as store.h. Functions named _mark run their own transaction;
 * the rest read.
 *
 * defines: retention_job_delete_mark, retention_scan, retention_logs_mark,
 *          retention_ckpt_best, retention_ckpt_collect_mark,
 *          retention_sweep_jobs, retention_sweep_ckpts, retention_logs_state,
 *          retention_ckpt_gone */
#ifndef TRAINYARD_RETENTION_H
#define TRAINYARD_RETENTION_H

#include <stdint.h>
#include "db.h"
#include "exec_store.h"
#include "store.h"

/* Marks job_id deleted, in one transaction: jobs.deleted_at, every visible
 * checkpoint's deleted_at, its log_chunks, metrics, eval_metrics and
 * rendezvous rows removed, and a "deleted" event naming actor (the audit
 * log keeps it). team_id 0: any team (the admin); else only that team's.
 * STORE_OK; STORE_NOT_FOUND (unknown, another team's, or deleted already);
 * STORE_CONFLICT with state filled when the job has not ended, or
 * *live_tasks > 0 when it has but some of its tasks have not exited yet
 * (they may still upload); STORE_ERROR. */
int retention_job_delete_mark(db *d, int64_t job_id, int64_t team_id, int64_t now_ms, const char *actor,
                              char state[16], int *live_tasks);

/* One finished job as the housekeeping pass sees it. */
typedef struct retention_job {
    int64_t id;
    int64_t finished_at;
    int live_tasks;               /* tasks not exited yet: come back later */
    int logs_purged;              /* jobs.logs_purged_at set */
    int has_log_rows;             /* log_chunks rows */
    int checkpoints;              /* visible checkpoints */
} retention_job;

/* Finished jobs (succeeded, failed, cancelled; not deleted) after the
 * cursor (finished_at, id) in that order and finished before `until`, at
 * most max into out. */
int retention_scan(db *d, int64_t after_finished, int64_t after_id, int64_t until, retention_job *out, int max,
                   int *n);

/* Removes the job's log_chunks rows and sets logs_purged_at = now and
 * log_bytes = 0, in one transaction. STORE_NOT_FOUND when the job is
 * deleted or purged already. */
int retention_logs_mark(db *d, int64_t job_id, int64_t now_ms);

/* *purged_at: jobs.logs_purged_at (0: not purged); *finished_at too.
 * STORE_NOT_FOUND for an unknown job. */
int retention_logs_state(db *d, int64_t job_id, int64_t *purged_at, int64_t *finished_at);

/* The best of the job's visible checkpoints by a metric: its value in the
 * job's metrics (the chief's, then the evaluator's) reported at the
 * checkpoint's step, or else at its epoch, the newest such report; the
 * lowest value (best_max 0) or highest (1), the newest checkpoint on a tie.
 * *best_id 0 when no checkpoint has a value; *value the best value. */
int retention_ckpt_best(db *d, int64_t job_id, const char *metric, int best_max, int64_t *best_id, double *value);

/* Marks deleted every visible checkpoint of the job but the newest and
 * keep_id (0: none), in one transaction; where they are (store, path,
 * size; up to max) into refs, *n of them; *newest_id the one kept as
 * newest. The rest past max go next time. */
int retention_ckpt_collect_mark(db *d, int64_t job_id, int64_t keep_id, int64_t now_ms, ckpt_ref *refs, int max,
                                int *n, int64_t *newest_id);

/* Jobs with ids in (after_id, after_id + span] that are deleted or whose
 * logs were purged: ids and *deleted flags, at most max. *more 0 when no
 * job has an id past the span (a pass over every job is done). */
int retention_sweep_jobs(db *d, int64_t after_id, int64_t span, int64_t *ids, int *deleted, int max, int *n,
                         int *more);

/* Checkpoints with ids in (after_id, after_id + span] marked deleted that
 * still name a file or object: where into refs, at most max; *more as
 * above. */
int retention_sweep_ckpts(db *d, int64_t after_id, int64_t span, ckpt_ref *refs, int max, int *n, int *more);

/* A deleted checkpoint's object is gone from its blob store (store != ''):
 * its path is cleared, so the sweeps stop asking the store about it. */
int retention_ckpt_gone(db *d, const char *store, const char *path);

#endif
