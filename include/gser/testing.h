/* gser — test hooks: calls that gser's own tests and fuzzers use to reach
 * states a peer cannot be made to produce on demand. NOT INSTALLED: no
 * installed header includes it, and an application must not use it. The
 * calls stay exported from the shared libraries, where the in-tree Python
 * module reaches them for its tests; they may change or go in any release.
 */
#ifndef GSER_TESTING_H
#define GSER_TESTING_H

#include <stdint.h>

#include "gser/defs.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the emulated device backend ------------------------------------------------ */

/** What the emulated backend copied since the last reset, for tests that
 *  count copies: every buffer of a batch (one kernel launch on a GPU) and
 *  every memcpy from device memory, by where it wrote: device memory is
 *  what the backend allocated as such, anything else (pinned or pageable)
 *  is host. An op is one batch or one memcpy. */
typedef struct gser_device_stats {
    uint64_t d2h_ops;    /**< batches and memcpys that wrote host memory */
    uint64_t d2h_copies; /**< buffers they copied */
    uint64_t d2h_bytes;
    uint64_t d2d_ops; /**< the same from device to device memory */
    uint64_t d2d_copies;
    uint64_t d2d_bytes;
} gser_device_stats_t;

/** The counters of the emulated backend (all processes' contexts together). */
GSER_API void gser_device_stats_get(gser_device_stats_t *out);
GSER_API void gser_device_stats_reset(void);

/* ---- large host buffers (host/bigbuf.c) ----------------------------------------- */

/** What gser's pool of large host buffers (files read, frames decompressed
 *  or compressed, above 32 MiB) did since the last reset. */
typedef struct gser_bigbuf_stats {
    uint64_t mapped;   /**< buffers given a fresh mapping */
    uint64_t reused;   /**< buffers given a kept one */
    size_t kept_bytes; /**< bytes kept for reuse now */
} gser_bigbuf_stats_t;

GSER_API void gser_bigbuf_stats_get(gser_bigbuf_stats_t *out);
/** Zero the counters and unmap what is kept. */
GSER_API void gser_bigbuf_stats_reset(void);

/* ---- gser::ucx (plugins/ucx) ---------------------------------------------------- */

typedef struct gser_ucx_worker gser_ucx_worker_t;

/** For tests of version negotiation: the transport wire version the worker
 *  announces in the handshakes it starts from now on (0 = GSER_UCX_WIRE_VERSION).
 *  Implemented by gser::ucx. */
GSER_API gser_status_t gser_ucx_worker_set_announce_version(gser_ucx_worker_t *worker, uint32_t version);

/** For tests of the receive-queue check: with on, the message a check sends
 *  never arrives, as in a blocked queue. Implemented by gser::ucx. */
GSER_API gser_status_t gser_ucx_worker_set_check_fault(gser_ucx_worker_t *worker, int on);

typedef struct gser_ucx_listener gser_ucx_listener_t;

/** For tests and fuzzers of the handshake: handle a connected stream socket
 *  (any family, e.g. one end of a socketpair) as if the listener had
 *  accepted it. Takes fd. Implemented by gser::ucx. */
GSER_API gser_status_t gser_ucx_listener_adopt(gser_ucx_listener_t *listener, int fd);

#ifdef __cplusplus
}
#endif

#endif /* GSER_TESTING_H */
