/* gpu_model.cu - the training engine on a CUDA device (see gpu_model.h).
 *
 * The model is executor/nn/model.c's, op for op: the same fusions (a relu
 * dense followed by dropout is one pass; a final softmax/sigmoid is handed
 * to the loss), the same flat buffers (parameter layout taken from a CPU
 * model_build, checked tensor by tensor), the same dropout keys (nn_rng.h)
 * and the same update arithmetic (optimizer.c). GEMMs through cuBLAS
 * (row-major tensors as column-major transposes); everything else is a few
 * small kernels below. Per-step scalars the kernels need (the iteration,
 * row offset, global batch, Adam's step size, dropout seeds) live in a
 * device struct, so a captured CUDA graph replays unchanged step after step.
 *
 * Convolutional layers (executor/nn/conv.h's): conv2d is im2col
 * (gpu_conv.cu) + one cublasSgemm per chunk of examples, its input gradient
 * a second GEMM into the im2col matrix's shape gathered back by col2im (a
 * 1x1 stride-1 conv uses its input as the matrix); pooling, global average
 * pooling and batch normalization are gpu_conv.cu's kernels. Batch
 * normalization's moving statistics live in a second flat device buffer in
 * model.h's model_state layout and move in every training forward (inside
 * the captured graph too).
 *
 * Sections: device helpers, kernels, the step (forward, loss, backward,
 * update), build/free, batches, public API. */
#include "gpu_model.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "gpu_conv.h"

extern "C" {
#include "../nn/loss.h"
#include "../nn/nn_rng.h"
}

#define NSLOT 2                 /* batch slots: one trains while the next is copied */
#define BLOCK 256
#define ALIGN_FLOATS 16         /* model.c's 64-byte tensor alignment */
#define BLAS_WORKSPACE (32u << 20) /* cuBLAS workspace (graph capture needs our own) */
#define SIG_MAX 4096
#define COL_BUDGET (1u << 25)   /* floats of conv2d's im2col scratch (128 MiB) before chunking */

/* ================================================================ state */

/* Scalars read by the kernels, in device memory (one per model). */
typedef struct gstate {
    long long iterations;       /* optimizer updates done: dropout step, Adam t - 1 */
    long long row0;             /* global row of the batch's first example */
    int global_batch;           /* loss scaling */
    float reg_scale;            /* 1 / replicas */
    float alpha;                /* Adam's step size of the update in progress */
    int pad_;
    double loss_sum;            /* training stats since the last reset */
    long long correct;
    long long seen;
    double reg_sum;             /* regularization value of the pass in progress */
    double eval_loss;           /* evaluation accumulators */
    long long eval_correct;
    unsigned long long seeds[JOBSPEC_MAX_LAYERS]; /* dropout seed of each dropout op */
} gstate;

typedef struct gop {
    layer_type type;
    act_type act;               /* activation to run (LINEAR when the loss took it) */
    int in, out;
    int use_bias;
    int own_output;
    int fused_next;             /* dense: the next op (dropout) is fused into this one */
    int fused_into_prev;        /* dropout: done by the previous dense */
    float rate, scale;          /* dropout (own, or the fused one for a dense) */
    uint32_t thr;               /* keep when u32 < thr */
    int key_layer;              /* the dropout op's index: key and seed slot */
    int has_seed;
    uint64_t seed;
    float l1, l2;
    int kernel_tensor;
    long long kcount;           /* dense, conv2d: kernel floats (the regularizer's) */
    float *w, *b, *dw, *db;     /* device, into the flat buffers */
    float *y;                   /* device (max_batch, out) own output, or NULL */
    /* convolutional layers */
    gpu_geom geom;              /* conv2d, pooling: the window over one example */
    int direct;                 /* conv2d 1x1 stride 1: the input is its im2col matrix */
    int chunk;                  /* conv2d: examples per im2col chunk */
    int hw;                     /* global average pooling: positions per example */
    int ch;                     /* batch normalization: channels (the input's last axis) */
    float momentum, eps;        /* batch normalization */
    int gamma_tensor, beta_tensor; /* batch normalization: tensor index, -1 when absent */
    int state_tensor;           /* batch normalization: moving_mean's state tensor (+1: variance) */
    float *gamma, *beta, *dgamma, *dbeta; /* NULL when absent */
    float *mmean, *mvar;        /* into the state buffer */
    float *bmean, *binvstd;     /* the last training batch's mean and 1/std (ch) */
    float *bsums;               /* backward's per-channel sums (2 ch) */
    int32_t *argmax;            /* max pooling: (max_batch, out) */
} gop;

struct gpu_model {
    int device;
    gpu_options opt;
    int n_ops;
    gop ops[JOBSPEC_MAX_LAYERS];
    int first_param_op;
    int in_size, out_size, max_width, max_batch;
    loss_type loss;
    int fused;
    act_type final_act;
    optimizer_spec optspec;
    int n_slots;
    int n_tensors;
    model_tensor tensors[MODEL_MAX_TENSORS];
    size_t n_params;
    int n_state_tensors;        /* model_state's tensors (moving statistics) */
    model_tensor state_tensors[MODEL_MAX_TENSORS];
    size_t n_state;
    char signature[SIG_MAX];
    uint64_t rng[4];
    long iterations;            /* host mirror of st->iterations */
    int global_batch;           /* last value sent to st->global_batch */

    cudaStream_t stream, copy_stream;
    cublasHandle_t blas;
    void *blas_ws;
    float *params, *grads, *slots; /* device, model.h's flat layout */
    float *state;               /* device, model_state's flat layout (n_state floats) */
    float *acts;                /* every op's own output */
    float *col;                 /* conv2d's im2col matrix (and its gradient), col_floats */
    size_t col_floats;
    double *part;               /* per-channel partial sums (gpu_conv.h) */
    size_t part_doubles;
    float *bnbuf;               /* batch normalization's batch statistics and sums */
    int32_t *argmax;            /* max pooling's argmax of every maxpool op */
    float *gbuf[2];             /* (max_batch, max_width) ping-pong gradients */
    float *bx[NSLOT], *by[NSLOT];  /* device batch slots */
    float *hx[NSLOT], *hy[NSLOT];  /* pinned host staging */
    int slot_n[NSLOT];
    long staged, consumed;      /* batches committed / trained on */
    int stage_open;             /* stage_next handed out a slot not yet committed */
    cudaEvent_t copied[NSLOT], freed[NSLOT];
    float *ex, *ey;             /* evaluation input (max_batch) */
    double *row_loss;           /* (max_batch) */
    int *row_correct;           /* (max_batch) */
    gstate *st;                 /* device */
    cudaGraphExec_t graph[NSLOT];
    int have_graph;
};

/* ================================================================ device helpers */

/* The dropout keys of executor/nn/nn_rng.h (nn_mix64, nn_dropout_row_key,
 * nn_dropout_u32), copied for device code: keep the two in step. */
__device__ __forceinline__ uint64_t d_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

__device__ __forceinline__ uint64_t d_dropout_row_key(uint64_t seed, int layer, long long step,
                                                      long long row)
{
    uint64_t k = d_mix64(seed ^ (0x5851f42d4c957f2dULL * (uint64_t)(layer + 1)));
    k = d_mix64(k + (uint64_t)step);
    return d_mix64(k + (uint64_t)row);
}

__device__ __forceinline__ uint32_t d_dropout_u32(uint64_t row_key, int j)
{
    uint64_t r = d_mix64(row_key + (uint64_t)(j >> 1) * 0x9e3779b97f4a7c15ULL);
    return (j & 1) ? (uint32_t)(r >> 32) : (uint32_t)r;
}

/* The keep draw of unit j of batch row i at the current step. */
__device__ __forceinline__ uint32_t d_keep_u32(const gstate *st, int layer, int i, int j)
{
    uint64_t rk = d_dropout_row_key(st->seeds[layer], layer, st->iterations, st->row0 + i);
    return d_dropout_u32(rk, j);
}

__device__ __forceinline__ float d_sigmoid(float v)
{
    if (v >= 0.0f)
        return 1.0f / (1.0f + expf(-v));
    float e = expf(v);
    return e / (1.0f + e);
}

__device__ __forceinline__ float d_act(float v, int act)
{
    switch (act) {
    case ACT_RELU: return v > 0.0f ? v : 0.0f;
    case ACT_SIGMOID: return d_sigmoid(v);
    case ACT_TANH: return tanhf(v);
    default: return v;
    }
}

static unsigned grid_for(long long total)
{
    long long b = (total + BLOCK - 1) / BLOCK;
    if (b < 1)
        b = 1;
    return (unsigned)(b > 65535 * 8 ? 65535 * 8 : b);
}

#define GRID_STRIDE(i, total) \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (total); \
         i += (long long)gridDim.x * blockDim.x)

/* ================================================================ kernels */

__global__ void k_set_i64(long long *p, long long v) { *p = v; }
__global__ void k_set_i32(int *p, int v) { *p = v; }
__global__ void k_set_f32(float *p, float v) { *p = v; }
__global__ void k_set_u64(unsigned long long *p, unsigned long long v) { *p = v; }

/* y (n, out) = act(y + b), with the fused inverted dropout when thr != 0
 * (relu only, as layers.c's dense_forward). Softmax is done by k_softmax. */
__global__ void k_bias_act(float *y, const float *b, int n, int out, int act, int drop,
                           uint32_t thr, float scale, const gstate *st, int layer)
{
    long long total = (long long)n * out;
    GRID_STRIDE(idx, total) {
        int i = (int)(idx / out), j = (int)(idx % out);
        float v = y[idx];
        if (b)
            v += b[j];
        if (act == ACT_RELU) {
            v = v > 0.0f ? v : 0.0f;
            if (drop)
                v = d_keep_u32(st, layer, i, j) < thr ? v * scale : 0.0f;
        } else {
            v = d_act(v, act);
        }
        y[idx] = v;
    }
}

/* y = act(x) elementwise (an Activation layer; softmax: k_softmax). */
__global__ void k_act(float *y, const float *x, long long total, int act)
{
    GRID_STRIDE(idx, total) y[idx] = d_act(x[idx], act);
}

/* Row softmax of x (n, k) into y (may alias), as layers.c's softmax_row. */
__global__ void k_softmax(float *y, const float *x, int n, int k)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    const float *xr = x + (long long)i * k;
    float *yr = y + (long long)i * k;
    float m = xr[0];
    for (int j = 1; j < k; j++)
        m = xr[j] > m ? xr[j] : m;
    float s = 0.0f;
    for (int j = 0; j < k; j++) {
        float e = expf(xr[j] - m);
        yr[j] = e;
        s += e;
    }
    float inv = 1.0f / s;
    for (int j = 0; j < k; j++)
        yr[j] *= inv;
}

/* A standalone dropout: y = x * (keep ? scale : 0). */
__global__ void k_dropout_fwd(float *y, const float *x, int n, int k, uint32_t thr, float scale,
                              const gstate *st, int layer)
{
    long long total = (long long)n * k;
    GRID_STRIDE(idx, total) {
        int i = (int)(idx / k), j = (int)(idx % k);
        float m = d_keep_u32(st, layer, i, j) < thr ? scale : 0.0f;
        y[idx] = x[idx] * m;
    }
}

