/* sweep_store.h - the rows of hyperparameter sweeps: a sweep and its trials
 * (created together), the trials' states, what each scored at each ASHA
 * rung, and the sweep's own state. Storage only: what to run next is the
 * controller's decision (api/sweeps_api.c, with scheduler/sweep.c); here
 * each of its steps is one transaction, so a server killed between two
 * steps finds every decision's inputs in these rows and goes on.
 *
 * Return codes as store.h. Functions that write run their own transaction
 * unless they say they run inside the caller's.
 *
 * defines: sweep_info, sweep_trial_row, sweep_rung_row, sweep_metric,
 *          sweep_store_create, sweep_store_get, sweep_store_list,
 *          sweep_store_trials, sweep_store_rungs, sweep_store_running,
 *          sweep_store_job_metric, sweep_store_trial_start,
 *          sweep_store_trial_fail_pending, sweep_store_trial_end, sweep_store_trial_promote,
 *          sweep_store_trial_continue, sweep_store_trial_requeue,
 *          sweep_store_finish, sweep_store_cancel, sweep_store_newest_checkpoint */
#ifndef TRAINYARD_SWEEP_STORE_H
#define TRAINYARD_SWEEP_STORE_H

#include <stdint.h>
#include "db.h"
#include "store.h"

/* A sweep's row. spec: the request as stored ({"name", "job", "search"},
 * the search normalized); reason: why it ended (NULL while running). */
typedef struct sweep_info {
    int64_t id, team_id;
    char name[128];
    char team[64];
    char state[16];
    char *spec;
    char *reason;
    int64_t created_at, updated_at, finished_at;   /* ms; finished_at 0 while running */
    int trials;                                    /* its trials, any state */
    char user[64];                                 /* who made it; "": a service token or the admin */
} sweep_info;
void sweep_info_release(sweep_info *s);

/* A trial's row with what the controller needs of its job. */
typedef struct sweep_trial_row {
    int trial;
    char *params;                  /* {path: value} as JSON text */
    int64_t job_id;                /* 0 until submitted */
    char state[16];                /* pending running paused succeeded failed stopped cancelled */
    int rung, epochs;
    int has_metric;
    double metric;                 /* the best value of the search's metric so far */
    char *reason;                  /* NULL when none */
    char job_state[16];            /* "" when no job */
    char *job_reason;              /* the job's reason (NULL when none) */
    int job_live_tasks;            /* the job's tasks that have not exited */
} sweep_trial_row;
void sweep_trials_release(sweep_trial_row *t, int n);

/* What a trial scored at a rung (ASHA). */
typedef struct sweep_rung_row {
    int rung, trial;
    double metric;
    int promoted;
} sweep_rung_row;

/* Inserts the sweep (state running) and its n trials (pending, params[i]
 * the JSON text of trial i's parameters) in one transaction: STORE_OK with
 * *id_out. With idem_key (a request's Idempotency-Key; NULL: none) and
 * request_sha256 (the sha256 hex of the request as sent), the key is
 * stored in the same transaction, so a sweep is never made without it nor
 * twice for it. A key the team used within a day makes nothing: for the
 * same request STORE_EXPIRED (a replay), for another one STORE_CONFLICT,
 * each with *id_out the sweep it made first. The team's keys older than a
 * day go with each keyed create. */
int sweep_store_create(db *d, int64_t team_id, int64_t user_id, const char *name, const char *spec_json, int n,
                       char *const *params, const char *idem_key, const char *request_sha256, int64_t *id_out);

/* The sweep; team_id > 0: only that team's (another team's is NOT_FOUND).
 * The caller releases *out. */
int sweep_store_get(db *d, int64_t id, int64_t team_id, sweep_info *out);

/* Sweeps of a team (0: all) and of one submitter (user: a name; NULL: anyone's), newest first, ids below before (0: from the
 * newest), at most max into *out (allocated; the caller releases each and
 * frees the array); *next the cursor of the next page (0: none). */
int sweep_store_list(db *d, int64_t team_id, const char *user, int64_t before, int max, sweep_info **out, int *n,
                     int64_t *next);

/* Every trial of the sweep in trial order, with its job's state. */
int sweep_store_trials(db *d, int64_t sweep_id, sweep_trial_row **out, int *n);

/* Every rung row of the sweep, by rung then trial (*out allocated). */
int sweep_store_rungs(db *d, int64_t sweep_id, sweep_rung_row **out, int *n);

/* Running sweeps with ids above after_id, in id order, at most max. */
int sweep_store_running(db *d, int64_t after_id, int64_t *ids, int max, int *n);

/* What a job's metrics rows say of one metric: the epochs trained (the
 * highest epoch of an epoch row), the best value among all its rows
 * (lowest, or highest with mode_max) and its value at the last epoch
 * (the newest epoch row of that epoch that has it). */
