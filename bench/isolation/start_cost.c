/* start_cost.c - what isolating a task costs at its start and end
 * (executor/isolate.c): ROUNDS times, a task is prepared (uid, job
 * directory, cgroup with limits), a child enters it (cgroup, mount
 * namespace with a private /tmp, /var/tmp, /dev/shm and /proc, session,
 * uid) and execs /bin/true, and the task is finished (cgroup killed and
 * removed, job directory removed, uid freed); beside it, the same fork and
 * exec of /bin/true with no isolation. Medians and p99 in microseconds;
 * the last line is one JSON object. Needs root. bench/isolation/run.sh. */
#include "executor/isolate.h"
#include "common/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void stats(double *v, int n, double *med, double *p99) {
    qsort(v, (size_t)n, sizeof *v, cmp);
    *med = v[n / 2];
    *p99 = v[(int)((n - 1) * 0.99)];
}

static int run_true(const iso_task *t) {
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        if (t && iso_task_enter(t) < 0) _exit(126);
        char *argv[] = {"/bin/true", NULL}, *envp[] = {NULL};
        execve("/bin/true", argv, envp);
        _exit(127);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 200;
    if (rounds < 10) rounds = 10;
    if (geteuid() != 0) {
        fprintf(stderr, "start_cost: needs root\n");
        return 2;
    }
    iso_options o;
    iso_options_default(&o);
    o.cpu_slots = 2;
    isolator iso;
    char err[512] = "";
    if (iso_init(&iso, &o, "/bin/true", err, sizeof err) < 0) {
        fprintf(stderr, "start_cost: %s\n", err);
        return 1;
    }
    char *desc = iso_describe(&iso);
    printf("isolation: %s\n", desc);
    free(desc);
    double *plain = xcalloc((size_t)rounds, sizeof *plain), *prep = xcalloc((size_t)rounds, sizeof *prep),
           *run = xcalloc((size_t)rounds, sizeof *run), *fin = xcalloc((size_t)rounds, sizeof *fin),
           *total = xcalloc((size_t)rounds, sizeof *total);
    for (int i = 0; i < rounds; i++) {
        double t0 = now_us();
        if (run_true(NULL) < 0) return 1;
        plain[i] = now_us() - t0;
        iso_task t;
        t0 = now_us();
        if (iso_task_prepare(&iso, i + 1, i + 1, 256, 1, "", &t, err, sizeof err) < 0) {
            fprintf(stderr, "start_cost: %s\n", err);
            return 1;
        }
        double t1 = now_us();
        if (run_true(&t) < 0) {
            fprintf(stderr, "start_cost: the isolated /bin/true failed\n");
            return 1;
        }
        double t2 = now_us();
        int oom = 0;
        iso_task_finish(&iso, &t, &oom);
        double t3 = now_us();
        prep[i] = t1 - t0;
        run[i] = t2 - t1;
        fin[i] = t3 - t2;
        total[i] = t3 - t0;
    }
    iso_release(&iso);
    double m[5], p[5];
    stats(plain, rounds, &m[0], &p[0]);
    stats(prep, rounds, &m[1], &p[1]);
    stats(run, rounds, &m[2], &p[2]);
    stats(fin, rounds, &m[3], &p[3]);
    stats(total, rounds, &m[4], &p[4]);
    printf("%-34s %10s %10s\n", "microseconds per task", "median", "p99");
    printf("%-34s %10.0f %10.0f\n", "fork + exec /bin/true, plain", m[0], p[0]);
    printf("%-34s %10.0f %10.0f\n", "prepare (uid, directory, cgroup)", m[1], p[1]);
    printf("%-34s %10.0f %10.0f\n", "fork + enter + exec /bin/true", m[2], p[2]);
    printf("%-34s %10.0f %10.0f\n", "finish (kill, rmdir, rm, uid)", m[3], p[3]);
    printf("%-34s %10.0f %10.0f\n", "isolated in all", m[4], p[4]);
    printf("{\"rounds\":%d,\"plain_us\":%.0f,\"prepare_us\":%.0f,\"run_us\":%.0f,\"finish_us\":%.0f,"
           "\"isolated_us\":%.0f,\"isolated_p99_us\":%.0f,\"overhead_us\":%.0f}\n",
           rounds, m[0], m[1], m[2], m[3], m[4], p[4], m[4] - m[0]);
    return 0;
}
