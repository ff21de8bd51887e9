/* check_nn.c - the training engine: finite-difference gradients of every
 * layer, activation and loss; optimizer updates against hand-computed
 * values; determinism; checkpoints (bit-identical resume, corrupt files,
 * read back by Python/numpy); an end-to-end learning run; the train loop's
 * resume from a mid-epoch checkpoint.
 *
 * The train loop (executor/train_loop.c) is not among DEPS_check_nn's
 * objects (the executor/ objects), so it is compiled into this test directly. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/util.h"
#include "../executor/nn/checkpoint.h"
#include "../executor/nn/loss.h"
#include "../executor/nn/model.h"
#include "../executor/nn/nn_rng.h"
#include "../executor/nn/optimizer.h"
#include "../executor/train_loop.c" /* see the header comment */

/* ------------------------------------------------------------ helpers */

static void spec_init(jobspec *s, int in, loss_type loss, opt_type opt)
{
    memset(s, 0, sizeof *s);
    s->input_rank = 1;
    s->input_shape[0] = in;
    s->input_size = in;
    s->loss = loss;
    s->metric_accuracy = 1;
    optimizer_spec *o = &s->optimizer;
    o->type = opt;
    o->learning_rate = opt == OPT_SGD ? 0.01f : 0.001f;
    o->rho = 0.9f;
    o->beta_1 = 0.9f;
    o->beta_2 = 0.999f;
    o->epsilon = 1e-7f;
    o->initial_accumulator_value = 0.1f;
    s->fit.epochs = 1;
    s->fit.batch_size = 16;
    s->data.shuffle_buffer = -1;
    s->checkpoint.every_epochs = 1;
}

static void add_dense(jobspec *s, int units, act_type act)
{
    layer_spec *l = &s->layers[s->n_layers++];
    memset(l, 0, sizeof *l);
    l->type = LAYER_DENSE;
    l->units = units;
    l->activation = act;
    l->use_bias = 1;
    s->output_size = units;
}

static void add_layer(jobspec *s, layer_type t, act_type act, float rate)
{
    layer_spec *l = &s->layers[s->n_layers++];
    memset(l, 0, sizeof *l);
    l->type = t;
    l->activation = act;
    l->rate = rate;
}

static model *build(const jobspec *s, int max_batch, uint64_t seed)
{
    model *m = NULL;
    char err[ERR_MAX];
    int rc = model_build(&m, s, max_batch, seed, err);
    ck_assert_msg(rc == 0, "model_build: %s", err);
    return m;
}

/* n examples of `in` normal features; labels: classes > 1 -> index,
 * classes == 1 -> 0/1, classes == 0 -> a real target. */
static void make_data(float *x, float *y, int n, int in, int classes, uint64_t seed)
{
    nn_rng r;
    nn_rng_seed(&r, seed, 77);
    for (int i = 0; i < n * in; i++)
        x[i] = (float)nn_rng_normal(&r);
    for (int i = 0; i < n; i++) {
        if (classes > 1)
            y[i] = (float)(nn_rng_next(&r) % (uint64_t)classes);
        else if (classes == 1)
            y[i] = (float)(nn_rng_next(&r) & 1);
        else
            y[i] = (float)nn_rng_normal(&r);
    }
}

/* d loss / d params by central differences against the backward pass, with
 * the dropout masks held fixed (the RNG state restored before each pass). */
static void grad_check(const jobspec *s, int classes, const char *what)
{
    const int n = 6, gb = 8;
    model *m = build(s, n, 42);
    int in = model_input_size(m);
    float *x = xmalloc(sizeof(float) * (size_t)n * in), y[6];
    make_data(x, y, n, in, classes, 5);
    uint64_t rs[4];
    model_rng_get(m, rs);
    model_forward_backward(m, x, y, n, gb, NULL);
    size_t np = model_param_count(m);
    float *ana = xmalloc(sizeof(float) * np);
    memcpy(ana, model_grads(m), sizeof(float) * np);
    float *p = model_params(m);
    int checked = 0, kinks = 0;
    for (int t = 0; t < model_tensor_count(m); t++) {
        const model_tensor *mt = model_tensor_at(m, t);
        for (size_t k = 0; k < mt->size; k++) {
            size_t i = mt->offset + k;
            float keep = p[i];
            const float h = 1e-3f;
            step_stats st;
            p[i] = keep + h;
            model_rng_set(m, rs);
            model_forward_backward(m, x, y, n, gb, &st);
            double lp = st.loss_sum / gb;
            p[i] = keep - h;
            model_rng_set(m, rs);
            model_forward_backward(m, x, y, n, gb, &st);
            double lm = st.loss_sum / gb;
            p[i] = keep;
            model_rng_set(m, rs);
            model_forward_backward(m, x, y, n, gb, &st);
            double l0 = st.loss_sum / gb;
            double num = (lp - lm) / (2.0 * h);
            double a = ana[i];
            double tol = 5e-4 + 2e-2 * fmax(fabs(a), fabs(num));
            /* a relu kink inside [-h, h] makes the one-sided slopes differ:
             * the central difference means nothing there */
            if (fabs((lp - l0) / h - (l0 - lm) / h) > tol) {
                kinks++;
                continue;
            }
            ck_assert_msg(fabs(a - num) <= tol, "%s: %s[%zu]: backward %.6g, finite difference %.6g",
                          what, mt->name, k, a, num);
            checked++;
        }
    }
    ck_assert_int_gt(checked, 10);
    ck_assert_msg(kinks * 4 <= checked, "%s: %d of %d parameters skipped at kinks", what, kinks, checked);
    free(ana);
    free(x);
    model_free(m);
}

/* ------------------------------------------------------------ gradients */

START_TEST(grad_relu_softmax_cce)
{
    jobspec s;
    spec_init(&s, 5, LOSS_CATEGORICAL_CROSSENTROPY, OPT_RMSPROP);
    add_dense(&s, 7, ACT_RELU);
    add_dense(&s, 4, ACT_SOFTMAX);
    grad_check(&s, 4, "relu+softmax/cce (fused)");
}
END_TEST

START_TEST(grad_relu_dropout_fused_mse)
{
    jobspec s;
    spec_init(&s, 4, LOSS_MSE, OPT_SGD);
    add_dense(&s, 8, ACT_RELU);
    add_layer(&s, LAYER_DROPOUT, ACT_LINEAR, 0.5f);
    add_dense(&s, 3, ACT_LINEAR);
    grad_check(&s, 3, "relu+dropout(fused)/mse one-hot");
}
END_TEST

START_TEST(grad_tanh_dropout_sigmoid_bce)
{
    jobspec s;
    spec_init(&s, 4, LOSS_BINARY_CROSSENTROPY, OPT_ADAM);
    add_dense(&s, 6, ACT_TANH);
    add_layer(&s, LAYER_DROPOUT, ACT_LINEAR, 0.3f);
    add_dense(&s, 1, ACT_SIGMOID);
    grad_check(&s, 1, "tanh+dropout/sigmoid+bce (fused)");
}
END_TEST

START_TEST(grad_activation_layers_sparse)
{
    jobspec s;
    spec_init(&s, 4, LOSS_SPARSE_CATEGORICAL_CROSSENTROPY, OPT_ADAGRAD);
    add_layer(&s, LAYER_FLATTEN, ACT_LINEAR, 0);
    add_dense(&s, 6, ACT_SIGMOID);
    add_layer(&s, LAYER_ACTIVATION, ACT_TANH, 0);
    add_dense(&s, 3, ACT_LINEAR);
    s.layers[3].use_bias = 0;
    add_layer(&s, LAYER_ACTIVATION, ACT_SOFTMAX, 0);
    grad_check(&s, 3, "sigmoid, tanh layer, no-bias dense, softmax layer/sparse cce");
}
END_TEST

START_TEST(grad_softmax_mse_and_relu_layer)
{
    jobspec s;
    spec_init(&s, 3, LOSS_MSE, OPT_SGD);
    add_dense(&s, 5, ACT_LINEAR);
    add_layer(&s, LAYER_ACTIVATION, ACT_RELU, 0);
    add_layer(&s, LAYER_DROPOUT, ACT_LINEAR, 0.25f);
    add_dense(&s, 4, ACT_SOFTMAX);
    grad_check(&s, 4, "relu layer, dropout, softmax (not fused)/mse");
}
END_TEST

