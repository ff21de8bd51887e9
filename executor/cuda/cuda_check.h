/* cuda_check.h - checked CUDA, cuBLAS and NCCL calls for the .cu files of
 * executor/cuda: on failure the macro writes "file:line: call: reason" into
 * the function's `err` buffer (ERR_MAX bytes) and jumps to its `fail`
 * label, so the caller gets the error text back and the process (an agent's
 * worker) goes on; nothing here aborts.
 *
 *   int f(..., char err[ERR_MAX]) {
 *       cudaCheck(cudaMalloc(&p, n));
 *       cublasCheck(cublasSgemm(...));
 *       return 0;
 *   fail:
 *       return -1;
 *   }
 *
 * cudaCheckLast() checks the launch of the kernel just queued.
 * defines: cudaCheck, cudaCheckLast, cublasCheck, ncclCheck, gpu_errf */
#ifndef TRAINYARD_CUDA_CHECK_H
#define TRAINYARD_CUDA_CHECK_H

#include <stdarg.h>
#include <stdio.h>
#include <cuda_runtime.h>
#include <cublas_v2.h>

#include "../../common/errbuf.h"

/* Formats an error into err (may be NULL); returns -1. */
static inline int gpu_errf(char *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline int gpu_errf(char *err, const char *fmt, ...)
{
    if (!err)
        return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, ERR_MAX, fmt, ap);
    va_end(ap);
    return -1;
}

static inline const char *cublas_status_text(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "CUBLAS_STATUS_?";
    }
}

#define cudaCheck(call)                                                                   \
    do {                                                                                  \
        cudaError_t e_ = (call);                                                          \
        if (e_ != cudaSuccess) {                                                          \
            gpu_errf(err, "%s:%d: %s: %s (%s)", __FILE__, __LINE__, #call,                \
                     cudaGetErrorString(e_), cudaGetErrorName(e_));                       \
            goto fail;                                                                    \
        }                                                                                 \
    } while (0)

#define cudaCheckLast() cudaCheck(cudaGetLastError())

#define cublasCheck(call)                                                                 \
    do {                                                                                  \
        cublasStatus_t s_ = (call);                                                       \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                \
            gpu_errf(err, "%s:%d: %s: %s", __FILE__, __LINE__, #call,                     \
                     cublas_status_text(s_));                                             \
            goto fail;                                                                    \
        }                                                                                 \
    } while (0)

/* ncclCheck needs <nccl.h> before this header is included. */
#define ncclCheck(call)                                                                   \
    do {                                                                                  \
        ncclResult_t r_ = (call);                                                         \
        if (r_ != ncclSuccess) {                                                          \
            gpu_errf(err, "%s:%d: %s: %s", __FILE__, __LINE__, #call,                     \
                     ncclGetErrorString(r_));                                             \
            goto fail;                                                                    \
        }                                                                                 \
    } while (0)

#endif
