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
