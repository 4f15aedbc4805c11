/* gser — the extension API: what libraries built on gser (its own plugins
 * among them) need to report errors and read versioned structs the way the
 * core does. Not included by gser/gser.h. (The device ops on Arrow columns
 * are in gser/arrow.h; test hooks in gser/testing.h, which is not installed.)
 *
 * In the spirit of zstd's ZSTD_STATIC_LINKING_ONLY: what is here is exported
 * and documented, but it is not part of the API an application needs, and it
 * may change between minor versions while gser is 0.x.
 */
#ifndef GSER_EXTENSION_H
#define GSER_EXTENSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "gser/gser.h"

#ifdef __cplusplus
extern "C" {
#endif

/** The most negative status (for tables indexed by status). */
#define GSER_STATUS_LAST GSER_ERR_ACCESS

/** One past the last dtype (for tables indexed by dtype). */
#define GSER_DTYPE_COUNT (GSER_DTYPE_COMPLEX128 + 1)

/** Set this thread's detailed error message for ctx (printf-style) and return
 *  status, for libraries that report through the context's
 *  gser_context_get_last_error. */
GSER_API gser_status_t gser_context_fail(gser_context_t *ctx, gser_status_t status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/**
 * Read a caller's versioned struct (see GSER_STRUCT_INIT) into dst, a struct
 * of this build's layout of dst_size bytes: the fields the caller knows are
 * copied, the rest are zeroed, and dst's size is set to dst_size.
 * GSER_ERR_INVALID_ARG when the caller's size is smaller than the size field
 * itself (0: not initialised with its GSER_*_INIT macro); GSER_ERR_UNSUPPORTED
 * when the caller's struct is larger and sets a field this build does not
 * know. For libraries that take versioned structs of their own.
 */
static inline gser_status_t gser_struct_read(void *dst, size_t dst_size, const void *src)
{
    size_t n;
    memcpy(&n, src, sizeof n);
    if (n < sizeof(size_t))
        return GSER_ERR_INVALID_ARG;
    if (n > dst_size) {
        const unsigned char *tail = (const unsigned char *)src + dst_size;
        for (size_t i = 0; i < n - dst_size; i++)
            if (tail[i])
                return GSER_ERR_UNSUPPORTED;
        n = dst_size;
    }
    memset(dst, 0, dst_size);
    memcpy(dst, src, n);
    memcpy(dst, &dst_size, sizeof dst_size);
    return GSER_OK;
}

/**
 * The message for a failed gser_struct_read(dst, dst_size, src) that
 * returned status, naming the call (what) and the struct type: written to
 * buf (at most cap bytes, NUL-terminated). For libraries that keep their
 * own error text; the core's gser_context_struct_read writes the same.
 */
GSER_API void gser_struct_read_describe(gser_status_t status, const char *what, const char *type, const void *src,
                                        size_t dst_size, char *buf, size_t cap);

/** gser_struct_read that also sets ctx's last error for this thread, naming
 *  the call (what) and the struct type, when it fails. */
GSER_API gser_status_t gser_context_struct_read(gser_context_t *ctx, const char *what, const char *type, void *dst,
                                                size_t dst_size, const void *src);

/**
 * Write an output struct src (this build's layout, src_size bytes) to a
 * caller's versioned struct dst: at most the caller's size is written, and
 * dst's size field keeps the caller's value. GSER_ERR_INVALID_ARG, writing
 * nothing, when the caller's size is smaller than the size field itself.
 */
static inline gser_status_t gser_struct_write(void *dst, const void *src, size_t src_size)
{
    size_t n;
    memcpy(&n, dst, sizeof n);
    if (n < sizeof(size_t))
        return GSER_ERR_INVALID_ARG;
    if (n > src_size)
        memset((unsigned char *)dst + src_size, 0, n - src_size);
    memcpy((unsigned char *)dst + sizeof n, (const unsigned char *)src + sizeof n,
           (n < src_size ? n : src_size) - sizeof n);
    return GSER_OK;
}

#ifdef __cplusplus
}
#endif

#endif /* GSER_EXTENSION_H */
