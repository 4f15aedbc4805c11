/* Encoding and checking of the control connection's hello and records and
 * of the message head (layout in wire.h and docs/ucx.md). Every field is
 * little-endian and read through memcpy, so the bytes may sit at any address. */
#include <endian.h>
#include <string.h>

#include "error.h"
#include "wire.h"

static const unsigned char hello_magic[8] = {0x89, 'G', 'S', 'E', 'R', 'U', 'C', 'X'};
static const unsigned char head_magic[4] = {'G', 'S', 'X', 'M'};

/* Fields are 2, 4 or 8 bytes and n is a constant at every call: each is one
 * unaligned load or store once inlined (the head is on every message's path,
 * and the byte loops were a tenth of a small message's transport work). */
static inline __attribute__((always_inline)) void put_le(unsigned char *p, uint64_t v, unsigned n)
{
    uint16_t v16;
    uint32_t v32;
    uint64_t v64;
    switch (n) {
    case 2:
        v16 = htole16((uint16_t)v);
        memcpy(p, &v16, 2);
        return;
    case 4:
        v32 = htole32((uint32_t)v);
        memcpy(p, &v32, 4);
        return;
    default:
        v64 = htole64(v);
        memcpy(p, &v64, 8);
        return;
    }
}

static inline __attribute__((always_inline)) uint64_t get_le(const unsigned char *p, unsigned n)
{
    uint16_t v16;
    uint32_t v32;
    uint64_t v64;
    switch (n) {
    case 2:
        memcpy(&v16, p, 2);
        return le16toh(v16);
    case 4:
        memcpy(&v32, p, 4);
        return le32toh(v32);
    default:
        memcpy(&v64, p, 8);
        return le64toh(v64);
    }
}

static size_t align_up(size_t n)
{
    return (n + GUX_HEAD_ALIGN - 1) & ~(size_t)(GUX_HEAD_ALIGN - 1);
}

void gux_hello_encode(const gux_hello_t *h, unsigned char out[GUX_HELLO_LEN])
{
    memset(out, 0, GUX_HELLO_LEN);
    memcpy(out, hello_magic, sizeof hello_magic);
    put_le(out + 8, h->wire_version, 4);
    put_le(out + 12, h->gser_wire_version, 4);
    put_le(out + 16, h->caps, 4);
    put_le(out + 20, h->flags, 4);
    put_le(out + 24, h->timeout_ms, 4);
    put_le(out + 28, h->mm_fifo, 4);
    memcpy(out + 32, h->nonce, GUX_NONCE_LEN);
}

gser_status_t gux_hello_decode(const unsigned char in[GUX_HELLO_LEN], gux_hello_t *out)
{
    if (memcmp(in, hello_magic, sizeof hello_magic) != 0)
        return gux_fail(GSER_ERR_BAD_MAGIC, "handshake: the peer is not a gser UCX endpoint (bad magic)");
    gux_hello_t h = {
        .wire_version = (uint32_t)get_le(in + 8, 4),
        .gser_wire_version = (uint32_t)get_le(in + 12, 4),
        .caps = (uint32_t)get_le(in + 16, 4),
        .flags = (uint32_t)get_le(in + 20, 4),
        .timeout_ms = (uint32_t)get_le(in + 24, 4),
    };
    memcpy(h.nonce, in + 32, GUX_NONCE_LEN);
    /* Another version may give these bytes a meaning: the caller reports
     * the version mismatch instead. Bytes 28..31 were reserved before
     * version 5, which carries the FIFO size there. */
    if (h.wire_version == GSER_UCX_WIRE_VERSION) {
        h.mm_fifo = (uint32_t)get_le(in + 28, 4);
        if (h.flags & ~(uint32_t)GUX_HELLO_SECRET)
            return gux_fail(GSER_ERR_FORMAT, "handshake: the peer's hello sets unknown flags (0x%x)", h.flags);
    }
    *out = h;
    return GSER_OK;
}

static const unsigned char rec_magic[4] = {'G', 'S', 'X', 'R'};

