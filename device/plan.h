/* Copy plans (private to the device layer): many buffer copies split into
 * chunks that one kernel launch (or the emulated backend) works through.
 * Built on the host from sizes the host already knows, so packing never
 * waits for the device. */
#ifndef GSER_DEVICE_PLAN_H
#define GSER_DEVICE_PLAN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes one warp copies per chunk: large buffers are spread over many warps,
 * small ones take one chunk each. */
#define DEVL_CHUNK_BYTES 16384u

typedef struct devl_chunk {
    const unsigned char *src;
    unsigned char *dst;
    uint32_t len;  /* bytes to copy, 0..DEVL_CHUNK_BYTES */
    uint32_t zpad; /* zero bytes to write after them (the padding to the next packed buffer) */
} devl_chunk_t;

#ifndef __CUDACC__
#include "device.h"

/* Chunks needed for these copies (an empty copy with no padding needs none). */
DEVL_INTERNAL size_t devl_plan_count(const devl_copy_t *copies, size_t n);

/* Write the chunks of these copies into out (devl_plan_count entries). */
DEVL_INTERNAL void devl_plan_fill(const devl_copy_t *copies, size_t n, devl_chunk_t *out);
#endif

#ifdef __cplusplus
}
#endif

#endif
