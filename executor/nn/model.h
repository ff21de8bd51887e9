/* model.h - a sequential model built from a job spec: its layers, ONE flat
 * parameter buffer with per-tensor pointers into it, a parallel gradient
 * buffer (the one buffer a strategy all-reduces), flat optimizer slots, and
 * activation/gradient scratch sized once for a maximum batch.
 *
 * A training step is `model_forward_backward` -> [the caller may all-reduce
 * model_grads()] -> `model_apply_gradients`; nothing allocates after
 * model_build. With gradient accumulation a step's rows go through in
 * micro-batches (`model_forward_backward_micro`: the first overwrites the
 * gradient buffer, the others add to it), so the scratch is sized for one
 * micro-batch. Layer kernels: layers.h; losses: loss.h; updates: optimizer.h;
 * files: checkpoint.h.
 *
 * defines: model_build, model_free, model_forward_backward,
 *          model_forward_backward_add, model_forward_backward_micro,
 *          model_micro_slice, model_apply_gradients, model_evaluate,
 *          model_predict, accessors */
#ifndef TRAINYARD_NN_MODEL_H
#define TRAINYARD_NN_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include "../../common/errbuf.h"
#include "../../spec/jobspec.h"

#define MODEL_NAME_MAX 64
#define MODEL_MAX_TENSORS (2 * JOBSPEC_MAX_LAYERS)

typedef struct model model;

/* One named tensor: its place in the flat buffers. Trainable tensors, in
 * layer order, each 64-byte aligned in params/grads/each slot:
 *   dense_K.kernel (in, out), dense_K.bias (out);
 *   conv2d_K.kernel (kh, kw, c_in, c_out), conv2d_K.bias (c_out);
 *   batch_normalization_K.gamma (c) when scale, .beta (c) when center;
 * K counts the layers of that type before it (jobspec_layer_name). The
 * non-trainable state (model_state) holds, the same way,
 *   batch_normalization_K.moving_mean (c) (starts at 0) and
 *   batch_normalization_K.moving_variance (c) (starts at 1). */
typedef struct model_tensor {
    char name[MODEL_NAME_MAX];   /* "dense_0.kernel", "conv2d_1.bias" */
    size_t offset;               /* in floats, into params/grads/each slot (or the state) */
    size_t size;                 /* floats */
    int rank;                    /* 1 to 4 */
    int shape[4];
} model_tensor;

/* What one forward pass saw, for metrics. */
typedef struct step_stats {
    double loss_sum;             /* sum of per-example losses */
    long correct;                /* examples predicted right (accuracy) */
    long n;                      /* examples */
} step_stats;

/* Builds the model of spec->layers / compile for batches of at most
 * max_batch examples, initialised from seed. Returns 0, or -1 with a message
 * in err (e.g. "model.layers[2]: dropout rate 1.5 not in [0, 1)"). */
int model_build(model **out, const jobspec *spec, int max_batch, uint64_t seed,
                char err[ERR_MAX]);
void model_free(model *m);

/* Training-mode forward and backward of n <= max_batch examples: x (n, in),
 * y (n) labels. OVERWRITES the gradient buffer with d(sum of per-example
 * losses / global_batch + regularization / replicas)/d(params) (n == 0
 * gives the regularization's share alone). Returns that loss; fills *st
 * when not NULL (loss_sum includes the regularization term once per
 * example, as Keras reports it). */
float model_forward_backward(model *m, const float *x, const float *y, int n,
                             int global_batch, step_stats *st);

/* Gradient accumulation: as model_forward_backward, but ADDS d(sum of these
 * n examples' losses / global_batch)/d(params) to the gradient buffer and
 * adds NO regularization gradient (the step's first micro-batch, through
 * model_forward_backward, adds it once). n == 0 adds nothing. Returns the
 * examples' loss sum / global_batch; *st as model_forward_backward's
 * (loss_sum includes the regularization value once per example). */
float model_forward_backward_add(model *m, const float *x, const float *y, int n,
                                 int global_batch, step_stats *st);

/* Micro-batch j of `micro` over `rows` rows: contiguous, in order, sizes
 * differing by at most one (the larger first); *len may be 0 when micro >
 * rows. */
void model_micro_slice(int rows, int micro, int j, int *off, int *len);

/* One replica's share of a step, n rows that are rows row0.. of the global
 * batch, in `micro` micro-batches (model_micro_slice; each at most
 * model_max_batch rows): the gradient buffer ends holding exactly what
 * model_forward_backward over the n rows at once would write (the sum of
 * the micro-batches' data gradients plus the regularization's share once),
 * up to float rounding; dropout masks are keyed by each row's global index,
 * so they are the same. micro <= 1 is one model_forward_backward. Leaves
 * the row offset at row0. Returns the loss as model_forward_backward;
 * *st summed over the micro-batches. */
