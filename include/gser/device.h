/* gser — device memory: backends, allocators, copies and events.
 *
 * Device work goes through the context's device backend: "cuda" (built when
 * nvcc was found, used when a GPU is present) or "emulated" (device memory is
 * host memory tagged as device; every device code path runs, on the CPU).
 * CUDA streams and events cross this API as opaque pointers (cudaStream_t and
 * cudaEvent_t are pointers), so no CUDA header is needed to include it.
 */
#ifndef GSER_DEVICE_H
#define GSER_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gser/defs.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * An allocator, in the manner of RMM's memory resources: alloc and free are
 * ordered on a stream (NULL: the per-thread default stream). alloc returns
 * GSER_OK and sets *ptr, or an error (GSER_ERR_NO_MEMORY) and leaves it.
 */
typedef struct gser_allocator {
    size_t size; /**< sizeof(gser_allocator_t): GSER_ALLOCATOR_INIT sets it */
    gser_status_t (*alloc)(void *user, size_t size, void *stream, void **ptr);
    void (*free)(void *user, void *ptr, size_t size, void *stream);
    void *user;
} gser_allocator_t;

#define GSER_ALLOCATOR_INIT GSER_STRUCT_INIT(gser_allocator_t)

/** The name of the context's device backend: "cuda", "emulated" or "none". */
GSER_API const char *gser_context_get_device_backend(const gser_context_t *ctx);

/** Whether the context has a usable device backend. */
GSER_API bool gser_context_has_device(const gser_context_t *ctx);

/** The GPU ordinal the context's device memory and work are on
 *  (gser_context_options_t.device); 0 without a device backend. gser makes it
 *  current for its own calls and gives the caller's current device back. */
GSER_API int gser_context_get_device_ordinal(const gser_context_t *ctx);

/** Device memory from the context's device allocator, ordered on stream. */
GSER_API gser_status_t gser_device_alloc(gser_context_t *ctx, size_t size, void *stream, void **ptr);
/** Give back memory from gser_device_alloc (same size). NULL is fine. */
GSER_API void gser_device_free(gser_context_t *ctx, void *ptr, size_t size, void *stream);

/** Pinned (page-locked) host memory from the context's pinned allocator. */
GSER_API gser_status_t gser_pinned_alloc(gser_context_t *ctx, size_t size, void **ptr);
GSER_API void gser_pinned_free(gser_context_t *ctx, void *ptr, size_t size);

/** Copy n bytes, asynchronously on stream; the memory kinds say the direction.
 *  Pageable host memory makes the copy synchronous with the host. */
GSER_API gser_status_t gser_device_memcpy(gser_context_t *ctx, void *dst, gser_memory_t dst_memory, const void *src,
                                          gser_memory_t src_memory, size_t n, void *stream);

/** Block until everything queued on stream is done. */
GSER_API gser_status_t gser_stream_wait(gser_context_t *ctx, void *stream);

/** A stream of the context's device (a cudaStream_t created non-blocking:
 *  it does not wait for the legacy default stream). For work that must not
 *  queue behind whatever the calling thread has on its per-thread stream. */
GSER_API gser_status_t gser_stream_create(gser_context_t *ctx, void **stream);
/** Destroy a stream from gser_stream_create; work queued on it still
 *  completes. NULL is fine. */
GSER_API void gser_stream_destroy(gser_context_t *ctx, void *stream);

/** A device event (a cudaEvent_t with the CUDA backend). */
typedef struct gser_event gser_event_t;

GSER_API gser_status_t gser_event_create(gser_context_t *ctx, gser_event_t **event);
/** Record the event at the current end of stream. */
GSER_API gser_status_t gser_event_record(gser_event_t *event, void *stream);
/** GSER_OK when the work before the record is done, GSER_INPROGRESS if not. */
GSER_API gser_status_t gser_event_query(gser_event_t *event);
/** Block until the work before the record is done. */
GSER_API gser_status_t gser_event_wait(gser_event_t *event);
/** Order the work queued on stream from now on after the event (the device
 *  waits, not the host: cudaStreamWaitEvent). */
GSER_API gser_status_t gser_stream_order_after(gser_context_t *ctx, void *stream, const gser_event_t *event);
/** gser_stream_order_after for an event gser did not create: a cudaEvent_t
 *  from the caller, an Arrow sync_event, ... */
GSER_API gser_status_t gser_stream_order_after_handle(gser_context_t *ctx, void *stream, void *event_handle);
/** The backend's own handle (cudaEvent_t for CUDA). */
GSER_API void *gser_event_get_handle(const gser_event_t *event);
/** NULL is fine. */
GSER_API void gser_event_destroy(gser_event_t *event);

#ifdef __cplusplus
}
#endif

#endif /* GSER_DEVICE_H */
