/* comm.c - the collective library's API (comm.h): bootstrap, topology, and
 * each collective composed from the host's shared memory (shm.c) and the
 * TCP ring between host leaders (ring.c).
 *
 * Bootstrap (comm_init): every rank but 0 connects to rank 0 and says hello
 * (session, rank, a hash of the peer table, its pid); each host leader also
 * connects to the next host's leader (the ring) and accepts the previous
 * one. Rank 0 answers everyone with the table of pids and a random nonce,
 * which names the shared-memory segments. With the attempt's secret
 * (opt->secret) every hello carries a fresh nonce and an HMAC-SHA256 of
 * itself under the secret: one that does not prove the secret is dropped at
 * once, before anything in it is believed; rank 0 proves it back with an
 * HMAC of the table and the rank's nonce, a ring's acceptor with an HMAC of
 * the connector's nonce. Connections from strangers (wrong magic, session or
 * proof) are dropped; a proven peer with another table is an error.
 * Everything is bounded by opt->timeout_ms. See docs/comm.md. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../common/util.h"
#include "comm_int.h"

#define DEFAULT_TIMEOUT_MS 30000
#define MAX_PENDING 64 /* accepted connections that have not said hello yet */

enum { HELLO_STAR = 1, HELLO_RING = 2 };

/* The first message on every connection, from the connecting side. */
typedef struct wire_hello {
    uint32_t magic;
    uint32_t kind;
    uint32_t rank;
    uint32_t size;
    uint64_t session;  /* fnv1a of opt->session */
    uint64_t table;    /* fnv1a of the peer table and the transport */
    int64_t pid;
    uint64_t start;
    uint64_t pidns;
    uint8_t nonce[16]; /* fresh per connection */
    uint8_t mac[32];   /* HMAC-SHA256(secret, "hello" | the bytes above); zero without a secret */
} wire_hello;

#define MAC_LEN 32

/* Rank 0's answer on each star connection: this, then size wire_rank. */
typedef struct wire_table {
    uint32_t magic;
    uint32_t size;
    uint64_t nonce;
} wire_table;

typedef struct wire_rank {
    int64_t pid;
    uint64_t start;
    uint64_t pidns;
} wire_rank;

/* ---------------------------------------------------------------- helpers */

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

#define FNV_INIT 0xcbf29ce484222325ULL

/* Field 22 (start time) of /proc/PID/stat, and its state letter. 0 or -1. */
static int proc_stat(long pid, uint64_t *start, char *state)
{
    char path[64], data[1024];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t r;
    do {
        r = read(fd, data, sizeof data - 1);
    } while (r < 0 && errno == EINTR);
    close(fd);
    if (r <= 0)
        return -1;
    data[r] = '\0';
    char *p = strrchr(data, ')'); /* the command name may hold spaces and ')' */
    if (!p || p[1] != ' ' || !p[2])
        return -1;
    p += 2;
    if (state)
        *state = *p;
    /* fields 3 (state) .. 22 (starttime): skip 19 separators */
    for (int f = 3; f < 22; f++) {
        p = strchr(p, ' ');
        if (!p)
            return -1;
        p++;
    }
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(p, &end, 10);
    if (errno || end == p)
        return -1;
    if (start)
        *start = v;
    return 0;
}

static uint64_t ns_inode(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (uint64_t)st.st_ino : 0;
}

int comm_host_id(char out[COMM_HOST_ID_MAX])
{
    out[0] = '\0';
    char boot[64];
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t r;
    do {
        r = read(fd, boot, sizeof boot - 1);
    } while (r < 0 && errno == EINTR);
    close(fd);
    if (r <= 0)
        return -1;
    boot[r] = '\0';
    size_t len = strcspn(boot, "\r\n");
    boot[len] = '\0';
    if (len == 0)
        return -1;
    uint64_t netns = ns_inode("/proc/self/ns/net");
    if (netns == 0)
        return -1;
    return sfmt(out, COMM_HOST_ID_MAX, "%s-net%llu", boot, (unsigned long long)netns);
}

