/* gser — the UCX transport (library gser::ucx, plugins/ucx).
 *
 * Moves serialized messages (a header frame plus data frames, as produced by
 * gser_serialize) between processes and nodes with UCX, and hands the
 * received frames to gser_deserialize. docs/ucx.md specifies the wire
 * protocol: a handshake per connection on a TCP connection gser owns (a
 * fixed-size hello read under a deadline, an optional shared secret, then
 * UCX endpoints made from worker addresses; afterwards heartbeats), then per
 * message one send holding the header, the frame table and the small
 * frames, followed by one tagged send per large frame. Nothing is
 * encrypted: use it on trusted networks or with the secret (docs/ucx.md
 * section 2.3).
 *
 * Objects: a transport context (one UCX context), workers (one UCX worker
 * each: progress, event file descriptor, thread mode), listeners and
 * endpoints on a worker, and requests for operations in flight.
 *
 * Every call returns a gser_status_t; outputs are set only on success.
 * Asynchronous operations make progress only inside gser_ucx_worker_progress
 * and the blocking calls (wait, send, recv, accept, connect). Completion
 * callbacks run inside those calls, never inside the call that started the
 * operation, and may call any gser_ucx function except the destroy ones on
 * their own worker. gser_ucx_get_last_error gives a detailed message.
 */
#ifndef GSER_UCX_H
#define GSER_UCX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gser/context.h"
#include "gser/defs.h"
#include "gser/serialize.h"
#include "gser/value.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Version of the transport's own wire protocol (handshake and per-message
 *  layout, docs/ucx.md). Both sides of a connection must speak the same. */
#define GSER_UCX_WIRE_VERSION 5

/** peer_timeout_ms that turns the silent-peer check off. */
#define GSER_UCX_PEER_TIMEOUT_NONE 0xffffffffu

/** The environment variable a transport context takes its shared secret
 *  from when its options name none. */
#define GSER_UCX_SECRET_ENV "GSER_UCX_SECRET"

/** Capability bits exchanged in the handshake. */
enum {
    /** This side's UCX can read and write CUDA device memory. */
    GSER_UCX_CAP_CUDA = 1u << 0,
    /** This side reads lz4-compressed frames (wire version 3). */
    GSER_UCX_CAP_LZ4 = 1u << 1,
    /** This side reads zstd-compressed frames (wire version 3). */
    GSER_UCX_CAP_ZSTD = 1u << 2,
    /** This side reads large host frames sent in compressed chunks (the
     *  head's route 3, docs/ucx.md section 4.6): the sender compresses
     *  chunk k+1 while chunk k is on the wire and the receiver decompresses
     *  each chunk as it arrives. Used only when both sides announce it and
     *  a codec. Since 0.2. */
    GSER_UCX_CAP_CHUNKED = 1u << 3,
};

/** What an endpoint compresses (gser_ucx_worker_options_t.compression,
 *  gser_ucx_ep_set_compression). An endpoint only ever writes a codec that
 *  both sides announced in their handshake (GSER_UCX_CAP_LZ4/_ZSTD); with a
 *  peer that announced none, nothing is compressed. Every choice but NONE
 *  samples each host frame as gser_serialize does (GSER_COMPRESS_*), so a
 *  frame that does not shrink travels as it is. docs/ucx.md section 4.5. */
typedef enum gser_ucx_compression {
    /** By transport (the default): NONE towards a peer on this host (its
     *  control connection's peer address is a loopback address or this
     *  side's own address: shared memory or loopback, where moving bytes is
     *  cheaper than compressing them), AUTO towards any other host. */
    GSER_UCX_COMPRESSION_DEFAULT = 0,
    GSER_UCX_COMPRESSION_NONE = 1, /**< never */
    /** link-aware, on every transport: per message of 1 MiB or more, the
     *  codec (none, lz4, zstd) that moves it fastest given the rate the
     *  endpoint's sends achieve and each codec's measured speed and ratio
     *  (docs/ucx.md 4.5); the first such message goes raw (it measures
     *  the link) unless another endpoint of the worker to that host
     *  measures it now (then lz4 where the sample shrinks), smaller ones
     *  before it lz4 */
    GSER_UCX_COMPRESSION_AUTO = 2,
    GSER_UCX_COMPRESSION_LZ4 = 3,  /**< sampled, lz4 only (nothing when the peer lacks it) */
    GSER_UCX_COMPRESSION_ZSTD = 4, /**< sampled, zstd only (nothing when the peer lacks it) */
} gser_ucx_compression_t;

typedef struct gser_ucx_context gser_ucx_context_t;
typedef struct gser_ucx_worker gser_ucx_worker_t;
typedef struct gser_ucx_listener gser_ucx_listener_t;
typedef struct gser_ucx_ep gser_ucx_ep_t;
typedef struct gser_ucx_request gser_ucx_request_t;

/** The detailed message of the last error this thread got from a gser_ucx
 *  call ("" if none). Valid until this thread's next gser_ucx call. */
GSER_API const char *gser_ucx_get_last_error(void);

/* ---- transport context ---------------------------------------------------- */