/* Its backward: the same mask, recomputed from the key (no stored mask). */
__global__ void k_dropout_bwd(float *dy, int n, int k, uint32_t thr, float scale,
                              const gstate *st, int layer)
{
    long long total = (long long)n * k;
    GRID_STRIDE(idx, total) {
        int i = (int)(idx / k), j = (int)(idx % k);
        float m = d_keep_u32(st, layer, i, j) < thr ? scale : 0.0f;
        dy[idx] *= m;
    }
}

/* dy becomes the gradient before an elementwise activation, given its output y. */
__global__ void k_act_bwd(float *dy, const float *y, long long total, int act)
{
    GRID_STRIDE(idx, total) {
        float v = y[idx], d = dy[idx];
        switch (act) {
        case ACT_RELU: d = v > 0.0f ? d : 0.0f; break;
        case ACT_SIGMOID: d *= v * (1.0f - v); break;
        case ACT_TANH: d *= 1.0f - v * v; break;
        default: break;
        }
        dy[idx] = d;
    }
}

__global__ void k_softmax_bwd(float *dy, const float *y, int n, int k)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    float *d = dy + (long long)i * k;
    const float *p = y + (long long)i * k;
    float dot = 0.0f;
    for (int j = 0; j < k; j++)
        dot += d[j] * p[j];
    for (int j = 0; j < k; j++)
        d[j] = p[j] * (d[j] - dot);
}

#define BG_X 32
#define BG_Y 16
/* A dense layer's pre-activation gradient and bias gradient in one pass:
 * relu != 0: dy = y > 0 ? dy * scale : 0 (relu, and the fused dropout's
 * scale; the dropped units have y == 0); then db = column sums of dy (when
 * db != NULL; accum != 0 adds them to db: gradient accumulation). Block
 * (BG_X, BG_Y) over a tile of BG_X columns. */
__global__ void k_bias_grad(float *dy, const float *y, float *db, int n, int out, int relu,
                            float scale, int accum)
{
    __shared__ float part[BG_Y][BG_X + 1];
    int j = blockIdx.x * BG_X + threadIdx.x;
    float acc = 0.0f;
    if (j < out) {
        for (int i = threadIdx.y; i < n; i += BG_Y) {
            long long idx = (long long)i * out + j;
            float d = dy[idx];
            if (relu) {
                d = y[idx] > 0.0f ? d * scale : 0.0f;
                dy[idx] = d;
            }
            acc += d;
        }
    }
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && j < out && db) {
        float s = 0.0f;
        for (int r = 0; r < BG_Y; r++)
            s += part[r][threadIdx.x];
        db[j] = accum ? db[j] + s : s;
    }
}

/* ---- losses: loss.c's loss_forward_backward, one thread per example ---- */

__device__ __forceinline__ int d_label_class(float y, int k)
{
    if (!(y >= 0.0f))
        return 0;
    int c = (int)y;
    return c >= k ? k - 1 : c;
}

__device__ __forceinline__ float d_target(float y, int j, int k, int c)
{
    return k == 1 ? y : (j == c ? 1.0f : 0.0f);
}

__device__ __forceinline__ float d_clamp(float v, float lo, float hi)
{
    return v < lo ? lo : (v > hi ? hi : v);
}

/* out (n, k) the output (logits when fused), y (n) labels; dout (n, k) the
 * gradient of sum(loss)/global_batch, or NULL; row_loss/row_correct per row. */
__global__ void k_loss(int loss, int fused, const float *out, const float *y, int n, int k,
                       float *dout, double *row_loss, int *row_correct, const gstate *st)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    const float invb = 1.0f / (float)(st->global_batch > 0 ? st->global_batch : 1);
    const float eps = 1e-7f; /* NN_EPSILON */
    const float *o = out + (long long)i * k;
    float *d = dout ? dout + (long long)i * k : NULL;
    int c = d_label_class(y[i], k);
    int right;
    if (k == 1) {
        float thr = (fused && loss == LOSS_BINARY_CROSSENTROPY) ? 0.0f : 0.5f;
        right = (o[0] > thr) == (y[i] > 0.5f);
    } else {
        int best = 0;
        for (int j = 1; j < k; j++)
            if (o[j] > o[best])
                best = j;
        right = best == c;
    }
    double total = 0.0;
    if (fused && (loss == LOSS_CATEGORICAL_CROSSENTROPY ||
                  loss == LOSS_SPARSE_CATEGORICAL_CROSSENTROPY)) {
        float m = o[0];
        for (int j = 1; j < k; j++)
            m = o[j] > m ? o[j] : m;
        float s = 0.0f;
        for (int j = 0; j < k; j++)
            s += expf(o[j] - m);
        total = (double)(logf(s) + m - o[c]);
        if (d) {
            float inv = invb / s;
            for (int j = 0; j < k; j++)
                d[j] = expf(o[j] - m) * inv;
            d[c] -= invb;
        }
    } else if (fused && loss == LOSS_BINARY_CROSSENTROPY) {
        double s = 0.0;
        float invk = invb / (float)k;
        for (int j = 0; j < k; j++) {
            float u = o[j], t = d_target(y[i], j, k, c);
            s += (double)(fmaxf(u, 0.0f) - u * t + log1pf(expf(-fabsf(u))));
            if (d) {
                float p = u >= 0.0f ? 1.0f / (1.0f + expf(-u)) : expf(u) / (1.0f + expf(u));
                d[j] = (p - t) * invk;
            }
        }
        total = s / k;
    } else if (loss == LOSS_BINARY_CROSSENTROPY) {
        double s = 0.0;
        float invk = invb / (float)k;
        for (int j = 0; j < k; j++) {
            float t = d_target(y[i], j, k, c);
            float p = d_clamp(o[j], eps, 1.0f - eps);
            s -= (double)(t * logf(p + eps) + (1.0f - t) * logf(1.0f - p + eps));
            if (d) {
                int inside = o[j] > eps && o[j] < 1.0f - eps;
                d[j] = inside ? -(t / (p + eps) - (1.0f - t) / (1.0f - p + eps)) * invk : 0.0f;
            }
        }
        total = s / k;
    } else if (loss == LOSS_CATEGORICAL_CROSSENTROPY ||
               loss == LOSS_SPARSE_CATEGORICAL_CROSSENTROPY) {
        float s = 0.0f;
        for (int j = 0; j < k; j++)
            s += o[j];
        float q = o[c] / s;
        float p = d_clamp(q, eps, 1.0f - eps);
        total = -(double)logf(p);
        if (d) {
            int inside = q > eps && q < 1.0f - eps;
            for (int j = 0; j < k; j++)
                d[j] = inside ? invb / s : 0.0f;
            if (inside)
                d[c] -= invb / o[c];
        }
    } else { /* LOSS_MSE */
        double s = 0.0;
        float gsc = 2.0f * invb / (float)k;
        for (int j = 0; j < k; j++) {
            float e = o[j] - d_target(y[i], j, k, c);
            s += (double)e * e;
            if (d)
                d[j] = gsc * e;
        }
        total = s / k;
    }
    row_loss[i] = total;
    row_correct[i] = right;
}

/* Sums the per-row losses and hits into the training (eval == 0) or the
 * evaluation accumulators. One block. */
__global__ void k_reduce_stats(const double *row_loss, const int *row_correct, int n, gstate *st,
                               int eval)
{
    __shared__ double sl[BLOCK];
    __shared__ long long sc[BLOCK];
    double l = 0.0;
    long long c = 0;
    for (int i = threadIdx.x; i < n; i += BLOCK) {
        l += row_loss[i];
        c += row_correct[i];
    }
    sl[threadIdx.x] = l;
    sc[threadIdx.x] = c;
    __syncthreads();
    for (int s = BLOCK / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) {
            sl[threadIdx.x] += sl[threadIdx.x + s];
            sc[threadIdx.x] += sc[threadIdx.x + s];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        if (eval) {
            st->eval_loss += sl[0];
            st->eval_correct += sc[0];
        } else {
            st->loss_sum += sl[0];
            st->correct += sc[0];
            st->seen += n;
        }
    }
}

/* A kernel regularizer (model.c's regularize): dw += reg_scale * d(l1|w| +
 * l2 w^2)/dw when dw != NULL; adds l1 sum|w| + l2 sum w^2 to st->reg_sum. */
