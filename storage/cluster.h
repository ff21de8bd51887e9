/* cluster.h - the SQL of the cluster: nodes and their devices, tasks,
 * allocations (one row per held device), team shares and failure memory.
 * Plain rows in, plain rows out: the scheduler (scheduler/scheduler.c) turns
 * them into its snapshot and decisions; the cluster API into JSON. Writes run
 * inside the caller's transaction (db_begin/db_commit) unless noted.
 *
 * defines: cluster_load, cluster_state_release, cluster_read_* (by id),
 *          cluster_node_upsert, cluster_nodes_version,
 *          cluster_node_heartbeat, cluster_task_insert, cluster_alloc_insert,
 *          cluster_node_token_issue/revoke (per-node tokens),
 *          cluster_* updates used by the scheduler pass */
#ifndef TRAINYARD_CLUSTER_H
#define TRAINYARD_CLUSTER_H

#include <stdint.h>
#include <stddef.h>
#include "db.h"

#define CL_NAME_MAX 128
#define CL_REASON_MAX 256

typedef struct cl_node {
    int64_t id;
    char hostname[CL_NAME_MAX];
    char address[CL_NAME_MAX];
    int cpu_slots;
    char state[12];                 /* ready | lost | drained */
    int64_t registered_at, last_heartbeat_at;
    int64_t memory_mb;              /* offered to tasks, MiB; 0 = not reported */
    char *isolation;                /* the agent's isolation report (JSON text), NULL = none */
    int runtimes;                   /* CL_RUNTIME_* the agent can run tasks in (NULL: host) */
} cl_node;

/* What a node's agent can run a task in (nodes.runtimes, JSON ["host",
 * "podman"]), and what a job needs (an environment.image: podman). */
#define CL_RUNTIME_HOST 1
#define CL_RUNTIME_PODMAN 2
/* The CL_RUNTIME_* bits of a runtimes array in JSON text (NULL or bad: host). */
int cluster_runtimes_bits(const char *json);

typedef struct cl_device {
    int64_t id, node_id;
    int kind;                       /* 0 cpu, 1 gpu (device_kind) */
    int idx;
    char model[CL_NAME_MAX];
    int64_t memory_mb;
    int64_t job_id;                 /* holder, 0 free */
    int64_t task_id;
} cl_device;

typedef struct cl_port {
    int64_t node_id;
    int port;
} cl_port;

/* Memory held on a node by the live tasks (those holding devices) of a job. */
typedef struct cl_mem {
    int64_t node_id, job_id;
    int64_t mb;
} cl_mem;

typedef struct cl_team {
    int64_t id;
    char name[CL_NAME_MAX];
    double weight;
    int guarantee;
    int quota;                      /* -1 = none */
    int max_interactive;            /* the most interactive jobs running at once, -1 = none */
    double usage;
    int64_t usage_at;
} cl_team;

/* A user's decayed device-seconds in a team (user_usage, migration 15):
 * user_id 0 is the team's service token and the admin (jobs.user_id NULL).
 * Its value at a later time t is usage decayed over t - usage_at. */
typedef struct cl_user_usage {
    int64_t team_id, user_id;
    double usage;
    int64_t usage_at;
} cl_user_usage;

typedef struct cl_job {
    int64_t id, team_id;
    char state[16];
    int priority, workers, devices_per_worker, kind, ps;
    int preemptible, queue_if_infeasible, attempt, max_restarts;
    int64_t max_runtime_s, queued_at, last_checkpoint_at;
    int64_t attempt_started_at;     /* first task of the current attempt, 0 none */
    int64_t memory_mb;              /* resources.memory per task (MiB), 0 = default share */
    int stopping;                   /* current attempt has tasks 'stopping' */
    int workers_min;                /* elastic: fewest workers (0: a fixed gang) */
    int workers_now;                /* workers of the current attempt (0: never placed) */
    int resize_to;                  /* a resize's target while it is under way, else 0 */
    int runtime;                    /* CL_RUNTIME_* it needs (0: any node) */
    int interactive;                /* 1: a notebook or shell job (spec interactive) */
    int64_t user_id;                /* who submitted it (0: a team's service token, the admin) */
    char reason[CL_REASON_MAX];
} cl_job;

