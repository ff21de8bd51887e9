/* gpu_conv.cu - the GPU engine's convolutional kernels (see gpu_conv.h):
 * executor/nn/conv.c's arithmetic with one thread per output element
 * (forward) or per input element (backward: a gather, no atomics), and the
 * two-stage per-channel sums of the conv bias gradient and batch
 * normalization.
 *
 * Sections: geometry, im2col/col2im, pooling, per-channel sums, batch
 * normalization. */
#include "gpu_conv.h"

#include <math.h>

#define BLOCK 256
#define RB_X 32                 /* per-channel sums: channels of a block */
#define RB_Y 8                  /* rows a block takes at a time */

#define GRID_STRIDE(i, total) \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (total); \
         i += (long long)gridDim.x * blockDim.x)

static unsigned grid_for(long long total)
{
    long long b = (total + BLOCK - 1) / BLOCK;
    if (b < 1)
        b = 1;
    return (unsigned)(b > 65535 * 8 ? 65535 * 8 : b);
}

/* Row groups of a per-channel sum over `rows` rows: about 256 rows each. */
static unsigned red_groups(long long rows)
{
    long long gr = (rows + 255) / 256;
    if (gr < 1)
        gr = 1;
    return (unsigned)(gr > GPU_RED_GROUPS ? GPU_RED_GROUPS : gr);
}

/* ================================================================ geometry */

/* Element idx of an (n, h, w, c) tensor: its row i, column j and channel
 * ch; returns its example. */
__device__ __forceinline__ long long d_unravel(long long idx, int h, int w, int c, int *i, int *j,
                                               int *ch)
{
    *ch = (int)(idx % c);
    long long t = idx / c;
    *j = (int)(t % w);
    t /= w;
    *i = (int)(t % h);
    return t / h;
}

/* The outputs whose window covers input row i: [*lo, *hi] (empty: lo > hi). */
__device__ __forceinline__ void d_cover(int i, int pad, int k, int s, int o, int *lo, int *hi)
{
    int a = i + pad - k + 1; /* the first window start that still reaches i */
    *lo = a <= 0 ? 0 : (a + s - 1) / s;
    int h = (i + pad) / s;
    *hi = h < o - 1 ? h : o - 1;
}

/* Input positions of the window of output o in a dimension of size in. */
__device__ __forceinline__ int d_valid(int o, int s, int pad, int k, int in)
{
    int a = o * s - pad, b = a + k;
    a = a < 0 ? 0 : a;
    b = b > in ? in : b;
    return b > a ? b - a : 0;
}

/* ================================================================ im2col */

__global__ void k_im2col(float *col, const float *x, long long total, gpu_geom g)
{
    const int K = g.kh * g.kw * g.c;
    GRID_STRIDE(idx, total) {
        long long row = idx / K;
        int k = (int)(idx - row * K);
        int ci = k % g.c, kj = (k / g.c) % g.kw, ki = k / (g.c * g.kw);
        int oj = (int)(row % g.ow);
        long long t = row / g.ow;
        int oi = (int)(t % g.oh);
        long long ni = t / g.oh;
        int ii = oi * g.sh - g.pad_top + ki, jj = oj * g.sw - g.pad_left + kj;
        float v = 0.0f;
        if (ii >= 0 && ii < g.h && jj >= 0 && jj < g.w)
            v = x[((ni * g.h + ii) * g.w + jj) * g.c + ci];
        col[idx] = v;
    }
}

/* One thread per input element: the col entries that read it, in the
 * order of the output rows (a raster scatter's order). */
__global__ void k_col2im(float *dx, const float *col, long long total, gpu_geom g)
{
    const int K = g.kh * g.kw * g.c;
    GRID_STRIDE(idx, total) {
        int ci, i, j;
        long long ni = d_unravel(idx, g.h, g.w, g.c, &i, &j, &ci);
        float s = 0.0f;
        for (int ki = g.kh - 1; ki >= 0; ki--) {
            int a = i + g.pad_top - ki;
            if (a < 0 || a % g.sh)
                continue;
            int oi = a / g.sh;
            if (oi >= g.oh)
                continue;
            for (int kj = g.kw - 1; kj >= 0; kj--) {
                int b = j + g.pad_left - kj;
                if (b < 0 || b % g.sw)
                    continue;
                int oj = b / g.sw;
                if (oj >= g.ow)
                    continue;
                s += col[((ni * g.oh + oi) * g.ow + oj) * K + (ki * g.kw + kj) * g.c + ci];
            }
        }
        dx[idx] = s;
    }
}

