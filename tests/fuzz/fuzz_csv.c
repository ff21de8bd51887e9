/* fuzz_csv.c - libFuzzer target for executor/data/csv.c (csv_load). The
 * first byte picks the options (header or not; label column 0, 1, -1, -2,
 * 65535 or the header name "label"), the rest is the file, handed over as a
 * memfd path. An accepted file must give a consistent dataset.
 * docs/reliability.md, "Fuzzing". */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "executor/data/dataset.h"
#include "tests/fuzz/fuzz_memfile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static memfile g_file;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    if (g_file.path[0] == '\0') memfile_open(&g_file, "fuzz_csv");
    static const int cols[] = {-1, 0, 1, -2, 65535, -1};
    int header = data[0] & 1;
    int pick = (data[0] >> 1) % 6;
    const char *name = pick == 5 ? "label" : "";
    memfile_set(&g_file, data + 1, size - 1);
    dataset ds;
    char err[ERR_MAX];
    if (csv_load(g_file.path, header, cols[pick], name, &ds, err) == 0) {
        if (ds.n <= 0 || ds.features <= 0 || !ds.x || !ds.y || ds.classes < 0) abort();
        for (long i = 0; i < ds.n; i++) {
            if (!isfinite(ds.y[i])) abort();
            if (ds.classes > 0 && (ds.y[i] < 0 || ds.y[i] >= (float)ds.classes)) abort();
        }
        for (long i = 0; i < ds.n * ds.features; i++)
            if (!isfinite(ds.x[i])) abort();
        dataset_free(&ds);
    } else if (!err[0] || ds.x || ds.y) {
        abort();
    }
    return 0;
}
