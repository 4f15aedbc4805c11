/* gser — serialization to header + frames, deserialization, flattening.
 *
 * gser_serialize turns a message into frame 0 = a msgpack header plus data
 * frames that borrow the message's buffers (zero-copy). gser_deserialize
 * rebuilds a message from frames, zero-copy where it can. The flattened form
 * puts header and frames into one byte string with a small fixed prefix, for
 * files and plain sockets. docs/wire-format.md is the normative spec.
 */
#ifndef GSER_SERIALIZE_H
#define GSER_SERIALIZE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "gser/context.h"
#include "gser/defs.h"
#include "gser/value.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Version of the header format this build reads and writes (see
 *  docs/wire-format.md). Version 2 added strides to buffers, version 3
 *  compressed frames. A message with no compressed frame is written as
 *  version 2, byte for byte what the builds before version 3 wrote. */
#define GSER_WIRE_VERSION 3
/** The oldest header format version this build reads (version 1 is version 2
 *  without strides). */
#define GSER_WIRE_VERSION_MIN 1

/**
 * One frame: bytes somewhere in memory. Produced frames borrow (release is
 * NULL). A frame passed to gser_deserialize with release set is owned by the
 * resulting message from the moment the call succeeds: it calls
 * release(data, release_arg) once when destroyed.
 */
typedef struct gser_frame {
    const void *data;
    size_t size;
    gser_memory_t memory;
    int32_t device;
    gser_release_fn release;
    void *release_arg;
    /** Room for later fields (frames are array elements, so they cannot carry
     *  a size): must be zero; gser_deserialize refuses a frame that sets them. */
    uint64_t reserved[4];
} gser_frame_t;

/** Frame compression (gser_serialize_options_t.compression). Every choice
 *  but NONE samples each eligible frame first, as Dask's maybe_compress
 *  does: a frame is eligible when it is host memory (device frames and host
 *  frames staged from the device are never compressed) of at least
 *  GSER_COMPRESS_MIN_SIZE bytes; GSER_COMPRESS_NSAMPLES pieces of
 *  GSER_COMPRESS_SAMPLE_SIZE bytes spread over it are compressed together,
 *  then the whole frame if the sample shrank to at most
 *  GSER_COMPRESS_THRESHOLD of its size, and the result is kept if it also
 *  did. A frame of at most GSER_COMPRESS_SAMPLE_WHOLE bytes is sampled by
 *  one piece from its middle instead (unlike Dask, which takes five from
 *  any frame larger than the sample), and one no larger than the five
 *  pieces is not sampled. The wire values of the codecs are LZ4 and ZSTD. */
typedef enum gser_compression {
    GSER_COMPRESSION_NONE = 0, /**< no compression (the default) */
    GSER_COMPRESSION_LZ4 = 1,  /**< LZ4 block format (liblz4); frames over 2,113,929,216 bytes stay as they are */
    GSER_COMPRESSION_ZSTD = 2, /**< one Zstandard frame (libzstd) */
    GSER_COMPRESSION_AUTO = 3, /**< what Dask's "auto" picks: lz4 */
} gser_compression_t;

#define GSER_COMPRESS_MIN_SIZE 10000   /**< smaller frames are not compressed (Dask's min_size) */
#define GSER_COMPRESS_SAMPLE_SIZE 10000 /**< bytes per sample (Dask's sample_size) */
#define GSER_COMPRESS_NSAMPLES 5        /**< samples per frame (Dask's nsamples) */
#define GSER_COMPRESS_SAMPLE_WHOLE 200000 /**< frames up to this are sampled by one piece, not five */
#define GSER_COMPRESS_THRESHOLD 0.9     /**< kept when compressed size <= this times the input (Dask's 0.9) */
#define GSER_COMPRESS_CHUNK_MIN ((size_t)4096)    /**< smallest gser_serialize_options_t.compression_chunk_size */
#define GSER_COMPRESS_CHUNK_MAX ((size_t)1 << 30) /**< largest gser_serialize_options_t.compression_chunk_size */

