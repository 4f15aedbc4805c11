/* A cache of pinned host blocks by power-of-two size class (private to the
 * device layer). Pinned memory is slow to get (cudaMallocHost takes
 * milliseconds) and, with CUDA, slow to give back: cudaFreeHost waits for
 * the whole device. So freed blocks are kept for reuse up to a budget of
 * bytes, whatever their count, and a steady stream of transfers never frees. */
#ifndef GSER_DEVICE_PINCACHE_H
#define GSER_DEVICE_PINCACHE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

#include "device.h"

#define DEVL_PIN_CLASSES 48
#define DEVL_PIN_MIN 4096u
/* Bytes the cache keeps by default. */
#define DEVL_PIN_BUDGET ((size_t)512 << 20)

typedef struct devl_pincache {
    pthread_mutex_t lock;
    void **blocks[DEVL_PIN_CLASSES];
    size_t count[DEVL_PIN_CLASSES], cap[DEVL_PIN_CLASSES];
    size_t bytes, budget;
} devl_pincache_t;

DEVL_INTERNAL void devl_pincache_init(devl_pincache_t *c, size_t budget);
/* The size of size's class (what a new block for it should have); 0 if too large. */
DEVL_INTERNAL size_t devl_pincache_class_size(size_t size);
/* A kept block of size's class, or NULL. */
DEVL_INTERNAL void *devl_pincache_get(devl_pincache_t *c, size_t size);
/* Keep p (a block of size's class): true, or false when over the budget
 * (the caller frees it). */
DEVL_INTERNAL bool devl_pincache_put(devl_pincache_t *c, void *p, size_t size);
/* What a backend gets pinned memory with (a block of csize bytes) and gives
 * it back with; arg is the backend's. */
typedef gser_status_t (*devl_pin_alloc_fn)(void *arg, size_t csize, void **ptr);
typedef void (*devl_pin_release_fn)(void *arg, void *p);
/* A pinned block for size bytes: a kept one of its class, else a new one of
 * the class's size from alloc. GSER_ERR_NO_MEMORY when size has no class,
 * else what alloc returns. */
DEVL_INTERNAL gser_status_t devl_pincache_alloc(devl_pincache_t *c, size_t size, devl_pin_alloc_fn alloc, void *arg,
                                                void **ptr);
/* Keep p (from devl_pincache_alloc for size), or, over the budget, hand it
 * to release. */
DEVL_INTERNAL void devl_pincache_free(devl_pincache_t *c, void *p, size_t size, devl_pin_release_fn release,
                                      void *arg);
/* Hand every kept block to release, then free the cache's own memory. */
DEVL_INTERNAL void devl_pincache_drain(devl_pincache_t *c, void (*release)(void *p, size_t size));

#endif