START_TEST(grad_unfused_bce_cce_regression)
{
    jobspec s;
    spec_init(&s, 3, LOSS_BINARY_CROSSENTROPY, OPT_SGD);
    add_dense(&s, 5, ACT_TANH);
    add_dense(&s, 2, ACT_SOFTMAX);
    grad_check(&s, 2, "softmax/bce (clipped, not fused)");

    spec_init(&s, 3, LOSS_CATEGORICAL_CROSSENTROPY, OPT_SGD);
    add_dense(&s, 5, ACT_TANH);
    add_dense(&s, 3, ACT_SIGMOID);
    grad_check(&s, 3, "sigmoid/cce (normalised, not fused)");

    spec_init(&s, 3, LOSS_MSE, OPT_SGD);
    add_dense(&s, 4, ACT_RELU);
    add_dense(&s, 1, ACT_LINEAR);
    grad_check(&s, 0, "linear/mse regression");
}
END_TEST

/* Losses against values computed by hand. */
START_TEST(loss_values)
{
    float logits[3] = {1.0f, 2.0f, 3.0f}, y = 2.0f, d[3];
    long correct = 0;
    double l = loss_forward_backward(LOSS_CATEGORICAL_CROSSENTROPY, 1, logits, &y, 1, 3, 2, d, &correct);
    double lse = log(exp(1.0) + exp(2.0) + exp(3.0));
    ck_assert_double_eq_tol(l, lse - 3.0, 1e-6);
    ck_assert_double_eq_tol(d[2], (exp(3.0 - lse) - 1.0) / 2.0, 1e-6);
    ck_assert_int_eq(correct, 1);
    /* extreme logits stay finite */
    float big[2] = {1000.0f, -1000.0f}, y0 = 1.0f;
    l = loss_forward_backward(LOSS_CATEGORICAL_CROSSENTROPY, 1, big, &y0, 1, 2, 1, d, NULL);
    ck_assert_double_eq_tol(l, 2000.0, 1e-3);
    float u = 800.0f, t = 0.0f;
    l = loss_forward_backward(LOSS_BINARY_CROSSENTROPY, 1, &u, &t, 1, 1, 1, d, NULL);
    ck_assert_double_eq_tol(l, 800.0, 1e-3);
    ck_assert(isfinite(d[0]));
    /* Keras' clipping: p = 0 with t = 1 gives -log(eps + eps) */
    float p = 0.0f, one = 1.0f;
    l = loss_forward_backward(LOSS_BINARY_CROSSENTROPY, 0, &p, &one, 1, 1, 1, d, NULL);
    ck_assert_double_eq_tol(l, -log(2e-7), 1e-3);
    ck_assert(d[0] == 0.0f);
    /* mse on one output: mean of squares, gradient 2 e / B */
    float o = 3.0f, tg = 1.0f;
    l = loss_forward_backward(LOSS_MSE, 0, &o, &tg, 1, 1, 4, d, NULL);
    ck_assert_double_eq_tol(l, 4.0, 1e-9);
    ck_assert_double_eq_tol(d[0], 1.0, 1e-7);
}
END_TEST

/* ------------------------------------------------------------ optimizers */

static void opt_defaults(optimizer_spec *o, opt_type t, float lr)
{
    memset(o, 0, sizeof *o);
    o->type = t;
    o->learning_rate = lr;
    o->rho = 0.9f;
    o->beta_1 = 0.9f;
    o->beta_2 = 0.999f;
    o->epsilon = 1e-7f;
    o->initial_accumulator_value = 0.1f;
}

/* Three updates of one weight (w0 = 1) with grads 0.5, -0.25, 1.0. */
static const float G[3] = {0.5f, -0.25f, 1.0f};

static void run_opt(const optimizer_spec *o, float *w_out)
{
    float w[16] = {1.0f}, slots[48];
    float g[16] = {0};
    optimizer_init_slots(o, slots, 16);
    for (int t = 0; t < 3; t++) {
        g[0] = G[t];
        optimizer_step(o, w, g, slots, 16, 16, t);
        w_out[t] = w[0];
        for (int i = 1; i < 16; i++)
            ck_assert_msg(w[i] == 0.0f, "a zero gradient moved a zero weight");
    }
}

START_TEST(optimizer_sgd)
{
    optimizer_spec o;
    float w[3];
    opt_defaults(&o, OPT_SGD, 0.1f);
    run_opt(&o, w);
    ck_assert_float_eq_tol(w[0], 0.95f, 1e-6f);     /* 1 - 0.1*0.5 */
    ck_assert_float_eq_tol(w[1], 0.975f, 1e-6f);    /* + 0.025 */
    ck_assert_float_eq_tol(w[2], 0.875f, 1e-6f);
    o.momentum = 0.9f;
    run_opt(&o, w);
    /* m1 = -0.05, w1 = 0.95; m2 = -0.045 + 0.025 = -0.02, w2 = 0.93;
     * m3 = -0.018 - 0.1 = -0.118, w3 = 0.812 */
    ck_assert_float_eq_tol(w[0], 0.95f, 1e-6f);
    ck_assert_float_eq_tol(w[1], 0.93f, 1e-6f);
    ck_assert_float_eq_tol(w[2], 0.812f, 1e-6f);
    o.nesterov = 1;
    run_opt(&o, w);
    /* w += mu*m - lr*g: 1 - 0.045 - 0.05 = 0.905; 0.905 - 0.018 + 0.025 = 0.912;
     * 0.912 - 0.1062 - 0.1 = 0.7058 */
    ck_assert_float_eq_tol(w[0], 0.905f, 1e-6f);
    ck_assert_float_eq_tol(w[1], 0.912f, 1e-6f);
    ck_assert_float_eq_tol(w[2], 0.7058f, 1e-6f);
}
END_TEST

START_TEST(optimizer_rmsprop)
{
    optimizer_spec o;
    float w[3];
    opt_defaults(&o, OPT_RMSPROP, 0.01f);
    run_opt(&o, w);
    double v = 0, ww = 1;
    for (int t = 0; t < 3; t++) {
        v = 0.9 * v + 0.1 * G[t] * G[t];
        ww -= 0.01 * G[t] / sqrt(v + 1e-7);
        ck_assert_double_eq_tol(w[t], ww, 1e-6);
    }
    ck_assert_float_eq_tol(w[0], 1.0f - 0.01f * 0.5f / sqrtf(0.025f), 1e-6f); /* 0.968377 */
    o.centered = 1;
    o.momentum = 0.5f;
    run_opt(&o, w);
    double a = 0, mom = 0;
    v = 0;
    ww = 1;
    for (int t = 0; t < 3; t++) {
        v = 0.9 * v + 0.1 * G[t] * G[t];
        a = 0.9 * a + 0.1 * G[t];
        mom = 0.5 * mom + 0.01 * G[t] / sqrt(v - a * a + 1e-7);
        ww -= mom;
        ck_assert_double_eq_tol(w[t], ww, 1e-5);
    }
}
END_TEST

