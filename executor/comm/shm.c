/* shm.c - the host's shared memory: one segment per communicator and host
 * (a header, a step counter per local rank, staging and result chunks) and
 * one per comm_buffer (every local rank's buffer, side by side).
 *
 * Synchronisation is one monotonic 64-bit step counter per local rank: a
 * rank posts "I have passed step s" and waits until one peer, or all, have
 * passed a step. Every host collective starts with an entry step whose
 * descriptor (operation, size, root, comm_buffer) each rank checks against
 * its peers', so mismatched calls fail with a message instead of mixing
 * data. Waiting spins briefly, then sleeps on a futex in the header (a
 * poster wakes only when a sleeper announced itself), and every ~100 ms
 * checks the local peers' pids and the timeout. See docs/comm.md. */
#include <errno.h>
#include <sched.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "../../common/util.h"
#include "comm_int.h"

#define LIVE_CHECK_MS 100      /* how often a waiter checks its peers' pids */
#define SLEEP_MS 50            /* futex sleeps: the longest a waiter sleeps unchecked */
#define SPIN_ALONE_US 200      /* spinning before sleeping, when every local rank has a core */
#define SPIN_CROWDED_US 2       /* ... when ranks outnumber cores */
#define CHUNK_MAX (512 << 10)   /* bytes per staging chunk: measured best of 64K..2M (docs/comm.md) */
#define CHUNK_MIN (64 << 10)
#define STAGE_BUDGET (8 << 20)  /* staging bytes per host before chunks shrink */

enum { OP_SETUP = 1, OP_ALLREDUCE, OP_BCAST, OP_BARRIER, OP_SEGBUF };

static const char *op_name(uint32_t op)
{
    switch (op) {
    case OP_SETUP: return "init";
    case OP_ALLREDUCE: return "allreduce";
    case OP_BCAST: return "broadcast";
    case OP_BARRIER: return "barrier";
    case OP_SEGBUF: return "comm_buffer";
    }
    return "?";
}

typedef struct shm_desc {
    uint32_t op;
    int32_t root;
    uint64_t n;        /* floats or bytes */
    int32_t zc;        /* comm_buffer index, -1: none */
    int32_t pad;
} shm_desc;

typedef struct shm_slot {
    _Alignas(128) _Atomic uint64_t step;
    _Atomic int32_t cpu;  /* where the rank ran at its last post */
    int32_t pad;
    int64_t pid;
    shm_desc desc[2];  /* by parity of the operation count (a rank is at most one ahead) */
} shm_slot;

struct comm_shm {
    uint32_t magic;
    uint32_t nlocal;
    uint64_t nonce;
    uint64_t chunk;
    uint64_t stage_off, result_off, total;
    _Atomic uint32_t ready;
    _Alignas(128) _Atomic uint32_t fx;     /* futex word, bumped by posters when sleepers exist */
    _Atomic uint32_t nsleep;               /* ranks sleeping (or about to) on fx */
    _Alignas(128) _Atomic uint64_t beat;   /* the leader's ring progress */
    _Alignas(128) _Atomic uint32_t abort_lock;
    _Atomic uint32_t abort;
    char abort_msg[ERR_MAX];
    _Alignas(128) shm_slot slot[];
};

/* ---------------------------------------------------------------- futex */

