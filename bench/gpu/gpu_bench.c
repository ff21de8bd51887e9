/* gpu_bench.c - the trainyard side of bench/gpu: one of two models trained
 * on one GPU (executor/cuda) the way the worker would: the data batcher
 * shuffles on the host and writes each batch straight into the model's
 * pinned staging slot, which is copied to the device while the previous
 * step runs; a full-batch step is one CUDA graph. The spec is built in C
 * (no spec parser: no cJSON; spec/shapes.c resolves its shapes).
 *
 *   --model mlp (default): the seed MLP, 784-256 relu dropout 0.4-128 relu
 *     dropout 0.3-10 softmax, categorical cross-entropy, RMSprop lr 0.001
 *     rho 0.9 eps 1e-7;
 *   --model cnn: the Fashion-MNIST CNN, 28x28x1 - conv2d 32 3x3 same relu -
 *     max_pooling2d 2 - conv2d 64 3x3 relu - max_pooling2d 2 - flatten -
 *     dense 128 relu - dropout 0.3 - dense 10 softmax, sparse categorical
 *     cross-entropy, Adam lr 0.001 eps 1e-7 (bench/gpu/torch_cnn_gpu.py's).
 *
 * usage: gpu_bench [--probe] [--model mlp|cnn] [--batch B] [--epochs E]
 *                  [--data DIR] [--seed S] [--tf32] [--no-graph]
 * Fashion-MNIST from DIR (default /usr/share/datasets/fashion-mnist), or
 * synthetic data of the same shape when it is not there. Epoch 1 is a
 * warm-up; epochs 2..E are timed (host batching + copies + steps, to the
 * last step's completion). Prints one JSON line. --probe prints the device
 * (exit 0) or "no CUDA device" (exit 3). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../../executor/cuda/gpu_device.h"
#include "../../executor/cuda/gpu_model.h"
#include "../../spec/shapes.h"
#include "../../executor/data/dataset.h"
#include "../../executor/nn/nn_rng.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void seed_mlp(jobspec *s, int batch, uint64_t seed)
{
    int units[5] = {256, 0, 128, 0, 10};
    float rate[5] = {0, 0.4f, 0, 0.3f, 0};
    memset(s, 0, sizeof *s);
    s->n_layers = 5;
    for (int i = 0; i < 5; i++) {
        layer_spec *l = &s->layers[i];
        l->type = units[i] ? LAYER_DENSE : LAYER_DROPOUT;
        l->units = units[i];
        l->activation = i == 4 ? ACT_SOFTMAX : ACT_RELU;
        l->use_bias = 1;
        l->kernel_initializer = INIT_GLOROT_UNIFORM;
        l->bias_initializer = INIT_ZEROS;
        l->rate = rate[i];
    }
    s->input_rank = 1;
    s->input_shape[0] = 784;
    s->input_size = 784;
    s->output_size = 10;
    s->optimizer.type = OPT_RMSPROP;
    s->optimizer.learning_rate = 0.001f;
    s->optimizer.rho = 0.9f;
    s->optimizer.epsilon = 1e-7f;
    s->loss = LOSS_CATEGORICAL_CROSSENTROPY;
    s->metric_accuracy = 1;
    s->data.source = DATA_FASHION_MNIST;
    s->data.shuffle_buffer = -1;
    s->data.seed = seed;
    s->fit.batch_size = batch;
}

static layer_spec *cnn_layer(jobspec *s, layer_type t, act_type act)
{
    layer_spec *l = &s->layers[s->n_layers++];
    memset(l, 0, sizeof *l);
    l->type = t;
    l->activation = act;
    l->use_bias = 1;
    l->kernel_initializer = INIT_GLOROT_UNIFORM;
    l->bias_initializer = INIT_ZEROS;
    return l;
}

/* The Fashion-MNIST CNN of examples/fashion_mnist_cnn.json (the first conv
 * pads "same", dropout 0.3). */