START_TEST(optimizer_adam_adagrad)
{
    optimizer_spec o;
    float w[3];
    opt_defaults(&o, OPT_ADAM, 0.01f);
    run_opt(&o, w);
    /* first Adam step moves by lr * g/|g| (up to epsilon): 1 - 0.01 */
    ck_assert_float_eq_tol(w[0], 0.99f, 1e-5f);
    double m = 0, v = 0, ww = 1;
    for (int t = 0; t < 3; t++) {
        m += (G[t] - m) * 0.1;
        v += (G[t] * G[t] - v) * 0.001;
        double alpha = 0.01 * sqrt(1 - pow(0.999, t + 1)) / (1 - pow(0.9, t + 1));
        ww -= m * alpha / (sqrt(v) + 1e-7);
        ck_assert_double_eq_tol(w[t], ww, 1e-5);
    }
    o.amsgrad = 1;
    run_opt(&o, w);
    m = 0, v = 0, ww = 1;
    double vh = 0;
    for (int t = 0; t < 3; t++) {
        m += (G[t] - m) * 0.1;
        v += (G[t] * G[t] - v) * 0.001;
        vh = fmax(vh, v);
        double alpha = 0.01 * sqrt(1 - pow(0.999, t + 1)) / (1 - pow(0.9, t + 1));
        ww -= m * alpha / (sqrt(vh) + 1e-7);
        ck_assert_double_eq_tol(w[t], ww, 1e-5);
    }
    opt_defaults(&o, OPT_ADAGRAD, 0.1f);
    run_opt(&o, w);
    /* acc = 0.1 + 0.25 = 0.35: 1 - 0.1*0.5/sqrt(0.35) */
    ck_assert_float_eq_tol(w[0], 1.0f - 0.05f / sqrtf(0.35f), 1e-6f);
    double acc = 0.1;
    ww = 1;
    for (int t = 0; t < 3; t++) {
        acc += G[t] * G[t];
        ww -= 0.1 * G[t] / sqrt(acc + 1e-7);
        ck_assert_double_eq_tol(w[t], ww, 1e-6);
    }
}
END_TEST

/* ------------------------------------------------------------ determinism */

static jobspec seed_mlp(int in, int classes, opt_type opt)
{
    jobspec s;
    spec_init(&s, in, LOSS_CATEGORICAL_CROSSENTROPY, opt);
    add_dense(&s, 32, ACT_RELU);
    add_layer(&s, LAYER_DROPOUT, ACT_LINEAR, 0.4f);
    add_dense(&s, 16, ACT_TANH);
    add_layer(&s, LAYER_DROPOUT, ACT_LINEAR, 0.3f);
    add_dense(&s, classes, ACT_SOFTMAX);
    return s;
}

static void train_steps(model *m, const float *x, const float *y, int steps, int n, int in)
{
    for (int k = 0; k < steps; k++) {
        const float *xb = x + (size_t)(k % 4) * n * in, *yb = y + (k % 4) * n;
        if (k % 2) {
            model_forward_backward(m, xb, yb, n, n, NULL);
            model_apply_gradients(m);
        } else {
            model_train_step(m, xb, yb, n, n, NULL);
        }
    }
}

START_TEST(same_seed_same_weights)
{
    jobspec s = seed_mlp(10, 4, OPT_ADAM);
    model *a = build(&s, 8, 7), *b = build(&s, 8, 7), *c = build(&s, 8, 8);
    size_t np = model_param_count(a);
    ck_assert(!memcmp(model_params(a), model_params(b), np * sizeof(float)));
    ck_assert(memcmp(model_params(a), model_params(c), np * sizeof(float)));
    float x[4 * 8 * 10], y[4 * 8];
    make_data(x, y, 32, 10, 4, 3);
    train_steps(a, x, y, 9, 8, 10);
    train_steps(b, x, y, 9, 8, 10);
    ck_assert(!memcmp(model_params(a), model_params(b), np * sizeof(float)));
    /* train_step and forward_backward + apply are the same arithmetic */
    model *d = build(&s, 8, 7);
    for (int k = 0; k < 9; k++) {
        model_forward_backward(d, x + (k % 4) * 80, y + (k % 4) * 8, 8, 8, NULL);
        model_apply_gradients(d);
    }
    ck_assert(!memcmp(model_params(a), model_params(d), np * sizeof(float)));
    model_free(a);
    model_free(b);
    model_free(c);
    model_free(d);
}
END_TEST

/* Two replicas on half batches with summed gradients = one on the batch. */
START_TEST(replicas_sum_to_global_batch)
{
    jobspec s;
    spec_init(&s, 6, LOSS_SPARSE_CATEGORICAL_CROSSENTROPY, OPT_SGD);
    add_dense(&s, 12, ACT_RELU);
    add_dense(&s, 3, ACT_SOFTMAX);
    model *one = build(&s, 8, 1), *r0 = build(&s, 4, 1), *r1 = build(&s, 4, 1);
    float x[48], y[8];
    make_data(x, y, 8, 6, 3, 9);
    model_forward_backward(one, x, y, 8, 8, NULL);
    model_forward_backward(r0, x, y, 4, 8, NULL);
    model_forward_backward(r1, x + 24, y + 4, 4, 8, NULL);
    size_t np = model_param_count(one);
    for (size_t i = 0; i < np; i++)
        ck_assert_float_eq_tol(model_grads(r0)[i] + model_grads(r1)[i], model_grads(one)[i], 1e-6f);
    model_free(one);
    model_free(r0);
    model_free(r1);
}
END_TEST

/* The same with dropout, fused (relu dense + dropout) and on its own (after
 * tanh): replicas passing their rows' global offsets draw one device's
 * masks, so the summed gradients still equal the global batch's; without
 * the offsets they would not. */
START_TEST(replicas_with_dropout_draw_the_global_masks)
{
    jobspec s;
    spec_init(&s, 6, LOSS_SPARSE_CATEGORICAL_CROSSENTROPY, OPT_SGD);
    add_dense(&s, 16, ACT_RELU);
    add_layer(&s, LAYER_DROPOUT, ACT_LINEAR, 0.5f);
    add_dense(&s, 12, ACT_TANH);
    add_layer(&s, LAYER_DROPOUT, ACT_LINEAR, 0.3f);
    add_dense(&s, 3, ACT_SOFTMAX);
    model *one = build(&s, 8, 1), *r0 = build(&s, 5, 1), *r1 = build(&s, 5, 1);
    float x[48], y[8];
    make_data(x, y, 8, 6, 3, 9);
    size_t np = model_param_count(one);
    for (long it = 0; it < 3; it++) { /* masks change with the step */
        model_set_iterations(one, it);
        model_set_iterations(r0, it);
        model_set_iterations(r1, it);
        model_forward_backward(one, x, y, 8, 8, NULL);
        model_set_row_offset(r0, 0);
        model_forward_backward(r0, x, y, 3, 8, NULL);
        model_set_row_offset(r1, 3);
        model_forward_backward(r1, x + 18, y + 3, 5, 8, NULL);
        for (size_t i = 0; i < np; i++)
            ck_assert_float_eq_tol(model_grads(r0)[i] + model_grads(r1)[i], model_grads(one)[i], 1e-6f);
    }
    /* a replica that forgets its offset draws other masks */
    model_set_row_offset(r1, 0);
    model_forward_backward(one, x, y, 8, 8, NULL);
    model_set_row_offset(r0, 0);
    model_forward_backward(r0, x, y, 3, 8, NULL);
    model_forward_backward(r1, x + 18, y + 3, 5, 8, NULL);
    double diff = 0.0;
    for (size_t i = 0; i < np; i++)
        diff += fabs(model_grads(r0)[i] + model_grads(r1)[i] - model_grads(one)[i]);
    ck_assert_double_gt(diff, 1e-3);
    model_free(one);
    model_free(r0);
    model_free(r1);
}
END_TEST

/* Gradient accumulation: the 8 rows of a batch in M micro-batches (2, 3:
 * uneven, 8: one row each, 10: more micro-batches than rows) through a model
 * built for the largest micro-batch give the gradients, loss and counts of
 * the batch at once, with dropout (fused and on its own) and L1/L2 (added
 * once, not once per micro-batch), also as one of 2 replicas (half the
 * regularization) at a row offset. */