static void futex_wait(_Atomic uint32_t *w, uint32_t val, int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    (void)syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT, val, &ts, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *w)
{
    (void)syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* A pause now and then, not every iteration: a VM's pause-loop exiting
 * takes back-to-back PAUSEs for a spinning vCPU and deschedules it
 * (measured here: all-reduces several times slower with a PAUSE per
 * iteration). */
static inline void cpu_relax(unsigned i)
{
#if defined(__x86_64__) || defined(__i386__)
    if ((i & 63) == 63)
        __builtin_ia32_pause();
#endif
    __asm__ volatile("" ::: "memory");
}

static int64_t mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

/* ---------------------------------------------------------------- steps */

static inline char *shm_base(const comm *c) { return (char *)c->shm; }

static inline char *stage(const comm *c, int j, int k)
{
    return shm_base(c) + c->shm->stage_off + ((size_t)j * 2 + (size_t)(k & 1)) * c->shm->chunk;
}

static inline char *result(const comm *c, int k)
{
    return shm_base(c) + c->shm->result_off + (size_t)(k & 1) * c->shm->chunk;
}

static void post(comm *c, uint64_t s)
{
    comm_shm *h = c->shm;
    c->step = s;
    atomic_store_explicit(&h->slot[c->lrank].cpu, sched_getcpu(), memory_order_relaxed);
    atomic_store(&h->slot[c->lrank].step, s);
    if (atomic_load(&h->nsleep) > 0) {
        atomic_fetch_add(&h->fx, 1);
        futex_wake_all(&h->fx);
    }
}

/* The first local rank (who < 0: of all) below target, or -1 when none. */
static inline int behind(const comm *c, int who, uint64_t target)
{
    const comm_shm *h = c->shm;
    if (who >= 0)
        return atomic_load_explicit(&h->slot[who].step, memory_order_acquire) >= target ? -1 : who;
    for (int j = 0; j < c->nlocal; j++)
        if (atomic_load_explicit(&h->slot[j].step, memory_order_acquire) < target)
            return j;
    return -1;
}

static int fail_from_abort(comm *c)
{
    char msg[ERR_MAX];
    memcpy(msg, c->shm->abort_msg, sizeof msg);
    msg[sizeof msg - 1] = '\0';
    return comm_fail(c, "%s", msg);
}

/* Checks the pids of the local peers the wait is for (who, or all when
 * who < 0) that have not passed target: one that finished and exited is
 * not a failure. 0, or -1 (comm_fail'ed) when one died. */
static int check_live(comm *c, int who, uint64_t target)
{
    for (int j = 0; j < c->nlocal; j++) {
        int r = c->local[j];
        if (r == c->rank || (who >= 0 && j != who) ||
            atomic_load(&c->shm->slot[j].step) >= target)
            continue;
        if (comm_peer_dead(c, r))
            return comm_fail(c, "rank %d (pid %lld) died", r, (long long)c->info[r].pid);
    }
    return 0;
}

/* Waits until local rank who (who < 0: every local rank) has passed step
 * target. A peer that dies, an abort, or no progress (no peer step moving,
 * no ring beat) for timeout_ms fails c. what names the wait in errors. */
static int shm_wait(comm *c, int who, uint64_t target, const char *what)
{
    comm_shm *h = c->shm;
    if (behind(c, who, target) < 0)
        return 0;
    int64_t spin_until = mono_us() + c->spin_us;
    for (unsigned i = 1;; i++) {
        int j = behind(c, who, target);
        if (j < 0)
            return 0;
        cpu_relax(i);
        if ((i & 1023) == 0) {
            if (mono_us() >= spin_until)
                break;
            /* The awaited rank last ran on this CPU: let it have the CPU,
             * but stay runnable. Sleeping here would hide the pair from the
             * load balancer (never both runnable, so never moved apart) and
             * futex wake-ups keep placing the wakee on the waker's CPU:
             * measured here, 10x slower all-reduces for a whole run. */
            if (atomic_load_explicit(&h->slot[j].cpu, memory_order_relaxed) == sched_getcpu())
                sched_yield();
        }
    }
    int64_t now = mono_ms(), last = now;
    uint64_t beat = atomic_load(&h->beat), sum = 0;
    for (int j = 0; j < c->nlocal; j++)
        sum += atomic_load(&h->slot[j].step);
    for (;;) {
        int j = behind(c, who, target);
        if (j < 0)
            return 0;
        if (atomic_load(&h->abort))
            return fail_from_abort(c);
        now = mono_ms();
        if (now >= c->next_live) {
            c->next_live = now + LIVE_CHECK_MS;
            if (check_live(c, who, target) < 0)
                return -1;
        }
        uint64_t b = atomic_load(&h->beat), s = 0;
        for (int k = 0; k < c->nlocal; k++)
            s += atomic_load(&h->slot[k].step);
        if (b != beat || s != sum) {
            beat = b;
            sum = s;
            last = now;
        } else if (now - last >= c->timeout_ms) {
            int r = c->local[j];
            return comm_fail(c, "rank %d (pid %lld) did not reach the %s within %d ms", r,
                             (long long)c->info[r].pid, what, c->timeout_ms);
        }
        atomic_fetch_add(&h->nsleep, 1);
        uint32_t v = atomic_load(&h->fx);
        if (behind(c, who, target) >= 0 && !atomic_load(&h->abort))
            futex_wait(&h->fx, v, SLEEP_MS);
        atomic_fetch_sub(&h->nsleep, 1);
    }
}

/* Entry step of a host collective: post this rank's descriptor, wait for
 * every local rank, check theirs. *zc_all: 1 when every rank passed its
 * comm_buffer number zc (>= 0). 0 or -1. */
static int enter(comm *c, uint32_t op, uint64_t n, int root, int zc, int *zc_all)
{
    if (c->failed)
        return -1;
    comm_shm *h = c->shm;
    int par = (int)(c->nops++ & 1);
    h->slot[c->lrank].desc[par] = (shm_desc){.op = op, .root = root, .n = n, .zc = zc};
    uint64_t s = c->step + 1;
    post(c, s);
    if (shm_wait(c, -1, s, op_name(op)) < 0)
        return -1;
    int all = zc >= 0;
    for (int j = 0; j < c->nlocal; j++) {
        const shm_desc *d = &h->slot[j].desc[par];
        if (d->op != op || d->n != n || d->root != root)
            return comm_fail(c, "rank %d called %s(%llu, root %d) while rank %d called %s(%llu, root %d)",
                             c->local[j], op_name(d->op), (unsigned long long)d->n, d->root, c->rank,
                             op_name(op), (unsigned long long)n, root);
        if (d->zc != zc)
            all = 0;
    }
    if (zc_all)
        *zc_all = all;
    return 0;
}

void comm_shm_beat(comm *c)
{
    if (c->shm)
        atomic_fetch_add_explicit(&c->shm->beat, 1, memory_order_relaxed);
}

void comm_shm_abort(comm *c, const char *msg)
{
    comm_shm *h = c->shm;
    if (!h)
        return;
    uint32_t zero = 0;
    if (atomic_compare_exchange_strong(&h->abort_lock, &zero, 1)) {
        snprintf(h->abort_msg, sizeof h->abort_msg, "%s", msg);
        atomic_store(&h->abort, 1);
    }
    atomic_fetch_add(&h->fx, 1);
    futex_wake_all(&h->fx);
}

/* ---------------------------------------------------------------- setup */

static int seg_name(const comm *c, int index, char *out, size_t cap)
{
    if (index < 0)
        return sfmt(out, cap, "/trainyard-%s-%016llx-h%d", c->session, (unsigned long long)c->nonce, c->hidx);
    return sfmt(out, cap, "/trainyard-%s-%016llx-h%d-b%d", c->session, (unsigned long long)c->nonce, c->hidx,
                index);
}

/* Leader: creates name with len bytes. Others: open it once it exists
 * with that size (bounded by deadline). Both map it. NULL on failure
 * (message in err). */
static void *seg_map(comm *c, const char *name, size_t len, int create, int64_t deadline, char *err, size_t cap)
{
    int fd = -1;
    if (create) {
        fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
        if (fd < 0) {
            snprintf(err, cap, "shm_open %s: %s", name, strerror(errno));
            return NULL;
        }
        if (ftruncate(fd, (off_t)len) < 0) {
            snprintf(err, cap, "ftruncate %s to %zu bytes: %s", name, len, strerror(errno));
            close(fd);
            shm_unlink(name);
            return NULL;
        }
    } else {
        int64_t next_live = 0;
        for (;;) {
            fd = shm_open(name, O_RDWR | O_CLOEXEC, 0600);
            if (fd >= 0) {
                struct stat st;
                if (fstat(fd, &st) == 0 && (size_t)st.st_size == len)
                    break;
                close(fd);
                fd = -1;
            } else if (errno != ENOENT) {
                snprintf(err, cap, "shm_open %s: %s", name, strerror(errno));
                return NULL;
            }
            int64_t now = mono_ms();
            if (now >= deadline) {
                snprintf(err, cap, "rank %d did not create %s within %d ms", c->local[0], name, c->timeout_ms);
                return NULL;
            }
            if (now >= next_live) {
                next_live = now + LIVE_CHECK_MS;
                if (comm_peer_dead(c, c->local[0])) {
                    snprintf(err, cap, "rank %d (pid %lld) died", c->local[0], (long long)c->info[c->local[0]].pid);
                    return NULL;
                }
            }
            sleep_ms(1);
        }
    }
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED) {
        snprintf(err, cap, "mmap %s (%zu bytes): %s", name, len, strerror(e));
        if (create)
            shm_unlink(name);
        return NULL;
    }
    return p;
}

