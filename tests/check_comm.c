/* check_comm.c - the collective library (executor/comm) with real
 * processes: each case forks its ranks, which meet over loopback TCP and
 * real POSIX shared memory (nothing mocked). One host (COMM_TRANSPORT_AUTO:
 * shared memory only), every pair over TCP (COMM_TRANSPORT_TCP), and two
 * faked hosts (host ids given to the ranks: shared memory within, the TCP
 * ring between). Sums of integer-valued floats are checked exactly, random
 * floats for bit-identical results on every rank; broadcast from each root,
 * all-gather, barrier, the comm_buffer (zero-copy) path, 1000 small
 * all-reduces in a row; a rank killed with SIGKILL mid-all-reduce, a rank
 * that never joins, one that goes silent, mismatched calls, a stranger on
 * the port. After every case no segment is left in /dev/shm. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#include "../common/util.h"
#include "../executor/comm/comm.h"
#include "comm_forge.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
/* ranks end with _exit (no atexit handlers of check's): look for leaks first */
#define LEAK_CHECK() __lsan_do_recoverable_leak_check()
#else
#define LEAK_CHECK() 0
#endif

#define MAXR 8

/* ---------------------------------------------------------------- harness */

typedef struct rank_result {
    volatile int inited;     /* comm_init returned 0 */
    volatile int done;
    int init_rc;
    int rc;                  /* 0: every check passed */
    int64_t fail_ms;         /* mono_ms when the failing call returned */
    uint64_t hash[8];        /* per-rank digests of results that must match across ranks */
    char err[ERR_MAX];  /* comm_error or the first failed check */
} rank_result;

typedef struct setup {
    int size;
    comm_transport transport;
    const char *hosts[MAXR]; /* NULL: the real comm_host_id */
    int timeout_ms;
    int absent;              /* a rank that never starts, or -1 */
    int victim;              /* a rank killed with SIGKILL once all have joined, or -1 */
    int stranger;            /* connect junk to rank 0's port first */
    int forger;              /* first on rank 0's port (and each ring leader's): a well-formed
                              * hello for rank 1 (the right session and table) that cannot
                              * prove the secret */
    int secret;              /* the ranks share a secret (comm_options.secret) */
    int odd_secret;          /* this rank (when > 0) is given another secret */
} setup;

typedef int (*rank_fn)(comm *c, rank_result *res, void *arg);

static char session[64];
static int64_t kill_ms;

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

static uint64_t fnv(const void *p, size_t n) { return forge_fnv(FORGE_FNV_INIT, p, n); }

/* Connects to port and says a hello of `kind` as `rank` with the right
 * session and table, and a MAC made without the secret; the socket stays open. */
static int forge(int port, int kind, int rank, int size, comm_transport tr, const comm_peer *peers)
{
    const char *addrs[MAXR], *hids[MAXR];
    int ports[MAXR];
    for (int r = 0; r < size; r++) {
        addrs[r] = peers[r].addr;
        ports[r] = peers[r].port;
        hids[r] = peers[r].host_id;
    }
    forged_hello h = forge_hello(kind, rank, size, (int)tr, session, addrs, ports, hids);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(write(fd, &h, sizeof h), (ssize_t)sizeof h);
    return fd;
}

/* Segments of this test's session left in /dev/shm. */
static int shm_leftovers(void)
{
    char prefix[96];
    snprintf(prefix, sizeof prefix, "trainyard-%s-", session);
    DIR *d = opendir("/dev/shm");
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) {
            fprintf(stderr, "leftover: /dev/shm/%s\n", e->d_name);
            n++;
        }
    closedir(d);
    return n;
}

