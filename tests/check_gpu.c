/* check_gpu.c - the GPU engine (executor/cuda) against the CPU engine
 * (executor/nn): the same spec, seed and batches through both, then the
 * weights, optimizer slots, gradients and stats compared within stated
 * tolerances; the parameter layout, checkpoints (to_host/from_host),
 * evaluation and prediction; device discovery.
 *
 * Tolerance (GEMMs sum in another order on the GPU): an element agrees when
 * |gpu - cpu| <= ATOL + RTOL * max(|gpu|, |cpu|), with ATOL = 1e-6 x the
 * largest |cpu| of the buffer (+ 1e-12) and RTOL = 1e-3; a few elements
 * (OUTLIERS: max(2, n / 2000)) may differ by up to 10 x steps x learning
 * rate, where a gradient within rounding of zero takes the other sign in an
 * Adam/RMSprop update, or a pre-activation within rounding of zero makes
 * the other relu decision. Dropout masks are the counter-based keys of
 * nn_rng.h on both sides (step = iterations before the update, rows keyed
 * by their global index), so the dropout cases compare exactly the same
 * masks.
 *
 * The convolutional cases (cnn_*) run two small CNNs (16x16x2 images; conv2d
 * same and valid, stride 2, 1x1, with and without bias; max pooling with
 * and without overlapping windows; average pooling with padding; batch
 * normalization on images and on a flat input, with and without
 * gamma/beta; global average pooling; dropout after a conv; reshape,
 * flatten, dense) through both engines: layout and initial values, a few
 * steps (train_step with and without the graph, forward_backward +
 * apply_gradients, two micro-batches), the moving statistics, evaluate,
 * predict and the state through to_host/from_host. Batch normalization
 * divides by the batch's standard deviation, which magnifies the rounding
 * differences of the GEMMs: evaluation there is compared to 1e-3 relative.
 *
 * Without a CUDA device (a CPU build, no driver, or no GPU) every case
 * prints "SKIP: no CUDA device (...)" and passes. The GPU session command:
 * bench/gpu/gpu-test.sh (docs/gpu.md). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../executor/cuda/gpu_device.h"
#include "../executor/cuda/gpu_model.h"
#include "../spec/shapes.h"
#include "../executor/nn/model.h"
#include "../executor/nn/nn_rng.h"

#define B 64           /* max batch */
#define SHORT 40       /* the last batch of a run: not full (eager path) */
#define STEPS 6
#define IN 48
#define IMG_H 16       /* the CNN cases' images: IMG_H x IMG_W x IMG_C */
#define IMG_W 16
#define IMG_C 2
#define IMG (IMG_H * IMG_W * IMG_C)

/* ------------------------------------------------------------ skip */

/* 1 when a CUDA device is there; else prints the skip line and returns 0. */
static int have_gpu(const char *test)
{
    int n = 0;
    char err[ERR_MAX] = "";
#ifndef TRAINYARD_CUDA
    (void)n;
    (void)err;
    printf("SKIP: no CUDA device (built without CUDA: make gpu-test): %s\n", test);
    return 0;
#else
    if (gpu_device_count(&n, err) != 0 || n == 0) {
        printf("SKIP: no CUDA device (%s): %s\n", err[0] ? err : "none found", test);
        return 0;
    }
    return 1;
#endif
}

/* ------------------------------------------------------------ specs */

enum variant {
    V_MLP,       /* dense relu [dropout] dense relu [dropout] dense softmax: fused paths */
    V_UNFUSED,   /* tanh + standalone dropout, linear + relu layer, sigmoid layer + BCE */
    V_REG        /* sigmoid dense with l1/l2, softmax dense + mse (unfused softmax) */
};

static void spec_init(jobspec *s, loss_type loss, opt_type opt)
{
    memset(s, 0, sizeof *s);
    s->input_rank = 1;
    s->input_shape[0] = IN;
    s->input_size = IN;
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
    s->fit.batch_size = B;
}

static layer_spec *add(jobspec *s, layer_type t, int units, act_type act, float rate)
{
    layer_spec *l = &s->layers[s->n_layers++];
    memset(l, 0, sizeof *l);
    l->type = t;
    l->units = units;
    l->activation = act;
    l->use_bias = 1;
    l->rate = rate;
    if (t == LAYER_DENSE)
        s->output_size = units;
    return l;
}

/* The model of a variant; *classes: label classes (0/1 for one output). */
static void make_spec(jobspec *s, enum variant v, opt_type opt, int dropout, int *classes)
{
    switch (v) {
    case V_MLP:
        spec_init(s, LOSS_SPARSE_CATEGORICAL_CROSSENTROPY, opt);
        add(s, LAYER_DENSE, 64, ACT_RELU, 0);
        if (dropout)
            add(s, LAYER_DROPOUT, 0, ACT_LINEAR, 0.4f);
        add(s, LAYER_DENSE, 32, ACT_RELU, 0);
        if (dropout)
            add(s, LAYER_DROPOUT, 0, ACT_LINEAR, 0.3f);
        add(s, LAYER_DENSE, 10, ACT_SOFTMAX, 0);
        *classes = 10;
        break;
    case V_UNFUSED:
        spec_init(s, LOSS_BINARY_CROSSENTROPY, opt);
        add(s, LAYER_DENSE, 32, ACT_TANH, 0);
        if (dropout)
            add(s, LAYER_DROPOUT, 0, ACT_LINEAR, 0.25f);
        add(s, LAYER_DENSE, 16, ACT_LINEAR, 0);
        add(s, LAYER_ACTIVATION, 0, ACT_RELU, 0);
        add(s, LAYER_DENSE, 1, ACT_LINEAR, 0);
        add(s, LAYER_ACTIVATION, 0, ACT_SIGMOID, 0);
        *classes = 2;
        break;
    case V_REG: {
        spec_init(s, LOSS_MSE, opt);
        layer_spec *l = add(s, LAYER_DENSE, 32, ACT_SIGMOID, 0);
        l->l1 = 1e-4f;
        l->l2 = 1e-3f;
        if (dropout)
            add(s, LAYER_DROPOUT, 0, ACT_LINEAR, 0.2f);
        add(s, LAYER_DENSE, 4, ACT_SOFTMAX, 0);
        *classes = 4;
        break;
    }
    }
}