int comm_shm_setup(comm *c, int64_t deadline)
{
    char err[ERR_MAX];
    int L = c->nlocal, leader = c->lrank == 0;
    size_t chunk = STAGE_BUDGET / (size_t)(2 * L + 2);
    chunk = chunk > CHUNK_MAX ? CHUNK_MAX : chunk < CHUNK_MIN ? CHUNK_MIN : chunk;
    chunk &= ~(size_t)4095;
    size_t hdr = sizeof(comm_shm) + (size_t)L * sizeof(shm_slot);
    hdr = (hdr + 4095) & ~(size_t)4095;
    size_t stage_off = hdr, result_off = stage_off + (size_t)L * 2 * chunk, total = result_off + 2 * chunk;
    c->spin_us = L <= sysconf(_SC_NPROCESSORS_ONLN) ? SPIN_ALONE_US : SPIN_CROWDED_US;
    if (seg_name(c, -1, c->shm_name, sizeof c->shm_name) < 0)
        return comm_fail(c, "shared memory name too long");
    c->shm_unlinked = !leader;
    void *p = seg_map(c, c->shm_name, total, leader, deadline, err, sizeof err);
    if (!p) {
        c->shm_unlinked = 1; /* seg_map unlinked it on failure */
        return comm_fail(c, "%s", err);
    }
    comm_shm *h = p;
    if (leader) {
        h->magic = COMM_MAGIC;
        h->nlocal = (uint32_t)L;
        h->nonce = c->nonce;
        h->chunk = chunk;
        h->stage_off = stage_off;
        h->result_off = result_off;
        h->total = total;
        atomic_store(&h->ready, 1);
    } else {
        while (!atomic_load(&h->ready)) {
            if (mono_ms() >= deadline) {
                munmap(p, total);
                return comm_fail(c, "rank %d did not initialise %s", c->local[0], c->shm_name);
            }
            sleep_ms(1);
        }
        if (h->magic != COMM_MAGIC || h->nlocal != (uint32_t)L || h->nonce != c->nonce || h->total != total) {
            munmap(p, total);
            return comm_fail(c, "%s belongs to another communicator", c->shm_name);
        }
    }
    c->shm = h;
    c->shm_len = total;
    h->slot[c->lrank].pid = c->info[c->rank].pid;
    /* every local rank has mapped it: the name can go */
    if (enter(c, OP_SETUP, 0, 0, -1, NULL) < 0)
        return -1;
    if (leader) {
        shm_unlink(c->shm_name);
        c->shm_unlinked = 1;
    }
    return 0;
}