void comm_peer_name(const comm *c, int r, char *out, size_t cap)
{
    const comm_rankinfo *in = c->info ? &c->info[r] : NULL;
    if (in && in->pid > 0 && strcmp(c->peers[r].host_id, c->peers[c->rank].host_id) == 0)
        snprintf(out, cap, "rank %d (pid %lld)", r, (long long)in->pid);
    else
        snprintf(out, cap, "rank %d (%.80s:%d)", r, c->peers[r].addr, c->peers[r].port);
}

int comm_peer_local(const comm *c, int r)
{
    const comm_rankinfo *in = c->info ? &c->info[r] : NULL;
    return in && r != c->rank && in->pid > 0 && in->pidns == c->info[c->rank].pidns &&
           strcmp(c->peers[r].host_id, c->peers[c->rank].host_id) == 0;
}

int comm_peer_dead(const comm *c, int r)
{
    if (!comm_peer_local(c, r))
        return 0; /* another machine or pid namespace: its pid means nothing here */
    const comm_rankinfo *in = &c->info[r];
    if (kill((pid_t)in->pid, 0) < 0 && errno == ESRCH)
        return 1;
    uint64_t start = 0;
    char state = '?';
    if (proc_stat((long)in->pid, &start, &state) < 0)
        return 0; /* it exists (kill said so) but /proc hides it: assume alive */
    return state == 'Z' || state == 'X' || start != in->start;
}

int comm_fail(comm *c, const char *fmt, ...)
{
    if (!c->failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err, sizeof c->err, fmt, ap);
        va_end(ap);
        c->failed = 1;
        if (c->shm)
            comm_shm_abort(c, c->err);
        if (c->fd_right >= 0)
            comm_ring_abort(c, c->err);
    }
    return -1;
}

/* ---------------------------------------------------------------- proofs */

/* HMAC-SHA256(secret, label | a | b) */
static int proof(const comm *c, const char *label, const void *a, size_t alen, const void *b, size_t blen,
                 unsigned char out[MAC_LEN])
{
    const void *part[3] = {label, a, b};
    size_t len[3] = {strlen(label), alen, blen};
    return hmac_sha256(c->secret, sizeof c->secret, 3, part, len, out);
}

static int hello_proven(const comm *c, const wire_hello *h)
{
    unsigned char want[MAC_LEN];
    if (proof(c, "trainyard-comm-hello", h, offsetof(wire_hello, mac), NULL, 0, want) < 0)
        return 0;
    return mem_equal_ct(want, h->mac, MAC_LEN);
}

/* ---------------------------------------------------------------- bootstrap */

typedef struct pending {
    int fd;
    size_t got;
    int64_t since; /* accepted at (mono ms) */
    wire_hello h;
} pending;

/* A connection that has not said a whole hello this long after it was
 * accepted is dropped: a peer's hello follows its connect at once. */
#define HELLO_WAIT_MS 2000

/* Accepts until rank 0 has every star connection (star[r] >= 0 for r > 0)
 * and a ring member has its left neighbour (c->fd_left). 0 or -1 (err). */
