/* layers.c - dense, activation and dropout kernels (see layers.h).
 *
 * The dense forward is one cblas_sgemm and one fused pass over its output
 * (bias + activation + dropout); the backward fuses the activation's
 * derivative (and dropout's) with the bias gradient, then two GEMMs. */
#include "layers.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

void dropout_cfg_init(dropout_cfg *d, float rate)
{
    d->rate = rate;
    if (rate <= 0.0f) {
        d->rate = 0.0f;
        d->scale = 1.0f;
        d->keep_threshold = UINT32_MAX;
        return;
    }
    d->scale = 1.0f / (1.0f - rate);
    double t = (1.0 - (double)rate) * 4294967296.0 + 0.5;
    d->keep_threshold = t >= 4294967295.0 ? UINT32_MAX : (uint32_t)t;
}

/* The n keep draws of global row `row` (nn_dropout_u32 for j = 0..n-1). */
static void row_fill_u32(uint32_t *u, int n, const dropout_key *key, long row)
{
    uint64_t rk = nn_dropout_row_key(key->seed, key->layer, key->step, row);
    int j = 0;
    for (; j + 1 < n; j += 2) {
        uint64_t r = nn_mix64(rk + (uint64_t)(j >> 1) * 0x9e3779b97f4a7c15ULL);
        u[j] = (uint32_t)r;
        u[j + 1] = (uint32_t)(r >> 32);
    }
    if (j < n)
        u[j] = nn_dropout_u32(rk, j);
}

static float sigmoidf(float v)
{
    if (v >= 0.0f)
        return 1.0f / (1.0f + expf(-v));
    float e = expf(v);
    return e / (1.0f + e);
}

static void softmax_row(float *y, int k)
{
    float m = y[0];
    for (int j = 1; j < k; j++)
        m = y[j] > m ? y[j] : m;
    float s = 0.0f;
    for (int j = 0; j < k; j++) {
        y[j] = expf(y[j] - m);
        s += y[j];
    }
    float inv = 1.0f / s;
    for (int j = 0; j < k; j++)
        y[j] *= inv;
}

void act_forward(float *y, int n, int k, act_type act)
{
    long total = (long)n * k;
    switch (act) {
    case ACT_LINEAR:
        break;
    case ACT_RELU:
        for (long i = 0; i < total; i++)
            y[i] = y[i] > 0.0f ? y[i] : 0.0f;
        break;
    case ACT_SIGMOID:
        for (long i = 0; i < total; i++)
            y[i] = sigmoidf(y[i]);
        break;
    case ACT_TANH:
        for (long i = 0; i < total; i++)
            y[i] = tanhf(y[i]);
        break;
    case ACT_SOFTMAX:
        for (int i = 0; i < n; i++)
            softmax_row(y + (long)i * k, k);
        break;
    }
}

void act_backward(float *dy, const float *y, int n, int k, act_type act)
{
    long total = (long)n * k;
    switch (act) {
    case ACT_LINEAR:
        break;
    case ACT_RELU:
        for (long i = 0; i < total; i++)
            dy[i] = y[i] > 0.0f ? dy[i] : 0.0f;
        break;
    case ACT_SIGMOID:
        for (long i = 0; i < total; i++)
            dy[i] *= y[i] * (1.0f - y[i]);
        break;
    case ACT_TANH:
        for (long i = 0; i < total; i++)
            dy[i] *= 1.0f - y[i] * y[i];
        break;
    case ACT_SOFTMAX:
        for (int i = 0; i < n; i++) {
            float *d = dy + (long)i * k;
            const float *p = y + (long)i * k;
            float dot = 0.0f;
            for (int j = 0; j < k; j++)
                dot += d[j] * p[j];
            for (int j = 0; j < k; j++)
                d[j] = p[j] * (d[j] - dot);
        }
        break;
    }
}