static int seed_cnn(jobspec *s, int batch, uint64_t seed)
{
    memset(s, 0, sizeof *s);
    for (int i = 0; i < 2; i++) {
        layer_spec *c = cnn_layer(s, LAYER_CONV2D, ACT_RELU);
        c->filters = i == 0 ? 32 : 64;
        c->kernel_size[0] = c->kernel_size[1] = 3;
        c->strides[0] = c->strides[1] = 1;
        c->padding = i == 0 ? PAD_SAME : PAD_VALID;
        layer_spec *p = cnn_layer(s, LAYER_MAX_POOLING2D, ACT_LINEAR);
        p->pool_size[0] = p->pool_size[1] = 2;
        p->strides[0] = p->strides[1] = 2;
        p->padding = PAD_VALID;
    }
    cnn_layer(s, LAYER_FLATTEN, ACT_LINEAR);
    cnn_layer(s, LAYER_DENSE, ACT_RELU)->units = 128;
    cnn_layer(s, LAYER_DROPOUT, ACT_LINEAR)->rate = 0.3f;
    cnn_layer(s, LAYER_DENSE, ACT_SOFTMAX)->units = 10;
    s->input_rank = 3;
    s->input_shape[0] = 28;
    s->input_shape[1] = 28;
    s->input_shape[2] = 1;
    s->optimizer.type = OPT_ADAM;
    s->optimizer.learning_rate = 0.001f;
    s->optimizer.beta_1 = 0.9f;
    s->optimizer.beta_2 = 0.999f;
    s->optimizer.epsilon = 1e-7f;
    s->loss = LOSS_SPARSE_CATEGORICAL_CROSSENTROPY;
    s->metric_accuracy = 1;
    s->data.source = DATA_FASHION_MNIST;
    s->data.shuffle_buffer = -1;
    s->data.seed = seed;
    s->fit.batch_size = batch;
    spec_error se;
    if (jobspec_resolve_shapes(s, &se)) {
        fprintf(stderr, "gpu_bench: cnn spec: %s: %s\n", se.field, se.message);
        return -1;
    }
    return 0;
}

/* n examples of 784 features in [0, 1) with labels 0..9 from a fixed random
 * linear map (learnable), when Fashion-MNIST is not on this machine. */
static int synthetic_split(dataset *d, long n, uint64_t seed)
{
    nn_rng r, t;
    static float w[784 * 10];
    d->n = n;
    d->features = 784;
    d->classes = 10;
    d->x = malloc(sizeof(float) * (size_t)n * 784);
    d->y = malloc(sizeof(float) * (size_t)n);
    if (!d->x || !d->y)
        return -1;
    nn_rng_seed(&t, 4242, 1);
    for (int i = 0; i < 784 * 10; i++)
        w[i] = (float)nn_rng_normal(&t);
    nn_rng_seed(&r, seed, 2);
    for (long i = 0; i < n; i++) {
        float *x = d->x + i * 784, best = -1e30f;
        int c = 0;
        for (int j = 0; j < 784; j++)
            x[j] = (float)nn_rng_uniform(&r);
        for (int k = 0; k < 10; k++) {
            float v = 0.0f;
            for (int j = 0; j < 784; j++)
                v += (x[j] - 0.5f) * w[j * 10 + k];
            if (v > best) {
                best = v;
                c = k;
            }
        }
        d->y[i] = (float)c;
    }
    return 0;
}

static int probe(void)
{
    int n = 0;
    char err[ERR_MAX] = "";
    if (gpu_device_count(&n, err) != 0 || n == 0) {
        printf("no CUDA device (%s)\n", err[0] ? err : "none found");
        return 3;
    }
    for (int i = 0; i < n; i++) {
        gpu_device_info d;
        if (gpu_device_query(i, &d, err) == 0)
            printf("device %d: %s, %.1f GiB, sm_%d%d, %d SMs, driver %d, runtime %d\n", i, d.name,
                   d.total_bytes / 1073741824.0, d.cc_major, d.cc_minor, d.multiprocessors,
                   d.driver_version, d.runtime_version);
        else
            printf("device %d: %s\n", i, err);
    }
    return 0;
}

