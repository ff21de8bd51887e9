/* check_conv.c - the engine's convolutional kernels (executor/nn/conv.c):
 * TensorFlow's valid/same geometry; conv2d against a direct convolution in
 * double (padding, strides, non-square kernels, 1x1, every activation, a
 * scratch of one example: the chunked path); finite-difference gradients of
 * conv2d, max/average pooling, global average pooling and batch
 * normalization, with the 3x3 stride-1 convs that run as Winograd among
 * them (and on the least scratch, where they fall back to im2col);
 * gradient accumulation; batch normalization's moving statistics and
 * inference; and a timing printout of the Fashion-MNIST CNN's convolutions
 * at batch 128 (one thread), not an assertion. */
#include <check.h>
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../common/util.h"
#include "../executor/nn/conv.h"
#include "../executor/nn/nn_rng.h"

/* ------------------------------------------------------------ helpers */

static float *fvec(long n)
{
    return xmalloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
}

static void fill_normal(float *p, long n, uint64_t seed)
{
    nn_rng r;
    nn_rng_seed(&r, seed, 3);
    for (long i = 0; i < n; i++)
        p[i] = (float)nn_rng_normal(&r);
}

static double act_d(double v, act_type act)
{
    switch (act) {
    case ACT_RELU:
        return v > 0.0 ? v : 0.0;
    case ACT_SIGMOID:
        return 1.0 / (1.0 + exp(-v));
    case ACT_TANH:
        return tanh(v);
    default:
        return v;
    }
}

/* The direct convolution in double, seven loops: y and, per output, the sum
 * of the absolute values of its terms (l1, for the float tolerance). */