cudaError_t gpu_im2col(float *col, const float *x, int n, const gpu_geom *g, cudaStream_t s)
{
    long long total = (long long)n * g->oh * g->ow * g->kh * g->kw * g->c;
    k_im2col<<<grid_for(total), BLOCK, 0, s>>>(col, x, total, *g);
    return cudaGetLastError();
}

cudaError_t gpu_col2im(float *dx, const float *col, int n, const gpu_geom *g, cudaStream_t s)
{
    long long total = (long long)n * g->h * g->w * g->c;
    k_col2im<<<grid_for(total), BLOCK, 0, s>>>(dx, col, total, *g);
    return cudaGetLastError();
}

/* ================================================================ pooling */

__global__ void k_maxpool_fwd(float *y, int32_t *argmax, const float *x, long long total,
                              gpu_geom g)
{
    GRID_STRIDE(idx, total) {
        int ch, oi, oj;
        long long ni = d_unravel(idx, g.oh, g.ow, g.c, &oi, &oj, &ch);
        const float *xe = x + ni * g.h * g.w * g.c;
        float best = 0.0f;
        int arg = -1;
        for (int ki = 0; ki < g.kh; ki++) {
            int ii = oi * g.sh - g.pad_top + ki;
            if (ii < 0 || ii >= g.h)
                continue;
            for (int kj = 0; kj < g.kw; kj++) {
                int jj = oj * g.sw - g.pad_left + kj;
                if (jj < 0 || jj >= g.w)
                    continue;
                int at = (ii * g.w + jj) * g.c + ch;
                float v = xe[at];
                if (arg < 0 || v > best) { /* strictly greater: the first on ties */
                    best = v;
                    arg = at;
                }
            }
        }
        y[idx] = best;
        argmax[idx] = arg;
    }
}

__global__ void k_maxpool_bwd(float *dx, const float *dy, const int32_t *argmax,
                              long long total, gpu_geom g)
{
    GRID_STRIDE(idx, total) {
        int ch, i, j;
        long long ni = d_unravel(idx, g.h, g.w, g.c, &i, &j, &ch);
        int self = (i * g.w + j) * g.c + ch, oi0, oi1, oj0, oj1;
        d_cover(i, g.pad_top, g.kh, g.sh, g.oh, &oi0, &oi1);
        d_cover(j, g.pad_left, g.kw, g.sw, g.ow, &oj0, &oj1);
        float s = 0.0f;
        for (int oi = oi0; oi <= oi1; oi++)
            for (int oj = oj0; oj <= oj1; oj++) {
                long long o = ((ni * g.oh + oi) * g.ow + oj) * g.c + ch;
                if (argmax[o] == self)
                    s += dy[o];
            }
        dx[idx] = s;
    }
}

__global__ void k_avgpool_fwd(float *y, const float *x, long long total, gpu_geom g)
{
    GRID_STRIDE(idx, total) {
        int ch, oi, oj;
        long long ni = d_unravel(idx, g.oh, g.ow, g.c, &oi, &oj, &ch);
        const float *xe = x + ni * g.h * g.w * g.c;
        float s = 0.0f;
        int cnt = 0;
        for (int ki = 0; ki < g.kh; ki++) {
            int ii = oi * g.sh - g.pad_top + ki;
            if (ii < 0 || ii >= g.h)
                continue;
            for (int kj = 0; kj < g.kw; kj++) {
                int jj = oj * g.sw - g.pad_left + kj;
                if (jj < 0 || jj >= g.w)
                    continue;
                s += xe[(ii * g.w + jj) * g.c + ch];
                cnt++;
            }
        }
        y[idx] = s * (cnt > 0 ? 1.0f / (float)cnt : 0.0f);
    }
}

__global__ void k_avgpool_bwd(float *dx, const float *dy, long long total, gpu_geom g)
{
    GRID_STRIDE(idx, total) {
        int ch, i, j;
        long long ni = d_unravel(idx, g.h, g.w, g.c, &i, &j, &ch);
        int oi0, oi1, oj0, oj1;
        d_cover(i, g.pad_top, g.kh, g.sh, g.oh, &oi0, &oi1);
        d_cover(j, g.pad_left, g.kw, g.sw, g.ow, &oj0, &oj1);
        float s = 0.0f;
        for (int oi = oi0; oi <= oi1; oi++) {
            int ri = d_valid(oi, g.sh, g.pad_top, g.kh, g.h);
            for (int oj = oj0; oj <= oj1; oj++) {
                int cnt = ri * d_valid(oj, g.sw, g.pad_left, g.kw, g.w);
                s += dy[((ni * g.oh + oi) * g.ow + oj) * g.c + ch] * (1.0f / (float)cnt);
            }
        }
        dx[idx] = s;
    }
}

