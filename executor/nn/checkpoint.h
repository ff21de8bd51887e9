/* checkpoint.h - a model's full training state as a safetensors file:
 * 8-byte little-endian header length, a JSON header naming each tensor's
 * dtype ("F32"), shape and data_offsets, then the raw little-endian floats.
 *
 * Tensors: the weights ("dense_0.kernel", "conv2d_0.bias", ...), the
 * optimizer slots ("optimizer.dense_0.kernel.velocity", ...) and the
 * non-trainable state ("batch_normalization_0.moving_mean", ...). The header's
 * "__metadata__" (string values only) holds the model signature, optimizer,
 * iterations, dropout RNG state and the loop's position (ckpt_meta), so a
 * save + load + continue is bit-for-bit an uninterrupted run.
 *
 * defines: checkpoint_encode, checkpoint_decode, checkpoint_save,
 *          checkpoint_load */
#ifndef TRAINYARD_NN_CHECKPOINT_H
#define TRAINYARD_NN_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>
#include "../../common/errbuf.h"
#include "model.h"

#define CKPT_MAX_BYTES (4L << 30)       /* a file larger than this is refused */
#define CKPT_MAX_HEADER (64L << 20)

/* Where the training loop stood when the checkpoint was taken. */
typedef struct ckpt_meta {
    long epoch;               /* the epoch in progress (0-based) */
    long step;                /* training steps done in all */
    long batch_pos;           /* examples of `epoch` already trained on (0 = epoch start) */
    uint64_t data_rng;        /* the batcher's rng word */
    double epoch_loss_sum;    /* running metrics of `epoch` so far */
    long epoch_correct;
    long epoch_seen;
    char spec_hash[65];       /* caller's choice (sha256 of the spec); "" = none */
} ckpt_meta;

/* The file's bytes into a new heap buffer (*out, *len; the caller frees). */
int checkpoint_encode(const model *m, const ckpt_meta *meta, unsigned char **out, size_t *len,
                      char err[ERR_MAX]);

/* Validates every part of data (len bytes) against the model (signature,
 * names, dtypes, shapes, offsets inside the file) and only then copies the
 * weights, slots, iterations and RNG into m and fills *meta. Returns 0, or
 * -1 with a message in err and m untouched. */
int checkpoint_decode(const void *data, size_t len, model *m, ckpt_meta *meta,
                      char err[ERR_MAX]);

/* encode + an atomic durable write (tmp, fsync, rename) to path. */
int checkpoint_save(const char *path, const model *m, const ckpt_meta *meta, char err[ERR_MAX]);

/* read path (at most CKPT_MAX_BYTES) + decode. */
int checkpoint_load(const char *path, model *m, ckpt_meta *meta, char err[ERR_MAX]);

#endif