static const char *rec_name(unsigned type)
{
    switch (type) {
    case GUX_REC_PROOF: return "proof";
    case GUX_REC_SETUP: return "setup";
    case GUX_REC_HEARTBEAT: return "heartbeat";
    case GUX_REC_BYE: return "bye";
    case GUX_REC_READY: return "ready";
    default: return "unknown";
    }
}

void gux_rec_encode(const gux_rec_t *r, unsigned char out[GUX_REC_LEN])
{
    memcpy(out, rec_magic, 4);
    put_le(out + 4, r->type, 2);
    put_le(out + 6, r->reason, 2);
    put_le(out + 8, r->len, 4);
    put_le(out + 12, 0, 4);
}

gser_status_t gux_rec_decode(const unsigned char in[GUX_REC_LEN], unsigned allowed, gux_rec_t *out)
{
    if (memcmp(in, rec_magic, 4) != 0)
        return gux_fail(GSER_ERR_BAD_MAGIC, "handshake: a control record without its \"GSXR\" magic");
    gux_rec_t r = {.type = (uint16_t)get_le(in + 4, 2), .reason = (uint16_t)get_le(in + 6, 2),
                   .len = (uint32_t)get_le(in + 8, 4)};
    if (r.type < GUX_REC_PROOF || r.type > GUX_REC_READY || !(allowed & (1u << r.type)))
        return gux_fail(GSER_ERR_FORMAT, "handshake: a control record of type %u (%s) where it is not expected",
                        r.type, rec_name(r.type));
    if (get_le(in + 12, 4) != 0)
        return gux_fail(GSER_ERR_FORMAT, "handshake: a %s record with a nonzero reserved field", rec_name(r.type));
    uint32_t want_min = 0, want_max = 0;
    switch (r.type) {
    case GUX_REC_PROOF: want_min = want_max = GUX_MAC_LEN; break;
    case GUX_REC_SETUP: want_min = GUX_SETUP_FIXED + 1, want_max = GUX_SETUP_MAX; break;
    case GUX_REC_HEARTBEAT:
    case GUX_REC_READY: break;
    case GUX_REC_BYE: want_min = want_max = GUX_BYE_LEN; break;
    }
    if (r.len < want_min || r.len > want_max)
        return gux_fail(GSER_ERR_FORMAT, "handshake: a %s record of %u bytes (it has %u to %u)", rec_name(r.type),
                        r.len, want_min, want_max);
    if ((r.type == GUX_REC_BYE) != (r.reason != 0) || r.reason > GUX_BYE_ACCESS)
        return gux_fail(GSER_ERR_FORMAT, "handshake: a %s record with reason %u", rec_name(r.type), r.reason);
    *out = r;
    return GSER_OK;
}

gser_status_t gux_setup_decode(const unsigned char *body, size_t len, gux_setup_t *out)
{
    if (len <= GUX_SETUP_FIXED || len > GUX_SETUP_MAX)
        return gux_fail(GSER_ERR_FORMAT, "handshake: a setup record of %zu bytes", len);
    size_t k = (size_t)get_le(body + 4, 2);
    if (get_le(body + 6, 2) != 0)
        return gux_fail(GSER_ERR_FORMAT, "handshake: a setup record with a nonzero reserved field");
    if (k > GUX_SETUP_IPS_MAX || len - GUX_SETUP_FIXED <= k * GUX_IP_LEN)
        return gux_fail(GSER_ERR_FORMAT, "handshake: a setup record of %zu bytes lists %zu addresses", len, k);
    size_t alen = len - GUX_SETUP_FIXED - k * GUX_IP_LEN;
    if (alen > GUX_ADDR_MAX)
        return gux_fail(GSER_ERR_FORMAT, "handshake: a UCX worker address of %zu bytes", alen);
    gux_setup_t s = {.conn_id = (uint32_t)get_le(body, 4),
                     .ips = body + GUX_SETUP_FIXED,
                     .nips = k,
                     .addr = body + GUX_SETUP_FIXED + k * GUX_IP_LEN,
                     .addr_len = alen};
    *out = s;
    return GSER_OK;
}