__global__ void k_gap_fwd(float *y, const float *x, long long total, int hw, int c)
{
    GRID_STRIDE(idx, total) {
        long long ni = idx / c;
        int ch = (int)(idx % c);
        const float *xe = x + ni * hw * c + ch;
        float s = 0.0f;
        for (int p = 0; p < hw; p++)
            s += xe[(long long)p * c];
        y[idx] = s * (1.0f / (float)hw);
    }
}

__global__ void k_gap_bwd(float *dx, const float *dy, long long total, int hw, int c)
{
    const float inv = 1.0f / (float)hw;
    GRID_STRIDE(idx, total) {
        int ch = (int)(idx % c);
        long long ni = idx / ((long long)hw * c);
        dx[idx] = dy[ni * c + ch] * inv;
    }
}

cudaError_t gpu_maxpool_forward(float *y, int32_t *argmax, const float *x, int n,
                                const gpu_geom *g, cudaStream_t s)
{
    long long total = (long long)n * g->oh * g->ow * g->c;
    k_maxpool_fwd<<<grid_for(total), BLOCK, 0, s>>>(y, argmax, x, total, *g);
    return cudaGetLastError();
}

cudaError_t gpu_maxpool_backward(float *dx, const float *dy, const int32_t *argmax, int n,
                                 const gpu_geom *g, cudaStream_t s)
{
    long long total = (long long)n * g->h * g->w * g->c;
    k_maxpool_bwd<<<grid_for(total), BLOCK, 0, s>>>(dx, dy, argmax, total, *g);
    return cudaGetLastError();
}

cudaError_t gpu_avgpool_forward(float *y, const float *x, int n, const gpu_geom *g,
                                cudaStream_t s)
{
    long long total = (long long)n * g->oh * g->ow * g->c;
    k_avgpool_fwd<<<grid_for(total), BLOCK, 0, s>>>(y, x, total, *g);
    return cudaGetLastError();
}

cudaError_t gpu_avgpool_backward(float *dx, const float *dy, int n, const gpu_geom *g,
                                 cudaStream_t s)
{
    long long total = (long long)n * g->h * g->w * g->c;
    k_avgpool_bwd<<<grid_for(total), BLOCK, 0, s>>>(dx, dy, total, *g);
    return cudaGetLastError();
}

cudaError_t gpu_gap_forward(float *y, const float *x, int n, int hw, int c, cudaStream_t s)
{
    long long total = (long long)n * c;
    k_gap_fwd<<<grid_for(total), BLOCK, 0, s>>>(y, x, total, hw, c);
    return cudaGetLastError();
}

cudaError_t gpu_gap_backward(float *dx, const float *dy, int n, int hw, int c, cudaStream_t s)
{
    long long total = (long long)n * hw * c;
    k_gap_bwd<<<grid_for(total), BLOCK, 0, s>>>(dx, dy, total, hw, c);
    return cudaGetLastError();
}

/* ================================================================ per-channel sums */

enum { RED_BIAS = 0, RED_STATS = 1, RED_BN_BWD = 2 };

/* Stage 1 over a (rows, c) matrix a: block (RB_X channels, RB_Y rows),
 * grid (channel tiles, row groups); each group writes its two partial sums
 * per channel to part[(group * c + ch) * 2 + {0, 1}]:
 *   RED_BIAS:   a (relu: b = the relu's output, a = b > 0 ? a : 0 first);
 *   RED_STATS:  a - k, (a - k)^2 with k the channel's first row (conv.c's
 *               shifted data: no cancellation when the mean is large);
 *   RED_BN_BWD: a (= dy), a * (b - mean) * invstd (b = x). */
