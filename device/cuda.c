/* The CUDA backend. Every CUDA runtime call of the library is here, behind
 * cuda_check(), which turns a cudaError_t into a gser status at that one
 * place, keeps the CUDA error text for the detailed message, and clears the
 * (non-sticky) error state. A NULL stream means cudaStreamPerThread: gser never
 * queues work on, or synchronizes, the legacy default stream. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backend.h"

/* The launcher of the copy kernel (device/pack.cu). */
cudaError_t gser_cuda_launch_copy(const devl_chunk_t *chunks, size_t nchunks, int sm_count, cudaStream_t stream);
/* The launchers of the Arrow helper kernels (device/arrow_kernels.cu). */
cudaError_t gser_cuda_launch_rebase_offsets(void *dst, const void *src, size_t count, unsigned width, int sm_count,
                                            cudaStream_t stream);
cudaError_t gser_cuda_launch_check_offsets(const void *offsets, size_t count, unsigned width, uint64_t end,
                                          uint32_t *verdict, int sm_count, cudaStream_t stream);
cudaError_t gser_cuda_launch_copy_bits(void *dst, const void *src, uint64_t src_bit, uint64_t nbits, int sm_count,
                                       cudaStream_t stream);

/* Pinned blocks are kept by power-of-two size class for reuse: cudaMallocHost
 * costs milliseconds, a staging buffer is needed for every transfer. */
#define PIN_CLASSES 48
#define PIN_KEEP_PER_CLASS 8

struct devl_bstate {
    int ordinal;
    int sm_count;
    cudaMemPool_t pool;
    pthread_mutex_t pin_lock;
    void *pin_free[PIN_CLASSES][PIN_KEEP_PER_CLASS];
    int pin_count[PIN_CLASSES];
};

static _Thread_local char cuda_err[256];

