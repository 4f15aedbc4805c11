/* Bounds and limits for untrusted msgpack, checked before msgpack-c sees it.
 *
 * msgpack-c's C unpacker has no limits: it allocates an array's elements from
 * the declared count before reading them (5 bytes can ask for 96 GB) and
 * gives up at 32 nested containers with a generic error. This walk reads only
 * the type bytes and lengths, allocates nothing, and rejects what msgpack-c
 * should not be given, with a precise status and offset. Decoding itself is
 * left to msgpack-c.
 */
#include "internal.h"

/* msgpack-c's MSGPACK_EMBED_STACK_SIZE: the most containers open at once. */
#define MP_UNPACK_DEPTH 32

static uint64_t be(const unsigned char *p, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

gser_status_t mp_check(const unsigned char *p, size_t len, size_t max_depth, size_t *nodes_left, size_t *used,
                       size_t *err_off)
{
    size_t left[MP_UNPACK_DEPTH + 1];
    size_t depth = 0, pos = 0;
    if (max_depth > MP_UNPACK_DEPTH)
        max_depth = MP_UNPACK_DEPTH;
    left[0] = 1;
    for (;;) {
        size_t at = pos;
        *err_off = at;
        if (pos >= len)
            return GSER_ERR_TRUNCATED;
        if (*nodes_left == 0)
            return GSER_ERR_LIMIT_NODES;
        (*nodes_left)--;
        unsigned c = p[pos++];
        uint64_t skip = 0;   /* payload bytes after the header */
        uint64_t items = 0;  /* for containers: items inside */
        bool container = false;
        unsigned lenbytes = 0; /* size of a big-endian length field */
        if (c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3) {
            /* fixint, nil, bool */
        } else if (c <= 0x8f) {
            container = true;
            items = 2 * (uint64_t)(c & 0x0f);
        } else if (c <= 0x9f) {
            container = true;
            items = c & 0x0f;
        } else if (c <= 0xbf) {
            skip = c & 0x1f;
        } else {
            switch (c) {
            case 0xc4: case 0xd9: lenbytes = 1; break;                   /* bin8, str8 */
            case 0xc5: case 0xda: lenbytes = 2; break;                   /* bin16, str16 */
            case 0xc6: case 0xdb: lenbytes = 4; break;                   /* bin32, str32 */
            case 0xc7: lenbytes = 1; skip = 1; break;                    /* ext8 (+type) */
            case 0xc8: lenbytes = 2; skip = 1; break;                    /* ext16 */
            case 0xc9: lenbytes = 4; skip = 1; break;                    /* ext32 */
            case 0xca: skip = 4; break;
            case 0xcb: skip = 8; break;
            case 0xcc: case 0xd0: skip = 1; break;
            case 0xcd: case 0xd1: skip = 2; break;
            case 0xce: case 0xd2: skip = 4; break;
            case 0xcf: case 0xd3: skip = 8; break;
            case 0xd4: skip = 2; break;                                  /* fixext1 */
            case 0xd5: skip = 3; break;
            case 0xd6: skip = 5; break;
            case 0xd7: skip = 9; break;
            case 0xd8: skip = 17; break;
            case 0xdc: container = true; lenbytes = 2; break;            /* array16 */
            case 0xdd: container = true; lenbytes = 4; break;            /* array32 */
            case 0xde: container = true; lenbytes = 2; break;            /* map16 */
            case 0xdf: container = true; lenbytes = 4; break;            /* map32 */
            default: return GSER_ERR_FORMAT;                             /* 0xc1: never used */
            }
            if (lenbytes) {
                if (len - pos < lenbytes)
                    return GSER_ERR_TRUNCATED;
                uint64_t n = be(p + pos, lenbytes);
                pos += lenbytes;
                if (container)
                    items = (c == 0xde || c == 0xdf) ? 2 * n : n;
                else
                    skip += n;
            }
        }
        if (skip > len - pos)
            return GSER_ERR_TRUNCATED;
        pos += (size_t)skip;
        left[depth]--;
        /* msgpack-c counts empty containers against its depth too. */
        if (container && depth + 1 > max_depth)
            return GSER_ERR_LIMIT_DEPTH;
        if (container && items) {
            /* Every item takes at least one byte: a count the input cannot
             * hold is a lie, and msgpack-c would allocate for it. */
            if (items > len - pos)
                return GSER_ERR_TRUNCATED;
            left[++depth] = (size_t)items;
        }
        while (left[depth] == 0) {
            if (depth == 0) {
                *used = pos;
                return GSER_OK;
            }
            depth--;
        }
    }
}
