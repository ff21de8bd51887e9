/* engine.c - the CPU and GPU step engines of train_loop.c (see engine.h).
 *
 * The GPU calls (executor/cuda) are inline stubs that fail with "built
 * without CUDA" in a CPU build, so this file has no #ifdef; engine_gpu_check
 * refuses GPU tasks there before anything is built. */
#include "engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/util.h"
#include "../cuda/gpu_device.h"
#include "../cuda/gpu_model.h"
#include "../cuda/nccl_comm.h"

#define TAIL 16              /* the step's counts and stop flag across workers */
#define T_LOSS 0
#define T_CORRECT 1
#define T_N 2
#define T_STOP 3

struct engine {
    int gpu;
    int replicated;
    int k;                   /* replicas in this worker */
    int workers, worker;
    comm *comm;
    int features;
    int global_batch;
    uint64_t seed;
    char name[64];
    /* CPU */
    model *m;                /* the model that trains (replica 0 of rs) */
    replica_set *rs;         /* several replicas or workers; NULL: one model */
    int (*grad_reduce)(void *ctx, model *m, float *grads, size_t n, step_stats *st);
    void *grad_ctx;
    /* GPU */
    gpu_model *g[REPLICAS_MAX];
    gpu_nccl *nc[REPLICAS_MAX]; /* one rank per local device, when ranks > 1 */
    int ranks;               /* workers x k */
    model *host;             /* the checkpoints' CPU model */
    long row0;               /* the row offset replica 0 was last given (one device) */
};

/* ---------------------------------------------------------------- checks */