static int accept_all(comm *c, int lfd, int *star, uint8_t (*star_nonce)[16], int want_left, uint64_t sess,
                      uint64_t table, int64_t deadline, char *err)
{
    pending pend[MAX_PENDING];
    int np = 0, rc = -1;
    int left = want_left ? c->leader[(c->hidx + c->nhosts - 1) % c->nhosts] : -1;
    for (;;) {
        int missing = -1;
        if (c->rank == 0)
            for (int r = 1; r < c->size && missing < 0; r++)
                if (star[r] < 0)
                    missing = r;
        if (missing < 0 && want_left && c->fd_left < 0)
            missing = left;
        if (missing < 0) {
            rc = 0;
            break;
        }
        int64_t now = mono_ms();
        for (int i = np - 1; i >= 0; i--)
            if (now - pend[i].since > HELLO_WAIT_MS) {
                close(pend[i].fd);
                pend[i] = pend[--np];
            }
        if (now >= deadline) {
            snprintf(err, ERR_MAX, "rank %d (%.80s:%d) did not connect within %d ms", missing,
                     c->peers[missing].addr, c->peers[missing].port, c->timeout_ms);
            break;
        }
        struct pollfd pf[MAX_PENDING + 1];
        pf[0] = (struct pollfd){.fd = lfd, .events = POLLIN};
        for (int i = 0; i < np; i++)
            pf[i + 1] = (struct pollfd){.fd = pend[i].fd, .events = POLLIN};
        int64_t wait = deadline - now;
        int pr = poll(pf, (nfds_t)np + 1, wait > 100 ? 100 : (int)wait);
        if (pr < 0 && errno != EINTR) {
            snprintf(err, ERR_MAX, "poll: %s", strerror(errno));
            break;
        }
        if (pr <= 0)
            continue;
        /* hellos first (indices stay valid), then new connections */
        for (int i = np - 1; i >= 0; i--) {
            if (!pf[i + 1].revents)
                continue;
            pending *p = &pend[i];
            ssize_t n = recv(p->fd, (char *)&p->h + p->got, sizeof p->h - p->got, 0);
            if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
                continue;
            int drop = n <= 0;
            if (n > 0)
                p->got += (size_t)n;
            /* not our protocol: dropped as soon as its first word says so */
            if (!drop && p->got >= sizeof p->h.magic && p->h.magic != COMM_MAGIC)
                drop = 1;
            if (!drop && p->got == sizeof p->h) {
                const wire_hello *h = &p->h;
                drop = 1;
                /* the proof first: nothing a stranger says is believed, not even its table */
                if (h->magic == COMM_MAGIC && (!c->has_secret || hello_proven(c, h)) && h->session == sess &&
                    h->size == (uint32_t)c->size && h->rank < (uint32_t)c->size) {
                    int r = (int)h->rank;
                    if (h->table != table) {
                        snprintf(err, ERR_MAX, "rank %d has a different peer table (same session)", r);
                        goto out;
                    }
                    if (h->kind == HELLO_STAR && c->rank == 0 && r > 0 && star[r] < 0) {
                        star[r] = p->fd;
                        memcpy(star_nonce[r], h->nonce, sizeof h->nonce);
                        c->info[r].pid = h->pid;
                        c->info[r].start = h->start;
                        c->info[r].pidns = h->pidns;
                        drop = 0;
                    } else if (h->kind == HELLO_RING && want_left && r == left && c->fd_left < 0) {
                        /* the acceptor's proof: an HMAC of the connector's nonce (a fresh
                         * socket's buffer takes 32 bytes at once) */
                        unsigned char ack[MAC_LEN];
                        if (!c->has_secret ||
                            (proof(c, "trainyard-comm-ring", h->nonce, sizeof h->nonce, NULL, 0, ack) == 0 &&
                             send(p->fd, ack, sizeof ack, MSG_NOSIGNAL) == (ssize_t)sizeof ack)) {
                            c->fd_left = p->fd;
                            drop = 0;
                        }
                    }
                }
                if (drop)
                    close(p->fd); /* a stranger or a duplicate */
                pend[i] = pend[--np];
            } else if (drop) {
                close(p->fd);
                pend[i] = pend[--np];
            }
        }
        if (pf[0].revents) {
            for (;;) {
                int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                if (fd < 0) {
                    if (errno == EINTR || errno == ECONNABORTED)
                        continue;
                    break; /* EAGAIN, or EMFILE and the like: try again later */
                }
                if (comm_net_tune(fd) < 0) {
                    close(fd);
                    continue;
                }
                if (np == MAX_PENDING) { /* too many silent ones: drop the oldest */
                    int old = 0;
                    for (int i = 1; i < np; i++)
                        if (pend[i].since < pend[old].since)
                            old = i;
                    close(pend[old].fd);
                    pend[old] = pend[--np];
                }
                pend[np++] = (pending){.fd = fd, .since = mono_ms()};
            }
        }
    }
out:
    for (int i = 0; i < np; i++)
        close(pend[i].fd);
    return rc;
}