/* Runs fn in su->size forked ranks; res[r] holds what each reported. */
static void run(const setup *su, rank_fn fn, void *arg, rank_result *res)
{
    static int counter;
    snprintf(session, sizeof session, "ck%d-%d", (int)getpid(), ++counter);
    int n = su->size;
    int fds[MAXR];
    comm_peer peers[MAXR];
    char real[COMM_HOST_ID_MAX], err[ERR_MAX];
    ck_assert_int_eq(comm_host_id(real), 0);
    memset(peers, 0, sizeof peers);
    for (int r = 0; r < n; r++) {
        int port = 0;
        fds[r] = comm_listen("127.0.0.1", 0, &port, err);
        ck_assert_msg(fds[r] >= 0, "comm_listen: %s", err);
        snprintf(peers[r].addr, sizeof peers[r].addr, "127.0.0.1");
        peers[r].port = port;
        snprintf(peers[r].host_id, sizeof peers[r].host_id, "%s", su->hosts[r] ? su->hosts[r] : real);
    }
    int junk = -1;
    if (su->stranger) { /* a stranger says nonsense on rank 0's port and stays */
        junk = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)peers[0].port)};
        inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
        ck_assert_int_eq(connect(junk, (struct sockaddr *)&a, sizeof a), 0);
        char garbage[200];
        memset(garbage, 'x', sizeof garbage);
        ck_assert_int_eq(write(junk, garbage, sizeof garbage), (ssize_t)sizeof garbage);
    }
    int forged[MAXR * 2], nforged = 0;
    if (su->forger) {
        /* rank 1's hello to rank 0, and (between hosts) a ring hello to every rank */
        forged[nforged++] = forge(peers[0].port, 1, 1, n, su->transport, peers);
        for (int r = 1; r < n; r++)
            forged[nforged++] = forge(peers[r].port, 2, r - 1, n, su->transport, peers);
    }
    memset(res, 0, sizeof *res * (size_t)n);
    pid_t pids[MAXR];
    for (int r = 0; r < n; r++) {
        pids[r] = 0;
        if (r == su->absent) {
            close(fds[r]);
            fds[r] = -1;
            continue;
        }
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
            for (int k = 0; k < n; k++)
                if (k != r && fds[k] >= 0)
                    close(fds[k]);
            unsigned char secret[COMM_SECRET_LEN];
            memset(secret, r == su->odd_secret && r > 0 ? 0x77 : 0x42, sizeof secret);
            comm_options opt = {.timeout_ms = su->timeout_ms, .transport = su->transport, .session = session,
                                .secret = su->secret ? secret : NULL};
            comm *c = NULL;
            res[r].init_rc = comm_init(&c, r, n, peers, fds[r], &opt, res[r].err);
            if (res[r].init_rc == 0) {
                res[r].inited = 1;
                res[r].rc = fn(c, &res[r], arg);
                if (res[r].rc && !res[r].err[0])
                    snprintf(res[r].err, sizeof res[r].err, "%s", comm_error(c));
                comm_free(c);
            } else {
                res[r].fail_ms = mono_ms();
                res[r].rc = -1;
            }
            if (LEAK_CHECK() && res[r].rc == 0) {
                res[r].rc = -1;
                snprintf(res[r].err, sizeof res[r].err, "leaks (see stderr)");
            }
            res[r].done = 1;
            _exit(0);
        }
        pids[r] = pid;
    }
    for (int r = 0; r < n; r++)
        if (fds[r] >= 0)
            close(fds[r]);
    if (su->victim >= 0) {
        int64_t until = mono_ms() + 20000;
        for (int all = 0; !all && mono_ms() < until;) {
            all = 1;
            for (int r = 0; r < n; r++)
                all &= res[r].inited;
            sleep_ms(5);
        }
        sleep_ms(300); /* well into the loop of all-reduces */
        kill_ms = mono_ms();
        kill(pids[su->victim], SIGKILL);
        /* not reaped yet: a zombie must count as dead */
    }
    int64_t deadline = mono_ms() + 50000;
    for (int r = 0; r < n; r++) {
        if (!pids[r] || r == su->victim)
            continue;
        int st;
        while (waitpid(pids[r], &st, WNOHANG) == 0) {
            if (mono_ms() > deadline) {
                for (int k = 0; k < n; k++)
                    if (pids[k])
                        kill(pids[k], SIGKILL);
                ck_abort_msg("rank %d did not finish", r);
            }
            sleep_ms(5);
        }
        ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank %d crashed (status %d)", r, st);
    }
    if (su->victim >= 0)
        waitpid(pids[su->victim], NULL, 0);
    if (junk >= 0)
        close(junk);
    for (int i = 0; i < nforged; i++)
        close(forged[i]);
    ck_assert_int_eq(shm_leftovers(), 0);
}

