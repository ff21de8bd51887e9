/* ps.c - ParameterServerStrategy (see ps.h): the ps server (a thread per
 * connection over one locked shard and, on ps 0, the batch dispatcher) and
 * the worker loop (NEXT -> PULL -> compute -> PUSH; the chief also runs the
 * epochs). */
#include "ps.h"

#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../../common/util.h"
#include "../data/dataset.h"
#include "../nn/checkpoint.h"
#include "train_types.h"

#define PS_MAGIC 0x53505954u    /* "TYPS" */
#define PS_IO_TIMEOUT_MS 60000   /* a peer silent this long in the middle of a message */
#define PS_CONNECT_MS 120000     /* how long a worker keeps trying to reach a ps */
#define PS_PROOF_MS 5000         /* a connection proves the secret within this, or is dropped */
#define PS_MAX_CONN 256
#define PS_PAYLOAD_MAX (1UL << 31)

enum ps_op {
    OP_HELLO = 1,   /* a = worker index -> a = owned floats, b = initialized */
    OP_INIT,        /* a = iterations, payload params + slots (full) -> ok */
    OP_PULL,        /* -> a = iterations, payload owned params */
    OP_PUSH,        /* a = epoch, b = batch (-1: none), payload owned grads [+ 3 doubles stats on ps 0] */
    OP_STATE,       /* -> a = iterations, payload owned params + owned slots */
    OP_NEXT,        /* ps 0: -> OP_BATCH a = epoch b = batch | OP_WAIT | OP_END */
    OP_EPOCH,       /* ps 0: -> a = epoch, b = complete, payload 3 doubles (loss_sum, correct, n) */
    OP_START,       /* ps 0: a = epoch, b = batches in it */
    OP_FINISH,      /* the chief: the job is over */
    OP_OK = 100,
    OP_ERR,
    OP_BATCH,
    OP_WAIT,
    OP_END
};

typedef struct ps_hdr {
    uint32_t magic, op;
    int64_t a, b;
    uint64_t len;
} ps_hdr;

/* ================================================================ sockets */

/* Waits until fd is ready for (events); 0, or -1 on timeout / error. */
static int wait_fd(int fd, short events, int timeout_ms)
{
    struct pollfd p = {.fd = fd, .events = events};
    for (;;) {
        int r = poll(&p, 1, timeout_ms);
        if (r > 0)
            return 0;
        if (r == 0)
            return -1;
        if (errno != EINTR)
            return -1;
    }
}

/* All of len bytes, each wait for the socket at most PS_IO_TIMEOUT_MS, and
 * (end > 0) the whole by mono_ms end. 0, or -1. */
