/* emu.cpp - bench/gpu/emu's host CUDA runtime and cuBLAS (see
 * include/cuda_runtime.h), and gpu_device.h's two calls (one emulated
 * device). Single-threaded; every queued operation runs at once unless its
 * stream is being captured. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include <string>
#include <vector>

#include "cublas_v2.h"
#include "cuda_runtime.h"

extern "C" {
#include "../../../executor/cuda/gpu_device.h"
}

dim3 blockIdx, threadIdx, blockDim, gridDim;

struct emu_stream { int id; };
struct emu_event { int id; };
struct emu_graph { std::vector<std::function<void()>> ops; };
struct emu_blas { cudaStream_t stream; };

static cudaStream_t capturing = NULL;
static emu_graph *capture_graph = NULL;

void emu_submit(cudaStream_t s, std::function<void()> op)
{
    if (capturing && s == capturing)
        capture_graph->ops.push_back(op);
    else
        op();
}

/* ------------------------------------------------------------ kernels */

#define MAX_THREADS 1024
#define STACK_BYTES (256 * 1024)

static ucontext_t sched_ctx, thread_ctx[MAX_THREADS];
static char *stacks[MAX_THREADS];
static int running = -1;
static const std::function<void()> *co_body;
static int co_done[MAX_THREADS];
static int in_coop = 0;

static void co_trampoline(int i)
{
    (*co_body)();
    co_done[i] = 1;
}

void __syncthreads(void)
{
    if (!in_coop) {
        fprintf(stderr, "emu: __syncthreads in a kernel not run as coroutines\n");
        abort();
    }
    swapcontext(&thread_ctx[running], &sched_ctx);
}

double atomicAdd(double *p, double v)
{
    double o = *p;
    *p = o + v;
    return o;
}

float atomicAdd(float *p, float v)
{
    float o = *p;
    *p = o + v;
    return o;
}

/* the kernels whose blocks synchronise: their threads run as coroutines */
static int cooperative(const char *name)
{
    static const char *names[] = {"k_reduce_stats", "k_regularize", "k_bias_grad",
                                  "k_chan_partial", NULL};
    for (int i = 0; names[i]; i++)
        if (!strcmp(name, names[i]))
            return 1;
    return 0;
}

static void init_thread(int i)
{
    if (!stacks[i])
        stacks[i] = (char *)malloc(STACK_BYTES);
    getcontext(&thread_ctx[i]);
    thread_ctx[i].uc_stack.ss_sp = stacks[i];
    thread_ctx[i].uc_stack.ss_size = STACK_BYTES;
    thread_ctx[i].uc_link = &sched_ctx;
    makecontext(&thread_ctx[i], (void (*)(void))co_trampoline, 1, i);
    co_done[i] = 0;
}

static void run_block_coop(const std::function<void()> &body, int t)
{
    co_body = &body;
    in_coop = 1;
    for (int i = 0; i < t; i++)
        init_thread(i);
    for (int left = t; left > 0;) {
        left = 0;
        for (int i = 0; i < t; i++) {
            if (co_done[i])
                continue;
            running = i;
            threadIdx = dim3(i % blockDim.x, (i / blockDim.x) % blockDim.y,
                             i / (blockDim.x * blockDim.y));
            swapcontext(&sched_ctx, &thread_ctx[i]);
            if (!co_done[i])
                left++;
        }
    }
    in_coop = 0;
    running = -1;
}

void emu_launch(const char *name, emu_cfg c, std::function<void()> body)
{
    int coop = cooperative(name);
    std::string nm(name);
    emu_submit(c.stream, [c, body, coop, nm]() {
        int t = (int)(c.block.x * c.block.y * c.block.z);
        if (t > MAX_THREADS || t < 1 || c.grid.x < 1 || c.grid.y < 1 || c.grid.z < 1) {
            fprintf(stderr, "emu: launch of %s with a bad configuration\n", nm.c_str());
            abort();
        }
        gridDim = c.grid;
        blockDim = c.block;
        for (unsigned bz = 0; bz < c.grid.z; bz++)
            for (unsigned by = 0; by < c.grid.y; by++)
                for (unsigned bx = 0; bx < c.grid.x; bx++) {
                    blockIdx = dim3(bx, by, bz);
                    if (coop) {
                        run_block_coop(body, t);
                        continue;
                    }
                    for (int i = 0; i < t; i++) {
                        threadIdx = dim3(i % c.block.x, (i / c.block.x) % c.block.y,
                                         i / (c.block.x * c.block.y));
                        body();
                    }
                }
    });
}