static void ref_conv(double *y, double *l1, const float *x, const float *w, const float *b, int n,
                     const conv_geom *g, act_type act)
{
    for (int e = 0; e < n; e++)
        for (int oy = 0; oy < g->oh; oy++)
            for (int ox = 0; ox < g->ow; ox++)
                for (int o = 0; o < g->oc; o++) {
                    double s = b ? b[o] : 0.0, a = b ? fabs(b[o]) : 0.0;
                    for (int ky = 0; ky < g->kh; ky++)
                        for (int kx = 0; kx < g->kw; kx++)
                            for (int ci = 0; ci < g->c; ci++) {
                                int iy = oy * g->sh + ky - g->pad_top;
                                int ix = ox * g->sw + kx - g->pad_left;
                                if (iy < 0 || iy >= g->h || ix < 0 || ix >= g->w)
                                    continue;
                                double t = (double)x[(((long)e * g->h + iy) * g->w + ix) * g->c + ci] *
                                           w[(((long)ky * g->kw + kx) * g->c + ci) * g->oc + o];
                                s += t;
                                a += fabs(t);
                            }
                    long at = (((long)e * g->oh + oy) * g->ow + ox) * g->oc + o;
                    y[at] = act_d(s, act);
                    l1[at] = a;
                }
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The loss of a gradient check: sum(seed * y) in double. */
static double dot_seed(const float *y, const float *seed, long n)
{
    double s = 0.0;
    for (long i = 0; i < n; i++)
        s += (double)seed[i] * y[i];
    return s;
}

/* Central differences of loss(ctx) over the entries of p (every one, or
 * about `max_checked` spread over them) against the analytic gradient ana.
 * With kinks != 0 (relu, max), an entry whose one-sided slopes differ is
 * skipped: a kink lies within h of it. Returns the entries compared. */
typedef double (*loss_fn)(void *ctx);

static int fd_check(const char *what, float *p, long count, const float *ana, loss_fn f,
                    void *ctx, float h, int kinks, int max_checked)
{
    long step = count > max_checked ? count / max_checked : 1;
    int checked = 0, skipped = 0;
    for (long i = 0; i < count; i += step) {
        float keep = p[i];
        float up = keep + h, dn = keep - h;
        p[i] = up;
        double lp = f(ctx);
        p[i] = dn;
        double lm = f(ctx);
        p[i] = keep;
        double num = (lp - lm) / ((double)up - (double)dn);
        double a = ana[i];
        double tol = 1e-3 + 1e-2 * fmax(fabs(a), fabs(num));
        if (kinks) {
            double l0 = f(ctx);
            double sp = (lp - l0) / ((double)up - keep), sm = (l0 - lm) / ((double)keep - dn);
            if (fabs(sp - sm) > tol) {
                skipped++;
                continue;
            }
        }
        ck_assert_msg(fabs(a - num) <= tol, "%s[%ld]: backward %.7g, finite difference %.7g", what,
                      i, a, num);
        checked++;
    }
    ck_assert_msg(skipped * 4 <= checked + skipped, "%s: %d of %d entries skipped at kinks", what,
                  skipped, checked + skipped);
    return checked;
}

/* ------------------------------------------------------------ geometry */

START_TEST(geom_valid_and_same)
{
    /* h, k, s, pad -> out, pad_before: TensorFlow's numbers */
    static const struct {
        int in, k, s;
        padding_type pad;
        int out, before;
    } t[] = {
        {28, 3, 1, PAD_VALID, 26, 0}, {13, 3, 1, PAD_VALID, 11, 0}, {7, 2, 2, PAD_VALID, 3, 0},
        {8, 3, 2, PAD_VALID, 3, 0},   {5, 5, 3, PAD_VALID, 1, 0},   {2, 3, 1, PAD_VALID, 0, 0},
        {1, 2, 2, PAD_VALID, 0, 0},   {26, 2, 2, PAD_VALID, 13, 0}, {28, 3, 1, PAD_SAME, 28, 1},
        {28, 2, 2, PAD_SAME, 14, 0},  {7, 2, 2, PAD_SAME, 4, 0},    {5, 4, 1, PAD_SAME, 5, 1},
        {6, 3, 2, PAD_SAME, 3, 0},    {7, 3, 2, PAD_SAME, 4, 1},    {1, 3, 1, PAD_SAME, 1, 1},
        {10, 1, 3, PAD_SAME, 4, 0},   {4, 6, 1, PAD_SAME, 4, 2},    {9, 5, 2, PAD_SAME, 5, 2},
        {2, 3, 1, PAD_SAME, 2, 1},    {13, 2, 2, PAD_SAME, 7, 0},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        conv_geom g;
        /* the case on the height, a fixed valid 3x1 on the width */
        memset(&g, 0x5a, sizeof g);
        conv_geom_init(&g, t[i].in, 9, 4, t[i].k, 3, t[i].s, 1, t[i].pad, 6);
        ck_assert_msg(g.oh == t[i].out && g.pad_top == t[i].before,
                      "case %zu (in %d k %d s %d %s): oh %d pad_top %d, want %d %d", i, t[i].in,
                      t[i].k, t[i].s, t[i].pad == PAD_SAME ? "same" : "valid", g.oh, g.pad_top,
                      t[i].out, t[i].before);
        ck_assert_int_eq(g.h, t[i].in);
        ck_assert_int_eq(g.kh, t[i].k);
        ck_assert_int_eq(g.sh, t[i].s);
        ck_assert_int_eq(g.c, 4);
        ck_assert_int_eq(g.oc, 6);
        ck_assert_int_eq(g.ow, t[i].pad == PAD_SAME ? 9 : 7);
        ck_assert_int_eq(g.pad_left, t[i].pad == PAD_SAME ? 1 : 0);
        /* and on the width */
        conv_geom_init(&g, 5, t[i].in, 2, 1, t[i].k, 1, t[i].s, t[i].pad, 3);
        ck_assert_int_eq(g.ow, t[i].out);
        ck_assert_int_eq(g.pad_left, t[i].before);
        ck_assert_int_eq(g.oh, 5);
        ck_assert_int_eq(g.pad_top, 0);
    }
    /* TF's formulas over a range: same covers the input exactly (the last
     * window reaches the bottom padding's end), the extra row at the bottom */
    for (int in = 1; in <= 12; in++)
        for (int k = 1; k <= 6; k++)
            for (int s = 1; s <= 4; s++) {
                conv_geom g;
                conv_geom_init(&g, in, in, 1, k, k, s, s, PAD_SAME, 1);
                int total = (g.oh - 1) * s + k - in;
                total = total > 0 ? total : 0;
                ck_assert_int_eq(g.oh, (in + s - 1) / s);
                ck_assert_int_eq(g.pad_top, total / 2);
                ck_assert_int_eq(g.pad_left, total / 2);
                conv_geom_init(&g, in, in, 1, k, k, s, s, PAD_VALID, 1);
                ck_assert_int_eq(g.oh, k > in ? 0 : (in - k) / s + 1);
                ck_assert_int_eq(g.pad_top, 0);
            }
}
END_TEST

/* ------------------------------------------------------------ conv2d forward */

typedef struct conv_case {
    int h, w, c, kh, kw, sh, sw;
    padding_type pad;
    int oc, bias;
    act_type act;
} conv_case;

static const conv_case fwd_cases[] = {
    {6, 7, 1, 3, 3, 1, 1, PAD_SAME, 4, 1, ACT_RELU},
    {6, 7, 3, 3, 3, 2, 2, PAD_SAME, 5, 0, ACT_LINEAR},
    {7, 6, 3, 5, 3, 1, 1, PAD_VALID, 2, 1, ACT_TANH},
    {8, 7, 3, 5, 3, 2, 2, PAD_SAME, 3, 1, ACT_SIGMOID},
    {9, 9, 1, 3, 3, 2, 2, PAD_VALID, 3, 1, ACT_RELU},
    {5, 5, 3, 1, 1, 1, 1, PAD_VALID, 4, 1, ACT_RELU},  /* direct: no im2col */
    {5, 5, 3, 1, 1, 1, 1, PAD_SAME, 4, 0, ACT_TANH},   /* direct too (no pad) */
    {5, 6, 1, 1, 1, 2, 2, PAD_SAME, 2, 1, ACT_LINEAR}, /* 1x1, stride 2 */
    {4, 3, 2, 5, 3, 1, 2, PAD_SAME, 3, 1, ACT_LINEAR}, /* window > input */
    {3, 3, 3, 5, 3, 1, 1, PAD_VALID, 2, 1, ACT_RELU},  /* k > h: no output */
    /* 3x3, stride 1, 8+ channels: Winograd (odd sizes: partial tiles) */
    {7, 6, 8, 3, 3, 1, 1, PAD_SAME, 8, 1, ACT_RELU},
    {6, 9, 9, 3, 3, 1, 1, PAD_VALID, 10, 0, ACT_TANH},
    {5, 5, 8, 3, 3, 1, 1, PAD_SAME, 12, 1, ACT_SIGMOID},
    {3, 4, 8, 3, 3, 1, 1, PAD_VALID, 8, 1, ACT_LINEAR}, /* one row of output */
    {2, 1, 8, 3, 3, 1, 1, PAD_SAME, 9, 1, ACT_LINEAR},  /* smaller than the kernel */
};

/* The scratch of `ex` examples: 0: conv2d_scratch_floats for n; -1: the
 * least the contract allows (one example's im2col matrix: a conv that
 * would run as Winograd falls back to im2col). */
static size_t scratch_for(const conv_geom *g, int n, int ex)
{
    if (ex == 0)
        return conv2d_scratch_floats(g, n);
    if (ex < 0)
        return g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && g->pad_top == 0 &&
                       g->pad_left == 0
                   ? 0
                   : (size_t)g->oh * g->ow * g->kh * g->kw * g->c;
    return conv2d_scratch_floats(g, 1) * (size_t)ex;
}

/* conv2d_forward of case t on n examples with the scratch_for ex, against
 * the reference. The scratch is followed by guard floats that must stay
 * untouched. */
static void check_forward(const conv_case *t, int n, int ex, const char *tag)
{
    conv_geom g;
    conv_geom_init(&g, t->h, t->w, t->c, t->kh, t->kw, t->sh, t->sw, t->pad, t->oc);
    long nx = (long)n * g.h * g.w * g.c, nw = (long)g.kh * g.kw * g.c * g.oc;
    long ny = (long)n * g.oh * g.ow * g.oc;
    float *x = fvec(nx), *w = fvec(nw), *b = fvec(g.oc), *y = fvec(ny + 1);
    fill_normal(x, nx, 1);
    fill_normal(w, nw, 2);
    fill_normal(b, g.oc, 3);
    size_t sf = scratch_for(&g, n, ex);
    const int guard = 16;
    float *scratch = fvec((long)sf + guard);
    for (int i = 0; i < guard; i++)
        scratch[sf + (size_t)i] = 1234.5f;
    y[ny] = -77.0f;
    conv2d_forward(y, x, w, t->bias ? b : NULL, n, &g, t->act, scratch, sf);
    for (int i = 0; i < guard; i++)
        ck_assert_msg(scratch[sf + (size_t)i] == 1234.5f, "%s: wrote past the scratch", tag);
    ck_assert_msg(y[ny] == -77.0f, "%s: wrote past y", tag);
    double *ref = xmalloc(sizeof(double) * (size_t)(ny + 1)), *l1 = xmalloc(sizeof(double) * (size_t)(ny + 1));
    ref_conv(ref, l1, x, w, t->bias ? b : NULL, n, &g, t->act);
    for (long i = 0; i < ny; i++)
        ck_assert_msg(fabs(y[i] - ref[i]) <= 1e-6 + 1e-5 * l1[i],
                      "%s (%dx%dx%d k%dx%d s%d,%d %s oc %d): y[%ld] = %.7g, direct %.7g", tag, t->h,
                      t->w, t->c, t->kh, t->kw, t->sh, t->sw, t->pad == PAD_SAME ? "same" : "valid",
                      t->oc, i, y[i], ref[i]);
    free(ref);
    free(l1);
    free(scratch);
    free(x);
    free(w);
    free(b);
    free(y);
}

START_TEST(conv_forward_matches_direct)
{
    for (size_t i = 0; i < sizeof fwd_cases / sizeof fwd_cases[0]; i++) {
        check_forward(&fwd_cases[i], 3, 0, "whole batch");
        check_forward(&fwd_cases[i], 3, 1, "scratch of one example");
        check_forward(&fwd_cases[i], 5, 2, "scratch of two, 5 examples");
        check_forward(&fwd_cases[i], 3, -1, "the least scratch");
    }
}
END_TEST

START_TEST(conv_forward_fmnist_shapes)
{
    /* the CNN's second conv on more examples than one chunk takes (the
     * kernels chunk below the whole batch even with the scratch for it) */
    conv_case t = {13, 13, 32, 3, 3, 1, 1, PAD_VALID, 64, 1, ACT_RELU};
    check_forward(&t, 9, 0, "fmnist conv2, 9 examples");
    check_forward(&t, 3, 1, "fmnist conv2, scratch of one");
    check_forward(&t, 3, -1, "fmnist conv2, im2col's scratch of one");
    conv_case t1 = {28, 28, 1, 3, 3, 1, 1, PAD_VALID, 32, 1, ACT_RELU};
    check_forward(&t1, 4, 0, "fmnist conv1");
}
END_TEST

START_TEST(conv_scratch_sizes)
{
    /* im2col: one example's matrix times the examples of a chunk */
    conv_geom g;
    conv_geom_init(&g, 13, 13, 32, 5, 3, 1, 1, PAD_VALID, 64);
    size_t one = (size_t)9 * 11 * 5 * 3 * 32;
    ck_assert_uint_eq(conv2d_scratch_floats(&g, 1), one);
    size_t s128 = conv2d_scratch_floats(&g, 128);
    ck_assert(s128 >= one && s128 % one == 0 && s128 <= one * 128);
    ck_assert_uint_eq(conv2d_scratch_floats(&g, 2), one * (s128 >= 2 * one ? 2 : 1));
    /* Winograd (3x3, stride 1): at least im2col's one example, growing
     * with the batch up to the chunk */
    conv_geom_init(&g, 13, 13, 32, 3, 3, 1, 1, PAD_VALID, 64);
    size_t w1 = conv2d_scratch_floats(&g, 1), w128 = conv2d_scratch_floats(&g, 128);
    ck_assert(w1 >= (size_t)11 * 11 * 9 * 32);
    ck_assert(w128 >= w1 && w128 <= conv2d_scratch_floats(&g, 1000));
    /* 1x1, stride 1, no padding: x is the im2col matrix */
    conv_geom_init(&g, 7, 7, 16, 1, 1, 1, 1, PAD_SAME, 8);
    ck_assert_uint_eq(conv2d_scratch_floats(&g, 64), 0);
    conv_geom_init(&g, 7, 7, 16, 1, 1, 2, 2, PAD_SAME, 8);
    ck_assert_uint_eq(conv2d_scratch_floats(&g, 1), (size_t)4 * 4 * 16);
}
END_TEST

START_TEST(conv_empty_batches_and_outputs)
{
    /* no examples: dw and db are zeroed (accumulate 0) and nothing else is
     * touched; a kernel larger than a valid input: no output, dx 0 */
    conv_geom g;
    conv_geom_init(&g, 3, 3, 2, 5, 3, 1, 1, PAD_VALID, 2);
    ck_assert_int_eq(g.oh, 0);
    float x[18], w[60], b[2] = {1, 2}, dw[60], db[2], dx[18], dy[1] = {0}, y[1] = {0};
    float scratch[64];
    for (int i = 0; i < 18; i++)
        x[i] = (float)i;
    for (int i = 0; i < 60; i++) {
        w[i] = 1.0f;
        dw[i] = 5.0f;
    }
    db[0] = db[1] = 5.0f;
    for (int i = 0; i < 18; i++)
        dx[i] = 7.0f;
    conv2d_forward(y, x, w, b, 1, &g, ACT_RELU, scratch, 64);
    conv2d_backward(dx, dw, db, dy, y, x, w, 1, &g, ACT_RELU, 0, scratch, 64);
    for (int i = 0; i < 18; i++)
        ck_assert(dx[i] == 0.0f);
    for (int i = 0; i < 60; i++)
        ck_assert(dw[i] == 0.0f);
    ck_assert(db[0] == 0.0f && db[1] == 0.0f);
    conv_geom_init(&g, 4, 4, 8, 3, 3, 1, 1, PAD_SAME, 8); /* Winograd's */
    float w2[576], dw2[576], db2[8];
    for (int i = 0; i < 576; i++) {
        w2[i] = 1.0f;
        dw2[i] = 3.0f;
    }
    for (int i = 0; i < 8; i++)
        db2[i] = 3.0f;
    conv2d_backward(NULL, dw2, db2, NULL, NULL, NULL, w2, 0, &g, ACT_RELU, 1, NULL, 0);
    ck_assert(dw2[0] == 3.0f && db2[7] == 3.0f); /* accumulate: nothing added */
    conv2d_backward(NULL, dw2, db2, NULL, NULL, NULL, w2, 0, &g, ACT_RELU, 0, NULL, 0);
    for (int i = 0; i < 576; i++)
        ck_assert(dw2[i] == 0.0f);
    ck_assert(db2[0] == 0.0f && db2[7] == 0.0f);
}
END_TEST

/* ------------------------------------------------------------ conv2d gradients */

typedef struct conv_ctx {
    conv_geom g;
    int n;
    act_type act;
    float *x, *w, *b, *y, *seed, *scratch;
    size_t sf;
    long ny;
} conv_ctx;

static double conv_loss(void *p)
{
    conv_ctx *c = p;
    conv2d_forward(c->y, c->x, c->w, c->b, c->n, &c->g, c->act, c->scratch, c->sf);
    return dot_seed(c->y, c->seed, c->ny);
}

static void check_conv_grad(const conv_case *t, int n, int ex, const char *tag)
{
    conv_ctx c;
    conv_geom_init(&c.g, t->h, t->w, t->c, t->kh, t->kw, t->sh, t->sw, t->pad, t->oc);
    c.n = n;
    c.act = t->act;
    const conv_geom *g = &c.g;
    long nx = (long)n * g->h * g->w * g->c, nw = (long)g->kh * g->kw * g->c * g->oc;
    c.ny = (long)n * g->oh * g->ow * g->oc;
    c.x = fvec(nx);
    c.w = fvec(nw);
    c.b = t->bias ? fvec(g->oc) : NULL;
    c.y = fvec(c.ny);
    c.seed = fvec(c.ny);
    fill_normal(c.x, nx, 11);
    fill_normal(c.w, nw, 12);
    for (long i = 0; i < nw; i++)
        c.w[i] *= 0.5f;
    if (c.b)
        fill_normal(c.b, g->oc, 13);
    fill_normal(c.seed, c.ny, 14);
    c.sf = scratch_for(g, n, ex);
    c.scratch = fvec((long)c.sf);

    float *dy = fvec(c.ny), *dx = fvec(nx), *dw = fvec(nw), *db = fvec(g->oc);
    conv_loss(&c);
    memcpy(dy, c.seed, sizeof(float) * (size_t)c.ny);
    fill_normal(dx, nx, 99); /* garbage: the backward overwrites dx, dw, db */
    fill_normal(dw, nw, 98);
    fill_normal(db, g->oc, 97);
    conv2d_backward(dx, dw, c.b ? db : NULL, dy, c.y, c.x, c.w, n, g, c.act, 0, c.scratch, c.sf);
    /* relu: a smaller step crosses fewer kinks (a weight moves many outputs) */
    int kinks = c.act == ACT_RELU;
    const float h = kinks ? 1e-3f : 1e-2f;
    char what[160];
    snprintf(what, sizeof what, "%s dx", tag);
    int k = fd_check(what, c.x, nx, dx, conv_loss, &c, h, kinks, 120);
    snprintf(what, sizeof what, "%s dw", tag);
    k += fd_check(what, c.w, nw, dw, conv_loss, &c, h, kinks, 120);
    if (c.b) {
        snprintf(what, sizeof what, "%s db", tag);
        k += fd_check(what, c.b, g->oc, db, conv_loss, &c, h, kinks, 120);
    }
    ck_assert_int_gt(k, 20);

    /* accumulate = 1 adds to dw and db (dx is still overwritten); without
     * dx, dw comes out the same */
    float *dw2 = fvec(nw), *db2 = fvec(g->oc), *dx2 = fvec(nx), *dw0 = fvec(nw), *db0 = fvec(g->oc);
    conv_loss(&c); /* y as the parameters are now (the checks moved them) */
    fill_normal(dw0, nw, 21);
    fill_normal(db0, g->oc, 22);
    memcpy(dw2, dw0, sizeof(float) * (size_t)nw);
    memcpy(db2, db0, sizeof(float) * (size_t)g->oc);
    fill_normal(dx2, nx, 23);
    memcpy(dy, c.seed, sizeof(float) * (size_t)c.ny);
    conv2d_backward(dx2, dw2, c.b ? db2 : NULL, dy, c.y, c.x, c.w, n, g, c.act, 1, c.scratch, c.sf);
    for (long i = 0; i < nw; i++)
        ck_assert_msg(fabsf(dw2[i] - (dw0[i] + dw[i])) <= 1e-5f * (1.0f + fabsf(dw[i])),
                      "%s: accumulated dw[%ld] %g, want %g + %g", tag, i, dw2[i], dw0[i], dw[i]);
    for (int i = 0; c.b && i < g->oc; i++)
        ck_assert_msg(fabsf(db2[i] - (db0[i] + db[i])) <= 1e-5f * (1.0f + fabsf(db[i])),
                      "%s: accumulated db[%d]", tag, i);
    for (long i = 0; i < nx; i++)
        ck_assert_msg(fabsf(dx2[i] - dx[i]) <= 1e-6f * (1.0f + fabsf(dx[i])), "%s: dx[%ld] with accumulate", tag, i);
    memcpy(dy, c.seed, sizeof(float) * (size_t)c.ny);
    conv2d_backward(NULL, dw2, NULL, dy, c.y, c.x, c.w, n, g, c.act, 0, c.scratch, c.sf);
    for (long i = 0; i < nw; i++)
        ck_assert_msg(fabsf(dw2[i] - dw[i]) <= 1e-6f * (1.0f + fabsf(dw[i])), "%s: dw without dx", tag);
    free(dw2);
    free(db2);
    free(dx2);
    free(dw0);
    free(db0);
    free(dy);
    free(dx);
    free(dw);
    free(db);
    free(c.x);
    free(c.w);
    free(c.b);
    free(c.y);
    free(c.seed);
    free(c.scratch);
}

START_TEST(conv_grad_same)
{
    conv_case a = {6, 5, 3, 3, 3, 1, 1, PAD_SAME, 4, 1, ACT_TANH};
    check_conv_grad(&a, 2, 0, "same 3x3 s1 tanh");
    conv_case b = {5, 6, 1, 3, 3, 1, 1, PAD_SAME, 3, 1, ACT_RELU};
    check_conv_grad(&b, 3, 0, "same 3x3 s1 c=1 relu");
    conv_case s = {6, 5, 2, 3, 3, 1, 1, PAD_SAME, 3, 1, ACT_SIGMOID};
    check_conv_grad(&s, 2, 0, "same 3x3 s1 sigmoid");
}
END_TEST

START_TEST(conv_grad_winograd)
{
    conv_case a = {6, 5, 8, 3, 3, 1, 1, PAD_SAME, 8, 1, ACT_TANH};
    check_conv_grad(&a, 2, 0, "winograd same tanh");
    check_conv_grad(&a, 5, 2, "winograd chunked: scratch of two, 5 examples");
    check_conv_grad(&a, 3, 1, "winograd chunked: scratch of one");
    check_conv_grad(&a, 2, -1, "winograd's conv on im2col's least scratch");
    conv_case b = {7, 6, 9, 3, 3, 1, 1, PAD_VALID, 10, 1, ACT_LINEAR};
    check_conv_grad(&b, 2, 0, "winograd valid linear, odd sizes");
    conv_case r = {5, 4, 8, 3, 3, 1, 1, PAD_SAME, 9, 0, ACT_RELU};
    check_conv_grad(&r, 2, 0, "winograd same relu, no bias");
}
END_TEST

START_TEST(conv_grad_valid_strided)
{
    conv_case a = {7, 6, 2, 5, 3, 2, 2, PAD_VALID, 3, 1, ACT_LINEAR};
    check_conv_grad(&a, 2, 0, "valid 5x3 s2 linear");
    conv_case b = {7, 8, 3, 3, 3, 2, 2, PAD_SAME, 4, 0, ACT_TANH};
    check_conv_grad(&b, 2, 0, "same 3x3 s2 no bias tanh");
    conv_case r = {7, 7, 2, 3, 2, 2, 1, PAD_VALID, 3, 1, ACT_RELU};
    check_conv_grad(&r, 3, 0, "valid 3x2 s2,1 relu");
}
END_TEST

START_TEST(conv_grad_chunked_and_1x1)
{
    conv_case a = {6, 5, 3, 3, 3, 1, 1, PAD_SAME, 4, 1, ACT_TANH};
    check_conv_grad(&a, 3, 1, "chunked: scratch of one");
    check_conv_grad(&a, 5, 2, "chunked: scratch of two, 5 examples");
    conv_case d = {4, 5, 3, 1, 1, 1, 1, PAD_VALID, 4, 1, ACT_TANH};
    check_conv_grad(&d, 3, 0, "1x1 direct");
    conv_case s = {5, 5, 2, 1, 1, 2, 2, PAD_SAME, 3, 1, ACT_LINEAR};
    check_conv_grad(&s, 2, 1, "1x1 stride 2");
}
END_TEST

/* ------------------------------------------------------------ pooling */

typedef struct pool_ctx {
    conv_geom g;
    int n, max;
    float *x, *y, *seed;
    int32_t *arg;
    long ny;
} pool_ctx;

static double pool_loss(void *p)
{
    pool_ctx *c = p;
    if (c->max)
        maxpool_forward(c->y, c->arg, c->x, c->n, &c->g);
    else
        avgpool_forward(c->y, c->x, c->n, &c->g);
    return dot_seed(c->y, c->seed, c->ny);
}

/* x: distinct values at least 0.05 apart (a random order), so that no
 * finite difference step of 1e-3 moves a maximum. */
static void distinct_values(float *x, long n, uint64_t seed)
{
    nn_rng r;
    nn_rng_seed(&r, seed, 5);
    for (long i = 0; i < n; i++)
        x[i] = (float)(i - n / 2) * 0.05f;
    for (long i = n - 1; i > 0; i--) {
        long j = (long)(nn_rng_next(&r) % (uint64_t)(i + 1));
        float t = x[i];
        x[i] = x[j];
        x[j] = t;
    }
}

static void check_pool_grad(int max, int h, int w, int ch, int kh, int kw, int sh, int sw,
                            padding_type pad, int n)
{
    pool_ctx c;
    c.max = max;
    c.n = n;
    conv_geom_init(&c.g, h, w, ch, kh, kw, sh, sw, pad, ch);
    long nx = (long)n * h * w * ch;
    c.ny = (long)n * c.g.oh * c.g.ow * ch;
    c.x = fvec(nx);
    c.y = fvec(c.ny);
    c.seed = fvec(c.ny);
    c.arg = xmalloc(sizeof(int32_t) * (size_t)c.ny);
    distinct_values(c.x, nx, 31);
    fill_normal(c.seed, c.ny, 32);
    pool_loss(&c);
    float *dx = fvec(nx);
    fill_normal(dx, nx, 33);
    if (max) {
        /* y is the value at the argmax, which lies in the window */
        for (int e = 0; e < n; e++)
            for (int oy = 0; oy < c.g.oh; oy++)
                for (int ox = 0; ox < c.g.ow; ox++)
                    for (int q = 0; q < ch; q++) {
                        long o = (((long)e * c.g.oh + oy) * c.g.ow + ox) * ch + q;
                        int32_t a = c.arg[o];
                        ck_assert(a >= 0 && a < h * w * ch && a % ch == q);
                        int iy = a / ch / w, ix = a / ch % w;
                        int y0 = oy * sh - c.g.pad_top, x0 = ox * sw - c.g.pad_left;
                        ck_assert(iy >= y0 && iy < y0 + kh && ix >= x0 && ix < x0 + kw);
                        ck_assert(c.y[o] == c.x[(long)e * h * w * ch + a]);
                    }
        maxpool_backward(dx, c.seed, c.arg, n, &c.g);
    } else {
        avgpool_backward(dx, c.seed, n, &c.g);
    }
    char what[96];
    snprintf(what, sizeof what, "%s %dx%d s%d,%d %s dx", max ? "maxpool" : "avgpool", kh, kw, sh,
             sw, pad == PAD_SAME ? "same" : "valid");
    int checked = fd_check(what, c.x, nx, dx, pool_loss, &c, 1e-3f, 0, 1000);
    ck_assert_int_gt(checked, 20);
    free(dx);
    free(c.x);
    free(c.y);
    free(c.seed);
    free(c.arg);
}

START_TEST(maxpool_grad)
{
    check_pool_grad(1, 5, 5, 3, 2, 2, 2, 2, PAD_VALID, 2); /* the last row/column dropped */
    check_pool_grad(1, 6, 5, 2, 3, 3, 2, 2, PAD_SAME, 2);
    check_pool_grad(1, 4, 4, 2, 3, 3, 1, 1, PAD_SAME, 2); /* overlapping windows */
    check_pool_grad(1, 7, 7, 1, 2, 2, 2, 2, PAD_SAME, 1);
    check_pool_grad(1, 6, 7, 2, 2, 3, 2, 1, PAD_SAME, 2); /* overlapping along the width only */
    check_pool_grad(1, 7, 6, 2, 3, 2, 1, 2, PAD_VALID, 2); /* ... along the height only */
}
END_TEST

START_TEST(maxpool_ties_and_padding)
{
    /* equal values: the window's first position (row-major) wins */
    conv_geom g;
    conv_geom_init(&g, 4, 4, 2, 2, 2, 2, 2, PAD_VALID, 2);
    float x[32], y[8];
    int32_t arg[8];
    for (int i = 0; i < 32; i++)
        x[i] = 1.0f;
    maxpool_forward(y, arg, x, 1, &g);
    for (int oy = 0; oy < 2; oy++)
        for (int ox = 0; ox < 2; ox++)
            for (int q = 0; q < 2; q++) {
                int o = (oy * 2 + ox) * 2 + q;
                ck_assert_int_eq(arg[o], ((oy * 2) * 4 + ox * 2) * 2 + q);
                ck_assert(y[o] == 1.0f);
            }
    /* a tie later in the window does not move it: first max at (0,1) */
    x[(0 * 4 + 1) * 2] = 3.0f;
    x[(1 * 4 + 1) * 2] = 3.0f;
    maxpool_forward(y, arg, x, 1, &g);
    ck_assert_int_eq(arg[0], (0 * 4 + 1) * 2);
    /* same padding over all-negative values: the padding (zero) never wins */
    conv_geom_init(&g, 3, 3, 1, 3, 3, 1, 1, PAD_SAME, 1);
    float xn[9], yn[9];
    int32_t an[9];
    for (int i = 0; i < 9; i++)
        xn[i] = -1.0f - (float)i;
    maxpool_forward(yn, an, xn, 1, &g);
    ck_assert(yn[0] == -1.0f && an[0] == 0);
    ck_assert(yn[8] == -5.0f && an[8] == 4);  /* window rows 1-2, cols 1-2 */
    ck_assert(yn[2] == -2.0f && an[2] == 1);
    float dy[9], dx[9];
    for (int i = 0; i < 9; i++)
        dy[i] = 1.0f;
    maxpool_backward(dx, dy, an, 1, &g);
    /* every window holds x[0] (-1) except those not reaching it */
    ck_assert(dx[0] == 4.0f);
}
END_TEST

START_TEST(avgpool_values_and_grad)
{
    /* same 3x3 s1 on 4x4: the corner averages its 4 valid positions */
    conv_geom g;
    conv_geom_init(&g, 4, 4, 1, 3, 3, 1, 1, PAD_SAME, 1);
    float x[16], y[16];
    for (int i = 0; i < 16; i++)
        x[i] = (float)i;
    avgpool_forward(y, x, 1, &g);
    ck_assert_float_eq_tol(y[0], (0 + 1 + 4 + 5) / 4.0f, 1e-6f);
    ck_assert_float_eq_tol(y[1], (0 + 1 + 2 + 4 + 5 + 6) / 6.0f, 1e-6f);
    ck_assert_float_eq_tol(y[5], (0 + 1 + 2 + 4 + 5 + 6 + 8 + 9 + 10) / 9.0f, 1e-6f);
    ck_assert_float_eq_tol(y[15], (10 + 11 + 14 + 15) / 4.0f, 1e-6f);
    check_pool_grad(0, 4, 4, 2, 3, 3, 1, 1, PAD_SAME, 2);
    check_pool_grad(0, 7, 6, 3, 2, 2, 2, 2, PAD_SAME, 2);
    check_pool_grad(0, 5, 5, 2, 2, 2, 2, 2, PAD_VALID, 2);
    check_pool_grad(0, 6, 7, 2, 3, 3, 2, 2, PAD_SAME, 1);
    check_pool_grad(0, 6, 7, 2, 2, 3, 2, 1, PAD_SAME, 2);
}
END_TEST

typedef struct gap_ctx {
    int n, hw, c;
    float *x, *y, *seed;
} gap_ctx;

static double gap_loss(void *p)
{
    gap_ctx *c = p;
    gap_forward(c->y, c->x, c->n, c->hw, c->c);
    return dot_seed(c->y, c->seed, (long)c->n * c->c);
}

START_TEST(gap_values_and_grad)
{
    gap_ctx c = {3, 10, 4, NULL, NULL, NULL};
    long nx = (long)c.n * c.hw * c.c;
    c.x = fvec(nx);
    c.y = fvec(c.n * c.c);
    c.seed = fvec(c.n * c.c);
    fill_normal(c.x, nx, 41);
    fill_normal(c.seed, c.n * c.c, 42);
    gap_loss(&c);
    for (int e = 0; e < c.n; e++)
        for (int q = 0; q < c.c; q++) {
            double s = 0;
            for (int p = 0; p < c.hw; p++)
                s += c.x[((long)e * c.hw + p) * c.c + q];
            ck_assert_double_eq_tol(c.y[e * c.c + q], s / c.hw, 1e-6);
        }
    float *dx = fvec(nx);
    gap_backward(dx, c.seed, c.n, c.hw, c.c);
    ck_assert_int_gt(fd_check("gap dx", c.x, nx, dx, gap_loss, &c, 1e-2f, 0, 1000), 100);
    free(dx);
    free(c.x);
    free(c.y);
    free(c.seed);
}
END_TEST

/* ------------------------------------------------------------ batch norm */

typedef struct bn_ctx {
    long rows;
    int c;
    float *x, *y, *seed, *gamma, *beta, *mean, *invstd;
} bn_ctx;

static double bn_loss(void *p)
{
    bn_ctx *b = p;
    bn_forward_train(b->y, b->mean, b->invstd, b->x, b->rows, b->c, b->gamma, b->beta, 1e-3f,
                     0.99f, NULL, NULL);
    return dot_seed(b->y, b->seed, b->rows * b->c);
}

static void check_bn_grad(long rows, int c, int affine, const char *tag)
{
    bn_ctx b;
    b.rows = rows;
    b.c = c;
    long nx = rows * c;
    b.x = fvec(nx);
    b.y = fvec(nx);
    b.seed = fvec(nx);
    b.mean = fvec(c);
    b.invstd = fvec(c);
    b.gamma = affine ? fvec(c) : NULL;
    b.beta = affine ? fvec(c) : NULL;
    fill_normal(b.x, nx, 51);
    for (long i = 0; i < nx; i++) /* channels of different means and spreads */
        b.x[i] = b.x[i] * (1.0f + (float)(i % c) * 0.3f) + (float)(i % c) - 2.0f;
    fill_normal(b.seed, nx, 52);
    if (affine) {
        fill_normal(b.gamma, c, 53);
        fill_normal(b.beta, c, 54);
    }
    bn_loss(&b);
    float *dx = fvec(nx), *dg = fvec(c), *dbt = fvec(c);
    fill_normal(dx, nx, 55);
    bn_backward(dx, affine ? dg : NULL, affine ? dbt : NULL, b.seed, b.x, b.mean, b.invstd,
                b.gamma, rows, c, 0);
    char what[96];
    snprintf(what, sizeof what, "bn %s dx", tag);
    int k = fd_check(what, b.x, nx, dx, bn_loss, &b, 1e-2f, 0, 300);
    if (affine) {
        snprintf(what, sizeof what, "bn %s dgamma", tag);
        k += fd_check(what, b.gamma, c, dg, bn_loss, &b, 1e-2f, 0, 300);
        snprintf(what, sizeof what, "bn %s dbeta", tag);
        k += fd_check(what, b.beta, c, dbt, bn_loss, &b, 1e-2f, 0, 300);
        /* accumulate adds; dx NULL is allowed */
        float *dg2 = fvec(c), *db2 = fvec(c);
        for (int j = 0; j < c; j++) {
            dg2[j] = 1.5f;
            db2[j] = -0.5f;
        }
        bn_backward(NULL, dg2, db2, b.seed, b.x, b.mean, b.invstd, b.gamma, rows, c, 1);
        for (int j = 0; j < c; j++) {
            ck_assert_float_eq_tol(dg2[j], 1.5f + dg[j], 1e-5f * (1.0f + fabsf(dg[j])));
            ck_assert_float_eq_tol(db2[j], -0.5f + dbt[j], 1e-5f * (1.0f + fabsf(dbt[j])));
        }
        free(dg2);
        free(db2);
    }
    ck_assert_int_gt(k, 20);
    free(dx);
    free(dg);
    free(dbt);
    free(b.x);
    free(b.y);
    free(b.seed);
    free(b.mean);
    free(b.invstd);
    free(b.gamma);
    free(b.beta);
}

START_TEST(bn_grad)
{
    check_bn_grad(18, 5, 1, "gamma and beta");
    check_bn_grad(18, 5, 0, "no gamma, no beta");
    check_bn_grad(6, 70, 1, "70 channels (more than a block)");
}
END_TEST

START_TEST(bn_moving_statistics_and_eval)
{
    /* rows 4, c 2; channel 0: 1 2 3 6 (mean 3, biased var 3.5, unbiased
     * 14/3); channel 1: -1 -1 -1 -1 (var 0) */
    float x[8] = {1, -1, 2, -1, 3, -1, 6, -1}, y[8], mean[2], invstd[2];
    float mm[2] = {0.5f, -2.0f}, mv[2] = {2.0f, 0.25f};
    const float gamma[2] = {2.0f, 0.5f}, beta[2] = {0.1f, -0.3f}, eps = 1e-3f, mom = 0.9f;
    bn_forward_train(y, mean, invstd, x, 4, 2, gamma, beta, eps, mom, mm, mv);
    ck_assert_float_eq_tol(mean[0], 3.0f, 1e-6f);
    ck_assert_float_eq_tol(mean[1], -1.0f, 1e-6f);
    ck_assert_float_eq_tol(invstd[0], 1.0 / sqrt(3.5 + 1e-3), 1e-6f);
    ck_assert_float_eq_tol(invstd[1], 1.0 / sqrt(1e-3), 1e-3f);
    ck_assert_float_eq_tol(mm[0], 0.9 * 0.5 + 0.1 * 3.0, 1e-6f);
    ck_assert_float_eq_tol(mm[1], 0.9 * -2.0 + 0.1 * -1.0, 1e-6f);
    ck_assert_float_eq_tol(mv[0], 0.9 * 2.0 + 0.1 * (14.0 / 3.0), 1e-6f);
    ck_assert_float_eq_tol(mv[1], 0.9 * 0.25, 1e-6f);
    for (int r = 0; r < 4; r++) {
        ck_assert_float_eq_tol(y[r * 2], 2.0 * (x[r * 2] - 3.0) / sqrt(3.5 + 1e-3) + 0.1, 1e-5f);
        ck_assert_float_eq_tol(y[r * 2 + 1], -0.3f, 1e-6f);
    }
    /* inference uses the moving statistics */
    float xe[4] = {0.0f, 1.0f, 4.0f, -3.0f}, ye[4];
    bn_forward_eval(ye, xe, 2, 2, gamma, beta, eps, mm, mv);
    for (int r = 0; r < 2; r++)
        for (int j = 0; j < 2; j++)
            ck_assert_float_eq_tol(ye[r * 2 + j],
                                   gamma[j] * (xe[r * 2 + j] - mm[j]) / sqrt(mv[j] + 1e-3) + beta[j],
                                   1e-5f);
    bn_forward_eval(ye, xe, 2, 2, NULL, NULL, eps, mm, mv);
    ck_assert_float_eq_tol(ye[3], (-3.0 - mm[1]) / sqrt(mv[1] + 1e-3), 1e-5f);
    /* one row: the variance's batch value is the biased one (0) */
    float x1[2] = {5.0f, 7.0f}, y1[2], m1[2] = {1.0f, 1.0f}, v1[2] = {1.0f, 1.0f};
    bn_forward_train(y1, mean, invstd, x1, 1, 2, NULL, NULL, eps, 0.99f, m1, v1);
    ck_assert_float_eq_tol(m1[0], 0.99 + 0.01 * 5.0, 1e-6f);
    ck_assert_float_eq_tol(v1[1], 0.99, 1e-6f);
    ck_assert_float_eq_tol(y1[0], 0.0f, 1e-6f);
}
END_TEST

START_TEST(bn_large_mean_precision)
{
    /* mean 1000, spread 0.01: a float one-pass sum of squares would cancel */
    const long rows = 4096;
    float *x = fvec(rows), *y = fvec(rows), mean, invstd;
    fill_normal(x, rows, 61);
    double s = 0, s2 = 0;
    for (long i = 0; i < rows; i++) {
        x[i] = 1000.0f + 0.01f * x[i];
        s += x[i];
    }
    double mu = s / rows;
    for (long i = 0; i < rows; i++)
        s2 += (x[i] - mu) * (x[i] - mu);
    double var = s2 / rows;
    bn_forward_train(y, &mean, &invstd, x, rows, 1, NULL, NULL, 1e-8f, 0.99f, NULL, NULL);
    ck_assert_double_eq_tol(mean, mu, 1e-4);
    ck_assert_msg(fabs(invstd - 1.0 / sqrt(var + 1e-8)) <= 1e-3 / sqrt(var), "invstd %g, want %g",
                  invstd, 1.0 / sqrt(var + 1e-8));
    double ys = 0, ys2 = 0;
    for (long i = 0; i < rows; i++) {
        ys += y[i];
        ys2 += (double)y[i] * y[i];
    }
    ck_assert_double_eq_tol(ys / rows, 0.0, 1e-2);
    ck_assert_double_eq_tol(ys2 / rows, 1.0, 2e-2);
    free(x);
    free(y);
}
END_TEST

/* ------------------------------------------------------------ timing */

static double median(double *v, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return v[n / 2];
}

/* conv c (h x h x cin -> oc, 3x3 valid relu) at batch 128: forward and
 * backward in ms (median of reps); dx only when need_dx. GFLOP/s counts a
 * direct convolution's multiply-adds (Winograd does fewer). */
static void time_conv(const char *name, int h, int cin, int oc, int need_dx, int reps)
{
    const int n = 128;
    conv_geom g;
    conv_geom_init(&g, h, h, cin, 3, 3, 1, 1, PAD_VALID, oc);
    long nx = (long)n * h * h * cin, nw = 9L * cin * oc, ny = (long)n * g.oh * g.ow * oc;
    float *x = fvec(nx), *w = fvec(nw), *b = fvec(oc), *y = fvec(ny), *dy = fvec(ny),
          *dx = fvec(nx), *dw = fvec(nw), *db = fvec(oc);
    size_t sf = conv2d_scratch_floats(&g, n);
    float *scratch = fvec((long)sf);
    fill_normal(x, nx, 71);
    fill_normal(w, nw, 72);
    fill_normal(b, oc, 73);
    double tf[16], tb[16];
    for (int r = 0; r < reps + 1; r++) {
        double t0 = now_s();
        conv2d_forward(y, x, w, b, n, &g, ACT_RELU, scratch, sf);
        double t1 = now_s();
        for (long i = 0; i < ny; i++)
            dy[i] = (float)((i * 7919) % 13) * 0.1f - 0.6f;
        double t2 = now_s();
        conv2d_backward(need_dx ? dx : NULL, dw, db, dy, y, x, w, n, &g, ACT_RELU, 0, scratch, sf);
        double t3 = now_s();
        if (r > 0) { /* the first is a warm-up */
            tf[r - 1] = (t1 - t0) * 1e3;
            tb[r - 1] = (t3 - t2) * 1e3;
        }
    }
    double mf = median(tf, reps), mb = median(tb, reps);
    double gf = 2.0 * (double)n * g.oh * g.ow * 9.0 * cin * oc * 1e-9;
    printf("  %-34s forward %7.2f ms (%5.1f direct GFLOP/s)  backward%s %7.2f ms  total %7.2f ms"
           "  (scratch %.1f MiB)\n",
           name, mf, gf / (mf * 1e-3), need_dx ? "" : " (no dx)", mb, mf + mb,
           (double)sf * 4.0 / 1048576.0);
    free(x);
    free(w);
    free(b);
    free(y);
    free(dy);
    free(dx);
    free(dw);
    free(db);
    free(scratch);
}

START_TEST(timing_fmnist_cnn)
{
#if defined(__SANITIZE_ADDRESS__)
    const int reps = 1;
#else
    const int reps = 15;
#endif
    openblas_set_num_threads(1);
    printf("check_conv: Fashion-MNIST CNN convolutions, batch 128, one thread (median of %d):\n",
           reps);
    time_conv("conv1 28x28x1 -> 32, 3x3 relu", 28, 1, 32, 0, reps);
    time_conv("conv2 13x13x32 -> 64, 3x3 relu", 13, 32, 64, 1, reps);
    /* the pools between them */
    conv_geom g;
    conv_geom_init(&g, 26, 26, 32, 2, 2, 2, 2, PAD_VALID, 32);
    long nx = 128L * 26 * 26 * 32, ny = 128L * 13 * 13 * 32;
    float *x = fvec(nx), *y = fvec(ny), *dx = fvec(nx);
    int32_t *arg = xmalloc(sizeof(int32_t) * (size_t)ny);
    fill_normal(x, nx, 81);
    double tf[16], tb[16];
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        maxpool_forward(y, arg, x, 128, &g);
        double t1 = now_s();
        maxpool_backward(dx, y, arg, 128, &g);
        tf[r] = (t1 - t0) * 1e3;
        tb[r] = (now_s() - t1) * 1e3;
    }
    printf("  %-34s forward %7.2f ms                    backward %7.2f ms\n",
           "maxpool 2 on 26x26x32", median(tf, reps), median(tb, reps));
    free(x);
    free(y);
    free(dx);
    free(arg);
}
END_TEST

