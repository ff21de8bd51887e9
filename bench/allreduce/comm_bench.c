/* comm_bench.c - float32 sum all-reduce of executor/comm between N local
 * processes (forked here, meeting over loopback like the workers do):
 * per size, warm-up calls, then REPS repetitions of K calls (K sized for
 * about --rep-ms each) between barriers; the median time per call.
 *
 *   comm_bench [--ranks 2] [--transport auto|tcp] [--path plain|buffer]
 *              [--reps 7] [--rep-ms 150] [--pin] [--touch] BYTES...
 *
 * --touch rewrites the buffer before each call (as a training step writes
 * its gradients) and takes the rewriting's own time off; --pin puts rank r
 * on CPU r, as mpirun binds. Prints one JSON object per size (rank 0): impl, transport, path, bytes,
 * us (median per all-reduce), gbps (algorithm bandwidth: bytes / time). */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/util.h"
#include "executor/comm/comm.h"

#define MAX_SIZES 16
#define MAX_REPS 31

typedef struct opts {
    int ranks, reps, rep_ms;
    comm_transport tr;
    int use_buffer;
    int pin;          /* rank r on CPU r % ncpus, as mpirun's --bind-to core */
    int touch;        /* rewrite the buffer before each call, as training writes its
                       * gradients; the rewriting's own time (timed alone) is taken off */
    size_t bytes[MAX_SIZES];
    int nsizes;
} opts;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* What a training step does to its gradient buffer: writes all of it. */
static void rewrite(float *b, size_t n, int salt)
{
    float v = 1e-3f * (float)(salt % 7);
    for (size_t i = 0; i < n; i++)
        b[i] = v;
}

static int bench_rank(comm *c, const opts *o)
{
    size_t maxn = 0;
    for (int i = 0; i < o->nsizes; i++)
        maxn = o->bytes[i] / 4 > maxn ? o->bytes[i] / 4 : maxn;
    float *plain = NULL;
    if (posix_memalign((void **)&plain, 64, maxn * sizeof(float)) != 0)
        return -1;
    float *zc = o->use_buffer ? comm_buffer(c, maxn) : NULL;
    if (o->use_buffer && !zc) {
        fprintf(stderr, "comm_buffer: %s\n", comm_error(c));
        return -1;
    }
    float *b = o->use_buffer ? zc : plain;
    for (size_t i = 0; i < maxn; i++)
        b[i] = 1e-3f * (float)(i % 97);
    for (int s = 0; s < o->nsizes; s++) {
        size_t n = o->bytes[s] / 4;
        /* warm-up, and the count per repetition from its timing (rank 0's, broadcast) */
        for (int i = 0; i < 3; i++)
            if (comm_allreduce_sum(c, b, n))
                goto fail;
        double t0 = mono_s();
        for (int i = 0; i < 5; i++)
            if (comm_allreduce_sum(c, b, n))
                goto fail;
        double per = (mono_s() - t0) / 5;
        int k = (int)(o->rep_ms / 1000.0 / per);
        k = k < 3 ? 3 : k > 100000 ? 100000 : k;
        if (comm_broadcast(c, &k, sizeof k, 0))
            goto fail;
        double t[MAX_REPS];
        for (int r = 0; r < o->reps; r++) {
            double fill = 0;
            if (o->touch) { /* the rewriting alone, to take off below */
                double a = mono_s();
                for (int i = 0; i < k; i++)
                    rewrite(b, n, i);
                fill = mono_s() - a;
            }
            if (comm_barrier(c))
                goto fail;
            double a = mono_s();
            for (int i = 0; i < k; i++) {
                if (o->touch)
                    rewrite(b, n, i);
                if (comm_allreduce_sum(c, b, n))
                    goto fail;
            }
            if (comm_barrier(c))
                goto fail;
            t[r] = (mono_s() - a - fill) / k;
        }
        qsort(t, (size_t)o->reps, sizeof t[0], cmp_double);
        double med = t[o->reps / 2];
        if (comm_rank(c) == 0) {
            printf("{\"impl\":\"trainyard\",\"transport\":\"%s\",\"path\":\"%s%s\",\"ranks\":%d,\"bytes\":%zu,"
                   "\"iters\":%d,\"us\":%.2f,\"us_min\":%.2f,\"gbps\":%.3f}\n",
                   o->tr == COMM_TRANSPORT_TCP ? "tcp" : "auto", o->use_buffer ? "buffer" : "plain",
                   o->touch ? "+rewrite" : "", o->ranks,
                   n * 4, k, med * 1e6, t[0] * 1e6, (double)(n * 4) / med / 1e9);
            fflush(stdout);
        }
    }
    free(plain);
    return 0;
fail:
    fprintf(stderr, "rank %d: %s\n", comm_rank(c), comm_error(c));
    free(plain);
    return -1;
}