typedef struct sweep_metric {
    int epochs;
    int has_best;
    double best;
    int has_last;
    double last;
} sweep_metric;
int sweep_store_job_metric(db *d, int64_t job_id, const char *metric, int mode_max, sweep_metric *out);

/* Submits a pending trial, in one transaction: the job (store_job_insert_rows,
 * with job->sweep_id and job->trial set), the trial running at `rung` with
 * that job, and an event on the job's timeline naming the trial's params.
 * STORE_CONFLICT when the trial is no longer pending (nothing written). */
int sweep_store_trial_start(db *d, int64_t sweep_id, int trial, int rung, int64_t team_id, const char *spec_json,
                            const store_new_job *job, const char *actor, int64_t *job_id_out);

/* A pending trial that cannot be submitted (its spec or its context is
 * refused now) fails with reason. STORE_CONFLICT when it is not pending. */
int sweep_store_trial_fail_pending(db *d, int64_t sweep_id, int trial, const char *reason);

/* A running trial's job ended, in one transaction: the trial to `state`
 * (succeeded, failed, cancelled, or paused at an ASHA rung) with its epochs
 * and metric (has_metric 0: left as it was) and reason; when rung >= 0 the
 * rung row (rung, trial, rung_metric); an event on the job's timeline.
 * STORE_CONFLICT when the trial is not running (nothing written). */
int sweep_store_trial_end(db *d, int64_t sweep_id, int trial, const char *state, int epochs, int has_metric,
                          double metric, const char *reason, int rung, double rung_metric, const char *actor);

/* Promotes a paused trial from rung `from` to from + 1, in one transaction:
 * its rung row marked promoted, the trial running at the next rung, the
 * job's spec replaced by spec_json (its fit.epochs the next rung's) and the
 * job requeued from succeeded for a new attempt, with reason on its
 * timeline. STORE_CONFLICT when the trial is not paused at that rung, the
 * rung row is promoted already, or the job is not succeeded with every task
 * exited (nothing written). */
int sweep_store_trial_promote(db *d, int64_t sweep_id, int trial, int from, int64_t job_id, const char *spec_json,
                              const char *actor, const char *reason);

/* A running trial whose job reached the end of rung `from` goes on to
 * from + 1 in its process (ASHA: it ranks in that rung's top 1/eta), in one
 * transaction: the rung row (from, trial, metric) inserted as promoted, the
 * trial running at from + 1, the job's spec replaced by spec_json (its
 * fit.epochs the next rung's: what a restarted attempt trains to), and
 * reason on the job's timeline. STORE_CONFLICT when the trial is not
 * running at rung `from` with that job, the job is not running at
 * `attempt`, or that rung row exists already (nothing written). */
int sweep_store_trial_continue(db *d, int64_t sweep_id, int trial, int from, int64_t job_id, int attempt,
                               double metric, const char *spec_json, const char *actor, const char *reason);

/* A running trial whose job succeeded short of its rung's epochs (its
 * worker never heard that it goes on, sweep_store_trial_continue) trains
 * the rest: the job requeued from succeeded for a new attempt, with its
 * spec as it is (its fit.epochs already the rung's) and reason on its
 * timeline, in one transaction. STORE_CONFLICT when the trial is not
 * running with that job, or the job is not succeeded with every task
 * exited (nothing written). */
int sweep_store_trial_requeue(db *d, int64_t sweep_id, int trial, int64_t job_id, const char *actor,
                              const char *reason);

/* Ends a running sweep, in one transaction: its paused trials to stopped
 * ("stopped early at rung k (N epochs)"), then the sweep to state with
 * reason. STORE_CONFLICT when it is not running. */
int sweep_store_finish(db *d, int64_t sweep_id, const char *state, const char *reason);

/* Inside the caller's transaction: the running sweep cancelled with reason,
 * its trials not ended cancelled (their metrics kept); the jobs of those
 * that were running into jobs (at most max, *n of them) for the caller to
 * cancel in the same transaction. STORE_CONFLICT when it is not running. */
int sweep_store_cancel(db *d, int64_t sweep_id, const char *reason, int64_t *jobs, int max, int *n);

/* The id of the job's newest checkpoint still held (0: none). */
int sweep_store_newest_checkpoint(db *d, int64_t job_id, int64_t *ckpt_id);

/* 1 when the job is a trial of a sweep still running (*sweep_id, *trial
 * set), 0 when not, -1 on error: such a job is the sweep's until it ends
 * (a paused ASHA trial's job may be promoted and requeued). */
int sweep_store_job_in_running_sweep(db *d, int64_t job_id, int64_t *sweep_id, int *trial);

#endif
