/* gser — contexts, limits, errors, and the type registry.
 *
 * A context owns the registry of types and families, the decoder limits and
 * the encoding options. Set it up (register families and types) before the
 * first gser_serialize/gser_deserialize; from then on it is read-only and may
 * be shared by any number of threads.
 */
#ifndef GSER_CONTEXT_H
#define GSER_CONTEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "gser/defs.h"
#include "gser/device.h"
#include "gser/value.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Deepest nesting the wire format allows (msgpack-c's unpacker stops at 32
 *  open containers; the header and buffer references take two). */
#define GSER_DEPTH_MAX 30

/**
 * Decoder limits, in the manner of mpack_tree_set_limits. Zero means the
 * default. Every input that breaks one is rejected with its own status.
 */
typedef struct gser_limits {
    size_t size;        /**< sizeof(gser_limits_t): GSER_LIMITS_INIT sets it */
    size_t max_depth;   /**< nesting, root = 1; default and maximum GSER_DEPTH_MAX */
    size_t max_nodes;   /**< msgpack items in the header and all sub-headers (each value is one
                             or a few); default 16,777,216 */
    size_t max_frames;  /**< data frames; default 1,048,576 */
    uint64_t max_bytes; /**< header + frame bytes; default 1 TiB */
    /** What decoding a message may cost, relative to its size: the memory the
     *  decoded message takes (its values, not the frames it borrows) is at
     *  most max_expansion times the message's bytes (header + frames) plus
     *  GSER_EXPANSION_ALLOWANCE, else GSER_ERR_LIMIT_BYTES. The Python module
     *  holds the objects it builds to the same bound. Default 64. */
    uint64_t max_expansion;
} gser_limits_t;

/** The fixed part of the max_expansion bound: small messages always decode. */
#define GSER_EXPANSION_ALLOWANCE ((uint64_t)1 << 20)

#define GSER_LIMITS_INIT GSER_STRUCT_INIT(gser_limits_t)

/** Context options: start from GSER_CONTEXT_OPTIONS_INIT, then set what you
 *  need (zero means the default). */
typedef struct gser_context_options {
    size_t size; /**< sizeof(gser_context_options_t): GSER_CONTEXT_OPTIONS_INIT sets it */
    /** Decoder limits; NULL = the defaults. Copied. */
    const gser_limits_t *limits;
    /** Buffers and arrays with fewer bytes than this are inlined in the
     *  header instead of becoming frames. 0 = default (256); 1 = only empty ones. */
    size_t inline_max;
    /** Lists and tuples of at least this many same-kind scalars (int, uint,
     *  float or bool) become contiguous arrays. 0 = default (16); SIZE_MAX = never. */
    size_t array_min;
    /** 0 = follow the GSER_TRACE environment variable; 1 = trace; -1 = never. */
    int trace;
    /** Where trace lines go; NULL = stderr. Borrowed. */
    FILE *trace_stream;
    /** Device backend: "cuda", "emulated" or "none". NULL = the GSER_DEVICE
     *  environment variable if set, else "cuda" when a GPU is present, else none. */
    const char *device_backend;
    /** Device ordinal for allocations and kernels. */
    int device;
    /** Device memory; NULL = the backend's stream-ordered pool (cudaMallocAsync).
     *  The struct is copied; its user pointer must outlive the context. */
    const gser_allocator_t *device_allocator;
    /** Pinned host memory for staging; NULL = the backend's reusable pool.
     *  The struct is copied; its user pointer must outlive the context. */
    const gser_allocator_t *pinned_allocator;
    /** Device buffers with fewer bytes than this are gathered by one kernel
     *  into one packed frame; larger ones stay frames of their own (zero-copy).
     *  0 = default (1 MiB); 1 = never pack. */
    size_t pack_max;
} gser_context_options_t;

#define GSER_CONTEXT_OPTIONS_INIT GSER_STRUCT_INIT(gser_context_options_t)

/** Create a context; opts may be NULL. The families "device" and "host" are
 *  registered already. */
GSER_API gser_status_t gser_context_create(const gser_context_options_t *opts, gser_context_t **ctx_out);

/** Destroy a context. Every message and frames object created with it must be
 *  destroyed first. NULL is fine. */
GSER_API void gser_context_destroy(gser_context_t *ctx);

/** The limits ctx decodes under, defaults filled in (what a zero field of
 *  gser_context_options_t.limits became). For transports and other plugins
 *  that check incoming messages before handing them to gser_deserialize.
 *  out->size must be set (GSER_LIMITS_INIT); at most that many bytes are written. */
GSER_API gser_status_t gser_context_get_limits(const gser_context_t *ctx, gser_limits_t *out);

