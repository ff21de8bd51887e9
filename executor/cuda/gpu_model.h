/* gpu_model.h - the training engine on one CUDA device: the model of a job
 * spec (spec/jobspec.h) with the SAME flat parameter layout, tensor names,
 * optimizer slots, dropout masks and update arithmetic as executor/nn
 * (model.h), so parameters and checkpoints move between the CPU and the GPU
 * engine (gpu_model_to_host / gpu_model_from_host + checkpoint.h).
 *
 * One gpu_model is one replica: its own CUDA stream, cuBLAS handle and
 * device buffers (params, grads, slots, activations, two batch slots), all
 * allocated by gpu_model_build; nothing allocates in a step. Batches are
 * staged in pinned host memory and copied on a second stream while the
 * previous step runs. A full-batch training step (forward, backward,
 * update) can replay one captured CUDA graph (options.cuda_graph).
 *
 * Layers: dense, dropout, flatten, activation, and the convolutional ones
 * (conv2d, max/average_pooling2d, global_average_pooling2d,
 * batch_normalization, reshape) with executor/nn/conv.h's arithmetic;
 * batch normalization's moving statistics are the model's state
 * (model.h's model_state layout), carried by to_host/from_host.
 *
 *   gpu_model_build(&g, &spec, batch, seed, &opt, err);
 *   for each batch:
 *       gpu_model_stage_next(g, &x, &y, err);   // pinned buffers of a free slot
 *       ...write n examples into x (n, in) and y (n)...
 *       gpu_model_stage_commit(g, n, err);      // async copy to the device
 *       gpu_model_train_step(g, batch, err);    // async on the model's stream
 *   gpu_model_stats(g, &st, 1, err);            // waits; loss/accuracy so far
 *
 * With several replicas: gpu_model_forward_backward -> all-reduce
 * gpu_model_grads_device() on gpu_model_stream() (nccl_comm.h) ->
 * gpu_model_apply_gradients.
 *
 * Usable from C. Every function returns 0, or -1 with "file:line: call:
 * reason" in err (ERR_MAX bytes); none aborts. In a build without CUDA
 * (no TRAINYARD_CUDA) the functions are inline stubs that fail with "built
 * without CUDA", so callers need no #ifdef.
 *
 * defines: gpu_model_build, gpu_model_free, gpu_model_stage_next,
 *          gpu_model_stage_commit, gpu_model_load_batch, gpu_model_train_step,
 *          gpu_model_forward_backward, gpu_model_forward_backward_add,
 *          gpu_model_apply_gradients,
 *          gpu_model_sync, gpu_model_stats, gpu_model_evaluate,
 *          gpu_model_predict, parameter and state copies and accessors. See
 *          docs/gpu.md. */
#ifndef TRAINYARD_GPU_MODEL_H
#define TRAINYARD_GPU_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "../../spec/jobspec.h"
#include "../nn/model.h"

#include "../../common/errbuf.h"

typedef struct gpu_model gpu_model;

typedef struct gpu_options {
    int device;       /* CUDA device ordinal; default 0 */
    int tf32;         /* 1: GEMMs on TF32 tensor cores (10-bit mantissa inputs,
                       * fp32 accumulate); default 0: full fp32 */
    int cuda_graph;   /* 1: a full-batch train step replays a CUDA graph captured
                       * at build (no host work per kernel); default 1 */
} gpu_options;

static inline void gpu_options_default(gpu_options *o)
{
    o->device = 0;
    o->tf32 = 0;
    o->cuda_graph = 1;
}

#if defined(TRAINYARD_CUDA) || defined(__CUDACC__)

/* Builds the model of spec->layers / compile on device opt->device (NULL:
 * defaults) for batches of at most max_batch examples, initialised exactly
 * as model_build(spec, max_batch, seed) initialises the CPU model. */
int gpu_model_build(gpu_model **out, const jobspec *spec, int max_batch, uint64_t seed,
                    const gpu_options *opt, char err[ERR_MAX]);
void gpu_model_free(gpu_model *g);

/* ------------------------------------------------------------ batches */
/* The pinned host buffers x (max_batch, input_size) and y (max_batch) of
 * the next batch slot (two slots). Waits until that slot's previous batch
 * has been trained on. Fails when two committed batches await a step. */
