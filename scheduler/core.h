/* core.h - the pure scheduling core: one pass over an in-memory snapshot of
 * the cluster (nodes, devices, teams, running and queued jobs) that decides
 * which gangs start where, which jobs are stopped for whom, and why every
 * other job waits. No SQLite, no HTTP, no clock: scheduler.c loads the
 * snapshot from storage and applies the decisions; the property tests and
 * bench/sched_sim drive it directly. See docs/scheduler.md.
 *
 * defines: sched_config_default, sched_pass_core, sched_result_init,
 *          sched_user_key,
 *          sched_result_release, sched_admit, sched_reason_format,
 *          sched_usage_decay, sched_job_devices, sched_task_mem */
#ifndef TRAINYARD_SCHED_CORE_H
#define TRAINYARD_SCHED_CORE_H

#include <stddef.h>
#include <stdint.h>

/* Device kinds (the API maps the spec's device names onto these). */
enum { SCHED_CPU = 0, SCHED_GPU = 1, SCHED_KINDS = 2 };

#define SCHED_REASON_MAX 192

/* ---------------------------------------------------------------- config */
typedef struct sched_config {
    int backfill;                  /* 1: EASY backfill behind the head job */
    int preemption;                /* 1: preempt for priority and guarantees */
    double aging_s;                /* seconds of waiting worth +1 priority (0: off) */
    int aging_max;                 /* most priority aging may add */
    double usage_window_s;         /* decay time constant of team device-seconds */
    double usage_blend;            /* share = blend*in-use + (1-blend)*decayed usage */
    int64_t heartbeat_timeout_ms;  /* a node silent this long is lost */
    int64_t node_loss_not_before_ms; /* no node is declared lost before (0: any time);
                                    * sched_start sets start + timeout, so a restarted
                                    * server waits for the agents' heartbeats */
    int64_t preempt_grace_ms;      /* a stopped job's tasks have this long to exit */
    int port_base;                 /* task ports: [port_base, port_base+port_count) */
    int port_count;                /* at most 1024 */
    int64_t tick_ms;               /* scheduler thread period */
    int64_t resize_interval_ms;    /* an elastic job grows at most once per this, counted
                                    * from the start of its attempt (0: any time) */
} sched_config;

/* Fills the defaults documented in docs/scheduler.md. */
void sched_config_default(sched_config *c);

/* ---------------------------------------------------------------- snapshot */
typedef struct sched_device {
    int64_t id;
    int64_t job_id;                /* holder, 0 when free */
} sched_device;

/* Memory held on a node by the live tasks of one job (MiB). */
typedef struct sched_mem {
    int64_t job_id;                /* holder; a job not in running holds it for good */
    int64_t mb;
} sched_mem;

/* A node's devices held by one job, of one kind (see sched_node.sum). */
typedef struct sched_hold {
    int64_t job_id;
    int kind;
    int count;
} sched_hold;

typedef struct sched_node {
    int64_t id;
    int ready;                     /* 1: may take new tasks (not lost, not drained) */
    int n_dev[SCHED_KINDS];
    sched_device *dev[SCHED_KINDS];/* (n_dev[k]) GPUs and CPU slots */
    /* What dev says, summed, for a caller that keeps it across passes (the
     * mirror): with sum 1 the core reads n_free and holds instead of
     * walking every device (it still reads dev where it places a task).
     * They must say exactly what dev says: n_free[k] the devices of kind k
     * with job_id 0; holds one entry per (kind, job) holding devices here,
     * ordered by kind, then by the job's first device in dev. sum 0: the
     * core counts them itself. */
    int sum;
    int n_free[SCHED_KINDS];
    int n_holds;
    const sched_hold *holds;       /* (n_holds) */
    int n_ports;
    const int *ports;              /* (n_ports) ports of live tasks on the node */
    int64_t mem_mb;                /* memory the node offers its tasks (MiB); 0: not
                                    * reported, memory does not constrain placement here */
    int n_mem;
    const sched_mem *mem;          /* (n_mem) memory held by live tasks, per job */
    int runtimes;                  /* SCHED_RT_* the node's agent can run tasks in (0: host) */
} sched_node;

/* What a node can run a task in, and what a job needs: a job with an
 * image (environment.image) goes only where the agent has podman. */
#define SCHED_RT_HOST 1
#define SCHED_RT_PODMAN 2

typedef struct sched_team {
    int64_t id;
    double weight;                 /* > 0 */
    int guarantee;                 /* devices always theirs when they ask */
    int quota;                     /* most devices in use, -1 = no cap */
    double usage;                  /* decayed device-seconds (sched_usage_decay) */
    int limit_interactive;         /* 1: max_interactive applies (0: no limit) */
    int max_interactive;           /* the most interactive jobs running at once (>= 0) */
} sched_team;