/**
 * The detailed message of the last error this thread got from a call on ctx,
 * naming the path of the failing value, e.g. `$.tasks[3].payload: type
 * "myapp.blob" has no serializer for families [device, host]`. "" if none.
 * Each context keeps one message per thread, however many contexts a thread
 * uses. Valid until this thread's next call on ctx (and at most until ctx is
 * destroyed). With ctx NULL: the message of this thread's last failed
 * gser_context_create.
 */
GSER_API const char *gser_context_get_last_error(const gser_context_t *ctx);

/** Register a serializer family by name (1..63 bytes, no commas). At most 32
 *  families, the two built-in ones included. */
GSER_API gser_status_t gser_family_register(gser_context_t *ctx, const char *name);

/** Serialize obj: build a sub-tree in gser_writer_get_msg(w) (buffers in it become
 *  frames) and hand its root to gser_writer_set_root. Return GSER_OK or an
 *  error status (the serialization then fails with it). */
typedef gser_status_t (*gser_serialize_fn)(gser_context_t *ctx, const void *obj, gser_writer_t *w,
                                           void *user_data);

/** Rebuild an object from gser_reader_get_tree(r); on success set *obj_out. */
typedef gser_status_t (*gser_deserialize_fn)(gser_context_t *ctx, gser_reader_t *r, void **obj_out,
                                             void *user_data);

/** Free an object that a deserialize function created. */
typedef void (*gser_destroy_fn)(void *obj, void *user_data);

/** Type options: start from GSER_TYPE_OPTIONS_INIT, then set what you need. */
typedef struct gser_type_options {
    size_t size; /**< sizeof(gser_type_options_t): GSER_TYPE_OPTIONS_INIT sets it */
    /** Oldest version the deserializers can read; 0 = only the registered version. */
    uint32_t min_read_version;
    /** Frees deserialized objects when their message is destroyed (unless taken
     *  with gser_value_take_object). NULL: the message never frees them. */
    gser_destroy_fn destroy;
    /** Passed to every callback of this type. Borrowed. */
    void *user_data;
} gser_type_options_t;

#define GSER_TYPE_OPTIONS_INIT GSER_STRUCT_INIT(gser_type_options_t)

/** Register a type by name (1..255 bytes) and version. opts may be NULL. */
GSER_API gser_status_t gser_type_register(gser_context_t *ctx, const char *name, uint32_t version,
                                          const gser_type_options_t *opts);

/** Give a registered type a serialize and a deserialize function for a
 *  registered family. Both functions are required. */
GSER_API gser_status_t gser_type_add_family(gser_context_t *ctx, const char *type_name, const char *family,
                                            gser_serialize_fn serialize, gser_deserialize_fn deserialize);

/* ---- inside serialize / deserialize callbacks ----------------------------- */

/** The message to build the sub-tree in. It lives as long as the frames
 *  object being produced, so buffers created here (copied or owned) stay
 *  valid while the frames are in use. */
GSER_API gser_msg_t *gser_writer_get_msg(gser_writer_t *w);

/** The root of the object's sub-tree. Call once. */
GSER_API gser_status_t gser_writer_set_root(gser_writer_t *w, gser_value_t *tree);

/** The family this serialization runs in. */
GSER_API const char *gser_writer_get_family(const gser_writer_t *w);

/** The stream (cudaStream_t) the serialization orders device work on (the
 *  caller's gser_serialize_options_t.stream; NULL = per-thread default). */
GSER_API void *gser_writer_get_stream(const gser_writer_t *w);

/** The sub-tree the object was serialized into. Buffers in it point into
 *  the received frames; it lives as long as the message being built. */
GSER_API gser_value_t *gser_reader_get_tree(gser_reader_t *r);

/** The type version that produced the sub-tree. */
GSER_API uint32_t gser_reader_get_version(const gser_reader_t *r);

/** The family that produced the sub-tree. */
GSER_API const char *gser_reader_get_family(const gser_reader_t *r);

/** The message being built; the object will be destroyed with it. */
GSER_API gser_msg_t *gser_reader_get_msg(gser_reader_t *r);

/** The deserialization's stream (cudaStream_t; NULL = per-thread default). */
GSER_API void *gser_reader_get_stream(const gser_reader_t *r);

/** The GSER_DESERIALIZE_* flags the caller gave. */
GSER_API unsigned gser_reader_get_flags(const gser_reader_t *r);

/**
 * Record a detailed error message (printf-style) for the current
 * (de)serialization; gser prefixes it with the value's path. Returns status,
 * so a callback can `return gser_writer_fail(w, GSER_ERR_..., "...")`.
 */
GSER_API gser_status_t gser_writer_fail(gser_writer_t *w, gser_status_t status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
GSER_API gser_status_t gser_reader_fail(gser_reader_t *r, gser_status_t status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

#ifdef __cplusplus
}
#endif

#endif /* GSER_CONTEXT_H */