int main(int argc, char **argv)
{
    int batch = 128, epochs = 4, tf32 = 0, graph = 1;
    uint64_t seed = 1;
    const char *dir = "/usr/share/datasets/fashion-mnist", *model_name = "mlp";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--probe"))
            return probe();
        else if (!strcmp(argv[i], "--model") && i + 1 < argc)
            model_name = argv[++i];
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc)
            batch = (int)strtol(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--epochs") && i + 1 < argc)
            epochs = (int)strtol(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--data") && i + 1 < argc)
            dir = argv[++i];
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--tf32"))
            tf32 = 1;
        else if (!strcmp(argv[i], "--no-graph"))
            graph = 0;
        else {
            fprintf(stderr, "usage: gpu_bench [--probe] [--model mlp|cnn] [--batch B] "
                            "[--epochs E] [--data DIR] [--seed S] [--tf32] [--no-graph]\n");
            return 2;
        }
    }
    int cnn = !strcmp(model_name, "cnn");
    if (!cnn && strcmp(model_name, "mlp")) {
        fprintf(stderr, "gpu_bench: --model mlp or cnn, got %s\n", model_name);
        return 2;
    }
    if (batch <= 0 || epochs < 2) {
        fprintf(stderr, "gpu_bench: --batch > 0 and --epochs >= 2 (epoch 1 is a warm-up)\n");
        return 2;
    }
    int ndev = 0;
    char err[ERR_MAX] = "";
    if (gpu_device_count(&ndev, err) != 0 || ndev == 0) {
        printf("{\"skipped\": \"no CUDA device\", \"reason\": \"%s\"}\n", err);
        return 3;
    }
    gpu_device_info dev;
    if (gpu_device_query(0, &dev, err)) {
        fprintf(stderr, "gpu_bench: %s\n", err);
        return 1;
    }

    /* data: Fashion-MNIST when there, else synthetic of its shape */
    jobspec s;
    if (cnn) {
        if (seed_cnn(&s, batch, seed))
            return 1;
    } else {
        seed_mlp(&s, batch, seed);
    }
    dataset_splits data;
    memset(&data, 0, sizeof data);
    char derr[ERR_MAX], path[1200];
    const char *source = "fashion-mnist";
    snprintf(path, sizeof path, "%s/train-images-idx3-ubyte.gz", dir);
    snprintf(s.data.path, sizeof s.data.path, "%s", dir);
    if (access(path, R_OK) != 0 || dataset_load(&s.data, &data, derr) != 0) {
        source = "synthetic"; /* a failed load holds nothing */
        memset(&data, 0, sizeof data);
        if (synthetic_split(&data.train, 60000, seed) || synthetic_split(&data.test, 10000, seed + 1)) {
            fprintf(stderr, "gpu_bench: out of memory\n");
            return 1;
        }
    }

    gpu_options o;
    gpu_options_default(&o);
    o.tf32 = tf32;
    o.cuda_graph = graph;
    gpu_model *g = NULL;
    if (gpu_model_build(&g, &s, batch, seed, &o, err)) {
        fprintf(stderr, "gpu_bench: %s\n", err);
        return 1;
    }
    batcher b;
    dataset_view view = dataset_shard(&data.train, 0, 1);
    if (batcher_init(&b, view, batch, (int)data.train.n, seed)) {
        fprintf(stderr, "gpu_bench: batcher_init failed\n");
        return 1;
    }
    double t0 = 0.0, train_s = 0.0;
    long timed = 0, steps = 0;
    step_stats st;
    int rc = 0;
    for (int e = 0; e < epochs && rc == 0; e++) {
        if (e == 1) { /* the warm-up epoch is done: start the clock */
            if (gpu_model_sync(g, err) || gpu_model_stats(g, NULL, 1, err)) {
                rc = 1;
                break;
            }
            t0 = now_s();
        }
        batcher_reset(&b, e);
        for (;;) {
            float *x, *y;
            if (gpu_model_stage_next(g, &x, &y, err)) {
                rc = 1;
                break;
            }
            int n = batcher_next(&b, x, y);
            if (n == 0)
                break; /* the slot stays open: stage_next hands it out again */
            if (gpu_model_stage_commit(g, n, err) || gpu_model_train_step(g, batch, err)) {
                rc = 1;
                break;
            }
            if (e > 0)
                timed += n;
            steps++;
        }
    }
    if (rc == 0 && gpu_model_stats(g, &st, 1, err) == 0) {
        train_s = now_s() - t0;
    } else {
        fprintf(stderr, "gpu_bench: %s\n", err);
        return 1;
    }
    double test_loss = 0.0, test_acc = 0.0;
    if (gpu_model_evaluate(g, data.test.x, data.test.y, data.test.n, &test_loss, &test_acc, err)) {
        fprintf(stderr, "gpu_bench: %s\n", err);
        return 1;
    }
    printf("{\"impl\": \"trainyard-cuda\", \"model\": \"%s\", \"device\": \"%s\", \"data\": \"%s\", "
           "\"batch\": %d, \"tf32\": %d, \"cuda_graph\": %d, \"epochs_timed\": %d, \"steps\": %ld, "
           "\"samples_per_sec\": %.1f, \"train_seconds\": %.4f, \"loss\": %.5f, "
           "\"accuracy\": %.5f, \"test_loss\": %.5f, \"test_accuracy\": %.5f}\n",
           model_name, dev.name, source, batch, tf32, graph, epochs - 1, steps, timed / train_s, train_s,
           st.n ? st.loss_sum / st.n : 0.0, st.n ? (double)st.correct / st.n : 0.0, test_loss,
           test_acc);
    batcher_release(&b);
    gpu_model_free(g);
    dataset_splits_free(&data);
    return 0;
}