void dense_forward(float *y, const float *x, const float *w, const float *b,
                   int n, int in, int out, act_type act,
                   const dropout_cfg *drop, const dropout_key *key, uint32_t *scratch)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, out, in,
                1.0f, x, in, w, out, 0.0f, y, out);
    int fuse_drop = drop && drop->rate > 0.0f;
    if (act == ACT_RELU) {
        const float scale = fuse_drop ? drop->scale : 1.0f;
        const uint32_t thr = fuse_drop ? drop->keep_threshold : 0;
        for (int i = 0; i < n; i++) {
            float *restrict yr = y + (long)i * out;
            if (fuse_drop) {
                row_fill_u32(scratch, out, key, key->row0 + i);
                const uint32_t *restrict u = scratch;
                if (b) {
                    for (int j = 0; j < out; j++) {
                        float v = yr[j] + b[j];
                        v = v > 0.0f ? v : 0.0f;
                        yr[j] = u[j] < thr ? v * scale : 0.0f;
                    }
                } else {
                    for (int j = 0; j < out; j++) {
                        float v = yr[j] > 0.0f ? yr[j] : 0.0f;
                        yr[j] = u[j] < thr ? v * scale : 0.0f;
                    }
                }
            } else if (b) {
                for (int j = 0; j < out; j++) {
                    float v = yr[j] + b[j];
                    yr[j] = v > 0.0f ? v : 0.0f;
                }
            } else {
                for (int j = 0; j < out; j++)
                    yr[j] = yr[j] > 0.0f ? yr[j] : 0.0f;
            }
        }
        return;
    }
    if (b) {
        for (int i = 0; i < n; i++) {
            float *restrict yr = y + (long)i * out;
            for (int j = 0; j < out; j++)
                yr[j] += b[j];
        }
    }
    act_forward(y, n, out, act);
}

void dense_backward(float *dx, float *dw, float *db, float *dy, const float *y,
                    const float *x, const float *w, int n, int in, int out,
                    act_type act, const dropout_cfg *drop, int act_done, int accumulate)
{
    /* dy -> gradient at the pre-activation, fused with the bias gradient
     * (added row by row to db: accumulating continues the same sum). */
    if (db && !accumulate)
        memset(db, 0, sizeof(float) * (size_t)out);
    if (!act_done && act == ACT_RELU) {
        const float scale = (drop && drop->rate > 0.0f) ? drop->scale : 1.0f;
        for (int i = 0; i < n; i++) {
            float *restrict d = dy + (long)i * out;
            const float *restrict yr = y + (long)i * out;
            if (db) {
                float *restrict g = db;
                for (int j = 0; j < out; j++) {
                    float v = yr[j] > 0.0f ? d[j] * scale : 0.0f;
                    d[j] = v;
                    g[j] += v;
                }
            } else {
                for (int j = 0; j < out; j++)
                    d[j] = yr[j] > 0.0f ? d[j] * scale : 0.0f;
            }
        }
    } else {
        if (!act_done)
            act_backward(dy, y, n, out, act);
        if (db) {
            for (int i = 0; i < n; i++) {
                const float *restrict d = dy + (long)i * out;
                float *restrict g = db;
                for (int j = 0; j < out; j++)
                    g[j] += d[j];
            }
        }
    }
    /* dw (in, out) = x^T (in, n) . dy (n, out) */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, in, out, n,
                1.0f, x, in, dy, out, accumulate ? 1.0f : 0.0f, dw, out);
    /* dx (n, in) = dy (n, out) . w^T (out, in) */
    if (dx)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, in, out,
                    1.0f, dy, out, w, out, 0.0f, dx, in);
}

void dropout_forward(float *y, float *mask, int n, int k, const dropout_cfg *d,
                     const dropout_key *key)
{
    long total = (long)n * k;
    if (d->rate <= 0.0f) {
        for (long i = 0; i < total; i++)
            mask[i] = 1.0f;
        return;
    }
    uint32_t *u = (uint32_t *)mask; /* same size: draw in place, then map */
    for (int i = 0; i < n; i++)
        row_fill_u32(u + (long)i * k, k, key, key->row0 + i);
    const uint32_t thr = d->keep_threshold;
    const float scale = d->scale;
    for (long i = 0; i < total; i++) {
        uint32_t v;
        memcpy(&v, &mask[i], sizeof v);
        float m = v < thr ? scale : 0.0f;
        mask[i] = m;
        y[i] *= m;
    }
}

void dropout_backward(float *dy, const float *mask, int n, int k)
{
    long total = (long)n * k;
    for (long i = 0; i < total; i++)
        dy[i] *= mask[i];
}

void init_fill(float *p, long count, int fan_in, int fan_out, init_type t, nn_rng *rng)
{
    switch (t) {
    case INIT_ZEROS:
        memset(p, 0, sizeof(float) * (size_t)count);
        break;
    case INIT_GLOROT_UNIFORM: {
        double limit = sqrt(6.0 / (double)(fan_in + fan_out));
        for (long i = 0; i < count; i++)
            p[i] = (float)((2.0 * nn_rng_uniform(rng) - 1.0) * limit);
        break;
    }
    case INIT_HE_NORMAL: {
        /* Keras: truncated normal (|z| <= 2) with the stddev corrected for
         * the truncation. */
        double sd = sqrt(2.0 / (double)fan_in) / 0.87962566103423978;
        for (long i = 0; i < count; i++) {
            double z;
            do
                z = nn_rng_normal(rng);
            while (z < -2.0 || z > 2.0);
            p[i] = (float)(z * sd);
        }
        break;
    }
    }
}