/* The hello on a new connection; nonce gets the fresh one it carries. */
static int send_hello(int fd, int kind, const comm *c, uint64_t sess, uint64_t table, int64_t deadline,
                      uint8_t nonce[16])
{
    wire_hello h = {.magic = COMM_MAGIC, .kind = (uint32_t)kind, .rank = (uint32_t)c->rank,
                    .size = (uint32_t)c->size, .session = sess, .table = table,
                    .pid = c->info[c->rank].pid, .start = c->info[c->rank].start,
                    .pidns = c->info[c->rank].pidns};
    if (getrandom(h.nonce, sizeof h.nonce, 0) != (ssize_t)sizeof h.nonce) {
        errno = EIO;
        return -1;
    }
    memcpy(nonce, h.nonce, sizeof h.nonce);
    if (c->has_secret && proof(c, "trainyard-comm-hello", &h, offsetof(wire_hello, mac), NULL, 0, h.mac) < 0) {
        errno = EIO;
        return -1;
    }
    return comm_net_write_all(fd, &h, sizeof h, deadline);
}

/* Reads the peer's proof (MAC_LEN bytes) on fd and checks it is want. 0, or -1. */
static int read_proof(comm *c, int fd, const unsigned char want[MAC_LEN], int64_t deadline)
{
    unsigned char got[MAC_LEN];
    if (comm_net_read_all(fd, got, sizeof got, deadline) < 0)
        return -1;
    (void)c;
    return mem_equal_ct(got, want, MAC_LEN) ? 0 : -1;
}

/* Hosts from the host ids (COMM_TRANSPORT_TCP: one per rank), in order of
 * their lowest rank; leaders; this rank's local group. */
static void topology(comm *c)
{
    int *host = xcalloc((size_t)c->size, sizeof *host);
    c->leader = xcalloc((size_t)c->size, sizeof *c->leader);
    c->nhosts = 0;
    for (int r = 0; r < c->size; r++) {
        int h = -1;
        if (c->transport != COMM_TRANSPORT_TCP)
            for (int k = 0; k < c->nhosts && h < 0; k++)
                if (strcmp(c->peers[c->leader[k]].host_id, c->peers[r].host_id) == 0)
                    h = k;
        if (h < 0) {
            h = c->nhosts++;
            c->leader[h] = r;
        }
        host[r] = h;
        c->info[r].host = h;
    }
    c->hidx = host[c->rank];
    c->local = xcalloc((size_t)c->size, sizeof *c->local);
    c->nlocal = 0;
    for (int r = 0; r < c->size; r++)
        if (host[r] == c->hidx) {
            if (r == c->rank)
                c->lrank = c->nlocal;
            c->local[c->nlocal++] = r;
        }
    free(host);
}

static void sanitize_session(char *out, const char *s)
{
    size_t n = 0;
    for (; s[n] && n < COMM_SESSION_MAX; n++) {
        unsigned char ch = (unsigned char)s[n];
        out[n] = (isalnum(ch) || ch == '_' || ch == '-' || ch == '.') ? (char)ch : '_';
    }
    out[n] = '\0';
}