/* n examples of `in` normal features; labels from a fixed random linear map
 * (class index, or 0/1 when classes == 2 with one output). */
static void make_data_in(float *x, float *y, int n, int in, int classes, uint64_t seed)
{
    nn_rng r;
    nn_rng_seed(&r, seed, 77);
    float *w = malloc(sizeof(float) * (size_t)in * 10);
    nn_rng t;
    nn_rng_seed(&t, 12345, 78);
    for (int i = 0; i < in * 10; i++)
        w[i] = (float)nn_rng_normal(&t);
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < in; j++)
            x[(long)i * in + j] = (float)nn_rng_normal(&r);
        int best = 0;
        float bv = -1e30f;
        for (int c = 0; c < classes; c++) {
            float v = 0.0f;
            for (int j = 0; j < in; j++)
                v += x[(long)i * in + j] * w[j * 10 + c];
            if (v > bv) {
                bv = v;
                best = c;
            }
        }
        y[i] = (float)best;
    }
    free(w);
}

static void make_data(float *x, float *y, int n, int classes, uint64_t seed)
{
    make_data_in(x, y, n, IN, classes, seed);
}

/* ------------------------------------------------------------ CNN specs */

enum cnn_variant {
    CNN_A,  /* conv same relu, BN, maxpool, conv valid stride 2 tanh l1/l2, dropout,
             * avgpool same (padded windows), GAP, dense softmax */
    CNN_B   /* flat input, reshape, BN (gamma only), 1x1 conv relu no bias, maxpool 3
             * stride 2 same (overlapping), conv 3x3 stride 2 same sigmoid, flatten,
             * dense relu + dropout, BN on a flat input, dense softmax */
};

static layer_spec *add_conv(jobspec *s, int filters, int k, int stride, padding_type pad,
                            act_type act, int bias)
{
    layer_spec *l = add(s, LAYER_CONV2D, 0, act, 0);
    l->filters = filters;
    l->kernel_size[0] = l->kernel_size[1] = k;
    l->strides[0] = l->strides[1] = stride;
    l->padding = pad;
    l->use_bias = bias;
    return l;
}

static layer_spec *add_pool(jobspec *s, layer_type t, int k, int stride, padding_type pad)
{
    layer_spec *l = add(s, t, 0, ACT_LINEAR, 0);
    l->pool_size[0] = l->pool_size[1] = k;
    l->strides[0] = l->strides[1] = stride;
    l->padding = pad;
    return l;
}

static layer_spec *add_bn(jobspec *s, float momentum, int center, int scale)
{
    layer_spec *l = add(s, LAYER_BATCH_NORMALIZATION, 0, ACT_LINEAR, 0);
    l->momentum = momentum;
    l->epsilon = 1e-3f;
    l->center = center;
    l->scale = scale;
    return l;
}

static void make_cnn_spec(jobspec *s, enum cnn_variant v, opt_type opt)
{
    spec_init(s, LOSS_SPARSE_CATEGORICAL_CROSSENTROPY, opt);
    if (v == CNN_A) {
        s->input_rank = 3;
        s->input_shape[0] = IMG_H;
        s->input_shape[1] = IMG_W;
        s->input_shape[2] = IMG_C;
        add_conv(s, 8, 3, 1, PAD_SAME, ACT_RELU, 1);            /* 16x16x8 */
        add_bn(s, 0.99f, 1, 1);
        add_pool(s, LAYER_MAX_POOLING2D, 2, 2, PAD_VALID);       /* 8x8x8 */
        layer_spec *c = add_conv(s, 12, 3, 2, PAD_VALID, ACT_TANH, 1); /* 3x3x12 */
        c->l1 = 1e-4f;
        c->l2 = 1e-3f;
        add(s, LAYER_DROPOUT, 0, ACT_LINEAR, 0.25f);
        add_pool(s, LAYER_AVERAGE_POOLING2D, 2, 2, PAD_SAME);    /* 2x2x12, padded */
        add(s, LAYER_GLOBAL_AVERAGE_POOLING2D, 0, ACT_LINEAR, 0); /* 12 */
        add(s, LAYER_DENSE, 10, ACT_SOFTMAX, 0);
    } else {
        s->input_rank = 1;
        s->input_shape[0] = IMG;
        layer_spec *r = add(s, LAYER_RESHAPE, 0, ACT_LINEAR, 0);
        r->target_rank = 3;
        r->target_shape[0] = IMG_H;
        r->target_shape[1] = IMG_W;
        r->target_shape[2] = -1;
        add_bn(s, 0.99f, 0, 1);                                  /* gamma, no beta */
        add_conv(s, 6, 1, 1, PAD_VALID, ACT_RELU, 0);            /* 1x1: 16x16x6 */
        add_pool(s, LAYER_MAX_POOLING2D, 3, 2, PAD_SAME);        /* overlapping: 8x8x6 */
        add_conv(s, 4, 3, 2, PAD_SAME, ACT_SIGMOID, 1);          /* 4x4x4 */
        add(s, LAYER_FLATTEN, 0, ACT_LINEAR, 0);                 /* 64 */
        add(s, LAYER_DENSE, 32, ACT_RELU, 0);
        add(s, LAYER_DROPOUT, 0, ACT_LINEAR, 0.3f);
        add_bn(s, 0.9f, 1, 1);                                   /* on (n, 32) */
        add(s, LAYER_DENSE, 10, ACT_SOFTMAX, 0);
    }
    spec_error se;
    ck_assert_msg(jobspec_resolve_shapes(s, &se) == 0, "jobspec_resolve_shapes: %s: %s", se.field, se.message);
    ck_assert_int_eq(s->input_size, IMG);
}

/* ------------------------------------------------------------ compare */

typedef struct cmp_result {
    size_t n, over, outliers;   /* elements, beyond tolerance, beyond the hard bound */
    double max_abs;             /* largest |gpu - cpu| */
    size_t worst;
} cmp_result;