/* A user's share of its team: the level of the fair-share tree below the
 * teams (docs/scheduler.md, "Fair share within a team"). User 0 is the
 * team's service account (jobs submitted with a team token or the admin's),
 * one more user of the team. A (team, user) with no entry has usage 0. */
typedef struct sched_user {
    int team;                      /* index into teams */
    int64_t user;                  /* user id, 0: the service account */
    double usage;                  /* decayed device-seconds at now_ms */
} sched_user;

typedef struct sched_running {
    int64_t id;
    int team;                      /* index into teams */
    int priority;
    int preemptible;
    int stopping;                  /* 1: already asked to stop (devices still held) */
    int devices;                   /* devices counted against the team */
    int64_t started_at_ms;
    int64_t last_checkpoint_ms;    /* 0: none yet */
    int64_t end_ms;                /* expected end: start + max_runtime_s */
    /* elastic jobs (workers_min < workers_max); all 0 for a fixed gang */
    int workers_now;               /* workers of the running attempt */
    int workers_min, workers_max;
    int devices_per_worker, kind;
    int64_t mem_mb;                /* its resources.memory per task (0: the default share) */
    int may_grow;                  /* running, not stopping, past the resize interval */
    int64_t user;                  /* who submitted it (0: the team's service account) */
    int interactive;               /* 1: a notebook or a shell: counted against its team's
                                    * max_interactive, and never preempted while its team
                                    * is within its guarantee */
} sched_running;

typedef struct sched_job {
    int64_t id;
    int team;                      /* index into teams */
    int priority;
    int workers, devices_per_worker, kind, ps;
    int64_t queued_at_ms;
    int64_t max_runtime_s;
    int n_avoid;
    const int64_t *avoid;          /* (n_avoid) node ids this job must not use */
    int64_t mem_mb;                /* memory per task (MiB, the spec's resources.memory);
                                    * 0: each task gets its node's default share */
    int workers_min;               /* elastic: the fewest workers it may start with
                                    * (workers is the most); 0 or == workers: a fixed gang */
    int resize_to;                 /* elastic, requeued by a resize: place at most this
                                    * many workers (0: up to workers) */
    int runtime;                   /* SCHED_RT_* it needs (0: any node) */
    int64_t user;                  /* who submitted it (0: the team's service account) */
    int interactive;               /* 1: a notebook or a shell (max_interactive applies) */
} sched_job;

typedef struct sched_snapshot {
    int64_t now_ms;
    int n_nodes_registered;        /* all nodes ever joined, any state */
    int n_nodes;
    sched_node *nodes;             /* (n_nodes) */
    int n_teams;
    sched_team *teams;             /* (n_teams) */
    int n_running;
    sched_running *running;        /* (n_running) */
    int n_queued;
    sched_job *queued;             /* (n_queued) in id order (ids distinct; the decisions
                                    * do not depend on it: the order is computed fastest
                                    * when queued_at mostly grows with the id) */
    int n_users;
    const sched_user *users;       /* (n_users) distinct (team, user) pairs, any order */
} sched_snapshot;

/* ---------------------------------------------------------------- result */
typedef enum {
    SW_NONE = 0,
    SW_NO_NODES,        /* no nodes have joined */
    SW_WIDE,            /* infeasible: a worker wider than the largest node: a=need b=largest */
    SW_LARGE,           /* infeasible: gang larger than the cluster: a=need b=have */
    SW_PS_INFEASIBLE,   /* infeasible: a=ps slots b=cpu slots in the cluster */
    SW_QUOTA,           /* team quota: a=in use b=quota c=needs */
    SW_BLOCK,           /* needs a kind on one node; largest free block is b */
    SW_GANG,            /* needs c workers x a kind; only b fit now */
    SW_PS,              /* needs a cpu slots for ps; b free */
    SW_RESERVED,        /* fits now but reserved for job a */
    SW_PREEMPTING,      /* waiting for a preempted jobs to stop */
    SW_MEM,             /* a task needs a MiB on one node; the most free is b; c 0 worker, 1 ps */
    SW_MEM_GANG,        /* needs c workers with a MiB each; only b fit in the free memory */
    SW_MEM_WIDE,        /* infeasible: a task asks a MiB; the largest node offers b */
    SW_RUNTIME,         /* infeasible: it needs a container runtime (podman) no ready node has:
                         * a=nodes with it b=nodes */
    SW_INTERACTIVE,     /* its team runs a interactive jobs, its max_interactive b */
    SW_KEPT_INTERACTIVE /* only preempting a interactive jobs (b the first's id) would make
                         * room; they are not preempted while their team is within its
                         * guarantee */
} sched_why;