int engine_gpu_check(const jobspec *spec, int gpus, int workers, char err[ENGINE_ERR_MAX])
{
    err[0] = 0;
    if (gpus <= 0)
        return 0;
    if (!gpu_built_with_cuda()) {
        snprintf(err, ENGINE_ERR_MAX,
                 "the task was given %d GPU(s) but this worker was built without CUDA (make CUDA=1); "
                 "it does not train a GPU job on the CPU", gpus);
        return -1;
    }
    int n = 0;
    char gerr[GPU_ERR_MAX] = "";
    if (gpu_device_count(&n, gerr) < 0) {
        snprintf(err, ENGINE_ERR_MAX, "cannot count the CUDA devices: %.200s", gerr);
        return -1;
    }
    if (n == 0) {
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        snprintf(err, ENGINE_ERR_MAX,
                 "the task was given %d GPU(s) but no CUDA device is visible (CUDA_VISIBLE_DEVICES=%.40s): %.120s",
                 gpus, vis ? vis : "(unset)", gerr[0] ? gerr : "none found");
        return -1;
    }
    if (n < gpus) {
        snprintf(err, ENGINE_ERR_MAX, "the task was given %d GPUs but only %d CUDA device(s) are visible", gpus, n);
        return -1;
    }
    if (spec->strategy.type == STRAT_PARAMETER_SERVER) {
        snprintf(err, ENGINE_ERR_MAX,
                 "strategy parameter_server runs on the CPU engine only; the GPU engine runs default, "
                 "one_device, mirrored, central_storage and multi_worker_mirrored");
        return -1;
    }
    if (gpus != spec->resources.devices_per_worker) {
        snprintf(err, ENGINE_ERR_MAX, "the task was given %d GPU(s) but the spec asks for %d devices per worker",
                 gpus, spec->resources.devices_per_worker);
        return -1;
    }
    if (gpus > REPLICAS_MAX) {
        snprintf(err, ENGINE_ERR_MAX, "at most %d GPUs a worker, got %d", REPLICAS_MAX, gpus);
        return -1;
    }
    if (workers > 1 && spec->strategy.communication == COMM_RING) {
        snprintf(err, ENGINE_ERR_MAX,
                 "strategy.communication ring reduces through host memory, which the GPU engine does not "
                 "do: use nccl or auto for GPU devices");
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- create / free */

static int create_cpu(engine *e, const jobspec *spec, const engine_config *cfg, char err[ENGINE_ERR_MAX])
{
    char merr[MODEL_ERR_MAX > REPLICAS_ERR_MAX ? MODEL_ERR_MAX : REPLICAS_ERR_MAX];
    if (cfg->replicated) {
        replica_config rc = {.replicas = e->k,
                             .vars = cfg->vars == REPLICA_VARS_CENTRAL ? REPLICA_VARS_CENTRAL
                                                                       : REPLICA_VARS_MIRRORED,
                             .reduce = cfg->reduce == REPLICA_REDUCE_ONE ? REPLICA_REDUCE_ONE
                                                                         : REPLICA_REDUCE_ALL,
                             .comm = cfg->comm,
                             .max_rows = cfg->max_rows,
                             .in_sync = e->workers * e->k,
                             .seed = cfg->seed};
        if (replicas_create(&e->rs, spec, &rc, merr)) {
            snprintf(err, ENGINE_ERR_MAX, "%s", merr);
            return -1;
        }
        e->m = replicas_model(e->rs);
        if (e->k > 1)
            snprintf(e->name, sizeof e->name, "cpu x%d replicas", e->k);
        else
            snprintf(e->name, sizeof e->name, "cpu");
        return 0;
    }
    if (model_build(&e->m, spec, cfg->global_batch, cfg->seed, merr)) {
        snprintf(err, ENGINE_ERR_MAX, "%s", merr);
        return -1;
    }
    e->grad_reduce = cfg->grad_reduce;
    e->grad_ctx = cfg->grad_ctx;
    snprintf(e->name, sizeof e->name, "cpu");
    return 0;
}

static int create_gpu(engine *e, const jobspec *spec, const engine_config *cfg, char err[ENGINE_ERR_MAX])
{
    char gerr[GPU_ERR_MAX], merr[MODEL_ERR_MAX];
    if (engine_gpu_check(spec, cfg->gpus, e->workers, err))
        return -1;
    if (cfg->replicas != cfg->gpus) {
        snprintf(err, ENGINE_ERR_MAX, "%d replicas on %d GPUs: one replica a device", cfg->replicas, cfg->gpus);
        return -1;
    }
    if (cfg->grad_reduce) {
        snprintf(err, ENGINE_ERR_MAX, "the grad_reduce hook reads host gradients: CPU engine only");
        return -1;
    }
    e->ranks = e->workers * e->k;
    int one = e->ranks == 1;
    if (model_build(&e->host, spec, cfg->global_batch, cfg->seed, merr)) {
        snprintf(err, ENGINE_ERR_MAX, "%s", merr);
        return -1;
    }
    int devices[REPLICAS_MAX];
    for (int i = 0; i < e->k; i++) {
        gpu_options o;
        gpu_options_default(&o);
        o.device = devices[i] = i;
        o.cuda_graph = one; /* replicas step in parts (forward_backward, all-reduce, apply): no graph */
        if (gpu_model_build(&e->g[i], spec, one ? cfg->global_batch : cfg->max_rows, cfg->seed, &o, gerr)) {
            snprintf(err, ENGINE_ERR_MAX, "GPU %d: %.200s", i, gerr);
            return -1;
        }
        if (e->ranks > 1 && gpu_model_set_replicas(e->g[i], e->ranks, gerr)) {
            snprintf(err, ENGINE_ERR_MAX, "GPU %d: %.200s", i, gerr);
            return -1;
        }
    }
    if (e->ranks > 1) {
        char local_id[GPU_NCCL_ID_HEX];
        const char *id = cfg->nccl_id;
        if (e->workers == 1) {
            if (gpu_nccl_unique_id(local_id, gerr)) {
                snprintf(err, ENGINE_ERR_MAX, "NCCL: %.200s", gerr);
                return -1;
            }
            id = local_id;
        } else if (!id || !*id) {
            snprintf(err, ENGINE_ERR_MAX, "%d workers on GPUs need the chief's NCCL id (rendezvous key nccl-id)",
                     e->workers);
            return -1;
        }
        if (gpu_nccl_init_local(e->nc, e->k, id, e->ranks, e->worker * e->k, devices, ENGINE_NCCL_TIMEOUT_S,
                                gerr)) {
            snprintf(err, ENGINE_ERR_MAX, "NCCL (ranks %d..%d of %d): %.200s", e->worker * e->k,
                     e->worker * e->k + e->k - 1, e->ranks, gerr);
            return -1;
        }
        snprintf(e->name, sizeof e->name, "gpu x%d (nccl, %d ranks)", e->k, e->ranks);
    } else {
        snprintf(e->name, sizeof e->name, "gpu");
    }
    return 0;
}

int engine_create(engine **out, const jobspec *spec, const engine_config *cfg, char err[ENGINE_ERR_MAX])
{
    *out = NULL;
    err[0] = 0;
    engine *e = xcalloc(1, sizeof *e);
    e->gpu = cfg->gpus > 0;
    e->replicated = cfg->replicated;
    e->k = cfg->replicas > 0 ? cfg->replicas : 1;
    e->workers = cfg->workers > 0 ? cfg->workers : 1;
    e->worker = cfg->worker;
    e->comm = cfg->comm;
    e->features = spec->input_size;
    e->global_batch = cfg->global_batch;
    e->seed = cfg->seed;
    if (e->k > REPLICAS_MAX) {
        snprintf(err, ENGINE_ERR_MAX, "replicas must be 1..%d, got %d", REPLICAS_MAX, e->k);
        engine_free(e);
        return -1;
    }
    if ((e->gpu ? create_gpu : create_cpu)(e, spec, cfg, err)) {
        engine_free(e);
        return -1;
    }
    *out = e;
    return 0;
}

void engine_free(engine *e)
{
    if (!e)
        return;
    if (e->rs)
        replicas_free(e->rs);
    else
        model_free(e->m);
    for (int i = 0; i < e->k && i < REPLICAS_MAX; i++) {
        gpu_nccl_free(e->nc[i]);
        gpu_model_free(e->g[i]);
    }
    model_free(e->host);
    free(e);
}

int engine_is_gpu(const engine *e) { return e->gpu; }
const char *engine_name(const engine *e) { return e->name; }

/* ---------------------------------------------------------------- host model */

model *engine_host_model(engine *e) { return e->gpu ? e->host : e->m; }

int engine_push(engine *e, char err[ENGINE_ERR_MAX])
{
    char gerr[GPU_ERR_MAX];
    if (e->gpu && gpu_model_from_host(e->g[0], e->host, gerr)) {
        snprintf(err, ENGINE_ERR_MAX, "GPU 0: %.200s", gerr);
        return -1;
    }
    return 0;
}

int engine_pull(engine *e, char err[ENGINE_ERR_MAX])
{
    char gerr[GPU_ERR_MAX];
    if (e->gpu && gpu_model_to_host(e->g[0], e->host, gerr)) {
        snprintf(err, ENGINE_ERR_MAX, "GPU 0: %.200s", gerr);
        return -1;
    }
    return 0;
}

model *engine_take_model(engine *e, const jobspec *spec, char err[ENGINE_ERR_MAX])
{
    model *out = NULL;
    char merr[MODEL_ERR_MAX];
    if (e->gpu) {
        if (engine_pull(e, err))
            return NULL;
        out = e->host; /* built for global_batch */
        e->host = NULL;
        return out;
    }
    if (!e->rs) {
        out = e->m;
        e->m = NULL;
        return out;
    }
    /* a model of its own: the replica set goes with the engine */
    if (model_build(&out, spec, e->global_batch, e->seed, merr)) {
        snprintf(err, ENGINE_ERR_MAX, "%s", merr);
        return NULL;
    }
    memcpy(model_params(out), model_params(e->m), sizeof(float) * model_param_count(e->m));
    memcpy(model_slots(out), model_slots(e->m), sizeof(float) * model_param_count(e->m) * (size_t)model_slot_count(e->m));
    model_set_iterations(out, model_iterations(e->m));
    return out;
}

/* ---------------------------------------------------------------- start */

static int gpu_sync_initial(engine *e, char err[ENGINE_ERR_MAX])
{
    char gerr[GPU_ERR_MAX];
    long it = gpu_model_iterations(e->g[0]);
    uint64_t rng[4];
    gpu_model_rng_get(e->g[0], rng);
    if (e->comm && comm_size(e->comm) > 1) {
        double itd = (double)it;
        if (comm_broadcast(e->comm, &itd, sizeof itd, 0) || comm_broadcast(e->comm, rng, sizeof rng, 0)) {
            snprintf(err, ENGINE_ERR_MAX, "broadcast of the initial state failed: %.180s", comm_error(e->comm));
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
    }
    for (int i = 0; i < e->k; i++) {
        if (gpu_model_sync(e->g[i], gerr) || gpu_model_set_iterations(e->g[i], it, gerr) ||
            gpu_model_rng_set(e->g[i], rng, gerr)) {
            snprintf(err, ENGINE_ERR_MAX, "GPU %d: %.200s", i, gerr);
            return -1;
        }
    }
    return 0;
nccl_fail:
    snprintf(err, ENGINE_ERR_MAX, "broadcast of the initial variables (NCCL) failed: %.200s", gerr);
    return -1;
}

int engine_sync_initial(engine *e, char err[ENGINE_ERR_MAX])
{
    char rerr[REPLICAS_ERR_MAX];
    if (e->gpu)
        return gpu_sync_initial(e, err);
    if (e->rs && replicas_sync_initial(e->rs, rerr)) {
        snprintf(err, ENGINE_ERR_MAX, "%s", rerr);
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- step */

static int cpu_step(engine *e, const float *x, const float *y, int rows, long row0, int global_batch, int stop,
                    engine_step_result *out, char err[ENGINE_ERR_MAX])
{
    if (e->rs) {
        replica_step_result sr;
        char rerr[REPLICAS_ERR_MAX];
        if (replicas_step(e->rs, x, y, rows, row0, global_batch, stop, &sr, rerr)) {
            snprintf(err, ENGINE_ERR_MAX, "%s", rerr);
            return -1;
        }
        out->st = sr.st;
        out->loss = sr.loss;
        out->stop = sr.stop;
        return 0;
    }
    if (e->grad_reduce) {
        out->loss = model_forward_backward(e->m, x, y, rows, global_batch, &out->st);
        if (e->grad_reduce(e->grad_ctx, e->m, model_grads(e->m), model_param_count(e->m), &out->st)) {
            snprintf(err, ENGINE_ERR_MAX, "gradient reduction failed");
            return -1;
        }
        model_apply_gradients(e->m);
    } else {
        out->loss = model_train_step(e->m, x, y, rows, global_batch, &out->st);
    }
    out->stop = stop;
    return 0;
}

static int gpu_step(engine *e, const float *x, const float *y, int rows, long row0, int global_batch, int stop,
                    engine_step_result *out, char err[ENGINE_ERR_MAX])
{
    char gerr[GPU_ERR_MAX];
    int i = 0;
    if (e->ranks == 1) {
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
            if (gpu_model_load_batch(e->g[i], x + (size_t)off * (size_t)e->features, y + off, len, gerr) ||
                gpu_model_set_row_offset(e->g[i], row0 + off, gerr) ||
                gpu_model_forward_backward(e->g[i], global_batch, gerr))
                goto fail;
        }
        float *bufs[REPLICAS_MAX];
        void *streams[REPLICAS_MAX];
        for (i = 0; i < e->k; i++) {
            bufs[i] = gpu_model_grads_device(e->g[i]);
            streams[i] = gpu_model_stream(e->g[i]);
        }
        if (gpu_nccl_allreduce_local(e->nc, e->k, bufs, gpu_model_param_count(e->g[0]), 0, streams, gerr)) {
            snprintf(err, ENGINE_ERR_MAX, "gradient all-reduce (NCCL) failed: %.200s", gerr);
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
            snprintf(err, ENGINE_ERR_MAX, "all-reduce across workers failed: %.180s", comm_error(e->comm));
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
    snprintf(err, ENGINE_ERR_MAX, "GPU %d: %.200s", i, gerr);
    return -1;
}

int engine_step(engine *e, const float *x, const float *y, int rows, long row0, int global_batch, int stop,
                engine_step_result *out, char err[ENGINE_ERR_MAX])
{
    memset(out, 0, sizeof *out);
    return (e->gpu ? gpu_step : cpu_step)(e, x, y, rows, row0, global_batch, stop, out, err);
}

int engine_evaluate(engine *e, const float *x, const float *y, long n, double *loss, double *acc,
                    char err[ENGINE_ERR_MAX])
{
    char gerr[GPU_ERR_MAX];
    if (!e->gpu) {
        model_evaluate(e->m, x, y, n, loss, acc);
        return 0;
    }
    if (gpu_model_evaluate(e->g[0], x, y, n, loss, acc, gerr)) {
        snprintf(err, ENGINE_ERR_MAX, "GPU 0: evaluation: %.200s", gerr);
        return -1;
    }
    return 0;
}