/* Zero-byte frames always travel inline: they need no send of their own. */
static uint8_t route_of(const gser_frame_t *f, size_t i, const gux_route_policy_t *pol, size_t *budget)
{
    if (i == 0 || f->size == 0)
        return GUX_ROUTE_INLINE;
    if (f->memory == GSER_MEMORY_DEVICE)
        return pol->device_direct ? GUX_ROUTE_TAG : GUX_ROUTE_STAGED;
    if (f->size <= pol->inline_max && f->size <= *budget) {
        *budget -= f->size;
        return GUX_ROUTE_INLINE;
    }
    return pol->zchunk_min && f->size >= pol->zchunk_min ? GUX_ROUTE_ZCHUNKED : GUX_ROUTE_TAG;
}

gser_status_t gux_head_plan(const gser_frame_t *frames, size_t nframes, const gux_route_policy_t *pol,
                            uint8_t *routes, size_t *head_len)
{
    if (nframes == 0 || frames[0].memory != GSER_MEMORY_HOST)
        return gux_fail(GSER_ERR_INVALID_ARG, "send: frame 0 must be the header, in host memory");
    if (nframes > UINT32_MAX)
        return gux_fail(GSER_ERR_LIMIT_FRAMES, "send: %zu frames do not fit the frame table", nframes);
    size_t budget = pol->inline_budget;
    size_t len = GUX_HEAD_FIXED + GUX_HEAD_ENTRY * nframes;
    for (size_t i = 0; i < nframes; i++) {
        const gser_frame_t *f = &frames[i];
        if (f->size && !f->data)
            return gux_fail(GSER_ERR_INVALID_ARG, "send: frame %zu has %zu bytes but no data", i, f->size);
        if (f->memory != GSER_MEMORY_HOST && f->memory != GSER_MEMORY_DEVICE)
            return gux_fail(GSER_ERR_INVALID_ARG, "send: frame %zu has unknown memory kind %d", i, (int)f->memory);
        routes[i] = route_of(f, i, pol, &budget);
        if (routes[i] == GUX_ROUTE_INLINE) {
            if (f->size > SIZE_MAX / 2 - len)
                return gux_fail(GSER_ERR_INVALID_ARG, "send: frame %zu is too large", i);
            len = align_up(len) + f->size;
        }
    }
    *head_len = len;
    return GSER_OK;
}

void gux_head_write(const gser_frame_t *frames, size_t nframes, const uint8_t *routes, uint32_t seq, uint32_t chunk,
                    unsigned char *out, size_t head_len)
{
    memcpy(out, head_magic, 4);
    put_le(out + 4, GSER_UCX_WIRE_VERSION, 2);
    put_le(out + 6, 0, 2);
    put_le(out + 8, nframes, 4);
    put_le(out + 12, seq, 4);
    put_le(out + 16, chunk, 4);
    put_le(out + 20, 0, 4);
    size_t off = GUX_HEAD_FIXED + GUX_HEAD_ENTRY * nframes;
    for (size_t i = 0; i < nframes; i++) {
        unsigned char *e = out + GUX_HEAD_FIXED + GUX_HEAD_ENTRY * i;
        put_le(e, frames[i].size, 8);
        e[8] = (unsigned char)frames[i].memory;
        e[9] = routes[i];
        put_le(e + 10, 0, 2);
        put_le(e + 12, (uint32_t)frames[i].device, 4);
        if (routes[i] == GUX_ROUTE_INLINE) {
            size_t at = align_up(off);
            memset(out + off, 0, at - off);
            if (frames[i].size)
                memcpy(out + at, frames[i].data, frames[i].size);
            off = at + frames[i].size;
        }
    }
    (void)head_len; /* == off, by gux_head_plan */
}

void gux_head_set_zchunks(unsigned char *head, size_t nframes, const uint8_t *routes, int codec, uint32_t chunk)
{
    for (size_t i = 0; i < nframes; i++) {
        if (routes[i] != GUX_ROUTE_ZCHUNKED)
            continue;
        unsigned char *e = head + GUX_HEAD_FIXED + GUX_HEAD_ENTRY * i;
        put_le(e + 10, (uint64_t)codec, 2);
        put_le(e + 12, chunk, 4);
    }
}

