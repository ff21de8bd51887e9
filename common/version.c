/* version.c - what this binary was built with (see version.h). */
#include "version.h"

#include <openblas_config.h>
#include <stdio.h>
#include <string.h>

#ifdef TRAINYARD_CUDA
#include <cublas_api.h>
#include <cuda_runtime_api.h>
#endif
#ifdef TRAINYARD_NCCL
#include <nccl.h>
#endif

void trainyard_build(char *out, size_t outlen) {
    char blas[64];
    const char *v = OPENBLAS_VERSION; /* " OpenBLAS 0.3.21 " */
    while (*v == ' ') v++;
    snprintf(blas, sizeof blas, "%s", v);
    size_t n = strlen(blas);
    while (n && blas[n - 1] == ' ') blas[--n] = '\0';
#ifdef TRAINYARD_CUDA
#ifdef TRAINYARD_NCCL
    snprintf(out, outlen, "CUDA %d.%d, cuBLAS %d.%d.%d, NCCL %d.%d.%d; %s", CUDART_VERSION / 1000,
             (CUDART_VERSION % 1000) / 10, CUBLAS_VER_MAJOR, CUBLAS_VER_MINOR, CUBLAS_VER_PATCH, NCCL_MAJOR,
             NCCL_MINOR, NCCL_PATCH, blas);
#else
    snprintf(out, outlen, "CUDA %d.%d, cuBLAS %d.%d.%d, no NCCL; %s", CUDART_VERSION / 1000,
             (CUDART_VERSION % 1000) / 10, CUBLAS_VER_MAJOR, CUBLAS_VER_MINOR, CUBLAS_VER_PATCH, blas);
#endif
#else
    snprintf(out, outlen, "CPU build, no CUDA; %s", blas);
#endif
}
