/* engine.c - the step engines of train_loop.c (see engine.h): the CPU
 * engine here, the GPU engine through engine_gpu_cuda (executor/cuda/
 * gpu_engine.c, linked in CUDA builds only), so this file references no
 * CUDA symbol and needs no #ifdef; engine_gpu_check refuses GPU tasks where
 * the GPU engine is not linked before anything is built. */
#include "engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/util.h"

struct engine {
    int gpu;
    int replicated;
    int k;                   /* replicas in this worker */
    int workers, worker;
    comm *comm;
    int features;
    int global_batch;
    int micro;               /* micro-batches per replica and step (>= 1) */
    uint64_t seed;
    char name[64];
    /* CPU */
    model *m;                /* the model that trains (replica 0 of rs) */
    replica_set *rs;         /* several replicas or workers; NULL: one model */
    int (*grad_reduce)(void *ctx, model *m, float *grads, size_t n, step_stats *st);
    void *grad_ctx;
    /* GPU */
    const engine_gpu_ops *ops; /* &engine_gpu_cuda */
    void *g;                 /* its state */
    model *host;             /* the checkpoints' CPU model */
};

/* ---------------------------------------------------------------- checks */

int engine_gpu_check(const jobspec *spec, int gpus, int workers, char err[ERR_MAX])
{
    err[0] = 0;
    if (gpus <= 0)
        return 0;
    if (!&engine_gpu_cuda) {
        snprintf(err, ERR_MAX,
                 "the task was given %d GPU(s) but this worker was built without CUDA (make CUDA=1); "
                 "it does not train a GPU job on the CPU", gpus);
        return -1;
    }
    if (engine_gpu_cuda.check(gpus, err))
        return -1;
    if (spec->strategy.type == STRAT_PARAMETER_SERVER) {
        snprintf(err, ERR_MAX,
                 "strategy parameter_server runs on the CPU engine only; the GPU engine runs default, "
                 "one_device, mirrored, central_storage and multi_worker_mirrored");
        return -1;
    }
    if (gpus != spec->resources.devices_per_worker) {
        snprintf(err, ERR_MAX, "the task was given %d GPU(s) but the spec asks for %d devices per worker",
                 gpus, spec->resources.devices_per_worker);
        return -1;
    }
    if (gpus > REPLICAS_MAX) {
        snprintf(err, ERR_MAX, "at most %d GPUs a worker, got %d", REPLICAS_MAX, gpus);
        return -1;
    }
    if (workers > 1 && spec->strategy.communication == COMM_RING) {
        snprintf(err, ERR_MAX,
                 "strategy.communication ring reduces through host memory, which the GPU engine does not "
                 "do: use nccl or auto for GPU devices");
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- create / free */

static int create_cpu(engine *e, const jobspec *spec, const engine_config *cfg, char err[ERR_MAX])
{
    if (cfg->replicated) {
        replica_config rc = {.replicas = e->k,
                             .vars = cfg->vars == REPLICA_VARS_CENTRAL ? REPLICA_VARS_CENTRAL
                                                                       : REPLICA_VARS_MIRRORED,
                             .reduce = cfg->reduce == REPLICA_REDUCE_ONE ? REPLICA_REDUCE_ONE
                                                                         : REPLICA_REDUCE_ALL,
                             .comm = cfg->comm,
                             .max_rows = cfg->max_rows,
                             .micro_batches = e->micro,
                             .in_sync = e->workers * e->k,
                             .seed = cfg->seed};
        if (replicas_create(&e->rs, spec, &rc, err))
            return -1;
        e->m = replicas_model(e->rs);
        if (e->k > 1)
            snprintf(e->name, sizeof e->name, "cpu x%d replicas", e->k);
        else
            snprintf(e->name, sizeof e->name, "cpu");
        return 0;
    }
    /* one replica: the whole global batch, in micro-batches of at most this */
    if (model_build(&e->m, spec, (cfg->global_batch + e->micro - 1) / e->micro, cfg->seed, err))
        return -1;
    e->grad_reduce = cfg->grad_reduce;
    e->grad_ctx = cfg->grad_ctx;
    snprintf(e->name, sizeof e->name, "cpu");
    return 0;
}

int engine_create(engine **out, const jobspec *spec, const engine_config *cfg, char err[ERR_MAX])
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
    e->micro = cfg->micro_batches > 1 ? cfg->micro_batches : 1;
    e->seed = cfg->seed;
    if (e->k > REPLICAS_MAX) {
        snprintf(err, ERR_MAX, "replicas must be 1..%d, got %d", REPLICAS_MAX, e->k);
        engine_free(e);
        return -1;
    }
    if (e->gpu) {
        if (engine_gpu_check(spec, cfg->gpus, e->workers, err))
            goto fail;
        if (cfg->replicas != cfg->gpus) {
            snprintf(err, ERR_MAX, "%d replicas on %d GPUs: one replica a device", cfg->replicas, cfg->gpus);
            goto fail;
        }
        if (cfg->grad_reduce) {
            snprintf(err, ERR_MAX, "the grad_reduce hook reads host gradients: CPU engine only");
            goto fail;
        }
        if (model_build(&e->host, spec, cfg->global_batch, cfg->seed, err))
            goto fail;
        e->ops = &engine_gpu_cuda;
        e->g = e->ops->create(spec, cfg, e->name, sizeof e->name, err);
        if (!e->g)
            goto fail;
    } else if (create_cpu(e, spec, cfg, err)) {
        goto fail;
    }
    *out = e;
    return 0;
fail:
    engine_free(e);
    return -1;
}

void engine_free(engine *e)
{
    if (!e)
        return;
    if (e->rs)
        replicas_free(e->rs);
    else
        model_free(e->m);
    if (e->g)
        e->ops->free(e->g);
    model_free(e->host);
    free(e);
}

int engine_is_gpu(const engine *e) { return e->gpu; }
const char *engine_name(const engine *e) { return e->name; }

/* ---------------------------------------------------------------- host model */

model *engine_host_model(engine *e) { return e->gpu ? e->host : e->m; }

int engine_push(engine *e, char err[ERR_MAX])
{
    return e->gpu ? e->ops->from_host(e->g, e->host, err) : 0;
}

int engine_pull(engine *e, char err[ERR_MAX])
{
    return e->gpu ? e->ops->to_host(e->g, e->host, err) : 0;
}

model *engine_take_model(engine *e, const jobspec *spec, char err[ERR_MAX])
{
    model *out = NULL;
    if (e->gpu) {
        if (engine_pull(e, err))
            return NULL;
        out = e->host; /* built for global_batch */
        e->host = NULL;
        return out;
    }
    if (!e->rs && model_max_batch(e->m) >= e->global_batch) {
        out = e->m;
        e->m = NULL;
        return out;
    }
    /* a model of its own, for global_batch: the replica set goes with the
     * engine, and a micro-batch model is smaller */
    if (model_build(&out, spec, e->global_batch, e->seed, err))
        return NULL;
    memcpy(model_params(out), model_params(e->m), sizeof(float) * model_param_count(e->m));
    memcpy(model_slots(out), model_slots(e->m), sizeof(float) * model_param_count(e->m) * (size_t)model_slot_count(e->m));
    memcpy(model_state(out), model_state(e->m), sizeof(float) * model_state_count(e->m));
    model_set_iterations(out, model_iterations(e->m));
    uint64_t rng[4];
    model_rng_get(e->m, rng);
    model_rng_set(out, rng);
    return out;
}

/* ---------------------------------------------------------------- start */

int engine_sync_initial(engine *e, char err[ERR_MAX])
{
    if (e->gpu)
        return e->ops->sync_initial(e->g, err);
    if (e->rs && replicas_sync_initial(e->rs, err))
        return -1;
    return 0;
}

/* ---------------------------------------------------------------- step */

static int cpu_step(engine *e, const float *x, const float *y, int rows, long row0, int global_batch, int stop,
                    engine_step_result *out, char err[ERR_MAX])
{
    if (e->rs) {
        replica_step_result sr;
        if (replicas_step(e->rs, x, y, rows, row0, global_batch, stop, &sr, err))
            return -1;
        out->st = sr.st;
        out->loss = sr.loss;
        out->stop = sr.stop;
        return 0;
    }
    if (e->micro > 1) {
        /* gradient accumulation: the micro-batches' gradients summed, one update */
        out->loss = model_forward_backward_micro(e->m, x, y, rows, row0, e->micro, global_batch, &out->st);
        if (e->grad_reduce &&
            e->grad_reduce(e->grad_ctx, e->m, model_grads(e->m), model_param_count(e->m), &out->st)) {
            snprintf(err, ERR_MAX, "gradient reduction failed");
            return -1;
        }
        model_apply_gradients(e->m);
    } else if (e->grad_reduce) {
        out->loss = model_forward_backward(e->m, x, y, rows, global_batch, &out->st);
        if (e->grad_reduce(e->grad_ctx, e->m, model_grads(e->m), model_param_count(e->m), &out->st)) {
            snprintf(err, ERR_MAX, "gradient reduction failed");
            return -1;
        }
        model_apply_gradients(e->m);
    } else {
        out->loss = model_train_step(e->m, x, y, rows, global_batch, &out->st);
    }
    out->stop = stop;
    return 0;
}

int engine_step(engine *e, const float *x, const float *y, int rows, long row0, int global_batch, int stop,
                engine_step_result *out, char err[ERR_MAX])
{
    memset(out, 0, sizeof *out);
    if (e->gpu)
        return e->ops->step(e->g, x, y, rows, row0, global_batch, stop, out, err);
    return cpu_step(e, x, y, rows, row0, global_batch, stop, out, err);
}

int engine_evaluate(engine *e, const float *x, const float *y, long n, double *loss, double *acc,
                    char err[ERR_MAX])
{
    if (e->gpu)
        return e->ops->evaluate(e->g, x, y, n, loss, acc, err);
    model_evaluate(e->m, x, y, n, loss, acc);
    return 0;
}
