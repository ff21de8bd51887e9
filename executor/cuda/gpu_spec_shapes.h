/* gpu_spec_shapes.h - what the spec parser resolves (spec/jobspec.c's
 * check_shapes), for job specs built in C: the GPU test and benchmark
 * (tests/check_gpu.c, bench/gpu/gpu_bench.c) link no spec parser in
 * `make gpu-build`, and the engines read each layer's resolved shapes.
 *
 * gpu_spec_resolve(s, err, cap) takes s->input_rank/input_shape and the
 * layers as given and fills s->input_size (a [h, w] input before a
 * convolutional first layer becomes [h, w, 1]), layers[0]'s input_shape,
 * every layer's in_rank/in_shape/out_rank/out_shape/params/non_trainable
 * and s->output_size; strides left 0 become (1, 1) for conv2d and the pool
 * size for pooling, a pool size left 0 becomes (2, 2). Returns 0, or -1
 * with a message. Plain C, header only.
 *
 * defines: gpu_spec_resolve */
#ifndef TRAINYARD_GPU_SPEC_SHAPES_H
#define TRAINYARD_GPU_SPEC_SHAPES_H

#include <stdio.h>
#include <string.h>

#include "../../spec/jobspec.h"

static inline int gpu_spec_resolve(jobspec *s, char *err, size_t cap)
{
    int rank = s->input_rank, shape[JOBSPEC_MAX_RANK] = {0, 0, 0, 0};
    long size = 1;
    if (rank < 1 || rank > JOBSPEC_MAX_RANK || s->n_layers < 1) {
        snprintf(err, cap, "input_rank %d / %d layers", rank, s->n_layers);
        return -1;
    }
    for (int d = 0; d < rank; d++)
        size *= s->input_shape[d];
    s->input_size = (int)size;
    s->layers[0].input_rank = rank;
    memcpy(s->layers[0].input_shape, s->input_shape, sizeof s->input_shape);
    layer_type t0 = s->layers[0].type;
    if (rank == 2 && (t0 == LAYER_CONV2D || t0 == LAYER_MAX_POOLING2D ||
                      t0 == LAYER_AVERAGE_POOLING2D || t0 == LAYER_GLOBAL_AVERAGE_POOLING2D)) {
        rank = s->input_rank = 3;
        s->input_shape[2] = 1;
    }
    memcpy(shape, s->input_shape, sizeof(int) * (size_t)rank);
    for (int i = 0; i < s->n_layers; i++) {
        layer_spec *l = &s->layers[i];
        int image = l->type == LAYER_CONV2D || l->type == LAYER_MAX_POOLING2D ||
                    l->type == LAYER_AVERAGE_POOLING2D || l->type == LAYER_GLOBAL_AVERAGE_POOLING2D;
        l->in_rank = rank;
        memset(l->in_shape, 0, sizeof l->in_shape);
        memcpy(l->in_shape, shape, sizeof(int) * (size_t)rank);
        l->params = 0;
        l->non_trainable = 0;
        if (image && rank != 3) {
            snprintf(err, cap, "layers[%d]: an image layer gets rank %d", i, rank);
            return -1;
        }
        switch (l->type) {
        case LAYER_FLATTEN:
            rank = 1;
            shape[0] = (int)size;
            break;
        case LAYER_DENSE:
            if (rank != 1) {
                snprintf(err, cap, "layers[%d]: dense gets rank %d", i, rank);
                return -1;
            }
            l->params = size * l->units + (l->use_bias ? l->units : 0);
            shape[0] = l->units;
            s->output_size = l->units;
            break;
        case LAYER_CONV2D:
        case LAYER_MAX_POOLING2D:
        case LAYER_AVERAGE_POOLING2D: {
            int conv = l->type == LAYER_CONV2D;
            int *k = conv ? l->kernel_size : l->pool_size;
            if (!conv && k[0] == 0 && k[1] == 0)
                k[0] = k[1] = 2;
            for (int d = 0; d < 2; d++)
                if (l->strides[d] == 0)
                    l->strides[d] = conv ? 1 : k[d];
            int out[2];
            for (int d = 0; d < 2; d++)
                out[d] = l->padding == PAD_SAME
                             ? (shape[d] + l->strides[d] - 1) / l->strides[d]
                             : (shape[d] >= k[d] ? (shape[d] - k[d]) / l->strides[d] + 1 : 0);
            if (out[0] < 1 || out[1] < 1) {
                snprintf(err, cap, "layers[%d]: the window does not fit", i);
                return -1;
            }
            int ch = conv ? l->filters : shape[2];
            if (conv)
                l->params = (long)k[0] * k[1] * shape[2] * l->filters +
                            (l->use_bias ? l->filters : 0);
            shape[0] = out[0];
            shape[1] = out[1];
            shape[2] = ch;
            break;
        }
        case LAYER_GLOBAL_AVERAGE_POOLING2D:
            rank = 1;
            shape[0] = shape[2];
            break;
        case LAYER_BATCH_NORMALIZATION: {
            int c = shape[rank - 1];
            l->params = (long)c * (l->center + l->scale);
            l->non_trainable = 2L * c;
            break;
        }
        case LAYER_RESHAPE: {
            long known = 1;
            int unknown = -1;
            for (int d = 0; d < l->target_rank; d++) {
                if (l->target_shape[d] < 0)
                    unknown = d;
                else
                    known *= l->target_shape[d];
            }
            if (l->target_rank < 1 || known <= 0 ||
                (unknown < 0 ? known != size : size % known != 0)) {
                snprintf(err, cap, "layers[%d]: reshape target does not hold %ld values", i, size);
                return -1;
            }
            rank = l->target_rank;
            for (int d = 0; d < rank; d++)
                shape[d] = d == unknown ? (int)(size / known) : l->target_shape[d];
            break;
        }
        case LAYER_DROPOUT:
        case LAYER_ACTIVATION:
            break;
        }
        size = 1;
        for (int d = 0; d < rank; d++)
            size *= shape[d];
        l->out_rank = rank;
        memset(l->out_shape, 0, sizeof l->out_shape);
        memcpy(l->out_shape, shape, sizeof(int) * (size_t)rank);
    }
    return 0;
}

#endif
