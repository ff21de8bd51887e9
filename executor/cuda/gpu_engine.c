/* gpu_engine.c - the GPU side of the worker's step engine
 * (executor/strategy/engine.h): one gpu_model per CUDA device of the task,
 * one NCCL communicator over every device of every worker. Compiled and
 * linked in CUDA builds only (the Makefile's GPU_ENGINE_SRC): engine.c
 * reaches it through engine_gpu_cuda, so a program linked without it (a CPU
 * build, a benchmark with the CPU engine's objects alone) refuses GPU tasks
 * instead of failing to link. Plain C: the CUDA work is gpu_model.cu's and
 * nccl_comm.cu's.
 *
 * One device: stage -> gpu_model_train_step (a CUDA graph replay for a full
 * batch) -> stats. Several: each device its contiguous part of the rows
 * (replicas.c's split), row offset, forward_backward -> one grouped NCCL
 * all-reduce of the gradient buffers -> apply_gradients -> stats; the
 * step's counts and the stop flag then go over the workers' CPU
 * communicator.
 *
 * Gradient accumulation (cfg->micro_batches M > 1): each device takes its
 * rows in M micro-batches (model_micro_slice), forward_backward on the
 * first and forward_backward_add on the others, summing into its gradient
 * buffer, before the all-reduce and one apply_gradients; one device then
 * steps in those parts too (no CUDA graph). Models are built for the
 * largest micro-batch.
 *
 * Batch normalization's moving statistics (the models' state) start equal
 * on every device (broadcast with the parameters) and then move with each
 * replica's own batches, as Keras' replicas do; checkpoints and
 * evaluation take device 0's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../strategy/engine.h"
#include "gpu_device.h"
#include "gpu_model.h"
#include "nccl_comm.h"

#define TAIL 16              /* the step's counts and stop flag across workers */
#define T_LOSS 0
#define T_CORRECT 1
#define T_N 2
#define T_STOP 3

typedef struct gpu_engine {
    int k;                   /* devices (replicas) of this worker */
    int workers, worker;
    int ranks;               /* workers x k */
    int micro;               /* micro-batches per device and step (>= 1) */
    comm *comm;              /* the workers' CPU communicator (NULL: one worker) */
    int features;
    gpu_model *g[REPLICAS_MAX];
    gpu_nccl *nc[REPLICAS_MAX]; /* one rank per device, when ranks > 1 */
    long row0;               /* the row offset device 0 was last given (one device) */
} gpu_engine;

static int ge_check(int gpus, char err[ERR_MAX])
{
    int n = 0;
    char gerr[ERR_MAX] = "";
    if (gpu_device_count(&n, gerr) < 0) {
        snprintf(err, ERR_MAX, "cannot count the CUDA devices: %.200s", gerr);
        return -1;
    }
    if (n == 0) {
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        snprintf(err, ERR_MAX,
                 "the task was given %d GPU(s) but no CUDA device is visible (CUDA_VISIBLE_DEVICES=%.40s): %.120s",
                 gpus, vis ? vis : "(unset)", gerr[0] ? gerr : "none found");
        return -1;
    }
    if (n < gpus) {
        snprintf(err, ERR_MAX, "the task was given %d GPUs but only %d CUDA device(s) are visible", gpus, n);
        return -1;
    }
    return 0;
}

static void ge_free(void *p)
{
    gpu_engine *e = p;
    if (!e)
        return;
    for (int i = 0; i < e->k && i < REPLICAS_MAX; i++) {
        gpu_nccl_free(e->nc[i]);
        gpu_model_free(e->g[i]);
    }
    free(e);
}