static cmp_result compare(const float *gpu, const float *cpu, size_t n, double hard)
{
    cmp_result r = {n, 0, 0, 0.0, 0};
    double ref = 0.0;
    for (size_t i = 0; i < n; i++)
        ref = fabs(cpu[i]) > ref ? fabs(cpu[i]) : ref;
    double atol = 1e-6 * ref + 1e-12, rtol = 1e-3;
    for (size_t i = 0; i < n; i++) {
        double a = gpu[i], b = cpu[i], d = fabs(a - b);
        double m = fabs(a) > fabs(b) ? fabs(a) : fabs(b);
        if (!(d <= atol + rtol * m)) {
            r.over++;
            if (!(d <= hard))
                r.outliers++;
        }
        if (!(d <= r.max_abs)) {
            r.max_abs = d;
            r.worst = i;
        }
    }
    return r;
}

static void assert_close(const char *what, const char *test, const float *gpu, const float *cpu,
                         size_t n, double hard)
{
    cmp_result r = compare(gpu, cpu, n, hard);
    size_t budget = n / 2000 > 2 ? n / 2000 : 2;
    printf("  %-28s %-10s n=%zu max|d|=%.3g at %zu (gpu %.9g cpu %.9g) over_tol=%zu\n", test,
           what, n, r.max_abs, r.worst, n ? (double)gpu[r.worst] : 0.0,
           n ? (double)cpu[r.worst] : 0.0, r.over);
    ck_assert_msg(r.outliers == 0, "%s %s: %zu elements differ by more than %g (max %g at %zu)",
                  test, what, r.outliers, hard, r.max_abs, r.worst);
    ck_assert_msg(r.over <= budget, "%s %s: %zu elements beyond tolerance (budget %zu)", test,
                  what, r.over, budget);
}

/* ------------------------------------------------------------ runs */

typedef struct run_cfg {
    const char *name;
    enum variant v;
    opt_type opt;
    float momentum;
    int nesterov, centered, amsgrad;
    int dropout;
    int graph;
    int split;      /* forward_backward + apply_gradients instead of train_step */
} run_cfg;

static model *cpu_build(const jobspec *s, uint64_t seed)
{
    model *m = NULL;
    char err[ERR_MAX];
    ck_assert_msg(model_build(&m, s, B, seed, err) == 0, "model_build: %s", err);
    return m;
}

static gpu_model *gpu_build(const jobspec *s, uint64_t seed, int graph, int tf32)
{
    gpu_model *g = NULL;
    gpu_options o;
    char err[ERR_MAX];
    gpu_options_default(&o);
    o.cuda_graph = graph;
    o.tf32 = tf32;
    ck_assert_msg(gpu_model_build(&g, s, B, seed, &o, err) == 0, "gpu_model_build: %s", err);
    return g;
}

/* STEPS steps of both engines on the same batches (the last one SHORT
 * examples), then params, slots and stats compared. */
static void run_and_compare(const run_cfg *c)
{
    if (!have_gpu(c->name))
        return;
    jobspec s;
    int classes = 0;
    char err[ERR_MAX];
    make_spec(&s, c->v, c->opt, c->dropout, &classes);
    s.optimizer.momentum = c->momentum;
    s.optimizer.nesterov = c->nesterov;
    s.optimizer.centered = c->centered;
    s.optimizer.amsgrad = c->amsgrad;
    model *m = cpu_build(&s, 42);
    gpu_model *g = gpu_build(&s, 42, c->graph, 0);
    size_t np = model_param_count(m);
    int ns = model_slot_count(m);
    ck_assert_uint_eq(gpu_model_param_count(g), np);
    ck_assert_int_eq(gpu_model_slot_count(g), ns);

    float *x = malloc(sizeof(float) * B * IN), *y = malloc(sizeof(float) * B);
    float *gp = malloc(sizeof(float) * np), *gs = malloc(sizeof(float) * (np * ns + 1));
    float *gg = malloc(sizeof(float) * np);
    double cpu_loss = 0.0;
    long cpu_correct = 0, cpu_n = 0;
    for (int step = 0; step < STEPS; step++) {
        int n = step == STEPS - 1 ? SHORT : B;
        step_stats st;
        make_data(x, y, n, classes, 1000 + step);
        ck_assert_msg(gpu_model_load_batch(g, x, y, n, err) == 0, "load_batch: %s", err);
        if (c->split) {
            model_forward_backward(m, x, y, n, n, &st);
            ck_assert_msg(gpu_model_forward_backward(g, n, err) == 0, "forward_backward: %s", err);
            if (step == 0) { /* the first gradients, before any update */
                ck_assert_msg(gpu_model_get_grads(g, gg, err) == 0, "get_grads: %s", err);
                assert_close("grads", c->name, gg, model_grads(m), np, 1e30);
            }
            model_apply_gradients(m);
            ck_assert_msg(gpu_model_apply_gradients(g, err) == 0, "apply: %s", err);
        } else {
            model_train_step(m, x, y, n, n, &st);
            ck_assert_msg(gpu_model_train_step(g, n, err) == 0, "train_step: %s", err);
        }
        cpu_loss += st.loss_sum;
        cpu_correct += st.correct;
        cpu_n += st.n;
    }
    step_stats gst;
    ck_assert_msg(gpu_model_stats(g, &gst, 1, err) == 0, "stats: %s", err);
    ck_assert_msg(gpu_model_get_params(g, gp, gs, err) == 0, "get_params: %s", err);
    ck_assert_int_eq(gpu_model_iterations(g), model_iterations(m));
    double hard = 10.0 * STEPS * s.optimizer.learning_rate;
    assert_close("params", c->name, gp, model_params(m), np, hard);
    if (ns)
        assert_close("slots", c->name, gs, model_slots(m), np * (size_t)ns, 1e30);
    printf("  %-28s stats      loss_sum gpu %.6f cpu %.6f, correct gpu %ld cpu %ld, n %ld\n",
           c->name, gst.loss_sum, cpu_loss, gst.correct, cpu_correct, gst.n);
    ck_assert_int_eq(gst.n, cpu_n);
    ck_assert_msg(fabs(gst.loss_sum - cpu_loss) <= 1e-3 * fabs(cpu_loss) + 1e-4,
                  "%s: loss_sum gpu %g cpu %g", c->name, gst.loss_sum, cpu_loss);
    ck_assert_msg(labs(gst.correct - cpu_correct) <= 2, "%s: correct gpu %ld cpu %ld", c->name,
                  gst.correct, cpu_correct);
    free(x);
    free(y);
    free(gp);
    free(gs);
    free(gg);
    gpu_model_free(g);
    model_free(m);
}