__global__ void k_regularize(const float *w, float *dw, long long count, float l1, float l2,
                             gstate *st)
{
    __shared__ double red[BLOCK];
    const float sc = st->reg_scale;
    double a1 = 0.0, a2 = 0.0;
    GRID_STRIDE(i, count) {
        float v = w[i];
        a1 += fabsf(v);
        a2 += v * v;
        if (dw)
            dw[i] += sc * (l1 * (float)((v > 0.0f) - (v < 0.0f)) + 2.0f * l2 * v);
    }
    red[threadIdx.x] = (double)l1 * a1 + (double)l2 * a2;
    __syncthreads();
    for (int s = BLOCK / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s)
            red[threadIdx.x] += red[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        atomicAdd(&st->reg_sum, red[0]);
}

/* After a training pass: loss_sum gets the regularization once per example
 * (as model.c's step_stats). */
__global__ void k_reg_finish(gstate *st, int n)
{
    st->loss_sum += st->reg_sum * n;
    st->reg_sum = 0.0;
}

/* Before an update: Adam's step size from the iteration count (optimizer.c's
 * adam_step, in double as there), then the iteration is counted. */
__global__ void k_pre_update(gstate *st, int adam, float lr, float b1, float b2)
{
    if (adam) {
        double t = (double)st->iterations + 1.0;
        double b1p = pow((double)b1, t), b2p = pow((double)b2, t);
        st->alpha = (float)((double)lr * sqrt(1.0 - b2p) / (1.0 - b1p));
    }
    st->iterations += 1;
}

/* optimizer.c's optimizer_step, one thread per parameter: the scalar loops'
 * arithmetic. Slot s of parameter i at slots[s * stride + i]. */
__global__ void k_optimizer(optimizer_spec o, float *w, const float *g, float *slots,
                            long long n, long long stride, const gstate *st)
{
    GRID_STRIDE(i, n) {
        const float gi = g[i];
        switch (o.type) {
        case OPT_SGD: {
            const float lr = o.learning_rate, mu = o.momentum;
            if (mu == 0.0f) {
                w[i] -= lr * gi;
            } else if (o.nesterov) {
                float v = mu * slots[i] - lr * gi;
                slots[i] = v;
                w[i] += mu * v - lr * gi;
            } else {
                float v = mu * slots[i] - lr * gi;
                slots[i] = v;
                w[i] += v;
            }
            break;
        }
        case OPT_RMSPROP: {
            const float lr = o.learning_rate, rho = o.rho, eps = o.epsilon, mu = o.momentum;
            float *vel = slots;
            float *avg = o.centered ? slots + stride : NULL;
            float *mom = mu != 0.0f ? slots + stride * (o.centered ? 2 : 1) : NULL;
            float v = rho * vel[i] + (1.0f - rho) * gi * gi;
            vel[i] = v;
            float den = v;
            if (avg) {
                float a = rho * avg[i] + (1.0f - rho) * gi;
                avg[i] = a;
                den = v - a * a;
            }
            float inc = lr * gi / sqrtf(den + eps);
            if (mom) {
                float mm = mu * mom[i] + inc;
                mom[i] = mm;
                w[i] -= mm;
            } else {
                w[i] -= inc;
            }
            break;
        }
        case OPT_ADAM: {
            const float b1 = o.beta_1, b2 = o.beta_2, eps = o.epsilon, alpha = st->alpha;
            float *m = slots, *v = slots + stride;
            float mi = m[i] + (gi - m[i]) * (1.0f - b1);
            float vi = v[i] + (gi * gi - v[i]) * (1.0f - b2);
            m[i] = mi;
            v[i] = vi;
            if (o.amsgrad) {
                float *vh = slots + 2 * stride;
                vi = vh[i] > vi ? vh[i] : vi;
                vh[i] = vi;
            }
            w[i] -= (mi * alpha) / (sqrtf(vi) + eps);
            break;
        }
        case OPT_ADAGRAD: {
            const float lr = o.learning_rate, eps = o.epsilon;
            float a = slots[i] + gi * gi;
            slots[i] = a;
            w[i] -= lr * gi / sqrtf(a + eps);
            break;
        }
        }
    }
}

/* ================================================================ the step */

/* Row-major GEMMs as cuBLAS column-major transposes (see docs/gpu.md). */
static cublasStatus_t gemm_forward(gpu_model *g, const float *x, const float *w, float *y,
                                   int n, int in, int out)
{
    const float one = 1.0f, zero = 0.0f; /* y (n, out) = x (n, in) . w (in, out) */
    return cublasSgemm(g->blas, CUBLAS_OP_N, CUBLAS_OP_N, out, n, in, &one, w, out, x, in,
                       &zero, y, out);
}

static cublasStatus_t gemm_weight_grad(gpu_model *g, const float *x, const float *dy, float *dw,
                                       int n, int in, int out, int accumulate)
{
    /* dw (in, out) = x^T (in, n) . dy (n, out) [+ dw when accumulating] */
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    return cublasSgemm(g->blas, CUBLAS_OP_N, CUBLAS_OP_T, out, in, n, &one, dy, out, x, in,
                       &beta, dw, out);
}

static cublasStatus_t gemm_input_grad(gpu_model *g, const float *dy, const float *w, float *dx,
                                      int n, int in, int out)
{
    const float one = 1.0f, zero = 0.0f; /* dx (n, in) = dy (n, out) . w^T (out, in) */
    return cublasSgemm(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, in, n, out, &one, w, out, dy, out,
                       &zero, dx, in);
}

static unsigned rows_grid(int n) { return (unsigned)((n + 127) / 128); }

/* conv2d forward of n examples x (n, h, w, c) into op->y: per chunk of
 * examples im2col + y = col . W (the GEMM of a dense layer over n * oh * ow
 * rows), then bias + activation in one pass. */
static int conv_forward(gpu_model *g, const gop *op, const float *x, int n, char *err)
{
    const gpu_geom *ge = &op->geom;
    const int K = ge->kh * ge->kw * ge->c, per = ge->oh * ge->ow;
    for (int c0 = 0; c0 < n; c0 += op->chunk) {
        int nb = n - c0 < op->chunk ? n - c0 : op->chunk;
        const float *xin = x + (size_t)c0 * op->in, *a = xin;
        if (!op->direct) {
            cudaCheck(gpu_im2col(g->col, xin, nb, ge, g->stream));
            a = g->col;
        }
        cublasCheck(gemm_forward(g, a, op->w, op->y + (size_t)c0 * op->out, nb * per, K, ge->oc));
    }
    if (op->b || op->act != ACT_LINEAR) {
        long long total = (long long)n * op->out;
        k_bias_act<<<grid_for(total), BLOCK, 0, g->stream>>>(op->y, op->b, n * per, ge->oc, op->act,
                                                            0, UINT32_MAX, 1.0f, g->st, 0);
        cudaCheckLast();
    }
    return 0;
fail:
    return -1;
}

/* conv2d backward given dy (n, oh, ow, oc) at its output (after the
 * activation; overwritten with the gradient before it): db, dW (added to
 * when accumulate) and, when dx != NULL, dx (n, h, w, c) through the
 * im2col matrix's gradient (dY . W^T) and col2im. x: the forward's input. */
static int conv_backward(gpu_model *g, gop *op, float *dy, const float *x, float *dx, int n,
                         int accumulate, char *err)
{
    const gpu_geom *ge = &op->geom;
    const int K = ge->kh * ge->kw * ge->c, per = ge->oh * ge->ow;
    long long total = (long long)n * op->out;
    if (op->act != ACT_LINEAR && !(op->act == ACT_RELU && op->db)) {
        k_act_bwd<<<grid_for(total), BLOCK, 0, g->stream>>>(dy, op->y, total, op->act);
        cudaCheckLast();
    }
    if (op->db) /* with relu: its derivative in the same pass */
        cudaCheck(gpu_bias_grad_rows(dy, op->act == ACT_RELU ? op->y : NULL, op->db,
                                     (long long)n * per, ge->oc, accumulate, g->part, g->stream));
    for (int c0 = 0; c0 < n; c0 += op->chunk) {
        int nb = n - c0 < op->chunk ? n - c0 : op->chunk, rows = nb * per;
        int acc = accumulate || c0 > 0;
        const float *xin = x + (size_t)c0 * op->in;
        const float *dyc = dy + (size_t)c0 * op->out;
        float *dxc = dx ? dx + (size_t)c0 * op->in : NULL;
        if (op->direct) {
            cublasCheck(gemm_weight_grad(g, xin, dyc, op->dw, rows, K, ge->oc, acc));
            if (dxc)
                cublasCheck(gemm_input_grad(g, dyc, op->w, dxc, rows, K, ge->oc));
            continue;
        }
        cudaCheck(gpu_im2col(g->col, xin, nb, ge, g->stream));
        cublasCheck(gemm_weight_grad(g, g->col, dyc, op->dw, rows, K, ge->oc, acc));
        if (dxc) { /* the matrix's gradient reuses its buffer (stream order) */
            cublasCheck(gemm_input_grad(g, dyc, op->w, g->col, rows, K, ge->oc));
            cudaCheck(gpu_col2im(dxc, g->col, nb, ge, g->stream));
        }
    }
    return 0;
fail:
    return -1;
}

/* Batch normalization's rows: every position of every example. */
static long long bn_rows(const gop *op, int n) { return (long long)n * (op->out / op->ch); }

/* Queues the forward pass of n examples at x (device) on the model's stream.
 * inputs[i] gets op i's input; *outp the output (n, out_size). */
static int enqueue_forward(gpu_model *g, const float *x, int n, int training,
                           const float **inputs, const float **outp, char *err)
{
    const float *cur = x;
    for (int i = 0; i < g->n_ops; i++) {
        gop *op = &g->ops[i];
        long long total = (long long)n * op->out;
        inputs[i] = cur;
        switch (op->type) {
        case LAYER_DENSE: {
            int drop = training && op->fused_next && op->rate > 0.0f;
            int act = op->act == ACT_SOFTMAX ? ACT_LINEAR : op->act;
            cublasCheck(gemm_forward(g, cur, op->w, op->y, n, op->in, op->out));
            if (op->b || act != ACT_LINEAR) {
                k_bias_act<<<grid_for(total), BLOCK, 0, g->stream>>>(
                    op->y, op->b, n, op->out, act, drop, op->thr, op->scale, g->st, op->key_layer);
                cudaCheckLast();
            }
            if (op->act == ACT_SOFTMAX) {
                k_softmax<<<rows_grid(n), 128, 0, g->stream>>>(op->y, op->y, n, op->out);
                cudaCheckLast();
            }
            cur = op->y;
            break;
        }
        case LAYER_DROPOUT:
            if (op->fused_into_prev || !training || op->rate <= 0.0f)
                break;
            k_dropout_fwd<<<grid_for(total), BLOCK, 0, g->stream>>>(
                op->y, cur, n, op->out, op->thr, op->scale, g->st, op->key_layer);
            cudaCheckLast();
            cur = op->y;
            break;
        case LAYER_ACTIVATION:
            if (!op->own_output)
                break;
            if (op->act == ACT_SOFTMAX)
                k_softmax<<<rows_grid(n), 128, 0, g->stream>>>(op->y, cur, n, op->out);
            else
                k_act<<<grid_for(total), BLOCK, 0, g->stream>>>(op->y, cur, total, op->act);
            cudaCheckLast();
            cur = op->y;
            break;
        case LAYER_CONV2D:
            if (conv_forward(g, op, cur, n, err))
                return -1;
            cur = op->y;
            break;
        case LAYER_MAX_POOLING2D:
            cudaCheck(gpu_maxpool_forward(op->y, op->argmax, cur, n, &op->geom, g->stream));
            cur = op->y;
            break;
        case LAYER_AVERAGE_POOLING2D:
            cudaCheck(gpu_avgpool_forward(op->y, cur, n, &op->geom, g->stream));
            cur = op->y;
            break;
        case LAYER_GLOBAL_AVERAGE_POOLING2D:
            cudaCheck(gpu_gap_forward(op->y, cur, n, op->hw, op->ch, g->stream));
            cur = op->y;
            break;
        case LAYER_BATCH_NORMALIZATION:
            if (training)
                cudaCheck(gpu_bn_forward_train(op->y, op->bmean, op->binvstd, cur, bn_rows(op, n),
                                               op->ch, op->gamma, op->beta, op->eps, op->momentum,
                                               op->mmean, op->mvar, g->part, g->stream));
            else
                cudaCheck(gpu_bn_forward_eval(op->y, cur, bn_rows(op, n), op->ch, op->gamma,
                                              op->beta, op->eps, op->mmean, op->mvar, g->stream));
            cur = op->y;
            break;
        case LAYER_FLATTEN:
        case LAYER_RESHAPE:
            break;
        }
    }
    *outp = cur;
    return 0;
fail:
    return -1;
}

/* A dense or conv2d kernel's regularizer: its value into st->reg_sum, its
 * gradient added to dw when dw != NULL. */
static int enqueue_regularize(gpu_model *g, const gop *op, float *dw, char *err)
{
    if (!(op->l1 > 0.0f || op->l2 > 0.0f))
        return 0;
    k_regularize<<<grid_for(op->kcount) > 1024 ? 1024 : grid_for(op->kcount), BLOCK, 0,
                   g->stream>>>(op->w, dw, op->kcount, op->l1, op->l2, g->st);
    cudaCheckLast();
    return 0;
fail:
    return -1;
}

/* Adds every dense and conv2d kernel's regularization (its gradient too
 * when grad). */
static int enqueue_regularize_all(gpu_model *g, int grad, char *err)
{
    for (int i = 0; i < g->n_ops; i++) {
        gop *op = &g->ops[i];
        if ((op->type == LAYER_DENSE || op->type == LAYER_CONV2D) &&
            enqueue_regularize(g, op, grad ? op->dw : NULL, err))
            return -1;
    }
    return 0;
}

/* Queues forward + loss + backward of the n examples at x, y (device):
 * overwrites the gradient buffer (model.c's step without the update), or
 * with accumulate != 0 adds the data gradients to it and no regularization
 * gradient (model_forward_backward_add; the value still counts in the
 * stats). */
static int enqueue_forward_backward(gpu_model *g, const float *x, const float *y, int n,
                                    int accumulate, char *err)
{
    const float *inputs[JOBSPEC_MAX_LAYERS];
    const float *outp = NULL;
    float *gcur = g->gbuf[0], *gother = g->gbuf[1], *t = NULL;
    if (n <= 0 && accumulate)
        return 0; /* nothing to add */
    if (n <= 0) { /* zero gradients plus the regularization's share */
        cudaCheck(cudaMemsetAsync(g->grads, 0, sizeof(float) * g->n_params, g->stream));
        if (enqueue_regularize_all(g, 1, err))
            return -1;
        k_reg_finish<<<1, 1, 0, g->stream>>>(g->st, 0);
        cudaCheckLast();
        return 0;
    }
    if (enqueue_forward(g, x, n, 1, inputs, &outp, err))
        return -1;
    k_loss<<<rows_grid(n), 128, 0, g->stream>>>(g->loss, g->fused, outp, y, n, g->out_size, gcur,
                                               g->row_loss, g->row_correct, g->st);
    cudaCheckLast();
    k_reduce_stats<<<1, BLOCK, 0, g->stream>>>(g->row_loss, g->row_correct, n, g->st, 0);
    cudaCheckLast();
    for (int i = g->n_ops - 1; i >= g->first_param_op; i--) {
        gop *op = &g->ops[i];
        long long total = (long long)n * op->out;
        switch (op->type) {
        case LAYER_DENSE: {
            float *dx = i > g->first_param_op ? gother : NULL;
            if (op->act == ACT_RELU) {
                float scale = (op->fused_next && op->rate > 0.0f) ? op->scale : 1.0f;
                k_bias_grad<<<(op->out + BG_X - 1) / BG_X, dim3(BG_X, BG_Y), 0, g->stream>>>(
                    gcur, op->y, op->db, n, op->out, 1, scale, accumulate);
                cudaCheckLast();
            } else {
                if (op->act == ACT_SOFTMAX) {
                    k_softmax_bwd<<<rows_grid(n), 128, 0, g->stream>>>(gcur, op->y, n, op->out);
                    cudaCheckLast();
                } else if (op->act != ACT_LINEAR) {
                    k_act_bwd<<<grid_for(total), BLOCK, 0, g->stream>>>(gcur, op->y, total,
                                                                       op->act);
                    cudaCheckLast();
                }
                if (op->db) {
                    k_bias_grad<<<(op->out + BG_X - 1) / BG_X, dim3(BG_X, BG_Y), 0, g->stream>>>(
                        gcur, op->y, op->db, n, op->out, 0, 1.0f, accumulate);
                    cudaCheckLast();
                }
            }
            cublasCheck(gemm_weight_grad(g, inputs[i], gcur, op->dw, n, op->in, op->out, accumulate));
            if (dx)
                cublasCheck(gemm_input_grad(g, gcur, op->w, dx, n, op->in, op->out));
            if (enqueue_regularize(g, op, accumulate ? NULL : op->dw, err))
                return -1;
            t = gcur;
            gcur = gother;
            gother = t;
            break;
        }
        case LAYER_CONV2D:
            if (conv_backward(g, op, gcur, inputs[i], i > g->first_param_op ? gother : NULL, n,
                              accumulate, err) ||
                enqueue_regularize(g, op, accumulate ? NULL : op->dw, err))
                return -1;
            t = gcur;
            gcur = gother;
            gother = t;
            break;
        case LAYER_MAX_POOLING2D:
        case LAYER_AVERAGE_POOLING2D:
        case LAYER_GLOBAL_AVERAGE_POOLING2D:
            if (op->type == LAYER_MAX_POOLING2D)
                cudaCheck(gpu_maxpool_backward(gother, gcur, op->argmax, n, &op->geom, g->stream));
            else if (op->type == LAYER_AVERAGE_POOLING2D)
                cudaCheck(gpu_avgpool_backward(gother, gcur, n, &op->geom, g->stream));
            else
                cudaCheck(gpu_gap_backward(gother, gcur, n, op->hw, op->ch, g->stream));
            t = gcur;
            gcur = gother;
            gother = t;
            break;
        case LAYER_BATCH_NORMALIZATION: /* dx in place (none for the first trained layer) */
            cudaCheck(gpu_bn_backward(i > g->first_param_op ? gcur : NULL, op->dgamma, op->dbeta,
                                      gcur, inputs[i], op->bmean, op->binvstd, op->gamma,
                                      bn_rows(op, n), op->ch, accumulate, op->bsums, g->part,
                                      g->stream));
            break;
        case LAYER_DROPOUT:
            if (!op->fused_into_prev && op->rate > 0.0f) {
                k_dropout_bwd<<<grid_for(total), BLOCK, 0, g->stream>>>(
                    gcur, n, op->out, op->thr, op->scale, g->st, op->key_layer);
                cudaCheckLast();
            }
            break;
        case LAYER_ACTIVATION:
            if (op->own_output) {
                if (op->act == ACT_SOFTMAX)
                    k_softmax_bwd<<<rows_grid(n), 128, 0, g->stream>>>(gcur, op->y, n, op->out);
                else
                    k_act_bwd<<<grid_for(total), BLOCK, 0, g->stream>>>(gcur, op->y, total,
                                                                       op->act);
                cudaCheckLast();
            }
            break;
        case LAYER_FLATTEN:
        case LAYER_RESHAPE:
            break;
        }
    }
    k_reg_finish<<<1, 1, 0, g->stream>>>(g->st, n);
    cudaCheckLast();
    return 0;
fail:
    return -1;
}

/* Queues one optimizer update of the whole flat buffer (counts the iteration). */
static int enqueue_update(gpu_model *g, char *err)
{
    const optimizer_spec *o = &g->optspec;
    k_pre_update<<<1, 1, 0, g->stream>>>(g->st, o->type == OPT_ADAM, o->learning_rate, o->beta_1,
                                        o->beta_2);
    cudaCheckLast();
    k_optimizer<<<grid_for((long long)g->n_params), BLOCK, 0, g->stream>>>(
        *o, g->params, g->grads, g->slots, (long long)g->n_params, (long long)g->n_params, g->st);
    cudaCheckLast();
    return 0;
fail:
    return -1;
}

/* ================================================================ build */

static size_t align_up(size_t n) { return (n + ALIGN_FLOATS - 1) / ALIGN_FLOATS * ALIGN_FLOATS; }

static void dropout_init(gop *op, float rate)
{
    /* layers.c's dropout_cfg_init */
    op->rate = rate;
    if (rate <= 0.0f) {
        op->rate = 0.0f;
        op->scale = 1.0f;
        op->thr = UINT32_MAX;
        return;
    }
    op->scale = 1.0f / (1.0f - rate);
    double t = (1.0 - (double)rate) * 4294967296.0 + 0.5;
    op->thr = t >= 4294967295.0 ? UINT32_MAX : (uint32_t)t;
}

/* model.c's drop_seed: the seed of dropout ops without their own, from the
 * model's RNG state (keep in step with executor/nn/model.c). */
static uint64_t drop_seed(const uint64_t rng[4])
{
    return nn_mix64(rng[0] ^ nn_mix64(rng[2]));
}

/* Appends tensor LAYER_K.WHAT of `rank` dims to a list, 64-byte aligned
 * from *off (model.c's layout). */
static void add_tensor(model_tensor *list, int *count, size_t *off, const char *layer, int k,
                       const char *what, int rank, int d0, int d1, int d2, int d3)
{
    model_tensor *t = &list[(*count)++];
    int d[4] = {d0, d1, d2, d3};
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s_%d.%s", layer, k, what);
    t->offset = *off;
    t->rank = rank;
    t->size = 1;
    for (int i = 0; i < rank; i++) {
        t->shape[i] = d[i];
        t->size *= (size_t)d[i];
    }
    *off = align_up(*off + t->size);
}

/* ---------------------------------------------------------------- plan_ops, by phase
 *
 * The ops and tensors of spec, as model.c's model_build lays them out:
 * trainable tensors in layer order (dense_K.kernel/.bias, conv2d_K.kernel
 * (kh, kw, c_in, c_out)/.bias, batch_normalization_K.gamma/.beta), the
 * state's (batch_normalization_K.moving_mean/.moving_variance) in a second
 * buffer; one example's shape followed through the layers as the spec
 * parser does (and checked against what it resolved, when it did).
 * plan_ops takes the input's shape, plans the layers one by one, then the
 * fusions: three phases over the same model, each a function below. */

/* What the layers' phase carries from one layer to the next. */
typedef struct plan_walk {
    int width;                  /* floats of one example going into the layer */
    int rank;                   /* its shape (rank 1: a flat vector) */
    int shape[JOBSPEC_MAX_RANK];
    size_t off, soff;           /* the next parameter and state tensor's offset */
    int dense_i, conv_i, bn_i;  /* the K of the next dense_K, conv2d_K, batch_normalization_K */
} plan_walk;

/* Phase 1: the model's input, its width and shape (flat when the spec's
 * rank is unusable). */
static void plan_input(gpu_model *g, const jobspec *spec, plan_walk *w)
{
    memset(w, 0, sizeof *w);
    w->width = spec->input_size;
    w->rank = spec->input_rank;
    g->in_size = spec->input_size;
    g->n_ops = spec->n_layers;
    g->first_param_op = -1;
    g->max_width = w->width;
    if (w->rank <= 0 || w->rank > JOBSPEC_MAX_RANK) {
        w->rank = 1;
        w->shape[0] = w->width;
    } else {
        memcpy(w->shape, spec->input_shape, sizeof(int) * (size_t)w->rank);
    }
}

static int plan_dense(gpu_model *g, gop *op, const layer_spec *ls, int i, plan_walk *w, char *err)
{
    if (w->rank != 1)
        return gpu_errf(err, "model.layers[%d]: dense takes a flat input, got rank %d", i,
                        w->rank);
    op->out = ls->units;
    op->act = ls->activation;
    op->use_bias = ls->use_bias;
    op->l1 = ls->l1;
    op->l2 = ls->l2;
    op->own_output = 1;
    op->kernel_tensor = g->n_tensors;
    op->kcount = (long long)op->in * op->out;
    add_tensor(g->tensors, &g->n_tensors, &w->off, "dense", w->dense_i, "kernel", 2, op->in,
               op->out, 0, 0);
    if (op->use_bias)
        add_tensor(g->tensors, &g->n_tensors, &w->off, "dense", w->dense_i, "bias", 1, op->out,
                   0, 0, 0);
    w->dense_i++;
    w->shape[0] = op->out;
    return 0;
}

static int plan_conv2d(gpu_model *g, gop *op, const layer_spec *ls, int i, plan_walk *w,
                       char *err)
{
    gpu_geom *ge = &op->geom;
    if (ls->filters <= 0 || ls->kernel_size[0] <= 0 || ls->kernel_size[1] <= 0)
        return gpu_errf(err, "model.layers[%d]: conv2d needs filters and kernel_size", i);
    if (ls->activation == ACT_SOFTMAX)
        return gpu_errf(err, "model.layers[%d]: softmax on a conv2d", i);
    conv_geom_init(ge, w->shape[0], w->shape[1], w->shape[2], ls->kernel_size[0],
                   ls->kernel_size[1], ls->strides[0], ls->strides[1], ls->padding, ls->filters);
    op->act = ls->activation;
    op->use_bias = ls->use_bias;
    op->l1 = ls->l1;
    op->l2 = ls->l2;
    op->own_output = 1;
    op->kernel_tensor = g->n_tensors;
    op->kcount = (long long)ge->kh * ge->kw * ge->c * ge->oc;
    add_tensor(g->tensors, &g->n_tensors, &w->off, "conv2d", w->conv_i, "kernel", 4, ge->kh,
               ge->kw, ge->c, ge->oc);
    if (op->use_bias)
        add_tensor(g->tensors, &g->n_tensors, &w->off, "conv2d", w->conv_i, "bias", 1, ge->oc,
                   0, 0, 0);
    w->conv_i++;
    op->direct = ge->kh == 1 && ge->kw == 1 && ge->sh == 1 && ge->sw == 1;
    return 0;
}

/* gamma when scale, then beta when center; the moving statistics in the
 * state buffer */
static void plan_batch_norm(gpu_model *g, gop *op, const layer_spec *ls, plan_walk *w)
{
    op->ch = w->shape[w->rank - 1];
    op->momentum = ls->momentum;
    op->eps = ls->epsilon;
    op->own_output = 1;
    if (ls->scale) {
        op->gamma_tensor = g->n_tensors;
        add_tensor(g->tensors, &g->n_tensors, &w->off, "batch_normalization", w->bn_i, "gamma",
                   1, op->ch, 0, 0, 0);
    }
    if (ls->center) {
        op->beta_tensor = g->n_tensors;
        add_tensor(g->tensors, &g->n_tensors, &w->off, "batch_normalization", w->bn_i, "beta",
                   1, op->ch, 0, 0, 0);
    }
    op->state_tensor = g->n_state_tensors;
    add_tensor(g->state_tensors, &g->n_state_tensors, &w->soff, "batch_normalization", w->bn_i,
               "moving_mean", 1, op->ch, 0, 0, 0);
    add_tensor(g->state_tensors, &g->n_state_tensors, &w->soff, "batch_normalization", w->bn_i,
               "moving_variance", 1, op->ch, 0, 0, 0);
    w->bn_i++;
}

/* The target shape, its one -1 axis (if any) taking what the others leave. */
static int plan_reshape(const layer_spec *ls, int i, plan_walk *w, char *err)
{
    long known = 1;
    int unknown = -1;
    for (int d = 0; d < ls->target_rank; d++) {
        if (ls->target_shape[d] < 0)
            unknown = d;
        else
            known *= ls->target_shape[d];
    }
    if (ls->target_rank <= 0 || ls->target_rank > JOBSPEC_MAX_RANK || known <= 0 ||
        (unknown < 0 ? known != w->width : w->width % known != 0))
        return gpu_errf(err, "model.layers[%d]: reshape target does not hold %d values", i,
                        w->width);
    w->rank = ls->target_rank;
    for (int d = 0; d < w->rank; d++)
        w->shape[d] = d == unknown ? (int)(w->width / known) : ls->target_shape[d];
    return 0;
}

/* conv2d and the poolings: the window must fit, and a batch of its
 * outputs must be rows one GEMM can take; the output is an image. */
static int plan_window_out(const gpu_model *g, const gop *op, int i, plan_walk *w, char *err)
{
    const gpu_geom *ge = &op->geom;
    if (ge->oh < 1 || ge->ow < 1 || ge->kh < 1 || ge->kw < 1)
        return gpu_errf(err, "model.layers[%d]: a %dx%d window does not fit %dx%d", i, ge->kh,
                        ge->kw, ge->h, ge->w);
    if ((long long)ge->oh * ge->ow * g->max_batch > INT_MAX / 2)
        return gpu_errf(err, "model.layers[%d]: %d examples of %dx%d outputs are too many "
                             "rows for one GEMM", i, g->max_batch, ge->oh, ge->ow);
    w->rank = 3;
    w->shape[0] = ge->oh;
    w->shape[1] = ge->ow;
    w->shape[2] = ge->oc;
    return 0;
}

/* One layer: its op, its tensors and the shape it leaves in w, checked
 * against the spec's resolved out_shape; a layer without tensors of its
 * own is handled inline. */
static int plan_layer(gpu_model *g, const jobspec *spec, int i, plan_walk *w, char *err)
{
    const layer_spec *ls = &spec->layers[i];
    gop *op = &g->ops[i];
    int image = ls->type == LAYER_CONV2D || ls->type == LAYER_MAX_POOLING2D ||
                ls->type == LAYER_AVERAGE_POOLING2D || ls->type == LAYER_GLOBAL_AVERAGE_POOLING2D;
    int window = ls->type == LAYER_CONV2D || ls->type == LAYER_MAX_POOLING2D ||
                 ls->type == LAYER_AVERAGE_POOLING2D;
    int rc = 0;
    memset(op, 0, sizeof *op);
    op->type = ls->type;
    op->in = w->width;
    op->act = ACT_LINEAR;
    op->key_layer = i;
    op->gamma_tensor = op->beta_tensor = op->state_tensor = -1;
    dropout_init(op, 0.0f);
    if (image && w->rank != 3)
        return gpu_errf(err, "model.layers[%d]: takes an image (h, w, c), got rank %d", i,
                        w->rank);
    switch (ls->type) {
    case LAYER_DENSE:
        rc = plan_dense(g, op, ls, i, w, err);
        break;
    case LAYER_CONV2D:
        rc = plan_conv2d(g, op, ls, i, w, err);
        break;
    case LAYER_MAX_POOLING2D:
    case LAYER_AVERAGE_POOLING2D:
        conv_geom_init(&op->geom, w->shape[0], w->shape[1], w->shape[2], ls->pool_size[0],
                       ls->pool_size[1], ls->strides[0], ls->strides[1], ls->padding,
                       w->shape[2]);
        op->own_output = 1;
        break;
    case LAYER_GLOBAL_AVERAGE_POOLING2D:
        op->hw = w->shape[0] * w->shape[1];
        op->ch = w->shape[2];
        op->own_output = 1;
        w->rank = 1;
        w->shape[0] = op->ch;
        break;
    case LAYER_BATCH_NORMALIZATION:
        plan_batch_norm(g, op, ls, w);
        break;
    case LAYER_RESHAPE:
        rc = plan_reshape(ls, i, w, err);
        break;
    case LAYER_DROPOUT:
        dropout_init(op, ls->rate);
        op->has_seed = ls->has_seed;
        op->seed = ls->seed;
        op->own_output = 1;
        break;
    case LAYER_FLATTEN:
        w->rank = 1;
        w->shape[0] = w->width;
        break;
    case LAYER_ACTIVATION:
        op->act = ls->activation;
        op->own_output = 1;
        break;
    default:
        return gpu_errf(err, "model.layers[%d]: unknown layer type", i);
    }
    if (rc || (window && plan_window_out(g, op, i, w, err)))
        return -1;
    op->out = 1;
    for (int d = 0; d < w->rank; d++)
        op->out *= w->shape[d];
    if (ls->out_rank > 0 && (ls->out_rank != w->rank ||
                             memcmp(ls->out_shape, w->shape, sizeof(int) * (size_t)w->rank) != 0))
        return gpu_errf(err, "model.layers[%d]: output shape differs from the spec's resolved "
                             "out_shape", i);
    return 0;
}

/* Phase 2: every layer planned in order; the first trainable op, the
 * widest buffer, the output's width and the two layouts' sizes. */
static int plan_layers(gpu_model *g, const jobspec *spec, plan_walk *w, char *err)
{
    for (int i = 0; i < g->n_ops; i++) {
        if (plan_layer(g, spec, i, w, err))
            return -1;
        const gop *op = &g->ops[i];
        if (g->first_param_op < 0 && (op->type == LAYER_DENSE || op->type == LAYER_CONV2D ||
                                      op->gamma_tensor >= 0 || op->beta_tensor >= 0))
            g->first_param_op = i;
        w->width = op->out;
        if (w->width > g->max_width)
            g->max_width = w->width;
        if (op->in > g->max_width)
            g->max_width = op->in;
    }
    if (g->first_param_op < 0)
        return gpu_errf(err, "model has no layer with weights (nothing to train)");
    g->n_state = w->soff;
    g->out_size = w->width;
    g->n_params = w->off;
    return 0;
}

/* Phase 3: fusions: relu dense + dropout; a final softmax/sigmoid into the loss. */
static void plan_fusions(gpu_model *g)
{
    for (int i = 0; i + 1 < g->n_ops; i++) {
        gop *op = &g->ops[i], *nx = &g->ops[i + 1];
        if (op->type == LAYER_DENSE && op->act == ACT_RELU && nx->type == LAYER_DROPOUT) {
            op->fused_next = 1;
            op->rate = nx->rate;
            op->scale = nx->scale;
            op->thr = nx->thr;
            op->key_layer = nx->key_layer;
            nx->fused_into_prev = 1;
            nx->own_output = 0;
        }
    }
    gop *last = &g->ops[g->n_ops - 1];
    act_type fa = loss_fused_act(g->loss);
    if (fa != ACT_LINEAR && (last->type == LAYER_DENSE || last->type == LAYER_ACTIVATION) &&
        last->act == fa) {
        g->fused = 1;
        g->final_act = fa;
        last->act = ACT_LINEAR;
        if (last->type == LAYER_ACTIVATION)
            last->own_output = 0;
    }
}

static int plan_ops(gpu_model *g, const jobspec *spec, char *err)
{
    plan_walk w;
    plan_input(g, spec, &w);
    if (plan_layers(g, spec, &w, err))
        return -1;
    plan_fusions(g);
    return 0;
}

/* The CPU model of the same spec gives the initial values; its layout must
 * be ours tensor for tensor (a checkpoint moves between the two). */
static int take_cpu_model(gpu_model *g, model *hm, char *err)
{
    if (model_param_count(hm) != g->n_params || model_slot_count(hm) != g->n_slots ||
        model_tensor_count(hm) != g->n_tensors || model_input_size(hm) != g->in_size ||
        model_output_size(hm) != g->out_size)
        return gpu_errf(err, "gpu model layout differs from model.h's (params %zu vs %zu, "
                             "tensors %d vs %d): executor/nn/model.c changed; update gpu_model.cu",
                        g->n_params, model_param_count(hm), g->n_tensors, model_tensor_count(hm));
    for (int i = 0; i < g->n_tensors; i++) {
        const model_tensor *a = &g->tensors[i], *b = model_tensor_at(hm, i);
        if (strcmp(a->name, b->name) != 0 || a->offset != b->offset || a->size != b->size ||
            a->rank != b->rank)
            return gpu_errf(err, "gpu model tensor %d (%s at %zu) differs from model.h's (%s at "
                                 "%zu): update gpu_model.cu",
                            i, a->name, a->offset, b->name, b->offset);
    }
    if (model_state_count(hm) != g->n_state || model_state_tensor_count(hm) != g->n_state_tensors)
        return gpu_errf(err, "gpu model state layout differs from model.h's (%zu floats in %d "
                             "tensors vs %zu in %d): update gpu_model.cu",
                        g->n_state, g->n_state_tensors, model_state_count(hm),
                        model_state_tensor_count(hm));
    for (int i = 0; i < g->n_state_tensors; i++) {
        const model_tensor *a = &g->state_tensors[i], *b = model_state_tensor_at(hm, i);
        if (strcmp(a->name, b->name) != 0 || a->offset != b->offset || a->size != b->size)
            return gpu_errf(err, "gpu model state tensor %d (%s at %zu) differs from model.h's "
                                 "(%s at %zu): update gpu_model.cu",
                            i, a->name, a->offset, b->name, b->offset);
    }
    snprintf(g->signature, sizeof g->signature, "%s", model_signature(hm));
    model_rng_get(hm, g->rng);
    return 0;
}

/* Sends the dropout seeds (from the RNG state or the layers' own). */
static int send_seeds(gpu_model *g, char *err)
{
    uint64_t ds = drop_seed(g->rng);
    for (int i = 0; i < g->n_ops; i++) {
        const gop *op = &g->ops[i];
        if (op->type != LAYER_DROPOUT)
            continue;
        k_set_u64<<<1, 1, 0, g->stream>>>(&g->st->seeds[i],
                                         (unsigned long long)(op->has_seed ? op->seed : ds));
        cudaCheckLast();
    }
    return 0;
fail:
    return -1;
}

static int dev_alloc(void **p, size_t bytes, char *err)
{
    cudaCheck(cudaMalloc(p, bytes ? bytes : 16));
    cudaCheck(cudaMemset(*p, 0, bytes ? bytes : 16));
    return 0;
fail:
    *p = NULL;
    return -1;
}

/* Runs every kernel and GEMM of a step once, eagerly, on the zeroed batch
 * slot 0, so that modules and cuBLAS kernels are loaded before a graph
 * capture; then puts back what it touched (gradients, stats, iteration,
 * and the moving statistics from `state`, the host's initial values).
 * The update kernel runs over zero parameters (n = 0). */
static int warm_up(gpu_model *g, const float *state, char *err)
{
    const optimizer_spec *o = &g->optspec;
    gstate *st = g->st;
    if (enqueue_forward_backward(g, g->bx[0], g->by[0], g->max_batch, 0, err))
        return -1;
    if (g->n_state)
        cudaCheck(cudaMemcpyAsync(g->state, state, sizeof(float) * g->n_state,
                                  cudaMemcpyHostToDevice, g->stream));
    k_pre_update<<<1, 1, 0, g->stream>>>(st, o->type == OPT_ADAM, o->learning_rate, o->beta_1,
                                        o->beta_2);
    cudaCheckLast();
    k_optimizer<<<1, BLOCK, 0, g->stream>>>(*o, g->params, g->grads, g->slots, 0,
                                            (long long)g->n_params, st);
    cudaCheckLast();
    k_set_i64<<<1, 1, 0, g->stream>>>(&st->iterations, (long long)g->iterations);
    cudaCheckLast();
    cudaCheck(cudaMemsetAsync(g->grads, 0, sizeof(float) * g->n_params, g->stream));
    cudaCheck(cudaMemsetAsync(&st->loss_sum, 0, sizeof(double), g->stream));
    cudaCheck(cudaMemsetAsync(&st->correct, 0, sizeof(long long), g->stream));
    cudaCheck(cudaMemsetAsync(&st->seen, 0, sizeof(long long), g->stream));
    cudaCheck(cudaMemsetAsync(&st->reg_sum, 0, sizeof(double), g->stream));
    cudaCheck(cudaStreamSynchronize(g->stream));
    return 0;
fail:
    return -1;
}

/* Captures one training step (forward, backward, update) on batch slot s. */
static int capture_step(gpu_model *g, int s, char *err)
{
    cudaGraph_t graph = NULL;
    cudaError_t e;
    int rc;
    cudaCheck(cudaStreamBeginCapture(g->stream, cudaStreamCaptureModeRelaxed));
    rc = enqueue_forward_backward(g, g->bx[s], g->by[s], g->max_batch, 0, err);
    if (rc == 0)
        rc = enqueue_update(g, err);
    e = cudaStreamEndCapture(g->stream, &graph);
    if (rc)
        goto fail;
    cudaCheck(e);
    cudaCheck(cudaGraphInstantiate(&g->graph[s], graph, 0));
    cudaCheck(cudaGraphDestroy(graph));
    return 0;
fail:
    if (graph)
        cudaGraphDestroy(graph);
    cudaGetLastError();
    return -1;
}

extern "C" void gpu_model_free(gpu_model *g)
{
    if (!g)
        return;
    cudaSetDevice(g->device);
    if (g->stream)
        cudaStreamSynchronize(g->stream);
    if (g->copy_stream)
        cudaStreamSynchronize(g->copy_stream);
    for (int s = 0; s < NSLOT; s++) {
        if (g->graph[s])
            cudaGraphExecDestroy(g->graph[s]);
        if (g->copied[s])
            cudaEventDestroy(g->copied[s]);
        if (g->freed[s])
            cudaEventDestroy(g->freed[s]);
        cudaFree(g->bx[s]);
        cudaFree(g->by[s]);
        cudaFreeHost(g->hx[s]);
        cudaFreeHost(g->hy[s]);
    }
    if (g->blas)
        cublasDestroy(g->blas);
    cudaFree(g->blas_ws);
    cudaFree(g->params);
    cudaFree(g->grads);
    cudaFree(g->slots);
    cudaFree(g->state);
    cudaFree(g->col);
    cudaFree(g->part);
    cudaFree(g->bnbuf);
    cudaFree(g->argmax);
    cudaFree(g->acts);
    cudaFree(g->gbuf[0]);
    cudaFree(g->gbuf[1]);
    cudaFree(g->ex);
    cudaFree(g->ey);
    cudaFree(g->row_loss);
    cudaFree(g->row_correct);
    cudaFree(g->st);
    if (g->stream)
        cudaStreamDestroy(g->stream);
    if (g->copy_stream)
        cudaStreamDestroy(g->copy_stream);
    cudaGetLastError();
    free(g);
}

extern "C" int gpu_model_build(gpu_model **out, const jobspec *spec, int max_batch, uint64_t seed,
                               const gpu_options *opt, char err[ERR_MAX])
{
    gpu_model *g = NULL;
    model *hm = NULL;
    char merr[ERR_MAX];
    size_t act_floats = 0, aoff = 0, gsize = 0, bn_floats = 0, boff = 0, arg_ints = 0, xoff = 0;
    int max_ch = 1;
    gstate init;
    *out = NULL;
    if (max_batch <= 0)
        return gpu_errf(err, "max_batch must be positive");
    /* the CPU engine validates the spec and draws the initial values */
    if (model_build(&hm, spec, 1, seed, merr))
        return gpu_errf(err, "%s", merr);
    g = (gpu_model *)calloc(1, sizeof *g);
    if (!g) {
        model_free(hm);
        return gpu_errf(err, "out of memory");
    }
    if (opt)
        g->opt = *opt;
    else
        gpu_options_default(&g->opt);
    g->device = g->opt.device;
    g->max_batch = max_batch;
    g->loss = spec->loss;
    g->optspec = spec->optimizer;
    g->n_slots = model_slot_count(hm);
    if (plan_ops(g, spec, err) || take_cpu_model(g, hm, err))
        goto fail;

    cudaCheck(cudaSetDevice(g->device));
    cudaCheck(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking));
    cudaCheck(cudaStreamCreateWithFlags(&g->copy_stream, cudaStreamNonBlocking));
    for (int s = 0; s < NSLOT; s++) {
        cudaCheck(cudaEventCreateWithFlags(&g->copied[s], cudaEventDisableTiming));
        cudaCheck(cudaEventCreateWithFlags(&g->freed[s], cudaEventDisableTiming));
    }
    cublasCheck(cublasCreate(&g->blas));
    cublasCheck(cublasSetStream(g->blas, g->stream));
    cublasCheck(cublasSetMathMode(g->blas, g->opt.tf32 ? CUBLAS_TF32_TENSOR_OP_MATH
                                                       : CUBLAS_DEFAULT_MATH));
    if (dev_alloc(&g->blas_ws, BLAS_WORKSPACE, err))
        goto fail;
    cublasCheck(cublasSetWorkspace(g->blas, g->blas_ws, BLAS_WORKSPACE));

    /* buffers: parameters, gradients, slots in model.h's flat layout */
    if (dev_alloc((void **)&g->params, sizeof(float) * g->n_params, err) ||
        dev_alloc((void **)&g->grads, sizeof(float) * g->n_params, err) ||
        dev_alloc((void **)&g->slots, sizeof(float) * g->n_params * (size_t)g->n_slots, err))
        goto fail;
    /* scratch of the convolutional layers: im2col (in chunks of examples
     * past COL_BUDGET floats), per-channel partial sums, batch norm's
     * statistics, max pooling's argmax */
    for (int i = 0; i < g->n_ops; i++) {
        gop *op = &g->ops[i];
        if (op->own_output)
            act_floats += align_up((size_t)max_batch * op->out);
        if (op->type == LAYER_CONV2D) {
            const gpu_geom *ge = &op->geom;
            size_t per = (size_t)ge->oh * ge->ow * ge->kh * ge->kw * ge->c;
            op->chunk = op->direct || per * (size_t)max_batch <= COL_BUDGET
                            ? max_batch
                            : (int)(COL_BUDGET / per > 0 ? COL_BUDGET / per : 1);
            if (!op->direct && per * (size_t)op->chunk > g->col_floats)
                g->col_floats = per * (size_t)op->chunk;
            if (op->use_bias && ge->oc > max_ch)
                max_ch = ge->oc;
        } else if (op->type == LAYER_BATCH_NORMALIZATION) {
            bn_floats += align_up(4 * (size_t)op->ch);
            if (op->ch > max_ch)
                max_ch = op->ch;
        } else if (op->type == LAYER_MAX_POOLING2D) {
            arg_ints += align_up((size_t)max_batch * op->out);
        }
    }
    g->part_doubles = gpu_red_doubles(max_ch);
    if (dev_alloc((void **)&g->state, sizeof(float) * g->n_state, err) ||
        dev_alloc((void **)&g->col, sizeof(float) * g->col_floats, err) ||
        dev_alloc((void **)&g->part, sizeof(double) * g->part_doubles, err) ||
        dev_alloc((void **)&g->bnbuf, sizeof(float) * bn_floats, err) ||
        dev_alloc((void **)&g->argmax, sizeof(int32_t) * arg_ints, err))
        goto fail;
    gsize = align_up((size_t)max_batch * g->max_width);
    if (dev_alloc((void **)&g->acts, sizeof(float) * act_floats, err) ||
        dev_alloc((void **)&g->gbuf[0], sizeof(float) * gsize, err) ||
        dev_alloc((void **)&g->gbuf[1], sizeof(float) * gsize, err) ||
        dev_alloc((void **)&g->ex, sizeof(float) * (size_t)max_batch * g->in_size, err) ||
        dev_alloc((void **)&g->ey, sizeof(float) * (size_t)max_batch, err) ||
        dev_alloc((void **)&g->row_loss, sizeof(double) * (size_t)max_batch, err) ||
        dev_alloc((void **)&g->row_correct, sizeof(int) * (size_t)max_batch, err) ||
        dev_alloc((void **)&g->st, sizeof(gstate), err))
        goto fail;
    for (int s = 0; s < NSLOT; s++) {
        if (dev_alloc((void **)&g->bx[s], sizeof(float) * (size_t)max_batch * g->in_size, err) ||
            dev_alloc((void **)&g->by[s], sizeof(float) * (size_t)max_batch, err))
            goto fail;
        cudaCheck(cudaMallocHost((void **)&g->hx[s],
                                 sizeof(float) * (size_t)max_batch * g->in_size));
        cudaCheck(cudaMallocHost((void **)&g->hy[s], sizeof(float) * (size_t)max_batch));
        memset(g->hx[s], 0, sizeof(float) * (size_t)max_batch * g->in_size);
        memset(g->hy[s], 0, sizeof(float) * (size_t)max_batch);
    }
    for (int i = 0; i < g->n_ops; i++) {
        gop *op = &g->ops[i];
        if (op->own_output) {
            op->y = g->acts + aoff;
            aoff += align_up((size_t)max_batch * op->out);
        }
        if (op->type == LAYER_DENSE || op->type == LAYER_CONV2D) {
            const model_tensor *kt = &g->tensors[op->kernel_tensor];
            op->w = g->params + kt->offset;
            op->dw = g->grads + kt->offset;
            if (op->use_bias) {
                op->b = g->params + kt[1].offset;
                op->db = g->grads + kt[1].offset;
            }
        } else if (op->type == LAYER_BATCH_NORMALIZATION) {
            if (op->gamma_tensor >= 0) {
                op->gamma = g->params + g->tensors[op->gamma_tensor].offset;
                op->dgamma = g->grads + g->tensors[op->gamma_tensor].offset;
            }
            if (op->beta_tensor >= 0) {
                op->beta = g->params + g->tensors[op->beta_tensor].offset;
                op->dbeta = g->grads + g->tensors[op->beta_tensor].offset;
            }
            op->mmean = g->state + g->state_tensors[op->state_tensor].offset;
            op->mvar = g->state + g->state_tensors[op->state_tensor + 1].offset;
            op->bmean = g->bnbuf + boff;
            op->binvstd = op->bmean + op->ch;
            op->bsums = op->binvstd + op->ch;
            boff += align_up(4 * (size_t)op->ch);
        } else if (op->type == LAYER_MAX_POOLING2D) {
            op->argmax = g->argmax + xoff;
            xoff += align_up((size_t)max_batch * op->out);
        }
    }

    /* initial values: the CPU model's */
    cudaCheck(cudaDeviceSynchronize()); /* dev_alloc's memsets ran on the legacy stream */
    cudaCheck(cudaMemcpyAsync(g->params, model_params(hm), sizeof(float) * g->n_params,
                              cudaMemcpyHostToDevice, g->stream));
    if (g->n_slots)
        cudaCheck(cudaMemcpyAsync(g->slots, model_slots(hm),
                                  sizeof(float) * g->n_params * (size_t)g->n_slots,
                                  cudaMemcpyHostToDevice, g->stream));
    if (g->n_state)
        cudaCheck(cudaMemcpyAsync(g->state, model_state(hm), sizeof(float) * g->n_state,
                                  cudaMemcpyHostToDevice, g->stream));
    g->iterations = model_iterations(hm);
    memset(&init, 0, sizeof init);
    init.iterations = g->iterations;
    init.reg_scale = 1.0f;
    cudaCheck(cudaMemcpyAsync(g->st, &init, sizeof init, cudaMemcpyHostToDevice, g->stream));
    cudaCheck(cudaStreamSynchronize(g->stream));
    if (send_seeds(g, err) || warm_up(g, model_state(hm), err))
        goto fail;
    model_free(hm);
    hm = NULL;

    if (g->opt.cuda_graph) {
        for (int s = 0; s < NSLOT; s++)
            if (capture_step(g, s, err))
                goto fail;
        g->have_graph = 1;
    }
    *out = g;
    return 0;
fail:
    model_free(hm);
    gpu_model_free(g);
    return -1;
}

