/* Private definitions shared by the core's sources. Not installed. */
#ifndef GSER_HOST_INTERNAL_H
#define GSER_HOST_INTERNAL_H

#include <stdalign.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "copy.h"
#include "gser/extension.h"
#include "gser/gser.h"

#include "../device/device.h" /* the device layer: the only way from here to it */

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
/* Arrays and the flattened prefix are little-endian on the wire and are
 * handed out zero-copy; a big-endian port needs byte swaps in decode.c/flat.c. */
#error "gser supports little-endian hosts only"
#endif

#define GSER_INTERNAL __attribute__((visibility("hidden")))

/* A context keeps two spare messages and one spare frames object, reused
 * instead of malloc'd again (they are ~3 KiB and ~1 KiB, past malloc's fast
 * path: two of them cost a small message a tenth of its time). Off under
 * AddressSanitizer, so that a use after destroy still faults there. */
#if defined(__SANITIZE_ADDRESS__)
#define GSER_REUSE 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GSER_REUSE 0
#endif
#endif
#ifndef GSER_REUSE
#define GSER_REUSE 1
#endif

#define GSER_MAX_FAMILIES 32
#define GSER_FAMILY_NAME_MAX 63
#define GSER_TYPE_NAME_MAX 255

/* Defaults of gser_context_options_t / gser_limits_t. */
#define GSER_DEFAULT_INLINE_MAX 256
#define GSER_DEFAULT_ARRAY_MIN 16
#define GSER_DEFAULT_MAX_NODES ((size_t)1 << 24)
#define GSER_DEFAULT_MAX_FRAMES ((size_t)1 << 20)
#define GSER_DEFAULT_MAX_BYTES ((uint64_t)1 << 40)
#define GSER_DEFAULT_MAX_EXPANSION 64
#define GSER_DEFAULT_PACK_MAX ((size_t)1 << 20)

/* msgpack ext type codes of gser's own markers (docs/wire-format.md). */
enum {
    GSER_EXT_MAGIC = 1,  /* fixext4 "GSER": first element of the header */
    GSER_EXT_TUPLE = 2,  /* first element of an array that is a tuple */
    GSER_EXT_UINT = 3,   /* fixext8: a uint64 value, little-endian */
    GSER_EXT_BUFFER = 4, /* first element of [marker, dtype, shape, data] */
    GSER_EXT_ARRAY = 5,  /* first element of [marker, container, kind, count, data] */
    GSER_EXT_OBJECT = 6, /* first element of [marker, type, family, version, base, n, sub-header] */
};

/* An array marker's element codes besides the kinds bool, int, uint, float:
 * ints written narrower (int8, int16, int32), read back as int64. */
enum { GSER_ARRAY_INT8 = 32, GSER_ARRAY_INT16 = 33, GSER_ARRAY_INT32 = 34 };

/* ---- arena ------------------------------------------------------------- */

typedef struct arena_chunk {
    struct arena_chunk *next;
    size_t size;
    size_t used;
    alignas(16) unsigned char data[];
} arena_chunk_t;

typedef struct cleanup {
    struct cleanup *next;
    void (*fn)(void *arg);
    void *arg;
} cleanup_t;

#define GSER_ARENA_FIRST 3072

typedef struct arena {
    arena_chunk_t *head;
    size_t next_size;
    cleanup_t *cleanups; /* run in reverse order of registration */
    size_t total;        /* bytes taken from the heap since the first chunk */
    size_t budget;       /* 0: none; else growth past it fails, and over is set */
    bool over;
} arena_t;

GSER_INTERNAL void gser__arena_init(arena_t *a, arena_chunk_t *first, size_t first_size);
/* Run the release callbacks (newest first), then free the chunks: two steps
 * so that a message can release its frames between them. */
GSER_INTERNAL void gser__arena_run_cleanups(arena_t *a);
GSER_INTERNAL void gser__arena_free(arena_t *a, arena_chunk_t *first);
GSER_INTERNAL void *gser__arena_alloc_slow(arena_t *a, size_t size);

/* Vectors of more bytes than this live on the heap instead of the arena. */
#define ARENA_VEC_HEAP 4096

