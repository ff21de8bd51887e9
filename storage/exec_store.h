/* exec_store.h - the rows that running jobs touch: tasks as agents see them
 * (hand-out, stop list, state), metrics, log chunks, checkpoints, the
 * rendezvous store and jobs.progress. Storage only: callers (the handlers
 * of api/assignments_api.c, tasks_api.c, job_metrics_api.c, logs_api.c,
 * checkpoints_api.c, rendezvous_api.c; scheduler/lifecycle.c) decide who
 * may do what and when.
 *
 * Return codes as store.h: STORE_OK, STORE_NOT_FOUND, STORE_CONFLICT,
 * STORE_ERROR. Functions that write do not begin a transaction; callers that
 * need several writes atomic wrap them in db_begin/db_commit.
 *
 * defines: exec_job, exec_task, exec_ckpt, exec_store_job_get,
 *          exec_store_job_release, exec_store_job_attempt,
 *          exec_store_progress_get, exec_store_progress_set,
 *          exec_store_job_checkpointed, exec_store_job_set_reason,
 *          exec_store_task_get, exec_store_node_exists,
 *          exec_store_node_pending, exec_store_task_handout,
 *          exec_store_node_reset_handouts, exec_store_node_stopping,
 *          exec_store_attempt_cluster, exec_store_task_devices,
 *          exec_store_task_set_running, exec_store_task_set_exited,
 *          exec_store_task_free, exec_store_task_revoke_token,
 *          exec_store_attempt_drop_unstarted, exec_store_attempt_counts,
 *          exec_store_attempt_chief, exec_store_job_tasks,
 *          exec_store_metric_add, exec_store_metrics_list,
 *          exec_store_metric_latest, exec_store_epoch_throughput,
 *          exec_store_log_chunk_add, exec_store_job_log_state,
 *          exec_store_ckpt_reserve, exec_store_ckpt_publish,
 *          exec_store_ckpt_discard, exec_store_ckpt_get,
 *          exec_store_ckpt_list, exec_store_ckpt_prune, exec_store_rdv_put,
 *          exec_store_rdv_get */
#ifndef TRAINYARD_EXEC_STORE_H
#define TRAINYARD_EXEC_STORE_H

#include <stdint.h>
#include <cjson/cJSON.h>
#include "db.h"
#include "store.h"
#include "../common/util.h"

/* ---------------------------------------------------------------- jobs */
typedef struct exec_job {
    int64_t id;
    int64_t team_id;
    char state[16];
    int attempt;
    int max_restarts;
    char *spec;                   /* heap, NUL-terminated (exec_store_job_release) */
    int deleted;                  /* jobs.deleted_at set (DELETE /jobs/{id}): the API answers 404 */
    int64_t logs_purged_at;       /* when the log retention removed its logs (0: not) */
} exec_job;

/* Reads a job's scope and state (and its spec when with_spec). */
int exec_store_job_get(db *d, int64_t job_id, int with_spec, exec_job *out);
void exec_store_job_release(exec_job *j);

/* The job's current attempt into *attempt (read inside the caller's
 * transaction, to fence reports of an earlier attempt). STORE_NOT_FOUND
 * when there is no such job. */
int exec_store_job_attempt(db *d, int64_t job_id, int *attempt);

/* jobs.progress as text (heap) or NULL when none yet. */
int exec_store_progress_get(db *d, int64_t job_id, char **out);
int exec_store_progress_set(db *d, int64_t job_id, const char *json);

/* Records when the job last wrote a checkpoint (jobs.last_checkpoint_at). */
int exec_store_job_checkpointed(db *d, int64_t job_id, int64_t at_ms);

/* Updates jobs.reason without a state change (e.g. while stopping). */
int exec_store_job_set_reason(db *d, int64_t job_id, const char *reason);

/* ---------------------------------------------------------------- tasks */
typedef struct exec_task {
    int64_t id;
    int64_t job_id;
    int64_t node_id;
    int attempt;
    char type[16];                /* worker | ps | evaluator */
    int index;
    int port;
    char state[12];               /* assigned | running | stopping | exited */
    int handed_out;               /* token_hash set */
    int has_exit;
    int exit_code;
    char reason[128];             /* why it is stopping, or how it ended ("" = none) */
    int64_t memory_mb;            /* the task's memory, its cgroup limit (MiB; 0 = none) */
} exec_task;

