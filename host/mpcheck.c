/* Bounds and limits for a kept (pass-through) sub-header, without parsing it.
 *
 * A receiver that forwards an object must still know that its sub-header is
 * well-formed msgpack within the limits, but builds nothing from it. This
 * walk reads only the type bytes and lengths and allocates nothing: every
 * declared length must fit in what is left, every item is charged to the
 * node budget, and containers nest no deeper than the levels left. The
 * sub-headers of objects nested inside (the bin of an object marker) are
 * walked too, with the levels left at the marker: an object's sub-tree
 * starts at its depth + 1, so pass-through cannot escape the depth limit.
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

/* What one item's type byte and length field declare. */
typedef struct mp_head {
    uint64_t skip;  /* payload bytes after the header */
    uint64_t items; /* for containers: items inside */
    bool container, array, ext, bin;
} mp_head_t;

/* The fixed payload of a type byte that has no length field, or how many
 * bytes its big-endian length field takes (*lenbytes), or 0xc1 as invalid. */
static bool head_type(unsigned c, mp_head_t *h, unsigned *lenbytes)
{
    if (c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3)
        return true; /* fixint, nil, bool */
    if (c <= 0x8f) {
        h->container = true;
        h->items = 2 * (uint64_t)(c & 0x0f);
        return true;
    }
    if (c <= 0x9f) {
        h->container = h->array = true;
        h->items = c & 0x0f;
        return true;
    }
    if (c <= 0xbf) {
        h->skip = c & 0x1f;
        return true;
    }
    switch (c) {
    case 0xc4: case 0xc5: case 0xc6: h->bin = true; *lenbytes = 1u << (c - 0xc4); break;
    case 0xd9: *lenbytes = 1; break;                                 /* str8 */
    case 0xda: *lenbytes = 2; break;                                 /* str16 */
    case 0xdb: *lenbytes = 4; break;                                 /* str32 */
    case 0xc7: case 0xc8: case 0xc9:                                 /* ext8/16/32 (+type) */
        h->ext = true;
        *lenbytes = 1u << (c - 0xc7);
        h->skip = 1;
        break;
    case 0xca: h->skip = 4; break;
    case 0xcb: h->skip = 8; break;
    case 0xcc: case 0xd0: h->skip = 1; break;
    case 0xcd: case 0xd1: h->skip = 2; break;
    case 0xce: case 0xd2: h->skip = 4; break;
    case 0xcf: case 0xd3: h->skip = 8; break;
    case 0xd4: h->skip = 2; break;                                   /* fixext1 */
    case 0xd5: h->skip = 3; break;
    case 0xd6: h->skip = 5; break;
    case 0xd7: h->skip = 9; break;
    case 0xd8: h->skip = 17; break;
    case 0xdc: h->container = h->array = true; *lenbytes = 2; break; /* array16 */
    case 0xdd: h->container = h->array = true; *lenbytes = 4; break; /* array32 */
    case 0xde: h->container = true; *lenbytes = 2; break;            /* map16 */
    case 0xdf: h->container = true; *lenbytes = 4; break;            /* map32 */
    default: return false;                                           /* 0xc1: never used */
    }
    return true;
}

/* Read the header of the item at p[*pos] into *h and move *pos past it;
 * its payload (h->skip bytes) must fit in p[0..len). */
static gser_status_t head_read(const unsigned char *p, size_t len, size_t *pos, mp_head_t *h, const char **why)
{
    unsigned c = p[(*pos)++];
    unsigned lenbytes = 0; /* size of a big-endian length field */
    *h = (mp_head_t){0};
    if (!head_type(c, h, &lenbytes)) {
        *why = "holds an invalid byte";
        return GSER_ERR_FORMAT;
    }
    if (lenbytes) {
        if (len - *pos < lenbytes) {
            *why = "ends early";
            return GSER_ERR_TRUNCATED;
        }
        uint64_t n = be(p + *pos, lenbytes);
        *pos += lenbytes;
        if (h->container)
            h->items = (c == 0xde || c == 0xdf) ? 2 * n : n;
        else
            h->skip += n;
    }
    if (h->skip > len - *pos) {
        *why = "declares more bytes than it holds";
        return GSER_ERR_TRUNCATED;
    }
    return GSER_OK;
}

/* Walk the sub-header p[0..len) of an object marker within levels_left
 * levels; it must be one item with no trailing bytes (*err_off: where in p). */
static gser_status_t check_sub_header(const unsigned char *p, size_t len, size_t levels_left, size_t *nodes_left,
                                      size_t *err_off, const char **why)
{
    size_t sub_used, sub_off;
    gser_status_t st = gser__mp_check(p, len, levels_left, nodes_left, &sub_used, &sub_off, why);
    if (st == GSER_OK && sub_used != len) {
        sub_off = sub_used;
        *why = "has trailing bytes";
        st = GSER_ERR_FORMAT;
    }
    if (st)
        *err_off = sub_off;
    return st;
}

gser_status_t gser__mp_check(const unsigned char *p, size_t len, size_t max_depth, size_t *nodes_left, size_t *used,
                             size_t *err_off, const char **why)
{
    size_t left[MP_UNPACK_DEPTH + 1];
    size_t next[MP_UNPACK_DEPTH + 1];  /* index of the next item of each open container */
    bool marker[MP_UNPACK_DEPTH + 1];  /* an array that is (so far) an object marker */
    size_t depth = 0, pos = 0;
    if (max_depth > MP_UNPACK_DEPTH)
        max_depth = MP_UNPACK_DEPTH;
    left[0] = 1;
    next[0] = 0;
    marker[0] = false;
    for (;;) {
        *err_off = pos;
        if (pos >= len) {
            *why = "ends early";
            return GSER_ERR_TRUNCATED;
        }
        if (*nodes_left == 0) {
            *why = "has more items than the limit";
            return GSER_ERR_LIMIT_NODES;
        }
        (*nodes_left)--;
        mp_head_t h;
        gser_status_t st = head_read(p, len, &pos, &h, why);
        if (st)
            return st;
        /* [ext(6), type, family, version, base, count, sub-header]: the
         * sub-header is walked at the levels left below the marker. */
        size_t idx = next[depth]++;
        if (marker[depth] && idx == 0)
            marker[depth] = h.ext && h.skip == 1 && p[pos] == GSER_EXT_OBJECT;
        else if (marker[depth] && idx == 6 && h.bin) {
            size_t sub_off;
            if (max_depth < depth + 2) { /* its root would be deeper than the limit */
                *why = "nests deeper than the limit (an object's sub-tree counts)";
                return GSER_ERR_LIMIT_DEPTH;
            }
            st = check_sub_header(p + pos, (size_t)h.skip, max_depth - depth, nodes_left, &sub_off, why);
            if (st) {
                *err_off = pos + sub_off;
                return st;
            }
        }
        pos += (size_t)h.skip;
        left[depth]--;
        /* msgpack-c counts empty containers against its depth too. */
        if (h.container && depth + 1 > max_depth) {
            *why = "nests deeper than the limit";
            return GSER_ERR_LIMIT_DEPTH;
        }
        if (h.container && h.items) {
            /* Every item takes at least one byte: a count the input cannot
             * hold is a lie, and msgpack-c would allocate for it. */
            if (h.items > len - pos) {
                *why = "declares more items than it holds";
                return GSER_ERR_TRUNCATED;
            }
            left[++depth] = (size_t)h.items;
            next[depth] = 0;
            marker[depth] = h.array && h.items == 7;
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
