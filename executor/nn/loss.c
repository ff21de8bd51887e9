/* loss.c - loss values, their gradients and accuracy (see loss.h). */
#include "loss.h"

#include <math.h>

act_type loss_fused_act(loss_type l)
{
    switch (l) {
    case LOSS_CATEGORICAL_CROSSENTROPY:
    case LOSS_SPARSE_CATEGORICAL_CROSSENTROPY:
        return ACT_SOFTMAX;
    case LOSS_BINARY_CROSSENTROPY:
        return ACT_SIGMOID;
    case LOSS_MSE:
        break;
    }
    return ACT_LINEAR;
}

/* Class index of a label, clamped into [0, k) so a bad label cannot reach
 * outside the row. */
static int label_class(float y, int k)
{
    if (!(y >= 0.0f))
        return 0;
    int c = (int)y;
    return c >= k ? k - 1 : c;
}

/* Target j of an example: the value itself for one output, else one-hot. */
static inline float target(float y, int j, int k, int c)
{
    return k == 1 ? y : (j == c ? 1.0f : 0.0f);
}

static int argmax(const float *v, int k)
{
    int best = 0;
    for (int j = 1; j < k; j++)
        if (v[j] > v[best])
            best = j;
    return best;
}

static float clampf(float v, float lo, float hi)
{
    return v < lo ? lo : (v > hi ? hi : v);
}

double loss_forward_backward(loss_type l, int fused, const float *out, const float *y,
                             int n, int k, int global_batch, float *dout, long *correct)
{
    const float invb = 1.0f / (float)global_batch;
    const float eps = NN_EPSILON;
    double total = 0.0;
    long right = 0;
    for (int i = 0; i < n; i++) {
        const float *o = out + (long)i * k;
        float *d = dout ? dout + (long)i * k : NULL;
        int c = label_class(y[i], k);
        /* accuracy: on probabilities for k == 1 (sigmoid(logit) > 0.5 iff
         * logit > 0), argmax otherwise (softmax keeps the argmax). */
        if (k == 1) {
            float thr = (fused && l == LOSS_BINARY_CROSSENTROPY) ? 0.0f : 0.5f;
            int pred = o[0] > thr;
            right += pred == (y[i] > 0.5f);
        } else {
            right += argmax(o, k) == c;
        }
        if (fused && (l == LOSS_CATEGORICAL_CROSSENTROPY ||
                      l == LOSS_SPARSE_CATEGORICAL_CROSSENTROPY)) {
            float m = o[0];
            for (int j = 1; j < k; j++)
                m = o[j] > m ? o[j] : m;
            float s = 0.0f;
            for (int j = 0; j < k; j++)
                s += expf(o[j] - m);
            total += (double)(logf(s) + m - o[c]);
            if (d) {
                float inv = invb / s;
                for (int j = 0; j < k; j++)
                    d[j] = expf(o[j] - m) * inv;
                d[c] -= invb;
            }
        } else if (fused && l == LOSS_BINARY_CROSSENTROPY) {
            /* max(u,0) - u t + log(1 + exp(-|u|)), averaged over k */
            double s = 0.0;
            float invk = invb / (float)k;
            for (int j = 0; j < k; j++) {
                float u = o[j], t = target(y[i], j, k, c);
                s += (double)(fmaxf(u, 0.0f) - u * t + log1pf(expf(-fabsf(u))));
                if (d) {
                    float p = u >= 0.0f ? 1.0f / (1.0f + expf(-u)) : expf(u) / (1.0f + expf(u));
                    d[j] = (p - t) * invk;
                }
            }
            total += s / k;
        } else if (l == LOSS_BINARY_CROSSENTROPY) {
            /* Keras: clip to [eps, 1-eps], then t log(p+eps) + (1-t) log(1-p+eps) */
            double s = 0.0;
            float invk = invb / (float)k;
            for (int j = 0; j < k; j++) {
                float t = target(y[i], j, k, c);
                float p = clampf(o[j], eps, 1.0f - eps);
                s -= (double)(t * logf(p + eps) + (1.0f - t) * logf(1.0f - p + eps));
                if (d) {
                    int inside = o[j] > eps && o[j] < 1.0f - eps;
                    d[j] = inside ? -(t / (p + eps) - (1.0f - t) / (1.0f - p + eps)) * invk : 0.0f;
                }
            }
            total += s / k;
        } else if (l == LOSS_CATEGORICAL_CROSSENTROPY || l == LOSS_SPARSE_CATEGORICAL_CROSSENTROPY) {
            /* Keras on probabilities: p = out / sum(out), clipped; -log p[c] */
            float s = 0.0f;
            for (int j = 0; j < k; j++)
                s += o[j];
            float q = o[c] / s;
            float p = clampf(q, eps, 1.0f - eps);
            total -= (double)logf(p);
            if (d) {
                int inside = q > eps && q < 1.0f - eps;
                for (int j = 0; j < k; j++)
                    d[j] = inside ? invb / s : 0.0f;
                if (inside)
                    d[c] -= invb / o[c];
            }
        } else { /* LOSS_MSE: mean over k of (o - t)^2 */
            double s = 0.0;
            float g = 2.0f * invb / (float)k;
            for (int j = 0; j < k; j++) {
                float e = o[j] - target(y[i], j, k, c);
                s += (double)e * e;
                if (d)
                    d[j] = g * e;
            }
            total += s / k;
        }
    }
    if (correct)
        *correct += right;
    return total;
}