int exec_store_task_get(db *d, int64_t task_id, exec_task *out);

/* STORE_OK when the node is registered. */
int exec_store_node_exists(db *d, int64_t node_id);

/* Ids of the node's tasks in state assigned not handed out yet, oldest first,
 * at most max into ids; *n gets the count. */
int exec_store_node_pending(db *d, int64_t node_id, int64_t *ids, int max, int *n);

/* Records the hand-out: sets tasks.token_hash when it is still NULL and the
 * task assigned. STORE_CONFLICT when someone else handed it out first. */
int exec_store_task_handout(db *d, int64_t task_id, const char *token_hash);

/* Forgets the hand-out of the node's assigned tasks (an agent that restarted
 * gets them again with new tokens) and revokes their tokens, except the
 * tasks in keep_json (a JSON array of task ids: those the agent says it
 * still runs, after its own token was revoked; "[]" for none). */
int exec_store_node_reset_handouts(db *d, int64_t node_id, const char *keep_json);

/* The node's tasks in state stopping: [{"task","job","reason"}], ordered. */
int exec_store_node_stopping(db *d, int64_t node_id, cJSON **out);

/* {"chief":[addr:port], "worker":[...by index], "ps":[...]} of an attempt. */
int exec_store_attempt_cluster(db *d, int64_t job_id, int attempt, cJSON **out);

/* ["gpu:0", "cpu:3", ...] held by a task. */
int exec_store_task_devices(db *d, int64_t task_id, cJSON **out);

/* Task state changes. set_running: assigned -> running (started_at);
 * a stopping task keeps its state but gets started_at. set_exited: any
 * non-exited state -> exited with code and reason (finished_at). Both
 * STORE_CONFLICT when the task is already exited. */
int exec_store_task_set_running(db *d, int64_t task_id);
int exec_store_task_set_exited(db *d, int64_t task_id, int exit_code, const char *reason);

/* Frees a task's devices (deletes its allocations). */
int exec_store_task_free(db *d, int64_t task_id);

/* Revokes the task token (tokens.revoked_at) handed out with the task. */
int exec_store_task_revoke_token(db *d, int64_t task_id);

/* Tasks of an attempt that were never handed out are closed at once
 * (exited, devices freed): no agent will ever report them. */
int exec_store_attempt_drop_unstarted(db *d, int64_t job_id, const char *why);

/* Counts of an attempt's tasks: all, running, not exited. */
int exec_store_attempt_counts(db *d, int64_t job_id, int attempt, int *total, int *running, int *live);

/* The chief (worker 0) of an attempt: *exited 1 with its *code when it exited. */
int exec_store_attempt_chief(db *d, int64_t job_id, int attempt, int *exited, int *code);

/* Tasks of a job's attempt with where they run, for GET /jobs/{id}:
 * [{"id","type","index","name","node","node_id","address","port","state","exit_code","reason",
 *   "started_at","finished_at"}]. */
int exec_store_job_tasks(db *d, int64_t job_id, int attempt, cJSON **out);

/* ---------------------------------------------------------------- metrics */
/* INSERT OR IGNORE on (job_id, seq): *inserted 1 when new. data is the
 * metric's JSON object as text. Kind "eval" (an evaluator's metrics) goes to
 * eval_metrics, a sequence of its own beside the chief's (step, epoch,
 * test); the list, last seq and latest below read that sequence when asked
 * for kind "eval", and the chief's otherwise. */
int exec_store_metric_add(db *d, int64_t job_id, int64_t seq, int attempt, const char *kind,
                          const int64_t *step, const int64_t *epoch, const char *data, int *inserted);

/* Metrics with seq > since (kind NULL = all kinds), oldest first, at most
 * limit: an array of the stored objects (each with "seq","kind","attempt",
 * "time" added). *last_seq: the highest seq of the job (0 when none). */
int exec_store_metrics_list(db *d, int64_t job_id, int64_t since, const char *kind, int limit, cJSON **out,
                            int64_t *last_seq);

/* The job's newest metric of a kind (NULL = any) as a parsed object, or
 * *out NULL when none. */
int exec_store_metric_latest(db *d, int64_t job_id, const char *kind, cJSON **out);

/* The training throughput of the job's completed epochs, from their epoch
 * metrics: *epochs counted, *samples = sum of samples_per_sec x seconds
 * (the examples each trained), *seconds = sum of seconds (their training
 * time). Epoch metrics without a positive number in both are left out (a
 * command job's own lines may carry neither); all 0 when none. */