/* ================================================================ batches */

extern "C" int gpu_model_stage_next(gpu_model *g, float **x, float **y, char err[ERR_MAX])
{
    int s = (int)(g->staged % NSLOT);
    *x = NULL;
    *y = NULL;
    if (g->staged - g->consumed >= NSLOT)
        return gpu_errf(err, "gpu_model_stage_next: %d batches already wait for a step", NSLOT);
    cudaCheck(cudaSetDevice(g->device));
    cudaCheck(cudaEventSynchronize(g->freed[s]));
    g->stage_open = 1;
    *x = g->hx[s];
    *y = g->hy[s];
    return 0;
fail:
    return -1;
}

extern "C" int gpu_model_stage_commit(gpu_model *g, int n, char err[ERR_MAX])
{
    int s = (int)(g->staged % NSLOT);
    if (!g->stage_open)
        return gpu_errf(err, "gpu_model_stage_commit: no slot open (call gpu_model_stage_next)");
    if (n < 0 || n > g->max_batch)
        return gpu_errf(err, "gpu_model_stage_commit: %d examples, max_batch is %d", n,
                        g->max_batch);
    cudaCheck(cudaSetDevice(g->device));
    cudaCheck(cudaStreamWaitEvent(g->copy_stream, g->freed[s], 0));
    if (n > 0) {
        cudaCheck(cudaMemcpyAsync(g->bx[s], g->hx[s], sizeof(float) * (size_t)n * g->in_size,
                                  cudaMemcpyHostToDevice, g->copy_stream));
        cudaCheck(cudaMemcpyAsync(g->by[s], g->hy[s], sizeof(float) * (size_t)n,
                                  cudaMemcpyHostToDevice, g->copy_stream));
    }
    cudaCheck(cudaEventRecord(g->copied[s], g->copy_stream));
    g->slot_n[s] = n;
    g->staged++;
    g->stage_open = 0;
    return 0;
fail:
    return -1;
}

