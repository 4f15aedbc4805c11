/* gser — messages and value trees.
 *
 * A message is an arena: every value created in it is freed by one
 * gser_msg_destroy. Values are built with gser_msg_new_* and linked into
 * containers; accessors read them back and say which kind each one is.
 *
 * Ownership: strings are copied into the message; bytes and buffers are
 * borrowed (the caller keeps them alive until the message is destroyed)
 * unless GSER_BUFFER_COPY is set or a release callback hands them over.
 * A message is not thread-safe: one thread at a time may use it.
 */
#ifndef GSER_VALUE_H
#define GSER_VALUE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gser/defs.h"

#ifdef __cplusplus
extern "C" {
#endif

/** What a value is. */
typedef enum gser_kind {
    GSER_KIND_NIL = 0,
    GSER_KIND_BOOL = 1,
    GSER_KIND_INT = 2,        /**< int64_t */
    GSER_KIND_UINT = 3,       /**< uint64_t */
    GSER_KIND_FLOAT = 4,      /**< double */
    GSER_KIND_STR = 5,        /**< UTF-8 text, length-counted, stored NUL-terminated */
    GSER_KIND_BYTES = 6,      /**< opaque bytes */
    GSER_KIND_LIST = 7,
    GSER_KIND_TUPLE = 8,      /**< a list that stays a tuple across the wire */
    GSER_KIND_MAP = 9,        /**< ordered pairs, scalar keys */
    GSER_KIND_BUFFER = 10,    /**< typed memory: host or device, dtype, shape */
    GSER_KIND_OBJECT = 11,    /**< a registered type + pointer */
    GSER_KIND_SERIALIZED = 12 /**< an object kept in serialized form (pass-through) */
} gser_kind_t;

/** A static name for a kind ("list", "map", ...). */
GSER_API const char *gser_kind_str(gser_kind_t kind);

/** Element types of buffers. GSER_DTYPE_BYTES (zero) is untyped bytes. */
typedef enum gser_dtype {
    GSER_DTYPE_BYTES = 0,
    GSER_DTYPE_BOOL = 1,
    GSER_DTYPE_INT8 = 2,
    GSER_DTYPE_INT16 = 3,
    GSER_DTYPE_INT32 = 4,
    GSER_DTYPE_INT64 = 5,
    GSER_DTYPE_UINT8 = 6,
    GSER_DTYPE_UINT16 = 7,
    GSER_DTYPE_UINT32 = 8,
    GSER_DTYPE_UINT64 = 9,
    GSER_DTYPE_FLOAT16 = 10,
    GSER_DTYPE_BFLOAT16 = 11,
    GSER_DTYPE_FLOAT32 = 12,
    GSER_DTYPE_FLOAT64 = 13,
    GSER_DTYPE_COMPLEX64 = 14,
    GSER_DTYPE_COMPLEX128 = 15,
} gser_dtype_t;

/** Bytes per element of a dtype (1 for GSER_DTYPE_BYTES); 0 if unknown. */
GSER_API size_t gser_dtype_size(gser_dtype_t dtype);
/** A static name ("float64", ...); "?" if unknown. */
GSER_API const char *gser_dtype_str(gser_dtype_t dtype);

/** Most dimensions a buffer may have. */
#define GSER_MAX_NDIM 32

/** Buffer flags. */
enum {
    /** Copy the bytes into the message now (host memory only). */
    GSER_BUFFER_COPY = 1u << 0,
};

/**
 * A buffer: what gser_msg_new_buffer reads and gser_value_get_buffer fills.
 * Start from GSER_BUFFER_DESC_INIT and set what you need: zero means host
 * memory, untyped bytes, flat (ndim 0: the shape is implied by nbytes),
 * C-contiguous, borrowed.
 *
 * Any layout travels (Fortran order, negative or zero strides, views): set
 * strides, byte strides as numpy and __cuda_array_interface__ give them.
 * Element (i0, ..., in-1) is then at data + i0 * strides[0] + ... +
 * in-1 * strides[n-1]: data points at element 0, which need not be the
 * lowest address, and nbytes stays product(shape) * dtype size. What travels
 * is the memory the elements span (gser_buffer_get_span): a broadcast array
 * (stride 0) travels as its base, a view as the span of its base it covers.
 * The receiver gets the element-0 pointer and the strides back.
 */
typedef struct gser_buffer_desc {
    size_t size;           /**< sizeof(gser_buffer_desc_t): GSER_BUFFER_DESC_INIT sets it */
    const void *data;      /**< start of the bytes (may be NULL when nbytes is 0) */
    size_t nbytes;         /**< length in bytes */
    gser_dtype_t dtype;    /**< element type */
    uint32_t ndim;         /**< 0 = flat; else shape has ndim entries */
    const int64_t *shape;  /**< extents; product * dtype size == nbytes */
    gser_memory_t memory;  /**< where data lives */
    int32_t device;        /**< device ordinal when memory is GSER_MEMORY_DEVICE */
    unsigned flags;        /**< GSER_BUFFER_* */
    /** When set, the message owns data and calls release(data, release_arg)
     *  once, when it is destroyed (or when creation fails: never). */
    gser_release_fn release;
    void *release_arg;
    /** Device data only: the stream (cudaStream_t) that produces data; gser
     *  orders its reads after the work queued there when serializing. */
    void *stream;
    /** Device data only: an event (cudaEvent_t) that completes when data is
     *  ready. Deserialized buffers carry one when gser copied them on a stream. */
    void *event;
    /** Byte strides, ndim entries (copied into the message), or NULL for
     *  C order. Needs ndim > 0. Strides that describe C order are dropped:
     *  such a buffer reads back with strides NULL. */
    const int64_t *strides;
} gser_buffer_desc_t;

#define GSER_BUFFER_DESC_INIT GSER_STRUCT_INIT(gser_buffer_desc_t)

/* ---- messages ---------------------------------------------------------- */

/** Create an empty message whose root is nil. The message borrows ctx: the
 *  context must outlive it. */
GSER_API gser_status_t gser_msg_create(gser_context_t *ctx, gser_msg_t **msg_out);

/** Free a message, every value in it, and everything it owns. NULL is fine. */
GSER_API void gser_msg_destroy(gser_msg_t *msg);

/** The message's root value (nil until set). Valid until the message is destroyed. */
GSER_API gser_value_t *gser_msg_get_root(gser_msg_t *msg);

/** Make value the root. The value must belong to this message, or to one that
 *  outlives it. */
GSER_API gser_status_t gser_msg_set_root(gser_msg_t *msg, gser_value_t *value);

/** The context a message was created with. */
GSER_API gser_context_t *gser_msg_get_context(const gser_msg_t *msg);

/* ---- constructors: each creates a value inside msg ---------------------- */

GSER_API gser_status_t gser_msg_new_nil(gser_msg_t *msg, gser_value_t **out);
GSER_API gser_status_t gser_msg_new_bool(gser_msg_t *msg, bool v, gser_value_t **out);
GSER_API gser_status_t gser_msg_new_int(gser_msg_t *msg, int64_t v, gser_value_t **out);
GSER_API gser_status_t gser_msg_new_uint(gser_msg_t *msg, uint64_t v, gser_value_t **out);
GSER_API gser_status_t gser_msg_new_float(gser_msg_t *msg, double v, gser_value_t **out);
/** Copies len bytes of s (need not be NUL-terminated) into the message. */
GSER_API gser_status_t gser_msg_new_str(gser_msg_t *msg, const char *s, size_t len, gser_value_t **out);
/** Copies the NUL-terminated string s. */
GSER_API gser_status_t gser_msg_new_cstr(gser_msg_t *msg, const char *s, gser_value_t **out);
/** Borrows data: it must stay valid until the message is destroyed. */
GSER_API gser_status_t gser_msg_new_bytes(gser_msg_t *msg, const void *data, size_t len, gser_value_t **out);
/** An empty list. */
GSER_API gser_status_t gser_msg_new_list(gser_msg_t *msg, gser_value_t **out);
/** An empty tuple. */
GSER_API gser_status_t gser_msg_new_tuple(gser_msg_t *msg, gser_value_t **out);
/** An empty map. */
GSER_API gser_status_t gser_msg_new_map(gser_msg_t *msg, gser_value_t **out);

/** Array flags. */
enum {
    GSER_ARRAY_TUPLE = 1u << 0, /**< the array is a tuple, not a list */
    GSER_ARRAY_COPY = 1u << 1,  /**< copy the elements now instead of borrowing */
};

/**
 * A list (or tuple) of count scalars of one kind, backed by the C array data:
 * int64_t for GSER_KIND_INT, uint64_t for UINT, double for FLOAT, and one
 * byte per element (0 or 1) for BOOL. Borrowed unless GSER_ARRAY_COPY: data
 * must stay valid, and unchanged, until the message is destroyed. Appending
 * to a borrowed array copies it first.
 */
GSER_API gser_status_t gser_msg_new_array(gser_msg_t *msg, gser_kind_t elem_kind, const void *data,
                                          size_t count, unsigned flags, gser_value_t **out);

/** A buffer value described by desc (see gser_buffer_desc_t for ownership). */
GSER_API gser_status_t gser_msg_new_buffer(gser_msg_t *msg, const gser_buffer_desc_t *desc,
                                           gser_value_t **out);

/** A typed object: type_name must be registered in the message's context.
 *  obj is borrowed: it must stay valid until serialization is done. */
GSER_API gser_status_t gser_msg_new_object(gser_msg_t *msg, const char *type_name, void *obj,
                                           gser_value_t **out);

/* ---- containers ---------------------------------------------------------- */

/** Append value to a list or tuple. */
GSER_API gser_status_t gser_list_append(gser_value_t *list, gser_value_t *value);
/* Scalar appends: a list of one scalar kind stays unboxed and contiguous, so
 * nothing is left to convert when it is serialized. */
GSER_API gser_status_t gser_list_append_nil(gser_value_t *list);
GSER_API gser_status_t gser_list_append_bool(gser_value_t *list, bool v);
GSER_API gser_status_t gser_list_append_int(gser_value_t *list, int64_t v);
GSER_API gser_status_t gser_list_append_uint(gser_value_t *list, uint64_t v);
GSER_API gser_status_t gser_list_append_float(gser_value_t *list, double v);
GSER_API gser_status_t gser_list_append_cstr(gser_value_t *list, const char *s);

/** Append the pair (key, value) to a map; key must be a scalar (nil, bool,
 *  int, uint, float, str or bytes). Duplicate keys are not checked: the map
 *  keeps every pair in order, lookups return the first match. */
GSER_API gser_status_t gser_map_put(gser_value_t *map, gser_value_t *key, gser_value_t *value);
/** gser_map_put with a string key copied from the NUL-terminated key. */
GSER_API gser_status_t gser_map_put_cstr(gser_value_t *map, const char *key, gser_value_t *value);
/**
 * gser_map_put with a string key that is borrowed, not copied: the len bytes
 * at key, followed by a NUL (key[len] == '\0'), must stay valid and unchanged
 * until the message is destroyed -- a string literal, or a table of names
 * that lives as long. For the keys a program writes in its source, it saves
 * the copy and the strlen; GSER_MAP_PUT_LITERAL passes a literal's length.
 */
GSER_API gser_status_t gser_map_put_borrowed(gser_value_t *map, const char *key, size_t len, gser_value_t *value);
/** gser_map_put_borrowed for a string literal (only a literal compiles). */
#define GSER_MAP_PUT_LITERAL(map, literal, value) \
    gser_map_put_borrowed((map), "" literal "", sizeof(literal) - 1, (value))

/* ---- accessors ----------------------------------------------------------- */

GSER_API gser_kind_t gser_value_get_kind(const gser_value_t *v);

GSER_API gser_status_t gser_value_get_bool(const gser_value_t *v, bool *out);
/** Also accepts a UINT that fits in int64_t. */
GSER_API gser_status_t gser_value_get_int(const gser_value_t *v, int64_t *out);
/** Also accepts a non-negative INT. */
GSER_API gser_status_t gser_value_get_uint(const gser_value_t *v, uint64_t *out);
GSER_API gser_status_t gser_value_get_float(const gser_value_t *v, double *out);
/** The string (NUL-terminated, valid until the message is destroyed); len may be NULL. */
GSER_API gser_status_t gser_value_get_str(const gser_value_t *v, const char **s, size_t *len);
/** The bytes (borrowed from wherever they came from). */
GSER_API gser_status_t gser_value_get_bytes(const gser_value_t *v, const void **data, size_t *len);
/** A buffer's description; desc->shape and desc->strides point into the
 *  message. desc->size must be set (GSER_BUFFER_DESC_INIT); at most that many
 *  bytes are written. GSER_ERR_UNSUPPORTED, writing nothing, for a strided
 *  buffer when desc->size ends before the strides field (a caller built
 *  before strides existed would read the layout wrong). */
GSER_API gser_status_t gser_value_get_buffer(const gser_value_t *v, gser_buffer_desc_t *desc);

/**
 * The memory a buffer's elements cover: the bytes [data + *offset,
 * data + *offset + *span). *offset is 0 for a C-contiguous buffer and
 * negative when negative strides put element 0 above the lowest byte; *span
 * is nbytes for a C-contiguous buffer, and 0 for a buffer without elements.
 * This is what gser copies and sends. GSER_ERR_INVALID_ARG for a description
 * gser_msg_new_buffer would refuse (a span past 2^63 - 1 bytes, ...).
 */
GSER_API gser_status_t gser_buffer_get_span(const gser_buffer_desc_t *desc, int64_t *offset, size_t *span);

/** Number of elements of a list or tuple, pairs of a map, bytes of a str or
 *  bytes value; 0 for anything else. */
GSER_API size_t gser_value_get_len(const gser_value_t *v);

/** Element i of a list or tuple. For an array-backed list this creates a
 *  value for the element (a snapshot) the first time it is asked for. */
GSER_API gser_status_t gser_list_get(gser_value_t *list, size_t i, gser_value_t **out);

/**
 * The contiguous typed array behind a list or tuple: elem_kind is INT, UINT,
 * FLOAT or BOOL and data points at count elements (see gser_msg_new_array).
 * Zero-copy: after deserialization data points into the received frame when
 * it was aligned. GSER_ERR_TYPE_MISMATCH if the list is not array-backed
 * (it holds boxed or mixed values).
 */
GSER_API gser_status_t gser_list_get_array(const gser_value_t *list, gser_kind_t *elem_kind,
                                           const void **data, size_t *count);

/** Pair i of a map. */
GSER_API gser_status_t gser_map_get_at(gser_value_t *map, size_t i, gser_value_t **key, gser_value_t **value);
/** The value of the first pair whose key is the string key; GSER_ERR_NOT_FOUND if none. */
GSER_API gser_status_t gser_map_find_cstr(gser_value_t *map, const char *key, gser_value_t **value);
/** The value of the first pair whose key equals key (same kind and value). */
GSER_API gser_status_t gser_map_find(gser_value_t *map, const gser_value_t *key, gser_value_t **value);

/** A typed object's type name and pointer. */
GSER_API gser_status_t gser_value_get_object(const gser_value_t *v, const char **type_name, void **obj);
/** Take ownership of a deserialized object: the message will no longer
 *  destroy it. */
GSER_API gser_status_t gser_value_take_object(gser_value_t *v, void **obj);

/** What a serialized (pass-through) value says about itself. */
typedef struct gser_serialized_info {
    size_t size;            /**< sizeof(gser_serialized_info_t): GSER_SERIALIZED_INFO_INIT sets it */
    const char *type_name;  /**< valid until the message is destroyed */
    const char *family;
    uint32_t version;
    const void *header;     /**< the object's own msgpack sub-header */
    size_t header_len;
    size_t nframes;         /**< frames the object carries */
} gser_serialized_info_t;

#define GSER_SERIALIZED_INFO_INIT GSER_STRUCT_INIT(gser_serialized_info_t)

/** info->size must be set (GSER_SERIALIZED_INFO_INIT); at most that many bytes are written. */
GSER_API gser_status_t gser_value_get_serialized(const gser_value_t *v, gser_serialized_info_t *info);

/**
 * Decode the sub-header of a serialized value into a value tree in msg
 * without running any type's code (nested objects stay serialized), for
 * inspection. Buffers in it point into the serialized value's frames. The
 * tree starts one level below the depth the object had in the message it
 * was decoded from, so the context's depth limit holds across nested
 * objects (GSER_ERR_LIMIT_DEPTH).
 */
GSER_API gser_status_t gser_value_decode_serialized(gser_msg_t *msg, const gser_value_t *v,
                                                    gser_value_t **tree);

/** Deep equality: same kinds and values, lists equal to arrays of the same
 *  elements, buffers compared byte by byte (host memory only; device buffers
 *  are compared by pointer), objects by type and pointer. */
GSER_API bool gser_value_equal(const gser_value_t *a, const gser_value_t *b);

#ifdef __cplusplus
}
#endif

#endif /* GSER_VALUE_H */
