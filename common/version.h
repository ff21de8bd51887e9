/* version.h - the version of trainyard and what this binary was built with.
 *
 * defines: TRAINYARD_VERSION, trainyard_build */
#ifndef TRAINYARD_VERSION_H
#define TRAINYARD_VERSION_H

#include <stddef.h>

#define TRAINYARD_VERSION "0.3.0"

/* What the build carries, e.g. "CPU build; OpenBLAS 0.3.21" or "CUDA 13.0,
 * cuBLAS 13.1.0, NCCL 2.28.9; OpenBLAS 0.3.21" (the versions compiled
 * against). */
void trainyard_build(char *out, size_t outlen);

#endif