typedef struct cl_avoid {
    int64_t job_id, node_id;
} cl_avoid;

/* Everything one scheduling pass reads, from one read transaction. Jobs are
 * the queued ones (id order) and the active ones (starting, running, or
 * holding devices), in `jobs`; devices ordered by node, kind, index. */
typedef struct cluster_state {
    cl_node *nodes;     int n_nodes;
    cl_device *devices; int n_devices;
    cl_port *ports;     int n_ports;
    cl_mem *mem;        int n_mem;      /* ordered by node */
    cl_team *teams;     int n_teams;
    cl_user_usage *uusage; int n_uusage; /* ordered by team, user */
    cl_job *jobs;       int n_jobs;
    cl_avoid *avoid;    int n_avoid;
} cluster_state;

/* Loads the state in one read transaction. 0, or -1 (logged; *cs empty). */
int cluster_load(db *d, cluster_state *cs);
void cluster_state_release(cluster_state *cs);

/* The same rows one at a time, for a reader that keeps them (the
 * scheduler's mirror, scheduler/mirror.c) and reads again only what the
 * change log (db_changes_read) says changed. Each reads its table's
 * columns through the same row function as cluster_load. Run them between
 * cluster_read_begin and cluster_read_end (one read transaction: 0 or -1,
 * rolled back on failure). The single-row reads return 0 found, 1 when
 * cluster_load would not have the row (no such node or device; a job
 * neither queued, starting, running nor holding a device), -1 on error.
 * The list reads fill a malloc'd array (caller frees), in cluster_load's
 * order, and return 0 or -1. */
int cluster_read_begin(db *d);
int cluster_read_end(db *d);
int cluster_read_node(db *d, int64_t id, cl_node *out);            /* out->isolation malloc'd */
int cluster_read_device(db *d, int64_t id, cl_device *out);
int cluster_read_job(db *d, int64_t id, cl_job *out);
int cluster_read_node_devices(db *d, int64_t node_id, cl_device **out, int *n);
int cluster_read_node_ports(db *d, int64_t node_id, cl_port **out, int *n);
int cluster_read_node_mem(db *d, int64_t node_id, cl_mem **out, int *n);
int cluster_read_job_avoid(db *d, int64_t job_id, cl_avoid **out, int *n);
int cluster_read_teams(db *d, cl_team **out, int *n);
int cluster_read_user_usage(db *d, cl_user_usage **out, int *n);
/* The job and node of a task (node_id may be NULL): 0, 1 no such task, -1. */
int cluster_read_task_job(db *d, int64_t task_id, int64_t *job_id, int64_t *node_id);
/* The jobs of n tasks into jobs (room for n; a task that is gone has none,
 * in no given order, a job once per task): how many, or -1. One statement
 * on PostgreSQL, cluster_read_task_job each on SQLite. */
int cluster_jobs_of_tasks(db *d, const int64_t *tasks, int n, int64_t *jobs);

/* Before many of the reads above, in the same read transaction: the rows of
 * a whole id list in one statement, so that the reads of those ids that
 * follow answer from memory (cluster_read_device, cluster_read_task_job,
 * cluster_read_job and cluster_read_job_avoid by id; cluster_read_node_ports
 * and cluster_read_node_mem by node id), with the same answers. PostgreSQL only, where each read is a
 * round trip (about 1,400 a pass at 10,000 nodes x 100,000 jobs); on SQLite
 * nothing is read and each read queries as before. A kind's next prefetch
 * replaces its rows; cluster_read_end forgets them all. 0 or -1. */
int cluster_prefetch_devices(db *d, const int64_t *ids, int n);
int cluster_prefetch_tasks(db *d, const int64_t *ids, int n);
int cluster_prefetch_jobs(db *d, const int64_t *ids, int n);
int cluster_prefetch_node_use(db *d, const int64_t *node_ids, int n);

