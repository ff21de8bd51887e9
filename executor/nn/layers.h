/* layers.h - the engine's layer kernels: dense (GEMM through OpenBLAS with the
 * bias, activation and dropout fused into one pass over its output),
 * activations and dropout, forward and backward, and the initialisers.
 *
 * Row-major throughout: a batch is (n, features); a dense kernel is (in, out)
 * as in Keras. No kernel allocates: scratch comes from the caller (model.c).
 *
 * defines: dense_forward, dense_backward, act_forward, act_backward,
 *          dropout_forward, dropout_backward, init_fill */
#ifndef TRAINYARD_NN_LAYERS_H
#define TRAINYARD_NN_LAYERS_H

#include <stdint.h>
#include "../../spec/jobspec.h"
#include "nn_rng.h"

/* Dropout drawn with 32-bit uniforms: keep when u < keep_threshold. */
typedef struct dropout_cfg {
    float rate;            /* 0 = no dropout */
    float scale;           /* 1 / (1 - rate) */
    uint32_t keep_threshold; /* round((1 - rate) * 2^32), saturated */
} dropout_cfg;

void dropout_cfg_init(dropout_cfg *d, float rate);

/* Where a batch sits, for the counter-based masks of nn_rng.h: row i of the
 * batch is row row0 + i of the global batch of optimizer step `step`, and
 * `layer` is the dropout's op index in the model. */
typedef struct dropout_key {
    uint64_t seed;
    int layer;
    long step;
    long row0;
} dropout_key;

/* y = act(x W + b), then dropout when drop && drop->rate > 0 (relu/linear only
 * fuse here; others use dropout_forward); key places the rows for the masks. x (n, in), w (in, out), b (out) or
 * NULL, y (n, out). scratch: at least `out` uint32. */
void dense_forward(float *y, const float *x, const float *w, const float *b,
                   int n, int in, int out, act_type act,
                   const dropout_cfg *drop, const dropout_key *key, uint32_t *scratch);

/* Backward of a dense layer given dy (n, out), the gradient at its output
 * after the activation (and the fused dropout when drop != NULL). dy is
 * overwritten with the gradient at the pre-activation. y (n, out) is the
 * layer's forward output. Writes dw (in, out), db (out) or NULL, and dx
 * (n, in) unless dx is NULL (the first layer needs no input gradient);
 * accumulate != 0 ADDS this batch's dw and db to what they hold (gradient
 * accumulation over micro-batches). act_done: dy already is the
 * pre-activation gradient (fused loss). */
void dense_backward(float *dx, float *dw, float *db, float *dy, const float *y,
                    const float *x, const float *w, int n, int in, int out,
                    act_type act, const dropout_cfg *drop, int act_done, int accumulate);

/* In place on (n, k): y = act(y). */
void act_forward(float *y, int n, int k, act_type act);

/* In place: dy (n, k) becomes the gradient before the activation, given the
 * activation's output y (n, k). */
void act_backward(float *dy, const float *y, int n, int k, act_type act);

/* In place on (n, k): y *= mask, with mask (n, k) written as 0 or scale. */
void dropout_forward(float *y, float *mask, int n, int k, const dropout_cfg *d,
                     const dropout_key *key);
void dropout_backward(float *dy, const float *mask, int n, int k);

/* Fill a kernel (fan_in, fan_out) or a bias with an initialiser. */
void init_fill(float *p, long count, int fan_in, int fan_out, init_type t, nn_rng *rng);

#endif
