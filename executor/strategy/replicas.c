/* replicas.c - the synchronous data-parallel step (see replicas.h).
 *
 * Threads: replica 0 runs on the caller's thread, replicas 1..K-1 on their
 * own, meeting at one pthread barrier between the phases of a step:
 *   [start] compute -> [B] reduce on the worker -> [C] (replica 0: stats,
 *   all-reduce across workers) -> [D] apply -> [end]
 * Nothing allocates inside a step. The reduced buffer is n_params floats of
 * gradient followed by TAIL floats of step counts, so one all-reduce carries
 * both. */
#include "replicas.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/util.h"

#define TAIL 16              /* floats after the gradients: counts and the stop flag */
#define T_LOSS 0
#define T_CORRECT 1
#define T_N 2
#define T_STOP 3
#define SEG_ALIGN 16         /* floats: ranges of the buffers start 64-byte aligned */

/* A reusable barrier whose party count can shrink (a thread that failed to
 * start), spinning briefly before it sleeps: the phases are short. */
typedef struct rbarrier {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int count, waiting;
    unsigned gen;
} rbarrier;

static void rbarrier_wait(rbarrier *b)
{
    pthread_mutex_lock(&b->mu);
    unsigned gen = b->gen;
    if (++b->waiting >= b->count) {
        b->waiting = 0;
        __atomic_store_n(&b->gen, gen + 1, __ATOMIC_RELEASE);
        pthread_cond_broadcast(&b->cv);
        pthread_mutex_unlock(&b->mu);
        return;
    }
    pthread_mutex_unlock(&b->mu);
    for (int i = 0; i < 4000; i++) {
        if (__atomic_load_n(&b->gen, __ATOMIC_ACQUIRE) != gen)
            return;
        __builtin_ia32_pause();
    }
    pthread_mutex_lock(&b->mu);
    while (b->gen == gen)
        pthread_cond_wait(&b->cv, &b->mu);
    pthread_mutex_unlock(&b->mu);
}

typedef struct replica {
    replica_set *rs;
    int index;
    model *m;
    pthread_t thread;
    int started;
    step_stats st;           /* this step's counts */
} replica;

struct replica_set {
    int k;
    int micro;               /* micro-batches per replica and step (>= 1) */
    replica_vars vars;
    replica_reduce reduce;
    comm *comm;
    size_t n;                /* parameters (floats) */
    float *sum;              /* (n + TAIL): the reduced gradients and counts */
    int sum_owned;           /* 0: comm_buffer's */
    replica r[REPLICAS_MAX];
    rbarrier bar;
    int bar_ready;
    int quit;
    int failed;              /* this step's all-reduce failed: apply nothing */
    /* the current step, set by replica 0 before [start] */
    const float *x, *y;
    int rows, features, global_batch;
    long row0;
};

/* ---------------------------------------------------------------- phases */

static void seg_range(size_t n, int i, int k, size_t *b, size_t *e)
{
    size_t blocks = (n + SEG_ALIGN - 1) / SEG_ALIGN;
    size_t per = blocks / (size_t)k, rem = blocks % (size_t)k;
    size_t b0 = (size_t)i * per + ((size_t)i < rem ? (size_t)i : rem);
    size_t b1 = b0 + per + ((size_t)i < rem ? 1 : 0);
    *b = b0 * SEG_ALIGN < n ? b0 * SEG_ALIGN : n;
    *e = b1 * SEG_ALIGN < n ? b1 * SEG_ALIGN : n;
}

static void phase_compute(replica *p)
{
    replica_set *rs = p->rs;
    int off, len;
    /* the same split as batch_replica_slice: contiguous, sizes differ by <= 1 */
    int base = rs->rows / rs->k, rem = rs->rows % rs->k;
    off = p->index * base + (p->index < rem ? p->index : rem);
    len = base + (p->index < rem ? 1 : 0);
    /* in rs->micro micro-batches, their gradients summed (1: one pass) */
    model_forward_backward_micro(p->m, rs->x + (size_t)off * (size_t)rs->features, rs->y + off, len,
                                 rs->row0 + off, rs->micro, rs->global_batch, &p->st);
}

/* sum[b, e) = replica 0's grads + replica 1's + ... in replica order, so
 * the bits do not depend on which thread adds. */
static void sum_range(replica_set *rs, size_t b, size_t e)
{
    if (b >= e)
        return;
    float *restrict s = rs->sum;
    const float *restrict g0 = model_grads(rs->r[0].m);
    if (s != g0)
        memcpy(s + b, g0 + b, sizeof(float) * (e - b));
    for (int i = 1; i < rs->k; i++) {
        const float *restrict g = model_grads(rs->r[i].m);
        for (size_t j = b; j < e; j++)
            s[j] += g[j];
    }
}

