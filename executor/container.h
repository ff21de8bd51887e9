/* container.h - a command job's program run in an OCI image, by the node's
 * own container runtime (podman), never one of ours.
 *
 * The agent decides that a task runs in an image (its spec has
 * environment.image and the agent offers the "podman" runtime) and hands the
 * worker what the container needs in TRAINYARD_CONTAINER (JSON: the podman
 * binary, the container's name, the task's uid, its limits, its job
 * directory, the data root, its GPUs). The worker of such a task stays root
 * (in the task's cgroup, its own session): it pulls the image under a lock
 * shared by the node's tasks, then starts `podman run` in place of the
 * program, with the program's environment passed by name (-e NAME), as the
 * task's uid, with the task's memory, pids and CPU limits, the host's
 * network, the job directory (context and checkpoint directory) mounted at
 * the same path, the data root read-only, and only the task's GPUs.
 * docs/command-jobs.md, "Images", has the whole contract.
 *
 * defines: ctr_opts, ctr_parse, ctr_pull, ctr_argv, ctr_remove, ctr_env_passes */
#ifndef TRAINYARD_CONTAINER_H
#define TRAINYARD_CONTAINER_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ctr_opts {
    char podman[PATH_MAX];         /* the podman binary */
    char runtime[64];              /* podman's --runtime ("" its default) */
    char name[128];                /* the container's name: trainyard-<job dir's name> */
    unsigned uid;                  /* the task's uid (and gid) inside */
    int64_t memory_mb;             /* 0: no limit */
    int pids;                      /* 0: no limit */
    int cpu_shares;                /* 1024 a slot */
    long nofile, nproc;            /* rlimits set in the container, at or below the hard ones */
    char dir[PATH_MAX];            /* the job directory, mounted at the same path */
    char data_root[PATH_MAX];      /* "" none; else mounted read-only at the same path */
    char gpus[256];                /* "0,2": the CUDA indices of the task's GPUs ("" none) */
    char lock_dir[PATH_MAX];       /* where the node's pull locks are */
    char cgroup_parent[PATH_MAX];  /* podman --cgroup-parent: the agent's watched cgroup ("" none) */
    long agent;                    /* label trainyard.agent: the agent's pid (ctr_sweep) */
    int64_t job;                   /* labels: trainyard.job, trainyard.task (set by the worker) */
    int attempt;                   /* (set by the worker) a pull "always" is once an attempt a node */
    char task[32];
} ctr_opts;

/* Reads TRAINYARD_CONTAINER. 1 when set and read, 0 when not set, -1 with
 * err when it is set but unreadable. */
int ctr_parse(ctr_opts *o, char *err, size_t errlen);

/* What a pull did, for the job's timeline. */
typedef void (*ctr_pull_note)(void *ctx, int pulling, const char *image, double seconds);

/* Makes the image present: with always, pulls it (once per attempt of the
 * job on this node: the gang's other tasks here find it done); else pulls it only when
 * absent or when team has not pulled it on this node yet. An image another
 * team pulled with its login is in the node's store; a team that never
 * pulled it itself (so never showed the registry a right to it) pulls it
 * once, and the registry decides (the list of teams that did is kept in
 * lock_dir beside the lock). A localhost/ image is the node's own (podman
 * build or import there): never pulled, an error when absent. One pull of an image at a time on the node (a
 * lock in lock_dir): a task that waited finds it there. authfile: a registry login file for
 * the pull ("" none). note(ctx, 1, ...) before a pull starts, note(ctx, 0,
 * ..., seconds) once it is done. 0, or -1 with the registry's answer
 * (podman's last lines) in err. */
int ctr_pull(const ctr_opts *o, const char *image, int always, int64_t team, const char *authfile,
             ctr_pull_note note, void *ctx, char *err, size_t errlen);

/* The argv of `podman run` for the program argv in image, starting in wd,
 * passing by name each variable of envp that ctr_env_passes takes (their
 * values come from podman's own environment, so none shows in a process
 * listing). NULL-terminated, owned by the caller (free each, then the array). */
char **ctr_argv(const ctr_opts *o, const char *image, const char *wd, char *const *prog_argv, char *const *envp);

/* 1 when an entry of the program's environment ("NAME=value") goes into the
 * container: not the host's paths (PATH, LD_LIBRARY_PATH, PYTHONPATH,
 * TMPDIR), nor trainyard's own plumbing (TRAINYARD_CONTAINER,
 * TRAINYARD_CA_PEM) nor the sanitizers' options; spec_env: the spec's own
 * variables, which always go. */
int ctr_env_passes(const char *entry, char *const *spec_env);

/* In an image the task's GPUs are the container's only ones, numbered from
 * 0: CUDA_VISIBLE_DEVICES in envp (owned entries) becomes "0,1,..". */
void ctr_gpu_renumber(char **envp, const char *gpus);

/* chown -R (no link followed) of dir to uid:uid. */
void chown_tree(const char *dir, unsigned uid);

/* Writes a podman auth file for one registry login (0600, in dir, made
 * with mkstemp) into path. 0 or -1. */
int ctr_authfile(const char *dir, const char *registry, const char *user, const char *password, char *path,
                 size_t pathlen);

/* Finds the podman binary (name looked up on PATH, or a path) into path
 * and runs `podman --version` into version. 0 when it runs. */
int ctr_probe(const char *podman, char *path, size_t pathlen, char *version, size_t verlen);

/* Removes the containers a dead agent of this host left (label
 * trainyard.agent = a pid that is not running, and not self): an agent
 * killed outright takes its workers with it, not their containers. The
 * number removed. */
int ctr_sweep(const char *podman, long self);

/* Removes the container (stopped at once when it still runs). Best effort;
 * waits at most timeout_s. */
void ctr_remove(const char *podman, const char *name, int timeout_s);

#endif