extern "C" int gpu_model_load_batch(gpu_model *g, const float *x, const float *y, int n,
                                    char err[ERR_MAX])
{
    float *hx = NULL, *hy = NULL;
    if (n < 0 || n > g->max_batch)
        return gpu_errf(err, "gpu_model_load_batch: %d examples, max_batch is %d", n,
                        g->max_batch);
    if (gpu_model_stage_next(g, &hx, &hy, err))
        return -1;
    if (n > 0) {
        memcpy(hx, x, sizeof(float) * (size_t)n * g->in_size);
        memcpy(hy, y, sizeof(float) * (size_t)n);
    }
    return gpu_model_stage_commit(g, n, err);
}

/* ================================================================ steps */

static int set_global_batch(gpu_model *g, int global_batch, char *err)
{
    if (global_batch <= 0)
        return gpu_errf(err, "global_batch must be positive, got %d", global_batch);
    if (global_batch != g->global_batch) {
        k_set_i32<<<1, 1, 0, g->stream>>>(&g->st->global_batch, global_batch);
        cudaCheckLast();
        g->global_batch = global_batch;
    }
    return 0;
fail:
    return -1;
}

/* Runs the oldest committed batch: update != 0 adds the optimizer update;
 * accumulate != 0 (never with update) adds to the gradient buffer. */
