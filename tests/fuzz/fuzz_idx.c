/* fuzz_idx.c - libFuzzer target for executor/data/idx.c (idx_load and
 * idx_load_head). The input is "options byte, images file, the separator
 * ---LABELS---, labels file" (without the separator the labels file is
 * empty); each file is a memfd path, so raw and gzip streams both go
 * through zlib as in training. The options byte picks the expected side
 * (0 = any, 28, 2), the classes (10, 2 or 0 = unchecked) and the examples
 * kept (all, 1, 2 or 5: idx_load_head, which checks the length of the rest
 * from the file's size or gzip trailer). docs/reliability.md, "Fuzzing". */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "executor/data/dataset.h"
#include "tests/fuzz/fuzz_memfile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static memfile g_img, g_lab;
static const char SEP[] = "---LABELS---";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    if (g_img.path[0] == '\0') {
        memfile_open(&g_img, "fuzz_idx_images");
        memfile_open(&g_lab, "fuzz_idx_labels");
    }
    static const int sides[] = {0, 28, 2, 0};
    static const int classes[] = {10, 2, 0, 10};
    int side = sides[data[0] & 3];
    int ncls = classes[(data[0] >> 2) & 3];
    static const long keeps[] = {0, 1, 2, 5};
    long keep = keeps[(data[0] >> 4) & 3];
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    const uint8_t *sep = memmem(p, n, SEP, sizeof SEP - 1);
    size_t ni = sep ? (size_t)(sep - p) : n;
    memfile_set(&g_img, p, ni);
    if (sep) memfile_set(&g_lab, sep + sizeof SEP - 1, n - ni - (sizeof SEP - 1));
    else memfile_set(&g_lab, "", 0);
    dataset ds;
    char err[ERR_MAX];
    int rc = keep ? idx_load_head(g_img.path, g_lab.path, side, side, ncls, keep, &ds, err)
                  : idx_load(g_img.path, g_lab.path, side, side, ncls, &ds, err);
    if (rc == 0) {
        if (ds.n <= 0 || ds.features <= 0 || !ds.x || !ds.y) abort();
        if (keep && ds.n > keep) abort();
        if (side && ds.features != side * side) abort();
        for (long i = 0; i < ds.n; i++)
            if (ncls && (ds.y[i] < 0 || ds.y[i] >= (float)ncls)) abort();
        for (long i = 0; i < ds.n * ds.features; i++)
            if (ds.x[i] < 0.0f || ds.x[i] > 1.0f) abort();
        dataset_free(&ds);
    } else if (!err[0] || ds.x || ds.y) {
        abort();
    }
    return 0;
}
