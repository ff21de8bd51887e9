/* nn_rng.h - the engine's random numbers: xoshiro256** seeded by splitmix64.
 *
 * Used for weight initialisation and dropout masks. Small, fast, the same
 * sequence on every platform; the 4-word state is saved in checkpoints so a
 * resumed run draws the same masks as an uninterrupted one.
 *
 * defines: nn_rng, nn_rng_seed, nn_rng_next, nn_rng_uniform, nn_rng_normal */
#ifndef TRAINYARD_NN_RNG_H
#define TRAINYARD_NN_RNG_H

#include <stdint.h>
#include <math.h>

typedef struct nn_rng {
    uint64_t s[4];
} nn_rng;

static inline uint64_t nn_splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Seeds from (seed, stream): distinct streams give independent sequences. */
static inline void nn_rng_seed(nn_rng *r, uint64_t seed, uint64_t stream)
{
    uint64_t x = seed ^ (stream * 0xd1b54a32d192ed03ULL);
    for (int i = 0; i < 4; i++)
        r->s[i] = nn_splitmix64(&x);
    if (!(r->s[0] | r->s[1] | r->s[2] | r->s[3]))
        r->s[0] = 1;
}

static inline uint64_t nn_rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static inline uint64_t nn_rng_next(nn_rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = nn_rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = nn_rotl(s[3], 45);
    return result;
}

/* Uniform in [0, 1) with 53 random bits. */
static inline double nn_rng_uniform(nn_rng *r)
{
    return (double)(nn_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

/* Standard normal (Box-Muller; one value per call, deterministic). */
static inline double nn_rng_normal(nn_rng *r)
{
    double u1 = nn_rng_uniform(r), u2 = nn_rng_uniform(r);
    if (u1 < 1e-300)
        u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* ---------------------------------------------------------------- dropout keys
 * Dropout masks are counter-based: the keep draw of unit j in row `row` of
 * a batch is a pure function of (seed, dropout layer, step, row), so a
 * global batch split over any number of replicas (each passing its rows'
 * global indexes) draws the same masks as one replica, and a resumed run
 * the same as an uninterrupted one. The GPU kernels compute the same. */

/* splitmix64's finaliser: a bijective 64-bit mix. */
static inline uint64_t nn_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* The key of one row: layer is the op index in the model, step the number
 * of optimizer updates done before this one, row the example's index in
 * the global batch. */
static inline uint64_t nn_dropout_row_key(uint64_t seed, int layer, long step, long row)
{
    uint64_t k = nn_mix64(seed ^ (0x5851f42d4c957f2dULL * (uint64_t)(layer + 1)));
    k = nn_mix64(k + (uint64_t)step);
    return nn_mix64(k + (uint64_t)row);
}

/* 32-bit uniform of unit j of a row: two units per 64-bit mix. */
static inline uint32_t nn_dropout_u32(uint64_t row_key, int j)
{
    uint64_t r = nn_mix64(row_key + (uint64_t)(j >> 1) * 0x9e3779b97f4a7c15ULL);
    return (j & 1) ? (uint32_t)(r >> 32) : (uint32_t)r;
}

#endif
