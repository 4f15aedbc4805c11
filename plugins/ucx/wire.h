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

/* ---- the control connection (docs/ucx.md section 2) --------------------------
 *
 * A TCP connection that gser owns. The connecting side sends its hello; the
 * listening side checks it and answers with its own; with a shared secret
 * each side then proves it holds it; each side sends a setup record with its
 * connection id and UCX worker address; afterwards only heartbeats and a
 * final bye travel on it. */

#define GUX_HELLO_LEN 64
#define GUX_NONCE_LEN 32
#define GUX_MAC_LEN 32
/* The longest UCX worker address a peer may send. */
#define GUX_ADDR_MAX 65536

/* Hello flags. */
enum {
    GUX_HELLO_SECRET = 1u << 0, /* this side holds a shared secret and proves it */
};

typedef struct gux_hello {
    uint32_t wire_version;      /* GSER_UCX_WIRE_VERSION */
    uint32_t gser_wire_version; /* GSER_WIRE_VERSION */
    uint32_t caps;              /* GSER_UCX_CAP_* */
    uint32_t flags;             /* GUX_HELLO_* */
    uint32_t timeout_ms;        /* this side's peer timeout (0: none): the peer heartbeats often enough for it */
    uint32_t mm_fifo;           /* this side's shared-memory FIFO size in segments (version 5; 0 before) */
    unsigned char nonce[GUX_NONCE_LEN];
} gux_hello_t;

GUX_HIDDEN void gux_hello_encode(const gux_hello_t *h, unsigned char out[GUX_HELLO_LEN]);
/* GSER_ERR_BAD_MAGIC if the bytes are not a gser UCX hello. Versions are
 * returned as sent (the caller compares them); the flags are checked only
 * when the version is this build's (GSER_ERR_FORMAT). The FIFO size is
 * read only from a version-5 hello (0 from others). */
GUX_HIDDEN gser_status_t gux_hello_decode(const unsigned char in[GUX_HELLO_LEN], gux_hello_t *out);

/* Records after the hellos: a 16-byte header, then len bytes of body.
 *
 *   0  4  magic "GSXR"
 *   4  2  type (GUX_REC_*)
 *   6  2  reason (a bye's GUX_BYE_*, else 0)
 *   8  4  length of the body
 *   12 4  reserved (0)
 */
#define GUX_REC_LEN 16

enum {
    GUX_REC_PROOF = 1,     /* body: the HMAC proof, GUX_MAC_LEN bytes */
    GUX_REC_SETUP = 2,     /* body: u32 connection id, u16 k, u16 reserved (0), k IP addresses, the UCX worker address */
    GUX_REC_HEARTBEAT = 3, /* no body */
    GUX_REC_BYE = 4,       /* body: u64 value (GUX_BYE_SILENT: ms heard nothing; GUX_BYE_ERROR: -status) */
    GUX_REC_READY = 5,     /* no body: the listening side's UCX endpoint is connected */
};

enum {
    GUX_BYE_CLOSING = 1, /* closed by the application */
    GUX_BYE_SILENT = 2,  /* heard nothing from the other side for too long */
    GUX_BYE_ERROR = 3,   /* failed (a transport error, a malformed message) */
    GUX_BYE_ACCESS = 4,  /* the other side's proof of the secret was wrong */
};

typedef struct gux_rec {
    uint16_t type;
    uint16_t reason;
    uint32_t len;
} gux_rec_t;

#define GUX_SETUP_FIXED 8
/* A setup record lists up to this many IP addresses of its sender, 16
 * bytes each (IPv4 as ::ffff:a.b.c.d): where its UCX may connect from. */
#define GUX_SETUP_IPS_MAX 64
#define GUX_IP_LEN 16
#define GUX_SETUP_MAX (GUX_SETUP_FIXED + GUX_SETUP_IPS_MAX * GUX_IP_LEN + GUX_ADDR_MAX)
#define GUX_BYE_LEN 8

GUX_HIDDEN void gux_rec_encode(const gux_rec_t *r, unsigned char out[GUX_REC_LEN]);
/* Check a record header: magic, a type in the allowed mask (bits 1 << type),
 * a body length that type allows, a known bye reason, reserved zero.
 * GSER_ERR_BAD_MAGIC or GSER_ERR_FORMAT with a message naming what. */
GUX_HIDDEN gser_status_t gux_rec_decode(const unsigned char in[GUX_REC_LEN], unsigned allowed, gux_rec_t *out);

/* A setup body of len bytes: the peer's connection id, its IP addresses
 * (*nips of GUX_IP_LEN bytes at *ips), and where its worker address starts
 * (*addr_len bytes, at least 1). */
typedef struct gux_setup {
    uint32_t conn_id;
    const unsigned char *ips;
    size_t nips;
    const unsigned char *addr;
    size_t addr_len;
} gux_setup_t;

GUX_HIDDEN gser_status_t gux_setup_decode(const unsigned char *body, size_t len, gux_setup_t *out);

/* ---- the shared secret (auth.c) ------------------------------------------------- */

GUX_HIDDEN void gux_hmac_sha256(const void *key, size_t key_len, const void *const *parts, const size_t *lens,
                                size_t nparts, unsigned char out[GUX_MAC_LEN]);
/* The proof one side (server or client) sends: HMAC-SHA-256 keyed by the
 * secret over a label, the role and both hellos. */
