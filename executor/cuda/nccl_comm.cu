/* nccl_comm.cu - the NCCL helper (see nccl_comm.h). Built with NCCL when the
 * Makefile found it (TRAINYARD_NCCL) and <nccl.h> is there; otherwise every
 * call fails with "built without NCCL". */
#include "nccl_comm.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(TRAINYARD_NCCL) && __has_include(<nccl.h>)
#define HAVE_NCCL 1
#include <nccl.h>
#endif

#include "cuda_check.h"

#ifdef HAVE_NCCL

struct gpu_nccl {
    ncclComm_t comm;
    int device, rank, nranks;
    int broken;                 /* a call failed: abort instead of destroy */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Waits until the non-blocking communicator has finished its last call. */
static int comm_wait(gpu_nccl *c, double timeout_s, const char *what, char *err)
{
    double end = now_s() + timeout_s;
    ncclResult_t st = ncclInProgress;
    for (;;) {
        ncclResult_t r = ncclCommGetAsyncError(c->comm, &st);
        if (r != ncclSuccess) {
            c->broken = 1;
            return gpu_errf(err, "%s: ncclCommGetAsyncError: %s", what, ncclGetErrorString(r));
        }
        if (st != ncclInProgress)
            break;
        if (now_s() > end) {
            c->broken = 1;
            return gpu_errf(err, "%s: timed out after %.0f s (rank %d of %d)", what, timeout_s,
                            c->rank, c->nranks);
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    if (st != ncclSuccess) {
        c->broken = 1;
        return gpu_errf(err, "%s: %s (%s)", what, ncclGetErrorString(st),
                        ncclGetLastError(c->comm));
    }
    return 0;
}

extern "C" int gpu_nccl_unique_id(char hex[GPU_NCCL_ID_HEX], char err[GPU_ERR_MAX])
{
    static const char hx[] = "0123456789abcdef";
    ncclUniqueId id;
    hex[0] = 0;
    ncclCheck(ncclGetUniqueId(&id));
    for (int i = 0; i < GPU_NCCL_ID_BYTES; i++) {
        unsigned char b = (unsigned char)id.internal[i];
        hex[2 * i] = hx[b >> 4];
        hex[2 * i + 1] = hx[b & 15];
    }
    hex[2 * GPU_NCCL_ID_BYTES] = 0;
    return 0;
fail:
    return -1;
}

static int hex_val(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

extern "C" int gpu_nccl_init(gpu_nccl **out, const char *id_hex, int nranks, int rank, int device,
                             int timeout_s, char err[GPU_ERR_MAX])
{
    ncclUniqueId id;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    gpu_nccl *c = NULL;
    ncclResult_t r;
    *out = NULL;
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return gpu_errf(err, "gpu_nccl_init: rank %d of %d", rank, nranks);
    if (!id_hex || strlen(id_hex) != 2 * GPU_NCCL_ID_BYTES)
        return gpu_errf(err, "gpu_nccl_init: the id must be %d hex digits",
                        2 * GPU_NCCL_ID_BYTES);
    for (int i = 0; i < GPU_NCCL_ID_BYTES; i++) {
        int hi = hex_val(id_hex[2 * i]), lo = hex_val(id_hex[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return gpu_errf(err, "gpu_nccl_init: the id has a non-hex digit at %d", 2 * i);
        id.internal[i] = (char)(hi << 4 | lo);
    }
    c = (gpu_nccl *)calloc(1, sizeof *c);
    if (!c)
        return gpu_errf(err, "out of memory");
    c->device = device;
    c->rank = rank;
    c->nranks = nranks;
    cudaCheck(cudaSetDevice(device));
    cfg.blocking = 0;
    r = ncclCommInitRankConfig(&c->comm, nranks, id, rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        gpu_errf(err, "%s:%d: ncclCommInitRankConfig (rank %d of %d): %s", __FILE__, __LINE__,
                 rank, nranks, ncclGetErrorString(r));
        goto fail;
    }
    if (comm_wait(c, timeout_s > 0 ? timeout_s : 300, "ncclCommInitRankConfig", err))
        goto fail;
    *out = c;
    return 0;
fail:
    if (c && c->comm)
        ncclCommAbort(c->comm);
    free(c);
    return -1;
}

extern "C" int gpu_nccl_allreduce(gpu_nccl *c, float *buf, size_t count, size_t bucket_floats,
                                  void *stream, char err[GPU_ERR_MAX])
{
    ncclResult_t r;
    if (bucket_floats == 0)
        bucket_floats = GPU_NCCL_BUCKET_DEFAULT;
    cudaCheck(cudaSetDevice(c->device));
    ncclCheck(ncclGroupStart());
    for (size_t off = 0; off < count; off += bucket_floats) {
        size_t len = count - off < bucket_floats ? count - off : bucket_floats;
        r = ncclAllReduce(buf + off, buf + off, len, ncclFloat32, ncclSum, c->comm,
                          (cudaStream_t)stream);
        if (r != ncclSuccess && r != ncclInProgress) {
            ncclGroupEnd();
            gpu_errf(err, "%s:%d: ncclAllReduce(%zu floats at %zu): %s", __FILE__, __LINE__, len,
                     off, ncclGetErrorString(r));
            goto fail;
        }
    }
    r = ncclGroupEnd();
    if (r != ncclSuccess && r != ncclInProgress) {
        gpu_errf(err, "%s:%d: ncclGroupEnd: %s", __FILE__, __LINE__, ncclGetErrorString(r));
        goto fail;
    }
    return comm_wait(c, 300, "ncclAllReduce", err);
fail:
    c->broken = 1;
    return -1;
}

extern "C" int gpu_nccl_broadcast(gpu_nccl *c, float *buf, size_t count, int root, void *stream,
                                  char err[GPU_ERR_MAX])
{
    ncclResult_t r;
    cudaCheck(cudaSetDevice(c->device));
    r = ncclBroadcast(buf, buf, count, ncclFloat32, root, c->comm, (cudaStream_t)stream);
    if (r != ncclSuccess && r != ncclInProgress) {
        gpu_errf(err, "%s:%d: ncclBroadcast(%zu floats from %d): %s", __FILE__, __LINE__, count,
                 root, ncclGetErrorString(r));
        goto fail;
    }
    return comm_wait(c, 300, "ncclBroadcast", err);
fail:
    c->broken = 1;
    return -1;
}

extern "C" void gpu_nccl_free(gpu_nccl *c)
{
    if (!c)
        return;
    cudaSetDevice(c->device);
    if (c->broken)
        ncclCommAbort(c->comm);
    else
        ncclCommDestroy(c->comm);
    free(c);
}

#else /* no NCCL in this build */

struct gpu_nccl {
    int unused;
};

static int no_nccl(char *err)
{
    return gpu_errf(err, "built without NCCL (libnccl and nccl.h not found at build time)");
}

extern "C" int gpu_nccl_unique_id(char hex[GPU_NCCL_ID_HEX], char err[GPU_ERR_MAX])
{
    hex[0] = 0;
    return no_nccl(err);
}

extern "C" int gpu_nccl_init(gpu_nccl **out, const char *id_hex, int nranks, int rank, int device,
                             int timeout_s, char err[GPU_ERR_MAX])
{
    (void)id_hex; (void)nranks; (void)rank; (void)device; (void)timeout_s;
    *out = NULL;
    return no_nccl(err);
}

extern "C" int gpu_nccl_allreduce(gpu_nccl *c, float *buf, size_t count, size_t bucket_floats,
                                  void *stream, char err[GPU_ERR_MAX])
{
    (void)c; (void)buf; (void)count; (void)bucket_floats; (void)stream;
    return no_nccl(err);
}

extern "C" int gpu_nccl_broadcast(gpu_nccl *c, float *buf, size_t count, int root, void *stream,
                                  char err[GPU_ERR_MAX])
{
    (void)c; (void)buf; (void)count; (void)root; (void)stream;
    return no_nccl(err);
}

extern "C" void gpu_nccl_free(gpu_nccl *c) { (void)c; }

#endif