int exec_store_epoch_throughput(db *d, int64_t job_id, int *epochs, double *samples, double *seconds);

/* ---------------------------------------------------------------- logs */
/* Records one appended chunk of a task's log file (seq = next per task and
 * attempt) and adds its length to jobs.log_bytes, in one transaction. */
int exec_store_log_chunk_add(db *d, int64_t job_id, const char *task, int attempt, int64_t offset, int64_t length);

/* Whether job logs are kept in the database (PostgreSQL: every server of
 * the cluster reads them) rather than in files under the DATA of the
 * server that received them (SQLite). */
int exec_store_logs_in_db(db *d);

/* Appends len bytes to the task's log in the database, in one transaction:
 * a chunk holding them at the end of the task's log (*offset: where they
 * begin), and jobs.log_bytes. The caller serializes a task's appends (one
 * leader writes). STORE_OK or STORE_ERROR. */
int exec_store_log_append(db *d, int64_t job_id, const char *task, int attempt, const void *data, int64_t len,
                          int64_t *offset);

/* The bytes of the job's logs held in the database (chunks with their
 * bytes; 0 on SQLite): STORE_OK or STORE_ERROR. */
int exec_store_log_db_bytes(db *d, int64_t job_id, int64_t *bytes);

/* Where the task's log in the database ends (0 when empty): STORE_OK or
 * STORE_ERROR. */
int exec_store_log_end(db *d, int64_t job_id, const char *task, int64_t *end);

/* The task's log from byte since, at most limit bytes, from the chunks'
 * bytes in the database, appended to out: STORE_OK (nothing past the end);
 * STORE_NOT_FOUND when a chunk there holds no bytes (written to a file: the
 * caller reads its file); STORE_ERROR. */
int exec_store_log_read(db *d, int64_t job_id, const char *task, int64_t since, int64_t limit, buf *out);

/* The job's log bytes kept (jobs.log_bytes) and its spec's logs.max_size
 * as written ("" when it has none): STORE_OK, STORE_NOT_FOUND, STORE_ERROR. */
int exec_store_job_log_state(db *d, int64_t job_id, int64_t *log_bytes, char *max_size, size_t cap);

/* ---------------------------------------------------------------- checkpoints */
typedef struct exec_ckpt {
    int64_t id;
    int attempt;
    int64_t step, epoch, size;
    char sha256[65];
    char path[256];               /* the key under the store's checkpoints/ ("J/C.safetensors") */
    char store[256];              /* '' = the data directory, else the store's normalized URL */
} exec_ckpt;

/* Where a checkpoint's bytes are: what a deletion removes after its
 * commit. */
typedef struct ckpt_ref {
    char store[256];              /* as exec_ckpt's */
    char path[256];
    int64_t size;
} ckpt_ref;

/* Inserts a hidden row (deleted_at set) to reserve an id; exec_store_ckpt_publish
 * gives it its path and makes it visible once the file is durable. */
int exec_store_ckpt_reserve(db *d, int64_t job_id, int attempt, int64_t step, int64_t epoch, int64_t size,
                            const char *sha256, int64_t *id_out);
int exec_store_ckpt_publish(db *d, int64_t id, const char *store, const char *path);
/* Removes a reserved row whose file could not be written. */
int exec_store_ckpt_discard(db *d, int64_t id);

/* One visible checkpoint: cid 0 = the newest. */
int exec_store_ckpt_get(db *d, int64_t job_id, int64_t cid, exec_ckpt *out);

/* {"checkpoints":[...]} items, newest first. */
int exec_store_ckpt_list(db *d, int64_t job_id, cJSON **out);

/* Hides every visible checkpoint beyond the newest keep, returning where
 * they are (up to max) so the caller can remove them after the commit. */
int exec_store_ckpt_prune(db *d, int64_t job_id, int keep, ckpt_ref *refs, int max, int *n);

/* ---------------------------------------------------------------- rendezvous */
int exec_store_rdv_put(db *d, int64_t job_id, int attempt, const char *key, const char *value, size_t len);
/* *value heap (caller frees), NOT_FOUND when absent. */
int exec_store_rdv_get(db *d, int64_t job_id, int attempt, const char *key, char **value, size_t *len);

#endif