/* ------------------------------------------------------------ tests */

START_TEST(device_info)
{
    if (!have_gpu("device_info"))
        return;
    int n = 0;
    char err[ERR_MAX] = "";
    ck_assert_int_eq(gpu_device_count(&n, err), 0);
    for (int i = 0; i < n; i++) {
        gpu_device_info d;
        ck_assert_msg(gpu_device_query(i, &d, err) == 0, "gpu_device_query: %s", err);
        printf("  device %d: %s, %.1f GiB (%.1f free), sm_%d%d, %d SMs, %s, %s, driver %d, "
               "runtime %d\n",
               i, d.name, d.total_bytes / 1073741824.0, d.free_bytes / 1073741824.0, d.cc_major,
               d.cc_minor, d.multiprocessors, d.pci_bus_id, d.uuid, d.driver_version,
               d.runtime_version);
        ck_assert(d.name[0] != 0);
        ck_assert(d.total_bytes > 0);
    }
    gpu_device_info d;
    ck_assert_int_eq(gpu_device_query(n + 7, &d, err), -1); /* a bad ordinal: an error text */
    ck_assert(err[0] != 0);
    printf("  bad ordinal -> %s\n", err);
}
END_TEST

START_TEST(layout_and_init_match_cpu)
{
    if (!have_gpu("layout_and_init_match_cpu"))
        return;
    for (int v = V_MLP; v <= V_REG; v++) {
        jobspec s;
        int classes;
        char err[ERR_MAX];
        make_spec(&s, (enum variant)v, OPT_ADAM, 1, &classes);
        model *m = cpu_build(&s, 9);
        gpu_model *g = gpu_build(&s, 9, 1, 0);
        ck_assert_int_eq(gpu_model_tensor_count(g), model_tensor_count(m));
        for (int i = 0; i < model_tensor_count(m); i++) {
            const model_tensor *a = gpu_model_tensor_at(g, i), *b = model_tensor_at(m, i);
            ck_assert_str_eq(a->name, b->name);
            ck_assert_uint_eq(a->offset, b->offset);
            ck_assert_uint_eq(a->size, b->size);
        }
        ck_assert_str_eq(gpu_model_signature(g), model_signature(m));
        size_t np = model_param_count(m);
        float *p = malloc(sizeof(float) * np);
        ck_assert_msg(gpu_model_get_params(g, p, NULL, err) == 0, "%s", err);
        ck_assert(memcmp(p, model_params(m), sizeof(float) * np) == 0); /* bit-identical */
        free(p);
        gpu_model_free(g);
        model_free(m);
    }
}
END_TEST

static const run_cfg CASES[] = {
    {"sgd_nodropout", V_MLP, OPT_SGD, 0.0f, 0, 0, 0, 0, 1, 0},
    {"sgd_nesterov_dropout", V_MLP, OPT_SGD, 0.9f, 1, 0, 0, 1, 1, 0},
    {"rmsprop_nodropout", V_MLP, OPT_RMSPROP, 0.0f, 0, 0, 0, 0, 1, 0},
    {"rmsprop_dropout", V_MLP, OPT_RMSPROP, 0.0f, 0, 0, 0, 1, 1, 0},
    {"rmsprop_dropout_nograph", V_MLP, OPT_RMSPROP, 0.0f, 0, 0, 0, 1, 0, 0},
    {"adam_nodropout", V_MLP, OPT_ADAM, 0.0f, 0, 0, 0, 0, 1, 0},
    {"adam_dropout", V_MLP, OPT_ADAM, 0.0f, 0, 0, 0, 1, 1, 0},
    {"adam_amsgrad_split", V_MLP, OPT_ADAM, 0.0f, 0, 0, 1, 1, 1, 1},
    {"adagrad_unfused_dropout", V_UNFUSED, OPT_ADAGRAD, 0.0f, 0, 0, 0, 1, 1, 0},
    {"rmsprop_centered_mom_unfused", V_UNFUSED, OPT_RMSPROP, 0.9f, 0, 1, 0, 1, 1, 1},
    {"sgd_momentum_reg_mse", V_REG, OPT_SGD, 0.9f, 0, 0, 0, 1, 1, 1},
    {"adam_reg_mse_nodropout", V_REG, OPT_ADAM, 0.0f, 0, 0, 0, 0, 1, 0},
};
#define N_CASES ((int)(sizeof CASES / sizeof CASES[0]))

START_TEST(train_matches_cpu)
{
    run_and_compare(&CASES[_i]);
}
END_TEST

START_TEST(checkpoint_roundtrip)
{
    if (!have_gpu("checkpoint_roundtrip"))
        return;
    jobspec s;
    int classes;
    char err[ERR_MAX];
    make_spec(&s, V_MLP, OPT_ADAM, 1, &classes);
    gpu_model *g = gpu_build(&s, 5, 1, 0);
    float *x = malloc(sizeof(float) * B * IN), *y = malloc(sizeof(float) * B);
    for (int step = 0; step < 3; step++) {
        make_data(x, y, B, classes, 50 + step);
        ck_assert_msg(gpu_model_load_batch(g, x, y, B, err) == 0, "%s", err);
        ck_assert_msg(gpu_model_train_step(g, B, err) == 0, "%s", err);
    }
    /* GPU -> CPU model (what checkpoint_save writes) -> a new GPU model */
    model *m = cpu_build(&s, 777);
    ck_assert_msg(gpu_model_to_host(g, m, err) == 0, "to_host: %s", err);
    ck_assert_int_eq(model_iterations(m), 3);
    gpu_model *g2 = gpu_build(&s, 888, 1, 0);
    ck_assert_msg(gpu_model_from_host(g2, m, err) == 0, "from_host: %s", err);
    ck_assert_int_eq(gpu_model_iterations(g2), 3);
    size_t np = gpu_model_param_count(g);
    int ns = gpu_model_slot_count(g);
    float *a = malloc(sizeof(float) * np * (1 + ns)), *b = malloc(sizeof(float) * np * (1 + ns));
    ck_assert(gpu_model_get_params(g, a, a + np, err) == 0);
    ck_assert(gpu_model_get_params(g2, b, b + np, err) == 0);
    ck_assert(memcmp(a, b, sizeof(float) * np * (1 + ns)) == 0);
    ck_assert(memcmp(a, model_params(m), sizeof(float) * np) == 0);
    /* the same next step (same masks: rng and iterations came along) */
    make_data(x, y, B, classes, 99);
    ck_assert(gpu_model_load_batch(g, x, y, B, err) == 0 && gpu_model_train_step(g, B, err) == 0);
    ck_assert(gpu_model_load_batch(g2, x, y, B, err) == 0 &&
              gpu_model_train_step(g2, B, err) == 0);
    ck_assert(gpu_model_get_params(g, a, NULL, err) == 0);
    ck_assert(gpu_model_get_params(g2, b, NULL, err) == 0);
    ck_assert_msg(memcmp(a, b, sizeof(float) * np) == 0, "resumed step differs");
    /* a model of another spec is refused with a message */
    jobspec o;
    make_spec(&o, V_REG, OPT_ADAM, 0, &classes);
    model *other = cpu_build(&o, 1);
    ck_assert_int_eq(gpu_model_to_host(g, other, err), -1);
    printf("  other spec -> %s\n", err);
    model_free(other);
    free(a);
    free(b);
    free(x);
    free(y);
    model_free(m);
    gpu_model_free(g);
    gpu_model_free(g2);
}
END_TEST