static void assert_all_ok(const setup *su, const rank_result *res)
{
    for (int r = 0; r < su->size; r++)
        ck_assert_msg(res[r].init_rc == 0 && res[r].rc == 0, "rank %d of %d: %s", r, su->size, res[r].err);
}

#define CHECK(res, cond, ...)                                                   \
    do {                                                                        \
        if (!(cond)) {                                                          \
            snprintf((res)->err, sizeof (res)->err, __VA_ARGS__);               \
            return -1;                                                          \
        }                                                                       \
    } while (0)

/* ---------------------------------------------------------------- scenarios */

static const size_t sizes[] = {0, 1, 2, 3, 5, 16, 17, 63, 1000, 4097, 65536 + 3, 786433};
#define NSIZES (sizeof sizes / sizeof sizes[0])

static float val(int r, size_t i, int salt) { return (float)((r + 1) * (int)((i + (size_t)salt) % 1000) + r); }

static float want(int size, size_t i, int salt)
{
    float s = 0;
    for (int r = 0; r < size; r++)
        s += val(r, i, salt);
    return s;
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void fill_random(float *b, size_t n, int rank)
{
    uint64_t s = 0x9e3779b97f4a7c15ULL * (uint64_t)(rank + 1);
    for (size_t i = 0; i < n; i++)
        b[i] = (float)((double)(rng_next(&s) >> 11) / 9007199254740992.0 * 2.0 - 1.0) * 1000.0f;
}

/* Exact sums at every size, plain and comm_buffer paths; random floats:
 * bit-identical on every rank and between the two paths. */
static int sc_allreduce(comm *c, rank_result *res, void *arg)
{
    (void)arg;
    int r = comm_rank(c), n = comm_size(c);
    size_t max = sizes[NSIZES - 1];
    float *plain = xcalloc(max, sizeof(float));
    float *zc = comm_buffer(c, max);
    CHECK(res, zc != NULL, "comm_buffer: %s", comm_error(c));
    CHECK(res, ((uintptr_t)zc & 63) == 0, "comm_buffer not 64-byte aligned");
    for (size_t i = 0; i < max; i++)
        CHECK(res, zc[i] == 0.0f, "comm_buffer not zeroed");
    for (size_t k = 0; k < NSIZES; k++) {
        size_t len = sizes[k];
        for (int path = 0; path < 2; path++) {
            float *b = path ? zc : plain;
            for (size_t i = 0; i < len; i++)
                b[i] = val(r, i, (int)k);
            if (len < max)
                b[len] = 12345.0f; /* past the end: must stay */
            if (comm_allreduce_sum(c, b, len))
                return -1;
            for (size_t i = 0; i < len; i++)
                CHECK(res, b[i] == want(n, i, (int)k), "%s n=%zu: [%zu] = %g, want %g", path ? "comm_buffer" : "plain",
                      len, i, (double)b[i], (double)want(n, i, (int)k));
            if (len < max)
                CHECK(res, b[len] == 12345.0f, "n=%zu: wrote past the end", len);
        }
    }
    /* random floats, both paths */
    fill_random(plain, max, r);
    fill_random(zc, max, r);
    if (comm_allreduce_sum(c, plain, max) || comm_allreduce_sum(c, zc, max))
        return -1;
    CHECK(res, memcmp(plain, zc, max * sizeof(float)) == 0, "plain and comm_buffer sums differ");
    res->hash[0] = fnv(plain, max * sizeof(float));
    /* and against a double-precision reference */
    float *other = xcalloc(max, sizeof(float));
    double *ref = xcalloc(max, sizeof(double));
    for (int k = 0; k < n; k++) {
        fill_random(other, max, k);
        for (size_t i = 0; i < max; i++)
            ref[i] += other[i];
    }
    for (size_t i = 0; i < max; i++)
        CHECK(res, fabs(plain[i] - ref[i]) <= 1e-3 * (1 + fabs(ref[i])), "[%zu] = %g, want about %g", i,
              (double)plain[i], ref[i]);
    free(ref);
    free(other);
    /* an odd size of random floats through a prefix of the comm_buffer */
    fill_random(zc, 12345, r + 7);
    if (comm_allreduce_sum(c, zc, 12345))
        return -1;
    res->hash[1] = fnv(zc, 12345 * sizeof(float));
    free(plain);
    return 0;
}

/* Broadcast from every root at several sizes, all-gather, barrier. */
static int sc_bcast_gather(comm *c, rank_result *res, void *arg)
{
    (void)arg;
    int r = comm_rank(c), n = comm_size(c);
    static const size_t bsizes[] = {1, 3, 4096, 300001, (1 << 20) + 5};
    size_t max = bsizes[4];
    unsigned char *b = xmalloc(max);
    for (int root = 0; root < n; root++)
        for (size_t k = 0; k < 5; k++) {
            size_t len = bsizes[k];
            for (size_t i = 0; i < len; i++)
                b[i] = r == root ? (unsigned char)(i * 7 + (size_t)root + k) : 0xEE;
            if (comm_broadcast(c, b, len, root))
                return -1;
            for (size_t i = 0; i < len; i++)
                CHECK(res, b[i] == (unsigned char)(i * 7 + (size_t)root + k), "broadcast root %d len %zu: [%zu] wrong",
                      root, len, i);
        }
    /* broadcast of a comm_buffer (zero-copy read of the root's) */
    float *zb = comm_buffer(c, 100003);
    CHECK(res, zb != NULL, "comm_buffer: %s", comm_error(c));
    for (int root = 0; root < n; root++) {
        for (size_t i = 0; i < 100003; i++)
            zb[i] = r == root ? (float)(i + (size_t)root) : -1.0f;
        if (comm_broadcast(c, zb, 100003 * sizeof(float), root))
            return -1;
        for (size_t i = 0; i < 100003; i++)
            CHECK(res, zb[i] == (float)(i + (size_t)root), "comm_buffer broadcast root %d: [%zu] wrong", root, i);
    }
    static const size_t gsizes[] = {1, 7, 100000};
    for (size_t k = 0; k < 3; k++) {
        size_t len = gsizes[k];
        unsigned char *send = xmalloc(len), *recv = xmalloc(len * (size_t)n);
        for (size_t i = 0; i < len; i++)
            send[i] = (unsigned char)(r * 31 + (int)i);
        memset(recv, 0xEE, len * (size_t)n);
        if (comm_allgather(c, send, recv, len))
            return -1;
        for (int q = 0; q < n; q++)
            for (size_t i = 0; i < len; i++)
                CHECK(res, recv[(size_t)q * len + i] == (unsigned char)(q * 31 + (int)i),
                      "allgather len %zu: rank %d's byte %zu wrong", len, q, i);
        free(send);
        free(recv);
    }
    for (int i = 0; i < 20; i++)
        if (comm_barrier(c))
            return -1;
    free(b);
    return 0;
}

/* 1000 small all-reduces in a row, each with new values; a barrier now and
 * then; the last ones through a comm_buffer. */
static int sc_repeat(comm *c, rank_result *res, void *arg)
{
    (void)arg;
    int r = comm_rank(c), n = comm_size(c);
    float *zb = comm_buffer(c, 7);
    CHECK(res, zb != NULL, "comm_buffer: %s", comm_error(c));
    for (int it = 0; it < 1000; it++) {
        float plain[7];
        float *b = it % 2 ? zb : plain;
        for (int i = 0; i < 7; i++)
            b[i] = val(r, (size_t)i, it);
        if (comm_allreduce_sum(c, b, 7))
            return -1;
        for (int i = 0; i < 7; i++)
            CHECK(res, b[i] == want(n, (size_t)i, it), "iteration %d: [%d] = %g, want %g", it, i, (double)b[i],
                  (double)want(n, (size_t)i, it));
        if (it % 100 == 0 && comm_barrier(c))
            return -1;
    }
    return 0;
}

/* Loops all-reduces until one fails (a peer is killed, or goes silent). */
static int sc_until_fail(comm *c, rank_result *res, void *arg)
{
    int silent = arg ? *(int *)arg : -1;
    float *b = comm_buffer(c, 1 << 20);
    CHECK(res, b != NULL, "comm_buffer: %s", comm_error(c));
    if (comm_rank(c) == silent) {
        sleep_ms(4000); /* joins, then says nothing */
        return 0;
    }
    float *p = xcalloc(1 << 20, sizeof(float));
    for (int it = 0;; it++) {
        int rc = comm_allreduce_sum(c, it % 2 ? b : p, 1 << 20);
        if (rc) {
            res->fail_ms = mono_ms();
            free(p);
            snprintf(res->err, sizeof res->err, "%s", comm_error(c));
            int64_t t = mono_ms();
            if (comm_barrier(c) != -1 || mono_ms() - t > 100) /* later calls fail at once */
                snprintf(res->err, sizeof res->err, "a call after the error did not fail at once");
            return -1;
        }
    }
}

/* Rank 0 all-reduces 10 floats, the others 20. */
static int sc_mismatch(comm *c, rank_result *res, void *arg)
{
    (void)arg;
    float b[20] = {0};
    if (comm_allreduce_sum(c, b, comm_rank(c) == 0 ? 10 : 20) == 0)
        CHECK(res, 0, "a mismatched all-reduce succeeded");
    res->fail_ms = mono_ms();
    return -1;
}

/* ---------------------------------------------------------------- configurations */

typedef struct config {
    const char *name;
    int size;
    comm_transport tr;
    const char *hosts[MAXR];
} config;

static const config configs[] = {
    {"shm 2", 2, COMM_TRANSPORT_AUTO, {0}},
    {"shm 3", 3, COMM_TRANSPORT_AUTO, {0}},
    {"shm 4", 4, COMM_TRANSPORT_AUTO, {0}},
    {"tcp 2", 2, COMM_TRANSPORT_TCP, {0}},
    {"tcp 3", 3, COMM_TRANSPORT_TCP, {0}},
    {"tcp 4", 4, COMM_TRANSPORT_TCP, {0}},
    {"hier AABB", 4, COMM_TRANSPORT_AUTO, {"hostA", "hostA", "hostB", "hostB"}},
    {"hier ABA", 3, COMM_TRANSPORT_AUTO, {"hostA", "hostB", "hostA"}},
    {"hier ABBC", 4, COMM_TRANSPORT_AUTO, {"hostA", "hostB", "hostB", "hostC"}},
};
#define NCONFIGS ((int)(sizeof configs / sizeof configs[0]))

static setup setup_of(const config *cf)
{
    setup su = {.size = cf->size, .transport = cf->tr, .timeout_ms = 20000, .absent = -1, .victim = -1};
    for (int r = 0; r < cf->size; r++)
        su.hosts[r] = cf->hosts[r];
    return su;
}

static void check_same_hash(const setup *su, const rank_result *res, int k, const char *name)
{
    for (int r = 1; r < su->size; r++)
        ck_assert_msg(res[r].hash[k] == res[0].hash[k], "%s: rank %d's result differs from rank 0's (digest %d)", name, r,
                      k);
}

START_TEST(test_allreduce)
{
    const config *cf = &configs[_i];
    setup su = setup_of(cf);
    rank_result *res = mmap(NULL, sizeof(rank_result) * MAXR, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(res, MAP_FAILED);
    run(&su, sc_allreduce, NULL, res);
    assert_all_ok(&su, res);
    check_same_hash(&su, res, 0, cf->name);
    check_same_hash(&su, res, 1, cf->name);
    munmap(res, sizeof(rank_result) * MAXR);
}
END_TEST

START_TEST(test_bcast_gather)
{
    setup su = setup_of(&configs[_i]);
    rank_result *res = mmap(NULL, sizeof(rank_result) * MAXR, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    run(&su, sc_bcast_gather, NULL, res);
    assert_all_ok(&su, res);
    munmap(res, sizeof(rank_result) * MAXR);
}
END_TEST

START_TEST(test_repeat)
{
    setup su = setup_of(&configs[_i]);
    rank_result *res = mmap(NULL, sizeof(rank_result) * MAXR, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    run(&su, sc_repeat, NULL, res);
    assert_all_ok(&su, res);
    munmap(res, sizeof(rank_result) * MAXR);
}
END_TEST

/* A rank killed with SIGKILL mid-all-reduce: every other rank fails within
 * 3 s, naming it. */
static void kill_case(const config *cf, int victim)
{
    setup su = setup_of(cf);
    su.victim = victim;
    rank_result *res = mmap(NULL, sizeof(rank_result) * MAXR, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    run(&su, sc_until_fail, NULL, res);
    char name[32];
    snprintf(name, sizeof name, "rank %d", victim);
    for (int r = 0; r < su.size; r++) {
        if (r == victim)
            continue;
        ck_assert_msg(res[r].inited && res[r].rc != 0, "%s: rank %d did not fail", cf->name, r);
        ck_assert_msg(strstr(res[r].err, name) != NULL, "%s: rank %d's error does not name %s: %s", cf->name, r, name,
                      res[r].err);
        int64_t took = res[r].fail_ms - kill_ms;
        ck_assert_msg(took >= 0 && took < 3000, "%s: rank %d failed %lld ms after the kill", cf->name, r,
                      (long long)took);
    }
    munmap(res, sizeof(rank_result) * MAXR);
}

START_TEST(test_kill_shm) { kill_case(&configs[2], 1); }
END_TEST
START_TEST(test_kill_tcp) { kill_case(&configs[5], 2); }
END_TEST
START_TEST(test_kill_hier) { kill_case(&configs[6], 3); }
END_TEST

/* A rank that never joins: comm_init fails on the others after the timeout. */
START_TEST(test_absent)
{
    setup su = setup_of(&configs[_i == 0 ? 2 : 6]);
    su.absent = _i == 0 ? 3 : 2;
    su.timeout_ms = 1000;
    rank_result *res = mmap(NULL, sizeof(rank_result) * MAXR, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    int64_t t0 = mono_ms();
    run(&su, sc_repeat, NULL, res);
    for (int r = 0; r < su.size; r++) {
        if (r == su.absent)
            continue;
        ck_assert_msg(res[r].init_rc != 0 && !res[r].inited, "rank %d joined without rank %d", r, su.absent);
        int64_t took = res[r].fail_ms - t0;
        ck_assert_msg(took >= 900 && took < 4000, "rank %d failed after %lld ms (timeout 1000)", r, (long long)took);
    }
    char name[32];
    snprintf(name, sizeof name, "rank %d", su.absent);
    ck_assert_msg(strstr(res[0].err, name) != NULL, "rank 0's error does not name %s: %s", name, res[0].err);
    munmap(res, sizeof(rank_result) * MAXR);
}
END_TEST

/* A rank that joins and then goes silent: the others fail after timeout_ms. */
START_TEST(test_silent)
{
    setup su = setup_of(&configs[_i == 0 ? 1 : 4]);
    su.timeout_ms = 1000;
    int silent = 1;
    rank_result *res = mmap(NULL, sizeof(rank_result) * MAXR, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    run(&su, sc_until_fail, &silent, res);
    for (int r = 0; r < su.size; r++) {
        if (r == silent)
            continue;
        ck_assert_msg(res[r].rc != 0, "rank %d did not fail", r);
        ck_assert_msg(strstr(res[r].err, "rank ") != NULL, "rank %d: %s", r, res[r].err);
    }
    munmap(res, sizeof(rank_result) * MAXR);
}
END_TEST

START_TEST(test_mismatch)
{
    setup su = setup_of(&configs[_i == 0 ? 0 : 3]);
    su.timeout_ms = 3000;
    rank_result *res = mmap(NULL, sizeof(rank_result) * MAXR, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    run(&su, sc_mismatch, NULL, res);
    for (int r = 0; r < su.size; r++) {
        ck_assert_msg(res[r].inited && res[r].rc != 0, "rank %d: %s", r, res[r].err);
        ck_assert_msg(strstr(res[r].err, "succeeded") == NULL, "rank %d: %s", r, res[r].err);
    }
    /* shared memory names the mismatch; over TCP at least one side sees the frame sizes differ */
    ck_assert_msg(strstr(res[0].err, "called") || strstr(res[1].err, "called") || strstr(res[0].err, "expected") ||
                      strstr(res[1].err, "expected"),
                  "%s / %s", res[0].err, res[1].err);
    munmap(res, sizeof(rank_result) * MAXR);
}
END_TEST

/* A stranger on rank 0's port (junk, never a hello) does not stop init. */
START_TEST(test_stranger)
{
    setup su = setup_of(&configs[_i == 0 ? 1 : 4]);
    su.stranger = 1;
    rank_result *res = mmap(NULL, sizeof(rank_result) * MAXR, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    run(&su, sc_repeat, NULL, res);
    assert_all_ok(&su, res);
    munmap(res, sizeof(rank_result) * MAXR);
}
END_TEST

/* A forger who knows the job's session, its peer table and the wire format
 * connects first and says rank 1's hello (and ring hellos): without the
 * secret it is dropped, and the ranks join and sum as without it. */
START_TEST(test_forged_hello)
{
    static const int cfg[] = {1, 4, 6};
    setup su = setup_of(&configs[cfg[_i]]);
    su.forger = 1;
    su.secret = 1;
    su.timeout_ms = 10000;
    rank_result *res = mmap(NULL, sizeof(rank_result) * MAXR, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    run(&su, sc_repeat, NULL, res);
    assert_all_ok(&su, res);
    munmap(res, sizeof(rank_result) * MAXR);
}
END_TEST

/* A rank given another secret joins nobody, and nobody joins it: every rank
 * fails within the timeout, naming what is missing. */
START_TEST(test_wrong_secret)
{
    setup su = setup_of(&configs[_i == 0 ? 3 : 7]);
    su.secret = 1;
    su.odd_secret = 1;
    su.timeout_ms = 1500;
    rank_result *res = mmap(NULL, sizeof(rank_result) * MAXR, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    run(&su, sc_repeat, NULL, res);
    for (int r = 0; r < su.size; r++)
        ck_assert_msg(res[r].init_rc != 0 && !res[r].inited, "rank %d joined with a rank of another secret", r);
    ck_assert_msg(strstr(res[0].err, "rank 1") != NULL, "rank 0: %s", res[0].err);
    ck_assert_msg(strstr(res[1].err, "secret") || strstr(res[1].err, "rank 0"), "rank 1: %s", res[1].err);
    munmap(res, sizeof(rank_result) * MAXR);
}
END_TEST

/* The proofs' HMAC-SHA256 (common/util.c) against RFC 4231's cases 2 and 6
 * (a key longer than the block), the message given in parts. */
START_TEST(test_hmac_rfc4231)
{
    static const struct {
        const char *key, *msg, *want;
        size_t klen;
    } v[] = {
        {"Jefe", "what do ya want for nothing?", "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843", 4},
        {NULL, "Test Using Larger Than Block-Size Key - Hash Key First",
         "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54", 131},
    };
    for (int i = 0; i < 2; i++) {
        unsigned char key[131], mac[32];
        if (v[i].key) memcpy(key, v[i].key, v[i].klen);
        else memset(key, 0xaa, v[i].klen);
        size_t half = strlen(v[i].msg) / 2;
        const void *part[2] = {v[i].msg, v[i].msg + half};
        size_t len[2] = {half, strlen(v[i].msg) - half};
        ck_assert_int_eq(hmac_sha256(key, v[i].klen, 2, part, len, mac), 0);
        char hex[65];
        for (int k = 0; k < 32; k++)
            snprintf(hex + 2 * k, 3, "%02x", mac[k]);
        ck_assert_str_eq(hex, v[i].want);
    }
}
END_TEST

/* One rank: every call works without a peer. */
START_TEST(test_single)
{
    char err[ERR_MAX], hid[COMM_HOST_ID_MAX];
    int port = 0;
    int fd = comm_listen("127.0.0.1", 0, &port, err);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_gt(port, 0);
    comm_peer p;
    memset(&p, 0, sizeof p);
    snprintf(p.addr, sizeof p.addr, "127.0.0.1");
    p.port = port;
    ck_assert_int_eq(comm_host_id(hid), 0);
    snprintf(p.host_id, sizeof p.host_id, "%s", hid);
    comm *c = NULL;
    ck_assert_int_eq(comm_init(&c, 0, 1, &p, fd, NULL, err), 0);
    ck_assert_int_eq(comm_rank(c), 0);
    ck_assert_int_eq(comm_size(c), 1);
    float b[3] = {1, 2, 3};
    ck_assert_int_eq(comm_allreduce_sum(c, b, 3), 0);
    ck_assert(b[0] == 1 && b[1] == 2 && b[2] == 3);
    ck_assert_int_eq(comm_broadcast(c, b, sizeof b, 0), 0);
    float g[3];
    ck_assert_int_eq(comm_allgather(c, b, g, sizeof b), 0);
    ck_assert(memcmp(g, b, sizeof b) == 0);
    ck_assert_int_eq(comm_barrier(c), 0);
    float *z = comm_buffer(c, 1000);
    ck_assert_ptr_nonnull(z);
    ck_assert(((uintptr_t)z & 63) == 0 && z[999] == 0.0f);
    ck_assert_int_eq(comm_allreduce_sum(c, z, 1000), 0);
    ck_assert_int_eq(comm_broadcast(c, b, sizeof b, 1), -1); /* root out of range */
    ck_assert_ptr_nonnull(strstr(comm_error(c), "root"));
    ck_assert_int_eq(comm_barrier(c), -1); /* unusable after an error */
    comm_free(c);
    comm_free(NULL);
}
END_TEST

START_TEST(test_args)
{
    char err[ERR_MAX], a[COMM_HOST_ID_MAX], b[COMM_HOST_ID_MAX];
    ck_assert_int_eq(comm_host_id(a), 0);
    ck_assert_int_eq(comm_host_id(b), 0);
    ck_assert_str_eq(a, b);
    ck_assert_ptr_nonnull(strstr(a, "-net"));
    int port = 0;
    ck_assert_int_eq(comm_listen("127.0.0.1", 70000, &port, err), -1);
    ck_assert_ptr_nonnull(strstr(err, "range"));
    ck_assert_int_eq(comm_listen("no.such.host.invalid", 0, &port, err), -1);
    int fd = comm_listen(NULL, 0, &port, err); /* all addresses */
    ck_assert_int_ge(fd, 0);
    comm_peer p[2];
    memset(p, 0, sizeof p);
    comm *c = (comm *)1;
    ck_assert_int_eq(comm_init(&c, 2, 2, p, fd, NULL, err), -1); /* rank out of range; fd taken */
    ck_assert_ptr_null(c);
    ck_assert_ptr_nonnull(strstr(err, "range"));
    fd = comm_listen("127.0.0.1", 0, &port, err);
    memset(p[1].addr, 'x', sizeof p[1].addr); /* not terminated */
    ck_assert_int_eq(comm_init(&c, 0, 2, p, fd, NULL, err), -1);
    ck_assert_ptr_nonnull(strstr(err, "terminated"));
}
END_TEST

Suite *comm_suite(void)
{
    Suite *s = suite_create("comm");
    TCase *t = tcase_create("basics");
    tcase_add_test(t, test_args);
    tcase_add_test(t, test_single);
    tcase_add_test(t, test_hmac_rfc4231);
    suite_add_tcase(s, t);
    t = tcase_create("collectives");
    tcase_set_timeout(t, 120);
    tcase_add_loop_test(t, test_allreduce, 0, NCONFIGS);
    tcase_add_loop_test(t, test_bcast_gather, 0, NCONFIGS);
    tcase_add_loop_test(t, test_repeat, 0, NCONFIGS);
    suite_add_tcase(s, t);
    t = tcase_create("failures");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, test_kill_shm);
    tcase_add_test(t, test_kill_tcp);
    tcase_add_test(t, test_kill_hier);
    tcase_add_loop_test(t, test_absent, 0, 2);
    tcase_add_loop_test(t, test_silent, 0, 2);
    tcase_add_loop_test(t, test_mismatch, 0, 2);
    tcase_add_loop_test(t, test_stranger, 0, 2);
    tcase_add_loop_test(t, test_forged_hello, 0, 3);
    tcase_add_loop_test(t, test_wrong_secret, 0, 2);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(comm_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
