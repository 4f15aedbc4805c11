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
    uint64_t len; /* 1..GSER_CHUNK_BYTES */
} gser_chunk_t;

typedef struct gser_copy {
    const void *src;
    void *dst;
    size_t size;
} gser_copy_t;

/* Chunks needed for these copies (empty copies need none). */
size_t gser_plan_count(const gser_copy_t *copies, size_t n);

/* Write the chunks of these copies into out (gser_plan_count entries). */
void gser_plan_fill(const gser_copy_t *copies, size_t n, gser_chunk_t *out);

#ifdef __cplusplus
}
#endif

#endif
