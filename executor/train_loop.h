/* train_loop.h - the epoch loop shared by the worker and `trainyard train`:
 * load data, build the model, epochs -> batches -> forward_backward ->
 * [grad_reduce hook] -> apply -> metrics; validation each epoch, test at the
 * end; resume from and write checkpoints; stop cleanly on a flag.
 *
 * Engine: executor/strategy/engine.h (the CPU engine of executor/nn/model.h,
 * or the GPU engine of executor/cuda when train_options.gpus > 0); data:
 * executor/data/dataset.h; files: executor/nn/checkpoint.h (the GPU engine's
 * state is copied into a CPU model for them). A multi-replica strategy plugs in through
 * train_hooks.grad_reduce (all-reduce of the flat gradient buffer) and
 * train_options.worker/workers (which shard, which slice of the global batch).
 *
 * defines: train_run, train_run_data */
#ifndef TRAINYARD_TRAIN_LOOP_H
#define TRAINYARD_TRAIN_LOOP_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "../common/errbuf.h"
#include "../spec/jobspec.h"
#include "data/dataset.h"
#include "nn/checkpoint.h"
#include "nn/model.h"
#include "strategy/train_types.h"

/* Load the spec's data (dataset_load) and run train_run_data. */
int train_run(const jobspec *spec, const train_options *opt, const train_hooks *hooks,
              train_result *res, char err[ERR_MAX]);

/* Train on data already in memory. Returns 0 (also when stopped by the
 * flag), or -1 with a message in err. When m_out is not NULL the trained
 * model is handed to the caller (who frees it) instead of freed. */
int train_run_data(const jobspec *spec, const dataset_splits *data, const train_options *opt,
                   const train_hooks *hooks, train_result *res, model **m_out,
                   char err[ERR_MAX]);

#endif
