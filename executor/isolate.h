/* isolate.h - teams kept apart on a node. When the agent runs as root, each
 * task runs under a uid of its job's own from a range (no supplementary
 * groups, no new privileges, its own session), with a private /tmp, /var/tmp
 * and /dev/shm and a /proc that shows no other user's process, in a job
 * directory that belongs to that uid (0700) and goes when the task ends, and
 * in a cgroup of its own that limits its memory, CPU weight, processes and
 * GPUs. A task killed by its memory limit is told apart from other deaths.
 * An agent that cannot do this (not root) runs tasks as itself and says so.
 * Matrix, limits and tests: docs/reliability.md, "Isolation on the node".
 *
 * Between fork and exec only iso_task_enter runs, and it makes raw system
 * calls only: everything it needs is prepared by iso_task_prepare.
 *
 * defines: iso_options, iso_options_default, iso_format_mb,
 *          isolator, iso_init, iso_release, iso_describe, iso_task,
 *          iso_task_prepare, iso_task_enter, iso_ctr_cgroup,
 *          iso_task_finish, iso_sweep, iso_env_keep, iso_bpf_deny_gpus */
#ifndef TRAINYARD_ISOLATE_H
#define TRAINYARD_ISOLATE_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define ISO_MAX_GPUS 64
#define ISO_MAX_JOBS 256
#define ISO_CTLS 4                 /* v1 hierarchies used: memory, cpu, pids, devices */

enum { ISO_AUTO = 0, ISO_NONE = 1, ISO_USER = 2 };          /* --isolation auto|none|user */
enum { ISO_CG_NONE = 0, ISO_CG_V1 = 1, ISO_CG_V2 = 2 };

typedef struct iso_options {
    int mode;                      /* ISO_AUTO: user when root, else none */
    unsigned uid_first, uid_last;  /* --task-uids (default 200000-299999) */
    char task_root[PATH_MAX];      /* --task-dir (default /var/lib/trainyard-tasks) */
    char lock_dir[PATH_MAX];       /* uids held, one lock file each, shared by every agent
                                    * of the host (default /run/trainyard/uids) */
    int pids_max;                  /* --task-pids-max (default 4096; 0: no limit) */
    int64_t memory_mb;             /* --memory: what the node offers its tasks (0: detect) */
    char data_root[PATH_MAX];      /* bound, read-only, where a task would not reach it */
    int cpu_slots;
    int n_gpus;
    int gpu_minor[ISO_MAX_GPUS];   /* the /dev/nvidiaN minor of each CUDA device index */
} iso_options;

void iso_options_default(iso_options *o);

/* 4096 -> "4 GiB", 1536 -> "1.5 GiB", 512 -> "512 MiB". */
void iso_format_mb(int64_t mb, char *out, size_t outlen);

typedef struct iso_job {           /* a job with tasks on this node: its uid */
    int64_t job;
    unsigned uid;
    int refs;
    int lock_fd;                   /* flock held on lock_dir/UID while the job holds the uid */
    char shm[PATH_MAX];            /* the job's /dev/shm on this node ("" none) */
} iso_job;

typedef struct isolator {
    iso_options opt;
    int user;                      /* tasks run under uids of their own */
    int mount_ns;                  /* private /tmp, /var/tmp and /dev/shm */
    int hidepid;                   /* a /proc of its own that hides other users' processes */
    int cg;                        /* ISO_CG_* */
    int have_ctl[ISO_CTLS];        /* memory, cpu, pids, devices limits applied */
    char cg_base[ISO_CTLS][PATH_MAX]; /* the agent's parent cgroup per v1 hierarchy; v2: [0] */
    int64_t memory_mb;             /* what the node offers its tasks */
    char reason[256];              /* why tasks are not (fully) isolated */
    char agent_dir[PATH_MAX];      /* task_root/agent-PID: this agent's job directories */
    int exe_fd;                    /* O_PATH of the trainyard binary: exec'd by a uid that
                                    * may not reach its directory */
    unsigned cursor;               /* next uid tried (round robin from a random start) */
    int have_var_tmp, have_shm;
    int data_bind;                 /* 1: tasks cannot reach the data root by its path (under
                                    * /tmp, or below a parent others cannot enter): bind it */
    char data_cover[PATH_MAX];     /* that parent, hidden under a tmpfs in the task ("": /tmp) */
    iso_job jobs[ISO_MAX_JOBS];
    int n_jobs;
    char **grave;                  /* cgroup directories not yet empty: removed later */
    int n_grave;
} isolator;