__global__ void k_chan_partial(int mode, float *a, const float *b, const float *mean,
                               const float *invstd, long long rows, int c, double *part)
{
    __shared__ double s0[RB_Y][RB_X], s1[RB_Y][RB_X];
    int ch = blockIdx.x * RB_X + threadIdx.x;
    double a0 = 0.0, a1 = 0.0;
    if (ch < c) {
        const float m = mode == RED_BN_BWD ? mean[ch] : 0.0f;
        const float is = mode == RED_BN_BWD ? invstd[ch] : 0.0f;
        const double k = mode == RED_STATS ? (double)a[ch] : 0.0;
        for (long long r = (long long)blockIdx.y * RB_Y + threadIdx.y; r < rows;
             r += (long long)gridDim.y * RB_Y) {
            long long idx = r * c + ch;
            float v = a[idx];
            if (mode == RED_BIAS) {
                if (b && !(b[idx] > 0.0f)) {
                    v = 0.0f;
                    a[idx] = 0.0f;
                }
                a0 += v;
            } else if (mode == RED_STATS) {
                double d = (double)v - k;
                a0 += d;
                a1 += d * d;
            } else {
                float xh = (b[idx] - m) * is;
                a0 += v;
                a1 += (double)v * xh;
            }
        }
    }
    s0[threadIdx.y][threadIdx.x] = a0;
    s1[threadIdx.y][threadIdx.x] = a1;
    __syncthreads();
    if (threadIdx.y == 0 && ch < c) {
        double t0 = 0.0, t1 = 0.0;
        for (int r = 0; r < RB_Y; r++) {
            t0 += s0[r][threadIdx.x];
            t1 += s1[r][threadIdx.x];
        }
        double *p = part + ((long long)blockIdx.y * c + ch) * 2;
        p[0] = t0;
        p[1] = t1;
    }
}

static cudaError_t chan_partial(int mode, float *a, const float *b, const float *mean,
                                const float *invstd, long long rows, int c, double *part,
                                unsigned groups, cudaStream_t s)
{
    dim3 grid((unsigned)((c + RB_X - 1) / RB_X), groups), block(RB_X, RB_Y);
    k_chan_partial<<<grid, block, 0, s>>>(mode, a, b, mean, invstd, rows, c, part);
    return cudaGetLastError();
}

/* Stage 2: channel ch's sums over the groups, in group order. */
__device__ __forceinline__ void d_chan_total(const double *part, int groups, int c, int ch,
                                             double *t0, double *t1)
{
    double a = 0.0, b = 0.0;
    for (int gi = 0; gi < groups; gi++) {
        a += part[((long long)gi * c + ch) * 2];
        b += part[((long long)gi * c + ch) * 2 + 1];
    }
    *t0 = a;
    *t1 = b;
}

__global__ void k_bias_final(const double *part, int groups, int c, float *db, int accumulate)
{
    int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= c)
        return;
    double s, unused;
    d_chan_total(part, groups, c, ch, &s, &unused);
    db[ch] = accumulate ? db[ch] + (float)s : (float)s;
}

cudaError_t gpu_bias_grad_rows(float *dy, const float *relu_y, float *db, long long rows, int c,
                               int accumulate, double *part, cudaStream_t s)
{
    unsigned gr = red_groups(rows);
    cudaError_t e = chan_partial(RED_BIAS, dy, relu_y, NULL, NULL, rows, c, part, gr, s);
    if (e != cudaSuccess)
        return e;
    k_bias_final<<<(c + 127) / 128, 128, 0, s>>>(part, (int)gr, c, db, accumulate);
    return cudaGetLastError();
}

/* ================================================================ batch normalization */

/* The batch's statistics from the shifted sums (conv.c's bn_forward_train,
 * in double), and the moving statistics' update. x: for the shift. */
__global__ void k_bn_stats_final(const double *part, int groups, int c, long long rows,
                                 const float *x, float eps, float momentum, float *mean,
                                 float *invstd, float *mm, float *mv)
{
    int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= c)
        return;
    double s1, s2;
    d_chan_total(part, groups, c, ch, &s1, &s2);
    const double inv_rows = 1.0 / (double)rows;
    const double unbias = rows > 1 ? (double)rows / (double)(rows - 1) : 1.0;
    double d = s1 * inv_rows;
    double var = s2 * inv_rows - d * d;
    if (var < 0.0)
        var = 0.0;
    double mu = (double)x[ch] + d;
    mean[ch] = (float)mu;
    invstd[ch] = (float)(1.0 / sqrt(var + (double)eps));
    mm[ch] = (float)((double)momentum * mm[ch] + (1.0 - (double)momentum) * mu);
    mv[ch] = (float)((double)momentum * mv[ch] + (1.0 - (double)momentum) * var * unbias);
}

/* y = (x - m) * a + b with a = invstd * gamma, b = beta (conv.c's
 * bn_apply: the same rounding); m, invstd the batch's (training) or, with
 * eval, the moving mean and 1 / sqrt(moving variance + eps) in double. */
