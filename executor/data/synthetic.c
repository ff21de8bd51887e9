/* synthetic.c - the seed's classifier data: n examples of f features
 * uniform in [0,1) and a random binary label each, from the data RNG seeded
 * with data.seed. Same seed, same data, on every machine; example i does not
 * depend on n, so a limit keeps a prefix. */
#include "dataset.h"
#include "data_rng.h"

#include <stdio.h>
#include <string.h>

#include "../../common/util.h"

int synthetic_make(long n, int f, uint64_t seed, dataset *out, char err[ERR_MAX]) {
    memset(out, 0, sizeof *out);
    err[0] = '\0';
    if (n <= 0) {
        snprintf(err, ERR_MAX, "data.examples must be > 0, got %ld", n);
        return -1;
    }
    if (f <= 0) {
        snprintf(err, ERR_MAX, "data.features must be > 0, got %d", f);
        return -1;
    }
    if ((uint64_t)n * (uint64_t)f > (uint64_t)DATASET_MAX_FLOATS) {
        snprintf(err, ERR_MAX, "synthetic data too large: %ld examples x %d features", n, f);
        return -1;
    }
    float *x = xmalloc((size_t)n * (size_t)f * sizeof(float));
    float *y = xmalloc((size_t)n * sizeof(float));
    uint64_t s = data_rng_seed2(seed, 0x73796e7468ULL); /* "synth" */
    for (long i = 0; i < n; i++) {
        float *row = x + (size_t)i * (size_t)f;
        for (int j = 0; j < f; j++) row[j] = data_rng_float(&s);
        y[i] = (float)(data_rng_next(&s) >> 63);
    }
    out->n = n;
    out->features = f;
    out->classes = 2;
    out->x = x;
    out->y = y;
    return 0;
}
