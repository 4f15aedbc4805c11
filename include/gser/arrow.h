/* gser — Arrow arrays (tables) through the Arrow C Data Interface and C
 * Device Data Interface. Link gser::arrow; no Arrow library is needed.
 *
 * A table is an Arrow array, usually a struct array whose children are the
 * columns (what libcudf's to_arrow_device and other engines produce). The
 * type "arrow.array" sends it with its schema by value in the header and
 * every buffer of every column as a gser buffer: with the "device" family
 * device buffers stay on the device (small ones gathered into one packed
 * frame, large ones zero-copy, per pack_max); with the "host" family the
 * same table arrives in host memory. Sliced arrays are compacted so that
 * only the visible rows travel.
 *
 *   sender:   gser_arrow_register(ctx);
 *             gser_arrow_new_value(msg, &device_array, &schema, NULL, &v);
 *             ... gser_serialize ...
 *   receiver: gser_arrow_register(ctx);
 *             ... gser_deserialize -> v ...
 *             gser_arrow_take_value(v, NULL, &device_array, &schema);
 *             gser_msg_destroy(msg);   the arrays live on until released
 */
#ifndef GSER_ARROW_H
#define GSER_ARROW_H

#include <stdint.h>

#include "gser/context.h"
#include "gser/defs.h"
#include "gser/value.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the Arrow C Data Interface and C Device Data Interface -------------- */
/* A stable ABI, as published in the Arrow format specification; the guards
 * let this header coexist with Arrow's own abi.h or nanoarrow. */

#ifndef ARROW_C_DATA_INTERFACE
#define ARROW_C_DATA_INTERFACE

#define ARROW_FLAG_DICTIONARY_ORDERED 1
#define ARROW_FLAG_NULLABLE 2
#define ARROW_FLAG_MAP_KEYS_SORTED 4

struct ArrowSchema {
    /* Array type description */
    const char *format;
    const char *name;
    const char *metadata;
    int64_t flags;
    int64_t n_children;
    struct ArrowSchema **children;
    struct ArrowSchema *dictionary;

    /* Release callback */
    void (*release)(struct ArrowSchema *);
    /* Opaque producer-specific data */
    void *private_data;
};

struct ArrowArray {
    /* Array data description */
    int64_t length;
    int64_t null_count;
    int64_t offset;
    int64_t n_buffers;
    int64_t n_children;
    const void **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;

    /* Release callback */
    void (*release)(struct ArrowArray *);
    /* Opaque producer-specific data */
    void *private_data;
};

#endif /* ARROW_C_DATA_INTERFACE */

#ifndef ARROW_C_DEVICE_DATA_INTERFACE
#define ARROW_C_DEVICE_DATA_INTERFACE

/* Device type of the memory (the dlpack DLDeviceType values). */
typedef int32_t ArrowDeviceType;

#define ARROW_DEVICE_CPU 1
#define ARROW_DEVICE_CUDA 2
#define ARROW_DEVICE_CUDA_HOST 3
#define ARROW_DEVICE_OPENCL 4
#define ARROW_DEVICE_VULKAN 7
#define ARROW_DEVICE_METAL 8
#define ARROW_DEVICE_VPI 9
#define ARROW_DEVICE_ROCM 10
#define ARROW_DEVICE_ROCM_HOST 11
#define ARROW_DEVICE_EXT_DEV 12
#define ARROW_DEVICE_CUDA_MANAGED 13
#define ARROW_DEVICE_ONEAPI 14
#define ARROW_DEVICE_WEBGPU 15
#define ARROW_DEVICE_HEXAGON 16

struct ArrowDeviceArray {
    /* The array; its buffers (and its children's) are on the device. */
    struct ArrowArray array;
    /* Which device of device_type (-1 where the type has no ids, e.g. CPU). */
    int64_t device_id;
    ArrowDeviceType device_type;
    /* An event to wait for before reading the buffers (cudaEvent_t * for
     * CUDA), or NULL when no synchronization is needed. */
    void *sync_event;
    /* Reserved for future expansion: must be zero. */
    int64_t reserved[3];
};

#endif /* ARROW_C_DEVICE_DATA_INTERFACE */

/* ---- the gser type ----------------------------------------------------------- */

/** The registered type's name and version. */
#define GSER_ARROW_TYPE "arrow.array"
#define GSER_ARROW_TYPE_VERSION 1

/**
 * Register the type "arrow.array" (version GSER_ARROW_TYPE_VERSION) with the
 * families "device" and "host". Call it on the sender's and the receiver's
 * context before their first serialize/deserialize. Supported formats: null,
 * bool, int8..64, uint8..64, float16/32/64, date32/64, time32/64, timestamp
 * (every unit, with a timezone), duration, interval, decimal (32, 64, 128 and
 * 256 bits), utf8/binary and their large variants, fixed-size binary,
 * list/large list, fixed-size list, map, struct, and dictionary-encoded
 * arrays of any of these. Anything else (unions, run-end encoded, views) is
 * refused with GSER_ERR_UNSUPPORTED, naming the column and its format.
 */