START_TEST(evaluate_and_predict_match_cpu)
{
    if (!have_gpu("evaluate_and_predict_match_cpu"))
        return;
    for (int v = V_MLP; v <= V_REG; v++) {
        jobspec s;
        int classes;
        char err[ERR_MAX];
        const long n = 3 * B + 17;
        make_spec(&s, (enum variant)v, OPT_RMSPROP, 1, &classes);
        model *m = cpu_build(&s, 3);
        gpu_model *g = gpu_build(&s, 3, 1, 0);
        float *x = malloc(sizeof(float) * n * IN), *y = malloc(sizeof(float) * n);
        int k = model_output_size(m);
        float *pc = malloc(sizeof(float) * n * k), *pg = malloc(sizeof(float) * n * k);
        make_data(x, y, (int)n, classes, 7);
        double lc, ac, lg, ag;
        model_evaluate(m, x, y, n, &lc, &ac);
        ck_assert_msg(gpu_model_evaluate(g, x, y, n, &lg, &ag, err) == 0, "%s", err);
        printf("  evaluate variant %d: loss gpu %.7f cpu %.7f, acc gpu %.4f cpu %.4f\n", v, lg,
               lc, ag, ac);
        ck_assert(fabs(lg - lc) <= 1e-4 * fabs(lc) + 1e-6);
        ck_assert(fabs(ag - ac) <= 2.0 / n);
        model_predict(m, x, n, pc);
        ck_assert_msg(gpu_model_predict(g, x, n, pg, err) == 0, "%s", err);
        assert_close("predict", "evaluate_and_predict", pg, pc, (size_t)n * k, 1e30);
        free(x);
        free(y);
        free(pc);
        free(pg);
        gpu_model_free(g);
        model_free(m);
    }
}
END_TEST

START_TEST(graph_equals_eager_and_tf32_learns)
{
    if (!have_gpu("graph_equals_eager_and_tf32_learns"))
        return;
    jobspec s;
    int classes;
    char err[ERR_MAX];
    make_spec(&s, V_MLP, OPT_RMSPROP, 1, &classes);
    gpu_model *ga = gpu_build(&s, 11, 1, 0), *gb = gpu_build(&s, 11, 0, 0);
    gpu_model *gt = gpu_build(&s, 11, 1, 1);
    float *x = malloc(sizeof(float) * B * IN), *y = malloc(sizeof(float) * B);
    step_stats first = {0, 0, 0}, last = {0, 0, 0};
    for (int step = 0; step < 40; step++) {
        make_data(x, y, B, classes, 300 + step % 8);
        ck_assert(gpu_model_load_batch(ga, x, y, B, err) == 0);
        ck_assert(gpu_model_train_step(ga, B, err) == 0);
        ck_assert(gpu_model_load_batch(gb, x, y, B, err) == 0);
        ck_assert(gpu_model_train_step(gb, B, err) == 0);
        ck_assert_msg(gpu_model_load_batch(gt, x, y, B, err) == 0, "%s", err);
        ck_assert_msg(gpu_model_train_step(gt, B, err) == 0, "%s", err);
        if (step == 7)
            ck_assert(gpu_model_stats(gt, &first, 1, err) == 0);
    }
    ck_assert(gpu_model_stats(gt, &last, 1, err) == 0);
    size_t np = gpu_model_param_count(ga);
    float *a = malloc(sizeof(float) * np), *b = malloc(sizeof(float) * np);
    ck_assert(gpu_model_get_params(ga, a, NULL, err) == 0);
    ck_assert(gpu_model_get_params(gb, b, NULL, err) == 0);
    assert_close("graph/eager", "graph_equals_eager", a, b, np, 1e-6);
    double l0 = first.loss_sum / first.n, l1 = last.loss_sum / last.n;
    printf("  tf32: mean loss of steps 0-7 %.4f, of steps 8-39 %.4f\n", l0, l1);
    ck_assert(isfinite(l1) && l1 < l0);
    free(a);
    free(b);
    free(x);
    free(y);
    gpu_model_free(ga);
    gpu_model_free(gb);
    gpu_model_free(gt);
}
END_TEST