/** Transport context options. Start from its GSER_*_INIT macro, then set what you need. */
typedef struct gser_ucx_context_options {
    size_t size; /**< sizeof(gser_ucx_context_options_t): GSER_UCX_CONTEXT_OPTIONS_INIT sets it */
    /** UCX transports, as UCX_TLS would list them ("tcp", "posix,sysv,cma,self,tcp").
     *  NULL = the UCX_TLS environment variable, else UCX's default. Peers on
     *  one host need no network transport (gser connects them on its own
     *  socket); without tcp, UCX opens no port at all. */
    const char *transports;
    /** A connection whose peer sends nothing for this long, whether or not
     *  anything is pending on it, is declared failed: everything pending on
     *  it completes with GSER_ERR_CONNECTION, with a message that says the
     *  peer went silent and for how long. Both sides send a heartbeat every
     *  quarter of the shorter of their two timeouts, so an idle healthy
     *  connection stays up, and a peer that is stopped, hung, cut off by a
     *  partition, or no longer calling progress (or a blocking call, or
     *  waking on the event fd) is failed between three quarters of the
     *  timeout and the timeout after it went silent, plus the time this side
     *  takes to look. A peer whose process dies is noticed at once. A
     *  handshake must also finish within this time. 0 = 10000 ms;
     *  GSER_UCX_PEER_TIMEOUT_NONE = never (handshakes then get 10000 ms). */
    unsigned peer_timeout_ms;
    /** A shared secret (NUL-terminated). Every connection of this context
     *  then proves it, both ways, by challenge-response (HMAC-SHA-256 over a
     *  nonce from each side; the secret never crosses the wire); a peer that
     *  does not is refused with GSER_ERR_ACCESS before any UCX endpoint
     *  exists and before any byte of a message is read. NULL = the
     *  GSER_UCX_SECRET environment variable (none if unset or empty); "" =
     *  none. Copied. Nothing is encrypted: see docs/ucx.md section 2.3. */
    const char *secret;
    /** UCX network devices, as UCX_NET_DEVICES lists them ("eth0",
     *  "mlx5_0:1", "all"). NULL = the UCX_NET_DEVICES environment variable,
     *  else, for a worker that first listens on one address (not 0.0.0.0 or
     *  ::), the device that has that address, so that UCX opens no port on
     *  other interfaces; else all. */
    const char *net_devices;
} gser_ucx_context_options_t;

#define GSER_UCX_CONTEXT_OPTIONS_INIT GSER_STRUCT_INIT(gser_ucx_context_options_t)

/** Create a transport context (ucp_init). opts may be NULL. A worker's own
 *  UCX worker, and the ports of UCX's network transports, are opened when
 *  it first listens or connects. Where shared memory may be used and the
 *  environment sets no FIFO size, UCX's shared-memory FIFO holds 1024
 *  segments; its size goes in every handshake, and two processes of one
 *  host whose sizes differ are refused (docs/ucx.md sections 2.4 and 7).
 *  GSER_ERR_INVALID_ARG where the environment gives posix's and sysv's
 *  FIFOs different sizes (set UCX_MM_FIFO_SIZE instead). */
GSER_API gser_status_t gser_ucx_context_create(const gser_ucx_context_options_t *opts,
                                               gser_ucx_context_t **ctx_out);

/** Destroy a context; its workers must be destroyed first. NULL is fine. */
GSER_API void gser_ucx_context_destroy(gser_ucx_context_t *ctx);

/** GSER_UCX_CAP_* bits this context would announce in a handshake. */
GSER_API uint32_t gser_ucx_context_get_caps(const gser_ucx_context_t *ctx);

/* ---- workers ----------------------------------------------------------------- */

/** Which threads may call into one worker (the UCX thread modes). */
typedef enum gser_ucx_thread_mode {
    GSER_UCX_THREAD_SINGLE = 0,     /**< only the thread that created it */
    GSER_UCX_THREAD_SERIALIZED = 1, /**< any thread, one at a time (the caller serializes) */
    GSER_UCX_THREAD_MULTI = 2,      /**< any threads at once (the worker locks) */
} gser_ucx_thread_mode_t;

/** Worker options. Start from its GSER_*_INIT macro, then set what you need. */
typedef struct gser_ucx_worker_options {
    size_t size; /**< sizeof(gser_ucx_worker_options_t): GSER_UCX_WORKER_OPTIONS_INIT sets it */
    gser_ucx_thread_mode_t thread_mode;
    /** The gser context whose device backend allocates received device
     *  frames and runs staging copies. Borrowed: it must outlive the worker.
     *  NULL: no device backend; device frames are neither sent nor received. */
    gser_context_t *gser_ctx;
    /** Limits checked on every incoming message before anything is allocated
     *  for it (max_frames and max_bytes). NULL or zero fields = gser_ctx's
     *  limits (gser_context_get_limits), or the core's defaults without
     *  gser_ctx. A message over a limit is rejected and its endpoint closed.
     *  Copied. */
    const gser_limits_t *limits;
    /** Host frames of at most this many bytes travel inside the message's
     *  first send. 0 = 8192; SIZE_MAX is capped at the inline budget. */
    size_t inline_max;
    /** Most bytes of small frames inlined in one message's first send.
     *  0 = 65536. */
    size_t inline_budget;
    /** Device frames cross a UCX that cannot read device memory through
     *  pinned host bounce buffers of this many bytes. 0 = 4 MiB. */
    size_t staging_chunk;
    /** Bounce buffers in flight per staged frame and direction; at least 2.
     *  0 = 4. */
    unsigned staging_depth;
    /** Received host frames of 64 KiB or more use buffers that released
     *  frames gave back, cached up to this many bytes: a fresh buffer costs
     *  page faults on every byte. 0 = 256 MiB; 1 = no cache. The limit then
     *  grows to the host bytes of the largest message received, up to
     *  recv_cache_max_bytes. */
    size_t recv_cache_bytes;
    /** The most the receive cache may grow to. 0 = an eighth of physical
     *  memory; at most recv_cache_bytes (e.g. equal to it) = a fixed limit. */
    size_t recv_cache_max_bytes;
    /** Blocking calls on this worker sleep on the event file descriptor
     *  instead of polling (lower CPU use, higher latency). */
    bool blocking_sleep;
    /** A gser_ucx_compression_t: what its endpoints compress when they
     *  serialize (gser_ucx_ep_send_msg; the Python binding). 0 = by
     *  transport. Since 0.2. */
    int compression;
    /** Codec level (gser_serialize_options_t.compression_level); 0 = the
     *  codec's default. Since 0.2. */
    int compression_level;
    /** Host frames of at least this many bytes that an endpoint compresses
     *  (gser_ucx_ep_send_msg, a negotiated codec, a peer announcing
     *  GSER_UCX_CAP_CHUNKED) are not compressed by the serializer but sent
     *  in compressed chunks, pipelined with the sending. 0 = 8 MiB
     *  (GSER_UCX_CHUNKED_MIN_DEFAULT); SIZE_MAX = never. Since 0.2. */
    size_t chunked_min;
    /** Bytes of a frame per compressed chunk, GSER_UCX_CHUNK_MIN to
     *  GSER_UCX_CHUNK_MAX; 0 = 4 MiB. Since 0.2. */
    size_t chunked_size;
} gser_ucx_worker_options_t;