int main(int argc, char **argv)
{
    opts o = {.ranks = 2, .reps = 7, .rep_ms = 150, .tr = COMM_TRANSPORT_AUTO};
    for (int i = 1; i < argc; i++) {
        long v;
        if (!strcmp(argv[i], "--ranks") && i + 1 < argc && parse_long(argv[++i], 1, 64, &v) == 0)
            o.ranks = (int)v;
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc && parse_long(argv[++i], 1, MAX_REPS, &v) == 0)
            o.reps = (int)v;
        else if (!strcmp(argv[i], "--rep-ms") && i + 1 < argc && parse_long(argv[++i], 1, 100000, &v) == 0)
            o.rep_ms = (int)v;
        else if (!strcmp(argv[i], "--transport") && i + 1 < argc)
            o.tr = !strcmp(argv[++i], "tcp") ? COMM_TRANSPORT_TCP : COMM_TRANSPORT_AUTO;
        else if (!strcmp(argv[i], "--pin"))
            o.pin = 1;
        else if (!strcmp(argv[i], "--touch"))
            o.touch = 1;
        else if (!strcmp(argv[i], "--path") && i + 1 < argc)
            o.use_buffer = !strcmp(argv[++i], "buffer");
        else if (o.nsizes < MAX_SIZES && parse_long(argv[i], 4, 1L << 34, &v) == 0)
            o.bytes[o.nsizes++] = (size_t)v;
        else {
            fprintf(stderr, "usage: comm_bench [--ranks N] [--transport auto|tcp] [--path plain|buffer] "
                            "[--reps R] [--rep-ms MS] [--pin] [--touch] BYTES...\n");
            return 2;
        }
    }
    if (o.nsizes == 0) {
        fprintf(stderr, "comm_bench: no sizes\n");
        return 2;
    }
    char err[ERR_MAX], hid[COMM_HOST_ID_MAX], session[64];
    if (comm_host_id(hid) < 0) {
        fprintf(stderr, "comm_host_id failed\n");
        return 1;
    }
    snprintf(session, sizeof session, "bench%d", (int)getpid());
    comm_peer *peers = xcalloc((size_t)o.ranks, sizeof *peers);
    int *fds = xcalloc((size_t)o.ranks, sizeof *fds);
    for (int r = 0; r < o.ranks; r++) {
        fds[r] = comm_listen("127.0.0.1", 0, &peers[r].port, err);
        if (fds[r] < 0) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        snprintf(peers[r].addr, sizeof peers[r].addr, "127.0.0.1");
        snprintf(peers[r].host_id, sizeof peers[r].host_id, "%s", hid);
    }
    pid_t *pids = xcalloc((size_t)o.ranks, sizeof *pids);
    for (int r = 0; r < o.ranks; r++) {
        pids[r] = fork();
        if (pids[r] < 0) {
            perror("fork");
            return 1;
        }
        if (pids[r] == 0) {
            for (int k = 0; k < o.ranks; k++)
                if (k != r)
                    close(fds[k]);
            if (o.pin) {
                cpu_set_t set;
                CPU_ZERO(&set);
                CPU_SET(r % (int)sysconf(_SC_NPROCESSORS_ONLN), &set);
                if (sched_setaffinity(0, sizeof set, &set) < 0)
                    perror("sched_setaffinity");
            }
            comm_options co = {.timeout_ms = 60000, .transport = o.tr, .session = session};
            comm *c = NULL;
            if (comm_init(&c, r, o.ranks, peers, fds[r], &co, err) < 0) {
                fprintf(stderr, "rank %d: %s\n", r, err);
                _exit(1);
            }
            int rc = bench_rank(c, &o);
            comm_free(c);
            _exit(rc ? 1 : 0);
        }
    }
    for (int r = 0; r < o.ranks; r++)
        close(fds[r]);
    int bad = 0;
    for (int r = 0; r < o.ranks; r++) {
        int st;
        while (waitpid(pids[r], &st, 0) < 0 && errno == EINTR) {
        }
        bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
    }
    free(pids);
    free(fds);
    free(peers);
    return bad;
}