/* Registers a node, or updates the one with that hostname (address, cpu
 * slots, memory, isolation, devices added or refreshed; state ready,
 * heartbeat now). Devices held by a task are never removed. Begins and
 * commits its own transaction. kinds/idx/models/memory: (n_gpu) the GPUs.
 * memory_mb: what the node offers its tasks (0 = not reported); isolation:
 * the agent's report as JSON text (NULL = none). 0 or -1. */
int cluster_node_upsert(db *d, const char *hostname, const char *address, int cpu_slots,
                        int n_gpu, const int *gpu_idx, const char *const *gpu_model,
                        const int64_t *gpu_memory_mb, int64_t memory_mb, const char *isolation,
                        int64_t now, int64_t *id_out, int *created);
/* Nodes whose agent reports the runtime name ("podman") in *with, every
 * node in *all. 0 or -1. */
int cluster_nodes_with_runtime(db *d, const char *name, int *with, int *all);

/* The same with runtimes: what the agent can run tasks in, as JSON text
 * (["host","podman"]; NULL = the host only). */
int cluster_node_upsert_rt(db *d, const char *hostname, const char *address, int cpu_slots,
                           int n_gpu, const int *gpu_idx, const char *const *gpu_model,
                           const int64_t *gpu_memory_mb, int64_t memory_mb, const char *isolation,
                           const char *runtimes, int64_t now, int64_t *id_out, int *created);

/* Records a heartbeat: 0, 1 when no such node, -1 on error. A lost node
 * that beats again is ready again (written at once). Another node's time
 * is kept in memory and written by the next cluster_nodes_mark_lost, before
 * it decides; cluster_load shows it meanwhile (TRAINYARD_HEARTBEAT_WRITE=1:
 * a write transaction each, as before). */
int cluster_node_heartbeat(db *d, int64_t node_id, int64_t now);
/* The same; state (may be NULL) gets the node's state after it: ready, or
 * drained (a lost node that is heard from again is ready). */
int cluster_node_heartbeat_state(db *d, int64_t node_id, int64_t now, char state[16]);
/* drain 1: the node takes no new tasks (state 'drained'; its running
 * tasks go on; lost as a ready node when its heartbeats stop; a new
 * registration makes it 'ready'); drain 0: a drained node is ready again.
 * state gets the node's state after. 0, 1 when there is no such node, -1 on
 * a store error. */
int cluster_node_drain(db *d, int64_t node_id, int drain, char state[16]);

/* A number that moves after every change of a node's state (registered,
 * drained, back, lost, heard from again), devices or memory made through
 * this module: what a reader of the cluster's capacity may keep an answer
 * by. A registration, a drain and a lost node heard from again move it
 * after their commit; cluster_nodes_mark_lost moves it before the caller
 * commits, so an answer kept meanwhile may show the lost nodes for as long
 * as the reader keeps answers (store_cluster_capacity: a second). */
uint64_t cluster_nodes_version(void);

/* Marks ready nodes silent since before `before` as lost; their ids into
 * *ids (malloc'd, caller frees). Returns the count or -1. Writes the
 * heartbeats kept in memory first, in the caller's transaction. */
int cluster_nodes_mark_lost(db *d, int64_t before, int64_t **ids);

/* memory_mb: the task's memory (its cgroup limit; 0 = none). gpus, cpus:
 * the devices of each kind the caller allocates to it in the same
 * transaction (cluster_alloc_insert), kept on the task so that usage
 * outlives the allocations, which go when the task ends. */
int cluster_task_insert(db *d, int64_t job_id, int attempt, const char *type, int idx,
                        int64_t node_id, int port, int64_t memory_mb, int gpus, int cpus, int64_t now,
                        int64_t *task_id);
/* 0, 1 when the device is already held (PRIMARY KEY), -1 on error. */
int cluster_alloc_insert(db *d, int64_t device_id, int64_t task_id, int64_t job_id);

