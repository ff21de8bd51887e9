/* batcher.c - batches over a data set view, shuffled with a tf.data-style
 * buffer. Each epoch's order is a function of (seed, epoch) alone, so a
 * checkpoint needs only (epoch, pos) to resume; batcher_next copies rows
 * into the caller's buffers and never allocates. */
#include "dataset.h"
#include "data_rng.h"

#include <stdlib.h>
#include <string.h>

#include "../../common/util.h"

int batcher_init(batcher *b, dataset_view view, int batch_size, int shuffle_buffer, uint64_t seed) {
    memset(b, 0, sizeof *b);
    if (!view.ds || batch_size <= 0 || view.begin < 0 || view.end < view.begin ||
        view.end > view.ds->n)
        return -1;
    long n = dataset_view_size(view);
    b->view = view;
    b->batch_size = batch_size;
    b->shuffle_buffer = shuffle_buffer;
    b->seed = seed;
    b->order = xmalloc((size_t)(n > 0 ? n : 1) * sizeof(long));
    batcher_reset(b, 0);
    return 0;
}

/* tf.data's shuffle buffer, in place: order[k..k+s) is the buffer (s = the
 * buffer size, shrinking once the input runs out); step k draws one of its
 * entries uniformly and moves it to k, and the input's next index, which
 * still sits at k+s untouched, joins the buffer. A buffer >= n is thus a
 * Fisher-Yates shuffle (a uniform permutation), 1 or 0 the input order. */
void batcher_reset(batcher *b, long epoch) {
    long n = dataset_view_size(b->view);
    b->epoch = epoch;
    b->pos = 0;
    for (long i = 0; i < n; i++) b->order[i] = b->view.begin + i;
    long bufsz = b->shuffle_buffer < 0 ? n : b->shuffle_buffer;
    uint64_t s = data_rng_seed2(b->seed, (uint64_t)epoch);
    if (bufsz > 1) {
        for (long k = 0; k + 1 < n; k++) {
            long size = n - k < bufsz ? n - k : bufsz;
            long i = k + (long)data_rng_below(&s, (uint64_t)size);
            long t = b->order[k];
            b->order[k] = b->order[i];
            b->order[i] = t;
        }
    }
    b->rng = s;
}

void batcher_seek(batcher *b, long epoch, long pos) {
    batcher_reset(b, epoch);
    long n = dataset_view_size(b->view);
    b->pos = pos < 0 ? 0 : pos > n ? n : pos;
}

long batcher_batches(const batcher *b) {
    long n = dataset_view_size(b->view);
    return (n + b->batch_size - 1) / b->batch_size;
}

int batcher_next(batcher *b, float *x, float *y) {
    long n = dataset_view_size(b->view);
    long left = n - b->pos;
    if (left <= 0) return 0;
    int count = left < b->batch_size ? (int)left : b->batch_size;
    const dataset *ds = b->view.ds;
    size_t f = (size_t)ds->features;
    const long *ord = b->order + b->pos;
    for (int i = 0; i < count; i++) {
        long e = ord[i];
        memcpy(x + (size_t)i * f, ds->x + (size_t)e * f, f * sizeof(float));
        y[i] = ds->y[e];
    }
    b->pos += count;
    return count;
}

int batcher_next_part(batcher *b, int part, int parts, float *x, float *y, long *row0, int *rows) {
    long n = dataset_view_size(b->view);
    long left = n - b->pos;
    *row0 = 0;
    *rows = 0;
    if (left <= 0 || parts <= 0 || part < 0 || part >= parts) return 0;
    int count = left < b->batch_size ? (int)left : b->batch_size;
    int off, len;
    batch_replica_slice(count, part, parts, &off, &len);
    const dataset *ds = b->view.ds;
    size_t f = (size_t)ds->features;
    const long *ord = b->order + b->pos + off;
    for (int i = 0; i < len; i++) {
        long e = ord[i];
        memcpy(x + (size_t)i * f, ds->x + (size_t)e * f, f * sizeof(float));
        y[i] = ds->y[e];
    }
    b->pos += count;
    *row0 = off;
    *rows = len;
    return count;
}

int batcher_copy_range(const batcher *b, long start, int count, float *x, float *y) {
    long n = dataset_view_size(b->view);
    if (start < 0 || start >= n || count <= 0) return 0;
    if (count > n - start) count = (int)(n - start);
    const dataset *ds = b->view.ds;
    size_t f = (size_t)ds->features;
    for (int i = 0; i < count; i++) {
        long e = b->order[start + i];
        memcpy(x + (size_t)i * f, ds->x + (size_t)e * f, f * sizeof(float));
        y[i] = ds->y[e];
    }
    return count;
}

void batcher_release(batcher *b) {
    if (!b) return;
    free(b->order);
    b->order = NULL;
}
