/* comm_int.h - comm's private parts, shared by its four files:
 *   comm.c  the API, the bootstrap (connections, the table from rank 0) and
 *           the topology (hosts, leaders, ring), and how each collective is
 *           composed from the two below;
 *   net.c   sockets: listen, connect with retries, whole reads and writes
 *           under a deadline;
 *   shm.c   the host's shared-memory segment: step counters, waiting
 *           (spin, then futex) with liveness checks, and the host-level
 *           collectives (reduce, broadcast, barrier);
 *   ring.c  the pipelined TCP ring between host leaders (reduce-scatter +
 *           all-gather, all-gather alone, and a broadcast chain).
 * Nothing here is part of the API (comm.h). */
#ifndef TRAINYARD_COMM_INT_H
#define TRAINYARD_COMM_INT_H

#include <stdint.h>
#include <sys/types.h>

#include "comm.h"

#define COMM_MAGIC 0x31435954u        /* "TYC1" on the wire and in shared memory */
#define COMM_SESSION_MAX 64           /* the part of opt->session that names segments */

/* ---------------------------------------------------------------- per rank */

/* What each rank learns about every other at init (rank 0's table). */
typedef struct comm_rankinfo {
    int64_t pid;        /* in its pid namespace */
    uint64_t start;     /* start time (/proc/PID/stat field 22): tells a reused pid */
    uint64_t pidns;     /* inode of its /proc/self/ns/pid: kill(pid, 0) means
                         * something only when equal to ours */
    int host;           /* host index (0 = rank 0's host) */
} comm_rankinfo;

/* One comm_buffer: a segment holding every local rank's buffer, `stride`
 * bytes apart; this rank's is at map + lrank * stride. */
typedef struct comm_segbuf {
    struct comm_segbuf *next;
    int index;          /* order of the comm_buffer call, the same on every rank */
    void *map;
    size_t map_len;
    size_t stride;
    size_t n;           /* floats */
    float *mine;
} comm_segbuf;

typedef struct comm_shm comm_shm; /* shm.c: the segment's header */

struct comm {
    int rank, size;
    int timeout_ms;
    comm_transport transport;
    char session[COMM_SESSION_MAX + 1]; /* sanitized: [A-Za-z0-9_.-] */
    uint64_t nonce;                     /* rank 0's, names the segments */
    int has_secret;                     /* opt->secret given: connections authenticate */
    unsigned char secret[32];
    int failed;
    char err[ERR_MAX];
    comm_peer *peers;                   /* copy of the caller's table */
    comm_rankinfo *info;                /* [size] */

    /* topology */
    int nhosts, hidx;                   /* hosts; this rank's host index */
    int *leader;                        /* [nhosts]: the lowest rank on each host */
    int nlocal, lrank;                  /* ranks on this host; this one's index among them */
    int *local;                         /* [nlocal]: their global ranks, ascending */
    int fd_left, fd_right;              /* ring between leaders; -1 when none */
    uint64_t ring_seq;                  /* ring operations so far (frames carry it) */
    float *scratch;                     /* ring.c: receive buffer of the reduce phase */
    size_t scratch_len;                 /* bytes */
    int tx_active;                      /* a frame to the right is half sent: */
    unsigned char tx_hdr[16];           /*   its header, */
    size_t tx_hdr_sent, tx_pay_left;    /*   what of it is out, what payload is owed */

    /* shared memory (nlocal > 1) */
    comm_shm *shm;
    size_t shm_len;
    char shm_name[128];
    int shm_unlinked;                   /* 1 once the name is gone (or was never ours) */
    uint64_t step;                      /* this rank's step counter (the shared copy's value) */
    uint64_t nops;                      /* host collectives so far */
    int spin_us;                        /* spinning before sleeping on the futex */
    int64_t next_live;                  /* mono_ms of the next liveness check */
    comm_segbuf *bufs;
    int nbufs;
};

/* ---------------------------------------------------------------- comm.c */

/* Marks c failed with a message (the first one wins), tells the host's other
 * ranks through shared memory and the right ring neighbour with an abort
 * frame. Returns -1 so callers can `return comm_fail(...)`. */