static void *ge_create(const jobspec *spec, const engine_config *cfg, char *name, size_t name_cap,
                       char err[ERR_MAX])
{
    char gerr[ERR_MAX];
    gpu_engine *e = calloc(1, sizeof *e);
    if (!e) {
        snprintf(err, ERR_MAX, "out of memory");
        return NULL;
    }
    e->k = cfg->replicas > 0 ? cfg->replicas : 1;
    e->workers = cfg->workers > 0 ? cfg->workers : 1;
    e->worker = cfg->worker;
    e->comm = cfg->comm;
    e->features = spec->input_size;
    e->ranks = e->workers * e->k;
    e->micro = cfg->micro_batches > 1 ? cfg->micro_batches : 1;
    if (e->k > REPLICAS_MAX) {
        snprintf(err, ERR_MAX, "at most %d GPUs a worker, got %d", REPLICAS_MAX, e->k);
        goto fail;
    }
    int one = e->ranks == 1;
    int devices[REPLICAS_MAX];
    /* the most rows a device takes at once: its share, or its largest micro-batch */
    int rows = one ? cfg->global_batch : cfg->max_rows;
    rows = (rows + e->micro - 1) / e->micro;
    for (int i = 0; i < e->k; i++) {
        gpu_options o;
        gpu_options_default(&o);
        o.device = devices[i] = i;
        /* replicas, or micro-batches, step in parts (forward_backward, all-reduce, apply): no graph */
        o.cuda_graph = one && e->micro == 1;
        if (gpu_model_build(&e->g[i], spec, rows, cfg->seed, &o, gerr)) {
            snprintf(err, ERR_MAX, "GPU %d: %.200s", i, gerr);
            goto fail;
        }
        if (e->ranks > 1 && gpu_model_set_replicas(e->g[i], e->ranks, gerr)) {
            snprintf(err, ERR_MAX, "GPU %d: %.200s", i, gerr);
            goto fail;
        }
    }
    if (e->ranks > 1) {
        char local_id[GPU_NCCL_ID_HEX];
        const char *id = cfg->nccl_id;
        if (e->workers == 1) {
            if (gpu_nccl_unique_id(local_id, gerr)) {
                snprintf(err, ERR_MAX, "NCCL: %.200s", gerr);
                goto fail;
            }
            id = local_id;
        } else if (!id || !*id) {
            snprintf(err, ERR_MAX, "%d workers on GPUs need the chief's NCCL id (rendezvous key nccl-id)",
                     e->workers);
            goto fail;
        }
        if (gpu_nccl_init_local(e->nc, e->k, id, e->ranks, e->worker * e->k, devices, ENGINE_NCCL_TIMEOUT_S,
                                gerr)) {
            snprintf(err, ERR_MAX, "NCCL (ranks %d..%d of %d): %.200s", e->worker * e->k,
                     e->worker * e->k + e->k - 1, e->ranks, gerr);
            goto fail;
        }
        snprintf(name, name_cap, "gpu x%d (nccl, %d ranks)", e->k, e->ranks);
    } else {
        snprintf(name, name_cap, "gpu");
    }
    return e;
fail:
    ge_free(e);
    return NULL;
}

