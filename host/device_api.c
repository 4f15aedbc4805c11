/* The public device API (gser/device.h, the Arrow ops of gser/arrow.h),
 * on the core's side: arguments are checked here, the work goes through the
 * device layer (device/device.h), and its failures become the context's
 * message. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gser/arrow.h"
#include "internal.h"

struct gser_event {
    gser_context_t *ctx;
    void *handle;
};

/* ---- opening the device layer ------------------------------------------------------ */

static gser_status_t read_allocator(gser_context_t *ctx, const gser_allocator_t *in, gser_allocator_t *out,
                                    const gser_allocator_t **use)
{
    *use = NULL;
    if (!in)
        return GSER_OK;
    gser_status_t st = gser__struct_read(ctx, "gser_context_create", "gser_allocator_t", out, sizeof *out, in);
    if (st)
        return st;
    if (!out->alloc || !out->free)
        return gser__error_set(ctx, GSER_ERR_INVALID_ARG, "gser_context_create: an allocator lacks alloc or free");
    *use = out;
    return GSER_OK;
}

/* name, shortened and with anything unprintable as '?', for messages. */
static void printable(char *out, size_t cap, const char *name)
{
    size_t n = 0;
    for (; name[n] && n + 1 < cap && n < 40; n++)
        out[n] = name[n] >= 0x20 && name[n] < 0x7f && name[n] != '"' ? name[n] : '?';
    out[n] = '\0';
}

gser_status_t gser__ctxdev_open(gser_context_t *ctx, const gser_context_options_t *o)
{
    const char *name = o->device_backend;
    bool from_env = !name || !*name;
    if (from_env)
        name = getenv("GSER_DEVICE");
    ctx->devl_why[0] = '\0';
    if (!devl_backend_known(name)) {
        char shown[48];
        printable(shown, sizeof shown, name);
        if (!from_env)
            return gser__error_set(
                ctx, GSER_ERR_INVALID_ARG,
                "gser_context_create: gser_context_options_t.device_backend is \"%s\", which is not a "
                "device backend (%s)",
                shown, devl_backend_names());
        /* From the environment: what needs no device keeps working (a tool
         * reading a file, a Python import); device memory fails, saying why. */
        snprintf(ctx->devl_why, sizeof ctx->devl_why,
                 "the environment variable GSER_DEVICE is \"%s\", which is not a device backend (%s)", shown,
                 devl_backend_names());
        name = "none";
    }
    ctx->ordinal = o->device;
    ctx->pack_max = o->pack_max ? o->pack_max : GSER_DEFAULT_PACK_MAX;
    ctx->devl = NULL;
    gser_allocator_t da, pa;
    const gser_allocator_t *dap, *pap;
    gser_status_t st;
    if ((st = read_allocator(ctx, o->device_allocator, &da, &dap)) ||
        (st = read_allocator(ctx, o->pinned_allocator, &pa, &pap)))
        return st;
    char why[256];
    if ((st = devl_open(name, o->device, dap, pap, &ctx->devl, why, sizeof why)))
        return gser__error_set(ctx, st, "gser_context_create: %s", why);
    return GSER_OK;
}

void gser__ctxdev_close(gser_context_t *ctx)
{
    devl_close(ctx->devl);
    ctx->devl = NULL;
}

gser_status_t gser__ctxdev_need(gser_context_t *ctx, const char *what)
{
    if (ctx->devl)
        return GSER_OK;
    if (ctx->devl_why[0])
        return gser__error_set(ctx, GSER_ERR_NO_DEVICE,
                               "%s: device memory needs a device backend, and this context has "
                               "none: %s",
                               what, ctx->devl_why);
    return gser__error_set(ctx, GSER_ERR_NO_DEVICE,
                           "%s: device memory needs a device backend, and this context has none "
                           "(set gser_context_options_t.device_backend or GSER_DEVICE to \"cuda\" or \"emulated\")",
                           what);
}

