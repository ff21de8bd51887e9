/* gpu_device.h - which CUDA devices this machine has: count, model name,
 * memory, compute capability, through the CUDA runtime. For the node agent's
 * device report (executor/agent.c is another module's: it calls these).
 *
 * Usable from C. In a build without CUDA (no TRAINYARD_CUDA) the functions
 * are inline stubs that report no device, so a caller needs no #ifdef.
 *
 * defines: gpu_device_count, gpu_device_query, gpu_device_info,
 *          gpu_built_with_cuda */
#ifndef TRAINYARD_GPU_DEVICE_H
#define TRAINYARD_GPU_DEVICE_H

#include <stddef.h>
#include <stdio.h>

#include "../../common/errbuf.h"

typedef struct gpu_device_info {
    int index;                 /* CUDA ordinal (after CUDA_VISIBLE_DEVICES) */
    char name[256];            /* "NVIDIA H100 80GB HBM3" */
    char pci_bus_id[32];       /* "0000:19:00.0" */
    char uuid[48];             /* "GPU-xxxxxxxx-..." (hex, as nvidia-smi -L) */
    size_t total_bytes;        /* device memory */
    size_t free_bytes;         /* free now (creates a context on the device) */
    int cc_major, cc_minor;    /* compute capability, 9.0 for Hopper */
    int multiprocessors;
    int driver_version;        /* e.g. 13000 for CUDA 13.0 */
    int runtime_version;
} gpu_device_info;

#ifdef __cplusplus
extern "C" {
#endif

#if defined(TRAINYARD_CUDA) || defined(__CUDACC__)

/* Number of CUDA devices visible to this process in *count. No driver, or
 * no device, is not an error: *count = 0 and the reason in err (when err is
 * not NULL), return 0. Returns -1 only for an unexpected runtime error. */
int gpu_device_count(int *count, char err[ERR_MAX]);

/* Fills *out for device `index`. Returns 0, or -1 with the reason in err. */
int gpu_device_query(int index, gpu_device_info *out, char err[ERR_MAX]);

/* 1: this build has the GPU engine (make CUDA=1). */
static inline int gpu_built_with_cuda(void) { return 1; }

#else /* built without CUDA */

static inline int gpu_device_count(int *count, char err[ERR_MAX])
{
    *count = 0;
    if (err)
        snprintf(err, ERR_MAX, "built without CUDA (make CUDA=1)");
    return 0;
}

static inline int gpu_device_query(int index, gpu_device_info *out, char err[ERR_MAX])
{
    (void)index;
    (void)out;
    if (err)
        snprintf(err, ERR_MAX, "built without CUDA (make CUDA=1)");
    return -1;
}

static inline int gpu_built_with_cuda(void) { return 0; }

#endif

#ifdef __cplusplus
}
#endif

#endif