/** Default gser_ucx_worker_options_t.chunked_min. */
#define GSER_UCX_CHUNKED_MIN_DEFAULT ((size_t)8 << 20)
/** Range of gser_ucx_worker_options_t.chunked_size (and of a chunk size a
 *  receiver accepts on the wire). */
#define GSER_UCX_CHUNK_MIN ((size_t)1 << 20)
#define GSER_UCX_CHUNK_MAX ((size_t)4 << 20)

#define GSER_UCX_WORKER_OPTIONS_INIT GSER_STRUCT_INIT(gser_ucx_worker_options_t)

/** Create a worker. opts may be NULL. */
GSER_API gser_status_t gser_ucx_worker_create(gser_ucx_context_t *ctx, const gser_ucx_worker_options_t *opts,
                                              gser_ucx_worker_t **worker_out);

/**
 * Destroy a worker: its listeners and the endpoints it still has are closed
 * (what is in flight on them completes with GSER_ERR_CANCELED first), then
 * UCX's worker is destroyed. Requests the caller still holds stay valid to
 * test and free. NULL is fine.
 */
GSER_API void gser_ucx_worker_destroy(gser_ucx_worker_t *worker);

/** What a worker's cache of host receive buffers holds and did. */
typedef struct gser_ucx_cache_stats {
    size_t size; /**< sizeof(gser_ucx_cache_stats_t): GSER_UCX_CACHE_STATS_INIT sets it */
    size_t cached_bytes; /**< held for reuse now */
    size_t limit_bytes;  /**< the most it may hold now */
    uint64_t hits;       /**< frames received into a reused buffer */
    uint64_t misses;     /**< frames of 64 KiB or more that needed a fresh buffer */
} gser_ucx_cache_stats_t;

#define GSER_UCX_CACHE_STATS_INIT GSER_STRUCT_INIT(gser_ucx_cache_stats_t)

/** The receive cache's numbers now (see recv_cache_bytes). out->size must
 *  be set (GSER_UCX_CACHE_STATS_INIT). */
GSER_API gser_status_t gser_ucx_worker_get_cache_stats(gser_ucx_worker_t *worker, gser_ucx_cache_stats_t *out);

/** A host buffer of size bytes (contents undefined) from the worker's cache
 *  of receive buffers, for a frame the caller fills itself: a receiver that
 *  joins a message sent in parts gets warm, reused memory as received frames
 *  do, where a fresh allocation of tens of MiB would fault in every page
 *  again (malloc maps buffers that large anew each time). frame_out: data,
 *  size, GSER_MEMORY_HOST and the release that hands the buffer back (from
 *  any thread, also after the worker is destroyed). The cache grows to hold
 *  size as for a received message (recv_cache_max_bytes). */
GSER_API gser_status_t gser_ucx_worker_alloc_host(gser_ucx_worker_t *worker, size_t size, gser_frame_t *frame_out);

/**
 * Whether the worker can still receive. GSER_OK; GSER_INPROGRESS while a
 * check of its receive queue runs; GSER_ERR_CONNECTION once it failed for
 * good (gser_ucx_get_last_error() then says why): over shared memory a
 * local peer killed while it wrote into this worker's receive queue blocks
 * that queue in UCX 1.13, and nothing from a local peer arrives any more.
 * The worker checks itself after every peer that dies (it sends itself a
 * message: a round trip through its own queue, or 2 s when the message does
 * not arrive while the worker is progressed); when it fails, every endpoint fails with it and new
 * connections are refused. Create a new worker then. docs/ucx.md section 6.
 */
GSER_API gser_status_t gser_ucx_worker_get_status(gser_ucx_worker_t *worker);

/** Start a check of the worker's receive queue now, as after a peer's death
 *  (nothing when one runs or the worker failed); its result shows in
 *  gser_ucx_worker_get_status while the worker is progressed. */
GSER_API gser_status_t gser_ucx_worker_check_queue(gser_ucx_worker_t *worker);

/** Make progress: run UCX's progress, match incoming messages to pending
 *  receives, advance staging, and run completion callbacks. Returns how many
 *  events were handled (0: nothing happened). */
GSER_API unsigned gser_ucx_worker_progress(gser_ucx_worker_t *worker);

/** The worker's event file descriptor, for epoll/select/asyncio: readable
 *  when gser_ucx_worker_progress has work. See gser_ucx_worker_arm. */
GSER_API gser_status_t gser_ucx_worker_get_efd(gser_ucx_worker_t *worker, int *fd_out);

/**
 * Arm the event file descriptor before waiting on it. GSER_OK: armed, it is
 * safe to sleep until it is readable. GSER_INPROGRESS: events are pending,
 * or a device copy of a staged frame is running (its end does not show on
 * the fd); call gser_ucx_worker_progress and arm again.
 */
GSER_API gser_status_t gser_ucx_worker_arm(gser_ucx_worker_t *worker);

/** Progress until something happens or timeout_ms passes (-1: no limit),
 *  sleeping on the event file descriptor in between. GSER_OK or
 *  GSER_ERR_TIMEOUT. */
GSER_API gser_status_t gser_ucx_worker_wait(gser_ucx_worker_t *worker, int timeout_ms);