int comm_init(comm **out, int rank, int size, const comm_peer *peers, int listen_fd,
              const comm_options *opt, char err[ERR_MAX])
{
    *out = NULL;
    err[0] = '\0';
    int *star = NULL, star_fd = -1, rc = -1;
    uint8_t (*star_nonce)[16] = NULL, star_nonce_mine[16] = {0}, ring_nonce[16] = {0};
    comm *c = NULL;
    if (size < 1 || size > COMM_MAX_RANKS || rank < 0 || rank >= size || !peers) {
        snprintf(err, ERR_MAX, "rank %d of %d: out of range (1..%d ranks)", rank, size, COMM_MAX_RANKS);
        goto out;
    }
    for (int r = 0; r < size; r++) {
        if (strnlen(peers[r].addr, COMM_ADDR_MAX) == COMM_ADDR_MAX ||
            strnlen(peers[r].host_id, COMM_HOST_ID_MAX) == COMM_HOST_ID_MAX) {
            snprintf(err, ERR_MAX, "peer %d: address or host id not terminated", r);
            goto out;
        }
        if (r != rank && size > 1 && (peers[r].port <= 0 || peers[r].port > 65535)) {
            snprintf(err, ERR_MAX, "peer %d: port %d out of range", r, peers[r].port);
            goto out;
        }
    }
    const char *session = opt && opt->session ? opt->session : "default";
    c = xcalloc(1, sizeof *c);
    c->rank = rank;
    c->size = size;
    c->timeout_ms = opt && opt->timeout_ms > 0 ? opt->timeout_ms : DEFAULT_TIMEOUT_MS;
    c->transport = opt ? opt->transport : COMM_TRANSPORT_AUTO;
    c->fd_left = c->fd_right = -1;
    if (opt && opt->secret) {
        memcpy(c->secret, opt->secret, sizeof c->secret);
        c->has_secret = 1;
    }
    sanitize_session(c->session, session);
    c->peers = xcalloc((size_t)size, sizeof *c->peers);
    memcpy(c->peers, peers, (size_t)size * sizeof *peers);
    c->info = xcalloc((size_t)size, sizeof *c->info);
    c->info[rank].pid = (int64_t)getpid();
    if (proc_stat((long)getpid(), &c->info[rank].start, NULL) < 0)
        c->info[rank].start = 0;
    c->info[rank].pidns = ns_inode("/proc/self/ns/pid");
    topology(c);
    int64_t deadline = mono_ms() + c->timeout_ms;

    uint64_t sess = fnv1a(FNV_INIT, session, strlen(session));
    uint64_t table = fnv1a(FNV_INIT, &size, sizeof size);
    int tr = (int)c->transport;
    table = fnv1a(table, &tr, sizeof tr);
    for (int r = 0; r < size; r++) {
        table = fnv1a(table, peers[r].addr, strlen(peers[r].addr) + 1);
        table = fnv1a(table, &peers[r].port, sizeof peers[r].port);
        table = fnv1a(table, peers[r].host_id, strlen(peers[r].host_id) + 1);
    }

    if (size > 1) {
        if (listen_fd < 0) {
            snprintf(err, ERR_MAX, "no listening socket (comm_listen)");
            goto out;
        }
        int leader = c->leader[c->hidx] == rank;
        int ring = leader && c->nhosts > 1;
        /* connect first: the peers listen already, so connects never wait on accepts */
        if (rank != 0) {
            char why[ERR_MAX - 32];
            star_fd = comm_net_connect(peers[0].addr, peers[0].port, deadline, why, sizeof why);
            if (star_fd < 0) {
                snprintf(err, ERR_MAX, "rank 0: %.200s", why);
                goto out;
            }
            if (send_hello(star_fd, HELLO_STAR, c, sess, table, deadline, star_nonce_mine) < 0) {
                snprintf(err, ERR_MAX, "cannot greet rank 0: %s", strerror(errno));
                goto out;
            }
        }
        if (ring) {
            int right = c->leader[(c->hidx + 1) % c->nhosts];
            char why[ERR_MAX - 32];
            c->fd_right = comm_net_connect(peers[right].addr, peers[right].port, deadline, why, sizeof why);
            if (c->fd_right < 0) {
                snprintf(err, ERR_MAX, "rank %d: %.200s", right, why);
                goto out;
            }
            if (send_hello(c->fd_right, HELLO_RING, c, sess, table, deadline, ring_nonce) < 0) {
                snprintf(err, ERR_MAX, "cannot greet rank %d: %s", right, strerror(errno));
                goto out;
            }
        }
        star = xcalloc((size_t)size, sizeof *star);
        for (int r = 0; r < size; r++)
            star[r] = -1;
        star_nonce = xcalloc((size_t)size, sizeof *star_nonce);
        if ((rank == 0 || ring) && accept_all(c, listen_fd, star, star_nonce, ring, sess, table, deadline, err) < 0)
            goto out;
        /* the right neighbour proves the secret back (sent as it accepted us) */
        if (ring && c->has_secret) {
            unsigned char want[MAC_LEN];
            int right = c->leader[(c->hidx + 1) % c->nhosts];
            if (proof(c, "trainyard-comm-ring", ring_nonce, sizeof ring_nonce, NULL, 0, want) < 0 ||
                read_proof(c, c->fd_right, want, deadline) < 0) {
                snprintf(err, ERR_MAX, "rank %d (%.80s:%d) did not prove this job's secret: not this job's rank",
                         right, peers[right].addr, peers[right].port);
                goto out;
            }
        }
        /* rank 0's table: pids and the nonce */
        size_t tlen = sizeof(wire_table) + (size_t)size * sizeof(wire_rank);
        char *tbuf = xcalloc(1, tlen);
        wire_table *th = (wire_table *)tbuf;
        wire_rank *tr_ = (wire_rank *)(tbuf + sizeof *th);
        if (rank == 0) {
            uint64_t nonce = 0;
            if (getrandom(&nonce, sizeof nonce, 0) != (ssize_t)sizeof nonce)
                nonce = (uint64_t)mono_ms() * 0x9e3779b97f4a7c15ULL ^ (uint64_t)getpid();
            c->nonce = nonce;
            *th = (wire_table){.magic = COMM_MAGIC, .size = (uint32_t)size, .nonce = nonce};
            for (int r = 0; r < size; r++)
                tr_[r] = (wire_rank){c->info[r].pid, c->info[r].start, c->info[r].pidns};
            for (int r = 1; r < size; r++) {
                unsigned char mac[MAC_LEN];
                if (comm_net_write_all(star[r], tbuf, tlen, deadline) < 0 ||
                    (c->has_secret && (proof(c, "trainyard-comm-table", star_nonce[r], sizeof star_nonce[r], tbuf,
                                             tlen, mac) < 0 ||
                                       comm_net_write_all(star[r], mac, sizeof mac, deadline) < 0))) {
                    snprintf(err, ERR_MAX, "cannot send the table to rank %d: %s", r, strerror(errno));
                    free(tbuf);
                    goto out;
                }
            }
        } else {
            if (comm_net_read_all(star_fd, tbuf, tlen, deadline) < 0 || th->magic != COMM_MAGIC ||
                th->size != (uint32_t)size) {
                snprintf(err, ERR_MAX, "no table from rank 0 (%.80s:%d) within %d ms: %s", peers[0].addr,
                         peers[0].port, c->timeout_ms, errno == ETIMEDOUT ? "timed out" : "connection lost");
                free(tbuf);
                goto out;
            }
            unsigned char want[MAC_LEN];
            if (c->has_secret &&
                (proof(c, "trainyard-comm-table", star_nonce_mine, sizeof star_nonce_mine, tbuf, tlen, want) < 0 ||
                 read_proof(c, star_fd, want, deadline) < 0)) {
                snprintf(err, ERR_MAX, "rank 0 (%.80s:%d) did not prove this job's secret: not this job's rank 0",
                         peers[0].addr, peers[0].port);
                free(tbuf);
                goto out;
            }
            c->nonce = th->nonce;
            for (int r = 0; r < size; r++) {
                c->info[r].pid = tr_[r].pid;
                c->info[r].start = tr_[r].start;
                c->info[r].pidns = tr_[r].pidns;
            }
        }
        free(tbuf);
    }
    if (c->nlocal > 1 && comm_shm_setup(c, deadline) < 0) {
        snprintf(err, ERR_MAX, "%s", c->err);
        goto out;
    }
    rc = 0;
out:
    if (listen_fd >= 0)
        close(listen_fd);
    if (star) {
        for (int r = 0; r < size; r++)
            if (star[r] >= 0)
                close(star[r]);
        free(star);
    }
    free(star_nonce);
    if (star_fd >= 0)
        close(star_fd);
    if (rc < 0) {
        if (!err[0])
            snprintf(err, ERR_MAX, "comm_init failed");
        if (c) {
            c->failed = 1; /* no abort frames from a half-made communicator */
            comm_free(c);
        }
        return -1;
    }
    *out = c;
    return 0;
}

