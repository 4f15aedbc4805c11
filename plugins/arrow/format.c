/* Format strings, metadata and bitmaps of the Arrow C Data Interface, shared
 * by the sender and the receiver (which parses untrusted strings with it). */
#include <string.h>

#include "internal.h"

/* A decimal number of at most 9 digits (no sign) ending at *end. */
static bool parse_uint(const char *s, const char **end, int64_t *v)
{
    int64_t n = 0;
    int digits = 0;
    while (*s >= '0' && *s <= '9' && digits < 10) {
        n = n * 10 + (*s - '0');
        s++;
        digits++;
    }
    if (digits == 0 || digits > 9)
        return false;
    *end = s;
    *v = n;
    return true;
}

static gser_status_t fixed(arrow_fmt_t *f, uint32_t width, bool index)
{
    f->layout = LAYOUT_FIXED;
    f->width = width;
    f->n_buffers = 2;
    f->is_index = index;
    return GSER_OK;
}

static gser_status_t offsets(arrow_fmt_t *f, arrow_layout_t layout, uint32_t width)
{
    f->layout = layout;
    f->width = width;
    f->n_buffers = layout == LAYOUT_VARLEN ? 3 : 2;
    f->n_children = layout == LAYOUT_LIST ? 1 : 0;
    return GSER_OK;
}

gser_status_t arrow_fmt_parse(const char *s, arrow_fmt_t *f)
{
    memset(f, 0, sizeof *f);
    if (!s || !*s)
        return GSER_ERR_UNSUPPORTED;
    if (s[1] == '\0') {
        switch (s[0]) {
        case 'n': f->layout = LAYOUT_NULL; return GSER_OK;
        case 'b': f->layout = LAYOUT_BOOL; f->n_buffers = 2; return GSER_OK;
        case 'c': case 'C': return fixed(f, 1, true);
        case 's': case 'S': return fixed(f, 2, true);
        case 'i': case 'I': return fixed(f, 4, true);
        case 'l': case 'L': return fixed(f, 8, true);
        case 'e': return fixed(f, 2, false);
        case 'f': return fixed(f, 4, false);
        case 'g': return fixed(f, 8, false);
        case 'u': case 'z': return offsets(f, LAYOUT_VARLEN, 4);
        case 'U': case 'Z': return offsets(f, LAYOUT_VARLEN, 8);
        default: return GSER_ERR_UNSUPPORTED;
        }
    }
    const char *end;
    int64_t n;
    if (s[0] == 't') {
        /* date, time, duration, interval: exactly three characters */
        static const struct {
            const char *fmt;
            uint32_t width;
        } times[] = {{"tdD", 4}, {"tdm", 8}, {"tts", 4}, {"ttm", 4}, {"ttu", 8}, {"ttn", 8},
                     {"tDs", 8}, {"tDm", 8}, {"tDu", 8}, {"tDn", 8}, {"tiM", 4}, {"tiD", 8},
                     {"tin", 16}};
        for (size_t i = 0; i < sizeof times / sizeof times[0]; i++)
            if (strcmp(s, times[i].fmt) == 0)
                return fixed(f, times[i].width, false);
        /* timestamp: "ts" unit ':' timezone (any, possibly empty) */
        if (s[1] == 's' && s[2] && strchr("smun", s[2]) && s[3] == ':')
            return fixed(f, 8, false);
        return GSER_ERR_UNSUPPORTED;
    }
    if (s[0] == 'd' && s[1] == ':') {
        /* decimal "d:P,S" (128 bits) or "d:P,S,B" with B in 32, 64, 128, 256 */
        int64_t prec, bits = 128;
        const char *p = s + 2;
        if (!parse_uint(p, &end, &prec) || prec < 1 || *end != ',')
            return GSER_ERR_UNSUPPORTED;
        p = end + 1;
        if (*p == '-')
            p++;
        int64_t scale;
        if (!parse_uint(p, &end, &scale))
            return GSER_ERR_UNSUPPORTED;
        if (*end == ',') {
            if (!parse_uint(end + 1, &end, &bits))
                return GSER_ERR_UNSUPPORTED;
        }
        if (*end != '\0' || (bits != 32 && bits != 64 && bits != 128 && bits != 256))
            return GSER_ERR_UNSUPPORTED;
        return fixed(f, (uint32_t)(bits / 8), false);
    }
    if (s[0] == 'w' && s[1] == ':') {
        if (!parse_uint(s + 2, &end, &n) || n < 1 || *end != '\0')
            return GSER_ERR_UNSUPPORTED;
        return fixed(f, (uint32_t)n, false);
    }
    if (s[0] == '+') {
        if (strcmp(s, "+l") == 0)
            return offsets(f, LAYOUT_LIST, 4);
        if (strcmp(s, "+L") == 0)
            return offsets(f, LAYOUT_LIST, 8);
        if (strcmp(s, "+m") == 0) {
            f->is_map = true;
            return offsets(f, LAYOUT_LIST, 4);
        }
        if (strcmp(s, "+s") == 0) {
            f->layout = LAYOUT_STRUCT;
            f->n_buffers = 1;
            f->n_children = -1;
            return GSER_OK;
        }
        if (s[1] == 'w' && s[2] == ':') {
            if (!parse_uint(s + 3, &end, &n) || *end != '\0')
                return GSER_ERR_UNSUPPORTED;
            f->layout = LAYOUT_FIXED_LIST;
            f->list_size = n;
            f->n_buffers = 1;
            f->n_children = 1;
            return GSER_OK;
        }
    }
    return GSER_ERR_UNSUPPORTED;
}