gser_status_t gser__ctxdev_fail(gser_context_t *ctx, gser_status_t st, const char *what)
{
    const char *detail = devl_error(ctx->devl);
    return gser__error_set(ctx, st, "%s: %s%s%s", what, gser_status_str(st), *detail ? ": " : "", detail);
}

/* ---- the public API --------------------------------------------------------------- */

const char *gser_context_get_device_backend(const gser_context_t *ctx)
{
    return devl_backend_name(ctx ? ctx->devl : NULL);
}

bool gser_context_has_device(const gser_context_t *ctx)
{
    return ctx && ctx->devl;
}

int gser_context_get_device_ordinal(const gser_context_t *ctx)
{
    return ctx && ctx->devl ? ctx->ordinal : 0;
}

gser_status_t gser_device_alloc(gser_context_t *ctx, size_t size, void *stream, void **ptr)
{
    if (!ctx || !ptr)
        return GSER_ERR_INVALID_ARG;
    gser_status_t st = gser__ctxdev_need(ctx, "gser_device_alloc");
    if (st)
        return st;
    if ((st = devl_alloc(ctx->devl, size, stream, ptr)))
        return gser__error_set(ctx, st, "gser_device_alloc: %zu bytes: allocation failed", size);
    return GSER_OK;
}

void gser_device_free(gser_context_t *ctx, void *ptr, size_t size, void *stream)
{
    if (ctx && ctx->devl)
        devl_free(ctx->devl, ptr, size, stream);
}

gser_status_t gser_pinned_alloc(gser_context_t *ctx, size_t size, void **ptr)
{
    if (!ctx || !ptr)
        return GSER_ERR_INVALID_ARG;
    gser_status_t st = gser__ctxdev_need(ctx, "gser_pinned_alloc");
    if (st)
        return st;
    if ((st = devl_pinned_alloc(ctx->devl, size, ptr)))
        return gser__error_set(ctx, st, "gser_pinned_alloc: %zu bytes: allocation failed", size);
    return GSER_OK;
}

void gser_pinned_free(gser_context_t *ctx, void *ptr, size_t size)
{
    if (ctx && ctx->devl)
        devl_pinned_free(ctx->devl, ptr, size);
}

static devl_dir_t copy_dir(gser_memory_t dst, gser_memory_t src)
{
    if (src == GSER_MEMORY_DEVICE)
        return dst == GSER_MEMORY_DEVICE ? DEVL_D2D : DEVL_D2H;
    return dst == GSER_MEMORY_DEVICE ? DEVL_H2D : DEVL_H2H;
}

gser_status_t gser__ctxdev_copy(gser_context_t *ctx, void *dst, gser_memory_t dst_memory, const void *src,
                                gser_memory_t src_memory, size_t n, void *stream)
{
    if (n == 0)
        return GSER_OK;
    devl_dir_t dir = copy_dir(dst_memory, src_memory);
    if (dir == DEVL_H2H && !ctx->devl) {
        memmove(dst, src, n);
        return GSER_OK;
    }
    gser_status_t st = gser__ctxdev_need(ctx, "gser_device_memcpy");
    if (st)
        return st;
    st = devl_memcpy(ctx->devl, dst, src, n, dir, stream);
    return st ? gser__ctxdev_fail(ctx, st, "gser_device_memcpy") : GSER_OK;
}

gser_status_t gser_device_memcpy(gser_context_t *ctx, void *dst, gser_memory_t dst_memory, const void *src,
                                 gser_memory_t src_memory, size_t n, void *stream)
{
    if (!ctx || (n && (!dst || !src)))
        return GSER_ERR_INVALID_ARG;
    return gser__ctxdev_copy(ctx, dst, dst_memory, src, src_memory, n, stream);
}

gser_status_t gser_stream_wait(gser_context_t *ctx, void *stream)
{
    if (!ctx)
        return GSER_ERR_INVALID_ARG;
    gser_status_t st = gser__ctxdev_need(ctx, "gser_stream_wait");
    if (st)
        return st;
    st = devl_stream_sync(ctx->devl, stream);
    return st ? gser__ctxdev_fail(ctx, st, "gser_stream_wait") : GSER_OK;
}