/* ---------------------------------------------------------------- collectives */

static int is_leader(const comm *c) { return c->leader[c->hidx] == c->rank; }

/* The comm_buffer holding data as its start, big enough for n floats. */
static comm_segbuf *find_segbuf(comm *c, const void *data, size_t n)
{
    for (comm_segbuf *b = c->bufs; b; b = b->next)
        if ((const void *)b->mine == data && n <= b->n)
            return b;
    return NULL;
}

int comm_allreduce_sum(comm *c, float *data, size_t n)
{
    if (c->failed)
        return -1;
    if (n == 0 || c->size == 1)
        return 0;
    if (!data || n > SIZE_MAX / sizeof(float))
        return comm_fail(c, "allreduce: bad buffer (%zu floats)", n);
    comm_segbuf *zc = find_segbuf(c, data, n);
    if (c->nlocal > 1 && comm_shm_allreduce(c, data, n, zc, c->nhosts == 1) < 0)
        return -1;
    if (c->nhosts > 1 && is_leader(c) && comm_ring_allreduce(c, data, n) < 0)
        return -1;
    if (c->nlocal > 1 && c->nhosts > 1 && comm_shm_bcast(c, data, n * sizeof(float), 0, zc) < 0)
        return -1;
    return 0;
}

int comm_broadcast(comm *c, void *data, size_t bytes, int root)
{
    if (c->failed)
        return -1;
    if (root < 0 || root >= c->size)
        return comm_fail(c, "broadcast: root %d out of range", root);
    if (bytes == 0 || c->size == 1)
        return 0;
    if (!data)
        return comm_fail(c, "broadcast: NULL buffer");
    int rhost = c->info[root].host;
    comm_segbuf *zc = find_segbuf(c, data, (bytes + sizeof(float) - 1) / sizeof(float));
    if (zc && zc->n * sizeof(float) < bytes)
        zc = NULL;
    if (c->nlocal > 1 && c->hidx == rhost) {
        int lroot = 0;
        while (c->local[lroot] != root)
            lroot++;
        if (comm_shm_bcast(c, data, bytes, lroot, zc) < 0)
            return -1;
    }
    if (c->nhosts > 1 && is_leader(c) && comm_ring_bcast(c, data, bytes, rhost) < 0)
        return -1;
    if (c->nlocal > 1 && c->hidx != rhost && comm_shm_bcast(c, data, bytes, 0, zc) < 0)
        return -1;
    return 0;
}

