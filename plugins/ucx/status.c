/* Where UCX statuses become gser statuses, and the per-thread detailed
 * error message. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

static _Thread_local char last_error[512];

const char *gser_ucx_get_last_error(void)
{
    return last_error;
}

void gux_error_clear(void)
{
    last_error[0] = '\0';
}

gser_status_t gux_fail(gser_status_t st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return st;
}

gser_status_t gux_struct_read(const char *what, const char *type, void *dst, size_t dst_size, const void *src)
{
    gser_status_t st = gser_struct_read(dst, dst_size, src);
    if (st == GSER_OK)
        return GSER_OK;
    gser_struct_read_describe(st, what, type, src, dst_size, last_error, sizeof last_error);
    return st;
}

gser_status_t gux_struct_write(const char *what, const char *arg, const char *init, void *dst, const void *src,
                               size_t src_size)
{
    if (gser_struct_write(dst, src, src_size))
        return gux_fail(GSER_ERR_INVALID_ARG, "%s: %s->size is 0: use %s", what, arg, init);
    return GSER_OK;
}

gser_status_t gux_op_params(const char *what, const gser_ucx_op_params_t **params, gser_ucx_op_params_t *copy)
{
    if (!*params)
        return GSER_OK;
    gser_status_t st = gux_struct_read(what, "gser_ucx_op_params_t", copy, sizeof *copy, *params);
    if (st == GSER_OK)
        *params = copy;
    return st;
}

gser_status_t gux_op_check(const char *what, bool target, bool want_req, const gser_ucx_op_params_t *params)
{
    if (!target || (!want_req && !(params && params->cb)))
        return gux_fail(GSER_ERR_INVALID_ARG, "%s: bad argument (a request or a callback is needed)", what);
    return GSER_OK;
}

gser_status_t gux_status(ucs_status_t st)
{
    switch (st) {
    case UCS_OK:
        return GSER_OK;
    case UCS_INPROGRESS:
        return GSER_INPROGRESS;
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_EXCEEDS_LIMIT:
        return GSER_ERR_NO_MEMORY;
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR:
        return GSER_ERR_INVALID_ARG;
    case UCS_ERR_CANCELED:
        return GSER_ERR_CANCELED;
    case UCS_ERR_TIMED_OUT:
        return GSER_ERR_TIMEOUT;
    case UCS_ERR_MESSAGE_TRUNCATED:
        return GSER_ERR_FRAME;
    case UCS_ERR_UNSUPPORTED:
    case UCS_ERR_NO_ELEM:
    case UCS_ERR_NO_DEVICE:
    case UCS_ERR_NO_RESOURCE:
        return GSER_ERR_UNSUPPORTED;
    case UCS_ERR_BUSY:
    case UCS_ERR_ALREADY_EXISTS:
        return GSER_ERR_EXISTS;
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_REJECTED:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_SOME_CONNECTS_FAILED:
        return GSER_ERR_CONNECTION;
    default:
        return GSER_ERR_IO;
    }
}

gser_status_t gux_check(ucs_status_t st, const char *what)
{
    gser_status_t g = gux_status(st);
    if (g < 0)
        gux_fail(g, "%s: %s", what, ucs_status_string(st));
    return g;
}
