/* proc.h - child processes for the agent: each task runs in its own process
 * group with stdout and stderr on one pipe, dies with the agent
 * (PR_SET_PDEATHSIG), and is stopped by signalling its whole group.
 * Signals reach an event loop through a self-pipe.
 *
 * defines: proc_child_setup, proc_spawn, proc_signal_group, proc_reap, proc_self_exe,
 *          proc_sigpipe_open, proc_sigpipe_drain, proc_set_nonblock,
 *          proc_exit_describe */
#ifndef TRAINYARD_PROC_H
#define TRAINYARD_PROC_H

#include <stddef.h>
#include <sys/types.h>

/* Starts exe with argv (NULL-terminated) and the agent's environment plus
 * env_add ("NAME=value", NULL-terminated; they replace variables of the same
 * name). The child: new process group (its pid), SIGTERM when the thread
 * that spawned it dies, default signal dispositions, stdout and stderr on
 * the write end of a pipe whose read end (non-blocking, close-on-exec) is
 * returned in *out_fd. Returns the pid, or -1 with errno set (nothing
 * left open). Call it from the thread that lives as long as the children. */
/* In a child between fork and exec (async-signal-safe only): its own process
 * group when new_group, death_sig when the parent dies (0: none), every
 * signal back to its default and none blocked, stdin from /dev/null when
 * null_stdin. Returns -1 when parent (the pid before fork) is gone already. */
int proc_child_setup(pid_t parent, int new_group, int death_sig, int null_stdin);

/* ... at nice value `nice` (0: the agent's own; 1-19 lower the child's
 * priority, and its threads' and children's, which inherit it), and under
 * SCHED_IDLE when idle (the kernel then runs it only on CPU time no normal
 * thread wants, and a normal thread that wakes takes the core at once). */
/* With iso (NULL: none), the task enters its isolation before the rest
 * (executor/isolate.h): cgroups, private mounts, a session of its own
 * instead of a process group, its uid; the environment is then the agent's
 * locale, PATH and thread settings only, plus env_add. TRAINYARD_TOKEN of
 * the agent's environment is never passed on. */
struct iso_task;
pid_t proc_spawn(const char *exe, char *const argv[], char *const env_add[], int nice, int idle,
                 const struct iso_task *iso, int *out_fd);

/* kill(-pgid, sig); 0, or -1 (errno; ESRCH when the group is gone). */
int proc_signal_group(pid_t pgid, int sig);

/* Non-blocking waitpid: 1 and *status when pid exited, 0 when it still runs,
 * -1 on error (e.g. not our child). */
int proc_reap(pid_t pid, int *status);

/* The start time of pid in clock ticks since boot (/proc/PID/stat field
 * 22): with the pid it names one process even after pid reuse. 0 when the
 * process does not exist. */
unsigned long long proc_start_ticks(pid_t pid);

/* The path of the running binary (/proc/self/exe): 0 or -1. */
int proc_self_exe(char *out, size_t outlen);

/* Installs handlers for SIGCHLD, SIGTERM, SIGINT and SIGHUP that write the
 * signal number to a non-blocking pipe, and ignores SIGPIPE. Returns the
 * read end to poll(), or -1. One per process. */
int proc_sigpipe_open(void);

/* Reads every pending signal byte; sets the flags that were seen. */
void proc_sigpipe_drain(int fd, int *got_chld, int *got_term);

int proc_set_nonblock(int fd);

/* Fills exit_code / signal from a wait status and a short phrase into why
 * ("exited with code 1", "killed by signal 9 (Killed)"). */
void proc_exit_describe(int status, int *exit_code, int *sig, char *why, size_t whylen);

#endif
