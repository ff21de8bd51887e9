/* mlp_bench.c - the engine side of bench/train_vs_pytorch: the seed MLP
 * (784-256 relu-dropout 0.4-128 relu-dropout 0.3-10 softmax, RMSprop 0.001,
 * batch 128, categorical cross-entropy) on Fashion-MNIST through the same
 * train_run the worker and `trainyard train` use, built from a hand-made
 * spec so the bench does not depend on the spec parser.
 *
 * usage: mlp_bench EPOCHS SEED [DATA_DIR]; prints one JSON line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../executor/train_loop.h"

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: mlp_bench EPOCHS SEED [DATA_DIR]\n");
        return 2;
    }
    jobspec s;
    memset(&s, 0, sizeof s);
    s.n_layers = 5;
    int units[5] = {256, 0, 128, 0, 10};
    float rate[5] = {0, 0.4f, 0, 0.3f, 0};
    for (int i = 0; i < 5; i++) {
        layer_spec *l = &s.layers[i];
        l->type = units[i] ? LAYER_DENSE : LAYER_DROPOUT;
        l->units = units[i];
        l->activation = i == 4 ? ACT_SOFTMAX : ACT_RELU;
        l->use_bias = 1;
        l->kernel_initializer = INIT_GLOROT_UNIFORM;
        l->bias_initializer = INIT_ZEROS;
        l->rate = rate[i];
    }
    s.input_rank = 1;
    s.input_shape[0] = 784;
    s.input_size = 784;
    s.output_size = 10;
    s.optimizer.type = OPT_RMSPROP;
    s.optimizer.learning_rate = 0.001f;
    s.optimizer.rho = 0.9f;
    s.optimizer.epsilon = 1e-7f;
    s.loss = LOSS_CATEGORICAL_CROSSENTROPY;
    s.metric_accuracy = 1;
    s.data.source = DATA_FASHION_MNIST;
    if (argc > 3)
        snprintf(s.data.path, sizeof s.data.path, "%s", argv[3]);
    s.data.shuffle_buffer = -1;
    s.data.seed = strtoull(argv[2], NULL, 10);
    s.fit.epochs = atoi(argv[1]) > 0 ? atoi(argv[1]) : 1;
    s.fit.batch_size = 128;
    s.checkpoint.every_epochs = 0;
    train_options o;
    memset(&o, 0, sizeof o);
    o.threads = 1;
    o.checkpoint_every = -1;
    train_result r;
    char err[ERR_MAX];
    if (train_run(&s, &o, NULL, &r, err)) {
        fprintf(stderr, "mlp_bench: %s\n", err);
        return 1;
    }
    printf("{\"epochs\": %d, \"loss\": %.6f, \"accuracy\": %.6f, \"test_loss\": %.6f, "
           "\"test_accuracy\": %.6f, \"samples_per_sec\": %.1f, \"train_seconds\": %.3f}\n",
           r.epochs_done, r.loss, r.accuracy, r.test_loss, r.test_accuracy, r.samples_per_sec,
           r.train_seconds);
    return 0;
}
