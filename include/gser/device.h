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
    gser_status_t (*alloc)(void *user, size_t size, void *stream, void **ptr);
    void (*free)(void *user, void *ptr, size_t size, void *stream);
    void *user;
} gser_allocator_t;

/** The name of the context's device backend: "cuda", "emulated" or "none". */
GSER_API const char *gser_device_backend(const gser_context_t *ctx);

/** Whether the context has a usable device backend. */
GSER_API bool gser_device_available(const gser_context_t *ctx);

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
GSER_API gser_status_t gser_stream_sync(gser_context_t *ctx, void *stream);

/** A device event (a cudaEvent_t with the CUDA backend). */
typedef struct gser_event gser_event_t;

GSER_API gser_status_t gser_event_create(gser_context_t *ctx, gser_event_t **event);
/** Record the event at the current end of stream. */
GSER_API gser_status_t gser_event_record(gser_event_t *event, void *stream);
/** GSER_OK when the work before the record is done, GSER_INPROGRESS if not. */
GSER_API gser_status_t gser_event_query(gser_event_t *event);
/** Block until the work before the record is done. */
GSER_API gser_status_t gser_event_sync(gser_event_t *event);
/** Make stream wait (on the device, not the host) for the event. */
GSER_API gser_status_t gser_stream_wait_event(void *stream, gser_event_t *event);
/** Make stream wait (on the device) for an event the backend did not create
 *  through gser: a cudaEvent_t from the caller, an Arrow sync_event, ... */
GSER_API gser_status_t gser_stream_wait_handle(gser_context_t *ctx, void *stream, void *event_handle);
/** The backend's own handle (cudaEvent_t for CUDA). */
GSER_API void *gser_event_handle(const gser_event_t *event);
/** NULL is fine. */
GSER_API void gser_event_destroy(gser_event_t *event);

/* ---- small device ops for Arrow columns (used by plugins/arrow) ------------- */

/**
 * Rebase an offsets buffer so that it starts at 0: dst[i] = src[i] - src[0]
 * for count offsets of width 4 (int32) or 8 (int64) bytes, queued on stream.
 * src[0] is read on the device (no host round trip). Both buffers are device
 * memory, aligned to width, and must not overlap. count 0 does nothing.
 */
GSER_API gser_status_t gser_device_rebase_offsets(gser_context_t *ctx, void *dst, const void *src, size_t count,
                                                  size_t width, void *stream);

/**
 * Copy the bit range [src_bit_offset, src_bit_offset + nbits) of the bitmap
 * src (least significant bit first, as Arrow orders them) to bits
 * [0, nbits) of dst, queued on stream: (nbits + 7) / 8 bytes of dst are
 * written, the bits past nbits in the last one as 0. No byte of src outside
 * the range is read. Both are device memory and must not overlap.
 */
GSER_API gser_status_t gser_device_copy_bits(gser_context_t *ctx, void *dst, const void *src,
                                             uint64_t src_bit_offset, uint64_t nbits, void *stream);

/** What gser_device_check_offsets found wrong (bits of its verdict). */
enum {
    GSER_OFFSETS_FIRST = 1u << 0,    /**< the first offset is not 0 */
    GSER_OFFSETS_DECREASE = 1u << 1, /**< some offset is less than the one before */
    GSER_OFFSETS_LAST = 1u << 2,     /**< the last offset is not end */
};

/**
 * Check an Arrow offsets buffer in device memory without copying it to the
 * host: count signed offsets of width 4 or 8 bytes must start at 0, never
 * decrease, and end at end (the size of what they index). One pass on the
 * device, ordered on stream; the call waits for the verdict: 0 when valid,
 * else GSER_OFFSETS_* bits. For receivers that must not trust a peer's
 * device buffers (plugins/arrow). count 0 is valid.
 */
GSER_API gser_status_t gser_device_check_offsets(gser_context_t *ctx, const void *offsets, size_t count, size_t width,
                                                 uint64_t end, void *stream, uint32_t *verdict);

#ifdef __cplusplus
}
#endif

#endif /* GSER_DEVICE_H */