static int ge_sync_initial(void *p, char err[ERR_MAX])
{
    gpu_engine *e = p;
    char gerr[ERR_MAX];
    long it = gpu_model_iterations(e->g[0]);
    uint64_t rng[4];
    gpu_model_rng_get(e->g[0], rng);
    if (e->comm && comm_size(e->comm) > 1) {
        double itd = (double)it;
        if (comm_broadcast(e->comm, &itd, sizeof itd, 0) || comm_broadcast(e->comm, rng, sizeof rng, 0)) {
            snprintf(err, ERR_MAX, "broadcast of the initial state failed: %.180s", comm_error(e->comm));
            return -1;
        }
        it = (long)itd;
    }
    if (e->ranks > 1) {
        float *bufs[REPLICAS_MAX];
        void *streams[REPLICAS_MAX];
        size_t n = gpu_model_param_count(e->g[0]);
        size_t ns = n * (size_t)gpu_model_slot_count(e->g[0]);
        for (int i = 0; i < e->k; i++) {
            bufs[i] = gpu_model_params_device(e->g[i]);
            streams[i] = gpu_model_stream(e->g[i]);
        }
        if (gpu_nccl_broadcast_local(e->nc, e->k, bufs, n, 0, streams, gerr))
            goto nccl_fail;
        if (ns) {
            for (int i = 0; i < e->k; i++)
                bufs[i] = gpu_model_slots_device(e->g[i]);
            if (gpu_nccl_broadcast_local(e->nc, e->k, bufs, ns, 0, streams, gerr))
                goto nccl_fail;
        }
        /* batch normalization's moving statistics: each replica moves its
         * own from here on, all from the same start (a resumed checkpoint's) */
        size_t nst = gpu_model_state_count(e->g[0]);
        if (nst) {
            for (int i = 0; i < e->k; i++)
                bufs[i] = gpu_model_state_device(e->g[i]);
            if (gpu_nccl_broadcast_local(e->nc, e->k, bufs, nst, 0, streams, gerr))
                goto nccl_fail;
        }
    }
    for (int i = 0; i < e->k; i++) {
        if (gpu_model_sync(e->g[i], gerr) || gpu_model_set_iterations(e->g[i], it, gerr) ||
            gpu_model_rng_set(e->g[i], rng, gerr)) {
            snprintf(err, ERR_MAX, "GPU %d: %.200s", i, gerr);
            return -1;
        }
    }
    return 0;
nccl_fail:
    snprintf(err, ERR_MAX, "broadcast of the initial variables (NCCL) failed: %.200s", gerr);
    return -1;
}

/* Device i's len rows at x, y (rows row0.. of the global batch) in e->micro
 * micro-batches, their gradients summed in its buffer (the first overwrites
 * it and adds the regularization's share). Queued on its stream. */
static int forward_backward_micro(gpu_engine *e, int i, const float *x, const float *y, int len, long row0,
                                  int global_batch, char gerr[ERR_MAX])
{
    for (int j = 0; j < e->micro; j++) {
        int off = 0, n = 0;
        model_micro_slice(len, e->micro, j, &off, &n);
        if (j > 0 && n <= 0)
            continue; /* more micro-batches than rows: nothing to add */
        if (gpu_model_load_batch(e->g[i], x + (size_t)off * (size_t)e->features, y + off, n, gerr) ||
            gpu_model_set_row_offset(e->g[i], row0 + off, gerr) ||
            (j == 0 ? gpu_model_forward_backward(e->g[i], global_batch, gerr)
                    : gpu_model_forward_backward_add(e->g[i], global_batch, gerr)))
            return -1;
        if (i == 0)
            e->row0 = row0 + off;
    }
    return 0;
}

