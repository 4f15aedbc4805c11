/* Detailed error messages of the transport: one per thread, read with
 * gser_ucx_get_last_error. Not installed. */
#ifndef GSER_UCX_ERROR_H
#define GSER_UCX_ERROR_H

#include "gser/defs.h"

/* Record a printf-style message for st and return st. */
__attribute__((visibility("hidden"), format(printf, 2, 3))) gser_status_t gux_fail(gser_status_t st,
                                                                                  const char *fmt, ...);
/* gser_struct_read with a message naming the call and the struct type. */
__attribute__((visibility("hidden"))) gser_status_t gux_struct_read(const char *what, const char *type, void *dst,
                                                                    size_t dst_size, const void *src);
/* Forget the last message (a call that succeeds starts clean). */
__attribute__((visibility("hidden"))) void gux_error_clear(void);

#endif /* GSER_UCX_ERROR_H */