gser_status_t gser_stream_create(gser_context_t *ctx, void **stream)
{
    if (!ctx || !stream)
        return GSER_ERR_INVALID_ARG;
    gser_status_t st = gser__ctxdev_need(ctx, "gser_stream_create");
    if (st)
        return st;
    st = devl_stream_create(ctx->devl, stream);
    return st ? gser__ctxdev_fail(ctx, st, "gser_stream_create") : GSER_OK;
}

void gser_stream_destroy(gser_context_t *ctx, void *stream)
{
    if (ctx && ctx->devl)
        devl_stream_destroy(ctx->devl, stream);
}

gser_status_t gser_event_create(gser_context_t *ctx, gser_event_t **event)
{
    if (!ctx || !event)
        return GSER_ERR_INVALID_ARG;
    gser_status_t st = gser__ctxdev_need(ctx, "gser_event_create");
    if (st)
        return st;
    gser_event_t *e = malloc(sizeof *e);
    if (!e)
        return gser__error_set(ctx, GSER_ERR_NO_MEMORY, "gser_event_create: out of memory");
    e->ctx = ctx;
    st = devl_event_create(ctx->devl, &e->handle);
    if (st) {
        free(e);
        return gser__ctxdev_fail(ctx, st, "gser_event_create");
    }
    *event = e;
    return GSER_OK;
}

gser_status_t gser_event_record(gser_event_t *event, void *stream)
{
    if (!event)
        return GSER_ERR_INVALID_ARG;
    gser_context_t *ctx = event->ctx;
    gser_status_t st = devl_event_record(ctx->devl, event->handle, stream);
    return st ? gser__ctxdev_fail(ctx, st, "gser_event_record") : GSER_OK;
}

gser_status_t gser_event_query(gser_event_t *event)
{
    if (!event)
        return GSER_ERR_INVALID_ARG;
    gser_context_t *ctx = event->ctx;
    gser_status_t st = devl_event_query(ctx->devl, event->handle);
    return st < 0 ? gser__ctxdev_fail(ctx, st, "gser_event_query") : st;
}

gser_status_t gser_event_wait(gser_event_t *event)
{
    if (!event)
        return GSER_ERR_INVALID_ARG;
    gser_context_t *ctx = event->ctx;
    gser_status_t st = devl_event_sync(ctx->devl, event->handle);
    return st ? gser__ctxdev_fail(ctx, st, "gser_event_wait") : GSER_OK;
}

gser_status_t gser_stream_order_after(gser_context_t *ctx, void *stream, const gser_event_t *event)
{
    if (!ctx || !event)
        return GSER_ERR_INVALID_ARG;
    if (event->ctx != ctx)
        return gser__error_set(ctx, GSER_ERR_INVALID_ARG,
                               "gser_stream_order_after: the event belongs to another context");
    gser_status_t st = devl_stream_wait_event(ctx->devl, stream, event->handle);
    return st ? gser__ctxdev_fail(ctx, st, "gser_stream_order_after") : GSER_OK;
}

gser_status_t gser_stream_order_after_handle(gser_context_t *ctx, void *stream, void *event_handle)
{
    if (!ctx || !event_handle)
        return GSER_ERR_INVALID_ARG;
    gser_status_t st = gser__ctxdev_need(ctx, "gser_stream_order_after_handle");
    if (st)
        return st;
    st = devl_stream_wait_event(ctx->devl, stream, event_handle);
    return st ? gser__ctxdev_fail(ctx, st, "gser_stream_order_after_handle") : GSER_OK;
}

void *gser_event_get_handle(const gser_event_t *event)
{
    return event ? event->handle : NULL;
}

void gser_event_destroy(gser_event_t *event)
{
    if (!event)
        return;
    devl_event_destroy(event->ctx->devl, event->handle);
    free(event);
}

/* ---- the Arrow helpers ------------------------------------------------------------ */