START_TEST(micro_batches_sum_to_the_batch)
{
    jobspec s;
    spec_init(&s, 6, LOSS_SPARSE_CATEGORICAL_CROSSENTROPY, OPT_SGD);
    add_dense(&s, 16, ACT_RELU);
    add_layer(&s, LAYER_DROPOUT, ACT_LINEAR, 0.5f);
    add_dense(&s, 12, ACT_TANH);
    add_layer(&s, LAYER_DROPOUT, ACT_LINEAR, 0.3f);
    add_dense(&s, 3, ACT_SOFTMAX);
    s.layers[0].l2 = 0.05f;
    s.layers[2].l1 = 0.01f;
    float x[48], y[8];
    make_data(x, y, 8, 6, 3, 9);
    const int micros[] = {2, 3, 8, 10};
    for (int replicas = 1; replicas <= 2; replicas++) {
        long row0 = replicas == 1 ? 0 : 8; /* the second replica's rows of a batch of 16 */
        int gb = 8 * replicas;
        model *one = build(&s, 8, 1);
        model_set_replicas(one, replicas);
        size_t np = model_param_count(one);
        for (size_t k = 0; k < sizeof micros / sizeof micros[0]; k++) {
            int mb = micros[k];
            model *acc = build(&s, (8 + mb - 1) / mb, 1);
            model_set_replicas(acc, replicas);
            ck_assert_int_eq(model_max_batch(acc), mb >= 8 ? 1 : (8 + mb - 1) / mb);
            for (long it = 0; it < 2; it++) { /* masks change with the step */
                model_set_iterations(one, it);
                model_set_iterations(acc, it);
                step_stats s1, s2;
                model_set_row_offset(one, row0);
                float l1 = model_forward_backward(one, x, y, 8, gb, &s1);
                /* stale gradients in the buffer must not survive (the
                 * alignment padding between tensors is never written) */
                for (int t = 0; t < model_tensor_count(acc); t++)
                    for (size_t i = 0; i < model_tensor_at(acc, t)->size; i++)
                        model_grads(acc)[model_tensor_at(acc, t)->offset + i] = 1e3f;
                float l2 = model_forward_backward_micro(acc, x, y, 8, row0, mb, gb, &s2);
                double md = 0.0;
                for (size_t i = 0; i < np; i++)
                    md = fmax(md, fabs((double)model_grads(acc)[i] - (double)model_grads(one)[i]));
                ck_assert_msg(md <= 1e-6, "%d micro-batches, %d replica(s): max |g - g_batch| = %g", mb,
                              replicas, md);
                ck_assert_float_eq_tol(l2, l1, 1e-6f);
                ck_assert_double_eq_tol(s2.loss_sum, s1.loss_sum, 1e-5);
                ck_assert_int_eq(s2.correct, s1.correct);
                ck_assert_int_eq(s2.n, 8);
            }
            model_free(acc);
        }
        model_free(one);
    }
}
END_TEST

/* The scratch that grows with the batch (activations, masks, backward
 * buffers) shrinks with the micro-batch: the Fashion-MNIST MLP of
 * docs/strategies.md at 1024 rows and at 8 micro-batches of 128. */
START_TEST(activation_bytes_scale_with_the_micro_batch)
{
    jobspec s;
    spec_init(&s, 784, LOSS_SPARSE_CATEGORICAL_CROSSENTROPY, OPT_SGD);
    add_dense(&s, 256, ACT_RELU);
    add_layer(&s, LAYER_DROPOUT, ACT_LINEAR, 0.4f);
    add_dense(&s, 128, ACT_RELU);
    add_layer(&s, LAYER_DROPOUT, ACT_LINEAR, 0.3f);
    add_dense(&s, 10, ACT_SOFTMAX);
    model *big = build(&s, 1024, 1), *small = build(&s, 128, 1);
    size_t b = model_activation_bytes(big), m = model_activation_bytes(small);
    printf("activation/gradient scratch, 784-256-128-10: batch 1024: %zu bytes (%.2f MiB); "
           "8 micro-batches of 128: %zu bytes (%.2f MiB); parameters+gradients: %zu bytes\n",
           b, b / 1048576.0, m, m / 1048576.0, 2 * model_param_count(big) * sizeof(float));
    /* (n * widths) floats: 8 times less, up to the alignment and the scratch row */
    ck_assert_double_ge((double)b / (double)m, 7.9);
    ck_assert_double_le((double)b / (double)m, 8.0);
    /* the outputs (256 + 128 + 10) and two backward buffers as wide as the
     * widest layer (256: the input's 784 never needs a gradient) */
    ck_assert_uint_ge(b, 1024u * (256u * 2 + 256 + 128 + 10) * sizeof(float));
    ck_assert_uint_lt(b, 1024u * (256u * 2 + 256 + 128 + 10) * sizeof(float) + 4096);
    model_free(big);
    model_free(small);
}
END_TEST

/* kernel_regularizer: the gradient gains l1 sign(w) + 2 l2 w on kernels
 * (not biases), the loss l1 sum|w| + l2 sum w^2; with 4 replicas each
 * replica adds a quarter of both. */
START_TEST(regularizer_gradient_and_share)
{
    jobspec plain, reg;
    spec_init(&plain, 5, LOSS_SPARSE_CATEGORICAL_CROSSENTROPY, OPT_SGD);
    add_dense(&plain, 7, ACT_RELU);
    add_dense(&plain, 3, ACT_SOFTMAX);
    reg = plain;
    reg.layers[0].l1 = 0.01f;
    reg.layers[0].l2 = 0.05f;
    reg.layers[1].l2 = 0.02f;
    float x[40], y[8];
    make_data(x, y, 8, 5, 3, 2);
    for (int replicas = 1; replicas <= 4; replicas += 3) {
        model *a = build(&plain, 8, 3), *b = build(&reg, 8, 3);
        model_set_replicas(b, replicas);
        float la = model_forward_backward(a, x, y, 8, 8, NULL);
        float lb = model_forward_backward(b, x, y, 8, 8, NULL);
        double want_loss = 0.0;
        for (int t = 0; t < model_tensor_count(b); t++) {
            const model_tensor *mt = model_tensor_at(b, t);
            int layer = t < 2 ? 0 : 1; /* dense_0.kernel, dense_0.bias, dense_1.kernel, dense_1.bias */
            float l1 = reg.layers[layer].l1, l2 = reg.layers[layer].l2;
            int kernel = mt->rank == 2;
            for (size_t k = 0; k < mt->size; k++) {
                size_t i = mt->offset + k;
                float w = model_params(b)[i];
                float want = kernel ? (l1 * (float)((w > 0) - (w < 0)) + 2.0f * l2 * w) / (float)replicas : 0.0f;
                ck_assert_float_eq_tol(model_grads(b)[i] - model_grads(a)[i], want, 1e-6f);
                if (kernel)
                    want_loss += l1 * fabs(w) + l2 * (double)w * w;
            }
        }
        ck_assert_double_eq_tol((double)lb - la, want_loss / replicas, 1e-5);
        model_free(a);
        model_free(b);
    }
}
END_TEST

/* ------------------------------------------------------------ convolutional models */

static void tmp_path(char *out, size_t cap, const char *name);

/* A spec from JSON (' for "): layers over synthetic data of `features`
 * values, sparse categorical cross-entropy, adam. */
static jobspec cnn_spec(const char *layers, int features)
{
    char json[4096];
    ck_assert(sfmt(json, sizeof json,
                   "{'model':{'layers':[%s]},'compile':{'optimizer':'adam','loss':"
                   "'sparse_categorical_crossentropy','metrics':['accuracy']},"
                   "'data':{'source':'synthetic','features':%d}}",
                   layers, features) == 0);
    for (char *c = json; *c; c++)
        if (*c == '\'')
            *c = '"';
    jobspec s;
    spec_error e;
    int rc = jobspec_parse(json, strlen(json), &s, &e);
    ck_assert_msg(rc == 0, "spec refused: %s %s", e.field, e.message);
    return s;
}

/* conv2d (same and valid padding, strides 1 and 2, a non-square kernel,
 * relu and tanh, with and without bias), max pooling,
 * flatten: every gradient against central differences */
START_TEST(grad_conv_maxpool)
{
    jobspec s = cnn_spec("{'type':'conv2d','filters':3,'kernel_size':3,'padding':'same','activation':'relu',"
                         "'input_shape':[6,6,2]},"
                         "{'type':'max_pooling2d'},"
                         "{'type':'conv2d','filters':4,'kernel_size':[2,3],'strides':[1,2],'activation':'tanh',"
                         "'use_bias':false},"
                         "{'type':'flatten'},{'type':'dense','units':2,'activation':'softmax'}",
                         72);
    grad_check(&s, 2, "conv2d same/relu, maxpool, conv2d valid 2x3 stride 1x2/tanh/no bias, dense");
}
END_TEST

