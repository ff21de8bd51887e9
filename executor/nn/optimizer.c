/* optimizer.c - the update rules (see optimizer.h). Each is one vectorizable
 * pass over the flat buffers. */
#include "optimizer.h"

#include <math.h>

/* sqrtf without errno lets GCC emit vector square roots. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-math-errno")
#endif

int optimizer_slot_count(const optimizer_spec *o)
{
    switch (o->type) {
    case OPT_SGD:
        return o->momentum != 0.0f ? 1 : 0;
    case OPT_RMSPROP:
        return 1 + (o->centered ? 1 : 0) + (o->momentum != 0.0f ? 1 : 0);
    case OPT_ADAM:
        return o->amsgrad ? 3 : 2;
    case OPT_ADAGRAD:
        return 1;
    }
    return 0;
}

const char *optimizer_slot_name(const optimizer_spec *o, int s)
{
    switch (o->type) {
    case OPT_SGD:
        return "momentum";
    case OPT_RMSPROP:
        if (s == 0)
            return "velocity";
        if (s == 1 && o->centered)
            return "average_gradient";
        return "momentum";
    case OPT_ADAM:
        return s == 0 ? "momentum" : (s == 1 ? "velocity" : "velocity_hat");
    case OPT_ADAGRAD:
        return "accumulator";
    }
    return "slot";
}

void optimizer_init_slots(const optimizer_spec *o, float *slots, size_t n)
{
    size_t total = n * (size_t)optimizer_slot_count(o);
    float v = o->type == OPT_ADAGRAD ? o->initial_accumulator_value : 0.0f;
    for (size_t i = 0; i < total; i++)
        slots[i] = v;
}

static void sgd_step(const optimizer_spec *o, float *restrict w, const float *restrict g,
                     float *restrict m, size_t n)
{
    const float lr = o->learning_rate, mu = o->momentum;
    if (mu == 0.0f) {
        for (size_t i = 0; i < n; i++)
            w[i] -= lr * g[i];
    } else if (o->nesterov) {
        for (size_t i = 0; i < n; i++) {
            float v = mu * m[i] - lr * g[i];
            m[i] = v;
            w[i] += mu * v - lr * g[i];
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            float v = mu * m[i] - lr * g[i];
            m[i] = v;
            w[i] += v;
        }
    }
}

static void rmsprop_step(const optimizer_spec *o, float *restrict w, const float *restrict g,
                         float *restrict slots, size_t n)
{
    const float lr = o->learning_rate, rho = o->rho, eps = o->epsilon, mu = o->momentum;
    float *restrict vel = slots;
    float *restrict avg = o->centered ? slots + n : NULL;
    float *restrict mom = mu != 0.0f ? slots + n * (o->centered ? 2 : 1) : NULL;
    if (!avg && !mom) {
        for (size_t i = 0; i < n; i++) {
            float v = rho * vel[i] + (1.0f - rho) * g[i] * g[i];
            vel[i] = v;
            w[i] -= lr * g[i] / sqrtf(v + eps);
        }
        return;
    }
    for (size_t i = 0; i < n; i++) {
        float v = rho * vel[i] + (1.0f - rho) * g[i] * g[i];
        vel[i] = v;
        float den = v;
        if (avg) {
            float a = rho * avg[i] + (1.0f - rho) * g[i];
            avg[i] = a;
            den = v - a * a;
        }
        float inc = lr * g[i] / sqrtf(den + eps);
        if (mom) {
            float mm = mu * mom[i] + inc;
            mom[i] = mm;
            w[i] -= mm;
        } else {
            w[i] -= inc;
        }
    }
}

static void adam_step(const optimizer_spec *o, float *restrict w, const float *restrict g,
                      float *restrict slots, size_t n, long iteration)
{
    const float b1 = o->beta_1, b2 = o->beta_2, eps = o->epsilon;
    double t = (double)iteration + 1.0;
    double b1p = pow((double)b1, t), b2p = pow((double)b2, t);
    const float alpha = (float)((double)o->learning_rate * sqrt(1.0 - b2p) / (1.0 - b1p));
    float *restrict m = slots;
    float *restrict v = slots + n;
    float *restrict vh = o->amsgrad ? slots + 2 * n : NULL;
    for (size_t i = 0; i < n; i++) {
        float mi = m[i] + (g[i] - m[i]) * (1.0f - b1);
        float vi = v[i] + (g[i] * g[i] - v[i]) * (1.0f - b2);
        m[i] = mi;
        v[i] = vi;
        if (vh) {
            vi = vh[i] > vi ? vh[i] : vi;
            vh[i] = vi;
        }
        w[i] -= (mi * alpha) / (sqrtf(vi) + eps);
    }
}

static void adagrad_step(const optimizer_spec *o, float *restrict w, const float *restrict g,
                         float *restrict acc, size_t n)
{
    const float lr = o->learning_rate, eps = o->epsilon;
    for (size_t i = 0; i < n; i++) {
        float a = acc[i] + g[i] * g[i];
        acc[i] = a;
        w[i] -= lr * g[i] / sqrtf(a + eps);
    }
}

void optimizer_step(const optimizer_spec *o, float *params, const float *grads,
                    float *slots, size_t n, long iteration)
{
    switch (o->type) {
    case OPT_SGD:
        sgd_step(o, params, grads, slots, n);
        break;
    case OPT_RMSPROP:
        rmsprop_step(o, params, grads, slots, n);
        break;
    case OPT_ADAM:
        adam_step(o, params, grads, slots, n, iteration);
        break;
    case OPT_ADAGRAD:
        adagrad_step(o, params, grads, slots, n);
        break;
    }
}
