/* The CUDA backend. Every CUDA runtime call of the library is here, behind
 * cuda_check(), which turns a cudaError_t into a gser status at that one
 * place and keeps the CUDA error text for the detailed message.
 *
 * - Every entry point makes the context's GPU current for its calls and
 *   gives the calling thread its own current device back (device_enter /
 *   device_leave): allocations, launches, events and the per-thread stream
 *   all belong to the context's ordinal, whatever the caller had current.
 * - The runtime's last-error slot belongs to the application: gser never
 *   calls cudaGetLastError to learn about a launch (cudaLaunchKernel returns
 *   the launch's error), and clears the slot only when it holds gser's own
 *   error, so an earlier error of the application is neither reported as
 *   gser's nor lost.
 * - A NULL stream means cudaStreamPerThread: gser never queues work on, or
 *   synchronizes, the legacy default stream. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backend.h"
#include "pincache.h"

/* The launchers of the copy kernel and its scan (device/pack.cu). */
cudaError_t devl_cuda_copy_occupancy(int *many_per_sm, int *few_per_sm);
cudaError_t devl_cuda_launch_few(const devl_few_t *few, int max_blocks, cudaStream_t stream);
cudaError_t devl_cuda_launch_many(const devl_plan_t *plan, uint64_t *block_sum, int max_blocks, cudaStream_t stream);
/* The launchers of the Arrow helper kernels (device/arrow_kernels.cu). */
cudaError_t gser_cuda_launch_rebase_offsets(void *dst, const void *src, size_t count, unsigned width, int sm_count,
                                            cudaStream_t stream);
cudaError_t gser_cuda_launch_check_offsets(const void *offsets, size_t count, unsigned width, uint64_t end,
                                          uint32_t *verdict, int sm_count, cudaStream_t stream);
cudaError_t gser_cuda_launch_copy_bits(void *dst, const void *src, uint64_t src_bit, uint64_t nbits, int sm_count,
                                       cudaStream_t stream);

struct devl_bstate {
    int ordinal;
    int sm_count;
    int max_blocks;         /* copy kernel blocks resident at once on the whole GPU */
    int max_blocks_few;     /* the same for the few-copies kernel */
    uint64_t resident_warps;
    cudaMemPool_t pool;
    devl_pincache_t pins;
};

static _Thread_local char cuda_err[256];

