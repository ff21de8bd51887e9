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

extern "C" int gpu_nccl_unique_id(char hex[GPU_NCCL_ID_HEX], char err[ERR_MAX])
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

/* Frees k communicators made by init_local (aborting them: a failed init). */
static void abort_all(gpu_nccl **c, int k)
{
    for (int i = 0; i < k; i++) {
        if (!c[i])
            continue;
        if (c[i]->comm) {
            cudaSetDevice(c[i]->device);
            ncclCommAbort(c[i]->comm);
        }
        free(c[i]);
        c[i] = NULL;
    }
}

extern "C" int gpu_nccl_init_local(gpu_nccl **out, int k, const char *id_hex, int nranks,
                                   int first_rank, const int *devices, int timeout_s,
                                   char err[ERR_MAX])
{
    ncclUniqueId id;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    ncclResult_t r;
    int grouped = 0;
    if (k < 1)
        return gpu_errf(err, "gpu_nccl_init_local: %d local ranks", k);
    for (int i = 0; i < k; i++)
        out[i] = NULL;
    if (nranks < 1 || first_rank < 0 || first_rank + k > nranks)
        return gpu_errf(err, "gpu_nccl_init: ranks %d..%d of %d", first_rank, first_rank + k - 1,
                        nranks);
    if (!id_hex || strlen(id_hex) != 2 * GPU_NCCL_ID_BYTES)
        return gpu_errf(err, "gpu_nccl_init: the id must be %d hex digits",
                        2 * GPU_NCCL_ID_BYTES);
    for (int i = 0; i < GPU_NCCL_ID_BYTES; i++) {
        int hi = hex_val(id_hex[2 * i]), lo = hex_val(id_hex[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return gpu_errf(err, "gpu_nccl_init: the id has a non-hex digit at %d", 2 * i);
        id.internal[i] = (char)(hi << 4 | lo);
    }
    for (int i = 0; i < k; i++) {
        out[i] = (gpu_nccl *)calloc(1, sizeof *out[i]);
        if (!out[i]) {
            gpu_errf(err, "out of memory");
            goto fail;
        }
        out[i]->device = devices[i];
        out[i]->rank = first_rank + i;
        out[i]->nranks = nranks;
    }
    cfg.blocking = 0;
    ncclCheck(ncclGroupStart());
    grouped = 1;
    for (int i = 0; i < k; i++) {
        cudaCheck(cudaSetDevice(devices[i]));
        r = ncclCommInitRankConfig(&out[i]->comm, nranks, id, first_rank + i, &cfg);
        if (r != ncclSuccess && r != ncclInProgress) {
            gpu_errf(err, "%s:%d: ncclCommInitRankConfig (rank %d of %d, device %d): %s",
                     __FILE__, __LINE__, first_rank + i, nranks, devices[i],
                     ncclGetErrorString(r));
            goto fail;
        }
    }
    grouped = 0;
    r = ncclGroupEnd();
    if (r != ncclSuccess && r != ncclInProgress) {
        gpu_errf(err, "%s:%d: ncclGroupEnd (ncclCommInitRankConfig, ranks %d..%d of %d): %s",
                 __FILE__, __LINE__, first_rank, first_rank + k - 1, nranks,
                 ncclGetErrorString(r));
        goto fail;
    }
    for (int i = 0; i < k; i++)
        if (comm_wait(out[i], timeout_s > 0 ? timeout_s : 300, "ncclCommInitRankConfig", err))
            goto fail;
    return 0;
fail:
    if (grouped)
        ncclGroupEnd();
    abort_all(out, k);
    return -1;
}

extern "C" int gpu_nccl_init(gpu_nccl **out, const char *id_hex, int nranks, int rank, int device,
                             int timeout_s, char err[ERR_MAX])
{
    *out = NULL;
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return gpu_errf(err, "gpu_nccl_init: rank %d of %d", rank, nranks);
    return gpu_nccl_init_local(out, 1, id_hex, nranks, rank, &device, timeout_s, err);
}

/* Marks the k communicators broken (a call of the group failed). */
static void mark_broken(gpu_nccl **c, int k)
{
    for (int i = 0; i < k; i++)
        c[i]->broken = 1;
}

extern "C" int gpu_nccl_allreduce_local(gpu_nccl **c, int k, float **bufs, size_t count,
                                        size_t bucket_floats, void **streams,
                                        char err[ERR_MAX])
{
    ncclResult_t r;
    int grouped = 0;
    if (bucket_floats == 0)
        bucket_floats = GPU_NCCL_BUCKET_DEFAULT;
    ncclCheck(ncclGroupStart());
    grouped = 1;
    for (int i = 0; i < k; i++) {
        cudaCheck(cudaSetDevice(c[i]->device));
        for (size_t off = 0; off < count; off += bucket_floats) {
            size_t len = count - off < bucket_floats ? count - off : bucket_floats;
            r = ncclAllReduce(bufs[i] + off, bufs[i] + off, len, ncclFloat32, ncclSum,
                              c[i]->comm, (cudaStream_t)streams[i]);
            if (r != ncclSuccess && r != ncclInProgress) {
                gpu_errf(err, "%s:%d: ncclAllReduce(%zu floats at %zu, rank %d): %s", __FILE__,
                         __LINE__, len, off, c[i]->rank, ncclGetErrorString(r));
                goto fail;
            }
        }
    }
    grouped = 0;
    r = ncclGroupEnd();
    if (r != ncclSuccess && r != ncclInProgress) {
        gpu_errf(err, "%s:%d: ncclGroupEnd (ncclAllReduce): %s", __FILE__, __LINE__,
                 ncclGetErrorString(r));
        goto fail;
    }
    for (int i = 0; i < k; i++)
        if (comm_wait(c[i], 300, "ncclAllReduce", err))
            goto fail;
    return 0;
fail:
    if (grouped)
        ncclGroupEnd();
    mark_broken(c, k);
    return -1;
}

extern "C" int gpu_nccl_allreduce(gpu_nccl *c, float *buf, size_t count, size_t bucket_floats,
                                  void *stream, char err[ERR_MAX])
{
    return gpu_nccl_allreduce_local(&c, 1, &buf, count, bucket_floats, &stream, err);
}

extern "C" int gpu_nccl_broadcast_local(gpu_nccl **c, int k, float **bufs, size_t count,
                                        int root, void **streams, char err[ERR_MAX])
{
    ncclResult_t r;
    int grouped = 0;
    ncclCheck(ncclGroupStart());
    grouped = 1;
    for (int i = 0; i < k; i++) {
        cudaCheck(cudaSetDevice(c[i]->device));
        r = ncclBroadcast(bufs[i], bufs[i], count, ncclFloat32, root, c[i]->comm,
                          (cudaStream_t)streams[i]);
        if (r != ncclSuccess && r != ncclInProgress) {
            gpu_errf(err, "%s:%d: ncclBroadcast(%zu floats from %d, rank %d): %s", __FILE__,
                     __LINE__, count, root, c[i]->rank, ncclGetErrorString(r));
            goto fail;
        }
    }
    grouped = 0;
    r = ncclGroupEnd();
    if (r != ncclSuccess && r != ncclInProgress) {
        gpu_errf(err, "%s:%d: ncclGroupEnd (ncclBroadcast): %s", __FILE__, __LINE__,
                 ncclGetErrorString(r));
        goto fail;
    }
    for (int i = 0; i < k; i++)
        if (comm_wait(c[i], 300, "ncclBroadcast", err))
            goto fail;
    return 0;
fail:
    if (grouped)
        ncclGroupEnd();
    mark_broken(c, k);
    return -1;
}

extern "C" int gpu_nccl_broadcast(gpu_nccl *c, float *buf, size_t count, int root, void *stream,
                                  char err[ERR_MAX])
{
    return gpu_nccl_broadcast_local(&c, 1, &buf, count, root, &stream, err);
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

extern "C" int gpu_nccl_unique_id(char hex[GPU_NCCL_ID_HEX], char err[ERR_MAX])
{
    hex[0] = 0;
    return no_nccl(err);
}

extern "C" int gpu_nccl_init(gpu_nccl **out, const char *id_hex, int nranks, int rank, int device,
                             int timeout_s, char err[ERR_MAX])
{
    (void)id_hex; (void)nranks; (void)rank; (void)device; (void)timeout_s;
    *out = NULL;
    return no_nccl(err);
}

extern "C" int gpu_nccl_allreduce(gpu_nccl *c, float *buf, size_t count, size_t bucket_floats,
                                  void *stream, char err[ERR_MAX])
{
    (void)c; (void)buf; (void)count; (void)bucket_floats; (void)stream;
    return no_nccl(err);
}

extern "C" int gpu_nccl_broadcast(gpu_nccl *c, float *buf, size_t count, int root, void *stream,
                                  char err[ERR_MAX])
{
    (void)c; (void)buf; (void)count; (void)root; (void)stream;
    return no_nccl(err);
}

extern "C" int gpu_nccl_init_local(gpu_nccl **out, int k, const char *id_hex, int nranks,
                                   int first_rank, const int *devices, int timeout_s,
                                   char err[ERR_MAX])
{
    (void)id_hex; (void)nranks; (void)first_rank; (void)devices; (void)timeout_s;
    for (int i = 0; i < k; i++)
        out[i] = NULL;
    return no_nccl(err);
}

extern "C" int gpu_nccl_allreduce_local(gpu_nccl **c, int k, float **bufs, size_t count,
                                        size_t bucket_floats, void **streams,
                                        char err[ERR_MAX])
{
    (void)c; (void)k; (void)bufs; (void)count; (void)bucket_floats; (void)streams;
    return no_nccl(err);
}

extern "C" int gpu_nccl_broadcast_local(gpu_nccl **c, int k, float **bufs, size_t count,
                                        int root, void **streams, char err[ERR_MAX])
{
    (void)c; (void)k; (void)bufs; (void)count; (void)root; (void)streams;
    return no_nccl(err);
}

extern "C" void gpu_nccl_free(gpu_nccl *c) { (void)c; }

#endif