int comm_allgather(comm *c, const void *send, void *recv, size_t bytes)
{
    if (c->failed)
        return -1;
    if (bytes == 0)
        return 0;
    if (!send || !recv || bytes > SIZE_MAX / (size_t)c->size)
        return comm_fail(c, "allgather: bad buffers (%zu bytes)", bytes);
    char *rv = recv;
    memmove(rv + (size_t)c->rank * bytes, send, bytes);
    if (c->size == 1)
        return 0;
    for (int j = 0; j < c->nlocal && c->nlocal > 1; j++)
        if (comm_shm_bcast(c, rv + (size_t)c->local[j] * bytes, bytes, j, NULL) < 0)
            return -1;
    if (c->nhosts == 1)
        return 0;
    if (is_leader(c)) {
        /* host h's blocks, packed in rank order, are segment h of the ring */
        size_t *off = xcalloc((size_t)c->nhosts, sizeof *off);
        size_t *len = xcalloc((size_t)c->nhosts, sizeof *len);
        for (int r = 0; r < c->size; r++)
            len[c->info[r].host] += bytes;
        for (int h = 1; h < c->nhosts; h++)
            off[h] = off[h - 1] + len[h - 1];
        char *packed = xmalloc((size_t)c->size * bytes);
        size_t *pos = xcalloc((size_t)c->nhosts, sizeof *pos);
        for (int r = 0; r < c->size; r++) {
            int h = c->info[r].host;
            if (h == c->hidx)
                memcpy(packed + off[h] + pos[h], rv + (size_t)r * bytes, bytes);
            pos[h] += bytes;
        }
        int rc = comm_ring_allgather(c, packed, off, len);
        if (rc == 0) {
            memset(pos, 0, (size_t)c->nhosts * sizeof *pos);
            for (int r = 0; r < c->size; r++) {
                int h = c->info[r].host;
                memcpy(rv + (size_t)r * bytes, packed + off[h] + pos[h], bytes);
                pos[h] += bytes;
            }
        }
        free(pos);
        free(packed);
        free(off);
        free(len);
        if (rc < 0)
            return -1;
    }
    if (c->nlocal > 1 && comm_shm_bcast(c, rv, (size_t)c->size * bytes, 0, NULL) < 0)
        return -1;
    return 0;
}

