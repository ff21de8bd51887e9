/* train_types.h - what a training run is given and gives back: its
 * options, the hooks it calls (each step, each epoch, each checkpoint, the
 * gradient reduce of a multi-replica strategy, the stop flag) and its
 * result. Shared by the epoch loop (executor/train_loop.h, train_run) and
 * the strategies that run a loop of their own (ps.h, ps_train), one floor
 * below both, so that neither includes the other's header for them.
 *
 * defines: train_options, train_step_info, train_epoch_metrics, train_hooks,
 *          train_result, train_result_epoch */
#ifndef TRAINYARD_TRAIN_TYPES_H
#define TRAINYARD_TRAIN_TYPES_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "../nn/checkpoint.h"
#include "../nn/model.h"

struct comm;
struct ps_addr;

typedef struct train_options {
    int epochs;                  /* 0 = spec->fit.epochs */
    int threads;                 /* BLAS threads; 0 = 1 */
    const char *checkpoint_path; /* NULL = no checkpoint files */
    int checkpoint_every;        /* epochs; 0 = spec->checkpoint.every_epochs; < 0 = only at
                                  * the end and on stop */
    const char *resume_path;     /* NULL = start fresh */
    const char *data_path;       /* overrides spec data.path when not NULL */
    long limit;                  /* > 0 overrides data.limit */
    int worker, workers;         /* this worker's part of every global batch (0 of 1 default):
                                  * all workers walk the same shuffled order of the whole
                                  * training split and each takes its slice of each batch */
    int replicas;                /* replicas (threads) in this worker; 0 = 1 */
    int micro_batches;           /* gradient accumulation: micro-batches each replica splits its
                                  * rows of a step into (the worker passes
                                  * jobspec_micro_batches(spec, workers)); 0 =
                                  * spec->fit.gradient_accumulation_steps */
    int replica_vars;            /* replica_vars (strategy/replicas.h): mirrored or central */
    int replica_reduce;          /* replica_reduce: cross_device_ops */
    struct comm *comm;           /* the workers' communicator (workers > 1 needs one) */
    int no_eval;                 /* 1: skip validation and test (a non-chief worker) */
    int n_ps;                    /* parameter_server: the ps tasks (ps.h) ... */
    const struct ps_addr *ps;    /* ... and their addresses */
    const unsigned char *ps_secret; /* the attempt's secret (32 bytes) each connection to a ps
                                  * proves, and the ps proves back; NULL = none */
    int gpus;                    /* CUDA devices given to this worker (ordinals 0..gpus-1 of its
                                  * CUDA_VISIBLE_DEVICES): > 0 trains on the GPU engine, one
                                  * replica a device (== replicas); 0: the CPU engine */
    const char *nccl_id;         /* GPUs and workers > 1: the chief's ncclUniqueId as hex (the
                                  * worker's rendezvous key "nccl-id") */
    int has_seed;                /* 1: init from `seed`; else from data.seed */
    uint64_t seed;
    char spec_hash[65];          /* recorded in checkpoints ("" = none) */
} train_options;

typedef struct train_step_info {
    long step;                   /* steps done in all, this one included */
    int epoch;                   /* 0-based */
    float loss;                  /* this step's mean loss (local slice / global batch * ... see model.h) */
    int n;                       /* examples in this worker's step */
} train_step_info;

typedef struct train_epoch_metrics {
    int epoch;                   /* 1-based, of `epochs` */
    int epochs;
    long step;
    double loss, accuracy;       /* running means over the epoch's training batches */
    int has_val;
    double val_loss, val_accuracy;
    double seconds;              /* training time of the epoch (validation excluded) */
    double samples_per_sec;      /* this worker's training examples / seconds */
} train_epoch_metrics;

typedef struct train_hooks {
    void *ctx;
    /* every step: keep it cheap */
    void (*on_step)(void *ctx, const train_step_info *s);
    void (*on_epoch)(void *ctx, const train_epoch_metrics *e);
    /* after a checkpoint file was written (path, the position it holds) */
    void (*on_checkpoint)(void *ctx, const char *path, const ckpt_meta *meta);
    /* between model_forward_backward and model_apply_gradients: e.g. sum the
     * flat gradient buffer (n floats) across replicas, and st's counts for
     * metrics. Return 0, or -1 to abort the run. NULL = single replica.
     * CPU engine only (a GPU run with it set is an error). */
    int (*grad_reduce)(void *ctx, model *m, float *grads, size_t n, step_stats *st);
    /* when it becomes non-zero (e.g. set by a SIGTERM handler) the loop
     * finishes the step, writes a checkpoint (if it has a path) and returns */
    volatile sig_atomic_t *stop;
    /* at the end of the last epoch (epochs_done == epochs, after on_epoch,
     * before the last checkpoint and the test): the epochs to train in all
     * from now on. More than epochs: the loop goes on, the model, optimizer
     * and data order as they are (an ASHA trial promoted at its rung's end,
     * executor/worker.c); epochs: it ends. Workers in a communicator each
     * call the loop's question: rank 0's hook answers, and its answer is
     * broadcast (the others' hooks are not called). NULL: the spec's
     * epochs. */
    int (*extend)(void *ctx, int epochs_done, int epochs);
} train_hooks;

typedef struct train_result {
    int epochs_done;             /* whole epochs trained, resumed ones included */
    long steps;
    int stopped;                 /* 1: stopped by the flag before the end */
    double loss, accuracy;       /* last epoch's training metrics */
    int has_val, has_test;
    double val_loss, val_accuracy;
    double test_loss, test_accuracy;
    double samples_per_sec;      /* training examples / training seconds, this run */
    double train_seconds;
} train_result;

/* An epoch closed: the run's result so far is that epoch's (the CPU loop
 * and the parameter-server worker both say it so). */
static inline void train_result_epoch(train_result *res, const train_epoch_metrics *em)
{
    res->epochs_done = em->epoch;
    res->steps = em->step;
    res->loss = em->loss;
    res->accuracy = em->accuracy;
    res->has_val = em->has_val;
    res->val_loss = em->val_loss;
    res->val_accuracy = em->val_accuracy;
}

#endif
