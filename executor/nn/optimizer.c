/* optimizer.c - the update rules (see optimizer.h). Each is one vectorizable
 * pass over the flat buffers. */
#include "optimizer.h"

#include <math.h>
#include <string.h>

/* GCC does not vectorize sqrtf (errno) without -fno-math-errno, so the hot
 * loops use vector types: V floats at a time, the scalar loop for the rest.
 * sqrt and division are correctly rounded either way. */
#if defined(__AVX512F__)
#include <immintrin.h>
#define V 16
typedef float vf __attribute__((vector_size(64)));
static inline vf vsqrt(vf x) { return (vf)_mm512_sqrt_ps((__m512)x); }
static inline vf vmax(vf a, vf b) { return (vf)_mm512_max_ps((__m512)a, (__m512)b); }
#elif defined(__AVX__)
#include <immintrin.h>
#define V 8
typedef float vf __attribute__((vector_size(32)));
static inline vf vsqrt(vf x) { return (vf)_mm256_sqrt_ps((__m256)x); }
static inline vf vmax(vf a, vf b) { return (vf)_mm256_max_ps((__m256)a, (__m256)b); }
#else
#define V 0
#endif

#if V
static inline vf vload(const float *p) { vf v; memcpy(&v, p, sizeof v); return v; }
static inline void vstore(float *p, vf v) { memcpy(p, &v, sizeof v); }
static inline vf vset(float x) { vf v; for (int i = 0; i < V; i++) v[i] = x; return v; }
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
                         float *restrict slots, size_t n, size_t st)
{
    const float lr = o->learning_rate, rho = o->rho, eps = o->epsilon, mu = o->momentum;
    float *restrict vel = slots;
    float *restrict avg = o->centered ? slots + st : NULL;
    float *restrict mom = mu != 0.0f ? slots + st * (o->centered ? 2 : 1) : NULL;
    if (!avg && !mom) {
        size_t i = 0;
#if V
        const vf vrho = vset(rho), vone = vset(1.0f - rho), veps = vset(eps), vlr = vset(lr);
        for (; i + V <= n; i += V) {
            vf gi = vload(g + i);
            vf v = vrho * vload(vel + i) + vone * gi * gi;
            vstore(vel + i, v);
            vstore(w + i, vload(w + i) - vlr * gi / vsqrt(v + veps));
        }
#endif
        for (; i < n; i++) {
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
                      float *restrict slots, size_t n, size_t st, long iteration)
{
    const float b1 = o->beta_1, b2 = o->beta_2, eps = o->epsilon;
    double t = (double)iteration + 1.0;
    double b1p = pow((double)b1, t), b2p = pow((double)b2, t);
    const float alpha = (float)((double)o->learning_rate * sqrt(1.0 - b2p) / (1.0 - b1p));
    float *restrict m = slots;
    float *restrict v = slots + st;
    float *restrict vh = o->amsgrad ? slots + 2 * st : NULL;
    size_t i = 0;
#if V
    if (!vh) {
        const vf c1 = vset(1.0f - b1), c2 = vset(1.0f - b2), va = vset(alpha), ve = vset(eps);
        for (; i + V <= n; i += V) {
            vf gi = vload(g + i), mi = vload(m + i), vi = vload(v + i);
            mi = mi + (gi - mi) * c1;
            vi = vi + (gi * gi - vi) * c2;
            vstore(m + i, mi);
            vstore(v + i, vi);
            vstore(w + i, vload(w + i) - (mi * va) / (vsqrt(vi) + ve));
        }
    } else {
        const vf c1 = vset(1.0f - b1), c2 = vset(1.0f - b2), va = vset(alpha), ve = vset(eps);
        for (; i + V <= n; i += V) {
            vf gi = vload(g + i), mi = vload(m + i), vi = vload(v + i);
            mi = mi + (gi - mi) * c1;
            vi = vi + (gi * gi - vi) * c2;
            vstore(m + i, mi);
            vstore(v + i, vi);
            vi = vmax(vload(vh + i), vi);
            vstore(vh + i, vi);
            vstore(w + i, vload(w + i) - (mi * va) / (vsqrt(vi) + ve));
        }
    }
#endif
    for (; i < n; i++) {
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
    size_t i = 0;
#if V
    const vf vlr = vset(lr), veps = vset(eps);
    for (; i + V <= n; i += V) {
        vf gi = vload(g + i);
        vf a = vload(acc + i) + gi * gi;
        vstore(acc + i, a);
        vstore(w + i, vload(w + i) - vlr * gi / vsqrt(a + veps));
    }
#endif
    for (; i < n; i++) {
        float a = acc[i] + g[i] * g[i];
        acc[i] = a;
        w[i] -= lr * g[i] / sqrtf(a + eps);
    }
}

void optimizer_step(const optimizer_spec *o, float *params, const float *grads,
                    float *slots, size_t n, size_t slot_stride, long iteration)
{
    switch (o->type) {
    case OPT_SGD:
        sgd_step(o, params, grads, slots, n);
        break;
    case OPT_RMSPROP:
        rmsprop_step(o, params, grads, slots, n, slot_stride);
        break;
    case OPT_ADAM:
        adam_step(o, params, grads, slots, n, slot_stride, iteration);
        break;
    case OPT_ADAGRAD:
        adagrad_step(o, params, grads, slots, n);
        break;
    }
}
