/* ring.c - the TCP ring between host leaders: leader h sends to leader
 * h+1 and receives from leader h-1 (two sockets even when they are the same
 * peer). One engine runs every operation as a plan: a list of send steps
 * and receive steps, each naming a segment of the buffer, and a gate (send
 * step s may send bytes [a, b) of its segment once receive step s+gate has
 * brought bytes [a, b) of the same segment). A reduce-scatter + all-gather
 * all-reduce is 2(R-1) such steps, an all-gather R-1, a broadcast chain one.
 *
 * Data moves in frames (16-byte header: type, length, operation sequence;
 * then at most FRAME_MAX bytes), sent and received concurrently on
 * non-blocking sockets under poll, so sending frame f+1 overlaps receiving
 * and reducing frame f. A failing rank finishes its half-sent frame with
 * zeros and sends an ABORT frame carrying its error, so the next leader
 * fails with the original cause, and so on around the ring. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "../../common/util.h"
#include "comm_int.h"

#define FRAME_MAX (256 << 10)
#define FRAME_DATA 0x41544144u  /* "DATA" */
#define FRAME_ABORT 0x54524241u /* "ABRT" */
#define NO_GATE (-1000)
#define LIVE_CHECK_MS 100

typedef struct frame_hdr {
    uint32_t type;
    uint32_t len;
    uint64_t seq;
} frame_hdr;

typedef struct plan {
    char *data;
    const size_t *off, *len; /* [R]: segment h is data + off[h], len[h] bytes */
    int nsend, nrecv;
    const int *send_seg, *recv_seg;
    int nreduce;             /* receive steps below this add floats into the segment */
    int gate;                /* NO_GATE, or send step s waits for receive step s + gate */
} plan;

static int left_rank(const comm *c) { return c->leader[(c->hidx + c->nhosts - 1) % c->nhosts]; }
static int right_rank(const comm *c) { return c->leader[(c->hidx + 1) % c->nhosts]; }

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

/* Fails c for a lost connection to rank r: "died" when its pid shows it
 * (given a moment to be reaped into a zombie), else what the socket said. */
static int lost(comm *c, int r, const char *how)
{
    for (int i = 0; i < 15 && comm_peer_local(c, r); i++) {
        if (comm_peer_dead(c, r))
            return comm_fail(c, "rank %d (pid %lld) died", r, (long long)c->info[r].pid);
        sleep_ms(20);
    }
    char name[COMM_ADDR_MAX + 64];
    comm_peer_name(c, r, name, sizeof name);
    return comm_fail(c, "connection to %s lost: %s", name, how);
}

void comm_ring_abort(comm *c, const char *msg)
{
    if (c->fd_right < 0)
        return;
    int64_t deadline = mono_ms() + 300;
    static const char zeros[4096];
    if (c->tx_active) {
        if (c->tx_hdr_sent < sizeof c->tx_hdr &&
            comm_net_write_all(c->fd_right, c->tx_hdr + c->tx_hdr_sent, sizeof c->tx_hdr - c->tx_hdr_sent, deadline) < 0)
            return;
        while (c->tx_pay_left > 0) {
            size_t n = c->tx_pay_left < sizeof zeros ? c->tx_pay_left : sizeof zeros;
            if (comm_net_write_all(c->fd_right, zeros, n, deadline) < 0)
                return;
            c->tx_pay_left -= n;
        }
        c->tx_active = 0;
    }
    size_t len = strnlen(msg, ERR_MAX - 1) + 1;
    frame_hdr h = {.type = FRAME_ABORT, .len = (uint32_t)len, .seq = c->ring_seq};
    if (comm_net_write_all(c->fd_right, &h, sizeof h, deadline) == 0)
        (void)comm_net_write_all(c->fd_right, msg, len, deadline);
}

/* The receive half of an ABORT frame: read its message and fail with it. */
static int got_abort(comm *c, const frame_hdr *h)
{
    char msg[ERR_MAX];
    if (h->len == 0 || h->len > sizeof msg ||
        comm_net_read_all(c->fd_left, msg, h->len, mono_ms() + 1000) < 0)
        return lost(c, left_rank(c), "it aborted");
    msg[h->len - 1] = '\0';
    return comm_fail(c, "%s", msg);
}