/* Finds what this node can enforce and prepares it (directories, cgroup
 * parents, the binary's fd). With ISO_USER and no way to switch users it
 * fails (-1, err). Never fails for ISO_AUTO/ISO_NONE: the reason says what
 * is not enforced. */
int iso_init(isolator *iso, const iso_options *o, const char *exe, char *err, size_t errlen);
void iso_release(isolator *iso);

/* The node's isolation as JSON text for POST /nodes ({"mode","cgroup",
 * "enforced":[...],"reason"}); heap string. */
char *iso_describe(const isolator *iso);

typedef struct iso_task {
    int on;                        /* 0: the task runs as the agent does */
    int64_t id, job;
    unsigned uid;
    int64_t memory_mb;             /* the memory limit applied (0: none) */
    int slots;                     /* CPU weight in slots */
    char dir[PATH_MAX];            /* the job directory: HOME, working directory */
    char tmp[PATH_MAX];            /* dir/tmp: the task's /tmp and /var/tmp */
    char shm[PATH_MAX];            /* the job's /dev/shm ("" none) */
    int n_cg;
    char cg[ISO_CTLS][PATH_MAX];   /* the task's cgroup directories */
    /* for the child, prepared before fork */
    int mount_ns, hidepid, var_tmp, exe_fd;
    int data_bind;                 /* the isolator's */
    char data_path[PATH_MAX];      /* the data root's path, recreated in the task's mounts */
    char data_cover[PATH_MAX];     /* a tmpfs here first ("": the private /tmp holds the path) */
    int keep_root;                 /* the worker stays root (it starts the task's container,
                                    * which runs as uid): cgroups, job directory and session
                                    * only, no private mounts, no drop */
    char ctr_rel[PATH_MAX];        /* its container's parent cgroup below each hierarchy's
                                    * root ("" none: iso_ctr_cgroup) */
    int ctr_efd, ctr_efd_on;       /* that cgroup's OOM notification (eventfd) */
} iso_task;

/* Prepares a task: its job's uid (allocated when the job has none on this
 * node), its job directory, its cgroup with the limits (memory_mb 0: the
 * node's default share for `slots` of its cpu slots, or of its GPUs when
 * gpus is non-empty: "0,2" the CUDA indices it holds). 0, or -1 with err
 * (nothing left behind). With isolation off it sets t->on = 0 and returns 0. */
int iso_task_prepare(isolator *iso, int64_t task_id, int64_t job_id, int64_t memory_mb, int slots,
                     const char *gpus, iso_task *t, char *err, size_t errlen);

/* In the child, between fork and exec (raw system calls only): joins the
 * cgroups, makes the private mounts, starts a session and drops to the
 * task's uid with no new privileges. 0, or -1 with a message on fd 2. */
int iso_task_enter(const iso_task *t);

/* An image task's container runs under a cgroup of the agent's (podman
 * --cgroup-parent: parent gets its path), not the task's: on cgroup v1 a
 * memory cgroup limited to the task's memory less a few MiB (the
 * container's own limit is the task's: this one meets the charges first),
 * watched for the kernel's OOM notification, so that iso_task_finish tells
 * a container the limit killed apart from any other exit 137. No-op (0,
 * parent "") without cgroup v1 memory or a memory limit; -1 with err when
 * it cannot be made (the container then runs without it). name: the
 * container's. */
int iso_ctr_cgroup(isolator *iso, iso_task *t, const char *name, char *parent, size_t parentlen, char *err,
                   size_t errlen);

/* The task's main process has exited: kills what it left in its cgroup,
 * reports whether the memory limit killed anything (*oom = 1), removes the
 * cgroup and the job directory, and frees the job's uid with its last task.
 * Safe on a task with on = 0. */
void iso_task_finish(isolator *iso, iso_task *t, int *oom);

/* Retries removing cgroups that were still busy. */
void iso_sweep(isolator *iso);

/* Attaches to the cgroup v2 directory cgdir a device program that denies
 * the GPUs /dev/nvidia(minors[i]) and allows every other device (cgroup
 * v2's devices controller is this BPF hook). 0, or -1 with err. */
int iso_bpf_deny_gpus(const char *cgdir, const int *minors, int n, char *err, size_t errlen);

/* 1 when an isolated task may inherit the agent's variable `e` ("NAME=..."):
 * the locale, PATH, thread and sanitizer settings; never a token. */
int iso_env_keep(const char *e);

#endif