__global__ void k_bn_apply(float *y, const float *x, long long total, int c, const float *m,
                           const float *invstd, const float *mv, float eps, int eval,
                           const float *gamma, const float *beta)
{
    GRID_STRIDE(idx, total) {
        int ch = (int)(idx % c);
        float is = eval ? (float)(1.0 / sqrt((double)mv[ch] + (double)eps)) : invstd[ch];
        float a = is * (gamma ? gamma[ch] : 1.0f);
        float b = beta ? beta[ch] : 0.0f;
        y[idx] = (x[idx] - m[ch]) * a + b;
    }
}

__global__ void k_bn_bwd_final(const double *part, int groups, int c, long long rows,
                               float *dgamma, float *dbeta, int accumulate, float *sums)
{
    int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= c)
        return;
    double sdy, sdyx;
    d_chan_total(part, groups, c, ch, &sdy, &sdyx);
    /* the means dx needs, as conv.c's bn_backward rounds them */
    sums[ch] = (float)(sdy / (double)rows);
    sums[c + ch] = (float)(sdyx / (double)rows);
    if (dbeta)
        dbeta[ch] = (float)(accumulate ? dbeta[ch] + sdy : sdy);
    if (dgamma)
        dgamma[ch] = (float)(accumulate ? dgamma[ch] + sdyx : sdyx);
}

/* dx = gamma * invstd * (dy - mean(dy) - xhat * mean(dy * xhat)); dx may
 * be dy. */
__global__ void k_bn_bwd_dx(float *dx, const float *dy, const float *x, long long total, int c,
                            const float *mean, const float *invstd, const float *gamma,
                            const float *sums)
{
    GRID_STRIDE(idx, total) {
        int ch = (int)(idx % c);
        float is = invstd[ch];
        float xh = (x[idx] - mean[ch]) * is;
        float a = is * (gamma ? gamma[ch] : 1.0f);
        dx[idx] = a * (dy[idx] - sums[ch] - xh * sums[c + ch]);
    }
}

cudaError_t gpu_bn_forward_train(float *y, float *mean, float *invstd, const float *x,
                                 long long rows, int c, const float *gamma, const float *beta,
                                 float eps, float momentum, float *moving_mean,
                                 float *moving_var, double *part, cudaStream_t s)
{
    unsigned gr = red_groups(rows);
    long long total = rows * c;
    /* RED_STATS reads a only: the cast drops nothing it writes */
    cudaError_t e = chan_partial(RED_STATS, (float *)x, NULL, NULL, NULL, rows, c, part, gr, s);
    if (e != cudaSuccess)
        return e;
    k_bn_stats_final<<<(c + 127) / 128, 128, 0, s>>>(part, (int)gr, c, rows, x, eps, momentum,
                                                   mean, invstd, moving_mean, moving_var);
    if ((e = cudaGetLastError()) != cudaSuccess)
        return e;
    k_bn_apply<<<grid_for(total), BLOCK, 0, s>>>(y, x, total, c, mean, invstd, NULL, eps, 0, gamma,
                                                 beta);
    return cudaGetLastError();
}

cudaError_t gpu_bn_forward_eval(float *y, const float *x, long long rows, int c,
                                const float *gamma, const float *beta, float eps,
                                const float *moving_mean, const float *moving_var,
                                cudaStream_t s)
{
    long long total = rows * c;
    k_bn_apply<<<grid_for(total), BLOCK, 0, s>>>(y, x, total, c, moving_mean, NULL, moving_var,
                                                 eps, 1, gamma, beta);
    return cudaGetLastError();
}

cudaError_t gpu_bn_backward(float *dx, float *dgamma, float *dbeta, const float *dy,
                            const float *x, const float *mean, const float *invstd,
                            const float *gamma, long long rows, int c, int accumulate,
                            float *sums, double *part, cudaStream_t s)
{
    unsigned gr = red_groups(rows);
    long long total = rows * c;
    /* RED_BN_BWD reads a (dy) only */
    cudaError_t e = chan_partial(RED_BN_BWD, (float *)dy, x, mean, invstd, rows, c, part, gr, s);
    if (e != cudaSuccess)
        return e;
    k_bn_bwd_final<<<(c + 127) / 128, 128, 0, s>>>(part, (int)gr, c, rows, dgamma, dbeta,
                                                 accumulate, sums);
    if ((e = cudaGetLastError()) != cudaSuccess || !dx)
        return e;
    k_bn_bwd_dx<<<grid_for(total), BLOCK, 0, s>>>(dx, dy, x, total, c, mean, invstd, gamma, sums);
    return cudaGetLastError();
}