static int ring_run(comm *c, const plan *p)
{
    uint64_t seq = ++c->ring_seq;
    int L = c->fd_left, Rt = c->fd_right;
    /* send side: next frame at step ss, offset soff; the frame in flight */
    int ss = 0;
    size_t soff = 0, sflen = 0, spay_sent = 0;
    char *spay = NULL;
    /* receive side: step rs, bytes done roff; the frame being read */
    int rs = 0;
    size_t roff = 0, rflen = 0, rpay_got = 0, rhdr_got = 0;
    frame_hdr rh;
    char *rdst = NULL;
    if (p->nreduce > 0 && !c->scratch) {
        c->scratch = xmalloc(FRAME_MAX);
        c->scratch_len = FRAME_MAX;
    }
    c->tx_active = 0;
    int64_t last = mono_ms(), next_live = last + LIVE_CHECK_MS;
    int tx_err = 0;     /* the right neighbour's socket failed: */
    int64_t tx_err_at = 0; /* when; an abort frame may still come from the left */
    for (;;) {
        int moved = 0, want_out = 0;
        /* ---- send */
        while (!tx_err) {
            if (!c->tx_active) {
                while (ss < p->nsend && soff == p->len[p->send_seg[ss]])
                    ss++, soff = 0;
                if (ss >= p->nsend)
                    break;
                size_t seglen = p->len[p->send_seg[ss]];
                sflen = seglen - soff < FRAME_MAX ? seglen - soff : FRAME_MAX;
                if (p->gate != NO_GATE) {
                    int g = ss + p->gate;
                    if (g >= 0 && g < p->nrecv && !(rs > g || (rs == g && roff >= soff + sflen)))
                        break; /* its data has not arrived yet */
                }
                frame_hdr h = {.type = FRAME_DATA, .len = (uint32_t)sflen, .seq = seq};
                memcpy(c->tx_hdr, &h, sizeof h);
                c->tx_hdr_sent = 0;
                c->tx_pay_left = sflen;
                c->tx_active = 1;
                spay = p->data + p->off[p->send_seg[ss]] + soff;
                spay_sent = 0;
            }
            struct iovec iov[2];
            int niov = 0;
            if (c->tx_hdr_sent < sizeof c->tx_hdr)
                iov[niov++] = (struct iovec){c->tx_hdr + c->tx_hdr_sent, sizeof c->tx_hdr - c->tx_hdr_sent};
            if (c->tx_pay_left > 0)
                iov[niov++] = (struct iovec){spay + spay_sent, c->tx_pay_left};
            struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
            ssize_t w = sendmsg(Rt, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (w < 0) {
                if (errno == EINTR)
                    continue;
                if (errno == EAGAIN || errno == EWOULDBLOCK) {
                    want_out = 1;
                    break;
                }
                c->tx_active = 0; /* nothing more can go out */
                tx_err = errno;
                tx_err_at = mono_ms();
                break;
            }
            size_t n = (size_t)w;
            moved = 1;
            if (c->tx_hdr_sent < sizeof c->tx_hdr) {
                size_t k = sizeof c->tx_hdr - c->tx_hdr_sent;
                k = n < k ? n : k;
                c->tx_hdr_sent += k;
                n -= k;
            }
            spay_sent += n;
            c->tx_pay_left -= n;
            if (c->tx_hdr_sent == sizeof c->tx_hdr && c->tx_pay_left == 0) {
                c->tx_active = 0;
                soff += sflen;
            }
        }
        /* ---- receive */
        while (rs < p->nrecv) {
            if (rhdr_got == 0 && roff == p->len[p->recv_seg[rs]]) {
                rs++, roff = 0;
                continue;
            }
            ssize_t r;
            if (rhdr_got < sizeof rh)
                r = recv(L, (char *)&rh + rhdr_got, sizeof rh - rhdr_got, MSG_DONTWAIT);
            else
                r = recv(L, rdst + rpay_got, rflen - rpay_got, MSG_DONTWAIT);
            if (r < 0) {
                if (errno == EINTR)
                    continue;
                if (errno == EAGAIN || errno == EWOULDBLOCK)
                    break;
                return tx_err ? lost(c, right_rank(c), strerror(tx_err)) : lost(c, left_rank(c), strerror(errno));
            }
            if (r == 0)
                return tx_err ? lost(c, right_rank(c), strerror(tx_err))
                              : lost(c, left_rank(c), "it closed the connection");
            moved = 1;
            if (rhdr_got < sizeof rh) {
                rhdr_got += (size_t)r;
                if (rhdr_got < sizeof rh)
                    continue;
                if (rh.type == FRAME_ABORT)
                    return got_abort(c, &rh);
                size_t seglen = p->len[p->recv_seg[rs]];
                rflen = seglen - roff < FRAME_MAX ? seglen - roff : FRAME_MAX;
                if (rh.type != FRAME_DATA || rh.seq != seq || rh.len != rflen) {
                    int lr = left_rank(c);
                    return comm_fail(c, "rank %d sent frame %llu of %u bytes, expected frame %llu of %zu: "
                                        "the ranks called different collectives or sizes",
                                     lr, (unsigned long long)rh.seq, rh.len, (unsigned long long)seq, rflen);
                }
                rpay_got = 0;
                rdst = rs < p->nreduce ? (char *)c->scratch : p->data + p->off[p->recv_seg[rs]] + roff;
                continue;
            }
            rpay_got += (size_t)r;
            if (rpay_got < rflen)
                continue;
            if (rs < p->nreduce) {
                float *d = (float *)(p->data + p->off[p->recv_seg[rs]] + roff);
                const float *src[2] = {c->scratch, d};
                comm_sum(&d, 1, src, 2, rflen / sizeof(float));
            }
            roff += rflen;
            rhdr_got = 0;
        }
        if (ss >= p->nsend && !c->tx_active && rs >= p->nrecv)
            break;
        int64_t now = mono_ms();
        if (tx_err && (rs >= p->nrecv || now - tx_err_at >= 300))
            return lost(c, right_rank(c), strerror(tx_err));
        if (moved) {
            last = now;
            comm_shm_beat(c);
            continue;
        }
        if (now - last >= c->timeout_ms) {
            char name[COMM_ADDR_MAX + 64];
            int r = rs < p->nrecv ? left_rank(c) : right_rank(c);
            comm_peer_name(c, r, name, sizeof name);
            return comm_fail(c, "%s was silent for %d ms (%s)", name, c->timeout_ms,
                             rs < p->nrecv ? "nothing received" : "it does not read");
        }
        if (now >= next_live) {
            next_live = now + LIVE_CHECK_MS;
            /* a neighbour that is done with us may have exited: only one we
             * still need counts */
            if (rs < p->nrecv && comm_peer_dead(c, left_rank(c)))
                return lost(c, left_rank(c), "it died");
            if ((ss < p->nsend || c->tx_active) && comm_peer_dead(c, right_rank(c)))
                return lost(c, right_rank(c), "it died");
            if (c->shm)
                comm_shm_beat(c); /* waiting on the network is progress for the host */
        }
        struct pollfd pf[2];
        int np = 0;
        if (rs < p->nrecv)
            pf[np++] = (struct pollfd){.fd = L, .events = POLLIN};
        if (want_out)
            pf[np++] = (struct pollfd){.fd = Rt, .events = POLLOUT};
        if (np == 0) /* cannot happen: a gated send waits on a receive */
            return comm_fail(c, "ring: stalled (internal error)");
        int pr = poll(pf, (nfds_t)np, tx_err ? 20 : LIVE_CHECK_MS);
        if (pr < 0 && errno != EINTR)
            return comm_fail(c, "poll: %s", strerror(errno));
    }
    return 0;
}

int comm_ring_allreduce(comm *c, float *data, size_t n)
{
    int R = c->nhosts, p = c->hidx, S = 2 * (R - 1);
    size_t *off = xcalloc((size_t)R, sizeof *off), *len = xcalloc((size_t)R, sizeof *len);
    int *sseg = xcalloc((size_t)S, sizeof *sseg), *rseg = xcalloc((size_t)S, sizeof *rseg);
    size_t blocks = (n + 15) / 16;
    for (int h = 0; h < R; h++) {
        size_t a = blocks * (size_t)h / (size_t)R * 16, b = blocks * (size_t)(h + 1) / (size_t)R * 16;
        a = a < n ? a : n;
        b = b < n ? b : n;
        off[h] = a * sizeof(float);
        len[h] = (b - a) * sizeof(float);
    }
    for (int s = 0; s < S; s++) {
        sseg[s] = ((p - s) % R + R) % R;
        rseg[s] = ((p - s - 1) % R + R) % R;
    }
    plan pl = {.data = (char *)data, .off = off, .len = len, .nsend = S, .nrecv = S,
               .send_seg = sseg, .recv_seg = rseg, .nreduce = R - 1, .gate = -1};
    int rc = ring_run(c, &pl);
    free(off);
    free(len);
    free(sseg);
    free(rseg);
    return rc;
}

int comm_ring_allgather(comm *c, void *data, const size_t *seg_off, const size_t *seg_len)
{
    int R = c->nhosts, p = c->hidx, S = R - 1;
    int *sseg = xcalloc((size_t)S, sizeof *sseg), *rseg = xcalloc((size_t)S, sizeof *rseg);
    for (int s = 0; s < S; s++) {
        sseg[s] = ((p - s) % R + R) % R;
        rseg[s] = ((p - s - 1) % R + R) % R;
    }
    plan pl = {.data = data, .off = seg_off, .len = seg_len, .nsend = S, .nrecv = S,
               .send_seg = sseg, .recv_seg = rseg, .nreduce = 0, .gate = -1};
    int rc = ring_run(c, &pl);
    free(sseg);
    free(rseg);
    return rc;
}

int comm_ring_bcast(comm *c, void *data, size_t bytes, int root_host)
{
    int R = c->nhosts, d = (c->hidx - root_host + R) % R, seg = 0;
    size_t off = 0;
    plan pl = {.data = data, .off = &off, .len = &bytes, .nsend = d < R - 1 ? 1 : 0, .nrecv = d > 0 ? 1 : 0,
               .send_seg = &seg, .recv_seg = &seg, .nreduce = 0, .gate = d > 0 ? 0 : NO_GATE};
    return ring_run(c, &pl);
}
