/* The transport's wire layout (docs/ucx.md): the handshake record, the
 * per-message head (fixed part, frame table, inlined frames) and the tag
 * layout. Pure functions on bytes; no UCX here, so the fuzzable parsing
 * can be tested on its own. Not installed. */
#ifndef GSER_UCX_WIRE_H
#define GSER_UCX_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gser/serialize.h"
#include "gser/ucx.h"

#define GUX_HIDDEN __attribute__((visibility("hidden")))

/* ---- handshake -------------------------------------------------------------- */

#define GUX_HELLO_LEN 32

typedef struct gux_hello {
    uint32_t wire_version;      /* GSER_UCX_WIRE_VERSION */
    uint32_t gser_wire_version; /* GSER_WIRE_VERSION */
    uint32_t caps;              /* GSER_UCX_CAP_* */
    uint32_t conn_id;           /* what the peer puts in the tags it sends to us */
} gux_hello_t;

GUX_HIDDEN void gux_hello_encode(const gux_hello_t *h, unsigned char out[GUX_HELLO_LEN]);
/* GSER_ERR_BAD_MAGIC if the bytes are not a gser UCX hello. Versions are
 * returned as sent; the caller compares them. */
GUX_HIDDEN gser_status_t gux_hello_decode(const unsigned char in[GUX_HELLO_LEN], gux_hello_t *out);

/* ---- tags ---------------------------------------------------------------------
 * 63..32 the receiver's connection id, 31..28 kind, 27..0 message sequence. */

enum { GUX_KIND_HEAD = 1, GUX_KIND_FRAME = 2, GUX_KIND_CHUNK = 3 };

#define GUX_SEQ_MASK 0x0fffffffu
#define GUX_TAG_MASK_KIND ((uint64_t)0xf << 28)
#define GUX_TAG_MASK_CONN_KIND (((uint64_t)0xffffffffu << 32) | GUX_TAG_MASK_KIND)
#define GUX_TAG_MASK_ALL (~(uint64_t)0)

static inline uint64_t gux_tag(uint32_t conn, unsigned kind, uint32_t seq)
{
    return ((uint64_t)conn << 32) | ((uint64_t)(kind & 0xf) << 28) | (seq & GUX_SEQ_MASK);
}
static inline uint32_t gux_tag_conn(uint64_t tag)
{
    return (uint32_t)(tag >> 32);
}
static inline uint32_t gux_tag_seq(uint64_t tag)
{
    return (uint32_t)tag & GUX_SEQ_MASK;
}

/* ---- the head: the first send of every message -----------------------------------
 *
 *   0   4   magic "GSXM"
 *   4   2   wire version
 *   6   2   flags (0)
 *   8   4   n = frames, header included (>= 1)
 *   12  4   sequence number of the message on its endpoint
 *   16  4   staging chunk bytes (0 when no frame is staged)
 *   20  4   reserved (0)
 *   24  16n frame table: u64 size, u8 memory, u8 route, u16 reserved (0), i32 device
 *   then the inlined frames in frame order, each at a 16-byte aligned offset,
 *   zero padding between them; the head ends where the last inlined frame ends.
 */

#define GUX_HEAD_FIXED 24
#define GUX_HEAD_ENTRY 16
#define GUX_HEAD_ALIGN 16

enum { GUX_ROUTE_INLINE = 0, GUX_ROUTE_TAG = 1, GUX_ROUTE_STAGED = 2 };

/* How the sender routes each frame; decided once, used to size and write the head. */
typedef struct gux_route_policy {
    size_t inline_max;    /* host frames up to this size are inlined ... */
    size_t inline_budget; /* ... while the inlined bytes stay within this */
    bool device_direct;   /* both sides' UCX move device memory */
} gux_route_policy_t;

/* The route of each frame (routes[i]) and the head's length. GSER_ERR_INVALID_ARG
 * for a header frame not in host memory, GSER_ERR_LIMIT_FRAMES past 2^32-1 frames. */
GUX_HIDDEN gser_status_t gux_head_plan(const gser_frame_t *frames, size_t nframes, const gux_route_policy_t *pol,
                                       uint8_t *routes, size_t *head_len);

/* Write the head planned by gux_head_plan into out (head_len bytes). */
GUX_HIDDEN void gux_head_write(const gser_frame_t *frames, size_t nframes, const uint8_t *routes, uint32_t seq,
                               uint32_t chunk, unsigned char *out, size_t head_len);

/* One frame of a parsed head. */
typedef struct gux_head_frame {
    uint64_t size;
    uint8_t memory;
    uint8_t route;
    int32_t device;
    size_t offset; /* inline: where its bytes start in the head */
} gux_head_frame_t;

typedef struct gux_head_info {
    uint32_t nframes;
    uint32_t seq;
    uint32_t chunk;
    uint64_t total_bytes; /* all frames, header included */
} gux_head_info_t;

/* Check the fixed part of a head of len bytes and read it. Checks the frame
 * count against max_frames (data frames) before anything is allocated. */
GUX_HIDDEN gser_status_t gux_head_parse_fixed(const unsigned char *head, size_t len, size_t max_frames,
                                              gux_head_info_t *info);

/* Check and read the frame table into out[info->nframes]; every offset,
 * size, route and the byte total (<= max_bytes) is validated. */
GUX_HIDDEN gser_status_t gux_head_parse_table(const unsigned char *head, size_t len, uint64_t max_bytes,
                                              gux_head_info_t *info, gux_head_frame_t *out);

/* Longest head a message within these limits can have. */
GUX_HIDDEN uint64_t gux_head_max(size_t max_frames, uint64_t max_bytes);

#endif /* GSER_UCX_WIRE_H */
