/* data_rng.h - the data's random numbers (splitmix64): the batcher's
 * shuffle of each epoch and the synthetic source's examples. One word of
 * state and the same sequence on every platform, so a seed gives the same
 * data and the same order on any machine. Below every file of data/, which
 * all may include it.
 *
 * defines: data_rng_next, data_rng_below, data_rng_float, data_rng_seed2 */
#ifndef TRAINYARD_DATA_RNG_H
#define TRAINYARD_DATA_RNG_H

#include <stdint.h>

/* The next word (splitmix64): the same sequence on every platform. */
static inline uint64_t data_rng_next(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Uniform in [0, n), n > 0, without modulo bias. */
static inline uint64_t data_rng_below(uint64_t *state, uint64_t n) {
    /* Lemire's multiply-shift with rejection: exact uniformity */
    uint64_t x = data_rng_next(state);
    __uint128_t m = (__uint128_t)x * n;
    uint64_t lo = (uint64_t)m;
    if (lo < n) {
        uint64_t t = (0 - n) % n;
        while (lo < t) {
            x = data_rng_next(state);
            m = (__uint128_t)x * n;
            lo = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
}

/* Uniform float in [0,1) with 24 random bits. */
static inline float data_rng_float(uint64_t *state) {
    return (float)(data_rng_next(state) >> 40) * (1.0f / 16777216.0f);
}

/* A well-mixed state from two words (seed, epoch). */
static inline uint64_t data_rng_seed2(uint64_t a, uint64_t b) {
    uint64_t s = a;
    uint64_t h = data_rng_next(&s);
    s = h ^ (b * 0xd6e8feb86659fd93ULL);
    return data_rng_next(&s);
}

#endif
