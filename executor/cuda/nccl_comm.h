/* nccl_comm.h - NCCL between replicas on GPUs (one rank per device): a
 * communicator from an ncclUniqueId passed as hex text (the chief makes one
 * with gpu_nccl_unique_id and publishes it through the API's rendezvous;
 * every rank calls gpu_nccl_init with it), an in-place sum all-reduce of the
 * flat gradient buffer in buckets, and a broadcast of the parameters.
 *
 * Collectives are queued on the caller's stream (gpu_model_stream()) and
 * return at once; synchronise the stream to wait. The communicator is made
 * non-blocking, so a rank that never joins gives an error after timeout_s
 * instead of hanging the worker. Usable from C; without CUDA/NCCL in the
 * build every call fails with a clear message.
 *
 * Several ranks in one process, driven by one thread (mirrored on K GPUs of
 * one worker, or a worker's K GPUs in a multi-worker job): the *_local
 * calls take the K communicators and issue their calls in one NCCL group,
 * as NCCL requires of a thread that drives several devices.
 *
 * defines: gpu_nccl_unique_id, gpu_nccl_init, gpu_nccl_init_local,
 *          gpu_nccl_allreduce, gpu_nccl_allreduce_local, gpu_nccl_broadcast,
 *          gpu_nccl_broadcast_local, gpu_nccl_free */
#ifndef TRAINYARD_NCCL_COMM_H
#define TRAINYARD_NCCL_COMM_H

#include <stddef.h>
#include <stdio.h>

#include "../../common/errbuf.h"
#define GPU_NCCL_ID_BYTES 128                       /* NCCL_UNIQUE_ID_BYTES */
#define GPU_NCCL_ID_HEX (2 * GPU_NCCL_ID_BYTES + 1) /* hex text + NUL */
#define GPU_NCCL_BUCKET_DEFAULT (4u << 20)          /* floats per bucket (16 MiB) */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gpu_nccl gpu_nccl;

#if defined(TRAINYARD_CUDA) || defined(__CUDACC__)

/* A new ncclUniqueId (ncclGetUniqueId: the chief's bootstrap address) as
 * 256 lowercase hex digits. Returns 0, or -1 with the reason in err. */
int gpu_nccl_unique_id(char hex[GPU_NCCL_ID_HEX], char err[ERR_MAX]);

/* Joins communicator `id_hex` as rank `rank` of `nranks` on CUDA device
 * `device`. Waits up to timeout_s (<= 0: 300) for every rank. */
int gpu_nccl_init(gpu_nccl **out, const char *id_hex, int nranks, int rank, int device,
                  int timeout_s, char err[ERR_MAX]);

/* Joins communicator `id_hex` as the k ranks first_rank..first_rank+k-1 of
 * nranks, rank first_rank+i on device devices[i], from this one thread (one
 * NCCL group). out[0..k-1] get the communicators (all or none). */
int gpu_nccl_init_local(gpu_nccl **out, int k, const char *id_hex, int nranks, int first_rank,
                        const int *devices, int timeout_s, char err[ERR_MAX]);

/* gpu_nccl_allreduce / gpu_nccl_broadcast of the k local ranks c[i], buffer
 * bufs[i] on stream streams[i], in one group. */
int gpu_nccl_allreduce_local(gpu_nccl **c, int k, float **bufs, size_t count,
                             size_t bucket_floats, void **streams, char err[ERR_MAX]);
int gpu_nccl_broadcast_local(gpu_nccl **c, int k, float **bufs, size_t count, int root,
                             void **streams, char err[ERR_MAX]);

/* In place: buf (count floats, device) becomes the sum over the ranks, as
 * ncclAllReduce(ncclSum) calls of bucket_floats each (0: default) in one
 * group, queued on stream (a cudaStream_t). */
int gpu_nccl_allreduce(gpu_nccl *c, float *buf, size_t count, size_t bucket_floats,
                       void *stream, char err[ERR_MAX]);

/* buf (count floats, device) of rank root to every rank, on stream. */
int gpu_nccl_broadcast(gpu_nccl *c, float *buf, size_t count, int root, void *stream,
                       char err[ERR_MAX]);

/* Destroys the communicator (aborts it when a collective failed). */
void gpu_nccl_free(gpu_nccl *c);

#else /* built without CUDA */

static inline int gpu_nccl_no_cuda(char *err)
{
    if (err)
        snprintf(err, ERR_MAX, "built without CUDA (make CUDA=1)");
    return -1;
}
static inline int gpu_nccl_unique_id(char hex[GPU_NCCL_ID_HEX], char err[ERR_MAX])
{ hex[0] = 0; return gpu_nccl_no_cuda(err); }
static inline int gpu_nccl_init(gpu_nccl **out, const char *id_hex, int nranks, int rank,
                                int device, int timeout_s, char err[ERR_MAX])
{ (void)id_hex; (void)nranks; (void)rank; (void)device; (void)timeout_s; *out = NULL;
  return gpu_nccl_no_cuda(err); }
static inline int gpu_nccl_allreduce(gpu_nccl *c, float *data, size_t count, size_t bucket,
                                     void *stream, char err[ERR_MAX])
{ (void)c; (void)data; (void)count; (void)bucket; (void)stream; return gpu_nccl_no_cuda(err); }
static inline int gpu_nccl_broadcast(gpu_nccl *c, float *data, size_t count, int root,
                                     void *stream, char err[ERR_MAX])
{ (void)c; (void)data; (void)count; (void)root; (void)stream; return gpu_nccl_no_cuda(err); }
static inline int gpu_nccl_init_local(gpu_nccl **out, int k, const char *id_hex, int nranks,
                                      int first_rank, const int *devices, int timeout_s,
                                      char err[ERR_MAX])
{ (void)id_hex; (void)nranks; (void)first_rank; (void)devices; (void)timeout_s;
  for (int i = 0; i < k; i++) out[i] = NULL;
  return gpu_nccl_no_cuda(err); }
static inline int gpu_nccl_allreduce_local(gpu_nccl **c, int k, float **bufs, size_t count,
                                           size_t bucket, void **streams, char err[ERR_MAX])
{ (void)c; (void)k; (void)bufs; (void)count; (void)bucket; (void)streams;
  return gpu_nccl_no_cuda(err); }
static inline int gpu_nccl_broadcast_local(gpu_nccl **c, int k, float **bufs, size_t count,
                                           int root, void **streams, char err[ERR_MAX])
{ (void)c; (void)k; (void)bufs; (void)count; (void)root; (void)streams;
  return gpu_nccl_no_cuda(err); }
static inline void gpu_nccl_free(gpu_nccl *c) { (void)c; }

#endif

#ifdef __cplusplus
}
#endif

#endif