static int io_until(int fd, void *data, size_t len, int writing, int64_t end)
{
    char *p = data;
    while (len) {
        int64_t wait = PS_IO_TIMEOUT_MS;
        if (end > 0 && end - mono_ms() < wait)
            wait = end - mono_ms();
        if (wait <= 0 || wait_fd(fd, writing ? POLLOUT : POLLIN, (int)wait) < 0)
            return -1;
        ssize_t n = writing ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, 0);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static int io_all(int fd, void *data, size_t len, int writing) { return io_until(fd, data, len, writing, 0); }

/* the proof is short, and a stranger is not waited for long */
static int io_proof(int fd, void *data, size_t len, int writing)
{
    return io_until(fd, data, len, writing, mono_ms() + PS_PROOF_MS);
}

/* HMAC-SHA256(secret, label | a | b) */
static int ps_proof(const unsigned char *secret, const char *label, const void *a, size_t alen, const void *b,
                    size_t blen, unsigned char out[32])
{
    const void *part[3] = {label, a, b};
    size_t len[3] = {strlen(label), alen, blen};
    return hmac_sha256(secret, 32, 3, part, len, out);
}

/* The ps's side: a challenge, the worker's answer checked before any
 * message is read, then its own proof. 0, or -1 (drop the connection). */
static int proof_serve(int fd, const unsigned char *secret)
{
    unsigned char chal[16], ans[48], want[32], mine[32];
    if (getrandom(chal, sizeof chal, 0) != (ssize_t)sizeof chal || io_proof(fd, chal, sizeof chal, 1) < 0 ||
        io_proof(fd, ans, sizeof ans, 0) < 0)
        return -1;
    if (ps_proof(secret, "trainyard-ps-worker", chal, sizeof chal, ans + 32, 16, want) < 0 ||
        !mem_equal_ct(want, ans, 32))
        return -1;
    if (ps_proof(secret, "trainyard-ps-server", ans + 32, 16, NULL, 0, mine) < 0)
        return -1;
    return io_proof(fd, mine, sizeof mine, 1);
}

/* The worker's side. 0, or -1 (the ps did not prove the secret, or went away). */
static int proof_dial(int fd, const unsigned char *secret)
{
    unsigned char chal[16], ans[48], want[32], got[32];
    if (io_proof(fd, chal, sizeof chal, 0) < 0 || getrandom(ans + 32, 16, 0) != 16 ||
        ps_proof(secret, "trainyard-ps-worker", chal, sizeof chal, ans + 32, 16, ans) < 0 ||
        io_proof(fd, ans, sizeof ans, 1) < 0 || io_proof(fd, got, sizeof got, 0) < 0 ||
        ps_proof(secret, "trainyard-ps-server", ans + 32, 16, NULL, 0, want) < 0)
        return -1;
    return mem_equal_ct(want, got, 32) ? 0 : -1;
}

static int send_msg(int fd, uint32_t op, int64_t a, int64_t b, const void *p1, size_t l1, const void *p2,
                    size_t l2)
{
    ps_hdr h = {PS_MAGIC, op, a, b, l1 + l2};
    if (io_all(fd, &h, sizeof h, 1))
        return -1;
    if (l1 && io_all(fd, (void *)p1, l1, 1))
        return -1;
    if (l2 && io_all(fd, (void *)p2, l2, 1))
        return -1;
    return 0;
}

static int recv_hdr(int fd, ps_hdr *h)
{
    if (io_all(fd, h, sizeof *h, 0) || h->magic != PS_MAGIC || h->len > PS_PAYLOAD_MAX)
        return -1;
    return 0;
}

static void tune(int fd)
{
    int one = 1, bytes = 4 << 20;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
}

static int dial(const ps_addr *a, int timeout_ms, volatile sig_atomic_t *stop)
{
    char port[16];
    snprintf(port, sizeof port, "%d", a->port);
    int64_t end = mono_ms() + timeout_ms;
    while (!(stop && *stop)) {
        struct addrinfo hints, *res = NULL;
        memset(&hints, 0, sizeof hints);
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        if (getaddrinfo(a->host, port, &hints, &res) == 0) {
            for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
                int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
                if (fd < 0)
                    continue;
                if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
                    freeaddrinfo(res);
                    tune(fd);
                    return fd;
                }
                close(fd);
            }
            freeaddrinfo(res);
        }
        if (mono_ms() > end)
            break;
        struct timespec ts = {0, 100 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return -1;
}

/* ================================================================ shards */

/* owner[t] for every tensor: largest first onto the least loaded shard, ties
 * by index (the same on every task: it depends on the shapes alone). */
static void shard_owners(const model *m, int n_ps, int owner[MODEL_MAX_TENSORS])
{
    int n = model_tensor_count(m);
    int order[MODEL_MAX_TENSORS];
    for (int i = 0; i < n; i++)
        order[i] = i;
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0; j--) {
            size_t a = model_tensor_at(m, order[j - 1])->size, b = model_tensor_at(m, order[j])->size;
            if (b > a || (b == a && order[j] < order[j - 1])) {
                int x = order[j];
                order[j] = order[j - 1];
                order[j - 1] = x;
            } else {
                break;
            }
        }
    size_t load[PS_MAX] = {0};
    for (int i = 0; i < n; i++) {
        int best = 0;
        for (int p = 1; p < n_ps && p < PS_MAX; p++)
            if (load[p] < load[best])
                best = p;
        load[best] += model_tensor_at(m, order[i])->size;
        owner[order[i]] = best;
    }
}

int ps_shard_of(const model *m, int t, int n_ps)
{
    if (n_ps <= 1 || t < 0 || t >= model_tensor_count(m))
        return 0;
    int owner[MODEL_MAX_TENSORS];
    shard_owners(m, n_ps, owner);
    return owner[t];
}

/* The tensors shard p owns, in tensor order; returns their float count. */
static size_t shard_tensors(const model *m, int p, int n_ps, int *ts, int *nt)
{
    int owner[MODEL_MAX_TENSORS];
    shard_owners(m, n_ps > 1 ? n_ps : 1, owner);
    size_t total = 0;
    *nt = 0;
    for (int t = 0; t < model_tensor_count(m); t++)
        if (owner[t] == p) {
            ts[(*nt)++] = t;
            total += model_tensor_at(m, t)->size;
        }
    return total;
}

/* Gathers src's owned tensors (a flat-layout buffer) into dst, or scatters back. */
static void gather(const model *m, const int *ts, int nt, const float *src, float *dst)
{
    for (int i = 0; i < nt; i++) {
        const model_tensor *t = model_tensor_at(m, ts[i]);
        memcpy(dst, src + t->offset, t->size * sizeof(float));
        dst += t->size;
    }
}

static void scatter(const model *m, const int *ts, int nt, const float *src, float *dst)
{
    for (int i = 0; i < nt; i++) {
        const model_tensor *t = model_tensor_at(m, ts[i]);
        memcpy(dst + t->offset, src, t->size * sizeof(float));
        src += t->size;
    }
}

/* ================================================================ server */