static int run_step(gpu_model *g, int global_batch, int update, int accumulate, char *err)
{
    int s = (int)(g->consumed % NSLOT), n;
    if (g->consumed >= g->staged)
        return gpu_errf(err, "no batch staged (gpu_model_load_batch or stage_next/commit first)");
    n = g->slot_n[s];
    cudaCheck(cudaSetDevice(g->device));
    if (set_global_batch(g, global_batch, err))
        return -1;
    cudaCheck(cudaStreamWaitEvent(g->stream, g->copied[s], 0));
    if (update && g->have_graph && n == g->max_batch) {
        cudaCheck(cudaGraphLaunch(g->graph[s], g->stream));
    } else {
        if (enqueue_forward_backward(g, g->bx[s], g->by[s], n, accumulate, err))
            return -1;
        if (update && enqueue_update(g, err))
            return -1;
    }
    cudaCheck(cudaEventRecord(g->freed[s], g->stream));
    g->consumed++;
    if (update)
        g->iterations++;
    return 0;
fail:
    return -1;
}

extern "C" int gpu_model_train_step(gpu_model *g, int global_batch, char err[ERR_MAX])
{
    return run_step(g, global_batch, 1, 0, err);
}

extern "C" int gpu_model_forward_backward(gpu_model *g, int global_batch, char err[ERR_MAX])
{
    return run_step(g, global_batch, 0, 0, err);
}

