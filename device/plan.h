/* Copy plans: many buffer copies split into chunks that one kernel launch
 * (or the emulated backend) works through. Built on the host from sizes the
 * host already knows, so packing never waits for the device. */
#ifndef GSER_DEVICE_PLAN_H
#define GSER_DEVICE_PLAN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes one warp copies per chunk: large buffers are spread over many warps,
 * small ones take one chunk each. */
#define GSER_CHUNK_BYTES 16384u

/* Where packed buffers start inside a packed frame. */
#define GSER_PACK_ALIGN 64u

typedef struct gser_chunk {
    const unsigned char *src;
    unsigned char *dst;
    uint32_t len;  /* bytes to copy, 0..GSER_CHUNK_BYTES */
    uint32_t zpad; /* zero bytes to write after them (the padding to the next packed buffer) */
} gser_chunk_t;

typedef struct gser_copy {
    const void *src;
    void *dst;
    size_t size;
    size_t zpad; /* zero bytes after dst + size: no stale memory in packed frames */
} gser_copy_t;

/* Chunks needed for these copies (an empty copy with no padding needs none). */
size_t gser_plan_count(const gser_copy_t *copies, size_t n);

/* Write the chunks of these copies into out (gser_plan_count entries). */
void gser_plan_fill(const gser_copy_t *copies, size_t n, gser_chunk_t *out);

#ifdef __cplusplus
}
#endif

#endif
