/* Private definitions of the Arrow plugin. Not installed. */
#ifndef GSER_ARROW_INTERNAL_H
#define GSER_ARROW_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "gser/arrow.h"
#include "gser/extension.h"
#include "gser/gser.h"

#define ARROW_HIDDEN __attribute__((visibility("hidden")))

/* Deepest type nesting accepted (the plugin recurses over it). */
#define ARROW_MAX_DEPTH 64

/* First field of the objects behind an "arrow.array" value: which side made it. */
#define ARROW_MAGIC_SEND 0x53574f41u /* "AOWS" */
#define ARROW_MAGIC_RECV 0x52574f41u /* "AOWR" */

/* Physical layouts: what buffers and children a format has. */
typedef enum arrow_layout {
    LAYOUT_NULL,       /* no buffers */
    LAYOUT_BOOL,       /* validity, bit-packed values */
    LAYOUT_FIXED,      /* validity, width bytes per value */
    LAYOUT_VARLEN,     /* validity, offsets (width 4 or 8), bytes */
    LAYOUT_LIST,       /* validity, offsets (width 4 or 8); one child */
    LAYOUT_FIXED_LIST, /* validity; one child of list_size values per row */
    LAYOUT_STRUCT,     /* validity; any number of children, one row each per row */
} arrow_layout_t;

typedef struct arrow_fmt {
    arrow_layout_t layout;
    uint32_t width;     /* FIXED: bytes per value; VARLEN, LIST: bytes per offset */
    int64_t list_size;  /* FIXED_LIST */
    int n_buffers;
    int n_children;     /* -1: any (struct) */
    bool is_map;        /* LIST whose child must be a struct of two */
    bool is_index;      /* an integer type: may index a dictionary */
} arrow_fmt_t;

/* Parse a format string of the C Data Interface. GSER_ERR_UNSUPPORTED for
 * anything this plugin cannot carry (or that is malformed). */
ARROW_HIDDEN gser_status_t arrow_fmt_parse(const char *format, arrow_fmt_t *out);

/* Size of the metadata at p (int32 count, then int32-length-prefixed keys and
 * values, native endian), reading at most max bytes. false when malformed. */
ARROW_HIDDEN bool arrow_metadata_size(const unsigned char *p, size_t max, size_t *size);

/* What a buffer holds, by its index in the layout. */
typedef enum arrow_role { ROLE_VALIDITY, ROLE_BITS, ROLE_DATA, ROLE_OFFSETS, ROLE_BYTES } arrow_role_t;

ARROW_HIDDEN arrow_role_t arrow_buffer_role(const arrow_fmt_t *f, int i);

/* The gser dtype a buffer travels as: its element size gives the alignment a
 * receiver gets when the bytes arrive inline (host_aligned copies). */
ARROW_HIDDEN gser_dtype_t arrow_buffer_dtype(const arrow_fmt_t *f, int i);

/* Host bitmap helpers: bits [from, from + n) of src to bits [0, n) of dst
 * (the last byte's unused bits 0), and the number of set bits in a range. */
ARROW_HIDDEN void arrow_host_copy_bits(unsigned char *dst, const unsigned char *src, uint64_t from, uint64_t n);
ARROW_HIDDEN uint64_t arrow_host_count_bits(const unsigned char *src, uint64_t from, uint64_t n);

/* Offset i of an offsets buffer of width 4 or 8 (host memory, any alignment). */
/* Offset i of an int32 (width 4) or int64 offsets buffer, aligned or not. */
static inline int64_t arrow_offset_at(const void *offsets, uint32_t width, int64_t i)
{
    const unsigned char *p = (const unsigned char *)offsets + (size_t)i * width;
    if (width == 4) {
        int32_t v;
        memcpy(&v, p, 4);
        return v;
    }
    int64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* The first k in 1..count-1 where offset from+k is less than offset
 * from+k-1, or -1 when the offsets never decrease. */
ARROW_HIDDEN int64_t arrow_first_decrease(const void *offsets, uint32_t width, int64_t from, int64_t count);

/* The serializer and deserializer of both families (send.c, recv.c). */
ARROW_HIDDEN gser_status_t arrow_serialize(gser_context_t *ctx, const void *obj, gser_writer_t *w, void *user_data);
ARROW_HIDDEN gser_status_t arrow_deserialize(gser_context_t *ctx, gser_reader_t *r, void **obj_out,
                                             void *user_data);
ARROW_HIDDEN void arrow_recv_destroy(void *obj, void *user_data);

/* Keys of the sub-tree's root map (docs: plugins/arrow/README.md). */
#define ARROW_KEY_DEVICE "device"
#define ARROW_KEY_SCHEMA "schema"
#define ARROW_KEY_ARRAY "array"

/* Fields of a schema node on the wire. */
enum { SN_FORMAT, SN_NAME, SN_FLAGS, SN_METADATA, SN_NCHILDREN, SN_HAS_DICT, SN_COUNT_ };
/* Fields of an array node before its buffers. */
enum { AN_LENGTH, AN_NULL_COUNT, AN_BUFFERS };

#endif /* GSER_ARROW_INTERNAL_H */