/* batch normalization first (no input gradient), after a strided conv
 * (center off) and after global pooling (scale off); dropout on an image;
 * an activation layer; average pooling with same padding */
START_TEST(grad_batchnorm_avgpool_gap)
{
    jobspec s = cnn_spec("{'type':'batch_normalization','input_shape':[5,5,3]},"
                         "{'type':'conv2d','filters':3,'kernel_size':3,'strides':2,'padding':'same'},"
                         "{'type':'batch_normalization','center':false},"
                         "{'type':'activation','activation':'relu'},"
                         "{'type':'dropout','rate':0.25,'seed':7},"
                         "{'type':'average_pooling2d','pool_size':2,'strides':1,'padding':'same'},"
                         "{'type':'global_average_pooling2d'},"
                         "{'type':'batch_normalization','scale':false},"
                         "{'type':'dense','units':2,'activation':'softmax'}",
                         75);
    grad_check(&s, 2, "bn, conv stride 2 same, bn(no beta), relu, dropout, avgpool same, gap, bn(no gamma)");
}
END_TEST

/* reshape of a flat input into an image; a 1x1 convolution (no im2col) */
START_TEST(grad_reshape_pointwise_conv)
{
    jobspec s = cnn_spec("{'type':'reshape','target_shape':[2,-1,2],'input_shape':[12]},"
                         "{'type':'conv2d','filters':3,'kernel_size':1,'activation':'sigmoid'},"
                         "{'type':'flatten'},{'type':'dense','units':2,'activation':'softmax'}",
                         12);
    grad_check(&s, 2, "reshape, 1x1 conv/sigmoid, dense");
}
END_TEST

/* The tensors are laid out as model.h says, initialised as Keras does
 * (gamma 1, beta 0, moving mean 0, moving variance 1, glorot limit from
 * kh * kw * channels), and batch normalization's moving statistics move by
 * momentum from the training batches while evaluation reads them. */
START_TEST(cnn_layout_and_moving_statistics)
{
    jobspec s = cnn_spec("{'type':'conv2d','filters':4,'kernel_size':3,'input_shape':[6,6,1]},"
                         "{'type':'batch_normalization','momentum':0.5},"
                         "{'type':'flatten'},{'type':'dense','units':2,'activation':'softmax'}",
                         36);
    model *m = build(&s, 8, 3);
    static const char *names[] = {"conv2d_0.kernel", "conv2d_0.bias", "batch_normalization_0.gamma",
                                  "batch_normalization_0.beta", "dense_0.kernel", "dense_0.bias"};
    ck_assert_int_eq(model_tensor_count(m), 6);
    for (int t = 0; t < 6; t++)
        ck_assert_str_eq(model_tensor_at(m, t)->name, names[t]);
    const model_tensor *k = model_tensor_at(m, 0);
    ck_assert_int_eq(k->rank, 4);
    ck_assert(k->shape[0] == 3 && k->shape[1] == 3 && k->shape[2] == 1 && k->shape[3] == 4);
    double limit = sqrt(6.0 / (9.0 * 1 + 9.0 * 4)), maxabs = 0;
    for (size_t i = 0; i < k->size; i++)
        maxabs = fmax(maxabs, fabs(model_params(m)[k->offset + i]));
    ck_assert_msg(maxabs <= limit && maxabs > limit * 0.5, "glorot limit %g, max |w| %g", limit, maxabs);
    ck_assert_int_eq(model_state_tensor_count(m), 2);
    const model_tensor *mm = model_state_tensor_at(m, 0), *mv = model_state_tensor_at(m, 1);
    ck_assert_str_eq(mm->name, "batch_normalization_0.moving_mean");
    ck_assert_str_eq(mv->name, "batch_normalization_0.moving_variance");
    for (int c = 0; c < 4; c++) {
        ck_assert(model_params(m)[model_tensor_at(m, 2)->offset + c] == 1.0f);
        ck_assert(model_params(m)[model_tensor_at(m, 3)->offset + c] == 0.0f);
        ck_assert(model_state(m)[mm->offset + c] == 0.0f);
        ck_assert(model_state(m)[mv->offset + c] == 1.0f);
    }
    float x[8 * 36], y[8];
    make_data(x, y, 8, 36, 2, 9);
    double l0, l1;
    model_evaluate(m, x, y, 8, &l0, NULL);
    model_forward_backward(m, x, y, 8, 8, NULL);
    /* the batch's statistics of channel c over 8 x 4 x 4 positions, by hand */
    float *w = model_params(m) + k->offset, *b = model_params(m) + model_tensor_at(m, 1)->offset;
    for (int c = 0; c < 4; c++) {
        double sum = 0, sq = 0;
        long cnt = 0;
        for (int e = 0; e < 8; e++)
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++) {
                    double v = b[c];
                    for (int u = 0; u < 3; u++)
                        for (int t = 0; t < 3; t++)
                            v += (double)x[e * 36 + (i + u) * 6 + (j + t)] * w[(u * 3 + t) * 4 + c];
                    sum += v;
                    sq += v * v;
                    cnt++;
                }
        double mean = sum / cnt, var = sq / cnt - mean * mean;
        double want_m = 0.5 * mean, want_v = 0.5 * 1.0 + 0.5 * var * cnt / (cnt - 1);
        ck_assert_msg(fabs(model_state(m)[mm->offset + c] - want_m) < 1e-5, "moving mean[%d] %g want %g", c,
                      (double)model_state(m)[mm->offset + c], want_m);
        ck_assert_msg(fabs(model_state(m)[mv->offset + c] - want_v) < 1e-4 * fmax(1.0, want_v),
                      "moving variance[%d] %g want %g", c, (double)model_state(m)[mv->offset + c], want_v);
    }
    /* evaluation reads the moving statistics (it changed with them), and
     * does not move them */
    float keep[8];
    memcpy(keep, model_state(m), sizeof keep);
    model_evaluate(m, x, y, 8, &l1, NULL);
    ck_assert_msg(l1 != l0, "evaluation did not use the moving statistics");
    ck_assert(!memcmp(keep, model_state(m), sizeof keep));
    model_free(m);
}
END_TEST

/* A CNN with batch normalization and dropout: save, train on, and a fresh
 * model loaded from the file trains to the same bits, moving statistics
 * included; a file without them does not load into a model that has them. */
START_TEST(cnn_checkpoint_resume_bit_identical)
{
    jobspec s = cnn_spec("{'type':'conv2d','filters':4,'kernel_size':3,'activation':'relu','input_shape':[6,6,1]},"
                         "{'type':'batch_normalization'},{'type':'max_pooling2d'},{'type':'dropout','rate':0.3},"
                         "{'type':'flatten'},{'type':'dense','units':2,'activation':'softmax'}",
                         36);
    float x[32 * 36], y[32];
    make_data(x, y, 32, 36, 2, 4);
    model *a = build(&s, 8, 11);
    train_steps(a, x, y, 4, 8, 36);
    char path[512], err[ERR_MAX];
    tmp_path(path, sizeof path, "cnn.safetensors");
    ckpt_meta meta = {.epoch = 1, .step = 4};
    ck_assert_msg(checkpoint_save(path, a, &meta, err) == 0, "%s", err);
    train_steps(a, x, y, 6, 8, 36);
    model *b = build(&s, 8, 999);
    ckpt_meta got;
    ck_assert_msg(checkpoint_load(path, b, &got, err) == 0, "%s", err);
    train_steps(b, x, y, 6, 8, 36);
    ck_assert(!memcmp(model_params(a), model_params(b), model_param_count(a) * sizeof(float)));
    ck_assert(!memcmp(model_slots(a), model_slots(b),
                      model_param_count(a) * (size_t)model_slot_count(a) * sizeof(float)));
    ck_assert_msg(!memcmp(model_state(a), model_state(b), model_state_count(a) * sizeof(float)),
                  "resumed moving statistics differ");
    double la, lb;
    model_evaluate(a, x, y, 32, &la, NULL);
    model_evaluate(b, x, y, 32, &lb, NULL);
    ck_assert(la == lb);
    /* the same layers without batch normalization: another signature */
    jobspec s2 = cnn_spec("{'type':'conv2d','filters':4,'kernel_size':3,'activation':'relu','input_shape':[6,6,1]},"
                          "{'type':'max_pooling2d'},{'type':'dropout','rate':0.3},"
                          "{'type':'flatten'},{'type':'dense','units':2,'activation':'softmax'}",
                          36);
    model *c = build(&s2, 8, 1);
    ck_assert(checkpoint_load(path, c, &got, err) == -1);
    model_free(a);
    model_free(b);
    model_free(c);
}
END_TEST