static bool read_i32(const unsigned char *p, size_t max, size_t at, int32_t *v)
{
    if (at > max || max - at < 4)
        return false;
    memcpy(v, p + at, 4);
    return true;
}

bool arrow_metadata_size(const unsigned char *p, size_t max, size_t *size)
{
    int32_t n;
    size_t at = 0;
    if (!read_i32(p, max, at, &n) || n < 0)
        return false;
    at += 4;
    for (int64_t i = 0; i < 2 * (int64_t)n; i++) { /* a key, then its value */
        int32_t len;
        if (!read_i32(p, max, at, &len) || len < 0)
            return false;
        at += 4;
        if ((size_t)len > max - at)
            return false;
        at += (size_t)len;
    }
    *size = at;
    return true;
}

arrow_role_t arrow_buffer_role(const arrow_fmt_t *f, int i)
{
    if (i == 0)
        return ROLE_VALIDITY;
    switch (f->layout) {
    case LAYOUT_BOOL: return ROLE_BITS;
    case LAYOUT_FIXED: return ROLE_DATA;
    case LAYOUT_VARLEN: return i == 1 ? ROLE_OFFSETS : ROLE_BYTES;
    default: return ROLE_OFFSETS; /* LAYOUT_LIST */
    }
}

gser_dtype_t arrow_buffer_dtype(const arrow_fmt_t *f, int i)
{
    switch (arrow_buffer_role(f, i)) {
    case ROLE_OFFSETS: return f->width == 4 ? GSER_DTYPE_INT32 : GSER_DTYPE_INT64;
    case ROLE_DATA:
        switch (f->width) {
        case 2: return GSER_DTYPE_UINT16;
        case 4: return GSER_DTYPE_UINT32;
        case 8: case 16: case 32: return GSER_DTYPE_UINT64; /* 8-byte alignment is all Arrow asks */
        default: return GSER_DTYPE_UINT8;                   /* 1 byte, and fixed-size binary */
        }
    default: return GSER_DTYPE_UINT8;
    }
}

void arrow_host_copy_bits(unsigned char *dst, const unsigned char *src, uint64_t from, uint64_t n)
{
    const unsigned char *in = src + from / 8;
    unsigned shift = (unsigned)(from % 8);
    uint64_t nbytes = (n + 7) / 8, in_bytes = (shift + n + 7) / 8;
    for (uint64_t j = 0; j < nbytes; j++) {
        unsigned v = in[j] >> shift;
        if (shift && j + 1 < in_bytes)
            v |= (unsigned)in[j + 1] << (8 - shift);
        if (j == nbytes - 1 && n % 8)
            v &= (1u << (n % 8)) - 1;
        dst[j] = (unsigned char)v;
    }
}

uint64_t arrow_host_count_bits(const unsigned char *src, uint64_t from, uint64_t n)
{
    uint64_t count = 0, i = from, end = from + n;
    for (; i < end && i % 8; i++)
        count += (src[i / 8] >> (i % 8)) & 1;
    for (; i + 8 <= end; i += 8)
        count += (uint64_t)__builtin_popcount(src[i / 8]);
    for (; i < end; i++)
        count += (src[i / 8] >> (i % 8)) & 1;
    return count;
}

int64_t arrow_first_decrease(const void *offsets, uint32_t width, int64_t from, int64_t count)
{
    /* A branch-free pass first (the common case: none), then the search for
     * the error message. Called on whole columns: keep it a tight loop. */
    int bad = 0;
    const unsigned char *p = (const unsigned char *)offsets + (size_t)from * width;
    if (width == 4) {
        for (int64_t k = 1; k < count; k++) {
            int32_t a, b; /* memcpy: buffers need not be aligned */
            memcpy(&a, p + 4 * (k - 1), 4);
            memcpy(&b, p + 4 * k, 4);
            bad |= b < a;
        }
    } else {
        for (int64_t k = 1; k < count; k++) {
            int64_t a, b;
            memcpy(&a, p + 8 * (k - 1), 8);
            memcpy(&b, p + 8 * k, 8);
            bad |= b < a;
        }
    }
    if (!bad)
        return -1;
    for (int64_t k = 1; k < count; k++)
        if (arrow_offset_at(offsets, width, from + k) < arrow_offset_at(offsets, width, from + k - 1))
            return k;
    return -1;
}