/* align is a power of two, at most 16. */
static inline void *gser__arena_alloc(arena_t *a, size_t size, size_t align)
{
    arena_chunk_t *h = a->head;
    size_t at = (h->used + align - 1) & ~(align - 1);
    if (at <= h->size && size <= h->size - at) {
        h->used = at + size;
        return h->data + at;
    }
    return gser__arena_alloc_slow(a, size); /* fresh chunks are 16-aligned */
}
/* Register fn(arg) to run when the arena is released. */
GSER_INTERNAL gser_status_t gser__arena_on_release(arena_t *a, void (*fn)(void *), void *arg);
/* Grow a heap vector *ptr of *cap elements to hold at least need; the vector
 * is freed when the arena is released (registered on first growth). */
GSER_INTERNAL gser_status_t gser__arena_vec_grow(arena_t *a, void **ptr, size_t *cap, size_t elem_size, size_t need);
static inline gser_status_t gser__arena_vec_reserve(arena_t *a, void **ptr, size_t *cap, size_t elem_size, size_t need)
{
    return need <= *cap ? GSER_OK : gser__arena_vec_grow(a, ptr, cap, elem_size, need);
}

/* ---- values ------------------------------------------------------------ */

enum {
    VF_OWNED = 1u << 0,    /* object: the message destroys it */
    VF_EXT_UINT = 1u << 1, /* a uint decoded from its ext (not a msgpack integer a marker field may be) */
};

typedef enum list_mode {
    LIST_BOXED = 0, /* items[] holds value pointers (also the empty state) */
    LIST_ARRAY = 1, /* arr holds unboxed scalars of arr_kind */
} list_mode_t;

typedef struct gser_list {
    list_mode_t mode;
    gser_kind_t arr_kind;
    bool explicit_array; /* built as an array (or decoded from one): stays one on the wire */
    bool arr_borrowed;   /* arr points at memory the message does not own */
    uint8_t marker;      /* while the list is decoded: MARK_* (host/decode.h) */
    size_t len;
    gser_value_t **items; /* LIST_BOXED */
    size_t items_cap;
    void *arr;            /* LIST_ARRAY */
    size_t arr_cap;
    gser_value_t **cache; /* boxed snapshots of arr elements, made on demand */
} gser_list_t;

typedef struct gser_pair {
    gser_value_t *key;
    gser_value_t *value;
} gser_pair_t;

typedef struct gser_map {
    size_t len;
    size_t cap;
    gser_pair_t *pairs;
} gser_map_t;

typedef struct gser_buffer {
    gser_buffer_desc_t desc; /* shape and strides point into the message */
    size_t first;            /* element 0 is this many bytes into the span */
    size_t span;             /* bytes the elements cover: what travels */
} gser_buffer_t;

typedef struct gser_type gser_type_t;

typedef struct gser_object {
    const gser_type_t *type;
    void *obj;
} gser_object_t;

typedef struct gser_serialized {
    const char *type_name;
    const char *family;
    uint32_t version;
    const unsigned char *header;
    size_t header_len;
    gser_frame_t *frames;
    size_t nframes;
    size_t depth; /* of the object where it was decoded: its sub-tree starts one deeper */
} gser_serialized_t;

struct gser_value {
    uint8_t kind;  /* gser_kind_t */
    uint8_t flags; /* VF_* */
    gser_msg_t *msg;
    union {
        bool b;
        int64_t i;
        uint64_t u;
        double f;
        struct {
            const char *ptr;
            size_t len;
        } s; /* str (arena copy, NUL-terminated) and bytes (borrowed) */
        gser_list_t *list;
        gser_map_t *map;
        gser_buffer_t *buf;
        gser_object_t *obj;
        gser_serialized_t *ser;
    } u;
};

typedef struct msg_res {
    void *ptr;
    size_t size;
    bool pinned;
} msg_res_t;

typedef struct msg_device {
    void *event; /* device-layer handle, recorded after the message's device work */
    void *stream;
    msg_res_t *res;
    size_t nres, cap;
    devl_batch_t **batches; /* plans of queued scatters */
    size_t nbatches, cap_batches;
} msg_device_t;