START_TEST(errors_are_text)
{
    if (!have_gpu("errors_are_text"))
        return;
    jobspec s;
    int classes;
    char err[ERR_MAX] = "";
    gpu_model *g = NULL;
    make_spec(&s, V_MLP, OPT_SGD, 0, &classes);
    ck_assert_int_eq(gpu_model_build(&g, &s, 0, 1, NULL, err), -1);
    ck_assert_ptr_null(g);
    printf("  max_batch 0 -> %s\n", err);
    s.layers[0].units = 0;
    ck_assert_int_eq(gpu_model_build(&g, &s, B, 1, NULL, err), -1);
    printf("  units 0 -> %s\n", err);
    make_spec(&s, V_MLP, OPT_SGD, 0, &classes);
    {
        gpu_options o;
        gpu_options_default(&o);
        o.device = 4096;
        ck_assert_int_eq(gpu_model_build(&g, &s, B, 1, &o, err), -1);
        ck_assert_msg(strstr(err, "gpu_model.cu:") != NULL, "no file:line in '%s'", err);
        printf("  device 4096 -> %s\n", err);
    }
    g = gpu_build(&s, 1, 1, 0);
    ck_assert_int_eq(gpu_model_train_step(g, B, err), -1); /* nothing staged */
    printf("  step with no batch -> %s\n", err);
    float *x = calloc((size_t)B * IN, sizeof(float)), *y = calloc(B, sizeof(float));
    ck_assert_int_eq(gpu_model_load_batch(g, x, y, B + 1, err), -1);
    ck_assert_int_eq(gpu_model_load_batch(g, x, y, B, err), 0);
    ck_assert_int_eq(gpu_model_load_batch(g, x, y, B, err), 0);
    ck_assert_int_eq(gpu_model_load_batch(g, x, y, B, err), -1); /* both slots wait */
    printf("  third staged batch -> %s\n", err);
    ck_assert_int_eq(gpu_model_train_step(g, 0, err), -1);
    ck_assert_int_eq(gpu_model_train_step(g, B, err), 0);
    ck_assert_int_eq(gpu_model_train_step(g, B, err), 0);
    ck_assert_int_eq(gpu_model_sync(g, err), 0);
    free(x);
    free(y);
    gpu_model_free(g);
}
END_TEST

/* ------------------------------------------------------------ CNN */

typedef struct cnn_cfg {
    const char *name;
    enum cnn_variant v;
    opt_type opt;
    float momentum;
    int graph;
    int mode;       /* 0: train_step; 1: forward_backward + apply_gradients (the first
                     * gradients compared); 2: two micro-batches (forward_backward,
                     * forward_backward_add) + apply_gradients */
} cnn_cfg;

/* The moving statistics of both engines, compared. */
static void compare_state(const char *test, gpu_model *g, model *m, double hard)
{
    size_t ns = model_state_count(m);
    char err[ERR_MAX];
    ck_assert_uint_eq(gpu_model_state_count(g), ns);
    ck_assert_uint_gt(ns, 0);
    float *st = malloc(sizeof(float) * ns);
    ck_assert_msg(gpu_model_get_state(g, st, err) == 0, "get_state: %s", err);
    assert_close("state", test, st, model_state(m), ns, hard);
    free(st);
}

/* One step of both engines on x, y (n rows) as c->mode says. */
static void cnn_step(const cnn_cfg *c, model *m, gpu_model *g, const float *x, const float *y,
                     int n, int step, step_stats *st)
{
    char err[ERR_MAX];
    if (c->mode == 0) {
        model_train_step(m, x, y, n, n, st);
        ck_assert_msg(gpu_model_load_batch(g, x, y, n, err) == 0, "load_batch: %s", err);
        ck_assert_msg(gpu_model_train_step(g, n, err) == 0, "train_step: %s", err);
        return;
    }
    if (c->mode == 1) {
        model_forward_backward(m, x, y, n, n, st);
        ck_assert_msg(gpu_model_load_batch(g, x, y, n, err) == 0, "load_batch: %s", err);
        ck_assert_msg(gpu_model_forward_backward(g, n, err) == 0, "forward_backward: %s", err);
    } else {
        model_forward_backward_micro(m, x, y, n, 0, 2, n, st);
        for (int j = 0; j < 2; j++) {
            int off = 0, len = 0;
            model_micro_slice(n, 2, j, &off, &len);
            ck_assert_msg(gpu_model_load_batch(g, x + (size_t)off * IMG, y + off, len, err) == 0,
                          "load_batch: %s", err);
            ck_assert_msg(gpu_model_set_row_offset(g, off, err) == 0, "row offset: %s", err);
            ck_assert_msg((j == 0 ? gpu_model_forward_backward(g, n, err)
                                  : gpu_model_forward_backward_add(g, n, err)) == 0,
                          "micro-batch %d: %s", j, err);
        }
        ck_assert_msg(gpu_model_set_row_offset(g, 0, err) == 0, "row offset: %s", err);
    }
    if (step == 0) { /* the first gradients, before any update */
        size_t np = model_param_count(m);
        float *gg = malloc(sizeof(float) * np);
        ck_assert_msg(gpu_model_get_grads(g, gg, err) == 0, "get_grads: %s", err);
        assert_close("grads", c->name, gg, model_grads(m), np, 1e30);
        free(gg);
    }
    model_apply_gradients(m);
    ck_assert_msg(gpu_model_apply_gradients(g, err) == 0, "apply: %s", err);
}

/* STEPS steps of both engines (the last SHORT rows), then parameters,
 * slots, moving statistics and stats compared. */
static void cnn_run_and_compare(const cnn_cfg *c)
{
    if (!have_gpu(c->name))
        return;
    jobspec s;
    char err[ERR_MAX];
    make_cnn_spec(&s, c->v, c->opt);
    s.optimizer.momentum = c->momentum;
    model *m = cpu_build(&s, 21);
    gpu_model *g = gpu_build(&s, 21, c->graph, 0);
    size_t np = model_param_count(m);
    int ns = model_slot_count(m);
    ck_assert_uint_eq(gpu_model_param_count(g), np);
    float *x = malloc(sizeof(float) * B * IMG), *y = malloc(sizeof(float) * B);
    float *gp = malloc(sizeof(float) * np), *gs = malloc(sizeof(float) * (np * ns + 1));
    double cpu_loss = 0.0;
    long cpu_correct = 0, cpu_n = 0;
    for (int step = 0; step < STEPS; step++) {
        int n = step == STEPS - 1 ? SHORT : B;
        step_stats st;
        make_data_in(x, y, n, IMG, 10, 2000 + step);
        cnn_step(c, m, g, x, y, n, step, &st);
        cpu_loss += st.loss_sum;
        cpu_correct += st.correct;
        cpu_n += st.n;
    }
    step_stats gst;
    ck_assert_msg(gpu_model_stats(g, &gst, 1, err) == 0, "stats: %s", err);
    ck_assert_msg(gpu_model_get_params(g, gp, gs, err) == 0, "get_params: %s", err);
    ck_assert_int_eq(gpu_model_iterations(g), model_iterations(m));
    double hard = 10.0 * STEPS * s.optimizer.learning_rate;
    assert_close("params", c->name, gp, model_params(m), np, hard);
    if (ns)
        assert_close("slots", c->name, gs, model_slots(m), np * (size_t)ns, 1e30);
    compare_state(c->name, g, m, 1e-2);
    printf("  %-28s stats      loss_sum gpu %.6f cpu %.6f, correct gpu %ld cpu %ld, n %ld\n",
           c->name, gst.loss_sum, cpu_loss, gst.correct, cpu_correct, gst.n);
    ck_assert_int_eq(gst.n, cpu_n);
    ck_assert_msg(fabs(gst.loss_sum - cpu_loss) <= 1e-3 * fabs(cpu_loss) + 1e-4,
                  "%s: loss_sum gpu %g cpu %g", c->name, gst.loss_sum, cpu_loss);
    ck_assert_msg(labs(gst.correct - cpu_correct) <= 2, "%s: correct gpu %ld cpu %ld", c->name,
                  gst.correct, cpu_correct);
    free(x);
    free(y);
    free(gp);
    free(gs);
    gpu_model_free(g);
    model_free(m);
}