float model_forward_backward_micro(model *m, const float *x, const float *y, int n, long row0,
                                   int micro, int global_batch, step_stats *st);

/* forward_backward + apply_gradients in one pass for a single replica (no
 * reduction between them): each layer is updated while its gradients are in
 * cache. Bit-identical to the two calls. */
float model_train_step(model *m, const float *x, const float *y, int n, int global_batch,
                       step_stats *st);

/* One optimizer update with the gradient buffer as it is now. */
void model_apply_gradients(model *m);

/* One optimizer update of params[begin, end) from grads[begin, end) (any
 * buffer in the flat layout, e.g. a sum over replicas), with the slots of
 * that range. Does NOT count the iteration (model_set_iterations does):
 * replicas updating disjoint ranges of shared variables make one update. */
void model_apply_range(model *m, const float *grads, size_t begin, size_t end);

/* Replicas. model_share_params: m uses owner's parameters and optimizer
 * slots from now on (one copy of the variables, as CentralStorage keeps);
 * both must come from the same spec. Returns 0, or -1 when they differ.
 * owner must outlive m. model_set_grads: m's gradients are written into
 * grads (model_param_count floats, the caller's, e.g. a communicator's
 * shared buffer) instead of its own buffer. */
int model_share_params(model *m, model *owner);
void model_set_grads(model *m, float *grads);

/* The global-batch row of the first example of the next training batch:
 * dropout masks are keyed by (step = model_iterations, global row), so a
 * replica passing its slice's offset draws the masks one device would. */
void model_set_row_offset(model *m, long row0);

/* The number of replicas in sync: each adds 1/replicas of the kernel
 * regularization's gradient (tf.distribute scales the regularization loss
 * by the replicas), so their sum adds it once. Default 1. */
void model_set_replicas(model *m, int replicas);

/* Inference over n examples in batches of max_batch: mean loss and accuracy
 * (either pointer may be NULL). n == 0 gives 0 and 0. */
void model_evaluate(model *m, const float *x, const float *y, long n, double *loss, double *acc);

/* Inference outputs (n, output_size) as probabilities/values (the fused
 * softmax/sigmoid applied). */
void model_predict(model *m, const float *x, long n, float *out);

/* The non-trainable state (batch normalization's moving statistics): one
 * flat buffer of model_state_count floats, its tensors listed by
 * model_state_tensor_at. Each replica keeps its own (Keras' default);
 * evaluation and predict read them; checkpoints keep them. */
float *model_state(model *m);
size_t model_state_count(const model *m);
int model_state_tensor_count(const model *m);
const model_tensor *model_state_tensor_at(const model *m, int i);

/* ---------------------------------------------------------------- access */
float *model_params(model *m);            /* (model_param_count) */
float *model_grads(model *m);             /* (model_param_count) */
float *model_slots(model *m);             /* (model_slot_count * model_param_count) */
size_t model_param_count(const model *m); /* floats in the flat buffer (tensors 64-byte aligned) */
int model_slot_count(const model *m);     /* optimizer slots per parameter */
const char *model_slot_name(const model *m, int s);
int model_tensor_count(const model *m);
const model_tensor *model_tensor_at(const model *m, int i);
int model_input_size(const model *m);
int model_output_size(const model *m);
int model_max_batch(const model *m);
/* Bytes of the scratch that grows with max_batch: every op's activations,
 * dropout masks and the two backward gradient buffers (what gradient
 * accumulation shrinks; parameters, gradients and slots excluded). */
size_t model_activation_bytes(const model *m);
const optimizer_spec *model_optimizer(const model *m);
const char *model_optimizer_name(const model *m); /* "rmsprop", ... */
/* A text signature of the architecture, loss and optimizer kind: a
 * checkpoint only loads into a model with the same signature. */
const char *model_signature(const model *m);

/* Optimizer updates done so far (Adam's t); settable for checkpoints. */
long model_iterations(const model *m);
void model_set_iterations(model *m, long it);
/* The model's 4-word RNG state: seeded at build, kept in checkpoints and
 * never advanced. The dropout masks' seed (of layers without their own
 * `seed`) derives from it; the masks themselves are counter-based (nn_rng.h:
 * seed, dropout op index, step = model_iterations, global row). */
void model_rng_get(const model *m, uint64_t s[4]);
void model_rng_set(model *m, const uint64_t s[4]);

#endif
