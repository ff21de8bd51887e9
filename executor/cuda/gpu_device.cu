/* gpu_device.cu - CUDA device discovery (see gpu_device.h). */
#include "gpu_device.h"

#include <string.h>

#include "cuda_check.h"

extern "C" int gpu_device_count(int *count, char err[ERR_MAX])
{
    *count = 0;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ||
        e == cudaErrorInitializationError || e == cudaErrorSystemDriverMismatch ||
        e == cudaErrorCompatNotSupportedOnDevice) {
        gpu_errf(err, "cudaGetDeviceCount: %s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
        cudaGetLastError(); /* clear the (non-sticky) error */
        return 0;
    }
    if (e != cudaSuccess) {
        gpu_errf(err, "%s:%d: cudaGetDeviceCount: %s (%s)", __FILE__, __LINE__,
                 cudaGetErrorString(e), cudaGetErrorName(e));
        cudaGetLastError();
        return -1;
    }
    *count = n;
    if (n == 0)
        gpu_errf(err, "cudaGetDeviceCount found 0 devices");
    return 0;
}

extern "C" int gpu_device_query(int index, gpu_device_info *out, char err[ERR_MAX])
{
    cudaDeviceProp p;
    int prev = 0;
    size_t fr = 0, tot = 0;
    memset(out, 0, sizeof *out);
    out->index = index;
    cudaCheck(cudaGetDeviceProperties(&p, index));
    snprintf(out->name, sizeof out->name, "%s", p.name);
    cudaCheck(cudaDeviceGetPCIBusId(out->pci_bus_id, (int)sizeof out->pci_bus_id, index));
    {
        static const char hx[] = "0123456789abcdef";
        char *u = out->uuid;
        const unsigned char *b = (const unsigned char *)p.uuid.bytes;
        int k = 0;
        memcpy(u, "GPU-", 4);
        k = 4;
        for (int i = 0; i < 16; i++) {
            if (i == 4 || i == 6 || i == 8 || i == 10)
                u[k++] = '-';
            u[k++] = hx[b[i] >> 4];
            u[k++] = hx[b[i] & 15];
        }
        u[k] = 0;
    }
    out->total_bytes = p.totalGlobalMem;
    out->cc_major = p.major;
    out->cc_minor = p.minor;
    out->multiprocessors = p.multiProcessorCount;
    cudaCheck(cudaDriverGetVersion(&out->driver_version));
    cudaCheck(cudaRuntimeGetVersion(&out->runtime_version));
    cudaCheck(cudaGetDevice(&prev));
    cudaCheck(cudaSetDevice(index));
    cudaCheck(cudaMemGetInfo(&fr, &tot));
    out->free_bytes = fr;
    cudaCheck(cudaSetDevice(prev));
    return 0;
fail:
    return -1;
}