/* One task of a job being started (cluster_place). */
typedef struct cl_place_task {
    const char *type;              /* "worker" or "ps" */
    int idx;
    int64_t node_id;
    int port;
    int64_t memory_mb;
    int gpus, cpus;                /* counted on the task for usage accounting */
    const int64_t *devices;        /* the devices it is given */
    int n_devices;
} cl_place_task;
/* Starts a queued job where a statement is a round trip (PostgreSQL), in
 * one statement: what store_job_transition(queued -> starting, actor
 * "scheduler", reason why) with its timeline row and console note,
 * cluster_job_next_attempt, cluster_job_set_size(workers, 0) and
 * cluster_task_insert / cluster_alloc_insert for each task write one by
 * one. Returns the new attempt (> 0); 0 when the job is no longer queued
 * or one of the devices is held or gone, in which case nothing was written
 * (the caller needs no savepoint); -1 on error (a device taken or removed
 * by a transaction that commits while the statement runs fails it: the
 * caller rolls back); -2 on SQLite, which writes nothing here (write it
 * step by step, under a savepoint). */
int cluster_place(db *d, int64_t job_id, const char *why, int workers, int64_t now, const cl_place_task *tasks,
                  int n_tasks);
/* A job to start (cluster_place_many); attempt is set by the call. */
typedef struct cl_place_job {
    int64_t job_id;
    const char *why;
    int workers;
    const cl_place_task *tasks;
    int n_tasks;
    int attempt;                   /* out: the new attempt, 0 when it was skipped */
} cl_place_job;
/* Starts n queued jobs in one statement (PostgreSQL), each as
 * cluster_place starts one: a job no longer queued, or one of whose devices
 * is held or gone, is skipped (attempt 0; nothing of it written), the
 * others are placed (attempt > 0). Returns the number placed, -1 on error
 * (as cluster_place's; the caller rolls back), -2 on SQLite. The devices of
 * two jobs must differ (the core never gives one twice). */
int cluster_place_many(db *d, cl_place_job *jobs, int n, int64_t now);
/* attempt + 1 of a job just moved to 'starting'; returns the new attempt
 * (the number of times the job has been started) or -1. */
int cluster_job_next_attempt(db *d, int64_t job_id, int64_t now);
/* Waiting reason of a queued job (no event). 0 or -1. */
int cluster_job_set_reason(db *d, int64_t job_id, const char *reason);
/* Whether this store's writes are best made many rows a statement (PostgreSQL,
 * where each statement is a round trip), and the reasons of n queued jobs so,
 * in one UPDATE (as cluster_job_set_reason each: a job no longer queued keeps
 * its own): 0 or -1. On SQLite cluster_batches_writes is 0 and
 * cluster_jobs_set_reasons writes one by one. */
int cluster_batches_writes(db *d);
int cluster_jobs_set_reasons(db *d, const int64_t *job_ids, const char *const *reasons, int n);
/* The reason of a running job (an elastic job below its most workers says
 * why it does not grow); only while it is running. 0 or -1. */
int cluster_job_set_running_reason(db *d, int64_t job_id, const char *reason);
/* An elastic job's size: the workers of its attempt and a resize's target
 * (0: none under way). 0, or -1 (no such job, or a store error). */
int cluster_job_set_size(db *d, int64_t job_id, int workers_now, int resize_to);
int cluster_team_set_usage(db *d, int64_t team_id, double usage, int64_t at);
/* A user's decayed usage in a team (user_usage), made when it has none. 0 or -1. */
int cluster_user_set_usage(db *d, int64_t team_id, int64_t user_id, double usage, int64_t at);
/* Team shares (admin). quota < 0 = none; weight <= 0 leaves it. 0, 1 no team, -1. */
int cluster_team_set_shares(db *d, const char *name, double weight, int guarantee, int set_guarantee,
                            int quota, int set_quota);

/* The most interactive jobs of the team running at once (teams.max_interactive);
 * < 0 = no limit. 0, 1 no team, -1. */
int cluster_team_set_max_interactive(db *d, const char *name, int max_interactive);

/* Tasks of node_id not exited: marked exited with reason; the ids of their
 * jobs into *jobs (malloc'd). Returns the count of jobs or -1. */
int cluster_node_tasks_lost(db *d, int64_t node_id, const char *reason, int64_t now, int64_t **jobs);
int cluster_failure_add(db *d, int64_t job_id, int64_t node_id);
/* Frees the devices of exited tasks. Returns rows freed or -1. */
int cluster_release_exited(db *d);
/* Jobs in starting/running whose current attempt has tasks and all of them
 * exited, with the reason of the first task that was stopped by the
 * scheduler (preempted..., node ... lost, max_runtime...), "" otherwise. */