/* ------------------------------------------------------------ runtime */

static cudaError_t last_error = cudaSuccess;

const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    default: return "unknown error";
    }
}

const char *cudaGetErrorName(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    default: return "cudaErrorUnknown";
    }
}

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : cudaErrorInvalidDevice; }
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
    static int next = 1;
    (void)flags;
    *s = new emu_stream{next++};
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    delete s;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    return (capturing && s == capturing) ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags)
{
    (void)s;
    (void)e;
    (void)flags;
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags)
{
    (void)flags;
    *e = new emu_event{0};
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    delete e;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    (void)e;
    (void)s;
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    (void)e;
    return cudaSuccess;
}

/* device memory starts as NaN bytes (0xff): a read of memory nothing wrote
 * shows up in the results */
cudaError_t cudaMalloc(void **p, size_t bytes)
{
    *p = malloc(bytes ? bytes : 1);
    if (!*p)
        return cudaErrorMemoryAllocation;
    memset(*p, 0xff, bytes);
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t bytes)
{
    *p = malloc(bytes ? bytes : 1);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaFree(void *p)
{
    free(p);
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p)
{
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int v, size_t bytes)
{
    memset(p, v, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t s)
{
    emu_submit(s, [p, v, bytes]() { memset(p, v, bytes); });
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind k,
                            cudaStream_t s)
{
    (void)k;
    emu_submit(s, [dst, src, bytes]() { memcpy(dst, src, bytes); });
    return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode)
{
    (void)mode;
    if (capturing)
        return cudaErrorInvalidValue;
    capturing = s;
    capture_graph = new emu_graph;
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g)
{
    if (s != capturing)
        return cudaErrorInvalidValue;
    *g = capture_graph;
    capturing = NULL;
    capture_graph = NULL;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long flags)
{
    (void)flags;
    *e = new emu_graph(*g);
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t g)
{
    delete g;
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e)
{
    delete e;
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s)
{
    (void)s;
    for (auto &op : e->ops)
        op();
    return cudaSuccess;
}

/* ------------------------------------------------------------ cuBLAS */

cublasStatus_t cublasCreate(cublasHandle_t *h)
{
    *h = new emu_blas{NULL};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t h)
{
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s)
{
    h->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t m)
{
    (void)h;
    (void)m;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *ws, size_t bytes)
{
    (void)h;
    (void)ws;
    (void)bytes;
    return CUBLAS_STATUS_SUCCESS;
}

/* C (m, n) = alpha op(A) op(B) + beta C, column-major */
cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                           int n, int k, const float *alpha, const float *A, int lda,
                           const float *B, int ldb, const float *beta, float *C, int ldc)
{
    if (m < 0 || n < 0 || k < 0 || lda < (ta == CUBLAS_OP_N ? m : k) ||
        ldb < (tb == CUBLAS_OP_N ? k : n) || ldc < m)
        return CUBLAS_STATUS_INVALID_VALUE;
    const float al = *alpha, be = *beta;
    emu_submit(h->stream, [=]() {
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                float s = 0.0f;
                for (int l = 0; l < k; l++) {
                    float a = ta == CUBLAS_OP_N ? A[i + (long)l * lda] : A[l + (long)i * lda];
                    float b = tb == CUBLAS_OP_N ? B[l + (long)j * ldb] : B[j + (long)l * ldb];
                    s += a * b;
                }
                float *c = &C[i + (long)j * ldc];
                *c = al * s + (be == 0.0f ? 0.0f : be * *c);
            }
    });
    return CUBLAS_STATUS_SUCCESS;
}

/* ------------------------------------------------------------ gpu_device.h */

extern "C" int gpu_device_count(int *count, char err[ERR_MAX])
{
    (void)err;
    *count = 1;
    return 0;
}

extern "C" int gpu_device_query(int index, gpu_device_info *out, char err[ERR_MAX])
{
    if (index != 0) {
        snprintf(err, ERR_MAX, "emu: invalid device ordinal %d", index);
        return -1;
    }
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "host emulation (bench/gpu/emu)");
    out->total_bytes = (size_t)1 << 30;
    out->free_bytes = out->total_bytes;
    out->cc_major = 9;
    out->multiprocessors = 1;
    return 0;
}
