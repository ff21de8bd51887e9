/* fuzz_checkpoint.c - libFuzzer target for executor/nn/checkpoint.c
 * (checkpoint_decode, the safetensors reader) against three small models, one
 * with adam's slots, one plain sgd, and a CNN with batch normalization's
 * moving statistics; the first input byte (mod 3) picks the model.
 * A decode that succeeds must encode back to a file that decodes again; one
 * that fails must leave the model untouched. With FUZZ_CKPT_SEEDS=DIR set,
 * the target writes valid checkpoints of both models there and exits (how
 * tests/fuzz/corpus/checkpoint was made). docs/reliability.md, "Fuzzing". */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spec/jobspec.h"
#include "executor/nn/checkpoint.h"
#include "executor/nn/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define N_MODELS 3
static const char *const SPECS[N_MODELS] = {
    "{\"model\":{\"layers\":[{\"type\":\"dense\",\"units\":3,\"activation\":\"relu\",\"input_shape\":[2]},"
    "{\"type\":\"dropout\",\"rate\":0.5},{\"type\":\"dense\",\"units\":2,\"activation\":\"softmax\"}]},"
    "\"compile\":{\"optimizer\":\"adam\",\"loss\":\"sparse_categorical_crossentropy\"},"
    "\"data\":{\"source\":\"synthetic\",\"features\":2}}",
    "{\"model\":{\"layers\":[{\"type\":\"dense\",\"units\":1,\"use_bias\":false,\"input_shape\":[3]}]},"
    "\"compile\":{\"optimizer\":\"sgd\",\"loss\":\"mse\"},\"data\":{\"source\":\"synthetic\",\"features\":3}}",
    "{\"model\":{\"layers\":[{\"type\":\"conv2d\",\"filters\":2,\"kernel_size\":2,\"input_shape\":[3,3,1]},"
    "{\"type\":\"batch_normalization\"},{\"type\":\"flatten\"},{\"type\":\"dense\",\"units\":2,\"activation\":\"softmax\"}]},"
    "\"compile\":{\"optimizer\":\"adam\",\"loss\":\"sparse_categorical_crossentropy\"},"
    "\"data\":{\"source\":\"synthetic\",\"features\":9}}",
};

static model *g_model[N_MODELS];
static unsigned char *g_snap[N_MODELS]; /* the pristine encoding, to check "untouched" */
static size_t g_snap_len[N_MODELS];
static ckpt_meta g_meta;         /* the metadata of the pristine encodings */

static void build(int i) {
    jobspec spec;
    spec_error e;
    char err[ERR_MAX];
    if (jobspec_parse(SPECS[i], strlen(SPECS[i]), &spec, &e) < 0) {
        fprintf(stderr, "fuzz_checkpoint: spec %d: %s\n", i, e.message);
        abort();
    }
    if (model_build(&g_model[i], &spec, 4, 7, err) < 0) {
        fprintf(stderr, "fuzz_checkpoint: model %d: %s\n", i, err);
        abort();
    }
    jobspec_release(&spec);
    memset(&g_meta, 0, sizeof g_meta);
    g_meta.epoch = 1;
    g_meta.step = 12;
    g_meta.batch_pos = 8;
    g_meta.data_rng = 0x0123456789abcdefULL;
    g_meta.epoch_loss_sum = 1.25;
    snprintf(g_meta.spec_hash, sizeof g_meta.spec_hash, "abc");
    char cerr[ERR_MAX];
    if (checkpoint_encode(g_model[i], &g_meta, &g_snap[i], &g_snap_len[i], cerr) < 0) abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    for (int i = 0; i < N_MODELS; i++) build(i);
    const char *dir = getenv("FUZZ_CKPT_SEEDS");
    if (dir && *dir) {
        static const char *const names[N_MODELS] = {"adam", "sgd", "cnn"};
        for (int i = 0; i < N_MODELS; i++) {
            char path[512];
            snprintf(path, sizeof path, "%s/valid_%s", dir, names[i]);
            FILE *f = fopen(path, "wb");
            if (!f || fputc(i, f) == EOF || fwrite(g_snap[i], 1, g_snap_len[i], f) != g_snap_len[i]) abort();
            fclose(f);
        }
        exit(0);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int i = data[0] % N_MODELS;
    model *m = g_model[i];
    ckpt_meta meta;
    char err[ERR_MAX];
    err[0] = '\0';
    /* a copy of exactly the input's bytes, so ASan sees any read past them */
    unsigned char *copy = malloc(size - 1 ? size - 1 : 1);
    if (!copy) abort();
    memcpy(copy, data + 1, size - 1);
    int rc = checkpoint_decode(copy, size - 1, m, &meta, err);
    free(copy);
    unsigned char *enc = NULL;
    size_t len = 0;
    char eerr[ERR_MAX];
    if (rc < 0) {
        if (!err[0]) abort();
        /* refused: the model must be as it was (same bytes when encoded) */
        if (checkpoint_encode(m, &g_meta, &enc, &len, eerr) < 0) abort();
        if (len != g_snap_len[i] || memcmp(enc, g_snap[i], len) != 0) {
            fprintf(stderr, "a refused checkpoint changed the model (%s)\n", err);
            abort();
        }
        free(enc);
        return 0;
    }
    /* accepted: encode and decode again, then restore the pristine model */
    if (checkpoint_encode(m, &meta, &enc, &len, eerr) < 0) abort();
    ckpt_meta meta2;
    if (checkpoint_decode(enc, len, m, &meta2, eerr) < 0) {
        fprintf(stderr, "re-encoded checkpoint refused: %s\n", eerr);
        abort();
    }
    if (meta2.epoch != meta.epoch || meta2.step != meta.step || meta2.data_rng != meta.data_rng) abort();
    free(enc);
    if (checkpoint_decode(g_snap[i], g_snap_len[i], m, NULL, eerr) < 0) abort();
    return 0;
}
