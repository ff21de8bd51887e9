/* dataset.c - dataset_load: picks the loader a data spec names, applies
 * data.limit and validation_split, and hands back owned train/val/test sets.
 * Also shards and replica slices. The loaders live in idx.c,
 * csv.c and synthetic.c; the batcher in batcher.c. */
#include "dataset.h"

#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "../../common/util.h"

#define FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"
#define MNIST_CLASSES 10
#define MNIST_SIDE 28

/* ---------------------------------------------------------------- datasets */

void dataset_free(dataset *ds) {
    if (!ds) return;
    free(ds->x);
    free(ds->y);
    memset(ds, 0, sizeof *ds);
}

void dataset_splits_free(dataset_splits *s) {
    if (!s) return;
    dataset_free(&s->train);
    dataset_free(&s->val);
    dataset_free(&s->test);
}

/* Keep the first n examples, giving the rest of the memory back. */
static void dataset_truncate(dataset *ds, long n) {
    if (n >= ds->n) return;
    if (n <= 0) {
        free(ds->x);
        free(ds->y);
        ds->x = NULL;
        ds->y = NULL;
        ds->n = 0;
        return;
    }
    ds->x = xrealloc(ds->x, (size_t)n * (size_t)ds->features * sizeof(float));
    ds->y = xrealloc(ds->y, (size_t)n * sizeof(float));
    ds->n = n;
}

/* Moves examples [from, n) of src into a new dataset dst and truncates src. */
static void dataset_split_tail(dataset *src, long from, dataset *dst) {
    memset(dst, 0, sizeof *dst);
    dst->features = src->features;
    dst->classes = src->classes;
    long k = src->n - from;
    if (k > 0) {
        size_t f = (size_t)src->features;
        dst->x = xmalloc((size_t)k * f * sizeof(float));
        dst->y = xmalloc((size_t)k * sizeof(float));
        memcpy(dst->x, src->x + (size_t)from * f, (size_t)k * f * sizeof(float));
        memcpy(dst->y, src->y + from, (size_t)k * sizeof(float));
        dst->n = k;
    }
    dataset_truncate(src, from);
}

/* Training examples left by validation_split v, as Keras: floor(n * (1 - v)).
 * v comes from a float; rounding it to 7 digits first makes 0.1 mean 0.1
 * (60000 * 0.9 = 54000, not 53999). */
static long train_count(long n, float v) {
    double d = round((double)v * 1e7) / 1e7;
    return (long)floor((double)n * (1.0 - d) + 1e-9);
}

/* Looks for name, name.gz ("x-idx3-ubyte" and "x.idx3-ubyte" spellings) in dir. */
static int idx_find(const char *dir, const char *stem, const char *kind, char *out, size_t cap) {
    const char *forms[] = {"%s/%s-%s.gz", "%s/%s-%s", "%s/%s.%s.gz", "%s/%s.%s"};
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        if (sfmt(out, cap, forms[i], dir, stem, kind) < 0) continue;
        if (access(out, F_OK) == 0) return 0;
    }
    /* Not found: name the canonical file, so the loader's error says what is missing. */
    if (sfmt(out, cap, "%s/%s-%s.gz", dir, stem, kind) < 0) return -1;
    return 0;
}

/* The split's first keep examples (all when keep <= 0): data.limit's, so
 * the images past them are never inflated (idx_load_head). */
static int load_mnist_split(const char *dir, const char *stem, long keep, dataset *out,
                            char err[ERR_MAX]) {
    char img[JOBSPEC_PATH_MAX + 64], lab[JOBSPEC_PATH_MAX + 64];
    char istem[32], lstem[32];
    if (sfmt(istem, sizeof istem, "%s-images", stem) < 0 ||
        sfmt(lstem, sizeof lstem, "%s-labels", stem) < 0 ||
        idx_find(dir, istem, "idx3-ubyte", img, sizeof img) < 0 ||
        idx_find(dir, lstem, "idx1-ubyte", lab, sizeof lab) < 0) {
        snprintf(err, ERR_MAX, "data.path too long");
        return -1;
    }
    return idx_load_head(img, lab, MNIST_SIDE, MNIST_SIDE, MNIST_CLASSES, keep, out, err);
}

