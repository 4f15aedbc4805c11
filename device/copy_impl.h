/* The copy kernel's per-lane work, written once for CUDA (device/pack.cu)
 * and for the emulated backend, which runs it lane by lane on the CPU so that
 * a build without a GPU exercises the same index arithmetic as the GPU.
 *
 * A piece (a part of one copy inside one tile) is copied by nl lanes, lane
 * l taking every nl-th unit: nl = 32 for a warp, 1 for a lane alone. Three
 * paths, by the relative alignment of source and destination: 16-byte
 * vectors when they agree modulo 16, 4-byte words when they agree modulo 4,
 * and otherwise 4-byte stores built from two aligned source words (a funnel
 * shift). Each lane keeps four loads in flight before it stores. Heads and
 * tails go byte by byte. No lane reads a byte outside [src, src + len) or
 * writes outside [dst, dst + len + zlen).
 */
#ifndef GSER_DEVICE_COPY_IMPL_H
#define GSER_DEVICE_COPY_IMPL_H

#include <stdint.h>

#include "plan.h"

#define DEVL_LANES 32u

#ifdef __CUDACC__
#define DEVL_FN static __device__ __forceinline__
#define DEVL_RESTRICT __restrict__
typedef uint4 devl_vec_t;
#define DEVL_LOAD16(p) __ldg((const uint4 *)(p))
#define DEVL_STORE16(p, v) (*(uint4 *)(p) = (v))
#define DEVL_LOAD32(p) __ldg((const unsigned int *)(p))
#define DEVL_STORE32(p, v) (*(uint32_t *)(p) = (v))
#else
#include <string.h>
#define DEVL_FN static inline
#define DEVL_RESTRICT restrict
typedef struct devl_vec {
    unsigned char b[16];
} devl_vec_t;
static inline devl_vec_t devl_load16_(const unsigned char *p)
{
    devl_vec_t v;
    memcpy(&v, p, 16);
    return v;
}
static inline uint32_t devl_load32_(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
#define DEVL_LOAD16(p) devl_load16_(p)
#define DEVL_STORE16(p, v)                                                                                    \
    do {                                                                                                     \
        devl_vec_t v_ = (v);                                                                                 \
        memcpy((p), &v_, 16);                                                                                \
    } while (0)
#define DEVL_LOAD32(p) devl_load32_(p)
#define DEVL_STORE32(p, v)                                                                                   \
    do {                                                                                                     \
        uint32_t v_ = (v);                                                                                   \
        memcpy((p), &v_, 4);                                                                                 \
    } while (0)
#endif

/* Bytes hi:lo shifted right by 8*m (m = 1..3), low 32 bits, little-endian. */
DEVL_FN uint32_t devl_funnel(uint32_t lo, uint32_t hi, unsigned m)
{
#ifdef __CUDA_ARCH__
    return __funnelshift_r(lo, hi, 8 * m);
#else
    return (uint32_t)((((uint64_t)hi << 32) | lo) >> (8 * m));
#endif
}

/* Lengths inside a piece are 32-bit: a piece never crosses a tile
 * (DEVL_TILE_MAX), which keeps the kernel's registers down. */
DEVL_FN void devl_copy_bytes(const unsigned char *DEVL_RESTRICT src, unsigned char *DEVL_RESTRICT dst, uint32_t from,
                             uint32_t to, unsigned lane, unsigned nl)
{
    for (uint32_t i = from + lane; i < to; i += nl)
        dst[i] = src[i];
}

/* The funnel path: d is 4-aligned, s is not. Word k of the output is the
 * aligned source words a[k] and a[k + 1] shifted by m bytes; words whose two
 * source words would reach outside [lo, hi) are built from bytes. */
DEVL_FN uint32_t devl_funnel_word(const unsigned char *s, const unsigned char *lo, const unsigned char *hi, uint32_t k)
{
    unsigned m = (unsigned)((uintptr_t)s & 3);
    const unsigned char *w0 = s - m + 4 * k;
    if (w0 >= lo && w0 + 8 <= hi)
        return devl_funnel(DEVL_LOAD32(w0), DEVL_LOAD32(w0 + 4), m);
    const unsigned char *b = s + 4 * k;
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

DEVL_FN void devl_copy_lane(const unsigned char *DEVL_RESTRICT src, unsigned char *DEVL_RESTRICT dst, uint32_t len,
                            unsigned lane, unsigned nl)
{
    uintptr_t s = (uintptr_t)src, d = (uintptr_t)dst;
    unsigned width = ((s ^ d) & 15) == 0 ? 16u : ((s ^ d) & 3) == 0 ? 4u : 0u;
    unsigned align = width == 16 ? 16u : 4u;
    uint32_t head = (uint32_t)((align - (d & (align - 1))) & (align - 1));
    if (head > len)
        head = len;
    devl_copy_bytes(src, dst, 0, head, lane, nl);
    const unsigned char *s2 = src + head;
    unsigned char *d2 = dst + head;
    uint32_t n = (len - head) / (width ? width : 4), i = lane;
    if (width == 16) {
        /* Four loads in flight before the first store. */
        for (; i + 3 * nl < n; i += 4 * nl) {
            devl_vec_t a = DEVL_LOAD16(s2 + 16 * i), b = DEVL_LOAD16(s2 + 16 * (i + nl));
            devl_vec_t c = DEVL_LOAD16(s2 + 16 * (i + 2 * nl)), e = DEVL_LOAD16(s2 + 16 * (i + 3 * nl));
            DEVL_STORE16(d2 + 16 * i, a);
            DEVL_STORE16(d2 + 16 * (i + nl), b);
            DEVL_STORE16(d2 + 16 * (i + 2 * nl), c);
            DEVL_STORE16(d2 + 16 * (i + 3 * nl), e);
        }
        for (; i < n; i += nl)
            DEVL_STORE16(d2 + 16 * i, DEVL_LOAD16(s2 + 16 * i));
    } else if (width == 4) {
        for (; i + 3 * nl < n; i += 4 * nl) {
            uint32_t a = DEVL_LOAD32(s2 + 4 * i), b = DEVL_LOAD32(s2 + 4 * (i + nl));
            uint32_t c = DEVL_LOAD32(s2 + 4 * (i + 2 * nl)), e = DEVL_LOAD32(s2 + 4 * (i + 3 * nl));
            DEVL_STORE32(d2 + 4 * i, a);
            DEVL_STORE32(d2 + 4 * (i + nl), b);
            DEVL_STORE32(d2 + 4 * (i + 2 * nl), c);
            DEVL_STORE32(d2 + 4 * (i + 3 * nl), e);
        }
        for (; i < n; i += nl)
            DEVL_STORE32(d2 + 4 * i, DEVL_LOAD32(s2 + 4 * i));
    } else {
        const unsigned char *hi = src + len;
        for (; i + nl < n; i += 2 * nl) {
            uint32_t a = devl_funnel_word(s2, src, hi, i), b = devl_funnel_word(s2, src, hi, i + nl);
            DEVL_STORE32(d2 + 4 * i, a);
            DEVL_STORE32(d2 + 4 * (i + nl), b);
        }
        for (; i < n; i += nl)
            DEVL_STORE32(d2 + 4 * i, devl_funnel_word(s2, src, hi, i));
    }
    devl_copy_bytes(src, dst, head + n * (width ? width : 4), len, lane, nl);
}

/* ---- plans: positions, tiles, pieces ---------------------------------------- */

/* Copy i's fields: from the plan's arrays, or from the few form (f non-NULL,
 * the kernel's parameter, read in place). */
DEVL_FN uint64_t devl_pos(const devl_plan_t *p, const devl_few_t *f, uint64_t i)
{
    return f ? f->pos[i] : p->pos_local[i] + p->pos_block[i / DEVL_SCAN_BLOCK];
}

DEVL_FN uint64_t devl_size(const devl_plan_t *p, const devl_few_t *f, uint64_t i)
{
    return f ? f->size[i] : p->size[i];
}

DEVL_FN const unsigned char *devl_src(const devl_plan_t *p, const devl_few_t *f, uint64_t i)
{
    return f ? f->src[i] : p->src[i];
}

/* Where copy i starts: its destination, or its place in base (a gather). */
DEVL_FN unsigned char *devl_dst(const devl_plan_t *p, const devl_few_t *f, uint64_t i, uint64_t at)
{
    if (!p->dst)
        return p->base + at;
    return f ? f->dst[i] : p->dst[i];
}

/* The last copy whose place starts at or before x (pos(0) is 0). */
DEVL_FN uint64_t devl_find(const devl_plan_t *p, const devl_few_t *f, uint64_t x)
{
    uint64_t lo = 0, hi = p->n;
    while (hi - lo > 1) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (devl_pos(p, f, mid) <= x)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* The part of copy i inside [t0, t1): len bytes to copy, then zlen zeros. */
typedef struct devl_piece {
    const unsigned char *src;
    unsigned char *dst;
    uint32_t len, zlen;
} devl_piece_t;

DEVL_FN devl_piece_t devl_piece_of(const devl_plan_t *p, const devl_few_t *f, uint64_t i, uint64_t t0, uint64_t t1)
{
    uint64_t at = devl_pos(p, f, i), size = devl_size(p, f, i);
    uint64_t data_end = at + size, end = data_end + devl_pad(size, p->pad_align);
    uint64_t from = at > t0 ? at : t0, to = end < t1 ? end : t1;
    devl_piece_t pc;
    pc.dst = devl_dst(p, f, i, at) + (from - at);
    pc.len = from < data_end ? (uint32_t)((to < data_end ? to : data_end) - from) : 0;
    pc.src = pc.len ? devl_src(p, f, i) + (from - at) : 0;
    pc.zlen = to > from ? (uint32_t)(to - from) - pc.len : 0;
    return pc;
}

DEVL_FN void devl_piece_lane(const devl_piece_t *pc, unsigned lane, unsigned nl)
{
    if (pc->len)
        devl_copy_lane(pc->src, pc->dst, pc->len, lane, nl);
    for (uint32_t i = lane; i < pc->zlen; i += nl)
        pc->dst[pc->len + i] = 0;
}

/* Tile t covers [t0, t1) of the plan's virtual bytes. */
DEVL_FN uint64_t devl_tile_end(const devl_plan_t *p, uint64_t t0)
{
    return p->total - t0 < p->tile ? p->total : t0 + p->tile;
}

/* A piece small enough for one lane alone. */
DEVL_FN int devl_piece_alone(const devl_piece_t *pc)
{
    return pc->len + pc->zlen <= DEVL_LANE_PIECE;
}

#ifndef __CUDACC__
/* Positions in blocks, as the scan kernels compute them (device/pack.cu):
 * local[n] within each block of DEVL_SCAN_BLOCK, block[] the blocks' starts. */
static inline void devl_scan_cpu(const uint64_t *size, uint64_t n, uint32_t pad_align, uint64_t *local,
                                 uint64_t *block)
{
    uint64_t at = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (i % DEVL_SCAN_BLOCK == 0)
            block[i / DEVL_SCAN_BLOCK] = at;
        local[i] = at - block[i / DEVL_SCAN_BLOCK];
        at += size[i] + devl_pad(size[i], pad_align);
    }
}

/* A plan run on the CPU, warp by warp and lane by lane, in the steps the
 * CUDA kernel's warps take (device/pack.cu, tile_warp): for the emulated
 * backend and for tests. */
static inline void devl_run_plan_cpu(const devl_plan_t *p, const devl_few_t *f)
{
    uint64_t ntiles = (p->total + p->tile - 1) / p->tile;
    for (uint64_t t = 0; t < ntiles; t++) {
        uint64_t t0 = t * p->tile, t1 = devl_tile_end(p, t0);
        for (uint64_t b = devl_find(p, f, t0);; b += DEVL_LANES) {
            devl_piece_t pc[DEVL_LANES];
            int valid[DEVL_LANES], alone[DEVL_LANES], any = 0;
            for (unsigned lane = 0; lane < DEVL_LANES; lane++) {
                uint64_t j = b + lane;
                valid[lane] = j < p->n && devl_pos(p, f, j) < t1;
                any |= valid[lane];
                if (valid[lane])
                    pc[lane] = devl_piece_of(p, f, j, t0, t1);
                alone[lane] = valid[lane] && devl_piece_alone(&pc[lane]);
            }
            if (!any)
                break;
            for (unsigned lane = 0; lane < DEVL_LANES; lane++)
                if (alone[lane])
                    devl_piece_lane(&pc[lane], 0, 1);
            for (unsigned k = 0; k < DEVL_LANES; k++)
                if (valid[k] && !alone[k])
                    for (unsigned lane = 0; lane < DEVL_LANES; lane++)
                        devl_piece_lane(&pc[k], lane, DEVL_LANES);
        }
    }
}
#endif

#endif