static const cnn_cfg CNN_CASES[] = {
    {"cnn_a_adam", CNN_A, OPT_ADAM, 0.0f, 1, 0},
    {"cnn_a_adam_nograph", CNN_A, OPT_ADAM, 0.0f, 0, 0},
    {"cnn_a_sgd_momentum_split", CNN_A, OPT_SGD, 0.9f, 1, 1},
    {"cnn_a_rmsprop_micro", CNN_A, OPT_RMSPROP, 0.0f, 0, 2},
    {"cnn_b_rmsprop", CNN_B, OPT_RMSPROP, 0.0f, 1, 0},
    {"cnn_b_adam_split", CNN_B, OPT_ADAM, 0.0f, 1, 1},
    {"cnn_b_sgd_micro", CNN_B, OPT_SGD, 0.0f, 1, 2},
};
#define N_CNN_CASES ((int)(sizeof CNN_CASES / sizeof CNN_CASES[0]))

START_TEST(cnn_train_matches_cpu)
{
    cnn_run_and_compare(&CNN_CASES[_i]);
}
END_TEST

START_TEST(cnn_layout_and_init_match_cpu)
{
    if (!have_gpu("cnn_layout_and_init_match_cpu"))
        return;
    for (int v = CNN_A; v <= CNN_B; v++) {
        jobspec s;
        char err[ERR_MAX];
        make_cnn_spec(&s, (enum cnn_variant)v, OPT_ADAM);
        model *m = cpu_build(&s, 9);
        gpu_model *g = gpu_build(&s, 9, 1, 0);
        ck_assert_int_eq(gpu_model_tensor_count(g), model_tensor_count(m));
        for (int i = 0; i < model_tensor_count(m); i++) {
            const model_tensor *a = gpu_model_tensor_at(g, i), *b = model_tensor_at(m, i);
            ck_assert_str_eq(a->name, b->name);
            ck_assert_uint_eq(a->offset, b->offset);
            ck_assert_uint_eq(a->size, b->size);
            ck_assert_int_eq(a->rank, b->rank);
            for (int d = 0; d < a->rank; d++)
                ck_assert_int_eq(a->shape[d], b->shape[d]);
        }
        ck_assert_int_eq(gpu_model_state_tensor_count(g), model_state_tensor_count(m));
        for (int i = 0; i < model_state_tensor_count(m); i++) {
            const model_tensor *a = gpu_model_state_tensor_at(g, i);
            const model_tensor *b = model_state_tensor_at(m, i);
            ck_assert_str_eq(a->name, b->name);
            ck_assert_uint_eq(a->offset, b->offset);
            ck_assert_uint_eq(a->size, b->size);
        }
        ck_assert_str_eq(gpu_model_signature(g), model_signature(m));
        size_t np = model_param_count(m), ns = model_state_count(m);
        float *p = malloc(sizeof(float) * np), *st = malloc(sizeof(float) * ns);
        ck_assert_msg(gpu_model_get_params(g, p, NULL, err) == 0, "%s", err);
        ck_assert(memcmp(p, model_params(m), sizeof(float) * np) == 0); /* bit-identical */
        ck_assert_msg(gpu_model_get_state(g, st, err) == 0, "%s", err);
        ck_assert(memcmp(st, model_state(m), sizeof(float) * ns) == 0); /* 0s and 1s */
        printf("  cnn variant %d: %d tensors, %zu params, %d state tensors (%zu floats)\n", v,
               model_tensor_count(m), np, model_state_tensor_count(m), ns);
        free(p);
        free(st);
        gpu_model_free(g);
        model_free(m);
    }
}
END_TEST

/* Three steps on both engines, then evaluate and predict (the moving
 * statistics, no dropout) compared; then the GPU model's checkpoint
 * (to_host) resumes in a new GPU model (from_host) bit-identically. */
