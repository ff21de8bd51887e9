/* comm_forge.h - what a stranger who read executor/comm/comm.c can say to a
 * worker's port: the bootstrap hello, with the right session and peer table
 * (both computed here as comm.c does) and a MAC made without the job's
 * secret. check_comm and check_job_auth send it to show it is dropped.
 * Header-only, for tests. */
#ifndef TRAINYARD_TESTS_COMM_FORGE_H
#define TRAINYARD_TESTS_COMM_FORGE_H

#include <stdint.h>
#include <string.h>

#define FORGE_FNV_INIT 0xcbf29ce484222325ULL

static inline uint64_t forge_fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ULL;
    return h;
}

/* comm.c's hello on the wire */
typedef struct forged_hello {
    uint32_t magic, kind, rank, size;
    uint64_t session, table;
    int64_t pid;
    uint64_t start, pidns;
    uint8_t nonce[16], mac[32];
} forged_hello;

/* A hello of kind (1: to rank 0, 2: to a ring neighbour) from `rank` of
 * `size` ranks, for the session and the peer table (addrs, ports, host ids
 * of every rank, and the transport), with a MAC of junk. */
static inline forged_hello forge_hello(int kind, int rank, int size, int transport, const char *session,
                                       const char *const *addrs, const int *ports, const char *const *host_ids) {
    uint64_t table = forge_fnv(FORGE_FNV_INIT, &size, sizeof size);
    table = forge_fnv(table, &transport, sizeof transport);
    for (int r = 0; r < size; r++) {
        table = forge_fnv(table, addrs[r], strlen(addrs[r]) + 1);
        table = forge_fnv(table, &ports[r], sizeof ports[r]);
        table = forge_fnv(table, host_ids[r], strlen(host_ids[r]) + 1);
    }
    forged_hello h = {.magic = 0x31435954u, .kind = (uint32_t)kind, .rank = (uint32_t)rank, .size = (uint32_t)size,
                      .session = forge_fnv(FORGE_FNV_INIT, session, strlen(session)), .table = table, .pid = 1};
    memset(h.mac, 0x5a, sizeof h.mac);
    return h;
}

#endif