/* ---- listeners and endpoints ---------------------------------------------------- */

/** Called when an accepted connection finished its handshake (status
 *  GSER_OK, ep is the caller's to destroy) or failed it (ep NULL, e.g.
 *  GSER_ERR_WIRE_VERSION): such a failure concerns that peer alone
 *  (gser_ucx_status_is_peer_error), the listener goes on. */
typedef void (*gser_ucx_accept_fn)(gser_ucx_listener_t *listener, gser_ucx_ep_t *ep, gser_status_t status,
                                   void *user_data);

/** Listener options. Start from its GSER_*_INIT macro, then set what you need. */
typedef struct gser_ucx_listener_options {
    size_t size; /**< sizeof(gser_ucx_listener_options_t): GSER_UCX_LISTENER_OPTIONS_INIT sets it */
    /** IPv4 or IPv6 address to listen on; NULL = every interface. */
    const char *address;
    /** Port; 0 = a free one (see gser_ucx_listener_get_port). */
    uint16_t port;
    /** NULL: connections wait in a queue for gser_ucx_listener_accept. */
    gser_ucx_accept_fn accept_cb;
    void *user_data;
} gser_ucx_listener_options_t;

#define GSER_UCX_LISTENER_OPTIONS_INIT GSER_STRUCT_INIT(gser_ucx_listener_options_t)

/** Listen for connections. opts may be NULL (every interface, a free port).
 *  gser owns the listening socket: a connection reaches UCX only after its
 *  hello (and, with a secret, its proof) passed. The worker's UCX ports are
 *  opened now if it has none yet, on the device of this address (see
 *  gser_ucx_context_options_t.net_devices), and admit only the hosts of
 *  admitted peers (GSER_UCX_FILTER=0 turns that filter off). */
GSER_API gser_status_t gser_ucx_listener_create(gser_ucx_worker_t *worker, const gser_ucx_listener_options_t *opts,
                                                gser_ucx_listener_t **listener_out);

/** The port the listener is bound to. */
GSER_API uint16_t gser_ucx_listener_get_port(const gser_ucx_listener_t *listener);

/** What a listener's connections came to. */
typedef struct gser_ucx_listener_stats {
    size_t size;       /**< sizeof(gser_ucx_listener_stats_t): GSER_UCX_LISTENER_STATS_INIT sets it */
    uint64_t accepted; /**< finished their handshake (handed out, or queued for accept) */
    uint64_t refused;  /**< closed for not starting with a gser hello (any other bytes, or none) */
    uint64_t timed_out; /**< did not finish their handshake in time */
    uint64_t evicted;  /**< dropped unfinished to make room: more than 256 handshakes at once */
    uint64_t failed;   /**< sent a hello, then failed (reported through accept) */
    uint64_t pending;  /**< handshakes running now */
} gser_ucx_listener_stats_t;

#define GSER_UCX_LISTENER_STATS_INIT GSER_STRUCT_INIT(gser_ucx_listener_stats_t)

/** The listener's counts now. out->size must be set
 *  (GSER_UCX_LISTENER_STATS_INIT). */
GSER_API gser_status_t gser_ucx_listener_get_stats(const gser_ucx_listener_t *listener,
                                                   gser_ucx_listener_stats_t *out);

/**
 * The next connection that finished its handshake, waiting up to timeout_ms
 * (-1: no limit; 0: only what is queued). Its errors are of two classes;
 * gser_ucx_status_is_peer_error tells them apart:
 *  - one peer's, after which the listener goes on serving others (call
 *    accept again): a connection that sent a gser hello and then failed its
 *    handshake is reported once with its status (GSER_ERR_WIRE_VERSION,
 *    GSER_ERR_ACCESS, GSER_ERR_TIMEOUT, GSER_ERR_CONNECTION, GSER_ERR_FORMAT,
 *    GSER_ERR_IO, GSER_ERR_NO_MEMORY, ...). GSER_ERR_TIMEOUT is in this class
 *    also when no connection came in time. Bytes that are not a gser hello
 *    are dropped without a report (counted in gser_ucx_listener_get_stats).
 *    Anyone who reaches the port can cause these: never stop on them.
 *  - the listener's own, after which accept cannot succeed:
 *    GSER_ERR_INVALID_ARG (a NULL argument) and GSER_ERR_STATE (the
 *    listener's worker failed for good, gser_ucx_worker_get_status; its
 *    message says why). A peer's failure never has these two statuses.
 */
GSER_API gser_status_t gser_ucx_listener_accept(gser_ucx_listener_t *listener, int timeout_ms,
                                                gser_ucx_ep_t **ep_out);

/** Whether st, from gser_ucx_listener_accept or given to a
 *  gser_ucx_accept_fn, concerns one peer (or no connection came in time):
 *  the listener goes on serving others. False for GSER_OK and for the
 *  listener's own errors, GSER_ERR_INVALID_ARG and GSER_ERR_STATE. */
GSER_API bool gser_ucx_status_is_peer_error(gser_status_t st);

/** Stop listening. Connections accepted but not yet taken are closed. NULL is fine. */
GSER_API void gser_ucx_listener_destroy(gser_ucx_listener_t *listener);

/**
 * Start connecting to host:port (host: IPv4/IPv6 address or name). The
 * endpoint exists at once; gser_ucx_ep_get_status says when the handshake is
 * done. Receives may be posted right away; sends need a ready endpoint.
 */
GSER_API gser_status_t gser_ucx_ep_connect_nb(gser_ucx_worker_t *worker, const char *host, uint16_t port,
                                              gser_ucx_ep_t **ep_out);

/** Connect and wait up to timeout_ms (-1: no limit) for the handshake. On
 *  failure nothing is left to destroy. */
GSER_API gser_status_t gser_ucx_ep_connect(gser_ucx_worker_t *worker, const char *host, uint16_t port,
                                           int timeout_ms, gser_ucx_ep_t **ep_out);