/** Serialize options: start from GSER_SERIALIZE_OPTIONS_INIT, then set what you need. */
typedef struct gser_serialize_options {
    size_t size; /**< sizeof(gser_serialize_options_t): GSER_SERIALIZE_OPTIONS_INIT sets it */
    /** Families to try for typed objects, in order. NULL = {"device", "host"}. */
    const char *const *families;
    size_t nfamilies;
    /** 0 = the context's inline_max / array_min / pack_max. */
    size_t inline_max;
    size_t array_min;
    size_t pack_max;
    /** The CUDA stream (cudaStream_t) to order device work on; NULL = the
     *  per-thread default stream. gser never synchronizes the legacy default
     *  stream or the device. */
    void *stream;
    /** A gser_compression_t: compress host data frames where it pays.
     *  NONE (0) writes exactly what builds without compression wrote. The
     *  compressed frames belong to the frames object; the header records
     *  each one's codec and uncompressed size (wire version 3). */
    int compression;
    /** Codec level: zstd's compression level, lz4's acceleration; 0 = the
     *  codec's default (zstd 3, lz4 1). */
    int compression_level;
    /** Keep a frame compressed only when its sample and its whole shrink to
     *  at most this fraction of their size, in (0, 1]; 0 = the default
     *  GSER_COMPRESS_THRESHOLD (0.9, Dask's). Lower keeps only data that
     *  compresses well: a writer whose bytes go to memory or a page cache
     *  rather than a slow link may not gain by compressing what shrinks
     *  to only half. */
    double compression_threshold;
    /** 0: each frame is compressed whole. Else a frame larger than this
     *  is compressed in chunks of this many bytes (GSER_COMPRESS_CHUNK_MIN
     *  to _MAX), each sampled and kept compressed only where it shrinks to
     *  the threshold, the others stored as they are; the frame is kept so
     *  when all of it shrinks to GSER_COMPRESS_THRESHOLD (or the threshold,
     *  if higher). A frame whose parts differ
     *  (a block of pandas columns, one of them incompressible) then costs
     *  codec time only where the codec pays. Readers from before this field
     *  refuse such frames (wire codecs 3 and 4, docs/wire-format.md 3.3):
     *  for files and peers of this build or newer. */
    size_t compression_chunk_size;
    /** 0: no limit. Else host frames larger than this many bytes are left
     *  uncompressed: for a transport that compresses them itself as it
     *  sends them (gser::ucx's chunked route, docs/ucx.md 4.6). Since 0.2. */
    size_t compression_max_size;
    /** false (the default): int arrays go as int64, the frame being the
     *  list's own memory (zero-copy). true: an int array of at least
     *  GSER_COMPRESS_MIN_SIZE bytes as int64 whose items all fit int8, int16
     *  or int32 is written that narrow (one copy; the reader widens it back
     *  to int64, docs/wire-format.md 4.6): fewer bytes, and no high zero
     *  bytes for a transport's compression to spend time on (what the Python
     *  module asks for). Readers from before this field refuse such arrays.
     *  Since 0.2. */
    bool narrow_ints;
} gser_serialize_options_t;

#define GSER_SERIALIZE_OPTIONS_INIT GSER_STRUCT_INIT(gser_serialize_options_t)

/**
 * Serialize the tree rooted at msg's root. On success *frames_out holds
 * frame 0 (the header, owned by the frames object) and the data frames,
 * which borrow the message's buffers: keep msg (and every buffer it borrows)
 * alive and unchanged until gser_frames_destroy. opts may be NULL.
 *
 * Device buffers go to the first of "device" and "host" in the family list:
 * "device" makes device frames (small buffers gathered by one kernel into one
 * packed frame, large ones zero-copy); "host" packs them on the device and
 * copies them to pinned host memory with one copy. That work is queued on
 * opts->stream: frames are usable once gser_frames_wait says so.
 */
GSER_API gser_status_t gser_serialize(gser_context_t *ctx, const gser_msg_t *msg,
                                      const gser_serialize_options_t *opts, gser_frames_t **frames_out);

/** Number of frames, the header included. */
GSER_API size_t gser_frames_get_count(const gser_frames_t *frames);

/** The frames as an array of gser_frames_get_count entries; [0] is the header. */
GSER_API const gser_frame_t *gser_frames_get_array(const gser_frames_t *frames);

/** Block until the device work behind the frames (packing, copies) is done.
 *  GSER_OK at once when there was none. */
GSER_API gser_status_t gser_frames_wait(const gser_frames_t *frames);

/** GSER_OK if the frames are ready to be read, GSER_INPROGRESS if device
 *  work is still running. */
GSER_API gser_status_t gser_frames_query(const gser_frames_t *frames);

/** An event (cudaEvent_t) that completes when the frames are ready, for
 *  ordering other streams after them; NULL when no device work was queued. */
GSER_API void *gser_frames_get_event(const gser_frames_t *frames);

/** Free a frames object (not the message it borrows from), waiting for its
 *  device work first. NULL is fine. */
GSER_API void gser_frames_destroy(gser_frames_t *frames);