int gpu_model_stage_next(gpu_model *g, float **x, float **y, char err[ERR_MAX]);
/* Starts copying the n (0..max_batch) examples written there to the device;
 * the next step trains on them. */
int gpu_model_stage_commit(gpu_model *g, int n, char err[ERR_MAX]);
/* stage_next + copy of x (n, in), y (n) + stage_commit. */
int gpu_model_load_batch(gpu_model *g, const float *x, const float *y, int n,
                         char err[ERR_MAX]);

/* ------------------------------------------------------------ steps
 * Asynchronous: each queues work on the model's stream and returns. They
 * take the oldest committed batch, whose rows are rows row0.. of a global
 * batch of global_batch examples (gpu_model_set_row_offset). */

/* Forward + backward: OVERWRITES the gradient buffer with d(sum of
 * per-example losses / global_batch + regularization / replicas)/d(params),
 * as model_forward_backward. Accumulates the loss and accuracy stats. */
int gpu_model_forward_backward(gpu_model *g, int global_batch, char err[ERR_MAX]);
/* Gradient accumulation, as model_forward_backward_add: ADDS the batch's
 * d(sum of per-example losses / global_batch)/d(params) to the gradient
 * buffer, without the regularization's gradient (a step's first
 * micro-batch, through gpu_model_forward_backward, adds it once). An empty
 * batch adds nothing. Accumulates the stats as forward_backward. */
int gpu_model_forward_backward_add(gpu_model *g, int global_batch, char err[ERR_MAX]);
/* One optimizer update with the gradient buffer as it is; counts the
 * iteration (dropout's step and Adam's t). */
int gpu_model_apply_gradients(gpu_model *g, char err[ERR_MAX]);
/* forward_backward + apply_gradients; the CUDA graph when the batch is full
 * (n == max_batch) and graphs are on. */
int gpu_model_train_step(gpu_model *g, int global_batch, char err[ERR_MAX]);

/* Waits for everything queued on the model's stream. */
int gpu_model_sync(gpu_model *g, char err[ERR_MAX]);
/* Waits, then the training stats summed since the last reset (loss_sum
 * includes the regularization term once per example, as model.h's); reset
 * != 0 zeroes them. */
int gpu_model_stats(gpu_model *g, step_stats *st, int reset, char err[ERR_MAX]);

/* Inference (no dropout) over n host examples: mean loss (+ regularization)
 * and accuracy, as model_evaluate. Synchronous. Either output may be NULL. */
int gpu_model_evaluate(gpu_model *g, const float *x, const float *y, long n, double *loss,
                       double *acc, char err[ERR_MAX]);
/* Outputs (n, output_size) as probabilities/values, as model_predict. */
int gpu_model_predict(gpu_model *g, const float *x, long n, float *out, char err[ERR_MAX]);

/* Where the next batches sit in the global batch (dropout keys, nn_rng.h). */
int gpu_model_set_row_offset(gpu_model *g, long row0, char err[ERR_MAX]);
/* Replicas in sync: each adds 1/replicas of the regularization gradient. */
int gpu_model_set_replicas(gpu_model *g, int replicas, char err[ERR_MAX]);

/* ------------------------------------------------------------ parameters
 * Host copies in model.h's flat layout (model_param_count floats; slots:
 * model_slot_count * model_param_count floats, slot s of parameter i at
 * [s * count + i]). Synchronous. Either pointer may be NULL. */
int gpu_model_get_params(gpu_model *g, float *params, float *slots, char err[ERR_MAX]);
int gpu_model_set_params(gpu_model *g, const float *params, const float *slots,
                         char err[ERR_MAX]);
int gpu_model_get_grads(gpu_model *g, float *grads, char err[ERR_MAX]);
/* The non-trainable state (batch normalization's moving statistics) in
 * model.h's model_state layout (gpu_model_state_count floats; nothing to
 * copy when 0). Synchronous. A training forward moves it; evaluate and
 * predict read it. Each replica keeps its own. */
int gpu_model_get_state(gpu_model *g, float *state, char err[ERR_MAX]);
int gpu_model_set_state(gpu_model *g, const float *state, char err[ERR_MAX]);
/* Everything a checkpoint holds (params, slots, the state, iterations, RNG)
 * into / from a CPU model built from the same spec (same signature), e.g.
 * for checkpoint_save / after checkpoint_load. */