static gser_status_t cuda_check(cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return GSER_OK;
    /* Ours only if the slot holds it: clear it then, so that the application
     * does not see gser's error as its own; anything else stays. */
    if (cudaPeekAtLastError() == e)
        cudaGetLastError();
    if (e == cudaErrorNotReady)
        return GSER_INPROGRESS;
    snprintf(cuda_err, sizeof cuda_err, "%s: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
    switch (e) {
    case cudaErrorMemoryAllocation: return GSER_ERR_NO_MEMORY;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice: return GSER_ERR_NO_DEVICE;
    default: return GSER_ERR_DEVICE;
    }
}

#define CUDA(call) cuda_check((call), #call)

static cudaStream_t stream_of(void *stream)
{
    return stream ? (cudaStream_t)stream : cudaStreamPerThread;
}

/* Make the context's GPU current; *prev gets the caller's, for device_leave. */
static gser_status_t device_enter(const devl_bstate_t *s, int *prev)
{
    gser_status_t st = CUDA(cudaGetDevice(prev));
    if (st == GSER_OK && *prev != s->ordinal && (st = CUDA(cudaSetDevice(s->ordinal))))
        *prev = s->ordinal;
    return st;
}

static void device_leave(const devl_bstate_t *s, int prev)
{
    if (prev != s->ordinal)
        CUDA(cudaSetDevice(prev));
}

/* Run one call with the context's GPU current. */
#define ON_DEVICE(s, expr)                                                                                     \
    do {                                                                                                       \
        int prev_;                                                                                             \
        gser_status_t st_ = device_enter((s), &prev_);                                                         \
        if (st_ == GSER_OK) {                                                                                  \
            st_ = (expr);                                                                                      \
            device_leave((s), prev_);                                                                          \
        }                                                                                                      \
        return st_;                                                                                            \
    } while (0)

static void release_pinned(void *p, size_t size)
{
    (void)size;
    CUDA(cudaFreeHost(p));
}

static gser_status_t open_on(devl_bstate_t *s)
{
    gser_status_t st;
    int per_sm = 0, few_per_sm = 0;
    if ((st = CUDA(cudaDeviceGetAttribute(&s->sm_count, cudaDevAttrMultiProcessorCount, s->ordinal))) ||
        (st = cuda_check(devl_cuda_copy_occupancy(&per_sm, &few_per_sm), "the copy kernels' occupancy")))
        return st;
    int sms = s->sm_count > 0 ? s->sm_count : 1;
    s->max_blocks = (per_sm > 0 ? per_sm : 1) * sms;
    s->max_blocks_few = (few_per_sm > 0 ? few_per_sm : 1) * sms;
    s->resident_warps = (uint64_t)s->max_blocks * 8;
    /* A pool of our own, so that settings never touch the device's default pool. */
    struct cudaMemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = s->ordinal;
    if ((st = CUDA(cudaMemPoolCreate(&s->pool, &props))))
        return st;
    uint64_t keep = UINT64_MAX; /* keep freed memory for reuse instead of returning it at every sync */
    if ((st = CUDA(cudaMemPoolSetAttribute(s->pool, cudaMemPoolAttrReleaseThreshold, &keep))))
        CUDA(cudaMemPoolDestroy(s->pool));
    return st;
}

static gser_status_t cu_open(int ordinal, devl_bstate_t **state)
{
    int count = 0;
    gser_status_t st = CUDA(cudaGetDeviceCount(&count));
    if (st)
        return GSER_ERR_NO_DEVICE;
    if (ordinal < 0 || ordinal >= count) {
        snprintf(cuda_err, sizeof cuda_err, "GPU %d requested, %d present", ordinal, count);
        return GSER_ERR_NO_DEVICE;
    }
    devl_bstate_t *s = calloc(1, sizeof *s);
    if (!s)
        return GSER_ERR_NO_MEMORY;
    s->ordinal = ordinal;
    int prev;
    if ((st = device_enter(s, &prev))) {
        free(s);
        return st;
    }
    st = open_on(s);
    device_leave(s, prev);
    if (st) {
        free(s);
        return st;
    }
    devl_pincache_init(&s->pins, DEVL_PIN_BUDGET);
    *state = s;
    return GSER_OK;
}

static void cu_close(devl_bstate_t *s)
{
    int prev;
    if (device_enter(s, &prev) == GSER_OK) {
        devl_pincache_drain(&s->pins, release_pinned);
        CUDA(cudaMemPoolDestroy(s->pool));
        device_leave(s, prev);
    }
    free(s);
}

static gser_status_t cu_alloc(devl_bstate_t *s, size_t size, void *stream, void **ptr)
{
    ON_DEVICE(s, CUDA(cudaMallocFromPoolAsync(ptr, size ? size : 1, s->pool, stream_of(stream))));
}

static gser_status_t free_async(devl_bstate_t *s, void *ptr, void *stream)
{
    ON_DEVICE(s, CUDA(cudaFreeAsync(ptr, stream_of(stream))));
}

static void cu_free(devl_bstate_t *s, void *ptr, size_t size, void *stream)
{
    (void)size;
    free_async(s, ptr, stream);
}

static gser_status_t alloc_host(void *arg, size_t csize, void **ptr)
{
    devl_bstate_t *s = arg;
    ON_DEVICE(s, CUDA(cudaMallocHost(ptr, csize)));
}

static gser_status_t free_host(devl_bstate_t *s, void *ptr)
{
    ON_DEVICE(s, CUDA(cudaFreeHost(ptr)));
}

/* Over the cache's budget: rare, and it waits for the device. */
static void release_host(void *arg, void *ptr)
{
    free_host(arg, ptr);
}

static gser_status_t cu_pinned_alloc(devl_bstate_t *s, size_t size, void **ptr)
{
    return devl_pincache_alloc(&s->pins, size, alloc_host, s, ptr);
}

static void cu_pinned_free(devl_bstate_t *s, void *ptr, size_t size)
{
    devl_pincache_free(&s->pins, ptr, size, release_host, s);
}

static gser_status_t cu_memcpy(devl_bstate_t *s, void *dst, const void *src, size_t n, devl_dir_t kind,
                               void *stream)
{
    static const enum cudaMemcpyKind kinds[] = {
        [DEVL_H2H] = cudaMemcpyHostToHost, [DEVL_H2D] = cudaMemcpyHostToDevice,
        [DEVL_D2H] = cudaMemcpyDeviceToHost, [DEVL_D2D] = cudaMemcpyDeviceToDevice};
    ON_DEVICE(s, CUDA(cudaMemcpyAsync(dst, src, n, kinds[kind], stream_of(stream))));
}

static gser_status_t cu_stream_sync(devl_bstate_t *s, void *stream)
{
    ON_DEVICE(s, CUDA(cudaStreamSynchronize(stream_of(stream))));
}

/* Mapped, so that the copy kernel writes it through its host pointer
 * (unified addressing); pinning the pages is what it costs. */
static gser_status_t host_register_on(void *ptr, size_t size, bool *done)
{
    cudaError_t e = cudaHostRegister(ptr, size, cudaHostRegisterMapped | cudaHostRegisterPortable);
    if (e == cudaErrorHostMemoryAlreadyRegistered) { /* pinned by its owner: usable as it is */
        if (cudaPeekAtLastError() == e)
            cudaGetLastError();
        return GSER_OK;
    }
    *done = e == cudaSuccess;
    return CUDA(e);
}

static gser_status_t cu_host_register(devl_bstate_t *s, void *ptr, size_t size, bool *done)
{
    ON_DEVICE(s, host_register_on(ptr, size, done));
}

static void cu_host_unregister(devl_bstate_t *s, void *ptr)
{
    (void)s;
    (void)cudaHostUnregister(ptr);
}

static gser_status_t event_create_on(void **event)
{
    cudaEvent_t e;
    gser_status_t st = CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    if (st == GSER_OK)
        *event = e;
    return st;
}

static gser_status_t cu_event_create(devl_bstate_t *s, void **event)
{
    ON_DEVICE(s, event_create_on(event));
}

static gser_status_t cu_event_record(devl_bstate_t *s, void *event, void *stream)
{
    ON_DEVICE(s, CUDA(cudaEventRecord((cudaEvent_t)event, stream_of(stream))));
}

static gser_status_t cu_event_query(devl_bstate_t *s, void *event)
{
    ON_DEVICE(s, CUDA(cudaEventQuery((cudaEvent_t)event)));
}

static gser_status_t cu_event_sync(devl_bstate_t *s, void *event)
{
    ON_DEVICE(s, CUDA(cudaEventSynchronize((cudaEvent_t)event)));
}

static gser_status_t cu_stream_wait_event(devl_bstate_t *s, void *stream, void *event)
{
    ON_DEVICE(s, CUDA(cudaStreamWaitEvent(stream_of(stream), (cudaEvent_t)event, 0)));
}

static gser_status_t event_destroy(devl_bstate_t *s, void *event)
{
    ON_DEVICE(s, CUDA(cudaEventDestroy((cudaEvent_t)event)));
}

static void cu_event_destroy(devl_bstate_t *s, void *event)
{
    event_destroy(s, event);
}

static gser_status_t stream_create_on(void **stream)
{
    cudaStream_t cs;
    gser_status_t st = CUDA(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    if (st == GSER_OK)
        *stream = cs;
    return st;
}

static gser_status_t cu_stream_create(devl_bstate_t *s, void **stream)
{
    ON_DEVICE(s, stream_create_on(stream));
}

static gser_status_t stream_destroy(devl_bstate_t *s, void *stream)
{
    ON_DEVICE(s, CUDA(cudaStreamDestroy((cudaStream_t)stream)));
}

static void cu_stream_destroy(devl_bstate_t *s, void *stream)
{
    stream_destroy(s, stream);
}

/* ---- batches of copies ---------------------------------------------------------------------- */

/* Few copies: the whole plan is the kernel's parameter, positions from the host. */
static gser_status_t xfer_few(devl_bstate_t *s, const devl_xfer_t *x, cudaStream_t cs)
{
    devl_few_t few;
    memset(&few, 0, sizeof few);
    uint64_t at = 0;
    for (size_t i = 0; i < x->n; i++) {
        few.src[i] = x->src[i];
        few.dst[i] = x->dst ? x->dst[i] : NULL;
        few.size[i] = x->size[i];
        few.pos[i] = at;
        at += x->size[i] + devl_pad(x->size[i], x->pad_align);
    }
    few.plan = (devl_plan_t){.dst = x->dst ? few.dst : NULL, /* on the device only: "a scatter" */
                             .n = x->n, .base = x->base, .total = x->total,
                             .tile = devl_tile_bytes(x->total, s->resident_warps), .pad_align = x->pad_align};
    return cuda_check(devl_cuda_launch_few(&few, s->max_blocks_few, cs), "the copy kernel");
}

/* Many copies: sources (and destinations) and sizes on the device -- uploaded
 * from pinned memory first unless they are there already -- positions scanned
 * there, then the copy kernel. The scratch memory is freed in stream order. */
static gser_status_t xfer_many(devl_bstate_t *s, const devl_xfer_t *x, cudaStream_t cs)
{
    size_t n = x->n, nb = (n + DEVL_SCAN_BLOCK - 1) / DEVL_SCAN_BLOCK;
    size_t arrays = x->where == DEVL_ARRAYS_PINNED ? n * (x->dst ? 3 : 2) * 8 : 0;
    size_t bytes = arrays + n * 8 + 2 * nb * 8;
    unsigned char *tmp = NULL;
    gser_status_t st = CUDA(cudaMallocFromPoolAsync((void **)&tmp, bytes, s->pool, cs));
    if (st)
        return st;
    devl_plan_t p = {.src = x->src, .dst = x->dst, .size = x->size, .n = n, .base = x->base, .total = x->total,
                     .tile = devl_tile_bytes(x->total, s->resident_warps), .pad_align = x->pad_align};
    if (arrays) {
        /* The layer lays the pinned arrays out as src[n], size[n], dst[n]. */
        st = CUDA(cudaMemcpyAsync(tmp, x->src, arrays, cudaMemcpyHostToDevice, cs));
        p.src = (const unsigned char *const *)tmp;
        p.size = (const uint64_t *)(tmp + n * 8);
        p.dst = x->dst ? (unsigned char *const *)(tmp + 2 * n * 8) : NULL;
    }
    uint64_t *pos_local = (uint64_t *)(tmp + arrays), *pos_block = pos_local + n, *block_sum = pos_block + nb;
    p.pos_local = pos_local;
    p.pos_block = pos_block;
    if (st == GSER_OK)
        st = cuda_check(devl_cuda_launch_many(&p, block_sum, s->max_blocks, cs), "the copy kernel");
    gser_status_t st2 = CUDA(cudaFreeAsync(tmp, cs));
    return st ? st : st2;
}

static gser_status_t xfer_on(devl_bstate_t *s, const devl_xfer_t *x, void *stream)
{
    if (x->n == 0 || x->total == 0)
        return GSER_OK;
    if (x->where == DEVL_ARRAYS_HOST)
        return x->n <= DEVL_FEW ? xfer_few(s, x, stream_of(stream)) : GSER_ERR_INVALID_ARG;
    return xfer_many(s, x, stream_of(stream));
}

static gser_status_t cu_xfer(devl_bstate_t *s, const devl_xfer_t *x, void *stream)
{
    ON_DEVICE(s, xfer_on(s, x, stream));
}

/* ---- the Arrow helpers ------------------------------------------------------------------------- */

static gser_status_t cu_rebase_offsets(devl_bstate_t *s, void *dst, const void *src, size_t count,
                                       unsigned width, void *stream)
{
    ON_DEVICE(s, cuda_check(gser_cuda_launch_rebase_offsets(dst, src, count, width, s->sm_count, stream_of(stream)),
                            "the offsets rebase kernel"));
}

static gser_status_t cu_copy_bits(devl_bstate_t *s, void *dst, const void *src, uint64_t src_bit,
                                  uint64_t nbits, void *stream)
{
    ON_DEVICE(s, cuda_check(gser_cuda_launch_copy_bits(dst, src, src_bit, nbits, s->sm_count, stream_of(stream)),
                            "the bit copy kernel"));
}

static const char *cu_last_error(devl_bstate_t *s)
{
    (void)s;
    return cuda_err;
}

/* The verdict is one word in device memory that the kernel ORs into; it comes
 * back with one small copy and a wait on the stream. */
static gser_status_t check_offsets_on(devl_bstate_t *s, const void *offsets, size_t count, unsigned width,
                                      uint64_t end, cudaStream_t cs, uint32_t *verdict)
{
    uint32_t *flag = NULL, host = 0;
    gser_status_t st = CUDA(cudaMallocFromPoolAsync((void **)&flag, sizeof *flag, s->pool, cs));
    if (st)
        return st;
    if (!(st = CUDA(cudaMemsetAsync(flag, 0, sizeof *flag, cs))) &&
        !(st = cuda_check(gser_cuda_launch_check_offsets(offsets, count, width, end, flag, s->sm_count, cs),
                          "the offsets check kernel")) &&
        !(st = CUDA(cudaMemcpyAsync(&host, flag, sizeof host, cudaMemcpyDeviceToHost, cs))))
        st = CUDA(cudaStreamSynchronize(cs));
    gser_status_t st2 = CUDA(cudaFreeAsync(flag, cs));
    if (st == GSER_OK && st2 == GSER_OK)
        *verdict = host;
    return st ? st : st2;
}

static gser_status_t cu_check_offsets(devl_bstate_t *s, const void *offsets, size_t count, unsigned width,
                                      uint64_t end, void *stream, uint32_t *verdict)
{
    ON_DEVICE(s, check_offsets_on(s, offsets, count, width, end, stream_of(stream), verdict));
}

const devl_backend_t devl_backend_cuda = {
    .name = "cuda",
    .open = cu_open,
    .close = cu_close,
    .alloc = cu_alloc,
    .free = cu_free,
    .pinned_alloc = cu_pinned_alloc,
    .pinned_free = cu_pinned_free,
    .memcpy = cu_memcpy,
    .stream_sync = cu_stream_sync,
    .host_register = cu_host_register,
    .host_unregister = cu_host_unregister,
    .event_create = cu_event_create,
    .event_record = cu_event_record,
    .event_query = cu_event_query,
    .event_sync = cu_event_sync,
    .stream_wait_event = cu_stream_wait_event,
    .event_destroy = cu_event_destroy,
    .xfer = cu_xfer,
    .stream_create = cu_stream_create,
    .stream_destroy = cu_stream_destroy,
    .last_error = cu_last_error,
    .rebase_offsets = cu_rebase_offsets,
    .copy_bits = cu_copy_bits,
    .check_offsets = cu_check_offsets,
};