GUX_HIDDEN void gux_proof(const void *secret, size_t secret_len, bool server,
                          const unsigned char client_hello[GUX_HELLO_LEN],
                          const unsigned char server_hello[GUX_HELLO_LEN], unsigned char out[GUX_MAC_LEN]);
/* Compare two proofs in time that does not depend on where they differ. */
GUX_HIDDEN bool gux_mac_equal(const unsigned char a[GUX_MAC_LEN], const unsigned char b[GUX_MAC_LEN]);
/* Random bytes for a nonce (getrandom). */
GUX_HIDDEN gser_status_t gux_nonce(unsigned char out[GUX_NONCE_LEN]);

/* ---- tags ---------------------------------------------------------------------
 * 63..32 the receiver's connection id, 31..28 kind, 27..0 message sequence. */

enum {
    GUX_KIND_HEAD = 1,
    GUX_KIND_FRAME = 2,
    GUX_KIND_CHUNK = 3,
    GUX_KIND_PROBE = 4, /* probe.c, connection 0 */
    GUX_KIND_SHORT = 5, /* a message of one frame, sent as that frame without its magic */
    GUX_KIND_ZCHUNK = 6, /* a chunk of a frame sent in compressed chunks (route 3) */
};

#define GUX_SEQ_MASK 0x0fffffffu
#define GUX_TAG_MASK_KIND ((uint64_t)0xf << 28)
/* Kinds 1 and 5 differ in bit 30 alone: one probe finds either form of head. */
#define GUX_TAG_MASK_HEADS ((uint64_t)0xb << 28)
#define GUX_TAG_MASK_CONN ((uint64_t)0xffffffffu << 32)
#define GUX_TAG_MASK_CONN_KIND (((uint64_t)0xffffffffu << 32) | GUX_TAG_MASK_KIND)
#define GUX_TAG_MASK_CONN_HEADS (((uint64_t)0xffffffffu << 32) | GUX_TAG_MASK_HEADS)
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
static inline unsigned gux_tag_kind(uint64_t tag)
{
    return (unsigned)(tag >> 28) & 0xf;
}

/* ---- the short head: a message of one frame -------------------------------------
 * A message whose only frame is a host header starting with the 7 bytes every
 * gser header starts with (wire-format.md 3.1) travels as one send of kind
 * GUX_KIND_SHORT: the header without those 7 bytes, its sequence number in
 * the tag. The 47 bytes it saves over a head keep a small message within
 * fewer cache lines of UCX's shared-memory queue, which is most of the time
 * a small message takes. The receiver writes the 7 bytes back in front. */

#define GUX_SHORT_PREFIX "\x94\xd6\x01GSER" /* fixarray of 4, fixext4 type 1 "GSER" */
#define GUX_SHORT_PREFIX_LEN 7

/* Can this message travel as a short head? */
GUX_HIDDEN bool gux_short_fits(const gser_frame_t *frames, size_t nframes);

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

enum { GUX_ROUTE_INLINE = 0, GUX_ROUTE_TAG = 1, GUX_ROUTE_STAGED = 2, GUX_ROUTE_ZCHUNKED = 3 };

/* How the sender routes each frame; decided once, used to size and write the head. */
typedef struct gux_route_policy {
    size_t inline_max;    /* host frames up to this size are inlined ... */
    size_t inline_budget; /* ... while the inlined bytes stay within this */
    bool device_direct;   /* both sides' UCX move device memory */
    size_t zchunk_min;    /* host frames of at least this size go in compressed chunks (0: none do) */
} gux_route_policy_t;

/* ---- route 3: a host frame in compressed chunks (GSER_UCX_CAP_CHUNKED) ----------------
 * Its table entry: size = the frame's raw bytes, memory 0, route 3, bytes
 * 10..11 the codec (1 lz4, 2 zstd) where other routes have zero, bytes
 * 12..15 the chunk size (GSER_UCX_CHUNK_MIN..MAX) where others have the
 * device ordinal. The frame follows as ceil(size / chunk) sends of kind
 * GUX_KIND_ZCHUNK, in chunk order (after the staged chunks of frames
 * before it, frame by frame): one flag byte, then the chunk compressed,
 * or raw (GUX_ZCHUNK_RAW) when it did not shrink to 0.9 of its size.
 * The last chunk of the frame says so (GUX_ZCHUNK_LAST), so that a
 * sender that sends more or fewer chunks than the size needs is caught at
 * the chunk where they part. */
enum { GUX_ZCHUNK_RAW = 1u << 0, GUX_ZCHUNK_LAST = 1u << 1 };
#define GUX_ZCHUNK_PREFIX 1

/* Write codec and chunk into the route-3 entries of a head written by
 * gux_head_write. */
GUX_HIDDEN void gux_head_set_zchunks(unsigned char *head, size_t nframes, const uint8_t *routes, int codec,
                                     uint32_t chunk);

/* Check chunk k of frame i (nchunks in all) as received: len bytes at msg,
 * whose raw part is raw_len bytes. GSER_ERR_COMPRESSED naming the frame and
 * the chunk; *is_raw on success. */
GUX_HIDDEN gser_status_t gux_zchunk_check(const unsigned char *msg, size_t len, size_t i, size_t k, size_t nchunks,
                                          size_t raw_len, bool *is_raw);

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
    size_t offset;  /* inline: where its bytes start in the head */
    uint8_t codec;  /* route 3: GSER_COMPRESSION_LZ4 or _ZSTD */
    uint32_t zchunk; /* route 3: bytes per chunk */
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