extern "C" int gpu_model_forward_backward_add(gpu_model *g, int global_batch, char err[ERR_MAX])
{
    return run_step(g, global_batch, 0, 1, err);
}

extern "C" int gpu_model_apply_gradients(gpu_model *g, char err[ERR_MAX])
{
    cudaCheck(cudaSetDevice(g->device));
    if (enqueue_update(g, err))
        return -1;
    g->iterations++;
    return 0;
fail:
    return -1;
}

extern "C" int gpu_model_sync(gpu_model *g, char err[ERR_MAX])
{
    cudaCheck(cudaSetDevice(g->device));
    cudaCheck(cudaStreamSynchronize(g->stream));
    return 0;
fail:
    return -1;
}

static int read_state(gpu_model *g, gstate *h, char *err)
{
    cudaCheck(cudaSetDevice(g->device));
    cudaCheck(cudaMemcpyAsync(h, g->st, sizeof *h, cudaMemcpyDeviceToHost, g->stream));
    cudaCheck(cudaStreamSynchronize(g->stream));
    return 0;
fail:
    return -1;
}

extern "C" int gpu_model_stats(gpu_model *g, step_stats *st, int reset, char err[ERR_MAX])
{
    gstate h;
    if (read_state(g, &h, err))
        return -1;
    if (st) {
        st->loss_sum = h.loss_sum;
        st->correct = (long)h.correct;
        st->n = (long)h.seen;
    }
    if (reset) {
        cudaCheck(cudaMemsetAsync(&g->st->loss_sum, 0, sizeof(double), g->stream));
        cudaCheck(cudaMemsetAsync(&g->st->correct, 0, sizeof(long long), g->stream));
        cudaCheck(cudaMemsetAsync(&g->st->seen, 0, sizeof(long long), g->stream));
    }
    return 0;
fail:
    return -1;
}

/* Forward of a host chunk (b rows) into the evaluation buffers; *outp the output. */
static int eval_chunk(gpu_model *g, const float *x, const float *y, int b, const float **outp,
                      char *err)
{
    const float *inputs[JOBSPEC_MAX_LAYERS];
    cudaCheck(cudaMemcpyAsync(g->ex, x, sizeof(float) * (size_t)b * g->in_size,
                              cudaMemcpyHostToDevice, g->stream));
    if (y)
        cudaCheck(cudaMemcpyAsync(g->ey, y, sizeof(float) * (size_t)b, cudaMemcpyHostToDevice,
                                  g->stream));
    return enqueue_forward(g, g->ex, b, 0, inputs, outp, err);
fail:
    return -1;
}