/* Two replicas on half batches sum to the whole batch's gradients through
 * convolutions, pooling and dropout (no batch normalization: its batch
 * statistics are each replica's own, as in Keras); gradient accumulation
 * in micro-batches gives the same. */
START_TEST(cnn_replicas_and_micro_batches_sum_to_the_batch)
{
    jobspec s = cnn_spec("{'type':'conv2d','filters':3,'kernel_size':3,'activation':'relu','padding':'same',"
                         "'input_shape':[5,5,2]},{'type':'average_pooling2d'},{'type':'dropout','rate':0.2},"
                         "{'type':'conv2d','filters':2,'kernel_size':2},"
                         "{'type':'flatten'},{'type':'dense','units':2,'activation':'softmax'}",
                         50);
    float x[16 * 50], y[16];
    make_data(x, y, 16, 50, 2, 6);
    model *one = build(&s, 16, 5), *r0 = build(&s, 8, 5), *r1 = build(&s, 8, 5), *mb = build(&s, 6, 5);
    model_forward_backward(one, x, y, 16, 16, NULL);
    model_set_replicas(r0, 2);
    model_set_replicas(r1, 2);
    model_set_row_offset(r0, 0);
    model_forward_backward(r0, x, y, 8, 16, NULL);
    model_set_row_offset(r1, 8);
    model_forward_backward(r1, x + 8 * 50, y + 8, 8, 16, NULL);
    model_forward_backward_micro(mb, x, y, 16, 0, 3, 16, NULL);
    size_t np = model_param_count(one);
    double md = 0, mm = 0, big = 0;
    for (size_t i = 0; i < np; i++) {
        md = fmax(md, fabs((double)model_grads(r0)[i] + model_grads(r1)[i] - model_grads(one)[i]));
        mm = fmax(mm, fabs((double)model_grads(mb)[i] - model_grads(one)[i]));
        big = fmax(big, fabs((double)model_grads(one)[i]));
    }
    ck_assert_msg(big > 1e-3, "no gradient");
    ck_assert_msg(md <= 1e-6 + 1e-5 * big, "replicas: max difference %g", md);
    ck_assert_msg(mm <= 1e-6 + 1e-5 * big, "micro-batches: max difference %g", mm);
    model_free(one);
    model_free(r0);
    model_free(r1);
    model_free(mb);
}
END_TEST

/* ------------------------------------------------------------ checkpoints */

static char tmpdir[256];

static void tmp_setup(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/check_nn.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void tmp_teardown(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
}

static void tmp_path(char *out, size_t cap, const char *name)
{
    ck_assert(sfmt(out, cap, "%s/%s", tmpdir, name) == 0);
}

START_TEST(checkpoint_resume_bit_identical)
{
    opt_type opts[4] = {OPT_RMSPROP, OPT_ADAM, OPT_SGD, OPT_ADAGRAD};
    for (int oi = 0; oi < 4; oi++) {
        jobspec s = seed_mlp(10, 4, opts[oi]);
        s.optimizer.momentum = opts[oi] == OPT_SGD ? 0.9f : 0.0f;
        s.optimizer.amsgrad = opts[oi] == OPT_ADAM;
        s.optimizer.centered = opts[oi] == OPT_RMSPROP;
        float x[4 * 8 * 10], y[4 * 8];
        make_data(x, y, 32, 10, 4, 4);
        model *a = build(&s, 8, 11);
        train_steps(a, x, y, 5, 8, 10);
        char path[512], err[ERR_MAX];
        tmp_path(path, sizeof path, "a.safetensors");
        ckpt_meta meta = {.epoch = 3, .step = 5, .batch_pos = 40, .data_rng = 0xfeedbeefcafe1234ULL,
                          .epoch_loss_sum = 1.0 / 3.0, .epoch_correct = 17, .epoch_seen = 40};
        snprintf(meta.spec_hash, sizeof meta.spec_hash, "abc123");
        ck_assert_msg(checkpoint_save(path, a, &meta, err) == 0, "%s", err);
        train_steps(a, x, y, 7, 8, 10);

        model *b = build(&s, 8, 999); /* other initial weights, other dropout stream */
        ckpt_meta got;
        ck_assert_msg(checkpoint_load(path, b, &got, err) == 0, "%s", err);
        ck_assert_int_eq(got.epoch, 3);
        ck_assert_int_eq(got.step, 5);
        ck_assert_int_eq(got.batch_pos, 40);
        ck_assert(got.data_rng == 0xfeedbeefcafe1234ULL);
        ck_assert(got.epoch_loss_sum == 1.0 / 3.0);
        ck_assert_int_eq(got.epoch_correct, 17);
        ck_assert_int_eq(got.epoch_seen, 40);
        ck_assert_str_eq(got.spec_hash, "abc123");
        ck_assert_int_eq(model_iterations(b), 5);
        train_steps(b, x, y, 7, 8, 10);
        size_t np = model_param_count(a);
        ck_assert_msg(!memcmp(model_params(a), model_params(b), np * sizeof(float)),
                      "optimizer %d: resumed weights differ", oi);
        ck_assert(!memcmp(model_slots(a), model_slots(b),
                          np * (size_t)model_slot_count(a) * sizeof(float)));
        model_free(a);
        model_free(b);
    }
}
END_TEST

static void write_bytes(const char *path, const void *d, size_t n)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert(fwrite(d, 1, n, f) == n);
    ck_assert(fclose(f) == 0);
}

static void expect_load_error(model *m, const void *d, size_t n, const char *needle)
{
    char err[ERR_MAX] = "";
    size_t np = model_param_count(m);
    float *before = xmalloc(np * sizeof(float));
    memcpy(before, model_params(m), np * sizeof(float));
    ckpt_meta meta;
    ck_assert_msg(checkpoint_decode(d, n, m, &meta, err) == -1, "a bad file (%zu bytes) loaded", n);
    ck_assert_msg(strstr(err, needle) != NULL, "error '%s' lacks '%s'", err, needle);
    ck_assert_msg(!memcmp(before, model_params(m), np * sizeof(float)), "a failed load changed the model");
    free(before);
}

START_TEST(checkpoint_corrupt)
{
    jobspec s = seed_mlp(10, 4, OPT_RMSPROP);
    model *m = build(&s, 8, 1), *other = build(&s, 8, 2);
    ckpt_meta meta;
    memset(&meta, 0, sizeof meta);
    unsigned char *d;
    size_t n;
    char err[ERR_MAX];
    ck_assert(checkpoint_encode(m, &meta, &d, &n, err) == 0);
    /* truncated anywhere */
    expect_load_error(other, d, 0, "truncated");
    expect_load_error(other, d, 5, "truncated");
    expect_load_error(other, d, 8, "header length");
    expect_load_error(other, d, 100, "header length");
    expect_load_error(other, d, n - 1, "truncated");
    expect_load_error(other, d, n / 2, "truncated");
    /* garbage header */
    unsigned char *bad = xmalloc(n);
    memcpy(bad, d, n);
    memset(bad + 9, '#', 20);
    expect_load_error(other, bad, n, "not a JSON object");
    /* absurd header length */
    memcpy(bad, d, n);
    bad[7] = 0x7f;
    expect_load_error(other, bad, n, "header length");
    /* wrong shape: a checkpoint of a wider model */
    jobspec s2 = seed_mlp(10, 4, OPT_RMSPROP);
    s2.layers[0].units = 33;
    model *wide = build(&s2, 8, 1);
    unsigned char *d2;
    size_t n2;
    ck_assert(checkpoint_encode(wide, &meta, &d2, &n2, err) == 0);
    expect_load_error(other, d2, n2, "another model");
    /* another optimizer */
    jobspec s3 = seed_mlp(10, 4, OPT_ADAM);
    model *adam = build(&s3, 8, 1);
    unsigned char *d3;
    size_t n3;
    ck_assert(checkpoint_encode(adam, &meta, &d3, &n3, err) == 0);
    expect_load_error(other, d3, n3, "another model");
    /* a shape edited inside the header (same length) */
    memcpy(bad, d, n);
    char *hit = memmem(bad, n, "[10,32]", 7);
    ck_assert_ptr_nonnull(hit);
    memcpy(hit, "[32,10]", 7);
    expect_load_error(other, bad, n, "shape");
    /* a missing file */
    ck_assert(checkpoint_load("/nonexistent/x.safetensors", other, &meta, err) == -1);
    ck_assert_ptr_nonnull(strstr(err, "/nonexistent/x.safetensors"));
    /* and the good bytes still load */
    ck_assert_msg(checkpoint_decode(d, n, other, &meta, err) == 0, "%s", err);
    ck_assert(!memcmp(model_params(m), model_params(other), model_param_count(m) * sizeof(float)));
    free(bad);
    free(d);
    free(d2);
    free(d3);
    model_free(m);
    model_free(other);
    model_free(wide);
    model_free(adam);
}
END_TEST

