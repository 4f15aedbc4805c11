/* Detailed error messages of the transport: one per thread, read with
 * gser_ucx_last_error. Not installed. */
#ifndef GSER_UCX_ERROR_H
#define GSER_UCX_ERROR_H

#include "gser/defs.h"

/* Record a printf-style message for st and return st. */
__attribute__((visibility("hidden"), format(printf, 2, 3))) gser_status_t gux_fail(gser_status_t st,
                                                                                  const char *fmt, ...);
/* Forget the last message (a call that succeeds starts clean). */
__attribute__((visibility("hidden"))) void gux_error_clear(void);

#endif /* GSER_UCX_ERROR_H */
