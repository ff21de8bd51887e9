/* gpu_conv.h - the GPU engine's convolutional kernels (gpu_conv.cu), the
 * counterparts of executor/nn/conv.h: im2col and its gather-back (col2im)
 * around cuBLAS GEMMs for conv2d, max and average pooling, global average
 * pooling, batch normalization, and the per-channel column sums they need.
 * For gpu_model.cu (C++, internal): each launcher queues its kernels on
 * stream s and returns cudaGetLastError() (check it with cudaCheck).
 *
 * Channels last, as executor/nn: an example is (h, w, c) row-major; a batch
 * of n is (n, h, w, c); the im2col matrix of n examples is (n * oh * ow, K)
 * with K = kh * kw * c in the kernel's (kh, kw, c_in) order, so that
 * y (n * oh * ow, oc) = col . W (K, oc) is one row-major GEMM. Padding as
 * TensorFlow (conv.h's conv_geom_init).
 *
 * Backward kernels GATHER (each input element sums what reaches it, in
 * the order a raster scatter over the outputs would add it): no atomics,
 * the same result every run, so a CUDA graph replays bit-identically.
 *
 * Per-channel sums over rows (conv bias gradient, batch-norm statistics and
 * backward) run in two stages: GPU_RED_GROUPS row groups each write their
 * partial sums in double to `part` (gpu_red_doubles(c) doubles), then one
 * thread per channel adds the groups in order.
 *
 * defines: gpu_red_doubles, gpu_im2col, gpu_col2im,
 *          gpu_maxpool_forward/backward, gpu_avgpool_forward/backward,
 *          gpu_gap_forward/backward, gpu_bias_grad_rows, gpu_bn_forward_train,
 *          gpu_bn_forward_eval, gpu_bn_backward */
#ifndef TRAINYARD_GPU_CONV_H
#define TRAINYARD_GPU_CONV_H

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime.h>

#include "../../spec/jobspec.h"
#ifdef __cplusplus
extern "C" {
#endif
#include "../nn/conv.h"
#ifdef __cplusplus
}
#endif

/* A conv2d or pooling window over one example (conv.h's conv_geom). */
/* The window geometry is the CPU kernels' (conv.h's conv_geom and
 * conv_geom_init: TensorFlow's padding), so both engines size a layer the
 * same way. */
typedef conv_geom gpu_geom;

#define GPU_RED_GROUPS 128
/* Doubles of `part` a per-channel sum over c channels needs. */
static inline size_t gpu_red_doubles(int c) { return (size_t)GPU_RED_GROUPS * (size_t)c * 2; }

/* col (n * oh * ow, kh * kw * c) from x (n, h, w, c); padding reads 0. */
cudaError_t gpu_im2col(float *col, const float *x, int n, const gpu_geom *g, cudaStream_t s);
/* dx (n, h, w, c) = the sum of every col entry im2col read from it
 * (col: (n * oh * ow, K), the gradient at the im2col matrix). */
cudaError_t gpu_col2im(float *dx, const float *col, int n, const gpu_geom *g, cudaStream_t s);

/* Max pooling (oc == c): y (n, oh, ow, c) and argmax (n, oh, ow, c), the
 * index in the example (i * w * c + j * c + ch) of each window's maximum,
 * the first on ties; padding never wins. */
cudaError_t gpu_maxpool_forward(float *y, int32_t *argmax, const float *x, int n,
                                const gpu_geom *g, cudaStream_t s);
/* dx (n, h, w, c): each element the sum of the dy whose argmax it is. */
cudaError_t gpu_maxpool_backward(float *dx, const float *dy, const int32_t *argmax, int n,
                                 const gpu_geom *g, cudaStream_t s);
/* Average pooling over each window's input positions (padding not counted). */
cudaError_t gpu_avgpool_forward(float *y, const float *x, int n, const gpu_geom *g,
                                cudaStream_t s);
cudaError_t gpu_avgpool_backward(float *dx, const float *dy, int n, const gpu_geom *g,
                                 cudaStream_t s);
/* Global average pooling: y (n, c) = mean of x (n, hw, c) over hw. */
cudaError_t gpu_gap_forward(float *y, const float *x, int n, int hw, int c, cudaStream_t s);
cudaError_t gpu_gap_backward(float *dx, const float *dy, int n, int hw, int c, cudaStream_t s);

/* A conv's bias gradient from dy (rows, c): relu_y != NULL first makes dy
 * the relu's input gradient in place (dy = relu_y > 0 ? dy : 0, relu_y the
 * conv's output); db (c) = column sums of dy, added to db when accumulate. */
cudaError_t gpu_bias_grad_rows(float *dy, const float *relu_y, float *db, long long rows, int c,
                               int accumulate, double *part, cudaStream_t s);

/* Batch normalization over the last axis of x (rows, c), training: mean and
 * biased variance of the rows (one pass in double, shifted by each
 * channel's first value, as conv.c), y = (x - mean) * (invstd * gamma) + beta
 * (gamma/beta NULL: 1/0); mean and invstd (c) kept for backward; moving =
 * momentum * moving + (1 - momentum) * batch (the variance unbiased:
 * var * rows / (rows - 1); var when rows == 1). */
cudaError_t gpu_bn_forward_train(float *y, float *mean, float *invstd, const float *x,
                                 long long rows, int c, const float *gamma, const float *beta,
                                 float eps, float momentum, float *moving_mean,
                                 float *moving_var, double *part, cudaStream_t s);
/* Inference: the moving statistics in place of the batch's. */
cudaError_t gpu_bn_forward_eval(float *y, const float *x, long long rows, int c,
                                const float *gamma, const float *beta, float eps,
                                const float *moving_mean, const float *moving_var,
                                cudaStream_t s);
/* Backward given dy (rows, c): dgamma/dbeta (c) when not NULL (accumulate:
 * added), dx (rows, c) when not NULL (dx may be dy: in place). sums: 2c
 * floats of scratch (mean dy, mean dy * xhat per channel). */
cudaError_t gpu_bn_backward(float *dx, float *dgamma, float *dbeta, const float *dy,
                            const float *x, const float *mean, const float *invstd,
                            const float *gamma, long long rows, int c, int accumulate,
                            float *sums, double *part, cudaStream_t s);

#endif