typedef struct ps_server {
    model *m;
    int index, n_ps;
    int ts[MODEL_MAX_TENSORS], nt;
    size_t owned;                /* floats in the shard */
    size_t out_floats;           /* owned * (1 + slots): a connection's reply buffer */
    float *grad_flat;            /* (n_params) a push scattered into the flat layout */
    pthread_mutex_t mu;
    int initialized;
    int finished;
    volatile sig_atomic_t *stop;
    /* ps 0: the dispatcher */
    int epoch;                   /* -1: none started */
    long n_batches, next_free;
    unsigned char *state;        /* (n_batches) 0 to do, 1 out, 2 done */
    int *holder;                 /* (n_batches) connection holding it */
    long done;
    double loss_sum, correct, seen;
    int conns;
    int has_secret;              /* connections prove the attempt's secret first */
    unsigned char secret[32];
} ps_server;

typedef struct ps_conn {
    ps_server *s;
    int fd, id;
    float *out;                  /* (owned * (1 + slots)) this connection's reply payload */
} ps_conn;

/* A reply, built under the server's lock and sent after it is released (a
 * slow reader never holds up the other workers). */
typedef struct ps_reply {
    uint32_t op;
    int64_t a, b;
    const void *data;            /* NULL or the connection's own buffer / a constant */
    size_t len;
    double stats[3];
} ps_reply;

static void reply(ps_reply *r, uint32_t op, int64_t a, int64_t b)
{
    r->op = op;
    r->a = a;
    r->b = b;
    r->data = NULL;
    r->len = 0;
}

static void reply_err(ps_reply *r, const char *msg /* a constant */)
{
    reply(r, OP_ERR, 0, 0);
    r->data = msg;
    r->len = strlen(msg);
}

/* Hands batches back that a closed connection held. */
static void release_batches(ps_server *s, int conn)
{
    if (!s->state)
        return;
    for (long i = 0; i < s->n_batches; i++)
        if (s->state[i] == 1 && s->holder[i] == conn) {
            s->state[i] = 0;
            if (i < s->next_free)
                s->next_free = i;
        }
}

static int handle(ps_conn *c, const ps_hdr *h, const float *payload)
{
    ps_server *s = c->s;
    model *m = s->m;
    size_t np = model_param_count(m);
    int slots = model_slot_count(m);
    int rc = 0;
    ps_reply r;
    reply(&r, OP_OK, 0, 0);
    pthread_mutex_lock(&s->mu);
    switch (h->op) {
    case OP_HELLO:
        reply(&r, OP_OK, (int64_t)s->owned, s->initialized);
        break;
    case OP_INIT:
        if (h->len != sizeof(float) * np * (size_t)(1 + slots)) {
            reply_err(&r, "INIT: wrong size");
            break;
        }
        memcpy(model_params(m), payload, np * sizeof(float));
        if (slots)
            memcpy(model_slots(m), payload + np, np * (size_t)slots * sizeof(float));
        model_set_iterations(m, (long)h->a);
        s->initialized = 1;
        reply(&r, OP_OK, 0, 0);
        break;
    case OP_PULL:
        if (!s->initialized) {
            reply_err(&r, "not initialized yet");
            break;
        }
        gather(m, s->ts, s->nt, model_params(m), c->out);
        reply(&r, OP_OK, model_iterations(m), 0);
        r.data = c->out;
        r.len = s->owned * sizeof(float);
        break;
    case OP_STATE: {
        gather(m, s->ts, s->nt, model_params(m), c->out);
        for (int k = 0; k < slots; k++)
            gather(m, s->ts, s->nt, model_slots(m) + (size_t)k * np, c->out + s->owned * (size_t)(1 + k));
        reply(&r, OP_OK, model_iterations(m), 0);
        r.data = c->out;
        r.len = s->owned * (size_t)(1 + slots) * sizeof(float);
        break;
    }
    case OP_PUSH: {
        size_t want = s->owned * sizeof(float) + (s->index == 0 ? 3 * sizeof(double) : 0);
        if (!s->initialized || h->len != want) {
            reply_err(&r, !s->initialized ? "not initialized yet" : "PUSH: wrong size");
            break;
        }
        scatter(m, s->ts, s->nt, payload, s->grad_flat);
        for (int i = 0; i < s->nt; i++) {
            const model_tensor *t = model_tensor_at(m, s->ts[i]);
            model_apply_range(m, s->grad_flat, t->offset, t->offset + t->size);
        }
        model_set_iterations(m, model_iterations(m) + 1);
        if (s->index == 0 && h->b >= 0 && h->a == s->epoch && h->b < s->n_batches && s->state[h->b] != 2) {
            double st[3];
            memcpy(st, (const char *)payload + s->owned * sizeof(float), sizeof st);
            s->state[h->b] = 2;
            s->done++;
            s->loss_sum += st[0];
            s->correct += st[1];
            s->seen += st[2];
        }
        reply(&r, OP_OK, model_iterations(m), 0);
        break;
    }
    case OP_NEXT:
        if (s->finished) {
            reply(&r, OP_END, 0, 0);
        } else if (s->epoch < 0 || !s->state) {
            reply(&r, OP_WAIT, 0, 0);
        } else {
            while (s->next_free < s->n_batches && s->state[s->next_free] != 0)
                s->next_free++;
            if (s->next_free >= s->n_batches) {
                reply(&r, OP_WAIT, 0, 0);
            } else {
                long b = s->next_free++;
                s->state[b] = 1;
                s->holder[b] = c->id;
                reply(&r, OP_BATCH, s->epoch, b);
            }
        }
        break;
    case OP_EPOCH: {
        reply(&r, OP_OK, s->epoch, s->state && s->done >= s->n_batches);
        r.stats[0] = s->loss_sum;
        r.stats[1] = s->correct;
        r.stats[2] = s->seen;
        r.data = r.stats;
        r.len = sizeof r.stats;
        break;
    }
    case OP_START:
        if (h->b <= 0 || h->b > (1L << 30)) {
            reply_err(&r, "START: bad batch count");
            break;
        }
        free(s->state);
        free(s->holder);
        s->n_batches = h->b;
        s->state = xcalloc((size_t)h->b, 1);
        s->holder = xcalloc((size_t)h->b, sizeof(int));
        s->next_free = 0;
        s->done = 0;
        s->loss_sum = s->correct = s->seen = 0.0;
        s->epoch = (int)h->a;
        reply(&r, OP_OK, 0, 0);
        break;
    case OP_FINISH:
        s->finished = 1;
        reply(&r, OP_OK, 0, 0);
        break;
    default:
        rc = -1;
    }
    pthread_mutex_unlock(&s->mu);
    if (rc)
        return rc;
    return send_msg(c->fd, r.op, r.a, r.b, r.data, r.len, NULL, 0);
}

