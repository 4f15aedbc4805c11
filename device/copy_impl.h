/* The copy one warp does for one chunk, written once for the CUDA kernel and
 * for the emulated backend, which runs it lane by lane on the CPU so that CI
 * exercises the same index arithmetic as the GPU.
 *
 * Three paths, by the relative alignment of source and destination:
 * 16-byte vectors when they agree modulo 16, 4-byte words when they agree
 * modulo 4, and otherwise 4-byte stores built from two aligned source words
 * (a funnel shift). Heads and tails go byte by byte. No lane reads a byte
 * outside [src, src + len) or writes outside [dst, dst + len). */
#ifndef GSER_DEVICE_COPY_IMPL_H
#define GSER_DEVICE_COPY_IMPL_H

#include <stdint.h>

#include "plan.h"

#define GSER_LANES 32u

#ifdef __CUDACC__
#define GSER_HD static __host__ __device__ __forceinline__
#define GSER_COPY16(d, s) (*(uint4 *)(d) = *(const uint4 *)(s))
#define GSER_LOAD32(p) (*(const uint32_t *)(p))
#define GSER_STORE32(p, v) (*(uint32_t *)(p) = (v))
#else
#include <string.h>
#define GSER_HD static inline
#define GSER_COPY16(d, s) memcpy((d), (s), 16)
static inline uint32_t gser_load32_(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
#define GSER_LOAD32(p) gser_load32_(p)
#define GSER_STORE32(p, v)                                                                                   \
    do {                                                                                                     \
        uint32_t v_ = (v);                                                                                   \
        memcpy((p), &v_, 4);                                                                                 \
    } while (0)
#endif

/* Bytes hi:lo shifted right by 8*m (m = 1..3), low 32 bits, little-endian. */
GSER_HD uint32_t gser_funnel(uint32_t lo, uint32_t hi, unsigned m)
{
#ifdef __CUDA_ARCH__
    return __funnelshift_r(lo, hi, 8 * m);
#else
    return (uint32_t)((((uint64_t)hi << 32) | lo) >> (8 * m));
#endif
}

GSER_HD void gser_copy_bytes(const unsigned char *src, unsigned char *dst, uint64_t from, uint64_t to, unsigned lane)
{
    for (uint64_t i = from + lane; i < to; i += GSER_LANES)
        dst[i] = src[i];
}

GSER_HD void gser_copy_chunk_lane(const unsigned char *src, unsigned char *dst, uint64_t len, unsigned lane)
{
    uintptr_t s = (uintptr_t)src, d = (uintptr_t)dst;
    unsigned width = ((s ^ d) & 15) == 0 ? 16u : ((s ^ d) & 3) == 0 ? 4u : 0u;
    unsigned align = width == 16 ? 16u : 4u;
    uint64_t head = (align - (d & (align - 1))) & (align - 1);
    if (head > len)
        head = len;
    gser_copy_bytes(src, dst, 0, head, lane);
    uint64_t body = len - head;
    const unsigned char *s2 = src + head;
    unsigned char *d2 = dst + head;
    uint64_t done = head;
    if (width == 16) {
        uint64_t nvec = body / 16;
        for (uint64_t i = lane; i < nvec; i += GSER_LANES)
            GSER_COPY16(d2 + 16 * i, s2 + 16 * i);
        done += 16 * nvec;
    } else if (width == 4) {
        uint64_t nw = body / 4;
        for (uint64_t i = lane; i < nw; i += GSER_LANES)
            GSER_STORE32(d2 + 4 * i, GSER_LOAD32(s2 + 4 * i));
        done += 4 * nw;
    } else {
        /* d2 is 4-aligned, s2 is not: word k of the output is the aligned
         * source words a[k] and a[k + 1] shifted by m bytes. Words whose two
         * source words would reach outside the chunk are built from bytes. */
        unsigned m = (unsigned)((uintptr_t)s2 & 3);
        const unsigned char *a = s2 - m;
        uint64_t nw = body / 4;
        for (uint64_t k = lane; k < nw; k += GSER_LANES) {
            const unsigned char *w0 = a + 4 * k;
            uint32_t v;
            if (w0 >= src && w0 + 8 <= src + len) {
                v = gser_funnel(GSER_LOAD32(w0), GSER_LOAD32(w0 + 4), m);
            } else {
                const unsigned char *b = s2 + 4 * k;
                v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
            }
            GSER_STORE32(d2 + 4 * k, v);
        }
        done += 4 * nw;
    }
    gser_copy_bytes(src, dst, done, len, lane);
}

/* One chunk of a plan for one lane: its copy, then its zero padding. */
GSER_HD void gser_run_chunk_lane(const devl_chunk_t *ch, unsigned lane)
{
    gser_copy_chunk_lane(ch->src, ch->dst, ch->len, lane);
    for (uint32_t i = lane; i < ch->zpad; i += GSER_LANES)
        ch->dst[ch->len + i] = 0;
}

#endif
