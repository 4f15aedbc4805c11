/* gser — common definitions shared by every public header.
 *
 * Forward declarations of the opaque handles, the export macro, the memory
 * kinds a frame or buffer can live in, and the status codes.
 */
#ifndef GSER_DEFS_H
#define GSER_DEFS_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#  define GSER_API
#elif defined(__GNUC__)
#  define GSER_API __attribute__((visibility("default")))
#else
#  define GSER_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/** A context: type registry, families, limits, options. Thread-safe once
 *  set up (registration happens before the first serialize/deserialize). */
typedef struct gser_context gser_context_t;

/** A message: an arena that owns a value tree. One destroy frees it all. */
typedef struct gser_msg gser_msg_t;

/** One node of a value tree; lives in (and is freed with) its message. */
typedef struct gser_value gser_value_t;

/** The result of gser_serialize: header + frames. */
typedef struct gser_frames gser_frames_t;

/** Handed to a type's serialize function: where it puts its sub-tree. */
typedef struct gser_writer gser_writer_t;

/** Handed to a type's deserialize function: the sub-tree to rebuild from. */
typedef struct gser_reader gser_reader_t;

/** Status codes: 0 is success, every error is negative, GSER_INPROGRESS
 *  (positive) says an asynchronous operation is still running. */
typedef enum gser_status {
    GSER_INPROGRESS = 1,           /**< not an error: the operation has not completed yet */
    GSER_OK = 0,
    GSER_ERR_INVALID_ARG = -1,     /**< a NULL or out-of-range argument */
    GSER_ERR_NO_MEMORY = -2,       /**< an allocation failed */
    GSER_ERR_NOT_FOUND = -3,       /**< a type, family or key is not known */
    GSER_ERR_EXISTS = -4,          /**< registered twice */
    GSER_ERR_UNKNOWN_FAMILY = -5,  /**< a family name nobody registered */
    GSER_ERR_NO_SERIALIZER = -6,   /**< a type has no (de)serializer in the families asked for */
    GSER_ERR_VERSION = -7,         /**< a type's version in the header is not readable here */
    GSER_ERR_UNKNOWN_TYPE = -8,    /**< the header names a type this context does not know */
    GSER_ERR_BAD_MAGIC = -9,       /**< the bytes are not a gser header / flattened message */
    GSER_ERR_WIRE_VERSION = -10,   /**< a wire format version this build cannot read */
    GSER_ERR_FORMAT = -11,         /**< malformed header: wrong msgpack type, bad marker, ... */
    GSER_ERR_TRUNCATED = -12,      /**< the input ends before the message does */
    GSER_ERR_FRAME = -13,          /**< frames missing, of the wrong size, or referenced out of bounds */
    GSER_ERR_LIMIT_DEPTH = -14,    /**< nesting deeper than the limit */
    GSER_ERR_LIMIT_NODES = -15,    /**< more values than the limit */
    GSER_ERR_LIMIT_FRAMES = -16,   /**< more frames than the limit */
    GSER_ERR_LIMIT_BYTES = -17,    /**< more bytes than the limit */
    GSER_ERR_TYPE_MISMATCH = -18,  /**< an accessor called on a value of another kind */
    GSER_ERR_OUT_OF_RANGE = -19,   /**< an index past the end */
    GSER_ERR_STATE = -20,          /**< the call is not allowed now (e.g. registering after use) */
    GSER_ERR_IO = -21,             /**< reading or writing a file descriptor failed */
    GSER_ERR_UNSUPPORTED = -22,    /**< valid, but not supported by this build or backend */
    GSER_ERR_CALLBACK = -23,       /**< a user callback failed without giving a gser status */
    GSER_ERR_DEVICE = -24,         /**< the device (CUDA) reported an error */
    GSER_ERR_NO_DEVICE = -25,      /**< device memory was asked for but no device backend is usable */
    GSER_ERR_CONNECTION = -26,     /**< the peer disconnected or the connection failed */
    GSER_ERR_TIMEOUT = -27,        /**< a bounded wait ran out */
    GSER_ERR_CANCELED = -28,       /**< the operation was canceled (e.g. its endpoint closed) */
    GSER_ERR_ACCESS = -29,         /**< refused: the peer did not prove the shared secret */
    GSER_ERR_COMPRESSED = -30,     /**< a compressed frame is corrupt or does not decompress to its declared size */
} gser_status_t;

/** A static, human-readable name for a status ("GSER_ERR_FORMAT: malformed
 *  header"). Never NULL, also for values outside the enum. */
GSER_API const char *gser_status_str(gser_status_t status);

/** Called once to give back memory that gser was handed (a buffer's data, a
 *  received frame, a flattened input): release(data, release_arg). */
typedef void (*gser_release_fn)(void *data, void *release_arg);

/**
 * Versioned structs. Every options and output struct starts with `size`,
 * which the caller sets to sizeof the struct as it was compiled (the
 * GSER_*_INIT macros do it; every other field starts at zero, which means
 * "the default"). A library newer than the caller reads only the fields the
 * caller knows and defaults the rest; an older library accepts a larger
 * struct as long as the fields it does not know are zero
 * (GSER_ERR_UNSUPPORTED otherwise). Output structs are written up to `size`
 * bytes. A size of 0 (a struct not initialised with its macro) is refused
 * with GSER_ERR_INVALID_ARG.
 */
#ifdef __cplusplus
#define GSER_STRUCT_INIT(type) ([] { type s_{}; s_.size = sizeof(type); return s_; }())
#else
#define GSER_STRUCT_INIT(type) {.size = sizeof(type)}
#endif

/** Where the bytes of a frame or a buffer live. */
typedef enum gser_memory {
    GSER_MEMORY_HOST = 0,   /**< ordinary host memory */
    GSER_MEMORY_DEVICE = 1, /**< GPU device memory */
} gser_memory_t;

/** A static name for a memory kind ("host", "device", "?" otherwise). */
GSER_API const char *gser_memory_str(gser_memory_t memory);

#ifdef __cplusplus
}
#endif

#endif /* GSER_DEFS_H */