static void *conn_main(void *arg)
{
    ps_conn *c = arg;
    ps_server *s = c->s;
    float *payload = NULL;
    size_t cap = 0;
    /* the largest message a peer may send: INIT (params + slots) or PUSH
     * (a shard + 3 doubles); a header claiming more is refused before any
     * allocation (tests/fuzz/fuzz_ps: 2 GiB allocated for a 32-byte header) */
    size_t max_len = model_param_count(s->m) * (size_t)(1 + model_slot_count(s->m)) * sizeof(float) +
                     3 * sizeof(double);
    /* a stranger is dropped before it can say anything */
    int proven = !s->has_secret || proof_serve(c->fd, s->secret) == 0;
    if (!proven)
        log_warn("ps %d: a connection did not prove this job's secret: dropped", s->index);
    for (; proven;) {
        ps_hdr h;
        /* idle workers wait long between messages: poll in slices, watch stop */
        int ready = 0;
        while (!ready && !*s->stop) {
            struct pollfd p = {.fd = c->fd, .events = POLLIN};
            int r = poll(&p, 1, 200);
            if (r > 0)
                ready = 1;
            else if (r < 0 && errno != EINTR)
                break;
        }
        if (!ready || recv_hdr(c->fd, &h))
            break;
        if (h.len > max_len) {
            static const char too_large[] = "message larger than any this ps takes";
            send_msg(c->fd, OP_ERR, 0, 0, too_large, sizeof too_large - 1, NULL, 0);
            break;
        }
        if (h.len > cap) {
            float *np = realloc(payload, h.len);
            if (!np)
                break;
            payload = np;
            cap = h.len;
        }
        if (h.len && io_all(c->fd, payload, h.len, 0))
            break;
        if (handle(c, &h, payload))
            break;
    }
    pthread_mutex_lock(&s->mu);
    release_batches(s, c->id);
    s->conns--;
    pthread_mutex_unlock(&s->mu);
    free(payload);
    close(c->fd);
    free(c->out);
    free(c);
    return NULL;
}