static gser_status_t cuda_check(cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return GSER_OK;
    if (e == cudaErrorNotReady) {
        cudaGetLastError();
        return GSER_INPROGRESS;
    }
    snprintf(cuda_err, sizeof cuda_err, "%s: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
    cudaGetLastError(); /* clear it, so that the next call does not report it again */
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
    if ((st = CUDA(cudaDeviceGetAttribute(&s->sm_count, cudaDevAttrMultiProcessorCount, ordinal))))
        goto fail;
    /* A pool of our own, so that settings never touch the device's default pool. */
    struct cudaMemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = ordinal;
    if ((st = CUDA(cudaMemPoolCreate(&s->pool, &props))))
        goto fail;
    uint64_t keep = UINT64_MAX; /* keep freed memory for reuse instead of returning it at every sync */
    if ((st = CUDA(cudaMemPoolSetAttribute(s->pool, cudaMemPoolAttrReleaseThreshold, &keep)))) {
        cudaMemPoolDestroy(s->pool);
        goto fail;
    }
    pthread_mutex_init(&s->pin_lock, NULL);
    *state = s;
    return GSER_OK;
fail:
    free(s);
    return st;
}

static void cu_close(devl_bstate_t *s)
{
    for (int c = 0; c < PIN_CLASSES; c++)
        for (int i = 0; i < s->pin_count[c]; i++)
            CUDA(cudaFreeHost(s->pin_free[c][i]));
    CUDA(cudaMemPoolDestroy(s->pool));
    pthread_mutex_destroy(&s->pin_lock);
    free(s);
}

static gser_status_t cu_alloc(devl_bstate_t *s, size_t size, void *stream, void **ptr)
{
    void *p = NULL;
    gser_status_t st = CUDA(cudaMallocFromPoolAsync(&p, size ? size : 1, s->pool, stream_of(stream)));
    if (st == GSER_OK)
        *ptr = p;
    return st;
}

static void cu_free(devl_bstate_t *s, void *ptr, size_t size, void *stream)
{
    (void)s;
    (void)size;
    CUDA(cudaFreeAsync(ptr, stream_of(stream)));
}

static int pin_class(size_t size)
{
    int c = 0;
    while (c < PIN_CLASSES - 1 && ((size_t)4096 << c) < size)
        c++;
    return c;
}

static gser_status_t cu_pinned_alloc(devl_bstate_t *s, size_t size, void **ptr)
{
    int c = pin_class(size);
    size_t csize = (size_t)4096 << c;
    if (csize < size)
        return GSER_ERR_NO_MEMORY;
    pthread_mutex_lock(&s->pin_lock);
    void *p = s->pin_count[c] ? s->pin_free[c][--s->pin_count[c]] : NULL;
    pthread_mutex_unlock(&s->pin_lock);
    if (!p) {
        gser_status_t st = CUDA(cudaMallocHost(&p, csize));
        if (st)
            return st;
    }
    *ptr = p;
    return GSER_OK;
}

static void cu_pinned_free(devl_bstate_t *s, void *ptr, size_t size)
{
    int c = pin_class(size);
    pthread_mutex_lock(&s->pin_lock);
    if (s->pin_count[c] < PIN_KEEP_PER_CLASS) {
        s->pin_free[c][s->pin_count[c]++] = ptr;
        ptr = NULL;
    }
    pthread_mutex_unlock(&s->pin_lock);
    if (ptr)
        CUDA(cudaFreeHost(ptr));
}

static gser_status_t cu_memcpy(devl_bstate_t *s, void *dst, const void *src, size_t n, devl_dir_t kind,
                               void *stream)
{
    (void)s;
    static const enum cudaMemcpyKind kinds[] = {
        [DEVL_H2H] = cudaMemcpyHostToHost, [DEVL_H2D] = cudaMemcpyHostToDevice,
        [DEVL_D2H] = cudaMemcpyDeviceToHost, [DEVL_D2D] = cudaMemcpyDeviceToDevice};
    return CUDA(cudaMemcpyAsync(dst, src, n, kinds[kind], stream_of(stream)));
}

static gser_status_t cu_stream_sync(devl_bstate_t *s, void *stream)
{
    (void)s;
    return CUDA(cudaStreamSynchronize(stream_of(stream)));
}

static gser_status_t cu_event_create(devl_bstate_t *s, void **event)
{
    (void)s;
    cudaEvent_t e;
    gser_status_t st = CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    if (st == GSER_OK)
        *event = e;
    return st;
}

static gser_status_t cu_event_record(devl_bstate_t *s, void *event, void *stream)
{
    (void)s;
    return CUDA(cudaEventRecord((cudaEvent_t)event, stream_of(stream)));
}

static gser_status_t cu_event_query(devl_bstate_t *s, void *event)
{
    (void)s;
    return CUDA(cudaEventQuery((cudaEvent_t)event));
}

static gser_status_t cu_event_sync(devl_bstate_t *s, void *event)
{
    (void)s;
    return CUDA(cudaEventSynchronize((cudaEvent_t)event));
}

static gser_status_t cu_stream_wait_event(devl_bstate_t *s, void *stream, void *event)
{
    (void)s;
    return CUDA(cudaStreamWaitEvent(stream_of(stream), (cudaEvent_t)event, 0));
}

static void cu_event_destroy(devl_bstate_t *s, void *event)
{
    (void)s;
    CUDA(cudaEventDestroy((cudaEvent_t)event));
}

/* The chunk table goes to the device with one copy, the kernel runs, and the
 * table's device memory is freed in stream order behind it. */
static gser_status_t cu_copy_plan(devl_bstate_t *s, const devl_chunk_t *chunks, size_t nchunks, void *stream)
{
    if (nchunks == 0)
        return GSER_OK;
    cudaStream_t st_ = stream_of(stream);
    size_t bytes = nchunks * sizeof(devl_chunk_t);
    void *table = NULL;
    gser_status_t st = CUDA(cudaMallocFromPoolAsync(&table, bytes, s->pool, st_));
    if (st)
        return st;
    st = CUDA(cudaMemcpyAsync(table, chunks, bytes, cudaMemcpyHostToDevice, st_));
    if (st == GSER_OK)
        st = cuda_check(gser_cuda_launch_copy(table, nchunks, s->sm_count, st_), "the copy kernel");
    gser_status_t st2 = CUDA(cudaFreeAsync(table, st_));
    return st ? st : st2;
}

static gser_status_t cu_rebase_offsets(devl_bstate_t *s, void *dst, const void *src, size_t count,
                                       unsigned width, void *stream)
{
    return cuda_check(gser_cuda_launch_rebase_offsets(dst, src, count, width, s->sm_count, stream_of(stream)),
                      "the offsets rebase kernel");
}

static gser_status_t cu_copy_bits(devl_bstate_t *s, void *dst, const void *src, uint64_t src_bit,
                                  uint64_t nbits, void *stream)
{
    return cuda_check(gser_cuda_launch_copy_bits(dst, src, src_bit, nbits, s->sm_count, stream_of(stream)),
                      "the bit copy kernel");
}

static const char *cu_last_error(devl_bstate_t *s)
{
    (void)s;
    return cuda_err;
}

/* The verdict is one word in device memory that the kernel ORs into; it comes
 * back with one small copy and a wait on the stream. */
static gser_status_t cu_check_offsets(devl_bstate_t *s, const void *offsets, size_t count, unsigned width,
                                      uint64_t end, void *stream, uint32_t *verdict)
{
    cudaStream_t st_ = stream_of(stream);
    uint32_t *flag = NULL, host = 0;
    gser_status_t st = CUDA(cudaMallocFromPoolAsync((void **)&flag, sizeof *flag, s->pool, st_));
    if (st)
        return st;
    if (!(st = CUDA(cudaMemsetAsync(flag, 0, sizeof *flag, st_))) &&
        !(st = cuda_check(gser_cuda_launch_check_offsets(offsets, count, width, end, flag, s->sm_count, st_),
                          "the offsets check kernel")) &&
        !(st = CUDA(cudaMemcpyAsync(&host, flag, sizeof host, cudaMemcpyDeviceToHost, st_))))
        st = CUDA(cudaStreamSynchronize(st_));
    gser_status_t st2 = CUDA(cudaFreeAsync(flag, st_));
    if (st == GSER_OK && st2 == GSER_OK)
        *verdict = host;
    return st ? st : st2;
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
    .event_create = cu_event_create,
    .event_record = cu_event_record,
    .event_query = cu_event_query,
    .event_sync = cu_event_sync,
    .stream_wait_event = cu_stream_wait_event,
    .event_destroy = cu_event_destroy,
    .copy_plan = cu_copy_plan,
    .last_error = cu_last_error,
    .rebase_offsets = cu_rebase_offsets,
    .copy_bits = cu_copy_bits,
    .check_offsets = cu_check_offsets,
};