static int have_python_numpy(void)
{
    if (access("/usr/bin/python3", X_OK) != 0)
        return 0;
    return system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") == 0;
}

START_TEST(checkpoint_read_by_python)
{
    if (!have_python_numpy()) {
        fprintf(stderr, "checkpoint_read_by_python: SKIPPED: /usr/bin/python3 with numpy is absent\n");
        return;
    }
    jobspec s = seed_mlp(10, 4, OPT_RMSPROP);
    model *m = build(&s, 8, 3);
    float x[4 * 8 * 10], y[4 * 8];
    make_data(x, y, 32, 10, 4, 4);
    train_steps(m, x, y, 3, 8, 10);
    char path[512], expect[512], err[ERR_MAX];
    tmp_path(path, sizeof path, "m.safetensors");
    tmp_path(expect, sizeof expect, "expected.json");
    ckpt_meta meta = {.epoch = 2, .step = 3};
    ck_assert(checkpoint_save(path, m, &meta, err) == 0);
    /* what the C side holds: each tensor's shape, a few values, its sum */
    buf b;
    buf_init(&b, 1 << 20);
    buf_appends(&b, "{\"metadata\": {\"step\": \"3\", \"epoch\": \"2\", \"optimizer\": \"rmsprop\"}, \"tensors\": {");
    int first = 1;
    for (int sl = -1; sl < model_slot_count(m); sl++) {
        for (int t = 0; t < model_tensor_count(m); t++) {
            const model_tensor *mt = model_tensor_at(m, t);
            const float *p = sl < 0 ? model_params(m) + mt->offset
                                    : model_slots(m) + (size_t)sl * model_param_count(m) + mt->offset;
            double sum = 0;
            for (size_t i = 0; i < mt->size; i++)
                sum += p[i];
            if (sl < 0)
                buf_printf(&b, "%s\"%s\": {", first ? "" : ", ", mt->name);
            else
                buf_printf(&b, "%s\"optimizer.%s.%s\": {", first ? "" : ", ", mt->name, model_slot_name(m, sl));
            first = 0;
            if (mt->rank == 2)
                buf_printf(&b, "\"shape\": [%d, %d], ", mt->shape[0], mt->shape[1]);
            else
                buf_printf(&b, "\"shape\": [%d], ", mt->shape[0]);
            buf_printf(&b, "\"first\": [%.9g, %.9g], \"last\": %.9g, \"sum\": %.17g}", (double)p[0],
                       (double)p[1], (double)p[mt->size - 1], sum);
        }
    }
    buf_appends(&b, "}}");
    write_bytes(expect, b.data, b.len);
    buf_release(&b);
    char cmd[1200];
    ck_assert(sfmt(cmd, sizeof cmd, "/usr/bin/python3 tests/read_checkpoint.py '%s' '%s'", path, expect) == 0);
    int rc = system(cmd);
    ck_assert_msg(rc == 0, "tests/read_checkpoint.py failed (status %d)", rc);
    model_free(m);
}
END_TEST

/* ------------------------------------------------------------ learning */

START_TEST(learns_separable_problems)
{
    /* binary: label = [w.x > 0] */
    enum { N = 2048, IN = 8 };
    float *x = xmalloc(sizeof(float) * N * IN), *y = xmalloc(sizeof(float) * N);
    make_data(x, y, N, IN, 1, 21);
    const float wt[IN] = {1, -2, 0.5f, 3, -1, 0.25f, 2, -0.5f};
    for (int i = 0; i < N; i++) {
        float d = 0;
        for (int j = 0; j < IN; j++)
            d += wt[j] * x[i * IN + j];
        y[i] = d > 0 ? 1.0f : 0.0f;
    }
    jobspec s;
    spec_init(&s, IN, LOSS_BINARY_CROSSENTROPY, OPT_ADAM);
    s.optimizer.learning_rate = 0.01f;
    add_dense(&s, 16, ACT_RELU);
    add_dense(&s, 1, ACT_SIGMOID);
    model *m = build(&s, 64, 5);
    double loss0, acc;
    model_evaluate(m, x, y, N, &loss0, &acc);
    for (int ep = 0; ep < 8; ep++)
        for (int i = 0; i + 64 <= N; i += 64)
            model_train_step(m, x + i * IN, y + i, 64, 64, NULL);
    double loss;
    model_evaluate(m, x, y, N, &loss, &acc);
    ck_assert_msg(acc > 0.95, "binary accuracy %.3f", acc);
    ck_assert(loss < loss0 / 3);
    float pred[4];
    model_predict(m, x, 4, pred);
    for (int i = 0; i < 4; i++)
        ck_assert(pred[i] >= 0.0f && pred[i] <= 1.0f);
    model_free(m);

    /* 3 classes by which of 3 directions is largest, through the train loop
     * on in-memory data with validation and test splits */
    dataset_splits ds;
    memset(&ds, 0, sizeof ds);
    dataset *parts[3] = {&ds.train, &ds.val, &ds.test};
    long sizes[3] = {1536, 256, 256};
    for (int p = 0; p < 3; p++) {
        dataset *d = parts[p];
        d->n = sizes[p];
        d->features = IN;
        d->classes = 3;
        d->x = xmalloc(sizeof(float) * (size_t)d->n * IN);
        d->y = xmalloc(sizeof(float) * (size_t)d->n);
        make_data(d->x, d->y, (int)d->n, IN, 3, 100 + (uint64_t)p);
        for (long i = 0; i < d->n; i++) {
            const float *r = d->x + i * IN;
            float a = r[0] + r[1], b2 = r[2] - r[3], c = r[4] + r[5] - r[6];
            d->y[i] = a >= b2 && a >= c ? 0.0f : (b2 >= c ? 1.0f : 2.0f);
        }
    }
    jobspec s3 = seed_mlp(IN, 3, OPT_RMSPROP);
    s3.layers[1].rate = 0.1f;
    s3.layers[3].rate = 0.1f;
    s3.optimizer.learning_rate = 0.01f;
    s3.fit.epochs = 10;
    s3.fit.batch_size = 32;
    train_result r;
    char err[ERR_MAX];
    ck_assert_msg(train_run_data(&s3, &ds, NULL, NULL, &r, NULL, err) == 0, "%s", err);
    ck_assert_int_eq(r.epochs_done, 10);
    ck_assert(r.has_val && r.has_test);
    ck_assert_msg(r.test_accuracy > 0.9, "3-class test accuracy %.3f", r.test_accuracy);
    ck_assert_msg(r.val_accuracy > 0.9, "3-class val accuracy %.3f", r.val_accuracy);
    dataset_splits_free(&ds);
    free(x);
    free(y);
}
END_TEST

/* ------------------------------------------------------------ train loop */

typedef struct stop_ctx {
    volatile sig_atomic_t stop;
    long stop_at;
    int checkpoints;
    int epochs_seen;
    double last_loss;
} stop_ctx;