/** GSER_OK when ready, GSER_INPROGRESS while the handshake runs, else why
 *  the endpoint failed (GSER_ERR_CONNECTION, GSER_ERR_WIRE_VERSION (also
 *  for two processes of one host whose shared-memory FIFO sizes differ),
 *  GSER_ERR_CANCELED after gser_ucx_ep_close, ...); then
 *  gser_ucx_get_last_error() says why in words (for GSER_ERR_ACCESS: which
 *  side lacks the shared secret, or that the secrets differ). */
GSER_API gser_status_t gser_ucx_ep_get_status(const gser_ucx_ep_t *ep);

/** What the peer announced in the handshake. */
typedef struct gser_ucx_peer_info {
    size_t size; /**< sizeof(gser_ucx_peer_info_t): GSER_UCX_PEER_INFO_INIT sets it */
    uint32_t wire_version;      /**< the peer's GSER_UCX_WIRE_VERSION */
    uint32_t gser_wire_version; /**< the peer's GSER_WIRE_VERSION */
    uint32_t caps;              /**< the peer's GSER_UCX_CAP_* bits */
    /** The connection's addresses, as its TCP control connection has them
     *  (numeric, NUL-terminated; IPv6 without brackets): this side's, with
     *  an ephemeral port on the connecting side, and the peer's. Empty and 0
     *  where the system did not say. Since 0.2. */
    char local_host[48];
    uint16_t local_port;
    char peer_host[48];
    uint16_t peer_port;
    /** The segments of the peer's shared-memory FIFO (UCX_MM_FIFO_SIZE as
     *  its UCX reads it; docs/ucx.md section 7). Since transport wire
     *  version 5. */
    uint32_t mm_fifo_size;
} gser_ucx_peer_info_t;

#define GSER_UCX_PEER_INFO_INIT GSER_STRUCT_INIT(gser_ucx_peer_info_t)

/** The peer's handshake; GSER_ERR_STATE before the handshake is done.
 *  info->size must be set (GSER_UCX_PEER_INFO_INIT). */
GSER_API gser_status_t gser_ucx_ep_get_peer_info(const gser_ucx_ep_t *ep, gser_ucx_peer_info_t *info);

/** Override the worker's compression for one endpoint (a
 *  gser_ucx_compression_t; GSER_UCX_COMPRESSION_DEFAULT = by transport).
 *  Any time, also before its handshake is done; applies to what is
 *  serialized afterwards. */
GSER_API gser_status_t gser_ucx_ep_set_compression(gser_ucx_ep_t *ep, int compression);

/** The codec the endpoint compresses with after negotiation: a
 *  gser_compression_t, GSER_COMPRESSION_LZ4 or _ZSTD (sampled: frames that
 *  do not shrink stay as they are) or GSER_COMPRESSION_NONE; with
 *  link-aware compression, its last decision. GSER_ERR_STATE before its
 *  handshake is done. */
GSER_API gser_status_t gser_ucx_ep_get_compression(const gser_ucx_ep_t *ep, int *codec_out);

/** What an endpoint moved in compressed chunks (GSER_UCX_CAP_CHUNKED). */
typedef struct gser_ucx_chunk_stats {
    size_t size; /**< sizeof(gser_ucx_chunk_stats_t): GSER_UCX_CHUNK_STATS_INIT sets it */
    uint64_t frames_sent;       /**< frames sent in chunks */
    uint64_t chunks_sent;       /**< their chunks */
    uint64_t chunks_compressed; /**< ... of which compressed (the others went raw: they did not shrink) */
    uint64_t frames_received;   /**< frames received in chunks */
    uint64_t chunks_received;
    uint64_t chunks_raw_received; /**< ... of which came raw */
} gser_ucx_chunk_stats_t;

#define GSER_UCX_CHUNK_STATS_INIT GSER_STRUCT_INIT(gser_ucx_chunk_stats_t)

/** Counts of the endpoint's chunked frames (any time; zero before). */
GSER_API gser_status_t gser_ucx_ep_get_chunk_stats(const gser_ucx_ep_t *ep, gser_ucx_chunk_stats_t *out);

/** What an endpoint's link-aware compression (GSER_UCX_COMPRESSION_AUTO,
 *  or DEFAULT towards another host) measured and decided. Rates are 0 until
 *  measured. Since 0.2. */
typedef struct gser_ucx_link_stats {
    size_t size; /**< sizeof(gser_ucx_link_stats_t): GSER_UCX_LINK_STATS_INIT sets it */
    /** The codec of the last decision (a gser_compression_t); the forced
     *  codec when compression is forced. */
    int codec;
    /** Whether the endpoint decides by the link (AUTO in effect). */
    bool link_aware;
    /** Bytes per second the endpoint's large sends achieved (moving
     *  average of busy time: from post to completion, gaps excluded). */
    double send_rate;
    /** Per codec, [0] lz4 and [1] zstd, on the last sample: compressed
     *  size / raw size, and raw bytes per second compressed and decompressed. */
    double ratio[2];
    double compress_rate[2];
    double decompress_rate[2];
    /** The model's estimate, in seconds, of the last decided message
     *  [0] raw, [1] lz4, [2] zstd (0: not considered). */
    double estimate[3];
    uint64_t decisions;  /**< messages decided by the link */
    uint64_t samples;    /**< codec samples timed */
    uint64_t rate_samples; /**< send-rate measurements */
    uint64_t probes;     /**< messages sent raw to re-measure while compressing */
    /** Per codec, [0] lz4 and [1] zstd: what its messages really took over
     *  what the model said (0: not measured yet). Since 0.2. */
    double fix[2];
    uint64_t runs;     /**< codec runs measured (they set fix) */
    uint64_t explores; /**< messages sent with a codec to learn its fix */
    /** Of the decisions, those raw by the measurements alone, without a
     *  sample (gser_ucx_ep_raw_wins). Since 0.2. */
    uint64_t raw_wins;
    /** Per codec, [0] lz4 and [1] zstd: what its messages really
     *  compressed to over what their samples said, by which the model
     *  multiplies the sample's ratio (0: not measured yet). Since 0.2. */
    double ratio_fix[2];
} gser_ucx_link_stats_t;