/** Deserialize flags. */
enum {
    /** Keep every typed object serialized (pass-through); no type code runs. */
    GSER_DESERIALIZE_KEEP_SERIALIZED = 1u << 0,
    /** Keep objects of unregistered types (or families) serialized instead of
     *  failing with GSER_ERR_UNKNOWN_TYPE. */
    GSER_DESERIALIZE_ALLOW_UNKNOWN = 1u << 1,
    /** Give every device buffer an allocation of its own (one scatter kernel
     *  for the message) instead of a view into its frame. */
    GSER_DESERIALIZE_SCATTER = 1u << 2,
    /** Put buffers that were device memory at the sender but arrived in host
     *  frames (the "host" family, a file) back on the device: one copy per
     *  frame, then views (or a scatter with GSER_DESERIALIZE_SCATTER). */
    GSER_DESERIALIZE_RESTORE_DEVICE = 1u << 3,
    /** gser_deserialize_fd on a regular file: map the file instead of reading
     *  it. The message owns the mapping (private, copy-on-write: values may be
     *  written, the file never changes) and nothing is read until a value is
     *  used, so loading costs the same for any size. The file must not shrink
     *  while the message lives (reading a page past its end raises SIGBUS).
     *  Pipes, sockets and files that cannot be mapped are read as without it;
     *  other calls ignore it. */
    GSER_DESERIALIZE_MMAP = 1u << 4,
};

/** Deserialize options: start from GSER_DESERIALIZE_OPTIONS_INIT, then set what you need. */
typedef struct gser_deserialize_options {
    size_t size;                  /**< sizeof(gser_deserialize_options_t): GSER_DESERIALIZE_OPTIONS_INIT sets it */
    unsigned flags;               /**< GSER_DESERIALIZE_* */
    const gser_limits_t *limits;  /**< NULL = the context's limits */
    void *stream;                 /**< stream (cudaStream_t) for device copies; NULL = per-thread default */
} gser_deserialize_options_t;

#define GSER_DESERIALIZE_OPTIONS_INIT GSER_STRUCT_INIT(gser_deserialize_options_t)

/**
 * Rebuild a message from frames[0] (header) and the data frames. The message
 * borrows the frames (values point into them) unless a frame's release hands
 * it over; keep borrowed frames valid until the message is destroyed.
 * opts may be NULL. Untrusted input is safe: it never reads out of bounds and
 * stops at the limits. Compressed frames (wire version 3) are decompressed
 * into buffers the message owns, their declared sizes checked against the
 * limits before anything is allocated; data that does not decompress to
 * exactly its declared size is GSER_ERR_COMPRESSED.
 */
GSER_API gser_status_t gser_deserialize(gser_context_t *ctx, const gser_frame_t *frames, size_t nframes,
                                        const gser_deserialize_options_t *opts, gser_msg_t **msg_out);

/** The frames a deserialized message was built from (header first); NULL
 *  and 0 for a message built by hand. */
GSER_API const gser_frame_t *gser_msg_get_frames(const gser_msg_t *msg, size_t *nframes);

/** Block until the device copies gser made while deserializing (restored and
 *  scattered buffers, whose descriptions carry the same event) are done.
 *  GSER_OK at once when there were none. */
GSER_API gser_status_t gser_msg_wait(const gser_msg_t *msg);

/**
 * How frame i of a deserialized message arrived: *codec is
 * GSER_COMPRESSION_LZ4 or _ZSTD for a frame that came compressed (wire
 * version 3), GSER_COMPRESSION_NONE otherwise, and *wire_size the size it
 * had as given. gser_msg_get_frames has the decompressed frame, which the
 * message owns (the compressed one, if the message was handed it, is
 * released once it is decompressed). A frame compressed in chunks
 * (gser_serialize_options_t.compression_chunk_size) reports its codec too;
 * gser_msg_get_frame_chunks tells its chunks.
 */
GSER_API gser_status_t gser_msg_get_frame_codec(const gser_msg_t *msg, size_t i, int *codec, size_t *wire_size);

/**
 * The chunks of frame i of a deserialized message, for a frame that came
 * compressed in chunks: *chunk_size the bytes of each (the last may be
 * shorter), *nchunks how many, *ncompressed how many of those came
 * compressed (the others were stored as they are). 0, 0, 0 for any other
 * frame. GSER_ERR_OUT_OF_RANGE for i past the last frame.
 */
GSER_API gser_status_t gser_msg_get_frame_chunks(const gser_msg_t *msg, size_t i, size_t *chunk_size,
                                                 size_t *nchunks, size_t *ncompressed);

/**
 * Take ownership of frame i of a deserialized message (e.g. a received packed
 * device frame): *frame gets it with its release callback, and the message
 * will no longer release it. Values keep pointing into it, so keep the frame
 * alive as long as the message is used. GSER_ERR_STATE if the message does
 * not own that frame (it was borrowed, or taken already).
 */
GSER_API gser_status_t gser_msg_take_frame(gser_msg_t *msg, size_t i, gser_frame_t *frame);

/* ---- flattened form ---------------------------------------------------- */

/** Bytes needed to flatten these frames (host memory only). */
GSER_API gser_status_t gser_flat_size(const gser_frame_t *frames, size_t nframes, size_t *size_out);

