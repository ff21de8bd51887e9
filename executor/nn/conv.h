/* conv.h - the engine's convolutional kernels, forward and backward:
 * conv2d (im2col + one OpenBLAS GEMM per chunk of examples; a 3x3 conv
 * with stride 1 and 8+ channels in and out as Winograd's F(2x2, 3x3), 16
 * GEMMs per chunk), max and average pooling, global average pooling and
 * batch normalization.
 *
 * Channels last throughout, as Keras: an example is (h, w, c) row-major, a
 * batch of n is (n, h, w, c); a conv2d kernel is (kh, kw, c_in, c_out), a
 * bias (c_out). Padding follows TensorFlow (conv_geom_init). No kernel
 * allocates: scratch comes from the caller (model.c), sized by the
 * *_scratch_floats functions.
 *
 * defines: conv_geom_init, conv2d_scratch_floats, conv2d_forward,
 *          conv2d_backward, maxpool_forward, maxpool_backward,
 *          avgpool_forward, avgpool_backward, gap_forward, gap_backward,
 *          bn_forward_train, bn_forward_eval, bn_backward */
#ifndef TRAINYARD_NN_CONV_H
#define TRAINYARD_NN_CONV_H

#include <stddef.h>
#include <stdint.h>
#include "../../spec/jobspec.h"

/* The geometry of a conv2d or pooling window over one example. */
typedef struct conv_geom {
    int h, w, c;          /* input */
    int kh, kw;           /* window (kernel or pool size) */
    int sh, sw;           /* strides */
    int pad_top, pad_left; /* zero rows/columns before the input ("same") */
    int oh, ow, oc;       /* output; oc = filters for conv2d, c for pooling */
} conv_geom;

/* Fills g for an input (h, w, c), a window (kh, kw), strides (sh, sw) and
 * padding as TensorFlow computes it: valid: oh = (h - kh) / sh + 1 (0 when
 * kh > h); same: oh = ceil(h / sh), pad_total = max((oh - 1) * sh + kh - h,
 * 0), pad_top = pad_total / 2 (the extra row at the bottom); the same for
 * the width. oc: the output channels (filters; c for pooling). */
void conv_geom_init(conv_geom *g, int h, int w, int c, int kh, int kw, int sh, int sw,
                    padding_type pad, int oc);

/* Floats of scratch conv2d_forward and conv2d_backward need for batches of
 * up to max_batch examples; the backward uses the same region twice per
 * chunk (the chunk's im2col matrix for dw, then its gradient for dx; or
 * Winograd's transformed tiles for each), so one size serves both. The
 * kernels run a batch in chunks of whole examples: as many as the scratch
 * holds, capped at what keeps a chunk's matrices near L2 size (the GEMMs
 * run no faster on more, and the passes over them would leave the cache),
 * so this returns at most that cap's worth, not max_batch's. Any scratch
 * of at least one example's im2col matrix (oh * ow * kh * kw * c floats)
 * works, Winograd's convs falling back to im2col below their own
 * conv2d_scratch_floats(g, 1); less stops the process (it would write past
 * it). 0 for a 1x1 conv with stride 1 and no padding: x is its own im2col
 * matrix (scratch may then be NULL). */
size_t conv2d_scratch_floats(const conv_geom *g, int max_batch);

/* y (n, oh, ow, oc) = act(conv(x (n, h, w, c), w (kh, kw, c, oc)) + b),
 * b may be NULL. act: relu/linear/sigmoid/tanh (softmax never reaches a
 * conv). scratch: `scratch_floats` floats (conv2d_scratch_floats). */
void conv2d_forward(float *y, const float *x, const float *w, const float *b, int n,
                    const conv_geom *g, act_type act, float *scratch, size_t scratch_floats);

/* Backward of conv2d given dy (n, oh, ow, oc), the gradient at its output
 * after the activation; dy is overwritten with the gradient before the
 * activation (y: the forward's output). Writes dw (kh, kw, c, oc) and db
 * (oc) when not NULL, and dx (n, h, w, c) unless dx is NULL (a first
 * layer). accumulate != 0 ADDS to dw and db (gradient accumulation); dx is
 * always overwritten. x and w as the forward had them; the im2col matrix
 * (or Winograd's tiles) is rebuilt here, chunk by chunk, in the same
 * scratch as the forward's. */
void conv2d_backward(float *dx, float *dw, float *db, float *dy, const float *y, const float *x,
                     const float *w, int n, const conv_geom *g, act_type act, int accumulate,
                     float *scratch, size_t scratch_floats);

/* Max pooling over windows of g (oc == c): y (n, oh, ow, c); argmax
 * (n, oh, ow, c) records, for backward, the index within the example
 * (i * w * c + j * c + ch) of each window's maximum (the first one in
 * row-major order on ties; padding never wins: only input positions are
 * candidates, and TF's geometry leaves none of them empty). */
void maxpool_forward(float *y, int32_t *argmax, const float *x, int n, const conv_geom *g);
/* dx (n, h, w, c) = 0, then each dy added at its window's argmax (written
 * once per entry when the windows do not overlap: strides >= pool size). */
void maxpool_backward(float *dx, const float *dy, const int32_t *argmax, int n, const conv_geom *g);

/* Average pooling: the mean over each window's input positions (padding
 * not counted, as TensorFlow). */
void avgpool_forward(float *y, const float *x, int n, const conv_geom *g);
void avgpool_backward(float *dx, const float *dy, int n, const conv_geom *g);

/* Global average pooling: y (n, c) = mean of x (n, hw, c) over hw. */
void gap_forward(float *y, const float *x, int n, int hw, int c);
void gap_backward(float *dx, const float *dy, int n, int hw, int c);

/* Batch normalization over the last axis: x is (rows, c) (rows = n * h * w
 * for an image). Training: mean and biased variance over the rows (summed
 * in double), y = gamma * (x - mean) / sqrt(var + eps) + beta (gamma NULL:
 * 1, beta NULL: 0); mean (c) and invstd (c) keep what backward needs; the
 * moving statistics move: moving = momentum * moving + (1 - momentum) *
 * batch, with the variance's batch value unbiased (var * rows / (rows - 1),
 * as TensorFlow's fused kernel and PyTorch do; var when rows == 1).
 * moving_mean/moving_var NULL: not updated. rows == 0: mean 0, invstd
 * 1 / sqrt(eps), nothing moves. y may be x (in place). */
void bn_forward_train(float *y, float *mean, float *invstd, const float *x, long rows, int c,
                      const float *gamma, const float *beta, float eps, float momentum,
                      float *moving_mean, float *moving_var);
/* Inference: the moving statistics in place of the batch's. */
void bn_forward_eval(float *y, const float *x, long rows, int c, const float *gamma,
                     const float *beta, float eps, const float *moving_mean,
                     const float *moving_var);
/* Backward of bn_forward_train given dy (rows, c) at its output: writes dx
 * (rows, c) unless NULL, dgamma and dbeta (c) when not NULL (accumulate:
 * ADDS to them). x, mean and invstd as the forward left them (so x must
 * survive an in-place forward elsewhere); dx may be dy. */
void bn_backward(float *dx, float *dgamma, float *dbeta, const float *dy, const float *x,
                 const float *mean, const float *invstd, const float *gamma, long rows, int c,
                 int accumulate);

#endif