gser_status_t gux_zchunk_check(const unsigned char *msg, size_t len, size_t i, size_t k, size_t nchunks,
                               size_t raw_len, bool *is_raw)
{
    if (len < GUX_ZCHUNK_PREFIX)
        return gux_fail(GSER_ERR_COMPRESSED, "receive: frame %zu, chunk %zu: an empty chunk", i, k);
    unsigned flags = msg[0];
    if (flags & ~(unsigned)(GUX_ZCHUNK_RAW | GUX_ZCHUNK_LAST))
        return gux_fail(GSER_ERR_COMPRESSED, "receive: frame %zu, chunk %zu: unknown flags 0x%02x", i, k, flags);
    bool last = (flags & GUX_ZCHUNK_LAST) != 0;
    if (last && k + 1 < nchunks)
        return gux_fail(GSER_ERR_COMPRESSED,
                        "receive: frame %zu, chunk %zu: marked the last, but the frame's size needs %zu chunks", i, k,
                        nchunks);
    if (!last && k + 1 == nchunks)
        return gux_fail(GSER_ERR_COMPRESSED,
                        "receive: frame %zu, chunk %zu: not marked the last, but the frame's size needs %zu chunks", i,
                        k, nchunks);
    bool raw = (flags & GUX_ZCHUNK_RAW) != 0;
    if (raw && len - GUX_ZCHUNK_PREFIX != raw_len)
        return gux_fail(GSER_ERR_COMPRESSED, "receive: frame %zu, chunk %zu: a raw chunk of %zu bytes where %zu are due",
                        i, k, len - GUX_ZCHUNK_PREFIX, raw_len);
    if (!raw && len - GUX_ZCHUNK_PREFIX >= raw_len)
        return gux_fail(GSER_ERR_COMPRESSED,
                        "receive: frame %zu, chunk %zu: %zu compressed bytes for %zu raw ones (a chunk that does not "
                        "shrink travels raw)",
                        i, k, len - GUX_ZCHUNK_PREFIX, raw_len);
    *is_raw = raw;
    return GSER_OK;
}

gser_status_t gux_head_parse_fixed(const unsigned char *head, size_t len, size_t max_frames, gux_head_info_t *info)
{
    if (len < GUX_HEAD_FIXED)
        return gux_fail(GSER_ERR_TRUNCATED, "message head of %zu bytes is shorter than its fixed part", len);
    if (memcmp(head, head_magic, 4) != 0)
        return gux_fail(GSER_ERR_BAD_MAGIC, "message head has no \"GSXM\" magic");
    uint64_t version = get_le(head + 4, 2);
    if (version != GSER_UCX_WIRE_VERSION)
        return gux_fail(GSER_ERR_WIRE_VERSION, "message head is transport wire version %llu, this build speaks %d",
                        (unsigned long long)version, GSER_UCX_WIRE_VERSION);
    if (get_le(head + 6, 2) != 0 || get_le(head + 20, 4) != 0)
        return gux_fail(GSER_ERR_FORMAT, "message head has unknown flags or a nonzero reserved field");
    uint64_t n = get_le(head + 8, 4);
    if (n == 0)
        return gux_fail(GSER_ERR_FORMAT, "message head lists no frames (frame 0 is the header)");
    if (n - 1 > max_frames)
        return gux_fail(GSER_ERR_LIMIT_FRAMES, "message has %llu data frames, the limit is %zu",
                        (unsigned long long)(n - 1), max_frames);
    if (n > (len - GUX_HEAD_FIXED) / GUX_HEAD_ENTRY)
        return gux_fail(GSER_ERR_TRUNCATED, "message head of %zu bytes cannot hold a table of %llu frames", len,
                        (unsigned long long)n);
    gux_head_info_t in = {.nframes = (uint32_t)n,
                          .seq = (uint32_t)get_le(head + 12, 4),
                          .chunk = (uint32_t)get_le(head + 16, 4)};
    *info = in;
    return GSER_OK;
}