static void on_step(void *ctx, const train_step_info *s)
{
    stop_ctx *c = ctx;
    if (c->stop_at && s->step == c->stop_at)
        c->stop = 1;
}

static void on_epoch(void *ctx, const train_epoch_metrics *e)
{
    stop_ctx *c = ctx;
    c->epochs_seen++;
    c->last_loss = e->loss;
}

static void on_ckpt(void *ctx, const char *path, const ckpt_meta *meta)
{
    (void)path;
    (void)meta;
    ((stop_ctx *)ctx)->checkpoints++;
}

static int sum_reduce_calls;
static int fake_reduce(void *ctx, model *m, float *g, size_t n, step_stats *st)
{
    (void)ctx;
    (void)m;
    (void)st;
    ck_assert(n > 0 && g != NULL);
    sum_reduce_calls++;
    return 0;
}

START_TEST(train_loop_stop_and_resume_bit_identical)
{
    dataset_splits ds;
    memset(&ds, 0, sizeof ds);
    ds.train.n = 200;
    ds.train.features = 6;
    ds.train.classes = 3;
    ds.train.x = xmalloc(sizeof(float) * 200 * 6);
    ds.train.y = xmalloc(sizeof(float) * 200);
    make_data(ds.train.x, ds.train.y, 200, 6, 3, 8);
    jobspec s = seed_mlp(6, 3, OPT_ADAM);
    s.fit.epochs = 3;
    s.fit.batch_size = 16; /* 13 steps an epoch, the last one short */
    s.data.seed = 4;
    char full[512], part[512], err[ERR_MAX];
    tmp_path(full, sizeof full, "full.safetensors");
    tmp_path(part, sizeof part, "part.safetensors");

    /* uninterrupted */
    stop_ctx c1 = {0};
    train_hooks h1 = {.ctx = &c1, .on_step = on_step, .on_epoch = on_epoch, .on_checkpoint = on_ckpt,
                      .stop = &c1.stop};
    train_options o1 = {.checkpoint_path = full};
    train_result r1;
    model *m1;
    ck_assert_msg(train_run_data(&s, &ds, &o1, &h1, &r1, &m1, err) == 0, "%s", err);
    ck_assert_int_eq(r1.epochs_done, 3);
    ck_assert_int_eq(r1.steps, 39);
    ck_assert_int_eq(c1.epochs_seen, 3);
    ck_assert_int_eq(c1.checkpoints, 3);

    /* stopped mid-epoch 2 (step 20), then resumed from its checkpoint */
    stop_ctx c2 = {.stop_at = 20};
    train_hooks h2 = {.ctx = &c2, .on_step = on_step, .on_epoch = on_epoch, .on_checkpoint = on_ckpt,
                      .stop = &c2.stop};
    train_options o2 = {.checkpoint_path = part};
    train_result r2;
    ck_assert_msg(train_run_data(&s, &ds, &o2, &h2, &r2, NULL, err) == 0, "%s", err);
    ck_assert(r2.stopped);
    ck_assert_int_eq(r2.steps, 20);
    ck_assert_int_eq(c2.checkpoints, 2); /* end of epoch 1, then the stop */

    stop_ctx c3 = {0};
    train_hooks h3 = {.ctx = &c3, .on_epoch = on_epoch, .grad_reduce = fake_reduce, .stop = &c3.stop};
    train_options o3 = {.resume_path = part};
    train_result r3;
    model *m3;
    sum_reduce_calls = 0;
    ck_assert_msg(train_run_data(&s, &ds, &o3, &h3, &r3, &m3, err) == 0, "%s", err);
    ck_assert_int_eq(sum_reduce_calls, 19);
    ck_assert_int_eq(r3.epochs_done, 3);
    ck_assert_int_eq(r3.steps, 39);
    ck_assert_int_eq(c3.epochs_seen, 2);
    ck_assert(r3.loss == r1.loss); /* the epoch's running metrics were resumed too */
    ck_assert(!memcmp(model_params(m1), model_params(m3), model_param_count(m1) * sizeof(float)));

    /* a bad resume path is an error, not a crash */
    train_options o4 = {.resume_path = "/nonexistent.safetensors"};
    ck_assert(train_run_data(&s, &ds, &o4, NULL, &r3, NULL, err) == -1);
    ck_assert_ptr_nonnull(strstr(err, "nonexistent"));
    model_free(m1);
    model_free(m3);
    dataset_splits_free(&ds);
}
END_TEST

START_TEST(build_errors)
{
    jobspec s;
    model *m = NULL;
    char err[ERR_MAX];
    spec_init(&s, 4, LOSS_MSE, OPT_SGD);
    ck_assert(model_build(&m, &s, 8, 1, err) == -1); /* no layers */
    add_layer(&s, LAYER_DROPOUT, ACT_LINEAR, 0.5f);
    ck_assert(model_build(&m, &s, 8, 1, err) == -1);
    ck_assert_ptr_nonnull(strstr(err, "no trainable layer"));
    add_dense(&s, 2, ACT_LINEAR);
    s.layers[0].rate = 1.5f;
    ck_assert(model_build(&m, &s, 8, 1, err) == -1);
    ck_assert_ptr_nonnull(strstr(err, "model.layers[0]"));
    s.layers[0].rate = 0.5f;
    ck_assert(model_build(&m, &s, 0, 1, err) == -1);
    ck_assert(model_build(&m, &s, 8, 1, err) == 0);
    ck_assert_int_eq(model_tensor_count(m), 2);
    ck_assert_str_eq(model_tensor_at(m, 0)->name, "dense_0.kernel");
    ck_assert_str_eq(model_tensor_at(m, 1)->name, "dense_0.bias");
    ck_assert(model_param_count(m) % 16 == 0);
    model_free(m);
}
END_TEST

static Suite *nn_suite(void)
{
    Suite *s = suite_create("nn");
    TCase *g = tcase_create("gradients");
    tcase_add_test(g, grad_relu_softmax_cce);
    tcase_add_test(g, grad_relu_dropout_fused_mse);
    tcase_add_test(g, grad_tanh_dropout_sigmoid_bce);
    tcase_add_test(g, grad_activation_layers_sparse);
    tcase_add_test(g, grad_softmax_mse_and_relu_layer);
    tcase_add_test(g, grad_unfused_bce_cce_regression);
    tcase_add_test(g, loss_values);
    tcase_add_test(g, grad_conv_maxpool);
    tcase_add_test(g, grad_batchnorm_avgpool_gap);
    tcase_add_test(g, grad_reshape_pointwise_conv);
    suite_add_tcase(s, g);
    TCase *o = tcase_create("optimizers");
    tcase_add_test(o, optimizer_sgd);
    tcase_add_test(o, optimizer_rmsprop);
    tcase_add_test(o, optimizer_adam_adagrad);
    tcase_add_test(o, same_seed_same_weights);
    tcase_add_test(o, replicas_sum_to_global_batch);
    tcase_add_test(o, replicas_with_dropout_draw_the_global_masks);
    tcase_add_test(o, regularizer_gradient_and_share);
    tcase_add_test(o, micro_batches_sum_to_the_batch);
    tcase_add_test(o, activation_bytes_scale_with_the_micro_batch);
    tcase_add_test(o, build_errors);
    tcase_add_test(o, cnn_layout_and_moving_statistics);
    tcase_add_test(o, cnn_replicas_and_micro_batches_sum_to_the_batch);
    suite_add_tcase(s, o);
    TCase *c = tcase_create("checkpoints");
    tcase_add_checked_fixture(c, tmp_setup, tmp_teardown);
    tcase_add_test(c, checkpoint_resume_bit_identical);
    tcase_add_test(c, checkpoint_corrupt);
    tcase_add_test(c, checkpoint_read_by_python);
    tcase_add_test(c, cnn_checkpoint_resume_bit_identical);
    tcase_add_test(c, train_loop_stop_and_resume_bit_identical);
    suite_add_tcase(s, c);
    TCase *l = tcase_create("learning");
    tcase_set_timeout(l, 120);
    tcase_add_test(l, learns_separable_problems);
    suite_add_tcase(s, l);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(nn_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