#define GSER_UCX_LINK_STATS_INIT GSER_STRUCT_INIT(gser_ucx_link_stats_t)

/** The link-aware compression's state (any time; zero before). */
GSER_API gser_status_t gser_ucx_ep_get_link_stats(const gser_ucx_ep_t *ep, gser_ucx_link_stats_t *out);

/** The codec to serialize the message of frames with (frames as they will
 *  be sent: host frames of GSER_COMPRESS_MIN_SIZE bytes or more count):
 *  with link-aware compression, decided from the endpoint's measurements,
 *  after timing each codec on a sample of the frames when the last sample
 *  is old; messages under 1 MiB get the last decision and cost nothing.
 *  pipelined: the frames will be compressed in chunks pipelined with the
 *  wire (route 3, messages in parts); a raw decision that is a probe (the
 *  stats' probes count grew: the link measured again) is then taken to
 *  cost only the message's first 8 MiB, which the caller sends raw,
 *  waits for, and asks again for the rest (gser:// does; docs/ucx.md
 *  4.5). zstd_level: the zstd level the
 *  caller compresses with (0: zstd's default). Otherwise what
 *  gser_ucx_ep_get_compression says. gser_ucx_ep_send_msg calls it.
 *  GSER_ERR_STATE before the handshake is done. Since 0.2. */
GSER_API gser_status_t gser_ucx_ep_choose_compression(gser_ucx_ep_t *ep, const gser_frame_t *frames, size_t nframes,
                                                      bool pipelined, int zstd_level, int *codec_out);

/** Whether, with link-aware compression, the endpoint's measurements
 *  already say that a message of bytes candidate bytes moves fastest raw
 *  whatever its data (the link's measured rate against every codec's
 *  measured speeds, at the best ratio a codec could reach): then that is
 *  recorded as the message's decision, as gser_ucx_ep_choose_compression
 *  would record it, without a sample, and *raw_out is true; the caller
 *  sends the message uncompressed. false where the message needs
 *  gser_ucx_ep_choose_compression: no link-aware compression, a message
 *  under 1 MiB, nothing decided or sampled yet, the codecs' speeds due to
 *  be timed again (after 16 such messages or 10 s), or a codec that could
 *  win on data that shrinks enough; nothing is recorded then. pipelined:
 *  as for gser_ucx_ep_choose_compression. Costs a few arithmetic
 *  operations under the worker's lock. GSER_ERR_STATE before the
 *  handshake is done. Since 0.2. */
GSER_API gser_status_t gser_ucx_ep_raw_wins(gser_ucx_ep_t *ep, size_t bytes, bool pipelined, bool *raw_out);

/** Every send of the message that gser_ucx_ep_choose_compression last
 *  decided for (one send, or all of its parts) is posted: with link-aware
 *  compression, that message is timed from its decision to its last send's
 *  completion, which is what corrects the model for its codec. Without
 *  this call the endpoint guesses the message's end from the compressed
 *  bytes its sample predicted; a message whose frames compress below 64
 *  KiB each, or better than its sample, then kept its timing open through
 *  the sends after it (a 100 Mbit/s shuffle's messages "took" 3 s for 0.6
 *  s of wire, and the endpoint went raw: docs/ucx.md 4.5).
 *  gser_ucx_ep_send_msg calls it. Nothing to do without a compressed
 *  decision. Since 0.2. */
GSER_API gser_status_t gser_ucx_ep_mark_posted(gser_ucx_ep_t *ep);

/** The worker an endpoint belongs to. */
GSER_API gser_ucx_worker_t *gser_ucx_ep_get_worker(const gser_ucx_ep_t *ep);

/**
 * Close an endpoint. With no send in flight, what was sent is flushed to
 * the peer first (UCX's tcp flush waits for the peer's acknowledgement:
 * bounded by 2 s, cut short when the peer leaves). Then every send and
 * receive still in flight completes with GSER_ERR_CANCELED (callbacks run
 * during this call), and the connection is dropped. The peer receives
 * every message sent whole before the close (each one before the first
 * send still in flight), in order, and only then do its receives fail with
 * GSER_ERR_CONNECTION; a canceled message is never delivered, not even
 * part of one. The endpoint stays allocated, in status GSER_ERR_CANCELED,
 * until destroyed.
 */
GSER_API gser_status_t gser_ucx_ep_close(gser_ucx_ep_t *ep);

/**
 * Destroy an endpoint, closing it first as gser_ucx_ep_close does (what was
 * sent flushed when nothing is in flight, the rest canceled), with the
 * same guarantee to the peer: every message sent whole before, in order,
 * then GSER_ERR_CONNECTION. NULL is fine.
 */
GSER_API void gser_ucx_ep_destroy(gser_ucx_ep_t *ep);

/* ---- requests ------------------------------------------------------------------- */

/** Called once when an operation completes (inside a progress call). req is
 *  the request; freeing it from the callback is fine. */
typedef void (*gser_ucx_complete_fn)(gser_ucx_request_t *req, gser_status_t status, void *user_data);

/** Parameters of a non-blocking operation. Start from GSER_UCX_OP_PARAMS_INIT. */
typedef struct gser_ucx_op_params {
    size_t size; /**< sizeof(gser_ucx_op_params_t): GSER_UCX_OP_PARAMS_INIT sets it */
    gser_ucx_complete_fn cb; /**< NULL: none; test or wait on the request */
    void *user_data;
} gser_ucx_op_params_t;

