/* The fake CUDA runtime (see fake_cuda/cuda_runtime_api.h) and the kernel
 * launchers device/cuda.c calls: device memory is host memory, every call
 * completes at once, launches run the kernels' work on the CPU with the
 * shared per-lane code (copy_impl.h). Records which device was current for
 * each call and keeps a per-thread last-error slot like the runtime's. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_runtime_api.h"
#include "device/copy_impl.h"
#include "device/plan.h"

static int g_ndevices = 1;
static _Thread_local int g_current;
static _Thread_local cudaError_t g_last;
static fake_call_t g_calls[1 << 16];
static size_t g_ncalls;
static const char *g_fail_name;
static cudaError_t g_fail_err;
static int g_not_ready;

void fake_reset(int ndevices)
{
    g_ndevices = ndevices;
    g_current = 0;
    g_last = cudaSuccess;
    g_ncalls = 0;
    g_fail_name = NULL;
    g_not_ready = 0;
}

size_t fake_calls(const fake_call_t **calls)
{
    *calls = g_calls;
    return g_ncalls;
}

size_t fake_count(const char *name)
{
    size_t n = 0;
    for (size_t i = 0; i < g_ncalls; i++)
        n += strcmp(g_calls[i].name, name) == 0;
    return n;
}

void fake_fail_next(const char *name, cudaError_t e)
{
    g_fail_name = name;
    g_fail_err = e;
}

void fake_set_last_error(cudaError_t e)
{
    g_last = e;
}

void fake_event_not_ready(int times)
{
    g_not_ready = times;
}

/* Log the call; the injected failure, if it is this one (and the runtime's
 * habit: a failing call leaves its error in the slot). */
static cudaError_t call(const char *name)
{
    if (g_ncalls < sizeof g_calls / sizeof g_calls[0])
        g_calls[g_ncalls++] = (fake_call_t){name, g_current};
    if (g_fail_name && strcmp(g_fail_name, name) == 0) {
        g_fail_name = NULL;
        g_last = g_fail_err;
        return g_fail_err;
    }
    return cudaSuccess;
}

#define CALL(name)                                                                                           \
    do {                                                                                                     \
        cudaError_t e_ = call(name);                                                                         \
        if (e_ != cudaSuccess)                                                                               \
            return e_;                                                                                       \
    } while (0)

const char *cudaGetErrorName(cudaError_t e)
{
    return e == cudaSuccess ? "cudaSuccess" : "cudaErrorFake";
}

const char *cudaGetErrorString(cudaError_t e)
{
    (void)e;
    return "a fake error";
}

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = g_last;
    g_last = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void)
{
    return g_last;
}

cudaError_t cudaGetDeviceCount(int *count)
{
    CALL("cudaGetDeviceCount");
    *count = g_ndevices;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
    *device = g_current;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
    CALL("cudaSetDevice");
    if (device < 0 || device >= g_ndevices)
        return g_last = cudaErrorInvalidDevice;
    g_current = device;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    (void)attr;
    (void)device;
    CALL("cudaDeviceGetAttribute");
    *value = 4;
    return cudaSuccess;
}

cudaError_t cudaMemPoolCreate(cudaMemPool_t *pool, const struct cudaMemPoolProps *props)
{
    (void)props;
    CALL("cudaMemPoolCreate");
    *pool = (cudaMemPool_t)malloc(1);
    return cudaSuccess;
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr, void *value)
{
    (void)pool, (void)attr, (void)value;
    CALL("cudaMemPoolSetAttribute");
    return cudaSuccess;
}

cudaError_t cudaMemPoolDestroy(cudaMemPool_t pool)
{
    CALL("cudaMemPoolDestroy");
    free(pool);
    return cudaSuccess;
}

cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t pool, cudaStream_t stream)
{
    (void)pool, (void)stream;
    CALL("cudaMallocFromPoolAsync");
    *ptr = malloc(size);
    return cudaSuccess;
}

