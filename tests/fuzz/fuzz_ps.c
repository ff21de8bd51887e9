/* fuzz_ps.c - libFuzzer target for the parameter server's wire protocol
 * (executor/strategy/ps.c, #included: its reader and handler are static).
 * Two ps servers of one small adam model (index 0, the batch dispatcher,
 * and index 1 of 2) keep their state across inputs, as a long-running ps
 * does. Input: one byte picking the server, then the bytes a peer sends
 * (ps_hdr messages with payloads), fed through a socketpair to the
 * server's connection loop (conn_main) until EOF. ps.options caps malloc:
 * a header alone may not make the server allocate more than its model
 * needs. docs/reliability.md, "Fuzzing". */
#include "executor/strategy/ps.c"

#include <fcntl.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static ps_server g_s[2];
static volatile sig_atomic_t g_stop_flag;
static int g_next_id = 1;

static const char SPEC[] =
    "{\"model\":{\"layers\":[{\"type\":\"dense\",\"units\":3,\"activation\":\"relu\",\"input_shape\":[2]},"
    "{\"type\":\"dense\",\"units\":2,\"activation\":\"softmax\"}]},"
    "\"compile\":{\"optimizer\":\"adam\",\"loss\":\"sparse_categorical_crossentropy\"},"
    "\"data\":{\"source\":\"synthetic\",\"features\":2},\"strategy\":{\"type\":\"parameter_server\"},"
    "\"resources\":{\"workers\":2,\"ps\":2}}";

/* As ps_serve sets a server up, without its accept loop. */
static void server_init(ps_server *s, const jobspec *spec, int index) {
    memset(s, 0, sizeof *s);
    s->index = index;
    s->n_ps = 2;
    s->stop = &g_stop_flag;
    s->epoch = -1;
    char merr[ERR_MAX];
    if (model_build(&s->m, spec, 1, spec->data.seed, merr)) {
        fprintf(stderr, "fuzz_ps: %s\n", merr);
        abort();
    }
    s->owned = shard_tensors(s->m, index, 2, s->ts, &s->nt);
    s->out_floats = s->owned * (size_t)(1 + model_slot_count(s->m)) + 1;
    s->grad_flat = xcalloc(model_param_count(s->m) + 1, sizeof(float));
    pthread_mutex_init(&s->mu, NULL);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    log_set_level((log_level)(LOG_ERROR + 1));
    jobspec spec;
    spec_error e;
    if (jobspec_parse(SPEC, sizeof SPEC - 1, &spec, &e) < 0) {
        fprintf(stderr, "fuzz_ps: spec: %s\n", e.message);
        abort();
    }
    server_init(&g_s[0], &spec, 0);
    server_init(&g_s[1], &spec, 1);
    jobspec_release(&spec);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > (1 << 20)) return 0;
    ps_server *s = &g_s[data[0] & 1];
    /* An epoch of up to 2^30 batches is allowed (OP_START: 5 GiB of state,
     * seconds under ASan per input): leave those out, or the target crawls. */
    for (size_t o = 1; o + sizeof(ps_hdr) <= size;) {
        ps_hdr h;
        memcpy(&h, data + o, sizeof h);
        if (h.magic != PS_MAGIC) break;
        if (h.op == OP_START && h.b > (1L << 16)) return -1;
        if (h.len > size) break;
        o += sizeof h + h.len;
    }
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) abort();
    int big = 4 << 20;
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    setsockopt(sv[0], SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    /* the peer's bytes, then EOF; replies pile up in sv[0] (small: a tiny model) */
    size_t off = 1;
    while (off < size) {
        ssize_t w = send(sv[0], data + off, size - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w <= 0) break; /* buffer full: the rest is lost, as with a peer that stalls */
        off += (size_t)w;
    }
    shutdown(sv[0], SHUT_WR);
    ps_conn *c = xcalloc(1, sizeof *c);
    c->s = s;
    c->fd = sv[1];
    c->id = g_next_id++;
    c->out = xcalloc(s->out_floats, sizeof(float));
    pthread_mutex_lock(&s->mu);
    s->conns++;
    pthread_mutex_unlock(&s->mu);
    conn_main(c); /* frees c, closes sv[1] */
    /* what came back must be well-formed replies */
    fcntl(sv[0], F_SETFL, O_NONBLOCK);
    for (;;) {
        ps_hdr h;
        ssize_t r = recv(sv[0], &h, sizeof h, MSG_WAITALL);
        if (r <= 0) break;
        if ((size_t)r != sizeof h || h.magic != PS_MAGIC || h.op < OP_OK || h.op > OP_END || h.len > (1u << 20))
            abort();
        char tmp[4096];
        uint64_t left = h.len;
        while (left) {
            ssize_t k = recv(sv[0], tmp, left < sizeof tmp ? left : sizeof tmp, 0);
            if (k <= 0) abort();
            left -= (uint64_t)k;
        }
    }
    close(sv[0]);
    if (s->conns != 0) abort();
    return 0;
}