int comm_barrier(comm *c)
{
    if (c->failed)
        return -1;
    if (c->size == 1)
        return 0;
    if (c->nlocal > 1 && comm_shm_barrier(c) < 0)
        return -1;
    if (c->nhosts > 1) {
        if (is_leader(c)) {
            /* an all-gather of one byte per host: done when every host has spoken */
            char *b = xcalloc((size_t)c->nhosts, 1);
            size_t *off = xcalloc((size_t)c->nhosts, sizeof *off);
            size_t *len = xcalloc((size_t)c->nhosts, sizeof *len);
            for (int h = 0; h < c->nhosts; h++) {
                off[h] = (size_t)h;
                len[h] = 1;
            }
            int rc = comm_ring_allgather(c, b, off, len);
            free(b);
            free(off);
            free(len);
            if (rc < 0)
                return -1;
        }
        if (c->nlocal > 1 && comm_shm_barrier(c) < 0)
            return -1;
    }
    return 0;
}

float *comm_buffer(comm *c, size_t n)
{
    if (c->failed)
        return NULL;
    if (n > (SIZE_MAX - 8192) / sizeof(float) / (size_t)c->nlocal) {
        comm_fail(c, "comm_buffer: %zu floats is too many", n);
        return NULL;
    }
    comm_segbuf *b = comm_shm_segbuf(c, n);
    if (!b)
        return NULL;
    b->index = c->nbufs++;
    b->next = c->bufs;
    c->bufs = b;
    return b->mine;
}

const char *comm_error(const comm *c)
{
    if (!c)
        return "no communicator";
    return c->failed ? c->err : "";
}

int comm_rank(const comm *c) { return c->rank; }
int comm_size(const comm *c) { return c->size; }

void comm_free(comm *c)
{
    if (!c)
        return;
    while (c->bufs) {
        comm_segbuf *b = c->bufs;
        c->bufs = b->next;
        comm_shm_segbuf_free(b);
    }
    comm_shm_release(c);
    if (c->fd_left >= 0)
        close(c->fd_left);
    if (c->fd_right >= 0)
        close(c->fd_right);
    free(c->scratch);
    free(c->peers);
    free(c->info);
    free(c->leader);
    free(c->local);
    free(c);
}

/* ---------------------------------------------------------------- kernels */

typedef float vf16 __attribute__((vector_size(64)));

/* loads and stores as macros: a 64-byte vector as a function's argument or
 * result would tie the ABI to AVX-512 */
#define vload(p) ({ vf16 v_; memcpy(&v_, (p), sizeof v_); v_; })
#define vstore(p, v) do { vf16 w_ = (v); memcpy((p), &w_, sizeof w_); } while (0)

void comm_sum(float *const *dst, int ndst, const float *const *src, int nsrc, size_t n)
{
    size_t i = 0;
    if (nsrc == 2 && ndst <= 2) { /* two local ranks, and the ring */
        const float *a = src[0], *b = src[1];
        float *d0 = dst[0], *d1 = ndst == 2 ? dst[1] : NULL;
        for (; i + 32 <= n; i += 32) {
            vf16 v0 = vload(a + i) + vload(b + i), v1 = vload(a + i + 16) + vload(b + i + 16);
            vstore(d0 + i, v0);
            vstore(d0 + i + 16, v1);
            if (d1) {
                vstore(d1 + i, v0);
                vstore(d1 + i + 16, v1);
            }
        }
    }
    for (; i + 16 <= n; i += 16) {
        vf16 v = vload(src[0] + i);
        for (int s = 1; s < nsrc; s++)
            v += vload(src[s] + i);
        for (int d = 0; d < ndst; d++)
            vstore(dst[d] + i, v);
    }
    for (; i < n; i++) {
        float v = src[0][i];
        for (int s = 1; s < nsrc; s++)
            v += src[s][i];
        for (int d = 0; d < ndst; d++)
            dst[d][i] = v;
    }
}