GSER_API gser_status_t gser_arrow_register(gser_context_t *ctx);

/** Flags of gser_arrow_send_options_t (distinct from the take flags). */
enum {
    /** Check every offset of each string and list column when serializing,
     *  not only the first and last: one pass over the offsets on the CPU, or
     *  on the device for device columns (gser_device_check_offsets). Off by
     *  default: the sender never reads through the offsets between, and the
     *  receiver checks all of them anyway; on for a clear error at the
     *  producer instead of one at the peer. */
    GSER_ARROW_CHECK_OFFSETS = 1u << 8,
};

/** Options of gser_arrow_new_value: start from GSER_ARROW_SEND_OPTIONS_INIT, then set what you need. */
typedef struct gser_arrow_send_options {
    size_t size; /**< sizeof(gser_arrow_send_options_t): GSER_ARROW_SEND_OPTIONS_INIT sets it */
    unsigned flags; /**< GSER_ARROW_CHECK_OFFSETS */
    /**
     * The stream (cudaStream_t) on which gser compacts sliced device columns
     * (bit shifts, offset rebases) and reads what it must know on the host
     * (the first and last offset of device string and list columns, the
     * validity bytes of sliced parts with nulls, to count them), when
     * serializing; NULL = the per-thread default stream. The reads of one
     * nesting level are waited for together. The table's sync_event is
     * waited for by the packing of its buffers, but gser cannot yet make this
     * stream wait for a foreign event: when the table has a sync_event, give
     * the stream that produced the table (or one ordered after sync_event).
     */
    void *stream;
} gser_arrow_send_options_t;

#define GSER_ARROW_SEND_OPTIONS_INIT GSER_STRUCT_INIT(gser_arrow_send_options_t)

/**
 * An "arrow.array" value for a table: array (any device type gser can read:
 * CPU, CUDA_HOST, CUDA, CUDA_MANAGED) described by schema. Borrowed: both
 * must stay valid and unchanged until serialization is done (the frames of
 * gser_serialize are destroyed); gser never calls their release callbacks.
 * Device buffers need the context's device backend. The table is checked when
 * serialized: invalid input (negative length, offset or null count, offsets
 * out of bounds or decreasing, a NULL buffer the format needs, a NULL release
 * callback, n_buffers or n_children not matching the format) fails
 * gser_serialize with GSER_ERR_INVALID_ARG (GSER_ERR_OUT_OF_RANGE for
 * offsets, GSER_ERR_UNSUPPORTED for formats and device types), and the
 * context's last error names the column path, e.g. `column "a.b" (format
 * "+l"): offset 5 (3) is less than offset 4 (7)`. Of the offsets of a string
 * or list column, the first and last sent are checked (they size the data);
 * the ones between only with GSER_ARROW_CHECK_OFFSETS, or when they were
 * read anyway (short device columns). opts may be NULL.
 */
GSER_API gser_status_t gser_arrow_new_value(gser_msg_t *msg, const struct ArrowDeviceArray *array,
                                            const struct ArrowSchema *schema, const gser_arrow_send_options_t *opts,
                                            gser_value_t **out);

/** Flags of gser_arrow_take_options_t. */
enum {
    /** Put every buffer in device memory (ARROW_DEVICE_CUDA), copying what
     *  arrived in host memory (e.g. a CPU table, or the "host" family): one
     *  copy per frame. Needs a device backend. */
    GSER_ARROW_TO_DEVICE = 1u << 0,
    /** Put every buffer in host memory (ARROW_DEVICE_CPU), copying what
     *  arrived in device memory. */
    GSER_ARROW_TO_HOST = 1u << 1,
    /** Borrow instead of own: the arrays point into the message and its
     *  frames and copy nothing for their lifetime; keep the message alive
     *  until every array taken from it is released. */
    GSER_ARROW_BORROW = 1u << 2,
};

/** Options of gser_arrow_take_value: start from GSER_ARROW_TAKE_OPTIONS_INIT, then set what you need. */
typedef struct gser_arrow_take_options {
    size_t size; /**< sizeof(gser_arrow_take_options_t): GSER_ARROW_TAKE_OPTIONS_INIT sets it */
    unsigned flags; /**< GSER_ARROW_* */
    /** The stream (cudaStream_t) for copies and for the event sync_event
     *  points at; NULL = the per-thread default stream. Copies out of device
     *  memory gser_deserialize filled wait for its copies (gser_msg_wait)
     *  first; frames that arrived in device memory are taken as they are. */
    void *stream;
} gser_arrow_take_options_t;

#define GSER_ARROW_TAKE_OPTIONS_INIT GSER_STRUCT_INIT(gser_arrow_take_options_t)