void comm_shm_release(comm *c)
{
    if (c->shm && !c->shm_unlinked && c->lrank == 0)
        shm_unlink(c->shm_name);
    c->shm_unlinked = 1;
    if (c->shm)
        munmap(c->shm, c->shm_len);
    c->shm = NULL;
}

comm_segbuf *comm_shm_segbuf(comm *c, size_t n)
{
    size_t stride = n * sizeof(float);
    stride = stride < 64 ? 64 : stride;
    stride = (stride + 4095) & ~(size_t)4095;
    comm_segbuf *b = xcalloc(1, sizeof *b);
    b->n = n;
    b->stride = stride;
    b->index = c->nbufs;
    if (c->nlocal == 1) {
        b->map_len = stride;
        b->map = mmap(NULL, stride, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (b->map == MAP_FAILED) {
            comm_fail(c, "comm_buffer: mmap of %zu bytes: %s", stride, strerror(errno));
            free(b);
            return NULL;
        }
        b->mine = b->map;
        return b;
    }
    char name[160], err[ERR_MAX];
    int leader = c->lrank == 0;
    size_t len = stride * (size_t)c->nlocal;
    if (seg_name(c, b->index, name, sizeof name) < 0) {
        comm_fail(c, "shared memory name too long");
        free(b);
        return NULL;
    }
    /* leader creates; all enter; the others map; all enter; the leader unlinks */
    void *p = NULL;
    if (leader && !(p = seg_map(c, name, len, 1, 0, err, sizeof err))) {
        comm_fail(c, "comm_buffer: %s", err);
        free(b);
        return NULL;
    }
    int rc = enter(c, OP_SEGBUF, n, 0, -1, NULL);
    if (rc == 0 && !leader && !(p = seg_map(c, name, len, 0, mono_ms() + c->timeout_ms, err, sizeof err)))
        rc = comm_fail(c, "comm_buffer: %s", err);
    if (rc == 0)
        rc = enter(c, OP_SEGBUF, n, 1, -1, NULL);
    if (leader)
        shm_unlink(name);
    if (rc < 0) {
        if (p)
            munmap(p, len);
        free(b);
        return NULL;
    }
    b->map = p;
    b->map_len = len;
    b->mine = (float *)((char *)p + (size_t)c->lrank * stride);
    return b;
}

void comm_shm_segbuf_free(comm_segbuf *b)
{
    if (b->map)
        munmap(b->map, b->map_len);
    free(b);
}

/* ---------------------------------------------------------------- collectives */

/* Local rank j's slice of n floats: [*lo, *hi), cut at 16-float (64-byte)
 * boundaries so no two ranks write one cache line. */
static void slice(size_t n, int L, int j, size_t *lo, size_t *hi)
{
    size_t blocks = (n + 15) / 16;
    size_t a = blocks * (size_t)j / (size_t)L * 16, b = blocks * (size_t)(j + 1) / (size_t)L * 16;
    *lo = a < n ? a : n;
    *hi = b < n ? b : n;
}

int comm_shm_barrier(comm *c) { return enter(c, OP_BARRIER, 0, 0, -1, NULL); }

/* Zero-copy: every local rank's buffer is in zc's segment; each reduces its
 * slice of the whole buffer straight from the peers' buffers into all of
 * them (to_all) or into the leader's: n floats read and written per rank,
 * two steps in all. */
static int allreduce_zc(comm *c, size_t n, const comm_segbuf *zc, int to_all)
{
    int L = c->nlocal;
    const float *src[COMM_MAX_RANKS];
    float *dst[COMM_MAX_RANKS];
    size_t lo, hi;
    slice(n, L, c->lrank, &lo, &hi);
    for (int j = 0; j < L; j++) {
        float *b = (float *)((char *)zc->map + (size_t)j * zc->stride);
        src[j] = b + lo;
        dst[j] = b + lo;
    }
    if (hi > lo)
        comm_sum(dst, to_all ? L : 1, src, L, hi - lo);
    uint64_t s = c->step + 1;
    post(c, s);
    return shm_wait(c, -1, s, "allreduce");
}

/* Copies the parts of chunk k of data that the other ranks reduce into
 * this rank's staging slot k & 1. */
static void stage_chunk(comm *c, const float *data, size_t n, size_t k)
{
    size_t C = c->shm->chunk / sizeof(float), off = k * C, len = n - off < C ? n - off : C, lo, hi;
    float *st = (float *)stage(c, c->lrank, (int)k);
    slice(len, c->nlocal, c->lrank, &lo, &hi);
    memcpy(st, data + off, lo * sizeof(float));
    memcpy(st + hi, data + off + hi, (len - hi) * sizeof(float));
}

/* Staged (data is private memory): chunk by chunk, each rank stages the
 * parts of its chunk the others reduce (stage_chunk), reduces its own slice
 * (its own part read in place) into data and the result chunk, and copies
 * the others' slices back. Staging and result chunks alternate (k & 1), and
 * chunk k+1 is staged while the others finish reducing chunk k. Steps:
 * base + 2k + 1 = chunk k staged everywhere, base + 2k + 2 = reduced. */
static int allreduce_staged(comm *c, float *data, size_t n, int to_all)
{
    int L = c->nlocal, me = c->lrank, out = to_all || me == 0;
    size_t C = c->shm->chunk / sizeof(float);
    size_t nch = (n + C - 1) / C;
    uint64_t base = c->step;
    const float *src[COMM_MAX_RANKS];
    float *dst[2];
    stage_chunk(c, data, n, 0);
    post(c, base + 1);
    for (size_t k = 0; k < nch; k++) {
        size_t off = k * C, len = n - off < C ? n - off : C, lo, hi;
        float *b = data + off, *res = (float *)result(c, (int)k);
        if (shm_wait(c, -1, base + 2 * k + 1, "allreduce") < 0)
            return -1;
        slice(len, L, me, &lo, &hi);
        for (int j = 0; j < L; j++)
            src[j] = j == me ? b + lo : (const float *)stage(c, j, (int)k) + lo;
        int nd = 0;
        dst[nd++] = b + lo;
        if (to_all || me != 0)
            dst[nd++] = res + lo;
        if (hi > lo)
            comm_sum(dst, nd, src, L, hi - lo);
        post(c, base + 2 * k + 2);
        if (k + 1 < nch) {
            stage_chunk(c, data, n, k + 1);
            post(c, base + 2 * k + 3);
        }
        if (shm_wait(c, -1, base + 2 * k + 2, "allreduce") < 0)
            return -1;
        for (int j = 0; j < L && out; j++) {
            size_t a, z;
            if (j == me)
                continue;
            slice(len, L, j, &a, &z);
            memcpy(b + a, res + a, (z - a) * sizeof(float));
        }
    }
    return 0;
}

int comm_shm_allreduce(comm *c, float *data, size_t n, comm_segbuf *zc, int to_all)
{
    int zc_all = 0;
    if (enter(c, OP_ALLREDUCE, n, 0, zc ? zc->index : -1, &zc_all) < 0)
        return -1;
    if (zc_all)
        return allreduce_zc(c, n, zc, to_all);
    return allreduce_staged(c, data, n, to_all);
}

int comm_shm_bcast(comm *c, void *data, size_t bytes, int root, comm_segbuf *zc)
{
    int zc_all = 0, me = c->lrank;
    if (enter(c, OP_BCAST, bytes, root, zc ? zc->index : -1, &zc_all) < 0)
        return -1;
    if (zc_all) { /* read the root's buffer in place; the root waits until all have */
        if (me != root)
            memcpy(data, (char *)zc->map + (size_t)root * zc->stride, bytes);
        uint64_t s = c->step + 1;
        post(c, s);
        return me == root ? shm_wait(c, -1, s, "broadcast") : 0;
    }
    size_t C = c->shm->chunk, nch = (bytes + C - 1) / C;
    uint64_t base = c->step;
    char *b = data;
    for (size_t k = 0; k < nch; k++) {
        size_t off = k * C, len = bytes - off < C ? bytes - off : C;
        char *st = stage(c, root, (int)k);
        if (me == root) {
            if (k >= 2 && shm_wait(c, -1, base + 2 * (k - 2) + 2, "broadcast") < 0)
                return -1;
            memcpy(st, b + off, len);
            post(c, base + 2 * k + 2);
        } else {
            if (shm_wait(c, root, base + 2 * k + 1, "broadcast") < 0)
                return -1;
            memcpy(b + off, st, len);
            post(c, base + 2 * k + 2);
        }
    }
    return 0;
}