int ps_serve(const jobspec *spec, int index, int n_ps, int listen_fd, const unsigned char *secret,
             volatile sig_atomic_t *stop, char err[ERR_MAX])
{
    ps_server s;
    memset(&s, 0, sizeof s);
    if (secret) {
        memcpy(s.secret, secret, sizeof s.secret);
        s.has_secret = 1;
    }
    s.index = index;
    s.n_ps = n_ps;
    s.stop = stop;
    s.epoch = -1;
    if (model_build(&s.m, spec, 1, spec->data.seed, err)) {
        close(listen_fd);
        return -1;
    }
    s.owned = shard_tensors(s.m, index, n_ps, s.ts, &s.nt);
    s.out_floats = s.owned * (size_t)(1 + model_slot_count(s.m)) + 1;
    s.grad_flat = xcalloc(model_param_count(s.m) + 1, sizeof(float));
    pthread_mutex_init(&s.mu, NULL);
    log_info("ps %d of %d: %d tensor(s), %zu floats; listening", index, n_ps, s.nt, s.owned);
    int next_id = 1, ret = 0;
    int64_t finished_at = 0;
    while (!*stop) {
        pthread_mutex_lock(&s.mu);
        int finished = s.finished, conns = s.conns;
        pthread_mutex_unlock(&s.mu);
        if (finished) {
            /* let the workers hear END, then go */
            if (!finished_at)
                finished_at = mono_ms();
            if (conns == 0 || mono_ms() - finished_at > 10000)
                break;
        }
        struct pollfd p = {.fd = listen_fd, .events = POLLIN};
        int r = poll(&p, 1, 200);
        if (r <= 0)
            continue;
        int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        tune(fd);
        ps_conn *c = xcalloc(1, sizeof *c);
        c->s = &s;
        c->fd = fd;
        c->id = next_id++;
        c->out = xcalloc(s.out_floats, sizeof(float));
        pthread_mutex_lock(&s.mu);
        s.conns++;
        pthread_mutex_unlock(&s.mu);
        pthread_t t;
        if (pthread_create(&t, NULL, conn_main, c) != 0) {
            pthread_mutex_lock(&s.mu);
            s.conns--;
            pthread_mutex_unlock(&s.mu);
            close(fd);
            free(c->out);
            free(c);
            continue;
        }
        pthread_detach(t);
    }
    close(listen_fd);
    if (*stop)
        ret = 1;
    /* the connection threads see stop or their peers close; wait for them */
    for (int i = 0; i < 100; i++) {
        pthread_mutex_lock(&s.mu);
        int conns = s.conns;
        pthread_mutex_unlock(&s.mu);
        if (!conns)
            break;
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
    pthread_mutex_lock(&s.mu);
    int left = s.conns;
    pthread_mutex_unlock(&s.mu);
    if (left == 0) {
        /* only when no thread can touch them any more */
        pthread_mutex_destroy(&s.mu);
        free(s.state);
        free(s.holder);
        free(s.grad_flat);
        model_free(s.m);
    }
    return ret;
}

/* ================================================================ worker */

typedef struct ps_client {
    int n;
    int fd[PS_MAX];
    int ts[PS_MAX][MODEL_MAX_TENSORS], nt[PS_MAX];
    size_t owned[PS_MAX];
    float *buf;                  /* the largest shard's (params + slots) */
    const ps_addr *addr;
} ps_client;

static int client_fail(char err[ERR_MAX], const ps_client *c, int p, const char *what)
{
    snprintf(err, ERR_MAX, "ps %d (%.80s:%d): %.150s", p, c->addr[p].host, c->addr[p].port, what);
    return -1;
}

/* One request/reply with ps p; the reply's payload (up to cap bytes) in out. */
static int call(ps_client *c, int p, uint32_t op, int64_t a, int64_t b, const void *p1, size_t l1,
                const void *p2, size_t l2, ps_hdr *rh, void *out, size_t cap, char err[ERR_MAX])
{
    if (send_msg(c->fd[p], op, a, b, p1, l1, p2, l2) || recv_hdr(c->fd[p], rh))
        return client_fail(err, c, p, "connection lost");
    if (rh->len > cap) {
        if (rh->op == OP_ERR && rh->len < 512) {
            char msg[512];
            if (io_all(c->fd[p], msg, rh->len, 0) == 0) {
                msg[rh->len] = 0;
                return client_fail(err, c, p, msg);
            }
        }
        return client_fail(err, c, p, "reply too large");
    }
    if (rh->len && io_all(c->fd[p], out, rh->len, 0))
        return client_fail(err, c, p, "connection lost in a reply");
    if (rh->op == OP_ERR) {
        char msg[300];
        size_t l = rh->len < sizeof msg - 1 ? rh->len : sizeof msg - 1;
        memcpy(msg, out, l);
        msg[l] = 0;
        return client_fail(err, c, p, msg);
    }
    return 0;
}

static void client_close(ps_client *c)
{
    for (int p = 0; p < c->n; p++)
        if (c->fd[p] >= 0)
            close(c->fd[p]);
    free(c->buf);
}

static int client_open(ps_client *c, const model *m, const train_options *o, volatile sig_atomic_t *stop,
                       char err[ERR_MAX])
{
    memset(c, 0, sizeof *c);
    c->n = o->n_ps;
    c->addr = o->ps;
    size_t most = 0;
    for (int p = 0; p < c->n; p++) {
        c->fd[p] = -1;
        c->owned[p] = shard_tensors(m, p, c->n, c->ts[p], &c->nt[p]);
        if (c->owned[p] > most)
            most = c->owned[p];
    }
    c->buf = xcalloc(most * (size_t)(1 + model_slot_count(m)) + 16, sizeof(float));
    for (int p = 0; p < c->n; p++) {
        c->fd[p] = dial(&c->addr[p], PS_CONNECT_MS, stop);
        if (c->fd[p] < 0)
            return client_fail(err, c, p, stop && *stop ? "stopped while connecting" : "cannot connect");
        if (o->ps_secret && proof_dial(c->fd[p], o->ps_secret) < 0)
            return client_fail(err, c, p, "did not prove this job's secret: not this job's ps");
        ps_hdr rh;
        if (call(c, p, OP_HELLO, o->worker, 0, NULL, 0, NULL, 0, &rh, c->buf, 0, err))
            return -1;
        if ((size_t)rh.a != c->owned[p])
            return client_fail(err, c, p, "holds another shard of the model (a different spec?)");
    }
    return 0;
}

/* Every ps's shard of the variables into m's parameters. */
static int pull(ps_client *c, model *m, char err[ERR_MAX])
{
    for (int p = 0; p < c->n; p++) {
        ps_hdr rh;
        if (call(c, p, OP_PULL, 0, 0, NULL, 0, NULL, 0, &rh, c->buf, c->owned[p] * sizeof(float), err))
            return -1;
        if (rh.len != c->owned[p] * sizeof(float))
            return client_fail(err, c, p, "short PULL");
        scatter(m, c->ts[p], c->nt[p], c->buf, model_params(m));
    }
    return 0;
}

/* Pushes m's gradients (ps 0 last, with the batch's stats); *it the
 * iterations ps 0 reports. */
static int push(ps_client *c, model *m, long epoch, long batch, const step_stats *st, long *it,
                char err[ERR_MAX])
{
    for (int p = c->n - 1; p >= 0; p--) {
        gather(m, c->ts[p], c->nt[p], model_grads(m), c->buf);
        double stats[3] = {st->loss_sum, (double)st->correct, (double)st->n};
        ps_hdr rh;
        if (call(c, p, OP_PUSH, epoch, batch, c->buf, c->owned[p] * sizeof(float), stats,
                 p == 0 ? sizeof stats : 0, &rh, NULL, 0, err))
            return -1;
        if (p == 0)
            *it = (long)rh.a;
    }
    return 0;
}

/* The whole state (params, slots, iterations) from every ps into m. */
static int pull_state(ps_client *c, model *m, char err[ERR_MAX])
{
    size_t np = model_param_count(m);
    int slots = model_slot_count(m);
    long it = 0;
    for (int p = 0; p < c->n; p++) {
        ps_hdr rh;
        size_t want = c->owned[p] * (size_t)(1 + slots) * sizeof(float);
        if (call(c, p, OP_STATE, 0, 0, NULL, 0, NULL, 0, &rh, c->buf, want, err))
            return -1;
        if (rh.len != want)
            return client_fail(err, c, p, "short STATE");
        scatter(m, c->ts[p], c->nt[p], c->buf, model_params(m));
        for (int k = 0; k < slots; k++)
            scatter(m, c->ts[p], c->nt[p], c->buf + c->owned[p] * (size_t)(1 + k), model_slots(m) + (size_t)k * np);
        if (p == 0)
            it = (long)rh.a;
    }
    model_set_iterations(m, it);
    return 0;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int stopped(const train_hooks *h)
{
    return h && h->stop && *h->stop;
}

/* ---------------------------------------------------------------- ps_train, by phase
 *
 * A worker of a parameter_server job: set up (model, batches, the
 * connection, the chief's resume and the ps' initial variables), then
 * epochs of asking the ps for work (a batch to compute, a wait, or the
 * end), the chief closing each epoch (metrics, validation, checkpoint),
 * then the finish (the chief's test evaluation). One ps_run holds what the
 * phases share. */

typedef struct ps_run {
    const jobspec *spec;
    const dataset_splits *data;
    const train_options *o;
    const train_hooks *hooks;
    train_result *res;
    int chief, workers, global_batch, epochs, every;
    int part;       /* one worker's part of a global batch */
    int micro;      /* micro-batches a part is computed in */
    long n_batches; /* parts an epoch */
    model *m;
    batcher b;
    int have_batcher;
    float *xb, *yb;
    ps_client c;
    int have_client;
    ckpt_meta meta;
    long start_epoch, my_steps, it;
    double train_time;
    long train_examples;
} ps_run;

/* The sizes, the model and the batches. */
static int run_setup(ps_run *r, char err[ERR_MAX])
{
    const jobspec *spec = r->spec;
    const train_options *o = r->o;
    r->chief = o->worker == 0;
    r->workers = o->workers > 0 ? o->workers : 1;
    r->global_batch = spec->fit.batch_size;
    r->epochs = o->epochs > 0 ? o->epochs : spec->fit.epochs;
    r->every = o->checkpoint_every ? o->checkpoint_every : spec->checkpoint.every_epochs;
    if (o->n_ps < 1 || o->n_ps > PS_MAX || !o->ps) {
        snprintf(err, ERR_MAX, "parameter_server needs 1 to %d ps addresses", PS_MAX);
        return -1;
    }
    const dataset *tr = &r->data->train;
    if (tr->n <= 0 || tr->features != spec->input_size) {
        snprintf(err, ERR_MAX, "the training split is empty or has %d features, the model %d", tr->features,
                 spec->input_size);
        return -1;
    }
    /* the unit of work: one worker's part of a global batch, computed in
     * `micro` micro-batches whose gradients are summed before the push */
    r->part = (r->global_batch + r->workers - 1) / r->workers;
    r->micro = o->micro_batches > 0 ? o->micro_batches
                                    : (spec->fit.gradient_accumulation_steps > 0 ? spec->fit.gradient_accumulation_steps : 1);
    r->n_batches = (tr->n + r->part - 1) / r->part;
    if (spec->fit.steps_per_epoch > 0 && spec->fit.steps_per_epoch * (long)r->workers < r->n_batches)
        r->n_batches = spec->fit.steps_per_epoch * (long)r->workers;
    if (model_build(&r->m, spec, (r->part + r->micro - 1) / r->micro, o->has_seed ? o->seed : spec->data.seed, err))
        return -1;
    if (batcher_init(&r->b, dataset_shard(tr, 0, 1), r->part, spec->data.shuffle_buffer, spec->data.seed)) {
        snprintf(err, ERR_MAX, "cannot make batches of the training data");
        return -1;
    }
    r->have_batcher = 1;
    r->xb = xmalloc(sizeof(float) * (size_t)r->part * (size_t)tr->features);
    r->yb = xmalloc(sizeof(float) * (size_t)r->part);
    snprintf(r->meta.spec_hash, sizeof r->meta.spec_hash, "%s", o->spec_hash);
    return 0;
}

/* The chief's resume, the connection to every ps, and the chief's
 * variables (fresh or resumed) as the ps' start. */
static int run_connect(ps_run *r, char err[ERR_MAX])
{
    if (r->chief && r->o->resume_path) {
        ckpt_meta rm;
        if (checkpoint_load(r->o->resume_path, r->m, &rm, err))
            return -1;
        r->start_epoch = rm.epoch; /* ps checkpoints are taken at epoch starts */
        r->it = rm.step;
    }
    r->have_client = 1; /* client_open leaves what it opened for client_close, failed or not */
    if (client_open(&r->c, r->m, r->o, r->hooks ? r->hooks->stop : NULL, err))
        return -1;
    if (!r->chief)
        return 0;
    size_t np = model_param_count(r->m);
    int slots = model_slot_count(r->m);
    size_t bytes = np * (size_t)(1 + slots) * sizeof(float);
    float *init = xmalloc(bytes);
    memcpy(init, model_params(r->m), np * sizeof(float));
    if (slots)
        memcpy(init + np, model_slots(r->m), np * (size_t)slots * sizeof(float));
    ps_hdr rh;
    int rc = 0;
    for (int p = 0; p < r->c.n && !rc; p++)
        rc = call(&r->c, p, OP_INIT, model_iterations(r->m), 0, init, bytes, NULL, 0, &rh, NULL, 0, err);
    free(init);
    if (rc)
        return -1;
    log_info("parameter servers initialised (%d ps, %d worker(s), %ld batches of %d an epoch, %d micro-batch(es) "
             "each)", r->c.n, r->workers, r->n_batches, r->part, r->micro);
    return 0;
}

static int save_checkpoint(ps_run *r, long epoch, long step, char err[ERR_MAX])
{
    r->meta.epoch = epoch;
    r->meta.step = step;
    if (checkpoint_save(r->o->checkpoint_path, r->m, &r->meta, err))
        return -1;
    if (r->hooks && r->hooks->on_checkpoint)
        r->hooks->on_checkpoint(r->hooks->ctx, r->o->checkpoint_path, &r->meta);
    return 0;
}

/* The chief, told to wait: when every batch of epoch ep is in, the epoch's
 * metrics, validation and checkpoint. 1: the epoch is closed; 0: not yet. */
static int chief_close_epoch(ps_run *r, long ep, double t0, char err[ERR_MAX])
{
    ps_hdr rh;
    double st[3];
    if (call(&r->c, 0, OP_EPOCH, 0, 0, NULL, 0, NULL, 0, &rh, st, sizeof st, err))
        return -1;
    if (rh.a != ep || !rh.b)
        return 0;
    train_epoch_metrics em;
    memset(&em, 0, sizeof em);
    em.epoch = (int)ep + 1;
    em.epochs = r->epochs;
    em.loss = st[2] > 0 ? st[0] / st[2] : 0.0;
    em.accuracy = st[2] > 0 ? st[1] / st[2] : 0.0;
    em.seconds = mono_s() - t0;
    em.samples_per_sec = em.seconds > 0 ? st[2] / em.seconds : 0.0;
    r->train_time += em.seconds;
    r->train_examples += (long)st[2];
    if (pull_state(&r->c, r->m, err))
        return -1;
    em.step = model_iterations(r->m);
    const dataset *val = &r->data->val;
    if (val->n > 0 && !r->o->no_eval) {
        em.has_val = 1;
        model_evaluate(r->m, val->x, val->y, val->n, &em.val_loss, &em.val_accuracy);
    }
    train_result_epoch(r->res, &em);
    if (r->hooks && r->hooks->on_epoch)
        r->hooks->on_epoch(r->hooks->ctx, &em);
    if (r->o->checkpoint_path && (ep + 1 == r->epochs || (r->every > 0 && (ep + 1) % r->every == 0)) &&
        save_checkpoint(r, ep + 1, em.step, err))
        return -1;
    return 1;
}

/* A batch the ps handed out (epoch bep, batch bi): computed against fresh
 * variables, its gradients pushed. *cur_epoch: the epoch the batcher is at. */
static int compute_batch(ps_run *r, long bep, long bi, long *cur_epoch, double *ep_examples, char err[ERR_MAX])
{
    if (bep != *cur_epoch) {
        batcher_reset(&r->b, bep);
        *cur_epoch = bep;
    }
    int n = batcher_copy_range(&r->b, bi * r->part, r->part, r->xb, r->yb);
    if (pull(&r->c, r->m, err))
        return -1;
    model_set_iterations(r->m, bep * r->n_batches + bi); /* dropout keys: one step per batch */
    step_stats st;
    float loss = model_forward_backward_micro(r->m, r->xb, r->yb, n, 0, r->micro, r->global_batch, &st);
    if (push(&r->c, r->m, bep, bi, &st, &r->it, err))
        return -1;
    r->my_steps++;
    *ep_examples += n;
    if (r->hooks && r->hooks->on_step) {
        train_step_info si = {.step = r->it, .epoch = (int)bep, .loss = loss * (float)r->workers, .n = n};
        r->hooks->on_step(r->hooks->ctx, &si);
    }
    return 0;
}

/* One epoch (the chief's ep; a worker follows whatever the ps hands out):
 * 1 when the ps said the training ended, 0 to go on, -1 on failure;
 * res->stopped when the stop flag was seen. */
static int run_epoch(ps_run *r, long ep, char err[ERR_MAX])
{
    ps_hdr rh;
    if (r->chief && call(&r->c, 0, OP_START, ep, r->n_batches, NULL, 0, NULL, 0, &rh, NULL, 0, err))
        return -1;
    long cur_epoch = r->chief ? ep : -1;
    double t0 = mono_s(), ep_examples = 0;
    int ended = 0;
    for (;;) {
        if (stopped(r->hooks)) {
            r->res->stopped = 1;
            break;
        }
        if (call(&r->c, 0, OP_NEXT, r->o->worker, 0, NULL, 0, NULL, 0, &rh, NULL, 0, err))
            return -1;
        if (rh.op == OP_END) {
            ended = 1;
            break;
        }
        if (rh.op == OP_WAIT) {
            if (r->chief) {
                int closed = chief_close_epoch(r, ep, t0, err);
                if (closed < 0)
                    return -1;
                if (closed)
                    break;
            }
            sleep_ms(2);
            continue;
        }
        /* OP_BATCH: compute (epoch rh.a, batch rh.b) */
        if (compute_batch(r, (long)rh.a, (long)rh.b, &cur_epoch, &ep_examples, err))
            return -1;
    }
    if (!r->chief) {
        r->train_time += mono_s() - t0;
        r->train_examples += (long)ep_examples;
    }
    return ended;
}

/* The stop flag: the chief saves the variables as the ps hold them (the
 * epoch starts over on resume). */
static int run_stopped(ps_run *r, long ep, char err[ERR_MAX])
{
    if (r->chief && r->o->checkpoint_path) {
        if (pull_state(&r->c, r->m, err))
            return -1;
        if (save_checkpoint(r, ep, model_iterations(r->m), err))
            return -1;
    }
    r->res->steps = r->chief ? model_iterations(r->m) : r->my_steps;
    return 0;
}

/* The end: the chief finishes every ps and evaluates the test split. */
static int run_finish(ps_run *r, char err[ERR_MAX])
{
    train_result *res = r->res;
    if (r->chief) {
        ps_hdr rh;
        for (int p = 0; p < r->c.n; p++)
            if (call(&r->c, p, OP_FINISH, 0, 0, NULL, 0, NULL, 0, &rh, NULL, 0, err))
                return -1;
        const dataset *test = &r->data->test;
        if (test->n > 0 && !r->o->no_eval) {
            res->has_test = 1;
            model_evaluate(r->m, test->x, test->y, test->n, &res->test_loss, &res->test_accuracy);
        }
    } else {
        res->steps = r->my_steps;
    }
    res->train_seconds = r->train_time;
    res->samples_per_sec = r->train_time > 0 ? (double)r->train_examples / r->train_time : 0.0;
    return 0;
}

int ps_train(const jobspec *spec, const dataset_splits *data, const train_options *o, const train_hooks *hooks,
             train_result *res, char err[ERR_MAX])
{
    memset(res, 0, sizeof *res);
    err[0] = 0;
    ps_run r;
    memset(&r, 0, sizeof r);
    r.spec = spec;
    r.data = data;
    r.o = o;
    r.hooks = hooks;
    r.res = res;
    int ret = -1;
    if (run_setup(&r, err) || run_connect(&r, err))
        goto out;
    for (long ep = r.start_epoch; r.chief ? ep < r.epochs : 1; ep++) {
        int ended = run_epoch(&r, ep, err);
        if (ended < 0)
            goto out;
        if (res->stopped) {
            ret = run_stopped(&r, ep, err);
            goto out;
        }
        if (ended)
            break;
    }
    ret = run_finish(&r, err);
out:
    if (r.have_client)
        client_close(&r.c);
    free(r.xb);
    free(r.yb);
    if (r.have_batcher)
        batcher_release(&r.b);
    model_free(r.m);
    return ret;
}
