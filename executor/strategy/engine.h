/* engine.h - the step engine under train_loop.c: the loop reads batches,
 * counts steps and epochs, evaluates and writes checkpoints; an engine
 * trains on the rows it is given. Two implementations:
 *
 *   CPU (gpus == 0): executor/nn's model, one replica (model_train_step, or
 *     forward_backward -> the grad_reduce hook -> apply), or K replica
 *     threads and the workers' communicator (replicas.c);
 *   GPU (gpus > 0): one gpu_model per CUDA device (executor/cuda), devices
 *     0..K-1 of the task's CUDA_VISIBLE_DEVICES. One device alone trains
 *     with gpu_model_train_step (the captured CUDA graph); several replicas
 *     (mirrored: K devices of one worker; multi_worker_mirrored: every
 *     device of every worker) form ONE NCCL communicator of workers x K
 *     ranks, and a step is forward_backward on each device -> NCCL
 *     all-reduce of the gradient buffers -> apply_gradients. The step's
 *     loss/accuracy counts and the stop flag go through the workers' CPU
 *     communicator (16 floats), which also carries the start position and
 *     the collective evaluation, as on the CPU path.
 *
 * Gradient accumulation (engine_config.micro_batches = M > 1): each
 * replica's rows of a step go through forward_backward in M micro-batches
 * (model_micro_slice's split; dropout still keyed by the global row, losses
 * still divided by the global batch), their gradients summed in the
 * replica's buffer, the regularization's share added once; then the usual
 * reduce across replicas and workers and ONE update. Models are built for
 * the largest micro-batch, so a step's activation memory is one
 * micro-batch's. CPU: model_forward_backward_micro; GPU: forward_backward
 * over the micro-batches accumulating into the device gradient buffer,
 * then the NCCL all-reduce (no CUDA graph).
 *
 * Checkpoints are the CPU engine's in both: engine_host_model() is the CPU
 * model that checkpoint_save reads and checkpoint_load writes; the GPU engine
 * copies into it (engine_pull: gpu_model_to_host) and out of it (engine_push:
 * gpu_model_from_host).
 *
 * defines: engine_gpu_check, engine_create, engine_host_model, engine_push,
 *          engine_pull, engine_sync_initial, engine_step, engine_evaluate,
 *          engine_take_model, engine_is_gpu, engine_name, engine_free */
#ifndef TRAINYARD_STRATEGY_ENGINE_H
#define TRAINYARD_STRATEGY_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "../../spec/jobspec.h"
#include "../comm/comm.h"
#include "../nn/model.h"
#include "replicas.h"
#include "../../common/errbuf.h"

#define ENGINE_NCCL_TIMEOUT_S 120    /* every rank must join the NCCL communicator by then */

typedef struct engine engine;

typedef struct engine_config {
    int gpus;                 /* CUDA devices of this worker (ordinals 0..gpus-1); 0: the CPU engine */
    int replicas;             /* K replicas in this worker (GPU: one per device, K == gpus) */
    int replicated;           /* in sync with other replicas/workers: rows come with their
                               * global row offset and the stop flag is agreed each step */
    replica_vars vars;        /* CPU replicas: mirrored or central */
    replica_reduce reduce;    /* CPU replicas: cross_device_ops */
    comm *comm;               /* the workers' communicator; NULL: one worker */
    int worker, workers;
    int max_rows;             /* the most rows one replica takes in a step */
    int micro_batches;        /* gradient accumulation: micro-batches of a replica's rows
                               * per step (models sized for ceil(max_rows / M)); 0 or 1: none */
    int global_batch;
    uint64_t seed;            /* initial weights (the same on every worker) */
    const char *nccl_id;      /* GPU, several workers: the chief's ncclUniqueId (hex) */
    /* CPU, one replica: between forward_backward and apply (train_hooks.grad_reduce) */
    int (*grad_reduce)(void *ctx, model *m, float *grads, size_t n, step_stats *st);
    void *grad_ctx;
} engine_config;