struct gser_msg {
    gser_context_t *ctx;
    msg_device_t *dev; /* device memory the message owns (host/msgdev.c), or NULL */
    gser_value_t *root;
    arena_t arena;
    const gser_frame_t *frames; /* what it was deserialized from; released last */
    size_t nframes;
    const struct frame_codec *codecs; /* per data frame when one arrived compressed, else NULL */
    void (*flat_release)(void *data, void *arg); /* owner of a flattened input */
    void *flat_arg;
    const void *flat_data;
    gser_value_t nil;
    alignas(16) unsigned char first_chunk[GSER_ARENA_FIRST];
};

/* Inline: building and decoding a message is mostly these. */
static inline void *gser__msg_alloc(gser_msg_t *msg, size_t size, size_t align)
{
    return gser__arena_alloc(&msg->arena, size, align);
}

static inline gser_value_t *gser__msg_value(gser_msg_t *msg, gser_kind_t kind)
{
    gser_value_t *v = (gser_value_t *)gser__arena_alloc(&msg->arena, sizeof *v, alignof(gser_value_t));
    if (v) {
        v->kind = (uint8_t)kind;
        v->flags = 0;
        v->msg = msg;
    }
    return v;
}

static inline void gser__copy_cstr(char *d, const char *s, size_t len)
{
    gser__copy_short(d, s, len);
    d[len] = '\0';
}

/* A NUL-terminated copy of s[0..len). */
static inline char *gser__msg_strdup(gser_msg_t *msg, const char *s, size_t len)
{
    if (len == SIZE_MAX)
        return NULL;
    char *d = (char *)gser__arena_alloc(&msg->arena, len + 1, 1);
    if (d)
        gser__copy_cstr(d, s, len);
    return d;
}

/* A str value with its NUL-terminated copy of s[0..len) right behind it:
 * one allocation, as strings are most of a control message. */
static inline gser_value_t *gser__msg_str_value(gser_msg_t *msg, const char *s, size_t len)
{
    if (len > SIZE_MAX - sizeof(gser_value_t) - 1)
        return NULL;
    gser_value_t *v = (gser_value_t *)gser__arena_alloc(&msg->arena, sizeof *v + len + 1, alignof(gser_value_t));
    if (v) {
        v->kind = GSER_KIND_STR;
        v->flags = 0;
        v->msg = msg;
        char *d = (char *)(v + 1);
        gser__copy_cstr(d, s, len);
        v->u.s.ptr = d;
        v->u.s.len = len;
    }
    return v;
}
/* The bytes the elements of a strided layout span, and where element 0 sits
 * in them, for ndim extents (each >= 0) and byte strides of es-byte
 * elements; no elements span nothing. 0 when fine, else 1 + the dimension at
 * which the span passes INT64_MAX. */
GSER_INTERNAL uint32_t gser__layout_span(uint32_t ndim, const int64_t *shape, const int64_t *strides, size_t es,
                                         size_t *first, size_t *span);
/* Whether strides lay the shape out in C order (extents of 1 have any
 * stride; an array without elements has every layout). The product of the
 * shape times es must fit in 64 bits. */
GSER_INTERNAL bool gser__layout_is_c(uint32_t ndim, const int64_t *shape, const int64_t *strides, size_t es);
/* A buffer value for a checked description (strides NULL when C order) whose
 * elements span span bytes from data - first; shape and strides are copied,
 * flags and release ignored. The value is into, made a buffer, or new. */
GSER_INTERNAL gser_value_t *gser__buffer_value(gser_msg_t *msg, gser_value_t *into, const gser_buffer_desc_t *desc,
                                               size_t first, size_t span);
GSER_INTERNAL gser_status_t gser__value_list_new(gser_msg_t *msg, gser_kind_t kind, gser_value_t **out);
/* Room for this many items (pairs) is allocated with a new list (map):
 * most messages' containers never grow. */