#define GSER_UCX_OP_PARAMS_INIT GSER_STRUCT_INIT(gser_ucx_op_params_t)

/** GSER_INPROGRESS while running, else the operation's final status. */
GSER_API gser_status_t gser_ucx_request_query(const gser_ucx_request_t *req);

/** Progress until the request completes or timeout_ms passes (-1: no
 *  limit). Its final status, or GSER_ERR_TIMEOUT (it keeps running). */
GSER_API gser_status_t gser_ucx_request_wait(gser_ucx_request_t *req, int timeout_ms);

/**
 * Cancel a running request; it completes with GSER_ERR_CANCELED (its
 * callback runs during this call). A receive that has not matched a message
 * yet leaves the endpoint intact; canceling a send, or a receive halfway
 * through a message, closes the endpoint (the stream of messages would
 * otherwise be torn). No effect on a completed request.
 */
GSER_API gser_status_t gser_ucx_request_cancel(gser_ucx_request_t *req);

/** Free a request; a running one is canceled first. Received frames not
 *  taken are released. NULL is fine. */
GSER_API void gser_ucx_request_free(gser_ucx_request_t *req);

/* ---- sending ------------------------------------------------------------------- */

/**
 * Send a message without blocking: frames[0] is the header (host memory),
 * then the data frames, as gser_frames_get_array gives them. The frames array
 * is copied; the bytes are not: keep them valid and unchanged until the
 * request completes, and let device work that produces them finish first
 * (gser_frames_wait). Messages sent on one endpoint arrive in order. On
 * success *req_out is a request to test, wait on or free; req_out may be
 * NULL when params has a callback (the request is then freed after it).
 * Device frames need a device backend (the worker's gser_ctx) unless both
 * sides' UCX move device memory: GSER_ERR_NO_DEVICE otherwise, and nothing
 * is sent. A send that fails halfway (the message is torn) fails the
 * endpoint: the request then completes with the error.
 *
 * @return GSER_OK: posted; the request says how it ends.
 * @return GSER_ERR_INVALID_ARG: a NULL argument, no frames, a frame that sets
 *         a reserved field, has no data or an unknown memory kind, frame 0
 *         not in host memory, or neither req_out nor a callback; also a
 *         params struct not set up with GSER_UCX_OP_PARAMS_INIT.
 * @return GSER_ERR_UNSUPPORTED: params from a newer gser that sets fields
 *         this build does not know.
 * @return GSER_ERR_STATE: the handshake is not done yet (progress, then
 *         send again).
 * @return GSER_ERR_NO_DEVICE: as above; nothing is sent.
 * @return GSER_ERR_LIMIT_FRAMES: more frames than the frame table holds.
 * @return GSER_ERR_NO_MEMORY: nothing is sent (a short message that UCX
 *         already took fails the endpoint).
 * @return the endpoint's error (GSER_ERR_CONNECTION, GSER_ERR_CANCELED,
 *         GSER_ERR_TIMEOUT, ...) once it failed or was closed.
 * @return another status mapped from UCX when it refuses the first send
 *         (gser_ucx_get_last_error says which); nothing is sent.
 */
GSER_API gser_status_t gser_ucx_ep_send_nb(gser_ucx_ep_t *ep, const gser_frame_t *frames, size_t nframes,
                                           const gser_ucx_op_params_t *params, gser_ucx_request_t **req_out);

/** Send and wait up to timeout_ms (-1: no limit). On GSER_ERR_TIMEOUT the
 *  endpoint is closed (the message may have been half sent). */
GSER_API gser_status_t gser_ucx_ep_send(gser_ucx_ep_t *ep, const gser_frame_t *frames, size_t nframes,
                                        int timeout_ms);

/** Serialize msg (opts may be NULL), wait for its device work, send it and
 *  wait up to timeout_ms. With opts->compression NONE (or no opts) the
 *  message is compressed as the endpoint negotiated
 *  (gser_ucx_ep_get_compression); a codec set in opts is used as given
 *  when the peer announced it, AUTO becomes the endpoint's codec, and LZ4
 *  or ZSTD the peer did not announce is GSER_ERR_UNSUPPORTED (nothing is
 *  sent). With a codec and a peer that announced GSER_UCX_CAP_CHUNKED,
 *  host frames of at least the worker's chunked_min bytes are sent in
 *  compressed chunks, each compressed while the one before is on the wire
 *  and decompressed by the peer as it arrives (docs/ucx.md 4.6).
 *  gser_ucx_ep_send_nb sends frames as they are: the peer refuses
 *  compressed frames in a codec it did not announce. */
GSER_API gser_status_t gser_ucx_ep_send_msg(gser_ucx_ep_t *ep, gser_context_t *ctx, const gser_msg_t *msg,
                                            const gser_serialize_options_t *opts, int timeout_ms);

/* ---- receiving ----------------------------------------------------------------- */

/**
 * Post a receive of the next message from ep. After the peer closed, receives
 * still get every message it sent whole before (bounded by the peer
 * timeout), then fail with GSER_ERR_CONNECTION.
 *
 * @return GSER_OK: posted; the request says how it ends.
 * @return GSER_ERR_INVALID_ARG: ep is NULL, neither req_out nor a callback,
 *         or params not set up with GSER_UCX_OP_PARAMS_INIT.
 * @return GSER_ERR_UNSUPPORTED: params from a newer gser that sets fields
 *         this build does not know.
 * @return GSER_ERR_NO_MEMORY.
 * @return the endpoint's error (GSER_ERR_CONNECTION, GSER_ERR_CANCELED,
 *         GSER_ERR_TIMEOUT, ...) once it failed or was closed and nothing
 *         the peer sent is left to receive.
 */
GSER_API gser_status_t gser_ucx_ep_recv_nb(gser_ucx_ep_t *ep, const gser_ucx_op_params_t *params,
                                           gser_ucx_request_t **req_out);