/**
 * Take the table of a deserialized "arrow.array" value: on success *out_array
 * and *out_schema own what they describe, and each is freed by its release
 * callback, exactly once, when the last of it (the parent and any children
 * moved out of it) is released. The arrays do not need the message: its
 * frames that hold their buffers are taken from it (gser_msg_take_frame;
 * zero-copy), and what the message cannot hand over (frames it borrowed,
 * small buffers inlined in the header, device memory it made with
 * GSER_DESERIALIZE_RESTORE_DEVICE or _SCATTER) is copied once, into one
 * allocation per memory kind, before this call returns. With
 * GSER_ARROW_BORROW nothing is taken or copied. The context must outlive the
 * arrays.
 *
 * device_type is ARROW_DEVICE_CUDA when the buffers are in device memory
 * (also with the emulated backend, whose "device" memory is host memory
 * standing in for it), ARROW_DEVICE_CPU otherwise (device_id -1). Buffers
 * that arrived in both kinds go to the device unless GSER_ARROW_TO_HOST is
 * set. With the CUDA backend sync_event points at a cudaEvent_t recorded on
 * opts->stream after every copy (or at the event of the copies gser_deserialize
 * made, when borrowing them), owned by the arrays; with the emulated backend
 * and for CPU arrays it is NULL, as the work is done when this returns.
 *
 * Once taken, the message's own buffer values of this table may point into
 * memory the arrays own: read the table through the arrays.
 *
 * GSER_ERR_TYPE_MISMATCH if v is not a deserialized "arrow.array" object,
 * GSER_ERR_STATE if its table was taken already, GSER_ERR_INVALID_ARG for
 * both GSER_ARROW_TO_DEVICE and GSER_ARROW_TO_HOST, GSER_ERR_NO_DEVICE when
 * the table must go to the device and there is no device backend. opts may be
 * NULL.
 */
GSER_API gser_status_t gser_arrow_take_value(gser_value_t *v, const gser_arrow_take_options_t *opts,
                                             struct ArrowDeviceArray *out_array, struct ArrowSchema *out_schema);

/* ---- device ops on Arrow columns (implemented by gser itself) -------------- */
/* For producers and receivers of device tables (gser::arrow uses them) that
 * must not copy a column to the host to rebase, slice or check it. */

/**
 * Rebase an offsets buffer so that it starts at 0: dst[i] = src[i] - src[0]
 * for count offsets of width 4 (int32) or 8 (int64) bytes, queued on stream.
 * src[0] is read on the device (no host round trip). Both buffers are device
 * memory, aligned to width, and must not overlap. count 0 does nothing.
 *
 * @return GSER_OK when queued;
 *         GSER_ERR_INVALID_ARG for a width other than 4 or 8, NULL, misaligned
 *         or overlapping buffers;
 *         GSER_ERR_NO_DEVICE when ctx has no device backend;
 *         GSER_ERR_DEVICE when the device failed (the context's last error
 *         has the backend's message).
 */
GSER_API gser_status_t gser_device_rebase_offsets(gser_context_t *ctx, void *dst, const void *src, size_t count,
                                                  size_t width, void *stream);

/**
 * Copy the bit range [src_bit_offset, src_bit_offset + nbits) of the bitmap
 * src (least significant bit first, as Arrow orders them) to bits
 * [0, nbits) of dst, queued on stream: (nbits + 7) / 8 bytes of dst are
 * written, the bits past nbits in the last one as 0. No byte of src outside
 * the range is read. Both are device memory and must not overlap.
 *
 * @return GSER_OK when queued (also for nbits 0, which does nothing);
 *         GSER_ERR_INVALID_ARG for NULL or overlapping buffers, or a bit range
 *         past 2^64;
 *         GSER_ERR_NO_DEVICE when ctx has no device backend;
 *         GSER_ERR_DEVICE when the device failed.
 */
GSER_API gser_status_t gser_device_copy_bits(gser_context_t *ctx, void *dst, const void *src,
                                             uint64_t src_bit_offset, uint64_t nbits, void *stream);

/** What gser_device_check_offsets found wrong (bits of its verdict). */
enum {
    GSER_OFFSETS_FIRST = 1u << 0,    /**< the first offset is not 0 */
    GSER_OFFSETS_DECREASE = 1u << 1, /**< some offset is less than the one before */
    GSER_OFFSETS_LAST = 1u << 2,     /**< the last offset is not end */
};

/**
 * Check an Arrow offsets buffer in device memory without copying it to the
 * host: count signed offsets of width 4 or 8 bytes must start at 0, never
 * decrease, and end at end (the size of what they index). One pass on the
 * device, ordered on stream; the call waits for the verdict: 0 when valid,
 * else GSER_OFFSETS_* bits. For receivers that must not trust a peer's
 * device buffers (plugins/arrow). count 0 is valid.
 *
 * @return GSER_OK with *verdict set (0: valid);
 *         GSER_ERR_INVALID_ARG for a width other than 4 or 8, or NULL or
 *         misaligned offsets;
 *         GSER_ERR_NO_DEVICE when ctx has no device backend;
 *         GSER_ERR_DEVICE when the device failed.
 */
GSER_API gser_status_t gser_device_check_offsets(gser_context_t *ctx, const void *offsets, size_t count, size_t width,
                                                 uint64_t end, void *stream, uint32_t *verdict);

#ifdef __cplusplus
}
#endif

#endif /* GSER_ARROW_H */