START_TEST(cnn_evaluate_predict_and_checkpoint)
{
    if (!have_gpu("cnn_evaluate_predict_and_checkpoint"))
        return;
    for (int v = CNN_A; v <= CNN_B; v++) {
        jobspec s;
        char err[ERR_MAX];
        const long n = 2 * B + 9;
        make_cnn_spec(&s, (enum cnn_variant)v, OPT_RMSPROP);
        model *m = cpu_build(&s, 4);
        gpu_model *g = gpu_build(&s, 4, 1, 0);
        float *x = malloc(sizeof(float) * n * IMG), *y = malloc(sizeof(float) * n);
        for (int step = 0; step < 3; step++) {
            make_data_in(x, y, B, IMG, 10, 600 + step);
            model_train_step(m, x, y, B, B, NULL);
            ck_assert_msg(gpu_model_load_batch(g, x, y, B, err) == 0, "%s", err);
            ck_assert_msg(gpu_model_train_step(g, B, err) == 0, "%s", err);
        }
        compare_state("cnn_eval", g, m, 1e-2);
        int k = model_output_size(m);
        float *pc = malloc(sizeof(float) * n * k), *pg = malloc(sizeof(float) * n * k);
        make_data_in(x, y, (int)n, IMG, 10, 7);
        double lc, ac, lg, ag;
        model_evaluate(m, x, y, n, &lc, &ac);
        ck_assert_msg(gpu_model_evaluate(g, x, y, n, &lg, &ag, err) == 0, "%s", err);
        printf("  cnn evaluate variant %d: loss gpu %.7f cpu %.7f, acc gpu %.4f cpu %.4f\n", v,
               lg, lc, ag, ac);
        ck_assert(fabs(lg - lc) <= 1e-3 * fabs(lc) + 1e-6);
        ck_assert(fabs(ag - ac) <= 2.0 / n);
        model_predict(m, x, n, pc);
        ck_assert_msg(gpu_model_predict(g, x, n, pg, err) == 0, "%s", err);
        assert_close("predict", "cnn_predict", pg, pc, (size_t)n * k, 1e30);

        /* GPU -> CPU model -> a new GPU model: params, slots, state, the next step */
        model *h = cpu_build(&s, 777);
        ck_assert_msg(gpu_model_to_host(g, h, err) == 0, "to_host: %s", err);
        size_t np = gpu_model_param_count(g), nst = gpu_model_state_count(g);
        float *sa = malloc(sizeof(float) * nst), *sb = malloc(sizeof(float) * nst);
        ck_assert(gpu_model_get_state(g, sa, err) == 0);
        ck_assert(memcmp(sa, model_state(h), sizeof(float) * nst) == 0);
        gpu_model *g2 = gpu_build(&s, 888, 1, 0);
        ck_assert_msg(gpu_model_from_host(g2, h, err) == 0, "from_host: %s", err);
        ck_assert(gpu_model_get_state(g2, sb, err) == 0);
        ck_assert(memcmp(sa, sb, sizeof(float) * nst) == 0);
        double lg2, ag2;
        ck_assert(gpu_model_evaluate(g2, x, y, n, &lg2, &ag2, err) == 0);
        ck_assert_msg(lg2 == lg && ag2 == ag, "resumed evaluate differs: %.9g vs %.9g", lg2, lg);
        make_data_in(x, y, B, IMG, 10, 99);
        ck_assert(gpu_model_load_batch(g, x, y, B, err) == 0 && gpu_model_train_step(g, B, err) == 0);
        ck_assert(gpu_model_load_batch(g2, x, y, B, err) == 0 &&
                  gpu_model_train_step(g2, B, err) == 0);
        float *pa = malloc(sizeof(float) * np), *pb = malloc(sizeof(float) * np);
        ck_assert(gpu_model_get_params(g, pa, NULL, err) == 0);
        ck_assert(gpu_model_get_params(g2, pb, NULL, err) == 0);
        ck_assert_msg(memcmp(pa, pb, sizeof(float) * np) == 0, "resumed step differs");
        ck_assert(gpu_model_get_state(g, sa, err) == 0 && gpu_model_get_state(g2, sb, err) == 0);
        ck_assert_msg(memcmp(sa, sb, sizeof(float) * nst) == 0, "resumed moving statistics differ");
        free(pa);
        free(pb);
        free(sa);
        free(sb);
        gpu_model_free(g2);
        model_free(h);
        free(x);
        free(y);
        free(pc);
        free(pg);
        gpu_model_free(g);
        model_free(m);
    }
}
END_TEST

START_TEST(cnn_graph_equals_eager)
{
    if (!have_gpu("cnn_graph_equals_eager"))
        return;
    jobspec s;
    char err[ERR_MAX];
    make_cnn_spec(&s, CNN_A, OPT_ADAM);
    gpu_model *ga = gpu_build(&s, 13, 1, 0), *gb = gpu_build(&s, 13, 0, 0);
    float *x = malloc(sizeof(float) * B * IMG), *y = malloc(sizeof(float) * B);
    for (int step = 0; step < 10; step++) {
        make_data_in(x, y, B, IMG, 10, 400 + step % 4);
        ck_assert(gpu_model_load_batch(ga, x, y, B, err) == 0);
        ck_assert_msg(gpu_model_train_step(ga, B, err) == 0, "%s", err);
        ck_assert(gpu_model_load_batch(gb, x, y, B, err) == 0);
        ck_assert_msg(gpu_model_train_step(gb, B, err) == 0, "%s", err);
    }
    size_t np = gpu_model_param_count(ga), nst = gpu_model_state_count(ga);
    float *a = malloc(sizeof(float) * np), *b = malloc(sizeof(float) * np);
    ck_assert(gpu_model_get_params(ga, a, NULL, err) == 0);
    ck_assert(gpu_model_get_params(gb, b, NULL, err) == 0);
    assert_close("graph/eager", "cnn_graph_equals_eager", a, b, np, 1e-6);
    float *sa = malloc(sizeof(float) * nst), *sb = malloc(sizeof(float) * nst);
    ck_assert(gpu_model_get_state(ga, sa, err) == 0 && gpu_model_get_state(gb, sb, err) == 0);
    assert_close("state", "cnn_graph_equals_eager", sa, sb, nst, 1e-6);
    free(a);
    free(b);
    free(sa);
    free(sb);
    free(x);
    free(y);
    gpu_model_free(ga);
    gpu_model_free(gb);
}
END_TEST

static Suite *gpu_suite(void)
{
    Suite *s = suite_create("gpu");
    TCase *d = tcase_create("device");
    tcase_add_test(d, device_info);
    tcase_add_test(d, errors_are_text);
    suite_add_tcase(s, d);
    TCase *t = tcase_create("vs_cpu");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, layout_and_init_match_cpu);
    tcase_add_loop_test(t, train_matches_cpu, 0, N_CASES);
    tcase_add_test(t, checkpoint_roundtrip);
    tcase_add_test(t, evaluate_and_predict_match_cpu);
    tcase_add_test(t, graph_equals_eager_and_tf32_learns);
    suite_add_tcase(s, t);
    TCase *c = tcase_create("cnn_vs_cpu");
    tcase_set_timeout(c, 300);
    tcase_add_test(c, cnn_layout_and_init_match_cpu);
    tcase_add_loop_test(c, cnn_train_matches_cpu, 0, N_CNN_CASES);
    tcase_add_test(c, cnn_evaluate_predict_and_checkpoint);
    tcase_add_test(c, cnn_graph_equals_eager);
    suite_add_tcase(s, c);
    return s;
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    SRunner *sr = srunner_create(gpu_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