int comm_fail(comm *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* "rank R (pid P) died" / "rank R (pid P)" / "rank R (addr:port)" into out:
 * what an error message calls a peer. dead: whether we know it died. */
void comm_peer_name(const comm *c, int r, char *out, size_t cap);

/* 1 when rank r's pid can be checked from here: the same host id and pid
 * namespace (not this rank). */
int comm_peer_local(const comm *c, int r);

/* 1 when rank r is on this host's pid namespace and is known dead (gone,
 * zombie, or its pid reused); 0 when alive or not knowable from here. */
int comm_peer_dead(const comm *c, int r);

/* ---------------------------------------------------------------- net.c */

/* Connects to addr:port, retrying refused or unreachable attempts until
 * deadline (mono_ms). Returns a non-blocking fd with TCP_NODELAY and big
 * buffers, or -1 with a message in err. */
int comm_net_connect(const char *addr, int port, int64_t deadline, char *err, size_t errlen);

/* Socket options for a data connection: non-blocking, close-on-exec,
 * TCP_NODELAY, big send and receive buffers. Returns 0 or -1. */
int comm_net_tune(int fd);

/* Writes / reads exactly len bytes on a non-blocking fd, waiting with poll
 * until deadline (mono_ms). Return 0, or -1 with errno (ETIMEDOUT past the
 * deadline, EPIPE/ECONNRESET when the peer is gone, 0 bytes read = EPIPE). */
int comm_net_write_all(int fd, const void *p, size_t len, int64_t deadline);
int comm_net_read_all(int fd, void *p, size_t len, int64_t deadline);

/* ---------------------------------------------------------------- shm.c */

/* The leader creates and maps the host's segment, the others map it, and
 * the name is unlinked once all have. Returns 0 or -1 (comm_fail'ed). */
int comm_shm_setup(comm *c, int64_t deadline);
void comm_shm_release(comm *c);

/* Host collectives; every local rank calls each, in the same order.
 * comm_shm_allreduce: data (n floats) becomes the host's sum on every local rank
 * (to_all) or on the leader only (the others' buffers then hold unspecified
 * values). zc: data is this rank's comm_buffer segbuf (every local rank's, or
 * the plain path is taken). comm_shm_bcast: bytes of local rank `root`'s data to
 * every local rank; zc as above (the leader's comm_buffer, read in place). */
int comm_shm_allreduce(comm *c, float *data, size_t n, comm_segbuf *zc, int to_all);
int comm_shm_bcast(comm *c, void *data, size_t bytes, int root, comm_segbuf *zc);
int comm_shm_barrier(comm *c);

/* comm_buffer's segment for the host (collective). NULL on failure. */
comm_segbuf *comm_shm_segbuf(comm *c, size_t n);
void comm_shm_segbuf_free(comm_segbuf *b);

/* Tells the host's ranks waiting in shared memory that the leader is making
 * progress on the ring (resets their silence timers). */
void comm_shm_beat(comm *c);

/* Writes msg as the host's abort message (the first one wins) and wakes
 * every waiter. */
void comm_shm_abort(comm *c, const char *msg);

/* ---------------------------------------------------------------- ring.c */

/* Between the host leaders (this rank is one; c->nhosts > 1).
 * comm_ring_allreduce: data (n floats) becomes the sum over hosts.
 * comm_ring_allgather: seg_off/seg_len[h] (bytes) is host h's part of data; this
 * host's part is filled, the rest arrives. comm_ring_bcast: bytes of host
 * root_host's leader's data to every leader. comm_ring_abort: best-effort abort
 * frame to the right neighbour. All return 0 or -1 (comm_fail'ed). */
int comm_ring_allreduce(comm *c, float *data, size_t n);
int comm_ring_allgather(comm *c, void *data, const size_t *seg_off, const size_t *seg_len);
int comm_ring_bcast(comm *c, void *data, size_t bytes, int root_host);
void comm_ring_abort(comm *c, const char *msg);

/* ---------------------------------------------------------------- kernels */

/* dst[i] = ((src[0][i] + src[1][i]) + src[2][i]) + ... over nsrc sources,
 * written to each of the ndst destinations: the fixed order that makes sums
 * bit-identical on every rank. Sources and destinations may coincide only
 * element for element (dst[d] == src[s] is fine). */
void comm_sum(float *const *dst, int ndst, const float *const *src, int nsrc, size_t n);

#endif
