/* The device layer's interface to the core.
 *
 * Dependencies point one way: the core (host/) calls the device layer only
 * through this header, and the device layer (device/) never includes the
 * core's internals; it sees only the public headers. A device-layer handle
 * (devl_t) holds the backend (CUDA or emulated), its state and the
 * allocators. Its calls return a gser status; on failure devl_error() says
 * what went wrong in the backend's words, and the core turns that into the
 * context's message.
 *
 * Words, so that "device" keeps one meaning per name: the *backend* is the
 * implementation (cuda, emulated); the *ordinal* is which GPU; device
 * *memory* is GSER_MEMORY_DEVICE; the *device layer* is this folder.
 */
#ifndef GSER_DEVICE_DEVICE_H
#define GSER_DEVICE_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gser/gser.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DEVL_INTERNAL __attribute__((visibility("hidden")))

/* Where packed buffers start inside a packed frame. */
#define DEVL_PACK_ALIGN 64u

typedef struct devl devl_t;

/* Directions of a copy. */
typedef enum devl_dir { DEVL_H2H, DEVL_H2D, DEVL_D2H, DEVL_D2D } devl_dir_t;

/* The arrays of a batch of copies, for the caller to fill: sources, sizes
 * and (for a scatter) destinations. */
typedef struct devl_arrays {
    const void **src;
    uint64_t *size;
    void **dst; /* NULL for a gather */
} devl_arrays_t;

/* A batch of copies between device buffers, run as one launch; it owns its
 * arrays and whatever the queued work still reads. */
typedef struct devl_batch devl_batch_t;

/* Open the backend called name ("cuda", "emulated"; NULL or "auto": cuda
 * when a GPU is present) for GPU ordinal. *out is NULL, with GSER_OK, when
 * automatic choice finds no GPU or name is "none". Allocators may be NULL
 * (the backend's own); they are copied. On failure why says what and why. */
DEVL_INTERNAL gser_status_t devl_open(const char *name, int ordinal, const gser_allocator_t *device_alloc,
                                      const gser_allocator_t *pinned_alloc, devl_t **out, char *why, size_t why_cap);
/* Waits for the layer's own outstanding work, then frees. NULL is fine. */
DEVL_INTERNAL void devl_close(devl_t *dl);
/* Whether name is a backend this layer knows ("auto", "none" included). */
DEVL_INTERNAL bool devl_backend_known(const char *name);
/* The names devl_backend_known accepts, for messages: "cuda, emulated, none, auto". */
DEVL_INTERNAL const char *devl_backend_names(void);

DEVL_INTERNAL const char *devl_backend_name(const devl_t *dl);
DEVL_INTERNAL int devl_ordinal(const devl_t *dl);
/* The backend's text for this thread's last failure (e.g. the CUDA error), or "". */
DEVL_INTERNAL const char *devl_error(const devl_t *dl);

/* Memory through the layer's allocators; *ptr set only on success (a NULL
 * pointer for a non-empty request is GSER_ERR_NO_MEMORY). */
DEVL_INTERNAL gser_status_t devl_alloc(devl_t *dl, size_t size, void *stream, void **ptr);
DEVL_INTERNAL void devl_free(devl_t *dl, void *ptr, size_t size, void *stream);
DEVL_INTERNAL gser_status_t devl_pinned_alloc(devl_t *dl, size_t size, void **ptr);
DEVL_INTERNAL void devl_pinned_free(devl_t *dl, void *ptr, size_t size);

DEVL_INTERNAL gser_status_t devl_memcpy(devl_t *dl, void *dst, const void *src, size_t n, devl_dir_t dir,
                                        void *stream);
DEVL_INTERNAL gser_status_t devl_stream_sync(devl_t *dl, void *stream);
/* Register pageable host memory so that a batch may write it from the
 * device (a scatter's destinations); unregister after the work completes,
 * if *done says it was registered here. */
DEVL_INTERNAL gser_status_t devl_host_register(devl_t *dl, void *ptr, size_t size, bool *done);
DEVL_INTERNAL void devl_host_unregister(devl_t *dl, void *ptr);
DEVL_INTERNAL gser_status_t devl_event_create(devl_t *dl, void **event);
DEVL_INTERNAL gser_status_t devl_event_record(devl_t *dl, void *event, void *stream);
/* GSER_OK when done, GSER_INPROGRESS when not yet, else an error. */
DEVL_INTERNAL gser_status_t devl_event_query(devl_t *dl, void *event);
DEVL_INTERNAL gser_status_t devl_event_sync(devl_t *dl, void *event);
DEVL_INTERNAL gser_status_t devl_stream_wait_event(devl_t *dl, void *stream, void *event);
DEVL_INTERNAL void devl_event_destroy(devl_t *dl, void *event);

/* A batch of n copies (n > 0): *arrays says where to write them. For many
 * copies the arrays are pinned memory, uploaded when the batch runs; for a
 * few (DEVL_FEW) they travel as the kernel's parameters. */
DEVL_INTERNAL gser_status_t devl_batch_create(devl_t *dl, size_t n, bool scatter, devl_batch_t **batch,
                                              devl_arrays_t *arrays);
/* Queue the batch on stream. A scatter copies src[i] to dst[i]; a gather
 * copies them, in order, into base: each at the sum of the sizes before it,
 * each rounded up to DEVL_PACK_ALIGN, with zeros in the gaps. */
DEVL_INTERNAL gser_status_t devl_batch_run(devl_t *dl, devl_batch_t *batch, void *base, void *stream);
/* Wait until the queued work no longer reads the batch, then free it. NULL is fine. */
DEVL_INTERNAL void devl_batch_release(devl_t *dl, devl_batch_t *batch);
/* A gather whose arrays are in device memory already (as CUB's batched copy
 * takes them): nothing crosses PCIe. total is the bytes it writes (sizes
 * rounded up to DEVL_PACK_ALIGN). */
DEVL_INTERNAL gser_status_t devl_gather_resident(devl_t *dl, const void *const *src, const uint64_t *size, size_t n,
                                                 uint64_t total, void *base, void *stream);

/* A stream of the backend's own (a cudaStream_t that does not wait for the
 * legacy default stream). */
DEVL_INTERNAL gser_status_t devl_stream_create(devl_t *dl, void **stream);
DEVL_INTERNAL void devl_stream_destroy(devl_t *dl, void *stream);

/* The Arrow column ops (see gser/arrow.h); arguments already checked. */
DEVL_INTERNAL gser_status_t devl_rebase_offsets(devl_t *dl, void *dst, const void *src, size_t count, unsigned width,
                                                void *stream);
DEVL_INTERNAL gser_status_t devl_copy_bits(devl_t *dl, void *dst, const void *src, uint64_t src_bit, uint64_t nbits,
                                           void *stream);
DEVL_INTERNAL gser_status_t devl_check_offsets(devl_t *dl, const void *offsets, size_t count, unsigned width,
                                               uint64_t end, void *stream, uint32_t *verdict);

#ifdef __cplusplus
}
#endif

#endif /* GSER_DEVICE_DEVICE_H */