int gpu_model_to_host(gpu_model *g, model *m, char err[ERR_MAX]);
int gpu_model_from_host(gpu_model *g, model *m, char err[ERR_MAX]);

long gpu_model_iterations(const gpu_model *g);
int gpu_model_set_iterations(gpu_model *g, long it, char err[ERR_MAX]);
void gpu_model_rng_get(const gpu_model *g, uint64_t s[4]);
int gpu_model_rng_set(gpu_model *g, const uint64_t s[4], char err[ERR_MAX]);

size_t gpu_model_param_count(const gpu_model *g);
int gpu_model_slot_count(const gpu_model *g);
int gpu_model_tensor_count(const gpu_model *g);
const model_tensor *gpu_model_tensor_at(const gpu_model *g, int i);
size_t gpu_model_state_count(const gpu_model *g);
int gpu_model_state_tensor_count(const gpu_model *g);
const model_tensor *gpu_model_state_tensor_at(const gpu_model *g, int i);
int gpu_model_input_size(const gpu_model *g);
int gpu_model_output_size(const gpu_model *g);
int gpu_model_max_batch(const gpu_model *g);
const char *gpu_model_signature(const gpu_model *g); /* == model_signature */

/* For a communicator (nccl_comm.h): device buffers (param_count floats) and
 * the model's stream (a cudaStream_t). */
float *gpu_model_params_device(gpu_model *g);
float *gpu_model_grads_device(gpu_model *g);
float *gpu_model_slots_device(gpu_model *g);  /* slot_count * param_count floats; NULL: none */
float *gpu_model_state_device(gpu_model *g);  /* state_count floats; NULL: none */
void *gpu_model_stream(gpu_model *g);
int gpu_model_device(const gpu_model *g);

#else /* built without CUDA: every call fails with a clear message */

static inline int GPU_MODEL_NO_CUDA(char *err)
{
    if (err)
        snprintf(err, ERR_MAX, "built without CUDA (make CUDA=1)");
    return -1;
}