typedef struct cl_reaped {
    int64_t job_id;
    int attempt, max_restarts;
    char reason[CL_REASON_MAX];
} cl_reaped;
int cluster_jobs_all_exited(db *d, cl_reaped **out);
/* The same two among the given jobs and tasks only (those whose rows
 * changed since the caller last looked: the scheduler follows the change
 * log), at the cost of an indexed look-up each instead of a scan of every
 * active job and every exited task: on SQLite a statement each, on
 * PostgreSQL (where each is a round trip) one statement for the whole list
 * (= ANY of a bigint[]), the jobs' rows in the list's order when it is
 * sorted. */
int cluster_jobs_all_exited_of(db *d, const int64_t *jobs, int n_jobs, cl_reaped **out);
int cluster_release_exited_tasks(db *d, const int64_t *tasks, int n_tasks);
/* queued_at for a requeued job's state change is set by store_job_transition. */

/* ---------------------------------------------------------------- node tokens
 * A per-node token is stored like every token (tokens.hash = sha256 hex,
 * kind 'node') with its node in tokens.node_id. */

/* Revokes the node's tokens and records a new one (hash: sha256 hex), in
 * its own transaction. 0 or -1. */
int cluster_node_token_issue(db *d, int64_t node_id, const char *hash, int64_t now);
/* Revokes the node's tokens: the count revoked, -2 when no such node (the
 * hostname goes to hostname when given), -1 on error. */
int cluster_node_token_revoke(db *d, int64_t node_id, int64_t now, char *hostname, size_t cap);
/* Revokes every join token (kind 'node', no node_id) but the one with
 * keep_hash: the count, or -1. */
int cluster_join_tokens_revoke(db *d, const char *keep_hash, int64_t now);
/* The node a task runs on: 0, 1 when no such task, -1 on error. */
int cluster_task_node(db *d, int64_t task_id, int64_t *node_id);
/* 1 when the node has (or had) a task of the job, 0 when not, -1 on error. */
int cluster_node_runs_job(db *d, int64_t node_id, int64_t job_id);

/* ---------------------------------------------------------------- evaluators
 * The evaluator side-car (resources.evaluator) is placed beside a gang
 * after it, by scheduler.c's evaluator step (docs/scheduler.md). */

#define CL_EVAL_AVOID_MAX 16

/* A starting or running job that wants an evaluator and whose current
 * attempt has none yet (and no task stopping or exited). */
typedef struct cl_eval_want {
    int64_t job_id;
    int attempt;
    int64_t memory_mb;              /* resources.memory per task, 0 = default share */
    int64_t chief_node;             /* worker-0's node, 0 none */
    int n_avoid;
    int64_t avoid[CL_EVAL_AVOID_MAX]; /* nodes that failed the job twice */
} cl_eval_want;

/* Every node with the memory its live tasks hold (evaluators included). */
typedef struct cl_eval_node {
    int64_t id;
    int ready, cpu_slots;
    int64_t memory_mb, used_mb;
    char hostname[CL_NAME_MAX];
} cl_eval_node;

/* The jobs wanting an evaluator, in id order: their count (*out malloc'd), or -1. */
int cluster_evaluators_wanted(db *d, cl_eval_want **out);
/* Every node, in id order: their count (*out malloc'd), or -1. */
int cluster_eval_nodes(db *d, cl_eval_node **out);
/* Inserts the evaluator task (type 'evaluator', index 0, port 0, state
 * assigned) of the job's attempt: 0 done, 1 skipped (the job moved on or has
 * its evaluator already), -1 error. In the caller's transaction. */
int cluster_evaluator_insert(db *d, int64_t job_id, int attempt, int64_t node_id, int64_t memory_mb, int64_t now);
/* Whether the job has an event of that kind with exactly that reason: 1, 0, or -1. */
int cluster_event_exists(db *d, int64_t job_id, const char *kind, const char *reason);

#endif