/** Post a receive of the next message from any endpoint of the worker (see
 *  gser_ucx_request_get_ep for which). */
GSER_API gser_status_t gser_ucx_worker_recv_nb(gser_ucx_worker_t *worker, const gser_ucx_op_params_t *params,
                                               gser_ucx_request_t **req_out);

/** The endpoint a request runs on: for a receive from any endpoint, the one
 *  the message came from (NULL until known). */
GSER_API gser_ucx_ep_t *gser_ucx_request_get_ep(const gser_ucx_request_t *req);

/**
 * What a completed receive's message came as, before it is deserialized:
 * its bytes (header and frames, compressed frames at their size as sent)
 * and whether its header is of a gser wire version that carries compressed
 * frames (3 or more: gser writes 3 only when a frame is compressed). A
 * caller may deserialize large compressed messages off its event loop by
 * them, as Dask decides by the bytes a message arrived in.
 *
 * @return GSER_OK: both outputs set.
 * @return GSER_ERR_INVALID_ARG: a NULL argument, or req is not a receive.
 * @return GSER_ERR_STATE: the receive is still running, or its frames were
 *         taken already.
 * @return the receive's own status when it failed.
 */
GSER_API gser_status_t gser_ucx_request_get_size(const gser_ucx_request_t *req, size_t *size_out,
                                                 bool *compressed_out);

/** Frames of a received message, handed to the caller. */
typedef struct gser_ucx_recv {
    size_t size; /**< sizeof(gser_ucx_recv_t): GSER_UCX_RECV_INIT sets it */
    gser_frame_t *frames; /**< header first; frames with release set own their memory */
    size_t nframes;
    gser_ucx_ep_t *ep;    /**< where the message came from */
} gser_ucx_recv_t;

#define GSER_UCX_RECV_INIT GSER_STRUCT_INIT(gser_ucx_recv_t)

/**
 * Take the frames of a completed receive (out->size must be set:
 * GSER_UCX_RECV_INIT). Pass them to gser_deserialize,
 * then call gser_ucx_recv_release(out, st == GSER_OK): a successful
 * deserialize owns the frame memory; otherwise it is released.
 *
 * @return GSER_OK: *out holds the frames.
 * @return GSER_ERR_INVALID_ARG: a NULL argument, out->size not set, or req
 *         is not a receive.
 * @return GSER_ERR_STATE: the receive is still running, or its frames were
 *         taken already.
 * @return the receive's own status when it failed.
 * @return GSER_ERR_NO_MEMORY.
 */
GSER_API gser_status_t gser_ucx_request_take(gser_ucx_request_t *req, gser_ucx_recv_t *out);

/** Release what gser_ucx_request_take handed over: the frame memory unless
 *  handed_over (a message owns it now), and the frame array. NULL is fine. */
GSER_API void gser_ucx_recv_release(gser_ucx_recv_t *recv, bool handed_over);

#if defined(__GNUC__)
#  define GSER_UCX_DEPRECATED(why) __attribute__((deprecated(why)))
#else
#  define GSER_UCX_DEPRECATED(why)
#endif

/** Deprecated: the former name of gser_ucx_recv_release, which it calls;
 *  kept so that existing callers build and link. */
GSER_API GSER_UCX_DEPRECATED("use gser_ucx_recv_release") void gser_ucx_recv_finish(gser_ucx_recv_t *recv,
                                                                                     bool handed_over);

/**
 * Deserialize the frames of a completed receive into a message that owns
 * them (opts may be NULL). A header that is malformed or over the limits
 * closes the endpoint it came from, and so does a compressed frame that
 * is corrupt or in a codec this side did not announce (GSER_ERR_COMPRESSED).
 */
GSER_API gser_status_t gser_ucx_request_deserialize(gser_ucx_request_t *req, gser_context_t *ctx,
                                                    const gser_deserialize_options_t *opts, gser_msg_t **msg_out);

/**
 * gser_ucx_request_deserialize without its last step, for a caller that
 * deserializes (and so decompresses) large messages on another thread
 * than the worker's: it reads only req, never the worker or the
 * endpoint, so it may run on any thread while the worker's thread goes
 * on (nothing else may use req meanwhile; the worker may even be
 * destroyed). Where it fails, call gser_ucx_request_reject(req, status)
 * next, on a thread that may call into the worker: a malformed message
 * closes its endpoint there.
 */
GSER_API gser_status_t gser_ucx_request_deserialize_detached(gser_ucx_request_t *req, gser_context_t *ctx,
                                                             const gser_deserialize_options_t *opts,
                                                             gser_msg_t **msg_out);

/**
 * What gser_ucx_request_deserialize does after a failed deserialize with
 * status st: where st says the message was malformed (a bad header,
 * limits, GSER_ERR_COMPRESSED), close the endpoint it came from (if it
 * still exists) and say so in gser_ucx_get_last_error. Returns st.
 */
GSER_API gser_status_t gser_ucx_request_reject(gser_ucx_request_t *req, gser_status_t st);

/** Receive the next message from ep and deserialize it, waiting up to
 *  timeout_ms (-1: no limit). A timeout before the message started leaves
 *  the endpoint usable. */
GSER_API gser_status_t gser_ucx_ep_recv_msg(gser_ucx_ep_t *ep, gser_context_t *ctx,
                                            const gser_deserialize_options_t *opts, int timeout_ms,
                                            gser_msg_t **msg_out);

/** Receive the next message from any endpoint and deserialize it; *ep_out
 *  (may be NULL) says where it came from. */
GSER_API gser_status_t gser_ucx_worker_recv_msg(gser_ucx_worker_t *worker, gser_context_t *ctx,
                                                const gser_deserialize_options_t *opts, int timeout_ms,
                                                gser_msg_t **msg_out, gser_ucx_ep_t **ep_out);

#ifdef __cplusplus
}
#endif

#endif /* GSER_UCX_H */
