/* Device backends (private to the device layer): every device operation of
 * the library goes through one table, so that CUDA's calls and its error
 * codes stay in device/cuda.c and the emulated backend can stand in for it
 * where there is no GPU. Only device/layer.c calls through the table. */
#ifndef GSER_DEVICE_BACKEND_H
#define GSER_DEVICE_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "device.h"
#include "plan.h"

typedef struct devl_bstate devl_bstate_t;

/* Where the arrays of a transfer are. */
typedef enum devl_where {
    DEVL_ARRAYS_HOST,   /* any host memory, at most DEVL_FEW copies: read before xfer returns */
    DEVL_ARRAYS_PINNED, /* pinned, untouched until the work completes: uploaded in stream order */
    DEVL_ARRAYS_DEVICE, /* device memory, in place */
} devl_where_t;

/* A batch of n copies: src[i] -> dst[i] (or, for a gather, base + pos(i)),
 * size[i] bytes, each followed by zeros up to pad_align (0: none); total is
 * the sum of sizes and pads. */
typedef struct devl_xfer {
    const unsigned char *const *src;
    unsigned char *const *dst; /* NULL: a gather into base */
    const uint64_t *size;
    size_t n;
    unsigned char *base;
    uint64_t total;
    uint32_t pad_align;
    devl_where_t where;
} devl_xfer_t;

typedef struct devl_backend {
    const char *name;
    /* Open the backend for a GPU ordinal; GSER_ERR_NO_DEVICE if it cannot. */
    gser_status_t (*open)(int ordinal, devl_bstate_t **state);
    void (*close)(devl_bstate_t *state);
    /* The default allocators (stream-ordered device pool, pinned pool). */
    gser_status_t (*alloc)(devl_bstate_t *s, size_t size, void *stream, void **ptr);
    void (*free)(devl_bstate_t *s, void *ptr, size_t size, void *stream);
    gser_status_t (*pinned_alloc)(devl_bstate_t *s, size_t size, void **ptr);
    void (*pinned_free)(devl_bstate_t *s, void *ptr, size_t size);
    gser_status_t (*memcpy)(devl_bstate_t *s, void *dst, const void *src, size_t n, devl_dir_t kind,
                            void *stream);
    gser_status_t (*stream_sync)(devl_bstate_t *s, void *stream);
    gser_status_t (*event_create)(devl_bstate_t *s, void **event);
    gser_status_t (*event_record)(devl_bstate_t *s, void *event, void *stream);
    gser_status_t (*event_query)(devl_bstate_t *s, void *event); /* GSER_OK or GSER_INPROGRESS */
    gser_status_t (*event_sync)(devl_bstate_t *s, void *event);
    gser_status_t (*stream_wait_event)(devl_bstate_t *s, void *stream, void *event);
    void (*event_destroy)(devl_bstate_t *s, void *event);
    /* Queue a batch of copies (device memory to device memory) on stream,
     * as one launch: see plan.h and devl_xfer_t. */
    gser_status_t (*xfer)(devl_bstate_t *s, const devl_xfer_t *x, void *stream);
    /* Make host memory [ptr, ptr + size) a place that copies and kernels
     * may write (cudaHostRegister, mapped); *done false when it was one
     * already (pinned or registered by its owner): then nothing to undo.
     * unregister undoes it. */
    gser_status_t (*host_register)(devl_bstate_t *s, void *ptr, size_t size, bool *done);
    void (*host_unregister)(devl_bstate_t *s, void *ptr);
    /* A stream of the backend's own, that does not wait for the legacy stream. */
    gser_status_t (*stream_create)(devl_bstate_t *s, void **stream);
    void (*stream_destroy)(devl_bstate_t *s, void *stream);
    /* This thread's last detailed error (the CUDA error string), or "";
     * s may be NULL (a failed open). */
    const char *(*last_error)(devl_bstate_t *s);
    /* Two small ops for compacting sliced Arrow columns (plugins/arrow), on
     * stream, both buffers device memory, not overlapping.
     * dst[i] = src[i] - src[0] for count offsets of width 4 or 8 bytes
     * (src[0] is read on the device: no host round trip). */
    gser_status_t (*rebase_offsets)(devl_bstate_t *s, void *dst, const void *src, size_t count,
                                    unsigned width, void *stream);
    /* Bits [src_bit, src_bit + nbits) of src (LSB first, Arrow order) become
     * bits [0, nbits) of dst: (nbits + 7) / 8 bytes written, bits past nbits 0. */
    gser_status_t (*copy_bits)(devl_bstate_t *s, void *dst, const void *src, uint64_t src_bit,
                               uint64_t nbits, void *stream);
    /* Check count offsets of width 4 or 8 (signed) in device memory: the
     * first is 0, none decreases, the last is end. Waits for the answer:
     * *verdict 0 when they are valid, else GSER_OFFSETS_* bits. */
    gser_status_t (*check_offsets)(devl_bstate_t *s, const void *offsets, size_t count, unsigned width,
                                   uint64_t end, void *stream, uint32_t *verdict);
} devl_backend_t;

extern DEVL_INTERNAL const devl_backend_t devl_backend_emulated;
#ifdef GSER_HAVE_CUDA
extern DEVL_INTERNAL const devl_backend_t devl_backend_cuda;
#endif

#endif /* GSER_DEVICE_BACKEND_H */