gser_status_t gux_head_parse_table(const unsigned char *head, size_t len, uint64_t max_bytes, gux_head_info_t *info,
                                   gux_head_frame_t *out)
{
    size_t n = info->nframes;
    size_t off = GUX_HEAD_FIXED + GUX_HEAD_ENTRY * n; /* fits: checked by gux_head_parse_fixed */
    uint64_t total = 0;
    bool staged = false;
    for (size_t i = 0; i < n; i++) {
        const unsigned char *e = head + GUX_HEAD_FIXED + GUX_HEAD_ENTRY * i;
        gux_head_frame_t f = {.size = get_le(e, 8), .memory = e[8], .route = e[9],
                              .device = (int32_t)(uint32_t)get_le(e + 12, 4)};
        if (f.route == GUX_ROUTE_ZCHUNKED) {
            /* codec and chunk size where other routes have reserved bits and a device */
            uint64_t codec = get_le(e + 10, 2), chunk = (uint32_t)f.device;
            if (f.memory != GSER_MEMORY_HOST)
                return gux_fail(GSER_ERR_FORMAT, "frame %zu: compressed chunks of device memory", i);
            if (codec != GSER_COMPRESSION_LZ4 && codec != GSER_COMPRESSION_ZSTD)
                return gux_fail(GSER_ERR_COMPRESSED, "frame %zu: compressed chunks of unknown codec %llu", i,
                                (unsigned long long)codec);
            if (chunk < GSER_UCX_CHUNK_MIN || chunk > GSER_UCX_CHUNK_MAX)
                return gux_fail(GSER_ERR_COMPRESSED, "frame %zu: a compressed chunk size of %llu bytes (%zu to %zu)",
                                i, (unsigned long long)chunk, GSER_UCX_CHUNK_MIN, GSER_UCX_CHUNK_MAX);
            f.codec = (uint8_t)codec;
            f.zchunk = (uint32_t)chunk;
            f.device = 0;
        } else if (f.memory > GSER_MEMORY_DEVICE || f.route > GUX_ROUTE_STAGED || get_le(e + 10, 2) != 0) {
            return gux_fail(GSER_ERR_FORMAT, "frame table entry %zu has memory %u, route %u or reserved bits", i,
                            f.memory, f.route);
        }
        if (i == 0 && (f.memory != GSER_MEMORY_HOST || f.route != GUX_ROUTE_INLINE))
            return gux_fail(GSER_ERR_FORMAT, "frame 0 (the header) must be inline host memory");
        if (f.size > max_bytes - total)
            return gux_fail(GSER_ERR_LIMIT_BYTES, "message frames hold more than the limit of %llu bytes",
                            (unsigned long long)max_bytes);
        total += f.size;
        if (f.route == GUX_ROUTE_INLINE) {
            size_t at = align_up(off);
            if (at > len || f.size > len - at)
                return gux_fail(GSER_ERR_TRUNCATED, "inlined frame %zu (%llu bytes) runs past the %zu-byte head", i,
                                (unsigned long long)f.size, len);
            f.offset = at;
            off = at + (size_t)f.size;
        } else if (f.size == 0) {
            return gux_fail(GSER_ERR_FORMAT, "frame %zu is empty but not inline", i);
        }
        if (f.route == GUX_ROUTE_STAGED)
            staged = true;
        out[i] = f;
    }
    if (off != len)
        return gux_fail(GSER_ERR_FORMAT, "message head has %zu bytes, its frames end at %zu", len, off);
    if (staged && info->chunk == 0)
        return gux_fail(GSER_ERR_FORMAT, "message has staged frames but a staging chunk of 0 bytes");
    info->total_bytes = total;
    return GSER_OK;
}

uint64_t gux_head_max(size_t max_frames, uint64_t max_bytes)
{
    uint64_t n = (uint64_t)max_frames + 1;
    uint64_t fixed = GUX_HEAD_FIXED + (GUX_HEAD_ENTRY + GUX_HEAD_ALIGN) * n;
    return max_bytes > UINT64_MAX - fixed ? UINT64_MAX : max_bytes + fixed;
}

bool gux_short_fits(const gser_frame_t *frames, size_t nframes)
{
    return nframes == 1 && frames[0].memory == GSER_MEMORY_HOST && frames[0].data &&
           frames[0].size > GUX_SHORT_PREFIX_LEN && memcmp(frames[0].data, GUX_SHORT_PREFIX, GUX_SHORT_PREFIX_LEN) == 0;
}