static bool ranges_overlap(const void *a, size_t na, const void *b, size_t nb)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return na && nb && x < y + nb && y < x + na;
}

gser_status_t gser_device_check_offsets(gser_context_t *ctx, const void *offsets, size_t count, size_t width,
                                        uint64_t end, void *stream, uint32_t *verdict)
{
    static const char what[] = "gser_device_check_offsets";
    if (!ctx || !verdict)
        return GSER_ERR_INVALID_ARG;
    if (width != 4 && width != 8)
        return gser__error_set(ctx, GSER_ERR_INVALID_ARG, "%s: width %zu (4 or 8 bytes)", what, width);
    if (count == 0) {
        *verdict = 0;
        return GSER_OK;
    }
    if (!offsets || count > SIZE_MAX / width || (uintptr_t)offsets % width)
        return gser__error_set(ctx, GSER_ERR_INVALID_ARG, "%s: NULL, misaligned or too many offsets", what);
    gser_status_t st = gser__ctxdev_need(ctx, what);
    if (st)
        return st;
    uint32_t v = 0;
    st = devl_check_offsets(ctx->devl, offsets, count, (unsigned)width, end, stream, &v);
    if (st)
        return gser__ctxdev_fail(ctx, st, what);
    *verdict = v;
    return GSER_OK;
}

gser_status_t gser_device_rebase_offsets(gser_context_t *ctx, void *dst, const void *src, size_t count, size_t width,
                                         void *stream)
{
    static const char what[] = "gser_device_rebase_offsets";
    if (!ctx)
        return GSER_ERR_INVALID_ARG;
    if (width != 4 && width != 8)
        return gser__error_set(ctx, GSER_ERR_INVALID_ARG, "%s: width %zu (4 or 8 bytes)", what, width);
    if (count == 0)
        return GSER_OK;
    if (!dst || !src || count > SIZE_MAX / width)
        return gser__error_set(ctx, GSER_ERR_INVALID_ARG, "%s: NULL buffer or too many offsets", what);
    /* The kernel loads whole offsets: misaligned ones would fault on a GPU. */
    if ((uintptr_t)dst % width || (uintptr_t)src % width)
        return gser__error_set(ctx, GSER_ERR_INVALID_ARG, "%s: buffers must be aligned to %zu bytes", what, width);
    if (ranges_overlap(dst, count * width, src, count * width))
        return gser__error_set(ctx, GSER_ERR_INVALID_ARG, "%s: source and destination overlap", what);
    gser_status_t st = gser__ctxdev_need(ctx, what);
    if (st)
        return st;
    st = devl_rebase_offsets(ctx->devl, dst, src, count, (unsigned)width, stream);
    return st ? gser__ctxdev_fail(ctx, st, what) : GSER_OK;
}

gser_status_t gser_device_copy_bits(gser_context_t *ctx, void *dst, const void *src, uint64_t src_bit_offset,
                                    uint64_t nbits, void *stream)
{
    static const char what[] = "gser_device_copy_bits";
    if (!ctx)
        return GSER_ERR_INVALID_ARG;
    if (nbits == 0)
        return GSER_OK;
    if (!dst || !src || src_bit_offset > UINT64_MAX - 7 - nbits)
        return gser__error_set(ctx, GSER_ERR_INVALID_ARG, "%s: NULL buffer or bit range too large", what);
    uint64_t first = src_bit_offset / 8, end = (src_bit_offset + nbits + 7) / 8;
    if (ranges_overlap(dst, (size_t)((nbits + 7) / 8), (const char *)src + first, (size_t)(end - first)))
        return gser__error_set(ctx, GSER_ERR_INVALID_ARG, "%s: source and destination overlap", what);
    gser_status_t st = gser__ctxdev_need(ctx, what);
    if (st)
        return st;
    st = devl_copy_bits(ctx->devl, dst, src, src_bit_offset, nbits, stream);
    return st ? gser__ctxdev_fail(ctx, st, what) : GSER_OK;
}