int dataset_load(const data_spec *spec, dataset_splits *out, char err[ERR_MAX]) {
    memset(out, 0, sizeof *out);
    err[0] = '\0';
    if (spec->validation_split < 0.0f || !(spec->validation_split < 1.0f)) {
        snprintf(err, ERR_MAX, "data.validation_split must be in [0, 1), got %g",
                 (double)spec->validation_split);
        return -1;
    }
    if (spec->limit < 0) {
        snprintf(err, ERR_MAX, "data.limit must be >= 0, got %ld", spec->limit);
        return -1;
    }
    switch (spec->source) {
    case DATA_FASHION_MNIST:
    case DATA_MNIST: {
        const char *dir = spec->path;
        if (dir[0] == '\0') {
            if (spec->source == DATA_MNIST) {
                snprintf(err, ERR_MAX,
                         "data.path is required for mnist (a directory holding "
                         "train-images-idx3-ubyte.gz etc.; no Debian package ships MNIST)");
                return -1;
            }
            dir = FASHION_MNIST_DIR;
        }
        if (load_mnist_split(dir, "train", spec->limit, &out->train, err) < 0) return -1;
        if (load_mnist_split(dir, "t10k", spec->limit, &out->test, err) < 0) {
            dataset_free(&out->train);
            return -1;
        }
        break;
    }
    case DATA_CSV:
        if (spec->path[0] == '\0') {
            snprintf(err, ERR_MAX, "data.path is required for csv");
            return -1;
        }
        if (csv_load(spec->path, spec->header, spec->label_column, spec->label_column_name,
                     &out->train, err) < 0)
            return -1;
        break;
    case DATA_SYNTHETIC: {
        long n = spec->examples;
        if (spec->limit > 0 && spec->limit < n) n = spec->limit;
        if (synthetic_make(n, spec->features, spec->seed, &out->train, err) < 0) return -1;
        break;
    }
    default:
        snprintf(err, ERR_MAX, "unknown data.source %d", (int)spec->source);
        return -1;
    }

    /* data.limit caps the training set and, independently, the test set. */
    if (spec->limit > 0) {
        dataset_truncate(&out->train, spec->limit);
        dataset_truncate(&out->test, spec->limit);
    }
    out->test.features = out->train.features;
    out->test.classes = out->train.classes;

    long keep = out->train.n;
    if (spec->validation_split > 0.0f) keep = train_count(out->train.n, spec->validation_split);
    if (keep <= 0) {
        snprintf(err, ERR_MAX,
                 "no training examples left: %ld examples with validation_split %g",
                 out->train.n, (double)spec->validation_split);
        dataset_splits_free(out);
        return -1;
    }
    dataset_split_tail(&out->train, keep, &out->val);
    return 0;
}

/* ---------------------------------------------------------------- shards */

long dataset_view_size(dataset_view v) {
    return v.end > v.begin ? v.end - v.begin : 0;
}

/* Part i of n of count items: contiguous, the first count % n parts one longer. */
static void split_even(long count, long i, long n, long *off, long *len) {
    if (n <= 0 || i < 0 || i >= n || count <= 0) {
        *off = 0;
        *len = 0;
        return;
    }
    long base = count / n, rem = count % n;
    *off = i * base + (i < rem ? i : rem);
    *len = base + (i < rem ? 1 : 0);
}

dataset_view dataset_shard(const dataset *ds, int i, int n) {
    long off, len;
    split_even(ds ? ds->n : 0, i, n, &off, &len);
    dataset_view v = {ds, off, off + len};
    return v;
}

void batch_replica_slice(int count, int r, int R, int *off, int *len) {
    long o, l;
    split_even(count, r, R, &o, &l);
    *off = (int)o;
    *len = (int)l;
}