#define GSER_LIST_INLINE 4
#define GSER_MAP_INLINE 8
/* An array-backed list over data (borrowed, never copied). */
GSER_INTERNAL gser_status_t gser__value_array_wrap(gser_msg_t *msg, bool tuple, gser_kind_t elem_kind, const void *data,
                                                   size_t count, gser_value_t **out);
GSER_INTERNAL size_t gser__scalar_kind_size(gser_kind_t k);
GSER_INTERNAL bool gser__kind_is_scalar(gser_kind_t k);
GSER_INTERNAL bool gser__kind_is_array_elem(gser_kind_t k);

/* ---- context ------------------------------------------------------------ */

typedef struct gser_family_fns {
    gser_serialize_fn serialize;
    gser_deserialize_fn deserialize;
} gser_family_fns_t;

struct gser_type {
    char *name;
    size_t name_len;
    uint32_t version;
    uint32_t min_read_version;
    gser_destroy_fn destroy;
    void *user_data;
    gser_family_fns_t fam[GSER_MAX_FAMILIES];
};

typedef struct err_slot err_slot_t;

struct gser_context {
    pthread_mutex_t err_lock; /* guards err_slots */
    err_slot_t *err_slots;    /* host/error.c: one detailed message per thread */
    devl_t *devl; /* the device layer (host/device_api.c opens it); NULL: no backend */
    char devl_why[192]; /* why there is none when GSER_DEVICE named no backend, else "" */
    int ordinal;  /* the GPU the context's device memory is on */
    size_t pack_max;
    gser_limits_t limits;
    size_t inline_max;
    size_t array_min;
    FILE *trace; /* NULL = off */
    atomic_bool frozen;
    _Atomic(struct gser_msg *) spare_msg[2]; /* GSER_REUSE: a message built and one received */
    _Atomic(struct gser_frames *) spare_frames;
    size_t nfamilies;
    char families[GSER_MAX_FAMILIES][GSER_FAMILY_NAME_MAX + 1];
    gser_type_t **types; /* open addressing, power-of-two slots */
    size_t ntypes;
    size_t type_slots;
};

enum { GSER_FAMILY_DEVICE = 0, GSER_FAMILY_HOST = 1 };

GSER_INTERNAL const gser_type_t *gser__context_find_type(const gser_context_t *ctx, const char *name, size_t len);
GSER_INTERNAL int gser__context_find_family(const gser_context_t *ctx, const char *name, size_t len);
GSER_INTERNAL void gser__context_freeze(gser_context_t *ctx);
GSER_INTERNAL void gser__limits_resolve(const gser_limits_t *in, gser_limits_t *out);

/* ---- errors (host/error.c, a leaf) -------------------------------------- */