static void phase_reduce(replica *p)
{
    replica_set *rs = p->rs;
    if (rs->k == 1)
        return; /* the model wrote its gradients into rs->sum */
    if (rs->reduce == REPLICA_REDUCE_ONE) {
        if (p->index == 0)
            sum_range(rs, 0, rs->n);
        return;
    }
    size_t b, e;
    seg_range(rs->n, p->index, rs->k, &b, &e);
    sum_range(rs, b, e);
}

static void phase_apply(replica *p)
{
    replica_set *rs = p->rs;
    if (rs->vars == REPLICA_VARS_MIRRORED) {
        model_apply_range(p->m, rs->sum, 0, rs->n);
    } else {
        size_t b, e;
        seg_range(rs->n, p->index, rs->k, &b, &e);
        model_apply_range(rs->r[0].m, rs->sum, b, e);
    }
}

static void *replica_main(void *arg)
{
    replica *p = arg;
    replica_set *rs = p->rs;
    for (;;) {
        rbarrier_wait(&rs->bar); /* start */
        if (rs->quit)
            break;
        phase_compute(p);
        rbarrier_wait(&rs->bar); /* B */
        phase_reduce(p);
        rbarrier_wait(&rs->bar); /* C */
        rbarrier_wait(&rs->bar); /* D: replica 0 reduced across workers */
        if (!rs->failed)
            phase_apply(p);
        rbarrier_wait(&rs->bar); /* end */
    }
    return NULL;
}

/* ---------------------------------------------------------------- api */

int replicas_create(replica_set **out, const jobspec *spec, const replica_config *cfg,
                    char err[ERR_MAX])
{
    *out = NULL;
    err[0] = 0;
    if (cfg->replicas < 1 || cfg->replicas > REPLICAS_MAX) {
        snprintf(err, ERR_MAX, "replicas must be 1..%d, got %d", REPLICAS_MAX, cfg->replicas);
        return -1;
    }
    if (cfg->max_rows < 1) {
        snprintf(err, ERR_MAX, "a replica must take at least one row");
        return -1;
    }
    replica_set *rs = xcalloc(1, sizeof *rs);
    rs->k = cfg->replicas;
    rs->micro = cfg->micro_batches > 1 ? cfg->micro_batches : 1;
    rs->vars = cfg->vars;
    rs->reduce = cfg->reduce;
    rs->comm = cfg->comm;
    rs->features = spec->input_size;
    for (int i = 0; i < rs->k; i++) {
        rs->r[i].rs = rs;
        rs->r[i].index = i;
        /* sized for the largest micro-batch of a replica's rows */
        if (model_build(&rs->r[i].m, spec, (cfg->max_rows + rs->micro - 1) / rs->micro, cfg->seed, err))
            goto fail;
        model_set_replicas(rs->r[i].m, cfg->in_sync > 0 ? cfg->in_sync : rs->k);
        if (i > 0 && rs->vars == REPLICA_VARS_CENTRAL && model_share_params(rs->r[i].m, rs->r[0].m)) {
            snprintf(err, ERR_MAX, "replica %d cannot share the variables", i);
            goto fail;
        }
    }
    rs->n = model_param_count(rs->r[0].m);
    if (rs->comm) {
        rs->sum = comm_buffer(rs->comm, rs->n + TAIL);
        if (!rs->sum) {
            snprintf(err, ERR_MAX, "cannot get the communicator's buffer: %s",
                     comm_error(rs->comm));
            goto fail;
        }
    } else {
        rs->sum = xcalloc(rs->n + TAIL, sizeof(float));
        rs->sum_owned = 1;
    }
    if (rs->k == 1)
        model_set_grads(rs->r[0].m, rs->sum); /* no copy: backward writes the buffer reduced */
    if (rs->k > 1) {
        pthread_mutex_init(&rs->bar.mu, NULL);
        pthread_cond_init(&rs->bar.cv, NULL);
        rs->bar.count = rs->k;
        rs->bar_ready = 1;
        for (int i = 1; i < rs->k; i++) {
            if (pthread_create(&rs->r[i].thread, NULL, replica_main, &rs->r[i]) != 0) {
                snprintf(err, ERR_MAX, "cannot start replica thread %d", i);
                goto fail;
            }
            rs->r[i].started = 1;
        }
    }
    *out = rs;
    return 0;
fail:
    replicas_free(rs);
    return -1;
}

