/* replicas.h - the synchronous data-parallel step of the tf.distribute
 * strategies: K replicas in this worker (one thread each, one CPU device
 * each) and, for multi_worker_mirrored, the same on every worker with a
 * communicator (executor/comm) between the workers.
 *
 * One step: each replica runs forward + backward on its slice of this
 * worker's rows of the global batch (dropout keyed by global row, so any
 * split draws the masks one device would) -> the K gradient buffers are
 * summed on the worker (cross_device_ops) -> the sum is all-reduced across
 * workers together with the step's loss/accuracy counts and a stop flag ->
 * the optimizer applies the global sum:
 *   REPLICA_VARS_MIRRORED: every replica keeps its own copy of the variables
 *     and applies the same update to it (MirroredStrategy);
 *   REPLICA_VARS_CENTRAL: one copy in host memory, updated once, the K
 *     threads each updating a disjoint range (CentralStorageStrategy).
 * Losses are divided by the global batch, so gradients are summed and the
 * result equals one device's on the same global batch up to float rounding.
 * With micro_batches M > 1 (gradient accumulation) each replica computes its
 * slice in M micro-batches, summing their gradients in its buffer
 * (model_forward_backward_micro), before the same reduce and one update;
 * its model is built for the largest micro-batch.
 *
 * defines: replicas_create, replicas_sync_initial, replicas_step,
 *          replicas_model, replicas_free */
#ifndef TRAINYARD_STRATEGY_REPLICAS_H
#define TRAINYARD_STRATEGY_REPLICAS_H

#include <stdint.h>

#include "../../spec/jobspec.h"
#include "../comm/comm.h"
#include "../nn/model.h"
#include "../../common/errbuf.h"

#define REPLICAS_MAX 64

typedef enum replica_vars {
    REPLICA_VARS_MIRRORED = 0,
    REPLICA_VARS_CENTRAL = 1
} replica_vars;

typedef enum replica_reduce {
    REPLICA_REDUCE_ALL = 0,   /* every replica sums a slice of the buffers (all-reduce) */
    REPLICA_REDUCE_ONE = 1    /* replica 0 sums everything (reduction_to_one_device) */
} replica_reduce;

typedef struct replica_config {
    int replicas;             /* K replicas (threads) in this worker, 1..REPLICAS_MAX */
    replica_vars vars;
    replica_reduce reduce;
    comm *comm;               /* the workers' communicator; NULL: one worker */
    int max_rows;             /* the most rows one replica gets in a step */
    int micro_batches;        /* micro-batches per replica and step; 0 or 1: none */
    int in_sync;              /* replicas in sync over all workers (regularization share) */
    uint64_t seed;            /* initial weights (the same on every worker) */
} replica_config;

typedef struct replica_set replica_set;

/* What one step did, over every replica of every worker. */
typedef struct replica_step_result {
    step_stats st;            /* loss_sum, correct, n over the global batch */
    float loss;               /* st.loss_sum / global_batch */
    int stop;                 /* some worker asked to stop after this step */
} replica_step_result;

/* Builds K replicas of spec's model and starts K-1 threads. Returns 0, or
 * -1 with a message in err (nothing held). */
int replicas_create(replica_set **out, const jobspec *spec, const replica_config *cfg,
                    char err[ERR_MAX]);

/* Makes every replica of every worker hold replica 0 of worker 0's
 * variables, optimizer slots and iteration count (after a fresh build or a
 * resume: the chief broadcasts). Returns 0 or -1 (comm error in err). */
int replicas_sync_initial(replica_set *rs, char err[ERR_MAX]);

/* One synchronous step on this worker's `rows` rows x (rows, features), y
 * (rows), which are rows row0.. of the step's global batch; losses are
 * divided by global_batch. stop: this worker's wish to stop after the step.
 * Returns 0, or -1 with a message in err (a peer died: the communicator is
 * then unusable). */
int replicas_step(replica_set *rs, const float *x, const float *y, int rows, long row0,
                  int global_batch, int stop, replica_step_result *out,
                  char err[ERR_MAX]);

/* Replica 0's model: evaluation, checkpoints, resume. */
model *replicas_model(replica_set *rs);
int replicas_count(const replica_set *rs);

/* Stops the threads and frees everything (the communicator is the caller's). */
void replicas_free(replica_set *rs);

#endif