static Suite *conv_suite(void)
{
    Suite *s = suite_create("conv");
    TCase *g = tcase_create("geometry");
    tcase_add_test(g, geom_valid_and_same);
    tcase_add_test(g, conv_scratch_sizes);
    suite_add_tcase(s, g);
    TCase *f = tcase_create("forward");
    tcase_set_timeout(f, 60);
    tcase_add_test(f, conv_forward_matches_direct);
    tcase_add_test(f, conv_forward_fmnist_shapes);
    tcase_add_test(f, conv_empty_batches_and_outputs);
    suite_add_tcase(s, f);
    TCase *d = tcase_create("gradients");
    tcase_set_timeout(d, 60);
    tcase_add_test(d, conv_grad_same);
    tcase_add_test(d, conv_grad_valid_strided);
    tcase_add_test(d, conv_grad_chunked_and_1x1);
    tcase_add_test(d, conv_grad_winograd);
    tcase_add_test(d, maxpool_grad);
    tcase_add_test(d, maxpool_ties_and_padding);
    tcase_add_test(d, avgpool_values_and_grad);
    tcase_add_test(d, gap_values_and_grad);
    tcase_add_test(d, bn_grad);
    suite_add_tcase(s, d);
    TCase *b = tcase_create("batch norm");
    tcase_add_test(b, bn_moving_statistics_and_eval);
    tcase_add_test(b, bn_large_mean_precision);
    suite_add_tcase(s, b);
    TCase *t = tcase_create("timing");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, timing_fmnist_cnn);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(conv_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