/* Per-thread, per-context detailed error messages. */
GSER_INTERNAL gser_status_t gser__error_set(const gser_context_t *ctx, gser_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
GSER_INTERNAL gser_status_t gser__error_setv(const gser_context_t *ctx, gser_status_t st, const char *fmt, va_list ap);
/* gser_struct_read, with a message naming the call and the struct type. */
GSER_INTERNAL gser_status_t gser__struct_read(const gser_context_t *ctx, const char *what, const char *type, void *dst,
                                              size_t dst_size, const void *src);
/* Set this thread's message for gser_context_create, which has no context
 * yet (read with gser_context_get_last_error(NULL)); returns st. */
GSER_INTERNAL gser_status_t gser__error_set_create(gser_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Free ctx's messages (gser_context_destroy). */
GSER_INTERNAL void gser__error_slots_free(gser_context_t *ctx);

/* ---- the context's device side (host/device_api.c) ---------------------- */

GSER_INTERNAL gser_status_t gser__ctxdev_open(gser_context_t *ctx, const gser_context_options_t *o);
GSER_INTERNAL void gser__ctxdev_close(gser_context_t *ctx);
/* GSER_ERR_NO_DEVICE with a message naming what, when ctx has no backend. */
GSER_INTERNAL gser_status_t gser__ctxdev_need(gser_context_t *ctx, const char *what);
/* Record a device-layer failure (with the backend's own error text). */
GSER_INTERNAL gser_status_t gser__ctxdev_fail(gser_context_t *ctx, gser_status_t st, const char *what);
GSER_INTERNAL gser_status_t gser__ctxdev_copy(gser_context_t *ctx, void *dst, gser_memory_t dst_memory, const void *src,
                                              gser_memory_t src_memory, size_t n, void *stream);

/* Read a caller's deserialize options (defaults for NULL) and the limits they
 * name (the context's when none). */
GSER_INTERNAL gser_status_t gser__dopts_read(const gser_context_t *ctx, const char *what,
                                             const gser_deserialize_options_t *opts, gser_deserialize_options_t *o,
                                             gser_limits_t *lim);

/* ---- paths -------------------------------------------------------------- */

typedef struct path_seg {
    const gser_value_t *key; /* map key, or NULL for an index */
    size_t index;
} path_seg_t;

#define GSER_PATH_MAX (GSER_DEPTH_MAX + 2)

typedef struct path {
    size_t len;
    path_seg_t seg[GSER_PATH_MAX];
} path_t;

/* Write "$.a[3]..." into buf (always NUL-terminated, truncated with "..."). */
GSER_INTERNAL void gser__path_format(const path_t *p, char *buf, size_t cap);
/* Write "<path><sep><fmt...>" into buf (always NUL-terminated): errors use
 * ": ", traces two spaces. */
GSER_INTERNAL void gser__path_vmessage(const path_t *p, const char *sep, char *buf, size_t cap, const char *fmt,
                                       va_list ap);
/* Write n extents or strides as "(a, b)" ("(a,)" for one), truncated to cap. */
GSER_INTERNAL void gser__dims_format(const int64_t *v, uint32_t n, char *buf, size_t cap);
/* For traces: " strides=(a, b) span=N" for a strided buffer, "" otherwise. */
GSER_INTERNAL void gser__layout_format(const gser_buffer_desc_t *d, size_t span, char *buf, size_t cap);
/* A name from the wire, quoted and escaped like a str value (no terminal
 * escapes reach a log), cut after 64 bytes: fits GSER_QUOTED_MAX. */
#define GSER_QUOTED_MAX (4 * 64 + 8)
GSER_INTERNAL void gser__quote_format(const char *s, size_t n, char *buf, size_t cap);
/* Write a short rendering of a scalar value (for paths and traces). */
GSER_INTERNAL void gser__scalar_format(const gser_value_t *v, char *buf, size_t cap);

/* ---- msgpack bounds check ----------------------------------------------- */

/* Walk one msgpack object at p[0..len) without allocating: every declared
 * length must fit in what is left, containers nest at most max_depth levels
 * (and never deeper than msgpack-c's unpacker can go), and *nodes_left is
 * charged one per item. The sub-headers of object markers inside are walked
 * the same way with the levels left at the marker (at least 2: a root and
 * its markers' fields). *used is the object's size. On error *err_off is the
 * failing offset and *why says what is wrong. */
GSER_INTERNAL gser_status_t gser__mp_check(const unsigned char *p, size_t len, size_t max_depth, size_t *nodes_left,
                                           size_t *used, size_t *err_off, const char **why);

/* ---- frames -------------------------------------------------------------- */

#define GSER_FRAMES_INLINE 4

struct gser_frames {
    gser_context_t *ctx;
    gser_frame_t *frames;
    size_t n;
    size_t cap;
    /* device work behind the frames (host/pack.c); all NULL without it */
    void *event;     /* device-layer event, recorded after the last copy */
    void *stream;
    void *dev_mem;   /* packed device frames */
    size_t dev_size;
    void *pinned;    /* host-family frames */
    size_t pinned_size;
    devl_batch_t *batch; /* what the pack kernel still reads */
    /* gser_serialize_flat: the host family's copies, left for the flattened
     * buffer (their frames' data NULL until then); .group is the frame index */
    struct pack_copy *deferred;
    size_t ndeferred;
    void *header; /* malloc'd when the header outgrew header_inline */
    size_t header_len;
    gser_msg_t *scratch; /* values made by serializers and list conversions */
    struct frame_codec *codecs; /* per frame when one is compressed, else NULL (host/compress.c) */
    gser_frame_t inline_frames[GSER_FRAMES_INLINE];
    char header_inline[1024];
};

/* Append fr, growing the vector past its inline room (host/frames.c). */
GSER_INTERNAL gser_status_t gser__frames_push(gser_frames_t *f, const gser_frame_t *fr);

/* gser_serialize with defer: the host family's device buffers are not
 * copied; f->deferred says where they go (host/encode.c). */
GSER_INTERNAL gser_status_t gser__serialize(gser_context_t *ctx, const gser_msg_t *msg,
                                            const gser_serialize_options_t *opts, bool defer,
                                            gser_frames_t **frames_out);

/* The flattened form of frames where those with data NULL (and a size) are
 * left to be filled: sizes it, or writes the rest and each frame's offset
 * in dst (host/flat.c). */
GSER_INTERNAL gser_status_t gser__flat_size_open(const gser_frame_t *frames, size_t nframes, size_t *size_out);
GSER_INTERNAL gser_status_t gser__flat_write_open(const gser_frame_t *frames, size_t nframes, void *dst, size_t cap,
                                                  size_t *offsets, size_t *written);

/* ---- frame compression (host/compress.c) ------------------------------------ */

/* Wire codec of a compressed frame (the frame table's fourth field). */
enum { CODEC_NONE = 0, CODEC_LZ4 = 1, CODEC_ZSTD = 2, CODEC_LZ4_CHUNKS = 3, CODEC_ZSTD_CHUNKS = 4 };
#define CODEC_MAX CODEC_ZSTD_CHUNKS

typedef struct frame_codec {
    uint8_t codec;  /* CODEC_*; NONE for a frame left as it was */
    uint32_t chunk; /* CODEC_*_CHUNKS: the chunk size, the number of chunks and of compressed ones (reader) */
    uint32_t nchunks, nsqueezed;
    size_t raw;     /* its uncompressed size */
    size_t size;    /* its compressed size */
    void *buf;      /* the decompressed or compressed bytes (gser__bigbuf_alloc), which the frame points at */
    size_t cap;     /* compressed: the bytes allocated for buf */
} frame_codec_t;

/* Compress the host data frames of f where sampling says it pays
 * (gser_compression_t method, codec level). Sets f->codecs if one was
 * compressed; *any says so. o gives the method, level, threshold and chunk
 * size. */
GSER_INTERNAL gser_status_t gser__frames_compress(gser_frames_t *f, const gser_serialize_options_t *o, bool *any);
GSER_INTERNAL void gser__frames_codecs_free(gser_frames_t *f);

/* Decompress frame data src[0..size) with c's codec into dst, which holds
 * exactly c->raw bytes: GSER_OK only when the data is valid and fills dst
 * exactly. gser__codec_check_size came first. The message (set as the
 * context's error) names frame i. */
GSER_INTERNAL gser_status_t gser__codec_decompress(gser_context_t *ctx, const char *what, size_t i,
                                                   const frame_codec_t *c, const void *src, size_t size, void *dst);

/* What raw size a codec's size bytes can decompress to at most (lz4: 255
 * bytes per byte) or declare (zstd: the frame's content size): GSER_OK if
 * raw is possible, else GSER_ERR_COMPRESSED naming frame i. Reads only the
 * zstd frame header, and for chunks the chunk table, which must account
 * for every byte (c's chunk fields are set from it). */
GSER_INTERNAL gser_status_t gser__codec_check_size(gser_context_t *ctx, const char *what, size_t i,
                                                   frame_codec_t *c, const void *src, size_t size);

/* "lz4", "zstd", "lz4 chunks", "zstd chunks". */
GSER_INTERNAL const char *gser__codec_name(int codec);

/* ---- large host buffers (host/bigbuf.c) ------------------------------------- */

#define GSER_BIGBUF_HEAP_MAX ((size_t)1 << 20) /* up to this from the heap; above, kept mappings */
#define GSER_BIGBUF_KEEP ((size_t)128 << 20)    /* freed mappings kept for reuse, at most */

/* Memory for a buffer of n bytes that is written whole before it is read
 * (a file read into it, a frame decompressed or compressed into it), 64-byte
 * aligned, contents undefined: up to GSER_BIGBUF_HEAP_MAX the heap (memory
 * freed by anyone in the process, already faulted in), above it an anonymous
 * mapping advised for huge pages, a freed one (already faulted in) reused
 * when one fits. NULL when out of memory. Freed with gser__bigbuf_free(p,
 * n), the same n. Any thread. */
GSER_INTERNAL void *gser__bigbuf_alloc(size_t n);
GSER_INTERNAL void gser__bigbuf_free(void *p, size_t n);
/* p (gser__bigbuf_alloc(n)) cut to its first used bytes where that gives
 * memory back (a heap block moved; a mapping's whole pages past used given
 * back in place, as a reused one holds them): the buffer, perhaps moved;
 * still freed with gser__bigbuf_free(p, n). */
GSER_INTERNAL void *gser__bigbuf_shrink(void *p, size_t n, size_t used);
/* gser__bigbuf_free as a gser_release_fn: arg is n. */
GSER_INTERNAL void gser__bigbuf_release(void *data, void *arg);

/* ---- packing device buffers (host/pack.c) ---------------------------------- */

typedef struct pack_group {
    size_t frame; /* index in the frames */
    size_t bytes;
    size_t start; /* in the one allocation, set by gser__packer_finish */
    bool to_host; /* the host family's: ends up in pinned host memory */
} pack_group_t;

typedef struct pack_copy {
    const void *src;
    size_t size;
    size_t group;
    size_t offset;
} pack_copy_t;

typedef struct pack_wait {
    void *stream;
    void *event;
} pack_wait_t;

typedef struct packer {
    gser_context_t *ctx;
    bool any_host;  /* some group belongs to the host family */
    bool device_work;
    bool defer_host; /* leave the host family's copies in f->deferred */
    size_t pack_max;
    void *stream;
    pack_group_t *groups;
    size_t ngroups, cap_groups;
    pack_copy_t *copies;
    size_t ncopies, cap_copies;
    pack_wait_t *waits;
    size_t nwaits, cap_waits;
} packer_t;

GSER_INTERNAL void gser__packer_init(packer_t *p, gser_context_t *ctx, size_t pack_max, void *stream);
GSER_INTERNAL void gser__packer_free(packer_t *p);
/* Order the packing after a buffer's producer (either may be NULL). */
GSER_INTERNAL gser_status_t gser__packer_wait_for(packer_t *p, void *stream, void *event);
/* Give a buffer a place in the packed frame of the scope *group (-1: none yet,
 * one is reserved in f, in host memory when to_host); sets the frame index
 * and offset. */
GSER_INTERNAL gser_status_t gser__packer_add(packer_t *p, gser_frames_t *f, int *group, bool to_host, const void *src,
                                             size_t size, size_t *frame, size_t *offset);
/* Allocate, plan, launch, record the event; f owns what it allocates. */
GSER_INTERNAL gser_status_t gser__packer_finish(packer_t *p, gser_frames_t *f);
GSER_INTERNAL void gser__packer_release(gser_frames_t *f);

/* ---- device memory owned by a message (host/msgdev.c) ------------------------ */

GSER_INTERNAL gser_status_t gser__msgdev_alloc(gser_msg_t *m, void *stream, size_t size, bool pinned, void **ptr);
/* A scatter batch of n copies that the message keeps (and releases after
 * its event); the caller fills the arrays and runs it on stream. */
GSER_INTERNAL gser_status_t gser__msgdev_batch(gser_msg_t *m, void *stream, size_t n, devl_batch_t **batch,
                                               devl_arrays_t *arrays);
/* Record the message's event after its device work; sets the backend handle. */
GSER_INTERNAL gser_status_t gser__msgdev_record(gser_msg_t *m, void **event);
GSER_INTERNAL void gser__msgdev_release(gser_msg_t *m);

/* ---- trace ------------------------------------------------------------- */

GSER_INTERNAL void gser__trace_line(FILE *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif /* GSER_HOST_INTERNAL_H */