static inline int gpu_model_build(gpu_model **out, const jobspec *spec, int max_batch,
                                  uint64_t seed, const gpu_options *opt, char err[ERR_MAX])
{
    (void)spec; (void)max_batch; (void)seed; (void)opt;
    *out = NULL;
    return GPU_MODEL_NO_CUDA(err);
}
static inline void gpu_model_free(gpu_model *g) { (void)g; }
static inline int gpu_model_stage_next(gpu_model *g, float **x, float **y, char err[ERR_MAX])
{ (void)g; *x = NULL; *y = NULL; return GPU_MODEL_NO_CUDA(err); }
static inline int gpu_model_stage_commit(gpu_model *g, int n, char err[ERR_MAX])
{ (void)g; (void)n; return GPU_MODEL_NO_CUDA(err); }
static inline int gpu_model_load_batch(gpu_model *g, const float *x, const float *y, int n,
                                       char err[ERR_MAX])
{ (void)g; (void)x; (void)y; (void)n; return GPU_MODEL_NO_CUDA(err); }
static inline int gpu_model_forward_backward(gpu_model *g, int gb, char err[ERR_MAX])
{ (void)g; (void)gb; return GPU_MODEL_NO_CUDA(err); }
static inline int gpu_model_forward_backward_add(gpu_model *g, int gb, char err[ERR_MAX])
{ (void)g; (void)gb; return GPU_MODEL_NO_CUDA(err); }
static inline int gpu_model_apply_gradients(gpu_model *g, char err[ERR_MAX])
{ (void)g; return GPU_MODEL_NO_CUDA(err); }
static inline int gpu_model_train_step(gpu_model *g, int gb, char err[ERR_MAX])
{ (void)g; (void)gb; return GPU_MODEL_NO_CUDA(err); }
static inline int gpu_model_sync(gpu_model *g, char err[ERR_MAX])
{ (void)g; return GPU_MODEL_NO_CUDA(err); }
static inline int gpu_model_stats(gpu_model *g, step_stats *st, int reset, char err[ERR_MAX])
{ (void)g; (void)st; (void)reset; return GPU_MODEL_NO_CUDA(err); }
static inline int gpu_model_evaluate(gpu_model *g, const float *x, const float *y, long n,
                                     double *loss, double *acc, char err[ERR_MAX])
{ (void)g; (void)x; (void)y; (void)n; (void)loss; (void)acc; return GPU_MODEL_NO_CUDA(err); }
static inline int gpu_model_predict(gpu_model *g, const float *x, long n, float *out,
                                    char err[ERR_MAX])
{ (void)g; (void)x; (void)n; (void)out; return GPU_MODEL_NO_CUDA(err); }
static inline int gpu_model_set_row_offset(gpu_model *g, long row0, char err[ERR_MAX])
{ (void)g; (void)row0; return GPU_MODEL_NO_CUDA(err); }
static inline int gpu_model_set_replicas(gpu_model *g, int r, char err[ERR_MAX])
{ (void)g; (void)r; return GPU_MODEL_NO_CUDA(err); }
static inline int gpu_model_get_params(gpu_model *g, float *p, float *s, char err[ERR_MAX])
{ (void)g; (void)p; (void)s; return GPU_MODEL_NO_CUDA(err); }
static inline int gpu_model_set_params(gpu_model *g, const float *p, const float *s,
                                       char err[ERR_MAX])
{ (void)g; (void)p; (void)s; return GPU_MODEL_NO_CUDA(err); }
static inline int gpu_model_get_grads(gpu_model *g, float *gr, char err[ERR_MAX])
{ (void)g; (void)gr; return GPU_MODEL_NO_CUDA(err); }
static inline int gpu_model_get_state(gpu_model *g, float *st, char err[ERR_MAX])
{ (void)g; (void)st; return GPU_MODEL_NO_CUDA(err); }
static inline int gpu_model_set_state(gpu_model *g, const float *st, char err[ERR_MAX])
{ (void)g; (void)st; return GPU_MODEL_NO_CUDA(err); }
static inline int gpu_model_to_host(gpu_model *g, model *m, char err[ERR_MAX])
{ (void)g; (void)m; return GPU_MODEL_NO_CUDA(err); }
static inline int gpu_model_from_host(gpu_model *g, model *m, char err[ERR_MAX])
{ (void)g; (void)m; return GPU_MODEL_NO_CUDA(err); }
static inline long gpu_model_iterations(const gpu_model *g) { (void)g; return 0; }
static inline int gpu_model_set_iterations(gpu_model *g, long it, char err[ERR_MAX])
{ (void)g; (void)it; return GPU_MODEL_NO_CUDA(err); }
static inline void gpu_model_rng_get(const gpu_model *g, uint64_t s[4])
{ (void)g; s[0] = s[1] = s[2] = s[3] = 0; }
static inline int gpu_model_rng_set(gpu_model *g, const uint64_t s[4], char err[ERR_MAX])
{ (void)g; (void)s; return GPU_MODEL_NO_CUDA(err); }
static inline size_t gpu_model_param_count(const gpu_model *g) { (void)g; return 0; }
static inline int gpu_model_slot_count(const gpu_model *g) { (void)g; return 0; }
static inline int gpu_model_tensor_count(const gpu_model *g) { (void)g; return 0; }
static inline const model_tensor *gpu_model_tensor_at(const gpu_model *g, int i)
{ (void)g; (void)i; return NULL; }
static inline size_t gpu_model_state_count(const gpu_model *g) { (void)g; return 0; }
static inline int gpu_model_state_tensor_count(const gpu_model *g) { (void)g; return 0; }
static inline const model_tensor *gpu_model_state_tensor_at(const gpu_model *g, int i)
{ (void)g; (void)i; return NULL; }
static inline int gpu_model_input_size(const gpu_model *g) { (void)g; return 0; }
static inline int gpu_model_output_size(const gpu_model *g) { (void)g; return 0; }
static inline int gpu_model_max_batch(const gpu_model *g) { (void)g; return 0; }
static inline const char *gpu_model_signature(const gpu_model *g) { (void)g; return ""; }
static inline float *gpu_model_params_device(gpu_model *g) { (void)g; return NULL; }
static inline float *gpu_model_grads_device(gpu_model *g) { (void)g; return NULL; }
static inline float *gpu_model_slots_device(gpu_model *g) { (void)g; return NULL; }
static inline float *gpu_model_state_device(gpu_model *g) { (void)g; return NULL; }
static inline void *gpu_model_stream(gpu_model *g) { (void)g; return NULL; }
static inline int gpu_model_device(const gpu_model *g) { (void)g; return -1; }

#endif /* TRAINYARD_CUDA */

#ifdef __cplusplus
}
#endif

#endif