static int ge_step(void *p, const float *x, const float *y, int rows, long row0, int global_batch, int stop,
                   engine_step_result *out, char err[ERR_MAX])
{
    gpu_engine *e = p;
    memset(out, 0, sizeof *out);
    char gerr[ERR_MAX];
    int i = 0;
    if (e->ranks == 1 && e->micro > 1) {
        /* one device, gradient accumulation: micro-batches, then one update */
        if (forward_backward_micro(e, 0, x, y, rows, row0, global_batch, gerr) ||
            gpu_model_apply_gradients(e->g[0], gerr) || gpu_model_stats(e->g[0], &out->st, 1, gerr))
            goto fail;
    } else if (e->ranks == 1) {
        /* one device: the whole step, a CUDA graph replay when the batch is full */
        if ((row0 != e->row0 && gpu_model_set_row_offset(e->g[0], row0, gerr)) ||
            gpu_model_load_batch(e->g[0], x, y, rows, gerr) || gpu_model_train_step(e->g[0], global_batch, gerr) ||
            gpu_model_stats(e->g[0], &out->st, 1, gerr))
            goto fail;
        e->row0 = row0;
    } else {
        /* each device its contiguous part of the rows (replicas.c's split) */
        int base = rows / e->k, rem = rows % e->k;
        for (i = 0; i < e->k; i++) {
            int off = i * base + (i < rem ? i : rem), len = base + (i < rem ? 1 : 0);
            /* in micro-batches summed in the device's buffer (1: one pass) */
            if (forward_backward_micro(e, i, x + (size_t)off * (size_t)e->features, y + off, len, row0 + off,
                                       global_batch, gerr))
                goto fail;
        }
        float *bufs[REPLICAS_MAX];
        void *streams[REPLICAS_MAX];
        for (i = 0; i < e->k; i++) {
            bufs[i] = gpu_model_grads_device(e->g[i]);
            streams[i] = gpu_model_stream(e->g[i]);
        }
        if (gpu_nccl_allreduce_local(e->nc, e->k, bufs, gpu_model_param_count(e->g[0]), 0, streams, gerr)) {
            snprintf(err, ERR_MAX, "gradient all-reduce (NCCL) failed: %.200s", gerr);
            return -1;
        }
        memset(&out->st, 0, sizeof out->st);
        for (i = 0; i < e->k; i++) {
            step_stats s;
            if (gpu_model_apply_gradients(e->g[i], gerr) || gpu_model_stats(e->g[i], &s, 1, gerr))
                goto fail;
            out->st.loss_sum += s.loss_sum;
            out->st.correct += s.correct;
            out->st.n += s.n;
        }
    }
    out->stop = stop;
    if (e->comm && comm_size(e->comm) > 1) {
        float tail[TAIL];
        memset(tail, 0, sizeof tail);
        tail[T_LOSS] = (float)out->st.loss_sum;
        tail[T_CORRECT] = (float)out->st.correct;
        tail[T_N] = (float)out->st.n;
        tail[T_STOP] = stop ? 1.0f : 0.0f;
        if (comm_allreduce_sum(e->comm, tail, TAIL)) {
            snprintf(err, ERR_MAX, "all-reduce across workers failed: %.180s", comm_error(e->comm));
            return -1;
        }
        out->st.loss_sum = tail[T_LOSS];
        out->st.correct = (long)(tail[T_CORRECT] + 0.5f);
        out->st.n = (long)(tail[T_N] + 0.5f);
        out->stop = tail[T_STOP] > 0.5f;
    }
    out->loss = global_batch > 0 ? (float)(out->st.loss_sum / global_batch) : 0.0f;
    return 0;
fail:
    snprintf(err, ERR_MAX, "GPU %d: %.200s", i, gerr);
    return -1;
}


static int ge_from_host(void *p, model *host, char err[ERR_MAX])
{
    gpu_engine *e = p;
    char gerr[ERR_MAX];
    if (gpu_model_from_host(e->g[0], host, gerr)) {
        snprintf(err, ERR_MAX, "GPU 0: %.200s", gerr);
        return -1;
    }
    return 0;
}

static int ge_to_host(void *p, model *host, char err[ERR_MAX])
{
    gpu_engine *e = p;
    char gerr[ERR_MAX];
    if (gpu_model_to_host(e->g[0], host, gerr)) {
        snprintf(err, ERR_MAX, "GPU 0: %.200s", gerr);
        return -1;
    }
    return 0;
}

static int ge_evaluate(void *p, const float *x, const float *y, long n, double *loss, double *acc,
                       char err[ERR_MAX])
{
    gpu_engine *e = p;
    char gerr[ERR_MAX];
    if (gpu_model_evaluate(e->g[0], x, y, n, loss, acc, gerr)) {
        snprintf(err, ERR_MAX, "GPU 0: evaluation: %.200s", gerr);
        return -1;
    }
    return 0;
}

const engine_gpu_ops engine_gpu_cuda = {
    .check = ge_check,
    .create = ge_create,
    .from_host = ge_from_host,
    .to_host = ge_to_host,
    .sync_initial = ge_sync_initial,
    .step = ge_step,
    .evaluate = ge_evaluate,
    .free = ge_free,
};