cudaError_t cudaFreeAsync(void *ptr, cudaStream_t stream)
{
    (void)stream;
    CALL("cudaFreeAsync");
    free(ptr);
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **ptr, size_t size)
{
    CALL("cudaMallocHost");
    *ptr = malloc(size);
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *ptr)
{
    CALL("cudaFreeHost");
    free(ptr);
    return cudaSuccess;
}

cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned flags)
{
    (void)ptr, (void)size, (void)flags;
    CALL("cudaHostRegister");
    return cudaSuccess;
}

cudaError_t cudaHostUnregister(void *ptr)
{
    (void)ptr;
    CALL("cudaHostUnregister");
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t stream)
{
    (void)kind, (void)stream;
    CALL("cudaMemcpyAsync");
    memmove(dst, src, n);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *dst, int value, size_t n, cudaStream_t stream)
{
    (void)stream;
    CALL("cudaMemsetAsync");
    memset(dst, value, n);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    (void)stream;
    CALL("cudaStreamSynchronize");
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned flags)
{
    (void)flags;
    CALL("cudaStreamCreateWithFlags");
    *stream = (cudaStream_t)malloc(1);
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    CALL("cudaStreamDestroy");
    free(stream);
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags)
{
    (void)stream, (void)event, (void)flags;
    CALL("cudaStreamWaitEvent");
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned flags)
{
    (void)flags;
    CALL("cudaEventCreateWithFlags");
    *event = (cudaEvent_t)malloc(1);
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    (void)event, (void)stream;
    CALL("cudaEventRecord");
    return cudaSuccess;
}

/* NotReady is an answer, not an error: the runtime does not put it in the slot. */
cudaError_t cudaEventQuery(cudaEvent_t event)
{
    (void)event;
    CALL("cudaEventQuery");
    if (g_not_ready > 0) {
        g_not_ready--;
        return cudaErrorNotReady;
    }
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    (void)event;
    CALL("cudaEventSynchronize");
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    CALL("cudaEventDestroy");
    free(event);
    return cudaSuccess;
}

/* ---- the launchers of device/pack.cu and device/arrow_kernels.cu ---- */

cudaError_t devl_cuda_copy_occupancy(int *many_per_sm, int *few_per_sm)
{
    CALL("occupancy");
    *many_per_sm = 8;
    *few_per_sm = 6;
    return cudaSuccess;
}

cudaError_t devl_cuda_launch_few(const devl_few_t *few, int max_blocks, cudaStream_t stream)
{
    (void)max_blocks, (void)stream;
    CALL("launch_few");
    devl_run_plan_cpu(&few->plan, few);
    return cudaSuccess;
}

/* The two scan kernels' result, then the copy kernel. */
cudaError_t devl_cuda_launch_many(const devl_plan_t *plan, uint64_t *block_sum, int max_blocks, cudaStream_t stream)
{
    (void)block_sum, (void)max_blocks, (void)stream;
    CALL("launch_many");
    devl_scan_cpu(plan->size, plan->n, plan->pad_align, (uint64_t *)plan->pos_local, (uint64_t *)plan->pos_block);
    devl_run_plan_cpu(plan, NULL);
    return cudaSuccess;
}

cudaError_t gser_cuda_launch_rebase_offsets(void *dst, const void *src, size_t count, unsigned width, int sm_count,
                                            cudaStream_t stream)
{
    (void)dst, (void)src, (void)count, (void)width, (void)sm_count, (void)stream;
    CALL("launch_rebase");
    return cudaSuccess;
}

cudaError_t gser_cuda_launch_check_offsets(const void *offsets, size_t count, unsigned width, uint64_t end,
                                          uint32_t *verdict, int sm_count, cudaStream_t stream)
{
    (void)offsets, (void)count, (void)width, (void)end, (void)verdict, (void)sm_count, (void)stream;
    CALL("launch_check");
    return cudaSuccess;
}

cudaError_t gser_cuda_launch_copy_bits(void *dst, const void *src, uint64_t src_bit, uint64_t nbits, int sm_count,
                                       cudaStream_t stream)
{
    (void)dst, (void)src, (void)src_bit, (void)nbits, (void)sm_count, (void)stream;
    CALL("launch_bits");
    return cudaSuccess;
}