/** Memory for gser_serialize_flat: size bytes the caller owns, or NULL. */
typedef void *(*gser_flat_alloc_fn)(void *arg, size_t size);

/**
 * Serialize msg straight into its flattened form: the frames are sized,
 * alloc(alloc_arg, size) is called once for the whole, and everything is
 * written into it once. Device buffers (opts->families must send them to
 * "host", and must not contain "device") are copied by one batch straight
 * from the device into their places in that memory, which is registered
 * with the device for the copy (cudaHostRegister: on a GPU, registering
 * costs about as much as pinning the pages; memory that is pinned already
 * costs nothing more). Returns when the bytes are written; *written is the
 * size. On failure the memory alloc returned is the caller's to free.
 */
GSER_API gser_status_t gser_serialize_flat(gser_context_t *ctx, const gser_msg_t *msg,
                                           const gser_serialize_options_t *opts, gser_flat_alloc_fn alloc,
                                           void *alloc_arg, size_t *written);

/** Flatten frames into dst (capacity cap); *written is set on success. */
GSER_API gser_status_t gser_flat_write(const gser_frame_t *frames, size_t nframes, void *dst, size_t cap,
                                       size_t *written);

/** Flatten frames to a file descriptor (a file, pipe or socket; no seeking):
 *  the prefix and the frames go from their own memory with writev, a few
 *  calls for the whole message, retrying short writes; nothing is copied
 *  into one buffer first. GSER_ERR_IO leaves errno as the write set it
 *  (ENOSPC for a full disk, EAGAIN for a non-blocking descriptor that is
 *  full). */
GSER_API gser_status_t gser_flat_write_fd(const gser_frame_t *frames, size_t nframes, int fd);

/** Flatten frames to a stdio stream. */
GSER_API gser_status_t gser_flat_write_file(const gser_frame_t *frames, size_t nframes, FILE *f);

/** Where gser_flat_write_sink puts the flattened bytes, piece by piece:
 *  anything but GSER_OK stops the writing and is returned. */
typedef gser_status_t (*gser_flat_sink_fn)(void *arg, const void *data, size_t size);

/** Flatten frames through sink, in order: the prefix and size table, then
 *  each frame (from its own memory) and its padding; pieces of 0 bytes are
 *  left out. For writers that are neither descriptors nor stdio streams. */
GSER_API gser_status_t gser_flat_write_sink(const gser_frame_t *frames, size_t nframes, gser_flat_sink_fn sink,
                                            void *arg);

/**
 * How many bytes the flattened message that starts with the len bytes at
 * buf needs, as far as they tell: 8 (the magic) for no bytes, then the
 * 16-byte prefix, then the prefix and the size table, then the whole
 * message. What is there is checked as gser_deserialize_flat checks it (the
 * same errors: magic, version, flags, the limits of opts or the context), so
 * a reader of a stream reads exactly *need_out bytes and asks again, until
 * the answer stops changing. opts may be NULL.
 */
GSER_API gser_status_t gser_flat_get_need(gser_context_t *ctx, const void *buf, size_t len,
                                          const gser_deserialize_options_t *opts, uint64_t *need_out);

/**
 * Deserialize a flattened message in buf. Zero-copy: the message borrows buf
 * (keep it valid until the message is destroyed) unless release is set, in
 * which case the message owns buf from success on and calls
 * release(buf, release_arg) once when destroyed. Frames that are not
 * suitably aligned in buf are copied.
 */
GSER_API gser_status_t gser_deserialize_flat(gser_context_t *ctx, const void *buf, size_t len,
                                             gser_release_fn release, void *release_arg,
                                             const gser_deserialize_options_t *opts, gser_msg_t **msg_out);

/**
 * Read one flattened message from fd and deserialize it; the message owns
 * the bytes read. The magic, prefix and size table are checked before more
 * is read, and nothing past the message is read: from a pipe or socket,
 * exactly one message (another may follow), in memory that grows with what
 * arrives; a regular file must hold exactly one message from the current
 * offset (GSER_ERR_TRUNCATED for a table that declares more, before it is
 * read; GSER_ERR_FORMAT for bytes after it). From a regular file the frames
 * are read straight into one buffer of the message's size (huge pages where
 * the kernel allows), or, with GSER_DESERIALIZE_MMAP, not read at all: the
 * file is mapped. Either way the errors are those of gser_deserialize_flat
 * on the same bytes, and the offset ends past the message. A compressed
 * frame's bytes are handed back to the system once it is decompressed (the
 * message keeps the buffer only for the frames that view it): whole huge
 * pages of a read buffer, whole pages of a mapping.
 */
GSER_API gser_status_t gser_deserialize_fd(gser_context_t *ctx, int fd, const gser_deserialize_options_t *opts,
                                           gser_msg_t **msg_out);

#ifdef __cplusplus
}
#endif

#endif /* GSER_SERIALIZE_H */
