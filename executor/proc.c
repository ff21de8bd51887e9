/* proc.c - process groups, pipes and signals for the agent (see proc.h). */
#include "proc.h"
#include "isolate.h"
#include "../common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

int proc_set_nonblock(int fd) {
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) return -1;
    return 0;
}

/* Is the variable `e` ("NAME=...") overridden by one of add? */
static int env_replaced(const char *e, char *const add[]) {
    const char *eq = strchr(e, '=');
    size_t n = eq ? (size_t)(eq - e) : strlen(e);
    for (int i = 0; add && add[i]; i++)
        if (strncmp(add[i], e, n) == 0 && add[i][n] == '=') return 1;
    return 0;
}

int proc_child_setup(pid_t parent, int new_group, int death_sig, int null_stdin) {
    if (new_group) setpgid(0, 0);
    if (death_sig && prctl(PR_SET_PDEATHSIG, death_sig) < 0) return -1;
    if (getppid() != parent) return -1;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    for (int s = 1; s < NSIG; s++) sigaction(s, &sa, NULL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (null_stdin) {
        int devnull = open("/dev/null", O_RDONLY);
        if (devnull >= 0 && devnull != 0) {
            dup2(devnull, 0);
            close(devnull);
        }
    }
    return 0;
}

pid_t proc_spawn(const char *exe, char *const argv[], char *const env_add[], int nice, int idle,
                 const iso_task *iso, int *out_fd) {
    /* Everything the child needs is built before fork: after fork in a
     * threaded process only async-signal-safe calls are allowed. */
    int own_uid = iso && iso->on && iso->uid;
    size_t n_env = 0, n_add = 0;
    while (environ && environ[n_env]) n_env++;
    while (env_add && env_add[n_add]) n_add++;
    char **envp = xcalloc(n_env + n_add + 1, sizeof *envp);
    size_t k = 0;
    for (size_t i = 0; i < n_env; i++) {
        if (env_replaced(environ[i], env_add)) continue;
        /* the agent's own token is no task's business; an isolated task
         * gets the locale, PATH and thread settings only */
        if (strncmp(environ[i], "TRAINYARD_TOKEN=", 16) == 0 || (own_uid && !iso_env_keep(environ[i]))) continue;
        envp[k++] = environ[i];
    }
    for (size_t i = 0; i < n_add; i++) envp[k++] = env_add[i];
    envp[k] = NULL;

    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0) {
        free(envp);
        return -1;
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(p[0]);
        close(p[1]);
        free(envp);
        errno = e;
        return -1;
    }
    if (pid == 0) {
        if (dup2(p[1], 1) < 0 || dup2(p[1], 2) < 0) _exit(126);
        /* its cgroup, mounts, session and uid first: a change of uid
         * clears the parent-death signal that proc_child_setup sets */
        if (iso && iso_task_enter(iso) < 0) _exit(126);
        /* none of the agent's descriptors (its sockets to the server, its
         * tasks' pipes) goes on into the worker */
        if (close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) < 0) _exit(126);
        if (proc_child_setup(parent, !own_uid, SIGTERM, 1) < 0) _exit(126); /* the agent died already */
        if (nice > 0 && setpriority(PRIO_PROCESS, 0, nice) < 0) _exit(126);
        struct sched_param sp = {0};
        if (idle && sched_setscheduler(0, SCHED_IDLE, &sp) < 0) _exit(126);
        /* through the agent's descriptor: the task's uid may not reach
         * the binary's directory */
        if (own_uid && iso->exe_fd >= 0) fexecve(iso->exe_fd, argv, envp);
        else execve(exe, argv, envp);
        static const char msg[] = "trainyard agent: cannot start the worker binary\n";
        ssize_t w = write(2, msg, sizeof msg - 1);
        (void)w;
        _exit(127);
    }
    /* Also in the parent, so a signal sent right after fork finds the group
     * (an isolated child starts a session of its own instead, which fails
     * for a process group leader). */
    if (!own_uid) setpgid(pid, pid);
    close(p[1]);
    free(envp);
    if (proc_set_nonblock(p[0]) < 0) {
        /* still usable, reads would block: rather fail loudly */
        int e = errno;
        close(p[0]);
        kill(-pid, SIGKILL);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        errno = e;
        return -1;
    }
    *out_fd = p[0];
    return pid;
}

int proc_signal_group(pid_t pgid, int sig) {
    if (pgid <= 0) {
        errno = EINVAL;
        return -1;
    }
    if (kill(-pgid, sig) == 0) return 0;
    /* The group may not exist yet if the child has not run setpgid. */
    if (errno == ESRCH) return kill(pgid, sig);
    return -1;
}

int proc_reap(pid_t pid, int *status) {
    int st = 0;
    pid_t r;
    do r = waitpid(pid, &st, WNOHANG);
    while (r < 0 && errno == EINTR);
    if (r < 0) return -1;
    if (r == 0) return 0;
    *status = st;
    return 1;
}

unsigned long long proc_start_ticks(pid_t pid) {
    char path[64], st[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(st, 1, sizeof st - 1, f);
    fclose(f);
    st[n] = '\0';
    const char *p = strrchr(st, ')'); /* the command name may hold spaces */
    if (!p) return 0;
    /* fields after the name start at 3 (state); the start time is field 22 */
    int field = 2;
    for (p++; *p && field < 22; p++)
        if (*p == ' ') field++;
    unsigned long long v = 0;
    if (sscanf(p, "%llu", &v) != 1) return 0;
    return v;
}

int proc_self_exe(char *out, size_t outlen) {
    if (outlen < 2) return -1;
    ssize_t n = readlink("/proc/self/exe", out, outlen - 1);
    if (n <= 0 || (size_t)n >= outlen - 1) return -1;
    out[n] = '\0';
    return 0;
}

static int g_sig_w = -1;
static pid_t g_sig_owner;

static void on_signal(int sig) {
    int e = errno;
    if (getpid() != g_sig_owner) {
        /* a child between fork and exec, which still has this handler and
         * the pipe: a stop meant for the task must end the task, never
         * reach the agent through the pipe as if the agent were stopped */
        signal(sig, SIG_DFL);
        raise(sig);
        errno = e;
        return;
    }
    unsigned char c = (unsigned char)sig;
    ssize_t w = write(g_sig_w, &c, 1);
    (void)w;
    errno = e;
}

int proc_sigpipe_open(void) {
    int p[2];
    if (pipe2(p, O_CLOEXEC | O_NONBLOCK) < 0) return -1;
    g_sig_w = p[1];
    g_sig_owner = getpid();
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGCHLD, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    return p[0];
}

void proc_sigpipe_drain(int fd, int *got_chld, int *got_term) {
    unsigned char b[64];
    ssize_t n;
    while ((n = read(fd, b, sizeof b)) > 0)
        for (ssize_t i = 0; i < n; i++) {
            if (b[i] == SIGCHLD) *got_chld = 1;
            else *got_term = 1;
        }
}

void proc_exit_describe(int status, int *exit_code, int *sig, char *why, size_t whylen) {
    *exit_code = -1;
    *sig = 0;
    if (WIFEXITED(status)) {
        *exit_code = WEXITSTATUS(status);
        snprintf(why, whylen, "exited with code %d", *exit_code);
    } else if (WIFSIGNALED(status)) {
        *sig = WTERMSIG(status);
        snprintf(why, whylen, "killed by signal %d (%s)", *sig, strsignal(*sig));
    } else {
        snprintf(why, whylen, "ended with wait status %d", status);
    }
}
