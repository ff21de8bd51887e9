/* comm.h - collectives between the N worker processes of one job: sum
 * all-reduce of float32 buffers, broadcast, all-gather and barrier.
 *
 * Topology: ranks that share a host (same comm_host_id) talk through one
 * shared-memory segment; hosts talk over TCP in a ring (reduce-scatter then
 * all-gather, large buffers chunked and pipelined). With every rank on one
 * host no socket carries data; with one rank per host it is a plain TCP ring;
 * in between it is hierarchical (reduce on the host, ring between the host
 * leaders, broadcast on the host). The result of a sum is bit-identical on
 * every rank (each element is summed by exactly one rank, in a fixed order).
 *
 * Peers are found by the caller (the worker through the API's rendezvous, a
 * test or benchmark from a static table): comm knows no HTTP and no server.
 * A peer that dies or goes silent for opt->timeout_ms makes the call fail
 * with a message naming the peer; no call hangs forever. After an error the
 * communicator is unusable (every later call fails at once); comm_free it.
 *
 * Not thread-safe: one thread drives a communicator at a time.
 *
 * defines: comm_host_id, comm_listen, comm_init, comm_allreduce_sum,
 *          comm_broadcast, comm_allgather, comm_barrier, comm_buffer,
 *          comm_error, comm_rank, comm_size, comm_free */
#ifndef TRAINYARD_COMM_H
#define TRAINYARD_COMM_H

#include <stddef.h>

#include "../../common/errbuf.h"

#define COMM_HOST_ID_MAX 128
#define COMM_ADDR_MAX 256
#define COMM_MAX_RANKS 256

typedef struct comm comm;

typedef enum comm_transport {
    COMM_TRANSPORT_AUTO = 0, /* shared memory within a host, TCP between hosts */
    COMM_TRANSPORT_TCP = 1   /* TCP between every pair of ring neighbours (tests, benchmarks) */
} comm_transport;

typedef struct comm_peer {
    char addr[COMM_ADDR_MAX];        /* host name or IP the peer listens on */
    int port;
    char host_id[COMM_HOST_ID_MAX];  /* equal ids = one machine (comm_host_id) */
} comm_peer;

typedef struct comm_options {
    int timeout_ms;        /* a silent or dead peer is an error after this; 0 = 30000 */
    comm_transport transport;
    const char *session;   /* unique per job attempt ("job42-a3"): names the shared
                            * memory segment; NULL = "default" */
    const unsigned char *secret; /* COMM_SECRET_LEN bytes the server gave this attempt's
                            * tasks alone: every connection proves it (HMAC-SHA256)
                            * before anything it sends is used; NULL = none (tests,
                            * benchmarks): then anyone who can connect is believed */
} comm_options;

#define COMM_SECRET_LEN 32

/* This machine's identity for topology: boot id + network namespace, so two
 * network namespaces on one kernel count as two hosts. Returns 0 or -1. */
int comm_host_id(char out[COMM_HOST_ID_MAX]);

/* A listening TCP socket on bind_addr (NULL = all addresses) and port (0 =
 * any free port); *bound_port gets the port. Returns the fd, or -1 with a
 * message in err. */
int comm_listen(const char *bind_addr, int port, int *bound_port, char err[ERR_MAX]);

/* Joins the communicator of `size` ranks as `rank`: peers[i] is rank i's
 * address and host id (peers[rank] is this process); listen_fd is this
 * rank's socket from comm_listen (comm takes it and closes it). Blocks until
 * every rank has joined or opt->timeout_ms passes. Returns 0, or -1 with a
 * message in err (and *out NULL). */
int comm_init(comm **out, int rank, int size, const comm_peer *peers, int listen_fd,
              const comm_options *opt, char err[ERR_MAX]);

/* In place: buf (n floats) becomes the element-wise sum over all ranks,
 * identical on every rank. Returns 0 or -1 (comm_error says why). */
int comm_allreduce_sum(comm *c, float *buf, size_t n);

/* buf (bytes) of rank root is copied to every rank. Returns 0 or -1. */
int comm_broadcast(comm *c, void *buf, size_t bytes, int root);

/* Each rank's `bytes` from send land at recv + rank * bytes on every rank
 * (recv holds size * bytes). Returns 0 or -1. */
int comm_allgather(comm *c, const void *send, void *recv, size_t bytes);

/* Returns when every rank has called it (0), or -1. */
int comm_barrier(comm *c);

/* A buffer of n floats owned by the communicator (zeroed, 64-byte aligned),
 * valid until comm_free. Collective: every rank calls it, with the same n,
 * in the same order. comm_allreduce_sum on exactly this buffer skips the
 * copy into shared memory (peers on the host read it in place): build the
 * model's gradients in it. Same n on every rank. NULL on failure. */
float *comm_buffer(comm *c, size_t n);

const char *comm_error(const comm *c);
int comm_rank(const comm *c);
int comm_size(const comm *c);
void comm_free(comm *c);

#endif
