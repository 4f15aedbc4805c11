/* Copy plans (private to the device layer): a batch of copies as arrays of
 * sources, destinations and sizes, which one kernel launch (or the emulated
 * backend) works through. Shared by C and CUDA.
 *
 * Every copy i has a place pos(i) in a virtual byte range of total bytes:
 * the running sum of size + pad of the copies before it (pad: zeros up to
 * pad_align for a gather, none for a scatter). The range is cut into tiles
 * of equal bytes, one warp each, so work is balanced whatever the sizes: a
 * large buffer spreads over many warps (and blocks), many small ones share a
 * warp. For a gather the destination is base + pos(i): packing needs no
 * destination array at all.
 *
 * Positions are a scan, computed in blocks of DEVL_SCAN_BLOCK copies:
 * pos(i) = pos_local[i] + pos_block[i / DEVL_SCAN_BLOCK]. Few copies travel
 * as kernel parameters; many are scanned on the device.
 */
#ifndef GSER_DEVICE_PLAN_H
#define GSER_DEVICE_PLAN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Copies passed as kernel parameters, not uploaded (4 KiB of parameters
 * fit every GPU and toolkit). */
#define DEVL_FEW 32u

/* Copies one block of the scan kernel covers (256 threads x 4). */
#define DEVL_SCAN_BLOCK 1024u

/* Block totals the second scan kernel (one block) covers: the limit on
 * copies scanned on the device is DEVL_SCAN_BLOCK * DEVL_SCAN_BLOCKS_MAX. */
#define DEVL_SCAN_BLOCKS_MAX 4096u

/* Tiles: at least this, at most DEVL_TILE_MAX, in steps of DEVL_TILE_STEP. */
#define DEVL_TILE_MIN 1024u
#define DEVL_TILE_MAX 65536u
#define DEVL_TILE_STEP 256u

/* Pieces of at most this many bytes are copied by one lane alone; larger
 * ones by the whole warp. */
#define DEVL_LANE_PIECE 128u

/* What the copy kernel reads (with the few form, only the scalars). */
typedef struct devl_plan {
    const unsigned char *const *src;
    unsigned char *const *dst; /* NULL: a gather into base */
    const uint64_t *size;
    const uint64_t *pos_local;
    const uint64_t *pos_block;
    uint64_t n;
    unsigned char *base;
    uint64_t total; /* virtual bytes */
    uint64_t tile;  /* bytes per tile */
    uint32_t pad_align;
} devl_plan_t;

/* A few copies, whole, as kernel parameters; pos is each copy's place. */
typedef struct devl_few {
    const unsigned char *src[DEVL_FEW];
    unsigned char *dst[DEVL_FEW];
    uint64_t size[DEVL_FEW];
    uint64_t pos[DEVL_FEW];
    devl_plan_t plan; /* n, base, total, tile, pad_align, and dst non-NULL for a scatter */
} devl_few_t;

#ifdef __CUDACC__
#define DEVL_HOST_DEVICE __host__ __device__
#else
#define DEVL_HOST_DEVICE
#endif

static inline DEVL_HOST_DEVICE uint64_t devl_pad(uint64_t size, uint32_t align)
{
    return align ? ((size + align - 1) & ~(uint64_t)(align - 1)) - size : 0;
}

/* Bytes per tile: about two tiles per resident warp, so that every warp has
 * work and the last wave is short. */
static inline uint64_t devl_tile_bytes(uint64_t total, uint64_t resident_warps)
{
    uint64_t want = resident_warps ? total / (2 * resident_warps) : total;
    want = (want + DEVL_TILE_STEP - 1) / DEVL_TILE_STEP * DEVL_TILE_STEP;
    return want < DEVL_TILE_MIN ? DEVL_TILE_MIN : want > DEVL_TILE_MAX ? DEVL_TILE_MAX : want;
}

#ifdef __cplusplus
}
#endif

#endif
