/* dataset.h - in-memory data sets and the batches a replica trains on.
 *
 * Loaders (IDX for MNIST/Fashion-MNIST, gzip or not; CSV; synthetic) fill a
 * dataset of scaled float features and one float label per example. The
 * batcher walks a (sharded, shuffled) view of it and copies batches into
 * buffers the caller allocated once, so training steps never allocate.
 * Engine-independent: builds and tests with no server.
 *
 * defines: dataset_load, dataset_free, dataset_splits_free, dataset_shard,
 *          batcher_init, batcher_next, batcher_reset, batcher_release,
 *          batcher_seek, batch_replica_slice, the loaders (idx_load, idx_load_head, csv_load,
 *          synthetic_make). The data RNG is data_rng.h. See docs/data.md. */
#ifndef TRAINYARD_DATASET_H
#define TRAINYARD_DATASET_H

#include <stddef.h>
#include <stdint.h>
#include "../../common/errbuf.h"
#include "../../spec/jobspec.h"

typedef struct dataset {
    long n;              /* examples */
    int features;        /* floats per example */
    int classes;         /* label classes (10 for MNIST; 2 for binary); 0 = regression */
    float *x;            /* (n, features) scaled to [0,1] for image sources; owned */
    float *y;            /* (n) label: class index as float, or a target value; owned */
} dataset;

/* The splits a source provides: train (minus validation) , validation, test. */
typedef struct dataset_splits {
    dataset train;
    dataset val;         /* n == 0 when validation_split == 0 */
    dataset test;        /* n == 0 when the source has no test split */
} dataset_splits;

/* Load the data a spec names (data.source, path, limit, validation_split: the
 * last fraction of the training examples, before shuffling, as Keras does).
 * Returns 0, or -1 with a message in err (e.g. "train-images-idx3-ubyte.gz:
 * truncated: expected 47040000 bytes of pixels, got 1200") and nothing held. */
int dataset_load(const data_spec *spec, dataset_splits *out, char err[ERR_MAX]);

void dataset_free(dataset *ds);
void dataset_splits_free(dataset_splits *s);

/* A view of examples [begin, end) of a data set: no copy, no ownership. */
typedef struct dataset_view {
    const dataset *ds;
    long begin, end;
} dataset_view;

/* Shard i of n (each worker reads a distinct shard): contiguous, sizes differ
 * by at most one. */
dataset_view dataset_shard(const dataset *ds, int i, int n);

/* Batches over a view, shuffled with a buffer of shuffle_buffer examples
 * (0 = in order; >= view size = a full shuffle) from a seeded RNG; a new
 * order each epoch. Deterministic for a seed: a checkpoint can save the
 * batcher state (epoch, position, rng) and continue identically. */
typedef struct batcher {
    dataset_view view;
    int batch_size;
    int shuffle_buffer;
    uint64_t seed;
    uint64_t rng;        /* state, saved in checkpoints */
    long epoch;
    long pos;            /* examples handed out this epoch */
    long *order;         /* (view size) current permutation; owned */
} batcher;

int batcher_init(batcher *b, dataset_view view, int batch_size, int shuffle_buffer, uint64_t seed);

/* Start epoch `epoch` (computes its order from seed and epoch, so resuming
 * at an epoch boundary needs only the epoch number). */
void batcher_reset(batcher *b, long epoch);

/* Copy the next batch into x (batch_size, features) and y (batch_size);
 * returns the number of examples (the last batch of an epoch may be short),
 * 0 at the end of the epoch. */
int batcher_next(batcher *b, float *x, float *y);

/* The next batch of the same walk, of which only part `part` of `parts`
 * (batch_replica_slice of the batch's count) is copied into x and y: every
 * worker runs the same batcher and takes its own rows of each global batch.
 * *row0 gets the first copied row's index in the batch, *rows their count.
 * Returns the whole batch's count (0 at the end of the epoch). */
int batcher_next_part(batcher *b, int part, int parts, float *x, float *y, long *row0, int *rows);

/* Copies examples [start, start + count) of the current epoch's order into
 * x and y without moving the position (a parameter-server worker computes
 * the batch it was handed). Returns the number copied (clamped to the
 * epoch's end; 0 past it). */
int batcher_copy_range(const batcher *b, long start, int count, float *x, float *y);

void batcher_release(batcher *b);

/* A replica's slice of a batch of `count` examples: replica r of R gets a
 * contiguous slice; *off and *len are in examples. */
void batch_replica_slice(int count, int r, int R, int *off, int *len);

/* ---------------------------------------------------------------- additions */

/* Examples in a view. */
long dataset_view_size(dataset_view v);

/* Resume mid-epoch: batcher_reset(epoch), then skip the first pos examples
 * of that epoch's order (pos is clamped to the view size). A checkpoint needs
 * only (epoch, pos) to continue identically. */
void batcher_seek(batcher *b, long epoch, long pos);

/* Batches in one epoch of this batcher: ceil(view size / batch_size). */
long batcher_batches(const batcher *b);

/* The loaders dataset_load uses, for tests and tools. Each returns 0, or -1
 * with a message in err and *out zeroed (nothing held).
 *
 * idx_load: an IDX image file (magic 0x803, uint8, count x rows x cols) and
 * its label file (magic 0x801, count), gzip or raw. rows/cols must equal
 * want_rows/want_cols unless those are 0; labels must lie in [0, classes).
 * Pixels are scaled to [0,1]; features = rows*cols. */
int idx_load(const char *images_path, const char *labels_path, int want_rows, int want_cols,
             int classes, dataset *out, char err[ERR_MAX]);

/* idx_load_head: the same for the first `keep` examples only (all of them
 * when keep <= 0 or at least the count): every label is read and checked,
 * but only the kept images are inflated and scaled; the others are checked
 * by length, from the file's size (raw) or its gzip trailer (ISIZE, the
 * inflated size mod 2^32), and read through only when that differs (then
 * the errors are idx_load's: truncated, trailing data, corrupt stream). */
int idx_load_head(const char *images_path, const char *labels_path, int want_rows, int want_cols,
                  int classes, long keep, dataset *out, char err[ERR_MAX]);

/* csv_load: numeric CSV, one example a line; the label column is
 * label_column_name (needs header) when not "", else label_column (0-based,
 * -1 = last). Features are kept as they are (no scaling). classes = max
 * label + 1 when every label is a non-negative integer (< 65536), else 0. */
int csv_load(const char *path, int header, int label_column, const char *label_column_name,
             dataset *out, char err[ERR_MAX]);

#define CSV_MAX_BYTES (1L << 30)   /* 1 GiB file */
#define CSV_MAX_LINE (1L << 20)    /* 1 MiB line */
#define CSV_MAX_COLUMNS 65536
#define DATASET_MAX_FLOATS (1L << 30) /* 4 GiB of features */

/* synthetic_make: n examples of f features uniform in [0,1), label 0 or 1,
 * from data_rng.h seeded with seed; classes = 2. The first k examples do not
 * depend on n. */
int synthetic_make(long n, int f, uint64_t seed, dataset *out, char err[ERR_MAX]);

#endif