int replicas_sync_initial(replica_set *rs, char err[ERR_MAX])
{
    model *m0 = rs->r[0].m;
    size_t n = rs->n, slots = (size_t)model_slot_count(m0) * n;
    if (rs->comm && comm_size(rs->comm) > 1) {
        double it = (double)model_iterations(m0);
        if (comm_broadcast(rs->comm, model_params(m0), n * sizeof(float), 0) ||
            (slots && comm_broadcast(rs->comm, model_slots(m0), slots * sizeof(float), 0)) ||
            comm_broadcast(rs->comm, &it, sizeof it, 0)) {
            snprintf(err, ERR_MAX, "broadcast of the initial variables failed: %s",
                     comm_error(rs->comm));
            return -1;
        }
        model_set_iterations(m0, (long)it);
    }
    for (int i = 1; i < rs->k; i++) {
        model *m = rs->r[i].m;
        if (rs->vars == REPLICA_VARS_MIRRORED) {
            memcpy(model_params(m), model_params(m0), n * sizeof(float));
            if (slots)
                memcpy(model_slots(m), model_slots(m0), slots * sizeof(float));
        }
        model_set_iterations(m, model_iterations(m0));
    }
    return 0;
}

int replicas_step(replica_set *rs, const float *x, const float *y, int rows, long row0,
                  int global_batch, int stop, replica_step_result *out,
                  char err[ERR_MAX])
{
    memset(out, 0, sizeof *out);
    rs->x = x;
    rs->y = y;
    rs->rows = rows;
    rs->row0 = row0;
    rs->global_batch = global_batch;
    replica *p0 = &rs->r[0];
    int multi = rs->k > 1;
    if (multi)
        rbarrier_wait(&rs->bar); /* start */
    phase_compute(p0);
    if (multi)
        rbarrier_wait(&rs->bar); /* B */
    phase_reduce(p0);
    if (multi)
        rbarrier_wait(&rs->bar); /* C */

    double lsum = 0.0;
    long correct = 0, n = 0;
    for (int i = 0; i < rs->k; i++) {
        lsum += rs->r[i].st.loss_sum;
        correct += rs->r[i].st.correct;
        n += rs->r[i].st.n;
    }
    float *tail = rs->sum + rs->n;
    memset(tail, 0, TAIL * sizeof(float));
    tail[T_LOSS] = (float)lsum;
    tail[T_CORRECT] = (float)correct;
    tail[T_N] = (float)n;
    tail[T_STOP] = stop ? 1.0f : 0.0f;
    int rc = 0;
    if (rs->comm && comm_size(rs->comm) > 1 && comm_allreduce_sum(rs->comm, rs->sum, rs->n + TAIL)) {
        snprintf(err, ERR_MAX, "all-reduce across workers failed: %s", comm_error(rs->comm));
        rc = -1;
    }
    rs->failed = rc != 0;
    if (multi)
        rbarrier_wait(&rs->bar); /* D */
    if (rc == 0)
        phase_apply(p0);
    if (multi)
        rbarrier_wait(&rs->bar); /* end */
    if (rc)
        return -1;
    long it = model_iterations(p0->m) + 1;
    for (int i = 0; i < rs->k; i++)
        model_set_iterations(rs->r[i].m, it);
    out->st.loss_sum = tail[T_LOSS];
    out->st.correct = (long)(tail[T_CORRECT] + 0.5f);
    out->st.n = (long)(tail[T_N] + 0.5f);
    out->loss = global_batch > 0 ? (float)(out->st.loss_sum / global_batch) : 0.0f;
    out->stop = tail[T_STOP] > 0.5f;
    return 0;
}

model *replicas_model(replica_set *rs) { return rs->r[0].m; }
int replicas_count(const replica_set *rs) { return rs->k; }

void replicas_free(replica_set *rs)
{
    if (!rs)
        return;
    int running = 0;
    for (int i = 1; i < rs->k; i++)
        running += rs->r[i].started;
    if (running) {
        /* every started thread waits at [start]: release them with quit set
         * (the barrier counts only the threads that exist) */
        pthread_mutex_lock(&rs->bar.mu);
        rs->bar.count = running + 1;
        pthread_mutex_unlock(&rs->bar.mu);
        rs->quit = 1;
        rbarrier_wait(&rs->bar);
        for (int i = 1; i < rs->k; i++)
            if (rs->r[i].started)
                pthread_join(rs->r[i].thread, NULL);
    }
    if (rs->bar_ready) {
        pthread_mutex_destroy(&rs->bar.mu);
        pthread_cond_destroy(&rs->bar.cv);
    }
    /* central replicas borrow replica 0's variables: free them first */
    for (int i = rs->k - 1; i >= 0; i--)
        model_free(rs->r[i].m);
    if (rs->sum_owned)
        free(rs->sum);
    free(rs);
}