extern "C" int gpu_model_evaluate(gpu_model *g, const float *x, const float *y, long n,
                                  double *loss, double *acc, char err[ERR_MAX])
{
    gstate h;
    const float *o = NULL;
    cudaCheck(cudaSetDevice(g->device));
    cudaCheck(cudaMemsetAsync(&g->st->eval_loss, 0, sizeof(double), g->stream));
    cudaCheck(cudaMemsetAsync(&g->st->eval_correct, 0, sizeof(long long), g->stream));
    /* the loss kernel divides by global_batch only for the gradient (none here) */
    for (long i = 0; i < n; i += g->max_batch) {
        int b = (int)(n - i < g->max_batch ? n - i : g->max_batch);
        if (eval_chunk(g, x + i * g->in_size, y + i, b, &o, err))
            return -1;
        k_loss<<<rows_grid(b), 128, 0, g->stream>>>(g->loss, g->fused, o, g->ey, b, g->out_size,
                                                   NULL, g->row_loss, g->row_correct, g->st);
        cudaCheckLast();
        k_reduce_stats<<<1, BLOCK, 0, g->stream>>>(g->row_loss, g->row_correct, b, g->st, 1);
        cudaCheckLast();
    }
    cudaCheck(cudaMemsetAsync(&g->st->reg_sum, 0, sizeof(double), g->stream));
    if (enqueue_regularize_all(g, 0, err))
        return -1;
    if (read_state(g, &h, err))
        return -1;
    cudaCheck(cudaMemsetAsync(&g->st->reg_sum, 0, sizeof(double), g->stream));
    if (loss)
        *loss = n > 0 ? h.eval_loss / (double)n + h.reg_sum : 0.0;
    if (acc)
        *acc = n > 0 ? (double)h.eval_correct / (double)n : 0.0;
    return 0;
fail:
    return -1;
}

extern "C" int gpu_model_predict(gpu_model *g, const float *x, long n, float *out,
                                 char err[ERR_MAX])
{
    const float *o = NULL;
    cudaCheck(cudaSetDevice(g->device));
    for (long i = 0; i < n; i += g->max_batch) {
        int b = (int)(n - i < g->max_batch ? n - i : g->max_batch);
        long long total = (long long)b * g->out_size;
        if (eval_chunk(g, x + i * g->in_size, NULL, b, &o, err))
            return -1;
        if (g->fused) { /* the activation the loss absorbed, in place (eval buffers) */
            if (g->final_act == ACT_SOFTMAX)
                k_softmax<<<rows_grid(b), 128, 0, g->stream>>>((float *)o, o, b, g->out_size);
            else
                k_act<<<grid_for(total), BLOCK, 0, g->stream>>>((float *)o, o, total,
                                                               g->final_act);
            cudaCheckLast();
        }
        cudaCheck(cudaMemcpyAsync(out + i * g->out_size, o, sizeof(float) * (size_t)total,
                                  cudaMemcpyDeviceToHost, g->stream));
        cudaCheck(cudaStreamSynchronize(g->stream));
    }
    return 0;
fail:
    return -1;
}

extern "C" int gpu_model_set_row_offset(gpu_model *g, long row0, char err[ERR_MAX])
{
    cudaCheck(cudaSetDevice(g->device));
    k_set_i64<<<1, 1, 0, g->stream>>>(&g->st->row0, row0 < 0 ? 0 : (long long)row0);
    cudaCheckLast();
    return 0;
fail:
    return -1;
}

extern "C" int gpu_model_set_replicas(gpu_model *g, int replicas, char err[ERR_MAX])
{
    cudaCheck(cudaSetDevice(g->device));
    k_set_f32<<<1, 1, 0, g->stream>>>(&g->st->reg_scale,
                                     replicas > 1 ? 1.0f / (float)replicas : 1.0f);
    cudaCheckLast();
    return 0;
fail:
    return -1;
}

/* ================================================================ parameters */

extern "C" int gpu_model_get_params(gpu_model *g, float *params, float *slots,
                                    char err[ERR_MAX])
{
    cudaCheck(cudaSetDevice(g->device));
    if (params)
        cudaCheck(cudaMemcpyAsync(params, g->params, sizeof(float) * g->n_params,
                                  cudaMemcpyDeviceToHost, g->stream));
    if (slots && g->n_slots)
        cudaCheck(cudaMemcpyAsync(slots, g->slots,
                                  sizeof(float) * g->n_params * (size_t)g->n_slots,
                                  cudaMemcpyDeviceToHost, g->stream));
    cudaCheck(cudaStreamSynchronize(g->stream));
    return 0;
fail:
    return -1;
}

extern "C" int gpu_model_set_params(gpu_model *g, const float *params, const float *slots,
                                    char err[ERR_MAX])
{
    cudaCheck(cudaSetDevice(g->device));
    if (params)
        cudaCheck(cudaMemcpyAsync(g->params, params, sizeof(float) * g->n_params,
                                  cudaMemcpyHostToDevice, g->stream));
    if (slots && g->n_slots)
        cudaCheck(cudaMemcpyAsync(g->slots, slots,
                                  sizeof(float) * g->n_params * (size_t)g->n_slots,
                                  cudaMemcpyHostToDevice, g->stream));
    cudaCheck(cudaStreamSynchronize(g->stream));
    return 0;
fail:
    return -1;
}

extern "C" int gpu_model_get_grads(gpu_model *g, float *grads, char err[ERR_MAX])
{
    cudaCheck(cudaSetDevice(g->device));
    cudaCheck(cudaMemcpyAsync(grads, g->grads, sizeof(float) * g->n_params,
                              cudaMemcpyDeviceToHost, g->stream));
    cudaCheck(cudaStreamSynchronize(g->stream));
    return 0;
fail:
    return -1;
}

extern "C" int gpu_model_get_state(gpu_model *g, float *state, char err[ERR_MAX])
{
    if (!g->n_state)
        return 0;
    cudaCheck(cudaSetDevice(g->device));
    cudaCheck(cudaMemcpyAsync(state, g->state, sizeof(float) * g->n_state, cudaMemcpyDeviceToHost,
                              g->stream));
    cudaCheck(cudaStreamSynchronize(g->stream));
    return 0;
fail:
    return -1;
}

extern "C" int gpu_model_set_state(gpu_model *g, const float *state, char err[ERR_MAX])
{
    if (!g->n_state)
        return 0;
    cudaCheck(cudaSetDevice(g->device));
    cudaCheck(cudaMemcpyAsync(g->state, state, sizeof(float) * g->n_state, cudaMemcpyHostToDevice,
                              g->stream));
    cudaCheck(cudaStreamSynchronize(g->stream));
    return 0;
fail:
    return -1;
}

static int same_model(const gpu_model *g, const model *m, char *err)
{
    if (strcmp(model_signature(m), g->signature) != 0 || model_param_count(m) != g->n_params ||
        model_slot_count(m) != g->n_slots || model_state_count(m) != g->n_state)
        return gpu_errf(err, "the CPU model is not this model's (signature \"%s\" vs \"%s\")",
                        model_signature(m), g->signature);
    return 0;
}

extern "C" int gpu_model_to_host(gpu_model *g, model *m, char err[ERR_MAX])
{
    if (same_model(g, m, err) ||
        gpu_model_get_params(g, model_params(m), g->n_slots ? model_slots(m) : NULL, err) ||
        gpu_model_get_state(g, model_state(m), err))
        return -1;
    model_set_iterations(m, g->iterations);
    model_rng_set(m, g->rng);
    return 0;
}

extern "C" int gpu_model_from_host(gpu_model *g, model *m, char err[ERR_MAX])
{
    uint64_t s[4];
    if (same_model(g, m, err) ||
        gpu_model_set_params(g, model_params(m), g->n_slots ? model_slots(m) : NULL, err) ||
        gpu_model_set_state(g, model_state(m), err) ||
        gpu_model_set_iterations(g, model_iterations(m), err))
        return -1;
    model_rng_get(m, s);
    return gpu_model_rng_set(g, s, err);
}

extern "C" long gpu_model_iterations(const gpu_model *g) { return g->iterations; }

extern "C" int gpu_model_set_iterations(gpu_model *g, long it, char err[ERR_MAX])
{
    cudaCheck(cudaSetDevice(g->device));
    k_set_i64<<<1, 1, 0, g->stream>>>(&g->st->iterations, (long long)it);
    cudaCheckLast();
    cudaCheck(cudaStreamSynchronize(g->stream));
    g->iterations = it;
    return 0;
fail:
    return -1;
}

extern "C" void gpu_model_rng_get(const gpu_model *g, uint64_t s[4])
{
    memcpy(s, g->rng, sizeof g->rng);
}

extern "C" int gpu_model_rng_set(gpu_model *g, const uint64_t s[4], char err[ERR_MAX])
{
    memcpy(g->rng, s, sizeof g->rng);
    cudaCheck(cudaSetDevice(g->device));
    if (send_seeds(g, err))
        return -1;
    cudaCheck(cudaStreamSynchronize(g->stream));
    return 0;
fail:
    return -1;
}

extern "C" size_t gpu_model_param_count(const gpu_model *g) { return g->n_params; }
extern "C" int gpu_model_slot_count(const gpu_model *g) { return g->n_slots; }
extern "C" int gpu_model_tensor_count(const gpu_model *g) { return g->n_tensors; }
extern "C" const model_tensor *gpu_model_tensor_at(const gpu_model *g, int i)
{
    return (i >= 0 && i < g->n_tensors) ? &g->tensors[i] : NULL;
}
extern "C" int gpu_model_input_size(const gpu_model *g) { return g->in_size; }
extern "C" int gpu_model_output_size(const gpu_model *g) { return g->out_size; }
extern "C" int gpu_model_max_batch(const gpu_model *g) { return g->max_batch; }
extern "C" const char *gpu_model_signature(const gpu_model *g) { return g->signature; }
extern "C" float *gpu_model_params_device(gpu_model *g) { return g->params; }
extern "C" float *gpu_model_grads_device(gpu_model *g) { return g->grads; }
extern "C" float *gpu_model_slots_device(gpu_model *g) { return g->n_slots ? g->slots : NULL; }
extern "C" size_t gpu_model_state_count(const gpu_model *g) { return g->n_state; }
extern "C" int gpu_model_state_tensor_count(const gpu_model *g) { return g->n_state_tensors; }
extern "C" const model_tensor *gpu_model_state_tensor_at(const gpu_model *g, int i)
{
    return (i >= 0 && i < g->n_state_tensors) ? &g->state_tensors[i] : NULL;
}
extern "C" float *gpu_model_state_device(gpu_model *g) { return g->n_state ? g->state : NULL; }
extern "C" void *gpu_model_stream(gpu_model *g) { return (void *)g->stream; }
extern "C" int gpu_model_device(const gpu_model *g) { return g->device; }