typedef struct sched_task {
    int type;                      /* 0 worker, 1 ps */
    int index;
    int node;                      /* index into snapshot nodes */
    int64_t node_id;
    int port;
    int kind;
    int n_dev;
    int dev_off;                   /* devices: result dev_ids[dev_off .. +n_dev) */
    int64_t mem_mb;                /* the task's memory (sched_task_mem), its cgroup limit */
} sched_task;

typedef struct sched_place {
    int job;                       /* index into snapshot queued */
    int64_t job_id;
    int workers;                   /* workers placed (an elastic job: min..max) */
    int task_off, n_tasks;         /* result tasks[task_off .. +n_tasks) */
    int n_nodes;                   /* distinct nodes the gang spans */
    int backfill;                  /* 1: started out of order by backfill */
} sched_place;

typedef struct sched_victim {
    int running;                   /* index into snapshot running */
    int64_t job_id;
    int64_t for_job;
    int guarantee;                 /* 1: reclaimed for a team's guarantee, 0: priority */
    int lend;                      /* 1: an elastic job of no lower priority giving back
                                    * what it grew into (shrink_to >= its min) */
    int shrink_to;                 /* elastic victim: restarted with this many workers
                                    * (>= its min) instead of waiting whole; 0: preempted */
} sched_victim;

/* An elastic job asked to grow: it is stopped at a step boundary (its
 * checkpoint) and placed again with `to` workers. */
typedef struct sched_grow {
    int running;                   /* index into snapshot running */
    int64_t job_id;
    int from, to;
    int free_devices;              /* devices of its kind free when decided */
} sched_grow;

typedef struct sched_outcome {
    int rank;                      /* position in the order considered (0 first) */
    int place;                     /* index into result place, -1 when waiting */
    int why;                       /* sched_why */
    int kind;
    int64_t a, b, c;
    int64_t est_start_ms;          /* 0: no reservation */
    int eff_priority;              /* priority after aging */
} sched_outcome;

typedef struct sched_user_use {
    int team;                      /* index into teams */
    int64_t user;
    int devices;
} sched_user_use;

typedef struct sched_result {
    sched_place *place;   int n_place, cap_place;
    sched_task *tasks;    int n_tasks, cap_tasks;
    int64_t *dev_ids;     int n_dev, cap_dev;
    sched_victim *stops;    int n_stops, cap_stops;
    sched_grow *grows;    int n_grows, cap_grows;
    sched_outcome *out;   int n_out;     /* (n_queued) one per queued job, same index */
    int *order;                          /* (n_queued) order[rank] = queued index */
    int64_t head_job;                    /* job holding the reservation, 0 none */
    int64_t head_start_ms;
    int n_backfilled;
    uint8_t starving[SCHED_KINDS];       /* a queued job waits for devices of this kind */
    /* the devices each (team, user) held when the pass began (running jobs
     * of the snapshot, stopping ones included), one entry per pair holding
     * any: what the caller bills to user usage, as it bills teams */
    sched_user_use *user_use; int n_user_use;
} sched_result;

void sched_result_init(sched_result *r);
void sched_result_release(sched_result *r);

/* One scheduling pass. Reads s (never modifies it), fills r (released and
 * re-filled if used before). Returns 0, or -1 when the snapshot is malformed
 * (a team index out of range, a device held by a job not in running). */
int sched_pass_core(const sched_snapshot *s, const sched_config *cfg, sched_result *r);

/* The reason a queued job waits, as people read it, into out. */
void sched_reason_format(const sched_outcome *o, char *out, size_t cap);

/* Admission: could the job ever run on these nodes (ready or not, avoided
 * nodes ignored)? 0 when feasible; -1 with a why (SW_NO_NODES, SW_WIDE,
 * SW_LARGE, SW_PS_INFEASIBLE) and the numbers in o. */
int sched_admit(const sched_snapshot *s, const sched_job *j, sched_outcome *o);

/* Team usage after dt_s seconds with `in_use` devices, decaying with time
 * constant tau_s: u*e^(-dt/tau) + in_use*tau*(1-e^(-dt/tau)). */
double sched_usage_decay(double usage, double in_use, double dt_s, double tau_s);

/* A user's fair-share key within its team (lower goes first): blend x its
 * devices in use / all devices of ready nodes + (1 - blend) x its usage /
 * the usage of all its team's users (0 when that is 0). cap_all is the
 * ready nodes' devices (0: that term is 0). */
double sched_user_key(double in_use, double usage, double team_users_usage, double cap_all, double blend);

/* Devices a queued job counts against its team (workers * devices_per_worker). */
int sched_job_devices(const sched_job *j);

/* The memory (MiB) a task of j needs on node n: the job's mem_mb when
 * given, else the node's default share, floor(n->mem_mb x the task's
 * devices / the node's devices of that kind) (a worker: devices_per_worker
 * of j's kind; a ps, type 1: one CPU slot). 0 when neither says. */
int64_t sched_task_mem(const sched_node *n, const sched_job *j, int type);

#endif