/* What one step did, over every replica of every worker. */
typedef struct engine_step_result {
    step_stats st;            /* loss_sum, correct, n */
    float loss;               /* this step's loss (st.loss_sum / global batch when replicated) */
    int stop;                 /* replicated: some worker asked to stop after this step */
} engine_step_result;

/* Whether a task given `gpus` CUDA devices can train spec here: 0, or -1
 * with the reason ("... this worker was built without CUDA ...", "... no
 * CUDA device is visible ...", a device count that is not
 * devices_per_worker, a strategy the GPU engine does not run). gpus == 0 is
 * always 0 (the CPU engine). */
int engine_gpu_check(const jobspec *spec, int gpus, int workers, char err[ERR_MAX]);

/* Builds the engine (CPU or GPU by cfg->gpus). Returns 0, or -1 with a
 * message in err (nothing held). */
int engine_create(engine **out, const jobspec *spec, const engine_config *cfg,
                  char err[ERR_MAX]);

/* The CPU model checkpoints are read from and written to (CPU: the model
 * that trains, replica 0). */
model *engine_host_model(engine *e);
/* After the host model changed (a checkpoint was loaded into it): the
 * engine takes its state (GPU: gpu_model_from_host into replica 0). */
int engine_push(engine *e, char err[ERR_MAX]);
/* Before the host model is read: it gets the engine's state (GPU:
 * gpu_model_to_host from replica 0). */
int engine_pull(engine *e, char err[ERR_MAX]);

/* Every replica of every worker takes replica 0 of worker 0's variables,
 * optimizer slots and iteration count. Collective when replicated. */
int engine_sync_initial(engine *e, char err[ERR_MAX]);

/* One step on this worker's `rows` rows x (rows, features), y (rows), rows
 * row0.. of the global batch; losses divided by global_batch. stop: this
 * worker's wish to stop after the step (replicated engines agree on it).
 * Returns 0, or -1 with a message in err. */
int engine_step(engine *e, const float *x, const float *y, int rows, long row0, int global_batch,
                int stop, engine_step_result *out, char err[ERR_MAX]);

/* Mean loss and accuracy of n rows on replica 0 (no dropout). */
int engine_evaluate(engine *e, const float *x, const float *y, long n, double *loss, double *acc,
                    char err[ERR_MAX]);

/* The trained model as a CPU model of its own, built for batches of
 * cfg->global_batch (the caller frees it; the engine must still be freed).
 * NULL with err on failure. */
model *engine_take_model(engine *e, const jobspec *spec, char err[ERR_MAX]);

int engine_is_gpu(const engine *e);
/* "cpu", "cpu x4 replicas", "gpu", "gpu x2 (nccl, 4 ranks)": for the log */
const char *engine_name(const engine *e);

void engine_free(engine *e);

/* The GPU engine's side (executor/cuda/gpu_engine.c, linked in a CUDA build
 * only: a program without it, e.g. a benchmark that links the CPU engine's
 * objects alone, refuses GPU tasks as "built without CUDA"). The state is
 * the implementation's; engine.c keeps the host model. */
typedef struct engine_gpu_ops {
    /* the devices: 0, or -1 with why (none visible, too few) */
    int (*check)(int gpus, char err[ERR_MAX]);
    void *(*create)(const jobspec *spec, const engine_config *cfg, char *name, size_t name_cap,
                    char err[ERR_MAX]);
    int (*from_host)(void *g, model *host, char err[ERR_MAX]);
    int (*to_host)(void *g, model *host, char err[ERR_MAX]);
    int (*sync_initial)(void *g, char err[ERR_MAX]);
    int (*step)(void *g, const float *x, const float *y, int rows, long row0, int global_batch, int stop,
                engine_step_result *out, char err[ERR_MAX]);
    int (*evaluate)(void *g, const float *x, const float *y, long n, double *loss, double *acc,
                    char err[ERR_MAX]);
    void (*free)(void *g);
} engine_gpu_ops;

/* Defined by executor/cuda/gpu_engine.c (weak here: absent without it). */
extern const engine_gpu_ops engine_gpu_cuda __attribute__((weak));

#endif
